//! `poll_transmit_segment` (payload described, not copied) and the acknowledgement-driven
//! completion policy.
mod common;

use common::*;
use rdmap::qp::{SendOp, Sge, TxCompletion, WcOpcode, WcStatus};
use rdmap::{Access, Opcode};

/// Both transmit calls give the same ULPDUs: the described payload, read from the region,
/// completes the headers `poll_transmit_segment` appended into exactly what
/// `poll_transmit` copies.
#[test]
fn described_segments_equal_copied_segments() {
    let mut copy = Peer::new(config());
    let mut desc = Peer::new(config());
    let data = pattern(5000, 3);
    let mut wr = 1;
    for p in [&mut copy, &mut desc] {
        let src = p.region(data.clone(), 0x1000, Access::LOCAL_WRITE);
        let remote = rdmap::Stag(0x4242_0001);
        p.post(
            wr,
            SendOp::Write {
                remote_stag: remote,
                remote_to: 0x9000,
            },
            Some(Sge {
                stag: src,
                to: 0x1000,
                len: 3000,
            }),
        );
        p.post(
            wr + 1,
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            Some(Sge {
                stag: src,
                to: 0x1100,
                len: 1000,
            }),
        );
        p.post(
            wr + 2,
            SendOp::Read {
                remote_stag: remote,
                remote_to: 0,
            },
            Some(Sge {
                stag: src,
                to: 0x1000,
                len: 10,
            }),
        );
        wr = 1;
    }
    let mut segments = 0;
    loop {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let ta = copy.qp.poll_transmit(1024, &copy.mem, &mut a);
        let tb = desc.qp.poll_transmit_segment(1024, &desc.mem, &mut b);
        let (Some(ta), Some(tb)) = (ta, tb) else {
            assert!(ta.is_none() && tb.is_none());
            break;
        };
        assert_eq!(ta, tb.ulpdu);
        if let Some(p) = tb.payload {
            let (buf, off) = desc
                .mem
                .validate(p.stag, PD, p.access, p.to, u64::from(p.len))
                .expect("valid payload");
            let start = b.len();
            b.resize(start + p.len as usize, 0);
            rdmap::RegionBuffer::read_at(buf, off, &mut b[start..]);
        }
        assert_eq!(a, b, "segment {segments}");
        assert_eq!(b.len(), tb.ulpdu.len);
        assert!(!tb.completes, "hand-off policy never waits");
        segments += 1;
    }
    assert_eq!(segments, 5, "3 Write segments, 1 Send, 1 Read Request");
    // Hand-off: the Write and the Send completed when handed out.
    let done: Vec<_> = desc.completions().iter().map(|c| c.wr_id).collect();
    assert_eq!(done, vec![1, 2]);
}

/// Under `TxCompletion::Acknowledged`, a Send or Write completes only when the transport
/// reports its Last segment acknowledged, in submission order; a Read posted after them
/// completes after them (RFC 5040 5.5 rule 15); unacknowledged work is flushed on close.
#[test]
fn acknowledged_completion_waits_for_the_ack() {
    let mut pair = Pair::new(1024);
    pair.a.qp.set_tx_completion(TxCompletion::Acknowledged);
    let data = pattern(3000, 9);
    let src = pair.a.region(data.clone(), 0, Access::NONE);
    let dst = pair.b.region(vec![0; 3000], 0, Access::REMOTE_WRITE);
    pair.a.post(
        1,
        SendOp::Write {
            remote_stag: dst,
            remote_to: 0,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 3000,
        }),
    );
    pair.a.post(
        2,
        SendOp::Write {
            remote_stag: dst,
            remote_to: 0,
        },
        Some(Sge {
            stag: src,
            to: 0,
            len: 10,
        }),
    );
    let mut completes = Vec::new();
    let mut out = Vec::new();
    while let Some(seg) = pair.a.qp.poll_transmit_segment(1024, &pair.a.mem, &mut out) {
        assert_eq!(seg.ulpdu.opcode, Opcode::Write);
        completes.push((seg.ulpdu.last, seg.completes));
        out.clear();
    }
    // Three segments of the first Write (only the Last completes) and one of the second.
    assert_eq!(
        completes,
        vec![(false, false), (false, false), (true, true), (true, true)]
    );
    assert!(pair.a.completions().is_empty(), "nothing before the ACK");
    assert_eq!(pair.a.qp.awaiting_acknowledgement(), 2);
    pair.a.qp.message_acknowledged();
    let done = pair.a.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (
            done[0].wr_id,
            done[0].opcode,
            done[0].status,
            done[0].byte_len
        ),
        (1, WcOpcode::Write, WcStatus::Success, 3000)
    );
    // Second Write handed out but not acknowledged: closing flushes it.
    pair.a.qp.close();
    let done = pair.a.completions();
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].wr_id, done[0].status), (2, WcStatus::WrFlushError));
    // A late report changes nothing.
    pair.a.qp.message_acknowledged();
    assert!(pair.a.completions().is_empty());
}

/// A Write whose source region is deregistered after a first segment went out: the next
/// segment is the Terminate instead (RFC 5040 7.1 rule 1: local catastrophic, no headers),
/// the work request completes with a local protection error, and nothing follows; the same
/// from both transmit calls, and for a region invalidated instead.
#[test]
fn a_source_gone_mid_message_sends_the_terminate_instead() {
    for (described, invalidated) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut p = Peer::new(config());
        let src = p.region(pattern(3000, 5), 0, Access::NONE);
        p.post(
            7,
            SendOp::Write {
                remote_stag: rdmap::Stag(0x4242_0001),
                remote_to: 0,
            },
            Some(Sge {
                stag: src,
                to: 0,
                len: 3000,
            }),
        );
        let poll = |p: &mut Peer, out: &mut Vec<u8>| {
            if described {
                p.qp.poll_transmit_segment(1024, &p.mem, out)
                    .map(|s| s.ulpdu)
            } else {
                p.qp.poll_transmit(1024, &p.mem, out)
            }
        };
        let mut out = Vec::new();
        let first = poll(&mut p, &mut out).expect("first segment");
        assert_eq!((first.opcode, first.last), (Opcode::Write, false));
        if invalidated {
            assert!(p.mem.invalidate(src, config().pd).is_ok());
        } else {
            assert!(p.mem.deregister(src).is_ok());
        }
        out.clear();
        let t = poll(&mut p, &mut out).expect("the Terminate");
        assert_eq!(
            (t.opcode, t.last, t.len),
            (Opcode::Terminate, true, out.len())
        );
        let header = rdmap::wire::TerminateHeader::parse(&out[18..]).expect("header");
        assert_eq!(
            (header.layer, header.etype, header.code),
            (
                rdmap::wire::layer::RDMAP,
                rdmap::wire::rdmap_etype::LOCAL_CATASTROPHIC,
                0
            )
        );
        assert!(
            poll(&mut p, &mut Vec::new()).is_none(),
            "described {described}"
        );
        let wc = p.completions();
        assert_eq!(wc.len(), 1, "described {described}");
        assert_eq!(
            (wc[0].wr_id, wc[0].status),
            (7, WcStatus::LocalProtectionError)
        );
    }
}
