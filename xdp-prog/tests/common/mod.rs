//! Test bed plumbing: bring `scripts/netns.sh` up/down under a lock, run code inside a network
//! namespace, read TCP counters, parse frames.

#![allow(dead_code)]

pub mod xsk;

use std::{
    io,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    process::Command,
    time::Duration,
};
pub use testbed::{bed_or_skip, in_ns, ADDR_A, ADDR_B, DEV_A, DEV_B, NS_A, NS_B, QUEUES};

/// The index of `ifname` in the calling thread's namespace.
pub fn ifindex(ifname: &str) -> u32 {
    let c = std::ffi::CString::new(ifname).expect("no NUL");
    // SAFETY: `c` is a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert_ne!(
        idx,
        0,
        "no interface {ifname}: {}",
        io::Error::last_os_error()
    );
    idx
}

/// The calling thread's namespace's `Tcp: OutRsts` (from /proc/thread-self/net/snmp).
pub fn tcp_out_rsts() -> u64 {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("read snmp");
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let names: Vec<&str> = tcp.next().expect("Tcp header").split_whitespace().collect();
    let values: Vec<&str> = tcp.next().expect("Tcp values").split_whitespace().collect();
    let i = names.iter().position(|n| *n == "OutRsts").expect("OutRsts");
    values[i].parse().expect("number")
}

/// Output of a command (stdout), panicking with stderr on failure.
pub fn sh(cmd: &[&str]) -> String {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip -d link show <dev>` inside `ns`.
pub fn link_details(ns: &str, dev: &str) -> String {
    sh(&["ip", "-n", ns, "-d", "link", "show", "dev", dev])
}

/// `ethtool -k <dev>` inside `ns` (offload features).
pub fn features(ns: &str, dev: &str) -> String {
    sh(&["ip", "netns", "exec", ns, "ethtool", "-k", dev])
}

/// The outcome of a TCP connect from `from` (source port `sport` if non-zero) to `to`, run
/// in the caller's namespace.
pub fn connect(from: Ipv4Addr, sport: u16, to: SocketAddrV4, timeout: Duration) -> io::Result<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&SocketAddr::V4(SocketAddrV4::new(from, sport)).into())?;
    s.connect_timeout(&SocketAddr::V4(to).into(), timeout)
}

/// A parsed IPv4/TCP frame (just what the tests look at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSeg {
    pub saddr: Ipv4Addr,
    pub daddr: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    pub flags: u8,
}

pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;

/// Parses an Ethernet/IPv4/TCP frame (lengths checked, checksums not: `tcp_engine::wire`'s
/// views); `None` for anything else.
pub fn parse_tcp(frame: &[u8]) -> Option<TcpSeg> {
    use tcp_engine::wire::{EthernetFrame, Ipv4TcpView, ETHERTYPE_IPV4};
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != ETHERTYPE_IPV4 {
        return None;
    }
    let v = Ipv4TcpView::new_unverified(eth.payload()).ok()?;
    Some(TcpSeg {
        saddr: v.ip().source_addr(),
        daddr: v.ip().destination_addr(),
        sport: v.tcp().source_port(),
        dport: v.tcp().destination_port(),
        flags: v.control_bits(),
    })
}
