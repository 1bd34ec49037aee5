//! Connection-manager events (rdma_cm's event channel): connection requests, established and
//! rejected connections, connection errors and disconnections, queued on a
//! [`CmEventChannel`] whose file descriptor is readable while an event waits, so an
//! application sets connections up from its event loop instead of blocking a thread in
//! `accept` or `connect`.
//!
//! Sources: [`crate::Device::resolve_addr`] and [`crate::Device::resolve_route`] (an active
//! side's steps before it connects), a [`Listener`] handed to [`Listener::notify`] (a thread
//! accepts and queues each `ConnectRequest`), [`crate::Device::connect_async`] (a thread
//! connects and queues the result) and [`QueuePair::notify_disconnect`] (the queue pair's end).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mpa::wire::EnhancedParams;

use crate::verbs::cm::{BacklogPlace, ConnectRequest, Connection, ListenRecord, Listener};
use crate::verbs::event_queue::{EventQueue, WeakEventQueue};
use crate::verbs::qp::{disconnect_together, QueuePair};
use crate::{DatapathError, ListenStats, QpError};

/// One connection-manager event (`struct rdma_cm_event`).
pub enum CmEvent {
    /// [`crate::Device::resolve_addr`] found the local address a connection to the
    /// destination leaves from (`RDMA_CM_EVENT_ADDR_RESOLVED`).
    AddrResolved {
        /// The caller's tag of the resolution.
        context: u64,
        /// The local address (port 0): what `rdma_get_local_addr` then reports.
        local_addr: SocketAddr,
    },
    /// [`crate::Device::resolve_addr`] failed (`RDMA_CM_EVENT_ADDR_ERROR`): no route, or (the
    /// AF_XDP engine) a route through another interface.
    AddrError {
        /// The caller's tag of the resolution.
        context: u64,
        /// Why.
        error: DatapathError,
    },
    /// [`crate::Device::resolve_route`] found the next hop (`RDMA_CM_EVENT_ROUTE_RESOLVED`).
    RouteResolved {
        /// The caller's tag of the resolution.
        context: u64,
    },
    /// [`crate::Device::resolve_route`] failed (`RDMA_CM_EVENT_ROUTE_ERROR`): the next hop did
    /// not answer the kernel's neighbour resolution in time, or the route changed interface.
    RouteError {
        /// The caller's tag of the resolution.
        context: u64,
        /// Why.
        error: DatapathError,
    },
    /// A peer's valid MPA Request on a listener (`RDMA_CM_EVENT_CONNECT_REQUEST`): accept or
    /// reject it.
    ConnectRequest(ConnectRequest),
    /// A connection started with [`crate::Device::connect_async`], or accepted with
    /// [`ConnectRequest::accept_qp_async`], is established (`RDMA_CM_EVENT_ESTABLISHED`),
    /// tagged with the caller's `context`. One never taken is
    /// dropped with its channel, and the connection closed as a dropped [`Connection`] is
    /// (several such close together: the channel's drop waits about as long as for one).
    Established {
        /// The caller's tag of the attempt.
        context: u64,
        /// The connection.
        connection: Connection,
    },
    /// The peer rejected a connection attempt (`RDMA_CM_EVENT_REJECTED`), with its private
    /// data.
    Rejected {
        /// The caller's tag of the attempt.
        context: u64,
        /// Private data of the rejecting Reply.
        private_data: Vec<u8>,
        /// The rejecting Reply's RFC 6581 block (the responder's IRD, ORD and RTR kinds),
        /// if it carried one ([`DatapathError::Rejected`]).
        peer_params: Option<EnhancedParams>,
    },
    /// A connection attempt failed (`RDMA_CM_EVENT_UNREACHABLE`, `_CONNECT_ERROR`). The
    /// kernel's rdma_cm on an iWARP device (`cma_iw_handler`) reports a connect the peer's
    /// TCP refused or reset as `RDMA_CM_EVENT_REJECTED` (status `ECONNREFUSED`,
    /// `ECONNRESET`), a timeout (`ETIMEDOUT`) as `_UNREACHABLE`, the rest as `_CONNECT_ERROR`:
    /// [`DatapathError::errno`] gives what that mapping needs.
    ConnectError {
        /// The caller's tag of the attempt.
        context: u64,
        /// Why.
        error: DatapathError,
    },
    /// A listener handed to [`Listener::notify`] failed and stopped.
    ListenError {
        /// The listener's context ([`Listener::notify_with_context`]; 0 from
        /// [`Listener::notify`]): which of several listeners on the channel failed.
        context: u64,
        /// The listener ([`NotifyingListener::id`]), whatever its context.
        listener: ListenerId,
        /// Why.
        error: DatapathError,
    },
    /// A queue pair's connection ended (`RDMA_CM_EVENT_DISCONNECTED`), with the cause if it
    /// was not a clean close of ours.
    Disconnected {
        /// The queue pair's number.
        qp_num: u32,
        /// What ended it ([`crate::QpStatus::error`]).
        error: Option<QpError>,
    },
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CmEvent::AddrResolved {
                context,
                local_addr,
            } => write!(f, "AddrResolved(context {context}, {local_addr})"),
            CmEvent::AddrError { context, error } => {
                write!(f, "AddrError(context {context}: {error})")
            }
            CmEvent::RouteResolved { context } => write!(f, "RouteResolved(context {context})"),
            CmEvent::RouteError { context, error } => {
                write!(f, "RouteError(context {context}: {error})")
            }
            CmEvent::ConnectRequest(r) => write!(f, "ConnectRequest(from {})", r.peer_addr()),
            CmEvent::Established {
                context,
                connection,
            } => write!(
                f,
                "Established(context {context}, qp {})",
                connection.qp.num()
            ),
            CmEvent::Rejected { context, .. } => write!(f, "Rejected(context {context})"),
            CmEvent::ConnectError { context, error } => {
                write!(f, "ConnectError(context {context}: {error})")
            }
            CmEvent::ListenError {
                context,
                listener,
                error,
            } => write!(f, "ListenError({listener:?}, context {context}: {error})"),
            CmEvent::Disconnected { qp_num, error } => {
                write!(f, "Disconnected(qp {qp_num}, {error:?})")
            }
        }
    }
}

/// A connection-manager event channel (`rdma_create_event_channel`). Cloning gives another
/// handle to the same channel.
#[derive(Clone)]
pub struct CmEventChannel {
    queue: Arc<EventQueue<CmEvent>>,
}

impl CmEventChannel {
    /// A new channel, backed by an eventfd that is blocking, as verbs' descriptors are (an
    /// application may make it non-blocking with `fcntl`; [`Self::get_event`] never waits either
    /// way).
    pub fn new() -> Result<Self, DatapathError> {
        Ok(Self {
            queue: Arc::new(EventQueue::with_before_drop(Some(close_untaken_together))?),
        })
    }

    /// Takes the oldest event without blocking (`rdma_get_cm_event` on a non-blocking
    /// channel).
    pub fn get_event(&self) -> Option<CmEvent> {
        self.queue.pop()
    }

    /// Waits up to `timeout` for an event.
    pub fn wait_event(&self, timeout: Duration) -> Option<CmEvent> {
        self.queue.pop_wait(timeout)
    }

    /// Takes the oldest event as `rdma_get_cm_event` does: waits for one while the
    /// descriptor is blocking (as created), returns `None` at once (its `EAGAIN`) if the
    /// application made it non-blocking (`O_NONBLOCK`).
    pub fn next_event(&self) -> Option<CmEvent> {
        self.queue.pop_as_descriptor_says()
    }

    pub(crate) fn push(&self, event: CmEvent) {
        self.queue.push(event);
    }

    /// A handle that queues on this channel while the application holds it, without keeping
    /// it alive (for the hooks of queue pairs, which may be queued on it).
    pub(crate) fn downgrade(&self) -> WeakEventQueue<CmEvent> {
        WeakEventQueue::new(&self.queue)
    }
}

/// When a channel goes with connections never taken (`Established` events still queued; each
/// closes as a dropped [`Connection`] does, waiting for its end): they close together
/// ([`disconnect_together`]), so that against stalled peers the channel's drop waits about
/// 12 s in all rather than up to 12 s for each. Their own drops then find them finished.
fn close_untaken_together(events: &mut VecDeque<CmEvent>) {
    let untaken: Vec<&QueuePair> = events
        .iter()
        .filter_map(|event| match event {
            CmEvent::Established { connection, .. } => Some(&connection.qp),
            _ => None,
        })
        .collect();
    if untaken.len() > 1 {
        disconnect_together(&untaken);
    }
}

impl AsRawFd for CmEventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.queue.raw_fd()
    }
}

impl AsFd for CmEventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.queue.borrowed_fd()
    }
}

/// Names one [`NotifyingListener`] of this process (as rdma_cm's listening `rdma_cm_id`
/// does), unlike its context, which the application chooses and may share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenerId(u64);

impl ListenerId {
    fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        ListenerId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A listener whose connection requests go to a [`CmEventChannel`]; dropping it stops
/// listening (within 200 ms), rejects its requests still queued on the channel and removes
/// its `ListenError`, as `rdma_destroy_id` of a listening id does (the kernel's
/// `ucma_cleanup_ctx_events`: its events are removed and their connections rejected), so that
/// no event names a listener the application has destroyed. Requests the application took are
/// its own: they live on.
pub struct NotifyingListener {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    record: Arc<ListenRecord>,
    local_addr: SocketAddr,
    channel: CmEventChannel,
    /// Where its requests give their backlog places back: names its requests.
    given_back: crossbeam_channel::Receiver<()>,
    /// What names it in its [`CmEvent::ListenError`].
    id: ListenerId,
}

impl NotifyingListener {
    /// What the listener turned away so far, by cause ([`Listener::stats`]).
    pub fn stats(&self) -> ListenStats {
        self.record.snapshot()
    }

    /// The address it listens on ([`Listener::local_addr`]: the port the kernel picked for
    /// port 0; `rdma_get_local_addr` and `rdma_get_src_port` on a listening id).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What names this listener in a [`CmEvent::ListenError`].
    pub fn id(&self) -> ListenerId {
        self.id
    }
}

impl Drop for NotifyingListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Its ListenError too, if it queued one the application has not taken.
        let ours = self.channel.queue.take_where(|event| match event {
            CmEvent::ConnectRequest(r) => r.holds_place_of(&self.given_back),
            CmEvent::ListenError { listener, .. } => *listener == self.id,
            _ => false,
        });
        // Each dropped request is rejected (R=1, no private data).
        drop(ours);
    }
}

/// How often a notifying listener looks at its stop flag (twice per turn at most: waiting
/// for a place in the backlog, then for a request).
const LISTEN_TURN: Duration = Duration::from_millis(100);

impl Listener {
    /// Queues each connection request on `channel` as [`CmEvent::ConnectRequest`] (rdma_cm's
    /// listen on an event channel), from a thread of its own, until the returned handle is
    /// dropped. A peer whose Request is malformed or late is dropped, as `accept` drops it; a
    /// failure of the listener itself is queued as [`CmEvent::ListenError`] and ends it.
    ///
    /// The backlog (`ConnectParams::backlog`) holds as with `accept` (as rdma_cm's iWARP
    /// listener counts it): at most that many requests are on the channel or in the
    /// application's hands unanswered (a request is answered when it is accepted, rejected or
    /// dropped); while they are, further Requests wait in the listener, at most the backlog
    /// again, each until its accept deadline, and Requests beyond those are rejected (Reply
    /// with R=1; [`ListenStats::over_backlog`]). So a peer that sends Requests faster than
    /// the application answers them holds a bounded number of connections, each bounded in
    /// time while the listener runs.
    pub fn notify(self, channel: &CmEventChannel) -> Result<NotifyingListener, DatapathError> {
        self.notify_with_context(channel, 0)
    }

    /// [`Listener::notify`] with each request tagged with `context`
    /// ([`ConnectRequest::listen_context`]), so that an application with several listeners on
    /// one channel knows which one a request came to (rdma_cm's `listen_id` and its context).
    pub fn notify_with_context(
        self,
        channel: &CmEventChannel,
        context: u64,
    ) -> Result<NotifyingListener, DatapathError> {
        let local_addr = self.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let channel = channel.clone();
        let record = self.record();
        let (places, given_back) = crossbeam_channel::bounded(self.backlog());
        let ours = given_back.clone();
        let queued_on = channel.clone();
        let id = ListenerId::next();
        let thread = std::thread::Builder::new()
            .name("iwarp-cm-listen".into())
            .spawn(move || {
                // A panic (a bug) ends the listening as an error does: said, not silent.
                let listened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    while !flag.load(Ordering::SeqCst) {
                        // A place in the backlog first: while every place is taken by a
                        // request the application has not answered, Requests wait in the
                        // listener.
                        let Some(place) = BacklogPlace::take(&places, &given_back, LISTEN_TURN)
                        else {
                            continue;
                        };
                        match self.accept_timeout(LISTEN_TURN) {
                            Ok(Some(request)) => channel
                                .push(CmEvent::ConnectRequest(request.notified(context, place))),
                            Ok(None) => {}
                            // One peer's bad or missing Request: that connection is dropped.
                            Err(DatapathError::Mpa(_) | DatapathError::Timeout(_)) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(())
                }));
                let ended = listened
                    .unwrap_or_else(|cause| Err(crate::error::panicked("listening", &*cause)));
                // Not once the application is dropping the listener (stopping may fail its
                // accept): no event names a listener it destroyed.
                if let Err(e) = ended {
                    if !flag.load(Ordering::SeqCst) {
                        channel.push(CmEvent::ListenError {
                            context,
                            listener: id,
                            error: e,
                        });
                    }
                }
            })?;
        Ok(NotifyingListener {
            stop,
            thread: Some(thread),
            record,
            local_addr,
            channel: queued_on,
            given_back: ours,
            id,
        })
    }
}

impl QueuePair {
    /// Queues [`CmEvent::Disconnected`] on `channel` when the connection ends (at once if it
    /// has ended already), once: replaces the hook of an earlier call (or of
    /// [`crate::Device::connect_async`]) before the end, and reports nothing if the end was
    /// reported already. The queue pair does not keep the channel alive: once the
    /// application has dropped every handle of it, the event is not queued. Dropping the
    /// queue pair ends it, and that end is reported too: [`QueuePair::stop_notifications`]
    /// first when it is being destroyed (`rdma_destroy_id`).
    pub fn notify_disconnect(&self, channel: &CmEventChannel) {
        let channel = channel.downgrade();
        let qp_num = self.num();
        self.shared().set_on_finish(Box::new(move |error| {
            channel.push(CmEvent::Disconnected { qp_num, error })
        }));
    }
}

/// Where a `Disconnected` waits until its connection's `Established` is queued
/// ([`push_outcome`]).
enum HeldEnd {
    /// `Established` not queued yet; the end, if it came.
    Holding(Option<Box<CmEvent>>),
    /// Queued: an end goes straight to the channel.
    Open,
}

/// A connection attempt of [`crate::Device::connect_async`] (or an accept of
/// [`crate::ConnectRequest::accept_qp_async`]), as rdma_cm's id is while it connects or
/// accepts: [`ConnectAttempt::cancel`] is `rdma_destroy_id` on it. Dropping the handle leaves
/// the attempt running, its outcome queued as usual.
#[derive(Debug, Clone)]
pub struct ConnectAttempt {
    state: Arc<Mutex<AttemptState>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttemptState {
    Connecting,
    Cancelled,
    /// Its outcome is on the channel.
    Queued,
}

impl ConnectAttempt {
    pub(crate) fn new() -> ConnectAttempt {
        ConnectAttempt {
            state: Arc::new(Mutex::new(AttemptState::Connecting)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AttemptState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cancels the attempt (`rdma_destroy_id` on an id still connecting): from now on no event
    /// of it is queued, and a connection it still establishes is reset as soon as it is up
    /// (the peer sees it end; the attempt itself runs until its outcome, at most the
    /// parameters' `setup_timeout`). True if the attempt was cancelled; false if its outcome
    /// was queued on the channel already: take it from there (dropping an `Established`
    /// connection closes it). The receives of an [`crate::IdleQp`] it connects complete as
    /// flushed when the attempt ends, which may be after this returns (up to the
    /// `setup_timeout`): their buffers are the transport's until then.
    pub fn cancel(&self) -> bool {
        let mut state = self.lock();
        match *state {
            AttemptState::Connecting | AttemptState::Cancelled => {
                *state = AttemptState::Cancelled;
                true
            }
            AttemptState::Queued => false,
        }
    }
}

/// Queues the outcome of a connection attempt, unless the application cancelled it (an
/// established connection is then reset).
pub(crate) fn push_outcome(
    channel: &CmEventChannel,
    context: u64,
    attempt: &ConnectAttempt,
    outcome: Result<Connection, DatapathError>,
) {
    let mut state = attempt.lock();
    if *state == AttemptState::Cancelled {
        drop(state);
        if let Ok(connection) = outcome {
            connection.qp.abort();
        }
        return;
    }
    // Under the attempt's lock: a cancel either comes before (nothing queued) or finds the
    // outcome queued.
    *state = AttemptState::Queued;
    channel.push(match outcome {
        Ok(connection) => {
            // Established goes first: a connection that ends at once (the peer closes right
            // after accepting) reports its end after it, never before. The end's hook is set
            // before Established is queued (so that an application that takes Established and
            // sets its own with `notify_disconnect` is not overridden), and holds the end
            // until then. The hook holds the channel weakly: the channel holds the
            // connection until the application takes it, so a strong handle here would keep
            // both alive for good if the application dropped the channel without taking it.
            // Dropped with the channel instead, the connection closes as any dropped
            // `Connection` does.
            let qp_num = connection.qp.num();
            let held = Arc::new(std::sync::Mutex::new(HeldEnd::Holding(None)));
            let (hook_held, hook_channel) = (Arc::clone(&held), channel.downgrade());
            connection.qp.shared().set_on_finish(Box::new(move |error| {
                let end = CmEvent::Disconnected { qp_num, error };
                let mut h = hook_held.lock().unwrap_or_else(|e| e.into_inner());
                match &mut *h {
                    HeldEnd::Holding(slot) => *slot = Some(Box::new(end)),
                    HeldEnd::Open => hook_channel.push(end),
                }
            }));
            channel.push(CmEvent::Established {
                context,
                connection,
            });
            let end = {
                let mut h = held.lock().unwrap_or_else(|e| e.into_inner());
                match std::mem::replace(&mut *h, HeldEnd::Open) {
                    HeldEnd::Holding(end) => end,
                    HeldEnd::Open => None,
                }
            };
            if let Some(end) = end {
                channel.push(*end);
            }
            return;
        }
        Err(DatapathError::Rejected {
            private_data,
            peer_params,
        }) => CmEvent::Rejected {
            context,
            private_data,
            peer_params,
        },
        Err(error) => CmEvent::ConnectError { context, error },
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ConnectParams;

    /// A dropped listener takes back its own ListenError still queued, and no other: not
    /// one of another listener with the same context (contexts are the application's to
    /// choose), nor, once the application took its own, the next one of that context.
    #[test]
    fn a_dropped_listener_takes_back_its_own_listen_error_only() {
        let channel = CmEventChannel::new().expect("channel");
        let listen = || {
            Listener::bind(
                "127.0.0.1:0".parse().expect("address"),
                ConnectParams::default(),
            )
            .expect("bind")
            .notify_with_context(&channel, 7)
            .expect("notify")
        };
        let (a, b) = (listen(), listen());
        assert_ne!(a.id(), b.id());
        let failed = |listener: &NotifyingListener| CmEvent::ListenError {
            context: 7,
            listener: listener.id(),
            error: DatapathError::Disconnected,
        };
        channel.push(failed(&b));
        channel.push(failed(&a));
        drop(a);
        match channel.get_event() {
            Some(CmEvent::ListenError { listener, .. }) => assert_eq!(listener, b.id()),
            other => panic!("B's error: {other:?}"),
        }
        assert!(channel.get_event().is_none(), "A's error stayed");
        // A listener whose error the application took leaves the others' alone.
        let c = listen();
        channel.push(failed(&b));
        drop(c);
        assert!(matches!(
            channel.get_event(),
            Some(CmEvent::ListenError { listener, .. }) if listener == b.id()
        ));
        drop(b);
    }
}
