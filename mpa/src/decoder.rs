//! The receive side of Full Operation: stream octets in, verified ULPDUs out (RFC 5044
//! sections 4.1 to 4.4, 5.2, 6 and 8).

use crate::crc::Crc32c;
use crate::wire::{
    fpdu_len, pad_len, FpduHeader, MarkerPtr, CRC_LEN, FPDU_HEADER_LEN, MARKER_INTERVAL,
    MARKER_LEN, MAX_ULPDU_LEN,
};
use crate::MpaError;

/// Where an FPDU whose ULPDU_Length field is at stream position `header` (relative to
/// SeqStart) and holds `ulpdu_len` ends: the position after its CRC, Markers inside counted
/// (RFC 5044 sections 4.1 and 4.3).
pub fn fpdu_end(header: u64, ulpdu_len: usize, markers: bool) -> u64 {
    advance(header, fpdu_len(ulpdu_len), markers)
}

/// The stream position `octets` FPDU octets after `position`, skipping the Markers in
/// between (one at every multiple of [`MARKER_INTERVAL`] when `markers`). A Marker at the
/// position reached is not skipped: it belongs to what follows.
fn advance(mut position: u64, mut octets: usize, markers: bool) -> u64 {
    if !markers {
        return position + octets as u64;
    }
    let interval = MARKER_INTERVAL as u64;
    while octets > 0 {
        let into = position % interval;
        if into == 0 {
            position += MARKER_LEN as u64;
            continue;
        }
        let take = ((interval - into) as usize).min(octets);
        position += take as u64;
        octets -= take;
    }
    position
}

/// Where the decoder is inside the current FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading ULPDU_Length; `got` octets of it so far.
    Header { got: usize },
    /// Reading ULPDU and PAD; `remaining` octets of them still to come.
    Body { remaining: usize },
    /// Reading the CRC field; `got` octets of it so far.
    Crc { got: usize },
}

/// Where one FPDU lies in the stream, as positions relative to SeqStart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FpduSpan {
    /// Position of its ULPDU_Length field.
    pub start: u64,
    /// Position just after its CRC (Markers inside included).
    pub end: u64,
}

/// Finds FPDUs in the in-order octet stream of one direction and hands up their ULPDUs.
///
/// FPDUs are chained by ULPDU_Length (RFC 5044 sections 5.2 and 6). With Markers on, every
/// Marker is removed and checked: it must hold 0 when it lies between FPDUs and otherwise point
/// back to the ULPDU_Length field of the FPDU it lies in. With CRCs on, each FPDU's CRC is
/// checked over the same octets the sender covered (section 4.4). An FPDU is handed up only
/// once it is complete and verified; a CRC mismatch is error 2 and a Marker disagreement,
/// reported only when the CRC is good (section 8), is error 3. After any error the decoder
/// hands up nothing more and repeats the error.
///
/// The ULPDU is handed up straight from the input slice when a whole FPDU without Markers lies
/// in it; otherwise it is gathered in an internal buffer that is reused and never grows beyond
/// the receive limit ([`FpduDecoder::set_max_ulpdu`], default 65535).
#[derive(Debug, Clone)]
pub struct FpduDecoder {
    crc: bool,
    markers: bool,
    max_ulpdu: usize,
    /// Octets consumed since SeqStart.
    position: u64,
    error: Option<MpaError>,
    phase: Phase,
    /// Stream position of the current FPDU's ULPDU_Length field.
    header_position: u64,
    header: [u8; FPDU_HEADER_LEN],
    ulpdu_len: usize,
    ulpdu: Vec<u8>,
    crc_field: [u8; CRC_LEN],
    hasher: Crc32c,
    /// `Some(octets so far)` while a Marker is being read.
    marker_got: Option<usize>,
    marker: [u8; MARKER_LEN],
    marker_position: u64,
    /// First Marker disagreement in the current FPDU, reported if its CRC is good.
    marker_error: Option<MpaError>,
    /// The Marker read at the current FPDU boundary (between FPDUs), if one was, and its
    /// position: [`check_marker_before_located`](Self::check_marker_before_located).
    boundary_marker: Option<(u64, [u8; MARKER_LEN])>,
}

impl FpduDecoder {
    /// A decoder at SeqStart. `crc`: whether CRCs are checked (negotiated); `markers`: whether
    /// we asked the peer for Markers (RFC 5044 section 7.1.1 "M").
    pub fn new(crc: bool, markers: bool) -> FpduDecoder {
        FpduDecoder::with_position(crc, markers, 0)
    }

    /// A decoder whose next octet is at stream position `position` relative to SeqStart, at
    /// an FPDU boundary (for example 0x1ec for RFC 5044 Figure 6).
    pub fn with_position(crc: bool, markers: bool, position: u32) -> FpduDecoder {
        FpduDecoder {
            crc,
            markers,
            max_ulpdu: MAX_ULPDU_LEN,
            position: u64::from(position),
            error: None,
            phase: Phase::Header { got: 0 },
            header_position: 0,
            header: [0; FPDU_HEADER_LEN],
            ulpdu_len: 0,
            ulpdu: Vec::new(),
            crc_field: [0; CRC_LEN],
            hasher: Crc32c::new(),
            marker_got: None,
            marker: [0; MARKER_LEN],
            marker_position: 0,
            marker_error: None,
            boundary_marker: None,
        }
    }

    /// Sets the largest ULPDU_Length accepted (at most 65535); a larger one is an error
    /// ([`MpaError::ReceivedUlpduTooLong`]). This bounds the internal buffer.
    pub fn set_max_ulpdu(&mut self, max_ulpdu: usize) {
        self.max_ulpdu = max_ulpdu.min(MAX_ULPDU_LEN);
    }

    /// Allocates the internal buffer for the largest ULPDU accepted, so that no input
    /// allocates later (a locator's guesses read arbitrary ULPDU_Length values).
    pub fn reserve_max_ulpdu(&mut self) {
        if self.ulpdu.capacity() < self.max_ulpdu {
            self.ulpdu
                .reserve_exact(self.max_ulpdu.saturating_sub(self.ulpdu.len()));
        }
    }

    /// Octets of heap the decoder holds (its ULPDU buffer's capacity).
    pub fn buffer_capacity(&self) -> usize {
        self.ulpdu.capacity()
    }

    /// Frees the ULPDU buffer if it holds nothing (at an FPDU boundary, or before an FPDU's
    /// ULPDU began): it is allocated again as an FPDU needs it.
    pub fn release_buffer(&mut self) {
        if self.ulpdu.is_empty() {
            self.ulpdu = Vec::new();
        }
    }

    /// The largest ULPDU_Length accepted.
    pub fn max_ulpdu(&self) -> usize {
        self.max_ulpdu
    }

    /// Octets consumed since SeqStart (Markers included).
    pub fn stream_position(&self) -> u64 {
        self.position
    }

    /// True when the next octet starts a new FPDU (or the Marker before it).
    pub fn at_fpdu_boundary(&self) -> bool {
        self.phase == Phase::Header { got: 0 } && self.marker_got.is_none()
    }

    /// The FPDU the decoder is inside, once its ULPDU_Length has been read: from that field
    /// to the stream position where the next FPDU (or the Marker before it) starts, Markers
    /// inside included (RFC 5044 sections 4.3 and 6: ULPDU_Length chains FPDUs). At an FPDU
    /// boundary, the empty span at the current position (at a Marker being read, that
    /// Marker's position). `None` while ULPDU_Length is still incomplete or after an error.
    /// Out of order, this is what carries the FPDU framing across a gap in the stream
    /// (draft-ietf-rddp-mpa-01 Appendix 11).
    pub fn current_fpdu(&self) -> Option<FpduSpan> {
        if self.error.is_some() {
            return None;
        }
        let (mut position, remaining) = match self.phase {
            Phase::Header { got: 0 } => {
                let at = match self.marker_got {
                    Some(_) => self.marker_position,
                    None => self.position,
                };
                return Some(FpduSpan { start: at, end: at });
            }
            Phase::Header { .. } => return None,
            Phase::Body { remaining } => (self.position, remaining + CRC_LEN),
            Phase::Crc { got } => (self.position, CRC_LEN - got),
        };
        if let Some(got) = self.marker_got {
            position += (MARKER_LEN - got) as u64;
        }
        Some(FpduSpan {
            start: self.header_position,
            end: advance(position, remaining, self.markers),
        })
    }

    /// The error that stopped this decoder, if any.
    pub fn error(&self) -> Option<&MpaError> {
        self.error.as_ref()
    }

    fn fail(&mut self, error: MpaError) -> Result<(), MpaError> {
        self.error = Some(error.clone());
        Err(error)
    }

    /// Octets until the next Marker position (`usize::MAX` without Markers).
    fn until_marker(&self) -> usize {
        if self.markers {
            let interval = MARKER_INTERVAL as u64;
            (interval - self.position % interval) as usize
        } else {
            usize::MAX
        }
    }

    fn hash(&mut self, bytes: &[u8]) {
        if self.crc {
            self.hasher.update(bytes);
        }
    }

    /// Consumes `bytes`, the next octets of the stream, calling `on_ulpdu` with each verified
    /// ULPDU (the DDP segment only: no ULPDU_Length, PAD, CRC or Markers), in stream order.
    /// Input may be cut anywhere. On error nothing from the failing FPDU is handed up, and
    /// every later call returns the same error.
    pub fn feed<F: FnMut(&[u8])>(&mut self, bytes: &[u8], mut on_ulpdu: F) -> Result<(), MpaError> {
        self.feed_spans(bytes, |_, ulpdu| on_ulpdu(ulpdu))
    }

    /// Like [`feed`](Self::feed), and also says where each FPDU lies in the stream: the
    /// [`FpduSpan`] from its ULPDU_Length field to the octet after its CRC (a Marker right
    /// before the header, which belongs to this FPDU, is not included; Markers inside are).
    pub fn feed_spans<F: FnMut(FpduSpan, &[u8])>(
        &mut self,
        bytes: &[u8],
        on_ulpdu: F,
    ) -> Result<(), MpaError> {
        self.feed_spans_with_crc(bytes, None, on_ulpdu)
    }

    /// [`feed_spans`](Self::feed_spans) told the CRC of `bytes` as one FPDU: `covered_crc` is
    /// the CRC32c (RFC 5044 4.4) of all of `bytes` but its last four octets, which the caller
    /// computed as it read them (a receiver does so with the TCP checksum, in one pass over
    /// the segment). When `bytes` is exactly one whole FPDU starting at an FPDU boundary with
    /// no Marker in it, its CRC field is checked against that value and the octets are not
    /// read again; otherwise (and always with Markers) the value is ignored. A wrong value
    /// fails the FPDU as a CRC mismatch would: it never lets an FPDU through that the CRC
    /// would have stopped.
    pub fn feed_spans_with_crc<F: FnMut(FpduSpan, &[u8])>(
        &mut self,
        mut bytes: &[u8],
        mut covered_crc: Option<u32>,
        mut on_ulpdu: F,
    ) -> Result<(), MpaError> {
        if let Some(error) = &self.error {
            return Err(error.clone());
        }
        let whole = bytes.len();
        while !bytes.is_empty() {
            if let Some(got) = self.marker_got {
                let take = (MARKER_LEN - got).min(bytes.len());
                let (chunk, rest) = bytes.split_at(take);
                if let Some(dst) = self.marker.get_mut(got..got + take) {
                    dst.copy_from_slice(chunk);
                }
                self.position += take as u64;
                bytes = rest;
                if got + take == MARKER_LEN {
                    self.marker_got = None;
                    self.check_marker();
                } else {
                    self.marker_got = Some(got + take);
                }
                continue;
            }
            if self.markers && self.position.is_multiple_of(MARKER_INTERVAL as u64) {
                self.marker_got = Some(0);
                self.marker_position = self.position;
                continue;
            }
            let until_marker = self.until_marker();
            match self.phase {
                Phase::Header { got: 0 } => {
                    // Only while nothing of the input has been consumed, and without Markers:
                    // a Marker read just before this header (at the end of the last input) is
                    // already in this FPDU's CRC (RFC 5044 4.4), and not in the caller's.
                    let known = covered_crc
                        .take()
                        .filter(|_| bytes.len() == whole && !self.markers);
                    if let Some(rest) = self.try_whole_fpdu(bytes, known, &mut on_ulpdu)? {
                        bytes = rest;
                        continue;
                    }
                    self.header_position = self.position;
                    bytes = self.read_header(bytes, 0, until_marker)?;
                }
                Phase::Header { got } => {
                    bytes = self.read_header(bytes, got, until_marker)?;
                }
                Phase::Body { remaining } => {
                    let take = remaining.min(bytes.len()).min(until_marker);
                    let (chunk, rest) = bytes.split_at(take);
                    self.hash(chunk);
                    let wanted = self.ulpdu_len.saturating_sub(self.ulpdu.len());
                    self.ulpdu
                        .extend_from_slice(chunk.get(..wanted.min(take)).unwrap_or(&[]));
                    self.position += take as u64;
                    bytes = rest;
                    self.phase = if take == remaining {
                        Phase::Crc { got: 0 }
                    } else {
                        Phase::Body {
                            remaining: remaining - take,
                        }
                    };
                }
                Phase::Crc { got } => {
                    let take = (CRC_LEN - got).min(bytes.len()).min(until_marker);
                    let (chunk, rest) = bytes.split_at(take);
                    if let Some(dst) = self.crc_field.get_mut(got..got + take) {
                        dst.copy_from_slice(chunk);
                    }
                    self.position += take as u64;
                    bytes = rest;
                    if got + take == CRC_LEN {
                        self.finish_fpdu(&mut on_ulpdu)?;
                    } else {
                        self.phase = Phase::Crc { got: got + take };
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads ULPDU_Length octets; on completion validates the length and moves to the body.
    fn read_header<'b>(
        &mut self,
        bytes: &'b [u8],
        got: usize,
        until_marker: usize,
    ) -> Result<&'b [u8], MpaError> {
        let take = (FPDU_HEADER_LEN - got).min(bytes.len()).min(until_marker);
        let (chunk, rest) = bytes.split_at(take);
        self.hash(chunk);
        if let Some(dst) = self.header.get_mut(got..got + take) {
            dst.copy_from_slice(chunk);
        }
        self.position += take as u64;
        if got + take < FPDU_HEADER_LEN {
            self.phase = Phase::Header { got: got + take };
            return Ok(rest);
        }
        let ulpdu_len = usize::from(u16::from_be_bytes(self.header));
        if ulpdu_len > self.max_ulpdu {
            self.fail(MpaError::ReceivedUlpduTooLong {
                len: ulpdu_len,
                max: self.max_ulpdu,
            })?;
        }
        self.ulpdu_len = ulpdu_len;
        self.ulpdu.clear();
        self.ulpdu.reserve(ulpdu_len);
        let remaining = ulpdu_len + pad_len(ulpdu_len);
        self.phase = if remaining == 0 {
            Phase::Crc { got: 0 }
        } else {
            Phase::Body { remaining }
        };
        Ok(rest)
    }

    /// The zero-copy path: at an FPDU boundary, when the whole FPDU is in `bytes` and no
    /// Marker falls inside it, verify it in place and hand up a slice of `bytes`. Returns the
    /// octets after the FPDU, or `None` when the general path must be taken.
    ///
    /// `known`: the CRC of all of `bytes` but its last four octets (see
    /// [`feed_spans_with_crc`](Self::feed_spans_with_crc)), used when the FPDU is all of
    /// `bytes`.
    fn try_whole_fpdu<'b, F: FnMut(FpduSpan, &[u8])>(
        &mut self,
        bytes: &'b [u8],
        known: Option<u32>,
        on_ulpdu: &mut F,
    ) -> Result<Option<&'b [u8]>, MpaError> {
        let Some(header) = FpduHeader::parse(bytes) else {
            return Ok(None);
        };
        let ulpdu_len = usize::from(header.ulpdu_len);
        let total = fpdu_len(ulpdu_len);
        if ulpdu_len > self.max_ulpdu || bytes.len() < total || total > self.until_marker() {
            return Ok(None);
        }
        let (fpdu, rest) = bytes.split_at(total);
        let (covered, crc_field) = fpdu.split_at(total - CRC_LEN);
        self.header_position = self.position;
        let known = known.filter(|_| total == bytes.len());
        if known.is_none() {
            self.hash(covered);
        }
        self.position += total as u64;
        let mut received = [0; CRC_LEN];
        received.copy_from_slice(crc_field);
        self.verify_with(known, received)?;
        let ulpdu = covered
            .get(FPDU_HEADER_LEN..FPDU_HEADER_LEN + ulpdu_len)
            .unwrap_or(&[]);
        on_ulpdu(self.span(), ulpdu);
        self.start_next_fpdu();
        Ok(Some(rest))
    }

    /// Checks the CRC, then any Marker disagreement, of the FPDU just read.
    fn verify(&mut self, received: [u8; CRC_LEN]) -> Result<(), MpaError> {
        self.verify_with(None, received)
    }

    /// [`verify`](Self::verify), the CRC of the covered octets `known` already or else the
    /// hasher's.
    fn verify_with(&mut self, known: Option<u32>, received: [u8; CRC_LEN]) -> Result<(), MpaError> {
        if self.crc {
            let computed = known.unwrap_or_else(|| self.hasher.finalize());
            let received = u32::from_le_bytes(received);
            if computed != received {
                return self.fail(MpaError::CrcMismatch { computed, received });
            }
        }
        if let Some(error) = self.marker_error.take() {
            return self.fail(error);
        }
        Ok(())
    }

    fn finish_fpdu<F: FnMut(FpduSpan, &[u8])>(&mut self, on_ulpdu: &mut F) -> Result<(), MpaError> {
        self.verify(self.crc_field)?;
        on_ulpdu(self.span(), &self.ulpdu);
        self.start_next_fpdu();
        Ok(())
    }

    /// The FPDU just completed: from its header to the current position.
    fn span(&self) -> FpduSpan {
        FpduSpan {
            start: self.header_position,
            end: self.position,
        }
    }

    /// At an FPDU boundary where the caller takes an FPDU located out of order as read
    /// (`FpduLocator`, which checked its CRC): the Marker this decoder read at this boundary,
    /// if it read one, must be the Marker that FPDU was checked with. A locator that did not
    /// have a Marker's octets (they ended an earlier segment) checks the FPDU after it with
    /// the all-zero Marker a Marker between FPDUs is (FPDUPTR 0, RFC 5044 4.3; reserved
    /// octets zero on transmit): received otherwise, with CRCs the FPDU's CRC does not cover
    /// what was received ([`MpaError::LocatedMarkerCrcMismatch`], 4.4), without them an
    /// FPDUPTR other than 0 is a [`MpaError::MarkerMismatch`].
    pub fn check_marker_before_located(&self) -> Result<(), MpaError> {
        let Some((marker_position, octets)) = self.boundary_marker else {
            return Ok(());
        };
        if self.crc && octets != [0; MARKER_LEN] {
            return Err(MpaError::LocatedMarkerCrcMismatch {
                marker_position,
                marker: u32::from_be_bytes(octets),
            });
        }
        match &self.marker_error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Restarts at an FPDU boundary at stream position `position` (relative to SeqStart),
    /// forgetting any partial FPDU and any error, and keeping the internal buffer's
    /// capacity (no allocation). Used to scan segments that arrive out of order.
    pub fn reset(&mut self, position: u64) {
        self.position = position;
        self.error = None;
        self.phase = Phase::Header { got: 0 };
        self.header_position = position;
        self.marker_got = None;
        self.marker_error = None;
        self.start_next_fpdu();
    }

    fn start_next_fpdu(&mut self) {
        self.phase = Phase::Header { got: 0 };
        self.hasher.reset();
        self.ulpdu.clear();
        self.boundary_marker = None;
    }

    /// A complete Marker has been read: work out which FPDU it belongs to, whether that FPDU's
    /// CRC covers it (RFC 5044 section 4.4), and whether its FPDUPTR is right (section 4.3).
    fn check_marker(&mut self) {
        let marker = MarkerPtr::from_bytes(self.marker);
        let (expected, covered) = match self.phase {
            // Between FPDUs: it belongs to the next FPDU and is covered by its CRC.
            Phase::Header { got: 0 } => {
                self.boundary_marker = Some((self.marker_position, self.marker));
                (0, true)
            }
            // Inside the FPDU, up to and including right after the PAD: covered.
            Phase::Header { .. } | Phase::Body { .. } | Phase::Crc { got: 0 } => {
                (self.marker_position - self.header_position, true)
            }
            // Splitting the CRC field: after the PAD, so not covered.
            Phase::Crc { .. } => (self.marker_position - self.header_position, false),
        };
        if covered {
            let marker_octets = self.marker;
            self.hash(&marker_octets);
        }
        if u64::from(marker.fpduptr()) != expected && self.marker_error.is_none() {
            self.marker_error = Some(MpaError::MarkerMismatch {
                marker_position: self.marker_position,
                fpduptr: marker.fpduptr(),
                expected: u16::try_from(expected).unwrap_or(u16::MAX),
            });
        }
    }
}
