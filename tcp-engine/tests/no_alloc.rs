//! No allocation per segment in steady state: a counting global allocator
//! watches a bulk transfer between two connections driven directly through
//! preallocated packet buffers (the simulator itself allocates, so it is not
//! used here). After warm-up (buffers grown to their working size), sending,
//! receiving, ACK processing and timers allocate nothing, in both the plain
//! and the MPA profile.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use tcp_engine::{
    Config, Connection, FourTuple, Instant, IsnGenerator, SegmentRepr, TxMode, TxSource,
    TxSourceError,
};

/// A source of constant octets (the octets live outside TCP in `TxMode::Source`).
struct Sevens;

impl TxSource for Sevens {
    fn fill(&mut self, _offset: u64, out: &mut [u8]) -> Result<(), TxSourceError> {
        out.fill(7);
        Ok(())
    }
}

struct Counting;

thread_local! {
    /// This thread's allocations (the tests run on threads of their own, side by side).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note_alloc() {
    ALLOCS.with(|a| a.set(a.get() + 1));
}

/// Allocations made so far by the calling thread.
fn allocs() -> u64 {
    ALLOCS.with(|a| a.get())
}

// SAFETY: every method hands its arguments, unchanged, to the system allocator, which upholds
// GlobalAlloc's contract; counting touches no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires of it.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from this allocator, that is from System, with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note_alloc();
        // SAFETY: as for dealloc, and the caller's new size `n`.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const SLOTS: usize = 256;

/// A fixed ring of packet buffers with a fixed delay.
struct Wire {
    bufs: Vec<[u8; 1600]>,
    lens: Vec<usize>,
    due: Vec<Instant>,
    head: usize,
    len: usize,
}

impl Wire {
    fn new() -> Wire {
        Wire {
            bufs: vec![[0u8; 1600]; SLOTS],
            lens: vec![0; SLOTS],
            due: vec![Instant::ZERO; SLOTS],
            head: 0,
            len: 0,
        }
    }
}

fn drive(cfg: Config) -> (u64, u64) {
    let t = FourTuple {
        local_addr: Ipv4Addr::new(1, 0, 0, 1),
        local_port: 1,
        remote_addr: Ipv4Addr::new(1, 0, 0, 2),
        remote_port: 2,
    };
    let isn = IsnGenerator::new([1; 16]);
    let mut a = Connection::connect(cfg.clone(), t, &isn, Instant::ZERO);
    let mut b: Option<Connection> = None;
    let mut ab = Wire::new();
    let mut ba = Wire::new();
    let record = vec![7u8; 1000];
    let mut rbuf = vec![0u8; 1 << 20];
    let delay = Duration::from_micros(10);
    let mut now = Instant::ZERO;
    let mut warm_allocs = 0;
    let total_steps = 20_000u64;
    let mut received = 0u64;
    for step in 0..total_steps {
        if step == total_steps / 2 {
            warm_allocs = allocs();
        }
        now += Duration::from_nanos(1200);
        // Application: keep the send buffer full.
        loop {
            let ok = match cfg.tx_mode {
                TxMode::Records => a.send_record(&record).is_ok(),
                TxMode::Stream => a.send(&record).map(|n| n > 0).unwrap_or(false),
                TxMode::Source => a.send_record_len(record.len()).is_ok(),
            };
            if !ok {
                break;
            }
        }
        for (conn, wire) in [(Some(&mut a), &mut ab), (b.as_mut(), &mut ba)] {
            let Some(conn) = conn else { continue };
            if conn.poll_timeout().is_some_and(|d| d <= now) {
                conn.handle_timeout(now);
            }
            while wire.len < SLOTS {
                let i = (wire.head + wire.len) % SLOTS;
                match conn.poll_transmit_with(now, &mut wire.bufs[i], &mut Sevens) {
                    Some(n) => {
                        wire.lens[i] = n;
                        wire.due[i] = now + delay;
                        wire.len += 1;
                    }
                    None => break,
                }
            }
        }
        while ab.len > 0 && ab.due[ab.head] <= now {
            let p = &ab.bufs[ab.head][..ab.lens[ab.head]];
            let seg = SegmentRepr::parse(p).expect("valid");
            match b.as_mut() {
                None => b = Connection::accept(cfg.clone(), &seg, &isn, now),
                Some(b) => b.handle_segment(now, &seg, |p| received += p.data.len() as u64),
            }
            ab.head = (ab.head + 1) % SLOTS;
            ab.len -= 1;
        }
        while ba.len > 0 && ba.due[ba.head] <= now {
            let p = &ba.bufs[ba.head][..ba.lens[ba.head]];
            let seg = SegmentRepr::parse(p).expect("valid");
            a.handle_segment(now, &seg, |_| {});
            ba.head = (ba.head + 1) % SLOTS;
            ba.len -= 1;
        }
        if let Some(b) = b.as_mut() {
            received += b.recv(&mut rbuf) as u64;
        }
    }
    let steady = allocs() - warm_allocs;
    (steady, received)
}

#[test]
fn steady_state_transfer_does_not_allocate() {
    let source = Config {
        tx_mode: TxMode::Source,
        ..Config::mpa()
    };
    for cfg in [Config::default(), Config::mpa(), source] {
        let cfg = Config {
            send_buffer: 1 << 20,
            recv_buffer: 1 << 20,
            ..cfg
        };
        let (steady, received) = drive(cfg.clone());
        println!(
            "{:?}/{:?}: {received} bytes received, {steady} allocations in the second half",
            cfg.tx_mode, cfg.rx_mode
        );
        assert!(received > 4 << 20, "transfer made progress: {received}");
        assert_eq!(steady, 0);
    }
}

/// Small records sent one segment each, from the first record on, up to a full 4 MiB send
/// buffer: the connection's bookkeeping (records queued, segments in flight) was sized when
/// the first record was queued and is never grown; past the bound TCP refuses records
/// (`BufferFull`) and holds segments back until ACKs free entries, instead of allocating on
/// the per-segment path.
#[test]
fn small_records_from_the_start_do_not_allocate() {
    let cfg = Config {
        tx_mode: TxMode::Source,
        ..Config::mpa()
    };
    let t = FourTuple {
        local_addr: Ipv4Addr::new(1, 0, 0, 1),
        local_port: 1,
        remote_addr: Ipv4Addr::new(1, 0, 0, 2),
        remote_port: 2,
    };
    let isn = IsnGenerator::new([2; 16]);
    let mut a = Connection::connect(cfg.clone(), t, &isn, Instant::ZERO);
    let mut b: Option<Connection> = None;
    // Segments in flight each way: a wire long enough for thousands of small segments.
    const WIRE: usize = 16_384;
    let mut ab: VecDeque<(Instant, Vec<u8>)> = VecDeque::with_capacity(WIRE);
    let mut ba: VecDeque<(Instant, Vec<u8>)> = VecDeque::with_capacity(WIRE);
    let mut pool: Vec<Vec<u8>> = (0..2 * WIRE).map(|_| vec![0u8; 1600]).collect();
    let delay = Duration::from_micros(200);
    let mut now = Instant::ZERO;
    let mut received = 0u64;
    let mut refused = 0u64;
    let mut counting_from = None;
    for step in 0..8000u64 {
        now += Duration::from_micros(1);
        let both = a.state() == tcp_engine::State::Established
            && b.as_ref().map(|b| b.state()) == Some(tcp_engine::State::Established);
        // In the second half, now and then a burst of records, more than the connection
        // tracks unsent (the first half keeps every segment small, the scoreboard's case).
        if both && step >= 4000 && step % 500 == 0 {
            for _ in 0..(a.max_tracked() + 1000) {
                if a.send_record_len(64).is_err() {
                    refused += 1;
                }
            }
        }
        // One 64-octet record at a time, each sent at once: small segments.
        for _ in 0..64 {
            if a.state() == tcp_engine::State::Established {
                match a.send_record_len(64) {
                    Ok(()) => {}
                    Err(_) => refused += 1,
                }
                // Counting starts once the first record is queued (which sizes the
                // bookkeeping).
                if counting_from.is_none() && both {
                    counting_from = Some(allocs());
                }
            }
            if ab.len() >= WIRE {
                break;
            }
            let Some(mut buf) = pool.pop() else { break };
            match a.poll_transmit_with(now, &mut buf, &mut Sevens) {
                Some(n) => {
                    buf.truncate(n);
                    ab.push_back((now + delay, buf));
                }
                None => {
                    pool.push(buf);
                    break;
                }
            }
        }
        if a.poll_timeout().is_some_and(|d| d <= now) {
            a.handle_timeout(now);
        }
        if let Some(bc) = b.as_mut() {
            if bc.poll_timeout().is_some_and(|d| d <= now) {
                bc.handle_timeout(now);
            }
            while ba.len() < WIRE {
                let Some(mut buf) = pool.pop() else { break };
                match bc.poll_transmit_with(now, &mut buf, &mut Sevens) {
                    Some(n) => {
                        buf.truncate(n);
                        ba.push_back((now + delay, buf));
                    }
                    None => {
                        pool.push(buf);
                        break;
                    }
                }
            }
        }
        while ab.front().is_some_and(|f| f.0 <= now) {
            let Some((_, mut p)) = ab.pop_front() else {
                break;
            };
            let seg = SegmentRepr::parse(&p).expect("valid");
            match b.as_mut() {
                None => b = Connection::accept(cfg.clone(), &seg, &isn, now),
                Some(b) => b.handle_segment(now, &seg, |p| received += p.data.len() as u64),
            }
            p.resize(1600, 0);
            pool.push(p);
        }
        while ba.front().is_some_and(|f| f.0 <= now) {
            let Some((_, mut p)) = ba.pop_front() else {
                break;
            };
            let seg = SegmentRepr::parse(&p).expect("valid");
            a.handle_segment(now, &seg, |_| {});
            p.resize(1600, 0);
            pool.push(p);
        }
    }
    let from = counting_from.expect("connection established");
    let allocs = allocs() - from;
    println!(
        "{received} bytes received in 64-octet records, {refused} records refused, \
         {allocs} allocations after the handshake"
    );
    assert!(received > 1 << 20, "transfer made progress: {received}");
    assert!(refused > 0, "the bursts went past the records tracked");
    assert_eq!(allocs, 0, "allocations after the handshake");
}
