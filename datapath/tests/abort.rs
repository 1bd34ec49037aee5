//! `QueuePair::abort` (`ibv_modify_qp` to Error): the connection is reset, not closed, on both
//! transports. The aborting side's outstanding work requests complete flushed, its status is
//! final when `abort` returns, and later posts complete flushed at once (a drain); the peer's queue pair ends with
//! `PeerReset` (a graceful `disconnect` gives it `PeerClosed`). The socket transport on
//! loopback; the AF_XDP engine on the veth bed (root, `SKIPPED` without, a failure under
//! `CI=true`) against the socket transport in `iwb`.

mod common;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{bed, establish_ok, params as loopback_params, stays_empty, Side, WAIT};
use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    CmEvent, CmEventChannel, CompletionQueue, Listener, MpaConfig, ProtectionDomain, QpError,
    QpState, QueuePair, RecvWr, SgeList, WcOpcode, WcStatus,
};
use testbed::{bed_or_skip, spawn_in_ns, ADDR_B, DEV_A, NS_A};

/// Receives the aborting side posts before it aborts (nothing is ever sent to them).
const RECVS: u64 = 4;

fn post_recvs(qp: &QueuePair) {
    for wr_id in 0..RECVS {
        qp.post_recv(RecvWr {
            wr_id,
            sg_list: SgeList::new(),
        })
        .expect("post_recv");
    }
}

/// Aborts `qp` (whose receives 0..RECVS are outstanding) and checks this side: finished in
/// Error with no error of its own when `abort` returns, every receive flushed once, a later post
/// flushed at once (a drain), a second abort harmless.
fn abort_and_check(qp: QueuePair, cq: &CompletionQueue, what: &str) {
    qp.abort();
    let st = qp.status();
    assert!(
        st.finished,
        "{what}: abort returned before the transport let go"
    );
    assert_eq!(st.state, QpState::Error, "{what}");
    assert_eq!(st.error, None, "{what}: the application ended it");
    // A drain, posted before any completion is read: it completes at once, flushed, behind
    // every receive the abort flushed.
    qp.post_recv(RecvWr {
        wr_id: 99,
        sg_list: SgeList::new(),
    })
    .unwrap_or_else(|e| panic!("{what}: a post after the abort: {e}"));
    let mut seen = vec![false; RECVS as usize];
    for _ in 0..RECVS {
        let wc = cq
            .wait(WAIT)
            .unwrap_or_else(|| panic!("{what}: a receive never completed"))
            .wc;
        assert_eq!(
            (wc.opcode, wc.status),
            (WcOpcode::Recv, WcStatus::WrFlushError),
            "{what}"
        );
        let slot = seen
            .get_mut(wc.wr_id as usize)
            .unwrap_or_else(|| panic!("{what}: {} before the flushed receives", wc.wr_id));
        assert!(!std::mem::replace(slot, true));
    }
    let wc = cq.try_next().expect("the drain's completion").wc;
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (99, WcOpcode::Recv, WcStatus::WrFlushError),
        "{what}"
    );
    stays_empty(cq, &format!("{what}: an extra completion"));
    qp.abort();
}

/// Waits (bounded) until `qp` has finished and returns its error.
fn peer_error(qp: &QueuePair) -> Option<QpError> {
    let deadline = Instant::now() + WAIT;
    while !qp.status().finished {
        assert!(
            Instant::now() < deadline,
            "the peer's queue pair never ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    qp.status().error
}

/// A connection over the socket transport on loopback: the client's side and queue pair, and
/// the server's queue pair (its side lives as long as the queue pair needs it).
fn socket_pair() -> (Side, QueuePair, QueuePair) {
    let params = loopback_params(MpaConfig::default());
    let listener = Listener::bind(common::any_port(), params.clone()).expect("listen");
    let (client, server) = (Side::new(), Side::new());
    let (c, s) = establish_ok(
        &listener,
        &client,
        &params,
        common::ServerPlan {
            side: &server,
            private_data: &[],
            recvs: Vec::new(),
        },
    );
    (client, c.qp, s.qp)
}

#[test]
fn socket_transport_abort_resets_the_connection() {
    let (client, ours, theirs) = socket_pair();
    post_recvs(&ours);
    abort_and_check(ours, &client.cq, "socket transport");
    assert_eq!(peer_error(&theirs), Some(QpError::PeerReset));
}

/// A panic of the socket transport's connection thread (a bug, injected) fails that queue pair
/// as a failed connection does: its outstanding receives complete flushed, its status says
/// why, it finishes, and the peer's connection is reset; the process goes on.
#[test]
fn socket_transport_thread_panic_fails_its_queue_pair() {
    let (client, ours, theirs) = socket_pair();
    post_recvs(&ours);
    ours.inject_transport_panic().expect("the test hook");
    let mut flushed = 0;
    while flushed < RECVS {
        let wc = client
            .cq
            .wait(WAIT)
            .expect("a receive the panic left outstanding never completed")
            .wc;
        assert_eq!(
            (wc.opcode, wc.status),
            (WcOpcode::Recv, WcStatus::WrFlushError)
        );
        flushed += 1;
    }
    assert!(matches!(peer_error(&ours), Some(QpError::Local(_))));
    assert_eq!(ours.status().state, QpState::Error);
    assert_eq!(peer_error(&theirs), Some(QpError::PeerReset));
}

/// The graceful close, for contrast: the same peer sees the FIN.
#[test]
fn socket_transport_disconnect_closes_the_connection() {
    let (_client, ours, theirs) = socket_pair();
    ours.disconnect();
    assert_eq!(peer_error(&theirs), Some(QpError::PeerClosed));
}

/// `abort` after a graceful close has ended (`rdma_disconnect`, then `ibv_modify_qp` to ERR
/// and a marker posted, as a drain does): the queue pair moves to Error and the marker
/// completes flushed, where it was refused before (the state stayed Closing).
#[test]
fn socket_transport_abort_after_a_graceful_close_gives_the_drain() {
    let (client, ours, theirs) = socket_pair();
    ours.disconnect();
    assert!(ours.status().finished);
    assert_eq!(peer_error(&theirs), Some(QpError::PeerClosed));
    ours.abort();
    assert_eq!(ours.status().state, QpState::Error);
    assert_eq!(ours.status().error, None, "the application ended it");
    ours.post_recv(RecvWr {
        wr_id: 99,
        sg_list: SgeList::new(),
    })
    .expect("the drain's marker");
    let wc = client.cq.try_next().expect("the marker's completion").wc;
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (99, WcOpcode::Recv, WcStatus::WrFlushError)
    );
    stays_empty(&client.cq, "an extra completion");
}

/// `start_disconnect` (`rdma_disconnect`, which returns before the end): the same graceful
/// close, its end reported by the disconnect event; a Send posted right behind it is flushed
/// (or refused); a second start, and a `disconnect` after the end, do nothing.
#[test]
fn socket_transport_start_disconnect_reports_the_end_by_event() {
    let (client, ours, theirs) = socket_pair();
    let events = CmEventChannel::new().expect("event channel");
    ours.notify_disconnect(&events);
    ours.start_disconnect().expect("start the close");
    // A Send posted right behind the Close: refused, or flushed (nothing is taken after the
    // Close, where the queue pair, Closing, would refuse it: `refused_while_ending`).
    let behind = ours.post_send(datapath::SendWr {
        wr_id: 7,
        op: datapath::SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: SgeList::new(),
        signaled: true,
        fence: false,
    });
    ours.start_disconnect().expect("start it again");
    match events.wait_event(WAIT) {
        Some(CmEvent::Disconnected { qp_num, error }) => {
            assert_eq!((qp_num, error), (ours.num(), None));
        }
        other => panic!("not the disconnect event: {other:?}"),
    }
    assert!(ours.status().finished, "the event came before the end");
    assert_eq!(peer_error(&theirs), Some(QpError::PeerClosed));
    ours.disconnect();
    match behind {
        Ok(()) => {
            let wc = client.cq.try_next().expect("the Send's completion").wc;
            assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WrFlushError), "{wc:?}");
        }
        Err(e) => assert!(matches!(e, datapath::DatapathError::Disconnected), "{e:?}"),
    }
    stays_empty(&client.cq, "an extra completion");
    assert_eq!(ours.refused_while_ending(), 0, "taken after the Close");
}

#[test]
fn engine_abort_resets_the_connection() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_571;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (aborted_tx, aborted_rx) = mpsc::channel::<()>();
    let peer = std::thread::spawn(move || -> Result<Option<QpError>, String> {
        let req = bed::listen_in_b(PORT, &ready_tx, WAIT)?;
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let conn = req.accept(&pd, &cq, &[]).map_err(|e| e.to_string())?;
        aborted_rx
            .recv_timeout(WAIT)
            .map_err(|_| "the engine side never aborted")?;
        Ok(peer_error(&conn.qp))
    });
    ready_rx.recv_timeout(WAIT).expect("peer listening");
    let ours = spawn_in_ns(NS_A, move || {
        let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default()).expect("engine on iwa0");
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let conn = engine
            .connect(
                SocketAddr::from((ADDR_B, PORT)),
                &pd,
                &cq,
                &bed::params(),
                &[],
            )
            .expect("connect");
        post_recvs(&conn.qp);
        abort_and_check(conn.qp, &cq, "engine");
        let _ = aborted_tx.send(());
        drop(engine);
    });
    let ours = ours.join();
    let theirs = peer.join().expect("peer thread");
    ours.expect("engine side");
    assert_eq!(theirs.expect("peer"), Some(QpError::PeerReset));
}

/// The same on the engine, whose connection stays in TIME-WAIT after the
/// queue pair finished: the Error the abort sets stays (the engine's later turns of the
/// connection change no final state), and the drain's marker completes flushed.
#[test]
fn engine_abort_after_a_graceful_close_gives_the_drain() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_601;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let peer = std::thread::spawn(move || -> Result<Option<QpError>, String> {
        let req = bed::listen_in_b(PORT, &ready_tx, WAIT)?;
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let conn = req.accept(&pd, &cq, &[]).map_err(|e| e.to_string())?;
        let error = peer_error(&conn.qp);
        let _ = done_rx.recv_timeout(WAIT);
        Ok(error)
    });
    ready_rx.recv_timeout(WAIT).expect("peer listening");
    let ours = spawn_in_ns(NS_A, move || {
        let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default()).expect("engine on iwa0");
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let conn = engine
            .connect(
                SocketAddr::from((ADDR_B, PORT)),
                &pd,
                &cq,
                &bed::params(),
                &[],
            )
            .expect("connect");
        conn.qp.disconnect();
        assert!(conn.qp.status().finished);
        conn.qp.abort();
        // Turns of the engine pass (the connection is in TIME-WAIT or closing still).
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(conn.qp.status().state, QpState::Error);
        conn.qp
            .post_recv(RecvWr {
                wr_id: 99,
                sg_list: SgeList::new(),
            })
            .expect("the drain's marker");
        let wc = cq.wait(WAIT).expect("the marker's completion").wc;
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (99, WcOpcode::Recv, WcStatus::WrFlushError)
        );
        let _ = done_tx.send(());
        drop(engine);
    });
    let ours = ours.join();
    let theirs = peer.join().expect("peer thread");
    ours.expect("engine side");
    assert_eq!(theirs.expect("peer"), Some(QpError::PeerClosed));
}
