//! The frame codec (draft section 5.1): every combination of header and payload CRC, tagged
//! and untagged DDP headers, payload lengths that leave the CRCs at every alignment, decoded
//! whole, octet by octet and in uneven pieces; and every check that fails a frame.

use ift::wire::{frame_len, FRAME_HEADER_LEN};
use ift::{Frame, FrameDecoder, FrameEncoder, FrameFormat, IftError, MAX_FRAME_LEN};

const TAGGED: usize = 14;
const UNTAGGED: usize = 18;

/// A ULPDU: a DDP header (T bit set for `tagged`) and `payload` octets.
fn ulpdu(tagged: bool, payload: usize, seed: u8) -> Vec<u8> {
    let h = if tagged { TAGGED } else { UNTAGGED };
    let mut u: Vec<u8> = (0..h + payload)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    u[0] = if tagged { 0xC1 } else { 0x41 };
    u
}

fn fmt(header_crc: bool, payload_crc: bool) -> FrameFormat {
    FrameFormat {
        header_crc,
        payload_crc,
        vtag: 0xBEEF,
        verify: true,
    }
}

/// A decoded frame's DDP header and payload.
type Parts = (Vec<u8>, Vec<u8>);

fn decode_in(
    f: FrameFormat,
    stream: &[u8],
    pieces: impl Iterator<Item = usize>,
) -> Result<Vec<Parts>, IftError> {
    let mut dec = FrameDecoder::new(f);
    let mut out = Vec::new();
    let mut at = 0;
    for n in pieces {
        let end = (at + n).min(stream.len());
        dec.feed(&stream[at..end], |fr: Frame<'_>| {
            out.push((fr.ddp_header.to_vec(), fr.payload.to_vec()))
        })?;
        at = end;
        if at == stream.len() {
            break;
        }
    }
    assert_eq!(dec.buffered(), 0, "octets left in the decoder");
    Ok(out)
}

#[test]
fn every_crc_combination_at_every_alignment_in_any_pieces() {
    let lengths = [0usize, 1, 2, 3, 4, 5, 7, 1000, 1001, 65_535];
    for (hc, pc) in [(false, false), (true, false), (false, true), (true, true)] {
        let f = fmt(hc, pc);
        let enc = FrameEncoder::new(f);
        let mut stream = Vec::new();
        let mut want = Vec::new();
        for (k, &len) in lengths.iter().enumerate() {
            for tagged in [true, false] {
                let u = ulpdu(tagged, len, k as u8);
                let h = if tagged { TAGGED } else { UNTAGGED };
                let n = enc.encode(&u, &mut stream).unwrap();
                assert_eq!(n, frame_len(h, len, hc, pc), "hc {hc} pc {pc} len {len}");
                assert_eq!(n, enc.frame_len(h, u.len()));
                want.push((u[..h].to_vec(), u[h..].to_vec()));
            }
        }
        let whole = decode_in(f, &stream, std::iter::once(stream.len())).unwrap();
        assert_eq!(whole, want, "whole, hc {hc} pc {pc}");
        let uneven =
            decode_in(f, &stream, (0..).map(|i| [1, 5, 7, 13, 64, 3, 4093][i % 7])).unwrap();
        assert_eq!(uneven, want, "uneven pieces, hc {hc} pc {pc}");
        // Octet by octet (the small frames only: the stream's first 18 frames).
        let small: usize = (0..18)
            .map(|i| {
                frame_len(
                    if i % 2 == 0 { TAGGED } else { UNTAGGED },
                    lengths[i / 2],
                    hc,
                    pc,
                )
            })
            .sum();
        let octets = decode_in(f, &stream[..small], std::iter::repeat(1)).unwrap();
        assert_eq!(octets, want[..18], "octet by octet, hc {hc} pc {pc}");
    }
}

/// The draft's second figure: an untagged DDP header and a payload whose lengths are not
/// multiples of four leave both CRCs unaligned, with no padding.
#[test]
fn unaligned_crcs_as_in_the_second_figure() {
    let f = fmt(true, true);
    let u = ulpdu(false, 7, 1);
    let mut out = Vec::new();
    FrameEncoder::new(f).encode(&u, &mut out).unwrap();
    assert_eq!(out.len(), 6 + 18 + 4 + 7 + 4);
    assert_eq!(&out[..6], &[0, 18, 0, 7, 0xBE, 0xEF]);
    assert_eq!(&out[6..24], &u[..18]);
    let hcrc = mpa::crc::crc32c(&out[..24]);
    assert_eq!(&out[24..28], &hcrc.to_le_bytes());
    assert_eq!(&out[28..35], &u[18..]);
    assert_eq!(&out[35..], &mpa::crc::crc32c(&u[18..]).to_le_bytes());
    assert!(out.len() <= MAX_FRAME_LEN);
}

fn one_frame(f: FrameFormat) -> Vec<u8> {
    let mut out = Vec::new();
    FrameEncoder::new(f)
        .encode(&ulpdu(true, 100, 3), &mut out)
        .unwrap();
    out
}

#[test]
fn a_bad_frame_ends_the_stream_and_the_error_repeats() {
    let f = fmt(true, true);
    let good = one_frame(f);
    // Header CRC: a DDP header octet changed.
    let mut b = good.clone();
    b[FRAME_HEADER_LEN + 3] ^= 1;
    let e = decode_in(f, &b, std::iter::once(b.len())).unwrap_err();
    assert!(matches!(e, IftError::HeaderCrc { .. }), "{e:?}");
    // Payload CRC: a payload octet changed.
    let mut b = good.clone();
    b[FRAME_HEADER_LEN + TAGGED + 4 + 50] ^= 1;
    let e = decode_in(f, &b, std::iter::once(b.len())).unwrap_err();
    assert!(matches!(e, IftError::PayloadCrc { .. }), "{e:?}");
    // A VTag that is not ours.
    let mut b = good.clone();
    b[5] ^= 1;
    assert_eq!(
        decode_in(f, &b, std::iter::once(b.len())),
        Err(IftError::BadVtag {
            found: 0xBEEE,
            expected: 0xBEEF
        })
    );
    // header_size disagreeing with the DDP header's T bit.
    let mut b = good.clone();
    b[1] = 18;
    assert_eq!(
        decode_in(f, &b, std::iter::once(b.len())),
        Err(IftError::BadHeaderSize {
            found: 18,
            expected: 14
        })
    );
    // Found as early in pieces, and the error repeats.
    let mut dec = FrameDecoder::new(f);
    let mut frames = 0;
    dec.feed(&good, |_| frames += 1).unwrap();
    let e = dec.feed(&b[..7], |_| frames += 1).unwrap_err();
    assert!(matches!(e, IftError::BadHeaderSize { .. }));
    assert_eq!(dec.feed(&good, |_| frames += 1), Err(e));
    assert_eq!(frames, 1);
}

/// A frame whose header is damaged fails once its header and header CRC have come, whether
/// they arrive alone or at the end of a piece: a payload_size made larger does not make the
/// decoder wait for that many octets (it waited, taking the frames behind as this one's
/// payload, or for ever if the stream went quiet).
#[test]
fn a_damaged_header_fails_as_soon_as_its_crc_has_come() {
    let f = fmt(true, true);
    let good = one_frame(f);
    let mut b = good.clone();
    b[2] = 0xff; // payload_size 0xff64 instead of 100
    let header_and_crc = FRAME_HEADER_LEN + TAGGED + 4;
    // In one piece, then octet by octet (the partial frame).
    for pieces in [vec![b.len()], vec![1; b.len()]] {
        let mut dec = FrameDecoder::new(f);
        let mut fed = 0;
        let mut failed_at = None;
        for n in pieces {
            if let Err(e) = dec.feed(&b[fed..fed + n], |_| panic!("no frame")) {
                assert!(matches!(e, IftError::HeaderCrc { .. }), "{e:?}");
                failed_at = Some(fed + n);
                break;
            }
            fed += n;
        }
        let at = failed_at.expect("the damaged header is found");
        assert!(at <= b.len() && at >= header_and_crc, "failed at {at}");
        if at < b.len() {
            assert_eq!(
                at, header_and_crc,
                "octet by octet: as soon as the CRC is in"
            );
        }
        assert_eq!(dec.buffered(), 0);
    }
    // Without header CRCs there is nothing to check early: the frame waits for its octets.
    let plain = fmt(false, true);
    let mut b = one_frame(plain);
    b[2] = 0xff;
    let mut dec = FrameDecoder::new(plain);
    assert_eq!(dec.feed(&b, |_| panic!("no frame")), Ok(()));
    assert_eq!(dec.buffered(), b.len());
}

#[test]
fn crcs_are_not_checked_by_a_receiver_that_ignores_them() {
    let f = FrameFormat {
        verify: false,
        ..fmt(true, true)
    };
    let mut b = one_frame(f);
    b[FRAME_HEADER_LEN + TAGGED + 4 + 50] ^= 1;
    b[FRAME_HEADER_LEN + TAGGED] ^= 1; // the header CRC itself
    let got = decode_in(f, &b, std::iter::once(b.len())).unwrap();
    assert_eq!(got.len(), 1);
    // The VTag and the sizes are checked all the same.
    b[4] ^= 1;
    assert!(matches!(
        decode_in(f, &b, std::iter::once(b.len())),
        Err(IftError::BadVtag { .. })
    ));
}

#[test]
fn what_cannot_be_framed_is_refused() {
    let enc = FrameEncoder::new(fmt(false, false));
    let mut out = Vec::new();
    assert!(enc.encode(&[], &mut out).is_err());
    assert!(enc.encode(&ulpdu(true, 0, 0)[..10], &mut out).is_err());
    assert!(enc.encode(&ulpdu(true, 65_536, 0), &mut out).is_err());
    assert!(out.is_empty());
}

/// MULPDU: what one frame of the format carries in a segment of EMSS octets (the 6-octet IFT
/// header and 4 octets per CRC off), and a frame of that ULPDU fills the segment exactly;
/// never below 128, as MPA's.
#[test]
fn mulpdu_fills_one_segment_with_one_frame() {
    for (h, p, want) in [
        (false, false, 1454),
        (true, false, 1450),
        (false, true, 1450),
        (true, true, 1446),
    ] {
        let f = fmt(h, p);
        assert_eq!(f.mulpdu(1460), want, "hc {h} pc {p}");
        let enc = FrameEncoder::new(f);
        assert_eq!(enc.frame_len(18, want), 1460, "hc {h} pc {p}");
    }
    assert_eq!(fmt(true, true).mulpdu(100), ift::MIN_MULPDU);
    assert_eq!(fmt(true, true).mulpdu(0), ift::MIN_MULPDU);
}
