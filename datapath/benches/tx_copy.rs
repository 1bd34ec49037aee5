//! The transmit path's one pass over an FPDU's payload: copy from a registered region into a
//! frame with the MPA CRC32C and the TCP checksum's sum on the way
//! (`PinnedBuffer::read_at_crc_sum`), 1428 octets (a full FPDU at MTU 1500) into a frame at the
//! payload's place in an engine segment (82 octets in). Three sources:
//! - `hot`: the same 64 KiB over and over (in cache; perftest reuses its buffer like this);
//! - `cold`: 8 MiB walked in order, as `iwarp-bench`'s bandwidth tests cycle 128 slots of
//!   64 KiB, with 256 KiB of other lines touched between batches of 32 copies (a `sendto`'s
//!   worth of kernel work between the engine's batches of 32 frames; not timed);
//! - `cold, prefetched`: the same, with the payload two FPDUs ahead prefetched after each
//!   copy, as the engine's `TxRing::fill` does.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use datapath::PinnedBuffer;
use std::time::{Duration, Instant};

const FPDU_PAYLOAD: usize = 1428;
const PAYLOAD_AT: usize = 82;
const FRAME: usize = 4096;
const REGION: usize = 8 << 20;

struct Walk {
    src: PinnedBuffer,
    frames: Vec<u8>,
    other: Vec<u8>,
    span: usize,
    pos: usize,
    n: usize,
    prefetch: bool,
}

impl Walk {
    fn new(span: usize, prefetch: bool) -> Walk {
        let src = PinnedBuffer::new(REGION).expect("8 MiB region");
        let pattern: Vec<u8> = (0..REGION).map(|i| (i * 31 + 7) as u8).collect();
        src.write_at(0, &pattern);
        Walk {
            src,
            frames: vec![0; 32 * FRAME],
            other: vec![1; 256 << 10],
            span: span / FPDU_PAYLOAD * FPDU_PAYLOAD,
            pos: 0,
            n: 0,
            prefetch,
        }
    }

    /// Touches the other lines (between batches, untimed).
    fn disturb(&mut self) {
        if self.span == REGION / FPDU_PAYLOAD * FPDU_PAYLOAD {
            for k in (0..self.other.len()).step_by(64) {
                self.other[k] = self.other[k].wrapping_add(1);
            }
        }
    }

    fn copy_one(&mut self) -> (u32, u16) {
        // The free TX frames are a stack: the last 32 used, newest first.
        let f = (31 - self.n % 32) * FRAME + PAYLOAD_AT;
        let mut crc = !0u32;
        let sum =
            self.src
                .read_at_crc_sum(self.pos, &mut self.frames[f..f + FPDU_PAYLOAD], &mut crc);
        if self.prefetch {
            let ahead = (self.pos + 2 * FPDU_PAYLOAD) % self.span;
            self.src.prefetch(ahead, FPDU_PAYLOAD);
        }
        self.pos = (self.pos + FPDU_PAYLOAD) % self.span;
        self.n += 1;
        (crc, sum)
    }
}

fn tx_copy(c: &mut Criterion) {
    let mut group = c.benchmark_group("tx_copy_crc_sum");
    group.throughput(Throughput::Bytes(FPDU_PAYLOAD as u64));
    for (name, span, prefetch) in [
        ("hot", 64 << 10, false),
        ("cold", REGION, false),
        ("cold, prefetched", REGION, true),
    ] {
        let mut w = Walk::new(span, prefetch);
        group.bench_function(BenchmarkId::new(name, FPDU_PAYLOAD), |b| {
            // Batches of 32 copies timed, the disturbance between them not.
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    w.disturb();
                    let n = left.min(32);
                    let start = Instant::now();
                    for _ in 0..n {
                        black_box(w.copy_one());
                    }
                    timed += start.elapsed();
                    left -= n;
                }
                timed
            })
        });
    }
    group.finish();
}

criterion_group!(benches, tx_copy);
criterion_main!(benches);
