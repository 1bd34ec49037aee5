//! Post-time queue limits (`ibv_post_send` / `ibv_post_recv` failing with `ENOMEM`): a post to
//! a full send or receive queue fails at once with `SendQueueFull` / `RecvQueueFull` and queues
//! nothing, and a place is free again as soon as the completion that frees it can be polled,
//! so an application that keeps its queues full (perftest's way) never sees a spurious
//! refusal. The socket transport on loopback; the AF_XDP engine on the veth bed (root,
//! `SKIPPED` without, a failure under `CI=true`).

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{bed, read_wr, send_wr, stays_empty, write_wr, Side, WAIT};
use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, DatapathError, Listener, MemoryRegion, QueuePair,
    RecvWr, SgeList, Stag, WcOpcode, WcStatus,
};
use testbed::{bed_or_skip, spawn_in_ns, ADDR_B, DEV_A, NS_A, NS_B};

/// Both queues' depth in these tests.
const DEPTH: usize = 4;
/// Messages of the refill tests.
const ROUNDS: u64 = 300;

fn params() -> ConnectParams {
    ConnectParams {
        sq_depth: DEPTH,
        rq_depth: DEPTH,
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    }
}

fn recv(wr_id: u64) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: SgeList::new(),
    }
}

/// A peer that answers the MPA Request and then reads and sends nothing: the Reads posted to
/// it can never complete. Listens on `addr`, says `ready`, holds the connection until `done`.
fn silent_responder(
    addr: SocketAddr,
    ready: mpsc::Sender<SocketAddr>,
    done: mpsc::Receiver<()>,
) -> Result<(), String> {
    let l = TcpListener::bind(addr).map_err(|e| e.to_string())?;
    let _ = ready.send(l.local_addr().map_err(|e| e.to_string())?);
    let mut s = common::accept_within(&l, WAIT).map_err(|e| e.to_string())?;
    let mut responder = common::read_mpa_request(&mut s)?;
    let (reply, _) = responder.accept(&[]).map_err(|e| e.to_string())?;
    s.write_all(&reply).map_err(|e| e.to_string())?;
    let _ = done.recv_timeout(WAIT * 2);
    Ok(())
}

/// Fills the send queue of `qp` (connected to a silent peer) with Reads that cannot complete,
/// and checks that every further post fails at once with `SendQueueFull`, the list's with
/// `posted` 0; then aborts: the queued Reads flush.
fn fill_the_send_queue(qp: QueuePair, cq: &CompletionQueue, sink: &MemoryRegion) {
    let read = |i| read_wr(i, sink, 64, Stag(0x0bad_0100), 0);
    for i in 0..DEPTH as u64 {
        qp.post_send(read(i)).expect("a post within the depth");
    }
    for i in 0..3 {
        match qp.post_send(read(100 + i)) {
            Err(DatapathError::SendQueueFull { depth: DEPTH }) => {}
            other => panic!("a post beyond the depth: {other:?}"),
        }
    }
    match qp.post_send_list([read(200), read(201)]) {
        Err(e) if e.posted == 0 && matches!(e.source, DatapathError::SendQueueFull { .. }) => {}
        other => panic!("a list beyond the depth: {other:?}"),
    }
    stays_empty(cq, "a refused post completed");
    qp.abort();
    let mut ids = Vec::new();
    while let Some(c) = cq.wait(Duration::from_millis(500)) {
        assert_eq!(c.wc.status, WcStatus::WrFlushError, "{c:?}");
        ids.push(c.wc.wr_id);
    }
    assert_eq!(
        ids,
        (0..DEPTH as u64).collect::<Vec<_>>(),
        "the queued Reads flush"
    );
}

#[test]
fn socket_send_queue_full_fails_the_post() {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let peer = std::thread::spawn(move || {
        silent_responder("127.0.0.1:0".parse().unwrap(), ready_tx, done_rx)
    });
    let addr = ready_rx.recv_timeout(WAIT).expect("peer listening");
    let side = Side::new();
    let sink = side.pd.register(4096, Access::LOCAL_WRITE).expect("sink");
    let conn = datapath::connect(addr, &side.pd, &side.cq, &params(), &[]).expect("connect");
    fill_the_send_queue(conn.qp, &side.cq, &sink);
    let _ = done_tx.send(());
    peer.join().expect("peer thread").expect("peer");
}

#[test]
fn engine_send_queue_full_fails_the_post() {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let peer = spawn_in_ns(NS_B, move || {
        silent_responder(SocketAddr::from((ADDR_B, 19_581)), ready_tx, done_rx)
    });
    let addr = ready_rx.recv_timeout(WAIT).expect("peer listening");
    let ours = spawn_in_ns(NS_A, move || {
        let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default()).expect("engine on iwa0");
        let side = Side::new();
        let sink = side.pd.register(4096, Access::LOCAL_WRITE).expect("sink");
        let conn = engine
            .connect(addr, &side.pd, &side.cq, &params(), &[])
            .expect("connect");
        fill_the_send_queue(conn.qp, &side.cq, &sink);
        drop(engine);
    });
    let ours = ours.join();
    let _ = done_tx.send(());
    let peer = peer.join();
    ours.expect("our side");
    peer.expect("the peer thread").expect("the peer");
}

/// The receiver, accepted with `DEPTH` receives posted: they count (one more is refused).
/// Called before the sender starts.
fn receives_posted_at_accept_count(qp: &QueuePair) -> Result<(), String> {
    match qp.post_recv(recv(1000)) {
        Err(DatapathError::RecvQueueFull { depth: DEPTH }) => Ok(()),
        other => Err(format!(
            "a receive beyond those posted at accept: {other:?}"
        )),
    }
}

/// The receiving side of `ROUNDS` Sends: reposts a receive as soon as each Send's completion
/// is polled (never refused), then gives the sender a credit for it.
fn receiver(qp: &QueuePair, cq: &CompletionQueue, credit: mpsc::Sender<()>) -> Result<(), String> {
    let mut reposted = DEPTH as u64;
    for _ in 0..ROUNDS {
        let c = cq.wait(WAIT).ok_or("a Send never arrived")?;
        if (c.wc.opcode, c.wc.status) != (WcOpcode::Recv, WcStatus::Success) {
            return Err(format!("{c:?}"));
        }
        if reposted < ROUNDS {
            qp.post_recv(recv(reposted))
                .map_err(|e| format!("a repost after a completion: {e}"))?;
            reposted += 1;
            let _ = credit.send(());
        }
    }
    Ok(())
}

/// The sending side: `ROUNDS` empty Sends (one per receive the receiver has posted: `DEPTH` at
/// first, then one per credit) and `ROUNDS` Writes, keeping the send queue full and posting
/// as soon as a completion is polled (never refused).
fn sender(
    qp: &QueuePair,
    cq: &CompletionQueue,
    src: &MemoryRegion,
    (stag, to): (Stag, u64),
    credit: &mpsc::Receiver<()>,
) {
    let (mut credits, mut sends, mut writes) = (DEPTH as u64, 0u64, 0u64);
    let (mut outstanding, mut completed) = (0usize, 0u64);
    let deadline = Instant::now() + WAIT * 3;
    while completed < 2 * ROUNDS {
        assert!(Instant::now() < deadline, "{completed} completed");
        while credit.try_recv().is_ok() {
            credits += 1;
        }
        while outstanding < DEPTH {
            let id = sends + writes;
            let wr = if sends < ROUNDS && credits > 0 && (sends <= writes || writes == ROUNDS) {
                credits -= 1;
                sends += 1;
                send_wr(id, src, 0)
            } else if writes < ROUNDS {
                writes += 1;
                write_wr(id, src, 64, stag, to)
            } else {
                break;
            };
            qp.post_send(wr).unwrap_or_else(|e| {
                panic!(
                    "post {id} with {outstanding} outstanding, after {completed} completions: {e}"
                )
            });
            outstanding += 1;
        }
        if outstanding == 0 {
            credit.recv_timeout(WAIT).expect("a credit");
            credits += 1;
            continue;
        }
        let c = cq.wait(WAIT).expect("a completion");
        assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
        outstanding -= 1;
        completed += 1;
    }
}

/// A region the receiver offers for Writes, as private data (STag, TO).
fn offer(mr: &MemoryRegion) -> Vec<u8> {
    let mut p = mr.stag().0.to_be_bytes().to_vec();
    p.extend_from_slice(&mr.base_to().to_be_bytes());
    p
}

fn offered(p: &[u8]) -> (Stag, u64) {
    (
        Stag(u32::from_be_bytes(p[..4].try_into().unwrap())),
        u64::from_be_bytes(p[4..12].try_into().unwrap()),
    )
}

#[test]
fn socket_queues_refill_as_completions_are_polled() {
    let listener = Listener::bind(common::any_port(), params()).expect("listen");
    let (client, server) = (Side::new(), Side::new());
    let sink = server
        .pd
        .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .expect("sink");
    let src = client.pd.register(4096, Access::NONE).expect("source");
    let (c, s) = common::establish_ok(
        &listener,
        &client,
        &params(),
        common::ServerPlan {
            side: &server,
            private_data: &offer(&sink),
            recvs: (0..DEPTH as u64).map(recv).collect(),
        },
    );
    receives_posted_at_accept_count(&s.qp).expect("receiver");
    let (credit_tx, credit_rx) = mpsc::channel();
    std::thread::scope(|sc| {
        let r = sc.spawn(|| receiver(&s.qp, &server.cq, credit_tx));
        sender(
            &c.qp,
            &client.cq,
            &src,
            offered(&c.private_data),
            &credit_rx,
        );
        r.join().expect("receiver").expect("receiver");
    });
}

/// The receiving end of a refill test, accepted from `req` with `DEPTH` receives: checks that
/// they count, says so on `checked`, receives (`receiver`), then holds the connection until
/// the sender says `done` (its last Writes may still be on their way).
fn receiving_end(
    req: datapath::ConnectRequest,
    checked: mpsc::Sender<()>,
    credit: mpsc::Sender<()>,
    done: mpsc::Receiver<()>,
) -> Result<(), String> {
    let server = Side::new();
    let sink = server
        .pd
        .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(|e| e.to_string())?;
    let conn = req
        .accept_with_recvs(
            &server.pd,
            &server.cq,
            &offer(&sink),
            (0..DEPTH as u64).map(recv).collect(),
        )
        .map_err(|e| e.to_string())?;
    receives_posted_at_accept_count(&conn.qp)?;
    let _ = checked.send(());
    receiver(&conn.qp, &server.cq, credit)?;
    let _ = done.recv_timeout(WAIT);
    Ok(())
}

/// The sending end of a refill test, connected as `client` with `conn`: waits for the
/// receiver's check, sends (`sender`), says `done`.
fn sending_end(
    client: &Side,
    conn: &datapath::Connection,
    checked: &mpsc::Receiver<()>,
    credit: &mpsc::Receiver<()>,
    done: &mpsc::Sender<()>,
) {
    let src = client.pd.register(4096, Access::NONE).expect("source");
    checked.recv_timeout(WAIT).expect("the receiver's check");
    sender(
        &conn.qp,
        &client.cq,
        &src,
        offered(&conn.private_data),
        credit,
    );
    let _ = done.send(());
}

#[test]
fn engine_queues_refill_as_completions_are_polled() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_583;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (checked_tx, checked_rx) = mpsc::channel();
    let (credit_tx, credit_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let peer = std::thread::spawn(move || -> Result<(), String> {
        let req = bed::listen_in_b_with(PORT, &ready_tx, WAIT, params())?;
        receiving_end(req, checked_tx, credit_tx, done_rx)
    });
    ready_rx.recv_timeout(WAIT).expect("peer listening");
    let ours = spawn_in_ns(NS_A, move || {
        let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default()).expect("engine on iwa0");
        let client = Side::new();
        let conn = engine
            .connect(
                SocketAddr::from((ADDR_B, PORT)),
                &client.pd,
                &client.cq,
                &params(),
                &[],
            )
            .expect("connect");
        sending_end(&client, &conn, &checked_rx, &credit_rx, &done_tx);
        drop(conn);
        drop(engine);
    });
    let ours = ours.join();
    let theirs = peer.join().expect("peer thread");
    ours.expect("engine side");
    theirs.expect("receiver");
}

/// The engine receiving: its receives posted at accept count, and a receive it reposts on a
/// completion is in place for the Send the credit (given out of band) brings, although the
/// engine's turn receives before it serves.
#[test]
fn engine_receiver_refills_as_completions_are_polled() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_585;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (checked_tx, checked_rx) = mpsc::channel();
    let (credit_tx, credit_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let ours = spawn_in_ns(NS_A, move || -> Result<(), String> {
        let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default())
            .map_err(|e| format!("engine: {e}"))?;
        let listener = engine.listen(PORT, params()).map_err(|e| e.to_string())?;
        let _ = ready_tx.send(());
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| e.to_string())?
            .ok_or("no connection request")?;
        receiving_end(req, checked_tx, credit_tx, done_rx)?;
        drop(engine);
        Ok(())
    });
    ready_rx.recv_timeout(WAIT).expect("engine listening");
    let theirs = spawn_in_ns(NS_B, move || {
        let client = Side::new();
        let conn = datapath::connect(
            SocketAddr::from((testbed::ADDR_A, PORT)),
            &client.pd,
            &client.cq,
            &params(),
            &[],
        )
        .expect("connect");
        sending_end(&client, &conn, &checked_rx, &credit_rx, &done_tx);
    });
    let theirs = theirs.join();
    let ours = ours.join().expect("engine thread");
    theirs.expect("socket sender");
    ours.expect("engine receiver");
}
