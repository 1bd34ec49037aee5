//! The engine thread: [`Engine::run`] (engine commands, driver turns, then spinning, yielding,
//! sleeping in `ppoll` or parking while application threads drive), [`Turner`]'s turn and its
//! setup commands (listen, connect, accept, reject), and pinning to a CPU.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant as StdInstant};

use crossbeam_channel::{Receiver, TryRecvError};
use rdmap::QpState;

use crate::engine::IwarpConn;
use crate::memory::ProtectionDomain;
use crate::verbs::cm::ConnectParams;
use crate::verbs::qp::{post_initial_recvs, QpStart};
use crate::xdp_tcp::{ConnId, XdpTcp, XdpTcpError};
use crate::{DatapathError, QpError};

use super::commands::{Awaiting, ConnectCmd, EngineCmd};
use super::config::{add_counters, EngineCounters, XdpEngineConfig};
use super::glue::{tx_mode, App};
use super::slots::{Slot, Waiter};
use super::wake::{app_stale, Core, ListenPort, Turner, Wake, AWAKE, PARKED, SLEEPING};

/// How often the engine publishes its counters.
const COUNTERS_EVERY: Duration = Duration::from_millis(50);
/// How long a stopping engine lets its connections close gracefully (it stops sooner once
/// each of every shard's has done its closing exchange: [`closing_done`], [`ShardsShared`]).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// What all of an engine's threads (its shards) share.
#[derive(Clone)]
pub(super) struct ShardsShared {
    /// Told when one of them fails.
    pub(super) failure: Arc<super::failure::FailureNotice>,
    /// While the engine stops: the shards whose connections have not all done their closing
    /// exchange. Every shard goes on until none is left (or its grace has passed): a shard
    /// that ended sooner would leave its queue's frames to the kernel, whose resets would cut
    /// the closes of connections another shard owns (frames do arrive on other queues than
    /// their owner's, `xdp_tcp::shard`).
    closing: Arc<AtomicUsize>,
}

impl ShardsShared {
    pub(super) fn new(shards: usize, failure: Arc<super::failure::FailureNotice>) -> Self {
        ShardsShared {
            failure,
            closing: Arc::new(AtomicUsize::new(shards)),
        }
    }
}
/// Longest sleep of an engine thread without connections (counters are published as often).
const IDLE_WAIT: Duration = COUNTERS_EVERY;

/// Whether every connection of a stopping engine has done its closing exchange (RFC 9293
/// 3.6): its TCP connection in TIME-WAIT or closed, our data and FIN acknowledged and the
/// peer's FIN taken, so that the stop loses nothing of either side's. What TIME-WAIT would add
/// (acknowledging a FIN the peer sends again, its last ACK lost) the kernel answers with a
/// reset once the engine has gone, which ends the peer's LAST-ACK as well. Before, a stop
/// waited the whole [`SHUTDOWN_GRACE`] whenever one connection sat in TIME-WAIT: every tool
/// run whose engine closed first took a second longer to end.
fn closing_done(t: &Turner) -> bool {
    t.st.slots.keys().all(|id| {
        t.xdp.connection(id).is_none_or(|c| {
            matches!(
                c.state(),
                tcp_engine::State::TimeWait | tcp_engine::State::Closed
            )
        })
    })
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `set` is a zeroed, properly sized cpu_set_t owned by this frame; CPU_SET writes a
    // bit inside it (cpu < CPU_SETSIZE checked above); sched_setaffinity(0, ...) reads it for
    // the calling thread only.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Turner {
    /// One turn: received frames (placement), every connection's work requests, timers,
    /// transmission. True if there was work.
    pub(super) fn turn(&mut self) -> bool {
        self.turn_on(false)
    }

    /// [`turn`](Self::turn) on an application thread (inline progress): received frames are
    /// placed and their completions handed out before anything else, and the transmission
    /// they call for goes with the application's reply (`XdpTcp::poll_answering`).
    pub(super) fn turn_inline(&mut self) -> bool {
        self.turn_on(true)
    }

    /// A turn on the thread that just posted a work request to connection `id` (inline
    /// progress): that connection's requests are taken and what they queue is sent, nothing
    /// else (`XdpTcp::poll_posted`), unless a full turn is due (a request posted earlier
    /// waits, frames wait, a timer is due); the next turn runs in full.
    pub(super) fn turn_posted(&mut self, id: ConnId) -> bool {
        // A request posted without a turn of its own (its poster found the state taken) may
        // wait on another connection: a full turn takes every connection's requests before
        // this one's are sent, as they were posted.
        if self.st.wake.pending.load(Ordering::SeqCst) {
            return self.turn_on(true);
        }
        self.run_poll(|xdp, app| xdp.poll_posted(app, id))
    }

    fn turn_on(&mut self, inline: bool) -> bool {
        // Before reading the queues (see `Wake::pending`).
        if self.st.wake.pending.swap(false, Ordering::SeqCst) {
            self.xdp.unquiet();
        }
        self.run_poll(|xdp, app| {
            if inline {
                xdp.poll_answering(app)
            } else {
                xdp.poll(app)
            }
        })
    }

    /// Runs one driver poll (`poll`) over the engine's connections; true if there was work.
    fn run_poll(
        &mut self,
        poll: impl FnOnce(&mut XdpTcp, &mut App<'_>) -> Result<bool, XdpTcpError>,
    ) -> bool {
        // Each PD table's version number is compared once per turn (one load, no lock: a
        // registration never makes a turn wait, nor a turn a registration); a table is read
        // again only when it changed.
        for (view, table) in self.views.iter_mut().zip(&self.tables) {
            if view.as_ref().is_none_or(|v| table.changed_since(v)) {
                *view = Some(table.versioned());
            }
        }
        let mut app = App {
            st: &mut self.st,
            mem: &mut self.views,
            tables: &self.tables,
        };
        let work = poll(&mut self.xdp, &mut app).unwrap_or_else(|e| {
            self.failed.get_or_insert(e.to_string());
            false
        });
        self.let_go_unused_tables();
        if self.st.progress {
            // The application's requests were taken (perhaps not all of them: a turn takes at
            // most a budget per queue pair) or events handed out: the next poll runs in full.
            self.xdp.unquiet();
        }
        work | std::mem::take(&mut self.st.progress)
    }

    /// True if a queue-pair command waits.
    fn commands_pending(&self) -> bool {
        self.st
            .slots
            .values()
            .any(|s| s.cmds.as_ref().is_some_and(|c| !c.is_empty()))
    }
}

/// What the engine thread does after a turn, with its state released.
enum Next {
    Turn,
    Spin,
    Yield,
    Park,
    Stop,
}

/// The engine thread's loop state between turns.
struct Pace {
    /// Idle turns in a row.
    idle: u32,
    /// When the current idle stretch began.
    idle_since: Option<StdInstant>,
    last_publish: StdInstant,
    /// When the engine began to stop (its command channel closed).
    stopping: Option<StdInstant>,
    /// Application polls' turns ([`Wake::app_polls`]) and blocking waits as of the engine
    /// thread's last look.
    seen: (u64, u64),
    /// What stopped the engine thread.
    error: Option<String>,
    /// It stopped on a failure (a panic), not on request.
    failed: bool,
    /// While stopping: this shard's connections have all done their closing exchange (and it
    /// has taken itself off [`ShardsShared::closing`]).
    closes_done: bool,
    /// When the current stretch of idle turns began (only while the engine has connections).
    idle_began: Option<StdInstant>,
    /// Nanoseconds of idle stretches that have ended ([`EngineCounters::idle_ns`]).
    idle_ns: u64,
}

impl Pace {
    /// Inline progress: whether application threads polled (drove full turns) since the last
    /// look, none blocked in a wait since and no completion queue is armed for an event
    /// (they poll, so the engine thread may leave the work to them; posting turns alone do
    /// not count). An armed queue's application polls once after arming and then sleeps on
    /// the channel: a parked engine would leave what comes next to the watchdog.
    fn app_drove(&mut self, wake: &Wake) -> bool {
        let now = (
            wake.app_polls.load(Ordering::Relaxed),
            wake.app_waits.load(Ordering::SeqCst),
        );
        let driven = now.0 != self.seen.0
            && now.1 == self.seen.1
            && wake.armed_cqs.load(Ordering::SeqCst) == 0;
        self.seen = now;
        driven
    }
}

pub(super) struct Engine {
    pub(super) core: Arc<Core>,
    pub(super) wake: Arc<Wake>,
    pub(super) cmds: Receiver<EngineCmd>,
    pub(super) wake_rx: UnixDatagram,
    pub(super) counters: Arc<Mutex<EngineCounters>>,
    pub(super) cfg: XdpEngineConfig,
    pub(super) parks: u64,
    /// The CPU to pin the thread to.
    pub(super) pin: Option<usize>,
    /// Shards: the inboxes and this shard's index (a parked thread is woken by hand-offs).
    pub(super) inbox: Option<(Arc<crate::xdp_tcp::shard::ShardSet>, usize)>,
    /// The driver's clock zero (`XdpTcp::epoch`), for [`Wake::app_polled_at`].
    pub(super) epoch: StdInstant,
    /// Shared with the engine's other threads.
    pub(super) shared: ShardsShared,
}

impl Engine {
    pub(super) fn run(mut self) {
        // Every turn of this thread, and the end below (which finishes the queue pairs; the
        // fields of `self` drop after the mark, but none holds a queue pair).
        let _in_turn = crate::turn::TransportTurn::enter();
        if let Some(cpu) = self.pin {
            // Best effort: a CPU outside the allowed set leaves the thread unpinned.
            let _ = pin_to_cpu(cpu);
        }
        let mut p = Pace {
            idle: 0,
            idle_since: None,
            last_publish: StdInstant::now(),
            stopping: None,
            seen: (0, 0),
            error: None,
            failed: false,
            closes_done: false,
            idle_began: None,
            idle_ns: 0,
        };
        // A panic in a turn (a bug) ends the engine as a fatal error does: caught here, once
        // around the whole loop (nothing per turn), so that the connections are flushed and
        // XDP released below. The guard it poisons is read with `into_inner` there.
        let looped = std::panic::catch_unwind(AssertUnwindSafe(|| self.turns(&mut p)));
        if let Err(cause) = looped {
            p.error = Some(format!(
                "the engine thread panicked: {}",
                crate::error::panic_text(&*cause)
            ));
            p.failed = true;
        }
        // Take the state out (application turns find `None` from now on) and end it here, on
        // the engine thread (detaching XDP belongs to the thread that attached it).
        let taken = match self.core.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        let mut error = p.error;
        if let Some(mut t) = taken {
            let failed = p.failed || t.failed.is_some();
            if error.is_none() {
                error = t.failed.take();
            }
            match &error {
                Some(e) => tracing::error!(
                    error = %e,
                    connections = t.st.slots.len(),
                    "AF_XDP engine thread stopped on a failure"
                ),
                None => tracing::debug!(
                    connections = t.st.slots.len(),
                    "AF_XDP engine thread stopped"
                ),
            }
            // Every queue pair is flushed (its work requests complete with `WrFlushError`, its
            // waiters get an error) and its command channel closes (later posts complete
            // flushed at once, the queue pair having finished in Error); a
            // connection whose state a panic left unusable is only dropped.
            let cause = if failed {
                QpError::EngineFailed
            } else {
                QpError::EngineStopped
            };
            for (_, mut slot) in t.st.slots.drain() {
                let finished = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    slot.finish(cause.clone());
                }));
                if finished.is_err() {
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| slot.stop_posts()));
                    if !slot.closing || slot.closed_by_stop {
                        slot.shared.set_error(cause.clone(), None);
                    }
                    slot.shared.mark_finished(QpState::Error);
                }
                add_counters(&mut t.st.ended, &slot.conn.counters());
            }
            self.publish(&t, error, p.idle_ns);
            if failed {
                self.shared.failure.fail();
            }
        } else {
            let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
            c.error = error;
        }
    }

    /// The engine thread's loop: turns, spins, yields and parks until it stops.
    fn turns(&mut self, p: &mut Pace) {
        loop {
            let next = {
                let mut guard = match self.core.try_lock() {
                    Ok(g) => g,
                    // An application thread runs a turn: let it finish.
                    Err(TryLockError::WouldBlock) => {
                        std::thread::yield_now();
                        continue;
                    }
                    Err(TryLockError::Poisoned(_)) => {
                        p.error = Some("an engine turn panicked on an application thread".into());
                        p.failed = true;
                        break;
                    }
                };
                let Some(t) = guard.as_mut() else { break };
                self.step(t, p)
            };
            match next {
                Next::Turn => {}
                Next::Spin => std::hint::spin_loop(),
                Next::Yield => std::thread::yield_now(),
                Next::Park => {
                    self.park(p);
                    p.idle = 0;
                    p.idle_since = None;
                }
                Next::Stop => break,
            }
        }
    }

    /// One turn of the engine thread with its state locked, and what to do next.
    fn step(&self, t: &mut Turner, p: &mut Pace) -> Next {
        // A turn failed (a fatal driver error, or a panic on an application thread): the
        // engine ends as failed, before another turn or a set-up command (a listen answered
        // `Ok` by an engine that is failing) runs on what that one left.
        if let Some(e) = t.failed.take() {
            p.error = Some(e);
            p.failed = true;
            return Next::Stop;
        }
        let mut work = false;
        if p.stopping.is_none() {
            match t.commands(&self.cmds) {
                Ok(w) => {
                    if w {
                        // Setup commands change connections behind the driver's back.
                        t.xdp.unquiet();
                    }
                    work |= w;
                }
                Err(()) => {
                    p.stopping = Some(StdInstant::now());
                    for slot in t.st.slots.values_mut() {
                        // What ends a queue pair the application did not close: the stop
                        // (a connection closing already records nothing at its end).
                        slot.closed_by_stop = !slot.closing;
                        slot.closing = true;
                        slot.conn.close();
                    }
                    t.st.listeners.clear();
                    // The closes are sent by the connections' next service.
                    t.xdp.unquiet();
                }
            }
        }
        work |= t.turn();
        let turns = self.wake.thread_turns.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = t.failed.take() {
            p.error = Some(e);
            p.failed = true;
            return Next::Stop;
        }
        // The clock is read for this every 8th turn only (one `clock_gettime` less per turn);
        // a turn lasts at most the driver's `max_wait` (5 ms by default) when it sleeps, so
        // the counters are published at most 8 such turns late.
        if turns.is_multiple_of(8) && p.last_publish.elapsed() >= COUNTERS_EVERY {
            p.last_publish = StdInstant::now();
            self.publish(t, None, p.idle_ns);
        }
        if let Some(since) = p.stopping {
            if !p.closes_done && closing_done(t) {
                p.closes_done = true;
                self.shared.closing.fetch_sub(1, Ordering::AcqRel);
            }
            if self.shared.closing.load(Ordering::Acquire) == 0 || since.elapsed() >= SHUTDOWN_GRACE
            {
                return Next::Stop;
            }
        }
        if work {
            p.idle = 0;
            p.idle_since = None;
            if let Some(began) = p.idle_began.take() {
                let ns = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
                p.idle_ns = p.idle_ns.saturating_add(ns);
            }
            return Next::Turn;
        }
        if p.idle_began.is_none() && !t.st.slots.is_empty() {
            p.idle_began = Some(StdInstant::now());
        }
        // Inline progress: application threads drove turns since the last look and none blocked
        // in a wait: they poll, so leave the work to them.
        if self.cfg.inline_progress && p.stopping.is_none() && p.app_drove(&self.wake) {
            // The application's polls, maybe far slower than this thread's turns, must read
            // the clock at their own pace: it is what pushes the watchdog.
            t.xdp.read_clock_next_poll();
            return Next::Park;
        }
        p.idle = p.idle.saturating_add(1);
        if p.idle <= self.cfg.spin_turns {
            return Next::Spin;
        }
        let since = *p.idle_since.get_or_insert_with(StdInstant::now);
        if since.elapsed() < self.cfg.busy_poll {
            return Next::Yield;
        }
        // Sleep: announce it, then look at the command queues a last time (see `Wake`), and
        // at a wake-up that names no command (a queue pair's abort) but came while awake.
        self.wake.state.store(SLEEPING, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !self.cmds.is_empty() || t.commands_pending() || self.wake.pending.load(Ordering::SeqCst)
        {
            self.wake.state.store(AWAKE, Ordering::SeqCst);
            t.xdp.unquiet();
            return Next::Turn;
        }
        let app = App {
            st: &mut t.st,
            mem: &mut [],
            tables: &[],
        };
        // A stopping engine sleeps no longer than its remaining grace period.
        let max = match p.stopping {
            Some(since) => self
                .cfg
                .driver
                .max_wait
                .min(SHUTDOWN_GRACE.saturating_sub(since.elapsed())),
            // No connection at all (an idle shard): nothing but a frame, a hand-off or a
            // command (each of which ends the sleep) can give it work, so it sleeps longer
            // than a busy engine (fewer wake-ups stealing the core of the shard that works).
            None if app.st.slots.is_empty() && t.xdp.is_empty() => {
                self.cfg.driver.max_wait.max(IDLE_WAIT)
            }
            None => self.cfg.driver.max_wait,
        };
        let waited = t.xdp.wait(&app, max);
        self.wake.state.store(AWAKE, Ordering::SeqCst);
        self.drain_wake();
        if let Err(e) = waited {
            // A failure, not a stop: its queue pairs end with `EngineFailed`, and the device's
            // failure is told (`DeviceFatal`).
            p.error = Some(e.to_string());
            p.failed = true;
            return Next::Stop;
        }
        Next::Turn
    }

    /// Inline progress: sleeps on the wake-up socket and the watchdog, the state unlocked,
    /// while application threads keep driving turns (their polls keep pushing the watchdog
    /// forward: see `watchdog`); back to polling when they stop (the watchdog expires
    /// [`XdpEngineConfig::park_max`] after its last push and the last poll is more than
    /// [`app_stale`] old), block in a wait, or something writes the wake-up socket (an engine
    /// command, a work request whose poster could not run a turn). It also wakes every
    /// [`COUNTERS_EVERY`] to publish the counters, and looks then too.
    fn park(&mut self, p: &mut Pace) {
        self.parks += 1;
        // Arming also clears an expiry of an earlier park not yet read.
        self.arm_watchdog();
        loop {
            self.wake.state.store(PARKED, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            // The last look (see `Wake`): a work request nobody took, an engine command, a wait.
            if self.wake.pending.load(Ordering::SeqCst)
                || !self.cmds.is_empty()
                || self.wake.app_waits.load(Ordering::SeqCst) != p.seen.1
            {
                break;
            }
            let inbox = self.inbox.as_ref().and_then(|(set, i)| set.inboxes.get(*i));
            if inbox.is_some_and(|b| !b.sleep_begin()) {
                break;
            }
            let fds = [
                self.wake_rx.as_raw_fd(),
                inbox.map_or(-1, |b| b.wake_fd()),
                self.wake.watchdog.as_ref().map_or(-1, |w| w.fd()),
            ];
            let woken = wait_readable(fds, COUNTERS_EVERY);
            if let Some(b) = inbox {
                b.sleep_end();
            }
            self.wake.state.store(AWAKE, Ordering::SeqCst);
            self.wake.parked_wakes.fetch_add(1, Ordering::Relaxed);
            let woken = self.drain_wake() || woken.is_err();
            let expired = self.wake.watchdog.as_ref().is_some_and(|w| w.take_expiry());
            if expired {
                self.wake.watchdog_wakes.fetch_add(1, Ordering::Relaxed);
            }
            if p.last_publish.elapsed() >= COUNTERS_EVERY {
                if let Ok(g) = self.core.try_lock() {
                    if let Some(t) = g.as_ref() {
                        p.last_publish = StdInstant::now();
                        self.publish(t, None, p.idle_ns);
                    }
                }
            }
            if woken || !p.app_drove(&self.wake) || self.app_stopped() {
                break;
            }
            if expired {
                // The application paused without stopping (or could not push): watch again.
                self.arm_watchdog();
            }
        }
        self.wake.state.store(AWAKE, Ordering::SeqCst);
        // Pushes stop (the engine thread is no longer parked): no expiry to interrupt the core.
        if let Some(w) = &self.wake.watchdog {
            let _ = w.disarm();
        }
    }

    /// Sets the watchdog to expire [`XdpEngineConfig::park_max`] from now.
    fn arm_watchdog(&self) {
        self.wake
            .watchdog_pushed
            .store(self.clock_nanos(), Ordering::Relaxed);
        let Some(w) = &self.wake.watchdog else { return };
        if let Err(e) = w.arm(self.wake.park_max) {
            // The sleeps still end every `COUNTERS_EVERY`: progress waits that long at most.
            tracing::warn!(error = %e, "the parked engine thread's watchdog could not be set");
        }
    }

    /// Inline progress: the application has not polled for [`app_stale`] (it polled since
    /// the last look, perhaps only just after it).
    fn app_stopped(&self) -> bool {
        let polled = self.wake.app_polled_at.load(Ordering::Relaxed);
        // A poll's reading may come after this one (it raced this look): not stopped.
        Duration::from_nanos(self.clock_nanos().saturating_sub(polled))
            >= app_stale(self.wake.park_max)
    }

    /// Now on the driver's clock (`XdpTcp::epoch`), in nanoseconds: the clock of
    /// [`Wake::app_polled_at`] and [`Wake::watchdog_pushed`].
    fn clock_nanos(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Empties the wake-up socket; true if it held anything.
    fn drain_wake(&self) -> bool {
        let mut buf = [0u8; 64];
        let mut any = false;
        while self.wake_rx.recv(&mut buf).is_ok() {
            any = true;
        }
        any
    }

    fn publish(&self, t: &Turner, error: Option<String>, idle_ns: u64) {
        let mut conns = t.st.ended;
        for slot in t.st.slots.values() {
            add_counters(&mut conns, &slot.conn.counters());
        }
        let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        c.driver = t.xdp.stats();
        c.zero_copy = t.xdp.zero_copy();
        c.xdp_mode = Some(t.xdp.xdp_mode());
        c.conns = conns;
        c.established = t.st.established;
        c.ended = t.st.ended_conns;
        c.parks = self.parks;
        c.idle_ns = idle_ns;
        if error.is_some() {
            c.error = error;
        }
    }
}

/// Waits up to `timeout` for any of `fds` to become readable (a negative one is left out);
/// `Err` on a failed `ppoll`.
fn wait_readable(fds: [std::os::fd::RawFd; 3], timeout: Duration) -> io::Result<bool> {
    let mut pfds = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    Ok(crate::xdp_tcp::ppoll(&mut pfds, timeout)? > 0)
}

impl Turner {
    /// The index of `pd`'s table, adding it on first use (in the place of a table no
    /// connection uses, if there is one). A connection that keeps the index counts itself in
    /// `State::use_table`.
    fn table_index(&mut self, pd: &ProtectionDomain) -> usize {
        if let Some(i) = self.tables.iter().position(|t| Arc::ptr_eq(t, &pd.table)) {
            return i;
        }
        // A connect or accept that then fails leaves the new entry unused: the next turn lets
        // it go (one that succeeds counts itself first, in the same command).
        self.st.tables_unused = true;
        if let Some(i) = self.st.table_users.iter().position(|&users| users == 0) {
            self.tables[i] = pd.table.clone();
            self.views[i] = None;
            return i;
        }
        self.tables.push(pd.table.clone());
        self.views.push(None);
        self.st.table_users.push(0);
        self.tables.len() - 1
    }

    /// Lets go of the tables no connection uses any more (their regions' bytes with them).
    fn let_go_unused_tables(&mut self) {
        if !std::mem::take(&mut self.st.tables_unused) {
            return;
        }
        for (i, &users) in self.st.table_users.iter().enumerate() {
            if users == 0 {
                if let (Some(table), Some(view)) = (self.tables.get_mut(i), self.views.get_mut(i)) {
                    *table = self.idle_table.clone();
                    *view = None;
                }
            }
        }
    }

    /// Engine commands (and connects whose next hop was resolved meanwhile); `Err` on
    /// shutdown.
    fn commands(&mut self, cmds: &Receiver<EngineCmd>) -> Result<bool, ()> {
        let mut any = false;
        while !self.resolutions.waiting.is_empty() {
            let Ok((number, resolved)) = self.resolutions.rx.try_recv() else {
                break;
            };
            let Some(awaiting) = self.resolutions.waiting.remove(&number) else {
                continue;
            };
            any = true;
            let dst = match &awaiting {
                Awaiting::Connect(c) => *c.addr.ip(),
                Awaiting::Route { dst, .. } => *dst,
            };
            let mac = resolved
                .map_err(XdpTcpError::from)
                .and_then(|(route, mac)| self.xdp.check_route(dst, &route).map(|()| mac));
            match awaiting {
                Awaiting::Connect(c) => match mac {
                    Ok(mac) => self.connect_via(*c, mac),
                    Err(e) => {
                        c.reply.deliver(Err(e.into()));
                    }
                },
                Awaiting::Route { done, .. } => done.tell(mac.map(|_| ()).map_err(Into::into)),
            }
        }
        loop {
            let cmd = match cmds.try_recv() {
                Ok(c) => c,
                Err(TryRecvError::Empty) => return Ok(any),
                Err(TryRecvError::Disconnected) => return Err(()),
            };
            any = true;
            match cmd {
                EngineCmd::Shutdown => return Err(()),
                EngineCmd::Panic => panic!("engine panic injected by a test"),
                EngineCmd::Listen {
                    port,
                    params,
                    requests,
                    record,
                    reply,
                } => {
                    let mut tcp = self.st.cfg.tcp.clone();
                    tcp.tx_mode = tx_mode(&self.st.cfg);
                    tcp.rx_mode = tcp_engine::RxMode::PassUp;
                    params.apply_to(&mut tcp);
                    match self.xdp.listen(port, self.st.cfg.backlog, tcp) {
                        Ok(port) => {
                            let listen = ListenPort {
                                params,
                                requests,
                                record,
                            };
                            self.st.listeners.insert(port, listen);
                            if !reply.deliver(Ok(port)) {
                                // The caller gave up (its set-up timeout): nobody will unlisten.
                                self.st.listeners.remove(&port);
                                self.xdp.unlisten(port);
                            }
                        }
                        Err(e) => {
                            reply.deliver(Err(e.into()));
                        }
                    }
                }
                EngineCmd::Unlisten { port } => {
                    // Requests still arriving for the port are rejected (nobody listens).
                    self.st.listeners.remove(&port);
                    self.xdp.unlisten(port);
                }
                EngineCmd::Connect(c) => self.start_connect(*c),
                EngineCmd::RouteCheck { dst, reply } => {
                    let checked = crate::xsk::route_to(dst)
                        .map_err(XdpTcpError::from)
                        .and_then(|route| self.xdp.check_route(dst, &route));
                    let _ = reply.send(checked.map_err(Into::into));
                }
                EngineCmd::ResolveRoute { dst, done } => match self.xdp.known_next_hop(dst) {
                    Ok(Some(_)) => done.tell(Ok(())),
                    Ok(None) => {
                        let wait = self.xdp.neighbour_timeout();
                        self.resolve_then(Awaiting::Route { dst, done }, dst, wait);
                    }
                    Err(e) => done.tell(Err(e.into())),
                },
                EngineCmd::Accept {
                    id,
                    pd,
                    cq,
                    private_data,
                    start,
                    params,
                    reply,
                } => {
                    let table = self.table_index(&pd);
                    self.st.attention_local.push(id);
                    match self.accept(id, &pd, table, &private_data, start, &params) {
                        Ok(()) => {
                            if let Some(slot) = self.st.slots.get_mut(&id) {
                                slot.waiter = Waiter::Accept(reply, cq);
                            }
                        }
                        Err(e) => {
                            // The request is used up and nobody can answer it any more: close
                            // now (as the socket transport drops its stream) instead of leaving
                            // the peer waiting for the MPA timeout.
                            if let Some(slot) = self.st.slots.get_mut(&id) {
                                if !slot.conn.is_established() {
                                    slot.closing = true;
                                    slot.conn.close();
                                }
                            }
                            reply.deliver(Err(e));
                        }
                    }
                }
                EngineCmd::Reject {
                    id,
                    private_data,
                    reply,
                } => {
                    self.st.attention_local.push(id);
                    let res = match self.st.slots.get_mut(&id) {
                        Some(slot) => {
                            slot.closing = true;
                            slot.conn.reject(&private_data).map_err(conn_error)
                        }
                        None => Err(DatapathError::Disconnected),
                    };
                    let _ = reply.send(res);
                }
            }
        }
    }

    /// A connect: started now if the kernel knows the next hop's MAC address, else once a
    /// thread of its own has resolved it (in this thread's network namespace, where the
    /// engine's interface is), the engine's turns going on meanwhile: a neighbour that does
    /// not answer ARP stalls no other connection.
    fn start_connect(&mut self, c: ConnectCmd) {
        let dst = *c.addr.ip();
        match self.xdp.known_next_hop(dst) {
            Ok(Some(mac)) => self.connect_via(c, mac),
            Ok(None) => {
                let left = c.deadline.saturating_duration_since(StdInstant::now());
                if left.is_zero() {
                    c.reply.deliver(Err(DatapathError::Timeout("connecting")));
                    return;
                }
                let wait = self.xdp.neighbour_timeout().min(left);
                self.resolve_then(Awaiting::Connect(Box::new(c)), dst, wait);
            }
            Err(e) => {
                c.reply.deliver(Err(e.into()));
            }
        }
    }

    /// Resolves the next hop towards `dst` (waiting up to `wait`) on a thread of its own,
    /// which hands the outcome back through [`Turner::resolutions`], where `awaiting` waits
    /// for it, and wakes the engine.
    fn resolve_then(&mut self, awaiting: Awaiting, dst: Ipv4Addr, wait: Duration) {
        let done = self.resolutions.tx.clone();
        let wake = self.st.wake.clone();
        let number = self.resolutions.next;
        let spawned = std::thread::Builder::new()
            .name("iwxdp-neigh".into())
            .spawn(move || {
                let resolved = crate::xsk::resolve_next_hop(dst, wait);
                if done.send((number, resolved)).is_ok() {
                    // Always the wake-up byte (not `wake_engine`, which leaves out an engine
                    // thread that is awake): the thread's last look before it sleeps or parks
                    // is at its commands, not here, so an awake thread past its drain would
                    // park without it; the byte ends that park at once.
                    let _ = wake.wake_now();
                }
            });
        match spawned {
            Ok(_) => {
                self.resolutions.next += 1;
                self.resolutions.waiting.insert(number, awaiting);
            }
            Err(e) => match awaiting {
                Awaiting::Connect(c) => {
                    c.reply.deliver(Err(e.into()));
                }
                Awaiting::Route { done, .. } => done.tell(Err(e.into())),
            },
        }
    }

    /// Starts the connect `c` through the next hop `mac`, or answers it with why not.
    fn connect_via(&mut self, c: ConnectCmd, mac: [u8; 6]) {
        let ConnectCmd {
            addr,
            pd,
            cq,
            params,
            private_data,
            start,
            deadline,
            reply,
        } = c;
        let left = deadline.saturating_duration_since(StdInstant::now());
        if left.is_zero() {
            reply.deliver(Err(DatapathError::Timeout("connecting")));
            return;
        }
        let target = Target { addr, mac, left };
        match self.connect(target, &pd, &params, &private_data, start) {
            Ok(id) => {
                if let Some(slot) = self.st.slots.get_mut(&id) {
                    slot.waiter = Waiter::Connect(reply, cq);
                }
            }
            Err(e) => {
                reply.deliver(Err(e));
            }
        }
    }

    fn connect(
        &mut self,
        target: Target,
        pd: &ProtectionDomain,
        params: &ConnectParams,
        private_data: &[u8],
        start: QpStart,
    ) -> Result<ConnId, DatapathError> {
        let Target { addr, mac, left } = target;
        let table = self.table_index(pd);
        let mut cfg = self.st.conn_config(params, pd.id);
        // The setup deadline bounds TCP's handshake and the startup exchange together.
        cfg.mpa.timeout = cfg.mpa.timeout.min(left);
        if let Some(ift) = &mut cfg.ift {
            ift.timeout = ift.timeout.min(left);
        }
        let mut conn = IwarpConn::initiator(cfg, private_data, self.st.epoch, self.st.now())
            .map_err(conn_error)?;
        if let Some(srq) = &params.srq {
            srq.attach(conn.qp_mut(), pd.id)?;
        }
        let mem = pd.table.snapshot();
        post_initial_recvs(conn.qp_mut(), &mem, start.recvs)?;
        conn.qp_mut().join_stream(&mem);
        let mut tcp = self.st.cfg.tcp.clone();
        tcp.tx_mode = tx_mode(&self.st.cfg);
        tcp.rx_mode = tcp_engine::RxMode::PassUp;
        params.apply_to(&mut tcp);
        let local_port = params.local_addr.map_or(0, |a| a.port());
        let id = self.xdp.connect_via(local_port, addr, mac, tcp)?;
        let tuple = self
            .xdp
            .connection(id)
            .map(|c| c.four_tuple())
            .ok_or(DatapathError::Disconnected)?;
        let mut slot = Slot::new(conn, Some(table), tuple, start.num, params.close_timeout);
        slot.posters = start.posters;
        self.st.slots.insert(id, slot);
        self.st.use_table(table);
        Ok(id)
    }

    fn accept(
        &mut self,
        id: ConnId,
        pd: &ProtectionDomain,
        table: usize,
        private_data: &[u8],
        start: QpStart,
        params: &ConnectParams,
    ) -> Result<(), DatapathError> {
        let cfg = self.st.conn_config(params, pd.id);
        let slot = self
            .st
            .slots
            .get_mut(&id)
            .ok_or(DatapathError::Disconnected)?;
        if slot.conn.is_established() {
            return Err(DatapathError::InvalidArgument("already accepted"));
        }
        // Before Full Operation the queue pair is a fresh one with a placeholder PD: replace it
        // with one of the application's PD.
        *slot.conn.qp_mut() = rdmap::QueuePair::new(cfg.qp);
        if let Some(srq) = &params.srq {
            srq.attach(slot.conn.qp_mut(), pd.id)?;
        }
        let mem = pd.table.snapshot();
        post_initial_recvs(slot.conn.qp_mut(), &mem, start.recvs)?;
        slot.conn.qp_mut().join_stream(&mem);
        slot.num = start.num;
        slot.close_drain = params.close_timeout;
        slot.conn
            .set_accept_ird_ord(params.mpa.ird, params.mpa.ord)
            .map_err(conn_error)?;
        slot.conn.accept(private_data).map_err(conn_error)?;
        slot.table = Some(table);
        slot.posters = start.posters;
        self.st.use_table(table);
        Ok(())
    }
}

/// A connection's refusal of a local call, as the application sees it.
fn conn_error(e: crate::engine::ConnError) -> DatapathError {
    match e {
        crate::engine::ConnError::Mpa(m) => DatapathError::Mpa(m),
        crate::engine::ConnError::Ift(ift::IftError::Local(s))
        | crate::engine::ConnError::InvalidState(s) => DatapathError::InvalidArgument(s),
        crate::engine::ConnError::Ift(e) => DatapathError::Ift(e),
    }
}

/// Where a connect goes: the peer, the next hop's MAC address, and the time left before its
/// setup deadline.
struct Target {
    addr: SocketAddrV4,
    mac: [u8; 6],
    left: Duration,
}
