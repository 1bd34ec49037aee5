//! RDMAP wire formats (RFC 5040 section 4, and RFC 7306's extensions in [`ext`]).
//!
//! RDMAP has little header of its own: the RDMAP control byte travels in the first
//! RsvdULP octet of the DDP header (4.1), the Invalidate STag in RsvdULP octets 2..5 of
//! untagged segments (4.1, 4.7), and only two messages of RFC 5040 carry an RDMAP header
//! after the DDP header: the RDMA Read Request (4.4, [`ReadRequest`]) and the Terminate
//! (4.8, [`TerminateHeader`]). RFC 7306 adds the Atomic Request and Response headers and
//! the Immediate Data header ([`ext`]). Like smoltcp's `wire` module, each header has a
//! checked view over bytes ([`ReadRequestView`], [`TerminateView`], ...) and a parsed
//! representation with `parse`/`emit`.

pub mod ext;
mod field;
pub use ext::{
    AtomicOp, AtomicRequest, AtomicRequestView, AtomicResponse, AtomicResponseView, ImmediateData,
    ATOMIC_REQUEST_LEN, ATOMIC_RESPONSE_LEN, IMMEDIATE_DATA_LEN,
};
use field::{be_u16, be_u32, be_u64, truncated};

use crate::error::RdmapError;
pub use crate::error::{layer, rdmap_code, rdmap_etype};

/// The RDMAP version of RFC 5040 (RV = 01b, 4.1). Version 0 (RDMA Consortium) is not
/// spoken by this implementation.
pub const RDMAP_VERSION: u8 = 1;

/// Octets of the RDMA Read Request header (4.4, Figure 6).
pub const READ_REQUEST_LEN: usize = 28;

/// Octets of the Terminate Control word plus reserved bits (4.8, Figure 7).
pub const TERMINATE_CONTROL_LEN: usize = 4;

/// Octets of the DDP Segment Length field of the Terminate header (4.8).
pub const TERMINATE_SEGMENT_LEN_LEN: usize = 2;

/// Octets of a tagged DDP header (RFC 5041 4.2).
pub const TAGGED_DDP_HEADER_LEN: usize = ddp::TAGGED_HEADER_LEN;

/// Octets of an untagged DDP header (RFC 5041 4.3).
pub const UNTAGGED_DDP_HEADER_LEN: usize = ddp::UNTAGGED_HEADER_LEN;

/// The largest Terminate header: control, segment length, untagged DDP header and Read
/// Request header.
pub const MAX_TERMINATE_LEN: usize =
    TERMINATE_CONTROL_LEN + TERMINATE_SEGMENT_LEN_LEN + UNTAGGED_DDP_HEADER_LEN + READ_REQUEST_LEN;

/// DDP queue numbers used by RDMAP (RFC 5040 Figure 4, RFC 7306 Figure 2).
pub mod queue {
    /// Send, Send with Invalidate, Send with SE, Send with SE and Invalidate; Immediate
    /// Data and Immediate Data with SE (RFC 7306).
    pub const SEND: u32 = 0;
    /// RDMA Read Request; Atomic Request (RFC 7306 5.2).
    pub const READ_REQUEST: u32 = 1;
    /// Terminate.
    pub const TERMINATE: u32 = 2;
    /// Atomic Response (RFC 7306 5.2, 10.2): only on a stream with the extensions on.
    pub const ATOMIC_RESPONSE: u32 = 3;
}

/// Bits of the RDMAP control byte (4.1, Figure 3).
pub mod control {
    /// RV: RDMAP version.
    pub const VERSION_MASK: u8 = 0xC0;
    /// Shift of the RV field.
    pub const VERSION_SHIFT: u8 = 6;
    /// Reserved, sent as zero, ignored on receive.
    pub const RESERVED_MASK: u8 = 0x30;
    /// OpCode.
    pub const OPCODE_MASK: u8 = 0x0F;
}

/// RDMA message opcodes (RFC 5040 4.1, Figure 4; RFC 7306 4.1, Figure 2). The four of RFC
/// 7306 ([`Opcode::is_extension`]) are parsed here and refused by a queue pair whose
/// extensions are off, as RFC 5040 reserved opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// 0000b RDMA Write (tagged).
    Write = 0,
    /// 0001b RDMA Read Request (untagged, QN 1).
    ReadRequest = 1,
    /// 0010b RDMA Read Response (tagged).
    ReadResponse = 2,
    /// 0011b Send (untagged, QN 0).
    Send = 3,
    /// 0100b Send with Invalidate (untagged, QN 0).
    SendInvalidate = 4,
    /// 0101b Send with Solicited Event (untagged, QN 0).
    SendSe = 5,
    /// 0110b Send with Solicited Event and Invalidate (untagged, QN 0).
    SendSeInvalidate = 6,
    /// 0111b Terminate (untagged, QN 2).
    Terminate = 7,
    /// 1000b Immediate Data (untagged, QN 0; RFC 7306 6).
    ImmediateData = 8,
    /// 1001b Immediate Data with Solicited Event (untagged, QN 0; RFC 7306 6).
    ImmediateDataSe = 9,
    /// 1010b Atomic Request (untagged, QN 1; RFC 7306 5.2.1).
    AtomicRequest = 10,
    /// 1011b Atomic Response (untagged, QN 3; RFC 7306 5.2.2).
    AtomicResponse = 11,
}

impl Opcode {
    /// The opcode for a 4-bit value; `None` for the reserved values 1100b..1111b.
    pub fn from_u8(value: u8) -> Option<Opcode> {
        Some(match value {
            0 => Opcode::Write,
            1 => Opcode::ReadRequest,
            2 => Opcode::ReadResponse,
            3 => Opcode::Send,
            4 => Opcode::SendInvalidate,
            5 => Opcode::SendSe,
            6 => Opcode::SendSeInvalidate,
            7 => Opcode::Terminate,
            8 => Opcode::ImmediateData,
            9 => Opcode::ImmediateDataSe,
            10 => Opcode::AtomicRequest,
            11 => Opcode::AtomicResponse,
            _ => return None,
        })
    }

    /// The Tagged flag this message uses (Figure 4).
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }

    /// The DDP queue number of an untagged message (Figure 4); `None` for tagged ones.
    pub fn queue_number(self) -> Option<u32> {
        match self {
            Opcode::Write | Opcode::ReadResponse => None,
            Opcode::ReadRequest | Opcode::AtomicRequest => Some(queue::READ_REQUEST),
            Opcode::Send
            | Opcode::SendInvalidate
            | Opcode::SendSe
            | Opcode::SendSeInvalidate
            | Opcode::ImmediateData
            | Opcode::ImmediateDataSe => Some(queue::SEND),
            Opcode::Terminate => Some(queue::TERMINATE),
            Opcode::AtomicResponse => Some(queue::ATOMIC_RESPONSE),
        }
    }

    /// True for the four Send message types (5.3).
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::Send | Opcode::SendInvalidate | Opcode::SendSe | Opcode::SendSeInvalidate
        )
    }

    /// True for the opcodes RFC 7306 adds (4.1, Figure 2).
    pub fn is_extension(self) -> bool {
        matches!(
            self,
            Opcode::ImmediateData
                | Opcode::ImmediateDataSe
                | Opcode::AtomicRequest
                | Opcode::AtomicResponse
        )
    }

    /// True for Immediate Data and Immediate Data with SE (RFC 7306 6).
    pub fn is_immediate(self) -> bool {
        matches!(self, Opcode::ImmediateData | Opcode::ImmediateDataSe)
    }

    /// True if the Invalidate STag field is valid for this opcode (4.1, 4.7).
    pub fn carries_invalidate_stag(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
    }

    /// True for Send with Solicited Event (and Invalidate) (4.6, 4.7) and Immediate Data
    /// with SE (RFC 7306 6).
    pub fn is_solicited(self) -> bool {
        matches!(
            self,
            Opcode::SendSe | Opcode::SendSeInvalidate | Opcode::ImmediateDataSe
        )
    }

    /// The Send variant for the given flags.
    pub fn send(solicited: bool, invalidate: bool) -> Opcode {
        match (solicited, invalidate) {
            (false, false) => Opcode::Send,
            (false, true) => Opcode::SendInvalidate,
            (true, false) => Opcode::SendSe,
            (true, true) => Opcode::SendSeInvalidate,
        }
    }
}

/// The RDMAP control byte (4.1, Figure 3): RV in bits 0xC0, reserved 0x30, opcode 0x0F.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmapControl {
    /// The message opcode.
    pub opcode: Opcode,
}

impl RdmapControl {
    /// Parses the control byte. Checks the version first (RFC 5040 7.2 rule 3), then the
    /// opcode (rule 2); reserved bits are ignored. RFC 7306's opcodes are accepted here;
    /// the queue pair refuses them when its extensions are off.
    ///
    /// Errors: [`RdmapError::InvalidVersion`] for RV != 1,
    /// [`RdmapError::UnexpectedOpcode`] for a reserved opcode (1100b..1111b).
    pub fn parse(byte: u8) -> Result<RdmapControl, RdmapError> {
        let version = (byte & control::VERSION_MASK) >> control::VERSION_SHIFT;
        if version != RDMAP_VERSION {
            return Err(RdmapError::InvalidVersion { version });
        }
        let raw = byte & control::OPCODE_MASK;
        let opcode = Opcode::from_u8(raw).ok_or(RdmapError::UnexpectedOpcode { opcode: raw })?;
        Ok(RdmapControl { opcode })
    }

    /// The byte on the wire: RV = 1, reserved bits zero.
    pub fn to_byte(self) -> u8 {
        (RDMAP_VERSION << control::VERSION_SHIFT) | self.opcode as u8
    }

    /// The five RsvdULP octets of an untagged DDP header (4.1, Figure 3): the control
    /// byte, then the Invalidate STag (zero unless the opcode carries one).
    pub fn untagged_rsvd_ulp(self, invalidate_stag: u32) -> [u8; 5] {
        let stag = if self.opcode.carries_invalidate_stag() {
            invalidate_stag
        } else {
            0
        };
        let [a, b, c, d] = stag.to_be_bytes();
        [self.to_byte(), a, b, c, d]
    }
}

/// The Invalidate STag carried in RsvdULP octets 2..5 of an untagged DDP header (4.1).
pub fn invalidate_stag(rsvd_ulp: &[u8; 5]) -> u32 {
    let [_, a, b, c, d] = *rsvd_ulp;
    u32::from_be_bytes([a, b, c, d])
}

mod rr_field {
    pub const SINK_STAG: usize = 0;
    pub const SINK_TO: usize = 4;
    pub const SIZE: usize = 12;
    pub const SRC_STAG: usize = 16;
    pub const SRC_TO: usize = 20;
}

/// A checked view of an RDMA Read Request header (RFC 5040 4.4, Figure 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequestView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ReadRequestView<T> {
    /// Wraps `buffer` without checking its length; accessors read missing fields as 0
    /// (never panic). Use [`ReadRequestView::new_checked`] for bytes from the network.
    pub const fn new_unchecked(buffer: T) -> Self {
        ReadRequestView { buffer }
    }

    /// Wraps `buffer`, checking it holds at least [`READ_REQUEST_LEN`] octets.
    pub fn new_checked(buffer: T) -> Result<Self, RdmapError> {
        let have = buffer.as_ref().len();
        if have < READ_REQUEST_LEN {
            return Err(truncated(READ_REQUEST_LEN, have));
        }
        Ok(ReadRequestView { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u32_at(&self, at: usize) -> u32 {
        be_u32(self.buffer.as_ref(), at).unwrap_or(0)
    }

    fn u64_at(&self, at: usize) -> u64 {
        be_u64(self.buffer.as_ref(), at).unwrap_or(0)
    }

    /// Data Sink STag (reads as 0 on a short unchecked buffer).
    pub fn sink_stag(&self) -> u32 {
        self.u32_at(rr_field::SINK_STAG)
    }

    /// Data Sink Tagged Offset.
    pub fn sink_to(&self) -> u64 {
        self.u64_at(rr_field::SINK_TO)
    }

    /// RDMA Read Message Size (RDMARDSZ).
    pub fn size(&self) -> u32 {
        self.u32_at(rr_field::SIZE)
    }

    /// Data Source STag.
    pub fn src_stag(&self) -> u32 {
        self.u32_at(rr_field::SRC_STAG)
    }

    /// Data Source Tagged Offset.
    pub fn src_to(&self) -> u64 {
        self.u64_at(rr_field::SRC_TO)
    }
}

/// The fields of an RDMA Read Request header (RFC 5040 4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadRequest {
    /// Data Sink STag: copied into the Read Response.
    pub sink_stag: u32,
    /// Data Sink Tagged Offset: the TO of the Read Response's first octet.
    pub sink_to: u64,
    /// RDMA Read Message Size; 0 asks for a zero-length Read Response without checks.
    pub size: u32,
    /// Data Source STag.
    pub src_stag: u32,
    /// Data Source Tagged Offset.
    pub src_to: u64,
}

impl ReadRequest {
    /// Parses the first [`READ_REQUEST_LEN`] octets of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<ReadRequest, RdmapError> {
        let view = ReadRequestView::new_checked(bytes)?;
        Ok(ReadRequest {
            sink_stag: view.sink_stag(),
            sink_to: view.sink_to(),
            size: view.size(),
            src_stag: view.src_stag(),
            src_to: view.src_to(),
        })
    }

    /// The 28 octets of this header.
    pub fn to_bytes(&self) -> [u8; READ_REQUEST_LEN] {
        let mut out = [0u8; READ_REQUEST_LEN];
        out[rr_field::SINK_STAG..rr_field::SINK_TO].copy_from_slice(&self.sink_stag.to_be_bytes());
        out[rr_field::SINK_TO..rr_field::SIZE].copy_from_slice(&self.sink_to.to_be_bytes());
        out[rr_field::SIZE..rr_field::SRC_STAG].copy_from_slice(&self.size.to_be_bytes());
        out[rr_field::SRC_STAG..rr_field::SRC_TO].copy_from_slice(&self.src_stag.to_be_bytes());
        out[rr_field::SRC_TO..].copy_from_slice(&self.src_to.to_be_bytes());
        out
    }

    /// Writes the header into `out`; returns [`READ_REQUEST_LEN`], or 0 (nothing
    /// written) if `out` is shorter.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        match out.get_mut(..READ_REQUEST_LEN) {
            Some(dst) => {
                dst.copy_from_slice(&self.to_bytes());
                READ_REQUEST_LEN
            }
            None => 0,
        }
    }

    /// The header as updated for the Terminate after `done` octets were sent (4.8:
    /// sink and source TO advanced, size reduced to the bytes left).
    pub fn advanced_by(&self, done: u32) -> ReadRequest {
        let done = done.min(self.size);
        ReadRequest {
            sink_to: self.sink_to.wrapping_add(u64::from(done)),
            size: self.size - done,
            src_to: self.src_to.wrapping_add(u64::from(done)),
            ..*self
        }
    }
}

/// Header-control bits of the Terminate Control field (4.8, Figure 8), in the first
/// 32-bit word of the Terminate header.
pub mod hdrct {
    /// M: DDP Segment Length valid.
    pub const M: u32 = 1 << 15;
    /// D: DDP header included.
    pub const D: u32 = 1 << 14;
    /// R: RDMAP (Read Request) header included.
    pub const R: u32 = 1 << 13;
}

/// A copy of the DDP header of the segment that caused a Terminate (4.8, "Terminated
/// DDP Header"): 14 octets if its T bit is set, 18 otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopiedDdpHeader {
    bytes: [u8; UNTAGGED_DDP_HEADER_LEN],
    len: u8,
}

impl CopiedDdpHeader {
    /// Copies the DDP header from the start of a ULPDU, if the ULPDU is long enough for
    /// the header its T bit selects.
    pub fn from_segment(ulpdu: &[u8]) -> Option<CopiedDdpHeader> {
        let len = ddp::wire::header_len_of(*ulpdu.first()?);
        let src = ulpdu.get(..len)?;
        let mut bytes = [0u8; UNTAGGED_DDP_HEADER_LEN];
        bytes[..len].copy_from_slice(src);
        Some(CopiedDdpHeader {
            bytes,
            len: len as u8,
        })
    }

    /// The copied octets (14 or 18).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// True if the copied header is tagged.
    pub fn is_tagged(&self) -> bool {
        self.bytes[0] & ddp::wire::control::TAGGED != 0
    }
}

/// A checked view of a Terminate header (RFC 5040 4.8, Figure 7).
///
/// Layout: Terminate Control (Layer, EType, Error Code, M/D/R, 13 reserved bits), then
/// the 16-bit DDP Segment Length when M or D is set, then the terminated DDP header
/// (14 or 18 octets, chosen by its own T bit) when D is set, then the 28-octet Read
/// Request header when R is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminateView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TerminateView<T> {
    /// Wraps `buffer` without checking it; accessors still never panic.
    pub const fn new_unchecked(buffer: T) -> Self {
        TerminateView { buffer }
    }

    /// Wraps `buffer`, checking that every part the M/D/R bits announce is present.
    pub fn new_checked(buffer: T) -> Result<Self, RdmapError> {
        let view = TerminateView { buffer };
        view.check()?;
        Ok(view)
    }

    /// Checks the lengths announced by the header-control bits.
    pub fn check(&self) -> Result<(), RdmapError> {
        let have = self.buffer.as_ref().len();
        let needed = self.header_len().ok_or(truncated(
            TERMINATE_CONTROL_LEN + TERMINATE_SEGMENT_LEN_LEN + 1,
            have,
        ))?;
        if have < needed {
            return Err(truncated(needed, have));
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn control_word(&self) -> u32 {
        be_u32(self.buffer.as_ref(), 0).unwrap_or(0)
    }

    /// Layer (4 bits).
    pub fn layer(&self) -> u8 {
        (self.control_word() >> 28) as u8
    }

    /// EType (4 bits).
    pub fn etype(&self) -> u8 {
        ((self.control_word() >> 24) & 0xF) as u8
    }

    /// Error Code (8 bits).
    pub fn code(&self) -> u8 {
        ((self.control_word() >> 16) & 0xFF) as u8
    }

    /// M: DDP Segment Length valid.
    pub fn m(&self) -> bool {
        self.control_word() & hdrct::M != 0
    }

    /// D: DDP header included.
    pub fn d(&self) -> bool {
        self.control_word() & hdrct::D != 0
    }

    /// R: Read Request header included.
    pub fn r(&self) -> bool {
        self.control_word() & hdrct::R != 0
    }

    fn has_segment_len_field(&self) -> bool {
        self.m() || self.d()
    }

    fn ddp_header_at(&self) -> usize {
        TERMINATE_CONTROL_LEN
            + if self.has_segment_len_field() {
                TERMINATE_SEGMENT_LEN_LEN
            } else {
                0
            }
    }

    fn ddp_header_len(&self) -> Option<usize> {
        if !self.d() {
            return Some(0);
        }
        let first = *self.buffer.as_ref().get(self.ddp_header_at())?;
        Some(ddp::wire::header_len_of(first))
    }

    /// Total octets of this Terminate header; `None` if the buffer ends before the
    /// copied DDP header's control byte tells its length.
    pub fn header_len(&self) -> Option<usize> {
        let rr = if self.r() { READ_REQUEST_LEN } else { 0 };
        Some(self.ddp_header_at() + self.ddp_header_len()? + rr)
    }

    /// The DDP Segment Length field, if present (M or D set).
    pub fn segment_len(&self) -> Option<u16> {
        if !self.has_segment_len_field() {
            return None;
        }
        be_u16(self.buffer.as_ref(), TERMINATE_CONTROL_LEN)
    }

    /// The terminated DDP header, if D is set and it is present.
    pub fn ddp_header(&self) -> Option<&[u8]> {
        if !self.d() {
            return None;
        }
        let at = self.ddp_header_at();
        let len = self.ddp_header_len()?;
        self.buffer.as_ref().get(at..at + len)
    }

    /// The terminated Read Request header, if R is set and it is present.
    pub fn read_request(&self) -> Option<&[u8]> {
        if !self.r() {
            return None;
        }
        let at = self.ddp_header_at() + self.ddp_header_len()?;
        self.buffer.as_ref().get(at..at + READ_REQUEST_LEN)
    }
}

/// The fields of a Terminate header (RFC 5040 4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminateHeader {
    /// Layer (Figure 9): [`layer::RDMAP`], [`layer::DDP`] or [`layer::LLP`].
    pub layer: u8,
    /// Error type (4 bits).
    pub etype: u8,
    /// Error code.
    pub code: u8,
    /// The DDP Segment Length; `Some` sets M (valid).
    pub segment_len: Option<u16>,
    /// The terminated DDP header; `Some` sets D.
    pub ddp_header: Option<CopiedDdpHeader>,
    /// The terminated Read Request header; `Some` sets R.
    pub read_request: Option<ReadRequest>,
}

impl TerminateHeader {
    /// A Terminate carrying only (layer, etype, code): no segment length or headers.
    pub fn bare(layer: u8, etype: u8, code: u8) -> TerminateHeader {
        TerminateHeader {
            layer,
            etype,
            code,
            segment_len: None,
            ddp_header: None,
            read_request: None,
        }
    }

    /// Parses a Terminate header from the Terminate message's payload.
    pub fn parse(bytes: &[u8]) -> Result<TerminateHeader, RdmapError> {
        let view = TerminateView::new_checked(bytes)?;
        let segment_len = if view.m() { view.segment_len() } else { None };
        let ddp_header = view.ddp_header().and_then(CopiedDdpHeader::from_segment);
        let read_request = match view.read_request() {
            Some(rr) => Some(ReadRequest::parse(rr)?),
            None => None,
        };
        Ok(TerminateHeader {
            layer: view.layer(),
            etype: view.etype(),
            code: view.code(),
            segment_len,
            ddp_header,
            read_request,
        })
    }

    /// Octets [`TerminateHeader::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        let len_field = if self.segment_len.is_some() || self.ddp_header.is_some() {
            TERMINATE_SEGMENT_LEN_LEN
        } else {
            0
        };
        TERMINATE_CONTROL_LEN
            + len_field
            + self.ddp_header.map_or(0, |h| h.as_bytes().len())
            + self.read_request.map_or(0, |_| READ_REQUEST_LEN)
    }

    /// Writes the header into `out`; returns the octets written
    /// ([`TerminateHeader::buffer_len`]), or 0 (nothing written) if `out` is shorter.
    /// Reserved bits are zero; the DDP Segment Length field is present (zero unless
    /// `segment_len` is set) whenever M or D is set.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        let total = self.buffer_len();
        let Some(out) = out.get_mut(..total) else {
            return 0;
        };
        let mut word = (u32::from(self.layer & 0xF) << 28)
            | (u32::from(self.etype & 0xF) << 24)
            | (u32::from(self.code) << 16);
        if self.segment_len.is_some() {
            word |= hdrct::M;
        }
        if self.ddp_header.is_some() {
            word |= hdrct::D;
        }
        if self.read_request.is_some() {
            word |= hdrct::R;
        }
        out[..TERMINATE_CONTROL_LEN].copy_from_slice(&word.to_be_bytes());
        let mut at = TERMINATE_CONTROL_LEN;
        if self.segment_len.is_some() || self.ddp_header.is_some() {
            let len = self.segment_len.unwrap_or(0);
            out[at..at + TERMINATE_SEGMENT_LEN_LEN].copy_from_slice(&len.to_be_bytes());
            at += TERMINATE_SEGMENT_LEN_LEN;
        }
        if let Some(h) = &self.ddp_header {
            let bytes = h.as_bytes();
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        }
        if let Some(rr) = &self.read_request {
            out[at..at + READ_REQUEST_LEN].copy_from_slice(&rr.to_bytes());
            at += READ_REQUEST_LEN;
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_byte_values_match_rfc5040_figure_4() {
        // IWARP-WIRE.md 4: byte 1 of the ULPDU is 0x40 | opcode.
        let table = [
            (Opcode::Write, 0x40),
            (Opcode::ReadRequest, 0x41),
            (Opcode::ReadResponse, 0x42),
            (Opcode::Send, 0x43),
            (Opcode::SendInvalidate, 0x44),
            (Opcode::SendSe, 0x45),
            (Opcode::SendSeInvalidate, 0x46),
            (Opcode::Terminate, 0x47),
            // RFC 7306 Figure 2.
            (Opcode::ImmediateData, 0x48),
            (Opcode::ImmediateDataSe, 0x49),
            (Opcode::AtomicRequest, 0x4A),
            (Opcode::AtomicResponse, 0x4B),
        ];
        for (opcode, byte) in table {
            assert_eq!(RdmapControl { opcode }.to_byte(), byte);
            assert_eq!(RdmapControl::parse(byte), Ok(RdmapControl { opcode }));
        }
    }

    #[test]
    fn control_byte_ignores_reserved_bits() {
        assert_eq!(
            RdmapControl::parse(0x73).map(|c| c.opcode),
            Ok(Opcode::Send)
        );
    }

    #[test]
    fn control_byte_rejects_other_versions_before_opcode() {
        assert_eq!(
            RdmapControl::parse(0x03),
            Err(RdmapError::InvalidVersion { version: 0 })
        );
        assert_eq!(
            RdmapControl::parse(0xC3),
            Err(RdmapError::InvalidVersion { version: 3 })
        );
        assert_eq!(
            RdmapControl::parse(0x0F),
            Err(RdmapError::InvalidVersion { version: 0 })
        );
    }

    #[test]
    fn control_byte_rejects_reserved_opcodes() {
        for raw in 12u8..=15 {
            assert_eq!(
                RdmapControl::parse(0x40 | raw),
                Err(RdmapError::UnexpectedOpcode { opcode: raw })
            );
        }
    }

    #[test]
    fn opcode_buffer_model_and_queue_numbers() {
        assert!(Opcode::Write.is_tagged() && Opcode::ReadResponse.is_tagged());
        assert_eq!(Opcode::ReadRequest.queue_number(), Some(1));
        assert_eq!(Opcode::Terminate.queue_number(), Some(2));
        for op in [
            Opcode::Send,
            Opcode::SendInvalidate,
            Opcode::SendSe,
            Opcode::SendSeInvalidate,
        ] {
            assert_eq!(op.queue_number(), Some(0));
            assert!(!op.is_tagged());
        }
        assert_eq!(Opcode::Write.queue_number(), None);
        // RFC 7306 Figure 2: untagged, Immediate Data on QN 0, Atomic Request on QN 1 (with
        // Read Requests), Atomic Response on QN 3; none of them is a Send.
        assert_eq!(Opcode::ImmediateData.queue_number(), Some(0));
        assert_eq!(Opcode::ImmediateDataSe.queue_number(), Some(0));
        assert_eq!(Opcode::AtomicRequest.queue_number(), Some(1));
        assert_eq!(Opcode::AtomicResponse.queue_number(), Some(3));
        for op in [
            Opcode::ImmediateData,
            Opcode::ImmediateDataSe,
            Opcode::AtomicRequest,
            Opcode::AtomicResponse,
        ] {
            assert!(op.is_extension() && !op.is_tagged() && !op.is_send());
        }
        assert!(Opcode::ImmediateDataSe.is_solicited() && !Opcode::ImmediateData.is_solicited());
        assert_eq!(Opcode::send(true, true), Opcode::SendSeInvalidate);
        assert_eq!(Opcode::send(false, true), Opcode::SendInvalidate);
    }

    #[test]
    fn invalidate_stag_only_for_invalidate_opcodes() {
        let inv = RdmapControl {
            opcode: Opcode::SendInvalidate,
        };
        assert_eq!(
            inv.untagged_rsvd_ulp(0x1234_5678),
            [0x44, 0x12, 0x34, 0x56, 0x78]
        );
        assert_eq!(
            invalidate_stag(&[0x44, 0x12, 0x34, 0x56, 0x78]),
            0x1234_5678
        );
        let plain = RdmapControl {
            opcode: Opcode::Send,
        };
        assert_eq!(plain.untagged_rsvd_ulp(0x1234_5678), [0x43, 0, 0, 0, 0]);
    }

    const READ_REQUEST_BYTES: [u8; 28] = [
        0x00, 0x00, 0x12, 0x01, // SinkSTag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, // SinkTO
        0x00, 0x00, 0x10, 0x00, // RDMARDSZ
        0x00, 0x00, 0x34, 0x07, // SrcSTag
        0xFF, 0xEE, 0xDD, 0xCC, 0xBB, 0xAA, 0x99, 0x88, // SrcTO
    ];

    #[test]
    fn read_request_parse_figure_6() {
        let rr = ReadRequest::parse(&READ_REQUEST_BYTES).unwrap();
        assert_eq!(
            rr,
            ReadRequest {
                sink_stag: 0x1201,
                sink_to: 0x1_0000,
                size: 0x1000,
                src_stag: 0x3407,
                src_to: 0xFFEE_DDCC_BBAA_9988,
            }
        );
        let view = ReadRequestView::new_checked(&READ_REQUEST_BYTES[..]).unwrap();
        assert_eq!(view.size(), 0x1000);
    }

    #[test]
    fn read_request_emit_round_trip() {
        let rr = ReadRequest::parse(&READ_REQUEST_BYTES).unwrap();
        let mut out = [0u8; 30];
        assert_eq!(rr.emit(&mut out), 28);
        assert_eq!(out[..28], READ_REQUEST_BYTES);
        assert_eq!(rr.emit(&mut out[..27]), 0);
    }

    #[test]
    fn read_request_too_short_is_an_error() {
        assert_eq!(
            ReadRequest::parse(&READ_REQUEST_BYTES[..27]),
            Err(RdmapError::Truncated {
                needed: 28,
                have: 27
            })
        );
    }

    #[test]
    fn read_request_advanced_for_terminate() {
        let rr = ReadRequest::parse(&READ_REQUEST_BYTES).unwrap();
        let adv = rr.advanced_by(2048);
        assert_eq!(adv.sink_to, 0x1_0000 + 2048);
        assert_eq!(adv.size, 0x1000 - 2048);
        assert_eq!(adv.src_to, 0xFFEE_DDCC_BBAA_9988 + 2048);
        assert_eq!(adv.sink_stag, rr.sink_stag);
    }

    #[test]
    fn terminate_bare_bytes() {
        // MPA CRC error: Layer 2, EType 0, code 2, no headers.
        let t = TerminateHeader::bare(layer::LLP, 0, 0x02);
        let mut out = [0u8; 8];
        assert_eq!(t.emit(&mut out), 4);
        assert_eq!(out[..4], [0x20, 0x02, 0x00, 0x00]);
        assert_eq!(TerminateHeader::parse(&out[..4]), Ok(t));
    }

    #[test]
    fn terminate_with_ddp_header_bytes() {
        // DDP untagged "MSN no buffer" (1/2/2) for a 24-octet Send, MSN 1.
        let segment: [u8; 18] = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        let t = TerminateHeader {
            layer: layer::DDP,
            etype: 0x2,
            code: 0x02,
            segment_len: Some(24),
            ddp_header: CopiedDdpHeader::from_segment(&segment),
            read_request: None,
        };
        let mut out = [0u8; 64];
        let n = t.emit(&mut out);
        assert_eq!(n, 4 + 2 + 18);
        let expected: [u8; 24] = [
            0x12, 0x02, 0xC0, 0x00, // layer 1, etype 2, code 2, M and D
            0x00, 0x18, // segment length 24
            0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
        ];
        assert_eq!(out[..n], expected);
        assert_eq!(TerminateHeader::parse(&out[..n]), Ok(t));
        let view = TerminateView::new_checked(&out[..n]).unwrap();
        assert!(view.m() && view.d() && !view.r());
        assert_eq!(view.ddp_header(), Some(&segment[..]));
    }

    #[test]
    fn terminate_with_tagged_and_read_request_bytes() {
        // Tagged header copy (14 octets) followed by a Read Request header: a
        // contrived combination that exercises the T-bit driven length.
        let tagged: [u8; 14] = [0xC1, 0x40, 0, 0, 0x12, 0x01, 0, 0, 0, 0, 0, 1, 0, 0];
        let t = TerminateHeader {
            layer: layer::RDMAP,
            etype: 0x1,
            code: 0x02,
            segment_len: Some(0x1000),
            ddp_header: CopiedDdpHeader::from_segment(&tagged),
            read_request: Some(ReadRequest::parse(&READ_REQUEST_BYTES).unwrap()),
        };
        let mut out = [0u8; MAX_TERMINATE_LEN];
        let n = t.emit(&mut out);
        assert_eq!(n, 4 + 2 + 14 + 28);
        assert_eq!(out[..4], [0x01, 0x02, 0xE0, 0x00]);
        assert_eq!(out[4..6], [0x10, 0x00]);
        assert_eq!(out[6..20], tagged);
        assert_eq!(out[20..48], READ_REQUEST_BYTES);
        assert_eq!(TerminateHeader::parse(&out[..n]), Ok(t));
    }

    #[test]
    fn terminate_with_read_request_untagged_full_length() {
        let rr_segment: [u8; 18] = [0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 0];
        let t = TerminateHeader {
            layer: layer::RDMAP,
            etype: 0x1,
            code: 0x00,
            segment_len: Some(28),
            ddp_header: CopiedDdpHeader::from_segment(&rr_segment),
            read_request: Some(ReadRequest::parse(&READ_REQUEST_BYTES).unwrap()),
        };
        let mut out = [0u8; MAX_TERMINATE_LEN];
        assert_eq!(t.emit(&mut out), MAX_TERMINATE_LEN);
        assert_eq!(t.emit(&mut out[..MAX_TERMINATE_LEN - 1]), 0);
        assert_eq!(TerminateHeader::parse(&out), Ok(t));
    }

    #[test]
    fn terminate_parse_rejects_missing_announced_parts() {
        // D set but nothing follows the control word.
        let bytes = [0x12, 0x02, 0x40, 0x00, 0x00, 0x00];
        assert!(matches!(
            TerminateHeader::parse(&bytes),
            Err(RdmapError::Truncated { .. })
        ));
        // R set, Read Request header cut short.
        let mut short = [0u8; 4 + 20];
        short[..4].copy_from_slice(&[0x01, 0x00, 0x20, 0x00]);
        assert_eq!(
            TerminateHeader::parse(&short),
            Err(RdmapError::Truncated {
                needed: 32,
                have: 24
            })
        );
        assert!(matches!(
            TerminateHeader::parse(&[0x01]),
            Err(RdmapError::Truncated { .. })
        ));
    }
}
