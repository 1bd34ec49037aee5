//! `iwarp-bench tcp-sink` / `tcp-source` over our TCP on AF_XDP (`--transport xdp`) against
//! the kernel's TCP on the veth test bed (`scripts/netns.sh`): the tools run in namespace `iwa`
//! under `ip netns exec`, the kernel peer is a `std::net` socket on a thread that entered
//! namespace `iwb`, with timestamps, SACK and window scaling switched on there. 256 MiB each
//! way; the SHA-256 of what was received must equal the sender's.
//!
//! Needs root. Without it (or without the bed) each test prints `SKIPPED: <why>` and passes,
//! except under `CI=true`, where it fails with the reason. The tests serialise with every other
//! test-bed user on `/run/lock/iwarp-netns.lock`, bring the bed up fresh and always take it
//! down. A transfer that makes no progress for 60 s fails with a message saying so.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{bench_in, json, OutputWithin, Tool, RUN_LIMIT};
use sha2::{Digest, Sha256};
use testbed::*;

/// Bytes moved each way.
const BYTES: u64 = 256 << 20;
/// No progress for this long fails the test.
const STALL: Duration = Duration::from_secs(60);
/// Upper bound on one whole transfer (256 MiB at a few Mbit/s would still pass the stall
/// check; this catches a crawl).
const WHOLE: Duration = Duration::from_secs(300);

/// Timestamps, SACK and window scaling on for the kernel TCP of namespace `ns`, checked.
fn kernel_tcp_options_on(ns: &str) -> Result<(), String> {
    const KNOBS: [&str; 3] = ["tcp_timestamps", "tcp_sack", "tcp_window_scaling"];
    let mut script = String::new();
    for k in KNOBS {
        script.push_str(&format!(
            "echo 1 > /proc/sys/net/ipv4/{k} && cat /proc/sys/net/ipv4/{k} && "
        ));
    }
    script.push_str("true");
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", &script])
        .output_within(RUN_LIMIT)
        .map_err(|e| format!("ip netns exec {ns} sh: {e}"))?;
    let values = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || values.split_whitespace().collect::<Vec<_>>() != ["1"; 3] {
        return Err(format!(
            "setting {KNOBS:?} in {ns} failed: {values:?} {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Pseudo-random bytes for the kernel client (any generator will do: the sink hashes what it
/// receives, and the client hashes what it sends).
struct Bytes(u64);

impl Bytes {
    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let w = self.0.to_le_bytes();
            let n = c.len();
            c.copy_from_slice(&w[..n]);
        }
    }
}

/// Checks the negotiated options a tool reports: SACK, timestamps, and a window-scale shift
/// from the kernel.
fn assert_options(report: &serde_json::Value, what: &str) {
    let tcp = &report["tcp"];
    assert_eq!(tcp["sack"], true, "{what}: SACK not negotiated: {report}");
    assert_eq!(
        tcp["timestamps"], true,
        "{what}: timestamps not negotiated: {report}"
    );
    let peer_shift = tcp["window_scale"][1].as_u64().unwrap_or(0);
    assert!(
        peer_shift > 0,
        "{what}: no window scaling from the kernel: {report}"
    );
}

/// The kernel's TCP in `iwb` sends 256 MiB to `tcp-sink --transport xdp` in `iwa`.
#[test]
fn kernel_client_sends_256_mib_to_xdp_tcp_sink() {
    let _bed = bed_or_skip!();
    kernel_tcp_options_on(NS_B).expect("kernel TCP options in iwb");
    const PORT: u16 = 18710;
    let port = PORT.to_string();
    let mut sink = Tool::start(bench_in(
        "iwa",
        &[
            "tcp-sink",
            "--transport",
            "xdp",
            "--iface",
            "iwa0",
            "--port",
            &port,
            "--timeout",
            "60",
            "--idle-timeout",
            "60",
        ],
    ));
    sink.wait_for("listening on", Duration::from_secs(30));

    let started = Instant::now();
    let client = std::thread::spawn(move || -> Result<(u64, String), String> {
        enter_ns(NS_B).map_err(|e| e.to_string())?;
        let to = SocketAddr::V4(SocketAddrV4::new(ADDR_A, PORT));
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(10))
            .map_err(|e| format!("connect to the sink at {to}: {e}"))?;
        s.set_write_timeout(Some(STALL))
            .and_then(|_| s.set_read_timeout(Some(STALL)))
            .map_err(|e| e.to_string())?;
        let mut gen = Bytes(0x1234_5678_9abc_def1);
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut sent = 0u64;
        while sent < BYTES {
            let n = (BYTES - sent).min(buf.len() as u64) as usize;
            gen.fill(&mut buf[..n]);
            hasher.update(&buf[..n]);
            s.write_all(&buf[..n]).map_err(|e| {
                format!("transfer stalled or failed after {sent} of {BYTES} bytes (no progress for up to {STALL:?}): {e}")
            })?;
            sent += n as u64;
        }
        s.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
        // The sink closes once it has read everything.
        let mut rest = Vec::new();
        s.read_to_end(&mut rest)
            .map_err(|e| format!("waiting for the sink to close: {e}"))?;
        Ok((sent, hex(&hasher.finalize())))
    });
    let sent = client.join().expect("client thread");
    let (out, err) = sink.finish(WHOLE);
    let (sent, sent_hash) =
        sent.unwrap_or_else(|e| panic!("kernel client: {e}\nsink stderr:\n{err}"));
    let report = json(&out, &err, "tcp-sink");
    println!(
        "{BYTES} bytes kernel -> xdp in {:.2?}: {report}",
        started.elapsed()
    );
    assert_eq!(report["bytes"].as_u64(), Some(sent), "{report}");
    assert_eq!(
        report["sha256"].as_str(),
        Some(sent_hash.as_str()),
        "received stream differs from the sent one"
    );
    assert_eq!(report["xdp"]["rx_malformed"], 0, "{report}");
    assert_options(&report, "tcp-sink");
}

/// `tcp-source --transport xdp` in `iwa` sends 256 MiB to the kernel's TCP in `iwb`.
#[test]
fn xdp_tcp_source_sends_256_mib_to_kernel_server() {
    let _bed = bed_or_skip!();
    kernel_tcp_options_on(NS_B).expect("kernel TCP options in iwb");
    const PORT: u16 = 18711;
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = std::thread::spawn(move || -> Result<(u64, String), String> {
        enter_ns(NS_B).map_err(|e| e.to_string())?;
        let l = TcpListener::bind(SocketAddrV4::new(ADDR_B, PORT))
            .map_err(|e| format!("listen in iwb: {e}"))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let _ = ready_tx.send(());
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err("tcp-source never connected within 60 s".into());
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(format!("accept: {e}")),
            }
        };
        s.set_nonblocking(false)
            .and_then(|_| s.set_read_timeout(Some(STALL)))
            .map_err(|e| e.to_string())?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    got += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(format!(
                        "transfer stalled or failed after {got} bytes (no progress for up to {STALL:?}): {e}"
                    ))
                }
            }
        }
        let _ = s.shutdown(Shutdown::Both);
        Ok((got, hex(&hasher.finalize())))
    });
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("kernel server listening");

    let started = Instant::now();
    let bytes = BYTES.to_string();
    let source = Tool::start(bench_in(
        "iwa",
        &[
            "tcp-source",
            "--transport",
            "xdp",
            "--iface",
            "iwa0",
            "--bytes",
            &bytes,
            "--seed",
            "7",
            "--idle-timeout",
            "60",
            "--timeout",
            "30",
            &format!("{ADDR_B}:{PORT}"),
        ],
    ));
    let (out, err) = source.finish(WHOLE);
    let report = json(&out, &err, "tcp-source");
    let (got, got_hash) = server
        .join()
        .expect("server thread")
        .unwrap_or_else(|e| panic!("kernel server: {e}\ntcp-source stderr:\n{err}"));
    println!(
        "{BYTES} bytes xdp -> kernel in {:.2?}: {report}",
        started.elapsed()
    );
    assert_eq!(got, BYTES, "kernel server received {got} of {BYTES} bytes");
    assert_eq!(report["bytes"].as_u64(), Some(BYTES), "{report}");
    assert_eq!(
        report["sha256"].as_str(),
        Some(got_hash.as_str()),
        "received stream differs from the sent one"
    );
    assert!(report["gbit_s"].as_f64().unwrap_or(0.0) > 0.0, "{report}");
    assert_options(&report, "tcp-source");
}

/// Clear errors, no panics: a missing interface, and nobody listening at the address.
#[test]
fn tcp_tools_fail_clearly() {
    let _bed = bed_or_skip!();
    kernel_tcp_options_on(NS_B).expect("kernel TCP options in iwb");
    let out = bench_in(
        "iwa",
        &[
            "tcp-sink",
            "--transport",
            "xdp",
            "--iface",
            "nonexistent0",
            "--port",
            "18712",
        ],
    )
    .output_within(RUN_LIMIT)
    .expect("run tcp-sink");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("nonexistent0") && err.contains("not found"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    // 10.77.0.9 is on the bed's subnet but nobody answers ARP for it.
    let out = bench_in(
        "iwa",
        &[
            "tcp-source",
            "--transport",
            "xdp",
            "--iface",
            "iwa0",
            "--bytes",
            "1000",
            "10.77.0.9:18712",
        ],
    )
    .output_within(RUN_LIMIT)
    .expect("run tcp-source");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("10.77.0.9") && err.contains("ARP"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // The peer's kernel answers the SYN with a RST: nothing listens on the port.
    let out = bench_in(
        "iwa",
        &[
            "tcp-source",
            "--transport",
            "xdp",
            "--iface",
            "iwa0",
            "--bytes",
            "1000",
            "10.77.0.2:18713",
        ],
    )
    .output_within(RUN_LIMIT)
    .expect("run tcp-source");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("refused"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
