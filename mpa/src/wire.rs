//! MPA wire formats (RFC 5044 sections 4.1 to 4.3 and 7.1.1, RFC 6581 sections 6 and 9).
//!
//! In the style of smoltcp's `wire` module: [`MpaFrame`] is a checked view over the octets of
//! a Request/Reply frame, [`MpaFrameRepr`] its parsed form with `parse` and `emit`. FPDU framing
//! is small enough to be plain helpers ([`FpduHeader`], [`pad_len`], [`MarkerPtr`]).
//!
//! All fields are big-endian, except the FPDU CRC, which is sent least significant octet first
//! (RFC 5044 section 4.4 and its Figure 5, `IWARP-WIRE.md` 1.2).

use crate::MpaError;

/// Length of the FPDU header, the ULPDU_Length field (RFC 5044 section 4.1).
pub const FPDU_HEADER_LEN: usize = 2;
/// Length of the CRC field that ends every FPDU (RFC 5044 section 4.1).
pub const CRC_LEN: usize = 4;
/// Length of a Marker (RFC 5044 section 4.2).
pub const MARKER_LEN: usize = 4;
/// Markers are placed every 512 octets of the stream, counted from SeqStart (RFC 5044
/// section 4.3).
pub const MARKER_INTERVAL: usize = 512;
/// The largest ULPDU_Length the 16-bit field can express (RFC 5044 section 4.1).
pub const MAX_ULPDU_LEN: usize = u16::MAX as usize;
/// Length of the fixed part of a Request/Reply frame: Key, flags, Rev, PD_Length (RFC 5044
/// section 7.1.1).
pub const FRAME_HEADER_LEN: usize = 20;
/// Length of the Key that starts a Request/Reply frame.
pub const KEY_LEN: usize = 16;
/// The most private data a Request/Reply frame may carry, the RFC 6581 block included (RFC 5044
/// section 7.1.1, RFC 6581 section 7).
pub const MAX_PRIVATE_DATA: usize = 512;
/// Length of the RFC 6581 enhanced connection establishment block (section 9).
pub const ENHANCED_PARAMS_LEN: usize = 4;
/// The Request Key, "MPA ID Req Frame" (RFC 5044 section 7.1.1).
pub const REQUEST_KEY: [u8; KEY_LEN] = *b"MPA ID Req Frame";
/// The Reply Key, "MPA ID Rep Frame" (RFC 5044 section 7.1.1).
pub const REPLY_KEY: [u8; KEY_LEN] = *b"MPA ID Rep Frame";

/// M: the sender requires Markers in the FPDUs it receives (RFC 5044 section 7.1.1).
pub const FLAG_MARKERS: u8 = 0x80;
/// C: the sender prefers CRCs (RFC 5044 section 7.1.1).
pub const FLAG_CRC: u8 = 0x40;
/// R: in a Reply, the connection is rejected (RFC 5044 section 7.1.1).
pub const FLAG_REJECT: u8 = 0x20;
/// S: the private data starts with the enhanced connection establishment block (RFC 6581
/// section 6).
pub const FLAG_ENHANCED: u8 = 0x10;

/// IRD/ORD value meaning "do not negotiate automatically" (RFC 6581 section 9.1).
pub const IRD_ORD_NO_NEGOTIATION: u16 = 0x3FFF;

/// Number of PAD octets after a ULPDU of `ulpdu_len` octets, so that ULPDU_Length, ULPDU and
/// PAD together are a multiple of four octets (RFC 5044 section 4.1).
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (ulpdu_len + FPDU_HEADER_LEN) % 4) % 4
}

/// Octets of an FPDU carrying `ulpdu_len` octets, not counting Markers: header, ULPDU, PAD and
/// CRC (RFC 5044 section 4.1).
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    FPDU_HEADER_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// The FPDU header: the ULPDU_Length field (RFC 5044 section 4.1). It counts the ULPDU octets
/// only, not itself, the PAD, the CRC or Markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FpduHeader {
    /// Octets of the ULPDU (the DDP segment) in this FPDU.
    pub ulpdu_len: u16,
}

impl FpduHeader {
    /// Reads the header from the first two octets of `bytes`; `None` when fewer are given.
    pub fn parse(bytes: &[u8]) -> Option<FpduHeader> {
        match bytes {
            [hi, lo, ..] => Some(FpduHeader {
                ulpdu_len: u16::from_be_bytes([*hi, *lo]),
            }),
            _ => None,
        }
    }

    /// The two header octets.
    pub fn to_bytes(self) -> [u8; FPDU_HEADER_LEN] {
        self.ulpdu_len.to_be_bytes()
    }

    /// Number of PAD octets that follow the ULPDU.
    pub fn pad_len(self) -> usize {
        pad_len(usize::from(self.ulpdu_len))
    }

    /// Octets of the whole FPDU, Markers not counted.
    pub fn fpdu_len(self) -> usize {
        fpdu_len(usize::from(self.ulpdu_len))
    }
}

/// A Marker: a reserved 16-bit field (sent as zero, ignored, but CRC-covered) and the 16-bit
/// FPDUPTR (RFC 5044 sections 4.2 and 4.3).
///
/// FPDUPTR is the distance from the first octet of the FPDU's ULPDU_Length field back to the
/// Marker's first octet. The value 0 means the Marker lies between two FPDUs and belongs to
/// the following one. The low two bits are sent as zero and treated as zero on receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkerPtr {
    fpduptr: u16,
}

impl MarkerPtr {
    /// The Marker placed between FPDUs (FPDUPTR 0): an FPDU header follows it immediately.
    pub const BETWEEN_FPDUS: MarkerPtr = MarkerPtr { fpduptr: 0 };

    /// A Marker pointing `fpduptr` octets back to its FPDU's header. The low two bits are
    /// cleared, as the transmitter must send them as zero.
    pub const fn new(fpduptr: u16) -> MarkerPtr {
        MarkerPtr {
            fpduptr: fpduptr & !3,
        }
    }

    /// Reads a Marker; RESERVED is ignored and the low two bits of FPDUPTR are treated as zero.
    pub const fn from_bytes(bytes: [u8; MARKER_LEN]) -> MarkerPtr {
        MarkerPtr::new(u16::from_be_bytes([bytes[2], bytes[3]]))
    }

    /// The four octets of the Marker: RESERVED zero, then FPDUPTR.
    pub const fn to_bytes(self) -> [u8; MARKER_LEN] {
        let [hi, lo] = self.fpduptr.to_be_bytes();
        [0, 0, hi, lo]
    }

    /// The FPDUPTR value.
    pub const fn fpduptr(self) -> u16 {
        self.fpduptr
    }

    /// True for FPDUPTR 0: the Marker lies between FPDUs and belongs to the next one.
    pub const fn is_between_fpdus(self) -> bool {
        self.fpduptr == 0
    }

    /// The TCP sequence number of the ULPDU_Length field this Marker points to, given the
    /// sequence number of the Marker's first octet; the subtraction wraps modulo 2^32 (RFC 5044
    /// section 4.3). For FPDUPTR 0 the header follows the Marker instead.
    pub const fn header_seq(self, marker_seq: u32) -> u32 {
        if self.is_between_fpdus() {
            marker_seq.wrapping_add(MARKER_LEN as u32)
        } else {
            marker_seq.wrapping_sub(self.fpduptr as u32)
        }
    }
}

/// True when a Marker starts at TCP sequence number `seq` in a stream whose first Marker is at
/// `seq_start`: `(seq - seq_start) mod 512 == 0`, with 32-bit wrap (RFC 5044 section 4.3).
pub const fn is_marker_seq(seq_start: u32, seq: u32) -> bool {
    seq.wrapping_sub(seq_start)
        .is_multiple_of(MARKER_INTERVAL as u32)
}

/// The sequence numbers at which Markers start among the `len` octets beginning at `from_seq`,
/// for a Full Operation stream starting at `seq_start` (RFC 5044 section 4.3). Works across the
/// 32-bit sequence wrap: `marker_positions(0xFFFF_FF00, 0xFFFF_FF00, 1024)` yields
/// `0xFFFF_FF00`, `0x100`.
pub fn marker_positions(seq_start: u32, from_seq: u32, len: u32) -> impl Iterator<Item = u32> {
    let interval = MARKER_INTERVAL as u32;
    let into_interval = from_seq.wrapping_sub(seq_start) % interval;
    let first_offset = (interval - into_interval) % interval;
    (first_offset..len)
        .step_by(MARKER_INTERVAL)
        .map(move |offset| from_seq.wrapping_add(offset))
}

/// Which of the two startup frames (RFC 5044 section 7.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// The MPA Request Frame, sent by the Initiator.
    Request,
    /// The MPA Reply Frame, sent by the Responder.
    Reply,
}

impl FrameKind {
    /// The 16-octet Key that identifies this frame kind.
    pub const fn key(self) -> &'static [u8; KEY_LEN] {
        match self {
            FrameKind::Request => &REQUEST_KEY,
            FrameKind::Reply => &REPLY_KEY,
        }
    }
}

/// The RFC 6581 section 9 enhanced connection establishment block: the first four octets of
/// the private data when S=1.
///
/// Word 0: A (0x8000, peer-to-peer), B (0x4000, zero-length Send RTR), IRD (0x3FFF).
/// Word 1: C (0x8000, zero-length Write RTR), D (0x4000, zero-length Read RTR), ORD (0x3FFF).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EnhancedParams {
    /// Inbound RDMA Read Queue Depth, 14 bits; 0x3FFF means "do not negotiate".
    pub ird: u16,
    /// Outbound RDMA Read Queue Depth, 14 bits; 0x3FFF means "do not negotiate".
    pub ord: u16,
    /// A: peer-to-peer connection model (an RTR indication is used).
    pub peer_to_peer: bool,
    /// B: zero-length Send as RTR indication.
    pub rtr_send: bool,
    /// C: zero-length RDMA Write as RTR indication.
    pub rtr_write: bool,
    /// D: zero-length RDMA Read as RTR indication.
    pub rtr_read: bool,
}

impl EnhancedParams {
    const FLAG_HIGH: u16 = 0x8000;
    const FLAG_LOW: u16 = 0x4000;
    const DEPTH_MASK: u16 = 0x3FFF;

    /// Reads the block. IRD and ORD are the low 14 bits of their words.
    pub const fn from_bytes(bytes: [u8; ENHANCED_PARAMS_LEN]) -> EnhancedParams {
        let word0 = u16::from_be_bytes([bytes[0], bytes[1]]);
        let word1 = u16::from_be_bytes([bytes[2], bytes[3]]);
        EnhancedParams {
            ird: word0 & Self::DEPTH_MASK,
            ord: word1 & Self::DEPTH_MASK,
            peer_to_peer: word0 & Self::FLAG_HIGH != 0,
            rtr_send: word0 & Self::FLAG_LOW != 0,
            rtr_write: word1 & Self::FLAG_HIGH != 0,
            rtr_read: word1 & Self::FLAG_LOW != 0,
        }
    }

    /// The four octets of the block, network byte order. IRD and ORD are truncated to 14 bits.
    pub const fn to_bytes(self) -> [u8; ENHANCED_PARAMS_LEN] {
        let mut word0 = self.ird & Self::DEPTH_MASK;
        if self.peer_to_peer {
            word0 |= Self::FLAG_HIGH;
        }
        if self.rtr_send {
            word0 |= Self::FLAG_LOW;
        }
        let mut word1 = self.ord & Self::DEPTH_MASK;
        if self.rtr_write {
            word1 |= Self::FLAG_HIGH;
        }
        if self.rtr_read {
            word1 |= Self::FLAG_LOW;
        }
        let [a, b] = word0.to_be_bytes();
        let [c, d] = word1.to_be_bytes();
        [a, b, c, d]
    }
}

/// A checked view over the octets of an MPA Request or Reply frame (RFC 5044 section 7.1.1,
/// RFC 6581 section 6). The buffer may be longer than the frame; [`MpaFrame::frame_len`] tells
/// where the frame ends.
#[derive(Debug, Clone)]
pub struct MpaFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> MpaFrame<T> {
    /// Wraps `buffer` after checking that it holds the 20-octet fixed part and all PD_Length
    /// octets of private data.
    pub fn new_checked(buffer: T) -> Result<MpaFrame<T>, MpaError> {
        let frame = MpaFrame { buffer };
        frame.check_len()?;
        Ok(frame)
    }

    /// Checks that the buffer holds the whole frame.
    pub fn check_len(&self) -> Result<(), MpaError> {
        let len = self.buffer.as_ref().len();
        if len < FRAME_HEADER_LEN {
            return Err(MpaError::InvalidFrame(
                "shorter than the 20-octet frame header",
            ));
        }
        if len < self.frame_len() {
            return Err(MpaError::InvalidFrame(
                "private data shorter than PD_Length",
            ));
        }
        Ok(())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn octet(&self, index: usize) -> u8 {
        self.buffer.as_ref().get(index).copied().unwrap_or(0)
    }

    /// The 16-octet Key.
    pub fn key(&self) -> &[u8] {
        self.buffer.as_ref().get(..KEY_LEN).unwrap_or(&[])
    }

    /// Request or Reply according to the Key; `None` for any other Key.
    pub fn kind(&self) -> Option<FrameKind> {
        let key = self.key();
        if key == REQUEST_KEY {
            Some(FrameKind::Request)
        } else if key == REPLY_KEY {
            Some(FrameKind::Reply)
        } else {
            None
        }
    }

    /// The flags octet: M, C, R, S and the reserved bits.
    pub fn flags(&self) -> u8 {
        self.octet(KEY_LEN)
    }

    /// M: Markers are required in the FPDUs sent to this frame's sender.
    pub fn markers(&self) -> bool {
        self.flags() & FLAG_MARKERS != 0
    }

    /// C: CRCs preferred by this frame's sender.
    pub fn crc(&self) -> bool {
        self.flags() & FLAG_CRC != 0
    }

    /// R: rejected (meaningful in a Reply only).
    pub fn reject(&self) -> bool {
        self.flags() & FLAG_REJECT != 0
    }

    /// S: the private data starts with the RFC 6581 block.
    pub fn enhanced(&self) -> bool {
        self.flags() & FLAG_ENHANCED != 0
    }

    /// Rev.
    pub fn rev(&self) -> u8 {
        self.octet(KEY_LEN + 1)
    }

    /// PD_Length: all private data octets, the RFC 6581 block included.
    pub fn pd_length(&self) -> u16 {
        u16::from_be_bytes([self.octet(KEY_LEN + 2), self.octet(KEY_LEN + 3)])
    }

    /// Octets of the whole frame: 20 plus PD_Length.
    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_LEN + usize::from(self.pd_length())
    }

    /// All private data octets (the RFC 6581 block included).
    pub fn private_data(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(FRAME_HEADER_LEN..self.frame_len())
            .unwrap_or(&[])
    }
}

/// A parsed MPA Request or Reply frame (RFC 5044 section 7.1.1, RFC 6581 sections 6 and 9).
///
/// `enhanced` is `Some` exactly when S=1; `private_data` is the ULP's private data, after the
/// block. Res bits are sent as zero and ignored on receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpaFrameRepr<'a> {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M bit.
    pub markers: bool,
    /// C bit.
    pub crc: bool,
    /// R bit.
    pub reject: bool,
    /// Rev.
    pub rev: u8,
    /// The RFC 6581 block (S=1).
    pub enhanced: Option<EnhancedParams>,
    /// ULP private data (after the RFC 6581 block if present).
    pub private_data: &'a [u8],
}

impl<'a> MpaFrameRepr<'a> {
    /// Parses a frame view. Checks the Key, PD_Length against the 512-octet limit, and that S=1
    /// comes with room for the 4-octet block (with Rev at least 2: below, S is a reserved bit
    /// and ignored). Rev itself is not judged here;
    /// that is the startup logic's business (RFC 5044 section 7.1.1 "Rev").
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        frame: &MpaFrame<&'a T>,
    ) -> Result<MpaFrameRepr<'a>, MpaError> {
        frame.check_len()?;
        let kind = frame.kind().ok_or(MpaError::InvalidKey)?;
        let pd_len = usize::from(frame.pd_length());
        if pd_len > MAX_PRIVATE_DATA {
            return Err(MpaError::PrivateDataTooLong {
                len: pd_len,
                max: MAX_PRIVATE_DATA,
            });
        }
        let all_private_data = frame
            .buffer
            .as_ref()
            .get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + pd_len)
            .ok_or(MpaError::InvalidFrame(
                "private data shorter than PD_Length",
            ))?;
        // Below Rev 2 the S bit is one of RFC 5044's Res bits, "not checked on reception"
        // (7.1.1; RFC 6581 6 counts on that for backward compatibility): no block.
        let (enhanced, private_data) = if frame.enhanced() && frame.rev() >= 2 {
            match all_private_data.split_first_chunk::<ENHANCED_PARAMS_LEN>() {
                Some((block, rest)) => (Some(EnhancedParams::from_bytes(*block)), rest),
                None => {
                    return Err(MpaError::InvalidFrame(
                        "S=1 but PD_Length is too short for the IRD/ORD block",
                    ))
                }
            }
        } else {
            (None, all_private_data)
        };
        Ok(MpaFrameRepr {
            kind,
            markers: frame.markers(),
            crc: frame.crc(),
            reject: frame.reject(),
            rev: frame.rev(),
            enhanced,
            private_data,
        })
    }

    /// Parses the frame at the start of `bytes` (which may continue past it).
    pub fn parse_bytes(bytes: &'a [u8]) -> Result<MpaFrameRepr<'a>, MpaError> {
        MpaFrameRepr::parse(&MpaFrame::new_checked(bytes)?)
    }

    /// PD_Length of this frame: the ULP private data plus the block if present.
    pub fn pd_length(&self) -> usize {
        let block = if self.enhanced.is_some() {
            ENHANCED_PARAMS_LEN
        } else {
            0
        };
        block + self.private_data.len()
    }

    /// Octets the emitted frame takes.
    pub fn buffer_len(&self) -> usize {
        FRAME_HEADER_LEN + self.pd_length()
    }

    /// Writes the frame into the start of `out` and returns its length. Fails (locally) when
    /// the private data exceeds 512 octets with the block, or when `out` is too short.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, MpaError> {
        let pd_len = self.pd_length();
        if pd_len > MAX_PRIVATE_DATA {
            return Err(MpaError::Local(
                "private data to send exceeds 512 octets (RFC 5044 7.1.1)",
            ));
        }
        let len = self.buffer_len();
        let available = out.len();
        let frame = out.get_mut(..len).ok_or(MpaError::BufferTooSmall {
            needed: len,
            available,
        })?;
        let (key, rest) = frame.split_at_mut(KEY_LEN);
        key.copy_from_slice(self.kind.key());
        let (fixed, private_data) = rest.split_at_mut(FRAME_HEADER_LEN - KEY_LEN);
        let mut flags = 0;
        if self.markers {
            flags |= FLAG_MARKERS;
        }
        if self.crc {
            flags |= FLAG_CRC;
        }
        if self.reject {
            flags |= FLAG_REJECT;
        }
        if self.enhanced.is_some() {
            flags |= FLAG_ENHANCED;
        }
        // pd_len <= 512 was checked above, so it fits in 16 bits.
        let [pd_hi, pd_lo] = (pd_len as u16).to_be_bytes();
        fixed.copy_from_slice(&[flags, self.rev, pd_hi, pd_lo]);
        let ulp_data = match self.enhanced {
            Some(params) => {
                let (block, ulp_data) = private_data.split_at_mut(ENHANCED_PARAMS_LEN);
                block.copy_from_slice(&params.to_bytes());
                ulp_data
            }
            None => private_data,
        };
        ulp_data.copy_from_slice(self.private_data);
        Ok(len)
    }

    /// The emitted frame in a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>, MpaError> {
        let mut out = vec![0; self.buffer_len()];
        self.emit(&mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    #[test]
    fn pad_makes_header_ulpdu_pad_a_multiple_of_four() {
        assert_eq!(pad_len(42), 0);
        assert_eq!(pad_len(0), 2);
        assert_eq!(pad_len(1), 1);
        assert_eq!(pad_len(2), 0);
        assert_eq!(pad_len(3), 3);
        for len in 0..100 {
            assert_eq!((FPDU_HEADER_LEN + len + pad_len(len)) % 4, 0);
            assert!(pad_len(len) < 4);
        }
        assert_eq!(fpdu_len(42), 48);
        assert_eq!(FpduHeader { ulpdu_len: 16 }.fpdu_len(), 24);
    }

    #[test]
    fn fpdu_header_round_trip() {
        let header = FpduHeader::parse(&[0x00, 0x2a, 0x41]).unwrap();
        assert_eq!(header.ulpdu_len, 42);
        assert_eq!(header.to_bytes(), [0x00, 0x2a]);
        assert_eq!(FpduHeader::parse(&[0x00]), None);
    }

    #[test]
    fn marker_from_rfc5044_figure_6() {
        let marker = MarkerPtr::from_bytes([0x00, 0x00, 0x00, 0x14]);
        assert_eq!(marker.fpduptr(), 0x14);
        assert!(!marker.is_between_fpdus());
        assert_eq!(marker.header_seq(0x200), 0x1ec);
        assert_eq!(marker.to_bytes(), [0, 0, 0, 0x14]);
    }

    #[test]
    fn marker_ignores_reserved_and_low_bits() {
        let marker = MarkerPtr::from_bytes([0xAB, 0xCD, 0x01, 0x17]);
        assert_eq!(marker.fpduptr(), 0x114);
        assert_eq!(marker.to_bytes(), [0, 0, 0x01, 0x14]);
        assert_eq!(MarkerPtr::new(0x0003), MarkerPtr::BETWEEN_FPDUS);
    }

    #[test]
    fn marker_between_fpdus_points_forward() {
        let marker = MarkerPtr::from_bytes([0, 0, 0, 0]);
        assert!(marker.is_between_fpdus());
        assert_eq!(marker.header_seq(11), 15);
        assert_eq!(marker.header_seq(0xFFFF_FFFE), 2);
    }

    #[test]
    fn marker_pointer_wraps_sequence_space() {
        // Header at 0xFFFF_FFF0, Marker 0x20 octets later at 0x10 after the wrap.
        assert_eq!(MarkerPtr::new(0x20).header_seq(0x10), 0xFFFF_FFF0);
    }

    #[test]
    fn marker_positions_follow_rfc_example() {
        // RFC 5044 4.3: started at sequence number 11, Markers at 11, 523, 1035.
        let positions: Vec<u32> = marker_positions(11, 11, 1100).collect();
        assert_eq!(positions, [11, 523, 1035]);
        let positions: Vec<u32> = marker_positions(11, 12, 1100).collect();
        assert_eq!(positions, [523, 1035]);
        assert!(is_marker_seq(11, 1035));
        assert!(!is_marker_seq(11, 1036));
    }

    #[test]
    fn marker_positions_across_sequence_wrap() {
        let seq_start = 0xFFFF_FE00u32 + 0x10; // SeqStart 0xFFFF_FE10
        let positions: Vec<u32> = marker_positions(seq_start, 0xFFFF_FF00, 2048).collect();
        // 0xFFFF_FE10 + 512 = 0x0000_0010 (wrapped), then 0x210, 0x410, 0x610.
        assert_eq!(positions, [0x10, 0x210, 0x410, 0x610]);
        for position in positions {
            assert_eq!(position.wrapping_sub(seq_start) % 512, 0);
            assert!(is_marker_seq(seq_start, position));
        }
        let positions: Vec<u32> = marker_positions(0xFFFF_FF00, 0xFFFF_FF00, 1024).collect();
        assert_eq!(positions, [0xFFFF_FF00, 0x100]);
        // From 6, the next Marker is at 517, the 512th octet.
        assert_eq!(marker_positions(5, 6, 512).collect::<Vec<_>>(), [517]);
        assert_eq!(marker_positions(5, 6, 511).count(), 0);
    }

    #[test]
    fn enhanced_params_bits() {
        let params = EnhancedParams::from_bytes([0xC0, 0x10, 0x40, 0x20]);
        assert_eq!(
            params,
            EnhancedParams {
                ird: 0x10,
                ord: 0x20,
                peer_to_peer: true,
                rtr_send: true,
                rtr_write: false,
                rtr_read: true,
            }
        );
        assert_eq!(params.to_bytes(), [0xC0, 0x10, 0x40, 0x20]);
        let all_ones = EnhancedParams::from_bytes([0x3F, 0xFF, 0xBF, 0xFF]);
        assert_eq!(all_ones.ird, IRD_ORD_NO_NEGOTIATION);
        assert_eq!(all_ones.ord, IRD_ORD_NO_NEGOTIATION);
        assert!(all_ones.rtr_write && !all_ones.rtr_read && !all_ones.peer_to_peer);
    }

    #[test]
    fn derived_enhanced_request_vector() {
        // IWARP-WIRE.md 6 "Derived": S=1, Rev 2, IRD=ORD=16, no private data, C=0, M=0.
        let expected = hex("4d504120494420526571204672616d65 10 02 0004 0010 0010");
        let repr = MpaFrameRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: false,
            reject: false,
            rev: 2,
            enhanced: Some(EnhancedParams {
                ird: 16,
                ord: 16,
                ..EnhancedParams::default()
            }),
            private_data: &[],
        };
        assert_eq!(repr.to_vec().unwrap(), expected);
        assert_eq!(MpaFrameRepr::parse_bytes(&expected).unwrap(), repr);
        let with_crc = MpaFrameRepr { crc: true, ..repr };
        let bytes = with_crc.to_vec().unwrap();
        assert_eq!(bytes[16], 0x50);
        assert_eq!(MpaFrameRepr::parse_bytes(&bytes).unwrap(), with_crc);
    }

    /// Below Rev 2 the S bit is a reserved bit (RFC 5044 7.1.1: "not checked on reception"):
    /// a Rev 1 Request with it set parses with no block, its private data whole.
    #[test]
    fn rev1_ignores_the_s_bit() {
        let bytes = hex("4d504120494420526571204672616d65 50 01 0002 6869");
        let repr = MpaFrameRepr::parse_bytes(&bytes).unwrap();
        assert_eq!((repr.rev, repr.crc, repr.enhanced), (1, true, None));
        assert_eq!(repr.private_data, b"hi");
    }

    #[test]
    fn siw_request_parses() {
        // Linux siw as Initiator: S=1, Rev 2, IRD=ORD=1, C=0, M=0.
        let bytes = hex("4d504120494420526571204672616d65 10 02 0004 0001 0001");
        let repr = MpaFrameRepr::parse_bytes(&bytes).unwrap();
        assert_eq!(repr.kind, FrameKind::Request);
        assert_eq!(repr.rev, 2);
        assert!(!repr.crc && !repr.markers && !repr.reject);
        let params = repr.enhanced.unwrap();
        assert_eq!((params.ird, params.ord), (1, 1));
        assert!(repr.private_data.is_empty());
    }

    #[test]
    fn reply_with_private_data_round_trip() {
        let repr = MpaFrameRepr {
            kind: FrameKind::Reply,
            markers: true,
            crc: true,
            reject: true,
            rev: 1,
            enhanced: None,
            private_data: b"no thanks",
        };
        let mut buf = [0xEEu8; 64];
        let len = repr.emit(&mut buf).unwrap();
        assert_eq!(len, 29);
        assert_eq!(&buf[..16], b"MPA ID Rep Frame");
        assert_eq!(&buf[16..20], &[0xE0, 0x01, 0x00, 0x09]);
        let frame = MpaFrame::new_checked(&buf[..]).unwrap();
        assert_eq!(frame.frame_len(), 29);
        assert_eq!(frame.kind(), Some(FrameKind::Reply));
        assert_eq!(frame.private_data(), b"no thanks");
        assert_eq!(MpaFrameRepr::parse(&frame).unwrap(), repr);
    }

    #[test]
    fn reserved_bits_are_not_checked() {
        let mut bytes = hex("4d504120494420526571204672616d65 4f 01 0000");
        let repr = MpaFrameRepr::parse_bytes(&bytes).unwrap();
        assert!(repr.crc && repr.enhanced.is_none());
        bytes[16] = 0x07;
        assert!(MpaFrameRepr::parse_bytes(&bytes).is_ok());
    }

    #[test]
    fn bad_frames_are_rejected() {
        let good = hex("4d504120494420526571204672616d65 00 01 0002 abcd");
        assert!(MpaFrameRepr::parse_bytes(&good).is_ok());
        assert!(matches!(
            MpaFrameRepr::parse_bytes(&good[..21]),
            Err(MpaError::InvalidFrame(_))
        ));
        assert!(matches!(
            MpaFrameRepr::parse_bytes(&good[..19]),
            Err(MpaError::InvalidFrame(_))
        ));
        let mut bad_key = good.clone();
        bad_key[3] = b'!';
        assert_eq!(
            MpaFrameRepr::parse_bytes(&bad_key),
            Err(MpaError::InvalidKey)
        );

        let mut too_long = hex("4d504120494420526571204672616d65 00 01 0201");
        too_long.resize(20 + 0x201, 0);
        assert_eq!(
            MpaFrameRepr::parse_bytes(&too_long),
            Err(MpaError::PrivateDataTooLong { len: 513, max: 512 })
        );
        let s_without_block = hex("4d504120494420526571204672616d65 10 02 0002 0001");
        assert!(matches!(
            MpaFrameRepr::parse_bytes(&s_without_block),
            Err(MpaError::InvalidFrame(_))
        ));
    }

    #[test]
    fn emit_checks_limits() {
        let big = [0u8; 509];
        let repr = MpaFrameRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: true,
            reject: false,
            rev: 2,
            enhanced: Some(EnhancedParams::default()),
            private_data: &big,
        };
        assert!(matches!(repr.to_vec(), Err(MpaError::Local(_))));
        let fits = MpaFrameRepr {
            private_data: &big[..508],
            ..repr
        };
        assert_eq!(fits.to_vec().unwrap().len(), 532);
        let mut small = [0u8; 30];
        assert_eq!(
            fits.emit(&mut small),
            Err(MpaError::BufferTooSmall {
                needed: 532,
                available: 30
            })
        );
    }
}
