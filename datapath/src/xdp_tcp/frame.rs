//! Ethernet II framing around the IPv4 packets `tcp-engine` reads and writes, and the next-hop
//! MAC cache. No allocation on the per-packet paths.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use tcp_engine::wire::{
    EthernetFrame, EthernetRepr, Ipv4TcpPeek, ETHERTYPE_IPV4, IP_PROTOCOL_ICMP,
};

use crate::xsk::next_hop_mac;

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

/// A received frame's IPv4 packet if it carries ICMP (Ethernet padding left on: the full
/// parse, [`tcp_engine::wire::parse_frag_needed`], cuts at the total length). The steering
/// program redirects ICMP "fragmentation needed" messages about our flows (`xdp-prog`).
pub(crate) fn ipv4_icmp_packet(frame: &[u8]) -> Option<&[u8]> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    let ip = eth.payload();
    (eth.ethertype() == ETHERTYPE_IPV4 && ip.get(9) == Some(&IP_PROTOCOL_ICMP)).then_some(ip)
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
    /// Looked up since eviction last passed it (its second chance).
    used: bool,
    /// Taken from a SYN alone ([`Neighbours::learn_passive`]), no handshake completed from
    /// that MAC yet: a later SYN may replace it.
    unconfirmed: bool,
}

impl Entry {
    /// What is known of an address now: its MAC, or (`None`) that the kernel had none.
    fn new(mac: Option<[u8; 6]>) -> Entry {
        Entry {
            mac,
            checked: Instant::now(),
            used: false,
            unconfirmed: false,
        }
    }

    /// A MAC taken from a SYN, not confirmed by a handshake yet.
    fn unconfirmed(mac: [u8; 6]) -> Entry {
        Entry {
            unconfirmed: true,
            ..Entry::new(Some(mac))
        }
    }
}

/// Next-hop MAC addresses by remote IPv4 address.
///
/// Filled from three sources: the route and neighbour lookup of an active open
/// ([`crate::xsk::resolve_next_hop`]), the source MAC of a valid SYN that opened a connection
/// at a listener (the next hop that delivered it is the one to answer through) when nothing
/// is known of that address yet, and, for an address seen in neither way (a RST answering a
/// stray segment, an entry evicted), one non-blocking query of the kernel's routing and
/// neighbour tables (the next hop's MAC: a gateway's for an address behind a router),
/// repeated at most once per [`NEGATIVE_RETRY`].
///
/// Hardened against spoofing: a SYN never replaces what is known of an address
/// ([`Neighbours::learn_passive`]): a SYN forged with a connected peer's address cannot
/// redirect that peer's traffic (its SYN-ACK goes to the real peer, which resets it). What a
/// SYN taught is unconfirmed until a handshake from that address completes
/// ([`Neighbours::confirm`]); until then a later SYN replaces it, so that a SYN forged from an
/// address nothing was known of, from a MAC that never answers, does not keep the real host
/// out (its SYN-ACKs sent to the forger's MAC). Only an active open's resolution (the kernel's
/// own neighbour table) or a completed handshake replaces a confirmed entry. Bounded:
/// when full, the oldest entry not looked up since eviction last passed it is evicted (a
/// second chance, close to least recently used; its address is asked of the kernel again
/// when next needed), so spoofed addresses cannot fill the cache for good; an address the kernel
/// does not know is not cached at all then (it would evict a known one), and the kernel is
/// asked at most [`KERNEL_QUERIES_PER_SECOND`] times a second (each query dumps its table
/// over netlink on the engine thread: a flood of segments from spoofed addresses, each
/// answered with a RST or a cookie SYN-ACK to a new address, would make one per packet).
#[derive(Debug)]
pub(crate) struct Neighbours {
    ifindex: u32,
    map: HashMap<Ipv4Addr, Entry>,
    /// The map's addresses in the order eviction passes them (an address enters at the back
    /// when first cached, and goes back there when spared).
    order: VecDeque<Ipv4Addr>,
    max: usize,
    /// The last successful lookup (one peer is the common case: no hashing per packet). Its
    /// entry's `used` is set when another address takes its place ([`Neighbours::set_last`]):
    /// the lookups it served never touched the map.
    last: Option<(Ipv4Addr, [u8; 6])>,
    /// The second the kernel queries are counted in, and how many it has had.
    queries_since: Option<Instant>,
    queries: u32,
    /// Kernel queries made (for tests and counters).
    kernel_queries: u64,
}

/// How long an address the kernel could not resolve is not asked again.
pub(crate) const NEGATIVE_RETRY: Duration = Duration::from_secs(1);

/// The most queries of the kernel's neighbour table a second ([`Neighbours`]).
pub(crate) const KERNEL_QUERIES_PER_SECOND: u32 = 16;

impl Neighbours {
    pub(crate) fn new(ifindex: u32, max: usize) -> Self {
        Self {
            ifindex,
            map: HashMap::with_capacity(max.min(1024)),
            order: VecDeque::with_capacity(max.min(1024)),
            max: max.max(1),
            last: None,
            queries_since: None,
            queries: 0,
            kernel_queries: 0,
        }
    }

    /// Whether the kernel may be asked now (at most [`KERNEL_QUERIES_PER_SECOND`] a second);
    /// counts the query if so.
    fn may_ask_kernel(&mut self) -> bool {
        let now = Instant::now();
        if self
            .queries_since
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            self.queries_since = Some(now);
            self.queries = 0;
        }
        if self.queries >= KERNEL_QUERIES_PER_SECOND {
            return false;
        }
        self.queries += 1;
        self.kernel_queries += 1;
        true
    }

    /// Inserts or replaces `ip`'s entry, evicting the oldest address when full; an unknown
    /// address (a negative entry) is not cached when full rather than evict a known one.
    fn insert(&mut self, ip: Ipv4Addr, entry: Entry) {
        if !self.map.contains_key(&ip) {
            if entry.mac.is_none() && self.map.len() >= self.max {
                return;
            }
            // An entry looked up since the last pass (or the last one looked up, which the
            // fast path does not mark) is spared once; at most a round of spares, so this
            // ends.
            let mut spares = self.order.len();
            while self.map.len() >= self.max {
                let Some(old) = self.order.pop_front() else {
                    break;
                };
                let recent = self.last.is_some_and(|(l, _)| l == old);
                match self.map.get_mut(&old) {
                    Some(e) if spares > 0 && (e.used || recent) => {
                        spares -= 1;
                        e.used = false;
                        self.order.push_back(old);
                    }
                    Some(_) => {
                        self.map.remove(&old);
                        if recent {
                            self.last = None;
                        }
                    }
                    None => {}
                }
            }
            self.order.push_back(ip);
        }
        self.map.insert(ip, entry);
        if self.last.is_some_and(|(l, _)| l == ip) {
            self.last = entry.mac.map(|m| (ip, m));
        }
    }

    /// Records `ip` -> `mac` from the kernel's own resolution (an active open's next hop): a
    /// newer fact replaces an older one.
    pub(crate) fn learn(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        // Whatever the fast path holds: an entry a SYN taught is confirmed here.
        self.insert(ip, Entry::new(Some(mac)));
    }

    /// Records `ip` -> `mac` from a valid SYN that opened a connection, unconfirmed: when
    /// nothing is known of `ip` (a negative entry aside) or only what another SYN taught;
    /// never replacing a confirmed MAC.
    pub(crate) fn learn_passive(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        match self.map.get(&ip) {
            Some(Entry {
                mac: Some(known),
                unconfirmed,
                ..
            }) if !unconfirmed || *known == mac => {}
            _ => self.insert(ip, Entry::unconfirmed(mac)),
        }
    }

    /// A valid SYN from `ip` answered with a SYN cookie (no connection kept): replaces an
    /// unconfirmed MAC, as [`Neighbours::learn_passive`] would, but caches nothing new.
    pub(crate) fn replace_unconfirmed(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        if let Some(e) = self.map.get(&ip) {
            if e.unconfirmed && e.mac != Some(mac) {
                self.insert(ip, Entry::unconfirmed(mac));
            }
        }
    }

    /// A handshake with `ip` completed, its last segment from `mac` (whoever completed it had
    /// our SYN-ACK): `mac` is confirmed, replacing what a SYN alone taught, or taken if
    /// nothing was known. A confirmed MAC stays as it is.
    pub(crate) fn confirm(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        match self.map.get(&ip) {
            Some(Entry {
                mac: Some(_),
                unconfirmed: false,
                ..
            }) => {}
            _ => self.insert(ip, Entry::new(Some(mac))),
        }
    }

    /// The MAC for `ip`, asking the kernel's neighbour table when it is not cached.
    pub(crate) fn lookup(&mut self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        if let Some((l, mac)) = self.last {
            if l == ip {
                return Some(mac);
            }
        }
        match self.map.get_mut(&ip) {
            Some(Entry {
                mac: Some(mac),
                used,
                ..
            }) => {
                *used = true;
                let mac = *mac;
                self.set_last(ip, mac);
                return Some(mac);
            }
            Some(Entry {
                mac: None, checked, ..
            }) if checked.elapsed() < NEGATIVE_RETRY => {
                return None;
            }
            _ => {}
        }
        if !self.may_ask_kernel() {
            // Asked too often this second (a flood from spoofed addresses): unknown for now,
            // not cached, asked again later.
            return None;
        }
        let found = self.ask_kernel(ip);
        self.insert(ip, Entry::new(found));
        if let Some(mac) = found {
            self.set_last(ip, mac);
        }
        found
    }

    /// Makes `ip` the fast path's address; the one it replaces is marked used, for the
    /// lookups the fast path answered (once per change of peer, not per packet).
    fn set_last(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        if let Some((l, _)) = self.last.filter(|(l, _)| *l != ip) {
            if let Some(e) = self.map.get_mut(&l) {
                e.used = true;
            }
        }
        self.last = Some((ip, mac));
    }

    fn ask_kernel(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        // A netlink failure is treated like "unknown": the packet is dropped and counted.
        next_hop_mac(self.ifindex, ip).ok().flatten()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    #[cfg(test)]
    pub(crate) fn kernel_queries(&self) -> u64 {
        self.kernel_queries
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
            "the kernel's newer resolution wins, also in the fast path"
        );
        n.learn(b, [2; 6]);
        n.learn(c, [3; 6]);
        assert_eq!(n.len(), 2, "bounded");
        assert_eq!(n.lookup(c), Some([3; 6]), "the newest is kept");
        assert_eq!(n.lookup(a), Some([9; 6]), "the one in use is kept");
        // `b`, never looked up, was evicted: the kernel (which knows nothing here) is asked.
        assert_eq!(n.lookup(b), None, "evicted");
    }

    /// A full cache evicts the oldest entry not looked up since eviction last passed it: a
    /// peer in use outlives one that is not, however long ago each was learned.
    #[test]
    fn eviction_spares_what_was_looked_up() {
        let mut n = Neighbours::new(0, 2);
        let a = Ipv4Addr::new(192, 0, 2, 1);
        let b = Ipv4Addr::new(192, 0, 2, 2);
        let c = Ipv4Addr::new(192, 0, 2, 3);
        let d = Ipv4Addr::new(192, 0, 2, 4);
        n.learn(a, [1; 6]);
        n.learn(b, [2; 6]);
        assert_eq!(n.lookup(a), Some([1; 6]));
        n.learn(c, [3; 6]);
        assert_eq!(n.len(), 2);
        assert_eq!(n.lookup(a), Some([1; 6]), "the peer in use was kept");
        assert_eq!(n.lookup(b), None, "the idle one was evicted");
        // `a` used its second chance; looked up again, it keeps its place against `c`.
        assert_eq!(n.lookup(a), Some([1; 6]));
        n.learn(d, [4; 6]);
        assert_eq!(n.lookup(a), Some([1; 6]));
        assert_eq!(n.lookup(c), None);
        assert_eq!(n.lookup(d), Some([4; 6]));
    }

    /// Lookups the fast path answered count as uses once another address takes its place: a
    /// busy peer whose second chance was spent outlives an address never looked up.
    #[test]
    fn fast_path_lookups_count_for_eviction() {
        let mut n = Neighbours::new(0, 3);
        let [a, b, c, x, y] = [1, 2, 3, 4, 5].map(|i| Ipv4Addr::new(192, 0, 2, i));
        n.learn(a, [1; 6]);
        n.learn(b, [2; 6]);
        n.learn(c, [3; 6]);
        assert_eq!(n.lookup(a), Some([1; 6]));
        // `a` is spared (its mark spent), `b` goes.
        n.learn(x, [4; 6]);
        assert_eq!(n.lookup(a), Some([1; 6]), "the fast path");
        assert_eq!(n.lookup(a), Some([1; 6]), "the fast path");
        assert_eq!(
            n.lookup(c),
            Some([3; 6]),
            "another peer takes the fast path"
        );
        n.learn(y, [5; 6]);
        assert_eq!(n.lookup(x), None, "never looked up: evicted");
        assert_eq!(n.lookup(a), Some([1; 6]), "the busy peer was kept");
        assert_eq!(n.lookup(y), Some([5; 6]));
    }

    /// Lookups of many unknown addresses (replies to a flood from spoofed sources) ask the
    /// kernel at most KERNEL_QUERIES_PER_SECOND times a second and evict no known address.
    #[test]
    fn unknown_addresses_neither_flood_the_kernel_nor_evict_known_ones() {
        let mut n = Neighbours::new(0, 4);
        let known: Vec<Ipv4Addr> = (1..=4).map(|i| Ipv4Addr::new(192, 0, 2, i)).collect();
        for (i, ip) in known.iter().enumerate() {
            n.learn(*ip, [i as u8; 6]);
        }
        for i in 0..200u8 {
            assert_eq!(n.lookup(Ipv4Addr::new(198, 51, 100, i)), None);
        }
        assert!(
            n.kernel_queries() <= u64::from(KERNEL_QUERIES_PER_SECOND) * 2,
            "{} kernel queries",
            n.kernel_queries()
        );
        for (i, ip) in known.iter().enumerate() {
            assert_eq!(n.lookup(*ip), Some([i as u8; 6]), "{ip} evicted");
        }
    }

    /// A SYN forged with a known peer's address (a valid one, even) does not move that
    /// peer's traffic to the forger's MAC; an address nothing is known of is learned from its
    /// SYN, and spoofed addresses cannot fill the cache for good.
    /// What a SYN alone taught gives way to the next SYN until a handshake from the address
    /// completes: a SYN forged from an address nothing was known of, from a MAC that never
    /// answers, does not keep the real host out; a confirmed MAC stays.
    #[test]
    fn an_unconfirmed_mac_gives_way_to_the_next_syn_until_a_handshake_confirms_one() {
        const FORGED: [u8; 6] = [0x02, 0, 0, 0, 0x66, 0x66];
        const REAL: [u8; 6] = [0x02, 0, 0, 0, 0x20, 0x20];
        let mut n = Neighbours::new(0, 8);
        let host = Ipv4Addr::new(192, 0, 2, 20);
        n.learn_passive(host, FORGED);
        assert_eq!(n.lookup(host), Some(FORGED));
        n.learn_passive(host, REAL);
        assert_eq!(
            n.lookup(host),
            Some(REAL),
            "the real host's SYN replaced the forger's"
        );
        n.confirm(host, REAL);
        n.learn_passive(host, FORGED);
        assert_eq!(
            n.lookup(host),
            Some(REAL),
            "a SYN does not replace a confirmed MAC"
        );
        n.confirm(host, FORGED);
        assert_eq!(n.lookup(host), Some(REAL), "nor does another handshake");
        // A handshake whose SYN taught nothing (a SYN cookie's) teaches its MAC.
        let cookie = Ipv4Addr::new(192, 0, 2, 21);
        n.confirm(cookie, [0x21; 6]);
        assert_eq!(n.lookup(cookie), Some([0x21; 6]));
        // A handshake completed from another MAC than the SYN's replaces the unconfirmed one.
        let moved = Ipv4Addr::new(192, 0, 2, 22);
        n.learn_passive(moved, FORGED);
        n.confirm(moved, REAL);
        assert_eq!(n.lookup(moved), Some(REAL));
        n.learn_passive(moved, FORGED);
        assert_eq!(n.lookup(moved), Some(REAL));
        // An active open's resolution confirms, also when the fast path holds the pair.
        let dialled = Ipv4Addr::new(192, 0, 2, 23);
        n.learn_passive(dialled, REAL);
        assert_eq!(n.lookup(dialled), Some(REAL));
        n.learn(dialled, REAL);
        n.learn_passive(dialled, FORGED);
        assert_eq!(
            n.lookup(dialled),
            Some(REAL),
            "confirmed by the active open"
        );
        // A SYN answered with a cookie replaces an unconfirmed MAC, caches no new address,
        // leaves a confirmed one.
        let cookied = Ipv4Addr::new(192, 0, 2, 24);
        n.learn_passive(cookied, FORGED);
        n.replace_unconfirmed(cookied, REAL);
        assert_eq!(n.lookup(cookied), Some(REAL));
        let before = n.len();
        n.replace_unconfirmed(Ipv4Addr::new(192, 0, 2, 25), REAL);
        assert_eq!(n.len(), before, "nothing new cached");
        n.replace_unconfirmed(host, FORGED);
        assert_eq!(n.lookup(host), Some(REAL));
    }

    #[test]
    fn a_syn_never_replaces_a_known_neighbour() {
        let mut n = Neighbours::new(0, 4);
        let peer = Ipv4Addr::new(192, 0, 2, 10);
        n.learn(peer, [0x10; 6]);
        n.learn_passive(peer, [0x66; 6]);
        assert_eq!(
            n.lookup(peer),
            Some([0x10; 6]),
            "the forger's MAC was not taken"
        );
        let fresh = Ipv4Addr::new(192, 0, 2, 11);
        n.learn_passive(fresh, [0x11; 6]);
        assert_eq!(n.lookup(fresh), Some([0x11; 6]));
        // A flood of spoofed addresses evicts, it does not lock the cache.
        for i in 0..100u8 {
            n.learn_passive(Ipv4Addr::new(198, 51, 100, i), [i; 6]);
        }
        assert_eq!(n.len(), 4);
        let later = Ipv4Addr::new(192, 0, 2, 12);
        n.learn_passive(later, [0x12; 6]);
        assert_eq!(
            n.lookup(later),
            Some([0x12; 6]),
            "still learns after a flood"
        );
    }
}
