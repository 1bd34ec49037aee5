//! `iwarp-bench compare` on the veth bed with a short setting: bw at two sizes over raw AF_XDP,
//! the engine, the socket transport and iperf3, and lat at one size without iperf3 (which
//! measures no latency). The JSON has every round and a positive median per size and
//! transport; the SVG plot is a whole SVG document with one series per transport (its legend
//! entry and a marker per size); the table has the engine's ratio to each other transport.
//!
//! Needs root and iperf3; skips (or fails under `CI=true`) otherwise.

mod common;

use std::process::Command;

use common::{bin, have, require, OutputWithin, RUN_LIMIT};
use serde_json::Value;
use testbed::*;

fn compare(name: &str, args: &[&str], transports: &[&str], sizes: usize) {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (json, svg) = (
        dir.join(format!("{name}.json")),
        dir.join(format!("{name}.svg")),
    );
    let out = Command::new(bin())
        .arg("compare")
        .args(args)
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output_within(RUN_LIMIT)
        .expect("run compare");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{name}:\n{so}\n{se}");
    // Latency ratios are the other's time over the engine's, and named so.
    let lat_run = args.contains(&"lat");
    for t in transports.iter().filter(|&&t| t != "xdp") {
        let ratio = if lat_run {
            format!("{t}/xdp")
        } else {
            format!("xdp/{t}")
        };
        assert!(so.contains(&ratio), "{name}: no ratio to {t}:\n{so}");
    }

    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("valid JSON");
    let medians = v["medians"].as_array().expect("medians");
    assert_eq!(medians.len(), sizes * transports.len(), "{v}");
    let lat = v["test"] == "write-lat";
    // The test `--test` named (every call here gives it first).
    let test = match args[1] {
        "bw" => "write-bw",
        "lat" => "write-lat",
        other => other,
    };
    assert_eq!(v["test"], test, "{v}");
    for m in medians {
        assert!(m["value"].as_f64().unwrap_or(0.0) > 0.0, "{m}");
        // Latency runs report their 99th percentile too (the median of the rounds').
        if lat {
            assert!(
                m["p99"].as_f64().unwrap_or(0.0) >= m["value"].as_f64().unwrap_or(f64::MAX),
                "{m}"
            );
        }
        assert!(
            transports.contains(&m["transport"].as_str().unwrap_or("?")),
            "{m}"
        );
    }
    assert_eq!(v["rounds"].as_array().map(Vec::len), Some(medians.len()));

    let svg = std::fs::read_to_string(&svg).expect("svg");
    assert!(
        svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
        "{name}"
    );
    for t in transports {
        assert!(
            svg.contains(&format!("\n{t}\n</text>")),
            "{name}: no legend for {t}"
        );
    }
    assert_eq!(
        svg.matches("<circle").count(),
        sizes * transports.len(),
        "{name}: a marker per size and transport"
    );
}

#[test]
fn compare_runs_every_transport_and_plots_them() {
    if !require(have("iperf3"), "iperf3 is needed (scripts/install-deps.sh)") {
        return;
    }
    // `compare` takes the bed's lock and brings the bed up itself (holding the lock here
    // would keep it waiting).
    if !require(
        is_root(),
        "not root: compare brings up the veth bed (network namespaces, XDP)",
    ) {
        return;
    }
    compare(
        "compare-bw",
        &[
            "--test",
            "bw",
            "-s",
            "4096,65536",
            "-n",
            "300",
            "--rounds",
            "1",
        ],
        &["raw", "xdp", "socket", "iperf3"],
        2,
    );
    compare(
        "compare-lat",
        &["--test", "lat", "-s", "64", "-n", "500", "--rounds", "1"],
        &["raw", "xdp", "socket"],
        1,
    );
    compare(
        "compare-read-bw",
        &[
            "--test",
            "read-bw",
            "-s",
            "65536",
            "-n",
            "300",
            "--rounds",
            "1",
            "--transports",
            "xdp,socket",
        ],
        &["xdp", "socket"],
        1,
    );
    // Jumbo frames: raw AF_XDP and the engine with multi-buffer packets, kernel TCP with its
    // offloads.
    compare(
        "compare-bw-9000",
        &[
            "--test",
            "bw",
            "-s",
            "65536",
            "-n",
            "300",
            "--rounds",
            "1",
            "--mtu",
            "9000",
            "--offloads",
        ],
        &["raw", "xdp", "socket", "iperf3"],
        1,
    );
}

/// Runs `compare --json FILE` with `args`, bounded; returns its output and its JSON (the run
/// must succeed).
fn compare_json(name: &str, args: &[&str]) -> (std::process::Output, Value) {
    let json = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.json"));
    let out = Command::new(bin())
        .arg("compare")
        .args(args)
        .arg("--json")
        .arg(&json)
        .output_within(RUN_LIMIT)
        .expect("run compare");
    assert!(
        out.status.success(),
        "{name}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("JSON");
    (out, v)
}

/// The (size, transport) pairs of the JSON's medians.
fn medians_of(v: &Value) -> Vec<(u64, String)> {
    v["medians"]
        .as_array()
        .expect("medians")
        .iter()
        .map(|m| {
            assert!(m["value"].as_f64().unwrap_or(0.0) > 0.0, "{m}");
            (
                m["size"].as_u64().expect("size"),
                m["transport"].as_str().expect("transport").to_owned(),
            )
        })
        .collect()
}

/// `lat` with raw: at MTU 1500 raw sits out the sizes one frame cannot carry (saying so, and
/// in the JSON) while the engine runs them (the whole command was once refused); at MTU 9000
/// raw ping-pong carries 8 KiB messages in jumbo frames (its responder once never answered
/// them, and the run took a second per iteration).
#[test]
fn compare_lat_with_raw_at_every_mtu() {
    if !require(
        is_root(),
        "not root: compare brings up the veth bed (network namespaces, XDP)",
    ) {
        return;
    }
    let (out, v) = compare_json(
        "compare-lat-raw-1500",
        &[
            "--test",
            "lat",
            "-s",
            "64,4096",
            "-n",
            "200",
            "--rounds",
            "1",
            "--transports",
            "raw,xdp",
        ],
    );
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(
        se.contains("at most 1460 B at MTU 1500: raw left out at 4096 B"),
        "{se}"
    );
    let pairs = |p: &[(u64, &str)]| -> Vec<(u64, String)> {
        p.iter().map(|&(s, t)| (s, t.to_owned())).collect()
    };
    assert_eq!(
        medians_of(&v),
        pairs(&[(64, "raw"), (64, "xdp"), (4096, "xdp")]),
        "{v}"
    );
    assert_eq!(v["not_run"][0]["size"], 4096, "{v}");
    assert_eq!(v["not_run"][0]["transport"], "raw", "{v}");
    assert_eq!(v["failed"].as_array().map(Vec::len), Some(0), "{v}");

    let (_, v) = compare_json(
        "compare-lat-raw-9000",
        &[
            "--test",
            "lat",
            "-s",
            "8192",
            "-n",
            "200",
            "--rounds",
            "1",
            "--mtu",
            "9000",
            "--transports",
            "raw,xdp",
        ],
    );
    assert_eq!(
        medians_of(&v),
        pairs(&[(8192, "raw"), (8192, "xdp")]),
        "{v}"
    );
    assert_eq!(v["not_run"].as_array().map(Vec::len), Some(0), "{v}");
}
