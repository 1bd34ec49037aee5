//! Jumbo frames (issue #24): the veth bed at MTU 9000, where one packet spans several 4 KiB
//! UMEM frames (multi-buffer AF_XDP: the `xdp.frags` program, `XDP_USE_SG` sockets, packets of
//! several frames joined on receive and written straight into their frames on transmit). Writes, Reads and Sends of 1 B, from
//! 2 B to 8 MiB (`-a`) and of 16 MiB, verified by the tool, with Markers off and on, engine to
//! engine and between the engine and the socket transport (kernel TCP at MTU 9000) both ways.
//!
//! Needs root and the bed; skips (or fails under `CI=true`) without it.

mod common;

use std::process::Output;

use common::*;
use testbed::*;

fn args(test: &str, transport: &str, iface: &str, port: u16, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [test, "--transport", transport, "-p", &port.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if transport == "xdp" {
        v.extend(["--iface".to_string(), iface.to_string()]);
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// The run succeeded and verified data; returns the MTU line's value (the connection's
/// MULPDU in iwarp-bench's header block).
fn check(what: &str, client: &Output, server: &Output) -> u64 {
    let (out, err) = (
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr),
    );
    assert!(
        client.status.success() && server.status.success(),
        "{what}: client:\n{out}\n{err}\nserver:\n{}",
        String::from_utf8_lossy(&server.stderr)
    );
    assert!(
        err.contains("data verified:")
            && !err.contains("verified: 0 bytes checked by the server, 0 by"),
        "{what}: nothing verified:\n{err}"
    );
    out.lines()
        .find_map(|l| l.trim().strip_prefix("Mtu             : "))
        .and_then(|v| v.trim_end_matches("[B]").parse().ok())
        .unwrap_or_else(|| panic!("{what}: no Mtu line:\n{out}"))
}

#[test]
fn jumbo_frames_engine_to_engine_and_to_the_socket_transport() {
    let bed = bed_or_skip!();
    bed.set_mtu(9000).expect("MTU 9000 on the bed");
    let mut port = 18_900;
    // `multi`: the run's messages are large enough that an engine must carry packets of
    // several frames.
    let mut run = |test: &str, server: &str, client: &str, extra: &[&str], multi: bool| {
        port += 1;
        let what = format!(
            "{test} {server} server, {client} client {}",
            extra.join(" ")
        );
        let (c, s) = bed_pair(
            &args(test, server, DEV_A, port, extra),
            &args(test, client, DEV_B, port, extra),
        );
        let mulpdu = check(&what, &c, &s);
        if client == "xdp" || server == "xdp" {
            // An FPDU as large as a jumbo segment allows (RFC 5044 4.5: MULPDU from EMSS).
            assert!(mulpdu > 8_000, "{what}: MULPDU {mulpdu}");
        }
        // The engine side(s) sent or received packets over several UMEM frames.
        for (side, transport, out) in [("client", client, &c), ("server", server, &s)]
            .into_iter()
            .filter(|&(_, transport, _)| multi && transport == "xdp")
        {
            let err = String::from_utf8_lossy(&out.stderr);
            let line = err
                .lines()
                .find(|l| l.contains("engine counters:"))
                .unwrap_or_else(|| {
                    panic!("{what}: the {side} ({transport}) printed no engine counters:\n{err}")
                });
            assert!(
                line.contains("multi-frame packets rx "),
                "{what}: the {side}'s engine carried no multi-frame packet: {line}"
            );
            assert!(
                line.contains("(dropped on receive 0)"),
                "{what}: the {side}'s engine dropped multi-frame packets: {line}"
            );
        }
        let err = String::from_utf8_lossy(&c.stderr);
        println!(
            "{what}: MULPDU {mulpdu}; {}",
            err.lines().last().unwrap_or("")
        );
    };
    for test in ["write-bw", "read-bw", "send-bw"] {
        for (server, client) in [("xdp", "xdp"), ("socket", "xdp"), ("xdp", "socket")] {
            for markers in ["off", "on"] {
                run(
                    test,
                    server,
                    client,
                    &["-a", "-n", "3", "--markers", markers],
                    true,
                );
            }
            run(test, server, client, &["-s", "1", "-n", "5"], false);
            run(test, server, client, &["-s", "16777216", "-n", "2"], true);
        }
    }
    run("write-lat", "xdp", "xdp", &["-a", "-n", "20"], true);
}
