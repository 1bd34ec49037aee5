//! A peer's Terminate (RFC 5040 4.8, 5.4) received by a queue pair with Sends and Writes
//! outstanding: the work request whose segment the copied DDP header names completes with the
//! remote error of the Terminate's layer and type, what the peer took before it completes,
//! everything else is flushed. The Terminates are written here octet by octet.

mod common;

use common::*;
use rdmap::qp::{QpState, SendOp, Sge, TxCompletion, WcOpcode, WcStatus};
use rdmap::{Access, Stag};

const MULPDU: usize = 1024;
/// Payload per Write segment: MULPDU less the 14-octet tagged header.
const WRITE_SEG: u64 = (MULPDU - 14) as u64;
const SINK: Stag = Stag(0x4200);
const OTHER_SINK: Stag = Stag(0x4300);
const SINK_TO: u64 = 0x1000;

/// DDP control byte of an untagged / tagged segment (RFC 5041 4.2, 4.3: DV 1), L set or not.
fn ddp_ctrl(tagged: bool, last: bool) -> u8 {
    (if tagged { 0x80 } else { 0 }) | (if last { 0x40 } else { 0 }) | 0x01
}

/// RDMAP control byte (RFC 5040 4.2: RV 1) with `opcode`.
fn rdmap_ctrl(opcode: u8) -> u8 {
    0x40 | opcode
}

/// The 14-octet tagged header of an RDMA Write segment.
fn write_header(stag: Stag, to: u64, last: bool) -> Vec<u8> {
    let mut v = vec![ddp_ctrl(true, last), rdmap_ctrl(0)];
    v.extend_from_slice(&stag.raw().to_be_bytes());
    v.extend_from_slice(&to.to_be_bytes());
    v
}

/// The 18-octet untagged header of a segment on `qn` with `opcode`.
fn untagged_header(opcode: u8, qn: u32, msn: u32, mo: u32, last: bool) -> Vec<u8> {
    let mut v = vec![ddp_ctrl(false, last), rdmap_ctrl(opcode), 0, 0, 0, 0];
    v.extend_from_slice(&qn.to_be_bytes());
    v.extend_from_slice(&msn.to_be_bytes());
    v.extend_from_slice(&mo.to_be_bytes());
    v
}

/// A whole Terminate ULPDU (QN 2, MSN 1, L): the control word (layer, EType, code, M and D
/// when a header is copied), then the DDP Segment Length and the copied header.
fn terminate(layer: u8, etype: u8, code: u8, copied: Option<(&[u8], u16)>) -> Vec<u8> {
    let mut v = untagged_header(7, 2, 1, 0, true);
    let mut word = u32::from(layer) << 28 | u32::from(etype) << 24 | u32::from(code) << 16;
    if copied.is_some() {
        word |= 0x8000 | 0x4000;
    }
    v.extend_from_slice(&word.to_be_bytes());
    if let Some((header, segment_len)) = copied {
        v.extend_from_slice(&segment_len.to_be_bytes());
        v.extend_from_slice(header);
    }
    v
}

/// Our side: a queue pair under `policy` with one source region of 4096 octets.
fn ours(policy: TxCompletion) -> (Peer, Stag) {
    let mut p = Peer::new(config());
    p.qp.set_tx_completion(policy);
    let src = p.region(pattern(4096, 3), 0, Access::NONE);
    (p, src)
}

fn write(p: &mut Peer, wr_id: u64, src: Stag, sink: Stag, len: u32) {
    let op = SendOp::Write {
        remote_stag: sink,
        remote_to: SINK_TO,
    };
    let local = Sge {
        stag: src,
        to: 0,
        len,
    };
    p.post(wr_id, op, Some(local));
}

fn send(p: &mut Peer, wr_id: u64, src: Stag, len: u32) {
    let op = SendOp::Send {
        solicited: false,
        invalidate: None,
    };
    let local = Sge {
        stag: src,
        to: 0,
        len,
    };
    p.post(wr_id, op, Some(local));
}

/// Hands out at most `max` segments (they go nowhere: the peer is played by the test).
fn hand_out(p: &mut Peer, max: usize) -> usize {
    let mut out = Vec::new();
    let mut n = 0;
    while n < max {
        if p.qp
            .poll_transmit_segment(MULPDU, &p.mem, &mut out)
            .is_none()
        {
            break;
        }
        out.clear();
        n += 1;
    }
    n
}

/// Delivers the peer's Terminate and returns (wr_id, opcode, status) of every completion.
fn receive(p: &mut Peer, term: &[u8]) -> Vec<(u64, WcOpcode, WcStatus)> {
    p.qp.on_ulpdu(term, &p.mem)
        .expect("a Terminate is not an error");
    assert_eq!(p.qp.state(), QpState::Error);
    assert!(p.qp.remote_terminate().is_some());
    p.completions()
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.status))
        .collect()
}

/// Writes 1 (10 octets), 2 (3000: three segments), 3 and Send 4, all handed out, and the
/// peer's Terminate refusing Write 2 at its second segment (DDP tagged buffer, base or
/// bounds), named by STag and a TO inside it.
fn four_requests_and_a_terminate_naming_the_second() -> (Peer, Vec<u8>) {
    let (mut p, src) = ours(TxCompletion::Acknowledged);
    write(&mut p, 1, src, OTHER_SINK, 10);
    write(&mut p, 2, src, SINK, 3000);
    write(&mut p, 3, src, SINK, 100);
    send(&mut p, 4, src, 8);
    assert_eq!(hand_out(&mut p, 100), 6);
    let refused = write_header(SINK, SINK_TO + WRITE_SEG, false);
    let term = terminate(1, 1, 1, Some((&refused, WRITE_SEG as u16)));
    (p, term)
}

/// What those four complete with once the Terminate is taken.
const FOUR_AFTER_THE_TERMINATE: [(u64, WcOpcode, WcStatus); 4] = [
    (1, WcOpcode::Write, WcStatus::Success),
    (2, WcOpcode::Write, WcStatus::RemoteAccessError),
    (3, WcOpcode::Write, WcStatus::WrFlushError),
    (4, WcOpcode::Send, WcStatus::WrFlushError),
];

/// A Write of three segments is refused at its second (DDP tagged buffer, base or bounds):
/// the Terminate names it by STag and a TO inside it. The Write before it was taken by the
/// peer and completes; the Write and Send after it are flushed.
#[test]
fn write_named_by_stag_and_to_completes_with_remote_access_error() {
    let (mut p, term) = four_requests_and_a_terminate_naming_the_second();
    assert!(p.completions().is_empty(), "nothing acknowledged yet");
    assert_eq!(receive(&mut p, &term), FOUR_AFTER_THE_TERMINATE);
    // The acknowledgement that came with the Terminate changes nothing any more.
    p.qp.message_acknowledged();
    assert!(p.completions().is_empty());
}

/// The same refusal while the transport still resends the requests' octets from their
/// buffers (nothing acknowledged: `set_sources_busy`): no completion, the Success of the Write
/// the peer took and the errors alike, gives a buffer back until the transport lets go of
/// them; then all four, in order. Before, only the flushes waited: a peer withholding its ACKs
/// could read, in our retransmissions, what the application wrote into a buffer whose
/// request the Terminate had completed.
#[test]
fn a_remote_terminate_completes_nothing_the_transport_still_resends() {
    let (mut p, term) = four_requests_and_a_terminate_naming_the_second();
    p.qp.set_sources_busy(true);
    assert_eq!(receive(&mut p, &term), vec![]);
    p.qp.set_sources_busy(false);
    let got: Vec<_> = p
        .completions()
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.status))
        .collect();
    assert_eq!(got, FOUR_AFTER_THE_TERMINATE);
}

/// The same refusal with every request unsignaled: the Write the peer took completes
/// unreported, the refused one and the flushed ones are reported (a failure always is).
#[test]
fn unsignaled_requests_report_the_remote_error_and_the_flush() {
    let (mut p, src) = ours(TxCompletion::Acknowledged);
    let unsignaled_write = |p: &mut Peer, wr_id, sink, len| {
        let op = SendOp::Write {
            remote_stag: sink,
            remote_to: SINK_TO,
        };
        p.post_signaled(
            wr_id,
            op,
            Some(Sge {
                stag: src,
                to: 0,
                len,
            }),
            false,
        );
    };
    unsignaled_write(&mut p, 1, OTHER_SINK, 10);
    unsignaled_write(&mut p, 2, SINK, 3000);
    unsignaled_write(&mut p, 3, SINK, 100);
    assert_eq!(hand_out(&mut p, 100), 5);
    let refused = write_header(SINK, SINK_TO + WRITE_SEG, false);
    let term = terminate(1, 1, 1, Some((&refused, WRITE_SEG as u16)));
    assert_eq!(
        receive(&mut p, &term),
        vec![
            (2, WcOpcode::Write, WcStatus::RemoteAccessError),
            (3, WcOpcode::Write, WcStatus::WrFlushError),
        ]
    );
}

/// The Terminate names the second Send by its MSN (untagged QN 0; DDP untagged buffer error:
/// a remote operation error). The first Send was taken.
#[test]
fn send_named_by_msn_completes_with_remote_operation_error() {
    let (mut p, src) = ours(TxCompletion::Acknowledged);
    send(&mut p, 1, src, 100);
    send(&mut p, 2, src, 100);
    send(&mut p, 3, src, 100);
    assert_eq!(hand_out(&mut p, 100), 3);
    // MSNs start at 1 (RFC 5041 5.1): the second Send has MSN 2. DDP untagged, code 2 (no
    // buffer available).
    let refused = untagged_header(3, 0, 2, 0, true);
    let term = terminate(1, 2, 2, Some((&refused, 100)));
    assert_eq!(
        receive(&mut p, &term),
        vec![
            (1, WcOpcode::Send, WcStatus::Success),
            (2, WcOpcode::Send, WcStatus::RemoteOperationError),
            (3, WcOpcode::Send, WcStatus::WrFlushError),
        ]
    );
}

/// The segment's ACK covered the refused Write (the peer's TCP took its octets, its RDMAP
/// refused them): reported with `message_acknowledged_deferred`, the Terminate in the same
/// segment still names it. A Write acknowledged with it but after it is flushed (the peer
/// dropped it after terminating).
#[test]
fn write_acknowledged_by_the_terminate_segment_is_still_named() {
    let (mut p, src) = ours(TxCompletion::Acknowledged);
    write(&mut p, 1, src, SINK, 100);
    write(&mut p, 2, src, SINK, 100);
    write(&mut p, 3, src, OTHER_SINK, 100);
    assert_eq!(hand_out(&mut p, 100), 3);
    p.qp.message_acknowledged_deferred();
    p.qp.message_acknowledged_deferred();
    // RDMAP remote protection, access rights, naming the first Write to SINK.
    let refused = write_header(SINK, SINK_TO, true);
    let term = terminate(0, 1, 2, Some((&refused, 100)));
    assert_eq!(
        receive(&mut p, &term),
        vec![
            (1, WcOpcode::Write, WcStatus::RemoteAccessError),
            (2, WcOpcode::Write, WcStatus::WrFlushError),
            (3, WcOpcode::Write, WcStatus::WrFlushError),
        ]
    );
    p.qp.complete_acknowledged();
    assert!(p.completions().is_empty());
}

/// Under hand-off completion (the socket transport) a Write handed out whole completed
/// before the peer could object, so a Terminate naming it names nothing outstanding; one
/// only partly handed out is still outstanding and is named.
#[test]
fn hand_off_names_only_a_partly_handed_out_write() {
    let (mut p, src) = ours(TxCompletion::HandOff);
    write(&mut p, 1, src, SINK, 3000);
    write(&mut p, 2, src, OTHER_SINK, 3000);
    // The first Write whole, one segment of the second.
    assert_eq!(hand_out(&mut p, 4), 4);
    assert_eq!(
        p.completions()
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success)]
    );
    let refused = write_header(OTHER_SINK, SINK_TO, false);
    let term = terminate(1, 1, 0, Some((&refused, WRITE_SEG as u16)));
    assert_eq!(
        receive(&mut p, &term),
        vec![(2, WcOpcode::Write, WcStatus::RemoteAccessError)]
    );

    let (mut p, src) = ours(TxCompletion::HandOff);
    write(&mut p, 1, src, SINK, 3000);
    write(&mut p, 2, src, OTHER_SINK, 100);
    assert_eq!(hand_out(&mut p, 3), 3);
    assert_eq!(p.completions().len(), 1, "the first Write completed");
    // Names the first Write, completed already: nothing is blamed.
    let refused = write_header(SINK, SINK_TO + 2 * WRITE_SEG, true);
    let term = terminate(1, 1, 1, Some((&refused, 980)));
    assert_eq!(
        receive(&mut p, &term),
        vec![(2, WcOpcode::Write, WcStatus::WrFlushError)]
    );
}

/// Copied headers that name no outstanding work request: a Write acknowledged and completed
/// earlier, a TO outside every outstanding Write, a Read Response (answers the peer's Read,
/// no work request of ours), a Send MSN not outstanding. Nothing is blamed; what was
/// reported acknowledged completes, the rest is flushed.
#[test]
fn header_naming_nothing_outstanding_blames_nothing() {
    let cases: [(&str, Vec<u8>); 4] = [
        ("completed Write", write_header(SINK, SINK_TO, true)),
        (
            "TO beyond the Writes",
            write_header(OTHER_SINK, SINK_TO + 100, true),
        ),
        ("Read Response", {
            let mut h = write_header(OTHER_SINK, SINK_TO, true);
            h[1] = rdmap_ctrl(2);
            h
        }),
        ("Send MSN 9", untagged_header(3, 0, 9, 0, true)),
    ];
    for (what, refused) in cases {
        let (mut p, src) = ours(TxCompletion::Acknowledged);
        write(&mut p, 1, src, SINK, 100);
        write(&mut p, 2, src, OTHER_SINK, 100);
        write(&mut p, 3, src, OTHER_SINK, 100);
        send(&mut p, 4, src, 10);
        assert_eq!(hand_out(&mut p, 100), 4);
        p.qp.message_acknowledged();
        assert_eq!(
            p.completions().len(),
            1,
            "{what}: the first Write completed"
        );
        p.qp.message_acknowledged_deferred();
        let term = terminate(1, 1, 1, Some((&refused, 100)));
        assert_eq!(
            receive(&mut p, &term),
            vec![
                (2, WcOpcode::Write, WcStatus::Success),
                (3, WcOpcode::Write, WcStatus::WrFlushError),
                (4, WcOpcode::Send, WcStatus::WrFlushError),
            ],
            "{what}"
        );
    }
}

/// A Terminate without a copied header: an RDMAP remote protection error blames the oldest
/// started work request (here the oldest Write not reported acknowledged); an LLP (MPA CRC)
/// error blames nothing. What was reported acknowledged completes either way.
#[test]
fn terminate_without_copied_header() {
    for (term, blamed) in [
        (terminate(0, 1, 0xFF, None), WcStatus::RemoteAccessError),
        (terminate(2, 0, 2, None), WcStatus::WrFlushError),
    ] {
        let (mut p, src) = ours(TxCompletion::Acknowledged);
        write(&mut p, 1, src, SINK, 100);
        write(&mut p, 2, src, SINK, 100);
        send(&mut p, 3, src, 10);
        assert_eq!(hand_out(&mut p, 100), 3);
        p.qp.message_acknowledged_deferred();
        assert_eq!(
            receive(&mut p, &term),
            vec![
                (1, WcOpcode::Write, WcStatus::Success),
                (2, WcOpcode::Write, blamed),
                (3, WcOpcode::Send, WcStatus::WrFlushError),
            ]
        );
    }
}
