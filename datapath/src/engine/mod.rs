//! The iWARP engine over our own TCP.
//!
//! - [`conn`]: one connection, sans-IO: TCP (passed-up segments in, records out), MPA startup
//!   and Full Operation with out-of-order placement, and the queue pair.

pub mod conn;

pub use conn::{ConnConfig, ConnCounters, ConnError, ConnEvent, IwarpConn};
