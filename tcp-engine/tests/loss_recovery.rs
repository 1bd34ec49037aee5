//! Loss recovery and retransmission timing under relay-like impairments:
//! late ACKs on a lossless path must not cause retransmissions; legitimately
//! reordered segments must not be dropped by PAWS; D-SACK and Eifel undo
//! spurious congestion responses; goodput at 5 % loss with reordering.
mod common;
use common::*;
use std::time::Duration;
use tcp_engine::sim::LinkConfig;
use tcp_engine::wire::SackBlock;
use tcp_engine::{Config, ConnStats, Connection, Instant};

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

/// ACK stalls longer than the RTO (up to 40 ms) on a lossless path: a loss
/// probe goes at the RTO's time (RFC 8985 7.2) and the timeouts fire after it,
/// but each series of them is found spurious by its timestamps (Eifel, RFC 3522)
/// and undone: one segment resent per timeout or probe, no go-back-N.
#[test]
fn spurious_timeouts_are_detected_and_undone() {
    let data = LinkConfig {
        bandwidth_bps: Some(2_000_000_000),
        queue_limit: None,
        ..LinkConfig::default()
    };
    let acks = LinkConfig {
        stall: 0.003,
        stall_max: Duration::from_millis(40),
        ..data.clone()
    };
    let r = mpa_run(14, 32 * MIB, data, acks);
    show("lossless, ACK stalls up to 40 ms", &r);
    let c = &r.client;
    assert!(
        c.rto_expirations > 0,
        "no timeout: the test no longer tests"
    );
    assert_eq!(c.spurious_rtos, c.rto_series);
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

/// A lost tail segment on a path of 20 ms round trips is probed (RFC 8985 7.2: at the RTO's
/// time if the probe's own would come later), not left to the timeout. The probe was
/// dropped whenever it would come after the RTO, which on any path whose SRTT is above half
/// the 5 ms RTO floor is always: every lost tail there was a timeout, its window collapsed.
#[test]
fn a_tail_loss_on_a_20ms_path_is_probed_before_the_timeout() {
    let (mut conn, mut now) = driven_client(Config::default());
    let mss = usize::from(conn.emss());
    for _ in 0..30 {
        conn.send(&vec![1u8; mss]).expect("send");
        sent_now(&mut conn, now);
        now += Duration::from_millis(20);
        let nxt = conn.snd_nxt();
        peer_ack(&mut conn, now, nxt, &[]);
    }
    conn.send(&vec![1u8; 10 * mss]).expect("send");
    let sent = sent_now(&mut conn, now);
    assert_eq!(sent.len(), 10);
    now += Duration::from_millis(20);
    // Everything but the last segment arrived.
    peer_ack(&mut conn, now, sent[9].0, &[]);
    let (rto, tlp) = (conn.stats().rto_expirations, conn.stats().tlp_probes);
    let mut steps = 0;
    while conn.stats().rto_expirations == rto && conn.stats().tlp_probes == tlp {
        steps += 1;
        assert!(steps < 20_000, "neither a probe nor a timeout in 2 s");
        now += Duration::from_micros(100);
        conn.handle_timeout(now);
        sent_now(&mut conn, now);
    }
    assert_eq!(conn.stats().tlp_probes, tlp + 1, "a probe first");
    assert_eq!(conn.stats().rto_expirations, rto, "no timeout");
}

/// D-SACK undo (RFC 3708) counts retransmissions reported unnecessary: a D-SACK of a
/// segment the network duplicated, never retransmitted, undid a real loss's reduction
/// (any block in the episode's range counted); the D-SACK of the retransmission itself
/// still undoes it.
#[test]
fn a_dsack_of_a_segment_never_retransmitted_undoes_nothing() {
    let (mut conn, mut now) = driven_client(Config::default());
    let mss = usize::from(conn.emss());
    conn.send(&vec![1u8; 20 * mss]).expect("send");
    let sent = sent_now(&mut conn, now);
    assert!(sent.len() >= 10, "{} segments", sent.len());
    let before = conn.cwnd();
    now += Duration::from_millis(1);
    let sacked = SackBlock {
        left: sent[1].0,
        right: sent[9].1,
    };
    // Segment 0 is missing: RACK marks it lost, it goes again.
    peer_ack(&mut conn, now, sent[0].0, &[sacked]);
    let mut steps = 0;
    while conn.stats().retransmitted_segments == 0 {
        steps += 1;
        assert!(steps < 100_000, "segment 0 not retransmitted");
        now += Duration::from_micros(10);
        conn.handle_timeout(now);
        sent_now(&mut conn, now);
    }
    assert_eq!(conn.stats().fast_recoveries, 1);
    let reduced = conn.cwnd();
    assert!(reduced < before);
    // The network duplicated segment 5: the peer D-SACKs it (inside its SACK block).
    let dup = SackBlock {
        left: sent[5].0,
        right: sent[5].1,
    };
    peer_ack(&mut conn, now, sent[0].0, &[dup, sacked]);
    peer_ack(&mut conn, now, sent[0].0, &[dup, sacked]);
    assert_eq!(
        conn.stats().dsack_undos,
        0,
        "a duplicate never retransmitted"
    );
    assert!(conn.cwnd() <= reduced);
    // Segment 0's original arrives after all, then its retransmission: D-SACKed below the
    // cumulative ACK, the one retransmission was unnecessary.
    let zero = SackBlock {
        left: sent[0].0,
        right: sent[0].1,
    };
    peer_ack(&mut conn, now, sent[9].1, &[zero]);
    assert_eq!(conn.stats().dsack_undos, 1);
    assert!(conn.cwnd() >= before);
}

/// SACK recovery by RFC 6675 alone (`rack_tlp: false`): a hole is resent once (NextSeg rule
/// (1.a), above HighRxt), not on every ACK that SACKs more above it.
#[test]
fn rfc6675_recovery_resends_a_hole_once() {
    let (mut conn, now) = driven_client(Config {
        rack_tlp: false,
        ..Config::default()
    });
    let mss = usize::from(conn.emss());
    conn.send(&vec![1u8; 10 * mss]).expect("send");
    let sent = sent_now(&mut conn, now);
    assert_eq!(sent.len(), 10);
    let hole = sent[0].0;
    let sacked_to = |k: usize| SackBlock {
        left: sent[1].0,
        right: sent[k].1,
    };
    peer_ack(&mut conn, now, hole, &[sacked_to(3)]);
    assert_eq!(sent_now(&mut conn, now).first().map(|s| s.0), Some(hole));
    for k in 4..10 {
        peer_ack(&mut conn, now, hole, &[sacked_to(k)]);
        sent_now(&mut conn, now);
    }
    assert_eq!(conn.stats().retransmitted_segments, 1);
}

/// A connection whose SRTT settled at 1 ms (thirty segments each acknowledged 1 ms after it
/// left), the time, and the SRTT.
fn settled_at_1ms() -> (Connection, Instant, Duration) {
    let (mut conn, mut now) = driven_client(Config::default());
    let mss = usize::from(conn.emss());
    for _ in 0..30 {
        conn.send(&vec![1u8; mss]).expect("send");
        sent_now(&mut conn, now);
        now += Duration::from_millis(1);
        let nxt = conn.snd_nxt();
        peer_ack(&mut conn, now, nxt, &[]);
    }
    let srtt = conn.srtt().expect("sampled");
    assert!(srtt < Duration::from_millis(2), "{srtt:?}");
    (conn, now, srtt)
}

/// Four segments sent on a [`settled_at_1ms`] connection, and the time.
fn four_sent() -> (Connection, Instant, Vec<(u32, u32)>, Duration) {
    let (mut conn, now, srtt) = settled_at_1ms();
    conn.send(&vec![1u8; 4 * usize::from(conn.emss())])
        .expect("send");
    let sent = sent_now(&mut conn, now);
    assert_eq!(sent.len(), 4);
    (conn, now, sent, srtt)
}

/// [`four_sent`], two seconds later: the first segment lost and sent again at each timeout
/// since (those lost too), the last probed (RFC 8985 7), the middle two received but every
/// ACK reporting them lost. The time is 1 ms after the last timeout.
fn reports_lost_for_two_seconds() -> (Connection, Instant, Vec<(u32, u32)>, Duration) {
    let (mut conn, mut now, sent, srtt) = four_sent();
    let start = now;
    while now - start < Duration::from_secs(2) {
        now += Duration::from_micros(500);
        conn.handle_timeout(now);
        for resent in sent_now(&mut conn, now) {
            // The timeouts' and the tail loss probe's.
            assert!(resent == sent[0] || resent == sent[3], "{resent:?} resent");
        }
    }
    assert!(conn.stats().rto_expirations >= 5, "{:?}", conn.stats());
    assert!(conn.stats().tlp_probes >= 1, "{:?}", conn.stats());
    assert_eq!(conn.srtt(), Some(srtt), "no sample while nothing came back");
    (conn, now + Duration::from_millis(1), sent, srtt)
}

/// The SACK block over the middle two of [`four_sent`]'s segments.
fn middle_two(sent: &[(u32, u32)]) -> SackBlock {
    SackBlock {
        left: sent[1].0,
        right: sent[2].1,
    }
}

/// The SACK block over `segment` alone.
fn only(segment: (u32, u32)) -> SackBlock {
    SackBlock {
        left: segment.0,
        right: segment.1,
    }
}

/// The time the tail loss probe (RFC 8985 7) of what `conn` sent at `now` went, before any
/// timeout.
fn probed(conn: &mut Connection, mut now: Instant) -> Instant {
    let mut steps = 0;
    while conn.stats().tlp_probes == 0 {
        steps += 1;
        assert!(steps < 100, "no probe in 10 ms");
        now += Duration::from_micros(100);
        conn.handle_timeout(now);
        sent_now(conn, now);
    }
    assert_eq!(conn.stats().rto_expirations, 0);
    now
}

/// `conn` took the block over the middle two segments: it sends neither again.
fn took_middle_two(conn: &mut Connection, now: Instant, sent: &[(u32, u32)]) {
    let again = sent_now(conn, now);
    assert!(
        !again.contains(&sent[1]) && !again.contains(&sent[2]),
        "{again:?} sent again"
    );
}

/// Karn's algorithm over the whole ACK (RFC 6298 3): the ACK a retransmission draws gives no
/// RTT sample from its SACK blocks either, which repeat what lost ACKs had reported. Taken
/// from the segments they newly SACK (sent long before), such a sample made the relay's 20 %
/// loss test's path of milliseconds an RTO of seconds, and stalled it for a minute.
#[test]
fn the_sack_blocks_of_an_ack_for_a_retransmission_give_no_rtt_sample() {
    let (mut conn, now, sent, srtt) = reports_lost_for_two_seconds();
    peer_ack(&mut conn, now, sent[0].1, &[middle_two(&sent)]);
    assert_eq!(conn.srtt(), Some(srtt));
    assert!(conn.rto() < Duration::from_millis(20), "{:?}", conn.rto());
    took_middle_two(&mut conn, now, &sent);
}

/// The same when the ACK holds only a part of the retransmission (a middlebox cut it), up to
/// its cumulative point ...
#[test]
fn a_cumulative_ack_into_a_retransmission_gives_no_rtt_sample() {
    let (mut conn, now, sent, srtt) = reports_lost_for_two_seconds();
    peer_ack(
        &mut conn,
        now,
        sent[0].0.wrapping_add(100),
        &[middle_two(&sent)],
    );
    assert_eq!(conn.srtt(), Some(srtt));
    took_middle_two(&mut conn, now, &sent);
}

/// ... or in a SACK block that reaches into the retransmitted segment.
#[test]
fn a_sack_block_holding_part_of_a_retransmission_gives_no_rtt_sample() {
    let (mut conn, now, sent, srtt) = reports_lost_for_two_seconds();
    let from_middle = SackBlock {
        left: sent[0].0.wrapping_add(100),
        right: sent[2].1,
    };
    peer_ack(&mut conn, now, sent[0].0, &[from_middle]);
    assert_eq!(conn.srtt(), Some(srtt));
    took_middle_two(&mut conn, now, &sent);
}

/// ... and when a duplicate drew the ACK (a D-SACK, RFC 2883: the network sent the third
/// segment, `sent[2]`, twice): what its other blocks newly SACK arrived before the duplicate.
#[test]
fn an_ack_reporting_a_duplicate_gives_no_rtt_sample() {
    let (mut conn, now, sent, srtt) = reports_lost_for_two_seconds();
    peer_ack(
        &mut conn,
        now,
        sent[0].0,
        &[only(sent[2]), middle_two(&sent)],
    );
    assert_eq!(conn.srtt(), Some(srtt));
    assert_eq!(conn.stats().dsacks_received, 1);
    took_middle_two(&mut conn, now, &sent);
}

/// A SACK block for the tail loss probe's retransmission keeps its ACK's cumulative part from
/// giving a sample too: the probe may be what the peer answered.
#[test]
fn a_sacked_probe_keeps_the_cumulative_part_from_giving_a_sample() {
    let (mut conn, now, sent, srtt) = four_sent();
    let now = probed(&mut conn, now) + Duration::from_millis(1);
    peer_ack(&mut conn, now, sent[2].1, &[only(sent[3])]);
    assert_eq!(conn.srtt(), Some(srtt));
}

/// SACK blocks still give samples when nothing retransmitted or duplicated is newly in the
/// ACK: segments SACKed 3 ms after they left move the SRTT (1 ms) up ...
#[test]
fn newly_sacked_segments_give_an_rtt_sample() {
    let (mut conn, mut now, sent, srtt) = four_sent();
    now += Duration::from_millis(3);
    peer_ack(&mut conn, now, sent[0].0, &[middle_two(&sent)]);
    let after = conn.srtt().expect("sampled");
    assert!(after > srtt, "{after:?} after {srtt:?}");
}

/// ... and a retransmission SACKed by an earlier ACK (that one gave no sample) no longer
/// keeps a later ACK from giving one: it is not newly acknowledged there.
#[test]
fn a_retransmission_sacked_before_does_not_hold_back_a_sample() {
    let (mut conn, now, sent, srtt) = four_sent();
    let now = probed(&mut conn, now) + Duration::from_millis(1);
    peer_ack(&mut conn, now, sent[0].0, &[only(sent[3])]);
    assert_eq!(conn.srtt(), Some(srtt), "the probe's own ACK");
    peer_ack(&mut conn, now, sent[3].1, &[]);
    let after = conn.srtt().expect("sampled");
    assert!(after > srtt, "{after:?} after {srtt:?}");
}
