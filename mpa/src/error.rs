//! The one error type of the MPA layer and its mapping to wire error codes.

use thiserror::Error;

/// Everything that can go wrong in the MPA layer.
///
/// Each variant maps to exactly one MPA error code of RFC 5044 section 8 (codes 1 to 4) or
/// RFC 6581 section 8 (codes 5 to 7) through [`MpaError::code`]; that method is the only place
/// where the mapping is made. A Terminate message reporting one of these carries Layer 0x2
/// (LLP), Error Type 0x0 (MPA) and this code.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MpaError {
    /// The TCP connection was closed, reset or lost (RFC 5044 section 8, code 1). This crate
    /// does no I/O, so it never produces this itself; it exists so that the transport can report
    /// a lost connection in MPA terms.
    #[error("TCP connection closed or lost")]
    ConnectionLost,

    /// The startup phase (Request/Reply exchange) did not finish before its deadline
    /// (RFC 5044 section 7.1.2 rules 8 and 10). Maps to code 1, because RFC 5044 section 8 lists
    /// "lost by timeout" under code 1 and the connection is closed without ever reaching Full
    /// Operation.
    #[error("MPA startup timed out")]
    StartupTimeout,

    /// Responder: a valid Request waited longer than `MpaConfig::accept_timeout` for the ULP to
    /// accept or reject it; the connection is closed (as for [`MpaError::StartupTimeout`], code
    /// 1, nothing is sent).
    #[error("the MPA Request was neither accepted nor rejected in time")]
    AcceptTimeout,

    /// Responder in the peer-to-peer model: the Initiator's RTR (RFC 6581 section 5), which
    /// ends connection setup, did not arrive within `MpaConfig::timeout` of the accept; the
    /// connection is closed (code 1, as for [`MpaError::StartupTimeout`]; nothing is sent, a
    /// Responder may send nothing before it, RFC 5044 7.1.2 rule 4).
    #[error("the peer's RTR did not arrive in time")]
    RtrTimeout,

    /// The Responder rejected the connection (Reply with R=1, RFC 5044 section 7.1.2 rule 3),
    /// or this side rejected it. MPA is left and the TCP connection is closed by the ULP, so
    /// this maps to code 1 (connection closed); it is never sent in a Terminate because the
    /// connection never reaches Full Operation.
    #[error("MPA connection rejected by the Responder")]
    Rejected,

    /// The received CRC does not match the one computed over the FPDU (RFC 5044 sections 4.4
    /// and 8, code 2).
    #[error("MPA CRC mismatch: computed {computed:#010x}, received {received:#010x}")]
    CrcMismatch {
        /// CRC32c computed over the received FPDU.
        computed: u32,
        /// Value found in the CRC field (read least significant octet first).
        received: u32,
    },

    /// A Marker's FPDUPTR does not point at the start of the FPDU found by following the
    /// ULPDU_Length fields (RFC 5044 sections 4.3 and 8, code 3).
    #[error("MPA marker at stream position {marker_position} has FPDUPTR {fpduptr:#06x}, expected {expected:#06x}")]
    MarkerMismatch {
        /// Stream position (octets since SeqStart) of the Marker's first octet.
        marker_position: u64,
        /// FPDUPTR found in the Marker (low two bits treated as zero).
        fpduptr: u16,
        /// FPDUPTR the Marker should hold.
        expected: u16,
    },

    /// The Marker between FPDUs right before an FPDU located out of order, whose octets were
    /// not in the segment that FPDU came in, is not the Marker that FPDU was checked with: a
    /// Marker between FPDUs holds FPDUPTR 0 (RFC 5044 section 4.3), so the located FPDU's CRC
    /// was computed over an all-zero Marker, and the CRC field does not cover the octets
    /// received (section 4.4), code 2 as for any CRC error (section 8).
    #[error("MPA marker at stream position {marker_position} ({marker:#010x}) is not the zero Marker the FPDU after it was checked with")]
    LocatedMarkerCrcMismatch {
        /// Stream position (octets since SeqStart) of the Marker's first octet.
        marker_position: u64,
        /// The Marker's octets as received (big-endian).
        marker: u32,
    },

    /// An FPDU placed early (located out of order: aligned at a segment's start, or found by
    /// a Marker, its CRC good) is not where the in-order chain of ULPDU_Length fields puts an
    /// FPDU when the in-order pass reaches it: the two framings disagree (a CRC that matched
    /// by chance, or a peer that does not frame as it must), code 3 as for a Marker that
    /// disagrees (RFC 5044 section 8).
    #[error("the FPDU located out of order at stream position {position} is not on the in-order framing")]
    LocatedFpduMismatch {
        /// Stream position (octets since SeqStart) where the located FPDU starts.
        position: u64,
    },

    /// A received ULPDU_Length is larger than this receiver accepts. The FPDU cannot be
    /// buffered, so its CRC cannot be checked; the length field does not delimit an acceptable
    /// FPDU, which we report as a framing disagreement, code 3 (RFC 5044 section 8).
    #[error("received ULPDU_Length {len} exceeds the receive limit {max}")]
    ReceivedUlpduTooLong {
        /// The ULPDU_Length found in the FPDU header.
        len: usize,
        /// The configured maximum.
        max: usize,
    },

    /// A Request or Reply frame does not start with the expected Key (RFC 5044 section 7.1.1
    /// and 7.1.2 rule 5, code 4). This also catches Initiator/Initiator startups (rule 8).
    #[error("invalid MPA Request/Reply key")]
    InvalidKey,

    /// A Request or Reply frame announces more private data than allowed: more than 512
    /// octets, or more than the configured receive cap (RFC 5044 sections 7.1.1 and 7.1.2
    /// rule 9, code 4).
    #[error("MPA private data of {len} octets exceeds the limit of {max}")]
    PrivateDataTooLong {
        /// PD_Length received.
        len: usize,
        /// The limit that applied.
        max: usize,
    },

    /// A Request or Reply frame carries a revision we cannot interoperate with (RFC 5044
    /// section 7.1.1 "Rev", appendix C; code 4). We are a "non-permissive" IETF
    /// implementation: revision 0 (RDMA Consortium framing with version 0 DDP/RDMAP) is refused.
    #[error("unsupported MPA revision {rev}")]
    UnsupportedRevision {
        /// Revision found in the frame.
        rev: u8,
    },

    /// A Request or Reply frame is malformed in some other way (code 4): too short, S=1 with a
    /// revision below 2 or with PD_Length below 4, S=1 in a Reply to a Request without it, or
    /// a Reply revision above the Request's (RFC 5044 section 7.1.1, RFC 6581 sections 6 and 10).
    #[error("invalid MPA Request/Reply frame: {0}")]
    InvalidFrame(&'static str),

    /// A local request could not be carried out (RFC 6581 section 8, code 5 "local
    /// catastrophic"): a bad configuration, private data too long to send, a call in the wrong
    /// state, or an output buffer too small.
    #[error("local MPA error: {0}")]
    Local(&'static str),

    /// A ULPDU handed to the encoder is too long for one FPDU: longer than 65535 octets, or so
    /// long that a Marker inside it could not point back to its header (code 5, local).
    #[error("ULPDU of {len} octets does not fit in one FPDU")]
    UlpduTooLong {
        /// Length of the ULPDU given.
        len: usize,
    },

    /// The output buffer given to [`crate::FpduEncoder::encode_into`] is too small (code 5,
    /// local).
    #[error("output buffer of {available} octets is too small, {needed} needed")]
    BufferTooSmall {
        /// Octets the FPDU needs.
        needed: usize,
        /// Octets the buffer has.
        available: usize,
    },

    /// The Initiator cannot set its IRD at least to the Responder's ORD (RFC 6581 section
    /// 9.1, code 6).
    #[error("insufficient IRD: the peer requires {required}, we have {available}")]
    InsufficientIrd {
        /// The Responder's ORD.
        required: u16,
        /// Our IRD.
        available: u16,
    },

    /// Peer-to-peer negotiation found no RTR indication both sides support, or the Responder
    /// did not echo the connection model (RFC 6581 section 9.2, code 7).
    #[error("no matching RTR option")]
    NoMatchingRtr,
}

impl MpaError {
    /// The MPA error code (RFC 5044 section 8, RFC 6581 section 8) for this error: the value
    /// of the Terminate ErrCode field with Layer 0x2 and Error Type 0x0.
    pub fn code(&self) -> u8 {
        match self {
            MpaError::ConnectionLost
            | MpaError::StartupTimeout
            | MpaError::AcceptTimeout
            | MpaError::RtrTimeout
            | MpaError::Rejected => 1,
            MpaError::CrcMismatch { .. } | MpaError::LocatedMarkerCrcMismatch { .. } => 2,
            MpaError::MarkerMismatch { .. }
            | MpaError::LocatedFpduMismatch { .. }
            | MpaError::ReceivedUlpduTooLong { .. } => 3,
            MpaError::InvalidKey
            | MpaError::PrivateDataTooLong { .. }
            | MpaError::UnsupportedRevision { .. }
            | MpaError::InvalidFrame(_) => 4,
            MpaError::Local(_)
            | MpaError::UlpduTooLong { .. }
            | MpaError::BufferTooSmall { .. } => 5,
            MpaError::InsufficientIrd { .. } => 6,
            MpaError::NoMatchingRtr => 7,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_rfc5044_and_rfc6581() {
        assert_eq!(MpaError::ConnectionLost.code(), 1);
        assert_eq!(MpaError::StartupTimeout.code(), 1);
        assert_eq!(MpaError::AcceptTimeout.code(), 1);
        assert_eq!(MpaError::RtrTimeout.code(), 1);
        assert_eq!(MpaError::Rejected.code(), 1);
        let crc = MpaError::CrcMismatch {
            computed: 1,
            received: 2,
        };
        assert_eq!(crc.code(), 2);
        let marker = MpaError::MarkerMismatch {
            marker_position: 512,
            fpduptr: 4,
            expected: 8,
        };
        assert_eq!(marker.code(), 3);
        assert_eq!(MpaError::ReceivedUlpduTooLong { len: 9, max: 8 }.code(), 3);
        assert_eq!(MpaError::LocatedFpduMismatch { position: 9 }.code(), 3);
        let marker = MpaError::LocatedMarkerCrcMismatch {
            marker_position: 512,
            marker: 1,
        };
        assert_eq!(marker.code(), 2);
        assert_eq!(MpaError::InvalidKey.code(), 4);
        assert_eq!(
            MpaError::PrivateDataTooLong { len: 513, max: 512 }.code(),
            4
        );
        assert_eq!(MpaError::UnsupportedRevision { rev: 0 }.code(), 4);
        assert_eq!(MpaError::InvalidFrame("x").code(), 4);
        assert_eq!(MpaError::Local("x").code(), 5);
        assert_eq!(MpaError::UlpduTooLong { len: 70000 }.code(), 5);
        assert_eq!(
            MpaError::BufferTooSmall {
                needed: 8,
                available: 4
            }
            .code(),
            5
        );
        assert_eq!(
            MpaError::InsufficientIrd {
                required: 8,
                available: 4
            }
            .code(),
            6
        );
        assert_eq!(MpaError::NoMatchingRtr.code(), 7);
    }
}
