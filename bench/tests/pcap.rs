//! `--pcap FILE` captures what the AF_XDP engine receives and sends, which nothing else can
//! see (XDP redirects received frames before any packet tap; AF_XDP transmits bypass them).
//! Engine to engine on the veth bed, `--mpa-rev 1 --crc on`, both sides capturing:
//!
//! * every frame is in the file: its record count is the capture's count, which is the
//!   engine's `frames_rx + frames_tx`, none dropped or cut;
//! * tshark decodes each file: one MPA Request and one Reply, nothing malformed, every FPDU
//!   with "Good CRC32", and the RDMAP opcodes of the run (Writes and the control Sends of
//!   write-bw; Read Request and Response of read-lat);
//! * timestamps never go backwards by more than what two shards writing at once explain.
//!
//! Needs root and tshark; skips (or fails under `CI=true`) otherwise.

mod common;

use std::path::{Path, PathBuf};

use common::{bed_run, count, counter, have, require, tshark_verbose};
use serde_json::Value;
use testbed::*;

/// (time in ns, frame length) of each record of a pcap file with nanosecond timestamps.
fn records(path: &Path) -> Vec<(u64, usize)> {
    let b = std::fs::read(path).expect("read capture");
    assert!(b.len() >= 24, "{}: no pcap header", path.display());
    assert_eq!(
        u32::from_le_bytes(b[0..4].try_into().expect("4")),
        0xa1b2_3c4d,
        "nanosecond pcap magic"
    );
    assert_eq!(u32::from_le_bytes(b[20..24].try_into().expect("4")), 1);
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 octets"));
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= b.len() {
        let ns = u64::from(u32_at(at)) * 1_000_000_000 + u64::from(u32_at(at + 4));
        let (saved, orig) = (u32_at(at + 8) as usize, u32_at(at + 12) as usize);
        assert_eq!(saved, orig, "record {} cut short", out.len());
        out.push((ns, orig));
        at += 16 + saved;
    }
    assert_eq!(
        at,
        b.len(),
        "{}: a record runs past the end",
        path.display()
    );
    out
}

fn capture_path(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.pcap"));
    let _ = std::fs::remove_file(&p);
    p
}

/// Runs `test` engine to engine with both sides capturing; returns each side's JSON and file.
fn captured_run(test: &str, port: &str, extra: &[&str]) -> [(Value, PathBuf); 2] {
    let files = [
        capture_path(&format!("{test}-server")),
        capture_path(&format!("{test}-client")),
    ];
    let args = |iface: &str, file: &Path| {
        let mut a: Vec<String> = [
            test,
            "--transport",
            "xdp",
            "--iface",
            iface,
            "-p",
            port,
            "--mpa-rev",
            "1",
            "--crc",
            "on",
            "--json",
            "--pcap",
        ]
        .map(str::to_owned)
        .to_vec();
        a.push(file.display().to_string());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let (c, s) = bed_run(&args(DEV_A, &files[0]), &args(DEV_B, &files[1]));
    let [fs, fc] = files;
    [(s, fs), (c, fc)]
}

/// The capture of one side holds every frame its engine handled, and tshark reads it as a
/// clean MPA revision 1 session with CRCs; returns tshark's text.
fn check_side(who: &str, side: &Value, peer: &Value, file: &Path) -> String {
    let pcap = &side["pcap"];
    assert_eq!(pcap["frames_dropped"], 0, "{who}: {side}");
    assert_eq!(pcap["frames_truncated"], 0, "{who}: {side}");
    assert!(pcap["error"].is_null(), "{who}: {side}");
    let frames = counter(side, "frames_rx") + counter(side, "frames_tx");
    assert_eq!(pcap["frames_written"], frames, "{who}: {side}");
    let recs = records(file);
    assert_eq!(
        recs.len() as u64,
        frames,
        "{who}: records in {}",
        file.display()
    );
    // Shards stamp and queue their frames independently; a record may precede another
    // shard's stamped a little earlier, never by much.
    for (i, w) in recs.windows(2).enumerate() {
        assert!(
            w[1].0 + 50_000_000 >= w[0].0,
            "{who}: record {} is 50 ms older than the one before",
            i + 1
        );
    }

    let text = tshark_verbose(file);
    let dump = file.with_extension("tshark.txt");
    std::fs::write(&dump, &text).expect("save tshark output");
    let ctx = format!("{who}: see {}", dump.display());
    assert_eq!(count(&text, "Request frame header"), 1, "{ctx}");
    assert_eq!(count(&text, "Reply frame header"), 1, "{ctx}");
    assert!(!text.contains("Malformed"), "{ctx}");
    assert!(!text.contains("Bad CRC"), "{ctx}");
    let fpdus = count(&text, "    FPDU\n");
    assert!(fpdus > 0, "{ctx}");
    assert_eq!(count(&text, "(Good CRC32)"), fpdus, "{ctx}");
    // tshark found every FPDU the engine sent or received (each side starts its segments
    // with FPDUs), plus those of segments either side retransmitted.
    let handled = counter(side, "fpdus_tx") + counter(side, "fpdus_rx");
    let resent = counter(side, "retransmitted_segments") + counter(peer, "retransmitted_segments");
    assert!(
        (handled..=handled + resent).contains(&(fpdus as u64)),
        "{ctx}: tshark {fpdus} FPDUs, the engine {handled} (+ {resent} segments resent)"
    );
    text
}

#[test]
fn pcap_holds_every_frame_and_tshark_decodes_it() {
    if !require(have("tshark"), "tshark is needed (scripts/install-deps.sh)") {
        return;
    }
    let _bed = bed_or_skip!();
    const WRITES: u64 = 100;
    let n = WRITES.to_string();
    let sides = captured_run("write-bw", "18760", &["-s", "65536", "-n", &n]);
    for (i, who) in ["server", "client"].into_iter().enumerate() {
        let ((side, file), (peer, _)) = (&sides[i], &sides[1 - i]);
        let text = check_side(who, side, peer, file);
        let writes = count(&text, "OpCode: Write (0x0)") as u64;
        // The client writes; its JSON says the FPDU size it used.
        let mulpdu = sides[1].0["mulpdu"].as_u64().expect("mulpdu");
        assert!(
            writes >= WRITES * 65536_u64.div_ceil(mulpdu),
            "{who}: only {writes} Write FPDUs"
        );
        assert!(count(&text, "OpCode: Send (0x3)") >= 2, "{who}");
    }

    let sides = captured_run("read-lat", "18761", &["-s", "4096", "-n", "20"]);
    for (i, who) in ["server", "client"].into_iter().enumerate() {
        let ((side, file), (peer, _)) = (&sides[i], &sides[1 - i]);
        let text = check_side(who, side, peer, file);
        assert!(count(&text, "OpCode: Read Request (0x1)") >= 20, "{who}");
        assert!(count(&text, "OpCode: Read Response (0x2)") >= 20, "{who}");
    }
}
