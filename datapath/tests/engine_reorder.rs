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
    conn.on_data(
        PassedUp {
            seq: 0,
            stream_offset: 0,
            data: &request,
        },
        &mut mem,
    );
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
    qp.post_send(
        SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_stag: sink,
                remote_to: SINK_TO,
            },
            local: Some(Sge {
                stag,
                to: 0,
                len: data.len() as u32,
            }),
        },
        &src,
    )
    .unwrap();
    let mut enc = FpduEncoder::new(crc, markers);
    let mut out = Vec::new();
    let mut ulpdu = Vec::new();
    while qp.poll_transmit(mulpdu, &src, &mut ulpdu).is_some() {
        let mut fpdu = Vec::new();
        enc.encode(&ulpdu, &mut fpdu).unwrap();
        out.push(fpdu);
        ulpdu.clear();
    }
    out
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
            mut mem,
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
            conn.on_data(
                PassedUp {
                    seq: 0,
                    stream_offset: start as u64 + off,
                    data: bytes,
                },
                &mut mem,
            );
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
            mut mem,
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
            conn.on_data(
                PassedUp {
                    seq: 0,
                    stream_offset: start as u64 + off,
                    data: bytes,
                },
                &mut mem,
            );
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
