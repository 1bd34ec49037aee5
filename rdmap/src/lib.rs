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

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
pub mod memory;
pub mod qp;
pub mod wire;

pub use error::{RdmapError, TerminateCause, TerminateCode};
pub use memory::{
    Access, AccessViolation, MemoryTable, PdId, RegionBuffer, RegionInfo, Stag, VecBuffer,
};
pub use qp::QpState;
pub use wire::{Opcode, ReadRequest, TerminateHeader};
