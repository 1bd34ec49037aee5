//! RFC 7306 on two queue pairs back to back: Atomic Operations (FetchAdd, CmpSwap) and
//! Immediate Data, the wire format each produces, the errors of section 8 raised from the
//! wire, and a stream whose extensions are off.

mod common;

use common::*;
use rdmap::qp::{AtomicOp, QpState, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use rdmap::wire::{AtomicRequest, ATOMIC_REQUEST_LEN};
use rdmap::{Access, Opcode, RdmapError, Stag};

const MULPDU: usize = 1024;
/// The responder's region: 8 words at TO 0x1000, word 1 holding 10.
const BASE: u64 = 0x1000;

fn words(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn word(bytes: &[u8], index: usize) -> u64 {
    u64::from_ne_bytes(bytes[index * 8..index * 8 + 8].try_into().unwrap())
}

/// A pair with the extensions on both sides: B's atomic region (REMOTE_ATOMIC and
/// REMOTE_READ), A's 8-octet sink.
fn atomic_pair(access: Access) -> (Pair, Stag, Stag) {
    let mut pair = Pair::with_configs(MULPDU, config_ext(), config_ext());
    let target = pair
        .b
        .region(words(&[0, 10, 0, 0, 0, 0, 0, 0]), BASE, access);
    let sink = pair.a.region(vec![0xEE; 8], 0, Access::LOCAL_WRITE);
    (pair, target, sink)
}

fn atomic(pair: &mut Pair, wr_id: u64, target: Stag, to: u64, op: AtomicOp, sink: Stag) {
    pair.a.post(
        wr_id,
        SendOp::Atomic {
            remote_stag: target,
            remote_to: to,
            op,
        },
        Some(Sge {
            stag: sink,
            to: 0,
            len: 8,
        }),
    );
}

/// DDP untagged header fields of a logged ULPDU: (QN, MSN, MO).
fn untagged_fields(bytes: &[u8]) -> (u32, u32, u32) {
    let field = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (field(6), field(10), field(14))
}

#[test]
fn fetch_add_and_cmp_swap_return_the_original_and_change_the_word() {
    let (mut pair, target, sink) = atomic_pair(Access::REMOTE_ATOMIC);
    let steps: [(AtomicOp, u64, u64); 4] = [
        (AtomicOp::fetch_add(5), 10, 15),
        (AtomicOp::cmp_swap(15, 99), 15, 99),
        // No match: nothing changes, the original comes back.
        (AtomicOp::cmp_swap(15, 1), 99, 99),
        (AtomicOp::fetch_add(u64::MAX), 99, 98),
    ];
    for (i, (op, original, after)) in steps.into_iter().enumerate() {
        atomic(&mut pair, i as u64, target, BASE + 8, op, sink);
        pair.pump();
        let c = pair.a.completions();
        let opcode = match op {
            AtomicOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            AtomicOp::CmpSwap { .. } => WcOpcode::CmpSwap,
        };
        assert_eq!(c.len(), 1, "step {i}");
        assert_eq!(
            (c[0].wr_id, c[0].opcode, c[0].status, c[0].byte_len),
            (i as u64, opcode, WcStatus::Success, 8),
            "step {i}"
        );
        assert_eq!(word(&pair.a.contents(sink), 0), original, "step {i}");
        assert_eq!(word(&pair.b.contents(target), 1), after, "step {i}");
        assert_eq!(word(&pair.b.contents(target), 0), 0, "neighbour untouched");
        assert_eq!(word(&pair.b.contents(target), 2), 0, "neighbour untouched");
    }
    // The wire: Atomic Requests on QN 1, Atomic Responses on QN 3, each queue's MSNs
    // counting from 1; the Request Identifier comes back in the Response.
    let requests: Vec<_> = pair.sent_by(Side::A).collect();
    let responses: Vec<_> = pair.sent_by(Side::B).collect();
    assert_eq!(requests.len(), 4);
    for (i, (req, resp)) in requests.iter().zip(&responses).enumerate() {
        let n = i as u32 + 1;
        assert_eq!(req.opcode(), Opcode::AtomicRequest);
        assert_eq!(req.bytes.len(), 18 + ATOMIC_REQUEST_LEN);
        assert_eq!(req.bytes[1], 0x4A, "RDMAP control: RV 1, opcode 1010b");
        assert_eq!(untagged_fields(&req.bytes), (1, n, 0));
        let parsed = AtomicRequest::parse(&req.bytes[18..]).expect("request");
        assert_eq!((parsed.stag, parsed.to), (target.raw(), BASE + 8));
        assert_eq!(resp.opcode(), Opcode::AtomicResponse);
        assert_eq!(resp.bytes.len(), 18 + 12);
        assert_eq!(resp.bytes[1], 0x4B, "RDMAP control: RV 1, opcode 1011b");
        assert_eq!(untagged_fields(&resp.bytes), (3, n, 0));
        assert_eq!(resp.bytes[18..22], parsed.request_id.to_be_bytes());
        assert!(req.result.is_ok() && resp.result.is_ok());
    }
}

/// A pair whose A has ORD 2, B's word 1 (holding 10) readable and atomic, and A's sink of
/// `sink_len` octets; A has posted Read 1 of that word into the sink's first 8 octets.
fn read_posted_with_ord_2(sink_len: usize) -> (Pair, Stag, Stag) {
    let mut pair = Pair::with_configs(
        MULPDU,
        rdmap::QpConfig {
            ord: 2,
            ..config_ext()
        },
        config_ext(),
    );
    let target = pair.b.region(
        words(&[0, 10, 0, 0]),
        BASE,
        Access::REMOTE_ATOMIC | Access::REMOTE_READ,
    );
    let sink = pair.a.region(vec![0; sink_len], 0, Access::LOCAL_WRITE);
    pair.a.post(
        1,
        SendOp::Read {
            remote_stag: target,
            remote_to: BASE + 8,
        },
        Some(Sge {
            stag: sink,
            to: 0,
            len: 8,
        }),
    );
    (pair, target, sink)
}

/// RFC 7306 7: "RDMA Read, then Atomic: the Atomic Response will not be generated until the
/// Read Response has been generated"; the Read sees the word before the FetchAdd. Requests
/// beyond ORD wait, counted with the Reads (5.2).
#[test]
fn a_read_before_an_atomic_sees_the_word_before_it_and_ord_counts_both() {
    let (mut pair, target, sink) = read_posted_with_ord_2(32);
    for (wr_id, to) in [(2u64, 8u64), (3, 16)] {
        pair.a.post(
            wr_id,
            SendOp::Atomic {
                remote_stag: target,
                remote_to: BASE + 8,
                op: AtomicOp::fetch_add(1),
            },
            Some(Sge {
                stag: sink,
                to,
                len: 8,
            }),
        );
    }
    // ORD 2: the Read and the first Atomic go out, the second waits for a Response.
    while pair.step(Side::A) {}
    let sent: Vec<_> = pair.sent_by(Side::A).map(|t| t.opcode()).collect();
    assert_eq!(sent, [Opcode::ReadRequest, Opcode::AtomicRequest]);
    pair.pump();
    let c = pair.a.completions();
    let ids: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        ids,
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    let got = pair.a.contents(sink);
    assert_eq!(
        (word(&got, 0), word(&got, 1), word(&got, 2)),
        (10, 10, 11),
        "Read, first FetchAdd's original, second's"
    );
    assert_eq!(word(&pair.b.contents(target), 1), 12);
    // The Read Request and the Atomic Requests share QN 1's MSNs.
    let msns: Vec<_> = pair
        .sent_by(Side::A)
        .map(|t| untagged_fields(&t.bytes).1)
        .collect();
    assert_eq!(msns, [1, 2, 3]);
}

/// RFC 7306 7: "Atomic, then RDMA Read: the Read Response will not be generated until the
/// Atomic Response has been generated" (the Read sees the word after the FetchAdd); and
/// "Send, then Atomic: the Atomic Response will not be generated until the Send has been
/// Completed" (the receive completes before the requester's Atomic does).
#[test]
fn an_atomic_before_a_read_is_seen_by_it_and_a_send_before_it_completes_first() {
    let mut pair = Pair::with_configs(MULPDU, config_ext(), config_ext());
    let target = pair.b.region(
        words(&[0, 10, 0, 0]),
        BASE,
        Access::REMOTE_ATOMIC | Access::REMOTE_READ,
    );
    let rbuf = pair.b.region(vec![0; 16], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(90, rbuf, 0, 16);
    let src = pair.a.region(vec![5; 16], 0, Access::NONE);
    let sink = pair.a.region(vec![0; 16], 0, Access::LOCAL_WRITE);
    pair.a.post(
        1,
        SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 16,
        }),
    );
    atomic(&mut pair, 2, target, BASE + 8, AtomicOp::fetch_add(7), sink);
    pair.a.post(
        3,
        SendOp::Read {
            remote_stag: target,
            remote_to: BASE + 8,
        },
        Some(Sge {
            stag: sink,
            to: 8,
            len: 8,
        }),
    );
    // Everything A has goes out, then B answers all of it.
    pair.pump();
    let got = pair.a.contents(sink);
    assert_eq!((word(&got, 0), word(&got, 1)), (10, 17));
    let b = pair.b.completions();
    assert_eq!((b.len(), b[0].wr_id, b[0].byte_len), (1, 90, 16));
    let a: Vec<_> = pair.a.completions().iter().map(|c| c.wr_id).collect();
    assert_eq!(a, [1, 2, 3]);
    // B's answers: the Atomic Response, then the Read Response.
    let b_sent: Vec<_> = pair.sent_by(Side::B).map(|t| t.opcode()).collect();
    assert_eq!(b_sent, [Opcode::AtomicResponse, Opcode::ReadResponse]);
}

/// Each error of RFC 7306 8.2 (and of the checks 5.2 borrows from RDMA Read) raised from
/// the wire: the responder sends the Terminate named there, with the request's DDP header
/// and no RDMA header; the requester's work request completes with the matching error.
#[test]
fn atomic_errors_get_the_terminate_rfc_7306_names() {
    // (access of B's region, TO, B's error, Terminate layer/etype/code, A's status)
    type Case = (Access, u64, RdmapError, (u8, u8, u8), WcStatus);
    let cases: [Case; 4] = [
        (
            Access::REMOTE_ATOMIC,
            BASE + 4,
            RdmapError::AtomicMisaligned { to: BASE + 4 },
            (0, 2, 7),
            WcStatus::RemoteOperationError,
        ),
        (
            Access::REMOTE_READ | Access::REMOTE_WRITE,
            BASE + 8,
            RdmapError::AtomicAccess {
                stag: Stag(0),
                violation: rdmap::AccessViolation::AccessRights,
            },
            (0, 1, 2),
            WcStatus::RemoteAccessError,
        ),
        (
            Access::REMOTE_ATOMIC,
            BASE + 64,
            RdmapError::AtomicAccess {
                stag: Stag(0),
                violation: rdmap::AccessViolation::BaseBounds,
            },
            (0, 1, 1),
            WcStatus::RemoteAccessError,
        ),
        (
            Access::REMOTE_ATOMIC,
            BASE - 8,
            RdmapError::AtomicAccess {
                stag: Stag(0),
                violation: rdmap::AccessViolation::BaseBounds,
            },
            (0, 1, 1),
            WcStatus::RemoteAccessError,
        ),
    ];
    for (i, (access, to, error, code, status)) in cases.into_iter().enumerate() {
        let (mut pair, target, sink) = atomic_pair(access);
        let before = pair.b.contents(target);
        atomic(&mut pair, 7, target, to, AtomicOp::fetch_add(1), sink);
        pair.pump();
        let request = pair.sent_by(Side::A).next().expect("request");
        let expected = match error {
            RdmapError::AtomicAccess { violation, .. } => RdmapError::AtomicAccess {
                stag: target,
                violation,
            },
            e => e,
        };
        assert_eq!(request.result, Err(expected), "case {i}");
        let term = pair.a.qp.remote_terminate().expect("Terminate");
        assert_eq!((term.layer, term.etype, term.code), code, "case {i}");
        assert_eq!(
            term.ddp_header.map(|h| h.as_bytes().to_vec()),
            Some(request.bytes[..18].to_vec()),
            "case {i}: the request's DDP header"
        );
        assert!(term.read_request.is_none(), "case {i}: no RDMA header");
        let c = pair.a.completions();
        assert_eq!((c[0].wr_id, c[0].status), (7, status), "case {i}");
        assert_eq!(
            pair.b.contents(target),
            before,
            "case {i}: memory untouched"
        );
        assert_eq!(pair.b.qp.state(), QpState::Error);
    }
}

/// An Atomic Operation Code other than FetchAdd and CmpSwap (RFC 7306 5.2.1 rule 4), an
/// Atomic Request of the wrong length, and one Request more than IRD allows.
#[test]
fn unsupported_aopcode_wrong_length_and_beyond_ird_are_refused() {
    // Unsupported AOpCode: a good request with its AOpCode patched to 0001b.
    let (mut pair, target, sink) = atomic_pair(Access::REMOTE_ATOMIC);
    atomic(&mut pair, 1, target, BASE, AtomicOp::fetch_add(1), sink);
    let mut buf = Vec::new();
    pair.a
        .qp
        .poll_transmit(MULPDU, &pair.a.mem, &mut buf)
        .expect("request");
    let mut bad = buf.clone();
    bad[18 + 3] = 0x01;
    assert_eq!(
        pair.b.qp.on_ulpdu(&bad, &pair.b.mem),
        Err(RdmapError::UnsupportedAtomic { aopcode: 1 })
    );
    let t = pair.b.qp.local_terminate().expect("Terminate");
    assert_eq!((t.layer, t.etype, t.code), (0, 2, 6));

    // 51 octets.
    let (mut pair, _, _) = atomic_pair(Access::REMOTE_ATOMIC);
    assert_eq!(
        pair.b.qp.on_ulpdu(&buf[..buf.len() - 1], &pair.b.mem),
        Err(RdmapError::MalformedAtomicRequest { len: 51 })
    );
    let t = pair.b.qp.local_terminate().expect("Terminate");
    assert_eq!((t.layer, t.etype, t.code), (0, 2, 0xFF));
    pair.pump();

    // IRD 2 at B, ORD 4 at A: the third Request is one too many.
    let mut pair = Pair::with_configs(
        MULPDU,
        rdmap::QpConfig {
            ord: 4,
            ..config_ext()
        },
        rdmap::QpConfig {
            ird: 2,
            ..config_ext()
        },
    );
    let target = pair.b.region(words(&[0; 4]), BASE, Access::REMOTE_ATOMIC);
    let sink = pair.a.region(vec![0; 32], 0, Access::LOCAL_WRITE);
    for i in 0..4u64 {
        pair.a.post(
            i,
            SendOp::Atomic {
                remote_stag: target,
                remote_to: BASE,
                op: AtomicOp::fetch_add(1),
            },
            Some(Sge {
                stag: sink,
                to: i * 8,
                len: 8,
            }),
        );
    }
    while pair.step(Side::A) {}
    let third = pair.sent_by(Side::A).nth(2).expect("third request");
    assert_eq!(third.result, Err(RdmapError::IrdExceeded { ird: 2 }));
    pair.pump();
    let term = pair.a.qp.remote_terminate().expect("Terminate");
    assert_eq!((term.layer, term.etype, term.code), (0, 2, 7));
    // None was performed: B answered with the Terminate only.
    assert_eq!(word(&pair.b.contents(target), 0), 0);
}

#[test]
fn write_with_immediate_places_the_data_and_completes_a_receive_with_the_value() {
    let mut pair = Pair::with_configs(MULPDU, config_ext(), config_ext());
    let src = pair.a.region(pattern(3000, 3), 0, Access::NONE);
    let dst = pair.b.region(vec![0; 3000], 0x4000, Access::REMOTE_WRITE);
    let rbuf = pair.b.region(vec![0; 16], 0, Access::LOCAL_WRITE);
    // A receive with no buffer at all takes an Immediate Data message.
    pair.b
        .qp
        .post_recv(
            rdmap::RecvWr {
                wr_id: 70,
                sg_list: Default::default(),
            },
            &pair.b.mem,
        )
        .expect("post_recv");
    pair.b.post_recv(71, rbuf, 0, 16);
    pair.a.post(
        1,
        SendOp::WriteImmediate {
            remote_stag: dst,
            remote_to: 0x4000,
            solicited: false,
            immediate: 0x1122_3344_5566_7788,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 3000,
        }),
    );
    pair.a.post(
        2,
        SendOp::Immediate {
            solicited: true,
            immediate: 42,
        },
        None,
    );
    pair.pump();
    assert_eq!(pair.b.contents(dst), pattern(3000, 3));
    let a = pair.a.completions();
    let a: Vec<_> = a.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect();
    assert_eq!(
        a,
        [
            (1, WcOpcode::Write, WcStatus::Success),
            (2, WcOpcode::Immediate, WcStatus::Success)
        ]
    );
    let b = pair.b.completions();
    let b: Vec<_> = b
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.byte_len, c.immediate, c.solicited))
        .collect();
    assert_eq!(
        b,
        [
            (
                70,
                WcOpcode::RecvImmediate,
                0,
                Some(0x1122_3344_5566_7788),
                false
            ),
            (71, WcOpcode::RecvImmediate, 0, Some(42), true)
        ]
    );
    assert_eq!(pair.b.contents(rbuf), vec![0; 16], "nothing placed");
    // The wire: the Write's segments, then Immediate Data (0x48) and Immediate Data with
    // SE (0x49), 8 octets each, on QN 0 with MSNs 1 and 2.
    let sent: Vec<_> = pair.sent_by(Side::A).collect();
    let imm: Vec<_> = sent
        .iter()
        .filter(|t| t.opcode() != Opcode::Write)
        .collect();
    assert!(sent[..sent.len() - 2]
        .iter()
        .all(|t| t.opcode() == Opcode::Write));
    assert_eq!(imm.len(), 2);
    assert_eq!((imm[0].bytes[1], imm[1].bytes[1]), (0x48, 0x49));
    assert_eq!(untagged_fields(&imm[0].bytes), (0, 1, 0));
    assert_eq!(untagged_fields(&imm[1].bytes), (0, 2, 0));
    assert_eq!(imm[0].bytes[18..], 0x1122_3344_5566_7788u64.to_be_bytes());
    assert_eq!(imm[0].bytes[0] & 0x40, 0x40, "Last");
}

/// RDMA Write with Immediate Data and the Solicited Event (verbs' `IBV_SEND_SOLICITED` on
/// `IBV_WR_RDMA_WRITE_WITH_IMM`): the Immediate Data message is the SE kind (0x49, RFC 7306
/// 6.2) and the peer's receive completes solicited.
#[test]
fn write_with_immediate_and_solicited_event_completes_a_solicited_receive() {
    let mut pair = Pair::with_configs(MULPDU, config_ext(), config_ext());
    let src = pair.a.region(pattern(500, 4), 0, Access::NONE);
    let dst = pair.b.region(vec![0; 500], 0x4000, Access::REMOTE_WRITE);
    let rbuf = pair.b.region(vec![0; 16], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(72, rbuf, 0, 16);
    pair.a.post(
        3,
        SendOp::WriteImmediate {
            remote_stag: dst,
            remote_to: 0x4000,
            solicited: true,
            immediate: 99,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 500,
        }),
    );
    pair.pump();
    assert_eq!(pair.b.contents(dst), pattern(500, 4));
    let b = pair.b.completions();
    let b: Vec<_> = b
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.immediate, c.solicited))
        .collect();
    assert_eq!(b, [(72, WcOpcode::RecvImmediate, Some(99), true)]);
    let sent: Vec<_> = pair.sent_by(Side::A).collect();
    let last = sent.last().expect("sent");
    assert_eq!(last.bytes[1], 0x49, "Immediate Data with Solicited Event");
}

#[test]
fn send_with_immediate_completes_two_receives_in_order() {
    let mut pair = Pair::with_configs(MULPDU, config_ext(), config_ext());
    let src = pair.a.region(pattern(100, 9), 0, Access::NONE);
    let rbuf = pair.b.region(vec![0; 256], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(80, rbuf, 0, 128);
    pair.b.post_recv(81, rbuf, 128, 128);
    pair.a.post(
        5,
        SendOp::SendImmediate {
            solicited: true,
            immediate: 7,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 100,
        }),
    );
    pair.pump();
    let b = pair.b.completions();
    let b: Vec<_> = b
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.byte_len, c.immediate, c.solicited))
        .collect();
    assert_eq!(
        b,
        [
            (80, WcOpcode::Recv, 100, None, false),
            (81, WcOpcode::RecvImmediate, 0, Some(7), true)
        ]
    );
    assert_eq!(pair.b.contents(rbuf)[..100], pattern(100, 9)[..]);
    let a = pair.a.completions();
    assert_eq!(
        (a.len(), a[0].wr_id, a[0].opcode, a[0].status),
        (1, 5, WcOpcode::Send, WcStatus::Success)
    );
}

/// Extensions off (RFC 7306 1.1: never spoken to a peer not known to support them): posting
/// is refused, and a peer that sends them anyway gets RFC 5040's "Unexpected OpCode"; QN 3
/// is an invalid DDP queue. An Immediate Data message of other than 8 octets is an error.
#[test]
fn without_the_extensions_their_messages_are_unexpected_opcodes() {
    let mut off = Pair::new(MULPDU);
    let sink = off.a.region(vec![0; 8], 0, Access::LOCAL_WRITE);
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Atomic {
            remote_stag: Stag(0x100),
            remote_to: 0,
            op: AtomicOp::fetch_add(1),
        },
        sg_list: Sge {
            stag: sink,
            to: 0,
            len: 8,
        }
        .into(),
        signaled: true,
        fence: false,
    };
    assert_eq!(
        off.a.qp.post_send(wr, &off.a.mem),
        Err(RdmapError::ExtensionsOff)
    );
    let imm = SendWr {
        op: SendOp::Immediate {
            solicited: false,
            immediate: 1,
        },
        sg_list: Default::default(),
        ..wr
    };
    assert_eq!(
        off.a.qp.post_send(imm, &off.a.mem),
        Err(RdmapError::ExtensionsOff)
    );

    // What an extended peer sends, to a peer without the extensions.
    let messages: Vec<Vec<u8>> = {
        let (mut pair, target, sink) = atomic_pair(Access::REMOTE_ATOMIC);
        atomic(&mut pair, 1, target, BASE, AtomicOp::fetch_add(1), sink);
        pair.a.post(
            2,
            SendOp::Immediate {
                solicited: false,
                immediate: 1,
            },
            None,
        );
        let mut out = Vec::new();
        loop {
            let mut buf = Vec::new();
            if pair
                .a
                .qp
                .poll_transmit(MULPDU, &pair.a.mem, &mut buf)
                .is_none()
            {
                break;
            }
            out.push(buf);
        }
        out
    };
    for (bytes, opcode) in messages.iter().zip([0x0Au8, 0x08]) {
        let mut plain = Pair::new(MULPDU);
        let rbuf = plain.b.region(vec![0; 64], 0, Access::LOCAL_WRITE);
        plain.b.post_recv(1, rbuf, 0, 64);
        assert_eq!(
            plain.b.qp.on_ulpdu(bytes, &plain.b.mem),
            Err(RdmapError::UnexpectedOpcode { opcode })
        );
        let t = plain.b.qp.local_terminate().expect("Terminate");
        assert_eq!((t.layer, t.etype, t.code), (0, 2, 6));
    }
    // An Atomic Response on QN 3 to a peer without the extensions: DDP invalid QN.
    let mut response = vec![0x41, 0x4B, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0];
    response.extend_from_slice(&[0; 12]);
    let mut plain = Pair::new(MULPDU);
    assert!(matches!(
        plain.b.qp.on_ulpdu(&response, &plain.b.mem),
        Err(RdmapError::Ddp(ddp::DdpError::InvalidQn { qn: 3 }))
    ));

    // Immediate Data of 7 octets to an extended peer.
    let (mut pair, _, _) = atomic_pair(Access::REMOTE_ATOMIC);
    let rbuf = pair.b.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(1, rbuf, 0, 64);
    let short = &messages[1][..messages[1].len() - 1];
    assert_eq!(
        pair.b.qp.on_ulpdu(short, &pair.b.mem),
        Err(RdmapError::BadImmediateLength { len: 7 })
    );
    let t = pair.b.qp.local_terminate().expect("Terminate");
    assert_eq!((t.layer, t.etype, t.code), (0, 2, 0xFF));
}

/// An Atomic Response that answers nothing outstanding is an error (RFC 7306 5.2.2 rule 7).
#[test]
fn an_unexpected_atomic_response_is_an_error() {
    let (mut pair, _, _) = atomic_pair(Access::REMOTE_ATOMIC);
    let mut response = vec![0x41, 0x4B, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0];
    response.extend_from_slice(&[0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(
        pair.a.qp.on_ulpdu(&response, &pair.a.mem),
        Err(RdmapError::UnexpectedAtomicResponse { request_id: 9 })
    );
    let t = pair.a.qp.local_terminate().expect("Terminate");
    assert_eq!((t.layer, t.etype, t.code), (0, 2, 6));
}

/// Posting checks: an Atomic's sink is one element of exactly 8 octets with LOCAL_WRITE; an
/// Immediate Data work request carries no data.
#[test]
fn atomic_and_immediate_work_requests_are_checked_when_posted() {
    let (mut pair, target, _) = atomic_pair(Access::REMOTE_ATOMIC);
    let big = pair.a.region(vec![0; 16], 0, Access::LOCAL_WRITE);
    let read_only = pair.a.region(vec![0; 8], 0, Access::NONE);
    let post = |pair: &mut Pair, op, sg: Option<Sge>| {
        pair.a.qp.post_send(
            SendWr {
                wr_id: 1,
                op,
                sg_list: sg.into(),
                signaled: true,
                fence: false,
            },
            &pair.a.mem,
        )
    };
    let fa = SendOp::Atomic {
        remote_stag: target,
        remote_to: BASE,
        op: AtomicOp::fetch_add(1),
    };
    let sge = |stag, len| Some(Sge { stag, to: 0, len });
    assert_eq!(
        post(&mut pair, fa, sge(big, 16)),
        Err(RdmapError::AtomicSink { len: 16 })
    );
    assert_eq!(
        post(&mut pair, fa, None),
        Err(RdmapError::AtomicSink { len: 0 })
    );
    assert!(matches!(
        post(&mut pair, fa, sge(read_only, 8)),
        Err(RdmapError::LocalAccess { .. })
    ));
    assert_eq!(post(&mut pair, fa, sge(big, 8)), Ok(()));
    let imm = SendOp::Immediate {
        solicited: false,
        immediate: 1,
    };
    assert_eq!(
        post(&mut pair, imm, sge(big, 4)),
        Err(RdmapError::ImmediatePayload { len: 4 })
    );
}

/// RFC 7306 7 with a transport that reads a Read Response's data when it sends (and resends)
/// the segment (`poll_transmit_segment`'s payloads by reference): while it says Read
/// Responses are unacknowledged, an Atomic Request behind them is neither performed nor
/// answered, and the send queue goes on meanwhile; once they are acknowledged it is.
#[test]
fn an_atomic_waits_while_read_responses_before_it_are_unacknowledged() {
    let (mut pair, target, sink) = read_posted_with_ord_2(16);
    atomic(&mut pair, 2, target, BASE + 8, AtomicOp::fetch_add(1), sink);
    while pair.step(Side::A) {}
    let rbuf = pair.a.region(vec![0; 4], 0, Access::LOCAL_WRITE);
    pair.a.post_recv(90, rbuf, 0, 4);
    let src = pair.b.region(vec![7; 4], 0, Access::NONE);
    pair.b.qp.set_read_responses_unacknowledged(true);
    let emit = |pair: &mut Pair| {
        let mut buf = Vec::new();
        pair.b
            .qp
            .poll_transmit_segment(MULPDU, &pair.b.mem, &mut buf)
            .map(|seg| (seg.ulpdu.opcode, seg.payload.is_some()))
    };
    assert_eq!(emit(&mut pair), Some((Opcode::ReadResponse, true)));
    assert_eq!(emit(&mut pair), None, "the Atomic waits");
    assert!(!pair.b.qp.has_pending_transmit());
    assert_eq!(word(&pair.b.contents(target), 1), 10, "not performed yet");
    pair.b.post(
        3,
        SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 4,
        }),
    );
    assert_eq!(
        emit(&mut pair),
        Some((Opcode::Send, true)),
        "the send queue goes"
    );
    assert_eq!(emit(&mut pair), None);
    pair.b.qp.set_read_responses_unacknowledged(false);
    assert!(pair.b.qp.has_pending_transmit());
    assert_eq!(emit(&mut pair), Some((Opcode::AtomicResponse, false)));
    assert_eq!(word(&pair.b.contents(target), 1), 11);
}

/// A message on QN 1 whose segments disagree on the opcode (RFC 5041 4.3: RsvdULP is the
/// message's): a Read Request's first segment, an Atomic Request's last, 52 octets in all, is
/// an unexpected opcode, not an Atomic Request performed.
#[test]
fn a_qn1_message_whose_segments_change_opcode_is_refused() {
    let segment = |opcode: u8, mo: u32, last: bool, payload: &[u8]| {
        let mut s = vec![if last { 0x41 } else { 0x01 }, 0x40 | opcode];
        s.extend_from_slice(&[0; 4]);
        s.extend_from_slice(&1u32.to_be_bytes());
        s.extend_from_slice(&1u32.to_be_bytes());
        s.extend_from_slice(&mo.to_be_bytes());
        s.extend_from_slice(payload);
        s
    };
    // (opcode, MO) of the segments in arrival order, the last one refused: the kinds differ
    // in order; MO 0 repeated as an Atomic after a Read; the Last first, then MO 0 differing.
    let cases: [&[(u8, u32)]; 3] = [
        &[(0x1, 0), (0xA, 28)],
        &[(0x1, 0), (0xA, 0)],
        &[(0xA, 28), (0x1, 0)],
    ];
    for case in cases {
        let (mut pair, target, _) = atomic_pair(Access::REMOTE_ATOMIC);
        let request = AtomicRequest {
            op: AtomicOp::fetch_add(1),
            request_id: 1,
            stag: target.raw(),
            to: BASE + 8,
        };
        let mut body = [0u8; ATOMIC_REQUEST_LEN];
        request.emit(&mut body);
        let (last_opcode, _) = case[case.len() - 1];
        for (i, &(opcode, mo)) in case.iter().enumerate() {
            let part = if mo == 0 { &body[..28] } else { &body[28..] };
            let bytes = segment(opcode, mo, mo != 0, part);
            let got = pair.b.qp.on_ulpdu(&bytes, &pair.b.mem);
            if i + 1 < case.len() {
                assert!(got.is_ok(), "{case:?}: segment {i}: {got:?}");
            } else {
                assert!(
                    matches!(got, Err(RdmapError::UnexpectedOpcode { opcode }) if opcode == last_opcode),
                    "{case:?}: {got:?}"
                );
            }
        }
        assert_eq!(
            word(&pair.b.contents(target), 1),
            10,
            "{case:?}: nothing performed"
        );
    }
}
