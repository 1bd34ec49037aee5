//! IFT's frame decoder (draft-williams-iwarp-ift-01 section 5.1) on arbitrary streams.
//!
//! Input: a format octet (header CRC, payload CRC, checked or not), a VTag, piece sizes, then
//! the stream, fed in those pieces. Asserts: every frame handed out, encoded again with the
//! same format, gives back exactly the octets it came from, in order, with nothing skipped
//! (so a checked frame's CRCs were right); the decoder never holds more than one frame; an
//! error is final and repeated; a frame `whole_frame_at` finds at the stream's start (section
//! 8's guess) is exactly the first frame the decoder gives. Nothing may panic.
#![no_main]

use ift::{whole_frame_at, FrameDecoder, FrameEncoder, FrameFormat, MAX_FRAME_LEN};
use iwarp_fuzz::Input;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let f = input.u8();
    let fmt = FrameFormat {
        header_crc: f & 1 != 0,
        payload_crc: f & 2 != 0,
        vtag: input.u16(),
        verify: f & 4 == 0,
    };
    let sizes: Vec<u8> = input.bytes(32).to_vec();
    let stream = input.rest().to_vec();
    if let Some((len, guessed)) = whole_frame_at(&fmt, &stream) {
        assert!(len <= stream.len());
        let mut first = None;
        FrameDecoder::new(fmt)
            .feed(&stream[..len], |fr| {
                first.get_or_insert((fr.ddp_header.to_vec(), fr.payload.to_vec()));
            })
            .expect("a guessed frame decodes");
        let want = (guessed.ddp_header.to_vec(), guessed.payload.to_vec());
        assert_eq!(first, Some(want), "the guess is not the decoder's frame");
    }
    let mut dec = FrameDecoder::new(fmt);
    let enc = FrameEncoder::new(fmt);
    let mut again = Vec::new();
    let mut at = 0;
    for &size in sizes.iter().cycle().take(256) {
        let piece = &stream[at..(at + usize::from(size) * 4 + 1).min(stream.len())];
        let mut ulpdu = Vec::new();
        let res = dec.feed(piece, |fr| {
            ulpdu.clear();
            ulpdu.extend_from_slice(fr.ddp_header);
            ulpdu.extend_from_slice(fr.payload);
            enc.encode(&ulpdu, &mut again).expect("a decoded frame encodes");
        });
        assert!(dec.buffered() <= MAX_FRAME_LEN);
        // Unchecked CRCs come back recomputed: then only the lengths must agree.
        let exact = fmt.verify || !(fmt.header_crc || fmt.payload_crc);
        if let Err(e) = res {
            assert_eq!(dec.feed(piece, |_| {}), Err(e), "error not repeated");
            if exact {
                assert_eq!(again[..], stream[..again.len()], "frames before the error changed");
            }
            return;
        }
        if !exact {
            assert!(again.len() <= at + piece.len());
        } else {
            assert_eq!(again[..], stream[..again.len()], "frames do not re-encode to the stream");
            assert_eq!(again.len() + dec.buffered(), at + piece.len(), "octets skipped");
        }
        at += piece.len();
        if at >= stream.len() {
            return;
        }
    }
});
