//! Asynchronous events (verbs' `ibv_get_async_event` on a device context's `async_fd`):
//! a queue pair that failed, a queue pair fed by a shared receive queue that will take no more
//! receives from it, a shared receive queue below its low watermark, a completion queue that
//! overran ([`CompletionQueue::notify_async`]), a device that failed
//! ([`crate::Device::notify_async`]). They are queued on an
//! [`AsyncEventChannel`] whose file descriptor is readable while an event waits; a queue pair
//! ([`QueuePair::notify_async`]) and a shared receive queue
//! ([`SharedReceiveQueue::notify_limit`]) send theirs to the channel given, tagged with the
//! application's word for the object (a C interface keeps its `ibv_qp` or `ibv_srq` pointer
//! there).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use crate::verbs::cq::CompletionQueue;
use crate::verbs::event_queue::{EventQueue, WeakEventQueue};
use crate::verbs::qp::QueuePair;
use crate::verbs::srq::SharedReceiveQueue;
use crate::{DatapathError, QpError};

/// One asynchronous event (`struct ibv_async_event`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The queue pair's connection failed (`IBV_EVENT_QP_FATAL`; a C interface may tell
    /// `IBV_EVENT_QP_REQ_ERR` and `IBV_EVENT_QP_ACCESS_ERR` apart by the Terminate in
    /// `error`): it ended with an error, other than the application's own
    /// [`QueuePair::abort`] or `disconnect` (which record none), the peer's graceful close
    /// ([`QpError::PeerClosed`], which the connection manager's `Disconnected` reports, as
    /// verbs does) and the engine's normal stop ([`QpError::EngineStopped`]: the
    /// application's doing). Its outstanding work requests complete flushed.
    QpFatal {
        /// The queue pair's number.
        qp_num: u32,
        /// The application's word given to [`QueuePair::notify_async`].
        context: u64,
        /// What ended it ([`crate::QpStatus::error`]).
        error: QpError,
    },
    /// A queue pair fed by a shared receive queue has ended, however it ended, and takes no
    /// more receives from it (`IBV_EVENT_QP_LAST_WQE_REACHED`): the receives it took have
    /// completed, so it may be destroyed.
    QpLastWqeReached {
        /// The queue pair's number.
        qp_num: u32,
        /// The application's word given to [`QueuePair::notify_async`].
        context: u64,
    },
    /// A take left fewer receives than the armed low watermark
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`; [`SharedReceiveQueue::arm_limit`]).
    SrqLimitReached {
        /// The application's word given to [`SharedReceiveQueue::notify_limit`].
        context: u64,
    },
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`; [`crate::Device::notify_async`]): one of
    /// the AF_XDP engine's threads panicked or its driver failed. That thread's queue pairs
    /// have ended (the engine's other threads, with more queues of the interface, go on).
    DeviceFatal,
    /// A completion found the completion queue full and was lost (`IBV_EVENT_CQ_ERR`;
    /// [`CompletionQueue::notify_async`]): the queue pair that completed into it fails with
    /// [`QpError::CqOverrun`] unless it was ending already. At the queue's first overrun (a
    /// later `notify_async` on an overrun queue reports it again).
    CqError {
        /// The application's word given to [`CompletionQueue::notify_async`].
        context: u64,
    },
}

/// A channel of asynchronous events (a device context's `async_fd`). Cloning gives another
/// handle to the same channel.
#[derive(Clone)]
pub struct AsyncEventChannel {
    queue: Arc<EventQueue<AsyncEvent>>,
}

impl AsyncEventChannel {
    /// A new channel, backed by an eventfd that is blocking, as verbs' descriptors are (an
    /// application may make it non-blocking with `fcntl`; [`Self::get_event`] never waits either
    /// way).
    pub fn new() -> Result<Self, DatapathError> {
        Ok(Self {
            queue: Arc::new(EventQueue::new()?),
        })
    }

    /// Takes the oldest event without blocking (`ibv_get_async_event` on a non-blocking
    /// descriptor).
    pub fn get_event(&self) -> Option<AsyncEvent> {
        self.queue.pop()
    }

    /// Waits up to `timeout` for an event.
    pub fn wait_event(&self, timeout: Duration) -> Option<AsyncEvent> {
        self.queue.pop_wait(timeout)
    }

    /// Takes the oldest event as `ibv_get_async_event` does: waits for one while the
    /// descriptor is blocking (as created), returns `None` at once (its `EAGAIN`) if the
    /// application made it non-blocking (`O_NONBLOCK`).
    pub fn next_event(&self) -> Option<AsyncEvent> {
        self.queue.pop_as_descriptor_says()
    }

    pub(crate) fn push(&self, event: AsyncEvent) {
        self.queue.push(event);
    }

    /// A handle that queues on this channel while the application holds it, without keeping
    /// it alive (for the hooks of queue pairs, completion queues and shared receive queues).
    fn downgrade(&self) -> WeakEventQueue<AsyncEvent> {
        WeakEventQueue::new(&self.queue)
    }
}

impl AsRawFd for AsyncEventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.queue.raw_fd()
    }
}

impl AsFd for AsyncEventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.queue.borrowed_fd()
    }
}

impl QueuePair {
    /// Sends the queue pair's asynchronous events to `channel`, tagged with `context`:
    /// [`AsyncEvent::QpFatal`] if it fails, and for a queue pair fed by a shared
    /// receive queue [`AsyncEvent::QpLastWqeReached`] when it ends (after the other). At once
    /// if it has ended already, once: a call after the end was reported reports nothing.
    /// Independent of [`QueuePair::notify_disconnect`]: both may be used. A second call before
    /// the end replaces the first. The queue pair does not keep the channel alive: once the
    /// application has dropped every handle of it, nothing is queued. Dropping the queue pair
    /// ends it, and that end is reported too: [`QueuePair::stop_notifications`] first when it
    /// is being destroyed.
    pub fn notify_async(&self, channel: &AsyncEventChannel, context: u64) {
        let channel = channel.downgrade();
        let (qp_num, srq) = (self.num(), self.attr().srq);
        self.shared().set_on_finish_async(Box::new(move |error| {
            // The peer's graceful close (a FIN) is the connection manager's `Disconnected`
            // alone, as `rdma_disconnect` at the peer is in verbs; so is the engine's stop
            // (the application's `Device::close`, or its last handle dropped). Our own
            // `disconnect` and `abort` record no error: only what failed first, before or
            // after them, is reported.
            let reported = |e: &QpError| !matches!(e, QpError::PeerClosed | QpError::EngineStopped);
            if let Some(error) = error.filter(reported) {
                channel.push(AsyncEvent::QpFatal {
                    qp_num,
                    context,
                    error,
                });
            }
            if srq {
                channel.push(AsyncEvent::QpLastWqeReached { qp_num, context });
            }
        }));
    }
}

impl CompletionQueue {
    /// Sends the queue's overrun to `channel`, tagged with `context` ([`AsyncEvent::CqError`]);
    /// at once if it has overrun already. A second call replaces the first.
    pub fn notify_async(&self, channel: &AsyncEventChannel, context: u64) {
        let channel = channel.downgrade();
        self.set_on_overrun(Box::new(move || {
            channel.push(AsyncEvent::CqError { context })
        }));
    }
}

impl SharedReceiveQueue {
    /// Sends the queue's low-watermark events to `channel`, tagged with `context`
    /// ([`AsyncEvent::SrqLimitReached`]) instead of
    /// [`SharedReceiveQueue::wait_limit_event`]'s queue (an event left there untaken would
    /// be taken by a later arming's wait for its own). A second call replaces the first.
    pub fn notify_limit(&self, channel: &AsyncEventChannel, context: u64) {
        let channel = channel.downgrade();
        self.set_on_limit(Box::new(move || {
            channel.push(AsyncEvent::SrqLimitReached { context })
        }));
    }
}
