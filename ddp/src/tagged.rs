//! Receiver checks for tagged segments (RFC 5041 7.1, tagged checks 3 to 5).

use crate::{DdpError, TaggedHeader};

/// A tagged buffer as resolved by the ULP from the STag: the TO of its first octet and
/// its length. The ULP does the STag lookup, the stream association and the access
/// checks (7.1 tagged checks 1 and 2; errors [`DdpError::InvalidStag`],
/// [`DdpError::StagNotAssociated`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedBuffer {
    /// TO of the buffer's first octet.
    pub base_to: u64,
    /// Length of the buffer in octets.
    pub len: u64,
}

/// RFC 5041 7.1 tagged checks on a segment carrying `payload_len` octets into `buf`:
/// - 5: TO + payload length must not wrap 64 bits, else [`DdpError::ToWrap`];
/// - 3: TO must fall within the buffer, else [`DdpError::BaseBounds`];
/// - 4: TO + payload length must fall within the buffer, else [`DdpError::BaseBounds`].
///
/// The wrap check comes first because a wrapping segment also violates the bounds and
/// 0x1/0x03 is the more precise report. Returns the offset into the buffer where the
/// payload goes (TO − base TO).
///
/// A zero-length segment is not checked and yields offset 0: "The STag and TO fields
/// MUST NOT be checked for a zero-length Tagged DDP Message" (RFC 5041 5.2), and it
/// places nothing.
pub fn check_tagged(
    hdr: &TaggedHeader,
    payload_len: usize,
    buf: &TaggedBuffer,
) -> Result<u64, DdpError> {
    if payload_len == 0 {
        return Ok(0);
    }
    let payload_len = payload_len as u64;
    hdr.to.checked_add(payload_len).ok_or(DdpError::ToWrap)?;
    let offset = hdr
        .to
        .checked_sub(buf.base_to)
        .ok_or(DdpError::BaseBounds)?;
    if offset >= buf.len || payload_len > buf.len - offset {
        return Err(DdpError::BaseBounds);
    }
    Ok(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(to: u64) -> TaggedHeader {
        TaggedHeader {
            last: false,
            rsvd_ulp: 0x40,
            stag: 0x100,
            to,
        }
    }

    const BUF: TaggedBuffer = TaggedBuffer {
        base_to: 0x1000,
        len: 0x100,
    };

    #[test]
    fn in_range_returns_offset() {
        assert_eq!(check_tagged(&hdr(0x1000), 0x100, &BUF), Ok(0));
        assert_eq!(check_tagged(&hdr(0x1010), 0x10, &BUF), Ok(0x10));
        assert_eq!(check_tagged(&hdr(0x10ff), 1, &BUF), Ok(0xff));
    }

    #[test]
    fn base_violation() {
        let err = check_tagged(&hdr(0x0fff), 1, &BUF).unwrap_err();
        assert_eq!(err, DdpError::BaseBounds);
        assert_eq!((err.etype(), err.code()), (0x1, 0x01));
    }

    #[test]
    fn bounds_violation() {
        // TO past the end (check 3).
        assert_eq!(
            check_tagged(&hdr(0x1100), 1, &BUF),
            Err(DdpError::BaseBounds)
        );
        // TO inside but TO + len past the end (check 4).
        assert_eq!(
            check_tagged(&hdr(0x10ff), 2, &BUF),
            Err(DdpError::BaseBounds)
        );
        assert_eq!(
            check_tagged(&hdr(0x1000), 0x101, &BUF),
            Err(DdpError::BaseBounds)
        );
    }

    #[test]
    fn to_wrap() {
        let whole = TaggedBuffer {
            base_to: 0,
            len: u64::MAX,
        };
        let err = check_tagged(&hdr(u64::MAX - 1), 2, &whole).unwrap_err();
        assert_eq!(err, DdpError::ToWrap);
        assert_eq!((err.etype(), err.code()), (0x1, 0x03));
        // Ending exactly at 2^64 - 1 does not wrap.
        assert_eq!(
            check_tagged(&hdr(u64::MAX - 2), 2, &whole),
            Ok(u64::MAX - 2)
        );
        // A wrapping segment on a small buffer still reports the wrap.
        assert_eq!(check_tagged(&hdr(u64::MAX), 1, &BUF), Err(DdpError::ToWrap));
    }

    #[test]
    fn buffer_at_the_top_of_the_to_space() {
        let top = TaggedBuffer {
            base_to: u64::MAX - 9,
            len: 10,
        };
        assert_eq!(check_tagged(&hdr(u64::MAX - 9), 9, &top), Ok(0));
        assert_eq!(check_tagged(&hdr(u64::MAX - 1), 1, &top), Ok(8));
    }

    #[test]
    fn zero_length_is_not_checked() {
        assert_eq!(check_tagged(&hdr(0), 0, &BUF), Ok(0));
        assert_eq!(check_tagged(&hdr(u64::MAX), 0, &BUF), Ok(0));
    }
}
