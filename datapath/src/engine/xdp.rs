//! The poll-mode iWARP engine over AF_XDP: one thread per AF_XDP queue (a *shard*, with
//! [`XdpEngineConfig::shard_per_queue`], the default; otherwise one thread per interface) runs
//! the [`IwarpConn`]s it owns on top of its [`XdpTcp`] driver, behind the same application API
//! as the socket transport ([`Listener`], [`ConnectRequest`], [`Connection`], [`QueuePair`],
//! [`CompletionQueue`], [`ProtectionDomain`]).
//!
//! **Shards.** [`XdpTcp::open_shards`] attaches the steering program once and gives each
//! queue its own driver (one AF_XDP socket, receiving and transmitting on that queue, its own
//! TCP table); segments that arrive on a queue whose shard does not own their flow are handed
//! to the owner through a lock-free flow directory and a bounded inbox
//! ([`crate::xdp_tcp::shard`]). Every shard listens on a listened port and a connection
//! belongs to the shard its SYN arrived on; requests of all shards reach the one [`Listener`].
//! `connect` picks shards round robin. Each shard is an engine as described below (its own
//! thread, wake-up socket, inline-progress state), its thread pinned to
//! [`XdpEngineConfig::cpus`] if given; a shard without connections sleeps up to 50 ms between
//! looks. [`XdpEngine::counters`] sums the shards (and lists each shard's driver counters).
//! A [`CompletionQueue`] drives inline the shard it was first used with.
//!
//! **Thread.** [`XdpEngine::start`] spawns the engine thread, which opens the driver (in the
//! namespace of the calling thread) and loops: take engine commands (listen, connect, accept,
//! reject), run one driver turn ([`XdpTcp::poll`]: received segments go straight to
//! [`IwarpConn::on_data`], placement included; then every connection's queue-pair commands,
//! [`IwarpConn::poll`], events and completions). It busy-polls: an idle turn is followed by
//! `sched_yield` (after [`XdpEngineConfig::spin_turns`] pure spins), so an application thread
//! on the same core runs at once; only after [`XdpEngineConfig::busy_poll`] without work does
//! it sleep in `ppoll` on the AF_XDP sockets plus a wake-up socket. Optionally pinned to a CPU
//! ([`XdpEngineConfig::cpu`]).
//!
//! **Inline progress** ([`XdpEngineConfig::inline_progress`], default on). The state a turn
//! needs (`Turner`: connections, PD table list, driver) is behind one mutex that is only ever
//! taken with `try_lock`, once per turn, so no thread waits on it. A thread polling a
//! [`CompletionQueue`] of the engine runs a turn itself when the queue is empty and nobody else
//! is in one; while application threads keep doing so (and do not block in
//! [`CompletionQueue::wait`]) the engine thread parks on its wake-up socket, and a work request
//! posted meanwhile is transmitted by a turn on the posting thread. The poller then has its
//! core to itself: no hand-off to the engine thread per message in either direction.
//!
//! **Application side.** Work requests go from a [`QueuePair`] to the engine through a
//! per-connection lock-free channel (crossbeam); a one-byte datagram on the wake-up socket
//! follows only while the engine sleeps (an atomic flag says so), so posting to a polling
//! engine is no system call; completions come back on the [`CompletionQueue`] given at connect/accept time. Setup
//! calls (`listen`, `connect`, `accept`, `reject`) are commands answered on a one-shot channel,
//! with a deadline.
//!
//! **Memory.** The registration table of each protection domain stays shared with the
//! application behind its mutex (as in the socket transport): the engine locks the tables of
//! the PDs it serves once per driver turn, not per packet. Known limitation: a registration on
//! the application thread waits for at most one turn; a PD once used stays in the engine's list
//! until the engine stops.
//!
//! **Known limitations.** A listener's port stays steered and reserved until the engine stops
//! (the driver has no `unlisten`); `connect` resolves the next hop on the engine thread
//! (blocking it up to the driver's neighbour timeout); IPv4 only.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use mpa::RequestInfo;
use rdmap::WorkCompletion;
use rdmap::{MemoryTable, PdId, QpConfig, QpState, RecvWr, TerminateCause, WcOpcode};
use tcp_engine::{Instant, PassedUp, State as TcpState};

use crate::engine::{ConnConfig, ConnCounters, ConnEvent, IwarpConn};
use crate::memory::{ProtectionDomain, RegionMemory, SharedTable, TableSnapshot};
use crate::verbs::cm::{
    ConnectParams, ConnectRequest, Connection, ListenProvider, Listener, PendingProvider,
};
use crate::verbs::cq::{Completion, CompletionQueue, CqSink, EngineDriver};
use crate::verbs::qp::{
    local_status, wc_opcode, Cmd, QpParts, QpWaker, QueuePair, Shared, NEXT_QP,
};
use crate::xdp_tcp::{
    ConnId, Connection as TcpConnection, Event as TcpEvent, TcpApp, TcpConfig, XdpTcp,
    XdpTcpConfig, XdpTcpError, XdpTcpStats,
};
use crate::{DatapathError, QpError};

/// Queue-pair commands taken per connection per turn (so one busy poster cannot starve the
/// others or the receive side).
const CMD_BUDGET: usize = 256;
/// How often the engine publishes its counters.
const COUNTERS_EVERY: Duration = Duration::from_millis(50);
/// How long a stopping engine lets its connections close gracefully.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// How long `start` waits for the engine thread to open the driver.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The engine thread runs its own turns (busy-polling or asleep in `ppoll`).
const AWAKE: u8 = 0;
/// The engine thread sleeps in `ppoll` (after `busy_poll` without work), holding its state.
const SLEEPING: u8 = 1;
/// The engine thread is parked because application threads drive its turns (inline progress):
/// it sleeps on the wake-up socket only, its state free for whoever polls.
const PARKED: u8 = 2;
/// Longest sleep of an engine thread without connections (counters are published as often).
const IDLE_WAIT: Duration = COUNTERS_EVERY;
/// How long a parked engine thread first sleeps before it looks whether the application still
/// drives; each look that finds it still driving doubles the next sleep, up to
/// [`XdpEngineConfig::park_max`].
const PARK: Duration = Duration::from_micros(500);

/// The parked engine thread's next sleep after one of `slept` that found the application still
/// driving turns: twice as long, at most `max` (and never shorter than [`PARK`]).
fn next_park(slept: Duration, max: Duration) -> Duration {
    slept.saturating_mul(2).min(max.max(PARK))
}

/// The application's side of the engine: the wake-up socket, the engine thread's sleep state,
/// and (inline progress) the engine's state itself, which an application thread may drive.
///
/// The wake-up socket: application handles write a byte, the engine's `ppoll` sees it, but only
/// while the engine says it sleeps or is parked: a busy-polling engine finds the work request on
/// its next turn, so posting costs no system call.
pub(crate) struct Wake {
    tx: UnixDatagram,
    /// [`AWAKE`], [`SLEEPING`] or [`PARKED`]. Set by the engine before its last look at the
    /// command queues ahead of a sleep, back to [`AWAKE`] when it wakes. Both sides order "publish
    /// my part, then read the other's" with SeqCst, so either the engine sees the command or the
    /// poster sees the state and writes the byte.
    state: AtomicU8,
    /// Set by a poster that queued a work request but could not run a turn itself; swapped back
    /// by every turn before it reads the queues (the parked engine's last look reads it).
    pending: AtomicBool,
    /// Inline progress enabled ([`XdpEngineConfig::inline_progress`]).
    inline: bool,
    /// The engine's state, set once its thread has opened the driver; emptied when it stops.
    core: OnceLock<Arc<Core>>,
    /// Turns run by application threads.
    app_turns: AtomicU64,
    /// Turns run by the engine thread.
    thread_turns: AtomicU64,
    /// Blocking waits of the application ([`CompletionQueue::wait`]): the engine thread does not
    /// park while the application blocks instead of polling.
    app_waits: AtomicU64,
}

impl Wake {
    /// Called after a queue-pair work request was queued. With the engine thread parked (the
    /// application drives), runs a turn here, which takes the request and transmits at once;
    /// otherwise (or if another thread is in a turn) wakes the engine if it sleeps or is parked.
    pub(crate) fn wake(&self) -> io::Result<()> {
        if self.state.load(Ordering::SeqCst) == PARKED && self.drive() {
            return Ok(());
        }
        self.pending.store(true, Ordering::SeqCst);
        self.wake_engine()
    }

    /// Called after an engine command was queued: wakes the engine if it sleeps or is parked
    /// (application turns do not take engine commands).
    fn wake_engine(&self) -> io::Result<()> {
        fence(Ordering::SeqCst);
        if self.state.load(Ordering::SeqCst) == AWAKE {
            return Ok(());
        }
        self.wake_now()
    }

    fn wake_now(&self) -> io::Result<()> {
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
    pub(crate) fn drive(&self) -> bool {
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
        turner.turn();
        self.app_turns.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Called before the application blocks waiting for a completion: a parked engine thread
    /// must poll again, nobody else drives.
    pub(crate) fn before_wait(&self) {
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

impl QpWaker for Wake {
    fn wake(&self) -> io::Result<()> {
        Wake::wake(self)
    }
}

impl EngineDriver for Wake {
    fn drive(&self) -> bool {
        Wake::drive(self)
    }
    fn before_wait(&self) {
        Wake::before_wait(self)
    }
}

/// Settings of an [`XdpEngine`].
#[derive(Debug, Clone)]
pub struct XdpEngineConfig {
    /// The AF_XDP TCP driver (queues, attach mode, rings, idle spins, neighbour timeout).
    pub driver: XdpTcpConfig,
    /// TCP settings of every connection (record transmit / pass-up receive are forced; MTU
    /// and MSS are lowered to the interface's). The default leaves MTU and MSS at their
    /// maximum, so the interface's MTU (capped by the UMEM frame) decides them, as the
    /// kernel's TCP does (MSS = MTU - 40, RFC 9293 3.7.1); set them lower to cap them.
    pub tcp: TcpConfig,
    /// Per connection: octets of the reassembly store (also the receive window).
    pub reassembly_capacity: usize,
    /// Per connection: FPDUs placed out of order whose records can be kept at once.
    pub max_placed_fpdus: usize,
    /// Per connection: octets queued in TCP before no more FPDUs are framed.
    pub tx_ahead: usize,
    /// Per connection: FPDU descriptors in flight (queued, not yet acknowledged).
    pub max_tx_fpdus: usize,
    /// Frame FPDUs the old way, for comparison: payload copied out of the region into TCP's
    /// send buffer (`tcp_engine::TxMode::Records`), copied again into the frame, and Sends and
    /// Writes complete when handed to TCP. Default false: FPDUs are written from registered
    /// memory straight into the UMEM frames (`TxMode::Source`) and Sends and Writes complete
    /// when acknowledged (see `engine::conn`).
    pub tx_copy: bool,
    /// Listen backlog.
    pub backlog: usize,
    /// Idle turns in a row that spin before the engine starts yielding the CPU between turns
    /// (`sched_yield`, so threads sharing its core, the application's in particular, run at
    /// once). Default 0: yield after every idle turn, which costs a lone engine one system
    /// call per idle turn and saves an application sharing the core a whole spin phase per
    /// message (write-lat on the veth bed: 9 us one way instead of 20 us with 32 spins).
    pub spin_turns: u32,
    /// How long the engine keeps polling (spinning, then yielding) after its last work before
    /// it sleeps in `ppoll`, woken by a frame, a TCP deadline or a work request (only then does
    /// posting a work request cost the application a system call). Zero: sleep as soon as
    /// the spins are over.
    pub busy_poll: Duration,
    /// Pin the engine thread to this CPU (`sched_setaffinity`); `None`: the scheduler decides.
    /// With [`shard_per_queue`](Self::shard_per_queue) and no [`cpus`](Self::cpus), every
    /// shard's thread is pinned to it.
    pub cpu: Option<usize>,
    /// One engine thread per AF_XDP queue (a *shard*: its own socket, connection table and
    /// queue pairs; segments that arrive on another shard's queue are handed over, see
    /// [`crate::xdp_tcp::shard`]). False: one thread serves every queue. Default true.
    pub shard_per_queue: bool,
    /// With [`shard_per_queue`](Self::shard_per_queue): pin shard `i`'s thread to
    /// `cpus[i % cpus.len()]`; empty: [`cpu`](Self::cpu) decides.
    pub cpus: Vec<usize>,
    /// Inline progress (run-to-completion): an application thread that polls a
    /// [`CompletionQueue`] of this engine ([`CompletionQueue::try_next`],
    /// [`CompletionQueue::poll`]) runs an engine turn itself when nobody else is in one, and
    /// while it keeps doing so the engine thread parks (sleeps on its wake-up socket, looking
    /// again after 500 us, then after twice as long each time up to
    /// [`park_max`](Self::park_max)), so the poller is the only thread on its core and a
    /// received frame is placed and completed by the thread that waits for it; a work request
    /// posted meanwhile is transmitted by the posting thread. A blocking
    /// [`CompletionQueue::wait`] unparks the engine thread first. Default on.
    pub inline_progress: bool,
    /// Inline progress: the longest a parked engine thread sleeps before it looks whether the
    /// application still drives turns (its sleeps start at 500 us and double). Each look
    /// wakes the engine thread on a core a busy-polling application may be using, and delays
    /// what that application is waiting for by a few microseconds (at 500 us, a round trip in
    /// ~50 of a latency test's: its p99); it is also the most the connections' progress
    /// (received frames, timers) waits when the application stops polling without blocking in
    /// [`CompletionQueue::wait`]. Default 4 ms.
    pub park_max: Duration,
}

impl Default for XdpEngineConfig {
    fn default() -> Self {
        let conn = ConnConfig::default();
        Self {
            driver: XdpTcpConfig::default(),
            tcp: TcpConfig {
                ack_every_segments: 8,
                // Lowered to the interface's MTU (and the frame's) by the driver.
                path_mtu: u16::MAX,
                mss: u16::MAX - 40,
                ..TcpConfig::mpa()
            },
            reassembly_capacity: conn.reassembly_capacity,
            max_placed_fpdus: conn.max_placed_fpdus,
            tx_ahead: conn.tx_ahead,
            max_tx_fpdus: conn.max_tx_fpdus,
            tx_copy: false,
            backlog: 64,
            spin_turns: 0,
            busy_poll: Duration::from_millis(2),
            cpu: None,
            shard_per_queue: true,
            cpus: Vec::new(),
            inline_progress: true,
            park_max: Duration::from_millis(4),
        }
    }
}

/// Counters of an engine, published by its thread every 50 ms and when it stops.
#[derive(Debug, Clone, Default)]
pub struct EngineCounters {
    /// The driver's counters (frames, packets, the TCP table's counters).
    pub driver: XdpTcpStats,
    /// Sum over every connection the engine ran (live and ended); `held_peak` (with its
    /// `held_peak_gaps`), `held_run_peak` and `held_gap_peak` are the maxima.
    pub conns: ConnCounters,
    /// Connections that reached Full Operation.
    pub established: u64,
    /// Connections removed after TCP closed.
    pub ended: u64,
    /// The error that stopped the engine thread, if any.
    pub error: Option<String>,
    /// Engine turns run by application threads polling a completion queue or posting while the
    /// engine thread was parked ([`XdpEngineConfig::inline_progress`]); live.
    pub app_turns: u64,
    /// Engine turns run by the engine thread; live.
    pub thread_turns: u64,
    /// Times the engine thread parked because application threads drove its turns.
    pub parks: u64,
    /// Nanoseconds the engine thread spent between a turn that found no work and the next
    /// one that found some, while it had connections (spinning, yielding, sleeping or
    /// parked): the part of a run in which it waited for ACKs, work requests or the peer's
    /// data instead of working. Summed over shards.
    pub idle_ns: u64,
    /// Engine threads (shards) summed here: 1, or one per queue with
    /// [`XdpEngineConfig::shard_per_queue`].
    pub shards: usize,
    /// Per shard (only with more than one): its driver's counters (frames, hand-offs).
    pub shard_drivers: Vec<XdpTcpStats>,
}

impl EngineCounters {
    /// Adds one shard's counters to these.
    fn add(&mut self, o: &EngineCounters) {
        self.driver.add(&o.driver);
        add_counters(&mut self.conns, &o.conns);
        self.established += o.established;
        self.ended += o.ended;
        if self.error.is_none() {
            self.error.clone_from(&o.error);
        }
        self.app_turns += o.app_turns;
        self.thread_turns += o.thread_turns;
        self.parks += o.parks;
        self.idle_ns += o.idle_ns;
    }
}

fn add_counters(sum: &mut ConnCounters, c: &ConnCounters) {
    sum.segments += c.segments;
    sum.segments_out_of_order += c.segments_out_of_order;
    sum.fpdus_rx += c.fpdus_rx;
    sum.fpdus_tx += c.fpdus_tx;
    sum.bytes_placed_in_order += c.bytes_placed_in_order;
    sum.bytes_placed_out_of_order += c.bytes_placed_out_of_order;
    sum.fpdus_placed_out_of_order += c.fpdus_placed_out_of_order;
    sum.held_bytes += c.held_bytes;
    if c.held_peak > sum.held_peak {
        sum.held_peak = c.held_peak;
        sum.held_peak_gaps = c.held_peak_gaps;
    }
    sum.held_gap_peak = sum.held_gap_peak.max(c.held_gap_peak);
    sum.held_run_peak = sum.held_run_peak.max(c.held_run_peak);
    sum.held_total += c.held_total;
    sum.unlocated_segments += c.unlocated_segments;
    sum.crc_errors += c.crc_errors;
    sum.retransmissions += c.retransmissions;
    sum.rto_expirations += c.rto_expirations;
    sum.loss_probes += c.loss_probes;
    sum.fast_recoveries += c.fast_recoveries;
    sum.spurious_undone += c.spurious_undone;
    sum.paws_drops += c.paws_drops;
    for (s, c) in sum.send_limited_ns.iter_mut().zip(c.send_limited_ns) {
        *s += c;
    }
    sum.terminates_sent += c.terminates_sent;
    sum.terminates_received += c.terminates_received;
}

type Reply<T> = Sender<Result<T, DatapathError>>;

struct RequestMsg {
    id: ConnId,
    info: RequestInfo,
    peer: SocketAddr,
    /// The shard whose connection it is.
    shard: usize,
}

enum EngineCmd {
    Listen {
        port: u16,
        params: ConnectParams,
        requests: Sender<RequestMsg>,
        reply: Reply<()>,
    },
    Connect {
        addr: SocketAddrV4,
        pd: ProtectionDomain,
        cq: CqSink,
        params: ConnectParams,
        private_data: Vec<u8>,
        reply: Reply<(QpParts, Vec<u8>)>,
    },
    Accept {
        id: ConnId,
        pd: ProtectionDomain,
        cq: CqSink,
        private_data: Vec<u8>,
        recvs: Vec<RecvWr>,
        params: ConnectParams,
        reply: Reply<QpParts>,
    },
    Reject {
        id: ConnId,
        private_data: Vec<u8>,
        reply: Reply<()>,
    },
    Shutdown,
}

/// The application's way to the engine thread.
#[derive(Clone)]
struct Handle {
    cmds: Sender<EngineCmd>,
    wake: Arc<Wake>,
}

impl Handle {
    fn call<T>(
        &self,
        cmd: EngineCmd,
        rx: Receiver<Result<T, DatapathError>>,
        timeout: Duration,
        what: &'static str,
    ) -> Result<T, DatapathError> {
        self.send(cmd)?;
        Self::reply(rx, timeout, what)
    }

    /// Hands the engine a command.
    fn send(&self, cmd: EngineCmd) -> Result<(), DatapathError> {
        self.cmds
            .send(cmd)
            .map_err(|_| DatapathError::Disconnected)?;
        self.wake.wake_engine()?;
        Ok(())
    }

    /// Waits up to `timeout` for a command's reply.
    fn reply<T>(
        rx: Receiver<Result<T, DatapathError>>,
        timeout: Duration,
        what: &'static str,
    ) -> Result<T, DatapathError> {
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => Err(DatapathError::Timeout(what)),
            Err(RecvTimeoutError::Disconnected) => Err(DatapathError::Disconnected),
        }
    }
}

/// What waits for the outcome of a connection attempt ([`XdpEngine::start_connect`]).
pub(crate) type PendingConnect = Box<dyn FnOnce() -> Result<Connection, DatapathError> + Send>;

/// A listening port of the engine (behind [`Listener`]).
struct XdpListen {
    rx: Receiver<RequestMsg>,
    /// Every shard's handle (requests name their shard).
    handles: Vec<Handle>,
    local: SocketAddr,
}

impl ListenProvider for XdpListen {
    fn local_addr(&self) -> Result<SocketAddr, DatapathError> {
        Ok(self.local)
    }

    /// The next MPA Request (waiting forever with `None`); `Ok(None)` when `timeout` passed.
    fn accept(
        &self,
        params: &ConnectParams,
        timeout: Option<Duration>,
    ) -> Result<Option<ConnectRequest>, DatapathError> {
        let msg = match timeout {
            None => self.rx.recv().map_err(|_| DatapathError::Disconnected)?,
            Some(t) => match self.rx.recv_timeout(t) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => return Err(DatapathError::Disconnected),
            },
        };
        let handle = self
            .handles
            .get(msg.shard)
            .ok_or(DatapathError::Disconnected)?
            .clone();
        let pending = PendingRequest { id: msg.id, handle };
        Ok(Some(ConnectRequest::new(
            Box::new(pending),
            msg.info,
            msg.peer,
            params.clone(),
        )))
    }
}

/// A connection of the engine whose MPA Request waits for the application (behind
/// [`ConnectRequest`]). Dropped without an answer, the responder's MPA timeout ends it.
struct PendingRequest {
    id: ConnId,
    handle: Handle,
}

impl PendingProvider for PendingRequest {
    fn accept(
        self: Box<Self>,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        private_data: &[u8],
        recvs: Vec<RecvWr>,
        params: &ConnectParams,
    ) -> Result<QueuePair, DatapathError> {
        cq.attach(self.handle.wake.clone());
        let (tx, rx) = crossbeam_channel::bounded(1);
        let cmd = EngineCmd::Accept {
            id: self.id,
            pd: pd.clone(),
            cq: cq.sink(),
            private_data: private_data.to_vec(),
            recvs,
            params: params.clone(),
            reply: tx,
        };
        let parts = self
            .handle
            .call(cmd, rx, params.setup_timeout, "accepting the MPA Request")?;
        Ok(QueuePair::from_parts(parts))
    }

    fn reject(
        self: Box<Self>,
        private_data: &[u8],
        params: &ConnectParams,
    ) -> Result<(), DatapathError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let cmd = EngineCmd::Reject {
            id: self.id,
            private_data: private_data.to_vec(),
            reply: tx,
        };
        self.handle
            .call(cmd, rx, params.setup_timeout, "rejecting the MPA Request")
    }
}

/// One engine thread and its way in.
struct ShardThread {
    handle: Handle,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Mutex<EngineCounters>>,
}

/// The poll-mode iWARP engine of one interface (see the module documentation). Dropping it
/// closes its connections (gracefully for up to a second), detaches XDP and joins the threads.
pub struct XdpEngine {
    shards: Vec<ShardThread>,
    /// The shard of the next `connect` (round robin).
    next: AtomicUsize,
    local_ip: Ipv4Addr,
}

impl std::fmt::Debug for XdpEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpEngine")
            .field("local_ip", &self.local_ip)
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

type Opener = Box<dyn FnOnce() -> Result<XdpTcp, XdpTcpError> + Send>;

/// Spawns one engine thread named `name` whose driver `open` makes (on that thread), and waits
/// until it is open. Returns the thread and the interface's address.
fn spawn_shard(
    name: String,
    open: Opener,
    cfg: XdpEngineConfig,
    index: usize,
    pin: Option<usize>,
) -> Result<(ShardThread, Ipv4Addr), DatapathError> {
    let (wake_tx, wake_rx) = UnixDatagram::pair()?;
    wake_tx.set_nonblocking(true)?;
    wake_rx.set_nonblocking(true)?;
    let wake = Arc::new(Wake {
        tx: wake_tx,
        state: AtomicU8::new(AWAKE),
        pending: AtomicBool::new(false),
        inline: cfg.inline_progress,
        core: OnceLock::new(),
        app_turns: AtomicU64::new(0),
        thread_turns: AtomicU64::new(0),
        app_waits: AtomicU64::new(0),
    });
    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
    let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
    let counters = Arc::new(Mutex::new(EngineCounters::default()));
    let engine_wake = wake.clone();
    let engine_counters = counters.clone();
    let thread = std::thread::Builder::new().name(name).spawn(move || {
        let mut xdp = match open() {
            Ok(x) => x,
            Err(e) => {
                let _ = ready_tx.send(Err(DatapathError::Xdp(e)));
                return;
            }
        };
        xdp.add_wake_fd(wake_rx.as_raw_fd());
        let _ = ready_tx.send(Ok(xdp.local_ip()));
        let inbox = xdp.shard_set();
        let turner = Turner {
            st: State {
                slots: SlotMap::default(),
                early: HashMap::new(),
                listeners: HashMap::new(),
                scratch: MemoryTable::new(),
                ended: ConnCounters::default(),
                established: 0,
                ended_conns: 0,
                epoch: xdp.epoch(),
                progress: false,
                wake: engine_wake.clone(),
                shard: index,
                cfg: cfg.clone(),
            },
            tables: Vec::new(),
            xdp,
            failed: None,
        };
        let core = Arc::new(Mutex::new(Some(turner)));
        let _ = engine_wake.core.set(core.clone());
        let engine = Engine {
            core,
            wake: engine_wake,
            cmds: cmd_rx,
            wake_rx,
            counters: engine_counters,
            cfg,
            parks: 0,
            pin,
            inbox,
        };
        engine.run();
    })?;
    let local_ip = match ready_rx.recv_timeout(START_TIMEOUT) {
        Ok(Ok(ip)) => ip,
        Ok(Err(e)) => {
            let _ = thread.join();
            return Err(e);
        }
        Err(_) => return Err(DatapathError::Timeout("starting the AF_XDP engine")),
    };
    Ok((
        ShardThread {
            handle: Handle { cmds: cmd_tx, wake },
            thread: Some(thread),
            counters,
        },
        local_ip,
    ))
}

impl XdpEngine {
    /// Starts the engine on `ifname` (in the calling thread's network namespace): one thread
    /// for every queue, or with [`XdpEngineConfig::shard_per_queue`] one thread per queue
    /// (named `iwarp-xdp-<ifname><queue>`), and waits until their drivers are open. Needs root
    /// (XDP, AF_XDP).
    pub fn start(ifname: &str, cfg: XdpEngineConfig) -> Result<XdpEngine, DatapathError> {
        if !cfg.shard_per_queue {
            let ifname_owned = ifname.to_owned();
            let driver = cfg.driver.clone();
            let open: Opener = Box::new(move || XdpTcp::open(&ifname_owned, driver));
            let (shard, local_ip) =
                spawn_shard(format!("iwarp-xdp-{ifname}"), open, cfg.clone(), 0, cfg.cpu)?;
            return Ok(XdpEngine {
                shards: vec![shard],
                next: AtomicUsize::new(0),
                local_ip,
            });
        }
        // The drivers are opened here (the threads inherit this thread's namespace) and each
        // moves to its thread; the last one to end detaches the program, on a shard thread.
        let drivers = XdpTcp::open_shards(ifname, cfg.driver.clone())?;
        let mut engine = XdpEngine {
            shards: Vec::with_capacity(drivers.len()),
            next: AtomicUsize::new(0),
            local_ip: Ipv4Addr::UNSPECIFIED,
        };
        for (i, driver) in drivers.into_iter().enumerate() {
            let queue = driver.queues().first().copied().unwrap_or(0);
            let pin = match cfg.cpus.as_slice() {
                [] => cfg.cpu,
                cpus => Some(cpus[i % cpus.len()]),
            };
            let open: Opener = Box::new(move || Ok(driver));
            let (shard, ip) = spawn_shard(
                format!("iwarp-xdp-{ifname}{queue}"),
                open,
                cfg.clone(),
                i,
                pin,
            )?;
            engine.local_ip = ip;
            engine.shards.push(shard);
        }
        Ok(engine)
    }

    /// Engine threads (shards).
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The interface's IPv4 address the engine speaks from.
    pub fn local_ip(&self) -> Ipv4Addr {
        self.local_ip
    }

    /// Listens on `port` (reserved with the kernel and steered to the engine); every shard
    /// listens, and the connections of all of them come to the one [`Listener`].
    pub fn listen(&self, port: u16, params: ConnectParams) -> Result<Listener, DatapathError> {
        let (req_tx, req_rx) = crossbeam_channel::unbounded();
        for shard in &self.shards {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let cmd = EngineCmd::Listen {
                port,
                params: params.clone(),
                requests: req_tx.clone(),
                reply: tx,
            };
            shard
                .handle
                .call(cmd, rx, params.setup_timeout, "starting to listen")?;
        }
        Ok(Listener::from_provider(
            Box::new(XdpListen {
                rx: req_rx,
                handles: self.shards.iter().map(|s| s.handle.clone()).collect(),
                local: SocketAddr::from((self.local_ip, port)),
            }),
            params,
        ))
    }

    /// Connects to an MPA responder (the rdma_cm `connect` step) over the engine's TCP.
    pub fn connect(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
        private_data: &[u8],
    ) -> Result<Connection, DatapathError> {
        self.start_connect(addr, pd, cq, params, private_data)?()
    }

    /// The first half of [`XdpEngine::connect`]: hands the engine the command and returns
    /// what waits for its outcome (which needs nothing of `self`, so another thread can wait).
    pub(crate) fn start_connect(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
        private_data: &[u8],
    ) -> Result<PendingConnect, DatapathError> {
        let SocketAddr::V4(addr) = addr else {
            return Err(DatapathError::InvalidArgument(
                "the AF_XDP engine speaks IPv4 only",
            ));
        };
        let n = self.next.fetch_add(1, Ordering::Relaxed) % self.shards.len().max(1);
        let handle = &self
            .shards
            .get(n)
            .ok_or(DatapathError::Disconnected)?
            .handle;
        cq.attach(handle.wake.clone());
        let (tx, rx) = crossbeam_channel::bounded(1);
        let cmd = EngineCmd::Connect {
            addr,
            pd: pd.clone(),
            cq: cq.sink(),
            params: params.clone(),
            private_data: private_data.to_vec(),
            reply: tx,
        };
        // The engine's MPA startup deadline is `setup_timeout`; next-hop resolution comes first.
        let wait = params.setup_timeout + Duration::from_secs(5);
        handle.send(cmd)?;
        Ok(Box::new(move || {
            let (parts, private_data) = Handle::reply(rx, wait, "connecting")?;
            Ok(Connection {
                qp: QueuePair::from_parts(parts),
                private_data,
            })
        }))
    }

    /// The engine's counters as last published (at most 50 ms old while it runs), summed
    /// over its shards.
    pub fn counters(&self) -> EngineCounters {
        let mut sum = EngineCounters {
            shards: self.shards.len(),
            ..EngineCounters::default()
        };
        for shard in &self.shards {
            let mut c = shard
                .counters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let w = &shard.handle.wake;
            c.app_turns = w.app_turns.load(Ordering::Relaxed);
            c.thread_turns = w.thread_turns.load(Ordering::Relaxed);
            sum.add(&c);
            if self.shards.len() > 1 {
                sum.shard_drivers.push(c.driver);
            }
        }
        sum
    }

    /// Stops the engine: closes every connection (gracefully for up to a second), detaches XDP
    /// and joins the threads. Also done on drop.
    pub fn stop(&mut self) {
        for shard in &self.shards {
            let _ = shard.handle.cmds.send(EngineCmd::Shutdown);
            let _ = shard.handle.wake.wake_now();
        }
        for shard in &mut self.shards {
            if let Some(t) = shard.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for XdpEngine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Who waits for a connection's setup to end.
enum Waiter {
    None,
    Connect(Reply<(QpParts, Vec<u8>)>),
    Accept(Reply<QpParts>),
}

struct Slot {
    conn: IwarpConn,
    /// Index of its PD's table in the engine's list (`None` until the PD is known).
    table: Option<usize>,
    num: u32,
    local_port: u16,
    peer: SocketAddr,
    cmds: Option<Receiver<Cmd>>,
    cq: Option<CqSink>,
    shared: Arc<Shared>,
    waiter: Waiter,
    closing: bool,
    last_state: Option<QpState>,
}

impl Slot {
    fn new(conn: IwarpConn, table: Option<usize>, tuple: tcp_engine::FourTuple) -> Slot {
        let state = conn.qp().state();
        Slot {
            conn,
            table,
            num: NEXT_QP.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            local_port: tuple.local_port,
            peer: SocketAddr::from((tuple.remote_addr, tuple.remote_port)),
            cmds: None,
            cq: None,
            shared: Shared::new(state),
            waiter: Waiter::None,
            closing: false,
            last_state: None,
        }
    }

    /// Records what ended the connection; a Terminate the peer sent is the cause of whatever
    /// failed after it (the peer closes once it has sent one).
    fn set_error(&self, error: QpError) {
        let error = self
            .conn
            .qp()
            .remote_terminate()
            .map_or(error, QpError::RemoteTerminate);
        self.shared.set_error(error);
    }

    fn fail_waiter(&mut self, e: DatapathError) {
        match std::mem::replace(&mut self.waiter, Waiter::None) {
            Waiter::None => {}
            Waiter::Connect(tx) => {
                let _ = tx.send(Err(e));
            }
            Waiter::Accept(tx) => {
                let _ = tx.send(Err(e));
            }
        }
    }

    fn complete_local_error(&self, wr_id: u64, opcode: WcOpcode, e: &rdmap::RdmapError) {
        if let Some(cq) = &self.cq {
            cq.push(Completion {
                qp_num: self.num,
                wc: WorkCompletion {
                    wr_id,
                    opcode,
                    status: local_status(e),
                    byte_len: 0,
                    invalidated: None,
                    solicited: false,
                },
            });
        }
    }

    fn deliver_completions(&mut self) -> bool {
        let mut any = false;
        while let Some(wc) = self.conn.qp_mut().poll_completion() {
            any = true;
            if let Some(cq) = &self.cq {
                cq.push(Completion {
                    qp_num: self.num,
                    wc,
                });
            }
        }
        any
    }

    fn publish(&mut self, finished: bool) {
        let state = self.conn.qp().state();
        if self.last_state == Some(state) && !finished {
            return;
        }
        self.last_state = Some(state);
        let qp = self.conn.qp();
        drop(
            self.shared
                .publish(state, qp.remote_terminate(), qp.local_terminate()),
        );
        if finished {
            self.shared.mark_finished(state);
        }
    }

    /// The connection is over: the queue pair flushed, completions out, status final.
    fn finish(&mut self, why: QpError) {
        self.conn
            .qp_mut()
            .on_transport_error(TerminateCause::ConnectionLost);
        self.deliver_completions();
        if !self.closing {
            self.set_error(why);
        }
        self.fail_waiter(DatapathError::Disconnected);
        self.publish(true);
    }
}

/// The engine's connections by [`ConnId`]: a vector indexed by the table's slot index
/// ([`ConnId::index`], small and dense), the generation checked. The slot is looked up for
/// every segment received (`on_data`) and every segment built (`fill_tx`): an index and a
/// compare, no hashing and probing.
struct SlotMap<V = Slot> {
    v: Vec<Option<(ConnId, V)>>,
    len: usize,
}

impl<V> Default for SlotMap<V> {
    fn default() -> Self {
        SlotMap {
            v: Vec::new(),
            len: 0,
        }
    }
}

impl<V> SlotMap<V> {
    fn get_mut(&mut self, id: &ConnId) -> Option<&mut V> {
        match self.v.get_mut(id.index()) {
            Some(Some((k, s))) if k == id => Some(s),
            _ => None,
        }
    }

    /// Inserts `slot` for `id`, returning what `id`'s place held (an older generation's slot
    /// included: the table reused the index, so that connection is gone).
    fn insert(&mut self, id: ConnId, slot: V) -> Option<V> {
        let i = id.index();
        if self.v.len() <= i {
            self.v.resize_with(i + 1, || None);
        }
        let old = self.v[i].replace((id, slot)).map(|(_, s)| s);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    fn remove(&mut self, id: &ConnId) -> Option<V> {
        let e = self.v.get_mut(id.index())?;
        if e.as_ref().is_some_and(|(k, _)| k == id) {
            self.len -= 1;
            e.take().map(|(_, s)| s)
        } else {
            None
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn values(&self) -> impl Iterator<Item = &V> {
        self.v.iter().filter_map(|e| e.as_ref().map(|(_, s)| s))
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.v.iter_mut().filter_map(|e| e.as_mut().map(|(_, s)| s))
    }

    /// Takes every connection out.
    fn drain(&mut self) -> impl Iterator<Item = (ConnId, V)> + '_ {
        self.len = 0;
        self.v.drain(..).flatten()
    }
}

/// The engine thread's connection state (what the driver's callbacks reach).
struct State {
    slots: SlotMap,
    /// Data passed up for a passive connection before the driver handed it over (the ACK that
    /// completes the handshake may carry the MPA Request); replayed in `on_accept`.
    early: HashMap<ConnId, Vec<(u32, u64, Vec<u8>)>>,
    listeners: HashMap<u16, (ConnectParams, Sender<RequestMsg>)>,
    /// An empty table for connections whose PD is not known yet (MPA startup places nothing).
    scratch: MemoryTable<RegionMemory>,
    ended: ConnCounters,
    established: u64,
    ended_conns: u64,
    epoch: StdInstant,
    progress: bool,
    wake: Arc<Wake>,
    /// This shard's index in the engine.
    shard: usize,
    cfg: XdpEngineConfig,
}

impl State {
    fn now(&self) -> Instant {
        let nanos = self.epoch.elapsed().as_nanos();
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    fn conn_config(&self, params: &ConnectParams, pd: PdId) -> ConnConfig {
        ConnConfig {
            mpa: params.mpa.clone(),
            qp: QpConfig {
                pd,
                sq_depth: params.sq_depth,
                rq_depth: params.rq_depth,
                ..QpConfig::default()
            },
            reassembly_capacity: self.cfg.reassembly_capacity,
            max_placed_fpdus: self.cfg.max_placed_fpdus,
            tx_ahead: self.cfg.tx_ahead,
            max_tx_fpdus: self.cfg.max_tx_fpdus,
        }
    }
}

/// The TCP transmit mode of the engine's connections.
fn tx_mode(cfg: &XdpEngineConfig) -> tcp_engine::TxMode {
    if cfg.tx_copy {
        tcp_engine::TxMode::Records
    } else {
        tcp_engine::TxMode::Source
    }
}

/// A PD table's version read for one turn (`None` past the tables in use).
type TableView = Option<TableSnapshot>;

/// PD tables read per turn without allocating: this many on the stack, more on the heap.
const INLINE_TABLES: usize = 4;

/// The driver's view of the engine for one turn: the state plus the PD tables as of the turn's
/// start (snapshots: no lock, see `RegionTable`).
struct App<'a> {
    st: &'a mut State,
    mem: &'a [TableView],
}

fn table_of<'t>(
    table: Option<usize>,
    mem: &'t [TableView],
    scratch: &'t MemoryTable<RegionMemory>,
) -> &'t MemoryTable<RegionMemory> {
    match table.and_then(|i| mem.get(i)).and_then(|g| g.as_deref()) {
        Some(g) => g,
        None => scratch,
    }
}

impl TcpApp for App<'_> {
    fn on_data(&mut self, id: ConnId, data: PassedUp<'_>) {
        let State {
            slots,
            early,
            scratch,
            ..
        } = &mut *self.st;
        match slots.get_mut(&id) {
            Some(slot) => {
                let mem = table_of(slot.table, self.mem, scratch);
                slot.conn.on_data(data, mem);
            }
            None => early.entry(id).or_default().push((
                data.seq,
                data.stream_offset,
                data.data.to_vec(),
            )),
        }
        self.st.progress = true;
    }

    fn on_accept(&mut self, id: ConnId, tcp: &mut TcpConnection) {
        let tuple = tcp.four_tuple();
        let early = self.st.early.remove(&id);
        let Some((params, _)) = self.st.listeners.get(&tuple.local_port) else {
            tcp.close();
            return;
        };
        // The PD is the one given to `accept`; until then the queue pair has a placeholder
        // (no PD has number 0) and is replaced before Full Operation.
        let cfg = self.st.conn_config(params, PdId(0));
        let now = self.st.now();
        let conn = match IwarpConn::responder(cfg, self.st.epoch, now) {
            Ok(c) => c,
            Err(_) => {
                tcp.close();
                return;
            }
        };
        let mut slot = Slot::new(conn, None, tuple);
        for (seq, stream_offset, bytes) in early.into_iter().flatten() {
            let data = PassedUp {
                seq,
                stream_offset,
                data: &bytes,
                // Nothing was sent on a connection not yet accepted.
                acked: 0,
            };
            slot.conn.on_data(data, &self.st.scratch);
        }
        self.st.slots.insert(id, slot);
        self.st.progress = true;
    }

    fn on_event(&mut self, id: ConnId, tcp: &mut TcpConnection, event: TcpEvent) {
        if let Some(slot) = self.st.slots.get_mut(&id) {
            slot.conn.on_tcp_acked(tcp.bytes_acked());
            slot.conn.on_tcp_event(event);
            self.st.progress = true;
        }
    }

    fn on_poll(&mut self, id: ConnId, tcp: &mut TcpConnection, now: Instant) {
        let State {
            slots,
            listeners,
            scratch,
            established,
            progress,
            wake,
            shard,
            ..
        } = &mut *self.st;
        let Some(slot) = slots.get_mut(&id) else {
            return;
        };
        let mem = table_of(slot.table, self.mem, scratch);
        // Work requests from the application.
        if let Some(rx) = &slot.cmds {
            let mut close = false;
            for _ in 0..CMD_BUDGET {
                let cmd = match rx.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => Cmd::Close,
                };
                *progress = true;
                match cmd {
                    Cmd::Send(wr) => {
                        let (wr_id, opcode) = (wr.wr_id, wc_opcode(&wr.op));
                        if let Err(e) = slot.conn.qp_mut().post_send(wr, mem) {
                            slot.complete_local_error(wr_id, opcode, &e);
                        }
                    }
                    Cmd::Recv(wr) => {
                        let wr_id = wr.wr_id;
                        if let Err(e) = slot.conn.qp_mut().post_recv(wr, mem) {
                            slot.complete_local_error(wr_id, WcOpcode::Recv, &e);
                        }
                    }
                    Cmd::Close => {
                        close = true;
                        break;
                    }
                }
            }
            if close {
                slot.cmds = None;
                if !slot.closing {
                    slot.closing = true;
                    slot.conn.close();
                }
            }
        }
        slot.conn.poll(tcp, mem, now);
        while let Some(ev) = slot.conn.poll_event() {
            *progress = true;
            match ev {
                ConnEvent::Request(info) => {
                    let msg = RequestMsg {
                        id,
                        info,
                        peer: slot.peer,
                        shard: *shard,
                    };
                    let delivered = listeners
                        .get(&slot.local_port)
                        .is_some_and(|(_, tx)| tx.send(msg).is_ok());
                    if !delivered {
                        // Nobody listens any more.
                        let _ = slot.conn.reject(&[]);
                    }
                }
                ConnEvent::Established { private_data } => {
                    *established += 1;
                    let Some(negotiated) = slot.conn.negotiated().cloned() else {
                        continue;
                    };
                    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
                    slot.cmds = Some(cmd_rx);
                    let mulpdu = mpa::mulpdu(usize::from(tcp.emss()), negotiated.markers_tx)
                        .min(usize::from(u16::MAX));
                    let parts = QpParts {
                        num: slot.num,
                        cmds: cmd_tx,
                        waker: wake.clone(),
                        shared: slot.shared.clone(),
                        negotiated,
                        mulpdu,
                        peer: slot.peer,
                        thread: None,
                    };
                    let taken = match std::mem::replace(&mut slot.waiter, Waiter::None) {
                        Waiter::Connect(tx) => tx.send(Ok((parts, private_data))).is_ok(),
                        Waiter::Accept(tx) => tx.send(Ok(parts)).is_ok(),
                        Waiter::None => false,
                    };
                    if !taken {
                        // The application gave up waiting: nobody will use this connection.
                        slot.cmds = None;
                        slot.closing = true;
                        slot.conn.close();
                    }
                }
                ConnEvent::Rejected { private_data } => {
                    slot.closing = true;
                    slot.fail_waiter(DatapathError::Rejected { private_data });
                }
                ConnEvent::StartupFailed(e) => {
                    slot.set_error(QpError::Startup(e.clone()));
                    slot.fail_waiter(DatapathError::Mpa(e));
                }
                ConnEvent::ConnectionRefused => {
                    slot.set_error(QpError::Refused);
                    slot.fail_waiter(DatapathError::Io(std::io::Error::from(
                        std::io::ErrorKind::ConnectionRefused,
                    )));
                }
                ConnEvent::MpaFailed(e) => slot.set_error(QpError::Mpa(e)),
                ConnEvent::TransmitSourceFailed(_) => slot.set_error(QpError::TransmitSourceFailed),
                ConnEvent::TransportClosed(how) => {
                    if !slot.closing {
                        slot.set_error(transport_closed_error(how));
                    }
                    slot.fail_waiter(DatapathError::Disconnected);
                }
            }
        }
        *progress |= slot.deliver_completions();
        let done = (slot.closing || slot.conn.qp().state() == QpState::Error)
            && matches!(
                tcp.state(),
                TcpState::FinWait2 | TcpState::TimeWait | TcpState::Closed
            );
        slot.publish(done);
    }

    fn fill_tx(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<(), tcp_engine::TxSourceError> {
        self.fill_tx_summed(id, stream_offset, out).map(|_| ())
    }

    fn fill_tx_summed(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u16>, tcp_engine::TxSourceError> {
        let State { slots, scratch, .. } = &mut *self.st;
        match slots.get_mut(&id) {
            Some(slot) => {
                let mem = table_of(slot.table, self.mem, scratch);
                slot.conn.fill(stream_offset, out, mem).map(Some)
            }
            None => Err(tcp_engine::TxSourceError {
                offset: stream_offset,
                len: out.len(),
            }),
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.st
            .slots
            .values()
            .filter_map(|s| s.conn.poll_timeout())
            .min()
    }

    fn on_closed(&mut self, id: ConnId, _tcp: TcpConnection) {
        self.st.early.remove(&id);
        if let Some(mut slot) = self.st.slots.remove(&id) {
            slot.finish(QpError::PeerClosed);
            add_counters(&mut self.st.ended, &slot.conn.counters());
            self.st.ended_conns += 1;
            self.st.progress = true;
        }
    }
}

/// The queue pair's error text for a TCP connection that ended under it.
/// What a TCP connection's end means to the queue pair on it.
fn transport_closed_error(how: tcp_engine::Event) -> QpError {
    use tcp_engine::Event as E;
    match how {
        E::PeerClosed | E::Closed | E::Connected | E::EmssChanged(_) => QpError::PeerClosed,
        E::Reset => QpError::PeerReset,
        E::TimedOut => QpError::TimedOut,
        E::SourceFailed => QpError::TransmitSourceFailed,
    }
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

/// The engine's state behind its mutex: the engine thread and, with inline progress,
/// application threads take it with `try_lock` only, once per turn (never per packet), so no
/// thread ever waits on it. `None` once the engine thread has stopped.
pub(crate) type Core = Mutex<Option<Turner>>;

/// Everything one engine turn needs: connections, PD tables, the driver.
pub(crate) struct Turner {
    st: State,
    /// The registration tables of the PDs the engine's connections use.
    tables: Vec<SharedTable>,
    xdp: XdpTcp,
    /// The driver error of a turn, for the engine thread to stop on.
    failed: Option<String>,
}

impl Turner {
    /// One turn: received frames (placement), every connection's work requests, timers,
    /// transmission. True if there was work.
    fn turn(&mut self) -> bool {
        // Before reading the queues (see `Wake::pending`).
        self.st.wake.pending.swap(false, Ordering::SeqCst);
        let mut work;
        {
            // Each PD table's current version is read once per turn, not per packet, without a
            // lock (a registration never makes a turn wait, nor a turn a registration); no
            // allocation for the usual handful of PDs.
            let mut inline: [TableView; INLINE_TABLES] = Default::default();
            let mut heap: Vec<TableView> = Vec::new();
            let mem: &[TableView] = if self.tables.len() <= INLINE_TABLES {
                for (g, t) in inline.iter_mut().zip(&self.tables) {
                    *g = Some(t.snapshot());
                }
                &inline[..self.tables.len()]
            } else {
                heap.extend(self.tables.iter().map(|t| Some(t.snapshot())));
                &heap
            };
            let mut app = App {
                st: &mut self.st,
                mem,
            };
            match self.xdp.poll(&mut app) {
                Ok(w) => work = w,
                Err(e) => {
                    self.failed.get_or_insert(e.to_string());
                    work = false;
                }
            }
        }
        work |= std::mem::take(&mut self.st.progress);
        work
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
    /// Application turns and blocking waits as of the engine thread's last look.
    seen: (u64, u64),
    /// What stopped the engine thread.
    error: Option<String>,
    /// When the current stretch of idle turns began (only while the engine has connections).
    idle_began: Option<StdInstant>,
    /// Nanoseconds of idle stretches that have ended ([`EngineCounters::idle_ns`]).
    idle_ns: u64,
}

impl Pace {
    /// Inline progress: whether application threads drove turns since the last look and none
    /// blocked in a wait since (they poll, so the engine thread may leave the work to them).
    fn app_drove(&mut self, wake: &Wake) -> bool {
        let now = (
            wake.app_turns.load(Ordering::Relaxed),
            wake.app_waits.load(Ordering::SeqCst),
        );
        let driven = now.0 != self.seen.0 && now.1 == self.seen.1;
        self.seen = now;
        driven
    }
}

struct Engine {
    core: Arc<Core>,
    wake: Arc<Wake>,
    cmds: Receiver<EngineCmd>,
    wake_rx: UnixDatagram,
    counters: Arc<Mutex<EngineCounters>>,
    cfg: XdpEngineConfig,
    parks: u64,
    /// The CPU to pin the thread to.
    pin: Option<usize>,
    /// Shards: the inboxes and this shard's index (a parked thread is woken by hand-offs).
    inbox: Option<(Arc<crate::xdp_tcp::shard::ShardSet>, usize)>,
}

impl Engine {
    fn run(mut self) {
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
            idle_began: None,
            idle_ns: 0,
        };
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
                        break;
                    }
                };
                let Some(t) = guard.as_mut() else { break };
                self.step(t, &mut p)
            };
            match next {
                Next::Turn => {}
                Next::Spin => std::hint::spin_loop(),
                Next::Yield => std::thread::yield_now(),
                Next::Park => {
                    self.park(&mut p);
                    p.idle = 0;
                    p.idle_since = None;
                }
                Next::Stop => break,
            }
        }
        // Take the state out (application turns find `None` from now on) and end it here, on
        // the engine thread (detaching XDP belongs to the thread that attached it).
        let taken = match self.core.lock() {
            Ok(mut g) => g.take(),
            Err(p) => p.into_inner().take(),
        };
        let mut error = p.error;
        if let Some(mut t) = taken {
            if error.is_none() {
                error = t.failed.take();
            }
            for (_, mut slot) in t.st.slots.drain() {
                slot.finish(QpError::EngineStopped);
                add_counters(&mut t.st.ended, &slot.conn.counters());
            }
            self.publish(&t, error, p.idle_ns);
        } else {
            let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
            c.error = error;
        }
    }

    /// One turn of the engine thread with its state locked, and what to do next.
    fn step(&self, t: &mut Turner, p: &mut Pace) -> Next {
        let mut work = false;
        if p.stopping.is_none() {
            match t.commands(&self.cmds) {
                Ok(w) => work |= w,
                Err(()) => {
                    p.stopping = Some(StdInstant::now());
                    for slot in t.st.slots.values_mut() {
                        slot.closing = true;
                        slot.conn.close();
                    }
                    t.st.listeners.clear();
                }
            }
        }
        work |= t.turn();
        let turns = self.wake.thread_turns.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = t.failed.take() {
            p.error = Some(e);
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
            if t.st.slots.is_empty() || since.elapsed() >= SHUTDOWN_GRACE {
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
        // Sleep: announce it, then look at the command queues a last time (see `Wake`).
        self.wake.state.store(SLEEPING, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !self.cmds.is_empty() || t.commands_pending() {
            self.wake.state.store(AWAKE, Ordering::SeqCst);
            return Next::Turn;
        }
        let app = App {
            st: &mut t.st,
            mem: &mut [],
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
            p.error = Some(e.to_string());
            return Next::Stop;
        }
        Next::Turn
    }

    /// Inline progress: sleeps on the wake-up socket alone, the state unlocked, while
    /// application threads keep driving turns; back to polling when they stop (no application
    /// turn since the last look: the sleeps between looks start at [`PARK`] and double up to
    /// [`XdpEngineConfig::park_max`]), block in a wait, or something writes the wake-up socket
    /// (an engine command, a work request whose poster could not run a turn).
    fn park(&mut self, p: &mut Pace) {
        self.parks += 1;
        let mut sleep = PARK;
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
            let woken = wait_readable(self.wake_rx.as_raw_fd(), inbox.map(|b| b.wake_fd()), sleep);
            if let Some(b) = inbox {
                b.sleep_end();
            }
            self.wake.state.store(AWAKE, Ordering::SeqCst);
            let woken = self.drain_wake() || woken.is_err();
            if p.last_publish.elapsed() >= COUNTERS_EVERY {
                if let Ok(g) = self.core.try_lock() {
                    if let Some(t) = g.as_ref() {
                        p.last_publish = StdInstant::now();
                        self.publish(t, None, p.idle_ns);
                    }
                }
            }
            if woken || !p.app_drove(&self.wake) {
                return;
            }
            sleep = next_park(sleep, self.cfg.park_max);
        }
        self.wake.state.store(AWAKE, Ordering::SeqCst);
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

/// Waits up to `timeout` for `fd` (or `fd2`) to become readable (`ppoll`); `Err` on a failed
/// `ppoll`.
fn wait_readable(
    fd: std::os::fd::RawFd,
    fd2: Option<std::os::fd::RawFd>,
    timeout: Duration,
) -> io::Result<bool> {
    let pfd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut pfds = [pfd(fd), pfd(fd2.unwrap_or(-1))];
    let n = if fd2.is_some() { 2 } else { 1 };
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `pfds` and `ts` are valid and owned by this frame, the count passed (1 or 2) is
    // at most `pfds`' length, and a null signal mask leaves the thread's mask alone.
    let rc = unsafe { libc::ppoll(pfds.as_mut_ptr(), n, &ts, std::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(rc > 0)
}

impl Turner {
    /// The index of `pd`'s table, adding it on first use.
    fn table_index(&mut self, pd: &ProtectionDomain) -> usize {
        if let Some(i) = self.tables.iter().position(|t| Arc::ptr_eq(t, &pd.table)) {
            return i;
        }
        self.tables.push(pd.table.clone());
        self.tables.len() - 1
    }

    /// Engine commands; `Err` on shutdown.
    fn commands(&mut self, cmds: &Receiver<EngineCmd>) -> Result<bool, ()> {
        let mut any = false;
        loop {
            let cmd = match cmds.try_recv() {
                Ok(c) => c,
                Err(TryRecvError::Empty) => return Ok(any),
                Err(TryRecvError::Disconnected) => return Err(()),
            };
            any = true;
            match cmd {
                EngineCmd::Shutdown => return Err(()),
                EngineCmd::Listen {
                    port,
                    params,
                    requests,
                    reply,
                } => {
                    let mut tcp = self.st.cfg.tcp.clone();
                    tcp.tx_mode = tx_mode(&self.st.cfg);
                    tcp.rx_mode = tcp_engine::RxMode::PassUp;
                    let res = self.xdp.listen(port, self.st.cfg.backlog, tcp).map(|()| {
                        self.st.listeners.insert(port, (params, requests));
                    });
                    let _ = reply.send(res.map_err(DatapathError::from));
                }
                EngineCmd::Connect {
                    addr,
                    pd,
                    cq,
                    params,
                    private_data,
                    reply,
                } => {
                    let res = self.connect(addr, &pd, &params, &private_data);
                    match res {
                        Ok(id) => {
                            if let Some(slot) = self.st.slots.get_mut(&id) {
                                slot.cq = Some(cq);
                                slot.waiter = Waiter::Connect(reply);
                            }
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
                EngineCmd::Accept {
                    id,
                    pd,
                    cq,
                    private_data,
                    recvs,
                    params,
                    reply,
                } => {
                    let table = self.table_index(&pd);
                    match self.accept(id, &pd, table, &private_data, recvs, &params) {
                        Ok(()) => {
                            if let Some(slot) = self.st.slots.get_mut(&id) {
                                slot.cq = Some(cq);
                                slot.waiter = Waiter::Accept(reply);
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
                            let _ = reply.send(Err(e));
                        }
                    }
                }
                EngineCmd::Reject {
                    id,
                    private_data,
                    reply,
                } => {
                    let res = match self.st.slots.get_mut(&id) {
                        Some(slot) => {
                            slot.closing = true;
                            slot.conn.reject(&private_data).map_err(|e| match e {
                                crate::engine::ConnError::Mpa(m) => DatapathError::Mpa(m),
                                crate::engine::ConnError::InvalidState(s) => {
                                    DatapathError::InvalidArgument(s)
                                }
                            })
                        }
                        None => Err(DatapathError::Disconnected),
                    };
                    let _ = reply.send(res);
                }
            }
        }
    }

    fn connect(
        &mut self,
        addr: SocketAddrV4,
        pd: &ProtectionDomain,
        params: &ConnectParams,
        private_data: &[u8],
    ) -> Result<ConnId, DatapathError> {
        let table = self.table_index(pd);
        let cfg = self.st.conn_config(params, pd.id);
        let mut conn = IwarpConn::initiator(cfg, private_data, self.st.epoch, self.st.now())
            .map_err(|e| match e {
                crate::engine::ConnError::Mpa(m) => DatapathError::Mpa(m),
                crate::engine::ConnError::InvalidState(s) => DatapathError::InvalidArgument(s),
            })?;
        if let Some(srq) = &params.srq {
            srq.attach(conn.qp_mut(), pd.id)?;
        }
        let mut tcp = self.st.cfg.tcp.clone();
        tcp.tx_mode = tx_mode(&self.st.cfg);
        tcp.rx_mode = tcp_engine::RxMode::PassUp;
        let id = self.xdp.connect(addr, tcp)?;
        let tuple = self
            .xdp
            .connection(id)
            .map(|c| c.four_tuple())
            .ok_or(DatapathError::Disconnected)?;
        self.st
            .slots
            .insert(id, Slot::new(conn, Some(table), tuple));
        Ok(id)
    }

    fn accept(
        &mut self,
        id: ConnId,
        pd: &ProtectionDomain,
        table: usize,
        private_data: &[u8],
        recvs: Vec<RecvWr>,
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
        {
            let mem = pd.table.snapshot();
            for wr in recvs {
                slot.conn
                    .qp_mut()
                    .post_recv(wr, &mem)
                    .map_err(|_| DatapathError::InvalidArgument("receive work request refused"))?;
            }
        }
        slot.conn.accept(private_data).map_err(|e| match e {
            crate::engine::ConnError::Mpa(m) => DatapathError::Mpa(m),
            crate::engine::ConnError::InvalidState(s) => DatapathError::InvalidArgument(s),
        })?;
        slot.table = Some(table);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_sleeps_double_up_to_the_maximum() {
        let ms = Duration::from_millis;
        let mut sleep = PARK;
        let mut seen = vec![sleep];
        for _ in 0..6 {
            sleep = next_park(sleep, ms(4));
            seen.push(sleep);
        }
        let us = Duration::from_micros;
        assert_eq!(
            seen,
            [us(500), ms(1), ms(2), ms(4), ms(4), ms(4), ms(4)],
            "500 us, doubling, capped at park_max"
        );
        // A maximum at or below the first sleep keeps every look at 500 us (the former
        // behaviour); one between doublings caps the last.
        assert_eq!(next_park(PARK, us(100)), PARK);
        assert_eq!(next_park(PARK, PARK), PARK);
        assert_eq!(next_park(ms(2), us(3000)), us(3000));
    }

    #[test]
    fn slot_map_keys_by_index_and_generation() {
        // Ids as the table hands them out: a removed connection's index comes back under a
        // new generation, and the old id must find nothing.
        let mut table = tcp_engine::table::ConnectionTable::new([7; 16], 8);
        let tuple = |port| tcp_engine::FourTuple {
            local_addr: Ipv4Addr::new(10, 0, 0, 1),
            local_port: port,
            remote_addr: Ipv4Addr::new(10, 0, 0, 2),
            remote_port: 4791,
        };
        let cfg = tcp_engine::Config::default();
        let connect = |t: &mut tcp_engine::table::ConnectionTable, port| {
            t.connect(cfg.clone(), tuple(port), Instant::ZERO)
        };
        let a = connect(&mut table, 1000).expect("a");
        let b = connect(&mut table, 1001).expect("b");
        let mut m: SlotMap<u32> = SlotMap::default();
        assert!(m.is_empty());
        assert_eq!(m.insert(b, 2), None);
        assert_eq!(m.insert(a, 1), None);
        assert_eq!(m.get_mut(&a).copied(), Some(1));
        assert_eq!(m.get_mut(&b).copied(), Some(2));
        assert!(table.remove(a).is_some());
        let c = connect(&mut table, 1002).expect("c");
        assert_eq!(c.index(), a.index(), "the table reuses the slot");
        assert_ne!(c, a);
        assert_eq!(m.get_mut(&c), None, "a new generation is not the old one");
        assert_eq!(m.remove(&c), None);
        assert_eq!(m.remove(&a), Some(1));
        assert_eq!(m.get_mut(&a), None);
        assert_eq!(m.insert(c, 3), None);
        for v in m.values_mut() {
            *v += 10;
        }
        let mut all: Vec<u32> = m.values().copied().collect();
        all.sort_unstable();
        assert_eq!(all, [12, 13]);
        let drained: Vec<(ConnId, u32)> = m.drain().collect();
        assert_eq!(drained.len(), 2);
        assert!(m.is_empty());
        assert_eq!(m.get_mut(&b), None);
    }
}
