//! `iwarp-bench compare` stopped by SIGINT (Ctrl-C) halfway through a run, with stubs on `PATH`
//! in place of `ip` and `ethtool`: compare and `scripts/netns.sh` (which brings the bed up and
//! down for it) reach the bed only through them, so no bed is touched, and every measurement's
//! server and client (`ip netns exec NS iwarp-bench ...`) is a stub that runs until stopped.
//!
//! Compare still takes the bed's lock (`testbed::Bed`), which needs root: without it the test
//! prints `SKIPPED: <why>` and passes, except under `CI=true`, where it fails with the reason.

mod common;
mod stubbed;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{bin, interrupt, wait_with_timeout, RUN_LIMIT};

/// The `ip` stub: every call is appended to `$STUB_DIR/calls`. `ip netns exec NS PROGRAM ...`
/// of `iwarp-bench` (a measurement's server or client) records its pid in `$STUB_DIR/servers`
/// (`iwa`) or `$STUB_DIR/clients` (`iwb`) and runs until stopped; of anything else (ethtool)
/// succeeds. `ip link show` finds no veth end in the root namespace (as after a clean
/// `down`); everything else succeeds.
const IP_STUB: &str = r#"#!/usr/bin/env bash
echo "ip $*" >>"$STUB_DIR/calls"
if [ "$1 $2" = "netns exec" ]; then
  case $4 in
    */iwarp-bench)
      if [ "$3" = iwa ]; then echo $$ >>"$STUB_DIR/servers"; else echo $$ >>"$STUB_DIR/clients"; fi
      echo "iwarp-bench: server listening (stub)" >&2
      exec sleep 300 ;;
  esac
  exit 0
fi
[ "$1 $2" != "link show" ] || exit 1
exit 0
"#;

/// The first SIGINT stops the run: compare stops and reaps the running measurement's server
/// and client, prints and writes what it has (saying it was interrupted), takes the bed down
/// as at a normal end (`scripts/netns.sh down`, whose last step, `ip link show dev iwa0`, its
/// `up` never takes) and ends by the signal (a shell's 130), all within seconds.
#[test]
fn a_sigint_stops_compares_children_and_takes_the_bed_down() {
    if !stubbed::root_or_skip("not root: compare takes the veth bed's lock (testbed::Bed)") {
        return;
    }
    let dir = stubbed::stub_dir("compare-sigint");
    stubbed::stub(&dir, "ip", IP_STUB);
    stubbed::stub(&dir, "ethtool", "#!/bin/sh\nexit 0\n");
    let json = dir.join("compare.json");
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = Command::new(bin())
        .args(["compare", "--test", "bw", "-s", "65536", "-n", "10"])
        .args([
            "--rounds",
            "2",
            "--mtu",
            "9000",
            "--transports",
            "socket,xdp",
        ])
        .arg("--json")
        .arg(&json)
        .env("PATH", path)
        .env("STUB_DIR", &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start compare");
    // Its first measurement under way: server and client running (compare may first wait
    // for the bed's lock).
    let deadline = Instant::now() + RUN_LIMIT;
    let running = |file: &str| !stubbed::pids(&dir.join(file)).is_empty();
    while !(running("servers") && running("clients")) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let under_way = running("servers") && running("clients");
    if under_way {
        interrupt(&child);
    }
    let sent = Instant::now();
    let out = wait_with_timeout(child, Duration::from_secs(20));
    let took = sent.elapsed();
    let children: Vec<u32> = ["servers", "clients"]
        .iter()
        .flat_map(|f| stubbed::pids(&dir.join(f)))
        .collect();
    let live: Vec<u32> = children
        .iter()
        .copied()
        .filter(|&p| stubbed::alive(p))
        .collect();
    for pid in &live {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
    let calls = std::fs::read_to_string(dir.join("calls")).unwrap_or_default();
    let written = std::fs::read_to_string(&json).ok();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "status {:?} {took:?} after SIGINT\nstdout:\n{}\nstderr:\n{}\nip calls:\n{calls}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(under_way, "no measurement started: {text}");
    assert_eq!(out.status.signal(), Some(libc::SIGINT), "{text}");
    assert!(took < Duration::from_secs(10), "{text}");
    assert!(live.is_empty(), "left running: {live:?}\n{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stopping after 0 of 4 runs (SIGINT)")
            && stderr.contains("interrupted by SIGINT"),
        "{text}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("compare: write-bw, medians of 2"),
        "the table is printed: {text}"
    );
    // The bed went down after the measurement's client started.
    let after_client = calls
        .split_once("ip netns exec iwb")
        .map_or("", |(_, after)| after);
    assert!(
        after_client.contains("ip link show dev iwa0")
            && after_client.contains("ip link show dev iwb0"),
        "no scripts/netns.sh down at the end: {text}"
    );
    let v: serde_json::Value = serde_json::from_str(&written.unwrap_or_default())
        .unwrap_or_else(|e| panic!("no JSON written ({e}): {text}"));
    assert_eq!(v["interrupted"], "SIGINT", "{v}");
    assert_eq!(v["rounds"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["failed"].as_array().map(Vec::len), Some(0), "{v}");
}
