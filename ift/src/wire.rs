//! IFT on the wire: the adaption indication (draft section 4.1) and the frame header (section
//! 5.1), each as a checked view over octets and a `Repr` with `parse` and `emit`.

use crate::error::IftError;

/// The adaption indication is exactly 64 octets (section 4.1).
pub const INDICATION_LEN: usize = 64;
/// Its magic number, "RDDP" in ASCII.
pub const MAGIC: u32 = 0x5244_4450;
/// The protocol version this crate implements (section 4.2: "MUST have value of one").
pub const VERSION: u16 = 1;
/// The oldest version this one is backward compatible with (section 4.2: 1).
pub const BC_VERSION: u16 = 1;
/// The frame header: header_size, payload_size and the receiver's VTag, 16 bits each
/// (section 5.1), the octets before the DDP header.
pub const FRAME_HEADER_LEN: usize = 6;
/// A header or payload CRC (CRC32c).
pub const CRC_LEN: usize = 4;

mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: Range<usize> = 4..6;
    pub const BC_VERSION: Range<usize> = 6..8;
    pub const FLAGS: Range<usize> = 8..12;
    pub const VTAG: Range<usize> = 12..14;
    pub const MARKER_INTERVAL: Range<usize> = 14..16;
    /// 44 reserved octets: zero when sent, ignored when received.
    pub const RESERVED: Range<usize> = 16..60;
    pub const CRC: Range<usize> = 60..64;

    pub const HEADER_SIZE: Range<usize> = 0..2;
    pub const PAYLOAD_SIZE: Range<usize> = 2..4;
    pub const FRAME_VTAG: Range<usize> = 4..6;
}

/// The flag bits of the adaption indication, from the most significant bit of the 32-bit flag
/// field on (section 4.2); the rest are reserved.
pub mod flags {
    /// PH: phase 1 (the reply) when set, phase 0 (the initiator's) when clear.
    pub const PH: u32 = 1 << 31;
    /// R: the sender wants RDMA mode (both set: RDMA, both clear: DDP, else an error).
    pub const R: u32 = 1 << 30;
    /// HC: the sender includes a header CRC in its frames.
    pub const HC: u32 = 1 << 29;
    /// PC: the sender includes a payload CRC in its frames.
    pub const PC: u32 = 1 << 28;
    /// IH: the sender ignores (does not check) the header CRCs it receives.
    pub const IH: u32 = 1 << 27;
    /// IP: the sender ignores (does not check) the payload CRCs it receives.
    pub const IP: u32 = 1 << 26;
    /// SP: the receiver of this indication may place speculatively (section 8).
    pub const SP: u32 = 1 << 25;
    /// SM: the sender is willing to send periodic Markers.
    pub const SM: u32 = 1 << 24;
    /// RM: the sender wishes to receive periodic Markers.
    pub const RM: u32 = 1 << 23;
    /// Every defined flag.
    pub const DEFINED: u32 = PH | R | HC | PC | IH | IP | SP | SM | RM;
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// The CRC field's value from its four octets: CRC32c on the wire as MPA sends it (RFC 5044
/// 4.4, least significant octet first; the draft names the same iSCSI CRC).
pub fn crc_from_wire(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The four octets of a CRC field (see [`crc_from_wire`]).
pub fn crc_to_wire(crc: u32) -> [u8; CRC_LEN] {
    crc.to_le_bytes()
}

/// A checked view of an adaption indication: at least [`INDICATION_LEN`] octets.
#[derive(Debug, Clone, Copy)]
pub struct Indication<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Indication<T> {
    /// The view, or `None` when `buffer` is shorter than an indication.
    pub fn new_checked(buffer: T) -> Option<Self> {
        (buffer.as_ref().len() >= INDICATION_LEN).then_some(Indication { buffer })
    }

    fn b(&self) -> &[u8] {
        &self.buffer.as_ref()[..INDICATION_LEN]
    }

    /// The magic number field.
    pub fn magic(&self) -> u32 {
        be32(&self.b()[field::MAGIC])
    }

    /// The version field.
    pub fn version(&self) -> u16 {
        be16(&self.b()[field::VERSION])
    }

    /// The BC (backward compatible) version field.
    pub fn bc_version(&self) -> u16 {
        be16(&self.b()[field::BC_VERSION])
    }

    /// The flag field ([`flags`]).
    pub fn flags(&self) -> u32 {
        be32(&self.b()[field::FLAGS])
    }

    /// The sender's VTag.
    pub fn vtag(&self) -> u16 {
        be16(&self.b()[field::VTAG])
    }

    /// The marker interval field.
    pub fn marker_interval(&self) -> u16 {
        be16(&self.b()[field::MARKER_INTERVAL])
    }

    /// The CRC field.
    pub fn crc(&self) -> u32 {
        crc_from_wire(&self.b()[field::CRC])
    }

    /// The CRC32c of the 60 octets the CRC field covers.
    pub fn computed_crc(&self) -> u32 {
        mpa::crc::crc32c(&self.b()[..field::CRC.start])
    }
}

/// The two phases of the adaption exchange (PH, section 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Sent by the initiator (node A).
    Zero,
    /// Sent back by the responder (node B) on receipt of phase 0.
    One,
}

impl Phase {
    /// 0 or 1.
    pub fn number(self) -> u8 {
        match self {
            Phase::Zero => 0,
            Phase::One => 1,
        }
    }
}

/// An adaption indication's content (section 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndicationRepr {
    /// Protocol version (we send [`VERSION`]).
    pub version: u16,
    /// Backward compatible version (we send [`BC_VERSION`]).
    pub bc_version: u16,
    /// PH.
    pub phase: Phase,
    /// R: RDMA mode wanted.
    pub rdma: bool,
    /// HC: the sender's frames carry a header CRC.
    pub header_crc: bool,
    /// PC: the sender's frames carry a payload CRC.
    pub payload_crc: bool,
    /// IH: the sender does not check the header CRCs it receives.
    pub ignores_header_crc: bool,
    /// IP: the sender does not check the payload CRCs it receives.
    pub ignores_payload_crc: bool,
    /// SP: the receiver of this indication may place speculatively.
    pub speculative: bool,
    /// SM: the sender would send Markers.
    pub sends_markers: bool,
    /// RM: the sender wants to receive Markers.
    pub wants_markers: bool,
    /// The sender's VTag: every frame the receiver of this indication sends carries it.
    pub vtag: u16,
    /// The marker interval (0: none).
    pub marker_interval: u16,
}

impl IndicationRepr {
    /// Parses and checks an indication: the magic number, the CRC, and the BC version (above
    /// ours, 0, or above the version: [`IftError::IncompatibleVersion`]; a higher version with
    /// an acceptable BC version is accepted, section 4.2). Reserved flag bits and octets are
    /// ignored.
    pub fn parse<T: AsRef<[u8]>>(ind: &Indication<T>) -> Result<IndicationRepr, IftError> {
        if ind.magic() != MAGIC {
            return Err(IftError::BadMagic { found: ind.magic() });
        }
        let (found, computed) = (ind.crc(), ind.computed_crc());
        if found != computed {
            return Err(IftError::IndicationCrc { found, computed });
        }
        // Section 4.2: a BC version above ours is incompatible; one of 0 (no version is 0),
        // or a version below its own BC version, is no indication of any version.
        if ind.bc_version() > VERSION || ind.bc_version() == 0 || ind.version() < ind.bc_version() {
            return Err(IftError::IncompatibleVersion {
                version: ind.version(),
                bc_version: ind.bc_version(),
            });
        }
        let f = ind.flags();
        let on = |bit: u32| f & bit != 0;
        Ok(IndicationRepr {
            version: ind.version(),
            bc_version: ind.bc_version(),
            phase: if on(flags::PH) {
                Phase::One
            } else {
                Phase::Zero
            },
            rdma: on(flags::R),
            header_crc: on(flags::HC),
            payload_crc: on(flags::PC),
            ignores_header_crc: on(flags::IH),
            ignores_payload_crc: on(flags::IP),
            speculative: on(flags::SP),
            sends_markers: on(flags::SM),
            wants_markers: on(flags::RM),
            vtag: ind.vtag(),
            marker_interval: ind.marker_interval(),
        })
    }

    /// Parses the first [`INDICATION_LEN`] octets of `bytes` (`None` if there are fewer).
    pub fn parse_bytes(bytes: &[u8]) -> Option<Result<IndicationRepr, IftError>> {
        Indication::new_checked(bytes).map(|v| IndicationRepr::parse(&v))
    }

    /// The flag field.
    pub fn flags(&self) -> u32 {
        let mut f = 0;
        for (on, bit) in [
            (self.phase == Phase::One, flags::PH),
            (self.rdma, flags::R),
            (self.header_crc, flags::HC),
            (self.payload_crc, flags::PC),
            (self.ignores_header_crc, flags::IH),
            (self.ignores_payload_crc, flags::IP),
            (self.speculative, flags::SP),
            (self.sends_markers, flags::SM),
            (self.wants_markers, flags::RM),
        ] {
            if on {
                f |= bit;
            }
        }
        f
    }

    /// The 64 octets: fields, reserved octets zero, CRC over the 60 before it.
    pub fn to_bytes(&self) -> [u8; INDICATION_LEN] {
        let mut b = [0u8; INDICATION_LEN];
        b[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
        b[field::VERSION].copy_from_slice(&self.version.to_be_bytes());
        b[field::BC_VERSION].copy_from_slice(&self.bc_version.to_be_bytes());
        b[field::FLAGS].copy_from_slice(&self.flags().to_be_bytes());
        b[field::VTAG].copy_from_slice(&self.vtag.to_be_bytes());
        b[field::MARKER_INTERVAL].copy_from_slice(&self.marker_interval.to_be_bytes());
        debug_assert!(b[field::RESERVED].iter().all(|&x| x == 0));
        let crc = mpa::crc::crc32c(&b[..field::CRC.start]);
        b[field::CRC].copy_from_slice(&crc_to_wire(crc));
        b
    }
}

/// A checked view of a frame's header: at least [`FRAME_HEADER_LEN`] octets.
#[derive(Debug, Clone, Copy)]
pub struct FrameHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> FrameHeader<T> {
    /// The view, or `None` when `buffer` is shorter than a frame header.
    pub fn new_checked(buffer: T) -> Option<Self> {
        (buffer.as_ref().len() >= FRAME_HEADER_LEN).then_some(FrameHeader { buffer })
    }

    /// Octets of the DDP header.
    pub fn header_size(&self) -> u16 {
        be16(&self.buffer.as_ref()[field::HEADER_SIZE])
    }

    /// Octets of the DDP payload.
    pub fn payload_size(&self) -> u16 {
        be16(&self.buffer.as_ref()[field::PAYLOAD_SIZE])
    }

    /// The receiver's VTag.
    pub fn vtag(&self) -> u16 {
        be16(&self.buffer.as_ref()[field::FRAME_VTAG])
    }
}

/// A frame header's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeaderRepr {
    /// Octets of the DDP header.
    pub header_size: u16,
    /// Octets of the DDP payload (RDMAP headers included).
    pub payload_size: u16,
    /// The receiver's VTag.
    pub vtag: u16,
}

impl FrameHeaderRepr {
    /// The header's fields (no check: the decoder checks them against the DDP header and the
    /// negotiated VTag).
    pub fn parse<T: AsRef<[u8]>>(h: &FrameHeader<T>) -> FrameHeaderRepr {
        FrameHeaderRepr {
            header_size: h.header_size(),
            payload_size: h.payload_size(),
            vtag: h.vtag(),
        }
    }

    /// Writes the six octets into `out[..FRAME_HEADER_LEN]`.
    pub fn emit(&self, out: &mut [u8]) {
        out[field::HEADER_SIZE].copy_from_slice(&self.header_size.to_be_bytes());
        out[field::PAYLOAD_SIZE].copy_from_slice(&self.payload_size.to_be_bytes());
        out[field::FRAME_VTAG].copy_from_slice(&self.vtag.to_be_bytes());
    }
}

/// Octets of a whole frame: header, DDP header, header CRC if `header_crc`, payload, payload
/// CRC if `payload_crc` (no padding, section 5.1).
pub fn frame_len(
    header_size: usize,
    payload_size: usize,
    header_crc: bool,
    payload_crc: bool,
) -> usize {
    FRAME_HEADER_LEN
        + header_size
        + if header_crc { CRC_LEN } else { 0 }
        + payload_size
        + if payload_crc { CRC_LEN } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Section 4.1's figure, octet by octet: magic, version 1, BC version 1, flags PH R HC PC
    /// SP (the MSB first), VTag 0xBEEF, marker interval 0, 44 reserved zeros, CRC.
    fn figure() -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..4].copy_from_slice(&[0x52, 0x44, 0x44, 0x50]);
        b[4..8].copy_from_slice(&[0x00, 0x01, 0x00, 0x01]);
        // PH (bit 31), R (30), HC (29), PC (28), SP (25): 1111 0010 ...
        b[8..12].copy_from_slice(&[0xF2, 0x00, 0x00, 0x00]);
        b[12..16].copy_from_slice(&[0xBE, 0xEF, 0x00, 0x00]);
        let crc = mpa::crc::crc32c(&b[..60]);
        b[60..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn repr() -> IndicationRepr {
        IndicationRepr {
            version: 1,
            bc_version: 1,
            phase: Phase::One,
            rdma: true,
            header_crc: true,
            payload_crc: true,
            ignores_header_crc: false,
            ignores_payload_crc: false,
            speculative: true,
            sends_markers: false,
            wants_markers: false,
            vtag: 0xBEEF,
            marker_interval: 0,
        }
    }

    #[test]
    fn indication_from_the_figure() {
        let b = figure();
        let view = Indication::new_checked(&b[..]).unwrap();
        assert_eq!(view.magic(), MAGIC);
        assert_eq!((view.version(), view.bc_version()), (1, 1));
        assert_eq!(view.flags(), 0xF200_0000);
        assert_eq!(IndicationRepr::parse(&view), Ok(repr()));
        assert_eq!(repr().to_bytes(), b);
    }

    #[test]
    fn every_flag_has_its_bit() {
        let all = IndicationRepr {
            phase: Phase::One,
            rdma: true,
            header_crc: true,
            payload_crc: true,
            ignores_header_crc: true,
            ignores_payload_crc: true,
            speculative: true,
            sends_markers: true,
            wants_markers: true,
            ..repr()
        };
        assert_eq!(all.flags(), 0xFF80_0000);
        assert_eq!(all.flags(), flags::DEFINED);
        let b = all.to_bytes();
        assert_eq!(IndicationRepr::parse_bytes(&b), Some(Ok(all)));
        // One flag at a time round-trips to itself alone.
        for bit in 0..9 {
            let mut b = repr().to_bytes();
            b[8..12].copy_from_slice(&(1u32 << (31 - bit)).to_be_bytes());
            let crc = mpa::crc::crc32c(&b[..60]);
            b[60..].copy_from_slice(&crc.to_le_bytes());
            let r = IndicationRepr::parse_bytes(&b).unwrap().unwrap();
            assert_eq!(r.flags(), 1 << (31 - bit), "bit {bit}");
        }
    }

    #[test]
    fn reserved_bits_and_octets_are_ignored() {
        let mut b = figure();
        b[11] |= 0x7F; // reserved flag bits
        b[30] = 0xAA; // a reserved octet
        let crc = mpa::crc::crc32c(&b[..60]);
        b[60..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(IndicationRepr::parse_bytes(&b), Some(Ok(repr())));
    }

    #[test]
    fn bad_magic_crc_and_versions() {
        let mut b = figure();
        b[..4].copy_from_slice(b"MPA ");
        let e = IndicationRepr::parse_bytes(&b).unwrap().unwrap_err();
        assert_eq!(e, IftError::BadMagic { found: 0x4D50_4120 });
        assert!(e.to_string().contains("speaks MPA"), "{e}");

        let mut b = figure();
        b[13] ^= 1;
        assert!(matches!(
            IndicationRepr::parse_bytes(&b),
            Some(Err(IftError::IndicationCrc { .. }))
        ));

        // A higher version with BC version 1 is accepted; BC version 2 is not.
        let newer = IndicationRepr {
            version: 3,
            ..repr()
        };
        assert_eq!(
            IndicationRepr::parse_bytes(&newer.to_bytes()),
            Some(Ok(newer))
        );
        let incompatible = IndicationRepr {
            version: 2,
            bc_version: 2,
            ..repr()
        };
        assert_eq!(
            IndicationRepr::parse_bytes(&incompatible.to_bytes()),
            Some(Err(IftError::IncompatibleVersion {
                version: 2,
                bc_version: 2
            }))
        );
        // BC version 0, and a version below its BC version: no indication of any version.
        for (version, bc_version) in [(1, 0), (0, 0), (0, 1)] {
            let odd = IndicationRepr {
                version,
                bc_version,
                ..repr()
            };
            assert_eq!(
                IndicationRepr::parse_bytes(&odd.to_bytes()),
                Some(Err(IftError::IncompatibleVersion {
                    version,
                    bc_version
                })),
                "version {version}, BC version {bc_version}"
            );
        }
        assert_eq!(IndicationRepr::parse_bytes(&figure()[..63]), None);
    }

    #[test]
    fn frame_header_fields() {
        let h = FrameHeaderRepr {
            header_size: 14,
            payload_size: 0x1234,
            vtag: 0xBEEF,
        };
        let mut b = [0u8; 6];
        h.emit(&mut b);
        assert_eq!(b, [0x00, 0x0E, 0x12, 0x34, 0xBE, 0xEF]);
        let view = FrameHeader::new_checked(&b[..]).unwrap();
        assert_eq!(FrameHeaderRepr::parse(&view), h);
        assert_eq!(frame_len(14, 3, true, false), 6 + 14 + 4 + 3);
        assert_eq!(frame_len(18, 5, false, true), 6 + 18 + 5 + 4);
    }
}
