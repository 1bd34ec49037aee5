//! `iwarp-bench`'s command line shared by its subcommands: the main test's options ([`Cli`]),
//! the value types every subcommand parses ([`TestKind`], [`Transport`], [`OnOff`], ...), the
//! perftest options accepted for compatibility, and [`parse_args`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::inline;
use crate::proto::{self, TestKind};

/// perftest options that mean nothing for iWARP over TCP, accepted so that a perftest command
/// line runs unchanged; [`PerftestCompat::notes`] says which were ignored.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PerftestCompat {
    /// perftest's `-F` (do not fail when the cpufreq governor may skew cycle counts):
    /// accepted; the results here come from the monotonic clock, not cycle counters.
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// perftest's `--report_gbits`: the bandwidth rows in Gb/s (10^9 bits) instead of MB/s
    /// (2^20 octets), as perftest's.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// perftest's `-m/--mtu` (the InfiniBand path MTU): ignored; iWARP runs over TCP and the
    /// interface's MTU applies.
    #[arg(short = 'm', long = "mtu", value_name = "MTU")]
    pub mtu: Option<u32>,
    /// perftest's `-x/--gid-index`: ignored; iWARP addresses peers by IP.
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX")]
    pub gid_index: Option<u32>,
    /// perftest's `-d/--ib-dev`: ignored; `--transport` (and `--iface`) choose the device.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEVICE")]
    pub ib_dev: Option<String>,
    /// perftest's `-i/--ib-port`: ignored.
    #[arg(short = 'i', long = "ib-port", value_name = "PORT")]
    pub ib_port: Option<u32>,
    /// perftest's `-I/--inline_size`: Sends and RDMA Writes of at most N octets (at most
    /// 236) are posted inline, their payload copied into the work request when posted
    /// (`post_send_inline`, verbs' `IBV_SEND_INLINE`). Local to each side: give it to both
    /// ends where both send. Not for Read or Atomic tests (but `-I 0`, which perftest
    /// accepts there).
    #[arg(short = 'I', long = "inline_size", value_name = "N")]
    pub inline_size: Option<u32>,
    /// Wait for completions on a completion channel (`req_notify` on the queue, then the
    /// channel's descriptor: `ibv_req_notify_cq` + `ibv_get_cq_event`) instead of the queue's
    /// blocking wait (perftest's `-e`). In send-lat, read-lat and atomic-lat every wait of the
    /// measured loop is on the channel too, as perftest's; write-lat refuses it (its pong is
    /// seen in memory, not on a completion queue; perftest refuses `-e` for Write tests).
    #[arg(short = 'e', long = "use_event", visible_alias = "events")]
    pub use_event: bool,
    /// Latency tests: print every sample in microseconds, in the order taken, before the
    /// result line (perftest's `-U`).
    #[arg(short = 'U', long = "report-unsorted")]
    pub report_unsorted: bool,
    /// Latency tests: print the samples sorted, the two largest left out, before the result
    /// line (perftest's `-H`; a cumulative distribution to plot).
    #[arg(short = 'H', long = "report-histogram", alias = "report-histogrm")]
    pub report_histogram: bool,
    /// perftest's `--tos` (rdma_cm's `RDMA_OPTION_ID_TOS`): the IP Type of Service octet of
    /// this side's TCP segments, the DSCP in its upper six bits (`ConnectParams::tos`; the
    /// server's applies to its SYN-ACKs too). Default 0.
    #[arg(short = 'T', long = "tos", value_name = "TOS")]
    pub tos: Option<u8>,
    /// perftest's `-N/--noPeak`: the peak bandwidth column 0.00, as perftest's with `-N`
    /// (no post and completion times are taken for it then). Bandwidth tests only: refused
    /// for latency tests, as perftest refuses it ("NoPeak only valid for BW tests").
    #[arg(short = 'N', long = "noPeak")]
    pub no_peak: bool,
    /// perftest's `-c/--connection`: only RC, iWARP's one connection type.
    #[arg(short = 'c', long = "connection", value_name = "TYPE", value_parser = ["RC"])]
    pub connection: Option<String>,
}

impl PerftestCompat {
    /// One line per perftest option given that changes nothing here.
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut ignored = |flag: &str, why: &str| out.push(format!("{flag} ignored: {why}"));
        if let Some(m) = self.mtu {
            ignored(
                &format!("-m {m}"),
                "iWARP runs over TCP; the interface's MTU applies",
            );
        }
        if let Some(x) = self.gid_index {
            ignored(&format!("-x {x}"), "iWARP addresses peers by IP");
        }
        if let Some(d) = &self.ib_dev {
            ignored(
                &format!("-d {d}"),
                "--transport and --iface choose the device",
            );
        }
        if let Some(i) = self.ib_port {
            ignored(&format!("-i {i}"), "there are no HCA ports here");
        }
        out
    }
}

/// perftest's `--output`: one number instead of the header block and the table.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// Bandwidth tests: the average bandwidth, in MB/s (2^20 octets) or Gb/s with
    /// `--report_gbits`.
    Bandwidth,
    /// Bandwidth tests: the message rate in Mpps.
    #[value(name = "message_rate")]
    MessageRate,
    /// Latency tests: the average latency in microseconds.
    Latency,
}

/// More of perftest's options, which the main tool takes beside [`PerftestCompat`] (that one
/// the perftest peer mode shares): each either works as described or is noted on stderr by
/// [`Cli::notes`] as what it does here.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PerftestMore {
    /// perftest's `--output`: print one number per result line instead of the header block
    /// and the table (`printf("%lf\n")`, as perftest's `print_full_bw_report` and
    /// `print_report_lat`): `bandwidth` (the average, in MB/s or with `--report_gbits` in
    /// Gb/s) or `message_rate` (Mpps) for bandwidth tests, `latency` (the average in
    /// microseconds) for latency tests. Not with `--json`.
    #[arg(long = "output", value_enum, value_name = "KIND")]
    pub output: Option<OutputKind>,
    /// perftest's `-r/--rx-depth`. send-bw: the receives the server keeps posted, which is
    /// the client's credit window (iWARP has no receiver-not-ready retry; default: as many as
    /// the buffer has message slots, at most 512); at most `-n` in an iteration run, as
    /// perftest's, and at most what the receive queue (4095) and the 64 MiB buffer hold (the
    /// client says so when it posts fewer). The client's choice, which the server follows (a
    /// server given `-r` refuses a client with another). perftest allows only 1 in the RDMA
    /// tests, which is noted; send-lat (one ping in flight) notes it.
    #[arg(short = 'r', long = "rx-depth", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub rx_depth: Option<u32>,
    /// perftest's `-o/--outs` (read and atomic tests): the Reads and Atomic Operations the
    /// client may have outstanding at the server, its ORD in the MPA exchange (RFC 6581; the
    /// header's "Outstand reads" shows the ORD agreed). A server not given `-o` raises its IRD
    /// to the ORD the client asks for; given `-o N`, it offers N, which bounds the client's.
    /// Default 16. Not with `--mpa-rev 1` or `--framing ift`, which negotiate no IRD/ORD.
    #[arg(short = 'o', long = "outs", value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=0x3FFE))]
    pub outs: Option<u16>,
    /// perftest's `-f/--margin`: with `-D`, the whole seconds left out of the measurement at
    /// each end of the run (default: a quarter of `-D`'s whole seconds); `-D` must be more
    /// than twice it. The client's choice (it travels in the hello). Without `-D` it is
    /// noted as ignored.
    #[arg(short = 'f', long = "margin", value_name = "SECONDS")]
    pub margin: Option<u32>,
    /// perftest's `-C/--report-cycles` (latency tests): accepted with a note; the figures
    /// stay in microseconds (there are no cycle counters here: the monotonic clock times
    /// everything). Refused for bandwidth tests, as perftest refuses it.
    #[arg(short = 'C', long = "report-cycles")]
    pub report_cycles: bool,
    /// perftest's `--cpu_util`: noted as ignored (no CPU utilization column here).
    #[arg(long = "cpu_util")]
    pub cpu_util: bool,
    /// perftest's `-u/--qp-timeout` (InfiniBand's ACK timeout): noted as ignored; TCP's
    /// retransmission timers apply.
    #[arg(short = 'u', long = "qp-timeout", value_name = "TIMEOUT")]
    pub qp_timeout: Option<u8>,
    /// perftest's `-S/--sl` (InfiniBand service level): noted as ignored; `--tos` sets the
    /// IP Type of Service.
    #[arg(short = 'S', long = "sl", value_name = "SL")]
    pub sl: Option<u8>,
    /// perftest's `-L/--hop_limit` (the GRH's hop limit): noted as ignored; the IP TTL is
    /// the transport's.
    #[arg(short = 'L', long = "hop_limit", value_name = "HOPS")]
    pub hop_limit: Option<u8>,
    /// perftest's `--ipv6` (IPv6 GIDs): noted as ignored; the server's address (and
    /// `--bind`) choose the IP version.
    #[arg(long = "ipv6")]
    pub ipv6: bool,
    /// perftest's `--use-srq`: noted as ignored; each queue pair here posts its own receives.
    #[arg(long = "use-srq")]
    pub use_srq: bool,
    /// perftest's `--perform_warm_up`: noted as ignored; there is no warm-up round (`-D`'s
    /// margins leave out the start of a timed run).
    #[arg(long = "perform_warm_up")]
    pub perform_warm_up: bool,
    /// perftest's `--dont_xchg_versions`: noted as ignored; iwarp-bench exchanges no perftest
    /// versions (its hello says which build it is).
    #[arg(long = "dont_xchg_versions")]
    pub dont_xchg_versions: bool,
    /// perftest's `-z/--comm_rdma_cm` (exchange the test's parameters over rdma_cm): noted
    /// as ignored; they travel in the MPA private data of the connection's setup.
    #[arg(short = 'z', long = "comm_rdma_cm")]
    pub comm_rdma_cm: bool,
}

/// perftest-shaped tests over the iWARP stack.
#[derive(Parser, Debug, Clone)]
#[command(name = "iwarp-bench", version, about)]
pub struct Cli {
    /// The test to run.
    #[arg(value_enum)]
    pub test: TestKind,
    /// Server address (IP or host name). Without it, run as the server.
    pub server: Option<String>,
    /// Transport: `socket` runs MPA over a kernel TCP socket; `xdp` runs it over our own TCP
    /// on AF_XDP (the poll-mode engine; needs root and `--iface`).
    #[arg(long, value_enum, default_value_t = Transport::Socket)]
    pub transport: Transport,
    /// Interface for `--transport xdp` (its first IPv4 address is ours).
    #[arg(long)]
    pub iface: Option<String>,
    /// `--transport xdp`: write every frame the engine receives and sends to FILE (pcap with
    /// nanosecond timestamps; Wireshark and tshark read it). A bounded ring between the engine
    /// and a writer thread: frames it cannot hold are counted as dropped (reported at the
    /// end), never waited for. tcpdump cannot see these frames.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    /// `--transport xdp`: where the steering XDP program runs (`auto`: the driver's native
    /// XDP, else generic; `driver`; `generic`). The engine's counters say which it got.
    #[arg(long, value_enum)]
    pub xdp_mode: Option<XdpMode>,
    /// `--transport xdp`: pin the engine thread to this CPU (the application thread is left
    /// alone; `taskset` pins a whole process).
    #[arg(long)]
    pub engine_cpu: Option<usize>,
    /// `--transport xdp`: engine threads. `per-queue`: one thread (shard) per AF_XDP queue,
    /// segments arriving on another shard's queue handed over; `one`: one thread serves every
    /// queue. Default: the engine's (`XdpEngineConfig::shard_per_queue`: per queue).
    #[arg(long, value_enum)]
    pub engine_threads: Option<EngineThreads>,
    /// `--transport xdp` with `--engine-threads per-queue`: pin shard `i`'s thread to the
    /// `i % n`-th of these CPUs (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub engine_cpus: Vec<usize>,
    /// `--transport xdp`: inline progress. `on`: a thread polling a completion queue runs the
    /// engine's turns itself while the engine thread parks (one thread per core when the
    /// application busy-polls); `off`: only the engine thread runs turns.
    /// Default: on.
    #[arg(long, value_enum)]
    pub engine_inline: Option<OnOff>,
    /// `--transport xdp`: the engine copies FPDUs through TCP's send buffer (the transmit
    /// path before FPDUs were written from registered memory into the frames), for
    /// comparison.
    #[arg(long)]
    pub engine_tx_copy: bool,
    /// `--transport xdp`: in-order data segments the engine's TCP receives before it ACKs at
    /// once (`tcp_engine::Config::ack_every_segments`; default: the engine's).
    #[arg(long)]
    pub engine_ack_every: Option<u32>,
    /// `--transport xdp`: RX ring size and RX frame pool of each AF_XDP socket (a power of two,
    /// 8 to 1048576; `datapath::xsk::XskConfig::rx_ring`; default: the engine's).
    #[arg(long)]
    pub engine_rx_ring: Option<u32>,
    /// `--transport xdp`: most octets a connection has queued in TCP and not yet acknowledged
    /// before the engine frames more FPDUs (`XdpEngineConfig::tx_ahead`, 16 KiB to 64 MiB;
    /// default: the engine's). With the receiver's window it bounds the data in flight.
    #[arg(long, value_parser = clap::value_parser!(u32).range(16384..=67108864))]
    pub engine_tx_ahead: Option<u32>,
    /// `--transport xdp`: most frames the engine transmits per turn before it reads its
    /// received frames again (`XdpTcpConfig::tx_turn_frames`, rounded up to whole kick batches
    /// of 32; 0: no limit, a turn sends all it may; default: the engine's).
    #[arg(long)]
    pub engine_tx_turn_frames: Option<usize>,
    /// `--transport xdp`: busy-poll the NIC's NAPI context from the engine for this many
    /// microseconds (`SO_BUSY_POLL`, with `SO_PREFER_BUSY_POLL`; `datapath::xsk::BusyPoll`).
    /// For real NICs with deferred interrupts (`napi_defer_hard_irqs`, `gro_flush_timeout`);
    /// veth has nothing to gain from it.
    #[arg(long, value_name = "USECS", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub engine_busy_poll: Option<u32>,
    /// `--transport xdp` with `--engine-busy-poll`: packets one busy poll may process
    /// (`SO_BUSY_POLL_BUDGET`; default 64).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub engine_busy_poll_budget: Option<u16>,
    /// `--transport xdp`, inline progress: how long after the application's last poll, in
    /// microseconds, the parked engine thread takes its turns back (`XdpEngineConfig::park_max`:
    /// its watchdog, which the polls push forward every half of it; at least 1000; default:
    /// the engine's, 4000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub engine_park_max_us: Option<u64>,
    /// `--transport xdp`: mebibytes of memory all the engine's connections may hold out of
    /// order together (`XdpEngineConfig::reassembly_budget`; a connection's store takes 1 MiB
    /// while data waits in it); beyond it, data that arrives out of order is given back to TCP
    /// and the peer sends it again (default: the engine's, 256).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(0..=1_048_576))]
    pub engine_reassembly_budget_mib: Option<u64>,
    /// How this side takes the completions it waits for outside the latency tests' ping-pong
    /// (those poll, or with `-e` wait on the completion channel): `wait` blocks in
    /// `CompletionQueue::wait`; `poll` busy-polls with `try_next`, yielding the CPU after each
    /// empty poll, as perftest does without `-e` (with the engine's inline progress the
    /// polling thread then runs the engine's turns itself).
    #[arg(long, value_enum, default_value_t = CqMode::Wait)]
    pub cq: CqMode,
    /// TCP port the server listens on.
    #[arg(short, long, default_value_t = 18515)]
    pub port: u16,
    /// Address the server binds to.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: String,
    /// Message size in bytes (default, as perftest's: 65536 for bandwidth tests, 2 for latency
    /// tests); as
    /// perftest reads it: decimal, hex (`0x1000`) or octal (`010`), a `K` or `M` suffix
    /// multiplying by 1024 or 1024^2 (`64K`, `1M`).
    #[arg(short, long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Iterations per size (default, as perftest's: 5000 for write-bw, 1000 for the other
    /// tests).
    #[arg(short = 'n', long)]
    pub iters: Option<u64>,
    /// Run every power-of-two size from 2 bytes to 8 MiB.
    #[arg(short = 'a', long, visible_alias = "all")]
    pub all_sizes: bool,
    /// Run each size for this many seconds instead of a fixed number of iterations (no `-n`
    /// with it; with `--run_infinitely`: the interval between result lines). As perftest's,
    /// only what completes in the middle counts: a quarter of the whole seconds, rounded
    /// down, is left out at each end (`stats::SampleWindow`); latency tests then print
    /// perftest's duration row (`#bytes #iterations t_avg[usec] tps average`). A window in
    /// which nothing completes fails the run.
    #[arg(short = 'D', long)]
    pub duration: Option<f64>,
    /// Bandwidth tests: queue pairs (connections) to run at once, each with its own buffers
    /// and `--tx-depth` outstanding work requests; a result line counts all their messages
    /// over the time from the first queue pair's first post to the last one's last
    /// completion (perftest's `-q`). Only the client needs it (the server learns
    /// it from the client; a server given `-q N` above 1 refuses a client with another).
    #[arg(short = 'q', long = "qp", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=proto::MAX_QPS as i64))]
    pub qps: u16,
    /// write-bw: both directions at once (perftest's `-b`): a second connection on which the
    /// server Writes and the client checks, beside the first; a row gives our message count
    /// and both directions' rates added (perftest's duplex row).
    /// Only the client needs it (the server learns it from the client; a server given it
    /// refuses a client without it).
    #[arg(short = 'b', long = "bidirectional")]
    pub bidirectional: bool,
    /// Bandwidth tests: post work requests in lists of N, one call each
    /// (`QueuePair::post_send_list`, `ibv_post_send` with a chain; perftest's `-l`); one in N
    /// signaled unless `--cq-mod` says otherwise.
    #[arg(short = 'l', long = "post_list", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub post_list: u32,
    /// Bandwidth tests: run until interrupted (Ctrl-C/SIGINT or SIGTERM), printing a result
    /// line for each `-D` seconds (default 5); then end the run as a finished one (the server
    /// checks the data), print the totals and exit 0 (perftest's `--run_infinitely`). Only the
    /// client needs it (the server learns it from the client; a server given it refuses a
    /// client without it).
    #[arg(long = "run_infinitely")]
    pub run_infinitely: bool,
    /// Outstanding work requests in bandwidth tests (default, as perftest's: 128 for the
    /// bandwidth tests, 1 for the latency tests, which have one outstanding at a time); at
    /// most `-n` in an iteration run, as perftest's `force_dependecies` makes it.
    #[arg(short = 't', long)]
    pub tx_depth: Option<u32>,
    /// Bandwidth tests: signal one work request in this many, the others posted unsignaled
    /// (`SendWr::signaled` false: no completion unless they fail), as perftest's `--cq-mod`.
    /// The application then wakes once per N messages instead of per message. Default: 100
    /// for write-bw and send-bw at every size (perftest's `DEF_CQ_MOD`, which perftest itself
    /// lowers to 1 for messages over 8 KiB unless `-Q`, `-a` or `-e` is given; signalling
    /// every 64 KiB message was measured to cost us bandwidth, docs/benchmarks-history.md);
    /// 1 for read-bw, whose client checks each message's data when it completes, and a
    /// batch's data has left the cache by then. At most `--tx-depth` (a larger value acts as
    /// `--tx-depth`); 1: every work request signaled. The last one of a run is always
    /// signaled.
    #[arg(short = 'Q', long)]
    pub cq_mod: Option<u32>,
    /// Bandwidth tests: message slots of the registered buffer the work requests cycle
    /// through (1-1024; default 0: one per outstanding work request, up to what the buffer
    /// holds, so a 64 KiB run moves data through 8 MiB on each side). perftest reuses one
    /// buffer per side: `--slots 2` measures the transport with the data hot in cache.
    #[arg(long, default_value_t = 0)]
    pub slots: u32,
    /// MPA revision to request: 1 (RFC 5044) or 2 (RFC 6581 enhanced setup).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub mpa_rev: u8,
    /// CRC32C on FPDUs (RFC 5044 4.4): `off` only takes effect if the peer also asks for off.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub crc: OnOff,
    /// Ask the peer to insert MPA markers towards us (RFC 5044 4.3).
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub markers: OnOff,
    /// How DDP segments are framed on TCP: `mpa` (RFC 5044) or `ift`
    /// (draft-williams-iwarp-ift-01, experimental). Both ends must
    /// say the same. With `ift`, `--crc` sets the header and the payload CRC of our frames,
    /// and the hello and welcome (MPA private data otherwise) go as the connection's first
    /// Sends (the server accepts with the RFC 7306 extensions on, as it cannot read the hello
    /// before). `--markers on` and `--mpa-rev 1`, which only MPA has, are refused with `ift`.
    #[arg(long, value_enum, default_value_t = FramingArg::Mpa)]
    pub framing: FramingArg,
    /// write-bw and write-lat: each Write is followed by RFC 7306 Immediate Data carrying its
    /// iteration number (perftest's `--write_with_imm`), which the receiver's receive completes
    /// with; the RDMAP extensions are on at both ends. The client decides (the server follows
    /// its hello; given the flag too, it checks the client's agrees).
    #[arg(long, visible_alias = "write_with_imm")]
    pub write_with_imm: bool,
    /// send-bw and send-lat: each Send is followed by RFC 7306 Immediate Data carrying its
    /// iteration number (perftest's `--send_with_imm`): two receives per message at the
    /// receiver. As `--write-with-imm` otherwise.
    #[arg(long, visible_alias = "send_with_imm")]
    pub send_with_imm: bool,
    /// atomic-bw and atomic-lat: the operation (perftest's `-A`): FetchAdd of 1, or CmpSwap
    /// of the expected value with the next one; either way the client checks every original
    /// value and the server the counter's final value. Default: fetch-and-add. As perftest,
    /// refused for the other tests.
    #[arg(short = 'A', long, visible_alias = "atomic_type", value_enum)]
    pub atomic_type: Option<AtomicType>,
    /// perftest's `-R/--rdma_cm`: accepted; connections are always set up as rdma_cm sets
    /// them up (TCP, then the MPA exchange). The peer must be `iwarp-bench` too (the test's
    /// parameters travel in the MPA private data); to run against perftest's own
    /// `ib_write_bw -R` and the rest, use `iwarp-bench perftest`.
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    /// Print one JSON object with the results on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// `--transport xdp`: print the engine's counters (totals and rates) on stderr every this
    /// many seconds while the run goes on. `iwarp-bench stats` shows them from another shell
    /// (every run on the engine refreshes them in /run/iwarp-bench once a second).
    #[arg(long, value_name = "SECONDS")]
    pub stats_every: Option<f64>,
    #[command(flatten)]
    pub compat: PerftestCompat,
    #[command(flatten)]
    pub more: PerftestMore,
    /// Seconds to wait for connection setup.
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
}

/// Transport under the stack.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Kernel TCP socket.
    Socket,
    /// Our TCP over AF_XDP (`datapath::engine::XdpEngine`).
    Xdp,
}

impl Transport {
    /// Name as typed on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Socket => "socket",
            Self::Xdp => "xdp",
        }
    }
}

/// How completions are taken (`--cq`).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqMode {
    /// Block in `CompletionQueue::wait`.
    Wait,
    /// Busy-poll `try_next`, yielding after each empty poll.
    Poll,
}

/// How many engine threads (`--engine-threads`).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineThreads {
    /// One thread per AF_XDP queue.
    PerQueue,
    /// One thread for every queue.
    One,
}

/// The Atomic Operation of atomic-bw and atomic-lat (`--atomic-type`).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicType {
    /// FetchAdd (RFC 7306 5.1.1) of 1.
    #[value(alias = "FETCH_AND_ADD")]
    FetchAndAdd,
    /// CmpSwap (RFC 7306 5.1.2) of the value the counter holds with the next one.
    #[value(alias = "CMP_AND_SWAP")]
    CmpAndSwap,
}

/// `--framing`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramingArg {
    /// MPA (RFC 5044).
    Mpa,
    /// IFT (draft-williams-iwarp-ift-01).
    Ift,
}

/// Where the steering XDP program runs (`--xdp-mode`, `--mode`): `auto` asks the driver for
/// native XDP and falls back to generic XDP when the driver has none; `driver` fails
/// instead; `generic` runs it on the kernel's socket buffers (any interface, slower: every
/// frame is an skb first, and AF_XDP then copies it).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    Auto,
    Driver,
    Generic,
}

impl From<XdpMode> for datapath::xsk::steering::AttachMode {
    fn from(m: XdpMode) -> Self {
        match m {
            XdpMode::Auto => Self::Auto,
            XdpMode::Driver => Self::Driver,
            XdpMode::Generic => Self::Generic,
        }
    }
}

/// A boolean option spelled on/off.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    /// True for `on`.
    pub fn on(self) -> bool {
        self == Self::On
    }
}

impl Cli {
    /// `--cq-mod` in force: the test's default if not given, at most `--tx-depth`.
    pub fn cq_mod(&self) -> u32 {
        // atomic-bw reads every original value as its operation completes.
        if self.test.is_atomic() {
            return 1;
        }
        let default = if self.post_list > 1 {
            // perftest: the CQ moderation becomes the size of the post list.
            self.post_list
        } else if self.test == TestKind::ReadBw {
            1
        } else {
            100
        };
        self.cq_mod
            .unwrap_or(default)
            .clamp(1, self.tx_depth().max(1))
    }

    /// The sizes this run covers.
    pub fn sizes(&self) -> Vec<u64> {
        if self.test.is_atomic() {
            return vec![8];
        }
        if self.all_sizes {
            all_sizes()
        } else {
            // perftest's DEF_SIZE_BW and DEF_SIZE_LAT.
            vec![self
                .size
                .unwrap_or(if self.test.is_bw() { 65536 } else { 2 })]
        }
    }
    /// Iterations per size: `-n`, or perftest's default (`DEF_ITERS_WB`, 5000, for write-bw
    /// with or without Immediate Data; `DEF_ITERS`, 1000, for every other test).
    pub fn iterations(&self) -> u64 {
        self.iters.unwrap_or(if self.test == TestKind::WriteBw {
            5000
        } else {
            1000
        })
    }
    /// `-t` in force: perftest's default unless given (`DEF_TX_BW`, 128, for the bandwidth
    /// tests; `DEF_TX_LAT`, 1, for the latency tests), at most the iterations of an iteration
    /// run (perftest's `force_dependecies`; no bound with `-D` or `--run_infinitely`).
    pub fn tx_depth(&self) -> u32 {
        let depth = self
            .tx_depth
            .unwrap_or(if self.test.is_bw() { 128 } else { 1 });
        match self.iteration_run() {
            true => depth.min(u32::try_from(self.iterations()).unwrap_or(u32::MAX)),
            false => depth,
        }
    }
    /// A run of `-n` iterations per size (neither `-D` nor `--run_infinitely`).
    pub fn iteration_run(&self) -> bool {
        self.duration.is_none() && !self.run_infinitely
    }
    /// send-bw's `-r` in force: at most the iterations of an iteration run (perftest's
    /// `force_dependecies`); `None` if not given, or for another test (where it is noted).
    pub fn rx_depth(&self) -> Option<u32> {
        let r = self
            .more
            .rx_depth
            .filter(|_| self.test == TestKind::SendBw)?;
        Some(match self.iteration_run() {
            true => r.min(u32::try_from(self.iterations()).unwrap_or(u32::MAX)),
            false => r,
        })
    }
    /// `-f` as the run uses it: with `-D` (not `--run_infinitely`, whose `-D` is an
    /// interval), else `None` (and noted).
    pub fn margin(&self) -> Option<u32> {
        self.more
            .margin
            .filter(|_| self.duration.is_some() && !self.run_infinitely)
    }
    /// `-A` in force (FetchAdd unless given).
    pub fn atomic_type(&self) -> AtomicType {
        self.atomic_type.unwrap_or(AtomicType::FetchAndAdd)
    }
    /// `--write-with-imm` or `--send-with-imm`.
    pub fn imm(&self) -> bool {
        self.write_with_imm || self.send_with_imm
    }
    /// Connection setup deadline (`validate` holds `--timeout` to (0, 3600] seconds).
    pub fn setup_timeout(&self) -> Duration {
        Duration::try_from_secs_f64(self.timeout).unwrap_or(Duration::from_secs(3600))
    }
    pub(crate) fn server_addr(&self, host: &str) -> Result<SocketAddr, String> {
        (host, self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("{host} has no address"))
    }
    /// `--run_infinitely`: how often a result line is printed (`-D`, default 5 s).
    pub fn report_every(&self) -> Option<Duration> {
        self.run_infinitely
            .then(|| Duration::from_secs_f64(self.duration.unwrap_or(5.0)))
    }
    /// `--stats-every` as a duration.
    pub fn stats_every(&self) -> Option<std::time::Duration> {
        self.stats_every.map(std::time::Duration::from_secs_f64)
    }

    /// The `--transport xdp` options given on this command line (by their flags).
    fn engine_options_given(&self) -> Vec<&'static str> {
        let given = [
            ("--iface", self.iface.is_some()),
            ("--pcap", self.pcap.is_some()),
            ("--xdp-mode", self.xdp_mode.is_some()),
            ("--stats-every", self.stats_every.is_some()),
            ("--engine-cpu", self.engine_cpu.is_some()),
            ("--engine-threads", self.engine_threads.is_some()),
            ("--engine-cpus", !self.engine_cpus.is_empty()),
            ("--engine-inline", self.engine_inline.is_some()),
            ("--engine-tx-copy", self.engine_tx_copy),
            ("--engine-ack-every", self.engine_ack_every.is_some()),
            ("--engine-rx-ring", self.engine_rx_ring.is_some()),
            ("--engine-tx-ahead", self.engine_tx_ahead.is_some()),
            (
                "--engine-tx-turn-frames",
                self.engine_tx_turn_frames.is_some(),
            ),
            ("--engine-busy-poll", self.engine_busy_poll.is_some()),
            (
                "--engine-busy-poll-budget",
                self.engine_busy_poll_budget.is_some(),
            ),
            ("--engine-park-max-us", self.engine_park_max_us.is_some()),
            (
                "--engine-reassembly-budget-mib",
                self.engine_reassembly_budget_mib.is_some(),
            ),
        ];
        given
            .into_iter()
            .filter_map(|(flag, on)| on.then_some(flag))
            .collect()
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.transport != Transport::Xdp {
            let given = self.engine_options_given();
            if !given.is_empty() {
                return Err(format!(
                    "{} {} for the AF_XDP engine: add --transport xdp (this run would use \
                     the socket transport, kernel TCP)",
                    given.join(", "),
                    if given.len() == 1 { "is" } else { "are" }
                ));
            }
        }
        if !self.engine_cpus.is_empty() && self.engine_threads == Some(EngineThreads::One) {
            return Err(
                "--engine-cpus pins the threads of --engine-threads per-queue: with one engine \
                 thread, --engine-cpu"
                    .into(),
            );
        }
        if self.framing == FramingArg::Ift && (self.markers.on() || self.mpa_rev != 2) {
            // IFT frames have no markers and no MPA negotiation: these would go unused.
            return Err(
                "--markers and --mpa-rev set MPA framing (RFC 5044): not with --framing ift".into(),
            );
        }
        if self.engine_busy_poll_budget.is_some() && self.engine_busy_poll.is_none() {
            return Err("--engine-busy-poll-budget goes with --engine-busy-poll".into());
        }
        if !(self.timeout > 0.0 && self.timeout <= 3600.0) {
            return Err("--timeout must be more than 0 and at most 3600 seconds".into());
        }
        if self.json && (self.compat.report_unsorted || self.compat.report_histogram) {
            return Err("-U and -H print samples before the table's result line: no --json".into());
        }
        if let Some(every) = self.stats_every {
            if !(0.1..=3600.0).contains(&every) {
                return Err("--stats-every must be between 0.1 and 3600 seconds".into());
            }
        }
        if self.compat.use_event && self.cq == CqMode::Poll {
            return Err(
                "-e waits on the completion channel, --cq poll busy-polls: one of them".into(),
            );
        }
        if (self.compat.report_unsorted || self.compat.report_histogram) && self.test.is_bw() {
            return Err("-U and -H report the samples of latency tests".into());
        }
        self.validate_perftest_more()?;
        if let Some(0) = self.size {
            return Err("--size must be at least 1".into());
        }
        if self.write_with_imm && !matches!(self.test, TestKind::WriteBw | TestKind::WriteLat) {
            return Err("--write-with-imm is for write-bw and write-lat".into());
        }
        if self.send_with_imm && !matches!(self.test, TestKind::SendBw | TestKind::SendLat) {
            return Err("--send-with-imm is for send-bw and send-lat".into());
        }
        if self.atomic_type.is_some() && !self.test.is_atomic() {
            // perftest: "You are not running the atomic_lat/bw test!"
            return Err(format!(
                "-A sets the operation of atomic-bw and atomic-lat, not of {}",
                self.test.name()
            ));
        }
        if self.test.is_atomic() && (self.all_sizes || self.size.is_some_and(|s| s != 8)) {
            return Err(format!(
                "{} moves 8 octets per operation: no --size or --all-sizes",
                self.test.name()
            ));
        }
        if self.sizes().iter().any(|&s| s > proto::MAX_SIZE) {
            return Err(format!("--size must be at most {}", proto::MAX_SIZE));
        }
        if self.post_list > 1 {
            if !self.test.is_bw() || self.test.is_atomic() {
                return Err("-l posts lists in the write, read and send bandwidth tests".into());
            }
            if self.post_list > self.tx_depth() {
                return Err(
                    "-l must be at most --tx-depth (which an iteration run holds to -n)".into(),
                );
            }
        }
        inline::check(
            self.compat.inline_size,
            !self.test.is_atomic() && !matches!(self.test, TestKind::ReadBw | TestKind::ReadLat),
        )?;
        if self.qps > 1 && !self.test.is_bw() {
            return Err("-q runs several queue pairs in the bandwidth tests".into());
        }
        if self.bidirectional {
            if self.test != TestKind::WriteBw {
                return Err("-b is implemented for write-bw".into());
            }
            if self.qps > 1 || self.run_infinitely || self.imm() {
                return Err(
                    "-b runs one queue pair each way: no -q, --run_infinitely or --write-with-imm"
                        .into(),
                );
            }
        }
        if self.run_infinitely {
            if !self.test.is_bw() {
                return Err("--run_infinitely is for the bandwidth tests".into());
            }
            if self.all_sizes {
                return Err("--run_infinitely runs one size: no -a".into());
            }
            if self.iters.is_some() {
                return Err("--run_infinitely runs until interrupted: no -n".into());
            }
            if self.qps > 1 {
                return Err("--run_infinitely runs one queue pair: no -q".into());
            }
            if self.json {
                return Err("--run_infinitely prints rows as it goes: no --json".into());
            }
        }
        if self.duration.is_some() && self.iters.is_some() {
            // perftest's duration mode drops -n without a word (iters = 0); say it instead.
            return Err("-D runs each size for that many seconds: no -n".into());
        }
        if self.iters == Some(0) {
            return Err("--iters must be at least 1".into());
        }
        if let Some(d) = self.duration {
            if !(d > 0.0 && d <= 3600.0) {
                return Err("--duration must be more than 0 and at most 3600 seconds".into());
            }
        }
        if self.transport == Transport::Xdp && self.iface.is_none() {
            return Err("--transport xdp needs --iface".into());
        }
        // As perftest checks `-t`: as given, before an iteration run holds it to `-n`.
        if self.tx_depth.is_some_and(|t| !(1..=1024).contains(&t)) {
            return Err("--tx-depth must be between 1 and 1024".into());
        }
        if self.cq_mod == Some(0) {
            return Err("--cq-mod must be at least 1".into());
        }
        if self.slots > 1024 {
            return Err("--slots must be between 1 and 1024 (0: the default)".into());
        }
        Ok(())
    }
}

impl Cli {
    /// The checks of perftest's options as perftest makes them (`perftest_parameters.c`),
    /// where a kind of test has no use for one.
    fn validate_perftest_more(&self) -> Result<(), String> {
        let bw = self.test.is_bw();
        match self.more.output {
            Some(OutputKind::Latency) if bw => {
                return Err(format!(
                    "--output for {} can be bandwidth or message_rate (perftest's rule)",
                    self.test.name()
                ))
            }
            Some(OutputKind::Bandwidth | OutputKind::MessageRate) if !bw => {
                return Err(format!(
                    "--output for {} can be latency (perftest's rule)",
                    self.test.name()
                ))
            }
            Some(_) if self.json => {
                return Err("--output prints one number, --json an object: one of them".into())
            }
            _ => {}
        }
        if self.compat.no_peak && !bw {
            // perftest: "NoPeak only valid for BW tests".
            return Err("-N (no peak) is only valid for the bandwidth tests, as perftest's".into());
        }
        if self.more.report_cycles && bw {
            // perftest: "Available only on Latency tests".
            return Err("-C (report cycles) is only available on the latency tests".into());
        }
        if self.compat.use_event && self.test == TestKind::WriteLat {
            // perftest: "Events feature not available on WRITE verb".
            return Err(
                "-e: write-lat sees each pong in memory, not on a completion queue (perftest \
                 refuses events for the Write tests)"
                    .into(),
            );
        }
        if self.more.outs.is_some() {
            let reads = matches!(
                self.test,
                TestKind::ReadBw | TestKind::ReadLat | TestKind::AtomicBw | TestKind::AtomicLat
            );
            if !reads {
                // perftest: "Setting Outstanding reads only available on READ verb".
                return Err(format!(
                    "-o sets the outstanding Reads and Atomic Operations of the read and atomic \
                     tests, not of {}",
                    self.test.name()
                ));
            }
            if self.mpa_rev == 1 || self.framing == FramingArg::Ift {
                return Err(
                    "-o is negotiated as MPA revision 2's IRD and ORD: not with --mpa-rev 1 or \
                     --framing ift"
                        .into(),
                );
            }
        }
        if self.more.rx_depth.is_some_and(|r| r > 1)
            && !matches!(self.test, TestKind::SendBw | TestKind::SendLat)
        {
            // perftest: "On RDMA verbs rx depth can be only 1".
            return Err(format!(
                "-r above 1 sets the receive depth of the send tests, not of {}",
                self.test.name()
            ));
        }
        if let (Some(f), Some(d)) = (self.more.margin, self.duration) {
            if !self.run_infinitely && d <= 2.0 * f64::from(f) {
                // perftest: "please check that DURATION > 2*MARGIN".
                return Err(format!(
                    "-D must be more than twice -f: -D {d} leaves no window between margins of \
                     -f {f} seconds"
                ));
            }
        }
        Ok(())
    }

    /// One line per option given that changes nothing here, or something else than what
    /// perftest's does: [`PerftestCompat::notes`], then those of [`PerftestMore`] and of the
    /// bandwidth tests' options given to a latency test.
    pub fn notes(&self) -> Vec<String> {
        let ignored = |flag: &dyn std::fmt::Display, why: &str| format!("{flag} ignored: {why}");
        let m = &self.more;
        let mut out = self.compat.notes();
        if let Some(u) = m.qp_timeout {
            out.push(ignored(
                &format_args!("-u {u}"),
                "InfiniBand's ACK timeout; TCP's retransmission timers apply",
            ));
        }
        if let Some(sl) = m.sl {
            out.push(ignored(
                &format_args!("-S {sl}"),
                "InfiniBand's service level; --tos sets the IP Type of Service",
            ));
        }
        if let Some(hops) = m.hop_limit {
            out.push(ignored(
                &format_args!("-L {hops}"),
                "the GRH's hop limit; the IP TTL is the transport's",
            ));
        }
        for (given, flag, why) in [
            (
                m.ipv6,
                "--ipv6",
                "the server's address (and --bind) choose the IP version",
            ),
            (
                m.use_srq,
                "--use-srq",
                "each queue pair here posts its own receives",
            ),
            (
                m.cpu_util,
                "--cpu_util",
                "there is no CPU utilization column here",
            ),
            (
                m.perform_warm_up,
                "--perform_warm_up",
                "there is no warm-up round (-D's margins leave out the start of a timed run)",
            ),
            (
                m.dont_xchg_versions,
                "--dont_xchg_versions",
                "iwarp-bench exchanges no perftest versions",
            ),
            (
                m.comm_rdma_cm,
                "-z",
                "the test's parameters travel in the MPA private data of the connection's setup",
            ),
            (
                m.report_cycles,
                "-C",
                "the figures stay in microseconds (the monotonic clock times them; there are no \
                 cycle counters here)",
            ),
        ] {
            if given {
                out.push(ignored(&flag, why));
            }
        }
        if let Some(f) = m.margin {
            let flag = format_args!("-f {f}");
            if self.duration.is_none() {
                out.push(ignored(&flag, "it sets the margins of -D's timed runs"));
            } else if self.run_infinitely {
                out.push(ignored(&flag, "--run_infinitely reports whole intervals"));
            } else if self.server.is_none() {
                out.push(format!(
                    "-f {f} ignored on the server: the client's -f sets the margins"
                ));
            }
        }
        if let Some(r) = m.rx_depth {
            let flag = format_args!("-r {r}");
            match self.test {
                TestKind::SendBw => {}
                TestKind::SendLat => {
                    out.push(ignored(&flag, "send-lat has one ping in flight at a time"))
                }
                _ => out.push(ignored(
                    &flag,
                    "it sets the receive depth of the send tests",
                )),
            }
        }
        if !self.test.is_bw() {
            if let Some(t) = self.tx_depth {
                out.push(format!(
                    "-t {t} changes nothing measured: a latency test has one operation \
                     outstanding at a time (the header's TX depth shows -t, as perftest's)"
                ));
            }
            if let Some(q) = self.cq_mod {
                out.push(ignored(
                    &format_args!("-Q {q}"),
                    "a latency test signals every operation",
                ));
            }
            if self.slots != 0 {
                out.push(ignored(
                    &format_args!("--slots {}", self.slots),
                    "a latency test pings from one buffer slot",
                ));
            }
        }
        out
    }
}

/// A message size as perftest's `-s` reads it (perftest_parameters.c): an integer as C's
/// `strtol` with base 0 reads one (decimal; hex after `0x`; octal after a leading `0`),
/// optionally followed by `K` (times 1024) or `M` (times 1024^2). perftest ignores what
/// follows the number; here anything else is refused (`64k` would be 64 octets there).
pub fn parse_size(arg: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "'{arg}' is not a size: octets in decimal, hex (0x...) or octal (0...), \
             optionally followed by K or M (64K, 1M)"
        )
    };
    let (number, factor) = match arg.as_bytes().last() {
        Some(b'K') => (&arg[..arg.len() - 1], 1u64 << 10),
        Some(b'M') => (&arg[..arg.len() - 1], 1 << 20),
        _ => (arg, 1),
    };
    let (digits, radix) = if let Some(hex) = number
        .strip_prefix("0x")
        .or_else(|| number.strip_prefix("0X"))
    {
        (hex, 16)
    } else if number.len() > 1 && number.starts_with('0') {
        (&number[1..], 8)
    } else {
        (number, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(bad());
    }
    // The digits are valid: only a number beyond 64 bits fails here.
    u64::from_str_radix(digits, radix)
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("'{arg}' is too large a size"))
}

/// perftest's `-a`: every power of two from 2 octets to 8 MiB.
pub fn all_sizes() -> Vec<u64> {
    (1..=23).map(|e| 1u64 << e).collect()
}

/// Parses a subcommand's arguments; on an error (or `--help`) prints clap's message and
/// gives the exit code to end with (2 for a usage error, 0 for help or version).
pub fn parse_args<T: Parser>(args: impl IntoIterator<Item = String>) -> Result<T, ExitCode> {
    T::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        ExitCode::from(if e.use_stderr() { 2 } else { 0 })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("iwarp-bench").chain(args.iter().copied()))
    }

    /// `-s` as perftest reads it: K and M suffixes, hex and octal.
    #[test]
    fn sizes_as_perftest_reads_them() {
        for (arg, want) in [
            ("65536", 65536),
            ("64K", 65536),
            ("1M", 1 << 20),
            ("8M", 8 << 20),
            ("0x1000", 4096),
            ("0X10", 16),
            ("010", 8),
            ("0", 0),
            ("2", 2),
            ("0x2K", 2048),
        ] {
            assert_eq!(parse_size(arg), Ok(want), "{arg}");
        }
        for arg in [
            "",
            "K",
            "64k",
            "1G",
            "0x",
            "09",
            "-1",
            "64 ",
            "1.5M",
            "0xfffffffffffffffM",
        ] {
            assert!(parse_size(arg).is_err(), "{arg}");
        }
        for arg in ["0xfffffffffffffffM", "99999999999999999999"] {
            let e = parse_size(arg).expect_err(arg);
            assert!(e.contains("too large"), "{arg}: {e}");
        }
        let c = parse(&["write-bw", "-s", "64K"]).expect("-s 64K");
        assert_eq!(c.sizes(), [65536]);
        let c = parse(&["write-lat", "--size", "0x40"]).expect("--size 0x40");
        assert_eq!(c.sizes(), [64]);
        assert!(parse(&["write-bw", "-s", "64KB"]).is_err());
    }

    /// perftest refuses `-A` outside the atomic tests ("You are not running the atomic_lat/bw
    /// test!"); so do we, rather than ignore it.
    #[test]
    fn atomic_type_only_for_atomic_tests() {
        let c = parse(&["atomic-lat"]).expect("atomic-lat");
        assert_eq!(c.atomic_type(), AtomicType::FetchAndAdd);
        assert!(c.validate().is_ok());
        let c = parse(&["atomic-bw", "-A", "CMP_AND_SWAP"]).expect("-A");
        assert_eq!(c.atomic_type(), AtomicType::CmpAndSwap);
        assert!(c.validate().is_ok());
        for test in ["write-bw", "read-lat", "send-bw"] {
            let c = parse(&[test, "-A", "fetch-and-add"]).expect("parses");
            let err = c.validate().expect_err(test);
            assert!(err.contains("-A") && err.contains(test), "{err}");
        }
    }

    /// `-I 0` on a Read or Atomic test asks for nothing inline: accepted, as perftest does
    /// (its inline size for them is 0); more is refused.
    #[test]
    fn no_inline_data_is_fine_for_reads_and_atomics() {
        for test in ["read-bw", "read-lat", "atomic-bw", "atomic-lat"] {
            let c = parse(&[test, "-I", "0"]).expect("parses");
            assert!(c.validate().is_ok(), "{test}: {:?}", c.validate());
            let c = parse(&[test, "-I", "8"]).expect("parses");
            assert!(c.validate().is_err(), "{test}");
        }
    }

    /// `-n` with `-D` is refused (perftest drops it silently), as `-n` with
    /// `--run_infinitely` is.
    #[test]
    fn iterations_or_duration_not_both() {
        assert!(parse(&["write-bw", "-D", "2"]).unwrap().validate().is_ok());
        assert!(parse(&["write-lat", "-n", "20"])
            .unwrap()
            .validate()
            .is_ok());
        for test in ["write-bw", "send-lat"] {
            let err = parse(&[test, "-n", "100", "-D", "2"])
                .unwrap()
                .validate()
                .expect_err(test);
            assert!(err.contains("-D") && err.contains("-n"), "{err}");
        }
    }

    /// perftest's default `-n`: 5000 for write-bw (`DEF_ITERS_WB`, write with Immediate Data
    /// too), 1000 (`DEF_ITERS`) for read-bw, send-bw, atomic-bw and the latency tests.
    #[test]
    fn default_iterations_as_perftest() {
        for (args, n) in [
            (&["write-bw"][..], 5000),
            (&["write-bw", "--write_with_imm"], 5000),
            (&["read-bw"], 1000),
            (&["send-bw"], 1000),
            (&["send-bw", "--send_with_imm"], 1000),
            (&["atomic-bw"], 1000),
            (&["write-lat"], 1000),
            (&["read-lat"], 1000),
            (&["send-lat"], 1000),
            (&["atomic-lat"], 1000),
            (&["read-bw", "-n", "77"], 77),
        ] {
            assert_eq!(parse(args).unwrap().iterations(), n, "{args:?}");
        }
    }

    /// perftest's defaults for a latency test: 2-octet messages (`DEF_SIZE_LAT`), one
    /// outstanding (`DEF_TX_LAT`); a bandwidth test's 65536 and 128.
    #[test]
    fn latency_defaults_as_perftest() {
        for test in ["write-lat", "read-lat", "send-lat"] {
            let c = parse(&[test]).unwrap();
            assert_eq!((c.sizes(), c.tx_depth()), (vec![2], 1), "{test}");
        }
        let c = parse(&["atomic-lat"]).unwrap();
        assert_eq!((c.sizes(), c.tx_depth()), (vec![8], 1));
        for test in ["write-bw", "read-bw", "send-bw"] {
            let c = parse(&[test]).unwrap();
            assert_eq!((c.sizes(), c.tx_depth()), (vec![65536], 128), "{test}");
        }
        let c = parse(&["write-lat", "-s", "64", "-t", "4"]).unwrap();
        assert_eq!((c.sizes(), c.tx_depth()), (vec![64], 4));
        assert!(parse(&["write-bw", "-t", "0"]).unwrap().validate().is_err());
        assert!(parse(&["write-bw", "-t", "1025"])
            .unwrap()
            .validate()
            .is_err());
    }

    /// perftest's long options as perftest spells them (underscores where it has them).
    #[test]
    fn perftest_spellings_are_accepted() {
        let c = parse(&["write-bw", "--write_with_imm"]).expect("--write_with_imm");
        assert!(c.write_with_imm);
        let c = parse(&["send-lat", "--send_with_imm"]).expect("--send_with_imm");
        assert!(c.send_with_imm);
        for args in [
            &["write-bw", "--report_gbits"][..],
            &["write-bw", "--run_infinitely"],
            &["write-bw", "--post_list", "4"],
            &["write-bw", "--inline_size", "16"],
            &["write-bw", "--rdma_cm"],
            &["write-bw", "--events"],
            &["write-bw", "--cq-mod", "10"],
            &["write-bw", "--tx-depth", "64"],
            &["write-bw", "--all"],
            &["write-bw", "--noPeak"],
            &["write-bw", "--CPU-freq"],
            &["write-bw", "--gid-index", "0"],
            &["write-bw", "--ib-dev", "siw0"],
            &["write-bw", "--ib-port", "1"],
            &["write-lat", "--report-histogrm"],
            &["atomic-bw", "--atomic_type", "CMP_AND_SWAP"],
        ] {
            parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
    }

    /// perftest options that were refused with "unexpected argument" (review B1): each parses.
    #[test]
    fn more_perftest_options_are_accepted() {
        for args in [
            &["write-bw", "--output=bandwidth"][..],
            &["write-bw", "--output", "message_rate"],
            &["write-lat", "--output=latency"],
            &["send-bw", "-r", "256"],
            &["send-bw", "--rx-depth", "256"],
            &["read-bw", "-o", "16"],
            &["read-bw", "--outs", "16"],
            &["read-bw", "-D", "5", "-f", "1"],
            &["read-bw", "-D", "5", "--margin", "1"],
            &["write-lat", "-C"],
            &["write-lat", "--report-cycles"],
            &["write-bw", "--cpu_util"],
            &["write-bw", "-u", "14"],
            &["write-bw", "--qp-timeout", "14"],
            &["write-bw", "-S", "0"],
            &["write-bw", "--sl", "0"],
            &["write-bw", "-L", "64"],
            &["write-bw", "--hop_limit", "64"],
            &["write-bw", "--ipv6"],
            &["send-bw", "--use-srq"],
            &["write-bw", "--perform_warm_up"],
            &["write-bw", "--dont_xchg_versions"],
            &["write-bw", "-z"],
            &["write-bw", "--comm_rdma_cm"],
        ] {
            let c = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert!(c.validate().is_ok(), "{args:?}: {:?}", c.validate());
        }
        assert!(parse(&["write-bw", "--output=gigabits"]).is_err());
    }

    /// `--output`'s kind as perftest allows it: bandwidth or message_rate for the bandwidth
    /// tests, latency for the latency tests; not with `--json`.
    #[test]
    fn output_kind_must_suit_the_test() {
        for args in [
            &["write-bw", "--output=latency"][..],
            &["atomic-bw", "--output=latency"],
            &["write-lat", "--output=bandwidth"],
            &["read-lat", "--output=message_rate"],
            &["write-bw", "--output=bandwidth", "--json"],
        ] {
            let c = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let err = c.validate().expect_err(args[1]);
            assert!(err.contains("--output"), "{args:?}: {err}");
        }
    }

    /// perftest's `force_dependecies`: an iteration run's TX depth is at most its iterations,
    /// and the CQ moderation at most that (review B4); not with `-D` or `--run_infinitely`.
    #[test]
    fn tx_depth_is_clamped_to_the_iterations() {
        let c = parse(&["write-bw", "-n", "20"]).unwrap();
        assert_eq!((c.tx_depth(), c.cq_mod()), (20, 20));
        let c = parse(&["send-bw", "-n", "50", "-t", "64", "-Q", "60"]).unwrap();
        assert_eq!((c.tx_depth(), c.cq_mod()), (50, 50));
        let c = parse(&["write-lat", "-n", "2", "-t", "4"]).unwrap();
        assert_eq!(c.tx_depth(), 2);
        for args in [
            &["write-bw", "-D", "2"][..],
            &["write-bw", "--run_infinitely"],
            &["write-bw", "-n", "5000"],
        ] {
            let c = parse(args).unwrap();
            assert_eq!((c.tx_depth(), c.cq_mod()), (128, 100), "{args:?}");
        }
    }

    /// Options perftest refuses for a kind of test are refused here too: `-N` on latency tests
    /// ("NoPeak only valid for BW tests"), `-C` on bandwidth tests ("Available only on Latency
    /// tests"), `-e` on write-lat (perftest: "Events feature not available on WRITE verb"),
    /// `-o` outside the Read and Atomic tests, `-r` above 1 outside the send tests; `-f` must
    /// leave a window (`-D` more than twice it).
    #[test]
    fn options_are_refused_where_perftest_refuses_them() {
        for (args, says) in [
            (&["write-lat", "-N"][..], "-N"),
            (&["read-lat", "--noPeak"], "-N"),
            (&["write-bw", "-C"], "-C"),
            (&["write-lat", "-e"], "-e"),
            (&["write-bw", "-o", "4"], "-o"),
            (&["send-lat", "-o", "4"], "-o"),
            (&["read-bw", "-o", "0"], "-o"),
            (&["read-bw", "-o", "4", "--mpa-rev", "1"], "-o"),
            (&["read-bw", "-o", "4", "--framing", "ift"], "-o"),
            (&["write-bw", "-r", "2"], "-r"),
            (&["send-bw", "-r", "0"], "-r"),
            (&["read-bw", "-D", "4", "-f", "2"], "-f"),
            (&["read-bw", "-D", "2", "-f", "1"], "-f"),
        ] {
            let Ok(c) = parse(args) else {
                // A value clap itself refuses (out of range) is refused too.
                continue;
            };
            let err = c.validate().expect_err(&args.join(" "));
            assert!(err.contains(says), "{args:?}: {err}");
        }
        for args in [
            &["write-bw", "-N"][..],
            &["send-lat", "-e"],
            &["read-lat", "-e"],
            &["atomic-lat", "-e"],
            &["atomic-bw", "-o", "8"],
            &["read-lat", "-o", "8"],
            &["read-bw", "-D", "5", "-f", "2"],
            &["read-bw", "-D", "4", "-f", "0"],
            &["send-lat", "-r", "8"],
            &["write-bw", "-r", "1"],
        ] {
            let c = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert!(c.validate().is_ok(), "{args:?}: {:?}", c.validate());
        }
    }

    /// Every option accepted that changes nothing here is noted (never silently taken), and
    /// none that works is.
    #[test]
    fn inert_options_are_noted() {
        let notes = |args: &[&str]| parse(args).unwrap().notes().join("\n");
        let n = notes(&[
            "write-bw",
            "-u",
            "14",
            "-S",
            "1",
            "-L",
            "9",
            "--ipv6",
            "--use-srq",
            "--cpu_util",
            "--perform_warm_up",
            "--dont_xchg_versions",
            "-z",
            "-f",
            "1",
            "-r",
            "1",
            "-x",
            "0",
        ]);
        for flag in [
            "-u 14 ",
            "-S 1 ",
            "-L 9 ",
            "--ipv6 ",
            "--use-srq ",
            "--cpu_util ",
            "--perform_warm_up ",
            "--dont_xchg_versions ",
            "-z ",
            "-f 1 ",
            "-r 1 ",
            "-x 0 ",
        ] {
            assert!(n.contains(&format!("{flag}ignored")), "{flag}: {n}");
        }
        let n = notes(&["write-lat", "-t", "4", "-Q", "2", "--slots", "3", "-C"]);
        for flag in [
            "-t 4 changes nothing",
            "-Q 2 ignored",
            "--slots 3 ignored",
            "-C ignored",
        ] {
            assert!(n.contains(flag), "{flag}: {n}");
        }
        assert!(notes(&["send-lat", "-r", "8"]).contains("-r 8 ignored"));
        // -f with -D: the client's works, the server's is the client's to set.
        assert_eq!(notes(&["read-bw", "-D", "5", "-f", "1", "host"]), "");
        assert!(notes(&["read-bw", "-D", "5", "-f", "1"]).contains("ignored on the server"));
        assert!(notes(&["read-bw", "--run_infinitely", "-f", "1", "host"]).contains("-f 1 ignored"));
        // What works is not noted.
        for args in [
            &["send-bw", "-r", "16", "-t", "4", "-Q", "2", "--slots", "2"][..],
            &["read-bw", "-o", "8", "-N", "--output=bandwidth"],
            &["read-lat", "-o", "8", "-e", "--output=latency"],
        ] {
            assert_eq!(notes(args), "", "{args:?}");
        }
    }
}
