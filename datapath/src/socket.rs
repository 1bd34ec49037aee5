//! The socket transport: MPA/DDP/RDMAP over a kernel TCP socket.
//!
//! Connection setup (TCP connect or accept, then the MPA Request/Reply exchange of RFC 5044 7.1
//! and RFC 6581) runs on the caller's thread with a deadline. Once in Full Operation, one engine
//! thread per connection owns the non-blocking socket (`mio`), the MPA encoder/decoder and the
//! sans-IO [`rdmap::QueuePair`]; the application talks to it through a lock-free command channel
//! and the completion queue.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use mio::{Events, Interest, Poll, Token, Waker};
use mpa::{FpduDecoder, FpduEncoder, InitiatorEvent, MpaConfig, Negotiated, RequestInfo};
use rdmap::{QpConfig, QpState, RecvWr, SendOp, SendWr, TerminateCause, TerminateInfo};
use rdmap::{WcOpcode, WcStatus, WorkCompletion};

use crate::cq::{Completion, CompletionQueue, CqSink};
use crate::memory::{lock_table, ProtectionDomain, SharedTable};
use crate::{DatapathError, QpError};

/// Parameters of a connection: MPA negotiation and queue sizes.
#[derive(Debug, Clone)]
pub struct ConnectParams {
    /// What we ask for in MPA (revision, CRC, markers, IRD/ORD, RTR, private-data cap).
    pub mpa: MpaConfig,
    /// Send queue depth (outstanding send/write/read work requests).
    pub sq_depth: usize,
    /// Receive queue depth (posted receive work requests).
    pub rq_depth: usize,
    /// Deadline for TCP connect plus the MPA exchange.
    pub setup_timeout: Duration,
}

impl Default for ConnectParams {
    fn default() -> Self {
        Self {
            mpa: MpaConfig::default(),
            sq_depth: 4096,
            rq_depth: 4096,
            setup_timeout: Duration::from_secs(10),
        }
    }
}

/// What the application can see of a queue pair's state while its engine runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpStatus {
    /// RDMAP queue-pair state.
    pub state: QpState,
    /// The Terminate the peer sent us, if any.
    pub remote_terminate: Option<TerminateInfo>,
    /// What ended the connection, if anything has: the first cause seen (an MPA error, a
    /// Terminate we sent or received, the peer's close or reset, a timeout, a transport
    /// failure).
    pub error: Option<QpError>,
    /// The Terminate we sent (or queued), if any.
    pub sent_terminate: Option<TerminateInfo>,
    /// The engine thread has stopped and the socket is closed.
    pub finished: bool,
}

/// A command from the application's [`QueuePair`] handle to the engine that runs it.
pub(crate) enum Cmd {
    Send(SendWr),
    Recv(RecvWr),
    Close,
}

/// State the engine publishes for the application.
pub(crate) struct Shared {
    pub(crate) status: Mutex<QpStatus>,
}

impl Shared {
    pub(crate) fn new(state: QpState) -> Arc<Shared> {
        Arc::new(Shared {
            status: Mutex::new(QpStatus {
                state,
                remote_terminate: None,
                error: None,
                sent_terminate: None,
                finished: false,
            }),
        })
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, QpStatus> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what ended the connection, unless a cause is known already.
    pub(crate) fn set_error(&self, error: QpError) {
        let mut st = self.lock();
        if st.error.is_none() {
            st.error = Some(error);
        }
    }

    /// Publishes the queue pair's state and Terminates; a Terminate is the cause if none is
    /// known yet.
    pub(crate) fn publish(
        &self,
        state: QpState,
        remote: Option<TerminateInfo>,
        sent: Option<TerminateInfo>,
    ) -> std::sync::MutexGuard<'_, QpStatus> {
        let mut st = self.lock();
        st.state = state;
        st.remote_terminate = remote;
        st.sent_terminate = sent;
        if st.error.is_none() {
            st.error = remote
                .map(QpError::RemoteTerminate)
                .or(sent.map(QpError::LocalTerminate));
        }
        st
    }
}

/// How a queue pair handle wakes the engine that runs it.
pub(crate) enum Notifier {
    /// The socket transport: one `mio` poll per connection thread.
    Mio(Arc<Waker>),
    /// The AF_XDP engine: one thread for all connections of an interface.
    Xdp(Arc<crate::engine::xdp::Wake>),
}

impl Notifier {
    fn wake(&self) -> io::Result<()> {
        match self {
            Notifier::Mio(w) => w.wake(),
            Notifier::Xdp(w) => w.wake(),
        }
    }
}

pub(crate) static NEXT_QP: AtomicU32 = AtomicU32::new(1);

/// A connected queue pair (RFC 5040 2: one RDMAP stream over one MPA/TCP connection).
///
/// Work requests are handed to the engine thread without blocking; their results arrive on the
/// completion queue given at connect/accept time. Dropping the queue pair closes the connection.
pub struct QueuePair {
    num: u32,
    cmds: Sender<Cmd>,
    waker: Notifier,
    shared: Arc<Shared>,
    negotiated: Negotiated,
    mulpdu: usize,
    peer: SocketAddr,
    /// The socket transport's per-connection thread (the AF_XDP engine's thread is shared).
    thread: Option<JoinHandle<()>>,
}

/// What an engine hands over to build the application's [`QueuePair`] handle.
pub(crate) struct QpParts {
    pub(crate) num: u32,
    pub(crate) cmds: Sender<Cmd>,
    pub(crate) waker: Notifier,
    pub(crate) shared: Arc<Shared>,
    pub(crate) negotiated: Negotiated,
    pub(crate) mulpdu: usize,
    pub(crate) peer: SocketAddr,
}

/// How long [`QueuePair::disconnect`] waits for the AF_XDP engine to close the connection.
const XDP_DISCONNECT_WAIT: Duration = Duration::from_secs(10);

impl QueuePair {
    pub(crate) fn from_parts(p: QpParts) -> QueuePair {
        QueuePair {
            num: p.num,
            cmds: p.cmds,
            waker: p.waker,
            shared: p.shared,
            negotiated: p.negotiated,
            mulpdu: p.mulpdu,
            peer: p.peer,
            thread: None,
        }
    }

    /// Local queue pair number (also in every [`Completion`]).
    pub fn num(&self) -> u32 {
        self.num
    }

    /// The MPA parameters both sides agreed on.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// Largest ULPDU (DDP segment) this connection sends, from the TCP MSS (RFC 5044 4.5).
    pub fn mulpdu(&self) -> usize {
        self.mulpdu
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    fn command(&self, cmd: Cmd) -> Result<(), DatapathError> {
        self.cmds
            .send(cmd)
            .map_err(|_| DatapathError::Disconnected)?;
        self.waker.wake().map_err(DatapathError::Io)
    }

    /// Posts a Send, RDMA Write or RDMA Read (RFC 5040 5). Local errors (bad local STag,
    /// full send queue, queue pair not ready) come back as an error completion.
    pub fn post_send(&self, wr: SendWr) -> Result<(), DatapathError> {
        self.command(Cmd::Send(wr))
    }

    /// Posts a receive buffer for incoming Sends.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), DatapathError> {
        self.command(Cmd::Recv(wr))
    }

    /// A snapshot of the queue pair's state.
    pub fn status(&self) -> QpStatus {
        self.shared
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until the engine has stopped or `timeout` passes; true when it stopped.
    pub fn wait_finished(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.status().finished {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Closes the connection: outstanding work requests complete as flushed, the socket is
    /// shut down, and the engine thread is joined.
    pub fn disconnect(&mut self) {
        let _ = self.command(Cmd::Close);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        } else if matches!(self.waker, Notifier::Xdp(_)) {
            // The AF_XDP engine's thread serves other connections too: wait (bounded) for it to
            // report this one closed instead of joining it.
            self.wait_finished(XDP_DISCONNECT_WAIT);
        }
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.disconnect();
    }
}

/// An established connection: the queue pair and the private data the peer sent.
pub struct Connection {
    /// The connected queue pair.
    pub qp: QueuePair,
    /// Private data from the peer's MPA Request (at the responder) or Reply (at the initiator).
    pub private_data: Vec<u8>,
}

/// Connects to an MPA responder (the rdma_cm `connect` step) and starts the queue pair.
pub fn connect(
    addr: SocketAddr,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    params: &ConnectParams,
    private_data: &[u8],
) -> Result<Connection, DatapathError> {
    let start = Instant::now();
    // Check the configuration and private data before opening a connection the responder
    // would only see fail.
    let mut initiator = mpa::Initiator::new(params.mpa.clone(), private_data, start)?;
    let mut stream = TcpStream::connect_timeout(&addr, params.setup_timeout)?;
    stream.set_nodelay(true)?;
    stream.write_all(initiator.request())?;
    let mut buf = vec![0u8; 4096];
    loop {
        let n = read_with_deadline(&mut stream, &mut buf, start + params.setup_timeout)
            .map_err(|e| setup_error(e, "waiting for the MPA Reply"))?;
        let now = Instant::now();
        let (used, event) = initiator.feed(&buf[..n], now)?;
        match event {
            InitiatorEvent::NeedMore => continue,
            InitiatorEvent::Rejected { private_data } => {
                let _ = stream.shutdown(Shutdown::Both);
                return Err(DatapathError::Rejected { private_data });
            }
            InitiatorEvent::Accepted {
                negotiated,
                private_data,
            } => {
                let setup = Setup {
                    negotiated,
                    leftover: buf[used..n].to_vec(),
                    initiator: true,
                    recvs: Vec::new(),
                };
                let qp = start_engine(stream, setup, pd, cq, params)?;
                return Ok(Connection { qp, private_data });
            }
        }
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

fn setup_error(e: io::Error, during: &'static str) -> DatapathError {
    if e.kind() == io::ErrorKind::TimedOut {
        DatapathError::Timeout(during)
    } else {
        DatapathError::Io(e)
    }
}

/// A listener that accepts MPA connections (the rdma_cm `listen` step): a kernel TCP listening
/// socket ([`Listener::bind`]), or a port of the AF_XDP engine
/// ([`crate::engine::xdp::XdpEngine::listen`]).
pub struct Listener {
    inner: ListenerInner,
    params: ConnectParams,
}

enum ListenerInner {
    Socket(TcpListener),
    Xdp(crate::engine::xdp::XdpListen),
}

impl Listener {
    /// Binds and listens on `addr` (socket transport).
    pub fn bind(addr: SocketAddr, params: ConnectParams) -> Result<Self, DatapathError> {
        let inner = TcpListener::bind(addr)?;
        Ok(Self {
            inner: ListenerInner::Socket(inner),
            params,
        })
    }

    pub(crate) fn from_xdp(listen: crate::engine::xdp::XdpListen, params: ConnectParams) -> Self {
        Self {
            inner: ListenerInner::Xdp(listen),
            params,
        }
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, DatapathError> {
        match &self.inner {
            ListenerInner::Socket(l) => Ok(l.local_addr()?),
            ListenerInner::Xdp(l) => Ok(l.local_addr()),
        }
    }

    /// Waits for the next connection and its MPA Request. A peer that sends a malformed
    /// Request or none in time is dropped and reported as an error; call again to go on.
    pub fn accept(&self) -> Result<ConnectRequest, DatapathError> {
        match &self.inner {
            ListenerInner::Socket(l) => {
                l.set_nonblocking(false)?;
                let (stream, peer) = l.accept()?;
                self.read_request(stream, peer)
            }
            ListenerInner::Xdp(l) => l.accept(None)?.ok_or(DatapathError::Disconnected),
        }
    }

    /// Like [`accept`](Self::accept) but gives up (returning `Ok(None)`) when no TCP
    /// connection arrives within `timeout`.
    pub fn accept_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<ConnectRequest>, DatapathError> {
        let l = match &self.inner {
            ListenerInner::Socket(l) => l,
            ListenerInner::Xdp(l) => return l.accept(Some(timeout)),
        };
        let deadline = Instant::now() + timeout;
        l.set_nonblocking(true)?;
        loop {
            match l.accept() {
                Ok((stream, peer)) => {
                    stream.set_nonblocking(false)?;
                    return self.read_request(stream, peer).map(Some);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn read_request(
        &self,
        mut stream: TcpStream,
        peer: SocketAddr,
    ) -> Result<ConnectRequest, DatapathError> {
        let start = Instant::now();
        stream.set_nodelay(true)?;
        let mut responder = mpa::Responder::new(self.params.mpa.clone(), start)?;
        let mut buf = vec![0u8; 4096];
        loop {
            let n = read_with_deadline(&mut stream, &mut buf, start + self.params.setup_timeout)
                .map_err(|e| setup_error(e, "waiting for the MPA Request"))?;
            let (used, info) = match responder.feed(&buf[..n], Instant::now()) {
                Ok(r) => r,
                Err(e) => {
                    // RFC 5044 7.1.2: a malformed Request closes the connection.
                    let _ = stream.shutdown(Shutdown::Both);
                    return Err(e.into());
                }
            };
            if let Some(info) = info {
                return Ok(ConnectRequest {
                    inner: RequestInner::Socket {
                        stream,
                        responder,
                        leftover: buf[used..n].to_vec(),
                    },
                    info,
                    peer,
                    params: self.params.clone(),
                });
            }
        }
    }
}

/// A connection request that has sent a valid MPA Request; accept or reject it.
pub struct ConnectRequest {
    inner: RequestInner,
    info: RequestInfo,
    peer: SocketAddr,
    params: ConnectParams,
}

enum RequestInner {
    Socket {
        stream: TcpStream,
        responder: mpa::Responder,
        leftover: Vec<u8>,
    },
    Xdp(crate::engine::xdp::PendingRequest),
}

impl ConnectRequest {
    pub(crate) fn from_xdp(
        pending: crate::engine::xdp::PendingRequest,
        info: RequestInfo,
        peer: SocketAddr,
        params: ConnectParams,
    ) -> Self {
        Self {
            inner: RequestInner::Xdp(pending),
            info,
            peer,
            params,
        }
    }

    /// The private data of the Request (without the RFC 6581 IRD/ORD block).
    pub fn private_data(&self) -> &[u8] {
        &self.info.private_data
    }

    /// Everything the Request said.
    pub fn info(&self) -> &RequestInfo {
        &self.info
    }

    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
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
    /// (RFC 5041 7.1, MSN with no buffer).
    pub fn accept_with_recvs(
        self,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        private_data: &[u8],
        recvs: Vec<RecvWr>,
    ) -> Result<Connection, DatapathError> {
        let ConnectRequest {
            inner,
            info,
            params,
            ..
        } = self;
        match inner {
            RequestInner::Socket {
                mut stream,
                mut responder,
                leftover,
            } => {
                let (reply, negotiated) = responder.accept(private_data)?;
                stream.write_all(&reply)?;
                let qp = start_engine(
                    stream,
                    Setup {
                        negotiated,
                        leftover,
                        initiator: false,
                        recvs,
                    },
                    pd,
                    cq,
                    &params,
                )?;
                Ok(Connection {
                    qp,
                    private_data: info.private_data,
                })
            }
            RequestInner::Xdp(pending) => {
                let qp = pending.accept(pd, cq, private_data, recvs, &params)?;
                Ok(Connection {
                    qp,
                    private_data: info.private_data,
                })
            }
        }
    }

    /// Rejects with private data (MPA Reply with R=1), then closes the connection.
    pub fn reject(self, private_data: &[u8]) -> Result<(), DatapathError> {
        match self.inner {
            RequestInner::Socket {
                mut stream,
                mut responder,
                ..
            } => {
                let reply = responder.reject(private_data)?;
                stream.write_all(&reply)?;
                let _ = stream.shutdown(Shutdown::Write);
                Ok(())
            }
            RequestInner::Xdp(pending) => pending.reject(private_data, &self.params),
        }
    }
}

/// What connection setup hands to the engine.
struct Setup {
    negotiated: Negotiated,
    /// Bytes read after the MPA Request/Reply (the start of the FPDU stream).
    leftover: Vec<u8>,
    initiator: bool,
    /// Receive work requests to post before any byte is processed.
    recvs: Vec<RecvWr>,
}

fn start_engine(
    stream: TcpStream,
    setup: Setup,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    params: &ConnectParams,
) -> Result<QueuePair, DatapathError> {
    let Setup {
        negotiated,
        leftover,
        initiator,
        recvs,
    } = setup;
    let mss = socket2::SockRef::from(&stream).mss().unwrap_or(536) as usize;
    let mulpdu = mpa::mulpdu(mss, negotiated.markers_tx).min(usize::from(u16::MAX));
    let peer = stream.peer_addr()?;
    stream.set_read_timeout(None)?;
    stream.set_nonblocking(true)?;
    let mut stream = mio::net::TcpStream::from_std(stream);
    let poll = Poll::new()?;
    poll.registry()
        .register(&mut stream, SOCKET, Interest::READABLE | Interest::WRITABLE)?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
    let num = NEXT_QP.fetch_add(1, Ordering::Relaxed);

    let mut qp = rdmap::QueuePair::new(QpConfig {
        pd: pd.id,
        sq_depth: params.sq_depth,
        rq_depth: params.rq_depth,
        ird: negotiated.ird,
        ord: negotiated.ord,
    });
    if !initiator {
        if let Some(kind) = negotiated.rtr {
            qp.expect_rtr(rtr_kind(kind))
                .map_err(|_| DatapathError::InvalidArgument("cannot prepare for the RTR"))?;
        }
    }
    qp.enter_rts(negotiated.ird, negotiated.ord);
    {
        let table = lock_table(&pd.table);
        for wr in recvs {
            qp.post_recv(wr, &table)
                .map_err(|_| DatapathError::InvalidArgument("receive work request refused"))?;
        }
    }
    if initiator {
        if let Some(kind) = negotiated.rtr {
            // RFC 6581 3: the initiator's RTR is its first FPDU.
            qp.send_rtr(rtr_kind(kind));
        }
    }
    let shared = Shared::new(qp.state());
    let engine = Engine {
        stream,
        poll,
        cmds: cmd_rx,
        encoder: FpduEncoder::new(negotiated.crc, negotiated.markers_tx),
        decoder: FpduDecoder::new(negotiated.crc, negotiated.markers_rx),
        may_send: initiator || !negotiated.responder_waits_for_fpdu,
        qp,
        table: pd.table.clone(),
        cq: cq.sink(),
        num,
        shared: shared.clone(),
        tx: Vec::with_capacity(TX_HIGH + 70_000),
        tx_off: 0,
        ulpdu: Vec::with_capacity(70_000),
        rx: vec![0u8; 256 * 1024],
        mulpdu,
        closing: false,
        rx_closed: false,
        tx_failed: false,
        last_state: None,
    };
    let thread = std::thread::Builder::new()
        .name(format!("iwarp-qp{num}"))
        .spawn(move || engine.run(leftover))?;
    Ok(QueuePair {
        num,
        cmds: cmd_tx,
        waker: Notifier::Mio(waker),
        shared,
        negotiated,
        mulpdu,
        peer,
        thread: Some(thread),
    })
}

fn rtr_kind(kind: mpa::RtrKind) -> rdmap::RtrKind {
    match kind {
        mpa::RtrKind::Send => rdmap::RtrKind::Send,
        mpa::RtrKind::Write => rdmap::RtrKind::Write,
        mpa::RtrKind::Read => rdmap::RtrKind::Read,
    }
}

const SOCKET: Token = Token(0);
const WAKE: Token = Token(1);
/// Encoded bytes kept ready for the socket before asking the queue pair for more.
const TX_HIGH: usize = 512 * 1024;
/// Read calls per loop turn, so a busy receive side cannot starve commands and transmit.
const RX_BUDGET: usize = 16;

struct Engine {
    stream: mio::net::TcpStream,
    poll: Poll,
    cmds: Receiver<Cmd>,
    qp: rdmap::QueuePair,
    table: SharedTable,
    encoder: FpduEncoder,
    decoder: FpduDecoder,
    /// RFC 5044 7.1.2: the Responder sends nothing before it has received a valid FPDU.
    may_send: bool,
    cq: CqSink,
    num: u32,
    shared: Arc<Shared>,
    tx: Vec<u8>,
    tx_off: usize,
    ulpdu: Vec<u8>,
    rx: Vec<u8>,
    mulpdu: usize,
    closing: bool,
    rx_closed: bool,
    tx_failed: bool,
    last_state: Option<QpState>,
}

impl Engine {
    fn run(mut self, leftover: Vec<u8>) {
        if !leftover.is_empty() {
            self.process_rx(&leftover);
        }
        let mut events = Events::with_capacity(16);
        loop {
            let mut progress = self.handle_commands();
            progress |= self.receive();
            progress |= self.transmit();
            progress |= self.deliver_completions();
            self.publish_status();
            if self.finished() {
                break;
            }
            if !progress {
                let _ = self.poll.poll(&mut events, Some(Duration::from_millis(50)));
            }
        }
        let _ = self.stream.flush();
        let _ = self.stream.shutdown(Shutdown::Both);
        self.deliver_completions();
        let mut st = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        st.state = self.qp.state();
        st.finished = true;
    }

    fn set_error(&self, error: QpError) {
        self.shared.set_error(error);
    }

    fn handle_commands(&mut self) -> bool {
        let mut progress = false;
        loop {
            let cmd = match self.cmds.try_recv() {
                Ok(c) => c,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => Cmd::Close,
            };
            progress = true;
            match cmd {
                Cmd::Send(wr) => {
                    let (wr_id, opcode) = (wr.wr_id, wc_opcode(&wr.op));
                    let res = {
                        let table = lock_table(&self.table);
                        self.qp.post_send(wr, &table)
                    };
                    if let Err(e) = res {
                        self.complete_local_error(wr_id, opcode, &e);
                    }
                }
                Cmd::Recv(wr) => {
                    let wr_id = wr.wr_id;
                    let res = {
                        let table = lock_table(&self.table);
                        self.qp.post_recv(wr, &table)
                    };
                    if let Err(e) = res {
                        self.complete_local_error(wr_id, WcOpcode::Recv, &e);
                    }
                }
                Cmd::Close => {
                    if !self.closing {
                        self.closing = true;
                        self.qp.close();
                    }
                    break;
                }
            }
        }
        progress
    }

    fn complete_local_error(&self, wr_id: u64, opcode: WcOpcode, e: &rdmap::RdmapError) {
        self.cq.push(Completion {
            qp_num: self.num,
            wc: WorkCompletion {
                wr_id,
                opcode,
                status: local_status(e),
                byte_len: 0,
                invalidated: None,
                solicited: false,
            },
        });
    }

    fn receive(&mut self) -> bool {
        if self.rx_closed {
            return false;
        }
        let mut progress = false;
        let mut rx = std::mem::take(&mut self.rx);
        for _ in 0..RX_BUDGET {
            match self.stream.read(&mut rx) {
                Ok(0) => {
                    self.rx_closed = true;
                    if !self.closing && self.qp.state() != QpState::Error {
                        self.set_error(QpError::PeerClosed);
                    }
                    self.qp.on_transport_error(TerminateCause::ConnectionLost);
                    progress = true;
                    break;
                }
                Ok(n) => {
                    progress = true;
                    self.process_rx(&rx[..n]);
                    if self.rx_closed {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.rx_closed = true;
                    self.set_error(QpError::from_io(&e));
                    self.qp.on_transport_error(TerminateCause::ConnectionLost);
                    progress = true;
                    break;
                }
            }
        }
        self.rx = rx;
        progress
    }

    /// Feeds received bytes through MPA into the queue pair (placement happens here).
    fn process_rx(&mut self, bytes: &[u8]) {
        let mut table = lock_table(&self.table);
        let qp = &mut self.qp;
        let mut got_fpdu = false;
        let mut first_error = None;
        let res = self.decoder.feed(bytes, |ulpdu| {
            got_fpdu = true;
            if let Err(e) = qp.on_ulpdu(ulpdu, &mut table) {
                first_error.get_or_insert(e);
            }
        });
        drop(table);
        if got_fpdu {
            self.may_send = true;
        }
        if first_error.is_some() {
            // The queue pair queued its Terminate: the cause is that Terminate.
            if let Some(t) = self.qp.local_terminate() {
                self.set_error(QpError::LocalTerminate(t));
            }
        }
        if let Err(e) = res {
            // RFC 5044 8: deliver nothing more; RFC 5040 7.1: report it with a Terminate
            // (layer MPA). The connection, not the process, ends.
            self.set_error(QpError::Mpa(e.clone()));
            let cause = if self.may_send {
                TerminateCause::Llp { code: e.code() }
            } else {
                // A Responder that has not yet received a valid FPDU may send nothing, not
                // even a Terminate (RFC 5044 7.1.2 rule 4): the connection just closes.
                TerminateCause::ConnectionLost
            };
            self.qp.on_transport_error(cause);
            self.rx_closed = true;
        }
    }

    fn transmit(&mut self) -> bool {
        let mut progress = false;
        if self.may_send && !self.tx_failed && self.tx.len() - self.tx_off < TX_HIGH {
            let table = lock_table(&self.table);
            while self.tx.len() - self.tx_off < TX_HIGH {
                self.ulpdu.clear();
                if self
                    .qp
                    .poll_transmit(self.mulpdu, &table, &mut self.ulpdu)
                    .is_none()
                {
                    break;
                }
                progress = true;
                if self.encoder.encode(&self.ulpdu, &mut self.tx).is_err() {
                    // Only a ULPDU above MPA's 65535-octet limit fails here: a local bug.
                    self.set_error(QpError::Local("a ULPDU too long for MPA"));
                    self.qp
                        .on_transport_error(TerminateCause::LocalCatastrophic);
                    break;
                }
            }
        }
        while self.tx_off < self.tx.len() && !self.tx_failed {
            match self.stream.write(&self.tx[self.tx_off..]) {
                Ok(0) => break,
                Ok(n) => {
                    self.tx_off += n;
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.tx_failed = true;
                    self.set_error(QpError::from_io(&e));
                    self.qp.on_transport_error(TerminateCause::ConnectionLost);
                    progress = true;
                }
            }
        }
        if self.tx_off == self.tx.len() {
            self.tx.clear();
            self.tx_off = 0;
        } else if self.tx_off > TX_HIGH {
            self.tx.drain(..self.tx_off);
            self.tx_off = 0;
        }
        progress
    }

    fn deliver_completions(&mut self) -> bool {
        let mut progress = false;
        while let Some(wc) = self.qp.poll_completion() {
            progress = true;
            self.cq.push(Completion {
                qp_num: self.num,
                wc,
            });
        }
        progress
    }

    fn publish_status(&mut self) {
        let state = self.qp.state();
        if self.last_state == Some(state) {
            return;
        }
        self.last_state = Some(state);
        drop(
            self.shared
                .publish(state, self.qp.remote_terminate(), self.qp.local_terminate()),
        );
    }

    fn tx_idle(&self) -> bool {
        self.tx_off == self.tx.len() && (!self.may_send || !self.qp.has_pending_transmit())
    }

    fn finished(&self) -> bool {
        let state = self.qp.state();
        if self.tx_failed {
            return true;
        }
        let dead = state == QpState::Error || self.closing;
        dead && self.tx_idle()
    }
}

/// Completion status of a work request the queue pair refused when it was posted.
pub(crate) fn local_status(e: &rdmap::RdmapError) -> WcStatus {
    use rdmap::RdmapError as E;
    match e {
        E::LocalAccess { .. } | E::UnknownStag { .. } => WcStatus::LocalProtectionError,
        _ => WcStatus::LocalQpOperationError,
    }
}

pub(crate) fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send { .. } => WcOpcode::Send,
        SendOp::Write { .. } => WcOpcode::Write,
        SendOp::Read { .. } => WcOpcode::Read,
    }
}
