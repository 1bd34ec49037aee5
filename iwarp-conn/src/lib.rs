//! One iWARP connection on our own TCP, sans-IO: bytes and time in, segments and events out.
//!
//! - [`conn`]: [`IwarpConn`], driving a `tcp_engine::Connection` in record-transmit /
//!   pass-up-receive mode: MPA startup (RFC 5044 7.1, RFC 6581), Full Operation with
//!   out-of-order placement (RFC 5041 5.3-5.4: an FPDU located in an out-of-order segment is
//!   placed at once, completions stay in order) and the RDMAP queue pair (RFC 5040); or IFT
//!   framing (draft-williams-iwarp-ift-01) with speculative placement.
//! - `tx`: the FPDU descriptors in flight and the fill that writes any stream range of them
//!   straight from registered memory into the packet buffer (no send-buffer copy), MPA's
//!   FPDUs or IFT's frames.
//! - [`ReassemblyBudget`]: memory for out-of-order data shared by many connections.
//! - [`rx_digest`]: a received segment's data read once for the TCP checksum and the CRC of the
//!   FPDU it holds.
//! - `written`: where received segments write and what each buffer has had written (IFT's
//!   rule that a speculative placement overwrites nothing placed before).
//!
//! No I/O, no threads, no clock reads: the AF_XDP engine in `datapath` runs these connections,
//! and the seeded simulator of `tcp_engine::sim` tests them. The few machine-level kernels the
//! data path needs (the one-pass copy with CRC and sum, prefetch) live in the `copy-crc` crate.

#![forbid(unsafe_code)]

mod budget;
pub mod conn;
pub mod rx_digest;
mod tx;
mod written;

pub use budget::ReassemblyBudget;
pub use conn::{
    rtr_kind, startup_terminate, ConnConfig, ConnCounters, ConnError, ConnEvent, IwarpConn,
    DEFAULT_HELD_TIMEOUT, UNSENDABLE_TERMINATE,
};
pub use rx_digest::{HeldCrc, SegmentDigest};
