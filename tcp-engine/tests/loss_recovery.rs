//! Loss recovery and retransmission timing under relay-like impairments:
//! late ACKs on a lossless path must not cause retransmissions; legitimately
//! reordered segments must not be dropped by PAWS; D-SACK and Eifel undo
//! spurious congestion responses; goodput at 5 % loss with reordering.
mod common;
use common::*;
use std::time::Duration;
use tcp_engine::sim::LinkConfig;
use tcp_engine::{Config, ConnStats};

const MIB: usize = 1 << 20;

/// The relay bed's impairments (`iwarp-relay`): each segment (ACKs
/// included) dropped with `loss`, or with `reorder` held back behind 1-8
/// later packets or for at most 2 ms.
fn relay_like(loss: f64, reorder: f64) -> LinkConfig {
    LinkConfig {
        delay: Duration::from_micros(20),
        loss,
        reorder,
        reorder_delay: Duration::from_micros(20),
        reorder_delay_max: Duration::from_millis(2),
        reorder_frames: 8,
        jitter: Duration::from_micros(5),
        bandwidth_bps: Some(2_000_000_000),
        queue_limit: Some(512),
        ..LinkConfig::default()
    }
}

struct Run {
    gbps: f64,
    client: ConnStats,
    server: ConnStats,
}

fn mpa_run(seed: u64, size: usize, fwd: LinkConfig, rev: LinkConfig) -> Run {
    let o = transfer(
        seed,
        size,
        fwd,
        rev,
        Config::mpa(),
        Config::mpa(),
        Duration::from_secs(600),
        |_, _, _| {},
    );
    assert!(o.ok, "transfer incomplete");
    Run {
        gbps: size as f64 * 8.0 / o.elapsed.as_secs_f64() / 1e9,
        client: o.client.conn().stats().clone(),
        server: o.server.conn().stats().clone(),
    }
}

fn show(name: &str, r: &Run) {
    let c = &r.client;
    println!(
        "{name}: {:.3} Gb/s (virtual), retransmitted {}, rto {} (spurious {}), tlp {}, \
         recoveries {} (undone by D-SACK {}), receiver PAWS drops {}, D-SACKs sent {}",
        r.gbps,
        c.retransmitted_segments,
        c.rto_expirations,
        c.spurious_rtos,
        c.tlp_probes,
        c.fast_recoveries,
        c.dsack_undos,
        r.server.paws_drops,
        r.server.dsacks_sent
    );
}

/// A lossless path whose ACKs come late by a varying amount (0-3 ms of
/// jitter, and stalls of up to 4 ms as when the receiver is descheduled):
/// nothing may be retransmitted, neither by the RTO nor by a loss probe.
#[test]
fn late_acks_on_a_lossless_path_cause_no_retransmission() {
    let data = LinkConfig {
        bandwidth_bps: None,
        queue_limit: None,
        ..LinkConfig::default()
    };
    for (seed, jitter_ms, stall) in [(11u64, 3, 0.0), (12, 0, 0.002), (13, 1, 0.001)] {
        let acks = LinkConfig {
            jitter: Duration::from_millis(jitter_ms),
            stall,
            stall_max: Duration::from_millis(4),
            ..data.clone()
        };
        let r = mpa_run(seed, 8 * MIB, data.clone(), acks);
        show(
            &format!("lossless, ACK jitter {jitter_ms} ms, stall {stall}"),
            &r,
        );
        assert_eq!(r.client.retransmitted_segments, 0);
        assert_eq!(r.client.rto_expirations, 0);
    }
}

/// ACK stalls longer than the RTO (up to 12 ms) on a lossless path: the
/// timeouts fire, but each is found spurious by its timestamps (Eifel,
/// RFC 3522) and undone: one segment resent per timeout, no go-back-N.
#[test]
fn spurious_timeouts_are_detected_and_undone() {
    let data = LinkConfig {
        bandwidth_bps: Some(2_000_000_000),
        queue_limit: None,
        ..LinkConfig::default()
    };
    let acks = LinkConfig {
        stall: 0.003,
        stall_max: Duration::from_millis(12),
        ..data.clone()
    };
    let r = mpa_run(14, 8 * MIB, data, acks);
    show("lossless, ACK stalls up to 12 ms", &r);
    let c = &r.client;
    assert!(
        c.rto_expirations > 0,
        "no timeout: the test no longer tests"
    );
    assert_eq!(c.spurious_rtos, c.rto_expirations);
    assert!(c.retransmitted_segments <= c.rto_expirations + c.tlp_probes);
}

/// 5 % loss and 5 % reordering (held up to 2 ms) both ways: the receiver
/// drops no in-window segment for its timestamp (PAWS with a reordering
/// tolerance), spurious responses are undone, and goodput stays above a
/// fifth of the 1 % figure (virtual time, so deterministic).
#[test]
fn five_percent_loss_with_reordering() {
    let size = env_usize("TCP_LOSS_MIB", 16) * MIB;
    let one = mpa_run(2, size, relay_like(0.01, 0.01), relay_like(0.01, 0.01));
    show("1% loss + 1% reordering", &one);
    let five = mpa_run(3, size, relay_like(0.05, 0.05), relay_like(0.05, 0.05));
    show("5% loss + 5% reordering", &five);
    println!("fraction 5%/1%: {:.3}", five.gbps / one.gbps);
    for r in [&one, &five] {
        assert_eq!(r.server.paws_drops, 0, "reordered segments dropped by PAWS");
        assert_eq!(r.client.paws_drops, 0, "reordered ACKs dropped by PAWS");
    }
    assert!(five.server.dsacks_sent > 0 && five.client.dsack_undos > 0);
    assert!(five.gbps > 0.15 * one.gbps, "{} vs {}", five.gbps, one.gbps);
}

/// Slow start overflowing a 256-packet drop-tail queue (no random loss):
/// recovery must not keep the queue overflowing (a loss probe in fast
/// recovery that ignored the window while lost segments waited for it did:
/// NewReno dropped 37 % of its segments and took 98 ms instead of 19 ms).
#[test]
fn queue_overflow_recovery_does_not_overfill() {
    use tcp_engine::CongestionAlgorithm;
    let plain = LinkConfig {
        queue_limit: Some(256),
        ..LinkConfig::default()
    };
    for cc in [CongestionAlgorithm::NewReno, CongestionAlgorithm::Cubic] {
        let cfg = Config {
            congestion: cc,
            ..Config::default()
        };
        let o = transfer(
            600,
            16 * MIB,
            plain.clone(),
            plain.clone(),
            cfg.clone(),
            cfg,
            Duration::from_secs(600),
            |_, _, _| {},
        );
        assert!(o.ok);
        let l = &o.net.a_to_b.stats;
        println!(
            "{cc:?}: {:?}, queue drops {} of {}, {:?}",
            o.elapsed,
            l.queue_drops,
            l.offered,
            o.client.conn().stats()
        );
        assert!(l.queue_drops * 6 < l.offered, "{cc:?}: {l:?}");
    }
}

/// The data segments `conn` sends at `now`, as (first sequence number, one past the last).
fn sent_now(conn: &mut tcp_engine::Connection, now: tcp_engine::Instant) -> Vec<(u32, u32)> {
    let mut buf = vec![0u8; 65536];
    let mut sent = Vec::new();
    while let Some(n) = conn.poll_transmit(now, &mut buf) {
        let seg = tcp_engine::SegmentRepr::parse(&buf[..n]).expect("our own segment parses");
        let len = seg.payload.len() as u32;
        if len > 0 {
            sent.push((seg.seq, seg.seq.wrapping_add(len)));
        }
        assert!(sent.len() < 100_000, "runaway transmit");
    }
    sent
}

/// Limited transmit (RFC 3042) lets a sender without SACK send a new segment on each of the
/// first two duplicate ACKs of a run; an allowance it had no data for ends with the run. A
/// receiver repeating "one new ACK, two duplicates" while the sender had nothing more to send
/// piled the allowances up (two per round), to be spent past the congestion window once the
/// application had data: here 100 segments beyond it.
#[test]
fn unused_limited_transmit_allowances_do_not_pile_up() {
    let cfg = Config {
        sack: false,
        timestamps: false,
        ..Config::default()
    };
    let (mut c, _s, net) = established(cfg);
    let now = net.now;
    let mut conn = c.conn.take().expect("client connection");
    // The window the SYN-ACK gave (unscaled) opened to the peer's scaled maximum.
    let nxt = conn.snd_nxt();
    peer_ack(&mut conn, now, nxt, &[]);
    let mss = usize::from(conn.emss());
    for round in 0..50 {
        assert_eq!(conn.send(&vec![1u8; 2 * mss]), Ok(2 * mss));
        let sent = sent_now(&mut conn, now);
        assert_eq!(sent.len(), 2, "round {round}: two segments sent");
        let first_end = sent[0].1;
        // A new ACK, then two duplicates: the sender has nothing new to send on them.
        for _ in 0..3 {
            peer_ack(&mut conn, now, first_end, &[]);
        }
        assert_eq!(
            sent_now(&mut conn, now),
            vec![],
            "round {round}: nothing to send"
        );
        peer_ack(&mut conn, now, sent[1].1, &[]);
    }
    let cwnd = conn.cwnd();
    let big = vec![2u8; 4 << 20];
    let taken = conn.send(&big).expect("send");
    assert!(
        taken as u64 > cwnd + 100 * mss as u64,
        "enough queued to overrun cwnd"
    );
    let sent = sent_now(&mut conn, now);
    assert!(!sent.is_empty());
    let flight = u64::from(conn.snd_nxt().wrapping_sub(conn.snd_una()));
    assert!(
        flight <= cwnd,
        "{flight} octets in flight past a congestion window of {cwnd} ({} segments over)",
        (flight - cwnd).div_ceil(mss as u64)
    );
}

/// In NewReno's fast recovery (no SACK) each duplicate ACK means a segment left the network
/// and lets another go out (RFC 5681 3.2 step 4). A burst of far more duplicates than segments
/// are in flight (Savage et al.'s "DupACK spoofing", from a receiver that left SACK out of its
/// SYN) let as many new segments out at once: 1,000 duplicates over a flight of 20 sent ~1,000.
/// No more segments can have left than are in flight, and the credit stops there (as Linux's
/// `tcp_limit_reno_sacked`): the burst lets out at most the reduced window.
#[test]
fn a_burst_of_duplicate_acks_beyond_the_flight_does_not_open_the_window() {
    const FLIGHT: usize = 20;
    let cfg = Config {
        sack: false,
        timestamps: false,
        congestion: tcp_engine::CongestionAlgorithm::NewReno,
        initial_window_segments: FLIGHT as u32,
        ..Config::default()
    };
    let (mut c, _s, net) = established(cfg);
    let now = net.now;
    let mut conn = c.conn.take().expect("client connection");
    let nxt = conn.snd_nxt();
    peer_ack(&mut conn, now, nxt, &[]);
    let mss = usize::from(conn.emss());
    assert_eq!(conn.send(&vec![1u8; FLIGHT * mss]), Ok(FLIGHT * mss));
    let sent = sent_now(&mut conn, now);
    assert_eq!(sent.len(), FLIGHT, "the whole flight at once");
    let hole = sent[0].0;
    // Three duplicates: fast retransmit of the first segment.
    for _ in 0..3 {
        peer_ack(&mut conn, now, hole, &[]);
    }
    let resent = sent_now(&mut conn, now);
    assert_eq!(resent.first().map(|s| s.0), Some(hole), "fast retransmit");
    // The application has plenty; 1,000 more duplicates arrive in one burst.
    let big = vec![2u8; 4 << 20];
    conn.send(&big).expect("send");
    for _ in 0..1000 {
        peer_ack(&mut conn, now, hole, &[]);
    }
    let cwnd = conn.cwnd() as usize;
    let burst = sent_now(&mut conn, now).len();
    assert!(
        burst <= cwnd.div_ceil(mss),
        "{burst} segments sent at once on 1,000 duplicates over a flight of {FLIGHT} \
         (window {cwnd})"
    );
}
