//! The ethtool ioctl (`SIOCETHTOOL`), for what netlink does not say of a NIC: its RSS key and
//! indirection table ([`super::rss`]) and how many queues it runs ([`channels`]).

use std::io;

/// `SIOCETHTOOL`, the ethtool ioctl.
const SIOCETHTOOL: libc::c_ulong = 0x8946;
/// `ETHTOOL_GCHANNELS`: get the numbers of channels (queues).
const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// Runs the ethtool command in `buf[0]` on `ifname` (in the calling thread's network
/// namespace) with `buf` as its command structure: the kernel reads and writes `buf`, as far as
/// the structure of the command (and the sizes written in it) says, which must fit in `buf`.
/// `what` names the command in the error of a driver that does not support it.
pub(crate) fn ioctl(ifname: &str, buf: &mut [u32], what: &str) -> io::Result<()> {
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {ifname:?}"),
        ));
    }
    // SAFETY: a plain datagram socket, closed below; no memory is passed.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a zeroed ifreq is valid (a name of NULs, a null data pointer).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in ifr.ifr_name.iter_mut().zip(name) {
        *dst = src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = buf.as_mut_ptr().cast();
    // SAFETY: `ifr` names the interface (NUL-terminated: the name is shorter than IFNAMSIZ and
    // the rest is zero) and points at `buf`, which is exclusively borrowed, 4-octet aligned and,
    // by this function's contract, as long as the command's structure, so the kernel's copy
    // back stays inside it.
    let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL, &mut ifr) };
    let err = io::Error::last_os_error();
    // SAFETY: `fd` is the socket opened above, closed once.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(match err.raw_os_error() {
            Some(libc::EOPNOTSUPP) => io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{ifname} does not report {what}"),
            ),
            _ => err,
        });
    }
    Ok(())
}

/// The queues a NIC runs now (`ETHTOOL_GCHANNELS`: dedicated plus combined channels), which
/// may be fewer than the queues it has (netlink's `IFLA_NUM_RX_QUEUES`): an AF_XDP socket binds
/// only to a running queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Channels {
    /// RX queues running.
    pub rx: u32,
    /// TX queues running.
    pub tx: u32,
}

/// `ifname`'s running queues; `Unsupported` for a driver that does not say.
pub fn channels(ifname: &str) -> io::Result<Channels> {
    // struct ethtool_channels: cmd, max_rx, max_tx, max_other, max_combined, rx_count,
    // tx_count, other_count, combined_count.
    let mut buf = [0u32; 9];
    buf[0] = ETHTOOL_GCHANNELS;
    ioctl(ifname, &mut buf, "its channels (ETHTOOL_GCHANNELS)")?;
    Ok(Channels {
        rx: buf[5].saturating_add(buf[8]),
        tx: buf[6].saturating_add(buf[8]),
    })
}
