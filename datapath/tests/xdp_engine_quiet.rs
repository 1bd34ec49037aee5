//! Quiet polls of the AF_XDP engine (`XdpTcp::poll`): once a poll has found nothing to do and
//! left nothing behind, the polls after it return at once until a frame arrives, the
//! application posts a request or a deadline comes. The deadlines must still come: an
//! application that polls its completion queue (inline progress, so every poll is one of
//! these) after the peer's last segment has to acknowledge it when the delayed-ACK timer
//! (500 us) expires, not when the peer gives up waiting and retransmits.
//!
//! Engine client in `iwa` (inline progress), socket-transport server in `iwb`. The server
//! echoes the client's Sends (the client's next Send carries the ACK of each echo, and the
//! quick-ACK segments of the connection's start are used up) and holds still for [`HOLD`]
//! after the last echo, which nothing answers, while the client polls. Linux retransmits a lone unacknowledged segment
//! after at least 200 ms (its tail-loss probe allows for the peer's delayed ACK, then the
//! retransmission timeout), so its `RetransSegs` counter (`/proc/thread-self/net/snmp` of the
//! server thread, in `iwb`) must not move while our timer, 400 times shorter, is due.
//!
//! Needs root; skips (fails under `CI=true`) without the veth bed. About 2 s.

use std::time::{Duration, Instant};

use datapath::engine::XdpEngineConfig;
use datapath::{Access, CompletionQueue, ProtectionDomain, RecvWr, SendWr, WcOpcode, WcStatus};
use testbed::*;

mod common;
use common::bed;

/// Echoed rounds: more than the 16 quick-ACK segments each way.
const ROUNDS: u64 = 40;
const LEN: usize = 64;
const SETUP: Duration = Duration::from_secs(30);
/// How long the server holds still after its last echo, and the client polls.
const HOLD: Duration = Duration::from_millis(600);

fn recv_wr(mr: &datapath::MemoryRegion, i: u64) -> RecvWr {
    bed::slot_recv(mr, i, LEN)
}

fn send_wr(mr: &datapath::MemoryRegion, i: u64) -> SendWr {
    bed::slot_send(mr, i, LEN)
}

/// The calling thread's network namespace's count of retransmitted TCP segments.
fn retransmitted_segments() -> Result<u64, String> {
    let snmp =
        std::fs::read_to_string("/proc/thread-self/net/snmp").map_err(|e| format!("snmp: {e}"))?;
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next(), tcp.next());
    let (Some(names), Some(values)) = (names, values) else {
        return Err("no Tcp lines in snmp".into());
    };
    let at = names
        .split_whitespace()
        .position(|n| n == "RetransSegs")
        .ok_or("no RetransSegs")?;
    values
        .split_whitespace()
        .nth(at)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "unreadable RetransSegs".to_string())
}

/// Echoes `ROUNDS` Sends and holds still; returns the kernel's retransmissions from the last
/// echo on.
fn server(port: u16, ready: std::sync::mpsc::Sender<()>) -> Result<u64, String> {
    let mut before = 0;
    let echoed = bed::echo_rounds(port, &ready, ROUNDS, LEN, SETUP, |round| {
        if round == ROUNDS - 1 {
            // The last echo: nothing answers it, so only the client's delayed-ACK timer
            // acknowledges it.
            before = retransmitted_segments()?;
        }
        Ok(())
    })?;
    std::thread::sleep(HOLD);
    let retransmitted = retransmitted_segments()? - before;
    let _ = echoed.qp.wait_finished(SETUP);
    echoed.qp.disconnect();
    Ok(retransmitted)
}

/// Sends `ROUNDS` Sends, each after the echo of the one before, then polls on for [`HOLD`]
/// after the last echo. Returns the engine's quiet polls.
fn client(port: u16) -> Result<u64, String> {
    let cfg = XdpEngineConfig {
        inline_progress: true,
        // One engine thread, as in `xdp_engine_inline.rs`: the kernel peer's segments may
        // arrive on any queue.
        shard_per_queue: false,
        ..XdpEngineConfig::default()
    };
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let src = pd
        .register(LEN * 4, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let dst = pd
        .register(LEN * 4, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let (mut engine, conn) = bed::engine_connect_in_a(cfg, port, &pd, &cq)?;
    let qp = conn.qp;
    for i in 0..4 {
        qp.post_recv(recv_wr(&dst, i))
            .map_err(|e| format!("post_recv: {e}"))?;
    }
    let mut received = 0;
    let mut sent = 0;
    let mut last_at = None;
    qp.post_send(send_wr(&src, 0))
        .map_err(|e| format!("post: {e}"))?;
    let start = Instant::now();
    loop {
        if let Some(at) = last_at {
            if Instant::now().duration_since(at) > HOLD {
                break;
            }
        } else if start.elapsed() > SETUP {
            return Err(format!(
                "{received} receives, {sent} sends done: {:?}",
                qp.status()
            ));
        }
        let Some(c) = cq.try_next() else {
            continue;
        };
        if c.wc.status != WcStatus::Success {
            return Err(format!("failed completion {c:?}"));
        }
        if c.wc.opcode != WcOpcode::Recv {
            sent += 1;
            continue;
        }
        received += 1;
        qp.post_recv(recv_wr(&dst, c.wc.wr_id + 4))
            .map_err(|e| format!("repost: {e}"))?;
        if received < ROUNDS {
            qp.post_send(send_wr(&src, received))
                .map_err(|e| format!("post: {e}"))?;
        } else {
            last_at = Some(Instant::now());
        }
    }
    qp.disconnect();
    engine.stop();
    let c = engine.counters();
    println!(
        "quiet polls {}, application turns {}, engine-thread turns {}",
        c.driver.quiet_polls, c.app_turns, c.thread_turns
    );
    Ok(c.driver.quiet_polls)
}

#[test]
fn quiet_polls_still_send_the_delayed_ack_in_time() {
    let _bed = bed_or_skip!();
    let port = 19_561;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let srv = std::thread::spawn(move || server(port, ready_tx));
    if ready_rx.recv_timeout(SETUP).is_err() {
        let r = srv.join();
        panic!("server did not start: {r:?}");
    }
    let cli = std::thread::spawn(move || client(port));
    let quiet = cli
        .join()
        .expect("client thread")
        .unwrap_or_else(|e| panic!("client: {e}"));
    let retransmitted = srv
        .join()
        .expect("server thread")
        .unwrap_or_else(|e| panic!("server: {e}"));
    assert!(quiet > 0, "no quiet poll: the test did not exercise them");
    assert_eq!(
        retransmitted, 0,
        "the kernel peer retransmitted while our delayed ACK was due"
    );
}
