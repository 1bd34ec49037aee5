//! Wireshark agrees with us: capture loopback runs of `--mpa-rev 1 --crc on` with tcpdump and
//! check that `tshark -V` decodes the MPA Request and Reply, finds only good CRCs, and shows the
//! RDMAP opcodes of the operations that ran. (tshark 4.0 decodes MPA revision 1 and expects
//! each TCP segment to start with an FPDU; the latency tests send one message at a time.)

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

struct Capture {
    child: KillOnDrop,
    path: PathBuf,
}

fn start_capture(name: &str, port: &str) -> Capture {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("{name}.pcap"));
    let _ = std::fs::remove_file(&path);
    let mut child = Command::new("tcpdump")
        // Without --immediate-mode, tcpdump on this kernel's loopback writes nothing.
        // -Z root: no change of user (the `tcpdump` account may not exist).
        .args([
            "-i",
            "lo",
            "-Z",
            "root",
            "--immediate-mode",
            "-U",
            "-n",
            "-w",
        ])
        .arg(&path)
        .arg(format!("tcp port {port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tcpdump");
    let stderr = child.stderr.take().expect("tcpdump stderr");
    let child = KillOnDrop(child);
    // tcpdump says "listening on lo" once the capture is running.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stderr).lines().map_while(Result::ok);
        let _ = tx.send(lines.next().unwrap_or_default());
        lines.for_each(drop);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("tcpdump said nothing in 10 s");
    assert!(line.contains("listening"), "tcpdump did not start: {line}");
    Capture { child, path }
}

fn stop_capture(mut cap: Capture) -> PathBuf {
    wait_until_file_settles(
        &cap.path,
        Duration::from_millis(500),
        Duration::from_secs(10),
    );
    interrupt_within(&mut cap.child.0, Duration::from_secs(10));
    std::mem::take(&mut cap.path)
}

#[test]
fn tshark_decodes_rev1_crc_capture() {
    if !require(is_root(), "capturing on loopback needs root")
        || !require(
            have("tcpdump") && have("tshark"),
            "tcpdump and tshark are needed (scripts/install-deps.sh)",
        )
    {
        return;
    }
    let iters = 20;
    // Each test's data opcode, and how many of them the run must show: both directions of the
    // ping-pong for Write and Send, one Request and one Response per Read.
    for (test, opcodes) in [
        ("write-lat", &[("OpCode: Write (0x0)", 2 * iters)][..]),
        (
            "read-lat",
            &[
                ("OpCode: Read Request (0x1)", iters),
                ("OpCode: Read Response (0x2)", iters),
            ][..],
        ),
        ("send-lat", &[("OpCode: Send (0x3)", 2 * iters)][..]),
    ] {
        let n = iters.to_string();
        let args = ["--mpa-rev", "1", "--crc", "on", "-s", "64", "-n", &n];
        // A capture on loopback now and then misses a few packets of a run (seen in CI: four
        // of a send-lat run's segments absent, the rest in order), which then decodes short:
        // a run is taken again, up to three times. A decoding regression fails every one.
        let mut failures = Vec::new();
        for attempt in 1..=3 {
            match capture_and_decode(test, &args, iters, opcodes) {
                Ok(()) => break,
                Err(e) => {
                    eprintln!("{test}, attempt {attempt}: {e}");
                    failures.push(e);
                }
            }
        }
        assert!(
            failures.len() < 3,
            "{test}: every attempt failed: {failures:#?}"
        );
    }
}

/// One run of `test` with `args` under a capture, decoded by tshark and checked: the MPA
/// Request and Reply, only good CRCs, at least `iters` FPDUs and each of `opcodes` as often as
/// it says.
fn capture_and_decode(
    test: &str,
    args: &[&str],
    iters: usize,
    opcodes: &[(&str, usize)],
) -> Result<(), String> {
    // The capture follows the port: a fresh one (the first was taken) gets a new capture.
    let (server, (client, path)) = with_free_port(|port| {
        let cap = start_capture(test, port);
        let (server, client) = run_pair_on(test, port, args);
        (server, (client, stop_capture(cap)))
    });
    assert!(
        server.status.success(),
        "{test} server: {}",
        String::from_utf8_lossy(&server.stderr)
    );
    assert!(
        client.status.success(),
        "{test} client: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    let text = tshark_verbose(&path);
    let dump = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{test}.tshark.txt"));
    std::fs::write(&dump, &text).expect("save tshark output");
    let ctx = format!("see {}", dump.display());
    let check = |ok: bool, what: String| {
        if ok {
            Ok(())
        } else {
            Err(format!("{what} ({ctx})"))
        }
    };
    let requests = count(&text, "Request frame header");
    let replies = count(&text, "Reply frame header");
    check(
        requests == 1 && replies == 1,
        format!("{requests} Requests, {replies} Replies"),
    )?;
    let revisions = count(&text, "Revision: 1\n");
    check(revisions == 2, format!("{revisions} x 'Revision: 1'"))?;
    check(!text.contains("Malformed"), "a malformed packet".into())?;
    let fpdus = count(&text, "    FPDU\n");
    let good = count(&text, "(Good CRC32)");
    check(fpdus >= iters, format!("only {fpdus} FPDUs decoded"))?;
    check(good == fpdus, format!("{fpdus} FPDUs but {good} good CRCs"))?;
    for &(op, at_least) in opcodes {
        let n = count(&text, op);
        check(n >= at_least, format!("{n} x '{op}', expected {at_least}"))?;
    }
    Ok(())
}
