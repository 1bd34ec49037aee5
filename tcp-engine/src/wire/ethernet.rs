//! Ethernet II framing (IEEE 802.3-2022 clause 3.1.1, the MAC frame; the Length/Type field
//! of 3.2.6 read as a Type, an EtherType, when it is at least 0x0600): destination address,
//! source address, EtherType, then the MAC client data. No preamble, SFD or FCS (the NIC
//! adds and strips them), no 802.1Q tag.
//!
//! In the style of smoltcp's `wire::ethernet`: [`EthernetFrame`] is a view over a buffer
//! (checked for length by [`EthernetFrame::new_checked`]), [`EthernetRepr`] the decoded
//! header with [`EthernetRepr::parse`] and [`EthernetRepr::emit`].

use super::error::WireError;

/// Octets of the Ethernet II header: two MAC addresses and the EtherType (IEEE 802.3 3.1.1).
pub const ETHERNET_HEADER_LEN: usize = 14;
/// EtherType of IPv4 (RFC 894; IEEE Registration Authority assignment 0x0800).
pub const ETHERTYPE_IPV4: u16 = 0x0800;

/// A 48-bit MAC address in transmission order (IEEE 802.3 3.2.3).
pub type MacAddress = [u8; 6];

mod field {
    use core::ops::{Range, RangeFrom};

    pub const DESTINATION: Range<usize> = 0..6;
    pub const SOURCE: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const PAYLOAD: RangeFrom<usize> = 14..;
}

/// A view of an Ethernet II frame in a buffer (see the module documentation). The accessors
/// panic on a buffer shorter than the header unless the view came from
/// [`new_checked`](Self::new_checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// A view of `buffer` without checking its length.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> EthernetFrame<T> {
        EthernetFrame { buffer }
    }

    /// A view of `buffer`, which must hold at least the header ([`ETHERNET_HEADER_LEN`]).
    #[inline]
    pub fn new_checked(buffer: T) -> Result<EthernetFrame<T>, WireError> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    /// `Ok` if the buffer holds the whole header.
    #[inline]
    pub fn check_len(&self) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < ETHERNET_HEADER_LEN {
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

    /// Length of the header (a constant: no VLAN tags).
    #[inline]
    pub const fn header_len() -> usize {
        ETHERNET_HEADER_LEN
    }

    /// Destination MAC address.
    #[inline]
    pub fn dst_addr(&self) -> MacAddress {
        mac(&self.buffer.as_ref()[field::DESTINATION])
    }

    /// Source MAC address.
    #[inline]
    pub fn src_addr(&self) -> MacAddress {
        mac(&self.buffer.as_ref()[field::SOURCE])
    }

    /// The EtherType (IEEE 802.3 3.2.6, values of 0x0600 and above).
    #[inline]
    pub fn ethertype(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::ETHERTYPE];
        u16::from_be_bytes([b[0], b[1]])
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> EthernetFrame<&'a T> {
    /// The MAC client data (IEEE 802.3 3.2.7): everything after the header, the pad that
    /// fills a short frame to the minimum size (3.2.8) included.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[field::PAYLOAD]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination MAC address.
    #[inline]
    pub fn set_dst_addr(&mut self, addr: MacAddress) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&addr);
    }

    /// Sets the source MAC address.
    #[inline]
    pub fn set_src_addr(&mut self, addr: MacAddress) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&addr);
    }

    /// Sets the EtherType.
    #[inline]
    pub fn set_ethertype(&mut self, ethertype: u16) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&ethertype.to_be_bytes());
    }

    /// The MAC client data, writable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD]
    }
}

fn mac(b: &[u8]) -> MacAddress {
    let mut m = [0; 6];
    m.copy_from_slice(b);
    m
}

/// The decoded Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Source MAC address.
    pub src: MacAddress,
    /// Destination MAC address.
    pub dst: MacAddress,
    /// EtherType of the payload ([`ETHERTYPE_IPV4`]).
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Decodes the header of `frame` (checked for length again: an unchecked view of a short
    /// buffer gives [`WireError::Truncated`]).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        frame: &EthernetFrame<&T>,
    ) -> Result<EthernetRepr, WireError> {
        frame.check_len()?;
        Ok(EthernetRepr {
            src: frame.src_addr(),
            dst: frame.dst_addr(),
            ethertype: frame.ethertype(),
        })
    }

    /// Octets the header takes ([`ETHERNET_HEADER_LEN`]).
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        ETHERNET_HEADER_LEN
    }

    /// Writes the header into `frame` (whose buffer must hold [`ETHERNET_HEADER_LEN`] octets;
    /// the payload is left as it is).
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut EthernetFrame<T>) {
        frame.set_dst_addr(self.dst);
        frame.set_src_addr(self.src);
        frame.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header of an IPv4 frame, then its first payload octets.
    const FRAME: [u8; 18] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, // destination
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, // source
        0x08, 0x00, // EtherType IPv4
        0x45, 0x00, 0x00, 0x28, // payload
    ];

    #[test]
    fn reads_the_fields() {
        let f = EthernetFrame::new_checked(&FRAME[..]).expect("frame");
        assert_eq!(f.dst_addr(), [2, 0, 0, 0, 0, 2]);
        assert_eq!(f.src_addr(), [2, 0, 0, 0, 0, 1]);
        assert_eq!(f.ethertype(), ETHERTYPE_IPV4);
        assert_eq!(f.payload(), &[0x45, 0x00, 0x00, 0x28]);
        assert_eq!(EthernetFrame::<&[u8]>::header_len(), 14);
        let r = EthernetRepr::parse(&f).expect("repr");
        assert_eq!(
            r,
            EthernetRepr {
                src: [2, 0, 0, 0, 0, 1],
                dst: [2, 0, 0, 0, 0, 2],
                ethertype: 0x0800,
            }
        );
        assert_eq!(r.buffer_len(), ETHERNET_HEADER_LEN);
    }

    #[test]
    fn a_bare_header_has_an_empty_payload() {
        let f = EthernetFrame::new_checked(&FRAME[..14]).expect("frame");
        assert!(f.payload().is_empty());
    }

    #[test]
    fn short_buffers_are_truncated() {
        for n in 0..14 {
            assert_eq!(
                EthernetFrame::new_checked(&FRAME[..n]),
                Err(WireError::Truncated),
                "{n} octets"
            );
            let f = EthernetFrame::new_unchecked(&FRAME[..n]);
            assert_eq!(EthernetRepr::parse(&f), Err(WireError::Truncated));
        }
    }

    #[test]
    fn emit_writes_the_header_and_keeps_the_payload() {
        let mut buf = [0xeeu8; 18];
        let repr = EthernetRepr {
            src: [2, 0, 0, 0, 0, 1],
            dst: [2, 0, 0, 0, 0, 2],
            ethertype: ETHERTYPE_IPV4,
        };
        let mut f = EthernetFrame::new_checked(&mut buf[..]).expect("frame");
        repr.emit(&mut f);
        f.payload_mut().copy_from_slice(&FRAME[14..]);
        assert_eq!(buf, FRAME);
        // Round trip.
        let f = EthernetFrame::new_checked(&buf[..]).expect("frame");
        assert_eq!(EthernetRepr::parse(&f), Ok(repr));
    }

    #[test]
    fn works_over_owned_buffers() {
        let mut f = EthernetFrame::new_checked(FRAME.to_vec()).expect("frame");
        f.set_ethertype(0x86dd);
        f.set_src_addr([0xff; 6]);
        let v = f.into_inner();
        assert_eq!(v[12..14], [0x86, 0xdd]);
        assert_eq!(v[6..12], [0xff; 6]);
        assert_eq!(v[..6], FRAME[..6]);
    }
}
