//! `iwarp-bench --transport xdp --json` carries the engine's counters: a short write-bw run
//! engine to engine on the veth test bed (server in `iwa`, client in `iwb`), both sides with
//! `--json`; each side's object has an `"engine"` object whose counters match the run (the
//! client sent every FPDU of every Write, the server received and placed them, one connection,
//! no CRC errors, no Terminates). The socket transport's `"engine": null` is checked in
//! `cli.rs`.
//!
//! Needs root; skips (or fails under `CI=true`) without the bed.

mod common;

use std::time::Duration;

use common::{bed_run, bench_in, counter, parse, wait_with_timeout, OutputWithin, RUN_LIMIT};
use testbed::*;

const PORT: &str = "18720";
const SIZE: u64 = 65536;
const ITERS: u64 = 200;

#[test]
fn xdp_json_reports_engine_counters() {
    let _bed = bed_or_skip!();
    let (size, iters) = (SIZE.to_string(), ITERS.to_string());
    let args = |iface: &'static str| {
        [
            "write-bw",
            "--transport",
            "xdp",
            "--iface",
            iface,
            "-p",
            PORT,
            "-s",
            &size,
            "-n",
            &iters,
            "--json",
        ]
        .map(str::to_owned)
    };
    // The client busy-polls (SO_PREFER_BUSY_POLL etc. on its sockets, a recvfrom on every
    // empty receive): on veth that gains nothing but must change nothing either.
    let mut client = args(DEV_B).to_vec();
    client.extend(["--engine-busy-poll", "20"].map(str::to_owned));
    // The server's engine holds nothing out of order (a budget of 0): data that arrives out of
    // order comes again from the client. Its steering program runs as generic XDP.
    let mut server = args(DEV_A).to_vec();
    server.extend(
        [
            "--engine-reassembly-budget-mib",
            "0",
            "--xdp-mode",
            "generic",
        ]
        .map(str::to_owned),
    );
    let (c, s) = bed_run(&server, &client);
    // veth offers no zero-copy: the default bind falls back to copy mode and says so.
    for side in [&c, &s] {
        assert_eq!(side["engine"]["zero_copy"], false, "{side}");
    }
    // Where each side's steering program runs: veth has native XDP (the default, `auto`,
    // takes it); the server asked for generic.
    assert_eq!(c["engine"]["xdp_mode"], "driver", "{c}");
    assert_eq!(s["engine"]["xdp_mode"], "generic", "{s}");

    // The fields scripts read are unchanged.
    assert_eq!(c["transport"], "xdp", "{c}");
    assert!(
        c["results"][0]["gbit_per_sec"].as_f64().unwrap_or(0.0) > 0.0,
        "{c}"
    );
    let mulpdu = c["mulpdu"].as_u64().expect("mulpdu");
    assert!(mulpdu > 0, "{c}");
    // Every Write of SIZE bytes went out in at least SIZE / MULPDU FPDUs (rounded up).
    let write_fpdus = ITERS * SIZE.div_ceil(mulpdu);

    for (who, side) in [("client", &c), ("server", &s)] {
        assert!(side["engine"].is_object(), "{who}: {side}");
        assert_eq!(counter(side, "connections"), 1, "{who}: {side}");
        assert_eq!(counter(side, "crc_errors"), 0, "{who}: {side}");
        assert_eq!(counter(side, "terminates_sent"), 0, "{who}: {side}");
        assert_eq!(counter(side, "terminates_received"), 0, "{who}: {side}");
        assert!(side["engine"]["error"].is_null(), "{who}: {side}");
        assert!(counter(side, "frames_rx") > 0, "{who}: {side}");
        assert!(counter(side, "frames_tx") > 0, "{who}: {side}");
        assert!(
            counter(side, "turns_engine_thread") + counter(side, "turns_application") > 0,
            "{who}: {side}"
        );
        for name in [
            "segments_rx",
            "segments_out_of_order",
            "bytes_placed_out_of_order",
            "fpdus_placed_out_of_order",
            "held_peak_bytes",
            "held_peak_gaps",
            "held_gap_peak_bytes",
            "reassembly_releases",
            "reassembly_refusals",
            "held_timeouts",
            "retransmitted_segments",
            "rto_expirations",
            "loss_probes",
            "fast_recoveries",
            "spurious_undone",
            "paws_drops",
            "parks",
            "parked_wakes",
            "watchdog_wakes",
            "shards",
            "handoffs",
            "handoff_drops",
            "frames_dropped_by_kernel",
            "multi_frame_rx",
            "multi_frame_rx_dropped",
            "multi_frame_tx",
            "descriptors_refused",
        ] {
            counter(side, name);
        }
    }
    // What held TCP's sending back, in milliseconds: the sender had data in flight with
    // nothing more queued at least for the last round trip.
    for side in [&s, &c] {
        for name in [
            "send_limited_by_peer_window_ms",
            "send_limited_by_cwnd_ms",
            "send_limited_by_sender_ms",
        ] {
            let ms = side["engine"][name].as_f64();
            assert!(ms.is_some_and(|ms| ms >= 0.0), "{name}: {side}");
        }
    }
    assert!(
        c["engine"]["send_limited_by_sender_ms"].as_f64() > Some(0.0),
        "{c}"
    );
    // The server's engine waited at least for the client's first Write after the connection
    // came up.
    assert!(s["engine"]["idle_ms"].as_f64() > Some(0.0), "{s}");
    assert!(c["engine"]["idle_ms"].as_f64() >= Some(0.0), "{c}");
    // The sender: every FPDU of every Write, in at least as many frames as it had FPDUs of
    // MULPDU (one full-sized FPDU per segment).
    assert!(counter(&c, "fpdus_tx") >= write_fpdus, "{c}");
    assert!(counter(&c, "frames_tx") >= write_fpdus, "{c}");
    // The receiver: took them all in order and placed every payload octet.
    assert!(counter(&s, "fpdus_rx") >= write_fpdus, "{s}");
    assert!(counter(&s, "segments_rx") >= write_fpdus, "{s}");
    assert!(
        counter(&s, "bytes_placed_in_order") + counter(&s, "bytes_placed_out_of_order")
            >= ITERS * SIZE,
        "{s}"
    );
    // Each side's receive count matches what the other sent: the server's FPDUs are the
    // acknowledgements and phase verdicts, the client's its control messages.
    assert_eq!(counter(&s, "fpdus_rx"), counter(&c, "fpdus_tx"), "{s}\n{c}");
    assert_eq!(counter(&c, "fpdus_rx"), counter(&s, "fpdus_tx"), "{s}\n{c}");
}

/// `iwarp-bench perftest ... --transport xdp --json` carries the same `"engine"` object: a
/// short perftest write-bw between two engines, each side's counters present and consistent
/// (one connection, no CRC errors or Terminates, the client's FPDUs all received).
#[test]
fn perftest_json_reports_engine_counters() {
    let _bed = bed_or_skip!();
    let common = ["-p", "18722", "-s", "65536", "-n", "50", "--json"];
    let mut server_args = vec![
        "perftest",
        "write-bw",
        "--transport",
        "xdp",
        "--iface",
        DEV_A,
        "--xdp-mode",
        "driver",
    ];
    server_args.extend(common);
    let server = bench_in(NS_A, &server_args).spawn().expect("start server");
    let addr = ADDR_A.to_string();
    let mut client_args = vec!["perftest", "write-bw", &addr, "--transport", "xdp"];
    client_args.extend(["--iface", DEV_B, "--timeout", "20"]);
    client_args.extend(common);
    // The perftest client retries by itself while nobody listens yet.
    let client = bench_in(NS_B, &client_args)
        .output_within(RUN_LIMIT)
        .expect("run client");
    let server = wait_with_timeout(server, Duration::from_secs(60));
    let c = parse("perftest client", &client);
    let s = parse("perftest server", &server);
    for (who, side) in [("client", &c), ("server", &s)] {
        assert!(side["engine"].is_object(), "{who}: {side}");
        assert_eq!(counter(side, "connections"), 2, "{who}: {side}");
        assert_eq!(counter(side, "crc_errors"), 0, "{who}: {side}");
        assert_eq!(counter(side, "terminates_sent"), 0, "{who}: {side}");
        assert!(side["engine"]["error"].is_null(), "{who}: {side}");
        assert_eq!(side["engine"]["xdp_mode"], "driver", "{who}: {side}");
    }
    // 50 Writes of 64 KiB in FPDUs of at most 1500 octets' payload (MTU 1500).
    assert!(counter(&c, "fpdus_tx") >= 50 * 65536 / 1500, "{c}");
    assert_eq!(counter(&s, "fpdus_rx"), counter(&c, "fpdus_tx"), "{s}\n{c}");
}

/// RFC 7306 engine to engine: atomic-bw and atomic-lat (every original value and the final
/// counter checked), and write-bw and send-lat with Immediate Data after every message (each
/// value checked by the receiver); the RDMAP extensions on at both ends, no Terminate.
#[test]
fn rfc7306_tests_engine_to_engine() {
    let _bed = bed_or_skip!();
    for (test, flag, size, port) in [
        ("atomic-bw", None, 8u64, "18721"),
        ("atomic-lat", None, 8, "18722"),
        ("write-bw", Some("--write-with-imm"), 4096, "18723"),
        ("send-lat", Some("--send-with-imm"), 64, "18724"),
    ] {
        let args = |iface: &'static str| {
            let mut v = [
                test,
                "--transport",
                "xdp",
                "--iface",
                iface,
                "-p",
                port,
                "-n",
                "20000",
                "--json",
            ]
            .map(str::to_owned)
            .to_vec();
            if size != 8 {
                v.extend(["-s".to_string(), size.to_string()]);
            }
            v
        };
        let mut client_args = args(DEV_B);
        client_args.extend(flag.map(str::to_owned));
        let (c, s) = bed_run(&args(DEV_A), &client_args);
        assert_eq!(c["results"][0]["iterations"], 20000, "{test}: {c}");
        if test == "write-bw" {
            // The server checks the slots the Writes cycle through once they are done (and
            // each Immediate Data value as it arrives).
            assert!(c["verified_bytes_server"].as_u64() > Some(0), "{test}: {c}");
        } else {
            assert_eq!(c["verified_bytes_server"], size * 20000, "{test}: {c}");
            assert_eq!(c["verified_bytes_client"], size * 20000, "{test}: {c}");
        }
        for (who, side) in [("client", &c), ("server", &s)] {
            assert_eq!(counter(side, "terminates_sent"), 0, "{test} {who}: {side}");
            assert_eq!(
                counter(side, "terminates_received"),
                0,
                "{test} {who}: {side}"
            );
        }
        println!("{test}: {}", c["results"][0]);
    }
}
