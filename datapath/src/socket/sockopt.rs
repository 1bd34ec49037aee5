//! Socket options the socket transport sets from `ConnectParams` on kernel TCP sockets.

use std::net::SocketAddr;

use crate::DatapathError;

/// Sets a kernel TCP socket's Type of Service ([`crate::ConnectParams::tos`]): `IP_TOS`, or
/// `IPV6_TCLASS` when `addr` is IPv6. 0, the kernel's default, is left as it is.
pub(super) fn set_tos(
    socket: &socket2::Socket,
    addr: SocketAddr,
    tos: u8,
) -> Result<(), DatapathError> {
    if tos != 0 {
        if addr.is_ipv4() {
            socket.set_tos(u32::from(tos))?;
        } else {
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
