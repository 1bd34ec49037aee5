//! The TCP RDMA option (draft-csapuntz-tcprdma-00, option kind 25): an annotation on a segment
//! that carries data of an RDMA transfer, saying where in the segment that data lies and where
//! in the receiver's buffer it goes, so that a receiver which understands it can place the data
//! without parsing the application protocol, while one that does not reads an ordinary stream.
//!
//! ```text
//!  Byte/       0     |       1       |       2       |       3       |
//!     |7 6 5 4 3 2 1 0|7 6 5 4 3 2 1 0|7 6 5 4 3 2 1 0|7 6 5 4 3 2 1 0|
//!     +---------------+---------------+-+-+---------------------------+
//!   0 |      25       |    Length     |A|U|       RDMA ID             |
//!     +---------------+---------------+-+-+---------------------------+
//!   4 |                         RDMA ID (RID)                         |
//!     +---------------------------------------------------------------+
//!   8 |                         Buffer Offset                         |
//!     +-------------------------------+-------------------------------+
//!  12 |          Data  Offset         |          Data Length          |
//!     +-------------------------------+-------------------------------+
//!  16 |                       Total RDMA Length                       |
//!     +---------------------------------------------------------------+
//! ```
//!
//! (Section 3.1.) Lengths 2 (negotiation, 3.2), 4 (the A and U bits and the RID's upper 14
//! bits, 3.1.6), 16 (a transfer of unknown total length, 3.1.4) and 20. [`RdmaOptionView`] is the
//! checked view of the octets, [`RdmaOption`] the representation with `parse`/`emit`.

use std::ops::Range;

/// The option's kind (section 3.1).
pub const KIND: u8 = 25;

/// Errors of the RDMA option: a receiver treats a segment whose option has one as ordinary
/// data (the option is an annotation; the stream stays valid without it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RdmaOptionError {
    /// Not kind 25.
    #[error("not an RDMA option (kind {0})")]
    NotRdma(u8),
    /// A length other than 2, 4, 16 or 20 (section 3.1).
    #[error("RDMA option length {0} (2, 4, 16 or 20)")]
    BadLength(u8),
    /// Fewer octets than the length field says.
    #[error("RDMA option truncated")]
    Truncated,
    /// A RID of more than 46 bits (section 3.1.1).
    #[error("RID over 46 bits")]
    RidTooLarge,
    /// The data offset lies past the end of the segment's payload (3.1.2).
    #[error("data offset {offset} past the payload ({payload} octets)")]
    DataOffsetPastPayload {
        /// The option's Data Offset.
        offset: u16,
        /// The segment's payload length.
        payload: usize,
    },
    /// The data described runs past the end of the segment (3.1.3).
    #[error("data [{offset}, +{length}) past the payload ({payload} octets)")]
    DataPastPayload {
        /// The option's Data Offset.
        offset: u16,
        /// The option's Data Length.
        length: u16,
        /// The segment's payload length.
        payload: usize,
    },
    /// The output buffer is too small.
    #[error("output buffer too small")]
    BufferTooSmall,
}

/// An RDMA transfer identifier: 46 bits, laid out in network order from bit 5 of the option's
/// byte 2 to bit 0 of byte 7 (section 3.1.1). Its format belongs to the protocol above (for
/// HTTP/1.1, the request's index, section 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Rid(u64);

impl Rid {
    /// The largest RID: 2^46 - 1.
    pub const MAX: u64 = (1 << 46) - 1;

    /// A RID, if `v` fits 46 bits.
    pub fn new(v: u64) -> Result<Rid, RdmaOptionError> {
        if v > Rid::MAX {
            return Err(RdmaOptionError::RidTooLarge);
        }
        Ok(Rid(v))
    }

    /// The value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The upper 14 bits, as the 4-octet form carries them (bits 45-32).
    pub fn high_bits(self) -> u16 {
        (self.0 >> 32) as u16
    }
}

/// The A (message aligned, 3.1.6) and U (unsolicited, 3.1.7) bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RdmaFlags {
    /// A: byte 0 of the segment's payload starts an application-layer message.
    pub aligned: bool,
    /// U: the receiver did not ask for this RID (a transfer on a request, e.g. an NFS write).
    pub unsolicited: bool,
}

/// What a segment says about the data of one RDMA transfer (the 16- and 20-octet forms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaTransfer {
    /// The A and U bits.
    pub flags: RdmaFlags,
    /// The transfer (3.1.1).
    pub rid: Rid,
    /// Where in the receiver's buffer the data goes (3.1.5).
    pub buffer_offset: u32,
    /// Where in the segment's payload the data starts (3.1.2).
    pub data_offset: u16,
    /// How many octets of the transfer the segment carries (3.1.3); 0 is valid.
    pub data_length: u16,
    /// The transfer's total length, the same on every segment of it (3.1.4); `None` when the
    /// sender did not know it (the 16-octet form).
    pub total_length: Option<u32>,
}

impl RdmaTransfer {
    /// The range of the segment's payload (`payload` octets) that holds the transfer's data,
    /// checked as sections 3.1.2 and 3.1.3 require of the sender; a receiver treats a segment
    /// that fails as ordinary data.
    pub fn data_range(&self, payload: usize) -> Result<Range<usize>, RdmaOptionError> {
        let offset = usize::from(self.data_offset);
        if offset > payload {
            return Err(RdmaOptionError::DataOffsetPastPayload {
                offset: self.data_offset,
                payload,
            });
        }
        let end = offset + usize::from(self.data_length);
        if end > payload {
            return Err(RdmaOptionError::DataPastPayload {
                offset: self.data_offset,
                length: self.data_length,
                payload,
            });
        }
        Ok(offset..end)
    }

    /// The range of the receiver's buffer the data goes to.
    pub fn buffer_range(&self) -> Range<u64> {
        let start = u64::from(self.buffer_offset);
        start..start + u64::from(self.data_length)
    }
}

/// The RDMA option, in one of its four forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaOption {
    /// Length 2: sent on the SYN and the SYN-ACK to offer the option (section 3.2); carries
    /// nothing, so no segment can be taken for part of a transfer by accident.
    Permitted,
    /// Length 4: only the A and U bits (and the RID's upper 14 bits), for a sender that only
    /// wants to say that the payload starts a message (3.1.6).
    Flags {
        /// The A and U bits.
        flags: RdmaFlags,
        /// The RID's bits 45-32.
        rid_high: u16,
    },
    /// Length 16 (no total length) or 20: the segment's data of one transfer.
    Transfer(RdmaTransfer),
}

impl RdmaOption {
    /// Octets on the wire (the length field).
    pub fn len(&self) -> usize {
        match self {
            RdmaOption::Permitted => 2,
            RdmaOption::Flags { .. } => 4,
            RdmaOption::Transfer(t) if t.total_length.is_some() => 20,
            RdmaOption::Transfer(_) => 16,
        }
    }

    /// Never empty: kind and length at least.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Reads the option from a checked view.
    pub fn parse<T: AsRef<[u8]>>(view: &RdmaOptionView<T>) -> RdmaOption {
        match view.length() {
            2 => RdmaOption::Permitted,
            4 => RdmaOption::Flags {
                flags: view.flags(),
                rid_high: view.rid_high(),
            },
            n => RdmaOption::Transfer(RdmaTransfer {
                flags: view.flags(),
                rid: view.rid(),
                buffer_offset: view.buffer_offset(),
                data_offset: view.data_offset(),
                data_length: view.data_length(),
                total_length: (n == 20).then(|| view.total_length()),
            }),
        }
    }

    /// Writes the option (kind, length and fields) to the start of `out`; returns the octets
    /// written.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, RdmaOptionError> {
        let n = self.len();
        let out = out.get_mut(..n).ok_or(RdmaOptionError::BufferTooSmall)?;
        out[0] = KIND;
        out[1] = n as u8;
        let flag_byte = |f: RdmaFlags, high: u8| {
            (u8::from(f.aligned) << 7) | (u8::from(f.unsolicited) << 6) | (high & 0x3f)
        };
        match self {
            RdmaOption::Permitted => {}
            RdmaOption::Flags { flags, rid_high } => {
                let h = (rid_high & 0x3fff).to_be_bytes();
                out[2] = flag_byte(*flags, h[0]);
                out[3] = h[1];
            }
            RdmaOption::Transfer(t) => {
                let rid = t.rid.get().to_be_bytes();
                out[2] = flag_byte(t.flags, rid[2]);
                out[3..8].copy_from_slice(&rid[3..8]);
                out[8..12].copy_from_slice(&t.buffer_offset.to_be_bytes());
                out[12..14].copy_from_slice(&t.data_offset.to_be_bytes());
                out[14..16].copy_from_slice(&t.data_length.to_be_bytes());
                if let Some(total) = t.total_length {
                    out[16..20].copy_from_slice(&total.to_be_bytes());
                }
            }
        }
        Ok(n)
    }
}

/// A checked view of an RDMA option's octets (kind, length and as many octets as the length
/// says; the slice may run on).
#[derive(Debug, Clone, Copy)]
pub struct RdmaOptionView<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> RdmaOptionView<T> {
    /// Checks kind 25, a length of 2, 4, 16 or 20, and that the octets are there.
    pub fn new_checked(buf: T) -> Result<Self, RdmaOptionError> {
        let b = buf.as_ref();
        let (&kind, &len) = match b {
            [k, l, ..] => (k, l),
            _ => return Err(RdmaOptionError::Truncated),
        };
        if kind != KIND {
            return Err(RdmaOptionError::NotRdma(kind));
        }
        if !matches!(len, 2 | 4 | 16 | 20) {
            return Err(RdmaOptionError::BadLength(len));
        }
        if b.len() < usize::from(len) {
            return Err(RdmaOptionError::Truncated);
        }
        Ok(RdmaOptionView { buf })
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// The length field: 2, 4, 16 or 20.
    pub fn length(&self) -> u8 {
        self.b()[1]
    }

    /// The A and U bits (zero in the 2-octet form).
    pub fn flags(&self) -> RdmaFlags {
        if self.length() < 4 {
            return RdmaFlags::default();
        }
        let b = self.b()[2];
        RdmaFlags {
            aligned: b & 0x80 != 0,
            unsolicited: b & 0x40 != 0,
        }
    }

    /// The RID's bits 45-32 (zero in the 2-octet form).
    pub fn rid_high(&self) -> u16 {
        if self.length() < 4 {
            return 0;
        }
        u16::from_be_bytes([self.b()[2] & 0x3f, self.b()[3]])
    }

    /// The RID (the 16- and 20-octet forms; the upper bits only otherwise).
    pub fn rid(&self) -> Rid {
        if self.length() < 16 {
            return Rid(u64::from(self.rid_high()) << 32);
        }
        let b = self.b();
        let mut r = [0u8; 8];
        r[2] = b[2] & 0x3f;
        r[3..8].copy_from_slice(&b[3..8]);
        Rid(u64::from_be_bytes(r))
    }

    fn word(&self, at: usize) -> u32 {
        if usize::from(self.length()) < at + 4 {
            return 0;
        }
        let b = self.b();
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// Buffer Offset (0 in the short forms).
    pub fn buffer_offset(&self) -> u32 {
        self.word(8)
    }

    /// Data Offset (0 in the short forms).
    pub fn data_offset(&self) -> u16 {
        (self.word(12) >> 16) as u16
    }

    /// Data Length (0 in the short forms).
    pub fn data_length(&self) -> u16 {
        self.word(12) as u16
    }

    /// Total RDMA Length (0 unless the 20-octet form).
    pub fn total_length(&self) -> u32 {
        self.word(16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(rid: u64, buffer: u32, data: u16, len: u16, total: Option<u32>) -> RdmaOption {
        RdmaOption::Transfer(RdmaTransfer {
            flags: RdmaFlags::default(),
            rid: Rid::new(rid).expect("rid"),
            buffer_offset: buffer,
            data_offset: data,
            data_length: len,
            total_length: total,
        })
    }

    fn roundtrip(o: RdmaOption) -> Vec<u8> {
        let mut b = [0u8; 20];
        let n = o.emit(&mut b).expect("emit");
        assert_eq!(n, o.len());
        let view = RdmaOptionView::new_checked(&b[..n]).expect("view");
        assert_eq!(RdmaOption::parse(&view), o);
        b[..n].to_vec()
    }

    #[test]
    fn the_rid_is_laid_out_as_section_3_1_1_says() {
        // Bits 40-45 of the RID in bits 0-5 of byte 2, bits 0-7 in byte 7; A is bit 7 of
        // byte 2, U bit 6.
        let o = RdmaOption::Transfer(RdmaTransfer {
            flags: RdmaFlags {
                aligned: true,
                unsolicited: false,
            },
            rid: Rid::new(0x2abb_ccdd_eeff).expect("rid"),
            buffer_offset: 0x0102_0304,
            data_offset: 0x0506,
            data_length: 0x0708,
            total_length: Some(0x090a_0b0c),
        });
        assert_eq!(
            roundtrip(o),
            [
                25,
                20,
                0x80 | 0x2a,
                0xbb,
                0xcc,
                0xdd,
                0xee,
                0xff,
                1,
                2,
                3,
                4,
                5,
                6,
                7,
                8,
                9,
                10,
                11,
                12
            ]
        );
        let u = RdmaOption::Flags {
            flags: RdmaFlags {
                aligned: false,
                unsolicited: true,
            },
            rid_high: 0x3fff,
        };
        assert_eq!(roundtrip(u), [25, 4, 0x40 | 0x3f, 0xff]);
        assert_eq!(roundtrip(RdmaOption::Permitted), [25, 2]);
        assert_eq!(
            roundtrip(transfer(Rid::MAX, 0, 0, 0, None)),
            [25, 16, 0x3f, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(Rid::new(Rid::MAX + 1), Err(RdmaOptionError::RidTooLarge));
    }

    /// Section 4's example: one transfer in two sections of the stream (100-2100 and
    /// 2300-4300, 4000 octets in all), MSS 1000: both segmentations the draft tabulates, each
    /// segment's option checked against the segment and the buffer range it names.
    #[test]
    fn section_4_segmentations() {
        // (sequence number, payload length, buffer offset, data offset, data length)
        let first = [
            (0u32, 1000usize, 0u32, 100u16, 900u16),
            (1000, 1000, 900, 0, 1000),
            (2000, 200, 1900, 0, 100),
            (2200, 1000, 2000, 100, 900),
            (3200, 1000, 2900, 0, 1000),
            (4200, 100, 3900, 0, 100),
        ];
        // Segment 3 carries the trailer and the next header too.
        let second = [
            (0u32, 1000usize, 0u32, 100u16, 900u16),
            (1000, 1000, 900, 0, 1000),
            (2000, 300, 1900, 0, 100),
            (2300, 1000, 2000, 0, 1000),
            (3300, 1000, 3000, 0, 1000),
        ];
        for table in [&first[..], &second[..]] {
            let mut buffer = vec![false; 4000];
            let mut end_of_stream = 0;
            for &(seq, payload, buf, off, len) in table {
                assert_eq!(seq, end_of_stream, "segments follow each other");
                end_of_stream = seq + payload as u32;
                let o = transfer(7, buf, off, len, Some(4000));
                let bytes = roundtrip(o);
                assert_eq!(&bytes[..2], &[25, 20]);
                assert_eq!(&bytes[8..12], &buf.to_be_bytes());
                assert_eq!(&bytes[12..14], &off.to_be_bytes());
                assert_eq!(&bytes[14..16], &len.to_be_bytes());
                assert_eq!(&bytes[16..20], &4000u32.to_be_bytes());
                let RdmaOption::Transfer(t) = o else {
                    unreachable!()
                };
                let data = t.data_range(payload).expect("within the segment");
                // The stream octets the data occupies lie in the transfer's sections.
                let (s, e) = (seq as usize + data.start, seq as usize + data.end);
                assert!(
                    (100..=2100).contains(&s) && e <= 2100
                        || (2300..=4300).contains(&s) && e <= 4300,
                    "{s}..{e}"
                );
                for i in t.buffer_range() {
                    assert!(!buffer[i as usize], "buffer octet {i} written twice");
                    buffer[i as usize] = true;
                }
            }
            assert!(buffer.iter().all(|&b| b), "every buffer octet written once");
        }
    }

    #[test]
    fn the_checks_of_sections_3_1_2_and_3_1_3() {
        let t = |off, len| RdmaTransfer {
            flags: RdmaFlags::default(),
            rid: Rid::default(),
            buffer_offset: 0,
            data_offset: off,
            data_length: len,
            total_length: None,
        };
        assert_eq!(t(0, 0).data_range(0), Ok(0..0));
        assert_eq!(t(10, 0).data_range(10), Ok(10..10));
        assert_eq!(t(10, 5).data_range(15), Ok(10..15));
        assert_eq!(
            t(11, 0).data_range(10),
            Err(RdmaOptionError::DataOffsetPastPayload {
                offset: 11,
                payload: 10
            })
        );
        assert_eq!(
            t(10, 6).data_range(15),
            Err(RdmaOptionError::DataPastPayload {
                offset: 10,
                length: 6,
                payload: 15
            })
        );
        assert_eq!(
            t(u16::MAX, u16::MAX).buffer_range().end,
            u64::from(u16::MAX)
        );
    }

    #[test]
    fn the_view_refuses_what_is_not_an_rdma_option() {
        assert_eq!(
            RdmaOptionView::new_checked(&[25u8][..]).err(),
            Some(RdmaOptionError::Truncated)
        );
        assert_eq!(
            RdmaOptionView::new_checked(&[8u8, 10][..]).err(),
            Some(RdmaOptionError::NotRdma(8))
        );
        for len in [0u8, 1, 3, 5, 12, 15, 17, 19, 21, 40, 255] {
            assert_eq!(
                RdmaOptionView::new_checked(&[25u8, len, 0, 0][..]).err(),
                Some(RdmaOptionError::BadLength(len)),
                "{len}"
            );
        }
        assert_eq!(
            RdmaOptionView::new_checked(&[25u8, 16, 0, 0][..]).err(),
            Some(RdmaOptionError::Truncated)
        );
        assert_eq!(
            transfer(1, 0, 0, 0, Some(0)).emit(&mut [0u8; 19]),
            Err(RdmaOptionError::BufferTooSmall)
        );
    }
}
