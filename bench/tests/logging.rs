//! `RUST_LOG` turns on the library's log of connection events on stderr (`tracing`): a
//! write-lat run over the socket transport on loopback logs, in order, listening, the MPA
//! Request, Full Operation and the connection's end on the server, and connecting and Full
//! Operation on the client; without `RUST_LOG` none of it appears. The same run engine to
//! engine on the veth bed logs the engine's start, the MPA exchange and the TCP end.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{
    bench_in, bin, client_once_listening, free_port, wait_with_timeout, OutputWithin, RUN_LIMIT,
};
use testbed::*;

/// Server and client of a 10-iteration write-lat on loopback, both with `rust_log` (if any).
fn loopback_pair(rust_log: Option<&str>) -> (Output, Output) {
    let port = free_port().to_string();
    let cmd = |extra: &[&str]| {
        let mut c = Command::new(bin());
        c.args(["write-lat", "-n", "10", "--port", &port])
            .args(extra);
        match rust_log {
            Some(v) => c.env("RUST_LOG", v),
            None => c.env_remove("RUST_LOG"),
        };
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let mut server = cmd(&["--bind", "127.0.0.1"]).spawn().expect("start server");
    let client = client_once_listening(&mut server, || {
        cmd(&["127.0.0.1"])
            .output_within(RUN_LIMIT)
            .expect("client")
    });
    (wait_with_timeout(server, Duration::from_secs(60)), client)
}

/// Asserts that each of `events` appears in `log`, in this order.
fn in_order(who: &str, log: &str, events: &[&str]) {
    let mut at = 0;
    for e in events {
        match log[at..].find(e) {
            Some(i) => at += i + e.len(),
            None => panic!("{who}: no {e:?} after byte {at} of:\n{log}"),
        }
    }
}

#[test]
fn rust_log_shows_connection_events_over_the_socket_transport() {
    let (server, client) = loopback_pair(Some("info"));
    assert!(server.status.success() && client.status.success());
    let (s, c) = (
        String::from_utf8_lossy(&server.stderr),
        String::from_utf8_lossy(&client.stderr),
    );
    in_order(
        "server",
        &s,
        &[
            "listening (kernel TCP)",
            "MPA Request received (kernel TCP)",
            "MPA Full Operation (kernel TCP)",
            "TCP connection ended (kernel TCP)",
        ],
    );
    in_order(
        "client",
        &c,
        &["connecting (kernel TCP)", "MPA Full Operation (kernel TCP)"],
    );
    assert!(s.contains(" INFO "), "the level is shown: {s}");

    let (server, client) = loopback_pair(None);
    assert!(server.status.success() && client.status.success());
    for out in [&server, &client] {
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            !e.contains("MPA Full Operation") && !e.contains(" INFO "),
            "{e}"
        );
    }

    // A filter that names another crate shows nothing of ours; a bad one is said.
    let (server, _) = loopback_pair(Some("mpa=info"));
    assert!(!String::from_utf8_lossy(&server.stderr).contains("Full Operation"));
    let (server, _) = loopback_pair(Some("datapath=bogus"));
    let e = String::from_utf8_lossy(&server.stderr);
    assert!(e.contains("RUST_LOG") && e.contains("ignored"), "{e}");
}

/// Without `RUST_LOG`, warnings still show: a peer whose MPA Request is garbage is said on
/// the server's stderr (at WARN), and the run goes on with the real client.
#[test]
fn warnings_show_without_rust_log() {
    use std::io::Write;
    let port = free_port();
    let server = Command::new(bin())
        .args(["write-lat", "-n", "10", "--bind", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut garbage = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("the server never listened: {e}"),
        }
    };
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let client = Command::new(bin())
        .args(["write-lat", "-n", "10", "--port"])
        .arg(port.to_string())
        .arg("127.0.0.1")
        .env_remove("RUST_LOG")
        .output_within(RUN_LIMIT)
        .expect("client");
    let server = wait_with_timeout(server, Duration::from_secs(60));
    assert!(server.status.success() && client.status.success());
    let e = String::from_utf8_lossy(&server.stderr);
    assert!(
        e.contains(" WARN ") && e.contains("MPA startup failed") && !e.contains(" INFO "),
        "{e}"
    );
}

#[test]
fn rust_log_shows_connection_events_of_the_engine() {
    let _bed = bed_or_skip!();
    let args = |iface: &'static str| {
        vec![
            "write-lat",
            "--transport",
            "xdp",
            "--iface",
            iface,
            "-p",
            "18780",
            "-n",
            "10",
            "--json",
        ]
    };
    let server = bench_in(NS_A, &args(DEV_A))
        .env("RUST_LOG", "datapath=debug")
        .spawn()
        .expect("start server");
    let addr = ADDR_A.to_string();
    let mut client_args = args(DEV_B);
    client_args.push(&addr);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let client = loop {
        let out = bench_in(NS_B, &client_args)
            .env("RUST_LOG", "datapath=debug")
            .output_within(RUN_LIMIT)
            .expect("run client");
        let refused = String::from_utf8_lossy(&out.stderr).contains("refused");
        if out.status.success() || !refused || std::time::Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let server = wait_with_timeout(server, Duration::from_secs(60));
    assert!(client.status.success(), "{client:?}");
    assert!(server.status.success(), "{server:?}");
    in_order(
        "server",
        &String::from_utf8_lossy(&server.stderr),
        &[
            "AF_XDP engine started",
            "listening (AF_XDP engine)",
            "TCP connection accepted",
            "MPA Request received",
            "MPA Full Operation",
            "TCP connection ended",
        ],
    );
    in_order(
        "client",
        &String::from_utf8_lossy(&client.stderr),
        &[
            "RSS unknown",
            "AF_XDP engine started",
            "connecting (AF_XDP engine)",
            "MPA Full Operation",
            "AF_XDP engine thread stopped",
        ],
    );
    // veth has no RSS configuration (ETHTOOL_GRSSH unsupported): said, and the kernel's
    // ephemeral ports used.
    let client_log = String::from_utf8_lossy(&client.stderr);
    assert!(
        client_log.contains("source ports left to the kernel"),
        "{client_log}"
    );
}
