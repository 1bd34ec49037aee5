//! Bounded fuzzing on stable Rust (proptest-driven; see README "Fuzzing"):
//! the segment parser on arbitrary and mutated packets (with checksums
//! repaired so mutations reach option and header decoding), emit/parse
//! round trips, the ICMP "fragmentation needed" parser likewise, and the
//! connection state machine under random segment sequences, timeouts,
//! "packet too big" reports and application calls. Case counts scale with
//! TCP_FUZZ_CASES (default bounded for CI).
mod common;
use common::*;
use etherparse::checksum::Sum16BitWords;
use proptest::prelude::*;
use tcp_engine::ranges::RangeSet;
use tcp_engine::wire::{
    emit_frag_needed, parse_frag_needed, FragNeededRepr, Icmpv4Packet, Ipv4Packet, QuotedTcp,
    SackBlock, TcpFlags, TcpOptions,
};
use tcp_engine::{Config, Connection, Instant, IsnGenerator, SegmentRepr, State};

fn cases(default: u32) -> u32 {
    env_usize("TCP_FUZZ_CASES", default as usize) as u32
}

fn valid_packet(payload: &[u8], opts: TcpOptions) -> Vec<u8> {
    let r = SegmentRepr {
        tos: 0,
        src_addr: A_ADDR,
        dst_addr: B_ADDR,
        src_port: 1,
        dst_port: 2,
        seq: 7,
        ack: 9,
        flags: TcpFlags {
            ack: true,
            ..TcpFlags::default()
        },
        window: 100,
        options: opts,
        payload,
    };
    let mut v = vec![0u8; r.packet_len()];
    let n = r.emit(&mut v).expect("emit");
    v.truncate(n);
    v
}

/// Recompute IPv4 and TCP checksums after a mutation (when lengths allow).
fn repair_checksums(p: &mut [u8]) {
    if p.len() < 40 {
        return;
    }
    let ihl = usize::from(p[0] & 0xf) * 4;
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if ihl < 20 || total > p.len() || total < ihl + 20 {
        return;
    }
    p[10] = 0;
    p[11] = 0;
    let s = Sum16BitWords::new()
        .add_slice(&p[..ihl])
        .ones_complement()
        .to_be();
    p[10..12].copy_from_slice(&s.to_be_bytes());
    let (src, dst) = ([p[12], p[13], p[14], p[15]], [p[16], p[17], p[18], p[19]]);
    let tcp = &mut p[ihl..total];
    tcp[16] = 0;
    tcp[17] = 0;
    let s = Sum16BitWords::new()
        .add_4bytes(src)
        .add_4bytes(dst)
        .add_2bytes([0, 6])
        .add_2bytes((tcp.len() as u16).to_be_bytes())
        .add_slice(tcp)
        .ones_complement()
        .to_be();
    tcp[16..18].copy_from_slice(&s.to_be_bytes());
}

fn opts(mss: Option<u16>, ws: Option<u8>, sp: bool, ts: Option<(u32, u32)>) -> TcpOptions {
    let mut o = TcpOptions::default();
    o.mss = mss;
    o.window_scale = ws;
    o.sack_permitted = sp;
    o.timestamp = ts;
    o
}

fn arb_options() -> impl Strategy<Value = TcpOptions> {
    (
        proptest::option::of(any::<u16>()),
        proptest::option::of(0u8..15),
        any::<bool>(),
        proptest::option::of(any::<(u32, u32)>()),
        proptest::collection::vec(any::<(u32, u32)>(), 0..4),
    )
        .prop_map(|(mss, ws, sp, ts, sacks)| {
            let mut o = opts(mss, ws, sp, ts);
            let n = if ts.is_some() {
                sacks.len().min(3)
            } else {
                sacks.len()
            };
            let blocks: Vec<_> = sacks[..n]
                .iter()
                .map(|&(l, r)| SackBlock { left: l, right: r })
                .collect();
            let mut o2 = o;
            o2.set_sack_blocks(&blocks);
            if o2.wire_len() <= 40 {
                o = o2;
            }
            o
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(3000), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn parser_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = SegmentRepr::parse(&bytes);
        let _ = parse_frag_needed(&bytes);
        let mut b = bytes.clone();
        repair_checksums(&mut b);
        let _ = SegmentRepr::parse(&b);
    }

    /// ICMP "fragmentation needed" messages with random fields, mutated, their checksums
    /// repaired (so that the mutations reach the quote), and cut: no panic; what parses
    /// emits the same message back.
    #[test]
    fn frag_needed_parser_survives_mutations(
        mtu: u16, seq: u32, ports: (u16, u16), total_len: u16,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in any::<usize>(),
    ) {
        let msg = FragNeededRepr {
            next_hop_mtu: mtu,
            quoted: QuotedTcp { src_addr: A_ADDR, dst_addr: B_ADDR, src_port: ports.0, dst_port: ports.1, seq, total_len },
        };
        let mut p = vec![0u8; 64];
        let Ok(n) = emit_frag_needed(B_ADDR, 1, &msg, &mut p) else {
            prop_assert!(total_len < 20, "emit refused {msg:?}");
            return Ok(());
        };
        p.truncate(n);
        prop_assert_eq!(parse_frag_needed(&p).map(|(_, m)| m), Ok(msg));
        for (i, x) in flips {
            let len = p.len();
            p[i % len] ^= x;
        }
        let _ = parse_frag_needed(&p);
        // Repaired: the outer header's checksum (IHL permitting) and the ICMP one.
        let ihl = usize::from(p[0] & 0x0f) * 4;
        if (20..=p.len()).contains(&ihl) {
            Ipv4Packet::new_unchecked(&mut p[..]).fill_checksum();
            if p.len() >= ihl + 8 {
                Icmpv4Packet::new_unchecked(&mut p[ihl..]).fill_checksum();
            }
        }
        if let Ok((_, m)) = parse_frag_needed(&p) {
            let mut q = vec![0u8; 64];
            prop_assert!(emit_frag_needed(B_ADDR, 1, &m, &mut q).is_ok());
        }
        let k = cut % (p.len() + 1);
        let _ = parse_frag_needed(&p[..k]);
    }

    #[test]
    fn parser_survives_mutations_with_repaired_checksums(
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        opts in arb_options(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        let mut p = valid_packet(&payload, opts);
        for (i, x) in flips {
            let len = p.len();
            p[i % len] ^= x;
        }
        repair_checksums(&mut p);
        let _ = SegmentRepr::parse(&p);
        let n = cut % (p.len() + 1);
        let _ = SegmentRepr::parse(&p[..n]);
    }

    #[test]
    fn emit_parse_round_trip(payload in proptest::collection::vec(any::<u8>(), 0..300), opts in arb_options(), seq: u32, ack: u32, window: u16) {
        let pkt = valid_packet(&payload, opts);
        let mut r = SegmentRepr::parse(&pkt).expect("valid");
        r.seq = seq;
        r.ack = ack;
        r.window = window;
        let mut buf = vec![0u8; r.packet_len()];
        let n = r.emit(&mut buf).expect("emit");
        prop_assert_eq!(SegmentRepr::parse(&buf[..n]).expect("parse"), r);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Segment {
        seq_off: i32,
        ack_off: i32,
        flags: u8,
        len: u16,
        ts: Option<u32>,
        sack: Option<(i32, u16)>,
    },
    Advance(u32),
    Send(u16),
    Close,
    Abort,
    Window(u32),
    Mtu(u16),
    TooBig {
        seq_off: i32,
        mtu: u16,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (-70_000i32..70_000, -70_000i32..70_000, any::<u8>(), 0u16..1600, proptest::option::of(any::<u32>()), proptest::option::of((-5000i32..70_000, 1u16..3000)))
            .prop_map(|(seq_off, ack_off, flags, len, ts, sack)| Op::Segment { seq_off, ack_off, flags, len, ts, sack }),
        3 => (0u32..2_000_000).prop_map(Op::Advance),
        2 => (1u16..5000).prop_map(Op::Send),
        1 => Just(Op::Close),
        1 => Just(Op::Abort).prop_filter("rare", |_| true),
        1 => (0u32..200_000).prop_map(Op::Window),
        1 => (500u16..1600).prop_map(Op::Mtu),
        2 => (-3000i32..200_000, 0u16..2000).prop_map(|(seq_off, mtu)| Op::TooBig { seq_off, mtu }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(400), failure_persistence: None, ..ProptestConfig::default() })]

    /// Random segments near and far from the connection's sequence space,
    /// timeouts and application calls: no panic, every emitted packet
    /// parses, rcv_nxt never moves back, pass-up never repeats a byte and
    /// holds nothing.
    #[test]
    fn state_machine_survives_random_input(start in 0u8..4, mpa: bool, ops in proptest::collection::vec(arb_op(), 1..120)) {
        let cfg = if mpa { Config::mpa() } else { Config::default() };
        // Start from an established pair, a fresh SYN-SENT or SYN-RECEIVED.
        let (mut conn, peer_seq0) = match start {
            0 | 1 => {
                let (c, s, _) = {
                    let (mut c, mut s, mut net) = setup(3, 0, lossy(0.0), lossy(0.0), cfg.clone(), cfg.clone());
                    net.run(&mut c, &mut s, Instant::from_millis(1000), |c, s, _| c.state() == Some(State::Established) && s.state() == Some(State::Established), |_, _, _| {});
                    (c, s, net)
                };
                let seq0 = c.conn().snd_nxt();
                (s.conn.expect("server conn"), seq0)
            }
            2 => (Connection::connect(cfg.clone(), client_tuple(), &IsnGenerator::new([5; 16]), Instant::ZERO), 1000u32),
            _ => {
                let syn = SegmentRepr {
                    tos: 0,
                    src_addr: A_ADDR, dst_addr: B_ADDR, src_port: A_PORT, dst_port: B_PORT, seq: 999, ack: 0,
                    flags: TcpFlags { syn: true, ..TcpFlags::default() }, window: 1000,
                    options: opts(Some(1000), Some(3), true, Some((5, 0))),
                    payload: &[],
                };
                (Connection::accept(cfg.clone(), &syn, &IsnGenerator::new([6; 16]), Instant::ZERO).expect("accept"), 1000u32)
            }
        };
        let t = conn.four_tuple();
        let mut now = Instant::from_millis(2);
        let mut buf = vec![0u8; 2048];
        let payload = vec![0x5au8; 1600];
        let mut coverage = RangeSet::new(1 << 16);
        let mut last_rcv = conn.rcv_nxt_offset();
        for op in ops {
            match op {
                Op::Segment { seq_off, ack_off, flags, len, ts, sack } => {
                    let mut options = opts(None, None, false, ts.map(|v| (v, 0)));
                    if let Some((l, n)) = sack {
                        let left = conn.snd_una().wrapping_add(l as u32);
                        options.set_sack_blocks(&[SackBlock { left, right: left.wrapping_add(u32::from(n)) }]);
                    }
                    let seg = SegmentRepr {
                        tos: 0,
                        src_addr: t.remote_addr, dst_addr: t.local_addr, src_port: t.remote_port, dst_port: t.local_port,
                        seq: conn.rcv_nxt().wrapping_add(seq_off as u32).wrapping_add(if start == 2 { peer_seq0 } else { 0 }),
                        ack: conn.snd_nxt().wrapping_add(ack_off as u32),
                        flags: TcpFlags { fin: flags & 1 != 0, syn: flags & 2 != 0 && flags & 0xc0 == 0xc0, rst: flags & 4 != 0 && flags & 0x30 == 0x30, psh: flags & 8 != 0, ack: flags & 16 != 0 || flags & 0x80 == 0, urg: false },
                        window: u16::from(flags) << 8,
                        options,
                        payload: &payload[..usize::from(len)],
                    };
                    let mut twice = false;
                    conn.handle_segment(now, &seg, |p| {
                        let s = p.stream_offset;
                        let e = s + p.data.len() as u64;
                        let mut fresh = 0;
                        coverage.for_each_gap(s, e, |a, b| fresh += b - a);
                        twice |= fresh != e - s;
                        coverage.insert(s, e);
                    });
                    prop_assert!(!twice, "a byte was passed up twice");
                }
                Op::Advance(us) => {
                    now += std::time::Duration::from_micros(u64::from(us));
                    if conn.poll_timeout().is_some_and(|d| d <= now) {
                        conn.handle_timeout(now);
                    }
                }
                Op::Send(n) => {
                    let data = vec![1u8; usize::from(n)];
                    let _ = conn.send(&data);
                    let _ = conn.send_record(&data);
                }
                Op::Close => conn.close(),
                Op::Abort => {
                    if now.as_millis().is_multiple_of(7) {
                        conn.abort();
                    }
                }
                Op::Window(w) => {
                    conn.set_receive_window(u64::from(w));
                    let mut sink = [0u8; 4096];
                    let _ = conn.recv(&mut sink);
                }
                Op::Mtu(m) => conn.set_path_mtu(m),
                Op::TooBig { seq_off, mtu } => {
                    let before = conn.path_mtu();
                    let seq = conn.snd_una().wrapping_add(seq_off as u32);
                    match conn.handle_packet_too_big(now, seq, mtu) {
                        Ok(emss) => {
                            prop_assert!(mtu < before && mtu >= 552, "{mtu} from {before}");
                            prop_assert_eq!(conn.path_mtu(), mtu);
                            prop_assert_eq!(conn.emss(), emss);
                        }
                        Err(_) => prop_assert_eq!(conn.path_mtu(), before),
                    }
                }
            }
            let mut emitted = 0;
            while let Some(n) = conn.poll_transmit(now, &mut buf) {
                prop_assert!(SegmentRepr::parse(&buf[..n]).is_ok(), "emitted an unparseable packet");
                emitted += 1;
                prop_assert!(emitted < 10_000, "transmit loop does not terminate");
            }
            prop_assert!(conn.rcv_nxt_offset() >= last_rcv);
            last_rcv = conn.rcv_nxt_offset();
            if mpa {
                prop_assert_eq!(conn.ooo_bytes_held(), 0);
            }
            while conn.poll_event().is_some() {}
        }
    }
}
