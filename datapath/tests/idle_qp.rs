//! Queue pairs created before their connection ([`IdleQp`]; verbs' `rdma_create_qp` then
//! `ibv_post_recv` then `rdma_connect` or `rdma_accept`): the number is the queue pair's from
//! creation on and the running queue pair keeps it; receives posted before the connection are
//! in place for a Send the peer makes at once (peer-to-peer setup, RFC 6581: iWARP has no
//! receiver-not-ready retry, RFC 5041 7.1); posts the queue pair cannot take are refused at
//! the post; an accept's queue pair has the settings it was created with. The socket
//! transport on loopback; the AF_XDP engine on the veth bed as initiator and as responder
//! (root, `SKIPPED` without, a failure under `CI=true`) against the socket transport.

mod common;

use std::net::SocketAddr;
use std::sync::mpsc;

use common::{any_port, bed, next_wc, p2p, send_wr, Side, WAIT};
use datapath::{
    Access, CmEvent, CmEventChannel, CompletionQueue, ConnectParams, ConnectRequest, Connection,
    DatapathError, Device, IdleQp, Listener, MemoryRegion, ProtectionDomain, RdmapError, RecvWr,
    SharedReceiveQueue, Transport, WcOpcode, WcStatus, MAX_QP_WR,
};
use testbed::{bed_or_skip, ADDR_A, ADDR_B, DEV_A, NS_A};

/// Octets of a greeting.
const LEN: usize = 64;

fn greeting() -> Vec<u8> {
    (0..LEN as u8).map(|i| i ^ 0xa5).collect()
}

/// A receive of `sink`'s first `LEN` octets.
fn recv(wr_id: u64, sink: &MemoryRegion) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: sink.sge(0, LEN as u32).into(),
    }
}

/// Posts the greeting on `conn` at once (from `side`'s memory) and holds the connection until
/// `done`.
fn greet(conn: Connection, side: &Side, done: &mpsc::Receiver<()>) -> Result<(), String> {
    let src = side
        .pd
        .register(LEN, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    src.write(0, &greeting());
    conn.qp
        .post_send(send_wr(1, &src, LEN))
        .map_err(|e| format!("post the greeting: {e}"))?;
    let _ = done.recv_timeout(WAIT);
    Ok(())
}

/// The greeting reached receive `wr_id` of `sink`, posted to the idle queue pair numbered
/// `num`, which `conn` runs as its queue pair.
fn greeted(conn: &Connection, side: &Side, sink: &MemoryRegion, num: u32, what: &str) {
    assert_eq!(
        conn.qp.num(),
        num,
        "{what}: the running queue pair's number"
    );
    let c = next_wc(&side.cq, what);
    assert_eq!(
        (
            c.qp_num,
            c.wc.wr_id,
            c.wc.opcode,
            c.wc.status,
            c.wc.byte_len
        ),
        (num, 7, WcOpcode::Recv, WcStatus::Success, LEN as u32),
        "{what}: {c:?}"
    );
    let mut got = vec![0u8; LEN];
    sink.read(0, &mut got);
    assert_eq!(got, greeting(), "{what}: the greeting's octets");
    assert_eq!(conn.qp.status().error, None, "{what}");
}

/// An idle queue pair of `side` with a receive queue of one, and its receive of `sink` posted.
fn idle_with_a_recv(side: &Side, sink: &MemoryRegion) -> IdleQp {
    let qp = IdleQp::new(&side.pd, &side.cq, &p2p(1)).expect("create the queue pair");
    qp.post_recv(recv(7, sink)).expect("post before connecting");
    assert_eq!(qp.recvs_posted(), 1);
    qp
}

/// The receives `wr_ids` of the queue pair numbered `num` are on `cq` already, in order,
/// completed as flushed (a failed connect or accept leaves the queue pair in Error), and
/// nothing else is.
fn flushed(cq: &CompletionQueue, num: u32, wr_ids: &[u64], what: &str) {
    for &wr_id in wr_ids {
        let c = cq
            .try_next()
            .unwrap_or_else(|| panic!("{what}: receive {wr_id} not flushed"));
        assert_eq!(
            (c.qp_num, c.wc.wr_id, c.wc.opcode, c.wc.status),
            (num, wr_id, WcOpcode::Recv, WcStatus::WrFlushError),
            "{what}: {c:?}"
        );
    }
    assert!(
        cq.is_empty(),
        "{what}: more completions: {:?}",
        cq.try_next()
    );
}

/// An idle queue pair of a new side whose receive completions go to a queue of their own
/// (returned), with a receive of each of `wr_ids` posted into the region returned.
fn idle_with_a_recv_cq(wr_ids: &[u64]) -> (Side, CompletionQueue, IdleQp, MemoryRegion) {
    let side = Side::new();
    let recv_cq = CompletionQueue::new();
    let params = ConnectParams {
        recv_cq: Some(recv_cq.clone()),
        ..p2p(wr_ids.len())
    };
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let qp = IdleQp::new(&side.pd, &side.cq, &params).expect("create");
    qp.post_recv_list(wr_ids.iter().map(|&id| recv(id, &sink)))
        .expect("post before connecting");
    (side, recv_cq, qp, sink)
}

/// Listens on loopback and rejects the first connection request.
fn rejecting_server() -> (SocketAddr, std::thread::JoinHandle<Result<(), String>>) {
    common::serve_one(p2p(4), |req| req.reject(b"no").map_err(|e| e.to_string()))
}

/// Listens on loopback with peer-to-peer setup and greets the first connection at once.
fn greeting_server() -> (
    SocketAddr,
    mpsc::Sender<()>,
    std::thread::JoinHandle<Result<(), String>>,
) {
    let (done_tx, done_rx) = mpsc::channel();
    let (addr, server) = common::serve_one(p2p(4), move |req| {
        let side = Side::new();
        let conn = req
            .accept(&side.pd, &side.cq, &[])
            .map_err(|e| format!("accept: {e}"))?;
        greet(conn, &side, &done_rx)
    });
    (addr, done_tx, server)
}

#[test]
fn numbers_are_the_queue_pairs_from_creation_and_unique() {
    let side = Side::new();
    let a = IdleQp::new(&side.pd, &side.cq, &p2p(1)).expect("a");
    let b = IdleQp::new(&side.pd, &side.cq, &p2p(1)).expect("b");
    assert_ne!(a.num(), b.num());
    assert_ne!(a.num(), 0, "0 is no queue pair's number");
}

/// Creation refuses what a connect would: depths out of bounds, a shared receive queue of
/// another protection domain.
#[test]
fn creation_refuses_bad_parameters() {
    let side = Side::new();
    let deep = ConnectParams {
        rq_depth: MAX_QP_WR + 1,
        ..p2p(1)
    };
    assert!(matches!(
        IdleQp::new(&side.pd, &side.cq, &deep),
        Err(DatapathError::InvalidArgument(_))
    ));
    let other = ProtectionDomain::new();
    let foreign = ConnectParams {
        srq: Some(SharedReceiveQueue::new(&other, 4).expect("srq")),
        ..p2p(1)
    };
    assert!(matches!(
        IdleQp::new(&side.pd, &side.cq, &foreign),
        Err(DatapathError::InvalidArgument(_))
    ));
}

/// Each refusal is the running queue pair's error for the same post, and leaves nothing
/// posted; a list stops at the first refused and says how many went before.
#[test]
fn posts_it_cannot_take_are_refused_at_the_post() {
    let side = Side::new();
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let qp = IdleQp::new(&side.pd, &side.cq, &p2p(2)).expect("create");

    let read_only = side.pd.register(LEN, Access::NONE).expect("read-only");
    match qp.post_recv(recv(1, &read_only)) {
        Err(DatapathError::InvalidArgument(_)) => {}
        other => panic!("a receive into memory without local write: {other:?}"),
    }
    let other_pd = ProtectionDomain::new();
    let foreign = other_pd
        .register(LEN, Access::LOCAL_WRITE)
        .expect("foreign");
    match qp.post_recv(recv(2, &foreign)) {
        Err(DatapathError::InvalidArgument(_)) => {}
        other => panic!("a receive into another protection domain's memory: {other:?}"),
    }
    assert_eq!(qp.recvs_posted(), 0);

    let err = qp
        .post_recv_list([recv(3, &sink), recv(4, &sink), recv(5, &sink)])
        .expect_err("three receives in a queue of two");
    assert_eq!(err.posted, 2, "{err:?}");
    assert!(
        matches!(err.source, DatapathError::RecvQueueFull { depth: 2 }),
        "{err:?}"
    );
    assert_eq!(qp.recvs_posted(), 2);

    let with_srq = ConnectParams {
        srq: Some(SharedReceiveQueue::new(&side.pd, 4).expect("srq")),
        ..p2p(1)
    };
    let fed = IdleQp::new(&side.pd, &side.cq, &with_srq).expect("create with an SRQ");
    match fed.post_recv(recv(6, &sink)) {
        Err(DatapathError::InvalidWorkRequest(RdmapError::SrqAttached)) => {}
        other => panic!("a receive on a queue pair fed by an SRQ: {other:?}"),
    }
}

#[test]
fn socket_connect_of_an_idle_qp_keeps_its_number_and_receives() {
    let (addr, done, server) = greeting_server();
    let side = Side::new();
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let qp = idle_with_a_recv(&side, &sink);
    let num = qp.num();
    let conn = Device::socket().connect_qp(qp, addr, &[]).expect("connect");
    greeted(&conn, &side, &sink, num, "socket");
    // The receive counted against the queue's depth of one until it was used.
    conn.qp
        .post_recv(recv(8, &sink))
        .expect("a receive in the freed place");
    let _ = done.send(());
    server.join().expect("server thread").expect("server");
}

/// The same through an event channel: the `Established` event's queue pair is the idle one.
#[test]
fn socket_connect_async_of_an_idle_qp() {
    let (addr, done, server) = greeting_server();
    let side = Side::new();
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let qp = idle_with_a_recv(&side, &sink);
    let num = qp.num();
    let channel = CmEventChannel::new().expect("event channel");
    Device::socket()
        .connect_qp_async(qp, addr, &[], &channel, 5)
        .expect("connect_async");
    let conn = match channel.wait_event(WAIT) {
        Some(CmEvent::Established {
            context: 5,
            connection,
        }) => connection,
        other => panic!("not established: {other:?}"),
    };
    greeted(&conn, &side, &sink, num, "socket, event channel");
    let _ = done.send(());
    server.join().expect("server thread").expect("server");
}

/// The connection's settings come from the queue pair for an idle one: its IRD and ORD as set
/// before the connect are what the Request asks for.
#[test]
fn socket_connect_of_an_idle_qp_asks_for_its_ird_ord() {
    let listener = Listener::bind(any_port(), p2p(4)).expect("listen");
    let addr = listener.local_addr().expect("address");
    let server = std::thread::spawn(move || {
        let req = listener
            .accept_timeout(WAIT)
            .expect("accept")
            .expect("a connection request");
        let asked = req.offered_ird_ord();
        let side = Side::new();
        let conn = req.accept(&side.pd, &side.cq, &[]).expect("accept");
        (asked, conn)
    });
    let side = Side::new();
    let mut qp = IdleQp::new(&side.pd, &side.cq, &p2p(1)).expect("create");
    qp.set_ird_ord(3, 2);
    let idle = qp.attr();
    assert_eq!(
        (
            idle.state,
            idle.ird,
            idle.ord,
            idle.sq_depth,
            idle.rq_depth,
            idle.mulpdu
        ),
        (datapath::QpState::Idle, 3, 2, p2p(1).sq_depth, 1, 0),
        "{idle:?}"
    );
    let conn = Device::socket().connect_qp(qp, addr, &[]).expect("connect");
    let (asked, _server_conn) = server.join().expect("server thread");
    assert_eq!(asked, Some((3, 2)), "the Request's IRD and ORD");
    let attr = conn.qp.attr();
    assert_eq!((attr.ord, attr.rq_depth), (2, 1), "{attr:?}");
}

/// Accepts the next request on `listener` with an idle queue pair whose settings differ from
/// the listener's (a receive queue of one against four), a receive posted; returns the
/// connection, the queue pair's number and what it was given.
fn accept_with_an_idle_qp(
    req: ConnectRequest,
) -> Result<(Connection, u32, Side, MemoryRegion), String> {
    let side = Side::new();
    let sink = side
        .pd
        .register(LEN, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    // The request's own depths are overridden by the queue pair's.
    let req = req.queue_depths(16, 16);
    let qp = idle_with_a_recv(&side, &sink);
    let num = qp.num();
    let conn = req.accept_qp(qp, &[]).map_err(|e| format!("accept: {e}"))?;
    let attr = conn.qp.attr();
    if attr.rq_depth != 1 {
        return Err(format!("the accepted queue pair's depth: {attr:?}"));
    }
    Ok((conn, num, side, sink))
}

#[test]
fn socket_accept_of_an_idle_qp_keeps_its_number_receives_and_depths() {
    let listener = Listener::bind(any_port(), p2p(4)).expect("listen");
    let addr = listener.local_addr().expect("address");
    let (done_tx, done_rx) = mpsc::channel();
    let client = std::thread::spawn(move || {
        let side = Side::new();
        let conn = datapath::connect(addr, &side.pd, &side.cq, &p2p(4), &[])
            .map_err(|e| format!("connect: {e}"))?;
        greet(conn, &side, &done_rx)
    });
    let req = listener
        .accept_timeout(WAIT)
        .expect("accept")
        .expect("a connection request");
    let (conn, num, side, sink) = accept_with_an_idle_qp(req).expect("accept");
    greeted(&conn, &side, &sink, num, "socket responder");
    let _ = done_tx.send(());
    client.join().expect("client thread").expect("client");
}

#[test]
fn engine_connect_of_an_idle_qp_keeps_its_number_and_receives() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_674;
    let (done_tx, done_rx) = mpsc::channel();
    let server = move |ready| {
        let req = bed::listen_in_b_with(PORT, &ready, WAIT, p2p(4))?;
        let side = Side::new();
        let conn = req
            .accept(&side.pd, &side.cq, &[])
            .map_err(|e| format!("accept: {e}"))?;
        greet(conn, &side, &done_rx)
    };
    bed::device_against(server, move |device| {
        let side = Side::new();
        let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
        let qp = idle_with_a_recv(&side, &sink);
        let num = qp.num();
        let conn = device
            .connect_qp(qp, SocketAddr::from((ADDR_B, PORT)), &[])
            .map_err(|e| format!("connect: {e}"))?;
        greeted(&conn, &side, &sink, num, "engine initiator");
        let _ = done_tx.send(());
        Ok(())
    });
}

#[test]
fn engine_accept_of_an_idle_qp_keeps_its_number_receives_and_depths() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_675;
    let (done_tx, done_rx) = mpsc::channel();
    // The client: the socket transport in `iwb`, greeting as soon as it is connected.
    let client = move |ready: mpsc::Receiver<()>| -> Result<(), String> {
        testbed::enter_ns(testbed::NS_B).map_err(|e| e.to_string())?;
        ready
            .recv_timeout(WAIT)
            .map_err(|_| "the engine did not listen".to_string())?;
        let side = Side::new();
        let conn = datapath::connect(
            SocketAddr::from((ADDR_A, PORT)),
            &side.pd,
            &side.cq,
            &p2p(4),
            &[],
        )
        .map_err(|e| format!("connect: {e}"))?;
        greet(conn, &side, &done_rx)
    };
    let (ready_tx, ready_rx) = mpsc::channel();
    let client = std::thread::spawn(move || client(ready_rx));
    testbed::in_ns(NS_A, move || -> Result<(), String> {
        let device = Device::open(Transport::Xdp {
            ifname: DEV_A.into(),
            config: Box::default(),
        })
        .map_err(|e| e.to_string())?;
        let listener = device
            .listen(SocketAddr::from((ADDR_A, PORT)), p2p(4))
            .map_err(|e| format!("listen: {e}"))?;
        let _ = ready_tx.send(());
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| e.to_string())?
            .ok_or("no connection request")?;
        let (conn, num, side, sink) = accept_with_an_idle_qp(req)?;
        greeted(&conn, &side, &sink, num, "engine responder");
        let _ = done_tx.send(());
        Ok(())
    })
    .expect("engine responder");
    client.join().expect("client thread").expect("client");
}

/// Accepts a request asking for an IRD beyond 14 bits with an idle queue pair (a receive
/// posted) through `accept`, which must refuse it: the queue pair's receive completes as
/// flushed, and the initiator hears `Rejected` rather than waiting for its setup timeout.
fn refused_accept_of_an_idle_qp(
    what: &str,
    accept: impl FnOnce(ConnectRequest, IdleQp) -> Result<(), DatapathError>,
) {
    let listener = Listener::bind(any_port(), p2p(4)).expect("listen");
    let addr = listener.local_addr().expect("address");
    let client = std::thread::spawn(move || {
        let side = Side::new();
        datapath::connect(addr, &side.pd, &side.cq, &p2p(4), &[]).map(|_| ())
    });
    let req = listener
        .accept_timeout(WAIT)
        .expect("accept")
        .expect("a connection request");
    let side = Side::new();
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let qp = idle_with_a_recv(&side, &sink);
    let num = qp.num();
    match accept(req.ird_ord(0x4000, 1), qp) {
        Err(DatapathError::InvalidArgument(_)) => {}
        other => panic!("{what}: an IRD of 15 bits: {other:?}"),
    }
    flushed(&side.cq, num, &[7], what);
    match client.join().expect("client thread") {
        Err(DatapathError::Rejected { .. }) => {}
        other => panic!("{what}: the initiator of a refused accept: {other:?}"),
    }
}

/// An accept of an idle queue pair that cannot be made fails and rejects the request at once,
/// as `accept_with_recvs` does, its receive flushed.
#[test]
fn socket_refused_accept_of_an_idle_qp_rejects_the_request() {
    refused_accept_of_an_idle_qp("accept_qp", |req, qp| req.accept_qp(qp, &[]).map(|_| ()));
}

/// A connect of an idle queue pair on an event channel that cannot be made fails at the call
/// (as `connect_async` does), not as an event: an ORD beyond 14 bits; with the socket
/// transport, receives whose region was deregistered after they were posted too (flushed).
#[test]
fn socket_refused_connect_async_of_an_idle_qp_fails_at_the_call() {
    let channel = CmEventChannel::new().expect("event channel");
    let side = Side::new();
    let mut qp = IdleQp::new(&side.pd, &side.cq, &p2p(1)).expect("create");
    qp.set_ird_ord(1, 0x4000);
    let addr = any_port();
    match Device::socket().connect_qp_async(qp, addr, &[], &channel, 1) {
        Err(DatapathError::InvalidArgument(_)) => {}
        other => panic!("an ORD of 15 bits: {other:?}"),
    }
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let qp = idle_with_a_recv(&side, &sink);
    let num = qp.num();
    drop(sink);
    match Device::socket().connect_qp_async(qp, addr, &[], &channel, 2) {
        Err(DatapathError::InvalidArgument(_)) => {}
        other => panic!("a receive into a deregistered region: {other:?}"),
    }
    flushed(&side.cq, num, &[7], "connect refused at the call");
    assert!(
        channel
            .wait_event(std::time::Duration::from_millis(200))
            .is_none(),
        "a refused connect queued an event"
    );
}

/// A connect of an idle queue pair that the peer rejects leaves the queue pair in Error: its
/// receives complete as flushed, on its own receive completion queue, before the call
/// returns.
#[test]
fn socket_rejected_connect_of_an_idle_qp_flushes_its_receives() {
    let (addr, server) = rejecting_server();
    let (side, recv_cq, qp, _sink) = idle_with_a_recv_cq(&[7, 8]);
    let num = qp.num();
    match Device::socket().connect_qp(qp, addr, &[]) {
        Err(DatapathError::Rejected { .. }) => {}
        other => panic!("a rejected connect: {:?}", other.map(|_| ())),
    }
    flushed(&recv_cq, num, &[7, 8], "rejected connect");
    assert!(side.cq.is_empty(), "a receive's flush on the send queue");
    server.join().expect("server thread").expect("server");
}

/// The same on an event channel: the flushes are on the completion queue when `Rejected`
/// arrives.
#[test]
fn socket_rejected_connect_async_of_an_idle_qp_flushes_before_the_event() {
    let (addr, server) = rejecting_server();
    let side = Side::new();
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let qp = idle_with_a_recv(&side, &sink);
    let num = qp.num();
    let channel = CmEventChannel::new().expect("event channel");
    Device::socket()
        .connect_qp_async(qp, addr, &[], &channel, 9)
        .expect("connect_async");
    match channel.wait_event(WAIT) {
        Some(CmEvent::Rejected { context: 9, .. }) => {}
        other => panic!("not rejected: {other:?}"),
    }
    flushed(&side.cq, num, &[7], "rejected connect, event channel");
    server.join().expect("server thread").expect("server");
}

/// An accept on an event channel refused at the call flushes the queue pair's receives too.
#[test]
fn socket_refused_accept_async_of_an_idle_qp_flushes_its_receives() {
    let channel = CmEventChannel::new().expect("event channel");
    refused_accept_of_an_idle_qp("accept_qp_async", |req, qp| {
        req.accept_qp_async(qp, &[], &channel, 3).map(|_| ())
    });
}

/// The AF_XDP engine's connect of an idle queue pair that the peer rejects: its receive,
/// which the engine's queue pair held from before the SYN, completes as flushed once, on the
/// application's completion queue, before the call returns.
#[test]
fn engine_rejected_connect_of_an_idle_qp_flushes_its_receives() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_680;
    let server = move |ready| {
        let req = bed::listen_in_b_with(PORT, &ready, WAIT, p2p(4))?;
        req.reject(b"no").map_err(|e| e.to_string())
    };
    bed::device_against(server, move |device| {
        let side = Side::new();
        let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
        let qp = idle_with_a_recv(&side, &sink);
        let num = qp.num();
        match device.connect_qp(qp, SocketAddr::from((ADDR_B, PORT)), &[]) {
            Err(DatapathError::Rejected { .. }) => {}
            other => return Err(format!("a rejected connect: {:?}", other.map(|_| ()))),
        }
        flushed(&side.cq, num, &[7], "engine, rejected connect");
        // Nothing more comes of the engine's own queue pair.
        let stray = side.cq.wait(std::time::Duration::from_millis(300));
        assert!(stray.is_none(), "a second completion: {stray:?}");
        Ok(())
    });
}

/// Moving an idle queue pair to Error (`ibv_modify_qp` to ERR before any connection) flushes
/// its receives, in order, on its receive completion queue; dropping one (`ibv_destroy_qp`)
/// completes nothing.
#[test]
fn an_idle_qp_moved_to_error_flushes_its_receives_and_a_dropped_one_nothing() {
    let (side, recv_cq, qp, sink) = idle_with_a_recv_cq(&[1, 2, 3]);
    let num = qp.num();
    qp.flush();
    flushed(&recv_cq, num, &[1, 2, 3], "moved to error");
    assert!(side.cq.is_empty(), "a receive's flush on the send queue");

    let qp = idle_with_a_recv(&side, &sink);
    drop(qp);
    assert!(
        side.cq.is_empty() && recv_cq.is_empty(),
        "a dropped queue pair completed"
    );
}

/// A client on the socket transport: connects to `addr` (from namespace `ns` if given, once
/// `ready`), greets at once, greets again once told to `go`, then holds the connection until
/// `done`.
fn greeting_twice(
    addr: SocketAddr,
    ns: Option<&str>,
    ready: Option<mpsc::Receiver<()>>,
    go: mpsc::Receiver<()>,
    done: mpsc::Receiver<()>,
) -> Result<(), String> {
    if let Some(ns) = ns {
        testbed::enter_ns(ns).map_err(|e| e.to_string())?;
    }
    if let Some(ready) = ready {
        ready
            .recv_timeout(WAIT)
            .map_err(|_| "the server did not listen".to_string())?;
    }
    let side = Side::new();
    let conn = datapath::connect(addr, &side.pd, &side.cq, &p2p(4), &[])
        .map_err(|e| format!("connect: {e}"))?;
    let src = side
        .pd
        .register(LEN, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    src.write(0, &greeting());
    for wr_id in [1, 2] {
        if wr_id == 2 {
            go.recv_timeout(WAIT)
                .map_err(|_| "not told to greet again".to_string())?;
        }
        conn.qp
            .post_send(send_wr(wr_id, &src, LEN))
            .map_err(|e| format!("greeting {wr_id}: {e}"))?;
    }
    let _ = done.recv_timeout(WAIT);
    Ok(())
}

/// rping's server (`rdma_accept` on an event channel, a completion thread that reposts each
/// receive as soon as it completes): accepts `req` with an idle queue pair whose receive
/// queue holds one receive, and, before it takes `Established`, waits for that receive's
/// completion and reposts through the queue pair's [`datapath::QpPoster`] (possible only
/// once the first has left the queue), then tells the client to `go` on: the second greeting
/// finds the repost. Only then is the event taken, its queue pair the idle one.
fn reposts_before_established(req: ConnectRequest, go: mpsc::Sender<()>) -> Result<(), String> {
    let side = Side::new();
    let sink = side
        .pd
        .register(LEN, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let qp = idle_with_a_recv(&side, &sink);
    let (num, poster) = (qp.num(), qp.poster());
    let channel = CmEventChannel::new().map_err(|e| e.to_string())?;
    req.accept_qp_async(qp, &[], &channel, 11)
        .map_err(|e| format!("accept: {e}"))?;
    for (wr_id, what) in [(7, "the first greeting"), (8, "the second greeting")] {
        let c = next_wc(&side.cq, what);
        let got = (c.qp_num, c.wc.wr_id, c.wc.status, c.wc.byte_len);
        if got != (num, wr_id, WcStatus::Success, LEN as u32) {
            return Err(format!("{what}: {c:?}"));
        }
        if wr_id == 7 {
            poster
                .post_recv(recv(8, &sink))
                .map_err(|e| format!("the repost before Established: {e}"))?;
            let _ = go.send(());
        }
    }
    let mut got = vec![0u8; LEN];
    sink.read(0, &mut got);
    if got != greeting() {
        return Err("the second greeting's octets".into());
    }
    match channel.wait_event(WAIT) {
        Some(CmEvent::Established {
            context: 11,
            connection,
        }) if connection.qp.num() == num => Ok(()),
        other => Err(format!("not established: {other:?}")),
    }
}

#[test]
fn socket_a_receive_reposted_before_established_is_taken() {
    let listener = Listener::bind(any_port(), p2p(4)).expect("listen");
    let addr = listener.local_addr().expect("address");
    let (go_tx, go_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let client = std::thread::spawn(move || greeting_twice(addr, None, None, go_rx, done_rx));
    let req = listener
        .accept_timeout(WAIT)
        .expect("accept")
        .expect("a connection request");
    let outcome = reposts_before_established(req, go_tx);
    let _ = done_tx.send(());
    outcome.expect("socket responder");
    client.join().expect("client thread").expect("client");
}

#[test]
fn engine_a_receive_reposted_before_established_is_taken() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_633;
    let (go_tx, go_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let addr = SocketAddr::from((ADDR_A, PORT));
    let client = std::thread::spawn(move || {
        greeting_twice(addr, Some(testbed::NS_B), Some(ready_rx), go_rx, done_rx)
    });
    testbed::in_ns(NS_A, move || -> Result<(), String> {
        let device = Device::open(Transport::Xdp {
            ifname: DEV_A.into(),
            config: Box::default(),
        })
        .map_err(|e| e.to_string())?;
        let listener = device
            .listen(addr, p2p(4))
            .map_err(|e| format!("listen: {e}"))?;
        let _ = ready_tx.send(());
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| e.to_string())?
            .ok_or("no connection request")?;
        let outcome = reposts_before_established(req, go_tx);
        let _ = done_tx.send(());
        outcome
    })
    .expect("engine responder");
    client.join().expect("client thread").expect("client");
}

/// A responder that answers the MPA Request (plain MPA, CRCs) with its Reply and two Sends of
/// the greeting in one write, once told the initiator has `posted` its second receive: the
/// Sends reach the initiator with the Reply, as a peer that sends at once may make them.
/// Listens on `listener`, holds the connection until `done`.
fn replying_with_two_sends(
    listener: std::net::TcpListener,
    posted: mpsc::Receiver<()>,
    done: mpsc::Receiver<()>,
) -> Result<(), String> {
    use std::io::Write;
    let mut s = common::accept_within(&listener, common::WAIT).map_err(|e| e.to_string())?;
    let mut responder = common::read_mpa_request(&mut s)?;
    let (mut out, negotiated) = responder.accept(&[]).map_err(|e| e.to_string())?;
    let mut encoder = negotiated.encoder();
    for msn in [1, 2] {
        // RFC 5040 4.3 / RFC 5041 4.3: an untagged Send (RDMAP control 0x43) to queue 0.
        let header = ddp::wire::UntaggedHeader {
            last: true,
            rsvd_ulp: [0x43, 0, 0, 0, 0],
            qn: 0,
            msn,
            mo: 0,
        };
        let mut ulpdu = vec![0u8; ddp::wire::UNTAGGED_HEADER_LEN];
        header.emit(&mut ulpdu);
        ulpdu.extend_from_slice(&greeting());
        encoder
            .encode(&ulpdu, &mut out)
            .map_err(|e| e.to_string())?;
    }
    posted
        .recv_timeout(WAIT)
        .map_err(|_| "the initiator never posted".to_string())?;
    s.write_all(&out).map_err(|e| e.to_string())?;
    let _ = done.recv_timeout(WAIT);
    Ok(())
}

/// The initiator's side of [`replying_with_two_sends`]: an idle queue pair with one receive
/// starts connecting to `addr` on `device`, a second receive is posted through its poster
/// while it connects, and only then does the peer send its Reply and both Sends: both
/// greetings land, though the second arrived before the connection was handed over.
fn receives_what_came_with_the_reply(
    device: &Device,
    addr: SocketAddr,
    posted: mpsc::Sender<()>,
) -> Result<(), String> {
    let side = Side::new();
    let sink = side
        .pd
        .register(2 * LEN, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let params = ConnectParams {
        rq_depth: 2,
        ..common::params(datapath::MpaConfig::default())
    };
    let qp = IdleQp::new(&side.pd, &side.cq, &params).map_err(|e| e.to_string())?;
    qp.post_recv(recv(7, &sink)).map_err(|e| e.to_string())?;
    let (num, poster) = (qp.num(), qp.poster());
    let channel = CmEventChannel::new().map_err(|e| e.to_string())?;
    device
        .connect_qp_async(qp, addr, &[], &channel, 4)
        .map_err(|e| format!("connect: {e}"))?;
    poster
        .post_recv(RecvWr {
            wr_id: 8,
            sg_list: sink.sge(LEN, LEN as u32).into(),
        })
        .map_err(|e| format!("the receive posted while connecting: {e}"))?;
    let _ = posted.send(());
    for wr_id in [7, 8] {
        let c = next_wc(&side.cq, "a greeting");
        let got = (c.qp_num, c.wc.wr_id, c.wc.status, c.wc.byte_len);
        if got != (num, wr_id, WcStatus::Success, LEN as u32) {
            return Err(format!("greeting into receive {wr_id}: {c:?}"));
        }
    }
    let mut got = vec![0u8; 2 * LEN];
    sink.read(0, &mut got);
    if got[..LEN] != greeting()[..] || got[LEN..] != greeting()[..] {
        return Err("the greetings' octets".into());
    }
    match channel.wait_event(WAIT) {
        Some(CmEvent::Established {
            context: 4,
            connection,
        }) if connection.qp.num() == num && connection.qp.status().error.is_none() => Ok(()),
        other => Err(format!("not established cleanly: {other:?}")),
    }
}

#[test]
fn socket_a_receive_posted_while_connecting_takes_a_send_that_came_with_the_reply() {
    let listener = std::net::TcpListener::bind(any_port()).expect("listen");
    let addr = listener.local_addr().expect("address");
    let (posted_tx, posted_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let server = std::thread::spawn(move || replying_with_two_sends(listener, posted_rx, done_rx));
    let outcome = receives_what_came_with_the_reply(&Device::socket(), addr, posted_tx);
    let _ = done_tx.send(());
    outcome.expect("socket initiator");
    server.join().expect("server thread").expect("server");
}

#[test]
fn engine_a_receive_posted_while_connecting_takes_a_send_that_came_with_the_reply() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_634;
    let (posted_tx, posted_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let server = move |ready: mpsc::Sender<()>| {
        testbed::enter_ns(testbed::NS_B).map_err(|e| e.to_string())?;
        let listener = std::net::TcpListener::bind(SocketAddr::from((ADDR_B, PORT)))
            .map_err(|e| e.to_string())?;
        let _ = ready.send(());
        replying_with_two_sends(listener, posted_rx, done_rx)
    };
    bed::device_against(server, move |device| {
        let outcome =
            receives_what_came_with_the_reply(device, SocketAddr::from((ADDR_B, PORT)), posted_tx);
        let _ = done_tx.send(());
        outcome
    });
}
