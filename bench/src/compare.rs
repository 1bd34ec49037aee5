//! `iwarp-bench compare`: one command for the side-by-side comparison that `docs/BENCHMARKS.md`
//! asks for. It brings up the veth bed (`scripts/netns.sh up`), then runs, alternating in
//! rounds (the machine drifts: alternating puts every transport under the same drift), raw
//! AF_XDP, the AF_XDP engine, the socket transport and iperf3 (kernel TCP) for one test at one
//! size or a sweep of sizes, each run a server in `iwa` and a client in `iwb`; prints each
//! transport's median with the engine's ratio to the others, writes every round as JSON
//! (`--json`) and draws the sweep (`--plot FILE.svg`: one line per transport against the
//! message size).
//!
//! * `bw`: Gbit/s. The engine and the socket transport: `write-bw`. Raw AF_XDP: `raw tx` to
//!   `raw rx` of full-MTU frames (as many as the engine's FPDUs would take at full size,
//!   20,000 to 100,000), its TCP-payload goodput: the ceiling of the bed at that MTU, the same
//!   at every message size. iperf3: the same octets as the engine's in writes of the message
//!   size.
//! * `read-bw`: Gbit/s of `read-bw` for the engine and the socket transport (the data flows
//!   from the server to the client); raw AF_XDP and iperf3 as for `bw` but the other way, from
//!   the server's namespace (and, `--pinned`, its CPU) to the client's, as the engine's data
//!   goes ([`data_path`]).
//! * `lat`: microseconds, the median half round trip. The engine and the socket transport:
//!   `write-lat`. Raw AF_XDP: `raw pingpong` with frames of the message size plus headers, one
//!   Ethernet frame each way, so at most [`raw_lat_max`] octets of message: raw sits out the
//!   larger sizes (said on stderr, "-" in the table, `"not_run"` in the JSON). iperf3 measures
//!   no latency and is left out.
//!
//! SIGINT (Ctrl-C) or SIGTERM asks the comparison to stop ([`crate::interrupt`]): every wait
//! for a child looks at the request every [`POLL`], the running measurement's children are
//! stopped and reaped, no further one starts, the medians of the runs done are printed (and
//! written, `"interrupted"` in the JSON), the bed goes down as at a normal end, and the process
//! exits with 128 + the signal's number (130 for SIGINT). A second signal ends it at once.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use serde::Serialize;
use serde_json::Value;

/// Runs of raw AF_XDP bandwidth before a comparison gives up on frames lost each time.
const RAW_ATTEMPTS: u32 = 3;

/// How often a wait for a child looks at [`crate::interrupt::requested`]: a SIGINT or SIGTERM
/// stops the running children within this (and the time to reap them).
const POLL: Duration = Duration::from_millis(20);

/// The error of a wait cut short by SIGINT or SIGTERM: no failure of the measurement (the
/// comparison stops there and leaves it out).
const INTERRUPTED: &str = "interrupted";

/// The bed's namespaces, interfaces and server address (`scripts/netns.sh`).
const NS_SERVER: &str = "iwa";
const NS_CLIENT: &str = "iwb";
const DEV_SERVER: &str = "iwa0";
const DEV_CLIENT: &str = "iwb0";
const SERVER_IP: &str = "10.77.0.1";
const CLIENT_IP: &str = "10.77.0.2";
/// Octets of Ethernet, IPv4 and TCP headers in a raw frame.
const FRAME_HEADERS: u64 = 54;
/// The most iterations a run takes (`-n`): with the largest size (8 MiB) the octets of a run
/// stay far below 2^64, and a latency run of this many is already hours long.
const MAX_ITERS: u64 = 1_000_000_000;

/// The largest message raw ping-pong carries on a bed of `mtu`: it sends each message in one
/// Ethernet frame of at most MTU + 14 octets (over several UMEM frames above MTU 3826, but one
/// frame on the wire), its 54 octets of headers included.
fn raw_lat_max(mtu: u64) -> u64 {
    mtu + 14 - FRAME_HEADERS
}

/// Whether transport `t` runs test `k` at message `size` on a bed of `mtu`: all do, except
/// iperf3 for `lat` (no latency test) and raw ping-pong above [`raw_lat_max`].
fn runs(k: Kind, t: Which, size: u64, mtu: u64) -> bool {
    match (k, t) {
        (Kind::Lat, Which::Iperf3) => false,
        (Kind::Lat, Which::Raw) => size <= raw_lat_max(mtu),
        _ => true,
    }
}

/// Where a bandwidth test's data goes on the bed: from `tx_ns` (its interface `tx_dev`, on the
/// server's CPU with `--pinned` when `tx_is_server`) to `rx_ns` (`rx_dev`, address `rx_ip`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DataPath {
    tx_ns: &'static str,
    tx_dev: &'static str,
    tx_is_server: bool,
    rx_ns: &'static str,
    rx_dev: &'static str,
    rx_ip: &'static str,
}

/// The way `k`'s data goes: client to server for `write-bw`, server to client for `read-bw`
/// (the Read Responses); raw AF_XDP and iperf3 send theirs the same way, so that each
/// comparison puts the sender on the same side (and CPU).
fn data_path(k: Kind) -> DataPath {
    let to_server = DataPath {
        tx_ns: NS_CLIENT,
        tx_dev: DEV_CLIENT,
        tx_is_server: false,
        rx_ns: NS_SERVER,
        rx_dev: DEV_SERVER,
        rx_ip: SERVER_IP,
    };
    match k {
        Kind::ReadBw => DataPath {
            tx_ns: NS_SERVER,
            tx_dev: DEV_SERVER,
            tx_is_server: true,
            rx_ns: NS_CLIENT,
            rx_dev: DEV_CLIENT,
            rx_ip: CLIENT_IP,
        },
        Kind::Bw | Kind::Lat => to_server,
    }
}

/// TCP payload of one engine frame at `mtu` (IPv4 and TCP headers, timestamps, MPA and tagged
/// DDP headers off).
fn engine_payload(mtu: u64) -> u64 {
    mtu - 40 - 12 - 6 - 14
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    /// Gbit/s of `write-bw`.
    Bw,
    /// Gbit/s of `read-bw` (raw AF_XDP and iperf3 as for `bw`: the bed's two directions are
    /// alike).
    ReadBw,
    /// The median half round trip of `write-lat`.
    Lat,
}

impl Kind {
    /// A bandwidth test (Gbit/s).
    fn is_bw(self) -> bool {
        matches!(self, Kind::Bw | Kind::ReadBw)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Which {
    /// Raw AF_XDP (no TCP): the ceiling.
    Raw,
    /// The AF_XDP engine (`--transport xdp`).
    Xdp,
    /// The socket transport (kernel TCP).
    Socket,
    /// iperf3 over kernel TCP (bw only).
    Iperf3,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Raw => "raw",
            Which::Xdp => "xdp",
            Which::Socket => "socket",
            Which::Iperf3 => "iperf3",
        }
    }
}

/// Compare transports side by side on the veth bed (root).
#[derive(Parser, Debug)]
#[command(name = "iwarp-bench compare")]
struct CompareCli {
    /// `bw`: Gbit/s (write-bw); `read-bw`: Gbit/s (read-bw); `lat`: median half round trip in
    /// us (write-lat).
    #[arg(long, value_enum, default_value_t = Kind::Bw)]
    test: Kind,
    /// Message sizes (comma-separated or repeated); default 65536 (bw) or 64 (lat).
    #[arg(short, long, value_delimiter = ',')]
    size: Vec<u64>,
    /// A sweep: every power of two from 1 KiB (bw) or 64 B (lat) to 1 MiB (bw) or 8 KiB (lat).
    /// In lat, raw AF_XDP (one Ethernet frame per message) sits out the sizes above MTU - 40
    /// (above 1 KiB at MTU 1500; --mtu 9000 takes it to 8 KiB).
    #[arg(short = 'a', long)]
    sweep: bool,
    /// Iterations per run, 1 to 1000000000 (default: 2000 for bw, 10000 for lat).
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(1..=MAX_ITERS))]
    iters: Option<u64>,
    /// Rounds; each runs every transport at every size once, in an order that rotates.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// Transports to compare (comma-separated; iperf3 only for bw).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Which::Raw, Which::Xdp, Which::Socket, Which::Iperf3])]
    transports: Vec<Which>,
    /// Pin servers to CPU 0 and clients to CPU 1 (taskset).
    #[arg(long)]
    pinned: bool,
    /// Write every round and the medians to this file as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw the medians against the message size to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// The bed's MTU (both veth ends): above 3826 the engine and raw AF_XDP use multi-buffer
    /// AF_XDP (a packet over several UMEM frames).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u64).range(1280..=9000))]
    mtu: u64,
    /// Leave the kernel's TX offloads (checksum, TSO/GSO) on for the socket transport and
    /// iperf3 (the bed turns them off, since kernel TCP on veth otherwise sends partial
    /// checksums that a peer outside the kernel, the engine, cannot check; runs here never
    /// mix the two).
    #[arg(long)]
    offloads: bool,
}

/// A measurement that failed: the comparison goes on without it and says so at the end.
#[derive(Debug, Clone, Serialize)]
struct Failure {
    round: u32,
    size: u64,
    transport: Which,
    error: String,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    round: u32,
    size: u64,
    transport: Which,
    value: f64,
    /// `lat`: the run's 99th percentile (us).
    #[serde(skip_serializing_if = "Option::is_none")]
    p99: Option<f64>,
}

pub fn main(args: impl Iterator<Item = String>) -> ExitCode {
    let cli: CompareCli = match crate::parse_args(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let result = run(&cli);
    if let Err(e) = &result {
        note(&format!("iwarp-bench compare: {e}"));
    }
    match crate::interrupt::signal() {
        // Stopped by a signal: it ends the process once the cleanup is done, as it would have
        // uncaught (a shell's loop around compare stops too); 128 + its number should it not.
        Some(sig) => {
            note(&format!(
                "iwarp-bench compare: interrupted by {}",
                crate::interrupt::name(sig)
            ));
            crate::interrupt::end_by(sig);
            ExitCode::from(crate::interrupt::exit_code(sig))
        }
        None if result.is_ok() => ExitCode::SUCCESS,
        None => ExitCode::FAILURE,
    }
}

/// Writes `text` to standard output, ignoring a failure: after Ctrl-C a `| tee` reading it
/// may be gone (print! would panic, and the JSON and the bed's cleanup after it would not
/// happen).
fn out(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().write_all(text.as_bytes());
}

/// A line to standard error, ignoring a failure, as [`out`].
fn note(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn run(cli: &CompareCli) -> Result<(), String> {
    // From the start: a signal before the bed is up ends the run before it comes up, and
    // children of ours never inherit the handler (exec resets it).
    crate::interrupt::install()?;
    if let Some(p) = &cli.plot {
        if p.extension().and_then(|e| e.to_str()) != Some("svg") {
            return Err("--plot draws SVG: give a FILE.svg".into());
        }
    }
    let mut transports = cli.transports.clone();
    transports.sort();
    transports.dedup();
    if cli.test == Kind::Lat && transports.contains(&Which::Iperf3) {
        eprintln!("iwarp-bench compare: iperf3 measures no latency: left out of lat");
        transports.retain(|&t| t != Which::Iperf3);
    }
    if transports.is_empty() {
        return Err("no transport to compare".into());
    }
    if transports.contains(&Which::Iperf3) {
        // Before the first round, not after the others' runs of it.
        let found = Command::new("iperf3")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Err(
                "iperf3 not found: install it (scripts/install-deps.sh does) or \
                 leave it out (--transports)"
                    .into(),
            );
        }
    }
    let sizes = sizes(cli)?;
    // The (size, transport) pairs asked for that do not run: raw ping-pong above one frame.
    let not_run: Vec<(u64, Which)> = wanted_sizes(cli)?
        .iter()
        .flat_map(|&s| transports.iter().map(move |&t| (s, t)))
        .filter(|&(s, t)| !runs(cli.test, t, s, cli.mtu))
        .collect();
    if !not_run.is_empty() {
        eprintln!("iwarp-bench compare: {}", raw_sits_out(cli.mtu, &not_run));
    }
    let iters = cli
        .iters
        .unwrap_or(if cli.test.is_bw() { 2000 } else { 10_000 });
    // The bed's lock (other bed users wait, as we wait for them), a fresh bed, taken down
    // when the run ends.
    let _bed = testbed::Bed::up_unless(&crate::interrupt::requested)?;
    bed_settings(cli)?;
    let me = std::env::current_exe().map_err(|e| format!("finding iwarp-bench itself: {e}"))?;
    let mut runner = Runner {
        me,
        pinned: cli.pinned,
        port: 18_900,
        mtu: cli.mtu,
    };
    let mut samples = Vec::new();
    let mut failures = Vec::new();
    let runs_per_round: usize = sizes
        .iter()
        .map(|&s| {
            transports
                .iter()
                .filter(|&&t| runs(cli.test, t, s, cli.mtu))
                .count()
        })
        .sum();
    let total = cli.rounds as usize * runs_per_round;
    'rounds: for round in 0..cli.rounds {
        for &size in &sizes {
            // Rotate the order each round: no transport always runs first.
            let k = round as usize % transports.len();
            for &t in transports[k..].iter().chain(&transports[..k]) {
                if !runs(cli.test, t, size, cli.mtu) {
                    continue;
                }
                if crate::interrupt::requested() {
                    break 'rounds;
                }
                let done = samples.len() + failures.len() + 1;
                match runner.measure(cli.test, t, size, iters) {
                    Ok((value, p99)) => {
                        samples.push(Sample {
                            round,
                            size,
                            transport: t,
                            value,
                            p99,
                        });
                        eprintln!(
                            "iwarp-bench compare: [{done}/{total}] round {} {} {size} B: \
                             {value:.2} {}",
                            round + 1,
                            t.name(),
                            unit(cli.test)
                        );
                    }
                    // A run cut short by SIGINT or SIGTERM is no failure: the comparison ends
                    // with the runs done before it.
                    Err(_) if crate::interrupt::requested() => {
                        eprintln!(
                            "iwarp-bench compare: [{done}/{total}] round {} {} {size} B: \
                             interrupted (its children stopped)",
                            round + 1,
                            t.name()
                        );
                        break 'rounds;
                    }
                    // One failed run does not throw away the others: it is left out of the
                    // medians and reported at the end.
                    Err(error) => {
                        eprintln!(
                            "iwarp-bench compare: [{done}/{total}] round {} FAILED: {error}",
                            round + 1
                        );
                        failures.push(Failure {
                            round,
                            size,
                            transport: t,
                            error,
                        });
                    }
                }
            }
        }
    }
    let interrupted = crate::interrupt::signal().map(crate::interrupt::name);
    if let Some(sig) = &interrupted {
        note(&format!(
            "iwarp-bench compare: stopping after {} of {total} runs ({sig}): the results \
             below are of those only; the bed goes down",
            samples.len() + failures.len()
        ));
    }
    let p99s = medians(&samples, |s| s.p99);
    let medians = medians(&samples, |s| Some(s.value));
    out(&table(
        cli.test,
        "",
        cli.rounds,
        &sizes,
        &transports,
        &medians,
    ));
    if cli.test == Kind::Lat {
        out(&table(
            cli.test,
            " p99",
            cli.rounds,
            &sizes,
            &transports,
            &p99s,
        ));
    }
    if let Some(path) = &cli.json {
        let out = serde_json::json!({
            "test": test_name(cli.test),
            "unit": unit(cli.test),
            "iterations": iters,
            "pinned": cli.pinned,
            // The signal that stopped the run early (null: it ran to its end).
            "interrupted": interrupted,
            "rounds": samples,
            "failed": failures,
            "not_run": not_run
                .iter()
                .map(|&(size, t)| serde_json::json!({
                    "size": size,
                    "transport": t,
                    "why": format!(
                        "raw ping-pong carries at most {} B at MTU {} (one frame)",
                        raw_lat_max(cli.mtu),
                        cli.mtu
                    ),
                }))
                .collect::<Vec<_>>(),
            "medians": medians
                .iter()
                .map(|((size, t), v)| {
                    let mut m = serde_json::json!({"size": size, "transport": t, "value": v});
                    if let Some(p) = p99s.get(&(*size, *t)) {
                        m["p99"] = serde_json::json!(p);
                    }
                    m
                })
                .collect::<Vec<_>>(),
        });
        std::fs::write(path, format!("{out:#}\n"))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &cli.plot {
        plot(path, cli.test, &sizes, &transports, &medians)?;
    }
    if !failures.is_empty() {
        return Err(format!(
            "{} of {total} runs failed (left out of the medians; see above{})",
            failures.len(),
            if cli.json.is_some() {
                " and \"failed\" in the JSON"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

/// `--mtu` and `--offloads` on both ends of the bed just brought up.
fn bed_settings(cli: &CompareCli) -> Result<(), String> {
    for (ns, dev) in [(NS_SERVER, DEV_SERVER), (NS_CLIENT, DEV_CLIENT)] {
        let mut cmds: Vec<Vec<String>> = Vec::new();
        {
            cmds.push(
                [
                    "ip",
                    "-n",
                    ns,
                    "link",
                    "set",
                    "dev",
                    dev,
                    "mtu",
                    &cli.mtu.to_string(),
                ]
                .map(String::from)
                .to_vec(),
            );
        }
        if cli.offloads {
            cmds.push(
                ["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "on"]
                    .map(String::from)
                    .to_vec(),
            );
        }
        for cmd in cmds {
            let out = output(Command::new(&cmd[0]).args(&cmd[1..]))
                .map_err(|e| format!("{}: {e}", cmd.join(" ")))?;
            if !out.status.success() {
                return Err(format!(
                    "{}: {}",
                    cmd.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }
    Ok(())
}

/// The message sizes to run: [`wanted_sizes`] less those no transport runs ([`runs`]: raw alone
/// in `lat`, above [`raw_lat_max`]); none left is an error.
fn sizes(cli: &CompareCli) -> Result<Vec<u64>, String> {
    let wanted = wanted_sizes(cli)?;
    let mut sizes = wanted.clone();
    sizes.retain(|&s| {
        cli.transports
            .iter()
            .any(|&t| runs(cli.test, t, s, cli.mtu))
    });
    if sizes.is_empty() {
        let not_run: Vec<(u64, Which)> = wanted.iter().map(|&s| (s, Which::Raw)).collect();
        return Err(format!(
            "nothing to run: {}",
            raw_sits_out(cli.mtu, &not_run)
        ));
    }
    Ok(sizes)
}

/// The message sizes asked for (`-s`, `-a`, or the test's default), sorted, each once, from 1 B
/// to 8 MiB.
fn wanted_sizes(cli: &CompareCli) -> Result<Vec<u64>, String> {
    let mut sizes = if cli.sweep {
        let (lo, hi) = match cli.test {
            Kind::Bw | Kind::ReadBw => (10, 20),
            Kind::Lat => (6, 13),
        };
        (lo..=hi).map(|p| 1u64 << p).collect()
    } else if cli.size.is_empty() {
        vec![if cli.test.is_bw() { 65536 } else { 64 }]
    } else {
        cli.size.clone()
    };
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.iter().any(|&s| s == 0 || s > 8 << 20) {
        return Err("sizes must be from 1 B to 8 MiB".into());
    }
    Ok(sizes)
}

/// Says why raw sits out the sizes of `not_run` (and how to have it run them).
fn raw_sits_out(mtu: u64, not_run: &[(u64, Which)]) -> String {
    let sizes: Vec<String> = not_run.iter().map(|(s, _)| format!("{s} B")).collect();
    format!(
        "raw ping-pong sends each message in one Ethernet frame of at most MTU + 14 octets, \
         so it carries at most {} B at MTU {mtu}: raw left out at {}{}",
        raw_lat_max(mtu),
        sizes.join(", "),
        if mtu < 9000 {
            format!(" (--mtu 9000 carries up to {} B)", raw_lat_max(9000))
        } else {
            String::new()
        }
    )
}

fn test_name(k: Kind) -> &'static str {
    match k {
        Kind::Bw => "write-bw",
        Kind::ReadBw => "read-bw",
        Kind::Lat => "write-lat",
    }
}

fn unit(k: Kind) -> &'static str {
    match k {
        Kind::Bw | Kind::ReadBw => "Gbit/s",
        Kind::Lat => "us",
    }
}

/// The median of `of` (where the sample has it) for each (size, transport).
fn medians(samples: &[Sample], of: impl Fn(&Sample) -> Option<f64>) -> BTreeMap<(u64, Which), f64> {
    let mut by: BTreeMap<(u64, Which), Vec<f64>> = BTreeMap::new();
    for s in samples {
        if let Some(v) = of(s) {
            by.entry((s.size, s.transport)).or_default().push(v);
        }
    }
    by.into_iter()
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            let m = if v.len() % 2 == 1 {
                v[v.len() / 2]
            } else {
                (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
            };
            (k, m)
        })
        .collect()
}

/// The medians per size, and the engine's ratio to each other transport (for lat, the
/// other's time over the engine's: above 1 means the engine is faster, as for bw).
fn table(
    k: Kind,
    what: &str,
    rounds: u32,
    sizes: &[u64],
    transports: &[Which],
    medians: &BTreeMap<(u64, Which), f64>,
) -> String {
    let mut out = format!(
        "compare: {}{what}, medians of {rounds} round(s), {}\n{:>9}",
        test_name(k),
        unit(k),
        "bytes"
    );
    for t in transports {
        out.push_str(&format!("{:>10}", t.name()));
    }
    let others: Vec<Which> = if transports.contains(&Which::Xdp) {
        transports
            .iter()
            .copied()
            .filter(|&t| t != Which::Xdp)
            .collect()
    } else {
        Vec::new()
    };
    // Each ratio is named as it is computed, and is above 1 where the engine does better: its
    // rate over the other's, or the other's time over its own.
    for t in &others {
        let name = match k {
            Kind::Bw | Kind::ReadBw => format!("xdp/{}", t.name()),
            Kind::Lat => format!("{}/xdp", t.name()),
        };
        out.push_str(&format!("{name:>13}"));
    }
    out.push('\n');
    for &size in sizes {
        out.push_str(&format!("{size:>9}"));
        // "-" where every run of a transport at this size failed.
        for &t in transports {
            match medians.get(&(size, t)) {
                Some(v) => out.push_str(&format!("{v:>10.2}")),
                None => out.push_str(&format!("{:>10}", "-")),
            }
        }
        let xdp = medians.get(&(size, Which::Xdp)).copied();
        for &t in &others {
            let ratio = xdp
                .zip(medians.get(&(size, t)).copied())
                .map(|(xdp, other)| match k {
                    Kind::Bw | Kind::ReadBw => xdp / other,
                    Kind::Lat => other / xdp,
                });
            match ratio {
                Some(r) => out.push_str(&format!("{r:>13.2}")),
                None => out.push_str(&format!("{:>13}", "-")),
            }
        }
        out.push('\n');
    }
    out
}

/// Runs the measurements as processes in the bed's namespaces.
struct Runner {
    me: PathBuf,
    pinned: bool,
    /// The next TCP port (each run its own: no TIME_WAIT clashes).
    port: u16,
    /// The bed's MTU.
    mtu: u64,
}

impl Runner {
    fn next_port(&mut self) -> String {
        self.port = if self.port >= 19_400 {
            18_900
        } else {
            self.port + 1
        };
        self.port.to_string()
    }

    /// `ip netns exec NS [taskset -c CPU] PROGRAM ARGS...`.
    fn command(&self, ns: &str, server: bool, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]);
        if self.pinned {
            c.args(["taskset", "-c", if server { "0" } else { "1" }]);
        }
        c.arg(program).args(args);
        c.stdin(Stdio::null());
        c
    }

    /// One run: its figure (Gbit/s, or the median half round trip in us) and, for `lat`, its
    /// 99th percentile.
    fn measure(
        &mut self,
        k: Kind,
        t: Which,
        size: u64,
        iters: u64,
    ) -> Result<(f64, Option<f64>), String> {
        let what = format!("{} {size} B", t.name());
        let v = match (k, t) {
            (Kind::Bw | Kind::ReadBw, Which::Raw) => {
                self.raw_bw(data_path(k), size, iters).map(|v| (v, None))
            }
            (Kind::Lat, Which::Raw) => self.raw_lat(size, iters),
            (_, Which::Xdp | Which::Socket) => self.bench_pair(k, t, size, iters),
            (Kind::Bw | Kind::ReadBw, Which::Iperf3) => {
                self.iperf3(data_path(k), size, iters).map(|v| (v, None))
            }
            (Kind::Lat, Which::Iperf3) => Err("iperf3 measures no latency".into()),
        }
        .map_err(|e| format!("{what}: {e}"))?;
        if !(v.0.is_finite() && v.0 > 0.0) {
            return Err(format!("{what}: no result ({})", v.0));
        }
        Ok(v)
    }

    /// iwarp-bench write-bw / write-lat over the engine or the socket transport.
    fn bench_pair(
        &mut self,
        k: Kind,
        t: Which,
        size: u64,
        iters: u64,
    ) -> Result<(f64, Option<f64>), String> {
        let port = self.next_port();
        let (size, iters) = (size.to_string(), iters.to_string());
        let common = [
            test_name(k),
            "-p",
            &port,
            "-s",
            &size,
            "-n",
            &iters,
            "--json",
        ];
        let (server_t, client_t): (&[&str], &[&str]) = match t {
            Which::Xdp => (
                &["--transport", "xdp", "--iface", DEV_SERVER],
                &["--transport", "xdp", "--iface", DEV_CLIENT],
            ),
            _ => (
                &["--transport", "socket", "--bind", SERVER_IP],
                &["--transport", "socket"],
            ),
        };
        let me = self.me.clone();
        // The server's stderr goes to a file, so that a failed run can say what the server
        // said (a client's "refused" is often all it knows).
        let (log, log_file) = TempLog::create(
            std::env::temp_dir().join(format!("iwarp-compare-{}-{port}.log", std::process::id())),
        )?;
        let server = self
            .command(NS_SERVER, true, &me, &[&common[..], server_t].concat())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(|e| format!("starting the server: {e}"))?;
        let client_args = [&common[..], client_t, &[SERVER_IP]].concat();
        let client = retry_while_refused(|| {
            output(&mut self.command(NS_CLIENT, false, &me, &client_args))
                .map_err(|e| format!("running the client: {e}"))
        });
        let client_ok = matches!(&client, Ok(out) if out.status.success());
        if client_ok {
            let _ = finish(server);
        } else {
            // Nothing more will come for it: no wait of a minute for it to give up, but a
            // moment to say why it failed if that is what failed the client.
            let mut server = server;
            let deadline = Instant::now() + Duration::from_secs(2);
            while matches!(server.try_wait(), Ok(None))
                && Instant::now() < deadline
                && !crate::interrupt::requested()
            {
                std::thread::sleep(POLL);
            }
            let _ = server.kill();
            let _ = server.wait();
        }
        let server_said = last_lines(&std::fs::read_to_string(&log.0).unwrap_or_default(), 3);
        drop(log);
        let with_server = |e: String| {
            if server_said.is_empty() {
                e
            } else {
                format!("{e} (the server: {server_said})")
            }
        };
        let out = client.map_err(with_server)?;
        if !out.status.success() {
            return Err(with_server(
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        let field = if k.is_bw() {
            "gbit_per_sec"
        } else {
            "t_typical_us"
        };
        let value = v["results"][0][field]
            .as_f64()
            .ok_or_else(|| format!("no {field} in {v}"))?;
        Ok((value, v["results"][0]["p99_us"].as_f64()))
    }

    /// Raw AF_XDP: `raw tx` to `raw rx`, full frames, as many as the engine's FPDUs would be.
    ///
    /// Raw AF_XDP has no retransmission: a run in which the receiver fell a ring behind and
    /// lost frames is no measurement, and is run again, up to [`RAW_ATTEMPTS`] times.
    fn raw_bw(&mut self, path: DataPath, size: u64, iters: u64) -> Result<f64, String> {
        for attempt in 1..RAW_ATTEMPTS {
            match self.raw_bw_once(path, size, iters)? {
                Some(v) => return Ok(v),
                None => eprintln!(
                    "iwarp-bench compare: raw rx lost frames; running it again ({attempt} of {} failed)",
                    RAW_ATTEMPTS
                ),
            }
        }
        self.raw_bw_once(path, size, iters)?.ok_or_else(|| {
            format!(
                "raw rx lost frames in {RAW_ATTEMPTS} runs in a row: see `iwarp-bench raw rx` (a larger --ring?)"
            )
        })
    }

    /// One `raw tx` to `raw rx` run along `path`: its goodput, or `None` if the receiver lost
    /// frames.
    fn raw_bw_once(
        &mut self,
        path: DataPath,
        size: u64,
        iters: u64,
    ) -> Result<Option<f64>, String> {
        // 20,000 to 100,000 frames (~30 to 150 MB): fewer measure the start more than the
        // rate; more only give the receiver more chances to fall a ring behind, and `raw rx`
        // fails a run that lost frames.
        let frames = (iters * size.div_ceil(engine_payload(self.mtu)))
            .clamp(20_000, 100_000)
            .to_string();
        let port = self.next_port();
        let frame = (self.mtu + 14).to_string();
        let me = self.me.clone();
        let rx_child = self
            .command(
                path.rx_ns,
                !path.tx_is_server,
                &me,
                &[
                    "raw",
                    "rx",
                    "--iface",
                    path.rx_dev,
                    "--size",
                    &frame,
                    "--count",
                    &frames,
                ],
            )
            .args([
                "--mode", "driver", "--port", &port, "--ring", "2048", "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting raw rx: {e}"))?;
        let mut rx = Reaped(Some(rx_child));
        wait_for_line(rx.child(), crate::raw::RX_READY, Duration::from_secs(20))
            .map_err(|e| format!("raw rx {e}"))?;
        let tx = output(
            self.command(
                path.tx_ns,
                path.tx_is_server,
                &me,
                &[
                    "raw",
                    "tx",
                    "--iface",
                    path.tx_dev,
                    "--size",
                    &frame,
                    "--count",
                    &frames,
                ],
            )
            .args(["--dst-ip", path.rx_ip, "--port", &port, "--quiet"]),
        )
        .map_err(|e| format!("running raw tx: {e}"))?;
        let rx = rx.finish()?;
        if !tx.status.success() {
            return Err(String::from_utf8_lossy(&tx.stderr).trim().to_owned());
        }
        let report = serde_json::from_slice::<Value>(&rx.stdout);
        if !rx.status.success() {
            // `raw rx` reports a run that ended short of its count, then fails it.
            return match report {
                Ok(v)
                    if matches!(
                        (v["frames"].as_u64(), v["expected"].as_u64()),
                        (Some(f), Some(e)) if f < e
                    ) =>
                {
                    Ok(None)
                }
                _ => Err(format!("raw rx failed ({})", rx.status)),
            };
        }
        let v = report.map_err(|e| format!("raw rx: {e}"))?;
        v["payload_gbit_per_sec"]
            .as_f64()
            .map(Some)
            .ok_or_else(|| format!("no payload_gbit_per_sec in {v}"))
    }

    /// Raw AF_XDP ping-pong of frames carrying `size` octets of payload: the responder is
    /// started and waited for (its "ready" line), then the initiator runs (it gives up after
    /// 10 s without a reply). A failure says what both said.
    fn raw_lat(&mut self, size: u64, iters: u64) -> Result<(f64, Option<f64>), String> {
        let port = self.next_port();
        let (count, frame) = (
            iters.to_string(),
            (size + FRAME_HEADERS).max(64).to_string(),
        );
        let me = self.me.clone();
        let responder_child = self
            .command(
                NS_SERVER,
                true,
                &me,
                &["raw", "pingpong", "--iface", DEV_SERVER, "--count", &count],
            )
            .args(["--mode", "driver", "--port", &port, "--quiet"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the raw responder: {e}"))?;
        let mut responder = Reaped(Some(responder_child));
        let mut said = wait_for_line(
            responder.child(),
            crate::raw::PONG_READY,
            Duration::from_secs(20),
        )
        .map_err(|e| format!("the raw responder {e}"))?;
        let out = output(
            self.command(
                NS_CLIENT,
                false,
                &me,
                &[
                    "raw", "pingpong", "--iface", DEV_CLIENT, "--dst-ip", SERVER_IP,
                ],
            )
            .args(["--size", &frame, "--count", &count, "--mode", "driver"])
            .args(["--port", &port, "--quiet", "--json"]),
        )
        .map_err(|e| format!("running the raw initiator: {e}"))?;
        if !out.status.success() {
            // The responder has nothing more to answer: a moment for its last words, not the
            // seconds it would wait idle.
            let responder_said = said.last(Duration::from_millis(500));
            drop(responder);
            return Err(format!(
                "{} (the responder: {})",
                last_lines(&String::from_utf8_lossy(&out.stderr), 3),
                if responder_said.is_empty() {
                    "nothing since its ready line"
                } else {
                    &responder_said
                }
            ));
        }
        let _ = responder.finish();
        let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        let value = v["t_typical_us"]
            .as_f64()
            .ok_or_else(|| format!("no t_typical_us in {v}"))?;
        Ok((value, v["p99_us"].as_f64()))
    }

    /// iperf3 (kernel TCP): the octets of `iters` messages, in writes of `size`, along `path`
    /// (`-R`: the server sends, when the data goes to the client).
    fn iperf3(&mut self, path: DataPath, size: u64, iters: u64) -> Result<f64, String> {
        let port = self.next_port();
        let iperf = PathBuf::from("iperf3");
        let server = self
            .command(NS_SERVER, true, &iperf, &["-s", "-1", "-p", &port])
            // Pipes, read at the end (a little text): with /dev/null for output, iperf3's
            // server was seen never to take the connection.
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting iperf3 -s: {e}"))?;
        // iperf3's client gives up on a refused connection in a way a quick retry does not
        // mend: let the server get to its listen first.
        std::thread::sleep(Duration::from_millis(300));
        let bytes = (size * iters).to_string();
        let len = size.min(1 << 20).to_string();
        let client = retry_while_refused(|| {
            let mut c = self.command(NS_CLIENT, false, &iperf, &["-c", SERVER_IP, "-p", &port]);
            c.args(["-n", &bytes, "-l", &len, "-J"]);
            if path.tx_is_server {
                c.arg("-R");
            }
            output(&mut c).map_err(|e| format!("running iperf3 -c: {e}"))
        });
        let _ = finish(server);
        let out = client?;
        let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("iperf3: {e}"))?;
        if let Some(e) = v["error"].as_str() {
            return Err(format!("iperf3: {e}"));
        }
        v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .map(|b| b / 1e9)
            .ok_or_else(|| "iperf3 reported no sum_received".to_string())
    }
}

/// Runs a client again while its server is not listening yet (connection refused), for up to
/// 10 s.
fn retry_while_refused(mut run: impl FnMut() -> Result<Output, String>) -> Result<Output, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if crate::interrupt::requested() {
            return Err(INTERRUPTED.into());
        }
        let out = run()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        let refused = text.contains("refused") || text.contains("Connection refused");
        if out.status.success() || !refused || Instant::now() > deadline {
            return Ok(out);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child process that is killed if it is dropped before [`Reaped::finish`] took it (an
/// error path must not leave a server holding the bed's XDP program or port).
struct Reaped(Option<Child>);

impl Reaped {
    fn child(&mut self) -> &mut Child {
        self.0
            .as_mut()
            .expect("taken only by finish, which consumes self")
    }

    fn finish(mut self) -> Result<Output, String> {
        finish(self.0.take().expect("taken only here"))
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A server's log file, removed when this goes (on every path out of a run).
struct TempLog(PathBuf);

impl TempLog {
    /// Creates `path` new: never writes through one someone else made there, nor a link they
    /// planted; one left by a run that was killed (same process number and port) is removed
    /// (a link itself, not what it names) and created again. With the file to write.
    fn create(path: PathBuf) -> Result<(TempLog, std::fs::File), String> {
        let open = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
        };
        let file = match open() {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let _ = std::fs::remove_file(&path);
                open()
            }
            other => other,
        };
        let file = file.map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((TempLog(path), file))
    }
}

impl Drop for TempLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The last `n` lines of `text` that say something, joined by " | ".
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Waits (bounded) for a child to end; kills it past 60 s, or at once when SIGINT or SIGTERM
/// asked the comparison to stop.
fn finish(mut child: Child) -> Result<Output, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline && !crate::interrupt::requested() => {
                std::thread::sleep(POLL)
            }
            _ => {
                let _ = child.kill();
                break;
            }
        }
    }
    child.wait_with_output().map_err(|e| e.to_string())
}

/// How long [`output`] waits, once its child has ended, for the child's stdout and stderr to
/// end (a process the child left behind may hold them open).
const PIPES_AFTER_EXIT: Duration = Duration::from_secs(5);

/// Reads `pipe` to its end on a thread; what it read comes on the channel.
fn read_to_end(
    pipe: Option<impl std::io::Read + Send + 'static>,
) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut all = Vec::new();
            let _ = pipe.read_to_end(&mut all);
            let _ = tx.send(all);
        });
    }
    rx
}

/// Runs `cmd` to its end as [`Command::output`] does (stdin empty, stdout and stderr captured,
/// read meanwhile), except that a SIGINT or SIGTERM asking the comparison to stop
/// ([`crate::interrupt::requested`], looked at every [`POLL`]) kills the child and reaps it:
/// then [`INTERRUPTED`].
fn output(cmd: &mut Command) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let (stdout, stderr) = (
        read_to_end(child.stdout.take()),
        read_to_end(child.stderr.take()),
    );
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if !crate::interrupt::requested() => std::thread::sleep(POLL),
            other => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(match other {
                    Err(e) => e.to_string(),
                    _ => INTERRUPTED.into(),
                });
            }
        }
    };
    let collect = |rx: std::sync::mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(PIPES_AFTER_EXIT).unwrap_or_default()
    };
    Ok(Output {
        status,
        stdout: collect(stdout),
        stderr: collect(stderr),
    })
}

/// How many of a child's last stderr lines [`StderrTail`] keeps for an error message.
const STDERR_KEPT: usize = 4;

/// A child's stderr, read to its end on a thread: the last [`STDERR_KEPT`] lines, for saying
/// why the child failed.
struct StderrTail {
    lines: std::sync::mpsc::Receiver<String>,
    kept: std::collections::VecDeque<String>,
}

impl StderrTail {
    /// Keeps `line` among the last ones (blank lines say nothing).
    fn keep(&mut self, line: String) {
        if line.trim().is_empty() {
            return;
        }
        if self.kept.len() == STDERR_KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back(line.trim().to_owned());
    }

    /// The last lines read so far (waiting up to `wait` for the child's stderr to end, for the
    /// lines of a child that has just ended), joined by " | ".
    fn last(&mut self, wait: Duration) -> String {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.keep(line),
                Err(_) => break,
            }
        }
        self.kept.iter().cloned().collect::<Vec<_>>().join(" | ")
    }
}

/// Reads `child`'s stderr until a line contains `what` (within `limit`); the rest is read on
/// to its end, its last lines kept (the tail returned). A child whose stderr ends first (it
/// ended, or failed to start) is reported at once with its last lines: "ended before it was
/// ready: ..."; a SIGINT or SIGTERM meanwhile ends the wait within [`POLL`] ([`INTERRUPTED`]).
fn wait_for_line(child: &mut Child, what: &str, limit: Duration) -> Result<StderrTail, String> {
    let err = child.stderr.take().ok_or("no stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    // Reads to the end even after the line came: a closed pipe would end the child at its
    // next progress line.
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut tail = StderrTail {
        lines: rx,
        kept: Default::default(),
    };
    let deadline = Instant::now() + limit;
    loop {
        if crate::interrupt::requested() {
            return Err(INTERRUPTED.into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tail.lines.recv_timeout(left.min(POLL)) {
            Ok(l) if l.contains(what) => return Ok(tail),
            Ok(l) => tail.keep(l),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let said = tail.last(Duration::ZERO);
                return Err(format!(
                    "ended before it was ready: {}",
                    if said.is_empty() {
                        "(nothing on stderr)"
                    } else {
                        &said
                    }
                ));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let said = tail.last(Duration::ZERO);
                return Err(format!(
                    "no '{what}' within {limit:?}{}",
                    if said.is_empty() {
                        String::new()
                    } else {
                        format!("; it said: {said}")
                    }
                ));
            }
        }
    }
}

/// The medians against the message size (log scale), one line per transport.
fn plot(
    path: &Path,
    k: Kind,
    sizes: &[u64],
    transports: &[Which],
    medians: &BTreeMap<(u64, Which), f64>,
) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    let lo = sizes.first().copied().unwrap_or(1);
    let hi = sizes.last().copied().unwrap_or(1).max(lo * 2);
    let top = medians.values().copied().fold(0.0f64, f64::max) * 1.15;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{} on the veth bed, median per size", test_name(k)),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..top.max(1e-3))
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(match k {
            Kind::Bw | Kind::ReadBw => "Gbit/s",
            Kind::Lat => "half round trip (us)",
        })
        .draw()
        .map_err(|e| err(&e))?;
    for (i, &t) in transports.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(u64, f64)> = sizes
            .iter()
            .filter_map(|&s| medians.get(&(s, t)).map(|&v| (s, v)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(t.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(size: u64, t: Which, value: f64) -> Sample {
        Sample {
            round: 0,
            size,
            transport: t,
            value,
            p99: Some(value * 2.0),
        }
    }

    /// read-bw's data goes from the server to the client: raw AF_XDP and iperf3 are sent
    /// that way too (from the server's side and CPU), write-bw's the other way.
    #[test]
    fn raw_and_iperf3_send_the_way_the_engines_data_goes() {
        let read = data_path(Kind::ReadBw);
        assert_eq!(
            (read.tx_ns, read.tx_dev, read.tx_is_server),
            (NS_SERVER, DEV_SERVER, true)
        );
        assert_eq!(
            (read.rx_ns, read.rx_dev, read.rx_ip),
            (NS_CLIENT, DEV_CLIENT, CLIENT_IP)
        );
        let write = data_path(Kind::Bw);
        assert_eq!((write.tx_ns, write.tx_is_server), (NS_CLIENT, false));
        assert_eq!((write.rx_ns, write.rx_ip), (NS_SERVER, SERVER_IP));
    }

    #[test]
    fn medians_and_ratios() {
        let s = [
            sample(64, Which::Xdp, 5.0),
            sample(64, Which::Xdp, 7.0),
            sample(64, Which::Xdp, 6.0),
            sample(64, Which::Socket, 3.0),
            sample(64, Which::Socket, 4.0),
        ];
        let m = medians(&s, |s| Some(s.value));
        assert_eq!(m[&(64, Which::Xdp)], 6.0);
        assert_eq!(m[&(64, Which::Socket)], 3.5);
        let p = medians(&s, |s| s.p99);
        assert_eq!(p[&(64, Which::Xdp)], 12.0);
        let none = medians(&s, |_| None);
        assert!(none.is_empty());
        let t = table(Kind::Bw, "", 3, &[64], &[Which::Xdp, Which::Socket], &m);
        assert!(t.contains("xdp/socket"), "{t}");
        assert!(
            t.lines()
                .last()
                .is_some_and(|l| l.trim_end().ends_with("1.71")),
            "{t}"
        );
        let t = table(Kind::ReadBw, "", 3, &[64], &[Which::Xdp, Which::Socket], &m);
        assert!(t.starts_with("compare: read-bw, medians of 3"), "{t}");
        assert!(t.contains("Gbit/s"), "{t}");
        // For latency the ratio is the other's time over the engine's.
        let t = table(
            Kind::Lat,
            " p99",
            3,
            &[64],
            &[Which::Xdp, Which::Socket],
            &m,
        );
        assert!(t.starts_with("compare: write-lat p99, medians of 3"), "{t}");
        assert!(t.contains("socket/xdp") && !t.contains("xdp/socket"), "{t}");
        assert!(
            t.lines()
                .last()
                .is_some_and(|l| l.trim_end().ends_with("0.58")),
            "{t}"
        );
    }

    /// A transport whose every run at a size failed shows "-" there, and so do its ratios;
    /// the other sizes and transports are as usual.
    #[test]
    fn a_size_whose_runs_all_failed_shows_a_dash() {
        let s = [
            sample(64, Which::Xdp, 6.0),
            sample(64, Which::Socket, 3.0),
            sample(128, Which::Xdp, 8.0),
        ];
        let m = medians(&s, |s| Some(s.value));
        let t = table(
            Kind::Bw,
            "",
            1,
            &[64, 128],
            &[Which::Xdp, Which::Socket],
            &m,
        );
        let rows: Vec<Vec<&str>> = t
            .lines()
            .skip(2)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [["64", "6.00", "3.00", "2.00"], ["128", "8.00", "-", "-"]],
            "{t}"
        );
    }

    /// A log left by a killed run at the same path does not fail the next one, and the log
    /// goes when the run is done with it.
    #[test]
    fn a_server_log_replaces_a_leftover_and_goes_at_the_end() {
        let path =
            std::env::temp_dir().join(format!("iwarp-compare-test-{}.log", std::process::id()));
        std::fs::write(&path, "left over").expect("leftover");
        let (log, mut file) = TempLog::create(path.clone()).expect("created over the leftover");
        std::io::Write::write_all(&mut file, b"new").expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new");
        drop(log);
        assert!(!path.exists(), "the log stayed");
    }

    #[test]
    fn the_last_lines_that_say_something() {
        assert_eq!(last_lines("a\n\nb\n  c  \n\n", 2), "b | c");
        assert_eq!(last_lines("only\n", 3), "only");
        assert_eq!(last_lines("", 3), "");
    }

    fn cli(args: &[&str]) -> CompareCli {
        CompareCli::try_parse_from(["compare"].iter().chain(args)).expect("parses")
    }

    /// `lat -a` (the README's command) runs at the default MTU: without raw the whole sweep; with
    /// raw too, raw sits out the sizes one frame of MTU + 14 octets cannot carry; raw alone runs
    /// the sizes it can. Only raw alone with no size it can carry is refused.
    #[test]
    fn lat_sizes_are_bound_by_raw_only_where_raw_runs() {
        let sweep: Vec<u64> = (6..=13).map(|p| 1 << p).collect();
        let lat = |extra: &[&str]| sizes(&cli(&[&["--test", "lat"], extra].concat()));
        assert_eq!(
            lat(&["-a", "--transports", "xdp,socket"]),
            Ok(sweep.clone())
        );
        assert_eq!(lat(&["-a"]), Ok(sweep.clone()));
        assert_eq!(lat(&["-a", "--mtu", "9000"]), Ok(sweep.clone()));
        assert_eq!(
            lat(&["-a", "--transports", "raw"]),
            Ok(vec![64, 128, 256, 512, 1024])
        );
        assert_eq!(lat(&["-s", "4096", "--transports", "xdp"]), Ok(vec![4096]));
        let e = lat(&["-s", "4096", "--transports", "raw"]).expect_err("nothing raw can run");
        assert!(e.contains("at most 1460 B") && e.contains("--mtu"), "{e}");
        assert!(!e.contains("one frame"), "{e}");
    }

    /// `-n` is refused where it means nothing (0: iperf3 would take it for a 10 s run) or would
    /// overflow the octets of a run.
    #[test]
    fn iterations_are_refused_where_unusable() {
        for n in ["0", "18446744073709551615", "100000000000"] {
            let e = CompareCli::try_parse_from(["compare", "-n", n]).expect_err(n);
            assert!(e.to_string().contains("--iters"), "{n}: {e}");
        }
        assert_eq!(cli(&["-n", "1"]).iters, Some(1));
    }

    /// A child that ends before its "ready" line: said at once, with what it printed.
    #[test]
    fn a_child_that_ends_before_ready_is_reported_with_its_stderr() {
        let mut child = Command::new("sh")
            .args(["-c", "echo starting >&2; echo boom >&2; exit 1"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh");
        let start = Instant::now();
        let e = wait_for_line(&mut child, "ready", Duration::from_secs(20))
            .err()
            .expect("not ready");
        let _ = child.wait();
        assert!(start.elapsed() < Duration::from_secs(1), "{e}");
        assert!(e.contains("ended before it was ready"), "{e}");
        assert!(e.contains("starting | boom"), "{e}");
    }

    #[test]
    fn the_plot_has_a_line_per_transport() {
        let path = std::env::temp_dir().join(format!("compare-{}.svg", std::process::id()));
        let sizes = [1024, 4096, 65536];
        let transports = [Which::Raw, Which::Xdp, Which::Socket];
        let mut m = BTreeMap::new();
        for (i, &t) in transports.iter().enumerate() {
            for &s in &sizes {
                m.insert((s, t), (i + 1) as f64 * (s as f64).log2());
            }
        }
        plot(&path, Kind::Bw, &sizes, &transports, &m).expect("plot");
        let svg = std::fs::read_to_string(&path).expect("read");
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for t in transports {
            assert!(
                svg.contains(&format!("\n{}\n", t.name())),
                "legend {}",
                t.name()
            );
        }
    }
}
