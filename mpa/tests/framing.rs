//! FPDU encoder/decoder tests against the RFC 5044 section 4.4 figures, the
//! draft-ietf-rddp-mpa-01 version-0 variants, and the Marker/CRC rules.

use mpa::wire::{MarkerPtr, MARKER_INTERVAL};
use mpa::{FpduDecoder, FpduEncoder, MpaError};

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
    assert_eq!(digits.len() % 2, 0);
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// The DDP/RDMAP Send segment of the figures: control octets, reserved STag, QN 0, the MSN,
/// MO 0, then 24 zero octets.
fn send_ulpdu(control: [u8; 2], msn: u32) -> Vec<u8> {
    let mut ulpdu = control.to_vec();
    ulpdu.extend_from_slice(&[0; 4]); // reserved (STag position)
    ulpdu.extend_from_slice(&[0; 4]); // QN 0
    ulpdu.extend_from_slice(&msn.to_be_bytes());
    ulpdu.extend_from_slice(&[0; 4]); // MO 0
    ulpdu.extend_from_slice(&[0; 24]);
    assert_eq!(ulpdu.len(), 42);
    ulpdu
}

const FIG5: &str = "00000000 002a 4143 00000000 00000000 00000001 00000000
                    000000000000000000000000000000000000000000000000
                    52239983";
const FIG6: &str = "002a 4143 00000000 00000000 00000002 00000000
                    00000014
                    000000000000000000000000000000000000000000000000
                    84925898";
const FIG5_V0: &str = "00000000 002a 4003 00000000 00000000 00000001 00000000
                       000000000000000000000000000000000000000000000000
                       4C86B384";
const FIG6_V0: &str = "002a 4003 00000000 00000000 00000002 00000000
                       00000014
                       000000000000000000000000000000000000000000000000
                       A19CD103";

/// Encodes one FPDU at `position` with CRC and Markers on.
fn encode_at(position: u32, ulpdu: &[u8]) -> Vec<u8> {
    let mut encoder = FpduEncoder::with_position(true, true, position);
    let mut out = Vec::new();
    let written = encoder.encode(ulpdu, &mut out).unwrap();
    assert_eq!(written, out.len());
    assert_eq!(encoder.position(), position + out.len() as u32);
    out
}

/// Decodes `wire` at `position` in pieces of `piece` octets and returns the ULPDUs.
fn decode_at(position: u32, wire: &[u8], piece: usize) -> Result<Vec<Vec<u8>>, MpaError> {
    let mut decoder = FpduDecoder::with_position(true, true, position);
    let mut ulpdus = Vec::new();
    for chunk in wire.chunks(piece) {
        decoder.feed(chunk, |ulpdu| ulpdus.push(ulpdu.to_vec()))?;
    }
    assert_eq!(
        decoder.stream_position(),
        u64::from(position) + wire.len() as u64
    );
    assert!(decoder.at_fpdu_boundary());
    Ok(ulpdus)
}

#[test]
fn rfc5044_figure_5_first_fpdu_starts_with_marker() {
    let ulpdu = send_ulpdu([0x41, 0x43], 1);
    let wire = encode_at(0, &ulpdu);
    assert_eq!(wire, hex(FIG5));
    assert_eq!(&wire[wire.len() - 4..], &[0x52, 0x23, 0x99, 0x83]);
    assert_eq!(FpduEncoder::new(true, true).wire_len(42), wire.len());
    for piece in [1, 3, 7, wire.len()] {
        assert_eq!(
            decode_at(0, &wire, piece).unwrap(),
            std::slice::from_ref(&ulpdu)
        );
    }
}

#[test]
fn rfc5044_figure_6_marker_inside_fpdu() {
    let ulpdu = send_ulpdu([0x41, 0x43], 2);
    let wire = encode_at(0x1ec, &ulpdu);
    assert_eq!(wire, hex(FIG6));
    assert_eq!(&wire[0x200 - 0x1ec..0x204 - 0x1ec], &[0, 0, 0, 0x14]);
    assert_eq!(&wire[wire.len() - 4..], &[0x84, 0x92, 0x58, 0x98]);
    for piece in [1, 2, 5, wire.len()] {
        assert_eq!(
            decode_at(0x1ec, &wire, piece).unwrap(),
            std::slice::from_ref(&ulpdu)
        );
    }
}

#[test]
fn draft_mpa_01_version_0_vectors() {
    let first = send_ulpdu([0x40, 0x03], 1);
    let second = send_ulpdu([0x40, 0x03], 2);
    let wire5 = encode_at(0, &first);
    let wire6 = encode_at(0x1ec, &second);
    assert_eq!(wire5, hex(FIG5_V0));
    assert_eq!(wire6, hex(FIG6_V0));
    assert_eq!(decode_at(0, &wire5, 1).unwrap(), [first]);
    assert_eq!(decode_at(0x1ec, &wire6, 1).unwrap(), [second]);
}

#[test]
fn figure_6_follows_a_492_octet_first_fpdu() {
    // The figure's first FPDU is 492 octets with its leading Marker: a 482-octet ULPDU.
    let mut encoder = FpduEncoder::new(true, true);
    let mut wire = Vec::new();
    let first = vec![0x5Au8; 482];
    encoder.encode(&first, &mut wire).unwrap();
    assert_eq!(wire.len(), 0x1ec);
    let second = send_ulpdu([0x41, 0x43], 2);
    encoder.encode(&second, &mut wire).unwrap();
    assert_eq!(&wire[0x1ec..], &hex(FIG6)[..]);
    assert_eq!(
        decode_at(0, &wire, 1).unwrap(),
        [first.clone(), second.clone()]
    );
    assert_eq!(decode_at(0, &wire, wire.len()).unwrap(), [first, second]);
}

#[test]
fn encode_parts_and_encode_into_match_encode() {
    let ulpdu: Vec<u8> = (0..1500u32).map(|i| (i * 13) as u8).collect();
    for position in [0u32, 4, 0x1ec, 508, 0xFFFF_FE00] {
        for (crc, markers) in [(true, true), (true, false), (false, true), (false, false)] {
            let mut whole = FpduEncoder::with_position(crc, markers, position);
            let mut expected = Vec::new();
            whole.encode(&ulpdu, &mut expected).unwrap();
            for split in [0, 1, 18, 700, 1500] {
                let mut parts = FpduEncoder::with_position(crc, markers, position);
                let mut out = vec![0xAA];
                let written = parts
                    .encode_parts(&ulpdu[..split], &ulpdu[split..], &mut out)
                    .unwrap();
                assert_eq!(written, expected.len());
                assert_eq!(&out[1..], &expected[..]);

                let mut into = FpduEncoder::with_position(crc, markers, position);
                assert_eq!(into.wire_len(ulpdu.len()), expected.len());
                let mut buf = vec![0xEE; expected.len() + 10];
                let written = into
                    .encode_into(&ulpdu[..split], &ulpdu[split..], &mut buf)
                    .unwrap();
                assert_eq!(&buf[..written], &expected[..]);
                assert_eq!(into.position(), whole.position());

                let mut with = FpduEncoder::with_position(crc, markers, position);
                let mut got = Vec::new();
                let handed = with
                    .encode_with(&ulpdu[..split], &ulpdu[split..], &mut |b: &[u8]| {
                        got.extend_from_slice(b)
                    })
                    .unwrap();
                assert_eq!(handed, expected.len());
                assert_eq!(got, expected);
                assert_eq!(with.position(), whole.position());
            }
        }
    }
}

#[test]
fn encode_into_too_small_buffer_is_an_error() {
    let mut encoder = FpduEncoder::new(true, true);
    let needed = encoder.wire_len(100);
    let mut buf = vec![0u8; needed - 1];
    assert_eq!(
        encoder.encode_into(&[1; 40], &[2; 60], &mut buf),
        Err(MpaError::BufferTooSmall {
            needed,
            available: needed - 1
        })
    );
    assert_eq!(encoder.position(), 0, "nothing was written");
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn oversized_ulpdu_is_refused() {
    let big = vec![0u8; 65536];
    let mut out = Vec::new();
    let mut encoder = FpduEncoder::new(true, false);
    assert_eq!(
        encoder.encode(&big, &mut out),
        Err(MpaError::UlpduTooLong { len: 65536 })
    );
    assert!(out.is_empty());
    // Without Markers the 16-bit maximum fits; with Markers, FPDUPTR (16 bits) cannot reach
    // Markers near the end of such an FPDU.
    assert!(encoder.encode(&big[..65535], &mut out).is_ok());
    let mut with_markers = FpduEncoder::new(true, true);
    assert_eq!(
        with_markers.encode(&big[..65535], &mut out),
        Err(MpaError::UlpduTooLong { len: 65535 })
    );
    assert!(with_markers.encode(&big[..60000], &mut out).is_ok());
}

#[test]
fn crc_off_sends_zeros_and_ignores_received_crc() {
    let ulpdu = send_ulpdu([0x41, 0x43], 1);
    let mut encoder = FpduEncoder::new(false, false);
    let mut wire = Vec::new();
    encoder.encode(&ulpdu, &mut wire).unwrap();
    assert_eq!(wire.len(), 48);
    assert_eq!(&wire[44..], &[0, 0, 0, 0]);
    wire[45] = 0x77; // garbage in the CRC field must not be checked
    let mut decoder = FpduDecoder::new(false, false);
    let mut got = Vec::new();
    decoder.feed(&wire, |u| got.push(u.to_vec())).unwrap();
    assert_eq!(got, [ulpdu]);
}

#[test]
fn crc_corruption_is_error_2_and_nothing_is_handed_up() {
    let first = vec![7u8; 100];
    let second = vec![9u8; 300];
    let mut encoder = FpduEncoder::new(true, false);
    let mut wire = Vec::new();
    encoder.encode(&first, &mut wire).unwrap();
    let second_start = wire.len();
    encoder.encode(&second, &mut wire).unwrap();
    encoder.encode(&first, &mut wire).unwrap();
    wire[second_start + 50] ^= 0x01;

    for piece in [1, 13, wire.len()] {
        let mut decoder = FpduDecoder::new(true, false);
        let mut got = Vec::new();
        let mut result = Ok(());
        for chunk in wire.chunks(piece) {
            result = decoder.feed(chunk, |u| got.push(u.to_vec()));
            if result.is_err() {
                break;
            }
        }
        let error = result.unwrap_err();
        assert!(matches!(error, MpaError::CrcMismatch { .. }));
        assert_eq!(error.code(), 2);
        assert_eq!(
            got,
            std::slice::from_ref(&first),
            "only the FPDU before the bad one"
        );
        // The decoder refuses further input with the same error.
        assert_eq!(
            decoder.feed(&wire[..8], |_| panic!("handed up")),
            Err(error.clone())
        );
        assert_eq!(decoder.error(), Some(&error));
    }
}

#[test]
fn corrupted_crc_field_with_markers_is_error_2() {
    let ulpdu = send_ulpdu([0x41, 0x43], 2);
    let mut wire = encode_at(0x1ec, &ulpdu);
    let last = wire.len() - 1;
    wire[last] ^= 0x80;
    assert!(matches!(
        decode_at(0x1ec, &wire, 1),
        Err(MpaError::CrcMismatch { .. })
    ));
    // A corrupted Marker is covered by the CRC as well.
    let mut wire = encode_at(0x1ec, &ulpdu);
    wire[0x200 - 0x1ec + 1] = 0x01; // the RESERVED field
    assert!(matches!(
        decode_at(0x1ec, &wire, 3),
        Err(MpaError::CrcMismatch { .. })
    ));
}

/// Re-encodes a corrupted Marker and fixes up the CRC, so the CRC is valid but the Marker is
/// not: that is error 3.
#[test]
fn wrong_fpduptr_with_valid_crc_is_error_3() {
    let ulpdu = send_ulpdu([0x41, 0x43], 2);
    let mut wire = encode_at(0x1ec, &ulpdu);
    let marker_at = 0x200 - 0x1ec;
    wire[marker_at + 3] = 0x18;
    // CRC covers everything before the CRC field here (no Marker inside it).
    let crc_at = wire.len() - 4;
    let crc = mpa::crc::crc32c(&wire[..crc_at]);
    wire[crc_at..].copy_from_slice(&crc.to_le_bytes());
    for piece in [1, wire.len()] {
        let error = decode_at(0x1ec, &wire, piece).unwrap_err();
        assert_eq!(
            error,
            MpaError::MarkerMismatch {
                marker_position: 0x200,
                fpduptr: 0x18,
                expected: 0x14
            }
        );
        assert_eq!(error.code(), 3);
    }
    // With CRCs off the same Marker error is found.
    let mut decoder = FpduDecoder::with_position(false, true, 0x1ec);
    assert!(matches!(
        decoder.feed(&wire, |_| panic!("handed up")),
        Err(MpaError::MarkerMismatch { .. })
    ));
}

#[test]
fn nonzero_marker_between_fpdus_is_error_3() {
    let ulpdu = send_ulpdu([0x41, 0x43], 1);
    let mut wire = encode_at(0, &ulpdu);
    wire[3] = 0x04;
    let crc_at = wire.len() - 4;
    let crc = mpa::crc::crc32c(&wire[..crc_at]);
    wire[crc_at..].copy_from_slice(&crc.to_le_bytes());
    let mut decoder = FpduDecoder::new(true, true);
    let error = decoder.feed(&wire, |_| panic!("handed up")).unwrap_err();
    assert_eq!(
        error,
        MpaError::MarkerMismatch {
            marker_position: 0,
            fpduptr: 4,
            expected: 0
        }
    );
}

#[test]
fn marker_in_the_middle_of_the_crc_field_is_not_covered() {
    // Only a stream position that is not a multiple of four can put a Marker inside the CRC
    // field; the encoder still follows the rules there. The FPDU starts at 0x1f2, its CRC field
    // at 0x1fe, and the Marker at 0x200 splits the CRC field after two octets.
    let ulpdu = vec![0x33u8; 10]; // FPDU: 2 + 10 + 0 PAD + 4 CRC = 16 octets
    let start = 0x200 - 14; // CRC field occupies 0x1fe..0x202 without Markers
    let mut encoder = FpduEncoder::with_position(true, true, start);
    let mut wire = Vec::new();
    encoder.encode(&ulpdu, &mut wire).unwrap();
    assert_eq!(wire.len(), 20);
    // Header, ULPDU, two CRC octets, Marker (FPDUPTR 14, low bits cleared to 12), two CRC octets.
    let crc = mpa::crc::crc32c(&wire[..12]).to_le_bytes();
    assert_eq!(&wire[12..14], &crc[..2]);
    assert_eq!(&wire[14..18], &MarkerPtr::new(14).to_bytes());
    assert_eq!(&wire[18..20], &crc[2..]);
}

#[test]
fn markers_land_every_512_octets_across_the_32_bit_wrap() {
    // Start a few FPDUs before the relative position wraps; every 512-aligned position must
    // hold a Marker pointing to its FPDU, on both sides of the wrap.
    let start = 0u32.wrapping_sub(1200);
    let mut encoder = FpduEncoder::with_position(true, true, start);
    let mut wire = Vec::new();
    let ulpdus: Vec<Vec<u8>> = (0..6u8)
        .map(|i| vec![i; 300 + usize::from(i) * 50])
        .collect();
    let mut fpdu_starts = Vec::new();
    for ulpdu in &ulpdus {
        fpdu_starts.push(wire.len());
        encoder.encode(ulpdu, &mut wire).unwrap();
    }
    let positions: Vec<u32> = mpa::wire::marker_positions(0, start, wire.len() as u32).collect();
    assert!(positions.contains(&0), "a Marker sits at the wrap point");
    let expected_count = (0..wire.len() as u32)
        .filter(|offset| start.wrapping_add(*offset) % MARKER_INTERVAL as u32 == 0)
        .count();
    assert_eq!(positions.len(), expected_count);
    assert!(expected_count >= 4);
    for position in positions {
        let offset = position.wrapping_sub(start) as usize;
        let marker = MarkerPtr::from_bytes(wire[offset..offset + 4].try_into().unwrap());
        if marker.is_between_fpdus() {
            assert!(fpdu_starts.contains(&offset));
        } else {
            let header = marker.header_seq(position).wrapping_sub(start) as usize;
            // The header's offset is an FPDU start, possibly just after a leading Marker.
            assert!(
                fpdu_starts.contains(&header) || fpdu_starts.contains(&(header - 4)),
                "marker at {position:#x} points to {header}"
            );
        }
    }
    let mut decoder = FpduDecoder::with_position(true, true, start);
    let mut got = Vec::new();
    for chunk in wire.chunks(97) {
        decoder.feed(chunk, |u| got.push(u.to_vec())).unwrap();
    }
    assert_eq!(got, ulpdus);
}

#[test]
fn byte_at_a_time_decoding_of_many_fpdus() {
    for (crc, markers) in [(true, true), (true, false), (false, true), (false, false)] {
        let mut encoder = FpduEncoder::new(crc, markers);
        let mut wire = Vec::new();
        let ulpdus: Vec<Vec<u8>> = (0..40usize)
            .map(|i| (0..(i * 37) % 1100).map(|j| (i + j) as u8).collect())
            .collect();
        for ulpdu in &ulpdus {
            encoder.encode(ulpdu, &mut wire).unwrap();
        }
        let mut decoder = FpduDecoder::new(crc, markers);
        let mut got = Vec::new();
        for byte in &wire {
            decoder
                .feed(std::slice::from_ref(byte), |u| got.push(u.to_vec()))
                .unwrap();
        }
        assert_eq!(got, ulpdus);
        assert_eq!(decoder.stream_position(), wire.len() as u64);
    }
}

#[test]
fn zero_copy_path_hands_up_slices_of_the_input() {
    let mut encoder = FpduEncoder::new(true, false);
    let mut wire = Vec::new();
    encoder.encode(b"hello, world", &mut wire).unwrap();
    encoder.encode(b"second", &mut wire).unwrap();
    let range = wire.as_ptr_range();
    let mut decoder = FpduDecoder::new(true, false);
    let mut seen = 0;
    decoder
        .feed(&wire, |ulpdu| {
            assert!(range.contains(&ulpdu.as_ptr()), "ULPDU was copied");
            seen += 1;
        })
        .unwrap();
    assert_eq!(seen, 2);
}

#[test]
fn max_ulpdu_limits_the_receive_buffer() {
    let mut encoder = FpduEncoder::new(true, false);
    let mut wire = Vec::new();
    encoder.encode(&[1u8; 200], &mut wire).unwrap();
    encoder.encode(&[2u8; 201], &mut wire).unwrap();
    let mut decoder = FpduDecoder::new(true, false);
    decoder.set_max_ulpdu(200);
    assert_eq!(decoder.max_ulpdu(), 200);
    let mut got = 0;
    let mut result = Ok(());
    for byte in &wire {
        result = decoder.feed(std::slice::from_ref(byte), |_| got += 1);
        if result.is_err() {
            break;
        }
    }
    assert_eq!(got, 1);
    let error = result.unwrap_err();
    assert_eq!(error, MpaError::ReceivedUlpduTooLong { len: 201, max: 200 });
    assert_eq!(error.code(), 3);
    decoder.set_max_ulpdu(1_000_000);
    assert_eq!(decoder.max_ulpdu(), 65535);
}

#[test]
fn garbage_input_never_panics() {
    let mut seed = 0x1234_5678u32;
    for round in 0..200 {
        let len = (round * 37) % 3000;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                seed as u8
            })
            .collect();
        for (crc, markers) in [(true, true), (false, true), (true, false), (false, false)] {
            let mut decoder = FpduDecoder::new(crc, markers);
            decoder.set_max_ulpdu(1000 + round);
            let _ = decoder.feed(&bytes, |u| assert!(u.len() <= 1000 + round));
        }
    }
}

#[test]
fn marker_between_fpdus_is_covered_by_the_next_fpdu() {
    // Leading Marker (4) + FPDU of 508 octets (502-octet ULPDU) ends exactly at 512, so the
    // next FPDU starts with the Marker 00000000, which its CRC covers (RFC 5044 4.4 rule 2).
    let mut encoder = FpduEncoder::new(true, true);
    let mut wire = Vec::new();
    encoder.encode(&[0x11; 502], &mut wire).unwrap();
    assert_eq!(wire.len(), 512);
    encoder.encode(&[0x22; 10], &mut wire).unwrap();
    let second = &wire[512..];
    assert_eq!(&second[..4], &[0, 0, 0, 0]);
    assert_eq!(&second[4..6], &[0, 10]);
    let crc_at = second.len() - 4;
    let crc = mpa::crc::crc32c(&second[..crc_at]);
    assert_eq!(&second[crc_at..], &crc.to_le_bytes());
    // The first FPDU's CRC does not include that Marker.
    let first_crc = mpa::crc::crc32c(&wire[..508]);
    assert_eq!(&wire[508..512], &first_crc.to_le_bytes());
    assert_eq!(decode_at(0, &wire, 5).unwrap().len(), 2);
}

#[test]
fn marker_right_after_the_pad_is_covered_by_this_fpdu() {
    // Header at 4, 2 + 506 octets end at 512: the Marker at 512 sits between PAD and CRC,
    // points back 508 octets and is covered by this FPDU's CRC (RFC 5044 4.4 rule 1).
    let mut encoder = FpduEncoder::new(true, true);
    let mut wire = Vec::new();
    encoder.encode(&[0x33; 506], &mut wire).unwrap();
    assert_eq!(wire.len(), 4 + 508 + 4 + 4);
    assert_eq!(&wire[512..516], &MarkerPtr::new(508).to_bytes());
    let crc = mpa::crc::crc32c(&wire[..516]);
    assert_eq!(&wire[516..520], &crc.to_le_bytes());
    assert_eq!(decode_at(0, &wire, 1).unwrap(), [vec![0x33; 506]]);
}

#[test]
fn markers_follow_absolute_tcp_sequence_numbers_across_the_wrap() {
    // Full Operation starts at TCP sequence number 0xFFFF_FD10 and the stream runs past
    // 0xFFFF_FFFF. Markers must start at every sequence number S with (S - SeqStart) mod 512
    // == 0, which the encoder (counting from SeqStart) must agree with.
    let seq_start = 0xFFFF_FD10u32;
    let mut encoder = FpduEncoder::new(true, true);
    let mut wire = Vec::new();
    let mut header_seqs = Vec::new();
    for i in 0..8u8 {
        let before = wire.len() as u32;
        let ulpdu = vec![i; 200 + usize::from(i) * 90];
        encoder.encode(&ulpdu, &mut wire).unwrap();
        // The header is at the FPDU start, or 4 later after a leading Marker.
        let at_marker = seq_start.wrapping_add(before) % 512 == seq_start % 512;
        header_seqs.push(seq_start.wrapping_add(before + if at_marker { 4 } else { 0 }));
    }
    let seq_of = |offset: usize| seq_start.wrapping_add(offset as u32);
    let markers: Vec<u32> =
        mpa::wire::marker_positions(seq_start, seq_start, wire.len() as u32).collect();
    assert!(
        markers.iter().any(|&seq| seq < seq_start),
        "some Markers lie after the wrap"
    );
    for &seq in &markers {
        let offset = seq.wrapping_sub(seq_start) as usize;
        assert_eq!(seq_of(offset), seq);
        let marker = MarkerPtr::from_bytes(wire[offset..offset + 4].try_into().unwrap());
        let header = marker.header_seq(seq);
        assert!(
            header_seqs.contains(&header),
            "Marker at {seq:#x} -> {header:#x}"
        );
    }
}

/// `feed_spans_with_crc`: the caller's CRC of a whole FPDU replaces the decoder's own (a
/// right one passes the FPDU, a wrong one fails it as error 2 with nothing handed up), and is
/// ignored where the input is not exactly one FPDU at a boundary.
#[test]
fn a_crc_computed_by_the_caller_checks_a_whole_fpdu() {
    use mpa::crc::crc32c;
    let mut encoder = FpduEncoder::new(true, false);
    let mut one = Vec::new();
    encoder.encode(&[7u8; 100], &mut one).unwrap();
    let covered = crc32c(&one[..one.len() - 4]);

    // Right: handed up, as `feed` would.
    let mut decoder = FpduDecoder::new(true, false);
    let mut got = Vec::new();
    decoder
        .feed_spans_with_crc(&one, Some(covered), |_, u| got.push(u.to_vec()))
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].len(), 100);

    // Wrong: the FPDU fails though its octets are intact.
    let mut decoder = FpduDecoder::new(true, false);
    let mut handed = 0;
    let err = decoder
        .feed_spans_with_crc(&one, Some(covered ^ 1), |_, _| handed += 1)
        .unwrap_err();
    assert!(matches!(err, MpaError::CrcMismatch { .. }), "{err:?}");
    assert_eq!(handed, 0);

    // Ignored when the input holds more than one FPDU (the value then covers no FPDU).
    let mut two = one.clone();
    encoder.encode(b"second", &mut two).unwrap();
    let mut decoder = FpduDecoder::new(true, false);
    let mut seen = 0;
    decoder
        .feed_spans_with_crc(&two, Some(0xdead_beef), |_, _| seen += 1)
        .unwrap();
    assert_eq!(seen, 2);

    // Ignored when the decoder is inside an FPDU: the input's end is then not its CRC field.
    let mut decoder = FpduDecoder::new(true, false);
    let mut seen = 0;
    decoder.feed_spans(&two[..3], |_, _| seen += 1).unwrap();
    decoder
        .feed_spans_with_crc(&two[3..], Some(0xdead_beef), |_, _| seen += 1)
        .unwrap();
    assert_eq!(seen, 2);

    // A corrupted FPDU with the CRC computed over what arrived fails as it would without.
    let mut bad = one.clone();
    bad[20] ^= 0x40;
    let mut decoder = FpduDecoder::new(true, false);
    let err = decoder
        .feed_spans_with_crc(&bad, Some(crc32c(&bad[..bad.len() - 4])), |_, _| {})
        .unwrap_err();
    assert!(matches!(err, MpaError::CrcMismatch { .. }), "{err:?}");
}

/// With Markers, a Marker read at the end of one input just before the next FPDU's header is
/// covered by that FPDU's CRC (RFC 5044 4.4); a CRC the caller computed over the next input
/// alone leaves it out, so it is not used there: the FPDU passes on the decoder's own CRC.
#[test]
fn a_crc_computed_by_the_caller_is_not_used_with_markers() {
    use mpa::crc::crc32c;
    let mut encoder = FpduEncoder::new(true, true);
    let mut wire = Vec::new();
    // Marker at 0, a 508-octet FPDU to 512, a Marker, the second FPDU from 516.
    encoder.encode(&[1u8; 502], &mut wire).unwrap();
    encoder.encode(&[2u8; 100], &mut wire).unwrap();
    assert_eq!(wire.len(), 516 + 108);
    let (first, second) = wire.split_at(516);
    let mut decoder = FpduDecoder::new(true, true);
    let mut got = Vec::new();
    decoder.feed(first, |u| got.push(u.to_vec())).unwrap();
    let own = crc32c(&second[..second.len() - 4]);
    decoder
        .feed_spans_with_crc(second, Some(own), |_, u| got.push(u.to_vec()))
        .unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1], vec![2u8; 100]);
}
