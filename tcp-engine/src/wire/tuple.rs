//! A connection's four-tuple (RFC 9293 3.4.1: "a connection is defined by a pair of
//! sockets", an address and a port at each end).

use core::net::Ipv4Addr;

/// A connection's addresses, from the local side's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FourTuple {
    /// Our address.
    pub local_addr: Ipv4Addr,
    /// Our port.
    pub local_port: u16,
    /// The peer's address.
    pub remote_addr: Ipv4Addr,
    /// The peer's port.
    pub remote_port: u16,
}
