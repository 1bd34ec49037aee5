//! The poll-mode TCP driver (`datapath::xdp_tcp`) in-process on the veth test bed
//! (`scripts/netns.sh`): the driver runs on a thread inside namespace `iwa` (`iwa0`,
//! 10.77.0.1), the kernel's TCP on a thread inside `iwb` (10.77.0.2).
//!
//! * Steady state allocates nothing, receiving and transmitting: a counting global allocator
//!   counts the driver thread's allocations over the middle of a 96 MiB transfer.
//! * Pass-up receive (the MPA mode): every octet arrives through `TcpApp::on_data` with its
//!   stream offset, placed straight into the application's buffer.
//! * Shards (`XdpTcp::open_shards`, a driver per queue on its own thread) hand over the
//!   segments that arrive on a shard that does not own their flow, allocating nothing.
//! * A connect to a closed port ends in `Event::Reset` and the connection is removed; a port
//!   a kernel socket listens on cannot be taken.
//!
//! Needs root. Without root (or without the bed) each test prints `SKIPPED: <why>` and passes,
//! except under `CI=true`, where it fails with the reason. Tests serialise with every other
//! test-bed user on `/run/lock/iwarp-netns.lock`, bring the bed up fresh and take it down.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datapath::xdp_tcp::engine::{Instant as TcpInstant, RxMode};
use datapath::xdp_tcp::{
    ConnId, Connection, Event, PassedUp, TakeBack, TcpApp, XdpTcp, XdpTcpConfig, XdpTcpError,
};
use testbed::*;

mod common;

// ---------------------------------------------------------------- counting allocator

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note_alloc() {
    if COUNTING.with(|c| c.get()) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

fn counting(on: bool) {
    COUNTING.with(|c| c.set(on));
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only an
// atomic and a const-initialised thread-local (neither allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---------------------------------------------------------------- test bed

/// No progress for this long fails a transfer.
const STALL: Duration = Duration::from_secs(60);

/// Deterministic bytes: stream offset `i` holds `byte_at(i)`.
fn byte_at(i: u64) -> u8 {
    let x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8 ^ (i as u8)
}

/// Reads `s` to its end (a read stalling for [`STALL`] fails): octets read, and the offset of
/// the first that is not [`byte_at`] its offset, if any.
fn read_to_end_checked(s: &mut TcpStream) -> Result<(u64, Option<u64>), String> {
    s.set_read_timeout(Some(STALL)).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut got, mut mismatch) = (0u64, None);
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("stalled or failed after {got} bytes: {e}"))?;
        if n == 0 {
            return Ok((got, mismatch));
        }
        if mismatch.is_none() {
            mismatch = (0..n)
                .find(|&k| buf[k] != byte_at(got + k as u64))
                .map(|k| got + k as u64);
        }
        got += n as u64;
    }
}

fn fill(buf: &mut [u8], offset: u64) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = byte_at(offset + k as u64);
    }
}

/// A kernel client in `iwb` that sends `total` bytes to `port` on `iwa`, then waits for the
/// other side to close. Returns the bytes sent.
fn kernel_client(port: u16, total: u64) -> std::thread::JoinHandle<Result<u64, String>> {
    spawn_in_ns(NS_B, move || {
        let to = SocketAddr::V4(SocketAddrV4::new(ADDR_A, port));
        let deadline = Instant::now() + Duration::from_secs(20);
        // The driver may still be starting: retry refused connects for a while.
        let mut s = loop {
            match TcpStream::connect_timeout(&to, Duration::from_secs(5)) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(format!("connect {to}: {e}")),
            }
        };
        s.set_write_timeout(Some(STALL))
            .and_then(|_| s.set_read_timeout(Some(STALL)))
            .map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 1 << 20];
        let mut sent = 0u64;
        while sent < total {
            let n = (total - sent).min(buf.len() as u64) as usize;
            fill(&mut buf[..n], sent);
            s.write_all(&buf[..n])
                .map_err(|e| format!("stalled or failed after {sent} bytes: {e}"))?;
            sent += n as u64;
        }
        s.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
        let mut rest = Vec::new();
        s.read_to_end(&mut rest)
            .map_err(|e| format!("waiting for close: {e}"))?;
        Ok(sent)
    })
}

/// Runs the driver until `done(app)`, failing on a stall or after `limit`.
fn drive<A: TcpApp>(
    drv: &mut XdpTcp,
    app: &mut A,
    limit: Duration,
    progress: impl Fn(&A) -> u64,
    done: impl Fn(&A) -> bool,
) -> Result<(), String> {
    let start = Instant::now();
    let mut last = (Instant::now(), 0u64);
    while !done(app) {
        drv.turn(app).map_err(|e| e.to_string())?;
        let p = progress(app);
        if p != last.1 {
            last = (Instant::now(), p);
        } else if last.0.elapsed() > STALL {
            return Err(format!("stalled at {p} bytes for {STALL:?}"));
        }
        if start.elapsed() > limit {
            return Err(format!("not done after {limit:?} ({p} bytes)"));
        }
    }
    Ok(())
}

/// Counts the driver thread's allocations while the byte count is in `window`.
struct AllocWindow {
    window: (u64, u64),
    start: Option<u64>,
    total: Option<u64>,
}

impl AllocWindow {
    fn new(from: u64, to: u64) -> Self {
        Self {
            window: (from, to),
            start: None,
            total: None,
        }
    }

    fn at(&mut self, bytes: u64) {
        if self.start.is_none() && bytes >= self.window.0 {
            self.start = Some(ALLOCS.load(Ordering::Relaxed));
            counting(true);
        } else if let (Some(s), None) = (self.start, self.total) {
            if bytes >= self.window.1 {
                counting(false);
                self.total = Some(ALLOCS.load(Ordering::Relaxed) - s);
            }
        }
    }
}

// ---------------------------------------------------------------- applications

/// In-order receiver: checks every byte against `byte_at`.
struct Sink {
    conn: Option<ConnId>,
    buf: Vec<u8>,
    received: u64,
    mismatch: Option<u64>,
    peer_closed: bool,
    closed: bool,
    allocs: AllocWindow,
}

impl TcpApp for Sink {
    fn on_accept(&mut self, id: ConnId, _conn: &mut Connection) {
        self.conn.get_or_insert(id);
    }

    fn on_event(&mut self, _id: ConnId, _conn: &mut Connection, event: Event) {
        if event == Event::PeerClosed {
            self.peer_closed = true;
        }
    }

    fn on_poll(&mut self, id: ConnId, conn: &mut Connection, _now: TcpInstant) {
        if Some(id) != self.conn {
            return;
        }
        for _ in 0..64 {
            let n = conn.recv(&mut self.buf);
            if n == 0 {
                break;
            }
            if self.mismatch.is_none() {
                if let Some(k) = (0..n).find(|&k| self.buf[k] != byte_at(self.received + k as u64))
                {
                    self.mismatch = Some(self.received + k as u64);
                }
            }
            self.received += n as u64;
            self.allocs.at(self.received);
        }
        if self.peer_closed && conn.recv_available() == 0 {
            conn.close();
        }
    }

    fn on_closed(&mut self, id: ConnId, _conn: Connection) {
        if Some(id) == self.conn {
            self.closed = true;
        }
    }
}

/// Pass-up receiver: places every passed-up piece at its stream offset.
struct Placer {
    conn: Option<ConnId>,
    placed: Vec<u8>,
    /// Octets handed up (each at most once, so this reaches the total exactly).
    passed: u64,
    out_of_order: u64,
    beyond: u64,
    peer_closed: bool,
    closed: bool,
}

impl TcpApp for Placer {
    fn on_data(&mut self, id: ConnId, data: PassedUp<'_>) -> Option<TakeBack> {
        self.conn.get_or_insert(id);
        let start = data.stream_offset as usize;
        let end = start + data.data.len();
        if end > self.placed.len() {
            self.beyond += 1;
            return None;
        }
        if start as u64 != self.passed {
            self.out_of_order += 1;
        }
        self.placed[start..end].copy_from_slice(data.data);
        self.passed += data.data.len() as u64;
        None
    }

    fn on_accept(&mut self, id: ConnId, conn: &mut Connection) {
        self.conn.get_or_insert(id);
        conn.set_receive_window(self.placed.len() as u64);
    }

    fn on_event(&mut self, _id: ConnId, _conn: &mut Connection, event: Event) {
        if event == Event::PeerClosed {
            self.peer_closed = true;
        }
    }

    fn on_poll(&mut self, id: ConnId, conn: &mut Connection, _now: TcpInstant) {
        if Some(id) != self.conn {
            return;
        }
        // The application can place anything up to the end of its buffer.
        let room = (self.placed.len() as u64).saturating_sub(conn.rcv_nxt_offset());
        conn.set_receive_window(room);
        if self.peer_closed {
            conn.close();
        }
    }

    fn on_closed(&mut self, id: ConnId, _conn: Connection) {
        if Some(id) == self.conn {
            self.closed = true;
        }
    }
}

/// Stream sender of `byte_at` bytes.
struct Source {
    id: Option<ConnId>,
    total: u64,
    queued: u64,
    chunk: Vec<u8>,
    connected: bool,
    reset: bool,
    acked: u64,
    close_sent: bool,
    closed: bool,
    allocs: AllocWindow,
}

impl Source {
    /// A source of `total` octets on connection `id`, in 64 KiB writes; allocations counted
    /// by `allocs`.
    fn new(id: ConnId, total: u64, allocs: AllocWindow) -> Source {
        Source {
            id: Some(id),
            total,
            queued: 0,
            chunk: vec![0u8; 64 * 1024],
            connected: false,
            reset: false,
            acked: 0,
            close_sent: false,
            closed: false,
            allocs,
        }
    }
}

impl TcpApp for Source {
    fn on_event(&mut self, _id: ConnId, _conn: &mut Connection, event: Event) {
        match event {
            Event::Connected => self.connected = true,
            Event::Reset => self.reset = true,
            _ => {}
        }
    }

    fn on_poll(&mut self, id: ConnId, conn: &mut Connection, _now: TcpInstant) {
        if Some(id) != self.id || !self.connected {
            return;
        }
        self.acked = conn.bytes_acked();
        self.allocs.at(self.acked);
        for _ in 0..64 {
            if self.queued == self.total {
                break;
            }
            let n = (self.total - self.queued).min(self.chunk.len() as u64) as usize;
            fill(&mut self.chunk[..n], self.queued);
            match conn.send(&self.chunk[..n]) {
                Ok(0) | Err(_) => break,
                Ok(k) => self.queued += k as u64,
            }
        }
        if self.queued == self.total && !self.close_sent {
            conn.close();
            self.close_sent = true;
        }
    }

    fn on_closed(&mut self, id: ConnId, conn: Connection) {
        if Some(id) == self.id {
            self.acked = conn.bytes_acked();
            self.closed = true;
        }
    }
}

/// Joins a [`kernel_server`] and checks it read `len` octets, each the pattern's.
fn assert_kernel_received(
    server: std::thread::JoinHandle<Result<(u64, Option<u64>), String>>,
    len: u64,
) {
    let (got, mismatch) = server
        .join()
        .expect("server thread")
        .expect("kernel server");
    assert_eq!(got, len);
    assert_eq!(mismatch, None, "first wrong byte at this offset");
}

/// A kernel TCP server in `iwb` on `port`, listening when this returns, that reads one
/// connection to its end with [`read_to_end_checked`].
fn kernel_server(port: u16) -> std::thread::JoinHandle<Result<(u64, Option<u64>), String>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = spawn_in_ns(NS_B, move || -> Result<(u64, Option<u64>), String> {
        let l = TcpListener::bind(SocketAddrV4::new(ADDR_B, port)).map_err(|e| e.to_string())?;
        let _ = ready_tx.send(());
        let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
        read_to_end_checked(&mut s)
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("kernel server up");
    server
}

fn open_driver() -> XdpTcp {
    XdpTcp::open(DEV_A, XdpTcpConfig::default()).unwrap_or_else(|e| panic!("open driver: {e}"))
}

// ---------------------------------------------------------------- tests

const BULK: u64 = 96 << 20;

/// Receiving (kernel TCP in iwb -> our driver in iwa, in-order reads): no allocation on the
/// driver thread between 32 and 80 MiB, and every byte right.
#[test]
fn receive_steady_state_allocates_nothing() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 18720;
    let driver = spawn_in_ns(NS_A, move || {
        let mut drv = open_driver();
        let cfg = drv.tcp_config();
        drv.listen(PORT, 4, cfg).expect("listen");
        let client = kernel_client(PORT, BULK);
        let mut app = Sink {
            conn: None,
            buf: vec![0u8; 256 * 1024],
            received: 0,
            mismatch: None,
            peer_closed: false,
            closed: false,
            allocs: AllocWindow::new(32 << 20, 80 << 20),
        };
        let r = drive(
            &mut drv,
            &mut app,
            Duration::from_secs(300),
            |a| a.received,
            |a| a.closed,
        );
        counting(false);
        let sent = client.join().expect("client thread");
        (
            r,
            sent,
            app.received,
            app.mismatch,
            app.allocs.total,
            drv.stats(),
        )
    });
    let (r, sent, received, mismatch, allocs, stats) = driver.join().expect("driver thread");
    r.unwrap_or_else(|e| panic!("driver: {e}; {stats:?}"));
    assert_eq!(sent, Ok(BULK));
    assert_eq!(received, BULK, "{stats:?}");
    assert_eq!(mismatch, None, "first wrong byte at this offset");
    println!("receive: {stats:?}; allocations in the window: {allocs:?}");
    assert_eq!(
        allocs,
        Some(0),
        "allocations on the driver thread in steady state"
    );
    assert!(stats.table.passive_opens >= 1 && stats.accepted == 1 && stats.closed == 1);
}

/// The steering program has room for every connection the shards may hold together: each
/// shard's `max_connections` times the shards (the map's default, 65,536 for all of them,
/// refused the connections past it); a single driver's table needs its own size only.
#[test]
fn the_steering_program_has_room_for_every_shards_connections() {
    let _bed = bed_or_skip!();
    let (sharded, single) = spawn_in_ns(NS_A, || {
        let cfg = XdpTcpConfig {
            max_connections: 40_000,
            ..XdpTcpConfig::default()
        };
        let shards = XdpTcp::open_shards(DEV_A, cfg.clone()).expect("open shards");
        let sharded = (
            shards.len(),
            shards[0].steering_flow_capacity().expect("capacity"),
        );
        drop(shards);
        let one = XdpTcp::open(DEV_A, cfg).expect("open");
        (sharded, one.steering_flow_capacity().expect("capacity"))
    })
    .join()
    .expect("driver thread");
    let (n, capacity) = sharded;
    assert!(n >= 2, "the bed's interface runs {n} queues");
    assert_eq!(capacity, 40_000 * n as u32);
    assert_eq!(single, 65_536, "one table of 40,000: the default size");
}

/// Runs `ip` with `args`, failing the test with its output if it fails.
fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The interface's MAC address changes while a connection runs (a bond failing over, `ip
/// link set ... address`, a bridge recomputing its own): the peer, whose ARP entry the kernel
/// renews, sends to the new address. The driver drops frames to other addresses, as the
/// kernel does, and so reads the interface's address again: it takes the new one, for
/// receiving and sending, and the transfer completes with every byte right.
#[test]
fn a_new_mac_address_of_the_interface_is_taken() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 18724;
    const HALF: u64 = 4 << 20;
    let driver = spawn_in_ns(NS_A, move || {
        let mut drv = open_driver();
        let cfg = drv.tcp_config();
        drv.listen(PORT, 4, cfg).expect("listen");
        let client = spawn_in_ns(NS_B, move || -> Result<u64, String> {
            let to = SocketAddr::V4(SocketAddrV4::new(ADDR_A, PORT));
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5))
                .map_err(|e| format!("connect {to}: {e}"))?;
            s.set_write_timeout(Some(STALL))
                .and_then(|_| s.set_read_timeout(Some(STALL)))
                .map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; HALF as usize];
            fill(&mut buf, 0);
            s.write_all(&buf).map_err(|e| e.to_string())?;
            // The interface takes a new address; the peer's ARP entry for it is renewed.
            ip(&[
                "-n",
                NS_A,
                "link",
                "set",
                "dev",
                DEV_A,
                "address",
                "02:77:00:00:00:a1",
            ]);
            ip(&["-n", NS_B, "neigh", "flush", "dev", DEV_B]);
            fill(&mut buf, HALF);
            s.write_all(&buf)
                .map_err(|e| format!("after the address changed: {e}"))?;
            s.shutdown(Shutdown::Write).map_err(|e| e.to_string())?;
            let mut rest = Vec::new();
            s.read_to_end(&mut rest)
                .map_err(|e| format!("waiting for close: {e}"))?;
            Ok(2 * HALF)
        });
        let mut app = Sink {
            conn: None,
            buf: vec![0u8; 256 * 1024],
            received: 0,
            mismatch: None,
            peer_closed: false,
            closed: false,
            allocs: AllocWindow::new(u64::MAX, u64::MAX),
        };
        let r = drive(
            &mut drv,
            &mut app,
            Duration::from_secs(60),
            |a| a.received,
            |a| a.closed,
        );
        let sent = client.join().expect("client thread");
        (r, sent, app.received, app.mismatch, drv.stats())
    });
    let (r, sent, received, mismatch, stats) = driver.join().expect("driver thread");
    r.unwrap_or_else(|e| panic!("driver: {e}; {stats:?}"));
    assert_eq!(sent, Ok(2 * HALF));
    assert_eq!(received, 2 * HALF, "{stats:?}");
    assert_eq!(mismatch, None, "first wrong byte at this offset");
    assert!(
        stats.rx_other_mac >= 1,
        "no frame came to the new address: {stats:?}"
    );
}

/// Transmitting (our driver in iwa -> kernel TCP in iwb): no allocation on the driver thread
/// between 32 and 80 MiB acknowledged, and the kernel receives every byte right.
#[test]
fn transmit_steady_state_allocates_nothing() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 18721;
    let server = kernel_server(PORT);
    let driver = spawn_in_ns(NS_A, move || {
        let mut drv = open_driver();
        let cfg = drv.tcp_config();
        let id = drv
            .connect(SocketAddrV4::new(ADDR_B, PORT), cfg)
            .expect("connect");
        let mut app = Source::new(id, BULK, AllocWindow::new(32 << 20, 80 << 20));
        let r = drive(
            &mut drv,
            &mut app,
            Duration::from_secs(300),
            |a| a.acked,
            |a| a.closed || (a.close_sent && a.acked >= a.total),
        );
        counting(false);
        // Let the FIN exchange finish (the kernel closes after reading everything).
        let until = Instant::now() + Duration::from_secs(2);
        while !app.closed && Instant::now() < until {
            let _ = drv.turn(&mut app);
        }
        (r, app.acked, app.allocs.total, drv.stats())
    });
    let (r, acked, allocs, stats) = driver.join().expect("driver thread");
    r.unwrap_or_else(|e| panic!("driver: {e}; {stats:?}"));
    assert_eq!(acked, BULK);
    assert_kernel_received(server, BULK);
    println!("transmit: {stats:?}; allocations in the window: {allocs:?}");
    assert_eq!(
        allocs,
        Some(0),
        "allocations on the driver thread in steady state"
    );
}

/// `XdpTcpConfig::tx_turn_frames`: a bulk sender (our driver in iwa -> kernel TCP in iwb)
/// transmits at most that many frames per turn, and the limit binds (some turns send exactly
/// that many: the window allows more), while every byte still arrives.
#[test]
fn tx_turn_frames_bounds_the_frames_of_a_turn() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 18726;
    const TOTAL: u64 = 8 << 20;
    const CAP: u64 = 32;
    let server = kernel_server(PORT);
    let driver = spawn_in_ns(NS_A, move || {
        let cfg = XdpTcpConfig {
            tx_turn_frames: CAP as usize,
            ..XdpTcpConfig::default()
        };
        let mut drv = XdpTcp::open(DEV_A, cfg).unwrap_or_else(|e| panic!("open driver: {e}"));
        let tcp = drv.tcp_config();
        let id = drv
            .connect(SocketAddrV4::new(ADDR_B, PORT), tcp)
            .expect("connect");
        let mut app = Source::new(id, TOTAL, AllocWindow::new(u64::MAX, u64::MAX));
        let (mut most, mut at_cap) = (0u64, 0u64);
        let start = Instant::now();
        let mut r = Ok(());
        while !(app.closed || (app.close_sent && app.acked >= app.total)) {
            let before = drv.stats().tx_packets;
            if let Err(e) = drv.turn(&mut app) {
                r = Err(e.to_string());
                break;
            }
            let sent = drv.stats().tx_packets - before;
            most = most.max(sent);
            at_cap += u64::from(sent == CAP);
            if start.elapsed() > Duration::from_secs(60) {
                r = Err(format!("not done after 60 s ({} bytes)", app.acked));
                break;
            }
        }
        let until = Instant::now() + Duration::from_secs(2);
        while !app.closed && Instant::now() < until {
            let _ = drv.turn(&mut app);
        }
        (r, app.acked, most, at_cap, drv.stats())
    });
    let (r, acked, most, at_cap, stats) = driver.join().expect("driver thread");
    r.unwrap_or_else(|e| panic!("driver: {e}; {stats:?}"));
    assert_eq!(acked, TOTAL);
    assert_kernel_received(server, TOTAL);
    println!("most frames in a turn {most}, turns at the limit {at_cap}; {stats:?}");
    assert!(most <= CAP, "a turn sent {most} frames, more than {CAP}");
    assert!(at_cap > 0, "the limit never bound");
}

/// Pass-up receive (MPA's mode) through the driver: every octet handed up exactly once at its
/// stream offset, placed into the application's buffer; TCP holds nothing.
#[test]
fn pass_up_places_every_octet_at_its_offset() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 18722;
    const TOTAL: u64 = 32 << 20;
    let driver = spawn_in_ns(NS_A, move || {
        let mut drv = open_driver();
        let mut cfg = drv.tcp_config();
        cfg.rx_mode = RxMode::PassUp;
        drv.listen(PORT, 4, cfg).expect("listen");
        let client = kernel_client(PORT, TOTAL);
        let mut app = Placer {
            conn: None,
            // More room than the stream needs: with window scaling the advertised window
            // counts in units of 2^shift octets (2 KiB here), so a room smaller than that
            // advertises zero (tcp-engine rounds down; Linux rounds up).
            placed: vec![0u8; TOTAL as usize + (64 << 10)],
            passed: 0,
            out_of_order: 0,
            beyond: 0,
            peer_closed: false,
            closed: false,
        };
        let r = drive(
            &mut drv,
            &mut app,
            Duration::from_secs(120),
            |a| a.passed,
            |a| a.closed,
        );
        let sent = client.join().expect("client thread");
        (r, sent, app, drv.stats())
    });
    let (r, sent, app, stats) = driver.join().expect("driver thread");
    r.unwrap_or_else(|e| panic!("driver: {e}; {stats:?}"));
    assert_eq!(sent, Ok(TOTAL));
    assert_eq!(app.passed, TOTAL, "each octet passed up once");
    assert_eq!(app.beyond, 0, "data beyond the offered window");
    let wrong = (0..TOTAL).find(|&i| app.placed[i as usize] != byte_at(i));
    assert_eq!(wrong, None, "first misplaced octet");
    println!(
        "pass-up: {TOTAL} octets placed, {} pieces out of order; {stats:?}",
        app.out_of_order
    );
}

/// A SYN to a port nobody listens on gets the kernel's RST: `Event::Reset`, the connection is
/// removed (and unsteered). A port a kernel socket listens on cannot be listened on, nor
/// can a kernel socket take a port we listen on (the reservation listened on, its SYNs
/// filtered out: a socket bound with SO_REUSEADDR used to share a port merely bound).
#[test]
fn refused_connect_and_kernel_owned_port() {
    let _bed = bed_or_skip!();
    let driver = spawn_in_ns(NS_A, || {
        let mut drv = open_driver();
        let cfg = drv.tcp_config();
        let id = drv
            .connect(SocketAddrV4::new(ADDR_B, 18723), cfg.clone())
            .expect("connect");
        let mut app = Source::new(id, 0, AllocWindow::new(u64::MAX, u64::MAX));
        let r = drive(
            &mut drv,
            &mut app,
            Duration::from_secs(10),
            |_| 0,
            |a| a.closed,
        );
        let live = drv.connections().count();
        let kernel = TcpListener::bind(SocketAddrV4::new(ADDR_A, 18724)).expect("kernel listener");
        let taken = drv.listen(18724, 4, cfg.clone());
        drop(kernel);
        // The other way round: a port we listen on is not the kernel's to give, not even to a
        // socket with SO_REUSEADDR (which std's listeners set), on our address or any.
        drv.listen(18726, 4, cfg).expect("listen");
        let kernel_after = [ADDR_A, Ipv4Addr::UNSPECIFIED]
            .map(|a| TcpListener::bind(SocketAddrV4::new(a, 18726)).map_err(|e| e.kind()));
        (r, app.reset, app.connected, live, taken, kernel_after)
    });
    let (r, reset, connected, live, taken, kernel_after) = driver.join().expect("driver thread");
    assert!(
        kernel_after
            .iter()
            .all(|b| matches!(b, Err(std::io::ErrorKind::AddrInUse))),
        "a kernel socket bound a port we listen on: {kernel_after:?}"
    );
    r.expect("refused connection ends");
    assert!(reset && !connected, "expected a RST before any handshake");
    assert_eq!(live, 0, "closed connection still listed");
    assert!(
        matches!(taken, Err(XdpTcpError::PortInUse { port: 18724, .. })),
        "{taken:?}"
    );
}

/// Closes every connection it accepts at once (the server closes first, and its side ends
/// in TIME-WAIT); counts them.
#[derive(Default)]
struct Closer {
    accepted: u32,
    closed: u32,
}

impl TcpApp for Closer {
    fn on_accept(&mut self, _id: ConnId, conn: &mut Connection) {
        self.accepted += 1;
        conn.close();
    }

    fn on_closed(&mut self, _id: ConnId, _conn: Connection) {
        self.closed += 1;
    }
}

/// RFC 6191 against Linux: the driver closes first (TIME-WAIT on its side), and the kernel
/// client connects again at once from the same port. The new SYN ends the TIME-WAIT and
/// opens the second connection straight away (before, it drew a challenge ACK, the client
/// reset it and retried a second later); the old incarnation is reaped.
#[test]
fn a_client_reconnecting_from_its_port_ends_time_wait() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 18725;
    const CLIENT_PORT: u16 = 41_725;
    let driver = spawn_in_ns(NS_A, move || {
        let mut drv = open_driver();
        let cfg = drv.tcp_config();
        drv.listen(PORT, 4, cfg).expect("listen");
        let client = spawn_in_ns(NS_B, move || -> Result<(), String> {
            use socket2::{Domain, Protocol, Socket, Type};
            let to = SocketAddrV4::new(ADDR_A, PORT);
            for round in 0..2 {
                // Our LAST-ACK may linger a moment after the FIN exchange: the 4-tuple is
                // free once the driver's ACK of our FIN is in.
                let mut tries = 0;
                let s = loop {
                    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
                        .map_err(|e| e.to_string())?;
                    s.set_reuse_address(true).map_err(|e| e.to_string())?;
                    s.bind(&SocketAddrV4::new(ADDR_B, CLIENT_PORT).into())
                        .map_err(|e| format!("bind: {e}"))?;
                    match s.connect_timeout(&to.into(), Duration::from_secs(5)) {
                        Ok(()) => break s,
                        Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) && tries < 200 => {
                            tries += 1;
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(e) => return Err(format!("connect {round}: {e}")),
                    }
                };
                let mut s: TcpStream = s.into();
                s.set_read_timeout(Some(Duration::from_secs(10)))
                    .map_err(|e| e.to_string())?;
                let mut rest = Vec::new();
                s.read_to_end(&mut rest)
                    .map_err(|e| format!("waiting for the server's FIN {round}: {e}"))?;
            }
            Ok(())
        });
        let mut app = Closer::default();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut failure = None;
        // The first connection is reaped when the second SYN ends its TIME-WAIT; the second
        // stays in TIME-WAIT.
        while !(client.is_finished() && app.accepted >= 2 && app.closed >= 1) {
            if let Err(e) = drv.turn(&mut app) {
                failure = Some(e.to_string());
                break;
            }
            if Instant::now() > deadline {
                failure = Some("not done in 20 s".to_string());
                break;
            }
        }
        let client = client.join().expect("client thread");
        (failure, client, app.accepted, app.closed, drv.stats())
    });
    let (failure, client, accepted, closed, stats) = driver.join().expect("driver thread");
    assert_eq!(failure, None, "{stats:?}");
    client.expect("kernel client");
    assert_eq!((accepted, closed), (2, 1), "{stats:?}");
    assert_eq!(stats.table.time_wait_reused, 1, "{stats:?}");
}

/// The kernel's drops before an RX ring are the driver's counters: with nobody polling, a
/// burst of frames to a listening port overflows the queue's RX ring and its frame pool (8
/// frames each here), and `XdpTcpStats::rx_kernel_drops` holds every frame that did not fit.
#[test]
fn kernel_rx_drops_are_counted() {
    use datapath::xsk::packet::{tcp_flags, write_tcp_frame, TcpFrameSpec};
    use datapath::xsk::{interface_info, resolve_next_hop, BindMode, XskConfig, XskSocket};
    let _bed = bed_or_skip!();
    const PORT: u16 = 18725;
    const BURST: u64 = 64;
    const RING: u32 = 8;
    let cfg = XdpTcpConfig {
        queues: Some(vec![0]),
        xsk: XskConfig {
            rx_ring: RING,
            ..XskConfig::default()
        },
        ..XdpTcpConfig::default()
    };
    let mut drv = in_ns(NS_A, || {
        let mut drv = XdpTcp::open(DEV_A, cfg).unwrap_or_else(|e| panic!("open driver: {e}"));
        let tcp = drv.tcp_config();
        drv.listen(PORT, 4, tcp).expect("listen");
        drv
    });
    assert_eq!(drv.stats().rx_kernel_drops, 0, "drops before any traffic");
    in_ns(NS_B, || {
        let xsk = XskConfig {
            bind_mode: BindMode::Copy,
            ..XskConfig::default()
        };
        let mut tx = XskSocket::open(DEV_B, 0, &xsk).expect("TX socket in iwb");
        let info = interface_info(DEV_B).expect("interface facts");
        let (src_ip, _) = info.ipv4.expect("iwb0 has an address");
        let (_, dst_mac) = resolve_next_hop(ADDR_A, Duration::from_secs(3)).expect("ARP");
        let spec = TcpFrameSpec {
            src_mac: info.mac,
            dst_mac,
            src_ip,
            dst_ip: ADDR_A,
            src_port: 40011,
            dst_port: PORT,
            seq: 1,
            ack: 1,
            flags: tcp_flags::ACK,
            window: 65535,
            ip_id: 0,
        };
        let mut sent = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while sent < BURST && Instant::now() < deadline {
            sent += tx
                .send_batch((BURST - sent) as usize, |_, buf| {
                    write_tcp_frame(buf, &spec, 64, |p| p.fill(7)).unwrap_or(0)
                })
                .expect("queue frames") as u64;
            tx.flush().expect("kick");
        }
        assert!(
            tx.drain_tx(Duration::from_secs(2)).expect("drain"),
            "TX did not drain"
        );
        assert_eq!(sent, BURST, "frames sent");
    });
    let drops = drv.stats().rx_kernel_drops;
    assert!(
        (BURST - u64::from(RING)..=BURST).contains(&drops),
        "{drops} drops counted for {BURST} frames at an {RING}-frame ring nobody polled"
    );
    // Taking the frames that fit changes nothing in the count.
    let mut app = Sink {
        conn: None,
        buf: Vec::new(),
        received: 0,
        mismatch: None,
        peer_closed: false,
        closed: false,
        allocs: AllocWindow::new(u64::MAX, u64::MAX),
    };
    in_ns(NS_A, || drv.poll(&mut app)).expect("poll");
    assert_eq!(drv.stats().rx_kernel_drops, drops);
}

// ---------------------------------------------------------------- shards

/// One sending connection of a shard ([`MultiSource`]).
#[derive(Default)]
struct Flow {
    total: u64,
    queued: u64,
    connected: bool,
    reset: bool,
    acked: u64,
    close_sent: bool,
    closed: bool,
}

/// Sends `total` bytes (`byte_at` pattern) on each of its connections, then closes each.
struct MultiSource {
    flows: Vec<(ConnId, Flow)>,
    chunk: Vec<u8>,
}

impl MultiSource {
    fn flow(&mut self, id: ConnId) -> Option<&mut Flow> {
        self.flows
            .iter_mut()
            .find(|(i, _)| *i == id)
            .map(|(_, f)| f)
    }

    fn acked(&self) -> u64 {
        self.flows.iter().map(|(_, f)| f.acked).sum()
    }

    fn done(&self) -> bool {
        self.flows
            .iter()
            .all(|(_, f)| f.reset || f.closed || (f.close_sent && f.acked >= f.total))
    }
}

impl TcpApp for MultiSource {
    fn on_event(&mut self, id: ConnId, _conn: &mut Connection, event: Event) {
        if let Some(f) = self.flow(id) {
            match event {
                Event::Connected => f.connected = true,
                Event::Reset => f.reset = true,
                _ => {}
            }
        }
    }

    fn on_poll(&mut self, id: ConnId, conn: &mut Connection, _now: TcpInstant) {
        let Some(i) = self.flows.iter().position(|(c, _)| *c == id) else {
            return;
        };
        let (chunk, f) = (&mut self.chunk, &mut self.flows[i].1);
        if !f.connected {
            return;
        }
        f.acked = conn.bytes_acked();
        for _ in 0..64 {
            if f.queued == f.total {
                break;
            }
            let n = (f.total - f.queued).min(chunk.len() as u64) as usize;
            fill(&mut chunk[..n], f.queued);
            match conn.send(&chunk[..n]) {
                Ok(0) | Err(_) => break,
                Ok(k) => f.queued += k as u64,
            }
        }
        if f.queued == f.total && !f.close_sent {
            conn.close();
            f.close_sent = true;
        }
    }

    fn on_closed(&mut self, id: ConnId, conn: Connection) {
        if let Some(f) = self.flow(id) {
            f.acked = conn.bytes_acked();
            f.closed = true;
        }
    }
}

/// Shards (`XdpTcp::open_shards`, one driver per queue of `iwa0`, each on its own thread): 8
/// connections to kernel TCP in `iwb`, two from each shard, 32 MiB each. The kernel's accepted
/// sockets pick their TX queue by a random hash, so the ACKs of most connections arrive on a
/// shard that does not own them and are handed over (every connection landing on its own
/// shard has odds 4^-8). Every byte arrives right, hand-offs are counted, and no shard thread
/// allocates between 40% and 90% of the data acknowledged (receiving, handing off, taking
/// from the inbox and transmitting), at TCP's default send buffer (4 MiB).
#[test]
fn shards_hand_off_without_allocating() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 18724;
    const CONNS: usize = 8;
    const EACH: u64 = 32 << 20;
    static ACKED: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
    // Turns made with allocations counted: none would make `allocs == 0` say nothing.
    static COUNTED_TURNS: AtomicU64 = AtomicU64::new(0);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    // How many connections the shards open (`CONNS` rounded down to a multiple of their count).
    let (count_tx, count_rx) = std::sync::mpsc::channel::<usize>();
    let server = spawn_in_ns(NS_B, move || -> Result<Vec<(u64, Option<u64>)>, String> {
        let l = TcpListener::bind(SocketAddrV4::new(ADDR_B, PORT)).map_err(|e| e.to_string())?;
        let _ = ready_tx.send(());
        let conns = count_rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "no connection count".to_string())?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let readers: Vec<_> = (0..conns)
            .map(|n| {
                let mut s = common::accept_within(&l, common::left(deadline))
                    .map_err(|e| format!("{n} of {conns} connections in 60 s: {e}"))?;
                Ok(std::thread::spawn(move || read_to_end_checked(&mut s)))
            })
            .collect::<Result<_, String>>()?;
        readers
            .into_iter()
            .map(|r| r.join().expect("reader thread"))
            .collect()
    });
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("kernel server up");
    let drivers = in_ns(NS_A, || XdpTcp::open_shards(DEV_A, XdpTcpConfig::default()))
        .unwrap_or_else(|e| panic!("open shards: {e}"));
    let shards = drivers.len();
    assert!(
        (2..=ACKED.len()).contains(&shards),
        "the bed has {QUEUES} queues, got {shards} shards"
    );
    let per_shard = CONNS / shards;
    let _ = count_tx.send(per_shard * shards);
    let total = EACH * (per_shard * shards) as u64;
    let allocs_before = ALLOCS.load(Ordering::Relaxed);
    let threads: Vec<_> = drivers
        .into_iter()
        .enumerate()
        .map(|(k, mut drv)| {
            spawn_in_ns(NS_A, move || {
                let cfg = drv.tcp_config();
                let mut app = MultiSource {
                    flows: Vec::new(),
                    chunk: vec![0u8; 64 * 1024],
                };
                for _ in 0..per_shard {
                    let id = drv
                        .connect(SocketAddrV4::new(ADDR_B, PORT), cfg.clone())
                        .map_err(|e| e.to_string())?;
                    let f = Flow {
                        total: EACH,
                        ..Flow::default()
                    };
                    app.flows.push((id, f));
                }
                let start = Instant::now();
                let mut last = (Instant::now(), 0u64);
                let r = loop {
                    if app.done() {
                        break Ok(());
                    }
                    let counted = COUNTING.with(|c| c.get());
                    if let Err(e) = drv.turn(&mut app) {
                        break Err(e.to_string());
                    }
                    if counted {
                        COUNTED_TURNS.fetch_add(1, Ordering::Relaxed);
                    }
                    let acked = app.acked();
                    ACKED[k].store(acked, Ordering::Relaxed);
                    let all: u64 = ACKED.iter().map(|a| a.load(Ordering::Relaxed)).sum();
                    counting(all >= total * 2 / 5 && all < total * 9 / 10);
                    if acked != last.1 {
                        last = (Instant::now(), acked);
                    } else if last.0.elapsed() > STALL || start.elapsed() > Duration::from_secs(120)
                    {
                        break Err(format!("shard {k}: stalled at {acked} bytes"));
                    }
                };
                counting(false);
                // The other shards may still need this one for their hand-offs and FINs.
                let until = Instant::now() + Duration::from_secs(2);
                while ACKED.iter().map(|a| a.load(Ordering::Relaxed)).sum::<u64>() < total
                    && Instant::now() < until
                {
                    let _ = drv.turn(&mut app);
                }
                r.map(|()| drv.stats())
            })
        })
        .collect();
    let stats: Vec<_> = threads
        .into_iter()
        .map(|t| t.join().expect("shard thread"))
        .collect::<Result<_, String>>()
        .unwrap_or_else(|e| panic!("{e}"));
    let allocs = ALLOCS.load(Ordering::Relaxed) - allocs_before;
    let got = server
        .join()
        .expect("server thread")
        .expect("kernel server");
    for (got, mismatch) in &got {
        assert_eq!(*got, EACH);
        assert_eq!(*mismatch, None, "first wrong byte at this offset");
    }
    let sum = |f: fn(&datapath::xdp_tcp::XdpTcpStats) -> u64| stats.iter().map(f).sum::<u64>();
    let (out, inn, drops) = (
        sum(|s| s.handoffs_out),
        sum(|s| s.handoffs_in),
        sum(|s| s.handoff_drops),
    );
    for (k, s) in stats.iter().enumerate() {
        println!(
            "shard {k}: {} frames, {} handed off, {} taken over, {} dropped (inbox full)",
            s.rx_frames, s.handoffs_out, s.handoffs_in, s.handoff_drops
        );
    }
    let counted = COUNTED_TURNS.load(Ordering::Relaxed);
    println!("allocations on the shard threads in the window of {counted} turns: {allocs}");
    assert!(counted > 0, "no turn was made with allocations counted");
    assert!(inn > 0, "no segment was handed over: {stats:#?}");
    // A shard that finished may leave the last frames handed to it (late ACKs) in its inbox.
    assert!(inn <= out, "{inn} taken over, {out} handed off");
    println!("{out} handed off, {inn} taken over, {drops} dropped");
    assert_eq!(
        allocs, 0,
        "allocations on the shard threads in steady state"
    );
}

/// Sets `iwa0`'s running channels (`ethtool -L iwa0 <args>`). A closed AF_XDP socket's queue
/// is released a moment after the close (the kernel frees the socket's pool in a work item),
/// and until then the kernel refuses to stop the queue: tried for up to 5 s.
fn set_channels(args: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", NS_A, "ethtool", "-L", DEV_A])
            .args(args)
            .output()
            .expect("ethtool");
        if out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "ethtool -L {DEV_A} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The queues a driver opened on `iwa0` with the default configuration binds, or its error.
fn default_queues() -> Result<Vec<u32>, String> {
    spawn_in_ns(NS_A, || {
        XdpTcp::open(DEV_A, XdpTcpConfig::default())
            .map(|d| d.queues())
            .map_err(|e| e.to_string())
    })
    .join()
    .expect("driver thread")
}

/// A NIC may run fewer queues than it has (channels lowered with `ethtool -L`), and an AF_XDP
/// socket binds only to a running one: the driver bound every queue the interface has and
/// failed on the first that was not running. It binds the running ones now; and an interface
/// that receives on more queues than the driver can serve (here, fewer TX queues than RX) is
/// refused with the reason and the cure, where packets on the queues left out would have gone
/// to the kernel (a RST, or nothing, for the engine's connections).
#[test]
fn the_driver_binds_the_queues_the_interface_runs() {
    let _bed = bed_or_skip!();
    set_channels(&["rx", "2", "tx", "2"]);
    assert_eq!(default_queues(), Ok(vec![0, 1]));
    set_channels(&["tx", "1"]);
    let refused = default_queues().expect_err("2 RX queues served by 1");
    assert!(
        refused.contains("receives on 2 queues") && refused.contains("ethtool -L"),
        "{refused}"
    );
}
