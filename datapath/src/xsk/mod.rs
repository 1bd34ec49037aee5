//! The AF_XDP port: UMEM, fill/completion/RX/TX rings and a frame allocator, on `xsk-rs`.
//!
//! One [`XskSocket`] is one AF_XDP socket bound to one queue of one interface, with **its own
//! UMEM** (one UMEM per queue, not a shared one): each queue is meant to be owned by one engine
//! thread, so no frame ever crosses threads and nothing needs a lock; the cost is memory (a
//! default socket holds 4096 frames of 4 KiB = 16 MiB). For several queues, open one socket per
//! queue ([`XskSocket::open_queues`]).
//!
//! The socket does not load an XDP program (libxdp's default program is inhibited): the caller
//! attaches the project's steering program (`xdp-prog`) and puts [`XskSocket::fd`] into its
//! XSKMAP with `SteeringProgram::bind_socket(queue, fd)`.
//!
//! Receive: frames cycle between the fill ring and the RX ring. [`XskSocket::recv_batch`] takes up
//! to a batch of received frames and returns an [`RxBatch`] of borrowed views into the UMEM;
//! dropping the batch gives the frames back to the fill ring. Transmit: a free list of TX frames
//! (preallocated, no allocation per packet); [`XskSocket::send_batch`] fills frames through a
//! callback, puts them on the TX ring and kicks the kernel with `sendto` once per
//! [`XskConfig::kick_batch`] frames (copy mode, as on veth, sends at most 32 frames per kick);
//! completions, reaped after each kick, return the frames to the top of the free list (a stack),
//! so the frames written next are the ones the kernel has just read.
//!
//! Also here: interface facts, route and neighbour (ARP) lookup over rtnetlink
//! ([`interface_info`], [`resolve_next_hop`]), frame building ([`packet`]), and
//! [`enter_netns`] for a thread that must work in another network namespace.

mod netlink;
pub mod packet;
mod socket;

pub use netlink::{interface_info, neighbour, resolve_next_hop, route_to, InterfaceInfo, Route};
pub use socket::{BindMode, RxBatch, XskConfig, XskSocket, XskStats};
/// The steering program and its loader (the `xdp-prog` crate), re-exported for callers of this
/// module: attach it, steer ports or flows, and put each socket's fd into its XSKMAP.
pub use xdp_prog as steering;

use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Errors of the AF_XDP port.
#[derive(Debug, thiserror::Error)]
pub enum XskError {
    /// The kernel refused for lack of privilege.
    #[error(
        "permission denied while {op}: AF_XDP needs root (CAP_NET_RAW, CAP_NET_ADMIN, CAP_IPC_LOCK); running as uid {uid}"
    )]
    NotRoot {
        /// What was being done.
        op: &'static str,
        /// The effective user id.
        uid: u32,
    },
    /// No interface of that name in this network namespace.
    #[error("interface {0:?} not found in this network namespace")]
    InterfaceNotFound(String),
    /// The interface has no IPv4 address.
    #[error("interface {0:?} has no IPv4 address")]
    NoIpv4Address(String),
    /// The queue does not exist on the interface.
    #[error("queue {queue} out of range: {ifname} has {queues} queue(s)")]
    QueueOutOfRange {
        /// Interface.
        ifname: String,
        /// Requested queue.
        queue: u32,
        /// Queues available (the smaller of RX and TX).
        queues: u32,
    },
    /// The kernel or the interface does not support AF_XDP (in the requested bind mode).
    #[error("no AF_XDP support for {ifname} queue {queue} ({detail}): {source}")]
    NoXdpSupport {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
        /// What failed.
        detail: &'static str,
        /// The kernel's error.
        source: io::Error,
    },
    /// The queue stayed busy (bound by another AF_XDP socket, or not yet released by one that
    /// just closed) through every bind attempt.
    #[error("{ifname} queue {queue} still busy (EBUSY) after {attempts} bind attempts over {waited:?}: another AF_XDP socket holds it")]
    Busy {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
        /// Bind attempts made.
        attempts: u32,
        /// Time spent retrying.
        waited: Duration,
    },
    /// UMEM or socket setup failed otherwise.
    #[error("AF_XDP setup failed for {ifname} queue {queue} ({detail}): {source}")]
    Setup {
        /// Interface.
        ifname: String,
        /// Queue.
        queue: u32,
        /// What failed.
        detail: &'static str,
        /// The kernel's error.
        source: io::Error,
    },
    /// A configuration value is invalid.
    #[error("invalid AF_XDP configuration: {0}")]
    InvalidConfig(&'static str),
    /// Kicking the kernel (sendto/poll) failed.
    #[error("AF_XDP wakeup failed: {0}")]
    Wakeup(io::Error),
    /// Talking to the kernel over rtnetlink failed.
    #[error("netlink: {0}")]
    Netlink(io::Error),
    /// No route to the address.
    #[error("no route to {0}")]
    NoRoute(Ipv4Addr),
    /// The neighbour table has no usable entry for the address even after asking the kernel to
    /// resolve it.
    #[error("could not resolve the MAC address of {ip} within {waited:?} (no ARP reply)")]
    NeighbourUnresolved {
        /// Next-hop address.
        ip: Ipv4Addr,
        /// How long we waited.
        waited: Duration,
    },
    /// Entering a network namespace failed.
    #[error("cannot enter network namespace {name:?}: {source}")]
    Netns {
        /// Namespace name (under /run/netns).
        name: String,
        /// The error.
        source: io::Error,
    },
}

/// The effective user id.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Moves the calling thread into the network namespace `name` (a file under `/run/netns`, as
/// made by `ip netns add`). Sockets the thread creates afterwards (AF_XDP, netlink, UDP, TCP)
/// belong to that namespace; other threads are not affected. Needs CAP_SYS_ADMIN.
pub fn enter_netns(name: &str) -> Result<(), XskError> {
    let err = |source| XskError::Netns {
        name: name.to_owned(),
        source,
    };
    let f = File::open(format!("/run/netns/{name}")).map_err(err)?;
    // SAFETY: `f` is an open namespace file for the duration of the call; setns only reads the
    // descriptor and changes the calling thread's network namespace, nothing in this process's
    // memory.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(err(io::Error::last_os_error()));
    }
    Ok(())
}
