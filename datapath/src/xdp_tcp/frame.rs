//! Ethernet II framing around the IPv4 packets `tcp-engine` reads and writes, and the next-hop
//! MAC cache. No allocation on the per-packet paths.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use tcp_engine::wire::{EthernetFrame, EthernetRepr, Ipv4TcpPeek, ETHERTYPE_IPV4};

use crate::xsk::neighbour;

/// A received frame's IPv4 packet, trimmed to the IPv4 total length (Ethernet padding cut),
/// with the source MAC. `None` for anything that is not an untagged IPv4 frame carrying TCP
/// with a sane length (the steering program only redirects IPv4 TCP, so this is a second line
/// of defence, not the filter); the full parse is the connection table's.
pub(crate) fn ipv4_tcp_packet(frame: &[u8]) -> Option<(Ipv4TcpPeek<'_>, [u8; 6])> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != ETHERTYPE_IPV4 {
        return None;
    }
    Some((Ipv4TcpPeek::new(eth.payload())?, eth.src_addr()))
}

/// The destination address of an IPv4 packet (at least 20 octets).
pub(crate) fn ipv4_dst(ip: &[u8]) -> Ipv4Addr {
    Ipv4TcpPeek::dst_addr_of(ip)
}

/// Writes the Ethernet II header for an IPv4 packet.
pub(crate) fn write_eth(eth: &mut [u8], dst: [u8; 6], src: [u8; 6]) {
    EthernetRepr {
        src,
        dst,
        ethertype: ETHERTYPE_IPV4,
    }
    .emit(&mut EthernetFrame::new_unchecked(eth));
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    mac: Option<[u8; 6]>,
    /// When a negative entry was last asked of the kernel.
    checked: Instant,
}

/// Next-hop MAC addresses by remote IPv4 address.
///
/// Filled from three sources: the route and neighbour lookup of an active open
/// ([`crate::xsk::resolve_next_hop`]), the source MAC of a SYN that reaches a listener (the
/// next hop that delivered the SYN is the one to answer through), and, for an address seen in
/// neither way (a RST answering a stray segment), one non-blocking query of the kernel's
/// neighbour table, repeated at most once per [`NEGATIVE_RETRY`]. Bounded: when full, new
/// addresses are not cached (their packets are dropped and counted).
#[derive(Debug)]
pub(crate) struct Neighbours {
    ifindex: u32,
    map: HashMap<Ipv4Addr, Entry>,
    max: usize,
    /// The last successful lookup (one peer is the common case: no hashing per packet).
    last: Option<(Ipv4Addr, [u8; 6])>,
}

/// How long an address the kernel could not resolve is not asked again.
pub(crate) const NEGATIVE_RETRY: Duration = Duration::from_secs(1);

impl Neighbours {
    pub(crate) fn new(ifindex: u32, max: usize) -> Self {
        Self {
            ifindex,
            map: HashMap::with_capacity(max.min(1024)),
            max,
            last: None,
        }
    }

    /// Records `ip` -> `mac` (a newer fact replaces an older one).
    pub(crate) fn learn(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        if self.last == Some((ip, mac)) {
            return;
        }
        if self.map.len() >= self.max && !self.map.contains_key(&ip) {
            return;
        }
        self.map.insert(
            ip,
            Entry {
                mac: Some(mac),
                checked: Instant::now(),
            },
        );
        if self.last.is_some_and(|(l, _)| l == ip) {
            self.last = Some((ip, mac));
        }
    }

    /// The MAC for `ip`, asking the kernel's neighbour table when it is not cached.
    pub(crate) fn lookup(&mut self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        if let Some((l, mac)) = self.last {
            if l == ip {
                return Some(mac);
            }
        }
        match self.map.get(&ip) {
            Some(Entry { mac: Some(mac), .. }) => {
                let mac = *mac;
                self.last = Some((ip, mac));
                return Some(mac);
            }
            Some(Entry { mac: None, checked }) if checked.elapsed() < NEGATIVE_RETRY => {
                return None;
            }
            _ => {}
        }
        let found = self.ask_kernel(ip);
        if self.map.len() < self.max || self.map.contains_key(&ip) {
            self.map.insert(
                ip,
                Entry {
                    mac: found,
                    checked: Instant::now(),
                },
            );
        }
        if let Some(mac) = found {
            self.last = Some((ip, mac));
        }
        found
    }

    fn ask_kernel(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        // A netlink failure is treated like "unknown": the packet is dropped and counted.
        neighbour(self.ifindex, ip).ok().flatten()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xsk::packet::{tcp_flags, write_tcp_frame, TcpFrameSpec, ETH_HLEN};

    fn frame(flags: u8, payload: usize) -> Vec<u8> {
        let spec = TcpFrameSpec {
            src_mac: [2, 0, 0, 0, 0, 2],
            dst_mac: [2, 0, 0, 0, 0, 1],
            src_ip: Ipv4Addr::new(10, 77, 0, 2),
            dst_ip: Ipv4Addr::new(10, 77, 0, 1),
            src_port: 40000,
            dst_port: 18515,
            seq: 1,
            ack: 0,
            flags,
            window: 100,
            ip_id: 0,
        };
        let len = 54 + payload;
        // Room for Ethernet padding after the packet.
        let mut buf = vec![0xee; len + 6];
        write_tcp_frame(&mut buf, &spec, len, |p| p.fill(7)).expect("frame");
        buf
    }

    #[test]
    fn parses_ipv4_tcp_and_cuts_padding() {
        let f = frame(tcp_flags::SYN, 0);
        let (p, mac) = ipv4_tcp_packet(&f).expect("ipv4 tcp");
        let ip = p.packet();
        assert_eq!(ip.len(), 40, "padding cut at the IPv4 total length");
        assert_eq!(mac, [2, 0, 0, 0, 0, 2]);
        assert_eq!(p.src_addr(), Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(ipv4_dst(ip), Ipv4Addr::new(10, 77, 0, 1));
        assert!(p.is_syn());
        let f = frame(tcp_flags::SYN | tcp_flags::ACK, 10);
        let (p, _) = ipv4_tcp_packet(&f).expect("ipv4 tcp");
        assert!(!p.is_syn());
        assert_eq!(p.packet().len(), 50);
    }

    #[test]
    fn rejects_other_frames() {
        let mut f = frame(tcp_flags::ACK, 0);
        assert!(ipv4_tcp_packet(&f[..30]).is_none(), "truncated");
        f[12] = 0x86; // IPv6 ethertype
        f[13] = 0xdd;
        assert!(ipv4_tcp_packet(&f).is_none());
        let mut f = frame(tcp_flags::ACK, 0);
        f[ETH_HLEN + 9] = 17; // UDP
        assert!(ipv4_tcp_packet(&f).is_none());
        let mut f = frame(tcp_flags::ACK, 0);
        f[ETH_HLEN + 2] = 0x10; // total length beyond the frame
        assert!(ipv4_tcp_packet(&f).is_none());
    }

    #[test]
    fn ethernet_header_round_trip() {
        let mut eth = [0u8; ETH_HLEN];
        write_eth(&mut eth, [1; 6], [2; 6]);
        assert_eq!(&eth[..6], &[1; 6]);
        assert_eq!(&eth[6..12], &[2; 6]);
        assert_eq!(&eth[12..], &[0x08, 0x00]);
    }

    #[test]
    fn neighbour_cache_learns_replaces_and_is_bounded() {
        // Interface index 0 exists nowhere: kernel queries find nothing.
        let mut n = Neighbours::new(0, 2);
        let a = Ipv4Addr::new(192, 0, 2, 1);
        let b = Ipv4Addr::new(192, 0, 2, 2);
        let c = Ipv4Addr::new(192, 0, 2, 3);
        n.learn(a, [1; 6]);
        assert_eq!(n.lookup(a), Some([1; 6]));
        n.learn(a, [9; 6]);
        assert_eq!(
            n.lookup(a),
            Some([9; 6]),
            "newer fact wins, also in the fast path"
        );
        n.learn(b, [2; 6]);
        n.learn(c, [3; 6]);
        assert_eq!(n.len(), 2, "bounded");
        assert_eq!(n.lookup(b), Some([2; 6]));
        assert_eq!(n.lookup(c), None, "not cached, kernel does not know it");
    }
}
