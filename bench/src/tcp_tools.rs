//! `iwarp-bench tcp-sink` and `iwarp-bench tcp-source`: a byte stream over our own TCP on
//! AF_XDP (`--transport xdp`, [`datapath::xdp_tcp`]) or over a kernel TCP socket
//! (`--transport socket`, the baseline), checked end to end by SHA-256.
//!
//! * `tcp-sink --iface IF --port P` accepts one connection, reads until the peer closes, closes
//!   its side and prints one JSON object on stdout: `bytes`, `sha256` of everything received,
//!   `seconds` and `gbit_s` (first to last byte), the peer and the negotiated TCP options.
//! * `tcp-source --iface IF --bytes N --seed S ADDR:PORT` connects, sends N pseudo-random bytes
//!   (xoshiro256** seeded through splitmix64 with S; the same N and S always give the same
//!   bytes), closes, and prints `bytes`, `sha256` of what it sent, `seconds` and `gbit_s`
//!   (handshake done to every byte acknowledged, hashing and generation included).
//!
//! Progress goes to stderr once a second (`--quiet` silences it); the sink announces
//! `listening on ADDR:PORT` on stderr when it is ready. Failures (not root, interface missing,
//! peer unreachable, refused, reset, stalled) are one line on stderr and exit status 1.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, ValueEnum};
use datapath::xdp_tcp::engine::Instant as TcpInstant;
use datapath::xdp_tcp::{
    ConnId, Connection, Event, State, TcpApp, XdpTcp, XdpTcpConfig, XdpTcpError,
};
use serde::Serialize;

use crate::cli::XdpMode;
use sha2::{Digest, Sha256};

/// Which TCP carries the stream.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// Our TCP (tcp-engine) on AF_XDP sockets, steered by the XDP program. Needs root.
    Xdp,
    /// A kernel TCP socket.
    Socket,
}

/// Where our TCP on AF_XDP runs (the tools of this module and `http`).
#[derive(Args, Debug, Clone)]
pub(crate) struct XdpArgs {
    /// Interface to run on (our TCP on AF_XDP; needs root), in the current network namespace.
    #[arg(long)]
    iface: Option<String>,
    /// RX queue to own (repeatable; default: all queues of the interface).
    #[arg(long = "queue")]
    queues: Vec<u32>,
    /// XDP attach mode of the steering program.
    #[arg(long, value_enum, default_value_t = XdpMode::Auto)]
    xdp_mode: XdpMode,
}

#[derive(Args, Debug, Clone)]
struct Common {
    /// `xdp`: our TCP over AF_XDP; `socket`: kernel TCP.
    #[arg(long, value_enum, default_value_t = Transport::Xdp)]
    transport: Transport,
    #[command(flatten)]
    xdp: XdpArgs,
    /// Seconds to wait for the connection (sink: a client; source: the handshake).
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Seconds without progress after which the transfer fails as stalled.
    #[arg(long, default_value_t = 30.0)]
    idle_timeout: f64,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
}

/// Receive a TCP stream and print its length and SHA-256.
#[derive(Parser, Debug)]
#[command(name = "iwarp-bench tcp-sink")]
struct SinkCli {
    #[command(flatten)]
    common: Common,
    /// TCP port to listen on.
    #[arg(long, default_value_t = 18700)]
    port: u16,
    /// Address to listen on (socket transport; xdp uses the interface's address).
    #[arg(long, default_value = "0.0.0.0")]
    bind: Ipv4Addr,
}

/// Send N pseudo-random bytes over TCP and print their SHA-256 and the throughput.
#[derive(Parser, Debug)]
#[command(name = "iwarp-bench tcp-source")]
struct SourceCli {
    #[command(flatten)]
    common: Common,
    /// Bytes to send.
    #[arg(long)]
    bytes: u64,
    /// Seed of the byte generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The sink, ADDR:PORT (IPv4).
    server: SocketAddrV4,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ToolError {
    #[error(transparent)]
    Driver(#[from] XdpTcpError),
    #[error("--iface is required: our TCP on AF_XDP runs on an interface")]
    NeedIface,
    #[error(
        "not root: --transport xdp needs root (XDP program: CAP_BPF, CAP_NET_ADMIN; AF_XDP: CAP_NET_RAW)"
    )]
    NotRoot,
    #[error("--{0} must be between 0 and 86400 seconds")]
    BadSeconds(&'static str),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("no connection arrived within {0:?}")]
    NoConnection(Duration),
    #[error("{0} did not answer within {1:?} (no SYN-ACK): is a sink listening there?")]
    ConnectTimeout(SocketAddrV4, Duration),
    #[error("connection refused by {0}")]
    Refused(SocketAddrV4),
    #[error("connection reset by the peer after {0} bytes")]
    Reset(u64),
    #[error("connection timed out (retransmissions unanswered) after {0} bytes")]
    TimedOut(u64),
    #[error("transfer stalled: no progress for {0:?} at {1} bytes")]
    Stalled(Duration, u64),
    #[error("the peer closed after {got} of {want} bytes were acknowledged")]
    Short { got: u64, want: u64 },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ToolError {
    let what = what.into();
    move |source| ToolError::Io { what, source }
}

/// Entry point: `args` starts with the tool's own name (`iwarp-bench tcp-sink`
/// or `iwarp-bench tcp-source`).
pub fn main(args: impl Iterator<Item = String>) -> ExitCode {
    let args: Vec<String> = args.collect();
    let tool = args.first().cloned().unwrap_or_default();
    let result = match tool.as_str() {
        "iwarp-bench tcp-sink" => SinkCli::try_parse_from(&args).map(|c| sink(&c)),
        _ => SourceCli::try_parse_from(&args).map(|c| source(&c)),
    };
    match result {
        Err(e) => {
            let _ = e.print();
            if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        Ok(Ok(report)) => {
            println!(
                "{}",
                serde_json::to_string(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
            );
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("{tool}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What both tools print.
#[derive(Serialize, Debug, Default)]
struct Report {
    tool: &'static str,
    transport: &'static str,
    bytes: u64,
    sha256: String,
    seconds: f64,
    gbit_s: f64,
    local: String,
    peer: String,
    /// Seed of the generated bytes (source).
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    /// Negotiated options (xdp transport).
    #[serde(skip_serializing_if = "Option::is_none")]
    tcp: Option<TcpFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    xdp: Option<XdpFacts>,
}

#[derive(Serialize, Debug, Clone, Default)]
struct TcpFacts {
    sack: bool,
    timestamps: bool,
    /// Window-scale shifts (ours, the peer's).
    window_scale: (u8, u8),
    /// Our effective send MSS.
    emss: u16,
    segments_in: u64,
    segments_out: u64,
    retransmitted_segments: u64,
    rto_expirations: u64,
    fast_recoveries: u64,
}

impl TcpFacts {
    fn of(c: &Connection) -> Self {
        let s = c.stats();
        Self {
            sack: c.sack_enabled(),
            timestamps: c.timestamps_enabled(),
            window_scale: c.window_scales(),
            emss: c.emss(),
            segments_in: s.segments_in,
            segments_out: s.segments_out,
            retransmitted_segments: s.retransmitted_segments,
            rto_expirations: s.rto_expirations,
            fast_recoveries: s.fast_recoveries,
        }
    }
}

#[derive(Serialize, Debug, Clone)]
pub(crate) struct XdpFacts {
    iface: String,
    mode: String,
    zero_copy: bool,
    queues: Vec<u32>,
    mtu: u16,
    rx_frames: u64,
    tx_packets: u64,
    rx_malformed: u64,
    tx_no_mac: u64,
    /// Sleeps in ppoll.
    waits: u64,
    /// Kernel: frames dropped on the way into our RX rings (ring full, no fill frame, other).
    kernel_rx_drops: u64,
}

impl XdpFacts {
    pub(crate) fn of(d: &XdpTcp) -> Self {
        let s = d.stats();
        Self {
            iface: d.ifname().to_owned(),
            mode: d.xdp_mode().to_string(),
            zero_copy: d.zero_copy(),
            queues: d.queues(),
            mtu: d.mtu(),
            rx_frames: s.rx_frames,
            tx_packets: s.tx_packets,
            rx_malformed: s.rx_malformed,
            tx_no_mac: s.tx_no_mac,
            waits: s.waits,
            kernel_rx_drops: d
                .xsk_stats()
                .iter()
                .map(|x| x.rx_dropped + x.rx_ring_full)
                .sum(),
        }
    }
}

pub(crate) fn secs(s: f64, what: &'static str) -> Result<Duration, ToolError> {
    if s.is_finite() && s > 0.0 && s <= 86_400.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(ToolError::BadSeconds(what))
    }
}

pub(crate) fn hex(digest: &[u8]) -> String {
    let mut s = String::with_capacity(digest.len() * 2);
    for b in digest {
        let _ = write!(s, "{b:02x}");
    }
    s
}

pub(crate) fn gbit(bytes: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 {
        bytes as f64 * 8.0 / s / 1e9
    } else {
        0.0
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The byte generator: xoshiro256** seeded through splitmix64.
pub(crate) struct Generator {
    s: [u64; 4],
}

impl Generator {
    pub(crate) fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Fills `buf` with the next `buf.len()` bytes of the stream (little-endian words). Only
    /// the last call of a stream may have a length that is not a multiple of 8.
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let w = self.next_u64().to_le_bytes();
            let n = rest.len();
            rest.copy_from_slice(&w[..n]);
        }
    }
}

/// Once-a-second progress lines on stderr.
pub(crate) struct Progress {
    quiet: bool,
    label: &'static str,
    start: Instant,
    last: Instant,
    last_bytes: u64,
}

impl Progress {
    pub(crate) fn new(quiet: bool, label: &'static str) -> Self {
        let now = Instant::now();
        Self {
            quiet,
            label,
            start: now,
            last: now,
            last_bytes: 0,
        }
    }

    pub(crate) fn tick(&mut self, bytes: u64, total: Option<u64>) {
        if self.quiet {
            return;
        }
        let now = Instant::now();
        let dt = now.duration_since(self.last);
        if dt < Duration::from_secs(1) {
            return;
        }
        let rate = gbit(bytes.saturating_sub(self.last_bytes), dt);
        let of = total.map(|t| format!(" of {t}")).unwrap_or_default();
        eprintln!(
            "{}: {bytes}{of} bytes after {:.1} s ({rate:.3} Gbit/s)",
            self.label,
            now.duration_since(self.start).as_secs_f64()
        );
        self.last = now;
        self.last_bytes = bytes;
    }
}

/// Stall detection: fails when the byte count stops moving for `limit`.
pub(crate) struct Watchdog {
    limit: Duration,
    last_change: Instant,
    last_bytes: u64,
}

impl Watchdog {
    pub(crate) fn new(limit: Duration) -> Self {
        Self {
            limit,
            last_change: Instant::now(),
            last_bytes: 0,
        }
    }

    pub(crate) fn check(&mut self, bytes: u64) -> Result<(), ToolError> {
        if bytes != self.last_bytes {
            self.last_bytes = bytes;
            self.last_change = Instant::now();
        } else if self.last_change.elapsed() > self.limit {
            return Err(ToolError::Stalled(self.limit, bytes));
        }
        Ok(())
    }
}

fn open_driver(c: &Common) -> Result<XdpTcp, ToolError> {
    open_xdp(&c.xdp)
}

/// Opens the AF_XDP driver as `args` say (checks: an interface given, root).
pub(crate) fn open_xdp(args: &XdpArgs) -> Result<XdpTcp, ToolError> {
    let XdpArgs {
        iface,
        queues,
        xdp_mode,
    } = args;
    let iface = iface.as_deref().ok_or(ToolError::NeedIface)?;
    if !is_root() {
        return Err(ToolError::NotRoot);
    }
    let cfg = XdpTcpConfig {
        queues: (!queues.is_empty()).then(|| queues.to_vec()),
        attach_mode: (*xdp_mode).into(),
        ..XdpTcpConfig::default()
    };
    Ok(XdpTcp::open(iface, cfg)?)
}

pub(crate) fn describe(d: &XdpTcp) -> String {
    format!(
        "{} queue(s) {:?}, XDP {} mode, AF_XDP {}, MTU {}",
        d.ifname(),
        d.queues(),
        d.xdp_mode(),
        if d.zero_copy() { "zero-copy" } else { "copy" },
        d.mtu()
    )
}

// ------------------------------------------------------------------------------------ sink

fn sink(cli: &SinkCli) -> Result<Report, ToolError> {
    let c = &cli.common;
    let timeout = secs(c.timeout, "timeout")?;
    let idle = secs(c.idle_timeout, "idle-timeout")?;
    match c.transport {
        Transport::Xdp => sink_xdp(cli, timeout, idle),
        Transport::Socket => sink_socket(cli, timeout, idle),
    }
}

/// The sink as a [`TcpApp`]: one connection, in-order reads hashed as they come.
struct SinkApp {
    conn: Option<ConnId>,
    buf: Vec<u8>,
    hasher: Sha256,
    bytes: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    peer_closed: bool,
    close_sent: Option<Instant>,
    closed: bool,
    failure: Option<ToolError>,
    facts: Option<TcpFacts>,
    peer: Option<SocketAddrV4>,
}

impl TcpApp for SinkApp {
    fn on_accept(&mut self, id: ConnId, conn: &mut Connection) {
        if self.conn.is_some() {
            // One stream per run: a second client is turned away.
            conn.abort();
            return;
        }
        let t = conn.four_tuple();
        self.peer = Some(SocketAddrV4::new(t.remote_addr, t.remote_port));
        self.facts = Some(TcpFacts::of(conn));
        self.conn = Some(id);
    }

    fn on_event(&mut self, id: ConnId, _conn: &mut Connection, event: Event) {
        if Some(id) != self.conn {
            return;
        }
        match event {
            Event::PeerClosed => self.peer_closed = true,
            Event::Reset if !self.peer_closed => {
                self.failure = Some(ToolError::Reset(self.bytes));
            }
            Event::TimedOut if !self.peer_closed => {
                self.failure = Some(ToolError::TimedOut(self.bytes));
            }
            _ => {}
        }
    }

    fn on_poll(&mut self, id: ConnId, conn: &mut Connection, _now: TcpInstant) {
        if Some(id) != self.conn {
            return;
        }
        // Bounded per turn, so transmission (our ACKs) keeps its share of the loop.
        for _ in 0..64 {
            let n = conn.recv(&mut self.buf);
            if n == 0 {
                break;
            }
            let now = Instant::now();
            self.first.get_or_insert(now);
            self.last = Some(now);
            self.hasher.update(&self.buf[..n]);
            self.bytes += n as u64;
        }
        if self.peer_closed && conn.recv_available() == 0 && self.close_sent.is_none() {
            conn.close();
            self.close_sent = Some(Instant::now());
        }
    }

    fn on_closed(&mut self, id: ConnId, conn: Connection) {
        if Some(id) == self.conn {
            let mut facts = TcpFacts::of(&conn);
            if let Some(f) = &self.facts {
                // Options as negotiated (a closed connection still reports them).
                facts.window_scale = f.window_scale;
            }
            self.facts = Some(facts);
            self.closed = true;
        }
    }
}

/// How long the sink waits for the ACK of its FIN, and the source for the peer's FIN, once
/// the data is complete.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

fn sink_xdp(cli: &SinkCli, timeout: Duration, idle: Duration) -> Result<Report, ToolError> {
    let c = &cli.common;
    let mut drv = open_driver(c)?;
    let cfg = drv.tcp_config();
    drv.listen(cli.port, 4, cfg)?;
    eprintln!(
        "tcp-sink: listening on {}:{} ({})",
        drv.local_ip(),
        cli.port,
        describe(&drv)
    );
    let mut app = SinkApp {
        conn: None,
        buf: vec![0u8; 256 * 1024],
        hasher: Sha256::new(),
        bytes: 0,
        first: None,
        last: None,
        peer_closed: false,
        close_sent: None,
        closed: false,
        failure: None,
        facts: None,
        peer: None,
    };
    let started = Instant::now();
    let mut progress = Progress::new(c.quiet, "tcp-sink");
    let mut watchdog = Watchdog::new(idle);
    loop {
        drv.turn(&mut app)?;
        if let Some(e) = app.failure.take() {
            return Err(e);
        }
        if app.closed {
            break;
        }
        if app.close_sent.is_some_and(|t| t.elapsed() > CLOSE_GRACE) {
            // All data is in; the peer just did not acknowledge our FIN in time.
            break;
        }
        if app.conn.is_none() {
            if started.elapsed() > timeout {
                return Err(ToolError::NoConnection(timeout));
            }
            continue;
        }
        watchdog.check(app.bytes)?;
        progress.tick(app.bytes, None);
    }
    let elapsed = match (app.first, app.last) {
        (Some(a), Some(b)) => b.duration_since(a),
        _ => Duration::ZERO,
    };
    Ok(Report {
        tool: "tcp-sink",
        transport: "xdp",
        bytes: app.bytes,
        sha256: hex(&app.hasher.finalize()),
        seconds: elapsed.as_secs_f64(),
        gbit_s: gbit(app.bytes, elapsed),
        local: format!("{}:{}", drv.local_ip(), cli.port),
        peer: app.peer.map(|p| p.to_string()).unwrap_or_default(),
        seed: None,
        tcp: app.facts.clone(),
        xdp: Some(XdpFacts::of(&drv)),
    })
}

fn sink_socket(cli: &SinkCli, timeout: Duration, idle: Duration) -> Result<Report, ToolError> {
    let c = &cli.common;
    let addr = SocketAddrV4::new(cli.bind, cli.port);
    let listener = TcpListener::bind(addr).map_err(io_err(format!("listening on {addr}")))?;
    let bound = listener.local_addr().unwrap_or(addr.into());
    eprintln!("tcp-sink: listening on {bound} (kernel TCP)");
    listener
        .set_nonblocking(true)
        .map_err(io_err("non-blocking listener"))?;
    let started = Instant::now();
    let (mut stream, peer) = loop {
        match listener.accept() {
            Ok(s) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if started.elapsed() > timeout {
                    return Err(ToolError::NoConnection(timeout));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(io_err("accept")(e)),
        }
    };
    stream
        .set_nonblocking(false)
        .and_then(|_| stream.set_read_timeout(Some(idle)))
        .map_err(io_err("configuring the connection"))?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut hasher = Sha256::new();
    let mut bytes = 0u64;
    let mut first = None;
    let mut last = None;
    let mut progress = Progress::new(c.quiet, "tcp-sink");
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
                hasher.update(&buf[..n]);
                bytes += n as u64;
                progress.tick(bytes, None);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ToolError::Stalled(idle, bytes));
            }
            Err(e) => return Err(io_err(format!("reading from {peer}"))(e)),
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
    let elapsed = match (first, last) {
        (Some(a), Some(b)) => b.duration_since(a),
        _ => Duration::ZERO,
    };
    Ok(Report {
        tool: "tcp-sink",
        transport: "socket",
        bytes,
        sha256: hex(&hasher.finalize()),
        seconds: elapsed.as_secs_f64(),
        gbit_s: gbit(bytes, elapsed),
        local: addr.to_string(),
        peer: peer.to_string(),
        ..Report::default()
    })
}

// ---------------------------------------------------------------------------------- source

fn source(cli: &SourceCli) -> Result<Report, ToolError> {
    let c = &cli.common;
    let timeout = secs(c.timeout, "timeout")?;
    let idle = secs(c.idle_timeout, "idle-timeout")?;
    match c.transport {
        Transport::Xdp => source_xdp(cli, timeout, idle),
        Transport::Socket => source_socket(cli, timeout, idle),
    }
}

/// Size of one generated (and hashed) chunk.
const CHUNK: usize = 64 * 1024;

/// The bytes to send: generated and hashed a chunk at a time, just before they are queued.
struct Stream {
    gen: Generator,
    hasher: Sha256,
    chunk: Vec<u8>,
    pos: usize,
    len: usize,
    generated: u64,
    total: u64,
}

impl Stream {
    fn new(seed: u64, total: u64) -> Self {
        Self {
            gen: Generator::new(seed),
            hasher: Sha256::new(),
            chunk: vec![0u8; CHUNK],
            pos: 0,
            len: 0,
            generated: 0,
            total,
        }
    }

    /// The unsent rest of the current chunk, generating the next one when it is used up;
    /// empty at the end of the stream.
    fn pending(&mut self) -> &[u8] {
        if self.pos == self.len && self.generated < self.total {
            let n = (self.total - self.generated).min(CHUNK as u64) as usize;
            self.gen.fill(&mut self.chunk[..n]);
            self.hasher.update(&self.chunk[..n]);
            self.generated += n as u64;
            self.pos = 0;
            self.len = n;
        }
        &self.chunk[self.pos..self.len]
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.len);
    }

    fn done(&self) -> bool {
        self.generated == self.total && self.pos == self.len
    }
}

struct SourceApp {
    id: ConnId,
    stream: Stream,
    connected: Option<Instant>,
    all_acked: Option<Instant>,
    close_sent: bool,
    peer_closed: bool,
    closed: bool,
    acked: u64,
    failure: Option<ToolError>,
    facts: Option<TcpFacts>,
    server: SocketAddrV4,
}

impl TcpApp for SourceApp {
    fn on_event(&mut self, id: ConnId, conn: &mut Connection, event: Event) {
        if id != self.id {
            return;
        }
        match event {
            Event::Connected => {
                self.connected = Some(Instant::now());
                self.facts = Some(TcpFacts::of(conn));
            }
            Event::PeerClosed => self.peer_closed = true,
            Event::Reset if self.connected.is_none() => {
                self.failure = Some(ToolError::Refused(self.server));
            }
            Event::Reset if self.all_acked.is_none() => {
                self.failure = Some(ToolError::Reset(self.acked));
            }
            Event::TimedOut if self.all_acked.is_none() => {
                self.failure = Some(ToolError::TimedOut(self.acked));
            }
            _ => {}
        }
    }

    fn on_poll(&mut self, id: ConnId, conn: &mut Connection, _now: TcpInstant) {
        if id != self.id || self.connected.is_none() {
            return;
        }
        self.acked = conn.bytes_acked();
        if !self.close_sent {
            // Bounded per turn: at most 64 chunks' worth of send calls.
            for _ in 0..64 {
                let data = self.stream.pending();
                if data.is_empty() {
                    break;
                }
                match conn.send(data) {
                    Ok(0) => break,
                    Ok(n) => self.stream.consume(n),
                    Err(_) => {
                        self.failure = Some(ToolError::Reset(self.acked));
                        return;
                    }
                }
            }
            if self.stream.done() {
                conn.close();
                self.close_sent = true;
            }
        }
        if self.close_sent
            && self.all_acked.is_none()
            && self.acked >= self.stream.total
            && matches!(
                conn.state(),
                State::FinWait2 | State::TimeWait | State::Closing | State::Closed
            )
        {
            self.all_acked = Some(Instant::now());
        }
        if self.peer_closed && self.all_acked.is_none() && self.acked < self.stream.total {
            // The peer closed early; it will not take the rest.
            if conn.send_queue_len() > 0 && conn.state() != State::Established {
                self.failure = Some(ToolError::Short {
                    got: self.acked,
                    want: self.stream.total,
                });
            }
        }
    }

    fn on_closed(&mut self, id: ConnId, conn: Connection) {
        if id == self.id {
            self.closed = true;
            self.acked = conn.bytes_acked();
            let mut facts = TcpFacts::of(&conn);
            if let Some(f) = &self.facts {
                facts.window_scale = f.window_scale;
            }
            self.facts = Some(facts);
            if self.all_acked.is_none() && self.failure.is_none() {
                self.failure = Some(ToolError::Short {
                    got: self.acked,
                    want: self.stream.total,
                });
            }
        }
    }
}

fn source_xdp(cli: &SourceCli, timeout: Duration, idle: Duration) -> Result<Report, ToolError> {
    let c = &cli.common;
    let mut drv = open_driver(c)?;
    let cfg = drv.tcp_config();
    let id = drv.connect(cli.server, cfg)?;
    let local = drv
        .connection(id)
        .map(|conn| {
            let t = conn.four_tuple();
            format!("{}:{}", t.local_addr, t.local_port)
        })
        .unwrap_or_default();
    if !c.quiet {
        eprintln!("tcp-source: {local} -> {} ({})", cli.server, describe(&drv));
    }
    let mut app = SourceApp {
        id,
        stream: Stream::new(cli.seed, cli.bytes),
        connected: None,
        all_acked: None,
        close_sent: false,
        peer_closed: false,
        closed: false,
        acked: 0,
        failure: None,
        facts: None,
        server: cli.server,
    };
    let started = Instant::now();
    let mut progress = Progress::new(c.quiet, "tcp-source");
    let mut watchdog = Watchdog::new(idle);
    loop {
        drv.turn(&mut app)?;
        if let Some(e) = app.failure.take() {
            return Err(e);
        }
        if app.closed {
            break;
        }
        match app.all_acked {
            Some(t) => {
                // Done; give the peer a moment to close its side cleanly.
                if app.peer_closed || t.elapsed() > CLOSE_GRACE {
                    break;
                }
            }
            None if app.connected.is_none() => {
                if started.elapsed() > timeout {
                    return Err(ToolError::ConnectTimeout(cli.server, timeout));
                }
            }
            None => {
                watchdog.check(app.acked)?;
                progress.tick(app.acked, Some(cli.bytes));
            }
        }
    }
    // One last turn so the ACK of the peer's FIN leaves before the program detaches.
    drv.poll(&mut app)?;
    let (Some(t0), Some(t1)) = (app.connected, app.all_acked) else {
        return Err(ToolError::Short {
            got: app.acked,
            want: cli.bytes,
        });
    };
    let elapsed = t1.duration_since(t0);
    if let (Some(f), Some(conn)) = (app.facts.as_mut(), drv.connection(id)) {
        let now = TcpFacts::of(conn);
        *f = TcpFacts {
            window_scale: f.window_scale,
            ..now
        };
    }
    Ok(Report {
        tool: "tcp-source",
        transport: "xdp",
        bytes: cli.bytes,
        sha256: hex(&app.stream.hasher.finalize_reset()),
        seconds: elapsed.as_secs_f64(),
        gbit_s: gbit(cli.bytes, elapsed),
        local,
        peer: cli.server.to_string(),
        seed: Some(cli.seed),
        tcp: app.facts.clone(),
        xdp: Some(XdpFacts::of(&drv)),
    })
}

fn source_socket(cli: &SourceCli, timeout: Duration, idle: Duration) -> Result<Report, ToolError> {
    let c = &cli.common;
    let server = SocketAddr::V4(cli.server);
    let mut s = TcpStream::connect_timeout(&server, timeout).map_err(|e| match e.kind() {
        io::ErrorKind::ConnectionRefused => ToolError::Refused(cli.server),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
            ToolError::ConnectTimeout(cli.server, timeout)
        }
        _ => io_err(format!("connecting to {server}"))(e),
    })?;
    s.set_write_timeout(Some(idle))
        .and_then(|_| s.set_read_timeout(Some(idle)))
        .map_err(io_err("configuring the connection"))?;
    let local = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let mut stream = Stream::new(cli.seed, cli.bytes);
    let mut progress = Progress::new(c.quiet, "tcp-source");
    let t0 = Instant::now();
    let mut sent = 0u64;
    loop {
        let data = stream.pending();
        if data.is_empty() {
            break;
        }
        match s.write(data) {
            Ok(0) => {
                return Err(ToolError::Short {
                    got: sent,
                    want: cli.bytes,
                })
            }
            Ok(n) => {
                stream.consume(n);
                sent += n as u64;
                progress.tick(sent, Some(cli.bytes));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ToolError::Stalled(idle, sent));
            }
            Err(e) => return Err(io_err(format!("writing to {server}"))(e)),
        }
    }
    s.flush().map_err(io_err("flush"))?;
    s.shutdown(Shutdown::Write)
        .map_err(io_err("closing the sending side"))?;
    // The peer's close (EOF) says it has everything.
    let mut scratch = [0u8; 512];
    loop {
        match s.read(&mut scratch) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(format!("waiting for {server} to close"))(e)),
        }
    }
    let elapsed = t0.elapsed();
    Ok(Report {
        tool: "tcp-source",
        transport: "socket",
        bytes: cli.bytes,
        sha256: hex(&stream.hasher.finalize_reset()),
        seconds: elapsed.as_secs_f64(),
        gbit_s: gbit(cli.bytes, elapsed),
        local,
        peer: cli.server.to_string(),
        seed: Some(cli.seed),
        ..Report::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_is_deterministic_and_split_invariant() {
        let mut a = Generator::new(7);
        let mut whole = vec![0u8; 4096];
        a.fill(&mut whole);
        let mut b = Generator::new(7);
        let mut parts = vec![0u8; 4096];
        for c in parts.chunks_mut(512) {
            b.fill(c);
        }
        assert_eq!(whole, parts);
        let mut c = Generator::new(8);
        let mut other = vec![0u8; 4096];
        c.fill(&mut other);
        assert_ne!(whole, other);
    }

    #[test]
    fn stream_hash_matches_the_bytes() {
        let total = (CHUNK * 2 + 1000) as u64;
        let mut s = Stream::new(3, total);
        let mut all = Vec::new();
        loop {
            let d = s.pending();
            if d.is_empty() {
                break;
            }
            let n = d.len().min(777);
            all.extend_from_slice(&d[..n]);
            s.consume(n);
        }
        assert!(s.done());
        assert_eq!(all.len() as u64, total);
        let mut g = Generator::new(3);
        let mut expect = vec![0u8; total as usize];
        for c in expect.chunks_mut(CHUNK) {
            g.fill(c);
        }
        assert_eq!(all, expect);
        assert_eq!(
            hex(&s.hasher.finalize_reset()),
            hex(&Sha256::digest(&expect))
        );
    }

    #[test]
    fn hex_and_rates() {
        assert_eq!(hex(&[0, 15, 255]), "000fff");
        assert_eq!(gbit(1_000_000_000, Duration::from_secs(8)), 1.0);
        assert_eq!(gbit(1, Duration::ZERO), 0.0);
    }
}
