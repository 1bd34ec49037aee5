//! The AF_XDP engine's sleep and wake-up (`datapath::engine::xdp`): a busy-polling engine that
//! has been idle longer than `busy_poll` sleeps in `ppoll`, and a work request posted then must
//! wake it through the wake-up socket (the poster writes it only while the engine's flag says it
//! sleeps). The engine here may sleep up to 30 s (`max_wait`) and nothing else is due to wake it
//! (no data in flight, so no TCP timer): each Send posted after a pause must still complete within
//! 5 s, which only the wake-up can bring about. The engine's `waits` counter proves it slept.
//!
//! Engine client in `iwa`, socket-transport server in `iwb` (kernel TCP, which sends nothing
//! unprompted). Needs root; skips (fails under `CI=true`) without the veth bed. About 1 s.

use std::time::{Duration, Instant};

use datapath::engine::XdpEngineConfig;
use datapath::{Access, CompletionQueue, ProtectionDomain, SendOp, SendWr, WcStatus};
use testbed::*;

mod common;
use common::bed;

const PORT: u16 = 19_535;
const ROUNDS: u64 = 3;
const LEN: usize = 64;
const SETUP: Duration = Duration::from_secs(30);
/// Far below the engine's 30 s `max_wait`: only a working wake-up completes a Send this soon.
const WOKEN_WITHIN: Duration = Duration::from_secs(5);
/// Well above the engine's `busy_poll`, so it is asleep when the Send is posted.
const PAUSE: Duration = Duration::from_millis(100);

fn server(ready: std::sync::mpsc::Sender<()>) -> Result<(), String> {
    bed::receive_sends(PORT, &ready, ROUNDS, LEN, SETUP, |i| vec![i as u8 + 1; LEN])
}

fn client() -> Result<(), String> {
    let mut cfg = XdpEngineConfig::default();
    cfg.driver.max_wait = Duration::from_secs(30);
    // One engine thread: the sleeps counted are those of the connection's thread (idle
    // threads of other queues would sleep whatever the connection does).
    cfg.shard_per_queue = false;
    let busy_poll = cfg.busy_poll;
    assert!(PAUSE > busy_poll * 10);
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let src = pd
        .register(LEN * ROUNDS as usize, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let (mut engine, conn) = bed::engine_connect_in_a(cfg, PORT, &pd, &cq)?;
    let qp = conn.qp;
    // The sleeps so far (the handshake's), once the counters were published after it.
    std::thread::sleep(Duration::from_millis(120));
    let before = engine.counters().driver.waits;
    for i in 0..ROUNDS {
        std::thread::sleep(PAUSE);
        let off = i as usize * LEN;
        src.write(off, &[i as u8 + 1; LEN]);
        let posted = Instant::now();
        qp.post_send(SendWr {
            wr_id: i,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: src.sge(off, LEN as u32).into(),
            signaled: true,
            fence: false,
        })
        .map_err(|e| format!("post: {e}"))?;
        let c = cq.wait(WOKEN_WITHIN).ok_or_else(|| {
            format!(
                "Send {i} posted to a sleeping engine did not complete within {WOKEN_WITHIN:?} \
                 (the engine may sleep 30 s): the wake-up was lost; {:?}",
                qp.status()
            )
        })?;
        if c.wc.status != WcStatus::Success || c.wc.wr_id != i {
            return Err(format!("unexpected completion {c:?}"));
        }
        println!(
            "Send {i} after a {PAUSE:?} pause: completed in {:?}",
            posted.elapsed()
        );
    }
    qp.disconnect();
    engine.stop();
    let slept = engine.counters().driver.waits - before;
    println!("engine sleeps in ppoll since the connection: {slept}");
    if slept < ROUNDS {
        return Err(format!(
            "the engine slept {slept} times, fewer than the {ROUNDS} pauses: the test did not \
             test the wake-up"
        ));
    }
    Ok(())
}

#[test]
fn a_post_wakes_a_sleeping_engine() {
    let _bed = bed_or_skip!();
    bed::against(server, client, SETUP);
}
