//! The receiving side of the TCP RDMA option (draft-csapuntz-tcprdma-00): buffers the ULP
//! posted by RID, the checks a segment's option must pass before its run is placed in one
//! (section 6.1: offsets within the segment and the buffer; unsolicited data only into a
//! buffer offered for it; 3.1.4: one total length per transfer, wherever it is present; no
//! octet of the buffer written twice from different parts of the stream), and the stream
//! ranges placed, which in-order delivery passes over and reports instead
//! ([`crate::Connection::next_placed`]).

use std::collections::BTreeMap;

use crate::wire::rdma::{RdmaOption, RdmaTransfer, Rid};

/// A stream range whose octets went straight into a posted buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaPlaced {
    /// Stream offset of the first octet (octets since the connection's first data octet).
    pub stream_offset: u64,
    /// Octets.
    pub len: u64,
    /// The transfer, whose buffer holds them.
    pub rid: Rid,
    /// Where in the buffer.
    pub buffer_offset: u64,
}

/// Why [`crate::Connection::post_rdma_buffer`] refused a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RdmaPostError {
    /// A buffer for this RID is posted already.
    #[error("a buffer for this RID is posted already")]
    Duplicate,
    /// As many buffers as the connection takes are posted.
    #[error("too many RDMA buffers posted")]
    TooMany,
    /// Placement needs [`crate::RxMode::InOrder`].
    #[error("RDMA buffers need the in-order receive mode")]
    WrongMode,
}

/// Why a segment's option was not acted on (the segment was then ordinary data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No buffer is posted for the RID.
    UnknownRid,
    /// Data Offset or Data Length past the segment, or the run past the buffer (6.1).
    OutOfBounds,
    /// The U bit set for a buffer not offered for unsolicited data (3.1.7, 6.1).
    Unsolicited,
    /// Another total length than earlier segments of the transfer named (3.1.4).
    Inconsistent,
    /// The run ends past the transfer's total length, named by this segment or an earlier
    /// one (3.1.4: the number of octets the transfer carries).
    PastTotal,
    /// The table of placed ranges, or of the buffer's written ranges, is full.
    Full,
    /// The run would write octets of the buffer that another part of the stream wrote:
    /// placement must not change what the stream delivered (the first copy stands, as in
    /// TCP's stream).
    Overlap,
}

/// Ranges of one buffer written by placement, with the stream offsets they hold.
const MAX_WRITTEN_RANGES: usize = 64;

/// Octets `[buf_start, buf_end)` of a posted buffer written from the stream's octets that
/// start at `stream_start`.
#[derive(Debug, Clone, Copy)]
struct WrittenRange {
    buf_start: u64,
    buf_end: u64,
    stream_start: u64,
}

impl WrittenRange {
    /// Whether the stream octet at `stream` would be written at buffer offset `buf` by the
    /// same mapping as this range's.
    fn same_mapping(&self, buf: u64, stream: u64) -> bool {
        i128::from(self.stream_start) - i128::from(self.buf_start)
            == i128::from(stream) - i128::from(buf)
    }
}

#[derive(Debug)]
struct Posted {
    data: Vec<u8>,
    unsolicited: bool,
    /// The total length the transfer's segments named, once one did (3.1.4: "when present,
    /// MUST be the same for all segments"). A sender that did not know it at first sends the
    /// 16-octet form, which names none, and may send the 20-octet form once it knows.
    total: Option<u32>,
    /// What placement wrote, by buffer offset (disjoint; joined where they continue each
    /// other in the buffer and the stream).
    written: Vec<WrittenRange>,
    /// Which posting of its RID this buffer is ([`RdmaReceive::post`] numbers them): ranges
    /// placed in a buffer taken back and those placed in the next one posted for the RID are
    /// never joined.
    posting: u64,
}

/// A placed range and the posting of the buffer it went into.
#[derive(Debug, Clone, Copy)]
struct Placed {
    range: RdmaPlaced,
    posting: u64,
}

/// Posted buffers and placed ranges of one connection.
#[derive(Debug, Default)]
pub(crate) struct RdmaReceive {
    posted: BTreeMap<Rid, Posted>,
    /// Placed stream ranges not yet passed by in-order delivery, by stream offset.
    placed: BTreeMap<u64, Placed>,
    /// Buffers posted so far (the next one's [`Posted::posting`]).
    postings: u64,
    max_buffers: usize,
    max_placed: usize,
}

/// A run of a segment accepted for placement: `[start, end)` of the stream into `rid`'s
/// buffer from `buffer_offset`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) start: u64,
    pub(crate) end: u64,
    rid: Rid,
    buffer_offset: u64,
    /// The transfer's total length, named by this segment first: the transfer's once the
    /// segment places something ([`RdmaReceive::place`]).
    names_total: Option<u32>,
}

impl RdmaReceive {
    pub(crate) fn new(max_buffers: usize, max_placed: usize) -> Self {
        RdmaReceive {
            posted: BTreeMap::new(),
            placed: BTreeMap::new(),
            postings: 0,
            max_buffers,
            max_placed,
        }
    }

    pub(crate) fn post(
        &mut self,
        rid: Rid,
        data: Vec<u8>,
        unsolicited: bool,
    ) -> Result<(), RdmaPostError> {
        if self.posted.contains_key(&rid) {
            return Err(RdmaPostError::Duplicate);
        }
        if self.posted.len() >= self.max_buffers {
            return Err(RdmaPostError::TooMany);
        }
        self.postings += 1;
        self.posted.insert(
            rid,
            Posted {
                data,
                unsolicited,
                total: None,
                written: Vec::new(),
                posting: self.postings,
            },
        );
        Ok(())
    }

    pub(crate) fn take(&mut self, rid: Rid) -> Option<Vec<u8>> {
        self.posted.remove(&rid).map(|p| p.data)
    }

    /// The run of a segment (its first octet at stream offset `seg_start`, `payload` octets)
    /// that its option places, after every check; `Ok(None)` without a transfer option.
    pub(crate) fn accept(
        &mut self,
        option: Option<RdmaOption>,
        seg_start: u64,
        payload: usize,
    ) -> Result<Option<Run>, Refused> {
        let Some(RdmaOption::Transfer(t)) = option else {
            return Ok(None);
        };
        let range = t.data_range(payload).map_err(|_| Refused::OutOfBounds)?;
        if range.is_empty() {
            return Ok(None);
        }
        let p = self.posted.get_mut(&t.rid).ok_or(Refused::UnknownRid)?;
        let RdmaTransfer {
            buffer_offset,
            total_length,
            ..
        } = t;
        if t.buffer_range().end > p.data.len() as u64 {
            return Err(Refused::OutOfBounds);
        }
        if t.flags.unsolicited && !p.unsolicited {
            return Err(Refused::Unsolicited);
        }
        // The total a first segment names is the transfer's once that segment places octets.
        let names_total = match (p.total, total_length) {
            (Some(known), Some(named)) if known != named => return Err(Refused::Inconsistent),
            (None, Some(named)) => Some(named),
            _ => None,
        };
        if p.total
            .or(total_length)
            .is_some_and(|total| t.buffer_range().end > u64::from(total))
        {
            return Err(Refused::PastTotal);
        }
        if self.placed.len() >= self.max_placed || p.written.len() >= MAX_WRITTEN_RANGES {
            return Err(Refused::Full);
        }
        let run = Run {
            start: seg_start + range.start as u64,
            end: seg_start + range.end as u64,
            rid: t.rid,
            buffer_offset: u64::from(buffer_offset),
            names_total: None,
        };
        // Octets of the buffer another part of the stream wrote stay as they are: the run
        // may cover them only with the same octets of the stream (a segment sent again).
        let (b0, b1) = (run.buffer_offset, run.buffer_offset + (run.end - run.start));
        let clash = p.written.iter().any(|w| {
            w.buf_start < b1 && b0 < w.buf_end && !w.same_mapping(run.buffer_offset, run.start)
        });
        if clash {
            return Err(Refused::Overlap);
        }
        Ok(Some(Run { names_total, ..run }))
    }

    /// Places `octets`, the run's stream range `[from, from + octets.len())` (a part of it
    /// not received before), in the buffer and records it.
    pub(crate) fn place(&mut self, run: &Run, from: u64, octets: &[u8]) {
        let Some(p) = self.posted.get_mut(&run.rid) else {
            return;
        };
        let at = (run.buffer_offset + (from - run.start)) as usize;
        let Some(dst) = p.data.get_mut(at..at + octets.len()) else {
            return;
        };
        dst.copy_from_slice(octets);
        p.total = p.total.or(run.names_total);
        let len = octets.len() as u64;
        note_written(
            &mut p.written,
            WrittenRange {
                buf_start: at as u64,
                buf_end: at as u64 + len,
                stream_start: from,
            },
        );
        let posting = p.posting;
        let mut rec = Placed {
            range: RdmaPlaced {
                stream_offset: from,
                len,
                rid: run.rid,
                buffer_offset: at as u64,
            },
            posting,
        };
        // Joined with the range before and after it when they continue each other in the
        // stream and in the same buffer (the same posting of it).
        let continues = |a: &Placed, b: &Placed| {
            a.posting == b.posting
                && a.range.rid == b.range.rid
                && a.range.stream_offset + a.range.len == b.range.stream_offset
                && a.range.buffer_offset + a.range.len == b.range.buffer_offset
        };
        if let Some(mut last) = self.placed.last_entry() {
            if continues(last.get(), &rec) {
                // The common case, in-order arrival: the newest range grows.
                last.get_mut().range.len += len;
                return;
            }
        }
        if let Some((&k, prev)) = self.placed.range(..from).next_back() {
            if continues(prev, &rec) {
                rec.range = RdmaPlaced {
                    len: prev.range.len + len,
                    ..prev.range
                };
                self.placed.remove(&k);
            }
        }
        let end = rec.range.stream_offset + rec.range.len;
        if let Some(next) = self.placed.get(&end).copied() {
            if continues(&rec, &next) {
                rec.range.len += next.range.len;
                self.placed.remove(&end);
            }
        }
        self.placed.insert(rec.range.stream_offset, rec);
    }

    /// Forgets what was placed from stream offset `offset` on (out-of-order octets TCP no
    /// longer holds: beyond the peer's FIN, or given back): the ranges placed there, cut at
    /// `offset` where one crosses it, and the buffers' record of what those octets wrote, so
    /// that in-order delivery, reaching `offset`, finds nothing placed beyond the stream's
    /// end and the octets, should they come again, are placed again.
    pub(crate) fn forget_from(&mut self, offset: u64) {
        let _ = self.placed.split_off(&offset);
        if let Some(mut last) = self.placed.last_entry() {
            let r = &mut last.get_mut().range;
            r.len = r.len.min(offset.saturating_sub(r.stream_offset));
        }
        for p in self.posted.values_mut() {
            p.written.retain_mut(|w| {
                let len = w.buf_end - w.buf_start;
                if w.stream_start + len > offset {
                    w.buf_end = w.buf_start + offset.saturating_sub(w.stream_start).min(len);
                }
                w.buf_end > w.buf_start
            });
        }
    }

    /// Where the first placed range not yet delivered starts.
    pub(crate) fn next_start(&self) -> Option<u64> {
        self.placed.keys().next().copied()
    }

    /// The first placed range if it starts at `read` and ends by `nxt` (all of it arrived).
    pub(crate) fn pop_at(&mut self, read: u64, nxt: u64) -> Option<RdmaPlaced> {
        let (&k, p) = self.placed.iter().next()?;
        if k != read || p.range.stream_offset + p.range.len > nxt {
            return None;
        }
        self.placed.remove(&k).map(|p| p.range)
    }
}

/// Adds `w` to `written` (sorted by buffer offset, disjoint: [`RdmaReceive::accept`] let
/// nothing overlap by another mapping, and placement writes only octets not received before),
/// joined with its neighbours where they continue each other in the buffer and the stream.
/// From [`MAX_WRITTEN_RANGES`] entries on `accept` refuses further runs; the last run taken
/// may add one entry per gap it fills (at most the connection's out-of-order ranges, plus
/// one), so the list stays bounded. A buffer that reached the bound takes no more placement:
/// the rest of its transfer comes through the stream.
fn note_written(written: &mut Vec<WrittenRange>, w: WrittenRange) {
    let i = written.partition_point(|x| x.buf_start < w.buf_start);
    let mut w = w;
    let mut at = i;
    if i > 0 {
        let prev = written[i - 1];
        if prev.buf_end == w.buf_start && prev.same_mapping(w.buf_start, w.stream_start) {
            w = WrittenRange {
                buf_start: prev.buf_start,
                stream_start: prev.stream_start,
                ..w
            };
            written.remove(i - 1);
            at = i - 1;
        }
    }
    if let Some(next) = written.get(at).copied() {
        if w.buf_end == next.buf_start && next.same_mapping(w.buf_start, w.stream_start) {
            w.buf_end = next.buf_end;
            written.remove(at);
        }
    }
    written.insert(at, w);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::rdma::RdmaFlags;

    fn opt(
        rid: u64,
        buffer: u32,
        off: u16,
        len: u16,
        total: Option<u32>,
        u: bool,
    ) -> Option<RdmaOption> {
        Some(RdmaOption::Transfer(RdmaTransfer {
            flags: RdmaFlags {
                aligned: false,
                unsolicited: u,
            },
            rid: Rid::new(rid).expect("rid"),
            buffer_offset: buffer,
            data_offset: off,
            data_length: len,
            total_length: total,
        }))
    }

    /// Section 6.1's checks: each refusal leaves the buffer as it was.
    #[test]
    fn every_check_refuses_before_anything_is_written() {
        let mut r = RdmaReceive::new(4, 16);
        r.post(Rid::new(1).expect("rid"), vec![0; 100], false)
            .expect("post");
        r.post(Rid::new(2).expect("rid"), vec![0; 100], true)
            .expect("post");
        assert_eq!(
            r.post(Rid::new(1).expect("rid"), vec![], false),
            Err(RdmaPostError::Duplicate)
        );
        // Unknown RID.
        assert_eq!(
            r.accept(opt(3, 0, 0, 10, None, false), 0, 10).err(),
            Some(Refused::UnknownRid)
        );
        // Data past the segment (3.1.2, 3.1.3).
        assert_eq!(
            r.accept(opt(1, 0, 11, 0, None, false), 0, 10).err(),
            Some(Refused::OutOfBounds)
        );
        assert_eq!(
            r.accept(opt(1, 0, 5, 6, None, false), 0, 10).err(),
            Some(Refused::OutOfBounds)
        );
        // The run past the buffer (6.1).
        assert_eq!(
            r.accept(opt(1, 95, 0, 6, None, false), 0, 10).err(),
            Some(Refused::OutOfBounds)
        );
        assert_eq!(
            r.accept(opt(1, u32::MAX, 0, 6, None, false), 0, 10).err(),
            Some(Refused::OutOfBounds)
        );
        // Unsolicited into a buffer not offered for it; into one offered, fine.
        assert_eq!(
            r.accept(opt(1, 0, 0, 10, None, true), 0, 10).err(),
            Some(Refused::Unsolicited)
        );
        assert!(r.accept(opt(2, 0, 0, 10, Some(100), true), 0, 10).is_ok());
        // Past the transfer's total (3.1.4), named by the segment itself.
        assert_eq!(
            r.accept(opt(1, 90, 0, 10, Some(95), false), 0, 10).err(),
            Some(Refused::PastTotal)
        );
        // (Another total for the same transfer, 3.1.4: `a_transfer_may_name_its_total_once_
        // known`, where segments place what names the total.)
        // Nothing was placed by any of them.
        assert!(r
            .take(Rid::new(1).expect("rid"))
            .is_some_and(|b| b.iter().all(|&x| x == 0)));
        assert_eq!(r.next_start(), None);
    }

    /// What a peer can make us keep is bounded: runs that each take an entry of their own
    /// (a mapping of buffer to stream that does not continue the one before) are refused
    /// once the buffer has [`MAX_WRITTEN_RANGES`] of them, or the connection `max_placed`
    /// ranges not yet read; their segments are ordinary stream data.
    #[test]
    fn runs_beyond_the_bounds_are_refused_as_full() {
        let rid = || Rid::new(1).expect("rid");
        // Stream stride 2, buffer stride 3: no run continues another.
        let run_at = |r: &mut RdmaReceive, k: u64| {
            let at = 2 * k;
            let run = r.accept(opt(1, 3 * k as u32, 0, 1, None, false), at, 1)?;
            let run = run.expect("a run");
            r.place(&run, at, &[7]);
            Ok::<_, Refused>(())
        };
        let mut r = RdmaReceive::new(4, 1024);
        r.post(rid(), vec![0; 1000], false).expect("post");
        for k in 0..MAX_WRITTEN_RANGES as u64 {
            run_at(&mut r, k).expect("within the bound");
        }
        assert_eq!(
            run_at(&mut r, MAX_WRITTEN_RANGES as u64),
            Err(Refused::Full)
        );
        let written = r.posted.get(&rid()).map(|p| p.written.len());
        assert_eq!(written, Some(MAX_WRITTEN_RANGES));
        // The connection's bound on placed ranges, below the buffer's.
        let mut r = RdmaReceive::new(4, 10);
        r.post(rid(), vec![0; 1000], false).expect("post");
        for k in 0..10 {
            run_at(&mut r, k).expect("within the bound");
        }
        assert_eq!(run_at(&mut r, 10), Err(Refused::Full));
        assert_eq!(r.placed.len(), 10);
    }

    /// 3.1.4: the total, where present, is the same for every segment; a sender that does
    /// not know it yet sends the 16-octet form, and the 20-octet one once it knows. Either
    /// order of the forms is placed; only another total is refused.
    #[test]
    fn a_transfer_may_name_its_total_once_known() {
        let rid = || Rid::new(1).expect("rid");
        let mut r = RdmaReceive::new(4, 16);
        r.post(rid(), vec![0; 100], false).expect("post");
        let placed = |r: &mut RdmaReceive, option: Option<RdmaOption>, at: u64| {
            let run = r.accept(option, at, 10).expect("accepted").expect("a run");
            r.place(&run, at, &[1; 10]);
        };
        placed(&mut r, opt(1, 0, 0, 10, None, false), 0);
        // A segment that names a total but places nothing (its octets all received before)
        // does not fix it.
        assert!(matches!(
            r.accept(opt(1, 0, 0, 10, Some(60), false), 0, 10),
            Ok(Some(_))
        ));
        placed(&mut r, opt(1, 10, 0, 10, Some(40), false), 10);
        placed(&mut r, opt(1, 20, 0, 10, None, false), 20);
        assert_eq!(
            r.accept(opt(1, 30, 0, 10, Some(50), false), 30, 10).err(),
            Some(Refused::Inconsistent)
        );
        assert!(matches!(
            r.accept(opt(1, 30, 0, 10, Some(40), false), 30, 10),
            Ok(Some(_))
        ));
        // Past the total an earlier segment named, in a segment that names none.
        assert_eq!(
            r.accept(opt(1, 35, 0, 10, None, false), 35, 10).err(),
            Some(Refused::PastTotal)
        );
    }

    /// Octets of the buffer placed from one part of the stream are not written again from
    /// another (the first copy stands, as in TCP's stream): such a run is refused, and its
    /// segment is ordinary stream data. The same part of the stream sent again, or the next
    /// part of the buffer, is placed.
    #[test]
    fn placed_octets_are_not_overwritten_by_another_part_of_the_stream() {
        let mut r = RdmaReceive::new(4, 16);
        let rid = Rid::new(9).expect("rid");
        r.post(rid, vec![0; 100], false).expect("post");
        let a = r
            .accept(opt(9, 0, 0, 50, None, false), 1000, 50)
            .expect("ok")
            .expect("run");
        r.place(&a, 1000, &[1; 50]);
        // Stream 5000.. into buffer 0..50 again, and a run straddling its end: refused.
        assert_eq!(
            r.accept(opt(9, 0, 0, 50, None, false), 5000, 50).err(),
            Some(Refused::Overlap)
        );
        assert_eq!(
            r.accept(opt(9, 40, 0, 20, None, false), 5000, 20).err(),
            Some(Refused::Overlap)
        );
        // The same octets of the stream again (a retransmission), and the next part: fine.
        assert!(r.accept(opt(9, 0, 0, 50, None, false), 1000, 50).is_ok());
        let b = r
            .accept(opt(9, 50, 0, 50, None, false), 1050, 50)
            .expect("ok")
            .expect("run");
        r.place(&b, 1050, &[2; 50]);
        // A refused segment names no total for the transfer: a later one may name its own.
        assert_eq!(
            r.accept(opt(9, 0, 0, 50, Some(70), false), 5000, 50).err(),
            Some(Refused::Overlap)
        );
        assert!(r
            .accept(opt(9, 50, 0, 50, Some(100), false), 1050, 50)
            .is_ok());
        let buf = r.take(rid).expect("buffer");
        assert_eq!(&buf[..], &[[1u8; 50], [2; 50]].concat()[..]);
    }

    /// Written ranges join where they continue each other in the buffer and the stream,
    /// whichever comes first; ranges of another mapping stay apart.
    #[test]
    fn written_ranges_join() {
        let w = |b0, b1, s| WrittenRange {
            buf_start: b0,
            buf_end: b1,
            stream_start: s,
        };
        let mut v = Vec::new();
        note_written(&mut v, w(20, 30, 120));
        note_written(&mut v, w(0, 10, 100));
        note_written(&mut v, w(10, 20, 110));
        assert_eq!(v.len(), 1);
        assert_eq!(
            (v[0].buf_start, v[0].buf_end, v[0].stream_start),
            (0, 30, 100)
        );
        note_written(&mut v, w(30, 40, 900));
        assert_eq!(v.len(), 2, "another mapping");
    }

    #[test]
    fn placed_ranges_join_and_pass_in_stream_order() {
        let mut r = RdmaReceive::new(4, 16);
        let rid = Rid::new(7).expect("rid");
        r.post(rid, vec![0; 30], false).expect("post");
        // Segment at stream 100: 5 octets of header, then 10 of the body at buffer 10; and,
        // out of order, the one at stream 80 with the first 10 (then 15 of a trailer and a
        // header).
        let late = r
            .accept(opt(7, 10, 5, 10, Some(30), false), 100, 15)
            .expect("ok")
            .expect("run");
        r.place(&late, 105, &[2; 10]);
        let early = r
            .accept(opt(7, 0, 0, 10, Some(30), false), 80, 25)
            .expect("ok")
            .expect("run");
        r.place(&early, 80, &[1; 10]);
        assert_eq!(r.next_start(), Some(80));
        assert_eq!(r.pop_at(70, 200), None, "reading has not reached it");
        assert_eq!(
            r.pop_at(80, 105),
            Some(RdmaPlaced {
                stream_offset: 80,
                len: 10,
                rid,
                buffer_offset: 0
            })
        );
        assert_eq!(r.next_start(), Some(105));
        assert_eq!(r.pop_at(105, 110), None, "not all of it arrived");
        assert_eq!(r.pop_at(105, 115).map(|p| p.buffer_offset), Some(10));
        let buf = r.take(rid).expect("buffer");
        assert_eq!(&buf[..20], &[[1u8; 10], [2; 10]].concat()[..]);
        // Two pieces that continue each other are one range.
        let mut r = RdmaReceive::new(4, 16);
        r.post(rid, vec![0; 30], false).expect("post");
        let a = r
            .accept(opt(7, 0, 0, 10, None, false), 0, 10)
            .expect("ok")
            .expect("run");
        r.place(&a, 0, &[3; 10]);
        let b = r
            .accept(opt(7, 10, 0, 10, None, false), 10, 10)
            .expect("ok")
            .expect("run");
        r.place(&b, 10, &[4; 10]);
        assert_eq!(r.pop_at(0, 20).map(|p| p.len), Some(20));
    }
}
