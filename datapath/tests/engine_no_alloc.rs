//! No allocation per packet in steady state in the iWARP connection glue: a counting global
//! allocator, armed only inside `IwarpConn::on_data` and `IwarpConn::poll` (the simulator
//! itself allocates per packet), watches Writes and Sends under 1 % loss and reordering, with
//! out-of-order placement, and Reads (B's Read Responses hold their source region through a
//! shared handle, `RegionBuffer::share`). After a warm-up, receive (in order and early
//! placement), transmit (FPDU descriptors, and the FPDU octets written into each packet buffer
//! from the registered source, `TxMode::Source`) and completions allocate nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use datapath::engine::{ConnConfig, ConnEvent, IwarpConn};
use rdmap::memory::VecBuffer;
use rdmap::{Access, MemoryTable, PdId, RecvWr, SendOp, SendWr, Sge, WorkCompletion};
use tcp_engine::sim::{Endpoint, LinkConfig, Network};
use tcp_engine::{Config, Connection, FourTuple, Instant, IsnGenerator, SegmentRepr, TxMode};

struct Counting;
static ARMED: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc`/`realloc` with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn armed<T>(f: impl FnOnce() -> T) -> T {
    ARMED.store(true, Ordering::Relaxed);
    let r = f();
    ARMED.store(false, Ordering::Relaxed);
    r
}

/// The engine's TCP profile: MPA records whose octets come from the connection's FPDU
/// descriptors (`TxMode::Source`), pass-up receive.
fn tcp_config() -> Config {
    Config {
        tx_mode: TxMode::Source,
        ..Config::mpa()
    }
}

const PD: PdId = PdId(1);

struct Side {
    tcp: Option<Connection>,
    listen: Option<Config>,
    isn: IsnGenerator,
    iw: IwarpConn,
    mem: MemoryTable<VecBuffer>,
    completions: Vec<WorkCompletion>,
}

impl Side {
    fn pump(&mut self, now: Instant) {
        let Some(tcp) = self.tcp.as_mut() else { return };
        self.iw.take_tcp_events(tcp);
        let Side { iw, mem, .. } = self;
        armed(|| iw.poll(tcp, mem, now));
        while let Some(ev) = self.iw.poll_event() {
            if let ConnEvent::Request(_) = ev {
                self.iw.accept(b"").expect("accept");
            }
        }
        while let Some(wc) = armed(|| self.iw.qp_mut().poll_completion()) {
            self.completions.push(wc);
        }
    }
}

impl Endpoint for Side {
    fn receive(&mut self, now: Instant, packet: &[u8]) {
        let Ok(seg) = SegmentRepr::parse(packet) else {
            return;
        };
        if self.tcp.is_none() {
            if let Some(cfg) = self.listen.clone() {
                self.tcp = Connection::accept(cfg, &seg, &self.isn, now);
            }
        } else if let Some(tcp) = self.tcp.as_mut() {
            let Side { iw, mem, .. } = self;
            tcp.handle_segment(now, &seg, |p| armed(|| iw.on_data(p, mem)));
        }
        self.pump(now);
    }

    fn transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.pump(now);
        let Side { tcp, iw, mem, .. } = self;
        let tcp = tcp.as_mut()?;
        // The FPDU octets are written into `buf` here (TxMode::Source): armed too.
        armed(|| iw.poll_transmit(tcp, mem, now, buf))
    }

    fn next_timeout(&self) -> Option<Instant> {
        self.tcp.as_ref().and_then(|t| t.poll_timeout())
    }

    fn on_timeout(&mut self, now: Instant) {
        if let Some(tcp) = self.tcp.as_mut() {
            tcp.handle_timeout(now);
        }
        self.pump(now);
    }
}

#[test]
fn steady_state_allocates_nothing() {
    steady_state(false);
}

/// Behind a middlebox that splits and joins segments, with Markers: FPDUs located in
/// re-cut segments, held pieces scanned again, the framing carried across gaps and searched
/// backwards, all without allocating.
#[test]
fn resegmented_with_markers_allocates_nothing() {
    steady_state(true);
}

/// The allocator's counter is global: one scenario at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn steady_state(resegment: bool) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let epoch = std::time::Instant::now();
    let cfg = || {
        let mut c = ConnConfig::default();
        c.qp.pd = PD;
        c.mpa.markers = resegment;
        c
    };
    let tuple = FourTuple {
        local_addr: Ipv4Addr::new(10, 0, 0, 1),
        local_port: 40000,
        remote_addr: Ipv4Addr::new(10, 0, 0, 2),
        remote_port: 5000,
    };
    let isn = IsnGenerator::new([1; 16]);
    let mut a = Side {
        tcp: Some(Connection::connect(
            tcp_config(),
            tuple,
            &isn,
            Instant::ZERO,
        )),
        listen: None,
        isn,
        iw: IwarpConn::initiator(cfg(), b"", epoch, Instant::ZERO).unwrap(),
        mem: MemoryTable::new(),
        completions: Vec::new(),
    };
    let mut b = Side {
        tcp: None,
        listen: Some(tcp_config()),
        isn: IsnGenerator::new([2; 16]),
        iw: IwarpConn::responder(cfg(), epoch, Instant::ZERO).unwrap(),
        mem: MemoryTable::new(),
        completions: Vec::new(),
    };
    let link = LinkConfig {
        loss: 0.01,
        reorder: 0.02,
        jitter: Duration::from_micros(2),
        split: if resegment { 0.2 } else { 0.0 },
        merge: if resegment { 0.2 } else { 0.0 },
        ..LinkConfig::default()
    };
    let mut net = Network::new(link.clone(), link, 9);
    const LEN: usize = 256 << 10;
    let src = a.mem.register(
        PD,
        VecBuffer::from_vec(vec![7; LEN]),
        0,
        Access::LOCAL_WRITE,
    );
    let sink = b
        .mem
        .register(PD, VecBuffer::zeroed(LEN), 0, Access::REMOTE_WRITE);
    let rbuf = b
        .mem
        .register(PD, VecBuffer::zeroed(LEN), 0, Access::LOCAL_WRITE);
    let read_src = b.mem.register(
        PD,
        VecBuffer::from_vec(vec![9; LEN]),
        0,
        Access::REMOTE_READ,
    );
    let read_sink = a
        .mem
        .register(PD, VecBuffer::zeroed(LEN), 0, Access::LOCAL_WRITE);
    let sge = Some(Sge {
        stag: src,
        to: 0,
        len: LEN as u32,
    });
    let mut counts = Vec::new();
    for round in 0..40u64 {
        b.iw.qp_mut()
            .post_recv(
                RecvWr {
                    wr_id: round,
                    sg_list: Sge {
                        stag: rbuf,
                        to: 0,
                        len: LEN as u32,
                    }
                    .into(),
                },
                &b.mem,
            )
            .unwrap();
        let read = SendOp::Read {
            remote_stag: read_src,
            remote_to: 0,
        };
        let read_sge = Some(Sge {
            stag: read_sink,
            to: 0,
            len: LEN as u32,
        });
        for (op, local) in [
            (
                SendOp::Write {
                    remote_stag: sink,
                    remote_to: 0,
                },
                sge,
            ),
            (
                SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sge,
            ),
            (read, read_sge),
        ] {
            a.iw.qp_mut()
                .post_send(
                    SendWr {
                        wr_id: round,
                        op,
                        sg_list: local.into(),
                        signaled: true,
                        fence: false,
                    },
                    &a.mem,
                )
                .unwrap();
        }
        let want = b.completions.len() + 1;
        let want_a = a.completions.len() + 3;
        let before = ALLOCS.load(Ordering::Relaxed);
        let limit = net.now + Duration::from_secs(60);
        assert!(net.run(
            &mut a,
            &mut b,
            limit,
            |a, b, _| b.completions.len() >= want && a.completions.len() >= want_a,
            |_, _, _| {}
        ));
        counts.push(ALLOCS.load(Ordering::Relaxed) - before);
    }
    let ca = a.iw.counters();
    let cb = b.iw.counters();
    println!("allocations per round: {counts:?}\nA {ca:?}\nB {cb:?}");
    assert!(
        cb.bytes_placed_out_of_order > 0,
        "early placement exercised: {cb:?}"
    );
    assert!(ca.retransmissions > 0);
    if resegment {
        assert!(cb.held_total > 0, "the store exercised: {cb:?}");
    }
    assert!(
        a.completions
            .iter()
            .all(|c| c.status == rdmap::WcStatus::Success),
        "every Write, Send and Read completed"
    );
    assert_eq!(a.mem.get(read_sink).unwrap().to_vec(), vec![9; LEN]);
    assert!(
        cb.fpdus_tx > 40 * (LEN as u64 / 1500),
        "B sent the Read Responses: {cb:?}"
    );
    let late: u64 = counts[counts.len() / 2..].iter().sum();
    assert_eq!(late, 0, "allocations in the second half: {counts:?}");
}
