//! The DDP error enum and its mapping to the RFC 5041 section 7.2 error numbers.

/// Every error the DDP layer reports.
///
/// The first group are the receive errors of RFC 5041 section 7.1, one variant per
/// error number of section 7.2. The second group are conditions detected by this
/// implementation that 7.2 has no dedicated number for; [`DdpError::etype`] and
/// [`DdpError::code`] say which 7.2 number each of them is reported as, and this is the
/// only place where that mapping is made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DdpError {
    // ---- RFC 5041 7.2, EType 0x0 ----
    /// 0x0/0x00: the local DDP implementation cannot continue.
    #[error("DDP local catastrophic error")]
    LocalCatastrophic,

    // ---- RFC 5041 7.2, EType 0x1: tagged buffer errors ----
    /// 0x1/0x00: the STag is not valid (constructed by the ULP when its lookup fails).
    #[error("invalid STag {stag:#010x}")]
    InvalidStag {
        /// The STag carried by the segment.
        stag: u32,
    },
    /// 0x1/0x01: TO or TO + payload length outside the tagged buffer.
    #[error("tagged buffer base or bounds violation")]
    BaseBounds,
    /// 0x1/0x02: the STag is not associated with this DDP stream (detected by the ULP).
    #[error("STag not associated with this DDP stream")]
    StagNotAssociated,
    /// 0x1/0x03: the 64-bit sum of TO and payload length wraps.
    #[error("tagged offset wraps")]
    ToWrap,
    /// 0x1/0x04: a tagged segment with DV != 1.
    #[error("invalid DDP version in a tagged segment")]
    TaggedVersion,

    // ---- RFC 5041 7.2, EType 0x2: untagged buffer errors ----
    /// 0x2/0x01: the QN is not valid for this stream.
    #[error("invalid queue number {qn}")]
    InvalidQn {
        /// The QN carried by the segment.
        qn: u32,
    },
    /// 0x2/0x02: the MSN would be legal but no buffer is posted for it.
    #[error("no buffer posted for MSN {msn}")]
    MsnNoBuffer {
        /// The MSN carried by the segment.
        msn: u32,
    },
    /// 0x2/0x03: the MSN is outside the range that can ever have a buffer.
    #[error("MSN {msn} outside the legal range")]
    MsnRange {
        /// The MSN carried by the segment.
        msn: u32,
    },
    /// 0x2/0x04: the MO is not a legal offset of the untagged buffer.
    #[error("invalid message offset")]
    InvalidMo,
    /// 0x2/0x05: MO + payload length exceeds the untagged buffer.
    #[error("DDP message too long for the available buffer")]
    MessageTooLong,
    /// 0x2/0x06: an untagged segment with DV != 1.
    #[error("invalid DDP version in an untagged segment")]
    UntaggedVersion,

    // ---- conditions without their own 7.2 number (see `etype`/`code`) ----
    /// The ULPDU is shorter than the DDP header its T bit selects (`tagged`; an empty
    /// ULPDU counts as untagged). Reported as the "invalid DDP version" number of that
    /// buffer model, the only 7.2 number about the header format itself.
    #[error("DDP header truncated: {len} octets, tagged = {tagged}")]
    HeaderTruncated {
        /// Whether the T bit (if present) selected the tagged format.
        tagged: bool,
        /// How many octets the ULPDU had.
        len: usize,
    },
    /// A segment reaches past the end of its message fixed by the Last segment, or a
    /// Last segment does not carry the highest offset (RFC 5041 4.1: "the DDP Segment
    /// with the L bit set to 1 MUST carry the highest MO"). Reported as 0x2/0x04
    /// (invalid MO).
    #[error("segment inconsistent with the end of its message set by the Last segment")]
    BeyondMessageEnd,

    // ---- local errors: never caused by a conforming peer over an in-order LLP ----
    /// Local: [`crate::UntaggedQueue::post`] on a queue already holding `max_posted`
    /// buffers. Returned to the posting ULP; never sent on the wire (if it were, it
    /// would be 0x0/0x00).
    #[error("untagged queue full ({max_posted} buffers posted)")]
    QueueFull {
        /// The queue's capacity.
        max_posted: usize,
    },
    /// Local resource limit: a message was placed in more disjoint pieces than
    /// [`crate::MAX_TRACKED_RANGES`]. Reported as 0x0/0x00 (local catastrophic).
    #[error("too many disjoint placed ranges in one message")]
    TooManyRanges,
}

/// RFC 5041 7.2 error types.
pub mod etype {
    /// Local catastrophic.
    pub const LOCAL_CATASTROPHIC: u8 = 0x0;
    /// Tagged buffer error.
    pub const TAGGED_BUFFER: u8 = 0x1;
    /// Untagged buffer error.
    pub const UNTAGGED_BUFFER: u8 = 0x2;
}

impl DdpError {
    /// The (EType, ErrCode) pair of RFC 5041 7.2 under which this error is reported.
    /// The single place where errors are mapped to wire numbers.
    pub fn wire_code(&self) -> (u8, u8) {
        use etype::*;
        match self {
            DdpError::LocalCatastrophic => (LOCAL_CATASTROPHIC, 0x00),
            DdpError::InvalidStag { .. } => (TAGGED_BUFFER, 0x00),
            DdpError::BaseBounds => (TAGGED_BUFFER, 0x01),
            DdpError::StagNotAssociated => (TAGGED_BUFFER, 0x02),
            DdpError::ToWrap => (TAGGED_BUFFER, 0x03),
            DdpError::TaggedVersion => (TAGGED_BUFFER, 0x04),
            DdpError::InvalidQn { .. } => (UNTAGGED_BUFFER, 0x01),
            DdpError::MsnNoBuffer { .. } => (UNTAGGED_BUFFER, 0x02),
            DdpError::MsnRange { .. } => (UNTAGGED_BUFFER, 0x03),
            DdpError::InvalidMo => (UNTAGGED_BUFFER, 0x04),
            DdpError::MessageTooLong => (UNTAGGED_BUFFER, 0x05),
            DdpError::UntaggedVersion => (UNTAGGED_BUFFER, 0x06),
            DdpError::HeaderTruncated { tagged: true, .. } => (TAGGED_BUFFER, 0x04),
            DdpError::HeaderTruncated { tagged: false, .. } => (UNTAGGED_BUFFER, 0x06),
            DdpError::BeyondMessageEnd => (UNTAGGED_BUFFER, 0x04),
            DdpError::QueueFull { .. } => (LOCAL_CATASTROPHIC, 0x00),
            DdpError::TooManyRanges => (LOCAL_CATASTROPHIC, 0x00),
        }
    }

    /// The 4-bit Error Type of RFC 5041 7.2.
    pub fn etype(&self) -> u8 {
        self.wire_code().0
    }

    /// The 8-bit Error Code of RFC 5041 7.2.
    pub fn code(&self) -> u8 {
        self.wire_code().1
    }

    /// True for errors that concern only the local ULP (nothing to report to the peer).
    pub fn is_local(&self) -> bool {
        matches!(self, DdpError::QueueFull { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc5041_7_2_numbers() {
        let table: [(DdpError, u8, u8); 12] = [
            (DdpError::LocalCatastrophic, 0x0, 0x00),
            (DdpError::InvalidStag { stag: 7 }, 0x1, 0x00),
            (DdpError::BaseBounds, 0x1, 0x01),
            (DdpError::StagNotAssociated, 0x1, 0x02),
            (DdpError::ToWrap, 0x1, 0x03),
            (DdpError::TaggedVersion, 0x1, 0x04),
            (DdpError::InvalidQn { qn: 9 }, 0x2, 0x01),
            (DdpError::MsnNoBuffer { msn: 3 }, 0x2, 0x02),
            (DdpError::MsnRange { msn: 3 }, 0x2, 0x03),
            (DdpError::InvalidMo, 0x2, 0x04),
            (DdpError::MessageTooLong, 0x2, 0x05),
            (DdpError::UntaggedVersion, 0x2, 0x06),
        ];
        for (err, et, code) in table {
            assert_eq!((err.etype(), err.code()), (et, code), "{err:?}");
        }
    }

    #[test]
    fn non_rfc_variants_map_to_documented_numbers() {
        let t = DdpError::HeaderTruncated {
            tagged: true,
            len: 3,
        };
        assert_eq!((t.etype(), t.code()), (0x1, 0x04));
        let u = DdpError::HeaderTruncated {
            tagged: false,
            len: 0,
        };
        assert_eq!((u.etype(), u.code()), (0x2, 0x06));
        assert_eq!(DdpError::BeyondMessageEnd.wire_code(), (0x2, 0x04));
        assert_eq!(DdpError::TooManyRanges.wire_code(), (0x0, 0x00));
        assert!(DdpError::QueueFull { max_posted: 1 }.is_local());
        assert!(!DdpError::InvalidMo.is_local());
    }
}
