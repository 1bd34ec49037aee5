//! The steering program on the veth test bed (`scripts/netns.sh`): namespaces `iwa` (program
//! on `iwa0`, 10.77.0.1) and `iwb` (peer, 10.77.0.2).
//!
//! Needs root. Without root (or when the bed cannot be made) each test prints
//! `SKIPPED: <why>` and passes, except under `CI=true`, where it fails with the reason.
//! Tests serialise on a file lock, bring the bed up fresh and always take it down.

mod common;
use common::bed_or_skip;

use std::{
    io,
    net::SocketAddrV4,
    thread,
    time::{Duration, Instant},
};

use common::{
    connect, features, ifindex, in_ns, link_details, parse_tcp, sh, tcp_out_rsts, xsk::Xsk, TcpSeg,
    ADDR_A, ADDR_B, DEV_A, DEV_B, NS_A, NS_B, QUEUES, TCP_ACK, TCP_SYN,
};
use xdp_prog::{
    ActiveMode, AttachMode, Counters, FourTuple, SteeringProgram, XdpError, DEFAULT_FLOWS,
};

/// How long a connect to a steered port waits (the SYN and one retransmission).
const STEERED_CONNECT_WAIT: Duration = Duration::from_millis(1300);

/// Loads the program and attaches it to `iwa0` (call inside `iwa`), checking the mode.
fn attach(mode: AttachMode, expect: ActiveMode) -> SteeringProgram {
    let mut prog = SteeringProgram::load(false).expect("load");
    let active = prog.attach(DEV_A, mode).expect("attach to iwa0");
    assert_eq!(active, expect, "attach({mode}) ran in {active} mode");
    assert_eq!(prog.attached(), Some((DEV_A, expect)));
    let details = link_details(NS_A, DEV_A);
    // `ip` prints the mode after the MTU: "mtu 1500 xdp qdisc" / "mtu 1500 xdpgeneric qdisc".
    let tag = match expect {
        ActiveMode::Driver => "xdp",
        ActiveMode::Generic => "xdpgeneric",
    };
    assert!(
        details.split_whitespace().any(|w| w == tag) && details.contains("prog/xdp id"),
        "`{tag}` missing from:\n{details}"
    );
    prog
}

/// One AF_XDP socket per RX queue of `iwa0`, each put in the `xsks` map (call inside `iwa`).
fn bind_all_queues(prog: &mut SteeringProgram) -> Vec<Xsk> {
    let idx = ifindex(DEV_A);
    (0..QUEUES)
        .map(|q| {
            let xsk =
                Xsk::new(idx, q).unwrap_or_else(|e| panic!("AF_XDP socket on queue {q}: {e}"));
            prog.bind_socket(q, xsk.fd()).expect("bind_socket");
            xsk
        })
        .collect()
}

/// All TCP segments that reach the sockets within `wait`, stopping early once `want` matches.
fn collect(xsks: &mut [Xsk], wait: Duration, want: impl Fn(&TcpSeg) -> bool) -> Vec<(u32, TcpSeg)> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    loop {
        for x in xsks.iter_mut() {
            for f in x.drain() {
                if let Some(seg) = parse_tcp(&f.data) {
                    got.push((f.queue, seg));
                }
            }
        }
        if got.iter().any(|(_, s)| want(s)) || Instant::now() >= deadline {
            return got;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn is_syn_to(port: u16, sport: Option<u16>) -> impl Fn(&TcpSeg) -> bool {
    move |s| {
        s.saddr == ADDR_B
            && s.daddr == ADDR_A
            && s.dport == port
            && sport.is_none_or(|p| s.sport == p)
            && s.flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }
}

/// (a) A SYN to a steered port lands in an AF_XDP RX ring; the kernel in `iwa` never sees
/// it (no RST, the connect from `iwb` times out); the counters say "redirected".
fn steered_port_case(mode: AttachMode, expect: ActiveMode) {
    let _bed = bed_or_skip!();
    const PORT: u16 = 17001;
    in_ns(NS_A, || {
        let mut prog = attach(mode, expect);
        prog.steer_port(ADDR_A, PORT).expect("steer_port");
        let mut xsks = bind_all_queues(&mut prog);
        let rsts_before = tcp_out_rsts();
        let before = prog.counters().expect("counters");

        let outcome = in_ns(NS_B, || {
            connect(
                ADDR_B,
                0,
                SocketAddrV4::new(ADDR_A, PORT),
                STEERED_CONNECT_WAIT,
            )
        });
        let err = outcome.expect_err("connect to a steered port must not complete");
        assert_eq!(
            err.kind(),
            io::ErrorKind::TimedOut,
            "expected a timeout (SYN swallowed by AF_XDP), got {err}"
        );

        let segs = collect(&mut xsks, Duration::from_secs(1), is_syn_to(PORT, None));
        let syns: Vec<_> = segs
            .iter()
            .filter(|(_, s)| is_syn_to(PORT, None)(s))
            .collect();
        assert!(!syns.is_empty(), "no SYN in any RX ring; got {segs:?}");
        let d = prog.counters().expect("counters").since(&before);
        assert!(
            d.redirected >= syns.len() as u64,
            "redirected {} < SYNs seen {}: {d:?}",
            d.redirected,
            syns.len()
        );
        assert_eq!(d.no_socket, 0, "{d:?}");
        assert_eq!(tcp_out_rsts(), rsts_before, "kernel in iwa sent a RST");
        println!(
            "{expect} mode: {} SYN(s) in RX ring(s) of queue(s) {:?}; counters {d:?}",
            syns.len(),
            syns.iter().map(|(q, _)| *q).collect::<Vec<_>>()
        );
    });
}

#[test]
fn a_steered_port_syn_reaches_af_xdp_ring_driver_mode() {
    steered_port_case(AttachMode::Driver, ActiveMode::Driver);
}

#[test]
fn a_steered_port_syn_reaches_af_xdp_ring_generic_mode() {
    steered_port_case(AttachMode::Generic, ActiveMode::Generic);
}

/// `load_sized` makes room for more connections than the default (an engine of several
/// shards sizes the map for all of theirs): the default map refuses the flow past
/// `DEFAULT_FLOWS` with `MapFull`, the sized one takes it.
#[test]
fn the_flow_map_is_sized_for_the_connections_asked_for() {
    let _bed = bed_or_skip!();
    let flow = |n: u32| FourTuple {
        saddr: std::net::Ipv4Addr::from(0x0a00_0000 + n),
        daddr: ADDR_A,
        sport: 40000,
        dport: 17009,
    };
    let mut default = SteeringProgram::load(false).expect("load");
    for n in 0..DEFAULT_FLOWS {
        default
            .steer_flow(flow(n))
            .expect("a flow within the default size");
    }
    assert!(
        matches!(
            default.steer_flow(flow(DEFAULT_FLOWS)),
            Err(XdpError::MapFull(_))
        ),
        "the default map took more than DEFAULT_FLOWS"
    );
    drop(default);
    let mut sized = SteeringProgram::load_sized(false, DEFAULT_FLOWS + 1000).expect("load");
    for n in 0..=DEFAULT_FLOWS {
        sized
            .steer_flow(flow(n))
            .expect("a flow within the asked-for size");
    }
}

/// (a) Flow steering matches the exact 4-tuple: a SYN from the steered source port is
/// redirected, one from another source port to the same destination gets the kernel's RST.
/// Unsteering gives the flow back to the kernel.
#[test]
fn a_steered_flow_matches_only_its_four_tuple() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 17002;
    const SPORT: u16 = 40001;
    in_ns(NS_A, || {
        let mut prog = attach(AttachMode::Auto, ActiveMode::Driver);
        let flow = FourTuple {
            saddr: ADDR_B,
            daddr: ADDR_A,
            sport: SPORT,
            dport: PORT,
        };
        prog.steer_flow(flow).expect("steer_flow");
        let mut xsks = bind_all_queues(&mut prog);
        let rsts_before = tcp_out_rsts();

        let target = SocketAddrV4::new(ADDR_A, PORT);
        let steered = in_ns(NS_B, || {
            connect(ADDR_B, SPORT, target, STEERED_CONNECT_WAIT)
        });
        assert_eq!(
            steered.expect_err("steered flow").kind(),
            io::ErrorKind::TimedOut
        );
        let segs = collect(
            &mut xsks,
            Duration::from_secs(1),
            is_syn_to(PORT, Some(SPORT)),
        );
        assert!(
            segs.iter().any(|(_, s)| is_syn_to(PORT, Some(SPORT))(s)),
            "no SYN of the steered flow in the RX rings: {segs:?}"
        );
        assert_eq!(
            tcp_out_rsts(),
            rsts_before,
            "kernel answered the steered flow"
        );

        let other = in_ns(NS_B, || {
            connect(ADDR_B, SPORT + 1, target, Duration::from_secs(2))
        });
        assert_eq!(
            other.expect_err("nobody listens").kind(),
            io::ErrorKind::ConnectionRefused,
            "another source port must reach the kernel"
        );
        assert!(
            tcp_out_rsts() > rsts_before,
            "no RST counted for the unsteered flow"
        );

        assert!(prog.unsteer_flow(flow).expect("unsteer_flow"));
        assert!(!prog.unsteer_flow(flow).expect("unsteer_flow again"));
        let back = in_ns(NS_B, || {
            connect(ADDR_B, SPORT, target, Duration::from_secs(2))
        });
        assert_eq!(
            back.expect_err("nobody listens").kind(),
            io::ErrorKind::ConnectionRefused,
            "an unsteered flow goes back to the kernel"
        );
        assert!(
            prog.unbind_socket(0).expect("unbind"),
            "queue 0 had a socket"
        );
        assert!(!prog.unbind_socket(0).expect("unbind again"));
        // Nothing of the unsteered attempts reached the sockets.
        let late = collect(&mut xsks, Duration::from_millis(100), |_| false);
        assert!(
            late.iter()
                .all(|(_, s)| s.sport == SPORT && s.dport == PORT),
            "unsteered segments reached AF_XDP: {late:?}"
        );
    });
}

/// (b) With the program attached and another port steered (sockets bound), a SYN to an
/// unsteered port gets the kernel's RST: connect fails fast with ECONNREFUSED.
#[test]
fn b_unsteered_port_gets_kernel_rst() {
    let _bed = bed_or_skip!();
    in_ns(NS_A, || {
        let mut prog = attach(AttachMode::Driver, ActiveMode::Driver);
        prog.steer_port(ADDR_A, 17003).expect("steer_port");
        let mut xsks = bind_all_queues(&mut prog);
        let rsts_before = tcp_out_rsts();
        let before = prog.counters().expect("counters");

        let t0 = Instant::now();
        let r = in_ns(NS_B, || {
            connect(
                ADDR_B,
                0,
                SocketAddrV4::new(ADDR_A, 17004),
                Duration::from_secs(3),
            )
        });
        let took = t0.elapsed();
        assert_eq!(
            r.expect_err("nobody listens").kind(),
            io::ErrorKind::ConnectionRefused
        );
        // Refused, not timed out (3 s): well within the connect's timeout.
        assert!(took < Duration::from_secs(2), "refusal took {took:?}");
        assert!(tcp_out_rsts() > rsts_before, "no RST counted in iwa");
        let d = prog.counters().expect("counters").since(&before);
        assert!(d.passed >= 1 && d.redirected == 0, "{d:?}");
        let segs = collect(&mut xsks, Duration::from_millis(100), |_| false);
        assert!(
            segs.is_empty(),
            "unsteered segments reached AF_XDP: {segs:?}"
        );
    });
}

/// (b) A listener is steered by address and port: the same port on another address of the
/// interface stays the kernel's (a kernel listener there completes its handshake), while
/// the steered address's SYNs go to AF_XDP.
#[test]
fn b_steered_port_on_another_address_stays_the_kernels() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 17009;
    let other = std::net::Ipv4Addr::new(10, 77, 0, 11);
    sh(&[
        "ip",
        "-n",
        NS_A,
        "addr",
        "add",
        &format!("{other}/24"),
        "dev",
        DEV_A,
    ]);
    in_ns(NS_A, || {
        let mut prog = attach(AttachMode::Driver, ActiveMode::Driver);
        prog.steer_port(ADDR_A, PORT).expect("steer_port");
        let mut xsks = bind_all_queues(&mut prog);
        let kernel = std::net::TcpListener::bind((other, PORT)).expect("kernel listener");
        let before = prog.counters().expect("counters");
        let r = in_ns(NS_B, || {
            connect(
                ADDR_B,
                0,
                SocketAddrV4::new(other, PORT),
                Duration::from_secs(3),
            )
        });
        r.expect("the kernel's listener on the other address answers");
        let d = prog.counters().expect("counters").since(&before);
        assert!(d.passed >= 1 && d.redirected == 0, "{d:?}");
        let steered = in_ns(NS_B, || {
            connect(
                ADDR_B,
                0,
                SocketAddrV4::new(ADDR_A, PORT),
                STEERED_CONNECT_WAIT,
            )
        });
        assert_eq!(
            steered
                .expect_err("the steered address's SYN goes to AF_XDP")
                .kind(),
            io::ErrorKind::TimedOut
        );
        let segs = collect(&mut xsks, Duration::from_secs(1), is_syn_to(PORT, None));
        assert!(
            segs.iter().any(|(_, s)| is_syn_to(PORT, None)(s)),
            "no SYN to {ADDR_A}:{PORT} in any RX ring: {segs:?}"
        );
        assert!(
            segs.iter().all(|(_, s)| s.daddr == ADDR_A),
            "segments to {other} reached AF_XDP: {segs:?}"
        );
        drop(kernel);
    });
}

/// (b) A steered port with no AF_XDP socket on the queue: the packet goes to the kernel
/// (RST, ECONNREFUSED) and is counted as `no_socket`; unsteering the port is reported.
#[test]
fn b_steered_port_without_socket_goes_to_kernel() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 17005;
    in_ns(NS_A, || {
        let mut prog = attach(AttachMode::Generic, ActiveMode::Generic);
        prog.steer_port(ADDR_A, PORT).expect("steer_port");
        let before = prog.counters().expect("counters");
        let r = in_ns(NS_B, || {
            connect(
                ADDR_B,
                0,
                SocketAddrV4::new(ADDR_A, PORT),
                Duration::from_secs(3),
            )
        });
        assert_eq!(
            r.expect_err("nobody listens").kind(),
            io::ErrorKind::ConnectionRefused
        );
        let d = prog.counters().expect("counters").since(&before);
        assert!(d.no_socket >= 1 && d.redirected == 0, "{d:?}");
        assert!(prog.unsteer_port(ADDR_A, PORT).expect("unsteer"));
        assert!(!prog.unsteer_port(ADDR_A, PORT).expect("unsteer again"));
        assert!(!prog.unbind_socket(0).expect("unbind empty queue"));
    });
}

/// (c) ARP and ICMP keep working both ways while the program is attached (both modes).
#[test]
fn c_ping_and_arp_work_while_attached() {
    let _bed = bed_or_skip!();
    for (mode, expect) in [
        (AttachMode::Driver, ActiveMode::Driver),
        (AttachMode::Generic, ActiveMode::Generic),
    ] {
        in_ns(NS_A, || {
            let mut prog = attach(mode, expect);
            prog.steer_port(ADDR_A, 17006).expect("steer_port");
            let _xsks = bind_all_queues(&mut prog);
            sh(&["ip", "-n", NS_A, "neigh", "flush", "dev", DEV_A]);
            sh(&["ip", "-n", NS_B, "neigh", "flush", "dev", DEV_B]);
            let before = prog.counters().expect("counters");

            let a = ADDR_A.to_string();
            let b = ADDR_B.to_string();
            sh(&[
                "ip", "netns", "exec", NS_B, "ping", "-c", "3", "-i", "0.2", "-W", "1", &a,
            ]);
            sh(&[
                "ip", "netns", "exec", NS_A, "ping", "-c", "3", "-i", "0.2", "-W", "1", &b,
            ]);

            // Both sides resolved each other by ARP through the attached program.
            let mac_a = mac_of(NS_A, DEV_A);
            let mac_b = mac_of(NS_B, DEV_B);
            let neigh_b = sh(&["ip", "-n", NS_B, "neigh", "show", &a, "dev", DEV_B]);
            let neigh_a = sh(&["ip", "-n", NS_A, "neigh", "show", &b, "dev", DEV_A]);
            assert!(
                neigh_b.contains(&mac_a),
                "iwb did not learn iwa0's MAC: {neigh_b}"
            );
            assert!(
                neigh_a.contains(&mac_b),
                "iwa did not learn iwb0's MAC: {neigh_a}"
            );
            let d = prog.counters().expect("counters").since(&before);
            // 3 echo requests + 3 echo replies + at least one ARP frame, all passed.
            assert!(d.passed >= 7 && d.redirected == 0, "{expect}: {d:?}");
            println!("{expect} mode: ping and ARP fine; counters {d:?}");
        });
    }
}

fn mac_of(ns: &str, dev: &str) -> String {
    let out = sh(&["ip", "-n", ns, "link", "show", "dev", dev]);
    out.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("link/ether")
        .to_string()
}

/// Sends an ICMP "fragmentation needed" (next-hop MTU 1200) to `to` from the calling
/// thread's namespace through a raw socket (the kernel writes the IPv4 header), quoting a
/// 1500-octet TCP segment `quoted_src:sport -> quoted_dst:dport` with sequence number 7.
fn send_frag_needed(
    to: std::net::Ipv4Addr,
    quoted_src: std::net::Ipv4Addr,
    sport: u16,
    quoted_dst: std::net::Ipv4Addr,
    dport: u16,
) {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    use tcp_engine::wire::{FragNeededRepr, Icmpv4Packet, QuotedTcp};
    let msg = FragNeededRepr {
        next_hop_mtu: 1200,
        quoted: QuotedTcp {
            src_addr: quoted_src,
            dst_addr: quoted_dst,
            src_port: sport,
            dst_port: dport,
            seq: 7,
            total_len: 1500,
        },
    };
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.emit(&mut Icmpv4Packet::new_unchecked(&mut buf[..]))
        .expect("emit");
    let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)).expect("raw socket");
    let n = s
        .send_to(&buf, &SockAddr::from(SocketAddrV4::new(to, 0)))
        .expect("send ICMP");
    assert_eq!(n, buf.len());
}

/// The ICMP "fragmentation needed" messages that reached the sockets within `wait`, as (quoted
/// source port, quoted destination port), stopping early once `want` of them arrived.
fn collect_frag_needed(xsks: &mut [Xsk], wait: Duration, want: usize) -> Vec<(u16, u16)> {
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    loop {
        for x in xsks.iter_mut() {
            for f in x.drain() {
                let Some(ip) = f.data.get(14..) else { continue };
                if let Ok((_, m)) = tcp_engine::wire::parse_frag_needed(ip) {
                    got.push((m.quoted.src_port, m.quoted.dst_port));
                }
            }
        }
        if got.len() >= want || Instant::now() >= deadline {
            return got;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// The program (`frags`: its multi-buffer variant) attached to `iwa0` in any mode, steering
/// the flow `B:sport -> A:port` and the listener `A:listen` (call inside `iwa`).
fn steer_flow_and_listener(frags: bool, sport: u16, port: u16, listen: u16) -> SteeringProgram {
    let mut prog = SteeringProgram::load(frags).expect("load");
    prog.attach(DEV_A, AttachMode::Auto).expect("attach");
    prog.steer_flow(FourTuple {
        saddr: ADDR_B,
        daddr: ADDR_A,
        sport,
        dport: port,
    })
    .expect("steer_flow");
    prog.steer_port(ADDR_A, listen).expect("steer_port");
    prog
}

/// (f) An ICMP "fragmentation needed" about a segment of a steered flow (its quoted header
/// reversed is the flow's key) or from a steered port reaches the AF_XDP ring, counted as
/// `icmp_redirected`; one about another flow, or quoting a segment from another source than
/// the host it goes to, goes to the kernel (`passed`). Both program variants.
#[test]
fn f_frag_needed_about_steered_flows_reaches_af_xdp_ring() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 17010;
    const LISTEN: u16 = 17011;
    const SPORT: u16 = 40010;
    for frags in [false, true] {
        in_ns(NS_A, || {
            let mut prog = steer_flow_and_listener(frags, SPORT, PORT, LISTEN);
            let mut xsks = bind_all_queues(&mut prog);
            let before = prog.counters().expect("counters");
            in_ns(NS_B, || {
                // Steered: the flow's segment A:PORT -> B:SPORT; one from the listening port.
                send_frag_needed(ADDR_A, ADDR_A, PORT, ADDR_B, SPORT);
                send_frag_needed(ADDR_A, ADDR_A, LISTEN, ADDR_B, 50000);
                // Not steered: another peer port; the flow quoted the wrong way round; a
                // segment from another host than the one the ICMP goes to.
                send_frag_needed(ADDR_A, ADDR_A, PORT, ADDR_B, SPORT + 1);
                send_frag_needed(ADDR_A, ADDR_B, SPORT, ADDR_A, PORT);
                send_frag_needed(ADDR_A, ADDR_B, PORT, ADDR_A, SPORT);
            });
            let mut got = collect_frag_needed(&mut xsks, Duration::from_secs(1), 2);
            got.sort_unstable();
            let late = collect_frag_needed(&mut xsks, Duration::from_millis(200), usize::MAX);
            let d = prog.counters().expect("counters").since(&before);
            println!("frags {frags}: redirected ICMP {got:?}, counters {d:?}");
            assert_eq!(got, [(PORT, SPORT), (LISTEN, 50000)], "frags {frags}");
            assert!(late.is_empty(), "{late:?}");
            assert_eq!(d.icmp_redirected, 2, "{d:?}");
            assert_eq!((d.redirected, d.no_socket), (0, 0), "{d:?}");
            assert!(d.passed >= 3, "{d:?}");
        });
    }
}

/// An IPv4 packet (no options, checksums filled in) carrying a TCP segment
/// `src:sport -> dst:dport` with sequence number 1000, acknowledgment number 2000, window 8192,
/// `flags` and `payload`, written by `tcp_engine`'s segment emitter.
fn tcp_packet(
    src: std::net::Ipv4Addr,
    sport: u16,
    dst: std::net::Ipv4Addr,
    dport: u16,
    flags: tcp_engine::wire::TcpFlags,
    payload: &[u8],
) -> Vec<u8> {
    let seg = tcp_engine::wire::SegmentRepr {
        tos: 0,
        src_addr: src,
        dst_addr: dst,
        src_port: sport,
        dst_port: dport,
        seq: 1000,
        ack: 2000,
        flags,
        window: 8192,
        options: tcp_engine::wire::TcpOptions::default(),
        payload,
    };
    let mut packet = vec![0u8; seg.packet_len()];
    let n = seg.emit(&mut packet).expect("emit");
    packet.truncate(n);
    packet
}

/// Sends one TCP segment `src:sport -> dst:dport` (ACK, 20 octets of data) from the calling
/// thread's namespace as two IPv4 fragments (24 and 16 octets of the segment) through a raw
/// socket (the kernel fills in the IPv4 checksum).
fn send_fragmented_segment(
    src: std::net::Ipv4Addr,
    sport: u16,
    dst: std::net::Ipv4Addr,
    dport: u16,
    id: u16,
) {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let flags = tcp_engine::wire::TcpFlags {
        psh: true,
        ack: true,
        ..Default::default()
    };
    let whole = tcp_packet(src, sport, dst, dport, flags, &[0x5a; 20]);
    let segment = &whole[20..];
    let s = Socket::new(
        Domain::IPV4,
        Type::RAW,
        Some(Protocol::from(libc::IPPROTO_RAW)),
    )
    .expect("raw socket");
    let to = SockAddr::from(SocketAddrV4::new(dst, 0));
    // (first octet of the segment, more fragments follow)
    for (at, len, more) in [(0usize, 24usize, true), (24, 16, false)] {
        let mut frag = whole[..20].to_vec();
        frag.extend_from_slice(&segment[at..at + len]);
        let total = frag.len() as u16;
        frag[2..4].copy_from_slice(&total.to_be_bytes());
        frag[4..6].copy_from_slice(&id.to_be_bytes());
        let flags_offset = u16::from(more) << 13 | (at / 8) as u16;
        frag[6..8].copy_from_slice(&flags_offset.to_be_bytes());
        frag[10..12].fill(0);
        let n = s.send_to(&frag, &to).expect("send fragment");
        assert_eq!(n, frag.len());
    }
}

/// (g) The first fragment of a steered segment is dropped (`fragments_dropped`), so the
/// kernel never reassembles it and never resets the peer's connection; the same fragments of
/// a flow that is not steered go to the kernel, which reassembles the segment and answers it
/// with a RST (what would have reset a steered connection before). Both program variants.
#[test]
fn g_first_fragment_of_a_steered_segment_is_dropped() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 17020;
    const LISTEN: u16 = 17021;
    const SPORT: u16 = 40020;
    for frags in [false, true] {
        in_ns(NS_A, || {
            let mut prog = steer_flow_and_listener(frags, SPORT, PORT, LISTEN);
            let _xsks = bind_all_queues(&mut prog);
            let wait_rsts = |before: u64, want: u64| {
                let deadline = Instant::now() + Duration::from_millis(500);
                loop {
                    let n = tcp_out_rsts() - before;
                    if n >= want || Instant::now() >= deadline {
                        return n;
                    }
                    thread::sleep(Duration::from_millis(10));
                }
            };

            let rsts = tcp_out_rsts();
            let before = prog.counters().expect("counters");
            in_ns(NS_B, || {
                send_fragmented_segment(ADDR_B, SPORT, ADDR_A, PORT, 0x4701);
                send_fragmented_segment(ADDR_B, 50000, ADDR_A, LISTEN, 0x4702);
            });
            let resets = wait_rsts(rsts, 1);
            let d = prog.counters().expect("counters").since(&before);
            println!("frags {frags}: steered, counters {d:?}, kernel RSTs {resets}");
            assert_eq!(d.fragments_dropped, 2, "{d:?}");
            assert_eq!((d.redirected, d.no_socket), (0, 0), "{d:?}");
            assert_eq!(
                resets, 0,
                "the kernel reassembled a steered segment and reset it"
            );

            // Control: another peer port of the flow is not steered; its fragments reach
            // the kernel whole, which resets the segment.
            let rsts = tcp_out_rsts();
            let before = prog.counters().expect("counters");
            in_ns(NS_B, || {
                send_fragmented_segment(ADDR_B, SPORT + 1, ADDR_A, PORT, 0x4703)
            });
            let resets = wait_rsts(rsts, 1);
            let d = prog.counters().expect("counters").since(&before);
            println!("frags {frags}: not steered, counters {d:?}, kernel RSTs {resets}");
            assert_eq!(d.fragments_dropped, 0, "{d:?}");
            assert!(d.passed >= 2, "{d:?}");
            assert_eq!(
                resets, 1,
                "the kernel did not reset the reassembled segment"
            );
        });
    }
}

/// An Ethernet frame from `iwb0` to `iwa0` carrying a TCP SYN `ADDR_B:sport -> ADDR_A:dport`,
/// behind an 802.1Q tag with control information `tci` if one is given.
fn syn_frame(tci: Option<u16>, sport: u16, dport: u16) -> Vec<u8> {
    let tags: Vec<(u16, u16)> = tci.map(|t| (0x8100, t)).into_iter().collect();
    syn_frame_tagged(&tags, sport, dport)
}

/// [`syn_frame`] behind the VLAN tags `tags` (type, TCI), outermost first.
fn syn_frame_tagged(tags: &[(u16, u16)], sport: u16, dport: u16) -> Vec<u8> {
    let syn = tcp_engine::wire::TcpFlags {
        syn: true,
        ..Default::default()
    };
    let ip = tcp_packet(ADDR_B, sport, ADDR_A, dport, syn, &[]);
    let mac = |ns, dev| -> Vec<u8> {
        mac_of(ns, dev)
            .split(':')
            .map(|h| u8::from_str_radix(h, 16).expect("hex"))
            .collect()
    };
    let mut frame = mac(NS_A, DEV_A);
    frame.extend(mac(NS_B, DEV_B));
    for (tpid, tci) in tags {
        frame.extend_from_slice(&tpid.to_be_bytes());
        frame.extend_from_slice(&tci.to_be_bytes());
    }
    frame.extend_from_slice(&0x0800u16.to_be_bytes());
    frame.extend(ip);
    frame
}

/// Sends `frame` out of `dev` of the calling thread's namespace through an `AF_PACKET` socket.
fn send_raw_frame(dev: &str, frame: &[u8]) {
    let index = ifindex(dev);
    // SAFETY: plain system calls with arguments on our stack; the descriptor is closed
    // before returning.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        assert!(fd >= 0, "AF_PACKET socket: {}", io::Error::last_os_error());
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = index as i32;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&frame[..6]);
        let n = libc::sendto(
            fd,
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        let err = io::Error::last_os_error();
        libc::close(fd);
        assert_eq!(n, frame.len() as isize, "send: {err}");
    }
}

/// (h) A SYN to a steered port behind an 802.1Q priority tag (VLAN ID 0, priority 3: what a
/// peer marking its traffic for DCB/PFC sends) reaches the AF_XDP ring untagged, so the
/// engine parses it as any frame; before, it went to the kernel, which answered with a RST.
/// So do one behind an 802.1ad priority tag and one behind two stacked priority tags (the
/// kernel takes off all of them). A frame of a VLAN (ID 5), also behind a priority tag,
/// stays the kernel's. Both program variants.
#[test]
fn h_a_priority_tagged_segment_reaches_the_ring_untagged() {
    let _bed = bed_or_skip!();
    const LISTEN: u16 = 17031;
    const QTAG: u16 = 0x8100;
    const ADTAG: u16 = 0x88a8;
    for frags in [false, true] {
        in_ns(NS_A, || {
            let mut prog = steer_flow_and_listener(frags, 40030, 17030, LISTEN);
            let mut xsks = bind_all_queues(&mut prog);
            let before = prog.counters().expect("counters");
            let steered = [
                syn_frame(Some(0x6000), 40031, LISTEN),
                syn_frame_tagged(&[(ADTAG, 0x6000)], 40033, LISTEN),
                syn_frame_tagged(&[(ADTAG, 0x2000), (QTAG, 0x0000)], 40034, LISTEN),
            ];
            let vlans = [
                syn_frame(Some(0x6005), 40032, LISTEN),
                syn_frame_tagged(&[(QTAG, 0x6000), (QTAG, 0x6005)], 40035, LISTEN),
            ];
            in_ns(NS_B, || {
                for frame in steered.iter().chain(&vlans) {
                    send_raw_frame(DEV_B, frame);
                }
            });
            let mut got = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(2);
            while got
                .iter()
                .filter(|(_, s)| is_syn_to(LISTEN, None)(s))
                .count()
                < steered.len()
                && Instant::now() < deadline
            {
                got.extend(collect(
                    &mut xsks,
                    Duration::from_millis(200),
                    is_syn_to(LISTEN, None),
                ));
            }
            thread::sleep(Duration::from_millis(100));
            let late = collect(&mut xsks, Duration::ZERO, |_| false);
            let d = prog.counters().expect("counters").since(&before);
            println!("frags {frags}: got {got:?}, later {late:?}, counters {d:?}");
            let syn = is_syn_to(LISTEN, None);
            let mut sports: Vec<u16> = got
                .iter()
                .filter(|(_, s)| syn(s))
                .map(|(_, s)| s.sport)
                .collect();
            sports.sort_unstable();
            assert_eq!(
                sports,
                [40031, 40033, 40034],
                "the tagged SYNs, parsed as untagged frames: {got:?}"
            );
            assert!(late.is_empty(), "a VLAN's frame was redirected: {late:?}");
            assert_eq!(d.redirected, 3, "{d:?}");
            assert!(d.passed >= 2, "{d:?}");
        });
    }
}

/// (i) The steering reads a segment's fixed TCP header only: a SYN to a steered port whose
/// data offset says 60 octets of header, more than the frame holds (as options running into
/// a second buffer would on a NIC whose first buffer is short), is redirected for the engine
/// to check, not passed to the kernel (which would answer a segment of an engine flow with
/// a RST); a segment shorter than the fixed header still goes to the kernel. Both variants.
#[test]
fn i_a_steered_segment_goes_to_the_ring_whatever_its_data_offset() {
    let _bed = bed_or_skip!();
    const LISTEN: u16 = 17041;
    // Ethernet (14) + IPv4 (20): the TCP header's data offset is its 13th octet.
    const DOFF: usize = 14 + 20 + 12;
    for frags in [false, true] {
        in_ns(NS_A, || {
            let mut prog = steer_flow_and_listener(frags, 40040, 17040, LISTEN);
            let _xsks = bind_all_queues(&mut prog);
            let mut long = syn_frame(None, 40041, LISTEN);
            long[DOFF] = 0xF0 | (long[DOFF] & 0x0F);
            let mut short = syn_frame(None, 40042, LISTEN);
            short.truncate(DOFF);
            let before = prog.counters().expect("counters");
            in_ns(NS_B, || send_raw_frame(DEV_B, &long));
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut d = prog.counters().expect("counters").since(&before);
            while d.redirected == 0 && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
                d = prog.counters().expect("counters").since(&before);
            }
            println!("frags {frags}: data offset 60 in a 20-octet header: {d:?}");
            assert_eq!(d.redirected, 1, "{d:?}");
            let before = prog.counters().expect("counters");
            in_ns(NS_B, || send_raw_frame(DEV_B, &short));
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut d = prog.counters().expect("counters").since(&before);
            while d.passed == 0 && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(10));
                d = prog.counters().expect("counters").since(&before);
            }
            // A redirect of it would have come before or with the pass.
            thread::sleep(Duration::from_millis(20));
            let d = prog.counters().expect("counters").since(&before);
            println!("frags {frags}: 12 octets of TCP header: {d:?}");
            assert_eq!(d.redirected, 0, "{d:?}");
            assert!(d.passed >= 1, "{d:?}");
        });
    }
}

/// (d) Detaching (dropping the program) leaves both veth ends exactly as they were: same
/// `ip -d link show` (no xdp) and same offload features (native XDP on veth changes GRO on
/// its end and GSO on the peer while attached).
#[test]
fn d_detach_leaves_interface_as_before() {
    let _bed = bed_or_skip!();
    let snapshot = || {
        [
            link_details(NS_A, DEV_A),
            features(NS_A, DEV_A),
            link_details(NS_B, DEV_B),
            features(NS_B, DEV_B),
        ]
    };
    let before = snapshot();
    assert!(
        !before[0].contains("xdp"),
        "xdp before attach:\n{}",
        before[0]
    );
    for (mode, expect) in [
        (AttachMode::Driver, ActiveMode::Driver),
        (AttachMode::Generic, ActiveMode::Generic),
    ] {
        in_ns(NS_A, || {
            let mut prog = attach(mode, expect);
            prog.steer_port(ADDR_A, 17007).expect("steer_port");
            let xsks = bind_all_queues(&mut prog);
            // Explicit detach, then again via drop.
            prog.detach();
            assert_eq!(prog.attached(), None);
            assert!(
                !link_details(NS_A, DEV_A).contains("xdp"),
                "still attached after detach()"
            );
            // Re-attach, then detach by dropping.
            prog.attach(DEV_A, mode).expect("re-attach");
            drop(xsks);
            drop(prog);
        });
        let after = snapshot();
        for (b, a) in before.iter().zip(after.iter()) {
            assert_eq!(b, a, "{expect}: interface changed by attach/detach");
        }
    }
}

/// (e) Driver mode on an interface without native XDP (`lo`) is a clear error, not a panic;
/// `Auto` falls back to generic there and says so.
#[test]
fn e_driver_mode_unsupported_is_an_error() {
    let _bed = bed_or_skip!();
    in_ns(NS_A, || {
        let mut prog = SteeringProgram::load(false).expect("load");
        let err = prog
            .attach("lo", AttachMode::Driver)
            .expect_err("lo has no native XDP");
        assert!(
            matches!(
                err,
                XdpError::ModeNotSupported {
                    mode: ActiveMode::Driver,
                    ..
                }
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("driver mode is not supported on `lo`"),
            "{msg}"
        );
        println!("driver mode on lo: {msg}");
        assert_eq!(
            prog.attach("lo", AttachMode::Auto).expect("auto"),
            ActiveMode::Generic
        );
        // Why it fell back, for the log.
        let why = prog.driver_refused().expect("the driver mode's error");
        assert!(why.contains("driver mode is not supported"), "{why}");
        let err = prog
            .attach(DEV_A, AttachMode::Generic)
            .expect_err("already attached");
        assert!(
            matches!(err, XdpError::AlreadyAttached(ref n) if n == "lo"),
            "{err:?}"
        );
        prog.detach();
        assert!(!link_details(NS_A, "lo").contains("xdp"));

        let err = prog
            .attach("nosuchdev0", AttachMode::Auto)
            .expect_err("no such device");
        assert!(
            matches!(err, XdpError::InterfaceNotFound(ref n) if n == "nosuchdev0"),
            "{err:?}"
        );
        let err = prog
            .attach("bad\0name", AttachMode::Generic)
            .expect_err("bad name");
        assert!(matches!(err, XdpError::InterfaceNotFound(_)), "{err:?}");
        let err = prog
            .bind_socket(0, 0)
            .expect_err("stdin is no AF_XDP socket");
        assert!(
            matches!(err, XdpError::InvalidSocket { fd: 0, .. }),
            "{err:?}"
        );
        let err = prog
            .bind_socket(xdp_prog::MAX_QUEUES, 0)
            .expect_err("queue out of range");
        assert!(matches!(err, XdpError::QueueOutOfRange { .. }), "{err:?}");
    });
}

/// (e) Above MTU 3506 on the peer, native XDP on veth needs the `xdp.frags` program: the
/// plain one gets `MtuTooLarge`, `Auto` falls back to generic, the frags variant attaches in
/// driver mode and still steers.
#[test]
fn e_large_mtu_needs_frags_program_in_driver_mode() {
    let bed = bed_or_skip!();
    bed.set_mtu(9000).expect("MTU 9000 on the bed");
    in_ns(NS_A, || {
        let mut plain = SteeringProgram::load(false).expect("load");
        let err = plain
            .attach(DEV_A, AttachMode::Driver)
            .expect_err("MTU 9000");
        assert!(matches!(err, XdpError::MtuTooLarge { .. }), "{err:?}");
        println!("plain program, MTU 9000, driver mode: {err}");
        assert_eq!(
            plain.attach(DEV_A, AttachMode::Auto).expect("auto"),
            ActiveMode::Generic
        );
        assert!(
            plain
                .driver_refused()
                .is_some_and(|w| w.contains("too large")),
            "{:?}",
            plain.driver_refused()
        );
        drop(plain);

        let mut frags = SteeringProgram::load(true).expect("load frags");
        assert!(frags.is_frags());
        assert_eq!(
            frags.attach(DEV_A, AttachMode::Driver).expect("frags"),
            ActiveMode::Driver
        );
        assert_eq!(frags.driver_refused(), None, "native, as asked");
        frags.steer_port(ADDR_A, 17008).expect("steer");
        let mut xsks = bind_all_queues(&mut frags);
        let r = in_ns(NS_B, || {
            connect(
                ADDR_B,
                0,
                SocketAddrV4::new(ADDR_A, 17008),
                STEERED_CONNECT_WAIT,
            )
        });
        assert_eq!(r.expect_err("steered").kind(), io::ErrorKind::TimedOut);
        let segs = collect(&mut xsks, Duration::from_secs(1), is_syn_to(17008, None));
        assert!(
            segs.iter().any(|(_, s)| is_syn_to(17008, None)(s)),
            "{segs:?}"
        );
        // A large ping (several buffers) still reaches the kernel and is answered.
        sh(&[
            "ip",
            "netns",
            "exec",
            NS_B,
            "ping",
            "-c",
            "2",
            "-i",
            "0.2",
            "-W",
            "1",
            "-s",
            "8000",
            "-M",
            "do",
            &ADDR_A.to_string(),
        ]);
        let c: Counters = frags.counters().expect("counters");
        assert!(c.redirected >= 1 && c.passed >= 2, "{c:?}");
    });
}

/// (e) Without CAP_BPF/CAP_NET_ADMIN, loading is `PermissionDenied` with "run as root". As
/// root the capabilities are dropped on a scratch thread (capabilities are per thread).
#[test]
fn e_without_privileges_is_permission_denied() {
    let result = std::thread::spawn(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            drop_effective_caps();
        }
        SteeringProgram::load(false)
    })
    .join()
    .expect("thread");
    let err = result.expect_err("load without privileges");
    assert!(matches!(err, XdpError::PermissionDenied { .. }), "{err:?}");
    assert!(err.to_string().contains("run as root"), "{err}");
    println!("unprivileged load: {err}");
}

/// Clears this thread's effective capability set (permitted stays, unused).
fn drop_effective_caps() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const V3: u32 = 0x2008_0522; // _LINUX_CAPABILITY_VERSION_3
    let mut hdr = Header {
        version: V3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: header and a two-element data array as capget(2) requires for version 3.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut Header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", io::Error::last_os_error());
    for d in &mut data {
        d.effective = 0;
    }
    // SAFETY: as above; capset(2) with pid 0 changes only the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut Header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", io::Error::last_os_error());
}
