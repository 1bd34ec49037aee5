//! tcp-engine: an MPA-aware TCP, sans-IO.
//!
//! Segments ([`wire`]) and the current time ([`Instant`]) go in; packets to
//! send and the next deadline come out. Nothing here reads a clock, opens a
//! socket or spawns a thread (quinn-proto / smoltcp style).
//!
//! * [`Connection`]: one connection (RFC 9293 state machine and the
//!   extensions listed in its module docs), with a record-oriented transmit
//!   mode and a pass-up receive mode for MPA (RFC 5044 5 and 6).
//! * [`table::ConnectionTable`]: O(1) 4-tuple demultiplexing, listeners
//!   with a backlog, RST replies, timer and transmit scheduling.
//! * [`sim`]: a deterministic lossy network for tests.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cc;
pub mod config;
pub mod conn;
pub mod isn;
pub mod ranges;
mod rdma_rx;
mod rdma_tx;
pub mod rtt;
pub mod seq;
pub mod sim;
pub mod syncookie;
pub mod table;
pub mod time;
mod timers;
pub mod wire;

pub use cc::{CongestionAlgorithm, CongestionControl, Cubic, NewReno, SlowStart};
pub use config::{Config, RxMode, TxMode};
pub use conn::{
    copy_to_pieces, fill_in_pieces, pieces_len, reset_reply, ConnStats, Connection, Event,
    PacketTooBigError, PassUpReply, PassedUp, SendError, State, TakeBack, TxSource, TxSourceError,
};
pub use isn::IsnGenerator;
pub use rdma_rx::{RdmaPlaced, RdmaPostError};
pub use rdma_tx::RdmaSend;
pub use time::Instant;
pub use wire::{FourTuple, SegmentRepr, WireError};
