//! An application that waits on a completion channel (arm with `req_notify`, poll once, sleep
//! in `wait_event`, as verbs programs do with `ibv_req_notify_cq` and `ibv_get_cq_event`) is
//! woken as soon as its completion comes, with inline progress on (the default). The poll after
//! arming drives an engine turn; an engine thread that took that poll for an application that
//! polls would park, and what came next would wait for its watchdog (`park_max`): an armed
//! queue keeps it from parking. `EngineCounters::watchdog_wakes` counts the parked thread's
//! wakes by the watchdog: a few at most over the run, not one a round.
//!
//! Engine client in `iwa`, socket-transport echo server in `iwb`, which waits 3 ms before each
//! echo so that the client is asleep when it comes. Needs root; skips (fails under `CI=true`)
//! without the veth bed. About 0.5 s.

use std::time::Duration;

use datapath::engine::XdpEngineConfig;
use datapath::{Access, CompletionChannel, CompletionQueue, ProtectionDomain, WcOpcode, WcStatus};
use testbed::*;

mod common;
use common::bed;

const PORT: u16 = 19_537;
const ROUNDS: u64 = 40;
const LEN: usize = 64;
const SETUP: Duration = Duration::from_secs(30);
const ECHO_DELAY: Duration = Duration::from_millis(3);

fn server(ready: std::sync::mpsc::Sender<()>) -> Result<(), String> {
    let echoed = bed::echo_rounds(PORT, &ready, ROUNDS, LEN, SETUP, |_| {
        std::thread::sleep(ECHO_DELAY);
        Ok(())
    })?;
    let _ = echoed.qp.wait_finished(SETUP);
    echoed.qp.disconnect();
    Ok(())
}

/// Rounds of Send + echo, each completion waited for on the channel; returns the watchdog's
/// wakes of the parked engine thread over the rounds.
fn client() -> Result<u64, String> {
    let cfg = XdpEngineConfig {
        // One engine thread (see `xdp_engine_inline`: the kernel peer's segments may come on
        // another queue, whose shard would hand them over).
        shard_per_queue: false,
        ..XdpEngineConfig::default()
    };
    assert!(cfg.inline_progress, "inline progress is the default");
    let channel = CompletionChannel::new().map_err(|e| e.to_string())?;
    let cq = CompletionQueue::with_channel(&channel);
    let pd = ProtectionDomain::new();
    let buf = pd
        .register(LEN * 4, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let (mut engine, conn) = bed::engine_connect_in_a(cfg, PORT, &pd, &cq)?;
    let qp = conn.qp;
    let before = engine.counters().watchdog_wakes;
    for i in 0..ROUNDS {
        qp.post_recv(bed::slot_recv(&buf, i, LEN))
            .map_err(|e| format!("post_recv: {e}"))?;
        qp.post_send(bed::slot_send(&buf, i, LEN))
            .map_err(|e| format!("post_send: {e}"))?;
        let (mut sent, mut echoed) = (false, false);
        while !(sent && echoed) {
            cq.req_notify(false).map_err(|e| e.to_string())?;
            // The poll after arming: what came before the arming is taken here.
            while let Some(c) = cq.try_next() {
                if c.wc.status != WcStatus::Success {
                    return Err(format!("round {i}: {c:?}"));
                }
                match c.wc.opcode {
                    WcOpcode::Recv => echoed = true,
                    _ => sent = true,
                }
            }
            if !(sent && echoed) && channel.wait_event(SETUP).is_none() {
                return Err(format!("round {i}: no event: {:?}", qp.status()));
            }
        }
    }
    let wakes = engine.counters().watchdog_wakes - before;
    qp.disconnect();
    engine.stop();
    Ok(wakes)
}

#[test]
fn an_armed_completion_queue_keeps_the_engine_thread_from_parking() {
    let _bed = bed_or_skip!();
    let wakes = bed::against(server, client, SETUP);
    println!("watchdog wakes of the parked engine thread over {ROUNDS} rounds: {wakes}");
    assert!(
        wakes <= ROUNDS / 10,
        "{wakes} of {ROUNDS} rounds waited for the parked engine thread's watchdog"
    );
}

/// An application polling an idle connection steadily but not fast (a 250 us sleep between
/// polls, for a second): its polls keep the parked engine thread's watchdog from expiring.
/// Quiet polls read the clock every 16th poll only, and their reading is what pushes the
/// watchdog and says whether the application still polls: at this pace some 5 ms old, so the
/// watchdog expired (`park_max`, 4 ms) and the thread took its turns back, some 190 times a
/// second. Slow polls read the clock each time now.
#[test]
fn a_slow_steady_poller_keeps_the_engine_thread_parked() {
    const PORT: u16 = 19_609;
    const POLL_US: u64 = 250;
    let _bed = bed_or_skip!();
    let server = |ready: std::sync::mpsc::Sender<()>| -> Result<(), String> {
        let echoed = bed::echo_rounds(PORT, &ready, 0, LEN, SETUP, |_| Ok(()))?;
        let _ = echoed.qp.wait_finished(SETUP);
        echoed.qp.disconnect();
        Ok(())
    };
    let client = || -> Result<(u64, u64, u64), String> {
        let cfg = XdpEngineConfig {
            shard_per_queue: false,
            ..XdpEngineConfig::default()
        };
        let park_max = cfg.park_max;
        let cq = CompletionQueue::new();
        let pd = ProtectionDomain::new();
        let (mut engine, conn) = bed::engine_connect_in_a(cfg, PORT, &pd, &cq)?;
        let (before, polls) = (engine.counters().watchdog_wakes, 6_000u64);
        let start = std::time::Instant::now();
        let (mut n, mut last, mut gaps) = (0, start, 0);
        while start.elapsed() < Duration::from_secs(1) && n < polls {
            if let Some(c) = cq.try_next() {
                return Err(format!("a completion on an idle connection: {c:?}"));
            }
            // A gap between polls long enough for the watchdog to expire (this thread
            // preempted, or its sleep overshooting on a loaded machine) lets it expire
            // rightly.
            let now = std::time::Instant::now();
            gaps += u64::from(now - last > park_max / 2);
            last = now;
            std::thread::sleep(Duration::from_micros(POLL_US));
            n += 1;
        }
        let wakes = engine.counters().watchdog_wakes - before;
        conn.qp.disconnect();
        engine.stop();
        Ok((wakes, n, gaps))
    };
    let (wakes, polls, gaps) = bed::against(server, client, SETUP);
    println!(
        "watchdog wakes over {polls} polls with {POLL_US} us sleeps between: {wakes} \
         ({gaps} long gaps between polls)"
    );
    assert!(polls > 500, "only {polls} polls in a second");
    assert!(
        wakes <= gaps + 20,
        "{wakes} watchdog wakes over {polls} polls ({gaps} long gaps)"
    );
}
