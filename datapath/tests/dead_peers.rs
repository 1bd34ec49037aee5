//! Dead peers end in a typed error within the configured timeouts, on both transports: the
//! peer's namespace is cut off (`ip link set iwb0 down` in it) while our side, in `iwa`, is
//! idle (keepalive, RFC 9293 3.8.4) or in the middle of RDMA Writes (user timeout, RFC 5482).
//! Our side is the AF_XDP engine or the socket transport; the peer is the socket transport.
//! Needs root and the veth bed (`SKIPPED` without, a failure under `CI=true`).

use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, Keepalive, ProtectionDomain, QpError, QueuePair,
    SendOp, SendWr, Stag, WcStatus,
};
use testbed::*;

const PORT: u16 = 19_561;
const WAIT: Duration = Duration::from_secs(20);
/// The close timeout of [`end_with_a_vanished_peer`]'s connections: shorter than the default
/// 10 s, longer than what a close that does not wait may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(6);
const REGION: usize = 4 << 20;

fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(10),
        keepalive: Some(Keepalive {
            idle: Duration::from_secs(1),
            interval: Duration::from_secs(1),
            probes: 2,
        }),
        user_timeout: Some(Duration::from_millis(500)),
        ..ConnectParams::default()
    }
}

/// The peer in `iwb`: accepts one connection over the socket transport, offers a region to
/// write into, and waits (its link is cut under it).
fn peer(ready: mpsc::Sender<()>, done: mpsc::Receiver<()>) -> Result<(), String> {
    let listener = datapath::Listener::bind(SocketAddr::from((ADDR_B, PORT)), params())
        .map_err(|e| e.to_string())?;
    let _ = ready.send(());
    let req = listener
        .accept_timeout(WAIT)
        .map_err(|e| e.to_string())?
        .ok_or("no connection")?;
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let mr = pd
        .register(REGION, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(|e| e.to_string())?;
    let mut offer = mr.stag().0.to_be_bytes().to_vec();
    offer.extend_from_slice(&mr.base_to().to_be_bytes());
    let conn = req.accept(&pd, &cq, &offer).map_err(|e| e.to_string())?;
    let _ = done.recv_timeout(WAIT * 2);
    drop(conn);
    Ok(())
}

fn link(ns: &str, dev: &str, up: bool) {
    let st = Command::new("ip")
        .args(["-n", ns, "link", "set", dev, if up { "up" } else { "down" }])
        .status()
        .expect("ip");
    assert!(st.success(), "ip -n {ns} link set {dev}: {st}");
}

/// Our side in `iwa` connects (engine or socket transport), optionally keeps Writes going,
/// then the peer's link goes down; returns the error and how long it took after the cut.
fn case(engine: bool, writing: bool) -> (Option<QpError>, Duration) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let srv = spawn_in_ns(NS_B, move || peer(ready_tx, done_rx));
    ready_rx.recv_timeout(WAIT).expect("peer ready");
    let ours = spawn_in_ns(NS_A, move || {
        let engine = engine
            .then(|| XdpEngine::start(DEV_A, XdpEngineConfig::default()).expect("engine on iwa0"));
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let src = pd.register(1 << 20, Access::NONE).expect("source");
        let addr = SocketAddr::from((ADDR_B, PORT));
        let conn = match &engine {
            Some(e) => e.connect(addr, &pd, &cq, &params(), b""),
            None => datapath::connect(addr, &pd, &cq, &params(), b""),
        }
        .expect("connect");
        let p = &conn.private_data;
        let stag = Stag(u32::from_be_bytes(p[..4].try_into().unwrap()));
        let to = u64::from_be_bytes(p[4..12].try_into().unwrap());
        let qp = conn.qp;
        let write = |wr_id| {
            qp.post_send(SendWr {
                wr_id,
                op: SendOp::Write {
                    remote_stag: stag,
                    remote_to: to,
                },
                sg_list: src.sge(0, 1 << 20).into(),
                signaled: true,
                fence: false,
            })
        };
        // A few Writes complete before the cut.
        for i in 0..4 {
            write(i).expect("post");
        }
        for _ in 0..4 {
            let c = cq.wait(WAIT).expect("a completion before the cut");
            assert_eq!(c.wc.status, WcStatus::Success, "{:?}", qp.status());
        }
        link(NS_B, DEV_B, false);
        let cut = Instant::now();
        if writing {
            // Mid-transfer: Writes outstanding when the peer vanished.
            for i in 10..30 {
                let _ = write(i);
            }
        }
        let deadline = cut + WAIT;
        while !qp.status().finished && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = cut.elapsed();
        let st = qp.status();
        if writing {
            // Nothing hangs: every Write posted completes. On the engine (Writes complete when
            // acknowledged) none after the cut succeeds; the socket transport completes a
            // Write when the kernel takes it, so some may.
            let mut completed = 0;
            while let Some(c) = cq.wait(Duration::from_millis(500)) {
                if engine.is_some() {
                    assert_ne!(c.wc.status, WcStatus::Success, "{c:?}");
                }
                completed += 1;
            }
            assert_eq!(completed, 20, "Writes posted after the cut");
        }
        drop(qp);
        drop(engine);
        (st.error, took)
    });
    let result = ours.join().expect("our side");
    link(NS_B, DEV_B, true);
    let _ = done_tx.send(());
    srv.join().expect("the peer's thread").expect("the peer");
    result
}

fn check(engine: bool, writing: bool, bound: Duration) {
    let _bed = bed_or_skip!();
    let (error, took) = case(engine, writing);
    println!("engine {engine}, writing {writing}: {error:?} after {took:?}");
    assert_eq!(error, Some(QpError::PeerUnreachable), "after {took:?}");
    assert!(took < bound, "took {took:?}, bound {bound:?}");
}

// Keepalive: 1 s idle + 2 probes 1 s apart (the kernel counts in seconds); user timeout
// 500 ms. The bounds leave room for a loaded machine but are far below the retransmission
// limit's minutes.

#[test]
fn engine_idle_connection_to_a_vanished_peer() {
    check(true, false, Duration::from_secs(8));
}

#[test]
fn engine_peer_cut_off_mid_transfer() {
    check(true, true, Duration::from_secs(4));
}

#[test]
fn socket_idle_connection_to_a_vanished_peer() {
    check(false, false, Duration::from_secs(8));
}

#[test]
fn socket_peer_cut_off_mid_transfer() {
    check(false, true, Duration::from_secs(4));
}

/// Our engine in `iwa` connects to the peer, its link goes down, eight 1 MiB Writes are
/// posted (none can be acknowledged), and `end` ends the queue pair. Returns how long `end`
/// took, whether the queue pair was finished when it returned, and the completions' statuses.
fn end_with_a_vanished_peer(end: fn(&QueuePair)) -> (Duration, bool, Vec<WcStatus>) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let srv = spawn_in_ns(NS_B, move || peer(ready_tx, done_rx));
    ready_rx.recv_timeout(WAIT).expect("peer ready");
    let ours = spawn_in_ns(NS_A, move || {
        let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default()).expect("engine on iwa0");
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let src = pd.register(1 << 20, Access::NONE).expect("source");
        let params = ConnectParams {
            keepalive: None,
            user_timeout: None,
            close_timeout: CLOSE_TIMEOUT,
            ..params()
        };
        let conn = engine
            .connect(SocketAddr::from((ADDR_B, PORT)), &pd, &cq, &params, b"")
            .expect("connect");
        let p = &conn.private_data;
        let stag = Stag(u32::from_be_bytes(p[..4].try_into().unwrap()));
        let to = u64::from_be_bytes(p[4..12].try_into().unwrap());
        let qp = conn.qp;
        link(NS_B, DEV_B, false);
        for i in 0..8 {
            qp.post_send(SendWr {
                wr_id: i,
                op: SendOp::Write {
                    remote_stag: stag,
                    remote_to: to,
                },
                sg_list: src.sge(0, 1 << 20).into(),
                signaled: true,
                fence: false,
            })
            .expect("post");
        }
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        end(&qp);
        let took = t.elapsed();
        let finished = qp.status().finished;
        let mut statuses = Vec::new();
        while let Some(c) = cq.wait(Duration::from_millis(500)) {
            statuses.push(c.wc.status);
        }
        drop(qp);
        drop(engine);
        (took, finished, statuses)
    });
    let result = ours.join();
    link(NS_B, DEV_B, true);
    let _ = done_tx.send(());
    let peer = srv.join();
    let result = result.expect("our side");
    peer.expect("the peer's thread").expect("the peer");
    result
}

/// The application disconnects from a peer that vanished with Writes in flight, on a
/// connection with neither keepalive nor user timeout (only the retransmission limit, minutes
/// away, would end it): `disconnect` gives the graceful close its close timeout, then resets the
/// connection, and returns with the queue pair finished, every Write completed (flushed) and
/// the memory the Writes came from no longer read by the engine.
#[test]
fn engine_disconnect_from_a_vanished_peer_resets_when_the_close_cannot_finish() {
    let _bed = bed_or_skip!();
    let (took, finished, statuses) = end_with_a_vanished_peer(QueuePair::disconnect);
    println!("disconnect took {took:?}, finished {finished}, completions {statuses:?}");
    assert!(
        finished,
        "disconnect returned after {took:?} with the queue pair still in use"
    );
    assert!(
        took >= CLOSE_TIMEOUT,
        "the graceful close was not waited for: {took:?}"
    );
    assert!(
        took < CLOSE_TIMEOUT + Duration::from_secs(3),
        "took {took:?}"
    );
    assert_eq!(statuses.len(), 8, "every Write completes");
    assert!(!statuses.contains(&WcStatus::Success), "{statuses:?}");
}

/// `start_disconnect` against the same vanished peer: it returns at once, the queue pair
/// still in use (the close cannot finish, and nothing of it completes yet), where
/// `disconnect` would wait its close timeout. (The handle's drop then waits as `disconnect`
/// does.)
#[test]
fn engine_start_disconnect_with_a_vanished_peer_returns_at_once() {
    let _bed = bed_or_skip!();
    let start = |qp: &QueuePair| qp.start_disconnect().expect("start the close");
    let (took, finished, statuses) = end_with_a_vanished_peer(start);
    println!("start_disconnect took {took:?}, finished {finished}, completions {statuses:?}");
    assert!(!finished, "the close cannot have finished");
    // Not the close timeout a graceful close waits.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(statuses.is_empty(), "{statuses:?}");
}

/// `abort` against the same vanished peer (`ibv_modify_qp` to Error): no graceful wait, the
/// connection reset at once, the queue pair finished when it returns, every Write flushed.
#[test]
fn engine_abort_with_a_vanished_peer_returns_without_waiting() {
    let _bed = bed_or_skip!();
    let (took, finished, statuses) = end_with_a_vanished_peer(QueuePair::abort);
    println!("abort took {took:?}, finished {finished}, completions {statuses:?}");
    assert!(finished, "abort returned with the queue pair still in use");
    // `disconnect` waits the close timeout for the graceful close here.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(
        statuses,
        vec![WcStatus::WrFlushError; 8],
        "every Write is flushed"
    );
}
