//! The iWARP engine over our own TCP.
//!
//! - [`conn`]: one connection, sans-IO (the `iwarp-conn` crate, re-exported): TCP (passed-up
//!   segments in, records out), MPA startup and Full Operation with out-of-order placement, and
//!   the queue pair.
//! - [`xdp`]: the poll-mode engine thread running `IwarpConn`s over AF_XDP behind the
//!   application API.

pub use iwarp_conn::conn;
pub use iwarp_conn::{ConnConfig, ConnCounters, ConnError, ConnEvent, IwarpConn, ReassemblyBudget};
pub mod xdp;

pub use xdp::{EngineCounters, XdpEngine, XdpEngineConfig};
