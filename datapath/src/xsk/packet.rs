//! Ethernet + IPv4 + TCP frames written into and read from UMEM frames, without allocation.
//!
//! Only what the raw AF_XDP tools and tests need: a 54-octet header (Ethernet II, IPv4 without
//! options, TCP without options) followed by payload, with the IPv4 header checksum and the TCP
//! checksum (RFC 9293 3.1 pseudo-header) computed in software. [`TcpFrame`] is a checked
//! read-only view of such a frame (TCP options are accepted on receive).
//!
//! Built on the workspace's one frame view and checksum, `tcp_engine::wire`
//! ([`EthernetFrame`], [`Ipv4TcpView`], [`Checksum`]); the constants here are theirs.

use std::net::Ipv4Addr;

use tcp_engine::wire::{self, Checksum, EthernetFrame, EthernetRepr, Ipv4TcpView};

/// Ethernet II header length.
pub const ETH_HLEN: usize = wire::ETHERNET_HEADER_LEN;
/// IPv4 header length without options.
pub const IPV4_HLEN: usize = wire::IPV4_HEADER_LEN;
/// TCP header length without options.
pub const TCP_HLEN: usize = wire::TCP_HEADER_LEN;
/// Headers of a frame built by [`write_tcp_frame`].
pub const HEADERS_LEN: usize = ETH_HLEN + IPV4_HLEN + TCP_HLEN;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = wire::ETHERTYPE_IPV4;
/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = wire::IP_PROTOCOL_TCP;

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
    let (eth, packet) = frame.split_at_mut(ETH_HLEN);
    EthernetRepr {
        src: spec.src_mac,
        dst: spec.dst_mac,
        ethertype: ETHERTYPE_IPV4,
    }
    .emit(&mut EthernetFrame::new_unchecked(eth));
    let (src, dst) = (spec.src_ip.octets(), spec.dst_ip.octets());
    // IPv4 (RFC 791 3.1), no options, DF set, TTL 64.
    let (ip, seg) = packet.split_at_mut(IPV4_HLEN);
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&ip_total.to_be_bytes());
    ip[4..6].copy_from_slice(&spec.ip_id.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = IPPROTO_TCP;
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    let ip_csum = Checksum::new().add_short(ip).finish();
    ip[10..12].copy_from_slice(&ip_csum.to_be_bytes());
    // TCP (RFC 9293 3.1), no options.
    seg[0..2].copy_from_slice(&spec.src_port.to_be_bytes());
    seg[2..4].copy_from_slice(&spec.dst_port.to_be_bytes());
    seg[4..8].copy_from_slice(&spec.seq.to_be_bytes());
    seg[8..12].copy_from_slice(&spec.ack.to_be_bytes());
    seg[12] = ((TCP_HLEN / 4) as u8) << 4;
    seg[13] = spec.flags;
    seg[14..16].copy_from_slice(&spec.window.to_be_bytes());
    seg[16..20].fill(0); // checksum, urgent pointer
    payload(&mut seg[TCP_HLEN..]);
    let tcp_len = (seg.len() as u16).to_be_bytes();
    let tcp_csum = Checksum::new()
        .add_4(src)
        .add_4(dst)
        .add_2([0, IPPROTO_TCP])
        .add_2(tcp_len)
        .add_bytes(seg)
        .finish();
    seg[16..18].copy_from_slice(&tcp_csum.to_be_bytes());
    Some(frame_len)
}

/// Swaps source and destination MAC addresses, IPv4 addresses and TCP ports of an
/// Ethernet/IPv4/TCP frame in place (what an echo server does). Both checksums stay valid, since
/// the one's-complement sum does not depend on the order of the words. Returns `false` (and
/// changes nothing) if the frame does not parse as IPv4/TCP.
pub fn swap_endpoints(frame: &mut [u8]) -> bool {
    let Some(ihl) = TcpFrame::parse(frame).map(|f| f.view.ip_header_len()) else {
        return false;
    };
    let (eth, packet) = frame.split_at_mut(ETH_HLEN);
    let mut eth = EthernetFrame::new_unchecked(eth);
    let (dst, src) = (eth.dst_addr(), eth.src_addr());
    eth.set_dst_addr(src);
    eth.set_src_addr(dst);
    // IPv4 source and destination addresses (RFC 791 3.1), then the TCP ports (RFC 9293 3.1).
    let (s, d) = packet[12..20].split_at_mut(4);
    s.swap_with_slice(d);
    let (sp, dp) = packet[ihl..ihl + 4].split_at_mut(2);
    sp.swap_with_slice(dp);
    true
}

/// A checked view of an Ethernet II / IPv4 / TCP frame (no VLAN tag; IPv4 and TCP options
/// allowed; IPv4 fragments rejected): an [`EthernetFrame`] carrying an [`Ipv4TcpView`] whose
/// lengths are checked, its checksums not ([`Ipv4TcpView::new_unverified`]).
#[derive(Debug, Clone)]
pub struct TcpFrame<'a> {
    eth: EthernetFrame<&'a [u8]>,
    view: Ipv4TcpView<'a>,
}

impl<'a> TcpFrame<'a> {
    /// Parses `frame`; `None` if it is not a whole, unfragmented IPv4/TCP frame.
    pub fn parse(frame: &'a [u8]) -> Option<Self> {
        let eth = EthernetFrame::new_checked(frame).ok()?;
        if eth.ethertype() != ETHERTYPE_IPV4 {
            return None;
        }
        let view = Ipv4TcpView::new_unverified(eth.payload()).ok()?;
        Some(Self { eth, view })
    }

    /// The IPv4 packet and TCP segment.
    pub fn view(&self) -> &Ipv4TcpView<'a> {
        &self.view
    }

    /// Destination MAC address.
    pub fn dst_mac(&self) -> [u8; 6] {
        self.eth.dst_addr()
    }

    /// Source MAC address.
    pub fn src_mac(&self) -> [u8; 6] {
        self.eth.src_addr()
    }

    /// Source IPv4 address.
    pub fn src_ip(&self) -> Ipv4Addr {
        self.view.ip().source_addr()
    }

    /// Destination IPv4 address.
    pub fn dst_ip(&self) -> Ipv4Addr {
        self.view.ip().destination_addr()
    }

    /// TCP source port.
    pub fn src_port(&self) -> u16 {
        self.view.tcp().source_port()
    }

    /// TCP destination port.
    pub fn dst_port(&self) -> u16 {
        self.view.tcp().destination_port()
    }

    /// TCP sequence number.
    pub fn seq(&self) -> u32 {
        self.view.tcp().sequence_number()
    }

    /// TCP acknowledgment number.
    pub fn ack(&self) -> u32 {
        self.view.tcp().acknowledgment_number()
    }

    /// TCP flags ([`tcp_flags`]).
    pub fn flags(&self) -> u8 {
        self.view.control_bits()
    }

    /// TCP payload (after options, before any Ethernet padding).
    pub fn payload(&self) -> &'a [u8] {
        self.view.payload()
    }

    /// Frame length covered by the IPv4 total length (Ethernet padding excluded).
    pub fn frame_len(&self) -> usize {
        ETH_HLEN + self.view.packet().len()
    }

    /// True if the IPv4 header checksum verifies.
    pub fn ipv4_checksum_ok(&self) -> bool {
        self.view.ipv4_checksum_ok()
    }

    /// True if the TCP checksum (pseudo-header included) verifies.
    pub fn tcp_checksum_ok(&self) -> bool {
        self.view.tcp_checksum_ok()
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
