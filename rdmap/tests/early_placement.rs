//! Placement ahead of delivery (RFC 5041 5.3): ULPDUs handed to `place_early` in any order
//! land in their final place at once, and the in-order pass (`on_placed_ulpdu`) then only
//! records, delivers and completes: the result is the same as processing in order.

mod common;

use common::*;
use rdmap::qp::{SendOp, Sge, WcOpcode, WcStatus};
use rdmap::{Access, PlacedEarly, Stag};

const MULPDU: usize = 1000;

/// Every ULPDU `side` has to send now.
fn drain(p: &mut Pair, side: Side) -> Vec<Vec<u8>> {
    let src = match side {
        Side::A => &mut p.a,
        Side::B => &mut p.b,
    };
    let mut out = Vec::new();
    loop {
        let mut buf = Vec::new();
        if src.qp.poll_transmit(MULPDU, &src.mem, &mut buf).is_none() {
            return out;
        }
        out.push(buf);
    }
}

fn header_len(ulpdu: &[u8]) -> usize {
    if ulpdu[0] & 0x80 != 0 {
        14
    } else {
        18
    }
}

/// Seeded Fisher-Yates permutation of `0..n`.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// Delivers `ulpdus` to `dst`: early placement in the order `order`, then the in-order pass.
/// Returns which ones were placed early.
fn deliver_out_of_order(dst: &mut Peer, ulpdus: &[Vec<u8>], order: &[usize]) -> Vec<bool> {
    let mut placed = vec![None; ulpdus.len()];
    for &i in order {
        placed[i] = dst.qp.place_early(&ulpdus[i], &dst.mem);
    }
    in_order_pass(dst, ulpdus, &placed);
    placed.iter().map(Option::is_some).collect()
}

/// The in-order pass over `ulpdus`, of which `placed` says which were placed early.
fn in_order_pass(dst: &mut Peer, ulpdus: &[Vec<u8>], placed: &[Option<PlacedEarly>]) {
    for (u, early) in ulpdus.iter().zip(placed) {
        let r = match early {
            Some(p) => {
                let h = header_len(u);
                dst.qp.on_placed_ulpdu(&u[..h], u.len() - h, *p, &dst.mem)
            }
            None => dst.qp.on_ulpdu(u, &dst.mem),
        };
        r.expect("in-order pass");
    }
}

struct Scenario {
    pair: Pair,
    write_sink: Stag,
    recv_buf: Stag,
    read_src: Stag,
    read_sink: Stag,
    write_data: Vec<u8>,
    send_data: Vec<u8>,
    read_data: Vec<u8>,
}

fn scenario() -> Scenario {
    let mut pair = Pair::new(MULPDU);
    let write_data = pattern(40_000, 1);
    let send_data = pattern(10_000, 2);
    let read_data = pattern(30_000, 3);
    let w_src = pair
        .a
        .region(write_data.clone(), 0x1000, Access::LOCAL_WRITE);
    let s_src = pair
        .a
        .region(send_data.clone(), 0x10_0000, Access::LOCAL_WRITE);
    let read_sink = pair
        .a
        .region(vec![0; 30_000], 0x20_0000, Access::LOCAL_WRITE);
    let write_sink = pair.b.region(vec![0; 50_000], 0x5000, Access::REMOTE_WRITE);
    let recv_buf = pair
        .b
        .region(vec![0; 16_384], 0x40_0000, Access::LOCAL_WRITE);
    let read_src = pair
        .b
        .region(read_data.clone(), 0x80_0000, Access::REMOTE_READ);
    pair.b.post_recv(100, recv_buf, 0x40_0000, 16_384);
    pair.a.post(
        1,
        SendOp::Write {
            remote_stag: write_sink,
            remote_to: 0x5000 + 7,
        },
        Some(Sge {
            stag: w_src,
            to: 0x1000,
            len: 40_000,
        }),
    );
    pair.a.post(
        2,
        SendOp::Send {
            solicited: true,
            invalidate: None,
        },
        Some(Sge {
            stag: s_src,
            to: 0x10_0000,
            len: 10_000,
        }),
    );
    pair.a.post(
        3,
        SendOp::Read {
            remote_stag: read_src,
            remote_to: 0x80_0000,
        },
        Some(Sge {
            stag: read_sink,
            to: 0x20_0000,
            len: 30_000,
        }),
    );
    Scenario {
        pair,
        write_sink,
        recv_buf,
        read_src,
        read_sink,
        write_data,
        send_data,
        read_data,
    }
}

#[test]
fn shuffled_segments_are_placed_at_once_and_delivered_in_order() {
    for seed in 0..40 {
        let mut s = scenario();
        let a_to_b = drain(&mut s.pair, Side::A);
        let order = permutation(a_to_b.len(), seed);
        // Place everything that can be placed early, before any in-order processing.
        let mut placed = vec![None; a_to_b.len()];
        for &i in &order {
            placed[i] = s.pair.b.qp.place_early(&a_to_b[i], &s.pair.b.mem);
        }
        // Write and Send payloads are in place already, but for the Write's last octet, which
        // waits for the in-order pass; nothing is delivered yet.
        let sink = s.pair.b.contents(s.write_sink);
        assert_eq!(&sink[7..40_006], &s.write_data[..39_999], "seed {seed}");
        assert_eq!(
            sink[40_006], 0,
            "seed {seed}: the Write's last octet showed early"
        );
        assert_eq!(&s.pair.b.contents(s.recv_buf)[..10_000], &s.send_data[..]);
        assert!(s.pair.b.completions().is_empty());
        // Only the Read Request waits for its turn.
        let held: Vec<usize> = (0..a_to_b.len()).filter(|&i| placed[i].is_none()).collect();
        assert_eq!(held.len(), 1, "seed {seed}: only the Read Request is held");
        assert_eq!(
            a_to_b[held[0]][1] & 0x0F,
            1,
            "held ULPDU is the Read Request"
        );
        // The in-order pass: delivery and completions, no second copy needed (but of the
        // held octet).
        in_order_pass(&mut s.pair.b, &a_to_b, &placed);
        let sink = s.pair.b.contents(s.write_sink);
        assert_eq!(&sink[7..40_007], &s.write_data[..], "seed {seed}");
        let wcs = s.pair.b.completions();
        assert_eq!(wcs.len(), 1);
        assert_eq!(
            (
                wcs[0].wr_id,
                wcs[0].opcode,
                wcs[0].status,
                wcs[0].byte_len,
                wcs[0].solicited
            ),
            (100, WcOpcode::Recv, WcStatus::Success, 10_000, true)
        );
        // Read Responses travel back, shuffled too.
        let b_to_a = drain(&mut s.pair, Side::B);
        assert!(b_to_a.len() >= 30, "30000 octets at MULPDU {MULPDU}");
        let order = permutation(b_to_a.len(), seed + 1000);
        let placed = deliver_out_of_order(&mut s.pair.a, &b_to_a, &order);
        assert!(
            placed.iter().all(|p| *p),
            "every Read Response segment placed early"
        );
        assert_eq!(s.pair.a.contents(s.read_sink), s.read_data);
        let ids: Vec<_> = s
            .pair
            .a
            .completions()
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect();
        assert_eq!(
            ids,
            vec![
                (1, WcStatus::Success),
                (2, WcStatus::Success),
                (3, WcStatus::Success)
            ]
        );
        let _ = s.read_src;
    }
}

#[test]
fn nothing_is_placed_early_where_the_in_order_check_would_refuse() {
    let mut pair = Pair::new(MULPDU);
    let src = pair.a.region(pattern(3000, 9), 0, Access::LOCAL_WRITE);
    let read_only = pair.b.region(vec![0; 4000], 0x9000, Access::REMOTE_READ);
    let small = pair.b.region(vec![0; 100], 0xA000, Access::REMOTE_WRITE);
    let targets = [
        (read_only, 0x9000u64), // no REMOTE_WRITE
        (Stag(0x7700), 0),      // never registered
        (small, 0xA000 + 50),   // runs past the end
    ];
    for (stag, to) in targets {
        pair.a.post(
            1,
            SendOp::Write {
                remote_stag: stag,
                remote_to: to,
            },
            Some(Sge {
                stag: src,
                to: 0,
                len: 3000,
            }),
        );
    }
    // A Send with no posted receive cannot be placed either.
    pair.a.post(
        2,
        SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 10,
        }),
    );
    let ulpdus = drain(&mut pair, Side::A);
    for u in &ulpdus {
        assert!(pair.b.qp.place_early(u, &pair.b.mem).is_none());
    }
    assert_eq!(pair.b.contents(read_only), vec![0; 4000]);
    assert_eq!(pair.b.contents(small), vec![0; 100]);
    // In order, the first refused Write gets its Terminate (DDP tagged buffer, invalid STag:
    // access rights, as siw).
    let err = pair.b.qp.on_ulpdu(&ulpdus[0], &pair.b.mem).unwrap_err();
    let code = err.terminate_code().expect("a Terminate");
    assert_eq!((code.layer, code.etype, code.code), (1, 1, 0));
}

/// RFC 7306 Immediate Data is never placed early (it places nothing: its receive completes
/// with the value in order), so a Write with Immediate and an Immediate Data message that
/// arrive ahead of the in-order point leave the receive buffer untouched and complete as they
/// would in order.
#[test]
fn immediate_data_is_not_placed_early() {
    let mut pair = Pair::with_configs(MULPDU, config_ext(), config_ext());
    let src = pair.a.region(pattern(3000, 4), 0, Access::NONE);
    let dst = pair.b.region(vec![0; 3000], 0, Access::REMOTE_WRITE);
    let rbuf = pair.b.region(vec![0xAB; 64], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(1, rbuf, 0, 32);
    pair.b.post_recv(2, rbuf, 32, 32);
    pair.a.post(
        10,
        SendOp::WriteImmediate {
            remote_stag: dst,
            remote_to: 0,
            solicited: false,
            immediate: 77,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 3000,
        }),
    );
    pair.a.post(
        11,
        SendOp::Immediate {
            solicited: false,
            immediate: 78,
        },
        None,
    );
    let ulpdus = drain(&mut pair, Side::A);
    let order: Vec<usize> = (0..ulpdus.len()).rev().collect();
    let placed = deliver_out_of_order(&mut pair.b, &ulpdus, &order);
    let immediates = ulpdus.iter().filter(|u| u[1] & 0x0F == 8).count();
    assert_eq!(immediates, 2);
    for (u, early) in ulpdus.iter().zip(&placed) {
        assert!(
            !(u[1] & 0x0F == 8 && *early),
            "an Immediate Data was placed early"
        );
    }
    assert_eq!(
        pair.b.contents(rbuf),
        vec![0xAB; 64],
        "nothing placed in the receives"
    );
    assert_eq!(pair.b.contents(dst), pattern(3000, 4));
    let c = pair.b.completions();
    let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.opcode, c.immediate)).collect();
    assert_eq!(
        got,
        [
            (1, WcOpcode::RecvImmediate, Some(77)),
            (2, WcOpcode::RecvImmediate, Some(78))
        ]
    );
    assert!(c.iter().all(|c| c.status == WcStatus::Success));
}
