//! Deadlines of the API's waits.

use std::time::{Duration, Instant};

/// When a wait of `timeout` from now ends. A timeout too long to add to the clock
/// (`Duration::MAX`, a caller's "for ever") ends in a century instead of panicking.
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

/// Looks at `done` every `every` until it says true (then true) or `timeout` has passed
/// (then false): the API's waits for what another thread changes.
pub(crate) fn poll_until(
    timeout: Duration,
    every: Duration,
    mut done: impl FnMut() -> bool,
) -> bool {
    let deadline = deadline_after(timeout);
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_beyond_the_clock_is_a_far_deadline_not_a_panic() {
        let now = Instant::now();
        let far = deadline_after(Duration::MAX);
        assert!(far > now + Duration::from_secs(50 * 365 * 86_400));
        let near = deadline_after(Duration::from_millis(5));
        assert!(near >= now + Duration::from_millis(5) && near < far);
    }
}
