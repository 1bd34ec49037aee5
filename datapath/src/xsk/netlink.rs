//! Interface facts, routes and the neighbour (ARP) table, read from the kernel over rtnetlink.
//!
//! Everything is asked of the network namespace of the calling thread (netlink sockets belong to
//! the namespace they were created in), so it also works in a thread that entered a namespace
//! with `setns(2)` (as the test bed's `testbed::enter_ns` does), where `/sys/class/net` would
//! still show the process's original namespace. A small hand-written client over raw netlink
//! sockets: four `NETLINK_ROUTE` request types and one of generic netlink's `netdev` family (a
//! device's XDP features), no dependency beyond `socket2`.

use std::io::{self, Read};
use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::error::XskError;

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;

/// `ifinfomsg.ifi_flags`: administratively up.
const IFF_UP: u32 = 0x1;
/// `ifinfomsg.ifi_flags`: the driver signals a carrier (RFC 2863 operational state up).
const IFF_LOWER_UP: u32 = 0x1_0000;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_NUM_TX_QUEUES: u16 = 31;
const IFLA_NUM_RX_QUEUES: u16 = 32;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;

const AF_INET: u8 = libc::AF_INET as u8;

/// Generic netlink (`linux/genetlink.h`): the controller's family id, its "get family"
/// command and attributes.
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// The `netdev` family (`linux/netdev.h`, Linux 6.3+): its "get device" command and the
/// attributes read here.
const NETDEV_FAMILY_NAME: &[u8] = b"netdev\0";
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
const NETDEV_A_DEV_XDP_ZC_MAX_SEGS: u16 = 4;

/// Neighbour states (`NUD_*`) in which the entry carries a usable link-layer address.
const NUD_USABLE: u16 = 0x02 /* REACHABLE */
    | 0x04 /* STALE */
    | 0x08 /* DELAY */
    | 0x10 /* PROBE */
    | 0x40 /* NOARP */
    | 0x80 /* PERMANENT */;

/// What the data path needs to know about one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceInfo {
    /// Interface name.
    pub name: String,
    /// Interface index.
    pub index: u32,
    /// MAC address (all zero for interfaces without one).
    pub mac: [u8; 6],
    /// MTU (IP packet size; the Ethernet frame is 14 octets more).
    pub mtu: u32,
    /// First IPv4 address and its prefix length, if any.
    pub ipv4: Option<(Ipv4Addr, u8)>,
    /// RX queues allocated (`IFLA_NUM_RX_QUEUES`). A NIC may run fewer (`ethtool -L`), and an
    /// AF_XDP socket binds only to a running one: [`super::ethtool::running_queues`].
    pub rx_queues: u32,
    /// TX queues allocated (`IFLA_NUM_TX_QUEUES`).
    pub tx_queues: u32,
    /// Up and with a carrier (`IFF_UP` and `IFF_LOWER_UP`, `ip link`'s `UP,LOWER_UP`): it
    /// passes packets.
    pub link_up: bool,
}

/// Result of a route lookup for one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Outgoing interface index.
    pub ifindex: u32,
    /// The address whose MAC the frame goes to: the gateway, or the destination when on-link.
    pub next_hop: Ipv4Addr,
    /// The preferred source address, if the kernel gave one.
    pub src: Option<Ipv4Addr>,
}

struct Netlink {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Iterates the `rtattr`s in `b` as (type, value).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(u16_at(b, 0));
        let ty = u16_at(b, 2) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let value = &b[4..len];
        b = &b[align4(len).min(b.len())..];
        Some((ty, value))
    })
}

fn ipv4_of(v: &[u8]) -> Option<Ipv4Addr> {
    <[u8; 4]>::try_from(v).ok().map(Ipv4Addr::from)
}

impl Netlink {
    fn open() -> io::Result<Self> {
        Self::open_protocol(libc::NETLINK_ROUTE)
    }

    fn open_protocol(protocol: i32) -> io::Result<Self> {
        let sock = Socket::new(
            Domain::from(libc::AF_NETLINK),
            Type::RAW,
            Some(Protocol::from(protocol)),
        )?;
        sock.set_read_timeout(Some(Duration::from_secs(2)))?;
        Ok(Self {
            sock,
            seq: 0,
            buf: vec![0; 64 * 1024],
        })
    }

    /// Sends one request (`body` = fixed header + attributes) and calls `each` with the type and
    /// payload of every reply message, until the dump ends (or, for a plain request, after the
    /// first reply). A netlink error comes back as `Err`.
    fn request(
        &mut self,
        ty: u16,
        flags: u16,
        body: &[u8],
        mut each: impl FnMut(u16, &[u8]),
    ) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let len = NLMSG_HDRLEN + body.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&ty.to_ne_bytes());
        msg.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(body);
        self.sock.send(&msg)?;
        let dump = flags & NLM_F_DUMP != 0;
        loop {
            let n = (&self.sock).read(&mut self.buf)?;
            if let Some(done) = replies(&self.buf[..n], self.seq, dump, &mut each) {
                return done;
            }
        }
    }
}

/// The messages of one datagram of replies to request `seq`, each message other than the
/// end handed to `each`: `Some(outcome)` once the replies end (a request's acknowledgement or
/// error, its one reply, or a dump's `NLMSG_DONE`), `None` when more datagrams follow.
/// A dump's `NLMSG_DONE` carries the dump's error code (the kernel's `dump_done_errno`): a
/// dump that failed part way is an error, not a short list.
fn replies(
    mut b: &[u8],
    seq: u32,
    dump: bool,
    each: &mut impl FnMut(u16, &[u8]),
) -> Option<io::Result<()>> {
    let code_in = |payload: &[u8]| match payload.get(..4) {
        Some(c) => i32::from_ne_bytes([c[0], c[1], c[2], c[3]]),
        None => -libc::EINVAL,
    };
    while b.len() >= NLMSG_HDRLEN {
        let mlen = u32_at(b, 0) as usize;
        let mty = u16_at(b, 4);
        let mseq = u32_at(b, 8);
        if mlen < NLMSG_HDRLEN || mlen > b.len() {
            return Some(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "truncated netlink message",
            )));
        }
        let payload = &b[NLMSG_HDRLEN..mlen];
        b = &b[align4(mlen).min(b.len())..];
        if mseq != seq {
            continue; // a stale reply to an earlier request
        }
        match mty {
            // (A DONE without its code, from an old kernel, ends the dump well.)
            NLMSG_DONE if payload.len() < 4 => return Some(Ok(())),
            NLMSG_DONE | NLMSG_ERROR => {
                let code = code_in(payload);
                return Some(if code >= 0 {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(-code))
                });
            }
            _ => {
                each(mty, payload);
                if !dump {
                    return Some(Ok(()));
                }
            }
        }
    }
    None
}

/// A netlink attribute: length, type, value, padded to four octets.
fn push_attr(msg: &mut Vec<u8>, ty: u16, value: &[u8]) {
    let len = 4 + value.len();
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&ty.to_ne_bytes());
    msg.extend_from_slice(value);
    msg.resize(msg.len() + align4(len) - len, 0);
}

/// What a device says of its XDP support (generic netlink's `netdev` family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpDeviceFeatures {
    /// `NETDEV_XDP_ACT_*` bits (8: AF_XDP zero-copy, 32: multi-buffer receive, 64:
    /// multi-buffer `ndo_xdp_xmit`).
    pub xdp_features: u64,
    /// The most frames of one packet the driver takes in zero-copy mode
    /// (`xdp_zc_max_segs`): a multi-buffer packet of more frames is dropped on transmit.
    pub zc_max_segs: u32,
}

/// Asks the kernel's `netdev` generic netlink family about interface `ifindex`. `None` when
/// the kernel has no such family (before Linux 6.3) or does not say.
pub fn xdp_device_features(ifindex: u32) -> Result<Option<XdpDeviceFeatures>, XskError> {
    let mut nl = Netlink::open_protocol(libc::NETLINK_GENERIC).map_err(XskError::Netlink)?;
    // genlmsghdr { cmd, version, reserved: u16 }, then the attributes.
    let mut body = vec![CTRL_CMD_GETFAMILY, 1, 0, 0];
    push_attr(&mut body, CTRL_ATTR_FAMILY_NAME, NETDEV_FAMILY_NAME);
    let mut family = None;
    let asked = nl.request(GENL_ID_CTRL, 0, &body, |ty, p| {
        if ty != GENL_ID_CTRL {
            return;
        }
        for (aty, v) in attrs(p.get(4..).unwrap_or(&[])) {
            if aty == CTRL_ATTR_FAMILY_ID && v.len() == 2 {
                family = Some(u16_at(v, 0));
            }
        }
    });
    match asked {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(XskError::Netlink(e)),
    }
    let Some(family) = family else {
        return Ok(None);
    };
    let mut body = vec![NETDEV_CMD_DEV_GET, 1, 0, 0];
    push_attr(&mut body, NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes());
    let (mut features, mut segs) = (None, None);
    nl.request(family, 0, &body, |ty, p| {
        if ty != family {
            return;
        }
        for (aty, v) in attrs(p.get(4..).unwrap_or(&[])) {
            match aty {
                NETDEV_A_DEV_XDP_FEATURES if v.len() == 8 => {
                    features = <[u8; 8]>::try_from(v).ok().map(u64::from_ne_bytes);
                }
                NETDEV_A_DEV_XDP_ZC_MAX_SEGS if v.len() == 4 => segs = Some(u32_at(v, 0)),
                _ => {}
            }
        }
    })
    .map_err(XskError::Netlink)?;
    Ok(features.map(|xdp_features| XdpDeviceFeatures {
        xdp_features,
        // Older kernels report no limit attribute: one frame, as they take in zero-copy mode.
        zc_max_segs: segs.unwrap_or(1).max(1),
    }))
}

/// Looks up `name` in the calling thread's network namespace.
pub fn interface_info(name: &str) -> Result<InterfaceInfo, XskError> {
    InterfaceQuery::open()?.info(name)
}

/// A routing netlink socket kept for looking interfaces up again: it stays in the network
/// namespace of the thread that opened it, whichever namespace later callers are in.
pub struct InterfaceQuery(Netlink);

impl std::fmt::Debug for InterfaceQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InterfaceQuery")
    }
}

impl InterfaceQuery {
    /// Opens one in the calling thread's network namespace.
    pub fn open() -> Result<InterfaceQuery, XskError> {
        Netlink::open()
            .map(InterfaceQuery)
            .map_err(XskError::Netlink)
    }

    /// Looks up `name` in the namespace this was opened in.
    pub fn info(&mut self, name: &str) -> Result<InterfaceInfo, XskError> {
        lookup(&mut self.0, name)
    }

    /// Whether the interface numbered `index` is up with a carrier
    /// ([`InterfaceInfo::link_up`]): one RTM_GETLINK for it alone. An index nobody has is an
    /// error (`ENODEV`).
    pub fn link_up(&mut self, index: u32) -> Result<bool, XskError> {
        // ifinfomsg { family, pad, type: u16, index: i32, flags: u32, change: u32 }.
        let mut body = [0u8; 16];
        body[4..8].copy_from_slice(&index.to_ne_bytes());
        let mut up = None;
        self.0
            .request(RTM_GETLINK, 0, &body, |ty, p| {
                if ty == RTM_NEWLINK && p.len() >= 16 && u32_at(p, 4) == index {
                    up = Some(flags_link_up(u32_at(p, 8)));
                }
            })
            .map_err(XskError::Netlink)?;
        up.ok_or_else(|| XskError::InterfaceNotFound(format!("index {index}")))
    }
}

impl InterfaceQuery {
    /// The MAC address of the interface numbered `index` (`IFLA_ADDRESS`): one RTM_GETLINK
    /// for it alone. An index nobody has is an error (`ENODEV`).
    pub fn mac(&mut self, index: u32) -> Result<[u8; 6], XskError> {
        let mut body = [0u8; 16];
        body[4..8].copy_from_slice(&index.to_ne_bytes());
        let mut mac = None;
        self.0
            .request(RTM_GETLINK, 0, &body, |ty, p| {
                if ty == RTM_NEWLINK && p.len() >= 16 && u32_at(p, 4) == index {
                    mac = attrs(&p[16..])
                        .find(|(aty, v)| *aty == IFLA_ADDRESS && v.len() == 6)
                        .and_then(|(_, v)| v.try_into().ok());
                }
            })
            .map_err(XskError::Netlink)?;
        mac.ok_or_else(|| {
            XskError::InterfaceNotFound(format!("index {index} (or it has no MAC address)"))
        })
    }
}

/// `IFF_UP` and `IFF_LOWER_UP` both set in `ifi_flags`.
fn flags_link_up(flags: u32) -> bool {
    flags & (IFF_UP | IFF_LOWER_UP) == IFF_UP | IFF_LOWER_UP
}

fn lookup(nl: &mut Netlink, name: &str) -> Result<InterfaceInfo, XskError> {
    let mut found: Option<InterfaceInfo> = None;
    nl.request(RTM_GETLINK, NLM_F_DUMP, &[0u8; 16], |ty, p| {
        if ty != RTM_NEWLINK || p.len() < 16 || found.is_some() {
            return;
        }
        let mut info = InterfaceInfo {
            name: String::new(),
            index: u32_at(p, 4),
            mac: [0; 6],
            mtu: 0,
            ipv4: None,
            rx_queues: 1,
            tx_queues: 1,
            // ifinfomsg { family, pad, type: u16, index: i32, flags: u32, change: u32 }.
            link_up: flags_link_up(u32_at(p, 8)),
        };
        for (aty, v) in attrs(&p[16..]) {
            match aty {
                IFLA_IFNAME => {
                    let s = v.split(|&c| c == 0).next().unwrap_or(&[]);
                    info.name = String::from_utf8_lossy(s).into_owned();
                }
                IFLA_ADDRESS if v.len() == 6 => info.mac.copy_from_slice(v),
                IFLA_MTU if v.len() == 4 => info.mtu = u32_at(v, 0),
                IFLA_NUM_RX_QUEUES if v.len() == 4 => info.rx_queues = u32_at(v, 0),
                IFLA_NUM_TX_QUEUES if v.len() == 4 => info.tx_queues = u32_at(v, 0),
                _ => {}
            }
        }
        if info.name == name {
            found = Some(info);
        }
    })
    .map_err(XskError::Netlink)?;
    let mut info = found.ok_or_else(|| XskError::InterfaceNotFound(name.to_owned()))?;
    // IPv4 addresses: ifaddrmsg { family, prefixlen, flags, scope, index }.
    let mut body = [0u8; 8];
    body[0] = AF_INET;
    let index = info.index;
    let mut addr = None;
    nl.request(RTM_GETADDR, NLM_F_DUMP, &body, |ty, p| {
        if ty != RTM_NEWADDR || p.len() < 8 || u32_at(p, 4) != index || addr.is_some() {
            return;
        }
        let prefix = p[1];
        let mut local = None;
        let mut address = None;
        for (aty, v) in attrs(&p[8..]) {
            match aty {
                IFA_LOCAL => local = ipv4_of(v),
                IFA_ADDRESS => address = ipv4_of(v),
                _ => {}
            }
        }
        addr = local.or(address).map(|a| (a, prefix));
    })
    .map_err(XskError::Netlink)?;
    info.ipv4 = addr;
    Ok(info)
}

/// Asks the kernel's routing table how to reach `dst` (RTM_GETROUTE).
pub fn route_to(dst: Ipv4Addr) -> Result<Route, XskError> {
    let mut nl = Netlink::open().map_err(XskError::Netlink)?;
    // rtmsg { family, dst_len, src_len, tos, table, protocol, scope, type, flags: u32 }
    let mut body = vec![0u8; 12];
    body[0] = AF_INET;
    body[1] = 32;
    body.extend_from_slice(&8u16.to_ne_bytes());
    body.extend_from_slice(&RTA_DST.to_ne_bytes());
    body.extend_from_slice(&dst.octets());
    let mut route = None;
    nl.request(RTM_GETROUTE, 0, &body, |ty, p| {
        if ty != RTM_NEWROUTE || p.len() < 12 {
            return;
        }
        let mut r = Route {
            ifindex: 0,
            next_hop: dst,
            src: None,
        };
        for (aty, v) in attrs(&p[12..]) {
            match aty {
                RTA_OIF if v.len() == 4 => r.ifindex = u32_at(v, 0),
                RTA_GATEWAY => r.next_hop = ipv4_of(v).unwrap_or(dst),
                RTA_PREFSRC => r.src = ipv4_of(v),
                _ => {}
            }
        }
        route = Some(r);
    })
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH) => XskError::NoRoute(dst),
        _ => XskError::Netlink(e),
    })?;
    route.ok_or(XskError::NoRoute(dst))
}

/// The MAC address the kernel's neighbour table holds for `ip` on interface `ifindex`, if the
/// entry is in a usable state (reachable, stale, delay, probe, permanent, noarp).
pub fn neighbour(ifindex: u32, ip: Ipv4Addr) -> Result<Option<[u8; 6]>, XskError> {
    let mut nl = Netlink::open().map_err(XskError::Netlink)?;
    // ndmsg { family, pad1, pad2: u16, ifindex: i32, state: u16, flags, type }
    let mut body = [0u8; 12];
    body[0] = AF_INET;
    let mut mac = None;
    nl.request(RTM_GETNEIGH, NLM_F_DUMP, &body, |ty, p| {
        if ty != RTM_NEWNEIGH || p.len() < 12 || u32_at(p, 4) != ifindex || mac.is_some() {
            return;
        }
        if u16_at(p, 8) & NUD_USABLE == 0 {
            return;
        }
        let mut dst = None;
        let mut ll = None;
        for (aty, v) in attrs(&p[12..]) {
            match aty {
                NDA_DST => dst = ipv4_of(v),
                NDA_LLADDR if v.len() == 6 => ll = <[u8; 6]>::try_from(v).ok(),
                _ => {}
            }
        }
        if dst == Some(ip) {
            mac = ll;
        }
    })
    .map_err(XskError::Netlink)?;
    Ok(mac)
}

/// The MAC address of the next hop towards `dst` on interface `ifindex`, as the kernel's
/// routing and neighbour tables hold it now, resolving nothing: the gateway's for an address
/// behind a router, `dst`'s own on the link. `None` when the route leaves by another
/// interface or the next hop has no usable entry.
pub fn next_hop_mac(ifindex: u32, dst: Ipv4Addr) -> Result<Option<[u8; 6]>, XskError> {
    let route = route_to(dst)?;
    if route.ifindex != ifindex {
        return Ok(None);
    }
    neighbour(ifindex, route.next_hop)
}

/// The route towards `dst` and the MAC address of its next hop if the kernel's neighbour table
/// has a usable entry now: [`resolve_next_hop`] without resolving or waiting.
pub fn known_next_hop(dst: Ipv4Addr) -> Result<(Route, Option<[u8; 6]>), XskError> {
    let route = route_to(dst)?;
    let mac = neighbour(route.ifindex, route.next_hop)?;
    Ok((route, mac))
}

/// Resolves the MAC address of the next hop towards `dst`: route lookup, then the neighbour
/// table. When the entry is missing, makes the kernel resolve it by sending a UDP datagram to
/// the discard port of the next hop (which starts ARP), and asks again every 10 ms, sending
/// again every 200 ms, until `timeout`. Returns the route too (its interface and source).
pub fn resolve_next_hop(dst: Ipv4Addr, timeout: Duration) -> Result<(Route, [u8; 6]), XskError> {
    let route = route_to(dst)?;
    let now = Instant::now();
    // (A timeout too long for the clock waits as long as the clock goes.)
    let deadline = now
        .checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now);
    let mut last_nudge: Option<Instant> = None;
    loop {
        if let Some(mac) = neighbour(route.ifindex, route.next_hop)? {
            return Ok((route, mac));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(XskError::NeighbourUnresolved {
                ip: route.next_hop,
                waited: timeout,
            });
        }
        if last_nudge.is_none_or(|t| now.duration_since(t) >= Duration::from_millis(200)) {
            last_nudge = Some(now);
            // Any datagram to the address makes the kernel resolve it; a failure to send is
            // fine (the neighbour query above decides).
            if let Ok(s) = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) {
                let _ = s.send_to(b"arp", (route.next_hop, 9));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One netlink message: header (length, type, flags, sequence, port) and payload.
    fn message(ty: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let len = NLMSG_HDRLEN + payload.len();
        let mut m = Vec::new();
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(payload);
        m.resize(align4(m.len()), 0);
        m
    }

    /// A dump's replies: its messages, then the end. An end carrying an error code (a dump
    /// that failed part way, as `-EMSGSIZE`) is that error, not the end of a short list.
    #[test]
    fn a_dump_that_ends_in_an_error_is_an_error() {
        const RTM_NEWLINK: u16 = 16;
        let mut seen = Vec::new();
        let mut each = |ty: u16, p: &[u8]| seen.push((ty, p.len()));
        let first = [message(RTM_NEWLINK, 7, &[0; 16]), message(5, 6, &[])].concat();
        assert!(
            replies(&first, 7, true, &mut each).is_none(),
            "more to come"
        );
        let good = message(NLMSG_DONE, 7, &0i32.to_ne_bytes());
        assert!(matches!(replies(&good, 7, true, &mut each), Some(Ok(()))));
        let old_kernel = message(NLMSG_DONE, 7, &[]);
        assert!(matches!(
            replies(&old_kernel, 7, true, &mut each),
            Some(Ok(()))
        ));
        let failed = message(NLMSG_DONE, 7, &(-libc::EMSGSIZE).to_ne_bytes());
        let e = replies(&failed, 7, true, &mut each)
            .expect("the end")
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE));
        let refused = message(NLMSG_ERROR, 7, &(-libc::EPERM).to_ne_bytes());
        let e = replies(&refused, 7, false, &mut each)
            .expect("the end")
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        let cut = &message(RTM_NEWLINK, 7, &[0; 16])[..20];
        assert!(matches!(replies(cut, 7, true, &mut each), Some(Err(_))));
        // The stale reply (sequence 6) was skipped; the link message was seen once.
        assert_eq!(seen, vec![(RTM_NEWLINK, 16)]);
    }

    #[test]
    fn loopback_facts() {
        let lo = interface_info("lo").expect("lo exists in every namespace");
        assert_eq!(lo.index, 1);
        assert_eq!(lo.mac, [0; 6]);
        assert!(lo.link_up, "lo is UP,LOWER_UP");
        let mut query = InterfaceQuery::open().expect("netlink");
        assert!(query.link_up(lo.index).expect("lo by its index"));
        assert!(query.link_up(0x7fff_fff0).is_err(), "an index nobody has");
        assert!(query.link_up(lo.index).expect("the socket serves again"));
        assert!(lo.mtu >= 1500);
        assert!(lo.rx_queues >= 1);
        if let Some((ip, _)) = lo.ipv4 {
            assert!(ip.is_loopback());
        }
        let r = route_to(Ipv4Addr::LOCALHOST).unwrap();
        assert_eq!(r.ifindex, 1);
        assert_eq!(r.next_hop, Ipv4Addr::LOCALHOST);
    }

    /// The `netdev` generic netlink family answers for loopback (Linux 6.3+, as every kernel
    /// this project supports): no AF_XDP zero-copy there, and a zero-copy frame limit of at
    /// least one. An interface index nobody has is an error, not a panic.
    #[test]
    fn loopback_xdp_device_features() {
        let lo = interface_info("lo").expect("lo exists in every namespace");
        let f = xdp_device_features(lo.index)
            .expect("generic netlink answers")
            .expect("the netdev family (Linux 6.3+) knows lo");
        assert_eq!(f.xdp_features & 8, 0, "lo has no AF_XDP zero-copy: {f:?}");
        assert!(f.zc_max_segs >= 1, "{f:?}");
        assert!(xdp_device_features(0x7fff_fff0).is_err());
    }

    #[test]
    fn missing_interface() {
        match interface_info("nonexistent-if0") {
            Err(XskError::InterfaceNotFound(n)) => assert_eq!(n, "nonexistent-if0"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn attr_parser_stops_on_garbage() {
        let b = [8u8, 0, 1, 0, 1, 2, 3, 4, 200, 0, 2, 0];
        let v: Vec<_> = attrs(&b).collect();
        assert_eq!(v, vec![(1, &[1u8, 2, 3, 4][..])]);
    }
}
