//! Finding FPDUs in a TCP segment that arrived out of order (RFC 5044 section 6;
//! draft-ietf-rddp-mpa-01 Appendix 11).
//!
//! A receiver that places data before TCP has delivered it in order needs the FPDUs of a
//! segment without the octets before it. Two things make that possible: a header-aligned
//! sender (every segment starts with an FPDU: RFC 5044 5.1's SHOULD, which our engine and
//! Linux siw keep) and Markers (every 512th octet of the stream says where the FPDU around it
//! starts). A guess is only as good as what checks it, so an FPDU found here is handed up only
//! when the same checks as in order pass: its CRC (when CRCs are on) and every Marker inside
//! it. With neither CRC nor Markers nothing can check a guess, and nothing is located: the
//! caller keeps such segments until they are in order.

use crate::decoder::{FpduDecoder, FpduSpan};
use crate::wire::{MarkerPtr, MARKER_INTERVAL, MARKER_LEN};

/// Locates verified FPDUs in single out-of-order segments. Reuses one decoder whose buffer is
/// allocated for the largest ULPDU when the locator is made, so scanning allocates nothing.
#[derive(Debug, Clone)]
pub struct FpduLocator {
    crc: bool,
    markers: bool,
    decoder: FpduDecoder,
    /// What the last scan left at the segment's end (see [`FpduLocator::tail`]).
    tail: Option<FpduSpan>,
}

impl FpduLocator {
    /// `crc`: CRCs are checked on this connection; `markers`: the peer inserts Markers.
    pub fn new(crc: bool, markers: bool) -> FpduLocator {
        FpduLocator {
            crc,
            markers,
            decoder: FpduDecoder::new(crc, markers),
            tail: None,
        }
    }

    /// Whether anything can be located at all (CRC or Markers on).
    pub fn can_locate(&self) -> bool {
        self.crc || self.markers
    }

    /// Scans `segment`, whose first octet is at stream position `position` (relative to
    /// SeqStart), and calls `on_fpdu` with the span and ULPDU of each complete, verified
    /// FPDU, in order. Returns the stream range those FPDUs cover (from where the scan
    /// started, which may be a Marker that belongs to the first FPDU, to the end of the last
    /// one), or `None` when nothing was located. Octets before and after that range belong
    /// to FPDUs that are not complete in this segment.
    pub fn locate<F: FnMut(FpduSpan, &[u8])>(
        &mut self,
        segment: &[u8],
        position: u64,
        on_fpdu: F,
    ) -> Option<FpduSpan> {
        self.locate_from(segment, position, None, on_fpdu)
    }

    /// Like [`locate`](Self::locate), also starting at `known` when that stream position
    /// lies in the segment: a position known to start an FPDU (or the Marker before one),
    /// because the FPDU before it was framed elsewhere and its ULPDU_Length says where it ends
    /// (RFC 5044 section 6; draft-ietf-rddp-mpa-01 Appendix 11: the framing carried across a
    /// gap). The scan starts at the first of the places an FPDU may start (the segment's start
    /// when CRCs can check that guess, the first header a Marker points at, `known`) from
    /// which something is found, so FPDUs before `known` that a Marker locates are not missed;
    /// everything found is still checked (CRC, Markers inside).
    pub fn locate_from<F: FnMut(FpduSpan, &[u8])>(
        &mut self,
        segment: &[u8],
        position: u64,
        known: Option<u64>,
        on_fpdu: F,
    ) -> Option<FpduSpan> {
        self.locate_from_with_crc(segment, position, known, None, on_fpdu)
    }

    /// [`locate_from`](Self::locate_from) told the CRC of `segment` as one FPDU: `covered_crc`
    /// is the CRC32c (RFC 5044 4.4) of all of the segment but its last four octets, which a
    /// receiver computes with the TCP checksum in one pass. The scan from the segment's start
    /// takes it as [`FpduDecoder::feed_spans_with_crc`] does: when the segment is exactly one
    /// FPDU (an aligned sender's) its CRC field is checked against the value and the octets
    /// are not read again; otherwise the value is ignored. A wrong value fails that FPDU as a
    /// CRC mismatch would.
    pub fn locate_from_with_crc<F: FnMut(FpduSpan, &[u8])>(
        &mut self,
        segment: &[u8],
        position: u64,
        known: Option<u64>,
        covered_crc: Option<u32>,
        mut on_fpdu: F,
    ) -> Option<FpduSpan> {
        self.tail = None;
        if !self.can_locate() {
            return None;
        }
        let end = position + segment.len() as u64;
        let known = known.filter(|&k| k >= position && k < end);
        let guess = self.crc.then_some(position);
        // The Marker scan only matters when it could start before what is known.
        let marker = match known {
            Some(k) if k == position => None,
            _ => self.marker_start(segment, position),
        };
        let mut starts = [guess, marker, known];
        starts.sort_unstable_by_key(|s| s.unwrap_or(u64::MAX));
        let mut tail = None;
        let mut tried = None;
        for start in starts.into_iter().flatten() {
            if tried == Some(start) {
                continue;
            }
            tried = Some(start);
            let crc = covered_crc.filter(|_| start == position);
            let (found, ok) = self.scan(segment, position, start, crc, &mut on_fpdu);
            if found.is_some() {
                return found;
            }
            // A scan that found nothing frames the segment's end only from a start that is
            // known or a Marker points at (a guess says nothing).
            if ok && (Some(start) == known || (Some(start) == marker && tail.is_none())) {
                tail = self.tail;
            }
        }
        self.tail = tail;
        None
    }

    /// Octets of heap the locator holds: its decoder's buffer, sized for the largest ULPDU at
    /// the first scan.
    pub fn buffer_capacity(&self) -> usize {
        self.decoder.buffer_capacity()
    }

    /// Frees the decoder's buffer between scans (the next scan sizes it again).
    pub fn release_buffer(&mut self) {
        self.decoder.reset(0);
        self.decoder.release_buffer();
    }

    /// After [`locate`](Self::locate) or [`locate_from`](Self::locate_from): the FPDU that
    /// the last scan was inside when the segment ended, from its ULPDU_Length field to where
    /// it ends (the next FPDU's start, which lies beyond the segment); an empty span at the
    /// segment's end when that is an FPDU boundary. `None` when nothing was located, the scan
    /// failed, or the segment ended inside an ULPDU_Length field.
    pub fn tail(&self) -> Option<FpduSpan> {
        self.tail
    }

    /// Decodes from stream position `start` (inside the segment) to the segment's end;
    /// returns the span covered by the FPDUs found and whether the scan ended without error.
    fn scan<F: FnMut(FpduSpan, &[u8])>(
        &mut self,
        segment: &[u8],
        position: u64,
        start: u64,
        covered_crc: Option<u32>,
        on_fpdu: &mut F,
    ) -> (Option<FpduSpan>, bool) {
        self.tail = None;
        let Some(rest) = start
            .checked_sub(position)
            .and_then(|skip| usize::try_from(skip).ok())
            .and_then(|skip| segment.get(skip..))
        else {
            return (None, false);
        };
        // Guesses read any ULPDU_Length: the buffer is sized for the largest at once, on the
        // first scan (a connection that never sees a segment out of order holds none).
        self.decoder.reserve_max_ulpdu();
        let marker_at = MARKER_INTERVAL as u64;
        let marker_len = MARKER_LEN as u64;
        if self.markers && start % marker_at == marker_len && start - marker_len >= position {
            // A header right after a Marker position whose octets are here: they are read
            // (checked as a Marker between FPDUs, and covered by the header's CRC), not taken
            // to be the zero Marker a Marker between FPDUs is (a Marker corrupted in flight,
            // before a header a later Marker points at, went unchecked).
            let from_marker = &segment[(start - marker_len - position) as usize..];
            return self.scan_from(from_marker, start - marker_len, false, covered_crc, on_fpdu);
        }
        if self.markers && start % marker_at == marker_len {
            // A header right after a Marker position whose octets are not here (they ended the
            // last segment, or a gap took them): that Marker lies between FPDUs, so it holds
            // FPDUPTR 0 and the header's CRC covers it (RFC 5044 4.3, 4.4). Read as such, the
            // FPDU can be checked; if the Marker was anything else, its CRC fails the guess.
            let found = self.scan_from(rest, start, true, covered_crc, on_fpdu);
            // Unless the stream itself starts at this header (a decoder made at this stream
            // position reads no Marker before it): then the CRC covers the FPDU alone.
            if found.0.is_some() || found.1 || !self.crc {
                return found;
            }
        }
        self.scan_from(rest, start, false, covered_crc, on_fpdu)
    }

    /// Decodes `rest`, which starts at stream position `start`, after the Marker between
    /// FPDUs just before `start` when `after_marker`; as [`scan`](Self::scan).
    fn scan_from<F: FnMut(FpduSpan, &[u8])>(
        &mut self,
        rest: &[u8],
        start: u64,
        after_marker: bool,
        covered_crc: Option<u32>,
        on_fpdu: &mut F,
    ) -> (Option<FpduSpan>, bool) {
        self.tail = None;
        if after_marker {
            self.decoder.reset(start - MARKER_LEN as u64);
            let between = MarkerPtr::BETWEEN_FPDUS.to_bytes();
            if self.decoder.feed_spans(&between, |_, _| {}).is_err() {
                return (None, false);
            }
        } else {
            self.decoder.reset(start);
        }
        let mut end = None;
        // An error ends the scan; what was handed up before it was verified.
        let ok = self
            .decoder
            .feed_spans_with_crc(rest, covered_crc, |span, ulpdu| {
                end = Some(span.end);
                on_fpdu(span, ulpdu);
            })
            .is_ok();
        if ok {
            self.tail = self.decoder.current_fpdu();
        }
        (end.map(|end| FpduSpan { start, end }), ok)
    }

    /// The first FPDU start a Marker in the segment points at (a header inside the segment,
    /// or the Marker itself when it lies between FPDUs).
    fn marker_start(&self, segment: &[u8], position: u64) -> Option<u64> {
        let end = position + segment.len() as u64;
        if self.markers {
            let interval = MARKER_INTERVAL as u64;
            let mut marker = position.div_ceil(interval) * interval;
            while marker + MARKER_LEN as u64 <= end {
                let at = usize::try_from(marker - position).ok()?;
                let bytes: [u8; MARKER_LEN] = segment.get(at..at + MARKER_LEN)?.try_into().ok()?;
                let ptr = u64::from(MarkerPtr::from_bytes(bytes).fpduptr());
                if ptr == 0 {
                    // Between FPDUs: the next header follows this Marker.
                    return Some(marker);
                }
                if let Some(header) = marker.checked_sub(ptr) {
                    if header >= position {
                        return Some(header);
                    }
                }
                marker += interval;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FpduEncoder;

    /// (start, end, ULPDU) of one FPDU of a test stream.
    type Fpdu = (u64, u64, Vec<u8>);

    /// A stream of `n` FPDUs with ULPDUs of varied lengths; returns the stream, each FPDU's
    /// (start, end) and its ULPDU.
    fn stream(crc: bool, markers: bool, n: usize) -> (Vec<u8>, Vec<Fpdu>) {
        let mut enc = FpduEncoder::new(crc, markers);
        let mut wire = Vec::new();
        let mut fpdus = Vec::new();
        for i in 0..n {
            let len = 20 + (i * 337) % 1400;
            let ulpdu: Vec<u8> = (0..len).map(|j| (i * 7 + j * 13) as u8).collect();
            let start = wire.len() as u64;
            enc.encode(&ulpdu, &mut wire).unwrap();
            fpdus.push((start, wire.len() as u64, ulpdu));
        }
        (wire, fpdus)
    }

    /// Header-aligned segments: whole FPDUs, packed up to `mss` octets.
    fn aligned_segments(fpdus: &[Fpdu], mss: u64) -> Vec<(u64, u64)> {
        let mut segs = Vec::new();
        let mut cur: Option<(u64, u64)> = None;
        for &(s, e, _) in fpdus {
            match cur {
                Some((cs, _)) if e - cs <= mss => cur = Some((cs, e)),
                Some(c) => {
                    segs.push(c);
                    cur = Some((s, e));
                }
                None => cur = Some((s, e)),
            }
        }
        segs.extend(cur);
        segs
    }

    fn header_of(fpdus: &[Fpdu], start: u64) -> Option<&Vec<u8>> {
        fpdus
            .iter()
            .find(|f| f.0 == start || f.0 + 4 == start)
            .map(|f| &f.2)
    }

    /// A segment of one FPDU out of order, its CRC given by the caller: taken at face value (a
    /// wrong one fails the FPDU, so the octets were not read again), and ignored for a segment
    /// of two FPDUs (it cannot be the CRC of either).
    #[test]
    fn a_covered_crc_checks_a_one_fpdu_segment_in_place_of_its_octets() {
        let (wire, fpdus) = stream(true, false, 8);
        let (s, e, ref ulpdu) = fpdus[5];
        let seg = &wire[s as usize..e as usize];
        let crc = crate::crc::crc32c(&seg[..seg.len() - 4]);
        for (given, placed) in [(crc, true), (crc ^ 1, false)] {
            let mut loc = FpduLocator::new(true, false);
            let mut found = Vec::new();
            let span =
                loc.locate_from_with_crc(seg, s, None, Some(given), |_, u| found.push(u.to_vec()));
            assert_eq!(span.is_some(), placed, "CRC given {given:#x}");
            assert_eq!(found.len(), usize::from(placed));
            if placed {
                assert_eq!(&found[0], ulpdu);
            }
        }
        let (s, e) = (fpdus[2].0, fpdus[3].1);
        let two = &wire[s as usize..e as usize];
        let mut loc = FpduLocator::new(true, false);
        let mut n = 0;
        let span = loc.locate_from_with_crc(two, s, None, Some(0xdead_beef), |_, _| n += 1);
        assert_eq!((span.map(|f| (f.start, f.end)), n), (Some((s, e)), 2));
    }

    #[test]
    fn aligned_segments_in_reverse_order_give_every_fpdu() {
        for (crc, markers) in [(true, false), (true, true), (false, true)] {
            let (wire, fpdus) = stream(crc, markers, 200);
            let mut found = Vec::new();
            let mut loc = FpduLocator::new(crc, markers);
            for &(s, e) in aligned_segments(&fpdus, 1460).iter().rev() {
                let seg = &wire[s as usize..e as usize];
                let covered = loc.locate(seg, s, |span, u| found.push((span, u.to_vec())));
                // With markers a segment whose first FPDU has no Marker pointing at it is
                // still found when CRC can check the guess; without CRC it may be skipped.
                if crc {
                    assert_eq!(
                        covered.map(|c| c.end),
                        Some(e),
                        "crc {crc} markers {markers}"
                    );
                }
            }
            for (span, u) in &found {
                assert_eq!(
                    header_of(&fpdus, span.start),
                    Some(u),
                    "wrong ULPDU at {span:?}"
                );
            }
            if crc {
                assert_eq!(found.len(), fpdus.len());
            } else {
                assert!(found.len() > fpdus.len() / 3, "found only {}", found.len());
            }
        }
    }

    /// A segment that starts with the header of an FPDU whose Marker (between FPDUs, right
    /// before the header) ended the segment before or fell in a gap: that Marker is in the
    /// FPDU's CRC (RFC 5044 4.4) but not in the segment. It holds FPDUPTR 0, so the FPDU's
    /// CRC still checks the guess at the segment's start (without CRCs nothing could).
    #[test]
    fn a_header_whose_marker_is_missing_is_found() {
        let (wire, fpdus) = stream(true, true, 600);
        let mut tried = 0;
        for (i, &(s, _, ref ulpdu)) in fpdus.iter().enumerate() {
            if s % MARKER_INTERVAL as u64 != 0 || i + 2 >= fpdus.len() {
                continue;
            }
            // From the header to the end of the FPDU after next (past the next Marker).
            let (header, end) = (s + MARKER_LEN as u64, fpdus[i + 2].1);
            let seg = &wire[header as usize..end as usize];
            let mut loc = FpduLocator::new(true, true);
            let mut found = Vec::new();
            let span = loc.locate(seg, header, |span, u| found.push((span.start, u.to_vec())));
            assert_eq!(span.map(|f| (f.start, f.end)), Some((header, end)));
            assert_eq!(found.len(), 3);
            assert_eq!(found[0], (header, ulpdu.clone()));
            tried += 1;
        }
        assert!(
            tried >= 2,
            "the stream has {tried} FPDUs right after a Marker"
        );
    }

    /// A segment that holds a Marker between FPDUs and, further on, a Marker pointing back at
    /// the header right after it: the first Marker's octets are read and checked (FPDUPTR 0,
    /// covered by the FPDU's CRC), not taken to be zero. Corrupted (its FPDUPTR pointing
    /// before the segment, so that only the later Marker points at a header), the FPDU after
    /// it is not located; intact, it is.
    #[test]
    fn a_marker_in_the_segment_before_a_located_header_is_checked() {
        let (wire, fpdus) = stream(true, true, 600);
        let mut tried = 0;
        for &(s, end, _) in &fpdus {
            let interval = MARKER_INTERVAL as u64;
            if s % interval != 0 || s < 8 || end <= s + interval + MARKER_LEN as u64 {
                continue;
            }
            let header = s + MARKER_LEN as u64;
            let from = s - 8;
            for corrupt in [false, true] {
                let mut seg = wire[from as usize..end as usize].to_vec();
                if corrupt {
                    // FPDUPTR 0x0100: a header 256 octets before the Marker, before the segment.
                    seg[10] = 0x01;
                }
                let mut loc = FpduLocator::new(true, true);
                let mut found = Vec::new();
                loc.locate(&seg, from, |span, _| found.push(span.start));
                assert_eq!(found.contains(&header), !corrupt, "{s}: {found:?}");
            }
            tried += 1;
        }
        assert!(tried >= 2, "the stream has {tried} such FPDUs");
    }

    /// A stream that itself starts 4 octets past a Marker position has no Marker before its
    /// first header, so that FPDU's CRC covers no Marker: the in-order decoder made at that
    /// position takes it, and so must the locator.
    #[test]
    fn a_stream_starting_past_a_marker_position_is_found() {
        let start = 3 * MARKER_INTERVAL as u32 + MARKER_LEN as u32;
        let mut enc = FpduEncoder::with_position(true, true, start);
        let mut wire = Vec::new();
        for len in [8, 700, 30] {
            enc.encode(&vec![len as u8; len], &mut wire).unwrap();
        }
        let position = u64::from(start);
        for known in [None, Some(position)] {
            let mut loc = FpduLocator::new(true, true);
            let mut found = Vec::new();
            let span = loc.locate_from(&wire, position, known, |span, u| {
                found.push((span.start, u.len()))
            });
            assert_eq!(
                span.map(|f| (f.start, f.end)),
                Some((position, position + wire.len() as u64))
            );
            assert_eq!(found.len(), 3, "known {known:?}: {found:?}");
            assert_eq!(found[0], (position, 8));
        }
    }

    #[test]
    fn resegmented_stream_with_markers_finds_only_true_fpdus() {
        for crc in [true, false] {
            let (wire, fpdus) = stream(crc, true, 300);
            let mut loc = FpduLocator::new(crc, true);
            let mut found = 0;
            // Cut at positions unrelated to FPDU boundaries.
            let mut pos = 0usize;
            let mut k = 0usize;
            while pos < wire.len() {
                let len = (700 + (k * 389) % 2500).min(wire.len() - pos);
                let seg = &wire[pos..pos + len];
                loc.locate(seg, pos as u64, |span, u| {
                    assert_eq!(header_of(&fpdus, span.start), Some(&u.to_vec()));
                    assert!(span.start >= pos as u64 && span.end <= (pos + len) as u64);
                    found += 1;
                });
                pos += len;
                k += 1;
            }
            assert!(found > 100, "crc {crc}: only {found} FPDUs located");
        }
    }

    #[test]
    fn the_tail_carries_the_framing_across_a_gap() {
        for (crc, markers) in [(true, true), (false, true), (true, false)] {
            let (wire, fpdus) = stream(crc, markers, 120);
            let mut loc = FpduLocator::new(crc, markers);
            let mut checked = 0;
            // A piece [a, b), a gap [b, b + gap), then a piece [b + gap, e).
            for k in 0..60u64 {
                // Without Markers only a piece that starts with an FPDU can be located.
                let a = fpdus[k as usize].0 + if markers { (k * 37) % 50 } else { 0 };
                let b = a + 900 + (k * 211) % 1700;
                let gap = 1 + (k * 53) % 40;
                let e = (b + gap + 1500).min(wire.len() as u64);
                let mut first = Vec::new();
                loc.locate(&wire[a as usize..b as usize], a, |span, _| first.push(span));
                let Some(tail) = loc.tail() else {
                    continue;
                };
                // The FPDU the piece ends in: from its header to where the next one starts.
                let cut = fpdus.iter().find(|f| f.0 < b && b <= f.1).unwrap();
                if tail.start != tail.end {
                    // (a Marker right before the header belongs to the FPDU)
                    assert!(
                        tail.start == cut.0 || tail.start == cut.0 + 4,
                        "{crc} {markers} {k}"
                    );
                    assert_eq!(tail.end, cut.1, "{crc} {markers} {k}");
                }
                let c = tail.end;
                let second_start = b + gap;
                if c < second_start || c >= e {
                    continue;
                }
                let mut found = Vec::new();
                let seg = &wire[second_start as usize..e as usize];
                loc.locate_from(seg, second_start, Some(c), |span, u| {
                    assert_eq!(header_of(&fpdus, span.start), Some(&u.to_vec()));
                    found.push(span.start)
                });
                // Every FPDU from `c` that is whole in the piece, none missed.
                let whole: Vec<u64> = fpdus
                    .iter()
                    .filter(|f| f.0 >= c && f.1 <= e)
                    .map(|f| f.0)
                    .collect();
                let found: Vec<u64> = found
                    .iter()
                    .map(|&s| {
                        whole
                            .iter()
                            .copied()
                            .find(|&w| w == s || w + 4 == s)
                            .unwrap()
                    })
                    .collect();
                assert_eq!(found, whole, "{crc} {markers} {k}");
                checked += 1;
            }
            assert!(checked > 20, "{crc} {markers}: only {checked}");
        }
    }

    #[test]
    fn nothing_without_crc_or_markers_and_nothing_from_a_misaligned_guess() {
        let (wire, fpdus) = stream(false, false, 10);
        let mut loc = FpduLocator::new(false, false);
        assert!(!loc.can_locate());
        assert_eq!(loc.locate(&wire, 0, |_, _| panic!("located")), None);
        // CRC on, segment starting mid-FPDU: the CRC refuses the guess.
        let (wire, fpdus2) = stream(true, false, 10);
        let mut loc = FpduLocator::new(true, false);
        let off = fpdus2[3].0 as usize + 6;
        let end = fpdus2[5].1 as usize;
        assert_eq!(
            loc.locate(&wire[off..end], off as u64, |_, _| panic!("located")),
            None
        );
        let _ = fpdus;
    }
}
