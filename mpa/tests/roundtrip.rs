//! Property: encoding any sequence of ULPDUs and decoding the stream, cut into any pieces,
//! gives the same ULPDUs back, with and without Markers and CRCs, from any 4-aligned start.

use mpa::{FpduDecoder, FpduEncoder, MpaError};
use proptest::prelude::*;

fn ulpdus() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..=40),
            prop::collection::vec(any::<u8>(), 0..=3000),
        ],
        0..12,
    )
}

/// Splits `wire` at the given cut points (taken modulo its length).
fn pieces(wire: &[u8], cuts: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|cut| if wire.is_empty() { 0 } else { cut % wire.len() })
        .collect();
    points.push(0);
    points.push(wire.len());
    points.sort_unstable();
    points.windows(2).map(|pair| pair[0]..pair[1]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn encode_then_decode_in_arbitrary_pieces(
        ulpdus in ulpdus(),
        crc in any::<bool>(),
        markers in any::<bool>(),
        start in (0u32..=u32::MAX / 4).prop_map(|quarter| quarter * 4),
        cuts in prop::collection::vec(any::<usize>(), 0..40),
        split_parts in any::<prop::sample::Index>(),
    ) {
        let mut encoder = FpduEncoder::with_position(crc, markers, start);
        let mut wire = Vec::new();
        for ulpdu in &ulpdus {
            let expected_len = encoder.wire_len(ulpdu.len());
            let split = split_parts.index(ulpdu.len() + 1);
            let written = encoder
                .encode_parts(&ulpdu[..split], &ulpdu[split..], &mut wire)
                .unwrap();
            prop_assert_eq!(written, expected_len);
        }
        prop_assert_eq!(encoder.position(), start.wrapping_add(wire.len() as u32));

        let mut decoder = FpduDecoder::with_position(crc, markers, start);
        let mut got = Vec::new();
        for range in pieces(&wire, &cuts) {
            decoder.feed(&wire[range], |ulpdu| got.push(ulpdu.to_vec())).unwrap();
        }
        prop_assert_eq!(&got, &ulpdus);
        prop_assert!(decoder.at_fpdu_boundary());
        prop_assert_eq!(decoder.stream_position(), u64::from(start) + wire.len() as u64);
    }

    #[test]
    fn any_single_bit_flip_is_caught_with_crc(
        ulpdus in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..=1500), 1..5),
        markers in any::<bool>(),
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let mut encoder = FpduEncoder::new(true, markers);
        let mut wire = Vec::new();
        for ulpdu in &ulpdus {
            encoder.encode(ulpdu, &mut wire).unwrap();
        }
        let at = flip.index(wire.len());
        wire[at] ^= 1 << bit;
        let mut decoder = FpduDecoder::new(true, markers);
        let mut got: Vec<Vec<u8>> = Vec::new();
        let result = decoder.feed(&wire, |ulpdu| got.push(ulpdu.to_vec()));
        // Whatever is handed up is an unmodified prefix of what was sent.
        prop_assert!(got.len() <= ulpdus.len());
        prop_assert_eq!(&got[..], &ulpdus[..got.len()]);
        // The flip is detected: as a CRC error, a Marker error, a length error, or (when it
        // lengthened the last FPDU) by the stream ending inside an FPDU.
        match result {
            Ok(()) => prop_assert!(got.len() < ulpdus.len() && !decoder.at_fpdu_boundary()),
            Err(MpaError::CrcMismatch { .. })
            | Err(MpaError::MarkerMismatch { .. })
            | Err(MpaError::ReceivedUlpduTooLong { .. }) => {}
            Err(other) => prop_assert!(false, "unexpected error {other:?}"),
        }
    }
}
