//! Vocabulary types shared by the other modules: [`Stag`], [`AccessViolation`] and
//! [`QpState`].
//!
//! A leaf module (it imports nothing from the crate), so that [`crate::error`] can embed
//! these types in [`crate::RdmapError`] while [`crate::memory`], [`crate::qp`] and
//! [`crate::wire`] return that error, without a module cycle. Each type is re-exported
//! where it is used: `rdmap::Stag`, `rdmap::memory::{Stag, AccessViolation}`,
//! `rdmap::qp::QpState`.

use std::fmt;

/// A Steering Tag: `index << 8 | key` (RFC 5040 2.3; the split is this
/// implementation's, as in most RNICs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Stag(pub u32);

impl Stag {
    /// Largest table index an STag can carry (24 bits).
    pub const MAX_INDEX: u32 = 0x00FF_FFFF;

    /// The STag for `index` (low 24 bits used) and `key`.
    pub const fn new(index: u32, key: u8) -> Stag {
        Stag(((index & Self::MAX_INDEX) << 8) | key as u32)
    }

    /// The table index (upper 24 bits).
    pub const fn index(self) -> u32 {
        self.0 >> 8
    }

    /// The key (lower 8 bits).
    pub const fn key(self) -> u8 {
        (self.0 & 0xFF) as u8
    }

    /// The 32-bit value carried on the wire.
    pub const fn raw(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Stag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// Why an STag check failed (RFC 5040 7.2 rules 4a-4e, RFC 5041 7.1 tagged checks).
/// Where these end up on the wire depends on who checks (sink or source); see
/// [`crate::TerminateCause`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum AccessViolation {
    /// No valid region has this STag (unknown index, stale key, invalidated, STag 0).
    #[error("invalid STag")]
    InvalidStag,
    /// The region is in another Protection Domain.
    #[error("STag not associated with this stream (PD mismatch)")]
    StagNotAssociated,
    /// The region lacks a required access right.
    #[error("access rights violation")]
    AccessRights,
    /// TO + length wraps the 64-bit TO space.
    #[error("TO wrap")]
    ToWrap,
    /// The range falls outside the region.
    #[error("base or bounds violation")]
    BaseBounds,
}

/// Queue pair states (RFC 5040 6; the verbs states of an iWARP QP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, not yet connected (MPA negotiation not finished). Work requests may be
    /// posted; nothing is sent.
    Idle,
    /// Ready to send and receive.
    Rts,
    /// Graceful close: outstanding work was flushed; nothing more is sent or accepted.
    Closing,
    /// A Terminate is queued and not yet handed to the transport.
    Terminate,
    /// Terminal: the stream is dead and every work request has been flushed.
    Error,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stag_layout() {
        let s = Stag::new(0x12_3456, 0x78);
        assert_eq!(s.raw(), 0x1234_5678);
        assert_eq!(s.index(), 0x12_3456);
        assert_eq!(s.key(), 0x78);
        assert_eq!(s.to_string(), "0x12345678");
    }
}
