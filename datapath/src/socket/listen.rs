//! The socket transport's listener: a thread of its own accepts kernel TCP connections and
//! reads their MPA Requests (RFC 5044 7.1.2), all at once and each with a deadline, so that a
//! slow or silent client never holds up the others; the application's
//! [`Listener::accept`](crate::Listener::accept) takes connections whose Request is complete.
//!
//! What a peer can make the listener hold is bounded, and every piece of it has a deadline:
//! - at most [`max_starting`] connections waiting for their Request, all the process's
//!   listeners together (1024, or a quarter of the process's descriptor limit if that is
//!   less: a flood of silent connections, at one listener or at several, must not take every
//!   descriptor the application has), each until `MpaConfig::timeout` (with IFT
//!   framing `IftConfig::timeout`) after its TCP connection was accepted (a 4 KiB read
//!   buffer is shared); beyond that, new connections are closed at once, and so are
//!   connections the kernel has ready while the process is out of descriptors (a spare one,
//!   kept for that, takes and closes them);
//! - at most `ConnectParams::backlog` connections whose Request waits for the application; a
//!   Request beyond them is rejected (Reply with R=1) and its connection closed;
//! - a Request the application leaves unanswered for `MpaConfig::accept_timeout` loses its
//!   connection: a later accept or reject fails with `MpaError::AcceptTimeout`. Once the
//!   listener is dropped (which ends its thread) a Request already handed out keeps that
//!   deadline: a thread of their own closes those still unanswered at it, and ends with the
//!   last.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use mpa::{MpaError, RequestInfo};

use super::engine::{start_engine, Setup};
use crate::log_rate::peer_line;
use crate::memory::ProtectionDomain;
use crate::verbs::cm::{
    recv_request, with_fresh_vtag, ConnectParams, ConnectRequest, Framing, ListenProvider,
    ListenRecord, Listener, PendingProvider,
};
use crate::verbs::cq::CompletionQueue;
use crate::verbs::qp::{Agreed, QpStart, QueuePair};
use crate::DatapathError;

/// The most connections the process's listeners keep waiting for their MPA Request at best;
/// more are closed as soon as the kernel hands them over.
const MAX_STARTING: usize = 1024;

/// The most connections the process's listeners keep waiting for their MPA Request, all
/// together ([`StartingPlace`]): [`MAX_STARTING`], or a quarter of the process's soft
/// descriptor limit (`RLIMIT_NOFILE`; 1024 by default on Debian) if that is less, but at
/// least 16; read once, when a listener first takes a connection, one limit for all. Each
/// holds a descriptor until its Request deadline: a flood of silent connections otherwise
/// takes the descriptors the application and its other connections need. One cap for all
/// listeners means a flood at one port also turns away the silent and slow connections of the
/// others (prompt clients, whose Request comes at once, hold a place only for a moment).
fn max_starting() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the limit into `limit`, a valid rlimit owned by this frame.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        if rc != 0 {
            return MAX_STARTING;
        }
        usize::try_from(limit.rlim_cur / 4)
            .unwrap_or(MAX_STARTING)
            .clamp(16, MAX_STARTING)
    })
}

/// Connections the process's socket listeners keep waiting for their Request, all together.
static STARTING: AtomicUsize = AtomicUsize::new(0);

/// One of the places of [`STARTING`], held by a connection while it waits for its Request
/// and given back when dropped: a flood at several listeners holds no more descriptors than
/// one at a single listener.
struct StartingPlace(());

impl StartingPlace {
    /// A place, if fewer than [`max_starting`] are held.
    fn take() -> Option<StartingPlace> {
        let max = max_starting();
        STARTING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| StartingPlace(()))
    }
}

impl Drop for StartingPlace {
    fn drop(&mut self) {
        STARTING.fetch_sub(1, Ordering::AcqRel);
    }
}

const LISTENER: Token = Token(0);
const WAKE: Token = Token(1);
/// Longest sleep of the listener thread (it also looks at its stop flag then).
const MAX_SLEEP: Duration = Duration::from_millis(500);
/// How soon the listener tries `accept` again after the kernel could not give it a
/// connection for want of resources (`ENOBUFS`, `ENOMEM`, descriptors with no spare left).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// Connections whose `accept` failed on their own account taken one after another before the
/// listener waits [`ACCEPT_RETRY`] (an error that does not take the connection off the queue
/// would otherwise be met again and again).
const ACCEPT_FAILURES_IN_A_ROW: u32 = 64;
/// Connections taken off the kernel's queue (kept or turned away) by one `accept_all`; the
/// rest are taken by the next (at once, at most twice a turn of the listener's loop), so that a
/// flood of connections neither keeps the listener from the Requests of those it holds nor
/// from seeing that it should stop.
const ACCEPTS_PER_TURN: u32 = 256;

impl Listener {
    /// Binds and listens on `addr` (socket transport): a thread of the listener reads the MPA
    /// Requests of new connections beside the application (see the module documentation).
    pub fn bind(addr: SocketAddr, params: ConnectParams) -> Result<Self, DatapathError> {
        params.check_listen()?;
        let record = Arc::new(ListenRecord::default());
        let listen = SocketListen::start(addr, &params, record.clone())?;
        Ok(Listener::from_provider(Box::new(listen), params, record))
    }
}

/// A connection's stream while its Request waits for the application: the listener thread
/// keeps a weak reference and takes the stream (closing the connection) at the accept
/// deadline.
type HeldStream = Arc<Mutex<Option<TcpStream>>>;

/// A connection whose valid Request came in, on its way to the application.
struct Arrived {
    stream: HeldStream,
    answer: Answer,
    /// The MPA Request (none with IFT).
    info: Option<RequestInfo>,
    peer: SocketAddr,
    /// Bytes read after the Request (the start of the FPDU stream).
    leftover: Vec<u8>,
}

/// How a connection's startup is read: an MPA Request, or an IFT phase 0 indication.
enum Startup {
    Mpa(mpa::Responder),
    Ift(ift::Responder),
}

impl Startup {
    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Startup::Mpa(r) => r.poll_timeout(),
            Startup::Ift(r) => r.poll_timeout(),
        }
    }
}

/// What answers a connection whose startup is complete: MPA's Responder builds the Reply on
/// accept or reject; IFT's phase 1 indication is ready (a reject just closes).
enum Answer {
    Mpa(mpa::Responder),
    Ift {
        negotiated: ift::Negotiated,
        reply: [u8; ift::wire::INDICATION_LEN],
        /// When the application must have accepted (`MpaConfig::accept_timeout` after the
        /// indication came in; `None`: no deadline, a timeout too large for the clock).
        deadline: Option<Instant>,
    },
}

impl Answer {
    /// When the connection is closed if the application has not answered.
    fn deadline(&self) -> Option<Instant> {
        match self {
            Answer::Mpa(r) => r.poll_timeout(),
            Answer::Ift { deadline, .. } => *deadline,
        }
    }

    /// Whether the accept deadline has passed (a connection past it only closes).
    fn expired(&self) -> bool {
        self.deadline().is_some_and(|d| d <= Instant::now())
    }
}

/// A kernel TCP listening socket and the thread that reads Requests for it.
struct SocketListen {
    local: SocketAddr,
    requests: Receiver<Arrived>,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    /// The listener's thread; it returns the Requests it handed out that may still wait for
    /// an answer.
    thread: Option<JoinHandle<VecDeque<Waiting>>>,
    record: Arc<ListenRecord>,
}

impl SocketListen {
    fn start(
        addr: SocketAddr,
        params: &ConnectParams,
        record: Arc<ListenRecord>,
    ) -> Result<SocketListen, DatapathError> {
        let listener = TcpListener::bind(addr)?;
        // Its SYN-ACKs and the connections it accepts (which inherit it) carry the TOS.
        super::sockopt::set_tos(&socket2::SockRef::from(&listener), addr, params.tos)?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        let poll = Poll::new()?;
        poll.registry().register(
            &mut SourceFd(&listener.as_raw_fd()),
            LISTENER,
            Interest::READABLE,
        )?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let (tx, requests) = crossbeam_channel::bounded(params.backlog.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = Startups {
            listener,
            poll,
            mpa: params.mpa.clone(),
            framing: params.framing.clone(),
            starting: HashMap::new(),
            spare: std::fs::File::open("/dev/null").ok(),
            accept_retry: None,
            accept_failing: false,
            next_token: WAKE.0 + 1,
            waiting: VecDeque::new(),
            requests: tx,
            stop: stop.clone(),
            record: record.clone(),
            buf: vec![0; 4096],
        };
        tracing::info!(%local, "listening (kernel TCP)");
        let thread = std::thread::Builder::new()
            .name(format!("iwarp-listen{}", local.port()))
            .spawn(move || thread.run())?;
        Ok(SocketListen {
            local,
            requests,
            stop,
            waker,
            thread: Some(thread),
            record,
        })
    }
}

impl Drop for SocketListen {
    /// Stops the listener's thread; Requests no accept took are rejected (Reply with R=1), as
    /// a dropped [`ConnectRequest`] is, not closed bare. Those taken and not answered yet
    /// keep their accept deadline ([`close_unanswered_later`]).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
        let waiting = self.thread.take().and_then(|thread| thread.join().ok());
        while let Ok(arrived) = self.requests.try_recv() {
            let pending = SocketPending {
                stream: arrived.stream,
                answer: arrived.answer,
                leftover: arrived.leftover,
            };
            Box::new(pending).abandon(&ConnectParams::default());
        }
        // After those: their connections are gone, so only requests the application holds
        // are left to watch.
        if let Some(waiting) = waiting {
            close_unanswered_later(waiting, self.record.clone());
        }
    }
}

impl ListenProvider for SocketListen {
    fn local_addr(&self) -> Result<SocketAddr, DatapathError> {
        Ok(self.local)
    }

    fn accept(
        &self,
        params: &ConnectParams,
        timeout: Option<Duration>,
    ) -> Result<Option<ConnectRequest>, DatapathError> {
        let Some(arrived) = recv_request(&self.requests, timeout)? else {
            return Ok(None);
        };
        let Arrived {
            stream,
            answer,
            info,
            peer,
            leftover,
        } = arrived;
        // The accepted socket's own address (a specific one under a wildcard listener); the
        // listener's should the kernel not say.
        let known = stream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|s| s.local_addr().ok());
        let local = match known {
            Some(a) => a,
            None => self.local_addr()?,
        };
        let pending = SocketPending {
            stream,
            answer,
            leftover,
        };
        Ok(Some(ConnectRequest::new(
            Box::new(pending),
            info,
            peer,
            local,
            params.clone(),
        )))
    }
}

/// A connection waiting for its Request.
struct Starting {
    stream: TcpStream,
    peer: SocketAddr,
    startup: Startup,
    /// Its place among the process's waiting connections.
    _place: StartingPlace,
}

/// A Request handed to the application, and when its connection is closed if unanswered.
struct Waiting {
    deadline: Instant,
    stream: Weak<Mutex<Option<TcpStream>>>,
    /// An IFT connection (its timeout is counted as IFT's).
    ift: bool,
}

/// The listener thread's state.
struct Startups {
    listener: TcpListener,
    poll: Poll,
    mpa: mpa::MpaConfig,
    framing: Framing,
    starting: HashMap<Token, Starting>,
    /// A descriptor kept in reserve: out of descriptors (`EMFILE`), the listener gives it
    /// up to take the next ready connection and close it, rather than leave the kernel's
    /// queue full and unread (its readiness is edge-triggered).
    spare: Option<std::fs::File>,
    /// When to try `accept` again: it failed for want of resources with connections still
    /// queued, and the listener's readiness, edge-triggered, will not say so again until
    /// the next one arrives.
    accept_retry: Option<Instant>,
    /// `accept` failed for want of resources and has not worked since (said once in the log).
    accept_failing: bool,
    next_token: usize,
    /// In arrival order, which is deadline order (one accept timeout for all).
    waiting: VecDeque<Waiting>,
    requests: Sender<Arrived>,
    stop: Arc<AtomicBool>,
    record: Arc<ListenRecord>,
    buf: Vec<u8>,
}

impl Startups {
    /// Runs until stopped; returns the Requests handed out that may still wait for an answer.
    fn run(mut self) -> VecDeque<Waiting> {
        self.run_until_stopped();
        std::mem::take(&mut self.waiting)
    }

    fn run_until_stopped(&mut self) {
        let mut events = Events::with_capacity(64);
        while !self.stop.load(Ordering::Acquire) {
            let timeout = self.next_deadline().map_or(MAX_SLEEP, |d| {
                d.saturating_duration_since(Instant::now()).min(MAX_SLEEP)
            });
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // Nothing else can fail here; if it does, accept reports the listener gone.
                return;
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept_all(),
                    WAKE => {}
                    token => {
                        // A panic (a bug reached by one peer's bytes) closes that connection,
                        // taken out of `starting` first, not the listener.
                        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            self.read_request(token)
                        }));
                        match read {
                            Ok(true) => {}
                            Ok(false) => return,
                            Err(cause) => {
                                tracing::error!(
                                    panic = crate::error::panic_text(&*cause),
                                    "a connection's MPA startup panicked: connection closed, \
                                     the listener goes on"
                                );
                                self.record.startup_panicked();
                            }
                        }
                    }
                }
            }
            let now = Instant::now();
            if self.accept_retry.is_some_and(|at| at <= now) {
                self.accept_retry = None;
                self.accept_all();
            }
            self.expire(now);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let starting = self
            .starting
            .values()
            .filter_map(|s| s.startup.poll_timeout())
            .min();
        let waiting = self.waiting.front().map(|w| w.deadline);
        starting
            .into_iter()
            .chain(waiting)
            .chain(self.accept_retry)
            .min()
    }

    /// Takes every connection the kernel has ready.
    fn accept_all(&mut self) {
        // Errors of single connections in a row: past a bound, whatever the errno says, the
        // queue waits a little rather than be spun on.
        let mut failed_in_a_row = 0;
        let mut accepted = 0;
        loop {
            if accepted == ACCEPTS_PER_TURN {
                // The rest by the next call, at once: the readiness edge is spent, so it is
                // asked for.
                self.accept_retry = Some(Instant::now());
                return;
            }
            let (stream, peer) = match self.listener.accept() {
                Ok(c) => {
                    self.accept_failing = false;
                    failed_in_a_row = 0;
                    accepted += 1;
                    c
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    // Out of descriptors: the spare one takes the next connection, which is
                    // closed (the peer sees a reset), and comes back. Without a spare, the
                    // queue waits a little.
                    if self.spare.take().is_none() {
                        self.retry_accept_soon(&e);
                        return;
                    }
                    let taken = self.listener.accept();
                    drop(taken);
                    self.spare = std::fs::File::open("/dev/null").ok();
                    self.record.over_descriptors();
                    accepted += 1;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.accept_failing = false;
                    return;
                }
                // That one connection failed (reset while queued, a protocol error, or one of
                // the network errors Linux passes on from the new socket, accept(2)): the
                // next may not.
                Err(e)
                    if failed_in_a_row < ACCEPT_FAILURES_IN_A_ROW
                        && matches!(
                            e.raw_os_error(),
                            Some(
                                libc::ECONNABORTED
                                    | libc::EPROTO
                                    | libc::ENETDOWN
                                    | libc::ENOPROTOOPT
                                    | libc::EHOSTDOWN
                                    | libc::ENONET
                                    | libc::EHOSTUNREACH
                                    | libc::EOPNOTSUPP
                                    | libc::ENETUNREACH
                            )
                        ) =>
                {
                    failed_in_a_row += 1;
                    continue;
                }
                // The kernel is short of memory (`ENOBUFS`, `ENOMEM`), a security module
                // refuses (`EPERM`, before the connection leaves the queue), or something
                // else passing: the connections queued wait a little, not for the next
                // arrival.
                Err(e) => {
                    self.retry_accept_soon(&e);
                    return;
                }
            };
            let Some(place) = StartingPlace::take() else {
                self.record.over_starting();
                continue; // dropped: closed
            };
            let startup = match &self.framing {
                Framing::Mpa => match mpa::Responder::new(self.mpa.clone(), Instant::now()) {
                    Ok(r) => Startup::Mpa(r),
                    Err(_) => continue,
                },
                // The exchange's own deadline (`IftConfig::timeout`), as on the engine.
                Framing::Ift(cfg) => {
                    Startup::Ift(ift::Responder::new(with_fresh_vtag(cfg), Instant::now()))
                }
            };
            let token = Token(self.next_token);
            self.next_token = self.next_token.wrapping_add(1).max(WAKE.0 + 1);
            let ready = stream.set_nonblocking(true).is_ok()
                && stream.set_nodelay(true).is_ok()
                && self
                    .poll
                    .registry()
                    .register(
                        &mut SourceFd(&stream.as_raw_fd()),
                        token,
                        Interest::READABLE,
                    )
                    .is_ok();
            if ready {
                self.starting.insert(
                    token,
                    Starting {
                        stream,
                        peer,
                        startup,
                        _place: place,
                    },
                );
            }
        }
    }

    /// `accept` failed with `e` for want of resources: try again in [`ACCEPT_RETRY`].
    fn retry_accept_soon(&mut self, e: &io::Error) {
        if !self.accept_failing {
            self.accept_failing = true;
            tracing::warn!(error = %e, "accept failed (kernel TCP); trying again shortly");
        }
        self.accept_retry = Some(Instant::now() + ACCEPT_RETRY);
    }

    /// Reads what a connection sent of its Request; a complete, valid one goes to the
    /// application, a malformed one or an early end closes the connection. False when
    /// nobody listens any more.
    fn read_request(&mut self, token: Token) -> bool {
        let Some(mut s) = self.starting.remove(&token) else {
            return true;
        };
        loop {
            let n = match s.stream.read(&mut self.buf) {
                Ok(n) if n > 0 => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.starting.insert(token, s);
                    return true;
                }
                // Closed or reset before the Request was complete.
                Ok(_) | Err(_) => {
                    match s.startup {
                        Startup::Mpa(_) => {
                            tracing::debug!(peer = %s.peer, "closed before its MPA Request (kernel TCP)");
                            self.record.startup_failed(&MpaError::ConnectionLost);
                        }
                        Startup::Ift(_) => {
                            tracing::debug!(peer = %s.peer, "closed before its IFT adaption indication (kernel TCP)");
                            self.record
                                .ift_startup_failed(&ift::IftError::ConnectionLost);
                        }
                    }
                    return true;
                }
            };
            let now = Instant::now();
            let (used, complete) = match &mut s.startup {
                Startup::Mpa(responder) => match responder.feed(&self.buf[..n], now) {
                    Ok((used, info)) => (used, info.map(Some)),
                    // RFC 5044 7.1.2: a malformed Request (or none in time) closes the
                    // connection.
                    Err(e) => {
                        peer_line!(warn, peer = %s.peer, error = %e, "MPA startup failed (kernel TCP)");
                        self.record.startup_failed(&e);
                        return true;
                    }
                },
                // IFT section 4.2: an unacceptable indication closes the connection.
                Startup::Ift(responder) => match responder.feed(&self.buf[..n], now) {
                    Ok((used, None)) => (used, None),
                    Ok((used, Some((negotiated, reply)))) => {
                        let deadline = now.checked_add(self.mpa.accept_timeout);
                        let answer = Answer::Ift {
                            negotiated,
                            reply,
                            deadline,
                        };
                        let _ = self
                            .poll
                            .registry()
                            .deregister(&mut SourceFd(&s.stream.as_raw_fd()));
                        let leftover = self.buf[used..n].to_vec();
                        return self.hand_over(s.stream, s.peer, answer, None, leftover);
                    }
                    Err(e) => {
                        peer_line!(warn, peer = %s.peer, error = %e, "IFT startup failed (kernel TCP)");
                        self.record.ift_startup_failed(&e);
                        return true;
                    }
                },
            };
            let Some(info) = complete else { continue };
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&s.stream.as_raw_fd()));
            let Startup::Mpa(responder) = s.startup else {
                return true;
            };
            let leftover = self.buf[used..n].to_vec();
            return self.hand_over(s.stream, s.peer, Answer::Mpa(responder), info, leftover);
        }
    }

    fn hand_over(
        &mut self,
        stream: TcpStream,
        peer: SocketAddr,
        answer: Answer,
        info: Option<RequestInfo>,
        leftover: Vec<u8>,
    ) -> bool {
        match &info {
            Some(info) => peer_line!(
                info,
                %peer,
                rev = info.rev,
                crc = info.crc,
                markers = info.markers,
                private_data = info.private_data.len(),
                "MPA Request received (kernel TCP)"
            ),
            None => peer_line!(info, %peer, "IFT adaption indication received (kernel TCP)"),
        }
        let held: HeldStream = Arc::new(Mutex::new(Some(stream)));
        let deadline = answer.deadline();
        let ift = matches!(answer, Answer::Ift { .. });
        let arrived = Arrived {
            stream: held.clone(),
            answer,
            info,
            peer,
            leftover,
        };
        match self.requests.try_send(arrived) {
            Ok(()) => {
                if let Some(deadline) = deadline {
                    self.waiting.push_back(Waiting {
                        deadline,
                        stream: Arc::downgrade(&held),
                        ift,
                    });
                }
                true
            }
            Err(TrySendError::Full(arrived)) => {
                // The application has `backlog` Requests to answer already: reject this one.
                self.record.over_backlog();
                if let Some(mut stream) = take(&held) {
                    // IFT has no reject: the connection just closes.
                    if let Answer::Mpa(mut responder) = arrived.answer {
                        if let Ok(reply) = responder.reject(&[]) {
                            let _ = stream.set_nonblocking(false);
                            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
                            let _ = stream.write_all(&reply);
                        }
                    }
                    let _ = stream.shutdown(Shutdown::Both);
                }
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Closes connections whose Request did not arrive in time, and those whose Request the
    /// application left unanswered past the accept timeout.
    fn expire(&mut self, now: Instant) {
        let record = &self.record;
        self.starting.retain(|_, s| match &mut s.startup {
            Startup::Mpa(responder) => match responder.handle_timeout(now) {
                Ok(()) => true,
                Err(e) => {
                    peer_line!(warn, peer = %s.peer, error = %e, "MPA startup failed (kernel TCP)");
                    record.startup_failed(&e);
                    false
                }
            },
            Startup::Ift(responder) => match responder.handle_timeout(now) {
                Ok(()) => true,
                Err(e) => {
                    peer_line!(warn, peer = %s.peer, error = %e, "IFT startup failed (kernel TCP)");
                    record.ift_startup_failed(&e);
                    false
                }
            },
        });
        while self.waiting.front().is_some_and(|w| w.deadline <= now) {
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            w.close_if_unanswered(&self.record);
        }
    }
}

impl Waiting {
    /// At its deadline: closes the connection if its Request is still unanswered.
    fn close_if_unanswered(self, record: &ListenRecord) {
        if let Some(stream) = self.stream.upgrade().and_then(|held| take(&held)) {
            peer_line!(
                warn,
                "a connection request left unanswered past the accept timeout: closed"
            );
            if self.ift {
                record.ift_startup_failed(&ift::IftError::AcceptTimeout);
            } else {
                record.startup_failed(&MpaError::AcceptTimeout);
            }
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Requests a dropped listener had handed out keep their accept deadline, as the AF_XDP
/// engine's do (and siw's, whose MPA timer is the connection's, not the listener's): a thread
/// of their own closes those still unanswered at it, and ends with the last deadline, or once
/// the application holds none of them (answered or dropped). Without
/// it, a request held by an application that never answers it would keep its connection and
/// descriptor for good, its peer waiting for its own timeout.
fn close_unanswered_later(waiting: VecDeque<Waiting>, record: Arc<ListenRecord>) {
    let waiting: VecDeque<Waiting> = waiting
        .into_iter()
        .filter(|w| w.stream.strong_count() > 0)
        .collect();
    if waiting.is_empty() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("iwarp-listen-end".into())
        .spawn(move || {
            // In deadline order (one accept timeout for all). Looks every 100 ms whether the
            // application still holds any (an answered or dropped request lets go of its
            // connection): none held, the thread ends before the deadlines.
            let mut waiting = waiting;
            while let Some(first) = waiting.front() {
                if waiting.iter().all(|w| w.stream.strong_count() == 0) {
                    break;
                }
                let now = Instant::now();
                if first.deadline > now {
                    std::thread::sleep((first.deadline - now).min(Duration::from_millis(100)));
                } else if let Some(w) = waiting.pop_front() {
                    w.close_if_unanswered(&record);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(
            error = %e,
            "no thread for the accept deadlines of a dropped listener's requests: \
             they wait for their answer"
        );
    }
}

fn take(held: &HeldStream) -> Option<TcpStream> {
    held.lock().ok().and_then(|mut s| s.take())
}

/// A kernel TCP connection whose MPA Request waits for the application.
struct SocketPending {
    stream: HeldStream,
    answer: Answer,
    /// Bytes read after the Request (the start of the FPDU stream).
    leftover: Vec<u8>,
}

impl SocketPending {
    /// The connection, unless the accept deadline closed it or has passed (the deadline's
    /// close may lag it a little: an accept after the deadline fails here all the same, as
    /// on the engine).
    fn stream(&self) -> Result<TcpStream, DatapathError> {
        let timed_out = || match self.answer {
            Answer::Ift { .. } => DatapathError::Ift(ift::IftError::AcceptTimeout),
            Answer::Mpa(_) => DatapathError::Mpa(MpaError::AcceptTimeout),
        };
        let stream = take(&self.stream).ok_or_else(timed_out)?;
        if self.answer.expired() {
            return Err(timed_out()); // the stream closes as it drops
        }
        stream.set_nonblocking(false)?;
        Ok(stream)
    }
}

impl PendingProvider for SocketPending {
    fn accept(
        self: Box<Self>,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        private_data: &[u8],
        start: QpStart,
        params: &ConnectParams,
    ) -> Result<QueuePair, DatapathError> {
        // The receives and private data were checked by `ConnectRequest::accept_with_recvs`.
        let stream = self.stream()?;
        let SocketPending {
            answer, leftover, ..
        } = *self;
        // The answer goes out first from the connection's thread, once it runs: should the
        // setup fail before (a thread not had), the peer sees its connection close during
        // startup rather than accepted and then closed.
        let (agreed, first_out) = match answer {
            Answer::Mpa(mut responder) => {
                // The accept's own IRD and ORD (`ConnectRequest::ird_ord`).
                responder.set_ird_ord(params.mpa.ird, params.mpa.ord)?;
                let (reply, negotiated) = responder.accept(private_data)?;
                (Agreed::Mpa(negotiated), reply)
            }
            Answer::Ift {
                negotiated, reply, ..
            } => (
                Agreed::Ift {
                    negotiated,
                    ird: params.mpa.ird,
                    ord: params.mpa.ord,
                },
                reply.to_vec(),
            ),
        };
        start_engine(
            stream,
            Setup {
                agreed,
                leftover,
                initiator: false,
                first_out,
                start,
            },
            pd,
            cq,
            params,
        )
    }

    fn reject(
        self: Box<Self>,
        private_data: &[u8],
        _params: &ConnectParams,
    ) -> Result<(), DatapathError> {
        let mut stream = self.stream()?;
        match self.answer {
            Answer::Mpa(mut responder) => {
                let reply = responder.reject(private_data)?;
                stream.write_all(&reply)?;
                let _ = stream.shutdown(Shutdown::Write);
            }
            // IFT has no reject message: the connection closes.
            Answer::Ift { .. } => {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        Ok(())
    }

    fn abandon(self: Box<Self>, _params: &ConnectParams) {
        // Without waiting (the drop may be on any thread): the stream stays non-blocking,
        // and a Reply of a few dozen octets fits a fresh connection's send buffer.
        let Some(mut stream) = take(&self.stream) else {
            return;
        };
        // Past the accept deadline the connection only closes, as the listener's thread (or,
        // the listener gone, the thread of its handed-out requests) and the engine close it
        // then: the close may lag the deadline a little.
        let expired = self.answer.expired();
        if let (Answer::Mpa(mut responder), false) = (self.answer, expired) {
            if let Ok(reply) = responder.reject(&[]) {
                let _ = stream.write_all(&reply);
            }
        }
        let _ = stream.shutdown(Shutdown::Write);
    }
}
