//! The socket transport's queue-pair engine: once a connection is in Full Operation, one
//! thread per connection owns the non-blocking socket (`mio`), the MPA encoder/decoder and the
//! sans-IO [`rdmap::QueuePair`]; the application talks to it through a lock-free command
//! channel and the completion queue.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};
use iwarp_conn::{rtr_kind, UNSENDABLE_TERMINATE};
use mio::{Events, Interest, Poll, Token, Waker};
use mpa::{FpduDecoder, FpduEncoder};
use rdmap::{QpConfig, QpState, RecvWr, TerminateCause};

use crate::log_rate::peer_line;
use crate::memory::{ProtectionDomain, SharedTable};
use crate::verbs::cm::ConnectParams;
use crate::verbs::cq::{Completion, CompletionQueue, CqSink};
use crate::verbs::qp::{
    post_initial_recvs, Agreed, Cmd, PostPath, QpParts, QpStart, QpWaker, QueueAccount, QueuePair,
    Shared, StartingPosts, TakenSend,
};
use crate::{DatapathError, QpError};

impl QpWaker for Waker {
    fn wake(&self) -> io::Result<()> {
        Waker::wake(self)
    }
}

/// Whether a drain of `drain` (its `deadline` set at the first look) has passed with what is
/// queued not all handed to the kernel (`idle` false).
fn drain_spent(deadline: &mut Option<Instant>, drain: Duration, idle: bool) -> bool {
    let now = Instant::now();
    let at = *deadline.get_or_insert(now + drain);
    !idle && now >= at
}

/// `d` rounded up to whole milliseconds, the unit of the kernel's `TCP_USER_TIMEOUT` (in
/// which 0 means "none": a user timeout of ours is above zero, [`ConnectParams::check`]).
fn whole_millis(d: Duration) -> Duration {
    let ms = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// What connection setup hands to the engine.
pub(super) struct Setup {
    pub(super) agreed: Agreed,
    /// Bytes read after the startup (MPA Request/Reply or IFT indications): the start of the
    /// FPDU or frame stream.
    pub(super) leftover: Vec<u8>,
    pub(super) initiator: bool,
    /// Octets the connection's thread writes before anything else: the responder's MPA
    /// Reply or IFT indication, written only once everything that can fail in setting the
    /// connection up has succeeded (the thread started), so that a peer never hears
    /// "accepted" for a connection that then closes. Empty for the initiator.
    pub(super) first_out: Vec<u8>,
    /// The queue pair's number, and the receive work requests to post before any byte is
    /// processed.
    pub(super) start: QpStart,
}

pub(super) fn start_engine(
    stream: TcpStream,
    setup: Setup,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    params: &ConnectParams,
) -> Result<QueuePair, DatapathError> {
    let Setup {
        agreed,
        leftover,
        initiator,
        first_out,
        start: QpStart {
            num,
            recvs,
            posters,
        },
    } = setup;
    match &agreed {
        Agreed::Mpa(n) => peer_line!(
            info,
            peer = ?stream.peer_addr().ok(),
            initiator,
            rev = n.rev,
            crc = n.crc,
            markers_tx = n.markers_tx,
            markers_rx = n.markers_rx,
            "MPA Full Operation (kernel TCP)"
        ),
        Agreed::Ift { negotiated: n, .. } => peer_line!(
            info,
            peer = ?stream.peer_addr().ok(),
            initiator,
            header_crc_tx = n.tx.header_crc,
            payload_crc_tx = n.tx.payload_crc,
            header_crc_rx = n.rx.header_crc,
            payload_crc_rx = n.rx.payload_crc,
            "IFT framing (kernel TCP)"
        ),
    }
    let sock = socket2::SockRef::from(&stream);
    // Dead peers end the connection (RFC 9293 3.8.4 keepalive; RFC 5482 user timeout).
    if let Some(k) = params.keepalive {
        // The kernel counts keepalive times in whole seconds, at least one.
        let secs = |d: Duration| Duration::from_secs(d.as_secs_f64().ceil().max(1.0) as u64);
        let ka = socket2::TcpKeepalive::new()
            .with_time(secs(k.idle))
            .with_interval(secs(k.interval))
            .with_retries(k.probes.max(1));
        sock.set_tcp_keepalive(&ka)?;
    }
    // The kernel counts it in whole milliseconds, and reads 0 as "none": round up.
    sock.set_tcp_user_timeout(params.user_timeout.map(whole_millis))?;
    let mss = sock.mss().unwrap_or(536) as usize;
    let mulpdu = match &agreed {
        Agreed::Mpa(n) => mpa::mulpdu(mss, n.markers_tx),
        // A frame per segment: the IFT header and the CRCs around the ULPDU.
        Agreed::Ift { negotiated: n, .. } => n.tx.mulpdu(mss),
    }
    .min(usize::from(u16::MAX));
    let peer = stream.peer_addr()?;
    let local = stream.local_addr()?;
    stream.set_read_timeout(None)?;
    stream.set_nonblocking(true)?;
    let mut stream = mio::net::TcpStream::from_std(stream);
    let poll = Poll::new()?;
    poll.registry()
        .register(&mut stream, SOCKET, Interest::READABLE | Interest::WRITABLE)?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();

    let mut qp = rdmap::QueuePair::new(QpConfig {
        pd: pd.id,
        sq_depth: params.sq_depth,
        rq_depth: params.rq_depth,
        ird: agreed.ird(),
        ord: agreed.ord(),
        extensions: params.rdmap_extensions,
    });
    let rtr = match &agreed {
        Agreed::Mpa(n) => n.rtr,
        Agreed::Ift { .. } => None,
    };
    if let Some(srq) = &params.srq {
        srq.attach(&mut qp, pd.id)?;
    }
    if !initiator {
        if let Some(kind) = rtr {
            qp.expect_rtr(rtr_kind(kind))
                .map_err(|_| DatapathError::InvalidArgument("cannot prepare for the RTR"))?;
        }
    }
    qp.enter_rts(agreed.ird(), agreed.ord());
    let mem = pd.table.snapshot();
    post_initial_recvs(&mut qp, &mem, recvs)?;
    qp.join_stream(&mem);
    if initiator {
        if let Some(kind) = rtr {
            // RFC 6581 3: the initiator's RTR is its first FPDU.
            qp.send_rtr(rtr_kind(kind));
        }
    }
    let may_send = match &agreed {
        Agreed::Mpa(n) => initiator || !n.responder_waits_for_fpdu,
        Agreed::Ift { .. } => true,
    };
    let shared = Shared::new(qp.state());
    // Receives posted with the connect or accept count against the receive queue from the
    // start.
    let account = QueueAccount::default();
    account.publish(&qp, &shared);
    let (sq_depth, rq_depth) = (qp.config().sq_depth, qp.config().rq_depth);
    let (srq, extensions) = (qp.has_srq(), qp.config().extensions);
    let cq = CqSink::new(cq, params.recv_cq.as_ref());
    let mut engine = Engine {
        stream,
        poll,
        cmds: cmd_rx,
        framer: Framer::new(&agreed),
        // RFC 5044 7.1.2 rule 4 (MPA only): the Responder sends nothing before a valid FPDU.
        may_send,
        rtr_deadline: (!may_send && rtr.is_some())
            .then(|| crate::verbs::timeout::deadline_after(params.mpa.timeout)),
        qp,
        account,
        table: pd.table.clone(),
        cq: cq.clone(),
        num,
        shared: shared.clone(),
        tx: {
            let mut tx = Vec::with_capacity(TX_HIGH + 70_000);
            tx.extend_from_slice(&first_out);
            tx
        },
        tx_off: 0,
        ulpdu: Vec::with_capacity(70_000),
        rx: vec![0u8; 256 * 1024],
        mulpdu,
        closing: false,
        close_taken: false,
        handles_gone: false,
        rx_closed: false,
        tx_failed: false,
        cq_overrun: false,
        last_state: None,
        error_drain: params.user_timeout.map_or(params.close_timeout, |t| {
            whole_millis(t).min(params.close_timeout)
        }),
        close_drain: params.close_timeout,
        error_deadline: None,
        close_deadline: None,
        posters: None,
    };
    let mut parts = QpParts {
        num,
        cmds: cmd_tx,
        waker,
        shared,
        agreed,
        mulpdu,
        local,
        peer,
        tos: params.tos,
        thread: None,
        sq_depth,
        rq_depth,
        srq,
        extensions,
        cq: Some(cq),
        close_timeout: params.close_timeout,
    };
    engine.posters = posters.map(|p| (p, parts.post_path()));
    let thread = std::thread::Builder::new()
        .name(format!("iwarp-qp{num}"))
        .spawn(move || engine.run(leftover))?;
    parts.thread = Some(thread);
    Ok(QueuePair::from_parts(parts))
}

/// The longest an idle connection's thread sleeps between looks at its work: a safety net
/// (the socket, the application's waker and the deadlines wake it when there is work). It
/// slept 50 ms before: 20 wake-ups a second per idle connection, a core's worth at 10,000.
const IDLE_SLEEP: Duration = Duration::from_secs(1);

/// How long a graceful close waits for a peer that neither sends nor acknowledges anything
/// before it closes anyway (`Engine::close_gracefully`): a close loses nothing while nothing
/// arrives.
const CLOSE_QUIET: Duration = Duration::from_secs(1);

const SOCKET: Token = Token(0);
const WAKE: Token = Token(1);
/// Encoded bytes kept ready for the socket before asking the queue pair for more.
const TX_HIGH: usize = 512 * 1024;
/// Read calls per loop turn, so a busy receive side cannot starve commands and transmit.
const RX_BUDGET: usize = 16;
/// Turns of reading (each [`RX_BUDGET`] reads of the receive buffer's size) that place what
/// the socket still holds when sending failed: more than a kernel receive buffer holds.
const RX_LEFT_TURNS: usize = 64;
/// Work requests taken from the application per turn.
const CMD_BUDGET: usize = 256;

/// How DDP segments are framed on the stream.
enum Framer {
    /// MPA FPDUs (RFC 5044).
    Mpa {
        encoder: FpduEncoder,
        decoder: Box<FpduDecoder>,
    },
    /// IFT frames (draft-williams-iwarp-ift-01 5.1).
    Ift {
        encoder: ift::FrameEncoder,
        decoder: ift::FrameDecoder,
    },
}

impl Framer {
    fn new(agreed: &Agreed) -> Framer {
        match agreed {
            Agreed::Mpa(n) => Framer::Mpa {
                encoder: FpduEncoder::new(n.crc, n.markers_tx),
                decoder: Box::new(FpduDecoder::new(n.crc, n.markers_rx)),
            },
            Agreed::Ift { negotiated: n, .. } => Framer::Ift {
                encoder: ift::FrameEncoder::new(n.tx),
                decoder: ift::FrameDecoder::new(n.rx),
            },
        }
    }

    /// Frames one ULPDU (DDP header and payload) onto `out`; false if it cannot be framed
    /// (longer than the framing allows: a local bug).
    fn encode(&mut self, ulpdu: &[u8], out: &mut Vec<u8>) -> bool {
        match self {
            Framer::Mpa { encoder, .. } => encoder.encode(ulpdu, out).is_ok(),
            Framer::Ift { encoder, .. } => encoder.encode(ulpdu, out).is_ok(),
        }
    }
}

/// A framing error in the received stream, with the Terminate code that reports it.
enum FramingError {
    Mpa(mpa::MpaError),
    Ift(ift::IftError),
}

impl FramingError {
    fn code(&self) -> u8 {
        match self {
            FramingError::Mpa(e) => e.code(),
            FramingError::Ift(e) => e.code(),
        }
    }

    fn into_qp_error(self) -> QpError {
        match self {
            FramingError::Mpa(e) => QpError::Mpa(e),
            FramingError::Ift(e) => QpError::Ift(e),
        }
    }
}

struct Engine {
    stream: mio::net::TcpStream,
    poll: Poll,
    cmds: Receiver<Cmd>,
    qp: rdmap::QueuePair,
    /// The work requests taken from `cmds`, for the queue pair's post-time queue limits.
    account: QueueAccount,
    table: SharedTable,
    framer: Framer,
    /// RFC 5044 7.1.2: the Responder sends nothing before it has received a valid FPDU.
    may_send: bool,
    /// A peer-to-peer Responder's deadline for the RTR (RFC 6581 5), `MpaConfig::timeout`
    /// after the accept: see [`Engine::rtr_deadline`].
    rtr_deadline: Option<Instant>,
    cq: CqSink,
    num: u32,
    shared: Arc<Shared>,
    tx: Vec<u8>,
    tx_off: usize,
    ulpdu: Vec<u8>,
    rx: Vec<u8>,
    mulpdu: usize,
    closing: bool,
    /// A Close taken before received octets were processed, for the next turn.
    close_taken: bool,
    /// The command channel's senders are all gone (the queue pair's last handle dropped): its
    /// Close was taken.
    handles_gone: bool,
    rx_closed: bool,
    tx_failed: bool,
    /// A completion found the completion queue full and was lost: the connection is reset.
    cq_overrun: bool,
    last_state: Option<QpState>,
    /// How long a queue pair in Error may take to send what it has queued
    /// ([`Engine::error_drain_expired`]).
    error_drain: Duration,
    /// The most the application's close waits for the peer to take what the queue pair had
    /// queued, and after our FIN for the peer to end its side
    /// ([`ConnectParams::close_timeout`]; [`Engine::close_drain_expired`],
    /// [`Engine::close_gracefully`]).
    close_drain: Duration,
    /// When the one in Error stops trying, once it is.
    error_deadline: Option<Instant>,
    /// When the application's close, once taken, stops waiting for what the queue pair had
    /// queued to reach the kernel ([`Engine::close_drain_expired`]).
    close_deadline: Option<Instant>,
    /// The queue pair was created before its connection: the receives its posters took while
    /// it started, handed to it first thing on its thread ([`StartingPosts::run`]).
    posters: Option<(Box<dyn StartingPosts>, PostPath)>,
}

impl Engine {
    /// The connection's thread: [`Engine::serve`]. Should it panic (a bug), the queue pair
    /// fails as a failed connection does, not silently: outstanding requests flushed, the
    /// status an error (`QpFatal` where asked), the queue pair finished, the connection reset;
    /// as an AF_XDP engine thread's panic fails its queue pairs.
    fn run(mut self, leftover: Vec<u8>) {
        let _in_turn = crate::turn::TransportTurn::enter();
        let served = std::panic::catch_unwind(AssertUnwindSafe(|| self.serve(leftover)));
        let Err(cause) = served else {
            return;
        };
        tracing::error!(
            panic = crate::error::panic_text(&*cause),
            "the connection's thread panicked: queue pair failed, connection reset"
        );
        let _ = socket2::SockRef::from(&self.stream).set_linger(Some(Duration::ZERO));
        // (A panic in a finish hook: the queue pair had finished, its end reported.)
        if self.shared.lock().finished {
            return;
        }
        const PANICKED: QpError = QpError::Local("the connection's thread panicked");
        let flushed = std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.set_error(PANICKED);
            self.qp.on_transport_error(TerminateCause::ConnectionLost);
            self.deliver_completions();
            self.stop_posts();
        }));
        if flushed.is_err() {
            // The queue pair's own requests are lost with it; those still queued for it
            // complete flushed, as every accepted request completes.
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| self.stop_posts()));
            self.shared.set_error(PANICKED, None);
        }
        self.shared.mark_finished(QpState::Error);
    }

    /// Posts a receive taken from the application: one the queue pair refuses completes in
    /// error in its place.
    fn post_taken_recv(&mut self, wr: RecvWr) {
        let wr_id = wr.wr_id;
        let res = {
            let table = self.table.snapshot();
            self.qp.post_recv(wr, &table)
        };
        if let Err(e) = res {
            self.shared.refuse_taken_recv(&mut self.qp, wr_id, &e);
        }
    }

    /// The connection's work until it ends (see [`Engine::run`]).
    fn serve(&mut self, leftover: Vec<u8>) {
        if let Some((posters, path)) = self.posters.take() {
            // Before anything can complete, and before any received byte is placed. The
            // caller may have the queue pair already (the start's end then handed the posters
            // over, and this takes nothing): each receive taken is published under the
            // posters' lock, before anyone can post through the queue pair counting on it.
            posters.run(&path, &mut |wr| {
                self.post_taken_recv(wr);
                self.account.publish(&self.qp, &self.shared);
            });
        }
        if !leftover.is_empty() {
            // What was posted before the thread ran is in place for the bytes that came
            // with the startup, as for those read later.
            if !self.cmds.is_empty() {
                self.handle_commands(true);
            }
            self.process_rx(&leftover);
        }
        let mut events = Events::with_capacity(16);
        let mut aborted = false;
        loop {
            if self.cq_overrun {
                // A completion was lost to a full completion queue (verbs' CQ overrun): the
                // queue pair fails and the connection is reset, as an abort does.
                self.set_error(QpError::CqOverrun);
                aborted = true;
                break;
            }
            if self.shared.abort_requested() {
                // `QueuePair::abort`: the close below resets the connection (a zero linger
                // time, RFC 9293 3.10.5 ABORT) and nothing more is sent or placed.
                aborted = true;
                break;
            }
            let mut progress = self.handle_commands(false);
            progress |= self.receive();
            self.rtr_deadline();
            self.close_unsendable_terminate();
            progress |= self.transmit();
            progress |= self.deliver_completions();
            self.publish_status();
            // (Before `finished`: the error's deadline also bounds the close's wait.)
            let drain_expired = self.error_drain_expired();
            let close_expired = self.close_drain_expired();
            if self.finished() {
                break;
            }
            if drain_expired || close_expired {
                let what = if drain_expired {
                    "queue pair in error: what it had queued did not go in time; reset"
                } else {
                    "closing: what the queue pair had queued did not go in time; reset"
                };
                peer_line!(info, peer = ?self.stream.peer_addr().ok(), "{what}");
                aborted = true;
                break;
            }
            if !progress {
                let _ = self.poll.poll(&mut events, Some(self.next_sleep()));
            }
        }
        // Read before the shutdown, after which the socket no longer has it.
        let peer = self.stream.peer_addr().ok();
        if !aborted {
            aborted = self.close_gracefully(&mut events);
        }
        if aborted {
            let _ = socket2::SockRef::from(&self.stream).set_linger(Some(Duration::ZERO));
            self.qp.on_transport_error(TerminateCause::ConnectionLost);
            if self.cq_overrun {
                tracing::warn!(peer = ?peer, "completion queue overrun: connection reset");
            } else if self.shared.abort_requested() {
                tracing::info!(peer = ?peer, "the application reset the connection");
            }
        }
        self.deliver_completions();
        self.stop_posts();
        peer_line!(
            info,
            peer = ?peer,
            state = ?self.qp.state(),
            "TCP connection ended (kernel TCP)"
        );
        if self.cq_overrun {
            // Found at any point, the last pass before a graceful end included.
            self.set_error(QpError::CqOverrun);
        }
        self.shared.mark_finished(self.qp.state());
    }

    /// Our side's end without a reset (RFC 9293 3.10.4 CLOSE): our FIN goes after all the
    /// kernel holds of ours, and while the peer still sends, the socket stays open, what
    /// arrives read and dropped, until the peer has acknowledged all of ours, FIN included,
    /// or has ended its side (or the connection failed). Closing with the peer still sending
    /// would lose data: Linux resets a connection closed with received data unread, and an
    /// orphaned one that receives more, throwing away what it has not yet sent, so Writes
    /// and Sends that completed once framed (or our Terminate) would never
    /// arrive. A peer that neither sends nor acknowledges anything for [`CLOSE_QUIET`] (gone,
    /// or stalled) is not waited for: the kernel sends the rest after the close. Work
    /// requests posted meanwhile are taken as in any turn (refused while closing and flushed,
    /// flushed in Error). Bounded by the close timeout (`close_drain`) from the application's
    /// close, the drain
    /// of what the queue pair had queued included (in Error by the error's deadline,
    /// [`Engine::error_drain_expired`]), and by `disconnect`'s wait.
    /// Returns true if the application's `abort` came meanwhile: the caller resets.
    fn close_gracefully(&mut self, events: &mut Events) -> bool {
        let _ = self.stream.flush();
        if self.stream.shutdown(Shutdown::Write).is_err() {
            return false;
        }
        let now = Instant::now();
        // In Error, what the kernel holds gets what is left of the error's time; after the
        // application's close, what is left of the close's (one close timeout in all, as on
        // the engine); the earlier where both are set.
        let deadline = [self.error_deadline, self.close_deadline]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now + self.close_drain);
        let mut heard = now;
        let mut unacknowledged = usize::MAX;
        let mut scratch = std::mem::take(&mut self.rx);
        let mut reset = false;
        'drain: loop {
            // Posts meanwhile: refused while closing, flushed either way.
            if self.handle_commands(false) {
                self.deliver_completions();
            }
            for _ in 0..RX_BUDGET {
                match self.stream.read(&mut scratch) {
                    // The peer's end, or a failure: nothing more will come.
                    Ok(0) => break 'drain,
                    Ok(_) => heard = Instant::now(),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => break 'drain,
                }
            }
            if self.shared.abort_requested() {
                // `abort` resets; `disconnect` after its wait only stops waiting (nothing
                // here touches the queue pair's memory).
                reset = self.shared.reset_requested();
                break;
            }
            // All of ours acknowledged: a reset at the close (the peer still sending) loses
            // nothing of ours. While the peer acknowledges more, it is there: it may yet
            // send, so it is waited for as one that sends.
            match super::sockopt::unacknowledged(&self.stream) {
                Some(0) => break,
                Some(n) if n < unacknowledged => {
                    if unacknowledged != usize::MAX {
                        heard = Instant::now();
                    }
                    unacknowledged = n;
                }
                _ => {}
            }
            let now = Instant::now();
            if now >= deadline || now.duration_since(heard) >= CLOSE_QUIET {
                break;
            }
            let wait = (deadline - now).min(Duration::from_millis(50));
            let _ = self.poll.poll(events, Some(wait));
        }
        self.rx = scratch;
        reset
    }

    /// How long the thread may sleep when nothing moved: until its next deadline (the RTR's,
    /// the error's), at most [`IDLE_SLEEP`]. Everything else that needs it wakes it: the
    /// socket (readable, writable again), the application's posts, closes and aborts (the
    /// waker).
    fn next_sleep(&self) -> Duration {
        let now = Instant::now();
        [self.rtr_deadline, self.error_deadline, self.close_deadline]
            .into_iter()
            .flatten()
            .map(|at| at.saturating_duration_since(now))
            .fold(IDLE_SLEEP, Duration::min)
    }

    /// Stops taking work requests (`Shared::stop_posts`): those queued complete flushed.
    fn stop_posts(&self) {
        let (cq, num) = (&self.cq, self.num);
        self.shared.stop_posts(Some(&self.cmds), |wc| {
            // At the end: a completion lost here only marks the queue overrun.
            let _ = cq.push(Completion { qp_num: num, wc });
        });
    }

    /// Records what ended the connection (see `Shared::set_error`).
    fn set_error(&self, error: QpError) {
        let terminate = self.qp.remote_terminate();
        match &terminate {
            Some(t) => peer_line!(
                info,
                error = %error,
                terminate = ?t,
                "queue pair in error: the peer sent a Terminate"
            ),
            None => tracing::debug!(error = %error, "queue pair in error"),
        }
        self.shared.set_error(error, terminate);
    }

    /// Takes work requests from the application: at most `CMD_BUDGET` a turn, so that an
    /// application posting without pause cannot keep the thread from the socket (the rest
    /// wait for the next turn, which comes at once: progress); before received octets are
    /// processed (`before_data`), all that are queued (the post-time queue limits bound them)
    /// up to a Close, which the next turn carries out, after those octets.
    fn handle_commands(&mut self, before_data: bool) -> bool {
        let mut progress = false;
        if self.close_taken && !before_data {
            self.close_taken = false;
            self.take_close();
            return true;
        }
        let budget = if before_data { usize::MAX } else { CMD_BUDGET };
        for _ in 0..budget {
            if self.close_taken {
                break;
            }
            let cmd = match self.cmds.try_recv() {
                Ok(c) => c,
                Err(TryRecvError::Empty) => break,
                // Every handle gone: a Close, once (taken again each turn, it would count as
                // progress and keep the loop from ever sleeping while the close drains).
                Err(TryRecvError::Disconnected) if self.handles_gone => break,
                Err(TryRecvError::Disconnected) => {
                    self.handles_gone = true;
                    Cmd::Close
                }
            };
            self.account.took(&cmd);
            progress = true;
            match cmd {
                Cmd::Send(wr) => {
                    let taken = TakenSend::of(&wr);
                    let res = {
                        let table = self.table.snapshot();
                        self.qp.post_send(wr, &table)
                    };
                    if let Err(e) = res {
                        self.shared.refuse_taken_send(&mut self.qp, taken, &e);
                    }
                }
                Cmd::SendInline(wr) => {
                    let taken = TakenSend::of_inline(&wr);
                    if let Err(e) = self.qp.post_send_inline(wr) {
                        self.shared.refuse_taken_send(&mut self.qp, taken, &e);
                    }
                }
                Cmd::Recv(wr) => self.post_taken_recv(wr),
                Cmd::Panic => panic!("injected by a test (QueuePair::inject_transport_panic)"),
                Cmd::Close if before_data => self.close_taken = true,
                Cmd::Close => {
                    self.take_close();
                    break;
                }
            }
        }
        progress
    }

    /// The application's Close: the queue pair starts its graceful close, and nothing follows
    /// it, as on the engine: requests still queued behind it complete flushed, after the
    /// queue pair's own, and later posts never reach this thread (refused, or flushed by the
    /// handle once the queue pair has finished in Error). A post taken after the Close would
    /// find the queue pair Closing and be refused (counted: `QueuePair::refused_while_ending`).
    fn take_close(&mut self) {
        if !self.closing {
            self.closing = true;
            self.qp.close();
        }
        self.deliver_completions();
        self.shared
            .stop_posts_behind(Some(&self.cmds), &mut self.qp, Some(&self.cq), self.num);
        self.deliver_completions();
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
                    // A receive posted before these octets came is in place for them: the
                    // peer may have been told of it some other way than by this stream (its
                    // Send can follow the post by less than a turn of this loop; the engine
                    // does the same in `on_data`).
                    if !self.cmds.is_empty() {
                        self.handle_commands(true);
                    }
                    self.process_rx(&rx[..n]);
                    if self.rx_closed {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.rx_closed = true;
                    // Our own close ends as the engine's does: without an error (its end is
                    // the connection manager's `Disconnected`, not a failure).
                    if !self.closing {
                        self.set_error(QpError::from_io(&e));
                    }
                    self.qp.on_transport_error(TerminateCause::ConnectionLost);
                    progress = true;
                    break;
                }
            }
        }
        self.rx = rx;
        progress
    }

    /// Reads and places what the socket still holds (at most [`RX_LEFT_TURNS`] turns of
    /// [`Engine::receive`]: the kernel's receive buffer is finite), until it has nothing more
    /// now, ends or fails.
    fn receive_what_is_left(&mut self) {
        for _ in 0..RX_LEFT_TURNS {
            if !self.receive() || self.rx_closed {
                break;
            }
        }
    }

    /// Feeds received bytes through the framing into the queue pair (placement happens
    /// here).
    fn process_rx(&mut self, bytes: &[u8]) {
        let table = self.table.snapshot();
        let qp = &mut self.qp;
        let mut got_fpdu = false;
        let mut first_error = None;
        let res = match &mut self.framer {
            Framer::Mpa { decoder, .. } => decoder
                .feed(bytes, |ulpdu| {
                    got_fpdu = true;
                    if let Err(e) = qp.on_ulpdu(ulpdu, &table) {
                        first_error.get_or_insert(e);
                    }
                })
                .map_err(FramingError::Mpa),
            // A frame's header and payload CRCs were checked before it is handed up: nothing
            // of a frame that fails them is placed.
            Framer::Ift { decoder, .. } => decoder
                .feed(bytes, |frame| {
                    got_fpdu = true;
                    if let Err(e) = qp.on_segment(frame.ddp_header, frame.payload, &table) {
                        first_error.get_or_insert(e);
                    }
                })
                .map_err(FramingError::Ift),
        };
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
            // (layer LLP). The connection, not the process, ends.
            let code = e.code();
            self.set_error(e.into_qp_error());
            let cause = if self.may_send {
                TerminateCause::Llp { code }
            } else {
                // A Responder that has not yet received a valid FPDU may send nothing, not
                // even a Terminate (RFC 5044 7.1.2 rule 4): the connection just closes.
                TerminateCause::ConnectionLost
            };
            self.qp.on_transport_error(cause);
            self.rx_closed = true;
        }
    }

    /// A queue pair that raised a Terminate while we may send nothing (a refused receive
    /// failing it before the peer's first FPDU: RFC 5044 7.1.2 rule 4 forbids even a
    /// Terminate then) closes the connection without it, as on an MPA error then; otherwise
    /// the Terminate would wait for an FPDU a silent peer never sends, the connection never
    /// ending.
    fn close_unsendable_terminate(&mut self) {
        if self.may_send || self.rx_closed || self.qp.state() != QpState::Terminate {
            return;
        }
        self.set_error(QpError::ClosedLocally(UNSENDABLE_TERMINATE));
        self.qp.on_transport_error(TerminateCause::ConnectionLost);
        self.rx_closed = true;
    }

    /// A peer-to-peer Responder still without the RTR at its deadline (a peer that finished
    /// the exchange and said nothing more) closes the connection, sending nothing: it may
    /// not (RFC 5044 7.1.2 rule 4), and setup ends with the RTR (RFC 6581 5).
    fn rtr_deadline(&mut self) {
        let Some(at) = self.rtr_deadline else {
            return;
        };
        if self.may_send || self.rx_closed || self.qp.state() != QpState::Rts {
            // The RTR came, or the connection failed or is closing otherwise.
            self.rtr_deadline = None;
        } else if Instant::now() >= at {
            self.rtr_deadline = None;
            self.set_error(QpError::Mpa(mpa::MpaError::RtrTimeout));
            self.qp.on_transport_error(TerminateCause::ConnectionLost);
            self.rx_closed = true;
        }
    }

    fn transmit(&mut self) -> bool {
        let mut progress = false;
        if self.may_send && !self.tx_failed && self.tx.len() - self.tx_off < TX_HIGH {
            let table = self.table.snapshot();
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
                if !self.framer.encode(&self.ulpdu, &mut self.tx) {
                    // Only a ULPDU above the framing's 65535-octet limit fails here: a local
                    // bug.
                    self.set_error(QpError::Local("a ULPDU too long for its framing"));
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
                    // What the peer sent before the failure came whole and in order: it is
                    // placed before the queue pair fails. (A peer that acknowledged all of
                    // ours and then reset, as a close with our octets unread does on Linux,
                    // leaves them readable; dropped, a Write it completed would arrive in
                    // part.)
                    self.receive_what_is_left();
                    if !self.closing {
                        self.set_error(QpError::from_io(&e));
                    }
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
            if !progress {
                // The places these completions free, before the application can see them.
                self.account.publish(&self.qp, &self.shared);
            }
            progress = true;
            let c = Completion {
                qp_num: self.num,
                wc,
            };
            self.cq_overrun |= self.cq.deliver(c).is_err();
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

    /// Whether a queue pair in Error has spent its time sending what it had queued (its
    /// Terminate, FPDUs before it) without getting it all out: at most the user timeout
    /// (RFC 5482; `ConnectParams::user_timeout`) or the close timeout, whichever is less. The
    /// kernel's user timeout alone does not bound it: a peer that reads a trickle keeps
    /// acknowledging, and would hold the connection, its thread and buffers, with no end
    /// reported to the application, for as long as it liked.
    fn error_drain_expired(&mut self) -> bool {
        // From the error on: Terminate until the Terminate has been handed out, then Error.
        if !matches!(self.qp.state(), QpState::Error | QpState::Terminate) {
            return false;
        }
        let idle = self.tx_idle();
        drain_spent(&mut self.error_deadline, self.error_drain, idle)
    }

    /// Whether the application's close (taken: `closing`) has spent its close timeout, as
    /// `disconnect` waits before its reset, handing the kernel what the queue pair had queued
    /// without getting it all out. A peer that reads a trickle, or nothing, behind a
    /// `start_disconnect` (nobody waiting in `disconnect` to reset it after the close
    /// timeout), or a queue pair whose last handle went on a transport thread, would otherwise
    /// hold the
    /// connection, its thread and buffers, its end unreported, for as long as it liked.
    fn close_drain_expired(&mut self) -> bool {
        if !self.closing {
            return false;
        }
        let idle = self.tx_idle();
        drain_spent(&mut self.close_deadline, self.close_drain, idle)
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use crate::{Access, CompletionQueue, ConnectParams, ProtectionDomain, SendOp, SendWr, Stag};

    /// The kernel's `TCP_USER_TIMEOUT` counts whole milliseconds and reads 0 as "none": a
    /// timeout under a millisecond must not turn the user timeout off.
    #[test]
    fn user_timeouts_round_up_to_whole_milliseconds() {
        let ms = Duration::from_millis;
        assert_eq!(super::whole_millis(Duration::from_nanos(1)), ms(1));
        assert_eq!(super::whole_millis(Duration::from_micros(999)), ms(1));
        assert_eq!(super::whole_millis(ms(1)), ms(1));
        assert_eq!(super::whole_millis(Duration::from_micros(1001)), ms(2));
        assert_eq!(
            super::whole_millis(crate::MAX_USER_TIMEOUT),
            crate::MAX_USER_TIMEOUT
        );
    }

    /// CPU time (user and system, in clock ticks) of this process's thread named `name`.
    fn thread_ticks(name: &str) -> Option<u64> {
        for task in std::fs::read_dir("/proc/self/task").ok()? {
            let dir = task.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            if comm.trim_end() != name {
                continue;
            }
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            // Fields after the command's closing parenthesis; utime and stime are the 14th
            // and 15th of the line, the 12th and 13th after it.
            let rest = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split(' ').collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            return Some(utime + stime);
        }
        None
    }

    /// A queue pair whose close drains behind a peer that stopped reading, its last handle
    /// dropped on a transport thread (which cannot wait for the drain): its thread sleeps
    /// while the close drains. Before, the command channel, its senders all gone, gave a
    /// Close every turn, each counted as progress, and the thread never slept: a core spun
    /// for the close's 10 s.
    #[test]
    fn a_draining_close_whose_handles_are_gone_sleeps() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        socket2::SockRef::from(&listener)
            .set_recv_buffer_size(16 * 1024)
            .expect("SO_RCVBUF");
        let addr = listener.local_addr().expect("address");
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let peer = std::thread::spawn(move || -> Result<(), String> {
            let (mut s, _) = listener.accept().map_err(|e| e.to_string())?;
            let mut responder = mpa::Responder::new(mpa::MpaConfig::default(), Instant::now())
                .map_err(|e| e.to_string())?;
            let mut octet = [0u8; 1];
            loop {
                if s.read(&mut octet).map_err(|e| e.to_string())? == 0 {
                    return Err("closed before the Request".into());
                }
                let (_, info) = responder
                    .feed(&octet, Instant::now())
                    .map_err(|e| e.to_string())?;
                if info.is_some() {
                    break;
                }
            }
            let (reply, _) = responder.accept(b"").map_err(|e| e.to_string())?;
            s.write_all(&reply).map_err(|e| e.to_string())?;
            // Never reads again until the test is done.
            let _ = stop_rx.recv_timeout(Duration::from_secs(60));
            Ok(())
        });
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let params = ConnectParams {
            user_timeout: None,
            setup_timeout: Duration::from_secs(10),
            ..ConnectParams::default()
        };
        let conn = crate::connect(addr, &pd, &cq, &params, b"").expect("connect");
        let src = pd.register(1 << 20, Access::LOCAL_WRITE).expect("region");
        for i in 0..64 {
            let wr = SendWr {
                wr_id: i,
                op: SendOp::Write {
                    remote_stag: Stag(0x100),
                    remote_to: 0,
                },
                sg_list: src.sge(0, 1 << 20).into(),
                signaled: true,
                fence: false,
            };
            conn.qp.post_send(wr).expect("post a Write");
        }
        // The buffers on both sides fill: the Writes stop completing.
        while cq.wait(Duration::from_secs(1)).is_some() {}
        let name = format!("iwarp-qp{}", conn.qp.num());
        {
            let _turn = crate::turn::TransportTurn::enter();
            conn.qp.start_disconnect().expect("start the close");
            // On a transport thread: no wait for the drain.
            drop(conn);
        }
        std::thread::sleep(Duration::from_millis(300));
        let before = thread_ticks(&name).expect("the connection's thread, draining");
        std::thread::sleep(Duration::from_secs(2));
        let after = thread_ticks(&name).expect("the connection's thread, draining");
        let _ = stop_tx.send(());
        peer.join().expect("the peer's thread").expect("the peer");
        // Clock ticks are 10 ms (USER_HZ 100): a spinning thread takes ~200 in 2 s.
        assert!(
            after - before < 40,
            "the draining thread spun: {} ticks in 2 s",
            after - before
        );
    }
}
