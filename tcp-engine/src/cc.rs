//! Congestion control behind a trait: NewReno (RFC 5681 3.1, RFC 6582) and
//! CUBIC (RFC 8312).
//!
//! The connection owns loss detection and recovery (which segments to
//! resend, RFC 6675 / RFC 8985 / RFC 6582); the controller owns `cwnd` and
//! `ssthresh` and reacts to three signals: data acknowledged outside
//! recovery, a congestion event (fast retransmit / loss detected by SACK or
//! RACK) and a retransmission timeout.

use crate::time::Instant;
use core::time::Duration;

/// A congestion controller. All windows are in octets.
pub trait CongestionControl: core::fmt::Debug + Send {
    /// Short name, for logs and reports.
    fn name(&self) -> &'static str;
    /// Current congestion window.
    fn cwnd(&self) -> u64;
    /// Current slow-start threshold.
    fn ssthresh(&self) -> u64;
    /// `acked` new octets were cumulatively acknowledged outside loss
    /// recovery; `rtt` is the smoothed RTT if known.
    fn on_ack(&mut self, now: Instant, acked: u64, smss: u32, rtt: Option<Duration>);
    /// New data was acknowledged outside recovery while the congestion window was not what
    /// limited the sender (the application, or the peer's window): the window does not grow
    /// (RFC 7661), and a controller whose growth follows the clock leaves the time from then
    /// until an ACK finds the window used again out (RFC 9438 5.8). Default: nothing.
    fn on_ack_unused(&mut self, _now: Instant) {}
    /// An ACK left nothing in flight: the connection may sit idle until its next send
    /// ([`Self::on_transmit_start`]). Default: nothing.
    fn on_idle(&mut self, _now: Instant) {}
    /// New data goes out with nothing in flight: a controller whose growth follows the clock
    /// leaves the time since [`Self::on_idle`] out (RFC 9438 5.8; Linux's
    /// `CA_EVENT_TX_START`), unless that time is in a longer one the window went unused
    /// ([`Self::on_ack_unused`]), left out when it ends. Default: nothing.
    fn on_transmit_start(&mut self, _now: Instant) {}
    /// A loss was detected by duplicate ACKs, SACK or RACK (once per window
    /// of data, RFC 5681 3.2 / RFC 6675 5 step 4 / RFC 8312 4.5).
    fn on_congestion_event(&mut self, now: Instant, flight_size: u64, smss: u32);
    /// The retransmission timer expired (RFC 5681 3.1 eq. 4, RFC 8312 4.7): the window falls
    /// to one segment. `first`: the first expiry of a series; only then is ssthresh set (and
    /// the state before it kept for [`Self::undo`]): on later ones "the value of ssthresh is
    /// held constant" (RFC 5681 3.1).
    fn on_retransmission_timeout(&mut self, now: Instant, flight_size: u64, smss: u32, first: bool);
    /// The last reduction ([`Self::on_congestion_event`] or
    /// [`Self::on_retransmission_timeout`]) was found spurious (the
    /// retransmissions were unnecessary: RFC 3708 D-SACK, RFC 3522 Eifel):
    /// restore the window and threshold from before it (RFC 4015 3.2
    /// response; cwnd never shrinks by the undo). Default: nothing.
    fn undo(&mut self) {}
}

/// Which built-in controller a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CongestionAlgorithm {
    /// RFC 5681 + RFC 6582.
    NewReno,
    /// RFC 8312.
    #[default]
    Cubic,
}

impl CongestionAlgorithm {
    /// A fresh controller with initial window `initial_window` octets and slow start's
    /// per-ACK limit (see [`SlowStart`]).
    pub fn build(self, initial_window: u64, slow_start: SlowStart) -> Box<dyn CongestionControl> {
        match self {
            CongestionAlgorithm::NewReno => {
                Box::new(NewReno::new(initial_window).with_slow_start(slow_start))
            }
            CongestionAlgorithm::Cubic => {
                Box::new(Cubic::new(initial_window).with_slow_start(slow_start))
            }
        }
    }
}

/// Slow start's growth per ACK: the congestion window grows by the octets an ACK newly
/// acknowledges, up to `limit_segments` SMSS (appropriate byte counting, RFC 3465 2.2: its L),
/// and never past `ssthresh` (RFC 5681 3.1). RFC 3465 allows L = 2. A receiver that
/// acknowledges every 8th full segment (the AF_XDP engine's, or one whose receive offload
/// merges segments) then grows the window by a quarter per round trip instead of doubling it:
/// slow start takes ~16 round trips instead of ~6 to reach 350 segments. `None` counts every
/// octet acknowledged, as Linux does (`tcp_slow_start`); the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlowStart {
    /// L in segments; `None`: no limit.
    pub limit_segments: Option<u32>,
}

impl SlowStart {
    /// The new congestion window after an ACK of `acked` octets in slow start.
    fn grow(self, cwnd: u64, ssthresh: u64, acked: u64, smss: u32) -> u64 {
        let inc = match self.limit_segments {
            Some(l) => acked.min(u64::from(l) * u64::from(smss)),
            None => acked,
        };
        (cwnd + inc).min(ssthresh.max(cwnd))
    }
}

/// NewReno window management (RFC 5681 3.1): slow start with appropriate
/// byte counting (RFC 3465, L = 2), congestion avoidance by byte counting,
/// `ssthresh = max(FlightSize / 2, 2 * SMSS)` on loss.
#[derive(Debug, Clone)]
pub struct NewReno {
    cwnd: u64,
    ssthresh: u64,
    slow_start: SlowStart,
    bytes_acked: u64,
    /// (cwnd, ssthresh) before the last reduction, for [`CongestionControl::undo`].
    prior: Option<(u64, u64)>,
}

impl NewReno {
    /// A controller starting at `initial_window` octets with an infinite
    /// `ssthresh` (RFC 5681 3.1).
    pub fn new(initial_window: u64) -> Self {
        NewReno {
            cwnd: initial_window,
            ssthresh: u64::MAX,
            slow_start: SlowStart::default(),
            bytes_acked: 0,
            prior: None,
        }
    }

    /// This controller with slow start's per-ACK limit `s`.
    pub fn with_slow_start(mut self, s: SlowStart) -> Self {
        self.slow_start = s;
        self
    }
}

impl CongestionControl for NewReno {
    fn name(&self) -> &'static str {
        "newreno"
    }
    fn cwnd(&self) -> u64 {
        self.cwnd
    }
    fn ssthresh(&self) -> u64 {
        self.ssthresh
    }
    fn on_ack(&mut self, _now: Instant, acked: u64, smss: u32, _rtt: Option<Duration>) {
        let smss = u64::from(smss);
        if self.cwnd < self.ssthresh {
            self.cwnd = self
                .slow_start
                .grow(self.cwnd, self.ssthresh, acked, smss as u32);
        } else {
            self.bytes_acked += acked;
            if self.bytes_acked >= self.cwnd {
                self.bytes_acked -= self.cwnd;
                self.cwnd += smss;
            }
        }
    }
    fn on_congestion_event(&mut self, _now: Instant, flight_size: u64, smss: u32) {
        self.prior = Some((self.cwnd, self.ssthresh));
        self.ssthresh = (flight_size / 2).max(2 * u64::from(smss));
        self.cwnd = self.ssthresh;
        self.bytes_acked = 0;
    }
    fn on_retransmission_timeout(
        &mut self,
        _now: Instant,
        flight_size: u64,
        smss: u32,
        first: bool,
    ) {
        if first {
            self.prior = Some((self.cwnd, self.ssthresh));
            self.ssthresh = (flight_size / 2).max(2 * u64::from(smss));
        }
        self.cwnd = u64::from(smss);
        self.bytes_acked = 0;
    }
    fn undo(&mut self) {
        if let Some((cwnd, ssthresh)) = self.prior.take() {
            self.cwnd = self.cwnd.max(cwnd);
            self.ssthresh = ssthresh;
        }
    }
}

/// CUBIC (RFC 8312): window growth `W(t) = C (t - K)^3 + W_max` (4.1), the
/// TCP-friendly region (4.2), fast convergence (4.6), `beta_cubic = 0.7`,
/// `C = 0.4`.
#[derive(Debug, Clone)]
pub struct Cubic {
    cwnd: u64,
    ssthresh: u64,
    slow_start: SlowStart,
    /// Window before the last reduction, in segments (W_max).
    w_max: f64,
    /// W_last_max for fast convergence.
    w_last_max: f64,
    /// Start of the current congestion-avoidance epoch.
    epoch_start: Option<Instant>,
    /// Since when, in the epoch, ACKs came while the window was not used
    /// ([`CongestionControl::on_ack_unused`]): the epoch moves on by that time.
    unused_since: Option<Instant>,
    /// Since when nothing is in flight ([`CongestionControl::on_idle`]): the epoch moves on
    /// by that time at the next send.
    idle_since: Option<Instant>,
    k: f64,
    /// TCP-friendly estimate in segments (W_est, 4.2).
    w_est: f64,
    cwnd_frac: f64,
    /// (cwnd, ssthresh, W_max, W_last_max) before the last reduction, for
    /// [`CongestionControl::undo`].
    prior: Option<(u64, u64, f64, f64)>,
}

const CUBIC_C: f64 = 0.4;
const CUBIC_BETA: f64 = 0.7;

impl Cubic {
    /// A controller starting at `initial_window` octets.
    pub fn new(initial_window: u64) -> Self {
        Cubic {
            cwnd: initial_window,
            ssthresh: u64::MAX,
            slow_start: SlowStart::default(),
            w_max: 0.0,
            w_last_max: 0.0,
            epoch_start: None,
            unused_since: None,
            idle_since: None,
            k: 0.0,
            w_est: 0.0,
            cwnd_frac: 0.0,
            prior: None,
        }
    }

    /// This controller with slow start's per-ACK limit `s`.
    pub fn with_slow_start(mut self, s: SlowStart) -> Self {
        self.slow_start = s;
        self
    }

    fn reduce(&mut self, smss: u32) {
        self.prior = Some((self.cwnd, self.ssthresh, self.w_max, self.w_last_max));
        let seg = f64::from(smss);
        let w = self.cwnd as f64 / seg;
        // Fast convergence (RFC 8312 4.6).
        self.w_max = if w < self.w_last_max {
            w * (1.0 + CUBIC_BETA) / 2.0
        } else {
            w
        };
        self.w_last_max = w;
        let reduced = (w * CUBIC_BETA).max(2.0);
        self.ssthresh = (reduced * seg) as u64;
        self.epoch_start = None;
        self.unused_since = None;
        self.idle_since = None;
        self.cwnd_frac = 0.0;
    }

    /// Ends a time of the window going unused: the epoch moves on by it (RFC 9438 5.8).
    fn end_unused(&mut self, now: Instant) {
        if let (Some(since), Some(epoch)) = (self.unused_since.take(), self.epoch_start) {
            self.epoch_start = Some(epoch + now.saturating_since(since));
        }
    }
}

impl CongestionControl for Cubic {
    fn name(&self) -> &'static str {
        "cubic"
    }
    fn cwnd(&self) -> u64 {
        self.cwnd
    }
    fn ssthresh(&self) -> u64 {
        self.ssthresh
    }
    fn on_ack(&mut self, now: Instant, acked: u64, smss: u32, rtt: Option<Duration>) {
        let seg = f64::from(smss);
        if self.cwnd < self.ssthresh {
            self.cwnd = self.slow_start.grow(self.cwnd, self.ssthresh, acked, smss);
            return;
        }
        let cwnd_seg = self.cwnd as f64 / seg;
        self.end_unused(now);
        let epoch = match self.epoch_start {
            Some(e) => e,
            None => {
                self.epoch_start = Some(now);
                if self.w_max < cwnd_seg {
                    self.k = 0.0;
                    self.w_max = cwnd_seg;
                } else {
                    self.k = ((self.w_max - cwnd_seg) / CUBIC_C).cbrt();
                }
                self.w_est = cwnd_seg;
                now
            }
        };
        let rtt_s = rtt.map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let t = (now - epoch).as_secs_f64() + rtt_s;
        let w_cubic = CUBIC_C * (t - self.k).powi(3) + self.w_max;
        // TCP-friendly region (RFC 8312 4.2), per-ACK form.
        let acked_seg = acked as f64 / seg;
        self.w_est += 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA) * acked_seg / cwnd_seg;
        let target = if w_cubic < self.w_est {
            self.w_est
        } else {
            w_cubic.min(1.5 * cwnd_seg)
        };
        if target > cwnd_seg {
            // (target - cwnd) / cwnd per acknowledged segment (4.3, 4.4).
            self.cwnd_frac += (target - cwnd_seg) / cwnd_seg * acked_seg * seg;
            let whole = self.cwnd_frac.floor();
            self.cwnd += whole as u64;
            self.cwnd_frac -= whole;
        }
    }
    fn on_ack_unused(&mut self, now: Instant) {
        if self.epoch_start.is_some() && self.unused_since.is_none() {
            self.unused_since = Some(now);
        }
    }
    fn on_idle(&mut self, now: Instant) {
        if self.epoch_start.is_some() {
            self.idle_since = Some(now);
        }
    }
    fn on_transmit_start(&mut self, now: Instant) {
        if let (Some(since), Some(epoch), None) =
            (self.idle_since.take(), self.epoch_start, self.unused_since)
        {
            self.epoch_start = Some(epoch + now.saturating_since(since));
        }
    }
    fn on_congestion_event(&mut self, _now: Instant, _flight_size: u64, smss: u32) {
        self.reduce(smss);
        self.cwnd = self.ssthresh;
    }
    fn on_retransmission_timeout(
        &mut self,
        _now: Instant,
        _flight_size: u64,
        smss: u32,
        first: bool,
    ) {
        if first {
            self.reduce(smss);
        } else {
            // The window starts again from one segment: a new epoch.
            self.epoch_start = None;
            self.cwnd_frac = 0.0;
        }
        self.cwnd = u64::from(smss);
    }
    fn undo(&mut self) {
        if let Some((cwnd, ssthresh, w_max, w_last_max)) = self.prior.take() {
            self.cwnd = self.cwnd.max(cwnd);
            self.ssthresh = ssthresh;
            self.w_max = w_max;
            self.w_last_max = w_last_max;
            self.epoch_start = None;
            self.unused_since = None;
            self.idle_since = None;
            self.cwnd_frac = 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newreno_slow_start_then_halves() {
        let mut c = NewReno::new(14600);
        c.on_ack(Instant::ZERO, 1460, 1460, None);
        assert_eq!(c.cwnd(), 16060);
        c.on_congestion_event(Instant::ZERO, 16060, 1460);
        assert_eq!(c.cwnd(), 8030);
        // Congestion avoidance: one SMSS per cwnd of acknowledged data.
        c.on_ack(Instant::ZERO, 8030, 1460, None);
        assert_eq!(c.cwnd(), 8030 + 1460);
        c.on_retransmission_timeout(Instant::ZERO, 9490, 1460, true);
        assert_eq!(c.cwnd(), 1460);
        assert_eq!(c.ssthresh(), 4745);
        // The timeout was spurious: back to the window before it.
        c.undo();
        assert_eq!((c.cwnd(), c.ssthresh()), (9490, 8030));
    }

    #[test]
    fn slow_start_counts_what_an_ack_acknowledges_up_to_its_limit_and_ssthresh() {
        let smss = 1000;
        // A stretch ACK of 8 segments: all 8 count without a limit, 2 with RFC 3465's L = 2.
        let mut c = Cubic::new(10_000);
        c.on_ack(Instant::ZERO, 8_000, smss, None);
        assert_eq!(c.cwnd(), 18_000);
        let mut c = NewReno::new(10_000).with_slow_start(SlowStart {
            limit_segments: Some(2),
        });
        c.on_ack(Instant::ZERO, 8_000, smss, None);
        assert_eq!(c.cwnd(), 12_000);
        // Never past ssthresh in one step (RFC 5681 3.1).
        let mut c = NewReno::new(10_000);
        c.on_congestion_event(Instant::ZERO, 30_000, smss);
        c.on_retransmission_timeout(Instant::ZERO, 30_000, smss, true);
        assert_eq!((c.cwnd(), c.ssthresh()), (1_000, 15_000));
        c.on_ack(Instant::ZERO, 20_000, smss, None);
        assert_eq!(c.cwnd(), 15_000);
    }

    #[test]
    fn cubic_undo_restores_the_window() {
        let mut c = Cubic::new(100_000);
        c.on_congestion_event(Instant::ZERO, 100_000, 1000);
        assert_eq!(c.cwnd(), 70_000);
        c.undo();
        assert_eq!((c.cwnd(), c.ssthresh()), (100_000, u64::MAX));
        // Nothing to undo twice.
        c.undo();
        assert_eq!(c.cwnd(), 100_000);
    }

    #[test]
    fn cubic_reduces_by_beta_and_regrows_to_wmax() {
        let smss = 1000;
        let mut c = Cubic::new(100_000);
        c.on_congestion_event(Instant::ZERO, 100_000, smss);
        assert_eq!(c.cwnd(), 70_000);
        let rtt = Duration::from_millis(10);
        let mut now = Instant::ZERO;
        // Grow for a few seconds of acks: must approach and pass W_max (100 segments).
        for _ in 0..2000 {
            now += Duration::from_millis(1);
            let acked = c.cwnd() / 10;
            c.on_ack(now, acked, smss, Some(rtt));
        }
        assert!(c.cwnd() > 100_000, "cwnd {}", c.cwnd());
    }

    /// RFC 9438 5.8 counts only time the flow was not limited by the window: a flight sent
    /// as soon as the last one was acknowledged (one window-sized message per round trip) is
    /// no idle time (the epoch stood still every round before, so the curve never advanced),
    /// while 10 s with nothing in flight is left out, and only those 10 s.
    #[test]
    fn cubic_leaves_out_only_the_time_nothing_was_in_flight() {
        let smss = 1000;
        let rtt = Duration::from_millis(10);
        // 200 round trips of one window each, acknowledged whole (the flight empties every
        // round); `told`: the controller hears of each idle time and send; `pause`: 10 s with
        // nothing in flight after round 100.
        let run = |told: bool, pause: bool| {
            let mut c = Cubic::new(100_000);
            c.on_congestion_event(Instant::ZERO, 100_000, smss);
            let mut now = Instant::ZERO;
            for round in 0..200 {
                now += rtt;
                c.on_ack(now, c.cwnd(), smss, Some(rtt));
                if told {
                    c.on_idle(now);
                }
                if pause && round == 100 {
                    now += Duration::from_secs(10);
                }
                if told {
                    c.on_transmit_start(now);
                }
            }
            c.cwnd()
        };
        let plain = run(false, false);
        assert_eq!(
            run(true, false),
            plain,
            "a flight sent at once is no idle time"
        );
        assert_eq!(run(true, true), plain, "the pause is left out, and only it");
        assert!(
            run(false, true) > plain,
            "the pause matters when not left out"
        );
    }

    /// RFC 9438 5.8: time in which the window went unused (the sender limited by something
    /// else) does not count toward CUBIC's growth: after 10 s of such ACKs the next ACK grows
    /// the window as it would have right away, not by the jump 10 s of the cubic curve give.
    #[test]
    fn cubic_leaves_the_time_the_window_went_unused_out_of_its_epoch() {
        let smss = 1000;
        let rtt = Duration::from_millis(10);
        let grown = |pause: bool| {
            let mut c = Cubic::new(100_000);
            c.on_congestion_event(Instant::ZERO, 100_000, smss);
            let mut now = Instant::ZERO;
            for _ in 0..10 {
                now += Duration::from_millis(1);
                c.on_ack(now, 1000, smss, Some(rtt));
            }
            if pause {
                for _ in 0..10_000 {
                    now += Duration::from_millis(1);
                    c.on_ack_unused(now);
                }
            }
            let before = c.cwnd();
            now += Duration::from_millis(1);
            c.on_ack(now, 1000, smss, Some(rtt));
            c.cwnd() - before
        };
        assert_eq!(grown(true), grown(false));
    }
}
