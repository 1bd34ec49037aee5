//! Completion queues: work completions flow from engine threads to the application through a
//! lock-free channel (crossbeam). One queue may serve several queue pairs.
//!
//! Inline progress: a queue used with an AF_XDP engine remembers it (the first one), and polling
//! the queue ([`CompletionQueue::try_next`], [`CompletionQueue::poll`]) while it is empty runs a
//! turn of that engine on the polling thread (see `XdpEngineConfig::inline_progress`).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rdmap::WorkCompletion;

/// A work completion tagged with the number of the queue pair it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// Local queue pair number.
    pub qp_num: u32,
    /// The completion as the queue pair reported it.
    pub wc: WorkCompletion,
}

/// A completion queue. Cloning it gives another handle to the same queue.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) tx: Sender<Completion>,
    rx: Receiver<Completion>,
    /// The AF_XDP engine whose turns polling this queue drives (the first one it was used with).
    driver: Arc<OnceLock<Arc<crate::engine::xdp::Wake>>>,
}

impl Default for CompletionQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl CompletionQueue {
    /// A new, unbounded completion queue.
    pub fn new() -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        Self {
            tx,
            rx,
            driver: Arc::new(OnceLock::new()),
        }
    }

    /// Remembers the engine to drive when polling (only the first one sticks).
    pub(crate) fn attach(&self, engine: &Arc<crate::engine::xdp::Wake>) {
        let _ = self.driver.set(engine.clone());
    }

    /// Inline progress: one turn of the attached engine on this thread, if it allows it and
    /// nobody else is in one. True if a turn ran.
    fn drive(&self) -> bool {
        self.driver.get().is_some_and(|w| w.drive())
    }

    /// Appends the completions available now (at most `max`) to `out` and returns how many
    /// were added. Never blocks; while the queue is empty, runs a turn of its AF_XDP engine on
    /// this thread (inline progress) unless another thread is in one.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        if self.rx.is_empty() {
            self.drive();
        }
        let mut n = 0;
        while n < max {
            match self.rx.try_recv() {
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
        if let Ok(c) = self.rx.try_recv() {
            return Some(c);
        }
        if self.drive() {
            return self.rx.try_recv().ok();
        }
        None
    }

    /// Waits up to `timeout` for the next completion (blocking; an AF_XDP engine thread parked
    /// for inline progress is woken first, as nobody polls for it meanwhile).
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        if let Ok(c) = self.rx.try_recv() {
            return Some(c);
        }
        if let Some(w) = self.driver.get() {
            w.before_wait();
        }
        self.rx.recv_deadline(Instant::now() + timeout).ok()
    }

    /// Number of completions waiting.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// True when no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}
