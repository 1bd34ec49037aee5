//! Writes the committed seed corpora (`seeds/<target>/`): a handful of valid frames, streams
//! and exchanges per target, in the input layout each target reads (`iwarp_fuzz::Input`).
//!
//! `cargo run --example seeds` (in `fuzz/`) rewrites them; keep them small.

use std::fs;
use std::path::Path;

use iwarp_fuzz::{untagged_header, Seed};
use mpa::wire::{EnhancedParams, FrameKind, MpaFrameRepr};

fn write(target: &str, name: &str, seed: &Seed) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    fs::create_dir_all(&dir).expect("seed directory");
    fs::write(dir.join(name), &seed.0).expect("write seed");
}

fn frame(kind: FrameKind, rev: u8, crc: bool, markers: bool, block: bool, pd: &[u8]) -> Vec<u8> {
    MpaFrameRepr {
        kind,
        markers,
        crc,
        reject: false,
        rev,
        enhanced: block.then_some(EnhancedParams {
            ird: 16,
            ord: 16,
            ..EnhancedParams::default()
        }),
        private_data: pd,
    }
    .to_vec()
    .expect("frame")
}

/// `mpa_startup`'s config: revision 1 or 2, C, M, IRD, ORD (both below 32), peer-to-peer,
/// startup and accept timeouts of 10 s.
fn mpa_config(s: &mut Seed, rev: u8, crc: bool, markers: bool, depth: u16, p2p: bool) {
    let mut f: u16 = if rev == 1 { 0 } else { 1 };
    if crc {
        f |= 8;
    }
    if markers {
        f |= 16;
    }
    if p2p {
        f |= 32;
    }
    s.u16(f).u16(depth).u16(depth).u16(10_000).u16(10_000);
}

/// Pieces of `sizes` octets each, no time passing, no timeout check.
fn pieces(s: &mut Seed, sizes: &[u8]) {
    for &n in sizes {
        s.u8(n).u8(0).u8(0);
    }
}

fn mpa_startup() {
    let t = "mpa_startup";
    let req = frame(FrameKind::Request, 2, true, false, true, b"hello");
    write(t, "frame_request_rev2", Seed::new().u8(0).bytes(&req));
    let rep = frame(FrameKind::Reply, 1, false, true, false, b"welcome");
    write(t, "frame_reply_rev1", Seed::new().u8(0).bytes(&rep));

    // Initiator fed a Reply in three pieces, then FPDU octets.
    let mut s = Seed::new();
    s.u8(1);
    mpa_config(&mut s, 2, true, false, 16, false);
    s.u16(5).bytes(b"hello");
    let mut sizes = Seed::new();
    pieces(&mut sizes, &[7, 13, 40]);
    s.u8(sizes.0.len() as u8).bytes(&sizes.0);
    s.bytes(&frame(FrameKind::Reply, 2, true, false, true, b"ok"));
    s.bytes(&[0, 4, 1, 2, 3, 4]);
    write(t, "initiator_reply", &s);

    // Responder fed a Request whole, accepts.
    let mut s = Seed::new();
    s.u8(2);
    mpa_config(&mut s, 2, true, true, 8, false);
    s.u8(0).u16(3).bytes(b"yes");
    let mut sizes = Seed::new();
    pieces(&mut sizes, &[47]);
    s.u8(sizes.0.len() as u8).bytes(&sizes.0);
    s.bytes(&frame(FrameKind::Request, 2, false, true, true, b"client"));
    write(t, "responder_request", &s);

    // Pairs: plain Rev 2, peer-to-peer with Markers, Rev 1, a reject.
    for (name, rev, p2p, markers, reject) in [
        ("pair_rev2", 2, false, false, 1u8),
        ("pair_p2p_markers", 2, true, true, 1),
        ("pair_rev1", 1, false, false, 1),
        ("pair_reject", 2, false, false, 0),
    ] {
        let mut s = Seed::new();
        s.u8(3);
        mpa_config(&mut s, rev, true, markers, 4, p2p);
        mpa_config(&mut s, 2, false, markers, 8, false);
        s.u16(6).bytes(b"client").u16(6).bytes(b"server");
        s.u8(reject);
        s.u8(0); // no change to the Request
        pieces(&mut s, &[30, 30]);
        s.u8(0); // no change to the Reply
        s.bytes(&[0; 64]); // FPDU octets after the Reply
        pieces(&mut s, &[30, 30]);
        write(t, name, &s);
    }
}

/// `mpa_decoder`: FPDUs of the given ULPDU lengths (pattern-filled), one changed if asked.
fn decoder_seed(crc: bool, markers: bool, lens: &[u16], change: Option<usize>) -> Seed {
    let mut s = Seed::new();
    s.u8(u8::from(crc) | u8::from(markers) << 1);
    s.u64(0x1234_5678_9abc_def0);
    for (i, &len) in lens.iter().enumerate() {
        let changed = change == Some(i);
        // op: FPDU with a u16 length (op >> 6 == 1), kind 5 when changed.
        s.u8(0x40 | if changed { 5 } else { 0 });
        s.u16(len);
        s.bytes(
            &(0..len)
                .map(|j| (j as u8).wrapping_mul(7))
                .collect::<Vec<_>>(),
        );
        if changed {
            s.u16(len / 2 + 3).u8(0x20);
        }
    }
    s
}

fn mpa_decoder() {
    let t = "mpa_decoder";
    let lens = [20, 100, 600, 0, 1400, 33];
    write(t, "crc", &decoder_seed(true, false, &lens, None));
    write(t, "crc_markers", &decoder_seed(true, true, &lens, None));
    write(t, "markers_only", &decoder_seed(false, true, &lens, None));
    write(t, "plain", &decoder_seed(false, false, &lens, None));
    write(
        t,
        "crc_markers_changed",
        &decoder_seed(true, true, &lens, Some(2)),
    );
}

fn ddp_placement() {
    let t = "ddp_placement";
    // QN 0, MSN 1, 4 buffers; post two, a Send of two segments out of order, deliver.
    let mut s = Seed::new();
    s.u8(0).u8(0).u8(4);
    s.u8(2).u16(100); // post 100
    s.u8(2).u16(64); // post 64
                     // place: record|last, MSN next (n=1), MO (u16 % 2100), payload.
    s.u8(3)
        .u8(1 | 2)
        .u8(1)
        .u8(2)
        .u16(50)
        .u16(40)
        .bytes(&[0xab; 40]);
    s.u8(3).u8(1).u8(1).u8(2).u16(0).u16(50).bytes(&[0xcd; 50]);
    s.u8(5);
    // A tagged buffer and a Write into it.
    s.u8(1).u8(0).u16(300).u8(0).u32(0x1000);
    s.u8(0).u8(0).u16(16).u8(0).u16(64).bytes(&[0xee; 64]);
    // A raw untagged header.
    s.u8(0)
        .u8(24)
        .bytes(&untagged_header(0x41, 0x43, 0, 0, 1, 0))
        .bytes(&[1, 2, 3, 4, 5, 6]);
    // Segmenter and tracker.
    s.u8(6).u16(5000).u8(0).u16(1442);
    s.u8(7).u8(0).u16(0).u16(100).u8(0);
    s.u8(7).u8(0).u16(100).u16(28).u8(1);
    write(t, "send_two_segments", &s);
}

/// A template ULPDU: RDMA Write of `n` octets into region `region` (`rdmap_ulpdu` and
/// `iwarp_conn` share `iwarp_fuzz::Templates`).
fn write_template(s: &mut Seed, region: u8, last: bool, off: u16, n: u8) {
    s.u8(1).u8(0x40 | 0x04 | u8::from(last)); // kind Write, flags: template ctrl, opcode Write
    s.u8(region).u8(2).u16(off); // STag of the region, TO = base + off
    s.u8(n).bytes(&vec![0x5a; usize::from(n)]);
}

/// A template Send of `n` octets with MSN `msn`, MO `mo`.
fn send_template(s: &mut Seed, last: bool, msn: u8, mo: u8, n: u8) {
    s.u8(3).u8(0x40 | 0x02 | u8::from(last)); // kind Send, flags: template ctrl, opcode Send
    s.u8(0); // invalidate STag pick
    s.u8(msn);
    // MO: an octet, where 0 means a full u32 follows.
    if mo == 0 {
        s.u8(0).u32(0);
    } else {
        s.u8(mo);
    }
    s.u8(n).bytes(&vec![0x3c; usize::from(n)]);
}

/// A template Read Request for `size` octets of region 2 (remote read).
fn read_request_template(s: &mut Seed, msn: u8, size: u16) {
    s.u8(4).u8(0).u8(msn);
    s.u32(0x9900).u64(0x5000);
    s.u8(1).u16(size);
    s.u8(2).u8(2).u16(0);
}

/// A template Read Response into the sink region of `n` octets at `off`.
fn read_response_template(s: &mut Seed, last: bool, off: u16, n: u8) {
    s.u8(1).u8(0x40 | 0x02 | u8::from(last));
    s.u8(5).u8(2).u16(off);
    s.u8(n).bytes(&vec![0x77; usize::from(n)]);
}

/// A template Atomic Request (RFC 7306): FetchAdd of 1 on the word at `off` of region
/// `region`, MSN `msn` on QN 1.
fn atomic_request_template(s: &mut Seed, msn: u8, region: u8, off: u16) {
    s.u8(4).u8(0x20).u8(msn); // kind Read Request, flags: the Atomic Request template
    s.u8(2); // AOpCode pick: FetchAdd
    s.u32(0x0A0B_0C0D); // Request Identifier
    s.u8(region).u8(2).u16(off); // STag of the region, TO = base + off
    s.u64(1).u64(0).u64(0).u64(u64::MAX); // Add Data, Add Mask, Compare Data and Mask
}

/// A template Immediate Data message (RFC 7306 6.3) with MSN `msn`.
fn immediate_template(s: &mut Seed, msn: u8, value: u8) {
    // kind Send, flags: template ctrl (Last), opcode 0x42 + 6 = Immediate Data.
    s.u8(3).u8(0x40 | 6 << 1 | 1);
    s.u8(0).u8(msn).u8(0).u32(0); // invalidate STag pick, MSN, MO 0
    s.u8(8).bytes(&[value; 8]);
}

/// A template Atomic Response (RFC 7306 5.2.2) on QN 3.
fn atomic_response_template(s: &mut Seed, msn: u8, request_id: u32, original: u64) {
    s.u8(5).u8(0x20).u8(msn).u32(request_id).u64(original);
}

fn rdmap_ulpdu() {
    let t = "rdmap_ulpdu";
    // IRD 2, ORD 2, two receives; one Read of 100 octets; MULPDU 200.
    let (k1, k2, mulpdu) = (2 | 2 << 2 | 2 << 4, 1 | 2 << 2, 45);
    let mut s = Seed::new();
    s.u8(k1).u8(k2).u8(mulpdu);
    s.u8(3);
    write_template(&mut s, 0, true, 16, 100);
    s.u8(1);
    send_template(&mut s, false, 1, 0, 30);
    s.u8(0);
    send_template(&mut s, true, 1, 30, 10);
    s.u8(2);
    read_request_template(&mut s, 1, 64);
    s.u8(4);
    read_response_template(&mut s, true, 0, 100);
    write(t, "mixed_out_of_order", &s);

    let mut s = Seed::new();
    s.u8(k1).u8(k2 | 1 << 4).u8(mulpdu); // expects a Send RTR
    s.u8(0);
    send_template(&mut s, true, 1, 0, 0);
    s.u8(1);
    // Terminate.
    s.u8(5)
        .u8(0)
        .u8(8)
        .bytes(&[0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]);
    write(t, "rtr_then_terminate", &s);

    // RFC 7306 on (knob 0x40): a FetchAdd outstanding after the Read (MSN 2 on QN 1, its
    // Request Identifier), an Atomic Request on the all-rights region, an Immediate Data, and
    // the Response to our FetchAdd.
    let mut s = Seed::new();
    s.u8(k1).u8(k2 | 0x40).u8(mulpdu);
    s.u8(1);
    atomic_request_template(&mut s, 1, 1, 8);
    s.u8(2);
    immediate_template(&mut s, 1, 0x11);
    s.u8(3);
    atomic_response_template(&mut s, 1, 2, 77);
    write(t, "rfc7306_atomics_and_immediate", &s);
}

/// How an `iwarp_conn` seed frames the stream and passes segments up.
#[derive(Clone, Copy)]
enum Framing {
    /// MPA; segments as `on_data`.
    Mpa,
    /// MPA; segments as the engine passes them, with the CRC read with their checksum.
    MpaDigest,
    /// IFT with both CRCs each way, checked, speculative placement allowed.
    Ift,
}

/// `iwarp_conn` knobs: target side, CRC, Markers (MPA; IFT always has both CRCs), transmit
/// mode, framing, reassembly budget (0: none, 1: spent, 2: one store's worth).
struct Knobs {
    initiator: bool,
    crc: bool,
    markers: bool,
    source: bool,
    framing: Framing,
    budget: u8,
}

impl Knobs {
    fn write(&self, s: &mut Seed) {
        let mut k1 = u8::from(self.initiator);
        // Reassembly room 16 KiB, 64 placed-FPDU records.
        let mut k2 = u8::from(self.source) | 1 << 1 | 2 << 3;
        match self.framing {
            Framing::Mpa | Framing::MpaDigest => {
                if self.crc {
                    k1 |= 8 | 32;
                }
                if self.markers {
                    k1 |= 16 | 64;
                }
                if let Framing::MpaDigest = self.framing {
                    k2 |= 64;
                }
            }
            Framing::Ift => {
                k1 |= 2 | 4 | 8 | 16;
                k2 |= 128;
            }
        }
        s.u8(k1).u8(k2).u8(self.budget);
    }
}

fn iwarp_conn() {
    let t = "iwarp_conn";
    let knobs = |initiator, crc, markers, source, framing, budget| Knobs {
        initiator,
        crc,
        markers,
        source,
        framing,
        budget,
    };
    for (name, k) in [
        (
            "responder_crc",
            knobs(false, true, false, true, Framing::Mpa, 0),
        ),
        (
            "initiator_crc_markers",
            knobs(true, true, true, false, Framing::Mpa, 0),
        ),
        (
            "responder_markers_only",
            knobs(false, false, true, true, Framing::Mpa, 0),
        ),
        (
            "initiator_crc_digest",
            knobs(true, true, false, true, Framing::MpaDigest, 0),
        ),
        (
            "responder_ift",
            knobs(false, true, false, true, Framing::Ift, 0),
        ),
        (
            "initiator_ift_records",
            knobs(true, true, false, false, Framing::Ift, 0),
        ),
        (
            "responder_spent_budget",
            knobs(false, false, false, true, Framing::Mpa, 1),
        ),
        (
            "initiator_one_store_budget",
            knobs(true, false, false, true, Framing::Mpa, 2),
        ),
    ] {
        let mut s = Seed::new();
        k.write(&mut s);
        s.u8(10).u8(10); // post two receives
        s.u8(11).u8(4).u8(0).u16(100).u32(0x1234).u64(0); // post a Read of 100 octets
                                                          // Stream: a Write, a Send in two FPDUs, a multi-FPDU Write (75 % 12 == 3, 0x40:
                                                          // Write), a changed Write.
        s.u8(0);
        write_template(&mut s, 0, true, 0, 120);
        s.u8(1);
        send_template(&mut s, false, 1, 0, 20);
        s.u8(2);
        send_template(&mut s, true, 1, 20, 20);
        s.u8(75).u16(3000).u16(1000).u8(9).u8(0).u8(2).u16(512);
        s.u8(132); // 132 % 12 == 0 with 0x80: the FPDU gets an octet changed
        write_template(&mut s, 0, true, 400, 60);
        s.u16(40).u8(0x10);
        // Out of order: FPDUs 3.. first, then everything in order, then a retransmission.
        s.u8(6).u8(1).u8(3).u8(2);
        s.u8(6).u8(1).u8(0).u8(0);
        s.u8(5).u8(1).u16(1500);
        s.u8(5).u8(1).u16(1500);
        s.u8(5).u8(1).u16(500);
        s.u8(8).u8(1).u16(0).u16(1000);
        s.u8(9).u16(300); // time passes
        write(t, name, &s);
    }
}

fn main() {
    mpa_startup();
    mpa_decoder();
    ddp_placement();
    rdmap_ulpdu();
    iwarp_conn();
}
