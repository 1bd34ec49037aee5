//! The FPDU stream decoder (`FpduDecoder`) and the out-of-order locator (`FpduLocator`), with
//! Markers on or off and CRCs on or off (RFC 5044 4 to 6).
//!
//! Input: knobs (CRC, Markers, starting stream position, ULPDU limit, how the stream is cut),
//! then operations that build one stream of one direction: valid FPDUs framed by
//! `FpduEncoder` at their stream position, FPDUs with one octet changed after framing, and raw
//! octets (after which framing resumes at the new position). The stream is fed to a decoder in
//! pieces, then windows of it are handed to a locator as out-of-order segments, with and
//! without a known FPDU boundary.
//!
//! Asserts, for both: every FPDU handed up passes an independent check of the stream octets
//! where it says it lies (`iwarp_fuzz::ref_fpdu`: a bitwise CRC32c over the covered octets,
//! each Marker's FPDUPTR, the ULPDU with Markers removed, where it ends): so nothing whose CRC
//! failed is handed up when CRCs are on. The decoder: FPDUs are handed up back to back from
//! the start; after an error nothing more comes and the error repeats; a stream of valid
//! FPDUs comes out whole and unchanged, and with CRCs on nothing from the first changed FPDU
//! on is handed up (unless the change framed another FPDU that passes every check). The
//! locator: FPDUs lie inside the segment; nothing is located without CRC and Markers; from a
//! known boundary in a stream of valid FPDUs every FPDU that is whole in the segment is found.
//! Nothing may panic.
//!
//! The receiver's one-pass path is checked against this: every piece (every segment) is also
//! given, with the CRC of all of it but its last four octets, to a second decoder (locator),
//! which must hand up (find) exactly what the first did; and, with that CRC altered, to a
//! third, which must hand up a prefix of it (find only FPDUs that pass the independent check):
//! a CRC the caller gives may save a read, never let an FPDU through (`feed_spans_with_crc`,
//! `locate_from_with_crc`).
#![no_main]

use iwarp_fuzz::{crc32c, ref_fpdu, Input, Rng};
use libfuzzer_sys::fuzz_target;
use mpa::{fpdu_end, FpduDecoder, FpduEncoder, FpduLocator, FpduSpan};

/// One FPDU the stream was built with.
struct Built {
    /// Stream position of its first octet (a Marker before its header included).
    start: u64,
    /// Position of its ULPDU_Length field.
    header: u64,
    end: u64,
    ulpdu: Vec<u8>,
    /// An octet was changed after framing.
    changed: bool,
    /// The changed octets still frame an FPDU that passes every check (the input can carry
    /// the CRC of a shortened FPDU in its ULPDU), which a receiver rightly takes.
    forged: bool,
}

/// The octet at stream position `p` of a stream starting at `base`.
fn octet_of(stream: &[u8], base: u64) -> impl Fn(u64) -> Option<u8> + '_ {
    move |p: u64| {
        p.checked_sub(base)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| stream.get(i).copied())
    }
}

/// Checks one FPDU handed up against the stream it came from: `exact` for the in-order
/// decoder, which read everything from `floor` on; otherwise as a locator's scan, which may
/// have started at the header.
#[allow(clippy::too_many_arguments)]
fn check_handed(
    stream: &[u8],
    base: u64,
    floor: u64,
    exact: bool,
    crc: bool,
    markers: bool,
    span: FpduSpan,
    ulpdu: &[u8],
) {
    let r = ref_fpdu(octet_of(stream, base), span.start, markers, floor)
        .unwrap_or_else(|| panic!("handed up an FPDU not in the stream: {span:?}"));
    assert_eq!(r.end, span.end, "the FPDU ends elsewhere: {span:?}");
    assert_eq!(
        r.ulpdu, ulpdu,
        "handed up other octets than the ULPDU at {span:?}"
    );
    assert_eq!(fpdu_end(span.start, ulpdu.len(), markers), span.end);
    let ok = if exact {
        r.exact_ok(crc, markers)
    } else {
        r.lenient_ok(crc, markers)
    };
    assert!(
        ok,
        "handed up an FPDU whose CRC or Markers are wrong: {span:?}, CRC with/without the \
         Marker before {:?}/{}, Marker before {:?}, Markers inside {}",
        r.crc_with_before, r.crc_without_before, r.marker_before_ok, r.markers_inside_ok
    );
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let knobs = input.u8();
    let crc = knobs & 1 != 0;
    let markers = knobs & 2 != 0;
    let start = match (knobs >> 2) & 3 {
        0 => 0,
        1 => u32::from(input.u16()),
        2 => u32::MAX - u32::from(input.u16()),
        _ => input.u32(),
    };
    // With Markers every FPDU starts 4-aligned from SeqStart (FPDUs and Markers are
    // multiples of 4 octets): FPDUPTR has no low bits.
    let start = if markers { start & !3 } else { start };
    let max_ulpdu = if knobs & 16 != 0 {
        usize::from(input.u16())
    } else {
        usize::from(u16::MAX)
    };
    let cut_seed = input.u64();
    let base = u64::from(start);

    // Build the stream.
    let mut stream = Vec::new();
    let mut built: Vec<Built> = Vec::new();
    let mut raw = false;
    let mut enc = FpduEncoder::with_position(crc, markers, start);
    while !input.is_empty() && stream.len() < 1 << 16 && built.len() < 200 {
        let op = input.u8();
        let at = base + stream.len() as u64;
        match op % 8 {
            0..=5 => {
                let len = match op >> 6 {
                    0 => usize::from(input.u8()),
                    1 => usize::from(input.u16() % 2048),
                    2 => usize::from(input.u16() % 40),
                    _ => usize::from(input.u16()),
                };
                let mut ulpdu = input.bytes(len).to_vec();
                // Short inputs still make long FPDUs: the rest is a pattern.
                let fill = op.wrapping_mul(31);
                while ulpdu.len() < len {
                    ulpdu.push(fill ^ ulpdu.len() as u8);
                }
                let Ok(_) = enc.encode(&ulpdu, &mut stream) else {
                    continue;
                };
                let header = if markers && at.is_multiple_of(512) {
                    at + 4
                } else {
                    at
                };
                let mut changed = false;
                if op % 8 == 5 {
                    let fpdu_len = stream.len() - (at - base) as usize;
                    let i = (at - base) as usize + usize::from(input.u16()) % fpdu_len;
                    stream[i] ^= input.u8() | 1;
                    // Changed for the receiver unless the octet was one it ignores (a
                    // Marker's reserved field or the low FPDUPTR bits inside the CRC field).
                    let end = base + stream.len() as u64;
                    changed =
                        !ref_fpdu(octet_of(&stream, base), header, markers, at).is_some_and(|r| {
                            r.end == end && r.ulpdu == ulpdu && r.exact_ok(crc, markers)
                        });
                }
                built.push(Built {
                    start: at,
                    header,
                    end: base + stream.len() as u64,
                    ulpdu,
                    changed,
                    forged: false,
                });
            }
            _ => {
                let mut n = usize::from(input.u8() % 64);
                if markers {
                    n &= !3;
                }
                stream.extend_from_slice(input.bytes(n));
                raw = true;
                enc = FpduEncoder::with_position(
                    crc,
                    markers,
                    start.wrapping_add(stream.len() as u32),
                );
            }
        }
    }
    // Judged on the whole stream: a changed length can reach into octets framed after it.
    for b in built.iter_mut().filter(|b| b.changed) {
        b.forged = ref_fpdu(octet_of(&stream, base), b.header, markers, b.start)
            .is_some_and(|r| r.exact_ok(crc, markers));
    }
    let clean = !raw
        && built
            .iter()
            .all(|b| !b.changed && b.ulpdu.len() <= max_ulpdu);
    let first_changed = built.iter().position(|b| b.changed);

    // In order, in pieces.
    let mut rng = Rng::new(cut_seed);
    let max_piece = 1 + rng.below(2000);
    let mut dec = FpduDecoder::with_position(crc, markers, start);
    dec.set_max_ulpdu(max_ulpdu);
    let mut handed: Vec<(FpduSpan, Vec<u8>)> = Vec::new();
    let mut error = None;
    // The same pieces with the caller's CRC of each: right, and altered.
    let flip = (cut_seed as u32) | 1;
    let mut dec_told = FpduDecoder::with_position(crc, markers, start);
    dec_told.set_max_ulpdu(max_ulpdu);
    let mut dec_wrong = FpduDecoder::with_position(crc, markers, start);
    dec_wrong.set_max_ulpdu(max_ulpdu);
    let mut handed_told: Vec<(FpduSpan, Vec<u8>)> = Vec::new();
    let mut handed_wrong: Vec<(FpduSpan, Vec<u8>)> = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let n = (1 + rng.below(max_piece) as usize).min(stream.len() - at);
        let piece = &stream[at..at + n];
        let before = handed.len();
        let told = (n >= 4).then(|| crc32c(&piece[..n - 4]));
        let told_result = dec_told.feed_spans_with_crc(piece, told, |span, ulpdu| {
            handed_told.push((span, ulpdu.to_vec()))
        });
        let _ = dec_wrong.feed_spans_with_crc(piece, told.map(|c| c ^ flip), |span, ulpdu| {
            handed_wrong.push((span, ulpdu.to_vec()))
        });
        let result = dec.feed_spans(piece, |span, ulpdu| handed.push((span, ulpdu.to_vec())));
        assert_eq!(told_result, result, "the told CRC changed the outcome");
        match (&error, result) {
            (None, Ok(())) => {
                assert_eq!(dec.stream_position(), base + (at + n) as u64);
                if let Some(span) = dec.current_fpdu() {
                    assert!(span.start <= span.end);
                }
            }
            (None, Err(e)) => {
                assert_eq!(dec.error(), Some(&e));
                assert_eq!(dec.current_fpdu(), None);
                error = Some(e);
            }
            (Some(e), r) => {
                assert_eq!(r.as_ref().err(), Some(e), "the error is not repeated");
                assert_eq!(handed.len(), before, "handed up after an error");
            }
        }
        at += n;
    }
    assert_eq!(
        handed_told, handed,
        "the told CRC changed what was handed up"
    );
    assert!(
        handed_wrong.len() <= handed.len() && handed_wrong[..] == handed[..handed_wrong.len()],
        "a wrong told CRC let something else through"
    );
    let mut expect_start = base;
    for (span, ulpdu) in &handed {
        let at_marker = markers && expect_start.is_multiple_of(512);
        assert!(
            span.start == expect_start || (at_marker && span.start == expect_start + 4),
            "FPDU at {} where {expect_start} was expected",
            span.start
        );
        assert!(ulpdu.len() <= max_ulpdu, "a ULPDU over the limit");
        check_handed(&stream, base, base, true, crc, markers, *span, ulpdu);
        expect_start = span.end;
    }
    if clean {
        assert_eq!(error, None, "a clean stream failed");
        assert_eq!(
            handed.len(),
            built.len(),
            "FPDUs missing from a clean stream"
        );
    }
    let good_prefix = first_changed.unwrap_or(built.len());
    let prefix_ok = !raw
        && built[..good_prefix]
            .iter()
            .all(|b| b.ulpdu.len() <= max_ulpdu);
    for ((span, ulpdu), b) in handed.iter().zip(&built) {
        if !prefix_ok || b.changed {
            break;
        }
        assert_eq!((span.start, span.end), (b.header, b.end));
        assert_eq!(ulpdu, &b.ulpdu, "a valid FPDU came out changed");
    }
    // Unless the first change framed another valid FPDU: what follows it is then read from
    // elsewhere in the stream, and each FPDU handed up was checked above.
    let forged = first_changed.is_some_and(|k| built[k].forged);
    if crc && !raw && !forged {
        if let Some(k) = first_changed {
            assert!(
                handed.len() <= k,
                "an FPDU after a changed one was handed up"
            );
        }
    }

    // Out of order: windows of the stream as single segments.
    let mut loc = FpduLocator::new(crc, markers);
    let mut loc_told = FpduLocator::new(crc, markers);
    let mut loc_wrong = FpduLocator::new(crc, markers);
    for _ in 0..rng.below(12) {
        if stream.is_empty() {
            break;
        }
        let (a, known) = if !built.is_empty() && rng.below(2) == 0 {
            let b = &built[rng.below(built.len() as u64) as usize];
            let a = if rng.below(3) == 0 {
                b.start
            } else {
                b.start.saturating_sub(rng.below(600)).max(base)
            };
            let known = (rng.below(4) != 0).then_some(b.start);
            ((a - base) as usize, known)
        } else {
            (rng.below(stream.len() as u64) as usize, None)
        };
        let len = 1 + rng.below(4000) as usize;
        let b = (a + len).min(stream.len());
        let seg = &stream[a..b];
        let pos = base + a as u64;
        let end = base + b as u64;
        let told = (seg.len() >= 4).then(|| crc32c(&seg[..seg.len() - 4]));
        let mut found_told: Vec<FpduSpan> = Vec::new();
        let covered_told =
            loc_told.locate_from_with_crc(seg, pos, known, told, |span, _| found_told.push(span));
        let _ = loc_wrong.locate_from_with_crc(
            seg,
            pos,
            known,
            told.map(|c| c ^ flip),
            |span, ulpdu| {
                assert!(
                    span.start >= pos && span.end <= end,
                    "located outside the segment"
                );
                check_handed(&stream, base, pos, false, crc, markers, span, ulpdu);
            },
        );
        let mut found: Vec<FpduSpan> = Vec::new();
        let covered = loc.locate_from(seg, pos, known, |span, ulpdu| {
            assert!(
                span.start >= pos && span.end <= end,
                "located outside the segment"
            );
            check_handed(&stream, base, pos, false, crc, markers, span, ulpdu);
            found.push(span);
        });
        assert_eq!(
            (&found_told, covered_told),
            (&found, covered),
            "the told CRC changed what was located"
        );
        if !crc && !markers {
            assert!(
                found.is_empty() && covered.is_none(),
                "located with nothing to check"
            );
        }
        match covered {
            Some(c) => {
                assert!(c.start >= pos && c.end <= end && c.start <= c.end);
                assert_eq!(Some(c.end), found.last().map(|s| s.end));
            }
            None => assert!(found.is_empty(), "located FPDUs but reported none"),
        }
        if let Some(t) = loc.tail() {
            assert!(t.start <= t.end);
        }
        // From a known boundary at the segment's start in a clean stream, every whole FPDU
        // is found. (Where the scan may start earlier, an FPDU-like run inside a ULPDU that
        // passes the checks is a legitimate find that can hide the true ones.)
        if let (Some(k), true, true) = (known, clean, crc || markers) {
            if k == pos {
                for b in built.iter().filter(|b| b.start >= k && b.end <= end) {
                    assert!(
                        found.iter().any(|s| s.start == b.header && s.end == b.end),
                        "FPDU {}..{} after the known boundary {k} not located in {pos}..{end}",
                        b.header,
                        b.end
                    );
                }
            }
        }
    }
});
