//! Connection management in rdma_cm's terms: [`Listener`] (`rdma_listen`), the
//! [`ConnectRequest`] it yields (`RDMA_CM_EVENT_CONNECT_REQUEST`: accept or reject, with
//! private data), [`Connection`] (the established queue pair and the peer's private data) and
//! [`ConnectParams`]. The transports provide listening and the pending request through
//! [`ListenProvider`] and [`PendingProvider`], so this module names neither.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mpa::{MpaConfig, MpaError, RequestInfo};
use rdmap::RecvWr;

use crate::memory::ProtectionDomain;
use crate::verbs::cq::CompletionQueue;
use crate::verbs::qp::{post_initial_recvs, QpStart, QueuePair};
use crate::verbs::srq::SharedReceiveQueue;
use crate::DatapathError;

/// The largest [`ConnectParams::backlog`] a listener takes (listening refuses more with
/// [`DatapathError::InvalidArgument`]).
pub const MAX_BACKLOG: usize = 1 << 16;

/// The most work requests a queue pair's send queue or receive queue holds
/// ([`ConnectParams::sq_depth`], `rq_depth`; verbs' `max_qp_wr`). A connect, listen or accept
/// asking for more fails with [`DatapathError::InvalidArgument`]. The queues grow as they fill,
/// so a deep queue costs memory only when it is used.
pub const MAX_QP_WR: usize = 1 << 20;

/// The largest IRD and ORD ([`MpaConfig::ird`], `ord`; verbs' `max_qp_rd_atom` and
/// `max_qp_init_rd_atom`): MPA carries them in 14 bits (RFC 6581 9.1), where this value says
/// "no negotiation" and is taken as a depth as it is. The same bound holds with IFT framing.
/// Entering RTS stages IRD inbound Reads (and ORD outbound Atomics), so a larger value would
/// only cost memory.
pub const MAX_IRD_ORD: u16 = mpa::wire::IRD_ORD_NO_NEGOTIATION;

/// Everything a connect refuses before it opens a connection, so that it fails at the call
/// (`rdma_connect`'s `EINVAL`) on either transport, never as an event or once the peer has
/// accepted: the parameters ([`ConnectParams::check`]), the receives to post
/// ([`check_initial_recvs`]), a shared receive queue of another protection domain, the MPA
/// configuration and private data (over 512 octets, 508 with RFC 6581's block:
/// [`DatapathError::Mpa`]), private data with IFT framing (none is carried).
pub(crate) fn check_connect(
    params: &ConnectParams,
    pd: &ProtectionDomain,
    private_data: &[u8],
    recvs: &[RecvWr],
) -> Result<(), DatapathError> {
    params.check()?;
    check_initial_recvs(params, pd, recvs)?;
    if let Some(srq) = &params.srq {
        srq.check_pd(pd.id)?;
    }
    match &params.framing {
        Framing::Mpa => mpa::Initiator::check(&params.mpa, private_data)?,
        Framing::Ift(_) if !private_data.is_empty() => {
            return Err(DatapathError::InvalidArgument(
                "IFT framing carries no private data",
            ));
        }
        Framing::Ift(_) => {}
    }
    Ok(())
}

/// Checks `recvs` as [`post_initial_recvs`] will post them into a queue pair of `params` in
/// `pd`, before there is one: a transport that posts them only once its connection is up
/// (the socket transport, after the MPA exchange) checks first, so that a refusal costs the
/// peer no connection. Receives with a shared receive queue (`params.srq`) are refused.
pub(crate) fn check_initial_recvs(
    params: &ConnectParams,
    pd: &ProtectionDomain,
    recvs: &[RecvWr],
) -> Result<(), DatapathError> {
    if recvs.is_empty() {
        return Ok(());
    }
    if params.srq.is_some() {
        // As `QueuePair::post_recv` on such a queue pair.
        return Err(DatapathError::InvalidWorkRequest(
            rdmap::RdmapError::SrqAttached,
        ));
    }
    let mut qp = receive_queue_alone(params, pd);
    post_initial_recvs(&mut qp, &pd.table.snapshot(), recvs.to_vec())
}

/// A queue pair of `pd` with the receive queue of `params` alone (no Read queues to stage):
/// it takes receives as the connection's queue pair will, to check them before there is one.
pub(crate) fn receive_queue_alone(
    params: &ConnectParams,
    pd: &ProtectionDomain,
) -> rdmap::QueuePair {
    rdmap::QueuePair::new(rdmap::QpConfig {
        pd: pd.id,
        sq_depth: 0,
        rq_depth: params.rq_depth,
        ird: 0,
        ord: 0,
        extensions: params.rdmap_extensions,
    })
}

/// Parameters of a connection: MPA negotiation and queue sizes.
#[derive(Debug, Clone)]
pub struct ConnectParams {
    /// What we ask for in MPA (revision, CRC, markers, IRD/ORD, RTR, private-data cap). With
    /// [`Framing::Ift`], its IRD and ORD (IFT negotiates neither: both ends are configured
    /// alike) and its accept timeout still apply (the exchange's own deadline is
    /// `IftConfig::timeout`).
    pub mpa: MpaConfig,
    /// How DDP segments are framed on the TCP stream: MPA (the default) or IFT. Both ends
    /// must be configured alike (IFT section 4: the port or the application protocol agrees
    /// on it); an IFT end and an MPA end fail their setup at once, each with a clear error.
    pub framing: Framing,
    /// Send queue depth (outstanding send/write/read work requests), at most [`MAX_QP_WR`].
    pub sq_depth: usize,
    /// Receive queue depth (posted receive work requests), at most [`MAX_QP_WR`].
    pub rq_depth: usize,
    /// Deadline for TCP connect plus the MPA exchange.
    pub setup_timeout: Duration,
    /// A shared receive queue of the connection's protection domain to take receive buffers
    /// from (then receives are posted there, not on the queue pair).
    pub srq: Option<SharedReceiveQueue>,
    /// Connects from this address (`rdma_resolve_addr`'s `src_addr`, `rdma_bind_addr` before
    /// `rdma_connect`); `None` lets the system choose. The socket transport binds it (an
    /// address of this host; port 0 for any port). The AF_XDP engine's address is its
    /// interface's: another IP fails the connect with [`DatapathError::InvalidArgument`]
    /// (unspecified is taken as the interface's); a port other than 0 is the source port.
    /// An address of the other family than the peer's fails with
    /// [`DatapathError::InvalidArgument`]; a port another socket listens on or is connected
    /// from fails the connect (as bound with `SO_REUSEADDR`: one of ours left in TIME-WAIT
    /// does not). Listeners ignore it.
    pub local_addr: Option<SocketAddr>,
    /// A completion queue of its own for the queue pair's receive completions (verbs'
    /// `ibv_qp_init_attr.recv_cq`; those of receives taken from `srq` too). `None`: the
    /// completion queue given to the connect or accept (`send_cq`) takes them with the send
    /// completions. Polling either queue drives an AF_XDP engine's inline progress.
    pub recv_cq: Option<CompletionQueue>,
    /// TCP keepalive (RFC 9293 3.8.4), so that an idle connection to a vanished peer ends:
    /// on by default (30 s idle, then 6 probes 5 s apart); `None` turns it off.
    pub keepalive: Option<Keepalive>,
    /// User timeout (RFC 5482; `TCP_USER_TIMEOUT` on the socket transport): data that waits
    /// this long on the peer without progress (unacknowledged, or behind a window that never
    /// opens) ends the connection. Default 30 s; `None` leaves only the retransmission limit.
    /// Between 1 ns and [`MAX_USER_TIMEOUT`] (zero is refused: Linux reads it as "none",
    /// which is `None` here); the socket transport rounds it up to whole milliseconds.
    pub user_timeout: Option<Duration>,
    /// How long a graceful close waits for the peer to take what the queue pair queued and
    /// our FIN (`QueuePair::disconnect`, `start_disconnect`, an unaccepted connection's
    /// close, the end of a queue pair in Error) before the connection is reset: a peer that
    /// reads a trickle, or nothing, cannot hold it longer. On the socket transport it also
    /// bounds how long the close reads a peer that still sends after our FIN. Default 10 s;
    /// above zero and at most [`MAX_CLOSE_TIMEOUT`]. A listener's applies to every connection it
    /// accepts or turns away, unless the accept sets its own ([`ConnectRequest::close_timeout`]).
    pub close_timeout: Duration,
    /// Listeners only (`rdma_listen`'s backlog): the most connections whose valid MPA Request
    /// waits for the application's accept or reject. A Request beyond them is rejected (MPA
    /// Reply with R=1) and its connection closed; one left unanswered fails after
    /// `mpa.accept_timeout`. Default 64, at most [`MAX_BACKLOG`] (the queue is allocated
    /// whole when listening starts).
    pub backlog: usize,
    /// The RDMAP extensions of RFC 7306 (Atomic Operations, Immediate Data) on the
    /// connection's queue pair ([`rdmap::QpConfig::extensions`]). Off by default: turn them
    /// on only when the application protocol knows the peer supports them (RFC 7306 1.1;
    /// Linux siw does not). Both ends must agree: a peer without them terminates the
    /// connection on the first such message.
    pub rdmap_extensions: bool,
    /// The IP Type of Service octet of the connection's segments (rdma_cm's
    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`, perftest's `--tos`): the DSCP in its upper six
    /// bits (RFC 2474 3). A listener's applies to its SYN-ACKs and the connections it
    /// accepts. The ECN field (the lower two bits) is left to TCP, as Linux does for TCP
    /// sockets: the AF_XDP engine sends Not-ECT (it does not negotiate ECN, RFC 3168 6.1.1).
    /// The socket transport sets it with `IP_TOS` (`IPV6_TCLASS` for IPv6). Default 0.
    pub tos: u8,
}

/// The framing of DDP segments on a connection's TCP stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Framing {
    /// MPA (RFC 5044), as [`ConnectParams::mpa`] asks.
    #[default]
    Mpa,
    /// IFT (draft-williams-iwarp-ift-01), experimental, on both transports: the adaption
    /// exchange of section 4 with these settings, then frames of section 5.1
    /// (separate header and payload CRCs, no padding, no Markers). The VTag is drawn afresh
    /// from the operating system's random source for every connection, whatever `vtag` says.
    /// No private data is exchanged and there is no MPA-style reject: a listener that
    /// rejects just closes the connection. `rdma` (R) must be set: the DDP mode has no queue
    /// pair to run (a connect, listen or accept asking for it fails with
    /// [`DatapathError::InvalidArgument`]).
    ///
    /// With `allow_speculative` (SP) the peer's AF_XDP engine may place our frames that
    /// arrive out of order before the ones ahead of them (section 8). Section 8.3 then holds
    /// for the application: the parts of a receive buffer or of a region that no message
    /// wrote may hold anything, not necessarily what they held before.
    Ift(ift::IftConfig),
}

/// `cfg` with a VTag fresh from the operating system's random source, for one connection
/// (IFT section 4.2).
pub(crate) fn with_fresh_vtag(cfg: &ift::IftConfig) -> ift::IftConfig {
    ift::IftConfig {
        vtag: crate::memory::random_u64() as u16,
        ..cfg.clone()
    }
}

/// TCP keepalive settings (RFC 9293 3.8.4; `SO_KEEPALIVE`, `TCP_KEEPIDLE`, `TCP_KEEPINTVL`,
/// `TCP_KEEPCNT` on the socket transport, where the kernel takes whole seconds: the times are
/// rounded up to them, at least one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe (above zero, at most [`Keepalive::MAX_TIME`]).
    pub idle: Duration,
    /// Time between unanswered probes (above zero, at most [`Keepalive::MAX_TIME`]).
    pub interval: Duration,
    /// Unanswered probes that end the connection (1 to [`Keepalive::MAX_PROBES`]).
    pub probes: u32,
}

impl Keepalive {
    /// The longest idle time and probe interval: Linux's (`TCP_KEEPIDLE`, `TCP_KEEPINTVL`:
    /// 32,767 s), which the socket transport hands them to; both transports refuse more.
    pub const MAX_TIME: Duration = Duration::from_secs(32_767);
    /// The most probes: Linux's (`TCP_KEEPCNT`: 127).
    pub const MAX_PROBES: u32 = 127;
}

/// The longest close timeout ([`ConnectParams::close_timeout`]): an hour.
pub const MAX_CLOSE_TIMEOUT: Duration = Duration::from_secs(3600);

/// The longest user timeout ([`ConnectParams::user_timeout`]): Linux's `TCP_USER_TIMEOUT`, in
/// milliseconds in a C `int` (about 24.8 days); both transports refuse more.
pub const MAX_USER_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            idle: Duration::from_secs(30),
            interval: Duration::from_secs(5),
            probes: 6,
        }
    }
}

impl ConnectParams {
    /// Checks what a connect or an accept makes from these parameters, before anything of
    /// the connection is made: queue depths up to [`MAX_QP_WR`] (0 is a queue that takes
    /// nothing), IRD and ORD up to [`MAX_IRD_ORD`], IFT framing in its RDMA mode (R set: the
    /// queue pairs run RDMAP), the close timeout up to [`MAX_CLOSE_TIMEOUT`], keepalive and
    /// the user timeout within what the kernel takes
    /// ([`Keepalive::MAX_TIME`], [`Keepalive::MAX_PROBES`], [`MAX_USER_TIMEOUT`]: the socket
    /// transport would otherwise fail only after the MPA exchange, the peer told "accepted").
    /// [`DatapathError::InvalidArgument`] says which is wrong.
    pub(crate) fn check(&self) -> Result<(), DatapathError> {
        if matches!(&self.framing, Framing::Ift(cfg) if !cfg.rdma) {
            return Err(DatapathError::InvalidArgument(
                "IFT's DDP mode (R clear) is not offered: queue pairs run RDMAP",
            ));
        }
        if self.sq_depth > MAX_QP_WR || self.rq_depth > MAX_QP_WR {
            return Err(DatapathError::InvalidArgument(
                "a send or receive queue holds at most MAX_QP_WR (1048576) work requests",
            ));
        }
        if self.mpa.ird > MAX_IRD_ORD || self.mpa.ord > MAX_IRD_ORD {
            return Err(DatapathError::InvalidArgument(
                "IRD and ORD are at most 0x3FFF",
            ));
        }
        if let Some(k) = self.keepalive {
            // The socket transport rounds the times up to whole seconds, at least one, and
            // takes at least one probe; our TCP would probe every turn, or give up without
            // probing (RFC 9293 3.8.4: one unanswered probe is no proof of a dead peer).
            let bad = |d: Duration| d.is_zero() || d > Keepalive::MAX_TIME;
            if bad(k.idle) || bad(k.interval) || k.probes == 0 || k.probes > Keepalive::MAX_PROBES {
                return Err(DatapathError::InvalidArgument(
                    "keepalive's idle time and interval are above zero and at most 32767 s, \
                     its probes 1 to 127 (None turns it off)",
                ));
            }
        }
        if self
            .user_timeout
            .is_some_and(|t| t.is_zero() || t > MAX_USER_TIMEOUT)
        {
            return Err(DatapathError::InvalidArgument(
                "the user timeout is above zero (None turns it off) and at most 2147483647 ms",
            ));
        }
        if self.close_timeout.is_zero() || self.close_timeout > MAX_CLOSE_TIMEOUT {
            return Err(DatapathError::InvalidArgument(
                "the close timeout is above zero and at most MAX_CLOSE_TIMEOUT (3600 s)",
            ));
        }
        Ok(())
    }

    /// [`ConnectParams::check`] for a listener, whose parameters its accepts start from: the
    /// backlog too, up to [`MAX_BACKLOG`], and the MPA configuration its Responders take
    /// ([`DatapathError::Mpa`] with `MpaError::Local` for a `rev` other than 1 or 2).
    pub(crate) fn check_listen(&self) -> Result<(), DatapathError> {
        self.check()?;
        if matches!(self.framing, Framing::Mpa) {
            // Else every connection the listener took would fail at its Responder.
            mpa::Responder::check(&self.mpa)?;
        }
        if self.backlog > MAX_BACKLOG {
            return Err(DatapathError::InvalidArgument(
                "a listener's backlog is at most MAX_BACKLOG (65536) Requests",
            ));
        }
        Ok(())
    }

    /// The TCP settings of our own TCP (the AF_XDP engine) with these parameters' keepalive,
    /// user timeout and Type of Service.
    pub(crate) fn apply_to(&self, tcp: &mut tcp_engine::Config) {
        tcp.keepalive = self.keepalive.map(|k| (k.idle, k.interval, k.probes));
        tcp.user_timeout = self.user_timeout;
        tcp.tos = self.tos;
    }
}

impl Default for ConnectParams {
    fn default() -> Self {
        Self {
            mpa: MpaConfig::default(),
            framing: Framing::Mpa,
            sq_depth: 4096,
            rq_depth: 4096,
            setup_timeout: Duration::from_secs(10),
            srq: None,
            recv_cq: None,
            local_addr: None,
            keepalive: Some(Keepalive::default()),
            user_timeout: Some(Duration::from_secs(30)),
            close_timeout: Duration::from_secs(10),
            backlog: 64,
            rdmap_extensions: false,
            tos: 0,
        }
    }
}

/// An established connection: the queue pair and the private data the peer sent.
pub struct Connection {
    /// The connected queue pair.
    pub qp: QueuePair,
    /// Private data from the peer's MPA Request (at the responder) or Reply (at the initiator).
    pub private_data: Vec<u8>,
}

/// What a listener turned away, by cause ([`Listener::stats`]). Peers that never become
/// connections leave a count here rather than an error at [`Listener::accept`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenStats {
    /// Connections closed because their Request was malformed or unacceptable (RFC 5044
    /// 7.1.2: bad key, unsupported revision, private data too long, ...); `last_refusal`
    /// names the latest. Also those whose startup ended in a caught panic (a bug; logged as
    /// an error), which `last_refusal` does not name.
    pub refused: u64,
    /// Connections closed because their Request was not complete within `MpaConfig::timeout`
    /// (with IFT framing, their adaption indication within `IftConfig::timeout`).
    pub startup_timeouts: u64,
    /// Connections the peer closed or reset before its Request was complete.
    pub closed_early: u64,
    /// Requests rejected (Reply with R=1) because `ConnectParams::backlog` Requests already
    /// waited for the application.
    pub over_backlog: u64,
    /// Requests the application left unanswered past `MpaConfig::accept_timeout`.
    pub accept_timeouts: u64,
    /// Connections closed as soon as they were accepted because as many as the listener
    /// keeps already waited for their Request (socket transport: 1024, or a quarter of the
    /// process's descriptor limit, for all its socket listeners together; AF_XDP engine: a
    /// quarter of each shard's connection table, `XdpTcpConfig::max_connections`, for all
    /// its listeners together, counting also
    /// connections whose Request was refused until our FIN is acknowledged or they close;
    /// the engine resets the connection, the socket transport closes it).
    pub over_starting: u64,
    /// Connections closed as soon as they were accepted because the process was out of
    /// file descriptors (socket transport).
    pub out_of_descriptors: u64,
    /// The MPA error of the latest refused Request.
    pub last_refusal: Option<MpaError>,
    /// With [`Framing::Ift`]: the IFT error of the latest refused adaption indication
    /// (counted in `refused`; timeouts in `startup_timeouts`).
    pub last_ift_refusal: Option<ift::IftError>,
}

/// A listener's [`ListenStats`], kept by the transport that reads its Requests (failures only:
/// nothing on the per-packet path).
#[derive(Debug, Default)]
pub(crate) struct ListenRecord(Mutex<ListenStats>);

impl ListenRecord {
    fn update(&self, f: impl FnOnce(&mut ListenStats)) {
        if let Ok(mut stats) = self.0.lock() {
            f(&mut stats);
        }
    }

    /// A connection's startup failed before the application accepted it.
    pub(crate) fn startup_failed(&self, error: &MpaError) {
        self.update(|s| match error {
            MpaError::StartupTimeout => s.startup_timeouts += 1,
            MpaError::AcceptTimeout => s.accept_timeouts += 1,
            MpaError::ConnectionLost => s.closed_early += 1,
            other => {
                s.refused += 1;
                s.last_refusal = Some(other.clone());
            }
        });
    }

    /// A connection's IFT adaption exchange failed before the application accepted it.
    pub(crate) fn ift_startup_failed(&self, error: &ift::IftError) {
        self.update(|s| match error {
            ift::IftError::StartupTimeout => s.startup_timeouts += 1,
            ift::IftError::AcceptTimeout => s.accept_timeouts += 1,
            ift::IftError::ConnectionLost => s.closed_early += 1,
            other => {
                s.refused += 1;
                s.last_ift_refusal = Some(other.clone());
            }
        });
    }

    /// A connection's startup ended in a caught panic (a bug): counted with the refused.
    pub(crate) fn startup_panicked(&self) {
        self.update(|s| s.refused += 1);
    }

    /// A Request was rejected because the backlog was full.
    pub(crate) fn over_backlog(&self) {
        self.update(|s| s.over_backlog += 1);
    }

    /// A connection closed at once: too many waited for their Request already.
    pub(crate) fn over_starting(&self) {
        self.update(|s| s.over_starting += 1);
    }

    /// A connection closed at once: the process was out of descriptors.
    pub(crate) fn over_descriptors(&self) {
        self.update(|s| s.out_of_descriptors += 1);
    }

    pub(crate) fn snapshot(&self) -> ListenStats {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// The next item of a listener's queue, waiting up to `timeout` (`None`: forever): `Ok(None)`
/// when the time passed, `Disconnected` when the transport side is gone. What both
/// transports' [`ListenProvider::accept`] wait with.
pub(crate) fn recv_request<T>(
    rx: &crossbeam_channel::Receiver<T>,
    timeout: Option<Duration>,
) -> Result<Option<T>, DatapathError> {
    match timeout {
        None => rx.recv().map(Some).map_err(|_| DatapathError::Disconnected),
        Some(t) => match rx.recv_timeout(t) {
            Ok(m) => Ok(Some(m)),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Ok(None),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                Err(DatapathError::Disconnected)
            }
        },
    }
}

/// A transport's listening port.
pub(crate) trait ListenProvider: Send + Sync {
    /// The bound address.
    fn local_addr(&self) -> Result<SocketAddr, DatapathError>;
    /// The next connection whose MPA Request arrived, waiting up to `timeout` (`None`:
    /// forever); `Ok(None)` when the time passed.
    fn accept(
        &self,
        params: &ConnectParams,
        timeout: Option<Duration>,
    ) -> Result<Option<ConnectRequest>, DatapathError>;
}

/// A transport's connection whose MPA Request waits for the application.
pub(crate) trait PendingProvider: Send {
    /// Sends the accepting Reply and starts the queue pair: numbered and with receives
    /// posted as `start` says. The Reply goes only once nothing of the start can fail any
    /// more: a failed accept closes the connection without it.
    fn accept(
        self: Box<Self>,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        private_data: &[u8],
        start: QpStart,
        params: &ConnectParams,
    ) -> Result<QueuePair, DatapathError>;
    /// Sends the rejecting Reply (R=1) and closes.
    fn reject(
        self: Box<Self>,
        private_data: &[u8],
        params: &ConnectParams,
    ) -> Result<(), DatapathError>;
    /// The application dropped the request unanswered: rejects it (R=1, no private data; IFT:
    /// the connection closes) without waiting for anything, as the kernel's iWARP connection
    /// manager does for an id destroyed in that state (`iw_cm`'s `destroy_cm_id`).
    fn abandon(self: Box<Self>, params: &ConnectParams);
}

/// A listener that accepts MPA connections (the rdma_cm `listen` step): a kernel TCP listening
/// socket ([`Listener::bind`]), or a port of the AF_XDP engine
/// ([`crate::engine::xdp::XdpEngine::listen`]), or either through [`crate::Device::listen`].
pub struct Listener {
    inner: Box<dyn ListenProvider>,
    params: ConnectParams,
    record: Arc<ListenRecord>,
}

impl Listener {
    pub(crate) fn from_provider(
        inner: Box<dyn ListenProvider>,
        params: ConnectParams,
        record: Arc<ListenRecord>,
    ) -> Self {
        Self {
            inner,
            params,
            record,
        }
    }

    /// What the listener turned away so far, by cause.
    pub fn stats(&self) -> ListenStats {
        self.record.snapshot()
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, DatapathError> {
        self.inner.local_addr()
    }

    /// The backlog it was made with (`ConnectParams::backlog`, at least 1).
    pub(crate) fn backlog(&self) -> usize {
        self.params.backlog.max(1)
    }

    /// Where [`Listener::stats`] comes from.
    pub(crate) fn record(&self) -> Arc<ListenRecord> {
        self.record.clone()
    }

    /// Waits for the next connection whose valid MPA Request arrived. A peer that sends a
    /// malformed Request, or none in time, is closed without troubling the caller (see
    /// [`Listener::stats`]); Requests are read beside the application, so a slow peer holds
    /// up nobody else.
    pub fn accept(&self) -> Result<ConnectRequest, DatapathError> {
        self.inner
            .accept(&self.params, None)?
            .ok_or(DatapathError::Disconnected)
    }

    /// Like [`accept`](Self::accept) but gives up (returning `Ok(None)`) when no connection
    /// arrives within `timeout`.
    pub fn accept_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<ConnectRequest>, DatapathError> {
        self.inner.accept(&self.params, Some(timeout))
    }
}

/// A connection request that has sent a valid MPA Request (or IFT adaption indication);
/// accept or reject it.
pub struct ConnectRequest {
    /// The transport's side of it; taken by the answer, else by the drop
    /// ([`PendingProvider::abandon`]).
    inner: Option<Box<dyn PendingProvider>>,
    /// The MPA Request; `None` with IFT framing.
    info: Option<RequestInfo>,
    peer: SocketAddr,
    /// The address the peer connected to.
    local: SocketAddr,
    pub(crate) params: ConnectParams,
    /// The context of the listener it came from ([`Listener::notify_with_context`]).
    context: u64,
    /// Its place in a notifying listener's backlog, given back when the request is answered
    /// or dropped ([`Listener::notify`]).
    backlog_place: Option<BacklogPlace>,
}

/// A place in the backlog of a listener handed to [`Listener::notify`]: taken before a
/// request leaves the listener for the event channel, given back when the request is dropped
/// (accepted, rejected, or dropped unanswered).
pub(crate) struct BacklogPlace(crossbeam_channel::Receiver<()>);

impl BacklogPlace {
    /// Takes one of the places of `places` (a channel as deep as the backlog: a send is a
    /// place taken), waiting at most `timeout` for one to be given back.
    pub(crate) fn take(
        places: &crossbeam_channel::Sender<()>,
        given_back: &crossbeam_channel::Receiver<()>,
        timeout: Duration,
    ) -> Option<BacklogPlace> {
        places
            .send_timeout((), timeout)
            .ok()
            .map(|()| BacklogPlace(given_back.clone()))
    }
}

impl Drop for BacklogPlace {
    fn drop(&mut self) {
        let _ = self.0.try_recv();
    }
}

impl ConnectRequest {
    pub(crate) fn new(
        inner: Box<dyn PendingProvider>,
        info: Option<RequestInfo>,
        peer: SocketAddr,
        local: SocketAddr,
        params: ConnectParams,
    ) -> Self {
        Self {
            inner: Some(inner),
            info,
            peer,
            local,
            params,
            context: 0,
            backlog_place: None,
        }
    }

    /// The transport's side, for the answer. Present until an answer or the drop takes it:
    /// every answer takes `self`.
    fn take_inner(&mut self) -> Result<Box<dyn PendingProvider>, DatapathError> {
        self.inner.take().ok_or(DatapathError::Disconnected)
    }

    /// The request as it comes from a listener whose context is `context`, holding `place`
    /// of its backlog until it is answered.
    pub(crate) fn notified(mut self, context: u64, place: BacklogPlace) -> Self {
        self.context = context;
        self.backlog_place = Some(place);
        self
    }

    /// Whether the request holds a place of the backlog whose places are given back to
    /// `given_back` (it came from that notifying listener).
    pub(crate) fn holds_place_of(&self, given_back: &crossbeam_channel::Receiver<()>) -> bool {
        self.backlog_place
            .as_ref()
            .is_some_and(|p| p.0.same_channel(given_back))
    }

    /// The context of the listener the request came from (`rdma_cm_event.listen_id` and the
    /// `context` it carries: several listeners may share one event channel), as given to
    /// [`Listener::notify_with_context`]; 0 otherwise.
    pub fn listen_context(&self) -> u64 {
        self.context
    }

    /// The private data of the Request (without the RFC 6581 IRD/ORD block); none with IFT
    /// framing.
    pub fn private_data(&self) -> &[u8] {
        self.info.as_ref().map_or(&[], |i| &i.private_data)
    }

    /// Everything the MPA Request said; `None` with IFT framing.
    pub fn info(&self) -> Option<&RequestInfo> {
        self.info.as_ref()
    }

    /// The IRD and ORD the initiator offered in its Request's RFC 6581 block (the
    /// `responder_resources` and `initiator_depth` of rdma_cm's connect-request event), each
    /// 0x3FFF where it asks not to negotiate ([`MAX_IRD_ORD`]); `None` if it sent none (MPA
    /// revision 1, a revision 2 Request without the block, IFT framing).
    pub fn offered_ird_ord(&self) -> Option<(u16, u16)> {
        let enhanced = self.info.as_ref()?.enhanced?;
        Some((enhanced.ird, enhanced.ord))
    }

    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The address the initiator connected to (`rdma_get_local_addr` on the request's id):
    /// the accepted connection's local address, a specific one even for a listener bound to
    /// the unspecified address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Makes the queue pair that accepting creates take its receives from `srq` (rdma_cm's
    /// `rdma_create_qp` with an SRQ in its attributes), whatever the listener's parameters say.
    pub fn use_srq(mut self, srq: &SharedReceiveQueue) -> Self {
        self.params.srq = Some(srq.clone());
        self
    }

    /// Makes the queue pair that accepting creates deliver its receive completions to
    /// `recv_cq` (rdma_cm's `rdma_create_qp` with its own `recv_cq`), whatever the listener's
    /// parameters say ([`ConnectParams::recv_cq`]); the completion queue given to the accept
    /// takes the send completions.
    pub fn use_recv_cq(mut self, recv_cq: &CompletionQueue) -> Self {
        self.params.recv_cq = Some(recv_cq.clone());
        self
    }

    /// Sets the send and receive queue depths of the queue pair that accepting creates
    /// (`rdma_create_qp`'s `cap.max_send_wr` and `max_recv_wr` on the request's id), whatever
    /// the listener's parameters say ([`ConnectParams::sq_depth`], `rq_depth`). Each at most
    /// [`MAX_QP_WR`]: more fails the accept with [`DatapathError::InvalidArgument`] and
    /// rejects the Request.
    pub fn queue_depths(mut self, sq_depth: usize, rq_depth: usize) -> Self {
        self.params.sq_depth = sq_depth;
        self.params.rq_depth = rq_depth;
        self
    }

    /// Sets the IRD and ORD the accept offers (`rdma_accept`'s `responder_resources` and
    /// `initiator_depth`), whatever the listener's parameters say: the MPA Reply carries them
    /// and they are negotiated with the Request's as RFC 6581 9.1 says (our ORD at most the
    /// initiator's IRD; see [`ConnectRequest::info`] for what it offered). Each at most
    /// [`MAX_IRD_ORD`] (0x3FFF, which means "do not negotiate"); a larger value fails the
    /// accept with [`DatapathError::InvalidArgument`] and rejects the Request. IFT negotiates
    /// neither: they are our IRD and ORD as they are.
    pub fn ird_ord(mut self, ird: u16, ord: u16) -> Self {
        self.params.mpa.ird = ird;
        self.params.mpa.ord = ord;
        self
    }

    /// Sets the RDMAP extensions of RFC 7306 on the queue pair that accepting creates,
    /// whatever the listener's parameters say ([`ConnectParams::rdmap_extensions`]): for an
    /// application that learns from the Request's private data whether its peer speaks them.
    pub fn rdmap_extensions(mut self, on: bool) -> Self {
        self.params.rdmap_extensions = on;
        self
    }

    /// Sets how long the queue pair that accepting creates waits for a close to finish
    /// gracefully before it resets the connection, whatever the listener's parameters say
    /// ([`ConnectParams::close_timeout`]): for an application that gives some peers longer
    /// than others. Above zero and at most [`MAX_CLOSE_TIMEOUT`]: another value fails the
    /// accept with [`DatapathError::InvalidArgument`] and rejects the Request.
    pub fn close_timeout(mut self, timeout: Duration) -> Self {
        self.params.close_timeout = timeout;
        self
    }

    /// Accepts with our private data and starts the queue pair.
    pub fn accept(
        self,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        private_data: &[u8],
    ) -> Result<Connection, DatapathError> {
        self.accept_with_recvs(pd, cq, private_data, Vec::new())
    }

    /// Accepts, with `recvs` posted before the peer can send anything: iWARP has no
    /// receiver-not-ready retry, so a Send that finds no posted buffer ends the connection
    /// (RFC 5041 7.1, MSN with no buffer). Receives that cannot be posted fail the accept as
    /// in [`crate::Device::connect_with_recvs`] (more than the receive queue holds with
    /// `RecvQueueFull`), and so do parameters out of bounds ([`crate::DeviceAttr`]), a shared
    /// receive queue of another protection domain (`InvalidArgument`), private data MPA
    /// cannot carry (over 512 octets with RFC 6581's block, [`DatapathError::Mpa`]) and any
    /// with IFT framing (`InvalidArgument`): the Request is then rejected, so the initiator
    /// hears of it at once.
    pub fn accept_with_recvs(
        self,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        private_data: &[u8],
        recvs: Vec<RecvWr>,
    ) -> Result<Connection, DatapathError> {
        self.accept_start(pd, cq, private_data, QpStart::with_recvs(recvs))
    }

    /// [`ConnectRequest::accept_with_recvs`] of a queue pair numbered and with receives as
    /// `start` says.
    pub(crate) fn accept_start(
        self,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        private_data: &[u8],
        start: QpStart,
    ) -> Result<Connection, DatapathError> {
        self.check_accept(pd, private_data, &start)?
            .finish_accept(pd, cq, private_data, start)
    }

    /// Checks what accepting with these arguments needs (depths, IRD/ORD, the receives to
    /// post, the shared receive queue's domain, private data the framing can carry); on a
    /// refusal the request is spent (rejected: the peer hears of it now rather than at its
    /// setup timeout) and the error returned. The request back if it may be accepted.
    pub(crate) fn check_accept(
        self,
        pd: &ProtectionDomain,
        private_data: &[u8],
        start: &QpStart,
    ) -> Result<Self, DatapathError> {
        let refused = self.params.check().and_then(|()| {
            // The receives are posted once the connection is up: refused first.
            check_initial_recvs(&self.params, pd, &start.recvs)?;
            if let Some(srq) = &self.params.srq {
                srq.check_pd(pd.id)?;
            }
            self.check_private_data(private_data)
        });
        if let Err(e) = refused {
            // Depths or IRD/ORD out of bounds (set on the request, or the listener's),
            // receives that cannot be posted, private data IFT cannot carry. The request is
            // spent: the peer hears of the refusal now rather than at its setup timeout (the
            // drop rejects it).
            drop(self);
            return Err(e);
        }
        Ok(self)
    }

    /// Accepts after [`ConnectRequest::check_accept`] passed: the Reply sent, the queue pair
    /// running.
    pub(crate) fn finish_accept(
        mut self,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        private_data: &[u8],
        start: QpStart,
    ) -> Result<Connection, DatapathError> {
        let qp = self
            .take_inner()?
            .accept(pd, cq, private_data, start, &self.params)?;
        Ok(Connection {
            qp,
            private_data: self.info.take().map(|i| i.private_data).unwrap_or_default(),
        })
    }

    /// Rejects with private data (MPA Reply with R=1), then closes the connection. Private
    /// data MPA cannot carry (over 512 octets with RFC 6581's block) fails with
    /// [`DatapathError::Mpa`], and the Request is rejected without it; so does any private
    /// data under IFT framing, which carries none ([`DatapathError::InvalidArgument`], as
    /// `accept` and `connect` refuse it).
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), DatapathError> {
        // Checked before the request is spent: refused, the drop rejects it bare.
        self.check_private_data(private_data)?;
        self.take_inner()?.reject(private_data, &self.params)
    }

    /// Private data the answer (Reply) can carry: at most 512 octets with MPA (508 with RFC
    /// 6581's block, when the Request had one), none with IFT framing.
    fn check_private_data(&self, private_data: &[u8]) -> Result<(), DatapathError> {
        match &self.info {
            Some(request) => {
                mpa::check_private_data_to_send(private_data, request.enhanced.is_some())?;
            }
            None if !private_data.is_empty() => {
                return Err(DatapathError::InvalidArgument(
                    "IFT framing carries no private data",
                ));
            }
            None => {}
        }
        Ok(())
    }
}

/// A request dropped unanswered is rejected (R=1, no private data), so that its initiator
/// hears of it at once and the connection does not linger until the accept timeout (as
/// `rdma_destroy_id` of an id with a connect request: iw_cm rejects it).
impl Drop for ConnectRequest {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            inner.abandon(&self.params);
        }
    }
}
