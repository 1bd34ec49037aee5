//! Result summaries in perftest's vocabulary.

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
}

impl LatencyResult {
    /// Summarises samples (microseconds). Empty input gives zeros.
    pub fn from_samples(bytes: u64, samples: &mut [f64]) -> Self {
        samples.sort_by(|a, b| a.total_cmp(b));
        let n = samples.len();
        let pick = |q: f64| -> f64 {
            if n == 0 {
                return 0.0;
            }
            let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
            samples[i]
        };
        let avg = if n == 0 {
            0.0
        } else {
            samples.iter().sum::<f64>() / n as f64
        };
        let var = if n < 2 {
            0.0
        } else {
            samples.iter().map(|s| (s - avg) * (s - avg)).sum::<f64>() / (n - 1) as f64
        };
        Self {
            bytes,
            iterations: n as u64,
            t_min_us: samples.first().copied().unwrap_or(0.0),
            t_max_us: samples.last().copied().unwrap_or(0.0),
            t_typical_us: pick(0.5),
            t_avg_us: avg,
            t_stdev_us: var.sqrt(),
            p99_us: pick(0.99),
            p99_9_us: pick(0.999),
        }
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
}

impl BandwidthResult {
    pub fn new(bytes: u64, iterations: u64, seconds: f64) -> Self {
        let total = (bytes * iterations) as f64;
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

pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]";
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW average[MiB/sec]   BW average[Gb/sec]   MsgRate[Mpps]";

pub fn lat_row(r: &LatencyResult) -> String {
    format!(
        " {:<7} {:<11} {:<14.2} {:<14.2} {:<16.2} {:<14.2} {:<16.2} {:<22.2} {:<.2}",
        r.bytes,
        r.iterations,
        r.t_min_us,
        r.t_max_us,
        r.t_typical_us,
        r.t_avg_us,
        r.t_stdev_us,
        r.p99_us,
        r.p99_9_us
    )
}

pub fn bw_row(r: &BandwidthResult) -> String {
    format!(
        " {:<10} {:<15} {:<21.2} {:<20.3} {:.6}",
        r.bytes, r.iterations, r.mib_per_sec, r.gbit_per_sec, r.msg_rate_mpps
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_summary() {
        let mut s: Vec<f64> = (1..=1000).map(f64::from).collect();
        s.reverse();
        let r = LatencyResult::from_samples(64, &mut s);
        assert_eq!(r.t_min_us, 1.0);
        assert_eq!(r.t_max_us, 1000.0);
        assert_eq!(r.t_typical_us, 500.0);
        assert_eq!(r.p99_us, 990.0);
        assert_eq!(r.p99_9_us, 999.0);
        assert!((r.t_avg_us - 500.5).abs() < 1e-9);
    }

    #[test]
    fn bandwidth_units() {
        let r = BandwidthResult::new(1 << 20, 1000, 1.0);
        assert!((r.mib_per_sec - 1000.0).abs() < 1e-9);
        assert!((r.gbit_per_sec - 8.388608).abs() < 1e-9);
        assert!((r.msg_rate_mpps - 0.001).abs() < 1e-12);
    }
}
