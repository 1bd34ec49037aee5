//! `iwarp-bench`: perftest-style throughput and latency tests for the iWARP stack.
//!
//! `iwarp-bench <test> [OPTIONS]` runs the server; `iwarp-bench <test> [OPTIONS] SERVER` the
//! client. Both sides exchange their buffer (STag, TO, length) and the test parameters in MPA
//! private data. Every run checks the data that arrived against the sender's pattern, with
//! each message's index in its first octets where the sender writes it (what each test
//! checks, and what it cannot see: README.md, "The data is checked where it arrives").

mod cli;
mod compare;
mod engine_report;
mod http;
mod inline;
mod interrupt;
mod live;
mod net;
mod pattern;
mod pcap;
mod perftest;
mod proto;
mod raw;
mod rping;
mod stats;
mod tcp_tools;
mod tests;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

pub use cli::{
    all_sizes, parse_args, AtomicType, Cli, CqMode, EngineThreads, FramingArg, OnOff,
    PerftestCompat, Transport,
};
pub use proto::TestKind;

/// Logging through `tracing`: `RUST_LOG` (e.g. `info`, or `datapath=debug`) selects what the
/// library reports on stderr (connection setup, MPA, Terminates, ends, engine start and
/// stop); without it, warnings and errors only (a completion queue overrun, a fallback to
/// a smaller MTU, an accept that failed; what peers cause is held to a few lines a second).
fn init_logging() {
    let filter = match std::env::var_os("RUST_LOG") {
        None => tracing_subscriber::EnvFilter::new("warn"),
        Some(spec) => match tracing_subscriber::EnvFilter::try_from_default_env() {
            Ok(filter) => filter,
            Err(e) => {
                eprintln!("iwarp-bench: RUST_LOG={spec:?} ignored: {e}");
                tracing_subscriber::EnvFilter::new("warn")
            }
        },
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The subcommands beside the perftest-shaped tests: name, entry, one line of help.
type Entry = fn(Vec<String>) -> ExitCode;
const SUBCOMMANDS: &[(&str, Entry, &str)] = &[
    (
        "perftest",
        |a| perftest::main(a),
        "talk to perftest's ib_*_bw/ib_*_lat -R (or be one for them) over rdma_cm's wire",
    ),
    (
        "rping",
        |a| rping::main(a),
        "librdmacm's rping, client or server",
    ),
    (
        "compare",
        |a| compare::main(a.into_iter()),
        "raw AF_XDP, the engine, the socket transport (and iperf3) side by side on the veth bed",
    ),
    (
        "stats",
        |a| live::stats_main(a.into_iter()),
        "the counters of a running engine, from another shell",
    ),
    (
        "raw",
        |a| raw::main(a.into_iter()),
        "raw AF_XDP frame rates and ping-pong, no protocol",
    ),
    (
        "tcp-sink",
        |a| tcp_tools::main(a.into_iter()),
        "our TCP over AF_XDP without iWARP: receive and count",
    ),
    (
        "tcp-source",
        |a| tcp_tools::main(a.into_iter()),
        "our TCP over AF_XDP without iWARP: send",
    ),
    (
        "http-server",
        |a| http::main(a.into_iter()),
        "HTTP GETs over our TCP with the TCP RDMA option: server",
    ),
    (
        "http-client",
        |a| http::main(a.into_iter()),
        "HTTP GETs over our TCP with the TCP RDMA option: client",
    ),
];

/// The list of [`SUBCOMMANDS`] for `--help` and `iwarp-bench help`.
fn subcommand_help() -> String {
    let mut s = String::from("Other commands (`iwarp-bench COMMAND --help` for each):\n");
    for (name, _, what) in SUBCOMMANDS {
        s.push_str(&format!("  {name:<12} {what}\n"));
    }
    s
}

fn main() -> ExitCode {
    init_logging();
    // As OS strings: the tests' parser takes a path that is not UTF-8 (--pcap); the other
    // commands refuse such an argument with a message (std::env::args panicked on it).
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let first = args
        .get(1)
        .and_then(|a| a.to_str())
        .unwrap_or_default()
        .to_owned();
    if let Some((name, entry, _)) = SUBCOMMANDS.iter().find(|(n, _, _)| *n == first) {
        // Usage lines name the whole command, `iwarp-bench perftest`.
        let mut sub = vec![format!("iwarp-bench {name}")];
        for a in &args[2..] {
            match a.to_str() {
                Some(s) => sub.push(s.to_owned()),
                None => {
                    eprintln!("iwarp-bench {name}: an argument is not UTF-8: {a:?}");
                    return ExitCode::from(2);
                }
            }
        }
        return entry(sub);
    }
    let mut command = Cli::command().after_help(subcommand_help());
    if first == "help" && args.len() == 2 {
        let _ = command.print_long_help();
        return ExitCode::SUCCESS;
    }
    let cli = match command
        .try_get_matches_from_mut(args)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => e.format(&mut command).exit(),
    };
    if let Err(e) = cli.validate() {
        eprintln!("iwarp-bench: {e}");
        return ExitCode::from(2);
    }
    for note in cli.notes() {
        eprintln!("iwarp-bench: {note}");
    }
    let result = match cli.server.clone() {
        None => tests::run_server(&cli),
        Some(host) => cli
            .server_addr(&host)
            .and_then(|addr| tests::run_client(&cli, addr)),
    };
    // Built with the `latency-probe` feature: where the engine's time went (steps seen at
    // least 1,000 times; scripts/latency-breakdown.sh reads these lines).
    if let Some(steps) = datapath::probe::report(1000) {
        eprint!("{steps}");
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iwarp-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
