//! DDP header wire formats (RFC 5041 section 4), smoltcp style: a parsed representation
//! ([`DdpHeader`] with [`DdpHeader::parse`] / [`DdpHeader::emit`]) and a checked
//! zero-copy view over the bytes of one DDP segment ([`DdpSegment`]).
//!
//! All multi-octet fields are big-endian. Offsets below are within the ULPDU (the MPA
//! header, if any, is not part of it).

use crate::{DdpError, SegmentPlan};

/// The DDP version this implementation speaks: the DV field MUST be 1 (RFC 5041 4.1).
pub const DDP_VERSION: u8 = 1;
/// Length of the tagged buffer model header (RFC 5041 4.2, Figure 4).
pub const TAGGED_HEADER_LEN: usize = 14;
/// Length of the untagged buffer model header (RFC 5041 4.3, Figure 5).
pub const UNTAGGED_HEADER_LEN: usize = 18;

/// DDP control field bits (RFC 5041 4.1, Figure 3).
pub mod control {
    /// T: tagged buffer model.
    pub const TAGGED: u8 = 0x80;
    /// L: last segment of the DDP message.
    pub const LAST: u8 = 0x40;
    /// Rsvd: set to zero on transmit, not checked on receive.
    pub const RESERVED: u8 = 0x3C;
    /// DV: DDP version.
    pub const VERSION: u8 = 0x03;
}

mod field {
    pub type Field = core::ops::Range<usize>;
    pub const CONTROL: usize = 0;
    pub const RSVD_ULP_FIRST: usize = 1;
    // Tagged (RFC 5041 4.2).
    pub const STAG: Field = 2..6;
    pub const TO: Field = 6..14;
    // Untagged (RFC 5041 4.3).
    pub const RSVD_ULP: Field = 1..6;
    pub const QN: Field = 6..10;
    pub const MSN: Field = 10..14;
    pub const MO: Field = 14..18;
}

fn read_u32(buf: &[u8], range: field::Field) -> Option<u32> {
    let bytes: [u8; 4] = buf.get(range)?.try_into().ok()?;
    Some(u32::from_be_bytes(bytes))
}

fn read_u64(buf: &[u8], range: field::Field) -> Option<u64> {
    let bytes: [u8; 8] = buf.get(range)?.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

fn control_byte(tagged: bool, last: bool) -> u8 {
    let mut ctrl = DDP_VERSION & control::VERSION;
    if tagged {
        ctrl |= control::TAGGED;
    }
    if last {
        ctrl |= control::LAST;
    }
    ctrl
}

/// Tagged buffer model header (RFC 5041 4.2): `ctrl | RsvdULP | STag | TO`, 14 octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedHeader {
    /// L bit: last segment of the message.
    pub last: bool,
    /// The 8-bit RsvdULP field (for RDMAP: its control byte).
    pub rsvd_ulp: u8,
    /// Steering Tag of the data sink's tagged buffer.
    pub stag: u32,
    /// Tagged Offset where this segment's payload is placed.
    pub to: u64,
}

/// Untagged buffer model header (RFC 5041 4.3): `ctrl | RsvdULP(40) | QN | MSN | MO`,
/// 18 octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UntaggedHeader {
    /// L bit: last segment of the message.
    pub last: bool,
    /// The 40-bit RsvdULP field, first octet first (for RDMAP: control byte, then the
    /// Invalidate STag).
    pub rsvd_ulp: [u8; 5],
    /// Queue Number.
    pub qn: u32,
    /// Message Sequence Number (starts at 1, wraps to 0 after 0xFFFFFFFF).
    pub msn: u32,
    /// Message Offset of this segment's payload.
    pub mo: u32,
}

/// A DDP header of either buffer model (RFC 5041 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpHeader {
    /// T = 1.
    Tagged(TaggedHeader),
    /// T = 0.
    Untagged(UntaggedHeader),
}

impl TaggedHeader {
    /// The header of one segment of a tagged message whose first octet goes to
    /// `initial_to` (RFC 5041 5.2: TO = initial TO + offset in the message). The sum
    /// wraps like the 64-bit field; the data sink reports a wrap as
    /// [`DdpError::ToWrap`].
    pub fn for_segment(plan: &SegmentPlan, rsvd_ulp: u8, stag: u32, initial_to: u64) -> Self {
        TaggedHeader {
            last: plan.last,
            rsvd_ulp,
            stag,
            to: initial_to.wrapping_add(plan.offset),
        }
    }

    /// Writes the 14-octet header into `out`; returns [`TAGGED_HEADER_LEN`], or 0 without
    /// writing anything if `out` is shorter than that. Reserved bits are sent as zero.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        let Some(out) = out.get_mut(..TAGGED_HEADER_LEN) else {
            return 0;
        };
        out[field::CONTROL] = control_byte(true, self.last);
        out[field::RSVD_ULP_FIRST] = self.rsvd_ulp;
        out[field::STAG].copy_from_slice(&self.stag.to_be_bytes());
        out[field::TO].copy_from_slice(&self.to.to_be_bytes());
        TAGGED_HEADER_LEN
    }
}

impl UntaggedHeader {
    /// The header of one segment of an untagged message (RFC 5041 5.2: MO = offset in
    /// the message). `None` if the offset does not fit the 32-bit MO: a ULP message
    /// must be shorter than 2^32 octets (5.2).
    pub fn for_segment(plan: &SegmentPlan, rsvd_ulp: [u8; 5], qn: u32, msn: u32) -> Option<Self> {
        Some(UntaggedHeader {
            last: plan.last,
            rsvd_ulp,
            qn,
            msn,
            mo: u32::try_from(plan.offset).ok()?,
        })
    }

    /// Writes the 18-octet header into `out`; returns [`UNTAGGED_HEADER_LEN`], or 0
    /// without writing anything if `out` is shorter than that. Reserved bits are sent as
    /// zero.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        let Some(out) = out.get_mut(..UNTAGGED_HEADER_LEN) else {
            return 0;
        };
        out[field::CONTROL] = control_byte(false, self.last);
        out[field::RSVD_ULP].copy_from_slice(&self.rsvd_ulp);
        out[field::QN].copy_from_slice(&self.qn.to_be_bytes());
        out[field::MSN].copy_from_slice(&self.msn.to_be_bytes());
        out[field::MO].copy_from_slice(&self.mo.to_be_bytes());
        UNTAGGED_HEADER_LEN
    }
}

impl DdpHeader {
    /// Parses the DDP header at the start of a ULPDU (RFC 5041 4) and returns it with
    /// the payload that follows it.
    ///
    /// The T bit selects the format. The Rsvd bits of the control field are not checked
    /// (4.1: "not checked on receive"). Errors:
    /// - DV != 1: [`DdpError::TaggedVersion`] / [`DdpError::UntaggedVersion`];
    /// - fewer octets than the selected header: [`DdpError::HeaderTruncated`] (an empty
    ///   ULPDU counts as untagged), reported as the invalid-version number of that model.
    ///
    /// The version is checked before the length, so a short segment with a bad version
    /// reports the version error.
    pub fn parse(ulpdu: &[u8]) -> Result<(DdpHeader, &[u8]), DdpError> {
        let Some(&ctrl) = ulpdu.first() else {
            return Err(DdpError::HeaderTruncated {
                tagged: false,
                len: 0,
            });
        };
        let tagged = ctrl & control::TAGGED != 0;
        let last = ctrl & control::LAST != 0;
        if ctrl & control::VERSION != DDP_VERSION {
            return Err(if tagged {
                DdpError::TaggedVersion
            } else {
                DdpError::UntaggedVersion
            });
        }
        let truncated = DdpError::HeaderTruncated {
            tagged,
            len: ulpdu.len(),
        };
        if tagged {
            let (Some(payload), Some(&rsvd_ulp), Some(stag), Some(to)) = (
                ulpdu.get(TAGGED_HEADER_LEN..),
                ulpdu.get(field::RSVD_ULP_FIRST),
                read_u32(ulpdu, field::STAG),
                read_u64(ulpdu, field::TO),
            ) else {
                return Err(truncated);
            };
            let hdr = TaggedHeader {
                last,
                rsvd_ulp,
                stag,
                to,
            };
            Ok((DdpHeader::Tagged(hdr), payload))
        } else {
            let (Some(payload), Some(rsvd_ulp), Some(qn), Some(msn), Some(mo)) = (
                ulpdu.get(UNTAGGED_HEADER_LEN..),
                ulpdu
                    .get(field::RSVD_ULP)
                    .and_then(|b| <[u8; 5]>::try_from(b).ok()),
                read_u32(ulpdu, field::QN),
                read_u32(ulpdu, field::MSN),
                read_u32(ulpdu, field::MO),
            ) else {
                return Err(truncated);
            };
            let hdr = UntaggedHeader {
                last,
                rsvd_ulp,
                qn,
                msn,
                mo,
            };
            Ok((DdpHeader::Untagged(hdr), payload))
        }
    }

    /// Octets this header occupies on the wire (14 tagged, 18 untagged).
    pub fn header_len(&self) -> usize {
        match self {
            DdpHeader::Tagged(_) => TAGGED_HEADER_LEN,
            DdpHeader::Untagged(_) => UNTAGGED_HEADER_LEN,
        }
    }

    /// Writes the header into `out`; returns [`DdpHeader::header_len`] octets written, or
    /// 0 (nothing written) if `out` is too short.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        match self {
            DdpHeader::Tagged(h) => h.emit(out),
            DdpHeader::Untagged(h) => h.emit(out),
        }
    }

    /// The L bit.
    pub fn last(&self) -> bool {
        match self {
            DdpHeader::Tagged(h) => h.last,
            DdpHeader::Untagged(h) => h.last,
        }
    }

    /// The first RsvdULP octet (ULPDU offset 1; the RDMAP control byte).
    pub fn rsvd_ulp_first(&self) -> u8 {
        match self {
            DdpHeader::Tagged(h) => h.rsvd_ulp,
            DdpHeader::Untagged(h) => h.rsvd_ulp[0],
        }
    }

    /// True for the tagged buffer model.
    pub fn is_tagged(&self) -> bool {
        matches!(self, DdpHeader::Tagged(_))
    }
}

/// The length of the DDP header whose first octet (the control field) is `first`: 14 with the
/// T bit set (tagged, RFC 5041 4.2), 18 without (untagged, 4.3).
pub fn header_len_of(first: u8) -> usize {
    if first & control::TAGGED != 0 {
        TAGGED_HEADER_LEN
    } else {
        UNTAGGED_HEADER_LEN
    }
}

/// A checked zero-copy view of one DDP segment (RFC 5041 4.4: header, then ULP payload).
///
/// [`DdpSegment::new_checked`] guarantees the buffer holds the whole header selected by
/// the T bit and that DV is 1. Accessors never panic, even on a view made with
/// [`DdpSegment::new_unchecked`]; fields of the other buffer model read as `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DdpSegment<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> DdpSegment<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Self {
        DdpSegment { buffer }
    }

    /// Wraps a buffer after [`DdpSegment::check`].
    pub fn new_checked(buffer: T) -> Result<Self, DdpError> {
        let segment = Self::new_unchecked(buffer);
        segment.check()?;
        Ok(segment)
    }

    /// Checks DV == 1 and that the buffer is long enough for its header (same errors as
    /// [`DdpHeader::parse`]).
    pub fn check(&self) -> Result<(), DdpError> {
        DdpHeader::parse(self.buffer.as_ref()).map(|_| ())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn control(&self) -> u8 {
        self.buffer.as_ref().first().copied().unwrap_or(0)
    }

    /// T bit.
    pub fn is_tagged(&self) -> bool {
        self.control() & control::TAGGED != 0
    }

    /// L bit.
    pub fn is_last(&self) -> bool {
        self.control() & control::LAST != 0
    }

    /// DV field.
    pub fn version(&self) -> u8 {
        self.control() & control::VERSION
    }

    /// First RsvdULP octet (0 if absent).
    pub fn rsvd_ulp_first(&self) -> u8 {
        self.buffer
            .as_ref()
            .get(field::RSVD_ULP_FIRST)
            .copied()
            .unwrap_or(0)
    }

    /// Header length selected by the T bit ([`header_len_of`]; 18, untagged, for an empty
    /// buffer).
    pub fn header_len(&self) -> usize {
        header_len_of(self.control())
    }

    fn tagged_field<V>(&self, read: impl Fn(&[u8]) -> Option<V>) -> Option<V> {
        if self.is_tagged() {
            read(self.buffer.as_ref())
        } else {
            None
        }
    }

    fn untagged_field<V>(&self, read: impl Fn(&[u8]) -> Option<V>) -> Option<V> {
        if self.is_tagged() {
            None
        } else {
            read(self.buffer.as_ref())
        }
    }

    /// STag of a tagged segment.
    pub fn stag(&self) -> Option<u32> {
        self.tagged_field(|b| read_u32(b, field::STAG))
    }

    /// TO of a tagged segment.
    pub fn to(&self) -> Option<u64> {
        self.tagged_field(|b| read_u64(b, field::TO))
    }

    /// QN of an untagged segment.
    pub fn qn(&self) -> Option<u32> {
        self.untagged_field(|b| read_u32(b, field::QN))
    }

    /// MSN of an untagged segment.
    pub fn msn(&self) -> Option<u32> {
        self.untagged_field(|b| read_u32(b, field::MSN))
    }

    /// MO of an untagged segment.
    pub fn mo(&self) -> Option<u32> {
        self.untagged_field(|b| read_u32(b, field::MO))
    }

    /// The ULP payload after the header (empty if the buffer is too short).
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(self.header_len()..).unwrap_or(&[])
    }

    /// The parsed header (same as [`DdpHeader::parse`]).
    pub fn header(&self) -> Result<DdpHeader, DdpError> {
        DdpHeader::parse(self.buffer.as_ref()).map(|(hdr, _)| hdr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The T bit alone picks the header length (RFC 5041 4.2, 4.3), whatever the other
    /// control bits say; an empty segment reads as untagged.
    #[test]
    fn the_t_bit_picks_the_header_length() {
        for first in 0..=u8::MAX {
            let want = if first & 0x80 != 0 { 14 } else { 18 };
            assert_eq!(header_len_of(first), want, "{first:#04x}");
            assert_eq!(DdpSegment::new_unchecked([first]).header_len(), want);
        }
        assert_eq!(DdpSegment::new_unchecked(&[][..]).header_len(), 18);
    }

    /// The DDP segment inside RFC 5044 Fig. 5 (ULPDU after ULPDU_Length 0x002a): an
    /// untagged Send, L = 1, DV = 1, RsvdULP[0] = 0x43, QN 0, MSN 1, MO 0, 24 zero octets.
    const RFC5044_FIG5_ULPDU: [u8; 42] = [
        0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
        0x00, 0x00, 0x00, // header
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    /// RFC 5044 Fig. 6: the same Send with MSN 2.
    const RFC5044_FIG6_HEADER: [u8; 18] = [
        0x41, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
        0x00, 0x00, 0x00,
    ];

    /// A tagged RDMA Write segment (RsvdULP 0x40), not last, STag 0x12345678,
    /// TO 0x0102030405060708, payload `aa bb`.
    const TAGGED_WRITE: [u8; 16] = [
        0x81, 0x40, 0x12, 0x34, 0x56, 0x78, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0xaa,
        0xbb,
    ];

    #[test]
    fn parse_rfc5044_fig5_untagged() {
        let (hdr, payload) = DdpHeader::parse(&RFC5044_FIG5_ULPDU).unwrap();
        assert_eq!(
            hdr,
            DdpHeader::Untagged(UntaggedHeader {
                last: true,
                rsvd_ulp: [0x43, 0, 0, 0, 0],
                qn: 0,
                msn: 1,
                mo: 0,
            })
        );
        assert_eq!(payload, &[0u8; 24][..]);
        assert_eq!(hdr.header_len(), UNTAGGED_HEADER_LEN);
        assert!(hdr.last());
        assert!(!hdr.is_tagged());
        assert_eq!(hdr.rsvd_ulp_first(), 0x43);
    }

    #[test]
    fn emit_rfc5044_fig6_untagged() {
        let hdr = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            rsvd_ulp: [0x43, 0, 0, 0, 0],
            qn: 0,
            msn: 2,
            mo: 0,
        });
        let mut out = [0xffu8; 20];
        assert_eq!(hdr.emit(&mut out), 18);
        assert_eq!(&out[..18], &RFC5044_FIG6_HEADER);
        assert_eq!(&out[18..], &[0xff, 0xff], "emit wrote past the header");
    }

    #[test]
    fn parse_and_emit_tagged() {
        let (hdr, payload) = DdpHeader::parse(&TAGGED_WRITE).unwrap();
        let expected = TaggedHeader {
            last: false,
            rsvd_ulp: 0x40,
            stag: 0x1234_5678,
            to: 0x0102_0304_0506_0708,
        };
        assert_eq!(hdr, DdpHeader::Tagged(expected));
        assert_eq!(payload, &[0xaa, 0xbb]);
        assert_eq!(hdr.header_len(), TAGGED_HEADER_LEN);
        assert_eq!(hdr.rsvd_ulp_first(), 0x40);
        let mut out = [0u8; TAGGED_HEADER_LEN];
        assert_eq!(hdr.emit(&mut out), TAGGED_HEADER_LEN);
        assert_eq!(out, TAGGED_WRITE[..14]);
    }

    #[test]
    fn tagged_last_control_byte() {
        let hdr = TaggedHeader {
            last: true,
            rsvd_ulp: 0x42,
            stag: 1,
            to: 0,
        };
        let mut out = [0u8; 14];
        hdr.emit(&mut out);
        assert_eq!(
            out,
            [0xc1, 0x42, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            "T|L|DV=1 is 0xc1"
        );
    }

    #[test]
    fn reserved_control_bits_are_ignored_on_receive() {
        let mut seg = RFC5044_FIG5_ULPDU;
        seg[0] |= control::RESERVED;
        let (hdr, _) = DdpHeader::parse(&seg).unwrap();
        assert!(hdr.last());
        // ...and emitted as zero.
        let mut out = [0u8; 18];
        hdr.emit(&mut out);
        assert_eq!(out[0], 0x41);
    }

    #[test]
    fn invalid_version_per_model() {
        for dv in [0u8, 2, 3] {
            let mut untagged = RFC5044_FIG5_ULPDU;
            untagged[0] = (untagged[0] & !control::VERSION) | dv;
            let err = DdpHeader::parse(&untagged).unwrap_err();
            assert_eq!(err, DdpError::UntaggedVersion);
            assert_eq!((err.etype(), err.code()), (0x2, 0x06));

            let mut tagged = TAGGED_WRITE;
            tagged[0] = (tagged[0] & !control::VERSION) | dv;
            let err = DdpHeader::parse(&tagged).unwrap_err();
            assert_eq!(err, DdpError::TaggedVersion);
            assert_eq!((err.etype(), err.code()), (0x1, 0x04));
        }
        // The RDMA Consortium version-0 header of draft-ietf-rddp-mpa-01 (`40 03`).
        let mut draft = RFC5044_FIG5_ULPDU;
        draft[0] = 0x40;
        draft[1] = 0x03;
        assert_eq!(DdpHeader::parse(&draft), Err(DdpError::UntaggedVersion));
    }

    #[test]
    fn truncated_input_is_an_error_at_every_length() {
        assert_eq!(
            DdpHeader::parse(&[]),
            Err(DdpError::HeaderTruncated {
                tagged: false,
                len: 0
            })
        );
        for len in 1..UNTAGGED_HEADER_LEN {
            assert_eq!(
                DdpHeader::parse(&RFC5044_FIG5_ULPDU[..len]),
                Err(DdpError::HeaderTruncated { tagged: false, len }),
            );
            assert!(DdpSegment::new_checked(&RFC5044_FIG5_ULPDU[..len]).is_err());
        }
        for len in 1..TAGGED_HEADER_LEN {
            assert_eq!(
                DdpHeader::parse(&TAGGED_WRITE[..len]),
                Err(DdpError::HeaderTruncated { tagged: true, len }),
            );
            assert!(DdpSegment::new_checked(&TAGGED_WRITE[..len]).is_err());
        }
        // Exactly a header: empty payload.
        let (_, payload) = DdpHeader::parse(&TAGGED_WRITE[..14]).unwrap();
        assert!(payload.is_empty());
        let (_, payload) = DdpHeader::parse(&RFC5044_FIG5_ULPDU[..18]).unwrap();
        assert!(payload.is_empty());
    }

    #[test]
    fn emit_into_short_buffer_writes_nothing() {
        let (hdr, _) = DdpHeader::parse(&RFC5044_FIG5_ULPDU).unwrap();
        let mut short = [0x55u8; 17];
        assert_eq!(hdr.emit(&mut short), 0);
        assert_eq!(short, [0x55; 17]);
        let (hdr, _) = DdpHeader::parse(&TAGGED_WRITE).unwrap();
        let mut short = [0x55u8; 13];
        assert_eq!(hdr.emit(&mut short), 0);
        assert_eq!(short, [0x55; 13]);
        assert_eq!(hdr.emit(&mut []), 0);
    }

    #[test]
    fn segment_view_untagged() {
        let seg = DdpSegment::new_checked(&RFC5044_FIG5_ULPDU[..]).unwrap();
        assert!(!seg.is_tagged());
        assert!(seg.is_last());
        assert_eq!(seg.version(), 1);
        assert_eq!(seg.rsvd_ulp_first(), 0x43);
        assert_eq!(seg.qn(), Some(0));
        assert_eq!(seg.msn(), Some(1));
        assert_eq!(seg.mo(), Some(0));
        assert_eq!(seg.stag(), None);
        assert_eq!(seg.to(), None);
        assert_eq!(seg.payload().len(), 24);
        assert_eq!(seg.header().unwrap().header_len(), 18);
        assert_eq!(seg.into_inner().len(), 42);
    }

    #[test]
    fn segment_view_tagged() {
        let seg = DdpSegment::new_checked(TAGGED_WRITE).unwrap();
        assert!(seg.is_tagged());
        assert!(!seg.is_last());
        assert_eq!(seg.stag(), Some(0x1234_5678));
        assert_eq!(seg.to(), Some(0x0102_0304_0506_0708));
        assert_eq!(seg.qn(), None);
        assert_eq!(seg.msn(), None);
        assert_eq!(seg.mo(), None);
        assert_eq!(seg.payload(), &[0xaa, 0xbb]);
    }

    #[test]
    fn unchecked_view_of_short_buffer_does_not_panic() {
        let seg = DdpSegment::new_unchecked([0x41u8, 0x43, 0, 0]);
        assert_eq!(seg.qn(), None);
        assert_eq!(seg.msn(), None);
        assert_eq!(seg.payload(), &[] as &[u8]);
        let empty = DdpSegment::new_unchecked([0u8; 0]);
        assert!(!empty.is_tagged());
        assert_eq!(empty.rsvd_ulp_first(), 0);
        assert!(empty.check().is_err());
    }

    #[test]
    fn headers_for_planned_segments() {
        // RFC 5041 5.2 tagged example: 2048 octets at initial TO 16384, MULPDU 1500.
        let plans: Vec<_> = crate::Segmenter::new(2048, 1500 - TAGGED_HEADER_LEN).collect();
        let tos: Vec<_> = plans
            .iter()
            .map(|p| TaggedHeader::for_segment(p, 0x40, 7, 16384))
            .map(|h| (h.to, h.last, h.stag, h.rsvd_ulp))
            .collect();
        assert_eq!(tos, vec![(16384, false, 7, 0x40), (17870, true, 7, 0x40)]);
        // ...and the untagged one: MO 0 then 1482.
        let plans: Vec<_> = crate::Segmenter::new(2048, 1500 - UNTAGGED_HEADER_LEN).collect();
        let mos: Vec<_> = plans
            .iter()
            .map(|p| UntaggedHeader::for_segment(p, [0x43, 0, 0, 0, 0], 0, 5).unwrap())
            .map(|h| (h.mo, h.last, h.msn))
            .collect();
        assert_eq!(mos, vec![(0, false, 5), (1482, true, 5)]);
        let too_far = SegmentPlan {
            offset: 1 << 32,
            len: 1,
            last: true,
        };
        assert_eq!(UntaggedHeader::for_segment(&too_far, [0; 5], 0, 1), None);
        let wrapping = TaggedHeader::for_segment(&too_far, 0, 0, u64::MAX);
        assert_eq!(wrapping.to, (1 << 32) - 1);
    }

    #[test]
    fn round_trip_both_models() {
        let headers = [
            DdpHeader::Tagged(TaggedHeader {
                last: true,
                rsvd_ulp: 0xff,
                stag: u32::MAX,
                to: u64::MAX,
            }),
            DdpHeader::Untagged(UntaggedHeader {
                last: false,
                rsvd_ulp: [1, 2, 3, 4, 5],
                qn: 3,
                msn: u32::MAX,
                mo: 0xdead_beef,
            }),
        ];
        for hdr in headers {
            let mut buf = [0u8; 32];
            let n = hdr.emit(&mut buf);
            assert_eq!(n, hdr.header_len());
            buf[n] = 0x99;
            let (parsed, payload) = DdpHeader::parse(&buf[..n + 1]).unwrap();
            assert_eq!(parsed, hdr);
            assert_eq!(payload, &[0x99]);
        }
    }
}
