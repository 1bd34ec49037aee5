//! The engine's settings ([`XdpEngineConfig`]) and its published counters ([`EngineCounters`],
//! summed over shards and connections).

use std::time::Duration;

use crate::engine::{ConnConfig, ConnCounters};
#[cfg(doc)]
use crate::verbs::cq::CompletionQueue;
use crate::xdp_tcp::{TcpConfig, XdpTcpConfig, XdpTcpStats};

/// Settings of an [`XdpEngine`](super::XdpEngine).
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
    /// Octets all the engine's connections may hold out of order together (their reassembly
    /// stores, [`ConnConfig::reassembly_budget`]): a store takes `reassembly_capacity` of it
    /// when data first waits in it and gives it back once it has stayed empty for a second
    /// or its connection ends. With the budget spent, data that arrives out of order is given
    /// back to TCP (which has the peer send it again) instead of held, as a kernel under
    /// memory pressure prunes its out-of-order queue: a peer that opens many connections and
    /// sends each a segment out of order makes the engine hold at most this much. Default
    /// 256 MiB (256 connections recovering from loss at once with the default 1 MiB store).
    pub reassembly_budget: usize,
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
    /// while it keeps doing so the engine thread parks (sleeps on its wake-up socket and a
    /// watchdog timer that the application's polls keep pushing forward, see
    /// [`park_max`](Self::park_max)), so the poller is the only thread on its core and a
    /// received frame is placed and completed by the thread that waits for it; a work request
    /// posted meanwhile is transmitted by the posting thread. A blocking
    /// [`CompletionQueue::wait`] unparks the engine thread first. Default on.
    pub inline_progress: bool,
    /// Inline progress: the most the connections' progress (received frames, timers) waits
    /// once the application stops polling without blocking in [`CompletionQueue::wait`] (to
    /// compute, or to sleep). The parked engine thread's watchdog expires this long after its
    /// last push, and the application's polls push it (one system call, which on a virtual
    /// machine reprograms the core's timer) once half of this has passed since the last push,
    /// in a poll that found nothing to do, or once three quarters have in any poll: shorter
    /// means more pushes (at 2 ms, a write-lat p99 twice as long on the veth bed), longer
    /// means progress waits longer. At least 1 ms (a smaller value is raised to it). Default
    /// 4 ms (below an engine peer's 5 ms minimum retransmission timeout).
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
            reassembly_budget: 256 << 20,
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
    /// engine thread was parked ([`XdpEngineConfig::inline_progress`]; posting turns are in
    /// `driver.posting_turns` too); live.
    pub app_turns: u64,
    /// Engine turns run by the engine thread; live.
    pub thread_turns: u64,
    /// Times the engine thread parked because application threads drove its turns.
    pub parks: u64,
    /// Times the parked engine thread woke: its watchdog expired, a command or a work request
    /// nobody took came, the application blocked in a wait, or (every 50 ms) to publish these
    /// counters. Each is a context switch on a core the application may be polling on; live.
    pub parked_wakes: u64,
    /// Of those, the wakes by its watchdog ([`XdpEngineConfig::park_max`]): the application
    /// stopped polling and left the engine thread parked, so whatever came meanwhile waited
    /// up to that long; live.
    pub watchdog_wakes: u64,
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
    /// Every AF_XDP socket of the engine runs in zero-copy mode (the default bind asks for it
    /// where the driver offers it); false: copy mode, as on veth.
    pub zero_copy: bool,
    /// The mode the steering program runs in (native `driver` XDP, or `generic` XDP on the
    /// kernel's socket buffers, slower), as attached with
    /// [`XdpTcpConfig::attach_mode`](crate::xdp_tcp::XdpTcpConfig::attach_mode); `None` until
    /// the engine has published its counters once.
    pub xdp_mode: Option<crate::xsk::steering::ActiveMode>,
}

impl EngineCounters {
    /// Adds one shard's counters to these.
    pub(super) fn add(&mut self, o: &EngineCounters) {
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
        self.parked_wakes += o.parked_wakes;
        self.watchdog_wakes += o.watchdog_wakes;
        self.idle_ns += o.idle_ns;
        // One program serves every shard of the interface.
        self.xdp_mode = self.xdp_mode.or(o.xdp_mode);
    }
}

/// Adds one connection's counters to `sum` (the peaks as maxima). Every field is named, so a
/// counter added to `ConnCounters` cannot be left out here.
pub(super) fn add_counters(sum: &mut ConnCounters, c: &ConnCounters) {
    let ConnCounters {
        segments,
        segments_out_of_order,
        fpdus_rx,
        fpdus_tx,
        bytes_placed_in_order,
        bytes_placed_out_of_order,
        fpdus_placed_out_of_order,
        held_bytes,
        held_peak,
        held_total,
        held_run_peak,
        held_gap_peak,
        held_peak_gaps,
        unlocated_segments,
        rescanned_bytes,
        rescans_deferred,
        held_timeouts,
        store_releases,
        store_refusals,
        crc_errors,
        retransmissions,
        rto_expirations,
        loss_probes,
        fast_recoveries,
        spurious_undone,
        paws_drops,
        send_limited_ns,
        terminates_sent,
        terminates_received,
        ift_speculation_confirmed,
        ift_speculation_refused,
        ift_speculation_withdrawn,
        ift_acks_withheld,
        ift_header_crc_errors,
        ift_payload_crc_errors,
    } = *c;
    sum.segments += segments;
    sum.segments_out_of_order += segments_out_of_order;
    sum.fpdus_rx += fpdus_rx;
    sum.fpdus_tx += fpdus_tx;
    sum.bytes_placed_in_order += bytes_placed_in_order;
    sum.bytes_placed_out_of_order += bytes_placed_out_of_order;
    sum.fpdus_placed_out_of_order += fpdus_placed_out_of_order;
    sum.held_bytes += held_bytes;
    if held_peak > sum.held_peak {
        sum.held_peak = held_peak;
        sum.held_peak_gaps = held_peak_gaps;
    }
    sum.held_gap_peak = sum.held_gap_peak.max(held_gap_peak);
    sum.held_run_peak = sum.held_run_peak.max(held_run_peak);
    sum.held_total += held_total;
    sum.unlocated_segments += unlocated_segments;
    sum.rescanned_bytes += rescanned_bytes;
    sum.rescans_deferred += rescans_deferred;
    sum.held_timeouts += held_timeouts;
    sum.store_releases += store_releases;
    sum.store_refusals += store_refusals;
    sum.crc_errors += crc_errors;
    sum.retransmissions += retransmissions;
    sum.rto_expirations += rto_expirations;
    sum.loss_probes += loss_probes;
    sum.fast_recoveries += fast_recoveries;
    sum.spurious_undone += spurious_undone;
    sum.paws_drops += paws_drops;
    for (s, c) in sum.send_limited_ns.iter_mut().zip(send_limited_ns) {
        *s += c;
    }
    sum.terminates_sent += terminates_sent;
    sum.terminates_received += terminates_received;
    sum.ift_speculation_confirmed += ift_speculation_confirmed;
    sum.ift_speculation_refused += ift_speculation_refused;
    sum.ift_speculation_withdrawn += ift_speculation_withdrawn;
    sum.ift_acks_withheld += ift_acks_withheld;
    sum.ift_header_crc_errors += ift_header_crc_errors;
    sum.ift_payload_crc_errors += ift_payload_crc_errors;
}
