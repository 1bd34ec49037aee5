//! The ethtool ioctl (`SIOCETHTOOL`), for what netlink does not say of a NIC: its RSS key and
//! indirection table ([`super::rss`]) and how many queues it runs ([`channels`]).

use std::io;

/// `SIOCETHTOOL`, the ethtool ioctl.
const SIOCETHTOOL: libc::c_ulong = 0x8946;
/// `ETHTOOL_GCHANNELS`: get the numbers of channels (queues).
const ETHTOOL_GCHANNELS: u32 = 0x3c;
/// `ETHTOOL_GRXFH`: the header fields a flow type's RSS hash covers.
pub(crate) const ETHTOOL_GRXFH: u32 = 0x29;
/// `ETHTOOL_GRSSH`: get the RSS hash key, indirection table and hash function.
pub(crate) const ETHTOOL_GRSSH: u32 = 0x46;
/// `FLOW_RSS` in `ethtool_rxnfc.flow_type`: the command names an RSS context (a longer
/// structure).
const FLOW_RSS: u32 = 0x2000_0000;

/// Octets of the structure the kernel reads and writes for the command in `buf[0]`, with the
/// sizes `buf` gives it; `None` for a command (or form of one) not used here.
fn command_octets(buf: &[u32]) -> Option<usize> {
    match *buf.first()? {
        // struct ethtool_channels: nine u32.
        ETHTOOL_GCHANNELS => Some(36),
        // The original struct ethtool_rxnfc, as the kernel copies it for a flow type without
        // an RSS context: cmd, flow_type, data (u64).
        ETHTOOL_GRXFH if buf.get(1).is_some_and(|f| f & FLOW_RSS == 0) => Some(16),
        // struct ethtool_rxfh: its 24-octet header, then the indirection table's u32 entries
        // and the key's octets, as many as the header's sizes ask (sizes of 0 ask for the
        // device's sizes alone, in the header; others must match the device's, or `EINVAL`).
        ETHTOOL_GRSSH => {
            let (indir, key) = (*buf.get(2)? as usize, *buf.get(3)? as usize);
            24usize.checked_add(indir.checked_mul(4)?)?.checked_add(key)
        }
        _ => None,
    }
}

/// Runs the ethtool command in `buf[0]` on `ifname` (in the calling thread's network
/// namespace) with `buf` as its command structure: the kernel reads and writes `buf`, as far as
/// the structure of the command (and the sizes written in it) says. Refused (`InvalidInput`)
/// for a command not known here or a `buf` shorter than its structure. `what` names the
/// command in the error of a driver that does not support it.
pub(crate) fn ioctl(ifname: &str, buf: &mut [u32], what: &str) -> io::Result<()> {
    if command_octets(buf).is_none_or(|octets| octets > buf.len() * 4) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("ethtool command for {what}: unknown, or longer than its buffer"),
        ));
    }
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
    // the rest is zero) and points at `buf`, which is exclusively borrowed, 4-octet aligned and
    // at least as long as the command's structure (`command_octets`, checked above), so the
    // kernel's reads and its copy back stay inside it.
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

/// The queues `ifname` runs, RX and TX, of the `allocated` ones netlink reports
/// (`IFLA_NUM_RX_QUEUES`, `IFLA_NUM_TX_QUEUES`): an AF_XDP socket binds only to a running
/// queue (the kernel checks `real_num_rx_queues`), and a NIC may run fewer than it has
/// (`ethtool -L`). A driver that does not say runs all it has (veth reports them, and before
/// 5.14 had no way to change them); never more than it has (veth before Linux 5.14 also
/// reported its queues as combined channels, each counted twice).
pub fn running_queues(ifname: &str, allocated: (u32, u32)) -> (u32, u32) {
    match channels(ifname) {
        Ok(c) if c.rx > 0 && c.tx > 0 => (c.rx.min(allocated.0), c.tx.min(allocated.1)),
        _ => allocated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer shorter than what the kernel would write back for its command, or a command
    /// not known here, never reaches the ioctl.
    #[test]
    fn a_buffer_shorter_than_its_command_is_refused() {
        let refused = |buf: &mut [u32]| {
            ioctl("lo", buf, "a test").map_err(|e| e.kind()) == Err(io::ErrorKind::InvalidInput)
        };
        // The table's 256 entries and 40 key octets would follow the header.
        assert!(refused(&mut [ETHTOOL_GRSSH, 0, 256, 40, 0, 0]));
        assert!(refused(&mut [ETHTOOL_GCHANNELS, 0, 0, 0, 0, 0, 0, 0]));
        assert!(refused(&mut [ETHTOOL_GRXFH, 1 | FLOW_RSS, 0, 0]));
        assert!(refused(&mut [0x1234, 0, 0, 0]));
        assert!(refused(&mut []));
        assert!(refused(&mut [ETHTOOL_GRSSH, 0, u32::MAX, u32::MAX, 0, 0]));
        // The sizes-only query, and room for what is asked.
        assert_eq!(command_octets(&[ETHTOOL_GRSSH, 0, 0, 0, 0, 0]), Some(24));
        assert_eq!(command_octets(&[ETHTOOL_GRSSH, 0, 2, 5, 0, 0]), Some(37));
        assert_eq!(command_octets(&[ETHTOOL_GRXFH, 1, 0, 0]), Some(16));
        assert_eq!(command_octets(&[ETHTOOL_GCHANNELS; 9]), Some(36));
    }
}
