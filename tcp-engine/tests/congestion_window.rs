//! The congestion window over time, driven by hand: what a controller does across an idle
//! time.
mod common;
use common::*;

use std::time::Duration;

use tcp_engine::{Config, Connection, Instant};

const RTT: Duration = Duration::from_millis(10);

/// Round trips in which the sender fills its congestion window and the peer acknowledges the
/// whole flight one `RTT` later.
fn full_rounds(conn: &mut Connection, now: &mut Instant, rounds: usize) {
    for _ in 0..rounds {
        let want = 2 * conn.cwnd() as usize;
        conn.send(&vec![5u8; want]).expect("send");
        let sent = sent_now(conn, *now);
        let last = sent.last().expect("a flight").1;
        *now += RTT;
        peer_ack(conn, *now, last, &[]);
    }
}

/// CUBIC's window (in octets) before and after one full round trip that follows `idle` with
/// nothing in flight; the connection in congestion avoidance after a loss (fast retransmit)
/// and five full rounds.
fn cubic_growth_across(idle: Duration) -> (u64, u64) {
    let (mut conn, mut now) = driven_client(Config {
        sack: false,
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
    now += idle;
    let before = conn.cwnd();
    full_rounds(&mut conn, &mut now, 1);
    (before, conn.cwnd())
}

/// RFC 9438 5.8: CUBIC's window follows the time since its last reduction, but time in which
/// the connection was idle does not count. A bulk send after 10 s idle grew the window by
/// half (the 1.5x-per-round cap of a curve 10 s on) in its first round trip, as if the
/// connection had been probing all along; now by what the round would have given without the
/// pause (Linux shifts the epoch at the first send after idle, `CA_EVENT_TX_START`).
#[test]
fn cubic_leaves_idle_time_out_of_its_growth() {
    let (busy_before, busy_after) = cubic_growth_across(Duration::ZERO);
    let (idle_before, idle_after) = cubic_growth_across(Duration::from_secs(10));
    assert_eq!(busy_before, idle_before);
    let busy = busy_after - busy_before;
    let idle = idle_after - idle_before;
    assert!(
        idle <= busy + 100,
        "the window grew by {idle} octets in a round after 10 s idle, {busy} without the pause"
    );
}
