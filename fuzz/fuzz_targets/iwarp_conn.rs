//! One `IwarpConn` fed arbitrary TCP segments after a valid MPA startup.
//!
//! Two connections, an Initiator and a Responder, each an `IwarpConn` over its own
//! `tcp_engine::Connection`, run the TCP handshake and the MPA startup in memory (packets
//! passed straight across) with configs from the input: revision, CRC and Markers on either
//! side, peer-to-peer RTR, transmit mode (`TxMode::Source` or `Records`), reassembly room and
//! placed-FPDU table size. Or, with IFT framing (draft-williams-iwarp-ift-01), the adaption
//! exchange with each side's header and payload CRCs, CRC checking and speculative placement
//! from the input. Then one of them (the target) is cut off from its peer and the input
//! speaks for the peer: it builds the peer's FPDU (or IFT frame) stream (ULPDUs from templates
//! aimed at the target's regions, multi-FPDU Writes and Sends, FPDUs with an octet changed
//! after framing, raw octets) and sends segments of that stream with sequence numbers, flags,
//! ACK and window of its choice: in order, FPDU-aligned out of order, arbitrary ranges,
//! repeated. Timers run, the target's application posts receives, Reads and Writes and closes.
//! Segments reach the connection either as `on_data` or, as the AF_XDP engine passes them, as
//! `on_data_with_crc` with the CRC read with the segment's checksum (`SegmentDigest`).
//!
//! The target's memory is an `iwarp_fuzz::Arena` with the region set of the `rdmap_ulpdu`
//! target. Every segment's octets are those of the one peer stream at their stream offset, so
//! what TCP accepts at any offset is known.
//!
//! Asserts after every step: nothing panics; no write leaves its region (guards unchanged,
//! every logged write in bounds); writes land only where allowed (remote-write regions, posted
//! receive elements, Read sinks); nothing is written once the queue pair has left RTS or MPA
//! failed; every packet the target emits parses; and, with CRCs on, nothing is placed from an
//! FPDU whose CRC failed: a write carrying octets of an FPDU whose CRC was broken must be
//! explained by an FPDU in the stream whose CRC an independent CRC32c accepts (for IFT, a
//! frame whose CRCs it accepts, when the target checks them); and the octets of held data read
//! again (`rescanned_bytes`) stay within the credit the octets received earn.
#![no_main]

use std::time::Duration;

use ift::{CrcPolicy, FrameEncoder, FrameFormat, IftConfig};
use iwarp_conn::{ConnConfig, ConnEvent, IwarpConn, ReassemblyBudget};
use iwarp_fuzz::{
    check_writes, contains, ref_fpdu, ref_ift_frame, run_due_timers, tcp_config, App, AppLayout,
    Endpoint, Input, PeerHeader, PeerSender, PeerStream, INITIATOR_TUPLE, PD,
};
use libfuzzer_sys::fuzz_target;
use mpa::{FpduEncoder, MpaConfig};
use rdmap::{Access, PdId, QpState};
use tcp_engine::{Config, Connection, Instant, IsnGenerator, SegmentRepr};

const W: usize = 0;
const WR_TOP: usize = 1;
const R: usize = 2;
const RECV: usize = 3;
const FOREIGN: usize = 4;
const SINK: usize = 5;
const INVALID: usize = 6;
const GONE: usize = 7;
const SRC: usize = 8;
const REGIONS: usize = 9;
const BASES: [u64; REGIONS] = [
    0x1000,
    u64::MAX - 127,
    0x2000,
    0x3000,
    0x4000,
    0x5000,
    0x6000,
    0x7000,
    0x8000,
];
const LENS: [usize; REGIONS] = [4096, 128, 256, 512, 256, 384, 128, 64, 2048];
/// The regions the application posts into and sends from.
const APP: AppLayout = AppLayout {
    recv: RECV,
    sink: SINK,
    src: SRC,
    send_len: 1500,
};
/// `iwarp_conn`'s rescan credit (`SCAN_CREDIT_START`, `SCAN_CREDIT_PER_OCTET`): the most held
/// octets a connection reads again are this many plus so many per octet it received.
const RESCAN_START: u64 = 256 << 10;
const RESCAN_PER_OCTET: u64 = 8;

/// One side: its TCP connection (once it exists), its iWARP connection and memory.
struct End {
    tcp: Option<Connection>,
    /// Its iWARP connection, memory and events.
    conn: Endpoint,
    /// The private data of an accept (none with IFT).
    accept_data: &'static [u8],
}

impl End {
    fn new(iw: IwarpConn, accept_data: &'static [u8], digest: bool) -> End {
        End {
            tcp: None,
            conn: Endpoint::new(iw, digest),
            accept_data,
        }
    }

    /// Runs the connection's turn: TCP events, MPA deadlines, queued FPDUs, events (a
    /// Request is accepted).
    fn pump(&mut self, now: Instant) {
        let Some(tcp) = self.tcp.as_mut() else {
            return;
        };
        let c = &mut self.conn;
        c.iw.take_tcp_events(tcp);
        c.iw.poll(tcp, &c.mem, now);
        while let Some(ev) = c.iw.poll_event() {
            if let ConnEvent::Request(_) | ConnEvent::IftRequest(_) = ev {
                if c.iw.accept(self.accept_data).is_ok() {
                    c.iw.poll(tcp, &c.mem, now);
                }
            }
            c.events.push(ev);
        }
        while c.iw.qp_mut().poll_completion().is_some() {}
    }

    /// The packets this side emits now.
    fn transmit(&mut self, now: Instant) -> Vec<Vec<u8>> {
        match self.tcp.as_mut() {
            Some(tcp) => self.conn.transmit(tcp, now, |_| {}),
            None => Vec::new(),
        }
    }

    /// Hands a packet to this side (a listener's SYN makes its connection).
    fn receive(&mut self, packet: &[u8], now: Instant, listen: &Config, isn: &IsnGenerator) {
        let Ok(seg) = SegmentRepr::parse(packet) else {
            return;
        };
        match self.tcp.as_mut() {
            None => self.tcp = Connection::accept(listen.clone(), &seg, isn, now),
            Some(tcp) => self.conn.segment(tcp, now, &seg),
        }
        self.pump(now);
    }
}

/// How the peer's stream is framed.
enum Framing {
    Mpa(FpduEncoder),
    /// IFT frames of the format the target receives.
    Ift(FrameFormat),
}

/// An FPDU of the peer's stream whose CRC was broken: the octets its ULPDU carried.
struct Poisoned {
    payload: Vec<u8>,
}

/// The peer's stream as the input builds it, relative to the target's SeqStart.
struct Plan {
    /// MPA position (from SeqStart) of `bytes[0]`.
    base: u64,
    /// Stream offset (TCP, from the first data octet) of `bytes[0]`.
    tcp_base: u64,
    bytes: Vec<u8>,
    framing: Framing,
    crc: bool,
    markers: bool,
    /// (start, end) offsets in `bytes` of every FPDU built whole.
    fpdus: Vec<(usize, usize)>,
    /// The same of every FPDU built, those with an octet changed included: where FPDU-aligned
    /// segments start and end.
    framed: Vec<(usize, usize)>,
    poisoned: Vec<Poisoned>,
    /// Offsets below this have been sent: the plan only grows after it.
    sent_end: usize,
}

impl Plan {
    fn position(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }

    /// Makes the plan cover offsets below `end` (zeros) before they are sent.
    fn cover(&mut self, end: usize) {
        if end > self.bytes.len() {
            let n = end - self.bytes.len();
            self.raw(&vec![0; n]);
        }
        self.sent_end = self.sent_end.max(end);
    }

    /// The octet at MPA position `p`, if the plan has it.
    fn octet(&self, p: u64) -> Option<u8> {
        let i = usize::try_from(p.checked_sub(self.base)?).ok()?;
        self.bytes.get(i).copied()
    }

    /// Whether an FPDU (or IFT frame) whose CRC is good (by the reference CRC32c) carries
    /// `data`.
    fn justified(&self, data: &[u8]) -> bool {
        let octet = |p: u64| self.octet(p);
        let check = |header: u64| match &self.framing {
            Framing::Mpa(_) => ref_fpdu(octet, header, self.markers, 0)
                .is_some_and(|r| r.lenient_ok(true, self.markers) && contains(&r.ulpdu, data)),
            Framing::Ift(fmt) => ref_ift_frame(octet, header, fmt.header_crc, fmt.payload_crc)
                .is_some_and(|r| r.crcs_ok && contains(&r.ulpdu, data)),
        };
        // The FPDUs built whole first, then every other position.
        let built = self.fpdus.iter().any(|&(s, _)| {
            let at = self.base + s as u64;
            check(if self.markers && at.is_multiple_of(512) {
                at + 4
            } else {
                at
            })
        });
        built
            || (0..self.bytes.len() as u64)
                .map(|i| self.base + i)
                .filter(|p| !(self.markers && p.is_multiple_of(512)))
                .any(check)
    }
}

impl PeerStream for Plan {
    /// Appends one FPDU carrying `ulpdu`; `change` flips an octet after framing.
    fn fpdu(&mut self, ulpdu: &[u8], change: Option<(u16, u8)>) {
        let start = self.bytes.len();
        let encoded = match &mut self.framing {
            Framing::Mpa(enc) => enc.encode(ulpdu, &mut self.bytes).is_ok(),
            Framing::Ift(fmt) => FrameEncoder::new(*fmt)
                .encode(ulpdu, &mut self.bytes)
                .is_ok(),
        };
        if !encoded {
            return;
        }
        let end = self.bytes.len();
        self.framed.push((start, end));
        if let Some((at, x)) = change {
            let i = start + usize::from(at) % (end - start);
            self.bytes[i] ^= x | 1;
            // What a placement of this FPDU could carry: its payload as sent, and what the
            // receiver reads after the change.
            let h = if ulpdu.first().is_some_and(|c| c & 0x80 != 0) {
                14
            } else {
                18
            };
            let payload = |u: &[u8]| u.get(h.min(u.len())..).unwrap_or(&[]).to_vec();
            self.poisoned.push(Poisoned {
                payload: payload(ulpdu),
            });
            let at = self.base + start as u64;
            let read_back = match &self.framing {
                Framing::Mpa(_) => {
                    let header = if self.markers && at.is_multiple_of(512) {
                        at + 4
                    } else {
                        at
                    };
                    ref_fpdu(|p| self.octet(p), header, self.markers, 0).map(|r| r.ulpdu)
                }
                Framing::Ift(fmt) => {
                    ref_ift_frame(|p| self.octet(p), at, fmt.header_crc, fmt.payload_crc)
                        .map(|r| r.ulpdu)
                }
            };
            if let Some(ulpdu) = read_back {
                self.poisoned.push(Poisoned {
                    payload: payload(&ulpdu),
                });
            }
        } else {
            self.fpdus.push((start, end));
        }
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
        let position = self.position() as u32;
        if let Framing::Mpa(enc) = &mut self.framing {
            *enc = FpduEncoder::with_position(self.crc, self.markers, position);
        }
    }

    fn markers(&self) -> bool {
        self.markers
    }

    fn octets(&self) -> usize {
        self.bytes.len()
    }
}

/// Length of the Request or Reply of this harness's startup (private data of 6 octets: "client"
/// and "server").
fn frame_len(rev: u8) -> u64 {
    20 + if rev >= 2 { 4 } else { 0 } + 6
}

/// The side the input is the peer of, and its application.
struct Target {
    end: End,
    app: App,
    crc: bool,
    mpa_failed: bool,
}

impl Target {
    fn check(&mut self, from: usize, frozen: bool, plan: &Plan) {
        let conn = &self.end.conn;
        conn.arena.check();
        let rescanned = conn.iw.counters().rescanned_bytes;
        let received = conn.delivered.octets;
        let credit = RESCAN_START + RESCAN_PER_OCTET * received;
        assert!(
            rescanned <= credit,
            "read {rescanned} held octets again on {received} received"
        );
        let frozen = frozen.then_some("after RTS or MPA ended");
        check_writes(&conn.arena, &self.app.allowed, from, frozen, |w| {
            if self.crc
                && !w.data.is_empty()
                && plan.poisoned.iter().any(|p| contains(&p.payload, &w.data))
            {
                assert!(
                    plan.justified(&w.data),
                    "placed octets of an FPDU whose CRC failed: {w:?}"
                );
            }
        });
        self.mpa_failed |= conn
            .events
            .iter()
            .any(|e| matches!(e, ConnEvent::MpaFailed(_) | ConnEvent::TransportClosed(_)));
    }

    fn frozen(&self) -> bool {
        self.mpa_failed || self.end.conn.iw.qp().state() != QpState::Rts
    }
}

/// The MPA config of one side from two knob bits and the shared revision.
fn mpa_config(rev: u8, crc: bool, markers: bool, p2p: bool, waits: bool) -> MpaConfig {
    MpaConfig {
        rev,
        crc,
        markers,
        peer_to_peer: p2p && rev >= 2,
        responder_waits_for_fpdu: waits,
        ird: 4,
        ord: 4,
        ..MpaConfig::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let k1 = input.u8();
    let k2 = input.u8();
    // The reassembly budget the connections share: none, spent, or one store's worth.
    let k3 = input.u8();
    let target_is_initiator = k1 & 1 != 0;
    let rev = if k1 & 2 != 0 { 1 } else { 2 };
    let p2p = k1 & 4 != 0;
    let icfg = mpa_config(rev, k1 & 8 != 0, k1 & 16 != 0, p2p, true);
    let rcfg = mpa_config(rev, k1 & 32 != 0, k1 & 64 != 0, false, k1 & 128 == 0);
    let source = k2 & 1 != 0;
    let digest = k2 & 64 != 0;
    // IFT instead of MPA: k1's bits above the target's side then say each side's CRCs
    // (initiator HC, PC, responder HC, PC), whether both check the CRCs they receive and
    // whether both allow speculative placement; the MPA configs still give IRD and ORD.
    let ift_mode = k2 & 128 != 0;
    let ift_cfg = |vtag: u16, hc: bool, pc: bool| IftConfig {
        rdma: true,
        header_crc: hc,
        payload_crc: pc,
        check_crcs: k1 & 32 == 0,
        accept: CrcPolicy::default(),
        allow_speculative: k1 & 64 == 0,
        vtag,
        timeout: Duration::from_secs(10),
    };
    let i_ift = ift_cfg(0x1234, k1 & 2 != 0, k1 & 4 != 0);
    let r_ift = ift_cfg(0x5678 ^ u16::from(k1 & 128), k1 & 8 != 0, k1 & 16 != 0);
    let capacity = [4096, 16384, 65536, 1 << 20][usize::from(k2 >> 1 & 3)];
    let budget_octets = [None, Some(0), Some(capacity), None][usize::from(k3 & 3)];
    let budget = budget_octets.map(ReassemblyBudget::new);
    let conn_cfg = |mpa: &MpaConfig, ift: &IftConfig, k: u8| {
        let mut c = ConnConfig {
            mpa: mpa.clone(),
            ift: ift_mode.then(|| ift.clone()),
            reassembly_capacity: capacity,
            reassembly_budget: budget.clone(),
            max_placed_fpdus: [1, 4, 64, 8192][usize::from(k >> 3 & 3)],
            max_tx_fpdus: 64,
            ..ConnConfig::default()
        };
        c.qp.pd = PD;
        c.qp.ird = 4;
        c.qp.ord = 4;
        c
    };
    let mut tcp_cfg = tcp_config(source);
    tcp_cfg.sack = k2 & 32 == 0;
    let epoch = std::time::Instant::now();
    let mut now = Instant::ZERO + Duration::from_millis(1);
    let isn_a = IsnGenerator::new([3; 16]);
    let isn_b = IsnGenerator::new([9; 16]);
    let (client, server): (&[u8], &'static [u8]) = if ift_mode {
        (b"", b"")
    } else {
        (b"client", b"server")
    };
    let (Ok(iw_a), Ok(iw_b)) = (
        IwarpConn::initiator(conn_cfg(&icfg, &i_ift, k2), client, epoch, now),
        IwarpConn::responder(conn_cfg(&rcfg, &r_ift, k2), epoch, now),
    ) else {
        return;
    };
    let mut a = End::new(iw_a, server, digest);
    let mut b = End::new(iw_b, server, digest);
    a.tcp = Some(Connection::connect(
        tcp_cfg.clone(),
        INITIATOR_TUPLE,
        &isn_a,
        now,
    ));

    // The target's regions (the peer's memory is never touched).
    let target_end = if target_is_initiator { &mut a } else { &mut b };
    let access = [
        Access::REMOTE_WRITE,
        Access::ALL,
        Access::REMOTE_READ,
        Access::LOCAL_WRITE,
        Access::ALL,
        Access::LOCAL_WRITE,
        Access::REMOTE_WRITE,
        Access::ALL,
        Access::REMOTE_READ,
    ];
    let c = &mut target_end.conn;
    let stags = c.register(&BASES, &LENS, &access, |i| {
        if i == FOREIGN {
            PdId(2)
        } else {
            PD
        }
    });
    let _ = c.mem.invalidate(stags[INVALID], PD);
    let _ = c.mem.deregister(stags[GONE]);
    c.arena.record_data(true);
    let mut app = App::new(stags, &BASES, &LENS, APP);

    // TCP handshake and MPA startup, packets passed straight across until quiet.
    for _ in 0..64 {
        a.pump(now);
        b.pump(now);
        let from_a = a.transmit(now);
        let from_b = b.transmit(now);
        if from_a.is_empty() && from_b.is_empty() {
            break;
        }
        for p in &from_a {
            b.receive(p, now, &tcp_cfg, &isn_b);
        }
        for p in &from_b {
            a.receive(p, now, &tcp_cfg, &isn_a);
        }
        now += Duration::from_micros(100);
    }
    if !(a.conn.iw.is_established() && b.conn.iw.is_established()) {
        return;
    }
    let (end, peer) = if target_is_initiator { (a, b) } else { (b, a) };
    let Some(tcp) = end.tcp.as_ref() else {
        return;
    };
    let rcv_offset = tcp.rcv_nxt_offset();
    let stream_start = tcp.rcv_stream_start();
    let t = tcp.four_tuple();
    // The peer's startup frame: with MPA, 6 octets of private data and the RFC 6581 block at
    // Rev 2; with IFT, its adaption indication.
    let (peer_frame, framing, crc, markers) = if ift_mode {
        let Some(neg) = end.conn.iw.ift_negotiated().copied() else {
            return;
        };
        let rx = neg.rx;
        let checked = rx.verify && (rx.header_crc || rx.payload_crc);
        let indication = ift::wire::INDICATION_LEN as u64;
        (indication, Framing::Ift(rx), checked, false)
    } else {
        let Some(neg) = end.conn.iw.negotiated().cloned() else {
            return;
        };
        let peer_frame = frame_len(rev);
        let Some(position) = rcv_offset.checked_sub(peer_frame) else {
            return;
        };
        let enc = FpduEncoder::with_position(neg.crc, neg.markers_rx, position as u32);
        (peer_frame, Framing::Mpa(enc), neg.crc, neg.markers_rx)
    };
    assert!(
        rcv_offset >= peer_frame,
        "the peer's startup frame did not arrive"
    );
    app.allowed[W].push(0..LENS[W]);
    app.allowed[WR_TOP].push(0..LENS[WR_TOP]);
    // R, FOREIGN, INVALID and GONE are never written: no ranges. RECV and SINK get theirs
    // as receives and Reads are posted.
    let _ = (R, FOREIGN, INVALID, GONE);
    let mut sender = PeerSender::new(app.templates(), 4096, 1 << 16);
    let mut target = Target {
        end,
        app,
        crc,
        mpa_failed: false,
    };
    let mut plan = Plan {
        base: rcv_offset - peer_frame,
        tcp_base: rcv_offset,
        bytes: Vec::new(),
        framing,
        crc,
        markers,
        fpdus: Vec::new(),
        framed: Vec::new(),
        poisoned: Vec::new(),
        sent_end: 0,
    };
    let mut cursor = 0usize;

    for _ in 0..96 {
        if input.is_empty() {
            break;
        }
        let from = target.end.conn.arena.write_count();
        let frozen = target.frozen();
        let op = input.u8();
        match op % 12 {
            // The peer's stream grows.
            0..=2 => sender.template(&mut input, op, &mut plan),
            // A multi-FPDU Write or Send, each FPDU within the MULPDU chosen here.
            3 => sender.message(&mut input, op, &mut plan),
            4 => sender.raw(&mut input, &mut plan),
            // Segments of the stream.
            5..=8 => {
                let mode = input.u8();
                let (off, len): (i64, usize) = match op % 12 {
                    5 => {
                        // In order from the cursor.
                        let len = 1 + usize::from(input.u16() % 2000);
                        let off = cursor;
                        cursor += len;
                        (off as i64, len)
                    }
                    6 => {
                        // FPDU-aligned: whole FPDUs from the j-th on.
                        let framed = &plan.framed;
                        if framed.is_empty() {
                            continue;
                        }
                        let j = usize::from(input.u8()) % framed.len();
                        let k = usize::from(input.u8() % 4);
                        let end = framed[(j + k).min(framed.len() - 1)].1;
                        let start = framed[j].0;
                        (start as i64, end - start)
                    }
                    7 => {
                        let off = i64::from(input.u16()) - 64;
                        (off, usize::from(input.u16() % 3000))
                    }
                    _ => {
                        // Resend what was sent, possibly cut differently.
                        let off = usize::from(input.u16()) % plan.sent_end.max(1);
                        (off as i64, 1 + usize::from(input.u16() % 1500))
                    }
                };
                let end = (off + len as i64).max(0) as usize;
                plan.cover(end);
                let mut payload = vec![0u8; len];
                for (i, b) in payload.iter_mut().enumerate() {
                    let at = off + i as i64;
                    if at >= 0 {
                        *b = plan.bytes[at as usize];
                    }
                }
                let End { tcp, conn, .. } = &mut target.end;
                let Some(tcp) = tcp.as_mut() else {
                    break;
                };
                let header = PeerHeader::read(&mut input, mode, tcp);
                let seq = stream_start
                    .wrapping_add(plan.tcp_base as u32)
                    .wrapping_add(off as u32);
                conn.segment(tcp, now, &header.segment(&t, seq, &payload));
            }
            9 => {
                now += Duration::from_millis(u64::from(input.u16()));
                if let Some(tcp) = target.end.tcp.as_mut() {
                    run_due_timers(tcp, now);
                }
            }
            10 => target.app.post_recv(&mut target.end.conn),
            _ => match input.u8() % 8 {
                0 => target.end.conn.iw.close(),
                1..=3 => target.app.post_recv(&mut target.end.conn),
                _ => target.app.post_send(&mut input, &mut target.end.conn),
            },
        }
        target.end.pump(now);
        let _ = target.end.transmit(now);
        target.check(from, frozen, &plan);
    }
    // Every store charged to the budget gave back what it took.
    drop(target);
    drop(peer);
    if let (Some(b), Some(octets)) = (&budget, budget_octets) {
        assert_eq!(
            b.available(),
            octets,
            "the reassembly budget was not credited"
        );
    }
});
