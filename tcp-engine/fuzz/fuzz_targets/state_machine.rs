//! The connection state machine under arbitrary input: a connection starts ESTABLISHED (either
//! side of a real handshake), in SYN-SENT or in SYN-RECEIVED, in stream or MPA mode, with SACK,
//! timestamps and window scaling on or off; then the input drives it with segments placed near
//! (or far from) its sequence space, clock advances with timer runs, and application calls.
//!
//! Checked after every step: nothing panics, every emitted packet parses, the transmit loop
//! ends, `rcv_nxt` never moves back (but to a take-back the pass-up answered with, which TCP
//! either honours, with `rcv_nxt` there and those octets passed up again later, or refuses
//! with an event), pass-up never hands up an octet twice (nor beyond a take-back in the same
//! segment) and never holds out-of-order data, and the timer deadline is never in the past
//! after `handle_timeout`. Every payload octet is a function of its sequence number
//! ([`octet_at`]): what is passed up or read is checked against it, so an octet placed or
//! handed up at the wrong place is seen.
//!
//! A knob turns on the TCP RDMA option (draft-csapuntz-tcprdma) in stream mode: both SYNs
//! offer it, the application posts buffers for a few RIDs, segments carry transfer options from
//! the input (RID, buffer offset, data offset and length, total length, A and U bits). Reading
//! then takes the stream in order, placed ranges (`next_placed`) included: each must start
//! where reading is, and at the end the posted buffers must hold, at each placed range, the
//! octets of those stream offsets.
#![no_main]

use std::net::Ipv4Addr;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tcp_engine::ranges::RangeSet;
use tcp_engine::wire::rdma::{RdmaFlags, RdmaOption, RdmaTransfer, Rid};
use tcp_engine::wire::{SackBlock, TcpFlags, TcpOptions};
use tcp_engine::{
    Config, Connection, Event, FourTuple, Instant, IsnGenerator, RdmaPlaced, SegmentRepr, TakeBack,
    TxMode,
};
use tcp_engine_fuzz::{for_each_transmitted, from_remote, Input};

/// The octet the peer sends at sequence number `seq`.
fn octet_at(seq: u32) -> u8 {
    (seq.wrapping_mul(131) ^ (seq >> 11)) as u8
}

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn client_tuple() -> FourTuple {
    FourTuple {
        local_addr: A,
        local_port: 40000,
        remote_addr: B,
        remote_port: 5000,
    }
}

/// Emits everything `from` has and feeds it to `to`.
fn deliver(from: &mut Connection, to: &mut Connection, now: Instant, buf: &mut [u8]) {
    for _ in 0..64 {
        let Some(n) = from.poll_transmit(now, buf) else {
            return;
        };
        let seg = SegmentRepr::parse(&buf[..n]).expect("handshake packet parses");
        to.handle_segment(now, &seg, |_| {});
    }
}

/// RIDs the application may post buffers for (of a few sizes, filled with [`UNTOUCHED`]).
const RIDS: u64 = 4;
const UNTOUCHED: u8 = 0xee;

/// Reads the connection in order as far as it goes, placed ranges included: checks every
/// octet read against [`octet_at`] and that each placed range starts where reading is. (Each
/// turn of the loop reads something or ends it, and the stream is finite.)
fn read_all(conn: &mut Connection, read: &mut u64, placed: &mut Vec<RdmaPlaced>) {
    let start = conn.rcv_stream_start();
    let mut sink = [0u8; 4096];
    loop {
        let n = conn.recv(&mut sink);
        for (k, &b) in sink[..n].iter().enumerate() {
            let seq = start.wrapping_add((*read + k as u64) as u32);
            assert_eq!(b, octet_at(seq), "read octet {} is not the one sent", *read);
        }
        *read += n as u64;
        if n > 0 {
            continue;
        }
        match conn.next_placed() {
            Some(p) => {
                assert_eq!(
                    p.stream_offset, *read,
                    "a placed range out of reading order"
                );
                *read += p.len;
                placed.push(p);
            }
            None => return,
        }
    }
}

/// The connection under test, and the peer's initial sequence number when it is known.
fn start(kind: u8, cfg: &Config, now: Instant, buf: &mut [u8]) -> Connection {
    let isn = IsnGenerator::new([7; 16]);
    match kind % 4 {
        // A real handshake; keep the server (0) or the client (1).
        0 | 1 => {
            let mut client = Connection::connect(cfg.clone(), client_tuple(), &isn, now);
            let n = client.poll_transmit(now, buf).expect("SYN");
            let syn = SegmentRepr::parse(&buf[..n]).expect("SYN parses");
            let mut server = Connection::accept(cfg.clone(), &syn, &isn, now).expect("accept");
            deliver(&mut server, &mut client, now, buf);
            deliver(&mut client, &mut server, now, buf);
            if kind.is_multiple_of(4) {
                server
            } else {
                client
            }
        }
        2 => Connection::connect(cfg.clone(), client_tuple(), &isn, now),
        _ => {
            let mut options = TcpOptions::default();
            options.mss = Some(1000);
            options.window_scale = Some(3);
            options.sack_permitted = true;
            options.timestamp = Some((5, 0));
            if cfg.rdma_option {
                options.rdma = Some(RdmaOption::Permitted);
            }
            let syn = SegmentRepr {
                tos: 0,
                src_addr: B,
                dst_addr: A,
                src_port: 5000,
                dst_port: 40000,
                seq: 999,
                ack: 0,
                flags: TcpFlags {
                    syn: true,
                    ..TcpFlags::default()
                },
                window: 1000,
                options,
                payload: &[],
            };
            Connection::accept(cfg.clone(), &syn, &isn, now).expect("accept")
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let kind = input.u8();
    let knobs = input.u8();
    let mut cfg = if knobs & 1 != 0 {
        Config::mpa()
    } else {
        Config::default()
    };
    cfg.sack = knobs & 2 == 0;
    cfg.timestamps = knobs & 4 == 0;
    cfg.window_scaling = knobs & 8 == 0;
    cfg.send_buffer = 256 << 10;
    cfg.recv_buffer = 256 << 10;
    let mpa = cfg.tx_mode == TxMode::Records;
    cfg.rdma_option = !mpa && knobs & 0x10 != 0;

    let mut buf = vec![0u8; 2048];
    let mut now = Instant::from_millis(1);
    let mut conn = start(kind, &cfg, now, &mut buf);
    let t = conn.four_tuple();
    let mut payload = vec![0u8; 1600];
    // Octets read so far (`recv` and placed ranges), the placed ranges, the posted buffers'
    // sizes by RID.
    let mut read: u64 = 0;
    let mut placed: Vec<RdmaPlaced> = Vec::new();
    let mut posted: [Option<usize>; RIDS as usize] = [None; RIDS as usize];
    let mut passed = RangeSet::new(1 << 16);
    let mut last_rcv = conn.rcv_nxt_offset();

    for _ in 0..256 {
        if input.is_empty() {
            break;
        }
        match input.u8() % 8 {
            // A segment (half the ops): sequence and acknowledgment numbers as signed offsets
            // from what the connection expects, so that most land near its windows.
            0..=3 => {
                let seq_off = input.u32() as i32 >> (input.u8() % 24);
                let ack_off = input.u32() as i32 >> (input.u8() % 24);
                let flags = input.u8();
                let len = usize::from(input.u16()) % (payload.len() + 1);
                let window = input.u16();
                let opt = input.u8();
                let mut options = TcpOptions::default();
                if opt & 1 != 0 {
                    options.timestamp = Some((input.u32(), input.u32()));
                }
                if opt & 2 != 0 {
                    let left = conn.snd_una().wrapping_add(input.u32() >> (opt >> 3));
                    let right = left.wrapping_add(u32::from(input.u16()));
                    options.set_sack_blocks(&[SackBlock { left, right }]);
                }
                if opt & 4 != 0 {
                    options.mss = Some(input.u16());
                    options.window_scale = Some(input.u8() % 16);
                    options.sack_permitted = true;
                }
                if cfg.rdma_option && opt & 0x40 != 0 {
                    let bits = input.u8();
                    let total = input.u16();
                    options.rdma = Some(RdmaOption::Transfer(RdmaTransfer {
                        flags: RdmaFlags {
                            aligned: bits & 1 != 0,
                            unsolicited: bits & 2 != 0,
                        },
                        rid: Rid::new(u64::from(bits >> 2) % RIDS).expect("small RID"),
                        buffer_offset: u32::from(input.u16()) >> (bits >> 4),
                        data_offset: input.u16() % (len as u16 + 1),
                        data_length: input.u16() % (len as u16 + 1),
                        total_length: (bits & 0x80 != 0).then_some(u32::from(total)),
                    }));
                }
                let seq = conn.rcv_nxt().wrapping_add(seq_off as u32);
                // A SYN takes the first sequence number; data starts after it.
                let first = seq.wrapping_add(u32::from(flags & 0x02 != 0));
                for (i, b) in payload[..len].iter_mut().enumerate() {
                    *b = octet_at(first.wrapping_add(i as u32));
                }
                let seg = from_remote(
                    &t,
                    seq,
                    conn.snd_nxt().wrapping_add(ack_off as u32),
                    TcpFlags::from_byte(flags),
                    window,
                    options,
                    &payload[..len],
                );
                let mut twice = false;
                let mut misplaced = false;
                // Flags bit 6: the first pass-up is answered with a take-back, from its middle
                // (bit 7) or its start.
                let answer = flags & 0x40 != 0;
                let mut answered: Option<u64> = None;
                conn.handle_segment(now, &seg, |p| {
                    misplaced |= p
                        .data
                        .iter()
                        .enumerate()
                        .any(|(k, &b)| b != octet_at(p.seq.wrapping_add(k as u32)));
                    let s = p.stream_offset;
                    let e = s + p.data.len() as u64;
                    if answered.is_some_and(|t| e > t) {
                        twice = true; // passed up beyond a take-back in the same segment
                    }
                    let mut fresh = 0;
                    passed.for_each_gap(s, e, |a, b| fresh += b - a);
                    twice |= fresh != e - s;
                    passed.insert(s, e);
                    if !answer || answered.is_some() {
                        return None;
                    }
                    let from = if flags & 0x80 != 0 {
                        s + (e - s) / 2
                    } else {
                        s
                    };
                    answered = Some(from);
                    Some(TakeBack { from })
                });
                assert!(!twice, "an octet was passed up twice");
                assert!(!misplaced, "an octet passed up is not the one sent there");
                if let Some(from) = answered {
                    let mut refused = false;
                    for _ in 0..64 {
                        match conn.poll_event() {
                            Some(Event::TakeBackRefused { offset }) => {
                                assert_eq!(offset, from);
                                refused = true;
                            }
                            Some(_) => {}
                            None => break,
                        }
                    }
                    if !refused {
                        assert!(
                            conn.rcv_nxt_offset() <= from,
                            "rcv_nxt {} beyond a take-back from {from}",
                            conn.rcv_nxt_offset()
                        );
                        // The octets from there on are the peer's to send again.
                        passed.truncate_from(from);
                        last_rcv = last_rcv.min(conn.rcv_nxt_offset());
                    }
                }
            }
            4 => {
                now += Duration::from_micros(u64::from(input.u32() % 4_000_000));
                if conn.poll_timeout().is_some_and(|d| d <= now) {
                    conn.handle_timeout(now);
                    if let Some(d) = conn.poll_timeout() {
                        assert!(d > now, "a timer is still due right after handle_timeout");
                    }
                }
            }
            5 => {
                let n = usize::from(input.u16()) % 8192 + 1;
                let data = vec![0xa5u8; n];
                let _ = conn.send(&data);
                let _ = conn.send_record(&data);
            }
            6 => match input.u8() % 8 {
                0 => conn.abort(),
                1..=2 => conn.close(),
                3 if cfg.rdma_option => {
                    let what = input.u8();
                    let rid = u64::from(what) % RIDS;
                    let size = [0, 100, 1500, 9000][usize::from(what >> 2) % 4];
                    if posted[rid as usize].is_none() {
                        let r = Rid::new(rid).expect("small RID");
                        if conn
                            .post_rdma_buffer(r, vec![UNTOUCHED; size], what & 0x10 != 0)
                            .is_ok()
                        {
                            posted[rid as usize] = Some(size);
                        }
                    }
                }
                _ => conn.set_path_mtu(input.u16()),
            },
            _ => {
                conn.set_receive_window(u64::from(input.u32() >> (input.u8() % 32)));
                read_all(&mut conn, &mut read, &mut placed);
            }
        }
        for_each_transmitted(&mut buf, |b| conn.poll_transmit(now, b), |_| {});
        assert!(conn.rcv_nxt_offset() >= last_rcv, "rcv_nxt moved back");
        last_rcv = conn.rcv_nxt_offset();
        if mpa {
            assert_eq!(conn.ooo_bytes_held(), 0, "pass-up held out-of-order data");
        }
        for _ in 0..64 {
            if conn.poll_event().is_none() {
                break;
            }
        }
    }
    // What was placed holds the octets of its stream offsets, inside its buffer.
    read_all(&mut conn, &mut read, &mut placed);
    // And reading got as far as TCP received in order: nothing received is stuck (a placed
    // range that can never be taken, say). Pass-up hands the octets on as they come.
    if !mpa {
        assert_eq!(
            read,
            conn.rcv_nxt_offset(),
            "reading stalled short of rcv_nxt"
        );
    }
    let start = conn.rcv_stream_start();
    let mut buffers: Vec<Option<Vec<u8>>> = (0..RIDS)
        .map(|rid| conn.take_rdma_buffer(Rid::new(rid).expect("small RID")))
        .collect();
    for p in &placed {
        let rid = p.rid.get();
        let buf = buffers
            .get_mut(rid as usize)
            .and_then(Option::as_mut)
            .expect("placed into a buffer not posted");
        let at = p.buffer_offset as usize;
        let end = at + p.len as usize;
        assert!(end <= buf.len(), "placed past the buffer's end");
        for (k, b) in buf[at..end].iter().enumerate() {
            let seq = start.wrapping_add((p.stream_offset + k as u64) as u32);
            assert_eq!(
                *b,
                octet_at(seq),
                "a placed octet is not the one sent there"
            );
        }
    }
});
