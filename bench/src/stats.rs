//! Result summaries in perftest's vocabulary.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Latency distribution of one size (microseconds), as perftest prints it.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyResult {
    pub bytes: u64,
    pub iterations: u64,
    pub t_min_us: f64,
    pub t_max_us: f64,
    /// Median (perftest's t_typical).
    pub t_typical_us: f64,
    pub t_avg_us: f64,
    pub t_stdev_us: f64,
    pub p99_us: f64,
    pub p99_9_us: f64,
    /// `-D`: operations per second in the sampling window (perftest's `tps average`); the
    /// figures above are of the window's samples.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tps: Option<f64>,
}

impl LatencyResult {
    /// Summarises samples (microseconds) as perftest's `print_report_lat` does, so that our
    /// rows and a real perftest's on the other end agree: sorted, the
    /// [`LAT_MEASURE_TAIL`] largest left out (one-off stalls), then over the `m` left: t_min
    /// the smallest, t_max the next sample above them (the largest but one), t_typical
    /// their median (the mean of the middle two when `m` is even), t_avg and t_stdev their
    /// mean and population standard deviation, p99 and p99.9 the samples at `ceil(m x q)`.
    ///
    /// One deliberate difference: t_stdev is computed in floating point, as perftest did up to
    /// 6.05. Since 6.06 (commit 6234a09, "fix cppcheck warnings") perftest's
    /// `print_report_lat` keeps each deviation and its square in an `int` (`int temp_var =
    /// average - delta; int pow_var = pow(temp_var, 2)`), truncating them to whole
    /// microseconds, so that a spread below a microsecond reads 0 there; ours gives it.
    /// Fewer than four samples are summarised whole. Empty input gives zeros; `iterations`
    /// is the number of samples.
    pub fn from_samples(bytes: u64, samples: &mut [f64]) -> Self {
        samples.sort_by(|a, b| a.total_cmp(b));
        let n = samples.len();
        if n == 0 {
            return Self {
                bytes,
                iterations: 0,
                t_min_us: 0.0,
                t_max_us: 0.0,
                t_typical_us: 0.0,
                t_avg_us: 0.0,
                t_stdev_us: 0.0,
                p99_us: 0.0,
                p99_9_us: 0.0,
                tps: None,
            };
        }
        let m = if n > LAT_MEASURE_TAIL + 1 {
            n - LAT_MEASURE_TAIL
        } else {
            n
        };
        let kept = &samples[..m];
        let at = |i: usize| samples[i.min(n - 1)];
        let quantile = |q: f64| at((m as f64 * q).ceil() as usize);
        let median = if m % 2 == 0 {
            (kept[m / 2 - 1] + kept[m / 2]) / 2.0
        } else {
            kept[m / 2]
        };
        let avg = kept.iter().sum::<f64>() / m as f64;
        let var = kept.iter().map(|s| (s - avg) * (s - avg)).sum::<f64>() / m as f64;
        Self {
            bytes,
            iterations: n as u64,
            t_min_us: kept[0],
            t_max_us: at(m),
            t_typical_us: median,
            t_avg_us: avg,
            t_stdev_us: var.sqrt(),
            p99_us: quantile(0.99),
            p99_9_us: quantile(0.999),
            tps: None,
        }
    }
}

/// One queue pair's share of a size that several ran at once (`-q`): the messages it
/// counted and the time they were counted over (from its first post to its last completion,
/// or with `-D` its sampling window).
#[derive(Debug, Clone, Copy)]
pub struct Part {
    pub iterations: u64,
    pub start: Instant,
    pub end: Instant,
}

/// Throughput of one size.
#[derive(Debug, Clone, Serialize)]
pub struct BandwidthResult {
    pub bytes: u64,
    pub iterations: u64,
    pub seconds: f64,
    pub mib_per_sec: f64,
    pub gbit_per_sec: f64,
    pub msg_rate_mpps: f64,
}

impl BandwidthResult {
    pub fn new(bytes: u64, iterations: u64, seconds: f64) -> Self {
        // In f64: `iterations` may come from the peer (`-b`'s report).
        let total = bytes as f64 * iterations as f64;
        let s = seconds.max(1e-9);
        Self {
            bytes,
            iterations,
            seconds,
            mib_per_sec: total / s / (1024.0 * 1024.0),
            gbit_per_sec: total * 8.0 / s / 1e9,
            msg_rate_mpps: iterations as f64 / s / 1e6,
        }
    }
}

impl BandwidthResult {
    /// Queue pairs that ran `bytes`-octet messages at the same time (`-q`), as one: all
    /// their messages over the time from the first one's start to the last one's end
    /// (perftest's rule: all the octets over the time from the first post to the last
    /// completion), never more than the link carried.
    pub fn concurrent(bytes: u64, parts: &[Part]) -> Self {
        let iterations = parts.iter().map(|p| p.iterations).sum();
        let first = parts.iter().map(|p| p.start).min();
        let last = parts.iter().map(|p| p.end).max();
        let seconds = match (first, last) {
            (Some(first), Some(last)) => last.saturating_duration_since(first).as_secs_f64(),
            _ => 0.0,
        };
        Self::new(bytes, iterations, seconds)
    }

    /// Both directions of `-b` in one row, as perftest's duplex row: `self`'s size and
    /// message count, the rates of both added.
    pub fn with_reverse(&self, reverse: &BandwidthResult) -> Self {
        Self {
            mib_per_sec: self.mib_per_sec + reverse.mib_per_sec,
            gbit_per_sec: self.gbit_per_sec + reverse.gbit_per_sec,
            msg_rate_mpps: self.msg_rate_mpps + reverse.msg_rate_mpps,
            ..self.clone()
        }
    }
}

/// perftest's duration mode (`-D`): a run lasts `total`, and only what completes in its middle
/// counts. perftest_parameters.c sets `margin = duration / 4` (whole seconds, rounded down);
/// perftest_resources.c's `catch_alarm` moves from START to SAMPLE after the margin, to
/// STOP_SAMPLE `duration - 2 * margin` later, to END after the margin again, and the report
/// counts the operations completed in SAMPLE over that state's length. A run shorter than four
/// seconds has no margins.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleWindow {
    /// When the run started.
    start: Instant,
    total: Duration,
    from: Duration,
    to: Duration,
    /// Operations completed in the window.
    counted: u64,
}

impl SampleWindow {
    /// The window of a run of `total` that started at `start`.
    pub fn new(start: Instant, total: Duration) -> Self {
        let margin = Duration::from_secs(total.as_secs() / 4);
        Self {
            start,
            total,
            from: margin,
            to: total - margin,
            counted: 0,
        }
    }

    /// Whether the run is over at `now` (no more posting).
    pub fn time_up(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.start) >= self.total
    }

    /// Whether `now` is in the window.
    pub fn contains(&self, now: Instant) -> bool {
        let at = now.saturating_duration_since(self.start);
        at >= self.from && at < self.to
    }

    /// `n` operations completed at `now`: counted if that is in the window.
    pub fn completed(&mut self, now: Instant, n: u64) {
        if self.contains(now) {
            self.counted += n;
        }
    }

    /// Operations completed in the window.
    pub fn counted(&self) -> u64 {
        self.counted
    }

    /// The window's length in seconds (what perftest divides by).
    pub fn seconds(&self) -> f64 {
        (self.to - self.from).as_secs_f64()
    }

    /// When the window opens and closes.
    pub fn span(&self) -> (Instant, Instant) {
        (self.start + self.from, self.start + self.to)
    }
}

/// How many of the largest samples perftest leaves out of a sorted report (its
/// `LAT_MEASURE_TAIL`).
const LAT_MEASURE_TAIL: usize = 2;

/// A number as C's `printf("%g")` writes it (six significant digits, trailing zeros dropped,
/// an exponent outside 1e-4..1e6), as perftest prints each sample.
pub fn printf_g(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_finite() {
            "0".into()
        } else {
            v.to_string()
        };
    }
    let exp = v.abs().log10().floor() as i32;
    // Rounding to six digits can carry into the next power of ten (999999.5 -> 1e+06).
    let exp = {
        let scientific = format!("{:.5e}", v);
        scientific
            .split('e')
            .nth(1)
            .and_then(|e| e.parse::<i32>().ok())
            .unwrap_or(exp)
    };
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s
        }
    };
    if !(-4..6).contains(&exp) {
        let s = format!("{:.5e}", v);
        let (mantissa, e) = s.split_once('e').unwrap_or((&s, "0"));
        let e: i32 = e.parse().unwrap_or(0);
        format!(
            "{}e{}{:02}",
            trim(mantissa.to_owned()),
            if e < 0 { '-' } else { '+' },
            e.abs()
        )
    } else {
        let decimals = (5 - exp).max(0) as usize;
        trim(format!("{v:.decimals$}"))
    }
}

/// perftest's `-U` (`unsorted`: every sample in the order taken) or `-H` (the samples sorted,
/// the largest [`LAT_MEASURE_TAIL`] left out): a `#, usec` line, then `i, value` per sample.
pub fn lat_samples_report(samples: &[f64], sorted: bool) -> String {
    let mut v = samples.to_vec();
    if sorted {
        v.sort_by(f64::total_cmp);
        // As `LatencyResult::from_samples`: three samples or fewer are kept whole.
        if v.len() > LAT_MEASURE_TAIL + 1 {
            v.truncate(v.len() - LAT_MEASURE_TAIL);
        }
    }
    let mut out = String::from("#, usec\n");
    for (i, s) in v.iter().enumerate() {
        out.push_str(&format!("{}, {}\n", i + 1, printf_g(*s)));
    }
    out
}

#[cfg(test)]
mod tests {
    /// `-q`: the row of parts that did not run over the same time spans both, from the first
    /// start to the last end (not the longest single part).
    #[test]
    fn concurrent_spans_from_the_first_start_to_the_last_end() {
        use super::{BandwidthResult, Part};
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let parts = [
            Part {
                iterations: 100,
                start: at(0.0),
                end: at(1.0),
            },
            Part {
                iterations: 100,
                start: at(0.3),
                end: at(1.3),
            },
        ];
        let r = BandwidthResult::concurrent(1000, &parts);
        assert!((r.seconds - 1.3).abs() < 1e-6, "{}", r.seconds);
        assert_eq!(r.iterations, 200);
        assert!((r.msg_rate_mpps - 200.0 / 1.3 / 1e6).abs() < 1e-9);
        assert_eq!(BandwidthResult::concurrent(1000, &[]).iterations, 0);
    }

    /// Against C's printf("%g") (Python's `'%g' % v` is the same).
    #[test]
    fn printf_g_matches_c() {
        for (v, c) in [
            (4.3215, "4.3215"),
            (12.345678, "12.3457"),
            (0.000123, "0.000123"),
            (0.0000123, "1.23e-05"),
            (1234567.0, "1.23457e+06"),
            (100.0, "100"),
            (999999.5, "1e+06"),
            (5.0, "5"),
            (1.23456789, "1.23457"),
            (0.5, "0.5"),
            (0.0, "0"),
        ] {
            assert_eq!(super::printf_g(v), c, "{v}");
        }
    }

    #[test]
    fn sample_reports_as_perftest_prints_them() {
        let samples = [3.5, 1.25, 9.0, 2.0, 7.75];
        assert_eq!(
            super::lat_samples_report(&samples, false),
            "#, usec\n1, 3.5\n2, 1.25\n3, 9\n4, 2\n5, 7.75\n"
        );
        // Sorted, the two largest left out (perftest's LAT_MEASURE_TAIL).
        assert_eq!(
            super::lat_samples_report(&samples, true),
            "#, usec\n1, 1.25\n2, 2\n3, 3.5\n"
        );
    }

    use super::*;

    /// perftest's `print_report_lat` over 1..=1000: the two largest left out (m = 998),
    /// t_max `delta[m]`, the median of an even count the mean of the middle two, the
    /// percentiles `delta[ceil(m x q)]`, avg and stdev over the m kept (population).
    #[test]
    fn latency_summary_as_perftest_computes_it() {
        let mut s: Vec<f64> = (1..=1000).map(f64::from).collect();
        s.reverse();
        let r = LatencyResult::from_samples(64, &mut s);
        assert_eq!(r.iterations, 1000);
        assert_eq!(r.t_min_us, 1.0);
        assert_eq!(r.t_max_us, 999.0);
        assert_eq!(r.t_typical_us, 499.5);
        assert_eq!(r.p99_us, 990.0);
        assert_eq!(r.p99_9_us, 999.0);
        assert!((r.t_avg_us - 499.5).abs() < 1e-9);
        // Population variance of 1..=998: (998^2 - 1) / 12.
        let stdev = ((998.0f64 * 998.0 - 1.0) / 12.0).sqrt();
        assert!((r.t_stdev_us - stdev).abs() < 1e-9, "{}", r.t_stdev_us);
        // One stall among steady samples moves neither the maximum nor the mean.
        let mut s = vec![2.0; 99];
        s.push(150.0);
        let r = LatencyResult::from_samples(64, &mut s);
        assert_eq!((r.t_max_us, r.t_avg_us, r.t_stdev_us), (2.0, 2.0, 0.0));
        // An odd count left: the middle sample.
        let mut s = vec![5.0, 1.0, 3.0, 100.0, 200.0];
        let r = LatencyResult::from_samples(64, &mut s);
        assert_eq!((r.t_min_us, r.t_typical_us, r.t_max_us), (1.0, 3.0, 100.0));
        // Three samples or fewer: all of them.
        let mut s = vec![4.0, 2.0];
        let r = LatencyResult::from_samples(64, &mut s);
        assert_eq!((r.t_min_us, r.t_max_us, r.t_typical_us), (2.0, 4.0, 3.0));
        assert!(LatencyResult::from_samples(64, &mut []).t_max_us == 0.0);
    }

    /// perftest's margins of a `-D` run, on a clock the test moves: a quarter of the whole
    /// seconds, rounded down, at each end; no margin under four seconds.
    #[test]
    fn duration_runs_count_the_middle_as_perftest() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = SampleWindow::new(t0, Duration::from_secs(5));
        // margin 1 s: the window is [1 s, 4 s), 3 s long.
        assert_eq!(w.seconds(), 3.0);
        for (ms, n) in [
            (0, 100),
            (999, 100),
            (1000, 7),
            (2500, 10),
            (3999, 3),
            (4000, 100),
        ] {
            w.completed(at(ms), n);
        }
        assert_eq!(w.counted(), 20);
        assert!(!w.time_up(at(4999)) && w.time_up(at(5000)));
        // 10 s: margin 2, window [2 s, 8 s).
        let w = SampleWindow::new(t0, Duration::from_secs(10));
        assert_eq!(w.seconds(), 6.0);
        assert!(!w.contains(at(1999)) && w.contains(at(2000)) && !w.contains(at(8000)));
        // 7 s: margin 1 (7 / 4 rounded down), window 5 s.
        assert_eq!(SampleWindow::new(t0, Duration::from_secs(7)).seconds(), 5.0);
        // Under 4 s (and fractions of a second): the whole run.
        for ms in [300, 1000, 3999] {
            let mut w = SampleWindow::new(t0, Duration::from_millis(ms));
            assert_eq!(w.seconds(), ms as f64 / 1000.0);
            w.completed(at(0), 1);
            w.completed(at(ms - 1), 1);
            w.completed(at(ms), 1);
            assert_eq!(w.counted(), 2, "{ms}");
        }
        // 4.5 s: margin 1 s, window [1 s, 3.5 s).
        let w = SampleWindow::new(t0, Duration::from_millis(4500));
        assert_eq!(w.seconds(), 2.5);
        assert!(w.contains(at(3499)) && !w.contains(at(3500)));
    }

    #[test]
    fn bandwidth_units() {
        let r = BandwidthResult::new(1 << 20, 1000, 1.0);
        assert!((r.mib_per_sec - 1000.0).abs() < 1e-9);
        assert!((r.gbit_per_sec - 8.388608).abs() < 1e-9);
        assert!((r.msg_rate_mpps - 0.001).abs() < 1e-12);
    }
}
