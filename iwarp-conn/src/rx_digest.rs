//! A received segment's data read once, before anything of it is placed: the TCP checksum's
//! share (RFC 9293 3.1) and, for a segment that is one whole FPDU (what an aligned sender
//! sends, RFC 5044 8.1), the CRC of that FPDU (section 4.4), from the same loads
//! (`copy_crc::crc32c_sum`). The checksum is decided first (`tcp_engine` asks for the sum
//! while it checks the segment), the CRC then by the FPDU decoder
//! ([`IwarpConn::on_data_with_crc`](crate::IwarpConn::on_data_with_crc)), and only then is the
//! payload copied into the destination, from cache: so the data is read from the frame once,
//! and data whose CRC failed is never placed.

use mpa::wire::CRC_LEN;

/// The sum and CRC of one received segment's data (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentDigest {
    /// The ones' complement sum of the data (as `tcp_engine::wire::Checksum::sum` gives it).
    pub sum: u16,
    /// When the data is exactly one FPDU by its ULPDU_Length (RFC 5044 4.1): the CRC32c of all
    /// of it but its last four octets, the octets the FPDU's CRC covers without Markers.
    pub fpdu_crc: Option<u32>,
}

impl SegmentDigest {
    /// Reads `payload` (a TCP segment's data) once for both.
    pub fn of(payload: &[u8]) -> SegmentDigest {
        let Some(covered) = one_fpdu(payload) else {
            return SegmentDigest {
                sum: tcp_engine::wire::Checksum::new().add_bytes(payload).sum(),
                fpdu_crc: None,
            };
        };
        let (head, crc_field) = payload.split_at(covered);
        let (state, sum) = copy_crc::crc32c_sum(head, u32::MAX);
        // `covered` is even (an FPDU is a multiple of four octets): the CRC field's octets
        // continue the sum at a word boundary.
        let sum = tcp_engine::wire::Checksum::new()
            .add_sum(sum)
            .add_short(crc_field)
            .sum();
        SegmentDigest {
            sum,
            fpdu_crc: Some(!state),
        }
    }
}

impl SegmentDigest {
    /// The digest of `payload` from a read done elsewhere (a copy that joined the frames of a
    /// multi-buffer packet): `sum`, the ones' complement sum of all of it, and `covered_crc`,
    /// the CRC32c of all of it but its last four octets, kept when `payload` is one FPDU.
    pub fn read(payload: &[u8], sum: u16, covered_crc: u32) -> SegmentDigest {
        SegmentDigest {
            sum,
            fpdu_crc: one_fpdu(payload).map(|_| covered_crc),
        }
    }
}

impl SegmentDigest {
    /// The FPDU CRC kept for the data TCP will pass up from this segment's `payload`: usable
    /// only if TCP passes up all of it, at once ([`HeldCrc::for_data`]). `None` if the segment
    /// was not one whole FPDU.
    pub fn hold(&self, payload: &[u8]) -> Option<HeldCrc> {
        self.fpdu_crc.map(|crc| HeldCrc {
            at: payload.as_ptr().addr(),
            len: payload.len(),
            crc,
        })
    }
}

/// A received segment's FPDU CRC ([`SegmentDigest::fpdu_crc`]) kept until TCP passes the
/// segment's data up, and the segment it belongs to. TCP may pass up less than the segment
/// (the part it had already, a part beyond its window) or data of another segment (what a
/// filled gap released): the CRC is for the whole segment's octets only, so the data passed up
/// must be exactly them, by address and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldCrc {
    at: usize,
    len: usize,
    crc: u32,
}

impl HeldCrc {
    /// The CRC for `data` if `data` is the whole segment it was computed over, else `None`
    /// (the decoder then computes the CRC itself).
    pub fn for_data(self, data: &[u8]) -> Option<u32> {
        (self.at == data.as_ptr().addr() && self.len == data.len()).then_some(self.crc)
    }
}

/// The length of what the CRC covers if `payload` is exactly one FPDU without Markers by its
/// ULPDU_Length field, else `None`.
fn one_fpdu(payload: &[u8]) -> Option<usize> {
    let header: [u8; 2] = *payload.first_chunk()?;
    let len = mpa::fpdu_end(0, usize::from(u16::from_be_bytes(header)), false);
    (len == payload.len() as u64).then(|| payload.len() - CRC_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpa::crc::crc32c;
    use mpa::FpduEncoder;
    use tcp_engine::wire::Checksum;

    fn fpdu(ulpdu_len: usize) -> Vec<u8> {
        let ulpdu: Vec<u8> = (0..ulpdu_len).map(|i| (i * 7 + 3) as u8).collect();
        let mut out = Vec::new();
        FpduEncoder::new(true, false)
            .encode(&ulpdu, &mut out)
            .unwrap();
        out
    }

    #[test]
    fn one_fpdu_gives_its_crc_and_the_plain_sum() {
        for n in [0usize, 1, 2, 3, 10, 61, 62, 63, 64, 100, 1000, 1434, 8000] {
            let wire = fpdu(n);
            let d = SegmentDigest::of(&wire);
            assert_eq!(
                d.sum,
                Checksum::new().add_bytes(&wire).sum(),
                "sum, ulpdu {n}"
            );
            let covered = &wire[..wire.len() - CRC_LEN];
            assert_eq!(d.fpdu_crc, Some(crc32c(covered)), "crc, ulpdu {n}");
            // The FPDU's own CRC field agrees.
            let field = u32::from_le_bytes(wire[wire.len() - 4..].try_into().unwrap());
            assert_eq!(d.fpdu_crc, Some(field));
        }
    }

    #[test]
    fn a_read_done_elsewhere_is_kept_for_one_fpdu_only() {
        let wire = fpdu(1000);
        let d = SegmentDigest::read(&wire, 0x1234, 0xabcd_ef01);
        assert_eq!(
            d,
            SegmentDigest {
                sum: 0x1234,
                fpdu_crc: Some(0xabcd_ef01)
            }
        );
        let mut two = fpdu(100);
        two.extend_from_slice(&fpdu(20));
        let d = SegmentDigest::read(&two, 0x1234, 0xabcd_ef01);
        assert_eq!(
            d,
            SegmentDigest {
                sum: 0x1234,
                fpdu_crc: None
            }
        );
    }

    #[test]
    fn a_held_crc_is_for_the_whole_segment_only() {
        let wire = fpdu(100);
        let held = SegmentDigest::of(&wire).hold(&wire).expect("one FPDU");
        assert_eq!(
            held.for_data(&wire),
            Some(crc32c(&wire[..wire.len() - CRC_LEN]))
        );
        // A part of it (TCP passed up only what was new), or the same octets elsewhere.
        assert_eq!(held.for_data(&wire[4..]), None);
        assert_eq!(held.for_data(&wire[..wire.len() - 4]), None);
        let copy = wire.clone();
        assert_eq!(held.for_data(&copy), None);
        let mut two = fpdu(100);
        two.extend_from_slice(&fpdu(20));
        assert_eq!(SegmentDigest::of(&two).hold(&two), None);
    }

    #[test]
    fn anything_else_gives_only_the_sum() {
        let mut two = fpdu(100);
        two.extend_from_slice(&fpdu(20));
        let mut cut = fpdu(100);
        cut.pop();
        for data in [two, cut, vec![], vec![0], vec![0, 0, 0]] {
            let d = SegmentDigest::of(&data);
            assert_eq!(d.fpdu_crc, None, "{} octets", data.len());
            assert_eq!(d.sum, Checksum::new().add_bytes(&data).sum());
        }
    }
}
