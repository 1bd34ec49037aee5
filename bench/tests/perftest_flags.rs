//! perftest's habitual command lines (issue #28) given to `iwarp-bench` at both ends: engine
//! to engine on the veth bed (server in `iwa`, client in `iwb`) and over the socket transport
//! on loopback, each run verified by the tool itself (the server checks what the client
//! wrote or sent, the client what it read; a failed check fails the run) and its table read
//! back here.
//!
//! The bed part needs root; it skips (or fails under `CI=true`) without the bed.

mod common;

use std::process::Output;

use common::*;
use testbed::*;

/// A command line as a perftest user types it (with a small `-n` where perftest's default
/// would take minutes), and what its table must show.
struct Case {
    test: &'static str,
    flags: &'static [&'static str],
    /// Rows of the result table.
    rows: usize,
    /// Iterations in each row (`None`: a timed run, at least one).
    iterations: Option<u64>,
}

const CASES: &[Case] = &[
    Case {
        test: "write-bw",
        flags: &["-a", "-F", "--report_gbits", "-n", "20"],
        rows: 23,
        iterations: Some(20),
    },
    Case {
        test: "write-bw",
        flags: &["-q", "4", "-n", "300"],
        rows: 1,
        iterations: Some(4 * 300),
    },
    Case {
        test: "write-bw",
        flags: &["-b", "-n", "300"],
        rows: 1,
        // perftest's duplex row: our count, both directions' rates.
        iterations: Some(300),
    },
    Case {
        test: "send-bw",
        flags: &["-l", "8", "-n", "800"],
        rows: 1,
        iterations: Some(800),
    },
    Case {
        test: "read-bw",
        flags: &["-D", "5"],
        rows: 1,
        iterations: None,
    },
    Case {
        test: "send-lat",
        flags: &["-H", "-n", "300"],
        rows: 1,
        iterations: Some(300),
    },
    Case {
        test: "write-lat",
        flags: &["-a", "-n", "30"],
        rows: 23,
        iterations: Some(30),
    },
    // -I: Sends and Writes up to N octets posted inline (the rest of -a's sizes gathered).
    Case {
        test: "write-lat",
        flags: &["-a", "-I", "128", "-n", "20"],
        rows: 23,
        iterations: Some(20),
    },
    Case {
        test: "send-bw",
        flags: &["-I", "236", "-s", "236", "-n", "500"],
        rows: 1,
        iterations: Some(500),
    },
    Case {
        test: "write-bw",
        flags: &["-I", "64", "-l", "4", "-s", "64", "-n", "400"],
        rows: 1,
        iterations: Some(400),
    },
    // An iWARP user's habitual line: rdma_cm, RC, CQ moderation, ToS, no peak, events, and
    // the InfiniBand options that mean nothing here.
    Case {
        test: "write-bw",
        flags: &[
            "-R", "-c", "RC", "-Q", "1", "-T", "0", "-N", "--events", "-x", "0", "-d", "siw0",
            "-n", "300",
        ],
        rows: 1,
        iterations: Some(300),
    },
];

/// The result rows of a table (lines that start with a size and an iteration count).
fn rows(out: &str) -> Vec<(u64, u64)> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect()
}

fn check(case: &Case, how: &str, client: &Output, server: &Output) {
    let (out, err) = (
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr),
    );
    let what = format!("{} {} ({how})", case.test, case.flags.join(" "));
    assert!(
        client.status.success() && server.status.success(),
        "{what}: client:\n{out}\n{err}\nserver:\n{}",
        String::from_utf8_lossy(&server.stderr)
    );
    let got = rows(&out);
    // -H prints "i, value" sample lines too: those have a comma.
    let table: Vec<_> = got.iter().filter(|r| r.0 > 1).copied().collect();
    assert_eq!(table.len(), case.rows, "{what}:\n{out}");
    for &(size, iters) in &table {
        match case.iterations {
            Some(n) => assert_eq!(iters, n, "{what}: size {size}:\n{out}"),
            None => assert!(iters > 0, "{what}:\n{out}"),
        }
    }
    if case.rows == 23 {
        let sizes: Vec<u64> = table.iter().map(|r| r.0).collect();
        assert_eq!(
            sizes,
            (1..=23).map(|e| 1u64 << e).collect::<Vec<_>>(),
            "{what}"
        );
    }
    if case.flags.contains(&"-H") {
        let samples = out
            .lines()
            .filter(|l| l.contains(", ") && !l.starts_with('#'))
            .count();
        // perftest's -H leaves out the two largest samples.
        assert_eq!(
            samples as u64,
            case.iterations.unwrap_or(0) - 2,
            "{what}:\n{out}"
        );
    }
    if let Some(i) = case.flags.iter().position(|f| *f == "-I") {
        let line = format!(" Max inline data : {}[B]", case.flags[i + 1]);
        assert!(out.contains(&line), "{what}: no '{line}':\n{out}");
    }
    if case.flags.contains(&"-b") {
        // The client checked the server's direction.
        assert!(
            err.contains("checked by the server") && !err.contains(", 0 by the client"),
            "{what}: the reverse direction was not checked:\n{err}"
        );
    }
    // What the tool checked.
    assert!(
        err.contains("data verified:")
            && !err.contains("verified: 0 bytes checked by the server, 0 by"),
        "{what}: nothing verified:\n{err}"
    );
}

#[test]
fn perftest_command_lines_over_the_socket_transport() {
    for case in CASES {
        let port = free_port();
        let (server, client) = run_pair(case.test, port, case.flags);
        check(case, "socket", &client, &server);
    }
}

#[test]
fn perftest_command_lines_engine_to_engine() {
    let _bed = bed_or_skip!();
    for (i, case) in CASES.iter().enumerate() {
        let port = (18760 + i).to_string();
        let args = |iface: &str| {
            let mut v: Vec<String> = [case.test, "--transport", "xdp", "--iface", iface, "-p"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            v.push(port.clone());
            v.extend(case.flags.iter().map(|s| s.to_string()));
            v
        };
        let (client, server) = bed_pair(&args(DEV_A), &args(DEV_B));
        check(case, "engine", &client, &server);
    }
}

// ---------------------------------------------------------------------------------------------
// perftest options beyond the table's shape (review B1, B2, B6), over the socket transport.

/// Runs `test` with `args` at both ends (and `client_only` at the client); both must succeed.
/// Returns the client's stdout and stderr and the server's stderr.
fn run_both(test: &str, args: &[&str], client_only: &[&str]) -> (String, String, String) {
    let (server, client) = run_pair_with(test, free_port(), args, client_only);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (out, err, serr) = (
        text(&client.stdout),
        text(&client.stderr),
        text(&server.stderr),
    );
    assert!(
        client.status.success() && server.status.success(),
        "{test} {args:?} {client_only:?}: client:\n{out}\n{err}\nserver:\n{serr}"
    );
    (out, err, serr)
}

/// The one result row of a bandwidth table: (iterations, peak, average).
fn bw_row(out: &str) -> (u64, f64, f64) {
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() == 5 && f.iter().all(|x| x.parse::<f64>().is_ok()))
        .collect();
    assert_eq!(rows.len(), 1, "one row:\n{out}");
    let f = &rows[0];
    (
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
    )
}

/// perftest's `--output=bandwidth|message_rate|latency`: stdout is one number (`%lf`) and
/// nothing else, no header block, no column line, no table.
#[test]
fn output_prints_one_number_and_nothing_else() {
    for (test, args) in [
        ("write-bw", &["--output=bandwidth", "-n", "300"][..]),
        ("send-bw", &["--output", "message_rate", "-n", "300"]),
        (
            "write-bw",
            &["--output=bandwidth", "--report_gbits", "-b", "-n", "300"],
        ),
        ("read-lat", &["--output=latency", "-n", "100"]),
        ("send-lat", &["--output=latency", "-D", "1"]),
    ] {
        let (out, _, _) = run_both(test, args, &[]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{test} {args:?}: one line:\n{out}");
        let (int, frac) = lines[0].split_once('.').expect("a decimal point");
        assert!(
            !int.is_empty() && frac.len() == 6,
            "{test} {args:?}: C's %lf writes six decimals: {out}"
        );
        let v: f64 = lines[0].parse().expect("a number");
        assert!(v > 0.0, "{test} {args:?}: {out}");
    }
    // The number is the table's average (the same run's figures in both forms are not to
    // be had; the unit is: Gb/s of a loopback run is far below its MB/s).
    let (gbits, _, _) = run_both(
        "write-bw",
        &["--output=bandwidth", "--report_gbits", "-n", "300"],
        &[],
    );
    let (mbs, _, _) = run_both("write-bw", &["--output=bandwidth", "-n", "300"], &[]);
    let (g, m): (f64, f64) = (gbits.trim().parse().unwrap(), mbs.trim().parse().unwrap());
    assert!(m > 20.0 * g, "MB/s {m} against Gb/s {g}");
}

/// `--output`'s kind must suit the test, as perftest's check says ("Output verbosity level for
/// BW can be: bandwidth, message_rate"); not with `--json`.
#[test]
fn output_kinds_are_refused_where_perftest_refuses_them() {
    for (test, args) in [
        ("write-bw", &["--output=latency"][..]),
        ("write-lat", &["--output=bandwidth"]),
        ("send-lat", &["--output=message_rate"]),
        ("write-bw", &["--output=bandwidth", "--json"]),
    ] {
        let err = refused(test, args);
        assert!(
            err.contains("--output for") || err.contains("--output prints one number"),
            "{test} {args:?}: {err}"
        );
    }
}

/// Runs `test` with `args` as a client of a port nobody listens on: a command line that is
/// refused exits with 2 before connecting (one that is not fails to connect, exit 1). Returns
/// stderr.
fn refused(test: &str, args: &[&str]) -> String {
    let port = free_port().to_string();
    let out = std::process::Command::new(bin())
        .arg(test)
        .args(args)
        .args(["-p", &port, "--timeout", "2", "127.0.0.1"])
        .output_within(RUN_LIMIT)
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{test} {args:?}: {err}");
    err
}

/// perftest's peak (B2): measured over iteration runs of at most 20,000 messages, at least
/// the average; 0.00 with `-N` and above 20,000 messages, as perftest's.
#[test]
fn the_peak_is_measured_as_perftest_measures_it() {
    for (args, measured) in [
        (&["-n", "300"][..], true),
        (&["-n", "300", "-l", "4"], true),
        (&["-n", "300", "-q", "2"], true),
        (&["-n", "300", "-b"], true),
        (&["-n", "300", "-N"], false),
        (&["-n", "20001", "-s", "1024"], false),
    ] {
        let (out, _, _) = run_both("write-bw", args, &[]);
        let (_, peak, avg) = bw_row(&out);
        assert!(avg > 0.0, "{args:?}:\n{out}");
        if measured {
            // -b adds the reverse direction's average as the server reported it, over whole
            // microseconds (a little above its own): a hair of slack there.
            let slack = if args.contains(&"-b") { 0.999 } else { 1.0 };
            assert!(
                peak >= avg * slack,
                "{args:?}: peak {peak} below the average {avg}:\n{out}"
            );
        } else {
            assert_eq!(peak, 0.0, "{args:?}:\n{out}");
        }
    }
    // The same for the other bandwidth tests.
    for test in ["read-bw", "send-bw", "atomic-bw"] {
        let (out, _, _) = run_both(test, &["-n", "300"], &[]);
        let (_, peak, avg) = bw_row(&out);
        assert!(peak >= avg && avg > 0.0, "{test}:\n{out}");
    }
}

/// perftest refuses `-N` on latency tests ("NoPeak only valid for BW tests") and `-C` on
/// bandwidth tests; `-e` on write-lat, as perftest refuses events for Write tests.
#[test]
fn options_perftest_refuses_for_a_test_kind_are_refused() {
    for (test, args, says) in [
        ("write-lat", &["-N"][..], "-N"),
        ("send-lat", &["-N"], "-N"),
        ("write-bw", &["-C"], "-C"),
        ("write-lat", &["-e"], "-e"),
        ("write-bw", &["-o", "4"], "-o"),
        ("send-bw", &["-o", "4"], "-o"),
        ("write-bw", &["-r", "16"], "-r"),
        ("read-bw", &["-D", "4", "-f", "2"], "-f"),
    ] {
        let err = refused(test, args);
        assert!(
            err.contains(says) && !err.contains("unexpected argument"),
            "{test} {args:?}: {err}"
        );
    }
}

/// `-e` in send-lat, read-lat and atomic-lat (B6): each wait of the ping-pong is on the
/// completion channel, as perftest's, so nearly every iteration is woken by an event (before,
/// the latency loops polled and only the phase's end waited).
#[test]
fn events_in_latency_tests_wait_on_the_channel() {
    let events = |err: &str| -> u64 {
        err.split("woken by ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no event count: {err}"))
    };
    for test in ["send-lat", "read-lat", "atomic-lat"] {
        let (out, err, serr) = run_both(test, &["-e", "-n", "200"], &[]);
        assert!(out.contains(" t_typical[usec]"), "{test}:\n{out}");
        assert!(events(&err) >= 100, "{test}: client:\n{err}");
        if test == "send-lat" {
            // The server answers each ping after an event too.
            assert!(events(&serr) >= 100, "{test}: server:\n{serr}");
        }
    }
}

/// `-r` (send-bw's receive depth, the client's credit window), `-o` (outstanding Reads: the
/// ORD, granted by the server's IRD) and `-f` (`-D`'s margins) do what they say (B1).
#[test]
fn rx_depth_outs_and_margin_take_effect() {
    let json = |out: &str| -> serde_json::Value {
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    // -r: the server posts that many receives, which the client may fill before a credit.
    let (out, _, _) = run_both("send-bw", &["-r", "16", "-n", "300", "--json"], &[]);
    assert_eq!(json(&out)["rx_depth"], 16, "{out}");
    let (out, _, _) = run_both("send-bw", &["-n", "300", "--json"], &[]);
    assert_eq!(json(&out)["rx_depth"], 128, "default: {out}");
    // -r above -t: the buffers grow to hold the receives.
    let (out, _, _) = run_both(
        "send-bw",
        &["-r", "300", "-s", "4096", "-n", "1000", "--json"],
        &[],
    );
    assert_eq!(json(&out)["rx_depth"], 300, "{out}");
    // -o: the header's "Outstand reads" is the ORD agreed with the server, which grants the
    // client's (its IRD raised to it) unless given its own -o.
    for (args, client_only, ord) in [
        (&["-n", "300"][..], &[][..], "16"),
        (&["-n", "300", "-o", "4"], &[], "4"),
        (&["-n", "300"], &["-o", "64"], "64"),
    ] {
        let (out, _, _) = run_both("read-bw", args, client_only);
        let line = format!(" Outstand reads  : {ord}\n");
        assert!(
            out.contains(&line),
            "{args:?} {client_only:?}: no {line:?}:\n{out}"
        );
    }
    let (server, client) = run_pair_sides(
        "read-bw",
        free_port(),
        &["-n", "300"],
        &["-o", "8"],
        &["-o", "64"],
    );
    assert!(server.status.success() && client.status.success());
    let out = String::from_utf8_lossy(&client.stdout);
    assert!(out.contains(" Outstand reads  : 8\n"), "{out}");
    // -f: the sampling window of -D 3 is [f, 3 - f): one second with -f 1 (no margins below
    // four seconds otherwise).
    let (out, _, _) = run_both(
        "read-bw",
        &["-D", "3", "-f", "1", "-s", "4096", "--json"],
        &[],
    );
    let secs = json(&out)["results"][0]["seconds"]
        .as_f64()
        .expect("seconds");
    assert!((secs - 1.0).abs() < 1e-6, "{secs}: {out}");
}

/// Options that change nothing here are accepted with a note on stderr, never silently (B1,
/// B6): InfiniBand's, perftest's output and exchange options, and on latency tests `-t`,
/// `-Q`, `--slots` and `-C`.
#[test]
fn inert_options_are_accepted_with_a_note() {
    let (out, err, _) = run_both(
        "write-bw",
        &[
            "-n",
            "20",
            "-u",
            "14",
            "-S",
            "0",
            "-L",
            "64",
            "--ipv6",
            "--use-srq",
            "--cpu_util",
            "--perform_warm_up",
            "--dont_xchg_versions",
            "-z",
            "-f",
            "1",
        ],
        &[],
    );
    assert!(out.contains("BW peak"), "{out}");
    for note in [
        "-u 14 ignored",
        "-S 0 ignored",
        "-L 64 ignored",
        "--ipv6 ignored",
        "--use-srq ignored",
        "--cpu_util ignored",
        "--perform_warm_up ignored",
        "--dont_xchg_versions ignored",
        "-z ignored",
        "-f 1 ignored",
    ] {
        assert!(err.contains(note), "{note}: {err}");
    }
    let (_, err, _) = run_both(
        "write-lat",
        &["-n", "20", "-t", "4", "-Q", "2", "--slots", "2", "-C"],
        &[],
    );
    for note in [
        "iwarp-bench: -t 4 ",
        "-Q 2 ignored",
        "--slots 2 ignored",
        "-C ignored",
    ] {
        assert!(err.contains(note), "{note}: {err}");
    }
    // -r on send-lat, -r 1 on the RDMA tests (perftest's value there): noted.
    let (_, err, _) = run_both("send-lat", &["-n", "20", "-r", "8"], &[]);
    assert!(err.contains("-r 8 ignored"), "{err}");
    let (_, err, _) = run_both("write-bw", &["-n", "20", "-r", "1"], &[]);
    assert!(err.contains("-r 1 ignored"), "{err}");
}
