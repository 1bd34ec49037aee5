//! Waking and driving the engine from the application: the engine thread's sleep states
//! ([`AWAKE`], [`SLEEPING`], [`PARKED`]), when the application's polls push a parked thread's
//! watchdog ([`push_due`]), and [`Wake`], the application's side of an engine (wake-up socket,
//! sleep state, inline turns).
//!
//! The state an application thread drives inline is defined here too: [`Wake`] holds the
//! [`Core`], a [`Turner`] behind a mutex, whose [`State`] holds the [`Wake`] again (for the queue
//! pairs it hands out), so the four types form one cycle and live in one module. Their methods
//! live with their concerns: [`Turner`]'s in `thread`, [`State`]'s in `glue`.

use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixDatagram;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant as StdInstant};

use crossbeam_channel::{Receiver, Sender};
use iwarp_conn::HeldCrc;
use rdmap::MemoryTable;

#[cfg(doc)]
use crate::engine::EngineCounters;
use crate::engine::{ConnCounters, ReassemblyBudget};
use crate::memory::{RegionMemory, SharedTable, TableVersion};
use crate::verbs::cm::{ConnectParams, ListenRecord};
#[cfg(doc)]
use crate::verbs::cq::CompletionQueue;
use crate::verbs::cq::EngineDriver;
use crate::verbs::qp::QpWaker;
use crate::xdp_tcp::{ConnId, XdpTcp};

use super::commands::RequestMsg;
use super::config::XdpEngineConfig;
use super::slots::SlotMap;
use super::watchdog::Watchdog;

/// The engine thread runs its own turns (busy-polling or asleep in `ppoll`).
pub(super) const AWAKE: u8 = 0;
/// The engine thread sleeps in `ppoll` (after `busy_poll` without work), holding its state.
pub(super) const SLEEPING: u8 = 1;
/// The engine thread is parked because application threads drive its turns (inline progress):
/// it sleeps on the wake-up socket and its [`Watchdog`] only, its state free for whoever polls.
pub(super) const PARKED: u8 = 2;

/// The least [`XdpEngineConfig::park_max`] an engine uses (a smaller one is raised to it): below
/// it, pushes of the watchdog would cost a system call in nearly every poll.
pub(super) const MIN_PARK_MAX: Duration = Duration::from_millis(1);

/// How long the application may go without polling before a parked engine thread that wakes
/// (its watchdog expired, or to publish its counters) takes its turns back: it has stopped (it
/// computes, or sleeps without [`CompletionQueue::wait`]), and what arrives or falls due
/// meanwhile is the engine thread's again. A quarter of `park_max`: when the watchdog expires,
/// the last poll is always at least that old (a poll that worked pushes it once three
/// quarters have passed), so an expiry resumes the thread unless a poll raced it.
pub(super) fn app_stale(park_max: Duration) -> Duration {
    park_max / 4
}

/// Whether an application poll at `at` (nanoseconds on the driver's clock) that did (`work`) or
/// did not do work pushes the parked engine thread's watchdog, last pushed at `pushed`: a poll
/// that found nothing to do once half of `park_max` has passed (its system call then delays
/// nothing the application waits for), any poll once three quarters have (an application
/// that never polls idle). So a steadily polling application keeps the watchdog from expiring,
/// with at most one push per half of `park_max`.
pub(super) fn push_due(at: u64, pushed: u64, work: bool, park_max: Duration) -> bool {
    let max = u64::try_from(park_max.as_nanos()).unwrap_or(u64::MAX);
    let since = at.saturating_sub(pushed);
    since >= max / 4 * 3 || (!work && since >= max / 2)
}

/// The application's side of the engine: the wake-up socket, the engine thread's sleep state,
/// and (inline progress) the engine's state itself, which an application thread may drive.
///
/// The wake-up socket: application handles write a byte, the engine's `ppoll` sees it, but only
/// while the engine says it sleeps or is parked: a busy-polling engine finds the work request on
/// its next turn, so posting costs no system call.
pub(super) struct Wake {
    pub(super) tx: UnixDatagram,
    /// [`AWAKE`], [`SLEEPING`] or [`PARKED`]. Set by the engine before its last look at the
    /// command queues ahead of a sleep, back to [`AWAKE`] when it wakes. Both sides order "publish
    /// my part, then read the other's" with SeqCst, so either the engine sees the command or the
    /// poster sees the state and writes the byte.
    pub(super) state: AtomicU8,
    /// Set by a poster that queued a work request but could not run a turn itself; swapped back
    /// by every turn before it reads the queues (the parked engine's last look reads it).
    pub(super) pending: AtomicBool,
    /// Inline progress enabled ([`XdpEngineConfig::inline_progress`]).
    pub(super) inline: bool,
    /// The engine's state, set once its thread has opened the driver; emptied when it stops.
    pub(super) core: OnceLock<Arc<Core>>,
    /// Turns run by application threads (polls and posting turns).
    pub(super) app_turns: AtomicU64,
    /// Of those, the full turns of threads polling a completion queue: while they come, the
    /// engine thread stays parked (posting turns alone do not keep it: they run no timers
    /// and serve one connection).
    pub(super) app_polls: AtomicU64,
    /// When the last of those read the clock (`XdpTcp::polled_at`, nanoseconds on the
    /// driver's clock): a parked engine thread that wakes and finds it older than
    /// [`app_stale`] takes its turns back.
    pub(super) app_polled_at: AtomicU64,
    /// The parked engine thread's watchdog: expires [`XdpEngineConfig::park_max`] after its
    /// last push (by the engine thread as it parks, then by the application's polls). `None`
    /// without inline progress (the engine thread never parks).
    pub(super) watchdog: Option<Watchdog>,
    /// When (driver clock, nanoseconds) the watchdog was last pushed ([`push_due`]).
    pub(super) watchdog_pushed: AtomicU64,
    /// [`XdpEngineConfig::park_max`], at least [`MIN_PARK_MAX`].
    pub(super) park_max: Duration,
    /// Turns run by the engine thread.
    pub(super) thread_turns: AtomicU64,
    /// Times the parked engine thread woke ([`EngineCounters::parked_wakes`]).
    pub(super) parked_wakes: AtomicU64,
    /// Of those, the wakes by the watchdog ([`EngineCounters::watchdog_wakes`]).
    pub(super) watchdog_wakes: AtomicU64,
    /// Completion queues of this engine armed for an event (`CompletionQueue::req_notify`):
    /// while any is, its application is about to sleep on the channel, not poll, and the
    /// engine thread does not park.
    pub(super) armed_cqs: AtomicUsize,
    /// Blocking waits of the application ([`CompletionQueue::wait`]): the engine thread does not
    /// park while the application blocks instead of polling.
    pub(super) app_waits: AtomicU64,
    /// Work requests posted (counted before the poster wakes or drives anything): a turn
    /// that finds it unchanged since the last one knows no request waits
    /// (`TcpApp::has_new_work`).
    pub(super) posted: AtomicU64,
    /// A test asked the next turn on an application thread to panic
    /// ([`XdpEngine::inject_inline_panic`](super::XdpEngine::inject_inline_panic)).
    pub(super) panic_inline: AtomicBool,
}

impl Wake {
    /// An awake engine's wake-up state, writing its wake-up bytes to `tx`: with inline
    /// progress (`inline`) the parked thread's watchdog, expiring `park_max` (at least
    /// [`MIN_PARK_MAX`]) after its last push.
    pub(super) fn new(tx: UnixDatagram, inline: bool, park_max: Duration) -> io::Result<Self> {
        Ok(Wake {
            tx,
            state: AtomicU8::new(AWAKE),
            pending: AtomicBool::new(false),
            inline,
            core: OnceLock::new(),
            app_turns: AtomicU64::new(0),
            app_polls: AtomicU64::new(0),
            app_polled_at: AtomicU64::new(0),
            // Only a parked engine thread sleeps on it: none without inline progress.
            watchdog: if inline { Some(Watchdog::new()?) } else { None },
            watchdog_pushed: AtomicU64::new(0),
            park_max: park_max.max(MIN_PARK_MAX),
            thread_turns: AtomicU64::new(0),
            parked_wakes: AtomicU64::new(0),
            watchdog_wakes: AtomicU64::new(0),
            armed_cqs: AtomicUsize::new(0),
            app_waits: AtomicU64::new(0),
            posted: AtomicU64::new(0),
            panic_inline: AtomicBool::new(false),
        })
    }

    /// Called after a queue-pair work request was queued for connection `id`. With the engine
    /// thread parked (the application drives), runs a turn here, which takes the request and
    /// transmits at once: a posting turn for that connection alone, or a full one where
    /// [`Turner::turn_posted`] says so. Otherwise (or if another thread is in a turn) wakes
    /// the engine if it sleeps or is parked.
    fn wake_posted(&self, id: ConnId) -> io::Result<()> {
        self.posted.fetch_add(1, Ordering::SeqCst);
        if self.state.load(Ordering::SeqCst) == PARKED && self.drive_with(|t| t.turn_posted(id)) {
            return Ok(());
        }
        self.pending.store(true, Ordering::SeqCst);
        self.wake_engine()
    }

    /// Called after an engine command was queued: wakes the engine if it sleeps or is parked
    /// (application turns do not take engine commands).
    pub(super) fn wake_engine(&self) -> io::Result<()> {
        fence(Ordering::SeqCst);
        if self.state.load(Ordering::SeqCst) == AWAKE {
            return Ok(());
        }
        self.wake_now()
    }

    pub(super) fn wake_now(&self) -> io::Result<()> {
        match self.tx.send(&[1]) {
            Ok(_) => Ok(()),
            // The socket is full: the engine has wake-ups pending already.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Inline progress: runs one engine turn on the calling (application) thread if nobody else
    /// is in one. Never blocks: the engine's state is taken with `try_lock` (one compare-and-swap
    /// per turn, as the engine thread takes it; nobody ever waits on that mutex, so releasing it
    /// is no system call either). True if a turn ran.
    fn drive(&self) -> bool {
        let mut polled = None;
        let ran = self.drive_with(|t| {
            let work = t.turn_inline();
            let at = t.xdp.polled_at().as_nanos();
            self.app_polled_at.store(at, Ordering::Relaxed);
            polled = Some((at, work));
            work
        });
        if let Some((at, work)) = polled {
            self.push_watchdog(at, work);
        }
        if ran {
            self.app_polls.fetch_add(1, Ordering::Relaxed);
        }
        ran
    }

    /// Pushes the parked engine thread's watchdog forward after a poll at `at` (see
    /// [`push_due`]); nothing while the engine thread is not parked. The state is read
    /// relaxed: a push missed because the thread has just parked leaves the watchdog to
    /// expire, and the thread, finding the application still polling, arms it again; a push
    /// after it has just resumed costs one timer interrupt.
    fn push_watchdog(&self, at: u64, work: bool) {
        if self.state.load(Ordering::Relaxed) != PARKED
            || !push_due(
                at,
                self.watchdog_pushed.load(Ordering::Relaxed),
                work,
                self.park_max,
            )
        {
            return;
        }
        self.watchdog_pushed.store(at, Ordering::Relaxed);
        // If this fails, the watchdog expires and the engine thread, finding the application
        // still polling, pushes it itself.
        if let Some(w) = &self.watchdog {
            let _ = w.arm(self.park_max);
        }
    }

    /// [`drive`](Self::drive) with the turn `turn`.
    fn drive_with(&self, turn: impl FnOnce(&mut Turner) -> bool) -> bool {
        if !self.inline {
            return false;
        }
        let Some(core) = self.core.get() else {
            return false;
        };
        let Ok(mut guard) = core.try_lock() else {
            return false;
        };
        let Some(turner) = guard.as_mut() else {
            return false;
        };
        if turner.failed.is_some() {
            // A turn failed: the engine thread ends the engine, nobody turns again.
            return false;
        }
        // A panic in the turn (a bug) fails the engine as one on the engine thread does,
        // rather than unwinding into the application's poll or post: the engine thread, woken,
        // finds `failed` and ends every connection.
        let _in_turn = crate::turn::TransportTurn::enter();
        let turned = std::panic::catch_unwind(AssertUnwindSafe(|| {
            // A load first: a swap, an atomic write, on every turn would pull the line
            // (shared with the engine thread's state) away from it.
            if self.panic_inline.load(Ordering::Relaxed)
                && self.panic_inline.swap(false, Ordering::Relaxed)
            {
                panic!("engine panic injected by a test");
            }
            turn(turner)
        }));
        if let Err(cause) = turned {
            turner.failed = Some(format!(
                "an engine turn panicked on an application thread: {}",
                crate::error::panic_text(&*cause)
            ));
            drop(guard);
            let _ = self.wake_now();
            return false;
        }
        if turner.failed.is_some() {
            // The turn failed (a fatal driver error): the engine thread ends the engine, and a
            // parked one learns it now, not at its watchdog's expiry or the next post.
            drop(guard);
            let _ = self.wake_now();
        }
        self.app_turns.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Called before the application blocks waiting for a completion: a parked engine thread
    /// must poll again, nobody else drives.
    fn before_wait(&self) {
        if !self.inline {
            return;
        }
        self.app_waits.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.state.load(Ordering::SeqCst) == PARKED {
            let _ = self.wake_now();
        }
    }
}

impl EngineDriver for Wake {
    fn armed(&self, on: bool) {
        if on {
            self.armed_cqs.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.inline && self.state.load(Ordering::SeqCst) == PARKED {
                let _ = self.wake_now();
            }
        } else {
            let _ = self
                .armed_cqs
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
    }

    fn drive(&self) -> bool {
        Wake::drive(self)
    }
    fn before_wait(&self) {
        Wake::before_wait(self)
    }
}

/// The engine's state behind its mutex: the engine thread and, with inline progress,
/// application threads take it with `try_lock` only, once per turn (never per packet), so no
/// thread ever waits on it. `None` once the engine thread has stopped.
pub(super) type Core = Mutex<Option<Turner>>;

/// A PD table's version as the turns read it (`None` until first read).
pub(super) type TableView = Option<TableVersion>;

/// Everything one engine turn needs: connections, PD tables, the driver.
pub(super) struct Turner {
    pub(super) st: State,
    /// The registration tables of the PDs the engine's connections use (`State::table_users`);
    /// in the place of one no connection uses, `idle_table`.
    pub(super) tables: Vec<SharedTable>,
    /// An empty table of no PD, holding the place of a table let go.
    pub(super) idle_table: SharedTable,
    /// The version of each table the turns read (`None` until first read), kept across turns:
    /// a turn only compares version numbers (one load each) and reads a table again when it
    /// changed.
    pub(super) views: Vec<TableView>,
    pub(super) xdp: XdpTcp,
    /// The driver error of a turn, for the engine thread to stop on.
    pub(super) failed: Option<String>,
    /// Connects whose next hop is being resolved.
    pub(super) resolutions: super::commands::Resolutions,
}

/// A listening port of a shard: the parameters of its connections, where their Requests go,
/// and what it turned away.
pub(super) struct ListenPort {
    pub(super) params: ConnectParams,
    pub(super) requests: Sender<RequestMsg>,
    pub(super) record: Arc<ListenRecord>,
}

/// A queue pair's way to wake its engine: names the connection for the engine's next service
/// (`TcpApp::attention`; once, until the engine has taken it), then wakes the shard's
/// [`Wake`]. With many connections a turn services only those named (see `xdp_tcp`).
pub(super) struct SlotWaker {
    wake: Arc<Wake>,
    id: ConnId,
    /// Shared with the connection's slot, which clears it when the engine takes the name.
    queued: Arc<AtomicBool>,
    attention: Sender<ConnId>,
    /// Whether the shard has so many connections that turns service only those named; with
    /// few, naming costs the posting thread for nothing (every turn services them all).
    many: Arc<AtomicBool>,
}

impl SlotWaker {
    /// A waker for connection `id`, naming it through `queued` (the slot keeps the other
    /// reference and clears it before the engine reads the connection's requests, so the next
    /// request names the connection again).
    pub(super) fn new(
        wake: Arc<Wake>,
        id: ConnId,
        queued: Arc<AtomicBool>,
        attention: Sender<ConnId>,
        many: Arc<AtomicBool>,
    ) -> SlotWaker {
        SlotWaker {
            wake,
            id,
            queued,
            attention,
            many,
        }
    }
}

impl QpWaker for SlotWaker {
    fn wake(&self) -> io::Result<()> {
        if self.many.load(Ordering::Relaxed)
            && !self.queued.swap(true, Ordering::SeqCst)
            && self.attention.try_send(self.id).is_err()
        {
            // Bounded at the table's size, and each connection is in it at most once; but a
            // connection that ended may still be named in it (its application's handle woke
            // it after the end) while its slot serves another. Not named now, so the next
            // post names it again: left set, the flag kept the connection from ever being
            // named (its requests waited for the full sweep every 20 ms).
            self.queued.store(false, Ordering::SeqCst);
        }
        self.wake.wake_posted(self.id)
    }
}

/// The engine thread's connection state (what the driver's callbacks reach).
pub(super) struct State {
    pub(super) slots: SlotMap,
    /// Data passed up for a passive connection before the driver handed it over (the ACK that
    /// completes the handshake may carry the MPA Request); replayed in `on_accept`.
    pub(super) early: HashMap<ConnId, Vec<(u32, u64, Vec<u8>)>>,
    pub(super) listeners: HashMap<u16, ListenPort>,
    /// Passive connections of the shard whose Request is not queued for the application (none
    /// yet, or one refused) and whose TCP connection has not as good as ended, whatever their
    /// listener: at most a quarter of the shard's table (`XdpTcpConfig::max_connections`);
    /// one beyond is reset as TCP hands it over (`ListenStats::over_starting`), so that peers
    /// that complete handshakes and then send nothing, or a bad Request, and never take our
    /// FIN, cannot take the whole table.
    pub(super) unclaimed: usize,
    /// An empty table for connections whose PD is not known yet (MPA startup places nothing).
    pub(super) scratch: MemoryTable<RegionMemory>,
    pub(super) ended: ConnCounters,
    pub(super) established: u64,
    pub(super) ended_conns: u64,
    pub(super) epoch: StdInstant,
    pub(super) progress: bool,
    pub(super) wake: Arc<Wake>,
    /// This shard's index in the engine.
    pub(super) shard: usize,
    pub(super) cfg: XdpEngineConfig,
    /// The engine's [`XdpEngineConfig::reassembly_budget`], shared by its shards.
    pub(super) budget: ReassemblyBudget,
    /// Connections whose queue pairs posted requests ([`SlotWaker`]).
    pub(super) attention_tx: Sender<ConnId>,
    pub(super) attention_rx: Receiver<ConnId>,
    /// Connections the engine thread itself gave work (accept, reject).
    pub(super) attention_local: Vec<ConnId>,
    /// [`Wake::posted`] as the last turn read it.
    pub(super) seen_posts: u64,
    /// More connections than a turn services all at once ([`SlotWaker`]).
    pub(super) many: Arc<AtomicBool>,
    /// The FPDU CRC that `TcpApp::payload_sum` (or `payload_digested`) found in the segment
    /// being received, for its `on_data`.
    pub(super) rx_crc: Option<HeldCrc>,
    /// Room for a segment's payload built whole where its connection cannot write it into
    /// the packet's frames in one pass (`IwarpConn::fill_split`: Markers, IFT, the MPA
    /// startup), as long as the engine's MTU.
    pub(super) tx_joined: Vec<u8>,
    /// How many connections (slots) use each of the [`Turner`]'s PD tables: one no connection
    /// uses is let go at the next turn and its place taken by the next new PD
    /// (`Turner::table_index`), so the tables a turn looks at are those of the PDs in use,
    /// not of every PD the engine ever served.
    pub(super) table_users: Vec<u32>,
    /// A table's last user went since the last turn.
    pub(super) tables_unused: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_push_the_watchdog_idle_after_half_busy_after_three_quarters() {
        let max = Duration::from_millis(4);
        let ms = 1_000_000u64;
        let pushed = 10 * ms;
        // Idle polls: not before half of park_max.
        assert!(!push_due(pushed + 2 * ms - 1, pushed, false, max));
        assert!(push_due(pushed + 2 * ms, pushed, false, max));
        // Polls that worked: not before three quarters of it.
        assert!(!push_due(pushed + 3 * ms - 1, pushed, true, max));
        assert!(push_due(pushed + 3 * ms, pushed, true, max));
        // A poll's clock reading older than the last push (another thread pushed since).
        assert!(!push_due(pushed - ms, pushed, false, max));
    }
}
