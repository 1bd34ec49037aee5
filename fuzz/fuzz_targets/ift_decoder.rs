//! IFT's frame decoder (draft-williams-iwarp-ift-01 section 5.1) on arbitrary streams.
//!
//! Input: a format octet (header CRC, payload CRC, checked or not), a VTag, piece sizes, then
//! the stream, fed in those pieces. Asserts: every frame handed out, encoded again with the
//! same format, gives back exactly the octets it came from, in order, with nothing skipped
//! (so a checked frame's CRCs were right); the decoder never holds more than one frame; an
//! error is final and repeated; a frame `whole_frame_at` finds at the stream's start (section
//! 8's guess) is exactly the first frame the decoder gives. Nothing may panic.
//!
//! With the format octet's bit 3 the stream's CRCs are repaired before it is fed, as
//! `segment_parser` repairs checksums: from the start, each frame whose header_size is its DDP
//! header's (14 octets tagged, 18 untagged, by the header's first octet) and that lies whole
//! in the stream gets its header and payload CRCs recomputed, until one does not. Mutations of
//! the sizes, the VTag or the DDP header then reach the decoder's checks past the CRCs. And
//! the frames repaired before the first that is not valid (a VTag other than the format's)
//! must all be handed out before any error: a valid frame is never refused.
#![no_main]

use ift::{whole_frame_at, FrameDecoder, FrameEncoder, FrameFormat, MAX_FRAME_LEN};
use iwarp_fuzz::{crc32c, Input};
use libfuzzer_sys::fuzz_target;

/// Recomputes the CRCs of the frames at the start of `stream` (see the crate docs). Returns
/// where the first frame that is not valid starts: every frame before it has the right
/// header_size, the format's VTag and (now) the right CRCs.
fn repair_crcs(fmt: &FrameFormat, stream: &mut [u8]) -> usize {
    let mut at = 0;
    let mut valid_end = 0;
    let mut valid = true;
    while let Some(head) = stream.get(at..at + 7) {
        let h = if head[6] & 0x80 != 0 { 14 } else { 18 };
        if usize::from(u16::from_be_bytes([head[0], head[1]])) != h {
            break;
        }
        let vtag_ok = u16::from_be_bytes([head[4], head[5]]) == fmt.vtag;
        let payload = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let hc = if fmt.header_crc { 4 } else { 0 };
        let pc = if fmt.payload_crc { 4 } else { 0 };
        let end = at + 6 + h + hc + payload + pc;
        if end > stream.len() {
            break;
        }
        let header_end = at + 6 + h;
        if fmt.header_crc {
            let crc = crc32c(&stream[at..header_end]);
            stream[header_end..header_end + 4].copy_from_slice(&crc.to_le_bytes());
        }
        if fmt.payload_crc {
            let from = header_end + hc;
            let crc = crc32c(&stream[from..from + payload]);
            stream[end - 4..end].copy_from_slice(&crc.to_le_bytes());
        }
        at = end;
        valid &= vtag_ok;
        if valid {
            valid_end = end;
        }
    }
    valid_end
}

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
    let mut stream = input.rest().to_vec();
    // With repair: the frames before this offset are valid and must all be handed out.
    let valid_end = if f & 8 != 0 {
        repair_crcs(&fmt, &mut stream)
    } else {
        0
    };
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
            enc.encode(&ulpdu, &mut again)
                .expect("a decoded frame encodes");
        });
        assert!(dec.buffered() <= MAX_FRAME_LEN);
        // Unchecked CRCs come back recomputed: then only the lengths must agree.
        let exact = fmt.verify || !(fmt.header_crc || fmt.payload_crc);
        if let Err(e) = res {
            assert!(
                again.len() >= valid_end,
                "refused a valid frame before offset {valid_end}: {e:?}"
            );
            assert_eq!(dec.feed(piece, |_| {}), Err(e), "error not repeated");
            if exact {
                assert_eq!(
                    again[..],
                    stream[..again.len()],
                    "frames before the error changed"
                );
            }
            return;
        }
        if !exact {
            assert!(again.len() <= at + piece.len());
        } else {
            assert_eq!(
                again[..],
                stream[..again.len()],
                "frames do not re-encode to the stream"
            );
            assert_eq!(
                again.len() + dec.buffered(),
                at + piece.len(),
                "octets skipped"
            );
        }
        at += piece.len();
        if at >= stream.len() {
            return;
        }
    }
});
