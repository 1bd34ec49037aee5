//! RFC 9293 state machine: handshakes (incl. simultaneous open), teardown
//! both ways and simultaneous close, TIME-WAIT, RST processing with the
//! RFC 5961 checks, PAWS, persist and keepalive, retransmission abort.
mod common;
use common::*;
use std::sync::Arc;
use std::time::Duration;
use tcp_engine::sim::{Direction, LinkConfig, Network};
use tcp_engine::wire::{TcpFlags, TcpOptions};
use tcp_engine::{
    reset_reply, Config, Connection, Event, Instant, IsnGenerator, SegmentRepr, State,
};

fn short_tw() -> Config {
    Config {
        time_wait: Duration::from_millis(100),
        ..Config::default()
    }
}

/// Keepalive after 100 ms idle, probes 10 ms apart, the connection given up after `probes`
/// unanswered ones.
fn keepalive(probes: u32) -> Config {
    Config {
        keepalive: Some((
            Duration::from_millis(100),
            Duration::from_millis(10),
            probes,
        )),
        ..Config::default()
    }
}

/// A client with [`keepalive`]`(probes)` and a default server, not yet connected.
fn keepalive_pair(probes: u32) -> (Peer, Peer, Network) {
    setup(
        1,
        0,
        lossy(0.0),
        lossy(0.0),
        keepalive(probes),
        Config::default(),
    )
}

fn run_idle(c: &mut Peer, s: &mut Peer, net: &mut Network, ms: u64) {
    let limit = net.now + Duration::from_millis(ms);
    net.run(c, s, limit, |_, _, _| false, |_, _, _| {});
    net.now = net.now.max(limit);
}

/// A segment from the client to the server, as the client would send it.
fn from_client<'a>(
    c: &Peer,
    seq: u32,
    ack: u32,
    flags: TcpFlags,
    payload: &'a [u8],
) -> SegmentRepr<'a> {
    let t = c.conn().four_tuple();
    SegmentRepr {
        tos: 0,
        src_addr: t.local_addr,
        dst_addr: t.remote_addr,
        src_port: t.local_port,
        dst_port: t.remote_port,
        seq,
        ack,
        flags,
        window: 1000,
        options: TcpOptions::default(),
        payload,
    }
}

fn drain(conn: &mut Connection, now: Instant) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 2048];
    while let Some(n) = conn.poll_transmit(now, &mut buf) {
        out.push(buf[..n].to_vec());
    }
    out
}

const ACK: TcpFlags = TcpFlags {
    ack: true,
    fin: false,
    syn: false,
    rst: false,
    psh: false,
    urg: false,
};

#[test]
fn handshake_negotiates_options() {
    let (c, s, _) = established(Config::default());
    for p in [&c, &s] {
        assert!(p.conn().sack_enabled());
        assert!(p.conn().timestamps_enabled());
        assert_eq!(p.conn().emss(), 1448);
        // 64 MiB maximum window: shift 11 (65535 << 10 < 64 MiB).
        assert_eq!(p.conn().window_scales(), (11, 11));
        assert!(p.events.contains(&Event::Connected));
    }
    let plain = Config {
        sack: false,
        timestamps: false,
        window_scaling: false,
        ..Config::default()
    };
    let (c, _, _) = established(plain);
    assert!(!c.conn().sack_enabled() && !c.conn().timestamps_enabled());
    assert_eq!(c.conn().emss(), 1460);
    assert_eq!(c.conn().window_scales(), (0, 0));
}

#[test]
fn options_off_on_one_side_only_disable_them() {
    let c_cfg = Config::default();
    let s_cfg = Config {
        sack: false,
        timestamps: false,
        window_scaling: false,
        ..Config::default()
    };
    let (mut c, mut s, mut net) = setup(2, 0, lossy(0.0), lossy(0.0), c_cfg, s_cfg);
    net.run(
        &mut c,
        &mut s,
        Instant::from_millis(1000),
        |c, s, _| c.state() == Some(State::Established) && s.state() == Some(State::Established),
        |_, _, _| {},
    );
    assert!(!c.conn().sack_enabled() && !c.conn().timestamps_enabled());
    assert_eq!(c.conn().window_scales(), (0, 0));
    assert_eq!(c.conn().emss(), 1460);
}

#[test]
fn client_closes_first_time_wait_then_closed() {
    let cfg = short_tw();
    let (mut c, mut s, mut net) = setup(3, 10_000, lossy(0.0), lossy(0.0), cfg.clone(), cfg);
    c.close_when_sent = true;
    // Half-close: the server keeps its side open, the client sits in FIN-WAIT-2.
    let ok = net.run(
        &mut c,
        &mut s,
        Instant::from_millis(5000),
        |c, s, _| c.state() == Some(State::FinWait2) && s.state() == Some(State::CloseWait),
        |_, _, _| {},
    );
    assert!(ok && s.received_all());
    assert!(s.events.contains(&Event::PeerClosed));
    s.conn_mut().close();
    assert_eq!(s.state(), Some(State::LastAck));
    let mut saw_tw = None;
    net.run(
        &mut c,
        &mut s,
        Instant::from_millis(5000),
        |c, s, now| {
            if c.state() == Some(State::TimeWait) && saw_tw.is_none() {
                saw_tw = Some(now);
            }
            c.state() == Some(State::Closed) && s.state() == Some(State::Closed)
        },
        |_, _, _| {},
    );
    let tw_start = saw_tw.expect("client passed through TIME-WAIT");
    assert!(s.events.contains(&Event::Closed));
    assert!(c.events.contains(&Event::PeerClosed) && c.events.contains(&Event::Closed));
    // TIME-WAIT lasted the configured 100 ms.
    assert!(net.now - tw_start >= Duration::from_millis(100));
}

#[test]
fn server_closes_first() {
    let cfg = short_tw();
    let (mut c, mut s, mut net) = setup(4, 0, lossy(0.0), lossy(0.0), cfg.clone(), cfg);
    s.close_when_sent = true;
    c.close_on_peer_fin = true;
    let mut server_tw = false;
    let mut client_last_ack = false;
    net.run(
        &mut c,
        &mut s,
        Instant::from_millis(5000),
        |c, s, _| {
            server_tw |= s.state() == Some(State::TimeWait);
            client_last_ack |= c.state() == Some(State::LastAck);
            c.state() == Some(State::Closed) && s.state() == Some(State::Closed)
        },
        |_, _, _| {},
    );
    assert!(server_tw && client_last_ack);
}

#[test]
fn simultaneous_close_goes_through_closing() {
    let (mut c, mut s, mut net) = established(short_tw());
    c.conn_mut().close();
    s.conn_mut().close();
    let mut closing = (false, false);
    net.run(
        &mut c,
        &mut s,
        net.now + Duration::from_secs(5),
        |c, s, _| {
            closing.0 |= c.state() == Some(State::Closing);
            closing.1 |= s.state() == Some(State::Closing);
            c.state() == Some(State::Closed) && s.state() == Some(State::Closed)
        },
        |_, _, _| {},
    );
    assert_eq!(closing, (true, true));
    assert!(c.events.contains(&Event::Closed) && s.events.contains(&Event::Closed));
}

#[test]
fn teardown_both_ways_under_heavy_loss() {
    for seed in 0..20 {
        let cfg = short_tw();
        let (mut c, mut s, mut net) = setup(seed, 50_000, lossy(0.2), lossy(0.2), cfg.clone(), cfg);
        if seed % 2 == 0 {
            c.close_when_sent = true;
            s.close_on_peer_fin = true;
        } else {
            c.close_on_peer_fin = true;
        }
        let ok = net.run(
            &mut c,
            &mut s,
            Instant::from_millis(600_000),
            |c, s, _| {
                if s.received_all() && s.state() == Some(State::Established) && seed % 2 == 1 {
                    s.conn_mut().close();
                }
                c.state() == Some(State::Closed) && s.state() == Some(State::Closed)
            },
            |_, _, _| {},
        );
        assert!(ok, "seed {seed}: {:?} {:?}", c.state(), s.state());
        assert!(s.received_all());
    }
}

#[test]
fn simultaneous_open() {
    let t = client_tuple();
    let rev = tcp_engine::FourTuple {
        local_addr: t.remote_addr,
        local_port: t.remote_port,
        remote_addr: t.local_addr,
        remote_port: t.local_port,
    };
    let a = Connection::connect(
        Config::default(),
        t,
        &IsnGenerator::new([1; 16]),
        Instant::ZERO,
    );
    let b = Connection::connect(
        Config::default(),
        rev,
        &IsnGenerator::new([2; 16]),
        Instant::ZERO,
    );
    let mut pa = Peer::from_conn(a, random_bytes(5000, 1), 1);
    let mut pb = Peer::from_conn(b, Arc::new(Vec::new()), 2).expect(5000);
    let mut net = Network::new(LinkConfig::default(), LinkConfig::default(), 1);
    let mut syn_received = false;
    let ok = net.run(
        &mut pa,
        &mut pb,
        Instant::from_millis(5000),
        |a, b, _| {
            syn_received |= a.state() == Some(State::SynReceived);
            b.received_all() && a.sent_all_acked()
        },
        |_, _, _| {},
    );
    assert!(ok && syn_received);
    assert_eq!(pa.state(), Some(State::Established));
    assert_eq!(pb.state(), Some(State::Established));
}

#[test]
fn rst_exact_sequence_resets() {
    let (c, mut s, net) = established(Config::default());
    let now = net.now;
    let rcv_nxt = s.conn().rcv_nxt();
    let seg = from_client(
        &c,
        rcv_nxt,
        0,
        TcpFlags {
            rst: true,
            ..TcpFlags::default()
        },
        &[],
    );
    s.conn_mut().handle_segment(now, &seg, |_| {});
    assert_eq!(s.state(), Some(State::Closed));
    assert_eq!(s.conn_mut().poll_event(), Some(Event::Reset));
}

/// An abort's RST stays due until a buffer holds it: a call with a buffer too small for the
/// segment writes nothing and loses nothing.
#[test]
fn an_aborts_rst_survives_a_buffer_too_small_for_it() {
    let (mut c, _s, net) = established(Config::default());
    let now = net.now;
    c.conn_mut().abort();
    let mut small = [0u8; 10];
    assert_eq!(c.conn_mut().poll_transmit(now, &mut small), None);
    let sent = drain(c.conn_mut(), now);
    assert_eq!(sent.len(), 1, "the RST, once");
    let rst = tcp_engine::wire::SegmentRepr::parse(&sent[0]).expect("valid");
    assert!(rst.flags.rst, "{rst:?}");
}

#[test]
fn rst_in_window_not_exact_gets_challenge_ack() {
    let (c, mut s, net) = established(Config::default());
    let now = net.now;
    let rcv_nxt = s.conn().rcv_nxt();
    let seg = from_client(
        &c,
        rcv_nxt.wrapping_add(100),
        0,
        TcpFlags {
            rst: true,
            ..TcpFlags::default()
        },
        &[],
    );
    s.conn_mut().handle_segment(now, &seg, |_| {});
    assert_eq!(s.state(), Some(State::Established));
    let out = drain(s.conn_mut(), now);
    assert_eq!(out.len(), 1);
    let ack = SegmentRepr::parse(&out[0]).expect("valid");
    assert!(ack.flags.ack && !ack.flags.rst);
    assert_eq!(ack.ack, rcv_nxt);
    assert_eq!(s.conn().stats().challenge_acks, 1);
}

#[test]
fn rst_out_of_window_is_ignored_silently() {
    let (c, mut s, net) = established(Config::default());
    let now = net.now;
    let rcv_nxt = s.conn().rcv_nxt();
    let seg = from_client(
        &c,
        rcv_nxt.wrapping_sub(10_000),
        0,
        TcpFlags {
            rst: true,
            ..TcpFlags::default()
        },
        &[],
    );
    s.conn_mut().handle_segment(now, &seg, |_| {});
    assert_eq!(s.state(), Some(State::Established));
    assert!(drain(s.conn_mut(), now).is_empty());
}

#[test]
fn syn_on_established_gets_challenge_ack() {
    let (c, mut s, net) = established(Config::default());
    let now = net.now;
    let rcv_nxt = s.conn().rcv_nxt();
    let seg = from_client(
        &c,
        rcv_nxt.wrapping_add(5),
        0,
        TcpFlags {
            syn: true,
            ..TcpFlags::default()
        },
        &[],
    );
    s.conn_mut().handle_segment(now, &seg, |_| {});
    assert_eq!(s.state(), Some(State::Established));
    let out = drain(s.conn_mut(), now);
    assert_eq!(out.len(), 1);
    assert_eq!(SegmentRepr::parse(&out[0]).expect("valid").ack, rcv_nxt);
}

/// Segments without data outside the window draw at most one duplicate ACK per
/// `Config::invalid_ack_interval` (Linux's `tcp_invalid_ratelimit`); segments with data and
/// keepalive probes are answered every time.
#[test]
fn acks_for_invalid_segments_without_data_are_rate_limited() {
    let (c, mut s, net) = established(Config::default());
    let now = net.now;
    let rcv_nxt = s.conn().rcv_nxt();
    let snd_nxt = s.conn().snd_nxt();
    let stray = from_client(&c, rcv_nxt.wrapping_add(1 << 30), snd_nxt, ACK, &[]);
    let mut acks = 0;
    for _ in 0..10 {
        s.conn_mut().handle_segment(now, &stray, |_| {});
        acks += drain(s.conn_mut(), now).len();
    }
    assert_eq!(acks, 1, "one ACK for ten");
    assert_eq!(s.conn().stats().invalid_acks_skipped, 9);
    // An old duplicate with data: answered (its ACK carries the D-SACK).
    let old = from_client(&c, rcv_nxt.wrapping_sub(100), snd_nxt, ACK, b"dup");
    for _ in 0..2 {
        s.conn_mut().handle_segment(now, &old, |_| {});
        assert_eq!(drain(s.conn_mut(), now).len(), 1, "data is always answered");
    }
    // A keepalive probe: answered.
    let probe = from_client(&c, rcv_nxt.wrapping_sub(1), snd_nxt, ACK, &[]);
    for _ in 0..2 {
        s.conn_mut().handle_segment(now, &probe, |_| {});
        assert_eq!(drain(s.conn_mut(), now).len(), 1, "keepalives are answered");
    }
    // The interval over: the next stray segment is answered again.
    let later = now + Duration::from_millis(500);
    s.conn_mut().handle_segment(later, &stray, |_| {});
    assert_eq!(drain(s.conn_mut(), later).len(), 1);
    assert_eq!(s.conn().stats().invalid_acks_skipped, 9);
    assert_eq!(s.state(), Some(State::Established));
}

#[test]
fn ack_checks_of_rfc5961() {
    let (c, mut s, net) = established(Config::default());
    let now = net.now;
    let rcv_nxt = s.conn().rcv_nxt();
    let snd_nxt = s.conn().snd_nxt();
    // Acknowledges data never sent: ACK back (counted as a challenge ACK), data dropped.
    let seg = from_client(&c, rcv_nxt, snd_nxt.wrapping_add(1000), ACK, b"zzz");
    s.conn_mut().handle_segment(now, &seg, |_| {});
    assert_eq!(s.conn().rcv_nxt(), rcv_nxt);
    assert_eq!(drain(s.conn_mut(), now).len(), 1);
    assert_eq!(s.conn().stats().challenge_acks, 1);
    // Too old (before SND.UNA - MAX.SND.WND): challenge ACK, data dropped.
    let seg = from_client(&c, rcv_nxt, snd_nxt.wrapping_sub(1 << 30), ACK, b"zzz");
    s.conn_mut().handle_segment(now, &seg, |_| {});
    assert_eq!(s.conn().rcv_nxt(), rcv_nxt);
    assert_eq!(s.conn().stats().challenge_acks, 2);
    // A proper segment is accepted.
    let seg = from_client(&c, rcv_nxt, snd_nxt, ACK, b"zzz");
    s.conn_mut().handle_segment(now, &seg, |_| {});
    assert_eq!(s.conn().rcv_nxt(), rcv_nxt.wrapping_add(3));
}

#[test]
fn paws_drops_old_timestamps() {
    let (mut c, mut s, mut net) = setup(
        5,
        20_000,
        lossy(0.0),
        lossy(0.0),
        Config::default(),
        Config::default(),
    );
    let mut old_ts = None;
    run_until_done(
        &mut c,
        &mut s,
        &mut net,
        Duration::from_secs(10),
        |d, _, p| {
            if d == Direction::AtoB && old_ts.is_none() {
                old_ts = SegmentRepr::parse(p).ok().and_then(|r| r.options.timestamp);
            }
        },
    );
    // Advance time so the peer's clock moves on, then exchange more.
    run_idle(&mut c, &mut s, &mut net, 50);
    c.conn_mut().send(b"x").expect("send");
    run_idle(&mut c, &mut s, &mut net, 10);
    let now = net.now;
    let rcv_nxt = s.conn().rcv_nxt();
    let mut seg = from_client(&c, rcv_nxt, s.conn().snd_nxt(), ACK, b"old");
    seg.options.timestamp = old_ts;
    s.conn_mut().handle_segment(now, &seg, |_| {});
    assert_eq!(s.conn().stats().paws_drops, 1);
    assert_eq!(s.conn().rcv_nxt(), rcv_nxt);
    // RFC 7323 5.5: TS.Recent stays valid for 24 days without being set...
    let day = Duration::from_secs(24 * 60 * 60);
    s.conn_mut().handle_segment(now + 23 * day, &seg, |_| {});
    assert_eq!(s.conn().stats().paws_drops, 2);
    assert_eq!(s.conn().rcv_nxt(), rcv_nxt);
    // ...and no longer: after 25 idle days the segment is judged without it.
    s.conn_mut().handle_segment(now + 25 * day, &seg, |_| {});
    assert_eq!(s.conn().stats().paws_drops, 2);
    assert_eq!(s.conn().rcv_nxt(), rcv_nxt.wrapping_add(3));
}

#[test]
fn reset_reply_for_unknown_connections() {
    let (c, _, _) = established(Config::default());
    let syn = from_client(
        &c,
        1000,
        0,
        TcpFlags {
            syn: true,
            ..TcpFlags::default()
        },
        &[],
    );
    let r = reset_reply(&syn).expect("reply");
    assert!(r.flags.rst && r.flags.ack);
    assert_eq!((r.seq, r.ack), (0, 1001));
    let ack = from_client(&c, 1000, 777, ACK, b"ab");
    let r = reset_reply(&ack).expect("reply");
    assert!(r.flags.rst && !r.flags.ack);
    assert_eq!(r.seq, 777);
    let rst = from_client(
        &c,
        1000,
        0,
        TcpFlags {
            rst: true,
            ..TcpFlags::default()
        },
        &[],
    );
    assert!(reset_reply(&rst).is_none());
}

#[test]
fn syn_sent_rst_and_bad_ack() {
    let t = client_tuple();
    let isn = IsnGenerator::new([9; 16]);
    let mut a = Connection::connect(Config::default(), t, &isn, Instant::ZERO);
    let mut buf = [0u8; 200];
    let n = a.poll_transmit(Instant::ZERO, &mut buf).expect("SYN");
    let syn = SegmentRepr::parse(&buf[..n]).expect("valid").seq;
    let peer = |seq, ack, flags| SegmentRepr {
        tos: 0,
        src_addr: t.remote_addr,
        dst_addr: t.local_addr,
        src_port: t.remote_port,
        dst_port: t.local_port,
        seq,
        ack,
        flags,
        window: 100,
        options: TcpOptions::default(),
        payload: &[],
    };
    // SYN-ACK acking the wrong number: we answer with RST seq=SEG.ACK.
    a.handle_segment(
        Instant::ZERO,
        &peer(
            5,
            syn.wrapping_add(7),
            TcpFlags {
                syn: true,
                ack: true,
                ..TcpFlags::default()
            },
        ),
        |_| {},
    );
    let n = a.poll_transmit(Instant::ZERO, &mut buf).expect("RST");
    let rst = SegmentRepr::parse(&buf[..n]).expect("valid");
    assert!(rst.flags.rst);
    assert_eq!(rst.seq, syn.wrapping_add(7));
    assert_eq!(a.state(), State::SynSent);
    // RST without an acceptable ACK is ignored; with one it resets.
    a.handle_segment(
        Instant::ZERO,
        &peer(
            5,
            syn.wrapping_add(3),
            TcpFlags {
                rst: true,
                ack: true,
                ..TcpFlags::default()
            },
        ),
        |_| {},
    );
    assert_eq!(a.state(), State::SynSent);
    a.handle_segment(
        Instant::ZERO,
        &peer(
            5,
            syn.wrapping_add(1),
            TcpFlags {
                rst: true,
                ack: true,
                ..TcpFlags::default()
            },
        ),
        |_| {},
    );
    assert_eq!(a.state(), State::Closed);
    assert_eq!(a.poll_event(), Some(Event::Reset));
}

/// An established pair whose client closed first and is now in TIME-WAIT (the server closed
/// on the client's FIN).
fn client_in_time_wait(cfg: Config) -> (Peer, Peer, Network) {
    let (mut c, mut s, mut net) = established(cfg);
    c.conn_mut().close();
    s.close_on_peer_fin = true;
    net.run(
        &mut c,
        &mut s,
        net.now + Duration::from_secs(1),
        |c, _, _| c.state() == Some(State::TimeWait),
        |_, _, _| {},
    );
    assert_eq!(c.state(), Some(State::TimeWait));
    (c, s, net)
}

#[test]
fn time_wait_reacks_retransmitted_fin() {
    let (mut c, _s, net) = client_in_time_wait(Config::default());
    let now = net.now;
    let fin_seq = c.conn().rcv_nxt().wrapping_sub(1);
    let t = c.conn().four_tuple();
    let seg = SegmentRepr {
        tos: 0,
        src_addr: t.remote_addr,
        dst_addr: t.local_addr,
        src_port: t.remote_port,
        dst_port: t.local_port,
        seq: fin_seq,
        ack: c.conn().snd_nxt(),
        flags: TcpFlags {
            fin: true,
            ack: true,
            ..TcpFlags::default()
        },
        window: 100,
        options: TcpOptions::default(),
        payload: &[],
    };
    c.conn_mut().handle_segment(now, &seg, |_| {});
    let out = drain(c.conn_mut(), now);
    assert_eq!(out.len(), 1);
    assert_eq!(
        SegmentRepr::parse(&out[0]).expect("valid").ack,
        c.conn().rcv_nxt()
    );
    assert_eq!(c.state(), Some(State::TimeWait));
}

#[test]
fn zero_window_persist_then_reopen_keeps_records_whole() {
    let mut cfg = Config::mpa();
    cfg.recv_buffer = 0; // the upper layer has no room yet
    let (mut c, mut s, mut net) = setup(6, 100_000, lossy(0.0), lossy(0.0), Config::mpa(), cfg);
    let mut segs = Vec::new();
    net.run(
        &mut c,
        &mut s,
        Instant::from_millis(2000),
        |_, _, _| false,
        |d, _, p| {
            if d == Direction::AtoB {
                segs.push(SegmentRepr::parse(p).map(|r| r.payload.len()).unwrap_or(0));
            }
        },
    );
    assert_eq!(s.received, 0);
    assert!(c.conn().stats().probes >= 3, "{:?}", c.conn().stats());
    assert!(
        segs.iter().all(|&l| l == 0),
        "no data sent into a zero window"
    );
    s.conn_mut().set_receive_window(1 << 20);
    let ok = run_until_done(
        &mut c,
        &mut s,
        &mut net,
        Duration::from_secs(60),
        |_, _, _| {},
    );
    assert!(ok);
}

/// A peer that shut its window and then vanished (no keepalive, no user timeout): the window
/// probes go unanswered and, after as many as retransmissions are allowed, the connection
/// times out instead of probing for ever. A peer that answers them keeps it open, window
/// shut (RFC 1122 4.2.2.17).
#[test]
fn unanswered_window_probes_end_the_connection_answered_ones_do_not() {
    let mut cfg = Config::mpa();
    cfg.recv_buffer = 0;
    let sender = Config {
        max_retransmissions: 5,
        ..Config::mpa()
    };
    let (mut c, mut s, mut net) = setup(6, 100_000, lossy(0.0), lossy(0.0), sender, cfg);
    // Answered for 20 probes' worth of time (backoff capped at 60 s).
    net.run(
        &mut c,
        &mut s,
        Instant::from_millis(20 * 60_000),
        |_, _, _| false,
        |_, _, _| {},
    );
    assert_eq!(c.state(), Some(State::Established));
    assert!(c.conn().stats().probes >= 10, "{:?}", c.conn().stats());
    // The peer vanishes.
    net.b_to_a.cfg.loss = 1.0;
    let probes = c.conn().stats().probes;
    run_idle(&mut c, &mut s, &mut net, 10 * 60_000);
    assert_eq!(c.state(), Some(State::Closed));
    assert!(c.events.contains(&Event::TimedOut));
    assert_eq!(
        c.conn().stats().probes - probes,
        5,
        "probes after the peer vanished"
    );
}

#[test]
fn keepalive_detects_dead_peer() {
    let (mut c, mut s, mut net) = keepalive_pair(3);
    run_idle(&mut c, &mut s, &mut net, 500);
    assert_eq!(
        c.state(),
        Some(State::Established),
        "answered keepalives keep it open"
    );
    assert!(c.conn().stats().probes > 0);
    net.a_to_b.cfg.loss = 1.0;
    run_idle(&mut c, &mut s, &mut net, 1000);
    assert_eq!(c.state(), Some(State::Closed));
    assert!(c.events.contains(&Event::TimedOut));
}

#[test]
fn retransmission_limit_aborts() {
    let cfg = Config {
        max_retransmissions: 4,
        ..Config::default()
    };
    let (mut c, mut s, mut net) = established(cfg);
    net.a_to_b.cfg.loss = 1.0;
    c.conn_mut().send(&[1u8; 5000]).expect("send");
    run_idle(&mut c, &mut s, &mut net, 60_000);
    assert_eq!(c.state(), Some(State::Closed));
    assert!(c.events.contains(&Event::TimedOut));
    assert_eq!(c.conn().stats().rto_expirations, 5);
}

/// A client in SYN-SENT and the server that took its SYN, in SYN-RECEIVED, whose SYN-ACK (sent
/// at time zero) was lost.
fn a_syn_ack_lost() -> (Connection, Connection) {
    let cfg = Config::default();
    let mut c = Connection::connect(
        cfg.clone(),
        client_tuple(),
        &IsnGenerator::new([1; 16]),
        Instant::ZERO,
    );
    let mut buf = [0u8; 2048];
    let n = c.poll_transmit(Instant::ZERO, &mut buf).expect("the SYN");
    let seg = SegmentRepr::parse(&buf[..n]).expect("valid");
    let mut s = Connection::accept(cfg, &seg, &IsnGenerator::new([2; 16]), Instant::ZERO)
        .expect("accepted");
    s.poll_transmit(Instant::ZERO, &mut buf)
        .expect("the SYN-ACK, lost");
    (c, s)
}

/// A client whose SYN-ACK was lost sends its SYN again. The server, in SYN-RECEIVED, answers
/// with the SYN-ACK at once: a bare ACK (RFC 9293 3.10.7.4's answer to a segment that is not
/// acceptable) would be dropped in SYN-SENT (3.10.7.3), leaving the handshake to the server's
/// own timer. That SYN-ACK echoes the second SYN's timestamp, so the client measures the
/// round trip of its second SYN, and the handshake's ACK the server's of the second SYN-ACK
/// (RFC 7323 4.1, 4.3).
#[test]
fn a_retransmitted_syn_gets_the_syn_ack_again() {
    let (mut c, mut s) = a_syn_ack_lost();
    let mut buf = [0u8; 2048];
    let t = c.poll_timeout().expect("the SYN's timer");
    c.handle_timeout(t);
    let n = c.poll_transmit(t, &mut buf).expect("the SYN again");
    let again = buf[..n].to_vec();
    let seg = SegmentRepr::parse(&again).expect("valid");
    assert!(seg.flags.syn && !seg.flags.ack);
    let t = t + Duration::from_micros(10);
    s.handle_segment(t, &seg, |_| {});
    let n = s.poll_transmit(t, &mut buf).expect("an answer at once");
    let answer = buf[..n].to_vec();
    let seg = SegmentRepr::parse(&answer).expect("valid");
    assert!(
        seg.flags.syn && seg.flags.ack,
        "the SYN-ACK again, not {:?}",
        seg.flags
    );
    let t = t + Duration::from_micros(10);
    c.handle_segment(t, &seg, |_| {});
    assert_eq!(c.state(), State::Established);
    assert_eq!(
        c.srtt(),
        Some(Duration::from_micros(20)),
        "the SYN-ACK echoes the second SYN's timestamp: the client measured it"
    );
    let n = c.poll_transmit(t, &mut buf).expect("the handshake's ACK");
    let ack = buf[..n].to_vec();
    let t = t + Duration::from_micros(10);
    s.handle_segment(t, &SegmentRepr::parse(&ack).expect("valid"), |_| {});
    assert_eq!(s.state(), State::Established);
    assert_eq!(
        s.srtt(),
        Some(Duration::from_micros(20)),
        "measured from the SYN-ACK sent again"
    );
}

/// A SYN, or a SYN-ACK, that went twice still measures the round trip when timestamps are on:
/// the answer echoes the second copy's timestamp, which names the copy it answers (RFC 7323
/// 4.1), so the first data's RTO comes from that sample and not from the handshake's
/// backed-off timer. Without timestamps, Karn's algorithm (RFC 6298 3) leaves no sample, and
/// data transmission starts with a 3 s RTO, the handshake's backoff forgotten (RFC 6298 5.7).
#[test]
fn a_handshake_sent_twice_measures_the_rtt_by_its_timestamps() {
    let hop = Duration::from_micros(10);
    for timestamps in [true, false] {
        let cfg = Config {
            timestamps,
            ..Config::default()
        };
        let mut buf = [0u8; 2048];
        let mut send = |conn: &mut Connection, now: Instant| -> Vec<u8> {
            let n = conn.poll_transmit(now, &mut buf).expect("a segment");
            buf[..n].to_vec()
        };
        let take = |conn: &mut Connection, now: Instant, packet: &[u8]| {
            conn.handle_segment(now, &SegmentRepr::parse(packet).expect("valid"), |_| {});
        };
        let connect = || {
            Connection::connect(
                cfg.clone(),
                client_tuple(),
                &IsnGenerator::new([1; 16]),
                Instant::ZERO,
            )
        };
        let accept = |syn: &[u8], now: Instant| {
            let seg = SegmentRepr::parse(syn).expect("valid");
            Connection::accept(cfg.clone(), &seg, &IsnGenerator::new([2; 16]), now)
                .expect("accepted")
        };

        // The client's SYN is lost once; the second copy is answered at once.
        let mut c = connect();
        let _lost = send(&mut c, Instant::ZERO);
        let t = c.poll_timeout().expect("the SYN's timer");
        c.handle_timeout(t);
        let syn = send(&mut c, t);
        let mut s = accept(&syn, t + hop);
        let synack = send(&mut s, t + hop);
        take(&mut c, t + hop * 2, &synack);
        assert_eq!(c.state(), State::Established);
        if timestamps {
            assert_eq!(
                c.srtt(),
                Some(hop * 2),
                "the client measured the second SYN"
            );
            assert_eq!(c.rto(), hop * 2 + cfg.min_rto, "SRTT + the floor");
        } else {
            assert_eq!(c.srtt(), None, "Karn: no sample without timestamps");
            assert_eq!(c.rto(), Duration::from_secs(3), "RFC 6298 5.7");
        }

        // The server's SYN-ACK is lost once; the second copy is answered at once.
        let mut c = connect();
        let syn = send(&mut c, Instant::ZERO);
        let mut s = accept(&syn, Instant::ZERO + hop);
        let _lost = send(&mut s, Instant::ZERO + hop);
        let t = s.poll_timeout().expect("the SYN-ACK's timer");
        s.handle_timeout(t);
        let synack = send(&mut s, t);
        take(&mut c, t + hop, &synack);
        let ack = send(&mut c, t + hop);
        take(&mut s, t + hop * 2, &ack);
        assert_eq!(s.state(), State::Established);
        if timestamps {
            assert_eq!(
                s.srtt(),
                Some(hop * 2),
                "the server measured the second SYN-ACK"
            );
            assert_eq!(s.rto(), hop * 2 + cfg.min_rto, "SRTT + the floor");
        } else {
            assert_eq!(s.srtt(), None, "Karn: no sample without timestamps");
            assert_eq!(s.rto(), Duration::from_secs(3), "RFC 6298 5.7");
        }
    }
}

/// The retransmission limit is also a time: a peer that SACKs new data while one segment stays
/// stuck gives the sender fresh RTT samples, each of which collapses the backoff (RFC 6298
/// 5.7), so timeouts come twice `min_rto` apart (each is armed with the RTO backed off once)
/// and `max_retransmissions` of them pass within a few tens of milliseconds. The connection
/// lives on until the series has lasted as long as that many timeouts doubling from `min_rto`
/// (5 + 10 + 20 + 40 ms for 4), then aborts with `TimedOut`, as Linux's `tcp_retries2` is a
/// time.
#[test]
fn a_stuck_segment_with_sacks_around_it_is_given_up_on_after_the_give_up_time() {
    use tcp_engine::sim::Endpoint;
    let cfg = Config {
        max_retransmissions: 4,
        ..Config::default()
    };
    let give_up_after = Duration::from_millis(5 + 10 + 20 + 40);
    let (mut c, mut s, net) = established(cfg);
    let start = net.now;
    // The first segment sent from here never arrives, nor does any copy of it.
    c.conn_mut().send(&[9u8; 100]).expect("send");
    let mut buf = vec![0u8; 2048];
    let stuck = {
        let n = Endpoint::transmit(&mut c, start, &mut buf).expect("the stuck segment");
        SegmentRepr::parse(&buf[..n]).expect("valid").seq
    };
    let mut now = start;
    let mut first_rto = None;
    let mut alive_past_count = false;
    // A small segment every 100 us (the loss window of one MSS still lets it through next
    // to the stuck one), delivered and SACKed within 10 us either way.
    for _ in 0..20_000 {
        if c.state() != Some(State::Established) {
            break;
        }
        now += Duration::from_micros(100);
        let _ = c.conn_mut().send(&[7u8; 100]);
        // Each side's timers, then what it sends, to the other (the stuck segment dropped).
        let step = |from: &mut Peer, to: &mut Peer, buf: &mut [u8]| {
            if from.next_timeout().is_some_and(|t| t <= now) {
                from.on_timeout(now);
            }
            while let Some(n) = Endpoint::transmit(from, now, buf) {
                let seg = SegmentRepr::parse(&buf[..n]).expect("valid");
                if seg.seq == stuck && !seg.payload.is_empty() {
                    continue;
                }
                to.receive(now + Duration::from_micros(10), &buf[..n]);
            }
        };
        step(&mut c, &mut s, &mut buf);
        step(&mut s, &mut c, &mut buf);
        let rtos = c.conn().stats().rto_expirations;
        if rtos >= 1 {
            first_rto.get_or_insert(now);
        }
        if rtos > 5 && c.state() == Some(State::Established) {
            alive_past_count = true;
        }
    }
    let first_rto = first_rto.expect("the stuck segment timed out");
    let rtos = c.conn().stats().rto_expirations;
    assert_eq!(
        c.state(),
        Some(State::Closed),
        "given up on ({rtos} timeouts)"
    );
    assert!(c.events.contains(&Event::TimedOut));
    assert!(
        alive_past_count,
        "the backoff never collapsed: {rtos} timeouts (the count alone is 5)"
    );
    let lasted = now - first_rto;
    assert!(
        lasted >= give_up_after,
        "gave up {lasted:?} after the first timeout, before {give_up_after:?}"
    );
    assert!(
        lasted < give_up_after + Duration::from_millis(20),
        "gave up {lasted:?} after the first timeout: one timeout past {give_up_after:?} at most"
    );
}

/// The retransmission limit counts timeouts in a row: an ACK that acknowledges everything
/// outstanding ends the series (RFC 9293 3.8.3's R2 is about one segment's retransmissions), so
/// a request/response connection whose requests now and then time out once (a loaded peer that
/// ACKs late) lives on. Until 2026-11-22 only a partial ACK reset the count, and a long-lived
/// connection died after `max_retransmissions` such timeouts over its life.
#[test]
fn timeouts_ended_by_a_full_ack_do_not_add_up() {
    let cfg = Config {
        max_retransmissions: 4,
        ..Config::default()
    };
    let (mut c, mut s, mut net) = established(cfg);
    let mut sent = 0u64;
    for round in 0..10 {
        let before = c.conn().stats().rto_expirations;
        net.a_to_b.cfg.loss = 1.0;
        c.conn_mut().send(&[7u8; 100]).expect("send");
        sent += 100;
        for _ in 0..1000 {
            if c.conn().stats().rto_expirations > before {
                break;
            }
            run_idle(&mut c, &mut s, &mut net, 1);
        }
        assert_eq!(
            c.conn().stats().rto_expirations,
            before + 1,
            "round {round}: one timeout"
        );
        net.a_to_b.cfg.loss = 0.0;
        run_idle(&mut c, &mut s, &mut net, 200);
        assert_eq!(c.state(), Some(State::Established), "round {round}");
        assert_eq!(
            c.conn().bytes_acked(),
            sent,
            "round {round}: all acknowledged"
        );
    }
    assert!(!c.events.contains(&Event::TimedOut));
}

/// RFC 5482 / RFC 9293 3.10.8: with a user timeout, data unanswered for that long ends the
/// connection (TimedOut) long before the retransmission limit would; while the peer makes
/// progress, the clock keeps starting again.
#[test]
fn user_timeout_ends_a_connection_whose_data_goes_unanswered() {
    let cfg = Config {
        user_timeout: Some(Duration::from_millis(300)),
        ..Config::default()
    };
    let (mut c, mut s, mut net) = established(cfg.clone());
    // Progress: 2 s of exchanges, every one acknowledged, with the 300 ms timeout set.
    for _ in 0..20 {
        c.conn_mut().send(&[3u8; 1000]).expect("send");
        run_idle(&mut c, &mut s, &mut net, 100);
        assert_eq!(c.state(), Some(State::Established));
    }
    assert_eq!(c.conn().stats().user_timeouts, 0);
    // The peer goes silent.
    net.b_to_a.cfg.loss = 1.0;
    c.conn_mut().send(&[1u8; 5000]).expect("send");
    run_idle(&mut c, &mut s, &mut net, 250);
    assert_eq!(
        c.state(),
        Some(State::Established),
        "before the user timeout"
    );
    run_idle(&mut c, &mut s, &mut net, 200);
    assert_eq!(c.state(), Some(State::Closed), "after the user timeout");
    assert!(c.events.contains(&Event::TimedOut));
    assert_eq!(c.conn().stats().user_timeouts, 1);
    assert!(c.conn().stats().rto_expirations < cfg.max_retransmissions as u64);
}

/// The user timeout runs only while data waits on the peer: an idle connection, and one
/// whose data has all been acknowledged, live on however long they idle.
#[test]
fn user_timeout_leaves_idle_connections_alone() {
    let cfg = Config {
        user_timeout: Some(Duration::from_millis(100)),
        ..Config::default()
    };
    let (mut c, mut s, mut net) = established(cfg);
    run_idle(&mut c, &mut s, &mut net, 1000);
    assert_eq!(c.state(), Some(State::Established));
    assert_eq!(s.state(), Some(State::Established));
    c.conn_mut().send(&[5u8; 3000]).expect("send");
    run_idle(&mut c, &mut s, &mut net, 1000);
    assert_eq!(c.state(), Some(State::Established));
    assert_eq!(c.conn().stats().user_timeouts, 0);
}

/// draft-csapuntz-tcprdma-00 3.2: the RDMA option is in use only when both SYNs carried it.
#[test]
fn the_rdma_option_is_used_only_when_both_sides_offer_it() {
    for (c_on, s_on) in [(true, true), (true, false), (false, true), (false, false)] {
        let cfg = |on| Config {
            rdma_option: on,
            ..Config::default()
        };
        let (mut c, mut s, mut net) = setup(2, 0, lossy(0.0), lossy(0.0), cfg(c_on), cfg(s_on));
        net.run(
            &mut c,
            &mut s,
            Instant::from_millis(1000),
            |c, s, _| {
                c.state() == Some(State::Established) && s.state() == Some(State::Established)
            },
            |_, _, _| {},
        );
        assert_eq!(c.state(), Some(State::Established));
        let both = c_on && s_on;
        assert_eq!(c.conn().rdma_option_enabled(), both, "client {c_on} {s_on}");
        assert_eq!(s.conn().rdma_option_enabled(), both, "server {c_on} {s_on}");
        // The other options are negotiated as without it.
        assert!(c.conn().sack_enabled() && c.conn().timestamps_enabled());
    }
}

/// A peer that acknowledges our FIN but never sends its own (its side sits in CLOSE-WAIT,
/// answering keepalives and sending an octet now and then) does not hold the connection for
/// ever: FIN-WAIT-2 gives up `Config::fin_wait2_timeout` after it began, whatever came
/// meanwhile (the data is received), resets the peer and closes. Without the timeout the
/// connection stays in FIN-WAIT-2 as long as the peer answers.
#[test]
fn fin_wait_2_gives_up_on_a_peer_that_never_closes() {
    let cfg = |fin_wait2_timeout| Config {
        fin_wait2_timeout,
        keepalive: Some((Duration::from_millis(50), Duration::from_millis(10), 3)),
        ..Config::default()
    };
    // Without the timeout: held as long as the peer answers.
    let (mut c, mut s, mut net) = established_pair(cfg(None), Config::default());
    c.conn_mut().close();
    run_idle(&mut c, &mut s, &mut net, 2000);
    assert_eq!(c.state(), Some(State::FinWait2));
    assert_eq!(s.state(), Some(State::CloseWait));
    assert!(
        c.conn().stats().probes > 10,
        "keepalives answered meanwhile"
    );

    let (mut c, mut s, mut net) =
        established_pair(cfg(Some(Duration::from_millis(300))), Config::default());
    c.conn_mut().close();
    run_idle(&mut c, &mut s, &mut net, 20);
    assert_eq!(c.state(), Some(State::FinWait2));
    // Data from the peer now and then: received, and no reason to wait longer.
    for _ in 0..2 {
        run_idle(&mut c, &mut s, &mut net, 100);
        s.conn_mut().send(&[7u8; 100]).expect("send in CLOSE-WAIT");
    }
    run_idle(&mut c, &mut s, &mut net, 50);
    assert_eq!(c.state(), Some(State::FinWait2));
    assert_eq!(c.conn().stats().fin_wait2_timeouts, 0);
    run_idle(&mut c, &mut s, &mut net, 100);
    assert_eq!(
        c.state(),
        Some(State::Closed),
        "300 ms after FIN-WAIT-2 began"
    );
    assert!(c.events.contains(&Event::Closed));
    assert_eq!(c.conn().stats().fin_wait2_timeouts, 1);
    assert_eq!(s.state(), Some(State::Closed), "the peer got the reset");
    assert!(s.events.contains(&Event::Reset));
}

/// A FIN the peer never got, sent while its window is shut: its RCV.NXT stays short of the
/// FIN, and a reset that counted the FIN would fall outside the zero window, where the peer
/// drops it and keeps its side (RFC 5961 3.2). Ours stays inside the window the peer offered.
#[test]
fn a_reset_after_a_lost_fin_into_a_zero_window_is_accepted() {
    let mut cfg = Config::mpa();
    cfg.recv_buffer = 0; // the server's window stays shut
    let (mut c, mut s, mut net) = established_pair(Config::mpa(), cfg);
    net.a_to_b.cfg.loss = 1.0;
    c.conn_mut().close();
    run_idle(&mut c, &mut s, &mut net, 50);
    assert_eq!(c.state(), Some(State::FinWait1));
    assert_eq!(s.state(), Some(State::Established), "the FIN was lost");
    net.a_to_b.cfg.loss = 0.0;
    c.conn_mut().abort();
    run_idle(&mut c, &mut s, &mut net, 50);
    assert_eq!(s.state(), Some(State::Closed), "the reset was taken");
    assert!(s.events.contains(&Event::Reset));
}

/// A blind segment that overlaps RCV.NXT but acknowledges data never sent (an off-path
/// guess) carries a timestamp far ahead: it is dropped, and TS.Recent is left alone, so the
/// real peer's next segment still passes PAWS (TS.Recent is updated only after the ACK
/// check, as Linux does; RFC 7323 5.3 R3 would update it first).
#[test]
fn a_blind_segment_with_a_bad_ack_does_not_move_ts_recent() {
    let (mut c, mut s, mut net) = setup(
        5,
        20_000,
        lossy(0.0),
        lossy(0.0),
        Config::default(),
        Config::default(),
    );
    run_until_done(
        &mut c,
        &mut s,
        &mut net,
        Duration::from_secs(10),
        |_, _, _| {},
    );
    run_idle(&mut c, &mut s, &mut net, 10);
    let now = net.now;
    let rcv_nxt = s.conn().rcv_nxt();
    // The ACK field: beyond anything the server sent.
    let beyond = s.conn().snd_nxt().wrapping_add(1 << 20);
    let mut blind = from_client(&c, rcv_nxt, beyond, ACK, b"evil");
    blind.options.timestamp = Some(((1 << 30) + 12_345, 0));
    s.conn_mut().handle_segment(now, &blind, |_| {});
    assert_eq!(s.conn().rcv_nxt(), rcv_nxt, "the blind data was taken");
    // The real client goes on: its segments pass PAWS.
    c.conn_mut().send(b"real").expect("send");
    run_idle(&mut c, &mut s, &mut net, 50);
    assert_eq!(
        s.conn().stats().paws_drops,
        0,
        "the blind TSval poisoned PAWS"
    );
    assert_eq!(s.conn().rcv_nxt(), rcv_nxt.wrapping_add(4));
}

/// Segments a blind sender can make on the connection's four-tuple (outside the window, or
/// with an ACK of nothing we sent) are dropped, and do not count as hearing from the peer:
/// keepalive still finds a peer that vanished (RFC 9293 3.8.4). Before, any segment on the
/// four-tuple restarted the idle time, and a sender of one a minute kept a dead peer's
/// connection for good.
#[test]
fn blind_segments_do_not_keep_a_dead_peer_alive() {
    let (mut c, mut s, mut net) = keepalive_pair(3);
    run_idle(&mut c, &mut s, &mut net, 50);
    assert_eq!(c.state(), Some(State::Established));
    // The peer vanishes: nothing of ours reaches it.
    net.a_to_b.cfg.loss = 1.0;
    for i in 0..40u32 {
        let (rcv_nxt, snd_nxt) = (c.conn().rcv_nxt(), c.conn().snd_nxt());
        let blind = [
            // Far outside the window.
            from_client(&s, rcv_nxt.wrapping_add(1 << 30), i, ACK, &[]),
            // In the window, acknowledging what we never sent.
            from_client(&s, rcv_nxt, snd_nxt.wrapping_add(1000 + i), ACK, &[]),
        ];
        for seg in &blind {
            c.conn_mut().handle_segment(net.now, seg, |_| {});
        }
        run_idle(&mut c, &mut s, &mut net, 25);
    }
    assert_eq!(c.state(), Some(State::Closed), "{:?}", c.conn().stats());
    assert!(c.events.contains(&Event::TimedOut));
}

/// Into TIME-WAIT with keepalive on, the peer's FIN again (our ACK of it lost): re-ACKed, and
/// TIME-WAIT stays quiet for its 2 MSL (RFC 9293 3.6.1): no keepalive probe from it (which a
/// closed peer would answer with a RST that ends TIME-WAIT early).
#[test]
fn time_wait_sends_no_keepalive_probes() {
    let cfg = Config {
        time_wait: Duration::from_secs(2),
        ..keepalive(3)
    };
    let (mut c, mut s, mut net) = client_in_time_wait(cfg);
    let fin = TcpFlags { fin: true, ..ACK };
    let (fin_seq, ack) = (c.conn().rcv_nxt().wrapping_sub(1), c.conn().snd_nxt());
    let probes = c.conn().stats().probes;
    c.conn_mut()
        .handle_segment(net.now, &from_client(&s, fin_seq, ack, fin, &[]), |_| {});
    run_idle(&mut c, &mut s, &mut net, 1000);
    assert_eq!(c.state(), Some(State::TimeWait));
    assert_eq!(c.conn().stats().probes, probes, "a probe from TIME-WAIT");
}

/// TIME-WAIT restarts its 2 MSL for the peer's FIN again (RFC 9293 3.10.7.4), not for a FIN
/// anywhere else outside the window, which a blind sender could repeat to hold the
/// connection there for good, nor for one at RCV.NXT (past the peer's FIN, so not it).
#[test]
fn only_the_peers_fin_again_restarts_time_wait() {
    // Where the FIN starts, from RCV.NXT (past the peer's FIN); whether TIME-WAIT restarts.
    for (from_rcv_nxt, still_waiting) in [(-1i32, true), (1 << 30, false), (0, false)] {
        let (mut c, mut s, mut net) = client_in_time_wait(short_tw());
        run_idle(&mut c, &mut s, &mut net, 60);
        let fin = TcpFlags { fin: true, ..ACK };
        let seq = c.conn().rcv_nxt().wrapping_add_signed(from_rcv_nxt);
        let ack = c.conn().snd_nxt();
        c.conn_mut()
            .handle_segment(net.now, &from_client(&s, seq, ack, fin, &[]), |_| {});
        // 100 ms from entering TIME-WAIT have passed; 100 ms from the FIN have not.
        run_idle(&mut c, &mut s, &mut net, 60);
        assert_eq!(
            c.state() == Some(State::TimeWait),
            still_waiting,
            "FIN at RCV.NXT {from_rcv_nxt:+}"
        );
    }
}

/// ACKs of data we never sent are answered (RFC 5961 5.2) at most as often as challenge ACKs
/// (RFC 5961 7: `Config::challenge_ack_limit` a second), so that two ends out of step do not
/// trade ACKs as fast as they can.
#[test]
fn acks_of_unsent_data_are_answered_as_challenge_acks() {
    let (mut c, s, net) = established(Config::default());
    let (rcv_nxt, snd_nxt) = (c.conn().rcv_nxt(), c.conn().snd_nxt());
    let mut answers = 0;
    for i in 0..300u32 {
        let seg = from_client(&s, rcv_nxt, snd_nxt.wrapping_add(1000 + i), ACK, &[]);
        c.conn_mut().handle_segment(net.now, &seg, |_| {});
        answers += drain(c.conn_mut(), net.now).len();
    }
    let limit = Config::default().challenge_ack_limit as usize;
    assert!(answers > 0 && answers <= limit, "{answers} answers");
    assert_eq!(c.state(), Some(State::Established));
}

/// The peer's last data and FIN again after we took both (our ACK lost): the D-SACK reports
/// exactly the duplicate octets (RFC 2883 4.1.1), not one octet lower for the FIN.
#[test]
fn a_d_sack_after_the_peers_fin_names_the_duplicate_octets() {
    let (mut c, mut s, mut net) = established(Config::default());
    let data = [7u8; 100];
    s.conn_mut().send(&data).expect("send");
    s.conn_mut().close();
    net.run(
        &mut c,
        &mut s,
        net.now + Duration::from_secs(1),
        |c, s, _| c.state() == Some(State::CloseWait) && s.conn().snd_una() == s.conn().snd_nxt(),
        |_, _, _| {},
    );
    assert_eq!(c.state(), Some(State::CloseWait));
    let end = c.conn().rcv_nxt().wrapping_sub(1);
    let start = end.wrapping_sub(data.len() as u32);
    let fin = TcpFlags { fin: true, ..ACK };
    let again = from_client(&s, start, c.conn().snd_nxt(), fin, &data);
    c.conn_mut().handle_segment(net.now, &again, |_| {});
    let out = drain(c.conn_mut(), net.now);
    let ack = SegmentRepr::parse(out.first().expect("an ACK")).expect("valid");
    assert_eq!(
        ack.options.sack_blocks().first().map(|b| (b.left, b.right)),
        Some((start, end))
    );
}

/// A close in SYN-RECEIVED queues the FIN behind the handshake (RFC 9293 3.10.4 would also
/// let it go at once with nothing queued; waiting is the choice made here): our SYN
/// keeps its retransmission timer, so a lost SYN-ACK goes again (before, the connection went
/// to FIN-WAIT-1 and sent a FIN without ever repeating the SYN-ACK: the handshake could not
/// complete, and the connection waited out the data retransmission limit); once the peer's
/// ACK of it comes, the FIN goes and the connection is in FIN-WAIT-1.
#[test]
fn a_close_in_syn_received_keeps_the_syn_ack_going() {
    let (mut c, mut s) = a_syn_ack_lost();
    s.close();
    assert_eq!(
        s.state(),
        State::SynReceived,
        "the FIN waits for the handshake"
    );
    let t = s.poll_timeout().expect("the SYN-ACK's timer");
    s.handle_timeout(t);
    let out = drain(&mut s, t);
    let first = SegmentRepr::parse(&out[0]).expect("valid");
    assert!(
        first.flags.syn && first.flags.ack && !first.flags.fin,
        "{:?}",
        first.flags
    );
    let t = t + Duration::from_micros(10);
    c.handle_segment(t, &first, |_| {});
    assert_eq!(c.state(), State::Established);
    let out = drain(&mut c, t);
    let t = t + Duration::from_micros(10);
    s.handle_segment(t, &SegmentRepr::parse(&out[0]).expect("valid"), |_| {});
    assert_eq!(s.state(), State::FinWait1);
    let out = drain(&mut s, t);
    assert!(
        out.iter()
            .any(|f| SegmentRepr::parse(f).expect("valid").flags.fin),
        "the FIN goes once the handshake is complete"
    );
}

/// No keepalive probe while sent data is outstanding (RFC 9293 3.8.4, MUST-26): the
/// retransmission timer decides about a silent peer, not keepalive (before, probes went out
/// among the retransmissions and keepalive ended the connection after idle + 3 intervals).
#[test]
fn keepalive_waits_while_data_is_outstanding() {
    let (mut c, mut s, mut net) = established_pair(keepalive(3), Config::default());
    net.a_to_b.cfg.loss = 1.0;
    c.conn_mut().send(&[1u8; 5000]).expect("send");
    let probes = c.conn().stats().probes;
    run_idle(&mut c, &mut s, &mut net, 400);
    assert_eq!(
        c.state(),
        Some(State::Established),
        "the retransmission timer decides, not keepalive"
    );
    assert_eq!(
        c.conn().stats().probes,
        probes,
        "no keepalive probe with data in flight"
    );
}

/// The peer's FIN again restarts TIME-WAIT (RFC 9293 3.10.7.4), but not beyond four periods
/// after it began: a peer resending its FIN just inside each period cannot hold it for good.
#[test]
fn a_peer_resending_its_fin_cannot_hold_time_wait_for_ever() {
    let (mut c, mut s, mut net) = client_in_time_wait(short_tw());
    let fin = TcpFlags { fin: true, ..ACK };
    for _ in 0..40 {
        if c.state() != Some(State::TimeWait) {
            break;
        }
        let (seq, ack) = (c.conn().rcv_nxt().wrapping_sub(1), c.conn().snd_nxt());
        c.conn_mut()
            .handle_segment(net.now, &from_client(&s, seq, ack, fin, &[]), |_| {});
        run_idle(&mut c, &mut s, &mut net, 90);
    }
    assert_eq!(
        c.state(),
        Some(State::Closed),
        "3.6 s of FINs; TIME-WAIT is 100 ms"
    );
}

/// Keepalive with a count of 0 still sends a probe before it gives up (RFC 9293 3.8.4: one
/// unanswered probe is no proof of a dead peer), and an answered one keeps the connection.
#[test]
fn keepalive_with_no_probes_configured_still_probes() {
    let (mut c, mut s, mut net) = keepalive_pair(0);
    run_idle(&mut c, &mut s, &mut net, 150);
    assert_eq!(c.state(), Some(State::Established));
    assert!(c.conn().stats().probes >= 1);
}

/// A connection of the pair in `state`, taken out of its peer (its packets undelivered from
/// then on) with nothing left to send, and the time: reached with real segments over a
/// loss-free link.
fn connection_in(state: State) -> (Connection, Instant) {
    let (mut conn, now) = reach(state);
    drain(&mut conn, now);
    (conn, now)
}

fn reach(state: State) -> (Connection, Instant) {
    let (mut c, mut s, mut net) = established(short_tw());
    let mut buf = [0u8; 2048];
    let now = net.now;
    let take = |p: &mut Peer| p.conn.take().expect("connection");
    match state {
        State::FinWait1 => {
            c.conn_mut().close();
            drain(c.conn_mut(), now); // the FIN, lost
            (take(&mut c), now)
        }
        State::FinWait2 | State::CloseWait => {
            c.conn_mut().close();
            net.run(
                &mut c,
                &mut s,
                now + Duration::from_secs(1),
                |c, _, _| c.state() == Some(State::FinWait2),
                |_, _, _| {},
            );
            let now = net.now;
            if state == State::FinWait2 {
                (take(&mut c), now)
            } else {
                (take(&mut s), now)
            }
        }
        State::LastAck => {
            let (mut server, now) = reach(State::CloseWait);
            server.close();
            drain(&mut server, now); // its FIN, lost
            (server, now)
        }
        State::Closing => {
            // Both close; the client's FIN is lost, the server's reaches it.
            c.conn_mut().close();
            drain(c.conn_mut(), now);
            s.conn_mut().close();
            let n = s
                .conn_mut()
                .poll_transmit(now, &mut buf)
                .expect("server FIN");
            let fin = SegmentRepr::parse(&buf[..n]).expect("valid");
            assert!(fin.flags.fin);
            c.conn_mut().handle_segment(now, &fin, |_| {});
            drain(c.conn_mut(), now);
            (take(&mut c), now)
        }
        State::TimeWait => {
            let (mut c, _s, net) = client_in_time_wait(short_tw());
            let now = net.now;
            (take(&mut c), now)
        }
        other => panic!("no way to {other:?} here"),
    }
}

/// A segment from `conn`'s peer, `from_rcv_nxt` past RCV.NXT.
fn to(conn: &Connection, from_rcv_nxt: u32, flags: TcpFlags) -> SegmentRepr<'static> {
    let t = conn.four_tuple();
    SegmentRepr {
        tos: 0,
        src_addr: t.remote_addr,
        dst_addr: t.local_addr,
        src_port: t.remote_port,
        dst_port: t.local_port,
        seq: conn.rcv_nxt().wrapping_add(from_rcv_nxt),
        ack: conn.snd_nxt(),
        flags,
        window: 1000,
        options: TcpOptions::default(),
        payload: &[],
    }
}

/// RST and SYN in every closing state (RFC 5961 3.2 and 4.2, RFC 9293 3.10.7.4): a RST
/// exactly at RCV.NXT ends the connection (TIME-WAIT's as closed, the others as reset); one
/// elsewhere in the window draws a challenge ACK and changes nothing; one far outside is
/// dropped silently; a SYN draws a challenge ACK and changes nothing.
#[test]
fn rst_and_syn_in_every_closing_state() {
    let rst = TcpFlags {
        rst: true,
        ..TcpFlags::default()
    };
    let syn = TcpFlags {
        syn: true,
        ..TcpFlags::default()
    };
    let states = [
        State::FinWait1,
        State::FinWait2,
        State::CloseWait,
        State::Closing,
        State::LastAck,
        State::TimeWait,
    ];
    for state in states {
        let challenge_acked = |conn: &mut Connection, now| {
            let out = drain(conn, now);
            out.len() == 1 && {
                let a = SegmentRepr::parse(&out[0]).expect("valid");
                a.flags.ack && !a.flags.rst && !a.flags.syn && a.ack == conn.rcv_nxt()
            }
        };
        // Exactly at RCV.NXT.
        let (mut conn, now) = connection_in(state);
        assert_eq!(conn.state(), state);
        conn.handle_segment(now, &to(&conn, 0, rst), |_| {});
        assert_eq!(conn.state(), State::Closed, "{state:?}");
        let ended = if state == State::TimeWait {
            Event::Closed
        } else {
            Event::Reset
        };
        let events: Vec<_> = std::iter::from_fn(|| conn.poll_event()).collect();
        assert!(events.contains(&ended), "{state:?}: {events:?}");
        // In the window, not at RCV.NXT.
        let (mut conn, now) = connection_in(state);
        conn.handle_segment(now, &to(&conn, 1, rst), |_| {});
        assert_eq!(conn.state(), state, "an in-window RST");
        assert!(
            challenge_acked(&mut conn, now),
            "{state:?}: no challenge ACK"
        );
        // Far outside.
        let (mut conn, now) = connection_in(state);
        conn.handle_segment(now, &to(&conn, 1 << 30, rst), |_| {});
        assert_eq!(conn.state(), state);
        assert!(drain(&mut conn, now).is_empty(), "{state:?}: a reply");
        // A SYN in the window.
        let (mut conn, now) = connection_in(state);
        conn.handle_segment(now, &to(&conn, 0, syn), |_| {});
        assert_eq!(conn.state(), state, "a SYN");
        assert!(
            challenge_acked(&mut conn, now),
            "{state:?}: SYN, no challenge ACK"
        );
    }
}

/// A client closing (`close` or `close_orphaned`) towards a server whose window stays shut,
/// taken out of the pair, with nothing left to send but what the close adds.
fn closing_towards_a_shut_window(orphaned: bool) -> (Connection, Instant) {
    let mut shut = Config::mpa();
    shut.recv_buffer = 0;
    let (mut c, _s, net) = established_pair(Config::mpa(), shut);
    let mut conn = c.conn.take().expect("client");
    drain(&mut conn, net.now);
    if orphaned {
        conn.close_orphaned();
    } else {
        conn.close();
    }
    (conn, net.now)
}

/// The peer's answer to anything `conn` sends: an ACK of SND.UNA offering `window` (a FIN it
/// had no window for is dropped).
fn acking_snd_una(conn: &Connection, window: u16) -> SegmentRepr<'static> {
    let t = conn.four_tuple();
    SegmentRepr {
        tos: 0,
        src_addr: t.remote_addr,
        dst_addr: t.local_addr,
        src_port: t.remote_port,
        dst_port: t.local_port,
        seq: conn.rcv_nxt(),
        ack: conn.snd_una(),
        flags: ACK,
        window,
        options: TcpOptions::default(),
        payload: &[],
    }
}

/// Answers everything `conn` sends with a zero window, running its timers, while it is in
/// FIN-WAIT-1 and for at most `long`; the time then, and the FINs it sent.
fn answer_with_a_shut_window(
    conn: &mut Connection,
    mut now: Instant,
    long: Duration,
) -> (Instant, usize) {
    let end = now + long;
    let mut fins = 0;
    while now < end && conn.state() == State::FinWait1 {
        for seg in drain(conn, now) {
            fins += usize::from(SegmentRepr::parse(&seg).expect("valid").flags.fin);
            conn.handle_segment(now, &acking_snd_una(conn, 0), |_| {});
        }
        match conn.poll_timeout() {
            Some(t) => {
                now = t.max(now);
                conn.handle_timeout(now);
            }
            None => break,
        }
    }
    (now, fins)
}

/// A FIN waits behind a shut window as data does (RFC 9293 3.4: it takes a sequence number),
/// the persist timer probing: a receiver that drops a FIN it has no window for, and answers
/// every segment with its zero window, keeps the connection open as long as it answers
/// (RFC 9293 3.8.6.1, MUST-37). Before, the FIN went into the shut window, was retransmitted
/// unacknowledged, and the connection timed out after the retransmission limit. Once the
/// window opens the FIN goes.
#[test]
fn a_fin_waits_for_a_shut_window() {
    let (mut conn, now) = closing_towards_a_shut_window(false);
    let (now, fins) = answer_with_a_shut_window(&mut conn, now, Duration::from_secs(30 * 60));
    assert_eq!(
        conn.state(),
        State::FinWait1,
        "half an hour of answered probes"
    );
    assert_eq!(fins, 0, "no FIN into the shut window");
    assert!(conn.stats().window_probes > 10);
    // The window opens: the FIN goes.
    conn.handle_segment(now, &acking_snd_una(&conn, 1000), |_| {});
    let out = drain(&mut conn, now);
    assert!(
        out.iter()
            .any(|f| SegmentRepr::parse(f).expect("valid").flags.fin),
        "the FIN once the window opened"
    );
}

/// An orphaned connection (closed by an application that reads no more) whose FIN waits
/// behind a window the peer keeps shut, answering every probe, is given up after as many
/// probes as retransmissions: nobody would ever end it otherwise.
#[test]
fn an_orphaned_fin_behind_a_shut_window_is_given_up() {
    let (mut conn, now) = closing_towards_a_shut_window(true);
    answer_with_a_shut_window(&mut conn, now, Duration::from_secs(24 * 60 * 60));
    assert_eq!(conn.state(), State::Closed, "still {:?}", conn.state());
    let events: Vec<_> = std::iter::from_fn(|| conn.poll_event()).collect();
    assert!(events.contains(&Event::TimedOut), "{events:?}");
    assert!(conn.stats().window_probes >= u64::from(Config::mpa().max_retransmissions));
}
