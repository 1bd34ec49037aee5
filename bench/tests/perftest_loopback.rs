//! `iwarp-bench perftest` against itself on loopback: perftest 6.06's `-R` exchange that the
//! siw interop suite (`scripts/siw-vm.sh test`) runs against the real ib_* tools, here with
//! both roles ours, every test, cycling (64 octets) and non-cycling (64 KiB) buffer
//! geometry, each side checking what it can.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

fn pair(test: &str, server_args: &[&str], client_args: &[&str]) -> (Output, Output) {
    pair2(test, test, server_args, client_args)
}

fn pair2(
    server_test: &str,
    client_test: &str,
    server_args: &[&str],
    client_args: &[&str],
) -> (Output, Output) {
    let step = |a: &[&str]| {
        if a.contains(&"--step-timeout") {
            vec![]
        } else {
            vec!["--step-timeout", "10"]
        }
    };
    with_free_port(|port| {
        let server = Command::new(bin())
            .args(["perftest", server_test, "-p", port, "--bind", "127.0.0.1"])
            .args(["--timeout", "20"])
            .args(step(server_args))
            .args(server_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start perftest server");
        // The client retries while the server is not listening yet.
        let client = Command::new(bin())
            .args(["perftest", client_test, "127.0.0.1", "-p", port])
            .args(["--timeout", "20", "--settle-ms", "0"])
            .args(step(client_args))
            .args(client_args)
            .output_within(RUN_LIMIT)
            .expect("run perftest client");
        (wait_with_timeout(server, Duration::from_secs(60)), client)
    })
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn every_test_both_geometries() {
    for test in [
        "write-bw",
        "read-bw",
        "send-bw",
        "write-lat",
        "read-lat",
        "send-lat",
    ] {
        for size in ["64", "65536"] {
            let args = ["-s", size, "-n", "40"];
            let (s, c) = pair(test, &args, &args);
            let (st, ct) = (text(&s), text(&c));
            assert!(
                s.status.success() && c.status.success(),
                "{test} -s {size}\nserver: {st}\nclient: {ct}"
            );
            let who = [(&st, "server"), (&ct, "client")];
            for (t, role) in who {
                assert!(
                    t.contains(&format!("perftest: {test} {role}: ")),
                    "{test} {role}: no verification summary\n{t}"
                );
            }
            // Every role except the lat servers without a table prints perftest's table.
            if test != "read-lat" {
                assert!(ct.contains("#bytes"), "{test}: {ct}");
            }
            if test == "read-bw" || test == "read-lat" {
                assert!(st.contains("equal to what we served"), "{test}: {st}");
            }
        }
    }
}

#[test]
fn write_bw_server_checks_every_slot_when_cycling() {
    // 64-octet messages cycle through 64 slots of the 4 KiB cycle buffer; 40 iterations
    // fill the first 40, the rest must stay untouched.
    let args = ["-s", "64", "-n", "40"];
    let (s, c) = pair("write-bw", &args, &args);
    let st = text(&s);
    assert!(
        s.status.success() && c.status.success(),
        "{st}\n{}",
        text(&c)
    );
    assert!(st.contains("40 slot(s) of 64 octets written"), "{st}");
}

/// `--json`: one object on stdout per side; over the socket transport its `"engine"` is null
/// (the engine's counters are checked in `engine_json.rs`).
#[test]
fn json_output_has_a_null_engine_over_sockets() {
    let args = ["-s", "4096", "-n", "20", "--json"];
    let (s, c) = pair("write-bw", &args, &args);
    for (o, who) in [(&s, "server"), (&c, "client")] {
        assert!(o.status.success(), "{who}: {}", text(o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{who}: not one JSON object ({e}): {}", text(o)));
        assert!(v.get("engine").is_some_and(|e| e.is_null()), "{who}: {v}");
    }
}

#[test]
fn mismatched_tests_fail_naming_the_step() {
    // A send-lat client against a write-lat server: write-lat has four buffer-key handshakes,
    // send-lat three and then waits for a pong that never comes.
    let (s, c) = pair2(
        "write-lat",
        "send-lat",
        &["-n", "5", "--step-timeout", "3"],
        &["-n", "5", "--step-timeout", "3"],
    );
    for (o, who) in [(&s, "server"), (&c, "client")] {
        let t = text(o);
        assert!(!o.status.success(), "{who}: {t}");
        assert!(t.contains("FAILED: "), "{who}: {t}");
    }
}

#[test]
fn bad_arguments_are_errors() {
    for args in [
        &["perftest", "write-bw", "-n", "4"][..],
        &["perftest", "write-bw", "-s", "0"],
        &["perftest", "nope"],
        &["perftest", "read-lat", "--transport", "xdp"],
        &["perftest", "send-bw", "-a"],
        &["perftest", "write-bw", "-a", "-D", "5"],
        &["perftest", "read-bw", "-q", "2"],
        &["perftest", "write-bw", "-H"],
        &["perftest", "read-bw", "-l", "4"],
        &["perftest", "write-bw", "-l", "4", "-n", "10"],
        &["perftest", "write-lat", "-I", "237"],
        &["perftest", "read-lat", "-I", "64"],
    ] {
        let o = Command::new(bin())
            .args(args)
            .output_within(RUN_LIMIT)
            .expect("run");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    }
}

/// The table rows of a side's output: (size, iterations), and the lines of `-H` samples.
fn rows(o: &Output) -> (Vec<(u64, u64)>, usize) {
    let out = String::from_utf8_lossy(&o.stdout);
    let table = out
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect();
    let samples = out
        .lines()
        .filter(|l| l.contains(", ") && !l.starts_with('#'))
        .count();
    (table, samples)
}

/// perftest's habitual options in perftest mode, both sides ours: -a (write-bw: a row per
/// size at the client, the last size's report at the server; write-lat: a row per size at
/// both), -D, -b, -q, -H, --report_gbits, each side checking what it can.
#[test]
fn perftest_options_both_sides() {
    let all: Vec<u64> = (1..=23).map(|e| 1u64 << e).collect();
    let cases: &[(&str, &[&str])] = &[
        ("write-bw", &["-a", "-n", "5", "-F", "--report_gbits"]),
        ("write-lat", &["-a", "-n", "10"]),
        ("read-bw", &["-D", "2"]),
        ("write-bw", &["-D", "2", "-s", "64"]),
        ("write-bw", &["-b", "-n", "300"]),
        ("write-bw", &["-q", "4", "-n", "100"]),
        ("write-bw", &["-q", "3", "-s", "64", "-n", "100"]),
        ("send-lat", &["-H", "-n", "50"]),
        ("write-bw", &["-l", "4", "-s", "64", "-n", "400"]),
        ("write-bw", &["-e", "-n", "200"]),
        ("read-bw", &["-e", "-n", "200"]),
        // -I: sizes up to 64 inline, the rest gathered; all checked.
        ("write-lat", &["-a", "-I", "64", "-n", "10"]),
        ("send-lat", &["-I", "236", "-s", "236", "-n", "50"]),
        ("write-bw", &["-I", "128", "-s", "128", "-n", "400"]),
        (
            "write-bw",
            &["-I", "64", "-l", "4", "-s", "64", "-n", "400"],
        ),
    ];
    for (test, args) in cases {
        let (s, c) = pair(test, args, args);
        let what = format!("{test} {args:?}");
        assert!(
            s.status.success() && c.status.success(),
            "{what}\nserver: {}\nclient: {}",
            text(&s),
            text(&c)
        );
        let ((st, ss), (ct, cs)) = (rows(&s), rows(&c));
        for (t, who) in [(&st, "server"), (&ct, "client")] {
            assert!(
                !t.is_empty(),
                "{what}: no {who} row: {}",
                text(if who == "server" { &s } else { &c })
            );
        }
        if let Some(i) = args.iter().position(|a| *a == "-I") {
            let line = format!(" Max inline data : {}[B]", args[i + 1]);
            assert!(text(&c).contains(&line), "{what}: {line}");
        }
        let a = args.contains(&"-a");
        match *test {
            "write-bw" if a => {
                assert_eq!(ct.iter().map(|r| r.0).collect::<Vec<_>>(), all, "{what}");
                assert_eq!(st, vec![(1 << 23, 5)], "{what}: the last size's report");
                assert!(text(&c).contains("BW average[Gb/sec]"), "{what}");
            }
            "write-lat" => {
                assert_eq!(ct.iter().map(|r| r.0).collect::<Vec<_>>(), all, "{what}");
                assert_eq!(st.iter().map(|r| r.0).collect::<Vec<_>>(), all, "{what}");
            }
            "write-bw" if args.contains(&"-q") => {
                let q: u64 = args[1].parse().expect("-q N");
                assert_eq!(ct[0].1, q * 100, "{what}: -n per queue pair");
                assert!(
                    text(&s).contains(&format!("{q} queue pairs' windows")),
                    "{what}"
                );
            }
            "write-bw" if args.contains(&"-l") => {
                // Four list elements, four slots: the rest of the cycle buffer untouched.
                assert!(
                    text(&s).contains("4 slot(s) of 64 octets written"),
                    "{what}"
                );
            }
            "write-bw" if args.contains(&"-b") => {
                assert!(
                    text(&s).contains("the peer's checked in our buffer"),
                    "{what}"
                );
                assert!(
                    text(&c).contains("the peer's checked in our buffer"),
                    "{what}"
                );
            }
            "send-lat" if args.contains(&"-I") => {
                // (As perftest: the server's first iteration gives no sample.)
                assert!(
                    ct[0].1 == 50 && (49..=50).contains(&st[0].1),
                    "{what}: {ct:?} {st:?}"
                );
            }
            "send-lat" => {
                // The samples less the two largest (a side's first iteration may give none).
                assert!((47..=48).contains(&cs), "{what}: -H samples: {cs}");
                assert!((47..=48).contains(&ss), "{what}: -H samples: {ss}");
            }
            _ => assert!(ct[0].1 > 0 && st[0].1 == ct[0].1, "{what}"),
        }
    }
}

/// `--run_infinitely -D 1`: the client prints a row a second until SIGINT, then closes
/// without a report (as perftest's); the server waits as long as that takes and both exit 0.
#[test]
fn run_infinitely_until_sigint() {
    let (server, client) = with_free_port(|port| {
        let server = Command::new(bin())
            .args(["perftest", "write-bw", "-p", port, "--bind", "127.0.0.1"])
            .args(["--run_infinitely", "-D", "1", "-s", "4096"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start perftest server");
        let client = Command::new(bin())
            .args([
                "perftest",
                "write-bw",
                "127.0.0.1",
                "-p",
                port,
                "--settle-ms",
                "0",
            ])
            .args(["--run_infinitely", "-D", "1", "-s", "4096"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start perftest client");
        let mut client = client;
        // Two rows (a second each), then the interrupt.
        let (lines, reader) = stream_stdout(&mut client);
        let row = |l: &str| {
            let mut f = l.split_whitespace();
            f.next().is_some_and(|v| v.parse::<u64>().is_ok())
                && f.next().is_some_and(|v| v.parse::<u64>().is_ok())
        };
        // (A client that ends sooner, its server's port taken, ends the wait; the rows are
        // counted below.)
        lines_seen(&lines, 2, row, Duration::from_secs(30));
        interrupt(&client);
        let mut client = wait_with_timeout(client, Duration::from_secs(30));
        client.stdout = reader.join().expect("stdout reader");
        (wait_with_timeout(server, Duration::from_secs(30)), client)
    });
    assert!(
        server.status.success() && client.status.success(),
        "server: {}\nclient: {}",
        text(&server),
        text(&client)
    );
    let (rows, _) = rows(&client);
    assert!(rows.len() >= 2, "a row a second: {}", text(&client));
    assert!(rows.iter().all(|r| r.0 == 4096 && r.1 > 0), "{rows:?}");
    assert!(
        text(&client).contains("ran until interrupted"),
        "{}",
        text(&client)
    );
    assert!(
        text(&server).contains("the client ran until interrupted"),
        "{}",
        text(&server)
    );
}

/// A data phase longer than one step (`-D` past `--step-timeout`, as a real perftest client
/// with `-D 60` against our default 30 s): the server, which posts nothing meanwhile and is
/// not told `-D`, waits for the client's handshake as long as the run takes, as perftest's
/// server does.
#[test]
fn a_data_phase_longer_than_a_step_is_waited_for() {
    for test in ["write-bw", "read-bw"] {
        let (s, c) = pair(test, &["--step-timeout", "1"], &["-D", "3"]);
        let (st, ct) = (text(&s), text(&c));
        assert!(
            s.status.success() && c.status.success(),
            "{test} -D 3 against --step-timeout 1\nserver: {st}\nclient: {ct}"
        );
    }
}
