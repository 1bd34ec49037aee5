//! The data sender's per-frame protocol work without the kernel: an `IwarpConn` over a
//! `tcp_engine::Connection` in `TxMode::Source` (the engine's transmit path) sending 64 KiB
//! RDMA Writes of a registered region to a second pair in the same process, the engine's TCP
//! settings at MTU 1500 (1448-octet segments, one FPDU each). One iteration is a batch of 32
//! frames, as one `sendto` kick of the AF_XDP engine carries, and what is timed is the sender's
//! share of it: its turn (`IwarpConn::poll`: work requests posted, FPDUs queued, ACKed ones
//! released), the 32 segments written into frame buffers (`IwarpConn::poll_transmit`: TCP
//! header, MPA/DDP/RDMAP headers, payload copied from the region with the CRC32C and the TCP
//! checksum's sum in one pass) and the receiver's ACKs handled (`Connection::handle_segment`).
//! The receiver placing the data and writing its ACKs is not timed. Reported per frame
//! (criterion's throughput: elements = frames). Two sources:
//! - `hot`: one 64 KiB slot written over and over (perftest's `ib_write_bw` reuses one buffer);
//! - `cold`: 128 slots (8 MiB) in turn, as `iwarp-bench`'s bandwidth tests by default, with
//!   256 KiB of other lines touched between batches (a kick's worth of kernel work; not timed).
//!
//! What `scripts/bench-engine-cpu.sh` reads as the engine's user time per frame on the veth
//! bed, less the engine thread's loop, the AF_XDP rings and the cache the kernel takes between
//! kicks; deterministic enough to compare changes to the protocol crates by.
//!
//! `rx_path/{hot,cold}/per_frame`: the receiver's share of the same batches, timed apart: the
//! 32 segments taken (TCP checksum and MPA's CRC32C from one read of the payload,
//! `SegmentDigest`; `Connection::handle_segment`; the payload placed into the sink region by
//! `IwarpConn::on_data_with_crc`) and its ACKs
//! written (`Side::turn`). `hot` places into one 64 KiB slot, `cold` into 128 in turn (8 MiB).
//! The receive path per frame that issue #24's single pass over received payload (checksum,
//! CRC and copy) is measured by.
//!
//! `write_lat/round_trip_64B`: write-lat's ping-pong without the kernel, timed whole: A posts a
//! 64-octet RDMA Write into B's region and frames it, B takes the segment (TCP, MPA CRC,
//! placement), posts its 64-octet Write back and frames it (with its ACK), A takes it and ACKs.
//! Both sides' protocol work per round trip: what the engine adds to raw AF_XDP's ping-pong on
//! the bed, less the engine turn's loop, the rings and the kernel (issue #24, latency).

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant as StdInstant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use datapath::engine::{ConnConfig, ConnEvent, IwarpConn, XdpEngineConfig};
use datapath::PinnedBuffer;
use iwarp_conn::SegmentDigest;
use rdmap::{Access, MemoryTable, PdId, SendOp, SendWr, Sge, Stag};
use tcp_engine::{Config, Connection, FourTuple, Instant, IsnGenerator, SegmentRepr, TxMode};

const PD: PdId = PdId(1);
const MESSAGE: usize = 64 << 10;
const BATCH: usize = 32;
const FRAME: usize = 2048;
/// Work requests kept posted (the engine's default `tx_ahead`, 512 KiB, in messages).
const DEPTH: u64 = 8;
/// Simulated time per frame: about the veth bed's frame rate.
const FRAME_TIME: Duration = Duration::from_micros(2);

/// The engine's TCP profile at MTU 1500.
fn tcp_config() -> Config {
    let mut cfg = XdpEngineConfig::default().tcp;
    cfg.path_mtu = 1500;
    cfg.mss = 1460;
    cfg.tx_mode = TxMode::Source;
    cfg
}

struct Side {
    tcp: Option<Connection>,
    iw: IwarpConn,
    mem: MemoryTable<PinnedBuffer>,
}

impl Side {
    fn pump(&mut self, now: Instant) {
        let Some(tcp) = self.tcp.as_mut() else { return };
        self.iw.take_tcp_events(tcp);
        self.iw.poll(tcp, &self.mem, now);
        while let Some(ev) = self.iw.poll_event() {
            if let ConnEvent::Request(_) = ev {
                self.iw.accept(b"").expect("accept");
            }
        }
        while self.iw.qp_mut().poll_completion().is_some() {}
    }

    /// Writes this side's next packet into `buf`.
    fn transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        let tcp = self.tcp.as_mut()?;
        self.iw.poll_transmit(tcp, &self.mem, now, buf)
    }

    /// Hands `packet` to this side's TCP (data placed by its `IwarpConn`), its data read once
    /// for the checksum and the FPDU's CRC, as the engine does (`SegmentDigest`).
    fn receive(&mut self, now: Instant, packet: &[u8], listen: Option<&IsnGenerator>) {
        let mut digest = SegmentDigest::default();
        let Ok(seg) = SegmentRepr::parse_summing(packet, |p| {
            digest = SegmentDigest::of(p);
            digest.sum
        }) else {
            return;
        };
        match (self.tcp.as_mut(), listen) {
            (Some(tcp), _) => {
                let Side { iw, mem, .. } = self;
                let held = digest.hold(seg.payload);
                tcp.handle_segment(now, &seg, |p| {
                    let crc = held.and_then(|h| h.for_data(p.data));
                    iw.on_data_with_crc(p, crc, mem)
                });
            }
            (None, Some(isn)) => self.tcp = Connection::accept(tcp_config(), &seg, isn, now),
            (None, None) => {}
        }
    }

    /// Expired timers, [`Side::pump`], then packets into `bufs` (their lengths into `lens`)
    /// until this side has none or `bufs` are full; returns how many.
    fn turn(&mut self, now: Instant, bufs: &mut [Vec<u8>], lens: &mut [usize]) -> usize {
        if let Some(tcp) = self.tcp.as_mut() {
            if tcp.poll_timeout().is_some_and(|d| d <= now) {
                tcp.handle_timeout(now);
            }
        }
        self.pump(now);
        let mut n = 0;
        for (buf, len) in bufs.iter_mut().zip(lens.iter_mut()) {
            let Some(l) = self.transmit(now, buf) else {
                break;
            };
            *len = l;
            n += 1;
        }
        n
    }
}

struct Bench {
    a: Side,
    b: Side,
    isn_b: IsnGenerator,
    src: Stag,
    sink: Stag,
    slots: u64,
    posted: u64,
    now: Instant,
    frames: Vec<Vec<u8>>,
    lens: Vec<usize>,
    acks: Vec<Vec<u8>>,
    ack_lens: Vec<usize>,
    other: Vec<u8>,
    cold: bool,
}

impl Bench {
    fn new(slots: u64, cold: bool) -> Bench {
        let epoch = StdInstant::now();
        let cfg = || {
            let mut c = ConnConfig::default();
            c.qp.pd = PD;
            c
        };
        let tuple = FourTuple {
            local_addr: Ipv4Addr::new(10, 0, 0, 2),
            local_port: 40000,
            remote_addr: Ipv4Addr::new(10, 0, 0, 1),
            remote_port: 5000,
        };
        let mut a = Side {
            tcp: Some(Connection::connect(
                tcp_config(),
                tuple,
                &IsnGenerator::new([1; 16]),
                Instant::ZERO,
            )),
            iw: IwarpConn::initiator(cfg(), b"", epoch, Instant::ZERO).expect("initiator"),
            mem: MemoryTable::new(),
        };
        let mut b = Side {
            tcp: None,
            iw: IwarpConn::responder(cfg(), epoch, Instant::ZERO).expect("responder"),
            mem: MemoryTable::new(),
        };
        let len = slots as usize * MESSAGE;
        let source = PinnedBuffer::new(len).expect("source region");
        let pattern: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
        source.write_at(0, &pattern);
        let src = a.mem.register(PD, source, 0, Access::LOCAL_WRITE);
        let sink = b.mem.register(
            PD,
            PinnedBuffer::new(len).expect("sink region"),
            0,
            Access::REMOTE_WRITE,
        );
        let mut bench = Bench {
            a,
            b,
            isn_b: IsnGenerator::new([2; 16]),
            src,
            sink,
            slots,
            posted: 0,
            now: Instant::ZERO,
            frames: vec![vec![0; FRAME]; BATCH],
            lens: vec![0; BATCH],
            acks: vec![vec![0; FRAME]; BATCH],
            ack_lens: vec![0; BATCH],
            other: vec![1; 256 << 10],
            cold,
        };
        // TCP and MPA startup: packets both ways until the initiator is in Full Operation.
        for _ in 0..1000 {
            if bench.a.iw.is_established() && bench.b.iw.is_established() {
                break;
            }
            bench.exchange();
        }
        assert!(bench.a.iw.is_established(), "startup did not complete");
        bench
    }

    /// One step of startup: every packet each side has, to the other.
    fn exchange(&mut self) {
        self.now += FRAME_TIME;
        let now = self.now;
        self.a.pump(now);
        while let Some(n) = self.a.transmit(now, &mut self.frames[0]) {
            self.b.receive(now, &self.frames[0][..n], Some(&self.isn_b));
            self.b.pump(now);
        }
        self.b.pump(now);
        while let Some(n) = self.b.transmit(now, &mut self.frames[0]) {
            self.a.receive(now, &self.frames[0][..n], None);
            self.a.pump(now);
        }
    }

    /// Keeps `DEPTH` Writes posted beyond the ones the sender completed (each completes when
    /// acknowledged).
    fn post(&mut self) {
        while self.posted < self.completed_bound() + DEPTH {
            let slot = self.posted % self.slots;
            let wr = SendWr {
                wr_id: self.posted,
                op: SendOp::Write {
                    remote_stag: self.sink,
                    remote_to: slot * MESSAGE as u64,
                },
                sg_list: Sge {
                    stag: self.src,
                    to: slot * MESSAGE as u64,
                    len: MESSAGE as u32,
                }
                .into(),
                signaled: true,
                fence: false,
            };
            if self.a.iw.qp_mut().post_send(wr, &self.a.mem).is_err() {
                break;
            }
            self.posted += 1;
        }
    }

    /// Messages the sender's TCP has had acknowledged, at most.
    fn completed_bound(&self) -> u64 {
        self.a.tcp.as_ref().map_or(0, |t| t.bytes_acked()) / MESSAGE as u64
    }

    /// One batch: returns (time the sender spent, time the receiver spent, frames sent).
    fn batch(&mut self) -> (Duration, Duration, u64) {
        self.post();
        let t0 = StdInstant::now();
        let now = self.now;
        let n = self.a.turn(now, &mut self.frames, &mut self.lens);
        let mut spent = t0.elapsed();
        self.now = now + FRAME_TIME * n.max(1) as u32;
        let now = self.now;
        // The receiver (timed apart): places the data and ACKs it.
        let r0 = StdInstant::now();
        for (f, &len) in self.frames.iter().zip(&self.lens).take(n) {
            self.b.receive(now, &f[..len], None);
        }
        let acks = self.b.turn(now, &mut self.acks, &mut self.ack_lens);
        let received = r0.elapsed();
        if self.cold {
            // A kick's worth of other lines through the cache (the kernel's work on the veth
            // bed between the engine's batches).
            for i in (0..self.other.len()).step_by(64) {
                self.other[i] = self.other[i].wrapping_add(1);
            }
            black_box(&self.other);
        }
        let t1 = StdInstant::now();
        for (f, &len) in self.acks.iter().zip(&self.ack_lens).take(acks) {
            self.a.receive(now, &f[..len], None);
        }
        spent += t1.elapsed();
        (spent, received, n as u64)
    }
}

/// Octets of each write-lat message.
const PING: usize = 64;

impl Bench {
    /// Posts on `side` a signaled RDMA Write of [`PING`] octets from `src` to the peer's `dst`.
    fn post_ping(side: &mut Side, wr_id: u64, src: Stag, dst: Stag) {
        let wr = SendWr {
            wr_id,
            op: SendOp::Write {
                remote_stag: dst,
                remote_to: 0,
            },
            sg_list: Sge {
                stag: src,
                to: 0,
                len: PING as u32,
            }
            .into(),
            signaled: true,
            fence: false,
        };
        side.iw
            .qp_mut()
            .post_send(wr, &side.mem)
            .expect("post the ping");
    }

    /// Everything `from` has to send now, taken by `to`.
    fn deliver(
        from: &mut Side,
        to: &mut Side,
        now: Instant,
        frames: &mut [Vec<u8>],
        lens: &mut [usize],
    ) {
        let n = from.turn(now, frames, lens);
        for (f, &len) in frames.iter().zip(lens.iter()).take(n) {
            to.receive(now, &f[..len], None);
        }
    }

    /// One write-lat round trip (see the module documentation): ping `i` from A's `ping.0` to
    /// B's `ping.1`, its pong from B's `pong.0` to A's `pong.1`; checks the pong's stamp.
    fn round_trip(&mut self, i: u64, ping: (Stag, Stag), pong: (Stag, Stag)) {
        let stamp = [(i % 251) as u8 + 1];
        self.now += FRAME_TIME;
        let now = self.now;
        let Bench {
            a, b, frames, lens, ..
        } = self;
        if let Some(src) = a.mem.get(ping.0) {
            src.write_at(PING - 1, &stamp);
        }
        Self::post_ping(a, i, ping.0, ping.1);
        Self::deliver(a, b, now, frames, lens);
        if let Some(src) = b.mem.get(pong.0) {
            src.write_at(PING - 1, &stamp);
        }
        Self::post_ping(b, i, pong.0, pong.1);
        Self::deliver(b, a, now, frames, lens);
        Self::deliver(a, b, now, frames, lens);
        let mut got = [0u8];
        if let Some(sink) = a.mem.get(pong.1) {
            sink.read_at(PING - 1, &mut got);
        }
        assert_eq!(got, stamp, "round trip {i}: the pong did not arrive");
    }
}

fn write_lat(c: &mut Criterion) {
    let mut bench = Bench::new(1, false);
    let region = || PinnedBuffer::new(PING).expect("region");
    let ping_src = bench.a.mem.register(PD, region(), 0, Access::NONE);
    let ping_dst = bench.sink;
    let pong_src = bench.b.mem.register(PD, region(), 0, Access::NONE);
    let pong_dst = bench.a.mem.register(PD, region(), 0, Access::REMOTE_WRITE);
    let (ping, pong) = ((ping_src, ping_dst), (pong_src, pong_dst));
    let mut i = 0u64;
    // Past TCP's start.
    for _ in 0..1000 {
        bench.round_trip(i, ping, pong);
        i += 1;
    }
    let mut group = c.benchmark_group("write_lat");
    group.throughput(Throughput::Elements(1));
    group.bench_function("round_trip_64B", |b| {
        b.iter(|| {
            bench.round_trip(i, ping, pong);
            i += 1;
        })
    });
    group.finish();
    let c = bench.a.iw.counters();
    assert_eq!(c.retransmissions, 0, "a lossless link retransmits nothing");
}

fn tx_path(c: &mut Criterion) {
    path(c, "tx_path", |(tx, _)| tx);
}

fn rx_path(c: &mut Criterion) {
    path(c, "rx_path", |(_, rx)| rx);
}

/// Per-frame time of one side of the batches: `side` picks the sender's or the receiver's.
fn path(c: &mut Criterion, name: &str, side: fn((Duration, Duration)) -> Duration) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    for (name, slots, cold) in [("hot", 1, false), ("cold", 128, true)] {
        let mut bench = Bench::new(slots, cold);
        // Past slow start and the first lap of the source.
        for _ in 0..4000 {
            bench.batch();
        }
        group.bench_function(BenchmarkId::new(name, "per_frame"), |b| {
            b.iter_custom(|iters| {
                // `iters` frames: whole batches until that many were sent.
                let mut spent = Duration::ZERO;
                let mut frames = 0;
                let mut stalls = 0;
                while frames < iters {
                    let (tx, rx, n) = bench.batch();
                    spent += side((tx, rx));
                    frames += n;
                    if n == 0 {
                        stalls += 1;
                        assert!(stalls < 1000, "the sender stopped sending");
                    }
                }
                // Per frame: scale to exactly `iters` frames.
                spent.mul_f64(iters as f64 / frames as f64)
            })
        });
        let c = bench.a.iw.counters();
        assert_eq!(c.retransmissions, 0, "a lossless link retransmits nothing");
    }
    group.finish();
}

criterion_group!(benches, tx_path, rx_path, write_lat);
criterion_main!(benches);
