//! The socket transport: MPA/DDP/RDMAP over a kernel TCP socket.
//!
//! Connection setup (TCP connect, then the MPA Request/Reply exchange of RFC 5044 7.1 and
//! RFC 6581) runs on the caller's thread with a deadline; a listener reads Requests on a
//! thread of its own ([`listen`]). Once in Full Operation, one engine
//! thread per connection owns the non-blocking socket (`mio`), the MPA encoder/decoder and the
//! sans-IO [`rdmap::QueuePair`]; the application talks to it through a lock-free command channel
//! and the completion queue (the API of [`crate::verbs`]).

mod engine;
mod listen;
mod sockopt;

use engine::{start_engine, Setup};

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Instant;

use mpa::{InitiatorEvent, MpaError};
use rdmap::RecvWr;

use crate::memory::ProtectionDomain;
use crate::verbs::cm::{check_connect, with_fresh_vtag, ConnectParams, Connection, Framing};
use crate::verbs::cq::CompletionQueue;
use crate::verbs::qp::Agreed;
use crate::verbs::qp::QpStart;
use crate::DatapathError;

/// Connects to an MPA responder (the rdma_cm `connect` step) and starts the queue pair.
pub fn connect(
    addr: SocketAddr,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    params: &ConnectParams,
    private_data: &[u8],
) -> Result<Connection, DatapathError> {
    connect_with_recvs(addr, pd, cq, params, private_data, Vec::new())
}

/// [`connect`] with `recvs` posted before the peer can send anything (verbs' `ibv_post_recv`
/// before `rdma_connect`): see [`crate::Device::connect_with_recvs`].
pub fn connect_with_recvs(
    addr: SocketAddr,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    params: &ConnectParams,
    private_data: &[u8],
    recvs: Vec<RecvWr>,
) -> Result<Connection, DatapathError> {
    let start = QpStart::with_recvs(recvs);
    connect_start(addr, pd, cq, params, private_data, start)
}

/// [`connect_with_recvs`] of a queue pair numbered and with receives as `start` says.
pub(crate) fn connect_start(
    addr: SocketAddr,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    params: &ConnectParams,
    private_data: &[u8],
    start: QpStart,
) -> Result<Connection, DatapathError> {
    // Everything refusable, before the peer has a connection: the receives are posted once
    // the connection is up, the shared receive queue attached after the MPA exchange.
    check_connect(params, pd, private_data, &start.recvs)?;
    if let Framing::Ift(cfg) = &params.framing {
        return connect_ift(addr, pd, cq, params, cfg, private_data, start);
    }
    // Check the configuration and private data before opening a connection the responder
    // would only see fail.
    let mut initiator = mpa::Initiator::new(params.mpa.clone(), private_data, Instant::now())?;
    tracing::info!(peer = %addr, "connecting (kernel TCP)");
    let setup_deadline = crate::verbs::timeout::deadline_after(params.setup_timeout);
    let mut stream = tcp_connect(addr, params)?;
    stream.set_nodelay(true)?;
    stream.write_all(initiator.request())?;
    let mut buf = vec![0u8; 4096];
    loop {
        // The startup's own deadline: `MpaConfig::timeout`, RFC 5044 7.1.2 rule 10.
        let n = read_answer(
            &mut stream,
            &mut buf,
            (initiator.poll_timeout(), setup_deadline),
            || Ok(initiator.handle_timeout(Instant::now())?),
            DatapathError::Mpa(MpaError::ConnectionLost),
            "waiting for the MPA Reply",
        )?;
        let now = Instant::now();
        let (used, event) = match initiator.feed(&buf[..n], now) {
            Ok(progress) => progress,
            Err(e) => {
                if let Some(terminate) = iwarp_conn::startup_terminate(&initiator, &e) {
                    tracing::info!(peer = %addr, error = %e, "MPA Reply not acceptable: Terminate sent");
                    // Best effort: the connection closes either way.
                    let _ = stream.write_all(&terminate);
                    let _ = stream.shutdown(Shutdown::Write);
                }
                return Err(e.into());
            }
        };
        match event {
            InitiatorEvent::NeedMore => continue,
            InitiatorEvent::Rejected {
                private_data,
                peer_params,
            } => {
                tracing::info!(peer = %addr, "MPA Request rejected by the peer");
                let _ = stream.shutdown(Shutdown::Both);
                return Err(DatapathError::Rejected {
                    private_data,
                    peer_params,
                });
            }
            InitiatorEvent::Accepted {
                negotiated,
                private_data,
            } => {
                let setup = Setup {
                    agreed: Agreed::Mpa(negotiated),
                    leftover: buf[used..n].to_vec(),
                    initiator: true,
                    first_out: Vec::new(),
                    start,
                };
                let qp = start_engine(stream, setup, pd, cq, params)?;
                return Ok(Connection { qp, private_data });
            }
        }
    }
}

/// Kernel TCP's connect to `addr` within `params.setup_timeout`, from
/// [`ConnectParams::local_addr`] if it names one, with [`ConnectParams::tos`] from the SYN on.
fn tcp_connect(addr: SocketAddr, params: &ConnectParams) -> Result<TcpStream, DatapathError> {
    if let Some(local) = params.local_addr {
        if local.is_ipv4() != addr.is_ipv4() {
            return Err(DatapathError::InvalidArgument(
                "the local address is not of the peer's address family",
            ));
        }
    }
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sockopt::set_tos(&socket, addr, params.tos)?;
    if let Some(local) = params.local_addr {
        // As the engine reserves its ports: a port of ours still in TIME-WAIT may be used
        // again.
        socket.set_reuse_address(true)?;
        socket.bind(&local.into())?;
    }
    // An unanswered SYN is a timeout, ETIMEDOUT, as on the engine (whose MPA startup deadline
    // covers the SYN: `Mpa(StartupTimeout)`); socket2 makes it an `io::Error` of kind
    // `TimedOut`, which carries no errno.
    socket
        .connect_timeout(&addr.into(), params.setup_timeout)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::TimedOut => DatapathError::Timeout("connecting"),
            _ => e.into(),
        })?;
    Ok(socket.into())
}

/// [`connect`] with IFT framing (draft-williams-iwarp-ift-01): the phase 0 adaption
/// indication out, the responder's phase 1 in, by the setup deadline.
fn connect_ift(
    addr: SocketAddr,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    params: &ConnectParams,
    cfg: &ift::IftConfig,
    private_data: &[u8],
    qp_start: QpStart,
) -> Result<Connection, DatapathError> {
    if !private_data.is_empty() {
        return Err(DatapathError::InvalidArgument(
            "IFT framing carries no private data",
        ));
    }
    let start = Instant::now();
    // The exchange's own deadline (`IftConfig::timeout`), within the setup's, as on the
    // engine.
    let cfg = ift::IftConfig {
        timeout: cfg.timeout.min(params.setup_timeout),
        ..with_fresh_vtag(cfg)
    };
    let mut initiator = ift::Initiator::new(cfg, start);
    tracing::info!(peer = %addr, "connecting with IFT framing (kernel TCP)");
    let setup_deadline = crate::verbs::timeout::deadline_after(params.setup_timeout);
    let mut stream = tcp_connect(addr, params)?;
    stream.set_nodelay(true)?;
    stream.write_all(initiator.indication())?;
    let mut buf = vec![0u8; 4096];
    loop {
        let n = read_answer(
            &mut stream,
            &mut buf,
            (initiator.poll_timeout(), setup_deadline),
            || Ok(initiator.handle_timeout(Instant::now())?),
            DatapathError::Ift(ift::IftError::ConnectionLost),
            "waiting for the IFT adaption indication",
        )?;
        let (used, done) = initiator.feed(&buf[..n], Instant::now())?;
        let Some(negotiated) = done else { continue };
        let setup = Setup {
            agreed: Agreed::Ift {
                negotiated,
                ird: params.mpa.ird,
                ord: params.mpa.ord,
            },
            leftover: buf[used..n].to_vec(),
            initiator: true,
            first_out: Vec::new(),
            start: qp_start,
        };
        let qp = start_engine(stream, setup, pd, cq, params)?;
        return Ok(Connection {
            qp,
            private_data: Vec::new(),
        });
    }
}

/// Reads once, failing with `TimedOut` after `deadline` and `UnexpectedEof` on EOF.
fn read_with_deadline(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<usize> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(io::ErrorKind::TimedOut.into())
            }
            Err(e) => return Err(e),
        }
    }
}

/// Reads what the responder sends an Initiator (its MPA Reply, its IFT indication, what
/// follows) until the earlier of `(exchange, setup)`, the exchange's own deadline and the
/// setup's, as on the engine: when it passes, `timed_out` gives the exchange's error if it is
/// the exchange's deadline that passed (else the setup's timeout); a peer that closed or
/// reset first gives `lost`, as on the engine; anything else, the setup's error during
/// `during`.
fn read_answer(
    stream: &mut TcpStream,
    buf: &mut [u8],
    (exchange, setup): (Option<Instant>, Instant),
    timed_out: impl FnOnce() -> Result<(), DatapathError>,
    lost: DatapathError,
    during: &'static str,
) -> Result<usize, DatapathError> {
    let deadline = exchange.map_or(setup, |d| d.min(setup));
    let e = match read_with_deadline(stream, buf, deadline) {
        Ok(n) => return Ok(n),
        Err(e) => e,
    };
    match e.kind() {
        io::ErrorKind::TimedOut => timed_out()?,
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => return Err(lost),
        _ => {}
    }
    Err(setup_error(e, during))
}

fn setup_error(e: io::Error, during: &'static str) -> DatapathError {
    if e.kind() == io::ErrorKind::TimedOut {
        DatapathError::Timeout(during)
    } else {
        DatapathError::Io(e)
    }
}
