//! Connection table: 10,000 connections through one listener, O(1) lookup,
//! RST for unknown segments, malformed packets counted, backlog limit.
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Instant as WallClock;
use tcp_engine::table::{ConnId, ConnectionTable, TableError};
use tcp_engine::wire::{SegmentRepr, TcpFlags, TcpOptions};
use tcp_engine::{Config, Event, FourTuple, Instant, SendError, State, TxMode};

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

fn tuple(i: usize) -> FourTuple {
    FourTuple {
        local_addr: Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8),
        local_port: 10_000 + (i % 50_000) as u16,
        remote_addr: SERVER,
        remote_port: 4791,
    }
}

/// Exchanges in a row after which two tables that still answer each other at one instant
/// have a bug (an ACK answering an ACK, say): the test fails instead of spinning.
const SETTLE_ROUNDS: usize = 1_000;

/// Move packets between the tables until both are quiet.
fn pump(a: &mut ConnectionTable, b: &mut ConnectionTable, now: Instant) -> usize {
    let mut buf = [0u8; 2048];
    let mut moved = 0;
    let mut q: VecDeque<Vec<u8>> = VecDeque::new();
    for _ in 0..SETTLE_ROUNDS {
        let mut any = false;
        while let Some(n) = a.poll_transmit(now, &mut buf) {
            q.push_back(buf[..n].to_vec());
        }
        while let Some(p) = q.pop_front() {
            let _ = b.handle_packet(now, &p, |_, _| {});
            moved += 1;
            any = true;
        }
        while let Some(n) = b.poll_transmit(now, &mut buf) {
            q.push_back(buf[..n].to_vec());
        }
        while let Some(p) = q.pop_front() {
            let _ = a.handle_packet(now, &p, |_, _| {});
            moved += 1;
            any = true;
        }
        if !any {
            return moved;
        }
    }
    panic!("the tables did not settle in {SETTLE_ROUNDS} rounds ({moved} packets moved)");
}

#[test]
fn ten_thousand_connections() {
    let n = 10_000;
    let mut clients = ConnectionTable::new([1; 16], n);
    let mut server = ConnectionTable::new([2; 16], n);
    let cfg = Config {
        send_buffer: 8 << 10,
        recv_buffer: 8 << 10,
        tx_mode: TxMode::Records,
        ..Config::default()
    };
    server.listen(
        Ipv4Addr::UNSPECIFIED,
        4791,
        n,
        Config {
            recv_buffer: 8 << 10,
            send_buffer: 8 << 10,
            ..Config::default()
        },
    );
    let now = Instant::from_millis(1);
    let started = WallClock::now();
    let ids: Vec<_> = (0..n)
        .map(|i| {
            clients
                .connect(cfg.clone(), tuple(i), now)
                .expect("connect")
        })
        .collect();
    assert_eq!(
        clients.connect(cfg.clone(), tuple(0), now),
        Err(TableError::TupleInUse)
    );
    pump(&mut clients, &mut server, now);
    let mut accepted = Vec::new();
    while let Some(id) = server
        .accept(SERVER, 4791)
        .or_else(|| server.accept(Ipv4Addr::UNSPECIFIED, 4791))
    {
        accepted.push(id);
    }
    assert_eq!(accepted.len(), n);
    assert_eq!(server.len(), n);
    for (i, id) in ids.iter().enumerate() {
        let c = clients.get_mut(*id).expect("live");
        assert_eq!(c.state(), State::Established);
        assert_eq!(c.poll_event(), Some(Event::Connected));
        let record = format!("record {i}");
        if i % 2 == 0 {
            c.send_record(record.as_bytes()).expect("send");
        } else {
            // Written in place in two pieces; a wrong announced length queues nothing.
            let (a, b) = record.as_bytes().split_at(3);
            assert_eq!(
                c.send_record_with(record.len() + 1, |put| {
                    put(a);
                    put(b);
                }),
                Err(SendError::RecordLength {
                    announced: record.len() + 1,
                    produced: record.len()
                })
            );
            assert_eq!(c.send_queue_len(), 0);
            c.send_record_with(record.len(), |put| {
                put(a);
                put(b);
            })
            .expect("send");
        }
    }
    let moved = pump(&mut clients, &mut server, now);
    assert!(moved >= n);
    // Every server connection got exactly its client's record.
    for i in [0, 1, 4999, n - 1] {
        let t = tuple(i);
        let server_side = FourTuple {
            local_addr: t.remote_addr,
            local_port: t.remote_port,
            remote_addr: t.local_addr,
            remote_port: t.local_port,
        };
        let id = server.lookup(&server_side).expect("found");
        let mut buf = [0u8; 64];
        let got = server.get_mut(id).expect("live").recv(&mut buf);
        assert_eq!(&buf[..got], format!("record {i}").as_bytes());
    }
    println!(
        "10k connections set up and exchanged a record in {:?}",
        started.elapsed()
    );
}

fn raw(src: FourTuple, seq: u32, ack: u32, flags: TcpFlags) -> Vec<u8> {
    raw_with_tos(src, seq, ack, flags, 0)
}

fn raw_with_tos(src: FourTuple, seq: u32, ack: u32, flags: TcpFlags, tos: u8) -> Vec<u8> {
    let r = SegmentRepr {
        tos,
        src_addr: src.local_addr,
        dst_addr: src.remote_addr,
        src_port: src.local_port,
        dst_port: src.remote_port,
        seq,
        ack,
        flags,
        window: 1000,
        options: TcpOptions::default(),
        payload: b"",
    };
    let mut v = vec![0u8; r.packet_len()];
    let n = r.emit(&mut v).expect("emit");
    v.truncate(n);
    v
}

#[test]
fn unknown_segments_get_rst_and_malformed_are_counted() {
    let mut t = ConnectionTable::new([3; 16], 16);
    let now = Instant::ZERO;
    let pkt = raw(
        tuple(1),
        100,
        0,
        TcpFlags {
            syn: true,
            ..TcpFlags::default()
        },
    );
    assert_eq!(t.handle_packet(now, &pkt, |_, _| {}), Ok(None));
    // A buffer too small for the RST writes nothing and the RST stays queued.
    assert_eq!(t.poll_transmit(now, &mut [0u8; 10]), None);
    let mut buf = [0u8; 200];
    let n = t.poll_transmit(now, &mut buf).expect("rst");
    let rst = SegmentRepr::parse(&buf[..n]).expect("valid");
    assert!(rst.flags.rst && rst.flags.ack);
    assert_eq!(rst.ack, 101);
    let mut bad = pkt.clone();
    bad[30] ^= 1;
    assert!(t.handle_packet(now, &bad, |_, _| {}).is_err());
    assert!(t.handle_packet(now, &pkt[..25], |_, _| {}).is_err());
    assert_eq!(t.stats().bad_checksum, 1);
    assert_eq!(t.stats().truncated, 1);
    assert_eq!(t.stats().resets_sent, 1);
}

#[test]
fn backlog_limits_half_open_connections() {
    let mut t = ConnectionTable::new([4; 16], 16);
    t.set_syn_cookies(false);
    t.listen(SERVER, 4791, 2, Config::default());
    let now = Instant::ZERO;
    for i in 0..3 {
        let pkt = raw(
            tuple(i),
            100,
            0,
            TcpFlags {
                syn: true,
                ..TcpFlags::default()
            },
        );
        let _ = t.handle_packet(now, &pkt, |_, _| {});
    }
    assert_eq!(t.len(), 2);
    assert_eq!(t.stats().backlog_drops, 1);
    assert_eq!(t.stats().passive_opens, 2);
}

/// A half-open connection that dies (RST, or its SYN-ACK never acknowledged)
/// gives its slot and backlog place back: it was never handed out, so no
/// caller could `remove` it.
#[test]
fn dead_half_open_connections_free_their_backlog_place() {
    let syn = TcpFlags {
        syn: true,
        ..TcpFlags::default()
    };
    let cfg = Config {
        max_synack_retransmissions: 2,
        ..Config::default()
    };
    let mut t = ConnectionTable::new([5; 16], 16);
    t.listen(SERVER, 4791, 1, cfg);
    let mut now = Instant::ZERO;
    let mut buf = [0u8; 200];

    // RST in SYN-RECEIVED (RFC 9293 3.10.7.4): back to LISTEN.
    let _ = t.handle_packet(now, &raw(tuple(0), 100, 0, syn), |_, _| {});
    assert_eq!(t.len(), 1);
    while t.poll_transmit(now, &mut buf).is_some() {}
    let rst = TcpFlags {
        rst: true,
        ..TcpFlags::default()
    };
    assert_eq!(
        t.handle_packet(now, &raw(tuple(0), 101, 0, rst), |_, _| {}),
        Ok(None)
    );
    assert_eq!(t.len(), 0, "reset half-open connection still in the table");

    // The backlog place is free again; this one's SYN-ACK is never answered.
    let _ = t.handle_packet(now, &raw(tuple(1), 100, 0, syn), |_, _| {});
    assert_eq!(t.len(), 1);
    assert_eq!(t.stats().syncookies_sent, 0, "a place, not a cookie");
    while t.poll_transmit(now, &mut buf).is_some() {}
    let mut rounds = 0;
    while let Some(d) = t.poll_timeout() {
        now = d;
        t.handle_timeout(now);
        while t.poll_transmit(now, &mut buf).is_some() {}
        rounds += 1;
        assert!(rounds < 100, "timers never ended");
    }
    assert_eq!(
        t.len(),
        0,
        "timed-out half-open connection still in the table"
    );
    let _ = t.handle_packet(now, &raw(tuple(2), 100, 0, syn), |_, _| {});
    assert_eq!(t.len(), 1);
    assert_eq!(t.stats().syncookies_sent, 0, "a place, not a cookie");
    assert_eq!(t.stats().passive_opens, 3);
}

/// A segment of a connection that is gone is answered with a RST, right after segments of
/// the old one were looked up, and when its slot was reused by another connection (the table
/// remembers its last lookup: forgetting it when the map changes is what this checks).
#[test]
fn a_removed_connections_segments_never_reach_its_slots_next_owner() {
    let mut t = ConnectionTable::new([5; 16], 4);
    t.listen(SERVER, 4791, 4, Config::default());
    let now = Instant::ZERO;
    // From client `i`: its SYN (ISN 100), or a bare ACK right after it.
    let seg = |i, syn: bool| {
        let flags = TcpFlags {
            syn,
            ack: !syn,
            ..TcpFlags::default()
        };
        raw(tuple(i), if syn { 100 } else { 101 }, 0, flags)
    };
    let (syn, ack) = (|i| seg(i, true), |i| seg(i, false));
    // The connections as the table names them.
    let seen = |i| {
        let c = tuple(i);
        FourTuple {
            local_addr: c.remote_addr,
            local_port: c.remote_port,
            remote_addr: c.local_addr,
            remote_port: c.local_port,
        }
    };
    let mut buf = [0u8; 200];
    let _ = t.handle_packet(now, &syn(1), |_, _| {});
    while t.poll_transmit(now, &mut buf).is_some() {}
    let old = t.lookup(&seen(1)).expect("half-open connection");
    // Looked up (and remembered) again: a segment the connection refuses with a RST.
    let _ = t.handle_packet(now, &ack(1), |_, _| {});
    while t.poll_transmit(now, &mut buf).is_some() {}
    if t.lookup(&seen(1)).is_some() {
        t.remove(old).expect("removed");
    }
    let rst_for_the_old_tuple = |t: &mut ConnectionTable| {
        assert_eq!(t.handle_packet(now, &ack(1), |_, _| {}), Ok(None));
        let mut buf = [0u8; 200];
        let n = t
            .poll_transmit(now, &mut buf)
            .expect("a RST for the old tuple");
        let rst = SegmentRepr::parse(&buf[..n]).expect("valid");
        assert!(rst.flags.rst, "{rst:?}");
        assert_eq!(rst.dst_port, tuple(1).local_port);
    };
    rst_for_the_old_tuple(&mut t);
    let _ = t.handle_packet(now, &syn(2), |_, _| {});
    while t.poll_transmit(now, &mut buf).is_some() {}
    let new = t.lookup(&seen(2)).expect("the second connection");
    assert_eq!(new.index(), old.index(), "the slot is reused");
    rst_for_the_old_tuple(&mut t);
    assert_eq!(
        t.get(new).map(|c| c.state()),
        Some(State::SynReceived),
        "the new connection untouched"
    );
}

/// RFC 5961 7 and Linux's `tcp_challenge_ack_limit`: SYNs spoofed onto 50 established
/// connections, 50 each within one second, would draw 2,500 challenge ACKs under the
/// per-connection limit alone; the table-wide limit lets out that second's budget (drawn in
/// secret around 1,000, so that nobody can count what others used: RFC 5961 10,
/// CVE-2016-5696) and counts the rest, and each second has a fresh one. The connections stay
/// established.
#[test]
fn the_table_wide_challenge_ack_limit_holds_across_connections() {
    let n = 50;
    let mut clients = ConnectionTable::new([4; 16], n);
    let mut server = ConnectionTable::new([5; 16], n);
    server.listen(Ipv4Addr::UNSPECIFIED, 4791, n, Config::default());
    let now = Instant::from_millis(1);
    for i in 0..n {
        clients
            .connect(Config::default(), tuple(i), now)
            .expect("connect");
    }
    pump(&mut clients, &mut server, now);
    while server.accept(Ipv4Addr::UNSPECIFIED, 4791).is_some() {}
    assert_eq!(server.len(), n);
    let mut buf = [0u8; 2048];
    let syn = TcpFlags {
        syn: true,
        ..TcpFlags::default()
    };
    let mut burst = |server: &mut ConnectionTable, now: Instant| {
        let mut sent = 0;
        for round in 0..50u32 {
            for i in 0..n {
                let _ = server.handle_packet(now, &raw(tuple(i), 1000 + round, 0, syn), |_, _| {});
                while server.poll_transmit(now, &mut buf).is_some() {
                    sent += 1;
                }
            }
        }
        sent
    };
    // Each second's budget is drawn in secret from 500 to 1,499 (the limit, 1,000, times one
    // half to one and a half); 2,500 are asked for each second, fewer than the connections'
    // own limits allow (50 x 100).
    let mut budgets = Vec::new();
    for second in 0..6u64 {
        let limited = server.stats().challenge_acks_limited;
        let sent = burst(&mut server, now + core::time::Duration::from_secs(second));
        assert!((500..1500).contains(&sent), "second {second}: {sent}");
        assert_eq!(
            server.stats().challenge_acks_limited - limited,
            2500 - sent as u64
        );
        budgets.push(sent);
    }
    budgets.dedup();
    assert!(
        budgets.len() > 1,
        "the same budget every second: {budgets:?}"
    );
    for i in 0..n {
        let t = tuple(i);
        let server_side = FourTuple {
            local_addr: t.remote_addr,
            local_port: t.remote_port,
            remote_addr: t.local_addr,
            remote_port: t.local_port,
        };
        let id = server.lookup(&server_side).expect("still there");
        assert_eq!(
            server.get_mut(id).expect("live").state(),
            State::Established
        );
    }
}

/// A SYN whose SYN-ACKs are never answered holds its listener's backlog slot about a minute,
/// as Linux's `tcp_synack_retries` (5): six SYN-ACKs (1 + 2 + 4 + 8 + 16 + 32 s apart), then
/// the half-open connection is dropped.
#[test]
fn a_half_open_connection_gives_up_after_five_syn_ack_retransmissions() {
    let mut server = ConnectionTable::new([6; 16], 4);
    server.listen(Ipv4Addr::UNSPECIFIED, 4791, 4, Config::default());
    let start = Instant::from_millis(1);
    let syn = TcpFlags {
        syn: true,
        ..TcpFlags::default()
    };
    let client = tuple(7);
    server
        .handle_packet(start, &raw(client, 1000, 0, syn), |_, _| {})
        .expect("SYN");
    assert_eq!(server.len(), 1, "half-open");
    let mut buf = [0u8; 2048];
    let mut syn_acks = 0;
    let mut now = start;
    let end = start + core::time::Duration::from_secs(120);
    while now < end && !server.is_empty() {
        while server.poll_transmit(now, &mut buf).is_some() {
            syn_acks += 1;
        }
        now = match server.poll_timeout() {
            Some(t) if t > now => t,
            _ => now + core::time::Duration::from_millis(100),
        };
        server.handle_timeout(now);
    }
    assert_eq!(server.len(), 0, "dropped");
    assert_eq!(syn_acks, 6, "the SYN-ACK and five retransmissions");
    let held = now - start;
    assert!(
        held >= core::time::Duration::from_secs(60) && held <= core::time::Duration::from_secs(70),
        "held for {held:?}"
    );
}

/// With the half-open queue full of spoofed SYNs, a real client's SYN gets a SYN cookie
/// (RFC 4987 3.6); its ACK brings the cookie back and makes the connection, with the MSS,
/// window scale, SACK and timestamps the handshake agreed, and data flows both ways. A forged
/// ACK makes nothing and is answered with a RST; a flood of SYNs costs no table entries.
#[test]
fn syn_cookies_when_the_half_open_queue_is_full() {
    let syn = TcpFlags {
        syn: true,
        ..TcpFlags::default()
    };
    let mut server = ConnectionTable::new([6; 16], 64);
    let mut clients = ConnectionTable::new([7; 16], 64);
    server.listen(SERVER, 4791, 2, Config::default());
    let now = Instant::from_millis(5);
    let mut buf = [0u8; 2048];
    // Spoofed SYNs from addresses that never answer fill the half-open queue, then 10,000
    // more get cookies and leave no state behind.
    for i in 0..10_002 {
        let _ = server.handle_packet(now, &raw(tuple(1000 + i), 77, 0, syn), |_, _| {});
        while server.poll_transmit(now, &mut buf).is_some() {}
    }
    assert_eq!(server.len(), 2);
    assert_eq!(server.stats().syncookies_sent, 10_000);

    let cfg = Config {
        tx_mode: TxMode::Records,
        ..Config::default()
    };
    let id = clients.connect(cfg, tuple(1), now).expect("connect");
    pump(&mut clients, &mut server, now);
    assert_eq!(server.stats().syncookies_sent, 10_001);
    assert_eq!(server.stats().syncookies_validated, 1);
    let sid = server
        .accept(SERVER, 4791)
        .expect("the cookie connection is accepted");
    let c = clients.get_mut(id).expect("client");
    assert_eq!(c.state(), State::Established);
    let (c_scales, c_sack, c_ts) = (c.window_scales(), c.sack_enabled(), c.timestamps_enabled());
    c.send_record(b"through a cookie").expect("send");
    let s = server.get_mut(sid).expect("server");
    assert_eq!(s.state(), State::Established);
    assert_eq!(
        s.window_scales(),
        (c_scales.1, c_scales.0),
        "window scales agree"
    );
    assert!(c_sack && s.sack_enabled(), "SACK carried by the cookie");
    assert!(c_ts && s.timestamps_enabled());
    assert_eq!(s.emss(), c.emss(), "MSS carried by the cookie");
    assert_eq!(
        s.rto(),
        Config::default().initial_rto,
        "no SYN-ACK timed out: no 3 s fallback (RFC 6298 5.7)"
    );
    s.send(b"and back").expect("server send");
    pump(&mut clients, &mut server, now);
    let mut got = [0u8; 64];
    let n = server.get_mut(sid).expect("server").recv(&mut got);
    assert_eq!(&got[..n], b"through a cookie");
    let n = clients.get_mut(id).expect("client").recv(&mut got);
    assert_eq!(&got[..n], b"and back");

    // A forged ACK (a guessed cookie) makes nothing and gets a RST.
    let ack = TcpFlags {
        ack: true,
        ..TcpFlags::default()
    };
    let before = server.len();
    let forged = raw(tuple(2), 1000, 0x1234_5678, ack);
    assert_eq!(server.handle_packet(now, &forged, |_, _| {}), Ok(None));
    assert_eq!(server.len(), before);
    assert_eq!(server.stats().syncookies_failed, 1);
    let n = server.poll_transmit(now, &mut buf).expect("rst");
    assert!(SegmentRepr::parse(&buf[..n]).expect("rst").flags.rst);

    // A cookie is good for two to three minutes (the minute it was made and the two after):
    // with cookies still going out (another flood), one four minutes old fails the check.
    let id = clients
        .connect(
            Config {
                tx_mode: TxMode::Records,
                ..Config::default()
            },
            tuple(3),
            now,
        )
        .expect("connect");
    let n = clients.poll_transmit(now, &mut buf).expect("SYN");
    let _ = server.handle_packet(now, &buf[..n], |_, _| {});
    let n = server.poll_transmit(now, &mut buf).expect("cookie SYN-ACK");
    let late = now + std::time::Duration::from_secs(4 * 60);
    let _ = clients.handle_packet(late, &buf[..n], |_, _| {});
    let n = clients.poll_transmit(late, &mut buf).expect("ACK");
    let old_ack = buf[..n].to_vec();
    let before = server.stats().syncookies_validated;
    let _ = server.handle_packet(late, &old_ack, |_, _| {});
    assert_eq!(server.stats().syncookies_validated, before);
    // Not even looked at: the listener sent no cookie in a cookie's lifetime.
    assert_eq!(server.stats().syncookies_failed, 1);
    let _ = server.handle_packet(late, &raw(tuple(5000), 77, 0, syn), |_, _| {});
    while server.poll_transmit(late, &mut buf).is_some() {}
    let _ = server.handle_packet(late, &old_ack, |_, _| {});
    assert_eq!(server.stats().syncookies_validated, before);
    assert_eq!(server.stats().syncookies_failed, 2, "too old a cookie");
    let _ = id;
}

/// A good cookie that finds the listener's accept queue full is dropped without a reply (not
/// reset, as Linux by default): the client, established, sends again, and gets in once the
/// application has accepted.
#[test]
fn a_good_cookie_waits_for_room_in_the_accept_queue() {
    let mut server = ConnectionTable::new([9; 16], 16);
    let mut clients = ConnectionTable::new([10; 16], 16);
    server.listen(SERVER, 4791, 1, Config::default());
    let now = Instant::from_millis(5);
    let cfg = Config {
        tx_mode: TxMode::Records,
        ..Config::default()
    };
    clients
        .connect(cfg.clone(), tuple(1), now)
        .expect("connect");
    pump(&mut clients, &mut server, now);
    // The first connection waits in the accept queue (backlog 1); the second gets a cookie.
    let second = clients.connect(cfg, tuple(2), now).expect("connect");
    pump(&mut clients, &mut server, now);
    assert_eq!(server.stats().syncookies_sent, 1);
    assert_eq!(server.stats().syncookies_deferred, 1);
    assert_eq!(server.stats().resets_sent, 0, "no RST for a good cookie");
    let c = clients.get_mut(second).expect("client");
    assert_eq!(c.state(), State::Established);
    c.send_record(b"after all").expect("send");
    pump(&mut clients, &mut server, now);
    assert_eq!(server.stats().syncookies_deferred, 2, "still no room");
    server.accept(SERVER, 4791).expect("the first connection");
    // The client's retransmission brings the cookie back again.
    let later = now + std::time::Duration::from_secs(2);
    clients.handle_timeout(later);
    pump(&mut clients, &mut server, later);
    assert_eq!(server.stats().syncookies_validated, 1);
    let sid = server
        .accept(SERVER, 4791)
        .expect("the cookie's connection");
    let mut got = [0u8; 64];
    let n = server.get_mut(sid).expect("server").recv(&mut got);
    assert_eq!(&got[..n], b"after all");
    assert_eq!(server.stats().resets_sent, 0);
}

/// A segment to a listening port with neither SYN, ACK nor RST (a bare FIN, a NULL segment)
/// is dropped without a reply (RFC 9293 3.10.7.2); to a closed port it gets a RST.
#[test]
fn a_listener_drops_segments_without_syn_or_ack() {
    let mut server = ConnectionTable::new([11; 16], 16);
    server.listen(SERVER, 4791, 4, Config::default());
    let now = Instant::from_millis(5);
    let fin = TcpFlags {
        fin: true,
        ..TcpFlags::default()
    };
    let mut buf = [0u8; 200];
    for flags in [fin, TcpFlags::default()] {
        assert_eq!(
            server.handle_packet(now, &raw(tuple(1), 5, 0, flags), |_, _| {}),
            Ok(None)
        );
        assert!(server.poll_transmit(now, &mut buf).is_none(), "{flags:?}");
    }
    assert_eq!(server.stats().listen_ignored, 2);
    let mut closed = tuple(1);
    closed.remote_port = 4792;
    let _ = server.handle_packet(now, &raw(closed, 5, 0, fin), |_, _| {});
    assert!(
        server.poll_transmit(now, &mut buf).is_some(),
        "RST from a closed port"
    );
}

/// An ACK for no connection to a listener that sent no SYN cookie lately is not taken for a
/// cookie's return (a guess at one): it gets a RST, and no cookie is checked.
#[test]
fn a_stray_ack_is_no_cookie_guess_without_cookies_sent() {
    let mut server = ConnectionTable::new([8; 16], 8);
    server.listen(SERVER, 4791, 8, Config::default());
    let now = Instant::from_millis(5);
    let ack = TcpFlags {
        ack: true,
        ..TcpFlags::default()
    };
    let stray = raw(tuple(9), 1000, 0x1234_5678, ack);
    assert_eq!(server.handle_packet(now, &stray, |_, _| {}), Ok(None));
    assert_eq!(server.len(), 0);
    assert_eq!(server.stats().syncookies_failed, 0, "checked as a cookie");
    let mut buf = [0u8; 200];
    let n = server.poll_transmit(now, &mut buf).expect("rst");
    assert!(SegmentRepr::parse(&buf[..n]).expect("rst").flags.rst);
}

/// A ping-pong connection with keepalive and a user timeout on moves its earliest deadline
/// between the retransmission timer and those far deadlines every round trip: the table's
/// timer queue still holds one entry per connection (it once kept every superseded deadline
/// until it expired, growing with the connection's lifetime), and the timers still fire.
#[test]
fn moving_deadlines_keep_one_timer_entry_per_connection() {
    let cfg = Config {
        keepalive: Some((
            std::time::Duration::from_secs(60),
            std::time::Duration::from_secs(1),
            3,
        )),
        user_timeout: Some(std::time::Duration::from_secs(30)),
        tx_mode: TxMode::Records,
        ..Config::default()
    };
    let mut client = ConnectionTable::new([1; 16], 4);
    let mut server = ConnectionTable::new([2; 16], 4);
    server.listen(Ipv4Addr::UNSPECIFIED, 4791, 4, cfg.clone());
    let mut now = Instant::from_millis(1);
    let id = client.connect(cfg, tuple(0), now).expect("connect");
    pump(&mut client, &mut server, now);
    let sid = server
        .accept(Ipv4Addr::UNSPECIFIED, 4791)
        .or_else(|| server.accept(SERVER, 4791))
        .expect("accepted");
    let mut buf = [0u8; 64];
    let mut most = 0;
    for i in 0..20_000u64 {
        now = Instant::from_nanos(now.as_nanos() + 10_000);
        let c = client.get_mut(id).expect("client");
        c.send_record(&i.to_be_bytes()).expect("ping");
        pump(&mut client, &mut server, now);
        let s = server.get_mut(sid).expect("server");
        assert_eq!(s.recv(&mut buf), 8, "ping {i}");
        s.send_record(&i.to_be_bytes()).expect("pong");
        pump(&mut client, &mut server, now);
        let c = client.get_mut(id).expect("client");
        assert_eq!(c.recv(&mut buf), 8, "pong {i}");
        client.handle_timeout(now);
        server.handle_timeout(now);
        most = most
            .max(client.timers_pending())
            .max(server.timers_pending());
    }
    assert_eq!(most, 1, "one connection, one timer entry per table");
    // Keepalive still runs: after 60 s idle the client probes and the server answers.
    let idle = Instant::from_nanos(now.as_nanos() + 61_000_000_000);
    assert!(client.poll_timeout().is_some_and(|d| d <= idle));
    client.handle_timeout(idle);
    assert!(
        pump(&mut client, &mut server, idle) >= 2,
        "a probe and its ACK"
    );
    assert_eq!(
        client.get_mut(id).expect("client").state(),
        State::Established
    );
}

/// A client table and a listening server table with one connection between them, established
/// at `now` (default configurations): the tables and the connection's ids, client's first.
fn connected_tables(now: Instant) -> (ConnectionTable, ConnectionTable, ConnId, ConnId) {
    let mut client = ConnectionTable::new([5; 16], 4);
    let mut server = ConnectionTable::new([6; 16], 4);
    server.listen(Ipv4Addr::UNSPECIFIED, 4791, 4, Config::default());
    let id = client
        .connect(Config::default(), tuple(0), now)
        .expect("connect");
    pump(&mut client, &mut server, now);
    let sid = server
        .accept(Ipv4Addr::UNSPECIFIED, 4791)
        .expect("accepted");
    (client, server, id, sid)
}

/// What held a sender back is timed through the table as through a lone connection (RFC 4898
/// 4, tcpEStatsPerfSndLimTimeSnd): a message sent whole at once, its acknowledgement (the
/// reply) 1 ms later: 1 ms limited by the sender, though the table takes the connection off
/// its ready queue with the message's segment (no later offer finds it with data in flight
/// and nothing to send).
#[test]
fn a_lone_message_is_timed_as_sender_limited_until_its_ack() {
    let t0 = Instant::from_millis(1);
    let (mut client, mut server, id, sid) = connected_tables(t0);
    let mut buf = [0u8; 2048];
    client
        .get_mut(id)
        .expect("live")
        .send(b"ping")
        .expect("send");
    let n = client.poll_transmit(t0, &mut buf).expect("the ping");
    assert_eq!(client.poll_transmit(t0, &mut buf), None, "one segment");
    let _ = server.handle_packet(t0, &buf[..n], |_, _| {});
    // The reply carries the acknowledgement, 1 ms later.
    let t1 = t0 + std::time::Duration::from_millis(1);
    server
        .get_mut(sid)
        .expect("live")
        .send(b"pong")
        .expect("send");
    let n = server.poll_transmit(t1, &mut buf).expect("the pong");
    let _ = client.handle_packet(t1, &buf[..n], |_, _| {});
    // The next offer finds nothing in flight: the sender-limited stretch ends there.
    while client.poll_transmit(t1, &mut buf).is_some() {}
    let st = client.get(id).expect("live").stats();
    assert_eq!(st.snd_lim_time_sender_ns, 1_000_000, "{st:?}");
    assert_eq!(
        st.snd_lim_time_rwin_ns + st.snd_lim_time_cwnd_ns,
        0,
        "{st:?}"
    );
}

/// An abort's RST offered a buffer too small for it stays first in the table's queue: the next
/// call with a real buffer sends it (an aborted connection has no timer left to offer it again).
#[test]
fn an_aborted_connections_rst_waits_for_a_buffer_that_holds_it() {
    let now = Instant::from_millis(1);
    let (mut client, _server, id, _) = connected_tables(now);
    client.get_mut(id).expect("live").abort();
    assert_eq!(client.poll_transmit(now, &mut [0u8; 10]), None);
    let mut buf = [0u8; 200];
    let n = client.poll_transmit(now, &mut buf).expect("the RST");
    let rst = SegmentRepr::parse(&buf[..n]).expect("valid");
    assert!(rst.flags.rst, "{rst:?}");
    assert_eq!(client.poll_transmit(now, &mut buf), None, "once");
}

/// RFC 5961 7 with the table-wide limit spent: a spoofed SYN's challenge ACK is withdrawn, but
/// the duplicate ACK an out-of-order segment made due just before it in the same batch still
/// goes out (RFC 5681 4.2), or the sender's fast retransmit would wait for its RTO.
#[test]
fn a_withdrawn_challenge_ack_keeps_the_ack_an_earlier_segment_made_due() {
    let now = Instant::from_millis(1);
    let (mut client, mut server, id, _) = connected_tables(now);
    server.set_challenge_ack_limit(0);
    client
        .get_mut(id)
        .expect("live")
        .send(&[7u8; 2000])
        .expect("send");
    let mut buf = [0u8; 2048];
    client.poll_transmit(now, &mut buf).expect("first segment");
    let n = client.poll_transmit(now, &mut buf).expect("second segment");
    // The first segment is lost: the second arrives out of order.
    let _ = server.handle_packet(now, &buf[..n], |_, _| {});
    let syn = TcpFlags {
        syn: true,
        ..TcpFlags::default()
    };
    let _ = server.handle_packet(now, &raw(tuple(0), 12345, 0, syn), |_, _| {});
    assert_eq!(server.stats().challenge_acks_limited, 1, "the limit held");
    let n = server
        .poll_transmit(now, &mut buf)
        .expect("the duplicate ACK still goes out");
    let dupack = SegmentRepr::parse(&buf[..n]).expect("valid");
    assert!(dupack.flags.ack && dupack.payload.is_empty(), "{dupack:?}");
    assert!(
        !dupack.options.sack_blocks().is_empty(),
        "it reports the out-of-order data: {dupack:?}"
    );
    assert_eq!(
        server.poll_transmit(now, &mut buf),
        None,
        "one ACK, no challenge"
    );
}

/// `Config::tos`: every segment carries its sender's DSCP with the ECN field clear: a client's
/// SYN, data, ACKs and FIN; a listener's SYN-ACK, a SYN cookie's included, and what the
/// connections it accepted send. A reset for a segment no connection owns takes that
/// segment's DSCP.
#[test]
fn each_segment_carries_its_senders_tos() {
    const CLIENT_TOS: u8 = 0x48; // DSCP 18 (AF21)
    const SERVER_TOS: u8 = 0xb9; // DSCP 46 (EF) with both ECN bits, which must not be sent
    let mut client = ConnectionTable::new([8; 16], 8);
    let mut server = ConnectionTable::new([9; 16], 8);
    // A backlog of one: the second connection's SYN-ACK is a cookie.
    let listener = Config {
        tos: SERVER_TOS,
        ..Config::default()
    };
    server.listen(SERVER, 4791, 1, listener);
    let cfg = Config {
        tos: CLIENT_TOS,
        tx_mode: TxMode::Records,
        ..Config::default()
    };
    let now = Instant::from_millis(1);
    // (sender, TOS octet, flags) of every segment either table sent.
    let mut seen: Vec<(Ipv4Addr, u8, TcpFlags)> = Vec::new();
    let mut exchange = |client: &mut ConnectionTable, server: &mut ConnectionTable| {
        let mut buf = [0u8; 2048];
        for round in 0.. {
            assert!(round < SETTLE_ROUNDS, "the tables did not settle");
            let mut moved = false;
            for client_sends in [true, false] {
                let (from, to) = if client_sends {
                    (&mut *client, &mut *server)
                } else {
                    (&mut *server, &mut *client)
                };
                while let Some(n) = from.poll_transmit(now, &mut buf) {
                    let s = SegmentRepr::parse(&buf[..n]).expect("our own segment parses");
                    seen.push((s.src_addr, s.tos, s.flags));
                    let _ = to.handle_packet(now, &buf[..n], |_, _| {});
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
    };
    let first = client.connect(cfg.clone(), tuple(0), now).expect("connect");
    exchange(&mut client, &mut server);
    let mut accepted = vec![server.accept(SERVER, 4791).expect("the first is accepted")];
    // A SYN that is never answered fills the half-open queue (its SYN-ACK goes nowhere).
    let syn = TcpFlags {
        syn: true,
        ..TcpFlags::default()
    };
    let _ = server.handle_packet(now, &raw(tuple(6), 1, 0, syn), |_, _| {});
    let mut buf = [0u8; 2048];
    let n = server.poll_transmit(now, &mut buf).expect("a SYN-ACK");
    let s = SegmentRepr::parse(&buf[..n]).expect("SYN-ACK");
    assert_eq!((s.tos, s.flags.syn), (SERVER_TOS & !3, true));
    let second = client.connect(cfg.clone(), tuple(1), now).expect("connect");
    exchange(&mut client, &mut server);
    let ids = [first, second];
    assert_eq!(
        server.stats().syncookies_validated,
        1,
        "the second was a cookie"
    );
    while let Some(sid) = server.accept(SERVER, 4791) {
        accepted.push(sid);
    }
    assert_eq!(accepted.len(), 2);
    for (&id, &sid) in ids.iter().zip(&accepted) {
        client
            .get_mut(id)
            .expect("client")
            .send_record(&[7; 3000])
            .expect("send");
        server
            .get_mut(sid)
            .expect("server")
            .send(&[9; 3000])
            .expect("send");
        exchange(&mut client, &mut server);
        client.get_mut(id).expect("client").close();
        exchange(&mut client, &mut server);
    }
    for (addr, tos, flags) in &seen {
        let want = if *addr == SERVER {
            SERVER_TOS & !3
        } else {
            CLIENT_TOS
        };
        assert_eq!(*tos, want, "{addr}: a segment with flags {flags:?}");
    }
    let (from_server, from_clients): (Vec<&(Ipv4Addr, u8, TcpFlags)>, Vec<_>) =
        seen.iter().partition(|s| s.0 == SERVER);
    assert!(from_server.len() >= 8 && from_clients.len() >= 8);
    assert_eq!(from_server.iter().filter(|s| s.2.syn && s.2.ack).count(), 2);
    assert_eq!(from_clients.iter().filter(|s| s.2.syn).count(), 2);
    assert!(from_clients.iter().any(|s| s.2.fin));

    // A SYN to a port nobody listens on: its reset carries the SYN's DSCP.
    let stray = tuple(5);
    let stray_syn = raw_with_tos(
        FourTuple {
            remote_port: 4792,
            ..stray
        },
        1,
        0,
        syn,
        0x2b,
    );
    let _ = server.handle_packet(now, &stray_syn, |_, _| {});
    let n = server.poll_transmit(now, &mut buf).expect("a reset");
    let rst = SegmentRepr::parse(&buf[..n]).expect("reset");
    assert!(rst.flags.rst);
    assert_eq!(rst.tos, 0x28);
}

/// A listener that stops (RFC 9293 3.10.4, CLOSE in LISTEN): a connection it accepted lives
/// on; one established but not yet accepted and one half-open are reset (their RSTs sent, then
/// their slots freed); a new SYN meets no connection and gets a RST; the port can be listened
/// on again.
#[test]
fn a_listener_that_stops_resets_what_nobody_accepted() {
    let now = Instant::from_millis(1);
    let (mut client, mut server, cid, sid) = connected_tables(now);
    // A second connection, established and waiting in the accept queue.
    let waiting = client
        .connect(Config::default(), tuple(1), now)
        .expect("connect");
    pump(&mut client, &mut server, now);
    // A third, half-open: its SYN reaches the server, whose SYN-ACK is held back.
    let syn = TcpFlags {
        syn: true,
        ..TcpFlags::default()
    };
    let mut half = tuple(2);
    half.local_addr = Ipv4Addr::new(10, 9, 9, 9);
    let _ = server.handle_packet(now, &raw(half, 500, 0, syn), |_, _| {});
    assert_eq!(server.len(), 3);

    assert!(server.unlisten(Ipv4Addr::UNSPECIFIED, 4791));
    assert!(
        !server.unlisten(Ipv4Addr::UNSPECIFIED, 4791),
        "stopped twice"
    );
    let mut buf = [0u8; 200];
    let mut rsts = 0;
    while let Some(n) = server.poll_transmit(now, &mut buf) {
        let seg = SegmentRepr::parse(&buf[..n]).expect("segment");
        rsts += usize::from(seg.flags.rst);
    }
    assert_eq!(rsts, 2, "the unaccepted connections are reset");
    assert_eq!(server.len(), 1, "only the accepted connection is left");
    assert_eq!(server.get(sid).map(|c| c.state()), Some(State::Established));
    assert!(server.accept(Ipv4Addr::UNSPECIFIED, 4791).is_none());
    // The accepted connection still carries data.
    client
        .get_mut(cid)
        .expect("client")
        .send(b"still here")
        .expect("send");
    pump(&mut client, &mut server, now);
    assert_eq!(client.get(cid).map(|c| c.state()), Some(State::Established));
    let _ = waiting;

    // A new SYN: no listener, a RST.
    let resets = server.stats().resets_sent;
    let mut late = tuple(3);
    late.local_addr = Ipv4Addr::new(10, 9, 9, 8);
    let _ = server.handle_packet(now, &raw(late, 700, 0, syn), |_, _| {});
    while server.poll_transmit(now, &mut buf).is_some() {}
    assert_eq!(server.len(), 1);
    assert_eq!(server.stats().resets_sent, resets + 1);

    // Listening again takes connections again.
    server.listen(Ipv4Addr::UNSPECIFIED, 4791, 4, Config::default());
    let again = client
        .connect(Config::default(), tuple(3), now)
        .expect("connect");
    pump(&mut client, &mut server, now);
    assert!(server.accept(Ipv4Addr::UNSPECIFIED, 4791).is_some());
    assert_eq!(
        client.get(again).map(|c| c.state()),
        Some(State::Established)
    );
}

/// [`connected_tables`] whose server closed first: its connection is in TIME-WAIT, the
/// client's is gone (removed from its table). The tables and the server's connection.
fn server_in_time_wait(now: Instant) -> (ConnectionTable, ConnectionTable, ConnId) {
    let (mut client, mut server, id, sid) = connected_tables(now);
    server.get_mut(sid).expect("live").close();
    pump(&mut client, &mut server, now);
    client.get_mut(id).expect("live").close();
    pump(&mut client, &mut server, now);
    assert_eq!(server.get(sid).expect("kept").state(), State::TimeWait);
    assert!(client.remove(id).is_some());
    (client, server, sid)
}

/// A newer SYN for a TIME-WAIT 4-tuple while its listener's backlog is full: TIME-WAIT stays
/// (no new incarnation could be made at once, and a cookie's ISN would ignore the old
/// sequence space), and the SYN is answered as before (a challenge ACK).
#[test]
fn time_wait_stays_when_the_listener_has_no_room() {
    let t0 = Instant::from_millis(1);
    let (_client, mut server, sid) = server_in_time_wait(t0);
    let syn = TcpFlags {
        syn: true,
        ..TcpFlags::default()
    };
    // Four half-open connections fill the backlog of 4.
    for i in 1..=4 {
        let _ = server.handle_packet(t0, &raw(tuple(i), 1000, 0, syn), |_, _| {});
    }
    let later = server
        .get(sid)
        .expect("kept")
        .rcv_nxt()
        .wrapping_add(100_000);
    let _ = server.handle_packet(t0, &raw(tuple(0), later, 0, syn), |_, _| {});
    assert_eq!(server.get(sid).expect("kept").state(), State::TimeWait);
    assert_eq!(server.stats().time_wait_reused, 0);
    assert_eq!(
        server.lookup(&server.get(sid).expect("kept").four_tuple()),
        Some(sid)
    );
}

/// RFC 6191: a SYN for a 4-tuple whose previous incarnation is in TIME-WAIT at a listener
/// opens a new connection at once when it is newer (timestamp, or sequence number beyond
/// RCV.NXT); the old incarnation is closed, and its SYN-ACK starts above every sequence
/// number the old one sent. A SYN that is not newer leaves TIME-WAIT alone.
#[test]
fn a_newer_syn_ends_time_wait_and_opens_a_new_incarnation() {
    let t0 = Instant::from_millis(1);
    let (mut client, mut server, sid) = server_in_time_wait(t0);
    let old_snd_nxt = server.get(sid).expect("kept").snd_nxt();
    let old_rcv_nxt = server.get(sid).expect("kept").rcv_nxt();

    // An old SYN (no timestamp, sequence number not beyond RCV.NXT): TIME-WAIT stays.
    let syn = TcpFlags {
        syn: true,
        ..TcpFlags::default()
    };
    let stale = raw(tuple(0), old_rcv_nxt.wrapping_sub(10), 0, syn);
    let _ = server.handle_packet(t0, &stale, |_, _| {});
    assert_eq!(server.get(sid).expect("kept").state(), State::TimeWait);
    assert_eq!(server.stats().time_wait_reused, 0);

    // The client connects again from the same port a second later.
    let t1 = t0 + std::time::Duration::from_secs(1);
    let id2 = client
        .connect(Config::default(), tuple(0), t1)
        .expect("connect again");
    let mut buf = [0u8; 2048];
    let n = client.poll_transmit(t1, &mut buf).expect("the SYN");
    let _ = server.handle_packet(t1, &buf[..n], |_, _| {});
    assert_eq!(server.stats().time_wait_reused, 1);
    assert_eq!(
        server.get(sid).map(|c| c.state()),
        Some(State::Closed),
        "the old incarnation is closed, for its owner to reap"
    );
    let n = server.poll_transmit(t1, &mut buf).expect("the SYN-ACK");
    let syn_ack = SegmentRepr::parse(&buf[..n]).expect("valid");
    assert!(syn_ack.flags.syn && syn_ack.flags.ack, "{syn_ack:?}");
    assert_eq!(syn_ack.seq, old_snd_nxt.wrapping_add(65_537));
    let _ = client.handle_packet(t1, &buf[..n], |_, _| {});
    pump(&mut client, &mut server, t1);
    let sid2 = server
        .accept(Ipv4Addr::UNSPECIFIED, 4791)
        .expect("the new incarnation is accepted");
    assert_ne!(sid2, sid);
    assert_eq!(server.get(sid2).expect("live").state(), State::Established);
    assert_eq!(client.get(id2).expect("live").state(), State::Established);
    assert!(server.remove(sid).is_some(), "the old one is reaped apart");
    assert_eq!(server.get(sid2).expect("live").state(), State::Established);
    assert_eq!(
        server.lookup(&server.get(sid2).expect("live").four_tuple()),
        Some(sid2)
    );
}

/// A peer that opens and closes connections in a loop (each ends with our FIN first, as a
/// failed MPA startup does) left each in TIME-WAIT for 60 s: eight of them filled a table of
/// eight and every new connection was refused. At most a quarter of the table lingers (in
/// TIME-WAIT, or in FIN-WAIT-2 once orphaned); beyond it the oldest ends (Linux's
/// `tcp_max_tw_buckets`), so each of 40 connections in a row is accepted.
#[test]
fn lingering_connections_never_fill_the_table() {
    let t0 = Instant::from_millis(1);
    let mut clients = ConnectionTable::new([1; 16], 64);
    let mut server = ConnectionTable::new([2; 16], 8);
    server.listen(Ipv4Addr::UNSPECIFIED, 4791, 8, Config::default());
    let mut accepted = Vec::new();
    for i in 0..40 {
        let id = clients
            .connect(Config::default(), tuple(i), t0)
            .expect("connect");
        pump(&mut clients, &mut server, t0);
        let sid = server
            .accept(Ipv4Addr::UNSPECIFIED, 4791)
            .unwrap_or_else(|| panic!("connection {i} not accepted: {:?}", server.stats()));
        accepted.push(sid);
        server.get_mut(sid).expect("live").close();
        pump(&mut clients, &mut server, t0);
        clients.get_mut(id).expect("live").close();
        pump(&mut clients, &mut server, t0);
        assert!(clients.remove(id).is_some());
        // The owner reaps what closed.
        accepted.retain(|&s| {
            let closed = server.get(s).is_some_and(|c| c.state() == State::Closed);
            if closed {
                server.remove(s);
            }
            !closed
        });
    }
    let lingering = accepted
        .iter()
        .filter(|&&s| server.get(s).is_some_and(|c| c.state() == State::TimeWait))
        .count();
    assert_eq!(lingering, 2, "a quarter of the table in TIME-WAIT");
    assert_eq!(server.stats().lingering_ended, 38);
    assert_eq!(server.stats().table_full_drops, 0);
}

/// A server table of 8 (so at most 2 connections linger) and a client table, the listener on
/// port 4791; `connect(i)` opens client connection `i` and returns both ends' ids.
struct Lingering {
    clients: ConnectionTable,
    server: ConnectionTable,
    now: Instant,
}

impl Lingering {
    fn new() -> Self {
        let mut server = ConnectionTable::new([2; 16], 8);
        server.listen(Ipv4Addr::UNSPECIFIED, 4791, 8, Config::default());
        Lingering {
            clients: ConnectionTable::new([1; 16], 64),
            server,
            now: Instant::from_millis(1),
        }
    }

    fn connect(&mut self, i: usize) -> (ConnId, ConnId) {
        let id = self
            .clients
            .connect(Config::default(), tuple(i), self.now)
            .expect("connect");
        self.pump();
        let sid = self
            .server
            .accept(Ipv4Addr::UNSPECIFIED, 4791)
            .expect("accepted");
        (id, sid)
    }

    fn pump(&mut self) {
        pump(&mut self.clients, &mut self.server, self.now);
    }

    fn state(&self, sid: ConnId) -> Option<State> {
        self.server.get(sid).map(|c| c.state())
    }

    /// Connection `i`, closed by the server first: its end in TIME-WAIT, the client's gone.
    fn close_into_time_wait(&mut self, i: usize) -> ConnId {
        let (client, server) = self.connect(i);
        self.server.get_mut(server).expect("live").close_orphaned();
        self.pump();
        self.clients.get_mut(client).expect("live").close();
        self.pump();
        assert_eq!(self.state(server), Some(State::TimeWait));
        assert!(self.clients.remove(client).is_some());
        server
    }
}

/// helper-83's review: the limit counted queue entries, not connections, so entries of
/// connections that had stopped lingering (reset, removed) ended a live one early; and a
/// half-closed connection whose application still reads (FIN-WAIT-2 after `close`, not
/// `close_orphaned`) was ended as if it only lingered. Now only what lingers counts, and
/// only what lingers is ended.
#[test]
fn the_lingering_limit_counts_and_ends_only_what_lingers() {
    let mut t = Lingering::new();
    // Half-closed, still reading: FIN-WAIT-2, not lingering.
    let (_hc, half) = t.connect(0);
    t.server.get_mut(half).expect("live").close();
    t.pump();
    assert_eq!(t.state(half), Some(State::FinWait2));
    // A: TIME-WAIT.
    let a = t.close_into_time_wait(1);
    // B: orphaned FIN-WAIT-2 (lingers), then reset by its peer and reaped.
    let (b_client, b) = t.connect(2);
    t.server.get_mut(b).expect("live").close_orphaned();
    t.pump();
    assert_eq!(t.state(b), Some(State::FinWait2));
    t.clients.get_mut(b_client).expect("live").abort();
    t.pump();
    assert_eq!(t.state(b), Some(State::Closed));
    assert!(t.server.remove(b).is_some());
    // C: TIME-WAIT. A and C linger: within the limit of 2.
    let c = t.close_into_time_wait(3);
    assert_eq!(
        t.state(a),
        Some(State::TimeWait),
        "A ended for a dead entry"
    );
    assert_eq!(t.server.stats().lingering_ended, 0);
    // D: a third one lingering ends the oldest, A; the half-closed one is left alone.
    t.close_into_time_wait(4);
    assert_eq!(t.state(a), Some(State::Closed));
    assert_eq!(t.state(c), Some(State::TimeWait));
    assert_eq!(t.state(half), Some(State::FinWait2));
    assert_eq!(t.server.stats().lingering_ended, 1);
}

/// helper-84's review: a TIME-WAIT connection that a newer SYN ends (RFC 6191) stayed counted
/// as lingering until its owner reaped it, so the next connection to linger could end a live
/// one early.
#[test]
fn a_time_wait_a_newer_syn_ends_stops_counting_at_once() {
    let mut t = Lingering::new();
    let a = t.close_into_time_wait(0);
    let b = t.close_into_time_wait(1);
    // B's peer connects again from the same port a second later: B's TIME-WAIT ends.
    t.now += std::time::Duration::from_secs(1);
    let (_again, b2) = t.connect(1);
    assert_eq!(t.state(b), Some(State::Closed));
    assert_ne!(b, b2);
    let c = t.close_into_time_wait(2);
    assert_eq!(
        t.state(a),
        Some(State::TimeWait),
        "A ended for B, which lingers no more"
    );
    assert_eq!(t.state(c), Some(State::TimeWait));
    assert_eq!(t.server.stats().lingering_ended, 0);
    assert_eq!(t.server.stats().time_wait_reused, 1);
}
