//! The iWARP engine over our own TCP.
//!
//! - [`conn`]: one connection, sans-IO: TCP (passed-up segments in, records out), MPA startup
//!   and Full Operation with out-of-order placement, and the queue pair.
//! - `tx`: the FPDU descriptors in flight and the fill that writes any stream range of them
//!   straight from registered memory into the packet buffer (no send-buffer copy).
//! - [`xdp`]: the poll-mode engine thread running `IwarpConn`s over AF_XDP behind the
//!   application API of the socket transport.

pub mod conn;
mod tx;

pub use conn::{ConnConfig, ConnCounters, ConnError, ConnEvent, IwarpConn};
pub mod xdp;

pub use xdp::{EngineCounters, XdpEngine, XdpEngineConfig};
