//! What a connection the peer opens costs the engine before MPA reaches Full Operation, in
//! heap octets held (a counting global allocator): a half-open TCP connection (SYN received),
//! and the iWARP side of an accepted one waiting for its Request. A peer can open many of
//! these without passing any MPA check, so each must stay small (issue #23: a few KiB); the
//! buffers of Full Operation are allocated when it is reached. Run with `--nocapture` to see
//! the figures.

use std::net::Ipv4Addr;

use datapath::engine::xdp::XdpEngineConfig;
use datapath::engine::{ConnConfig, IwarpConn};
use rdmap::QpConfig;
use tcp_engine::table::ConnectionTable;
use tcp_engine::wire::{TcpFlags, TcpOptions};
use tcp_engine::{Instant, RxMode, SegmentRepr, TxMode};

#[path = "common/live_heap.rs"]
mod live_heap;

#[global_allocator]
static GLOBAL: live_heap::Counting = live_heap::Counting;

/// The most a connection may hold before Full Operation, in octets.
const BOUND: i64 = 8 << 10;
const N: i64 = 1000;

const US: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const PORT: u16 = 5000;

fn syn(i: u16) -> Vec<u8> {
    let mut options = TcpOptions::default();
    options.mss = Some(1460);
    options.window_scale = Some(7);
    options.sack_permitted = true;
    options.timestamp = Some((1, 0));
    let seg = SegmentRepr {
        tos: 0,
        src_addr: Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8),
        dst_addr: US,
        src_port: 40_000,
        dst_port: PORT,
        seq: 1000 + u32::from(i),
        ack: 0,
        flags: TcpFlags {
            syn: true,
            ..TcpFlags::default()
        },
        window: 65_535,
        options,
        payload: &[],
    };
    let mut buf = vec![0u8; 128];
    let n = seg.emit(&mut buf).expect("emit SYN");
    buf.truncate(n);
    buf
}

fn engine_tcp() -> tcp_engine::Config {
    let mut tcp = XdpEngineConfig::default().tcp;
    tcp.tx_mode = TxMode::Source;
    tcp.rx_mode = RxMode::PassUp;
    tcp
}

/// A half-open TCP connection (SYN received, SYN-ACK not yet answered) in the engine's
/// connection table, with the engine's TCP settings.
fn half_open_cost() -> i64 {
    let syns: Vec<Vec<u8>> = (0..N as u16).map(syn).collect();
    let mut table = ConnectionTable::new([3; 16], 4 * N as usize);
    table.listen(US, PORT, 2 * N as usize, engine_tcp());
    let before = live_heap::live();
    for s in &syns {
        table
            .handle_packet(Instant::ZERO, s, |_, _| {})
            .expect("SYN accepted");
    }
    let per = (live_heap::live() - before) / N;
    assert_eq!(table.len(), N as usize);
    per
}

/// The iWARP side of a connection the engine accepted, waiting for the MPA Request: the
/// engine's settings, with the placeholder queue pair it uses until the application accepts
/// (`engine::xdp::glue`, `on_accept`).
fn responder_cost() -> i64 {
    let engine = XdpEngineConfig::default();
    let cfg = ConnConfig {
        qp: QpConfig {
            sq_depth: 0,
            rq_depth: 0,
            ird: 0,
            ord: 0,
            ..QpConfig::default()
        },
        reassembly_capacity: engine.reassembly_capacity,
        max_placed_fpdus: engine.max_placed_fpdus,
        tx_ahead: engine.tx_ahead,
        max_tx_fpdus: engine.max_tx_fpdus,
        ..ConnConfig::default()
    };
    let epoch = std::time::Instant::now();
    let before = live_heap::live();
    let conns: Vec<IwarpConn> = (0..N)
        .map(|_| IwarpConn::responder(cfg.clone(), epoch, Instant::ZERO).expect("responder"))
        .collect();
    let per = (live_heap::live() - before) / N;
    assert_eq!(conns.len(), N as usize);
    per
}

/// One test, so that no other test's allocations run beside the measurements.
#[test]
fn a_connection_costs_a_few_kib_before_full_operation() {
    let half_open = half_open_cost();
    let responder = responder_cost();
    println!("half-open TCP connection: {half_open} octets");
    println!("iWARP responder waiting for its Request: {responder} octets");
    assert!(
        half_open <= BOUND,
        "a half-open connection holds {half_open} octets"
    );
    assert!(responder <= BOUND, "a responder holds {responder} octets");
}
