//! RDMAP (RFC 5040) receive: `QueuePair::on_ulpdu` in order, and early (out-of-order)
//! placement with `place_early` followed by `on_placed_ulpdu` when the stream reaches the
//! segment (RFC 5041 5.3).
//!
//! The queue pair's memory is an `iwarp_fuzz::Arena`: regions between guard octets, every
//! write logged. Regions: two that take remote writes (one at the top of the 64-bit TO space),
//! one remote-read only, a receive region with posted receives of one to three elements, one
//! of another protection domain, a Read sink with outstanding Reads, one invalidated and one
//! deregistered. Knobs choose IRD/ORD, receives, Reads, an expected RTR, the MULPDU and the
//! RFC 7306 extensions (with an outstanding FetchAdd); a Send and a Write are always posted,
//! sent and left awaiting the peer's acknowledgement.
//!
//! Input: ULPDUs, each raw octets or a Write / Read Response / Send / Immediate Data / Read
//! Request / Atomic Request / Terminate / Atomic Response template with fields from the input
//! (STags picked among the regions', or any; a Terminate raw, or built as a peer writes one:
//! layer, type and code, and the copied header of a Read Request, Send or Write the queue
//! pair sent, with a segment length and a Read Request header),
//! and an arrival key: segments arriving ahead of the in-order point are placed early, the
//! rest of the processing happens in stream order.
//!
//! Asserts: nothing panics; no write leaves its region (guards unchanged, every logged write
//! in bounds); writes land only where the checks allow (anywhere in the remote-write regions,
//! inside a posted receive's elements, inside an outstanding Read's sink, nowhere else);
//! nothing is written once the queue pair has left RTS; at most one Terminate goes out and
//! nothing after it; no work request completes twice; a region a Send with Invalidate
//! invalidated takes no write after it. And, differentially: when neither run failed or left RTS and no two
//! writes overlapped, placing early gives the same memory, completions and transmitted
//! ULPDUs as processing everything in order (the ULPDUs only when nothing was written to a
//! region a Read Response may read: a Write placed early may show in the Response to a Read
//! Request before it).
#![no_main]

use std::ops::Range;

use iwarp_fuzz::{check_writes, Arena, ArenaRegion, Input, Templates, WriteRec};
use libfuzzer_sys::fuzz_target;
use rdmap::qp::{QpConfig, QueuePair, RecvWr, RtrKind, SendOp, SendWr, Sge, SgeList};
use rdmap::{Access, MemoryTable, Opcode, PdId, QpState, Stag, WcOpcode, WcStatus, WorkCompletion};

const PD: PdId = PdId(1);

/// Region indices (arena ids, in creation order).
const W: usize = 0;
const WR_TOP: usize = 1;
const R: usize = 2;
const RECV: usize = 3;
const FOREIGN: usize = 4;
const SINK: usize = 5;
const INVALID: usize = 6;
const GONE: usize = 7;
const REGIONS: usize = 8;

const BASES: [u64; REGIONS] = [
    0x1000,
    u64::MAX - 127,
    0x2000,
    0x3000,
    0x4000,
    0x5000,
    0x6000,
    0x7000,
];
const LENS: [usize; REGIONS] = [256, 128, 256, 512, 256, 384, 128, 64];
/// Where the bed's Write goes at the peer: what a Terminate naming it copies.
const PEER_WRITE: (u32, u64) = (0x9A00, 0x1000);

/// The setup a run needs, built the same way twice for the differential check.
#[derive(Clone, Copy)]
struct Knobs {
    ird: u16,
    ord: u16,
    recvs: usize,
    reads: usize,
    read_size: u32,
    rtr: Option<RtrKind>,
    mulpdu: usize,
    /// RFC 7306 on the queue pair; with it, one FetchAdd outstanding after the Reads.
    extensions: bool,
    /// A receive refused at posting (its element names a deregistered region) after the
    /// first: it completes in its place (`complete_recv_in_error`).
    refuse: bool,
}

struct Bed {
    arena: Arena,
    mem: MemoryTable<ArenaRegion>,
    qp: QueuePair,
    stags: [Stag; REGIONS],
    /// Where each region may be written.
    allowed: [Vec<Range<usize>>; REGIONS],
    completions: Vec<WorkCompletion>,
    sent: Vec<Vec<u8>>,
    terminates: usize,
    /// The receives' work request ids in posting order, the refused one included.
    recv_order: Vec<u64>,
}

fn bed(k: Knobs) -> Bed {
    let arena = Arena::new();
    let mut mem = MemoryTable::new();
    let access = [
        Access::REMOTE_WRITE,
        Access::ALL,
        Access::REMOTE_READ,
        Access::LOCAL_WRITE,
        Access::ALL,
        Access::LOCAL_WRITE,
        Access::REMOTE_WRITE,
        Access::ALL,
    ];
    let mut stags = [Stag(0); REGIONS];
    for i in 0..REGIONS {
        let region = arena.region(LENS[i], 0x10 + i as u8);
        assert_eq!(region.id(), i);
        let pd = if i == FOREIGN { PdId(2) } else { PD };
        stags[i] = mem.register(pd, region, BASES[i], access[i]);
    }
    mem.invalidate(stags[INVALID], PD).expect("invalidate");
    mem.deregister(stags[GONE]).expect("deregister");
    let mut allowed: [Vec<Range<usize>>; REGIONS] = Default::default();
    allowed[W].push(0..LENS[W]);
    allowed[WR_TOP].push(0..LENS[WR_TOP]);
    // Never written: R (remote read only), FOREIGN, INVALID, GONE; RECV and SINK only where
    // receives and Reads are posted below.
    allowed[R].clear();

    let mut qp = QueuePair::new(QpConfig {
        pd: PD,
        sq_depth: 8,
        rq_depth: 8,
        ird: k.ird,
        ord: k.ord,
        extensions: k.extensions,
    });
    if let Some(kind) = k.rtr {
        qp.expect_rtr(kind).expect("expect_rtr in Idle");
    }
    qp.enter_rts(k.ird, k.ord);
    // Receives: one element, two apart, three with an empty one, two adjacent.
    let layouts: [&[(u64, u32)]; 4] = [
        &[(0, 48)],
        &[(0, 16), (64, 32)],
        &[(0, 0), (8, 8), (40, 40)],
        &[(0, 64), (64, 64)],
    ];
    let mut recv_order = Vec::new();
    let refuse = |qp: &mut QueuePair, mem: &MemoryTable<ArenaRegion>, order: &mut Vec<u64>| {
        let refused = qp.post_recv(
            RecvWr {
                wr_id: 900,
                sg_list: Sge {
                    stag: stags[GONE],
                    to: BASES[GONE],
                    len: 8,
                }
                .into(),
            },
            mem,
        );
        assert!(refused.is_err(), "a receive into a deregistered region");
        qp.complete_recv_in_error(900, WcStatus::LocalProtectionError);
        order.push(900);
    };
    if k.refuse && k.recvs == 0 {
        refuse(&mut qp, &mem, &mut recv_order);
    }
    for (i, layout) in layouts.iter().take(k.recvs).enumerate() {
        let base = 128 * i as u64;
        let mut sg_list = SgeList::new();
        for &(off, len) in layout.iter() {
            let sge = Sge {
                stag: stags[RECV],
                to: BASES[RECV] + base + off,
                len,
            };
            sg_list.push(sge).expect("room");
            let start = (base + off) as usize;
            allowed[RECV].push(start..start + len as usize);
        }
        qp.post_recv(
            RecvWr {
                wr_id: 100 + i as u64,
                sg_list,
            },
            &mem,
        )
        .expect("post_recv");
        recv_order.push(100 + i as u64);
        if k.refuse && i == 0 {
            refuse(&mut qp, &mem, &mut recv_order);
        }
    }
    for i in 0..k.reads {
        let off = 128 * i as u64;
        let size = k.read_size.min(128);
        qp.post_send(
            SendWr {
                wr_id: 200 + i as u64,
                op: SendOp::Read {
                    remote_stag: Stag(0x9900 + i as u32),
                    remote_to: 0,
                },
                sg_list: Sge {
                    stag: stags[SINK],
                    to: BASES[SINK] + off,
                    len: size,
                }
                .into(),
                signaled: true,
                fence: false,
            },
            &mem,
        )
        .expect("post Read");
        allowed[SINK].push(off as usize..(off + u64::from(size)) as usize);
    }
    if k.extensions && k.reads < 3 {
        // Its Response writes the original value into the next free 8 octets of the sink.
        let off = 128 * k.reads as u64;
        qp.post_send(
            SendWr {
                wr_id: 300,
                op: SendOp::Atomic {
                    remote_stag: Stag(0x9990),
                    remote_to: 0,
                    op: rdmap::wire::AtomicOp::fetch_add(1),
                },
                sg_list: Sge {
                    stag: stags[SINK],
                    to: BASES[SINK] + off,
                    len: 8,
                }
                .into(),
                signaled: true,
                fence: false,
            },
            &mem,
        )
        .expect("post FetchAdd");
        allowed[SINK].push(off as usize..off as usize + 8);
    }
    // A Send and a Write, sent at once and then awaiting the peer's acknowledgement: a
    // Terminate may name either (by the Send's MSN, the Write's STag and TO).
    for (wr_id, op) in [
        (
            400,
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
        ),
        (
            401,
            SendOp::Write {
                remote_stag: Stag(PEER_WRITE.0),
                remote_to: PEER_WRITE.1,
            },
        ),
    ] {
        qp.post_send(
            SendWr {
                wr_id,
                op,
                sg_list: Sge {
                    stag: stags[R],
                    to: BASES[R],
                    len: 32,
                }
                .into(),
                signaled: true,
                fence: false,
            },
            &mem,
        )
        .expect("post a Send or Write");
    }
    let mut b = Bed {
        arena,
        mem,
        qp,
        stags,
        allowed,
        completions: Vec::new(),
        sent: Vec::new(),
        terminates: 0,
        recv_order,
    };
    b.drain(k.mulpdu);
    b.sent.clear();
    b
}

impl Bed {
    /// Everything the queue pair transmits now, and its completions.
    fn drain(&mut self, mulpdu: usize) {
        let mut out = Vec::new();
        while let Some(tx) = self.qp.poll_transmit(mulpdu, &self.mem, &mut out) {
            assert_eq!(tx.len, out.len());
            assert!(self.terminates == 0, "a ULPDU after the Terminate");
            if tx.opcode == Opcode::Terminate {
                self.terminates += 1;
                assert!(tx.last);
            }
            self.sent.push(std::mem::take(&mut out));
        }
        while let Some(wc) = self.qp.poll_completion() {
            assert!(
                self.completions.iter().all(|c| c.wr_id != wc.wr_id),
                "work request {} completed twice: {wc:?}",
                wc.wr_id
            );
            self.completions.push(wc);
        }
    }

    /// Receives complete in the order they were posted (verbs completes a receive queue in
    /// order), a refused one in its place: those completed so far are the first posted.
    fn check_recv_order(&self) {
        let done: Vec<u64> = self
            .completions
            .iter()
            .filter(|c| matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvImmediate))
            .map(|c| c.wr_id)
            .collect();
        assert!(
            self.recv_order.starts_with(&done),
            "receives completed out of order: {done:?}, posted {:?}",
            self.recv_order
        );
    }

    /// A region a Send with Invalidate invalidated (its receive's completion says so) takes no
    /// write from then on (RFC 5040 5.3): its allowed ranges go.
    fn forget_invalidated(&mut self) {
        for stag in self.completions.iter().filter_map(|c| c.invalidated) {
            if let Some(i) = self.stags.iter().position(|&s| s == stag) {
                self.allowed[i].clear();
            }
        }
    }

    /// Checks the writes logged since `from`; `frozen` when none may have happened.
    fn check_writes(&self, from: usize, frozen: bool) {
        let frozen = frozen.then_some("after leaving RTS");
        check_writes(&self.arena, &self.allowed, from, frozen, |_| {});
    }
}

/// One segment of the stream.
struct Ulpdu {
    bytes: Vec<u8>,
    key: u8,
}

fn ulpdus(input: &mut Input, templates: &Templates) -> Vec<Ulpdu> {
    let mut out = Vec::new();
    while !input.is_empty() && out.len() < 48 {
        let key = input.u8();
        let bytes = templates.ulpdu(input);
        out.push(Ulpdu { bytes, key });
    }
    out
}

fn header_len(ulpdu: &[u8]) -> usize {
    if ulpdu.first().is_some_and(|c| c & 0x80 != 0) {
        14
    } else {
        18
    }
}

/// Whether two logged writes overlap in one region.
fn overlapping(writes: &[WriteRec]) -> bool {
    writes.iter().enumerate().any(|(i, a)| {
        writes[i + 1..].iter().any(|b| {
            a.region == b.region
                && a.len > 0
                && b.len > 0
                && a.offset < b.offset + b.len
                && b.offset < a.offset + a.len
        })
    })
}

/// Processes `ulpdus` arriving in `arrival` order; returns whether any call failed.
fn run(b: &mut Bed, ulpdus: &[Ulpdu], arrival: &[usize], mulpdu: usize, early: bool) -> bool {
    let mut placed = vec![None; ulpdus.len()];
    let mut arrived = vec![false; ulpdus.len()];
    let mut next = 0;
    let mut failed = false;
    for &i in arrival {
        arrived[i] = true;
        if i != next {
            if early {
                let from = b.arena.write_count();
                let frozen = b.qp.state() != QpState::Rts;
                placed[i] = b.qp.place_early(&ulpdus[i].bytes, &b.mem);
                b.check_writes(from, frozen);
                if placed[i].is_some() {
                    assert!(!frozen, "placed early outside RTS");
                }
            }
            continue;
        }
        while next < ulpdus.len() && arrived[next] {
            let u = &ulpdus[next].bytes;
            let from = b.arena.write_count();
            let frozen = b.qp.state() != QpState::Rts;
            let result = match placed[next] {
                Some(p) => {
                    let h = header_len(u);
                    b.qp.on_placed_ulpdu(&u[..h], u.len() - h, p, &b.mem)
                }
                None => b.qp.on_ulpdu(u, &b.mem),
            };
            b.check_writes(from, frozen);
            if result.is_err() {
                failed = true;
                assert_ne!(b.qp.state(), QpState::Rts, "an error left the QP in RTS");
            }
            b.drain(mulpdu);
            b.forget_invalidated();
            next += 1;
        }
    }
    b.arena.check();
    b.check_recv_order();
    failed
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let k1 = input.u8();
    let k2 = input.u8();
    let knobs = Knobs {
        ird: u16::from(k1 & 3),
        ord: u16::from((k1 >> 2) & 3).max(1),
        recvs: usize::from((k1 >> 4) % 5),
        reads: usize::from(k2 & 3),
        read_size: match (k2 >> 2) & 3 {
            0 => 0,
            1 => 1,
            2 => 100,
            _ => 128,
        },
        rtr: match (k2 >> 4) & 3 {
            1 => Some(RtrKind::Send),
            2 => Some(RtrKind::Write),
            3 => Some(RtrKind::Read),
            _ => None,
        },
        mulpdu: 20 + usize::from(input.u8()) * 4,
        extensions: k2 & 0x40 != 0,
        refuse: k2 & 0x80 != 0,
    };
    let early = bed(knobs);
    let templates = Templates {
        stags: early.stags.iter().map(|s| s.raw()).collect(),
        bases: BASES.to_vec(),
        lens: LENS.to_vec(),
        peer_regions: vec![PEER_WRITE],
    };
    let segments = ulpdus(&mut input, &templates);
    let mut arrival: Vec<usize> = (0..segments.len()).collect();
    arrival.sort_by_key(|&i| segments[i].key);

    let mut a = early;
    let failed_a = run(&mut a, &segments, &arrival, knobs.mulpdu, true);
    let in_order: Vec<usize> = (0..segments.len()).collect();
    let mut b = bed(knobs);
    let failed_b = run(&mut b, &segments, &in_order, knobs.mulpdu, false);

    // Placing early never makes a stream fail that in-order processing takes.
    assert!(
        !failed_a || failed_b,
        "early placement failed a stream that processing in order did not"
    );
    let writes_a = a.arena.writes();
    let writes_b = b.arena.writes();
    let comparable = !failed_a
        && !failed_b
        && a.qp.state() == QpState::Rts
        && b.qp.state() == QpState::Rts
        && !overlapping(&writes_a)
        && !overlapping(&writes_b);
    if comparable {
        assert!(
            a.arena.snapshot() == b.arena.snapshot(),
            "early placement left other memory than in-order processing"
        );
        assert_eq!(a.completions, b.completions, "completions differ");
        // A Read Response is read from its region when it is sent: a Write placed early into
        // a remotely readable region may show in the Response to a Read Request before it
        // (RFC 5040 5.5 orders a Read only after the Writes before it).
        if !writes_a.iter().any(|w| w.region == WR_TOP && w.len > 0) {
            assert_eq!(a.sent, b.sent, "transmitted ULPDUs differ");
        }
    }
});
