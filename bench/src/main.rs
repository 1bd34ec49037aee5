//! `iwarp-bench`: perftest-style throughput and latency tests for the iWARP stack.
//!
//! `iwarp-bench <test> [OPTIONS]` runs the server; `iwarp-bench <test> [OPTIONS] SERVER` the
//! client. Both sides exchange their buffer (STag, TO, length) and the test parameters in MPA
//! private data, and every run verifies the data that arrived.

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

use clap::Parser;

pub use cli::{
    all_sizes, parse_args, AtomicType, Cli, CqMode, EngineThreads, FramingArg, OnOff,
    PerftestCompat, Transport,
};
pub use proto::TestKind;

/// Logging through `tracing`: `RUST_LOG` (e.g. `info`, or `datapath=debug`) selects what the
/// library reports on stderr (connection setup, MPA, Terminates, ends, engine start and
/// stop); without it nothing is logged.
fn init_logging() {
    let Some(spec) = std::env::var_os("RUST_LOG") else {
        return;
    };
    match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .try_init();
        }
        Err(e) => eprintln!("iwarp-bench: RUST_LOG={spec:?} ignored: {e}"),
    }
}

fn main() -> ExitCode {
    init_logging();
    if std::env::args().nth(1).as_deref() == Some("raw") {
        return raw::main(std::env::args().skip(1));
    }
    if matches!(
        std::env::args().nth(1).as_deref(),
        Some("tcp-sink" | "tcp-source")
    ) {
        return tcp_tools::main(std::env::args().skip(1));
    }
    if matches!(
        std::env::args().nth(1).as_deref(),
        Some("http-server" | "http-client")
    ) {
        return http::main(std::env::args().skip(1));
    }
    if std::env::args().nth(1).as_deref() == Some("rping") {
        return rping::main(std::env::args().skip(1));
    }
    if std::env::args().nth(1).as_deref() == Some("perftest") {
        return perftest::main(std::env::args().skip(1));
    }
    if std::env::args().nth(1).as_deref() == Some("compare") {
        return compare::main(std::env::args().skip(1));
    }
    if std::env::args().nth(1).as_deref() == Some("stats") {
        return live::stats_main(std::env::args().skip(1));
    }
    let cli = Cli::parse();
    if let Err(e) = cli.validate() {
        eprintln!("iwarp-bench: {e}");
        return ExitCode::from(2);
    }
    for note in cli.compat.notes() {
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
