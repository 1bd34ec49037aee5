//! What the peer's SACK blocks cost us (RFC 2018, RFC 6675, RFC 8985's RACK), and that the
//! shortcut loses nothing: runs of segments already SACKed are jumped over, not looked at
//! again on every ACK, so a receiver
//! behind one lost segment, whose SACK block grows by a segment per ACK, costs a few steps
//! per ACK rather than the whole block and flight (quadratic in the flight before), and a
//! peer that repeats large blocks does not make us walk them again
//! (`ConnStats::sack_scan_steps`).
mod common;
use common::*;

use std::time::Duration;

use tcp_engine::wire::SackBlock;
use tcp_engine::{Config, Connection, Instant, SegmentRepr};

/// A connected client (no timestamps) with `segments` full segments sent and unacknowledged.
fn in_flight(segments: usize) -> (Connection, Vec<(u32, u32)>, Instant) {
    let cfg = Config {
        timestamps: false,
        initial_window_segments: segments as u32,
        ..Config::default()
    };
    let (mut c, _s, net) = established(cfg);
    let now = net.now;
    let mut conn = c.conn.take().expect("client connection");
    // The window the SYN-ACK gave (unscaled) opened to the peer's scaled maximum.
    let nxt = conn.snd_nxt();
    sack(&mut conn, now, nxt, &[]);
    let mss = usize::from(conn.emss());
    let data = vec![7u8; segments * mss];
    assert_eq!(conn.send(&data), Ok(data.len()));
    let mut buf = vec![0u8; 65536];
    let mut sent = Vec::new();
    while let Some(n) = conn.poll_transmit(now, &mut buf) {
        let seg = SegmentRepr::parse(&buf[..n]).expect("our own segment parses");
        let len = seg.payload.len() as u32;
        sent.push((seg.seq, seg.seq.wrapping_add(len)));
        assert!(sent.len() <= segments, "runaway transmit");
    }
    assert_eq!(sent.len(), segments, "the whole flight sent at once");
    (conn, sent, now)
}

/// The peer's duplicate ACK of `ack` carrying `blocks`.
fn sack(conn: &mut Connection, now: Instant, ack: u32, blocks: &[SackBlock]) {
    peer_ack(conn, now, ack, blocks);
}

/// The sequence numbers `conn` sends at `now` (after its timers ran).
fn resent(conn: &mut Connection, now: Instant) -> Vec<u32> {
    conn.handle_timeout(now);
    let mut buf = vec![0u8; 65536];
    let mut seqs = Vec::new();
    while let Some(n) = conn.poll_transmit(now, &mut buf) {
        let seg = SegmentRepr::parse(&buf[..n]).expect("our own segment parses");
        if !seg.payload.is_empty() {
            seqs.push(seg.seq);
        }
        assert!(seqs.len() < 10_000, "runaway transmit");
    }
    seqs
}

/// The first segment is lost; every later one arrives and is SACKed, the block growing by a
/// segment per ACK. Before the jumps, SACK marking walked the whole block and RACK the whole
/// flight on every ACK: ~N^2 steps (a million here); now a few per ACK. RACK still finds the
/// lost one, and only it is sent again.
#[test]
fn a_growing_sack_block_costs_a_few_steps_per_ack() {
    const N: usize = 1000;
    let (mut conn, sent, now) = in_flight(N);
    let una = sent[0].0;
    for k in 1..N {
        let block = SackBlock {
            left: sent[1].0,
            right: sent[k].1,
        };
        sack(&mut conn, now, una, &[block]);
    }
    let steps = conn.stats().sack_scan_steps;
    println!("{N} segments, {} ACKs: {steps} scan steps", N - 1);
    assert!(steps < 10 * N as u64, "{steps} steps for {N} ACKs");
    let later = now + Duration::from_millis(1);
    assert_eq!(
        resent(&mut conn, later),
        [una],
        "only the lost segment again"
    );
}

/// Block edges inside our segments (a re-segmenting path, a reneging or hostile peer): a
/// segment SACKed half by one ACK and the other half by the next was never SACKed whole, and
/// stays a candidate for RACK (the spans of the blocks, merged, once covered it, and RACK
/// jumped over it: it waited for the retransmission timeout).
#[test]
fn a_segment_sacked_in_halves_by_two_acks_is_still_found_lost() {
    let (mut conn, sent, now) = in_flight(6);
    let una = sent[0].0;
    let half = sent[1].0.wrapping_add(100);
    sack(
        &mut conn,
        now,
        una,
        &[SackBlock {
            left: sent[1].0,
            right: half,
        }],
    );
    sack(
        &mut conn,
        now,
        una,
        &[SackBlock {
            left: half,
            right: sent[5].1,
        }],
    );
    let later = now + Duration::from_millis(1);
    assert_eq!(resent(&mut conn, later), [una, sent[1].0]);
}

/// A first block inside a second one is a D-SACK (RFC 2883 4) and marks nothing; with the
/// second out of bounds nothing at all is SACKed. A later real SACK of the same segments marks
/// them (the first block, taken for SACKed then, made both walks jump over them: RACK never
/// learnt of a delivery, and the lost head waited for the retransmission timeout).
#[test]
fn a_d_sack_inside_a_bogus_block_marks_nothing_for_later() {
    let (mut conn, sent, now) = in_flight(6);
    let una = sent[0].0;
    let beyond = sent[5].1.wrapping_add(5000);
    let first = SackBlock {
        left: sent[1].0,
        right: sent[2].1,
    };
    let bogus = SackBlock {
        left: sent[1].0,
        right: beyond,
    };
    sack(&mut conn, now, una, &[first, bogus]);
    sack(&mut conn, now, una, &[first]);
    let later = now + Duration::from_millis(1);
    assert_eq!(resent(&mut conn, later), [una]);
}

/// A peer alternating two large blocks (390 and 400 segments) looks at the segments between
/// and before them on every ACK (RACK checks the deadline of each one still in flight below
/// its segment: 110 here), not at the 790 SACKed ones: before the jumps, ~1,300 a ACK.
#[test]
fn repeated_large_blocks_are_not_walked_again() {
    const N: usize = 1000;
    const ACKS: u64 = 5000;
    let (mut conn, sent, now) = in_flight(N);
    let una = sent[0].0;
    let blocks = [
        SackBlock {
            left: sent[10].0,
            right: sent[400].1,
        },
        SackBlock {
            left: sent[500].0,
            right: sent[900].1,
        },
    ];
    for i in 0..ACKS {
        let b = &blocks[(i % 2) as usize..];
        sack(&mut conn, now, una, &b[..1]);
    }
    let steps = conn.stats().sack_scan_steps;
    println!("{ACKS} ACKs of two alternating blocks of 400 segments: {steps} scan steps");
    assert!(steps < 150 * ACKS, "{steps} steps for {ACKS} ACKs");
}
