//! Soak: random work through the lossy relay bed (`scripts/netns-relay.sh`) for a set time,
//! every byte checked: a server (iwra) <-> relay (iwrr, `testbed::relay`: loss, reordering,
//! duplication, delay with jitter) <-> [`CLIENTS`] client threads (iwrb). Three cases: an
//! engine server and engine clients (`engine_clients`), an engine server and clients on the
//! socket transport (`socket_clients`), a socket-transport server and engine clients
//! (`socket_server`), all at MTU 1500; engines at both ends at MTU 9000 (`jumbo_frames`).
//!
//! The clients share one [`Device`]; the odd-numbered threads work as a verbs application
//! does (rping's client): an [`IdleQp`] with a receive posted through its [`QpPoster`]
//! before the connect (two with IFT, the welcome's first), `connect_qp_async` and the
//! `Established` event, every post through the poster, completions waited for on a
//! [`CompletionChannel`] (arm, poll, sleep).
//!
//! Each client thread loops until the time is up: it connects (to one of the server's three
//! listeners: two with MPA framing, one of which asks for Markers, with MPA revision 1 or 2,
//! peer-to-peer with an RTR or not, Markers and CRCs asked for or not, drawn per connection;
//! one with IFT framing (draft-williams-iwarp-ift-01), the client's header and payload CRCs
//! and its speculative placement drawn per connection, the server's region told in its first
//! Send since IFT carries no private data), runs a random number of batches of random
//! operations, and ends the connection in one of three ways. Operations,
//! each in its own lane of the regions, several in flight at once:
//! * a Write of random length (1 octet to a lane, log-uniform) gathered from one to three
//!   SGEs, to a random offset of the server's region, then a Read of the same range back into
//!   another local region (a Read Request is acted on only after the messages before it in
//!   the stream, the Write among them, were placed: RFC 5040 section 5.5 rules 12 and 17): the
//!   read-back is checked;
//! * a Send of random length (1 octet to [`SEND_MAX`]) that the server echoes with a Send of
//!   its own: the echo is checked;
//! * an RDMA Write with Immediate Data (RFC 7306 6), read back, whose immediate the server
//!   sends back in an Immediate Data message of its own;
//! * an 8-octet Write, then a FetchAdd, a CmpSwap (its compare made to fail one time in four)
//!   and a Read of that word (RFC 7306 5.4, each acting after the one before): each atomic
//!   returns the value before it, the Read the last.
//!
//! The server's Markers listener feeds its connections' receives from one shared receive
//! queue, each buffer posted back once its echo is done, however the connection ends; at the
//! end every buffer is back.
//!
//! Every completion is the one expected (work request, operation, length, Immediate Data),
//! each once, and nothing else comes (the server's welcome, too, once per IFT connection).
//! Each connection's startup agreed on what the client asked for and the listener wants
//! (framing; MPA's revision, CRCs, Markers each way and RTR; IFT's CRCs and speculative
//! placement), and with loss, in runs of 15 s or more, each engine placed some IFT frames
//! speculatively.
//!
//! Ends: the client disconnects (within the graceful wait: no reset); the client asks the
//! server to disconnect (an empty Send) and waits for its queue pair to finish (`PeerClosed`);
//! the client aborts (a reset). The server tells each end apart by its queue pair's error
//! (`PeerClosed`, `PeerReset`; `PeerUnreachable` when its keepalive found no answer at all)
//! and its counts must match the clients'. Afterwards every client and server thread returned
//! without error, every engine ran without error, no CRC error and no Terminate, nothing is
//! held in a reassembly store, and every connection a client made was established at the
//! server.
//!
//! Environment: `SOAK_SECONDS` (default 8) for each test, `SOAK_SEED` (default 1),
//! `SOAK_LOSS` (default 0.01, at most 0.05: as much reordering, half as much duplication),
//! `SOAK_MTU` (default 1500; `jumbo_frames` always runs at 9000). Long runs by hand:
//! `scripts/soak.sh` (docs/RELIABILITY.md).
//!
//! Needs root; skips (or fails under `CI=true`) otherwise.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datapath::engine::EngineCounters;
use datapath::{
    Access, Agreed, AtomicOp, CmEvent, CmEventChannel, Completion, CompletionChannel,
    CompletionQueue, ConnectParams, ConnectRequest, Connection, DatapathError, Device, Framing,
    IdleQp, Keepalive, MemoryRegion, ProtectionDomain, QpError, QpPoster, QueuePair, RecvWr,
    SendOp, SendWr, Sge, SgeList, SharedReceiveQueue, Stag, Transport, WcOpcode, WcStatus,
};
use ift::IftConfig;
use testbed::relay::*;
use testbed::{relay_bed_or_skip, spawn_in_ns};

mod common;
use common::{left, pattern, region_bytes};

/// Client threads, each with one connection at a time.
const CLIENTS: usize = 4;
/// The server's region per connection, and each client's Write source and Read sink.
const REGION: usize = 4 << 20;
/// Operations in flight at once, each in its own lane of the regions.
const LANES: usize = 4;
const LANE: usize = REGION / LANES;
/// Longest Send (and the server's receive slots).
const SEND_MAX: usize = 64 << 10;
/// Receives the server keeps posted for a connection of its own.
const SLOTS: usize = 4;
/// Buffers of the shared receive queue the Markers listener's connections take from.
const POOL_SLOTS: usize = 16;
/// Longest wait for one batch's completions, a connection or a close.
const WAIT: Duration = Duration::from_secs(30);
/// `disconnect`'s graceful wait, after which it resets the connection.
const DISCONNECT_WAIT: Duration = Duration::from_secs(10);
/// The most loss `SOAK_LOSS` may ask for: the waits above are sized for it.
const MAX_LOSS: f64 = 0.05;
/// The server's listeners of each test.
const ENGINE_PORTS: Ports = Ports {
    plain: 19_635,
    markers: 19_637,
    ift: 19_655,
};
const SOCKET_CLIENT_PORTS: Ports = Ports {
    plain: 19_636,
    markers: 19_638,
    ift: 19_656,
};
const SOCKET_SERVER_PORTS: Ports = Ports {
    plain: 19_639,
    markers: 19_640,
    ift: 19_657,
};
const JUMBO_PORTS: Ports = Ports {
    plain: 19_658,
    markers: 19_659,
    ift: 19_660,
};
/// Work request ids: the operation's batch and lane, and its kind.
const WRITE: u64 = 0;
const READ: u64 = 1;
const SEND: u64 = 2;
const ECHO_RECV: u64 = 3;
/// The empty Send that asks the server to disconnect.
const BYE: u64 = 4;
const FETCH_ADD: u64 = 5;
const CMP_SWAP: u64 = 6;
/// The echo receive a verbs-style client posts before connecting.
const EARLY_ECHO_RECV: u64 = u64::MAX;
/// With IFT framing (no private data), the server's first Send, which says where its region
/// is, as the Reply's private data does with MPA; and the client's receive for it, posted
/// before the connect.
const WELCOME: u64 = u64::MAX - 1;
const WELCOME_RECV: u64 = u64::MAX - 2;
/// Where the server's region is: its STag and tagged offset, big-endian.
const WELCOME_LEN: usize = 12;

fn wr_id(batch: usize, lane: usize, kind: u64) -> u64 {
    ((batch as u64) << 16) | ((lane as u64) << 8) | kind
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a valid value")),
        Err(_) => default,
    }
}

/// SplitMix64: the operations' choices, reproducible from `SOAK_SEED` (the interleaving of the
/// threads and the relay's timing are not).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    /// Log-uniform in `1..=max`: as many short messages as long ones.
    fn length(&mut self, max: usize) -> usize {
        let bits = usize::BITS - max.leading_zeros();
        let top = 1usize << self.range(0, bits as usize - 1);
        self.range(top.min(max).div_ceil(2).max(1), top.min(max))
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Both ends' parameters: RFC 7306's Atomic Operations and Immediate Data on (both ends must
/// agree; nothing negotiates them).
fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(20),
        rdmap_extensions: true,
        ..ConnectParams::default()
    }
}

/// The server's parameters: keepalive after a second idle, since the relay may drop the
/// reset of an aborting client, leaving the server's end open with nothing to send (as any
/// half-open TCP connection; the probe draws the client stack's reset). On the socket
/// transport the kernel, with a user timeout set (30 s by default), ends such a connection
/// at the user timeout rather than after the probes: only if every probe's answer is lost.
fn server_params() -> ConnectParams {
    ConnectParams {
        keepalive: Some(Keepalive {
            idle: Duration::from_secs(1),
            interval: Duration::from_millis(500),
            probes: 4,
        }),
        ..params()
    }
}

/// The server's three listeners: one that asks for no Markers, one that asks to receive them
/// (RFC 5044 section 7.1.2: the M bit), one that frames with IFT.
#[derive(Debug, Clone, Copy)]
struct Ports {
    plain: u16,
    markers: u16,
    ift: u16,
}

/// A client's connection parameters, drawn per connection: MPA revision 1 or 2 (with the
/// peer-to-peer model and its RTR in some of the latter), Markers wanted or not, CRCs
/// wanted or not (the server always wants them, so they are always used); with `ift`, IFT
/// framing with its header and payload CRCs each sent or not and speculative placement of
/// our frames allowed or not (the server sends both CRCs and allows it).
fn client_params(rng: &mut Rng, ift: bool) -> ConnectParams {
    let mut p = params();
    if ift {
        p.framing = Framing::Ift(IftConfig {
            header_crc: rng.chance(80),
            payload_crc: rng.chance(80),
            allow_speculative: rng.chance(70),
            ..IftConfig::with_vtag(0)
        });
        return p;
    }
    p.mpa.rev = if rng.chance(20) { 1 } else { 2 };
    p.mpa.peer_to_peer = p.mpa.rev == 2 && rng.chance(25);
    p.mpa.markers = rng.chance(30);
    p.mpa.crc = rng.chance(90);
    p
}

/// What the client threads did, summed.
#[derive(Debug, Default)]
struct Tally {
    connections: u64,
    /// Of them, framed with IFT.
    ift: u64,
    writes_read_back: u64,
    echoes: u64,
    immediates: u64,
    atomics: u64,
    bytes_checked: u64,
    client_disconnects: u64,
    server_disconnects: u64,
    aborts: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.connections += o.connections;
        self.ift += o.ift;
        self.writes_read_back += o.writes_read_back;
        self.echoes += o.echoes;
        self.atomics += o.atomics;
        self.immediates += o.immediates;
        self.bytes_checked += o.bytes_checked;
        self.client_disconnects += o.client_disconnects;
        self.server_disconnects += o.server_disconnects;
        self.aborts += o.aborts;
    }
}

/// How a connection ended at the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerEnd {
    /// The client's empty Send: the server disconnected.
    Asked,
    /// The client closed (its queue pair's error `PeerClosed`).
    Closed,
    /// The client reset it (`PeerReset`).
    Reset,
    /// Keepalive went unanswered (`PeerUnreachable`): the reset of an aborting client and
    /// the answers to every probe were lost.
    Unreachable,
}

/// The server's count of connections and of their ends.
#[derive(Debug, Default)]
struct ServerTally {
    accepted: u64,
    /// Of them, on the IFT listener.
    ift: u64,
    /// Receives completed from the shared receive queue.
    pool_receives: u64,
    asked: u64,
    closed: u64,
    reset: u64,
    unreachable: u64,
}

impl ServerTally {
    fn add(&mut self, end: ServerEnd) {
        *match end {
            ServerEnd::Asked => &mut self.asked,
            ServerEnd::Closed => &mut self.closed,
            ServerEnd::Reset => &mut self.reset,
            ServerEnd::Unreachable => &mut self.unreachable,
        } += 1;
    }
}

/// The receive buffers a listener's connections share: a shared receive queue of one
/// protection domain, its buffers in one region, each taken by whichever connection's Send
/// arrives first and posted back once its echo is done.
struct SrqPool {
    pd: ProtectionDomain,
    srq: SharedReceiveQueue,
    slots: MemoryRegion,
    /// Which buffers are posted: a buffer posted twice, or completed while not posted, is a
    /// mistake of the test or a receive the stack completed twice.
    posted: [AtomicBool; POOL_SLOTS],
    /// Receives the pool's connections completed successfully.
    received: AtomicU64,
}

impl SrqPool {
    fn new() -> Result<SrqPool, String> {
        let pd = ProtectionDomain::new();
        let srq = SharedReceiveQueue::new(&pd, POOL_SLOTS).map_err(|e| e.to_string())?;
        let slots = pd
            .register(POOL_SLOTS * SEND_MAX, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let pool = SrqPool {
            pd,
            srq,
            slots,
            posted: std::array::from_fn(|_| AtomicBool::new(false)),
            received: AtomicU64::new(0),
        };
        for i in 0..POOL_SLOTS {
            pool.post(i)?;
        }
        Ok(pool)
    }

    /// Posts buffer `i` (back) to the shared receive queue.
    fn post(&self, i: usize) -> Result<(), String> {
        if self.posted[i].swap(true, Ordering::AcqRel) {
            return Err(format!("pool buffer {i} posted while posted"));
        }
        self.srq
            .post_recv(slot_recv(&self.slots, i))
            .map_err(|e| format!("SRQ post: {e}"))
    }

    /// A receive of buffer `i` completed (taken from the queue, flushed or not).
    fn taken(&self, i: usize) -> Result<(), String> {
        if !self.posted[i].swap(false, Ordering::AcqRel) {
            return Err(format!("pool buffer {i} completed while not posted"));
        }
        Ok(())
    }

    /// Whether every buffer is posted.
    fn all_posted(&self) -> bool {
        self.srq.len() == POOL_SLOTS && self.posted.iter().all(|p| p.load(Ordering::Acquire))
    }
}

/// Receive `i` into slot `i` of `slots`.
fn slot_recv(slots: &MemoryRegion, i: usize) -> RecvWr {
    RecvWr {
        wr_id: i as u64,
        sg_list: slots.sge(i * SEND_MAX, SEND_MAX as u32).into(),
    }
}

/// Serves one connection: advertises its region in the Reply's private data (with `ift`, in
/// a first Send, [`WELCOME`]), echoes every Send, disconnects on an empty Send, and returns
/// how the connection ended. Its receives are its own, or with `pool` taken from the pool's
/// shared receive queue (and every buffer taken is posted back there, however the
/// connection ends). Gives up only [`WAIT`] after `stop` (every end flushes the receives
/// the queue pair holds, and one fed from the pool is seen ended by its status).
fn serve(
    req: ConnectRequest,
    stop: Arc<AtomicBool>,
    pool: Option<Arc<SrqPool>>,
    ift: bool,
) -> Result<ServerEnd, String> {
    let own_pd;
    let pd = match &pool {
        Some(p) => &p.pd,
        None => {
            own_pd = ProtectionDomain::new();
            &own_pd
        }
    };
    let cq = CompletionQueue::new();
    let target = pd
        .register(REGION, Access::ALL)
        .map_err(|e| e.to_string())?;
    let own_slots = pool
        .is_none()
        .then(|| pd.register(SLOTS * SEND_MAX, Access::LOCAL_WRITE))
        .transpose()
        .map_err(|e| e.to_string())?;
    let slots = pool
        .as_ref()
        .map(|p| &p.slots)
        .or(own_slots.as_ref())
        .ok_or("no receive buffers")?;
    let mut welcome = target.stag().0.to_be_bytes().to_vec();
    welcome.extend_from_slice(&target.base_to().to_be_bytes());
    let (private_data, welcome_send) = if ift {
        let mr = pd
            .register(WELCOME_LEN, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        mr.write(0, &welcome);
        (&[][..], Some(mr))
    } else {
        (&welcome[..], None)
    };
    let conn = match &pool {
        Some(p) => req.use_srq(&p.srq).accept(pd, &cq, private_data),
        None => req.accept_with_recvs(
            pd,
            &cq,
            private_data,
            (0..SLOTS).map(|i| slot_recv(slots, i)).collect(),
        ),
    }
    .map_err(|e| format!("accept: {e}"))?;
    let qp = conn.qp;
    if let Some(mr) = &welcome_send {
        match qp.post_send(SendWr {
            wr_id: WELCOME,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: mr.sge(0, WELCOME_LEN as u32).into(),
            signaled: true,
            fence: false,
        }) {
            // The client ends nothing before it has the welcome.
            Ok(()) => {}
            Err(e) => return Err(format!("welcome: {e}; {:?}", qp.status())),
        }
    }
    // A buffer of the pool this connection took (a receive completed, or its echo's Send
    // completed in any way) goes back to the pool.
    let give_back = |c: &Completion| match &pool {
        Some(p) => p.post(c.wc.wr_id as usize % POOL_SLOTS),
        None => Ok(()),
    };
    // A receive completed: a pool buffer left the queue.
    let taken = |c: &Completion| match (&pool, c.wc.opcode) {
        (Some(p), WcOpcode::Recv | WcOpcode::RecvImmediate) => {
            if c.wc.status == WcStatus::Success {
                p.received.fetch_add(1, Ordering::Relaxed);
            }
            p.taken(c.wc.wr_id as usize % POOL_SLOTS)
        }
        _ => Ok(()),
    };
    let slot_count = if pool.is_some() { POOL_SLOTS } else { SLOTS };
    let mut stopped: Option<Instant> = None;
    // Successful completions of the welcome: one with IFT, none otherwise. The client sends
    // its first batch only after the welcome, and waits in each batch for something of ours
    // in answer (a Read Response, an atomic's original, an echo): so we have the welcome's
    // acknowledgement before the client ends the connection, however it ends it.
    let mut welcomed = 0;
    let end = loop {
        let Some(c) = cq.wait(Duration::from_secs(1)) else {
            if pool.is_some() && qp.status().error.is_some() {
                break ended_by_client(&qp)?;
            }
            if stop.load(Ordering::Relaxed)
                && stopped.get_or_insert_with(Instant::now).elapsed() > WAIT
            {
                return Err(format!(
                    "server: nothing {WAIT:?} after the run: {:?}",
                    qp.status()
                ));
            }
            continue;
        };
        let i = c.wc.wr_id as usize % slot_count;
        taken(&c)?;
        let posted = match (c.wc.status, c.wc.opcode) {
            (WcStatus::Success, WcOpcode::Send) if c.wc.wr_id == WELCOME => {
                welcomed += 1;
                Ok(())
            }
            (WcStatus::Success, WcOpcode::Recv) => {
                let len = c.wc.byte_len as usize;
                if len == 0 {
                    give_back(&c)?;
                    qp.disconnect();
                    finished(&qp, "server after the empty Send")?;
                    break ServerEnd::Asked;
                }
                qp.post_send(SendWr {
                    wr_id: (slot_count + i) as u64,
                    op: SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    },
                    sg_list: slots.sge(i * SEND_MAX, len as u32).into(),
                    signaled: true,
                    fence: false,
                })
            }
            // An RDMA Write with Immediate Data: its immediate goes back alone.
            (WcStatus::Success, WcOpcode::RecvImmediate) => qp.post_send(SendWr {
                wr_id: (slot_count + i) as u64,
                op: SendOp::Immediate {
                    solicited: false,
                    immediate: c
                        .wc
                        .immediate
                        .ok_or_else(|| format!("server: no immediate in {c:?}"))?,
                },
                sg_list: SgeList::default(),
                signaled: true,
                fence: false,
            }),
            (WcStatus::Success, WcOpcode::Send | WcOpcode::Immediate) if pool.is_some() => {
                give_back(&c)?;
                Ok(())
            }
            (WcStatus::Success, WcOpcode::Send | WcOpcode::Immediate) => {
                qp.post_recv(slot_recv(slots, i))
            }
            // The client ended the connection: the rest flush too.
            (WcStatus::WrFlushError, _) => {
                give_back(&c)?;
                break ended_by_client(&qp)?;
            }
            _ => return Err(format!("server: {c:?}; {:?}", qp.status())),
        };
        match posted {
            Ok(()) => {}
            // The client closed the connection meanwhile (RDMAP Closing refuses posts; in
            // Error they would complete flushed).
            Err(DatapathError::Disconnected) => {
                give_back(&c)?;
                break ended_by_client(&qp)?;
            }
            Err(e) => return Err(format!("server post: {e}; {:?}", qp.status())),
        }
    };
    // Whatever else completed before the queue pair finished: flushes, and an echo that
    // completed just before the end.
    while let Some(c) = cq.try_next() {
        let echoed = matches!(c.wc.opcode, WcOpcode::Send | WcOpcode::Immediate);
        if !(c.wc.status == WcStatus::WrFlushError || echoed && c.wc.status == WcStatus::Success) {
            return Err(format!("server, after the end: {c:?}"));
        }
        if c.wc.wr_id == WELCOME && c.wc.status == WcStatus::Success {
            welcomed += 1;
        }
        taken(&c)?;
        give_back(&c)?;
    }
    if welcomed != u32::from(ift) {
        return Err(format!(
            "server: the welcome completed {welcomed} times (IFT: {ift})"
        ));
    }
    Ok(end)
}

/// The server's queue pair ended by the client: how, from its error.
fn ended_by_client(qp: &QueuePair) -> Result<ServerEnd, String> {
    let end = match qp.status().error {
        Some(QpError::PeerClosed) => ServerEnd::Closed,
        Some(QpError::PeerReset) => ServerEnd::Reset,
        Some(QpError::PeerUnreachable) => ServerEnd::Unreachable,
        _ => return Err(format!("server: ended by {:?}", qp.status())),
    };
    qp.disconnect();
    finished(qp, "server after the client's end")?;
    Ok(end)
}

fn finished(qp: &QueuePair, what: &str) -> Result<(), String> {
    if qp.wait_finished(WAIT) {
        Ok(())
    } else {
        Err(format!("{what}: not finished: {:?}", qp.status()))
    }
}

/// An engine on `ifname` (in the calling thread's namespace), or the socket transport.
fn open_device(engine: bool, ifname: &str) -> Result<Device, String> {
    if !engine {
        return Ok(Device::socket());
    }
    Device::open(Transport::Xdp {
        ifname: ifname.into(),
        config: Box::default(),
    })
    .map_err(|e| format!("engine: {e}"))
}

/// The server: an engine on the relay bed's `iwra0` (`engine`), or the socket transport,
/// accepting until `stop`, a thread per connection. Returns its engine's counters (`None`
/// for sockets) and how its connections ended.
fn server(
    ports: Ports,
    engine: bool,
    ready: std::sync::mpsc::Sender<()>,
    stop: Arc<AtomicBool>,
) -> Result<(Option<EngineCounters>, ServerTally), String> {
    let device = open_device(engine, DEV_A).map_err(|e| format!("server {e}"))?;
    let listen = |port, markers, ift| {
        let mut p = server_params();
        p.mpa.markers = markers;
        if ift {
            p.framing = Framing::Ift(IftConfig::with_vtag(0));
        }
        device
            .listen(SocketAddr::from((ADDR_A, port)), p)
            .map_err(|e| format!("listen on {port}: {e}"))
    };
    let listeners = [
        (listen(ports.plain, false, false)?, None, false),
        (
            listen(ports.markers, true, false)?,
            Some(Arc::new(SrqPool::new()?)),
            false,
        ),
        (listen(ports.ift, false, true)?, None, true),
    ];
    let _ = ready.send(());
    let mut serving: Vec<std::thread::JoinHandle<Result<ServerEnd, String>>> = Vec::new();
    let mut tally = ServerTally::default();
    let join = |t: std::thread::JoinHandle<_>, tally: &mut ServerTally| {
        tally.add(t.join().map_err(|_| "a serving thread panicked")??);
        Ok::<_, String>(())
    };
    while !stop.load(Ordering::Relaxed) {
        for (listener, pool, ift) in &listeners {
            match listener.accept_timeout(Duration::from_millis(25)) {
                Ok(Some(req)) => {
                    tally.accepted += 1;
                    tally.ift += u64::from(*ift);
                    let (stop, pool, ift) = (stop.clone(), pool.clone(), *ift);
                    serving.push(std::thread::spawn(move || serve(req, stop, pool, ift)));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("accept: {e}")),
            }
        }
        // Each connection's outcome as soon as it ended.
        let mut i = 0;
        while i < serving.len() {
            if serving[i].is_finished() {
                join(serving.swap_remove(i), &mut tally)?;
            } else {
                i += 1;
            }
        }
    }
    for t in serving {
        join(t, &mut tally)?;
    }
    for (listener, pool, _) in listeners {
        drop(listener);
        if let Some(pool) = pool {
            // Every buffer a connection took came back, however it ended.
            if !pool.all_posted() {
                return Err(format!(
                    "the shared receive queue holds {} of its {POOL_SLOTS} buffers",
                    pool.srq.len()
                ));
            }
            tally.pool_receives = pool.received.load(Ordering::Relaxed);
        }
    }
    Ok((device.close(), tally))
}

/// The client side's regions and completion queue, reused by each connection of a thread.
struct Regions {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    /// The queue's completion channel, for the verbs-style clients, which wait on it (arm,
    /// poll, sleep on the channel) rather than in [`CompletionQueue::wait`].
    channel: Option<CompletionChannel>,
    src: MemoryRegion,
    dst: MemoryRegion,
    send: MemoryRegion,
    echo: MemoryRegion,
}

impl Regions {
    fn new(with_channel: bool) -> Result<Regions, String> {
        let pd = ProtectionDomain::new();
        let reg = |len| pd.register(len, Access::ALL).map_err(|e| e.to_string());
        let channel = if with_channel {
            Some(CompletionChannel::new().map_err(|e| e.to_string())?)
        } else {
            None
        };
        Ok(Regions {
            src: reg(REGION)?,
            dst: reg(REGION)?,
            send: reg(SEND_MAX)?,
            echo: reg(SEND_MAX)?,
            cq: channel
                .as_ref()
                .map_or_else(CompletionQueue::new, CompletionQueue::with_channel),
            channel,
            pd,
        })
    }

    /// The next completion, waiting until `deadline`: on the channel as a verbs application
    /// does (`ibv_req_notify_cq`, poll again, `ibv_get_cq_event`), or in the queue.
    fn next(&self, deadline: Instant) -> Option<Completion> {
        let Some(channel) = &self.channel else {
            return self.cq.wait(left(deadline));
        };
        loop {
            if let Some(c) = self.cq.try_next() {
                return Some(c);
            }
            self.cq.req_notify(false).ok()?;
            // What came before the arming does not fire it.
            if let Some(c) = self.cq.try_next() {
                return Some(c);
            }
            if Instant::now() >= deadline {
                return None;
            }
            channel.wait_event(left(deadline));
        }
    }

    /// A receive for an echo.
    fn echo_recv(&self, wr_id: u64) -> RecvWr {
        RecvWr {
            wr_id,
            sg_list: self.echo.sge(0, SEND_MAX as u32).into(),
        }
    }
}

/// Where a connection's work requests go: its [`QueuePair`], or the [`QpPoster`] a
/// verbs-style client took from the [`IdleQp`] before connecting (one handle for the queue
/// pair's whole life, as a shim's `ibv_qp`).
enum Posts<'a> {
    Qp(&'a QueuePair),
    Poster(&'a QpPoster),
}

impl Posts<'_> {
    fn post_send(&self, wr: SendWr) -> Result<(), DatapathError> {
        match self {
            Posts::Qp(qp) => qp.post_send(wr),
            Posts::Poster(p) => p.post_send(wr),
        }
    }

    fn post_recv(&self, wr: RecvWr) -> Result<(), DatapathError> {
        match self {
            Posts::Qp(qp) => qp.post_recv(wr),
            Posts::Poster(p) => p.post_recv(wr),
        }
    }
}

/// A completion a batch waits for: its work request, operation, length and Immediate Data.
type Expected = (u64, WcOpcode, u32, Option<u64>);

/// What a batch checks in a region once its work completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checked {
    /// A Write's octets read back.
    ReadBack,
    /// A Write with Immediate Data's octets read back (its immediate checked in its completion).
    ImmediateReadBack,
    /// A Send's octets echoed.
    Echo,
    /// The originals an atomic pair returned, and the word read after them.
    Atomics,
}

/// One connection's work: one to eight batches of up to [`LANES`] operations. With
/// `early_echo_recv`, a receive for the first echo was posted before the connection ran;
/// returns whether it is still posted (no echo used it).
fn work(
    qp: &QueuePair,
    posts: &Posts,
    mut early_echo_recv: bool,
    r: &Regions,
    remote: (Stag, u64),
    rng: &mut Rng,
    tally: &mut Tally,
) -> Result<bool, String> {
    for batch in 0..rng.range(1, 8) {
        let mut expected: Vec<Expected> = Vec::new();
        // What regions must hold once the batch completed: (region, offset, octets, what).
        let mut checks: Vec<(&MemoryRegion, usize, Vec<u8>, Checked)> = Vec::new();
        let mut echoed = false;
        for lane in 0..rng.range(1, LANES) {
            let seed = rng.next();
            let id = |kind| wr_id(batch, lane, kind);
            let base = lane * LANE;
            let write = |sg: SgeList, at: usize, signaled: bool| SendWr {
                wr_id: id(WRITE),
                op: SendOp::Write {
                    remote_stag: remote.0,
                    remote_to: remote.1 + at as u64,
                },
                sg_list: sg,
                signaled,
                fence: false,
            };
            let read_back = |at: usize, len: usize| SendWr {
                wr_id: id(READ),
                op: SendOp::Read {
                    remote_stag: remote.0,
                    remote_to: remote.1 + at as u64,
                },
                sg_list: r.dst.sge(at, len as u32).into(),
                signaled: true,
                fence: false,
            };
            let post = |wr: SendWr| {
                posts
                    .post_send(wr)
                    .map_err(|e| format!("post {:?}: {e}", wr.op))
            };
            // One echo per batch: the client's echo buffer is one slot.
            if !echoed && rng.chance(30) {
                echoed = true;
                let recv_id = if std::mem::take(&mut early_echo_recv) {
                    EARLY_ECHO_RECV
                } else {
                    posts
                        .post_recv(r.echo_recv(id(ECHO_RECV)))
                        .map_err(|e| format!("post_recv: {e}"))?;
                    id(ECHO_RECV)
                };
                if rng.chance(50) {
                    // A Send, echoed.
                    let len = rng.length(SEND_MAX);
                    let data = pattern(seed, len);
                    r.send.write(0, &data);
                    post(SendWr {
                        wr_id: id(SEND),
                        op: SendOp::Send {
                            solicited: rng.chance(50),
                            invalidate: None,
                        },
                        sg_list: r.send.sge(0, len as u32).into(),
                        signaled: true,
                        fence: false,
                    })?;
                    expected.push((id(SEND), WcOpcode::Send, len as u32, None));
                    expected.push((recv_id, WcOpcode::Recv, len as u32, None));
                    checks.push((&r.echo, 0, data, Checked::Echo));
                } else {
                    // An RDMA Write with Immediate Data (RFC 7306 6), read back, its
                    // immediate echoed alone.
                    let len = rng.length(LANE);
                    let at = base + rng.range(0, LANE - len);
                    let (data, immediate) = (pattern(seed, len), rng.next());
                    r.src.write(at, &data);
                    post(SendWr {
                        op: SendOp::WriteImmediate {
                            remote_stag: remote.0,
                            remote_to: remote.1 + at as u64,
                            solicited: rng.chance(50),
                            immediate,
                        },
                        ..write(r.src.sge(at, len as u32).into(), at, true)
                    })?;
                    post(read_back(at, len))?;
                    expected.push((id(WRITE), WcOpcode::Write, len as u32, None));
                    expected.push((id(READ), WcOpcode::Read, len as u32, None));
                    expected.push((recv_id, WcOpcode::RecvImmediate, 0, Some(immediate)));
                    checks.push((&r.dst, at, data, Checked::ImmediateReadBack));
                }
                continue;
            }
            if rng.chance(20) {
                // A word written, added to, compared and (unless the compare is made to fail)
                // swapped, then read (RFC 7306 5.4 rules 3, 5 and 8, and section 7's table:
                // each acts after the one before it); each atomic returns the value before it.
                let at = base + 8 * rng.range(0, LANE / 8 - 3);
                let (v, add, swap) = (rng.next(), rng.next(), rng.next());
                let added = v.wrapping_add(add);
                let compare = if rng.chance(25) { !added } else { added };
                let last = if compare == added { swap } else { added };
                r.src.write(at, &v.to_ne_bytes());
                let signaled = rng.chance(50);
                post(write(r.src.sge(at, 8).into(), at, signaled))?;
                for (kind, op, sink) in [
                    (FETCH_ADD, AtomicOp::fetch_add(add), at),
                    (CMP_SWAP, AtomicOp::cmp_swap(compare, swap), at + 8),
                ] {
                    post(SendWr {
                        wr_id: id(kind),
                        op: SendOp::Atomic {
                            remote_stag: remote.0,
                            remote_to: remote.1 + at as u64,
                            op,
                        },
                        sg_list: r.dst.sge(sink, 8).into(),
                        signaled: true,
                        fence: false,
                    })?;
                }
                post(SendWr {
                    sg_list: r.dst.sge(at + 16, 8).into(),
                    ..read_back(at, 8)
                })?;
                if signaled {
                    expected.push((id(WRITE), WcOpcode::Write, 8, None));
                }
                expected.push((id(FETCH_ADD), WcOpcode::FetchAdd, 8, None));
                expected.push((id(CMP_SWAP), WcOpcode::CmpSwap, 8, None));
                expected.push((id(READ), WcOpcode::Read, 8, None));
                let words: Vec<u8> = [v, added, last]
                    .iter()
                    .flat_map(|w| w.to_ne_bytes())
                    .collect();
                checks.push((&r.dst, at, words, Checked::Atomics));
                continue;
            }
            // A Write gathered from one to three pieces, read back.
            let len = rng.length(LANE);
            let at = base + rng.range(0, LANE - len);
            let data = pattern(seed, len);
            r.src.write(at, &data);
            let mut sg = SgeList::default();
            let pieces = rng.range(1, 3).min(len);
            let mut done = 0;
            for p in 0..pieces {
                let n = if p + 1 == pieces {
                    len - done
                } else {
                    rng.range(1, len - done - (pieces - p - 1))
                };
                let s: Sge = r.src.sge(at + done, n as u32);
                sg.push(s).map_err(|e| e.to_string())?;
                done += n;
            }
            let signaled = rng.chance(50);
            post(write(sg, at, signaled))?;
            post(read_back(at, len))?;
            if signaled {
                expected.push((id(WRITE), WcOpcode::Write, len as u32, None));
            }
            expected.push((id(READ), WcOpcode::Read, len as u32, None));
            checks.push((&r.dst, at, data, Checked::ReadBack));
        }
        let deadline = Instant::now() + WAIT;
        while !expected.is_empty() {
            let c = r.next(deadline).ok_or_else(|| {
                format!(
                    "batch {batch}: still waiting for {expected:?} after {WAIT:?}; {:?}",
                    qp.status()
                )
            })?;
            let got = (c.wc.wr_id, c.wc.opcode, c.wc.byte_len, c.wc.immediate);
            match expected.iter().position(|e| *e == got) {
                Some(i) if c.wc.status == WcStatus::Success => {
                    expected.swap_remove(i);
                }
                _ => {
                    return Err(format!(
                        "batch {batch}: {c:?} while waiting for {expected:?}; {:?}",
                        qp.status()
                    ))
                }
            }
        }
        for (mr, at, want, what) in checks {
            let got = region_bytes(mr, at, want.len());
            if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
                return Err(format!(
                    "batch {batch}: {what:?} of {} octets at {at}: octet {i} is {:#04x}, not {:#04x}",
                    want.len(),
                    got[i],
                    want[i]
                ));
            }
            tally.bytes_checked += want.len() as u64;
            *match what {
                Checked::ReadBack => &mut tally.writes_read_back,
                Checked::ImmediateReadBack => &mut tally.immediates,
                Checked::Echo => &mut tally.echoes,
                Checked::Atomics => &mut tally.atomics,
            } += 1;
        }
    }
    Ok(early_echo_recv)
}

/// Ends the connection one of three ways. `early_echo_recv`: a receive posted before the
/// connection ran is still posted, and its flush completes in the end. `events`: the
/// channel a verbs-style client connected through, which then tells the end
/// (`RDMA_CM_EVENT_DISCONNECTED`).
fn end(
    qp: &QueuePair,
    r: &Regions,
    events: Option<&CmEventChannel>,
    mut early_echo_recv: bool,
    rng: &mut Rng,
    tally: &mut Tally,
) -> Result<(), String> {
    let is_early_flush = |c: &Completion| {
        (c.wc.wr_id, c.wc.opcode, c.wc.status)
            == (EARLY_ECHO_RECV, WcOpcode::Recv, WcStatus::WrFlushError)
    };
    let error = match rng.range(0, 2) {
        0 => {
            let t = Instant::now();
            qp.disconnect();
            if t.elapsed() >= DISCONNECT_WAIT {
                return Err(format!(
                    "disconnect took {:?}: the graceful close did not finish",
                    t.elapsed()
                ));
            }
            tally.client_disconnects += 1;
            finished(qp, "client disconnect")?;
            None
        }
        1 => {
            qp.post_send(SendWr {
                wr_id: BYE,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sg_list: SgeList::default(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| format!("post the empty Send: {e}"))?;
            let deadline = Instant::now() + WAIT;
            loop {
                let c = r.next(deadline).ok_or("the empty Send not completed")?;
                if is_early_flush(&c) && std::mem::take(&mut early_echo_recv) {
                    // Flushed by the server's close, which may come first.
                    continue;
                }
                if (c.wc.wr_id, c.wc.opcode, c.wc.status)
                    != (BYE, WcOpcode::Send, WcStatus::Success)
                {
                    return Err(format!("the empty Send: {c:?}"));
                }
                break;
            }
            // The server's close ends ours.
            finished(qp, "client after the server's disconnect")?;
            qp.disconnect();
            tally.server_disconnects += 1;
            Some(QpError::PeerClosed)
        }
        _ => {
            qp.abort();
            tally.aborts += 1;
            finished(qp, "client abort")?;
            None
        }
    };
    if qp.status().error != error {
        return Err(format!("ended with {:?}, not {error:?}", qp.status()));
    }
    // Every completion came before the queue pair finished: only the early receive's flush
    // may be left.
    while let Some(c) = r.cq.try_next() {
        if !(is_early_flush(&c) && std::mem::take(&mut early_echo_recv)) {
            return Err(format!("after the end: {c:?}"));
        }
    }
    if early_echo_recv {
        return Err("the receive posted before the connect did not complete".into());
    }
    if let Some(events) = events {
        match events.wait_event(WAIT) {
            Some(CmEvent::Disconnected { qp_num, error: e })
                if qp_num == qp.num() && e == error => {}
            other => {
                return Err(format!(
                    "the end's event: {other:?}, not Disconnected({error:?})"
                ))
            }
        }
        if let Some(other) = events.get_event() {
            return Err(format!("after the end's event: {other:?}"));
        }
    }
    Ok(())
}

/// Connects as a verbs application does (rping's client): an [`IdleQp`] with `recvs` and the
/// first echo's receive posted through its poster, `rdma_connect` without waiting
/// ([`Device::connect_qp_async`]), the connection taken from the `Established` event.
fn connect_verbs(
    device: &Device,
    r: &Regions,
    addr: SocketAddr,
    p: &ConnectParams,
    private_data: &[u8],
    recvs: Vec<RecvWr>,
    events: &CmEventChannel,
) -> Result<(Connection, QpPoster), String> {
    let qp = IdleQp::new(&r.pd, &r.cq, p).map_err(|e| format!("create: {e}"))?;
    let poster = qp.poster();
    for wr in recvs.into_iter().chain([r.echo_recv(EARLY_ECHO_RECV)]) {
        poster
            .post_recv(wr)
            .map_err(|e| format!("post_recv before the connect: {e}"))?;
    }
    device
        .connect_qp_async(qp, addr, private_data, events, 1)
        .map_err(|e| format!("connect: {e}"))?;
    match events.wait_event(WAIT) {
        Some(CmEvent::Established { connection, .. }) => Ok((connection, poster)),
        other => Err(format!("connect: {other:?}")),
    }
}

/// Whether the connection's startup agreed on what the client asked for and the server's
/// listener (`markers`: the one that wants them) says: the framing; with MPA the revision,
/// CRCs (the server always wants them), Markers each way and the RTR; with IFT our frames'
/// CRCs as we chose them, the server's with both, checked, and placed speculatively (the
/// server allows it).
fn agreed_as_asked(qp: &QueuePair, p: &ConnectParams, markers: bool) -> Result<(), String> {
    let ok = match (qp.agreed(), &p.framing) {
        (Agreed::Mpa(n), Framing::Mpa) => {
            n.rev == p.mpa.rev
                && n.crc
                && n.markers_rx == p.mpa.markers
                && n.markers_tx == markers
                && n.rtr.is_some() == p.mpa.peer_to_peer
        }
        (Agreed::Ift { negotiated: n, .. }, Framing::Ift(cfg)) => {
            n.rdma
                && n.tx.header_crc == cfg.header_crc
                && n.tx.payload_crc == cfg.payload_crc
                && n.rx.header_crc
                && n.rx.payload_crc
                && n.rx.verify
                && n.may_speculate
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "agreed {:?} for {:?} ({:?}), Markers listener {markers}",
            qp.agreed(),
            p.framing,
            p.mpa
        ))
    }
}

/// The server's first Send on an IFT connection, received into the echo buffer: where its
/// region is. Nothing else completes before it: the client has sent nothing yet, and a
/// verbs-style client's early echo receive, posted after this one into the same buffer,
/// completes after it (receives complete in the order posted).
fn welcome(r: &Regions) -> Result<Vec<u8>, String> {
    let c = r
        .next(Instant::now() + WAIT)
        .ok_or("no welcome from the server")?;
    if (c.wc.wr_id, c.wc.status, c.wc.opcode) != (WELCOME_RECV, WcStatus::Success, WcOpcode::Recv) {
        return Err(format!("the welcome's receive: {c:?}"));
    }
    Ok(region_bytes(&r.echo, 0, c.wc.byte_len as usize))
}

/// One client thread: connections with random work for `seconds`, made and driven through
/// `device` directly or, with `verbs`, as a verbs application does ([`connect_verbs`], posts
/// through the poster, completions waited for on a completion channel).
fn client_loop(
    device: &Device,
    verbs: bool,
    ports: Ports,
    seed: u64,
    until: Instant,
) -> Result<Tally, String> {
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    let r = Regions::new(verbs)?;
    let events = CmEventChannel::new().map_err(|e| e.to_string())?;
    while Instant::now() < until {
        let (port, ift) = match rng.range(0, 9) {
            0..=3 => (ports.plain, false),
            4..=7 => (ports.markers, false),
            _ => (ports.ift, true),
        };
        let p = client_params(&mut rng, ift);
        let addr = SocketAddr::from((ADDR_A, port));
        // IFT carries no private data: the server's first Send says where its region is.
        let (private_data, recvs) = if ift {
            (&[][..], vec![r.echo_recv(WELCOME_RECV)])
        } else {
            (&b"soak"[..], Vec::new())
        };
        let (conn, poster) = if verbs {
            connect_verbs(device, &r, addr, &p, private_data, recvs, &events)
                .map(|(c, p)| (c, Some(p)))
        } else {
            device
                .connect_with_recvs(addr, &r.pd, &r.cq, &p, private_data, recvs)
                .map(|c| (c, None))
                .map_err(|e| format!("connect: {e}"))
        }
        .map_err(|e| format!("{e} (port {port}, {:?}, {:?})", p.mpa, p.framing))?;
        tally.connections += 1;
        tally.ift += u64::from(ift);
        let n = tally.connections;
        agreed_as_asked(&conn.qp, &p, port == ports.markers)
            .map_err(|e| format!("connection {n}: {e}"))?;
        let w = if ift {
            welcome(&r).map_err(|e| format!("connection {n}: {e} ({:?})", p.framing))?
        } else {
            conn.private_data.clone()
        };
        if w.len() != WELCOME_LEN {
            return Err(format!("connection {n}: a welcome of {} octets", w.len()));
        }
        let stag = Stag(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
        let mut to = [0u8; 8];
        to.copy_from_slice(&w[4..12]);
        let remote = (stag, u64::from_be_bytes(to));
        let posts = poster.as_ref().map_or(Posts::Qp(&conn.qp), Posts::Poster);
        let early = work(&conn.qp, &posts, verbs, &r, remote, &mut rng, &mut tally)
            .map_err(|e| format!("connection {n}: {e}"))?;
        let events = verbs.then_some(&events);
        end(&conn.qp, &r, events, early, &mut rng, &mut tally)
            .map_err(|e| format!("connection {n}: {e}"))?;
    }
    Ok(tally)
}

/// One soak: the server's listeners, whether the server and the clients run on an engine (or
/// the socket transport), and the bed's MTU (`None`: `SOAK_MTU`'s, by default 1500).
fn soak(ports: Ports, engine_server: bool, engine_clients: bool, mtu: Option<u32>) {
    let bed = relay_bed_or_skip!();
    let seconds: u64 = env("SOAK_SECONDS", 8);
    let seed: u64 = env("SOAK_SEED", 1);
    let loss: f64 = env("SOAK_LOSS", 0.01);
    let mtu: u32 = mtu.unwrap_or_else(|| env("SOAK_MTU", 1500));
    assert!(
        (0.0..=MAX_LOSS).contains(&loss),
        "SOAK_LOSS={loss}: from 0 to {MAX_LOSS} (the waits are sized for that)"
    );
    if mtu != 1500 {
        bed.set_mtu(mtu).expect("the relay bed's MTU");
    }
    let on = |engine| {
        if engine {
            "an engine"
        } else {
            "the socket transport"
        }
    };
    println!(
        "soak: {seconds} s, seed {seed}, loss {loss}, MTU {mtu}, {CLIENTS} clients on {}, \
         the server on {}",
        on(engine_clients),
        on(engine_server)
    );
    let relay = Relay::start(RelayConfig {
        netns: Some(NS_RELAY.into()),
        dev_a: RELAY_DEV_A.into(),
        dev_b: RELAY_DEV_B.into(),
        seed,
        loss,
        reorder: loss,
        duplicate: loss / 2.0,
        delay: Duration::from_micros(50),
        jitter: Duration::from_micros(100),
        mtu: mtu as usize,
        lifetime: Duration::from_secs(seconds + 300),
        ..RelayConfig::default()
    })
    .unwrap_or_else(|e| panic!("relay: {e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let srv = {
        let stop = stop.clone();
        spawn_in_ns(NS_A, move || server(ports, engine_server, ready_tx, stop))
    };
    if ready_rx.recv_timeout(WAIT).is_err() {
        // A server still starting would accept until told to stop.
        stop.store(true, Ordering::Relaxed);
        panic!("server did not start: {:?}", srv.join());
    }
    let started = Instant::now();
    let clients = spawn_in_ns(
        NS_B,
        move || -> Result<(Tally, Option<EngineCounters>), String> {
            let device = open_device(engine_clients, DEV_B).map_err(|e| format!("client {e}"))?;
            let until = Instant::now() + Duration::from_secs(seconds);
            // Odd threads as verbs applications.
            let results: Vec<_> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..CLIENTS as u64)
                    .map(|t| {
                        let device = &device;
                        s.spawn(move || {
                            client_loop(device, t % 2 == 1, ports, seed ^ (t << 32), until)
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join()).collect()
            });
            let mut tally = Tally::default();
            for (t, r) in results.into_iter().enumerate() {
                let r = r.map_err(|_| format!("client {t} panicked"))?;
                tally.add(&r.map_err(|e| format!("client {t}: {e}"))?);
            }
            Ok((tally, device.close()))
        },
    );
    let clients = clients.join().expect("client threads");
    stop.store(true, Ordering::Relaxed);
    let server = srv.join().expect("server thread");
    let relay = relay.stop().unwrap_or_else(|e| panic!("relay: {e}"));
    println!("relay: {relay:?}");
    let ((tally, client), (server, ends)) = match (clients, server) {
        (Ok(c), Ok(s)) => (c, s),
        (c, s) => panic!("clients: {:?}\nserver: {:?}", c.err(), s.err()),
    };
    println!(
        "soak: {:.1} s, {tally:?}; server: {ends:?}",
        started.elapsed().as_secs_f64()
    );
    let mut engines = Vec::new();
    engines.extend(server.map(|s| ("server", s)));
    engines.extend(client.map(|c| ("client", c)));
    for (who, e) in &engines {
        let c = &e.conns;
        println!(
            "{who} engine: established {}, ended {}, retransmissions {}, RTOs {}, \
             placed out of order {} B, held peak {} B, IFT frames placed speculatively and \
             confirmed {} / refused {} / withdrawn {}, crc errors {}, terminates {} sent / {} \
             received",
            e.established,
            e.ended,
            c.retransmissions,
            c.rto_expirations,
            c.bytes_placed_out_of_order,
            c.held_peak,
            c.ift_speculation_confirmed,
            c.ift_speculation_refused,
            c.ift_speculation_withdrawn,
            c.crc_errors,
            c.terminates_sent,
            c.terminates_received
        );
        assert!(e.error.is_none(), "{who}: {:?}", e.error);
        assert_eq!(c.crc_errors, 0, "{who}");
        assert_eq!(c.terminates_sent, 0, "{who}");
        assert_eq!(c.terminates_received, 0, "{who}");
        assert_eq!(c.held_bytes, 0, "{who}: nothing left in a reassembly store");
        assert_eq!(e.established, tally.connections, "{who}");
        if loss >= 0.01 && seconds >= 15 {
            // IFT frames out of order were placed where they go before the ones ahead of them
            // (section 8), and in-order framing confirmed them (with less loss or time there
            // may be no out-of-order frame that qualifies).
            assert!(c.ift_speculation_confirmed > 0, "{who}");
        }
    }
    // Each end as the clients made it.
    assert_eq!(ends.accepted, tally.connections, "{ends:?}");
    assert_eq!(ends.ift, tally.ift, "{ends:?}");
    assert_eq!(ends.asked, tally.server_disconnects, "{ends:?}");
    assert_eq!(ends.closed, tally.client_disconnects, "{ends:?}");
    assert_eq!(ends.reset + ends.unreachable, tally.aborts, "{ends:?}");
    assert!(
        tally.client_disconnects > 0 && tally.server_disconnects > 0 && tally.aborts > 0,
        "{tally:?}"
    );
    assert!(
        tally.writes_read_back > 0
            && tally.echoes > 0
            && tally.immediates > 0
            && tally.atomics > 0
            && tally.ift > 0,
        "{tally:?}"
    );
    assert!(ends.pool_receives > 0, "{ends:?}");
    if loss > 0.0 {
        assert!(relay.a_to_b.dropped + relay.b_to_a.dropped > 0, "{relay:?}");
    }
}

#[test]
fn engine_clients() {
    soak(ENGINE_PORTS, true, true, None);
}

#[test]
fn socket_clients() {
    soak(SOCKET_CLIENT_PORTS, true, false, None);
}

#[test]
fn socket_server() {
    soak(SOCKET_SERVER_PORTS, false, true, None);
}

/// Engines at both ends at MTU 9000, whatever `SOAK_MTU` says: packets of several AF_XDP
/// frames (multi-buffer, the `xdp.frags` program) both ways.
#[test]
fn jumbo_frames() {
    soak(JUMBO_PORTS, true, true, Some(9000));
}
