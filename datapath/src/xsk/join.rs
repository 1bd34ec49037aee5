//! Joining the frames of a received multi-buffer packet ([`super::XskConfig::multi_buffer`])
//! into one buffer, reading its TCP payload once on the way: the copy that joins the frames
//! also sums the payload (the TCP checksum's share, RFC 9293 3.1) and runs the CRC32c of
//! RFC 5044 4.4 over all of it but its last four octets (`copy_crc::copy_crc32c_sum`), which is
//! what an iWARP receiver checks an FPDU filling the segment with. The packet's frames are read
//! once, whatever their boundaries; the receiver then checks the checksum and the CRC from
//! these values and places from the joined copy, in cache.

use tcp_engine::wire::Checksum;

/// What the join read of a packet's TCP payload (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadDigest {
    /// Octets of TCP payload the packet carries.
    pub len: usize,
    /// The ones' complement sum of all of them (as [`Checksum::sum`] gives it).
    pub sum: u16,
    /// The CRC32c of all of them but the last four.
    pub crc: u32,
}

/// Octets of an Ethernet II header.
const ETH_LEN: usize = 14;
/// The octets after the payload the CRC leaves out: where an FPDU carries its CRC.
const CRC_FIELD: usize = 4;

/// Where the TCP payload starts in a `total`-octet Ethernet frame whose first octets are
/// `head`, if the frame is IPv4 carrying TCP whose headers lie in `head`, its IPv4 total length
/// ends the frame (no padding), and the payload is a nonzero multiple of four octets (as an
/// FPDU is). `None` otherwise: the receiver then reads the payload itself.
fn payload_start(head: &[u8], total: usize) -> Option<usize> {
    let eth = head.get(..ETH_LEN)?;
    if eth[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &head[ETH_LEN..];
    let first = *ip.first()?;
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < 20 || *ip.get(9)? != 6 {
        return None;
    }
    let ip_total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
    if ETH_LEN + ip_total != total {
        return None;
    }
    let doff = usize::from(*ip.get(ihl + 12)? >> 4) * 4;
    let start = ETH_LEN + ihl + doff;
    let payload = total.checked_sub(start)?;
    (doff >= 20 && start <= head.len() && payload >= 8 && payload.is_multiple_of(4))
        .then_some(start)
}

/// Copies `frames`, in order, to the start of `dst` (which must hold their total length), and
/// returns the digest of the TCP payload of the packet they make, if it is one to digest (see
/// [`payload_start`]).
pub(crate) fn join(frames: &[&[u8]], dst: &mut [u8]) -> Option<PayloadDigest> {
    let total: usize = frames.iter().map(|f| f.len()).sum();
    let start = frames.first().and_then(|f| payload_start(f, total));
    let Some(start) = start else {
        let mut at = 0;
        for f in frames {
            dst[at..at + f.len()].copy_from_slice(f);
            at += f.len();
        }
        return None;
    };
    // The payload's octets up to the CRC field are copied with the CRC and sum; the rest
    // (headers, the last four octets) plainly.
    let crc_end = total - CRC_FIELD;
    let mut state = u32::MAX;
    let mut sum = Checksum::new();
    let mut at = 0;
    for f in frames {
        let end = at + f.len();
        let (lo, hi) = (start.clamp(at, end), crc_end.clamp(at, end));
        let out = &mut dst[at..end];
        out[..lo - at].copy_from_slice(&f[..lo - at]);
        if hi > lo {
            let (c, s) = copy_crc::copy_crc32c_sum_from(
                &f[lo - at..hi - at],
                &mut out[lo - at..hi - at],
                state,
            );
            state = c;
            // A piece starting at an odd offset of the payload adds its sum byte-swapped
            // (RFC 1071 2(B)).
            sum = sum.add_sum(if (lo - start) % 2 == 0 {
                s
            } else {
                s.swap_bytes()
            });
        }
        out[hi - at..].copy_from_slice(&f[hi - at..]);
        at = end;
    }
    // `crc_end - start` is a multiple of four: the CRC field continues the sum at a word.
    let sum = sum.add_short(&dst[crc_end..total]).sum();
    Some(PayloadDigest {
        len: total - start,
        sum,
        crc: !state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpa::crc::crc32c;

    /// An Ethernet/IPv4/TCP frame of `payload` octets with a `doff`-octet TCP header.
    fn packet(payload: usize, doff: usize) -> Vec<u8> {
        let ip_total = 20 + doff + payload;
        let mut p = vec![0u8; ETH_LEN + ip_total];
        p[12] = 0x08;
        p[ETH_LEN] = 0x45;
        p[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&(ip_total as u16).to_be_bytes());
        p[ETH_LEN + 9] = 6;
        p[ETH_LEN + 20 + 12] = ((doff / 4) as u8) << 4;
        for (i, b) in p[ETH_LEN + 20 + doff..].iter_mut().enumerate() {
            *b = (i * 31 + 7) as u8;
        }
        p
    }

    fn pieces(p: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 0;
        for &c in cuts.iter().chain(std::iter::once(&p.len())) {
            out.push(p[at..c].to_vec());
            at = c;
        }
        out
    }

    #[test]
    fn join_copies_and_digests_the_payload_across_any_frame_boundaries() {
        for (payload, doff) in [
            (8928usize, 32usize),
            (8960, 20),
            (4000, 32),
            (8, 20),
            (100, 60),
        ] {
            let p = packet(payload, doff);
            let start = ETH_LEN + 20 + doff;
            for cuts in [
                vec![3840, 7680],
                vec![3840],
                vec![start, start + 1],
                vec![start + 3, p.len() - 2],
                vec![p.len() - 4],
                vec![start + 1, start + 2, start + 3],
            ] {
                if cuts.iter().any(|&c| c == 0 || c >= p.len() || c < start) {
                    continue;
                }
                let frames = pieces(&p, &cuts);
                let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
                let mut dst = vec![0xAAu8; p.len() + 16];
                let d = join(&refs, &mut dst).expect("digested");
                assert_eq!(&dst[..p.len()], &p[..], "copy, cuts {cuts:?}");
                assert!(dst[p.len()..].iter().all(|&b| b == 0xAA));
                let data = &p[start..];
                assert_eq!(d.len, payload);
                assert_eq!(d.sum, Checksum::new().add_bytes(data).sum(), "sum {cuts:?}");
                assert_eq!(d.crc, crc32c(&data[..payload - 4]), "crc {cuts:?}");
            }
        }
    }

    #[test]
    fn other_packets_are_copied_without_a_digest() {
        let mut not_tcp = packet(1000, 20);
        not_tcp[ETH_LEN + 9] = 17;
        let mut padded = packet(1000, 20);
        padded.extend_from_slice(&[0; 4]);
        let odd = packet(1001, 20);
        let headers_cut = packet(1000, 60);
        for (p, cut) in [
            (not_tcp, 500),
            (padded, 500),
            (odd, 500),
            // The TCP header not all in the first frame.
            (headers_cut, ETH_LEN + 40),
        ] {
            let frames = pieces(&p, &[cut]);
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            let mut dst = vec![0u8; p.len()];
            assert_eq!(join(&refs, &mut dst), None);
            assert_eq!(dst, p);
        }
    }
}
