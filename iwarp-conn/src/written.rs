//! Where received DDP segments write, and what a connection's frames have written so far: for
//! IFT's speculative placement (draft-williams-iwarp-ift-01 section 8.2), which may place a
//! frame only where nothing was placed before ("the RDDP implementation MUST insure that no
//! previously placed data is overwritten"), so that a guess that later proves wrong has
//! destroyed nothing.
//!
//! [`Written`] tracks, per buffer, the octets written: a tagged buffer is its STag (RFC 5041
//! 4.2), an untagged one the receive buffer of one message (queue number and MSN, 4.3). It is
//! bounded (a few dozen buffers, a few disjoint ranges each, allocated once); where it loses
//! track (too many ranges in a buffer, too many buffers) it says no more speculation there, as
//! 8.2 allows. An untagged message's buffer is forgotten once a later message of its queue is
//! processed in order (the buffer then belongs to the application, and the connection writes
//! there next under a new MSN); tagged buffers are remembered for the connection's life, so a
//! buffer written once (a benchmark's, reused for every message) is never again a target of
//! speculation.

use ddp::wire::DdpHeader;

/// Buffers tracked at once.
const BUFFERS: usize = 32;
/// Disjoint written ranges tracked per buffer.
const RANGES: usize = 8;

/// Where a DDP segment's payload goes (RFC 5041 4.2, 4.3): octets of a tagged buffer, or octets
/// of one message of an untagged queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlacementTarget {
    buffer: Buffer,
    start: u64,
    end: u64,
}

/// A buffer a DDP segment writes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Buffer {
    Tagged { stag: u32 },
    Untagged { qn: u32, msn: u32 },
}

impl PlacementTarget {
    /// The target of the segment with this DDP header (exactly the header's octets) and
    /// payload length; `None` if the header does not parse.
    pub(crate) fn of(ddp_header: &[u8], payload_len: usize) -> Option<PlacementTarget> {
        let (header, _) = DdpHeader::parse(ddp_header).ok()?;
        let len = payload_len as u64;
        Some(match header {
            DdpHeader::Tagged(h) => PlacementTarget {
                buffer: Buffer::Tagged { stag: h.stag },
                start: h.to,
                end: h.to.saturating_add(len),
            },
            DdpHeader::Untagged(h) => PlacementTarget {
                buffer: Buffer::Untagged {
                    qn: h.qn,
                    msn: h.msn,
                },
                start: u64::from(h.mo),
                end: u64::from(h.mo) + len,
            },
        })
    }

    /// Whether the two write any octet in common.
    pub(crate) fn overlaps(&self, other: &PlacementTarget) -> bool {
        self.buffer == other.buffer && self.start < other.end && other.start < self.end
    }
}

/// One buffer's written octets.
#[derive(Debug, Clone, Copy)]
struct Entry {
    buffer: Buffer,
    /// Sorted, disjoint, non-adjacent; `n` of them in use.
    ranges: [(u64, u64); RANGES],
    n: usize,
    /// More ranges than tracked were written: no speculation into this buffer.
    lost: bool,
}

impl Entry {
    /// Adds `[start, end)`; false if that would need more than [`RANGES`] ranges.
    fn insert(&mut self, start: u64, end: u64) -> bool {
        if start >= end {
            return true;
        }
        let ranges = &mut self.ranges[..self.n];
        // Ranges wholly before (not touching) and wholly after the new one.
        let first = ranges.partition_point(|r| r.1 < start);
        let last = ranges.partition_point(|r| r.0 <= end);
        if first < last {
            // Merge [first, last) with the new range into ranges[first].
            let merged = (start.min(ranges[first].0), end.max(ranges[last - 1].1));
            ranges[first] = merged;
            let gone = last - first - 1;
            self.ranges.copy_within(last..self.n, first + 1);
            self.n -= gone;
            return true;
        }
        if self.n == RANGES {
            return false;
        }
        self.ranges.copy_within(first..self.n, first + 1);
        self.ranges[first] = (start, end);
        self.n += 1;
        true
    }

    fn written(&self, start: u64, end: u64) -> bool {
        self.ranges[..self.n]
            .iter()
            .any(|r| r.0 < end && start < r.1)
    }
}

/// What a connection's received segments have written, per buffer (see the module's text).
#[derive(Debug)]
pub(crate) struct Written {
    /// At most [`BUFFERS`]; the capacity is allocated once.
    entries: Vec<Entry>,
    /// A buffer could not be tracked: no speculation anywhere any more.
    lost_all: bool,
}

impl Written {
    pub(crate) fn new() -> Written {
        Written {
            entries: Vec::with_capacity(BUFFERS),
            lost_all: false,
        }
    }

    /// Octets its entries take (allocated once, at most [`BUFFERS`]).
    pub(crate) fn memory(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
    }

    /// Frees the entries for a connection that receives nothing more: every buffer counts
    /// as written (no speculation anywhere).
    pub(crate) fn release(&mut self) {
        self.entries = Vec::new();
        self.lost_all = true;
    }

    fn find(&self, buffer: Buffer) -> Option<usize> {
        self.entries.iter().position(|e| e.buffer == buffer)
    }

    /// Whether `t` may be placed speculatively: every write so far is tracked, none of `t`'s
    /// octets was written before, and the write can be tracked (its buffer has an entry or
    /// one is free).
    pub(crate) fn may_speculate(&self, t: &PlacementTarget) -> bool {
        if self.lost_all {
            return false;
        }
        match self.find(t.buffer) {
            None => self.entries.len() < BUFFERS,
            Some(i) => !self.entries[i].lost && !self.entries[i].written(t.start, t.end),
        }
    }

    /// Records that `t`'s octets were written, placed in order (`in_order`) or
    /// speculatively. A message of an untagged queue processed in order retires the buffers
    /// of that queue's earlier messages (not a speculative one: earlier messages may still be
    /// arriving).
    pub(crate) fn record(&mut self, t: &PlacementTarget, in_order: bool) {
        if let (Buffer::Untagged { qn, msn }, true) = (t.buffer, in_order) {
            self.entries.retain(|e| match e.buffer {
                Buffer::Untagged { qn: q, msn: m } => q != qn || (msn.wrapping_sub(m) as i32) <= 0,
                Buffer::Tagged { .. } => true,
            });
        }
        if self.lost_all {
            return;
        }
        let i = match self.find(t.buffer) {
            Some(i) => i,
            None if self.entries.len() < BUFFERS => {
                self.entries.push(Entry {
                    buffer: t.buffer,
                    ranges: [(0, 0); RANGES],
                    n: 0,
                    lost: false,
                });
                self.entries.len() - 1
            }
            None => {
                self.lost_all = true;
                return;
            }
        };
        let e = &mut self.entries[i];
        if !e.lost && !e.insert(t.start, t.end) {
            e.lost = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(stag: u32, start: u64, end: u64) -> PlacementTarget {
        PlacementTarget {
            buffer: Buffer::Tagged { stag },
            start,
            end,
        }
    }

    fn untagged(msn: u32, start: u64, end: u64) -> PlacementTarget {
        PlacementTarget {
            buffer: Buffer::Untagged { qn: 0, msn },
            start,
            end,
        }
    }

    #[test]
    fn ranges_merge_and_overflow_loses_track() {
        let mut e = Entry {
            buffer: Buffer::Tagged { stag: 1 },
            ranges: [(0, 0); RANGES],
            n: 0,
            lost: false,
        };
        assert!(e.insert(10, 20) && e.insert(30, 40) && e.insert(20, 30));
        assert_eq!(&e.ranges[..e.n], &[(10, 40)]);
        assert!(e.insert(0, 5) && e.insert(50, 60));
        assert_eq!(&e.ranges[..e.n], &[(0, 5), (10, 40), (50, 60)]);
        assert!(e.insert(3, 55));
        assert_eq!(&e.ranges[..e.n], &[(0, 60)]);
        for k in 0..RANGES as u64 - 1 {
            assert!(e.insert(100 + 10 * k, 105 + 10 * k));
        }
        assert_eq!(e.n, RANGES);
        assert!(!e.insert(1000, 1001), "one range too many");
        assert!(e.insert(100, 200), "merging needs no new range");
        assert_eq!(&e.ranges[..e.n], &[(0, 60), (100, 200)]);
    }

    #[test]
    fn speculation_only_where_nothing_was_written() {
        let mut w = Written::new();
        assert!(w.may_speculate(&tagged(7, 0, 100)));
        w.record(&tagged(7, 0, 100), true);
        assert!(!w.may_speculate(&tagged(7, 50, 150)));
        assert!(w.may_speculate(&tagged(7, 100, 200)));
        assert!(w.may_speculate(&tagged(8, 0, 100)), "another buffer");
        // A buffer with more written ranges than tracked: no more speculation into it.
        for k in 0..=RANGES as u64 {
            w.record(&tagged(9, 10 * k, 10 * k + 5), true);
        }
        assert!(!w.may_speculate(&tagged(9, 1000, 1001)));
        assert!(w.may_speculate(&tagged(7, 100, 200)));
    }

    #[test]
    fn a_speculative_record_retires_nothing() {
        let mut w = Written::new();
        w.record(&untagged(8, 0, 100), false);
        w.record(&untagged(9, 0, 100), false);
        assert!(
            !w.may_speculate(&untagged(8, 0, 10)),
            "message 8 is still arriving"
        );
        w.record(&untagged(9, 100, 200), true);
        assert!(
            w.may_speculate(&untagged(8, 0, 10)),
            "retired by message 9 in order"
        );
    }

    #[test]
    fn a_later_message_retires_earlier_receive_buffers() {
        let mut w = Written::new();
        w.record(&untagged(1, 0, 100), true);
        assert!(!w.may_speculate(&untagged(1, 0, 10)));
        assert!(w.may_speculate(&untagged(2, 0, 10)));
        w.record(&untagged(2, 0, 100), true);
        assert!(w.entries.len() == 1, "message 1's buffer retired");
        // Many messages: the table never fills with retired ones.
        for msn in 3..200 {
            w.record(&untagged(msn, 0, 100), true);
            assert!(w.may_speculate(&untagged(msn + 1, 0, 100)));
        }
    }

    #[test]
    fn too_many_buffers_stops_all_speculation() {
        let mut w = Written::new();
        for stag in 0..BUFFERS as u32 {
            w.record(&tagged(stag, 0, 10), true);
        }
        assert!(
            !w.may_speculate(&tagged(1000, 0, 10)),
            "no room to track it"
        );
        assert!(w.may_speculate(&tagged(0, 100, 110)), "a tracked buffer");
        // An in-order write that cannot be tracked: no speculation anywhere any more.
        w.record(&tagged(1000, 0, 10), true);
        assert!(!w.may_speculate(&tagged(0, 200, 210)), "lost track");
    }
}
