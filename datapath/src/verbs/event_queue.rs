//! The one mechanism behind the API's event channels (completion channels, connection-manager
//! event channels): a queue of events and an eventfd in semaphore mode whose count is the number
//! of events queued, so the descriptor is readable exactly while an event waits and an
//! application can sleep on it in epoll, mio or tokio.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

pub(crate) struct EventQueue<T> {
    efd: OwnedFd,
    items: Mutex<VecDeque<T>>,
}

impl<T> EventQueue<T> {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
        let fd = unsafe {
            libc::eventfd(
                0,
                libc::EFD_SEMAPHORE | libc::EFD_NONBLOCK | libc::EFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
            efd: unsafe { OwnedFd::from_raw_fd(fd) },
            items: Mutex::new(VecDeque::new()),
        })
    }

    /// Queues an event and makes the descriptor readable (its count goes up by one).
    pub(crate) fn push(&self, item: T) {
        // Queued before the count goes up, so a reader that sees the count finds the entry.
        self.items
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(item);
        let one: u64 = 1;
        // SAFETY: writes 8 octets from a local u64 to the eventfd we own. It cannot fail short of
        // the counter reaching u64::MAX - 1 unread events.
        let _ = unsafe {
            libc::write(
                self.efd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Takes the oldest event without blocking.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut count: u64 = 0;
        // SAFETY: reads 8 octets into a local u64 from the eventfd we own; in semaphore mode a
        // successful read takes exactly one event's count.
        let n = unsafe {
            libc::read(
                self.efd.as_raw_fd(),
                (&mut count as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if n != std::mem::size_of::<u64>() as isize {
            return None;
        }
        self.items
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
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
