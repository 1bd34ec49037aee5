//! Where a message's time goes on the engine's path (issue #24, latency): time-stamp-counter
//! marks at named points of a turn ([`Mark`]), and for each pair of marks that follow each
//! other on one thread, how often and how long apart. `scripts/latency-breakdown.sh` runs
//! write-lat with it and prints each side's half round trip step by step.
//!
//! Compiled in only with the `latency-probe` feature; without it [`mark`] is an empty inline
//! function and [`report`] says so, so the engine's own builds carry nothing of it. With it, a
//! mark costs a `rdtsc`, two thread-local look-ups and two relaxed loads and stores (each
//! thread writes only its own table, allocated once and kept until the process ends).

/// The points of an engine turn that are marked, in the order a received message meets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mark {
    /// A poll that is not quiet begins (after the quiet check, before the clock is read).
    PollStart,
    /// A receive batch with frames came off an RX ring.
    FrameSeen,
    /// The frame is this shard's (directory looked up) and goes to TCP.
    FrameRouted,
    /// The segment's payload sum (and its FPDU's CRC) were computed.
    PayloadSummed,
    /// TCP passes the segment's data up to the connection.
    DataPassedUp,
    /// The connection has taken the data (MPA, DDP, RDMAP, placement).
    DataPlaced,
    /// TCP is done with the segment.
    SegmentDone,
    /// The poll's receive step is done.
    Received,
    /// The poll's service step (events, requests, `IwarpConn::poll`, completions) is done.
    Serviced,
    /// A queue-pair work request is posted (on the posting thread).
    Posted,
    /// The transmit step begins.
    TransmitStart,
    /// A frame was written (TCP segment, FPDU) into a UMEM frame.
    FrameWritten,
    /// The `sendto` that makes the kernel send begins.
    KickStart,
    /// It returned.
    KickDone,
    /// The transmit step is done.
    Transmitted,
    /// An answering poll handed out what the data it received completed, and returns to the
    /// application without a service.
    Delivered,
}

/// Records that the calling thread reached `m` (with the `latency-probe` feature).
#[inline(always)]
pub fn mark(m: Mark) {
    #[cfg(feature = "latency-probe")]
    imp::mark(m);
    #[cfg(not(feature = "latency-probe"))]
    let _ = m;
}

/// One step between two marks, summed over every thread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// The mark the step starts at.
    pub from: Mark,
    /// The mark that followed it on the same thread.
    pub to: Mark,
    /// How many times.
    pub count: u64,
    /// Mean time between them, in nanoseconds.
    pub mean_ns: f64,
}

/// Every step seen so far, most frequent first (`None` without the `latency-probe` feature).
/// Calibrates the time-stamp counter against the clock for 50 ms.
pub fn steps() -> Option<Vec<Step>> {
    #[cfg(feature = "latency-probe")]
    return Some(imp::steps());
    #[cfg(not(feature = "latency-probe"))]
    None
}

/// [`steps`] as text, one `probe: FROM -> TO: MEAN ns (n COUNT)` line each, for steps seen at
/// least `min_count` times; `None` without the feature.
pub fn report(min_count: u64) -> Option<String> {
    let steps = steps()?;
    let mut out = String::new();
    for s in steps.iter().filter(|s| s.count >= min_count) {
        out.push_str(&format!(
            "probe: {:?} -> {:?}: {:.1} ns (n {})\n",
            s.from, s.to, s.mean_ns, s.count
        ));
    }
    Some(out)
}

#[cfg(feature = "latency-probe")]
mod imp {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::{Mark, Step};

    /// Number of [`Mark`]s.
    const MARKS: usize = Mark::Delivered as usize + 1;

    /// All marks, by number.
    const ALL: [Mark; MARKS] = [
        Mark::PollStart,
        Mark::FrameSeen,
        Mark::FrameRouted,
        Mark::PayloadSummed,
        Mark::DataPassedUp,
        Mark::DataPlaced,
        Mark::SegmentDone,
        Mark::Received,
        Mark::Serviced,
        Mark::Posted,
        Mark::TransmitStart,
        Mark::FrameWritten,
        Mark::KickStart,
        Mark::KickDone,
        Mark::Transmitted,
        Mark::Delivered,
    ];

    /// Gaps longer than this (the thread slept, or the run paused) are not counted.
    const LONGEST_CYCLES: u64 = 20_000_000;

    /// One thread's table: sum of cycles and count per (from, to).
    struct Table {
        sum: [[AtomicU64; MARKS]; MARKS],
        count: [[AtomicU64; MARKS]; MARKS],
    }

    static TABLES: Mutex<Vec<&'static Table>> = Mutex::new(Vec::new());

    thread_local! {
        static MINE: Cell<Option<&'static Table>> = const { Cell::new(None) };
        static LAST: Cell<Option<(Mark, u64)>> = const { Cell::new(None) };
    }

    fn tsc() -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: `rdtsc` reads the time-stamp counter; it touches no memory.
            unsafe { core::arch::x86_64::_rdtsc() }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            use std::sync::OnceLock;
            static START: OnceLock<Instant> = OnceLock::new();
            START.get_or_init(Instant::now).elapsed().as_nanos() as u64
        }
    }

    fn table() -> &'static Table {
        MINE.with(|m| {
            if let Some(t) = m.get() {
                return t;
            }
            // Once per thread, kept until the process ends (`report` reads it after the
            // thread is gone).
            let t: &'static Table = Box::leak(Box::new(Table {
                sum: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
                count: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            }));
            TABLES.lock().unwrap_or_else(|e| e.into_inner()).push(t);
            m.set(Some(t));
            t
        })
    }

    pub(super) fn mark(m: Mark) {
        let now = tsc();
        let last = LAST.with(|l| l.replace(Some((m, now))));
        if let Some((from, then)) = last {
            let d = now.wrapping_sub(then);
            if d < LONGEST_CYCLES {
                // This thread is the table's only writer: a load and a store, not a locked
                // read-modify-write (`report` may read a step one mark behind).
                let t = table();
                let (sum, count) = (
                    &t.sum[from as usize][m as usize],
                    &t.count[from as usize][m as usize],
                );
                sum.store(sum.load(Relaxed).wrapping_add(d), Relaxed);
                count.store(count.load(Relaxed) + 1, Relaxed);
            }
        }
    }

    /// Counter cycles per nanosecond, measured over 50 ms.
    fn cycles_per_ns() -> f64 {
        let (c0, t0) = (tsc(), Instant::now());
        std::thread::sleep(Duration::from_millis(50));
        let ns = t0.elapsed().as_nanos().max(1) as f64;
        tsc().wrapping_sub(c0) as f64 / ns
    }

    pub(super) fn steps() -> Vec<Step> {
        let per_ns = cycles_per_ns().max(f64::MIN_POSITIVE);
        let tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for from in ALL {
            for to in ALL {
                let (mut sum, mut count) = (0u64, 0u64);
                for t in tables.iter().copied() {
                    sum += t.sum[from as usize][to as usize].load(Relaxed);
                    count += t.count[from as usize][to as usize].load(Relaxed);
                }
                if count > 0 {
                    out.push(Step {
                        from,
                        to,
                        count,
                        mean_ns: sum as f64 / count as f64 / per_ns,
                    });
                }
            }
        }
        out.sort_by_key(|s| std::cmp::Reverse(s.count));
        out
    }
}

#[cfg(all(test, feature = "latency-probe"))]
mod tests {
    use super::*;

    #[test]
    fn steps_are_counted_per_thread_between_consecutive_marks() {
        // A thread of its own: its marks are the only ones on it.
        std::thread::spawn(|| {
            for _ in 0..10 {
                mark(Mark::KickStart);
                std::thread::sleep(std::time::Duration::from_micros(200));
                mark(Mark::KickDone);
            }
        })
        .join()
        .expect("marking thread");
        let steps = steps().expect("the feature is on");
        let find = |from, to| steps.iter().find(|s| s.from == from && s.to == to).copied();
        // At least: with the feature on, other tests of this binary running engines beside
        // this one would add their own steps (test.sh runs `probe::` alone).
        let slept = find(Mark::KickStart, Mark::KickDone).expect("start -> done");
        assert!(slept.count >= 10, "{slept:?}");
        assert!(
            slept.mean_ns >= 150_000.0,
            "200 us sleeps measured as {} ns",
            slept.mean_ns
        );
        let back = find(Mark::KickDone, Mark::KickStart).expect("done -> next start");
        assert!(back.count >= 9, "{back:?}");
        assert!(back.mean_ns < slept.mean_ns);
        let text = report(1).expect("report");
        assert!(text.contains("probe: KickStart -> KickDone: "), "{text}");
        let text = report(u64::MAX).expect("report");
        assert!(text.is_empty(), "every step is below min_count: {text}");
    }
}
