//! `--tos` (perftest's; rdma_cm's `RDMA_OPTION_ID_TOS`, the API's `ConnectParams::tos`) on
//! the wire of the veth bed: the AF_XDP engine in `iwa` against the socket transport (kernel
//! TCP, `IP_TOS`) in `iwb`, each end with a TOS of its own, the engine as server and as client.
//! tshark reads the engine's capture (`--pcap`: every frame it received and sent): every
//! frame of the connection carries its sender's DSCP, the SYN and the SYN-ACK (a listener's
//! TOS, inherited by what it accepts) included, and the engine sends its ECN field clear
//! (Not-ECT) even when the TOS given sets it.
//!
//! Needs root and tshark; skips (or fails under `CI=true`) otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{bed_pair_in, have, parse, require, OutputWithin, RUN_LIMIT};
use testbed::*;

/// One TCP frame of a capture: its IPv4 source, Type of Service octet and TCP flags.
struct Frame {
    src: String,
    tos: u8,
    flags: u16,
}

const SYN: u16 = 0x02;
const RST: u16 = 0x04;
const ACK: u16 = 0x10;

/// tshark's reading of every TCP frame in `file`.
fn frames(file: &Path) -> Vec<Frame> {
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(file)
        .args(["-Y", "tcp", "-T", "fields", "-E", "separator=,"])
        .args(["-e", "ip.src", "-e", "ip.dsfield", "-e", "tcp.flags"])
        .output_within(RUN_LIMIT)
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Hexadecimal fields print as 0x..; decimal otherwise.
    let hex = |s: &str| {
        let s = s.trim();
        match s.strip_prefix("0x") {
            Some(h) => u16::from_str_radix(h, 16),
            None => s.parse(),
        }
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            let (Some(src), Some(Ok(tos)), Some(Ok(flags))) = (
                f.first(),
                f.get(1).map(|s| hex(s)),
                f.get(2).map(|s| hex(s)),
            ) else {
                panic!("tshark line {line:?}");
            };
            Frame {
                src: src.to_string(),
                tos: u8::try_from(tos).expect("an octet"),
                flags,
            }
        })
        .collect()
}

/// Every frame from `src` carries `tos`; among them is one with exactly the flags `opening`
/// (the SYN or the SYN-ACK) and data-path ACKs. RSTs are left out: one answering a segment no
/// connection owns (a client's SYN that came before the listener was up; the client tries
/// again) carries that segment's DSCP, as Linux's does.
fn check_direction(frames: &[Frame], src: &str, tos: u8, opening: u16, who: &str) {
    let sent: Vec<&Frame> = frames
        .iter()
        .filter(|f| f.src == src && f.flags & RST == 0)
        .collect();
    assert!(sent.len() >= 20, "{who}: only {} frames", sent.len());
    for f in &sent {
        assert_eq!(
            f.tos, tos,
            "{who}: a frame (TCP flags {:#06x}) with TOS {:#04x}, not {tos:#04x}",
            f.flags, f.tos
        );
    }
    assert!(
        sent.iter().any(|f| f.flags & (SYN | ACK) == opening),
        "{who}: its {} is not in the capture",
        if opening == SYN { "SYN" } else { "SYN-ACK" }
    );
}

fn capture_path(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.pcap"));
    let _ = std::fs::remove_file(&p);
    p
}

/// write-lat's arguments for one side: `transport` (with the engine's interface and capture)
/// and `tos`.
fn side(port: &str, tos: &str, engine: Option<&Path>) -> Vec<String> {
    let mut a: Vec<String> = ["write-lat", "-p", port, "-s", "64", "-n", "200", "--json"]
        .map(str::to_owned)
        .to_vec();
    a.extend(["--tos".to_owned(), tos.to_owned()]);
    match engine {
        Some(file) => {
            a.extend(["--transport", "xdp", "--iface", DEV_A, "--pcap"].map(str::to_owned));
            a.push(file.display().to_string());
        }
        None => a.extend(["--transport", "socket"].map(str::to_owned)),
    }
    a
}

#[test]
fn each_end_sends_its_own_tos() {
    if !require(have("tshark"), "tshark is needed (scripts/install-deps.sh)") {
        return;
    }
    let _bed = bed_or_skip!();
    let (a, b) = (ADDR_A.to_string(), ADDR_B.to_string());

    // The engine listens (TOS 0xb9: DSCP 46 with ECN bits, which it must not send), the
    // socket transport connects (0x28: DSCP 10).
    let file = capture_path("tos-engine-server");
    let (client, server) = bed_pair_in(
        (NS_A, ADDR_A),
        &side("18790", "185", Some(&file)),
        NS_B,
        &side("18790", "40", None),
    );
    parse("client", &client);
    parse("server", &server);
    let seen = frames(&file);
    check_direction(&seen, &a, 0xb8, SYN | ACK, "the engine as server");
    check_direction(&seen, &b, 0x28, SYN, "the socket transport as client");

    // The engine connects (0x48: DSCP 18), the socket transport listens (0x70: DSCP 28).
    let file = capture_path("tos-engine-client");
    let (client, server) = bed_pair_in(
        (NS_B, ADDR_B),
        &side("18791", "112", None),
        NS_A,
        &side("18791", "72", Some(&file)),
    );
    parse("client", &client);
    parse("server", &server);
    let seen = frames(&file);
    check_direction(&seen, &a, 0x48, SYN, "the engine as client");
    check_direction(&seen, &b, 0x70, SYN | ACK, "the socket transport as server");
}
