//! ICMP for IPv4 (RFC 792), as far as TCP needs it: the "fragmentation needed and DF set"
//! message (type 3, code 4) that carries a path MTU (RFC 1191 4) and quotes the segment that
//! did not fit.
//!
//! In the style of smoltcp's `wire::icmpv4`: [`Icmpv4Packet`] is a view over an ICMP message
//! (checked for length by [`Icmpv4Packet::new_checked`]), [`FragNeededRepr`] the decoded
//! message with [`FragNeededRepr::parse`] and [`FragNeededRepr::emit`]; the quoted IPv4
//! header is read through [`Ipv4Packet::new_checked_quote`]. [`parse_frag_needed`] takes a
//! whole IPv4 packet through every layer, as a receive path does.
//!
//! Nothing here decides whether to believe a message: that is the connection's business
//! ([`crate::Connection::handle_packet_too_big`], RFC 5927 4.1 and 7.2).

use core::net::Ipv4Addr;

use super::checksum::Checksum;
use super::error::WireError;
use super::ipv4::{Ipv4Packet, Ipv4Repr, IPV4_HEADER_LEN, IP_PROTOCOL_ICMP, IP_PROTOCOL_TCP};
use super::tuple::FourTuple;

/// Octets of the ICMP header: type, code, checksum and the 4 octets whose use the type
/// decides (RFC 792).
pub const ICMP_HEADER_LEN: usize = 8;
/// ICMP type "destination unreachable" (RFC 792).
pub const ICMP_DEST_UNREACHABLE: u8 = 3;
/// Destination unreachable code "fragmentation needed and DF set" (RFC 792).
pub const ICMP_CODE_FRAG_NEEDED: u8 = 4;
/// Octets of the datagram's data an ICMP error quotes after its IP header (RFC 792: "the
/// first 64 bits"): for TCP, the ports and the sequence number (RFC 9293 3.1).
pub const ICMP_QUOTED_DATA_LEN: usize = 8;

mod field {
    use core::ops::{Range, RangeFrom};

    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    /// Type 3: unused (RFC 792); code 4: unused, then the next-hop MTU (RFC 1191 4).
    pub const REST: Range<usize> = 4..8;
    pub const NEXT_HOP_MTU: Range<usize> = 6..8;
    pub const DATA: RangeFrom<usize> = 8..;
}

/// A view of an ICMP message in a buffer (see the module documentation): the IPv4 packet's
/// data, up to its total length. The accessors panic on a buffer shorter than
/// [`ICMP_HEADER_LEN`] unless the view came from [`new_checked`](Self::new_checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Icmpv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Icmpv4Packet<T> {
    /// A view of `buffer` without checking its length.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Icmpv4Packet<T> {
        Icmpv4Packet { buffer }
    }

    /// A view of `buffer`, which must hold at least the header ([`ICMP_HEADER_LEN`]).
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Icmpv4Packet<T>, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// `Ok` if the buffer holds the whole header.
    #[inline]
    pub fn check_len(&self) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < ICMP_HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    /// The buffer back.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The type ([`ICMP_DEST_UNREACHABLE`], ...).
    #[inline]
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }

    /// The code ([`ICMP_CODE_FRAG_NEEDED`], ...).
    #[inline]
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    /// The checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::CHECKSUM];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// The next-hop MTU of a "fragmentation needed" message: the low 16 bits of the header's
    /// second word (RFC 1191 4); 0 from a router that predates RFC 1191.
    #[inline]
    pub fn next_hop_mtu(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::NEXT_HOP_MTU];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// True if the message, its checksum field included, sums to all ones (RFC 792: the
    /// ones' complement sum of the ICMP message starting with the type).
    pub fn verify_checksum(&self) -> bool {
        Checksum::new().add_bytes(self.buffer.as_ref()).finish() == 0
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Icmpv4Packet<&'a T> {
    /// What follows the header: for an error message, the quoted datagram's IP header and
    /// the start of its data (RFC 792).
    #[inline]
    pub fn data(&self) -> &'a [u8] {
        &self.buffer.as_ref()[field::DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv4Packet<T> {
    /// Sets the type.
    #[inline]
    pub fn set_msg_type(&mut self, t: u8) {
        self.buffer.as_mut()[field::TYPE] = t;
    }

    /// Sets the code.
    #[inline]
    pub fn set_msg_code(&mut self, c: u8) {
        self.buffer.as_mut()[field::CODE] = c;
    }

    /// Sets the header's second word to an unused half (zero) and `mtu` (RFC 1191 4).
    #[inline]
    pub fn set_next_hop_mtu(&mut self, mtu: u16) {
        let rest = &mut self.buffer.as_mut()[field::REST];
        rest[..2].fill(0);
        rest[2..].copy_from_slice(&mtu.to_be_bytes());
    }

    /// What follows the header, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA]
    }

    /// Computes and sets the checksum over the whole message as it stands (RFC 792).
    pub fn fill_checksum(&mut self) {
        self.buffer.as_mut()[field::CHECKSUM].fill(0);
        let sum = Checksum::new().add_bytes(self.buffer.as_ref()).finish();
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    }
}

/// The TCP segment an ICMP error quotes: the addresses of its IPv4 header and the first 8
/// octets of its TCP header (ports and sequence number, RFC 9293 3.1), all an ICMP error is
/// sure to carry (RFC 792). `src` is the sender of the segment, the host the ICMP error goes
/// to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotedTcp {
    /// The segment's source address (ours, for an error we received).
    pub src_addr: Ipv4Addr,
    /// The segment's destination address (the peer's).
    pub dst_addr: Ipv4Addr,
    /// The segment's source port.
    pub src_port: u16,
    /// The segment's destination port.
    pub dst_port: u16,
    /// The segment's sequence number.
    pub seq: u32,
    /// The total length of the datagram that did not fit (its IPv4 header's).
    pub total_len: u16,
}

impl QuotedTcp {
    /// The connection that sent the segment, from its own side: local is the segment's source.
    pub fn sender_tuple(&self) -> FourTuple {
        FourTuple {
            local_addr: self.src_addr,
            local_port: self.src_port,
            remote_addr: self.dst_addr,
            remote_port: self.dst_port,
        }
    }
}

/// An ICMP "fragmentation needed and DF set" message about a TCP segment (type 3, code 4;
/// RFC 792, RFC 1191 4), decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragNeededRepr {
    /// The MTU of the next hop that could not take the datagram (RFC 1191 4); 0 from a router
    /// that predates RFC 1191.
    pub next_hop_mtu: u16,
    /// The segment that did not fit.
    pub quoted: QuotedTcp,
}

impl FragNeededRepr {
    /// Decodes `packet` (checked for length again): checksum ([`WireError::BadIcmpChecksum`]),
    /// type 3 code 4 ([`WireError::NotFragNeeded`]), and a quote of a TCP segment
    /// ([`WireError::NotTcp`]) that is not a later fragment ([`WireError::Fragment`]: no TCP
    /// header there) and holds its IPv4 header and 8 octets of TCP header
    /// ([`WireError::Truncated`] or [`WireError::BadIpv4Header`] otherwise). The quoted IPv4
    /// header's checksum is not checked: a router may quote the header as it changed it.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        packet: &Icmpv4Packet<&T>,
    ) -> Result<FragNeededRepr, WireError> {
        packet.check_len()?;
        if !packet.verify_checksum() {
            return Err(WireError::BadIcmpChecksum);
        }
        if (packet.msg_type(), packet.msg_code()) != (ICMP_DEST_UNREACHABLE, ICMP_CODE_FRAG_NEEDED)
        {
            return Err(WireError::NotFragNeeded);
        }
        let ip = Ipv4Packet::new_checked_quote(packet.data())?;
        if ip.protocol() != IP_PROTOCOL_TCP {
            return Err(WireError::NotTcp);
        }
        if ip.fragment_offset() != 0 {
            return Err(WireError::Fragment);
        }
        let tcp = packet
            .data()
            .get(ip.header_len()..ip.header_len() + ICMP_QUOTED_DATA_LEN)
            .ok_or(WireError::Truncated)?;
        Ok(FragNeededRepr {
            next_hop_mtu: packet.next_hop_mtu(),
            quoted: QuotedTcp {
                src_addr: ip.src_addr(),
                dst_addr: ip.dst_addr(),
                src_port: u16::from_be_bytes([tcp[0], tcp[1]]),
                dst_port: u16::from_be_bytes([tcp[2], tcp[3]]),
                seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
                total_len: ip.total_len(),
            },
        })
    }

    /// Octets the message takes when emitted: the ICMP header, a 20-octet IPv4 header and 8
    /// octets of TCP header.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        ICMP_HEADER_LEN + IPV4_HEADER_LEN + ICMP_QUOTED_DATA_LEN
    }

    /// Writes the message into `packet`, whose buffer must be [`buffer_len`](Self::buffer_len)
    /// octets ([`WireError::BufferTooSmall`] otherwise): the quoted IPv4 header as our
    /// senders write it (no options, DF, TTL 64, ID 0, checksum filled) with the quote's
    /// addresses and total length (at least the header's 20 octets, else
    /// [`WireError::BadIpv4Header`]: [`parse`](Self::parse) would refuse it), the ports and
    /// sequence number, the checksum.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Icmpv4Packet<T>,
    ) -> Result<(), WireError> {
        if packet.buffer.as_ref().len() != self.buffer_len() {
            return Err(WireError::BufferTooSmall);
        }
        if usize::from(self.quoted.total_len) < IPV4_HEADER_LEN {
            return Err(WireError::BadIpv4Header);
        }
        let q = &self.quoted;
        packet.set_msg_type(ICMP_DEST_UNREACHABLE);
        packet.set_msg_code(ICMP_CODE_FRAG_NEEDED);
        packet.set_next_hop_mtu(self.next_hop_mtu);
        let (ip, tcp) = packet.data_mut().split_at_mut(IPV4_HEADER_LEN);
        let mut ip = Ipv4Packet::new_unchecked(ip);
        ip.set_version_and_header_len(IPV4_HEADER_LEN);
        ip.set_dscp_ecn(0);
        ip.set_total_len(q.total_len);
        ip.set_ident(0);
        ip.set_unfragmented(true);
        ip.set_ttl(64);
        ip.set_protocol(IP_PROTOCOL_TCP);
        ip.set_src_addr(q.src_addr);
        ip.set_dst_addr(q.dst_addr);
        ip.fill_checksum();
        tcp[0..2].copy_from_slice(&q.src_port.to_be_bytes());
        tcp[2..4].copy_from_slice(&q.dst_port.to_be_bytes());
        tcp[4..8].copy_from_slice(&q.seq.to_be_bytes());
        packet.fill_checksum();
        Ok(())
    }
}

/// A whole IPv4 packet carrying an ICMP "fragmentation needed" about a TCP segment, through
/// every layer: the outer header ([`Ipv4Packet::new_checked`], [`Ipv4Repr::parse`]: checksum,
/// no fragment), protocol ICMP ([`WireError::NotIcmp`]), then [`FragNeededRepr::parse`].
/// Returns the outer header (its source is the router that sent the message) and the message.
/// Zero-copy, no allocation.
pub fn parse_frag_needed(packet: &[u8]) -> Result<(Ipv4Repr, FragNeededRepr), WireError> {
    let ip = Ipv4Packet::new_checked(packet)?;
    let repr = Ipv4Repr::parse(&ip)?;
    if repr.protocol != IP_PROTOCOL_ICMP {
        return Err(WireError::NotIcmp);
    }
    let icmp = Icmpv4Packet::new_checked(ip.payload())?;
    Ok((repr, FragNeededRepr::parse(&icmp)?))
}

/// Writes the IPv4 packet of [`parse_frag_needed`] into `buf`: an IPv4 header from `router`
/// to the quoted segment's source (`ident`, TTL 64, DF clear, as routers send ICMP) and
/// `msg`. Returns the packet's length; [`WireError::BufferTooSmall`] if `buf` is shorter. For
/// tests and tools that play the router.
pub fn emit_frag_needed(
    router: Ipv4Addr,
    ident: u16,
    msg: &FragNeededRepr,
    buf: &mut [u8],
) -> Result<usize, WireError> {
    let len = IPV4_HEADER_LEN + msg.buffer_len();
    let buf = buf.get_mut(..len).ok_or(WireError::BufferTooSmall)?;
    Ipv4Repr {
        src_addr: router,
        dst_addr: msg.quoted.src_addr,
        protocol: IP_PROTOCOL_ICMP,
        payload_len: msg.buffer_len(),
        ttl: 64,
        ident,
        dont_fragment: false,
    }
    .emit(&mut Ipv4Packet::new_unchecked(&mut *buf))?;
    msg.emit(&mut Icmpv4Packet::new_unchecked(
        &mut buf[IPV4_HEADER_LEN..],
    ))?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IPv4 packet a router at 10.78.0.254 sends back for a 1500-octet segment from
    /// 10.78.0.1:40000 to 10.78.0.2:5000 with sequence number 0x01020304 that its next hop
    /// (MTU 1200) cannot take, as the test relay builds it (`testbed::relay`).
    const PACKET: [u8; 56] = [
        // IPv4: 56 octets, ID 7, TTL 64, ICMP, 10.78.0.254 -> 10.78.0.1
        0x45, 0x00, 0x00, 0x38, 0x00, 0x07, 0x00, 0x00, 0x40, 0x01, 0x65, 0x24, 10, 78, 0, 254, 10,
        78, 0, 1, //
        // ICMP: type 3 code 4, checksum, unused, next-hop MTU 1200
        0x03, 0x04, 0x44, 0x7d, 0x00, 0x00, 0x04, 0xb0, //
        // quoted IPv4: 1500 octets, DF, TTL 64, TCP, 10.78.0.1 -> 10.78.0.2
        0x45, 0x00, 0x05, 0xdc, 0x00, 0x00, 0x40, 0x00, 0x40, 0x06, 0x20, 0x7e, 10, 78, 0, 1, 10,
        78, 0, 2, //
        // quoted TCP: ports 40000 -> 5000, sequence number
        0x9c, 0x40, 0x13, 0x88, 0x01, 0x02, 0x03, 0x04,
    ];

    fn repr() -> FragNeededRepr {
        FragNeededRepr {
            next_hop_mtu: 1200,
            quoted: QuotedTcp {
                src_addr: Ipv4Addr::new(10, 78, 0, 1),
                dst_addr: Ipv4Addr::new(10, 78, 0, 2),
                src_port: 40000,
                dst_port: 5000,
                seq: 0x0102_0304,
                total_len: 1500,
            },
        }
    }

    #[test]
    fn reads_the_fields() {
        let icmp = Icmpv4Packet::new_checked(&PACKET[20..]).expect("icmp");
        assert_eq!(icmp.msg_type(), ICMP_DEST_UNREACHABLE);
        assert_eq!(icmp.msg_code(), ICMP_CODE_FRAG_NEEDED);
        assert_eq!(icmp.checksum(), 0x447d);
        assert_eq!(icmp.next_hop_mtu(), 1200);
        assert!(icmp.verify_checksum());
        assert_eq!(icmp.data(), &PACKET[28..]);
        assert_eq!(FragNeededRepr::parse(&icmp), Ok(repr()));
        let (ip, msg) = parse_frag_needed(&PACKET).expect("whole packet");
        assert_eq!(msg, repr());
        assert_eq!(ip.src_addr, Ipv4Addr::new(10, 78, 0, 254));
        assert_eq!(ip.dst_addr, Ipv4Addr::new(10, 78, 0, 1));
        assert_eq!(
            msg.quoted.sender_tuple(),
            FourTuple {
                local_addr: Ipv4Addr::new(10, 78, 0, 1),
                local_port: 40000,
                remote_addr: Ipv4Addr::new(10, 78, 0, 2),
                remote_port: 5000,
            }
        );
    }

    #[test]
    fn emit_writes_what_parse_reads() {
        let mut buf = [0u8; 64];
        let n =
            emit_frag_needed(Ipv4Addr::new(10, 78, 0, 254), 7, &repr(), &mut buf).expect("emit");
        assert_eq!(n, 56);
        assert_eq!(buf[..n], PACKET);
        assert_eq!(
            emit_frag_needed(Ipv4Addr::UNSPECIFIED, 0, &repr(), &mut buf[..55]),
            Err(WireError::BufferTooSmall)
        );
        assert_eq!(
            repr().emit(&mut Icmpv4Packet::new_unchecked(&mut [0u8; 35][..])),
            Err(WireError::BufferTooSmall)
        );
        let mut short = repr();
        short.quoted.total_len = 19;
        assert_eq!(
            short.emit(&mut Icmpv4Packet::new_unchecked(&mut [0u8; 36][..])),
            Err(WireError::BadIpv4Header)
        );
    }

    #[test]
    fn agrees_with_smoltcp() {
        use smoltcp::wire::{Icmpv4Message, Icmpv4Packet as S, Ipv4Packet as SIp};
        let outer = SIp::new_checked(&PACKET[..]).expect("smoltcp ipv4");
        assert!(outer.verify_checksum());
        let icmp = S::new_checked(outer.payload()).expect("smoltcp icmp");
        assert!(icmp.verify_checksum());
        assert_eq!(icmp.msg_type(), Icmpv4Message::DstUnreachable);
        assert_eq!(icmp.msg_code(), ICMP_CODE_FRAG_NEEDED);
        assert_eq!(icmp.data(), &PACKET[28..]);
        let quoted = SIp::new_unchecked(icmp.data());
        assert!(quoted.verify_checksum(), "the quoted header's checksum");
    }

    #[test]
    fn malformed_messages_are_refused_without_panic() {
        let parse = |b: &[u8]| parse_frag_needed(b).map(|(_, m)| m);
        // Every truncation.
        for n in 0..PACKET.len() {
            assert!(parse(&PACKET[..n]).is_err(), "{n} octets");
        }
        // The ICMP message alone, cut inside the quote: the outer header is fixed up.
        for n in 8..36 {
            let icmp = Icmpv4Packet::new_unchecked(&PACKET[20..20 + n]);
            assert!(FragNeededRepr::parse(&icmp).is_err(), "{n} octets of ICMP");
        }
        let fixed = |f: &dyn Fn(&mut [u8; 56])| {
            let mut b = PACKET;
            f(&mut b);
            Icmpv4Packet::new_unchecked(&mut b[20..]).fill_checksum();
            Ipv4Packet::new_unchecked(&mut b[..]).fill_checksum();
            parse(&b)
        };
        assert_eq!(fixed(&|_| {}), Ok(repr()));
        assert_eq!(fixed(&|b| b[9] = 17), Err(WireError::NotIcmp));
        assert_eq!(
            fixed(&|b| b[6] = 0x20),
            Err(WireError::Fragment),
            "outer MF"
        );
        assert_eq!(
            fixed(&|b| b[20] = 11),
            Err(WireError::NotFragNeeded),
            "time exceeded"
        );
        assert_eq!(
            fixed(&|b| b[21] = 3),
            Err(WireError::NotFragNeeded),
            "port unreachable"
        );
        assert_eq!(fixed(&|b| b[37] = 17), Err(WireError::NotTcp), "quoted UDP");
        assert_eq!(
            fixed(&|b| b[34] = 0x01),
            Err(WireError::Fragment),
            "quoted later fragment"
        );
        assert_eq!(
            fixed(&|b| b[28] = 0x46),
            Err(WireError::Truncated),
            "quoted options leave no 8 octets of TCP"
        );
        assert_eq!(
            fixed(&|b| b[28] = 0x55),
            Err(WireError::BadIpv4Header),
            "quoted version 5"
        );
        // The quoted header's own checksum is not the receiver's business.
        assert_eq!(
            fixed(&|b| b[38] ^= 0xff).map(|m| m.quoted.seq),
            Ok(0x0102_0304)
        );
        let mut b = PACKET;
        b[23] ^= 1;
        assert_eq!(parse(&b), Err(WireError::BadIcmpChecksum));
        let mut b = PACKET;
        b[11] ^= 1;
        assert_eq!(parse(&b), Err(WireError::BadIpv4Checksum));
        // Octets past the total length (Ethernet padding) are not part of the message.
        let mut padded = [0xffu8; 60];
        padded[..56].copy_from_slice(&PACKET);
        assert_eq!(parse(&padded), Ok(repr()));
    }
}
