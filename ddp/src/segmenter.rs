//! Segmentation of a DDP message at the data source (RFC 5041 5.2).

/// One DDP segment of a message as planned by [`Segmenter`]: the payload octets
/// `offset .. offset + len` of the message, and whether it is the Last segment.
///
/// For an untagged message `offset` is the MO; for a tagged one the TO is the initial
/// TO plus `offset` (RFC 5041 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentPlan {
    /// Offset of the first payload octet within the message.
    pub offset: u64,
    /// Payload octets in this segment.
    pub len: usize,
    /// L bit: set on the final segment only (RFC 5041 4.1).
    pub last: bool,
}

/// Splits a message of `message_len` octets into segments of at most `max_payload`
/// payload octets each, in increasing offset order, the Last segment carrying the
/// highest offset (RFC 5041 4.1, 5.2, 5.3).
///
/// `max_payload` is the MULPDU minus the DDP header length (and minus any ULP header
/// carried in the payload). A zero-length message yields exactly one segment of length
/// 0 with `last` set (5.2). A `max_payload` of 0 cannot make progress and is treated
/// as 1.
#[derive(Debug, Clone)]
pub struct Segmenter {
    message_len: u64,
    max_payload: usize,
    next_offset: u64,
    done: bool,
}

impl Segmenter {
    /// Plans the segments of a `message_len`-octet message.
    pub fn new(message_len: u64, max_payload: usize) -> Self {
        Segmenter {
            message_len,
            max_payload: max_payload.max(1),
            next_offset: 0,
            done: false,
        }
    }

    /// Number of segments still to come.
    pub fn remaining_segments(&self) -> u64 {
        if self.done {
            return 0;
        }
        let remaining = self.message_len - self.next_offset;
        let max = self.max_payload as u64;
        remaining.div_ceil(max).max(1)
    }
}

impl Iterator for Segmenter {
    type Item = SegmentPlan;

    fn next(&mut self) -> Option<SegmentPlan> {
        if self.done {
            return None;
        }
        let remaining = self.message_len - self.next_offset;
        let len = usize::try_from(remaining).map_or(self.max_payload, |r| r.min(self.max_payload));
        let last = len as u64 == remaining;
        let plan = SegmentPlan {
            offset: self.next_offset,
            len,
            last,
        };
        self.next_offset += len as u64;
        self.done = last;
        Some(plan)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining_segments();
        match usize::try_from(n) {
            Ok(n) => (n, Some(n)),
            Err(_) => (usize::MAX, None),
        }
    }
}

impl core::iter::FusedIterator for Segmenter {}

#[cfg(test)]
mod tests {
    use super::*;

    fn plans(len: u64, max: usize) -> Vec<SegmentPlan> {
        Segmenter::new(len, max).collect()
    }

    fn seg(offset: u64, len: usize, last: bool) -> SegmentPlan {
        SegmentPlan { offset, len, last }
    }

    #[test]
    fn zero_length_message_is_one_last_segment() {
        assert_eq!(plans(0, 1442), vec![seg(0, 0, true)]);
        assert_eq!(Segmenter::new(0, 1442).size_hint(), (1, Some(1)));
    }

    #[test]
    fn one_octet() {
        assert_eq!(plans(1, 1442), vec![seg(0, 1, true)]);
    }

    #[test]
    fn exact_multiple() {
        assert_eq!(
            plans(300, 100),
            vec![
                seg(0, 100, false),
                seg(100, 100, false),
                seg(200, 100, true)
            ]
        );
        assert_eq!(plans(100, 100), vec![seg(0, 100, true)]);
    }

    #[test]
    fn remainder() {
        // RFC 5041 5.2 example: 2048 octets, MULPDU 1500, untagged (18-octet header).
        assert_eq!(
            plans(2048, 1482),
            vec![seg(0, 1482, false), seg(1482, 566, true)]
        );
        // ...and tagged (14-octet header).
        assert_eq!(
            plans(2048, 1486),
            vec![seg(0, 1486, false), seg(1486, 562, true)]
        );
    }

    #[test]
    fn large_message() {
        const LEN: u64 = 16 * 1024 * 1024;
        let segmenter = Segmenter::new(LEN, 1442);
        let expected = LEN.div_ceil(1442);
        assert_eq!(expected, 11635);
        assert_eq!(segmenter.size_hint(), (11635, Some(11635)));
        let mut next = 0u64;
        let mut count = 0u64;
        let mut last_seen = None;
        for plan in segmenter {
            assert_eq!(plan.offset, next);
            assert!(plan.len > 0 && plan.len <= 1442);
            next += plan.len as u64;
            count += 1;
            last_seen = Some(plan);
        }
        assert_eq!(next, LEN);
        assert_eq!(count, expected);
        let last = last_seen.unwrap();
        assert!(last.last);
        assert_eq!(last.len as u64, LEN - 11634 * 1442);
    }

    #[test]
    fn only_the_final_segment_is_last_and_iterator_is_fused() {
        let mut s = Segmenter::new(10, 3);
        let all: Vec<_> = s.by_ref().collect();
        assert_eq!(all.iter().filter(|p| p.last).count(), 1);
        assert!(all.last().unwrap().last);
        assert_eq!(s.next(), None);
        assert_eq!(s.remaining_segments(), 0);
    }

    #[test]
    fn zero_max_payload_still_progresses() {
        assert_eq!(plans(2, 0), vec![seg(0, 1, false), seg(1, 1, true)]);
    }
}
