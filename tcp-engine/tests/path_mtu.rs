//! "Packet too big" reports (ICMP "fragmentation needed", RFC 792 and RFC 1191 4):
//! [`Connection::handle_packet_too_big`] and [`ConnectionTable::handle_packet_too_big`].
//!
//! * A report about data in flight, with an MTU below the current one and above the floor,
//!   lowers the path MTU and EMSS and resends at once, split at the new EMSS, the reported
//!   segment and every one sent since that no longer fits, the congestion window untouched
//!   (as Linux's `tcp_simple_retransmit`, which resends the older ones too; RFC 1191 6.4).
//! * A forged or stale report (RFC 5927 4.1 and 7.2) changes nothing: a sequence number not in
//!   flight, an MTU below the floor or not below the current path MTU, a connection not yet
//!   synchronized, a 4-tuple the table does not know.
//! * Through the simulator, a path MTU drop mid-transfer costs no retransmission timeout.
//! * A lowered path MTU expires ([`Config::path_mtu_expiry`], RFC 1191 6.3): the first hop's is
//!   tried again, and a path still narrow reports again, without a timeout either.
mod common;
use common::*;

use std::time::Duration;

use tcp_engine::sim::LinkConfig;
use tcp_engine::table::ConnectionTable;
use tcp_engine::wire::SegmentRepr;
use tcp_engine::{
    Config, Connection, Event, FourTuple, Instant, IsnGenerator, PacketTooBigError, State,
};

/// Every packet `conn` has to send at `now` (sequence number, IPv4 length).
fn drain(conn: &mut Connection, now: Instant) -> Vec<(u32, usize, usize)> {
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::new();
    while let Some(n) = conn.poll_transmit(now, &mut buf) {
        let seg = SegmentRepr::parse(&buf[..n]).expect("our own segment parses");
        out.push((seg.seq, n, seg.payload.len()));
        assert!(out.len() < 10_000, "runaway transmit");
    }
    out
}

/// A connected client (timestamps on: EMSS = MTU - 52) with `segments` full segments sent
/// and unacknowledged (the router dropped them all).
fn in_flight(segments: usize) -> (Connection, Vec<(u32, usize, usize)>, Instant) {
    in_flight_with(Config::default(), segments)
}

/// [`in_flight`] with both ends configured by `cfg`.
fn in_flight_with(cfg: Config, segments: usize) -> (Connection, Vec<(u32, usize, usize)>, Instant) {
    let cfg_timestamps = cfg.timestamps;
    let (mut c, _s, net) = established(cfg);
    let now = net.now;
    let mut conn = c.conn.take().expect("client connection");
    // 1500 less the headers and, with timestamps, their option.
    let emss = usize::from(conn.emss());
    assert_eq!(emss, if cfg_timestamps { 1448 } else { 1460 });
    let data = vec![7u8; segments * emss];
    assert_eq!(conn.send(&data), Ok(data.len()));
    let sent = drain(&mut conn, now);
    assert_eq!(sent.len(), segments, "{sent:?}");
    assert!(sent.iter().all(|&(_, n, len)| n == 1500 && len == emss));
    (conn, sent, now)
}

/// The peer's ACK of everything `conn` sent (no options: for a connection without
/// timestamps).
fn ack_all(conn: &mut Connection, now: Instant) {
    let nxt = conn.snd_nxt();
    peer_ack(conn, now, nxt, &[]);
}

#[test]
fn a_believed_report_lowers_emss_and_resends_what_no_longer_fits_at_once() {
    let (mut conn, sent, now) = in_flight(8);
    let cwnd = conn.cwnd();
    let nxt = conn.snd_nxt();
    // About the third segment: the first two went through before the MTU fell.
    let emss = conn
        .handle_packet_too_big(now, sent[2].0, 1200)
        .expect("believed");
    assert_eq!(emss, 1200 - 40 - 12);
    assert_eq!(conn.emss(), emss);
    assert_eq!(conn.path_mtu(), 1200);
    assert_eq!(conn.stats().path_mtu_reductions, 1);
    let mut events = Vec::new();
    while let Some(e) = conn.poll_event() {
        events.push(e);
    }
    assert_eq!(events, [Event::EmssChanged(emss)]);
    // At once, not after a timeout: the reported segment and every one sent since, in
    // segments that fit.
    let resent = drain(&mut conn, now);
    assert!(
        resent.iter().all(|&(_, n, len)| n <= 1200 && len <= 1148),
        "{resent:?}"
    );
    let octets: usize = resent.iter().map(|r| r.2).sum();
    assert_eq!(octets, 6 * 1448, "{resent:?}");
    assert_eq!(resent[0].0, sent[2].0, "from the reported segment");
    // In order, contiguous, split at EMSS (each 1448 = 1148 + 300).
    let mut next = sent[2].0;
    for &(seq, _, len) in &resent {
        assert_eq!(seq, next, "{resent:?}");
        next = next.wrapping_add(len as u32);
    }
    assert_eq!(next, nxt);
    assert_eq!(resent.len(), 12);
    assert_eq!(conn.snd_nxt(), nxt, "nothing new sent");
    // Not a congestion signal.
    assert_eq!(conn.cwnd(), cwnd);
    let st = conn.stats();
    assert_eq!(st.retransmitted_segments, 12);
    assert_eq!((st.rto_expirations, st.fast_recoveries), (0, 0));
    // The reports the rest of the burst draws name the MTU already taken.
    for &(seq, _, _) in &sent[3..] {
        assert_eq!(
            conn.handle_packet_too_big(now, seq, 1200),
            Err(PacketTooBigError::MtuNotSmaller {
                mtu: 1200,
                path_mtu: 1200
            })
        );
    }
    assert!(drain(&mut conn, now).is_empty());
    // New data goes out in segments that fit.
    assert_eq!(conn.send(&[1u8; 2000]), Ok(2000));
    let new = drain(&mut conn, now);
    assert_eq!(new.iter().map(|r| r.2).collect::<Vec<_>>(), [1148, 852]);
}

#[test]
fn a_report_about_the_oldest_segment_resends_the_whole_flight() {
    let (mut conn, sent, now) = in_flight(5);
    assert_eq!(
        conn.handle_packet_too_big(now, sent[0].0.wrapping_add(100), 1400),
        Ok(1348)
    );
    let resent = drain(&mut conn, now);
    assert_eq!(resent.len(), 10, "{resent:?}");
    assert_eq!(resent[0].0, conn.snd_una());
    assert!(resent.iter().all(|&(_, n, _)| n <= 1400), "{resent:?}");
}

#[test]
fn a_later_lower_report_lowers_again() {
    let (mut conn, sent, now) = in_flight(4);
    assert!(conn.handle_packet_too_big(now, sent[0].0, 1400).is_ok());
    drain(&mut conn, now);
    assert_eq!(conn.handle_packet_too_big(now, sent[1].0, 1000), Ok(948));
    assert_eq!(conn.path_mtu(), 1000);
    let resent = drain(&mut conn, now);
    assert!(resent.iter().all(|&(_, n, _)| n <= 1000), "{resent:?}");
    assert_eq!(conn.stats().path_mtu_reductions, 2);
}

#[test]
fn forged_or_stale_reports_change_nothing() {
    let (mut conn, sent, now) = in_flight(4);
    let (una, nxt) = (conn.snd_una(), conn.snd_nxt());
    let cases: [(u32, u16, PacketTooBigError); 8] = [
        // RFC 5927 4.1: the sequence number of no octet in flight.
        (
            una.wrapping_sub(1),
            1200,
            PacketTooBigError::SequenceNotInFlight,
        ),
        (nxt, 1200, PacketTooBigError::SequenceNotInFlight),
        (
            nxt.wrapping_add(100_000),
            1200,
            PacketTooBigError::SequenceNotInFlight,
        ),
        (
            una.wrapping_add(1 << 31),
            1200,
            PacketTooBigError::SequenceNotInFlight,
        ),
        // RFC 5927 7.2: below the floor (552).
        (
            sent[1].0,
            551,
            PacketTooBigError::MtuBelowFloor {
                mtu: 551,
                floor: 552,
            },
        ),
        (
            sent[1].0,
            0,
            PacketTooBigError::MtuBelowFloor { mtu: 0, floor: 552 },
        ),
        // RFC 1191 3: never up, and the same MTU is no news.
        (
            sent[1].0,
            1500,
            PacketTooBigError::MtuNotSmaller {
                mtu: 1500,
                path_mtu: 1500,
            },
        ),
        (
            sent[1].0,
            9000,
            PacketTooBigError::MtuNotSmaller {
                mtu: 9000,
                path_mtu: 1500,
            },
        ),
    ];
    for (seq, mtu, want) in cases {
        assert_eq!(
            conn.handle_packet_too_big(now, seq, mtu),
            Err(want),
            "seq {seq} mtu {mtu}"
        );
        assert_eq!((conn.path_mtu(), conn.emss()), (1500, 1448));
        assert!(conn.poll_event().is_none());
        assert!(drain(&mut conn, now).is_empty(), "nothing resent");
    }
    assert_eq!(conn.stats().path_mtu_reductions, 0);
    assert_eq!(conn.stats().retransmitted_segments, 0);
    // The floor is the configuration's: exactly at it is believed.
    assert_eq!(conn.handle_packet_too_big(now, sent[1].0, 552), Ok(500));
}

#[test]
fn nothing_in_flight_means_nothing_to_report() {
    let (mut c, _s, net) = established(Config::default());
    let conn = c.conn_mut();
    let una = conn.snd_una();
    assert_eq!(
        conn.handle_packet_too_big(net.now, una, 1200),
        Err(PacketTooBigError::SequenceNotInFlight)
    );
    // Not yet synchronized: a SYN-SENT connection.
    let isn = IsnGenerator::new([3; 16]);
    let mut syn_sent = Connection::connect(Config::default(), client_tuple(), &isn, Instant::ZERO);
    assert_eq!(syn_sent.state(), State::SynSent);
    let syn = drain(&mut syn_sent, Instant::ZERO);
    assert_eq!(
        syn_sent.handle_packet_too_big(Instant::ZERO, syn[0].0, 1200),
        Err(PacketTooBigError::NotSynchronized)
    );
}

#[test]
fn the_table_finds_the_connection_by_the_quoted_tuple_and_queues_it() {
    let mut table = ConnectionTable::new([9; 16], 4);
    let tuple = client_tuple();
    let now = Instant::ZERO;
    let id = table
        .connect(Config::default(), tuple, now)
        .expect("connect");
    let mut buf = vec![0u8; 2048];
    // Handshake by hand: the SYN out, a SYN-ACK in.
    let n = table.poll_transmit(now, &mut buf).expect("SYN");
    let syn = SegmentRepr::parse(&buf[..n]).expect("SYN parses");
    let isn = IsnGenerator::new([4; 16]);
    let mut server = Connection::accept(Config::default(), &syn, &isn, now).expect("accept");
    let n = server.poll_transmit(now, &mut buf).expect("SYN-ACK");
    let synack = buf[..n].to_vec();
    assert_eq!(
        table
            .handle_packet(now, &synack, |_, _| {})
            .expect("parses"),
        Some(id)
    );
    assert_eq!(
        table.get(id).map(Connection::state),
        Some(State::Established)
    );
    while table.poll_transmit(now, &mut buf).is_some() {}
    let conn = table.get_mut(id).expect("connection");
    assert_eq!(conn.send(&[5u8; 3 * 1448]), Ok(3 * 1448));
    let mut seqs = Vec::new();
    while let Some(n) = table.poll_transmit(now, &mut buf) {
        seqs.push(SegmentRepr::parse(&buf[..n]).expect("parses").seq);
    }
    assert_eq!(seqs.len(), 3);
    // An unknown tuple: the same ports the other way round, another peer port.
    for other in [
        FourTuple {
            local_addr: tuple.remote_addr,
            local_port: tuple.remote_port,
            remote_addr: tuple.local_addr,
            remote_port: tuple.local_port,
        },
        FourTuple {
            remote_port: tuple.remote_port + 1,
            ..tuple
        },
    ] {
        assert_eq!(
            table.handle_packet_too_big(now, &other, seqs[0], 1200),
            Err(PacketTooBigError::NoConnection)
        );
    }
    assert!(table.poll_transmit(now, &mut buf).is_none());
    assert_eq!(
        table.handle_packet_too_big(now, &tuple, seqs[0].wrapping_sub(1), 1200),
        Err(PacketTooBigError::SequenceNotInFlight)
    );
    assert!(table.poll_transmit(now, &mut buf).is_none());
    // The real one, about the second segment: the connection is queued and resends it and
    // the third at once.
    assert_eq!(
        table.handle_packet_too_big(now, &tuple, seqs[1], 1200),
        Ok((id, 1148))
    );
    let mut resent = Vec::new();
    while let Some(n) = table.poll_transmit(now, &mut buf) {
        resent.push((SegmentRepr::parse(&buf[..n]).expect("parses").seq, n));
    }
    assert_eq!(
        resent,
        [
            (seqs[1], 1200),
            (seqs[1] + 1148, 352),
            (seqs[2], 1200),
            (seqs[2] + 1148, 352)
        ]
    );
}

/// Through the simulator: the path MTU drops mid-transfer with a megabyte in flight (each
/// dropped packet reported, as a router's ICMP would be; the first report of a burst arrives
/// first); the transfer completes byte-exact with no retransmission timeout, and only what
/// the link dropped is sent again.
#[test]
fn a_mid_transfer_drop_through_the_simulator_costs_no_timeout() {
    let size = 4 << 20;
    // 10 Gb/s, 10 us each way, no queue limit: nothing is lost but what the MTU drops.
    let link = LinkConfig {
        queue_limit: None,
        ..LinkConfig::default()
    };
    let (mut c, mut s, mut net) = setup(
        5,
        size,
        link.clone(),
        link,
        Config::default(),
        Config::default(),
    );
    let half = net.run(
        &mut c,
        &mut s,
        Instant::from_millis(60_000),
        |_, s, _| s.received > size / 4,
        |_, _, _| {},
    );
    assert!(half);
    net.a_to_b.cfg.mtu = 1200;
    let ok = run_until_done(
        &mut c,
        &mut s,
        &mut net,
        Duration::from_secs(600),
        |_, _, _| {},
    );
    assert!(ok, "received {}", s.received);
    let st = c.conn().stats();
    println!(
        "{} dropped as too big, {} path MTU reduction(s), {} retransmitted, {} RTOs",
        net.a_to_b.stats.too_big,
        st.path_mtu_reductions,
        st.retransmitted_segments,
        st.rto_expirations
    );
    let too_big = net.a_to_b.stats.too_big;
    assert!(too_big > 0);
    assert_eq!(st.path_mtu_reductions, 1);
    assert_eq!(st.rto_expirations, 0);
    // What the link dropped, each in two pieces (1448 = 1148 + 300), and nothing else: the
    // megabyte in flight that passed before the MTU fell is not sent again.
    assert_eq!(st.retransmitted_segments, 2 * too_big);
    assert_eq!(c.conn().emss(), 1148);
}

/// RFC 1191 6.3: the lowered path MTU holds for `path_mtu_expiry` after the report, then the
/// first hop's comes back (EMSS too, reported); with no expiry it stays lowered.
#[test]
fn a_lowered_path_mtu_expires_and_the_first_hops_is_tried_again() {
    let cfg = Config {
        timestamps: false,
        ..Config::default()
    };
    let (mut conn, sent, now) = in_flight_with(cfg.clone(), 4);
    conn.handle_packet_too_big(now, sent[0].0, 1200)
        .expect("believed");
    assert_eq!(conn.emss(), 1160);
    // Everything acknowledged: the expiry is the connection's only timer.
    ack_all(&mut conn, now);
    while conn.poll_event().is_some() {}
    let expiry = Config::default().path_mtu_expiry.expect("on by default");
    assert_eq!(expiry, Duration::from_secs(600));
    assert_eq!(conn.poll_timeout(), Some(now + expiry));
    conn.handle_timeout(now + (expiry - Duration::from_millis(1)));
    assert_eq!(conn.path_mtu(), 1200, "not yet");
    conn.handle_timeout(now + expiry);
    assert_eq!(conn.path_mtu(), 1500);
    assert_eq!(conn.emss(), 1460);
    assert_eq!(conn.stats().path_mtu_raises, 1);
    let mut events = Vec::new();
    while let Some(e) = conn.poll_event() {
        events.push(e);
    }
    assert_eq!(events, [Event::EmssChanged(1460)]);
    assert_eq!(
        conn.poll_timeout(),
        None,
        "expired once, no timer left for it"
    );

    let (mut conn, sent, now) = in_flight_with(
        Config {
            path_mtu_expiry: None,
            ..cfg
        },
        4,
    );
    conn.handle_packet_too_big(now, sent[0].0, 1200)
        .expect("believed");
    ack_all(&mut conn, now);
    assert_eq!(conn.poll_timeout(), None, "no expiry, no timer");
    conn.handle_timeout(now + Duration::from_secs(3600));
    assert_eq!(conn.path_mtu(), 1200, "kept without an expiry");
    assert_eq!(conn.stats().path_mtu_raises, 0);
}

/// Through the simulator, with a short expiry: the link's MTU falls to 1200 mid-transfer and
/// (`widens`) comes back to 1500 or (not) stays. A path that widened is used whole again;
/// one still narrow draws new reports each time the first hop's MTU is tried, and lowers it
/// again; either way the transfer completes byte-exact with no retransmission timeout.
#[test]
fn a_lowered_path_mtu_expires_through_the_simulator() {
    for widens in [true, false] {
        let size = 16 << 20;
        let link = LinkConfig {
            queue_limit: None,
            ..LinkConfig::default()
        };
        let client = Config {
            path_mtu_expiry: Some(Duration::from_millis(2)),
            ..Config::default()
        };
        let (mut c, mut s, mut net) = setup(6, size, link.clone(), link, client, Config::default());
        let limit = Instant::from_millis(60_000);
        assert!(net.run(
            &mut c,
            &mut s,
            limit,
            |_, s, _| s.received > size / 8,
            |_, _, _| {}
        ));
        net.a_to_b.cfg.mtu = 1200;
        assert!(net.run(
            &mut c,
            &mut s,
            limit,
            |_, s, _| s.received > size / 2,
            |_, _, _| {}
        ));
        assert!(c.conn().stats().path_mtu_reductions >= 1);
        if widens {
            net.a_to_b.cfg.mtu = 1500;
        }
        let ok = run_until_done(
            &mut c,
            &mut s,
            &mut net,
            Duration::from_secs(600),
            |_, _, _| {},
        );
        assert!(ok, "widens {widens}: received {}", s.received);
        assert_eq!(s.dest, **c.src, "widens {widens}");
        let st = c.conn().stats();
        println!(
            "widens {widens}: {} reductions, {} raises, {} dropped as too big, {} RTOs, EMSS {}",
            st.path_mtu_reductions,
            st.path_mtu_raises,
            net.a_to_b.stats.too_big,
            st.rto_expirations,
            c.conn().emss()
        );
        assert!(st.path_mtu_raises >= 1, "widens {widens}");
        assert_eq!(st.rto_expirations, 0, "widens {widens}");
        if widens {
            assert_eq!(c.conn().emss(), 1448, "the widened path is used whole");
        } else {
            assert!(st.path_mtu_reductions >= 2, "a narrow path reports again");
        }
    }
}
