//! Completion queues and completion channels (verbs' `ibv_cq` and `ibv_comp_channel`).
//!
//! Work completions flow from the transports' threads to the application through a lock-free
//! channel (crossbeam's array channel: its slots are allocated when the queue is created, none
//! per completion). One queue may serve several queue pairs.
//!
//! **Capacity.** A queue holds at most its `cqe` completions ([`CompletionQueue::create`];
//! [`DEFAULT_CQE`] for [`CompletionQueue::new`]), as verbs' does. A completion that finds the
//! queue full overruns it (`IBV_EVENT_CQ_ERR`): that completion is lost, the queue reports
//! [`CompletionQueue::is_overrun`] and [`crate::AsyncEvent::CqError`]
//! ([`CompletionQueue::notify_async`]), and the queue pair that completed into it fails with
//! [`crate::QpError::CqOverrun`] (its connection is reset) unless it was ending already (a
//! flushed completion lost, or another error first). The completions already queued stay to
//! be polled. A post to a queue pair ended in Error whose flushed completion finds the queue
//! full is refused instead ([`DatapathError::CompletionQueueFull`]). The queue's slots take
//! about 56 octets per completion (448 KiB at [`DEFAULT_CQE`]).
//!
//! **Notification.** A queue created with a [`CompletionChannel`]
//! ([`CompletionQueue::with_channel`]) can be armed with [`CompletionQueue::req_notify`]: the
//! next completion added to it (or, with `solicited_only`, the next one of a received Send
//! with the Solicited Event flag, RFC 5040 5.3 and 7, or of a failed work request) makes the
//! channel's file descriptor readable and queues an event naming the queue; arming is used up
//! by that one event, as with `ibv_req_notify_cq`. An application waits in `epoll`/`mio`/tokio
//! on [`CompletionChannel`]'s descriptor, takes the event with
//! [`CompletionChannel::get_event`], re-arms, and then polls the queue until it is empty
//! (completions that arrived between the event and the re-arm are found by that poll, as in
//! verbs).
//!
//! **Inline progress.** A queue used with an AF_XDP engine remembers it (the first one), and
//! polling the queue ([`CompletionQueue::try_next`], [`CompletionQueue::poll`]) while it is
//! empty runs a turn of that engine on the polling thread (see
//! `XdpEngineConfig::inline_progress`); waiting ([`CompletionQueue::wait`]) or arming
//! ([`CompletionQueue::req_notify`]) hands the work back to the engine thread.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rdmap::{WcOpcode, WcStatus, WorkCompletion};

use crate::verbs::event_queue::EventQueue;
use crate::DatapathError;

/// Completions a queue made by [`CompletionQueue::new`] or [`CompletionQueue::with_channel`]
/// holds: the flushed work requests of a queue pair with both queues at their default depths
/// ([`crate::ConnectParams::sq_depth`], `rq_depth`).
pub const DEFAULT_CQE: usize = 8192;

/// The most completions one queue may hold (`max_cqe`, [`crate::DeviceAttr::max_cqe`]); the
/// queue's slots are allocated when it is created.
pub const MAX_CQE: usize = 1 << 20;

/// What a queue calls when it first overruns ([`CompletionQueue::notify_async`]).
pub(crate) type OverrunHook = Box<dyn Fn() + Send + Sync>;

/// A work completion tagged with the number of the queue pair it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// Local queue pair number.
    pub qp_num: u32,
    /// The completion as the queue pair reported it.
    pub wc: WorkCompletion,
}

/// What a completion queue needs of the engine that fills it: inline progress and a wake-up
/// before the application blocks. Implemented by the AF_XDP engine.
pub(crate) trait EngineDriver: Send + Sync {
    /// One engine turn on the calling thread, if the engine allows it and nobody else is in
    /// one. True if a turn ran.
    fn drive(&self) -> bool;
    /// The application is about to block: the engine thread must do the work again.
    fn before_wait(&self);
    /// A completion queue was armed for an event (`on`), or its arming ended (the event
    /// fired, or the queue was dropped armed).
    fn armed(&self, on: bool);
}

/// Not armed.
const DISARMED: u8 = 0;
/// Armed for the next completion.
const ARMED_ANY: u8 = 1;
/// Armed for the next solicited (or failed) completion.
const ARMED_SOLICITED: u8 = 2;
/// The arming's mode bits ([`ARMED_ANY`], [`ARMED_SOLICITED`]).
const MODE: u8 = 3;
/// With an arming: it was told to the engine ([`EngineDriver::armed`]), and its end is to be.
/// In the same word as the mode, so that the event's swap to [`DISARMED`] says at once
/// whether the arming it ends was counted.
const TOLD: u8 = 4;

struct CqInner {
    tx: Sender<Completion>,
    rx: Receiver<Completion>,
    /// The AF_XDP engine whose turns polling this queue drives (the first one it was used with).
    driver: OnceLock<Arc<dyn EngineDriver>>,
    /// The channel notifications go to, if the queue was created with one.
    channel: Option<Arc<ChannelInner>>,
    /// [`DISARMED`], or [`ARMED_ANY`] or [`ARMED_SOLICITED`] with or without [`TOLD`].
    armed: AtomicU8,
    /// The application's word for the queue (`ibv_create_cq`'s `cq_context`).
    context: u64,
    /// Completions the queue holds (`cqe`).
    capacity: usize,
    /// A completion found the queue full and was lost.
    overrun: AtomicBool,
    /// Called at the first overrun ([`CompletionQueue::notify_async`]).
    on_overrun: Mutex<Option<OverrunHook>>,
    /// What the application's handles share: a channel event names the queue through it, so
    /// that an event of a queue the application has dropped every handle of is skipped,
    /// though queue pairs still deliver into it.
    handle: Weak<CqHandle>,
}

/// The queue as the application's handles hold it (the transports hold [`CqInner`] alone).
struct CqHandle {
    inner: Arc<CqInner>,
}

impl std::ops::Deref for CqHandle {
    type Target = CqInner;

    fn deref(&self) -> &CqInner {
        &self.inner
    }
}

/// A completion queue. Cloning it gives another handle to the same queue. Queue pairs
/// delivering into it keep it working after the application dropped every handle, but
/// nobody can poll it then: it overruns (see the module's "Capacity"), and its channel's
/// events are skipped. Verbs refuses to destroy a queue still in use (`EBUSY`); drop the
/// queue pairs first.
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<CqHandle>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("len", &self.len())
            .field("channel", &self.inner.channel.is_some())
            .field("context", &self.inner.context)
            .finish()
    }
}

/// Where a transport delivers the completions of one queue pair: its send completion queue,
/// and its receive completion queue if that is another one (verbs' `send_cq` and `recv_cq`,
/// [`ConnectParams::recv_cq`](crate::ConnectParams::recv_cq)).
#[derive(Clone)]
pub(crate) struct CqSink {
    send: Arc<CqInner>,
    recv: Option<Arc<CqInner>>,
}

impl CqInner {
    /// Tells the driver of the arming in place, if there is one it has not heard of (armed
    /// before the queue met its engine, or just now). Nothing if the event took the arming
    /// first.
    ///
    /// The driver hears of the arming before it is marked told: an event that takes the
    /// arming in between (on a transport thread) sees it untold and says nothing, and this
    /// call takes it back. Told the other way round, the event's end could reach the driver
    /// before its start, and a driver that counts armings from zero would keep one for good.
    fn tell_arming(&self) {
        let Some(d) = self.driver.get() else { return };
        let untold = |a: u8| a & MODE != 0 && a & TOLD == 0;
        if !untold(self.armed.load(Ordering::SeqCst)) {
            return;
        }
        d.armed(true);
        let told = self
            .armed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| {
                untold(a).then_some(a | TOLD)
            });
        if told.is_err() {
            // The event took it, or another caller told it first.
            d.armed(false);
        }
    }

    /// An arming ended (`was`: the word before it went to [`DISARMED`]): the driver hears of
    /// it if it heard of the arming.
    fn arming_ended(&self, was: u8) {
        if was & TOLD != 0 {
            if let Some(d) = self.driver.get() {
                d.armed(false);
            }
        }
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let was = *self.armed.get_mut();
        self.arming_ended(was);
    }
}

impl CqSink {
    /// The queues of one queue pair: `send` takes its send completions, and its receive
    /// completions too unless `recv` names another queue.
    pub(crate) fn new(send: &CompletionQueue, recv: Option<&CompletionQueue>) -> CqSink {
        CqSink {
            send: send.inner.inner.clone(),
            recv: recv
                .filter(|r| !r.same_queue(send))
                .map(|r| r.inner.inner.clone()),
        }
    }

    /// Remembers `engine` on both queues, so that polling either drives it (inline progress).
    pub(crate) fn attach(&self, engine: Arc<dyn EngineDriver>) {
        if let Some(recv) = &self.recv {
            recv.attach(engine.clone());
        }
        self.send.attach(engine);
    }

    /// Adds a completion to its queue (a receive's to the receive completion queue, others to
    /// the send completion queue: verbs' `recv_cq` and `send_cq`); notifies the queue's
    /// channel if the queue is armed for it. Fails with [`CqOverrun`] if the queue is full
    /// (the completion is lost; the transport fails the queue pair).
    pub(crate) fn push(&self, c: Completion) -> Result<(), CqOverrun> {
        self.queue_of(&c).push(c, true)
    }

    /// [`CqSink::push`] for a transport's completion: fails only when the completion lost
    /// fails its queue pair (verbs' CQ overrun). A flushed completion that finds the queue
    /// full marks it overrun and is lost all the same, but its queue pair is ending anyway:
    /// its end (a Terminate still going out, a graceful close) goes on.
    pub(crate) fn deliver(&self, c: Completion) -> Result<(), CqOverrun> {
        let flushed = c.wc.status == WcStatus::WrFlushError;
        match self.push(c) {
            Err(CqOverrun) if !flushed => Err(CqOverrun),
            _ => Ok(()),
        }
    }

    /// [`CqSink::push`] for a completion that can still be refused (a post's own flushed
    /// completion, its caller told): a full queue is not overrun by it.
    pub(crate) fn offer(&self, c: Completion) -> Result<(), CqOverrun> {
        self.queue_of(&c).push(c, false)
    }

    fn queue_of(&self, c: &Completion) -> &Arc<CqInner> {
        match (&self.recv, c.wc.opcode) {
            (Some(recv), WcOpcode::Recv | WcOpcode::RecvImmediate) => recv,
            _ => &self.send,
        }
    }
}

impl CqInner {
    /// Remembers the engine to drive when polling (only the first one sticks).
    fn attach(&self, engine: Arc<dyn EngineDriver>) {
        let _ = self.driver.set(engine);
        // An arming made before: the engine hears of it now.
        self.tell_arming();
    }

    /// Adds a completion; notifies the queue's channel if the queue is armed for it. A full
    /// queue refuses it; with `overrun`, that loses it: the queue is marked (the first time,
    /// its [`OverrunHook`] runs).
    fn push(self: &Arc<Self>, c: Completion, overrun: bool) -> Result<(), CqOverrun> {
        let inner = self;
        let solicited = c.wc.solicited || c.wc.status != WcStatus::Success;
        if inner.tx.try_send(c).is_err() {
            if !overrun {
                return Err(CqOverrun);
            }
            // Full (the receiver lives as long as `self`): verbs' CQ overrun.
            // Under the hook's lock, so that `set_on_overrun` sees the mark or its hook runs
            // here (once either way).
            let hook = inner.on_overrun.lock().unwrap_or_else(|e| e.into_inner());
            if !inner.overrun.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    cqe = inner.capacity,
                    "completion queue overrun: a completion was lost"
                );
                if let Some(hook) = hook.as_ref() {
                    hook();
                }
            }
            return Err(CqOverrun);
        }
        if let Some(channel) = &inner.channel {
            // Pairs with the fence in `req_notify`: either the arming thread's poll sees this
            // completion, or this load sees it armed.
            fence(Ordering::SeqCst);
            let mut word = inner.armed.load(Ordering::SeqCst);
            loop {
                let mode = word & MODE;
                if !(mode == ARMED_ANY || (mode == ARMED_SOLICITED && solicited)) {
                    break;
                }
                // One event per arming, whichever thread gets there first; and only the arming
                // this completion was judged against: another thread may have fired it and the
                // application armed again since, for solicited completions only.
                match inner.armed.compare_exchange(
                    word,
                    DISARMED,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(was) => {
                        inner.arming_ended(was);
                        channel.push(inner.handle.clone());
                        break;
                    }
                    Err(now) => word = now,
                }
            }
        }
        Ok(())
    }
}

/// A completion found its completion queue full and was lost (verbs' CQ overrun).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CqOverrun;

impl Default for CompletionQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl CompletionQueue {
    /// A new completion queue of [`DEFAULT_CQE`] completions without a channel
    /// (`ibv_create_cq` with no channel).
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CQE, None, 0)
    }

    /// A new completion queue of [`DEFAULT_CQE`] completions whose notifications go to
    /// `channel` (`ibv_create_cq` with a completion channel). Several queues may share one
    /// channel.
    pub fn with_channel(channel: &CompletionChannel) -> Self {
        Self::with_capacity(DEFAULT_CQE, Some(channel), 0)
    }

    /// `ibv_create_cq(ctx, cqe, cq_context, channel, comp_vector)` in one: a new queue of
    /// `cqe` completions (see the module's "Capacity"), its notifications going to `channel`
    /// if one is given, carrying `context`, the application's word for it
    /// ([`CompletionQueue::context`]: a C interface keeps its `cq_context` pointer there, and
    /// finds its own queue again from the queue that [`CompletionChannel::get_event`]
    /// returns).
    ///
    /// Fails with [`DatapathError::InvalidArgument`] if `cqe` is 0 or above [`MAX_CQE`]
    /// (`EINVAL`).
    pub fn create(
        cqe: usize,
        channel: Option<&CompletionChannel>,
        context: u64,
    ) -> Result<Self, DatapathError> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(DatapathError::InvalidArgument(
                "a completion queue holds 1 to MAX_CQE completions",
            ));
        }
        Ok(Self::with_capacity(cqe, channel, context))
    }

    fn with_capacity(cqe: usize, channel: Option<&CompletionChannel>, context: u64) -> Self {
        let (tx, rx) = crossbeam_channel::bounded(cqe);
        Self {
            inner: Arc::new_cyclic(|handle| CqHandle {
                inner: Arc::new(CqInner {
                    tx,
                    rx,
                    driver: OnceLock::new(),
                    channel: channel.map(|c| c.inner.clone()),
                    armed: AtomicU8::new(DISARMED),
                    context,
                    capacity: cqe,
                    overrun: AtomicBool::new(false),
                    on_overrun: Mutex::new(None),
                    handle: handle.clone(),
                }),
            }),
        }
    }

    /// Completions the queue holds (`cqe` as `ibv_create_cq` returns it).
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// Whether a completion found the queue full and was lost (verbs' CQ overrun; see the
    /// module's "Capacity"). Stays true.
    pub fn is_overrun(&self) -> bool {
        self.inner.overrun.load(Ordering::Acquire)
    }

    /// Calls `hook` at the queue's first overrun, on the transport's thread (at once if it
    /// has overrun already). A second call replaces the first.
    pub(crate) fn set_on_overrun(&self, hook: OverrunHook) {
        let mut slot = self
            .inner
            .on_overrun
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if self.is_overrun() {
            hook();
        }
        *slot = Some(hook);
    }

    /// The application's word given to [`CompletionQueue::create`] (0 otherwise).
    pub fn context(&self) -> u64 {
        self.inner.context
    }

    /// Where a transport delivers completions into this queue alone.
    #[cfg(test)]
    pub(crate) fn sink(&self) -> CqSink {
        CqSink::new(self, None)
    }

    /// True if both handles name the same queue.
    pub fn same_queue(&self, other: &CompletionQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Arms the queue (`ibv_req_notify_cq`): the next completion added (with `solicited_only`,
    /// the next completion of a received Send with Solicited Event, or of a failed work
    /// request) queues one event on the queue's [`CompletionChannel`] and makes its descriptor
    /// readable. One arming gives at most one event. Completions already in the queue do not
    /// fire it: poll the queue after arming. Arming again for any completion widens a
    /// solicited-only arming; never the reverse.
    ///
    /// On a queue created without a channel it does nothing and succeeds, as
    /// `ibv_req_notify_cq` does there (no event could be delivered).
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), DatapathError> {
        if self.inner.channel.is_none() {
            return Ok(());
        }
        let want = if solicited_only {
            ARMED_SOLICITED
        } else {
            ARMED_ANY
        };
        // Widen only: ANY (1) stays ANY; DISARMED or SOLICITED become `want` if it is wider
        // (an arming already told stays told).
        let _ = self
            .inner
            .armed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| {
                match (a & MODE, want) {
                    (DISARMED, w) => Some(w),
                    (ARMED_SOLICITED, ARMED_ANY) => Some(ARMED_ANY | (a & TOLD)),
                    _ => None,
                }
            });
        fence(Ordering::SeqCst);
        // The application is about to sleep on the channel: nobody polls for the engine, and
        // until the event fires the engine thread must not leave its work to polls.
        self.inner.tell_arming();
        if let Some(d) = self.inner.driver.get() {
            d.before_wait();
        }
        Ok(())
    }

    /// Inline progress: one turn of the attached engine on this thread, if it allows it and
    /// nobody else is in one. True if a turn ran.
    fn drive(&self) -> bool {
        self.inner.driver.get().is_some_and(|d| d.drive())
    }

    /// Appends the completions available now (at most `max`) to `out` and returns how many
    /// were added (`ibv_poll_cq`). Never blocks; while the queue is empty, runs a turn of its
    /// AF_XDP engine on this thread (inline progress) unless another thread is in one.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let rx = &self.inner.rx;
        if rx.is_empty() {
            self.drive();
        }
        let mut n = 0;
        while n < max {
            match rx.try_recv() {
                Ok(c) => {
                    out.push(c);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        n
    }

    /// One completion if any is available now. Never blocks; while the queue is empty, runs a
    /// turn of its AF_XDP engine on this thread (inline progress) unless another thread is in
    /// one.
    pub fn try_next(&self) -> Option<Completion> {
        let rx = &self.inner.rx;
        if let Ok(c) = rx.try_recv() {
            return Some(c);
        }
        if self.drive() {
            return rx.try_recv().ok();
        }
        None
    }

    /// Waits up to `timeout` for the next completion (blocking; an AF_XDP engine thread parked
    /// for inline progress is woken first, as nobody polls for it meanwhile).
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        let rx = &self.inner.rx;
        if let Ok(c) = rx.try_recv() {
            return Some(c);
        }
        if let Some(d) = self.inner.driver.get() {
            d.before_wait();
        }
        rx.recv_deadline(super::timeout::deadline_after(timeout))
            .ok()
    }

    /// Number of completions waiting.
    pub fn len(&self) -> usize {
        self.inner.rx.len()
    }

    /// True when no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.inner.rx.is_empty()
    }
}

/// The queues that fired, oldest first (weak: the event of a queue whose handles the
/// application dropped is skipped).
type ChannelInner = EventQueue<Weak<CqHandle>>;

/// A completion channel (`ibv_comp_channel`): a file descriptor that becomes readable when an
/// armed [`CompletionQueue`] created with it gets a completion (see the module documentation).
/// Cloning gives another handle to the same channel.
#[derive(Clone)]
pub struct CompletionChannel {
    inner: Arc<ChannelInner>,
}

impl CompletionChannel {
    /// A new channel (`ibv_create_comp_channel`), backed by an eventfd that is blocking, as verbs'
    /// descriptors are (an application may make it non-blocking with `fcntl`; [`Self::get_event`]
    /// never waits either way).
    pub fn new() -> Result<Self, DatapathError> {
        Ok(Self {
            inner: Arc::new(EventQueue::new()?),
        })
    }

    /// Takes the oldest event without blocking (`ibv_get_cq_event` on a non-blocking channel):
    /// the queue that fired, or `None` if no event is waiting. The descriptor stays readable
    /// while events remain. An event of a queue whose every handle the application has
    /// dropped since is skipped (its queue pairs may still deliver into it).
    pub fn get_event(&self) -> Option<CompletionQueue> {
        loop {
            if let Some(inner) = self.inner.pop()?.upgrade() {
                return Some(CompletionQueue { inner });
            }
        }
    }

    /// Waits up to `timeout` for an event (`ibv_get_cq_event` on a blocking channel) with
    /// `poll(2)` on the descriptor.
    pub fn wait_event(&self, timeout: Duration) -> Option<CompletionQueue> {
        let deadline = super::timeout::deadline_after(timeout);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // An event of a queue dropped since is skipped, as `get_event` does.
            if let Some(inner) = self.inner.pop_wait(left)?.upgrade() {
                return Some(CompletionQueue { inner });
            }
        }
    }

    /// Takes the oldest event as `ibv_get_cq_event` does: waits for one while the descriptor
    /// is blocking (as created), returns `None` at once (its `EAGAIN`) if the application made
    /// it non-blocking (`O_NONBLOCK`). Events of dropped queues are skipped, as
    /// [`Self::get_event`] does.
    pub fn next_event(&self) -> Option<CompletionQueue> {
        if self.inner.nonblocking() {
            self.get_event()
        } else {
            self.wait_event(Duration::MAX)
        }
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.raw_fd()
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.borrowed_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmap::{WcOpcode, WorkCompletion};
    use std::sync::atomic::{AtomicIsize, AtomicUsize};
    use std::sync::Mutex;

    /// A driver that counts the armings it was told of.
    #[derive(Default)]
    struct Counting(AtomicIsize);

    impl EngineDriver for Counting {
        fn drive(&self) -> bool {
            false
        }
        fn before_wait(&self) {}
        fn armed(&self, on: bool) {
            self.0.fetch_add(if on { 1 } else { -1 }, Ordering::SeqCst);
        }
    }

    /// Counts armings as the AF_XDP engine does (from zero, never below it), and the first
    /// time it hears of one, lets a completion fire the arming's event before counting it:
    /// a transport thread's push racing the application's arming.
    #[derive(Default)]
    struct RacingPush {
        armed: AtomicUsize,
        sink: Mutex<Option<CqSink>>,
    }

    impl EngineDriver for RacingPush {
        fn drive(&self) -> bool {
            false
        }
        fn before_wait(&self) {}
        fn armed(&self, on: bool) {
            if on {
                let racing = self.sink.lock().expect("sink").take();
                if let Some(sink) = racing {
                    sink.push(completion()).expect("room");
                }
                self.armed.fetch_add(1, Ordering::SeqCst);
            } else {
                let _ = self
                    .armed
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            }
        }
    }

    fn completion() -> Completion {
        Completion {
            qp_num: 1,
            wc: WorkCompletion::failed(7, WcOpcode::Send, WcStatus::WrFlushError),
        }
    }

    /// A transport's completion lost to a full queue overruns it either way; it fails its
    /// queue pair only if it was not a flushed one (a post refused for the queue pair's state
    /// is one: `local_status`).
    #[test]
    fn a_lost_completion_of_an_ending_queue_pair_marks_the_queue_but_fails_nothing() {
        let cq = CompletionQueue::create(1, None, 0).expect("queue");
        let sink = cq.sink();
        let ok = Completion {
            qp_num: 1,
            wc: WorkCompletion::failed(1, WcOpcode::Send, WcStatus::LocalProtectionError),
        };
        assert_eq!(sink.deliver(ok.clone()), Ok(()));
        assert!(!cq.is_overrun());
        assert_eq!(sink.deliver(completion()), Ok(()), "flushed, lost");
        assert!(cq.is_overrun());
        assert_eq!(
            sink.deliver(ok.clone()),
            Err(CqOverrun),
            "an error completion, lost"
        );
        assert_eq!(cq.len(), 1);
    }

    /// The queue an event names carries the context it was created with (how a C interface
    /// finds its `cq_context` from `ibv_get_cq_event`).
    #[test]
    fn an_event_names_its_queue_and_context() {
        let channel = CompletionChannel::new().expect("channel");
        let (a, b) = (
            CompletionQueue::create(16, Some(&channel), 0xa).expect("queue"),
            CompletionQueue::create(16, Some(&channel), 0xb).expect("queue"),
        );
        b.req_notify(false).expect("arm b");
        a.req_notify(false).expect("arm a");
        b.sink().push(completion()).expect("room");
        a.sink().push(completion()).expect("room");
        let first = channel.get_event().expect("b's event");
        let second = channel.get_event().expect("a's event");
        assert!(first.same_queue(&b) && second.same_queue(&a));
        assert_eq!((first.context(), second.context()), (0xb, 0xa));
        assert_eq!(CompletionQueue::new().context(), 0);
    }

    /// `next_event` as `ibv_get_cq_event`: on the blocking descriptor a channel is created with
    /// it waits for an arming's event (from another thread here); once the application made
    /// the descriptor non-blocking it returns at once, `None` when nothing waits (`EAGAIN`).
    #[test]
    fn next_event_waits_unless_the_descriptor_is_non_blocking() {
        let channel = CompletionChannel::new().expect("channel");
        // SAFETY: F_GETFL on the channel's descriptor takes no pointer.
        let flags = unsafe { libc::fcntl(channel.as_raw_fd(), libc::F_GETFL) };
        assert!(
            flags >= 0 && flags & libc::O_NONBLOCK == 0,
            "created non-blocking"
        );
        let cq = CompletionQueue::create(16, Some(&channel), 0x5).expect("queue");
        cq.req_notify(false).expect("arm");
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = channel.clone();
        std::thread::spawn(move || {
            let _ = tx.send(waiting.next_event().map(|q| q.context()));
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "returned before any event");
        cq.sink().push(completion()).expect("room");
        // Bounded: a wait that never ends fails here instead of hanging the test.
        let context = rx.recv_timeout(Duration::from_secs(5));
        assert_eq!(context, Ok(Some(0x5)), "the arming's event");

        // SAFETY: F_SETFL on the channel's descriptor takes no pointer.
        let set =
            unsafe { libc::fcntl(channel.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) };
        assert_eq!(set, 0);
        assert!(
            channel.next_event().is_none(),
            "EAGAIN on a non-blocking descriptor"
        );
        cq.req_notify(false).expect("arm again");
        cq.sink().push(completion()).expect("room");
        assert!(channel.next_event().is_some_and(|q| q.same_queue(&cq)));
    }

    /// An event of a queue whose handles the application has all dropped is skipped, though a
    /// queue pair still delivers into it (a C interface would hand back a `cq_context` it
    /// freed with the queue).
    #[test]
    fn an_event_of_a_queue_the_application_dropped_is_skipped() {
        let channel = CompletionChannel::new().expect("channel");
        let kept = CompletionQueue::create(16, Some(&channel), 1).expect("queue");
        let dropped = CompletionQueue::create(16, Some(&channel), 2).expect("queue");
        let delivering = dropped.sink();
        dropped.req_notify(false).expect("arm");
        kept.req_notify(false).expect("arm");
        drop(dropped);
        delivering.push(completion()).expect("room");
        kept.sink().push(completion()).expect("room");
        let event = channel.get_event().expect("the kept queue's event");
        assert!(event.same_queue(&kept));
        assert!(channel.get_event().is_none(), "the dropped queue's event");
    }

    /// The engine hears of every arming once and of its end once: armed before the queue met
    /// its engine, armed again while armed, ended by the event, or by the queue's end.
    #[test]
    fn armings_are_told_to_the_engine_once_each_way() {
        let channel = CompletionChannel::new().expect("channel");
        let driver = Arc::new(Counting::default());
        let count = || driver.0.load(Ordering::SeqCst);
        let cq = CompletionQueue::with_channel(&channel);
        cq.req_notify(true).expect("arm");
        cq.sink().attach(driver.clone());
        assert_eq!(count(), 1, "an arming made before the engine came");
        cq.req_notify(false).expect("widen");
        assert_eq!(count(), 1, "widening is the same arming");
        cq.sink().push(completion()).expect("room");
        assert_eq!(count(), 0, "the event ended it");
        assert!(channel.get_event().is_some());
        cq.req_notify(false).expect("arm again");
        assert_eq!(count(), 1);
        drop(cq);
        assert_eq!(count(), 0, "a queue dropped armed ends its arming");
    }

    /// An event that fires an arming while the engine is being told of it leaves the engine
    /// counting no arming: before, the event's end reached the engine first (and was lost
    /// at zero), its start after, and the engine counted an arming for good (it never
    /// parked again: inline progress was off for its life).
    #[test]
    fn an_event_racing_the_engines_hearing_of_its_arming_leaves_no_arming_counted() {
        let channel = CompletionChannel::new().expect("channel");
        let driver = Arc::new(RacingPush::default());
        let cq = CompletionQueue::with_channel(&channel);
        cq.sink().attach(driver.clone());
        *driver.sink.lock().expect("sink") = Some(cq.sink());
        cq.req_notify(false).expect("arm");
        assert!(
            channel.get_event().is_some(),
            "the racing completion's event"
        );
        assert_eq!(driver.armed.load(Ordering::SeqCst), 0);
        cq.req_notify(false).expect("arm again");
        assert_eq!(driver.armed.load(Ordering::SeqCst), 1);
        cq.sink().push(completion()).expect("room");
        assert_eq!(driver.armed.load(Ordering::SeqCst), 0);
    }

    /// A full queue overruns: the completion is lost, the mark stays, the hook runs once (or
    /// at once for a hook set after the overrun); what the queue held is still there.
    #[test]
    fn a_full_queue_overruns_once() {
        let cq = CompletionQueue::create(2, None, 0).expect("queue");
        let fired = Arc::new(AtomicU8::new(0));
        let hook = fired.clone();
        cq.set_on_overrun(Box::new(move || {
            hook.fetch_add(1, Ordering::SeqCst);
        }));
        let sink = cq.sink();
        sink.push(completion()).expect("room");
        sink.push(completion()).expect("room");
        assert!(!cq.is_overrun());
        assert_eq!(sink.push(completion()), Err(CqOverrun));
        assert_eq!(sink.push(completion()), Err(CqOverrun));
        assert!(cq.is_overrun());
        assert_eq!(fired.load(Ordering::SeqCst), 1, "once per queue");
        let late = Arc::new(AtomicU8::new(0));
        let hook = late.clone();
        cq.set_on_overrun(Box::new(move || {
            hook.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(
            late.load(Ordering::SeqCst),
            1,
            "a hook set after the overrun"
        );
        assert_eq!(cq.len(), 2);
        let mut out = Vec::new();
        assert_eq!(cq.poll(&mut out, 8), 2);
        sink.push(completion()).expect("room again once polled");
        assert!(cq.is_overrun(), "the mark stays");
    }
}
