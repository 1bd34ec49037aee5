//! `IwarpConn` fed directly (no TCP): a Write's FPDU stream cut into segments and passed up in
//! random orders must land exactly as sent, with the in-order point reaching the end; random
//! corruption and garbage must never panic nor place anything outside the sink.

use std::time::Instant as StdInstant;

use datapath::engine::{ConnConfig, ConnEvent, IwarpConn};
use mpa::{FpduEncoder, Initiator, MpaConfig};
use rdmap::memory::VecBuffer;
use rdmap::qp::QpConfig;
use rdmap::{Access, MemoryTable, PdId, QueuePair, SendOp, SendWr, Sge};
use tcp_engine::{Instant, PassedUp};

const PD: PdId = PdId(3);
const SINK_TO: u64 = 0x7000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A responder in Full Operation, with a 256 KiB sink (plus guard regions around it).
/// Passes `data` up to `conn` as TCP would, at stream offset `stream_offset`. Nothing here gives
/// octets back (no reassembly budget, no IFT): the answer must be empty.
fn pass_up(conn: &mut IwarpConn, stream_offset: u64, data: &[u8], mem: &MemoryTable<VecBuffer>) {
    let data = PassedUp {
        acked: 0,
        seq: 0,
        stream_offset,
        data,
    };
    assert_eq!(conn.on_data(data, mem), None, "nothing is given back here");
}

struct Receiver {
    conn: IwarpConn,
    mem: MemoryTable<VecBuffer>,
    sink: rdmap::Stag,
    guards: [rdmap::Stag; 2],
    /// Stream offset of SeqStart (the Request's length).
    start: usize,
}

fn receiver(markers: bool, crc: bool) -> Receiver {
    let mpa = MpaConfig {
        markers,
        crc,
        ..MpaConfig::default()
    };
    let epoch = StdInstant::now();
    let cfg = ConnConfig {
        mpa: mpa.clone(),
        qp: QpConfig {
            pd: PD,
            ..QpConfig::default()
        },
        reassembly_capacity: 1 << 20,
        max_placed_fpdus: 4096,
        ..ConnConfig::default()
    };
    let mut conn = IwarpConn::responder(cfg, epoch, Instant::ZERO).unwrap();
    let mut mem = MemoryTable::new();
    let guard0 = mem.register(PD, VecBuffer::zeroed(4096), 0, Access::REMOTE_WRITE);
    let sink = mem.register(
        PD,
        VecBuffer::zeroed(256 << 10),
        SINK_TO,
        Access::REMOTE_WRITE,
    );
    let guard1 = mem.register(PD, VecBuffer::zeroed(4096), 0, Access::REMOTE_WRITE);
    let request = Initiator::new(mpa, b"", epoch).unwrap().request().to_vec();
    pass_up(&mut conn, 0, &request, &mem);
    assert!(matches!(conn.poll_event(), Some(ConnEvent::Request(_))));
    conn.accept(b"").unwrap();
    Receiver {
        conn,
        mem,
        sink,
        guards: [guard0, guard1],
        start: request.len(),
    }
}

/// The FPDUs of one Write of `data` to `sink`, as separate records.
fn write_fpdus(
    data: &[u8],
    sink: rdmap::Stag,
    markers: bool,
    crc: bool,
    mulpdu: usize,
) -> Vec<Vec<u8>> {
    writes_fpdus(data, sink, markers, crc, mulpdu, data.len())
}

/// Segments: groups of whole FPDUs (aligned) or, with `cut`, arbitrary cuts of the stream.
fn segments(fpdus: &[Vec<u8>], rng: &mut Rng, cut: bool) -> Vec<(u64, Vec<u8>)> {
    let mut segs = Vec::new();
    let mut off = 0u64;
    if cut {
        let stream: Vec<u8> = fpdus.concat();
        let mut at = 0;
        while at < stream.len() {
            let n = (1 + rng.below(3000)).min(stream.len() - at);
            segs.push((at as u64, stream[at..at + n].to_vec()));
            at += n;
        }
        return segs;
    }
    let mut i = 0;
    while i < fpdus.len() {
        let k = (1 + rng.below(3)).min(fpdus.len() - i);
        let seg: Vec<u8> = fpdus[i..i + k].concat();
        let len = seg.len() as u64;
        segs.push((off, seg));
        off += len;
        i += k;
    }
    segs
}

fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i + 1));
    }
}

#[test]
fn random_orders_place_exactly() {
    for seed in 1..=60u64 {
        let mut rng = Rng(seed * 0x9E37_79B9);
        let markers = seed % 2 == 0;
        let crc = seed % 3 != 0;
        let cut = seed % 4 == 1;
        let Receiver {
            mut conn,
            mem,
            sink,
            start,
            ..
        } = receiver(markers, crc);
        let len = 1 + rng.below(200_000);
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + seed as usize) as u8).collect();
        let mulpdu = 200 + rng.below(1300);
        let fpdus = write_fpdus(&data, sink, markers, crc, mulpdu);
        let mut segs = segments(&fpdus, &mut rng, cut);
        shuffle(&mut segs, &mut rng);
        for (off, bytes) in &segs {
            pass_up(&mut conn, start as u64 + off, bytes, &mem);
        }
        let c = conn.counters();
        let got = mem.get(sink).unwrap().to_vec();
        assert!(got[..len] == data[..], "seed {seed}: {c:?}");
        assert!(got[len..].iter().all(|&b| b == 0), "seed {seed}");
        assert_eq!(c.fpdus_rx, fpdus.len() as u64, "seed {seed}: {c:?}");
        assert_eq!(c.held_bytes, 0, "seed {seed}");
        // With CRCs an aligned segment is always located; with Markers alone only one that
        // holds a Marker (segments shorter than 512 octets may not).
        if crc && !cut {
            assert_eq!(c.held_total, 0, "aligned, seed {seed}: {c:?}");
        }
        if ((crc && !cut) || markers) && len > 20_000 {
            assert!(c.bytes_placed_out_of_order > 0, "seed {seed}: {c:?}");
        }
        if !crc && !markers {
            assert_eq!(c.bytes_placed_out_of_order, 0);
        }
    }
}

#[test]
fn corruption_and_garbage_never_panic_nor_escape_the_sink() {
    for seed in 1..=200u64 {
        let mut rng = Rng(seed * 0x2545_F491);
        let markers = seed % 2 == 0;
        let crc = seed % 5 != 0;
        let Receiver {
            mut conn,
            mem,
            sink,
            guards,
            start,
        } = receiver(markers, crc);
        let len = 1 + rng.below(50_000);
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
        let fpdus = write_fpdus(&data, sink, markers, crc, 300 + rng.below(1200));
        let mut segs = segments(&fpdus, &mut rng, seed % 3 == 0);
        for _ in 0..1 + rng.below(4) {
            let s = rng.below(segs.len());
            let seg = &mut segs[s].1;
            match rng.below(3) {
                0 => {
                    let i = rng.below(seg.len());
                    seg[i] ^= 1 << rng.below(8);
                }
                1 => {
                    for b in seg.iter_mut() {
                        *b = rng.next() as u8;
                    }
                }
                _ => {
                    let n = rng.below(seg.len());
                    seg.truncate(n.max(1));
                }
            }
        }
        shuffle(&mut segs, &mut rng);
        for (off, bytes) in &segs {
            pass_up(&mut conn, start as u64 + off, bytes, &mem);
        }
        // With CRCs, nothing corrupted is placed: only the sink, inside the Write's range.
        if crc {
            for g in guards {
                assert!(
                    mem.get(g).unwrap().to_vec().iter().all(|&b| b == 0),
                    "seed {seed}"
                );
            }
        }
        let got = mem.get(sink).unwrap().to_vec();
        assert!(got[len..].iter().all(|&b| b == 0), "seed {seed}");
        let c = conn.counters();
        assert!(c.held_bytes <= 1 << 20);
    }
}

/// One FPDU of a test stream: where it lies (a Marker right before its header included) and
/// where its ULPDU_Length field ends (past a Marker that splits it).
#[derive(Clone, Copy)]
struct Span {
    start: u64,
    header_end: u64,
    end: u64,
}

fn spans(fpdus: &[Vec<u8>]) -> Vec<Span> {
    let mut at = 0u64;
    let mut out = Vec::new();
    for f in fpdus {
        let start = at;
        // Two octets of ULPDU_Length, skipping Markers (every 512 octets).
        let mut p = start;
        let mut left = 2;
        while left > 0 {
            if p.is_multiple_of(512) {
                p += 4;
            } else {
                p += 1;
                left -= 1;
            }
        }
        at += f.len() as u64;
        out.push(Span {
            start,
            header_end: p,
            end: at,
        });
    }
    out
}

/// Octets of `[a, b)` not inside any of the `holes`.
fn received_in(a: u64, b: u64, holes: &[(u64, u64)]) -> u64 {
    if a >= b {
        return 0;
    }
    let missing: u64 = holes
        .iter()
        .map(|&(s, e)| e.min(b).saturating_sub(s.max(a)))
        .sum();
    (b - a) - missing
}

/// What any receiver must hold at least: the received octets, past the in-order point, of
/// every FPDU that is not complete (a hole cuts it, or it goes past the last octet received);
/// complete FPDUs can all be placed. A Marker right before a header holds FPDUPTR 0 (RFC 5044
/// 4.3), so an FPDU that misses only that Marker is complete too.
fn must_hold(spans: &[Span], holes: &[(u64, u64)], rcv_max: u64) -> u64 {
    let consumed = holes.iter().map(|h| h.0).min().unwrap_or(rcv_max);
    let header = |f: &Span| f.start + if f.start.is_multiple_of(512) { 4 } else { 0 };
    spans
        .iter()
        .filter(|f| f.end > consumed && f.start < rcv_max)
        .filter(|f| f.end > rcv_max || holes.iter().any(|&(s, e)| s < f.end && header(f) < e))
        .map(|f| received_in(f.start.max(consumed), f.end.min(rcv_max), holes))
        .sum()
}

/// A Write's FPDUs (Markers and CRCs on, at most `EMSS` octets each, like the engine behind the
/// relay) with `holes` cut out: everything else arrives first, in stream order and cut at
/// random offsets (as a re-segmenting middlebox does), then the holes in random order. After
/// every piece the reassembly store is checked against `must_hold` plus what each hole may
/// add. Returns (most octets held beyond `must_hold`, the connection's counters, FPDU max).
fn hold_around_holes(
    seed: u64,
    mulpdu: usize,
    pick_holes: impl Fn(&[Span], &mut Rng) -> Vec<(u64, u64)>,
    allowance: impl Fn(&[Span], (u64, u64)) -> u64,
) -> (u64, datapath::engine::ConnCounters, u64) {
    const EMSS: usize = 688;
    let mut rng = Rng(seed * 0x51_7CC1_B727);
    let Receiver {
        mut conn,
        mem,
        sink,
        start,
        ..
    } = receiver(true, true);
    let len = 200_000;
    let data: Vec<u8> = (0..len).map(|i| (i * 11 + seed as usize) as u8).collect();
    let fpdus = write_fpdus(&data, sink, true, true, mulpdu.min(mpa::mulpdu(EMSS, true)));
    let fpdu_max = fpdus.iter().map(|f| f.len() as u64).max().unwrap();
    assert!(fpdu_max <= EMSS as u64);
    let spans = spans(&fpdus);
    let stream: Vec<u8> = fpdus.concat();
    let mut holes = pick_holes(&spans, &mut rng);
    holes.sort();
    // The octets outside the holes, cut at random offsets (1..=1448 octets a piece).
    let mut pieces = Vec::new();
    let mut at = 0u64;
    for &(s, e) in holes
        .iter()
        .chain([(stream.len() as u64, stream.len() as u64)].iter())
    {
        while at < s {
            let n = (1 + rng.below(1448) as u64).min(s - at);
            pieces.push((at, at + n));
            at += n;
        }
        at = e;
    }
    let mut late = holes.clone();
    shuffle(&mut late, &mut rng);
    pieces.extend(late.iter().copied());
    let mut pending = holes.clone();
    let mut rcv_max = 0;
    let mut worst = 0;
    for &(s, e) in &pieces {
        pass_up(
            &mut conn,
            start as u64 + s,
            &stream[s as usize..e as usize],
            &mem,
        );
        pending.retain(|&h| h != (s, e));
        rcv_max = rcv_max.max(e);
        let held = conn.counters().held_bytes;
        let least = must_hold(&spans, &pending, rcv_max);
        // A Marker right before a header, cut off from it by a segment boundary, stays held
        // until in order (4 octets at most, per segment boundary next to a gap).
        let slack: u64 = pending
            .iter()
            .map(|&h| allowance(&spans, h) + 8)
            .sum::<u64>()
            + 4;
        assert!(held >= least, "seed {seed}: held {held} < {least}");
        assert!(
            held <= least + slack,
            "seed {seed}: held {held}, must hold {least}, allowed {slack} more; after \
             [{s}, {e}), holes {pending:?}"
        );
        worst = worst.max(held - least);
    }
    let c = conn.counters();
    assert_eq!(c.held_bytes, 0, "seed {seed}");
    assert_eq!(c.fpdus_rx, fpdus.len() as u64, "seed {seed}");
    let got = mem.get(sink).unwrap().to_vec();
    assert!(got[..len] == data[..], "seed {seed}");
    (worst, c, fpdu_max)
}

/// Gaps inside FPDUs, after their ULPDU_Length: its value says where the cut FPDU ends, past
/// the gap, so the run after the gap is framed from there and every whole FPDU in it is
/// placed. The store holds exactly the pieces of the FPDUs gaps cut (but for a Marker's
/// octets cut off from their header), less than one FPDU per gap.
#[test]
fn a_gap_inside_an_fpdu_holds_only_its_pieces() {
    for seed in 1..=6u64 {
        let (worst, c, fpdu_max) = hold_around_holes(
            seed,
            usize::MAX,
            |spans, rng| {
                let mut holes = Vec::new();
                let mut i = rng.below(4);
                while i < spans.len() {
                    let f = spans[i];
                    let room = f.end - f.header_end;
                    if room > 2 {
                        let a = f.header_end + rng.below(room as usize / 2) as u64;
                        let b = a + 1 + rng.below((f.end - a - 1) as usize) as u64;
                        holes.push((a, b));
                    }
                    i += 3 + rng.below(5);
                }
                holes
            },
            |_, _| 0,
        );
        println!(
            "seed {seed}: store at most {worst} octets above the cut FPDUs' pieces; peak {} \
             octets at {} gaps, at most {} at one gap (FPDUs of at most {fpdu_max})",
            c.held_peak, c.held_peak_gaps, c.held_gap_peak
        );
        assert!(c.held_peak_gaps > 10, "seed {seed}: {c:?}");
        assert!(c.held_gap_peak < fpdu_max, "seed {seed}: {c:?}");
        assert!(
            c.held_peak < c.held_peak_gaps * fpdu_max,
            "seed {seed}: {c:?}"
        );
    }
}

/// Gaps anywhere (up to 1448 octets, often across FPDU boundaries or over a ULPDU_Length):
/// a gap then cuts two FPDUs (the one it starts in, the one it ends in), and where it
/// swallowed the second one's ULPDU_Length the run after it is framed from the first header
/// a Marker points at, and the FPDUs before that header are found backwards from it (CRC
/// checked). Until such a header has arrived the run is held whole: whole FPDUs of less than
/// the 512-octet Marker interval (RFC 5044 section 5) are held too.
#[test]
fn a_gap_over_a_header_holds_at_most_a_marker_interval_more() {
    let mut above = Vec::new();
    // FPDUs of up to 688 octets (each holds a Marker: only the last one of the Write can be
    // missed), then FPDUs of 130 octets (most hold none).
    for (seed, mulpdu) in (1..=8u64).map(|s| (s, if s <= 4 { usize::MAX } else { 110 })) {
        let (worst, c, fpdu_max) = hold_around_holes(
            seed,
            mulpdu,
            |spans, rng| {
                let total = spans.last().unwrap().end;
                let mut holes = Vec::new();
                let mut at = rng.below(3000) as u64;
                while at + 1448 < total {
                    holes.push((at, at + 1 + rng.below(1448) as u64));
                    at += 3200 + rng.below(2000) as u64;
                }
                holes
            },
            |spans, (s, e)| {
                let cut = spans.iter().find(|f| f.start <= s && s < f.end).unwrap();
                if e <= cut.end && s >= cut.header_end {
                    0
                } else {
                    511
                }
            },
        );
        println!(
            "seed {seed}: store at most {worst} octets above the cut FPDUs' pieces; peak {} \
             octets at {} gaps, at most {} at one gap (FPDUs of at most {fpdu_max})",
            c.held_peak, c.held_peak_gaps, c.held_gap_peak
        );
        assert!(c.held_gap_peak < 2 * fpdu_max + 512, "seed {seed}: {c:?}");
        above.push((mulpdu, worst));
    }
    // Full-size FPDUs each hold a Marker that points at them: nothing above what the cut
    // FPDUs need. Short ones after a swallowed header are found backwards from the first
    // header a Marker points at, once that has arrived; until then (less than a Marker
    // interval into the newest run) they are held: the term is real, and within its bound.
    assert!(above.iter().all(|&(m, w)| m < 1000 || w == 0), "{above:?}");
    assert!(above.iter().any(|&(m, w)| m < 1000 && w > 0), "{above:?}");
    assert!(above.iter().all(|&(_, w)| w < 512 + 8), "{above:?}");
}

/// The FPDUs of Writes of `chunk` octets each, covering `data` (to consecutive places in
/// `sink`), on one stream: each message ends in a shorter FPDU, as 64 KiB Writes do. Empty
/// `data` is one zero-length Write.
fn writes_fpdus(
    data: &[u8],
    sink: rdmap::Stag,
    markers: bool,
    crc: bool,
    mulpdu: usize,
    chunk: usize,
) -> Vec<Vec<u8>> {
    writes_fpdus_sized(data, sink, markers, crc, mulpdu, || chunk)
}

/// The FPDUs of Writes covering `data` (to consecutive places in `sink`), each of the length
/// `next_len` gives (cut short at the end of `data`).
fn writes_fpdus_sized(
    data: &[u8],
    sink: rdmap::Stag,
    markers: bool,
    crc: bool,
    mulpdu: usize,
    mut next_len: impl FnMut() -> usize,
) -> Vec<Vec<u8>> {
    let mut src = MemoryTable::new();
    let stag = src.register(
        PD,
        VecBuffer::from_vec(data.to_vec()),
        0,
        Access::LOCAL_WRITE,
    );
    let mut qp = QueuePair::new(QpConfig {
        pd: PD,
        ..QpConfig::default()
    });
    qp.enter_rts(16, 16);
    let mut enc = FpduEncoder::new(crc, markers);
    let mut out = Vec::new();
    let mut ulpdu = Vec::new();
    let mut off = 0;
    for i in 0.. {
        let len = next_len().max(1).min(data.len() - off);
        qp.post_send(
            SendWr {
                wr_id: i as u64,
                op: SendOp::Write {
                    remote_stag: sink,
                    remote_to: SINK_TO + off as u64,
                },
                sg_list: Sge {
                    stag,
                    to: off as u64,
                    len: len as u32,
                }
                .into(),
                signaled: true,
                fence: false,
            },
            &src,
        )
        .unwrap();
        while qp.poll_transmit(mulpdu, &src, &mut ulpdu).is_some() {
            let mut fpdu = Vec::new();
            enc.encode(&ulpdu, &mut fpdu).unwrap();
            out.push(fpdu);
            ulpdu.clear();
        }
        off += len;
        if off == data.len() {
            break;
        }
    }
    out
}

/// A relay's order: the stream cut at random offsets (1..=1448 octets), 2% of the pieces
/// dropped (they come again 20-60 pieces later, as retransmissions do) and 2% held back
/// behind 1-8 later ones; 64 KiB Writes with Markers and CRCs, FPDUs of at most 688 octets.
/// After every piece, the store holds what the cut FPDUs need, plus (until a header a Marker
/// points at arrives in a run after a swallowed header) less than a Marker interval per gap.
#[test]
fn relay_orders_hold_the_cut_fpdus_pieces() {
    for seed in 1..=8u64 {
        relay_order_holds_the_cut_fpdus_pieces(seed, |_| 65_536, 2, false);
    }
}

/// As [`relay_orders_hold_the_cut_fpdus_pieces`], with Writes of any length (short ones
/// make FPDUs that hold no Marker) and 1-5% of the pieces lost, each sent again re-cut into
/// pieces of up to 700 octets. Among these orders are runs after a gap that start right at a
/// header whose Marker (between FPDUs, covered by its CRC) the gap took: the FPDU is still
/// found from there, else the whole run would stay held beyond the bound per gap.
#[test]
fn relay_orders_with_writes_of_any_length_and_recut_retransmissions() {
    for seed in 1..=100u64 {
        relay_order_holds_the_cut_fpdus_pieces(
            seed,
            |rng| match rng.below(4) {
                0 => 1 + rng.below(64),
                1 => 1 + rng.below(3000),
                2 => 4096,
                _ => 65_536,
            },
            1 + seed as usize % 5,
            true,
        );
    }
}

/// One relay order of seed `seed` (see [`relay_orders_hold_the_cut_fpdus_pieces`]): Writes
/// of the lengths `write_len` draws, `loss_percent` of the pieces lost and as many held
/// back; `recut`: a lost piece comes again cut into pieces of up to 700 octets, each late by
/// its own delay.
fn relay_order_holds_the_cut_fpdus_pieces(
    seed: u64,
    mut write_len: impl FnMut(&mut Rng) -> usize,
    loss_percent: usize,
    recut: bool,
) {
    let mut rng = Rng(seed * 0x2F0_1D3B);
    let mut sizes = Rng(seed * 0x9E37_79B9 + 1);
    let Receiver {
        mut conn,
        mem,
        sink,
        start,
        ..
    } = receiver(true, true);
    let len = 196_608;
    let data: Vec<u8> = (0..len).map(|i| (i * 5 + seed as usize) as u8).collect();
    let fpdus = writes_fpdus_sized(&data, sink, true, true, mpa::mulpdu(688, true), || {
        write_len(&mut sizes)
    });
    let fpdu_max = fpdus.iter().map(|f| f.len() as u64).max().unwrap();
    let spans = spans(&fpdus);
    let stream: Vec<u8> = fpdus.concat();
    let mut pieces = Vec::new();
    let mut at = 0u64;
    while at < stream.len() as u64 {
        let n = (1 + rng.below(1448) as u64).min(stream.len() as u64 - at);
        pieces.push((at, at + n));
        at += n;
    }
    // (when it is delivered, piece)
    let mut order: Vec<(usize, (u64, u64))> = Vec::new();
    let mut sent = Vec::new();
    for (i, &(s, e)) in pieces.iter().enumerate() {
        let r = rng.below(100);
        let late = |rng: &mut Rng| i * 4 + 4 * (20 + rng.below(41));
        if r < loss_percent && recut {
            let mut a = s;
            while a < e {
                let b = (a + 1 + rng.below(700) as u64).min(e);
                order.push((late(&mut rng) * 2 + 1, (a, b)));
                sent.push((a, b));
                a = b;
            }
            continue;
        }
        let when = if r < loss_percent {
            late(&mut rng)
        } else if r < 2 * loss_percent {
            i * 4 + 4 * (1 + rng.below(8))
        } else {
            i * 4
        };
        order.push((when * 2 + 1, (s, e)));
        sent.push((s, e));
    }
    // The pieces as they arrive, retransmissions re-cut.
    let pieces = sent;
    order.sort();
    let mut pending: Vec<(u64, u64)> = Vec::new();
    let mut delivered = vec![false; pieces.len()];
    let mut rcv_max = 0u64;
    let mut worst = 0u64;
    for &(_, (s, e)) in &order {
        pass_up(
            &mut conn,
            start as u64 + s,
            &stream[s as usize..e as usize],
            &mem,
        );
        let i = pieces.partition_point(|p| p.0 < s);
        delivered[i] = true;
        rcv_max = rcv_max.max(e);
        pending.clear();
        for (k, &p) in pieces.iter().enumerate() {
            if p.0 >= rcv_max {
                break;
            }
            if !delivered[k] {
                match pending.last_mut() {
                    Some(h) if h.1 == p.0 => h.1 = p.1,
                    _ => pending.push(p),
                }
            }
        }
        let c = conn.counters();
        // The bound per gap that xdp_relay.rs checks (its `gap_bound`), after every piece.
        assert!(
            c.held_gap_peak < 2 * fpdu_max + 512,
            "seed {seed}: after [{s}, {e}), holes {pending:?}: {c:?}"
        );
        let held = c.held_bytes;
        let least = must_hold(&spans, &pending, rcv_max);
        assert!(held >= least, "seed {seed}: held {held} < {least}");
        // Per gap (and the end of what arrived), at most whole FPDUs shorter than the
        // Marker interval, and a Marker's octets cut off from their header.
        let slack = (pending.len() as u64 + 1) * (511 + 8);
        assert!(
            held - least <= slack,
            "seed {seed}: held {held}, must hold {least}, holes {pending:?}"
        );
        worst = worst.max(held - least);
    }
    let c = conn.counters();
    println!(
        "seed {seed}: store at most {worst} octets above the cut FPDUs' pieces; peak {} \
         octets at {} gaps, at most {} at one gap (FPDUs of at most {fpdu_max})",
        c.held_peak, c.held_peak_gaps, c.held_gap_peak
    );
    assert!(c.held_gap_peak < 2 * fpdu_max + 512, "seed {seed}: {c:?}");
    assert_eq!(c.held_bytes, 0, "seed {seed}");
    assert_eq!(c.fpdus_rx, fpdus.len() as u64, "seed {seed}");
    let got = mem.get(sink).unwrap().to_vec();
    assert!(got[..len] == data[..], "seed {seed}");
}

/// Writes of 16 octets, each followed by a zero-length Write, one FPDU per segment: the
/// 16-octet ones are placed early, the zero-length ones (nothing to place) are held, each its
/// own range between two placed FPDUs. With the first segment lost, the held ranges outnumber
/// the store's range list; a conforming peer's octets beyond it are given back to TCP (which
/// takes them again when the peer resends them), not taken for a broken peer (the connection
/// was ended with a local catastrophic Terminate).
#[test]
fn more_held_ranges_than_the_store_keeps_are_given_back_not_fatal() {
    const PAIRS: usize = 1100;
    let Receiver {
        mut conn,
        mem,
        sink,
        start,
        ..
    } = receiver(false, true);
    assert!(matches!(
        conn.poll_event(),
        Some(ConnEvent::Established { .. })
    ));
    let data: Vec<u8> = (0..PAIRS * 16).map(|i| (i * 5 + 1) as u8).collect();
    let mut src = MemoryTable::new();
    let stag = src.register(
        PD,
        VecBuffer::from_vec(data.clone()),
        0,
        Access::LOCAL_WRITE,
    );
    let mut qp = QueuePair::new(QpConfig {
        pd: PD,
        ..QpConfig::default()
    });
    qp.enter_rts(16, 16);
    let mut enc = FpduEncoder::new(true, false);
    let mut segs: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut off = start as u64;
    let mut ulpdu = Vec::new();
    for i in 0..PAIRS {
        for (len, to) in [(16u32, 16 * i as u64), (0, 0)] {
            qp.post_send(
                SendWr {
                    wr_id: i as u64,
                    op: SendOp::Write {
                        remote_stag: sink,
                        remote_to: SINK_TO + to,
                    },
                    sg_list: (len > 0).then_some(Sge { stag, to, len }).into(),
                    signaled: false,
                    fence: false,
                },
                &src,
            )
            .unwrap();
            while qp.poll_transmit(1024, &src, &mut ulpdu).is_some() {
                let mut fpdu = Vec::new();
                enc.encode(&ulpdu, &mut fpdu).unwrap();
                ulpdu.clear();
                segs.push((off, fpdu.clone()));
                off += fpdu.len() as u64;
            }
        }
    }
    assert_eq!(segs.len(), 2 * PAIRS);
    // As TCP: everything but the first segment, then the first; what was given back comes
    // again (the peer's retransmissions), in order, until nothing is given back.
    let mut taken_back: Option<u64> = None;
    let offer = |conn: &mut IwarpConn, taken_back: &mut Option<u64>, off: u64, bytes: &[u8]| {
        if taken_back.is_some_and(|at| off >= at) {
            return; // TCP took these back: they are not passed up.
        }
        let up = PassedUp {
            acked: 0,
            seq: 0,
            stream_offset: off,
            data: bytes,
        };
        if let Some(back) = conn.on_data(up, &mem) {
            assert!(back.from >= off, "only octets of this segment on");
            *taken_back = Some(taken_back.map_or(back.from, |at| at.min(back.from)));
        }
    };
    for (off, bytes) in &segs[1..] {
        offer(&mut conn, &mut taken_back, *off, bytes);
    }
    let c = conn.counters();
    assert!(c.store_refusals > 0, "the range list never filled: {c:?}");
    // Each held range is one zero-length Write's FPDU, a gap of its own. With this many
    // ranges the peaks' scans look at windows, and the gaps are counted within a sixteenth
    // of the peak.
    let fpdu = segs[1].1.len() as u64;
    assert_eq!((c.held_gap_peak, c.held_run_peak), (fpdu, fpdu), "{c:?}");
    assert!(c.held_peak_gaps * fpdu * 17 >= c.held_peak * 16, "{c:?}");
    assert!(c.held_peak_gaps * fpdu <= c.held_peak, "{c:?}");
    let ev = conn.poll_event();
    assert!(ev.is_none(), "a conforming peer failed: {ev:?} {c:?}");
    offer(&mut conn, &mut taken_back, segs[0].0, &segs[0].1);
    let at = taken_back.take().expect("octets given back");
    for (off, bytes) in segs.iter().filter(|(off, _)| *off >= at) {
        offer(&mut conn, &mut taken_back, *off, bytes);
    }
    assert!(taken_back.is_none(), "given back again in order");
    let c = conn.counters();
    assert!(conn.poll_event().is_none(), "{c:?}");
    assert_eq!(c.fpdus_rx, 2 * PAIRS as u64, "{c:?}");
    assert_eq!(c.held_bytes, 0, "{c:?}");
    let got = mem.get(sink).unwrap().to_vec();
    assert!(got[..data.len()] == data[..]);
}

/// A Marker between FPDUs (stream position 512) corrupted in flight, the FPDU after it
/// arriving first in a segment of its own (from its header at 516, so without the Marker's
/// octets): that FPDU is located and checked with the zero Marker a Marker between FPDUs is,
/// and placed. When the Marker's own segment comes, the Marker read in order must be that zero
/// Marker: with CRCs, any other octets fail the CRC (RFC 5044 4.4: the Marker is covered by
/// the FPDU after it), without them an FPDUPTR other than 0 fails the Marker check (4.3).
/// Before, the in-order pass forgot what it had read there and nothing failed. Reserved octets
/// other than zero without CRCs are ignored (4.3), and everything arrives.
#[test]
fn a_corrupted_marker_before_an_fpdu_placed_early_fails_the_connection() {
    for (crc, flip_at, fails) in [
        (true, 3, true),   // FPDUPTR
        (true, 0, true),   // reserved
        (false, 3, true),  // FPDUPTR
        (false, 0, false), // reserved: ignored without CRCs
    ] {
        let what = format!("crc {crc}, marker octet {flip_at}");
        let Receiver {
            mut conn,
            mem,
            sink,
            start,
            ..
        } = receiver(true, crc);
        let data: Vec<u8> = (0..4000).map(|i| (i * 3 + 1) as u8).collect();
        // A first Write whose FPDU ends at 512, then Writes of 600 octets: the FPDU after the
        // Marker holds the next Marker (1024), which points back at its header (without CRCs
        // only a Marker locates an FPDU).
        let fpdus = (1..600)
            .map(|first| {
                let mut lens = std::iter::once(first).chain(std::iter::repeat(600));
                writes_fpdus_sized(&data, sink, true, crc, 1024, || lens.next().unwrap())
            })
            .find(|f| f[0].len() == 512)
            .expect("a first Write that ends at 512");
        let mut stream = fpdus.concat();
        stream[512 + flip_at] ^= 0x04;
        let next_end = 512 + fpdus[1].len();
        let s = start as u64;
        pass_up(&mut conn, s + 516, &stream[516..next_end], &mem);
        assert!(
            conn.counters().fpdus_placed_out_of_order == 1,
            "{what}: the FPDU after the Marker was placed early: {:?}",
            conn.counters()
        );
        pass_up(&mut conn, s, &stream[..516], &mem);
        pass_up(&mut conn, s + next_end as u64, &stream[next_end..], &mem);
        let failed: Vec<ConnEvent> = std::iter::from_fn(|| conn.poll_event())
            .filter(|e| matches!(e, ConnEvent::MpaFailed(_)))
            .collect();
        if !fails {
            assert!(failed.is_empty(), "{what}: {failed:?}");
            assert!(
                mem.get(sink).unwrap().to_vec()[..data.len()] == data[..],
                "{what}"
            );
            continue;
        }
        match failed.as_slice() {
            [ConnEvent::MpaFailed(mpa::MpaError::LocatedMarkerCrcMismatch {
                marker_position: 512,
                ..
            })] if crc => {}
            [ConnEvent::MpaFailed(mpa::MpaError::MarkerMismatch {
                marker_position: 512,
                expected: 0,
                ..
            })] if !crc => {}
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(
            conn.counters().fpdus_rx,
            1,
            "{what}: only the first FPDU was taken"
        );
    }
}

/// A Write's last octet shows only once every octet before it has: the FPDU that ends the
/// message, arriving first, is placed but for that octet, which the in-order pass writes
/// when the FPDUs before it have come (an application polling the last octet, as perftest's
/// latency tests do, sees the whole message then). An FPDU that does not end its message is
/// placed whole.
#[test]
fn a_writes_last_octet_waits_for_the_octets_before_it() {
    for (markers, crc) in [(false, true), (true, true), (true, false)] {
        let what = format!("markers {markers}, crc {crc}");
        let Receiver {
            mut conn,
            mem,
            sink,
            start,
            ..
        } = receiver(markers, crc);
        let data: Vec<u8> = (0..6000).map(|i| (i % 251 + 1) as u8).collect();
        let fpdus = write_fpdus(&data, sink, markers, crc, 1000);
        assert!(fpdus.len() >= 6, "{what}");
        let offsets: Vec<usize> = fpdus
            .iter()
            .scan(0, |at, f| {
                let here = *at;
                *at += f.len();
                Some(here)
            })
            .collect();
        let s = start as u64;
        let (last, middle) = (fpdus.len() - 1, fpdus.len() - 2);
        // The last FPDU, then the one before it, both ahead of the in-order point.
        for i in [last, middle] {
            pass_up(&mut conn, s + offsets[i] as u64, &fpdus[i], &mem);
        }
        assert_eq!(conn.counters().fpdus_placed_out_of_order, 2, "{what}");
        let got = mem.get(sink).unwrap().to_vec();
        assert_eq!(
            got[data.len() - 1],
            0,
            "{what}: the last octet showed early"
        );
        let placed = got[..data.len() - 1].iter().filter(|&&b| b != 0).count();
        assert!(
            placed >= 1000 && got[data.len() - 2] == data[data.len() - 2],
            "{what}: the rest of the two FPDUs is placed ({placed} octets)"
        );
        // The FPDUs before them, in order: the message is whole.
        for i in 0..middle {
            pass_up(&mut conn, s + offsets[i] as u64, &fpdus[i], &mem);
        }
        let got = mem.get(sink).unwrap().to_vec();
        assert!(got[..data.len()] == data[..], "{what}");
        assert_eq!(conn.counters().fpdus_rx, fpdus.len() as u64, "{what}");
    }
}
