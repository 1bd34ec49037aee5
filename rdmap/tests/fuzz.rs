//! Arbitrary and near-valid ULPDUs fed to `on_ulpdu` never panic, never write outside a
//! region, never write where the checks forbid it, and any error yields exactly one
//! Terminate.

use std::cell::RefCell;

use proptest::prelude::*;
use rdmap::qp::{QpConfig, QpState, QueuePair, RecvWr, SendOp, SendWr, Sge};
use rdmap::{Access, MemoryTable, Opcode, PdId, RegionBuffer, Stag};

const PD: PdId = PdId(1);

/// A region buffer that checks every access is in bounds and records writes.
struct RecordingBuffer {
    bytes: RefCell<Vec<u8>>,
    writes: RefCell<Vec<(usize, usize)>>,
}

impl RecordingBuffer {
    fn new(len: usize) -> Self {
        RecordingBuffer {
            bytes: RefCell::new(vec![0; len]),
            writes: RefCell::new(Vec::new()),
        }
    }
}

impl RegionBuffer for RecordingBuffer {
    fn len(&self) -> usize {
        self.bytes.borrow().len()
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        let bytes = self.bytes.borrow();
        assert!(offset + dst.len() <= bytes.len(), "read out of bounds");
        dst.copy_from_slice(&bytes[offset..offset + dst.len()]);
    }

    fn write_at(&self, offset: usize, src: &[u8]) {
        let mut bytes = self.bytes.borrow_mut();
        assert!(offset + src.len() <= bytes.len(), "write out of bounds");
        bytes[offset..offset + src.len()].copy_from_slice(src);
        self.writes.borrow_mut().push((offset, src.len()));
    }
}

struct Target {
    qp: QueuePair,
    mem: MemoryTable<RecordingBuffer>,
    writable: Stag,
    readable: Stag,
    recv: Stag,
    foreign: Stag,
    sink: Stag,
}

const RECV_LEN: u32 = 48;

fn target() -> Target {
    let mut mem = MemoryTable::new();
    let writable = mem.register(PD, RecordingBuffer::new(256), 0x1000, Access::REMOTE_WRITE);
    let readable = mem.register(PD, RecordingBuffer::new(256), 0x2000, Access::REMOTE_READ);
    let recv = mem.register(PD, RecordingBuffer::new(256), 0x3000, Access::LOCAL_WRITE);
    let foreign = mem.register(PdId(2), RecordingBuffer::new(256), 0x4000, Access::ALL);
    let sink = mem.register(PD, RecordingBuffer::new(256), 0x5000, Access::LOCAL_WRITE);
    let mut qp = QueuePair::new(QpConfig {
        pd: PD,
        sq_depth: 8,
        rq_depth: 8,
        ird: 2,
        ord: 2,
        // RFC 7306's messages are parsed and checked too.
        extensions: true,
    });
    qp.enter_rts(2, 2);
    for i in 0..3u32 {
        let sge = Sge {
            stag: recv,
            to: 0x3000 + u64::from(i * 64),
            len: RECV_LEN,
        };
        qp.post_recv(
            RecvWr {
                wr_id: u64::from(i),
                sg_list: sge.into(),
            },
            &mem,
        )
        .unwrap();
    }
    // An outstanding Read, so Read Responses into `sink` can be placed.
    qp.post_send(
        SendWr {
            wr_id: 10,
            op: SendOp::Read {
                remote_stag: Stag(0x9900),
                remote_to: 0,
            },
            sg_list: Sge {
                stag: sink,
                to: 0x5000,
                len: 100,
            }
            .into(),
            signaled: true,
            fence: false,
        },
        &mem,
    )
    .unwrap();
    let mut out = Vec::new();
    let tx = qp.poll_transmit(128, &mem, &mut out).unwrap();
    assert_eq!(tx.opcode, Opcode::ReadRequest);
    Target {
        qp,
        mem,
        writable,
        readable,
        recv,
        foreign,
        sink,
    }
}

/// A segment description the strategy fills in; turned into bytes with the target's
/// real STags so that many inputs pass the first checks.
#[derive(Debug, Clone)]
enum Segment {
    Raw(Vec<u8>),
    Tagged {
        ctrl: u8,
        rdmap: u8,
        stag_pick: u8,
        stag_raw: u32,
        to: u64,
        payload: Vec<u8>,
    },
    Untagged {
        ctrl: u8,
        rdmap: u8,
        inval_pick: u8,
        qn: u32,
        msn: u32,
        mo: u32,
        payload: Vec<u8>,
    },
}

fn segment() -> impl Strategy<Value = Segment> {
    let ctrl_tagged = prop_oneof![Just(0xC1u8), Just(0x81u8), any::<u8>()];
    let ctrl_untagged = prop_oneof![Just(0x41u8), Just(0x01u8), any::<u8>()];
    let rdmap = prop_oneof![(0x40u8..=0x47), any::<u8>()];
    let to = prop_oneof![
        (0u64..0x600).prop_map(|o| 0x1000 + o),
        (0u64..0x300).prop_map(|o| 0x5000 + o),
        any::<u64>(),
        (0u64..16).prop_map(|o| u64::MAX - o),
    ];
    let payload = prop::collection::vec(any::<u8>(), 0..80);
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..60).prop_map(Segment::Raw),
        (
            ctrl_tagged,
            rdmap.clone(),
            0u8..6,
            any::<u32>(),
            to,
            payload.clone()
        )
            .prop_map(
                |(ctrl, rdmap, stag_pick, stag_raw, to, payload)| Segment::Tagged {
                    ctrl,
                    rdmap,
                    stag_pick,
                    stag_raw,
                    to,
                    payload
                }
            ),
        (
            ctrl_untagged,
            rdmap,
            0u8..6,
            prop_oneof![0u32..4, any::<u32>()],
            prop_oneof![1u32..5, any::<u32>()],
            prop_oneof![0u32..64, any::<u32>()],
            payload,
        )
            .prop_map(|(ctrl, rdmap, inval_pick, qn, msn, mo, payload)| {
                Segment::Untagged {
                    ctrl,
                    rdmap,
                    inval_pick,
                    qn,
                    msn,
                    mo,
                    payload,
                }
            }),
    ]
}

fn pick(t: &Target, which: u8, raw: u32) -> u32 {
    match which {
        0 => t.writable.raw(),
        1 => t.readable.raw(),
        2 => t.recv.raw(),
        3 => t.foreign.raw(),
        4 => t.sink.raw(),
        _ => raw,
    }
}

fn bytes_of(t: &Target, seg: &Segment) -> Vec<u8> {
    match seg {
        Segment::Raw(b) => b.clone(),
        Segment::Tagged {
            ctrl,
            rdmap,
            stag_pick,
            stag_raw,
            to,
            payload,
        } => {
            let mut v = vec![*ctrl, *rdmap];
            v.extend_from_slice(&pick(t, *stag_pick, *stag_raw).to_be_bytes());
            v.extend_from_slice(&to.to_be_bytes());
            v.extend_from_slice(payload);
            v
        }
        Segment::Untagged {
            ctrl,
            rdmap,
            inval_pick,
            qn,
            msn,
            mo,
            payload,
        } => {
            let mut v = vec![*ctrl, *rdmap];
            v.extend_from_slice(&pick(t, *inval_pick, 0x1234).to_be_bytes());
            v.extend_from_slice(&qn.to_be_bytes());
            v.extend_from_slice(&msn.to_be_bytes());
            v.extend_from_slice(&mo.to_be_bytes());
            v.extend_from_slice(payload);
            v
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_ulpdus_never_panic_or_write_out_of_place(
        segments in prop::collection::vec(segment(), 1..8),
        mulpdu in 20usize..300,
    ) {
        let mut t = target();
        let mut failed = false;
        let mut terminates = 0;
        for seg in &segments {
            let bytes = bytes_of(&t, seg);
            let result = t.qp.on_ulpdu(&bytes, &t.mem);
            failed |= result.is_err();
            let mut out = Vec::new();
            while let Some(tx) = t.qp.poll_transmit(mulpdu, &t.mem, &mut out) {
                prop_assert_eq!(tx.len, out.len());
                if tx.opcode == Opcode::Terminate {
                    terminates += 1;
                    prop_assert!(tx.last);
                } else {
                    prop_assert!(terminates == 0, "nothing after a Terminate");
                }
                out.clear();
            }
        }
        if failed {
            prop_assert_eq!(terminates, 1);
            prop_assert_eq!(t.qp.state(), QpState::Error);
        }
        // Regions without a write path never see a write.
        for stag in [t.readable, t.foreign] {
            prop_assert!(t.mem.get(stag).unwrap().writes.borrow().is_empty());
        }
        // Receive buffers are written only inside posted receive elements.
        for &(offset, len) in t.mem.get(t.recv).unwrap().writes.borrow().iter() {
            let slot = offset / 64;
            prop_assert!(slot < 3);
            prop_assert!(offset + len <= slot * 64 + RECV_LEN as usize);
        }
        // The Read sink is written only inside the requested 100 octets.
        for &(offset, len) in t.mem.get(t.sink).unwrap().writes.borrow().iter() {
            prop_assert!(offset + len <= 100);
        }
    }
}
