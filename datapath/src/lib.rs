//! The I/O side of the stack: the only crate that touches sockets, threads, clocks and raw memory.
//!
//! Today it offers the *socket transport*: the sans-IO `mpa`, `ddp` and `rdmap` crates running
//! over a kernel TCP socket (MPA's "dual stack", draft-ietf-rddp-mpa-01 6.1.4), behind an
//! application API in the verbs vocabulary (protection domain, memory region, queue pair,
//! completion queue) with rdma_cm-style connection setup (listen, connect with private data,
//! accept or reject with private data). The AF_XDP engine ([`engine::xdp::XdpEngine`]) offers
//! the same API over our own TCP.

mod copy_crc;
mod device;
pub mod engine;
mod error;
mod memory;
pub mod relay;
mod socket;
mod verbs;
pub mod xdp_tcp;
pub mod xsk;

pub use device::{Device, Transport};
pub use error::{DatapathError, QpError};
pub use memory::{MemoryRegion, PinnedBuffer, Pinning, ProtectionDomain, RegionStorage};
pub use mpa::{MpaConfig, Negotiated};
pub use rdmap::{
    Access, QpState, RecvWr, SendOp, SendWr, Sge, SgeList, Stag, WcOpcode, WcStatus,
    WorkCompletion, MAX_SGE,
};
pub use socket::connect;
pub use verbs::cm::{ConnectParams, ConnectRequest, Connection, Listener};
pub use verbs::cm_events::{CmEvent, CmEventChannel, NotifyingListener};
pub use verbs::cq::{Completion, CompletionChannel, CompletionQueue};
pub use verbs::qp::{QpStatus, QueuePair};
pub use verbs::srq::SharedReceiveQueue;

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
