//! The transmit side of an engine connection without a send-buffer copy: a bounded ring of
//! FPDU descriptors in flight, and the function that writes the wire octets of any stream
//! range from them (`tcp_engine::TxMode::Source`).
//!
//! A descriptor holds what is needed to produce its FPDU again at any time: its stream
//! offset and wire length, the few octets of DDP/RDMAP header (and the inline payload of Read
//! Requests, Terminates and RTRs), where the payload lies in registered memory
//! ([`TxPayload`]: STag, TO, length, access right) and, once computed, its CRC. Marker
//! positions follow from the stream offset (RFC 5044 4.3: every 512 octets from SeqStart,
//! the first octet after this direction's MPA Request or Reply).
//!
//! [`TxRing::fill`] walks the descriptors covering a stream range and writes, for each FPDU,
//! the part in range: ULPDU_Length, header, payload read straight from the registered region
//! into the output (the UMEM frame), PAD, CRC and Markers (RFC 5044 4.1-4.4). When a fill
//! covers a whole FPDU (the usual case: TCP sends whole FPDUs per segment) the CRC is computed
//! in the same pass, over the octets just written, and kept for later partial fills; a partial
//! fill that reaches the CRC field without a kept CRC computes it first in a separate pass.
//! A retransmission reads the region again (no retransmit copy); if the region is gone or no
//! longer covers the payload, the fill fails and nothing outside the region is ever read.
//!
//! Read Responses differ in whose memory they read: the responder's remotely readable region,
//! whose application cannot know when the Response is acknowledged (RFC 5040 4.2: nothing
//! completes on the responder), so it may deregister the region while a segment still needs
//! retransmitting. When a Read Response segment is queued its source is checked against the
//! region table (a deregistered or invalidated STag fails there, and rdmap answers the Read
//! with a Terminate) and the descriptor takes a handle to the region's bytes
//! ([`RegionBuffer::share`]: an `Arc` clone, an atomic increment, no allocation), released
//! with the descriptor when the segment is acknowledged. Transmissions and retransmissions
//! read the bytes through that handle, so they still deliver after a deregistration; not after
//! the application invalidated or re-registered the region ([`RegionLive`], RFC 5040 8.1.1:
//! revoked rights are gone at once): the fill fails, and the connection is reset, so that what
//! the application writes there after revoking the peer's right never leaves. As with
//! a hardware RNIC, the Response data is read when the segment is sent, not when the Read
//! Request arrived: local writes to the region after the Request may show in the Response
//! (and a retransmission carries what the region holds then); rewriting memory a Read may be
//! reading is an application race (RFC 5040 orders nothing there). It can cost the connection:
//! an FPDU retransmitted in part (the peer kept the first part of it: a window it trimmed, a
//! path MTU that fell) keeps the CRC of its first transmission, so a part read from memory
//! rewritten meanwhile fails the peer's CRC check, and the peer ends the connection (RFC 5040
//! 5.5 would only make the data indeterminate). Leave a Read's source alone until the Read has
//! completed at its requester, as a Send's or a Write's until it completes. An Atomic Request
//! of the same stream is ordered (RFC 7306 7): the ring counts its Read Response FPDUs, and
//! while any is unacknowledged the queue pair holds back an Atomic Request behind them
//! (`rdmap::QueuePair::set_read_responses_unacknowledged`). A buffer type that cannot
//! share (`share` gives `None`) is looked up again at each fill, like a Write's source.

use mpa::wire::{pad_len, MarkerPtr};
use mpa::FpduEncoder;
use rdmap::{
    Access, MemoryTable, PdId, RegionBuffer, RegionLive, SharedBuffer, Stag, StagHint, TxPayload,
};
use tcp_engine::wire::Checksum;
use tcp_engine::TxSourceError;

use copy_crc::{crc_update, crc_update_len_head};
use ift::wire::{crc_to_wire, FrameHeaderRepr, FRAME_HEADER_LEN as IFT_HEADER_LEN};
use ift::FrameFormat;

/// MPA Markers recur every 512 octets of the stream (RFC 5044 4.3).
const MARKER_INTERVAL: u64 = 512;
const CRC_LEN: usize = 4;
/// Largest inline part of a ULPDU: a whole Terminate (at most 70 octets), Read Request (46)
/// or RTR, or a DDP/RDMAP header (an untagged one is 18 octets) with the payload of an inline
/// work request (`rdmap::InlineSendWr`, at most [`rdmap::MAX_INLINE_DATA`] octets, which the
/// queue pair hands over with the header: it is kept in no region).
pub(crate) const HEAD_MAX: usize = 18 + rdmap::MAX_INLINE_DATA;
const _: () = assert!(HEAD_MAX <= u8::MAX as usize, "TxFpdu::head_len is a u8");
/// Octets read through the stack when a CRC must be computed over payload that is not being
/// written out.
const CRC_CHUNK: usize = 512;
/// Inline parts up to this long are kept in the descriptor itself (a tagged DDP/RDMAP header
/// is 14 octets, an untagged one 18); longer ones (Read Requests, Terminates) in the ring's
/// side table ([`TxRing::long_heads`]). Makes a descriptor one cache line.
const HEAD_INLINE: usize = 24;
/// How many FPDUs ahead of the one being written [`TxRing::fill`] prefetches the descriptor:
/// one segment takes a few microseconds, a miss a fraction of one.
const DESCRIPTOR_AHEAD: usize = 3;

/// One FPDU in flight: one cache line. Plain data (`Copy`): a slot is rewritten without
/// reading what it held (dropping an old value would load it from a line long out of cache).
/// A ring of 2048 of them is cycled through slot by slot, so a slot comes back cold: each
/// line of it is one miss when the FPDU is queued and one when it is written into a frame.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct TxFpdu {
    /// Stream offset of its first octet (a leading Marker included).
    pub start: u64,
    payload_to: u64,
    /// Octets on the wire, Markers included.
    pub wire_len: u32,
    payload_len: u32,
    payload_stag: Stag,
    /// The CRC (RFC 5044 4.4) once computed (`has_crc`).
    crc: u32,
    ulpdu_len: u16,
    /// Its acknowledgement completes a Send or Write (`rdmap::TxSegment::completes`).
    pub completes: bool,
    /// A Read Response whose source is held (in the ring's `held`, same slot) until the FPDU
    /// is acknowledged.
    held: bool,
    has_crc: bool,
    /// The payload left in registered memory (`TxFpdu::payload()`), kept field by field: a
    /// `TxPayload` stored as it is also moved its padding (the 7 octets after `access`),
    /// copied along from the segment rdmap built in overlapping 4-octet moves whose loads
    /// waited on the stores just made (failed store forwarding, the hottest instruction of
    /// the sender's FPDU queuing).
    has_payload: bool,
    payload_access: Access,
    head_len: u8,
    /// The inline part when at most [`HEAD_INLINE`] octets, else in the ring's `long_heads`.
    head: [u8; HEAD_INLINE],
}

const _: () = assert!(std::mem::size_of::<TxFpdu>() == 64);

/// A handle to a Read Response's source bytes and the payload's offset in them.
#[derive(Clone)]
struct Held {
    buf: SharedBuffer,
    off: usize,
    /// The registration's standing: once the application invalidates or re-registers the
    /// region, nothing more is read through `buf` (it may hold new data the peer has no
    /// right to).
    live: RegionLive,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").field("off", &self.off).finish()
    }
}

impl TxFpdu {
    pub fn end(&self) -> u64 {
        self.start + u64::from(self.wire_len)
    }

    /// The FPDU's DDP/RDMAP header and inline data: in the descriptor, or in `long_heads[k]`
    /// (its slot's) when longer than [`HEAD_INLINE`].
    #[inline]
    fn head<'a>(&'a self, long_heads: &'a [[u8; HEAD_MAX]], k: usize) -> Option<&'a [u8]> {
        let head_len = usize::from(self.head_len);
        if head_len <= HEAD_INLINE {
            self.head.get(..head_len)
        } else {
            long_heads.get(k).and_then(|h| h.get(..head_len))
        }
    }

    /// The CRC once computed.
    fn crc(&self) -> Option<u32> {
        self.has_crc.then_some(self.crc)
    }

    /// The payload in registered memory, if the FPDU has one (`rdmap::TxSegment::payload`).
    #[inline]
    fn payload(&self) -> Option<TxPayload> {
        self.has_payload.then_some(TxPayload {
            stag: self.payload_stag,
            to: self.payload_to,
            len: self.payload_len,
            access: self.payload_access,
        })
    }
}

/// Why a descriptor could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushError {
    /// The ring is full.
    Full,
    /// The inline part is longer than [`HEAD_MAX`] or the ULPDU longer than an FPDU takes.
    TooLong,
    /// A Read Response's source is not (or no longer) a valid region for it.
    Source,
}

/// The FPDUs of one connection not yet acknowledged, in stream order: a ring of descriptor
/// slots allocated once. A descriptor is written in its slot field by field (no 150-octet
/// descriptor built aside and moved in, no inline header zeroed first) and released by moving
/// the ring's head (nothing moved out): both run once per FPDU.
#[derive(Debug)]
pub(crate) struct TxRing {
    /// `capacity` slots; the live descriptors are `len` slots from `head`, wrapping.
    slots: Vec<TxFpdu>,
    /// Per slot, the held source of a Read Response FPDU (`TxFpdu::held`); touched only for
    /// those.
    held: Vec<Option<Held>>,
    /// Per slot, an inline part longer than [`HEAD_INLINE`]; touched only for those (allocated
    /// zeroed: for a ring of 2048 its pages are not even faulted in until used, so a
    /// connection that sends no inline work requests keeps a few pages of it resident).
    long_heads: Vec<[u8; HEAD_MAX]>,
    head: usize,
    len: usize,
    crc: bool,
    markers: bool,
    /// IFT framing (draft-williams-iwarp-ift-01 section 5.1) instead of MPA's: the format of
    /// our frames (`crc` and `markers` are then unused).
    ift: Option<FrameFormat>,
    /// Stream offset of SeqStart (Marker positions are counted from here).
    seq_start: u64,
    pd: PdId,
    /// Where the payload STag checked last was found ([`MemoryTable::validate_hinted`]).
    stag_hint: StagHint,
    /// Index (from the oldest descriptor) of the FPDU the last fill ended in: TCP asks for its
    /// stream in order (one segment after the other), so the next fill almost always starts
    /// there or in the one after; any other offset (a retransmission) is searched for.
    cursor: usize,
    /// Descriptors of Read Response FPDUs (their payload a responder's region, read at each
    /// fill): while any is unacknowledged an Atomic Request waits
    /// (`rdmap::QueuePair::set_read_responses_unacknowledged`).
    read_responses: usize,
}

impl TxFpdu {
    /// An unused slot.
    fn vacant() -> TxFpdu {
        TxFpdu {
            start: 0,
            wire_len: 0,
            ulpdu_len: 0,
            head_len: 0,
            head: [0; HEAD_INLINE],
            has_payload: false,
            payload_access: Access::NONE,
            payload_len: 0,
            payload_stag: Stag::new(0, 0),
            payload_to: 0,
            held: false,
            crc: 0,
            has_crc: false,
            completes: false,
        }
    }
}

impl TxRing {
    /// An empty ring of at most `capacity` descriptors (at least one; allocated now, never
    /// grown).
    pub fn new(capacity: usize) -> TxRing {
        let capacity = capacity.max(1);
        TxRing {
            slots: vec![TxFpdu::vacant(); capacity],
            held: (0..capacity).map(|_| None).collect(),
            long_heads: vec![[0; HEAD_MAX]; capacity],
            head: 0,
            len: 0,
            crc: false,
            markers: false,
            ift: None,
            seq_start: 0,
            pd: PdId(0),
            stag_hint: StagHint::default(),
            cursor: 0,
            read_responses: 0,
        }
    }

    /// Full Operation starts at stream offset `seq_start` with these settings.
    pub fn start(&mut self, crc: bool, markers: bool, seq_start: u64, pd: PdId) {
        self.crc = crc;
        self.markers = markers;
        self.ift = None;
        self.seq_start = seq_start;
        self.pd = pd;
    }

    /// IFT frames of `format` from stream offset `seq_start` on (after the adaption
    /// indication).
    pub fn start_ift(&mut self, format: FrameFormat, seq_start: u64, pd: PdId) {
        self.start(false, false, seq_start, pd);
        self.ift = Some(format);
    }

    /// Whether Read Response FPDUs are queued and not yet acknowledged.
    pub fn has_read_responses(&self) -> bool {
        self.read_responses > 0
    }

    pub fn is_full(&self) -> bool {
        self.len >= self.slots.len()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// No FPDU is queued (none is read from registered memory any more).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Octets of the ring's own buffers (its capacity, whether touched or not).
    pub fn octets(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<TxFpdu>()
            + self.held.capacity() * std::mem::size_of::<Option<Held>>()
            + self.long_heads.capacity() * HEAD_MAX
    }

    /// The slot of descriptor `i` (counted from the oldest); `i` < capacity.
    #[inline]
    fn slot(&self, i: usize) -> usize {
        let k = self.head + i;
        if k >= self.slots.len() {
            k - self.slots.len()
        } else {
            k
        }
    }

    /// Descriptor `i`, counted from the oldest.
    #[inline]
    fn get(&self, i: usize) -> Option<&TxFpdu> {
        if i < self.len {
            self.slots.get(self.slot(i))
        } else {
            None
        }
    }

    /// The live descriptors, oldest first.
    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = &TxFpdu> {
        (0..self.len).filter_map(|i| self.get(i))
    }

    /// Wire length of an FPDU carrying `ulpdu_len` octets starting at stream offset `start`.
    #[inline]
    pub fn wire_len(&self, start: u64, ulpdu_len: usize) -> usize {
        if let Some(fmt) = &self.ift {
            // The frame's header and payload sizes add up to the ULPDU's length.
            return ift_frame_len(fmt, ulpdu_len);
        }
        let position = start.wrapping_sub(self.seq_start) as u32;
        FpduEncoder::with_position(self.crc, self.markers, position).wire_len(ulpdu_len)
    }

    /// Queues the FPDU at stream offset `start` whose ULPDU is `head` followed by `payload`.
    /// Returns its wire length.
    pub fn push<B: RegionBuffer>(
        &mut self,
        start: u64,
        head: &[u8],
        payload: Option<TxPayload>,
        completes: bool,
        mem: &MemoryTable<B>,
    ) -> Result<usize, PushError> {
        if self.is_full() {
            return Err(PushError::Full);
        }
        let ulpdu_len = head.len() + payload.map_or(0, |p| p.len as usize);
        if head.len() > HEAD_MAX || ulpdu_len > usize::from(u16::MAX) {
            return Err(PushError::TooLong);
        }
        let mut held = None;
        let read_response = payload.is_some_and(|p| p.access == Access::REMOTE_READ);
        if let Some(p) = payload.filter(|_| read_response) {
            let (buf, off) = mem
                .validate(p.stag, self.pd, p.access, p.to, u64::from(p.len))
                .map_err(|_| PushError::Source)?;
            held = buf
                .share()
                .zip(mem.live(p.stag))
                .map(|(buf, live)| Held { buf, off, live });
        }
        let wire_len = self.wire_len(start, ulpdu_len);
        let k = self.slot(self.len);
        let f = &mut self.slots[k];
        f.start = start;
        f.wire_len = wire_len as u32;
        f.ulpdu_len = ulpdu_len as u16;
        f.head_len = head.len() as u8;
        if head.len() <= HEAD_INLINE {
            copy_short(&mut f.head[..head.len()], head);
        } else {
            self.long_heads[k][..head.len()].copy_from_slice(head);
        }
        f.has_payload = payload.is_some();
        if let Some(p) = payload {
            f.payload_stag = p.stag;
            f.payload_to = p.to;
            f.payload_len = p.len;
            f.payload_access = p.access;
        }
        f.held = held.is_some();
        f.has_crc = false;
        f.completes = completes;
        if held.is_some() {
            // A released slot's was dropped with its FPDU.
            self.held[k] = held;
        }
        self.read_responses += usize::from(read_response);
        self.len += 1;
        Ok(wire_len)
    }

    /// Drops the descriptors wholly below stream offset `acked`, calling `released` for each.
    pub fn release_to(&mut self, acked: u64, mut released: impl FnMut(&TxFpdu)) {
        while self.len > 0 {
            // The ones after: written a round trip ago, out of cache by now.
            self.prefetch_descriptor(DESCRIPTOR_AHEAD);
            let f = &self.slots[self.head];
            if f.end() > acked {
                break;
            }
            released(f);
            if f.has_payload && f.payload_access == Access::REMOTE_READ {
                self.read_responses -= 1;
            }
            if f.held {
                // A held Read Response source goes with its FPDU.
                self.held[self.head] = None;
            }
            self.head += 1;
            if self.head == self.slots.len() {
                self.head = 0;
            }
            self.len -= 1;
            self.cursor = self.cursor.saturating_sub(1);
        }
    }

    /// Drops every descriptor (the connection is gone).
    pub fn clear(&mut self) {
        for h in &mut self.held {
            *h = None;
        }
        self.head = 0;
        self.len = 0;
        self.cursor = 0;
        self.read_responses = 0;
    }

    /// Writes the stream octets `[offset, offset + out.len())`, which must lie in queued
    /// FPDUs, reading payload from `mem`. Returns the ones' complement sum of `out` (RFC 1071,
    /// as `Checksum::sum` gives it: TCP's checksum of the payload, `TxSource::fill_summed`),
    /// computed as the octets are written; a whole FPDU's payload is summed by the copy that
    /// moves it ([`RegionBuffer::read_at_crc_sum`]) where the buffer can.
    pub fn fill<B: RegionBuffer>(
        &mut self,
        offset: u64,
        out: &mut [u8],
        mem: &MemoryTable<B>,
    ) -> Result<u16, TxSourceError> {
        let err = TxSourceError {
            offset,
            len: out.len(),
        };
        let first = self.find(offset);
        let mut pos = offset;
        let mut done = 0;
        let w = FpduWriter {
            crc: self.crc,
            markers: self.markers,
            seq_start: self.seq_start,
        };
        let mut i = first;
        let mut sum = Checksum::new();
        // The region of the last payload written: (STag, TO, buffer and offset).
        let mut last = None;
        while done < out.len() {
            if i >= self.len {
                return Err(err);
            }
            let k = self.slot(i);
            let Some(f) = self.slots.get(k) else {
                return Err(err);
            };
            let held = if f.held {
                self.held.get(k).and_then(Option::as_ref)
            } else {
                None
            };
            if f.start > pos {
                return Err(err);
            }
            let from = (pos - f.start) as usize;
            let n = (f.wire_len as usize - from).min(out.len() - done);
            let head = f.head(&self.long_heads, k).ok_or(err)?;
            let ift = self.ift;
            let (part, crc) = match held {
                Some(h) => {
                    if !h.live.is_live() {
                        return Err(err);
                    }
                    let region = Some((&*h.buf, h.off));
                    match &ift {
                        Some(fmt) => ift_fill(fmt, f, head, region, from, &mut out[done..done + n]),
                        None => w.fill_from(f, head, region, from, &mut out[done..done + n]),
                    }
                }
                None => {
                    let region = match f.payload() {
                        Some(p) => {
                            let found = mem
                                .validate_hinted(
                                    p.stag,
                                    self.pd,
                                    p.access,
                                    p.to,
                                    u64::from(p.len),
                                    &mut self.stag_hint,
                                )
                                .map_err(|_| err)?;
                            last = Some((p.stag, p.to, found));
                            Some(found)
                        }
                        None => None,
                    };
                    match &ift {
                        Some(fmt) => ift_fill(fmt, f, head, region, from, &mut out[done..done + n]),
                        None => w.fill_from(f, head, region, from, &mut out[done..done + n]),
                    }
                }
            };
            if let (Some(c), Some(f)) = (crc, self.slots.get_mut(k)) {
                f.crc = c;
                f.has_crc = true;
            }
            sum = sum.add_sum_at(done, part);
            done += n;
            pos += n as u64;
            self.cursor = i;
            i += 1;
        }
        // One FPDU further than the next: the next one's payload was asked for by the fill
        // before, and a prefetch issued only one segment ahead had not landed by the time the
        // copy read it (the copy's loads were its stall in the sender's profile).
        self.prefetch(i + 1, last, mem);
        self.prefetch_descriptor(i + DESCRIPTOR_AHEAD);
        Ok(sum.sum())
    }

    /// [`fill`](Self::fill) of a segment that is exactly one whole FPDU without Markers (MPA
    /// framing: the usual segment), the `len` octets from `offset` written into a packet in
    /// pieces (`first` whole, then on through `rest`) in one pass, the CRC carried across them
    /// (RFC 5044 4.4). `None` where the segment is not such an FPDU, or its headers do not fit
    /// in `first`: the caller then fills piece by piece. Otherwise the ones' complement sum
    /// of the octets, or the error of a source that is no longer valid.
    pub fn fill_whole_split<B: RegionBuffer>(
        &mut self,
        offset: u64,
        len: usize,
        first: &mut [u8],
        rest: &mut [&mut [u8]],
        mem: &MemoryTable<B>,
    ) -> Option<Result<u16, TxSourceError>> {
        if self.ift.is_some() || self.markers {
            return None;
        }
        let i = self.find(offset);
        if i >= self.len {
            return None;
        }
        let k = self.slot(i);
        let f = self.slots.get(k)?;
        if f.start != offset || f.wire_len as usize != len {
            return None;
        }
        let err = TxSourceError { offset, len };
        let Some(head) = f.head(&self.long_heads, k) else {
            return Some(Err(err));
        };
        let w = FpduWriter {
            crc: self.crc,
            markers: false,
            seq_start: self.seq_start,
        };
        let mut last = None;
        // A held source as `fill` takes it: where the descriptor says so and one is kept.
        let held = if f.held {
            self.held.get(k).and_then(Option::as_ref)
        } else {
            None
        };
        let written = match held {
            Some(h) if !h.live.is_live() => return Some(Err(err)),
            Some(h) => w.whole_unmarked_split(f, head, Some((&*h.buf, h.off)), first, rest),
            None => {
                let region = match f.payload() {
                    Some(p) => {
                        let Ok(found) = mem.validate_hinted(
                            p.stag,
                            self.pd,
                            p.access,
                            p.to,
                            u64::from(p.len),
                            &mut self.stag_hint,
                        ) else {
                            return Some(Err(err));
                        };
                        last = Some((p.stag, p.to, found));
                        Some(found)
                    }
                    None => None,
                };
                w.whole_unmarked_split(f, head, region, first, rest)
            }
        };
        let (sum, crc) = written?;
        if let (Some(c), Some(f)) = (crc, self.slots.get_mut(k)) {
            f.crc = c;
            f.has_crc = true;
        }
        self.cursor = i;
        // As far ahead as `fill` reaches after the FPDU it wrote (see there).
        self.prefetch(i + 2, last, mem);
        self.prefetch_descriptor(i + 1 + DESCRIPTOR_AHEAD);
        Some(Ok(sum))
    }

    /// Asks the CPU for the cache lines of descriptor `i` (reads nothing). A descriptor is
    /// written when its FPDU is queued, up to `capacity` FPDUs before TCP sends it, and the
    /// payload streamed through the cache since has evicted it: the prefetch of the next
    /// FPDU's payload waited on loading it.
    fn prefetch_descriptor(&self, i: usize) {
        if let Some(f) = self.get(i) {
            copy_crc::prefetch(f);
        }
    }

    /// Prefetches the payload of FPDU `i` if it was never written (TCP asks for FPDUs in
    /// order, one segment each; their source in a large registered region is often out of
    /// cache). `last`: the region the fill just read (STag, TO, buffer and offset); a payload
    /// further on in the same STag is found from it without a second lookup (a prefetch reads
    /// nothing and is clamped to the buffer, so it needs no access check).
    fn prefetch<B: RegionBuffer>(
        &self,
        i: usize,
        last: Option<(Stag, u64, (&B, usize))>,
        mem: &MemoryTable<B>,
    ) {
        let Some(f) = self.get(i) else { return };
        if f.has_crc {
            return;
        }
        let held = self.held.get(self.slot(i)).and_then(Option::as_ref);
        if let (Some(h), Some(p), true) = (held, f.payload(), f.held) {
            h.buf.prefetch(h.off, p.len as usize);
        } else if let Some(p) = f.payload() {
            let near = last.and_then(|(stag, to, (buf, off))| {
                let ahead = usize::try_from(p.to.checked_sub(to)?).ok()?;
                (stag == p.stag).then_some((buf, off.checked_add(ahead)?))
            });
            let found = near.or_else(|| {
                mem.validate(p.stag, self.pd, p.access, p.to, u64::from(p.len))
                    .ok()
            });
            if let Some((buf, off)) = found {
                buf.prefetch(off, p.len as usize);
            }
        }
    }

    /// Index of the FPDU holding stream offset `offset` (of the first FPDU ending after it):
    /// the cursor's or the next one when the fill continues in order, else a binary search.
    fn find(&self, offset: u64) -> usize {
        for i in [self.cursor, self.cursor + 1] {
            if let Some(f) = self.get(i) {
                if f.start <= offset && offset < f.end() {
                    return i;
                }
            }
        }
        // The first descriptor ending after `offset` (ends grow along the ring).
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.get(mid).is_some_and(|f| f.end() <= offset) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// `dst.copy_from_slice(src)` for the few octets of an inline header (at most [`HEAD_MAX`])
/// by fixed-size moves: a `copy_from_slice` of a length known only at run time is a call into
/// `memcpy`, once per FPDU queued and once per FPDU written.
#[inline]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    debug_assert_eq!(dst.len(), n);
    if dst.len() != n {
        return;
    }
    if n >= 8 {
        let mut k = 0;
        while k + 8 <= n {
            dst[k..k + 8].copy_from_slice(&src[k..k + 8]);
            k += 8;
        }
        if k < n {
            // The last 8 octets, overlapping ones already written with the same values.
            dst[n - 8..].copy_from_slice(&src[n - 8..]);
        }
    } else if n >= 4 {
        dst[..4].copy_from_slice(&src[..4]);
        dst[n - 4..].copy_from_slice(&src[n - 4..]);
    } else {
        if n > 0 {
            dst[0] = src[0];
        }
        if n > 1 {
            dst[1] = src[1];
        }
        if n > 2 {
            dst[2] = src[2];
        }
    }
}

/// Octets of the IFT frame (draft-williams-iwarp-ift-01 section 5.1) of a ULPDU of
/// `ulpdu_len` octets: the frame header, the ULPDU (DDP header and payload) and the CRCs
/// `fmt` has.
#[inline]
pub(crate) fn ift_frame_len(fmt: &FrameFormat, ulpdu_len: usize) -> usize {
    let crcs = usize::from(fmt.header_crc) + usize::from(fmt.payload_crc);
    IFT_HEADER_LEN + ulpdu_len + crcs * CRC_LEN
}

/// Writes the octets `[from, from + out.len())` of FPDU `f`'s IFT frame (draft section 5.1):
/// header_size, payload_size and the peer's VTag, the DDP header (the first octets of `head`),
/// the header CRC over those two if `fmt` has it, the payload (the rest of `head`, then the
/// region's octets), the payload CRC if `fmt` has it; no padding. Returns the ones' complement
/// sum of `out` and the payload CRC if computed now (a fill covering the whole payload computes
/// it as the copy goes; a part reaching the payload CRC field without it reads the payload
/// once more). The header CRC covers at most 24 octets and is computed at every fill. The sum
/// is taken from what is written, the region's octets from the copy's own pass where the
/// buffer gives it (`RegionBuffer::read_at_crc_sum`), so `out` is not read back.
fn ift_fill<B: RegionBuffer + ?Sized>(
    fmt: &FrameFormat,
    f: &TxFpdu,
    head: &[u8],
    region: Option<(&B, usize)>,
    from: usize,
    out: &mut [u8],
) -> (u16, Option<u32>) {
    let h = ddp::wire::DdpSegment::new_unchecked(head)
        .header_len()
        .min(head.len());
    let (ddp_header, inline) = head.split_at(h);
    let payload_len = usize::from(f.ulpdu_len).saturating_sub(h);
    let region_len = payload_len.saturating_sub(inline.len());
    // Frame header, DDP header and header CRC: at most 6 + 18 + 4 octets, built whole.
    let mut front = [0u8; IFT_HEADER_LEN + ddp::wire::UNTAGGED_HEADER_LEN + CRC_LEN];
    FrameHeaderRepr {
        header_size: h as u16,
        payload_size: payload_len as u16,
        vtag: fmt.vtag,
    }
    .emit(&mut front[..IFT_HEADER_LEN]);
    front[IFT_HEADER_LEN..IFT_HEADER_LEN + h].copy_from_slice(ddp_header);
    let mut front_len = IFT_HEADER_LEN + h;
    if fmt.header_crc {
        let crc = !crc_update(u32::MAX, &front[..front_len]);
        front[front_len..front_len + CRC_LEN].copy_from_slice(&crc_to_wire(crc));
        front_len += CRC_LEN;
    }
    let end = from + out.len();
    // Writes the part of `bytes` (at frame offset `at`) that falls in the window, and adds it
    // to the sum (from `bytes`: a few octets, not read back from `out`).
    let put = |at: usize, bytes: &[u8], out: &mut [u8], sum: Checksum| {
        let a = at.max(from);
        let b = (at + bytes.len()).min(end);
        if a < b {
            let piece = &bytes[a - at..b - at];
            out[a - from..b - from].copy_from_slice(piece);
            sum.add_sum_at(a - from, Checksum::new().add_bytes(piece).sum())
        } else {
            sum
        }
    };
    let mut sum = put(0, &front[..front_len], out, Checksum::new());
    sum = put(front_len, inline, out, sum);
    let region_at = front_len + inline.len();
    let crc_at = front_len + payload_len;
    let whole_payload = from <= front_len && end >= crc_at;
    let mut computed = None;
    let mut crc_state = u32::MAX;
    let want_crc = fmt.payload_crc && f.crc().is_none();
    if want_crc && whole_payload {
        crc_state = crc_update(crc_state, inline);
    }
    // The region's part in the window.
    let a = region_at.max(from);
    let b = (region_at + region_len).min(end);
    if a < b {
        let dst = &mut out[a - from..b - from];
        let part = match region {
            Some((buf, off)) if want_crc && whole_payload => {
                buf.read_at_crc_sum(off + (a - region_at), dst, &mut crc_state)
            }
            Some((buf, off)) => {
                buf.read_at(off + (a - region_at), dst);
                None
            }
            // A descriptor with region payload always has its region (`TxRing::fill`).
            None => {
                dst.fill(0);
                Some(0)
            }
        };
        // `None`: the buffer copied without summing.
        let part = part.unwrap_or_else(|| Checksum::new().add_bytes(dst).sum());
        sum = sum.add_sum_at(a - from, part);
    }
    if want_crc && whole_payload {
        computed = Some(!crc_state);
    }
    if fmt.payload_crc && end > crc_at {
        let crc = match (f.crc(), computed) {
            (Some(c), _) | (None, Some(c)) => c,
            (None, None) => {
                // A part reaching the payload CRC field without the whole payload in it, and
                // the CRC never computed: read the payload for it first.
                let mut state = crc_update(u32::MAX, inline);
                if let Some((buf, off)) = region {
                    let mut tmp = [0u8; CRC_CHUNK];
                    let mut done = 0;
                    while done < region_len {
                        let m = (region_len - done).min(CRC_CHUNK);
                        buf.read_at_crc(off + done, &mut tmp[..m], &mut state);
                        done += m;
                    }
                }
                computed = Some(!state);
                !state
            }
        };
        sum = put(crc_at, &crc_to_wire(crc), out, sum);
    }
    (sum.sum(), computed)
}

/// Writes parts of FPDUs.
struct FpduWriter {
    crc: bool,
    markers: bool,
    seq_start: u64,
}

/// Where the octets of one content run come from.
enum Src<'a, B: ?Sized> {
    Bytes(&'a [u8]),
    Region(&'a B, usize),
    Zeros,
}

/// One pass over an FPDU's wire image: writes the octets in `[from, from + out.len())` and,
/// if `crc` is set, feeds every covered octet to it.
struct Pass<'o> {
    out: &'o mut [u8],
    from: usize,
    /// Wire offset (within the FPDU) of the next octet.
    w: usize,
    /// Stream position of the FPDU's first octet relative to SeqStart.
    rel_start: u64,
    markers: bool,
    /// Wire offset of the ULPDU_Length field.
    header_w: usize,
    /// The running CRC32c register (`Crc32c::state`: all ones at the start, the CRC is its
    /// complement).
    crc: Option<u32>,
    /// The ones' complement sum of the octets written to `out` so far, carries not folded,
    /// byte-swapped: an octet at an even offset of `out` adds itself, one at an odd offset
    /// itself times 256 (RFC 1071 2(B): the sum of little-endian 16-bit words; no carry is
    /// lost below 2^48 octets).
    sum: u64,
}

impl Pass<'_> {
    fn to(&self) -> usize {
        self.from + self.out.len()
    }

    fn at_marker(&self) -> bool {
        self.markers && (self.rel_start + self.w as u64).is_multiple_of(MARKER_INTERVAL)
    }

    /// Octets `[a, a + n)` of the wire image: the part inside the output range.
    fn window(&self, a: usize, n: usize) -> Option<(usize, usize, usize)> {
        let lo = a.max(self.from);
        let hi = (a + n).min(self.to());
        (lo < hi).then(|| (lo - a, lo - self.from, hi - lo))
    }

    /// Adds `out[at..at + n]`, just written, to the sum: octet by octet when short (the
    /// length field, header, PAD, CRC and Markers: a few octets each), else through
    /// [`Checksum`].
    fn sum_out(&mut self, at: usize, n: usize) {
        let bytes = &self.out[at..at + n];
        if n <= 32 {
            for (k, &b) in bytes.iter().enumerate() {
                self.sum += u64::from(b) << (8 * ((at + k) & 1));
            }
        } else {
            self.add_part(at, Checksum::new().add_bytes(bytes).sum());
        }
    }

    /// Adds the ones' complement sum `part` (as `Checksum::sum` gives it) of octets written
    /// at offset `at` of `out`.
    fn add_part(&mut self, at: usize, part: u16) {
        // The sum is kept byte-swapped: an even offset adds the swapped value.
        self.sum += u64::from(if at % 2 == 1 { part } else { part.swap_bytes() });
    }

    /// The ones' complement sum of what was written, as `Checksum::sum` gives it.
    fn out_sum(&self) -> u16 {
        Checksum::from_le_sum(self.sum).sum()
    }

    fn put_bytes(&mut self, bytes: &[u8], covered: bool) {
        if let Some((skip, at, n)) = self.window(self.w, bytes.len()) {
            self.out[at..at + n].copy_from_slice(&bytes[skip..skip + n]);
            self.sum_out(at, n);
        }
        if covered {
            if let Some(c) = self.crc.as_mut() {
                *c = crc_update(*c, bytes);
            }
        }
        self.w += bytes.len();
    }

    fn marker(&mut self, value: u16) {
        // RFC 5044 4.3: 16 reserved zero bits, then FPDUPTR.
        self.put_bytes(&MarkerPtr::new(value).to_bytes(), true);
    }

    /// `n` content octets from `src` (at `src_off`), with Markers inserted where they fall.
    fn content<B: RegionBuffer + ?Sized>(&mut self, src: Src<'_, B>, n: usize) {
        let mut off = 0;
        while off < n {
            let run = if self.markers {
                if self.at_marker() {
                    let distance = (self.w - self.header_w) as u16;
                    self.marker(distance);
                }
                let into = ((self.rel_start + self.w as u64) % MARKER_INTERVAL) as usize;
                (MARKER_INTERVAL as usize - into).min(n - off)
            } else {
                n - off
            };
            match &src {
                Src::Bytes(b) => self.put_bytes(&b[off..off + run], true),
                Src::Zeros => {
                    const Z: [u8; 3] = [0; 3];
                    // PAD: at most 3 octets.
                    self.put_bytes(&Z[..run.min(3)], true);
                }
                Src::Region(buf, base) => self.region(*buf, base + off, run),
            }
            off += run;
        }
    }

    fn region<B: RegionBuffer + ?Sized>(&mut self, buf: &B, at: usize, n: usize) {
        let whole = self.w >= self.from && self.w + n <= self.to();
        if whole {
            // The usual case: straight into the output, the CRC folded in as the octets are
            // copied (`RegionBuffer::read_at_crc`), never read back from the output.
            // The TCP checksum's sum too, where the buffer can give it from the same pass.
            let o = self.w - self.from;
            let dst = &mut self.out[o..o + n];
            let summed = match self.crc.as_mut() {
                Some(c) => buf.read_at_crc_sum(at, dst, c),
                None => {
                    buf.read_at(at, dst);
                    None
                }
            };
            match summed {
                Some(part) => self.add_part(o, part),
                None => self.sum_out(o, n),
            }
        } else if self.crc.is_some() {
            let mut tmp = [0u8; CRC_CHUNK];
            let mut k = 0;
            while k < n {
                let m = (n - k).min(CRC_CHUNK);
                buf.read_at(at + k, &mut tmp[..m]);
                if let Some(c) = self.crc.as_mut() {
                    *c = crc_update(*c, &tmp[..m]);
                }
                if let Some((skip, o, len)) = self.window(self.w + k, m) {
                    self.out[o..o + len].copy_from_slice(&tmp[skip..skip + len]);
                    self.sum_out(o, len);
                }
                k += m;
            }
        } else if let Some((skip, o, len)) = self.window(self.w, n) {
            buf.read_at(at + skip, &mut self.out[o..o + len]);
            self.sum_out(o, len);
        }
        self.w += n;
    }
}

impl FpduWriter {
    /// Returns the ones' complement sum of `out` and the CRC if computed now.
    fn fill_from<B: RegionBuffer + ?Sized>(
        &self,
        f: &TxFpdu,
        head: &[u8],
        region: Option<(&B, usize)>,
        from: usize,
        out: &mut [u8],
    ) -> (u16, Option<u32>) {
        let wire_len = f.wire_len as usize;
        let whole = from == 0 && out.len() == wire_len;
        if whole && !self.markers {
            // The usual case: a whole FPDU per segment, no Markers.
            return self.whole_unmarked(f, head, region, out);
        }
        if !self.crc {
            return (self.pass(f, head, Some(0), region, from, out).1, None);
        }
        if whole {
            let (crc, sum) = self.pass(f, head, None, region, from, out);
            return (sum, Some(crc));
        }
        let mut computed = None;
        let crc = match f.crc() {
            Some(c) => c,
            None if from + out.len() > wire_len - CRC_LEN => {
                // A part reaching the CRC field, never sent whole: compute the CRC first.
                let c = self.pass(f, head, None, region, 0, &mut []).0;
                computed = Some(c);
                c
            }
            // Not written: the part ends before the CRC field.
            None => 0,
        };
        (self.pass(f, head, Some(crc), region, from, out).1, computed)
    }

    /// A whole FPDU without Markers (`out` is exactly its wire image): ULPDU_Length and the
    /// inline header written, summed and CRC'd as one piece, the payload by the copy that
    /// sums it and folds it into the CRC, PAD, then the CRC field (RFC 5044 4.1, 4.4). The
    /// same octets as [`pass`](Self::pass) (the unit tests compare both), without its
    /// per-piece window and Marker checks. Returns the ones' complement sum of `out` and, when
    /// CRCs are on, the CRC for the descriptor to keep.
    fn whole_unmarked<B: RegionBuffer + ?Sized>(
        &self,
        f: &TxFpdu,
        head: &[u8],
        region: Option<(&B, usize)>,
        out: &mut [u8],
    ) -> (u16, Option<u32>) {
        let pl = match (region, f.payload()) {
            (Some(_), Some(p)) => p.len as usize,
            _ => 0,
        };
        let h = 2 + head.len();
        let pad = pad_len(usize::from(f.ulpdu_len));
        debug_assert_eq!(out.len(), h + pl + pad + CRC_LEN);
        let (hdr, rest) = out.split_at_mut(h);
        let (mut sum, mut crc) = self.write_head(f, head, hdr);
        let (dst, rest) = rest.split_at_mut(pl);
        if let (Some((buf, base)), false) = (region, dst.is_empty()) {
            let part = if self.crc {
                buf.read_at_crc_sum(base, dst, &mut crc)
            } else {
                buf.read_at(base, dst);
                None
            };
            // `None`: the buffer copied (and CRC'd) without summing.
            let part = part.unwrap_or_else(|| Checksum::new().add_bytes(dst).sum());
            sum = sum.add_sum_at(h, part);
        }
        let (pad_out, field) = rest.split_at_mut(pad);
        // At most 3 octets: `copy_short`'s moves, not a call into `memset`.
        copy_short(pad_out, &[0u8; 3][..pad]);
        let value = self.crc_field(crc, pad);
        // RFC 5044 4.4: least significant octet first (IWARP-WIRE.md 1.2). The field starts
        // at a multiple of 4 (ULPDU_Length, ULPDU and PAD fill whole words).
        let bytes = value.to_le_bytes();
        field.copy_from_slice(&bytes);
        (sum.add_4(bytes).sum(), self.crc.then_some(value))
    }

    /// Writes ULPDU_Length and the inline header `head` into `hdr` (`2 + head.len()` octets)
    /// and returns their ones' complement sum and the CRC32c so far (RFC 5044 4.1, 4.4; the
    /// CRC's initial value when CRCs are off), both from the descriptor, not read back from
    /// `hdr`: loads spanning the small stores just made would wait for them (store
    /// forwarding fails).
    #[inline]
    fn write_head(&self, f: &TxFpdu, head: &[u8], hdr: &mut [u8]) -> (Checksum, u32) {
        let len = f.ulpdu_len.to_be_bytes();
        hdr[..2].copy_from_slice(&len);
        copy_short(&mut hdr[2..], head);
        let sum = Checksum::new().add_2(len).add_short(head);
        let crc = if self.crc {
            crc_update_len_head(u32::MAX, f.ulpdu_len, head)
        } else {
            u32::MAX
        };
        (sum, crc)
    }

    /// The CRC field's value (RFC 5044 4.4) from the CRC run over ULPDU_Length and the ULPDU:
    /// PAD's `pad` zeros folded in, then complemented; 0 without CRCs.
    #[inline]
    fn crc_field(&self, crc: u32, pad: usize) -> u32 {
        match (self.crc, pad) {
            (false, _) => 0,
            (true, 0) => !crc,
            (true, _) => !crc_update(crc, &[0u8; 3][..pad]),
        }
    }

    /// [`whole_unmarked`](Self::whole_unmarked) into a packet in pieces: the FPDU's octets
    /// from the start of `first` on, then through `rest` in order (the last piece written only
    /// as far as the FPDU goes), the payload copied, summed and CRC'd piece by piece with the
    /// CRC carried from one to the next, PAD and the CRC field after it wherever they fall.
    /// `None` (nothing written) if ULPDU_Length and the inline header do not fit in `first` or
    /// the pieces hold less than the FPDU.
    fn whole_unmarked_split<B: RegionBuffer + ?Sized>(
        &self,
        f: &TxFpdu,
        head: &[u8],
        region: Option<(&B, usize)>,
        first: &mut [u8],
        rest: &mut [&mut [u8]],
    ) -> Option<(u16, Option<u32>)> {
        let pl = match (region, f.payload()) {
            (Some(_), Some(p)) => p.len as usize,
            _ => 0,
        };
        let h = 2 + head.len();
        let pad = pad_len(usize::from(f.ulpdu_len));
        let trailer_len = pad + CRC_LEN;
        if first.len() < h || tcp_engine::pieces_len(first, rest) < h + pl + trailer_len {
            return None;
        }
        let (hdr, first_rest) = first.split_at_mut(h);
        let (mut sum, mut crc) = self.write_head(f, head, hdr);
        let mut payload_left = pl;
        let mut trailer = [0u8; 3 + CRC_LEN];
        let mut trailer_at = 0;
        let mut value = None;
        // Octets of the FPDU written so far.
        let mut at = h;
        for dst in std::iter::once(first_rest).chain(rest.iter_mut().map(|p| &mut **p)) {
            let mut o = 0;
            if payload_left > 0 {
                if let Some((buf, base)) = region {
                    let n = dst.len().min(payload_left);
                    let d = &mut dst[..n];
                    let part = if self.crc {
                        buf.read_at_crc_sum(base + (pl - payload_left), d, &mut crc)
                    } else {
                        buf.read_at(base + (pl - payload_left), d);
                        None
                    };
                    let part = part.unwrap_or_else(|| Checksum::new().add_bytes(d).sum());
                    sum = sum.add_sum_at(at, part);
                    payload_left -= n;
                    o = n;
                    at += n;
                }
            }
            if payload_left > 0 {
                continue;
            }
            if value.is_none() {
                let v = self.crc_field(crc, pad);
                // RFC 5044 4.4: least significant octet first, after PAD's zeros.
                trailer[pad..trailer_len].copy_from_slice(&v.to_le_bytes());
                value = Some(v);
            }
            let n = (dst.len() - o).min(trailer_len - trailer_at);
            let part = &trailer[trailer_at..trailer_at + n];
            dst[o..o + n].copy_from_slice(part);
            sum = sum.add_sum_at(at, Checksum::new().add_bytes(part).sum());
            trailer_at += n;
            at += n;
            if trailer_at == trailer_len {
                break;
            }
        }
        debug_assert_eq!(at, h + pl + trailer_len);
        Some((sum.sum(), value.filter(|_| self.crc)))
    }

    /// One pass; returns the CRC and the ones' complement sum of `out`. The CRC is computed in
    /// the pass unless `known` gives the value to write (the one kept; 0 without CRCs or where
    /// only octets before the CRC field are written).
    fn pass<B: RegionBuffer + ?Sized>(
        &self,
        f: &TxFpdu,
        head: &[u8],
        known: Option<u32>,
        region: Option<(&B, usize)>,
        from: usize,
        out: &mut [u8],
    ) -> (u32, u16) {
        let compute = known.is_none();
        let mut p = Pass {
            out,
            from,
            w: 0,
            rel_start: f.start.wrapping_sub(self.seq_start),
            markers: self.markers,
            header_w: 0,
            crc: compute.then_some(u32::MAX),
            sum: 0,
        };
        if p.at_marker() {
            // A Marker between FPDUs holds 0 and belongs to (is covered by the CRC of) the
            // next FPDU (RFC 5044 4.3, 4.4).
            p.marker(0);
        }
        p.header_w = p.w;
        let len = f.ulpdu_len.to_be_bytes();
        p.content::<B>(Src::Bytes(&len), len.len());
        p.content::<B>(Src::Bytes(head), head.len());
        if let (Some((buf, base)), Some(pl)) = (region, f.payload()) {
            p.content(Src::Region(buf, base), pl.len as usize);
        }
        let pad = pad_len(usize::from(f.ulpdu_len));
        p.content::<B>(Src::Zeros, pad);
        if p.at_marker() {
            // A Marker right after the PAD is covered by this FPDU's CRC (RFC 5044 4.4).
            let distance = (p.w - p.header_w) as u16;
            p.marker(distance);
        }
        let crc = match (&p.crc, known) {
            (Some(c), None) => !c,
            (_, known) => known.unwrap_or(0),
        };
        let crc = if self.crc { crc } else { 0 };
        // RFC 5044 4.4: least significant octet first (IWARP-WIRE.md 1.2).
        p.put_bytes(&crc.to_le_bytes(), false);
        (crc, p.out_sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded pseudo-random source: each call gives a number below its argument (a 64-bit
    /// LCG, the high bits).
    fn test_rng(seed: u64) -> impl FnMut(usize) -> usize {
        let mut x = seed;
        move |m: usize| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as usize % m
        }
    }
    use rdmap::{Stag, VecBuffer};

    const PD: PdId = PdId(3);

    struct Case<B: RegionBuffer = VecBuffer> {
        mem: MemoryTable<B>,
        ring: TxRing,
        /// What the existing encoder produces for the same FPDUs.
        expected: Vec<u8>,
        stag: Stag,
        /// Stream offset of the first FPDU.
        base: u64,
    }

    /// Random-ish FPDUs (payload in a region, inline-only ones, zero-length ones) queued in the
    /// ring and encoded by `FpduEncoder` at the same stream positions.
    fn case(crc: bool, markers: bool, seq_start: u64, seed: u64) -> Case {
        case_in(VecBuffer::from_vec, crc, markers, seq_start, seed)
    }

    /// [`case`] with the payload in a buffer made by `make` from the bytes.
    fn case_in<B: RegionBuffer>(
        make: impl Fn(Vec<u8>) -> B,
        crc: bool,
        markers: bool,
        seq_start: u64,
        seed: u64,
    ) -> Case<B> {
        let mut mem = MemoryTable::new();
        let data: Vec<u8> = (0..20000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8 ^ seed as u8)
            .collect();
        let stag = mem.register(PD, make(data.clone()), 0x10_000, Access::REMOTE_READ);
        let mut ring = TxRing::new(64);
        ring.start(crc, markers, seq_start, PD);
        let mut enc = FpduEncoder::new(crc, markers);
        let mut expected = Vec::new();
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = |m: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % m
        };
        let mut start = seq_start;
        for k in 0..40 {
            let head_len = [14usize, 18, 46, 70, 0][next(5) as usize].max(1);
            let head: Vec<u8> = (0..head_len)
                .map(|i| (i as u8) ^ (k as u8) ^ 0xa5)
                .collect();
            let (payload, bytes) = match next(4) {
                0 => (None, Vec::new()),
                k => {
                    let len = next(3000) as usize + if next(3) == 0 { 0 } else { 1 };
                    let off = next(15000) as usize;
                    let p = TxPayload {
                        stag,
                        to: 0x10_000 + off as u64,
                        len: len as u32,
                        // Some as Read Responses: their source held by the descriptor.
                        access: if k == 1 {
                            Access::REMOTE_READ
                        } else {
                            Access::NONE
                        },
                    };
                    (Some(p), data[off..off + len].to_vec())
                }
            };
            let n = ring.push(start, &head, payload, false, &mem).expect("push");
            let before = expected.len();
            enc.encode_parts(&head, &bytes, &mut expected)
                .expect("encode");
            assert_eq!(expected.len() - before, n, "wire length of FPDU {k}");
            start += n as u64;
        }
        Case {
            mem,
            ring,
            expected,
            stag,
            base: seq_start,
        }
    }

    /// [`case`] with IFT frames of `fmt` (draft section 5.1), expected from `ift`'s own
    /// `FrameEncoder`: the DDP header's length follows its T bit as the encoder reads it.
    fn case_ift(fmt: FrameFormat, seq_start: u64, seed: u64) -> Case {
        case_ift_in(VecBuffer::from_vec, fmt, seq_start, seed)
    }

    /// [`case_ift`] with the payload in a buffer made by `make` from the bytes.
    fn case_ift_in<B: RegionBuffer>(
        make: impl Fn(Vec<u8>) -> B,
        fmt: FrameFormat,
        seq_start: u64,
        seed: u64,
    ) -> Case<B> {
        let mut mem = MemoryTable::new();
        let data: Vec<u8> = (0..20000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8 ^ seed as u8)
            .collect();
        let stag = mem.register(PD, make(data.clone()), 0x10_000, Access::REMOTE_READ);
        let mut ring = TxRing::new(64);
        ring.start_ift(fmt, seq_start, PD);
        let enc = ift::FrameEncoder::new(fmt);
        let mut expected = Vec::new();
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = |m: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % m
        };
        let mut start = seq_start;
        for k in 0..40 {
            let head_len = [14usize, 18, 46, 70][next(4) as usize];
            let mut head: Vec<u8> = (0..head_len)
                .map(|i| (i as u8) ^ (k as u8) ^ 0x35)
                .collect();
            if head_len == 14 || next(2) == 0 {
                head[0] |= ddp::wire::control::TAGGED;
            }
            let (payload, bytes) = match next(4) {
                0 => (None, Vec::new()),
                k => {
                    let len = next(3000) as usize + if next(3) == 0 { 0 } else { 1 };
                    let off = next(15000) as usize;
                    let p = TxPayload {
                        stag,
                        to: 0x10_000 + off as u64,
                        len: len as u32,
                        access: if k == 1 {
                            Access::REMOTE_READ
                        } else {
                            Access::NONE
                        },
                    };
                    (Some(p), data[off..off + len].to_vec())
                }
            };
            let n = ring.push(start, &head, payload, false, &mem).expect("push");
            let ulpdu = [head.as_slice(), bytes.as_slice()].concat();
            let m = enc.encode(&ulpdu, &mut expected).expect("encode");
            assert_eq!(m, n, "wire length of frame {k}");
            start += n as u64;
        }
        Case {
            mem,
            ring,
            expected,
            stag,
            base: seq_start,
        }
    }

    /// Over plain memory (the payload CRC and the sum each a pass of their own) and over
    /// memory that copies, CRCs and sums in one (the engine's pinned regions).
    #[test]
    fn ift_fill_matches_the_frame_encoder_for_any_range() {
        ift_fill_matches_for_any_range(VecBuffer::from_vec);
        ift_fill_matches_for_any_range(pinned);
    }

    fn ift_fill_matches_for_any_range<B: RegionBuffer>(make: impl Fn(Vec<u8>) -> B + Copy) {
        for (hc, pc) in [(true, true), (true, false), (false, true), (false, false)] {
            let fmt = FrameFormat {
                header_crc: hc,
                payload_crc: pc,
                vtag: 0xbeef,
                verify: false,
            };
            for seed in 1..4u64 {
                let seq_start = [0u64, 64, 101][seed as usize - 1];
                let what = format!("hc {hc} pc {pc} seed {seed}");
                // Frame by frame as TCP asks for them (payload CRC computed and kept), then
                // everything at once (kept CRCs used).
                let mut c = case_ift_in(make, fmt, seq_start, seed);
                let total = c.expected.len();
                let spans: Vec<(u64, u64)> = c.ring.iter().map(|f| (f.start, f.end())).collect();
                for (a, b) in spans {
                    let (a, b) = ((a - c.base) as usize, (b - c.base) as usize);
                    fill_matches(&mut c, a, b - a, &format!("frame ({what})"));
                }
                fill_matches(&mut c, 0, total, &format!("all ({what})"));
                // Arbitrary ranges of a fresh ring: parts reaching the payload CRC field before
                // any whole fill computed it.
                let mut c = case_ift_in(make, fmt, seq_start, seed);
                let mut x = seed * 7919;
                for _ in 0..300 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let a = (x >> 33) as usize % total;
                    let len = ((x >> 13) as usize % 1700).min(total - a).max(1);
                    fill_matches(&mut c, a, len, &format!("range ({what})"));
                }
                for a in (0..total).step_by(89) {
                    fill_matches(&mut c, a, 1, &format!("octet ({what})"));
                }
            }
        }
    }

    #[test]
    fn ift_frames_decode_and_verify() {
        // What the ring writes, read back by `ift`'s decoder with CRCs checked: every frame's
        // DDP header and payload as queued.
        let fmt = FrameFormat {
            header_crc: true,
            payload_crc: true,
            vtag: 0x0102,
            verify: true,
        };
        let mut c = case_ift(fmt, 7, 2);
        let mut out = vec![0u8; c.expected.len()];
        c.ring.fill(c.base, &mut out, &c.mem).expect("fill");
        let mut dec = ift::FrameDecoder::new(fmt);
        let mut frames = 0;
        for piece in out.chunks(333) {
            dec.feed(piece, |_| frames += 1).expect("valid frames");
        }
        assert_eq!(frames, 40);
    }

    #[test]
    fn fill_matches_the_encoder_for_any_range() {
        for (crc, markers) in [(true, true), (true, false), (false, true), (false, false)] {
            for seed in 1..4u64 {
                let seq_start = [0u64, 20, 37][seed as usize - 1];
                // Whole FPDUs first (CRC fused and kept), then arbitrary ranges.
                let mut c = case(crc, markers, seq_start, seed);
                let total = c.expected.len();
                let mut out = vec![0u8; total];
                let sum = c.ring.fill(c.base, &mut out, &c.mem).expect("fill all");
                assert_eq!(out, c.expected, "crc {crc} markers {markers} seed {seed}");
                assert_eq!(
                    sum,
                    sum_of(&out),
                    "sum, crc {crc} markers {markers} seed {seed}"
                );
                // Arbitrary ranges on a fresh ring: partial fills (headers, Markers and CRC
                // cut) compute the CRC separately; then again with the CRCs kept.
                for fresh in [true, false] {
                    let mut c2 = case(crc, markers, seq_start, seed);
                    if !fresh {
                        let mut all = vec![0u8; total];
                        c2.ring.fill(c2.base, &mut all, &c2.mem).expect("fill all");
                    }
                    let mut x = seed * 7919;
                    for _ in 0..400 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let a = (x >> 33) as usize % total;
                        let len = ((x >> 13) as usize % 1700).min(total - a).max(1);
                        let mut part = vec![0u8; len];
                        let sum = c2
                            .ring
                            .fill(c2.base + a as u64, &mut part, &c2.mem)
                            .expect("fill range");
                        assert_eq!(
                            part,
                            &c2.expected[a..a + len],
                            "crc {crc} markers {markers} seed {seed} range {a}+{len} fresh {fresh}"
                        );
                        assert_eq!(sum, sum_of(&part), "sum, range {a}+{len}");
                    }
                    // Every single octet position as a range end and start.
                    for a in (0..total).step_by(97) {
                        let mut one = [0u8; 1];
                        c2.ring
                            .fill(c2.base + a as u64, &mut one, &c2.mem)
                            .expect("octet");
                        assert_eq!(one[0], c2.expected[a]);
                    }
                }
            }
        }
    }

    /// The reference ones' complement sum (TCP's checksum share) of `b`.
    fn sum_of(b: &[u8]) -> u16 {
        Checksum::new().add_bytes(b).sum()
    }

    /// Fills `len` octets at `at` (octets from the ring's start) and checks them against the
    /// encoder's bytes, and the sum the fill gives against the reference; `what` names the
    /// fill in failures.
    fn fill_matches<B: RegionBuffer>(c: &mut Case<B>, at: usize, len: usize, what: &str) {
        let mut out = vec![0u8; len];
        let sum = c
            .ring
            .fill(c.base + at as u64, &mut out, &c.mem)
            .unwrap_or_else(|e| panic!("{what} at {at}: {e}"));
        assert_eq!(out, &c.expected[at..at + len], "{what} at {at}");
        assert_eq!(sum, sum_of(&out), "sum, {what} at {at}");
    }

    /// Memory whose reads take the one-pass copy and CRC, as the engine's pinned regions do
    /// (`RegionBuffer::read_at_crc` overridden): whole-FPDU fills take it, partial ones the
    /// two-pass path.
    struct Fused(Vec<u8>);

    impl RegionBuffer for Fused {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn read_at(&self, offset: usize, dst: &mut [u8]) {
            let n = dst.len().min(self.0.len().saturating_sub(offset));
            dst[..n].copy_from_slice(&self.0[offset..offset + n]);
        }
        fn read_at_crc(&self, offset: usize, dst: &mut [u8], crc_state: &mut u32) {
            let n = dst.len().min(self.0.len().saturating_sub(offset));
            let (copied, rest) = dst.split_at_mut(n);
            *crc_state = copy_crc::copy_crc32c_from(&self.0[offset..], copied, *crc_state);
            *crc_state = copy_crc::crc_update(*crc_state, rest);
        }
        fn read_at_crc_sum(
            &self,
            offset: usize,
            dst: &mut [u8],
            crc_state: &mut u32,
        ) -> Option<u16> {
            if dst.len() > self.0.len().saturating_sub(offset) {
                self.read_at_crc(offset, dst, crc_state);
                return None;
            }
            let (crc, sum) = copy_crc::copy_crc32c_sum_from(&self.0[offset..], dst, *crc_state);
            *crc_state = crc;
            Some(sum)
        }
        fn write_at(&self, _offset: usize, _src: &[u8]) {}
    }

    fn pinned(data: Vec<u8>) -> Fused {
        Fused(data)
    }

    #[test]
    fn fill_from_pinned_memory_with_the_fused_copy_matches_the_encoder() {
        for (crc, markers) in [(true, true), (true, false), (false, false)] {
            for seed in 1..4u64 {
                let seq_start = [0u64, 20, 37][seed as usize - 1];
                let mut c = case_in(pinned, crc, markers, seq_start, seed);
                let total = c.expected.len();
                // Whole FPDUs (the fused copy), and again: retransmissions with the CRC kept.
                for _ in 0..2 {
                    let mut out = vec![0u8; total];
                    let sum = c.ring.fill(c.base, &mut out, &c.mem).expect("fill all");
                    assert_eq!(out, c.expected, "crc {crc} markers {markers} seed {seed}");
                    assert_eq!(sum, sum_of(&out), "sum, crc {crc} markers {markers}");
                }
                // FPDU by FPDU, as TCP asks for them (one segment per FPDU).
                let mut c = case_in(pinned, crc, markers, seq_start, seed);
                let ends: Vec<(u64, u64)> = c.ring.iter().map(|f| (f.start, f.end())).collect();
                for (a, b) in ends {
                    let (a, b) = ((a - c.base) as usize, (b - c.base) as usize);
                    fill_matches(&mut c, a, b - a, &format!("FPDU (seed {seed})"));
                }
            }
        }
    }

    #[test]
    fn in_order_fills_with_retransmissions_and_releases_between() {
        // TCP's pattern: segments in order (the cursor's fast path), now and then a
        // retransmission of an older range (searched), the front released as ACKs arrive.
        for (crc, markers) in [(true, true), (true, false), (false, false)] {
            let mut c = case(crc, markers, 11, 5);
            let total = c.expected.len();
            let mut next = test_rng(12345);
            let (mut sent, mut acked) = (0usize, 0usize);
            while sent < total {
                let len = (1 + next(1448)).min(total - sent);
                fill_matches(&mut c, sent, len, "segment");
                sent += len;
                if next(4) == 0 && sent > acked {
                    let a = acked + next(sent - acked);
                    let l = (1 + next(3000)).min(sent - a);
                    fill_matches(&mut c, a, l, "retransmission");
                }
                if next(3) == 0 {
                    acked += next(sent - acked + 1);
                    c.ring.release_to(c.base + acked as u64, |_| {});
                }
            }
        }
    }

    #[test]
    fn fill_outside_the_ring_or_from_a_gone_region_fails() {
        let mut c = case(true, true, 0, 9);
        let total = c.expected.len() as u64;
        let mut out = [0u8; 8];
        assert!(c.ring.fill(total, &mut out, &c.mem).is_err());
        assert!(c.ring.fill(total - 4, &mut out, &c.mem).is_err());
        // Release the first FPDU: its octets can no longer be asked for.
        let first_end = c.ring.get(0).expect("first").end();
        let mut released = 0;
        c.ring.release_to(first_end, |_| released += 1);
        assert_eq!(released, 1);
        assert!(c.ring.fill(0, &mut out, &c.mem).is_err());
        assert!(c.ring.fill(first_end, &mut out, &c.mem).is_ok());
        // Deregister the region: FPDUs with payload fail, never read anything.
        assert!(c.mem.deregister(c.stag).is_ok());
        let mut all = vec![0u8; (total - first_end) as usize];
        assert!(c.ring.fill(first_end, &mut all, &c.mem).is_err());
    }

    #[test]
    fn read_response_source_is_held_past_deregistration() {
        let mut mem = MemoryTable::new();
        let data: Vec<u8> = (0..4000u32).map(|i| (i * 7) as u8).collect();
        let stag = mem.register(
            PD,
            VecBuffer::from_vec(data.clone()),
            0,
            Access::REMOTE_READ,
        );
        let mut ring = TxRing::new(4);
        ring.start(true, true, 0, PD);
        let payload = |access| TxPayload {
            stag,
            to: 100,
            len: 1400,
            access,
        };
        let head = [0x41u8; 14];
        let n = ring
            .push(0, &head, Some(payload(Access::REMOTE_READ)), false, &mem)
            .expect("push");
        let mut expected = Vec::new();
        FpduEncoder::new(true, true)
            .encode_parts(&head, &data[100..1500], &mut expected)
            .expect("encode");
        assert!(mem.deregister(stag).is_ok());
        // Sent and retransmitted (whole, then in parts) after the deregistration.
        for _ in 0..2 {
            let mut out = vec![0u8; n];
            ring.fill(0, &mut out, &mem).expect("held source");
            assert_eq!(out, expected);
        }
        let mut part = vec![0u8; 700];
        ring.fill(600, &mut part, &mem).expect("part");
        assert_eq!(part, &expected[600..1300]);
        // New segments of the STag are refused; the held one is released with its FPDU.
        assert_eq!(
            ring.push(
                n as u64,
                &head,
                Some(payload(Access::REMOTE_READ)),
                false,
                &mem
            ),
            Err(PushError::Source)
        );
        ring.release_to(n as u64, |_| {});
        assert_eq!(ring.len(), 0);
    }

    /// A queued Read Response whose region the application then invalidates, or re-registers,
    /// is read no more (first transmission or retransmission): the fill fails.
    #[test]
    fn read_response_source_is_not_read_after_invalidation_or_reregistration() {
        for reregister in [false, true] {
            let mut mem = MemoryTable::new();
            let data: Vec<u8> = (0..4000u32).map(|i| (i * 5) as u8).collect();
            let stag = mem.register(PD, VecBuffer::from_vec(data), 0, Access::REMOTE_READ);
            let mut ring = TxRing::new(4);
            ring.start(true, false, 0, PD);
            let payload = TxPayload {
                stag,
                to: 0,
                len: 1000,
                access: Access::REMOTE_READ,
            };
            let n = ring
                .push(0, &[0x41u8; 14], Some(payload), false, &mem)
                .expect("push");
            let mut out = vec![0u8; n];
            ring.fill(0, &mut out, &mem)
                .expect("sent while the right stands");
            if reregister {
                mem.reregister(stag, PD, 0, Access::REMOTE_READ)
                    .expect("reregister");
            } else {
                mem.invalidate(stag, PD).expect("invalidate");
            }
            assert!(
                ring.fill(0, &mut out, &mem).is_err(),
                "retransmitted after the right was revoked (reregister {reregister})"
            );
            let (first, rest) = out.split_at_mut(64);
            assert!(
                matches!(
                    ring.fill_whole_split(0, n, first, &mut [rest], &mem),
                    Some(Err(_))
                ),
                "written into pieces after the right was revoked (reregister {reregister})"
            );
        }
    }

    /// A region whose shared handles can be counted.
    struct Counted(std::sync::Arc<VecBuffer>);

    impl RegionBuffer for Counted {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn read_at(&self, offset: usize, dst: &mut [u8]) {
            self.0.read_at(offset, dst)
        }
        fn write_at(&self, offset: usize, src: &[u8]) {
            self.0.write_at(offset, src)
        }
        fn share(&self) -> Option<SharedBuffer> {
            Some(self.0.clone())
        }
    }

    #[test]
    fn held_sources_go_with_their_fpdus_and_slots_reused_forget_them() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 11) as u8).collect();
        let bytes = std::sync::Arc::new(VecBuffer::from_vec(data.clone()));
        let mut mem = MemoryTable::new();
        let stag = mem.register(PD, Counted(bytes.clone()), 0, Access::REMOTE_READ);
        // Besides the FPDUs' handles: ours, and the table's until deregistered.
        let handles = |others: usize| std::sync::Arc::strong_count(&bytes) - others;
        let mut ring = TxRing::new(2);
        ring.start(true, false, 0, PD);
        let payload = |to: u64, access| {
            Some(TxPayload {
                stag,
                to,
                len: 1000,
                access,
            })
        };
        let head = [0x33u8; 14];
        let a = ring
            .push(0, &head, payload(0, Access::REMOTE_READ), false, &mem)
            .expect("a");
        let b = ring
            .push(
                a as u64,
                &head,
                payload(1000, Access::REMOTE_READ),
                false,
                &mem,
            )
            .expect("b");
        assert_eq!(handles(2), 2);
        ring.release_to(a as u64, |_| {});
        assert_eq!(handles(2), 1, "released with its FPDU");
        // The slot of `a` again, now for an FPDU that holds nothing: once the region is gone
        // its fill fails (it must not find the old handle), while `b`'s still reads.
        let start = (a + b) as u64;
        let c = ring
            .push(start, &head, payload(2000, Access::NONE), false, &mem)
            .expect("c");
        assert_eq!(handles(2), 1);
        assert!(mem.deregister(stag).is_ok());
        assert_eq!(handles(1), 1);
        let mut out = vec![0u8; c];
        assert!(ring.fill(start, &mut out, &mem).is_err());
        let mut expected = Vec::new();
        FpduEncoder::new(true, false)
            .encode_parts(&head, &data[1000..2000], &mut expected)
            .expect("encode");
        let mut out = vec![0u8; b];
        ring.fill(a as u64, &mut out, &mem).expect("held b");
        assert_eq!(out, expected);
        ring.clear();
        assert_eq!(handles(1), 0, "cleared");
    }

    #[test]
    fn whole_unmarked_fpdus_match_the_general_pass() {
        // The fast path against the piecewise pass, for every inline length, payload lengths
        // across every PAD and alignment, CRC on and off, in pinned memory (the summing copy)
        // and a `VecBuffer` (summed after the copy).
        fn check<B: RegionBuffer>(make: impl Fn(Vec<u8>) -> B) {
            let data: Vec<u8> = (0..4000u32)
                .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
                .collect();
            let mut mem = MemoryTable::new();
            let stag = mem.register(PD, make(data), 0, Access::NONE);
            for crc in [true, false] {
                let w = FpduWriter {
                    crc,
                    markers: false,
                    seq_start: 0,
                };
                for head_len in 0..=HEAD_MAX {
                    for pl in (0..70).chain([255, 1000, 1441]) {
                        let mut ring = TxRing::new(1);
                        ring.start(crc, false, 0, PD);
                        let head: Vec<u8> = (0..head_len).map(|i| (i * 37 + pl) as u8).collect();
                        let payload = (pl > 0).then_some(TxPayload {
                            stag,
                            to: (pl * 3 + head_len) as u64 % 97,
                            len: pl as u32,
                            access: Access::NONE,
                        });
                        let n = ring.push(0, &head, payload, false, &mem).expect("push");
                        let f = *ring.get(0).expect("pushed");
                        let region = payload.map(|p| {
                            mem.validate(p.stag, PD, p.access, p.to, u64::from(p.len))
                                .expect("region")
                        });
                        let mut fast = vec![0xeeu8; n];
                        let (sum, kept) = w.whole_unmarked(&f, &head, region, &mut fast);
                        let mut slow = vec![0x11u8; n];
                        let known = (!crc).then_some(0);
                        let (c, slow_sum) = w.pass(&f, &head, known, region, 0, &mut slow);
                        let what = format!("crc {crc} head {head_len} payload {pl}");
                        assert_eq!(fast, slow, "{what}");
                        assert_eq!(sum, slow_sum, "{what}");
                        assert_eq!(sum, sum_of(&fast), "{what}");
                        assert_eq!(kept, crc.then_some(c), "{what}");
                    }
                }
            }
        }
        check(VecBuffer::from_vec);
        check(pinned);
    }

    #[test]
    fn whole_fpdus_into_pieces_match_the_encoder() {
        // Each FPDU of a case written into a packet in pieces (a first piece of any length,
        // then three of random lengths): one pass where the FPDU is whole and unmarked and its
        // headers fit the first piece, the bytes and sum the encoder's; otherwise `None`, and
        // piece by piece gives the same.
        let mut rng = test_rng(11);
        let mut passes = 0;
        for (crc, markers) in [(true, false), (false, false), (true, true)] {
            for seed in 1..4u64 {
                let mut c = case_in(
                    pinned,
                    crc,
                    markers,
                    [0u64, 20, 37][seed as usize - 1],
                    seed,
                );
                for i in 0..c.ring.len {
                    let f = *c.ring.get(i).expect("queued");
                    let (start, len) = (f.start, f.wire_len as usize);
                    let at = (start - c.base) as usize;
                    let expected = &c.expected[at..at + len];
                    let mut first = vec![0xeeu8; rng(len + 1)];
                    let mut bufs: Vec<Vec<u8>> =
                        (0..3).map(|_| vec![0x11u8; rng(len) + 1]).collect();
                    let room = first.len() + bufs.iter().map(Vec::len).sum::<usize>();
                    if room < len {
                        bufs.push(vec![0x22u8; len - room]);
                    }
                    let mut rest: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                    let what = format!("crc {crc} markers {markers} seed {seed} FPDU {i}");
                    let h = 2 + usize::from(f.head_len);
                    let whole = !markers && first.len() >= h;
                    let sum = match c
                        .ring
                        .fill_whole_split(start, len, &mut first, &mut rest, &c.mem)
                    {
                        Some(filled) => {
                            assert!(whole, "{what}: one pass where it cannot be");
                            filled.expect("fill")
                        }
                        None => {
                            assert!(!whole, "{what}: no pass");
                            tcp_engine::fill_in_pieces(
                                start,
                                len,
                                &mut first,
                                &mut rest,
                                |o, out| c.ring.fill(o, out, &c.mem).map(Some),
                            )
                            .expect("piece by piece")
                        }
                    };
                    let mut got = first.clone();
                    for b in &bufs {
                        got.extend_from_slice(&b[..b.len().min(len - got.len().min(len))]);
                    }
                    got.truncate(len);
                    assert_eq!(got, expected, "{what}");
                    assert_eq!(sum, sum_of(expected), "{what}");
                    passes += usize::from(whole);
                    // The CRC the pass kept is the one a later part (a retransmission) writes.
                    let mut field = [0u8; CRC_LEN];
                    c.ring
                        .fill(start + (len - CRC_LEN) as u64, &mut field, &c.mem)
                        .expect("field");
                    assert_eq!(field, expected[len - CRC_LEN..], "{what}: CRC kept");
                }
            }
        }
        assert!(passes > 100, "{passes} FPDUs written in one pass");
    }

    #[test]
    fn ring_wraps_around_its_slots() {
        // Three slots: descriptors go round them many times (sent whole, their oldest resent
        // in part and everything in flight as one range, released as acknowledged), every
        // octet as the encoder writes the same stream. Every fourth has no payload (a Read
        // Request or Terminate), so slots pass from a payload to none and back.
        for (crc, markers) in [(true, false), (true, true), (false, false)] {
            let mut mem = MemoryTable::new();
            let data: Vec<u8> = (0..5000u32).map(|i| (i * 13 + 7) as u8).collect();
            let stag = mem.register(
                PD,
                VecBuffer::from_vec(data.clone()),
                0,
                Access::REMOTE_READ,
            );
            let mut ring = TxRing::new(3);
            ring.start(crc, markers, 5, PD);
            let mut enc = FpduEncoder::new(crc, markers);
            let mut start = 5u64;
            let mut in_flight: std::collections::VecDeque<(u64, Vec<u8>)> = Default::default();
            for k in 0..40usize {
                if ring.is_full() {
                    let (s, img) = in_flight.pop_front().expect("oldest");
                    let mut released = 0;
                    ring.release_to(s + img.len() as u64, |_| released += 1);
                    assert_eq!(released, 1, "FPDU {k}");
                    let mut out = [0u8; 1];
                    assert!(ring.fill(s, &mut out, &mem).is_err(), "released, FPDU {k}");
                }
                let head = [k as u8 ^ 0x5a; 14];
                let (len, off) = (100 + (k * 37) % 1300, (k * 101) % 3000);
                let access = if k % 3 == 0 {
                    Access::REMOTE_READ
                } else {
                    Access::NONE
                };
                let p = TxPayload {
                    stag,
                    to: off as u64,
                    len: len as u32,
                    access,
                };
                let payload = (k % 4 != 3).then_some(p);
                let bytes = if payload.is_some() {
                    &data[off..off + len]
                } else {
                    &[][..]
                };
                let n = ring
                    .push(start, &head, payload, k % 2 == 0, &mem)
                    .expect("push");
                let mut img = Vec::new();
                enc.encode_parts(&head, bytes, &mut img).expect("encode");
                assert_eq!(img.len(), n, "FPDU {k}");
                let mut out = vec![0u8; n];
                let sum = ring.fill(start, &mut out, &mem).expect("whole");
                assert_eq!((&out, sum), (&img, sum_of(&img)), "FPDU {k}");
                in_flight.push_back((start, img));
                start += n as u64;
                let (s, old) = &in_flight[0];
                let mut part = vec![0u8; old.len() / 2 + 1];
                ring.fill(*s + 1, &mut part, &mem).expect("part");
                assert_eq!(part, old[1..part.len() + 1], "FPDU {k}");
                let expected: Vec<u8> = in_flight.iter().flat_map(|(_, i)| i.clone()).collect();
                let mut all = vec![0u8; expected.len()];
                let sum = ring.fill(*s, &mut all, &mem).expect("in flight");
                assert_eq!((&all, sum), (&expected, sum_of(&expected)), "FPDU {k}");
            }
            assert_eq!(ring.len(), 3);
            ring.release_to(start, |_| {});
            assert_eq!(ring.len(), 0);
            assert!(ring.fill(start - 1, &mut [0u8; 1], &mem).is_err());
        }
    }

    #[test]
    fn ring_is_bounded() {
        let mut ring = TxRing::new(2);
        ring.start(true, false, 0, PD);
        assert!(ring
            .push(0, &[1; 14], None, false, &MemoryTable::<VecBuffer>::new())
            .is_ok());
        assert!(ring
            .push(24, &[1; 14], None, true, &MemoryTable::<VecBuffer>::new())
            .is_ok());
        assert_eq!(
            ring.push(48, &[1; 14], None, false, &MemoryTable::<VecBuffer>::new()),
            Err(PushError::Full)
        );
        assert_eq!(ring.len(), 2);
        let mut completes = 0;
        ring.release_to(48, |f| completes += usize::from(f.completes));
        assert_eq!((ring.len(), completes), (0, 1));
        let mut ring = TxRing::new(2);
        assert_eq!(
            ring.push(
                0,
                &[0; HEAD_MAX + 1],
                None,
                false,
                &MemoryTable::<VecBuffer>::new()
            ),
            Err(PushError::TooLong)
        );
    }
}
