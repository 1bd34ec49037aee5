//! The sending side of the TCP RDMA option (draft-csapuntz-tcprdma-00): which sections of the
//! send stream belong to which RDMA transfer, where segments are cut so that each carries the
//! data of at most one section, and the option each segment carries (3.1.8: on every segment
//! with data of a transfer; section 4: a segment holds one run of one transfer, with ordinary
//! stream octets before or after it). The annotation of a stream range is a function of the
//! sections alone, so a retransmission carries the same option for the same octets.

use std::collections::VecDeque;

use crate::wire::rdma::{RdmaFlags, RdmaOption, RdmaTransfer, Rid};

/// What the ULP says about the octets it queues with [`crate::Connection::send_rdma`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaSend {
    /// The transfer (3.1.1).
    pub rid: Rid,
    /// Where in the receiver's buffer the first of these octets goes (3.1.5).
    pub buffer_offset: u32,
    /// The transfer's total length if known (3.1.4: the 20-octet form; the 16-octet one
    /// otherwise). The same for every section of a transfer.
    pub total_length: Option<u32>,
    /// The receiver did not ask for this RID (3.1.7).
    pub unsolicited: bool,
}

/// A section of the send stream, `[start, end)` (stream offsets), that is data of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Section {
    start: u64,
    end: u64,
    send: RdmaSend,
}

impl Section {
    /// Octets the option takes in a segment's header (its length is a multiple of 4).
    fn option_len(&self) -> u64 {
        if self.send.total_length.is_some() {
            20
        } else {
            16
        }
    }
}

/// The sections of the send stream not yet acknowledged, in stream order; at most `max`.
#[derive(Debug, Clone, Default)]
pub(crate) struct RdmaSections {
    sections: VecDeque<Section>,
    max: usize,
}

impl RdmaSections {
    pub(crate) fn new(max: usize) -> Self {
        RdmaSections {
            sections: VecDeque::new(),
            max,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sections.is_empty()
    }

    /// Room for one more section (a push that extends the last one needs none).
    pub(crate) fn has_room(&self, start: u64, send: &RdmaSend) -> bool {
        self.sections.len() < self.max || self.extends_last(start, send)
    }

    /// Whether `send` names no Total Length, or the one the latest section of its transfer
    /// still tracked named, if that named one (3.1.4: one total per transfer).
    pub(crate) fn same_total(&self, send: &RdmaSend) -> bool {
        let Some(total) = send.total_length else {
            return true;
        };
        self.sections
            .iter()
            .rev()
            .filter(|s| s.send.rid == send.rid)
            .find_map(|s| s.send.total_length)
            .is_none_or(|t| t == total)
    }

    fn extends_last(&self, start: u64, send: &RdmaSend) -> bool {
        self.sections.back().is_some_and(|l| {
            l.end == start
                && l.send.rid == send.rid
                && l.send.total_length == send.total_length
                && l.send.unsolicited == send.unsolicited
                && u64::from(l.send.buffer_offset) + (l.end - l.start)
                    == u64::from(send.buffer_offset)
        })
    }

    /// `[start, start + len)` of the stream (just queued, after every section) is data of
    /// `send`'s transfer; continues the last section when it is the same transfer's next
    /// octets.
    pub(crate) fn push(&mut self, start: u64, len: u64, send: RdmaSend) {
        if len == 0 {
            return;
        }
        if self.extends_last(start, &send) {
            if let Some(l) = self.sections.back_mut() {
                l.end += len;
                return;
            }
        }
        self.sections.push_back(Section {
            start,
            end: start + len,
            send,
        });
    }

    /// Forgets what lies below stream offset `acked`.
    pub(crate) fn release_to(&mut self, acked: u64) {
        while self.sections.front().is_some_and(|s| s.end <= acked) {
            self.sections.pop_front();
        }
    }

    /// The length of the next new segment from stream offset `s` with `data_end` queued and
    /// `emss` octets of payload for a segment without the option: up to the first section it
    /// reaches, or holding one run of one section (then `emss` less the option's octets) and
    /// ending before the next section begins.
    pub(crate) fn segment_len(&self, s: u64, data_end: u64, emss: u64) -> u64 {
        let avail = data_end.saturating_sub(s);
        let i = self.first_ending_after(s);
        let Some(&run) = self.sections.get(i) else {
            return avail.min(emss);
        };
        let cap = emss.saturating_sub(run.option_len()).max(1);
        if run.start > s {
            let gap = run.start - s;
            if gap >= cap {
                // A segment of ordinary octets that stops where the section starts.
                return gap.min(emss).min(avail);
            }
        }
        let mut end = (s + cap).min(data_end);
        if let Some(next) = self.sections.get(i + 1) {
            end = end.min(next.start);
        }
        end - s
    }

    /// The most payload a segment starting at `s` may carry (for splitting a retransmission
    /// when the path MTU shrank): `emss`, less the option when the segment holds section data.
    pub(crate) fn cap_at(&self, s: u64, len: u64, emss: u64) -> u64 {
        match self.section_in(s, len) {
            Some(r) => emss.saturating_sub(r.option_len()).max(1),
            None => emss,
        }
    }

    fn section_in(&self, s: u64, len: u64) -> Option<&Section> {
        self.sections
            .get(self.first_ending_after(s))
            .filter(|r| r.start < s + len)
    }

    /// The index of the first section that ends after stream offset `s` (the length when
    /// none does). Sections are in stream order and disjoint, so their ends rise: a binary
    /// search, not a walk from the oldest unacknowledged one, for every segment sent.
    fn first_ending_after(&self, s: u64) -> usize {
        self.sections.partition_point(|r| r.end <= s)
    }

    /// The option of the segment carrying stream octets `[s, s + len)`: the run of the first
    /// section in it (segments are cut to hold one), or none.
    pub(crate) fn annotate(&self, s: u64, len: u64) -> Option<RdmaOption> {
        if len == 0 {
            return None;
        }
        let r = self.section_in(s, len)?;
        let from = r.start.max(s);
        let to = r.end.min(s + len);
        Some(RdmaOption::Transfer(RdmaTransfer {
            flags: RdmaFlags {
                aligned: false,
                unsolicited: r.send.unsolicited,
            },
            rid: r.send.rid,
            buffer_offset: r.send.buffer_offset.wrapping_add((from - r.start) as u32),
            data_offset: (from - s) as u16,
            data_length: (to - from) as u16,
            total_length: r.send.total_length,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(rid: u64, buffer_offset: u32) -> RdmaSend {
        RdmaSend {
            rid: Rid::new(rid).expect("rid"),
            buffer_offset,
            total_length: Some(4000),
            unsolicited: false,
        }
    }

    /// Cuts the whole queued stream into segments; (start, len, buffer offset, data offset,
    /// data length) of each.
    fn cut(s: &RdmaSections, data_end: u64, emss: u64) -> Vec<(u64, u64, u32, u16, u16)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < data_end {
            let len = s.segment_len(at, data_end, emss);
            assert!(len > 0 && len <= emss);
            let (b, o, l) = match s.annotate(at, len) {
                Some(RdmaOption::Transfer(t)) => {
                    assert!(len + 20 <= emss, "the option's octets come off the payload");
                    (t.buffer_offset, t.data_offset, t.data_length)
                }
                _ => (0, 0, 0),
            };
            out.push((at, len, b, o, l));
            at += len;
        }
        out
    }

    /// Section 4's stream (header 0-100, section 1 100-2100, trailer, header, section 2
    /// 2300-4300), cut with an EMSS of 1020 (1000 octets of payload beside the 20-octet
    /// option): the draft's second segmentation, where the trailer and the next header ride
    /// with the end of section 1.
    #[test]
    fn section_4_stream() {
        let mut s = RdmaSections::new(16);
        s.push(100, 2000, send(7, 0));
        s.push(2300, 2000, send(7, 2000));
        assert_eq!(
            cut(&s, 4300, 1020),
            [
                (0, 1000, 0, 100, 900),
                (1000, 1000, 900, 0, 1000),
                (2000, 300, 1900, 0, 100),
                (2300, 1000, 2000, 0, 1000),
                (3300, 1000, 3000, 0, 1000),
            ]
        );
        // Only the first section queued yet (the trailer follows, the next header not): the
        // draft's first segmentation up to there.
        let mut s = RdmaSections::new(16);
        s.push(100, 2000, send(7, 0));
        assert_eq!(
            cut(&s, 2200, 1020),
            [
                (0, 1000, 0, 100, 900),
                (1000, 1000, 900, 0, 1000),
                (2000, 200, 1900, 0, 100),
            ]
        );
        // The same octets annotated the same way again (a retransmission), in any piece.
        assert_eq!(
            s.annotate(1500, 300),
            Some(RdmaOption::Transfer(RdmaTransfer {
                flags: RdmaFlags::default(),
                rid: Rid::new(7).expect("rid"),
                buffer_offset: 1400,
                data_offset: 0,
                data_length: 300,
                total_length: Some(4000),
            }))
        );
    }

    #[test]
    fn a_section_continued_is_one_run_and_others_are_cut_apart() {
        let mut s = RdmaSections::new(2);
        s.push(0, 500, send(1, 0));
        s.push(500, 500, send(1, 500));
        assert!(s.has_room(1000, &send(1, 1000)));
        s.push(1000, 100, send(2, 0));
        // Two sections and full: a third transfer waits, the last one may grow.
        assert!(!s.has_room(1100, &send(3, 0)));
        assert!(s.has_room(1100, &send(2, 100)));
        assert_eq!(
            cut(&s, 1100, 1020),
            [(0, 1000, 0, 0, 1000), (1000, 100, 0, 0, 100)]
        );
        // Ordinary octets before a section: a segment of them stops where it starts when
        // the run would not fit beside the option.
        let mut s = RdmaSections::new(4);
        s.push(1010, 100, send(1, 0));
        assert_eq!(
            cut(&s, 1110, 1020),
            [(0, 1010, 0, 0, 0), (1010, 100, 0, 0, 100)]
        );
        s.release_to(1110);
        assert!(s.is_empty());
    }
}
