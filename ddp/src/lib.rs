//! Direct Data Placement, RFC 5041, sans-IO.
//!
//! - [`wire`]: the tagged and untagged headers (section 4) and a checked segment view.
//! - [`Segmenter`]: splitting a message into segments at the data source (5.2).
//! - [`check_tagged`]: the tagged receiver checks of 7.1 that DDP itself can make.
//! - [`UntaggedQueue`]: one QN's posted buffers, the untagged receiver checks of 7.1,
//!   out-of-order/repeated placement and in-order delivery (5.3, 5.4).
//! - [`MessageTracker`]: placed-range bookkeeping for one message (used by the queue,
//!   and usable by the ULP for tagged messages).
//! - [`DdpError`]: every error, mapped to the 7.2 numbers by [`DdpError::etype`] and
//!   [`DdpError::code`].
//!
//! No I/O, no clock, no threads; no `unsafe`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod segmenter;
mod tagged;
mod tracker;
mod untagged;
pub mod wire;

pub use error::{etype, DdpError};
pub use segmenter::{SegmentPlan, Segmenter};
pub use tagged::{check_tagged, TaggedBuffer};
pub use tracker::{MessageTracker, MAX_TRACKED_RANGES};
pub use untagged::{Delivered, Placement, UntaggedQueue, INITIAL_MSN};
pub use wire::{
    DdpHeader, DdpSegment, TaggedHeader, UntaggedHeader, DDP_VERSION, TAGGED_HEADER_LEN,
    UNTAGGED_HEADER_LEN,
};
