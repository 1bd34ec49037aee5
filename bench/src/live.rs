//! The AF_XDP engine's counters while a run goes on.
//!
//! * `--stats-every SECONDS` prints them on stderr at that interval, with the rates since the
//!   line before.
//! * Every run on the engine keeps a snapshot in `/run/iwarp-bench/<pid>.json`, rewritten once
//!   a second (written to a temporary name and renamed, so a reader never sees half a file)
//!   and removed when the run ends; `iwarp-bench stats` reads them from another shell and
//!   shows one column per running engine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use datapath::Device;
use serde_json::{json, Value};

use crate::engine_report::EngineReport;

/// Where running engines keep their snapshots.
pub const STATS_DIR: &str = "/run/iwarp-bench";
/// How often the snapshot file is rewritten.
const FILE_EVERY: Duration = Duration::from_secs(1);
/// A snapshot not rewritten for this long is a killed run's (whose process number another
/// process may have by now): `stats` leaves it out and removes it.
const STALE_AFTER: Duration = Duration::from_secs(10);

/// Runs `run` while a reporter thread prints (`every`) and publishes the engine's counters;
/// without an engine it only runs `run`. `what` names the run in the snapshot (e.g.
/// "write-bw client").
pub fn with_live_counters<T>(
    device: &Device,
    every: Option<Duration>,
    what: &str,
    run: impl FnOnce() -> T,
) -> T {
    let Some(engine) = device.engine() else {
        return run();
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let reporter = s.spawn(|| {
            let mut r = Reporter::new(what, every);
            while !stop.load(Ordering::Relaxed) {
                r.tick(&EngineReport::new(&engine.counters()));
                std::thread::park_timeout(r.next_wait());
            }
            r.end();
        });
        // Stops the reporter however `run` ends: a panic in it would otherwise leave the
        // scope waiting for a reporter that never stops.
        struct Stop<'a>(&'a AtomicBool, &'a std::thread::Thread);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
                self.1.unpark();
            }
        }
        let _stop = Stop(&stop, reporter.thread());
        run()
    })
}

/// The reporter thread's state.
struct Reporter {
    what: String,
    every: Option<Duration>,
    started: Instant,
    file: Option<PathBuf>,
    next_file: Instant,
    next_line: Option<Instant>,
    /// The counters and time of the last line (for its rates).
    last: Option<(Instant, EngineReport)>,
}

impl Reporter {
    fn new(what: &str, every: Option<Duration>) -> Reporter {
        let now = Instant::now();
        let dir = Path::new(STATS_DIR);
        let file = match std::fs::create_dir_all(dir) {
            Ok(()) => Some(dir.join(format!("{}.json", std::process::id()))),
            Err(e) => {
                eprintln!(
                    "iwarp-bench: no live counters for `iwarp-bench stats` ({}: {e})",
                    dir.display()
                );
                None
            }
        };
        Reporter {
            what: what.to_owned(),
            every,
            started: now,
            file,
            next_file: now,
            next_line: every.map(|e| now + e),
            last: None,
        }
    }

    /// How long to sleep until something is due.
    fn next_wait(&self) -> Duration {
        let due = match self.next_line {
            Some(l) => l.min(self.next_file),
            None => self.next_file,
        };
        due.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    fn tick(&mut self, now_counters: &EngineReport) {
        let now = Instant::now();
        if now >= self.next_file {
            self.next_file = now + FILE_EVERY;
            self.write_file(now_counters);
        }
        if let (Some(due), Some(every)) = (self.next_line, self.every) {
            if now >= due {
                self.next_line = Some(next_due(due, every, now));
                eprintln!("iwarp-bench: {}", self.line(now, now_counters));
                self.last = Some((now, now_counters.clone()));
            }
        }
    }

    /// One `--stats-every` line: totals and the rates since the line before.
    fn line(&self, now: Instant, c: &EngineReport) -> String {
        let (since, before) = match &self.last {
            Some((t, b)) => (now.duration_since(*t), Some(b)),
            None => (now.duration_since(self.started), None),
        };
        let secs = since.as_secs_f64().max(1e-9);
        let rate = |now: u64, before: Option<u64>| {
            let d = now.saturating_sub(before.unwrap_or(0));
            per_second(d as f64 / secs)
        };
        format!(
            "stats t={:.1}s: frames rx {} ({}/s) tx {} ({}/s), FPDUs rx {} ({}/s) tx {} ({}/s), \
             retransmitted segments {}, CRC errors {}, connections {}, dropped by the kernel {}",
            now.duration_since(self.started).as_secs_f64(),
            c.frames_rx,
            rate(c.frames_rx, before.map(|b| b.frames_rx)),
            c.frames_tx,
            rate(c.frames_tx, before.map(|b| b.frames_tx)),
            c.fpdus_rx,
            rate(c.fpdus_rx, before.map(|b| b.fpdus_rx)),
            c.fpdus_tx,
            rate(c.fpdus_tx, before.map(|b| b.fpdus_tx)),
            c.retransmitted_segments,
            c.crc_errors,
            c.connections,
            c.frames_dropped_by_kernel,
        )
    }

    fn write_file(&mut self, c: &EngineReport) {
        let Some(path) = &self.file else { return };
        let snapshot = json!({
            "pid": std::process::id(),
            "run": self.what,
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "engine": c,
        });
        let tmp = path.with_extension("json.tmp");
        let written =
            std::fs::write(&tmp, snapshot.to_string()).and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            eprintln!("iwarp-bench: live counters stop ({}: {e})", path.display());
            let _ = std::fs::remove_file(&tmp);
            self.file = None;
        }
    }

    fn end(&mut self) {
        if let Some(path) = self.file.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// When the line after one due at `due` is due: `every` later, or, after a stall that
/// passed it (the reporter's thread did not run), `every` from `now`: the lines missed are not
/// printed back to back, each with rates over a moment.
fn next_due(due: Instant, every: Duration, now: Instant) -> Instant {
    let next = due + every;
    if next > now {
        next
    } else {
        now + every
    }
}

/// `12`, `12.3k`, `4.560M`, `2.500G`: a rate scaled to thousands, millions or billions.
fn per_second(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.3}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.3}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// `iwarp-bench stats`: the counters of the AF_XDP engines running now.
#[derive(Parser, Debug)]
#[command(
    name = "iwarp-bench stats",
    about = "Show the counters of the iwarp-bench runs on the AF_XDP engine going on now, one \
             column per process (they refresh them once a second)"
)]
struct StatsCli {
    /// Only these processes.
    pids: Vec<u32>,
    /// Where the runs keep their snapshots.
    #[arg(long, default_value = STATS_DIR)]
    dir: PathBuf,
    /// Print the snapshots as one JSON array instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn stats_main(args: impl Iterator<Item = String>) -> ExitCode {
    let cli: StatsCli = match crate::parse_args(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let snaps = match read_snapshots(&cli.dir, &cli.pids) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("iwarp-bench stats: {e}");
            return ExitCode::FAILURE;
        }
    };
    if cli.json {
        println!("{}", Value::Array(snaps));
        return ExitCode::SUCCESS;
    }
    if snaps.is_empty() {
        let which = if cli.pids.is_empty() {
            String::new()
        } else {
            let pids: Vec<String> = cli.pids.iter().map(u32::to_string).collect();
            format!(" as process {}", pids.join(", "))
        };
        println!(
            "no iwarp-bench run on the AF_XDP engine is going on{which} (nothing in {})",
            cli.dir.display()
        );
        return ExitCode::SUCCESS;
    }
    print!("{}", table(&snaps));
    ExitCode::SUCCESS
}

/// The snapshots in `dir` (of `pids` only, if any) whose process still runs, by pid.
fn read_snapshots(dir: &Path, pids: &[u32]) -> Result<Vec<Value>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let mut out = BTreeMap::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let Some(pid) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if !pids.is_empty() && !pids.contains(&pid) {
            continue;
        }
        // A run killed before it could remove its file leaves it behind: its process is
        // gone, or the file is no longer rewritten (its number went to another process).
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > STALE_AFTER));
        if stale {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if !Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            out.insert(pid, v);
        }
    }
    Ok(out.into_values().collect())
}

/// One row per counter, one column per snapshot.
fn table(snaps: &[Value]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = vec![
        (
            "pid".into(),
            snaps.iter().map(|s| s["pid"].to_string()).collect(),
        ),
        (
            "run".into(),
            snaps
                .iter()
                .map(|s| s["run"].as_str().unwrap_or("?").to_owned())
                .collect(),
        ),
        (
            "uptime_s".into(),
            snaps
                .iter()
                .map(|s| format!("{:.1}", s["uptime_s"].as_f64().unwrap_or(0.0)))
                .collect(),
        ),
    ];
    let names: Vec<String> = snaps
        .first()
        .and_then(|s| s["engine"].as_object())
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    for name in names {
        let cells = snaps
            .iter()
            .map(|s| match &s["engine"][&name] {
                Value::Null => "-".to_owned(),
                Value::String(t) => t.clone(),
                v => v.to_string(),
            })
            .collect();
        rows.push((name, cells));
    }
    let first = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..snaps.len())
        .map(|i| rows.iter().map(|r| r.1[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (name, cells) in &rows {
        out.push_str(&format!("{name:<first$}"));
        for (cell, w) in cells.iter().zip(&widths) {
            out.push_str(&format!("  {cell:>w$}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a stall the next line is a whole period away, not at once.
    #[test]
    fn a_stall_does_not_bunch_the_lines_up() {
        let every = Duration::from_secs(1);
        let due = Instant::now();
        assert_eq!(next_due(due, every, due), due + every);
        let late = due + 5 * every;
        assert_eq!(next_due(due, every, late), late + every);
    }

    #[test]
    fn rates_are_scaled() {
        assert_eq!(per_second(12.4), "12");
        assert_eq!(per_second(12_345.0), "12.3k");
        assert_eq!(per_second(4_560_000.0), "4.560M");
        assert_eq!(per_second(2.5e9), "2.500G");
    }

    /// A snapshot that is no longer rewritten belongs to a killed run, even when its process
    /// number is in use again: left out, and removed. A fresh one is read.
    #[test]
    fn a_snapshot_no_longer_rewritten_is_left_out_and_removed() {
        let dir = std::env::temp_dir().join(format!("iwarp-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        // Our own process number: /proc has it.
        let pid = std::process::id();
        let path = dir.join(format!("{pid}.json"));
        std::fs::write(&path, json!({"pid": pid, "run": "r"}).to_string()).expect("write");
        assert_eq!(read_snapshots(&dir, &[]).expect("read").len(), 1);
        let old = std::time::SystemTime::now() - 2 * STALE_AFTER;
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(old))
            .expect("age the file");
        assert!(read_snapshots(&dir, &[]).expect("read").is_empty());
        assert!(!path.exists(), "the stale snapshot was removed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_table_has_a_row_per_counter_and_a_column_per_run() {
        let snaps = vec![
            json!({"pid": 7, "run": "write-bw server", "uptime_s": 1.25,
                   "engine": {"frames_rx": 10, "error": null}}),
            json!({"pid": 12345, "run": "write-bw client", "uptime_s": 2.0,
                   "engine": {"frames_rx": 123456, "error": "it broke"}}),
        ];
        let t = table(&snaps);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert!(
            lines[0].starts_with("pid ") && lines[0].ends_with("12345"),
            "{t}"
        );
        assert!(lines[1].contains("write-bw server") && lines[1].contains("write-bw client"));
        assert!(lines[2].contains("1.2") && lines[2].ends_with("2.0"), "{t}");
        // Columns line up: each row is as long as the others.
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "{t}");
        assert!(lines
            .iter()
            .any(|l| l.starts_with("error") && l.contains(" - ")));
        assert!(lines
            .iter()
            .any(|l| l.starts_with("frames_rx") && l.ends_with("123456")));
    }
}
