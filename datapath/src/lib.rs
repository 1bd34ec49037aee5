//! The I/O side of the stack: the only crate that touches sockets, threads, clocks and raw memory.
//!
//! Today it offers the *socket transport*: the sans-IO `mpa`, `ddp` and `rdmap` crates running
//! over a kernel TCP socket (MPA's "dual stack", draft-ietf-rddp-mpa-01 6.1.4), behind an
//! application API in the verbs vocabulary (protection domain, memory region, queue pair,
//! completion queue) with rdma_cm-style connection setup (listen, connect with private data,
//! accept or reject with private data). The AF_XDP engine ([`engine::xdp::XdpEngine`]) offers
//! the same API over our own TCP.

mod copy_crc;
mod cq;
pub mod engine;
mod memory;
pub mod relay;
mod socket;
pub mod xdp_tcp;
pub mod xsk;

pub use cq::{Completion, CompletionQueue};
pub use memory::{MemoryRegion, PinnedBuffer, ProtectionDomain};
pub use mpa::{MpaConfig, Negotiated};
pub use rdmap::{
    Access, QpState, RecvWr, SendOp, SendWr, Sge, Stag, WcOpcode, WcStatus, WorkCompletion,
};
pub use socket::{
    connect, ConnectParams, ConnectRequest, Connection, Listener, QpStatus, QueuePair,
};

use std::io;

/// Errors of the I/O layer: connection setup, the transport, and local API misuse.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// A socket operation failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// MPA connection setup failed (the code is the RFC 5044 8 MPA error code).
    #[error("MPA error (code {code}): {0}", code = .0.code())]
    Mpa(#[from] mpa::MpaError),
    /// The responder rejected the connection (MPA Reply with R=1), with its private data.
    #[error("connection rejected by peer ({} bytes of private data)", .private_data.len())]
    Rejected {
        /// Private data from the Reply.
        private_data: Vec<u8>,
    },
    /// A local argument was invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// Memory for a region could not be allocated.
    #[error("could not allocate {0} bytes")]
    OutOfMemory(usize),
    /// The queue pair's engine has stopped (connection closed or in error).
    #[error("queue pair is no longer connected")]
    Disconnected,
    /// Connection setup did not finish in time.
    #[error("timed out during {0}")]
    Timeout(&'static str),
    /// The AF_XDP engine's driver failed (interface, XDP, AF_XDP, port, route).
    #[error("AF_XDP engine: {0}")]
    Xdp(#[from] xdp_tcp::XdpTcpError),
}

/// A seeded pseudo-random source for unit tests: each call gives a number below its argument
/// (a 64-bit LCG, the high bits).
#[cfg(test)]
pub(crate) fn test_rng(seed: u64) -> impl FnMut(usize) -> usize {
    let mut x = seed;
    move |m: usize| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize % m
    }
}
