//! Receives posted with the connect (`connect_with_recvs`; verbs applications post them
//! between `rdma_create_qp` and `rdma_connect`). With peer-to-peer setup (RFC 6581: the
//! initiator's RTR is its first FPDU) the responder may send the moment the RTR arrives, before
//! the initiator's `connect` has returned, and iWARP has no receiver-not-ready retry: a Send
//! that finds no posted receive ends the connection (RFC 5041 7.1). A receive posted with the
//! connect is there in time. The socket transport on loopback, the AF_XDP engine on the veth
//! bed (root, `SKIPPED` without, a failure under `CI=true`), each against a socket-transport
//! server that sends at once.

mod common;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{bed, next_wc, p2p, send_wr, Side, WAIT};
use datapath::{
    Access, CmEvent, CmEventChannel, ConnectParams, ConnectRequest, Connection, DatapathError,
    Device, MemoryRegion, QpError, RdmapError, RecvWr, SharedReceiveQueue, Transport, WcOpcode,
    WcStatus,
};
use testbed::{bed_or_skip, ADDR_B};

/// Octets of the server's greeting.
const LEN: usize = 64;

fn greeting() -> Vec<u8> {
    (0..LEN as u8).map(|i| i ^ 0x5a).collect()
}

/// Accepts `req` and, if `greets`, posts the greeting at once; holds the connection until
/// `done`.
fn greet(req: ConnectRequest, greets: bool, done: mpsc::Receiver<()>) -> Result<(), String> {
    let side = Side::new();
    let src = side
        .pd
        .register(LEN, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    src.write(0, &greeting());
    let conn = req
        .accept(&side.pd, &side.cq, &[])
        .map_err(|e| format!("accept: {e}"))?;
    if greets {
        conn.qp
            .post_send(send_wr(1, &src, LEN))
            .map_err(|e| format!("post the greeting: {e}"))?;
    }
    let _ = done.recv_timeout(WAIT);
    drop(conn);
    Ok(())
}

/// The error of a connect that must fail.
fn connect_error(res: Result<Connection, DatapathError>) -> DatapathError {
    match res {
        Ok(_) => panic!("connected where the connect must fail"),
        Err(e) => e,
    }
}

/// The receive the client posts with its connect.
fn recv(sink: &MemoryRegion) -> RecvWr {
    RecvWr {
        wr_id: 7,
        sg_list: sink.sge(0, LEN as u32).into(),
    }
}

/// The client's side once connected with one receive of `sink` posted: the greeting lands in
/// it, and the connection is still sound.
fn greeted(conn: &Connection, side: &Side, sink: &MemoryRegion, what: &str) {
    let c = next_wc(&side.cq, what);
    assert_eq!(
        (c.wc.wr_id, c.wc.opcode, c.wc.status, c.wc.byte_len),
        (7, WcOpcode::Recv, WcStatus::Success, LEN as u32),
        "{what}: {c:?}"
    );
    let mut got = vec![0u8; LEN];
    sink.read(0, &mut got);
    assert_eq!(got, greeting(), "{what}: the greeting's octets");
    assert_eq!(conn.qp.status().error, None, "{what}");
}

/// Listens on loopback with peer-to-peer setup; the server accepts the first connection
/// request and greets it if `greets`.
fn server(
    greets: bool,
) -> (
    SocketAddr,
    mpsc::Sender<()>,
    std::thread::JoinHandle<Result<(), String>>,
) {
    let (done_tx, done_rx) = mpsc::channel();
    let (addr, server) = common::serve_one(p2p(4), move |req| greet(req, greets, done_rx));
    (addr, done_tx, server)
}

#[test]
fn socket_receive_posted_with_the_connect_takes_the_first_send() {
    let (addr, done, server) = server(true);
    let side = Side::new();
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let conn =
        datapath::connect_with_recvs(addr, &side.pd, &side.cq, &p2p(1), &[], vec![recv(&sink)])
            .expect("connect");
    greeted(&conn, &side, &sink, "socket");
    // The receive counted against the queue's depth of one until it was used.
    conn.qp
        .post_recv(recv(&sink))
        .expect("a receive in the freed place");
    let _ = done.send(());
    server.join().expect("server thread").expect("server");
}

/// The same through an event channel (`rdma_connect` on one): the receive is there before the
/// `Established` event, as before the greeting.
#[test]
fn socket_connect_async_with_recvs_takes_the_first_send() {
    let (addr, done, server) = server(true);
    let side = Side::new();
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let channel = CmEventChannel::new().expect("event channel");
    Device::socket()
        .connect_async_with_recvs(
            addr,
            &side.pd,
            &side.cq,
            &p2p(1),
            &[],
            vec![recv(&sink)],
            &channel,
            3,
        )
        .expect("connect_async");
    let conn = match channel.wait_event(WAIT) {
        Some(CmEvent::Established {
            context: 3,
            connection,
        }) => connection,
        other => panic!("not established: {other:?}"),
    };
    greeted(&conn, &side, &sink, "socket, event channel");
    let _ = done.send(());
    server.join().expect("server thread").expect("server");
}

/// What `connect_with_recvs` is for: the same server, a client that connects without
/// receives and has not posted one yet when the greeting arrives (any application may be that
/// late; this one never posts): the greeting finds no buffer and the connection ends.
#[test]
fn socket_receive_posted_after_the_connect_can_be_too_late() {
    let (addr, done, server) = server(true);
    let side = Side::new();
    let conn = datapath::connect(addr, &side.pd, &side.cq, &p2p(1), &[]).expect("connect");
    let deadline = Instant::now() + WAIT;
    while conn.qp.status().error.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = conn.qp.status();
    // RFC 5041 7.2: a DDP untagged error, "MSN has no buffer available" (code 2).
    let no_buffer = matches!(
        st.error,
        Some(QpError::LocalTerminate(t)) if (t.layer, t.etype, t.code) == (1, 2, 2)
    );
    assert!(
        no_buffer,
        "a Send with no receive posted must end the connection with DDP's no-buffer \
         Terminate: {st:?}"
    );
    let _ = done.send(());
    server.join().expect("server thread").expect("server");
}

/// Receives the connect cannot post fail it before the peer sees a connection: more than the
/// receive queue holds (naming the depth), or any with a shared receive queue. The server's one
/// accept then goes to the next, sound connect, which it greets.
#[test]
fn socket_connect_with_receives_it_cannot_post_fails_first() {
    let (addr, done, server) = server(true);
    let side = Side::new();
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let too_many = vec![recv(&sink), recv(&sink)];
    let res = datapath::connect_with_recvs(addr, &side.pd, &side.cq, &p2p(1), &[], too_many);
    let e = connect_error(res);
    assert!(
        matches!(e, DatapathError::RecvQueueFull { depth: 1 }),
        "{e:?}"
    );
    let with_srq = ConnectParams {
        srq: Some(SharedReceiveQueue::new(&side.pd, 4).expect("srq")),
        ..p2p(1)
    };
    let one = vec![recv(&sink)];
    let res = datapath::connect_with_recvs(addr, &side.pd, &side.cq, &with_srq, &[], one);
    let e = connect_error(res);
    assert!(
        matches!(
            e,
            DatapathError::InvalidWorkRequest(RdmapError::SrqAttached)
        ),
        "{e:?}"
    );
    let one = vec![recv(&sink)];
    let conn =
        datapath::connect_with_recvs(addr, &side.pd, &side.cq, &p2p(1), &[], one).expect("connect");
    greeted(&conn, &side, &sink, "socket, after the refusals");
    let _ = done.send(());
    server.join().expect("server thread").expect("server");
}

/// Receives posted with the connect count against the receive queue's depth from the start:
/// with the queue filled by them, a further post fails at once.
#[test]
fn socket_receives_posted_with_the_connect_count_against_the_depth() {
    let (addr, done, server) = server(false);
    let side = Side::new();
    let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
    let two = vec![recv(&sink), recv(&sink)];
    let conn =
        datapath::connect_with_recvs(addr, &side.pd, &side.cq, &p2p(2), &[], two).expect("connect");
    match conn.qp.post_recv(recv(&sink)) {
        Err(DatapathError::RecvQueueFull { depth: 2 }) => {}
        other => panic!("a third receive in a queue of two: {other:?}"),
    }
    let _ = done.send(());
    server.join().expect("server thread").expect("server");
}

#[test]
fn engine_receive_posted_with_the_connect_takes_the_first_send() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_661;
    let (done_tx, done_rx) = mpsc::channel();
    let server = move |ready| {
        let req = bed::listen_in_b_with(PORT, &ready, WAIT, p2p(4))?;
        greet(req, true, done_rx)
    };
    bed::engine_against(server, move |engine| {
        let side = Side::new();
        let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
        let server_addr = SocketAddr::from((ADDR_B, PORT));
        let too_many = vec![recv(&sink), recv(&sink)];
        let res =
            engine.connect_with_recvs(server_addr, &side.pd, &side.cq, &p2p(1), &[], too_many);
        let e = connect_error(res);
        assert!(
            matches!(e, DatapathError::RecvQueueFull { depth: 1 }),
            "{e:?}"
        );
        let one = vec![recv(&sink)];
        let conn = engine
            .connect_with_recvs(server_addr, &side.pd, &side.cq, &p2p(1), &[], one)
            .expect("connect");
        greeted(&conn, &side, &sink, "engine");
        conn.qp
            .post_recv(recv(&sink))
            .expect("a receive in the freed place");
        let _ = done_tx.send(());
    });
}

/// A connect the peer rejects fails, and the receives posted with it, flushed with a queue pair
/// the application never got, complete on no completion queue (the socket transport never
/// posts them; the engine's queue pair held them from before the SYN).
#[test]
fn engine_rejected_connect_leaves_no_completions() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_662;
    let server = move |ready| {
        let req = bed::listen_in_b_with(PORT, &ready, WAIT, p2p(4))?;
        req.reject(b"no").map_err(|e| e.to_string())
    };
    bed::engine_against(server, move |engine| {
        let side = Side::new();
        let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
        let one = vec![recv(&sink)];
        let server_addr = SocketAddr::from((ADDR_B, PORT));
        let res = engine.connect_with_recvs(server_addr, &side.pd, &side.cq, &p2p(1), &[], one);
        let e = connect_error(res);
        assert!(matches!(e, DatapathError::Rejected { .. }), "{e:?}");
        let stray = side.cq.wait(Duration::from_millis(500));
        assert!(
            stray.is_none(),
            "a completion of a rejected connect: {stray:?}"
        );
    });
}

/// A connect still waiting for the peer's MPA Reply when the engine stops fails (a connect
/// error on the event channel), and the receives posted with it complete on no completion
/// queue: the engine fails the waiting call before it hands out the flushes.
#[test]
fn engine_stopped_under_a_pending_connect_leaves_no_completions() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_665;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (request_tx, request_rx) = mpsc::channel::<()>();
    // A peer that takes the TCP connection and the MPA Request and never replies.
    let server = move |ready: mpsc::Sender<()>| -> Result<(), String> {
        testbed::enter_ns(testbed::NS_B).map_err(|e| e.to_string())?;
        let l = std::net::TcpListener::bind(SocketAddr::from((ADDR_B, PORT)))
            .map_err(|e| e.to_string())?;
        let _ = ready.send(());
        let mut s = common::accept_within(&l, WAIT).map_err(|e| e.to_string())?;
        let _request = common::read_mpa_request(&mut s)?;
        let _ = request_tx.send(());
        let _ = done_rx.recv_timeout(WAIT);
        Ok(())
    };
    bed::against(
        server,
        move || {
            testbed::enter_ns(testbed::NS_A).map_err(|e| e.to_string())?;
            let device = Device::open(Transport::Xdp {
                ifname: testbed::DEV_A.into(),
                config: Box::default(),
            })
            .map_err(|e| e.to_string())?;
            let side = Side::new();
            let sink = side.pd.register(LEN, Access::LOCAL_WRITE).expect("sink");
            let channel = CmEventChannel::new().expect("event channel");
            device
                .connect_async_with_recvs(
                    SocketAddr::from((ADDR_B, PORT)),
                    &side.pd,
                    &side.cq,
                    &p2p(1),
                    &[],
                    vec![recv(&sink)],
                    &channel,
                    4,
                )
                .map_err(|e| e.to_string())?;
            // The Request is out (the peer has it) and unanswered; stop the engine under it.
            request_rx
                .recv_timeout(WAIT)
                .map_err(|_| "the peer never got the Request")?;
            drop(device);
            match channel.wait_event(WAIT) {
                Some(CmEvent::ConnectError { context: 4, .. }) => {}
                other => panic!("not a connect error: {other:?}"),
            }
            let stray = side.cq.wait(Duration::from_millis(300));
            assert!(
                stray.is_none(),
                "a completion of a connect that never finished: {stray:?}"
            );
            let _ = done_tx.send(());
            Ok(())
        },
        WAIT,
    );
}
