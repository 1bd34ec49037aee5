//! The queue pair as the application holds it (`ibv_qp`): work requests go to the transport
//! that runs the connection through a lock-free command channel and a wake-up; the transport
//! publishes the state, the Terminates and the typed cause of the connection's end
//! ([`QpStatus`]). Both transports build it from [`QpParts`].

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use mpa::Negotiated;
use rdmap::{
    InlineSendWr, QpState, RecvWr, SendWr, TerminateInfo, WcOpcode, WcStatus, WorkCompletion,
    MAX_INLINE_DATA, MAX_SGE,
};

use crate::log_rate::LogRate;
use crate::probe::{self, Mark};
use crate::turn::TransportTurn;
use crate::verbs::cq::{Completion, CqSink};
use crate::verbs::timeout::poll_until;
use crate::{DatapathError, PostListError, QpError};

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
    SendInline(InlineSendWr),
    Recv(RecvWr),
    Close,
    /// Makes the transport thread that takes it panic ([`QueuePair::inject_transport_panic`]).
    Panic,
}

impl Cmd {
    /// The completion of the work request, flushed (`WrFlushError`); `None` for a Close.
    fn flushed(&self) -> Option<WorkCompletion> {
        let (wr_id, opcode) = match self {
            Cmd::Send(wr) => (wr.wr_id, wr.op.wc_opcode()),
            Cmd::SendInline(wr) => (wr.wr_id, wr.op.wc_opcode()),
            Cmd::Recv(wr) => (wr.wr_id, WcOpcode::Recv),
            Cmd::Close | Cmd::Panic => return None,
        };
        Some(WorkCompletion::failed(
            wr_id,
            opcode,
            WcStatus::WrFlushError,
        ))
    }
}

/// State the engine publishes for the application.
pub(crate) struct Shared {
    pub(crate) status: Mutex<QpStatus>,
    /// Called once when the transport has finished with the connection (a connection-manager
    /// event channel's `Disconnected`), with the cause.
    on_finish: Mutex<FinishSlot>,
    /// The same for an asynchronous event channel (`ibv_get_async_event`), beside the
    /// connection manager's.
    on_finish_async: Mutex<FinishSlot>,
    /// The gate of the command channel: the number of posts under way, and [`POSTS_STOPPED`]
    /// once the transport has stopped taking work requests. A post either sees the stop (and
    /// is refused, or flushed by the handle once the queue pair has finished in Error), or is
    /// counted, and the transport waits for it to be queued before it flushes the queue: no
    /// work request is accepted and then lost.
    posts: AtomicUsize,
    /// The application asked for the connection to be reset ([`QueuePair::abort`], or a
    /// [`QueuePair::disconnect`] whose graceful close did not finish): the transport drops it
    /// at once, so that nothing reads or writes the queue pair's memory once the queue pair is
    /// finished.
    abort: AtomicBool,
    /// [`QueuePair::abort`] itself asked for the reset (not `disconnect` after its wait):
    /// [`Shared::reset_requested`].
    reset: AtomicBool,
    /// Send work requests that have left the send queue, and receives that have left the
    /// receive queue, as the transport last published them ([`QueueAccount::publish`]).
    retired: RetiredCounts,
    /// Send and receive work requests posted through the queue pair's [`PostPath`] (its
    /// handle and its posters): the other side of [`QueueAccount`].
    posted: PostedCounts,
    /// The state last published is Closing or Terminate ([`refuses_posts_in`]), for posts to
    /// read without the status lock.
    refusing_posts: AtomicBool,
    /// Work requests the transport took and refused because the queue pair was ending
    /// (Closing, Terminate): [`QueuePair::refused_while_ending`].
    refused_while_ending: AtomicU64,
    /// A disconnect waited its full time for the transport and gave up (a transport that
    /// does not answer): later disconnects and drops wait only for the reset's time.
    end_wait_given_up: AtomicBool,
}

/// The counts of work requests posted ([`Shared::posted`]), which the application's posts
/// write, apart from those the transport publishes ([`RetiredCounts`]).
#[repr(align(128))]
struct PostedCounts {
    sends: AtomicU64,
    recvs: AtomicU64,
}

/// The counts of work requests retired ([`Shared::retired`]), which the transport writes at
/// every publish, on cache lines of their own: the application's posts read them, but write
/// only elsewhere (the posted counts, the post gate).
#[repr(align(128))]
struct RetiredCounts {
    sends: AtomicU64,
    recvs: AtomicU64,
}

/// RDMAP Closing and Terminate: a work request posted now could only fail, so the post is
/// refused, as siw refuses it (`ENOTCONN`). In Error, posts are taken and flushed, as verbs
/// flushes them.
fn refuses_posts_in(state: QpState) -> bool {
    matches!(state, QpState::Closing | QpState::Terminate)
}

/// The bit of [`Shared::posts`] that says the transport takes no more work requests.
const POSTS_STOPPED: usize = 1 << (usize::BITS - 1);

/// A post under way, counted in [`Shared::posts`] until it is dropped.
struct PostUnderWay<'a>(&'a AtomicUsize);

impl Drop for PostUnderWay<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// A transport's count of the work requests it took from a queue pair's command channel, from
/// which it publishes how many have left the queue pair's send and receive queues (taken, less
/// those still in them: [`rdmap::QueuePair::send_queue_used`], `recv_queue_used`). A post
/// counts against its queue's depth from the moment it is posted until the published count
/// passes it ([`QueuePair::post_send`]), so a post to a full queue fails at once
/// ([`DatapathError::SendQueueFull`], verbs' `ENOMEM`) and the channel never holds more work
/// requests than the depths allow. The counts wrap: receives posted with the connect or accept
/// (`connect_with_recvs`, `accept_with_recvs`) are in the queue pair without having been
/// taken, and the application's posted count less the published one is then what the channel
/// and the queue pair hold, exactly.
#[derive(Debug, Default)]
pub(crate) struct QueueAccount {
    sends_taken: u64,
    recvs_taken: u64,
}

impl QueueAccount {
    /// The transport took `cmd` from the channel.
    pub(crate) fn took(&mut self, cmd: &Cmd) {
        match cmd {
            Cmd::Send(_) | Cmd::SendInline(_) => self.sends_taken += 1,
            Cmd::Recv(_) => self.recvs_taken += 1,
            Cmd::Close | Cmd::Panic => {}
        }
    }

    /// Publishes what has left `qp`'s queues. The transport calls this before it hands
    /// completions to the completion queue, so that an application that polls a completion
    /// and posts again finds the place free.
    pub(crate) fn publish(&self, qp: &rdmap::QueuePair, shared: &Shared) {
        let sends = self.sends_taken.wrapping_sub(qp.send_queue_used() as u64);
        let recvs = self.recvs_taken.wrapping_sub(qp.recv_queue_used() as u64);
        shared.retired.sends.store(sends, Ordering::Release);
        shared.retired.recvs.store(recvs, Ordering::Release);
    }
}

/// Posts the receives an application gave with its connect or accept
/// ([`crate::Device::connect_with_recvs`], `ConnectRequest::accept_with_recvs`), before the queue
/// pair can receive anything: iWARP has no receiver-not-ready retry, so a Send the peer sends at
/// once must find them (RFC 5041 7.1). More than the receive queue's depth is `RecvQueueFull`
/// (`InvalidArgument` for a queue pair without a receive queue); any with a shared receive queue
/// attached is `InvalidWorkRequest`, as `post_recv` on such a queue pair; a receive the queue pair
/// refuses otherwise (a region it cannot write) is `InvalidArgument`.
pub(crate) fn post_initial_recvs<B: rdmap::memory::RegionBuffer>(
    qp: &mut rdmap::QueuePair,
    mem: &rdmap::MemoryTable<B>,
    recvs: Vec<RecvWr>,
) -> Result<(), DatapathError> {
    for wr in recvs {
        qp.post_recv(wr, mem).map_err(|e| match e {
            rdmap::RdmapError::RecvQueueFull if qp.config().rq_depth == 0 => no_receive_queue(),
            rdmap::RdmapError::RecvQueueFull => DatapathError::RecvQueueFull {
                depth: qp.config().rq_depth,
            },
            e @ rdmap::RdmapError::SrqAttached => DatapathError::InvalidWorkRequest(e),
            _ => DatapathError::InvalidArgument("receive work request refused"),
        })?;
    }
    Ok(())
}

/// A receive posted to a queue pair made without a receive queue (`rq_depth` 0, no SRQ):
/// `ibv_post_recv`'s `EINVAL`, as siw's; a full queue's `ENOMEM` would have a verbs program
/// poll and post again for ever.
fn no_receive_queue() -> DatapathError {
    DatapathError::InvalidArgument("the queue pair has no receive queue (rq_depth 0)")
}

/// Takes a place for one post in a queue of `depth` whose posts are counted in `posted` and
/// whose departures the transport publishes in `retired` ([`QueueAccount`]); false when the
/// queue is full.
fn reserve(posted: &AtomicU64, retired: &AtomicU64, depth: usize) -> bool {
    let mut n = posted.load(Ordering::Relaxed);
    loop {
        if n.wrapping_sub(retired.load(Ordering::Acquire)) >= depth as u64 {
            return false;
        }
        match posted.compare_exchange_weak(
            n,
            n.wrapping_add(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return true,
            Err(now) => n = now,
        }
    }
}

/// What [`Shared::set_on_finish`] calls.
pub(crate) type FinishHook = Box<dyn FnOnce(Option<QpError>) + Send>;

/// A hook for the connection's end, and whether one ran (or notifications were stopped): the
/// end is reported once, however many hooks were set (one set after the end runs at once,
/// unless one ran already).
#[derive(Default)]
struct FinishSlot {
    hook: Option<FinishHook>,
    ran: bool,
}

impl FinishSlot {
    /// The hook to run now for the end (at most one over the slot's life).
    fn take_for_the_end(&mut self, hook: Option<FinishHook>) -> Option<FinishHook> {
        if self.ran {
            return None;
        }
        let hook = hook.or_else(|| self.hook.take());
        self.ran = hook.is_some();
        hook
    }
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
            on_finish: Mutex::new(FinishSlot::default()),
            on_finish_async: Mutex::new(FinishSlot::default()),
            posts: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
            reset: AtomicBool::new(false),
            retired: RetiredCounts {
                sends: AtomicU64::new(0),
                recvs: AtomicU64::new(0),
            },
            posted: PostedCounts {
                sends: AtomicU64::new(0),
                recvs: AtomicU64::new(0),
            },
            refusing_posts: AtomicBool::new(refuses_posts_in(state)),
            refused_while_ending: AtomicU64::new(0),
            end_wait_given_up: AtomicBool::new(false),
        })
    }

    /// Completes a send work request the transport took and the queue pair refused with `e`,
    /// in its place: one that failed its local checks (an invalid local STag or element, a
    /// message too long) fails there (after the Reads and Atomics before it if `taken` is
    /// fenced) and then fails the queue pair, as a verbs device does when it reaches it
    /// (`rdmap::QueuePair::fail_send_in_place`); one refused because the queue pair was ending
    /// completes flushed, the queue pair as it is.
    pub(crate) fn refuse_taken_send(
        &self,
        qp: &mut rdmap::QueuePair,
        taken: TakenSend,
        e: &rdmap::RdmapError,
    ) {
        let TakenSend {
            wr_id,
            opcode,
            fence,
        } = taken;
        let status = self.refusal_status(e);
        if fails_the_queue_pair(e) {
            qp.fail_send_in_place(wr_id, opcode, status, fence);
        } else {
            qp.complete_send_in_error(wr_id, opcode, status);
        }
    }

    /// [`Shared::refuse_taken_send`] for a receive: one that failed its local checks
    /// completes after the receives before it and then fails the queue pair
    /// (`rdmap::QueuePair::fail_recv_in_place`), so that no Send meant for it lands in the
    /// receive after it.
    pub(crate) fn refuse_taken_recv(
        &self,
        qp: &mut rdmap::QueuePair,
        wr_id: u64,
        e: &rdmap::RdmapError,
    ) {
        let status = self.refusal_status(e);
        if fails_the_queue_pair(e) {
            qp.fail_recv_in_place(wr_id, status);
        } else {
            qp.complete_recv_in_error(wr_id, status);
        }
    }

    /// The completion status of a work request the queue pair refused when the transport
    /// took it ([`local_status`]); one refused because the queue pair was ending is counted.
    pub(crate) fn refusal_status(&self, e: &rdmap::RdmapError) -> WcStatus {
        if matches!(
            e,
            rdmap::RdmapError::InvalidState {
                state: QpState::Closing | QpState::Terminate
            }
        ) {
            self.refused_while_ending.fetch_add(1, Ordering::Relaxed);
        }
        local_status(e)
    }

    /// The queue pair is closing or terminating ([`refuses_posts_in`]).
    fn refuses_posts(&self) -> bool {
        self.refusing_posts.load(Ordering::Acquire)
    }

    /// Asks the transport to reset the connection now ([`QueuePair::abort`], and
    /// [`QueuePair::disconnect`] after its graceful wait). `reset`: `abort` itself, whose
    /// peer must see the reset; `disconnect` only needs the transport done with the queue
    /// pair's memory (a close whose data is all in the kernel may end without a reset).
    pub(crate) fn request_abort(&self, reset: bool) {
        if reset {
            self.reset.store(true, Ordering::Release);
        }
        self.abort.store(true, Ordering::Release);
    }

    /// Whether [`QueuePair::abort`] asked for the reset ([`Shared::request_abort`] with
    /// `reset`).
    pub(crate) fn reset_requested(&self) -> bool {
        self.reset.load(Ordering::Acquire)
    }

    /// Whether posts have stopped ([`Shared::stop_posts`]).
    fn posts_stopped(&self) -> bool {
        self.posts.load(Ordering::Relaxed) & POSTS_STOPPED != 0
    }

    /// Whether [`Shared::request_abort`] was called.
    pub(crate) fn abort_requested(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    /// Queues a work request for the transport through the gate of [`Shared::posts`], or
    /// refuses it once the transport stopped taking work.
    fn queue(&self, cmds: &Sender<Cmd>, cmd: Cmd) -> Result<(), DatapathError> {
        // Refused without counting once stopped, so that posts retried in a loop cannot keep
        // `stop_posts` waiting; the `fetch_add` below decides.
        if self.posts.load(Ordering::Relaxed) & POSTS_STOPPED != 0 {
            return Err(DatapathError::Disconnected);
        }
        let _under_way = PostUnderWay(&self.posts);
        if self.posts.fetch_add(1, Ordering::Relaxed) & POSTS_STOPPED != 0 {
            return Err(DatapathError::Disconnected);
        }
        cmds.send(cmd).map_err(|_| DatapathError::Disconnected)
    }

    /// Stops taking work requests: posts from now on never reach the transport (they fail with
    /// [`DatapathError::Disconnected`], or once the queue pair has finished in Error complete
    /// flushed at once: `PostPath::post_after_the_end`). Waits for the posts under way to be
    /// queued, then
    /// completes those still queued in `cmds` as flushed (`WrFlushError`, as the queue pair's
    /// own outstanding work requests complete when it ends) through `complete`, and returns.
    pub(crate) fn stop_posts(
        &self,
        cmds: Option<&Receiver<Cmd>>,
        mut complete: impl FnMut(WorkCompletion),
    ) {
        self.posts.fetch_or(POSTS_STOPPED, Ordering::AcqRel);
        // A post under way only queues its request: this wait is as short as a channel send
        // (longer only if the posting thread is descheduled in it).
        while self.posts.load(Ordering::Acquire) & !POSTS_STOPPED != 0 {
            std::thread::yield_now();
        }
        let Some(cmds) = cmds else {
            return;
        };
        while let Ok(cmd) = cmds.try_recv() {
            if let Some(wc) = cmd.flushed() {
                complete(wc);
            }
        }
    }

    /// [`Shared::stop_posts`] for a transport still holding `qp`: queued receives complete on
    /// `cq` (none if the caller never got the queue pair) at once, as the queue pair's own
    /// flushed receives did; queued send requests complete behind the queue pair's own
    /// ([`rdmap::QueuePair::complete_send_in_error`]), which the transport hands out next.
    pub(crate) fn stop_posts_behind(
        &self,
        cmds: Option<&Receiver<Cmd>>,
        qp: &mut rdmap::QueuePair,
        cq: Option<&CqSink>,
        qp_num: u32,
    ) {
        self.stop_posts(cmds, |wc| {
            if wc.opcode == WcOpcode::Recv {
                if let Some(cq) = cq {
                    // At the end: a completion lost here only marks the queue overrun.
                    let _ = cq.push(Completion { qp_num, wc });
                }
            } else {
                qp.complete_send_in_error(wc.wr_id, wc.opcode, wc.status);
            }
        });
    }

    /// Calls `hook` once the transport has finished with the connection (at once if it has).
    pub(crate) fn set_on_finish(&self, hook: FinishHook) {
        self.set_finish_hook(&self.on_finish, hook);
    }

    /// [`Shared::set_on_finish`] for an asynchronous event channel: a hook of its own, so
    /// that it and the connection manager's are both called.
    pub(crate) fn set_on_finish_async(&self, hook: FinishHook) {
        self.set_finish_hook(&self.on_finish_async, hook);
    }

    /// Drops both end hooks, and those set later ([`QueuePair::stop_notifications`]).
    fn stop_finish_hooks(&self) {
        for slot in [&self.on_finish, &self.on_finish_async] {
            let hook = {
                let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
                slot.ran = true;
                slot.hook.take()
            };
            // Dropped outside the lock: a hook holds channels only weakly, but drops nothing
            // that could come back here.
            drop(hook);
        }
    }

    /// Sets the hook of `slot`, or runs it at once if the connection has ended, unless a hook
    /// of the slot ran for the end already (then it is dropped: one end is reported once).
    fn set_finish_hook(&self, slot: &Mutex<FinishSlot>, hook: FinishHook) {
        let (hook, error) = {
            let st = self.lock();
            let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
            if !st.finished {
                slot.hook = Some(hook);
                return;
            }
            (slot.take_for_the_end(Some(hook)), st.error.clone())
        };
        if let Some(hook) = hook {
            hook(error);
        }
    }

    /// [`QueuePair::abort`] (`ibv_modify_qp` to Error) of a queue pair the transport has
    /// finished with already (a graceful close, or the peer's, that ended first): the state
    /// becomes Error, so that later posts complete flushed (a drain) rather than being refused.
    fn enter_error_if_finished(&self) {
        let mut st = self.lock();
        if st.finished {
            self.set_state(&mut st, QpState::Error);
        }
    }

    /// Sets the published state, and the lock-free copy posts read ([`refuses_posts_in`]).
    fn set_state(&self, st: &mut QpStatus, state: QpState) {
        st.state = state;
        self.refusing_posts
            .store(refuses_posts_in(state), Ordering::Release);
    }

    /// The transport has finished with the connection: the status is final, and posts never
    /// reach it again (refused, or flushed by the handle in Error)
    /// (see [`Shared::stop_posts`], which the transport calls first to flush what is queued).
    pub(crate) fn mark_finished(&self, state: QpState) {
        self.stop_posts(None, |_| {});
        let error = {
            let mut st = self.lock();
            if st.finished {
                // Final already (see `publish`).
                return;
            }
            self.set_state(&mut st, state);
            st.finished = true;
            st.error.clone()
        };
        for slot in [&self.on_finish, &self.on_finish_async] {
            let hook = slot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take_for_the_end(None);
            if let Some(hook) = hook {
                hook(error.clone());
            }
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, QpStatus> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what ended the connection, unless a cause is known already. A Terminate the
    /// peer sent (`remote`) is the cause of whatever failed after it (the peer closes once it
    /// has sent one).
    pub(crate) fn set_error(&self, error: QpError, remote: Option<TerminateInfo>) {
        let error = remote.map_or(error, QpError::RemoteTerminate);
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
        // Once finished the state is final (a later turn of a transport that still holds the
        // connection, in TIME-WAIT say, changes nothing; `abort`'s Error stays).
        if !st.finished {
            self.set_state(&mut st, state);
        }
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

/// One work request of a send chain ([`QueuePair::post_send_list`]): one whose payload is
/// in registered memory, or one that carries it inline (`IBV_SEND_INLINE` set on that request
/// of the chain).
#[derive(Debug, Clone)]
pub enum SendRequest {
    /// As [`QueuePair::post_send`] takes it.
    Wr(SendWr),
    /// As [`QueuePair::post_send_inline`] takes it.
    Inline(InlineSendWr),
}

impl From<SendWr> for SendRequest {
    fn from(wr: SendWr) -> Self {
        SendRequest::Wr(wr)
    }
}

impl From<InlineSendWr> for SendRequest {
    fn from(wr: InlineSendWr) -> Self {
        SendRequest::Inline(wr)
    }
}

/// How a queue pair handle wakes the transport that runs it after queueing a command: the
/// socket transport's per-connection `mio` poll, or the AF_XDP engine of the interface.
pub(crate) trait QpWaker: Send + Sync {
    /// The transport has a command to take.
    fn wake(&self) -> io::Result<()>;
}

static NEXT_QP: AtomicU32 = AtomicU32::new(1);

/// A new queue pair number (`ibv_qp.qp_num`): one counter for both transports, so that
/// numbers are unique in the process.
pub(crate) fn next_qp_num() -> u32 {
    NEXT_QP.fetch_add(1, Ordering::Relaxed)
}

/// What a transport starts a queue pair with from the application: its number, taken when
/// the application created it ([`crate::IdleQp::num`]) or at the connect or accept, and the
/// receives posted before its connection ([`post_initial_recvs`]).
pub(crate) struct QpStart {
    pub(crate) num: u32,
    pub(crate) recvs: Vec<RecvWr>,
    /// For a queue pair created before ([`crate::IdleQp`]): the receives its
    /// [`crate::QpPoster`]s take while it starts, which the transport hands to the running
    /// queue pair ([`StartingPosts::run`]) before it can deliver any completion.
    pub(crate) posters: Option<Box<dyn StartingPosts>>,
}

/// The receives a queue pair's [`crate::QpPoster`]s take while its connect or accept starts
/// it, for the transport that starts it ([`QpStart::posters`]; made in `verbs::idle`).
///
/// The transport takes them into its queue pair before it places any received data
/// ([`StartingPosts::take`]: the data that follows an MPA Reply may be the peer's first
/// Sends) and, once it has the queue pair running and before it can deliver any of its
/// completions, makes it the posters' ([`StartingPosts::run`]); the start's end does that
/// too if it comes first (the application gets the queue pair only after it), so that
/// posters and the queue pair post through one path, counted once and in order. Until then
/// the posters count the receive queue as if none of those it holds had completed: an
/// overcount only, and no completion reaches the application before the hand-over.
pub(crate) trait StartingPosts: Send {
    /// Hands the receives posted since the last call to `post`, in order, which posts each
    /// to the transport's queue pair as it would one taken from the command channel (one it
    /// refuses completes in error in its place); they are the transport's from now on,
    /// flushed by the start's end should the start fail. Nothing once the posters run. Posts
    /// wait meanwhile: a transport whose caller may already post through the queue pair
    /// publishes its queue account in `post`.
    fn take(&self, post: &mut dyn FnMut(RecvWr));

    /// The queue pair runs on `path`: the receives posted since the last
    /// [`StartingPosts::take`] go to `post` as there, then every post goes to `path`. Call it
    /// with the queue account published (in `post` too), before the queue pair's
    /// completions can reach the application. Nothing if the start's end came first (it
    /// queued them to `path`).
    fn run(self: Box<Self>, path: &PostPath, post: &mut dyn FnMut(RecvWr));
}

impl QpStart {
    /// A queue pair created by the connect or accept itself, with `recvs` posted first.
    pub(crate) fn with_recvs(recvs: Vec<RecvWr>) -> QpStart {
        QpStart {
            num: next_qp_num(),
            recvs,
            posters: None,
        }
    }
}

/// A connected queue pair (RFC 5040 2: one RDMAP stream over one MPA/TCP connection).
///
/// Work requests are handed to the engine thread without blocking; their results arrive on the
/// completion queue given at connect/accept time. Dropping the queue pair closes the connection.
pub struct QueuePair {
    path: PostPath,
    agreed: Agreed,
    mulpdu: usize,
    local: SocketAddr,
    peer: SocketAddr,
    tos: u8,
    /// [`QpParts::close_timeout`].
    close_timeout: Duration,
    /// The transport's thread for this connection alone, joined by the first disconnect or
    /// abort once it has finished (the socket transport's; the AF_XDP engine's thread is
    /// shared).
    thread: Mutex<Option<JoinHandle<()>>>,
    /// That thread's id, kept after the handle is taken: a disconnect or drop on that very
    /// thread (a finish hook letting go of the last handle) neither waits for it nor joins it.
    thread_id: Option<ThreadId>,
}

/// What posting work requests to a running queue pair takes: its command channel to the
/// transport and the state the transport publishes. The [`QueuePair`] holds it, and so does
/// every [`crate::QpPoster`] of the queue pair once it runs, so that posts through either
/// count against the same queue depths and pass the same gate.
#[derive(Clone)]
pub(crate) struct PostPath {
    num: u32,
    cmds: Sender<Cmd>,
    waker: Arc<dyn QpWaker>,
    shared: Arc<Shared>,
    sq_depth: usize,
    rq_depth: usize,
    /// Receives come from a shared receive queue: `post_recv` refuses them.
    srq: bool,
    /// The RFC 7306 extensions are on: their opcodes may be posted.
    extensions: bool,
    /// The agreed ORD: a Read or Atomic with ORD 0 could never be sent.
    ord: u16,
    /// The queue pair's completion queues, where a work request posted once the transport
    /// has finished with the queue pair in Error completes, flushed.
    cq: Option<CqSink>,
}

/// A queue pair's attributes and capabilities, as `ibv_query_qp` reports them
/// ([`QueuePair::attr`]; before the connection, [`crate::IdleQp::attr`], where what only the
/// connection decides is not known yet: IRD and ORD are those a connect asks for, MULPDU is 0,
/// the peer's address unspecified and ours unless the parameters name it, as verbs reports no
/// path MTU before RTR).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpAttr {
    /// The RDMAP state (`qp_state`).
    pub state: QpState,
    /// Send queue depth (`cap.max_send_wr`).
    pub sq_depth: usize,
    /// Receive queue depth (`cap.max_recv_wr`); 0 on a queue pair fed by a shared receive
    /// queue, which takes no receives of its own.
    pub rq_depth: usize,
    /// Elements per scatter/gather list (`cap.max_send_sge`, `cap.max_recv_sge`): [`MAX_SGE`];
    /// a Read's sink is one (`max_sge_rd`).
    pub max_sge: usize,
    /// Octets a Send or Write may carry inline (`cap.max_inline_data`): [`MAX_INLINE_DATA`].
    pub max_inline_data: usize,
    /// Our IRD: Read and Atomic Requests the peer may have outstanding at us
    /// (`max_dest_rd_atomic`).
    pub ird: u16,
    /// Our ORD: Read and Atomic Requests we may have outstanding at the peer
    /// (`max_rd_atomic`).
    pub ord: u16,
    /// The largest DDP segment this connection sends (RFC 5044 4.5; what `path_mtu` stands for).
    pub mulpdu: usize,
    /// Receives come from a shared receive queue (`init_attr.srq`).
    pub srq: bool,
    /// The RDMAP extensions of RFC 7306 (Atomics, Immediate Data) are on.
    pub extensions: bool,
    /// Our address (`rdma_get_local_addr`).
    pub local: SocketAddr,
    /// The peer's address (`rdma_get_peer_addr`).
    pub peer: SocketAddr,
    /// The IP Type of Service octet set for the connection
    /// ([`ConnectParams::tos`](crate::ConnectParams::tos): `rdma_set_option`'s
    /// `RDMA_OPTION_ID_TOS`; `ah_attr.grh.traffic_class` of `ibv_query_qp`); an accepted
    /// connection's is its listener's. (The AF_XDP engine sends it with the ECN field clear.)
    pub tos: u8,
}

/// What the two ends of a connection agreed on when it started.
#[derive(Debug, Clone)]
pub enum Agreed {
    /// MPA's Request and Reply (RFC 5044 7.1, RFC 6581).
    Mpa(Negotiated),
    /// IFT's adaption indications (draft-williams-iwarp-ift-01 section 4), and the IRD and ORD
    /// both ends are configured with (IFT negotiates neither).
    Ift {
        /// The frame formats of both directions, the VTags, speculative placement.
        negotiated: ift::Negotiated,
        /// Our IRD.
        ird: u16,
        /// Our ORD.
        ord: u16,
    },
}

impl Agreed {
    /// Our IRD: Read Requests the peer may have outstanding at us.
    pub fn ird(&self) -> u16 {
        match self {
            Agreed::Mpa(n) => n.ird,
            Agreed::Ift { ird, .. } => *ird,
        }
    }

    /// Our ORD: Read Requests we may have outstanding at the peer.
    pub fn ord(&self) -> u16 {
        match self {
            Agreed::Mpa(n) => n.ord,
            Agreed::Ift { ord, .. } => *ord,
        }
    }

    /// The framing's name: "mpa" or "ift".
    pub fn framing(&self) -> &'static str {
        match self {
            Agreed::Mpa(_) => "mpa",
            Agreed::Ift { .. } => "ift",
        }
    }
}

/// What an engine hands over to build the application's [`QueuePair`] handle.
pub(crate) struct QpParts {
    pub(crate) num: u32,
    pub(crate) cmds: Sender<Cmd>,
    pub(crate) waker: Arc<dyn QpWaker>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) agreed: Agreed,
    pub(crate) mulpdu: usize,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
    /// The IP Type of Service octet its segments carry.
    pub(crate) tos: u8,
    /// The transport's thread for this connection alone, if it has one.
    pub(crate) thread: Option<JoinHandle<()>>,
    /// The queue pair's send and receive queue depths ([`rdmap::QpConfig`]).
    pub(crate) sq_depth: usize,
    pub(crate) rq_depth: usize,
    /// The queue pair takes its receives from a shared receive queue.
    pub(crate) srq: bool,
    /// The RDMAP extensions of RFC 7306 are on ([`rdmap::QpConfig::extensions`]).
    pub(crate) extensions: bool,
    /// The completion queues the transport delivers the queue pair's completions to.
    pub(crate) cq: Option<CqSink>,
    /// How long [`QueuePair::disconnect`] waits for the transport to close the connection
    /// gracefully before it resets it ([`crate::ConnectParams::close_timeout`]; the
    /// transport resets it itself after as long).
    pub(crate) close_timeout: Duration,
}

/// How long [`QueuePair::disconnect`] waits for the reset that follows a graceful close that
/// did not finish in its close timeout, and [`QueuePair::abort`] for its reset.
const ABORT_WAIT: Duration = Duration::from_secs(2);
/// How often a disconnect or abort looks whether the transport has finished.
const END_POLL: Duration = Duration::from_millis(1);

impl QpParts {
    /// The post path of the queue pair these parts make.
    pub(crate) fn post_path(&self) -> PostPath {
        PostPath {
            num: self.num,
            cmds: self.cmds.clone(),
            waker: self.waker.clone(),
            shared: self.shared.clone(),
            sq_depth: self.sq_depth,
            rq_depth: self.rq_depth,
            srq: self.srq,
            extensions: self.extensions,
            ord: self.agreed.ord(),
            cq: self.cq.clone(),
        }
    }
}

impl QueuePair {
    pub(crate) fn from_parts(p: QpParts) -> QueuePair {
        QueuePair {
            path: p.post_path(),
            agreed: p.agreed,
            mulpdu: p.mulpdu,
            local: p.local,
            peer: p.peer,
            tos: p.tos,
            close_timeout: p.close_timeout,
            thread_id: p.thread.as_ref().map(|t| t.thread().id()),
            thread: Mutex::new(p.thread),
        }
    }

    /// Its post path, for its [`crate::QpPoster`]s.
    pub(crate) fn post_path(&self) -> &PostPath {
        &self.path
    }

    /// The state the transport publishes.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.path.shared
    }

    /// Local queue pair number (also in every [`Completion`](crate::Completion)).
    pub fn num(&self) -> u32 {
        self.path.num
    }

    /// The MPA parameters both sides agreed on; `None` on an IFT connection
    /// ([`QueuePair::agreed`]).
    pub fn negotiated(&self) -> Option<&Negotiated> {
        match &self.agreed {
            Agreed::Mpa(n) => Some(n),
            Agreed::Ift { .. } => None,
        }
    }

    /// What the connection's startup agreed on, MPA's or IFT's.
    pub fn agreed(&self) -> &Agreed {
        &self.agreed
    }

    /// Largest ULPDU (DDP segment) this connection sends, from the TCP MSS (RFC 5044 4.5).
    pub fn mulpdu(&self) -> usize {
        self.mulpdu
    }

    /// The peer's address (`rdma_get_peer_addr`).
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Our address of the connection (`rdma_get_local_addr`): the interface's address and the
    /// port the connection uses.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The queue pair's attributes and capabilities in one (`ibv_query_qp`).
    pub fn attr(&self) -> QpAttr {
        QpAttr {
            state: self.status().state,
            sq_depth: self.path.sq_depth,
            rq_depth: if self.path.srq { 0 } else { self.path.rq_depth },
            max_sge: MAX_SGE,
            max_inline_data: MAX_INLINE_DATA,
            ird: self.agreed.ird(),
            ord: self.agreed.ord(),
            mulpdu: self.mulpdu,
            srq: self.path.srq,
            extensions: self.path.extensions,
            local: self.local,
            peer: self.peer,
            tos: self.tos,
        }
    }

    /// Posts a Send, RDMA Write or RDMA Read (RFC 5040 5). A full send queue
    /// ([`ConnectParams::sq_depth`](crate::ConnectParams::sq_depth) work requests posted and
    /// not yet completed) fails the post with [`DatapathError::SendQueueFull`] and queues
    /// nothing (`ibv_post_send`'s `ENOMEM`); a request leaves the queue when its completion
    /// reaches the completion queue (an unsignaled one when it would have). A request wrong
    /// by itself ([`rdmap::SendWr::check_shape`]: an extension's opcode without the RFC 7306
    /// extensions, a Read with more than one sink element, a Read or Atomic where the agreed
    /// ORD is 0, ...) fails the post with
    /// [`DatapathError::InvalidWorkRequest`] (`EINVAL`) and queues nothing. Other local
    /// errors (bad local STag, a message longer than the peer allows) come back as an error
    /// completion. Once the queue pair is closing or terminating (RDMAP Closing, Terminate),
    /// or the transport has stopped taking work requests (after the application's
    /// `disconnect`, or as the connection ends) and has not finished with the queue pair in
    /// Error, posts fail with [`DatapathError::Disconnected`] (siw's `ENOTCONN`) and nothing
    /// is queued. In Error (the connection failed, was reset or aborted) they are taken and
    /// complete flushed (`WrFlushError`), as verbs flushes them, also once the transport has
    /// finished with the queue pair (a drain: post a marker and wait for its completion). A
    /// request accepted always completes (`WrFlushError` if the connection ended first).
    pub fn post_send(&self, wr: SendWr) -> Result<(), DatapathError> {
        self.path.post_send(wr)
    }

    /// Posts a Send or RDMA Write that carries its payload itself (`ibv_post_send` with
    /// `IBV_SEND_INLINE`): the octets were copied into [`InlineSendWr::data`], so the
    /// application's buffer is free again as soon as this returns, and it need not be
    /// registered. A Read, an Atomic or a lone Immediate Data message (they carry no payload to
    /// inline) fails the post with [`DatapathError::InvalidWorkRequest`] and queues nothing.
    pub fn post_send_inline(&self, wr: InlineSendWr) -> Result<(), DatapathError> {
        self.path.post_send_inline(wr)
    }

    /// Posts a list of Sends, RDMA Writes and RDMA Reads in order, with one wake-up of the
    /// transport for the whole list (`ibv_post_send` with a chain of work requests; perftest's
    /// `-l`). Returns how many were posted; if the send queue fills, a request is refused by
    /// itself ([`DatapathError::InvalidWorkRequest`]) or the queue pair is gone part way,
    /// [`PostListError::posted`] says how many went before (verbs' `bad_wr`): those are queued
    /// and complete, the rest are not.
    ///
    /// Requests that carry their payload inline may be in the chain too ([`SendRequest`]:
    /// `IBV_SEND_INLINE` on some of a chain's requests), each checked as
    /// [`QueuePair::post_send_inline`] checks it.
    pub fn post_send_list<W: Into<SendRequest>>(
        &self,
        wrs: impl IntoIterator<Item = W>,
    ) -> Result<usize, PostListError> {
        self.path.post_send_list(wrs)
    }

    /// Posts a list of receives in order, with one wake-up of the transport for the whole list
    /// (`ibv_post_recv` with a chain of work requests; perftest's `--recv_post_list`). Returns
    /// how many were posted; each fails, or completes, as [`QueuePair::post_recv`] says, and
    /// [`PostListError::posted`] says how many went before the one that failed (verbs'
    /// `bad_wr`): those are queued and complete, the rest are not.
    pub fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<usize, PostListError> {
        self.path.post_recv_list(wrs)
    }

    /// Posts a receive buffer for incoming Sends. Fails, or completes, as [`QueuePair::post_send`]
    /// says; a full receive queue ([`ConnectParams::rq_depth`](crate::ConnectParams::rq_depth)
    /// receives posted and not yet used) with [`DatapathError::RecvQueueFull`]; a queue pair whose
    /// receives come from a shared receive queue
    /// ([`ConnectParams::srq`](crate::ConnectParams::srq)) refuses it with
    /// [`DatapathError::InvalidWorkRequest`] (`ibv_post_recv`'s `EINVAL`: post to the shared queue
    /// instead), one without a receive queue (`rq_depth` 0) with [`DatapathError::InvalidArgument`]
    /// (`EINVAL` too). A Send that reaches the transport after this returns finds the receive in
    /// place, however the peer heard of it (both transports take queued work requests before they
    /// place a connection's received data).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), DatapathError> {
        self.path.post_recv(wr)
    }

    /// A snapshot of the queue pair's state.
    pub fn status(&self) -> QpStatus {
        self.path
            .shared
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Ends the queue pair's event notifications: neither
    /// [`QueuePair::notify_disconnect`]'s `Disconnected` nor
    /// [`QueuePair::notify_async`]'s events are queued from now on, nor by a later call of
    /// either. For a queue pair about to be destroyed (`rdma_destroy_id`, `ibv_destroy_qp`):
    /// dropping it ends the connection, and the end would otherwise be reported after it,
    /// naming an object the application has freed. Events queued already stay queued, and so
    /// does one a transport thread is queueing at this moment (its hook taken already): an
    /// interface that must name no destroyed object drops events by the queue pair's number
    /// ([`QueuePair::num`], never reused).
    pub fn stop_notifications(&self) {
        self.path.shared.stop_finish_hooks();
    }

    /// Destroys the queue pair as iWARP's `rdma_destroy_id` / `ibv_destroy_qp` on a connected
    /// one does: abruptly (the kernel's iw_cm moves the queue pair to Error, siw drops the
    /// connection), without waiting for the peer. [`QueuePair::stop_notifications`], then
    /// [`QueuePair::abort`] (the connection reset, outstanding work requests flushed; waits
    /// at most 2 s for the transport to let go of the memory, and a transport that does not
    /// answer at all 2 s more as the handle drops), then the handle is dropped.
    /// Dropping a connected queue pair instead closes gracefully ([`QueuePair::disconnect`]),
    /// which may wait up to 12 s for a peer that stopped reading.
    pub fn destroy(self) {
        self.stop_notifications();
        self.abort();
    }

    /// Waits until the transport has finished with the queue pair ([`QpStatus::finished`]) or
    /// `timeout` passes; true when it has.
    pub fn wait_finished(&self, timeout: Duration) -> bool {
        poll_until(timeout, Duration::from_millis(2), || self.status().finished)
    }

    /// Closes the connection: outstanding work requests complete as flushed, the socket is
    /// shut down, and the transport's thread for the connection (the socket transport's) is
    /// joined. A graceful close that has not finished within its close timeout
    /// ([`ConnectParams::close_timeout`](crate::ConnectParams::close_timeout), 10 s by
    /// default: a peer that stopped
    /// reading or acknowledging keeps our data and FIN in flight) becomes a reset, waited for
    /// up to 2 s more (on the socket transport the reset drops what the kernel still held,
    /// and what the connection's thread had framed, which may include Sends and Writes that
    /// completed once framed): once this returns, the transport neither reads nor writes the queue
    /// pair's memory ([`QueuePair::status`]`.finished`; only a transport that does not answer
    /// at all leaves it false, and once one has not answered a disconnect's full wait, later
    /// disconnects and drops of the queue pair ask again and wait only the 2 s). Called on
    /// the connection's own transport thread (a finish hook dropping the last handle), or on
    /// any transport thread in a turn (an engine thread, an application thread polling
    /// inline, a hook or an event's drop there), it only queues the close: that thread cannot
    /// wait for itself. There it returns before the transport
    /// has finished ([`QpStatus::finished`] says when): memory is safe to free only after
    /// [`MemoryRegion::deregister`](crate::MemoryRegion::deregister)'s wait.
    ///
    /// Takes `&self` as `rdma_disconnect` takes a shared id: other threads may be posting
    /// meanwhile (their posts are taken and flushed, or refused with
    /// [`DatapathError::Disconnected`]), and several may disconnect at once (each returns once
    /// the queue pair has finished; on a transport thread, at once, as above).
    pub fn disconnect(&self) {
        let _ = self.start_disconnect();
        if self.on_own_thread() {
            return;
        }
        let ended = if self.path.shared.end_wait_given_up.load(Ordering::Acquire) {
            // An earlier wait gave up on this transport: the reset is asked for again, and
            // waited for its own time only.
            self.ended() || self.reset_within(ABORT_WAIT, false)
        } else {
            self.ended_within(self.close_timeout) || self.reset_within(ABORT_WAIT, false)
        };
        if !ended {
            self.give_up_end_wait();
            return;
        }
        self.join_thread();
    }

    /// A disconnect has waited its full time and the transport has not finished (it does not
    /// answer at all): said once; later disconnects and drops wait for its reset's time only.
    fn give_up_end_wait(&self) {
        if !self
            .path
            .shared
            .end_wait_given_up
            .swap(true, Ordering::AcqRel)
        {
            tracing::warn!(
                qp = self.path.num,
                "disconnect: the transport did not finish with the queue pair"
            );
        }
    }

    /// Work requests the transport took and refused because the queue pair was ending
    /// (RDMAP Closing or Terminate: posted just as the end began; they complete flushed).
    /// None is taken after the application's own close. For tests.
    #[doc(hidden)]
    pub fn refused_while_ending(&self) -> u64 {
        self.path
            .shared
            .refused_while_ending
            .load(Ordering::Relaxed)
    }

    /// Whether this is the transport's thread for this connection alone, or any thread in a
    /// transport's turn ([`TransportTurn`]): one that cannot wait for a transport to finish
    /// with a queue pair, since that may need this very thread (a queue pair dropped by a hook
    /// or with an event the turn delivered).
    fn on_own_thread(&self) -> bool {
        self.thread_id == Some(std::thread::current().id()) || TransportTurn::is_in()
    }

    /// Whether the transport has finished with the queue pair, or its own thread has ended
    /// (a thread that panicked never marks the queue pair finished).
    fn ended(&self) -> bool {
        self.path.shared.lock().finished
            || self
                .thread
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(JoinHandle::is_finished)
    }

    /// Waits up to `timeout` for [`QueuePair::ended`]; true when it has.
    fn ended_within(&self, timeout: Duration) -> bool {
        poll_until(timeout, END_POLL, || self.ended())
    }

    /// Asks the transport to reset the connection now (`reset`: [`QueuePair::abort`]'s, see
    /// [`Shared::request_abort`]) and waits up to `timeout` for it to finish; true when it
    /// has.
    fn reset_within(&self, timeout: Duration, reset: bool) -> bool {
        self.path.shared.request_abort(reset);
        // A wake even when the command channel is closed: the transport checks the request on
        // its connection's next turn.
        let _ = self.path.waker.wake();
        self.ended_within(timeout)
    }

    /// Joins the transport's own thread, if the queue pair has one and no other caller took
    /// it: called once the transport has finished with the queue pair, when all that is left
    /// of the thread is to return.
    fn join_thread(&self) {
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// Starts the graceful close of [`QueuePair::disconnect`] and returns at once, as
    /// `rdma_disconnect` does, its end reported later (`RDMA_CM_EVENT_DISCONNECTED`): by
    /// [`QueuePair::notify_disconnect`]'s event, [`QueuePair::status`]`.finished` or
    /// [`QueuePair::wait_finished`]. Until the end, outstanding work requests may still
    /// complete and the transport may still read and write the queue pair's memory; the
    /// close ends by the transport's own bounds (the retransmission limit,
    /// [`ConnectParams::user_timeout`](crate::ConnectParams::user_timeout), FIN-WAIT-2's
    /// timeout; on the socket transport, at most the close timeout reading a peer that still
    /// sends after our FIN), and on both transports by at most the close timeout
    /// ([`ConnectParams::close_timeout`](crate::ConnectParams::close_timeout), 10 s by
    /// default) for the peer to take what the queue
    /// pair had queued (and, on the engine, our FIN): behind a peer that reads a trickle or
    /// nothing the connection is then reset, as `disconnect` resets it (on the socket
    /// transport the reset also drops what the kernel and the connection's thread held: Sends
    /// and Writes complete there once the thread has framed them, up to 512 KiB ahead of the
    /// kernel, so some that completed may not arrive). A later
    /// `disconnect`, or dropping the handle, waits for the end as
    /// `disconnect` does (resetting the connection after the close timeout; see there for a
    /// transport
    /// that does not answer). Posts
    /// that follow the close are refused, or flushed once the queue pair has finished in
    /// Error. On a queue pair that is closing or has ended already it does nothing.
    pub fn start_disconnect(&self) -> Result<(), DatapathError> {
        match self.path.command(Cmd::Close) {
            Err(DatapathError::Disconnected) => Ok(()),
            other => other,
        }
    }

    /// Moves the queue pair to Error at once (`ibv_modify_qp` to `IBV_QPS_ERR`): the TCP connection
    /// is reset (RFC 9293 3.10.5 ABORT; the peer's queue pair ends with [`QpError::PeerReset`]),
    /// every outstanding and queued work request completes with [`WcStatus::WrFlushError`] (a Send
    /// or Write the peer has acknowledged whole may complete successfully first), and later posts
    /// complete at once, flushed (a drain: post a marker and wait for its completion). Unlike
    /// [`QueuePair::disconnect`], nothing waits for the peer: data it has not acknowledged is
    /// dropped. Returns once the transport has finished with the queue pair
    /// ([`QpStatus::finished`]), so that its memory may be deregistered or freed (on a transport
    /// thread, as below, it returns before: wait for `finished`). The abort records no
    /// [`QpStatus::error`] of its own (the application ended the connection). On a queue pair that
    /// has finished already (closed gracefully, say) it only moves the state to Error, as verbs'
    /// does from any state, so that the drain works there too.
    ///
    /// Waits up to 2 s for the transport (only one that does not answer at all takes longer:
    /// it returns then with [`QpStatus::finished`] false). Called on the connection's own
    /// transport thread, or any transport thread in a turn, it only asks for the reset, as
    /// [`QueuePair::disconnect`] there only queues the close, and returns before the
    /// transport has finished.
    pub fn abort(&self) {
        if self.on_own_thread() {
            self.path.shared.request_abort(true);
            let _ = self.path.waker.wake();
            self.path.shared.enter_error_if_finished();
            return;
        }
        if !self.reset_within(ABORT_WAIT, true) {
            tracing::warn!(
                qp = self.path.num,
                "abort: the transport did not finish with the queue pair"
            );
            // Later disconnects and drops ask again and wait the reset's time only, not the
            // graceful close's first.
            self.path
                .shared
                .end_wait_given_up
                .store(true, Ordering::Release);
            return;
        }
        self.join_thread();
        self.path.shared.enter_error_if_finished();
    }
}

impl PostPath {
    pub(crate) fn command(&self, cmd: Cmd) -> Result<(), DatapathError> {
        if self.queue(cmd)? {
            self.wake();
        }
        // Else completed by the handle: nothing for the transport.
        Ok(())
    }

    /// Wakes the transport for what was queued. A failed wake-up is logged, not returned: the
    /// request is queued and the transport takes it all the same at its next look (the AF_XDP
    /// engine finds the posted flag set at its next turn: it sleeps at most
    /// `XdpTcpConfig::max_wait`, parked for inline progress about 50 ms or its `park_max`; the
    /// socket transport's thread looks at least once a second). An error would read as "not posted"
    /// (verbs has no "posted, but" outcome), and the request would be posted twice.
    fn wake(&self) {
        static LINES: LogRate = LogRate::new(1);
        if let Err(e) = self.waker.wake() {
            if let Some(suppressed) = LINES.admit() {
                tracing::warn!(
                    qp = self.num,
                    suppressed,
                    "waking the transport failed ({e}): what was posted goes at its next look"
                );
            }
        }
    }

    /// Queues `cmd` for the transport (no wake-up), counting a work request against its
    /// queue's depth: a full queue refuses it with [`DatapathError::SendQueueFull`] or
    /// [`DatapathError::RecvQueueFull`]; once posts have stopped, see
    /// [`PostPath::post_after_the_end`]. Returns whether `cmd` was queued (the transport is
    /// to be woken) rather than completed by the handle.
    fn queue(&self, cmd: Cmd) -> Result<bool, DatapathError> {
        let (posted, retired, depth, full) = match &cmd {
            Cmd::Send(_) | Cmd::SendInline(_) => (
                &self.shared.posted.sends,
                &self.shared.retired.sends,
                self.sq_depth,
                DatapathError::SendQueueFull {
                    depth: self.sq_depth,
                },
            ),
            Cmd::Recv(_) => (
                &self.shared.posted.recvs,
                &self.shared.retired.recvs,
                self.rq_depth,
                DatapathError::RecvQueueFull {
                    depth: self.rq_depth,
                },
            ),
            Cmd::Close | Cmd::Panic => return self.shared.queue(&self.cmds, cmd).map(|()| true),
        };
        if self.shared.refuses_posts() {
            return Err(DatapathError::Disconnected);
        }
        if self.shared.posts_stopped() {
            return self.post_after_the_end(cmd).map(|()| false);
        }
        if !reserve(posted, retired, depth) {
            if self.shared.posts_stopped() {
                return Err(DatapathError::Disconnected);
            }
            return Err(full);
        }
        self.shared
            .queue(&self.cmds, cmd)
            .map(|()| true)
            .inspect_err(|_| {
                posted.fetch_sub(1, Ordering::Relaxed);
            })
    }

    /// A work request posted after the transport stopped taking them: once it has finished
    /// with the queue pair in Error, the request completes at once, flushed, as verbs flushes
    /// what is posted to a queue pair in the error state (siw's `siw_sq_flush_wr`, the drain
    /// of `ib_drain_qp`); otherwise (ended gracefully, or still ending) the post fails with
    /// [`DatapathError::Disconnected`], siw's `ENOTCONN`. A full completion queue refuses
    /// the flushed request ([`DatapathError::CompletionQueueFull`]).
    fn post_after_the_end(&self, cmd: Cmd) -> Result<(), DatapathError> {
        let in_error = {
            let st = self.shared.lock();
            st.finished && st.state == QpState::Error
        };
        match (&self.cq, cmd.flushed()) {
            (Some(cq), Some(wc)) if in_error => cq
                .offer(Completion {
                    qp_num: self.num,
                    wc,
                })
                .map_err(|_| DatapathError::CompletionQueueFull),
            _ => Err(DatapathError::Disconnected),
        }
    }

    /// [`QueuePair::post_send`].
    pub(crate) fn post_send(&self, wr: SendWr) -> Result<(), DatapathError> {
        probe::mark(Mark::Posted);
        self.check_send(&wr)?;
        self.command(Cmd::Send(wr))
    }

    /// The checks of a send work request before it is queued: by itself
    /// ([`rdmap::SendWr::check_shape`]) and against the agreed ORD (a Read or Atomic with ORD
    /// 0, [`rdmap::SendWr::check_ord`], could never be sent).
    fn check_send(&self, wr: &SendWr) -> Result<(), DatapathError> {
        wr.check_shape(self.extensions)
            .and_then(|()| wr.check_ord(self.ord))
            .map_err(DatapathError::InvalidWorkRequest)
    }

    /// [`QueuePair::post_send_inline`].
    pub(crate) fn post_send_inline(&self, wr: InlineSendWr) -> Result<(), DatapathError> {
        probe::mark(Mark::Posted);
        wr.check_shape(self.extensions)
            .map_err(DatapathError::InvalidWorkRequest)?;
        self.command(Cmd::SendInline(wr))
    }

    /// [`QueuePair::post_send_list`].
    pub(crate) fn post_send_list<W: Into<SendRequest>>(
        &self,
        wrs: impl IntoIterator<Item = W>,
    ) -> Result<usize, PostListError> {
        probe::mark(Mark::Posted);
        self.post_list(wrs.into_iter().map(|wr| {
            match wr.into() {
                SendRequest::Wr(wr) => self.check_send(&wr).map(|()| Cmd::Send(wr)),
                SendRequest::Inline(wr) => wr
                    .check_shape(self.extensions)
                    .map(|()| Cmd::SendInline(wr))
                    .map_err(DatapathError::InvalidWorkRequest),
            }
        }))
    }

    /// [`QueuePair::post_recv_list`].
    pub(crate) fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<usize, PostListError> {
        if let Err(source) = self.takes_recvs() {
            return Err(PostListError { posted: 0, source });
        }
        self.post_list(wrs.into_iter().map(|wr| Ok(Cmd::Recv(wr))))
    }

    /// Queues `cmds` one by one, each through the gate (the transport never waits on the
    /// caller's iterator), and wakes the transport once; stops at the first that fails.
    fn post_list(
        &self,
        cmds: impl Iterator<Item = Result<Cmd, DatapathError>>,
    ) -> Result<usize, PostListError> {
        let (mut posted, mut queued_any) = (0, false);
        for cmd in cmds {
            match cmd.and_then(|cmd| self.queue(cmd)) {
                Ok(queued) => queued_any |= queued,
                Err(source) => {
                    if queued_any {
                        // Those queued before are the transport's to run.
                        self.wake();
                    }
                    return Err(PostListError { posted, source });
                }
            }
            posted += 1;
        }
        if queued_any {
            self.wake();
        }
        Ok(posted)
    }

    /// [`QueuePair::post_recv`].
    pub(crate) fn post_recv(&self, wr: RecvWr) -> Result<(), DatapathError> {
        self.takes_recvs()?;
        self.command(Cmd::Recv(wr))
    }

    /// Whether the queue pair has a receive queue of its own to post to: not with a shared
    /// receive queue, nor with a depth of 0 ([`no_receive_queue`]; `EINVAL` for both, as
    /// siw's).
    fn takes_recvs(&self) -> Result<(), DatapathError> {
        if self.srq {
            return Err(DatapathError::InvalidWorkRequest(
                rdmap::RdmapError::SrqAttached,
            ));
        }
        if self.rq_depth == 0 {
            return Err(no_receive_queue());
        }
        Ok(())
    }
}

/// [`QueuePair::disconnect`] for several queue pairs at once: every close starts before any
/// wait, and the graceful bound (the longest of their close timeouts) and the 2 s reset bound
/// run for all of them together
/// (dropped one by one, each would wait its own). Where one of them could not wait (on a
/// transport thread) it only starts the closes, as `disconnect` there only queues.
pub(crate) fn disconnect_together(qps: &[&QueuePair]) {
    for qp in qps {
        let _ = qp.start_disconnect();
    }
    if qps.iter().any(|qp| qp.on_own_thread()) {
        return;
    }
    let all_ended_within =
        |timeout: Duration| poll_until(timeout, END_POLL, || qps.iter().all(|qp| qp.ended()));
    let close_timeout = qps.iter().map(|qp| qp.close_timeout).max();
    if !all_ended_within(close_timeout.unwrap_or_default()) {
        for qp in qps.iter().filter(|qp| !qp.ended()) {
            qp.path.shared.request_abort(false);
            let _ = qp.path.waker.wake();
        }
        let _ = all_ended_within(ABORT_WAIT);
    }
    for qp in qps {
        if qp.ended() {
            qp.join_thread();
        } else {
            qp.give_up_end_wait();
        }
    }
}

impl QueuePair {
    /// Makes the transport thread serving this queue pair panic when it takes the request, to
    /// test the failure path: on the socket transport the queue pair fails alone
    /// (`QpError::Local`), on the AF_XDP engine the engine fails (every queue pair
    /// `QpError::EngineFailed`). For tests only.
    #[doc(hidden)]
    pub fn inject_transport_panic(&self) -> Result<(), DatapathError> {
        self.path.command(Cmd::Panic)
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.disconnect();
    }
}

/// What a transport keeps of a send work request it hands to the queue pair, to complete it if
/// the queue pair refuses it ([`Shared::refuse_taken_send`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TakenSend {
    pub wr_id: u64,
    pub opcode: WcOpcode,
    pub fence: bool,
}

impl TakenSend {
    pub(crate) fn of(wr: &rdmap::SendWr) -> Self {
        TakenSend {
            wr_id: wr.wr_id,
            opcode: wr.op.wc_opcode(),
            fence: wr.fence,
        }
    }

    pub(crate) fn of_inline(wr: &rdmap::InlineSendWr) -> Self {
        TakenSend {
            wr_id: wr.wr_id,
            opcode: wr.op.wc_opcode(),
            fence: wr.fence,
        }
    }
}

/// Whether a work request the transport took and the queue pair refused with `e` fails the
/// queue pair in its place: it failed the checks of local memory a verbs device makes when it
/// reaches it (the local STag, its rights and bounds, the message length), which move that
/// queue pair to Error there.
fn fails_the_queue_pair(e: &rdmap::RdmapError) -> bool {
    use rdmap::RdmapError as E;
    matches!(
        e,
        E::LocalAccess { .. } | E::UnknownStag { .. } | E::MessageTooLong { .. }
    )
}

/// Completion status of a work request the queue pair refused when it was posted. One the
/// queue pair refused for its state is flushed (`WrFlushError`): in Error as verbs completes
/// it there (siw's `post_send` does the same) and as the queue pair's own work requests
/// were, so that a drain that posts a last request and waits for its completion sees what it
/// expects; in Closing or Terminate (a post that reached the transport just as the
/// connection began to end: later ones fail with `Disconnected`) because the queue pair is
/// ending, its outstanding requests flushed, and this one never runs either. A flushed
/// completion lost to a full completion queue fails nothing more.
pub(crate) fn local_status(e: &rdmap::RdmapError) -> WcStatus {
    use rdmap::RdmapError as E;
    match e {
        E::InvalidState { .. } => WcStatus::WrFlushError,
        E::LocalAccess { .. } | E::UnknownStag { .. } => WcStatus::LocalProtectionError,
        E::MessageTooLong { .. } => WcStatus::LocalLengthError,
        _ => WcStatus::LocalQpOperationError,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rdmap::SgeList;
    use std::time::Instant;

    /// A request the queue pair refuses for its state is flushed: in Error, and in the
    /// states where it can never run (Closing, Terminate) as the queue pair ends.
    #[test]
    fn a_request_refused_for_the_state_is_flushed() {
        let status = |state| local_status(&rdmap::RdmapError::InvalidState { state });
        assert_eq!(status(QpState::Error), WcStatus::WrFlushError);
        assert_eq!(status(QpState::Closing), WcStatus::WrFlushError);
        assert_eq!(status(QpState::Terminate), WcStatus::WrFlushError);
        let stag = rdmap::Stag(7);
        assert_eq!(
            local_status(&rdmap::RdmapError::UnknownStag { stag }),
            WcStatus::LocalProtectionError
        );
    }

    struct NoWake;
    impl QpWaker for NoWake {
        fn wake(&self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A queue pair handle over `shared`, and the transport's end of its command channel.
    fn handle(shared: Arc<Shared>) -> (QueuePair, Receiver<Cmd>) {
        handle_with_cq(shared, None)
    }

    /// [`handle`] whose completions go to `cq`.
    pub(crate) fn handle_with_cq(
        shared: Arc<Shared>,
        cq: Option<CqSink>,
    ) -> (QueuePair, Receiver<Cmd>) {
        handle_parts(shared, cq, None, Arc::new(NoWake))
    }

    /// [`handle`] whose transport thread, for this connection alone, is `thread`.
    fn handle_on_thread(shared: Arc<Shared>, thread: JoinHandle<()>) -> (QueuePair, Receiver<Cmd>) {
        handle_parts(shared, None, Some(thread), Arc::new(NoWake))
    }

    fn handle_parts(
        shared: Arc<Shared>,
        cq: Option<CqSink>,
        thread: Option<JoinHandle<()>>,
        waker: Arc<dyn QpWaker>,
    ) -> (QueuePair, Receiver<Cmd>) {
        let (cmds, rx) = crossbeam_channel::unbounded();
        let agreed = Agreed::Mpa(Negotiated {
            rev: 2,
            crc: true,
            markers_tx: false,
            markers_rx: false,
            ird: 4,
            ord: 4,
            rtr: None,
            responder_waits_for_fpdu: false,
            peer_params: None,
        });
        let qp = QueuePair::from_parts(QpParts {
            num: 1,
            cmds,
            waker,
            shared,
            agreed,
            mulpdu: 1000,
            local: "127.0.0.1:2".parse().unwrap(),
            peer: "127.0.0.1:1".parse().unwrap(),
            tos: 0,
            thread,
            sq_depth: 8,
            rq_depth: 8,
            srq: false,
            extensions: false,
            cq,
            close_timeout: Duration::from_secs(10),
        });
        (qp, rx)
    }

    /// A transport that cannot be woken.
    struct FailingWake;
    impl QpWaker for FailingWake {
        fn wake(&self) -> io::Result<()> {
            Err(io::Error::other("no wake-up"))
        }
    }

    /// A post whose wake-up failed is queued once and reported posted (the transport takes it
    /// at its next look): an error would have a verbs program post it again.
    #[test]
    fn a_failed_wake_up_still_reports_the_post() {
        let (qp, rx) = handle_parts(Shared::new(QpState::Rts), None, None, Arc::new(FailingWake));
        let recv = || RecvWr {
            wr_id: 1,
            sg_list: SgeList::default(),
        };
        qp.post_recv(recv()).expect("posted");
        assert_eq!(qp.post_recv_list([recv(), recv()]).expect("posted"), 2);
        assert_eq!(rx.try_iter().count(), 3, "each queued once");
        qp.start_disconnect().expect("the close queued");
        assert!(matches!(rx.try_recv(), Ok(Cmd::Close)));
        // This test is the transport: the close is done, and the drop need not wait the
        // close timeout for it.
        qp.shared().mark_finished(QpState::Idle);
    }

    /// A queue pair dropped on its own transport thread (a finish hook letting go of the last
    /// handle, as one holding an event channel with the connection queued on it may) returns
    /// at once: it neither joins that thread (a self-join, on which std panics) nor waits for
    /// it to finish, whether or not it has finished with the queue pair.
    #[test]
    fn a_queue_pair_dropped_on_its_own_thread_does_not_wait_for_itself() {
        for finished in [true, false] {
            let shared = Shared::new(QpState::Rts);
            if finished {
                shared.mark_finished(QpState::Idle);
            }
            let (qp_tx, qp_rx) = std::sync::mpsc::channel::<QueuePair>();
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            // The queue pair's "transport thread": it is handed the last handle and drops it.
            let thread = std::thread::spawn(move || {
                let Ok(qp) = qp_rx.recv() else {
                    return;
                };
                let started = Instant::now();
                let dropped =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(qp)));
                let _ = done_tx.send((dropped.is_ok(), started.elapsed()));
            });
            let (qp, _transport_end) = handle_on_thread(shared, thread);
            assert!(qp_tx.send(qp).is_ok(), "the thread is gone");
            let (dropped, took) = done_rx
                .recv_timeout(Duration::from_secs(30))
                .expect("the drop on the queue pair's own thread never returned");
            assert!(dropped, "finished {finished}: the drop panicked");
            // Not the 10 s graceful wait (nor its 2 s more): a loaded machine's delays allowed.
            assert!(
                took < Duration::from_secs(5),
                "finished {finished}: {took:?}"
            );
        }
    }

    /// On a thread marked as a transport's ([`TransportTurn`]), a queue pair's disconnect and
    /// abort only ask: they do not wait for a transport that may be this very thread (here one
    /// that never answers). The mark nests, and is restored however its scope ends.
    #[test]
    fn on_a_transport_thread_disconnect_and_abort_do_not_wait() {
        assert!(!TransportTurn::is_in());
        {
            let _outer = TransportTurn::enter();
            {
                let _inner = TransportTurn::enter();
                assert!(TransportTurn::is_in());
            }
            assert!(
                TransportTurn::is_in(),
                "an inner turn's end cleared the outer's mark"
            );
            let shared = Shared::new(QpState::Rts);
            let (qp, cmds) = handle(shared.clone());
            let started = Instant::now();
            qp.abort();
            assert!(shared.reset_requested(), "the reset was not asked for");
            qp.disconnect();
            drop(qp);
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "waited {:?} on a transport thread",
                started.elapsed()
            );
            assert!(
                matches!(cmds.try_recv(), Ok(Cmd::Close)),
                "the close was not asked for"
            );
        }
        assert!(!TransportTurn::is_in());
        let unwound = std::panic::catch_unwind(|| {
            let _mark = TransportTurn::enter();
            panic!("a turn's panic");
        });
        assert!(unwound.is_err());
        assert!(!TransportTurn::is_in(), "the mark outlived a panic");
    }

    /// A queue pair closing or terminating refuses posts (siw's `ENOTCONN`) and queues
    /// nothing; in Rts and in Error (flushed by the transport) they are taken.
    #[test]
    fn posts_are_refused_while_closing_or_terminating() {
        let recv = || RecvWr {
            wr_id: 1,
            sg_list: SgeList::new(),
        };
        for (state, taken) in [
            (QpState::Rts, true),
            (QpState::Closing, false),
            (QpState::Terminate, false),
            (QpState::Error, true),
        ] {
            let shared = Shared::new(QpState::Rts);
            drop(shared.publish(state, None, None));
            let (qp, rx) = handle(shared.clone());
            let res = qp.post_recv(recv());
            if taken {
                assert!(res.is_ok(), "{state:?}: {res:?}");
                assert!(rx.try_recv().is_ok(), "{state:?}: not queued");
            } else {
                assert!(
                    matches!(res, Err(DatapathError::Disconnected)),
                    "{state:?}: {res:?}"
                );
                assert!(rx.try_recv().is_err(), "{state:?}: queued");
            }
            // No transport here: finished, so that dropping the handle does not wait for one.
            shared.mark_finished(QpState::Error);
            drop(qp);
        }
    }

    /// Once the transport has finished with the queue pair in Error, a post completes at
    /// once, flushed, on the queue pair's completion queue (a receive's on its receive
    /// queue); after a graceful end it fails with `Disconnected`. Nothing reaches the
    /// transport either way.
    #[test]
    fn posts_after_the_end_flush_in_error_only() {
        use crate::verbs::cq::CompletionQueue;
        let send = SendWr {
            wr_id: 5,
            op: rdmap::SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: SgeList::new(),
            signaled: false,
            fence: false,
        };
        let recv = RecvWr {
            wr_id: 6,
            sg_list: SgeList::new(),
        };
        for end in [QpState::Error, QpState::Closing, QpState::Idle] {
            let (cq, recv_cq) = (CompletionQueue::new(), CompletionQueue::new());
            let shared = Shared::new(QpState::Rts);
            let sink = CqSink::new(&cq, Some(&recv_cq));
            let (qp, rx) = handle_with_cq(shared.clone(), Some(sink));
            shared.stop_posts(Some(&rx), |_| {});
            shared.mark_finished(end);
            let (sent, received) = (qp.post_send(send), qp.post_recv(recv));
            assert!(rx.try_recv().is_err(), "{end:?}: queued");
            if end == QpState::Error {
                assert!(sent.is_ok() && received.is_ok(), "{sent:?} {received:?}");
                let c = cq.try_next().expect("the Send's completion");
                assert_eq!(
                    (c.qp_num, c.wc.wr_id, c.wc.opcode, c.wc.status),
                    (1, 5, WcOpcode::Send, WcStatus::WrFlushError)
                );
                let c = recv_cq.try_next().expect("the receive's completion");
                assert_eq!(
                    (c.wc.wr_id, c.wc.opcode, c.wc.status),
                    (6, WcOpcode::Recv, WcStatus::WrFlushError)
                );
            } else {
                for res in [sent, received] {
                    assert!(
                        matches!(res, Err(DatapathError::Disconnected)),
                        "{end:?}: {res:?}"
                    );
                }
            }
            assert!(cq.is_empty() && recv_cq.is_empty(), "{end:?}");
        }
    }

    /// Posts race the transport's stop: each is refused, or taken by the transport, or
    /// flushed by the stop; none is accepted and lost, and none gets through after the stop.
    /// Two threads post until refused; the transport takes a number that varies by round, then
    /// stops.
    #[test]
    fn a_post_racing_the_stop_is_refused_or_completed() {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut flushed_any = false;
        for round in 0..200u64 {
            let shared = Shared::new(QpState::Rts);
            let (tx, rx) = crossbeam_channel::unbounded::<Cmd>();
            let (accepted, taken, flushed) = std::thread::scope(|s| {
                let posters: Vec<_> = (0..2u64)
                    .map(|t| {
                        let (shared, tx) = (&shared, tx.clone());
                        s.spawn(move || {
                            let mut accepted = 0u64;
                            loop {
                                let wr = RecvWr {
                                    wr_id: t << 32 | accepted,
                                    sg_list: SgeList::new(),
                                };
                                match shared.queue(&tx, Cmd::Recv(wr)) {
                                    Ok(()) => {
                                        accepted += 1;
                                        // The queue stays short should the stopping
                                        // thread be descheduled.
                                        if accepted.is_multiple_of(256) {
                                            std::thread::yield_now();
                                        }
                                    }
                                    Err(DatapathError::Disconnected) => return accepted,
                                    Err(e) => panic!("unexpected {e}"),
                                }
                                assert!(std::time::Instant::now() < deadline, "never stopped");
                            }
                        })
                    })
                    .collect();
                // The transport takes some, then stops at a point that varies by round.
                let mut taken = 0u64;
                while taken < round % 50 + 1 {
                    if rx.try_recv().is_ok() {
                        taken += 1;
                    }
                    assert!(std::time::Instant::now() < deadline, "nothing posted");
                }
                let mut flushed = 0u64;
                shared.stop_posts(Some(&rx), |wc| {
                    assert_eq!(wc.status, WcStatus::WrFlushError);
                    assert_eq!(wc.opcode, WcOpcode::Recv);
                    flushed += 1;
                });
                let accepted: u64 = posters.into_iter().map(|p| p.join().unwrap()).sum();
                (accepted, taken, flushed)
            });
            assert_eq!(accepted, taken + flushed, "round {round}");
            assert!(rx.try_recv().is_err(), "a post got through after the stop");
            assert!(matches!(
                shared.queue(&tx, Cmd::Close),
                Err(DatapathError::Disconnected)
            ));
            flushed_any |= flushed > 0;
        }
        // The posts were refused mid-stream (each thread posts until refused), with requests
        // still queued in at least one round.
        assert!(flushed_any, "no round stopped with requests queued");
    }

    /// A connection-manager event channel dropped with connections never taken
    /// (`Established`) closes them together: each close starts before any is waited for. Each
    /// transport, once it takes its Close, waits (up to `TOGETHER`) for all of them to have
    /// taken theirs before it finishes: closes waited for one after another never meet, and
    /// each would give up waiting.
    #[test]
    fn a_channel_dropped_with_untaken_connections_closes_them_together() {
        use crate::verbs::cm::Connection;
        use crate::verbs::cm_events::{CmEvent, CmEventChannel};
        use std::sync::{Condvar, Mutex};
        const TOGETHER: Duration = Duration::from_secs(10);
        const UNTAKEN: u64 = 4;
        // Closes taken, transports that gave up waiting for the others.
        let met = Arc::new((Mutex::new((0u64, 0u64)), Condvar::new()));
        let channel = CmEventChannel::new().expect("channel");
        let mut shareds = Vec::new();
        for context in 0..UNTAKEN {
            let shared = Shared::new(QpState::Rts);
            let (give, take) = std::sync::mpsc::channel::<Receiver<Cmd>>();
            let transport = shared.clone();
            let met = met.clone();
            let thread = std::thread::spawn(move || {
                let Ok(cmds) = take.recv() else {
                    return;
                };
                while let Ok(cmd) = cmds.recv_timeout(Duration::from_secs(30)) {
                    if matches!(cmd, Cmd::Close) {
                        let (lock, all) = &*met;
                        let mut m = lock.lock().expect("lock");
                        m.0 += 1;
                        all.notify_all();
                        let (mut m, waited) = all
                            .wait_timeout_while(m, TOGETHER, |m| m.0 < UNTAKEN)
                            .expect("lock");
                        m.1 += u64::from(waited.timed_out());
                        drop(m);
                        transport.mark_finished(QpState::Idle);
                        return;
                    }
                }
            });
            let (qp, cmds) = handle_on_thread(shared.clone(), thread);
            assert!(give.send(cmds).is_ok(), "the transport thread is gone");
            channel.push(CmEvent::Established {
                context,
                connection: Connection {
                    qp,
                    private_data: Vec::new(),
                },
            });
            shareds.push(shared);
        }
        drop(channel);
        assert!(
            shareds.iter().all(|s| s.lock().finished),
            "a connection was not closed"
        );
        let gave_up = met.0.lock().expect("lock").1;
        assert_eq!(
            gave_up, 0,
            "closes waited for one after another: {gave_up} transports never met the others"
        );
    }

    /// A finished queue pair's state is final: a transport's later turns of the connection (in
    /// TIME-WAIT on the engine) publish and finish again without changing it, so the Error an
    /// `abort` set after a graceful close stays (and posts stay flushed, not refused).
    #[test]
    fn a_finished_state_is_final() {
        let shared = Shared::new(QpState::Rts);
        shared.mark_finished(QpState::Closing);
        shared.enter_error_if_finished();
        drop(shared.publish(QpState::Closing, None, None));
        shared.mark_finished(QpState::Closing);
        assert_eq!(shared.lock().state, QpState::Error);
        assert!(!shared.refuses_posts());
    }
}
