//! The receiver's ACK policy (RFC 5681 4.2, RFC 1122 4.2.3.2): how many in-order segments
//! one ACK covers (`Config::ack_every_segments`, stretch ACKs above 2), and the cases that
//! are acknowledged at once whatever that setting: out-of-order data, data filling a hole,
//! duplicates, a second unacknowledged segment with PSH; and the delayed-ACK timer bounding
//! the wait.
mod common;
use common::*;
use std::time::Duration;
use tcp_engine::sim::{Direction, LinkConfig};
use tcp_engine::wire::{TcpFlags, TcpOptions};
use tcp_engine::{Config, Instant, SegmentRepr};

fn stretch(n: u32) -> Config {
    Config {
        ack_every_segments: n,
        quickack_segments: 0,
        timestamps: false,
        ..Config::default()
    }
}

/// Feeds the server a data segment as the client would send it; returns the server's
/// packets emitted right after (parsed: ack number, payload length).
fn feed(c: &Peer, s: &mut Peer, now: Instant, seq: u32, len: usize, psh: bool) -> Vec<u32> {
    let t = c.conn().four_tuple();
    let payload = vec![0x5a; len];
    let seg = SegmentRepr {
        tos: 0,
        src_addr: t.local_addr,
        dst_addr: t.remote_addr,
        src_port: t.local_port,
        dst_port: t.remote_port,
        seq,
        ack: c.conn().rcv_nxt(),
        flags: TcpFlags {
            ack: true,
            psh,
            ..TcpFlags::default()
        },
        window: 1000,
        options: TcpOptions::default(),
        payload: &payload,
    };
    s.conn_mut().handle_segment(now, &seg, |_| {});
    let mut acks = Vec::new();
    let mut buf = [0u8; 2048];
    while let Some(n) = s.conn_mut().poll_transmit(now, &mut buf) {
        let r = SegmentRepr::parse(&buf[..n]).expect("valid segment");
        assert!(r.flags.ack && r.payload.is_empty());
        acks.push(r.ack);
    }
    acks
}

const MSS: usize = 1000;

/// With `ack_every_segments = 8`: seven in-order segments wait, the eighth is acknowledged;
/// an out-of-order segment, the one filling its hole and a duplicate each get an ACK at once,
/// a PSH segment when it is the second unacknowledged one; a lone in-order segment (PSH or
/// not) is acknowledged when the delayed-ACK timer runs out.
#[test]
fn stretch_acks_in_order_immediate_acks_otherwise() {
    let (c, mut s, net) = established(stretch(8));
    let mut now = net.now;
    let base = s.conn().rcv_nxt();
    let at = |k: usize| base.wrapping_add((k * MSS) as u32);
    for k in 0..7 {
        assert!(
            feed(&c, &mut s, now, at(k), MSS, false).is_empty(),
            "segment {k}"
        );
    }
    assert_eq!(feed(&c, &mut s, now, at(7), MSS, false), vec![at(8)]);
    // Out of order (segment 9 before 8): acknowledged at once, still asking for 8.
    assert_eq!(feed(&c, &mut s, now, at(9), MSS, false), vec![at(8)]);
    // The hole filled: acknowledged at once, up to the end of 9.
    assert_eq!(feed(&c, &mut s, now, at(8), MSS, false), vec![at(10)]);
    // PSH (the sender drained its queue): every second segment again.
    assert!(feed(&c, &mut s, now, at(10), MSS, false).is_empty());
    assert_eq!(feed(&c, &mut s, now, at(11), MSS, true), vec![at(12)]);
    // A duplicate: at once.
    assert_eq!(feed(&c, &mut s, now, at(3), MSS, false), vec![at(12)]);
    // One segment alone, PSH or not (a request a reply would acknowledge): the delayed-ACK
    // timer (default 500 us) sends it.
    assert!(feed(&c, &mut s, now, at(12), MSS, true).is_empty());
    let deadline = s.conn().poll_timeout().expect("delayed-ACK timer");
    assert!(deadline <= now + Duration::from_micros(500));
    now = deadline;
    s.conn_mut().handle_timeout(now);
    let mut buf = [0u8; 2048];
    let n = s
        .conn_mut()
        .poll_transmit(now, &mut buf)
        .expect("delayed ACK");
    assert_eq!(SegmentRepr::parse(&buf[..n]).expect("valid").ack, at(13));
}

/// The default (2) acknowledges every second in-order segment, without PSH exceptions.
#[test]
fn default_acks_every_second_segment() {
    let cfg = stretch(2);
    assert_eq!(Config::default().ack_every_segments, 2);
    let (c, mut s, net) = established(cfg);
    let now = net.now;
    let base = s.conn().rcv_nxt();
    let at = |k: usize| base.wrapping_add((k * MSS) as u32);
    for k in 0..6 {
        let acks = feed(&c, &mut s, now, at(k), MSS, k == 2);
        if k % 2 == 1 {
            assert_eq!(acks, vec![at(k + 1)], "segment {k}");
        } else {
            assert!(acks.is_empty(), "segment {k}");
        }
    }
}

/// Counts the client's data segments and the server's pure ACKs of one bulk transfer.
fn bulk(cfg: Config, size: usize) -> (u64, u64, Duration) {
    let (mut data, mut acks) = (0u64, 0u64);
    // No queue limit: no drops, so no out-of-order data (which is acknowledged at once).
    let clean = LinkConfig {
        queue_limit: None,
        ..lossy(0.0)
    };
    let o = transfer(
        7,
        size,
        clean.clone(),
        clean,
        cfg.clone(),
        cfg,
        Duration::from_secs(60),
        |dir, _, pkt| {
            let Ok(r) = SegmentRepr::parse(pkt) else {
                return;
            };
            match dir {
                Direction::AtoB if !r.payload.is_empty() => data += 1,
                Direction::BtoA if r.payload.is_empty() && r.flags.ack && !r.flags.syn => acks += 1,
                _ => {}
            }
        },
    );
    assert!(o.ok, "transfer incomplete");
    (data, acks, o.elapsed)
}

/// A 4 MiB bulk transfer without loss in MPA mode (the engine's): stretch ACKs of 8 send at
/// most two thirds of the ACKs of the default (in this harness many ACKs are not owed to
/// the segment count: the quick-ACKs of the start, window updates as the receiving peer
/// opens its window), and the transfer takes no longer in virtual time (byte counting
/// keeps the sender's window growing). Measured: 3522 data segments, 2122 ACKs with the
/// default, 1191 with stretch ACKs, 3.56 ms either way.
#[test]
fn stretch_acks_cut_acks_of_a_bulk_transfer() {
    let size = 4 << 20;
    let (d2, a2, t2) = bulk(Config::mpa(), size);
    let (d8, a8, t8) = bulk(
        Config {
            ack_every_segments: 8,
            ..Config::mpa()
        },
        size,
    );
    println!("every 2: {d2} data, {a2} ACKs, {t2:?}; every 8: {d8} data, {a8} ACKs, {t8:?}");
    assert!(2 * a2 >= d2, "default: {a2} ACKs for {d2} segments");
    assert!(
        3 * a8 <= 2 * a2,
        "stretch: {a8} ACKs for {d8} segments, default {a2}"
    );
    assert!(
        t8.as_secs_f64() <= t2.as_secs_f64() * 1.1,
        "stretch ACKs slowed the transfer: {t8:?} vs {t2:?}"
    );
}
