//! The connection table's timer queue: each connection slot's earliest deadline, at most one
//! entry per slot, ordered by (deadline, slot index).
//!
//! An indexed binary min-heap: the heap array holds (deadline, slot) and a second array maps a
//! slot to its position, so a slot's deadline is changed or removed in place (sift up or
//! down, O(log n) with n the slots that have a deadline). A lazy heap that pushed a new entry
//! whenever a deadline changed left the old ones behind: a busy connection whose earliest
//! deadline moves between a retransmission timer and a far keepalive or user timeout pushed
//! entries faster than they expired, so the heap, and the cost of every push and pop, grew
//! with the time the connection lived.

use crate::time::Instant;

/// No position: the slot has no entry.
const ABSENT: u32 = u32::MAX;

/// Deadlines by connection slot (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct TimerQueue {
    /// A min-heap of (deadline, slot index).
    heap: Vec<(Instant, u32)>,
    /// Slot index -> position in `heap`, or [`ABSENT`].
    pos: Vec<u32>,
}

impl TimerQueue {
    /// A queue for up to `slots` slots without allocating later.
    pub(crate) fn with_capacity(slots: usize) -> TimerQueue {
        TimerQueue {
            heap: Vec::with_capacity(slots),
            pos: Vec::with_capacity(slots),
        }
    }

    /// Number of slots with a deadline.
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// The earliest deadline and its slot.
    pub(crate) fn peek(&self) -> Option<(Instant, u32)> {
        self.heap.first().copied()
    }

    /// Removes and returns the earliest deadline and its slot.
    pub(crate) fn pop(&mut self) -> Option<(Instant, u32)> {
        let first = self.peek()?;
        self.remove_at(0);
        Some(first)
    }

    /// Sets slot `index`'s deadline (`None` removes it).
    pub(crate) fn set(&mut self, index: u32, deadline: Option<Instant>) {
        let i = index as usize;
        if self.pos.len() <= i {
            // Only when the table grows a new slot, never per packet.
            self.pos.resize(i + 1, ABSENT);
        }
        let at = self.pos[i];
        match (deadline, at) {
            (None, ABSENT) => {}
            (None, at) => self.remove_at(at as usize),
            (Some(d), ABSENT) => {
                let at = self.heap.len();
                self.heap.push((d, index));
                self.pos[i] = at as u32;
                self.sift_up(at);
            }
            (Some(d), at) => {
                let at = at as usize;
                let old = self.heap[at].0;
                self.heap[at].0 = d;
                if d < old {
                    self.sift_up(at);
                } else {
                    self.sift_down(at);
                }
            }
        }
    }

    fn remove_at(&mut self, at: usize) {
        let last = self.heap.len() - 1;
        self.swap(at, last);
        if let Some((_, index)) = self.heap.pop() {
            self.pos[index as usize] = ABSENT;
        }
        if at < self.heap.len() {
            // The element moved into `at` may belong above or below it.
            let moved = self.sift_up(at);
            self.sift_down(moved);
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos[self.heap[a].1 as usize] = a as u32;
        self.pos[self.heap[b].1 as usize] = b as u32;
    }

    /// Moves the element at `at` up while it precedes its parent; returns where it ends.
    fn sift_up(&mut self, mut at: usize) -> usize {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.heap[at] >= self.heap[parent] {
                break;
            }
            self.swap(at, parent);
            at = parent;
        }
        at
    }

    fn sift_down(&mut self, mut at: usize) {
        loop {
            let (l, r) = (2 * at + 1, 2 * at + 2);
            let mut least = at;
            if l < self.heap.len() && self.heap[l] < self.heap[least] {
                least = l;
            }
            if r < self.heap.len() && self.heap[r] < self.heap[least] {
                least = r;
            }
            if least == at {
                return;
            }
            self.swap(at, least);
            at = least;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn ms(v: u64) -> Instant {
        Instant::from_millis(v)
    }

    /// Checks the heap order and the position index against each other.
    fn check(q: &TimerQueue) {
        for (at, &(d, index)) in q.heap.iter().enumerate() {
            assert_eq!(q.pos[index as usize], at as u32, "position of slot {index}");
            if at > 0 {
                assert!(q.heap[(at - 1) / 2] <= (d, index), "heap order at {at}");
            }
        }
        let present = q.pos.iter().filter(|&&p| p != ABSENT).count();
        assert_eq!(present, q.heap.len());
    }

    #[test]
    fn deadlines_come_out_earliest_first_by_slot_on_ties() {
        let mut q = TimerQueue::with_capacity(8);
        for (index, d) in [(3, 30), (1, 10), (4, 10), (2, 20), (0, 40)] {
            q.set(index, Some(ms(d)));
            check(&q);
        }
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            [
                (ms(10), 1),
                (ms(10), 4),
                (ms(20), 2),
                (ms(30), 3),
                (ms(40), 0)
            ]
        );
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn moving_a_deadline_keeps_one_entry_per_slot() {
        let mut q = TimerQueue::with_capacity(2);
        // A ping-pong connection: its earliest deadline moves between a retransmission
        // timer and a far keepalive, again and again.
        for i in 0..100_000u64 {
            q.set(0, Some(ms(i + 200)));
            q.set(0, Some(ms(7_200_000)));
        }
        q.set(1, Some(ms(5)));
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop(), Some((ms(5), 1)));
        assert_eq!(q.pop(), Some((ms(7_200_000), 0)));
        assert_eq!(q.pop(), None);
    }

    /// Against a model (a map of slot -> deadline), with a seeded sequence of sets, removals
    /// and pops.
    #[test]
    fn agrees_with_a_model_under_random_changes() {
        let mut q = TimerQueue::with_capacity(64);
        let mut model: BTreeMap<u32, Instant> = BTreeMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let r = next();
            let index = (r % 64) as u32;
            match (r >> 8) % 4 {
                0 | 1 => {
                    let d = ms((r >> 16) % 1000);
                    q.set(index, Some(d));
                    model.insert(index, d);
                }
                2 => {
                    q.set(index, None);
                    model.remove(&index);
                }
                _ => {
                    let expected = model.iter().map(|(&i, &d)| (d, i)).min();
                    assert_eq!(q.pop(), expected);
                    if let Some((_, i)) = expected {
                        model.remove(&i);
                    }
                }
            }
            check(&q);
            assert_eq!(q.len(), model.len());
            assert_eq!(q.peek(), model.iter().map(|(&i, &d)| (d, i)).min());
        }
    }
}
