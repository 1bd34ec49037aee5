//! Inline work requests (`post_send_inline`, verbs' `IBV_SEND_INLINE`): the same messages on
//! the wire as work requests gathered from registered memory, the payload copied at post time.
mod common;

use common::*;
use rdmap::qp::{InlineSendWr, SendOp, Sge, WcOpcode, WcStatus};
use rdmap::{Access, AtomicOp, InlineData, RdmapError, Stag, MAX_INLINE_DATA};

const REMOTE: Stag = Stag(0x4242_0001);

fn ops() -> [SendOp; 4] {
    [
        SendOp::Write {
            remote_stag: REMOTE,
            remote_to: 0x9000,
        },
        SendOp::Send {
            solicited: true,
            invalidate: None,
        },
        SendOp::WriteImmediate {
            remote_stag: REMOTE,
            remote_to: 0x9100,
            solicited: false,
            immediate: 0x0102_0304_0506_0708,
        },
        SendOp::SendImmediate {
            solicited: false,
            immediate: 7,
        },
    ]
}

/// Every inlinable operation, at lengths from zero to the most a work request holds, with a
/// MULPDU that cuts the longer ones into several segments: the inline queue pair emits the
/// very octets the gathering one does, through both transmit calls, and completes the same.
#[test]
fn inline_messages_equal_gathered_ones() {
    for len in [0, 1, 63, 100, MAX_INLINE_DATA] {
        let data = pattern(len, len as u8);
        let (mut gathered, mut inline) = (Peer::new(config_ext()), Peer::new(config_ext()));
        let src = gathered.region(data.clone(), 0x1000, Access::LOCAL_WRITE);
        for (i, op) in ops().into_iter().enumerate() {
            let wr_id = i as u64 + 1;
            let sge = (len > 0).then_some(Sge {
                stag: src,
                to: 0x1000,
                len: len as u32,
            });
            gathered.post(wr_id, op, sge);
            inline
                .qp
                .post_send_inline(InlineSendWr {
                    wr_id,
                    op,
                    data: InlineData::new(&data).unwrap(),
                    signaled: true,
                    fence: false,
                })
                .expect("post_send_inline");
        }
        let mut segments = 0;
        loop {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let ta = gathered.qp.poll_transmit(80, &gathered.mem, &mut a);
            // Described transmit: an inline payload is never left in a region.
            let tb = inline.qp.poll_transmit_segment(80, &inline.mem, &mut b);
            let (Some(ta), Some(tb)) = (ta, tb) else {
                assert!(ta.is_none() && tb.is_none(), "len {len}");
                break;
            };
            assert_eq!(tb.payload, None, "len {len}, segment {segments}");
            assert_eq!(ta, tb.ulpdu, "len {len}, segment {segments}");
            assert_eq!(a, b, "len {len}, segment {segments}");
            segments += 1;
        }
        // Each of the 4 messages is ceil(len / payload room) segments (one at least), and the
        // two with Immediate Data have theirs after them.
        assert!(segments >= 6, "len {len}: {segments} segments");
        let done = |p: &mut Peer| {
            p.completions()
                .iter()
                .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len))
                .collect::<Vec<_>>()
        };
        let expect = done(&mut gathered);
        assert_eq!(expect.len(), 4);
        assert_eq!(done(&mut inline), expect, "len {len}");
    }
}

/// The payload reaches the peer's buffers: a Write into its region, a Send into its posted
/// receive; the sender's copy is its own (the slice it came from may change at once).
#[test]
fn inline_payload_is_placed_at_the_peer() {
    let mut pair = Pair::new(64);
    let sink = pair.b.region(
        vec![0; 512],
        0x9000,
        Access::REMOTE_WRITE | Access::LOCAL_WRITE,
    );
    let recv = pair.b.region(vec![0; 512], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(7, recv, 0, 512);
    let mut buf = pattern(200, 9);
    let write = InlineData::new(&buf).unwrap();
    buf.fill(0xEE);
    let send = InlineData::gather([&pattern(50, 1)[..], &pattern(50, 2)]).unwrap();
    for (wr_id, op, data) in [
        (
            1,
            SendOp::Write {
                remote_stag: sink,
                remote_to: 0x9010,
            },
            write,
        ),
        (
            2,
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            send,
        ),
    ] {
        pair.a
            .qp
            .post_send_inline(InlineSendWr {
                wr_id,
                op,
                data,
                signaled: true,
                fence: false,
            })
            .unwrap();
    }
    pair.pump();
    assert!(pair.log.iter().all(|t| t.result.is_ok()));
    assert_eq!(pair.b.contents(sink)[0x10..0x10 + 200], pattern(200, 9)[..]);
    let received = pair.b.contents(recv);
    assert_eq!(received[..50], pattern(50, 1)[..]);
    assert_eq!(received[50..100], pattern(50, 2)[..]);
    let a: Vec<_> = pair
        .a
        .completions()
        .iter()
        .map(|c| (c.wr_id, c.status, c.byte_len))
        .collect();
    assert_eq!(
        a,
        vec![(1, WcStatus::Success, 200), (2, WcStatus::Success, 100)]
    );
    let b = pair.b.completions();
    assert_eq!(b.len(), 1);
    assert_eq!(
        (b[0].wr_id, b[0].opcode, b[0].byte_len),
        (7, WcOpcode::Recv, 100)
    );
}

/// A Read, an Atomic or a lone Immediate Data message has no payload to carry inline; the
/// send queue's depth and the extensions switch hold as for any work request.
#[test]
fn inline_refuses_what_cannot_carry_it() {
    let mut p = Peer::new(config_ext());
    let data = InlineData::new(&[1, 2, 3]).unwrap();
    let post = |p: &mut Peer, op| {
        p.qp.post_send_inline(InlineSendWr {
            wr_id: 1,
            op,
            data,
            signaled: true,
            fence: false,
        })
    };
    for (op, opcode) in [
        (
            SendOp::Read {
                remote_stag: REMOTE,
                remote_to: 0,
            },
            WcOpcode::Read,
        ),
        (
            SendOp::Atomic {
                remote_stag: REMOTE,
                remote_to: 0,
                op: AtomicOp::FetchAdd { add: 1, mask: 0 },
            },
            WcOpcode::FetchAdd,
        ),
        (
            SendOp::Immediate {
                solicited: false,
                immediate: 1,
            },
            WcOpcode::Immediate,
        ),
    ] {
        assert_eq!(
            post(&mut p, op),
            Err(RdmapError::NotInlinable),
            "{opcode:?}"
        );
    }
    let send = SendOp::Send {
        solicited: false,
        invalidate: None,
    };
    for _ in 0..config().sq_depth {
        post(&mut p, send).unwrap();
    }
    assert_eq!(post(&mut p, send), Err(RdmapError::SendQueueFull));
    let mut plain = Peer::new(config());
    let imm = SendOp::SendImmediate {
        solicited: false,
        immediate: 1,
    };
    assert_eq!(post(&mut plain, imm), Err(RdmapError::ExtensionsOff));
}

/// An inline Write the peer refuses fails with the peer's error (its Terminate names it) and
/// the inline work requests queued behind it are flushed like any other.
#[test]
fn queued_inline_requests_are_flushed() {
    let mut pair = Pair::new(64);
    // A Write to an STag the peer never registered: the peer answers with a Terminate.
    for wr_id in 1..=3 {
        pair.a
            .qp
            .post_send_inline(InlineSendWr {
                wr_id,
                op: SendOp::Write {
                    remote_stag: REMOTE,
                    remote_to: 0,
                },
                data: InlineData::new(&pattern(150, wr_id as u8)).unwrap(),
                signaled: true,
                fence: false,
            })
            .unwrap();
    }
    // The first segment of the first Write goes; the peer's Terminate comes back before
    // anything else leaves.
    assert!(pair.step(Side::A));
    assert!(pair.step(Side::B));
    pair.pump();
    let done: Vec<_> = pair
        .a
        .completions()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        done,
        vec![
            (1, WcStatus::RemoteAccessError),
            (2, WcStatus::WrFlushError),
            (3, WcStatus::WrFlushError)
        ]
    );
    // Only the one segment and the Terminate went over the wire.
    assert_eq!(pair.log.len(), 2, "{:?}", pair.log);
}
