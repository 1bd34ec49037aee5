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
//! [`CompletionQueue::wait`]) the engine thread parks (sleeps on its wake-up socket and a
//! watchdog timer that their polls keep pushing forward), and a work request
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
//! **Memory.** The registration table of each protection domain is shared with the
//! application as a versioned snapshot (`arc_swap`, as in the socket transport): each turn
//! compares each table's version once (one load, no lock) and takes a new snapshot only when a
//! registration changed it, so a registration never waits for a turn nor a turn for a
//! registration. Known limitation: a PD once used stays in the engine's list (one load per turn
//! each, its last snapshot kept) until the engine stops.
//!
//! **Listeners.** Dropping a [`Listener`] stops listening on every shard
//! (`XdpTcp::unlisten`): new SYNs to the port get a RST, connections whose MPA Request nobody
//! took yet end (rejected when it arrives, or at the MPA accept timeout), connections accepted
//! live on, and the port stays steered and
//! reserved with the kernel until the last of them closes; it can be listened on again at once.
//!
//! **Known limitations.** A `connect` (or `resolve_route`) whose next hop is not in the
//! kernel's neighbour table waits for its resolution on a thread of its own, one per such
//! call, which lives up to the driver's neighbour timeout even if the engine stops first (its
//! caller is told at once: what waits stays with the engine); IPv4 only.
//!
//! **Modules.** `config`: the settings and the counters. `commands`: the setup commands and
//! what answers them. `handle`: the application's way in (the providers behind [`Listener`] and
//! [`ConnectRequest`]). `wake`: waking and driving the engine (sleep states, `Wake`, and the
//! state types it reaches). `slots`: the connections. `glue`: the driver's view of the engine
//! (the TCP callbacks). `thread`: the engine thread's loop and turns. This file: [`XdpEngine`]
//! and its shard threads.

mod commands;
mod config;
mod failure;
mod glue;
mod handle;
mod slots;
mod thread;
mod wake;
mod watchdog;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdmap::{MemoryTable, RecvWr};

#[cfg(doc)]
use crate::engine::IwarpConn;
use crate::engine::{ConnCounters, ReassemblyBudget};
use crate::memory::ProtectionDomain;
#[cfg(doc)]
use crate::verbs::cm::ConnectRequest;
use crate::verbs::cm::{check_connect, ConnectParams, Connection, ListenRecord, Listener};
use crate::verbs::cq::{CompletionQueue, CqSink};
use crate::verbs::qp::{QpStart, QueuePair};
use crate::xdp_tcp::{XdpTcp, XdpTcpError};
use crate::DatapathError;

use commands::{handover, ConnectCmd, EngineCmd, RouteDone};
pub use config::{EngineCounters, XdpEngineConfig};
use failure::{FailureHook, FailureNotice};
use handle::{Handle, XdpListen};
use slots::SlotMap;
use thread::{Engine, ShardsShared};
use wake::{State, Turner, Wake};

/// How long `start` waits for the engine thread to open the driver.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a quick question to the engine thread (two netlink queries) may wait for its
/// answer: a turn is well under a millisecond, a busy engine answers at its next one.
const ENGINE_ANSWER_WAIT: Duration = Duration::from_secs(5);

/// What waits for the outcome of a connection attempt ([`XdpEngine::start_connect`]).
pub(crate) type PendingConnect = Box<dyn FnOnce() -> Result<Connection, DatapathError> + Send>;

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
    /// The MTU its TCP uses (the interface's, as much as its frames hold).
    mtu: u16,
    /// Most connections at once, over all shards.
    max_connections: usize,
    /// What the failure of one of its threads calls.
    failure: Arc<FailureNotice>,
    /// Its interface: where routes to its peers must leave ([`XdpEngine::route_check`]).
    iface: Iface,
}

/// The engine's interface, for the port's attributes (the route checks of address and route
/// resolution are the engine thread's, in its namespace).
#[derive(Debug, Clone)]
struct Iface {
    name: String,
    index: u32,
    /// Its MAC address when the engine started.
    mac: [u8; 6],
    /// Looks the interface up again (its link state), in the engine's network namespace
    /// whatever the caller's.
    query: Arc<Mutex<crate::xsk::InterfaceQuery>>,
}

impl Iface {
    fn of(name: &str) -> Result<Iface, DatapathError> {
        let mut query = crate::xsk::InterfaceQuery::open().map_err(XdpTcpError::from)?;
        let info = query.info(name).map_err(XdpTcpError::from)?;
        Ok(Iface {
            name: name.to_owned(),
            index: info.index,
            mac: info.mac,
            query: Arc::new(Mutex::new(query)),
        })
    }
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
    budget: ReassemblyBudget,
    index: usize,
    pin: Option<usize>,
    shared: ShardsShared,
) -> Result<(ShardThread, (Ipv4Addr, u16)), DatapathError> {
    let (wake_tx, wake_rx) = UnixDatagram::pair()?;
    wake_tx.set_nonblocking(true)?;
    wake_rx.set_nonblocking(true)?;
    let wake = Arc::new(Wake::new(wake_tx, cfg.inline_progress, cfg.park_max)?);
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
        // The application's quiet polls push the parked thread's watchdog with their clock
        // reading: it must not lag far behind `park_max`.
        xdp.set_quiet_clock_lag(engine_wake.park_max / 10);
        let _ = ready_tx.send(Ok((xdp.local_ip(), xdp.mtu())));
        let inbox = xdp.shard_set();
        let epoch = xdp.epoch();
        let (attention_tx, attention_rx) =
            crossbeam_channel::bounded(cfg.driver.max_connections.max(1));
        let turner = Turner {
            st: State {
                slots: SlotMap::default(),
                early: HashMap::new(),
                listeners: HashMap::new(),
                unclaimed: 0,
                scratch: MemoryTable::new(),
                ended: ConnCounters::default(),
                established: 0,
                ended_conns: 0,
                epoch,
                progress: false,
                wake: engine_wake.clone(),
                shard: index,
                cfg: cfg.clone(),
                budget,
                attention_tx: attention_tx.clone(),
                attention_rx: attention_rx.clone(),
                attention_local: Vec::new(),
                seen_posts: 0,
                rx_crc: None,
                tx_joined: vec![0; usize::from(xdp.mtu())],
                many: Arc::new(AtomicBool::new(false)),
                table_users: Vec::new(),
                tables_unused: false,
            },
            tables: Vec::new(),
            idle_table: Arc::new(crate::memory::RegionTable::new()),
            views: Vec::new(),
            xdp,
            failed: None,
            resolutions: commands::Resolutions::new(),
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
            epoch,
            shared,
        };
        engine.run();
    })?;
    let opened = match ready_rx.recv_timeout(START_TIMEOUT) {
        Ok(Ok(opened)) => opened,
        Ok(Err(e)) => {
            let _ = thread.join();
            return Err(e);
        }
        // The thread ended without a word: it panicked opening the interface (a bug), said
        // as such rather than as a timeout.
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
            return Err(match thread.join() {
                Err(cause) => crate::error::panicked("starting the AF_XDP engine", &*cause),
                Ok(()) => DatapathError::Disconnected,
            });
        }
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            return Err(DatapathError::Timeout("starting the AF_XDP engine"))
        }
    };
    Ok((
        ShardThread {
            handle: Handle { cmds: cmd_tx, wake },
            thread: Some(thread),
            counters,
        },
        opened,
    ))
}

impl XdpEngine {
    /// Starts the engine on `ifname` (in the calling thread's network namespace): one thread
    /// for every queue, or with [`XdpEngineConfig::shard_per_queue`] one thread per queue
    /// (named `iwxdp<queue>-<ifname>`: the queue first, as Linux keeps 15 octets of a thread's
    /// name), and waits until their drivers are open. Needs root (XDP, AF_XDP).
    pub fn start(ifname: &str, cfg: XdpEngineConfig) -> Result<XdpEngine, DatapathError> {
        let iface = Iface::of(ifname)?;
        let budget = ReassemblyBudget::new(cfg.reassembly_budget);
        if !cfg.shard_per_queue {
            let ifname_owned = ifname.to_owned();
            let driver = cfg.driver.clone();
            let open: Opener = Box::new(move || XdpTcp::open(&ifname_owned, driver));
            let name = format!("iwxdp-{ifname}");
            let max_connections = cfg.driver.max_connections;
            let failure = Arc::new(FailureNotice::default());
            let shared = ShardsShared::new(1, failure.clone());
            let (shard, (local_ip, mtu)) =
                spawn_shard(name, open, cfg.clone(), budget, 0, cfg.cpu, shared)?;
            let mtu = mtu.min(cfg.tcp.path_mtu);
            tracing::info!(iface = ifname, %local_ip, mtu, shards = 1, "AF_XDP engine started");
            return Ok(XdpEngine {
                shards: vec![shard],
                next: AtomicUsize::new(0),
                local_ip,
                mtu,
                max_connections,
                failure,
                iface,
            });
        }
        // The drivers are opened here (the threads inherit this thread's namespace) and each
        // moves to its thread; the last one to end detaches the program, on a shard thread.
        let drivers = XdpTcp::open_shards(ifname, cfg.driver.clone())?;
        let shared = ShardsShared::new(drivers.len(), Arc::new(FailureNotice::default()));
        let mut engine = XdpEngine {
            shards: Vec::with_capacity(drivers.len()),
            next: AtomicUsize::new(0),
            local_ip: Ipv4Addr::UNSPECIFIED,
            mtu: cfg.tcp.path_mtu,
            max_connections: 0,
            failure: shared.failure.clone(),
            iface,
        };
        for (i, driver) in drivers.into_iter().enumerate() {
            let queue = driver.queues().first().copied().unwrap_or(0);
            let pin = match cfg.cpus.as_slice() {
                [] => cfg.cpu,
                cpus => Some(cpus[i % cpus.len()]),
            };
            let open: Opener = Box::new(move || Ok(driver));
            let (shard, (ip, mtu)) = spawn_shard(
                format!("iwxdp{queue}-{ifname}"),
                open,
                cfg.clone(),
                budget.clone(),
                i,
                pin,
                shared.clone(),
            )?;
            engine.local_ip = ip;
            engine.mtu = engine.mtu.min(mtu);
            engine.max_connections += cfg.driver.max_connections;
            engine.shards.push(shard);
        }
        tracing::info!(
            iface = ifname,
            local_ip = %engine.local_ip,
            mtu = engine.mtu,
            shards = engine.shards.len(),
            "AF_XDP engine started"
        );
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

    /// The MTU the engine's TCP uses: the interface's when the engine started, as much of it
    /// as its UMEM frames hold, at most [`XdpEngineConfig::tcp`]'s `path_mtu` (the smallest
    /// of its shards'; RFC 9293 3.7.1's MSS derives from it; path MTU discovery may lower it
    /// per connection). A later change of the interface's MTU is not seen.
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// The interface's MAC address when the engine started (the port's GID, as iWARP
    /// devices derive it).
    pub fn mac(&self) -> [u8; 6] {
        self.iface.mac
    }

    /// Whether the interface is up and has a carrier now (`IFF_UP` and `IFF_LOWER_UP`); false
    /// if it cannot be looked up (gone, or netlink failed). Asked by its index, so another
    /// interface given its name later is not taken for it.
    pub fn link_up(&self) -> bool {
        let mut query = self.iface.query.lock().unwrap_or_else(|e| e.into_inner());
        match query.link_up(self.iface.index) {
            Ok(up) => up,
            Err(e) => {
                tracing::debug!(ifname = %self.iface.name, error = %e, "link state unknown");
                false
            }
        }
    }

    /// Checks that the kernel's route to `dst` leaves through the engine's interface (what
    /// `rdma_resolve_addr` finds out on the engine; its local address is then the engine's),
    /// in the engine's network namespace, whichever the caller's thread is in.
    pub(crate) fn route_check(&self, dst: Ipv4Addr) -> Result<(), DatapathError> {
        let handle = &self
            .shards
            .first()
            .ok_or(DatapathError::Disconnected)?
            .handle;
        let (reply, rx) = crossbeam_channel::bounded(1);
        handle.call(
            EngineCmd::RouteCheck { dst, reply },
            rx,
            ENGINE_ANSWER_WAIT,
            "checking the route",
        )
    }

    /// Resolves the next hop's MAC toward `dst` through the engine's interface (the kernel's
    /// neighbour resolution in the engine's network namespace, waiting up to the driver's
    /// `neighbour_timeout`, off the engine thread), then calls `done` with the outcome, always
    /// once: `rdma_resolve_route` on the engine. An engine that has stopped, or stops first,
    /// gives [`DatapathError::Disconnected`].
    pub(crate) fn resolve_route(
        &self,
        dst: Ipv4Addr,
        done: impl FnOnce(Result<(), DatapathError>) + Send + 'static,
    ) {
        let done = RouteDone::new(done);
        match self.shards.first() {
            // A command the engine no longer takes is dropped, and its drop tells `done`.
            Some(shard) => {
                let _ = shard.handle.send(EngineCmd::ResolveRoute { dst, done });
            }
            None => done.tell(Err(DatapathError::Disconnected)),
        }
    }

    /// The most connections the engine holds at once, over all its shards
    /// ([`crate::xdp_tcp::XdpTcpConfig::max_connections`] each).
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Listens on `port` (reserved with the kernel and steered to the engine; port 0: a port
    /// the kernel picks, [`Listener::local_addr`] says which); every shard listens, and the
    /// connections of all of them come to the one [`Listener`].
    pub fn listen(&self, port: u16, params: ConnectParams) -> Result<Listener, DatapathError> {
        params.check_listen()?;
        let (req_tx, req_rx) = crossbeam_channel::bounded(params.backlog.max(1));
        let record = Arc::new(ListenRecord::default());
        let mut port = port;
        for (i, shard) in self.shards.iter().enumerate() {
            let (tx, rx) = handover();
            let cmd = EngineCmd::Listen {
                port,
                params: params.clone(),
                requests: req_tx.clone(),
                record: record.clone(),
                reply: tx,
            };
            // The first shard reserves the port (picks it, for port 0); the others share it.
            // A shard that answers after this call gave up stops listening itself.
            match shard
                .handle
                .send(cmd)
                .and_then(|()| rx.wait(params.setup_timeout, "starting to listen"))
            {
                Ok(bound) => port = bound,
                Err(e) => {
                    // The shards that listen already stop (no listener is handed out).
                    for earlier in &self.shards[..i] {
                        let _ = earlier.handle.send(EngineCmd::Unlisten { port });
                    }
                    return Err(e);
                }
            }
        }
        tracing::info!(local = %SocketAddr::from((self.local_ip, port)), "listening (AF_XDP engine)");
        Ok(Listener::from_provider(
            Box::new(XdpListen {
                rx: req_rx,
                handles: self.shards.iter().map(|s| s.handle.clone()).collect(),
                local: SocketAddr::from((self.local_ip, port)),
            }),
            params,
            record,
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
        self.connect_with_recvs(addr, pd, cq, params, private_data, Vec::new())
    }

    /// [`XdpEngine::connect`] with `recvs` posted before the peer can send anything: see
    /// [`crate::Device::connect_with_recvs`].
    pub fn connect_with_recvs(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
        private_data: &[u8],
        recvs: Vec<RecvWr>,
    ) -> Result<Connection, DatapathError> {
        let start = QpStart::with_recvs(recvs);
        self.start_connect(addr, pd, cq, params, private_data, start)?()
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
        start: QpStart,
    ) -> Result<PendingConnect, DatapathError> {
        let SocketAddr::V4(addr) = addr else {
            return Err(DatapathError::InvalidArgument(
                "the AF_XDP engine speaks IPv4 only",
            ));
        };
        if let Some(local) = params.local_addr {
            if !local.ip().is_unspecified() && local.ip() != std::net::IpAddr::from(self.local_ip())
            {
                return Err(DatapathError::InvalidArgument(
                    "the AF_XDP engine connects from its interface's address only",
                ));
            }
        }
        // As the socket transport does: refused here, nothing of the connection is made.
        check_connect(params, pd, private_data, &start.recvs)?;
        let n = self.next.fetch_add(1, Ordering::Relaxed) % self.shards.len().max(1);
        let handle = &self
            .shards
            .get(n)
            .ok_or(DatapathError::Disconnected)?
            .handle;
        let cqs = CqSink::new(cq, params.recv_cq.as_ref());
        cqs.attach(handle.wake.clone());
        let (tx, rx) = handover();
        let cmd = EngineCmd::Connect(Box::new(ConnectCmd {
            addr,
            pd: pd.clone(),
            cq: cqs,
            params: params.clone(),
            private_data: private_data.to_vec(),
            start,
            deadline: crate::verbs::timeout::deadline_after(params.setup_timeout),
            reply: tx,
        }));
        // The engine fails the connect itself at the deadline (next-hop resolution, TCP's
        // handshake and the MPA exchange together): this waits a little longer for that
        // outcome, so that the engine, not a caller who gave up, ends the attempt and the
        // receives posted with it are not reported flushed while the engine still holds them
        // (unless the engine thread stalls for seconds).
        let wait = params.setup_timeout.saturating_add(Duration::from_secs(5));
        handle.send(cmd)?;
        tracing::info!(peer = %addr, shard = n, "connecting (AF_XDP engine)");
        Ok(Box::new(move || {
            let (parts, private_data) = rx.wait(wait, "connecting")?;
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
        let mut zero_copy = !self.shards.is_empty();
        for shard in &self.shards {
            let mut c = shard
                .counters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let w = &shard.handle.wake;
            c.app_turns = w.app_turns.load(Ordering::Relaxed);
            c.thread_turns = w.thread_turns.load(Ordering::Relaxed);
            c.parked_wakes = w.parked_wakes.load(Ordering::Relaxed);
            c.watchdog_wakes = w.watchdog_wakes.load(Ordering::Relaxed);
            zero_copy &= c.zero_copy;
            sum.add(&c);
            if self.shards.len() > 1 {
                sum.shard_drivers.push(c.driver);
            }
        }
        sum.zero_copy = zero_copy;
        sum
    }

    /// Calls `hook` when one of the engine's threads fails (a panic or a fatal driver error:
    /// its queue pairs end with [`crate::QpError::EngineFailed`]), once for the engine; at
    /// once if one has failed already. Not when the engine is stopped. Replaces an earlier
    /// hook.
    pub(crate) fn on_failure(&self, hook: FailureHook) {
        self.failure.set(hook);
    }

    /// Makes every engine thread panic in its next turn, to test what the application sees
    /// when the engine fails: every queue pair flushed with [`crate::QpError::EngineFailed`], later
    /// posts refused, XDP detached.
    #[doc(hidden)]
    pub fn inject_panic(&self) {
        for shard in &self.shards {
            let _ = shard.handle.send(EngineCmd::Panic);
        }
    }

    /// Makes the next engine turn run on an application thread (inline progress: a poll of a
    /// completion queue or a post while the engine thread is parked) panic, to test that such
    /// a panic fails the engine as one on the engine thread does, and does not unwind into the
    /// application's call.
    #[doc(hidden)]
    pub fn inject_inline_panic(&self) {
        for shard in &self.shards {
            shard
                .handle
                .wake
                .panic_inline
                .store(true, Ordering::Relaxed);
        }
    }

    /// Stops the engine: closes every connection (gracefully for up to a second, no longer than
    /// the closing exchanges take: a connection in TIME-WAIT or closed is done), detaches XDP
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
