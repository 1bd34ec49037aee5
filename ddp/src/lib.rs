//! Direct Data Placement, RFC 5041, sans-IO.
//!
//! - [`wire`]: the tagged and untagged headers (section 4) and a checked segment view.
//! - [`Segmenter`]: splitting a message into segments at the data source (5.2).
//! - [`check_tagged`]: the tagged receiver checks of 7.1 that DDP itself can make.
//! - [`UntaggedQueue`]: one QN's posted buffers, the untagged receiver checks of 7.1,
//!   out-of-order/repeated placement and in-order delivery (5.3, 5.4).
//! - [`MessageTracker`]: placed-range bookkeeping for one message (used by the queue).
//!
//! `rdmap` runs [`wire`], [`UntaggedQueue`] and [`DdpError`]. It does not run [`Segmenter`]
//! or [`check_tagged`]: its queue pair cuts segments at gather-list boundaries as well as at
//! MULPDU, and `rdmap::MemoryTable` checks a tagged sink's bounds and wrap together with its
//! STag, PD and access rights; a Read Response is tracked by its outstanding Read, not by a
//! [`MessageTracker`]. The two stand as the RFC's data-source and tagged-sink rules on their
//! own, for other ULPs, and are tested and fuzzed as such.
//! - [`DdpError`]: every error, mapped to the 7.2 numbers by [`DdpError::etype`] and
//!   [`DdpError::code`].
//!
//! No I/O, no clock, no threads; no `unsafe`.
//!
//! ```
//! use ddp::{DdpHeader, Segmenter, UntaggedHeader, UntaggedQueue, UNTAGGED_HEADER_LEN};
//!
//! // Data source: a 3000-octet Send on QN 0, MSN 1, MULPDU 1442.
//! let message = vec![7u8; 3000];
//! let mut wire = Vec::new();
//! for plan in Segmenter::new(message.len() as u64, 1442 - UNTAGGED_HEADER_LEN) {
//!     let hdr = UntaggedHeader::for_segment(&plan, [0x43, 0, 0, 0, 0], 0, 1).unwrap();
//!     let mut ulpdu = vec![0u8; UNTAGGED_HEADER_LEN];
//!     hdr.emit(&mut ulpdu);
//!     let start = plan.offset as usize;
//!     ulpdu.extend_from_slice(&message[start..start + plan.len]);
//!     wire.push(ulpdu);
//! }
//!
//! // Data sink: one posted 4096-octet buffer; segments arrive last first.
//! let mut queue = UntaggedQueue::new(0, 16);
//! let mut buffer = vec![0u8; 4096];
//! queue.post(4096, 0usize)?;
//! for ulpdu in wire.iter().rev() {
//!     let (DdpHeader::Untagged(hdr), payload) = DdpHeader::parse(ulpdu)? else {
//!         unreachable!("only untagged segments were sent");
//!     };
//!     let placement = queue.place(&hdr, payload.len())?;
//!     let at = placement.offset as usize;
//!     buffer[at..at + payload.len()].copy_from_slice(payload);
//! }
//! let delivered = queue.poll_delivery().expect("all segments placed");
//! assert_eq!((delivered.msn, delivered.len), (1, 3000));
//! assert_eq!(&buffer[..3000], &message[..]);
//! # Ok::<(), ddp::DdpError>(())
//! ```
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
