//! `iwarp-bench` as a user runs it: every test, server and client on loopback, across sizes and
//! MPA settings, with the data verified by both sides (a failed check fails the run).

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

fn run_ok(test: &str, args: &[&str]) -> String {
    let port = free_port();
    let (server, client) = run_pair(test, port, args);
    let (so, se) = (
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr),
    );
    assert!(
        client.status.success(),
        "{test} {args:?} client failed:\n{so}\n{se}\nserver:\n{}",
        String::from_utf8_lossy(&server.stderr)
    );
    assert!(
        server.status.success(),
        "{test} {args:?} server failed:\n{}",
        String::from_utf8_lossy(&server.stderr)
    );
    so.into_owned()
}

#[test]
fn every_test_all_sizes() {
    for test in [
        "write-bw",
        "read-bw",
        "send-bw",
        "write-lat",
        "read-lat",
        "send-lat",
    ] {
        let out = run_ok(test, &["-a", "-n", "2", "--json"]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
        // The socket transport has no engine: the key is there, its value null.
        assert!(v.get("engine").is_some_and(|e| e.is_null()), "{test}: {v}");
        let results = v["results"].as_array().expect("results array");
        assert_eq!(
            results.len(),
            23,
            "{test}: one row per size from 2 B to 8 MiB"
        );
        let checked = v["verified_bytes_server"].as_u64().unwrap_or(0)
            + v["verified_bytes_client"].as_u64().unwrap_or(0);
        // Each of the 23 sizes moved at least one verified message.
        assert!(
            checked >= (2..=23).map(|e| 1u64 << e).sum::<u64>(),
            "{test}: {checked}"
        );
    }
}

#[test]
fn mpa_settings_matrix() {
    for (rev, crc, markers) in [
        ("1", "on", "off"),
        ("1", "off", "on"),
        ("2", "off", "off"),
        ("2", "on", "on"),
    ] {
        for test in ["write-bw", "send-lat", "read-bw"] {
            let args = [
                "--mpa-rev",
                rev,
                "--crc",
                crc,
                "--markers",
                markers,
                "-s",
                "5000",
                "-n",
                "50",
                "--json",
            ];
            let out = run_ok(test, &args);
            let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
            assert_eq!(v["mpa_rev"].as_u64(), Some(rev.parse().unwrap()), "{out}");
            assert_eq!(v["crc"].as_bool(), Some(crc == "on"), "{out}");
            assert_eq!(v["markers_rx"].as_bool(), Some(markers == "on"), "{out}");
            assert_eq!(v["markers_tx"].as_bool(), Some(markers == "on"), "{out}");
        }
    }
}

/// `--framing ift` (draft-williams-iwarp-ift-01) on both sides: every test over IFT frames,
/// with and without CRCs, several sizes, the data verified by both sides; the report names
/// the framing and each direction's CRCs. An IFT client against an MPA server fails at once.
#[test]
fn every_test_over_ift_framing() {
    for crc in ["on", "off"] {
        for test in [
            "write-bw",
            "read-bw",
            "send-bw",
            "write-lat",
            "read-lat",
            "send-lat",
        ] {
            let out = run_ok(
                test,
                &["--framing", "ift", "--crc", crc, "-a", "-n", "2", "--json"],
            );
            let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
            assert_eq!(v["framing"], "ift", "{test}: {v}");
            for key in [
                "header_crc_tx",
                "payload_crc_tx",
                "header_crc_rx",
                "payload_crc_rx",
            ] {
                assert_eq!(v[key].as_bool(), Some(crc == "on"), "{test} {key}: {v}");
            }
            assert!(v.get("mpa_rev").is_none(), "{test}: {v}");
            assert_eq!(v["results"].as_array().map(Vec::len), Some(23), "{test}");
            let checked = v["verified_bytes_server"].as_u64().unwrap_or(0)
                + v["verified_bytes_client"].as_u64().unwrap_or(0);
            assert!(
                checked >= (2..=23).map(|e| 1u64 << e).sum::<u64>(),
                "{test}: {checked}"
            );
        }
    }
    // The MPA server refuses the IFT client's indication and goes on listening; the client
    // fails at once, saying why.
    let port = free_port().to_string();
    let mut server = Command::new(bin())
        .args([
            "write-bw",
            "--bind",
            "127.0.0.1",
            "--port",
            &port,
            "-n",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start server");
    let started = std::time::Instant::now();
    let client = client_once_listening(&mut server, || {
        Command::new(bin())
            // A setup deadline far beyond the bound below: a refusal that came only at the
            // MPA server's own startup deadline (10 s) would miss it.
            .args(["write-bw", "--port", &port, "-n", "2", "--framing", "ift"])
            .args(["--timeout", "60"])
            .arg("127.0.0.1")
            .output_within(RUN_LIMIT)
            .expect("run client")
    });
    let _ = server.kill();
    let _ = server.wait();
    let err = String::from_utf8_lossy(&client.stderr);
    assert!(!client.status.success(), "{err}");
    assert!(err.contains("IFT") && err.contains("MPA"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// `--cq poll` on both sides: the bandwidth tests take their completions by polling (no
/// blocking wait on the queue, which `--cq wait` makes), with the same verified result.
#[test]
fn bandwidth_tests_polling_the_cq() {
    for test in ["write-bw", "read-bw", "send-bw"] {
        let out = run_ok(test, &["-s", "4096", "-n", "300", "--cq", "poll", "--json"]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
        assert_eq!(v["results"][0]["iterations"], 300, "{test}: {v}");
        assert_eq!(
            (&v["cq"], &v["cq_blocking_waits"]),
            (&"poll".into(), &0.into()),
            "{test}: {v}"
        );
        let checked = v["verified_bytes_server"].as_u64().unwrap_or(0)
            + v["verified_bytes_client"].as_u64().unwrap_or(0);
        // The buffer holds tx-depth (128) slots of the size, reused round robin.
        assert!(checked >= 128 * 4096, "{test}: {v}");
    }
    // The default, for the difference.
    let out = run_ok("write-bw", &["-s", "4096", "-n", "300", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(v["cq"], "wait", "{v}");
    assert!(v["cq_blocking_waits"].as_u64().unwrap_or(0) > 0, "{v}");
}

/// `--slots 2`: write-bw and read-bw cycle through two message slots (perftest's buffer reuse),
/// every message still verified: the server checks the two slots Writes left, the client every
/// Read as it completes.
#[test]
fn bandwidth_tests_over_two_slots() {
    for test in ["write-bw", "read-bw"] {
        let out = run_ok(test, &["-s", "4096", "-n", "300", "--slots", "2", "--json"]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
        assert_eq!(v["results"][0]["iterations"], 300, "{test}: {v}");
        assert_eq!(v["slots"], 2, "{test}: {v}");
        let (server, client) = (
            v["verified_bytes_server"].as_u64().unwrap_or(0),
            v["verified_bytes_client"].as_u64().unwrap_or(0),
        );
        if test == "write-bw" {
            assert_eq!(server, 2 * 4096, "{test}: {v}");
        } else {
            assert_eq!(client, 300 * 4096, "{test}: {v}");
        }
    }
}

/// `--cq-mod`: one work request in N signaled (perftest's selective signaling). Every message
/// still counted and verified, with N not dividing the count, larger than the send queue
/// (acts as its depth), and in duration mode (the last request is always signaled, or the
/// run could not end).
#[test]
fn bandwidth_tests_with_selective_signaling() {
    for test in ["write-bw", "read-bw", "send-bw"] {
        for (cq_mod, in_force) in [("7", 7), ("1000", 128), ("1", 1)] {
            let args = ["-s", "4096", "-n", "301", "--cq-mod", cq_mod, "--json"];
            let out = run_ok(test, &args);
            let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
            assert_eq!(v["results"][0]["iterations"], 301, "{test} {cq_mod}: {v}");
            assert_eq!(v["cq_mod"], in_force, "{test} {cq_mod}: {v}");
            let (server, client) = (
                v["verified_bytes_server"].as_u64().unwrap_or(0),
                v["verified_bytes_client"].as_u64().unwrap_or(0),
            );
            match test {
                "read-bw" => assert_eq!(client, 301 * 4096, "{test} {cq_mod}: {v}"),
                "send-bw" => assert_eq!(server, 301 * 4096, "{test} {cq_mod}: {v}"),
                _ => assert_eq!(server, 128 * 4096, "{test} {cq_mod}: {v}"),
            }
        }
    }
    let out = run_ok(
        "write-bw",
        &["-s", "4096", "-D", "0.3", "--cq-mod", "7", "--json"],
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert!(v["results"][0]["iterations"].as_u64() > Some(10), "{v}");
}

/// `-D 4` on a bandwidth test counts, as perftest, only the messages completed in the middle
/// two seconds (a second of warm-up and one of drain left out: margin = 4 / 4), over those
/// two seconds. The server's check still covers the whole run.
#[test]
fn duration_counts_the_middle_of_the_run() {
    for test in ["write-bw", "atomic-bw"] {
        let out = run_ok(test, &["-D", "4", "--json"]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
        let r = &v["results"][0];
        assert_eq!(r["seconds"].as_f64(), Some(2.0), "{test}: {v}");
        assert!(r["iterations"].as_u64() > Some(0), "{test}: {v}");
        if test == "atomic-bw" {
            // The server's counter saw every operation, the middle's and the margins'.
            let all = v["verified_bytes_server"].as_u64().unwrap_or(0) / 8;
            assert!(all > r["iterations"].as_u64().unwrap_or(0), "{test}: {v}");
        }
    }
}

/// A `-D` too short for anything to complete in its sampling window fails the run (exit 1,
/// naming `-D`) instead of printing a row of zeros as a success.
#[test]
fn a_duration_that_counts_nothing_fails() {
    for test in ["write-bw", "write-lat"] {
        let port = free_port();
        let (server, client) = run_pair(test, port, &["-s", "64", "-D", "0.000001"]);
        let err = String::from_utf8_lossy(&client.stderr);
        assert_eq!(client.status.code(), Some(1), "{test}: {err}");
        assert!(err.contains("-D"), "{test}: {err}");
        assert!(!server.status.success(), "{test}");
    }
}

/// A size that runs longer than a second reports its progress on stderr once a second.
#[test]
fn long_runs_report_progress() {
    let port = free_port();
    let (server, client) = run_pair("write-bw", port, &["-s", "4096", "-D", "1.6"]);
    assert!(client.status.success() && server.status.success());
    let err = String::from_utf8_lossy(&client.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("write-bw 4096 B:") && l.contains("Gbit/s so far"))
        .collect();
    assert_eq!(lines.len(), 1, "one progress line in 1.6 s:\n{err}");
    assert!(lines[0].contains("of 1.6 s"), "{err}");
}

/// A latency test with `-D` prints perftest's duration columns and row
/// (`RESULT_FMT_LAT_DUR`, `print_report_lat_duration`): size, the round trips of the sampling
/// window, their average half round trip and the rate; `--json` gives the window's
/// distribution and the rate.
#[test]
fn duration_mode_and_table_output() {
    let out = run_ok("write-lat", &["-D", "0.3", "-s", "64"]);
    let header = " #bytes        #iterations       t_avg[usec]    tps average";
    assert!(out.contains(header), "{out}");
    assert!(!out.contains("t_typical[usec]"), "{out}");
    // perftest's header block, its column line, then the row.
    let row = out
        .lines()
        .skip_while(|l| *l != header)
        .nth(1)
        .expect("a result row");
    let fields: Vec<f64> = row
        .split_whitespace()
        .map(|f| f.parse().expect("a number"))
        .collect();
    assert_eq!(fields.len(), 4, "{row}");
    let (size, iters, t_avg, tps) = (fields[0], fields[1], fields[2], fields[3]);
    assert_eq!(size, 64.0, "{row}");
    assert!(iters > 10.0 && t_avg > 0.0, "{row}");
    // Under 4 s there are no margins: the window is the whole 0.3 s.
    assert!((tps * 0.3 - iters).abs() <= 1.0, "{row}");
    let out = run_ok("read-lat", &["-D", "0.3", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    let r = &v["results"][0];
    assert!(r["iterations"].as_u64() > Some(10), "{v}");
    assert!(
        r["tps"].as_f64() > Some(0.0) && r["t_typical_us"].as_f64() > Some(0.0),
        "{v}"
    );
    // Without -D: no rate.
    let out = run_ok("read-lat", &["-n", "20", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert!(v["results"][0].get("tps").is_none(), "{v}");
}

/// A latency test with perftest's defaults: 2-octet messages, 1000 iterations, and the
/// header's TX depth 1 (perftest's `DEF_TX_LAT`), as `ib_write_lat` prints them.
#[test]
fn latency_defaults_are_perftests() {
    let out = run_ok("write-lat", &[]);
    assert!(out.contains(" TX depth        : 1\n"), "{out}");
    let row = out
        .lines()
        .skip_while(|l| !l.contains("t_typical[usec]"))
        .nth(1)
        .expect("a result row");
    let fields: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(fields[..2], ["2", "1000"], "{row}");
}

/// A port taken before the server binds it (another test's connection may get the port
/// `free_port` gave as its ephemeral one) makes the pair move to a fresh port.
#[test]
fn a_taken_port_is_replaced_by_a_fresh_one() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = holder.local_addr().expect("its address").port();
    let (server, client) = run_pair(
        "write-lat",
        port,
        &["-n", "10", "-s", "64", "--timeout", "2"],
    );
    assert!(
        server.status.success() && client.status.success(),
        "server:\n{}\nclient:\n{}",
        String::from_utf8_lossy(&server.stderr),
        String::from_utf8_lossy(&client.stderr)
    );
    drop(holder);
}

/// atomic-bw and atomic-lat (RFC 7306, both operations): one 8-octet row, every original
/// value checked by the client and the counter's final value by the server.
#[test]
fn atomic_tests_check_every_original_and_the_final_counter() {
    for test in ["atomic-bw", "atomic-lat"] {
        for op in ["fetch-and-add", "CMP_AND_SWAP"] {
            let out = run_ok(test, &["-n", "3000", "-A", op, "--json"]);
            let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
            let r = &v["results"][0];
            assert_eq!(v["results"].as_array().map(Vec::len), Some(1), "{v}");
            assert_eq!(r["bytes"], 8, "{test} {op}: {v}");
            assert_eq!(r["iterations"], 3000, "{test} {op}: {v}");
            assert_eq!(v["verified_bytes_client"], 8 * 3000, "{test} {op}: {v}");
            assert_eq!(v["verified_bytes_server"], 8 * 3000, "{test} {op}: {v}");
        }
    }
}

/// `--write-with-imm` and `--send-with-imm` (RFC 7306 Immediate Data after every Write or
/// Send, given to the client only): the data is verified as without them, and the receiver
/// checks each Immediate Data value (a wrong one fails the run). With MPA framing the server
/// learns it from the client's hello in the MPA Request; with IFT framing (the hello comes
/// after the accept) as well.
#[test]
fn immediate_data_after_every_write_and_send() {
    for framing in ["mpa", "ift"] {
        for (test, flag) in [
            ("write-bw", "--write-with-imm"),
            ("write-lat", "--write-with-imm"),
            ("send-bw", "--send-with-imm"),
            ("send-lat", "--send-with-imm"),
        ] {
            let port = free_port();
            let (server, client) = run_pair_with(
                test,
                port,
                &["-n", "500", "-s", "1024", "--framing", framing],
                &[flag],
            );
            let so = String::from_utf8_lossy(&client.stdout);
            let se = String::from_utf8_lossy(&client.stderr);
            assert!(
                client.status.success(),
                "{framing} {test} {flag}: {so}\n{se}"
            );
            assert!(
                server.status.success(),
                "{framing} {test} {flag} server: {}",
                String::from_utf8_lossy(&server.stderr)
            );
            assert!(
                se.contains("data verified"),
                "{framing} {test} {flag}: {se}"
            );
        }
        // A server given the flag refuses a client that was not (it would wait for Immediate
        // Data that never comes), saying why.
        let (server, client) = run_pair_sides(
            "write-lat",
            free_port(),
            &["-n", "5", "--framing", framing],
            &["--write-with-imm"],
            &[],
        );
        let err = String::from_utf8_lossy(&server.stderr);
        assert!(
            !server.status.success(),
            "{framing}: the server accepted: {err}"
        );
        assert!(err.contains("--write-with-imm"), "{framing}: {err}");
        assert!(!client.status.success(), "{framing}: the client succeeded");
    }
}

/// perftest's SYMMETRIC options (and `-t`) given to the server must match the client's: a
/// server given `-s`, `-a`, `-n`, `-D`, `-t` or `-q` that the client's hello contradicts
/// refuses the connection, both sides saying which option differs; given the same, or
/// nothing, it runs.
#[test]
fn a_server_refuses_a_client_whose_symmetric_options_differ() {
    for (test, server, client, says) in [
        (
            "write-bw",
            &["-s", "4096", "-n", "50"][..],
            &["-s", "65536", "-n", "50"][..],
            "client asked for -s 65536, this server was given -s 4096",
        ),
        (
            "write-lat",
            &["-a", "-n", "2"],
            &["-s", "64", "-n", "2"],
            "client asked for -s 64, this server was given -a",
        ),
        (
            "send-bw",
            &["-s", "4096", "-n", "100"],
            &["-s", "4096", "-n", "200"],
            "client asked for -n 200, this server was given -n 100",
        ),
        (
            "read-bw",
            &["-s", "4096", "-D", "1"],
            &["-s", "4096", "-n", "100"],
            "client asked for -n 100, this server was given -D 1",
        ),
        (
            "write-bw",
            &["-s", "4096", "-n", "200", "-t", "64"],
            &["-s", "4096", "-n", "200"],
            "client asked for -t 128, this server was given -t 64",
        ),
        // -t held to -n (perftest's force_dependecies) at both ends before they are compared.
        (
            "write-bw",
            &["-s", "4096", "-t", "64"],
            &["-s", "4096", "-n", "100", "-t", "128"],
            "client asked for -t 100, this server was given -t 64",
        ),
        (
            "send-bw",
            &["-s", "4096", "-n", "100", "-r", "32"],
            &["-s", "4096", "-n", "100"],
            "client asked for no -r, this server was given -r 32",
        ),
        (
            "write-bw",
            &["-s", "4096", "-n", "100", "-q", "2"],
            &["-s", "4096", "-n", "100"],
            "client asked for -q 1, this server was given -q 2",
        ),
    ] {
        let (s, c) = run_pair_sides(test, free_port(), &[], server, client);
        let (serr, cerr) = (
            String::from_utf8_lossy(&s.stderr),
            String::from_utf8_lossy(&c.stderr),
        );
        assert!(
            !s.status.success(),
            "{test} {server:?}: server ran:\n{serr}"
        );
        assert!(
            !c.status.success(),
            "{test} {client:?}: client ran:\n{cerr}"
        );
        assert!(serr.contains(says), "{test}: server:\n{serr}");
        assert!(cerr.contains(says), "{test}: client:\n{cerr}");
    }
    // The same options at both ends, or none at the server: the run goes ahead (-t 128
    // held to -n 50 at both ends).
    let given = &["-s", "4096", "-n", "50", "-t", "16"][..];
    for (server, client) in [
        (given, given),
        (&[], given),
        (&["-s", "4096", "-t", "128"], &["-s", "4096", "-n", "50"]),
    ] {
        let (s, c) = run_pair_sides("write-bw", free_port(), &[], server, client);
        assert!(
            s.status.success() && c.status.success(),
            "{server:?}: {}",
            String::from_utf8_lossy(&s.stderr)
        );
    }
}

/// `-p 0` (the kernel picks the port, socket transport): the server's banner names the port
/// it listens on, and a client given that port runs; the same for rping's server.
#[test]
fn port_0_banner_names_the_bound_port() {
    let port_of = |line: &str| -> String {
        let port = line.rsplit(':').next().unwrap_or("").trim().to_string();
        assert!(
            port.parse::<u16>().is_ok_and(|p| p != 0),
            "no bound port in {line:?}"
        );
        port
    };
    let mut server = Tool::start({
        let mut c = Command::new(bin());
        c.args(["write-bw", "--bind", "127.0.0.1", "-p", "0", "-n", "20"]);
        c
    });
    let port = port_of(&server.wait_for("listening on", Duration::from_secs(20)));
    let client = Command::new(bin())
        .args(["write-bw", "-p", &port, "-n", "20", "127.0.0.1"])
        .output_within(RUN_LIMIT)
        .expect("run client");
    let (out, err) = server.finish(Duration::from_secs(30));
    assert!(
        client.status.success() && out.status.success(),
        "client: {}\nserver: {err}",
        String::from_utf8_lossy(&client.stderr)
    );

    let mut server = Tool::start({
        let mut c = Command::new(bin());
        c.args(["rping", "-s", "-a", "127.0.0.1", "-p", "0", "-C", "2"]);
        c
    });
    let port = port_of(&server.wait_for("listening on", Duration::from_secs(20)));
    let client = Command::new(bin())
        .args(["rping", "-c", "-a", "127.0.0.1", "-p", &port, "-C", "2"])
        .output_within(RUN_LIMIT)
        .expect("run rping client");
    let (out, err) = server.finish(Duration::from_secs(30));
    assert!(
        client.status.success() && out.status.success(),
        "client: {}\nserver: {err}",
        String::from_utf8_lossy(&client.stderr)
    );
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    for args in [
        &["atomic-bw", "-s", "64"][..],
        &["read-bw", "--write-with-imm"],
        &["write-bw", "--send-with-imm"],
        &["atomic-lat", "-a"],
        &["perftest", "atomic-bw", "127.0.0.1"],
        &["write-bw", "-s", "0"][..],
        &["write-bw", "--mpa-rev", "3"],
        &["write-bw", "--slots", "1025"],
        &["write-bw", "--cq-mod", "0"],
        &["write-bw", "--stats-every", "1"],
        &["write-bw", "-U"],
        &["write-bw", "-e", "--cq", "poll"],
        &["read-bw", "--report-histogram"],
        &["write-lat", "-I", "237"],
        &["read-bw", "-I", "16"],
        &["atomic-lat", "-I", "8"],
        &[
            "write-bw",
            "--transport",
            "xdp",
            "--iface",
            "lo",
            "--stats-every",
            "0",
        ],
        &["stats", "--nope"],
        &["nope"],
    ] {
        let out = std::process::Command::new(bin())
            .args(args)
            .output_within(RUN_LIMIT)
            .expect("run");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // MPA's own options with IFT framing, which would drop them: refused as arguments. (As
    // clients of a port nobody listens on, so that a run that went ahead would end at once.)
    for args in [
        &["write-bw", "--framing", "ift", "--markers", "on"][..],
        &["write-bw", "--framing", "ift", "--mpa-rev", "1"],
        &[
            "write-lat",
            "--framing",
            "ift",
            "--mpa-rev",
            "1",
            "--markers",
            "on",
        ],
    ] {
        let out = std::process::Command::new(bin())
            .args(args)
            .args(["-p", "1", "127.0.0.1"])
            .output_within(RUN_LIMIT)
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--framing ift"), "{args:?}: {err}");
    }
    // `--pcap` captures the AF_XDP engine's frames and `--xdp-mode` attaches its steering
    // program; the socket transport says so at once (before any connection) and creates no
    // file.
    let file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("socket.pcap");
    let _ = std::fs::remove_file(&file);
    for args in [
        &["write-bw"][..],
        &["rping", "-s"],
        &["perftest", "write-bw"],
    ] {
        for option in [
            ["--pcap".as_ref(), file.as_os_str()],
            ["--xdp-mode".as_ref(), "generic".as_ref()],
        ] {
            let out = std::process::Command::new(bin())
                .args(args)
                .args(option)
                .output_within(RUN_LIMIT)
                .expect("run");
            assert!(!out.status.success(), "{args:?} {option:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("--transport xdp") && err.contains(option[0].to_str().unwrap()),
                "{args:?} {option:?}: {err}"
            );
            assert!(!file.exists(), "{args:?}");
        }
    }
    // Values a user may well type: a clear refusal naming the option, never a panic or a
    // silent change (a non-finite timeout panicked in `Duration`; engine options were
    // dropped without a word on the socket transport).
    for (args, says) in [
        (&["write-bw", "--timeout", "inf"][..], "--timeout"),
        (&["write-bw", "--timeout", "0"], "--timeout"),
        (&["write-bw", "--timeout=-5"], "--timeout"),
        (&["write-bw", "--iface", "lo", "127.0.0.1"], "--iface"),
        (&["write-bw", "--engine-tx-copy"], "--engine-tx-copy"),
        (&["write-bw", "--engine-inline", "off"], "--engine-inline"),
        (
            &[
                "write-bw",
                "--transport",
                "xdp",
                "--iface",
                "lo",
                "--engine-threads",
                "one",
                "--engine-cpus",
                "0,1",
            ],
            "--engine-cpu",
        ),
        (&["write-lat", "-U", "--json"], "--json"),
        // perftest refuses -A outside the atomic tests.
        (&["write-bw", "-A", "fetch-and-add"], "-A"),
        // -n with -D: one or the other (perftest drops -n silently).
        (&["write-bw", "-n", "100", "-D", "1"], "-D"),
        (&["perftest", "write-bw", "--timeout", "inf"], "--timeout"),
    ] {
        let out = std::process::Command::new(bin())
            .args(args)
            .output_within(RUN_LIMIT)
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(says) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    // Nothing listening: a clear connection error.
    let port = free_port().to_string();
    let out = std::process::Command::new(bin())
        .args(["write-bw", "--port", &port, "--timeout", "1", "127.0.0.1"])
        .output_within(RUN_LIMIT)
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused"), "{err}");
}

/// `--help` names every command besides the tests, `help` prints the same, and each
/// command's usage line names it whole.
#[test]
fn help_lists_every_command_and_names_it() {
    let run = |args: &[&str]| {
        let out = Command::new(bin())
            .args(args)
            .output_within(RUN_LIMIT)
            .expect("run");
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let help = run(&["--help"]);
    for command in [
        "perftest",
        "rping",
        "compare",
        "stats",
        "raw",
        "tcp-sink",
        "tcp-source",
        "http-server",
        "http-client",
    ] {
        assert!(help.contains(&format!("  {command} ")), "{command}: {help}");
        let usage = run(&[command, "--help"]);
        assert!(
            usage.contains(&format!("Usage: iwarp-bench {command}")),
            "{command}: {usage}"
        );
    }
    assert_eq!(run(&["help"]), help);
}

/// `iwarp-bench stats` reads what running engines publish: nothing there is said plainly; a
/// snapshot of a live process is shown as a table column; one of a process that is gone (a
/// run killed before it could remove its file) is skipped.
#[test]
fn stats_shows_live_snapshots_only() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stats-dir");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let stats = |args: &[&str]| {
        let out = std::process::Command::new(bin())
            .arg("stats")
            .arg("--dir")
            .arg(&dir)
            .args(args)
            .output_within(RUN_LIMIT)
            .expect("run stats");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(stats(&[]).contains("no iwarp-bench run"), "{}", stats(&[]));
    let me = std::process::id();
    let snapshot = |pid: u32, frames: u64| {
        format!(
            r#"{{"pid":{pid},"run":"write-bw client","uptime_s":1.5,"engine":{{"frames_rx":{frames},"error":null}}}}"#
        )
    };
    std::fs::write(dir.join(format!("{me}.json")), snapshot(me, 4242)).expect("write");
    // No process has a pid this high (pid_max is at most 2^22).
    std::fs::write(dir.join("4194999.json"), snapshot(4_194_999, 7)).expect("write");
    let table = stats(&[]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("frames_rx") && l.ends_with("4242")),
        "{table}"
    );
    assert!(!table.contains("4194999"), "{table}");
    let json: serde_json::Value = serde_json::from_str(&stats(&["--json"])).expect("json");
    assert_eq!(json.as_array().map(Vec::len), Some(1), "{json}");
    assert!(
        stats(&["1"]).contains("no iwarp-bench run"),
        "only pid 1 asked for"
    );
}

/// On a terminal the client shows a progress bar for a size that runs longer than a second
/// (run under `script`, which gives it a pseudo-terminal); elsewhere it prints a line a second.
#[test]
fn progress_is_a_bar_on_a_terminal_and_lines_elsewhere() {
    if !require(have("script"), "script (util-linux) is needed") {
        return;
    }
    // A 2-second write-bw; the client as `client(port)` makes it.
    let run = |client: &dyn Fn(&str) -> std::process::Command| {
        let port = free_port().to_string();
        let mut server = std::process::Command::new(bin())
            .args([
                "write-bw",
                "-D",
                "2",
                "--bind",
                "127.0.0.1",
                "--port",
                &port,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start server");
        let out = client_once_listening(&mut server, || {
            client(&port).output_within(RUN_LIMIT).expect("client")
        });
        let _ = wait_with_timeout(server, std::time::Duration::from_secs(60));
        assert!(out.status.success(), "{out:?}");
        out
    };
    let tty = run(&|port| {
        let line = format!("{} write-bw -D 2 --port {port} 127.0.0.1", bin().display());
        let mut c = std::process::Command::new("script");
        c.args(["-qec", &line, "/dev/null"]);
        c
    });
    // `script` puts the terminal's output (stdout and stderr) on its stdout.
    let tty = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.contains("[=") && tty.contains('%'), "no bar: {tty}");
    assert!(!tty.contains("65536 B: "), "lines on a terminal: {tty}");
    let piped = run(&|port| {
        let mut c = std::process::Command::new(bin());
        c.args(["write-bw", "-D", "2", "--port", port, "127.0.0.1"]);
        c
    });
    let lines = String::from_utf8_lossy(&piped.stderr);
    assert!(
        lines.contains("65536 B: ") && lines.contains("iterations in 1."),
        "{lines}"
    );
    assert!(!lines.contains("[="), "a bar on a pipe: {lines}");
}

/// perftest options that mean nothing for iWARP over TCP are accepted, so a perftest command
/// line runs unchanged, and each ignored one is said on stderr: in iwarp-bench's own tests
/// and in its perftest peer mode.
#[test]
fn perftest_only_options_are_accepted_and_noted() {
    let compat = [
        "-F",
        "--report_gbits",
        "-m",
        "4096",
        "-x",
        "3",
        "-d",
        "rxe0",
        "-i",
        "1",
    ];
    let mut args = vec!["-n", "20"];
    args.extend(compat);
    let (server, client) = run_pair("write-bw", free_port(), &args);
    assert!(
        server.status.success() && client.status.success(),
        "{client:?}"
    );
    let err = String::from_utf8_lossy(&client.stderr);
    for note in [
        "-m 4096 ignored",
        "-x 3 ignored",
        "-d rxe0 ignored",
        "-i 1 ignored",
    ] {
        assert!(err.contains(note), "{note}: {err}");
    }
    assert!(
        !err.contains("-F") && !err.contains("report_gbits"),
        "accepted silently: {err}"
    );
    // The perftest peer mode parses them too (nobody listens: a connection error, not an
    // argument error, which would exit with 2).
    let port = free_port().to_string();
    let out = std::process::Command::new(bin())
        .args(["perftest", "write-bw", "-p", &port, "--timeout", "1"])
        .args(compat)
        .arg("127.0.0.1")
        .output_within(RUN_LIMIT)
        .expect("run perftest");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("-x 3 ignored"), "{err}");
}

/// perftest's `-U` and `-H` on a latency test: every sample in the order taken, then sorted
/// without the two largest, each after a `#, usec` line, and the result header again before
/// the result line.
#[test]
fn latency_samples_unsorted_and_sorted() {
    let out = run_ok("write-lat", &["-n", "50", "-U", "-H"]);
    let blocks: Vec<&str> = out.split("#, usec\n").collect();
    assert_eq!(blocks.len(), 3, "{out}");
    let values = |block: &str| -> Vec<f64> {
        block
            .lines()
            .take_while(|l| l.contains(", "))
            .map(|l| {
                let (i, v) = l.split_once(", ").expect("i, value");
                assert!(i.parse::<usize>().is_ok(), "{l}");
                v.parse().expect("a number")
            })
            .collect()
    };
    let (unsorted, sorted) = (values(blocks[1]), values(blocks[2]));
    assert_eq!(unsorted.len(), 50, "{out}");
    assert_eq!(sorted.len(), 48, "{out}");
    assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "{out}");
    assert!(unsorted.iter().all(|&v| v > 0.0));
    assert_eq!(out.matches("t_typical[usec]").count(), 2, "{out}");
}

/// perftest's `-e`: completions are waited for on a completion channel (the queue armed,
/// then the channel's descriptor), and the run says how many events woke it.
#[test]
fn use_event_waits_on_the_completion_channel() {
    let (server, client) = run_pair("write-bw", free_port(), &["-n", "3000", "-e"]);
    assert!(
        server.status.success() && client.status.success(),
        "{client:?}"
    );
    for (who, out) in [("client", &client), ("server", &server)] {
        let err = String::from_utf8_lossy(&out.stderr);
        let n: u64 = err
            .split("woken by ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{who}: no event count: {err}"));
        if who == "client" {
            // 3000 Writes, 128 outstanding, one in 100 signaled: it waited, on events.
            assert!(n >= 1, "{who}: {err}");
        }
    }
}

/// `--run_infinitely -D 0.4`: a result line per 0.4 s until SIGINT, then the run ends as a
/// finished one (the server checks the data, the client prints the totals) and both exit 0.
#[test]
fn run_infinitely_reports_each_interval_and_ends_cleanly_on_sigint() {
    let port = free_port().to_string();
    let mut server = Tool::start({
        let mut c = Command::new(bin());
        c.args(["write-bw", "--bind", "127.0.0.1", "--port", &port])
            .args(["-s", "4096"]);
        c
    });
    server.wait_for("listening on", Duration::from_secs(20));
    let started = std::time::Instant::now();
    let mut client = Command::new(bin())
        .args(["write-bw", "--port", &port, "-s", "4096"])
        .args(["--run_infinitely", "-D", "0.4", "127.0.0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start client");
    // Interrupted once four intervals have been reported.
    let (lines, reader) = stream_stdout(&mut client);
    if !lines_seen(
        &lines,
        4,
        |l| l.starts_with(" 4096"),
        Duration::from_secs(30),
    ) {
        let _ = client.kill();
        let client = wait_with_timeout(client, Duration::from_secs(5));
        panic!(
            "not four interval rows in 30 s: {}",
            String::from_utf8_lossy(&client.stderr)
        );
    }
    // Each row closes an interval of 0.4 s: four cannot come sooner than 1.6 s.
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1500), "four rows in {took:?}");
    interrupt(&client);
    let client = wait_with_timeout(client, Duration::from_secs(30));
    let (server, server_err) = server.finish(Duration::from_secs(30));
    let out = String::from_utf8(reader.join().expect("stdout reader")).expect("UTF-8");
    let err = String::from_utf8_lossy(&client.stderr);
    assert!(
        client.status.success() && server.status.success(),
        "client:\n{out}\n{err}\nserver:\n{server_err}"
    );
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with(" 4096")).collect();
    // Four interval rows or more, then the totals.
    assert!(rows.len() >= 5, "{out}");
    let iterations = |row: &str| -> u64 {
        row.split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("iterations")
    };
    let total = iterations(rows[rows.len() - 1]);
    let windows: u64 = rows[..rows.len() - 1].iter().map(|r| iterations(r)).sum();
    assert!(total >= windows && windows > 0, "{out}");
    assert!(err.contains("checked by the server"), "{err}");
    assert!(
        server_err.contains("server verified"),
        "server did not check the data: {server_err}"
    );
}

/// The suite's bound on a run: a command that outlives it is killed and says so, and one that
/// writes more than a pipe holds is not held up by it.
#[test]
fn the_harness_kills_a_run_at_its_limit_and_drains_its_pipes() {
    let started = std::time::Instant::now();
    let out = Command::new("sleep")
        .arg("30")
        .output_within(Duration::from_millis(300))
        .expect("run sleep");
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(20), "not killed");
    assert!(String::from_utf8_lossy(&out.stderr).contains("killed after"));
    // 1 MiB on stdout, far beyond a pipe's 64 KiB.
    let out = Command::new("head")
        .args(["-c", "1048576", "/dev/zero"])
        .output_within(Duration::from_secs(30))
        .expect("run head");
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(out.stdout.len(), 1 << 20);
}
