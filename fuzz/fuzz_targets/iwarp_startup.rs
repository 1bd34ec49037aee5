//! One `IwarpConn` through its startup phases with the input as the peer from the first octet
//! of MPA (RFC 5044 7.1, RFC 6581) or of IFT's adaption exchange
//! (draft-williams-iwarp-ift-01 section 4).
//!
//! The target (Initiator or Responder, from the input) is an `IwarpConn` over its own
//! `tcp_engine::Connection`, with an MPA config from the input (revision, CRC, Markers, IRD and
//! ORD, peer-to-peer and the RTR kinds it supports, whether a Responder waits for the first
//! FPDU, its private data limit and deadlines) or an IFT config (its CRCs and their checking,
//! the CRC policy, speculative placement). The TCP handshake is honest, run against a plain
//! `tcp_engine::Connection` (or, for a Responder, left one ACK short, so that the peer's first
//! data segment completes it). From then on the input speaks for the peer: it builds the
//! peer's Request (the target is the Responder) or Reply (the target is the Initiator) with
//! `mpa::wire::MpaFrameRepr` from input fields (Key of either kind, Rev, M, C, R, S, private
//! data length, the RFC 6581 block's IRD, ORD, A and RTR bits), or its indication with
//! `IndicationRepr` (phase, R, HC, PC, IH, IP, SP, SM, RM, version, VTag, a correct CRC), then
//! changes octets of it if asked (an indication's CRC repaired or not). After it come FPDUs
//! built with `FpduEncoder` (or IFT frames) from the `Templates` ULPDUs, the RTR of each kind,
//! multi-FPDU messages and raw octets, framed as the startup should have agreed or with CRC,
//! Markers, VTag flipped, and FPDUs with an octet changed after framing. That one stream is
//! cut into segments at input-chosen boundaries and sent in order, FPDU-aligned out of order,
//! at arbitrary offsets, or again, with flags, ACK and window of the input's choice; segments
//! reach the connection as `on_data`, or as the AF_XDP engine passes them (`SegmentDigest`).
//! The target's application accepts (with private data of any length), rejects, sets IRD and
//! ORD, posts receives, Reads, Writes and Sends, or closes, at input-chosen times, or answers
//! a Request at once; time moves on (startup, accept and RTR deadlines, TCP's timers); at the
//! end every deadline is run out.
//!
//! The target's memory is an `iwarp_fuzz::Arena` (guard octets around every region, a log of
//! every write). Asserts, after every step:
//! - nothing panics; no write leaves its region (guards unchanged, every logged write in
//!   bounds) and writes land only where allowed (remote-write regions, posted receives, Read
//!   sinks);
//! - nothing is written before Full Operation (before the application's accept on a Responder,
//!   before an accepting Reply or phase 1 on an Initiator), and nothing once the connection
//!   failed (a startup error, a Reject, a startup Terminate, an MPA or IFT error, a local or
//!   transport close) or the queue pair left RTS; what each write carries occurs in the
//!   peer's stream after its startup frame (as sent, or with Markers taken out);
//! - a stream that is clean up to the last octet passed up (a startup frame the target took
//!   at its built length, then only whole FPDUs or frames in the framing the target
//!   negotiated) never fails MPA or IFT framing or a CRC: so the target enters Full Operation
//!   at the right offset (`enter_full`'s `rx_start`, after the Reply or a pipelined Request)
//!   and processes what it held meanwhile from there;
//! - the events follow the peer's frame as an independent parse of it reads: a Request or
//!   indication as sent, an accepting Reply's private data, a Reject only for R=1, no
//!   Established after a failure, each at most once; an indication is taken exactly when
//!   section 4.2's rules (its CRC by an independent CRC32c, its phase, R, our CRC policy) say
//!   it must be, and what was agreed is what it says;
//! - before Full Operation a Responder holds at most the 2 KiB startup store (held octets and
//!   reassembly memory), an Initiator at most its reassembly capacity;
//! - every packet the target emits parses, a retransmission repeats the octets sent, the
//!   target's stream starts with its own Request, Reply (R=1 after a reject) or indication;
//!   a Responder sends nothing before the application answered, and nothing after its Reply
//!   before the peer's first valid FPDU when it waits for it (RFC 5044 7.1.2 rule 4); nothing
//!   follows the startup frame of a connection that never reached Full Operation, but for
//!   the Terminate of an Initiator refusing the Reply's IRD or RTR options (RFC 6581 9.1,
//!   9.2), which must be one FPDU with Layer LLP, EType MPA and that code;
//! - after `poll` no deadline of the connection lies in the past, and once every deadline has
//!   run out the connection is in Full Operation or has failed (a peer-to-peer Responder
//!   without its RTR has failed).
//!
//! Input: four knob octets (k1: side, IFT, Rev 1, C, M, peer-to-peer, transmit mode,
//! `on_data_with_crc`; k2: IRD and ORD picks, RTR kinds, the last handshake ACK left out; k3:
//! reassembly room, a Responder that does not wait for the first FPDU, short deadlines, a
//! 16-octet private data limit, what the application does with a Request; k4: the IFT config),
//! the peer's frame (MPA: flags, Rev, the RFC 6581 block, private data length and fill, octets
//! to change, framing flips; IFT: flags, versions, VTag, interval, octets to change, framing
//! flips), then steps, an op octet each (`op % 16`: 0-2 a template FPDU, 3 an RTR, 4 a
//! multi-FPDU message, 5 raw octets, 6-9 a segment, 10 time, 11 accept, 12 reject, 13 IRD and
//! ORD, 14 a post, 15 close). `examples/seeds.rs` writes seeds in this layout. With
//! `IWARP_STARTUP_TRACE` set, each run prints how far it got (events, writes, octets passed up
//! and sent, the connection's counters).
#![no_main]

use std::time::Duration;

use ift::wire::{IndicationRepr, Phase as IftPhase, INDICATION_LEN};
use ift::{CrcPolicy, FrameEncoder, FrameFormat, IftConfig, IftError};
use iwarp_conn::{ConnConfig, ConnEvent, IwarpConn};
use iwarp_fuzz::{
    check_writes, contains, ref_fpdu, run_due_timers, tagged_header, tcp_config, untagged_header,
    App, AppLayout, Endpoint, Input, PeerHeader, PeerSender, PeerStream, INITIATOR_TUPLE, PD,
    RESPONDER_TUPLE,
};
use libfuzzer_sys::fuzz_target;
use mpa::wire::{EnhancedParams, FrameKind, MpaFrameRepr, FRAME_HEADER_LEN};
use mpa::{FpduEncoder, MpaConfig, MpaError};
use rdmap::{Access, QpState};
use tcp_engine::{Connection, Instant, IsnGenerator, SegmentRepr, TakeBack};

/// The target's regions: remote write, remote read (never written), receives, Read sinks,
/// the source of its Sends and Writes (never written).
const W: usize = 0;
const R: usize = 1;
const RECV: usize = 2;
const SINK: usize = 3;
const SRC: usize = 4;
const REGIONS: usize = 5;
const BASES: [u64; REGIONS] = [0x1000, 0x2000, 0x3000, 0x5000, 0x8000];
const LENS: [usize; REGIONS] = [1024, 256, 512, 384, 512];
/// The regions the application posts into and sends from.
const APP: AppLayout = AppLayout {
    recv: RECV,
    sink: SINK,
    src: SRC,
    send_len: 600,
};
/// What a Responder may hold before Full Operation (`iwarp_conn`'s `STARTUP_STORE`: the
/// Initiator sends nothing but its Request before the Reply, RFC 5044 7.1.2).
const STARTUP_STORE: u64 = 2048;
/// The most reassembly memory that store may take: its ring and a few ranges.
const STARTUP_MEMORY: usize = 4096;
/// The peer's stream stops growing here: the startup is what this target is about.
const MAX_PLAN: usize = 24 << 10;
const TARGET_VTAG: u16 = 0x1234;

/// The target: its TCP and iWARP connections, memory and what it has told its application.
struct End {
    tcp: Connection,
    /// Its iWARP connection, memory, events and what TCP passed up to it.
    conn: Endpoint,
    /// What the application does when a Request (or indication) arrives: 0 nothing (the
    /// input's steps decide), 1 accept, 2 reject.
    on_request: u8,
    /// The application accepted (`accept` returned `Ok`).
    accepted: bool,
    /// The application rejected (`reject` returned `Ok`).
    rejected: bool,
    /// IFT framing (its accept carries no private data).
    ift: bool,
}

impl End {
    /// The connection's turn: TCP events, deadlines, queued frames, the application's
    /// answer to a Request if it answers at once.
    fn pump(&mut self, now: Instant) {
        self.conn.iw.take_tcp_events(&mut self.tcp);
        self.conn.iw.poll(&mut self.tcp, &self.conn.mem, now);
        while let Some(ev) = self.conn.iw.poll_event() {
            let request = matches!(ev, ConnEvent::Request(_) | ConnEvent::IftRequest(_));
            self.conn.events.push(ev);
            if request && self.on_request == 1 {
                self.accept(if self.ift { b"" } else { b"auto" });
            } else if request && self.on_request == 2 {
                self.reject(b"no");
            }
        }
        self.conn.iw.poll(&mut self.tcp, &self.conn.mem, now);
        while let Some(ev) = self.conn.iw.poll_event() {
            self.conn.events.push(ev);
        }
        while self.conn.iw.qp_mut().poll_completion().is_some() {}
        if let Some(at) = self.conn.iw.poll_timeout() {
            assert!(
                at > now,
                "a deadline in the past after poll: {at:?} at {now:?}"
            );
        }
    }

    fn accept(&mut self, pd: &[u8]) {
        if self.conn.iw.accept(pd).is_ok() {
            self.accepted = true;
        }
    }

    fn reject(&mut self, pd: &[u8]) {
        if self.conn.iw.reject(pd).is_ok() {
            self.rejected = true;
        }
    }

    /// Hands one segment to the target.
    fn segment(&mut self, now: Instant, seg: &SegmentRepr<'_>) {
        self.conn.segment(&mut self.tcp, now, seg);
    }
}

/// How the peer frames what follows its startup frame.
enum Framing {
    /// FPDUs: the encoder at the end of the plan, and its CRC and Markers.
    Mpa {
        enc: FpduEncoder,
        crc: bool,
        markers: bool,
    },
    /// IFT frames of this format.
    Ift(FrameFormat),
}

/// The peer's stream as the input builds it; index 0 is TCP stream offset 0.
struct Plan {
    bytes: Vec<u8>,
    /// Where the peer's SeqStart is: the end of its startup frame as built.
    seq_start: usize,
    /// The startup frame's length as its own fields say (differs from `seq_start` when its
    /// PD_Length was changed).
    frame_len_read: usize,
    framing: Framing,
    /// (start, end) of every FPDU or frame built: where FPDU-aligned segments start and end.
    framed: Vec<(usize, usize)>,
    /// The stream is clean (the frame, then whole FPDUs as framed) below this offset.
    clean_end: usize,
    /// Offsets below this have been sent: the plan only grows after it.
    sent_end: usize,
}

impl Plan {
    fn dirty(&mut self) {
        self.clean_end = self.clean_end.min(self.bytes.len());
    }

    /// The MPA position (from SeqStart) of the plan's end.
    fn position(&self) -> u32 {
        (self.bytes.len() - self.seq_start) as u32
    }

    /// Makes the plan cover offsets below `end` (zeros) before they are sent.
    fn cover(&mut self, end: usize) {
        if end > self.bytes.len() {
            let n = end - self.bytes.len();
            self.raw(&vec![0; n]);
        }
        self.sent_end = self.sent_end.max(end);
    }

    /// Whether `data` is DDP payload the peer's stream carries after its startup frame, as
    /// sent or with Markers taken out (a Marker every 512 octets from SeqStart).
    fn carries(&self, data: &[u8]) -> bool {
        let after = &self.bytes[self.seq_start.min(self.bytes.len())..];
        if contains(after, data) {
            return true;
        }
        let stripped: Vec<u8> = after
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 512 >= 4)
            .map(|(_, &b)| b)
            .collect();
        contains(&stripped, data)
    }
}

impl PeerStream for Plan {
    /// Appends one FPDU or frame carrying `ulpdu`; `change` flips an octet after framing.
    fn fpdu(&mut self, ulpdu: &[u8], change: Option<(u16, u8)>) {
        if self.bytes.len() > MAX_PLAN {
            return;
        }
        let start = self.bytes.len();
        let encoded = match &mut self.framing {
            Framing::Mpa { enc, .. } => enc.encode(ulpdu, &mut self.bytes).is_ok(),
            Framing::Ift(fmt) => FrameEncoder::new(*fmt)
                .encode(ulpdu, &mut self.bytes)
                .is_ok(),
        };
        if !encoded {
            self.bytes.truncate(start);
            return;
        }
        let end = self.bytes.len();
        self.framed.push((start, end));
        if let Some((at, x)) = change {
            self.clean_end = self.clean_end.min(start);
            let i = start + usize::from(at) % (end - start);
            self.bytes[i] ^= x | 1;
        }
    }

    fn raw(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.dirty();
        self.bytes.extend_from_slice(bytes);
        let position = self.position();
        if let Framing::Mpa { enc, crc, markers } = &mut self.framing {
            *enc = FpduEncoder::with_position(*crc, *markers, position);
        }
    }

    fn markers(&self) -> bool {
        matches!(self.framing, Framing::Mpa { markers: true, .. })
    }

    fn octets(&self) -> usize {
        self.bytes.len()
    }
}

/// An IRD or ORD for an RFC 6581 block: small, 0x3FFF ("do not negotiate") or any 14 bits.
fn depth(d: u8) -> u16 {
    match d % 8 {
        0 => 0,
        1 => 1,
        2 => 2,
        3 => 4,
        4 => 8,
        5 => 16,
        6 => 0x3FFF,
        _ => u16::from(d) << 6 & 0x3FFF,
    }
}

/// Private data of `n` octets from a seed octet.
fn private_data(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| seed ^ (i as u8).wrapping_mul(31)).collect()
}

/// Up to three octets of `frame` changed, at input-chosen places.
fn mangle(input: &mut Input, frame: &mut [u8]) -> bool {
    let n = input.u8() % 4;
    for _ in 0..n {
        let at = usize::from(input.u16()) % frame.len();
        frame[at] ^= input.u8() | 1;
    }
    n > 0
}

/// The peer's MPA Request or Reply from input fields (RFC 5044 7.1.1, RFC 6581 9).
fn peer_mpa_frame(input: &mut Input, kind: FrameKind, target_rev: u8) -> Vec<u8> {
    let f = input.u8();
    let kind = match (f & 1 != 0, kind) {
        (false, k) => k,
        (true, FrameKind::Request) => FrameKind::Reply,
        (true, FrameKind::Reply) => FrameKind::Request,
    };
    let rev = match f >> 6 {
        0 => target_rev,
        1 => 1,
        2 => 2,
        _ => input.u8() % 4,
    };
    let enhanced = (f & 16 != 0).then(|| {
        let (ird, ord, rtr) = (input.u8(), input.u8(), input.u8());
        EnhancedParams {
            ird: depth(ird),
            ord: depth(ord),
            peer_to_peer: f & 32 != 0,
            rtr_send: rtr & 1 != 0,
            rtr_write: rtr & 2 != 0,
            rtr_read: rtr & 4 != 0,
        }
    });
    let block = if enhanced.is_some() { 4 } else { 0 };
    let n = (usize::from(input.u8()) * 2).min(512 - block);
    let pd = private_data(n, input.u8());
    let repr = MpaFrameRepr {
        kind,
        markers: f & 2 != 0,
        crc: f & 4 != 0,
        reject: f & 8 != 0,
        rev,
        enhanced,
        private_data: &pd,
    };
    let mut frame = repr.to_vec().expect("at most 512 octets of private data");
    mangle(input, &mut frame);
    frame
}

/// The peer's adaption indication from input fields (section 4.2), its CRC correct (or, when
/// octets were changed after it was computed and the input asks, left as it was).
fn peer_indication(input: &mut Input, phase: IftPhase, rdma: bool) -> ([u8; 64], IndicationRepr) {
    let f = input.u16();
    let other = match phase {
        IftPhase::Zero => IftPhase::One,
        IftPhase::One => IftPhase::Zero,
    };
    let version = if f & 0x400 != 0 { input.u16() } else { 1 };
    let bc_version = if f & 0x800 != 0 { input.u16() } else { 1 };
    let repr = IndicationRepr {
        version,
        bc_version,
        phase: if f & 1 != 0 { other } else { phase },
        rdma: rdma ^ (f & 2 != 0),
        header_crc: f & 4 != 0,
        payload_crc: f & 8 != 0,
        ignores_header_crc: f & 16 != 0,
        ignores_payload_crc: f & 32 != 0,
        speculative: f & 64 != 0,
        sends_markers: f & 128 != 0,
        wants_markers: f & 256 != 0,
        vtag: input.u16(),
        marker_interval: if f & 512 != 0 { input.u16() } else { 0 },
    };
    let mut b = repr.to_bytes();
    if mangle(input, &mut b) && f & 0x8000 == 0 {
        // Repaired: the changed indication passes its CRC and reaches the policy.
        let crc = iwarp_fuzz::crc32c(&b[..60]);
        b[60..].copy_from_slice(&crc.to_le_bytes());
    }
    (b, repr)
}

/// The RTR (RFC 6581 9.2) as an Initiator's queue pair sends it, or one field off.
fn rtr_ulpdu(input: &mut Input) -> Vec<u8> {
    let k = input.u8();
    let mut u = match k % 3 {
        // A zero-length Send: QN 0, MSN 1.
        0 => untagged_header(0x41, 0x43, 0, 0, 1, 0),
        // A zero-length RDMA Write to STag 1 (RTR_WRITE_STAG), TO 0.
        1 => tagged_header(0xC1, 0x40, 1, 0),
        // A zero-length Read Request: QN 1, MSN 1, an all-zero Read Request header.
        _ => {
            let mut u = untagged_header(0x41, 0x41, 0, 1, 1, 0);
            u.extend_from_slice(&[0; 28]);
            u
        }
    };
    if k & 0x80 != 0 {
        let at = usize::from(input.u8()) % u.len();
        u[at] ^= input.u8() | 1;
    }
    u
}

/// What the target sent: its stream, octet by octet, as the packets it emitted carry it.
#[derive(Default)]
struct Sent {
    bytes: Vec<u8>,
    known: Vec<bool>,
}

impl Sent {
    fn record(&mut self, off: u64, payload: &[u8]) {
        let Ok(off) = usize::try_from(off) else {
            return;
        };
        if off > 1 << 22 {
            panic!("a segment at stream offset {off}: far beyond anything queued");
        }
        let end = off + payload.len();
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
            self.known.resize(end, false);
        }
        for (i, &b) in payload.iter().enumerate() {
            if self.known[off + i] {
                assert_eq!(
                    self.bytes[off + i],
                    b,
                    "octet {} sent again differs",
                    off + i
                );
            }
            self.bytes[off + i] = b;
            self.known[off + i] = true;
        }
    }

    /// The octets known contiguously from offset 0.
    fn prefix(&self) -> &[u8] {
        let n = self
            .known
            .iter()
            .position(|k| !k)
            .unwrap_or(self.known.len());
        &self.bytes[..n]
    }
}

struct Run {
    end: End,
    initiator: bool,
    ift: bool,
    /// Our own startup frame's length (the Request or indication an Initiator sends; a
    /// Responder's Reply is parsed from what it sent).
    own_frame: Option<usize>,
    mpa_cfg: MpaConfig,
    ift_cfg: IftConfig,
    capacity: u64,
    app: App,
    sent: Sent,
    /// A failure event was seen (nothing may be written after it).
    failed: bool,
    /// Events already checked.
    events_checked: usize,
    established: bool,
    /// A startup failure that sends a Terminate (an Initiator refusing IRD or RTR options).
    startup_terminate: Option<MpaError>,
    /// The framing that Terminate goes out in: CRC (either side's C), Markers (the Reply's M).
    terminate_framing: Option<(bool, bool)>,
    /// The input sent segments with flags, ACK or window of its own (a reset, say), or the
    /// application closed: either may stop what the target would send.
    odd_tcp: bool,
}

impl Run {
    /// The peer's startup frame as the target reads it, independently of the target.
    fn peer_frame<'p>(&self, plan: &'p Plan) -> Option<MpaFrameRepr<'p>> {
        MpaFrameRepr::parse_bytes(&plan.bytes[..plan.frame_len_read.min(plan.bytes.len())]).ok()
    }

    /// The checks after a step; `frozen_before`: the connection had failed or left RTS
    /// before it (or not reached Full Operation), so nothing may be written unless the step
    /// itself brought it into Full Operation.
    fn check(&mut self, from: usize, frozen_before: bool, plan: &Plan) {
        let end = &self.end;
        end.conn.arena.check();

        // Events: each follows the peer's frame.
        let new = end.conn.events[self.events_checked..].to_vec();
        self.events_checked = end.conn.events.len();
        for ev in &new {
            match ev {
                ConnEvent::Request(info) => {
                    assert!(!self.initiator && !self.ift, "a Request on {ev:?}");
                    assert!(!self.failed, "a Request after a failure");
                    let f = self
                        .peer_frame(plan)
                        .expect("a Request that does not parse");
                    assert_eq!(f.kind, FrameKind::Request);
                    assert_eq!(
                        (info.rev, info.markers, info.crc, info.enhanced),
                        (f.rev, f.markers, f.crc, f.enhanced),
                        "the Request reported is not the one sent"
                    );
                    assert_eq!(info.private_data, f.private_data);
                }
                ConnEvent::IftRequest(n) => {
                    assert!(!self.initiator && self.ift);
                    assert!(self.ift_acceptable(plan), "took an unacceptable indication");
                    let peer = IndicationRepr::parse_bytes(&plan.bytes[..INDICATION_LEN])
                        .expect("64 octets")
                        .expect("an indication that does not parse was taken");
                    assert_eq!(peer.phase, IftPhase::Zero);
                    assert_eq!((n.tx.vtag, n.rx.vtag), (peer.vtag, TARGET_VTAG));
                    assert_eq!(
                        (n.rx.header_crc, n.rx.payload_crc),
                        (peer.header_crc, peer.payload_crc)
                    );
                }
                ConnEvent::Established { private_data } => {
                    assert!(!self.established, "established twice");
                    assert!(
                        !self.failed,
                        "established after a failure: {:?}",
                        end.conn.events
                    );
                    self.established = true;
                    if !self.initiator {
                        assert!(end.accepted, "established without the application's accept");
                    } else if !self.ift {
                        let f = self.peer_frame(plan).expect("a Reply that does not parse");
                        assert!(f.kind == FrameKind::Reply && !f.reject);
                        assert!(f.rev >= 1 && f.rev <= self.mpa_cfg.rev);
                        assert_eq!(private_data[..], f.private_data[..]);
                    } else {
                        assert!(self.ift_acceptable(plan), "took an unacceptable indication");
                        let peer = IndicationRepr::parse_bytes(&plan.bytes[..INDICATION_LEN])
                            .expect("64 octets")
                            .expect("an indication that does not parse was taken");
                        let n = end.conn.iw.ift_negotiated().expect("IFT Full Operation");
                        assert_eq!((n.tx.vtag, n.rx.vtag), (peer.vtag, TARGET_VTAG));
                        assert_eq!(
                            (n.rx.header_crc, n.rx.payload_crc),
                            (peer.header_crc, peer.payload_crc)
                        );
                    }
                }
                ConnEvent::Rejected { private_data, .. } => {
                    assert!(self.initiator && !self.established);
                    let f = self.peer_frame(plan).expect("a Reply that does not parse");
                    assert!(f.kind == FrameKind::Reply && f.reject, "Rejected on R=0");
                    assert_eq!(private_data[..], f.private_data[..]);
                    self.failed = true;
                }
                ConnEvent::StartupFailed(e) => {
                    assert!(!self.established, "a startup failure in Full Operation");
                    if matches!(
                        e,
                        MpaError::InsufficientIrd { .. } | MpaError::NoMatchingRtr
                    ) {
                        assert!(self.initiator);
                        let f = self
                            .peer_frame(plan)
                            .expect("a refused Reply that does not parse");
                        self.terminate_framing = Some((self.mpa_cfg.crc || f.crc, f.markers));
                        self.startup_terminate = Some(e.clone());
                    }
                    self.failed = true;
                }
                ConnEvent::IftStartupFailed(e) => {
                    assert!(!self.established);
                    if matches!(
                        e,
                        IftError::BadMagic { .. }
                            | IftError::ModeMismatch { .. }
                            | IftError::Unacceptable(_)
                            | IftError::WrongPhase { .. }
                            | IftError::IndicationCrc { .. }
                            | IftError::IncompatibleVersion { .. }
                    ) {
                        assert!(
                            !self.ift_acceptable(plan),
                            "refused an acceptable indication: {e:?}"
                        );
                    }
                    self.failed = true;
                }
                ConnEvent::MpaFailed(e) => {
                    self.failed = true;
                    self.check_clean_failure(plan, &format!("{e:?}"), *e == MpaError::RtrTimeout);
                }
                ConnEvent::IftFailed(e) => {
                    self.failed = true;
                    self.check_clean_failure(plan, &format!("{e:?}"), false);
                }
                ConnEvent::ClosedLocally(_)
                | ConnEvent::TransportClosed(_)
                | ConnEvent::ConnectionRefused
                | ConnEvent::TransmitSourceFailed(_) => self.failed = true,
            }
        }
        let end = &self.end;
        // The application's reject ends the connection (no event says so).
        self.failed |= end.rejected;
        // Writes: only in Full Operation, never after a failure, only payload of the stream.
        let frozen = frozen_before || !self.established || (!self.initiator && !end.accepted);
        let frozen = frozen.then_some("before Full Operation or after a failure");
        check_writes(&end.conn.arena, &self.app.allowed, from, frozen, |w| {
            assert!(
                w.data.is_empty() || plan.carries(&w.data),
                "wrote octets the peer's stream does not carry after its startup frame: {w:?}"
            );
        });
        assert_eq!(
            self.established,
            end.conn.iw.is_established(),
            "Established reported and the connection's phase disagree"
        );

        // What is held before Full Operation stays bounded.
        let held = end.conn.iw.counters().held_bytes;
        if !self.established && !self.initiator {
            assert!(
                held <= STARTUP_STORE,
                "a Responder holds {held} before Full"
            );
            let mem = end.conn.iw.reassembly_memory();
            assert!(
                mem <= STARTUP_MEMORY,
                "a Responder's reassembly memory is {mem} before Full"
            );
            let full = end.conn.iw.full_buffer_octets();
            assert!(
                full <= STARTUP_MEMORY + 1024,
                "{full} octets of Full buffers before Full"
            );
        }
        assert!(held <= self.capacity, "holds {held} of {}", self.capacity);

        self.check_sent();
    }

    /// Whether the peer's indication (the first 64 octets of its stream, as an independent
    /// CRC32c and parse read them) is one the target must take (section 4.2): it parses (magic,
    /// CRC, BC version), is of the other side's phase, R agrees, our policy holds.
    fn ift_acceptable(&self, plan: &Plan) -> bool {
        let b = &plan.bytes[..INDICATION_LEN];
        if iwarp_fuzz::crc32c(&b[..60]).to_le_bytes() != b[60..64] {
            return false;
        }
        let Some(Ok(peer)) = IndicationRepr::parse_bytes(b) else {
            return false;
        };
        let phase = if self.initiator {
            IftPhase::One
        } else {
            IftPhase::Zero
        };
        iwarp_fuzz::ift_acceptable(&self.ift_cfg, &peer, phase)
    }

    /// An MPA or IFT framing failure: the stream passed up must not have been clean.
    fn check_clean_failure(&self, plan: &Plan, what: &str, deadline: bool) {
        if deadline {
            return;
        }
        let framing_agreed = match (&plan.framing, self.end.conn.iw.negotiated()) {
            (Framing::Mpa { crc, markers, .. }, Some(n)) => {
                n.crc == *crc && n.markers_rx == *markers
            }
            (Framing::Ift(fmt), None) => self.end.conn.iw.ift_negotiated().is_some_and(|n| {
                (n.rx.header_crc, n.rx.payload_crc, n.rx.vtag)
                    == (fmt.header_crc, fmt.payload_crc, fmt.vtag)
            }),
            _ => false,
        };
        let clean = framing_agreed
            && plan.frame_len_read == plan.seq_start
            && self.end.conn.delivered.end <= plan.clean_end as u64;
        assert!(
            !clean,
            "{what} on a clean stream (the frame, then whole FPDUs as negotiated, up to {})",
            self.end.conn.delivered.end
        );
    }

    /// The target's own stream so far.
    fn check_sent(&self) {
        let s = self.sent.prefix();
        let all = self.sent.bytes.len();
        if !self.initiator && !self.end.accepted && !self.end.rejected {
            assert_eq!(all, 0, "a Responder sent before its application answered");
            return;
        }
        let own = if self.ift {
            if s.len() < INDICATION_LEN {
                return;
            }
            let ind = IndicationRepr::parse_bytes(s)
                .expect("64 octets")
                .expect("our indication does not parse");
            let phase = if self.initiator {
                IftPhase::Zero
            } else {
                IftPhase::One
            };
            assert_eq!(ind.phase, phase);
            assert_eq!(ind.vtag, TARGET_VTAG);
            INDICATION_LEN
        } else {
            if s.len() < FRAME_HEADER_LEN {
                return;
            }
            let len = FRAME_HEADER_LEN + usize::from(u16::from_be_bytes([s[18], s[19]]));
            if s.len() < len {
                return;
            }
            let f = MpaFrameRepr::parse_bytes(&s[..len]).expect("our frame does not parse");
            let kind = if self.initiator {
                FrameKind::Request
            } else {
                FrameKind::Reply
            };
            assert_eq!(f.kind, kind);
            if !self.initiator {
                assert_eq!(f.reject, self.end.rejected, "the Reply's R bit");
            }
            len
        };
        if let Some(n) = self.own_frame {
            assert_eq!(own, n, "our startup frame changed length");
        }
        if all <= own {
            return;
        }
        // Octets after our startup frame.
        if let Some(e) = &self.startup_terminate {
            self.check_startup_terminate(own, e);
            return;
        }
        assert!(
            self.established,
            "sent {} octets after the startup frame without reaching Full Operation",
            all - own
        );
        if let Some(n) = self.end.conn.iw.negotiated() {
            if !self.initiator && n.responder_waits_for_fpdu {
                assert!(
                    self.end.conn.iw.counters().fpdus_rx > 0,
                    "a Responder sent after its Reply before the peer's first FPDU"
                );
            }
        }
    }

    /// What an Initiator sends after its Request when it refuses the Reply's IRD or RTR
    /// options: one FPDU in the Reply's framing, a Terminate of Layer LLP, EType MPA, `e`'s
    /// code (RFC 6581 9.1, 9.2).
    fn check_startup_terminate(&self, own: usize, e: &MpaError) {
        let s = &self.sent.bytes;
        let (crc, markers) = self.terminate_framing.expect("the Reply parsed");
        let octet = |p: u64| {
            let i = own + p as usize;
            self.sent
                .known
                .get(i)
                .copied()
                .unwrap_or(false)
                .then(|| s[i])
        };
        let header = if markers { 4 } else { 0 };
        let Some(f) = ref_fpdu(octet, header, markers, 0) else {
            return;
        };
        assert!(
            f.exact_ok(crc, markers),
            "the startup Terminate's CRC or Markers"
        );
        assert!(
            own as u64 + f.end >= s.len() as u64,
            "more than one FPDU after a refused Reply"
        );
        let u = &f.ulpdu;
        assert!(u.len() >= 22 && u[1] & 0x0F == 7, "not a Terminate: {u:?}");
        let t = rdmap::TerminateHeader::parse(&u[18..]).expect("a Terminate header");
        assert_eq!((t.layer, t.etype, t.code), (2, 0, e.code()));
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let k1 = input.u8();
    let k2 = input.u8();
    let k3 = input.u8();
    let k4 = input.u8();
    let initiator = k1 & 1 != 0;
    let ift_mode = k1 & 2 != 0;
    let rtr_bits = (k2 >> 4) & 7;
    let mpa_cfg = MpaConfig {
        rev: if k1 & 4 != 0 { 1 } else { 2 },
        crc: k1 & 8 != 0,
        markers: k1 & 16 != 0,
        ird: depth(k2 & 7),
        ord: depth(k2 >> 1 & 7),
        peer_to_peer: k1 & 32 != 0 && k1 & 4 == 0,
        rtr_send: rtr_bits == 0 || rtr_bits & 1 != 0,
        rtr_write: rtr_bits == 0 || rtr_bits & 2 != 0,
        rtr_read: rtr_bits == 0 || rtr_bits & 4 != 0,
        max_private_data: if k3 & 0x20 != 0 { 16 } else { 512 },
        timeout: Duration::from_secs(if k3 & 8 != 0 { 1 } else { 10 }),
        accept_timeout: Duration::from_secs(if k3 & 16 != 0 { 2 } else { 10 }),
        responder_waits_for_fpdu: k3 & 4 == 0,
    };
    let ift_cfg = IftConfig {
        rdma: k4 & 1 == 0,
        header_crc: k4 & 2 != 0,
        payload_crc: k4 & 4 != 0,
        check_crcs: k4 & 8 == 0,
        accept: CrcPolicy {
            require_header_crc: k4 & 16 != 0,
            require_payload_crc: k4 & 32 != 0,
            require_checked: k4 & 64 != 0,
        },
        allow_speculative: k4 & 128 == 0,
        vtag: TARGET_VTAG,
        timeout: Duration::from_secs(if k3 & 8 != 0 { 1 } else { 10 }),
    };
    let capacity = [4096, 16384, 65536, 1 << 20][usize::from(k3 & 3)];
    let mut conn_cfg = ConnConfig {
        mpa: mpa_cfg.clone(),
        ift: ift_mode.then(|| ift_cfg.clone()),
        reassembly_capacity: capacity,
        max_placed_fpdus: 64,
        max_tx_fpdus: 64,
        ..ConnConfig::default()
    };
    conn_cfg.qp.pd = PD;
    conn_cfg.qp.ird = 4;
    conn_cfg.qp.ord = 4;
    let source = k1 & 64 != 0;
    let digest = k1 & 128 != 0;
    let skip_last_ack = k2 & 128 != 0 && !initiator;
    let on_request = k3 >> 6;
    let tcp_cfg = tcp_config(source);

    let epoch = std::time::Instant::now();
    let mut now = Instant::ZERO + Duration::from_millis(1);
    let isn_t = IsnGenerator::new([3; 16]);
    let isn_p = IsnGenerator::new([9; 16]);
    let own_pd: &[u8] = if ift_mode { b"" } else { b"init" };
    let iw = if initiator {
        IwarpConn::initiator(conn_cfg, own_pd, epoch, now)
    } else {
        IwarpConn::responder(conn_cfg, epoch, now)
    };
    let Ok(iw) = iw else {
        return;
    };
    let own_frame = initiator.then(|| {
        if ift_mode {
            INDICATION_LEN
        } else {
            FRAME_HEADER_LEN + own_pd.len() + if mpa_cfg.rev >= 2 { 4 } else { 0 }
        }
    });

    // The TCP handshake, honest: the target against a plain connection.
    let mut buf = vec![0u8; 9100];
    let (tcp, mut peer) = if initiator {
        let mut tcp = Connection::connect(tcp_cfg.clone(), INITIATOR_TUPLE, &isn_t, now);
        let n = tcp.poll_transmit(now, &mut buf).expect("a SYN");
        let syn = SegmentRepr::parse(&buf[..n]).expect("our SYN parses");
        let peer = Connection::accept(tcp_cfg.clone(), &syn, &isn_p, now).expect("accepted");
        (tcp, peer)
    } else {
        let mut peer = Connection::connect(tcp_cfg.clone(), RESPONDER_TUPLE, &isn_p, now);
        let n = peer.poll_transmit(now, &mut buf).expect("a SYN");
        let syn = SegmentRepr::parse(&buf[..n]).expect("a SYN parses");
        let tcp = Connection::accept(tcp_cfg.clone(), &syn, &isn_t, now).expect("accepted");
        (tcp, peer)
    };
    let mut end = End {
        tcp,
        conn: Endpoint::new(iw, digest),
        on_request,
        accepted: false,
        rejected: false,
        ift: ift_mode,
    };
    let access = [
        Access::REMOTE_WRITE | Access::LOCAL_WRITE,
        Access::REMOTE_READ,
        Access::LOCAL_WRITE,
        Access::LOCAL_WRITE,
        Access::REMOTE_READ,
    ];
    let stags = end.conn.register(&BASES, &LENS, &access, |_| PD);
    end.conn.arena.record_data(true);
    let mut run = Run {
        end,
        initiator,
        ift: ift_mode,
        own_frame,
        mpa_cfg: mpa_cfg.clone(),
        ift_cfg: ift_cfg.clone(),
        capacity: capacity as u64,
        app: App::new(stags, &BASES, &LENS, APP),
        sent: Sent::default(),
        failed: false,
        events_checked: 0,
        established: false,
        startup_terminate: None,
        terminate_framing: None,
        odd_tcp: false,
    };
    run.app.allowed[W].push(0..LENS[W]);
    // R and SRC are never written: no ranges. RECV and SINK get theirs as receives and Reads
    // are posted.
    let _ = R;
    // Handshake packets, the target's first: SYN-ACK or ACK (with its Request, maybe).
    for _ in 0..8 {
        run.end.pump(now);
        let out = transmit(&mut run, now);
        let mut answer = Vec::new();
        for p in &out {
            let Ok(seg) = SegmentRepr::parse(p) else {
                continue;
            };
            if seg.payload.is_empty() || seg.flags.syn {
                peer.handle_segment(now, &seg, |_| None::<TakeBack>);
            }
        }
        while let Some(n) = peer.poll_transmit(now, &mut buf) {
            answer.push(buf[..n].to_vec());
        }
        let done = run.end.tcp.state() == tcp_engine::State::Established;
        if done || skip_last_ack {
            break;
        }
        for p in &answer {
            let seg = SegmentRepr::parse(p).expect("the peer's packet parses");
            if seg.payload.is_empty() {
                run.end.segment(now, &seg);
            }
        }
        now += Duration::from_micros(100);
    }
    run.check(0, true, &empty_plan());

    // The peer's startup frame.
    let (frame, framing) = if ift_mode {
        let phase = if initiator {
            IftPhase::One
        } else {
            IftPhase::Zero
        };
        let (b, repr) = peer_indication(&mut input, phase, ift_cfg.rdma);
        let p = input.u8();
        let fmt = FrameFormat {
            header_crc: repr.header_crc ^ (p & 1 != 0),
            payload_crc: repr.payload_crc ^ (p & 2 != 0),
            vtag: if p & 4 != 0 { input.u16() } else { TARGET_VTAG },
            verify: false,
        };
        (b.to_vec(), Framing::Ift(fmt))
    } else {
        let kind = if initiator {
            FrameKind::Reply
        } else {
            FrameKind::Request
        };
        let frame = peer_mpa_frame(&mut input, kind, mpa_cfg.rev);
        let peer_c = frame.get(16).is_some_and(|f| f & 0x40 != 0);
        let p = input.u8();
        let crc = (mpa_cfg.crc || peer_c) ^ (p & 1 != 0);
        let markers = mpa_cfg.markers ^ (p & 2 != 0);
        let enc = FpduEncoder::new(crc, markers);
        (frame, Framing::Mpa { enc, crc, markers })
    };
    let frame_len_read = if ift_mode {
        INDICATION_LEN
    } else {
        FRAME_HEADER_LEN + usize::from(u16::from_be_bytes([frame[18], frame[19]]))
    };
    let mut plan = Plan {
        seq_start: frame.len(),
        frame_len_read,
        bytes: frame,
        framing,
        framed: Vec::new(),
        clean_end: usize::MAX,
        sent_end: 0,
    };
    let mut sender = PeerSender::new(run.app.templates(), 3000, MAX_PLAN);
    let stream_start = run.end.tcp.rcv_stream_start();
    let t = run.end.tcp.four_tuple();
    let mut cursor = 0usize;

    for _ in 0..128 {
        if input.is_empty() {
            break;
        }
        let from = run.end.conn.arena.write_count();
        let frozen_before =
            run.failed || (run.established && run.end.conn.iw.qp().state() != QpState::Rts);
        let op = input.u8();
        match op % 16 {
            // The peer's stream grows.
            0..=2 => sender.template(&mut input, op, &mut plan),
            3 => {
                let u = rtr_ulpdu(&mut input);
                plan.fpdu(&u, None);
            }
            // A multi-FPDU Write or Send, each FPDU within the MULPDU chosen here.
            4 => sender.message(&mut input, op, &mut plan),
            5 => sender.raw(&mut input, &mut plan),
            // Segments of the stream.
            6..=9 => {
                let mode = input.u8();
                let (off, len): (usize, usize) = match op % 16 {
                    6 => {
                        // In order from the cursor, cut where the input says.
                        let len = 1 + usize::from(input.u16() % 1500);
                        let off = cursor;
                        cursor += len;
                        (off, len)
                    }
                    7 => {
                        // FPDU-aligned: whole FPDUs from the j-th on, or the startup frame.
                        let j = usize::from(input.u8());
                        let k = usize::from(input.u8() % 4);
                        if plan.framed.is_empty() || j == 255 {
                            (0, plan.seq_start + k)
                        } else {
                            let j = j % plan.framed.len();
                            let e = plan.framed[(j + k).min(plan.framed.len() - 1)].1;
                            let s = plan.framed[j].0;
                            (s, e - s)
                        }
                    }
                    8 => {
                        let off = usize::from(input.u16()) % (plan.bytes.len() + 2048);
                        (off, usize::from(input.u16() % 2000))
                    }
                    _ => {
                        // Again, cut differently.
                        let off = usize::from(input.u16()) % plan.sent_end.max(1);
                        (off, 1 + usize::from(input.u16() % 1500))
                    }
                };
                plan.cover(off + len);
                let payload = plan.bytes[off..off + len].to_vec();
                let header = PeerHeader::read(&mut input, mode, &run.end.tcp);
                run.odd_tcp |= header.odd;
                let seq = stream_start.wrapping_add(off as u32);
                run.end.segment(now, &header.segment(&t, seq, &payload));
            }
            10 => {
                now += Duration::from_millis(u64::from(input.u16()) * (1 + u64::from(op >> 6)));
                run_due_timers(&mut run.end.tcp, now);
            }
            11 => {
                let n = usize::from(input.u8()) * 3;
                let pd = private_data(n, op);
                run.end.accept(&pd);
            }
            12 => {
                let n = usize::from(input.u8()) * 3;
                let pd = private_data(n, op);
                run.end.reject(&pd);
            }
            13 => {
                let (ird, ord) = (depth(input.u8()), depth(input.u8()));
                let _ = run.end.conn.iw.set_accept_ird_ord(ird, ord);
            }
            14 => {
                if op & 0x10 != 0 {
                    run.app.post_send(&mut input, &mut run.end.conn);
                } else {
                    run.app.post_recv(&mut run.end.conn);
                }
            }
            _ => {
                run.end.conn.iw.close();
                // The close may come before a startup Terminate could be sent.
                run.odd_tcp = true;
            }
        }
        run.end.pump(now);
        let _ = transmit(&mut run, now);
        run.check(from, frozen_before, &plan);
    }

    if trace() {
        eprintln!(
            "iwarp_startup: events {:?}; established {}, failed {}, written {} times, \
             passed up {} of {} planned (clean below {}), sent {}, counters {:?}, tcp {:?}, \
             deadline {:?} at {:?}",
            run.end.conn.events,
            run.established,
            run.failed,
            run.end.conn.arena.write_count(),
            run.end.conn.delivered.end,
            plan.bytes.len(),
            plan.clean_end.min(plan.bytes.len()),
            run.sent.bytes.len(),
            run.end.conn.iw.counters(),
            run.end.tcp.state(),
            run.end.conn.iw.poll_timeout(),
            now,
        );
    }
    // Every deadline runs out: then the connection is in Full Operation or has failed.
    for _ in 0..2 {
        let from = run.end.conn.arena.write_count();
        let frozen = run.failed || !run.established || run.end.conn.iw.qp().state() != QpState::Rts;
        now += Duration::from_secs(30);
        run_due_timers(&mut run.end.tcp, now);
        run.end.pump(now);
        let _ = transmit(&mut run, now);
        run.check(from, frozen, &plan);
    }
    assert!(
        run.established || run.failed,
        "still starting up once every deadline passed: {:?}",
        run.end.conn.events
    );
    if let Some(n) = run.end.conn.iw.negotiated() {
        if !initiator && n.rtr.is_some() && run.end.conn.iw.counters().fpdus_rx == 0 {
            // Failed (RtrTimeout), or closing by the application's own close.
            assert!(
                run.failed || run.end.conn.iw.qp().state() != QpState::Rts,
                "a peer-to-peer Responder still waits for its RTR"
            );
        }
    }
    if run.startup_terminate.is_some() && !run.odd_tcp {
        let own = own_frame.unwrap_or(0);
        assert!(
            run.sent.prefix().len() > own,
            "no Terminate after refusing the Reply's options"
        );
    }
});

/// With `IWARP_STARTUP_TRACE` set, each run says how far it got (for checking seeds).
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("IWARP_STARTUP_TRACE").is_some())
}

fn empty_plan() -> Plan {
    Plan {
        bytes: Vec::new(),
        seq_start: 0,
        frame_len_read: 0,
        framing: Framing::Ift(FrameFormat {
            header_crc: false,
            payload_crc: false,
            vtag: 0,
            verify: false,
        }),
        framed: Vec::new(),
        clean_end: 0,
        sent_end: 0,
    }
}

/// The packets the target emits now: each must parse; their data goes into the record of
/// its stream.
fn transmit(run: &mut Run, now: Instant) -> Vec<Vec<u8>> {
    let start = run.end.tcp.snd_stream_start();
    let sent = &mut run.sent;
    run.end.conn.transmit(&mut run.end.tcp, now, |seg| {
        if !seg.payload.is_empty() {
            let off = seg.seq.wrapping_sub(start);
            sent.record(u64::from(off), seg.payload);
        }
    })
}
