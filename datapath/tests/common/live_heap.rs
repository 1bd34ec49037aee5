//! A global allocator that counts the heap octets live in the process (for tests that measure
//! what something holds: `connection_cost.rs`, `scale.rs`). A test file includes it with
//! `#[path = "common/live_heap.rs"] mod live_heap;` and installs it:
//! `#[global_allocator] static GLOBAL: live_heap::Counting = live_heap::Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

/// Forwards to the system allocator, counting live octets in [`live`].
pub struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

/// Heap octets allocated and not yet freed.
pub fn live() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

// SAFETY: forwards every call unchanged to the system allocator; only counts live octets.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
        // SAFETY: `p` came from `System.alloc`/`realloc` with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as i64 - l.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, n) }
    }
}
