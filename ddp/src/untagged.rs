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
            buffers: VecDeque::with_capacity(max_posted.min(1024)),
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
        if hdr.qn != self.qn {
            return Err(DdpError::InvalidQn { qn: hdr.qn });
        }
        let index = self.buffer_index(hdr.msn)?;
        let buffer = self
            .buffers
            .get_mut(index)
            .ok_or(DdpError::LocalCatastrophic)?;
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
        buffer.tracker.record(mo, payload_len, hdr.last)?;
        Ok(Placement {
            cookie: buffer.cookie,
            offset: hdr.mo,
            msn: hdr.msn,
        })
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
