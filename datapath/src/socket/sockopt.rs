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
