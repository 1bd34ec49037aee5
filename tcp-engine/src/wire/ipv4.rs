//! The IPv4 header (RFC 791 3.1) of a packet of any protocol: the outer header of an ICMP
//! message, and the header an ICMP error quotes (RFC 792). TCP segments have their own,
//! faster path ([`super::Ipv4TcpView`], [`super::SegmentRepr`]).
//!
//! In the style of smoltcp's `wire::ipv4`: [`Ipv4Packet`] is a view over a buffer, checked
//! by [`Ipv4Packet::new_checked`] (a whole packet) or [`Ipv4Packet::new_checked_quote`] (the
//! start of one, as an ICMP error carries it); [`Ipv4Repr`] the decoded header of a whole
//! packet with [`Ipv4Repr::parse`] and [`Ipv4Repr::emit`].

use core::net::Ipv4Addr;

use super::checksum::Checksum;
use super::error::WireError;

/// Length of the IPv4 header we emit (no IP options).
pub const IPV4_HEADER_LEN: usize = 20;
/// The IPv4 protocol number of TCP (RFC 9293 3.1; IANA Assigned Internet Protocol Numbers).
pub const IP_PROTOCOL_TCP: u8 = 6;

/// The IPv4 protocol number of ICMP (RFC 792; IANA Assigned Internet Protocol Numbers).
pub const IP_PROTOCOL_ICMP: u8 = 1;

mod field {
    use core::ops::Range;

    pub const VER_IHL: usize = 0;
    pub const TOTAL_LEN: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLAGS_FRAG: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

/// Don't Fragment, in the flags and fragment offset word (RFC 791 3.1).
const DF: u16 = 0x4000;
/// More Fragments.
const MF: u16 = 0x2000;
/// The fragment offset's bits.
const FRAG_OFFSET: u16 = 0x1fff;

/// A view of an IPv4 packet (or of its start) in a buffer (see the module documentation).
/// The accessors panic on a buffer shorter than the header unless the view came from
/// [`new_checked`](Self::new_checked) or [`new_checked_quote`](Self::new_checked_quote).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// A view of `buffer` without any check.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Ipv4Packet<T> {
        Ipv4Packet { buffer }
    }

    /// A view of a whole packet: [`check_header`](Self::check_header), and the total length
    /// within the buffer (octets past it, such as Ethernet padding, are not the packet's).
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Ipv4Packet<T>, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_header()?;
        if usize::from(p.total_len()) > p.buffer.as_ref().len() {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }

    /// A view of the start of a packet as an ICMP error quotes it (RFC 792: the Internet
    /// header and the first 64 bits of the datagram's data; RFC 1812 4.3.2.3 allows more):
    /// [`check_header`](Self::check_header) only, since the total length is the original
    /// datagram's, not what the quote holds.
    #[inline]
    pub fn new_checked_quote(buffer: T) -> Result<Ipv4Packet<T>, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_header()?;
        Ok(p)
    }

    /// `Ok` if the buffer holds a whole IPv4 header: version 4, IHL at least 5 (RFC 791 3.1),
    /// the header (options included) within the buffer, a total length not below the header.
    pub fn check_header(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < IPV4_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let ver_ihl = b[field::VER_IHL];
        if ver_ihl >> 4 != 4 || ver_ihl & 0x0f < 5 {
            return Err(WireError::BadIpv4Header);
        }
        let header_len = self.header_len();
        if header_len > b.len() {
            return Err(WireError::Truncated);
        }
        if usize::from(self.total_len()) < header_len {
            return Err(WireError::BadIpv4Header);
        }
        Ok(())
    }

    /// The buffer back.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// The version field (4).
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Length of the header, options included (IHL x 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// Total length of the datagram (header and data).
    #[inline]
    pub fn total_len(&self) -> u16 {
        self.u16_at(field::TOTAL_LEN)
    }

    /// Identification.
    #[inline]
    pub fn ident(&self) -> u16 {
        self.u16_at(field::IDENT)
    }

    /// Don't Fragment.
    #[inline]
    pub fn dont_fragment(&self) -> bool {
        self.u16_at(field::FLAGS_FRAG) & DF != 0
    }

    /// More Fragments.
    #[inline]
    pub fn more_fragments(&self) -> bool {
        self.u16_at(field::FLAGS_FRAG) & MF != 0
    }

    /// Fragment offset in octets (the field counts 8-octet units).
    #[inline]
    pub fn fragment_offset(&self) -> u16 {
        (self.u16_at(field::FLAGS_FRAG) & FRAG_OFFSET) << 3
    }

    /// True for a fragment: More Fragments set or an offset other than 0.
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.u16_at(field::FLAGS_FRAG) & (MF | FRAG_OFFSET) != 0
    }

    /// Time to live.
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// The protocol of the data ([`IP_PROTOCOL_ICMP`], [`super::IP_PROTOCOL_TCP`]).
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    /// The header checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SRC];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::DST];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// True if the header, its checksum field included, sums to all ones (RFC 791 3.1).
    pub fn verify_checksum(&self) -> bool {
        Checksum::new()
            .add_bytes(&self.buffer.as_ref()[..self.header_len()])
            .finish()
            == 0
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Ipv4Packet<&'a T> {
    /// The datagram's data: after the header, up to the total length or the end of the buffer
    /// (a quote holds only the start of the data).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        let b = self.buffer.as_ref();
        let end = usize::from(self.total_len()).min(b.len());
        b.get(self.header_len()..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    fn set_u16(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets version 4 and an IHL for a header of `header_len` octets (a multiple of 4, 20 to
    /// 60).
    #[inline]
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }

    /// Sets the octet after the version and IHL: DSCP and ECN (RFC 2474, RFC 3168; the type
    /// of service of RFC 791).
    #[inline]
    pub fn set_dscp_ecn(&mut self, v: u8) {
        self.buffer.as_mut()[1] = v;
    }

    /// Sets the total length.
    #[inline]
    pub fn set_total_len(&mut self, len: u16) {
        self.set_u16(field::TOTAL_LEN, len);
    }

    /// Sets the identification.
    #[inline]
    pub fn set_ident(&mut self, ident: u16) {
        self.set_u16(field::IDENT, ident);
    }

    /// Sets the flags and fragment offset word: DF as given, MF clear, offset 0.
    #[inline]
    pub fn set_unfragmented(&mut self, dont_fragment: bool) {
        self.set_u16(field::FLAGS_FRAG, if dont_fragment { DF } else { 0 });
    }

    /// Sets the time to live.
    #[inline]
    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[field::TTL] = ttl;
    }

    /// Sets the protocol.
    #[inline]
    pub fn set_protocol(&mut self, protocol: u8) {
        self.buffer.as_mut()[field::PROTOCOL] = protocol;
    }

    /// Sets the source address.
    #[inline]
    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&addr.octets());
    }

    /// Sets the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&addr.octets());
    }

    /// Computes and sets the header checksum (RFC 791 3.1) over the header as it stands.
    pub fn fill_checksum(&mut self) {
        self.set_u16(field::CHECKSUM, 0);
        let len = self.header_len();
        let sum = Checksum::new()
            .add_bytes(&self.buffer.as_ref()[..len])
            .finish();
        self.set_u16(field::CHECKSUM, sum);
    }

    /// The datagram's data, writable (after the header, up to the total length or the end of
    /// the buffer).
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        let end = usize::from(self.total_len()).min(self.buffer.as_ref().len());
        self.buffer.as_mut().get_mut(start..end).unwrap_or(&mut [])
    }
}

/// The decoded header of a whole, unfragmented IPv4 packet (options are checked for length
/// and skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Protocol of the data.
    pub protocol: u8,
    /// Octets of data after the header.
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// Identification.
    pub ident: u16,
    /// Don't Fragment.
    pub dont_fragment: bool,
}

impl Ipv4Repr {
    /// Decodes the header of `packet`: checked again (a whole packet, as
    /// [`Ipv4Packet::new_checked`]), its header checksum verified
    /// ([`WireError::BadIpv4Checksum`]), and no fragment ([`WireError::Fragment`]: this stack
    /// does not reassemble).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Ipv4Packet<&T>) -> Result<Ipv4Repr, WireError> {
        let packet = Ipv4Packet::new_checked(packet.buffer)?;
        if !packet.verify_checksum() {
            return Err(WireError::BadIpv4Checksum);
        }
        if packet.is_fragment() {
            return Err(WireError::Fragment);
        }
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: usize::from(packet.total_len()) - packet.header_len(),
            ttl: packet.ttl(),
            ident: packet.ident(),
            dont_fragment: packet.dont_fragment(),
        })
    }

    /// Octets the header takes ([`IPV4_HEADER_LEN`]: no options are emitted).
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN
    }

    /// Writes the header (20 octets, no options, checksum filled) at the start of `packet`'s
    /// buffer, which must hold at least [`IPV4_HEADER_LEN`] octets; the data is left as it is.
    /// [`WireError::BufferTooSmall`] if the buffer is shorter or the total length would pass
    /// 65535.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Ipv4Packet<T>,
    ) -> Result<(), WireError> {
        let total = u16::try_from(IPV4_HEADER_LEN + self.payload_len)
            .map_err(|_| WireError::BufferTooSmall)?;
        if packet.buffer.as_ref().len() < IPV4_HEADER_LEN {
            return Err(WireError::BufferTooSmall);
        }
        packet.set_version_and_header_len(IPV4_HEADER_LEN);
        packet.set_dscp_ecn(0);
        packet.set_total_len(total);
        packet.set_ident(self.ident);
        packet.set_unfragmented(self.dont_fragment);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ICMP packet's IPv4 header from 10.78.0.254 to 10.78.0.1 (TTL 64, ID 7, 56 octets in
    /// all), checksum included, then the first octets of its data.
    const PACKET: [u8; 24] = [
        0x45, 0x00, 0x00, 0x38, // version 4, IHL 5, total length 56
        0x00, 0x07, 0x00, 0x00, // ID 7, no flags
        0x40, 0x01, 0x65, 0x24, // TTL 64, ICMP, checksum
        10, 78, 0, 254, // source
        10, 78, 0, 1, // destination
        0x03, 0x04, 0x00, 0x00, // data
    ];

    fn repr() -> Ipv4Repr {
        Ipv4Repr {
            src_addr: Ipv4Addr::new(10, 78, 0, 254),
            dst_addr: Ipv4Addr::new(10, 78, 0, 1),
            protocol: IP_PROTOCOL_ICMP,
            payload_len: 36,
            ttl: 64,
            ident: 7,
            dont_fragment: false,
        }
    }

    #[test]
    fn reads_the_fields_of_a_quote() {
        let p = Ipv4Packet::new_checked_quote(&PACKET[..]).expect("quote");
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.total_len(), 56);
        assert_eq!(p.ident(), 7);
        assert!(!p.dont_fragment() && !p.more_fragments() && !p.is_fragment());
        assert_eq!(p.fragment_offset(), 0);
        assert_eq!((p.ttl(), p.protocol(), p.checksum()), (64, 1, 0x6524));
        assert_eq!(p.src_addr(), Ipv4Addr::new(10, 78, 0, 254));
        assert_eq!(p.dst_addr(), Ipv4Addr::new(10, 78, 0, 1));
        assert!(p.verify_checksum());
        assert_eq!(p.payload(), &[3, 4, 0, 0], "what the quote holds");
        // As a whole packet it is 32 octets short.
        assert_eq!(
            Ipv4Packet::new_checked(&PACKET[..]),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn a_whole_packet_is_cut_at_its_total_length() {
        let mut buf = [0xeeu8; 60];
        buf[..24].copy_from_slice(&PACKET);
        let p = Ipv4Packet::new_checked(&buf[..]).expect("packet");
        assert_eq!(p.payload().len(), 36, "padding past the total length cut");
        assert_eq!(Ipv4Repr::parse(&p), Ok(repr()));
    }

    #[test]
    fn malformed_headers_are_refused() {
        for n in 0..20 {
            assert_eq!(
                Ipv4Packet::new_checked_quote(&PACKET[..n]),
                Err(WireError::Truncated),
                "{n} octets"
            );
        }
        let mut b = PACKET;
        b[0] = 0x65; // version 6
        assert_eq!(
            Ipv4Packet::new_checked_quote(&b[..]),
            Err(WireError::BadIpv4Header)
        );
        b[0] = 0x44; // IHL 4
        assert_eq!(
            Ipv4Packet::new_checked_quote(&b[..]),
            Err(WireError::BadIpv4Header)
        );
        b[0] = 0x46; // 24 octets of header (4 of options): the buffer holds them
        assert!(Ipv4Packet::new_checked_quote(&b[..]).is_ok());
        b[0] = 0x47; // 28 octets of header in 24
        assert_eq!(
            Ipv4Packet::new_checked_quote(&b[..]),
            Err(WireError::Truncated)
        );
        let mut b = PACKET;
        b[2..4].copy_from_slice(&19u16.to_be_bytes()); // total length below the header
        assert_eq!(
            Ipv4Packet::new_checked_quote(&b[..]),
            Err(WireError::BadIpv4Header)
        );
    }

    #[test]
    fn parse_checks_the_checksum_and_fragments() {
        let mut buf = [0u8; 56];
        buf[..24].copy_from_slice(&PACKET);
        buf[11] ^= 1;
        let p = Ipv4Packet::new_checked(&buf[..]).expect("packet");
        assert_eq!(Ipv4Repr::parse(&p), Err(WireError::BadIpv4Checksum));
        // MF set (checksum fixed up).
        let mut buf = [0u8; 56];
        buf[..24].copy_from_slice(&PACKET);
        buf[6] = 0x20;
        Ipv4Packet::new_unchecked(&mut buf[..]).fill_checksum();
        let p = Ipv4Packet::new_checked(&buf[..]).expect("packet");
        assert!(p.is_fragment() && p.more_fragments());
        assert_eq!(Ipv4Repr::parse(&p), Err(WireError::Fragment));
        // A later fragment.
        buf[6..8].copy_from_slice(&(185u16).to_be_bytes());
        Ipv4Packet::new_unchecked(&mut buf[..]).fill_checksum();
        let p = Ipv4Packet::new_checked(&buf[..]).expect("packet");
        assert_eq!(p.fragment_offset(), 185 * 8);
        assert_eq!(Ipv4Repr::parse(&p), Err(WireError::Fragment));
    }

    #[test]
    fn emit_writes_the_header_parse_reads() {
        let mut buf = [0xaau8; 56];
        repr()
            .emit(&mut Ipv4Packet::new_unchecked(&mut buf[..]))
            .expect("emit");
        assert_eq!(buf[..20], PACKET[..20]);
        assert_eq!(buf[20..], [0xaa; 36], "the data is left alone");
        let p = Ipv4Packet::new_checked(&buf[..]).expect("packet");
        assert_eq!(Ipv4Repr::parse(&p), Ok(repr()));
        let df = Ipv4Repr {
            dont_fragment: true,
            ..repr()
        };
        df.emit(&mut Ipv4Packet::new_unchecked(&mut buf[..]))
            .expect("emit");
        assert_eq!(buf[6], 0x40);
        assert_eq!(
            Ipv4Repr::parse(&Ipv4Packet::new_checked(&buf[..]).expect("packet")),
            Ok(df)
        );
        assert_eq!(
            repr().emit(&mut Ipv4Packet::new_unchecked(&mut [0u8; 19][..])),
            Err(WireError::BufferTooSmall)
        );
        let huge = Ipv4Repr {
            payload_len: 65516,
            ..repr()
        };
        assert_eq!(
            huge.emit(&mut Ipv4Packet::new_unchecked(&mut buf[..])),
            Err(WireError::BufferTooSmall)
        );
        assert_eq!(repr().buffer_len(), 20);
    }
}
