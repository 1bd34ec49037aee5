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
