//! Ethernet + IPv4 + TCP frames written into and read from UMEM frames, without allocation.
//!
//! Only what the raw AF_XDP tools and tests need: a 54-octet header (Ethernet II, IPv4 without
//! options, TCP without options) followed by payload, with the IPv4 header checksum and the TCP
//! checksum (RFC 793 pseudo-header) computed in software. [`TcpFrame`] is a checked read-only
//! view of such a frame (TCP options are accepted on receive).

use std::net::Ipv4Addr;

/// Ethernet II header length.
pub const ETH_HLEN: usize = 14;
/// IPv4 header length without options.
pub const IPV4_HLEN: usize = 20;
/// TCP header length without options.
pub const TCP_HLEN: usize = 20;
/// Headers of a frame built by [`write_tcp_frame`].
pub const HEADERS_LEN: usize = ETH_HLEN + IPV4_HLEN + TCP_HLEN;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;

/// TCP flag bits (byte 13 of the TCP header).
pub mod tcp_flags {
    /// No more data from sender.
    pub const FIN: u8 = 0x01;
    /// Synchronize sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push function.
    pub const PSH: u8 = 0x08;
    /// Acknowledgment field significant.
    pub const ACK: u8 = 0x10;
}

/// Addresses and TCP header fields of a frame to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpFrameSpec {
    /// Source MAC address.
    pub src_mac: [u8; 6],
    /// Destination MAC address (the next hop's).
    pub dst_mac: [u8; 6],
    /// Source IPv4 address.
    pub src_ip: Ipv4Addr,
    /// Destination IPv4 address.
    pub dst_ip: Ipv4Addr,
    /// TCP source port.
    pub src_port: u16,
    /// TCP destination port.
    pub dst_port: u16,
    /// TCP sequence number.
    pub seq: u32,
    /// TCP acknowledgment number.
    pub ack: u32,
    /// TCP flags ([`tcp_flags`]).
    pub flags: u8,
    /// TCP window.
    pub window: u16,
    /// IPv4 identification.
    pub ip_id: u16,
}

/// One's-complement sum of `data` (big-endian 16-bit words, odd tail padded with zero) added to
/// `acc`, not folded.
fn sum16(mut acc: u64, data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The Internet checksum (RFC 1071) of `data`: the complement of the folded one's-complement sum.
pub fn internet_checksum(data: &[u8]) -> u16 {
    !fold(sum16(0, data))
}

/// One's-complement sum of the TCP/IPv4 pseudo-header and `segment` (TCP header + payload);
/// the checksum field inside `segment` takes part as it is.
fn tcp_sum(src: Ipv4Addr, dst: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut acc = sum16(0, &src.octets());
    acc = sum16(acc, &dst.octets());
    acc += u64::from(IPPROTO_TCP);
    acc += segment.len() as u64;
    fold(sum16(acc, segment))
}

/// Builds an Ethernet/IPv4/TCP frame of `frame_len` octets into `buf`: headers from `spec`, the
/// payload (`frame_len - HEADERS_LEN` octets) written by `payload`, then both checksums.
/// Returns `frame_len`, or `None` if `frame_len` is below [`HEADERS_LEN`], above `buf.len()`, or
/// the IPv4 total length would exceed 65535.
pub fn write_tcp_frame(
    buf: &mut [u8],
    spec: &TcpFrameSpec,
    frame_len: usize,
    payload: impl FnOnce(&mut [u8]),
) -> Option<usize> {
    if frame_len < HEADERS_LEN || frame_len > buf.len() || frame_len - ETH_HLEN > 0xffff {
        return None;
    }
    let frame = &mut buf[..frame_len];
    let ip_total = (frame_len - ETH_HLEN) as u16;
    // Ethernet II.
    frame[0..6].copy_from_slice(&spec.dst_mac);
    frame[6..12].copy_from_slice(&spec.src_mac);
    frame[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    // IPv4, no options, DF set, TTL 64.
    let ip = &mut frame[ETH_HLEN..ETH_HLEN + IPV4_HLEN];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&ip_total.to_be_bytes());
    ip[4..6].copy_from_slice(&spec.ip_id.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = IPPROTO_TCP;
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&spec.src_ip.octets());
    ip[16..20].copy_from_slice(&spec.dst_ip.octets());
    let ip_csum = internet_checksum(ip);
    ip[10..12].copy_from_slice(&ip_csum.to_be_bytes());
    // TCP, no options.
    let seg = &mut frame[ETH_HLEN + IPV4_HLEN..];
    seg[0..2].copy_from_slice(&spec.src_port.to_be_bytes());
    seg[2..4].copy_from_slice(&spec.dst_port.to_be_bytes());
    seg[4..8].copy_from_slice(&spec.seq.to_be_bytes());
    seg[8..12].copy_from_slice(&spec.ack.to_be_bytes());
    seg[12] = ((TCP_HLEN / 4) as u8) << 4;
    seg[13] = spec.flags;
    seg[14..16].copy_from_slice(&spec.window.to_be_bytes());
    seg[16..20].fill(0); // checksum, urgent pointer
    payload(&mut seg[TCP_HLEN..]);
    let tcp_csum = !tcp_sum(spec.src_ip, spec.dst_ip, seg);
    seg[16..18].copy_from_slice(&tcp_csum.to_be_bytes());
    Some(frame_len)
}

/// Swaps source and destination MAC addresses, IPv4 addresses and TCP ports of an
/// Ethernet/IPv4/TCP frame in place (what an echo server does). Both checksums stay valid, since
/// the one's-complement sum does not depend on the order of the words. Returns `false` (and
/// changes nothing) if the frame does not parse as IPv4/TCP.
pub fn swap_endpoints(frame: &mut [u8]) -> bool {
    let Some(ihl) = TcpFrame::parse(frame).map(|f| f.ip_header_len) else {
        return false;
    };
    let (dst, src) = frame[0..12].split_at_mut(6);
    dst.swap_with_slice(src);
    let (s, d) = frame[ETH_HLEN + 12..ETH_HLEN + 20].split_at_mut(4);
    s.swap_with_slice(d);
    let t = ETH_HLEN + ihl;
    let (sp, dp) = frame[t..t + 4].split_at_mut(2);
    sp.swap_with_slice(dp);
    true
}

/// A checked view of an Ethernet II / IPv4 / TCP frame (no VLAN tag; IPv4 and TCP options
/// allowed; IPv4 fragments rejected).
#[derive(Debug, Clone, Copy)]
pub struct TcpFrame<'a> {
    frame: &'a [u8],
    ip_header_len: usize,
    tcp_header_len: usize,
    ip_total_len: usize,
}

impl<'a> TcpFrame<'a> {
    /// Parses `frame`; `None` if it is not a whole, unfragmented IPv4/TCP frame.
    pub fn parse(frame: &'a [u8]) -> Option<Self> {
        if frame.len() < HEADERS_LEN || u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_IPV4
        {
            return None;
        }
        let ip = &frame[ETH_HLEN..];
        if ip[0] >> 4 != 4 || ip[9] != IPPROTO_TCP {
            return None;
        }
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let frag = u16::from_be_bytes([ip[6], ip[7]]);
        if ihl < IPV4_HLEN || total < ihl + TCP_HLEN || total > ip.len() || frag & 0x3fff != 0 {
            return None;
        }
        let thl = usize::from(ip[ihl + 12] >> 4) * 4;
        if thl < TCP_HLEN || ihl + thl > total {
            return None;
        }
        Some(Self {
            frame,
            ip_header_len: ihl,
            tcp_header_len: thl,
            ip_total_len: total,
        })
    }

    fn ip(&self) -> &'a [u8] {
        &self.frame[ETH_HLEN..ETH_HLEN + self.ip_total_len]
    }

    fn tcp(&self) -> &'a [u8] {
        &self.ip()[self.ip_header_len..]
    }

    /// Destination MAC address.
    pub fn dst_mac(&self) -> [u8; 6] {
        let mut m = [0; 6];
        m.copy_from_slice(&self.frame[0..6]);
        m
    }

    /// Source MAC address.
    pub fn src_mac(&self) -> [u8; 6] {
        let mut m = [0; 6];
        m.copy_from_slice(&self.frame[6..12]);
        m
    }

    /// Source IPv4 address.
    pub fn src_ip(&self) -> Ipv4Addr {
        let ip = self.ip();
        Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15])
    }

    /// Destination IPv4 address.
    pub fn dst_ip(&self) -> Ipv4Addr {
        let ip = self.ip();
        Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19])
    }

    /// TCP source port.
    pub fn src_port(&self) -> u16 {
        let t = self.tcp();
        u16::from_be_bytes([t[0], t[1]])
    }

    /// TCP destination port.
    pub fn dst_port(&self) -> u16 {
        let t = self.tcp();
        u16::from_be_bytes([t[2], t[3]])
    }

    /// TCP sequence number.
    pub fn seq(&self) -> u32 {
        let t = self.tcp();
        u32::from_be_bytes([t[4], t[5], t[6], t[7]])
    }

    /// TCP acknowledgment number.
    pub fn ack(&self) -> u32 {
        let t = self.tcp();
        u32::from_be_bytes([t[8], t[9], t[10], t[11]])
    }

    /// TCP flags ([`tcp_flags`]).
    pub fn flags(&self) -> u8 {
        self.tcp()[13]
    }

    /// TCP payload (after options, before any Ethernet padding).
    pub fn payload(&self) -> &'a [u8] {
        &self.tcp()[self.tcp_header_len..]
    }

    /// Frame length covered by the IPv4 total length (Ethernet padding excluded).
    pub fn frame_len(&self) -> usize {
        ETH_HLEN + self.ip_total_len
    }

    /// True if the IPv4 header checksum verifies.
    pub fn ipv4_checksum_ok(&self) -> bool {
        fold(sum16(0, &self.ip()[..self.ip_header_len])) == 0xffff
    }

    /// True if the TCP checksum (pseudo-header included) verifies.
    pub fn tcp_checksum_ok(&self) -> bool {
        tcp_sum(self.src_ip(), self.dst_ip(), self.tcp()) == 0xffff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TcpFrameSpec {
        TcpFrameSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: Ipv4Addr::new(10, 77, 0, 2),
            dst_ip: Ipv4Addr::new(10, 77, 0, 1),
            src_port: 40000,
            dst_port: 18515,
            seq: 0x0102_0304,
            ack: 7,
            flags: tcp_flags::ACK | tcp_flags::PSH,
            window: 65535,
            ip_id: 9,
        }
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 1.3: the sum of these words is 0xddf2 (folded), so the checksum is !0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(internet_checksum(&data), !0xddf2);
    }

    #[test]
    fn build_parse_round_trip_with_valid_checksums() {
        for len in [HEADERS_LEN, 60, 64, 65, 1514, 3498] {
            let mut buf = vec![0u8; 4096];
            let n = write_tcp_frame(&mut buf, &spec(), len, |p| {
                for (i, b) in p.iter_mut().enumerate() {
                    *b = i as u8;
                }
            })
            .unwrap();
            assert_eq!(n, len);
            let f = TcpFrame::parse(&buf[..n]).unwrap();
            assert!(f.ipv4_checksum_ok() && f.tcp_checksum_ok(), "len {len}");
            assert_eq!(f.src_ip(), spec().src_ip);
            assert_eq!(f.dst_port(), 18515);
            assert_eq!(f.seq(), 0x0102_0304);
            assert_eq!(f.payload().len(), len - HEADERS_LEN);
            assert_eq!(f.frame_len(), len);
            // A flipped payload bit breaks the TCP checksum only.
            if len > HEADERS_LEN {
                buf[len - 1] ^= 0x40;
                let f = TcpFrame::parse(&buf[..n]).unwrap();
                assert!(f.ipv4_checksum_ok() && !f.tcp_checksum_ok());
            }
        }
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut buf = [0u8; 100];
        assert!(write_tcp_frame(&mut buf, &spec(), 53, |_| {}).is_none());
        assert!(write_tcp_frame(&mut buf, &spec(), 101, |_| {}).is_none());
        assert!(TcpFrame::parse(&buf[..40]).is_none());
    }

    #[test]
    fn swap_keeps_checksums() {
        let mut buf = [0u8; 200];
        let n = write_tcp_frame(&mut buf, &spec(), 200, |p| p.fill(0xab)).unwrap();
        assert!(swap_endpoints(&mut buf[..n]));
        let f = TcpFrame::parse(&buf[..n]).unwrap();
        assert_eq!(f.src_ip(), spec().dst_ip);
        assert_eq!(f.dst_mac(), spec().src_mac);
        assert_eq!(f.src_port(), 18515);
        assert!(f.ipv4_checksum_ok() && f.tcp_checksum_ok());
        assert!(!swap_endpoints(&mut [0u8; 10]));
    }
}
