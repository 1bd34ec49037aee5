//! Receive-side scaling: which RX queue a NIC puts a flow on. A NIC hashes each received
//! packet's addresses and ports with the Toeplitz function under its secret key and looks the
//! hash up in its indirection table; the entry is the queue. Reading the key and the table
//! (`ETHTOOL_GRSSH`) tells a connecting side which source port makes the peer's packets land
//! on the queue of the engine shard that owns the connection (issue #24, point 5).

use std::io;
use std::net::SocketAddrV4;

use super::ethtool::{ETHTOOL_GRSSH, ETHTOOL_GRXFH};

/// `ETH_RSS_HASH_TOP`: the Toeplitz hash function's bit in `ethtool_rxfh.hfunc`.
const ETH_RSS_HASH_TOP: u8 = 1;
/// Octets of `struct ethtool_rxfh` before its `rss_config` array: cmd, rss_context,
/// indir_size, key_size (u32 each), hfunc, input_xfrm, two reserved octets, a reserved u32.
const RXFH_HEADER: usize = 24;
/// `TCP_V4_FLOW`: IPv4/TCP's flow type.
const TCP_V4_FLOW: u32 = 0x01;
/// `RXH_IP_SRC | RXH_IP_DST | RXH_L4_B_0_1 | RXH_L4_B_2_3`: both addresses and both ports,
/// the input [`RssTable::hash`] computes.
const RXH_ADDRESSES_AND_PORTS: u64 = (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7);
/// Octets of the Toeplitz input of an IPv4/TCP packet: source and destination address,
/// source and destination port.
const IPV4_TCP_INPUT: usize = 12;

/// The Toeplitz hash of `input` under `key` (the RSS hash, as in Microsoft's "RSS hashing
/// functions" and Linux's `ethtool_rxfh`): for every set bit of the input, in order from the
/// first octet's most significant bit, the 32 key bits starting at that bit's position are
/// XORed into the result. `key` must be at least `input.len() + 4` octets; missing key octets
/// count as zero.
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let key_octet = |i: usize| u32::from(key.get(i).copied().unwrap_or(0));
    // The key's 32-bit window at the current bit, and the octet that slides in after it.
    let mut window =
        (key_octet(0) << 24) | (key_octet(1) << 16) | (key_octet(2) << 8) | key_octet(3);
    let mut hash = 0u32;
    for (i, &octet) in input.iter().enumerate() {
        let next = key_octet(i + 4);
        for bit in (0..8).rev() {
            if octet >> bit & 1 == 1 {
                hash ^= window;
            }
            window = (window << 1) | (next >> bit & 1);
        }
    }
    hash
}

/// An interface's RSS configuration: its Toeplitz key and indirection table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssTable {
    key: Vec<u8>,
    indirection: Vec<u32>,
}

impl RssTable {
    /// A table of `key` and `indirection`; `None` if the key is too short for an IPv4/TCP
    /// input (16 octets) or the table is empty.
    pub fn new(key: Vec<u8>, indirection: Vec<u32>) -> Option<RssTable> {
        (key.len() >= IPV4_TCP_INPUT + 4 && !indirection.is_empty())
            .then_some(RssTable { key, indirection })
    }

    /// The hash of an IPv4/TCP packet from `src` to `dst`.
    pub fn hash(&self, src: SocketAddrV4, dst: SocketAddrV4) -> u32 {
        let mut input = [0u8; IPV4_TCP_INPUT];
        input[..4].copy_from_slice(&src.ip().octets());
        input[4..8].copy_from_slice(&dst.ip().octets());
        input[8..10].copy_from_slice(&src.port().to_be_bytes());
        input[10..].copy_from_slice(&dst.port().to_be_bytes());
        toeplitz(&self.key, &input)
    }

    /// The RX queue the NIC puts an IPv4/TCP packet from `src` to `dst` on: the indirection
    /// table's entry at the hash modulo its size (the table sizes NICs use are powers of two,
    /// where this is the hash's low bits).
    pub fn queue_of(&self, src: SocketAddrV4, dst: SocketAddrV4) -> u32 {
        let i = self.hash(src, dst) as usize % self.indirection.len();
        self.indirection[i]
    }

    /// Octets of the key and entries of the table.
    pub fn sizes(&self) -> (usize, usize) {
        (self.key.len(), self.indirection.len())
    }

    /// Reads `ifname`'s key and table with `ETHTOOL_GRSSH` (in the calling thread's network
    /// namespace). Fails with `Unsupported` where the driver has no RSS (veth), or hashes
    /// otherwise than [`RssTable::hash`] computes (see [`check_hashing`]).
    pub fn read(ifname: &str) -> io::Result<RssTable> {
        // First the sizes, then the table and key.
        let (indir_size, key_size) = grssh_sizes(ifname)?;
        let (indirection, key, hfunc, input_xfrm) = grssh(ifname, indir_size, key_size)?;
        // A driver that does not say which fields it hashes (no `ETHTOOL_GRXFH`) is taken to
        // hash addresses and ports, IPv4/TCP's usual default.
        let fields = tcp4_hash_fields(ifname).ok();
        check_hashing(hfunc, input_xfrm, fields).map_err(|why| {
            io::Error::new(io::ErrorKind::Unsupported, format!("{ifname}'s RSS: {why}"))
        })?;
        RssTable::new(key, indirection).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{ifname} has no usable RSS key and indirection table"),
            )
        })
    }
}

/// Whether a NIC's RSS hash is the one [`RssTable::hash`] computes: the Toeplitz function
/// (`hfunc`), over the input as it is (no symmetric transform, `input_xfrm`: Linux 6.8's
/// `RXH_XFRM_SYM_XOR` and later ones reorder or combine the fields first), of both IPv4
/// addresses and both TCP ports (`fields`, `ETHTOOL_GRXFH`'s answer for `TCP_V4_FLOW`, if
/// the driver gave one). Otherwise the reason, for the log: a source port chosen by the
/// hash would land on an arbitrary queue.
pub fn check_hashing(hfunc: u8, input_xfrm: u8, fields: Option<u64>) -> Result<(), String> {
    if hfunc & ETH_RSS_HASH_TOP == 0 {
        return Err(format!("the hash function ({hfunc:#x}) is not Toeplitz"));
    }
    if input_xfrm != 0 {
        return Err(format!(
            "the hash's input is transformed first (input_xfrm {input_xfrm:#x}, e.g. symmetric)"
        ));
    }
    match fields {
        Some(f) if f != RXH_ADDRESSES_AND_PORTS => Err(format!(
            "IPv4/TCP is hashed over fields {f:#x}, not both addresses and both ports"
        )),
        _ => Ok(()),
    }
}

/// The header fields `ifname` hashes IPv4/TCP packets over (`ETHTOOL_GRXFH` for
/// `TCP_V4_FLOW`: `RXH_*` bits).
fn tcp4_hash_fields(ifname: &str) -> io::Result<u64> {
    // The original `struct ethtool_rxnfc` the kernel still reads and writes for this
    // command: cmd and flow_type (u32 each), then data (u64).
    let mut buf = [ETHTOOL_GRXFH, TCP_V4_FLOW, 0, 0];
    super::ethtool::ioctl(ifname, &mut buf, "its RSS hash fields (ETHTOOL_GRXFH)")?;
    let mut data = [0u8; 8];
    data[..4].copy_from_slice(&buf[2].to_ne_bytes());
    data[4..].copy_from_slice(&buf[3].to_ne_bytes());
    Ok(u64::from_ne_bytes(data))
}

/// The indirection table's entries and the key's octets `ETHTOOL_GRSSH` reports.
fn grssh_sizes(ifname: &str) -> io::Result<(u32, u32)> {
    let mut buf = [0u32; RXFH_HEADER / 4];
    ethtool(ifname, &mut buf)?;
    Ok((buf[2], buf[3]))
}

/// `ETHTOOL_GRSSH` asking for `indir_size` table entries and `key_size` key octets: the table,
/// the key, the hash function octet and the input transform octet (0 before Linux 6.8).
fn grssh(ifname: &str, indir_size: u32, key_size: u32) -> io::Result<(Vec<u32>, Vec<u8>, u8, u8)> {
    let entries = indir_size as usize;
    let words = RXFH_HEADER / 4 + entries + (key_size as usize).div_ceil(4);
    if words > 1 << 16 {
        return Err(io::Error::other("implausible RSS table or key size"));
    }
    // u32 words: the kernel's struct is 4-octet aligned.
    let mut buf = vec![0u32; words];
    buf[0] = ETHTOOL_GRSSH;
    buf[2] = indir_size;
    buf[3] = key_size;
    ethtool(ifname, &mut buf)?;
    if buf[2] != indir_size || buf[3] != key_size {
        return Err(io::Error::other(
            "the RSS table or key changed size while read",
        ));
    }
    let [hfunc, input_xfrm, ..] = buf[4].to_ne_bytes();
    let indirection = buf[RXFH_HEADER / 4..RXFH_HEADER / 4 + entries].to_vec();
    let key: Vec<u8> = buf[RXFH_HEADER / 4 + entries..]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .take(key_size as usize)
        .collect();
    Ok((indirection, key, hfunc, input_xfrm))
}

/// Runs `ETHTOOL_GRSSH` on `ifname` with `buf` as its `struct ethtool_rxfh` (the sizes in
/// words 2 and 3 say how much room follows the header, which `buf` has); the kernel reads and
/// writes `buf`.
fn ethtool(ifname: &str, buf: &mut [u32]) -> io::Result<()> {
    buf[0] = ETHTOOL_GRSSH;
    super::ethtool::ioctl(ifname, buf, "its RSS configuration (ETHTOOL_GRSSH)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Microsoft's "Verifying the RSS Hash Calculation" key.
    const KEY: [u8; 40] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
    ];

    fn addr(s: &str) -> SocketAddrV4 {
        s.parse().expect("an IPv4 socket address")
    }

    /// Only the Toeplitz hash of both addresses and both ports, untransformed, is one the
    /// source port can steer: anything else is said, and the port is left to the kernel.
    #[test]
    fn only_the_plain_toeplitz_hash_of_the_four_tuple_is_used() {
        assert_eq!(check_hashing(1, 0, Some(0xf0)), Ok(()));
        assert_eq!(check_hashing(1, 0, None), Ok(()), "the driver does not say");
        assert!(check_hashing(2, 0, Some(0xf0)).is_err(), "XOR hash");
        assert!(
            check_hashing(1, 1, Some(0xf0)).is_err(),
            "symmetric-XOR input"
        );
        assert!(check_hashing(1, 0, Some(0x30)).is_err(), "addresses only");
        assert!(check_hashing(1, 0, Some(0xf2)).is_err(), "the VLAN tag too");
    }

    /// The published IPv4 verification vectors: destination, source, the hash of the
    /// addresses alone and of addresses and ports.
    #[test]
    fn the_published_ipv4_vectors() {
        let vectors = [
            (
                "161.142.100.80:1766",
                "66.9.149.187:2794",
                0x323e_8fc2,
                0x51cc_c178,
            ),
            (
                "65.69.140.83:4739",
                "199.92.111.2:14230",
                0xd718_262a,
                0xc626_b0ea,
            ),
            (
                "12.22.207.184:38024",
                "24.19.198.95:12898",
                0xd2d0_a5de,
                0x5c2b_394a,
            ),
            (
                "209.142.163.6:2217",
                "38.27.205.30:48228",
                0x8298_9176,
                0xafc7_327f,
            ),
            (
                "202.188.127.2:1303",
                "153.39.163.191:44251",
                0x5d18_09c5,
                0x10e8_28a2,
            ),
        ];
        let table = RssTable::new(KEY.to_vec(), vec![0]).expect("a table");
        for (dst, src, ip_only, with_tcp) in vectors {
            let (dst, src) = (addr(dst), addr(src));
            let mut input = src.ip().octets().to_vec();
            input.extend(dst.ip().octets());
            assert_eq!(toeplitz(&KEY, &input), ip_only, "{src} -> {dst}, addresses");
            assert_eq!(table.hash(src, dst), with_tcp, "{src} -> {dst}, with ports");
        }
    }

    #[test]
    fn the_queue_is_the_indirection_entry_at_the_hash() {
        let (src, dst) = (addr("66.9.149.187:2794"), addr("161.142.100.80:1766"));
        // 0x51ccc178 % 128 = 0x78 = 120.
        let indirection: Vec<u32> = (0..128).map(|i| i % 4).collect();
        let table = RssTable::new(KEY.to_vec(), indirection).expect("a table");
        assert_eq!(table.queue_of(src, dst), 120 % 4);
        assert_eq!(table.sizes(), (40, 128));
        assert_eq!(RssTable::new(KEY[..15].to_vec(), vec![0]), None);
        assert_eq!(RssTable::new(KEY.to_vec(), Vec::new()), None);
    }

    #[test]
    fn a_bad_interface_name_is_an_error() {
        assert!(RssTable::read("").is_err());
        assert!(RssTable::read("a-name-far-too-long-for-ifnamsiz").is_err());
    }
}
