//! IFT, the iWARP Framing for TCP of `draft-williams-iwarp-ift-01` (February 2003), sans-IO:
//! an experimental alternative to MPA (RFC 5044) for carrying DDP segments over TCP, built to
//! be compared with MPA on the same stack.
//!
//! Where MPA puts a length, PAD and one CRC around each ULPDU and Markers in the stream, IFT
//! frames a DDP segment with its two lengths, the receiver's VTag, an optional CRC over the
//! headers and an optional CRC over the payload, no padding and no required Markers
//! (draft section 5.1), so that a receiver can check a frame's header before it places the
//! payload. The connection starts with a two-phase exchange of 64-octet adaption indications
//! (section 4) that agrees on the CRCs, the VTags, RDMA or DDP mode and whether the receiver
//! may place out-of-order segments speculatively (section 8).
//!
//! - [`wire`]: the adaption indication (checked view and [`IndicationRepr`]) and the frame
//!   header, with byte-array tests from the draft's figures.
//! - [`Initiator`] / [`Responder`]: the exchange, with its deadline, as bytes and time in,
//!   bytes and a [`Negotiated`] out.
//! - [`FrameEncoder`] / [`FrameDecoder`]: frames out, and frames from a byte stream taken in
//!   any pieces, every length and CRC checked.
//!
//! Readings and choices (documented where they apply): section 5.1's header CRC covers the
//! IFT header's sizes; we take the VTag (section 8.1's "IFT VTag") as part of that header, so
//! it covers the six octets before the DDP header (both sizes and the VTag); the CRCs are
//! CRC32c as MPA's and go on the wire as MPA's do; the DDP header is 14 octets for a tagged
//! and 18 for an untagged segment (RFC 5041 4.2, 4.3; the RDMAP control octet is in it), the
//! rest of the ULPDU (RDMAP headers included, as section 5.1 says) is the payload. Markers
//! (section 9, "TBD") are not implemented: we never set SM or RM, so by section 4.2's rule no
//! Markers flow in either direction.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod frame;
mod startup;
pub mod wire;

pub use error::IftError;
pub use frame::{
    whole_frame_at, Frame, FrameDecoder, FrameEncoder, FrameFormat, MAX_FRAME_LEN, MIN_MULPDU,
};
pub use startup::{CrcPolicy, IftConfig, Initiator, Negotiated, Responder};
pub use wire::{IndicationRepr, Phase};
