//! CRC32c throughput: `crc-fast` (the backend of `mpa::crc`) against the `crc32c` crate, at
//! sizes from a small FPDU to a 64 KiB ULPDU.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn crc_backends(c: &mut Criterion) {
    let mut group = c.benchmark_group("crc32c");
    for size in [64usize, 1448, 4096, 65536] {
        let data: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
        assert_eq!(mpa::crc::crc32c(&data), crc32c::crc32c(&data));
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("crc-fast", size), &data, |b, data| {
            b.iter(|| mpa::crc::crc32c(black_box(data)))
        });
        group.bench_with_input(BenchmarkId::new("crc32c-crate", size), &data, |b, data| {
            b.iter(|| crc32c::crc32c(black_box(data)))
        });
    }
    group.finish();
}

criterion_group!(benches, crc_backends);
criterion_main!(benches);
