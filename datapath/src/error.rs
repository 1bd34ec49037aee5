//! The errors the application sees: [`DatapathError`] for calls that fail, and [`QpError`], the
//! cause that ended a queue pair's connection (in [`crate::QpStatus::error`]). Both are typed all
//! the way up: an application matches variants, never text.

use std::io;

use mpa::wire::EnhancedParams;
use rdmap::TerminateInfo;

/// Errors of the I/O layer: connection setup, the transport, and local API misuse.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// A socket operation failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// MPA connection setup failed (the code is the RFC 5044 8 MPA error code).
    #[error("MPA error (code {code}): {0}", code = .0.code())]
    Mpa(#[from] mpa::MpaError),
    /// IFT connection setup (the adaption indications, draft-williams-iwarp-ift-01 section
    /// 4) failed; an MPA peer shows as [`ift::IftError::BadMagic`].
    #[error("IFT error (code {code}): {0}", code = .0.code())]
    Ift(#[from] ift::IftError),
    /// The responder rejected the connection (MPA Reply with R=1), with its private data
    /// (shown as text when it is text: applications often give their reason there).
    #[error("connection rejected by peer{}", rejection_reason(.private_data))]
    Rejected {
        /// Private data from the Reply.
        private_data: Vec<u8>,
        /// The Reply's RFC 6581 block, when the Request was an enhanced one (MPA revision 2):
        /// the responder's IRD and ORD (it may name the ORD it needs, RFC 6581 9.1) and its
        /// RTR kinds, to retry with. `None` for a revision 1 Reply and for IFT.
        peer_params: Option<EnhancedParams>,
    },
    /// A local argument was invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// A work request refused by itself, before any memory or queue was looked at (verbs'
    /// `EINVAL` from `ibv_post_send` / `ibv_post_recv`): an operation that cannot be posted
    /// inline, an extension's opcode without the RFC 7306 extensions, a Read with more than one
    /// sink element, an Atomic whose sink is not one 64-bit word, Immediate Data with a
    /// payload, a receive on a queue pair that takes its receives from a shared receive queue.
    /// Nothing was queued.
    #[error("work request refused: {0}")]
    InvalidWorkRequest(#[source] rdmap::RdmapError),
    /// Memory for a region could not be allocated.
    #[error("could not allocate {0} bytes")]
    OutOfMemory(usize),
    /// A region's memory could not be locked into RAM (`mlock`), which registration asks for
    /// unless the protection domain allows unpinned memory
    /// ([`crate::ProtectionDomain::with_pinning`]).
    #[error(
        "cannot pin {len} bytes with mlock: {source}; RLIMIT_MEMLOCK allows {limit} \
         (raise it with `ulimit -l unlimited`, `LimitMEMLOCK=infinity` in a systemd unit, \
         a memlock line in /etc/security/limits.conf, or run with CAP_IPC_LOCK)"
    )]
    PinFailed {
        /// Octets that were to be locked.
        len: usize,
        /// The soft `RLIMIT_MEMLOCK` in force, as text (`unlimited` or a byte count).
        limit: String,
        /// What `mlock` said.
        source: io::Error,
    },
    /// A memory region is still used by a transfer, so its memory cannot be handed back yet.
    #[error("memory region still in use by the transport")]
    RegionInUse,
    /// The protection domain holds as many regions as STags can name (2^24 - 1: the 24-bit
    /// STag index of RFC 5040 2.1), so another cannot be registered (`ibv_reg_mr`'s
    /// `ENOMEM`) until one is deregistered.
    #[error("protection domain full: 2^24 - 1 regions registered")]
    RegionTableFull,
    /// The send queue is full (`ibv_post_send`'s `ENOMEM`): `depth` send work requests
    /// ([`crate::ConnectParams::sq_depth`]) are posted and not yet completed. Nothing was
    /// queued; post again once a completion has been polled.
    #[error("send queue full ({depth} work requests outstanding)")]
    SendQueueFull {
        /// The queue's depth.
        depth: usize,
    },
    /// The receive queue is full (`ibv_post_recv`'s `ENOMEM`): `depth` receives
    /// ([`crate::ConnectParams::rq_depth`]) are posted and not yet used. Nothing was queued.
    /// (A queue pair made without a receive queue, `rq_depth` 0, refuses receives with
    /// [`DatapathError::InvalidArgument`] instead: there is nothing to wait for.)
    #[error("receive queue full ({depth} receives posted)")]
    RecvQueueFull {
        /// The queue's depth.
        depth: usize,
    },
    /// A post to a queue pair that ended in Error, whose flushed completion found the
    /// completion queue full (`ENOMEM`; [`crate::CompletionQueue::is_overrun`]): the request
    /// was not taken. Poll the queue, then post again.
    #[error("completion queue full: the post's flushed completion could not be queued")]
    CompletionQueueFull,
    /// The queue pair is closing or terminating, or its transport has stopped taking work
    /// requests and the queue pair did not end in Error (where posts complete flushed
    /// instead); or the engine is gone.
    #[error("queue pair is no longer connected")]
    Disconnected,
    /// A send work request posted to a queue pair that is not connected yet (through a
    /// [`crate::QpPoster`] before its connect or accept has started it; verbs' `ENOTCONN` for a
    /// queue pair not in RTS), or any post to one that was destroyed without a connection.
    #[error("queue pair is not connected")]
    NotConnected,
    /// Connection setup did not finish in time.
    #[error("timed out during {0}")]
    Timeout(&'static str),
    /// The AF_XDP engine's driver failed (interface, XDP, AF_XDP, port, route).
    #[error("AF_XDP engine: {0}")]
    Xdp(#[from] crate::xdp_tcp::XdpTcpError),
}

impl DatapathError {
    /// The `errno` a verbs or rdma_cm call fails with for this error, for a C interface over
    /// this API (`ibv_post_send` returns it, `rdma_connect` sets `errno` to it): `ENOMEM` for a
    /// full queue or region table and for memory that cannot be pinned (as `ibv_post_send` and
    /// `ibv_reg_mr` say), `ENOBUFS` for a full connection table, `ENETUNREACH` for a peer the
    /// engine's interface does not reach, `EINVAL` for an argument
    /// or a work request refused by itself, `ENOTCONN` once the queue pair takes no more work
    /// (siw's), `ETIMEDOUT` for a setup deadline, `ECONNREFUSED` for a rejection, `ECONNRESET`
    /// for a peer gone during setup, `EPROTO` for a startup the peer got wrong, `EBUSY` for a
    /// region still in use (`ibv_dereg_mr`), `EADDRINUSE` for a port a kernel socket holds,
    /// the system's own for a failed system call, and `EIO` where nothing closer fits.
    pub fn errno(&self) -> i32 {
        use crate::xdp_tcp::XdpTcpError as X;
        use ift::IftError as I;
        use mpa::MpaError as M;
        let os = |e: &io::Error| e.raw_os_error().unwrap_or_else(|| errno_of_kind(e.kind()));
        match self {
            DatapathError::Io(e) => os(e),
            DatapathError::Mpa(M::ConnectionLost) | DatapathError::Ift(I::ConnectionLost) => {
                libc::ECONNRESET
            }
            DatapathError::Mpa(M::StartupTimeout | M::AcceptTimeout | M::RtrTimeout)
            | DatapathError::Ift(I::StartupTimeout | I::AcceptTimeout)
            | DatapathError::Timeout(_) => libc::ETIMEDOUT,
            DatapathError::Mpa(M::Rejected) | DatapathError::Rejected { .. } => libc::ECONNREFUSED,
            // Our own private data beyond the limit is `Local`; `PrivateDataTooLong` is the
            // peer's (a received PD_Length), which falls to `EPROTO` below.
            DatapathError::Mpa(M::Local(_))
            | DatapathError::Ift(I::Local(_))
            | DatapathError::InvalidArgument(_)
            | DatapathError::InvalidWorkRequest(_) => libc::EINVAL,
            DatapathError::Mpa(_) | DatapathError::Ift(_) => libc::EPROTO,
            DatapathError::OutOfMemory(_)
            | DatapathError::RegionTableFull
            | DatapathError::SendQueueFull { .. }
            | DatapathError::RecvQueueFull { .. }
            | DatapathError::CompletionQueueFull => libc::ENOMEM,
            // `ibv_reg_mr`'s answer to a memlock limit, whatever `mlock` said.
            DatapathError::PinFailed { .. } => libc::ENOMEM,
            DatapathError::RegionInUse => libc::EBUSY,
            DatapathError::Disconnected | DatapathError::NotConnected => libc::ENOTCONN,
            DatapathError::Xdp(X::PortInUse { .. }) => libc::EADDRINUSE,
            DatapathError::Xdp(X::Table(tcp_engine::table::TableError::TupleInUse)) => {
                libc::EADDRINUSE
            }
            DatapathError::Xdp(
                X::Table(tcp_engine::table::TableError::Full) | X::DirectoryFull(_),
            ) => libc::ENOBUFS,
            DatapathError::Xdp(X::NoIpv4Address(_)) => libc::EADDRNOTAVAIL,
            DatapathError::Xdp(X::WrongInterface { .. }) => libc::ENETUNREACH,
            DatapathError::Xdp(
                X::Reserve { source: e, .. } | X::Wait(e) | X::Random(e) | X::Inbox(e),
            ) => os(e),
            DatapathError::Xdp(_) => libc::EIO,
        }
    }
}

/// [`crate::QueuePair::post_send_list`] stopped part way (verbs' `bad_wr`): the first `posted`
/// work requests were posted, the rest were not.
#[derive(Debug, thiserror::Error)]
#[error("{posted} work requests of the list posted, then: {source}")]
pub struct PostListError {
    /// Work requests posted before the failure.
    pub posted: usize,
    /// Why the rest were not.
    #[source]
    pub source: DatapathError,
}

impl PostListError {
    /// Posts `wrs` one by one with `post`, stopping at the first that fails: how many were
    /// posted, or how many went before the failure and why.
    pub(crate) fn post_each<T>(
        wrs: impl IntoIterator<Item = T>,
        mut post: impl FnMut(T) -> Result<(), DatapathError>,
    ) -> Result<usize, PostListError> {
        let mut posted = 0;
        for wr in wrs {
            post(wr).map_err(|source| PostListError { posted, source })?;
            posted += 1;
        }
        Ok(posted)
    }
}

/// Why a queue pair's connection ended: the first cause seen, kept in
/// [`crate::QpStatus::error`]. The Terminates themselves (with every field) are in
/// [`crate::QpStatus::sent_terminate`] and [`crate::QpStatus::remote_terminate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QpError {
    /// MPA startup (the Request/Reply exchange, RFC 5044 7.1) failed after the queue pair
    /// existed.
    #[error("MPA startup failed (MPA code {code}): {0}", code = .0.code())]
    Startup(mpa::MpaError),
    /// An MPA error in the peer's FPDU stream (RFC 5044 8: CRC, Marker, framing): nothing more
    /// was delivered and, where the peer may be sent one, a Terminate of layer LLP with
    /// [`mpa::MpaError::code`] went out.
    #[error("MPA error (code {code}): {0}", code = .0.code())]
    Mpa(mpa::MpaError),
    /// An IFT error in the peer's frames (draft-williams-iwarp-ift-01 5.1: a header or
    /// payload CRC, a length, the VTag): nothing of that frame was placed (but for
    /// `SpeculationMismatch`: a frame placed speculatively that the in-order pass did not
    /// confirm), and a Terminate of layer LLP with [`ift::IftError::code`] went out.
    #[error("IFT error (code {code}): {0}", code = .0.code())]
    Ift(ift::IftError),
    /// We found an error in the peer's traffic (DDP or RDMAP, RFC 5040 7) and sent this
    /// Terminate.
    #[error(
        "we sent Terminate: layer {:#x}, type {:#x}, code {:#04x}",
        .0.layer, .0.etype, .0.code
    )]
    LocalTerminate(TerminateInfo),
    /// The peer sent this Terminate (RFC 5040 4.8).
    #[error(
        "peer sent Terminate: layer {:#x}, type {:#x}, code {:#04x}",
        .0.layer, .0.etype, .0.code
    )]
    RemoteTerminate(TerminateInfo),
    /// The peer closed the TCP connection (FIN) while the queue pair was in use.
    #[error("connection closed by peer")]
    PeerClosed,
    /// The peer reset the TCP connection.
    #[error("connection reset by peer")]
    PeerReset,
    /// The peer is unreachable: retransmissions, keepalive probes or the user timeout
    /// ([`crate::ConnectParams::user_timeout`]) went unanswered.
    #[error("peer unreachable (retransmissions, keepalives or the user timeout unanswered)")]
    PeerUnreachable,
    /// TCP was reset before it was established: nobody listens on the peer's port.
    #[error("connection refused")]
    Refused,
    /// A socket operation of the socket transport failed.
    #[error("transport failed: {0}")]
    Transport(io::ErrorKind),
    /// The octets of an FPDU TCP had to (re)transmit could not be produced (its source region
    /// was deregistered or shrank): the connection was reset.
    #[error("transmit source gone (region deregistered), connection reset")]
    TransmitSourceFailed,
    /// The AF_XDP engine running the queue pair was stopped.
    #[error("the AF_XDP engine stopped")]
    EngineStopped,
    /// The AF_XDP engine running the queue pair failed (a panic or a fatal driver error in
    /// its thread): every queue pair was flushed and XDP released.
    #[error("the AF_XDP engine failed")]
    EngineFailed,
    /// A completion of the queue pair found its completion queue full and was lost (verbs'
    /// CQ overrun, `IBV_EVENT_CQ_ERR`; [`crate::CompletionQueue::is_overrun`]): the
    /// connection was reset. Poll the queue more often, or make it larger.
    #[error("completion queue overrun: a completion was lost, connection reset")]
    CqOverrun,
    /// A local failure that should not happen (a bug): the connection was ended.
    #[error("local failure: {0}")]
    Local(&'static str),
    /// We closed the connection for a local limit the peer's data ran into (a gap it never
    /// filled, the reassembly store or budget), or for a local error that failed the queue
    /// pair (a refused receive), at a time no Terminate could be sent to say so (a responder
    /// before the peer's first FPDU, RFC 5044 7.1.2 rule 4).
    #[error("connection closed: {0}")]
    ClosedLocally(&'static str),
}

impl QpError {
    /// The error a failed socket operation of the socket transport means.
    pub(crate) fn from_io(e: &io::Error) -> QpError {
        // A peer gone from the link fails its connection with an unreachable error rather
        // than a timeout once the kernel's retransmissions find its address no longer
        // resolves (ICMP host unreachable looped back; Linux reports a soft error before
        // ETIMEDOUT): the same peer the engine reports as unreachable.
        if matches!(
            e.raw_os_error(),
            Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENETDOWN)
        ) {
            return QpError::PeerUnreachable;
        }
        match e.kind() {
            io::ErrorKind::ConnectionReset => QpError::PeerReset,
            io::ErrorKind::TimedOut => QpError::PeerUnreachable,
            k => QpError::Transport(k),
        }
    }
}

/// How [`DatapathError::Rejected`] shows the peer's private data: `: "text"` when it is
/// printable UTF-8 (trailing NULs dropped, at most 200 characters shown), otherwise its size.
fn rejection_reason(private_data: &[u8]) -> String {
    let text = std::str::from_utf8(private_data)
        .ok()
        .map(|t| t.trim_end_matches('\0'))
        .filter(|t| !t.is_empty() && !t.chars().any(char::is_control));
    match text {
        Some(t) if t.chars().count() > 200 => {
            format!(": \"{}...\"", t.chars().take(200).collect::<String>())
        }
        Some(t) => format!(": \"{t}\""),
        None => format!(" ({} bytes of private data)", private_data.len()),
    }
}

/// The error a caught panic of a connection manager's thread gives the attempt it served
/// (`what`: "connecting", ...): an I/O error of kind `Other` naming the panic.
pub(crate) fn panicked(what: &str, cause: &(dyn std::any::Any + Send)) -> DatapathError {
    DatapathError::Io(io::Error::other(format!(
        "{what}: a thread of the library panicked: {}",
        panic_text(cause)
    )))
}

/// The message of a caught panic (a transport thread's, which fails its queue pairs instead
/// of the process).
pub(crate) fn panic_text(cause: &(dyn std::any::Any + Send)) -> &str {
    cause
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| cause.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// The errno an I/O error built from a kind alone stands for (no system call said one: a
/// connect refused by the peer's RST on the AF_XDP engine, a connect timed out by socket2),
/// so that both transports give a C caller the same number for the same failure; `EIO` where
/// none fits.
fn errno_of_kind(kind: io::ErrorKind) -> i32 {
    use io::ErrorKind as K;
    match kind {
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::ConnectionReset => libc::ECONNRESET,
        K::ConnectionAborted => libc::ECONNABORTED,
        K::NotConnected => libc::ENOTCONN,
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::TimedOut => libc::ETIMEDOUT,
        K::WouldBlock => libc::EAGAIN,
        K::PermissionDenied => libc::EACCES,
        K::Unsupported => libc::EOPNOTSUPP,
        K::AlreadyExists => libc::EEXIST,
        K::ResourceBusy => libc::EBUSY,
        K::NotFound => libc::ENOENT,
        K::InvalidInput => libc::EINVAL,
        K::OutOfMemory => libc::ENOMEM,
        K::Interrupted => libc::EINTR,
        K::BrokenPipe => libc::EPIPE,
        K::HostUnreachable => libc::EHOSTUNREACH,
        K::NetworkUnreachable => libc::ENETUNREACH,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::{DatapathError, QpError};

    /// A socket-transport connection failed by a peer that left the link reads as the same
    /// error the engine reports for it, whichever way the kernel said it.
    #[test]
    fn a_vanished_peer_reads_as_unreachable_on_the_socket_transport() {
        use std::io;
        for errno in [
            libc::ETIMEDOUT,
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
            libc::EHOSTDOWN,
            libc::ENETDOWN,
        ] {
            let e = io::Error::from_raw_os_error(errno);
            assert_eq!(
                QpError::from_io(&e),
                QpError::PeerUnreachable,
                "errno {errno}"
            );
        }
        let reset = io::Error::from_raw_os_error(libc::ECONNRESET);
        assert_eq!(QpError::from_io(&reset), QpError::PeerReset);
        let pipe = io::Error::from_raw_os_error(libc::EPIPE);
        assert_eq!(
            QpError::from_io(&pipe),
            QpError::Transport(io::ErrorKind::BrokenPipe)
        );
    }

    /// Each error names the `errno` a verbs or rdma_cm call gives for it.
    #[test]
    fn errors_name_the_errno_verbs_gives() {
        use std::io;
        let cases = [
            (DatapathError::SendQueueFull { depth: 4 }, libc::ENOMEM),
            (DatapathError::RecvQueueFull { depth: 4 }, libc::ENOMEM),
            (DatapathError::CompletionQueueFull, libc::ENOMEM),
            (DatapathError::RegionTableFull, libc::ENOMEM),
            (DatapathError::InvalidArgument("x"), libc::EINVAL),
            (
                DatapathError::InvalidWorkRequest(rdmap::RdmapError::SrqAttached),
                libc::EINVAL,
            ),
            (DatapathError::Disconnected, libc::ENOTCONN),
            (DatapathError::NotConnected, libc::ENOTCONN),
            (DatapathError::Timeout("x"), libc::ETIMEDOUT),
            (
                DatapathError::Mpa(mpa::MpaError::AcceptTimeout),
                libc::ETIMEDOUT,
            ),
            (
                DatapathError::Mpa(mpa::MpaError::ConnectionLost),
                libc::ECONNRESET,
            ),
            (DatapathError::Mpa(mpa::MpaError::InvalidKey), libc::EPROTO),
            (
                DatapathError::Mpa(mpa::MpaError::PrivateDataTooLong { len: 600, max: 512 }),
                libc::EPROTO,
            ),
            (
                DatapathError::Ift(ift::IftError::StartupTimeout),
                libc::ETIMEDOUT,
            ),
            (
                DatapathError::Rejected {
                    private_data: Vec::new(),
                    peer_params: None,
                },
                libc::ECONNREFUSED,
            ),
            (DatapathError::RegionInUse, libc::EBUSY),
            (
                DatapathError::Io(io::Error::from_raw_os_error(libc::EHOSTUNREACH)),
                libc::EHOSTUNREACH,
            ),
            (DatapathError::Io(io::Error::other("no code")), libc::EIO),
            // Built from a kind alone: the engine's refused connect, socket2's timed-out one.
            (
                DatapathError::Io(io::ErrorKind::ConnectionRefused.into()),
                libc::ECONNREFUSED,
            ),
            (
                DatapathError::Io(io::ErrorKind::TimedOut.into()),
                libc::ETIMEDOUT,
            ),
            (
                DatapathError::Xdp(crate::xdp_tcp::XdpTcpError::PortInUse {
                    addr: std::net::Ipv4Addr::LOCALHOST,
                    port: 1,
                    source: io::Error::from_raw_os_error(libc::EADDRINUSE),
                }),
                libc::EADDRINUSE,
            ),
        ];
        for (error, errno) in cases {
            assert_eq!(error.errno(), errno, "{error}");
        }
    }

    /// A rejection's text reason is shown; binary private data by its size.
    #[test]
    fn a_rejection_shows_its_reason_when_it_is_text() {
        let shown = |pd: &[u8]| {
            DatapathError::Rejected {
                private_data: pd.to_vec(),
                peer_params: None,
            }
            .to_string()
        };
        assert_eq!(
            shown(b"server busy\0\0\0"),
            "connection rejected by peer: \"server busy\""
        );
        assert_eq!(
            shown(&[0x10, 0x00, 0x7f, 0xff]),
            "connection rejected by peer (4 bytes of private data)"
        );
        assert_eq!(
            shown(b""),
            "connection rejected by peer (0 bytes of private data)"
        );
        assert_eq!(
            shown(b"a\nb"),
            "connection rejected by peer (3 bytes of private data)"
        );
        let long = "x".repeat(300);
        assert_eq!(
            shown(long.as_bytes()),
            format!("connection rejected by peer: \"{}...\"", "x".repeat(200))
        );
    }
}
