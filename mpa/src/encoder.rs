//! The transmit side of Full Operation: ULPDUs in, FPDUs out (RFC 5044 sections 4.1 to 4.4).

use crate::crc::Crc32c;
use crate::wire::{
    fpdu_len, pad_len, MarkerPtr, CRC_LEN, MARKER_INTERVAL, MARKER_LEN, MAX_ULPDU_LEN,
};
use crate::MpaError;

/// Builds FPDUs for one direction of a connection in Full Operation.
///
/// It tracks the stream position relative to SeqStart (the first octet after this direction's
/// Request or Reply frame) so that, with Markers on, a Marker starts every 512 octets
/// (RFC 5044 section 4.3): the very first octets of the stream are the Marker `00000000`, every
/// Marker inside an FPDU points back to that FPDU's ULPDU_Length field, and a Marker falling
/// exactly between two FPDUs holds 0 and belongs to (is covered by the CRC of) the next one.
///
/// The CRC (RFC 5044 section 4.4) is computed incrementally over exactly the emitted octets it
/// covers: a leading FPDUPTR-0 Marker, ULPDU_Length, the ULPDU, any Markers inside, the PAD and
/// a Marker directly after the PAD. Markers that fall inside the CRC field are not covered.
/// With CRCs off the CRC field is sent as zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FpduEncoder {
    crc: bool,
    markers: bool,
    position: u32,
}

/// Where emitted octets go: a growable vector or a fixed slice.
trait FpduSink {
    fn put(&mut self, bytes: &[u8]);
}

impl FpduSink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A caller's function taking the octets in order.
struct FnSink<'a>(&'a mut dyn FnMut(&[u8]));

impl FpduSink for FnSink<'_> {
    fn put(&mut self, bytes: &[u8]) {
        (self.0)(bytes)
    }
}

/// A slice being filled from the front. Its length is checked against the FPDU's wire length
/// before encoding starts, so `put` never runs out of room; if it did, the octets would be
/// dropped rather than panic.
struct SliceSink<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl FpduSink for SliceSink<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if let Some(dst) = self.buf.get_mut(self.len..end) {
            dst.copy_from_slice(bytes);
            self.len = end;
        }
    }
}

/// Writes the octets of one FPDU, inserting Markers and feeding the CRC.
struct FpduWriter<'s, S: FpduSink> {
    sink: &'s mut S,
    markers: bool,
    position: u32,
    header_position: u32,
    crc: Option<Crc32c>,
}

impl<S: FpduSink> FpduWriter<'_, S> {
    fn at_marker(&self) -> bool {
        self.markers && self.position.is_multiple_of(MARKER_INTERVAL as u32)
    }

    fn emit_marker(&mut self, marker: MarkerPtr, covered: bool) {
        let bytes = marker.to_bytes();
        if covered {
            if let Some(crc) = self.crc.as_mut() {
                crc.update(&bytes);
            }
        }
        self.sink.put(&bytes);
        self.position = self.position.wrapping_add(MARKER_LEN as u32);
    }

    /// A Marker inside the current FPDU: it points back to the ULPDU_Length field. The
    /// distance was checked to fit in 16 bits before writing started.
    fn emit_inner_marker(&mut self, covered: bool) {
        let distance = self.position.wrapping_sub(self.header_position);
        self.emit_marker(MarkerPtr::new(distance as u16), covered);
    }

    /// Writes FPDU octets, inserting a Marker before any octet that falls on a Marker position.
    fn write(&mut self, mut bytes: &[u8], covered: bool) {
        while !bytes.is_empty() {
            let run = if self.markers {
                if self.at_marker() {
                    self.emit_inner_marker(covered);
                }
                let into_interval = (self.position % MARKER_INTERVAL as u32) as usize;
                (MARKER_INTERVAL - into_interval).min(bytes.len())
            } else {
                bytes.len()
            };
            let (chunk, rest) = bytes.split_at(run);
            if covered {
                if let Some(crc) = self.crc.as_mut() {
                    crc.update(chunk);
                }
            }
            self.sink.put(chunk);
            self.position = self.position.wrapping_add(run as u32);
            bytes = rest;
        }
    }
}

/// Result of laying out one FPDU at a stream position.
struct Layout {
    /// Octets on the wire, Markers included.
    wire_len: usize,
    /// Largest distance from the ULPDU_Length field to a Marker inside the FPDU.
    max_marker_distance: usize,
}

impl FpduEncoder {
    /// An encoder at SeqStart (stream position 0). `crc`: whether CRCs are in use (negotiated);
    /// `markers`: whether the peer asked for Markers (RFC 5044 section 7.1.1 "M").
    pub fn new(crc: bool, markers: bool) -> FpduEncoder {
        FpduEncoder::with_position(crc, markers, 0)
    }

    /// An encoder whose next octet is at stream position `position` relative to SeqStart
    /// (modulo 2^32), for example 0x1ec for RFC 5044 Figure 6. FPDUs are multiples of four
    /// octets, so in a real stream the position is always a multiple of four; with Markers on,
    /// other positions give FPDUPTRs a receiver cannot follow.
    pub fn with_position(crc: bool, markers: bool, position: u32) -> FpduEncoder {
        FpduEncoder {
            crc,
            markers,
            position,
        }
    }

    /// Stream position of the next octet, relative to SeqStart, modulo 2^32.
    pub fn position(&self) -> u32 {
        self.position
    }

    /// Whether a real CRC is sent.
    pub fn crc_enabled(&self) -> bool {
        self.crc
    }

    /// Whether Markers are inserted.
    pub fn markers_enabled(&self) -> bool {
        self.markers
    }

    fn layout(&self, ulpdu_len: usize) -> Layout {
        let fpdu = fpdu_len(ulpdu_len);
        if !self.markers {
            return Layout {
                wire_len: fpdu,
                max_marker_distance: 0,
            };
        }
        let interval = MARKER_INTERVAL as u64;
        let mut position = u64::from(self.position);
        let mut wire_len = 0;
        if position % interval == 0 {
            position += MARKER_LEN as u64;
            wire_len += MARKER_LEN;
        }
        let header_position = position;
        let mut max_marker_distance = 0;
        let mut remaining = fpdu;
        while remaining > 0 {
            if position % interval == 0 {
                max_marker_distance = (position - header_position) as usize;
                position += MARKER_LEN as u64;
                wire_len += MARKER_LEN;
            }
            let room = (interval - position % interval) as usize;
            let run = room.min(remaining);
            position += run as u64;
            wire_len += run;
            remaining -= run;
        }
        Layout {
            wire_len,
            max_marker_distance,
        }
    }

    /// Octets the next FPDU would take on the wire for a ULPDU of `ulpdu_len` octets, at the
    /// current position: header, ULPDU, PAD, CRC and any Markers (RFC 5044 sections 4.1, 4.3).
    #[inline]
    pub fn wire_len(&self, ulpdu_len: usize) -> usize {
        self.layout(ulpdu_len).wire_len
    }

    fn check(&self, ulpdu_len: usize) -> Result<usize, MpaError> {
        if ulpdu_len > MAX_ULPDU_LEN {
            return Err(MpaError::UlpduTooLong { len: ulpdu_len });
        }
        let layout = self.layout(ulpdu_len);
        if layout.max_marker_distance > usize::from(u16::MAX) {
            return Err(MpaError::UlpduTooLong { len: ulpdu_len });
        }
        Ok(layout.wire_len)
    }

    fn encode_to<S: FpduSink>(&mut self, header: &[u8], payload: &[u8], sink: &mut S) {
        let ulpdu_len = header.len() + payload.len();
        let mut writer = FpduWriter {
            sink,
            markers: self.markers,
            position: self.position,
            header_position: self.position,
            crc: self.crc.then(Crc32c::new),
        };
        if writer.at_marker() {
            // RFC 5044 4.3: a Marker between FPDUs holds 0 and belongs to the next FPDU, whose
            // CRC covers it (4.4 rule 2).
            writer.emit_marker(MarkerPtr::BETWEEN_FPDUS, true);
        }
        writer.header_position = writer.position;
        // ulpdu_len <= 65535 was checked by the caller.
        writer.write(&(ulpdu_len as u16).to_be_bytes(), true);
        writer.write(header, true);
        writer.write(payload, true);
        const PAD: [u8; 3] = [0; 3];
        writer.write(&PAD[..pad_len(ulpdu_len)], true);
        if writer.at_marker() {
            // RFC 5044 4.4 rule 1: a Marker immediately after the PAD is covered by this CRC.
            writer.emit_inner_marker(true);
        }
        let crc = writer.crc.map_or(0, |crc| crc.finalize());
        // Markers inside the CRC field are not covered (they follow the last PAD octet).
        writer.write(&crc.to_le_bytes()[..CRC_LEN], false);
        self.position = writer.position;
    }

    /// Appends the FPDU carrying `ulpdu` (one DDP segment) to `out` and returns the octets
    /// appended. Fails for a ULPDU that does not fit one FPDU.
    pub fn encode(&mut self, ulpdu: &[u8], out: &mut Vec<u8>) -> Result<usize, MpaError> {
        self.encode_parts(ulpdu, &[], out)
    }

    /// Appends the FPDU whose ULPDU is `header` followed by `payload`, without first joining
    /// them, and returns the octets appended.
    pub fn encode_parts(
        &mut self,
        header: &[u8],
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<usize, MpaError> {
        let wire_len = self.check(header.len() + payload.len())?;
        out.reserve(wire_len);
        self.encode_to(header, payload, out);
        Ok(wire_len)
    }

    /// Hands the FPDU whose ULPDU is `header` followed by `payload` to `put`, in pieces and in
    /// order (for example straight into a transmit buffer), and returns the octets handed.
    /// Fails, handing nothing, for a ULPDU that does not fit one FPDU.
    pub fn encode_with(
        &mut self,
        header: &[u8],
        payload: &[u8],
        put: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, MpaError> {
        let wire_len = self.check(header.len() + payload.len())?;
        self.encode_to(header, payload, &mut FnSink(put));
        Ok(wire_len)
    }

    /// Writes the FPDU whose ULPDU is `header` followed by `payload` to the start of `out`
    /// (for example straight into a frame buffer) and returns the octets written. A buffer
    /// shorter than [`FpduEncoder::wire_len`] is an error and nothing is written.
    pub fn encode_into(
        &mut self,
        header: &[u8],
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<usize, MpaError> {
        let wire_len = self.check(header.len() + payload.len())?;
        let available = out.len();
        let buf = out.get_mut(..wire_len).ok_or(MpaError::BufferTooSmall {
            needed: wire_len,
            available,
        })?;
        let mut sink = SliceSink { buf, len: 0 };
        self.encode_to(header, payload, &mut sink);
        Ok(sink.len)
    }
}
