//! Two queue pairs back to back: Write, Read and Send of many sizes, ordering, ORD/IRD,
//! RTR, close.

mod common;

use common::*;
use rdmap::qp::{
    QpConfig, QpState, RecvWr, RtrKind, SendOp, SendWr, Sge, SgeList, WcOpcode, WcStatus,
    WorkCompletion,
};
use rdmap::{Access, AccessViolation, Opcode, RdmapError, RegionBuffer, Stag};

const MULPDU: usize = 1000;
const TAGGED_ROOM: usize = MULPDU - 14;
const UNTAGGED_ROOM: usize = MULPDU - 18;
const MIB: usize = 1 << 20;

fn sizes(room: usize) -> Vec<usize> {
    vec![0, 1, room - 1, room, room + 1, MIB]
}

fn ok(wr_id: u64, opcode: WcOpcode, byte_len: u32) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        opcode,
        status: WcStatus::Success,
        byte_len,
        invalidated: None,
        solicited: false,
        immediate: None,
    }
}

#[test]
fn rdma_write_of_each_size_lands_in_the_sink() {
    for len in sizes(TAGGED_ROOM) {
        let mut pair = Pair::new(MULPDU);
        let data = pattern(len, 1);
        let src = pair.a.region(data.clone(), 0x5000, Access::NONE);
        let sink = pair
            .b
            .region(vec![0xEE; len + 8], 0x9_0000, Access::REMOTE_WRITE);
        pair.a.post(
            7,
            SendOp::Write {
                remote_stag: sink,
                remote_to: 0x9_0004,
            },
            Some(Sge {
                stag: src,
                to: 0x5000,
                len: len as u32,
            }),
        );
        pair.pump();
        let got = pair.b.contents(sink);
        assert_eq!(&got[4..4 + len], &data[..], "len {len}");
        assert_eq!(&got[..4], &[0xEE; 4]);
        assert_eq!(&got[4 + len..], &[0xEE; 4]);
        assert_eq!(
            pair.a.completions(),
            vec![ok(7, WcOpcode::Write, len as u32)]
        );
        assert!(pair.b.completions().is_empty(), "a Write is not delivered");
        let segments = pair.sent_by(Side::A).count();
        assert_eq!(segments, len.div_ceil(TAGGED_ROOM).max(1), "len {len}");
        assert!(pair.log.iter().all(|t| t.result.is_ok()));
        assert!(pair.log.last().unwrap().tx.last);
    }
}

#[test]
fn rdma_read_of_each_size_fills_the_local_sink() {
    for len in sizes(TAGGED_ROOM) {
        let mut pair = Pair::new(MULPDU);
        let data = pattern(len, 2);
        let source = pair.b.region(data.clone(), 0x100, Access::REMOTE_READ);
        let sink = pair.a.region(vec![0; len], 0x7000, Access::LOCAL_WRITE);
        pair.a.post(
            9,
            SendOp::Read {
                remote_stag: source,
                remote_to: 0x100,
            },
            Some(Sge {
                stag: sink,
                to: 0x7000,
                len: len as u32,
            }),
        );
        pair.pump();
        assert_eq!(pair.a.contents(sink), data, "len {len}");
        assert_eq!(
            pair.a.completions(),
            vec![ok(9, WcOpcode::Read, len as u32)]
        );
        assert!(pair.b.completions().is_empty());
        let responses = pair
            .sent_by(Side::B)
            .filter(|t| t.opcode() == Opcode::ReadResponse)
            .count();
        assert_eq!(responses, len.div_ceil(TAGGED_ROOM).max(1), "len {len}");
        assert!(pair.log.iter().all(|t| t.result.is_ok()));
    }
}

#[test]
fn send_of_each_size_is_delivered_to_the_posted_buffer() {
    for len in sizes(UNTAGGED_ROOM) {
        let mut pair = Pair::new(MULPDU);
        let data = pattern(len, 3);
        let src = pair.a.region(data.clone(), 0, Access::NONE);
        let rbuf = pair.b.region(vec![0; len + 16], 0x40, Access::LOCAL_WRITE);
        pair.b.post_recv(21, rbuf, 0x40, len as u32 + 16);
        pair.a.post(
            5,
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            Some(Sge {
                stag: src,
                to: 0,
                len: len as u32,
            }),
        );
        pair.pump();
        assert_eq!(&pair.b.contents(rbuf)[..len], &data[..], "len {len}");
        assert_eq!(
            pair.a.completions(),
            vec![ok(5, WcOpcode::Send, len as u32)]
        );
        assert_eq!(
            pair.b.completions(),
            vec![ok(21, WcOpcode::Recv, len as u32)]
        );
        assert_eq!(
            pair.sent_by(Side::A).count(),
            len.div_ceil(UNTAGGED_ROOM).max(1)
        );
    }
}

#[test]
fn send_with_solicited_event_and_invalidate() {
    let mut pair = Pair::new(MULPDU);
    let data = pattern(300, 4);
    let src = pair.a.region(data.clone(), 0, Access::NONE);
    let rbuf = pair.b.region(vec![0; 300], 0, Access::LOCAL_WRITE);
    let advertised = pair.b.region(vec![0; 64], 0, Access::REMOTE_WRITE);
    pair.b.post_recv(1, rbuf, 0, 300);
    pair.b.post_recv(2, rbuf, 0, 300);
    pair.a.post(
        10,
        SendOp::Send {
            solicited: true,
            invalidate: None,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 300,
        }),
    );
    pair.a.post(
        11,
        SendOp::Send {
            solicited: true,
            invalidate: Some(advertised),
        },
        None,
    );
    pair.pump();
    let opcodes: Vec<_> = pair.sent_by(Side::A).map(|t| t.opcode()).collect();
    assert_eq!(opcodes, vec![Opcode::SendSe, Opcode::SendSeInvalidate]);
    let recvs = pair.b.completions();
    assert_eq!(recvs.len(), 2);
    assert!(recvs[0].solicited && recvs[0].invalidated.is_none());
    assert_eq!(recvs[0].byte_len, 300);
    assert_eq!(recvs[1].invalidated, Some(advertised));
    assert!(recvs[1].solicited);
    assert_eq!(recvs[1].byte_len, 0);
    assert_eq!(recvs[1].status, WcStatus::Success);
    // The invalidated STag no longer works for the peer...
    assert_eq!(
        pair.b
            .mem
            .validate(advertised, PD, Access::REMOTE_WRITE, 0, 1)
            .err(),
        Some(AccessViolation::InvalidStag)
    );
    // ...and a Write through it is now refused with invalid STag (DDP 1/1/0).
    pair.a.post(
        12,
        SendOp::Write {
            remote_stag: advertised,
            remote_to: 0,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 4,
        }),
    );
    pair.pump();
    let term = pair.a.qp.remote_terminate().expect("B terminated");
    assert_eq!((term.layer, term.etype, term.code), (1, 1, 0));
}

#[test]
fn plain_send_with_invalidate() {
    let mut pair = Pair::new(MULPDU);
    let src = pair.a.region(vec![9; 10], 0, Access::NONE);
    let rbuf = pair.b.region(vec![0; 10], 0, Access::LOCAL_WRITE);
    let advertised = pair.b.region(vec![0; 8], 0, Access::REMOTE_READ);
    pair.b.post_recv(1, rbuf, 0, 10);
    pair.a.post(
        2,
        SendOp::Send {
            solicited: false,
            invalidate: Some(advertised),
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 10,
        }),
    );
    pair.pump();
    assert_eq!(
        pair.sent_by(Side::A).next().unwrap().opcode(),
        Opcode::SendInvalidate
    );
    let recv = pair.b.completions();
    assert_eq!(recv.len(), 1);
    assert_eq!(recv[0].invalidated, Some(advertised));
    assert!(!recv[0].solicited);
    assert_eq!(pair.b.contents(rbuf), vec![9; 10]);
    assert_eq!(pair.b.mem.info(advertised).map(|i| i.valid), Some(false));
}

#[test]
fn read_responses_follow_request_order_with_several_outstanding() {
    let mut pair = Pair::new(200);
    let mut expected = Vec::new();
    for i in 0..5u64 {
        let len = 150 + 170 * i as usize;
        let data = pattern(len, 10 + i as u8);
        let source = pair.b.region(data.clone(), 0, Access::REMOTE_READ);
        let sink = pair.a.region(vec![0; len], 0, Access::LOCAL_WRITE);
        pair.a.post(
            100 + i,
            SendOp::Read {
                remote_stag: source,
                remote_to: 0,
            },
            Some(Sge {
                stag: sink,
                to: 0,
                len: len as u32,
            }),
        );
        expected.push((sink, data));
    }
    pair.pump();
    // All five Requests went out before any Response (A drains first).
    let requests = pair
        .sent_by(Side::A)
        .filter(|t| t.opcode() == Opcode::ReadRequest)
        .count();
    assert_eq!(requests, 5);
    // Responses come back in request order: the sink STags appear in posting order and
    // are never interleaved.
    let mut order: Vec<u32> = Vec::new();
    for t in pair.sent_by(Side::B) {
        let stag = t.stag().unwrap();
        if order.last() != Some(&stag) {
            assert!(!order.contains(&stag), "responses interleaved");
            order.push(stag);
        }
    }
    let sinks: Vec<u32> = expected.iter().map(|(s, _)| s.raw()).collect();
    assert_eq!(order, sinks);
    for (sink, data) in &expected {
        assert_eq!(&pair.a.contents(*sink), data);
    }
    let ids: Vec<u64> = pair.a.completions().iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![100, 101, 102, 103, 104]);
}

#[test]
fn ord_limits_outstanding_read_requests() {
    let cfg_a = QpConfig { ord: 2, ..config() };
    let mut pair = Pair::with_configs(MULPDU, cfg_a, config());
    for i in 0..5u64 {
        let source = pair
            .b
            .region(pattern(3000, i as u8), 0, Access::REMOTE_READ);
        let sink = pair.a.region(vec![0; 3000], 0, Access::LOCAL_WRITE);
        pair.a.post(
            i,
            SendOp::Read {
                remote_stag: source,
                remote_to: 0,
            },
            Some(Sge {
                stag: sink,
                to: 0,
                len: 3000,
            }),
        );
    }
    pair.pump_alternating();
    let mut outstanding = 0i32;
    let mut max = 0;
    for t in &pair.log {
        match (t.from, t.opcode()) {
            (Side::A, Opcode::ReadRequest) => outstanding += 1,
            (Side::B, Opcode::ReadResponse) if t.tx.last => outstanding -= 1,
            _ => {}
        }
        max = max.max(outstanding);
    }
    assert_eq!(max, 2, "ORD 2 must cap outstanding Read Requests");
    assert_eq!(outstanding, 0);
    let done: Vec<_> = pair.a.completions();
    assert_eq!(done.len(), 5);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
}

#[test]
fn read_request_beyond_ird_is_a_remote_operation_terminate() {
    // A believes it may have 4 Reads outstanding, B grants 2.
    let cfg_a = QpConfig { ord: 4, ..config() };
    let cfg_b = QpConfig { ird: 2, ..config() };
    let mut pair = Pair::with_configs(MULPDU, cfg_a, cfg_b);
    let source = pair.b.region(pattern(64, 1), 0, Access::REMOTE_READ);
    let sink = pair.a.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    for i in 0..3 {
        pair.a.post(
            i,
            SendOp::Read {
                remote_stag: source,
                remote_to: 0,
            },
            Some(Sge {
                stag: sink,
                to: 0,
                len: 64,
            }),
        );
    }
    pair.pump();
    let third = pair
        .sent_by(Side::A)
        .filter(|t| t.opcode() == Opcode::ReadRequest)
        .nth(2)
        .unwrap();
    assert_eq!(third.result, Err(RdmapError::IrdExceeded { ird: 2 }));
    let term = pair.a.qp.remote_terminate().unwrap();
    assert_eq!((term.layer, term.etype, term.code), (0, 2, 7));
    assert!(term.ddp_header.is_some() && term.read_request.is_none());
    assert_eq!(pair.b.qp.state(), QpState::Error);
    assert_eq!(pair.a.qp.state(), QpState::Error);
    // B sent only the Terminate: no Response for the two valid Requests escaped.
    let b_sent: Vec<_> = pair.sent_by(Side::B).map(|t| t.opcode()).collect();
    assert_eq!(b_sent, vec![Opcode::Terminate]);
}

#[test]
fn send_queue_completions_are_in_submission_order() {
    let mut pair = Pair::new(MULPDU);
    let source = pair.b.region(pattern(5000, 1), 0, Access::REMOTE_READ);
    let sink = pair.a.region(vec![0; 5000], 0, Access::LOCAL_WRITE);
    let rbuf = pair.b.region(vec![0; 16], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(50, rbuf, 0, 16);
    pair.a.post(
        1,
        SendOp::Read {
            remote_stag: source,
            remote_to: 0,
        },
        Some(Sge {
            stag: sink,
            to: 0,
            len: 5000,
        }),
    );
    pair.a.post(
        2,
        SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        None,
    );
    // Only A's two messages go out; the Send is handed out but must wait for the Read.
    while pair.step(Side::A) {}
    assert!(pair.a.completions().is_empty());
    pair.pump();
    let ids: Vec<u64> = pair.a.completions().iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![1, 2]);
}

/// Unsignaled work requests (`SendWr::signaled` false) complete and free their send queue
/// entries without reporting success: a later signaled one's completion says they are done.
#[test]
fn unsignaled_requests_complete_unreported_and_free_the_send_queue() {
    let mut pair = Pair::new(MULPDU);
    let depth = config().sq_depth;
    let data = pattern(2 * depth * 16, 4);
    let src = pair.a.region(data.clone(), 0, Access::NONE);
    let sink = pair.b.region(vec![0; data.len()], 0, Access::REMOTE_WRITE);
    // Twice a full send queue: the second round can only be posted if the first one's
    // unreported completions freed their entries.
    for round in 0..2 {
        for k in 0..depth {
            let i = round * depth + k;
            let at = (i * 16) as u64;
            let last = i == 2 * depth - 1;
            pair.a.post_signaled(
                i as u64,
                SendOp::Write {
                    remote_stag: sink,
                    remote_to: at,
                },
                Some(Sge {
                    stag: src,
                    to: at,
                    len: 16,
                }),
                last,
            );
        }
        pair.pump();
        if round == 0 {
            assert!(pair.a.completions().is_empty(), "nothing signaled yet");
        }
    }
    assert_eq!(
        pair.a.completions(),
        vec![ok(2 * depth as u64 - 1, WcOpcode::Write, 16)]
    );
    assert_eq!(pair.b.contents(sink), data);
    assert!(pair.log.iter().all(|t| t.result.is_ok()));
}

/// Sends `len` octets from A to B (a region of its own) and returns B's completions as
/// (wr_id, status).
fn send_to_b(pair: &mut Pair, len: u32) -> Vec<(u64, WcStatus)> {
    let src = pair.a.region(vec![5; len as usize], 0, Access::NONE);
    pair.a.post(
        1,
        SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len,
        }),
    );
    pair.pump();
    pair.b
        .completions()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect()
}

/// A Send longer than the receive it lands in fails the receive with `LocalLengthError` (as
/// siw, and verbs devices: the application learns its buffer was too small), not a flush; the
/// receive after it is flushed. Both ways a Send overruns: its single segment is too long
/// (MessageTooLong), or a later segment starts beyond the receive (an MO past its end). Before,
/// the overrun receive completed `WrFlushError`.
#[test]
fn a_send_longer_than_its_receive_fails_it_with_a_length_error() {
    for (send_len, recv_len) in [(200u32, 100u32), (3 * MULPDU as u32, MULPDU as u32 - 18)] {
        let mut pair = Pair::new(MULPDU);
        let rbuf = pair
            .b
            .region(vec![0; 2 * recv_len as usize], 0, Access::LOCAL_WRITE);
        pair.b.post_recv(9, rbuf, 0, recv_len);
        pair.b.post_recv(10, rbuf, u64::from(recv_len), recv_len);
        assert_eq!(
            send_to_b(&mut pair, send_len),
            vec![
                (9, WcStatus::LocalLengthError),
                (10, WcStatus::WrFlushError)
            ],
            "a Send of {send_len} into {recv_len}"
        );
    }
}

/// A Send landing in a receive whose memory was invalidated after the receive was posted fails
/// that receive with `LocalProtectionError` (verbs' `IBV_WC_LOC_PROT_ERR`), not a flush; the
/// receive after it is flushed.
#[test]
fn a_send_into_a_receive_whose_memory_went_fails_it_with_a_protection_error() {
    let mut pair = Pair::new(MULPDU);
    let rbuf = pair.b.region(vec![0; 128], 0, Access::LOCAL_WRITE);
    let other = pair.b.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(9, rbuf, 0, 64);
    pair.b.post_recv(10, other, 0, 64);
    pair.b.mem.invalidate(rbuf, PD).expect("invalidate");
    assert_eq!(
        send_to_b(&mut pair, 32),
        vec![
            (9, WcStatus::LocalProtectionError),
            (10, WcStatus::WrFlushError)
        ]
    );
}

/// A flushed unsignaled request is reported all the same (only success goes unreported).
#[test]
fn unsignaled_requests_are_reported_when_flushed() {
    let mut pair = Pair::new(MULPDU);
    let send = SendOp::Send {
        solicited: false,
        invalidate: None,
    };
    pair.a.post_signaled(1, send, None, false);
    pair.a.post_signaled(2, send, None, false);
    pair.a.qp.close();
    let flushed: Vec<(u64, WcStatus)> = pair
        .a
        .completions()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        flushed,
        vec![(1, WcStatus::WrFlushError), (2, WcStatus::WrFlushError)]
    );
}

#[test]
fn read_responses_interleave_with_a_long_send() {
    let mut pair = Pair::new(MULPDU);
    // B reads from A while A sends B one MiB.
    let a_source = pair.a.region(pattern(4000, 9), 0, Access::REMOTE_READ);
    let b_sink = pair.b.region(vec![0; 4000], 0, Access::LOCAL_WRITE);
    let a_big = pair.a.region(pattern(MIB, 8), 0, Access::NONE);
    let b_rbuf = pair.b.region(vec![0; MIB], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(1, b_rbuf, 0, MIB as u32);
    pair.a.post(
        2,
        SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        Some(Sge {
            stag: a_big,
            to: 0,
            len: MIB as u32,
        }),
    );
    pair.b.post(
        3,
        SendOp::Read {
            remote_stag: a_source,
            remote_to: 0,
        },
        Some(Sge {
            stag: b_sink,
            to: 0,
            len: 4000,
        }),
    );
    // A has sent one Send segment; B's Read Request arrives.
    assert!(pair.step(Side::A));
    assert!(pair.step(Side::B));
    // From now on A alternates: the 5 Response segments finish within ~10 ULPDUs.
    let mut a_sent = Vec::new();
    for _ in 0..10 {
        assert!(pair.step(Side::A));
        a_sent.push(pair.log.last().unwrap().opcode());
    }
    assert_eq!(
        a_sent
            .iter()
            .filter(|o| **o == Opcode::ReadResponse)
            .count(),
        5
    );
    let read_done = pair.b.completions();
    assert_eq!(read_done, vec![ok(3, WcOpcode::Read, 4000)]);
    pair.pump();
    assert_eq!(pair.b.contents(b_sink), pattern(4000, 9));
    assert_eq!(pair.b.contents(b_rbuf), pattern(MIB, 8));
    assert_eq!(
        pair.b.completions(),
        vec![ok(1, WcOpcode::Recv, MIB as u32)]
    );
}

#[test]
fn a_write_is_never_interleaved_with_a_read_response() {
    let mut pair = Pair::new(MULPDU);
    let a_source = pair.a.region(pattern(4000, 9), 0, Access::REMOTE_READ);
    let b_sink = pair.b.region(vec![0; 4000], 0, Access::LOCAL_WRITE);
    let a_src = pair.a.region(pattern(20_000, 8), 0, Access::NONE);
    let b_target = pair.b.region(vec![0; 20_000], 0, Access::REMOTE_WRITE);
    for i in 0..2 {
        pair.a.post(
            10 + i,
            SendOp::Write {
                remote_stag: b_target,
                remote_to: 0,
            },
            Some(Sge {
                stag: a_src,
                to: 0,
                len: 20_000,
            }),
        );
    }
    pair.b.post(
        3,
        SendOp::Read {
            remote_stag: a_source,
            remote_to: 0,
        },
        Some(Sge {
            stag: b_sink,
            to: 0,
            len: 4000,
        }),
    );
    assert!(pair.step(Side::A));
    assert!(pair.step(Side::B));
    pair.pump_alternating();
    // Tagged messages from A come in runs: each started message finishes before another
    // tagged message starts.
    let mut current: Option<(Opcode, u32)> = None;
    for t in pair.sent_by(Side::A) {
        let key = (t.opcode(), t.stag().unwrap());
        if let Some(cur) = current {
            assert_eq!(cur, key, "tagged messages interleaved");
        }
        current = if t.tx.last { None } else { Some(key) };
    }
    // The Response went out between the two Writes, not after both.
    let opcodes: Vec<_> = pair.sent_by(Side::A).map(|t| t.opcode()).collect();
    let first_response = opcodes
        .iter()
        .position(|o| *o == Opcode::ReadResponse)
        .unwrap();
    assert_eq!(first_response, 20_000usize.div_ceil(TAGGED_ROOM));
    assert_eq!(pair.b.contents(b_sink), pattern(4000, 9));
    assert_eq!(pair.b.contents(b_target), pattern(20_000, 8));
    assert_eq!(pair.a.completions().len(), 2);
}

#[test]
fn zero_length_read_needs_no_valid_stags() {
    let mut pair = Pair::new(MULPDU);
    pair.a.post(
        1,
        SendOp::Read {
            remote_stag: Stag(0xDEAD_BEEF),
            remote_to: u64::MAX,
        },
        None,
    );
    pair.pump();
    assert_eq!(pair.a.completions(), vec![ok(1, WcOpcode::Read, 0)]);
    assert!(pair.log.iter().all(|t| t.result.is_ok()));
}

#[test]
fn rtr_messages_are_accepted() {
    for kind in [RtrKind::Write, RtrKind::Read, RtrKind::Send] {
        let mut pair = Pair::new(MULPDU);
        let mut b = rdmap::qp::QueuePair::new(config());
        b.expect_rtr(kind).unwrap();
        let rbuf = pair.b.region(vec![0; 8], 0, Access::LOCAL_WRITE);
        // Post a user receive before RTS, as rdma_cm users do, then enter RTS.
        b.post_recv(
            RecvWr {
                wr_id: 78,
                sg_list: Sge {
                    stag: rbuf,
                    to: 0,
                    len: 8,
                }
                .into(),
            },
            &pair.b.mem,
        )
        .unwrap();
        b.enter_rts(8, 8);
        pair.b.qp = b;
        pair.a.qp.send_rtr(kind);
        pair.pump();
        let first = &pair.log[0];
        assert!(first.result.is_ok(), "{kind:?}: {:?}", first.result);
        let expected_len = match kind {
            RtrKind::Write => 14,
            RtrKind::Read => 18 + 28,
            RtrKind::Send => 18,
        };
        assert_eq!(first.tx.len, expected_len);
        assert!(
            pair.a.completions().is_empty(),
            "{kind:?}: RTR completes nothing"
        );
        assert!(
            pair.b.completions().is_empty(),
            "{kind:?}: RTR consumes no user receive"
        );
        // The user receive is still there for the first real Send.
        let src = pair.a.region(vec![5; 8], 0, Access::NONE);
        pair.a.post(
            1,
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            Some(Sge {
                stag: src,
                to: 0,
                len: 8,
            }),
        );
        pair.pump();
        assert_eq!(
            pair.b.completions(),
            vec![ok(78, WcOpcode::Recv, 8)],
            "{kind:?}"
        );
    }
}

#[test]
fn close_flushes_outstanding_work() {
    let mut pair = Pair::new(MULPDU);
    let rbuf = pair.a.region(vec![0; 8], 0, Access::LOCAL_WRITE);
    pair.a.post_recv(1, rbuf, 0, 8);
    pair.a.post(
        2,
        SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        None,
    );
    pair.a.qp.close();
    assert_eq!(pair.a.qp.state(), QpState::Closing);
    let flushed = pair.a.completions();
    assert_eq!(flushed.len(), 2);
    assert!(flushed.iter().all(|c| c.status == WcStatus::WrFlushError));
    let mut out = Vec::new();
    assert!(pair
        .a
        .qp
        .poll_transmit(MULPDU, &pair.a.mem, &mut out)
        .is_none());
    assert!(!pair.a.qp.has_pending_transmit());
    assert!(matches!(
        pair.a.qp.post_send(
            SendWr {
                wr_id: 3,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None
                },
                sg_list: SgeList::new(),
                signaled: true,
                fence: false,
            },
            &pair.a.mem
        ),
        Err(RdmapError::InvalidState {
            state: QpState::Closing
        })
    ));
}

#[test]
fn local_checks_on_post() {
    let mut pair = Pair::new(MULPDU);
    let ro = pair.a.region(vec![0; 8], 0, Access::NONE);
    let read_sink = SendWr {
        wr_id: 1,
        op: SendOp::Read {
            remote_stag: Stag(0x100),
            remote_to: 0,
        },
        sg_list: Sge {
            stag: ro,
            to: 0,
            len: 8,
        }
        .into(),
        signaled: true,
        fence: false,
    };
    assert_eq!(
        pair.a.qp.post_send(read_sink, &pair.a.mem),
        Err(RdmapError::LocalAccess {
            stag: ro,
            violation: AccessViolation::AccessRights
        })
    );
    let too_long = SendWr {
        wr_id: 2,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: Sge {
            stag: ro,
            to: 4,
            len: 5,
        }
        .into(),
        signaled: true,
        fence: false,
    };
    assert_eq!(
        pair.a.qp.post_send(too_long, &pair.a.mem),
        Err(RdmapError::LocalAccess {
            stag: ro,
            violation: AccessViolation::BaseBounds
        })
    );
    assert_eq!(
        pair.a.qp.post_recv(
            RecvWr {
                wr_id: 3,
                sg_list: Sge {
                    stag: ro,
                    to: 0,
                    len: 8
                }
                .into()
            },
            &pair.a.mem
        ),
        Err(RdmapError::LocalAccess {
            stag: ro,
            violation: AccessViolation::AccessRights
        })
    );
    let small = QpConfig {
        sq_depth: 1,
        rq_depth: 1,
        ..config()
    };
    let mut qp = rdmap::qp::QueuePair::new(small);
    let send = SendWr {
        wr_id: 4,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: SgeList::new(),
        signaled: true,
        fence: false,
    };
    qp.post_send(send, &pair.a.mem).unwrap();
    assert_eq!(
        qp.post_send(send, &pair.a.mem),
        Err(RdmapError::SendQueueFull)
    );
    let recv = RecvWr {
        wr_id: 5,
        sg_list: SgeList::new(),
    };
    qp.post_recv(recv, &pair.a.mem).unwrap();
    assert_eq!(
        qp.post_recv(recv, &pair.a.mem),
        Err(RdmapError::RecvQueueFull)
    );
}

/// A Send and a Write gathered from several elements of different regions, the Send scattered
/// over a receive buffer of several elements cut elsewhere; a Read's sink of two elements is
/// refused (a Read Request names one sink, RFC 5040 4.4).
#[test]
fn scatter_gather_lists_gather_on_send_and_scatter_on_receive() {
    let mut pair = Pair::new(MULPDU);
    let data = pattern(5000, 9);
    // The source: three pieces in two regions (1500 + 2000 + 1500 octets).
    let r1 = pair.a.region(data[..3500].to_vec(), 0x1_0000, Access::NONE);
    let r2 = pair.a.region(data[3500..].to_vec(), 0x2_0000, Access::NONE);
    let src = SgeList::from_slice(&[
        Sge {
            stag: r1,
            to: 0x1_0000,
            len: 1500,
        },
        Sge {
            stag: r1,
            to: 0x1_0000 + 1500,
            len: 2000,
        },
        Sge {
            stag: r2,
            to: 0x2_0000,
            len: 1500,
        },
    ])
    .unwrap();
    // The receive buffer: four elements (700 + 0 + 3000 + 1300) in one region, out of order.
    let sink = pair.b.region(vec![0; 8000], 0x9_0000, Access::LOCAL_WRITE);
    let recv = SgeList::from_slice(&[
        Sge {
            stag: sink,
            to: 0x9_0000 + 6000,
            len: 700,
        },
        Sge {
            stag: sink,
            to: 0x9_0000,
            len: 0,
        },
        Sge {
            stag: sink,
            to: 0x9_0000,
            len: 3000,
        },
        Sge {
            stag: sink,
            to: 0x9_0000 + 3000,
            len: 1300,
        },
    ])
    .unwrap();
    pair.b
        .qp
        .post_recv(
            RecvWr {
                wr_id: 50,
                sg_list: recv,
            },
            &pair.b.mem,
        )
        .unwrap();
    let send = SendOp::Send {
        solicited: false,
        invalidate: None,
    };
    pair.a
        .qp
        .post_send(
            SendWr {
                wr_id: 1,
                op: send,
                sg_list: src,
                signaled: true,
                fence: false,
            },
            &pair.a.mem,
        )
        .unwrap();
    pair.pump();
    assert_eq!(pair.a.completions(), vec![ok(1, WcOpcode::Send, 5000)]);
    assert_eq!(pair.b.completions(), vec![ok(50, WcOpcode::Recv, 5000)]);
    let got = pair.b.contents(sink);
    assert_eq!(&got[6000..6700], &data[..700]);
    assert_eq!(&got[..3000], &data[700..3700]);
    assert_eq!(&got[3000..4300], &data[3700..]);
    // No segment gathers across an element's end.
    assert!(pair.log.iter().all(|t| t.result.is_ok()));
    assert!(pair.sent_by(Side::A).count() >= 3);

    // The same list as a Write source.
    let target = pair.b.region(vec![0; 5000], 0xA_0000, Access::REMOTE_WRITE);
    let write = SendOp::Write {
        remote_stag: target,
        remote_to: 0xA_0000,
    };
    pair.a
        .qp
        .post_send(
            SendWr {
                wr_id: 2,
                op: write,
                sg_list: src,
                signaled: true,
                fence: false,
            },
            &pair.a.mem,
        )
        .unwrap();
    pair.pump();
    assert_eq!(pair.a.completions(), vec![ok(2, WcOpcode::Write, 5000)]);
    assert_eq!(pair.b.contents(target), data);

    // A Read into two elements is refused when posted; one element is fine.
    let read = SendOp::Read {
        remote_stag: target,
        remote_to: 0xA_0000,
    };
    let local = pair.a.region(vec![0; 5000], 0x3_0000, Access::LOCAL_WRITE);
    let two = SgeList::from_slice(&[
        Sge {
            stag: local,
            to: 0x3_0000,
            len: 100,
        },
        Sge {
            stag: local,
            to: 0x3_0000 + 200,
            len: 100,
        },
    ])
    .unwrap();
    let wr = |sg_list| SendWr {
        wr_id: 3,
        op: read,
        sg_list,
        signaled: true,
        fence: false,
    };
    assert_eq!(
        pair.a.qp.post_send(wr(two), &pair.a.mem),
        Err(RdmapError::ReadSinkNotContiguous)
    );
    // An element outside its region fails the local check, whichever element it is.
    let mut bad = SgeList::from(Sge {
        stag: local,
        to: 0x3_0000,
        len: 10,
    });
    bad.push(Sge {
        stag: r2,
        to: 0x2_0000 + 1400,
        len: 200,
    })
    .unwrap();
    let bad_send = SendWr {
        wr_id: 4,
        op: send,
        sg_list: bad,
        signaled: true,
        fence: false,
    };
    assert!(matches!(
        pair.a.qp.post_send(bad_send, &pair.a.mem),
        Err(RdmapError::LocalAccess { stag, .. }) if stag == r2
    ));
}

/// A shared receive queue (`RecvSource`) over a `Vec`, which the test can look at.
struct Shared(std::sync::Arc<std::sync::Mutex<Vec<RecvWr>>>);

impl rdmap::RecvSource for Shared {
    fn take(&mut self) -> Option<RecvWr> {
        let mut q = self.0.lock().unwrap();
        (!q.is_empty()).then(|| q.remove(0))
    }
}

/// A pair whose B takes its receives from a shared queue of 100 receives of 64 octets into
/// `sink`: (pair, the queue, sink).
fn pair_with_srq() -> (Pair, std::sync::Arc<std::sync::Mutex<Vec<RecvWr>>>, Stag) {
    let mut pair = Pair::new(MULPDU);
    let sink = pair
        .b
        .region(vec![0; 100 * 64], 0x9_0000, Access::LOCAL_WRITE);
    let queue = std::sync::Arc::new(std::sync::Mutex::new(
        (0..100u64)
            .map(|i| RecvWr {
                wr_id: 1000 + i,
                sg_list: Sge {
                    stag: sink,
                    to: 0x9_0000 + i * 64,
                    len: 64,
                }
                .into(),
            })
            .collect::<Vec<_>>(),
    ));
    pair.b
        .qp
        .attach_srq(Box::new(Shared(queue.clone())))
        .unwrap();
    (pair, queue, sink)
}

/// The first segment (not Last) of a hand-made Send `msn` with 8 octets at MO 0.
fn send_first_segment(msn: u32) -> Vec<u8> {
    let mut seg = Vec::new();
    seg.extend_from_slice(&[0x01, 0x43]); // DDP untagged, L=0, DV=1; RDMAP RV=1, Send
    seg.extend_from_slice(&[0, 0, 0, 0]); // reserved for the ULP
    seg.extend_from_slice(&0u32.to_be_bytes()); // QN 0
    seg.extend_from_slice(&msn.to_be_bytes());
    seg.extend_from_slice(&0u32.to_be_bytes()); // MO
    seg.extend_from_slice(&[7; 8]);
    seg
}

/// A shared receive queue (`RecvSource`): Sends take buffers from it in order, one per
/// message; a Send naming an MSN ahead of the next takes nothing from it and gets the RFC 5041
/// 7.1 untagged-buffer Terminate. (A first segment, not Last, 63 messages ahead used to take
/// 64 buffers and be accepted: a peer could hold 64 of a queue shared with other connections
/// per connection, for as long as it kept the connection.)
#[test]
fn sends_take_buffers_from_a_shared_receive_queue() {
    let (mut pair, queue, sink) = pair_with_srq();
    // Receives go to the shared queue now, not the queue pair.
    assert_eq!(
        pair.b.qp.post_recv(
            RecvWr {
                wr_id: 1,
                sg_list: SgeList::new()
            },
            &pair.b.mem
        ),
        Err(RdmapError::SrqAttached)
    );
    let src = pair.a.region(pattern(64 * 3, 3), 0x1000, Access::NONE);
    for m in 0..3u64 {
        let send = SendOp::Send {
            solicited: false,
            invalidate: None,
        };
        let sge = Sge {
            stag: src,
            to: 0x1000 + m * 64,
            len: 64,
        };
        pair.a.post(m, send, Some(sge));
    }
    pair.pump();
    let got: Vec<u64> = pair.b.completions().iter().map(|c| c.wr_id).collect();
    assert_eq!(got, vec![1000, 1001, 1002]);
    assert_eq!(queue.lock().unwrap().len(), 97);
    assert_eq!(&pair.b.contents(sink)[..192], &pattern(64 * 3, 3)[..]);

    // A hand-made first segment of a Send with MSN 4 + 63: nothing is taken, and it is refused.
    let far = send_first_segment(67);
    assert!(pair.b.qp.on_ulpdu(&far, &pair.b.mem).is_err());
    assert_eq!(
        queue.lock().unwrap().len(),
        97,
        "nothing taken for an MSN ahead"
    );
}

/// A Send begun before the one before it ended (its Last segment) takes nothing from a shared
/// receive queue and is refused: in order, a conforming sender ends a message before it
/// begins the next (RFC 5041 5.3). Before, each begun message took a buffer, and a peer
/// sending first segments of MSN 1, 2, 3, ... held up to the queue pair's receive depth of a
/// queue shared with other connections, with no completion to show for it.
#[test]
fn a_send_begun_before_the_last_ended_takes_no_shared_buffer() {
    let (mut pair, queue, _) = pair_with_srq();
    pair.b
        .qp
        .on_ulpdu(&send_first_segment(1), &pair.b.mem)
        .expect("the first message's first segment");
    assert_eq!(queue.lock().unwrap().len(), 99);
    let err = pair
        .b
        .qp
        .on_ulpdu(&send_first_segment(2), &pair.b.mem)
        .expect_err("a second open message");
    assert!(
        matches!(err, RdmapError::Ddp(ddp::DdpError::MsnNoBuffer { .. })),
        "the untagged-buffer Terminate for no buffer: {err:?}"
    );
    assert_eq!(
        queue.lock().unwrap().len(),
        99,
        "one buffer per open message"
    );
}

/// Posts Write `wr_id` of 64 octets from A's `src` to B's `sink`.
fn write_64(pair: &mut Pair, wr_id: u64, src: Stag, sink: Stag) {
    pair.a.post(
        wr_id,
        SendOp::Write {
            remote_stag: sink,
            remote_to: 0,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 64,
        }),
    );
}

/// A request refused at post time (here a local element naming no region) completes in its
/// place (rule 15): after the Write posted before it, even though that Write completes only
/// once it is sent; verbs completes a request whose local checks fail the same way.
#[test]
fn a_request_refused_at_post_time_completes_after_those_before_it() {
    let mut pair = Pair::new(MULPDU);
    let sink = pair.b.region(vec![0; 64], 0, Access::REMOTE_WRITE);
    let src = pair.a.region(vec![7; 64], 0, Access::NONE);
    write_64(&mut pair, 1, src, sink);
    let refused = pair.a.qp.post_send(
        SendWr {
            wr_id: 2,
            op: SendOp::Write {
                remote_stag: sink,
                remote_to: 0,
            },
            sg_list: Sge {
                stag: Stag(src.0 ^ 0x0100_0000),
                to: 0,
                len: 8,
            }
            .into(),
            signaled: true,
            fence: false,
        },
        &pair.a.mem,
    );
    assert!(refused.is_err());
    pair.a
        .qp
        .complete_send_in_error(2, WcOpcode::Write, WcStatus::LocalProtectionError);
    assert!(
        pair.a.completions().is_empty(),
        "the Write before it is not sent yet"
    );
    pair.pump();
    let done = pair.a.completions();
    let order: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        order,
        [(1, WcStatus::Success), (2, WcStatus::LocalProtectionError)]
    );
}

/// A receive refused at post time completes in its place too: after the receives posted
/// before it (verbs completes a receive queue in order), without taking a Send's buffer;
/// the receives posted after it take the Sends that follow, and a flush completes the rest
/// in posting order.
#[test]
fn a_receive_refused_at_post_time_completes_after_those_before_it() {
    let mut pair = Pair::new(MULPDU);
    let src = pair.a.region(pattern(64, 3), 0, Access::NONE);
    let rbuf = pair.b.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    let refuse = |pair: &mut Pair, wr_id: u64| {
        let refused = pair.b.qp.post_recv(
            RecvWr {
                wr_id,
                sg_list: Sge {
                    stag: Stag(rbuf.0 ^ 0x0100_0000),
                    to: 0,
                    len: 8,
                }
                .into(),
            },
            &pair.b.mem,
        );
        assert!(refused.is_err());
        pair.b
            .qp
            .complete_recv_in_error(wr_id, WcStatus::LocalProtectionError);
    };
    pair.b.post_recv(1, rbuf, 0, 64);
    refuse(&mut pair, 2);
    pair.b.post_recv(3, rbuf, 0, 64);
    refuse(&mut pair, 4);
    pair.b.post_recv(5, rbuf, 0, 64);
    assert!(
        pair.b.completions().is_empty(),
        "the refusals wait for the receives before them"
    );
    assert_eq!(pair.b.qp.recv_queue_used(), 5);
    let send = Sge {
        stag: src,
        to: 0,
        len: 64,
    };
    let op = SendOp::Send {
        solicited: false,
        invalidate: None,
    };
    pair.a.post(10, op, Some(send));
    pair.a.post(11, op, Some(send));
    pair.pump();
    let order = |pair: &mut Pair| -> Vec<_> {
        let done = pair.b.completions();
        done.iter().map(|c| (c.wr_id, c.status)).collect()
    };
    assert_eq!(
        order(&mut pair),
        [
            (1, WcStatus::Success),
            (2, WcStatus::LocalProtectionError),
            (3, WcStatus::Success),
            (4, WcStatus::LocalProtectionError),
        ]
    );
    refuse(&mut pair, 6);
    pair.b.qp.close();
    assert_eq!(
        order(&mut pair),
        [
            (5, WcStatus::WrFlushError),
            (6, WcStatus::LocalProtectionError),
        ]
    );
    assert_eq!(pair.b.qp.recv_queue_used(), 0);
    // With nothing outstanding a refusal completes at once.
    refuse(&mut pair, 7);
    let now: Vec<_> = pair.b.completions().iter().map(|c| c.wr_id).collect();
    assert_eq!(now, [7]);
}

/// A transport that still holds a request's FPDUs, to send or resend them from the
/// application's buffer, keeps the request's flush completion back until it has let them go:
/// the completion gives the buffer back to the application. Receives flush at once (nothing
/// is sent from them).
#[test]
fn a_flushed_request_completes_once_the_transport_no_longer_reads_its_buffer() {
    let mut pair = Pair::new(MULPDU);
    let sink = pair.b.region(vec![0; 64], 0, Access::REMOTE_WRITE);
    let src = pair.a.region(vec![7; 64], 0, Access::NONE);
    let rbuf = pair.a.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    pair.a.post_recv(9, rbuf, 0, 64);
    write_64(&mut pair, 1, src, sink);
    pair.a.qp.set_sources_busy(true);
    pair.a.qp.close();
    let now: Vec<_> = pair.a.completions().iter().map(|c| c.wr_id).collect();
    assert_eq!(now, [9], "the receive flushes, the Write waits");
    pair.a.qp.set_sources_busy(false);
    let later = pair.a.completions();
    assert_eq!(
        later
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>(),
        [(1, WcStatus::WrFlushError)]
    );
}

/// A queue pair whose ORD is 0 (an IRD of 0 at the peer, RFC 6581 9.1) refuses a Read or an
/// Atomic when it is posted (it could never be sent, RFC 5040 6.1) instead of holding it at the
/// head of the send queue for ever; a Send still goes.
#[test]
fn a_read_or_atomic_with_no_ord_is_refused_when_posted() {
    let mut a = common::Peer::new(QpConfig {
        ord: 0,
        ..common::config_ext()
    });
    let local = a.region(vec![0; 64], 0x1000, Access::LOCAL_WRITE);
    let sink = Sge {
        stag: local,
        to: 0x1000,
        len: 8,
    };
    for op in [
        SendOp::Read {
            remote_stag: Stag(0x100),
            remote_to: 0,
        },
        SendOp::Atomic {
            remote_stag: Stag(0x100),
            remote_to: 0,
            op: rdmap::AtomicOp::FetchAdd { add: 1, mask: 0 },
        },
    ] {
        let wr = SendWr {
            wr_id: 1,
            op,
            sg_list: sink.into(),
            signaled: true,
            fence: false,
        };
        assert_eq!(
            a.qp.post_send(wr, &a.mem),
            Err(RdmapError::ZeroOrd),
            "{op:?}"
        );
    }
    let send = SendWr {
        wr_id: 2,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: sink.into(),
        signaled: true,
        fence: false,
    };
    assert_eq!(a.qp.post_send(send, &a.mem), Ok(()));
}

/// A Read or Atomic posted in Idle, before the ORD is known, followed by RTS with ORD 0, could
/// never be sent: it completes with a local error when it reaches the head of the send queue
/// (the queue pair terminates, as for any local failure of the head), after the Send posted
/// before it, instead of holding the queue for ever.
#[test]
fn a_read_posted_in_idle_then_ord_0_fails_instead_of_waiting() {
    for op in [
        SendOp::Read {
            remote_stag: Stag(0x100),
            remote_to: 0,
        },
        SendOp::Atomic {
            remote_stag: Stag(0x100),
            remote_to: 0,
            op: rdmap::AtomicOp::FetchAdd { add: 1, mask: 0 },
        },
    ] {
        let cfg = QpConfig {
            ord: 0,
            ..common::config_ext()
        };
        let mut qp = rdmap::qp::QueuePair::new(cfg);
        let mut mem = rdmap::MemoryTable::new();
        let local = mem.register(
            common::PD,
            rdmap::VecBuffer::from_vec(vec![0; 64]),
            0x1000,
            Access::LOCAL_WRITE,
        );
        let sink = Sge {
            stag: local,
            to: 0x1000,
            len: 8,
        };
        let send = SendWr {
            wr_id: 1,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: sink.into(),
            signaled: true,
            fence: false,
        };
        let read = SendWr {
            wr_id: 2,
            op,
            sg_list: sink.into(),
            signaled: true,
            fence: false,
        };
        assert_eq!(qp.post_send(send, &mem), Ok(()));
        assert_eq!(qp.post_send(read, &mem), Ok(()), "{op:?} in Idle");
        qp.enter_rts(4, 0);
        let mut sent = Vec::new();
        for _ in 0..8 {
            let mut buf = Vec::new();
            match qp.poll_transmit(1024, &mem, &mut buf) {
                Some(tx) => sent.push(tx.opcode),
                None => break,
            }
        }
        assert_eq!(
            sent,
            vec![rdmap::Opcode::Send, rdmap::Opcode::Terminate],
            "{op:?}"
        );
        let done: Vec<_> = std::iter::from_fn(|| qp.poll_completion())
            .map(|c| (c.wr_id, c.status))
            .collect();
        assert_eq!(
            done,
            vec![(1, WcStatus::Success), (2, WcStatus::LocalQpOperationError)],
            "{op:?}"
        );
    }
}

/// A fenced request (`SendWr::fence`, verbs' `IBV_SEND_FENCE`) waits until every earlier Read
/// has its Response placed: A posts a Read, a fenced Send, a Read, a plain Send. A sends the
/// first Read Request and then nothing until B's Response has come; only then the fenced Send,
/// and behind it the second Read and the plain Send (not fenced: they go at once). The
/// fenced Send is not held back by a Read posted after it.
#[test]
fn a_fenced_request_waits_for_earlier_reads() {
    let mut pair = Pair::new(MULPDU);
    let source = pair.b.region(pattern(3000, 7), 0, Access::REMOTE_READ);
    let inbox = pair.b.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(100, inbox, 0, 64);
    pair.b.post_recv(101, inbox, 0, 64);
    let sink = pair.a.region(vec![0; 6000], 0, Access::LOCAL_WRITE);
    let read = |to: u64| SendWr {
        wr_id: to,
        op: SendOp::Read {
            remote_stag: source,
            remote_to: 0,
        },
        sg_list: Sge {
            stag: sink,
            to,
            len: 3000,
        }
        .into(),
        signaled: true,
        fence: false,
    };
    let send = |wr_id: u64, fence: bool| SendWr {
        wr_id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: Sge {
            stag: sink,
            to: 0,
            len: 16,
        }
        .into(),
        signaled: true,
        fence,
    };
    let a = &mut pair.a;
    for wr in [read(0), send(1, true), read(3000), send(2, false)] {
        a.qp.post_send(wr, &a.mem).expect("post");
    }
    assert!(pair.step(Side::A), "the first Read Request");
    assert_eq!(pair.log[0].opcode(), Opcode::ReadRequest);
    assert!(
        !pair.step(Side::A),
        "the fenced Send must wait for the Read"
    );
    while pair.step(Side::B) {}
    let responses = pair
        .log
        .iter()
        .filter(|t| t.from == Side::B && t.opcode() == Opcode::ReadResponse)
        .count();
    assert!(responses > 0);
    pair.pump();
    let from_a: Vec<Opcode> = pair
        .sent_by(Side::A)
        .map(|t| t.opcode())
        .filter(|o| *o != Opcode::ReadResponse)
        .collect();
    assert_eq!(
        from_a,
        vec![
            Opcode::ReadRequest,
            Opcode::Send,
            Opcode::ReadRequest,
            Opcode::Send
        ]
    );
    let done: Vec<_> = pair
        .a
        .completions()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        done,
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (3000, WcStatus::Success),
            (2, WcStatus::Success)
        ]
    );
    // Without the fence the Send goes right behind the Read Request.
    let mut pair = Pair::new(MULPDU);
    let source = pair.b.region(pattern(64, 7), 0, Access::REMOTE_READ);
    let inbox = pair.b.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(100, inbox, 0, 64);
    let sink = pair.a.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    let a = &mut pair.a;
    let wrs = [
        SendWr {
            wr_id: 0,
            op: SendOp::Read {
                remote_stag: source,
                remote_to: 0,
            },
            sg_list: Sge {
                stag: sink,
                to: 0,
                len: 64,
            }
            .into(),
            signaled: true,
            fence: false,
        },
        SendWr {
            wr_id: 1,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: Sge {
                stag: sink,
                to: 0,
                len: 16,
            }
            .into(),
            signaled: true,
            fence: false,
        },
    ];
    for wr in wrs {
        a.qp.post_send(wr, &a.mem).expect("post");
    }
    assert!(pair.step(Side::A) && pair.step(Side::A), "both at once");
}

/// A receive buffer longer than any message (its elements, which may overlap, add up past
/// 2^32 - 1 octets, RFC 5041 5.2's MO) is taken, as verbs takes one longer than `max_msg_sz`,
/// and a Send lands in it; also when it was posted before the queue pair was told to expect a
/// peer-to-peer RTR Send (the receives posted before it are queued again behind the RTR's
/// sink). Before, the post failed (`MessageTooLong`), and on a running queue pair the
/// transport failed the connection for it.
#[test]
fn a_receive_longer_than_any_message_is_taken() {
    for rtr_after in [false, true] {
        let mut pair = Pair::new(MULPDU);
        let data = pattern(16, 9);
        let src = pair.a.region(data.clone(), 0, Access::NONE);
        // 512 MiB and one octet, never touched but where the Send lands (calloc's pages).
        const LEN: u32 = (1 << 29) + 1;
        let rbuf = pair.b.region(vec![0; LEN as usize], 0, Access::LOCAL_WRITE);
        let mut sg_list = SgeList::new();
        for _ in 0..rdmap::MAX_SGE {
            sg_list
                .push(Sge {
                    stag: rbuf,
                    to: 0,
                    len: LEN,
                })
                .expect("room");
        }
        assert!(sg_list.total_len() > u64::from(u32::MAX));
        let recv = RecvWr { wr_id: 3, sg_list };
        if rtr_after {
            // Posted while Idle, as the AF_XDP engine posts a connection's first receives,
            // then the RTR Send expected.
            let mut b = rdmap::qp::QueuePair::new(config());
            b.post_recv(recv, &pair.b.mem)
                .expect("a long receive taken");
            b.expect_rtr(RtrKind::Send).expect("expect the RTR");
            b.enter_rts(8, 8);
            pair.b.qp = b;
            pair.a.qp.send_rtr(RtrKind::Send);
        } else {
            pair.b
                .qp
                .post_recv(recv, &pair.b.mem)
                .expect("a long receive taken");
        }
        pair.a.post(
            4,
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
        pair.pump();
        assert!(pair.log.iter().all(|t| t.result.is_ok()), "rtr {rtr_after}");
        assert_eq!(
            pair.b.completions(),
            vec![ok(3, WcOpcode::Recv, 16)],
            "rtr {rtr_after}"
        );
        let mut got = [0u8; 16];
        pair.b
            .mem
            .get(rbuf)
            .expect("registered")
            .read_at(0, &mut got);
        assert_eq!(&got[..], &data[..], "rtr {rtr_after}");
    }
}
