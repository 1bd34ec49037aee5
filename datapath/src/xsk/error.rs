//! Errors of the AF_XDP port ([`XskError`]) and the effective-uid helper they report.
//!
//! A leaf module: the children of `xsk` (`netlink`, `socket`) import from here, and `xsk`
//! re-exports [`XskError`], so no child has to reach back into its parent.

use std::io;
use std::net::Ipv4Addr;
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
}

/// The effective user id.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}
