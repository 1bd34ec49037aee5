//! Completion queues: work completions flow from engine threads to the application through a
//! lock-free channel (crossbeam). One queue may serve several queue pairs.

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
        Self { tx, rx }
    }

    /// Appends the completions available now (at most `max`) to `out` and returns how many
    /// were added. Never blocks.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
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

    /// One completion if any is available now.
    pub fn try_next(&self) -> Option<Completion> {
        self.rx.try_recv().ok()
    }

    /// Waits up to `timeout` for the next completion.
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
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
