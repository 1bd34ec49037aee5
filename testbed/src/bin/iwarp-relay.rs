//! `iwarp-relay`: runs the test relay (`testbed::relay`) between two interfaces, e.g. in the
//! relay namespace of `scripts/netns-relay.sh`, for `--seconds` or, with `--stdin-stop`, until
//! its standard input ends or carries a line; prints its counters (JSON with `--json`) when it
//! stops. A test tool, not part of the stack: `scripts/bench-relay.sh` runs it.

use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use testbed::relay::{
    DirStats, PathMtu, Relay, RelayConfig, Start, Toward, RELAY_DEV_A, RELAY_DEV_B, ROUTER,
};

/// Set when standard input ends (`--stdin-stop`).
static STOP: AtomicBool = AtomicBool::new(false);

/// Directions, as typed on the command line.
#[derive(ValueEnum, Debug, Clone, Copy)]
enum Dirs {
    /// Both directions.
    Both,
    /// Frames going to host A (the `--dev-a` side).
    A,
    /// Frames going to host B (the `--dev-b` side).
    B,
}

/// An L2 relay that drops, reorders, re-segments, duplicates, corrupts and delays TCP, and can
/// shrink the path MTU (a test tool).
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
    /// Probability a TCP segment is sent twice (the copy right behind it).
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Probability a data segment has payload bits flipped, its TCP checksum recomputed so
    /// that TCP accepts it (MPA's CRC must catch it).
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// A corrupted segment has 1 to this many distinct payload bits flipped.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    corrupt_bits: u32,
    /// Directions whose data segments may be corrupted.
    #[arg(long, value_enum, default_value_t = Dirs::Both)]
    corrupt_toward: Dirs,
    /// Corrupt only once this many TCP payload octets have come in a direction (the MPA
    /// startup frames are data too: corrupting them fails the startup, not the CRC).
    #[arg(long, default_value_t = 0)]
    corrupt_after_bytes: u64,
    /// Most segments corrupted in each direction.
    #[arg(long)]
    corrupt_max: Option<u64>,
    /// One-way delay of every frame, in microseconds (at most 10 s).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(..=10_000_000))]
    delay_us: u64,
    /// Further uniform delay of 0 to this many microseconds per frame (frames closer together
    /// than it are reordered; at most 10 s).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(..=10_000_000))]
    jitter_us: u64,
    /// Shrink the path MTU to this: longer IPv4 packets are dropped and, with DF, answered with
    /// an ICMP "fragmentation needed" (type 3 code 4) carrying this next-hop MTU.
    #[arg(long, value_parser = clap::value_parser!(u16).range(68..))]
    path_mtu: Option<u16>,
    /// `--path-mtu` begins this many milliseconds after the relay started.
    #[arg(long, conflicts_with = "path_mtu_after_bytes", requires = "path_mtu")]
    path_mtu_after_ms: Option<u64>,
    /// `--path-mtu` begins in a direction once this many TCP payload octets came in it.
    #[arg(long, requires = "path_mtu")]
    path_mtu_after_bytes: Option<u64>,
    /// Source address of the ICMP messages (a router in the bed's subnet by default).
    #[arg(long, default_value_t = ROUTER)]
    icmp_from: Ipv4Addr,
    /// Stop after this many seconds (0.1 to 86400).
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
    // (A NaN is in no range.)
    let p = |x: f64| (0.0..=1.0).contains(&x);
    if !p(cli.loss) || !p(cli.reorder) || !p(cli.loss + cli.reorder) {
        eprintln!(
            "iwarp-relay: --loss and --reorder are probabilities (each 0 to 1, sum at most 1)"
        );
        return ExitCode::from(2);
    }
    if !p(cli.duplicate) || !p(cli.corrupt) {
        eprintln!("iwarp-relay: --duplicate and --corrupt are probabilities (0 to 1)");
        return ExitCode::from(2);
    }
    if !(0.1..=86_400.0).contains(&cli.seconds) {
        eprintln!(
            "iwarp-relay: --seconds {} out of range: 0.1 to 86400",
            cli.seconds
        );
        return ExitCode::from(2);
    }
    let lifetime = Duration::from_secs_f64(cli.seconds);
    if cli.stdin_stop {
        std::thread::spawn(|| {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            STOP.store(true, Ordering::Relaxed);
        });
    }
    let path_mtu = cli.path_mtu.map(|mtu| PathMtu {
        mtu,
        start: match (cli.path_mtu_after_ms, cli.path_mtu_after_bytes) {
            (Some(ms), _) => Start::After(Duration::from_millis(ms)),
            (None, Some(n)) => Start::AfterBytes(n),
            (None, None) => Start::Now,
        },
        router: cli.icmp_from,
    });
    let cfg = RelayConfig {
        netns: None,
        dev_a: cli.dev_a.clone(),
        dev_b: cli.dev_b.clone(),
        seed: cli.seed,
        loss: cli.loss,
        reorder: cli.reorder,
        resegment: cli.resegment,
        mss_clamp: cli.mss_clamp,
        duplicate: cli.duplicate,
        corrupt: cli.corrupt,
        corrupt_bits: cli.corrupt_bits,
        corrupt_toward: match cli.corrupt_toward {
            Dirs::Both => Toward::Both,
            Dirs::A => Toward::A,
            Dirs::B => Toward::B,
        },
        corrupt_start: match cli.corrupt_after_bytes {
            0 => Start::Now,
            n => Start::AfterBytes(n),
        },
        corrupt_max: cli.corrupt_max.unwrap_or(u64::MAX),
        delay: Duration::from_micros(cli.delay_us),
        jitter: Duration::from_micros(cli.jitter_us),
        path_mtu,
        lifetime,
        ..RelayConfig::default()
    };
    let relay = match Relay::start(cfg.clone()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("iwarp-relay: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "iwarp-relay: forwarding {} <-> {} (loss {}, reorder {}, resegment {}, mss clamp {:?}, \
         duplicate {}, corrupt {} (1-{} bits, toward {:?}, from {:?}, at most {}), delay {:?} \
         + jitter {:?}, path MTU {:?}, seed {})",
        cli.dev_a,
        cli.dev_b,
        cfg.loss,
        cfg.reorder,
        cfg.resegment,
        cfg.mss_clamp,
        cfg.duplicate,
        cfg.corrupt,
        cfg.corrupt_bits,
        cfg.corrupt_toward,
        cfg.corrupt_start,
        cfg.corrupt_max,
        cfg.delay,
        cfg.jitter,
        cfg.path_mtu,
        cfg.seed
    );
    let started = Instant::now();
    // An error ends the relay thread: say so at once rather than sit there not forwarding.
    while !STOP.load(Ordering::Relaxed) && started.elapsed() < lifetime && !relay.has_ended() {
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
                        "payload_in": d.payload_in, "duplicated": d.duplicated,
                        "corrupted": d.corrupted, "corrupted_bits": d.corrupted_bits,
                        "delayed": d.delayed, "jitter_reordered": d.jitter_reordered,
                        "mtu_dropped": d.mtu_dropped, "icmp_sent": d.icmp_sent,
                        "tx_refused": d.tx_refused, "rx_truncated": d.rx_truncated,
                        "rx_dropped": d.rx_dropped,
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
