//! The engine's counters while a run goes on: `--stats-every 1` prints a line a second with
//! growing totals, and `iwarp-bench stats` (from another process, as a user in another shell)
//! shows both running engines; their snapshot files are gone when the runs end. Engine to
//! engine on the veth bed, a 3-second write-bw.
//!
//! Needs root; skips (or fails under `CI=true`) without the bed.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{bench_in, bin, wait_with_timeout, OutputWithin, RUN_LIMIT};
use serde_json::Value;
use testbed::*;

/// `frames_tx` of every `--stats-every` line in `stderr`.
fn frames_tx_per_line(stderr: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter(|l| l.contains("iwarp-bench: stats t="))
        .map(|l| {
            let after = l.split(" tx ").nth(1).expect("a tx figure");
            after
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .expect("a number")
        })
        .collect()
}

#[test]
fn stats_every_and_the_stats_command_show_running_engines() {
    let _bed = bed_or_skip!();
    let args = |iface: &'static str| {
        vec![
            "write-bw",
            "--transport",
            "xdp",
            "--iface",
            iface,
            "-p",
            "18770",
            "-D",
            "3",
            "--stats-every",
            "1",
        ]
    };
    let mut server = bench_in(NS_A, &args(DEV_A))
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    let err = server.stderr.take().expect("server stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !rx
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .expect("the server listens")
        .contains("listening")
    {}
    let addr = ADDR_A.to_string();
    let mut client_args = args(DEV_B);
    client_args.push(&addr);
    let client = bench_in(NS_B, &client_args).spawn().expect("start client");
    let pids = [server.id(), client.id()];

    // From outside both runs, while they run: asked again until both are connected and have
    // received (a start on a loaded machine takes a while; the runs last 3 s from then).
    let running = |s: &Value, pid: u32| {
        s["pid"] == pid
            && s["engine"]["frames_rx"].as_u64().unwrap_or(0) > 0
            && s["engine"]["connections"] == 1
    };
    // The table (`stats <pids>`) is asked in the same round as the JSON snapshot that found
    // both running, and the round repeated until both show: asked after the poll, it could
    // come after a run ended late in its 3 s.
    let table_of = |pids: &[u32]| {
        let out = std::process::Command::new(bin())
            .arg("stats")
            .args(pids.iter().map(|p| p.to_string()))
            .output_within(RUN_LIMIT)
            .expect("run stats");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shows_both =
        |table: &str| table.contains("write-bw server") && table.contains("write-bw client");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (snaps, table) = loop {
        let out = std::process::Command::new(bin())
            .args(["stats", "--json"])
            .output_within(RUN_LIMIT)
            .expect("run stats");
        assert!(out.status.success());
        let snaps: Value = serde_json::from_slice(&out.stdout).expect("stats --json");
        let snaps = snaps.as_array().expect("an array").clone();
        let both = pids
            .iter()
            .all(|&pid| snaps.iter().any(|s| running(s, pid)));
        let table = if both { table_of(&pids) } else { String::new() };
        if (both && shows_both(&table)) || Instant::now() > deadline {
            break (snaps, table);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for pid in pids {
        let s = snaps
            .iter()
            .find(|s| s["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} not in {snaps:?}"));
        assert!(s["engine"]["frames_rx"].as_u64().unwrap_or(0) > 0, "{s}");
        assert_eq!(s["engine"]["connections"], 1, "{s}");
    }
    assert!(shows_both(&table), "{table}");
    assert!(table.lines().any(|l| l.starts_with("frames_tx")), "{table}");

    let client = wait_with_timeout(client, Duration::from_secs(60));
    let server = wait_with_timeout(server, Duration::from_secs(60));
    assert!(client.status.success(), "{client:?}");
    assert!(server.status.success(), "{server:?}");
    let lines = frames_tx_per_line(&String::from_utf8_lossy(&client.stderr));
    assert!(lines.len() >= 2, "client stats lines: {lines:?}");
    assert!(
        lines.windows(2).all(|w| w[1] > w[0]),
        "frames tx grows: {lines:?}"
    );
    for pid in pids {
        let file = format!("/run/iwarp-bench/{pid}.json");
        assert!(!std::path::Path::new(&file).exists(), "{file} left behind");
    }
}
