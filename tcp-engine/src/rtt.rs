//! Retransmission timeout computation (RFC 6298).

use core::time::Duration;

/// RTO estimator of RFC 6298 2: SRTT, RTTVAR, RTO with exponential backoff
/// (5.5) and a configurable floor (2.4; see [`crate::Config::min_rto`]).
///
/// The floor bounds the variance term, not only the whole: RTO = SRTT + max(`min_rto`,
/// 4 RTTVAR), RFC 6298 2.3's `max(G, K*RTTVAR)` with `min_rto` in G's place, as Linux floors
/// it (`tcp_rto_min` on `mdev`). On a steady path RTTVAR decays toward 0, and with only the
/// whole RTO floored a path of several milliseconds had an RTO barely above SRTT: one ACK a
/// little late (a delayed ACK, a scheduling hiccup) fired a spurious timeout.
///
/// Kept in whole nanoseconds (`u64`, saturating: 584 years) rather than `Duration`s: an RTT
/// sample is taken per acknowledgement, and `Duration`'s multiply and divide (seconds and
/// nanoseconds apart, checked) cost several times the integer arithmetic. The clock's
/// granularity G is the nanosecond either way.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    /// SRTT once measured; 0 before the first sample (an RTT is never 0 ns in practice, and
    /// [`sampled`](Self::sampled) says which).
    srtt: u64,
    rttvar: u64,
    min_rtt: u64,
    rto: u64,
    sampled: bool,
    backoff_shift: u32,
    min_rto: u64,
    max_rto: u64,
}

/// The RTO data transmission starts with after a handshake whose SYN (or SYN-ACK) timed out
/// and gave no RTT sample (RFC 6298 5.7: 3 s).
pub const SYN_TIMEOUT_FALLBACK_RTO: Duration = Duration::from_secs(3);

/// Whole nanoseconds of `d`, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl RttEstimator {
    /// Before any sample the RTO is `initial_rto` (RFC 6298 2.1). A `max_rto` below `min_rto`
    /// is raised to it.
    pub fn new(initial_rto: Duration, min_rto: Duration, max_rto: Duration) -> Self {
        RttEstimator {
            srtt: 0,
            rttvar: 0,
            min_rtt: 0,
            rto: nanos(initial_rto),
            sampled: false,
            backoff_shift: 0,
            min_rto: nanos(min_rto),
            max_rto: nanos(max_rto.max(min_rto)),
        }
    }

    /// Take one RTT measurement (RFC 6298 2.2, 2.3; `min_rto` takes the place of the clock
    /// granularity G in `max(G, K*RTTVAR)`: see the type's doc).
    pub fn sample(&mut self, r: Duration) {
        let r = nanos(r);
        if self.sampled {
            let diff = self.srtt.abs_diff(r);
            self.rttvar = self.rttvar.saturating_mul(3) / 4 + diff / 4;
            self.srtt = self.srtt.saturating_mul(7) / 8 + r / 8;
            self.min_rtt = self.min_rtt.min(r);
        } else {
            self.srtt = r;
            self.rttvar = r / 2;
            self.min_rtt = r;
            self.sampled = true;
        }
        self.rto = self
            .srtt
            .saturating_add(self.rttvar.saturating_mul(4).max(self.min_rto))
            .min(self.max_rto);
        // A new sample after backoff collapses the backoff (RFC 6298 5.7 note).
        self.backoff_shift = 0;
    }

    /// SRTT + 4 RTTVAR in nanoseconds (RFC 6298 2.3, before the floor).
    fn unfloored(&self) -> u64 {
        self.srtt.saturating_add(self.rttvar.saturating_mul(4))
    }

    /// The current timeout including backoff (RFC 6298 5.5).
    pub fn rto(&self) -> Duration {
        let backed = self.rto.saturating_mul(1u64 << self.backoff_shift.min(16));
        Duration::from_nanos(backed.min(self.max_rto))
    }

    /// Double the timeout (RFC 6298 5.5).
    pub fn back_off(&mut self) {
        self.backoff_shift = (self.backoff_shift + 1).min(16);
    }

    /// RFC 6298 5.7: a SYN (or SYN-ACK) whose timer expired and whose answer gave no RTT
    /// sample (Karn's algorithm, section 3, without timestamps) leaves the RTO at
    /// [`SYN_TIMEOUT_FALLBACK_RTO`] when data transmission begins, if it was less (clamped to
    /// the ceiling), with the handshake's backoff forgotten; as Linux's `tcp_init_metrics`.
    /// Nothing changes once a sample was taken.
    pub fn fall_back_after_syn_timeout(&mut self) {
        if self.sampled {
            return;
        }
        self.rto = self
            .rto
            .max(nanos(SYN_TIMEOUT_FALLBACK_RTO))
            .min(self.max_rto);
        self.backoff_shift = 0;
    }

    /// Forget the backoff: new data was acknowledged, so the path works.
    /// (Strict Karn keeps the backed-off RTO until a sample from a segment
    /// never retransmitted; under heavy loss that sample may never come and
    /// the RTO ratchets to its ceiling. Linux also resets here.)
    pub fn reset_backoff(&mut self) {
        self.backoff_shift = 0;
    }

    /// How many consecutive backoffs are in effect.
    pub fn backoff_count(&self) -> u32 {
        self.backoff_shift
    }

    /// Smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.sampled.then(|| Duration::from_nanos(self.srtt))
    }

    /// SRTT + 4 RTTVAR without floor or backoff: when an ACK is overdue
    /// given the variation measured so far.
    pub fn unfloored_rto(&self) -> Option<Duration> {
        self.sampled.then(|| Duration::from_nanos(self.unfloored()))
    }

    /// max(2 SRTT, SRTT + 4 RTTVAR) once measured: RFC 8985 7.2's PTO (2 SRTT) not before an
    /// ACK is overdue by the measured variation ([`unfloored_rto`](Self::unfloored_rto)).
    pub fn pto_base(&self) -> Option<Duration> {
        self.sampled
            .then(|| Duration::from_nanos(self.srtt.saturating_mul(2).max(self.unfloored())))
    }

    /// The ceiling on the RTO: `max_rto`, raised to `min_rto` if below it.
    pub fn max_rto(&self) -> Duration {
        Duration::from_nanos(self.max_rto)
    }

    /// Smallest RTT seen (RFC 8985 uses it for the reordering window).
    pub fn min_rtt(&self) -> Option<Duration> {
        self.sampled.then(|| Duration::from_nanos(self.min_rtt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6298's initial RTO (1 s) and a 60 s ceiling, with the RTO floor `min_rto`.
    fn estimator(min_rto: Duration) -> RttEstimator {
        RttEstimator::new(Duration::from_secs(1), min_rto, Duration::from_secs(60))
    }

    /// `Config::max_rto` below `min_rto`: the floor wins, for small and large samples alike.
    #[test]
    fn a_ceiling_below_the_floor_gives_the_floor() {
        let mut e = RttEstimator::new(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Duration::from_millis(50),
        );
        e.sample(Duration::from_micros(10));
        assert_eq!(e.rto(), Duration::from_millis(200));
        e.sample(Duration::from_secs(2));
        assert_eq!(e.rto(), Duration::from_millis(200));
    }

    #[test]
    fn first_and_later_samples_follow_rfc6298() {
        let mut e = estimator(Duration::from_micros(100));
        assert_eq!(e.rto(), Duration::from_secs(1));
        e.sample(Duration::from_millis(8));
        // SRTT = 8, RTTVAR = 4, RTO = 8 + 16 = 24 ms.
        assert_eq!(e.rto(), Duration::from_millis(24));
        e.sample(Duration::from_millis(16));
        // RTTVAR = 3 + 2 = 5, SRTT = 7 + 2 = 9, RTO = 29 ms.
        assert_eq!(e.srtt(), Some(Duration::from_millis(9)));
        assert_eq!(e.rto(), Duration::from_millis(29));
        e.back_off();
        e.back_off();
        assert_eq!(e.rto(), Duration::from_millis(116));
    }

    #[test]
    fn pto_base_is_twice_srtt_or_the_unfloored_rto() {
        let mut e = estimator(Duration::from_millis(5));
        assert_eq!(e.pto_base(), None);
        // Steady samples shrink RTTVAR below SRTT / 4 (2 SRTT wins), a jump raises it.
        for us in [
            100, 100, 100, 100, 100, 100, 100, 100, 900, 120, 80, 3000, 100,
        ] {
            e.sample(Duration::from_micros(us));
            let (srtt, unfloored) = (e.srtt().expect("srtt"), e.unfloored_rto().expect("rto"));
            assert_eq!(
                e.pto_base(),
                Some((srtt * 2).max(unfloored)),
                "after {us} us"
            );
        }
    }

    /// The estimator in whole nanoseconds gives what RFC 6298's formulas give in `Duration`s
    /// (the arithmetic it had before), sample by sample, over samples from 1 us to 100 ms.
    #[test]
    fn integer_nanoseconds_match_duration_arithmetic() {
        let (min_rto, max_rto) = (Duration::from_millis(1), Duration::from_secs(60));
        let mut e = RttEstimator::new(Duration::from_secs(1), min_rto, max_rto);
        let (mut srtt, mut rttvar): (Option<Duration>, Duration) = (None, Duration::ZERO);
        let mut min_rtt = Duration::MAX;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let r = Duration::from_nanos(1_000 + x % 100_000_000);
            e.sample(r);
            match srtt {
                None => {
                    srtt = Some(r);
                    rttvar = r / 2;
                }
                Some(s) => {
                    rttvar = rttvar * 3 / 4 + s.abs_diff(r) / 4;
                    srtt = Some(s * 7 / 8 + r / 8);
                }
            }
            min_rtt = min_rtt.min(r);
            let s = srtt.expect("sampled");
            let unfloored = s + rttvar * 4;
            assert_eq!(e.srtt(), Some(s), "sample {i}");
            assert_eq!(e.unfloored_rto(), Some(unfloored), "sample {i}");
            assert_eq!(e.pto_base(), Some((s * 2).max(unfloored)), "sample {i}");
            assert_eq!(
                e.rto(),
                (s + (rttvar * 4).max(min_rto)).min(max_rto),
                "sample {i}"
            );
            assert_eq!(e.min_rtt(), Some(min_rtt), "sample {i}");
        }
    }

    #[test]
    fn floor_applies() {
        let mut e = estimator(Duration::from_millis(5));
        e.sample(Duration::from_micros(20));
        assert_eq!(e.rto(), Duration::from_micros(5_020));
    }

    /// The floor bounds the variance term: on a steady 20 ms path RTTVAR decays toward 0, and
    /// the RTO stays `min_rto` above SRTT rather than falling to SRTT itself (where an ACK
    /// 1 ms late fired a timeout).
    #[test]
    fn a_steady_path_keeps_the_floor_as_margin_over_srtt() {
        let mut e = estimator(Duration::from_millis(5));
        for _ in 0..200 {
            e.sample(Duration::from_millis(20));
        }
        assert_eq!(e.unfloored_rto(), Some(Duration::from_millis(20)));
        assert_eq!(e.rto(), Duration::from_millis(25));
    }
}
