//! `iwarp-bench raw` as a user runs it on the veth test bed (`scripts/netns.sh`): `raw rx` in
//! namespace `iwa`, `raw tx` and the `raw pingpong` initiator in `iwb`, each under
//! `ip netns exec`.
//!
//! Needs root. Without it (or without the bed) the test-bed tests print `SKIPPED: <why>` and
//! pass, except under `CI=true`, where they fail with the reason. They serialise with every other
//! test-bed user on `/run/lock/iwarp-netns.lock`, bring the bed up fresh and always take it down.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::{bin, OutputWithin, Tool, RUN_LIMIT};
use testbed::*;

/// `iwarp-bench raw <args>` inside namespace `ns`.
fn raw_in(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns])
        .arg(bin())
        .arg("raw")
        .args(args);
    c
}

/// A receiving process (`raw rx` or the ping-pong responder), started and waited on until it
/// prints its "ready" line on stderr (it starts "raw rx: ready on" or "raw pingpong: responder
/// ready on": an error's "already" is no "ready").
fn receiver(cmd: Command) -> Tool {
    let mut t = Tool::start(cmd);
    let line = t.wait_for(" ready on ", Duration::from_secs(30));
    assert!(
        line.starts_with("raw rx: ready on")
            || line.starts_with("raw pingpong: responder ready on"),
        "not a ready line: {line}"
    );
    t
}

fn json(out: &Output, what: &str) -> serde_json::Value {
    let s = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(s.trim()).unwrap_or_else(|e| {
        panic!(
            "{what}: stdout is not one JSON object ({e}):\n{s}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `raw rx` in iwa counts exactly the N frames `raw tx` in iwb sends (N fits in the RX rings,
/// so a slow receiver cannot lose any), and both report rates.
#[test]
fn raw_tx_to_raw_rx_moves_n_frames() {
    let _bed = bed_or_skip!();
    const N: &str = "2000";
    // The last round's payloads come from a 2 MiB region as the engine moves them.
    for (size, mode, source) in [
        ("64", "generic", None),
        ("1514", "driver", None),
        ("1514", "driver", Some("2")),
    ] {
        let rx = receiver(raw_in(
            "iwa",
            &[
                "rx", "--iface", "iwa0", "--count", N, "--size", size, "--mode", mode, "--port",
                "18610", "--json", "--quiet",
            ],
        ));
        let mut tx_args = vec![
            "tx",
            "--iface",
            "iwb0",
            "--count",
            N,
            "--size",
            size,
            "--dst-ip",
            "10.77.0.1",
            "--port",
            "18610",
            "--json",
            "--quiet",
        ];
        if let Some(mib) = source {
            tx_args.extend(["--source-mib", mib]);
        }
        let tx = raw_in("iwb", &tx_args)
            .output_within(RUN_LIMIT)
            .expect("run raw tx");
        assert!(
            tx.status.success(),
            "raw tx failed: {}",
            String::from_utf8_lossy(&tx.stderr)
        );
        let (rx_out, rx_err) = rx.finish(Duration::from_secs(60));
        assert!(
            rx_out.status.success(),
            "raw rx failed:\n{}\n{}\n{rx_err}",
            String::from_utf8_lossy(&rx_out.stdout),
            String::from_utf8_lossy(&rx_out.stderr)
        );
        let t = json(&tx, "raw tx");
        let r = json(&rx_out, "raw rx");
        assert_eq!(t["frames"], 2000, "{t}");
        assert_eq!(
            t["source_mib"].as_u64(),
            source.and_then(|m| m.parse().ok()),
            "{t}"
        );
        assert_eq!(r["frames"], 2000, "{r}");
        assert_eq!(r["frame_bytes"].as_u64(), size.parse::<u64>().ok(), "{r}");
        assert_eq!(r["xdp_mode"], mode, "{r}");
        assert!(t["gbit_per_sec"].as_f64().unwrap() > 0.0, "{t}");
        assert!(r["msg_rate_mpps"].as_f64().unwrap() > 0.0, "{r}");
        // Goodput is the frames' TCP payload: frame less 54 octets of headers.
        let frame = size.parse::<f64>().unwrap();
        for (j, what) in [(&t, "tx"), (&r, "rx")] {
            let (g, p) = (
                j["gbit_per_sec"].as_f64(),
                j["payload_gbit_per_sec"].as_f64(),
            );
            let (Some(g), Some(p)) = (g, p) else {
                panic!("{what}: no gbit_per_sec / payload_gbit_per_sec in {j}")
            };
            let want = g * (frame - 54.0) / frame;
            assert!(
                (p - want).abs() <= 1e-9 * g.max(1.0),
                "{what} goodput {p} vs {want}: {j}"
            );
        }
        println!("{size} B {mode} source {source:?}: tx {t}\nrx {r}");
        // Let the queues of iwa0 be released before the next round binds them again.
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `raw pingpong` of `count` measured iterations after `warmup`, frames of `size` octets, on
/// `port`: the responder in iwa, the initiator in iwb (killed after `limit`). Checks that both
/// succeed, the responder answered every frame and the initiator lost none; the initiator's
/// JSON report.
fn pingpong(port: &str, count: u64, warmup: u64, size: u64, limit: Duration) -> serde_json::Value {
    let (count_s, warmup_s, size_s) = (count.to_string(), warmup.to_string(), size.to_string());
    let pong = receiver(raw_in(
        "iwa",
        &[
            "pingpong", "--iface", "iwa0", "--count", &count_s, "--warmup", &warmup_s, "--port",
            port, "--quiet",
        ],
    ));
    let ping = raw_in(
        "iwb",
        &[
            "pingpong",
            "--iface",
            "iwb0",
            "--dst-ip",
            "10.77.0.1",
            "--count",
            &count_s,
            "--warmup",
            &warmup_s,
            "--port",
            port,
            "--size",
            &size_s,
            "--json",
            "--quiet",
        ],
    )
    .output_within(limit)
    .expect("run pingpong initiator");
    let (pong_out, pong_err) = pong.finish(Duration::from_secs(60));
    assert!(
        ping.status.success(),
        "initiator failed: {}\nresponder: {pong_err}",
        String::from_utf8_lossy(&ping.stderr)
    );
    assert!(pong_out.status.success(), "responder failed: {pong_err}");
    let answered = format!("answered {} frames", count + warmup);
    assert!(pong_err.contains(&answered), "{pong_err}");
    let v = json(&ping, "raw pingpong");
    assert_eq!(v["iterations"], count, "{v}");
    assert_eq!(v["lost"], 0, "{v}");
    assert_eq!(v["bytes"], size, "{v}");
    v
}

/// `raw pingpong`: responder in iwa, initiator in iwb; every iteration gets its echo and the
/// latency summary is in perftest's vocabulary.
#[test]
fn raw_pingpong_runs() {
    let _bed = bed_or_skip!();
    let v = pingpong("18620", 300, 20, 128, RUN_LIMIT);
    let (min, med, p99) = (
        v["t_min_us"].as_f64().unwrap(),
        v["t_typical_us"].as_f64().unwrap(),
        v["p99_us"].as_f64().unwrap(),
    );
    assert!(0.0 < min && min <= med && med <= p99, "{v}");
    println!("pingpong: {v}");
}

/// `raw pingpong` at MTU 9000 with frames of 8000 octets (multi-buffer AF_XDP: one packet over
/// several 4 KiB UMEM frames): the responder answers every one (it once copied each packet into
/// 4096 octets, so a larger one failed to parse and was never answered, and the initiator waited
/// a second for each).
#[test]
fn raw_pingpong_at_jumbo_mtu() {
    let bed = bed_or_skip!();
    bed.set_mtu(9000).expect("MTU 9000 on the bed");
    let v = pingpong("18630", 20, 0, 8000, Duration::from_secs(15));
    println!("pingpong at MTU 9000: {v}");
}

/// The initiator with no responder on the peer stops after `--timeout` (2 s here, 10 s by
/// default), saying the responder is not answering (it once went on for a second per ping:
/// 1000 pings, 1000 s).
#[test]
fn raw_pingpong_without_responder_fails_fast() {
    let _bed = bed_or_skip!();
    let start = std::time::Instant::now();
    let ping = raw_in(
        "iwb",
        &[
            "pingpong",
            "--iface",
            "iwb0",
            "--dst-ip",
            "10.77.0.1",
            "--count",
            "1000",
            "--warmup",
            "0",
            "--port",
            "18640",
            "--timeout",
            "2",
            "--json",
            "--quiet",
        ],
    )
    .output_within(Duration::from_secs(30))
    .expect("run pingpong initiator");
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&ping.stderr);
    assert!(
        !err.contains("[test: killed"),
        "still running after 30 s: {err}"
    );
    assert_eq!(ping.status.code(), Some(1), "{err}");
    assert!(err.contains("the responder is not answering"), "{err}");
    assert!(
        took >= Duration::from_secs(2),
        "gave up before its --timeout: {took:?}"
    );
    println!("without a responder: failed after {took:?}: {err}");
}

/// Without a test bed: the subcommand parses, and a missing interface or an option out of range
/// or out of place is a clear error.
#[test]
fn raw_cli_help_and_errors() {
    let help = Command::new(bin())
        .args(["raw", "--help"])
        .output_within(RUN_LIMIT)
        .expect("run");
    assert!(help.status.success());
    let h = String::from_utf8_lossy(&help.stdout);
    for sub in ["tx", "rx", "pingpong"] {
        assert!(h.contains(sub), "{h}");
    }
    let fails_with = |args: &[&str], error: &str| {
        let out = Command::new(bin())
            .arg("raw")
            .args(args)
            .output_within(RUN_LIMIT)
            .expect("run");
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains(error), "{args:?}: unexpected error: {e}");
    };
    fails_with(
        &["tx", "--iface", "nonexistent0", "--dst-ip", "10.77.0.1"],
        "\"nonexistent0\" not found",
    );
    fails_with(
        &["tx", "--iface", "lo", "--size", "20"],
        "--size 20 out of range",
    );
    fails_with(
        &["tx", "--iface", "lo", "--size", "64", "--source-mib", "1"],
        "--source-mib needs --size of at least 87",
    );
    fails_with(
        &["rx", "--iface", "lo", "--source-mib", "1"],
        "--source-mib applies to tx only",
    );
    // Counts refused before any interface is touched (exit 2, naming the option; never a
    // panic, an allocation of the whole count, or a count that wraps).
    let refused = |args: &[&str], error: &str| {
        let out = Command::new(bin())
            .arg("raw")
            .args(args)
            .output_within(RUN_LIMIT)
            .expect("run");
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(error), "{args:?}: unexpected error: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    };
    let max = u64::MAX.to_string();
    for (args, error) in [
        (
            vec!["rx", "--iface", "nonexistent0", "--count", "1"],
            "--count must be at least 2",
        ),
        (
            vec!["rx", "--iface", "nonexistent0", "--count", "0"],
            "--count must be at least 2",
        ),
        // The initiator.
        (
            vec![
                "pingpong",
                "--iface",
                "nonexistent0",
                "--dst-ip",
                "10.77.0.1",
                "--count",
                &max,
            ],
            "--count",
        ),
        // The responder.
        (
            vec!["pingpong", "--iface", "nonexistent0", "--count", &max],
            "--count",
        ),
        (
            vec!["pingpong", "--iface", "nonexistent0", "--warmup", &max],
            "--warmup",
        ),
    ] {
        refused(&args, error);
    }
}
