//! A peer that bends the rules with segments it is allowed to send (Savage et al., "TCP
//! congestion control with a misbehaving receiver", and its relatives): none of it makes us
//! send past the congestion window, resend without end, or hold a stalled connection past its
//! user timeout. Each test drives one connection by hand with the peer's segments.
mod common;
use common::*;

use std::time::Duration;

use tcp_engine::{Config, CongestionAlgorithm, Connection, Instant, State};

/// NewReno without SACK (what a peer that leaves SACK out of its SYN gets), `flight` full
/// segments sent and unacknowledged, the first one then resent by fast retransmit after three
/// duplicates. Returns the connection, the time and the hole's sequence number.
fn in_fast_recovery(flight: usize) -> (Connection, Instant, u32) {
    let (mut conn, now) = driven_client(Config {
        sack: false,
        congestion: CongestionAlgorithm::NewReno,
        initial_window_segments: flight as u32,
        ..Config::default()
    });
    let mss = usize::from(conn.emss());
    assert_eq!(conn.send(&vec![1u8; flight * mss]), Ok(flight * mss));
    let sent = sent_now(&mut conn, now);
    assert_eq!(sent.len(), flight, "the whole flight at once");
    let hole = sent[0].0;
    for _ in 0..3 {
        peer_ack(&mut conn, now, hole, &[]);
    }
    let resent = sent_now(&mut conn, now);
    assert_eq!(resent.first().map(|s| s.0), Some(hole), "fast retransmit");
    (conn, now, hole)
}

/// ACK division in recovery: partial ACKs that each move one octet into the resent head
/// segment (RFC 6582 resends the first unacknowledged segment on a partial ACK) made us resend
/// that segment whole, past the window, for every such ACK: ~500 resends for 500 ACKs of one
/// octet. It is resent again only once a partial ACK reaches another segment.
#[test]
fn partial_acks_of_one_octet_do_not_resend_the_head_each_time() {
    let (mut conn, now, hole) = in_fast_recovery(20);
    let before = conn.stats().retransmitted_segments;
    for i in 1..=500u32 {
        peer_ack(&mut conn, now, hole.wrapping_add(i), &[]);
        sent_now(&mut conn, now);
    }
    let resent = conn.stats().retransmitted_segments - before;
    assert!(
        resent <= 1,
        "{resent} resends on 500 one-octet partial ACKs"
    );
}

/// RFC 5681 2: a duplicate ACK acknowledges SND.UNA itself. Old ACKs (below SND.UNA, arriving
/// late or replayed) counted as duplicates: three of them set off a fast retransmit and a
/// halved window with nothing lost.
#[test]
fn old_acks_are_not_duplicate_acks() {
    let (mut conn, now) = driven_client(Config {
        sack: false,
        congestion: CongestionAlgorithm::NewReno,
        initial_window_segments: 20,
        ..Config::default()
    });
    let mss = usize::from(conn.emss());
    assert_eq!(conn.send(&vec![1u8; 20 * mss]), Ok(20 * mss));
    let sent = sent_now(&mut conn, now);
    peer_ack(&mut conn, now, sent[5].0, &[]);
    let cwnd = conn.cwnd();
    for _ in 0..5 {
        peer_ack(&mut conn, now, sent[2].0, &[]);
    }
    let resent = sent_now(&mut conn, now);
    assert_eq!(
        conn.stats().fast_recoveries,
        0,
        "a fast retransmit on old ACKs"
    );
    assert!(
        resent.iter().all(|s| s.0 != sent[5].0),
        "SND.UNA's segment resent: {resent:?}"
    );
    assert!(conn.cwnd() >= cwnd, "the window cut on old ACKs");
}

/// A tail loss probe (RFC 8985 7.3) that found new data it could not send (the peer's window
/// kept a few octets past what was sent) took a credit to ignore the congestion window, left
/// unused, once per probe: a peer that moved one octet per round and let the probe fire
/// piled the credits up, and once it opened its window we sent one segment past the
/// congestion window per probe (40 here). The probe resends the last segment instead, and
/// unused credits do not pile up.
#[test]
fn loss_probes_under_a_tight_window_do_not_pile_up_credit() {
    let (mut conn, mut now) = driven_client(Config::default());
    let mss = usize::from(conn.emss());
    let queued = conn.send(&vec![1u8; 400 * mss]).expect("send");
    assert!(queued >= 200 * mss, "{queued} octets queued");
    sent_now(&mut conn, now);
    for round in 0..40 {
        // One octet of progress (something delivered: the probe may fire again), the right
        // edge of the window 100 octets past what was sent: no new segment fits.
        let una = conn.snd_una().wrapping_add(1);
        let edge = conn.snd_nxt().wrapping_add(100);
        let window = u16::try_from(edge.wrapping_sub(una)).expect("a small window");
        peer_ack_window(&mut conn, now, una, window, &[]);
        sent_now(&mut conn, now);
        let probes = conn.stats().tlp_probes;
        let rtos = conn.stats().rto_expirations;
        let mut waited = 0;
        while conn.stats().tlp_probes == probes {
            now += Duration::from_micros(100);
            conn.handle_timeout(now);
            sent_now(&mut conn, now);
            waited += 1;
            assert!(waited < 10_000, "round {round}: no probe");
        }
        assert_eq!(
            conn.stats().rto_expirations,
            rtos,
            "round {round}: a timeout"
        );
    }
    // The peer opens its window.
    let una = conn.snd_una();
    peer_ack_window(&mut conn, now, una, u16::MAX, &[]);
    let cwnd = conn.cwnd();
    sent_now(&mut conn, now);
    let flight = u64::from(conn.snd_nxt().wrapping_sub(conn.snd_una()));
    assert!(
        flight <= cwnd + 2 * mss as u64,
        "{flight} octets in flight past a congestion window of {cwnd} ({} segments over)",
        flight.saturating_sub(cwnd).div_ceil(mss as u64)
    );
}

/// The user timeout (RFC 5482) runs while data waits behind a closed window. A peer that
/// flipped its window between 0 and 1 octet restarted it at every opening, though nothing
/// could move through a window of one octet: it held the connection for ever. An opening too
/// small for the next segment is not progress.
#[test]
fn a_window_flipping_between_zero_and_one_octet_does_not_dodge_the_user_timeout() {
    let (mut conn, mut now) = driven_client(Config {
        user_timeout: Some(Duration::from_millis(300)),
        ..Config::default()
    });
    let mss = usize::from(conn.emss());
    conn.send(&vec![1u8; 20 * mss]).expect("send");
    let sent = sent_now(&mut conn, now);
    let acked = sent.last().expect("sent").1;
    // Everything sent acknowledged, the window closed: the rest waits on the peer.
    peer_ack_window(&mut conn, now, acked, 0, &[]);
    for step in 0..40 {
        now += Duration::from_millis(50);
        conn.handle_timeout(now);
        sent_now(&mut conn, now);
        if conn.state() == State::Closed {
            break;
        }
        peer_ack_window(&mut conn, now, acked, (step % 2) as u16, &[]);
        sent_now(&mut conn, now);
    }
    assert_eq!(conn.state(), State::Closed, "held past its user timeout");
    assert_eq!(conn.stats().user_timeouts, 1);
}

/// Steps `conn`'s clock by 1 ms (at most `limit` times) until it sends a window probe;
/// returns how long that took.
fn until_probe(conn: &mut Connection, now: &mut Instant, limit: u32) -> Duration {
    let start = *now;
    let probes = conn.stats().probes;
    for _ in 0..limit {
        *now += Duration::from_millis(1);
        conn.handle_timeout(*now);
        sent_now(conn, *now);
        if conn.stats().probes > probes {
            return *now - start;
        }
    }
    panic!("no window probe in {limit} ms");
}

/// A window that opens in steps (zero, then too small for the next segment, then enough)
/// ends the zero-window episode as one that opens at once: the persist timer's backoff starts
/// again from the retransmission timeout for the next episode. (The check that an opening
/// must fit the next segment, above, first took only a direct move from zero to a fitting
/// window: after a stepped opening the backoff kept growing from one episode to the next.)
#[test]
fn a_window_opening_in_steps_ends_the_persist_backoff() {
    let (mut conn, mut now) = driven_client(Config::default());
    let mss = usize::from(conn.emss());
    conn.send(&vec![1u8; 200 * mss]).expect("send");
    let close_window = |conn: &mut Connection, now: Instant| {
        let acked = sent_now(conn, now).last().expect("sent").1;
        peer_ack_window(conn, now, acked, 0, &[]);
        sent_now(conn, now);
        acked
    };
    let acked = close_window(&mut conn, now);
    let first = until_probe(&mut conn, &mut now, 60_000);
    // Several probes, each after a longer wait.
    for _ in 0..4 {
        until_probe(&mut conn, &mut now, 60_000);
    }
    // The peer reads a little (a window of 100 octets: nothing fits), then enough.
    peer_ack_window(&mut conn, now, acked, 100, &[]);
    sent_now(&mut conn, now);
    peer_ack_window(&mut conn, now, acked, u16::MAX, &[]);
    close_window(&mut conn, now);
    let next = until_probe(&mut conn, &mut now, 60_000);
    assert!(
        next <= first * 2,
        "the next episode's first probe after {next:?}, the first episode's after {first:?}"
    );
}

/// Records (MPA's FPDUs) are grouped into segments of up to EMSS and never split for the
/// window. A peer whose whole window is smaller than such a group (a receive buffer of 1,000
/// octets, three records of 400 queued) got nothing, ever, though two records fit: the
/// connection stalled until its user timeout. Whole records that fit go once the window is at
/// least half the largest the peer offered (sender SWS avoidance).
#[test]
fn a_window_smaller_than_a_segment_still_takes_whole_records() {
    let quiet = |cfg: Config| Config {
        window_scaling: false,
        timestamps: false,
        ..cfg
    };
    let client_cfg = quiet(Config {
        tx_mode: tcp_engine::TxMode::Records,
        ..Config::default()
    });
    let server_cfg = quiet(Config {
        recv_buffer: 1000,
        max_recv_window: 1000,
        ..Config::default()
    });
    let (mut c, _s, net) = established_pair(client_cfg, server_cfg);
    let now = net.now;
    let mut conn = c.conn.take().expect("client connection");
    let nxt = conn.snd_nxt();
    peer_ack_window(&mut conn, now, nxt, 1000, &[]);
    for _ in 0..3 {
        conn.send_record(&[7u8; 400]).expect("record");
    }
    let sent = sent_now(&mut conn, now);
    let octets: u32 = sent.iter().map(|s| s.1.wrapping_sub(s.0)).sum();
    assert_eq!(
        octets, 800,
        "whole records into a window of 1,000: {sent:?}"
    );
    // The peer takes them and offers its 1,000 again: the third goes.
    peer_ack_window(&mut conn, now, sent.last().expect("sent").1, 1000, &[]);
    let rest = sent_now(&mut conn, now);
    let octets: u32 = rest.iter().map(|s| s.1.wrapping_sub(s.0)).sum();
    assert_eq!(octets, 400, "{rest:?}");
}

/// Limited transmit (RFC 3042) lets a sender without SACK send a new segment on each of the
/// first two duplicate ACKs of a run; an allowance it had no data for ends with the run. A
/// receiver repeating "one new ACK, two duplicates" while the sender had nothing more to send
/// piled the allowances up (two per round), to be spent past the congestion window once the
/// application had data: here 100 segments beyond it.
#[test]
fn unused_limited_transmit_allowances_do_not_pile_up() {
    // Window scaling on: the peer's window must not be what stops the overrun.
    let cfg = Config {
        sack: false,
        timestamps: false,
        ..Config::default()
    };
    let (mut c, _s, net) = established(cfg);
    let now = net.now;
    let mut conn = c.conn.take().expect("client connection");
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
    let (mut conn, now, hole) = in_fast_recovery(FLIGHT);
    let mss = usize::from(conn.emss());
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

/// A peer that holds its window at 8 segments while acknowledging every flight at once: the
/// congestion window grew by every octet acknowledged (slow start), to megabytes after 200
/// round trips, though never more than 8 segments were in flight, ready to be spent in one
/// burst once the peer opened its window. It grows only while it is used (RFC 7661): while it
/// is less than twice what was in flight (and by one more ACK's worth at most).
#[test]
fn a_window_held_small_does_not_let_the_congestion_window_grow_unused() {
    let (mut conn, now) = driven_client(Config::default());
    let mss = usize::from(conn.emss());
    let window = u16::try_from(8 * mss).expect("8 segments in a window field");
    let initial = conn.cwnd();
    let mut queued = 0;
    for _ in 0..200 {
        while queued < 64 * mss {
            queued += conn.send(&vec![3u8; 16 * mss]).expect("send");
        }
        let sent = sent_now(&mut conn, now);
        let Some(last) = sent.last() else { continue };
        queued -= sent
            .iter()
            .map(|s| s.1.wrapping_sub(s.0) as usize)
            .sum::<usize>();
        peer_ack_window(&mut conn, now, last.1, window, &[]);
    }
    let cwnd = conn.cwnd();
    assert!(cwnd > initial, "the window grew while it was used");
    assert!(
        cwnd <= 3 * u64::from(window),
        "a congestion window of {cwnd} octets with never more than {window} in flight"
    );
}

/// Keepalives (RFC 1122 4.2.3.6) of an idle connection armed the window-probe timer, which then
/// probed for ever with a growing backoff though no data waited for any window, and the next
/// zero-window episode began from that backoff (its first probe up to a minute late). Window
/// probes go only while data waits for the window.
#[test]
fn keepalives_of_an_idle_connection_send_no_window_probes() {
    let (mut conn, mut now) = driven_client(Config {
        keepalive: Some((Duration::from_millis(50), Duration::from_millis(10), 3)),
        ..Config::default()
    });
    let mut buf = vec![0u8; 65536];
    let mut keepalives = 0;
    for _ in 0..2000 {
        now += Duration::from_millis(5);
        conn.handle_timeout(now);
        let mut answered = false;
        while conn.poll_transmit(now, &mut buf).is_some() {
            keepalives += 1;
            answered = true;
        }
        if answered {
            let nxt = conn.snd_nxt();
            peer_ack(&mut conn, now, nxt, &[]);
        }
    }
    assert_eq!(conn.state(), State::Established);
    assert!(keepalives > 50, "{keepalives} keepalives in 10 s");
    assert_eq!(
        conn.stats().window_probes,
        0,
        "window probes of an idle connection"
    );
}

/// A peer whose window stays below a segment and below half the largest it offered (its
/// buffer full and unread, its application waiting for octets we hold back): sender SWS
/// avoidance sent nothing, the persist timer's probes carried no data and drew the same
/// window, for ever. The persist timer is the override timeout of RFC 9293 3.8.6.2.1 (4):
/// it sends what fits.
#[test]
fn a_window_held_below_sws_avoidance_gets_data_at_the_persist_timeout() {
    let (mut conn, mut now) = driven_client(Config::default());
    let edge = conn.snd_una().wrapping_add(65_535);
    assert_eq!(conn.send(&vec![1u8; 70_000]), Ok(70_000));
    // The peer acknowledges everything that arrives, its right edge fixed at 65,535 octets.
    let answer = |conn: &mut tcp_engine::Connection, now| {
        let nxt = conn.snd_nxt();
        peer_ack_window(conn, now, nxt, edge.wrapping_sub(nxt) as u16, &[]);
    };
    for _ in 0..100 {
        if sent_now(&mut conn, now).is_empty() {
            break;
        }
        now += Duration::from_millis(1);
        answer(&mut conn, now);
    }
    let left = edge.wrapping_sub(conn.snd_nxt());
    assert!(
        left > 0 && u64::from(left) < u64::from(conn.emss()) && left < 65_535 / 2,
        "{left} octets of window left"
    );
    let mut octets = 0u32;
    for _ in 0..10_000 {
        now += Duration::from_millis(1);
        conn.handle_timeout(now);
        octets += sent_now(&mut conn, now)
            .iter()
            .map(|s| s.1.wrapping_sub(s.0))
            .sum::<u32>();
        answer(&mut conn, now);
        if octets > 0 {
            break;
        }
    }
    assert_eq!(octets, left, "what fits the window, at a persist timeout");
}
