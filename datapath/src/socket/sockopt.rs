//! Socket options the socket transport sets from `ConnectParams` on kernel TCP sockets.

use std::net::SocketAddr;

use crate::DatapathError;

/// Sets a kernel TCP socket's Type of Service ([`crate::ConnectParams::tos`]): `IP_TOS`, and
/// also `IPV6_TCLASS` when `addr` is IPv6. An IPv6 socket carries IPv4 too (a dual-stack
/// listener's IPv4 clients, a v4-mapped peer), and Linux sends that through its IPv4 path
/// with the socket's `IP_TOS`, which `IPV6_TCLASS` does not set. 0, the kernel's default, is
/// left as it is.
pub(super) fn set_tos(
    socket: &socket2::Socket,
    addr: SocketAddr,
    tos: u8,
) -> Result<(), DatapathError> {
    if tos != 0 {
        socket.set_tos(u32::from(tos))?;
        if addr.is_ipv6() {
            socket.set_tclass_v6(u32::from(tos))?;
        }
    }
    Ok(())
}

/// Octets of ours the peer has not acknowledged yet, our FIN counting as one (Linux's
/// `SIOCOUTQ` on a TCP socket, `write_seq - snd_una`); `None` if the kernel does not say.
pub(super) fn unacknowledged(stream: &impl std::os::fd::AsRawFd) -> Option<usize> {
    let mut octets: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ's number) writes one int through the pointer, which points
    // at `octets`, alive and writable for the call; the descriptor is the stream's, open for
    // the call.
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut octets) };
    if rc != 0 {
        return None;
    }
    usize::try_from(octets).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv6 socket gets both: `IPV6_TCLASS` for its IPv6 traffic, `IP_TOS` for the IPv4
    /// traffic it carries. Before, only the first, and a dual-stack listener's IPv4 clients
    /// got no TOS.
    #[test]
    fn an_ipv6_socket_gets_the_tos_for_the_ipv4_it_carries() {
        use socket2::{Domain, Protocol, Socket, Type};
        let v6 = match Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP)) {
            Ok(s) => s,
            // A kernel without IPv6 has no such socket to set: said, and a failure in CI.
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
                assert!(!testbed::ci(), "no IPv6 in CI: {e}");
                testbed::skipped(&format!("no IPv6 socket ({e})"));
                return;
            }
            Err(e) => panic!("an IPv6 socket: {e}"),
        };
        set_tos(&v6, "[::]:0".parse().expect("address"), 0xb8).expect("set");
        assert_eq!(v6.tos().expect("IP_TOS"), 0xb8);
        assert_eq!(v6.tclass_v6().expect("IPV6_TCLASS"), 0xb8);
        let v4 = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket");
        set_tos(&v4, "127.0.0.1:0".parse().expect("address"), 0xb8).expect("set");
        assert_eq!(v4.tos().expect("IP_TOS"), 0xb8);
    }
}
