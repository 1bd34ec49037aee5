//! Writes the committed seed corpora (`seeds/<target>/`): a handful of valid frames, streams
//! and exchanges per target, in the input layout each target reads (`iwarp_fuzz::Input`).
//!
//! `cargo run --example seeds` (in `fuzz/`) rewrites them; keep them small.

use std::fs;
use std::path::Path;

use ift::wire::{IndicationRepr, Phase as IftPhase};
use ift::{FrameEncoder, FrameFormat};
use iwarp_fuzz::{tagged_header, untagged_header, Seed};
use mpa::wire::{EnhancedParams, FrameKind, MpaFrameRepr};
use mpa::FpduEncoder;

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

/// `iwarp_startup`'s peer Request or Reply: C, M, R, the RFC 6581 block (S) with IRD and
/// ORD picks (`depth`: 3 is 4, 5 is 16, 6 is 0x3FFF) and A with RTR kinds (bits Send 1,
/// Write 2, Read 4), the target's revision, private data of `2 * pd2` octets, no octet
/// changed, then the framing of what follows as the startup agrees (no flips).
struct PeerFrame {
    crc: bool,
    markers: bool,
    reject: bool,
    /// (IRD pick, ORD pick, A, RTR kinds).
    block: Option<(u8, u8, bool, u8)>,
    /// Rev 1 (else the target's).
    rev1: bool,
    pd2: u8,
}

impl PeerFrame {
    /// An accepting frame of the target's revision with C, M, the RFC 6581 block and `2 * pd2`
    /// octets of private data.
    fn new(crc: bool, markers: bool, block: Option<(u8, u8, bool, u8)>, pd2: u8) -> PeerFrame {
        PeerFrame {
            crc,
            markers,
            reject: false,
            block,
            rev1: false,
            pd2,
        }
    }

    fn write(&self, s: &mut Seed) {
        let mut f = 0u8;
        if self.markers {
            f |= 2;
        }
        if self.crc {
            f |= 4;
        }
        if self.reject {
            f |= 8;
        }
        if let Some((_, _, a, _)) = self.block {
            f |= 16;
            if a {
                f |= 32;
            }
        }
        if self.rev1 {
            f |= 1 << 6;
        }
        s.u8(f);
        if let Some((ird, ord, _, rtr)) = self.block {
            s.u8(ird).u8(ord).u8(rtr);
        }
        s.u8(self.pd2).u8(0x5a); // private data length / 2, fill
        s.u8(0); // no octet changed
        s.u8(0); // framing as agreed
    }
}

/// `iwarp_startup` knobs: k1 (side, IFT, Rev 1, C, M, peer-to-peer, transmit mode, digest),
/// k2 (IRD, ORD picks, RTR kinds, the last handshake ACK left out), k3 (reassembly room,
/// Responder not waiting, short deadlines, what the application does with a Request), k4
/// (the IFT config).
#[derive(Clone, Copy, Default)]
struct StartupKnobs {
    initiator: bool,
    ift: bool,
    rev1: bool,
    crc: bool,
    markers: bool,
    p2p: bool,
    source: bool,
    digest: bool,
    skip_last_ack: bool,
    /// 0: the input's steps answer a Request; 1: accept at once; 2: reject at once.
    on_request: u8,
    /// IFT: header CRC, payload CRC (both checked, speculative placement allowed).
    hc: bool,
    pc: bool,
}

impl StartupKnobs {
    fn write(&self, s: &mut Seed) {
        let bit = |b: bool, v: u8| if b { v } else { 0 };
        let k1 = bit(self.initiator, 1)
            | bit(self.ift, 2)
            | bit(self.rev1, 4)
            | bit(self.crc, 8)
            | bit(self.markers, 16)
            | bit(self.p2p, 32)
            | bit(self.source, 64)
            | bit(self.digest, 128);
        // IRD pick 5 (16), ORD pick 2 (2), every RTR kind.
        let k2 = 0x05 | bit(self.skip_last_ack, 128);
        // 16 KiB of reassembly room.
        let k3 = 1 | self.on_request << 6;
        let k4 = bit(self.hc, 2) | bit(self.pc, 4);
        s.u8(k1).u8(k2).u8(k3).u8(k4);
    }
}

/// The start of an MPA `iwarp_startup` seed: its knobs, then the peer's frame.
fn startup_seed(k: &StartupKnobs, frame: &PeerFrame) -> Seed {
    let mut s = Seed::new();
    k.write(&mut s);
    frame.write(&mut s);
    s
}

/// One in-order segment of `len` octets from the cursor (PSH).
fn in_order(s: &mut Seed, len: u16) {
    s.u8(6).u8(1).u16(len - 1);
}

/// A segment of whole FPDUs (or IFT frames), the `j`-th to the `j + k`-th (`k` at most 3);
/// `j` 255: the startup frame.
fn aligned(s: &mut Seed, j: u8, k: u8) {
    s.u8(7).u8(1).u8(j).u8(k);
}

/// Octets of the FPDUs of ULPDUs of these lengths from SeqStart on (RFC 5044 4: header, PAD,
/// CRC, Markers).
fn fpdus_len(markers: bool, ulpdus: &[usize]) -> usize {
    let mut enc = FpduEncoder::new(true, markers);
    let mut out = Vec::new();
    for &n in ulpdus {
        enc.encode(&vec![0; n], &mut out).expect("an FPDU");
    }
    out.len()
}

fn iwarp_startup() {
    let t = "iwarp_startup";
    let mpa_block = Some((3, 3, false, 0));
    // Responder: a Request cut across two segments, FPDUs pipelined behind it before the
    // accept (held), the accept, more FPDUs sent out of order and then in order.
    for (name, k, frame) in [
        (
            "responder_pipelined",
            StartupKnobs {
                crc: true,
                ..StartupKnobs::default()
            },
            PeerFrame::new(true, false, mpa_block, 3),
        ),
        (
            "responder_markers_source",
            StartupKnobs {
                markers: true,
                source: true,
                digest: true,
                ..StartupKnobs::default()
            },
            PeerFrame::new(false, true, mpa_block, 8),
        ),
        (
            "responder_rev1_auto_accept",
            StartupKnobs {
                rev1: true,
                crc: true,
                on_request: 1,
                skip_last_ack: true,
                ..StartupKnobs::default()
            },
            PeerFrame {
                rev1: true,
                ..PeerFrame::new(false, false, None, 0)
            },
        ),
        (
            "responder_p2p_rtr",
            StartupKnobs {
                crc: true,
                ..StartupKnobs::default()
            },
            PeerFrame::new(true, false, Some((3, 3, true, 7)), 2),
        ),
    ] {
        let mut s = startup_seed(&k, &frame);
        s.u8(14).u8(14); // post two receives
        let mut first = 0;
        if frame.block.is_some_and(|b| b.2) {
            s.u8(3).u8(1); // the RTR: a zero-length Write, as agreed
            first = 1;
        }
        s.u8(0);
        write_template(&mut s, 0, true, 16, 100);
        s.u8(1);
        send_template(&mut s, true, 1, 0, 30);
        in_order(&mut s, 20); // part of the Request
        aligned(&mut s, first + 1, 0); // the Send behind it, out of order, before the accept
        aligned(&mut s, 255, 0); // all of the Request
        aligned(&mut s, 0, first + 1); // the FPDUs behind it, before the accept
        if k.on_request == 0 {
            s.u8(11).u8(2); // accept with 6 octets of private data
        }
        s.u8(2);
        write_template(&mut s, 0, true, 300, 60);
        s.u8(0x44).u16(900).u16(300).u8(7).u8(0).u8(2).u16(0); // a Write in three FPDUs
        aligned(&mut s, first + 4, 1); // its last two first
        aligned(&mut s, first + 2, 1); // then the gap
        s.u8(10).u16(200); // time passes
        write(t, name, &s);
    }

    // Responder: 4 KiB behind the Request before the application answers (the startup
    // store's bound), then the accept.
    let k = StartupKnobs {
        crc: true,
        ..StartupKnobs::default()
    };
    let mut s = startup_seed(&k, &PeerFrame::new(true, false, mpa_block, 1));
    s.u8(4).u16(2000).u16(1000).u8(7).u8(0).u8(2).u16(0); // a Send in two FPDUs
    s.u8(4).u16(2000).u16(1000).u8(9).u8(0).u8(2).u16(0); // and another
    aligned(&mut s, 255, 0);
    aligned(&mut s, 0, 0);
    aligned(&mut s, 1, 0);
    aligned(&mut s, 2, 1);
    s.u8(10).u16(500);
    s.u8(11).u8(0);
    aligned(&mut s, 0, 3);
    write(t, "responder_floods_before_accept", &s);

    // Initiator: the Reply and FPDUs in one segment; a Reject; a Reply asking for more IRD
    // than the Initiator has (it sends a Terminate); a peer-to-peer Reply with Markers.
    for (name, k, frame) in [
        (
            "initiator_reply_and_fpdus",
            StartupKnobs {
                initiator: true,
                crc: true,
                ..StartupKnobs::default()
            },
            PeerFrame::new(true, false, mpa_block, 4),
        ),
        (
            "initiator_reject",
            StartupKnobs {
                initiator: true,
                crc: true,
                ..StartupKnobs::default()
            },
            PeerFrame {
                reject: true,
                ..PeerFrame::new(true, false, mpa_block, 5)
            },
        ),
        (
            "initiator_insufficient_ird",
            StartupKnobs {
                initiator: true,
                source: true,
                ..StartupKnobs::default()
            },
            // ORD pick 7 is 7 << 6 = 448, above our IRD 16.
            PeerFrame::new(true, true, Some((3, 7, false, 0)), 0),
        ),
        (
            "initiator_p2p_markers",
            StartupKnobs {
                initiator: true,
                crc: true,
                markers: true,
                p2p: true,
                ..StartupKnobs::default()
            },
            PeerFrame::new(false, true, Some((3, 3, true, 2)), 1),
        ),
    ] {
        let mut s = startup_seed(&k, &frame);
        s.u8(14).u8(30).u8(0).u16(64).u32(0x1234).u64(0); // a receive, a Read of 64 octets
        s.u8(0);
        write_template(&mut s, 0, true, 0, 80);
        s.u8(1);
        send_template(&mut s, true, 1, 0, 24);
        s.u8(2);
        write_template(&mut s, 0, true, 500, 64);
        s.u8(2);
        write_template(&mut s, 0, true, 300, 60);
        s.u8(0x44).u16(900).u16(300).u8(7).u8(0).u8(2).u16(0); // a Write in three FPDUs
                                                               // Part of the Reply; the second and third FPDUs out of order, held until the Reply is
                                                               // in; then the rest of the Reply and the first three FPDUs in one segment (the target
                                                               // sends M=1 with Markers).
        let reply = 20 + if frame.block.is_some() { 4 } else { 0 } + 2 * usize::from(frame.pd2);
        let len = reply + fpdus_len(k.markers, &[14 + 80, 18 + 24, 14 + 64]);
        in_order(&mut s, 10);
        aligned(&mut s, 1, 1);
        in_order(&mut s, len as u16 - 10);
        // In Full Operation: the last FPDUs out of order (placed early), then the gap.
        aligned(&mut s, 5, 1);
        aligned(&mut s, 3, 1);
        s.u8(9).u8(1).u16(0).u16(40); // the start again, cut differently
        s.u8(10).u16(300);
        write(t, name, &s);
    }

    // IFT: an indication cut across segments, a frame behind it in the same segment, more.
    for (name, initiator) in [("ift_responder", false), ("ift_initiator", true)] {
        let mut s = Seed::new();
        StartupKnobs {
            initiator,
            ift: true,
            hc: true,
            pc: true,
            on_request: 0,
            ..StartupKnobs::default()
        }
        .write(&mut s);
        // The indication: HC, PC, SP; VTag 0x4321; no octet changed; frames as agreed.
        s.u16(4 | 8 | 64).u16(0x4321).u8(0).u8(0);
        s.u8(14);
        s.u8(0);
        write_template(&mut s, 0, true, 8, 90);
        s.u8(1);
        send_template(&mut s, true, 1, 0, 20);
        s.u8(2);
        write_template(&mut s, 0, true, 200, 50);
        // Frames: IFT header, DDP header, header CRC, payload, payload CRC.
        let frame = |h: usize, n: usize| 6 + h + 4 + n + 4;
        in_order(&mut s, 30);
        in_order(&mut s, (64 - 30 + frame(14, 90)) as u16);
        if !initiator {
            s.u8(11).u8(0); // accept (IFT carries no private data)
        }
        in_order(&mut s, (frame(18, 20) + frame(14, 50)) as u16);
        write(t, name, &s);
    }
}

/// `ift_startup`: for each combination of the peer's HC, PC, IH, IP and SP, a valid
/// indication of the phase each side waits for (phase 0 to a Responder, phase 1 to an
/// Initiator), fed in three pieces, with a config whose CRC policy varies with the combination
/// (so that some are refused); the repair bit on, so that mutated flags and VTags keep a good
/// CRC. And two lone indications (mode 0): a valid one, one whose CRC the repair bit fixes.
fn ift_startup() {
    let t = "ift_startup";
    let indication = |phase: IftPhase, combo: u16| IndicationRepr {
        version: 1,
        bc_version: 1,
        phase,
        rdma: true,
        header_crc: combo & 1 != 0,
        payload_crc: combo & 2 != 0,
        ignores_header_crc: combo & 4 != 0,
        ignores_payload_crc: combo & 8 != 0,
        speculative: combo & 16 != 0,
        sends_markers: false,
        wants_markers: false,
        vtag: 0x1000 + combo,
        marker_interval: 0,
    };
    for (side, mode, phase) in [
        ("responder", 1u8, IftPhase::Zero),
        ("initiator", 2, IftPhase::One),
    ] {
        for combo in 0..32u16 {
            let mut s = Seed::new();
            s.u8(0x80 | mode);
            // Config: R, our HC and PC, checking; requirements from the combination; SP.
            let f = 2 | 4 | (combo & 3) << 4 | (combo & 16) << 2 | 128;
            s.u16(f).u16(0x2222).u16(10_000);
            let mut sizes = [0u8; 16];
            sizes[..3].copy_from_slice(&[20, 30, 14]);
            s.bytes(&sizes);
            s.bytes(&indication(phase, combo).to_bytes());
            s.bytes(&[0, 14, 0, 0, 0x22, 0x22, 0xC1, 0x40]); // a frame's first octets
            write(t, &format!("{side}_combo_{combo:02}"), &s);
        }
    }
    let valid = indication(IftPhase::One, 3 | 16).to_bytes();
    write(t, "indication", Seed::new().u8(0).bytes(&valid));
    let mut broken = valid;
    broken[60..].copy_from_slice(&[0; 4]);
    write(
        t,
        "indication_repaired",
        Seed::new().u8(0x80).bytes(&broken),
    );
}

/// `ift_decoder`: for each format (HC, PC, checked or not), a stream of four frames (a tagged
/// Write, a zero-length Send, an untagged and a one-octet tagged one) with the VTag of the
/// format, fed in pieces of various sizes; CRC repair on.
fn ift_decoder() {
    let t = "ift_decoder";
    let vtag = 0xBEEF;
    for f in 0..8u8 {
        let fmt = FrameFormat {
            header_crc: f & 1 != 0,
            payload_crc: f & 2 != 0,
            vtag,
            verify: f & 4 == 0,
        };
        let enc = FrameEncoder::new(fmt);
        let mut stream = Vec::new();
        let mut write_ulpdu = tagged_header(0xC1, 0x40, 0x100, 0x1000);
        write_ulpdu.extend((0..40u8).map(|i| i.wrapping_mul(3)));
        let mut untagged = untagged_header(0x41, 0x43, 0, 0, 2, 0);
        untagged.extend_from_slice(&[0x3c; 100]);
        let mut one = tagged_header(0xC1, 0x40, 0x100, 0x1100);
        one.push(0x99);
        for u in [
            write_ulpdu,
            untagged_header(0x41, 0x43, 0, 0, 1, 0),
            untagged,
            one,
        ] {
            enc.encode(&u, &mut stream).expect("a frame");
        }
        let mut s = Seed::new();
        s.u8(f | 8).u16(vtag);
        let sizes: [u8; 32] = std::array::from_fn(|i| [3, 10, 1, 50, 7, 0, 26, 12][i % 8]);
        s.bytes(&sizes);
        s.bytes(&stream);
        let name = format!(
            "frames{}{}{}",
            if fmt.header_crc { "_hc" } else { "" },
            if fmt.payload_crc { "_pc" } else { "" },
            if fmt.verify { "_checked" } else { "" }
        );
        write(t, &name, &s);
    }
}

fn main() {
    mpa_startup();
    mpa_decoder();
    ddp_placement();
    rdmap_ulpdu();
    iwarp_conn();
    iwarp_startup();
    ift_startup();
    ift_decoder();
}
