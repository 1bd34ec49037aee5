//! `QueuePair::disconnect` on the socket transport is bounded against a peer that stopped
//! reading: the peer (a raw TCP socket that answers the MPA Request by hand, or in one case
//! sends it, and never reads again) lets its receive buffer fill, our Writes fill our send
//! buffer behind it, and the graceful close can never drain; after its close timeout
//! (`ConnectParams::close_timeout`: 10 s by default, [`CLOSE_TIMEOUT`] in most cases here)
//! the close becomes a reset and `disconnect` returns with the queue pair finished, and a
//! close only started (`start_disconnect`) ends the same way. Loopback, no root needed; some
//! cases on the AF_XDP engine on the veth bed.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use datapath::{
    Access, CompletionQueue, ConnectParams, ProtectionDomain, SendOp, SendWr, Stag, WcStatus,
};

/// Bound on each wait for the other side (setup, a completion).
const WAIT: Duration = Duration::from_secs(20);
/// Octets of each Write, and of the region they read.
const WRITE_LEN: usize = 1 << 20;
/// Writes posted: far more than loopback's socket buffers hold.
const WRITES: u64 = 64;
/// The close timeout the cases set (the default's 10 s in one case only: the bound is the
/// same code, and each case would wait it out).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
/// What `disconnect` may take: the graceful wait, the 2 s reset wait and some slack.
const DISCONNECT_BOUND: Duration = Duration::from_secs(3 + 4);
/// What a close only started may take: its graceful wait and some slack for a loaded machine.
const STARTED_CLOSE_BOUND: Duration = Duration::from_secs(3 + 5);

/// A peer that completes the MPA exchange as Responder and then never reads: its socket stays
/// open until `stop` says (or is dropped).
fn silent_responder(
    stop: mpsc::Receiver<()>,
) -> (SocketAddr, std::thread::JoinHandle<Result<(), String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    (addr, silent_on(listener, stop))
}

/// [`silent_responder`] on `listener`, on a thread of its own.
fn silent_on(
    listener: TcpListener,
    stop: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<Result<(), String>> {
    // Inherited by the accepted socket: a small window, filled at once.
    socket2::SockRef::from(&listener)
        .set_recv_buffer_size(16 * 1024)
        .expect("SO_RCVBUF");
    std::thread::spawn(move || {
        let mut s = common::accept_within(&listener, WAIT).map_err(|e| e.to_string())?;
        answer_request(&mut s)?;
        // Holds the connection without reading until the test is done with it.
        let _ = stop.recv_timeout(Duration::from_secs(60));
        drop(s);
        Ok(())
    })
}

/// Reads the MPA Request on `s` and sends an accepting Reply.
fn answer_request(s: &mut TcpStream) -> Result<(), String> {
    let mut responder = common::read_mpa_request(s)?;
    let (reply, _) = responder.accept(b"").map_err(|e| e.to_string())?;
    s.write_all(&reply).map_err(|e| e.to_string())
}

/// Connects to `addr` without a user timeout (the kernel never gives up on a peer that keeps
/// advertising a zero window, or acknowledges something now and then: only our own bounds
/// end what follows) and with `params`' close timeout, and posts [`post_writes`]' Writes.
fn connect_and_post_writes(
    addr: SocketAddr,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    params: &ConnectParams,
) -> (datapath::Connection, datapath::MemoryRegion) {
    let conn = datapath::connect(addr, pd, cq, params, b"").expect("connect");
    let src = post_writes(pd, &conn.qp);
    (conn, src)
}

/// [`connect_and_post_writes`] from an AF_XDP engine on the bed's `iwa0` (called in `iwa`)
/// to `port` of the peer in `iwb`; the engine goes with the connection.
fn engine_connect_and_post_writes(
    port: u16,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
) -> (
    datapath::engine::XdpEngine,
    datapath::Connection,
    datapath::MemoryRegion,
) {
    let engine = datapath::engine::XdpEngine::start(testbed::DEV_A, Default::default())
        .expect("the engine on iwa0");
    let conn = engine
        .connect(
            SocketAddr::from((testbed::ADDR_B, port)),
            pd,
            cq,
            &params(CLOSE_TIMEOUT),
            b"",
        )
        .expect("connect");
    let src = post_writes(pd, &conn.qp);
    (engine, conn, src)
}

/// Connection parameters without a user timeout (only our own bounds end what follows), with
/// `close_timeout`.
fn params(close_timeout: Duration) -> ConnectParams {
    ConnectParams {
        user_timeout: None,
        setup_timeout: Duration::from_secs(10),
        close_timeout,
        ..ConnectParams::default()
    }
}

/// Posts [`WRITES`] Writes of [`WRITE_LEN`] octets, far more than the socket buffers hold;
/// returns their source region.
fn post_writes(pd: &ProtectionDomain, qp: &datapath::QueuePair) -> datapath::MemoryRegion {
    let src = pd.register(WRITE_LEN, Access::LOCAL_WRITE).expect("region");
    for i in 0..WRITES {
        let wr = SendWr {
            wr_id: i,
            // The peer never places them: where they would go does not matter.
            op: SendOp::Write {
                remote_stag: Stag(0x100),
                remote_to: 0,
            },
            sg_list: src.sge(0, WRITE_LEN as u32).into(),
            signaled: true,
            fence: false,
        };
        qp.post_send(wr).expect("post a Write");
    }
    src
}

/// Waits until the Writes stop completing: the buffers on both sides are full.
fn wait_for_the_stall(cq: &CompletionQueue) {
    let mut completed = 0u64;
    while let Some(c) = cq.wait(Duration::from_secs(2)) {
        assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
        completed += 1;
        assert!(
            completed < WRITES,
            "every Write went out: the peer's buffer never filled"
        );
    }
    println!("{completed} of {WRITES} Writes completed before the stall");
}

/// A peer that connects as MPA Initiator to `addr`, reads the Reply, sends its first FPDU
/// (a Send without payload, for which the Responder waits before it sends: RFC 5044 7.1.2,
/// rule 4)
/// and then never reads again (a small receive buffer, filled at once): its socket stays open
/// until `stop` says (or is dropped).
fn silent_initiator(
    addr: SocketAddr,
    stop: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<Result<(), String>> {
    std::thread::spawn(move || {
        let e = |e: std::io::Error| e.to_string();
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).map_err(e)?;
        socket.set_recv_buffer_size(16 * 1024).map_err(e)?;
        socket.connect_timeout(&addr.into(), WAIT).map_err(e)?;
        let mut s = TcpStream::from(socket);
        s.set_read_timeout(Some(WAIT)).map_err(e)?;
        let mut initiator =
            mpa::Initiator::new(datapath::MpaConfig::default(), b"", Instant::now())
                .map_err(|e| e.to_string())?;
        s.write_all(initiator.request()).map_err(e)?;
        let mut byte = [0u8; 1];
        let negotiated = loop {
            // One octet at a time: nothing after the Reply is taken from the stream.
            if s.read(&mut byte).map_err(e)? == 0 {
                return Err("closed before the Reply".into());
            }
            match initiator.feed(&byte, Instant::now()) {
                Ok((_, mpa::InitiatorEvent::NeedMore)) => {}
                Ok((_, mpa::InitiatorEvent::Accepted { negotiated, .. })) => break negotiated,
                Ok((_, other)) => return Err(format!("not accepted: {other:?}")),
                Err(error) => return Err(error.to_string()),
            }
        };
        // A Send of no octets (RFC 5040 4.1, 4.2; RFC 5041 4.1, 4.3): DDP's last untagged
        // segment (T 0, L 1, DV 1), RDMAP version 1 Send, no STag to invalidate, queue 0,
        // message 1, offset 0.
        let mut ulpdu = vec![0x41, 0x43];
        for field in [0u32, 0, 1, 0] {
            ulpdu.extend_from_slice(&field.to_be_bytes());
        }
        let mut fpdu = Vec::new();
        negotiated
            .encoder()
            .encode(&ulpdu, &mut fpdu)
            .map_err(|e| e.to_string())?;
        s.write_all(&fpdu).map_err(e)?;
        // Holds the connection without reading until the test is done with it.
        let _ = stop.recv_timeout(Duration::from_secs(60));
        drop(s);
        Ok(())
    })
}

/// `disconnect` on `conn`, whose Writes stalled behind a peer that stopped reading, on a
/// thread of its own: it must return within [`DISCONNECT_BOUND`], after waiting out the
/// whole [`CLOSE_TIMEOUT`], with the queue pair finished.
fn disconnect_waits_the_close_timeout(conn: datapath::Connection) {
    let (done_tx, done_rx) = mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        conn.qp.disconnect();
        let _ = done_tx.send((started.elapsed(), conn.qp.status()));
        // Dropped here, on this thread, should the test have given up on it.
        drop(conn);
    });
    let (elapsed, status) = done_rx
        .recv_timeout(DISCONNECT_BOUND + Duration::from_secs(10))
        .expect("disconnect did not return");
    println!("disconnect returned after {elapsed:?}: {status:?}");
    assert!(elapsed <= DISCONNECT_BOUND, "disconnect took {elapsed:?}");
    // The peer never read: the graceful close waited its whole close timeout first.
    assert!(elapsed >= CLOSE_TIMEOUT, "disconnect took only {elapsed:?}");
    assert!(status.finished, "{status:?}");
}

#[test]
fn disconnect_from_a_peer_that_stopped_reading_is_bounded() {
    let (stop_tx, stop_rx) = mpsc::channel();
    let (addr, peer) = silent_responder(stop_rx);
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let (conn, _src) = connect_and_post_writes(addr, &pd, &cq, &params(CLOSE_TIMEOUT));
    wait_for_the_stall(&cq);
    disconnect_waits_the_close_timeout(conn);
    let _ = stop_tx.send(());
    peer.join().expect("the peer's thread").expect("the peer");
}

/// An accepted connection takes the close timeout its accept sets
/// (`ConnectRequest::close_timeout`), not its listener's (the default 10 s here): behind an
/// initiator that stopped reading, its `disconnect` resets after [`CLOSE_TIMEOUT`].
#[test]
fn an_accept_sets_its_own_close_timeout() {
    let listener = datapath::Listener::bind(
        common::any_port(),
        params(ConnectParams::default().close_timeout),
    )
    .expect("listen");
    let addr = listener.local_addr().expect("address");
    let (stop_tx, stop_rx) = mpsc::channel();
    let peer = silent_initiator(addr, stop_rx);
    let req = listener
        .accept_timeout(WAIT)
        .expect("accept")
        .expect("a connection request");
    let (pd, cq, recv_cq) = (
        ProtectionDomain::new(),
        CompletionQueue::new(),
        CompletionQueue::new(),
    );
    // The receive the initiator's first Send takes, on a queue of its own.
    let recv = datapath::RecvWr {
        wr_id: 0,
        sg_list: datapath::SgeList::new(),
    };
    let conn = req
        .close_timeout(CLOSE_TIMEOUT)
        .use_recv_cq(&recv_cq)
        .accept_with_recvs(&pd, &cq, b"", vec![recv])
        .expect("accept");
    let got = recv_cq.wait(WAIT).expect("the initiator's Send");
    assert_eq!(got.wc.status, WcStatus::Success, "{got:?}");
    let _src = post_writes(&pd, &conn.qp);
    wait_for_the_stall(&cq);
    disconnect_waits_the_close_timeout(conn);
    let _ = stop_tx.send(());
    peer.join().expect("the peer's thread").expect("the peer");
}

/// `destroy` (`rdma_destroy_id` of a connected id) behind a peer that stopped reading is
/// abrupt, as iWARP's is: the connection reset at once, not the graceful close's wait
/// (which dropping the handle makes); the peer sees the reset.
#[test]
fn destroy_behind_a_peer_that_stopped_reading_resets_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    socket2::SockRef::from(&listener)
        .set_recv_buffer_size(16 * 1024)
        .expect("SO_RCVBUF");
    let (stalled_tx, stalled_rx) = mpsc::channel::<()>();
    let peer = std::thread::spawn(move || -> Result<std::io::ErrorKind, String> {
        let mut s = common::accept_within(&listener, WAIT).map_err(|e| e.to_string())?;
        answer_request(&mut s)?;
        // Silent until the writer stalled and destroyed; then what reading meets.
        let _ = stalled_rx.recv_timeout(WAIT * 2);
        s.set_read_timeout(Some(WAIT)).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return Ok(std::io::ErrorKind::UnexpectedEof),
                Ok(_) => continue,
                Err(e) => return Ok(e.kind()),
            }
        }
    });
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let (conn, _src) = connect_and_post_writes(addr, &pd, &cq, &params(CLOSE_TIMEOUT));
    wait_for_the_stall(&cq);
    let started = Instant::now();
    conn.qp.destroy();
    let took = started.elapsed();
    let _ = stalled_tx.send(());
    println!("destroy returned after {took:?}");
    assert!(took < Duration::from_secs(5), "destroy took {took:?}");
    let seen = peer.join().expect("the peer's thread").expect("the peer");
    assert_eq!(seen, std::io::ErrorKind::ConnectionReset, "not reset");
}

/// `start_disconnect` (`rdma_disconnect`, which does not wait) behind a peer that stopped
/// reading: nobody waits in `disconnect` to reset the close after its close timeout (here
/// the default, 10 s), yet the close ends by itself within the same bound, reset, and its end
/// is seen (`status().finished`) with the application doing nothing more. Before, it waited
/// for the peer for as long as the peer held its connection open, its end unreported.
#[test]
fn a_started_close_behind_a_peer_that_stopped_reading_ends_in_bounded_time() {
    let (stop_tx, stop_rx) = mpsc::channel();
    let (addr, peer) = silent_responder(stop_rx);
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let default = params(ConnectParams::default().close_timeout);
    assert_eq!(default.close_timeout, Duration::from_secs(10));
    let (conn, _src) = connect_and_post_writes(addr, &pd, &cq, &default);
    wait_for_the_stall(&cq);
    let started = Instant::now();
    conn.qp.start_disconnect().expect("start the close");
    // The close's 10 s and some slack for a loaded machine (the peer holds on for 60 s).
    let ended = conn.qp.wait_finished(Duration::from_secs(15));
    let took = started.elapsed();
    let status = conn.qp.status();
    let _ = stop_tx.send(());
    println!("ended {ended} after {took:?}: {status:?}");
    assert!(ended, "the started close never ended: {status:?}");
    drop(conn);
    peer.join().expect("the peer's thread").expect("the peer");
}

/// The same on the AF_XDP engine (the veth bed, root; `SKIPPED` without it, a failure under
/// `CI=true`): the peer, kernel TCP in `iwb`, never reads; the engine's close is reset after
/// its close timeout. Before, its TCP answered the peer's zero window with probes for ever (no
/// user timeout), the queue pair Closing.
#[test]
fn engine_started_close_behind_a_peer_that_stopped_reading_ends_in_bounded_time() {
    use testbed::{ADDR_B, NS_A, NS_B};
    let _bed = testbed::bed_or_skip!();
    const PORT: u16 = 19_629;
    let (stop_tx, stop_rx) = mpsc::channel();
    let peer = testbed::in_ns(NS_B, || {
        TcpListener::bind((ADDR_B, PORT)).map(|listener| silent_on(listener, stop_rx))
    })
    .expect("the peer's listener in iwb");
    let outcome = testbed::in_ns(NS_A, || {
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let (_engine, conn, _src) = engine_connect_and_post_writes(PORT, &pd, &cq);
        wait_for_the_stall(&cq);
        let started = Instant::now();
        conn.qp.start_disconnect().expect("start the close");
        let ended = conn.qp.wait_finished(STARTED_CLOSE_BOUND);
        (ended, started.elapsed(), conn.qp.status())
    });
    let _ = stop_tx.send(());
    let (ended, took, status) = outcome;
    println!("ended {ended} after {took:?}: {status:?}");
    assert!(ended, "the started close never ended: {status:?}");
    assert!(took >= CLOSE_TIMEOUT, "the close ended after only {took:?}");
    peer.join().expect("the peer's thread").expect("the peer");
}

/// An engine connection closed gracefully (the peer reads to the end and closes too) waits in
/// TIME-WAIT for 60 s; the close's deadline ([`CLOSE_TIMEOUT`] here), spent once our FIN was
/// acknowledged, must not keep the engine thread from sleeping meanwhile (a deadline left in
/// the past made every wait return at once: millions of turns a second). The engine thread's
/// turns over 2 s, a second after the close's deadline, stay those of an idle engine (about
/// 6,600 a second).
#[test]
fn engine_sleeps_while_a_closed_connection_waits_in_time_wait() {
    use testbed::{ADDR_B, DEV_A, NS_A, NS_B};
    let _bed = testbed::bed_or_skip!();
    const PORT: u16 = 19_632;
    let peer = testbed::in_ns(NS_B, || {
        let listener = TcpListener::bind((ADDR_B, PORT)).expect("bind in iwb");
        std::thread::spawn(move || -> Result<(), String> {
            let mut s =
                common::accept_within(&listener, common::WAIT).map_err(|e| e.to_string())?;
            answer_request(&mut s)?;
            let mut sink = [0u8; 4096];
            // Reads to our FIN, then closes its side.
            while s.read(&mut sink).map_err(|e| e.to_string())? > 0 {}
            Ok(())
        })
    });
    let turns = testbed::in_ns(NS_A, || {
        let engine = datapath::engine::XdpEngine::start(DEV_A, Default::default())
            .expect("the engine on iwa0");
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let params = ConnectParams {
            setup_timeout: Duration::from_secs(10),
            close_timeout: CLOSE_TIMEOUT,
            ..ConnectParams::default()
        };
        let conn = engine
            .connect(SocketAddr::from((ADDR_B, PORT)), &pd, &cq, &params, b"")
            .expect("connect");
        conn.qp.disconnect();
        assert!(conn.qp.status().finished, "{:?}", conn.qp.status());
        std::thread::sleep(CLOSE_TIMEOUT + Duration::from_secs(1));
        let before = engine.counters().thread_turns;
        std::thread::sleep(Duration::from_secs(2));
        engine.counters().thread_turns - before
    });
    peer.join().expect("the peer's thread").expect("the peer");
    println!("engine thread turns in 2 s, in TIME-WAIT: {turns}");
    assert!(turns < 200_000, "the engine spun: {turns} turns in 2 s");
}

/// A peer that makes our queue pair fail (an FPDU whose CRC is wrong) while our Writes wait
/// behind its full window, and then reads a trickle (`trickle`: 64 KiB every 2 s) or nothing
/// at all: the queue pair sends what it can of them and its Terminate for at most its close
/// timeout (the user timeout if less), then resets the connection, and its end is seen
/// (`status().finished`) with the application doing nothing. Before, it waited until all its
/// own buffer (half a MiB) had gone at the peer's pace, holding its thread and buffers, the
/// end unreported; behind a peer that reads nothing it stayed in Terminate for ever.
fn error_behind_a_slow_reader(trickle: bool) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let peer = slow_reader(listener, trickle, go_rx, stop_rx);
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let (conn, _src) = connect_and_post_writes(addr, &pd, &cq, &params(CLOSE_TIMEOUT));
    let (ended, took, status) = fail_and_wait(&conn.qp, &go_tx);
    let _ = stop_tx.send(());
    println!("trickle {trickle}: ended {ended} after {took:?}: {status:?}");
    assert_ended_in_error(ended, took, &status);
    drop(conn);
    peer.join().expect("the peer's thread").expect("the peer");
}

/// Once some Writes went, has the peer send its bad FPDU (`go`) and waits for the queue
/// pair's end: whether it came within [`STARTED_CLOSE_BOUND`] (its close timeout in Error and
/// some slack for a loaded machine: what it had queued would take the trickle 18 s and more),
/// how long it took, and its status.
fn fail_and_wait(
    qp: &datapath::QueuePair,
    go: &mpsc::Sender<()>,
) -> (bool, Duration, datapath::QpStatus) {
    // Some Writes go; the rest wait behind the trickle.
    std::thread::sleep(Duration::from_millis(1500));
    let _ = go.send(());
    let started = Instant::now();
    let ended = qp.wait_finished(STARTED_CLOSE_BOUND);
    (ended, started.elapsed(), qp.status())
}

fn assert_ended_in_error(ended: bool, took: Duration, status: &datapath::QpStatus) {
    assert!(ended, "the queue pair in error did not end: {status:?}");
    // What it had queued would take the peer far longer: the close timeout ended it.
    assert!(took >= CLOSE_TIMEOUT, "it ended after only {took:?}");
    assert!(
        matches!(status.error, Some(datapath::QpError::Mpa(_))) && status.sent_terminate.is_some(),
        "{status:?}"
    );
}

/// The peer of [`error_behind_a_slow_reader`] on `listener`, on a thread of its own: answers
/// the MPA Request, reads a trickle (64 KiB every 2 s; with `trickle` false, nothing once it
/// has sent its bad FPDU), and sends an FPDU with a wrong CRC when `go` says.
fn slow_reader(
    listener: TcpListener,
    trickle: bool,
    go_rx: mpsc::Receiver<()>,
    stop_rx: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<Result<(), String>> {
    socket2::SockRef::from(&listener)
        .set_recv_buffer_size(256 * 1024)
        .expect("SO_RCVBUF");
    std::thread::spawn(move || -> Result<(), String> {
        let mut s = common::accept_within(&listener, common::WAIT).map_err(|e| e.to_string())?;
        answer_request(&mut s)?;
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        // A trickle from the start: the window opens every few reads, so the kernel's user
        // timeout never sees a stall.
        let mut chunk = vec![0u8; 64 * 1024];
        let deadline = Instant::now() + WAIT;
        let mut sent_bad = false;
        let mut next_read = Instant::now();
        while stop_rx.try_recv().is_err() && Instant::now() < deadline {
            if !sent_bad && go_rx.try_recv().is_ok() {
                // An FPDU of 16 octets and a CRC of zeros: not the CRC of its octets.
                let mut bad = vec![0x00, 0x10];
                bad.extend_from_slice(&[0u8; 16 + 2 + 4]);
                s.write_all(&bad).map_err(|e| e.to_string())?;
                sent_bad = true;
            }
            if (trickle || !sent_bad) && Instant::now() >= next_read {
                if let Ok(0) = s.read(&mut chunk) {
                    break;
                }
                next_read += Duration::from_secs(2);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    })
}

#[test]
fn a_queue_pair_in_error_behind_a_trickling_reader_ends_in_bounded_time() {
    error_behind_a_slow_reader(true);
}

#[test]
fn a_queue_pair_in_error_behind_a_reader_that_stopped_ends_in_bounded_time() {
    error_behind_a_slow_reader(false);
}

/// [`error_behind_a_slow_reader`] on the AF_XDP engine (veth bed): its queue pair in Error, a
/// peer reading a trickle, also ends within its close timeout and a reset, with the application doing
/// nothing. Before, only a close the application started had that bound: the connection,
/// its buffers and its table slot stayed for as long as the trickle lasted.
#[test]
fn engine_queue_pair_in_error_behind_a_trickling_reader_ends_in_bounded_time() {
    use testbed::{ADDR_B, NS_A, NS_B};
    let _bed = testbed::bed_or_skip!();
    const PORT: u16 = 19_603;
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let peer = testbed::in_ns(NS_B, || {
        TcpListener::bind((ADDR_B, PORT))
            .map(|listener| slow_reader(listener, true, go_rx, stop_rx))
    })
    .expect("the peer's listener in iwb");
    let (ended, took, status) = testbed::in_ns(NS_A, || {
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let (_engine, conn, _src) = engine_connect_and_post_writes(PORT, &pd, &cq);
        fail_and_wait(&conn.qp, &go_tx)
    });
    let _ = stop_tx.send(());
    println!("engine: ended {ended} after {took:?}: {status:?}");
    assert_ended_in_error(ended, took, &status);
    peer.join().expect("the peer's thread").expect("the peer");
}
