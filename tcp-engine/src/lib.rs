//! tcp-engine: an MPA-aware TCP, sans-IO.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod seq;
pub mod time;
pub mod wire;

pub use time::Instant;
