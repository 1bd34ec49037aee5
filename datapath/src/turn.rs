//! Which threads a transport runs on: a thread-local mark that the code a transport may reach
//! (a queue pair's drop, a region's last handle) reads to avoid waiting on the very thread that
//! runs it, or stalling every connection a turn serves.

use std::cell::Cell;

thread_local! {
    /// Whether the calling thread is in a transport's turn ([`TransportTurn`]).
    static IN_TRANSPORT_TURN: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread, while it lives, as one a transport runs on (an AF_XDP engine
/// thread, an application thread running an engine turn inline, a socket transport's
/// connection thread): `QueuePair::disconnect` and `QueuePair::abort` called there (by a
/// hook, or by a queue pair's drop with an event the turn delivered) only ask for the close or
/// reset, as on a connection's own thread, instead of waiting for a transport this thread
/// may be; a registered buffer whose last handle goes there is released on another thread
/// (its unmapping and page-lock bookkeeping can wait on other threads' registrations).
pub(crate) struct TransportTurn(bool);

impl TransportTurn {
    pub(crate) fn enter() -> TransportTurn {
        TransportTurn(IN_TRANSPORT_TURN.with(|t| t.replace(true)))
    }

    /// Whether the calling thread is marked.
    pub(crate) fn is_in() -> bool {
        IN_TRANSPORT_TURN.with(Cell::get)
    }
}

impl Drop for TransportTurn {
    fn drop(&mut self) {
        let was = self.0;
        IN_TRANSPORT_TURN.with(|t| t.set(was));
    }
}
