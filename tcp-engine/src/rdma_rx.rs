//! The receiving side of the TCP RDMA option (draft-csapuntz-tcprdma-00): buffers the ULP
//! posted by RID, the checks a segment's option must pass before its run is placed in one
//! (section 6.1: offsets within the segment and the buffer; unsolicited data only into a
//! buffer offered for it; 3.1.4: one total length, one form, per transfer), and the stream
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
    /// Another total length or form than earlier segments of the transfer (3.1.4).
    Inconsistent,
    /// The table of placed ranges is full.
    Full,
}

#[derive(Debug)]
struct Posted {
    data: Vec<u8>,
    unsolicited: bool,
    /// The total length the transfer's first annotated segment named (`Some(None)`: the
    /// 16-octet form, no total).
    total: Option<Option<u32>>,
}

/// Posted buffers and placed ranges of one connection.
#[derive(Debug, Default)]
pub(crate) struct RdmaReceive {
    posted: BTreeMap<Rid, Posted>,
    /// Placed stream ranges not yet passed by in-order delivery, by stream offset.
    placed: BTreeMap<u64, RdmaPlaced>,
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
}

impl RdmaReceive {
    pub(crate) fn new(max_buffers: usize, max_placed: usize) -> Self {
        RdmaReceive {
            posted: BTreeMap::new(),
            placed: BTreeMap::new(),
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
        self.posted.insert(
            rid,
            Posted {
                data,
                unsolicited,
                total: None,
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
        match p.total {
            Some(total) if total != total_length => return Err(Refused::Inconsistent),
            _ => p.total = Some(total_length),
        }
        if self.placed.len() >= self.max_placed {
            return Err(Refused::Full);
        }
        Ok(Some(Run {
            start: seg_start + range.start as u64,
            end: seg_start + range.end as u64,
            rid: t.rid,
            buffer_offset: u64::from(buffer_offset),
        }))
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
        let len = octets.len() as u64;
        if let Some(mut last) = self.placed.last_entry() {
            let l = last.get_mut();
            if l.rid == run.rid
                && l.stream_offset + l.len == from
                && l.buffer_offset + l.len == at as u64
            {
                // The common case, in-order arrival: the newest range grows.
                l.len += len;
                return;
            }
        }
        let mut rec = RdmaPlaced {
            stream_offset: from,
            len,
            rid: run.rid,
            buffer_offset: at as u64,
        };
        // Joined with the range before and after it when they continue each other in the
        // stream and in the same buffer.
        let continues = |a: &RdmaPlaced, b: &RdmaPlaced| {
            a.rid == b.rid
                && a.stream_offset + a.len == b.stream_offset
                && a.buffer_offset + a.len == b.buffer_offset
        };
        if let Some((&k, prev)) = self.placed.range(..from).next_back() {
            if continues(prev, &rec) {
                rec = RdmaPlaced {
                    len: prev.len + rec.len,
                    ..*prev
                };
                self.placed.remove(&k);
            }
        }
        let end = rec.stream_offset + rec.len;
        if let Some(next) = self.placed.get(&end).copied() {
            if continues(&rec, &next) {
                rec.len += next.len;
                self.placed.remove(&end);
            }
        }
        self.placed.insert(rec.stream_offset, rec);
    }

    /// Where the first placed range not yet delivered starts.
    pub(crate) fn next_start(&self) -> Option<u64> {
        self.placed.keys().next().copied()
    }

    /// The first placed range if it starts at `read` and ends by `nxt` (all of it arrived).
    pub(crate) fn pop_at(&mut self, read: u64, nxt: u64) -> Option<RdmaPlaced> {
        let (&k, p) = self.placed.iter().next()?;
        if k != read || p.stream_offset + p.len > nxt {
            return None;
        }
        self.placed.remove(&k)
    }
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

    /// Section 6.1's checks and 3.1.4's consistency: each refusal leaves the buffer as it was.
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
        // The 20-octet form, then the 16-octet one (or another total), for one transfer.
        assert_eq!(
            r.accept(opt(2, 10, 0, 10, None, true), 0, 10).err(),
            Some(Refused::Inconsistent)
        );
        assert_eq!(
            r.accept(opt(2, 10, 0, 10, Some(99), true), 0, 10).err(),
            Some(Refused::Inconsistent)
        );
        // Nothing was placed by any of them.
        assert!(r
            .take(Rid::new(1).expect("rid"))
            .is_some_and(|b| b.iter().all(|&x| x == 0)));
        assert_eq!(r.next_start(), None);
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
