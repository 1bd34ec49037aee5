//! IPv4 + TCP segment parsing and emission (RFC 791, RFC 9293 3.1, options of
//! RFC 9293 3.2, RFC 7323 2.2 and 3.2, RFC 2018 2 and 3), the Ethernet II framing around
//! them (IEEE 802.3 3.1.1, [`EthernetFrame`], [`EthernetRepr`]) and the Internet checksum
//! ([`Checksum`], RFC 1071): the one copy of each for the whole workspace.
//!
//! Two layers, in the style of smoltcp's `wire` module:
//!
//! * [`Ipv4TcpView`]: a checked, zero-copy view over a received IPv4 packet
//!   carrying TCP. [`Ipv4TcpView::new_checked`] validates the IPv4 header
//!   (version, length, header checksum, no fragmentation), the TCP data
//!   offset, and the TCP checksum (RFC 9293 3.1, pseudo-header of 3.1 /
//!   RFC 791). It is built on `etherparse` slices; both checksums, verified
//!   here and generated on emit, are our own [`Checksum`] (RFC 1071, summed
//!   with deferred carries in 64-bit accumulators: several times faster than
//!   word-by-word summing, and it runs over every segment sent and received).
//! * [`SegmentRepr`]: the high-level representation (addresses, ports,
//!   sequence numbers, flags, decoded options, payload slice) with
//!   [`SegmentRepr::parse`] and [`SegmentRepr::emit`] /
//!   [`SegmentRepr::emit_with`] (checksums generated on emit).
//!
//! Besides: [`Ipv4TcpView::new_unverified`] (lengths only, checksums asked for separately) and
//! [`fill_checksums`] for tools and tests that inspect or rewrite segments, and
//! [`Ipv4TcpPeek`], the cheap first look a receive path takes before the full parse.
//!
//! ICMP "fragmentation needed" messages (RFC 792, RFC 1191 4), which lower a connection's
//! path MTU, have views of their own in the same style: [`Ipv4Packet`] / [`Ipv4Repr`] for an
//! IPv4 header of any protocol (the outer one, and the one an ICMP error quotes),
//! [`Icmpv4Packet`] / [`FragNeededRepr`] for the message, [`parse_frag_needed`] through
//! every layer.
//!
//! Nothing here panics on malformed input: every error is a [`WireError`] (or `None`). The
//! exceptions say so: the `new_unchecked` views and the `*_of` readers of
//! [`Ipv4TcpPeek`], for buffers whose length the caller knows.

use core::net::Ipv4Addr;

mod checksum;
mod error;
mod ethernet;
mod icmp;
mod ipv4;
pub mod rdma;
mod tuple;

pub use checksum::Checksum;
pub use error::WireError;
pub use ethernet::{EthernetFrame, EthernetRepr, MacAddress, ETHERNET_HEADER_LEN, ETHERTYPE_IPV4};
use etherparse::{Ipv4HeaderSlice, TcpSlice};
pub use icmp::{
    emit_frag_needed, parse_frag_needed, FragNeededRepr, Icmpv4Packet, QuotedTcp,
    ICMP_CODE_FRAG_NEEDED, ICMP_DEST_UNREACHABLE, ICMP_HEADER_LEN, ICMP_QUOTED_DATA_LEN,
};
pub use ipv4::{Ipv4Packet, Ipv4Repr, IPV4_HEADER_LEN, IP_PROTOCOL_ICMP, IP_PROTOCOL_TCP};
pub use tuple::FourTuple;

/// Length of a TCP header without options.
pub const TCP_HEADER_LEN: usize = 20;
/// Largest TCP option space (RFC 9293 3.1: data offset at most 15 words).
pub const TCP_MAX_OPTIONS_LEN: usize = 40;
/// Length the timestamp option takes in every segment we emit (NOP NOP TS).
pub const TIMESTAMP_OPTION_SPACE: usize = 12;

/// Control bits of the TCP header (RFC 9293 3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpFlags {
    /// FIN: no more data from sender.
    pub fin: bool,
    /// SYN: synchronize sequence numbers.
    pub syn: bool,
    /// RST: reset the connection.
    pub rst: bool,
    /// PSH: push function.
    pub psh: bool,
    /// ACK: acknowledgment field is significant.
    pub ack: bool,
    /// URG: urgent pointer field is significant (ignored by this engine).
    pub urg: bool,
}

impl TcpFlags {
    /// The flags of a control bits octet (RFC 9293 3.1, the header's 14th octet: URG, ACK,
    /// PSH, RST, SYN, FIN in its lower six bits; the upper two, ECE and CWR, are not kept).
    pub fn from_byte(bits: u8) -> TcpFlags {
        TcpFlags {
            fin: bits & 0x01 != 0,
            syn: bits & 0x02 != 0,
            rst: bits & 0x04 != 0,
            psh: bits & 0x08 != 0,
            ack: bits & 0x10 != 0,
            urg: bits & 0x20 != 0,
        }
    }

    fn to_byte(self) -> u8 {
        (self.fin as u8)
            | (self.syn as u8) << 1
            | (self.rst as u8) << 2
            | (self.psh as u8) << 3
            | (self.ack as u8) << 4
            | (self.urg as u8) << 5
    }
}

/// One SACK block (RFC 2018 3): `[left, right)` in sequence space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SackBlock {
    /// First sequence number of the block.
    pub left: u32,
    /// Sequence number following the last one of the block.
    pub right: u32,
}

/// The TCP options this engine understands; unknown options are skipped on
/// parse (RFC 9293 3.2: "a TCP implementation MUST ignore without error any
/// option it does not implement").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpOptions {
    /// Maximum Segment Size (RFC 9293 3.7.1), SYN only.
    pub mss: Option<u16>,
    /// Window scale shift count (RFC 7323 2.2), SYN only.
    pub window_scale: Option<u8>,
    /// SACK-permitted (RFC 2018 2), SYN only.
    pub sack_permitted: bool,
    /// Timestamps option `(TSval, TSecr)` (RFC 7323 3.2).
    pub timestamp: Option<(u32, u32)>,
    /// The first RDMA option of the segment (draft-csapuntz-tcprdma-00 3.3: later ones are
    /// not read), aligned on a 4-octet boundary when emitted (3.1.8).
    pub rdma: Option<rdma::RdmaOption>,
    /// The segment's first RDMA option was malformed (not read: the segment is ordinary
    /// data).
    pub rdma_malformed: bool,
    sack: [SackBlock; 4],
    sack_len: u8,
}

/// The first word of timestamp-only options: NOP, NOP, then the Timestamps option's kind
/// and length (RFC 7323 3.2, the layout of its Appendix A); TSval and TSecr follow.
const TS_ONLY_LEAD: [u8; 4] = [1, 1, 8, 10];

impl TcpOptions {
    /// The SACK blocks carried (RFC 2018 3), at most four.
    pub fn sack_blocks(&self) -> &[SackBlock] {
        &self.sack[..usize::from(self.sack_len)]
    }

    /// Replace the SACK blocks; keeps at most four.
    pub fn set_sack_blocks(&mut self, blocks: &[SackBlock]) {
        let n = blocks.len().min(4);
        // Unused slots are cleared, so equal options compare equal (derived `PartialEq`).
        self.sack = [SackBlock::default(); 4];
        self.sack[..n].copy_from_slice(&blocks[..n]);
        self.sack_len = n as u8;
    }

    /// Octets these options take on the wire, padded to a multiple of 4.
    pub fn wire_len(&self) -> usize {
        let mut n = 0;
        if self.mss.is_some() {
            n += 4;
        }
        if self.window_scale.is_some() {
            n += 4; // NOP + WS(3)
        }
        if self.timestamp.is_some() {
            n += 12; // NOP NOP TS(10), or SACKP(2) TS(10)
        } else if self.sack_permitted {
            n += 4; // NOP NOP SACKP(2)
        }
        if self.sack_len > 0 {
            n += 4 + 8 * usize::from(self.sack_len); // NOP NOP SACK(2 + 8n)
        }
        if let Some(r) = &self.rdma {
            n += r.len().next_multiple_of(4); // NOP NOP RDMA(2), or RDMA(4, 16, 20)
        }
        n
    }

    /// Parse the option bytes of a TCP header.
    pub fn parse(mut bytes: &[u8]) -> Result<TcpOptions, WireError> {
        let mut o = TcpOptions::default();
        while let Some((&kind, rest)) = bytes.split_first() {
            match kind {
                0 => break,
                1 => {
                    bytes = rest;
                    continue;
                }
                _ => {}
            }
            let len = usize::from(*rest.first().ok_or(WireError::TruncatedOption)?);
            if len < 2 {
                return Err(WireError::BadOptionLength);
            }
            if len > bytes.len() {
                return Err(WireError::TruncatedOption);
            }
            let body = &bytes[2..len];
            match kind {
                2 => {
                    let b: [u8; 2] = body.try_into().map_err(|_| WireError::BadOptionLength)?;
                    o.mss = Some(u16::from_be_bytes(b));
                }
                3 => {
                    let b: [u8; 1] = body.try_into().map_err(|_| WireError::BadOptionLength)?;
                    o.window_scale = Some(b[0]);
                }
                4 => {
                    if !body.is_empty() {
                        return Err(WireError::BadOptionLength);
                    }
                    o.sack_permitted = true;
                }
                5 => {
                    if body.is_empty() || !body.len().is_multiple_of(8) || body.len() > 32 {
                        return Err(WireError::BadOptionLength);
                    }
                    // A later SACK option replaces an earlier one entirely.
                    o.sack = [SackBlock::default(); 4];
                    let mut n = 0;
                    for chunk in body.chunks_exact(8) {
                        let left = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                        let right = u32::from_be_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]);
                        o.sack[n] = SackBlock { left, right };
                        n += 1;
                    }
                    o.sack_len = n as u8;
                }
                8 => {
                    if body.len() != 8 {
                        return Err(WireError::BadOptionLength);
                    }
                    let v = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                    let e = u32::from_be_bytes([body[4], body[5], body[6], body[7]]);
                    o.timestamp = Some((v, e));
                }
                rdma::KIND if o.rdma.is_none() && !o.rdma_malformed => {
                    match rdma::RdmaOptionView::new_checked(&bytes[..len]) {
                        Ok(view) => o.rdma = Some(rdma::RdmaOption::parse(&view)),
                        Err(_) => o.rdma_malformed = true,
                    }
                }
                _ => {}
            }
            bytes = &bytes[len..];
        }
        Ok(o)
    }

    /// The timestamp values if the timestamp is the only option (every segment of an
    /// established connection with timestamps, no SACK blocks).
    #[inline]
    fn timestamp_only(&self) -> Option<(u32, u32)> {
        match (
            self.timestamp,
            self.mss,
            self.window_scale,
            self.sack_permitted,
            self.sack_len,
            self.rdma,
        ) {
            (Some(ts), None, None, false, 0, None) => Some(ts),
            _ => None,
        }
    }

    /// Write the options into `out` (which must be at least `wire_len()`).
    fn emit(&self, out: &mut [u8]) -> usize {
        if let Some((v, e)) = self.timestamp_only() {
            // Every segment of an established connection with timestamps and no SACK
            // blocks, written at once.
            let mut o = [0; 12];
            o[..4].copy_from_slice(&TS_ONLY_LEAD);
            o[4..8].copy_from_slice(&v.to_be_bytes());
            o[8..].copy_from_slice(&e.to_be_bytes());
            out[..12].copy_from_slice(&o);
            return 12;
        }
        let mut i = 0;
        let mut put = |b: &[u8]| {
            out[i..i + b.len()].copy_from_slice(b);
            i += b.len();
        };
        if let Some(mss) = self.mss {
            let m = mss.to_be_bytes();
            put(&[2, 4, m[0], m[1]]);
        }
        if let Some(ws) = self.window_scale {
            put(&[1, 3, 3, ws]);
        }
        match (self.timestamp, self.sack_permitted) {
            (Some((v, e)), sp) => {
                if sp {
                    put(&[4, 2]);
                } else {
                    put(&[1, 1]);
                }
                put(&[8, 10]);
                put(&v.to_be_bytes());
                put(&e.to_be_bytes());
            }
            (None, true) => put(&[1, 1, 4, 2]),
            (None, false) => {}
        }
        if self.sack_len > 0 {
            put(&[1, 1, 5, 2 + 8 * self.sack_len]);
            for b in self.sack_blocks() {
                put(&b.left.to_be_bytes());
                put(&b.right.to_be_bytes());
            }
        }
        if let Some(r) = &self.rdma {
            // Everything before ends on a 4-octet boundary; the 2-octet form is padded in
            // front (draft-csapuntz-tcprdma-00 3.1.8).
            let mut b = [0u8; 20];
            if let Ok(n) = r.emit(&mut b) {
                if n == 2 {
                    put(&[1, 1]);
                }
                put(&b[..n]);
            }
        }
        i
    }
}

/// A received IPv4 packet carrying a TCP segment whose headers and lengths have been
/// checked, and, from [`new_checked`](Self::new_checked), both checksums verified. Zero-copy
/// over the caller's buffer.
#[derive(Debug, Clone)]
pub struct Ipv4TcpView<'a> {
    /// The packet up to the IPv4 total length.
    packet: &'a [u8],
    ip: Ipv4HeaderSlice<'a>,
    tcp: TcpSlice<'a>,
}

impl<'a> Ipv4TcpView<'a> {
    /// Validate `packet` (starting at the IPv4 header) and return the view.
    ///
    /// Checks: IPv4 version and IHL, total length within the buffer (octets
    /// beyond it, e.g. Ethernet padding, are ignored), header checksum, no
    /// fragmentation, protocol 6, TCP data offset (RFC 9293 3.1: at least 5,
    /// not past the segment), TCP checksum over the pseudo-header.
    #[inline]
    pub fn new_checked(packet: &'a [u8]) -> Result<Self, WireError> {
        Self::parse::<true>(packet, payload_sum)
    }

    /// [`new_checked`](Self::new_checked) with the payload's share of the TCP checksum from
    /// `payload_sum`: given the segment's data (after the TCP options, up to the IPv4 total
    /// length), it returns that data's ones' complement sum as
    /// [`Checksum::sum`](checksum::Checksum::sum) gives it, and may do more in the same
    /// read (an iWARP receiver computes the CRC of the FPDU the data holds). Called once,
    /// after every length check passed, before the TCP checksum is decided; a wrong sum fails
    /// the check.
    #[inline]
    pub fn new_checked_summing(
        packet: &'a [u8],
        payload_sum: impl FnOnce(&[u8]) -> u16,
    ) -> Result<Self, WireError> {
        Self::parse::<true>(packet, payload_sum)
    }

    /// [`new_checked`](Self::new_checked) without the two checksums: every length and the
    /// structure is checked (so every accessor is safe to call), the checksums can be asked
    /// for afterwards ([`ipv4_checksum_ok`](Self::ipv4_checksum_ok),
    /// [`tcp_checksum_ok`](Self::tcp_checksum_ok)). For tools and tests that look at
    /// segments whatever their checksums, or that rewrite them ([`fill_checksums`]).
    #[inline]
    pub fn new_unverified(packet: &'a [u8]) -> Result<Self, WireError> {
        Self::parse::<false>(packet, payload_sum)
    }

    /// The checks of `new_checked`, the checksums only when `VERIFY` (in the same order, so
    /// that a packet with several faults reports the same one either way).
    #[inline]
    fn parse<const VERIFY: bool>(
        packet: &'a [u8],
        payload_sum: impl FnOnce(&[u8]) -> u16,
    ) -> Result<Self, WireError> {
        if packet.len() < IPV4_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let ip = Ipv4HeaderSlice::from_slice(packet).map_err(|e| match e {
            etherparse::err::ipv4::HeaderSliceError::Len(_) => WireError::Truncated,
            etherparse::err::ipv4::HeaderSliceError::Content(_) => WireError::BadIpv4Header,
        })?;
        let header_len = ip.slice().len();
        let total_len = usize::from(ip.total_len());
        if total_len < header_len {
            return Err(WireError::BadIpv4Header);
        }
        if total_len > packet.len() {
            return Err(WireError::Truncated);
        }
        if VERIFY && !ipv4_header_sum_ok(ip.slice()) {
            return Err(WireError::BadIpv4Checksum);
        }
        if ip.is_fragmenting_payload() {
            return Err(WireError::Fragment);
        }
        if ip.protocol() != etherparse::IpNumber::TCP {
            return Err(WireError::NotTcp);
        }
        let packet = &packet[..total_len];
        let tcp_bytes = &packet[header_len..];
        if tcp_bytes.len() < TCP_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let data_offset = usize::from(tcp_bytes[12] >> 4) * 4;
        if data_offset < TCP_HEADER_LEN || data_offset > tcp_bytes.len() {
            return Err(WireError::BadDataOffset);
        }
        let tcp = TcpSlice::from_slice(tcp_bytes).map_err(|_| WireError::BadDataOffset)?;
        if VERIFY
            && !tcp_sum_ok(
                ip.source(),
                ip.destination(),
                tcp_bytes,
                data_offset,
                payload_sum,
            )
        {
            return Err(WireError::BadTcpChecksum);
        }
        Ok(Ipv4TcpView { packet, ip, tcp })
    }

    /// The IPv4 header.
    pub fn ip(&self) -> &Ipv4HeaderSlice<'a> {
        &self.ip
    }

    /// The TCP header and payload.
    pub fn tcp(&self) -> &TcpSlice<'a> {
        &self.tcp
    }

    /// The whole IPv4 packet, cut at its total length (octets after it, such as Ethernet
    /// padding, are not part of it).
    pub fn packet(&self) -> &'a [u8] {
        self.packet
    }

    /// Length of the IPv4 header, options included (IHL x 4, RFC 791 3.1).
    pub fn ip_header_len(&self) -> usize {
        self.ip.slice().len()
    }

    /// Length of the TCP header, options included (data offset x 4, RFC 9293 3.1).
    pub fn tcp_header_len(&self) -> usize {
        self.tcp.header_len()
    }

    /// The TCP control bits octet as on the wire (octet 13 of the TCP header, RFC 9293 3.1:
    /// CWR ECE URG ACK PSH RST SYN FIN from the high-order bit down).
    pub fn control_bits(&self) -> u8 {
        self.tcp.header_slice()[13]
    }

    /// The segment's data (after the TCP options, before any octets beyond the IPv4 total
    /// length).
    pub fn payload(&self) -> &'a [u8] {
        self.tcp.payload()
    }

    /// True if the IPv4 header checksum verifies (RFC 791 3.1).
    pub fn ipv4_checksum_ok(&self) -> bool {
        ipv4_header_sum_ok(self.ip.slice())
    }

    /// True if the TCP checksum, over the pseudo-header too, verifies (RFC 9293 3.1).
    pub fn tcp_checksum_ok(&self) -> bool {
        tcp_sum_ok(
            self.ip.source(),
            self.ip.destination(),
            &self.packet[self.ip_header_len()..],
            self.tcp_header_len(),
            payload_sum,
        )
    }
}

/// True if an IPv4 header, its checksum field included, sums to all ones (RFC 791 3.1).
#[inline]
fn ipv4_header_sum_ok(header: &[u8]) -> bool {
    Checksum::new().add_bytes(header).finish() == 0
}

/// The pseudo-header of a TCP segment in IPv4 (RFC 9293 3.1): addresses, zero, protocol 6,
/// TCP length.
#[inline]
fn pseudo_header(src: [u8; 4], dst: [u8; 4], tcp_len: u16) -> Checksum {
    Checksum::new()
        .add_4(src)
        .add_4(dst)
        .add_2([0, IP_PROTOCOL_TCP])
        .add_2(tcp_len.to_be_bytes())
}

/// True if a TCP segment, its checksum field included, sums to all ones over the
/// pseudo-header (RFC 9293 3.1). The header (`header_len` octets, a multiple of 4 not past
/// the segment) is summed here, the data by `payload_sum`.
#[inline]
fn tcp_sum_ok(
    src: [u8; 4],
    dst: [u8; 4],
    segment: &[u8],
    header_len: usize,
    payload_sum: impl FnOnce(&[u8]) -> u16,
) -> bool {
    let Ok(len) = u16::try_from(segment.len()) else {
        return false;
    };
    let (header, payload) = segment.split_at(header_len.min(segment.len()));
    pseudo_header(src, dst, len)
        .add_short(header)
        .add_sum(payload_sum(payload))
        .finish()
        == 0
}

/// The ones' complement sum of a segment's data, read for nothing else.
#[inline]
fn payload_sum(payload: &[u8]) -> u16 {
    Checksum::new().add_bytes(payload).sum()
}

/// Rewrites the IPv4 header checksum (RFC 791 3.1) and the TCP checksum (RFC 9293 3.1,
/// pseudo-header included) of the IPv4/TCP packet at the start of `packet`, after its fields
/// were changed. Octets beyond the IPv4 total length are neither read nor written. Returns the
/// packet's length (its total length), or why it is not a well-formed TCP packet in IPv4
/// (checksums aside, as [`Ipv4TcpView::new_unverified`]).
pub fn fill_checksums(packet: &mut [u8]) -> Result<usize, WireError> {
    let (total, header_len, src, dst) = {
        let v = Ipv4TcpView::new_unverified(packet)?;
        (
            v.packet().len(),
            v.ip_header_len(),
            v.ip().source(),
            v.ip().destination(),
        )
    };
    let (header, segment) = packet[..total].split_at_mut(header_len);
    header[10..12].fill(0);
    let ip_sum = Checksum::new().add_short(header).finish();
    header[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    segment[16..18].fill(0);
    // At most 65515 octets: the length was checked against the 16-bit total length.
    let tcp_sum = pseudo_header(src, dst, segment.len() as u16)
        .add_bytes(segment)
        .finish();
    segment[16..18].copy_from_slice(&tcp_sum.to_be_bytes());
    Ok(total)
}

/// The first look at a received IPv4 packet before it is parsed in full: whether it is IPv4
/// carrying TCP within the buffer, its addresses, ports and SYN bit, enough to classify a frame
/// and to pick the thread that owns its connection. Checked only for version 4, protocol 6 and
/// a total length from 20 octets up to the buffer's; a segment that is malformed otherwise
/// passes, for [`Ipv4TcpView::new_checked`] to reject (and a receive path to count as
/// malformed rather than as not TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4TcpPeek<'a> {
    /// The packet, cut at the IPv4 total length.
    packet: &'a [u8],
}

impl<'a> Ipv4TcpPeek<'a> {
    /// The peek at `packet` (starting at the IPv4 header), or `None` if it is not IPv4
    /// carrying TCP with a total length of at least 20 within the buffer.
    #[inline]
    pub fn new(packet: &'a [u8]) -> Option<Ipv4TcpPeek<'a>> {
        let h: &[u8; IPV4_HEADER_LEN] = packet.first_chunk()?;
        if h[0] >> 4 != 4 || h[9] != IP_PROTOCOL_TCP {
            return None;
        }
        let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
        if total < IPV4_HEADER_LEN || total > packet.len() {
            return None;
        }
        Some(Ipv4TcpPeek {
            packet: &packet[..total],
        })
    }

    /// The source address of an IPv4 packet of at least 20 octets, unchecked otherwise (e.g.
    /// one just emitted). Panics if shorter.
    #[inline]
    pub fn src_addr_of(packet: &[u8]) -> Ipv4Addr {
        Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15])
    }

    /// The destination address of an IPv4 packet of at least 20 octets, unchecked otherwise
    /// (e.g. one just emitted). Panics if shorter.
    #[inline]
    pub fn dst_addr_of(packet: &[u8]) -> Ipv4Addr {
        Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19])
    }

    /// The packet, cut at the IPv4 total length (Ethernet padding excluded).
    #[inline]
    pub fn packet(&self) -> &'a [u8] {
        self.packet
    }

    /// IPv4 source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv4Addr {
        Self::src_addr_of(self.packet)
    }

    /// IPv4 destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        Self::dst_addr_of(self.packet)
    }

    /// The TCP header's first octets past the IHL, if the packet holds `n` of them.
    #[inline]
    fn tcp_octets(&self, n: usize) -> Option<&'a [u8]> {
        let ihl = usize::from(self.packet[0] & 0x0f) * 4;
        self.packet.get(ihl..ihl + n)
    }

    /// TCP source and destination ports, `None` if the IHL leaves no room for them.
    #[inline]
    pub fn ports(&self) -> Option<(u16, u16)> {
        let t = self.tcp_octets(4)?;
        Some((
            u16::from_be_bytes([t[0], t[1]]),
            u16::from_be_bytes([t[2], t[3]]),
        ))
    }

    /// True for a connection request: SYN set, ACK and RST clear (RFC 9293 3.5; as the
    /// table judges it).
    #[inline]
    pub fn is_syn(&self) -> bool {
        self.tcp_octets(14)
            .is_some_and(|t| t[13] & (ACK_BIT | SYN_BIT | RST_BIT) == SYN_BIT)
    }

    /// True for a segment that may complete a handshake a SYN cookie answered: ACK set, SYN
    /// and RST clear (RFC 4987 3.6).
    #[inline]
    pub fn may_complete_cookie(&self) -> bool {
        self.tcp_octets(14)
            .is_some_and(|t| t[13] & (ACK_BIT | SYN_BIT | RST_BIT) == ACK_BIT)
    }
}

/// SYN in the TCP control bits octet.
const SYN_BIT: u8 = 0x02;
/// ACK in the TCP control bits octet.
const ACK_BIT: u8 = 0x10;
/// RST in the TCP control bits octet.
const RST_BIT: u8 = 0x04;

/// A TCP segment in IPv4, decoded. `payload` borrows from the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentRepr<'a> {
    /// IPv4 source address.
    pub src_addr: Ipv4Addr,
    /// The IPv4 header's Type of Service octet (RFC 791 3.1): the DSCP in its upper six bits
    /// (RFC 2474 3), the ECN field in its lower two (RFC 3168 5).
    pub tos: u8,
    /// IPv4 destination address.
    pub dst_addr: Ipv4Addr,
    /// TCP source port.
    pub src_port: u16,
    /// TCP destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number (meaningful when `flags.ack`).
    pub ack: u32,
    /// Control bits.
    pub flags: TcpFlags,
    /// Window field as on the wire (unscaled).
    pub window: u16,
    /// Decoded options.
    pub options: TcpOptions,
    /// Segment data.
    pub payload: &'a [u8],
}

impl<'a> SegmentRepr<'a> {
    /// Parse and validate an IPv4 packet into a segment representation.
    pub fn parse(packet: &'a [u8]) -> Result<SegmentRepr<'a>, WireError> {
        let view = Ipv4TcpView::new_checked(packet)?;
        Self::from_view(&view)
    }

    /// [`parse`](Self::parse) with the payload's checksum share from `payload_sum` (see
    /// [`Ipv4TcpView::new_checked_summing`]).
    pub fn parse_summing(
        packet: &'a [u8],
        payload_sum: impl FnOnce(&[u8]) -> u16,
    ) -> Result<SegmentRepr<'a>, WireError> {
        let view = Ipv4TcpView::new_checked_summing(packet, payload_sum)?;
        Self::from_view(&view)
    }

    /// Decode a checked view.
    pub fn from_view(view: &Ipv4TcpView<'a>) -> Result<SegmentRepr<'a>, WireError> {
        let t = view.tcp();
        let options = TcpOptions::parse(t.options())?;
        Ok(SegmentRepr {
            src_addr: view.ip().source_addr(),
            tos: view.ip().slice()[1],
            dst_addr: view.ip().destination_addr(),
            src_port: t.source_port(),
            dst_port: t.destination_port(),
            seq: t.sequence_number(),
            ack: t.acknowledgment_number(),
            flags: TcpFlags {
                fin: t.fin(),
                syn: t.syn(),
                rst: t.rst(),
                psh: t.psh(),
                ack: t.ack(),
                urg: t.urg(),
            },
            window: t.window_size(),
            options,
            payload: t.payload(),
        })
    }

    /// Sequence space the segment occupies: payload plus SYN and FIN.
    pub fn seq_len(&self) -> u32 {
        self.payload.len() as u32 + self.flags.syn as u32 + self.flags.fin as u32
    }

    /// Total IPv4 packet length this segment emits to.
    pub fn packet_len(&self) -> usize {
        IPV4_HEADER_LEN + TCP_HEADER_LEN + self.options.wire_len() + self.payload.len()
    }

    /// Emit the segment (IPv4 header, TCP header, options, payload) into
    /// `buf`, generating both checksums. Returns the packet length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let payload = self.payload;
        self.emit_with(buf, payload.len(), |out| out.copy_from_slice(payload))
    }

    /// Emit with a payload of `payload_len` octets written by `fill` straight
    /// into the packet buffer (no intermediate copy); `self.payload` is
    /// ignored.
    pub fn emit_with(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, WireError> {
        self.emit_with_summed(buf, payload_len, |out| {
            fill(out);
            None
        })
    }

    /// [`emit_with`](Self::emit_with) where `fill` may also return the ones' complement sum
    /// of the payload it wrote ([`Checksum::sum`] of it; the payload starts at an even
    /// offset of the TCP segment, a multiple of 4): the TCP checksum then covers the
    /// pseudo-header, header and options by reading them and the payload by that sum (RFC 1071
    /// 2(A), 2(C): the sum of a concatenation is the sum of the parts' sums), so a payload
    /// produced by a copy that summed it on the way is not read again. `None`: the payload is
    /// summed from `buf` as in `emit_with`.
    pub fn emit_with_summed(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Option<u16>,
    ) -> Result<usize, WireError> {
        let total = self.header_len() + payload_len;
        let buf = buf.get_mut(..total).ok_or(WireError::BufferTooSmall)?;
        self.emit_split(buf, payload_len, |payload| {
            fill(payload).unwrap_or_else(|| Checksum::new().add_bytes(payload).sum())
        })
    }

    /// Octets of the IPv4 and TCP headers (options included) this segment emits.
    pub fn header_len(&self) -> usize {
        IPV4_HEADER_LEN + TCP_HEADER_LEN + self.options.wire_len()
    }

    /// [`emit_with_summed`](Self::emit_with_summed) for a packet whose payload need not follow
    /// its headers in one buffer (the frames of a multi-buffer AF_XDP packet): the headers go
    /// at the start of `head`, and `fill` is given the rest of `head` (of any length, shorter
    /// or longer than the payload), writes the `payload_len` octets of payload from there on
    /// and wherever the caller keeps the rest, and returns their ones' complement sum
    /// ([`Checksum::sum`]), which the TCP checksum takes instead of reading them (RFC 1071
    /// 2(A), 2(C); the payload starts at an offset of the segment that is a multiple of 4).
    /// Returns the packet's length.
    pub fn emit_split(
        &self,
        head: &mut [u8],
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> u16,
    ) -> Result<usize, WireError> {
        let opt_len = self.options.wire_len();
        if opt_len > TCP_MAX_OPTIONS_LEN {
            return Err(WireError::OptionsTooLong);
        }
        let tcp_len = TCP_HEADER_LEN + opt_len + payload_len;
        let total = IPV4_HEADER_LEN + tcp_len;
        if total > usize::from(u16::MAX) {
            return Err(WireError::BufferTooSmall);
        }
        if head.len() < IPV4_HEADER_LEN + TCP_HEADER_LEN + opt_len {
            return Err(WireError::BufferTooSmall);
        }
        let (ip_out, rest) = head.split_at_mut(IPV4_HEADER_LEN);
        let (tcp, payload_room) = rest.split_at_mut(TCP_HEADER_LEN + opt_len);
        // The header checksums are summed from the field values, not read back from `buf`
        // (loads spanning the small stores just made would wait for them).
        let (src, dst) = (self.src_addr.octets(), self.dst_addr.octets());
        let addrs = Checksum::new().add_4(src).add_4(dst);
        // IPv4 header (RFC 791 3.1): DF set, ID 0 for atomic datagrams (RFC 6864 4.1).
        let total_be = (total as u16).to_be_bytes();
        let ip_sum = addrs
            .add_2([0x45, self.tos])
            .add_2(total_be)
            .add_2([0x40, 0])
            .add_2([64, 6])
            .finish()
            .to_be_bytes();
        let mut ip = [0x45, self.tos, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
        ip[2..4].copy_from_slice(&total_be);
        ip[10..12].copy_from_slice(&ip_sum);
        ip_out[..12].copy_from_slice(&ip);
        ip_out[12..16].copy_from_slice(&src);
        ip_out[16..20].copy_from_slice(&dst);
        // TCP header (RFC 9293 3.1).
        let ports = (u32::from(self.src_port) << 16 | u32::from(self.dst_port)).to_be_bytes();
        let seq = self.seq.to_be_bytes();
        let ack = if self.flags.ack { self.ack } else { 0 }.to_be_bytes();
        let off_flags = [
            (((TCP_HEADER_LEN + opt_len) / 4) as u8) << 4,
            self.flags.to_byte(),
        ];
        let window = self.window.to_be_bytes();
        tcp[0..4].copy_from_slice(&ports);
        tcp[4..8].copy_from_slice(&seq);
        tcp[8..12].copy_from_slice(&ack);
        tcp[12..14].copy_from_slice(&off_flags);
        tcp[14..16].copy_from_slice(&window);
        tcp[16..20].copy_from_slice(&[0, 0, 0, 0]);
        let written = self.options.emit(&mut tcp[TCP_HEADER_LEN..]);
        debug_assert_eq!(written, opt_len);
        let payload_sum = fill(payload_room);
        let pseudo = addrs.add_2([0, 6]).add_2((tcp_len as u16).to_be_bytes());
        let header = pseudo
            .add_4(ports)
            .add_4(seq)
            .add_4(ack)
            .add_2(off_flags)
            .add_2(window);
        let header = match self.options.timestamp_only() {
            Some((v, e)) => header
                .add_4(TS_ONLY_LEAD)
                .add_4(v.to_be_bytes())
                .add_4(e.to_be_bytes()),
            None => header.add_short(&tcp[TCP_HEADER_LEN..]),
        };
        let sum = header.add_sum(payload_sum).finish();
        tcp[16..18].copy_from_slice(&sum.to_be_bytes());
        Ok(total)
    }
}

/// The IPv4 and TCP headers of one connection's data segments, built once (RFC 791 3.1,
/// RFC 9293 3.1): addresses, ports, DF, TTL, protocol, the data offset and, with timestamps,
/// the option's lead (RFC 7323 Appendix A: NOP, NOP, kind 8, length 10) are the connection's;
/// per segment only the lengths, the sequence and acknowledgment numbers, PSH, the window, the
/// timestamp values and the two checksums change, and so only those are written and summed.
/// The octets are exactly those of [`SegmentRepr::emit_with_summed`] for an ACK segment
/// without SYN, FIN, RST or URG whose only option is timestamps (or that has none): the
/// established connection's data segment when it carries no SACK blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// IPv4 and TCP headers with every per-segment field zero (ACK set).
    head: [u8; DATA_HEADER_MAX],
    /// Octets of `head` in use: 40, or 52 with timestamps.
    len: usize,
    /// The pseudo-header's addresses and protocol (RFC 9293 3.1), the TCP header's fixed words:
    /// the ports and the timestamps' lead.
    fixed: Checksum,
    /// The IPv4 header's words but the total length (its checksum field zero).
    ip_fixed: Checksum,
}

/// IPv4 header, TCP header and the timestamps option with its two NOPs.
const DATA_HEADER_MAX: usize = IPV4_HEADER_LEN + TCP_HEADER_LEN + TIMESTAMP_OPTION_SPACE;

impl DataHeader {
    /// The headers of `tuple`'s data segments, with the timestamps option or without, and
    /// `tos` as the IPv4 Type of Service octet ([`SegmentRepr::tos`]).
    pub fn new(tuple: &FourTuple, timestamps: bool, tos: u8) -> DataHeader {
        let (src, dst) = (tuple.local_addr.octets(), tuple.remote_addr.octets());
        let len = if timestamps {
            DATA_HEADER_MAX
        } else {
            IPV4_HEADER_LEN + TCP_HEADER_LEN
        };
        let mut head = [0u8; DATA_HEADER_MAX];
        head[..12].copy_from_slice(&[0x45, tos, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0]);
        head[12..16].copy_from_slice(&src);
        head[16..20].copy_from_slice(&dst);
        let tcp = &mut head[IPV4_HEADER_LEN..];
        let ports =
            (u32::from(tuple.local_port) << 16 | u32::from(tuple.remote_port)).to_be_bytes();
        tcp[0..4].copy_from_slice(&ports);
        tcp[12] = (((len - IPV4_HEADER_LEN) / 4) as u8) << 4;
        tcp[13] = TcpFlags {
            ack: true,
            ..TcpFlags::default()
        }
        .to_byte();
        let addrs = Checksum::new().add_4(src).add_4(dst);
        let pseudo = addrs.add_2([0, 6]);
        let mut fixed = pseudo.add_4(ports);
        if timestamps {
            tcp[TCP_HEADER_LEN..TCP_HEADER_LEN + 4].copy_from_slice(&TS_ONLY_LEAD);
            fixed = fixed.add_4(TS_ONLY_LEAD);
        }
        let ip_fixed = addrs.add_2([0x45, tos]).add_2([0x40, 0]).add_2([64, 6]);
        DataHeader {
            head,
            len,
            fixed,
            ip_fixed,
        }
    }

    /// Whether the headers carry the timestamps option.
    pub fn has_timestamps(&self) -> bool {
        self.len == DATA_HEADER_MAX
    }

    /// Octets of the headers: 40, or 52 with timestamps.
    pub fn header_len(&self) -> usize {
        self.len
    }

    /// Writes a data segment of `payload_len` octets into `buf` and returns its length: the
    /// headers with these per-segment fields (`ts`: TSval and TSecr, ignored without the
    /// option), then `fill` writes the payload and, as in
    /// [`SegmentRepr::emit_with_summed`], may return its ones' complement sum so that the
    /// TCP checksum does not read it again (`None`: summed from `buf`).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn emit_summed(
        &self,
        buf: &mut [u8],
        seq: u32,
        ack: u32,
        psh: bool,
        window: u16,
        ts: (u32, u32),
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Option<u16>,
    ) -> Result<usize, WireError> {
        let buf = buf
            .get_mut(..self.len + payload_len)
            .ok_or(WireError::BufferTooSmall)?;
        self.emit_split(buf, seq, ack, psh, window, ts, payload_len, |payload| {
            fill(payload).unwrap_or_else(|| Checksum::new().add_bytes(payload).sum())
        })
    }

    /// [`DataHeader::emit_summed`] for a packet whose payload need not follow its headers in
    /// one buffer, as [`SegmentRepr::emit_split`]: the headers at the start of `head`, and
    /// `fill`, given the rest of `head`, writes the payload from there on (and on wherever the
    /// caller keeps the rest) and returns its ones' complement sum.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn emit_split(
        &self,
        head: &mut [u8],
        seq: u32,
        ack: u32,
        psh: bool,
        window: u16,
        ts: (u32, u32),
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]) -> u16,
    ) -> Result<usize, WireError> {
        let total = self.len + payload_len;
        if total > usize::from(u16::MAX) || head.len() < self.len {
            return Err(WireError::BufferTooSmall);
        }
        let (head, payload_room) = head.split_at_mut(self.len);
        // Lengths known at compile time in each branch: moves, not a call into `memcpy`.
        if self.len == DATA_HEADER_MAX {
            head.copy_from_slice(&self.head);
        } else {
            head.copy_from_slice(&self.head[..IPV4_HEADER_LEN + TCP_HEADER_LEN]);
        }
        let total_be = (total as u16).to_be_bytes();
        let ip_sum = self.ip_fixed.add_2(total_be).finish().to_be_bytes();
        let (ip, tcp) = head.split_at_mut(IPV4_HEADER_LEN);
        ip[2..4].copy_from_slice(&total_be);
        ip[10..12].copy_from_slice(&ip_sum);
        let (seq, ack, window) = (seq.to_be_bytes(), ack.to_be_bytes(), window.to_be_bytes());
        let off_flags = [tcp[12], tcp[13] | if psh { 1 << 3 } else { 0 }];
        tcp[4..8].copy_from_slice(&seq);
        tcp[8..12].copy_from_slice(&ack);
        tcp[13] = off_flags[1];
        tcp[14..16].copy_from_slice(&window);
        let ts = (ts.0.to_be_bytes(), ts.1.to_be_bytes());
        let timestamps = self.has_timestamps();
        if timestamps {
            tcp[24..28].copy_from_slice(&ts.0);
            tcp[28..32].copy_from_slice(&ts.1);
        }
        let tcp_len = ((total - IPV4_HEADER_LEN) as u16).to_be_bytes();
        let payload_sum = fill(payload_room);
        let sum = self
            .fixed
            .add_2(tcp_len)
            .add_4(seq)
            .add_4(ack)
            .add_2(off_flags)
            .add_2(window);
        let sum = if timestamps {
            sum.add_4(ts.0).add_4(ts.1)
        } else {
            sum
        };
        let sum = sum.add_sum(payload_sum).finish();
        tcp[16..18].copy_from_slice(&sum.to_be_bytes());
        Ok(total)
    }
}

impl FourTuple {
    /// The tuple of a received segment, seen from the receiver.
    pub fn of_received(seg: &SegmentRepr<'_>) -> FourTuple {
        FourTuple {
            local_addr: seg.dst_addr,
            local_port: seg.dst_port,
            remote_addr: seg.src_addr,
            remote_port: seg.src_port,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn flags_from_their_octet_and_back() {
        for bits in 0..64u8 {
            assert_eq!(TcpFlags::from_byte(bits).to_byte(), bits);
        }
        assert_eq!(
            TcpFlags::from_byte(0xC2),
            TcpFlags::from_byte(0x02),
            "ECE, CWR not kept"
        );
    }

    /// draft-csapuntz-tcprdma-00: the RDMA option among the SYN's options, 4-octet aligned
    /// (3.1.8), read back; only the first of several is read (3.3); a malformed one is noted
    /// and the segment still parses (it is ordinary data then).
    #[test]
    fn the_rdma_option_among_the_others() {
        use super::rdma::{RdmaFlags, RdmaOption, RdmaTransfer, Rid};
        let mut o = TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamp: Some((1, 2)),
            rdma: Some(RdmaOption::Permitted),
            ..TcpOptions::default()
        };
        assert_eq!(o.wire_len(), 24);
        let mut b = [0u8; 40];
        let n = o.emit(&mut b);
        assert_eq!(n, 24);
        assert_eq!(&b[20..24], &[1, 1, 25, 2]);
        assert_eq!(TcpOptions::parse(&b[..n]), Ok(o));
        let t = RdmaOption::Transfer(RdmaTransfer {
            flags: RdmaFlags {
                aligned: true,
                unsolicited: false,
            },
            rid: Rid::new(5).expect("rid"),
            buffer_offset: 900,
            data_offset: 0,
            data_length: 1000,
            total_length: Some(4000),
        });
        o = TcpOptions {
            timestamp: Some((1, 2)),
            rdma: Some(t),
            ..TcpOptions::default()
        };
        assert_eq!(o.wire_len(), 32);
        let n = o.emit(&mut b);
        assert_eq!((n, b[12], b[13]), (32, 25, 20));
        assert_eq!(TcpOptions::parse(&b[..n]), Ok(o));
        // A second RDMA option is not read.
        let mut two = b[..n].to_vec();
        two.extend_from_slice(&[25, 4, 0x40, 0]);
        assert_eq!(TcpOptions::parse(&two).map(|p| p.rdma), Ok(Some(t)));
        // A malformed one (length 12) leaves the segment's other options intact.
        let bad = [
            1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 25, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let p = TcpOptions::parse(&bad).expect("parses");
        assert_eq!(
            (p.rdma, p.rdma_malformed, p.timestamp),
            (None, true, Some((1, 2)))
        );
    }
    use super::*;

    fn sample<'a>(payload: &'a [u8]) -> SegmentRepr<'a> {
        let mut options = TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamp: Some((1, 2)),
            ..TcpOptions::default()
        };
        options.set_sack_blocks(&[SackBlock {
            left: 10,
            right: 20,
        }]);
        SegmentRepr {
            src_addr: Ipv4Addr::new(10, 0, 0, 1),
            tos: 0xb8,
            dst_addr: Ipv4Addr::new(10, 0, 0, 2),
            src_port: 4000,
            dst_port: 5000,
            seq: 0xdead_beef,
            ack: 7,
            flags: TcpFlags {
                syn: true,
                ack: true,
                ..TcpFlags::default()
            },
            window: 1234,
            options,
            payload,
        }
    }

    #[test]
    fn round_trip_all_options() {
        let repr = sample(b"hello world");
        let mut buf = [0u8; 200];
        let n = repr.emit(&mut buf).expect("emit");
        assert_eq!(n, repr.packet_len());
        assert_eq!(buf[1], 0xb8, "the Type of Service octet (DSCP 46, Not-ECT)");
        let parsed = SegmentRepr::parse(&buf[..n]).expect("parse");
        assert_eq!(parsed, repr);
        // etherparse agrees with our checksum.
        let view = Ipv4TcpView::new_checked(&buf[..n]).expect("view");
        let calc = view
            .tcp()
            .calc_checksum_ipv4(view.ip().source(), view.ip().destination());
        assert_eq!(calc.ok(), Some(view.tcp().checksum()));
    }

    #[test]
    fn timestamp_only_options_are_nop_nop_ts_and_verify() {
        // The emit shortcut for an established segment's options against the literal layout
        // (RFC 7323 Appendix A) and the parser; each other option combination takes the
        // general path (round_trip_all_options).
        let mut repr = sample(b"x");
        repr.flags.syn = false;
        repr.options = TcpOptions {
            timestamp: Some((0x0102_0304, 0xa0b0_c0d0)),
            ..TcpOptions::default()
        };
        let mut buf = [0u8; 100];
        let n = repr.emit(&mut buf).expect("emit");
        assert_eq!(n, 20 + 32 + 1);
        assert_eq!(
            buf[40..52],
            [1, 1, 8, 10, 1, 2, 3, 4, 0xa0, 0xb0, 0xc0, 0xd0]
        );
        assert_eq!(SegmentRepr::parse(&buf[..n]).expect("parse"), repr);
        for sack_permitted in [false, true] {
            repr.options.sack_permitted = sack_permitted;
            repr.options
                .set_sack_blocks(&[SackBlock { left: 5, right: 9 }]);
            let n = repr.emit(&mut buf).expect("emit");
            assert_eq!(SegmentRepr::parse(&buf[..n]).expect("parse"), repr);
        }
    }

    #[test]
    fn a_precomputed_payload_sum_gives_the_same_segment() {
        let data: Vec<u8> = (0..3100u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut lens: Vec<usize> = (0..=70).collect();
        lens.extend([1419, 1420, 1447, 1448, 1460, 2999]);
        let cases = lens
            .iter()
            .enumerate()
            .flat_map(|(k, &l)| [(k, l, false), (k, l, true)]);
        for (k, len, ts_only) in cases {
            let payload = &data[k % 7..k % 7 + len];
            let mut repr = sample(payload);
            if ts_only {
                // An established segment's options: the timestamp only (summed from values).
                repr.flags.syn = false;
                repr.options = TcpOptions {
                    timestamp: Some((0xfedc_ba98 ^ k as u32, 0x1357_9bdf)),
                    ..TcpOptions::default()
                };
            }
            let mut want = [0u8; 3200];
            let n = repr.emit(&mut want).expect("emit");
            let mut got = [0u8; 3200];
            let m = repr
                .emit_with_summed(&mut got, len, |out| {
                    out.copy_from_slice(payload);
                    Some(Checksum::new().add_bytes(payload).sum())
                })
                .expect("emit summed");
            assert_eq!(m, n, "len {len}");
            assert_eq!(got[..m], want[..n], "len {len}");
            // A sum that is off by one word: the segment does not verify.
            let m = repr
                .emit_with_summed(&mut got, len, |out| {
                    out.copy_from_slice(payload);
                    Some(Checksum::new().add_bytes(payload).add_2([0, 1]).sum())
                })
                .expect("emit summed");
            assert_eq!(
                SegmentRepr::parse(&got[..m]),
                Err(WireError::BadTcpChecksum),
                "len {len}"
            );
        }
    }

    #[test]
    fn corrupted_payload_fails_checksum() {
        let repr = sample(b"hello world");
        let mut buf = [0u8; 200];
        let n = repr.emit(&mut buf).expect("emit");
        buf[n - 1] ^= 0x40;
        assert_eq!(
            SegmentRepr::parse(&buf[..n]),
            Err(WireError::BadTcpChecksum)
        );
    }

    #[test]
    fn bad_data_offset_rejected() {
        let repr = sample(b"");
        let mut buf = [0u8; 200];
        let n = repr.emit(&mut buf).expect("emit");
        buf[IPV4_HEADER_LEN + 12] = 4 << 4;
        assert_eq!(SegmentRepr::parse(&buf[..n]), Err(WireError::BadDataOffset));
        buf[IPV4_HEADER_LEN + 12] = 15 << 4;
        assert_eq!(SegmentRepr::parse(&buf[..n]), Err(WireError::BadDataOffset));
    }

    #[test]
    fn truncated_and_bad_length_options() {
        assert_eq!(
            TcpOptions::parse(&[2, 4, 5]),
            Err(WireError::TruncatedOption)
        );
        assert_eq!(TcpOptions::parse(&[8]), Err(WireError::TruncatedOption));
        assert_eq!(
            TcpOptions::parse(&[2, 3, 5]),
            Err(WireError::BadOptionLength)
        );
        assert_eq!(TcpOptions::parse(&[99, 1]), Err(WireError::BadOptionLength));
        assert_eq!(
            TcpOptions::parse(&[5, 6, 0, 0, 0, 0]),
            Err(WireError::BadOptionLength)
        );
        // Unknown option skipped, EOL ends parsing.
        let o = TcpOptions::parse(&[30, 4, 9, 9, 1, 3, 3, 2, 0, 77]).expect("parse");
        assert_eq!(o.window_scale, Some(2));
    }

    /// Found by `cargo fuzz` (segment_parser): a second, shorter SACK option left stale
    /// blocks in unused slots, so options carrying the same blocks compared unequal.
    #[test]
    fn equal_sack_blocks_compare_equal() {
        let opt = |blocks: &[(u32, u32)]| {
            let mut v = vec![5u8, 2 + 8 * blocks.len() as u8];
            for (l, r) in blocks {
                v.extend_from_slice(&l.to_be_bytes());
                v.extend_from_slice(&r.to_be_bytes());
            }
            v
        };
        let mut bytes = opt(&[(1, 2), (3, 4)]);
        bytes.extend(opt(&[(9, 10)]));
        let twice = TcpOptions::parse(&bytes).expect("parse");
        let once = TcpOptions::parse(&opt(&[(9, 10)])).expect("parse");
        assert_eq!(twice.sack_blocks(), &[SackBlock { left: 9, right: 10 }]);
        assert_eq!(twice, once);
        let mut set = TcpOptions::default();
        set.set_sack_blocks(&[
            SackBlock { left: 1, right: 2 },
            SackBlock { left: 3, right: 4 },
        ]);
        set.set_sack_blocks(&[SackBlock { left: 9, right: 10 }]);
        assert_eq!(set, once);
    }

    #[test]
    fn four_sack_blocks_without_timestamps_fit() {
        let mut o = TcpOptions::default();
        let b = [SackBlock { left: 1, right: 2 }; 4];
        o.set_sack_blocks(&b);
        assert_eq!(o.wire_len(), 36);
        let mut buf = [0u8; 40];
        let n = o.emit(&mut buf);
        assert_eq!(
            TcpOptions::parse(&buf[..n]).expect("parse").sack_blocks(),
            &b
        );
    }

    proptest::proptest! {
        /// The prebuilt data headers write, octet for octet, what the general emitter writes
        /// for the same segment, with the payload's sum given or summed from the buffer.
        #[test]
        fn data_header_matches_the_general_emitter(
            ports in proptest::prelude::any::<(u16, u16)>(),
            addrs in proptest::prelude::any::<(u32, u32)>(),
            fields in proptest::prelude::any::<(u32, u32, u16, bool)>(),
            ts in proptest::prelude::any::<Option<(u32, u32)>>(),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1500),
            summed in proptest::prelude::any::<bool>(),
            tos in proptest::prelude::any::<u8>(),
            cut in 0usize..1500,
        ) {
            let tuple = FourTuple {
                local_addr: Ipv4Addr::from(addrs.0),
                local_port: ports.0,
                remote_addr: Ipv4Addr::from(addrs.1),
                remote_port: ports.1,
            };
            let (seq, ack, window, psh) = fields;
            let repr = SegmentRepr {
                src_addr: tuple.local_addr,
                tos,
                dst_addr: tuple.remote_addr,
                src_port: tuple.local_port,
                dst_port: tuple.remote_port,
                seq,
                ack,
                flags: TcpFlags {
                    ack: true,
                    psh,
                    ..TcpFlags::default()
                },
                window,
                options: TcpOptions {
                    timestamp: ts,
                    ..TcpOptions::default()
                },
                payload: &[],
            };
            let fill = |out: &mut [u8]| {
                out.copy_from_slice(&payload);
                summed.then(|| Checksum::new().add_bytes(&payload).sum())
            };
            let mut want = vec![0xa5u8; 1600];
            let mut got = vec![0x5au8; 1600];
            let n = repr.emit_with_summed(&mut want, payload.len(), fill).expect("general");
            let header = DataHeader::new(&tuple, ts.is_some(), tos);
            let m = header
                .emit_summed(&mut got, seq, ack, psh, window, ts.unwrap_or((7, 9)), payload.len(), fill)
                .expect("template");
            proptest::prop_assert_eq!(n, m);
            proptest::prop_assert_eq!(&want[..n], &got[..m]);
            let parsed = SegmentRepr::parse(&got[..m]).expect("parse");
            proptest::prop_assert_eq!(parsed.options.timestamp, ts);
            proptest::prop_assert_eq!(parsed.tos, tos);
            proptest::prop_assert_eq!(parsed.payload, &payload[..]);
            // In two pieces: the headers and the payload's first `cut` octets in the head, the
            // rest of the payload in a tail the fill writes itself (a multi-buffer packet).
            let cut = cut.min(payload.len());
            for general in [true, false] {
                let mut head = vec![0x77u8; repr.header_len() + cut];
                let mut tail = vec![0x33u8; payload.len() - cut];
                let split_fill = |first: &mut [u8]| {
                    first.copy_from_slice(&payload[..cut]);
                    tail.copy_from_slice(&payload[cut..]);
                    Checksum::new().add_bytes(&payload).sum()
                };
                let k = if general {
                    repr.emit_split(&mut head, payload.len(), split_fill)
                } else {
                    header.emit_split(&mut head, seq, ack, psh, window, ts.unwrap_or((7, 9)), payload.len(), split_fill)
                }
                .expect("split");
                proptest::prop_assert_eq!(k, n);
                head.extend_from_slice(&tail);
                proptest::prop_assert_eq!(&want[..n], &head[..]);
            }
        }
    }

    #[test]
    fn data_header_refuses_a_short_buffer() {
        let tuple = FourTuple {
            local_addr: Ipv4Addr::new(10, 0, 0, 1),
            local_port: 1,
            remote_addr: Ipv4Addr::new(10, 0, 0, 2),
            remote_port: 2,
        };
        let header = DataHeader::new(&tuple, true, 0);
        let mut buf = [0u8; 60];
        let r = header.emit_summed(&mut buf, 1, 2, false, 3, (4, 5), 9, |_| None);
        assert_eq!(r, Err(WireError::BufferTooSmall));
        assert_eq!(
            header.emit_summed(&mut buf, 1, 2, false, 3, (4, 5), 8, |_| None),
            Ok(60)
        );
    }

    #[test]
    fn the_unverified_view_checks_lengths_but_not_checksums() {
        let repr = sample(b"hello world");
        let mut buf = [0u8; 200];
        let n = repr.emit(&mut buf).expect("emit");
        // Ethernet-style padding after the packet is cut off.
        let padded = n + 6;
        let v = Ipv4TcpView::new_unverified(&buf[..padded]).expect("view");
        assert_eq!(v.packet().len(), n);
        assert_eq!(v.ip_header_len(), IPV4_HEADER_LEN);
        assert_eq!(v.tcp_header_len(), TCP_HEADER_LEN + repr.options.wire_len());
        assert_eq!(v.payload(), b"hello world");
        assert_eq!(v.control_bits(), 0x12, "SYN ACK");
        assert!(v.ipv4_checksum_ok() && v.tcp_checksum_ok());
        buf[n - 1] ^= 0x40;
        buf[IPV4_HEADER_LEN - 1] ^= 1;
        let v = Ipv4TcpView::new_unverified(&buf[..n]).expect("view");
        assert!(!v.ipv4_checksum_ok() && !v.tcp_checksum_ok());
        assert_eq!(
            Ipv4TcpView::new_checked(&buf[..n]).map(|_| ()),
            Err(WireError::BadIpv4Checksum)
        );
        // Lengths are still checked.
        assert_eq!(
            Ipv4TcpView::new_unverified(&buf[..n - 1]).map(|_| ()),
            Err(WireError::Truncated)
        );
        buf[IPV4_HEADER_LEN + 12] = 4 << 4;
        assert_eq!(
            Ipv4TcpView::new_unverified(&buf[..n]).map(|_| ()),
            Err(WireError::BadDataOffset)
        );
    }

    #[test]
    fn fill_checksums_repairs_a_rewritten_packet() {
        for payload in [&b""[..], b"a", b"odd length", b"even length!"] {
            let repr = sample(payload);
            let mut buf = [0u8; 200];
            let n = repr.emit(&mut buf).expect("emit");
            let want = buf;
            // Rewrite some fields (TTL, sequence number) and break both checksums.
            buf[8] = 1;
            buf[IPV4_HEADER_LEN + 7] ^= 0xff;
            buf[10] ^= 0x55;
            buf[IPV4_HEADER_LEN + 17] ^= 0x55;
            buf[n..n + 4].fill(0xee); // padding beyond the packet stays untouched
            assert_eq!(fill_checksums(&mut buf[..n + 4]), Ok(n));
            let v = Ipv4TcpView::new_checked(&buf[..n]).expect("verifies");
            assert_eq!(v.tcp().sequence_number(), repr.seq ^ 0xff);
            assert_eq!(buf[n..n + 4], [0xee; 4]);
            // Back to the original fields: the original checksums.
            buf[8] = 64;
            buf[IPV4_HEADER_LEN + 7] ^= 0xff;
            fill_checksums(&mut buf[..n]).expect("fill");
            assert_eq!(buf[..n], want[..n]);
        }
        assert_eq!(fill_checksums(&mut [0x45; 10]), Err(WireError::Truncated));
    }

    #[test]
    fn the_peek_reads_what_classification_needs() {
        let repr = sample(b"xyz");
        let mut buf = [0u8; 200];
        let n = repr.emit(&mut buf).expect("emit");
        let p = Ipv4TcpPeek::new(&buf[..n + 10]).expect("peek");
        assert_eq!(p.packet().len(), n);
        assert_eq!(p.src_addr(), repr.src_addr);
        assert_eq!(p.dst_addr(), repr.dst_addr);
        assert_eq!(Ipv4TcpPeek::dst_addr_of(&buf), repr.dst_addr);
        assert_eq!(Ipv4TcpPeek::src_addr_of(&buf), repr.src_addr);
        assert_eq!(p.ports(), Some((4000, 5000)));
        assert!(!p.is_syn(), "SYN ACK is not a connection request");
        let mut syn = sample(b"");
        syn.flags.ack = false;
        syn.options = TcpOptions::default();
        let m = syn.emit(&mut buf).expect("emit");
        assert!(Ipv4TcpPeek::new(&buf[..m]).expect("peek").is_syn());
        let mut syn_rst = syn;
        syn_rst.flags.rst = true;
        let r = syn_rst.emit(&mut buf).expect("emit");
        assert!(
            !Ipv4TcpPeek::new(&buf[..r]).expect("peek").is_syn(),
            "SYN RST is not a connection request"
        );
        let m = syn.emit(&mut buf).expect("emit");
        // A bad IHL still passes the peek (the full parse rejects it), without ports.
        let mut odd = buf;
        odd[0] = 0x4f;
        let p = Ipv4TcpPeek::new(&odd[..m]).expect("peek");
        assert_eq!(p.ports(), None);
        assert!(!p.is_syn());
        assert!(Ipv4TcpView::new_checked(&odd[..m]).is_err());
        // Not IPv4, not TCP, total length out of range.
        let mut b = buf;
        b[0] = 0x65;
        assert!(Ipv4TcpPeek::new(&b[..m]).is_none());
        let mut b = buf;
        b[9] = 17;
        assert!(Ipv4TcpPeek::new(&b[..m]).is_none());
        assert!(Ipv4TcpPeek::new(&buf[..m - 1]).is_none());
        let mut b = buf;
        b[2..4].copy_from_slice(&19u16.to_be_bytes());
        assert!(Ipv4TcpPeek::new(&b[..m]).is_none());
        assert!(Ipv4TcpPeek::new(&buf[..19]).is_none());
    }
}
