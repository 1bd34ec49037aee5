//! Memory for reassembly shared by many connections: what bounds the sum a peer can make an
//! engine hold with data sent out of order.
//!
//! Each connection's reassembly store is bounded by its receive window
//! (`ConnConfig::reassembly_capacity`, 1 MiB by default), but a peer that opens many
//! connections and sends each one segment out of order would have every one of them allocate
//! its store. A [`ReassemblyBudget`] shared by the connections (the AF_XDP engine's, one per
//! engine) is charged a store's capacity when the store allocates its ring and credited when
//! the ring is freed (the store stayed empty for a second, or the connection ended). A
//! connection whose store cannot be charged keeps nothing out of order: it gives the octets
//! back to TCP, which forgets them (a receiver may discard what it has only SACKed, RFC 2018
//! section 8) and has the peer send them again, as a kernel under memory pressure prunes its
//! out-of-order queue. In-order data never needs the store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Octets of reassembly memory left to share (see the module documentation). Clones share
/// one budget.
#[derive(Debug, Clone)]
pub struct ReassemblyBudget {
    available: Arc<AtomicUsize>,
}

impl ReassemblyBudget {
    /// A budget of `octets`.
    pub fn new(octets: usize) -> ReassemblyBudget {
        ReassemblyBudget {
            available: Arc::new(AtomicUsize::new(octets)),
        }
    }

    /// Octets not charged to any store now.
    pub fn available(&self) -> usize {
        self.available.load(Ordering::Relaxed)
    }

    /// Charges `octets` if that many are left.
    pub(crate) fn take(&self, octets: usize) -> bool {
        self.available
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
                a.checked_sub(octets)
            })
            .is_ok()
    }

    /// Credits `octets` charged before.
    pub(crate) fn give(&self, octets: usize) {
        self.available.fetch_add(octets, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_only_what_is_left_and_clones_share_it() {
        let b = ReassemblyBudget::new(3 << 20);
        let c = b.clone();
        assert!(b.take(1 << 20));
        assert!(c.take(2 << 20));
        assert!(!b.take(1), "nothing left");
        assert_eq!(c.available(), 0);
        b.give(1 << 20);
        assert_eq!(c.available(), 1 << 20);
        assert!(!c.take((1 << 20) + 1));
        assert!(c.take(1 << 20));
    }
}
