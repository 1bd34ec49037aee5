//! The one mechanism behind the API's event channels (completion channels, connection-manager
//! event channels): a queue of events and an eventfd in semaphore mode whose count is the number
//! of events queued, so the descriptor is readable exactly while an event waits and an
//! application can sleep on it in epoll, mio or tokio.
//!
//! The descriptor is blocking when created, as verbs' are (`ibv_comp_channel::fd`,
//! `rdma_event_channel::fd`, `ibv_context::async_fd`); an application may make it non-blocking
//! with `fcntl(fd, F_SETFL, O_NONBLOCK)`. Taking an event never waits for one either way
//! ([`EventQueue::pop`]); [`EventQueue::pop_as_descriptor_says`] waits, as the C calls do,
//! unless the application made the descriptor non-blocking.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

pub(crate) struct EventQueue<T> {
    efd: OwnedFd,
    items: Mutex<VecDeque<T>>,
    /// Called with the events never taken when the queue goes, before they are dropped.
    before_drop: Option<fn(&mut VecDeque<T>)>,
}

impl<T> EventQueue<T> {
    pub(crate) fn new() -> io::Result<Self> {
        Self::with_before_drop(None)
    }

    /// A queue that, when it goes, first hands the events never taken to `hook` (which may,
    /// say, start work their drops would otherwise do one after another).
    pub(crate) fn with_before_drop(hook: Option<fn(&mut VecDeque<T>)>) -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
            efd: unsafe { OwnedFd::from_raw_fd(fd) },
            items: Mutex::new(VecDeque::new()),
            before_drop: hook,
        })
    }

    /// Queues an event and makes the descriptor readable (its count goes up by one), both
    /// under the queue's lock: a taker (who holds it too) finds the count of every event
    /// queued, unless the application read the descriptor itself ([`EventQueue::pop`]).
    pub(crate) fn push(&self, item: T) {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        items.push_back(item);
        add_count(&self.efd, 1);
    }

    /// Takes the oldest event without waiting for one, and one count of the descriptor with
    /// it, under the queue's lock (a push raises the count under it too, so each queued event
    /// has its count). Never more reads than events: the descriptor is readable only while an
    /// event is queued. The count is taken without waiting, whether or not the descriptor is
    /// blocking ([`take_count`]): should the application have read the descriptor itself
    /// (which it need not: the calls take the count), the event is still taken, without its
    /// count, and neither this call nor the transport threads that push (which wait for the
    /// lock) are left waiting on a count that is not there (on Linux 5.12 or later; see
    /// [`take_count`] for older kernels). Events still queued when the count has run out that
    /// way get their counts back, so that the descriptor is readable while they wait.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        if items.is_empty() {
            return None;
        }
        take_count(&self.efd);
        let item = items.pop_front();
        if !items.is_empty() && !readable_now(&self.efd) {
            add_count(&self.efd, items.len() as u64);
        }
        item
    }

    /// Takes out every queued event `unwanted` names, with their counts of the descriptor
    /// (as [`EventQueue::pop`] takes them), keeping the order of the rest; the caller drops
    /// what is returned (outside the queue's lock).
    pub(crate) fn take_where(&self, mut unwanted: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(items.len());
        for item in items.drain(..) {
            if unwanted(&item) {
                taken.push(item);
            } else {
                kept.push_back(item);
            }
        }
        *items = kept;
        for _ in &taken {
            take_count(&self.efd);
        }
        if !items.is_empty() && !readable_now(&self.efd) {
            add_count(&self.efd, items.len() as u64);
        }
        taken
    }

    /// Whether the application made the descriptor non-blocking (`O_NONBLOCK`).
    pub(crate) fn nonblocking(&self) -> bool {
        // SAFETY: F_GETFL on a descriptor we own takes no pointer.
        let flags = unsafe { libc::fcntl(self.efd.as_raw_fd(), libc::F_GETFL) };
        flags >= 0 && flags & libc::O_NONBLOCK != 0
    }

    /// Takes the oldest event as the C calls do (`ibv_get_cq_event`, `rdma_get_cm_event`,
    /// `ibv_get_async_event`): waits for one on a blocking descriptor (as created), and
    /// returns `None` at once on one the application made non-blocking (their `EAGAIN`).
    pub(crate) fn pop_as_descriptor_says(&self) -> Option<T> {
        if self.nonblocking() {
            self.pop()
        } else {
            self.pop_wait(Duration::MAX)
        }
    }

    /// Waits up to `timeout` until the descriptor is readable (`poll(2)`); false if it is not.
    pub(crate) fn wait_readable(&self, deadline: Instant) -> bool {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.efd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd on our stack, count 1.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n > 0 {
                return true;
            }
            if left.is_zero() || (n == 0 && Instant::now() >= deadline) {
                return false;
            }
        }
    }

    /// Takes the oldest event, waiting up to `timeout` for one.
    pub(crate) fn pop_wait(&self, timeout: Duration) -> Option<T> {
        let deadline = super::timeout::deadline_after(timeout);
        loop {
            if let Some(item) = self.pop() {
                return Some(item);
            }
            if !self.wait_readable(deadline) {
                return None;
            }
        }
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    pub(crate) fn borrowed_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.efd)
    }
}

impl<T> Drop for EventQueue<T> {
    fn drop(&mut self) {
        if let Some(hook) = self.before_drop {
            hook(self.items.get_mut().unwrap_or_else(|e| e.into_inner()));
        }
    }
}

/// Raises the count of the eventfd `efd` by `n`. It cannot fail (nor wait) short of the
/// counter reaching u64::MAX - 1.
fn add_count(efd: &OwnedFd, n: u64) {
    // SAFETY: writes 8 octets from a local u64 to the eventfd we own.
    let _ = unsafe {
        libc::write(
            efd.as_raw_fd(),
            (&n as *const u64).cast(),
            std::mem::size_of::<u64>(),
        )
    };
}

/// Whether the eventfd `efd` has a count now (`poll` with no timeout).
fn readable_now(efd: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: efd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on our stack, count 1, no timeout.
    unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
}

/// Takes one count of the eventfd `efd` (in semaphore mode) if it has one, without waiting
/// whether or not the descriptor is blocking: `preadv2` with `RWF_NOWAIT` (eventfd honours it
/// since Linux 5.12), else, on a kernel that refuses the flag, `poll` with no timeout and then
/// `read`, which could wait (holding the queue's lock, so for good) if the application read
/// the descriptor itself between the two. True if a count was taken.
fn take_count(efd: &OwnedFd) -> bool {
    let mut count: u64 = 0;
    let iov = libc::iovec {
        iov_base: (&mut count as *mut u64).cast(),
        iov_len: std::mem::size_of::<u64>(),
    };
    // SAFETY: one iovec on our stack describing a local u64, count 1, on the eventfd we own;
    // offset -1 reads at the current position (an eventfd has none to move).
    let n = unsafe { libc::preadv2(efd.as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) };
    if n == std::mem::size_of::<u64>() as isize {
        return true;
    }
    let refused = n < 0
        && matches!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS)
        );
    if !refused {
        return false;
    }
    if !readable_now(efd) {
        return false;
    }
    // SAFETY: reads 8 octets into a local u64 from the eventfd we own; in semaphore mode a
    // successful read takes exactly one count.
    let n = unsafe {
        libc::read(
            efd.as_raw_fd(),
            (&mut count as *mut u64).cast(),
            std::mem::size_of::<u64>(),
        )
    };
    n == std::mem::size_of::<u64>() as isize
}

/// A handle on an [`EventQueue`] that does not keep it alive, for the hooks a queue pair,
/// completion queue or shared receive queue keeps to report to an application's channel: a
/// hook that held the channel itself would, with a connection queued on that channel and never
/// taken (`CmEvent::Established`), make a cycle (channel, connection, hook, channel) that
/// neither would ever leave. Once every strong handle of the queue is gone, events pushed here
/// are dropped: nobody could take them.
pub(crate) struct WeakEventQueue<T>(Weak<EventQueue<T>>);

impl<T: Send + 'static> WeakEventQueue<T> {
    /// A handle on `queue` that does not keep it alive.
    pub(crate) fn new(queue: &Arc<EventQueue<T>>) -> Self {
        Self(Arc::downgrade(queue))
    }

    /// Queues `item` if the queue still has a strong handle; otherwise drops it. Should the
    /// last strong handle go while this pushes (the application dropping its channel), this
    /// call is left holding the queue, and the queue is dropped on a thread of its own rather
    /// than the caller's: the caller may be a transport's thread, and the events still queued
    /// may hold connections whose drop waits for that very thread to finish with them.
    pub(crate) fn push(&self, item: T) {
        let Some(queue) = self.0.upgrade() else {
            return;
        };
        queue.push(item);
        if let Some(last) = Arc::into_inner(queue) {
            // Should no thread be had, it is dropped here after all (a queue pair dropped on
            // its own transport thread does not wait for it: `QueuePair::disconnect`).
            let _ = std::thread::Builder::new()
                .name("iwarp-event-drop".into())
                .spawn(move || drop(last));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread;

    fn readable(q: &EventQueue<u32>) -> bool {
        q.wait_readable(Instant::now())
    }

    fn set_nonblocking(q: &EventQueue<u32>) {
        // SAFETY: F_GETFL and F_SETFL on a descriptor the queue owns take no pointer.
        let ok = unsafe {
            let flags = libc::fcntl(q.raw_fd(), libc::F_GETFL);
            flags >= 0 && libc::fcntl(q.raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        assert!(ok, "{}", io::Error::last_os_error());
    }

    /// Runs `f` on another thread and gives its result, or `None` if it has not returned
    /// within 5 s (so that a wait that never ends fails the test instead of hanging it).
    fn within_5s<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// As verbs' descriptors: blocking when created; taking an event never waits for one;
    /// the descriptor is readable exactly while an event is queued.
    #[test]
    fn the_descriptor_is_blocking_and_taking_never_waits() {
        let q = Arc::new(EventQueue::<u32>::new().expect("eventfd"));
        assert!(!q.nonblocking());
        let q2 = q.clone();
        assert_eq!(within_5s(move || q2.pop()), Some(None), "pop waited");
        assert!(!readable(&q));
        q.push(1);
        q.push(2);
        assert!(readable(&q));
        assert_eq!(q.pop(), Some(1));
        assert!(readable(&q));
        assert_eq!(q.pop(), Some(2));
        assert!(!readable(&q));
        assert_eq!(q.pop(), None);
    }

    /// `pop_as_descriptor_says` waits on a blocking descriptor until an event comes, and on
    /// one made non-blocking returns at once: nothing when the queue is empty (`EAGAIN`), the
    /// event when there is one.
    #[test]
    fn taking_as_the_descriptor_says_waits_only_while_it_is_blocking() {
        let q = Arc::new(EventQueue::<u32>::new().expect("eventfd"));
        let (started_tx, started_rx) = mpsc::channel();
        let q2 = q.clone();
        let waiter = thread::spawn(move || {
            let _ = started_tx.send(());
            q2.pop_as_descriptor_says()
        });
        started_rx.recv().expect("waiter started");
        thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "returned before any event");
        q.push(7);
        assert_eq!(
            within_5s(move || waiter.join().expect("waiter")),
            Some(Some(7))
        );

        set_nonblocking(&q);
        assert!(q.nonblocking());
        let q2 = q.clone();
        assert_eq!(within_5s(move || q2.pop_as_descriptor_says()), Some(None));
        q.push(8);
        assert_eq!(q.pop_as_descriptor_says(), Some(8));
        assert!(!readable(&q));
    }

    /// Reads one count of the queue's descriptor, as an application that reads it itself.
    fn read_one_count(q: &EventQueue<u32>) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 octets into a local u64 from the queue's eventfd.
        let n = unsafe {
            libc::read(
                q.raw_fd(),
                (&mut count as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        assert_eq!(n, 8, "{}", io::Error::last_os_error());
    }

    /// An application that reads the descriptor itself (it need not: the calls take the
    /// count) takes an event's count: taking the event then waits for no count, pushes go on,
    /// and the descriptor is again readable exactly while an event is queued, also when
    /// events were left queued as the count ran out.
    #[test]
    fn a_descriptor_read_by_the_application_leaves_nothing_waiting() {
        let q = Arc::new(EventQueue::<u32>::new().expect("eventfd"));
        q.push(1);
        read_one_count(&q);
        assert!(!readable(&q));
        let q2 = q.clone();
        assert_eq!(
            within_5s(move || q2.pop()),
            Some(Some(1)),
            "waited for a count"
        );
        let q2 = q.clone();
        assert_eq!(within_5s(move || q2.push(2)), Some(()), "push waited");
        assert!(readable(&q));
        let q2 = q.clone();
        assert_eq!(
            within_5s(move || q2.pop_as_descriptor_says()),
            Some(Some(2))
        );
        assert!(!readable(&q));
        assert_eq!(q.pop(), None);

        // Two queued, one count read by the application: once the other count is taken with
        // the first event, the second still makes the descriptor readable.
        q.push(3);
        q.push(4);
        read_one_count(&q);
        assert_eq!(q.pop(), Some(3));
        assert!(
            readable(&q),
            "an event waits behind an unreadable descriptor"
        );
        assert_eq!(q.pop(), Some(4));
        assert!(!readable(&q));
        assert_eq!(q.pop(), None);
    }

    /// Many threads pushing and taking at once: every event is taken once, and the
    /// descriptor ends unreadable (never more reads than events, none left over).
    #[test]
    fn concurrent_pushes_and_takes_lose_and_leave_nothing() {
        let q = Arc::new(EventQueue::<u32>::new().expect("eventfd"));
        const PER: u32 = 2_000;
        let pushers: Vec<_> = (0..2)
            .map(|t| {
                let q = q.clone();
                thread::spawn(move || (0..PER).for_each(|i| q.push(t * PER + i)))
            })
            .collect();
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || {
                    let mut got = Vec::new();
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while got.len() < PER as usize && Instant::now() < deadline {
                        if let Some(v) = q.pop_wait(Duration::from_millis(10)) {
                            got.push(v);
                        }
                    }
                    got
                })
            })
            .collect();
        for p in pushers {
            p.join().expect("pusher");
        }
        let mut all: Vec<u32> = takers
            .into_iter()
            .flat_map(|t| t.join().expect("taker"))
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..2 * PER).collect::<Vec<_>>());
        assert!(!readable(&q));
        assert_eq!(q.pop(), None);
    }
}
