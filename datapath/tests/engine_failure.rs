//! An engine thread that panics (injected) fails cleanly for the application: every queue
//! pair's outstanding work requests complete with `WrFlushError`, its status says
//! `QpError::EngineFailed`, later posts complete flushed at once, and XDP is detached from the interface,
//! which carries kernel TCP again at once. Needs root and the veth bed (`SKIPPED` without, a
//! failure under `CI=true`).

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, Connection, Listener, MemoryRegion, ProtectionDomain,
    QpError, RecvWr, WcStatus,
};
use testbed::*;

const PORT: u16 = 19_581;
const KERNEL_PORT: u16 = 19_582;
const WAIT: Duration = Duration::from_secs(20);

fn xdp_attached(ns: &str, dev: &str) -> bool {
    let out = Command::new("ip")
        .args(["-n", ns, "-d", "link", "show", dev])
        .output()
        .expect("ip link show");
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

/// The socket transport's connection from `iwb` to the engine's `port`.
fn connect_from_b(port: u16) -> Result<Connection, String> {
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    datapath::connect(
        SocketAddr::from((ADDR_A, port)),
        &pd,
        &cq,
        &ConnectParams::default(),
        b"",
    )
    .map_err(|e| format!("connect: {e}"))
}

/// The next connection on `listener`, accepted with three 1 KiB receives posted (wr_id 0 to
/// 2); with its protection domain, completion queue and the receives' region.
fn accept_with_three_recvs(
    listener: &Listener,
) -> Result<(Connection, ProtectionDomain, CompletionQueue, MemoryRegion), String> {
    let req = listener
        .accept_timeout(WAIT)
        .map_err(|e| e.to_string())?
        .ok_or("no connection")?;
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let buf = pd
        .register(4096, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let recvs = (0..3)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: buf.sge(i as usize * 1024, 1024).into(),
        })
        .collect();
    let conn = req
        .accept_with_recvs(&pd, &cq, &[], recvs)
        .map_err(|e| e.to_string())?;
    Ok((conn, pd, cq, buf))
}

/// Waits until `deadline` for `conn`'s queue pair to finish; it must have ended with
/// `QpError::EngineFailed`.
fn ended_as_failed(conn: &Connection, deadline: Instant) -> Result<(), String> {
    while !conn.qp.status().finished && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = conn.qp.status();
    if st.error != Some(QpError::EngineFailed) || !st.finished {
        return Err(format!("status after the panic: {st:?}"));
    }
    Ok(())
}

#[test]
fn an_engine_thread_panic_flushes_every_queue_pair_and_releases_xdp() {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let peer = spawn_in_ns(NS_B, move || -> Result<(), String> {
        ready_rx
            .recv_timeout(WAIT)
            .map_err(|_| "engine not ready")?;
        let conn = connect_from_b(PORT)?;
        // Wait for the engine side to have failed, then show kernel TCP works on iwa0.
        go_rx.recv_timeout(WAIT).map_err(|_| "no go")?;
        let s = TcpStream::connect_timeout(&SocketAddr::from((ADDR_A, KERNEL_PORT)), WAIT)
            .map_err(|e| format!("kernel TCP to iwa after the failure: {e}"))?;
        drop(s);
        drop(conn);
        Ok(())
    });
    let ours = spawn_in_ns(NS_A, move || -> Result<(), String> {
        let engine =
            XdpEngine::start(DEV_A, XdpEngineConfig::default()).map_err(|e| e.to_string())?;
        let listener = engine
            .listen(PORT, ConnectParams::default())
            .map_err(|e| e.to_string())?;
        let kernel = TcpListener::bind(SocketAddr::from((ADDR_A, KERNEL_PORT)))
            .map_err(|e| e.to_string())?;
        ready_tx.send(()).map_err(|_| "peer gone")?;
        let (conn, _pd, cq, buf) = accept_with_three_recvs(&listener)?;
        if !xdp_attached(NS_A, DEV_A) {
            return Err("XDP not attached while the engine runs".into());
        }
        engine.inject_panic();
        // Every outstanding receive completes, flushed.
        for i in 0..3 {
            let c = cq
                .wait(WAIT)
                .ok_or_else(|| format!("receive {i} not flushed: {:?}", conn.qp.status()))?;
            if c.wc.status != WcStatus::WrFlushError {
                return Err(format!("{c:?}"));
            }
        }
        let deadline = Instant::now() + WAIT;
        ended_as_failed(&conn, deadline)?;
        // A later post completes at once, flushed (the queue pair ended in Error).
        conn.qp
            .post_recv(RecvWr {
                wr_id: 9,
                sg_list: buf.sge(0, 8).into(),
            })
            .map_err(|e| format!("a post after the failure: {e}"))?;
        match cq.try_next() {
            Some(c) if (c.wc.wr_id, c.wc.status) == (9, WcStatus::WrFlushError) => {}
            other => return Err(format!("the later post's completion: {other:?}")),
        }
        // XDP is released: the interface is the kernel's again.
        while xdp_attached(NS_A, DEV_A) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if xdp_attached(NS_A, DEV_A) {
            return Err("XDP still attached after the failure".into());
        }
        go_tx.send(()).map_err(|_| "peer gone")?;
        let _ = common::accept_within(&kernel, WAIT).map_err(|e| format!("kernel accept: {e}"))?;
        drop(conn);
        drop(engine);
        Ok(())
    });
    let o = ours.join().expect("engine side");
    let p = peer.join().expect("peer side");
    o.unwrap_or_else(|e| panic!("engine side: {e}"));
    p.unwrap_or_else(|e| panic!("peer side: {e}"));
}

/// A panic in an engine turn that runs on an application thread (inline progress: the
/// application polls its completion queue) fails the engine as one on the engine thread does,
/// and does not unwind into the application's poll: its receives complete flushed, its queue
/// pair says `QpError::EngineFailed`.
#[test]
fn a_panic_in_a_turn_on_the_application_thread_fails_the_engine_not_the_application() {
    const PORT: u16 = 19_583;
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let peer = spawn_in_ns(NS_B, move || -> Result<(), String> {
        ready_rx
            .recv_timeout(WAIT)
            .map_err(|_| "engine not ready")?;
        let conn = connect_from_b(PORT)?;
        let _ = done_rx.recv_timeout(WAIT);
        drop(conn);
        Ok(())
    });
    let ours = spawn_in_ns(NS_A, move || -> Result<(), String> {
        let engine =
            XdpEngine::start(DEV_A, XdpEngineConfig::default()).map_err(|e| e.to_string())?;
        let listener = engine
            .listen(PORT, ConnectParams::default())
            .map_err(|e| e.to_string())?;
        ready_tx.send(()).map_err(|_| "peer gone")?;
        let (conn, _pd, cq, _buf) = accept_with_three_recvs(&listener)?;
        engine.inject_inline_panic();
        // Polling runs engine turns on this thread; the first one panics. Every receive
        // completes, flushed, and no poll unwinds.
        let deadline = Instant::now() + WAIT;
        let mut flushed = 0;
        while flushed < 3 && Instant::now() < deadline {
            match cq.try_next() {
                Some(c) if c.wc.status == WcStatus::WrFlushError => flushed += 1,
                Some(c) => return Err(format!("{c:?}")),
                None => std::thread::yield_now(),
            }
        }
        if flushed < 3 {
            return Err(format!(
                "{flushed} of 3 receives flushed: {:?}",
                conn.qp.status()
            ));
        }
        ended_as_failed(&conn, deadline)?;
        // The engine's error names the panic's own message.
        let error = loop {
            match engine.counters().error {
                Some(e) => break e,
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                None => return Err("the failed engine reports no error".into()),
            }
        };
        if !error.contains("injected") {
            return Err(format!(
                "the engine's error lost the panic's message: {error}"
            ));
        }
        let _ = done_tx.send(());
        drop(conn);
        drop(engine);
        Ok(())
    });
    let o = ours.join().expect("engine side");
    let p = peer.join().expect("peer side");
    o.unwrap_or_else(|e| panic!("engine side: {e}"));
    p.unwrap_or_else(|e| panic!("peer side: {e}"));
}
