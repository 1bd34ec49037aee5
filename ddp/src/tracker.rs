//! Tracking which octets of one DDP message have been placed, for delivery
//! (RFC 5041 5.3 and 5.4: placement may be out of order and repeated; a message is
//! complete once its Last segment and every octet before it are placed).

use crate::DdpError;

/// How many disjoint placed ranges one message may have at a time. Segments arriving in
/// order always merge into one range; the cap bounds the state a peer can make us keep.
pub const MAX_TRACKED_RANGES: usize = 16;

/// The placed octets of one message, as at most [`MAX_TRACKED_RANGES`] disjoint,
/// non-adjacent, sorted half-open ranges, plus the message length once the Last
/// segment has been seen. Fixed size: recording a segment never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageTracker {
    ranges: [(u64, u64); MAX_TRACKED_RANGES],
    count: usize,
    end: Option<u64>,
}

impl Default for MessageTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl MessageTracker {
    /// A message with nothing placed yet.
    pub const fn new() -> Self {
        MessageTracker {
            ranges: [(0, 0); MAX_TRACKED_RANGES],
            count: 0,
            end: None,
        }
    }

    /// Records that octets `offset .. offset + len` have been placed; `last` is the L
    /// bit of the segment, which fixes the message length at `offset + len`.
    ///
    /// Repeated and overlapping placement is accepted. Errors, which leave the tracker
    /// unchanged:
    /// - [`DdpError::BeyondMessageEnd`]: the segment reaches past the known end, a Last
    ///   segment ends before octets already placed (RFC 5041 4.1: the Last segment
    ///   carries the highest offset), a second Last segment ends elsewhere, or
    ///   `offset + len` overflows;
    /// - [`DdpError::TooManyRanges`]: the segment would be the
    ///   `MAX_TRACKED_RANGES + 1`-th disjoint piece.
    pub fn record(&mut self, offset: u64, len: u64, last: bool) -> Result<(), DdpError> {
        let seg_end = offset.checked_add(len).ok_or(DdpError::BeyondMessageEnd)?;
        match (self.end, last) {
            (Some(end), true) if end != seg_end => return Err(DdpError::BeyondMessageEnd),
            (Some(end), false) if seg_end > end => return Err(DdpError::BeyondMessageEnd),
            (None, true) if self.highest_placed() > seg_end => {
                return Err(DdpError::BeyondMessageEnd)
            }
            _ => {}
        }
        if len > 0 {
            self.insert(offset, seg_end)?;
        }
        if last {
            self.end = Some(seg_end);
        }
        Ok(())
    }

    /// Merges `[start, end)` (non-empty) into the sorted range set.
    fn insert(&mut self, start: u64, end: u64) -> Result<(), DdpError> {
        let ranges = &mut self.ranges[..self.count];
        // First range that touches or follows `start`, and first range wholly after `end`.
        let first = ranges.partition_point(|&(_, e)| e < start);
        let after = ranges.partition_point(|&(s, _)| s <= end);
        if first == after {
            // No overlap or adjacency: a new disjoint range at `first`.
            if self.count == MAX_TRACKED_RANGES {
                return Err(DdpError::TooManyRanges);
            }
            self.ranges.copy_within(first..self.count, first + 1);
            self.ranges[first] = (start, end);
            self.count += 1;
        } else {
            let merged_start = start.min(ranges[first].0);
            let merged_end = end.max(ranges[after - 1].1);
            self.ranges[first] = (merged_start, merged_end);
            self.ranges.copy_within(after..self.count, first + 1);
            self.count -= after - first - 1;
        }
        Ok(())
    }

    fn highest_placed(&self) -> u64 {
        self.ranges().last().map_or(0, |&(_, end)| end)
    }

    /// True once the Last segment is placed and every octet from 0 to the message end
    /// is placed.
    pub fn is_complete(&self) -> bool {
        match self.end {
            None => false,
            Some(0) => true,
            Some(end) => self.ranges() == [(0, end)],
        }
    }

    /// The message length, known once the Last segment has been placed.
    pub fn total_len(&self) -> Option<u64> {
        self.end
    }

    /// The placed octets as sorted, disjoint, non-adjacent half-open ranges.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges[..self.count]
    }

    /// Number of distinct octets placed so far.
    pub fn placed_octets(&self) -> u64 {
        self.ranges().iter().map(|&(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_is_one_range() {
        let mut t = MessageTracker::new();
        t.record(0, 10, false).unwrap();
        t.record(10, 10, false).unwrap();
        assert!(!t.is_complete());
        t.record(20, 5, true).unwrap();
        assert_eq!(t.ranges(), &[(0, 25)]);
        assert!(t.is_complete());
        assert_eq!(t.total_len(), Some(25));
    }

    #[test]
    fn last_first_then_the_rest() {
        let mut t = MessageTracker::new();
        t.record(20, 5, true).unwrap();
        assert!(!t.is_complete());
        assert_eq!(t.total_len(), Some(25));
        t.record(0, 10, false).unwrap();
        assert!(!t.is_complete());
        t.record(10, 10, false).unwrap();
        assert!(t.is_complete());
    }

    #[test]
    fn duplicates_and_overlaps_merge() {
        let mut t = MessageTracker::new();
        t.record(10, 10, false).unwrap();
        t.record(10, 10, false).unwrap();
        t.record(30, 10, false).unwrap();
        t.record(50, 10, false).unwrap();
        assert_eq!(t.ranges(), &[(10, 20), (30, 40), (50, 60)]);
        t.record(15, 40, false).unwrap();
        assert_eq!(t.ranges(), &[(10, 60)]);
        t.record(0, 10, false).unwrap();
        assert_eq!(t.ranges(), &[(0, 60)]);
        assert_eq!(t.placed_octets(), 60);
        t.record(60, 0, true).unwrap();
        assert!(t.is_complete());
    }

    #[test]
    fn zero_length_message() {
        let mut t = MessageTracker::new();
        assert!(!t.is_complete());
        t.record(0, 0, true).unwrap();
        assert!(t.is_complete());
        assert_eq!(t.total_len(), Some(0));
    }

    #[test]
    fn segment_past_known_end_is_rejected() {
        let mut t = MessageTracker::new();
        t.record(10, 5, true).unwrap();
        let before = t;
        assert_eq!(t.record(12, 4, false), Err(DdpError::BeyondMessageEnd));
        assert_eq!(t.record(0, 5, true), Err(DdpError::BeyondMessageEnd));
        assert_eq!(t, before, "failed record must not change state");
        // The same Last segment again is a harmless duplicate.
        t.record(10, 5, true).unwrap();
    }

    #[test]
    fn last_segment_must_carry_highest_offset() {
        let mut t = MessageTracker::new();
        t.record(100, 10, false).unwrap();
        assert_eq!(t.record(0, 50, true), Err(DdpError::BeyondMessageEnd));
        assert_eq!(t.total_len(), None);
    }

    #[test]
    fn overflowing_offset_is_rejected() {
        let mut t = MessageTracker::new();
        assert_eq!(
            t.record(u64::MAX, 1, false),
            Err(DdpError::BeyondMessageEnd)
        );
    }

    #[test]
    fn fragmentation_is_bounded() {
        let mut t = MessageTracker::new();
        for i in 0..MAX_TRACKED_RANGES as u64 {
            t.record(i * 10, 5, false).unwrap();
        }
        let before = t;
        assert_eq!(t.record(1000, 5, false), Err(DdpError::TooManyRanges));
        assert_eq!(t, before);
        // Filling a gap still works at capacity.
        t.record(5, 5, false).unwrap();
        assert_eq!(t.ranges().len(), MAX_TRACKED_RANGES - 1);
        assert_eq!(t.ranges()[0], (0, 15));
    }
}
