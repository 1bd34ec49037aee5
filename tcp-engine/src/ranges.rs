//! A bounded set of disjoint half-open ranges of stream positions, used for
//! out-of-order receive tracking (what was passed up or buffered beyond
//! `rcv_nxt`) and for generating SACK blocks (RFC 2018 4).

/// Disjoint, non-adjacent ranges `[start, end)` sorted by start, with a
/// fixed maximum count (allocated once).
#[derive(Debug, Clone)]
pub struct RangeSet {
    ranges: Vec<Range>,
    max: usize,
    clock: u64,
}

/// One range and when it last grew (for SACK block ordering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// First position.
    pub start: u64,
    /// One past the last position.
    pub end: u64,
    /// Insertion counter of the last update.
    pub touched: u64,
}

impl RangeSet {
    /// A set holding at most `max` ranges.
    pub fn new(max: usize) -> Self {
        RangeSet {
            ranges: Vec::with_capacity(max + 1),
            max: max.max(1),
            clock: 0,
        }
    }

    /// The ranges in position order.
    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Total octets covered.
    pub fn covered(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    /// Call `f` for every sub-range of `[start, end)` not covered.
    pub fn for_each_gap(&self, start: u64, end: u64, mut f: impl FnMut(u64, u64)) {
        let mut cur = start;
        for r in &self.ranges {
            if r.end <= cur {
                continue;
            }
            if r.start >= end {
                break;
            }
            if r.start > cur {
                f(cur, r.start);
            }
            cur = cur.max(r.end);
            if cur >= end {
                return;
            }
        }
        if cur < end {
            f(cur, end);
        }
    }

    /// Whether inserting `[start, end)` would need a new slot that is not
    /// available.
    pub fn would_overflow(&self, start: u64, end: u64) -> bool {
        if self.ranges.len() < self.max {
            return false;
        }
        !self.ranges.iter().any(|r| r.start <= end && start <= r.end)
    }

    /// Insert `[start, end)`, merging with overlapping or adjacent ranges.
    /// Returns false (and changes nothing) if that needs more than `max`
    /// ranges.
    pub fn insert(&mut self, start: u64, end: u64) -> bool {
        if start >= end {
            return true;
        }
        if self.would_overflow(start, end) {
            return false;
        }
        self.clock += 1;
        let first = self.ranges.partition_point(|r| r.end < start);
        let mut last = first;
        let mut s = start;
        let mut e = end;
        while last < self.ranges.len() && self.ranges[last].start <= end {
            s = s.min(self.ranges[last].start);
            e = e.max(self.ranges[last].end);
            last += 1;
        }
        let merged = Range {
            start: s,
            end: e,
            touched: self.clock,
        };
        if first == last {
            self.ranges.insert(first, merged);
        } else {
            self.ranges[first] = merged;
            self.ranges.drain(first + 1..last);
        }
        true
    }

    /// Remove everything below `pos`; return the end of the range starting
    /// at or before `pos` that extends past it (the new contiguous point),
    /// or `pos` if none.
    pub fn advance_from(&mut self, pos: u64) -> u64 {
        let mut p = pos;
        while let Some(r) = self.ranges.first() {
            if r.start > p {
                break;
            }
            p = p.max(r.end);
            self.ranges.remove(0);
        }
        p
    }

    /// Remove everything at or beyond `pos`.
    pub fn truncate_from(&mut self, pos: u64) {
        self.ranges.retain_mut(|r| {
            r.end = r.end.min(pos);
            r.start < r.end
        });
    }

    /// Up to `out.len()` ranges, most recently updated first (RFC 2018 4).
    pub fn most_recent(&self, out: &mut [Range]) -> usize {
        let mut n = 0;
        for r in &self.ranges {
            // Insertion sort into `out` by `touched` descending.
            let mut i = n.min(out.len());
            while i > 0 && out[i - 1].touched < r.touched {
                if i < out.len() {
                    out[i] = out[i - 1];
                }
                i -= 1;
            }
            if i < out.len() {
                out[i] = *r;
                n = (n + 1).min(out.len());
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_merge_gaps_advance() {
        let mut s = RangeSet::new(3);
        assert!(s.insert(10, 20));
        assert!(s.insert(30, 40));
        assert!(s.insert(50, 60));
        assert!(!s.insert(70, 80));
        assert!(s.insert(20, 30)); // bridges two
        assert_eq!(s.ranges().len(), 2);
        let mut gaps = Vec::new();
        s.for_each_gap(0, 65, |a, b| gaps.push((a, b)));
        assert_eq!(gaps, vec![(0, 10), (40, 50), (60, 65)]);
        assert_eq!(s.advance_from(10), 40);
        assert_eq!(s.ranges().len(), 1);
        let mut out = [Range {
            start: 0,
            end: 0,
            touched: 0,
        }; 3];
        assert!(s.insert(70, 80));
        assert_eq!(s.most_recent(&mut out), 2);
        assert_eq!(out[0].start, 70);
    }
}
