//! Inline payload: octets copied into a send work request when it is posted (verbs'
//! `IBV_SEND_INLINE`, perftest's `-I`), so the application may reuse its buffer as soon as the
//! post returns and no memory region is involved. On the wire an inline Send or RDMA Write is
//! the same message as one gathered from registered memory (RFC 5040 5.1, 5.3); only where the
//! sender takes the octets from differs.

use std::fmt;

/// The most octets one work request carries inline (verbs' `max_inline_data`). perftest's
/// defaults for latency tests on iWARP devices fit: 220 for RDMA Writes, 236 for Sends.
pub const MAX_INLINE_DATA: usize = 236;

/// [`InlineData`] was asked to hold more than [`MAX_INLINE_DATA`] octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{len} octets of inline data: a work request holds at most {MAX_INLINE_DATA}")]
pub struct InlineTooLong {
    /// The octets offered.
    pub len: usize,
}

/// Up to [`MAX_INLINE_DATA`] octets, kept in the value itself (no allocation), so a work
/// request that carries them stays a plain value.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InlineData {
    len: u16,
    bytes: [u8; MAX_INLINE_DATA],
}

impl InlineData {
    /// A copy of `data`.
    pub fn new(data: &[u8]) -> Result<InlineData, InlineTooLong> {
        InlineData::gather([data])
    }

    /// The pieces copied one after the other (a scatter/gather list of the application's
    /// own memory, as verbs gathers an inline work request's list when it is posted).
    pub fn gather<'a>(
        pieces: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<InlineData, InlineTooLong> {
        let mut out = InlineData {
            len: 0,
            bytes: [0; MAX_INLINE_DATA],
        };
        let mut at = 0;
        for piece in pieces {
            let end = at + piece.len();
            let Some(dst) = out.bytes.get_mut(at..end) else {
                return Err(InlineTooLong { len: end });
            };
            dst.copy_from_slice(piece);
            at = end;
        }
        // At most MAX_INLINE_DATA (< u16::MAX): checked piece by piece above.
        out.len = at as u16;
        Ok(out)
    }

    /// The octets.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// How many octets.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// No octets (a zero-length message).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for InlineData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InlineData({} octets)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_a_copy_of_what_it_was_given() {
        let mut src = vec![1u8, 2, 3];
        let data = InlineData::new(&src).unwrap();
        src[0] = 9;
        assert_eq!(data.as_slice(), &[1, 2, 3]);
        assert_eq!(data.len(), 3);
        assert!(InlineData::new(&[]).unwrap().is_empty());
    }

    #[test]
    fn gathers_pieces_in_order() {
        let data = InlineData::gather([&[1u8, 2][..], &[], &[3]]).unwrap();
        assert_eq!(data.as_slice(), &[1, 2, 3]);
    }

    #[test]
    fn refuses_more_than_fits() {
        let full = [7u8; MAX_INLINE_DATA];
        assert_eq!(InlineData::new(&full).unwrap().len(), MAX_INLINE_DATA);
        assert_eq!(
            InlineData::new(&[0; MAX_INLINE_DATA + 1]),
            Err(InlineTooLong {
                len: MAX_INLINE_DATA + 1
            })
        );
        assert_eq!(
            InlineData::gather([&full[..], &[1, 2]]),
            Err(InlineTooLong {
                len: MAX_INLINE_DATA + 2
            })
        );
    }
}
