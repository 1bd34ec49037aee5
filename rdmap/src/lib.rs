//! RDMAP (RFC 5040), sans-IO.
//!
//! - [`wire`]: the RDMAP control byte, the RDMA Read Request header and the Terminate
//!   header (RFC 5040 4).
//! - [`memory`]: STags, access rights, protection domains and the table of registered
//!   regions with the checks of RFC 5040 7.2 / RFC 5041 7.1.
//! - [`QueuePair`]: the sans-IO queue pair: work requests in, ULPDUs (DDP segments) out,
//!   received ULPDUs in, completions out, Terminate generation and flushing.
//!
//! No I/O, no threads, no clocks: bytes come in as slices and go out into caller
//! buffers.
//!
//! ```
//! use rdmap::qp::{QpConfig, QueuePair, SendOp, SendWr, Sge, WcStatus};
//! use rdmap::{Access, MemoryTable, PdId, VecBuffer};
//!
//! let cfg = QpConfig { pd: PdId(1), ..QpConfig::default() };
//! let (mut a, mut b) = (QueuePair::new(cfg), QueuePair::new(cfg));
//! a.enter_rts(16, 16);
//! b.enter_rts(16, 16);
//! let (mut mem_a, mut mem_b) = (MemoryTable::new(), MemoryTable::new());
//! let src = mem_a.register(PdId(1), VecBuffer::from_vec(vec![7; 3000]), 0, Access::NONE);
//! let dst = mem_b.register(PdId(1), VecBuffer::zeroed(3000), 0x1000, Access::REMOTE_WRITE);
//!
//! let write = SendOp::Write { remote_stag: dst, remote_to: 0x1000 };
//! let sg_list = Sge { stag: src, to: 0, len: 3000 }.into();
//! let wr = SendWr { wr_id: 1, op: write, sg_list, signaled: true, fence: false };
//! a.post_send(wr, &mem_a)?;
//!
//! // The transport: each ULPDU from A goes to B (here without MPA in between).
//! let mut ulpdu = Vec::new();
//! while let Some(_tx) = a.poll_transmit(1442, &mem_a, &mut ulpdu) {
//!     b.on_ulpdu(&ulpdu, &mut mem_b)?;
//!     ulpdu.clear();
//! }
//! assert_eq!(a.poll_completion().map(|wc| wc.status), Some(WcStatus::Success));
//! assert_eq!(mem_b.get(dst).map(|buf| buf.to_vec()), Some(vec![7; 3000]));
//! # Ok::<(), rdmap::RdmapError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
mod inline;
pub mod memory;
pub mod qp;
mod sge;
mod types;
pub mod wire;

pub use error::{RdmapError, TerminateCause, TerminateCode};
pub use inline::{InlineData, InlineTooLong, MAX_INLINE_DATA};
pub use memory::{
    Access, MemoryTable, PdId, RegionBuffer, RegionInfo, RegionLive, SharedBuffer, StagHint,
    StreamMember, TableVersion, VecBuffer,
};
pub use qp::{
    AtomicOp, InlineSendWr, PlacedEarly, QpConfig, QueuePair, RecvSource, RecvWr, RtrKind, SendOp,
    SendWr, Sge, SgeList, TerminateInfo, TxCompletion, TxPayload, TxSegment, TxUlpdu, WcOpcode,
    WcStatus, WorkCompletion, MAX_SGE,
};
pub use types::{AccessViolation, QpState, Stag};
pub use wire::{Opcode, ReadRequest, TerminateHeader};
