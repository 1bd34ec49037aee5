//! TCP sequence-number arithmetic (RFC 9293 3.4): 32-bit, compared modulo 2^32.

/// `a < b` in sequence space.
#[inline]
pub fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a <= b` in sequence space.
#[inline]
pub fn seq_le(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) <= 0
}

/// `a > b` in sequence space.
#[inline]
pub fn seq_gt(a: u32, b: u32) -> bool {
    seq_lt(b, a)
}

/// `a >= b` in sequence space.
#[inline]
pub fn seq_ge(a: u32, b: u32) -> bool {
    seq_le(b, a)
}

/// Signed distance `a - b` in sequence space.
#[inline]
pub fn seq_diff(a: u32, b: u32) -> i64 {
    i64::from(a.wrapping_sub(b) as i32)
}

/// A 64-bit stream position that never wraps, anchored at a 32-bit sequence
/// number. Position 0 is the first data octet (ISN + 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqAnchor {
    /// The initial sequence number (the SYN's).
    pub isn: u32,
}

impl SeqAnchor {
    /// The sequence number of stream position `pos`.
    #[inline]
    pub fn seq_of(self, pos: u64) -> u32 {
        self.isn.wrapping_add(1).wrapping_add(pos as u32)
    }

    /// The stream position of `seq`, taking the position nearest `near`.
    /// Returns a negative-capable value as i128-free i64 arithmetic: `None`
    /// when the result would precede the stream start.
    #[inline]
    pub fn pos_of(self, seq: u32, near: u64) -> Option<u64> {
        let near_seq = self.seq_of(near);
        let d = seq_diff(seq, near_seq);
        let p = near as i64 + d;
        if p < 0 {
            None
        } else {
            Some(p as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_wrap() {
        assert!(seq_lt(u32::MAX, 0));
        assert!(seq_gt(1, u32::MAX - 5));
        assert!(seq_le(7, 7));
        assert_eq!(seq_diff(2, u32::MAX), 3);
    }

    #[test]
    fn anchor_positions_wrap() {
        let a = SeqAnchor { isn: u32::MAX - 2 };
        assert_eq!(a.seq_of(0), u32::MAX - 1);
        assert_eq!(a.seq_of(3), 1);
        assert_eq!(a.pos_of(1, 0), Some(3));
        assert_eq!(
            a.pos_of(a.seq_of(5_000_000_000), 4_999_999_000),
            Some(5_000_000_000)
        );
        assert_eq!(a.pos_of(a.isn, 0), None);
    }
}
