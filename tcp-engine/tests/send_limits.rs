//! What held the sender back, timed (RFC 4898 section 4, tcpEStatsPerfSndLimTime*): the peer's
//! receive window, the congestion window, or the sender itself with data in flight.
mod common;
use common::*;
use std::time::Duration;
use tcp_engine::sim::LinkConfig;
use tcp_engine::{Config, ConnStats, SlowStart};

/// A link of 1 ms one way at 1 Gbit/s: a window of a few segments cannot fill it.
fn long_link() -> LinkConfig {
    LinkConfig {
        delay: Duration::from_millis(1),
        bandwidth_bps: Some(1_000_000_000),
        queue_limit: Some(100_000),
        ..LinkConfig::default()
    }
}

/// `size` octets from a `client` to a `server` over `link` both ways, completed.
fn run(client: Config, server: Config, link: &LinkConfig, size: usize) -> Outcome {
    let out = transfer(
        7,
        size,
        link.clone(),
        link.clone(),
        client,
        server,
        Duration::from_secs(60),
        |_, _, _| {},
    );
    assert!(out.ok, "the transfer did not complete");
    out
}

/// A receiver whose window never limits these transfers.
fn big_receiver() -> Config {
    Config {
        recv_buffer: 8 << 20,
        max_recv_window: 8 << 20,
        ..Config::default()
    }
}

fn sender_stats(server: Config, size: usize) -> (ConnStats, Duration) {
    let out = run(Config::default(), server, &long_link(), size);
    (out.client.conn().stats().clone(), out.elapsed)
}

#[test]
fn a_small_receive_window_is_timed_as_peer_window_limited() {
    let small = Config {
        recv_buffer: 16 << 10,
        ..Config::default()
    };
    let (st, elapsed) = sender_stats(small, 2 << 20);
    let total = st.snd_lim_time_rwin_ns + st.snd_lim_time_cwnd_ns + st.snd_lim_time_sender_ns;
    assert!(total <= elapsed.as_nanos() as u64, "{st:?} in {elapsed:?}");
    // 16 KiB per 2 ms round trip: the peer's window is the limit nearly all the time.
    assert!(
        st.snd_lim_time_rwin_ns > elapsed.as_nanos() as u64 / 2,
        "{st:?} in {elapsed:?}"
    );
    assert!(
        st.snd_lim_time_cwnd_ns < st.snd_lim_time_rwin_ns / 10,
        "{st:?}"
    );
}

#[test]
fn slow_start_on_a_long_link_is_timed_as_congestion_window_limited() {
    let (st, elapsed) = sender_stats(big_receiver(), 2 << 20);
    let total = st.snd_lim_time_rwin_ns + st.snd_lim_time_cwnd_ns + st.snd_lim_time_sender_ns;
    assert!(total <= elapsed.as_nanos() as u64, "{st:?} in {elapsed:?}");
    assert_eq!(st.snd_lim_time_rwin_ns, 0, "{st:?}");
    // Slow start from ten segments: round trips spent waiting for the window to open.
    assert!(
        st.snd_lim_time_cwnd_ns > Duration::from_millis(4).as_nanos() as u64,
        "{st:?} in {elapsed:?}"
    );
}

#[test]
fn the_last_round_trip_is_timed_as_sender_limited_and_idle_time_is_not() {
    // Less than the initial window: sent at once, then nothing more to send until the ACK.
    let (st, elapsed) = sender_stats(big_receiver(), 4000);
    assert_eq!(
        st.snd_lim_time_rwin_ns + st.snd_lim_time_cwnd_ns,
        0,
        "{st:?}"
    );
    let rtt = Duration::from_millis(2).as_nanos() as u64;
    assert!(
        st.snd_lim_time_sender_ns >= rtt && st.snd_lim_time_sender_ns < 2 * rtt,
        "{st:?} in {elapsed:?}"
    );
}

#[test]
fn stretch_acks_do_not_slow_slow_start_down() {
    // A receiver that acknowledges every 8th segment (the AF_XDP engine's policy), a sender
    // in slow start over a 2 ms round trip at 10 Gbit/s (a window of ~1700 segments): counting
    // every octet acknowledged doubles the window per round trip, RFC 3465's L = 2 grows it
    // by a quarter, and the transfer is over in a fraction of the round trips.
    let receiver = Config {
        recv_buffer: 8 << 20,
        max_recv_window: 8 << 20,
        ack_every_segments: 8,
        ..Config::mpa()
    };
    let link = LinkConfig {
        bandwidth_bps: Some(10_000_000_000),
        ..long_link()
    };
    let timed = |slow_start| {
        let sender = Config {
            slow_start,
            ..Config::mpa()
        };
        let out = run(sender, receiver.clone(), &link, 8 << 20);
        let acks = out.server.conn().stats().segments_out;
        let data = out.client.conn().stats().segments_out;
        assert!(
            acks * 6 < data,
            "{acks} ACKs for {data} segments: no stretch ACKs"
        );
        out.elapsed
    };
    let all = timed(SlowStart::default());
    let l2 = timed(SlowStart {
        limit_segments: Some(2),
    });
    assert!(
        all * 3 < l2 * 2,
        "{all:?} (no limit) against {l2:?} (L = 2)"
    );
}
