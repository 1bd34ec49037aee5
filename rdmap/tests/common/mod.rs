//! Test harness: two queue pairs wired back to back, each with its own memory table.

#![allow(dead_code)]

use rdmap::qp::{QpConfig, QueuePair, RecvWr, SendOp, SendWr, Sge, TxUlpdu, WorkCompletion};
use rdmap::{Access, MemoryTable, Opcode, PdId, RdmapError, Stag, VecBuffer};

pub const PD: PdId = PdId(1);

/// One endpoint: its queue pair and its memory.
pub struct Peer {
    pub qp: QueuePair,
    pub mem: MemoryTable<VecBuffer>,
}

impl Peer {
    pub fn new(cfg: QpConfig) -> Peer {
        let mut qp = QueuePair::new(cfg);
        qp.enter_rts(cfg.ird, cfg.ord);
        Peer {
            qp,
            mem: MemoryTable::new(),
        }
    }

    pub fn region(&mut self, bytes: Vec<u8>, base_to: u64, access: Access) -> Stag {
        self.mem
            .register(PD, VecBuffer::from_vec(bytes), base_to, access)
    }

    pub fn contents(&self, stag: Stag) -> Vec<u8> {
        self.mem.get(stag).expect("registered").to_vec()
    }

    pub fn completions(&mut self) -> Vec<WorkCompletion> {
        std::iter::from_fn(|| self.qp.poll_completion()).collect()
    }

    pub fn post_recv(&mut self, wr_id: u64, stag: Stag, to: u64, len: u32) {
        self.qp
            .post_recv(
                RecvWr {
                    wr_id,
                    sg_list: Sge { stag, to, len }.into(),
                },
                &self.mem,
            )
            .expect("post_recv");
    }

    pub fn post(&mut self, wr_id: u64, op: SendOp, local: Option<Sge>) {
        self.post_signaled(wr_id, op, local, true);
    }

    /// [`Peer::post`] with [`SendWr::signaled`] as given.
    pub fn post_signaled(&mut self, wr_id: u64, op: SendOp, local: Option<Sge>, signaled: bool) {
        self.qp
            .post_send(
                SendWr {
                    wr_id,
                    op,
                    sg_list: local.into(),
                    signaled,
                    fence: false,
                },
                &self.mem,
            )
            .expect("post_send");
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// One ULPDU that went over the wire.
#[derive(Debug, Clone)]
pub struct Transfer {
    pub from: Side,
    pub tx: TxUlpdu,
    pub bytes: Vec<u8>,
    pub result: Result<(), RdmapError>,
}

impl Transfer {
    pub fn opcode(&self) -> Opcode {
        self.tx.opcode
    }

    /// STag of a tagged segment.
    pub fn stag(&self) -> Option<u32> {
        (self.bytes[0] & 0x80 != 0)
            .then(|| u32::from_be_bytes(self.bytes[2..6].try_into().unwrap()))
    }
}

pub struct Pair {
    pub a: Peer,
    pub b: Peer,
    pub mulpdu: usize,
    pub log: Vec<Transfer>,
}

impl Pair {
    pub fn new(mulpdu: usize) -> Pair {
        Pair::with_configs(mulpdu, config(), config())
    }

    pub fn with_configs(mulpdu: usize, a: QpConfig, b: QpConfig) -> Pair {
        Pair {
            a: Peer::new(a),
            b: Peer::new(b),
            mulpdu,
            log: Vec::new(),
        }
    }

    /// Moves at most one ULPDU from `from` to the other side; true if one moved.
    pub fn step(&mut self, from: Side) -> bool {
        let (src, dst) = match from {
            Side::A => (&mut self.a, &mut self.b),
            Side::B => (&mut self.b, &mut self.a),
        };
        let mut buf = Vec::new();
        let Some(tx) = src.qp.poll_transmit(self.mulpdu, &src.mem, &mut buf) else {
            return false;
        };
        assert_eq!(
            tx.len,
            buf.len(),
            "TxUlpdu.len must match the bytes appended"
        );
        assert!(
            tx.len <= self.mulpdu.max(70),
            "ULPDU of {} octets exceeds MULPDU {}",
            tx.len,
            self.mulpdu
        );
        let result = dst.qp.on_ulpdu(&buf, &dst.mem);
        self.log.push(Transfer {
            from,
            tx,
            bytes: buf,
            result,
        });
        true
    }

    /// Runs both directions until neither has anything to send: A drains first, then B,
    /// and so on.
    pub fn pump(&mut self) {
        for _ in 0..10_000_000 {
            let mut moved = false;
            while self.step(Side::A) {
                moved = true;
            }
            while self.step(Side::B) {
                moved = true;
            }
            if !moved {
                return;
            }
        }
        panic!("pump did not settle");
    }

    /// Runs both directions one ULPDU at a time, alternating.
    pub fn pump_alternating(&mut self) {
        for _ in 0..10_000_000 {
            let a = self.step(Side::A);
            let b = self.step(Side::B);
            if !a && !b {
                return;
            }
        }
        panic!("pump_alternating did not settle");
    }

    pub fn sent_by(&self, side: Side) -> impl Iterator<Item = &Transfer> {
        self.log.iter().filter(move |t| t.from == side)
    }
}

pub fn config() -> QpConfig {
    QpConfig {
        pd: PD,
        sq_depth: 64,
        rq_depth: 64,
        ird: 8,
        ord: 8,
        extensions: false,
    }
}

/// [`config`] with the RFC 7306 extensions on.
pub fn config_ext() -> QpConfig {
    QpConfig {
        extensions: true,
        ..config()
    }
}

/// A deterministic byte pattern that differs per `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(u32::from(seed) * 7) as u8
                ^ (i >> 8) as u8
        })
        .collect()
}
