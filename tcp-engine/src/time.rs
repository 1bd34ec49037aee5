//! Time as the caller supplies it: a monotonic count of nanoseconds.
//!
//! The engine never reads a clock (sans-IO). The datapath converts its clock
//! (e.g. `std::time::Instant` relative to a start point) into an [`Instant`];
//! the simulator advances a virtual one.

use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// A point in time: nanoseconds since an arbitrary, caller-chosen epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The epoch.
    pub const ZERO: Instant = Instant(0);

    /// An instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// An instant `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Instant(micros.saturating_mul(1_000))
    }

    /// An instant `millis` milliseconds after the epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Instant(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Microseconds since the epoch.
    pub const fn as_micros(self) -> u64 {
        self.0 / 1_000
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant(self.0.saturating_add(duration_nanos(rhs)))
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_since(rhs)
    }
}

/// The earlier of two optional deadlines.
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}
