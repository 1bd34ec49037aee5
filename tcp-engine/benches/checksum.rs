//! Internet checksum (RFC 1071) throughput: `tcp_engine::wire::Checksum` (what the engine's
//! TCP emits and verifies with) against `etherparse`'s `Sum16BitWords::add_slice` (what it
//! used before), at a bare header, a full MSS segment at MTU 1500 and a 64 KiB buffer. Odd
//! lengths and an unaligned start are included.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use etherparse::checksum::Sum16BitWords;
use tcp_engine::wire::Checksum;

fn checksum(c: &mut Criterion) {
    let mut group = c.benchmark_group("internet-checksum");
    let buf: Vec<u8> = (0..65_600u32).map(|i| (i * 31 + 7) as u8).collect();
    for (size, at) in [(20usize, 0usize), (1480, 0), (1481, 3), (65535, 1)] {
        let data = &buf[at..at + size];
        assert_eq!(
            Checksum::new().add_bytes(data).finish().to_be_bytes(),
            Sum16BitWords::new()
                .add_slice(data)
                .ones_complement()
                .to_ne_bytes()
        );
        let id = format!("{size}@{at}");
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("tcp-engine", &id), data, |b, d| {
            b.iter(|| Checksum::new().add_bytes(black_box(d)).finish())
        });
        group.bench_with_input(BenchmarkId::new("etherparse", &id), data, |b, d| {
            b.iter(|| {
                Sum16BitWords::new()
                    .add_slice(black_box(d))
                    .ones_complement()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, checksum);
criterion_main!(benches);
