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
/// or with `-D` its sampling window), and its post and completion times if it kept them for
/// the peak.
#[derive(Debug, Clone)]
pub struct Part {
    pub iterations: u64,
    pub start: Instant,
    pub end: Instant,
    pub times: Option<PeakTimes>,
}

/// The most messages a queue pair may send in a size for the peak to be measured, as
/// perftest's (`print_report_bw` measures none above 20,000 iterations).
pub const PEAK_MAX_ITERATIONS: u64 = 20_000;

/// When a bandwidth run posted its messages and when they completed, as perftest keeps them
/// for its peak (`tposted`, `tcompleted`): each post call (one work request, or a list of
/// `-l`: perftest times a list's first) and each signaled completion (which says that the
/// messages before it are done too), with the messages each stands for, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeakTimes {
    /// Each post: when, and how many messages it posted.
    pub posts: Vec<(Instant, u64)>,
    /// Each signaled completion: when, and how many messages it completed.
    pub completions: Vec<(Instant, u64)>,
}

impl PeakTimes {
    /// Times kept for `iterations` messages posted `post_list` at a time, `cq_mod` to a
    /// signaled completion (room reserved for them).
    pub fn with_capacity(iterations: u64, post_list: u64, cq_mod: u64) -> Self {
        let room = |per: u64| (iterations / per.max(1) + 1) as usize;
        PeakTimes {
            posts: Vec::with_capacity(room(post_list)),
            completions: Vec::with_capacity(room(cq_mod)),
        }
    }

    /// The times of queue pairs that ran at once (`-q`) as one run's, as perftest's one
    /// thread records them for all its queue pairs: the posts and the completions of all, each
    /// in the order of their times.
    pub fn merge<'a>(parts: impl IntoIterator<Item = &'a PeakTimes>) -> PeakTimes {
        let mut all = PeakTimes::default();
        for p in parts {
            all.posts.extend_from_slice(&p.posts);
            all.completions.extend_from_slice(&p.completions);
        }
        all.posts.sort_by_key(|&(t, _)| t);
        all.completions.sort_by_key(|&(t, _)| t);
        all
    }

    /// perftest's peak (`print_report_bw`): the shortest time per message over the messages
    /// from any timed post `i` (message index) to any signaled completion `j` at or after it,
    /// `(tcompleted[j] - tposted[i]) / (j - i + 1)`, in seconds; `None` without a post or a
    /// completion (or a clock too coarse to order them). perftest tries every pair (`i` in
    /// steps of `-l`, `j` in steps of `--cq-mod`), which is quadratic; this finds the same
    /// minimum (to f64's precision) by bisecting on the time per message `x`: some pair
    /// takes at most `x` per message exactly when `min_j (d_j - x (j + 1)) - max_{i <= j}
    /// (p_i - x i)` is at most 0, which one pass over the posts and completions in order
    /// tells.
    pub fn fastest(&self) -> Option<f64> {
        let t0 = self.posts.first()?.0;
        let at = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
        // (time, index of the first message) of each post; (time, index of the last message
        // done) of each completion.
        let mut next = 0u64;
        let posts: Vec<(f64, f64)> = self
            .posts
            .iter()
            .map(|&(t, n)| {
                let i = next;
                next += n;
                (at(t), i as f64)
            })
            .collect();
        let mut done = 0u64;
        let completions: Vec<(f64, f64)> = self
            .completions
            .iter()
            .filter(|&&(_, n)| n > 0)
            .map(|&(t, n)| {
                done += n;
                (at(t), (done - 1) as f64)
            })
            .collect();
        // The least over the pairs of (d_j - p_i) - x (j - i + 1): at most 0 when some pair
        // takes at most x per message.
        let excess = |x: f64| -> Option<f64> {
            let mut best_post = f64::NEG_INFINITY;
            let mut k = 0;
            let mut least: Option<f64> = None;
            for &(d, j) in &completions {
                while k < posts.len() && posts[k].1 <= j {
                    best_post = best_post.max(posts[k].0 - x * posts[k].1);
                    k += 1;
                }
                if k > 0 {
                    let e = d - x * (j + 1.0) - best_post;
                    least = Some(least.map_or(e, |l: f64| l.min(e)));
                }
            }
            least
        };
        // A pair: the first post and the last completion, the run's own time per message.
        let &(d_last, j_last) = completions.last()?;
        let mut hi = (d_last - posts[0].0) / (j_last + 1.0);
        if excess(0.0)? <= 0.0 {
            // A completion timed no later than a post before it (a clock too coarse to tell):
            // no time per message to divide by.
            return None;
        }
        let mut lo = 0.0;
        for _ in 0..100 {
            let mid = (lo + hi) / 2.0;
            if mid <= lo || mid >= hi {
                break;
            }
            match excess(mid) {
                Some(e) if e <= 0.0 => hi = mid,
                _ => lo = mid,
            }
        }
        Some(hi)
    }
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
    /// perftest's peak ([`PeakTimes::fastest`]), MiB/s; `None` where it is not measured
    /// (`-N`, `-D`, `--run_infinitely`, more than [`PEAK_MAX_ITERATIONS`] messages per
    /// queue pair), which the table prints as 0.00, as perftest's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_mib_per_sec: Option<f64>,
    /// The peak in Gbit/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_gbit_per_sec: Option<f64>,
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
            peak_mib_per_sec: None,
            peak_gbit_per_sec: None,
        }
    }

    /// With the peak of a run whose fastest messages took `seconds_per_message` each
    /// ([`PeakTimes::fastest`]; `None`: no peak).
    pub fn with_peak(self, seconds_per_message: Option<f64>) -> Self {
        let rate = seconds_per_message.map(|s| self.bytes as f64 / s.max(1e-12));
        Self {
            peak_mib_per_sec: rate.map(|r| r / (1024.0 * 1024.0)),
            peak_gbit_per_sec: rate.map(|r| r * 8.0 / 1e9),
            ..self
        }
    }

    /// Queue pairs that ran `bytes`-octet messages at the same time (`-q`), as one: all
    /// their messages over the time from the first one's start to the last one's end
    /// (perftest's rule: all the octets over the time from the first post to the last
    /// completion), never more than the link carried; the peak over all their times
    /// ([`PeakTimes::merge`]) when every one kept them.
    pub fn concurrent(bytes: u64, parts: &[Part]) -> Self {
        let iterations = parts.iter().map(|p| p.iterations).sum();
        let first = parts.iter().map(|p| p.start).min();
        let last = parts.iter().map(|p| p.end).max();
        let seconds = match (first, last) {
            (Some(first), Some(last)) => last.saturating_duration_since(first).as_secs_f64(),
            _ => 0.0,
        };
        let times: Option<Vec<&PeakTimes>> = parts.iter().map(|p| p.times.as_ref()).collect();
        let peak = times
            .filter(|t| !t.is_empty())
            .and_then(|t| PeakTimes::merge(t).fastest());
        Self::new(bytes, iterations, seconds).with_peak(peak)
    }

    /// Both directions of `-b` in one row, as perftest's duplex row: `self`'s size and
    /// message count, the rates of both added (the peaks too, when both were measured).
    pub fn with_reverse(&self, reverse: &BandwidthResult) -> Self {
        let add = |a: Option<f64>, b: Option<f64>| Some(a? + b?);
        Self {
            mib_per_sec: self.mib_per_sec + reverse.mib_per_sec,
            gbit_per_sec: self.gbit_per_sec + reverse.gbit_per_sec,
            msg_rate_mpps: self.msg_rate_mpps + reverse.msg_rate_mpps,
            peak_mib_per_sec: add(self.peak_mib_per_sec, reverse.peak_mib_per_sec),
            peak_gbit_per_sec: add(self.peak_gbit_per_sec, reverse.peak_gbit_per_sec),
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
        Self::with_margin(start, total, None)
    }

    /// The window of a run of `total` that started at `start`, `margin` whole seconds left
    /// out at each end (perftest's `-f`; `None`: a quarter of `total`'s whole seconds). A
    /// margin that leaves no window (`total` at most twice it, which `-f`'s check refuses)
    /// leaves the whole run.
    pub fn with_margin(start: Instant, total: Duration, margin: Option<u32>) -> Self {
        let margin = match margin {
            Some(m) if total > Duration::from_secs(2 * u64::from(m)) => {
                Duration::from_secs(u64::from(m))
            }
            Some(_) => Duration::ZERO,
            None => Duration::from_secs(total.as_secs() / 4),
        };
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
                times: None,
            },
            Part {
                iterations: 100,
                start: at(0.3),
                end: at(1.3),
                times: None,
            },
        ];
        let r = BandwidthResult::concurrent(1000, &parts);
        assert!((r.seconds - 1.3).abs() < 1e-6, "{}", r.seconds);
        assert_eq!(r.iterations, 200);
        assert!((r.msg_rate_mpps - 200.0 / 1.3 / 1e6).abs() < 1e-9);
        assert_eq!(BandwidthResult::concurrent(1000, &[]).iterations, 0);
    }

    /// perftest's peak loop (`print_report_bw`), literally: every timed post `i` (list heads)
    /// against every signaled completion `j >= i`, `(d_j - p_i) / (j - i + 1)`, the least.
    fn perftest_peak(times: &super::PeakTimes) -> f64 {
        let t0 = times.posts[0].0;
        let mut posts = Vec::new();
        let mut i = 0;
        for &(t, n) in &times.posts {
            posts.push((t.duration_since(t0).as_secs_f64(), i));
            i += n;
        }
        let mut done = Vec::new();
        let mut j = 0;
        for &(t, n) in &times.completions {
            j += n;
            done.push((t.duration_since(t0).as_secs_f64(), j - 1));
        }
        let mut best = f64::INFINITY;
        for &(p, i) in &posts {
            for &(d, j) in done.iter().filter(|c| c.1 >= i) {
                best = best.min((d - p) / (j - i + 1) as f64);
            }
        }
        best
    }

    /// The peak found by bisection is perftest's least time per message over every post and
    /// every later signaled completion: on made-up runs with CQ moderation, post lists and a
    /// burst somewhere in the middle, and on `-q`'s merged times.
    #[test]
    fn the_peak_is_perftests_least_time_per_message() {
        use super::PeakTimes;
        use std::time::{Duration, Instant};
        let t0 = Instant::now();
        let ns = |n: u64| t0 + Duration::from_nanos(n);
        // A small generator (xorshift) for the gaps: no crate needed.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for (messages, post_list, cq_mod) in [(300, 1, 1), (5000, 1, 100), (997, 4, 8), (20, 1, 7)]
        {
            let mut times = PeakTimes::default();
            let (mut now, mut posted, mut done) = (1_000u64, 0u64, 0u64);
            while done < messages {
                // Post a list when the window has room, then complete what is due.
                if posted < messages && posted - done < 64 {
                    let n = post_list.min(messages - posted);
                    times.posts.push((ns(now), n));
                    posted += n;
                    now += 50 + rand(200);
                }
                let burst = (messages / 2..messages / 2 + 10).contains(&done);
                now += if burst { 5 } else { 300 + rand(3000) };
                while done < posted {
                    done += 1;
                    if done % cq_mod == 0 || done == messages {
                        let since = times.completions.iter().map(|c| c.1).sum::<u64>();
                        times.completions.push((ns(now), done - since));
                        break;
                    }
                }
            }
            let want = perftest_peak(&times);
            let got = times.fastest().expect("a peak");
            assert!(
                (got - want).abs() <= want * 1e-9,
                "{messages}/{post_list}/{cq_mod}: {got} against perftest's {want}"
            );
            // No faster than the fastest pair, no slower than the whole run.
            let (first, last) = (times.posts[0].0, times.completions.last().unwrap().0);
            assert!(got <= last.duration_since(first).as_secs_f64() / messages as f64);
        }
        // Two queue pairs' times merged (-q): as one run that posted and completed all of
        // them in time order.
        let a = PeakTimes {
            posts: vec![(ns(0), 1), (ns(10), 1)],
            completions: vec![(ns(100), 2)],
        };
        let b = PeakTimes {
            posts: vec![(ns(5), 1), (ns(15), 1)],
            completions: vec![(ns(40), 1), (ns(60), 1)],
        };
        let all = PeakTimes::merge([&a, &b]);
        assert_eq!(
            all.posts.iter().map(|p| p.0).collect::<Vec<_>>(),
            [ns(0), ns(5), ns(10), ns(15)]
        );
        assert_eq!(all.completions, [(ns(40), 1), (ns(60), 1), (ns(100), 2)]);
        // perftest's pairs: the first post (0 ns) to the last completion (100 ns, message 3):
        // 25 ns each, the least (post 0 to message 1 takes 30, post 1 to message 3 31.7).
        let got = all.fastest().unwrap();
        assert!((got - 25e-9).abs() < 1e-15, "{got}");
        assert!((got - perftest_peak(&all)).abs() < 1e-15);
        assert_eq!(PeakTimes::default().fastest(), None);
    }

    /// A peak in the units of the row, added for `-b`'s duplex row when both were measured.
    #[test]
    fn the_peak_in_both_units_and_summed() {
        use super::BandwidthResult;
        let r = BandwidthResult::new(1 << 20, 100, 1.0).with_peak(Some(0.001));
        assert_eq!(r.peak_mib_per_sec, Some(1000.0));
        assert!((r.peak_gbit_per_sec.unwrap() - 8.388608).abs() < 1e-9);
        let both = r.with_reverse(&r);
        assert_eq!(both.peak_mib_per_sec, Some(2000.0));
        let none = BandwidthResult::new(1 << 20, 100, 1.0);
        assert_eq!(r.with_reverse(&none).peak_mib_per_sec, None);
        // None measured: absent from --json, as before.
        let v = serde_json::to_value(&none).unwrap();
        assert!(v.get("peak_mib_per_sec").is_none(), "{v}");
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
        // perftest's -f: the margin given, in whole seconds, instead of the quarter.
        let w = SampleWindow::with_margin(t0, Duration::from_secs(3), Some(1));
        assert_eq!(w.seconds(), 1.0);
        assert!(!w.contains(at(999)) && w.contains(at(1000)) && !w.contains(at(2000)));
        let w = SampleWindow::with_margin(t0, Duration::from_secs(8), Some(0));
        assert_eq!(w.seconds(), 8.0);
        assert_eq!(
            SampleWindow::with_margin(t0, Duration::from_secs(10), None),
            SampleWindow::new(t0, Duration::from_secs(10))
        );
        // One that would leave no window (refused on the command line): the whole run.
        let w = SampleWindow::with_margin(t0, Duration::from_secs(4), Some(2));
        assert_eq!(w.seconds(), 4.0);
    }

    #[test]
    fn bandwidth_units() {
        let r = BandwidthResult::new(1 << 20, 1000, 1.0);
        assert!((r.mib_per_sec - 1000.0).abs() < 1e-9);
        assert!((r.gbit_per_sec - 8.388608).abs() < 1e-9);
        assert!((r.msg_rate_mpps - 0.001).abs() < 1e-12);
    }
}
