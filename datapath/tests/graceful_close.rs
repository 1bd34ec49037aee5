//! The socket transport's graceful close while the peer is still sending: what our Writes
//! handed to the kernel must reach the peer. Our side in `iwa`, its octets toward the peer
//! held to 200 Mbit/s (a token bucket on `iwa0`) so that the kernel still holds some when a
//! large Write completes; the peer in `iwb`, both on the socket transport. Needs root and the
//! veth bed (`SKIPPED` without, a failure under `CI=true`).

use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

use common::{pattern, write_wr};
use datapath::{Access, CompletionQueue, ConnectParams, ProtectionDomain, QpError, Stag, WcStatus};
use testbed::*;

const PORT: u16 = 19_623;
const WAIT: Duration = Duration::from_secs(20);
/// Our Write: several times what the kernel's send buffer holds.
const LEN: usize = 16 << 20;
/// Each of the peer's Writes.
const CHUNK: usize = 64 << 10;

fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    }
}

/// The peer in `iwb`: offers a region for our Write, Writes into ours without pause (16
/// outstanding) until its queue pair ends, and returns how it ended and whether our Write
/// arrived whole.
fn peer(
    ready: mpsc::Sender<(Stag, u64)>,
    ours: mpsc::Receiver<(Stag, u64)>,
) -> Result<(Option<QpError>, u64, Option<usize>), String> {
    let listener = datapath::Listener::bind(SocketAddr::from((ADDR_B, PORT)), params())
        .map_err(|e| e.to_string())?;
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let sink = pd
        .register(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(|e| e.to_string())?;
    let src = pd
        .register_buffer(pattern(7, CHUNK), Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let _ = ready.send((sink.stag(), sink.base_to()));
    let req = listener
        .accept_timeout(WAIT)
        .map_err(|e| e.to_string())?
        .ok_or("no connection")?;
    let conn = req.accept(&pd, &cq, b"").map_err(|e| e.to_string())?;
    let target = ours.recv_timeout(WAIT).map_err(|_| "no region to write")?;
    let deadline = Instant::now() + WAIT;
    let mut writes = 0u64;
    let mut outstanding = 0;
    'writing: while Instant::now() < deadline {
        while outstanding < 16 {
            if conn
                .qp
                .post_send(write_wr(writes, &src, CHUNK, target.0, target.1))
                .is_err()
            {
                break 'writing;
            }
            writes += 1;
            outstanding += 1;
        }
        match cq.wait(Duration::from_millis(500)) {
            Some(c) if c.wc.status == WcStatus::Success => outstanding -= 1,
            _ => break,
        }
    }
    if !conn.qp.wait_finished(WAIT) {
        return Err("the peer's queue pair did not end".into());
    }
    let want = pattern(1, LEN);
    let mut got = vec![0u8; LEN];
    sink.read(0, &mut got);
    let first_wrong = got.iter().zip(&want).position(|(a, b)| a != b);
    Ok((conn.qp.status().error, writes, first_wrong))
}

/// A disconnect right after a large Write completed, while the peer is still writing to us:
/// every octet of the Write (part of it in the kernel's send buffer when it completed)
/// reaches the peer. Before, the close came with the peer's latest FPDUs unread, and Linux
/// resets a connection closed with unread data (or an orphaned one that receives more),
/// throwing away what it still held of ours: the peer got a reset and a Write that had
/// completed successfully arrived in part.
#[test]
fn a_disconnect_while_the_peer_writes_delivers_what_was_written() {
    let _bed = bed_or_skip!();
    let st = Command::new("ip")
        .args([
            "netns", "exec", NS_A, "tc", "qdisc", "replace", "dev", DEV_A, "root",
        ])
        .args(["tbf", "rate", "200mbit", "burst", "64k", "latency", "200ms"])
        .status()
        .expect("tc");
    assert!(st.success(), "tc qdisc replace on {DEV_A}: {st}");
    let (ready_tx, ready_rx) = mpsc::channel();
    let (ours_tx, ours_rx) = mpsc::channel();
    let srv = spawn_in_ns(NS_B, move || peer(ready_tx, ours_rx));
    let target = ready_rx.recv_timeout(WAIT).expect("peer ready");
    let ours = spawn_in_ns(NS_A, move || -> Result<Duration, String> {
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let src = pd
            .register_buffer(pattern(1, LEN), Access::NONE)
            .map_err(|e| e.to_string())?;
        let sink = pd
            .register(CHUNK, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(|e| e.to_string())?;
        let conn = datapath::connect(SocketAddr::from((ADDR_B, PORT)), &pd, &cq, &params(), b"")
            .map_err(|e| format!("connect: {e}"))?;
        let _ = ours_tx.send((sink.stag(), sink.base_to()));
        // The peer's Writes flowing in, then ours, then the close.
        std::thread::sleep(Duration::from_millis(100));
        conn.qp
            .post_send(write_wr(1, &src, LEN, target.0, target.1))
            .map_err(|e| e.to_string())?;
        match cq.wait(WAIT) {
            Some(c) if c.wc.status == WcStatus::Success => {}
            other => return Err(format!("our Write: {other:?}")),
        }
        let start = Instant::now();
        conn.qp.disconnect();
        Ok(start.elapsed())
    });
    let took = ours.join().expect("our side").expect("our side");
    let (error, writes, first_wrong) = srv.join().expect("peer").expect("peer");
    println!("disconnect took {took:?}; the peer made {writes} Writes and ended with {error:?}");
    assert_eq!(
        first_wrong, None,
        "our Write did not arrive whole (the peer ended with {error:?})"
    );
}
