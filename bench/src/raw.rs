//! `iwarp-bench raw <tx|rx|pingpong>`: raw AF_XDP tools, no TCP, for the ceiling of the data
//! path on the test bed.
//!
//! * `raw rx` attaches the steering program to `--iface`, steers `--port`, binds one AF_XDP
//!   socket per queue (or only `--queue`) into its XSKMAP, and counts the frames that arrive:
//!   frames/s and Gbit/s from the first frame to the last.
//! * `raw tx` sends `--count` Ethernet/IPv4/TCP-shaped frames of `--size` octets (valid IPv4
//!   and TCP checksums, ACK|PSH, a fixed payload pattern) from the TX ring of `--queue` to
//!   `--dst-ip`:`--port`; the next hop's MAC comes from the kernel's neighbour table (resolved
//!   on demand). Each frame is one copy of a prebuilt frame into a UMEM frame.
//! * `raw pingpong` without `--dst-ip` is the responder (echoes every steered frame back with
//!   addresses and ports swapped, jumbo frames over several UMEM frames too, and counts the
//!   frames it could not answer); with `--dst-ip` it is the initiator: one frame each way per
//!   iteration, latency = round trip / 2 (as perftest reports it), printed in perftest's latency
//!   format. The initiator gives up, saying the responder is not answering, after `--timeout`
//!   seconds without a reply.
//!
//! Sizes are Ethernet frame lengths without FCS (64 = 14 + 20 + 20 + 10 octets of payload);
//! Gbit/s counts those octets; the bandwidth reports also give the goodput, Gbit/s of the TCP
//! payload (`payload_gbit_per_sec`: frame less the 54 octets of Ethernet, IPv4 and TCP headers).
//! Progress goes to stderr once a second; results to stdout.

use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use datapath::xsk::packet::{
    swap_endpoints, tcp_flags, write_tcp_frame, TcpFrame, TcpFrameSpec, HEADERS_LEN,
};
use datapath::xsk::steering::{ActiveMode, SteeringProgram};
use datapath::xsk::{
    interface_info, resolve_next_hop, InterfaceInfo, XskConfig, XskSocket, MAX_FRAMES_PER_PACKET,
};
use serde::Serialize;

use crate::cli::XdpMode;
use crate::perftest::report;
use crate::stats::{BandwidthResult, LatencyResult};

/// How `raw rx`'s "ready" line starts (its socket bound, the port steered): scripts and tests
/// start the sender once it is on stderr, matched whole (an error's "already" is no "ready").
pub const RX_READY: &str = "raw rx: ready on";
/// How the ping-pong responder's "ready" line starts, as [`RX_READY`].
pub const PONG_READY: &str = "raw pingpong: responder ready on";

/// Raw AF_XDP tools on the test bed (no TCP): the ceiling for everything above.
#[derive(Parser, Debug)]
#[command(name = "iwarp-bench raw")]
struct RawCli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Send --count frames of --size octets to --dst-ip:--port.
    Tx(Opts),
    /// Steer --port into AF_XDP sockets and count the frames that arrive.
    Rx(Opts),
    /// Latency: responder without --dst-ip, initiator with it. Start the responder first and
    /// wait for its "ready" line; the initiator stops with an error ("the responder is not
    /// answering") after --timeout seconds without a reply.
    Pingpong(Opts),
}

#[derive(Args, Debug, Clone)]
struct Opts {
    /// Interface (in the current network namespace).
    #[arg(long)]
    iface: String,
    /// Frame size in octets (Ethernet header to end of payload, no FCS), at least 54.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Frames to send/receive (tx, rx; default 1000000) or iterations (pingpong; default 10000).
    #[arg(long)]
    count: Option<u64>,
    /// Queue: tx sends from it (default 0); rx and pingpong bind only it (default: all queues).
    #[arg(long)]
    queue: Option<u32>,
    /// XDP attach mode of the steering program (rx, pingpong).
    #[arg(long, visible_alias = "xdp-mode", value_enum, default_value_t = XdpMode::Auto)]
    mode: XdpMode,
    /// Destination address (tx; pingpong initiator).
    #[arg(long)]
    dst_ip: Option<Ipv4Addr>,
    /// TCP port: steered on the receiving side, destination (and source) of the frames sent.
    #[arg(long, default_value_t = 18600)]
    port: u16,
    /// Iterations before the measured ones (pingpong initiator).
    #[arg(long, default_value_t = 100)]
    warmup: u64,
    /// Seconds to wait for the first frame (rx, responder) or for ARP (tx, initiator); the
    /// pingpong initiator also stops with an error once this long passes without a reply (from
    /// its first ping, or since the last reply: a second per lost ping, so 10 lost in a row by
    /// default).
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Seconds without frames after which rx and the responder stop early.
    #[arg(long, default_value_t = 2.0)]
    idle: f64,
    /// Size of each AF_XDP ring (RX, fill, TX, completion; a power of two): more frames in
    /// flight absorb longer stalls of the polling thread.
    #[arg(long, default_value_t = 2048)]
    ring: u32,
    /// Print one JSON object with the results on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// tx: move each frame's payload as the engine's transmit path does, from a pinned region of
    /// this many MiB (1-4096) walked in order: the octets after the engine's headers (Ethernet,
    /// IPv4, TCP with timestamps, MPA and tagged DDP/RDMAP: 82) up to the last four are copied
    /// from the region with their CRC32C and TCP checksum sum in the same pass, the CRC written
    /// into the last four, the next payload but one prefetched. What raw sends at best when its
    /// data, like an application's, comes from memory rather than from a template in cache.
    /// Default: none (the template's payload).
    #[arg(long)]
    source_mib: Option<usize>,
}

/// Where the engine's FPDU payload starts in a frame: Ethernet, IPv4 and TCP headers
/// ([`HEADERS_LEN`]), TCP timestamps (12), the MPA header (2) and a tagged DDP/RDMAP header (14).
const ENGINE_PAYLOAD_AT: usize = HEADERS_LEN + 12 + 2 + 14;

/// `raw tx --source-mib`: frame payloads moved from a pinned region as the engine moves them.
struct PayloadSource {
    region: datapath::PinnedBuffer,
    /// Payload octets per frame (between [`ENGINE_PAYLOAD_AT`] and the CRC).
    len: usize,
    /// Region octets walked: a whole number of payloads.
    span: usize,
    pos: usize,
    /// The payloads' sums, kept so that computing them is not optimised away.
    sums: u64,
}

impl PayloadSource {
    fn new(mib: usize, frame: usize) -> Res<PayloadSource> {
        if !(1..=4096).contains(&mib) {
            return Err(format!("--source-mib {mib} out of range: 1..=4096"));
        }
        let len = frame
            .checked_sub(ENGINE_PAYLOAD_AT + 4)
            .filter(|&l| l > 0)
            .ok_or_else(|| {
                format!(
                    "--source-mib needs --size of at least {} (headers, payload, CRC), not {frame}",
                    ENGINE_PAYLOAD_AT + 5
                )
            })?;
        let bytes = mib << 20;
        let region = datapath::PinnedBuffer::new(bytes).map_err(|e| e.to_string())?;
        let pattern: Vec<u8> = (0..1 << 20).map(|i: usize| (i * 31 + 7) as u8).collect();
        for at in (0..bytes).step_by(pattern.len()) {
            region.write_at(at, &pattern);
        }
        Ok(PayloadSource {
            region,
            len,
            span: bytes / len * len,
            pos: 0,
            sums: 0,
        })
    }

    /// Writes frame `buf` (`template`'s headers, then the next payload and its CRC).
    fn fill(&mut self, buf: &mut [u8], template: &[u8]) {
        let (head, rest) = buf.split_at_mut(ENGINE_PAYLOAD_AT);
        head.copy_from_slice(&template[..ENGINE_PAYLOAD_AT]);
        let (payload, crc_field) = rest.split_at_mut(self.len);
        let mut crc = !0u32;
        let sum = self.region.read_at_crc_sum(self.pos, payload, &mut crc);
        crc_field[..4].copy_from_slice(&(!crc).to_le_bytes());
        self.sums = self.sums.wrapping_add(u64::from(sum));
        self.region
            .prefetch((self.pos + 2 * self.len) % self.span, self.len);
        self.pos = (self.pos + self.len) % self.span;
    }
}

/// Entry point: `args` starts with the subcommand's own name ("iwarp-bench raw").
pub fn main(args: impl Iterator<Item = String>) -> ExitCode {
    let cli: RawCli = match crate::parse_args(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Err(e) = validate(&cli.cmd) {
        eprintln!("iwarp-bench raw: {e}");
        return ExitCode::from(2);
    }
    let result = match &cli.cmd {
        Cmd::Tx(o) => tx(o),
        Cmd::Rx(o) | Cmd::Pingpong(o) if o.source_mib.is_some() => {
            Err("--source-mib applies to tx only".to_string())
        }
        Cmd::Rx(o) => rx(o),
        Cmd::Pingpong(o) if o.dst_ip.is_some() => ping(o),
        Cmd::Pingpong(o) => pong(o),
    };
    // Built with the `latency-probe` feature: the socket's kicks (KickStart -> KickDone), for
    // scripts/latency-breakdown.sh to set beside the engine's.
    if let Some(steps) = datapath::probe::report(1000) {
        eprint!("{steps}");
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iwarp-bench raw: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res<T> = Result<T, String>;

/// The counts checked before anything is set up (exit 2): `rx` times its frames between the
/// first and the last, so it needs two; pingpong's `--count` and `--warmup` must add up.
fn validate(cmd: &Cmd) -> Res<()> {
    match cmd {
        Cmd::Rx(o) if o.count.is_some_and(|c| c < 2) => Err(
            "rx: --count must be at least 2 (the rate is timed from the first frame to the last)"
                .into(),
        ),
        Cmd::Pingpong(o) => {
            let count = o.count.unwrap_or(10_000);
            if count.checked_add(o.warmup).is_none() {
                return Err(format!(
                    "pingpong: --count {count} plus --warmup {} is more than 2^64 - 1",
                    o.warmup
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The most round trips the pingpong initiator keeps samples of (80 MB), as the main tool's
/// latency tests: a longer run summarises its first ones, and says so.
const MAX_PING_SAMPLES: u64 = 10_000_000;

fn secs(s: f64, what: &str) -> Res<Duration> {
    if s.is_finite() && s > 0.0 && s <= 3600.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(format!(
            "--{what} must be more than 0 and at most 3600 seconds"
        ))
    }
}

/// The sockets' config for the interface: multi-buffer AF_XDP (the `xdp.frags` program,
/// sockets bound with `XDP_USE_SG`) where frames of its MTU do not fit one UMEM frame, as the
/// engine does.
fn xsk_config(o: &Opts, info: &InterfaceInfo) -> Res<XskConfig> {
    if !o.ring.is_power_of_two() || !(64..=65536).contains(&o.ring) {
        return Err("--ring must be a power of two between 64 and 65536".into());
    }
    Ok(XskConfig {
        rx_ring: o.ring,
        tx_ring: o.ring,
        ..XskConfig::default()
    }
    .for_mtu(info.mtu))
}

fn facts(o: &Opts) -> Res<(InterfaceInfo, Ipv4Addr)> {
    let info = interface_info(&o.iface).map_err(|e| e.to_string())?;
    let (ip, _) = info
        .ipv4
        .ok_or_else(|| format!("interface {} has no IPv4 address", o.iface))?;
    let cfg = xsk_config(o, &info)?;
    let max = (info.mtu as usize + 14).min(cfg.packet_capacity());
    if o.size < HEADERS_LEN || o.size > max {
        return Err(format!(
            "--size {} out of range: {HEADERS_LEN}..={max} on {} (MTU {}; a 4 KiB UMEM frame \
             holds {}, a multi-buffer packet {MAX_FRAMES_PER_PACKET} frames; \
             raise the MTU on both veth ends for larger frames)",
            o.size,
            o.iface,
            info.mtu,
            cfg.frame_capacity()
        ));
    }
    Ok((info, ip))
}

fn spec_for(o: &Opts, info: &InterfaceInfo, src_ip: Ipv4Addr) -> Res<TcpFrameSpec> {
    let dst = o.dst_ip.ok_or("--dst-ip is required")?;
    let (route, dst_mac) =
        resolve_next_hop(dst, secs(o.timeout, "timeout")?).map_err(|e| e.to_string())?;
    if route.ifindex != info.index {
        return Err(format!(
            "the route to {dst} leaves by interface index {}, not {} ({})",
            route.ifindex, o.iface, info.index
        ));
    }
    Ok(TcpFrameSpec {
        src_mac: info.mac,
        dst_mac,
        src_ip,
        dst_ip: dst,
        src_port: o.port,
        dst_port: o.port,
        seq: 0,
        ack: 0,
        flags: tcp_flags::ACK | tcp_flags::PSH,
        window: 65535,
        ip_id: 0,
    })
}

fn frame_into(buf: &mut [u8], spec: &TcpFrameSpec, size: usize) -> usize {
    write_tcp_frame(buf, spec, size, |p| {
        for (i, b) in p.iter_mut().enumerate() {
            *b = i as u8;
        }
    })
    .unwrap_or(0)
}

/// Attaches the steering program, steers the port and binds one socket per selected queue.
fn steer(o: &Opts, info: &InterfaceInfo) -> Res<(SteeringProgram, ActiveMode, Vec<XskSocket>)> {
    let frags = xsk_config(o, info)?.needs_frags_program(info.mtu);
    let mut prog = SteeringProgram::load(frags).map_err(|e| e.to_string())?;
    let active = prog
        .attach(&o.iface, o.mode.into())
        .map_err(|e| e.to_string())?;
    // Frames to the interface's own address at the port: what the senders address.
    let (ip, _) = info
        .ipv4
        .ok_or_else(|| format!("interface {} has no IPv4 address", o.iface))?;
    prog.steer_port(ip, o.port).map_err(|e| e.to_string())?;
    let queues: Vec<u32> = match o.queue {
        Some(q) => vec![q],
        // Every queue the interface runs (a NIC may run fewer than it has allocated).
        None => {
            let (rx, tx) =
                datapath::xsk::ethtool::running_queues(&o.iface, (info.rx_queues, info.tx_queues));
            (0..rx.min(tx)).collect()
        }
    };
    let socks = XskSocket::open_queues(&o.iface, queues, &xsk_config(o, info)?)
        .map_err(|e| e.to_string())?;
    for s in &socks {
        prog.bind_socket(s.queue(), s.fd())
            .map_err(|e| e.to_string())?;
    }
    for s in &socks {
        fits(o, s)?;
    }
    Ok((prog, active, socks))
}

/// `--size` within what the opened socket sends in one packet: the configuration's bound, or
/// less when a zero-copy driver takes fewer frames a packet than a multi-buffer socket offers.
fn fits(o: &Opts, sock: &XskSocket) -> Res<()> {
    let cap = sock.packet_capacity();
    if o.size > cap {
        return Err(format!(
            "--size {} above the {cap} octets a packet holds on {} queue {} ({} mode{})",
            o.size,
            o.iface,
            sock.queue(),
            if sock.is_zero_copy() {
                "zero-copy"
            } else {
                "copy"
            },
            if sock.is_zero_copy() {
                ": the driver takes fewer frames a packet"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

fn describe(o: &Opts, active: Option<ActiveMode>, socks: &[XskSocket]) -> String {
    let queues: Vec<u32> = socks.iter().map(|s| s.queue()).collect();
    let first = &socks[0];
    format!(
        "{} queue(s) {queues:?} port {}{}, AF_XDP {} mode, UMEM on {} pages",
        o.iface,
        o.port,
        active.map(|m| format!(", {m} XDP")).unwrap_or_default(),
        if first.is_zero_copy() {
            "zero-copy"
        } else {
            "copy"
        },
        if first.hugepages() { "huge" } else { "4 KiB" },
    )
}

struct Progress {
    quiet: bool,
    label: &'static str,
    start: Instant,
    last: Instant,
    last_count: u64,
}

impl Progress {
    fn new(quiet: bool, label: &'static str) -> Self {
        let now = Instant::now();
        Self {
            quiet,
            label,
            start: now,
            last: now,
            last_count: 0,
        }
    }
    fn tick(&mut self, count: u64, total: u64) {
        if self.quiet {
            return;
        }
        let now = Instant::now();
        let dt = now.duration_since(self.last);
        if dt >= Duration::from_secs(1) {
            let rate = (count - self.last_count) as f64 / dt.as_secs_f64() / 1e6;
            eprintln!(
                "raw {}: {count}/{total} after {:.1} s ({rate:.3} Mpps)",
                self.label,
                now.duration_since(self.start).as_secs_f64()
            );
            self.last = now;
            self.last_count = count;
        }
    }
}

#[derive(Serialize)]
struct BwReport<'a> {
    test: &'a str,
    iface: &'a str,
    queues: Vec<u32>,
    xdp_mode: Option<String>,
    zero_copy: bool,
    frame_bytes: usize,
    expected: u64,
    frames: u64,
    /// `raw tx --source-mib`: the region the payloads were copied from, MiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    source_mib: Option<usize>,
    #[serde(flatten)]
    bw: BandwidthResult,
    /// Goodput: Gbit/s of the frames' TCP payload (frame octets less the Ethernet, IPv4 and
    /// TCP headers, [`HEADERS_LEN`]), what a protocol above could carry in such frames at best.
    payload_gbit_per_sec: f64,
    kernel_drops: u64,
}

/// Gbit/s of TCP payload in `frames` frames of `frame_bytes` octets each over `bw`'s interval.
fn payload_gbit(frame_bytes: usize, bw: &BandwidthResult) -> f64 {
    let payload = frame_bytes.saturating_sub(HEADERS_LEN) as f64;
    bw.gbit_per_sec * payload / (frame_bytes.max(1) as f64)
}

fn print_bw(o: &Opts, report: &BwReport<'_>) {
    if o.json {
        println!(
            "{}",
            serde_json::to_string(report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        println!("{}", report::bw_header(false));
        println!("{}", report::bw_row_of(&report.bw, false));
        println!(
            "raw {}: {} of {} frames, {:.3} Mpps, {:.3} Gbit/s (frame octets), {:.3} Gbit/s goodput (TCP payload), kernel drops {}",
            report.test,
            report.frames,
            report.expected,
            report.bw.msg_rate_mpps,
            report.bw.gbit_per_sec,
            report.payload_gbit_per_sec,
            report.kernel_drops
        );
    }
}

fn tx(o: &Opts) -> Res<()> {
    let count = o.count.unwrap_or(1_000_000);
    let mut source = o
        .source_mib
        .map(|mib| PayloadSource::new(mib, o.size))
        .transpose()?;
    let (info, src_ip) = facts(o)?;
    let spec = spec_for(o, &info, src_ip)?;
    let mut template = vec![0u8; o.size];
    let size = frame_into(&mut template, &spec, o.size);
    if source.is_some() && size != o.size {
        return Err(format!("cannot build a {}-octet frame", o.size));
    }
    let queue = o.queue.unwrap_or(0);
    let mut sock =
        XskSocket::open(&o.iface, queue, &xsk_config(o, &info)?).map_err(|e| e.to_string())?;
    fits(o, &sock)?;
    if !o.quiet {
        let from = match o.source_mib {
            Some(mib) => format!(", payloads copied from a region of {mib} MiB"),
            None => String::new(),
        };
        eprintln!(
            "raw tx: {count} frames of {size} octets to {}:{} via {}{from}",
            spec.dst_ip,
            o.port,
            describe(o, None, std::slice::from_ref(&sock))
        );
    }
    let mut progress = Progress::new(o.quiet, "tx");
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < count {
        let n = (count - sent).min(256) as usize;
        let k = match source.as_mut() {
            Some(src) => sock.send_batch(n, |_, buf| {
                src.fill(&mut buf[..size], &template);
                size
            }),
            // Straight into the packet's frames (several at a jumbo MTU), as the engine writes.
            None => sock.send_framed(n, |_, frames| {
                let (first, rest) = frames.split_first_mut()?;
                Some(datapath::xdp_tcp::engine::copy_to_pieces(
                    &template[..size],
                    first,
                    rest,
                ))
            }),
        }
        .map_err(|e| e.to_string())?;
        sent += k as u64;
        if k < n {
            sock.flush().map_err(|e| e.to_string())?;
        }
        progress.tick(sent, count);
    }
    let drained = sock
        .drain_tx(Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    if !drained {
        return Err(format!(
            "{} frames still not completed after 10 s",
            sock.tx_in_flight()
        ));
    }
    if let Some(src) = &source {
        // The sums stand for the TCP checksums the engine would write; one line keeps them.
        std::hint::black_box(src.sums);
    }
    let st = sock.stats();
    let bw = BandwidthResult::new(size as u64, st.tx_completed, seconds);
    print_bw(
        o,
        &BwReport {
            test: "tx",
            iface: &o.iface,
            queues: vec![queue],
            xdp_mode: None,
            zero_copy: sock.is_zero_copy(),
            frame_bytes: size,
            expected: count,
            frames: st.tx_completed,
            source_mib: o.source_mib,
            payload_gbit_per_sec: payload_gbit(size, &bw),
            bw,
            kernel_drops: st.tx_invalid_descs,
        },
    );
    Ok(())
}

fn rx(o: &Opts) -> Res<()> {
    let count = o.count.unwrap_or(1_000_000);
    let (info, _) = facts(o)?;
    let timeout = secs(o.timeout, "timeout")?;
    let idle = secs(o.idle, "idle")?;
    let (prog, active, mut socks) = steer(o, &info)?;
    eprintln!(
        "{RX_READY} {}; expecting {count} frames",
        describe(o, Some(active), &socks)
    );
    let before = prog.counters().map_err(|e| e.to_string())?;
    let mut progress = Progress::new(o.quiet, "rx");
    let start = Instant::now();
    let mut first: Option<Instant> = None;
    let mut last = start;
    let mut frames = 0u64;
    // The frames of the first batch arrived before the clock started: the rate counts those
    // after it (N frames are timed over N - 1 gaps, a batch at a time).
    let mut before_clock = 0u64;
    let mut bytes = 0u64;
    while frames < count {
        let mut got = 0;
        for s in socks.iter_mut() {
            let b = s.recv_batch(64);
            got += b.len();
            for f in b.iter() {
                bytes += f.len() as u64;
            }
        }
        if got > 0 {
            frames += got as u64;
            last = Instant::now();
            if first.is_none() {
                first = Some(last);
                before_clock = frames;
            }
            progress.tick(frames, count);
            continue;
        }
        let now = Instant::now();
        match first {
            None if now.duration_since(start) > timeout => {
                return Err(format!("no frame arrived within {timeout:?}"));
            }
            Some(_) if now.duration_since(last) > idle => break,
            _ => progress.tick(frames, count),
        }
    }
    let seconds = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let timed = frames - before_clock;
    if timed == 0 || seconds <= 0.0 {
        return Err(format!(
            "all {frames} frames arrived in one batch: no time to measure a rate over \
             (give a larger --count)"
        ));
    }
    let c = prog.counters().map_err(|e| e.to_string())?.since(&before);
    let drops: u64 = socks
        .iter()
        .map(|s| {
            let st = s.stats();
            st.rx_dropped + st.rx_ring_full
        })
        .sum();
    let size = bytes.checked_div(frames).map_or(o.size, |b| b as usize);
    let bw = BandwidthResult::new(size as u64, timed, seconds);
    print_bw(
        o,
        &BwReport {
            test: "rx",
            iface: &o.iface,
            queues: socks.iter().map(|s| s.queue()).collect(),
            xdp_mode: Some(active.to_string()),
            zero_copy: socks[0].is_zero_copy(),
            frame_bytes: size,
            expected: count,
            frames,
            source_mib: None,
            payload_gbit_per_sec: payload_gbit(size, &bw),
            bw,
            kernel_drops: drops,
        },
    );
    if !o.json {
        println!(
            "raw rx: XDP counters: redirected {}, passed {}, no socket {}",
            c.redirected, c.passed, c.no_socket
        );
        for s in &socks {
            let st = s.stats();
            println!(
                "raw rx: queue {}: {} frames, dropped {}, RX ring full {}, fill ring empty {}",
                s.queue(),
                st.rx_frames,
                st.rx_dropped,
                st.rx_ring_full,
                st.fill_ring_empty
            );
        }
    }
    if frames < count {
        return Err(format!(
            "received {frames} of {count} frames (nothing for {idle:?})"
        ));
    }
    Ok(())
}

/// The responder's echo of `frame`, written into `scratch`: the frame with its addresses and
/// ports swapped ([`swap_endpoints`]). Its length, or `None` for a frame it cannot answer: one
/// longer than `scratch`, or not a whole IPv4/TCP frame.
fn echo_into(frame: &[u8], scratch: &mut [u8]) -> Option<usize> {
    let echo = scratch.get_mut(..frame.len())?;
    echo.copy_from_slice(frame);
    swap_endpoints(echo).then_some(frame.len())
}

/// The responder: echoes every frame steered to the port, addresses and ports swapped, until it
/// has answered `--count` plus `--warmup` of them or nothing came for `--idle` seconds. Frames
/// it cannot answer ([`echo_into`], or no TX frame free to send the echo in) are counted and
/// reported at the end (the first one when it comes).
fn pong(o: &Opts) -> Res<()> {
    // (Checked by `validate`.)
    let count = o.count.unwrap_or(10_000).saturating_add(o.warmup);
    let (info, _) = facts(o)?;
    let timeout = secs(o.timeout, "timeout")?;
    let idle = secs(o.idle, "idle")?;
    let (_prog, active, mut socks) = steer(o, &info)?;
    eprintln!(
        "{PONG_READY} {}; answering up to {count} frames",
        describe(o, Some(active), &socks)
    );
    // Room for the largest packet a socket delivers: one UMEM frame's, or at a jumbo MTU
    // (multi-buffer) the several frames' of a packet, which arrives joined.
    let room = socks
        .iter()
        .map(XskSocket::packet_capacity)
        .max()
        .unwrap_or(0);
    let mut scratch = vec![0u8; room];
    let start = Instant::now();
    let mut last: Option<Instant> = None;
    let mut answered = 0u64;
    let mut unanswered = 0u64;
    while answered < count {
        let mut any = false;
        for s in socks.iter_mut() {
            let (len, got) = {
                let b = s.recv_batch(1);
                let Some(f) = b.get(0) else {
                    continue;
                };
                (echo_into(f, &mut scratch), f.len())
            };
            any = true;
            let sent = match len {
                Some(len) => {
                    let frame = &scratch[..len];
                    s.send_batch(1, |_, buf| {
                        buf[..frame.len()].copy_from_slice(frame);
                        frame.len()
                    })
                    .map_err(|e| e.to_string())?
                }
                None => 0,
            };
            if sent == 1 {
                answered += 1;
                continue;
            }
            if unanswered == 0 {
                eprintln!(
                    "raw pingpong: responder cannot answer a frame of {got} octets ({}); counting \
                     such frames",
                    if len.is_none() {
                        format!("not a whole IPv4/TCP frame of at most {room} octets")
                    } else {
                        "no TX frame free for its echo".to_string()
                    }
                );
            }
            unanswered += 1;
        }
        let now = Instant::now();
        if any {
            last = Some(now);
            continue;
        }
        match last {
            None if now.duration_since(start) > timeout => {
                return Err(format!("no frame arrived within {timeout:?}"));
            }
            Some(l) if now.duration_since(l) > idle => break,
            _ => {}
        }
        for s in socks.iter_mut() {
            s.flush().map_err(|e| e.to_string())?;
        }
    }
    eprintln!("raw pingpong: responder answered {answered} frames, could not answer {unanswered}");
    Ok(())
}

#[derive(Serialize)]
struct LatReport<'a> {
    test: &'a str,
    iface: &'a str,
    xdp_mode: String,
    lost: u64,
    #[serde(flatten)]
    lat: LatencyResult,
}

/// The initiator: one frame out, wait for its echo (a second at most), `count` times after
/// `warmup`. Stops with an error once `--timeout` seconds pass without a reply, from the first
/// ping or since the last reply: the responder is not answering (not started, on another port,
/// ended, or unable to echo these frames).
fn ping(o: &Opts) -> Res<()> {
    let count = o.count.unwrap_or(10_000);
    if count == 0 {
        return Err("--count must be at least 1".into());
    }
    let (info, src_ip) = facts(o)?;
    let give_up = secs(o.timeout, "timeout")?;
    let spec = spec_for(o, &info, src_ip)?;
    let (_prog, active, mut socks) = steer(o, &info)?;
    let tx_index = socks
        .iter()
        .position(|s| Some(s.queue()) == o.queue || o.queue.is_none())
        .unwrap_or(0);
    if !o.quiet {
        eprintln!(
            "raw pingpong: {count} iterations of {} octets to {}:{} via {}",
            o.size,
            spec.dst_ip,
            o.port,
            describe(o, Some(active), &socks)
        );
    }
    let reply_wait = Duration::from_secs(1).min(give_up);
    let mut frame = vec![0u8; o.size];
    let mut samples = Vec::with_capacity(count.min(MAX_PING_SAMPLES) as usize);
    let mut lost = 0u64;
    let mut replies = 0u64;
    // Since the last reply (or the first ping), and the pings lost since.
    let mut last_reply = Instant::now();
    let mut lost_in_a_row = 0u64;
    let mut progress = Progress::new(o.quiet, "pingpong");
    // (Checked by `validate`.)
    let total = o.warmup.saturating_add(count);
    for i in 0..total {
        let seq = i as u32;
        let size = frame_into(&mut frame, &TcpFrameSpec { seq, ..spec }, o.size);
        let t0 = Instant::now();
        socks[tx_index]
            .send_batch(1, |_, buf| {
                buf[..size].copy_from_slice(&frame[..size]);
                size
            })
            .map_err(|e| e.to_string())?;
        let mut rtt = None;
        'wait: loop {
            for s in socks.iter_mut() {
                let b = s.recv_batch(64);
                for f in b.iter() {
                    if let Some(t) = TcpFrame::parse(f) {
                        // (Not the peer kernel's reset of a frame no responder took: its seq is
                        // the frame's ack, 0, as iteration 0's.)
                        if t.seq() == seq
                            && t.src_port() == o.port
                            && t.src_ip() == spec.dst_ip
                            && t.flags() & tcp_flags::RST == 0
                        {
                            rtt = Some(t0.elapsed());
                        }
                    }
                }
                if rtt.is_some() {
                    break 'wait;
                }
            }
            if t0.elapsed() > reply_wait {
                break;
            }
        }
        for s in socks.iter_mut() {
            s.complete();
        }
        if rtt.is_some() {
            last_reply = Instant::now();
            lost_in_a_row = 0;
        }
        match rtt {
            Some(d) if i >= o.warmup => {
                replies += 1;
                if (samples.len() as u64) < MAX_PING_SAMPLES {
                    samples.push(d.as_secs_f64() * 1e6 / 2.0);
                }
            }
            Some(_) => {}
            None => {
                lost += 1;
                lost_in_a_row += 1;
                if last_reply.elapsed() >= give_up {
                    return Err(format!(
                        "the responder is not answering: no reply from {}:{} for {give_up:?} \
                         ({lost_in_a_row} ping(s) in a row lost, {} answered before); is \
                         `iwarp-bench raw pingpong` without --dst-ip running there on --port {} \
                         (started first, \"ready\"), and does it take frames of {} octets?",
                        spec.dst_ip,
                        o.port,
                        i + 1 - lost,
                        o.port,
                        o.size
                    ));
                }
            }
        }
        progress.tick(i + 1, total);
    }
    if replies > samples.len() as u64 {
        eprintln!(
            "raw pingpong: the latency figures are of the first {} of {replies} round trips \
             (at most {MAX_PING_SAMPLES} samples are kept)",
            samples.len()
        );
    }
    let lat = LatencyResult::from_samples(o.size as u64, &mut samples);
    if o.json {
        let r = LatReport {
            test: "pingpong",
            iface: &o.iface,
            xdp_mode: active.to_string(),
            lost,
            lat,
        };
        println!(
            "{}",
            serde_json::to_string(&r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        println!("{}", report::LAT_HEADER);
        println!("{}", report::lat_row(&lat));
        println!("raw pingpong: latency = round trip / 2; {lost} frame(s) lost");
    }
    if samples.is_empty() {
        return Err("no reply arrived".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_source_moves_the_region_with_its_crc_and_wraps() {
        let frame = 1514;
        let mut src = PayloadSource::new(1, frame).expect("source");
        assert_eq!(src.len, frame - ENGINE_PAYLOAD_AT - 4);
        let template: Vec<u8> = (0..frame).map(|i| (i * 7) as u8).collect();
        let payloads = src.span / src.len;
        let mut buf = vec![0u8; frame];
        let mut want = vec![0u8; src.len];
        for k in 0..payloads + 2 {
            src.fill(&mut buf, &template);
            assert_eq!(
                buf[..ENGINE_PAYLOAD_AT],
                template[..ENGINE_PAYLOAD_AT],
                "frame {k}"
            );
            // The region's octets, walked in order and from the start again after the last
            // whole payload.
            let at = (k % payloads) * src.len;
            src.region.read_at(at, &mut want);
            let payload = &buf[ENGINE_PAYLOAD_AT..ENGINE_PAYLOAD_AT + src.len];
            assert_eq!(payload, &want[..], "frame {k}");
            let crc = mpa::crc::crc32c(payload);
            assert_eq!(buf[frame - 4..], crc.to_le_bytes(), "frame {k}");
        }
    }

    /// The responder's echo: a jumbo frame (8000 octets, more than one 4 KiB UMEM frame) is
    /// echoed whole, addresses and ports swapped, given the room; a frame longer than the room,
    /// or not IPv4/TCP, is refused (counted by the responder), never cut.
    #[test]
    fn echo_swaps_whole_frames_and_refuses_what_it_cannot_answer() {
        let spec = TcpFrameSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: Ipv4Addr::new(10, 77, 0, 2),
            dst_ip: Ipv4Addr::new(10, 77, 0, 1),
            src_port: 40000,
            dst_port: 18620,
            seq: 7,
            ack: 0,
            flags: tcp_flags::ACK | tcp_flags::PSH,
            window: 65535,
            ip_id: 0,
        };
        let mut frame = vec![0u8; 8000];
        assert_eq!(frame_into(&mut frame, &spec, 8000), 8000);
        let mut scratch = vec![0u8; 4 * 3840];
        assert_eq!(echo_into(&frame, &mut scratch), Some(8000));
        let echo = TcpFrame::parse(&scratch[..8000]).expect("a whole IPv4/TCP frame");
        assert_eq!((echo.src_ip(), echo.dst_ip()), (spec.dst_ip, spec.src_ip));
        assert_eq!((echo.src_port(), echo.dst_port()), (18620, 40000));
        assert_eq!(echo.seq(), 7);
        assert_eq!(echo.payload(), &frame[HEADERS_LEN..]);
        // What the responder once did with a 4096-octet scratch: cut, so not a whole frame.
        assert_eq!(echo_into(&frame, &mut [0u8; 4096]), None);
        assert_eq!(echo_into(&frame[..4096], &mut scratch), None);
        assert_eq!(echo_into(&[0u8; 60], &mut scratch), None);
    }

    #[test]
    fn payload_source_refuses_what_it_cannot_do() {
        for mib in [0, 4097] {
            let e = PayloadSource::new(mib, 1514).err().expect("refused");
            assert!(e.contains("out of range"), "{e}");
        }
        for frame in [54, ENGINE_PAYLOAD_AT + 4] {
            let e = PayloadSource::new(1, frame).err().expect("refused");
            assert!(e.contains("--size of at least 87"), "{e}");
        }
        assert!(PayloadSource::new(1, ENGINE_PAYLOAD_AT + 5).is_ok());
    }
}
