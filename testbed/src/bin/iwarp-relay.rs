//! `iwarp-relay`: runs the test relay (`testbed::relay`) between two interfaces, e.g. in the
//! relay namespace of `scripts/netns-relay.sh`, for `--seconds` or, with `--stdin-stop`, until
//! its standard input ends or carries a line; prints its counters (JSON with `--json`) when it
//! stops. A test tool, not part of the stack: `scripts/bench-relay.sh` runs it.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use testbed::relay::{DirStats, Relay, RelayConfig, RELAY_DEV_A, RELAY_DEV_B};

/// Set when standard input ends (`--stdin-stop`).
static STOP: AtomicBool = AtomicBool::new(false);

/// An L2 relay that drops, reorders and re-segments TCP (a test tool).
#[derive(Parser, Debug)]
#[command(name = "iwarp-relay")]
struct RelayCli {
    /// Interface towards host A.
    #[arg(long, default_value = RELAY_DEV_A)]
    dev_a: String,
    /// Interface towards host B.
    #[arg(long, default_value = RELAY_DEV_B)]
    dev_b: String,
    /// Seed of the relay's decisions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Probability a TCP segment is dropped.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Probability a TCP segment is held back behind 1-8 later ones.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Gather contiguous data and cut it again at random offsets.
    #[arg(long)]
    resegment: bool,
    /// Lower the MSS option of SYNs to this.
    #[arg(long)]
    mss_clamp: Option<u16>,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 600.0)]
    seconds: f64,
    /// Also stop when standard input ends or carries a line.
    #[arg(long)]
    stdin_stop: bool,
    /// Print the counters as one JSON object.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = match RelayCli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if !(0.0..=1.0).contains(&cli.loss) || !(0.0..=1.0).contains(&(cli.loss + cli.reorder)) {
        eprintln!("iwarp-relay: --loss and --reorder are probabilities (sum at most 1)");
        return ExitCode::from(2);
    }
    let lifetime = Duration::from_secs_f64(cli.seconds.clamp(0.1, 86_400.0));
    if cli.stdin_stop {
        std::thread::spawn(|| {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            STOP.store(true, Ordering::Relaxed);
        });
    }
    let relay = match Relay::start(RelayConfig {
        netns: None,
        dev_a: cli.dev_a.clone(),
        dev_b: cli.dev_b.clone(),
        seed: cli.seed,
        loss: cli.loss,
        reorder: cli.reorder,
        resegment: cli.resegment,
        mss_clamp: cli.mss_clamp,
        lifetime,
        ..RelayConfig::default()
    }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("iwarp-relay: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "iwarp-relay: forwarding {} <-> {} (loss {}, reorder {}, resegment {}, mss clamp {:?}, seed {})",
        cli.dev_a, cli.dev_b, cli.loss, cli.reorder, cli.resegment, cli.mss_clamp, cli.seed
    );
    let started = Instant::now();
    while !STOP.load(Ordering::Relaxed) && started.elapsed() < lifetime {
        std::thread::sleep(Duration::from_millis(20));
    }
    match relay.stop() {
        Ok(s) => {
            if cli.json {
                let dir = |d: &DirStats| {
                    serde_json::json!({
                        "frames_in": d.frames_in, "frames_out": d.frames_out, "other": d.other,
                        "tcp_in": d.tcp_in, "data_in": d.data_in, "dropped": d.dropped,
                        "reordered": d.reordered, "pieces": d.pieces,
                        "unaligned_pieces": d.unaligned_pieces, "mss_clamped": d.mss_clamped,
                    })
                };
                println!(
                    "{}",
                    serde_json::json!({"a_to_b": dir(&s.a_to_b), "b_to_a": dir(&s.b_to_a)})
                );
            } else {
                println!("relay a->b: {:?}", s.a_to_b);
                println!("relay b->a: {:?}", s.b_to_a);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iwarp-relay: {e}");
            ExitCode::FAILURE
        }
    }
}
