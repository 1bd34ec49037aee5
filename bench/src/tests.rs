//! The six tests, client and server sides.
//!
//! Buffers: each side registers one data region of [`Hello::buffer_len`] bytes, filled with its
//! own position-based pattern ([`pattern`]), and a small control region for acknowledgements and
//! credits. Bandwidth tests move message `i` through slot `i % slots`; latency tests ping from
//! offset 0 into the peer's offset `max_size`, with the iteration's stamp in the last byte.
//! A message the sender writes carries its index in its first octets
//! ([`pattern::index_head`]), so that a slot still holding the message of an earlier round is
//! told from the fresh one (send-bw, write-bw when a size has a slot per outstanding request,
//! the ping-pongs); read-bw poisons a slot's first octets once checked, the client of a
//! ping-pong or read-lat its whole landing area.
//! A phase (one size) ends with a zero-length Send from the client; the server checks what
//! arrived and answers with a `PhaseAck` carrying the verdict.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use datapath::engine::XdpEngineConfig;
use datapath::{
    Access, AtomicOp, Completion, CompletionChannel, CompletionQueue, ConnectParams, Device,
    Framing, Listener, MemoryRegion, MpaConfig, ProtectionDomain, QueuePair, RecvWr, SendOp,
    SendRequest, SendWr, SgeList, Stag, WcOpcode, WcStatus,
};
use serde_json::json;

use crate::cli::OutputKind;
use crate::engine_report::EngineReport;
use crate::interrupt;
use crate::live;
use crate::pattern;
use crate::pcap::PcapReport;
use crate::perftest::report;
use crate::proto::{self, Ctrl, Hello, RemoteBuf, CLIENT_SEED, CTRL_LEN, CTRL_SLOTS, SERVER_SEED};
use crate::stats::{self, BandwidthResult, LatencyResult, Part, PeakTimes, SampleWindow};
use crate::{AtomicType, Cli, CqMode, FramingArg, TestKind, Transport};
use datapath::xsk::Capture;

/// How long a test may go without any progress before it gives up.
const STALL: Duration = Duration::from_secs(30);

/// How long a latency loop polls its completion queue without giving up the CPU: a
/// `sched_yield` costs about a microsecond (most of it in the scheduler even when nothing else
/// wants the core), which is the size of what the latency tests measure. Past this, it yields
/// at every empty poll, so that an engine thread sharing its core gets to run.
const SPIN_BEFORE_YIELD: Duration = Duration::from_micros(50);

/// Polls that found nothing since the last progress: spins, then yields, and says when the
/// wait has lasted [`STALL`]. The clock is read every 32nd empty poll only while spinning (a
/// reading costs as much as a poll of an idle engine).
struct Idle {
    polls: u32,
    since: Option<Instant>,
    yielding: bool,
}

impl Idle {
    fn new() -> Self {
        Idle {
            polls: 0,
            since: None,
            yielding: false,
        }
    }

    /// After an empty poll; true once the wait has lasted [`STALL`].
    fn wait(&mut self) -> bool {
        self.polls = self.polls.wrapping_add(1);
        if self.yielding {
            std::thread::yield_now();
        } else if !self.polls.is_multiple_of(32) {
            std::hint::spin_loop();
            return false;
        }
        let waited = self.since.get_or_insert_with(Instant::now).elapsed();
        self.yielding = waited > SPIN_BEFORE_YIELD;
        waited > STALL
    }

    /// After a poll that found something.
    fn reset(&mut self) {
        *self = Idle::new();
    }
}

// wr_id kinds (top byte) so completions say what they were for.
const K_DATA: u64 = 1 << 56;
const K_CTRL_RECV: u64 = 2 << 56;
const K_DATA_RECV: u64 = 3 << 56;
const K_CTRL_SEND: u64 = 4 << 56;
const K_DONE: u64 = 5 << 56;
const KIND_MASK: u64 = 0xFF << 56;

fn stamp(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

fn connect_params(cli: &Cli) -> ConnectParams {
    let mut mpa = MpaConfig {
        rev: cli.mpa_rev,
        crc: cli.crc.on(),
        markers: cli.markers.on(),
        ..MpaConfig::default()
    };
    if let Some(o) = cli.more.outs {
        // perftest's -o sets both (rdma_cm's `initiator_depth` and `responder_resources`):
        // the client's ORD, the server's IRD, which bounds the client's in the exchange.
        (mpa.ird, mpa.ord) = (o, o);
    }
    let framing = match cli.framing {
        FramingArg::Mpa => Framing::Mpa,
        FramingArg::Ift => Framing::Ift(ift::IftConfig {
            header_crc: cli.crc.on(),
            payload_crc: cli.crc.on(),
            ..ift::IftConfig::with_vtag(0)
        }),
    };
    ConnectParams {
        framing,
        mpa,
        setup_timeout: cli.setup_timeout(),
        rdmap_extensions: cli.test.is_atomic() || cli.imm(),
        tos: cli.compat.tos.unwrap_or(0),
        ..ConnectParams::default()
    }
}

/// Completion channel events `-e` waited for (reported with the results).
static EVENTS_WAITED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Blocking waits on a completion queue (`CompletionQueue::wait`), reported with the results
/// (`"cq_blocking_waits"`): none with `--cq poll`.
static CQ_BLOCKING_WAITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The side's completion queue: with `-e` created on a completion channel.
fn completion_queue(
    use_event: bool,
) -> Result<(CompletionQueue, Option<CompletionChannel>), String> {
    if !use_event {
        return Ok((CompletionQueue::new(), None));
    }
    let ch = CompletionChannel::new().map_err(|e| format!("a completion channel: {e}"))?;
    Ok((CompletionQueue::with_channel(&ch), Some(ch)))
}

/// One side of a running test.
struct Side {
    qp: QueuePair,
    cq: CompletionQueue,
    data: MemoryRegion,
    ctrl: MemoryRegion,
    remote: RemoteBuf,
    hello: Hello,
    ctrl_posted: u64,
    ctrl_sent: u64,
    /// `--cq poll`: [`next`](Self::next) polls instead of blocking.
    poll: bool,
    /// `-e`: [`next`](Self::next) waits on this completion channel (the queue is armed with
    /// `req_notify` before each wait).
    channel: Option<CompletionChannel>,
    /// Progress may be a bar on a terminal (not with `--stats-every`, whose lines would tear
    /// through it).
    progress_bar: bool,
    /// Progress shown at all (not for one of several connections run at once: `-q`, `-b`).
    progress: bool,
    /// Bandwidth tests: one work request in this many is signaled (`--cq-mod`, at most the
    /// send queue depth).
    cq_mod: u64,
    /// Buffer for checking received data (grown once to the largest check, at most
    /// [`CHECK_CHUNK`] octets), so a check per message does not allocate.
    scratch: std::cell::RefCell<Vec<u8>>,
    /// atomic-bw and atomic-lat (client): the operation.
    atomic_type: AtomicType,
    /// Longest wait for one completion before the run fails ([`STALL`]); `None`: as long as
    /// the connection lives (a bandwidth test's server sees no completion until the client's
    /// phase-done Send, however long the client runs; a dead peer ends the connection).
    stall: Option<Duration>,
    /// `-b`'s reverse connection, checking side: the sender's measurement of each size.
    reports: Vec<BandwidthResult>,
    /// `--report_gbits`: rows in Gb/s.
    report_gbits: bool,
    /// `-l`: bandwidth tests post their work requests in lists of this many
    /// ([`QueuePair::post_send_list`]).
    post_list: usize,
    /// `-I`: Sends and Writes of at most this many octets are posted inline (0: none).
    inline_size: u64,
    /// `--framing ift`: the region the hello and the welcome went through.
    setup: Option<MemoryRegion>,
    /// Bandwidth tests: keep post and completion times for perftest's peak where it is
    /// measured (not with `-N`).
    peak: bool,
    /// `--output`: result lines as one number.
    output: Option<OutputKind>,
}

/// Receives a write-bw server keeps posted for Immediate Data beyond the phase-done Send and a
/// spare: the client's initial credit (RFC 5041 has no receiver-not-ready retry).
const IMM_CREDITS: u64 = CTRL_SLOTS as u64 - 2;

impl Side {
    /// A side of `cli`'s run on a connected queue pair: its completion queue (and `-e`'s
    /// channel), its data and control regions, the peer's buffer, the run's hello; as a client
    /// waits (no control receive posted yet, [`STALL`] per completion).
    fn new(
        cli: &Cli,
        qp: QueuePair,
        (cq, channel): (CompletionQueue, Option<CompletionChannel>),
        (data, ctrl): (MemoryRegion, MemoryRegion),
        remote: RemoteBuf,
        hello: Hello,
    ) -> Side {
        Side {
            qp,
            cq,
            data,
            ctrl,
            remote,
            hello,
            ctrl_posted: 0,
            ctrl_sent: 0,
            poll: cli.cq == CqMode::Poll,
            channel,
            progress_bar: cli.stats_every.is_none(),
            progress: true,
            cq_mod: u64::from(cli.cq_mod()),
            scratch: Default::default(),
            atomic_type: cli.atomic_type(),
            stall: Some(STALL),
            reports: Vec::new(),
            report_gbits: cli.compat.report_gbits,
            post_list: cli.post_list as usize,
            inline_size: cli.compat.inline_size.map_or(0, u64::from),
            setup: None,
            peak: !cli.compat.no_peak,
            output: cli.more.output,
        }
    }

    /// A latency loop's next completion: polled (`None` while there is none), or with `-e`
    /// waited for on the completion channel (the queue armed first), as perftest's latency
    /// tests wait with `-e`; that wait fails after [`STALL`] (or with the connection).
    fn lat_next(&self) -> Result<Option<Completion>, String> {
        match self.channel {
            Some(_) => self.next().map(Some),
            None => self.try_next(),
        }
    }

    /// The next control message (other completions passed over), its receive posted again.
    fn next_ctrl(&mut self) -> Result<Option<Ctrl>, String> {
        loop {
            let c = self.next()?;
            if c.wc.opcode == WcOpcode::Recv && c.wc.wr_id & KIND_MASK == K_CTRL_RECV {
                let msg = self.read_ctrl(c.wc.wr_id);
                self.post_ctrl_recv()?;
                return Ok(msg);
            }
        }
    }

    fn max_size(&self) -> u64 {
        self.hello.sizes.iter().copied().max().unwrap_or(1)
    }

    fn fail_reason(&self) -> String {
        let st = self.qp.status();
        let mut s = format!("queue pair {:?}", st.state);
        if let Some(t) = st.remote_terminate {
            s += &format!("; peer sent Terminate {t:?}");
        }
        if let Some(t) = st.sent_terminate {
            s += &format!("; we sent Terminate {t:?}");
        }
        if let Some(e) = st.error {
            s += &format!("; {e}");
        }
        s
    }

    /// Next completion, waiting (blocking, or polling with `--cq poll`) up to [`STALL`];
    /// errors on a failed completion or a dead QP.
    fn next(&self) -> Result<Completion, String> {
        self.next_by(self.poll)
    }

    /// Like [`next`](Self::next) but polls (`try_next`, yielding the CPU between empty polls)
    /// instead of blocking, for latency tests.
    fn next_polling(&self) -> Result<Completion, String> {
        self.next_by(true)
    }

    /// `-e`: a completion if one is queued; otherwise arms the queue, looks once more (one
    /// may have come between the look and the arming, and would fire no event), and waits up
    /// to 20 ms on the channel's descriptor, as a verbs program does with
    /// `ibv_req_notify_cq` and `ibv_get_cq_event`.
    fn next_event(&self, ch: &CompletionChannel) -> Result<Option<Completion>, String> {
        if let Some(c) = self.cq.try_next() {
            return Ok(Some(c));
        }
        self.cq.req_notify(false).map_err(|e| e.to_string())?;
        if let Some(c) = self.cq.try_next() {
            return Ok(Some(c));
        }
        if ch.wait_event(Duration::from_millis(20)).is_some() {
            EVENTS_WAITED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(self.cq.try_next())
    }

    /// The next completion, by polling (`try_next` and a yield per empty poll) or by blocking
    /// waits of 20 ms, until [`STALL`] passes or the connection ends.
    fn next_by(&self, polling: bool) -> Result<Completion, String> {
        let deadline = self.stall.map(|d| Instant::now() + d);
        let mut idle = Idle::new();
        loop {
            let got = if polling {
                self.cq.try_next()
            } else if let Some(ch) = &self.channel {
                self.next_event(ch)?
            } else {
                CQ_BLOCKING_WAITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.cq.wait(Duration::from_millis(20))
            };
            if let Some(c) = got {
                return check(c, self);
            }
            if self.qp.status().finished {
                if let Some(c) = self.cq.try_next() {
                    return check(c, self);
                }
                return Err(format!("connection ended: {}", self.fail_reason()));
            }
            if let (Some(deadline), Some(stall)) = (deadline, self.stall) {
                if Instant::now() > deadline {
                    return Err(format!(
                        "no completion for {stall:?}: {}",
                        self.fail_reason()
                    ));
                }
            }
            if polling {
                // The deadline above bounds this wait.
                let _ = idle.wait();
            }
        }
    }

    /// Like [`next`](Self::next) but never blocks: spins (yielding the CPU) for latency tests.
    fn try_next(&self) -> Result<Option<Completion>, String> {
        match self.cq.try_next() {
            Some(c) => check(c, self).map(Some),
            None => Ok(None),
        }
    }

    fn post_ctrl_recv(&mut self) -> Result<(), String> {
        let slot = self.ctrl_posted % CTRL_SLOTS as u64;
        self.ctrl_posted += 1;
        self.qp
            .post_recv(ctrl_recv(&self.ctrl, slot))
            .map_err(|e| e.to_string())
    }

    fn send_ctrl(&mut self, msg: Ctrl) -> Result<(), String> {
        // The control region's second half holds outgoing messages.
        let slot = CTRL_SLOTS as u64 + self.ctrl_sent % CTRL_SLOTS as u64;
        self.ctrl_sent += 1;
        let off = slot as usize * CTRL_LEN;
        self.ctrl.write(off, &msg.encode());
        self.qp
            .post_send(SendWr {
                wr_id: K_CTRL_SEND | slot,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sg_list: self.ctrl.sge(off, CTRL_LEN as u32).into(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| e.to_string())
    }

    /// One more receive is posted again for the client: tells it once a quarter of `window`
    /// has gathered (`since` counts them).
    fn credit_back(&mut self, since: &mut u64, window: u64) -> Result<(), String> {
        *since += 1;
        if *since >= (window / 4).max(1) {
            self.send_ctrl(Ctrl::Credit { n: *since as u32 })?;
            *since = 0;
        }
        Ok(())
    }

    fn read_ctrl(&self, wr_id: u64) -> Option<Ctrl> {
        let slot = (wr_id & !KIND_MASK) as usize;
        let mut b = [0u8; CTRL_LEN];
        self.ctrl.read(slot * CTRL_LEN, &mut b);
        Ctrl::decode(&b)
    }

    fn post_data(
        &self,
        wr_id: u64,
        op: SendOp,
        offset: u64,
        len: u64,
        signaled: bool,
    ) -> Result<(), String> {
        self.post_wr(SendWr {
            wr_id,
            op,
            sg_list: self.data.sge(offset as usize, len as u32).into(),
            signaled,
            fence: false,
        })
    }

    /// Posts a work request on the data region, inline when `-I` covers it.
    fn post_wr(&self, wr: SendWr) -> Result<(), String> {
        match self.request(wr) {
            SendRequest::Inline(inline) => self.qp.post_send_inline(inline),
            SendRequest::Wr(wr) => self.qp.post_send(wr),
        }
        .map_err(|e| e.to_string())
    }

    /// `wr` inline when `-I` covers it, as it is otherwise.
    fn request(&self, wr: SendWr) -> SendRequest {
        crate::inline::request(wr, &self.data, self.inline_size)
    }

    fn remote_stag(&self) -> Stag {
        Stag(self.remote.stag)
    }

    /// A Write of the message at `off` to the peer's `to`, with Immediate Data `i` when the
    /// run asked for it.
    fn write_op(&self, to: u64, i: u64) -> SendOp {
        let remote_stag = self.remote_stag();
        if self.hello.imm {
            SendOp::WriteImmediate {
                remote_stag,
                remote_to: to,
                solicited: false,
                immediate: i,
            }
        } else {
            SendOp::Write {
                remote_stag,
                remote_to: to,
            }
        }
    }

    /// A Send, followed by Immediate Data `i` when the run asked for it.
    fn send_op(&self, i: u64) -> SendOp {
        if self.hello.imm {
            SendOp::SendImmediate {
                solicited: false,
                immediate: i,
            }
        } else {
            SendOp::Send {
                solicited: false,
                invalidate: None,
            }
        }
    }

    /// The `i`-th Atomic Operation of a phase on the server's counter (its first word), which
    /// then holds `i`: FetchAdd of 1, or CmpSwap of `i` with `i + 1`. Its original value must
    /// be `i`.
    fn atomic(&self, i: u64) -> SendOp {
        SendOp::Atomic {
            remote_stag: self.remote_stag(),
            remote_to: self.remote.to,
            op: match self.atomic_type {
                AtomicType::FetchAndAdd => AtomicOp::fetch_add(1),
                AtomicType::CmpAndSwap => AtomicOp::cmp_swap(i, i + 1),
            },
        }
    }

    /// The original value an Atomic Operation wrote into the 8 octets at `off`.
    fn original(&self, off: u64) -> u64 {
        let mut b = [0u8; 8];
        self.data.read(off as usize, &mut b);
        u64::from_ne_bytes(b)
    }

    fn send_done(&self) -> Result<(), String> {
        self.qp
            .post_send(SendWr {
                wr_id: K_DONE,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sg_list: SgeList::new(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| e.to_string())
    }

    fn fill(&self, seed: u64, off: u64, len: u64) {
        fill(&self.data, &mut self.scratch.borrow_mut(), seed, off, len)
    }

    /// Marks the message of `len` octets at `off` (carrying `seed`'s pattern at the same
    /// offsets) as message `index`: [`pattern::index_head`] over its first octets.
    fn write_index(&self, seed: u64, off: u64, index: u64, len: u64) {
        let (head, n) = pattern::index_head(seed, off, index, len as usize);
        self.data.write(off as usize, &head[..n]);
    }

    /// Overwrites `[off, off + len)` with the complement of `seed`'s pattern at `pattern_off`
    /// (no octet of it what a check of that pattern expects), so that what lands there next
    /// is seen to land.
    fn poison(&self, seed: u64, off: u64, pattern_off: u64, len: u64) {
        let scratch = &mut self.scratch.borrow_mut();
        poison_range(&self.data, scratch, seed, off, pattern_off, len)
    }

    /// First mismatch of the message at `off` against message `index` of `seed`'s pattern at
    /// `pattern_off` ([`pattern::first_message_mismatch`]); `index` `None`: the pattern alone.
    fn message_mismatch(
        &self,
        seed: u64,
        off: u64,
        pattern_off: u64,
        len: u64,
        index: Option<u64>,
    ) -> Option<u64> {
        let n = match index {
            Some(i) => {
                // The head here, the rest in chunks below.
                let n = len.min(8) as usize;
                let mut got = [0u8; 8];
                self.data.read(off as usize, &mut got[..n]);
                if let Some(k) = pattern::first_message_mismatch(seed, pattern_off, i, &got[..n]) {
                    return Some(k as u64);
                }
                n as u64
            }
            None => 0,
        };
        self.mismatch(seed, off + n, pattern_off + n, len - n)
            .map(|i| i + n)
    }

    fn mismatch(&self, seed: u64, off: u64, pattern_off: u64, len: u64) -> Option<u64> {
        mismatch(
            &self.data,
            &mut self.scratch.borrow_mut(),
            seed,
            off,
            pattern_off,
            len,
        )
    }
}

/// Most octets a fill or check copies at a time.
const CHECK_CHUNK: u64 = 1 << 20;

/// `scratch` grown to `min(len, CHECK_CHUNK)` octets, the chunk a fill or check of `len` works in.
fn chunk_of(scratch: &mut Vec<u8>, len: u64) -> &mut [u8] {
    let n = len.min(CHECK_CHUNK) as usize;
    if scratch.len() < n {
        scratch.resize(n, 0);
    }
    &mut scratch[..n]
}

/// Fills `[off, off + len)` of `mr` with `seed`'s pattern at the same offsets.
fn fill(mr: &MemoryRegion, scratch: &mut Vec<u8>, seed: u64, off: u64, len: u64) {
    let chunk = chunk_of(scratch, len);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        pattern::fill(seed, off + done, &mut chunk[..n]);
        mr.write((off + done) as usize, &chunk[..n]);
        done += n as u64;
    }
}

/// Whether a bandwidth test's messages of `size` carry their index (the sender rewrites a
/// slot's first octets before each message through it): only when the size has a slot per
/// outstanding request, so that no message still being sent is rewritten.
fn indexed(hello: &Hello, size: u64) -> bool {
    hello.slots(size) >= u64::from(hello.tx_depth)
}

/// First mismatch of `[off, off + len)` of `mr` against `seed`'s pattern at `pattern_off`.
fn mismatch(
    mr: &MemoryRegion,
    scratch: &mut Vec<u8>,
    seed: u64,
    off: u64,
    pattern_off: u64,
    len: u64,
) -> Option<u64> {
    let chunk = chunk_of(scratch, len);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        mr.read((off + done) as usize, &mut chunk[..n]);
        if let Some(i) = pattern::first_mismatch(seed, pattern_off + done, &chunk[..n]) {
            return Some(done + i as u64);
        }
        done += n as u64;
    }
    None
}

fn check(c: Completion, side: &Side) -> Result<Completion, String> {
    if c.wc.status == WcStatus::Success {
        Ok(c)
    } else {
        Err(format!(
            "work request {:#x} ({:?}) completed with {:?}: {}",
            c.wc.wr_id,
            c.wc.opcode,
            c.wc.status,
            side.fail_reason()
        ))
    }
}

fn register(pd: &ProtectionDomain, hello: &Hello) -> Result<(MemoryRegion, MemoryRegion), String> {
    let mut access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    if hello.test.is_atomic() {
        access |= Access::REMOTE_ATOMIC;
    }
    let data = pd
        .register(hello.buffer_len() as usize, access)
        .map_err(|e| e.to_string())?;
    let ctrl = pd
        .register(2 * CTRL_SLOTS * CTRL_LEN, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    crate::net::note_unpinned(&data);
    crate::net::note_unpinned(&ctrl);
    Ok((data, ctrl))
}

fn describe(cli: &Cli, side: &Side) -> String {
    let what = match (
        cli.test.is_atomic(),
        cli.server.is_some(),
        cli.atomic_type(),
    ) {
        (true, true, AtomicType::FetchAndAdd) => format!("{} (FetchAdd)", cli.test.name()),
        (true, true, AtomicType::CmpAndSwap) => format!("{} (CmpSwap)", cli.test.name()),
        _ => cli.test.name().to_string(),
    };
    format!(
        "{} over the {} transport: {}, MULPDU {}",
        what,
        cli.transport.name(),
        crate::net::describe_agreed(&side.qp),
        side.qp.mulpdu()
    )
}

// ---------------------------------------------------------------------------------------------
// Server

/// The API's device of `--transport`: the AF_XDP engine, with the `--engine-*` options, when
/// `xdp` (it must outlive the queue pair).
fn open_device(cli: &Cli) -> Result<(Device, Option<Capture>), String> {
    let mut cfg = XdpEngineConfig {
        cpu: cli.engine_cpu,
        cpus: cli.engine_cpus.clone(),
        inline_progress: cli.engine_inline.is_none_or(crate::OnOff::on),
        tx_copy: cli.engine_tx_copy,
        ..XdpEngineConfig::default()
    };
    if let Some(t) = cli.engine_threads {
        cfg.shard_per_queue = t == crate::EngineThreads::PerQueue;
    }
    if let Some(n) = cli.engine_ack_every {
        cfg.tcp.ack_every_segments = n;
    }
    if let Some(n) = cli.engine_rx_ring {
        cfg.driver.xsk.rx_ring = n;
    }
    if let Some(n) = cli.engine_tx_ahead {
        cfg.tx_ahead = n as usize;
    }
    if let Some(n) = cli.engine_tx_turn_frames {
        cfg.driver.tx_turn_frames = n;
    }
    if let Some(us) = cli.engine_park_max_us {
        cfg.park_max = std::time::Duration::from_micros(us);
    }
    if let Some(mib) = cli.engine_reassembly_budget_mib {
        cfg.reassembly_budget = usize::try_from(mib << 20).unwrap_or(usize::MAX);
    }
    cfg.driver.xsk.busy_poll = cli.engine_busy_poll.map(|usecs| datapath::xsk::BusyPoll {
        usecs,
        budget: cli.engine_busy_poll_budget.unwrap_or(64),
        prefer: true,
    });
    crate::net::open_device(
        cli.transport,
        cli.iface.as_deref(),
        cli.pcap.as_deref(),
        cli.xdp_mode,
        Box::new(cfg),
    )
}

/// Stops the engine (if any) and returns its counters; without `--json` also prints them on
/// stderr.
fn engine_report(cli: &Cli, device: Device) -> Option<EngineReport> {
    let report = EngineReport::new(&device.close()?);
    if !cli.json {
        eprintln!("iwarp-bench: {}", report.line());
    }
    Some(report)
}

/// Ends a run after its session: stops the engine, then prints the session's JSON object
/// (`--json`) with the engine's counters added as `"engine"`: an object for `--transport
/// xdp`, `null` for the socket transport.
fn finish(
    cli: &Cli,
    (device, capture): (Device, Option<Capture>),
    session: Result<Option<serde_json::Value>, String>,
) -> Result<(), String> {
    let report = engine_report(cli, device);
    let events = EVENTS_WAITED.load(std::sync::atomic::Ordering::Relaxed);
    if cli.compat.use_event && !cli.json {
        eprintln!("iwarp-bench: -e: woken by {events} completion channel events");
    }
    // After the engine has stopped: every frame it handled is in the ring.
    let pcap = capture.map(PcapReport::finish);
    if let Some(p) = &pcap {
        if !cli.json || p.incomplete() {
            eprintln!("iwarp-bench: {}", p.line());
        }
    }
    let Some(mut out) = session? else {
        return Ok(());
    };
    out["engine"] = serde_json::to_value(report).map_err(|e| e.to_string())?;
    out["cq"] = match cli.cq {
        CqMode::Wait => "wait",
        CqMode::Poll => "poll",
    }
    .into();
    out["cq_blocking_waits"] = CQ_BLOCKING_WAITS
        .load(std::sync::atomic::Ordering::Relaxed)
        .into();
    if cli.compat.use_event {
        out["completion_events"] = events.into();
    }
    if let Some(p) = pcap {
        out["pcap"] = serde_json::to_value(p).map_err(|e| e.to_string())?;
    }
    println!("{out}");
    Ok(())
}

pub fn run_server(cli: &Cli) -> Result<(), String> {
    let opened = open_device(cli)?;
    let what = format!("{} server", cli.test.name());
    let result = live::with_live_counters(&opened.0, cli.stats_every(), &what, || {
        serve_session(cli, &opened.0)
    });
    finish(cli, opened, result)
}

/// Serves one session; with `--json` returns the object to print once the engine has stopped.
fn serve_session(cli: &Cli, device: &Device) -> Result<Option<serde_json::Value>, String> {
    let bind_ip: std::net::IpAddr = cli
        .bind
        .parse()
        .map_err(|e| format!("bad --bind address: {e}"))?;
    let bind = device.listen_addr(bind_ip, cli.port);
    let listener = device
        .listen(bind, connect_params(cli))
        .map_err(|e| e.to_string())?;
    if !cli.json {
        // The port the listener has (the kernel's choice for `-p 0`).
        let bound = listener.local_addr().unwrap_or(bind);
        eprintln!(
            "iwarp-bench: {} server listening on {bound}",
            cli.test.name()
        );
    }
    let (mut side, plan, recv_posted) = accept_side(cli, &listener, None)?;
    if !cli.json {
        eprintln!("iwarp-bench: {}", describe(cli, &side));
    }
    // `-q`: the client's other queue pairs, then every one served at once.
    let mut more = Vec::new();
    for _ in 1..side.hello.qps {
        more.push(accept_side(cli, &listener, Some(&side.hello))?);
    }
    let verified = if side.hello.bidirectional {
        // `-b`: the client's reverse connection, on which we send and the client checks.
        let first = Hello {
            reverse: true,
            ..side.hello.clone()
        };
        let (mut back, _, _) = accept_side(cli, &listener, Some(&first))?;
        back.fill(CLIENT_SEED, 0, back.data.len() as u64);
        let (verified, sent) = both(
            || serve(&mut side, &plan, recv_posted),
            || send_reverse(&mut back),
        );
        let (verified, sent) = (verified?, sent?);
        if !cli.json {
            eprintln!("iwarp-bench: -b: sent {sent} messages the client checked");
        }
        back.qp.wait_finished(Duration::from_secs(5));
        verified
    } else if more.is_empty() {
        serve(&mut side, &plan, recv_posted)?
    } else {
        more.insert(0, (side, plan, recv_posted));
        let counts = each(&mut more, |(side, plan, posted)| serve(side, plan, *posted))?;
        side = more.swap_remove(0).0;
        // Each count is what a peer's messages claim (saturated at u64::MAX by then).
        counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
    };
    let out = if cli.json {
        Some(
            json!({ "role": "server", "test": cli.test.name(), "qps": side.hello.qps,
                    "verified_bytes": verified, "ok": true }),
        )
    } else {
        eprintln!("iwarp-bench: server verified {verified} bytes; done");
        None
    };
    side.qp.wait_finished(Duration::from_secs(5));
    for (other, _, _) in &more {
        other.qp.wait_finished(Duration::from_secs(5));
    }
    Ok(out)
}

/// Accepts one queue pair of the session: the client's hello checked (against the first
/// one's, `first`, for the further queue pairs of `-q`), buffers registered and readied,
/// receives posted before the connection is accepted.
fn accept_side(
    cli: &Cli,
    listener: &Listener,
    first: Option<&Hello>,
) -> Result<(Side, ServerPlan, u64), String> {
    // The client's further connections (`-q`, `-b`) come right after its first: a client that
    // died in between must not keep the server waiting for whoever comes next.
    let req = match first {
        None => listener.accept().map_err(|e| e.to_string())?,
        Some(_) => listener
            .accept_timeout(cli.setup_timeout())
            .map_err(|e| e.to_string())?
            .ok_or("the client's further connection did not come")?,
    };
    if cli.framing == FramingArg::Ift {
        return accept_side_ift(cli, req, first);
    }
    let Some((hello, client_buf)) = Hello::decode(req.private_data()) else {
        if proto::is_other_version(req.private_data()) {
            let _ = req
                .reject(b"iwarp-bench: the server is another version: run one build on both ends");
            return Err(
                "the client is an iwarp-bench of another version: run one build on both \
                        ends"
                    .into(),
            );
        }
        let _ = req.reject(
            b"iwarp-bench: not an iwarp-bench client (a perftest client, or \
              `iwarp-bench perftest`, needs an `iwarp-bench perftest` server)",
        );
        return Err(
            "the client's private data is not an iwarp-bench hello: a perftest \
                    client (ib_write_bw, `iwarp-bench perftest`) needs `iwarp-bench perftest` \
                    as its server"
                .into(),
        );
    };
    if let Err(why) = check_hello(cli, &hello, first) {
        let _ = req.reject(format!("iwarp-bench: {why}").as_bytes());
        return Err(why);
    }
    let mut req = req.rdmap_extensions(hello.test.is_atomic() || hello.imm);
    // The client's -o: its ORD, which our IRD bounds. Not given -o ourselves, we grant it
    // (as many Read Requests as it asks to have outstanding at us).
    let ours = connect_params(cli).mpa;
    if let Some((_, ord)) = req.offered_ird_ord() {
        if cli.more.outs.is_none() && ord != datapath::MAX_IRD_ORD && ord > ours.ird {
            req = req.ird_ord(ord, ours.ord);
        }
    }
    let pd = crate::net::protection_domain();
    let (cq, channel) = completion_queue(cli.compat.use_event)?;
    // Everything the client may touch first is ready before we accept: our data, the first
    // phase's landing area, and the receive buffers (iWARP has no receiver-not-ready retry).
    let ready = ServerReady::new(&pd, &hello)?;
    let conn = req
        .accept_with_recvs(&pd, &cq, &ready.welcome, ready.recvs)
        .map_err(|e| e.to_string())?;
    let side = server_side(
        cli,
        conn.qp,
        (cq, channel),
        ready.regions,
        client_buf,
        hello,
        ready.plan.send_test,
    );
    Ok((side, ready.plan, ready.recv_posted))
}

/// The server's checks of a client's hello (`first`: the first queue pair's, which the further
/// ones of `-q` repeat and `-b`'s reverse one repeats with `reverse` set).
fn check_hello(cli: &Cli, hello: &Hello, first: Option<&Hello>) -> Result<(), String> {
    if first.is_none() && hello.reverse {
        return Err("the client's first connection is marked reverse (-b's second)".into());
    }
    if first.is_some_and(|f| f != hello) {
        return Err("a further queue pair's hello differs from the first one's".into());
    }
    if hello.test != cli.test {
        return Err(format!(
            "client asked for {}, this server runs {}",
            hello.test.name(),
            cli.test.name()
        ));
    }
    if cli.imm() && !hello.imm {
        return Err(
            "this server was given --write-with-imm/--send-with-imm, the client not".into(),
        );
    }
    if first.is_none() {
        check_symmetric(cli, hello)?;
    }
    Ok(())
}

/// `-D` as the hello carries it: milliseconds, at least 1 (`u64::MAX`: `--run_infinitely`).
fn hello_duration_ms(d: Duration) -> u64 {
    d.as_millis().clamp(1, u64::MAX.into()) as u64
}

/// The options perftest calls SYMMETRIC (the same at both ends: `-s`, `-a`, `-n`, `-D`,
/// `--run_infinitely`, `-q`, `-b`) and `-t`, when this server was given them: the client's
/// hello, which the run follows, must say the same, or the run would not be the one the
/// server's command line asked for. What the server was not given it takes from the client.
fn check_symmetric(cli: &Cli, hello: &Hello) -> Result<(), String> {
    let refuse = |client: String, server: String| {
        Err(format!(
            "client asked for {client}, this server was given {server}"
        ))
    };
    let client_sizes = || match hello.sizes.as_slice() {
        [one] => format!("-s {one}"),
        sizes if sizes == crate::all_sizes() => "-a".to_string(),
        sizes => format!("the sizes {sizes:?}"),
    };
    if cli.all_sizes && hello.sizes != crate::all_sizes() {
        return refuse(client_sizes(), "-a".into());
    }
    if let (Some(s), false) = (cli.size, cli.all_sizes) {
        if hello.sizes != [s] {
            return refuse(client_sizes(), format!("-s {s}"));
        }
    }
    let client_count = || match hello.duration_ms {
        u64::MAX => "--run_infinitely".to_string(),
        0 => format!("-n {}", hello.iters),
        ms => format!("-D {}", ms as f64 / 1000.0),
    };
    if cli.run_infinitely {
        if hello.duration_ms != u64::MAX {
            return refuse(client_count(), "--run_infinitely".into());
        }
    } else if let Some(d) = cli.duration {
        if hello.duration_ms != hello_duration_ms(Duration::from_secs_f64(d)) {
            return refuse(client_count(), format!("-D {d}"));
        }
    }
    if let Some(n) = cli.iters {
        if hello.duration_ms != 0 || hello.iters != n {
            return refuse(client_count(), format!("-n {n}"));
        }
    }
    // An iteration run holds -t (and -r) to -n, as perftest's force_dependecies: ours to the
    // client's -n, which the run follows.
    let held = |v: u32| match hello.duration_ms {
        0 => u64::from(v).min(hello.iters) as u32,
        _ => v,
    };
    if let Some(t) = cli.tx_depth {
        if hello.tx_depth != held(t) {
            return refuse(format!("-t {}", hello.tx_depth), format!("-t {t}"));
        }
    }
    if let Some(r) = cli.more.rx_depth.filter(|_| hello.test == TestKind::SendBw) {
        if hello.rx_depth != held(r) {
            let client = match hello.rx_depth {
                0 => "no -r".to_string(),
                n => format!("-r {n}"),
            };
            return refuse(client, format!("-r {r}"));
        }
    }
    if cli.qps > 1 && hello.qps != cli.qps {
        return refuse(format!("-q {}", hello.qps), format!("-q {}", cli.qps));
    }
    if cli.bidirectional && !hello.bidirectional {
        return Err("this server was given -b, the client not".into());
    }
    Ok(())
}

/// The server's side of one queue pair, readied for a client's hello before the client may
/// send anything: the data region filled and the first phase's landing area prepared, the
/// receives to post (the data receives of a send test, one more than advertised for the
/// phase-done Send; the control receives otherwise) and the welcome naming our buffer.
struct ServerReady {
    regions: (MemoryRegion, MemoryRegion),
    plan: ServerPlan,
    recvs: Vec<RecvWr>,
    recv_posted: u64,
    welcome: Vec<u8>,
}

impl ServerReady {
    fn new(pd: &ProtectionDomain, hello: &Hello) -> Result<ServerReady, String> {
        let (data, ctrl) = register(pd, hello)?;
        fill(&data, &mut Vec::new(), SERVER_SEED, 0, data.len() as u64);
        prepare_phase(&data, hello, hello.sizes[0]);
        let plan = ServerPlan::new(hello);
        let mut recvs = Vec::new();
        let mut recv_posted = 0u64;
        if plan.send_test {
            for _ in 0..=plan.credit_window {
                recvs.push(plan.data_recv(&data, &mut recv_posted));
            }
        } else {
            for slot in 0..CTRL_SLOTS {
                recvs.push(ctrl_recv(&ctrl, slot as u64));
            }
        }
        let welcome = proto::encode_welcome(RemoteBuf {
            stag: data.stag().0,
            to: data.base_to(),
            len: data.len() as u64,
        });
        Ok(ServerReady {
            regions: (data, ctrl),
            plan,
            recvs,
            recv_posted,
            welcome,
        })
    }
}

/// The server's [`Side`] of an accepted queue pair (`send_test`: its receives are data
/// receives, not control ones).
fn server_side(
    cli: &Cli,
    qp: QueuePair,
    cq: (CompletionQueue, Option<CompletionChannel>),
    regions: (MemoryRegion, MemoryRegion),
    client_buf: RemoteBuf,
    hello: Hello,
    send_test: bool,
) -> Side {
    let mut side = Side::new(cli, qp, cq, regions, client_buf, hello);
    side.ctrl_posted = if send_test { 0 } else { CTRL_SLOTS as u64 };
    // A bandwidth test's server, and a read-lat or atomic-lat one (the transport answers the
    // Reads and Atomics), sees no completion until the client's phase-done Send: it waits as
    // long as the run takes (a vanished client ends the connection: keepalive, the user
    // timeout). The ping-pong servers wait a stall at most for each ping.
    side.stall = matches!(cli.test, TestKind::WriteLat | TestKind::SendLat).then_some(STALL);
    side
}

/// The hello and the welcome as the connection's first Sends (`--framing ift`: IFT has no
/// private data), through a region of their own: its first half sends, its second receives.
const SETUP_LEN: usize = 4096;
const SETUP_RECV: u64 = u64::MAX - 1;
const SETUP_SEND: u64 = u64::MAX - 2;

/// Sends `message` from `setup` and, unless `receive` is false, waits for the peer's (the
/// receive was posted before); returns what came in (empty when not waiting for it).
fn setup_exchange(
    qp: &QueuePair,
    cq: &CompletionQueue,
    setup: &MemoryRegion,
    message: &[u8],
    receive: bool,
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    if message.len() > SETUP_LEN {
        return Err(format!("a setup message of {} octets", message.len()));
    }
    setup.write(0, message);
    qp.post_send(SendWr {
        wr_id: SETUP_SEND,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: setup.sge(0, message.len() as u32).into(),
        signaled: true,
        fence: false,
    })
    .map_err(|e| format!("sending the setup message: {e}"))?;
    let deadline = Instant::now() + timeout;
    let (mut sent, mut got) = (false, (!receive).then(Vec::new));
    while !sent || got.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("the setup exchange did not finish in time".into());
        }
        let Some(c) = cq.wait(left.min(Duration::from_millis(100))) else {
            if let Some(e) = qp.status().error {
                return Err(format!("setup: {e}"));
            }
            continue;
        };
        if c.wc.status != WcStatus::Success {
            return Err(format!("setup message: {:?}", c.wc.status));
        }
        match c.wc.wr_id {
            SETUP_SEND => sent = true,
            SETUP_RECV => {
                let mut b = vec![0u8; c.wc.byte_len as usize];
                setup.read(SETUP_LEN, &mut b);
                got = Some(b);
            }
            other => return Err(format!("unexpected completion {other:#x} during setup")),
        }
    }
    Ok(got.unwrap_or_default())
}

fn setup_recv(setup: &MemoryRegion) -> RecvWr {
    RecvWr {
        wr_id: SETUP_RECV,
        sg_list: setup.sge(SETUP_LEN, SETUP_LEN as u32).into(),
    }
}

/// [`accept_side`] with `--framing ift`: accepted with one receive for the hello, which then
/// comes as the client's first Send; the buffers and receives are readied, and the welcome
/// sent, once it is checked.
fn accept_side_ift(
    cli: &Cli,
    req: datapath::ConnectRequest,
    first: Option<&Hello>,
) -> Result<(Side, ServerPlan, u64), String> {
    // The extensions are decided at accept, before the hello says whether the client uses
    // them: on, so that the server takes what the client's hello asks for. Having them on
    // only lets the peer send RFC 7306 messages; the server sends one only when the hello
    // says the client has them on too.
    let req = req.rdmap_extensions(true);
    let pd = crate::net::protection_domain();
    let (cq, channel) = completion_queue(cli.compat.use_event)?;
    let setup = pd
        .register(2 * SETUP_LEN, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let conn = req
        .accept_with_recvs(&pd, &cq, &[], vec![setup_recv(&setup)])
        .map_err(|e| e.to_string())?;
    // An error below drops the queue pair, which closes the connection.
    // Nothing to send yet: wait for the hello alone.
    let deadline = Instant::now() + cli.setup_timeout();
    let hello_bytes = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("the client's hello did not come".into());
        }
        match cq.wait(left.min(Duration::from_millis(100))) {
            Some(c) if c.wc.wr_id == SETUP_RECV && c.wc.status == WcStatus::Success => {
                let mut b = vec![0u8; c.wc.byte_len as usize];
                setup.read(SETUP_LEN, &mut b);
                break b;
            }
            Some(c) => return Err(format!("waiting for the hello: {:?}", c.wc.status)),
            None => {}
        }
    };
    let Some((hello, client_buf)) = Hello::decode(&hello_bytes) else {
        if proto::is_other_version(&hello_bytes) {
            return Err(
                "the client is an iwarp-bench of another version: run one build on both ends"
                    .into(),
            );
        }
        return Err("client sent a malformed hello".into());
    };
    check_hello(cli, &hello, first)?;
    let ready = ServerReady::new(&pd, &hello)?;
    for r in ready.recvs {
        conn.qp
            .post_recv(r)
            .map_err(|e| format!("posting receives: {e}"))?;
    }
    setup_exchange(
        &conn.qp,
        &cq,
        &setup,
        &ready.welcome,
        false,
        cli.setup_timeout(),
    )?;
    let mut side = server_side(
        cli,
        conn.qp,
        (cq, channel),
        ready.regions,
        client_buf,
        hello,
        ready.plan.send_test,
    );
    side.setup = Some(setup);
    Ok((side, ready.plan, ready.recv_posted))
}

/// `-b`, the server's side of the reverse connection: once the client says its receives are
/// posted, every size as a client sends it, each phase followed by what we measured (for the
/// client's sum). Returns the messages sent.
fn send_reverse(side: &mut Side) -> Result<u64, String> {
    // The client's window, not ours, bounds what is outstanding: a signaled one in every
    // window, or the sender would wait for a completion that never comes.
    side.cq_mod = side.cq_mod.min(u64::from(side.hello.tx_depth)).max(1);
    side.stall = Some(STALL);
    match side.next_ctrl()? {
        Some(Ctrl::Ready) => {}
        other => return Err(format!("-b: expected the client's go, got {other:?}")),
    }
    let duration =
        (side.hello.duration_ms > 0).then(|| Duration::from_millis(side.hello.duration_ms));
    // The peak where perftest measures one: the client's -N leaves it out of the row.
    side.peak = true;
    let mut sent = 0;
    for size in side.hello.sizes.clone() {
        let run = client_bw(side, size, duration, None)?;
        let r = run.result;
        finish_phase(side, size, run.completed)?;
        side.send_ctrl(Ctrl::Report {
            iterations: r.iterations,
            micros: (r.seconds * 1e6).max(1.0) as u64,
        })?;
        // The shortest time per message, in picoseconds (0: none).
        let fastest = r
            .peak_mib_per_sec
            .map_or(0.0, |p| size as f64 / (p * 1024.0 * 1024.0));
        side.send_ctrl(Ctrl::Peak {
            picos: (fastest * 1e12).round() as u64,
        })?;
        sent += run.completed;
    }
    Ok(sent)
}

/// Runs `f` on every item at once, a thread each (`-q`'s queue pairs); the results in order,
/// or the first error (one that is not [`SizeBarrier`]'s word for another's failure).
fn each<T: Send, R: Send>(
    items: &mut [T],
    f: impl Fn(&mut T) -> Result<R, String> + Sync,
) -> Result<Vec<R>, String> {
    let f = &f;
    let results: Vec<Result<R, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .iter_mut()
            .map(|item| scope.spawn(move || f(item)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a queue pair's thread panicked".into()))
            })
            .collect()
    });
    let cause = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .find(|e| e.as_str() != BARRIER_BROKEN)
        .cloned();
    match cause {
        Some(e) => Err(e),
        None => results.into_iter().collect(),
    }
}

/// What a thread waiting at a [`SizeBarrier`] learns when another queue pair failed.
const BARRIER_BROKEN: &str = "another queue pair failed";

/// `-q`: the queue pairs' threads start each size together, as perftest runs all its queue
/// pairs in one loop per size, so that a row sums runs that overlapped. A thread that fails
/// breaks it ([`SizeBarrier::abandon`]), so that the others do not wait for it.
struct SizeBarrier {
    /// Threads waiting, the generation (sizes begun), broken.
    state: std::sync::Mutex<(usize, u64, bool)>,
    cv: std::sync::Condvar,
    n: usize,
}

impl SizeBarrier {
    fn new(n: usize) -> Self {
        SizeBarrier {
            state: std::sync::Mutex::new((0, 0, false)),
            cv: std::sync::Condvar::new(),
            n,
        }
    }

    /// Waits until every thread is here; an error once one of them has failed.
    fn wait(&self) -> Result<(), String> {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.2 {
            return Err(BARRIER_BROKEN.into());
        }
        st.0 += 1;
        if st.0 >= self.n {
            st.0 = 0;
            st.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let generation = st.1;
        while st.1 == generation && !st.2 {
            st = self
                .cv
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        if st.1 == generation {
            Err(BARRIER_BROKEN.into())
        } else {
            Ok(())
        }
    }

    /// A thread failed: the others are told at the barrier instead of waiting for it.
    fn abandon(&self) {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.2 = true;
        self.cv.notify_all();
    }
}

/// Breaks its [`SizeBarrier`] when dropped armed (an error returned, a panic unwinding).
struct AbandonUnlessDone<'a>(Option<&'a SizeBarrier>);

impl Drop for AbandonUnlessDone<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.0 {
            b.abandon();
        }
    }
}

/// Runs `a` and `b` at once (`-b`'s two directions) and returns both results.
fn both<A: Send, B: Send>(
    a: impl FnOnce() -> Result<A, String> + Send,
    b: impl FnOnce() -> Result<B, String> + Send,
) -> (Result<A, String>, Result<B, String>) {
    std::thread::scope(|scope| {
        let a = scope.spawn(a);
        let b = scope.spawn(b);
        const PANICKED: &str = "a direction's thread panicked";
        (
            a.join().unwrap_or_else(|_| Err(PANICKED.into())),
            b.join().unwrap_or_else(|_| Err(PANICKED.into())),
        )
    })
}

/// How the server lays out its receive buffers.
struct ServerPlan {
    test: TestKind,
    max: u64,
    data_slots: u64,
    send_test: bool,
    /// Receive buffers advertised to a send-bw client (flow control: iWARP has no RNR retry).
    credit_window: u64,
}

impl ServerPlan {
    fn new(hello: &Hello) -> Self {
        let max = hello.sizes.iter().copied().max().unwrap_or(1);
        let data_slots = hello.recv_slots();
        let test = hello.test;
        Self {
            test,
            max,
            data_slots,
            send_test: matches!(test, TestKind::SendBw | TestKind::SendLat),
            credit_window: if test == TestKind::SendBw {
                hello.send_credits()
            } else {
                64
            },
        }
    }

    /// The next data receive buffer: send-lat pings land at `max`, send-bw messages rotate over
    /// slots of the largest size (buffers posted in one phase serve the next).
    fn data_recv(&self, data: &MemoryRegion, posted: &mut u64) -> RecvWr {
        let slot = if self.test == TestKind::SendLat {
            1
        } else {
            *posted % self.data_slots
        };
        *posted += 1;
        RecvWr {
            wr_id: K_DATA_RECV | slot,
            sg_list: data.sge((slot * self.max) as usize, self.max as u32).into(),
        }
    }
}

fn ctrl_recv(ctrl: &MemoryRegion, slot: u64) -> RecvWr {
    RecvWr {
        wr_id: K_CTRL_RECV | slot,
        sg_list: ctrl.sge(slot as usize * CTRL_LEN, CTRL_LEN as u32).into(),
    }
}

/// Readies the server's data region for a phase of `size`: write-bw slots get the complement
/// of the client's pattern (so written and untouched slots can be told apart); latency tests
/// restore the ping source (the last phase stamped it) and clear the last byte of the landing
/// area (so the first stamp is news).
fn prepare_phase(data: &MemoryRegion, hello: &Hello, size: u64) {
    let max = hello.sizes.iter().copied().max().unwrap_or(1);
    match hello.test {
        TestKind::WriteBw => poison(data, hello.slots(size) * size),
        TestKind::WriteLat | TestKind::SendLat => {
            // The previous phase left its stamp inside the ping source: restore the pattern.
            fill(data, &mut Vec::new(), SERVER_SEED, 0, max);
            data.write((max + size - 1) as usize, &[0]);
        }
        // The counter the client's Atomic Operations count up from 0.
        TestKind::AtomicBw | TestKind::AtomicLat => data.write(0, &0u64.to_ne_bytes()),
        _ => {}
    }
}

fn serve(side: &mut Side, plan: &ServerPlan, mut recv_posted: u64) -> Result<u64, String> {
    let test = plan.test;
    let max = plan.max;
    let sizes = side.hello.sizes.clone();
    let mut verified = 0u64;
    for (phase, &size) in sizes.iter().enumerate() {
        let slots = side.hello.slots(size);
        let mut ok = true;
        let mut checked = 0u64;
        let mut received = 0u64;
        let mut since_credit = 0u64;
        let mut done_msg = None;
        let indexed = indexed(&side.hello, size);
        let mut i = 0u64;
        let mut idle = Idle::new();
        loop {
            // write-lat: answer pings as they land; the phase ends with the client's Send. (With
            // Immediate Data, a ping is its receive's completion, below.)
            if test == TestKind::WriteLat && !side.hello.imm {
                let last = side.data.read_volatile((max + size - 1) as usize);
                if last == Some(stamp(i)) {
                    idle.reset();
                    // The ping's index (its first octets) is read before the reply goes: the
                    // next ping, which may land once it has, carries another.
                    let head = (size - 1).min(8);
                    let head_ok = side
                        .message_mismatch(CLIENT_SEED, max, 0, head, Some(i))
                        .is_none();
                    side.lat_mark(SERVER_SEED, size, i);
                    let op = side.write_op(side.remote.to + max, i);
                    side.post_data(K_DATA | i, op, 0, size, true)?;
                    // The rest of the body is checked after the reply is on its way (off the
                    // measured round trip, as the client checks its pong after taking the
                    // time); its stamp was read above. The next ping, which may land
                    // meanwhile, carries the same octets there. (Nor is this landing area
                    // poisoned: that could overwrite the next ping.)
                    ok &= head_ok
                        && side
                            .mismatch(CLIENT_SEED, max + head, head, size - 1 - head)
                            .is_none();
                    checked += size;
                    i += 1;
                    continue;
                }
                match side.try_next()? {
                    Some(c) if c.wc.opcode == WcOpcode::Recv => {
                        side.post_ctrl_recv()?;
                        break;
                    }
                    Some(_) => continue,
                    None => {
                        if side.qp.status().finished {
                            return Err(format!("connection ended: {}", side.fail_reason()));
                        }
                        if idle.wait() {
                            return Err(format!(
                                "write-lat: no ping {i} for {STALL:?}: {}",
                                side.fail_reason()
                            ));
                        }
                        continue;
                    }
                }
            }
            // send-lat polls for the ping like perftest's busy `ibv_poll_cq` loop (and like the
            // client's wait for the pong), or with -e waits on the channel as perftest's does;
            // the bandwidth tests block.
            let polls = matches!(test, TestKind::SendLat | TestKind::WriteLat);
            let c = if polls && side.channel.is_none() {
                side.next_polling()?
            } else {
                side.next()?
            };
            match (c.wc.opcode, c.wc.wr_id & KIND_MASK) {
                // Immediate Data after a Write: it took a control receive.
                (WcOpcode::RecvImmediate, K_CTRL_RECV) => {
                    side.post_ctrl_recv()?;
                    let imm = c.wc.immediate;
                    if test == TestKind::WriteLat {
                        ok &= imm == Some(i) && side.lat_check(CLIENT_SEED, max, size, i);
                        checked += size;
                        side.lat_mark(SERVER_SEED, size, i);
                        let op = side.write_op(side.remote.to + max, i);
                        side.post_data(K_DATA | i, op, 0, size, true)?;
                        i += 1;
                    } else {
                        ok &= imm == Some(received);
                        received += 1;
                        side.credit_back(&mut since_credit, IMM_CREDITS)?;
                    }
                }
                // Immediate Data after a Send: it took a data receive (nothing placed).
                (WcOpcode::RecvImmediate, K_DATA_RECV) => {
                    let wr = plan.data_recv(&side.data, &mut recv_posted);
                    side.qp.post_recv(wr).map_err(|e| e.to_string())?;
                    let msg = received.wrapping_sub(1);
                    ok &= c.wc.immediate == Some(msg);
                    if test == TestKind::SendLat {
                        let op = side.send_op(msg);
                        side.post_data(K_DATA | msg, op, 0, size, true)?;
                    } else {
                        side.credit_back(&mut since_credit, plan.credit_window)?;
                    }
                }
                (WcOpcode::Recv, K_CTRL_RECV) => {
                    if test.is_atomic() || test == TestKind::WriteBw {
                        done_msg = side.read_ctrl(c.wc.wr_id);
                    }
                    side.post_ctrl_recv()?;
                    break; // phase-done: zero-length, or an atomic test's count
                }
                (WcOpcode::Recv, K_DATA_RECV) => {
                    let wr = plan.data_recv(&side.data, &mut recv_posted);
                    side.qp.post_recv(wr).map_err(|e| e.to_string())?;
                    if c.wc.byte_len == 0 {
                        break; // phase-done
                    }
                    let slot = c.wc.wr_id & !KIND_MASK;
                    let got = u64::from(c.wc.byte_len);
                    if test == TestKind::SendLat {
                        ok &= got == size && side.lat_check(CLIENT_SEED, max, size, received);
                        side.lat_mark(SERVER_SEED, size, received);
                        // With Immediate Data the pong waits for it (above).
                        if !side.hello.imm {
                            let op = side.send_op(received);
                            side.post_data(K_DATA | received, op, 0, size, true)?;
                        }
                    } else {
                        let src = (received % slots) * size;
                        let index = indexed.then_some(received);
                        ok &= got == size
                            && side
                                .message_mismatch(CLIENT_SEED, slot * max, src, size, index)
                                .is_none();
                        side.credit_back(&mut since_credit, plan.credit_window)?;
                    }
                    received += 1;
                    checked += got;
                }
                _ => {}
            }
        }
        if since_credit > 0 {
            side.send_ctrl(Ctrl::Credit {
                n: since_credit as u32,
            })?;
        }
        if test == TestKind::WriteBw {
            let (good, bytes) = match done_msg {
                Some(Ctrl::Done { ops }) => check_written_slots(side, slots, size, ops),
                _ => (false, 0),
            };
            ok &= good;
            checked += bytes;
        }
        if test.is_atomic() {
            // Each operation moved the counter by one: it holds their number.
            let counter = side.original(0);
            match done_msg {
                Some(Ctrl::Done { ops }) if ops == counter => {
                    checked = checked.saturating_add(ops.saturating_mul(8))
                }
                _ => {
                    eprintln!(
                        "iwarp-bench: counter {counter} after the phase, client said {done_msg:?}"
                    );
                    ok = false;
                }
            }
        }
        verified = verified.saturating_add(checked);
        if let Some(&next) = sizes.get(phase + 1) {
            prepare_phase(&side.data, &side.hello, next);
        }
        side.send_ctrl(Ctrl::PhaseAck {
            ok,
            checked_bytes: checked,
        })?;
        if !ok {
            return Err(format!("data verification failed at size {size}"));
        }
        if side.hello.reverse {
            // `-b`: the sender's measurement of the phase.
            loop {
                match side.next_ctrl()? {
                    Some(Ctrl::Report { iterations, micros }) => {
                        let r = BandwidthResult::new(size, iterations, micros as f64 / 1e6);
                        // Then its peak (the shortest time per message).
                        let peak = loop {
                            match side.next_ctrl()? {
                                Some(Ctrl::Peak { picos }) => {
                                    break (picos > 0).then(|| picos as f64 / 1e12)
                                }
                                Some(Ctrl::Credit { .. }) => {}
                                other => {
                                    return Err(format!(
                                        "-b: expected the server's peak, got {other:?}"
                                    ))
                                }
                            }
                        };
                        side.reports.push(r.with_peak(peak));
                        break;
                    }
                    Some(Ctrl::Credit { .. }) => {}
                    other => {
                        return Err(format!("-b: expected the server's report, got {other:?}"))
                    }
                }
            }
        }
    }
    Ok(verified)
}

/// Overwrites `[0, len)` with the complement of the client's pattern.
fn poison(data: &MemoryRegion, len: u64) {
    poison_range(data, &mut Vec::new(), CLIENT_SEED, 0, 0, len)
}

/// Overwrites `[off, off + len)` with the complement of `seed`'s pattern at `pattern_off`,
/// through `scratch` (grown once to a chunk, at most [`CHECK_CHUNK`]).
fn poison_range(
    data: &MemoryRegion,
    scratch: &mut Vec<u8>,
    seed: u64,
    off: u64,
    pattern_off: u64,
    len: u64,
) {
    let chunk = chunk_of(scratch, len);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        pattern::fill(seed, pattern_off + done, &mut chunk[..n]);
        chunk[..n].iter_mut().for_each(|b| *b = !*b);
        data.write((off + done) as usize, &chunk[..n]);
        done += n as u64;
    }
}

/// Checks write-bw slots after `messages` Writes: each slot written to holds the client's
/// pattern and (when the size's messages carry their index) the index of the last Write
/// through it; the rest is untouched.
fn check_written_slots(side: &Side, slots: u64, size: u64, messages: u64) -> (bool, u64) {
    if messages == 0 {
        return (false, 0);
    }
    let written = messages.min(slots);
    let indexed = indexed(&side.hello, size);
    for k in 0..written {
        let last = k + (messages - 1 - k) / slots * slots;
        let off = k * size;
        if side
            .message_mismatch(CLIENT_SEED, off, off, size, indexed.then_some(last))
            .is_some()
        {
            return (false, k * size);
        }
    }
    // The rest must be untouched (the complement of the pattern, byte for byte).
    let mut buf = vec![0u8; size as usize];
    let mut expect = vec![0u8; size as usize];
    for k in written..slots {
        side.data.read((k * size) as usize, &mut buf);
        pattern::fill(CLIENT_SEED, k * size, &mut expect);
        if buf.iter().zip(&expect).any(|(a, b)| *a != !*b) {
            return (false, written * size);
        }
    }
    (true, written * size)
}

impl Side {
    /// Checks ping or pong `i` at `off`: its body (all but the last byte) message `i` of the
    /// sender's pattern ([`Side::lat_mark`]), the stamp in the last byte.
    fn lat_check(&self, seed: u64, off: u64, size: u64, i: u64) -> bool {
        self.message_mismatch(seed, off, 0, size - 1, Some(i))
            .is_none()
            && self.data.read_volatile((off + size - 1) as usize) == Some(stamp(i))
    }

    /// Readies our ping or pong `i` of `size` at offset 0: its index in the body's first
    /// octets, its stamp in the last byte.
    fn lat_mark(&self, seed: u64, size: u64, i: u64) {
        self.write_index(seed, 0, i, size - 1);
        self.data.write((size - 1) as usize, &[stamp(i)]);
    }

    /// Poisons the landing area of a pong at `off` once checked: the body with the complement
    /// of the sender's pattern, the last byte (the stamp) with 0, which no stamp is.
    fn lat_poison(&self, seed: u64, off: u64, size: u64) {
        self.poison(seed, off, 0, size - 1);
        self.data.write((off + size - 1) as usize, &[0]);
    }
}

// ---------------------------------------------------------------------------------------------
// Client

/// Runs the client side: connects, runs every size, prints the results.
pub fn run_client(cli: &Cli, addr: SocketAddr) -> Result<(), String> {
    let opened = open_device(cli)?;
    let what = format!("{} client", cli.test.name());
    let result = live::with_live_counters(&opened.0, cli.stats_every(), &what, || {
        client_session(cli, addr, &opened.0)
    });
    finish(cli, opened, result)
}

/// Runs the client's session; with `--json` returns the object to print once the engine has
/// stopped.
fn client_session(
    cli: &Cli,
    addr: SocketAddr,
    device: &Device,
) -> Result<Option<serde_json::Value>, String> {
    let report_every = cli.report_every();
    // `--run_infinitely` takes `-D` as its reporting interval; the run itself has no end.
    let duration = match report_every {
        Some(_) => Some(Duration::MAX),
        None => cli.duration.map(Duration::from_secs_f64),
    };
    let hello = Hello {
        test: cli.test,
        imm: cli.imm(),
        tx_depth: cli.tx_depth(),
        slots: cli.slots,
        iters: if duration.is_some() {
            0
        } else {
            cli.iterations()
        },
        duration_ms: duration.map_or(0, hello_duration_ms),
        sizes: cli.sizes(),
        qps: cli.qps,
        bidirectional: cli.bidirectional,
        reverse: false,
        rx_depth: cli.rx_depth().unwrap_or(0),
        margin: cli.margin(),
    };
    if let Some(r) = cli.rx_depth() {
        if hello.send_credits() < u64::from(r) {
            eprintln!(
                "iwarp-bench: -r {r}: {} receives posted (the receive queue holds {}, the {} MiB \
                 buffer {} of {} octets)",
                hello.send_credits(),
                proto::MAX_POSTED_RECEIVES,
                proto::MAX_BUFFER >> 20,
                hello.recv_slots(),
                hello.sizes.iter().max().unwrap_or(&1),
            );
        }
    }
    let memory = hello.buffer_len() * u64::from(cli.qps);
    if memory > proto::MAX_SESSION_MEMORY {
        return Err(format!(
            "-q {} at this size needs {memory} octets of buffers at each end; at most {}",
            cli.qps,
            proto::MAX_SESSION_MEMORY
        ));
    }
    // `-q`: every connection is set up before any of them starts sending.
    let mut sides = Vec::new();
    for _ in 0..cli.qps {
        sides.push(client_connect(cli, addr, device, hello.clone())?);
    }
    let banner = describe(cli, &sides[0]);
    // perftest's latency columns: the distribution's, or with -D its duration row's.
    let lat_header = if duration.is_some() {
        report::LAT_DUR_HEADER
    } else {
        report::LAT_HEADER
    };
    // --output: one number per result on stdout, nothing else there (perftest's
    // `ctx_print_test_info` and the tables' lines print nothing then).
    let table = !cli.json && cli.more.output.is_none();
    if !cli.json {
        eprintln!("iwarp-bench: {banner}");
    }
    if table {
        // perftest's header block and column line, so that what parses perftest's output
        // parses ours.
        let device = match cli.transport {
            Transport::Xdp => cli.iface.clone().unwrap_or_default(),
            Transport::Socket => "socket".to_string(),
        };
        let header = report::Header {
            test: cli.test,
            server: false,
            bidirectional: cli.bidirectional,
            qps: u64::from(cli.qps),
            tx_depth: u64::from(cli.tx_depth()),
            rx_depth: sides[0].hello.send_credits(),
            cq_mod: u64::from(cli.cq_mod()),
            post_list: u64::from(cli.post_list),
            inline: cli.compat.inline_size.map_or(0, u64::from),
            // The ORD agreed with the server (`-o`, bounded by the server's IRD).
            out_reads: sides[0].qp.agreed().ord(),
            mtu: sides[0].qp.mulpdu() as u32,
            device: &device,
        };
        for line in report::header_block(&header) {
            println!("{line}");
        }
        println!(
            "{}",
            if cli.test.is_bw() {
                report::bw_header(cli.compat.report_gbits)
            } else {
                lat_header
            }
        );
    }
    for side in &mut sides {
        side.fill(CLIENT_SEED, 0, side.data.len() as u64);
        if cli.test != TestKind::SendLat {
            for _ in 0..CTRL_SLOTS {
                side.post_ctrl_recv()?;
            }
        }
        // Several queue pairs: one table for all, no progress of one of them.
        side.progress &= cli.qps == 1;
    }
    if report_every.is_some() {
        // Caught only now that the run's loop is there to see it; a second one ends the
        // process.
        interrupt::install()?;
    }
    let mut bw_results = Vec::new();
    let mut lat_results = Vec::new();
    let (mut verified, mut client_verified) = (0u64, 0u64);
    if cli.bidirectional {
        // `-b`: a second connection on which the server sends and we check, run at the same
        // time as ours; each row sums both directions.
        let mut back = client_connect(
            cli,
            addr,
            device,
            Hello {
                reverse: true,
                ..hello.clone()
            },
        )?;
        back.fill(SERVER_SEED, 0, back.data.len() as u64);
        prepare_phase(&back.data, &back.hello, back.hello.sizes[0]);
        for _ in 0..CTRL_SLOTS {
            back.post_ctrl_recv()?;
        }
        back.stall = None;
        let plan = ServerPlan::new(&back.hello);
        back.send_ctrl(Ctrl::Ready)?;
        let side = &mut sides[0];
        side.progress = false;
        let (fwd, rev) = both(
            || client_bw_sizes(side, duration, None, None),
            || serve(&mut back, &plan, 0),
        );
        let (fwd, rev) = (fwd?, rev?);
        for ((r, _, _, _), reverse) in fwd.iter().zip(&back.reports) {
            // perftest's duplex row: our size and count, both directions' rates (and peaks).
            let r = r.with_reverse(reverse);
            if !cli.json {
                println!("{}", bw_line(&r, cli));
            }
            bw_results.push(r);
        }
        for (_, checked, server_checked, _) in &fwd {
            client_verified += checked;
            verified = verified.saturating_add(*server_checked);
        }
        client_verified += rev;
        back.qp.disconnect();
    } else if cli.qps > 1 {
        // One thread per queue pair, each running every size, all beginning each size
        // together; the rows sum them.
        let barrier = SizeBarrier::new(sides.len());
        let runs = each(&mut sides, |side| {
            client_bw_sizes(side, duration, report_every, Some(&barrier))
        })?;
        for (i, size) in hello.sizes.iter().enumerate() {
            let parts: Vec<Part> = runs
                .iter()
                .filter_map(|r| r.get(i))
                .map(|p| p.3.clone())
                .collect();
            let r = BandwidthResult::concurrent(*size, &parts);
            if !cli.json {
                println!("{}", bw_line(&r, cli));
            }
            bw_results.push(r);
        }
        for run in &runs {
            for (_, checked, server_checked, _) in run {
                client_verified += checked;
                verified = verified.saturating_add(*server_checked);
            }
        }
    } else {
        let side = &mut sides[0];
        for size in side.hello.sizes.clone() {
            let ops;
            if cli.test.is_bw() {
                let run = client_bw(side, size, duration, report_every)?;
                client_verified += run.checked;
                if !cli.json {
                    println!("{}", bw_line(&run.result, cli));
                }
                ops = run.completed;
                bw_results.push(run.result);
            } else {
                let mut run = client_lat(side, size, duration)?;
                client_verified += run.checked;
                ops = run.completed;
                if !cli.json && (cli.compat.report_unsorted || cli.compat.report_histogram) {
                    // As perftest: the samples, then the header again before the result line.
                    if cli.compat.report_unsorted {
                        print!("{}", stats::lat_samples_report(&run.samples, false));
                    }
                    if cli.compat.report_histogram {
                        print!("{}", stats::lat_samples_report(&run.samples, true));
                    }
                    if table {
                        println!("{}", report::RESULT_LINE);
                        println!("{}", lat_header);
                    }
                }
                // The plain mean of every sample kept, before the summary sorts them.
                let mean = run.samples.iter().sum::<f64>() / run.samples.len().max(1) as f64;
                let mut r = LatencyResult::from_samples(size, &mut run.samples);
                r.iterations = run.counted;
                match run.window_seconds {
                    // -D: perftest's duration row (print_report_lat_duration).
                    Some(secs) => {
                        let tps = run.counted as f64 / secs.max(1e-9);
                        r.tps = Some(tps);
                        if table {
                            println!("{}", report::lat_dur_row(size, run.counted, mean, tps));
                        } else if !cli.json {
                            println!("{}", report::lat_number(mean));
                        }
                    }
                    None if table => println!("{}", report::lat_row(&r)),
                    None if !cli.json => println!("{}", report::lat_number(r.t_avg_us)),
                    None => {}
                }
                lat_results.push(r);
            }
            verified = verified.saturating_add(finish_phase(side, size, ops)?);
        }
    }
    if table {
        println!("{}", report::RESULT_LINE);
    }
    let mut out = None;
    if cli.json {
        let results = if cli.test.is_bw() {
            serde_json::to_value(&bw_results)
        } else {
            serde_json::to_value(&lat_results)
        }
        .map_err(|e| e.to_string())?;
        let side = &sides[0];
        let mut report = json!({
                "role": "client",
                "test": cli.test.name(),
                "transport": cli.transport.name(),
                "mulpdu": side.qp.mulpdu(),
                "tx_depth": cli.tx_depth(),
                "cq_mod": side.cq_mod,
                "slots": cli.slots,
                "qps": cli.qps,
                "verified_bytes_server": verified,
                "verified_bytes_client": client_verified,
                "results": results,
        });
        if cli.test == TestKind::SendBw {
            // -r: the receives the server kept posted, our credit window.
            report["rx_depth"] = side.hello.send_credits().into();
        }
        if let (Some(fields), serde_json::Value::Object(agreed)) =
            (report.as_object_mut(), crate::net::agreed_json(&side.qp))
        {
            fields.extend(agreed);
        }
        out = Some(report);
    } else {
        eprintln!(
            "iwarp-bench: data verified: {verified} bytes checked by the server, \
             {client_verified} by the client"
        );
    }
    for side in &mut sides {
        side.qp.disconnect();
    }
    Ok(out)
}

/// A bandwidth result's line as `cli` asks for it: perftest's row, or with `--output` one
/// number ([`report::bw_line`]).
fn bw_line(r: &BandwidthResult, cli: &Cli) -> String {
    report::bw_line(r, cli.compat.report_gbits, cli.more.output)
}

/// Connects one queue pair of the run: its own protection domain, completion queue and
/// buffers, the hello in the MPA Request.
fn client_connect(
    cli: &Cli,
    addr: SocketAddr,
    device: &Device,
    hello: Hello,
) -> Result<Side, String> {
    let pd = crate::net::protection_domain();
    let (cq, channel) = completion_queue(cli.compat.use_event)?;
    let (data, ctrl) = register(&pd, &hello)?;
    let mine = RemoteBuf {
        stag: data.stag().0,
        to: data.base_to(),
        len: data.len() as u64,
    };
    let private = hello.encode(mine);
    let ift = cli.framing == FramingArg::Ift;
    let conn = device
        .connect(
            addr,
            &pd,
            &cq,
            &connect_params(cli),
            if ift { &[] } else { &private },
        )
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    // With IFT the hello and the welcome are the first Sends (no private data).
    let mut setup = None;
    let welcome = if ift {
        let region = pd
            .register(2 * SETUP_LEN, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        conn.qp
            .post_recv(setup_recv(&region))
            .map_err(|e| format!("posting the welcome's receive: {e}"))?;
        let w = setup_exchange(&conn.qp, &cq, &region, &private, true, cli.setup_timeout())?;
        setup = Some(region);
        w
    } else {
        conn.private_data.clone()
    };
    let remote = proto::decode_welcome(&welcome).ok_or(
        "the server's private data is not an iwarp-bench welcome: is it a perftest \
             server (ib_write_bw, `iwarp-bench perftest`)? Run `iwarp-bench perftest` against it",
    )?;
    if remote.len < hello.buffer_len() {
        return Err("server's buffer is smaller than the run needs".into());
    }
    let mut side = Side::new(cli, conn.qp, (cq, channel), (data, ctrl), remote, hello);
    side.setup = setup;
    Ok(side)
}

/// Every size of a bandwidth test on one queue pair of several (`-q`, each size begun
/// together at `barrier`) or with `-b`: per size, the result, the octets this side checked,
/// those the server checked, and the part for a `-q` row.
fn client_bw_sizes(
    side: &mut Side,
    duration: Option<Duration>,
    report_every: Option<Duration>,
    barrier: Option<&SizeBarrier>,
) -> Result<Vec<(BandwidthResult, u64, u64, Part)>, String> {
    let mut guard = AbandonUnlessDone(barrier);
    let mut out = Vec::new();
    for size in side.hello.sizes.clone() {
        if let Some(b) = barrier {
            b.wait()?;
        }
        let run = client_bw(side, size, duration, report_every)?;
        let server_checked = finish_phase(side, size, run.completed)?;
        let part = Part {
            iterations: run.result.iterations,
            start: run.span.0,
            end: run.span.1,
            times: run.times,
        };
        out.push((run.result, run.checked, server_checked, part));
    }
    guard.0 = None;
    Ok(out)
}

/// Posts the gathered work requests of `-l` as one list (nothing if there are none), its
/// time and length first into `times` (perftest's peak times a list by its post).
fn post_list(
    side: &Side,
    pending: &mut Vec<SendRequest>,
    times: Option<&mut PeakTimes>,
) -> Result<(), String> {
    if pending.is_empty() {
        return Ok(());
    }
    if let Some(t) = times {
        t.posts.push((Instant::now(), pending.len() as u64));
    }
    side.qp
        .post_send_list(pending.drain(..))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Ends a phase: zero-length Send (atomic tests and write-bw: [`Ctrl::Done`] with the
/// `messages` done), then wait for the server's verdict. Returns bytes checked.
fn finish_phase(side: &mut Side, size: u64, messages: u64) -> Result<u64, String> {
    if side.hello.test == TestKind::SendLat {
        side.post_ctrl_recv()?;
    }
    if side.hello.test.is_atomic() || side.hello.test == TestKind::WriteBw {
        side.send_ctrl(Ctrl::Done { ops: messages })?;
    } else {
        side.send_done()?;
    }
    loop {
        let c = side.next()?;
        if c.wc.opcode == WcOpcode::Recv && c.wc.wr_id & KIND_MASK == K_CTRL_RECV {
            let msg = side.read_ctrl(c.wc.wr_id);
            if side.hello.test != TestKind::SendLat {
                side.post_ctrl_recv()?;
            }
            match msg {
                Some(Ctrl::PhaseAck {
                    ok: true,
                    checked_bytes,
                }) => return Ok(checked_bytes),
                Some(Ctrl::PhaseAck { ok: false, .. }) => {
                    return Err(format!("server found corrupted data at size {size}"))
                }
                Some(Ctrl::Credit { .. }) => continue,
                Some(Ctrl::Done { .. } | Ctrl::Ready | Ctrl::Report { .. } | Ctrl::Peak { .. })
                | None => return Err("malformed control message from server".into()),
            }
        }
    }
}

/// Progress of one size on stderr, once a second, for runs that last longer than that
/// (nothing for short ones); results still go to stdout at the end.
struct Progress {
    test: &'static str,
    bw: bool,
    size: u64,
    iters: u64,
    /// Nothing shown ([`Side::progress`] off).
    quiet: bool,
    duration: Option<Duration>,
    start: Instant,
    next: Instant,
    /// stderr is a terminal: a progress bar instead of lines.
    terminal: bool,
    /// The bar, made once the size has run for [`Progress::EVERY`] (short sizes stay quiet).
    bar: Option<indicatif::ProgressBar>,
    /// Where a progress line goes when not on a terminal: stderr.
    print: fn(&str),
}

impl Progress {
    /// Lines: one a second, from the first second on.
    const EVERY: Duration = Duration::from_secs(1);
    /// A terminal's bar: redrawn this often.
    const BAR_EVERY: Duration = Duration::from_millis(100);

    fn new(side: &Side, size: u64, duration: Option<Duration>, start: Instant) -> Progress {
        use std::io::IsTerminal;
        Progress {
            test: side.hello.test.name(),
            bw: side.hello.test.is_bw(),
            size,
            iters: side.hello.iters,
            quiet: !side.progress,
            duration,
            start,
            next: start + Self::EVERY,
            // `--stats-every` lines would tear through a bar: lines then.
            terminal: std::io::stderr().is_terminal() && side.progress_bar,
            bar: None,
            print: |line| eprintln!("{line}"),
        }
    }

    /// `done` iterations complete at `now`.
    fn tick(&mut self, now: Instant, done: u64) {
        if self.quiet || now < self.next {
            return;
        }
        let secs = now.duration_since(self.start).as_secs_f64();
        let of = match self.duration {
            Some(d) => format!("in {secs:.1} of {:.1} s", d.as_secs_f64()),
            None => format!("of {}", self.iters),
        };
        let rate = if self.bw {
            let gbit = (done * self.size) as f64 * 8.0 / secs.max(1e-9) / 1e9;
            format!(", {gbit:.2} Gbit/s so far")
        } else {
            String::new()
        };
        if self.terminal {
            self.next = now + Self::BAR_EVERY;
            let (pos, len) = match self.duration {
                Some(d) => (
                    now.duration_since(self.start).as_millis() as u64,
                    d.as_millis() as u64,
                ),
                None => (done, self.iters),
            };
            let bar = self.bar.get_or_insert_with(|| {
                let bar = indicatif::ProgressBar::new(len);
                let style = indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {percent:>3}% {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> ");
                bar.set_style(style);
                bar.set_prefix(format!("{} {} B", self.test, self.size));
                bar
            });
            bar.set_position(pos.min(len));
            // Short enough for an 80-column line: the bar shows how far.
            bar.set_message(if self.bw {
                rate.trim_start_matches(", ").to_owned()
            } else {
                format!("{done} iterations")
            });
            return;
        }
        self.next = now + Self::EVERY;
        (self.print)(&format!(
            "iwarp-bench: {} {} B: {done} iterations {of}{rate}",
            self.test, self.size
        ));
    }
}

impl Drop for Progress {
    /// The size is done: its bar goes (the result table follows on stdout).
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// What one size of a bandwidth test did.
struct BwRun {
    /// The measurement: every message over the run, or with `-D` those completed in the
    /// sampling window over its length ([`SampleWindow`], perftest's margins).
    result: BandwidthResult,
    /// The time `result` counts over: from just before the first post to the last
    /// completion, or `-D`'s sampling window.
    span: (Instant, Instant),
    /// Octets the client checked.
    checked: u64,
    /// Messages completed over the whole run (an atomic test's server checks its counter
    /// against it).
    completed: u64,
    /// The post and completion times kept for perftest's peak (an iteration run of at most
    /// [`stats::PEAK_MAX_ITERATIONS`] messages, not `-N`), for `-q`'s row over all queue
    /// pairs; `result` has this run's own peak.
    times: Option<PeakTimes>,
}

/// One size of a bandwidth test: `-n` messages, or as many as `duration` allows (counting
/// those of its middle, as perftest), or (with `report_every`, `--run_infinitely`) until
/// SIGINT/SIGTERM, with a result line for each interval.
fn client_bw(
    side: &mut Side,
    size: u64,
    duration: Option<Duration>,
    report_every: Option<Duration>,
) -> Result<BwRun, String> {
    let test = side.hello.test;
    let depth = u64::from(side.hello.tx_depth);
    // atomic-bw: a sink per outstanding operation, each checked as it completes.
    let slots = if test.is_atomic() {
        depth
    } else {
        side.hello.slots(size)
    };
    let iters = side.hello.iters;
    // Receives the server has posted for us (RFC 5041 has no receiver-not-ready retry): a Send
    // takes one, Immediate Data one more; a Write takes none, with Immediate Data one.
    let imm = side.hello.imm;
    let (mut credits, cost) = match test {
        TestKind::SendBw => (side.hello.send_credits(), 1 + u64::from(imm)),
        TestKind::WriteBw if imm => (IMM_CREDITS, 1),
        _ => (u64::MAX, 0),
    };
    let start = Instant::now();
    let mut progress = Progress::new(side, size, duration, start);
    // -D: what completes in the middle of the run counts (not with --run_infinitely, whose
    // -D is the interval between rows).
    let mut sample = match (report_every, duration) {
        (None, Some(d)) => Some(SampleWindow::with_margin(start, d, side.hello.margin)),
        _ => None,
    };
    // perftest's peak: the times of an iteration run of at most 20,000 messages (not with -N,
    // -D or --run_infinitely, where perftest measures none either).
    let mut times = (side.peak
        && duration.is_none()
        && report_every.is_none()
        && iters <= stats::PEAK_MAX_ITERATIONS)
        .then(|| PeakTimes::with_capacity(iters, side.post_list as u64, side.cq_mod));
    let (mut posted, mut completed, mut outstanding) = (0u64, 0u64, 0u64);
    // read-bw: messages done and checked. At most `depth` Reads are posted and not yet
    // checked, so with a slot per outstanding request (the default) a slot's data is checked
    // before the next Read into it is posted, one at a time: reposting goes on while a signaled
    // completion's batch is being checked. (With fewer slots, as before, Reads of the same
    // octets share a slot while outstanding.)
    let mut released = 0u64;
    let mut checked = 0u64;
    // Set once the last work request is posted; that one is always signaled, so that its
    // completion says when everything is done.
    let mut stop = duration.is_none() && iters == 0;
    // `--run_infinitely`: the current reporting interval's start and the messages done then.
    let mut window = (start, 0u64);
    let mut pending = Vec::with_capacity(side.post_list);
    // send-bw and write-bw: each message carries its index ([`indexed`]); read-bw: a slot's
    // first octets are poisoned once checked, so that the next Read into it must place them.
    let indexed = indexed(&side.hello, size);
    let write_index = indexed && matches!(test, TestKind::SendBw | TestKind::WriteBw);
    let head = size.min(8);
    loop {
        while !stop
            && outstanding < depth
            && credits >= cost.max(1)
            && (test != TestKind::ReadBw || posted < released + depth)
        {
            let last = match (report_every, &sample) {
                (Some(_), _) => interrupt::requested(),
                (None, Some(w)) => w.time_up(Instant::now()),
                (None, None) => posted + 1 >= iters,
            };
            // One in `cq_mod` is signaled (perftest's --cq-mod); a signaled completion tells
            // that the unsignaled ones before it are done too (completions in order, RFC 5040
            // 5.5 rule 15). With `cq_mod` at most `depth`, the requests outstanding once the
            // queue is full always include a signaled one.
            let signaled = last || (posted + 1) % side.cq_mod == 0;
            let slot = posted % slots;
            let off = slot * size;
            if write_index {
                side.write_index(CLIENT_SEED, off, posted, size);
            }
            let op = match test {
                TestKind::WriteBw => side.write_op(side.remote.to + off, posted),
                TestKind::ReadBw => SendOp::Read {
                    remote_stag: side.remote_stag(),
                    remote_to: side.remote.to + off,
                },
                TestKind::AtomicBw => side.atomic(posted),
                _ => side.send_op(posted),
            };
            let wr = SendWr {
                wr_id: K_DATA | posted,
                op,
                sg_list: side.data.sge(off as usize, size as u32).into(),
                signaled,
                fence: false,
            };
            if side.post_list > 1 {
                // -l: gathered (inline ones too, with -I), posted as one list when full (or
                // below, when the window is).
                pending.push(side.request(wr));
                if pending.len() >= side.post_list {
                    post_list(side, &mut pending, times.as_mut())?;
                }
            } else {
                if let Some(t) = &mut times {
                    t.posts.push((Instant::now(), 1));
                }
                side.post_wr(wr)?;
            }
            posted += 1;
            outstanding += 1;
            credits = credits.saturating_sub(cost);
            stop = last;
        }
        post_list(side, &mut pending, times.as_mut())?;
        if test == TestKind::ReadBw && released < completed {
            let off = (released % slots) * size;
            if let Some(at) = side.mismatch(SERVER_SEED, off, off, size) {
                return Err(format!(
                    "read-bw: data read at iteration {released} differs at byte {at}"
                ));
            }
            if indexed {
                side.poison(SERVER_SEED, off, off, head);
            }
            checked += size;
            released += 1;
            continue;
        }
        if stop && outstanding == 0 {
            break;
        }
        let c = side.next()?;
        match c.wc.wr_id & KIND_MASK {
            K_DATA => {
                // This one and the unsignaled ones posted before it are done.
                let i = c.wc.wr_id & !KIND_MASK;
                let Some(done) = (i + 1).checked_sub(completed).filter(|&n| n <= outstanding)
                else {
                    return Err(format!(
                        "completion of work request {i} out of order ({completed} done before)"
                    ));
                };
                if test.is_atomic() {
                    // Signaled one by one (`cq_mod` 1): this is operation `completed`.
                    let original = side.original((completed % slots) * size);
                    if original != completed {
                        return Err(format!(
                            "atomic-bw: operation {completed} saw the counter at {original}"
                        ));
                    }
                    checked += size;
                }
                outstanding -= done;
                completed += done;
                if let Some(t) = &mut times {
                    t.completions.push((Instant::now(), done));
                }
                if let Some(w) = &mut sample {
                    w.completed(Instant::now(), done);
                }
                if let Some(every) = report_every {
                    let now = Instant::now();
                    if now.duration_since(window.0) >= every {
                        let secs = now.duration_since(window.0).as_secs_f64();
                        let r = BandwidthResult::new(size, completed - window.1, secs);
                        println!("{}", report::bw_line(&r, side.report_gbits, side.output));
                        window = (now, completed);
                    }
                } else if completed / 64 != (completed - done) / 64 {
                    progress.tick(Instant::now(), completed);
                }
            }
            K_CTRL_RECV => {
                let msg = side.read_ctrl(c.wc.wr_id);
                side.post_ctrl_recv()?;
                if let Some(Ctrl::Credit { n }) = msg {
                    // (u64::MAX: no flow control in this test; a stray credit is ignored.)
                    credits = credits.saturating_add(u64::from(n));
                }
            }
            _ => {}
        }
    }
    let end = Instant::now();
    if let Some(w) = &sample {
        if w.counted() == 0 {
            return Err(nothing_counted(test, size, w));
        }
    }
    let (result, span) = match &sample {
        Some(w) => (
            BandwidthResult::new(size, w.counted(), w.seconds()),
            w.span(),
        ),
        None => (
            BandwidthResult::new(size, completed, end.duration_since(start).as_secs_f64())
                .with_peak(times.as_ref().and_then(PeakTimes::fastest)),
            (start, end),
        ),
    };
    if write_index {
        // The pattern back where the indices went, for the next size.
        for k in 0..posted.min(slots) {
            side.fill(CLIENT_SEED, k * size, head);
        }
    }
    Ok(BwRun {
        result,
        span,
        checked,
        completed,
        times,
    })
}

/// The most latency samples a size keeps (80 MB): a `-D` run longer than that many round
/// trips (80 s at a half round trip of 4 us) summarises its first ones, and says so.
const MAX_LAT_SAMPLES: usize = 10_000_000;

/// What one size of a latency test did.
struct LatRun {
    /// The samples in microseconds (at most [`MAX_LAT_SAMPLES`]): every operation's, or with
    /// `-D` those that completed in the sampling window.
    samples: Vec<f64>,
    /// The operations measured: all of them, or with `-D` those of the window.
    counted: u64,
    /// `-D`: the sampling window's length in seconds.
    window_seconds: Option<f64>,
    /// Operations done over the whole run (an atomic test's server checks its counter
    /// against it).
    completed: u64,
    /// Octets the client checked.
    checked: u64,
}

/// The samples of a latency size as they are taken: every one, or with `-D` those that
/// complete in the sampling window (perftest's duration mode counts only those).
struct LatSamples {
    kept: Vec<f64>,
    window: Option<SampleWindow>,
    counted: u64,
}

impl LatSamples {
    /// The operation timed from `t0` just completed; `halve`: a ping-pong, whose half round
    /// trip is the sample.
    fn take(&mut self, t0: Instant, halve: bool) {
        let now = Instant::now();
        let mut us = now.duration_since(t0).as_secs_f64() * 1e6;
        if halve {
            us /= 2.0;
        }
        if let Some(w) = &mut self.window {
            if !w.contains(now) {
                return;
            }
            w.completed(now, 1);
        }
        self.counted += 1;
        if self.kept.len() < MAX_LAT_SAMPLES {
            self.kept.push(us);
        }
    }
}

/// One size of a latency test from the client: `-n` operations, or as many as `duration`
/// allows (measuring those of its middle, as perftest).
fn client_lat(side: &mut Side, size: u64, duration: Option<Duration>) -> Result<LatRun, String> {
    let test = side.hello.test;
    let max = side.max_size();
    let iters = side.hello.iters;
    // The pong lands at offset `max`; clear its last byte so stamp 1 is news.
    side.data.write((max + size - 1) as usize, &[0]);
    let start = Instant::now();
    let mut samples = LatSamples {
        kept: Vec::with_capacity(iters.min(MAX_LAT_SAMPLES as u64) as usize),
        window: duration.map(|d| SampleWindow::with_margin(start, d, side.hello.margin)),
        counted: 0,
    };
    let mut progress = Progress::new(side, size, duration, start);
    let mut i = 0u64;
    let mut checked = 0u64;
    loop {
        let done = match &samples.window {
            Some(w) => w.time_up(Instant::now()),
            None => i >= iters,
        };
        if done {
            break;
        }
        if matches!(test, TestKind::WriteLat | TestKind::SendLat) {
            // The ping's index and stamp, before the clock starts.
            side.lat_mark(CLIENT_SEED, size, i);
        }
        let t0 = sample_start(&mut progress, i);
        match test {
            TestKind::WriteLat | TestKind::SendLat => {
                if test == TestKind::SendLat {
                    side.qp
                        .post_recv(RecvWr {
                            wr_id: K_DATA_RECV | 1,
                            sg_list: side.data.sge(max as usize, size as u32).into(),
                        })
                        .map_err(|e| e.to_string())?;
                    if side.hello.imm {
                        // The pong's Immediate Data takes a receive of its own.
                        side.qp
                            .post_recv(RecvWr {
                                wr_id: K_DATA_RECV | 2,
                                sg_list: SgeList::new(),
                            })
                            .map_err(|e| e.to_string())?;
                    }
                }
                let op = if test == TestKind::WriteLat {
                    side.write_op(side.remote.to + max, i)
                } else {
                    side.send_op(i)
                };
                side.post_data(K_DATA | i, op, 0, size, true)?;
                if side.hello.imm {
                    let c = wait_immediate(side, i)?;
                    if c.wc.wr_id & KIND_MASK == K_CTRL_RECV {
                        side.post_ctrl_recv()?;
                    }
                    if c.wc.immediate != Some(i) {
                        return Err(format!(
                            "{}: reply {i} carried Immediate Data {:?}",
                            test.name(),
                            c.wc.immediate
                        ));
                    }
                } else {
                    wait_pong(side, test, max, size, i)?;
                }
                samples.take(t0, true);
                if !side.lat_check(SERVER_SEED, max, size, i) {
                    return Err(format!("{}: reply {i} has wrong content", test.name()));
                }
                // Off the clock: the next pong must land whole to pass.
                side.lat_poison(SERVER_SEED, max, size);
                checked += size;
            }
            _ => {
                let (op, sink) = if test == TestKind::AtomicLat {
                    (side.atomic(i), 0)
                } else {
                    (
                        SendOp::Read {
                            remote_stag: side.remote_stag(),
                            remote_to: side.remote.to,
                        },
                        max,
                    )
                };
                side.post_data(K_DATA | i, op, sink, size, true)?;
                let mut idle = Idle::new();
                loop {
                    if let Some(c) = side.lat_next()? {
                        if c.wc.wr_id == K_DATA | i {
                            break;
                        }
                    } else if idle.wait() {
                        return Err(format!(
                            "{}: no completion: {}",
                            test.name(),
                            side.fail_reason()
                        ));
                    }
                }
                samples.take(t0, false);
                if test == TestKind::AtomicLat {
                    let original = side.original(0);
                    if original != i {
                        return Err(format!(
                            "atomic-lat: operation {i} saw the counter at {original}"
                        ));
                    }
                } else if let Some(at) = side.mismatch(SERVER_SEED, max, 0, size) {
                    return Err(format!("read-lat: read {i} differs at byte {at}"));
                } else {
                    // Off the clock: the next Read must place every octet to pass.
                    side.poison(SERVER_SEED, max, 0, size);
                }
                checked += size;
            }
        }
        i += 1;
    }
    // Put the pattern back where the index and the stamp went, for the next size.
    side.fill(CLIENT_SEED, 0, size);
    if let Some(w) = &samples.window {
        if samples.counted == 0 {
            return Err(nothing_counted(test, size, w));
        }
    }
    if samples.counted > samples.kept.len() as u64 {
        eprintln!(
            "{}: {size} B: the latency figures are of the first {} of {} round trips \
             (at most {MAX_LAT_SAMPLES} samples are kept)",
            test.name(),
            samples.kept.len(),
            samples.counted
        );
    }
    Ok(LatRun {
        window_seconds: samples.window.map(|w| w.seconds()),
        samples: samples.kept,
        counted: samples.counted,
        completed: i,
        checked,
    })
}

/// `-D` so short that no operation completed in its sampling window: a row of zeros would
/// look like a result.
fn nothing_counted(test: TestKind, size: u64, w: &SampleWindow) -> String {
    format!(
        "{} {size} B: no operation completed in -D's sampling window ({} s): give a longer -D",
        test.name(),
        w.seconds()
    )
}

/// The start of a latency sample after `done` iterations: the progress line or bar (once a
/// second, a write to stderr or the terminal) is shown first, then the clock is read, so that
/// the write is not inside the sample.
fn sample_start(progress: &mut Progress, done: u64) -> Instant {
    progress.tick(Instant::now(), done);
    Instant::now()
}

/// Waits for the pong of iteration `i` with Immediate Data: the receive its Immediate Data
/// completes (after the data: RFC 7306 7).
fn wait_immediate(side: &Side, i: u64) -> Result<Completion, String> {
    let mut idle = Idle::new();
    loop {
        match side.lat_next()? {
            Some(c) if c.wc.opcode == WcOpcode::RecvImmediate => return Ok(c),
            Some(_) => {}
            None => {
                if idle.wait() {
                    return Err(format!(
                        "{}: no Immediate Data for ping {i}: {}",
                        side.hello.test.name(),
                        side.fail_reason()
                    ));
                }
            }
        }
    }
}

/// Waits for the pong of iteration `i`: the stamp in the last byte (write-lat) or the receive
/// completion (send-lat).
fn wait_pong(side: &Side, test: TestKind, max: u64, size: u64, i: u64) -> Result<(), String> {
    let mut idle = Idle::new();
    loop {
        if test == TestKind::WriteLat
            && side.data.read_volatile((max + size - 1) as usize) == Some(stamp(i))
        {
            return Ok(());
        }
        match side.lat_next()? {
            Some(c) if test == TestKind::SendLat && c.wc.opcode == WcOpcode::Recv => return Ok(()),
            Some(_) => {}
            None => {
                if idle.wait() {
                    return Err(format!(
                        "{}: no reply to ping {i}: {}",
                        test.name(),
                        side.fail_reason()
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    /// `-q`'s per-size barrier lets all through together, and a failed queue pair's thread
    /// releases the others with an error instead of leaving them waiting; `each` then reports
    /// the failure, not the others' word for it.
    #[test]
    fn a_failed_queue_pair_breaks_the_size_barrier() {
        // On a thread of its own: the regression this guards against leaves the others
        // waiting, which fails here instead of hanging the test.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let barrier = SizeBarrier::new(3);
            let mut items = [0u8, 1, 2];
            let got = each(&mut items, |i| {
                barrier.wait()?; // all three: through
                if *i == 1 {
                    let _broken = AbandonUnlessDone(Some(&barrier));
                    return Err("queue pair 1 failed".into());
                }
                barrier.wait()
            });
            let _ = tx.send((got, barrier.wait()));
        });
        let (got, after) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the barrier still holds threads after 30 s");
        assert_eq!(got, Err("queue pair 1 failed".to_string()));
        assert_eq!(after, Err(BARRIER_BROKEN.to_string()));
    }

    /// A latency sample starts after the progress line is written: a slow write (a terminal,
    /// a pipe nobody reads) is not in the sample.
    #[test]
    fn progress_is_shown_before_a_sample_starts() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static PRINTED: AtomicUsize = AtomicUsize::new(0);
        let start = Instant::now() - Duration::from_secs(2);
        let mut progress = Progress {
            test: "write-lat",
            bw: false,
            size: 2,
            iters: 1000,
            quiet: false,
            duration: None,
            start,
            // Due: a line is printed at the next tick.
            next: start + Progress::EVERY,
            terminal: false,
            bar: None,
            print: |_| {
                PRINTED.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(30));
            },
        };
        let before = Instant::now();
        let t0 = sample_start(&mut progress, 500);
        assert!(
            t0.duration_since(before) >= Duration::from_millis(30),
            "the sample started before the progress line was written"
        );
        assert_eq!(PRINTED.load(Ordering::Relaxed), 1);
        // Not due again for a second: nothing printed before the next sample.
        sample_start(&mut progress, 501);
        assert_eq!(PRINTED.load(Ordering::Relaxed), 1);
    }
}
