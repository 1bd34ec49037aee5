//! `iwarp-bench perftest`: the peer side of linux-rdma perftest's `ib_write_bw`, `ib_write_lat`,
//! `ib_read_bw`, `ib_read_lat`, `ib_send_bw` and `ib_send_lat` run with `-R` (queue pairs
//! connected by rdma_cm), message for message, in either role, so the real tools (for example
//! on Linux siw) can measure against this stack. Written from perftest 6.06's sources
//! (Debian 12's package 4.5+0.17), which both sides must match: perftest exchanges no test
//! parameters, so both sides need the same `-s`, `-n` (and `-t`/`-r` where they matter).
//!
//! One run, as perftest does it with `-R`:
//!
//! 1. the client connects a *communication* queue pair (rdma_cm, no private data) to the
//!    server's port; every later exchange is one Send each way on it, client first
//!    ([`wire`] has the formats): versions (16 octets; the peer must say at least 5.70),
//!    cycle buffer and cache line sizes (the larger of each is used), MTU (2 octets);
//! 2. a handshake (`pingpong_dest`, 56 octets), then the client connects the *data* queue pair
//!    to the same port (the server listens again only after that handshake, so the client
//!    retries while refused), then another handshake;
//! 3. three (bw tests, send-lat) or four (write-lat, read-lat) handshakes carrying each side's
//!    buffer key and address; send tests add one more after the receiver posted its buffers;
//! 4. the data phase (below); then write-bw/read-bw end with a handshake, the client's report
//!    (five 8-octet values) and a closing handshake, send-bw/send-lat/read-lat with a closing
//!    handshake, write-lat with nothing; the client disconnects.
//!
//! Data phases: write-bw/read-bw/send-bw: the client posts `-n` Writes/Reads/Sends with up
//! to `-t` outstanding, message `i` in slot `i % slots` of the cycle buffer at both ends
//! ([`wire::Geometry`]); send-bw's server posts `-r` receives and RDMA-Writes the count of
//! received messages into the client's credit word every `-r/3` messages (iWARP has no
//! receiver-not-ready retry), the client keeps fewer than `-r` messages uncredited.
//! write-lat: the server Writes first; each side Writes its buffer with the iteration number in
//! the last octet to the peer and waits for the peer's number in its own buffer's last octet.
//! send-lat: the client Sends first; each side answers a received Send. read-lat: the client
//! Reads `-s` octets `-n` times, one at a time; the server only waits.
//!
//! What we verify (perftest's buffers hold `rand()` data, except write-lat's, which are zero):
//! - write-lat, both roles: every received Write is perftest's zeroed buffer with the
//!   iteration number in the last octet, octet for octet (ours sends the same);
//! - read-bw/read-lat as client: we first RDMA-Write our pattern over the server's advertised
//!   buffer (on iWARP perftest registers it with remote write as well as read access), then
//!   check every Read Response against it;
//! - read-bw/read-lat as server: after the client's last Read we RDMA-Read the client's
//!   landing area back (its buffer grants remote read) and compare it with what we served;
//! - write-bw as server: every octet of our buffer: written slots changed, every other octet
//!   (slot gaps, unwritten slots, 4 KiB guards either side) untouched;
//! - send-bw as server: lengths, and each message equal to the earlier ones from the same
//!   source slot (perftest's sender buffer does not change); send-lat: lengths, and every
//!   message equal to the first;
//! - write-bw/send-bw as client: nothing beyond successful completions (perftest's receive
//!   buffers grant no remote read, and perftest does not check data).

mod comm;
mod error;
pub(crate) mod report;
pub mod wire;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use datapath::{
    Access, CompletionQueue, ConnectParams, Listener, MemoryRegion, MpaConfig, ProtectionDomain,
    RecvWr, SendOp, SendWr, Stag, WcOpcode, WcStatus,
};
use serde_json::json;

use crate::net::Net;
use crate::pattern;
use crate::stats::{self, LatencyResult, SampleWindow};
use crate::{OnOff, TestKind, Transport};
use comm::{qp_state, Comm, Qp};
pub use error::PerftestError;
use wire::{BwReport, Dest, Geometry};

/// perftest's default port.
const DEFAULT_PORT: u16 = 18515;
/// perftest's smallest `-n`.
const MIN_ITERS: u64 = 5;
/// perftest's largest `-s` (`MAX_SIZE`).
const MAX_SIZE: u64 = 8 << 20;
/// Cap on the memory one buffer of a run may take.
const MAX_BUFFER: u64 = 256 << 20;
/// Our data pattern's seed.
const PATTERN_SEED: u64 = 0x9E27_7E57;
/// Seed of the "untouched" filling of buffers the peer writes into.
const POISON_SEED: u64 = 0x0BAD_F00D;
/// Guard octets either side of write-bw's target buffer.
const GUARD: u64 = 4096;
/// How long write-bw's server waits for Writes still being placed after the client's
/// handshake (which travels on the other connection) arrived.
const SETTLE: Duration = Duration::from_secs(2);
/// How long a client waits after the closing exchange before it disconnects, and a write-lat
/// server after the client's last Write (see `run_client`, `run_server`).
const CLOSE_GRACE: Duration = Duration::from_millis(300);

const K_DATA: u64 = 1 << 56;
const K_RECV: u64 = 2 << 56;
const K_CREDIT: u64 = 3 << 56;
const K_CHECK: u64 = 4 << 56;
const K_FILL: u64 = 5 << 56;
const KIND: u64 = 0xFF << 56;

/// perftest-compatible options (`ib_<test> -R [-s size] [-n iters] [-p port] [server]`).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "iwarp-bench perftest",
    about = "Peer of perftest's ib_{write,read,send}_{bw,lat} -R over the iWARP stack"
)]
pub struct PerftestCli {
    /// The test, as the peer runs it: write-bw (ib_write_bw), write-lat, read-bw, read-lat,
    /// send-bw, send-lat (perftest's RFC 7306 atomics are not iWARP's: no atomic tests).
    #[arg(value_enum, hide_possible_values = true)]
    pub test: TestKind,
    /// Server to connect to; without it, run as the server.
    pub server: Option<String>,
    /// Message size in octets (perftest's default: 65536 for bw tests, 2 for lat tests); as
    /// perftest reads it (`64K`, `1M`, `0x1000`).
    #[arg(short = 's', long, value_parser = crate::cli::parse_size)]
    pub size: Option<u64>,
    /// Iterations (perftest's default: 5000 for write-bw, 1000 otherwise; at least 5).
    #[arg(short = 'n', long)]
    pub iters: Option<u64>,
    /// Port (the peer's -p).
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Outstanding work requests in bw tests (perftest's default 128; at most -n).
    #[arg(short = 't', long)]
    pub tx_depth: Option<u32>,
    /// Receive queue depth of send tests (perftest's default 512; at most -n, made even).
    /// Must equal the peer's in send-bw: it is the client's credit window.
    #[arg(short = 'r', long)]
    pub rx_depth: Option<u32>,
    /// All sizes, 2 octets to 8 MiB, `-n` iterations each (perftest's `-a`; write-bw and
    /// write-lat here). Both sides need it: buffers are laid out for 8 MiB.
    #[arg(short = 'a', long = "all")]
    pub all_sizes: bool,
    /// Duration mode (read-bw and write-bw clients; perftest's `-D`): post for this many whole
    /// seconds and report the messages completed in the middle (a quarter of it, rounded down,
    /// left out at each end). A server needs nothing: it learns the count from the report.
    #[arg(short = 'D', long = "duration", value_name = "SECONDS")]
    pub duration: Option<u32>,
    /// Bidirectional (write-bw; perftest's `-b`): both sides Write into each other's buffer at
    /// once; each side's row sums both directions. Both sides need it.
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// Queue pairs (write-bw; perftest's `-q`): that many data connections, each running `-n`
    /// iterations into its own part of the peer's buffer; one row for all. Both sides need it.
    #[arg(short = 'q', long = "qp", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    pub qps: u16,
    /// Bandwidth tests (write-bw, read-bw; perftest's `--run_infinitely`): the client runs
    /// until Ctrl-C (SIGINT) or SIGTERM with a row every `-D` seconds (default 5), then closes
    /// without a report, as perftest's does; the server waits as long as the client runs.
    #[arg(long = "run_infinitely")]
    pub run_infinitely: bool,
    /// write-bw: post the Writes in lists of N (perftest's `-l`): list element j always goes
    /// to slot j of the cycle buffer, as perftest's fixed lists do. Both sides need it (the
    /// server checks the slots it implies).
    #[arg(short = 'l', long = "post_list", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub post_list: u64,
    /// Accepted for perftest compatibility: queue pairs are always connected rdma_cm style.
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Address the server binds to (socket transport).
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: String,
    /// Transport: `socket` (kernel TCP) or `xdp` (our TCP over AF_XDP; root, --iface).
    #[arg(long, value_enum, default_value_t = Transport::Socket)]
    pub transport: Transport,
    /// Interface for `--transport xdp`.
    #[arg(long)]
    pub iface: Option<String>,
    /// `--transport xdp`: write every frame the engine receives and sends to FILE (pcap, as
    /// `iwarp-bench --pcap`).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    /// `--transport xdp`: where the steering XDP program runs (`auto`: the driver's native
    /// XDP, else generic; `driver`; `generic`), as `iwarp-bench --xdp-mode`.
    #[arg(long, value_enum)]
    pub xdp_mode: Option<crate::cli::XdpMode>,
    #[command(flatten)]
    pub compat: crate::PerftestCompat,
    /// MPA revision to request: 1 or 2 (rdma_cm on Linux uses 2).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub mpa_rev: u8,
    /// CRC32C on FPDUs: `off` takes effect only if the peer also asks for off.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub crc: OnOff,
    /// Our IRD and ORD in MPA (perftest asks for its device's maximum for Read tests: 128 on
    /// siw; a responder must offer at least the initiator's ORD).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..=0x3FFE))]
    pub rd_atomic: u16,
    /// Client with MPA revision 2: ask for the peer-to-peer model (an RTR message after the
    /// MPA exchange; needed for write-lat, where the server sends first).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub p2p: OnOff,
    /// Server: hold our first FPDU until the client's first one arrived (RFC 5044 7.1.2 rule
    /// 4). Off by default: Linux siw's responder does not wait, and siw as client sends no
    /// RTR in write tests, so write-lat (the server Writes first) would never start.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub responder_waits: OnOff,
    /// Seconds to wait for the peer to turn up (server: the client; client: the server
    /// listening).
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// Seconds any one step (a message, a completion, an awaited octet) may take.
    #[arg(long, default_value_t = 30.0)]
    pub step_timeout: f64,
    /// Client: milliseconds to wait after each MPA Reply before sending (Linux siw as
    /// responder can miss an FPDU that arrives right after its Reply; see the rping mode).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub settle_ms: u64,
    /// Print one JSON object with the results on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The run's parameters after perftest's defaults and adjustments (`force_dependecies`).
#[derive(Debug, Clone, Copy)]
struct Run {
    test: TestKind,
    /// The message size, or the largest of `-a` (buffers are laid out for it).
    size: u64,
    /// `-a`: every power of two from 2 to [`MAX_SIZE`].
    all_sizes: bool,
    /// `-D`: whole seconds.
    duration: Option<u32>,
    bidirectional: bool,
    qps: u64,
    /// `--report_gbits`: bandwidth in Gb/s (10^9 bits) instead of MB/s (2^20 octets).
    gbits: bool,
    report_unsorted: bool,
    report_histogram: bool,
    /// `-N`: no peak bandwidth (the column 0.00).
    no_peak: bool,
    run_infinitely: bool,
    /// `-l`: Writes per posted list.
    post_list: u64,
    /// `-I`: Sends and Writes of at most this many octets are posted inline (0: none).
    inline_size: u64,
    use_event: bool,
    /// `--run_infinitely`: seconds between rows (`-D`, default 5).
    report_every: u32,
    iters: u64,
    tx_depth: u64,
    rx_depth: u64,
    setup: Duration,
    step: Duration,
    settle: Duration,
    rd_atomic: u16,
    json: bool,
}

impl Run {
    fn from_cli(cli: &PerftestCli) -> Result<Self, String> {
        let t = cli.test;
        if t.is_atomic() {
            return Err(format!(
                "{}: the perftest peer runs perftest's six Write, Read and Send tests (Linux \
                 siw has no RFC 7306 atomics); run atomic tests with iwarp-bench at both ends",
                t.name()
            ));
        }
        let mut size = cli.size.unwrap_or(if t.is_bw() { 65536 } else { 2 });
        if size == 0 || size > MAX_SIZE {
            return Err(format!("-s must be between 1 and {MAX_SIZE}"));
        }
        let only = |flag: &str, tests: &[TestKind]| {
            if tests.contains(&t) {
                Ok(())
            } else {
                let names: Vec<&str> = tests.iter().map(|t| t.name()).collect();
                Err(format!(
                    "{flag} is implemented here for {} (not {})",
                    names.join(" and "),
                    t.name()
                ))
            }
        };
        if cli.all_sizes {
            only("-a", &[TestKind::WriteBw, TestKind::WriteLat])?;
            if cli.duration.is_some() {
                return Err("-a with -D: perftest runs all sizes by iterations only".into());
            }
            // perftest: `size = MAX_SIZE` lays the buffers out for the largest message.
            size = MAX_SIZE;
        }
        if cli.post_list > 1 {
            only("-l", &[TestKind::WriteBw])?;
            if cli.bidirectional || cli.qps > 1 || cli.all_sizes {
                return Err("-l with -b, -q or -a: not implemented in perftest mode".into());
            }
            // perftest's default -n (5000 for write-bw) applies.
            let iters = cli.iters.unwrap_or(5000);
            if !iters.is_multiple_of(cli.post_list) {
                return Err("-n must be a multiple of -l (perftest's rule)".into());
            }
        }
        crate::inline::check(
            cli.compat.inline_size,
            !matches!(t, TestKind::ReadBw | TestKind::ReadLat) && !t.is_atomic(),
        )?;
        if cli.run_infinitely {
            only("--run_infinitely", &[TestKind::WriteBw, TestKind::ReadBw])?;
            if cli.json {
                return Err("--run_infinitely prints rows as it goes: no --json".into());
            }
            if cli.all_sizes || cli.bidirectional || cli.qps > 1 {
                return Err("--run_infinitely runs one size, one way, one queue pair here".into());
            }
        }
        if let Some(d) = cli.duration {
            only("-D", &[TestKind::WriteBw, TestKind::ReadBw])?;
            if !(1..=3600).contains(&d) {
                return Err("-D must be between 1 and 3600 seconds".into());
            }
        }
        if cli.bidirectional {
            only("-b", &[TestKind::WriteBw])?;
            if cli.all_sizes || cli.duration.is_some() {
                return Err("-b with -a or -D: not implemented in perftest mode".into());
            }
        }
        if cli.qps > 1 {
            only("-q", &[TestKind::WriteBw])?;
            if cli.bidirectional {
                return Err("-q with -b: not implemented in perftest mode".into());
            }
        }
        if (cli.compat.report_unsorted || cli.compat.report_histogram) && t.is_bw() {
            return Err("-U and -H are for the latency tests".into());
        }
        if cli.compat.no_peak && !t.is_bw() {
            // perftest: "NoPeak only valid for BW tests".
            return Err("-N (no peak) is only valid for the bandwidth tests, as perftest's".into());
        }
        let iters = cli
            .iters
            .unwrap_or(if t == TestKind::WriteBw { 5000 } else { 1000 });
        if !(MIN_ITERS..=100_000_000).contains(&iters) {
            return Err(format!("-n must be between {MIN_ITERS} and 100000000"));
        }
        let tx_depth = u64::from(cli.tx_depth.unwrap_or(if t.is_bw() { 128 } else { 1 }));
        if tx_depth == 0 || tx_depth > 16384 {
            return Err("-t must be between 1 and 16384".into());
        }
        let send = matches!(t, TestKind::SendBw | TestKind::SendLat);
        let mut rx_depth = u64::from(cli.rx_depth.unwrap_or(if send { 512 } else { 1 }));
        if rx_depth == 0 || rx_depth > 16384 {
            return Err("-r must be between 1 and 16384".into());
        }
        if send {
            rx_depth = rx_depth.min(iters);
            if rx_depth % 2 == 1 {
                rx_depth += 1;
            }
        }
        let secs = |v: f64, name: &str| {
            if v > 0.0 && v <= 3600.0 {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(format!(
                    "--{name} must be more than 0 and at most 3600 seconds"
                ))
            }
        };
        if cli.transport == Transport::Xdp && cli.iface.is_none() {
            return Err("--transport xdp needs --iface".into());
        }
        Ok(Self {
            test: t,
            size,
            all_sizes: cli.all_sizes,
            duration: cli.duration.filter(|_| !cli.run_infinitely),
            bidirectional: cli.bidirectional,
            qps: u64::from(cli.qps),
            gbits: cli.compat.report_gbits,
            report_unsorted: cli.compat.report_unsorted,
            report_histogram: cli.compat.report_histogram,
            no_peak: cli.compat.no_peak,
            run_infinitely: cli.run_infinitely,
            post_list: cli.post_list,
            inline_size: cli.compat.inline_size.map_or(0, u64::from),
            use_event: cli.compat.use_event,
            report_every: cli.duration.unwrap_or(5),
            iters,
            tx_depth: tx_depth.min(iters),
            rx_depth,
            setup: secs(cli.timeout, "timeout")?,
            step: secs(cli.step_timeout, "step-timeout")?,
            settle: Duration::from_millis(cli.settle_ms),
            rd_atomic: cli.rd_atomic,
            json: cli.json,
        })
    }

    fn params(&self, cli: &PerftestCli) -> ConnectParams {
        ConnectParams {
            mpa: MpaConfig {
                rev: cli.mpa_rev,
                crc: cli.crc.on(),
                markers: false,
                ird: self.rd_atomic,
                ord: self.rd_atomic,
                // Initiator: peer-to-peer with an RTR, as rdma_cm on Linux does, so the
                // responder may send first (write-lat's server Writes first; without an RTR
                // an MPA responder must wait for our first FPDU, RFC 5044 7.1.2). Never a
                // zero-length Send as RTR: it would take a receive perftest did not post.
                peer_to_peer: cli.mpa_rev == 2 && cli.p2p.on(),
                rtr_send: false,
                // Server: Linux siw as Initiator sends no RTR in write tests, and write-lat's
                // server Writes first; siw's own responder does not wait either.
                responder_waits_for_fpdu: cli.responder_waits.on(),
                ..MpaConfig::default()
            },
            setup_timeout: self.step,
            // Room for `-t` work requests outstanding and `-r` receives posted (a post
            // beyond a queue's depth fails).
            sq_depth: (self.tx_depth as usize).max(ConnectParams::default().sq_depth),
            rq_depth: (self.rx_depth as usize).max(ConnectParams::default().rq_depth),
            tos: cli.compat.tos.unwrap_or(0),
            ..ConnectParams::default()
        }
    }
}

/// What a run produced.
struct Outcome {
    /// The result table's rows (perftest's format; latency tests' `-U`/`-H` samples before
    /// their row).
    table: Vec<String>,
    /// What was verified, in words.
    verified: String,
    json: serde_json::Value,
}

/// Entry point: `args` starts with "perftest".
pub fn main(args: impl IntoIterator<Item = String>) -> ExitCode {
    let cli: PerftestCli = match crate::parse_args(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let run = match Run::from_cli(&cli) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("perftest: {e}");
            return ExitCode::from(2);
        }
    };
    for note in cli.compat.notes() {
        eprintln!("perftest: {note}");
    }
    let net = match Net::start(
        cli.transport,
        cli.iface.as_deref(),
        cli.pcap.as_deref(),
        cli.xdp_mode,
    ) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("perftest: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !run.json {
        // perftest's header block and column line, before the run (its rows may come while
        // it goes on: --run_infinitely).
        let header = report::Header {
            test: run.test,
            server: cli.server.is_none(),
            bidirectional: run.bidirectional,
            qps: run.qps,
            tx_depth: run.tx_depth,
            rx_depth: run.rx_depth,
            cq_mod: 1,
            post_list: run.post_list,
            inline: run.inline_size,
            out_reads: run.rd_atomic,
            mtu: wire::mtu_octets(wire::OUR_MTU),
            device: cli.iface.as_deref().unwrap_or(cli.transport.name()),
        };
        for l in report::header_block(&header) {
            println!("{l}");
        }
        println!(
            "{}",
            if run.test.is_bw() {
                report::bw_header(run.gbits)
            } else {
                report::LAT_HEADER
            }
        );
    }
    let res = match cli.server.as_deref() {
        None => run_server(&cli, run, &net),
        Some(host) => resolve(host, cli.port).and_then(|a| run_client(&cli, run, &net, a)),
    };
    let (engine, pcap) = net.finish();
    if let Some(report) = &engine {
        eprintln!("perftest: {}", report.line());
    }
    if let Some(p) = &pcap {
        eprintln!("perftest: {}", p.line());
    }
    match res {
        Ok(mut out) => {
            if run.json {
                // The engine's counters as iwarp-bench's own tests report them: an object for
                // `--transport xdp`, null for the socket transport.
                out.json["engine"] = serde_json::to_value(&engine).unwrap_or_default();
                if let Some(p) = &pcap {
                    out.json["pcap"] = serde_json::to_value(p).unwrap_or_default();
                }
                println!("{}", out.json);
            } else {
                for l in &out.table {
                    println!("{l}");
                }
                println!("{}", report::RESULT_LINE);
                eprintln!("perftest: {}", out.verified);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("perftest: {} {}: FAILED: {e}", run.test.name(), role(&cli));
            ExitCode::FAILURE
        }
    }
}

fn role(cli: &PerftestCli) -> &'static str {
    if cli.server.is_some() {
        "client"
    } else {
        "server"
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, PerftestError> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| PerftestError::Setup(format!("cannot resolve {host}: {e}")))?
        .next()
        .ok_or_else(|| PerftestError::Setup(format!("{host} has no address")))
}

/// A connected run: both queue pairs and the agreed buffer geometry.
struct Session {
    run: Run,
    server: bool,
    pd: ProtectionDomain,
    comm: Comm,
    data: Qp,
    /// `-q`: the further data queue pairs (sharing `data`'s completion queue).
    more: Vec<Qp>,
    geo: Geometry,
    peer_version: String,
}

fn log(run: &Run, what: std::fmt::Arguments) {
    if !run.json {
        eprintln!("perftest: {what}");
    }
}

fn accept(
    listener: &Listener,
    timeout: Duration,
    step: &str,
) -> Result<datapath::ConnectRequest, PerftestError> {
    listener
        .accept_timeout(timeout)
        .map_err(|e| PerftestError::datapath(step, e))?
        .ok_or_else(|| PerftestError::Timeout {
            step: step.to_string(),
            after: timeout,
            state: "no connection arrived".into(),
        })
}

/// [`accept`] of a connection from `client` only: one from any other address (a third party
/// racing the client for its data connection) is rejected and logged, and the wait goes on
/// within `timeout`.
fn accept_from(
    run: &Run,
    listener: &Listener,
    client: std::net::IpAddr,
    timeout: Duration,
    step: &str,
) -> Result<datapath::ConnectRequest, PerftestError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let req = accept(listener, left, step).map_err(|e| match e {
            PerftestError::Timeout { step, .. } => PerftestError::Timeout {
                step,
                after: timeout,
                state: "no connection from the client arrived".into(),
            },
            e => e,
        })?;
        let from = req.peer_addr();
        if from.ip() == client {
            return Ok(req);
        }
        log(
            run,
            format_args!("{step}: rejected a connection from {from}: the client is {client}"),
        );
        // Rejected with an MPA Reply (R set); if that cannot go, dropped, which rejects too.
        let _ = req.reject(&[]);
    }
}

/// Versions, cycle buffer, cache line and MTU (`exchange_versions`, `check_sys_data`,
/// `check_mtu`).
fn prefix(comm: &mut Comm, size: u64) -> Result<(Geometry, String), PerftestError> {
    let step = "version exchange";
    let v = comm.exchange(
        step,
        &wire::version_bytes(wire::OUR_VERSION),
        wire::VERSION_LEN,
    )?;
    let (peer_version, num) = wire::parse_version(&v);
    if num < wire::MIN_PEER_VERSION {
        return Err(PerftestError::protocol(
            step,
            format!(
                "peer is perftest {peer_version:?}; this mode speaks 6.06's exchange and \
                 perftest refuses peers older than 5.70"
            ),
        ));
    }
    let step = "cycle buffer exchange";
    let c = comm.exchange(step, &wire::be32(wire::OUR_CYCLE_BUFFER), 4)?;
    let cycle = wire::read_be32(&c).unwrap_or(0);
    // perftest's is the page size (4 KiB, 64 KiB on some machines); buffers sized by it
    // (two cycles' worth at most) stay within what we register at most.
    if !(64..=MAX_BUFFER / 2).contains(&u64::from(cycle)) {
        return Err(PerftestError::protocol(
            step,
            format!(
                "the peer's cycle buffer {cycle} is outside 64 octets to {}",
                MAX_BUFFER / 2
            ),
        ));
    }
    let step = "cache line exchange";
    let c = comm.exchange(step, &wire::be32(wire::OUR_CACHE_LINE), 4)?;
    let line = wire::read_be32(&c).unwrap_or(0);
    if !(1..=4096).contains(&line) {
        return Err(PerftestError::protocol(
            step,
            format!("implausible cache line size {line}"),
        ));
    }
    comm.exchange("MTU exchange", wire::OUR_MTU, 2)?;
    let geo = Geometry {
        size,
        cycle: u64::from(cycle.max(wire::OUR_CYCLE_BUFFER)),
        cache_line: u64::from(line.max(wire::OUR_CACHE_LINE)),
    };
    Ok((geo, peer_version))
}

fn run_server(cli: &PerftestCli, run: Run, net: &Net) -> Result<Outcome, PerftestError> {
    let (listener, addr) = net
        .listen(&cli.bind, cli.port, run.params(cli))
        .map_err(PerftestError::Setup)?;
    log(
        &run,
        format_args!("{} server listening on {addr}", run.test.name()),
    );
    let pd = crate::net::protection_domain();
    let step = "communication connection (waiting for the client)";
    let req = accept(&listener, run.setup, step)?;
    let cq = CompletionQueue::new();
    let mr = Comm::region(&pd)?;
    let conn = req
        .accept_with_recvs(&pd, &cq, &[], vec![Comm::recv_wr(&mr)])
        .map_err(|e| PerftestError::datapath(step, e))?;
    log(
        &run,
        format_args!(
            "communication connection from {} ({})",
            conn.qp.peer_addr(),
            describe(&conn.qp)
        ),
    );
    let client = conn.qp.peer_addr().ip();
    let mut comm = Comm::new(Qp::new(conn.qp, cq, run.step), mr, true);
    let (geo, peer_version) = prefix(&mut comm, run.size)?;
    comm.handshake("handshake before the data connection", &Dest::default())?;
    let step = "data connection";
    let req = accept_from(&run, &listener, client, run.step, step)?;
    let (dcq, channel) = data_cq(&run)?;
    let conn = req
        .accept(&pd, &dcq, &[])
        .map_err(|e| PerftestError::datapath(step, e))?;
    // -q: the further data connections, numbered in the order they arrive (as perftest's
    // server numbers its connect requests), on the same completion queue.
    let mut more = Vec::new();
    for k in 1..run.qps {
        let step = format!("data connection {} of {}", k + 1, run.qps);
        let req = accept_from(&run, &listener, client, run.step, &step)?;
        let c = req
            .accept(&pd, &dcq, &[])
            .map_err(|e| PerftestError::datapath(&step, e))?;
        more.push(Qp::new(c.qp, dcq.clone(), run.step));
    }
    drop(listener);
    log(
        &run,
        format_args!(
            "data connection from {} ({}); peer is perftest {peer_version}",
            conn.qp.peer_addr(),
            describe(&conn.qp)
        ),
    );
    let data = Qp::new(conn.qp, dcq, run.step).with_channel(channel);
    comm.handshake("handshake after the data connection", &Dest::default())?;
    let mut s = Session {
        run,
        server: true,
        pd,
        comm,
        data,
        more,
        geo,
        peer_version,
    };
    let out = match run.test {
        TestKind::WriteBw => s.server_write_bw(),
        TestKind::ReadBw => s.server_read_bw(),
        TestKind::SendBw => s.server_send_bw(),
        TestKind::WriteLat => s.server_write_lat(),
        TestKind::ReadLat => s.server_read_lat(),
        TestKind::SendLat => s.server_send_lat(),
        TestKind::AtomicBw | TestKind::AtomicLat => Err(PerftestError::Setup(
            "no atomic tests in perftest mode".into(),
        )),
    }?;
    // The client disconnects first (perftest's does, data then communication connection);
    // closing under it can fail its last work request's completion (seen with siw: "Bad wc
    // status 2" on the closing handshake's Send). write-lat has no closing exchange: its
    // client waits for us instead, and its last Write, which ended our loop, may not have
    // completed on its side yet: Linux siw fails it ("Failed status 2", seen under QEMU's
    // emulation) if our FIN comes first, so give it a moment before we close.
    if run.test == TestKind::WriteLat {
        std::thread::sleep(CLOSE_GRACE);
        s.finish(Duration::ZERO);
    } else {
        s.finish(Duration::from_secs(3));
    }
    Ok(out)
}

fn run_client(
    cli: &PerftestCli,
    run: Run,
    net: &Net,
    addr: SocketAddr,
) -> Result<Outcome, PerftestError> {
    let params = run.params(cli);
    let pd = crate::net::protection_domain();
    let cq = CompletionQueue::new();
    let mr = Comm::region(&pd)?;
    let step = "communication connection";
    let pause = Duration::from_millis(100);
    let (conn, tries) = net
        .connect_retrying(addr, &pd, &cq, &params, run.setup, pause)
        .map_err(|e| PerftestError::datapath(&format!("{step} to {addr}"), e))?;
    conn.qp
        .post_recv(Comm::recv_wr(&mr))
        .map_err(|e| PerftestError::datapath(step, e))?;
    log(
        &run,
        format_args!(
            "communication connection to {addr} after {tries} attempt(s) ({})",
            describe(&conn.qp)
        ),
    );
    std::thread::sleep(run.settle);
    let mut comm = Comm::new(Qp::new(conn.qp, cq, run.step), mr, false);
    let (geo, peer_version) = prefix(&mut comm, run.size)?;
    comm.handshake("handshake before the data connection", &Dest::default())?;
    let step = "data connection";
    let (dcq, channel) = data_cq(&run)?;
    // The server listens again only after the handshake: retry while refused.
    let (conn, tries) = net
        .connect_retrying(addr, &pd, &dcq, &params, run.step, pause)
        .map_err(|e| PerftestError::datapath(&format!("{step} to {addr}"), e))?;
    log(
        &run,
        format_args!(
            "data connection after {tries} attempt(s) ({}); peer is perftest {peer_version}",
            describe(&conn.qp)
        ),
    );
    // -q: the further data connections, one after the other (so the server numbers them
    // as we do), on the same completion queue.
    let mut more = Vec::new();
    for k in 1..run.qps {
        let step = format!("data connection {} of {}", k + 1, run.qps);
        let (c, _) = net
            .connect_retrying(addr, &pd, &dcq, &params, run.step, pause)
            .map_err(|e| PerftestError::datapath(&format!("{step} to {addr}"), e))?;
        more.push(Qp::new(c.qp, dcq.clone(), run.step));
    }
    std::thread::sleep(run.settle);
    let data = Qp::new(conn.qp, dcq, run.step).with_channel(channel);
    comm.handshake("handshake after the data connection", &Dest::default())?;
    let mut s = Session {
        run,
        server: false,
        pd,
        comm,
        data,
        more,
        geo,
        peer_version,
    };
    let out = match run.test {
        TestKind::WriteBw => s.client_bw(BwKind::Write),
        TestKind::ReadBw => s.client_bw(BwKind::Read),
        TestKind::SendBw => s.client_bw(BwKind::Send),
        TestKind::WriteLat => s.client_write_lat(),
        TestKind::ReadLat => s.client_read_lat(),
        TestKind::SendLat => s.client_send_lat(),
        TestKind::AtomicBw | TestKind::AtomicLat => Err(PerftestError::Setup(
            "no atomic tests in perftest mode".into(),
        )),
    }?;
    // Linux siw fails a work request whose data already left but whose completion it has not
    // yet made when the connection closes (seen: "Failed status 2" on write-lat's last Write,
    // "Bad wc status 2" on the closing handshake's reply). write-lat ends without a closing
    // exchange: let the server disconnect first. Otherwise give its last Send a moment.
    if run.test == TestKind::WriteLat {
        s.finish(Duration::from_secs(5));
    } else {
        std::thread::sleep(CLOSE_GRACE);
        s.finish(Duration::ZERO);
    }
    Ok(out)
}

fn describe(qp: &datapath::QueuePair) -> String {
    crate::net::describe_agreed(qp)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BwKind {
    Write,
    Read,
    Send,
}

/// A report as JSON, the bandwidth keys named by its unit (`--report_gbits`: Gb/s).
fn bw_json(r: &BwReport, gbits: bool) -> serde_json::Value {
    let (peak, avg) = if gbits {
        ("bw_peak_gbit_per_sec", "bw_avg_gbit_per_sec")
    } else {
        ("bw_peak_mb_per_sec", "bw_avg_mb_per_sec")
    };
    json!({ "bytes": r.size, "iterations": r.iters, peak: r.bw_peak, avg: r.bw_avg,
            "msg_rate_mpps": r.msg_rate })
}

const MB: f64 = 1_048_576.0;

fn fill(mr: &MemoryRegion, seed: u64, at: u64, pattern_at: u64, len: u64) {
    let mut chunk = vec![0u8; len.min(1 << 20) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        pattern::fill(seed, pattern_at + done, &mut chunk[..n]);
        mr.write((at + done) as usize, &chunk[..n]);
        done += n as u64;
    }
}

/// First octet of `mr[at..at + len]` that differs from the pattern at `pattern_at`.
fn mismatch(mr: &MemoryRegion, seed: u64, at: u64, pattern_at: u64, len: u64) -> Option<u64> {
    let mut buf = vec![0u8; len as usize];
    mr.read(at as usize, &mut buf);
    pattern::first_mismatch(seed, pattern_at, &buf).map(|i| i as u64)
}

impl Session {
    fn log(&self, what: std::fmt::Arguments) {
        log(&self.run, what);
    }

    fn register(
        &self,
        len: u64,
        access: Access,
        what: &str,
    ) -> Result<MemoryRegion, PerftestError> {
        if len > MAX_BUFFER {
            return Err(PerftestError::Setup(format!(
                "{what}: {len} octets exceed the {MAX_BUFFER}-octet cap (smaller -s, -t or -r)"
            )));
        }
        let mr = self
            .pd
            .register(len.max(1) as usize, access)
            .map_err(|e| PerftestError::datapath(what, e))?;
        crate::net::note_unpinned(&mr);
        Ok(mr)
    }

    /// Our `pingpong_dest` for a buffer.
    fn dest(&self, mr: &MemoryRegion, offset: u64) -> Dest {
        Dest {
            out_reads: u32::from(self.run.rd_atomic),
            qpn: self.data.qp.num(),
            rkey: mr.stag().0,
            vaddr: mr.base_to() + offset,
            ..Dest::default()
        }
    }

    /// The `n` handshakes that carry the buffer keys; every one must repeat the first.
    fn dests(&mut self, n: usize, mine: &Dest) -> Result<Dest, PerftestError> {
        let first = self
            .comm
            .handshake(&format!("buffer-key handshake 1 of {n}"), mine)?;
        for k in 2..=n {
            let step = format!("buffer-key handshake {k} of {n}");
            let d = self.comm.handshake(&step, mine)?;
            if (d.rkey, d.vaddr) != (first.rkey, first.vaddr) {
                return Err(PerftestError::protocol(
                    &step,
                    format!(
                        "peer changed its buffer from rkey {:#x} vaddr {:#x} to rkey {:#x} \
                         vaddr {:#x}",
                        first.rkey, first.vaddr, d.rkey, d.vaddr
                    ),
                ));
            }
        }
        self.log(format_args!(
            "peer buffer: rkey {:#010x} vaddr {:#018x}, out_reads {}; ours: rkey {:#010x} \
             vaddr {:#018x}; cycle buffer {}, cache line {}, {} slot(s) of {} octets",
            first.rkey,
            first.vaddr,
            first.out_reads,
            mine.rkey,
            mine.vaddr,
            self.geo.cycle,
            self.geo.cache_line,
            self.geo.slots(),
            self.geo.inc()
        ));
        Ok(first)
    }

    /// Server, while the client's Writes or Reads run (our side posts nothing and sees no
    /// completion): the client's handshake at their end, waited for as long as the run takes
    /// (perftest's server waits so too; with `-D` or a large `-n` that is longer than one
    /// step, and the server is not told `-D`). A client that vanishes ends the connection
    /// (TCP keepalive, the user timeout), and the wait with it.
    fn await_client_data_phase(&mut self, step: &str) -> Result<Dest, PerftestError> {
        self.comm
            .set_step_timeout(Duration::from_secs(10 * 365 * 24 * 3600));
        let got = self.comm.recv_dest(step);
        self.comm.set_step_timeout(self.run.step);
        got
    }

    /// `--run_infinitely`, server: perftest's client runs until it is interrupted and then
    /// closes without a report; we wait as long as that takes, then check what we can (a
    /// write-bw target's guards and gaps untouched).
    fn until_client_leaves(
        &mut self,
        test: &str,
        target: Option<&MemoryRegion>,
    ) -> Result<Outcome, PerftestError> {
        // Ten years: as long as the connection lives.
        self.comm
            .set_step_timeout(Duration::from_secs(10 * 365 * 24 * 3600));
        let step = "waiting for the client to stop";
        match self.comm.recv_dest(step) {
            // The client closed: our receive flushed, or the connection is gone.
            Err(PerftestError::Closed { .. })
            | Err(PerftestError::Completion {
                status: WcStatus::WrFlushError,
                ..
            }) => {}
            Err(e) => return Err(e),
            Ok(_) => {
                return Err(PerftestError::protocol(
                    step,
                    "the client sent a handshake: it does not run infinitely".to_string(),
                ))
            }
        }
        if let Some(mr) = target {
            self.check_target(mr, 1, 0, self.geo.slots())?;
        }
        Ok(Outcome {
            table: Vec::new(),
            verified: format!(
                "{test} server: the client ran until interrupted and closed{}",
                if target.is_some() {
                    "; nothing outside the slots it may write changed"
                } else {
                    ""
                }
            ),
            json: json!({ "role": "server", "test": test, "run_infinitely": true,
                          "peer_version": self.peer_version }),
        })
    }

    /// Data queue pair `q` (`-q`: the first, then the further ones in connection order).
    fn qp_at(&self, q: usize) -> &Qp {
        match q.checked_sub(1) {
            Some(k) => self.more.get(k).unwrap_or(&self.data),
            None => &self.data,
        }
    }

    /// The buffer-key handshakes of a bandwidth test, one `pingpong_dest` per queue pair
    /// (`mine`): one round per queue pair, a second round repeating them, then one more with
    /// the first (perftest's write_bw/read_bw with `-q`; three alike for one queue pair). The
    /// peer's, per queue pair.
    fn dests_per_qp(&mut self, mine: &[Dest]) -> Result<Vec<Dest>, PerftestError> {
        let n = mine.len();
        if n == 1 {
            return Ok(vec![self.dests(3, &mine[0])?]);
        }
        let total = 2 * n + 1;
        let mut peers = Vec::with_capacity(n);
        for (k, d) in mine.iter().enumerate() {
            let step = format!("buffer-key handshake {} of {total}", k + 1);
            peers.push(self.comm.handshake(&step, d)?);
        }
        for (k, d) in mine.iter().enumerate() {
            let step = format!("buffer-key handshake {} of {total}", n + k + 1);
            let again = self.comm.handshake(&step, d)?;
            if (again.rkey, again.vaddr) != (peers[k].rkey, peers[k].vaddr) {
                return Err(PerftestError::protocol(
                    &step,
                    format!("peer changed queue pair {k}'s buffer between rounds"),
                ));
            }
        }
        self.comm.handshake(
            &format!("buffer-key handshake {total} of {total}"),
            &mine[0],
        )?;
        self.log(format_args!(
            "{n} queue pairs; peer buffers: {}",
            peers
                .iter()
                .map(|d| format!("rkey {:#010x} vaddr {:#018x}", d.rkey, d.vaddr))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        Ok(peers)
    }

    /// `xchg_bw_reports`: five 8-octet exchanges.
    fn reports(&mut self, mine: &BwReport) -> Result<BwReport, PerftestError> {
        let names = ["size", "iterations", "peak", "average", "message rate"];
        let m = mine.encode();
        let mut got = [[0u8; 8]; 5];
        for k in 0..5 {
            let b = self
                .comm
                .exchange(&format!("report exchange ({})", names[k]), &m[k], 8)?;
            got[k].copy_from_slice(&b);
        }
        Ok(BwReport::decode(&got))
    }

    /// Ends the run: waits up to `linger` for the peer to close each connection (data, then
    /// communication), then closes it.
    fn finish(&mut self, linger: Duration) {
        if !linger.is_zero() && !self.data.qp.wait_finished(linger) {
            self.log(format_args!(
                "the peer did not close the data connection within {linger:?}; closing it"
            ));
        }
        self.data.qp.disconnect();
        for q in &mut self.more {
            q.qp.disconnect();
        }
        if !linger.is_zero() {
            self.comm.qp_mut().wait_finished(linger);
        }
        self.comm.qp_mut().disconnect();
    }

    /// Waits until `mr[off]` holds `want` (a latency test's iteration number), spinning.
    fn wait_octet(
        &self,
        step: &str,
        mr: &MemoryRegion,
        off: u64,
        want: u8,
    ) -> Result<(), PerftestError> {
        let start = Instant::now();
        let mut spins = 0u64;
        loop {
            if mr.read_volatile(off as usize) == Some(want) {
                return Ok(());
            }
            spins += 1;
            if spins.is_multiple_of(1024) {
                let waited = start.elapsed();
                if waited > self.run.step {
                    return Err(PerftestError::Timeout {
                        step: step.to_string(),
                        after: self.run.step,
                        state: format!(
                            "octet {off} holds {:?}, waiting for {want}; {}",
                            mr.read_volatile(off as usize),
                            qp_state(&self.data.qp)
                        ),
                    });
                }
                self.data.check_alive(step)?;
                if waited > Duration::from_millis(1) {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
            std::thread::yield_now();
        }
    }

    /// RDMA-Reads `len` octets of the peer's buffer at `to` into a fresh region.
    fn read_back(
        &mut self,
        step: &str,
        rkey: u32,
        to: u64,
        len: u64,
    ) -> Result<MemoryRegion, PerftestError> {
        let mr = self.register(len, Access::LOCAL_WRITE, step)?;
        fill(&mr, POISON_SEED, 0, 0, len);
        self.data.post(
            step,
            SendWr {
                wr_id: K_CHECK,
                op: SendOp::Read {
                    remote_stag: Stag(rkey),
                    remote_to: to,
                },
                sg_list: mr.sge(0, len as u32).into(),
                signaled: true,
                fence: false,
            },
        )?;
        let c = self.data.wait_id(step, K_CHECK)?;
        if u64::from(c.wc.byte_len) != len {
            return Err(PerftestError::protocol(
                step,
                format!("RDMA Read returned {} of {len} octets", c.wc.byte_len),
            ));
        }
        Ok(mr)
    }

    /// RDMA-Writes `src[0..len]` over the peer's buffer at `to` and waits for completion.
    fn write_over(
        &mut self,
        step: &str,
        src: &MemoryRegion,
        rkey: u32,
        to: u64,
        len: u64,
    ) -> Result<(), PerftestError> {
        self.data.post(
            step,
            SendWr {
                wr_id: K_FILL,
                op: SendOp::Write {
                    remote_stag: Stag(rkey),
                    remote_to: to,
                },
                sg_list: src.sge(0, len as u32).into(),
                signaled: true,
                fence: false,
            },
        )?;
        self.data.wait_id(step, K_FILL)?;
        Ok(())
    }

    // ---- servers (the perftest tool is the client) ----

    /// write-bw's target: `windows` (one per queue pair) advertised windows of
    /// `BUFF_SIZE` octets back to back between two guards, filled with what the peer's Writes
    /// must change; the region and our `pingpong_dest` of each window.
    fn target_buffer(&self, windows: u64) -> Result<(MemoryRegion, Vec<Dest>), PerftestError> {
        let win = self.geo.buff_size();
        let len = GUARD + windows * win + GUARD;
        let mr = self.register(
            len,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            "registering the target buffer",
        )?;
        fill(&mr, POISON_SEED, 0, 0, len);
        let dests = (0..windows)
            .map(|i| self.dest(&mr, GUARD + i * win))
            .collect();
        Ok((mr, dests))
    }

    /// Checks every octet of a [`Session::target_buffer`] after the peer's Writes: in each
    /// window the first `written` slots changed, those up to `may` changed or not, all else as
    /// we left it. The peer's last handshake travels on the other connection and can overtake
    /// the last Writes still being placed: a slot still untouched is looked at again for a
    /// while.
    fn check_target(
        &self,
        mr: &MemoryRegion,
        windows: u64,
        written: u64,
        may: u64,
    ) -> Result<(), PerftestError> {
        let step = "checking the written buffer";
        let g = self.geo;
        let len = mr.len();
        let mut got = vec![0u8; len];
        let mut expect = vec![0u8; len];
        pattern::fill(POISON_SEED, 0, &mut expect);
        let start = Instant::now();
        loop {
            mr.read(0, &mut got);
            match check_written(&got, &expect, windows, written, may, g) {
                Ok(()) => return Ok(()),
                Err(Unwritten::Slot(..)) if start.elapsed() < self.run.step.min(SETTLE) => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(Unwritten::Slot(w, k)) => {
                    return Err(PerftestError::mismatch(
                        step,
                        format!(
                            "slot {k} (offset {}) of window {w} was never written",
                            k * g.inc()
                        ),
                    ))
                }
                Err(Unwritten::Outside(i)) => return Err(untouched_changed(step, i, GUARD)),
            }
        }
    }

    fn server_write_bw(&mut self) -> Result<Outcome, PerftestError> {
        if self.run.bidirectional {
            return self.client_bw(BwKind::Write);
        }
        let g = self.geo;
        let qps = self.run.qps;
        let (mr, mine) = self.target_buffer(qps)?;
        self.dests_per_qp(&mine)?;
        let step = "handshake after the client's Writes";
        if self.run.run_infinitely {
            return self.until_client_leaves("write-bw", Some(&mr));
        }
        self.await_client_data_phase(step)?;
        self.comm.send_dest(step, &mine[0])?;
        let peer = self.reports(&BwReport::default())?;
        // In duration mode the report counts only the messages of the sampling window: at
        // least that many slots were written, maybe all.
        // -l: the lists' elements go to the same slots every time.
        let used = if self.run.post_list > 1 {
            g.slots().min(self.run.post_list)
        } else {
            g.slots()
        };
        let (written, may) = match self.run.duration {
            Some(_) => (peer.iters.min(used), used),
            None => (self.run.iters.min(used), self.run.iters.min(used)),
        };
        if written == 0 {
            // Nothing to check would pass the check: a run of no Writes is no run.
            return Err(PerftestError::protocol(
                "checking the client's Writes",
                "the client reports no completed Write".to_string(),
            ));
        }
        self.check_target(&mr, qps, written, may)?;
        self.comm.handshake("closing handshake", &mine[0])?;
        Ok(Outcome {
            table: vec![report::bw_row(&peer, self.run.gbits)],
            verified: format!(
                "write-bw server: {written} slot(s) of {} octets written{}, the other {} \
                 octets of the buffer (gaps, unused slots, {GUARD}-octet guards) untouched; \
                 the table is the client's own report",
                g.size,
                if qps > 1 {
                    format!(" in each of {qps} queue pairs' windows")
                } else {
                    String::new()
                },
                mr.len() as u64 - qps * written * g.size
            ),
            json: json!({ "role": "server", "test": "write-bw", "peer_report": bw_json(&peer, self.run.gbits),
                          "slots_written": written, "octets_checked": mr.len(), "qps": qps,
                          "peer_version": self.peer_version }),
        })
    }

    fn server_read_bw(&mut self) -> Result<Outcome, PerftestError> {
        let g = self.geo;
        let win = g.buff_size();
        // Remote write too, as perftest grants on iWARP (its Read tests' peers may write).
        let mr = self.register(
            win,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            "registering the source buffer",
        )?;
        fill(&mr, PATTERN_SEED, 0, 0, win);
        let mine = self.dest(&mr, 0);
        let peer = self.dests(3, &mine)?;
        let step = "handshake after the client's Reads";
        if self.run.run_infinitely {
            return self.until_client_leaves("read-bw", None);
        }
        self.await_client_data_phase(step)?;
        self.comm.send_dest(step, &mine)?;
        let peer_rep = self.reports(&BwReport::default())?;
        // The client's Reads landed in its buffer's first half, slot for slot (in duration
        // mode at least as many as its report counts).
        let step = "reading back the client's landing area";
        let written = match self.run.duration {
            Some(_) => peer_rep.iters.min(g.slots()),
            None => self.run.iters.min(g.slots()),
        };
        if written == 0 {
            return Err(PerftestError::protocol(
                step,
                "the client reports no completed Read".to_string(),
            ));
        }
        let len = (written - 1) * g.inc() + g.size;
        let base = peer.vaddr.checked_sub(g.buff_size()).ok_or_else(|| {
            PerftestError::protocol(step, format!("client vaddr {:#x} too low", peer.vaddr))
        })?;
        let back = self.read_back(step, peer.rkey, base, len)?;
        for k in 0..written {
            let off = k * g.inc();
            if let Some(i) = mismatch(&back, PATTERN_SEED, off, off, g.size) {
                return Err(PerftestError::mismatch(
                    step,
                    format!("slot {k}: octet {i} of what the client read differs from ours"),
                ));
            }
        }
        self.comm.handshake("closing handshake", &mine)?;
        Ok(Outcome {
            table: vec![report::bw_row(&peer_rep, self.run.gbits)],
            verified: format!(
                "read-bw server: read back the client's landing area ({written} slot(s) of {} \
                 octets): equal to what we served; the table is the client's own report",
                g.size
            ),
            json: json!({ "role": "server", "test": "read-bw", "peer_report": bw_json(&peer_rep, self.run.gbits),
                          "octets_verified": written * g.size,
                          "peer_version": self.peer_version }),
        })
    }

    fn server_send_bw(&mut self) -> Result<Outcome, PerftestError> {
        let g = self.geo;
        let size = g.size;
        let r = self.run.rx_depth;
        let ring = self.register(r * size, Access::LOCAL_WRITE, "registering receive buffers")?;
        let credit_src = self.register(4, Access::LOCAL_WRITE, "registering the credit word")?;
        let credit_adv = self.register(
            4,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            "registering the credit word",
        )?;
        let mine = self.dest(&credit_adv, 0);
        let peer = self.dests(3, &mine)?;
        let step = "posting receives";
        for slot in 0..r {
            self.data.post_recv(step, recv_wr(&ring, slot, size))?;
        }
        self.comm
            .handshake("handshake before the test (receives posted)", &mine)?;
        let step = "receiving the client's Sends";
        let n = self.run.iters;
        let credit_every = (r / 3).max(1);
        let slots = g.slots();
        let mut refs = vec![0u8; (slots.min(n) * size) as usize];
        let mut msg = vec![0u8; size as usize];
        let (mut rcnt, mut first, mut last) = (0u64, None, Instant::now());
        while rcnt < n {
            let c = self.data.next(step)?;
            if c.wc.opcode != WcOpcode::Recv {
                continue; // a credit Write's completion
            }
            let slot = c.wc.wr_id & !KIND;
            if u64::from(c.wc.byte_len) != size {
                return Err(PerftestError::mismatch(
                    step,
                    format!("message {rcnt} has {} octets, want {size}", c.wc.byte_len),
                ));
            }
            last = Instant::now();
            first.get_or_insert(last);
            ring.read((slot * size) as usize, &mut msg);
            let src = rcnt % slots;
            let r0 = (src * size) as usize..((src + 1) * size) as usize;
            if rcnt < slots {
                refs[r0].copy_from_slice(&msg);
            } else if refs[r0.clone()] != msg[..] {
                let i = refs[r0].iter().zip(&msg).position(|(a, b)| a != b);
                return Err(PerftestError::mismatch(
                    step,
                    format!(
                        "message {rcnt} differs at octet {} from message {src}, sent from \
                         the same slot of the client's unchanging buffer",
                        i.unwrap_or(0)
                    ),
                ));
            }
            rcnt += 1;
            self.data.post_recv(step, recv_wr(&ring, slot, size))?;
            if (rcnt % r).is_multiple_of(credit_every) {
                // perftest's credit: the count of received messages, a native (little-endian)
                // u32 RDMA-Written into the client's credit word.
                credit_src.write(0, &(rcnt as u32).to_le_bytes());
                self.data.post(
                    step,
                    SendWr {
                        wr_id: K_CREDIT | rcnt,
                        op: SendOp::Write {
                            remote_stag: Stag(peer.rkey),
                            remote_to: peer.vaddr,
                        },
                        sg_list: credit_src.sge(0, 4).into(),
                        signaled: true,
                        fence: false,
                    },
                )?;
            }
        }
        let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
        let rep = bw_report(size, n, secs, None, self.run.gbits);
        self.comm.handshake("closing handshake", &mine)?;
        Ok(Outcome {
            table: vec![report::bw_row(&rep, self.run.gbits)],
            verified: format!(
                "send-bw server: {n} Sends of {size} octets received, lengths right, each equal \
                 to the earlier ones from the same one of the client's {} source slot(s); \
                 credits every {credit_every} messages (receive window {r})",
                slots.min(n)
            ),
            json: json!({ "role": "server", "test": "send-bw", "result": bw_json(&rep, self.run.gbits),
                          "messages": n, "rx_depth": r, "peer_version": self.peer_version }),
        })
    }

    fn server_write_lat(&mut self) -> Result<Outcome, PerftestError> {
        let b = self.geo.buff_size();
        let mr = self.register(
            2 * b,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            "registering the ping-pong buffer",
        )?;
        let mine = self.dest(&mr, b);
        let peer = self.dests(4, &mine)?;
        let runs = self.write_lat_sizes(&mr, peer, true)?;
        self.lat_outcomes(runs, "write-lat server", "every Write from the client")
    }

    fn server_read_lat(&mut self) -> Result<Outcome, PerftestError> {
        let g = self.geo;
        let b = g.buff_size();
        let mr = self.register(
            b,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            "registering the source buffer",
        )?;
        fill(&mr, PATTERN_SEED, 0, 0, b);
        let mine = self.dest(&mr, 0);
        let peer = self.dests(4, &mine)?;
        let step = "closing handshake (the client's Reads are done)";
        self.await_client_data_phase(step)?;
        let step = "reading back the client's landing area";
        let base = peer.vaddr.checked_sub(b).ok_or_else(|| {
            PerftestError::protocol(step, format!("client vaddr {:#x} too low", peer.vaddr))
        })?;
        let back = self.read_back(step, peer.rkey, base, g.size)?;
        if let Some(i) = mismatch(&back, PATTERN_SEED, 0, 0, g.size) {
            return Err(PerftestError::mismatch(
                step,
                format!("octet {i} of what the client read differs from ours"),
            ));
        }
        self.comm.send_dest(step, &mine)?;
        Ok(Outcome {
            table: Vec::new(),
            verified: format!(
                "read-lat server: read back the client's landing area ({} octets): equal to \
                 what we served (perftest's client prints the latencies)",
                g.size
            ),
            json: json!({ "role": "server", "test": "read-lat", "octets_verified": g.size,
                          "peer_version": self.peer_version }),
        })
    }

    fn server_send_lat(&mut self) -> Result<Outcome, PerftestError> {
        let size = self.geo.size;
        let src = self.register(size, Access::LOCAL_WRITE, "registering the send buffer")?;
        fill(&src, PATTERN_SEED, 0, 0, size);
        let ring = self.register(2 * size, Access::LOCAL_WRITE, "registering receive buffers")?;
        let mine = self.dest(&src, 0);
        self.dests(3, &mine)?;
        for slot in 0..2 {
            self.data
                .post_recv("posting receives", recv_wr(&ring, slot, size))?;
        }
        self.comm
            .handshake("handshake before the test (receives posted)", &mine)?;
        let samples = self.send_lat_loop(&src, &ring, true)?;
        self.comm.handshake("closing handshake", &mine)?;
        self.lat_outcome(samples, "send-lat server", "every Send from the client")
    }

    // ---- clients (the perftest tool is the server) ----

    fn client_bw(&mut self, kind: BwKind) -> Result<Outcome, PerftestError> {
        let g = self.geo;
        let size = g.size;
        let src = self.register(
            g.buff_size(),
            Access::LOCAL_WRITE,
            "registering the source buffer",
        )?;
        fill(&src, PATTERN_SEED, 0, 0, g.buff_size());
        // read-bw lands each Read in its own slot of a ring as deep as the send queue.
        let ring_slots = (self.run.tx_depth).min((MAX_BUFFER / size).max(1));
        let landing = if kind == BwKind::Read {
            Some(self.register(
                ring_slots * size,
                Access::LOCAL_WRITE,
                "registering read buffers",
            )?)
        } else {
            None
        };
        let credit = if kind == BwKind::Send {
            Some(self.register(
                4,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                "registering the credit word",
            )?)
        } else {
            None
        };
        // read-bw advertises a buffer laid out as perftest's client's (landing half, then the
        // advertised half, remote read and write allowed) and keeps in its landing half what
        // the Reads returned, slot for slot, as perftest's client's buffer does.
        let mirror = if kind == BwKind::Read {
            Some(self.register(
                2 * g.buff_size(),
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
                "registering the advertised buffer",
            )?)
        } else {
            None
        };
        // -b: both sides Write; ours is a target like a server's (guards, filled).
        let duplex = self.run.bidirectional && kind == BwKind::Write;
        let target = if duplex {
            Some(self.target_buffer(1)?)
        } else {
            None
        };
        let qps = self.run.qps;
        let mines: Vec<Dest> = match (&credit, &mirror, &target) {
            (Some(c), _, _) => vec![self.dest(c, 0)],
            (None, Some(m), _) => vec![self.dest(m, g.buff_size())],
            (None, None, Some((_, d))) => d.clone(),
            (None, None, None) => (0..qps).map(|_| self.dest(&src, 0)).collect(),
        };
        let mine = mines[0];
        let peers = self.dests_per_qp(&mines)?;
        // The peer's buffer as it describes it: every offset the test adds must stay in the
        // 64-bit address space (the Write or Read names `vaddr + off`).
        if let Some(bad) = peers
            .iter()
            .find(|d| d.vaddr.checked_add(g.span()).is_none())
        {
            return Err(PerftestError::protocol(
                "the peer's buffer key",
                format!(
                    "vaddr {:#x} leaves no room for the test's buffer",
                    bad.vaddr
                ),
            ));
        }
        let peer = peers[0];
        if duplex {
            self.comm
                .handshake("handshake before the test (-b)", &mine)?;
        }
        if kind == BwKind::Read {
            // Our pattern over the server's buffer, so every Read can be checked.
            let step = "writing our pattern over the server's buffer";
            self.write_over(step, &src, peer.rkey, peer.vaddr, g.span())?;
        }
        if kind == BwKind::Send {
            self.comm.handshake(
                "handshake before the test (server's receives posted)",
                &mine,
            )?;
        }
        // -a: every size in turn, no exchange between them (perftest's write_bw client); the
        // report the server gets is the last size's.
        let sizes = self.sizes();
        let mut reps = Vec::new();
        let (mut total_posted, mut checked) = (0u64, 0u64);
        let step = match kind {
            BwKind::Write => "RDMA Writes",
            BwKind::Read => "RDMA Reads",
            BwKind::Send => "Sends",
        };
        for size in sizes {
            let g = Geometry { size, ..self.geo };
            let mut got = vec![0u8; size as usize];
            // -q: message i goes on queue pair i % qps, as message i / qps of that one.
            let infinite = self.run.run_infinitely;
            if infinite {
                // Caught only now that the loop is there to see it; a second one ends the
                // process.
                crate::interrupt::install().map_err(PerftestError::Setup)?;
            }
            let every = Duration::from_secs(u64::from(self.run.report_every));
            let mut row_start = (Instant::now(), 0u64);
            let n = if self.run.duration.is_some() || infinite {
                u64::MAX
            } else {
                self.run.iters * qps
            };
            let mut outstanding = vec![0u64; qps as usize];
            let mut pending = Vec::with_capacity(self.run.post_list as usize);
            let start = Instant::now();
            // -D: post for the whole duration; count what completes in the middle (perftest's
            // START, SAMPLE and STOP_SAMPLE states, `margin` = a quarter, rounded down, each end).
            let mut timed = self
                .run
                .duration
                .map(|d| SampleWindow::new(start, Duration::from_secs(u64::from(d))));
            let depth = if kind == BwKind::Read {
                // One Read fewer outstanding than the responder's IRD allows: Linux siw as
                // responder (in the TCG guest) once left a Read Request unanswered, with no
                // Terminate, until the user timeout, while `ib_read_bw -R -D 5` kept every
                // IRD slot in use for seconds; with one slot spare four runs in a row passed.
                // Why siw stalled is not known (its IRD overflow path sends a Terminate).
                let ord = u64::from(self.data.qp.agreed().ord()).max(2);
                self.run.tx_depth.min(ring_slots).min(ord - 1)
            } else {
                self.run.tx_depth
            };
            let window = self.run.rx_depth;
            // Post and completion times, for the peak: only when it is computed (at most
            // 20,000 messages, as perftest's; `fastest`).
            let keep_times = self.run.duration.is_none() && !infinite && n <= 20_000;
            let expected = if keep_times { n as usize } else { 1 };
            let mut t_post: Vec<Instant> = Vec::with_capacity(expected);
            let mut t_done: Vec<Instant> = Vec::with_capacity(expected);
            let (mut posted, mut done) = (0u64, 0u64);
            let mut progress = Instant::now();
            loop {
                let time_up = timed.is_some_and(|w| w.time_up(Instant::now()))
                    || (infinite && crate::interrupt::requested());
                if done >= n || (time_up && done == posted) {
                    break;
                }
                let mut blocked = false;
                while posted < n && !time_up && outstanding[(posted % qps) as usize] < depth {
                    if let Some(c) = &credit {
                        // perftest: stop while scnt + 1 - credit >= rx_depth (u32 arithmetic).
                        let credited = read_credit(c);
                        if u64::from((posted as u32 + 1).wrapping_sub(credited)) >= window {
                            blocked = true;
                            break;
                        }
                    }
                    let q = (posted % qps) as usize;
                    // -l: list element j always goes to slot j (perftest's fixed lists).
                    let off = match self.run.post_list {
                        // perftest's --run_infinitely never moves on from the first slot.
                        _ if infinite => 0,
                        1 => g.slot_offset(posted / qps),
                        l => g.slot_offset(posted % l),
                    };
                    let (op, local) = match kind {
                        BwKind::Write => (
                            SendOp::Write {
                                remote_stag: Stag(peers[q].rkey),
                                remote_to: peers[q].vaddr + off,
                            },
                            src.sge(off as usize, size as u32),
                        ),
                        BwKind::Read => {
                            let l = landing.as_ref().ok_or_else(|| {
                                PerftestError::Setup("read-bw without read buffers".into())
                            })?;
                            let at = (posted % ring_slots) * size;
                            fill(l, POISON_SEED, at, 0, size);
                            (
                                SendOp::Read {
                                    remote_stag: Stag(peer.rkey),
                                    remote_to: peer.vaddr + off,
                                },
                                l.sge(at as usize, size as u32),
                            )
                        }
                        BwKind::Send => (
                            SendOp::Send {
                                solicited: false,
                                invalidate: None,
                            },
                            src.sge(off as usize, size as u32),
                        ),
                    };
                    let wr = SendWr {
                        wr_id: K_DATA | posted,
                        op,
                        sg_list: local.into(),
                        signaled: true,
                        fence: false,
                    };
                    if self.run.post_list > 1 {
                        // -l: one list per window's worth (inline requests in it, with -I),
                        // posted when full or at the end.
                        pending.push(crate::inline::request(wr, &src, self.run.inline_size));
                        let last = posted + 1 >= n
                            || outstanding[q] + 1 >= depth
                            || pending.len() as u64 >= self.run.post_list;
                        if last {
                            self.data
                                .qp
                                .post_send_list(pending.drain(..))
                                .map_err(|e| PerftestError::datapath(step, e.source))?;
                        }
                    } else {
                        self.qp_at(q)
                            .post_from(step, wr, &src, self.run.inline_size)?;
                    }
                    if keep_times || t_post.is_empty() {
                        t_post.push(Instant::now());
                    }
                    posted += 1;
                    outstanding[q] += 1;
                    progress = Instant::now();
                }
                if !pending.is_empty() {
                    // The window or the run ended before the list was full.
                    self.data
                        .qp
                        .post_send_list(pending.drain(..))
                        .map_err(|e| PerftestError::datapath(step, e.source))?;
                }
                let wait = if blocked {
                    Duration::from_micros(200)
                } else {
                    Duration::from_millis(20)
                };
                match self.data.wait_for(step, wait)? {
                    Some(c) if c.wc.wr_id & KIND == K_DATA => {
                        let i = c.wc.wr_id & !KIND;
                        let now = Instant::now();
                        if keep_times {
                            t_done.push(now);
                        }
                        if infinite && now.duration_since(row_start.0) >= every {
                            // --run_infinitely: a row per interval, no peak (perftest's).
                            let secs = now.duration_since(row_start.0).as_secs_f64();
                            let r = BwReport {
                                bw_peak: 0.0,
                                ..bw_report(size, done - row_start.1, secs, None, self.run.gbits)
                            };
                            println!("{}", report::bw_row(&r, self.run.gbits));
                            row_start = (now, done);
                        }
                        if let Some(w) = &mut timed {
                            w.completed(now, 1);
                        }
                        if let Some(l) = &landing {
                            let at = (i % ring_slots) * size;
                            let off = g.slot_offset(i);
                            if u64::from(c.wc.byte_len) != size {
                                return Err(PerftestError::mismatch(
                                    step,
                                    format!("Read {i} returned {} octets", c.wc.byte_len),
                                ));
                            }
                            l.read(at as usize, &mut got);
                            if let Some(j) = pattern::first_mismatch(PATTERN_SEED, off, &got) {
                                return Err(PerftestError::mismatch(
                                    step,
                                    format!(
                                        "Read {i} (server offset {off}) differs from what we \
                                         wrote there at octet {j}"
                                    ),
                                ));
                            }
                            if let Some(m) = &mirror {
                                m.write(off as usize, &got);
                            }
                            checked += size;
                        }
                        done += 1;
                        let q = (i % qps) as usize;
                        outstanding[q] = outstanding[q].saturating_sub(1);
                        progress = now;
                    }
                    Some(_) => {}
                    None => {
                        if progress.elapsed() > self.run.step {
                            let credit_note = credit
                                .as_ref()
                                .map(|c| format!(", credit {}", read_credit(c)))
                                .unwrap_or_default();
                            return Err(PerftestError::Timeout {
                                step: step.to_string(),
                                after: self.run.step,
                                state: format!(
                                    "{posted} posted, {done} completed{credit_note}; {}",
                                    qp_state(&self.data.qp)
                                ),
                            });
                        }
                        self.data.check_alive(step)?;
                    }
                }
            }
            let rep = match timed {
                // No peak in duration mode (perftest's noPeak): 0.
                Some(w) => BwReport {
                    bw_peak: 0.0,
                    ..bw_report(size, w.counted(), w.seconds(), None, self.run.gbits)
                },
                None => {
                    let secs = t_post
                        .first()
                        .map_or(0.0, |t| progress.duration_since(*t).as_secs_f64());
                    let r = bw_report(size, done, secs, fastest(&t_post, &t_done), self.run.gbits);
                    // perftest prints no peak above 20,000 messages, nor with -N.
                    if keep_times && !self.run.no_peak {
                        r
                    } else {
                        BwReport { bw_peak: 0.0, ..r }
                    }
                }
            };
            reps.push(rep);
            total_posted += posted;
        }
        let rep = reps.last().copied().unwrap_or_default();
        let n = total_posted;
        let test = kind_name(kind);
        if self.run.run_infinitely {
            // perftest's client ends on the signal without its report or closing exchange.
            return Ok(Outcome {
                table: Vec::new(),
                verified: format!(
                    "{} client: ran until interrupted, {total_posted} messages of {size} octets \
                     ({checked} octets checked); no report, as perftest's --run_infinitely",
                    kind_name(kind)
                ),
                json: json!({ "role": "client", "test": kind_name(kind),
                              "messages": total_posted, "octets_verified": checked,
                              "peer_version": self.peer_version }),
            });
        }
        let mut row = rep;
        if kind != BwKind::Send {
            if !duplex {
                self.comm
                    .handshake(&format!("handshake after our {step}"), &mine)?;
            }
            let theirs = self.reports(&rep)?;
            if let Some((mr, _)) = &target {
                // -b: the peer's Writes into our buffer, checked as a server checks them; the
                // row sums both directions (perftest's print_full_bw_report with -b).
                let written = self.run.iters.min(self.geo.slots());
                self.check_target(mr, 1, written, written)?;
                checked += written * self.geo.size;
                row.bw_peak += theirs.bw_peak;
                row.bw_avg += theirs.bw_avg;
                row.msg_rate += theirs.msg_rate;
            }
        }
        self.comm.handshake("closing handshake", &mine)?;
        let verified = match kind {
            BwKind::Read => format!(
                "read-bw client: {n} Reads of {size} octets, each equal to the pattern we \
                 RDMA-Wrote over the server's buffer first ({checked} octets checked)"
            ),
            BwKind::Write if duplex => format!(
                "write-bw {}: -b, {n} Writes of {size} octets each way; the peer's checked \
                 in our buffer (each written slot changed, guards and gaps untouched); the \
                 row sums both directions",
                if self.server { "server" } else { "client" }
            ),
            BwKind::Write => format!(
                "write-bw client: {n} Writes of {} octets completed (perftest's buffer \
                 grants no remote read, so the data cannot be read back)",
                if self.run.all_sizes {
                    "2 to 8388608".to_string()
                } else {
                    size.to_string()
                }
            ),
            BwKind::Send => format!(
                "send-bw client: {n} Sends of {size} octets completed within the server's \
                 credits (window {}; perftest does not check Send data)",
                self.run.rx_depth
            ),
        };
        Ok(Outcome {
            table: if duplex {
                vec![report::bw_row(&row, self.run.gbits)]
            } else {
                reps.iter()
                    .map(|r| report::bw_row(r, self.run.gbits))
                    .collect()
            },
            verified,
            json: json!({ "role": "client", "test": test, "result": bw_json(&rep, self.run.gbits),
                          "results": reps.iter().map(|r| bw_json(r, self.run.gbits)).collect::<Vec<_>>(),
                          "octets_verified": checked, "peer_version": self.peer_version }),
        })
    }

    fn client_write_lat(&mut self) -> Result<Outcome, PerftestError> {
        let b = self.geo.buff_size();
        let mr = self.register(
            2 * b,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            "registering the ping-pong buffer",
        )?;
        let mine = self.dest(&mr, b);
        let peer = self.dests(4, &mine)?;
        let runs = self.write_lat_sizes(&mr, peer, false)?;
        self.lat_outcomes(runs, "write-lat client", "every Write from the server")
    }

    fn client_read_lat(&mut self) -> Result<Outcome, PerftestError> {
        let size = self.geo.size;
        let src = self.register(size, Access::LOCAL_WRITE, "registering the pattern")?;
        fill(&src, PATTERN_SEED, 0, 0, size);
        let landing = self.register(size, Access::LOCAL_WRITE, "registering the read buffer")?;
        // Advertised: a buffer laid out as perftest's client's, whose first octets end up
        // holding what the Reads returned (as perftest's do).
        let b = self.geo.buff_size();
        let mirror = self.register(
            2 * b,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            "registering the advertised buffer",
        )?;
        let mine = self.dest(&mirror, b);
        let peer = self.dests(4, &mine)?;
        let step = "writing our pattern over the server's buffer";
        self.write_over(step, &src, peer.rkey, peer.vaddr, size)?;
        let step = "RDMA Reads";
        let mut samples = Vec::with_capacity(self.run.iters as usize);
        for i in 0..self.run.iters {
            fill(&landing, POISON_SEED, 0, 0, size);
            let t0 = Instant::now();
            self.data.post(
                step,
                SendWr {
                    wr_id: K_DATA | i,
                    op: SendOp::Read {
                        remote_stag: Stag(peer.rkey),
                        remote_to: peer.vaddr,
                    },
                    sg_list: landing.sge(0, size as u32).into(),
                    signaled: true,
                    fence: false,
                },
            )?;
            let c = self.data.wait_id(step, K_DATA | i)?;
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
            if u64::from(c.wc.byte_len) != size {
                return Err(PerftestError::mismatch(
                    step,
                    format!("Read {i} returned {} octets", c.wc.byte_len),
                ));
            }
            if let Some(j) = mismatch(&landing, PATTERN_SEED, 0, 0, size) {
                return Err(PerftestError::mismatch(
                    step,
                    format!("Read {i} differs from what we wrote at octet {j}"),
                ));
            }
        }
        let mut got = vec![0u8; size as usize];
        landing.read(0, &mut got);
        mirror.write(0, &got);
        self.comm.handshake("closing handshake", &mine)?;
        self.lat_outcome(
            samples,
            "read-lat client",
            "every Read (against the pattern we RDMA-Wrote over the server's buffer)",
        )
    }

    fn client_send_lat(&mut self) -> Result<Outcome, PerftestError> {
        let size = self.geo.size;
        let src = self.register(size, Access::LOCAL_WRITE, "registering the send buffer")?;
        fill(&src, PATTERN_SEED, 0, 0, size);
        let ring = self.register(2 * size, Access::LOCAL_WRITE, "registering receive buffers")?;
        let mine = self.dest(&src, 0);
        self.dests(3, &mine)?;
        for slot in 0..2 {
            self.data
                .post_recv("posting receives", recv_wr(&ring, slot, size))?;
        }
        self.comm
            .handshake("handshake before the test (receives posted)", &mine)?;
        let samples = self.send_lat_loop(&src, &ring, false)?;
        self.comm.handshake("closing handshake", &mine)?;
        self.lat_outcome(samples, "send-lat client", "every Send from the server")
    }

    // ---- latency loops shared by both roles ----

    /// write-lat's ping-pong for each size (`-a`: every power of two from 2 to 8 MiB, no
    /// exchange between sizes, as perftest's write_lat): the samples of each.
    fn write_lat_sizes(
        &mut self,
        mr: &MemoryRegion,
        peer: Dest,
        server: bool,
    ) -> Result<Vec<(u64, Vec<f64>)>, PerftestError> {
        let mut out = Vec::new();
        for size in self.sizes() {
            out.push((size, self.write_lat_loop(mr, peer, server, size)?));
        }
        Ok(out)
    }

    /// The message sizes of the run: `-s`, or with `-a` 2 to 8 MiB.
    fn sizes(&self) -> Vec<u64> {
        if self.run.all_sizes {
            crate::all_sizes()
        } else {
            vec![self.geo.size]
        }
    }

    /// write-lat at one size: the server Writes first; each side Writes its buffer (all zero, as
    /// perftest's, with the iteration number in the last octet) to the peer, and waits for the
    /// peer's number in the last octet of its own landing area (`mr[b..]`). Returns half round
    /// trips (µs).
    fn write_lat_loop(
        &mut self,
        mr: &MemoryRegion,
        peer: Dest,
        server: bool,
        size: u64,
    ) -> Result<Vec<f64>, PerftestError> {
        let b = self.geo.buff_size();
        mr.write(0, &vec![0u8; size as usize]);
        let n = self.run.iters;
        let mut samples = Vec::with_capacity(n as usize);
        let mut t_sent: Option<Instant> = None;
        for i in 1..=n {
            let stamp = i as u8;
            let step = format!("write-lat iteration {i}: waiting for the peer's Write");
            if !server {
                self.await_write(&step, mr, b, size, stamp)?;
                if let Some(t) = t_sent {
                    samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
            }
            mr.write((size - 1) as usize, &[stamp]);
            let t = Instant::now();
            let wstep = format!("write-lat iteration {i}: our Write");
            self.data.post_from(
                &wstep,
                SendWr {
                    wr_id: K_DATA | i,
                    op: SendOp::Write {
                        remote_stag: Stag(peer.rkey),
                        remote_to: peer.vaddr,
                    },
                    sg_list: mr.sge(0, size as u32).into(),
                    signaled: true,
                    fence: false,
                },
                mr,
                self.run.inline_size,
            )?;
            self.data.wait_id(&wstep, K_DATA | i)?;
            t_sent = Some(t);
            if server {
                self.await_write(&step, mr, b, size, stamp)?;
                samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        }
        Ok(samples)
    }

    /// Waits for the peer's Write with `stamp` in the last octet of `mr[b..b + size]`, then
    /// checks the rest is perftest's zeroed buffer (allowing a moment for octets placed after
    /// the last one by out-of-order placement). With `-a`, perftest's buffer still holds the
    /// last stamp of each smaller size at that size's last octet (`-n`, as one octet).
    fn await_write(
        &self,
        step: &str,
        mr: &MemoryRegion,
        b: u64,
        size: u64,
        stamp: u8,
    ) -> Result<(), PerftestError> {
        self.wait_octet(step, mr, b + size - 1, stamp)?;
        let mut body = vec![0u8; (size - 1) as usize];
        let stale = self.run.iters as u8;
        let allowed = |i: usize, x: u8| {
            x == 0 || (self.run.all_sizes && x == stale && (i + 1).is_power_of_two() && i > 0)
        };
        let start = Instant::now();
        loop {
            mr.read(b as usize, &mut body);
            match body.iter().enumerate().position(|(i, &x)| !allowed(i, x)) {
                None => return Ok(()),
                Some(i) if start.elapsed() > Duration::from_millis(200) => {
                    return Err(PerftestError::mismatch(
                        step,
                        format!(
                            "octet {i} of the Write carrying {stamp} is {:#04x}; perftest's \
                             write-lat buffer is all zero but the last octet",
                            body[i]
                        ),
                    ))
                }
                Some(_) => std::thread::sleep(Duration::from_micros(50)),
            }
        }
    }

    /// send-lat: the client Sends first; each side answers each received Send with one of its
    /// own. Every received message must have `size` octets and equal the first one.
    fn send_lat_loop(
        &mut self,
        src: &MemoryRegion,
        ring: &MemoryRegion,
        server: bool,
    ) -> Result<Vec<f64>, PerftestError> {
        let size = self.geo.size;
        let n = self.run.iters;
        let mut samples = Vec::with_capacity(n as usize);
        let mut first: Option<Vec<u8>> = None;
        let mut msg = vec![0u8; size as usize];
        let mut t_sent: Option<Instant> = None;
        for i in 1..=n {
            if !server {
                let t = Instant::now();
                self.send_one(i, src, size)?;
                t_sent = Some(t);
            }
            let step = format!("send-lat iteration {i}: waiting for the peer's Send");
            let c = loop {
                let c = self.data.next(&step)?;
                if c.wc.opcode == WcOpcode::Recv {
                    break c;
                }
            };
            if let Some(t) = t_sent {
                samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
            if u64::from(c.wc.byte_len) != size {
                return Err(PerftestError::mismatch(
                    &step,
                    format!("message has {} octets, want {size}", c.wc.byte_len),
                ));
            }
            let slot = c.wc.wr_id & !KIND;
            ring.read((slot * size) as usize, &mut msg);
            match &first {
                None => first = Some(msg.clone()),
                Some(f) if *f != msg => {
                    let j = f.iter().zip(&msg).position(|(a, b)| a != b).unwrap_or(0);
                    return Err(PerftestError::mismatch(
                        &step,
                        format!(
                            "message {i} differs from message 1 at octet {j} (perftest sends \
                             the same unchanging buffer every time)"
                        ),
                    ));
                }
                Some(_) => {}
            }
            self.data.post_recv(&step, recv_wr(ring, slot, size))?;
            if server {
                let t = Instant::now();
                self.send_one(i, src, size)?;
                t_sent = Some(t);
            }
        }
        Ok(samples)
    }

    fn send_one(&mut self, i: u64, src: &MemoryRegion, size: u64) -> Result<(), PerftestError> {
        self.data.post_from(
            &format!("send-lat iteration {i}: our Send"),
            SendWr {
                wr_id: K_DATA | i,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sg_list: src.sge(0, size as u32).into(),
                signaled: true,
                fence: false,
            },
            src,
            self.run.inline_size,
        )
    }

    fn lat_outcome(
        &self,
        samples: Vec<f64>,
        who: &str,
        what: &str,
    ) -> Result<Outcome, PerftestError> {
        self.lat_outcomes(vec![(self.geo.size, samples)], who, what)
    }

    /// The rows of a latency run, one per size (perftest's `-U` and `-H` samples before each).
    fn lat_outcomes(
        &self,
        runs: Vec<(u64, Vec<f64>)>,
        who: &str,
        what: &str,
    ) -> Result<Outcome, PerftestError> {
        let mut table = Vec::new();
        let mut results = Vec::new();
        for (size, mut samples) in runs {
            // perftest's -U / -H: the samples before the row, then the column line again.
            let before = table.len();
            if self.run.report_unsorted {
                table.extend(
                    stats::lat_samples_report(&samples, false)
                        .lines()
                        .map(String::from),
                );
            }
            if self.run.report_histogram {
                table.extend(
                    stats::lat_samples_report(&samples, true)
                        .lines()
                        .map(String::from),
                );
            }
            if table.len() > before {
                table.push(report::RESULT_LINE.into());
                table.push(report::LAT_HEADER.into());
            }
            let mut r = LatencyResult::from_samples(size, &mut samples);
            // perftest's row gives `-n`, whichever side and however many samples it timed
            // (a client times the round trips between its Writes: one fewer).
            r.iterations = self.run.iters;
            table.push(report::lat_row(&r));
            results.push(r);
        }
        let content = match self.run.test {
            TestKind::WriteLat => "perftest's zeroed buffer with the iteration number last",
            TestKind::SendLat => "right length, equal to the first",
            _ => "equal to our pattern",
        };
        Ok(Outcome {
            table,
            verified: format!(
                "{who}: {} iterations{}, {what} checked ({content}); latency = half a round trip",
                self.run.iters,
                if results.len() > 1 {
                    " of each size"
                } else {
                    ""
                }
            ),
            json: json!({ "role": if self.server { "server" } else { "client" },
                          "test": self.run.test.name(), "result": results.last(),
                          "results": results, "peer_version": self.peer_version }),
        })
    }
}

/// The data connections' completion queue, with `-e` on a completion channel.
fn data_cq(
    run: &Run,
) -> Result<(CompletionQueue, Option<datapath::CompletionChannel>), PerftestError> {
    // As perftest sizes its queue: every queue pair's work requests, both ways.
    let cqe = (run.qps * (run.tx_depth + run.rx_depth))
        .clamp(datapath::DEFAULT_CQE as u64, datapath::MAX_CQE as u64) as usize;
    let ch = if run.use_event {
        Some(
            datapath::CompletionChannel::new()
                .map_err(|e| PerftestError::datapath("a completion channel", e))?,
        )
    } else {
        None
    };
    let cq = CompletionQueue::create(cqe, ch.as_ref(), 0)
        .map_err(|e| PerftestError::datapath("a completion queue", e))?;
    Ok((cq, ch))
}

fn kind_name(kind: BwKind) -> &'static str {
    match kind {
        BwKind::Write => "write-bw",
        BwKind::Read => "read-bw",
        BwKind::Send => "send-bw",
    }
}

/// What is wrong with write-bw's target buffer.
enum Unwritten {
    /// This slot (of this window) still holds our filling.
    Slot(u64, u64),
    /// This octet (from the buffer's start, guard included) changed outside the written slots.
    Outside(usize),
}

/// write-bw's target buffer (`GUARD` octets, `windows` windows of `BUFF_SIZE` octets, `GUARD`
/// octets) after the peer's Writes: in each window the first `written` slots changed, the
/// slots up to `may` (duration mode: the report counts fewer than were sent) changed or not,
/// every other octet as filled (`expect`).
fn check_written(
    got: &[u8],
    expect: &[u8],
    windows: u64,
    written: u64,
    may: u64,
    g: Geometry,
) -> Result<(), Unwritten> {
    let mut at = 0usize;
    for w in 0..windows {
        let base = GUARD + w * g.buff_size();
        for k in 0..may.max(written) {
            let a = (base + k * g.inc()) as usize;
            let b = a + g.size as usize;
            if let Some(i) = (at..a).find(|&i| got[i] != expect[i]) {
                return Err(Unwritten::Outside(i));
            }
            if k < written && got[a..b] == expect[a..b] {
                return Err(Unwritten::Slot(w, k));
            }
            at = b;
        }
    }
    match (at..got.len()).find(|&i| got[i] != expect[i]) {
        Some(i) => Err(Unwritten::Outside(i)),
        None => Ok(()),
    }
}

fn untouched_changed(step: &str, i: usize, guard: u64) -> PerftestError {
    let i = i as u64;
    let place = if i < guard {
        format!("{} octets before the advertised buffer", guard - i)
    } else {
        format!("offset {} of the advertised buffer", i - guard)
    };
    PerftestError::mismatch(
        step,
        format!("an octet the client should not have written changed ({place})"),
    )
}

fn recv_wr(ring: &MemoryRegion, slot: u64, size: u64) -> RecvWr {
    RecvWr {
        wr_id: K_RECV | slot,
        sg_list: ring.sge((slot * size) as usize, size as u32).into(),
    }
}

/// The credit word the server RDMA-Writes (a little-endian u32), read until two reads agree
/// (the Write may land while we read).
fn read_credit(mr: &MemoryRegion) -> u32 {
    let mut a = [0u8; 4];
    let mut b = [0u8; 4];
    loop {
        mr.read(0, &mut a);
        mr.read(0, &mut b);
        if a == b {
            return u32::from_le_bytes(a);
        }
    }
}

/// perftest's peak (`print_report_bw`): the shortest time per message over any run of
/// consecutive messages, from the post of the first to the completion of the last. Quadratic,
/// so skipped (like perftest's peak above 20000 iterations) for longer runs.
fn fastest(posted: &[Instant], done: &[Instant]) -> Option<Duration> {
    let n = posted.len().min(done.len());
    if n == 0 || n > 20_000 {
        return None;
    }
    let mut best: Option<Duration> = None;
    for (i, p) in posted[..n].iter().enumerate() {
        for (k, d) in done[i..n].iter().enumerate() {
            let per = d.saturating_duration_since(*p) / (k + 1) as u32;
            best = Some(best.map_or(per, |b| b.min(per)));
        }
    }
    best
}

/// perftest's report: average over the whole run, peak from [`fastest`] (the average when
/// there is none; callers that follow perftest's "no peak" cases set it to 0). Bandwidth in
/// MB/s (2^20 octets), or with `gbits` in Gb/s (10^9 bits), as perftest's `--report_gbits`
/// switches it.
fn bw_report(size: u64, iters: u64, secs: f64, fastest: Option<Duration>, gbits: bool) -> BwReport {
    let s = secs.max(1e-9);
    let unit = if gbits { 125_000_000.0 } else { MB };
    let avg = (size * iters) as f64 / s / unit;
    BwReport {
        size,
        iters,
        bw_peak: fastest.map_or(avg, |d| size as f64 / d.as_secs_f64().max(1e-9) / unit),
        bw_avg: avg,
        msg_rate: iters as f64 / s / 1e6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Run, String> {
        let cli = PerftestCli::try_parse_from(args).map_err(|e| e.to_string())?;
        Run::from_cli(&cli)
    }

    /// The server takes its data connection from the client's address only (helper-191's
    /// finding 6: any address could take that place): a stranger's request (from 127.0.0.2)
    /// is rejected, and the client's, arriving after it, is taken. Loopback, socket transport.
    #[test]
    fn the_data_connection_is_taken_from_the_client_only() {
        use datapath::{CompletionQueue, ConnectParams, Listener, ProtectionDomain};
        let run = parse(&["perftest", "write-bw"]).expect("run");
        let listener = Listener::bind(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            ConnectParams::default(),
        )
        .expect("bind");
        let at = listener.local_addr().expect("address");
        let connect_from = |ip: [u8; 4]| {
            std::thread::spawn(move || {
                let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
                let params = ConnectParams {
                    local_addr: Some(SocketAddr::from((ip, 0))),
                    ..ConnectParams::default()
                };
                datapath::connect(at, &pd, &cq, &params, &[]).map(|c| c.qp.local_addr())
            })
        };
        let client = "127.0.0.1".parse().expect("address");
        let server = std::thread::spawn(move || {
            accept_from(&run, &listener, client, Duration::from_secs(20), "data")
        });
        let stranger = connect_from([127, 0, 0, 2]).join().expect("stranger");
        assert!(stranger.is_err(), "the stranger was let in: {stranger:?}");
        let ours = connect_from([127, 0, 0, 1]);
        let req = server
            .join()
            .expect("server")
            .expect("the client's request");
        assert_eq!(req.peer_addr().ip(), client);
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let conn = req.accept(&pd, &cq, &[]).expect("accept");
        let local = ours.join().expect("client").expect("the client connected");
        assert_eq!(conn.qp.peer_addr(), local);
    }

    #[test]
    fn defaults_follow_perftest() {
        let r = parse(&["perftest", "write-bw"]).unwrap();
        assert_eq!((r.size, r.iters, r.tx_depth), (65536, 5000, 128));
        let r = parse(&["perftest", "write-lat", "-R"]).unwrap();
        assert_eq!((r.size, r.iters, r.tx_depth), (2, 1000, 1));
        // rx depth: at most -n, made even (perftest's odd-rx_depth workaround).
        let r = parse(&["perftest", "send-bw", "-n", "25", "10.0.0.1"]).unwrap();
        assert_eq!((r.tx_depth, r.rx_depth), (25, 26));
        let r = parse(&["perftest", "send-lat", "-s", "64"]).unwrap();
        assert_eq!((r.size, r.rx_depth), (64, 512));
        // -s as perftest reads it: K and M suffixes, hex.
        assert_eq!(
            parse(&["perftest", "write-bw", "-s", "64K"]).unwrap().size,
            65536
        );
        assert_eq!(
            parse(&["perftest", "write-bw", "-s", "8M"]).unwrap().size,
            8 << 20
        );
        assert_eq!(
            parse(&["perftest", "read-lat", "-s", "0x40"]).unwrap().size,
            64
        );
        assert!(parse(&["perftest", "read-bw", "-n", "4"]).is_err());
        assert!(parse(&["perftest", "read-bw", "-s", "0"]).is_err());
        assert!(parse(&["perftest", "read-bw", "-s", "8388609"]).is_err());
        assert!(parse(&["perftest", "read-bw", "--transport", "xdp"]).is_err());
        // -N: bandwidth tests only, as perftest's.
        assert!(parse(&["perftest", "write-bw", "-N"]).is_ok_and(|r| r.no_peak));
        assert!(parse(&["perftest", "write-lat", "-N"]).is_err());
    }

    #[test]
    fn bandwidth_report_units() {
        let r = bw_report(65536, 100, 1.0, Some(Duration::from_millis(1)), false);
        assert!((r.bw_avg - 6.25).abs() < 1e-9);
        assert!((r.bw_peak - 62.5).abs() < 1e-9);
        assert!((r.msg_rate - 1e-4).abs() < 1e-12);
    }
}
