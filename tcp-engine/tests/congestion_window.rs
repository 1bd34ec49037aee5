//! The congestion window over time, driven by hand: what a controller does across an idle
//! time.
mod common;
use common::*;

use std::time::Duration;

use tcp_engine::{Config, Connection, Instant};

const RTT: Duration = Duration::from_millis(10);

/// Round trips in which the sender sends a whole congestion window (no more is queued) and
/// the peer acknowledges the flight one `RTT` later.
fn full_rounds(conn: &mut Connection, now: &mut Instant, rounds: usize) {
    for _ in 0..rounds {
        let want = conn.cwnd() as usize;
        assert_eq!(conn.send(&vec![5u8; want]), Ok(want));
        let sent = sent_now(conn, *now);
        let last = sent.last().expect("a flight").1;
        *now += RTT;
        peer_ack(conn, *now, last, &[]);
    }
}

/// What the connection does between its busy rounds.
enum Pause {
    /// Nothing: the next round follows at once.
    None,
    /// Nothing in flight for this long.
    Idle(Duration),
    /// This many round trips of one segment each (requests and responses: the application,
    /// not the window, limits the sender).
    OneSegmentRounds(usize),
}

/// CUBIC's window (in octets) before and after one full round trip that follows `pause`; the
/// connection in congestion avoidance after a loss (fast retransmit) and five full rounds.
fn cubic_growth_across(pause: Pause) -> (u64, u64) {
    let (mut conn, mut now) = driven_client(Config {
        sack: false,
        nagle: false,
        initial_window_segments: 20,
        ..Config::default()
    });
    let mss = usize::from(conn.emss());
    assert_eq!(conn.send(&vec![1u8; 20 * mss]), Ok(20 * mss));
    let sent = sent_now(&mut conn, now);
    for _ in 0..3 {
        peer_ack(&mut conn, now, sent[0].0, &[]);
    }
    sent_now(&mut conn, now);
    now += RTT;
    let last = sent.last().expect("a flight").1;
    peer_ack(&mut conn, now, last, &[]);
    assert_eq!(conn.stats().fast_recoveries, 1);
    full_rounds(&mut conn, &mut now, 5);
    let before = conn.cwnd();
    match pause {
        Pause::None => {}
        Pause::Idle(d) => now += d,
        Pause::OneSegmentRounds(n) => {
            for _ in 0..n {
                assert_eq!(conn.send(&vec![2u8; mss]), Ok(mss));
                let sent = sent_now(&mut conn, now);
                assert_eq!(sent.len(), 1);
                now += RTT;
                peer_ack(&mut conn, now, sent[0].1, &[]);
            }
        }
    }
    assert_eq!(conn.cwnd(), before, "the window grew while unused");
    full_rounds(&mut conn, &mut now, 1);
    (before, conn.cwnd())
}

/// RFC 9438 5.8: CUBIC's window follows the time since its last reduction, but time in which
/// the window went unused does not count: neither time the connection sat idle nor time the
/// application sent too little to fill it. A bulk send after 10 s idle grew the window by
/// half (the 1.5x-per-round cap of a curve 10 s on) in its first round trip, as if the
/// connection had been probing all along; now by what the round would have given without the
/// pause (the time from the ACK that emptied the flight to the next send is left out, as
/// Linux's `CA_EVENT_TX_START` does; the time ACKs of flights too small to use the window
/// came is left out when an ACK finds it used again).
#[test]
fn cubic_leaves_idle_and_application_limited_time_out_of_its_growth() {
    let (busy_before, busy_after) = cubic_growth_across(Pause::None);
    let busy = busy_after - busy_before;
    for pause in [
        Pause::Idle(Duration::from_secs(10)),
        Pause::OneSegmentRounds(1000),
    ] {
        let what = match pause {
            Pause::None => "no pause",
            Pause::Idle(_) => "10 s idle",
            Pause::OneSegmentRounds(_) => "1,000 rounds of one segment",
        };
        let (before, after) = cubic_growth_across(pause);
        assert_eq!(before, busy_before);
        let grown = after - before;
        assert!(
            grown <= busy + 100,
            "the window grew by {grown} octets in a round after {what}, {busy} without a pause"
        );
    }
}

/// helper-83's review: the ACK that empties the flight started a time left out of CUBIC's
/// epoch, ended by the next ACK, so a sender that sends one window per round trip (each
/// flight acknowledged whole before the next) had every round trip left out and its curve
/// never advanced: after a loss at a window of 400 segments, 20 rounds of 100 ms grew the
/// window by the Reno-friendly rate alone (10 segments) where the curve gives about 78.
#[test]
fn cubic_advances_for_a_sender_that_empties_its_flight_every_round() {
    const SEGMENTS: u32 = 400;
    let (mut conn, mut now) = driven_client_scaled(Config {
        sack: false,
        nagle: false,
        initial_window_segments: SEGMENTS,
        send_buffer: 8 << 20,
        recv_buffer: 8 << 20,
        max_recv_window: 8 << 20,
        ..Config::default()
    });
    let mss = usize::from(conn.emss());
    let rtt = Duration::from_millis(100);
    assert_eq!(conn.send(&vec![1u8; 400 * mss]), Ok(400 * mss));
    let sent = sent_now(&mut conn, now);
    assert_eq!(sent.len(), SEGMENTS as usize, "the whole window at once");
    for _ in 0..3 {
        peer_ack(&mut conn, now, sent[0].0, &[]);
    }
    sent_now(&mut conn, now);
    now += rtt;
    peer_ack(&mut conn, now, sent.last().expect("a flight").1, &[]);
    let after_loss = conn.cwnd() / mss as u64;
    for _ in 0..20 {
        let want = conn.cwnd() as usize;
        assert_eq!(conn.send(&vec![5u8; want]), Ok(want));
        let sent = sent_now(&mut conn, now);
        now += rtt;
        peer_ack(&mut conn, now, sent.last().expect("a flight").1, &[]);
    }
    let grown = conn.cwnd() / mss as u64 - after_loss;
    assert!(
        grown >= 40,
        "the window grew by {grown} segments over 20 rounds from {after_loss}"
    );
}

/// 40 segments out (an initial window of 40), then two retransmission timeouts in a row
/// (a loss probe may go first): the connection, the time and the first flight.
fn two_timeouts(
    congestion: tcp_engine::CongestionAlgorithm,
) -> (Connection, Instant, Vec<(u32, u32)>) {
    let (mut conn, mut now) = driven_client(Config {
        congestion,
        initial_window_segments: 40,
        ..Config::default()
    });
    let mss = usize::from(conn.emss());
    assert_eq!(conn.send(&vec![1u8; 40 * mss]), Ok(40 * mss));
    let sent = sent_now(&mut conn, now);
    assert_eq!(sent.len(), 40);
    for n in 1..=2 {
        let mut steps = 0;
        while conn.stats().rto_expirations < n {
            steps += 1;
            assert!(steps < 100_000, "no timeout {n} in 10 s");
            now += Duration::from_micros(100);
            conn.handle_timeout(now);
            sent_now(&mut conn, now);
        }
    }
    (conn, now, sent)
}

/// A second timeout of a series holds ssthresh (RFC 5681 3.1): once everything arrives, slow
/// start climbs back to the first timeout's threshold (CUBIC: 0.7 of 40 segments). Each
/// timeout reduced it again: CUBIC's fell to 2 segments.
#[test]
fn a_second_timeout_in_a_row_holds_ssthresh() {
    let (mut conn, now, _) = two_timeouts(tcp_engine::CongestionAlgorithm::Cubic);
    let mss = u64::from(conn.emss());
    let nxt = conn.snd_nxt();
    peer_ack(&mut conn, now, nxt, &[]);
    assert!(
        conn.cwnd() >= 28 * mss,
        "cwnd {} segments",
        conn.cwnd() / mss
    );
}

/// Two timeouts in a row found unnecessary by D-SACK (RFC 3708): the undo restores the
/// window from before the first (it restored the state after the first: half of it).
#[test]
fn an_undo_after_two_timeouts_restores_the_window_from_before_them() {
    let (mut conn, now, sent) = two_timeouts(tcp_engine::CongestionAlgorithm::NewReno);
    let mss = u64::from(conn.emss());
    let nxt = conn.snd_nxt();
    let d = [tcp_engine::wire::SackBlock {
        left: sent[0].0,
        right: sent[0].1,
    }];
    peer_ack(&mut conn, now, nxt, &d);
    peer_ack(&mut conn, now, nxt, &d);
    assert_eq!(conn.stats().dsack_undos, 1);
    assert!(
        conn.cwnd() >= 40 * mss,
        "cwnd {} segments",
        conn.cwnd() / mss
    );
}
