//! A bound on the log lines peers can cause: each connection's startup and end is worth a line
//! to an operator, but a peer that connects and fails in a loop (a bad MPA Request, a reset
//! after the handshake: a few packets each, through SYN cookies, holding nothing) must not
//! make the process write thousands of lines a second. [`peer_line!`] writes a line about one
//! peer's connection while fewer than [`PEER_LINES_PER_SECOND`] were written this second,
//! process-wide; the first line written after some were held back says how many
//! (`suppressed`). The listeners' statistics (`Listener::stats`) count every case.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Lines about peers' connections written per second at most, over all transports.
pub(crate) const PEER_LINES_PER_SECOND: u32 = 20;

/// A budget of lines per second (one process-wide budget: [`PEER_LINES`]).
pub(crate) struct LogRate {
    /// The second (since the first use) the count is for.
    second: AtomicU64,
    /// Lines admitted in that second.
    admitted: AtomicU32,
    /// Lines held back since the last one admitted.
    suppressed: AtomicU64,
    limit: u32,
}

impl LogRate {
    pub(crate) const fn new(limit: u32) -> Self {
        Self {
            second: AtomicU64::new(0),
            admitted: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
            limit,
        }
    }

    /// Whether a line may be written now: `Some(n)` if so, `n` the lines held back since the
    /// last one written; `None` if the second's budget is spent (the line is counted).
    pub(crate) fn admit(&self) -> Option<u64> {
        static START: OnceLock<Instant> = OnceLock::new();
        self.admit_at(START.get_or_init(Instant::now).elapsed().as_secs())
    }

    /// [`LogRate::admit`] at second `now`. Threads racing at a second's turn may admit a few
    /// lines more than the limit; never without bound.
    fn admit_at(&self, now: u64) -> Option<u64> {
        let second = self.second.load(Ordering::Relaxed);
        if second != now
            && self
                .second
                .compare_exchange(second, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.admitted.store(0, Ordering::Relaxed);
        }
        if self.admitted.fetch_add(1, Ordering::Relaxed) < self.limit {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// The budget of [`peer_line!`].
pub(crate) static PEER_LINES: LogRate = LogRate::new(PEER_LINES_PER_SECOND);

/// `tracing::$level!(fields..., "message")` about one peer's connection, within
/// [`PEER_LINES`]'s budget; adds `suppressed = n` when lines were held back before it. A line
/// of a level the subscriber does not write takes nothing of the budget (info lines filtered
/// out must not use up what a warning needs).
macro_rules! peer_line {
    (info, $($arg:tt)+) => {
        $crate::log_rate::peer_line!(
            @in $crate::log_rate::PEER_LINES, tracing::Level::INFO, info, $($arg)+
        )
    };
    (warn, $($arg:tt)+) => {
        $crate::log_rate::peer_line!(
            @in $crate::log_rate::PEER_LINES, tracing::Level::WARN, warn, $($arg)+
        )
    };
    // Within the budget `$budget`, at level `$at` (the `tracing::Level` of `$level`).
    (@in $budget:expr, $at:expr, $level:ident, $($arg:tt)+) => {
        if tracing::enabled!($at) {
            if let Some(suppressed) = $budget.admit() {
                if suppressed > 0 {
                    tracing::$level!(suppressed, $($arg)+);
                } else {
                    tracing::$level!($($arg)+);
                }
            }
        }
    };
}
pub(crate) use peer_line;

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer failing 1,000 connections in one second gets 20 lines written; the first line of
    /// the next second says how many were held back.
    #[test]
    fn a_burst_is_cut_to_the_budget_and_counted() {
        let rate = LogRate::new(20);
        let written = (0..1000).filter(|_| rate.admit_at(7).is_some()).count();
        assert_eq!(written, 20);
        assert_eq!(rate.admit_at(8), Some(980));
        assert_eq!(rate.admit_at(8), Some(0));
        let later = (0..100).filter(|_| rate.admit_at(9).is_some()).count();
        assert_eq!(later, 20);
    }

    /// helper-83's review: lines of a level the subscriber does not write took the budget,
    /// so with warnings alone written, ordinary connections' info lines used up what the
    /// warnings of failing ones needed. They take nothing now.
    #[test]
    fn lines_not_written_take_nothing_of_the_budget() {
        let warnings_only = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(warnings_only, || {
            let rate = LogRate::new(2);
            for _ in 0..10 {
                peer_line!(@in rate, tracing::Level::INFO, info, "not written");
            }
            assert_eq!(rate.admitted.load(Ordering::Relaxed), 0);
            peer_line!(@in rate, tracing::Level::WARN, warn, "written");
            assert_eq!(rate.admitted.load(Ordering::Relaxed), 1);
        });
    }
}
