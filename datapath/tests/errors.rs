//! End-to-end error paths of the socket transport over 127.0.0.1: a corrupted FPDU, and RDMA
//! Writes and Reads that fail the remote checks (invalid STag, bounds, access rights). Each
//! must produce the Terminate of RFC 5040/5041 (with this project's mapping in
//! `rdmap::TerminateCause::code`), end both queue pairs in Error with the work requests
//! completed as the tests state, place nothing it must not, and leave the process and the
//! listener serving other connections.
//!
//! The relay between client and server holds the client's octets while the client posts its
//! work, so that everything is on the wire before the server can react: the order of events,
//! and therefore every completion status, is deterministic.

mod common;

use common::*;
use datapath::{
    Access, CompletionQueue, Connection, DatapathError, Listener, MemoryRegion, QpError, QpState,
    RecvWr, SendWr, SgeList, Stag, WcOpcode, WcStatus,
};
use ddp::DdpHeader;
use mpa::{MpaConfig, MpaError};
use rdmap::wire::{layer, rdmap_etype};
use rdmap::ReadRequest;
use std::time::Duration;

const TAGGED_HEADER: usize = 14;
const UNTAGGED_HEADER: usize = 18;
const READ_REQUEST: usize = 28;

/// Octets on the wire (no Markers) of an RDMA Write of `len` octets cut at `mulpdu`.
fn write_wire_len(len: usize, mulpdu: usize) -> usize {
    let room = mulpdu - TAGGED_HEADER;
    let mut total = 0;
    let mut left = len;
    loop {
        let seg = left.min(room);
        total += fpdu_len(TAGGED_HEADER + seg);
        left -= seg;
        if left == 0 {
            return total;
        }
    }
}

fn read_request_wire_len() -> usize {
    fpdu_len(UNTAGGED_HEADER + READ_REQUEST)
}

/// Both queue pairs end (bounded wait) in Error.
fn both_end_in_error(client: &Connection, server: &Connection) {
    assert!(client.qp.wait_finished(WAIT), "client QP did not end");
    assert!(server.qp.wait_finished(WAIT), "server QP did not end");
    assert_eq!(client.qp.status().state, QpState::Error);
    assert_eq!(server.qp.status().state, QpState::Error);
}

/// A queue pair that ended in Error flushes new work requests at once (verbs' flush of posts
/// to a queue pair in the error state): each completes with `WrFlushError`, nothing else.
fn flushes_new_work(conn: &Connection, cq: &CompletionQueue, region: &MemoryRegion) {
    assert_eq!(conn.qp.status().state, QpState::Error);
    conn.qp
        .post_send(send_wr(999, region, 1))
        .expect("a Send posted in Error");
    conn.qp
        .post_recv(RecvWr {
            wr_id: 998,
            sg_list: SgeList::new(),
        })
        .expect("a receive posted in Error");
    expect_wc(cq, 999, WcOpcode::Send, WcStatus::WrFlushError);
    expect_wc(cq, 998, WcOpcode::Recv, WcStatus::WrFlushError);
    assert_no_more(cq);
}

/// A Send round trip on an established pair whose server side has receive `recv_id` posted
/// into `recv_buf`.
fn send_round_trip(
    conn: &Connection,
    side: &Side,
    server_cq: &CompletionQueue,
    recv_id: u64,
    recv_buf: &MemoryRegion,
    seed: u64,
) {
    let src = side.pd.register(1000, Access::NONE).unwrap();
    let data = pattern(seed, 1000);
    src.write(0, &data);
    conn.qp.post_send(send_wr(seed, &src, 1000)).unwrap();
    let r = expect_wc(server_cq, recv_id, WcOpcode::Recv, WcStatus::Success);
    assert_eq!(r.wc.byte_len, 1000);
    assert_bytes_eq(&region_bytes(recv_buf, 0, 1000), &data, "Send");
    expect_wc(&side.cq, seed, WcOpcode::Send, WcStatus::Success);
}

/// A 64 KiB RDMA Write whose first FPDU has one payload octet flipped by the relay, after a
/// valid FPDU has gone through. With CRCs the server places nothing of it, reports MPA error 2
/// and sends a Terminate (layer LLP, etype 0, code 2); the client's outstanding Read and its
/// posted receive are flushed, the server's posted receive too; both queue pairs end in Error.
/// A connection opened before it, and one opened after it, keep working.
#[test]
fn corrupted_fpdu_with_crc_places_nothing_and_terminates() {
    const LEN: usize = 65_536;
    let p = params(mpa(2, true, false));
    let listener = Listener::bind(any_port(), p.clone()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Side::new();
    let before = pattern(77, LEN + 64);
    let target = server
        .pd
        .register(LEN + 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    target.write(0, &before);
    let source = server.pd.register(64, Access::REMOTE_READ).unwrap();
    let recv_buf = server.pd.register(1000, Access::LOCAL_WRITE).unwrap();
    let bystander_buf = server.pd.register(1000, Access::LOCAL_WRITE).unwrap();
    let recv = |wr_id, mr: &MemoryRegion| RecvWr {
        wr_id,
        sg_list: mr.sge(0, 1000).into(),
    };

    // A clean connection that stays open throughout.
    let bystander = Side::new();
    let (by_c, by_s) = establish(
        &listener,
        addr,
        &bystander,
        &p,
        &[],
        ServerPlan {
            side: &server,
            private_data: &[],
            recvs: vec![recv(50, &bystander_buf), recv(51, &bystander_buf)],
        },
    );
    let (by_c, by_s) = (by_c.unwrap(), by_s.unwrap());
    send_round_trip(&by_c, &bystander, &server.cq, 50, &bystander_buf, 500);

    let relay = Relay::start(addr);
    let client = Side::new();
    let (c, s) = establish(
        &listener,
        relay.addr(),
        &client,
        &p,
        &[],
        ServerPlan {
            side: &server,
            private_data: &[],
            recvs: vec![recv(1, &recv_buf), recv(2, &recv_buf)],
        },
    );
    let (c, s) = (c.unwrap(), s.unwrap());
    // A valid FPDU first: the responder may send (its Terminate) only after one (RFC 5044
    // 7.1.2 rule 4).
    send_round_trip(&c, &client, &server.cq, 1, &recv_buf, 100);

    let src = client.pd.register(LEN, Access::NONE).unwrap();
    src.write(0, &pattern(78, LEN));
    let sink = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    c.qp.post_recv(RecvWr {
        wr_id: 20,
        sg_list: sink.sge(0, 64).into(),
    })
    .unwrap();
    relay.hold();
    let base = relay.c2s_read();
    // Octet 1000 of the Write's first FPDU: after the 2-octet ULPDU_Length and the 14-octet DDP
    // header, well inside the payload.
    relay.corrupt_in(1000);
    let write = write_wr(10, &src, LEN, target.stag(), target.base_to());
    c.qp.post_send(write).unwrap();
    c.qp.post_send(read_wr(11, &sink, 64, source.stag(), source.base_to()))
        .unwrap();
    // The Write completes once handed to the transport (rdmap's completion policy).
    expect_wc(&client.cq, 10, WcOpcode::Write, WcStatus::Success);
    let wire = write_wire_len(LEN, c.qp.mulpdu()) + read_request_wire_len();
    relay.wait_c2s_read(base + wire as u64);
    let (at, original, now) = relay.corrupted().expect("relay did not corrupt");
    assert_eq!(at, base + 1000);
    assert_ne!(original, now);
    relay.release();

    both_end_in_error(&c, &s);
    let cs = c.qp.status();
    let term = cs.remote_terminate.expect("client got no Terminate");
    assert_eq!(
        (term.layer, term.etype, term.code),
        (layer::LLP, 0, 2),
        "{term:?}"
    );
    // RFC 5040 Figure 10: an LLP error carries no copied headers.
    assert_eq!(
        (term.segment_len, term.ddp_header, term.read_request),
        (None, None, None)
    );
    assert_eq!(cs.sent_terminate, None);
    let ss = s.qp.status();
    assert_eq!(ss.sent_terminate, Some(term));
    assert_eq!(ss.remote_terminate, None);
    let err = ss.error.expect("server reported no error");
    assert!(
        matches!(err, QpError::Mpa(MpaError::CrcMismatch { .. })),
        "{err:?}"
    );

    // Nothing of the corrupted FPDU (nor of the FPDU after it) was placed.
    assert_bytes_eq(
        &region_bytes(&target, 0, LEN + 64),
        &before,
        "target region",
    );
    expect_wc(&client.cq, 11, WcOpcode::Read, WcStatus::WrFlushError);
    expect_wc(&client.cq, 20, WcOpcode::Recv, WcStatus::WrFlushError);
    flushes_new_work(&c, &client.cq, &src);
    let flushed = next_wc(&server.cq, "the server's flushed receive");
    assert_eq!(flushed.qp_num, s.qp.num());
    assert_eq!(
        (flushed.wc.wr_id, flushed.wc.status),
        (2, WcStatus::WrFlushError)
    );
    assert_no_more(&server.cq);

    // The process and the listener go on: the open connection still works, and so does a new
    // one.
    send_round_trip(&by_c, &bystander, &server.cq, 51, &bystander_buf, 501);
    assert_eq!(by_s.qp.status().state, QpState::Rts);
    verified_transfers(
        &listener,
        addr,
        &p,
        &[Size::Bytes(1), Size::Bytes(100_000)],
        5,
    );
}

/// RFC 6581 9.2 over kernel TCP: a peer-to-peer client that can send no RTR kind the server
/// supports fails its connect with code 7, and the server's queue pair (accepted, offering
/// the kinds it supports) receives the client's Terminate (Layer 2, EType 0, code 7) and
/// ends in Error.
#[test]
fn no_common_rtr_kind_ends_with_a_terminate_of_code_7() {
    let server_params = params(MpaConfig {
        rtr_send: true,
        rtr_write: false,
        rtr_read: false,
        ..MpaConfig::default()
    });
    let client_params = params(MpaConfig {
        peer_to_peer: true,
        rtr_send: false,
        rtr_write: true,
        rtr_read: false,
        ..MpaConfig::default()
    });
    let listener = Listener::bind(any_port(), server_params).unwrap();
    let (client, server) = (Side::new(), Side::new());
    let (c, s) = establish(
        &listener,
        listener.local_addr().unwrap(),
        &client,
        &client_params,
        &[],
        ServerPlan {
            side: &server,
            private_data: &[],
            recvs: Vec::new(),
        },
    );
    assert!(
        matches!(c, Err(DatapathError::Mpa(MpaError::NoMatchingRtr))),
        "{:?}",
        c.err()
    );
    let s = s.expect("the server accepts, offering its RTR kinds");
    assert!(s.qp.wait_finished(WAIT), "server QP did not end");
    let st = s.qp.status();
    assert_eq!(st.state, QpState::Error);
    let t = st.remote_terminate.expect("the client's Terminate");
    assert_eq!((t.layer, t.etype, t.code), (layer::LLP, 0, 7), "{t:?}");
}

/// A peer-to-peer client that finishes the MPA exchange and then sends nothing, not even its
/// RTR (RFC 6581 5: setup ends with it): `MpaConfig::timeout` after the accept the server's
/// queue pair ends in Error with `RtrTimeout`, having sent nothing (a responder may not
/// before the first FPDU, RFC 5044 7.1.2 rule 4), and the connection is closed.
#[test]
fn a_peer_to_peer_client_that_never_sends_its_rtr_is_cut_off() {
    use std::io::Read;
    let server_params = params(MpaConfig {
        timeout: Duration::from_secs(2),
        ..MpaConfig::default()
    });
    let listener = Listener::bind(any_port(), server_params).unwrap();
    let request = mpa::Initiator::new(
        MpaConfig {
            peer_to_peer: true,
            ..MpaConfig::default()
        },
        &[],
        std::time::Instant::now(),
    )
    .unwrap()
    .request()
    .to_vec();
    let mut peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    std::io::Write::write_all(&mut peer, &request).unwrap();
    let server = Side::new();
    let req = listener.accept_timeout(WAIT).unwrap().expect("the Request");
    let accepted = std::time::Instant::now();
    let s = req.accept(&server.pd, &server.cq, &[]).unwrap();
    // The Reply (20 octets and the RFC 6581 block), and nothing after it.
    peer.set_read_timeout(Some(WAIT)).unwrap();
    let mut reply = [0u8; 24];
    peer.read_exact(&mut reply).unwrap();
    assert!(s.qp.wait_finished(WAIT), "server QP did not end");
    let waited = accepted.elapsed();
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(10),
        "ended after {waited:?}"
    );
    let st = s.qp.status();
    assert_eq!(st.state, QpState::Error);
    assert_eq!(st.error, Some(QpError::Mpa(MpaError::RtrTimeout)));
    assert_eq!(st.sent_terminate, None);
    let mut rest = Vec::new();
    assert_eq!(
        peer.read_to_end(&mut rest).map(|_| rest.len()).unwrap_or(0),
        0
    );
}

/// The same corruption with CRCs off on both sides goes undetected: the Write is placed with
/// exactly that one octet changed (at payload offset 1000 - 2 - 14), which shows the relay hits
/// the payload and that the CRC is what catches it above.
#[test]
fn corrupted_fpdu_without_crc_is_placed_as_received() {
    const LEN: usize = 65_536;
    let p = params(mpa(2, false, false));
    let listener = Listener::bind(any_port(), p.clone()).unwrap();
    let relay = Relay::start(listener.local_addr().unwrap());
    let (client, server) = (Side::new(), Side::new());
    let target = server
        .pd
        .register(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let recv_buf = server.pd.register(1000, Access::LOCAL_WRITE).unwrap();
    let recvs = (1..=2)
        .map(|wr_id| RecvWr {
            wr_id,
            sg_list: recv_buf.sge(0, 1000).into(),
        })
        .collect();
    let (c, s) = establish(
        &listener,
        relay.addr(),
        &client,
        &p,
        &[],
        ServerPlan {
            side: &server,
            private_data: &[],
            recvs,
        },
    );
    let (c, s) = (c.unwrap(), s.unwrap());
    assert!(!c.qp.negotiated().expect("MPA").crc);
    send_round_trip(&c, &client, &server.cq, 1, &recv_buf, 100);

    let data = pattern(79, LEN);
    let src = client.pd.register(LEN, Access::NONE).unwrap();
    src.write(0, &data);
    relay.corrupt_in(1000);
    c.qp.post_send(write_wr(10, &src, LEN, target.stag(), target.base_to()))
        .unwrap();
    expect_wc(&client.cq, 10, WcOpcode::Write, WcStatus::Success);
    send_round_trip(&c, &client, &server.cq, 2, &recv_buf, 101);
    let (_, original, now) = relay.corrupted().expect("relay did not corrupt");
    let mut want = data;
    let i = 1000 - 2 - TAGGED_HEADER;
    assert_eq!(want[i], original);
    want[i] = now;
    assert_bytes_eq(&region_bytes(&target, 0, LEN), &want, "target region");
    assert_eq!(s.qp.status().error, None);
    assert_eq!(c.qp.status().state, QpState::Rts);
}

/// The very first FPDU the responder receives is corrupted. The responder may send nothing
/// before it has received a valid FPDU (RFC 5044 7.1.2 rule 4), so no Terminate can go: the
/// server reports the CRC error and closes; both queue pairs end in Error, the posted receives
/// are flushed, nothing is placed.
#[test]
fn corrupted_first_fpdu_closes_without_terminate() {
    const LEN: usize = 4000;
    let p = params(mpa(2, true, false));
    let listener = Listener::bind(any_port(), p.clone()).unwrap();
    let addr = listener.local_addr().unwrap();
    let relay = Relay::start(addr);
    let (client, server) = (Side::new(), Side::new());
    let target = server
        .pd
        .register(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let recv_buf = server.pd.register(64, Access::LOCAL_WRITE).unwrap();
    let (c, s) = establish(
        &listener,
        relay.addr(),
        &client,
        &p,
        &[],
        ServerPlan {
            side: &server,
            private_data: &[],
            recvs: vec![RecvWr {
                wr_id: 1,
                sg_list: recv_buf.sge(0, 64).into(),
            }],
        },
    );
    let (c, s) = (c.unwrap(), s.unwrap());
    let src = client.pd.register(LEN, Access::NONE).unwrap();
    src.write(0, &pattern(80, LEN));
    c.qp.post_recv(RecvWr {
        wr_id: 20,
        sg_list: SgeList::new(),
    })
    .unwrap();
    relay.corrupt_in(100);
    c.qp.post_send(write_wr(10, &src, LEN, target.stag(), target.base_to()))
        .unwrap();
    expect_wc(&client.cq, 10, WcOpcode::Write, WcStatus::Success);

    both_end_in_error(&c, &s);
    assert!(relay.corrupted().is_some());
    let ss = s.qp.status();
    assert_eq!((ss.sent_terminate, ss.remote_terminate), (None, None));
    let err = ss.error.expect("server reported no error");
    assert!(
        matches!(err, QpError::Mpa(MpaError::CrcMismatch { .. })),
        "{err:?}"
    );
    let cs = c.qp.status();
    assert_eq!((cs.remote_terminate, cs.sent_terminate), (None, None));
    assert!(
        matches!(cs.error, Some(QpError::PeerClosed | QpError::PeerReset)),
        "{:?}",
        cs.error
    );
    assert_eq!(region_bytes(&target, 0, LEN), vec![0; LEN]);
    expect_wc(&client.cq, 20, WcOpcode::Recv, WcStatus::WrFlushError);
    expect_wc(&server.cq, 1, WcOpcode::Recv, WcStatus::WrFlushError);
    flushes_new_work(&c, &client.cq, &src);
    assert_no_more(&server.cq);
    verified_transfers(&listener, addr, &p, &[Size::Bytes(10)], 6);
}

/// The server-side memory of the access-error tests and a connection to it through a relay.
struct AccessRig {
    listener: Listener,
    relay: Relay,
    client: Side,
    server: Side,
    c: Connection,
    s: Connection,
    /// REMOTE_WRITE region, pre-filled with `before`.
    target: MemoryRegion,
    /// LOCAL_WRITE | REMOTE_READ region, pre-filled with `before`.
    readable: MemoryRegion,
    /// LOCAL_WRITE only: neither remote right.
    private: MemoryRegion,
    before: Vec<u8>,
    /// Client memory: source of Writes, sink of Reads.
    src: MemoryRegion,
    sink: MemoryRegion,
}

const REGION: usize = 8192;

impl AccessRig {
    fn new() -> AccessRig {
        let p = params(mpa(2, true, false));
        let listener = Listener::bind(any_port(), p.clone()).unwrap();
        let relay = Relay::start(listener.local_addr().unwrap());
        let (client, server) = (Side::new(), Side::new());
        let before = pattern(90, REGION);
        let target = server
            .pd
            .register(REGION, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let readable = server
            .pd
            .register(REGION, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
        let private = server.pd.register(REGION, Access::LOCAL_WRITE).unwrap();
        for mr in [&target, &readable, &private] {
            mr.write(0, &before);
        }
        // The server's posted receive (into `private`, which allows local writes).
        let recvs = vec![RecvWr {
            wr_id: 1,
            sg_list: private.sge(0, 64).into(),
        }];
        let (c, s) = establish(
            &listener,
            relay.addr(),
            &client,
            &p,
            &[],
            ServerPlan {
                side: &server,
                private_data: &[],
                recvs,
            },
        );
        let src = client.pd.register(REGION, Access::NONE).unwrap();
        src.write(0, &pattern(91, REGION));
        let sink = client.pd.register(REGION, Access::LOCAL_WRITE).unwrap();
        AccessRig {
            listener,
            relay,
            client,
            server,
            c: c.unwrap(),
            s: s.unwrap(),
            target,
            readable,
            private,
            before,
            src,
            sink,
        }
    }

    /// Posts a client receive, then `first` and two valid 64-octet Reads behind it, all held
    /// by the relay until the client has sent `first_wire` + two Read Requests' octets.
    fn post_held(&self, first: SendWr, first_wire: usize) {
        self.c
            .qp
            .post_recv(RecvWr {
                wr_id: 20,
                sg_list: self.sink.sge(4096, 64).into(),
            })
            .unwrap();
        self.relay.hold();
        let base = self.relay.c2s_read();
        self.c.qp.post_send(first).unwrap();
        for (id, at) in [(11, 2048), (12, 3072)] {
            let read = read_wr(
                id,
                &self.sink,
                64,
                self.readable.stag(),
                self.readable.base_to() + at,
            );
            self.c.qp.post_send(read).unwrap();
        }
        let wire = first_wire + 2 * read_request_wire_len();
        self.relay.wait_c2s_read(base + wire as u64);
        self.relay.release();
    }

    /// The Terminate the client received, which must be the one the server sent, with the
    /// expected (layer, etype, code); both queue pairs in Error; the server's memory untouched;
    /// the server's receive flushed; then a fresh connection on the same listener works.
    fn check_terminate(&self, want: (u8, u8, u8)) -> rdmap::TerminateInfo {
        both_end_in_error(&self.c, &self.s);
        let cs = self.c.qp.status();
        let ss = self.s.qp.status();
        let term = cs.remote_terminate.expect("client got no Terminate");
        assert_eq!((term.layer, term.etype, term.code), want, "{term:?}");
        assert_eq!(ss.sent_terminate, Some(term));
        assert_eq!((cs.sent_terminate, ss.remote_terminate), (None, None));
        assert_eq!(ss.error, Some(QpError::LocalTerminate(term)));
        assert_eq!(cs.error, Some(QpError::RemoteTerminate(term)));
        for mr in [&self.target, &self.readable, &self.private] {
            assert_bytes_eq(&region_bytes(mr, 0, REGION), &self.before, "server memory");
        }
        expect_wc(&self.server.cq, 1, WcOpcode::Recv, WcStatus::WrFlushError);
        assert_no_more(&self.server.cq);
        term
    }

    fn fresh_connection_works(&self) {
        let addr = self.listener.local_addr().unwrap();
        let p = params(mpa(2, true, false));
        verified_transfers(
            &self.listener,
            addr,
            &p,
            &[Size::Bytes(3), Size::Bytes(70_000)],
            8,
        );
    }
}

/// An RDMA Write the server must refuse: the Terminate carries (layer, etype, code) and, per
/// RFC 5040 Figure 10, the refused segment's DDP header and length. On the client the Write
/// itself has completed successfully (it completes when handed to the transport, before the
/// peer could object). The Terminate's copied DDP header names the Write, not any outstanding
/// work request, so nothing is blamed: both Reads and the posted receive are flushed.
fn bad_write(stag: impl Fn(&AccessRig) -> (Stag, u64), want: (u8, u8, u8)) {
    const LEN: usize = 100;
    let rig = AccessRig::new();
    let (stag, to) = stag(&rig);
    rig.post_held(
        write_wr(10, &rig.src, LEN, stag, to),
        write_wire_len(LEN, rig.c.qp.mulpdu()),
    );
    let term = rig.check_terminate(want);
    let copied = term.ddp_header.expect("no DDP header in the Terminate");
    match DdpHeader::parse(copied.as_bytes()).unwrap().0 {
        DdpHeader::Tagged(h) => {
            assert_eq!((h.stag, h.to, h.last), (stag.raw(), to, true))
        }
        other => panic!("copied header {other:?}"),
    }
    assert_eq!(term.segment_len, Some(LEN as u16));
    assert_eq!(term.read_request, None);
    let cq = &rig.client.cq;
    expect_wc(cq, 10, WcOpcode::Write, WcStatus::Success);
    expect_wc(cq, 11, WcOpcode::Read, WcStatus::WrFlushError);
    expect_wc(cq, 12, WcOpcode::Read, WcStatus::WrFlushError);
    expect_wc(cq, 20, WcOpcode::Recv, WcStatus::WrFlushError);
    assert_eq!(
        region_bytes(&rig.sink, 2048, 64),
        vec![0; 64],
        "a Read placed"
    );
    flushes_new_work(&rig.c, cq, &rig.src);
    rig.fresh_connection_works();
}

/// An STag the server never registered: DDP tagged buffer error, Invalid STag (RFC 5041 7.2:
/// layer 1, etype 1, code 0x00).
#[test]
fn write_to_unregistered_stag() {
    bad_write(
        |rig| (Stag::new(0x00AB_CDEF, 0x5A), rig.target.base_to()),
        (layer::DDP, 1, 0x00),
    );
}

/// A TO range that runs past the end of the region: DDP Base or bounds violation (1/1/0x01).
#[test]
fn write_beyond_the_region_end() {
    bad_write(
        |rig| {
            let t = &rig.target;
            (t.stag(), t.base_to() + t.len() as u64 - 50)
        },
        (layer::DDP, 1, 0x01),
    );
}

/// A region registered without REMOTE_WRITE: DDP has no code for access rights, so, as siw,
/// an invalid STag (layer 1, etype 1, code 0x00; RFC 5040 Figure 10 keeps RDMAP's remote
/// protection codes for Read Requests and Sends with Invalidate).
#[test]
fn write_without_remote_write_access() {
    bad_write(
        |rig| (rig.readable.stag(), rig.readable.base_to()),
        (layer::DDP, 1, 0x00),
    );
}

/// An RDMA Read the server must refuse: RDMAP remote protection Terminate with the Read
/// Request header (RFC 5040 Figure 10); the client's Read named by it completes with
/// RemoteAccessError, the Read behind it and the posted receive are flushed, nothing lands in
/// the sink.
fn bad_read(source: impl Fn(&AccessRig) -> (Stag, u64), code: u8) {
    let rig = AccessRig::new();
    let (stag, to) = source(&rig);
    rig.post_held(
        read_wr(10, &rig.sink, 64, stag, to),
        read_request_wire_len(),
    );
    let term = rig.check_terminate((layer::RDMAP, rdmap_etype::REMOTE_PROTECTION, code));
    assert_eq!(
        term.read_request,
        Some(ReadRequest {
            sink_stag: rig.sink.stag().raw(),
            sink_to: rig.sink.base_to(),
            size: 64,
            src_stag: stag.raw(),
            src_to: to,
        })
    );
    match DdpHeader::parse(term.ddp_header.unwrap().as_bytes())
        .unwrap()
        .0
    {
        DdpHeader::Untagged(h) => assert_eq!((h.qn, h.msn), (1, 1), "Read Request queue"),
        other => panic!("copied header {other:?}"),
    }
    let cq = &rig.client.cq;
    expect_wc(cq, 10, WcOpcode::Read, WcStatus::RemoteAccessError);
    expect_wc(cq, 11, WcOpcode::Read, WcStatus::WrFlushError);
    expect_wc(cq, 12, WcOpcode::Read, WcStatus::WrFlushError);
    expect_wc(cq, 20, WcOpcode::Recv, WcStatus::WrFlushError);
    assert_eq!(region_bytes(&rig.sink, 0, REGION), vec![0; REGION]);
    flushes_new_work(&rig.c, cq, &rig.src);
    rig.fresh_connection_works();
}

/// A Read from a region registered without REMOTE_READ: remote protection, access rights
/// (0/1/0x02).
#[test]
fn read_without_remote_read_access() {
    bad_read(|rig| (rig.target.stag(), rig.target.base_to()), 0x02);
}

/// A Read from an STag the server never registered: remote protection, invalid STag (0/1/0x00).
#[test]
fn read_from_unregistered_stag() {
    bad_read(
        |rig| (Stag::new(0x00AB_CDEF, 0x5A), rig.readable.base_to()),
        0x00,
    );
}

/// A Read past the end of the source region: remote protection, base or bounds (0/1/0x01).
#[test]
fn read_beyond_the_region_end() {
    bad_read(
        |rig| {
            let r = &rig.readable;
            (r.stag(), r.base_to() + r.len() as u64 - 10)
        },
        0x01,
    );
}
