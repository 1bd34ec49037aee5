//! Why a received packet was not accepted: the one error type of every view in [`super`].

/// Why a received packet was not accepted as a TCP segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than the headers it claims to have.
    #[error("packet truncated")]
    Truncated,
    /// Not an IPv4 packet, or the IPv4 header is malformed.
    #[error("malformed IPv4 header")]
    BadIpv4Header,
    /// The IPv4 header checksum does not verify (RFC 791 3.1).
    #[error("IPv4 header checksum mismatch")]
    BadIpv4Checksum,
    /// The IP payload is not TCP.
    #[error("IP payload is not TCP")]
    NotTcp,
    /// The packet is an IP fragment (the engine does not reassemble).
    #[error("IP fragment")]
    Fragment,
    /// The TCP data offset is below 5 or beyond the segment.
    #[error("bad TCP data offset")]
    BadDataOffset,
    /// The TCP checksum does not verify (RFC 9293 3.1).
    #[error("TCP checksum mismatch")]
    BadTcpChecksum,
    /// The IP payload is not ICMP ([`parse_frag_needed`](super::parse_frag_needed)).
    #[error("IP payload is not ICMP")]
    NotIcmp,
    /// The ICMP checksum does not verify (RFC 792).
    #[error("ICMP checksum mismatch")]
    BadIcmpChecksum,
    /// An ICMP message other than "fragmentation needed and DF set" (type 3, code 4).
    #[error("ICMP message is not fragmentation needed")]
    NotFragNeeded,
    /// An option's length runs past the end of the option space.
    #[error("truncated TCP option")]
    TruncatedOption,
    /// A known option has a length other than its defined one.
    #[error("TCP option with invalid length")]
    BadOptionLength,
    /// The output buffer is too small for the segment.
    #[error("output buffer too small")]
    BufferTooSmall,
    /// The options do not fit in 40 octets.
    #[error("TCP options too long")]
    OptionsTooLong,
}
