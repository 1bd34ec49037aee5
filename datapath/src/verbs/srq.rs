//! Shared receive queues (verbs' `ibv_srq`): receive buffers of one protection domain that
//! many queue pairs consume, one per inbound Send, whichever connection it arrives on.
//!
//! The buffers sit in a bounded lock-free queue (posting never blocks the transports; a
//! transport takes a buffer when it processes a Send in order, see `rdmap::RecvSource`). The
//! low watermark (`ibv_modify_srq` with `srq_limit`): once armed with
//! [`SharedReceiveQueue::arm_limit`], the first time a take leaves fewer buffers than the limit
//! an event is queued ([`SharedReceiveQueue::wait_limit_event`], or the asynchronous event
//! channel given to `notify_limit` instead) and the limit disarms, as
//! `IBV_EVENT_SRQ_LIMIT_REACHED` does (or at the arming, if takes since the last post left
//! fewer already).

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use rdmap::{Access, RecvSource, RecvWr};

use crate::memory::ProtectionDomain;
use crate::{DatapathError, PostListError};

struct SrqInner {
    pd: ProtectionDomain,
    tx: Sender<RecvWr>,
    rx: Receiver<RecvWr>,
    /// The armed low watermark; 0 when disarmed.
    limit: AtomicUsize,
    /// A receive was taken since the last post: the level may have fallen below a limit while
    /// none was armed (an arming then fires at once).
    taken_since_post: AtomicBool,
    /// A low-watermark event not yet taken ([`SharedReceiveQueue::wait_limit_event`]): at
    /// most one. None while the events go to an asynchronous event channel (`notify_limit`).
    events_tx: Sender<()>,
    events_rx: Receiver<()>,
    /// Called with each low-watermark event too (an asynchronous event channel's).
    on_limit: Mutex<Option<LimitHook>>,
}

/// What a low-watermark event calls besides queueing it ([`SharedReceiveQueue::set_on_limit`]).
pub(crate) type LimitHook = Box<dyn Fn() + Send + Sync>;

/// A shared receive queue of one protection domain. Cloning gives another handle to the same
/// queue; give it to connections in `ConnectParams::srq`.
#[derive(Clone)]
pub struct SharedReceiveQueue {
    inner: Arc<SrqInner>,
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("pd", &self.inner.pd.id())
            .field("posted", &self.inner.rx.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// The most receives a [`SharedReceiveQueue`] holds (`ibv_create_srq`'s `max_wr`; the queue
/// is allocated whole when created).
pub const MAX_SRQ_WR: usize = 1 << 20;

impl SharedReceiveQueue {
    /// A queue of `pd` holding at most `max_wr` posted receives (`ibv_create_srq`). Its slots
    /// are allocated at once: about 150 octets a receive (a work request with room for
    /// [`rdmap::MAX_SGE`] elements and the queue's own word), 150 MiB at [`MAX_SRQ_WR`].
    pub fn new(pd: &ProtectionDomain, max_wr: usize) -> Result<Self, DatapathError> {
        if max_wr == 0 || max_wr > MAX_SRQ_WR {
            return Err(DatapathError::InvalidArgument(
                "a shared receive queue holds 1 to MAX_SRQ_WR (1048576) receives",
            ));
        }
        let (tx, rx) = crossbeam_channel::bounded(max_wr);
        let (events_tx, events_rx) = crossbeam_channel::bounded(1);
        Ok(Self {
            inner: Arc::new(SrqInner {
                pd: pd.clone(),
                tx,
                rx,
                limit: AtomicUsize::new(0),
                taken_since_post: AtomicBool::new(false),
                events_tx,
                events_rx,
                on_limit: Mutex::new(None),
            }),
        })
    }

    /// Posts a receive (`ibv_post_srq_recv`). Its scatter/gather list is checked now against
    /// the protection domain (valid STags of the PD, LOCAL_WRITE, in bounds; a buffer longer
    /// than 2^32 - 1 octets, the longest message, is taken as that long); fails with
    /// [`DatapathError::InvalidArgument`] if it does not pass, and with
    /// [`DatapathError::RecvQueueFull`] when the queue is full (`ENOMEM`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), DatapathError> {
        {
            let table = self.inner.pd.table.snapshot();
            for sge in wr.sg_list.as_slice().iter().filter(|s| s.len > 0) {
                table
                    .validate(
                        sge.stag,
                        self.inner.pd.id(),
                        Access::LOCAL_WRITE,
                        sge.to,
                        u64::from(sge.len),
                    )
                    .map_err(|_| {
                        DatapathError::InvalidArgument(
                            "a receive element fails its check (STag, PD, LOCAL_WRITE, bounds)",
                        )
                    })?;
            }
        }
        // Cleared before the receive is queued: a take of it sets it again after.
        let taken = self.inner.taken_since_post.swap(false, Ordering::SeqCst);
        self.inner.tx.try_send(wr).map_err(|e| {
            if taken {
                self.inner.taken_since_post.store(true, Ordering::SeqCst);
            }
            match e {
                TrySendError::Full(_) => DatapathError::RecvQueueFull {
                    depth: self.inner.tx.capacity().unwrap_or(0),
                },
                TrySendError::Disconnected(_) => DatapathError::Disconnected,
            }
        })
    }

    /// Posts a list of receives in order (`ibv_post_srq_recv` with a chain of work
    /// requests): each is checked and fails as [`SharedReceiveQueue::post_recv`] says;
    /// returns how many were posted, or [`PostListError::posted`], how many went before the
    /// one that failed (verbs' `bad_wr`): those are posted, the rest are not.
    pub fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<usize, PostListError> {
        PostListError::post_each(wrs, |wr| self.post_recv(wr))
    }

    /// Receives posted and not yet taken by a queue pair.
    pub fn len(&self) -> usize {
        self.inner.rx.len()
    }

    /// True when no receive is posted.
    pub fn is_empty(&self) -> bool {
        self.inner.rx.is_empty()
    }

    /// Most receives the queue holds.
    pub fn capacity(&self) -> usize {
        self.inner.rx.capacity().unwrap_or(usize::MAX)
    }

    /// Arms the low watermark (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): the first take that
    /// leaves fewer than `limit` receives queues one event and disarms it. If receives were
    /// taken since the last post and fewer than `limit` are left, the level fell below it while
    /// nothing was armed: the event comes at once (a take may never come: the queue may be
    /// empty, its peers' Sends failing for want of a receive). Armed before receives are
    /// posted (none taken), it waits for a take as usual. `limit` 0 disarms. Fails with
    /// [`DatapathError::InvalidArgument`] (verbs' `EINVAL`) if `limit` is above the queue's
    /// [`capacity`](Self::capacity).
    pub fn arm_limit(&self, limit: usize) -> Result<(), DatapathError> {
        if limit > self.capacity() {
            return Err(DatapathError::InvalidArgument(
                "the shared receive queue's limit is above its capacity",
            ));
        }
        self.inner.limit.store(limit, Ordering::SeqCst);
        // SeqCst, as the take's store of the flag and its fence: either this load sees a
        // take's flag, or that take's check sees the limit stored above.
        if self.inner.taken_since_post.load(Ordering::SeqCst) {
            self.inner.fire_limit_if_below();
        }
        Ok(())
    }

    /// The armed low watermark, 0 if none is armed (it disarms when it fires): what
    /// `ibv_query_srq` reports as `srq_limit`.
    pub fn limit(&self) -> usize {
        self.inner.limit.load(Ordering::SeqCst)
    }

    /// Takes a low-watermark event if one is queued (events not taken do not add up: at most
    /// one waits). Events go here only while none goes to an asynchronous event channel
    /// ([`SharedReceiveQueue::notify_limit`]).
    pub fn try_limit_event(&self) -> bool {
        self.inner.events_rx.try_recv().is_ok()
    }

    /// Waits up to `timeout` for a low-watermark event (none comes while the events go to an
    /// asynchronous event channel, [`SharedReceiveQueue::notify_limit`]).
    pub fn wait_limit_event(&self, timeout: Duration) -> bool {
        self.inner.events_rx.recv_timeout(timeout).is_ok()
    }

    /// Calls `hook` with each low-watermark event from now on (replacing an earlier one).
    pub(crate) fn set_on_limit(&self, hook: LimitHook) {
        let mut on_limit = self
            .inner
            .on_limit
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *on_limit = Some(hook);
        // An event queued before for `wait_limit_event`, which is no longer the way events
        // come: a later wait must not take it for its own arming's.
        while self.inner.events_rx.try_recv().is_ok() {}
    }

    /// Fails unless the queue belongs to protection domain `pd`: a queue pair takes receives
    /// only from a shared receive queue of its own domain.
    pub(crate) fn check_pd(&self, pd: rdmap::PdId) -> Result<(), DatapathError> {
        if self.inner.pd.id() != pd {
            return Err(DatapathError::InvalidArgument(
                "the shared receive queue belongs to another protection domain",
            ));
        }
        Ok(())
    }

    /// Makes `qp` (of protection domain `pd`) take its receives from this queue. Fails if the
    /// queue belongs to another protection domain or `qp` has receives posted.
    pub(crate) fn attach(
        &self,
        qp: &mut rdmap::QueuePair,
        pd: rdmap::PdId,
    ) -> Result<(), DatapathError> {
        self.check_pd(pd)?;
        qp.attach_srq(Box::new(SrqSource(self.inner.clone())))
            .map_err(|_| {
                DatapathError::InvalidArgument(
                    "receives were posted on the queue pair before the shared receive queue",
                )
            })
    }
}

struct SrqSource(Arc<SrqInner>);

impl SrqInner {
    /// Queues the low-watermark event and disarms the limit if fewer receives than an armed
    /// limit are queued. The fence pairs a take with an arming: either the take's check sees
    /// the new limit, or the arming's check sees the level the take left.
    fn fire_limit_if_below(&self) {
        fence(Ordering::SeqCst);
        let limit = self.limit.load(Ordering::SeqCst);
        if limit > 0 && self.rx.len() < limit && self.limit.swap(0, Ordering::SeqCst) > 0 {
            // Once per arming: a lock here is off the path of every other take. To the
            // asynchronous event channel if one was given (`notify_limit`), else to
            // `wait_limit_event`'s queue: there it would wait untaken, and a later arming's
            // wait would take it for its own.
            if let Some(hook) = &*self.on_limit.lock().unwrap_or_else(|e| e.into_inner()) {
                hook();
            } else {
                // One pending is enough to tell a waiter; a full queue means one is there.
                let _ = self.events_tx.try_send(());
            }
        }
    }
}

impl RecvSource for SrqSource {
    fn take(&mut self) -> Option<RecvWr> {
        let wr = self.0.rx.try_recv().ok()?;
        self.0.taken_since_post.store(true, Ordering::SeqCst);
        self.0.fire_limit_if_below();
        Some(wr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit armed above the receives left after takes fires at once: the takes that crossed
    /// it happened while it was disarmed, and with the queue empty no take may ever come.
    /// Armed before the receives are posted (none taken), it waits for a take that crosses it.
    #[test]
    fn a_limit_armed_below_the_level_fires_at_once() {
        let pd = ProtectionDomain::new();
        let srq = SharedReceiveQueue::new(&pd, 8).expect("srq");
        let mr = pd.register(4096, Access::LOCAL_WRITE).expect("region");
        let post = |id| {
            srq.post_recv(RecvWr {
                wr_id: id,
                sg_list: mr.sge(0, 4096).into(),
            })
            .expect("post")
        };
        // Armed on an empty queue nothing was taken from: no event yet.
        srq.arm_limit(2).expect("arm before posting");
        assert!(
            !srq.try_limit_event(),
            "an event before any receive was posted"
        );
        for id in 0..4 {
            post(id);
        }
        // The first take leaves 3: above the limit. Then disarmed, two more taken (what a
        // queue pair's receive of a Send does).
        let mut source = SrqSource(srq.inner.clone());
        assert!(source.take().is_some());
        assert!(!srq.try_limit_event(), "3 left is not below 2");
        srq.arm_limit(0).expect("disarm");
        assert!(source.take().is_some() && source.take().is_some());
        srq.arm_limit(1).expect("arm at the level");
        assert!(!srq.try_limit_event(), "one left is not below a limit of 1");
        srq.arm_limit(2).expect("arm above the level");
        assert!(
            srq.try_limit_event(),
            "no event for a limit above the level"
        );
        assert_eq!(srq.limit(), 0, "the limit did not disarm when it fired");
        assert!(!srq.try_limit_event(), "one event per arming");
        // A post since: the level is the application's doing, an arming waits for a take.
        post(9);
        srq.arm_limit(3).expect("arm after a post");
        assert!(!srq.try_limit_event(), "an event at arming after a post");
        assert!(source.take().is_some());
        assert!(
            srq.try_limit_event(),
            "the take below the limit fired nothing"
        );
    }

    /// Events nobody takes (an application that reads them from an asynchronous event channel
    /// and re-arms) do not pile up: at most one waits.
    #[test]
    fn untaken_limit_events_do_not_add_up() {
        let pd = ProtectionDomain::new();
        let srq = SharedReceiveQueue::new(&pd, 8).expect("srq");
        let mr = pd.register(4096, Access::LOCAL_WRITE).expect("region");
        for id in 0..4 {
            srq.post_recv(RecvWr {
                wr_id: id,
                sg_list: mr.sge(0, 4096).into(),
            })
            .expect("post");
        }
        let mut source = SrqSource(srq.inner.clone());
        for _ in 0..3 {
            srq.arm_limit(8).expect("arm");
            assert!(source.take().is_some());
            assert_eq!(srq.limit(), 0, "fired");
        }
        assert!(srq.try_limit_event());
        assert!(
            !srq.try_limit_event(),
            "the events of three armings added up"
        );
    }
}
