//! One untagged buffer queue (one QN) at the data sink: RFC 5041 5.1.2, the untagged
//! receiver checks of 7.1, and in-order delivery (5.3, 5.4).

use std::collections::VecDeque;

use crate::{DdpError, MessageTracker, UntaggedHeader};

/// Where to copy the payload of a placed untagged segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement<C> {
    /// Cookie of the posted buffer the message consumes.
    pub cookie: C,
    /// Offset into that buffer (the MO).
    pub offset: u32,
    /// The message's MSN.
    pub msn: u32,
}

/// A message delivered to the ULP (RFC 5041 5.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered<C> {
    /// Cookie of the buffer that holds the message.
    pub cookie: C,
    /// The message's MSN.
    pub msn: u32,
    /// ULP message length: MO + payload length of the Last segment.
    pub len: u32,
}

#[derive(Debug, Clone)]
struct PostedBuffer<C> {
    len: u32,
    cookie: C,
    tracker: MessageTracker,
}

/// The MSN of the first message on a queue (RFC 5041 4.3).
pub const INITIAL_MSN: u32 = 1;

/// One untagged queue: buffers posted by the ULP, consumed one per message in MSN
/// order. The first posted buffer belongs to MSN 1, the next to MSN 2, and so on,
/// wrapping from 0xFFFFFFFF to 0 (RFC 5041 4.3).
///
/// Stopping placement after an error (7.1: "silently drop any subsequent incoming DDP
/// Segments") is the ULP's job: the queue reports the error and stays usable.
#[derive(Debug, Clone)]
pub struct UntaggedQueue<C> {
    qn: u32,
    max_posted: usize,
    /// MSN of the front buffer (the first one not yet delivered).
    head_msn: u32,
    buffers: VecDeque<PostedBuffer<C>>,
}

/// MSNs at least this far behind the window count as already completed.
const MSN_HALF_SPACE: u32 = 1 << 31;

impl<C: Copy> UntaggedQueue<C> {
    /// An empty queue for `qn` holding at most `max_posted` buffers; the next MSN is 1.
    pub fn new(qn: u32, max_posted: usize) -> Self {
        UntaggedQueue {
            qn,
            max_posted,
            head_msn: INITIAL_MSN,
            buffers: VecDeque::with_capacity(max_posted.min(64)),
        }
    }

    /// Same as [`UntaggedQueue::new`] but with the first expected MSN given (tests,
    /// or a ULP resuming a stream).
    pub fn with_next_msn(qn: u32, max_posted: usize, next_msn: u32) -> Self {
        let mut queue = Self::new(qn, max_posted);
        queue.head_msn = next_msn;
        queue
    }

    /// Posts a buffer of `len` octets for the next message without a buffer. Fails with
    /// the local error [`DdpError::QueueFull`] once `max_posted` buffers are held.
    pub fn post(&mut self, len: u32, cookie: C) -> Result<(), DdpError> {
        if self.buffers.len() >= self.max_posted {
            return Err(DdpError::QueueFull {
                max_posted: self.max_posted,
            });
        }
        self.buffers.push_back(PostedBuffer {
            len,
            cookie,
            tracker: MessageTracker::new(),
        });
        Ok(())
    }

    /// Buffers posted and not yet delivered.
    pub fn posted(&self) -> usize {
        self.buffers.len()
    }

    /// Whether every buffer posted and not yet delivered has had its message's Last segment
    /// (none holds a message still open; true for an empty queue). A buffer no segment has
    /// reached yet counts as open.
    pub fn every_message_ended(&self) -> bool {
        self.buffers.iter().all(|b| b.tracker.total_len().is_some())
    }

    /// The queue number.
    pub fn qn(&self) -> u32 {
        self.qn
    }

    /// MSN of the next message to be delivered (the first available buffer).
    pub fn next_msn(&self) -> u32 {
        self.head_msn
    }

    /// The queue's capacity.
    pub fn max_posted(&self) -> usize {
        self.max_posted
    }

    /// The RFC 5041 7.1 untagged checks for a segment with `payload_len` octets, in the
    /// order of the RFC, then records the placed range. Returns where to copy the
    /// payload. On error nothing is recorded.
    ///
    /// 1. QN must be this queue's: [`DdpError::InvalidQn`].
    /// 2. and 5. The MSN must have a buffer, i.e. lie in `[next_msn, next_msn + posted)`
    ///    (mod 2^32). Outside it: [`DdpError::MsnNoBuffer`] if it is ahead of the
    ///    window by less than the queue capacity (a buffer could have been posted for
    ///    it: the ULP did not post enough), otherwise [`DdpError::MsnRange`] (behind
    ///    the window, i.e. already delivered, or beyond anything the queue can hold).
    /// 3. The MO must be an offset within the buffer (MO < buffer length; MO ≤ buffer
    ///    length for a zero-length segment): [`DdpError::InvalidMo`].
    /// 4. MO + payload length must not exceed the buffer: [`DdpError::MessageTooLong`].
    ///
    /// Then placement bookkeeping: [`DdpError::BeyondMessageEnd`] if the segment
    /// contradicts the message end fixed by the Last segment, [`DdpError::TooManyRanges`]
    /// if the message is placed in too many disjoint pieces.
    ///
    /// Zero-length segments get the same checks: a zero-length message still consumes a
    /// buffer.
    pub fn place(
        &mut self,
        hdr: &UntaggedHeader,
        payload_len: usize,
    ) -> Result<Placement<C>, DdpError> {
        let index = self.check(hdr, payload_len)?;
        let buffer = self
            .buffers
            .get_mut(index)
            .ok_or(DdpError::LocalCatastrophic)?;
        buffer
            .tracker
            .record(u64::from(hdr.mo), payload_len as u64, hdr.last)?;
        Ok(Placement {
            cookie: buffer.cookie,
            offset: hdr.mo,
            msn: hdr.msn,
        })
    }

    /// Where [`place`](Self::place) would put this segment, with the same 7.1 checks, but
    /// without recording anything: for placing data that arrived ahead of the in-order
    /// point (RFC 5041 5.3) before the segment is processed in order, when `place` records
    /// it. Placing the same octets twice is allowed (5.3), so the data may be copied now.
    pub fn locate(
        &self,
        hdr: &UntaggedHeader,
        payload_len: usize,
    ) -> Result<Placement<C>, DdpError> {
        let index = self.check(hdr, payload_len)?;
        let buffer = self.buffers.get(index).ok_or(DdpError::LocalCatastrophic)?;
        Ok(Placement {
            cookie: buffer.cookie,
            offset: hdr.mo,
            msn: hdr.msn,
        })
    }

    /// The 7.1 checks of one segment; the index of its buffer.
    fn check(&self, hdr: &UntaggedHeader, payload_len: usize) -> Result<usize, DdpError> {
        if hdr.qn != self.qn {
            return Err(DdpError::InvalidQn { qn: hdr.qn });
        }
        let index = self.buffer_index(hdr.msn)?;
        let buffer = self.buffers.get(index).ok_or(DdpError::LocalCatastrophic)?;
        let mo = u64::from(hdr.mo);
        let buffer_len = u64::from(buffer.len);
        let payload_len = payload_len as u64;
        let mo_is_legal = if payload_len == 0 {
            mo <= buffer_len
        } else {
            mo < buffer_len
        };
        if !mo_is_legal {
            return Err(DdpError::InvalidMo);
        }
        if payload_len > buffer_len - mo {
            return Err(DdpError::MessageTooLong);
        }
        Ok(index)
    }

    /// Index in `buffers` of the buffer for `msn` (checks 2 and 5 of 7.1).
    fn buffer_index(&self, msn: u32) -> Result<usize, DdpError> {
        let ahead = msn.wrapping_sub(self.head_msn);
        let ahead_usize = usize::try_from(ahead).map_err(|_| DdpError::MsnRange { msn })?;
        if ahead_usize < self.buffers.len() {
            Ok(ahead_usize)
        } else if ahead < MSN_HALF_SPACE && ahead_usize < self.max_posted {
            Err(DdpError::MsnNoBuffer { msn })
        } else {
            Err(DdpError::MsnRange { msn })
        }
    }

    /// The next message that can be delivered, if any: the front buffer's message once
    /// its Last segment and every octet before it are placed (RFC 5041 5.4). Messages
    /// come out strictly in MSN order, each once; the buffer leaves the queue.
    pub fn poll_delivery(&mut self) -> Option<Delivered<C>> {
        let front = self.buffers.front()?;
        if !front.tracker.is_complete() {
            return None;
        }
        // `place` keeps every message end within its u32 buffer length.
        let len = u32::try_from(front.tracker.total_len()?).ok()?;
        let cookie = front.cookie;
        let msn = self.head_msn;
        self.buffers.pop_front();
        self.head_msn = self.head_msn.wrapping_add(1);
        Some(Delivered { cookie, msn, len })
    }

    /// Removes every posted buffer not yet delivered and returns their cookies in
    /// posting order (to flush them on error). The next expected MSN is unchanged.
    pub fn drain(&mut self) -> Vec<C> {
        self.buffers.drain(..).map(|b| b.cookie).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QN: u32 = 0;

    fn seg(msn: u32, mo: u32, last: bool) -> UntaggedHeader {
        UntaggedHeader {
            last,
            rsvd_ulp: [0x43, 0, 0, 0, 0],
            qn: QN,
            msn,
            mo,
        }
    }

    fn queue(buffers: &[(u32, char)]) -> UntaggedQueue<char> {
        let mut q = UntaggedQueue::new(QN, 8);
        for &(len, cookie) in buffers {
            q.post(len, cookie).unwrap();
        }
        q
    }

    fn assert_code(err: DdpError, etype: u8, code: u8) {
        assert_eq!((err.etype(), err.code()), (etype, code), "{err:?}");
    }

    #[test]
    fn single_segment_message() {
        let mut q = queue(&[(100, 'a')]);
        assert_eq!(q.next_msn(), 1);
        let p = q.place(&seg(1, 0, true), 24).unwrap();
        assert_eq!(
            p,
            Placement {
                cookie: 'a',
                offset: 0,
                msn: 1
            }
        );
        assert_eq!(
            q.poll_delivery(),
            Some(Delivered {
                cookie: 'a',
                msn: 1,
                len: 24
            })
        );
        assert_eq!(q.poll_delivery(), None);
        assert_eq!(q.posted(), 0);
        assert_eq!(q.next_msn(), 2);
    }

    #[test]
    fn invalid_qn() {
        let mut q = queue(&[(100, 'a')]);
        let mut h = seg(1, 0, true);
        h.qn = 5;
        let err = q.place(&h, 1).unwrap_err();
        assert_eq!(err, DdpError::InvalidQn { qn: 5 });
        assert_code(err, 0x2, 0x01);
    }

    #[test]
    fn msn_without_a_posted_buffer() {
        let mut q = queue(&[]);
        let err = q.place(&seg(1, 0, true), 1).unwrap_err();
        assert_eq!(err, DdpError::MsnNoBuffer { msn: 1 });
        assert_code(err, 0x2, 0x02);
        q.post(10, 'a').unwrap();
        q.post(10, 'b').unwrap();
        assert_eq!(
            q.place(&seg(3, 0, true), 1),
            Err(DdpError::MsnNoBuffer { msn: 3 })
        );
        // The last MSN a queue of capacity 8 could ever hold a buffer for: 1 + 7.
        assert_eq!(
            q.place(&seg(8, 0, true), 1),
            Err(DdpError::MsnNoBuffer { msn: 8 })
        );
    }

    #[test]
    fn msn_out_of_range() {
        let mut q = queue(&[(10, 'a'), (10, 'b')]);
        // Behind the window: MSN 0 precedes the initial MSN 1.
        let err = q.place(&seg(0, 0, true), 1).unwrap_err();
        assert_eq!(err, DdpError::MsnRange { msn: 0 });
        assert_code(err, 0x2, 0x03);
        // Beyond what the queue can ever hold (capacity 8 from MSN 1).
        assert_eq!(
            q.place(&seg(9, 0, true), 1),
            Err(DdpError::MsnRange { msn: 9 })
        );
        assert_eq!(
            q.place(&seg(0x8000_0000, 0, true), 1),
            Err(DdpError::MsnRange { msn: 0x8000_0000 })
        );
        // A message already delivered.
        q.place(&seg(1, 0, true), 1).unwrap();
        assert!(q.poll_delivery().is_some());
        assert_eq!(
            q.place(&seg(1, 0, true), 1),
            Err(DdpError::MsnRange { msn: 1 })
        );
    }

    #[test]
    fn invalid_mo() {
        let mut q = queue(&[(100, 'a')]);
        let err = q.place(&seg(1, 100, false), 1).unwrap_err();
        assert_eq!(err, DdpError::InvalidMo);
        assert_code(err, 0x2, 0x04);
        assert_eq!(
            q.place(&seg(1, u32::MAX, false), 1),
            Err(DdpError::InvalidMo)
        );
        assert_eq!(q.place(&seg(1, 101, true), 0), Err(DdpError::InvalidMo));
        // A zero-length segment at the very end is legal.
        assert!(q.place(&seg(1, 100, false), 0).is_ok());
    }

    #[test]
    fn message_too_long() {
        let mut q = queue(&[(100, 'a')]);
        let err = q.place(&seg(1, 90, true), 11).unwrap_err();
        assert_eq!(err, DdpError::MessageTooLong);
        assert_code(err, 0x2, 0x05);
        assert_eq!(
            q.place(&seg(1, 0, false), 101),
            Err(DdpError::MessageTooLong)
        );
        // Exactly filling the buffer is fine.
        q.place(&seg(1, 90, true), 10).unwrap();
        q.place(&seg(1, 0, false), 90).unwrap();
        assert_eq!(q.poll_delivery().map(|d| d.len), Some(100));
    }

    #[test]
    fn errors_leave_the_queue_unchanged() {
        let mut q = queue(&[(100, 'a')]);
        q.place(&seg(1, 0, false), 50).unwrap();
        assert!(q.place(&seg(1, 90, true), 20).is_err());
        assert!(q.place(&seg(2, 0, true), 1).is_err());
        assert_eq!(q.posted(), 1);
        assert_eq!(q.poll_delivery(), None);
        q.place(&seg(1, 50, true), 10).unwrap();
        assert_eq!(q.poll_delivery().map(|d| d.len), Some(60));
    }

    #[test]
    fn locate_checks_like_place_but_records_nothing() {
        let mut q = queue(&[(100, 'a'), (100, 'b')]);
        let early = q.locate(&seg(2, 40, true), 60).unwrap();
        assert_eq!((early.cookie, early.offset, early.msn), ('b', 40, 2));
        assert_eq!(
            q.locate(&seg(2, 90, true), 20),
            Err(DdpError::MessageTooLong)
        );
        assert_eq!(
            q.locate(&seg(9, 0, true), 1),
            Err(DdpError::MsnRange { msn: 9 })
        );
        // Nothing was recorded: the whole message, placed in order, is delivered once.
        q.place(&seg(1, 0, true), 10).unwrap();
        assert_eq!(q.poll_delivery().map(|d| d.msn), Some(1));
        assert_eq!(q.poll_delivery(), None);
        q.place(&seg(2, 0, false), 40).unwrap();
        assert_eq!(q.poll_delivery(), None);
        q.place(&seg(2, 40, true), 60).unwrap();
        assert_eq!(q.poll_delivery().map(|d| (d.msn, d.len)), Some((2, 100)));
    }

    #[test]
    fn last_segment_first_then_out_of_order() {
        let mut q = queue(&[(4096, 'a')]);
        q.place(&seg(1, 2000, true), 48).unwrap();
        assert_eq!(q.poll_delivery(), None);
        q.place(&seg(1, 1000, false), 1000).unwrap();
        assert_eq!(q.poll_delivery(), None);
        let p = q.place(&seg(1, 0, false), 1000).unwrap();
        assert_eq!(p.offset, 0);
        assert_eq!(
            q.poll_delivery(),
            Some(Delivered {
                cookie: 'a',
                msn: 1,
                len: 2048
            })
        );
    }

    #[test]
    fn later_message_complete_first_waits_for_earlier() {
        let mut q = queue(&[(100, 'a'), (100, 'b'), (100, 'c')]);
        q.place(&seg(3, 0, true), 3).unwrap();
        q.place(&seg(2, 0, true), 2).unwrap();
        assert_eq!(q.poll_delivery(), None, "MSN 1 is not placed yet");
        q.place(&seg(1, 10, true), 1).unwrap();
        assert_eq!(q.poll_delivery(), None, "MSN 1 has a hole");
        q.place(&seg(1, 0, false), 10).unwrap();
        let order: Vec<_> = std::iter::from_fn(|| q.poll_delivery())
            .map(|d| (d.cookie, d.msn, d.len))
            .collect();
        assert_eq!(order, vec![('a', 1, 11), ('b', 2, 2), ('c', 3, 3)]);
    }

    #[test]
    fn duplicates_are_placed_again_but_delivered_once() {
        let mut q = queue(&[(100, 'a'), (100, 'b')]);
        for _ in 0..3 {
            q.place(&seg(1, 0, false), 50).unwrap();
            q.place(&seg(1, 50, true), 50).unwrap();
        }
        // Repeated placement of a complete, not yet delivered message is allowed.
        q.place(&seg(1, 20, false), 10).unwrap();
        assert_eq!(q.poll_delivery().map(|d| (d.msn, d.len)), Some((1, 100)));
        assert_eq!(q.poll_delivery(), None);
        assert_eq!(q.posted(), 1);
    }

    #[test]
    fn inconsistent_last_segment() {
        let mut q = queue(&[(100, 'a')]);
        q.place(&seg(1, 0, true), 10).unwrap();
        let err = q.place(&seg(1, 10, false), 5).unwrap_err();
        assert_eq!(err, DdpError::BeyondMessageEnd);
        assert_code(err, 0x2, 0x04);
        assert_eq!(
            q.place(&seg(1, 0, true), 20),
            Err(DdpError::BeyondMessageEnd)
        );
    }

    #[test]
    fn zero_length_messages_consume_a_buffer() {
        let mut q = queue(&[(0, 'a'), (10, 'b')]);
        q.place(&seg(1, 0, true), 0).unwrap();
        q.place(&seg(2, 0, true), 0).unwrap();
        assert_eq!(
            q.poll_delivery(),
            Some(Delivered {
                cookie: 'a',
                msn: 1,
                len: 0
            })
        );
        assert_eq!(
            q.poll_delivery(),
            Some(Delivered {
                cookie: 'b',
                msn: 2,
                len: 0
            })
        );
        // A zero-length buffer cannot take payload.
        q.post(0, 'c').unwrap();
        assert_eq!(q.place(&seg(3, 0, true), 1), Err(DdpError::InvalidMo));
    }

    #[test]
    fn msn_wraps_from_ffffffff_to_zero() {
        let mut q = UntaggedQueue::with_next_msn(QN, 4, 0xFFFF_FFFE);
        for cookie in ['w', 'x', 'y', 'z'] {
            q.post(10, cookie).unwrap();
        }
        // Place in reverse MSN order across the wrap.
        for msn in [1u32, 0, 0xFFFF_FFFF, 0xFFFF_FFFE] {
            q.place(&seg(msn, 0, true), 1).unwrap();
        }
        let order: Vec<_> = std::iter::from_fn(|| q.poll_delivery())
            .map(|d| (d.cookie, d.msn))
            .collect();
        assert_eq!(
            order,
            vec![('w', 0xFFFF_FFFE), ('x', 0xFFFF_FFFF), ('y', 0), ('z', 1)]
        );
        assert_eq!(q.next_msn(), 2);
        // 0xFFFFFFFF is now behind the window.
        q.post(10, 'n').unwrap();
        assert_eq!(
            q.place(&seg(0xFFFF_FFFF, 0, true), 1),
            Err(DdpError::MsnRange { msn: 0xFFFF_FFFF })
        );
    }

    #[test]
    fn queue_full_is_local() {
        let mut q = UntaggedQueue::new(QN, 2);
        q.post(1, 1u8).unwrap();
        q.post(1, 2u8).unwrap();
        let err = q.post(1, 3u8).unwrap_err();
        assert_eq!(err, DdpError::QueueFull { max_posted: 2 });
        assert!(err.is_local());
        assert_eq!(q.posted(), 2);
    }

    #[test]
    fn drain_returns_undelivered_in_order() {
        let mut q = queue(&[(10, 'a'), (10, 'b'), (10, 'c')]);
        q.place(&seg(1, 0, true), 1).unwrap();
        q.place(&seg(2, 0, false), 1).unwrap();
        assert!(q.poll_delivery().is_some());
        assert_eq!(q.drain(), vec!['b', 'c']);
        assert_eq!(q.posted(), 0);
        assert_eq!(q.poll_delivery(), None);
        assert_eq!(q.next_msn(), 2);
    }
}
