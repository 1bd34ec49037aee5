//! Every receiver check with its exact Terminate (RFC 5040 4.8, 7; RFC 5041 7.2), the
//! Terminate being sent first and once, and both sides flushing.

mod common;

use common::*;
use ddp::{DdpError, DdpHeader};
use rdmap::qp::{QpConfig, QpState, QueuePair, RtrKind, SendOp, Sge, TxUlpdu, WcOpcode, WcStatus};
use rdmap::wire::{ReadRequest, TerminateHeader};
use rdmap::{Access, AccessViolation, Opcode, PdId, RdmapError, Stag, TerminateCause};

const MULPDU: usize = 512;
const B_SEND: u64 = 900;
const B_RECV: u64 = 901;
const A_RECV: u64 = 800;

/// A pair where B has a Send queued (it must never go out) and, if `b_recv`, a posted
/// receive; A has a posted receive. All of these must be flushed by the Terminate.
fn pair(b_recv: bool) -> Pair {
    let mut pair = Pair::new(MULPDU);
    post_work(&mut pair, b_recv);
    pair
}

/// A's posted receive, B's (if `b_recv`) and B's queued Send of [`pair`].
fn post_work(pair: &mut Pair, b_recv: bool) {
    let a_rbuf = pair.a.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    pair.a.post_recv(A_RECV, a_rbuf, 0, 64);
    if b_recv {
        let b_rbuf = pair.b.region(vec![0; 64], 0, Access::LOCAL_WRITE);
        pair.b.post_recv(B_RECV, b_rbuf, 0, 64);
    }
    pair.b.post(
        B_SEND,
        SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        None,
    );
}

fn a_source(pair: &mut Pair, len: usize) -> Sge {
    let stag = pair.a.region(pattern(len, 1), 0, Access::NONE);
    Sge {
        stag,
        to: 0,
        len: len as u32,
    }
}

fn a_sink(pair: &mut Pair, len: usize) -> Sge {
    let stag = pair.a.region(vec![0; len], 0, Access::LOCAL_WRITE);
    Sge {
        stag,
        to: 0,
        len: len as u32,
    }
}

fn write(pair: &mut Pair, remote_stag: Stag, remote_to: u64, len: usize) {
    let local = a_source(pair, len);
    pair.a.post(
        1,
        SendOp::Write {
            remote_stag,
            remote_to,
        },
        Some(local),
    );
    pair.pump();
}

fn read(pair: &mut Pair, remote_stag: Stag, remote_to: u64, len: usize) {
    let local = a_sink(pair, len);
    pair.a.post(
        2,
        SendOp::Read {
            remote_stag,
            remote_to,
        },
        Some(local),
    );
    pair.pump();
}

fn send(pair: &mut Pair, len: usize, invalidate: Option<Stag>) {
    let local = a_source(pair, len);
    pair.a.post(
        3,
        SendOp::Send {
            solicited: false,
            invalidate,
        },
        Some(local),
    );
    pair.pump();
}

/// Feeds crafted bytes to B as if A had sent them, then lets the Terminate flow.
fn inject(pair: &mut Pair, bytes: Vec<u8>) {
    let result = pair.b.qp.on_ulpdu(&bytes, &pair.b.mem);
    pair.log.push(Transfer {
        from: Side::A,
        tx: TxUlpdu {
            opcode: Opcode::Send,
            last: true,
            len: bytes.len(),
        },
        bytes,
        result,
    });
    pair.pump();
}

fn untagged(ctrl: u8, rdmap: u8, qn: u32, msn: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![ctrl, rdmap, 0, 0, 0, 0];
    v.extend_from_slice(&qn.to_be_bytes());
    v.extend_from_slice(&msn.to_be_bytes());
    v.extend_from_slice(&0u32.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

fn tagged(ctrl: u8, rdmap: u8, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![ctrl, rdmap];
    v.extend_from_slice(&stag.to_be_bytes());
    v.extend_from_slice(&to.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// Checks the whole Terminate story and returns the Terminate B sent.
fn verify(
    pair: &Pair,
    error: RdmapError,
    code: (u8, u8, u8),
    with_ddp_header: bool,
    with_read_request: bool,
) -> TerminateHeader {
    // Exactly one inbound segment failed, with the expected error.
    let failed: Vec<_> = pair
        .log
        .iter()
        .enumerate()
        .filter(|(_, t)| t.from == Side::A && t.result.is_err())
        .collect();
    assert_eq!(failed.len(), 1, "one failing segment: {failed:?}");
    let (fail_at, offending) = failed[0];
    assert_eq!(offending.result.as_ref().unwrap_err(), &error);
    assert_eq!(
        error.terminate_code().map(|c| (c.layer, c.etype, c.code)),
        Some(code)
    );

    // B sent nothing after the error but one Terminate, and nothing after it.
    let b_after: Vec<_> = pair.log[fail_at..]
        .iter()
        .filter(|t| t.from == Side::B)
        .collect();
    assert_eq!(
        b_after.len(),
        1,
        "B sends exactly one ULPDU after the error"
    );
    let term = b_after[0];
    assert_eq!(term.opcode(), Opcode::Terminate);
    assert!(
        pair.sent_by(Side::B).all(|t| t.opcode() != Opcode::Send),
        "B's queued Send must never go out"
    );

    // The Terminate's DDP header: untagged, L, QN 2, MSN 1, MO 0, opcode 7.
    let (DdpHeader::Untagged(h), payload) = DdpHeader::parse(&term.bytes).unwrap() else {
        panic!("Terminate must be untagged");
    };
    assert!(h.last);
    assert_eq!((h.qn, h.msn, h.mo), (2, 1, 0));
    assert_eq!(h.rsvd_ulp, [0x47, 0, 0, 0, 0]);
    let header = TerminateHeader::parse(payload).unwrap();
    assert_eq!((header.layer, header.etype, header.code), code);

    // Figure 10 headers.
    assert_eq!(header.ddp_header.is_some(), with_ddp_header, "D bit");
    if let Some(copied) = header.ddp_header {
        let n = copied.as_bytes().len();
        assert_eq!(copied.as_bytes(), &offending.bytes[..n]);
        assert_eq!(header.segment_len, Some((offending.bytes.len() - n) as u16));
    }
    assert_eq!(header.read_request.is_some(), with_read_request, "R bit");
    if let Some(rr) = header.read_request {
        let sent = ReadRequest::parse(&offending.bytes[18..]).unwrap();
        assert_eq!(rr, sent);
    }

    // B is in Error with everything flushed.
    assert_eq!(pair.b.qp.state(), QpState::Error);
    assert!(!pair.b.qp.has_pending_transmit());
    assert_eq!(pair.b.qp.local_terminate(), Some(header));

    // A reports the Terminate and is in Error.
    assert_eq!(pair.a.qp.remote_terminate(), Some(header));
    assert_eq!(pair.a.qp.state(), QpState::Error);
    header
}

fn assert_b_flushed(pair: &mut Pair, with_recv: bool) {
    let done = pair.b.completions();
    let mut expected = vec![(B_SEND, WcOpcode::Send)];
    if with_recv {
        expected.push((B_RECV, WcOpcode::Recv));
    }
    let got: Vec<_> = done
        .iter()
        .filter(|c| c.status == WcStatus::WrFlushError)
        .map(|c| (c.wr_id, c.opcode))
        .collect();
    assert_eq!(got, expected, "{done:?}");
}

fn assert_a_flushed(pair: &mut Pair) -> Vec<rdmap::qp::WorkCompletion> {
    let done = pair.a.completions();
    assert!(
        done.iter()
            .any(|c| c.wr_id == A_RECV && c.status == WcStatus::WrFlushError),
        "{done:?}"
    );
    done
}

fn sink_error(stag: Stag, violation: AccessViolation) -> RdmapError {
    RdmapError::SinkAccess { stag, violation }
}

fn source_error(stag: Stag, violation: AccessViolation) -> RdmapError {
    RdmapError::SourceAccess { stag, violation }
}

/// Standard flow for an RDMA Write refused by B.
fn write_case(
    setup: impl FnOnce(&mut Pair) -> (Stag, u64, usize),
    violation: AccessViolation,
    code: (u8, u8, u8),
) {
    let mut pair = pair(true);
    let (stag, to, len) = setup(&mut pair);
    write(&mut pair, stag, to, len);
    verify(&pair, sink_error(stag, violation), code, true, false);
    assert_b_flushed(&mut pair, true);
    let a_done = assert_a_flushed(&mut pair);
    // The Write completed when handed out (completion policy), before the Terminate.
    assert_eq!(a_done[0].wr_id, 1);
    assert_eq!(a_done[0].status, WcStatus::Success);
}

/// Standard flow for an RDMA Read Request refused by B (the data source).
fn read_case(
    setup: impl FnOnce(&mut Pair) -> (Stag, u64, usize),
    violation: AccessViolation,
    code: (u8, u8, u8),
) {
    let mut pair = pair(true);
    let (stag, to, len) = setup(&mut pair);
    read(&mut pair, stag, to, len);
    verify(&pair, source_error(stag, violation), code, true, true);
    assert_b_flushed(&mut pair, true);
    let a_done = assert_a_flushed(&mut pair);
    // The Read named by the Terminate fails with the remote error, not a flush.
    let read_wc = a_done.iter().find(|c| c.wr_id == 2).unwrap();
    assert_eq!(read_wc.status, WcStatus::RemoteAccessError);
    assert_eq!(read_wc.opcode, WcOpcode::Read);
}

#[test]
fn write_invalid_stag() {
    write_case(
        |_| (Stag(0x0012_3401), 0, 8),
        AccessViolation::InvalidStag,
        (1, 1, 0),
    );
}

#[test]
fn write_stale_key_after_reregistration() {
    write_case(
        |p| {
            let old = p.b.region(vec![0; 64], 0, Access::REMOTE_WRITE);
            let new =
                p.b.mem
                    .reregister(old, PD, 0, Access::REMOTE_WRITE)
                    .unwrap();
            assert_ne!(new, old);
            (old, 0, 8)
        },
        AccessViolation::InvalidStag,
        (1, 1, 0),
    );
}

#[test]
fn write_bounds_violation() {
    write_case(
        |p| {
            (
                p.b.region(vec![0; 64], 0x100, Access::REMOTE_WRITE),
                0x100 + 60,
                10,
            )
        },
        AccessViolation::BaseBounds,
        (1, 1, 1),
    );
}

#[test]
fn write_without_remote_write_access() {
    write_case(
        |p| {
            (
                p.b.region(vec![0; 64], 0, Access::REMOTE_READ | Access::LOCAL_WRITE),
                0,
                8,
            )
        },
        AccessViolation::AccessRights,
        (1, 1, 0),
    );
}

#[test]
fn write_pd_mismatch() {
    write_case(
        |p| {
            let stag =
                p.b.mem
                    .register(PdId(2), rdmap::VecBuffer::zeroed(64), 0, Access::ALL);
            (stag, 0, 8)
        },
        AccessViolation::StagNotAssociated,
        (1, 1, 2),
    );
}

#[test]
fn write_to_wrap() {
    write_case(
        |p| {
            (
                p.b.region(vec![0; 64], u64::MAX - 63, Access::REMOTE_WRITE),
                u64::MAX - 5,
                10,
            )
        },
        AccessViolation::ToWrap,
        (1, 1, 3),
    );
}

#[test]
fn read_invalid_stag() {
    read_case(
        |_| (Stag(0x0055_5501), 0, 8),
        AccessViolation::InvalidStag,
        (0, 1, 0),
    );
}

#[test]
fn read_stale_key_after_reregistration() {
    read_case(
        |p| {
            let old = p.b.region(vec![0; 64], 0, Access::REMOTE_READ);
            p.b.mem.reregister(old, PD, 0, Access::REMOTE_READ).unwrap();
            (old, 0, 8)
        },
        AccessViolation::InvalidStag,
        (0, 1, 0),
    );
}

#[test]
fn read_bounds_violation() {
    read_case(
        |p| (p.b.region(vec![0; 64], 0, Access::REMOTE_READ), 32, 33),
        AccessViolation::BaseBounds,
        (0, 1, 1),
    );
}

#[test]
fn read_without_remote_read_access() {
    read_case(
        |p| (p.b.region(vec![0; 64], 0, Access::REMOTE_WRITE), 0, 8),
        AccessViolation::AccessRights,
        (0, 1, 2),
    );
}

#[test]
fn read_pd_mismatch() {
    read_case(
        |p| {
            let stag =
                p.b.mem
                    .register(PdId(3), rdmap::VecBuffer::zeroed(64), 0, Access::ALL);
            (stag, 0, 8)
        },
        AccessViolation::StagNotAssociated,
        (0, 1, 3),
    );
}

#[test]
fn read_to_wrap() {
    read_case(
        |p| {
            (
                p.b.region(vec![0; 64], u64::MAX - 63, Access::REMOTE_READ),
                u64::MAX - 5,
                10,
            )
        },
        AccessViolation::ToWrap,
        (0, 1, 4),
    );
}

#[test]
fn send_without_posted_receive() {
    let mut pair = pair(false);
    send(&mut pair, 10, None);
    verify(
        &pair,
        RdmapError::Ddp(DdpError::MsnNoBuffer { msn: 1 }),
        (1, 2, 2),
        true,
        false,
    );
    assert_b_flushed(&mut pair, false);
    assert_a_flushed(&mut pair);
}

#[test]
fn send_longer_than_posted_buffer() {
    let mut pair = pair(true);
    send(&mut pair, 65, None);
    verify(
        &pair,
        RdmapError::Ddp(DdpError::MessageTooLong),
        (1, 2, 5),
        true,
        false,
    );
    // The receive the Send was aimed at fails with a length error (as siw); B's own Send is
    // flushed.
    let done = pair.b.completions();
    let got: Vec<_> = done.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect();
    assert!(
        got.contains(&(B_RECV, WcOpcode::Recv, WcStatus::LocalLengthError))
            && got.contains(&(B_SEND, WcOpcode::Send, WcStatus::WrFlushError))
            && got.len() == 2,
        "{done:?}"
    );
    assert_a_flushed(&mut pair);
}

#[test]
fn send_with_invalidate_of_unknown_stag() {
    let mut pair = pair(true);
    let bogus = Stag(0x0077_7701);
    send(&mut pair, 4, Some(bogus));
    verify(
        &pair,
        RdmapError::CannotInvalidate {
            stag: bogus,
            reason: AccessViolation::InvalidStag,
        },
        (0, 2, 9),
        true,
        false,
    );
    // The receive that got the Send fails with the remote error; the Send WR is flushed.
    let done = pair.b.completions();
    let recv = done.iter().find(|c| c.wr_id == B_RECV).unwrap();
    assert_eq!(recv.status, WcStatus::RemoteInvalidRequestError);
    let send_wc = done.iter().find(|c| c.wr_id == B_SEND).unwrap();
    assert_eq!(send_wc.status, WcStatus::WrFlushError);
    assert_a_flushed(&mut pair);
}

#[test]
fn send_with_invalidate_of_other_pd_stag() {
    let mut pair = pair(true);
    let foreign = pair
        .b
        .mem
        .register(PdId(4), rdmap::VecBuffer::zeroed(8), 0, Access::ALL);
    send(&mut pair, 4, Some(foreign));
    verify(
        &pair,
        RdmapError::CannotInvalidate {
            stag: foreign,
            reason: AccessViolation::StagNotAssociated,
        },
        (0, 1, 9),
        true,
        false,
    );
    assert_eq!(pair.b.mem.info(foreign).map(|i| i.valid), Some(true));
}

/// RFC 5040 8.1.1 rule 7: a peer may not invalidate an STag enabled for remote access that
/// is shared on several streams. Our STags are scoped to the protection domain, so while
/// another queue pair of B's PD runs, A's Send with Invalidate of B's remotely writable region
/// (the other connection's peer may be writing it) is refused with the Terminate for "STag
/// cannot be invalidated" and the region stays valid. Before, any region of the PD could be
/// invalidated by any of its streams' peers. A remote one once B's queue pair is the only
/// stream can be; a region not enabled for remote access never (RFC 5042 6.4.5: it is shared
/// by every stream of the PD, and the peer may know it as a Read sink).
#[test]
fn send_with_invalidate_of_a_stag_shared_on_another_stream() {
    let mut shared_pd = pair(true);
    let shared = shared_pd.b.region(vec![0; 8], 0, Access::REMOTE_WRITE);
    shared_pd.b.qp.join_stream(&shared_pd.b.mem);
    let _other_stream = shared_pd.b.mem.join_stream();
    send(&mut shared_pd, 4, Some(shared));
    verify(
        &shared_pd,
        RdmapError::CannotInvalidate {
            stag: shared,
            reason: AccessViolation::AccessRights,
        },
        (0, 1, 9),
        true,
        false,
    );
    assert_eq!(shared_pd.b.mem.info(shared).map(|i| i.valid), Some(true));
    // The failed queue pair gave up its membership; the other stream is alone.
    assert_eq!(shared_pd.b.mem.streams(), 1);

    let mut alone = pair(true);
    let stag = alone.b.region(vec![0; 8], 0, Access::REMOTE_READ);
    alone.b.qp.join_stream(&alone.b.mem);
    send(&mut alone, 4, Some(stag));
    assert_eq!(alone.b.mem.info(stag).map(|i| i.valid), Some(false));
    let recv = alone
        .b
        .completions()
        .into_iter()
        .find(|c| c.wr_id == B_RECV);
    assert_eq!(recv.map(|c| c.invalidated), Some(Some(stag)));

    let mut local = pair(true);
    let sink = local.b.region(vec![0; 8], 0, Access::LOCAL_WRITE);
    local.b.qp.join_stream(&local.b.mem);
    send(&mut local, 4, Some(sink));
    verify(
        &local,
        RdmapError::CannotInvalidate {
            stag: sink,
            reason: AccessViolation::AccessRights,
        },
        (0, 1, 9),
        true,
        false,
    );
    assert_eq!(local.b.mem.info(sink).map(|i| i.valid), Some(true));
}

/// A pair where B, the responder of RFC 6581's peer-to-peer mode, expects the peer's first
/// message to be a zero-length RTR Send ([`QueuePair::expect_rtr`]); otherwise as [`pair`].
fn pair_expecting_rtr_send(cfg: QpConfig) -> Pair {
    let mut pair = Pair::with_configs(MULPDU, cfg, cfg);
    let mut b = QueuePair::new(cfg);
    b.expect_rtr(RtrKind::Send).unwrap();
    b.enter_rts(cfg.ird, cfg.ord);
    pair.b.qp = b;
    post_work(&mut pair, true);
    pair
}

/// The RTR sink takes a zero-length Send and nothing else of QN 0 (RFC 6581 9.2; RFC 5040
/// 7.2 rule 2): a Send with Invalidate in its place is refused, and its STag stays valid
/// (swallowed, it was invalidated with no receive to say so).
#[test]
fn an_rtr_that_invalidates_is_refused() {
    let mut pair = pair_expecting_rtr_send(config());
    let target = pair.b.region(vec![0; 8], 0, Access::REMOTE_WRITE);
    send(&mut pair, 0, Some(target));
    verify(
        &pair,
        RdmapError::UnexpectedOpcode { opcode: 4 },
        (0, 2, 6),
        true,
        false,
    );
    assert!(pair.b.mem.info(target).unwrap().valid);
    assert_b_flushed(&mut pair, true);
    assert_a_flushed(&mut pair);
}

/// An Immediate Data message (RFC 7306 6) in the RTR sink's place is refused too: it would
/// have been swallowed, its data lost.
#[test]
fn an_rtr_with_immediate_data_is_refused() {
    let mut pair = pair_expecting_rtr_send(config_ext());
    inject(&mut pair, untagged(0x41, 0x48, 0, 1, &[7; 8]));
    verify(
        &pair,
        RdmapError::UnexpectedOpcode { opcode: 8 },
        (0, 2, 6),
        true,
        false,
    );
    assert_b_flushed(&mut pair, true);
}

/// A zero-length Send with Solicited Event is an RTR as good as a plain one.
#[test]
fn a_solicited_rtr_send_is_taken() {
    let mut pair = pair_expecting_rtr_send(config());
    inject(&mut pair, untagged(0x41, 0x45, 0, 1, &[]));
    assert!(pair.log.iter().all(|t| t.result.is_ok()));
    assert_eq!(pair.b.qp.state(), QpState::Rts);
    // The user's receive is left for the first real Send.
    assert!(pair.b.completions().iter().all(|c| c.wr_id != B_RECV));
}

#[test]
fn invalid_ddp_version_untagged() {
    let mut pair = pair(true);
    inject(&mut pair, untagged(0x42, 0x43, 0, 1, &[1, 2, 3]));
    verify(
        &pair,
        RdmapError::Ddp(DdpError::UntaggedVersion),
        (1, 2, 6),
        true,
        false,
    );
    assert_b_flushed(&mut pair, true);
    assert_a_flushed(&mut pair);
}

/// A Send in more separate pieces than the receive side tracks (17 with gaps between them;
/// DDP tracks 16):
/// DDP's local catastrophic error (1/0/0), whose Terminate carries no DDP header nor segment
/// length (RFC 5040 4.8: "not present if the Terminate Error Type is a Local Catastrophic
/// Error").
#[test]
fn a_send_in_too_many_pieces_terminates_without_its_header() {
    let mut pair = Pair::new(MULPDU);
    let b_rbuf = pair.b.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(B_RECV, b_rbuf, 0, 64);
    let pieces = ddp::MAX_TRACKED_RANGES as u32 + 1;
    for piece in 0..pieces {
        let mut bytes = untagged(0x01, 0x43, 0, 1, &[0xAB]);
        bytes[14..18].copy_from_slice(&(2 * piece).to_be_bytes());
        inject(&mut pair, bytes);
    }
    let results: Vec<_> = pair.log.iter().filter(|t| t.from == Side::A).collect();
    assert_eq!(results.len(), pieces as usize);
    assert!(results[..results.len() - 1]
        .iter()
        .all(|t| t.result.is_ok()));
    assert_eq!(
        results[results.len() - 1].result,
        Err(RdmapError::Ddp(DdpError::TooManyRanges))
    );
    let term = pair.sent_by(Side::B).last().expect("a Terminate");
    assert_eq!(term.opcode(), Opcode::Terminate);
    let (_, payload) = DdpHeader::parse(&term.bytes).unwrap();
    let header = TerminateHeader::parse(payload).unwrap();
    assert_eq!((header.layer, header.etype, header.code), (1, 0, 0));
    assert_eq!(header.ddp_header, None, "D bit");
    assert_eq!(header.segment_len, None, "M bit");
    assert_eq!(header.read_request, None, "R bit");
    assert_eq!(pair.b.qp.state(), QpState::Error);
    assert_eq!(pair.a.qp.remote_terminate(), Some(header));
}

#[test]
fn invalid_ddp_version_tagged() {
    let mut pair = pair(true);
    inject(&mut pair, tagged(0xC0, 0x40, 0x100, 0, &[1, 2, 3]));
    verify(
        &pair,
        RdmapError::Ddp(DdpError::TaggedVersion),
        (1, 1, 4),
        true,
        false,
    );
    assert_b_flushed(&mut pair, true);
}

#[test]
fn truncated_ddp_header_has_no_copied_header() {
    let mut pair = pair(true);
    inject(&mut pair, vec![0x41, 0x43, 0, 0, 0]);
    verify(
        &pair,
        RdmapError::Ddp(DdpError::HeaderTruncated {
            tagged: false,
            len: 5,
        }),
        (1, 2, 6),
        false,
        false,
    );
    assert_b_flushed(&mut pair, true);
}

#[test]
fn invalid_rdmap_version() {
    let mut pair = pair(true);
    inject(&mut pair, untagged(0x41, 0x03, 0, 1, &[1]));
    verify(
        &pair,
        RdmapError::InvalidVersion { version: 0 },
        (0, 2, 5),
        true,
        false,
    );
    assert_b_flushed(&mut pair, true);
    assert_a_flushed(&mut pair);
}

#[test]
fn reserved_opcode() {
    let mut pair = pair(true);
    inject(&mut pair, untagged(0x41, 0x48, 0, 1, &[1]));
    verify(
        &pair,
        RdmapError::UnexpectedOpcode { opcode: 8 },
        (0, 2, 6),
        true,
        false,
    );
    assert_b_flushed(&mut pair, true);
}

#[test]
fn write_opcode_on_untagged_queue() {
    let mut pair = pair(true);
    inject(&mut pair, untagged(0x41, 0x40, 0, 1, &[1]));
    verify(
        &pair,
        RdmapError::UnexpectedOpcode { opcode: 0 },
        (0, 2, 6),
        true,
        false,
    );
}

#[test]
fn send_opcode_on_tagged_segment() {
    let mut pair = pair(true);
    inject(&mut pair, tagged(0xC1, 0x43, 0x100, 0, &[1]));
    verify(
        &pair,
        RdmapError::UnexpectedOpcode { opcode: 3 },
        (0, 2, 6),
        true,
        false,
    );
}

#[test]
fn read_response_without_outstanding_read() {
    let mut pair = pair(true);
    inject(&mut pair, tagged(0xC1, 0x42, 0x100, 0, &[1, 2]));
    verify(
        &pair,
        RdmapError::UnexpectedOpcode { opcode: 2 },
        (0, 2, 6),
        true,
        false,
    );
    assert_b_flushed(&mut pair, true);
}

#[test]
fn invalid_queue_number() {
    let mut pair = pair(true);
    inject(&mut pair, untagged(0x41, 0x43, 3, 1, &[1]));
    verify(
        &pair,
        RdmapError::Ddp(DdpError::InvalidQn { qn: 3 }),
        (1, 2, 1),
        true,
        false,
    );
    assert_b_flushed(&mut pair, true);
    assert_a_flushed(&mut pair);
}

#[test]
fn msn_out_of_range() {
    let mut pair = pair(true);
    inject(&mut pair, untagged(0x41, 0x43, 0, 1000, &[1]));
    verify(
        &pair,
        RdmapError::Ddp(DdpError::MsnRange { msn: 1000 }),
        (1, 2, 3),
        true,
        false,
    );
    assert_b_flushed(&mut pair, true);
    assert_a_flushed(&mut pair);
}

#[test]
fn short_read_request_is_malformed() {
    let mut pair = pair(true);
    inject(&mut pair, untagged(0x41, 0x41, 1, 1, &[0; 20]));
    verify(
        &pair,
        RdmapError::MalformedReadRequest { len: 20 },
        (0, 2, 0xFF),
        true,
        false,
    );
}

#[test]
fn only_the_first_error_is_reported() {
    let mut pair = pair(true);
    let first = untagged(0x41, 0x43, 7, 1, &[1]);
    let second = untagged(0x41, 0x48, 0, 1, &[1]);
    assert_eq!(
        pair.b.qp.on_ulpdu(&first, &pair.b.mem),
        Err(RdmapError::Ddp(DdpError::InvalidQn { qn: 7 }))
    );
    // Later segments are dropped silently (RFC 5041 7.1).
    assert_eq!(pair.b.qp.on_ulpdu(&second, &pair.b.mem), Ok(()));
    assert_eq!(pair.b.qp.state(), QpState::Terminate);
    let mut out = Vec::new();
    let tx = pair
        .b
        .qp
        .poll_transmit(MULPDU, &pair.b.mem, &mut out)
        .unwrap();
    assert_eq!(tx.opcode, Opcode::Terminate);
    assert_eq!(pair.b.qp.state(), QpState::Error);
    let header = TerminateHeader::parse(&out[18..]).unwrap();
    assert_eq!((header.layer, header.etype, header.code), (1, 2, 1));
    assert_eq!(header.ddp_header.unwrap().as_bytes(), &first[..18]);
    out.clear();
    assert!(pair
        .b
        .qp
        .poll_transmit(MULPDU, &pair.b.mem, &mut out)
        .is_none());
    assert!(out.is_empty());
}

#[test]
fn mpa_crc_error_sends_bare_llp_terminate() {
    let mut pair = pair(true);
    pair.b
        .qp
        .on_transport_error(TerminateCause::Llp { code: 0x02 });
    assert_eq!(pair.b.qp.state(), QpState::Terminate);
    pair.pump();
    let term = pair.a.qp.remote_terminate().unwrap();
    assert_eq!(term, TerminateHeader::bare(2, 0, 2));
    let b_sent: Vec<_> = pair.sent_by(Side::B).map(|t| t.opcode()).collect();
    assert_eq!(b_sent, vec![Opcode::Terminate]);
    assert_eq!(pair.b.qp.state(), QpState::Error);
    assert_b_flushed(&mut pair, true);
    assert_a_flushed(&mut pair);
}

#[test]
fn connection_lost_flushes_without_terminate() {
    let mut pair = pair(true);
    pair.b.qp.on_transport_error(TerminateCause::ConnectionLost);
    assert_eq!(pair.b.qp.state(), QpState::Error);
    let mut out = Vec::new();
    assert!(pair
        .b
        .qp
        .poll_transmit(MULPDU, &pair.b.mem, &mut out)
        .is_none());
    assert_b_flushed(&mut pair, true);
}

#[test]
fn read_response_outside_the_requested_range_is_refused_by_the_sink() {
    // B answers A's Read honestly, but we tamper with the Response's TO on the way.
    let mut pair = pair(true);
    let (sink, segments) = read_response_segments(&mut pair, 64);
    let mut out = segments[0].clone();
    out[6..14].copy_from_slice(&8u64.to_be_bytes());
    assert_eq!(
        pair.a.qp.on_ulpdu(&out, &pair.a.mem),
        Err(RdmapError::SinkAccess {
            stag: sink.stag,
            violation: AccessViolation::BaseBounds
        })
    );
    let mut term = Vec::new();
    pair.a
        .qp
        .poll_transmit(MULPDU, &pair.a.mem, &mut term)
        .unwrap();
    let header = TerminateHeader::parse(&term[18..]).unwrap();
    assert_eq!((header.layer, header.etype, header.code), (1, 1, 1));
    assert_eq!(header.ddp_header.unwrap().as_bytes(), &out[..14]);
    let done = pair.a.completions();
    let read_wc = done.iter().find(|c| c.wr_id == 2).unwrap();
    assert_eq!(read_wc.status, WcStatus::LocalProtectionError);
    // Nothing was written into the sink.
    assert_eq!(pair.a.contents(sink.stag), vec![0; 64]);
}

/// B's Read Response segments for A's Read of `len` octets, in the order B sends them (its
/// queued Send to A delivered first), and A's sink.
fn read_response_segments(pair: &mut Pair, len: usize) -> (Sge, Vec<Vec<u8>>) {
    let source = pair.b.region(pattern(len, 1), 0, Access::REMOTE_READ);
    let sink = a_sink(pair, len);
    pair.a.post(
        2,
        SendOp::Read {
            remote_stag: source,
            remote_to: 0,
        },
        Some(sink),
    );
    assert!(pair.step(Side::A));
    let mut segments = Vec::new();
    loop {
        let mut out = Vec::new();
        let Some(tx) = pair.b.qp.poll_transmit(MULPDU, &pair.b.mem, &mut out) else {
            break;
        };
        if tx.opcode == Opcode::ReadResponse {
            segments.push(out);
        } else {
            pair.a.qp.on_ulpdu(&out, &pair.a.mem).unwrap();
        }
    }
    (sink, segments)
}

/// A Read Response whose earlier segments never came (a peer that sends only its Last, ending
/// the range) does not complete the Read as if the sink held the data: each segment must
/// start where the one delivered before it ended (siw checks the same), else a base-or-bounds
/// Terminate, and the Read completes in error.
#[test]
fn a_read_response_with_a_segment_missing_fails_the_read() {
    for skip in [0, 1] {
        let mut p = pair(true);
        let (sink, segments) = read_response_segments(&mut p, 2000);
        assert!(segments.len() >= 3, "{}", segments.len());
        // Segments before `skip` delivered; the one at `skip` lost; the rest delivered.
        for s in &segments[..skip] {
            p.a.qp.on_ulpdu(s, &p.a.mem).unwrap();
        }
        let next = &segments[skip + 1];
        assert_eq!(
            p.a.qp.on_ulpdu(next, &p.a.mem),
            Err(RdmapError::SinkAccess {
                stag: sink.stag,
                violation: AccessViolation::BaseBounds
            }),
            "segment {} lost",
            skip
        );
        let mut term = Vec::new();
        p.a.qp.poll_transmit(MULPDU, &p.a.mem, &mut term).unwrap();
        let header = TerminateHeader::parse(&term[18..]).unwrap();
        assert_eq!((header.layer, header.etype, header.code), (1, 1, 1));
        let done = p.a.completions();
        let read_wc = done.iter().find(|c| c.wr_id == 2).unwrap();
        assert_eq!(read_wc.status, WcStatus::LocalProtectionError);
    }
    // The Last alone, and a segment delivered twice, fail the same way; all in order pass.
    let mut alone = pair(true);
    let (_, segments) = read_response_segments(&mut alone, 2000);
    let last = segments.last().unwrap();
    assert!(
        alone.a.qp.on_ulpdu(last, &alone.a.mem).is_err(),
        "the Last alone"
    );
    let mut twice = pair(true);
    let (_, segments) = read_response_segments(&mut twice, 2000);
    twice.a.qp.on_ulpdu(&segments[0], &twice.a.mem).unwrap();
    assert!(
        twice.a.qp.on_ulpdu(&segments[0], &twice.a.mem).is_err(),
        "twice"
    );
    let mut whole = pair(true);
    let (sink, segments) = read_response_segments(&mut whole, 2000);
    for s in &segments {
        whole.a.qp.on_ulpdu(s, &whole.a.mem).unwrap();
    }
    let done = whole.a.completions();
    let read_wc = done.iter().find(|c| c.wr_id == 2).unwrap();
    assert_eq!(read_wc.status, WcStatus::Success);
    assert_eq!(whole.a.contents(sink.stag), pattern(2000, 1));
}

#[test]
fn source_deregistered_mid_response_reports_progress() {
    let mut pair = Pair::new(MULPDU);
    let source = pair.b.region(pattern(2000, 1), 0x800, Access::REMOTE_READ);
    let sink = a_sink(&mut pair, 2000);
    pair.a.post(
        2,
        SendOp::Read {
            remote_stag: source,
            remote_to: 0x800,
        },
        Some(sink),
    );
    assert!(pair.step(Side::A));
    let request = pair.log[0].bytes.clone();
    assert!(pair.step(Side::B));
    assert_eq!(pair.log[1].opcode(), Opcode::ReadResponse);
    let first = (MULPDU - 14) as u32;
    pair.b.mem.deregister(source).unwrap();
    pair.pump();
    let term = pair.a.qp.remote_terminate().unwrap();
    assert_eq!((term.layer, term.etype, term.code), (0, 1, 0));
    assert_eq!(term.ddp_header.unwrap().as_bytes(), &request[..18]);
    let original = ReadRequest::parse(&request[18..]).unwrap();
    let reported = term.read_request.unwrap();
    assert_eq!(reported, original.advanced_by(first));
    assert_eq!(reported.size, 2000 - first);
    assert_eq!(reported.src_to, 0x800 + u64::from(first));
    let read_wc = pair
        .a
        .completions()
        .into_iter()
        .find(|c| c.wr_id == 2)
        .unwrap();
    assert_eq!(read_wc.status, WcStatus::RemoteAccessError);
    assert_eq!(pair.b.qp.state(), QpState::Error);
}

/// A Read Request that arrives before the one ahead of it (MSN 2, then MSN 1) is checked only
/// when MSN 1's segment delivers both (rule 12); its Terminate still copies the DDP header of
/// the segment that carried it, and names it (4.8, Figure 10), not MSN 1's.
#[test]
fn a_read_request_delivered_by_a_later_segment_is_named_in_its_terminate() {
    let mut pair = pair(true);
    let source = pair.b.region(pattern(64, 3), 0, Access::REMOTE_READ);
    let request = |src_stag| ReadRequest {
        sink_stag: 0x0012_3400,
        sink_to: 0,
        size: 16,
        src_stag,
        src_to: 0,
    };
    let bad = request(source.0 ^ 0x0100_0000);
    let second = untagged(0x41, 0x41, 1, 2, &bad.to_bytes());
    inject(&mut pair, second.clone());
    assert_eq!(pair.b.qp.state(), QpState::Rts, "staged, not yet delivered");
    inject(
        &mut pair,
        untagged(0x41, 0x41, 1, 1, &request(source.0).to_bytes()),
    );
    let term = pair.b.qp.local_terminate().expect("B sent a Terminate");
    let copied = term.ddp_header.expect("D bit");
    let n = copied.as_bytes().len();
    assert_eq!(copied.as_bytes(), &second[..n], "MSN 2's segment header");
    assert_eq!(term.segment_len, Some(28));
    assert_eq!(term.read_request, Some(bad));
    assert_eq!(pair.b.qp.state(), QpState::Error);
}

/// A Send with Invalidate of an unknown STag that DDP delivers only when a later segment
/// arrives (its MSN 2 came before MSN 1): the Terminate names its own segment, not the one
/// whose arrival delivered it (RFC 5040 7.1).
#[test]
fn a_send_with_invalidate_delivered_late_names_its_own_segment() {
    let mut pair = pair(true);
    let second_buf = pair.b.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    pair.b.post_recv(B_RECV + 1, second_buf, 0, 64);
    // RDMAP opcode 4, Send with Invalidate; its Invalidate STag in the header's ULP field.
    let mut invalidating = untagged(0x41, 0x44, 0, 2, &[1, 2, 3, 4]);
    invalidating[2..6].copy_from_slice(&0x0077_7701u32.to_be_bytes());
    let plain = untagged(0x41, 0x43, 0, 1, &[5, 6, 7, 8, 9, 10, 11, 12]);
    assert!(
        pair.b.qp.on_ulpdu(&invalidating, &pair.b.mem).is_ok(),
        "placed, not yet delivered"
    );
    assert!(matches!(
        pair.b.qp.on_ulpdu(&plain, &pair.b.mem),
        Err(RdmapError::CannotInvalidate { .. })
    ));
    let term = pair.b.qp.local_terminate().expect("a Terminate");
    assert_eq!((term.layer, term.etype, term.code), (0, 2, 9));
    let copied = term.ddp_header.expect("the D bit");
    let n = copied.as_bytes().len();
    assert_eq!(
        copied.as_bytes(),
        &invalidating[..n],
        "the segment in error"
    );
    assert_eq!(term.segment_len, Some(4));
}

/// A pair whose A has a 16-octet Send source and B a 64-octet receive region; a Send of
/// that source, to post on A.
fn send_pair() -> (Pair, Stag, impl Fn(&mut Pair, u64)) {
    let mut pair = Pair::new(1024);
    let src = pair.a.region(vec![7; 16], 0, Access::NONE);
    let rbuf = pair.b.region(vec![0; 64], 0, Access::LOCAL_WRITE);
    let post = move |pair: &mut Pair, wr_id: u64| {
        let send = SendOp::Send {
            solicited: false,
            invalidate: None,
        };
        let sge = Sge {
            stag: src,
            to: 0,
            len: 16,
        };
        pair.a.post(wr_id, send, Some(sge));
    };
    (pair, rbuf, post)
}

/// The (work request, status) of each completion of `peer`.
fn statuses(peer: &mut Peer) -> Vec<(u64, WcStatus)> {
    peer.completions()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect()
}

/// A send work request that failed its local checks when the transport took it fails in its
/// place (`QueuePair::fail_send_in_place`), as a verbs device fails one when it reaches it:
/// the request before it goes, it completes with its status, a Terminate (RDMAP, Local
/// Catastrophic) goes instead of anything after it, and the request after it is flushed.
#[test]
fn a_send_refused_when_taken_fails_the_queue_pair_in_its_place() {
    let (mut pair, rbuf, post) = send_pair();
    for i in 0..3 {
        pair.b.post_recv(10 + i, rbuf, 16 * i, 16);
    }
    post(&mut pair, 1);
    pair.a
        .qp
        .fail_send_in_place(2, WcOpcode::Send, WcStatus::LocalProtectionError, false);
    post(&mut pair, 3);
    pair.pump();
    let sent: Vec<_> = pair.sent_by(Side::A).map(|t| t.opcode()).collect();
    assert_eq!(sent, [Opcode::Send, Opcode::Terminate]);
    let terminate = pair.sent_by(Side::A).last().expect("the Terminate");
    assert_eq!(terminate.bytes[18] >> 4, 0, "layer RDMAP");
    assert_eq!(terminate.bytes[18] & 0x0F, 0, "Local Catastrophic");
    let got = statuses(&mut pair.a);
    assert_eq!(
        got[1..],
        [
            (2, WcStatus::LocalProtectionError),
            (3, WcStatus::WrFlushError)
        ]
    );
    assert_eq!(pair.a.qp.state(), QpState::Error);
    assert_eq!(
        statuses(&mut pair.b),
        [
            (10, WcStatus::Success),
            (11, WcStatus::WrFlushError),
            (12, WcStatus::WrFlushError)
        ]
    );
}

/// A fenced refused request waits, as a fenced request does, for the Read before it: the
/// Read completes, then the refusal fails the queue pair.
#[test]
fn a_fenced_refused_send_waits_for_the_read_before_it() {
    let (mut pair, _, _) = send_pair();
    let src = pair.b.region(vec![5; 16], 0x100, Access::REMOTE_READ);
    let sink = pair.a.region(vec![0; 16], 0, Access::LOCAL_WRITE);
    pair.a.post(
        1,
        SendOp::Read {
            remote_stag: src,
            remote_to: 0x100,
        },
        Some(Sge {
            stag: sink,
            to: 0,
            len: 16,
        }),
    );
    pair.a
        .qp
        .fail_send_in_place(2, WcOpcode::Send, WcStatus::LocalProtectionError, true);
    while pair.step(Side::A) {}
    let sent: Vec<_> = pair.sent_by(Side::A).map(|t| t.opcode()).collect();
    assert_eq!(
        sent,
        [Opcode::ReadRequest],
        "the refusal waits for the Read"
    );
    pair.pump();
    assert_eq!(
        statuses(&mut pair.a),
        [(1, WcStatus::Success), (2, WcStatus::LocalProtectionError)]
    );
    assert_eq!(pair.a.contents(sink), [5; 16]);
    assert!(pair
        .sent_by(Side::A)
        .any(|t| t.opcode() == Opcode::Terminate));
}

/// The receive side (`QueuePair::fail_recv_in_place`): a receive refused when taken waits
/// for the receive before it, completes after it, and then fails the queue pair, so that the
/// peer's next Send lands in no receive; refused before the queue pair runs with nothing
/// before it, it fails the queue pair as it enters RTS.
#[test]
fn a_receive_refused_when_taken_fails_the_queue_pair_after_the_one_before() {
    let (mut pair, rbuf, post) = send_pair();
    pair.b.post_recv(10, rbuf, 0, 16);
    pair.b
        .qp
        .fail_recv_in_place(11, WcStatus::LocalProtectionError);
    pair.b.post_recv(12, rbuf, 32, 16);
    assert!(pair.b.completions().is_empty(), "it waits for receive 10");
    post(&mut pair, 1);
    post(&mut pair, 2);
    pair.pump();
    assert_eq!(
        statuses(&mut pair.b),
        [
            (10, WcStatus::Success),
            (11, WcStatus::LocalProtectionError),
            (12, WcStatus::WrFlushError)
        ]
    );
    assert_eq!(
        pair.b.contents(rbuf)[32..48],
        [0; 16],
        "nothing in receive 12"
    );
    assert!(pair
        .sent_by(Side::B)
        .any(|t| t.opcode() == Opcode::Terminate));
    assert!(pair.a.qp.remote_terminate().is_some());

    // In Idle, with no receive before it: the failure waits for RTS.
    let mut qp = QueuePair::new(config());
    qp.fail_recv_in_place(5, WcStatus::LocalProtectionError);
    assert_eq!(qp.state(), QpState::Idle);
    qp.enter_rts(8, 8);
    assert_eq!(qp.state(), QpState::Terminate);
    assert_eq!(
        qp.poll_completion().map(|c| c.status),
        Some(WcStatus::LocalProtectionError)
    );
}

/// An untagged Send-type segment on QN 0 (RFC 5041 4.3, RFC 5040 4.3).
fn qn0_segment(opcode: u8, invalidate: u32, msn: u32, mo: u32, last: bool, data: &[u8]) -> Vec<u8> {
    let mut s = vec![if last { 0x41 } else { 0x01 }, 0x40 | opcode];
    s.extend_from_slice(&invalidate.to_be_bytes());
    s.extend_from_slice(&0u32.to_be_bytes());
    s.extend_from_slice(&msn.to_be_bytes());
    s.extend_from_slice(&mo.to_be_bytes());
    s.extend_from_slice(data);
    s
}

/// A refused receive that comes due in the segment that fails for a fault of its own (a Send
/// with Invalidate of an STag that cannot be invalidated): the segment's own Terminate is
/// the one sent, not the refusal's Local Catastrophic.
#[test]
fn a_refusal_due_in_a_failing_segment_leaves_the_segments_terminate() {
    let (mut pair, rbuf, _) = send_pair();
    pair.b.post_recv(10, rbuf, 0, 16);
    pair.b
        .qp
        .fail_recv_in_place(11, WcStatus::LocalProtectionError);
    let send_inv = qn0_segment(0x4, 0x1234_5678, 1, 0, true, &[1; 8]);
    assert!(pair.b.qp.on_ulpdu(&send_inv, &pair.b.mem).is_err());
    let t = pair.b.qp.local_terminate().expect("a Terminate raised");
    assert_ne!(
        (t.layer, t.etype),
        (0, 0),
        "the refusal's replaced it: {t:?}"
    );
    assert!(t.ddp_header.is_some(), "it names the segment: {t:?}");
    let got = statuses(&mut pair.b);
    assert_eq!(got[1], (11, WcStatus::LocalProtectionError), "{got:?}");
}

/// Deliveries stop when a refused receive comes due: a Send whose segments interleave with
/// the next message's (DDP places either; delivery is in MSN order) completes receive 10,
/// the refusal completes and fails the queue pair, and the next message, placed in receive 12
/// already, is not delivered there: 12 is flushed.
#[test]
fn deliveries_stop_when_a_refused_receive_comes_due() {
    let (mut pair, rbuf, _) = send_pair();
    pair.b.post_recv(10, rbuf, 0, 16);
    pair.b
        .qp
        .fail_recv_in_place(11, WcStatus::LocalProtectionError);
    pair.b.post_recv(12, rbuf, 32, 16);
    for segment in [
        qn0_segment(0x3, 0, 1, 0, false, &[1; 8]),
        qn0_segment(0x3, 0, 2, 0, true, &[2; 8]),
        qn0_segment(0x3, 0, 1, 8, true, &[1; 8]),
    ] {
        let _ = pair.b.qp.on_ulpdu(&segment, &pair.b.mem);
    }
    pair.pump();
    assert_eq!(
        statuses(&mut pair.b),
        [
            (10, WcStatus::Success),
            (11, WcStatus::LocalProtectionError),
            (12, WcStatus::WrFlushError)
        ]
    );
}
