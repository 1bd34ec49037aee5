//! Soak: random work through the lossy relay bed (`scripts/netns-relay.sh`) for a set time,
//! every byte checked: an engine server (iwra) <-> relay (iwrr, `testbed::relay`: loss,
//! reordering, duplication, delay with jitter) <-> [`CLIENTS`] client threads (iwrb) on an
//! engine (`engine_clients`) or on the socket transport (`socket_clients`).
//!
//! Each client thread loops until the time is up: it connects, runs a random number of
//! batches of random operations, and ends the connection in one of three ways. Operations,
//! each in its own lane of the regions, several in flight at once:
//! * a Write of random length (1 octet to a lane, log-uniform) gathered from one to three
//!   SGEs, to a random offset of the server's region, then a Read of the same range back into
//!   another local region (the Read Request acts only after the octets before it in the
//!   stream, the Write's, are placed: RFC 5040 section 5.3): the read-back is checked;
//! * a Send of random length (1 octet to [`SEND_MAX`]) that the server echoes with a Send of
//!   its own: the echo is checked.
//!
//! Ends: the client disconnects; the client asks the server to disconnect (an empty Send)
//! and waits for its queue pair to finish; the client aborts (a reset). Afterwards every
//! client and server thread returned without error, both engines ran without error, no CRC
//! error and no Terminate, nothing is held in a reassembly store, and every connection a
//! client made was established at the server.
//!
//! Environment: `SOAK_SECONDS` (default 15) for each test, `SOAK_SEED` (default 1),
//! `SOAK_LOSS` (default 0.01: as much reordering, half as much duplication), `SOAK_MTU`
//! (default the bed's 1500). Long runs by hand: `scripts/soak.sh` (docs/RELIABILITY.md).
//!
//! Needs root; skips (or fails under `CI=true`) otherwise.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datapath::engine::{EngineCounters, XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, ConnectRequest, Connection, DatapathError, Keepalive,
    MemoryRegion, ProtectionDomain, QueuePair, RecvWr, SendOp, SendWr, Sge, SgeList, Stag,
    WcOpcode, WcStatus,
};
use testbed::relay::*;
use testbed::{relay_bed_or_skip, spawn_in_ns};

/// Client threads, each with one connection at a time.
const CLIENTS: usize = 4;
/// The server's region per connection, and each client's Write source and Read sink.
const REGION: usize = 4 << 20;
/// Operations in flight at once, each in its own lane of the regions.
const LANES: usize = 4;
const LANE: usize = REGION / LANES;
/// Longest Send (and the server's receive slots).
const SEND_MAX: usize = 64 << 10;
/// Receives the server keeps posted.
const SLOTS: usize = 4;
/// Longest wait for one batch's completions, a connection or a close.
const WAIT: Duration = Duration::from_secs(30);

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a valid value")),
        Err(_) => default,
    }
}

/// SplitMix64: the operations' choices, reproducible from `SOAK_SEED` (the interleaving of the
/// threads and the relay's timing are not).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    /// Log-uniform in `1..=max`: as many short messages as long ones.
    fn length(&mut self, max: usize) -> usize {
        let bits = usize::BITS - max.leading_zeros();
        let top = 1usize << self.range(0, bits as usize - 1);
        self.range(top.min(max).div_ceil(2).max(1), top.min(max))
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

fn bytes(mr: &MemoryRegion, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v);
    v
}

fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(20),
        ..ConnectParams::default()
    }
}

/// The server's parameters: keepalive after a second idle, since the relay may drop the
/// reset of an aborting client, leaving the server's end open with nothing to send (as any
/// half-open TCP connection; the probe draws the client stack's reset).
fn server_params() -> ConnectParams {
    ConnectParams {
        keepalive: Some(Keepalive {
            idle: Duration::from_secs(1),
            interval: Duration::from_millis(500),
            probes: 4,
        }),
        ..params()
    }
}

/// What the threads did, summed.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    connections: u64,
    writes_read_back: u64,
    echoes: u64,
    bytes_checked: u64,
    client_disconnects: u64,
    server_disconnects: u64,
    aborts: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.connections += o.connections;
        self.writes_read_back += o.writes_read_back;
        self.echoes += o.echoes;
        self.bytes_checked += o.bytes_checked;
        self.client_disconnects += o.client_disconnects;
        self.server_disconnects += o.server_disconnects;
        self.aborts += o.aborts;
    }
}

/// Serves one connection: advertises its region in the Reply's private data, echoes every
/// Send, disconnects on an empty Send, and returns once the connection ended.
fn serve(req: ConnectRequest) -> Result<(), String> {
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let target = pd
        .register(REGION, Access::ALL)
        .map_err(|e| e.to_string())?;
    let slots = pd
        .register(SLOTS * SEND_MAX, Access::ALL)
        .map_err(|e| e.to_string())?;
    let recv = |i: usize| RecvWr {
        wr_id: i as u64,
        sg_list: slots.sge(i * SEND_MAX, SEND_MAX as u32).into(),
    };
    let mut welcome = target.stag().0.to_be_bytes().to_vec();
    welcome.extend_from_slice(&target.base_to().to_be_bytes());
    let conn = req
        .accept_with_recvs(&pd, &cq, &welcome, (0..SLOTS).map(recv).collect())
        .map_err(|e| format!("accept: {e}"))?;
    let qp = conn.qp;
    loop {
        let Some(c) = cq.wait(WAIT) else {
            return Err(format!("server: nothing for {WAIT:?}: {:?}", qp.status()));
        };
        let (status, opcode, i) = (c.wc.status, c.wc.opcode, c.wc.wr_id as usize % SLOTS);
        let posted = match (status, opcode) {
            (WcStatus::Success, WcOpcode::Recv) => {
                let len = c.wc.byte_len as usize;
                if len == 0 {
                    qp.disconnect();
                    return finished(&qp, "server after the empty Send");
                }
                qp.post_send(SendWr {
                    wr_id: (SLOTS + i) as u64,
                    op: SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    },
                    sg_list: slots.sge(i * SEND_MAX, len as u32).into(),
                    signaled: true,
                    fence: false,
                })
            }
            (WcStatus::Success, WcOpcode::Send) => qp.post_recv(recv(i)),
            (WcStatus::WrFlushError, _) => {
                // The client ended the connection: the rest flush too.
                qp.disconnect();
                return finished(&qp, "server after a flush");
            }
            _ => return Err(format!("server: {c:?}; {:?}", qp.status())),
        };
        match posted {
            Ok(()) => {}
            // The client closed the connection meanwhile (RDMAP Closing refuses posts; in
            // Error they would complete flushed).
            Err(DatapathError::Disconnected) => {
                qp.disconnect();
                return finished(&qp, "server after a refused post");
            }
            Err(e) => return Err(format!("server post: {e}; {:?}", qp.status())),
        }
    }
}

fn finished(qp: &QueuePair, what: &str) -> Result<(), String> {
    if qp.wait_finished(WAIT) {
        Ok(())
    } else {
        Err(format!("{what}: not finished: {:?}", qp.status()))
    }
}

/// The server: an engine on the relay bed's `iwra0` accepting until `stop`, a thread per
/// connection. Returns its engine's counters and how many connections it accepted.
fn server(
    port: u16,
    ready: std::sync::mpsc::Sender<()>,
    stop: Arc<AtomicBool>,
) -> Result<(EngineCounters, u64), String> {
    let mut engine = XdpEngine::start(DEV_A, XdpEngineConfig::default())
        .map_err(|e| format!("server engine: {e}"))?;
    let listener = engine
        .listen(port, server_params())
        .map_err(|e| format!("listen: {e}"))?;
    let _ = ready.send(());
    let mut serving: Vec<std::thread::JoinHandle<Result<(), String>>> = Vec::new();
    let mut accepted = 0;
    let join = |t: std::thread::JoinHandle<_>| t.join().map_err(|_| "a serving thread panicked")?;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept_timeout(Duration::from_millis(50)) {
            Ok(Some(req)) => {
                accepted += 1;
                serving.push(std::thread::spawn(move || serve(req)));
            }
            Ok(None) => {}
            Err(e) => return Err(format!("accept: {e}")),
        }
        // Each connection's outcome as soon as it ended.
        let mut i = 0;
        while i < serving.len() {
            if serving[i].is_finished() {
                join(serving.swap_remove(i))?;
            } else {
                i += 1;
            }
        }
    }
    drop(listener);
    for t in serving {
        join(t)?;
    }
    engine.stop();
    Ok((engine.counters(), accepted))
}

/// The client side's regions, reused by each connection of a thread.
struct Regions {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    src: MemoryRegion,
    dst: MemoryRegion,
    send: MemoryRegion,
    echo: MemoryRegion,
}

impl Regions {
    fn new() -> Result<Regions, String> {
        let pd = ProtectionDomain::new();
        let reg = |len| pd.register(len, Access::ALL).map_err(|e| e.to_string());
        Ok(Regions {
            src: reg(REGION)?,
            dst: reg(REGION)?,
            send: reg(SEND_MAX)?,
            echo: reg(SEND_MAX)?,
            cq: CompletionQueue::new(),
            pd,
        })
    }
}

/// What one batch expects back.
enum Check {
    ReadBack { at: usize, len: usize, seed: u64 },
    Echo { len: usize, seed: u64 },
}

/// One connection's work: `batches` batches of up to [`LANES`] operations.
fn work(
    qp: &QueuePair,
    r: &Regions,
    remote: (Stag, u64),
    rng: &mut Rng,
    tally: &mut Tally,
) -> Result<(), String> {
    for batch in 0..rng.range(1, 8) {
        let mut checks = Vec::new();
        let mut expected = 0;
        for lane in 0..rng.range(1, LANES) {
            let seed = rng.next();
            let base = lane * LANE;
            // One echo per batch: the client's echo buffer is one slot.
            if rng.chance(30) && !checks.iter().any(|c| matches!(c, Check::Echo { .. })) {
                let len = rng.length(SEND_MAX);
                r.send.write(0, &pattern(seed, len));
                qp.post_recv(RecvWr {
                    wr_id: 3,
                    sg_list: r.echo.sge(0, SEND_MAX as u32).into(),
                })
                .map_err(|e| format!("post_recv: {e}"))?;
                qp.post_send(SendWr {
                    wr_id: 2,
                    op: SendOp::Send {
                        solicited: rng.chance(50),
                        invalidate: None,
                    },
                    sg_list: r.send.sge(0, len as u32).into(),
                    signaled: true,
                    fence: false,
                })
                .map_err(|e| format!("post Send: {e}"))?;
                expected += 2;
                checks.push(Check::Echo { len, seed });
                continue;
            }
            let len = rng.length(LANE);
            let off = base + rng.range(0, LANE - len);
            r.src.write(off, &pattern(seed, len));
            // The Write's source in one to three pieces.
            let mut sg = SgeList::default();
            let pieces = rng.range(1, 3).min(len);
            let mut at = 0;
            for p in 0..pieces {
                let n = if p + 1 == pieces {
                    len - at
                } else {
                    rng.range(1, len - at - (pieces - p - 1))
                };
                let s: Sge = r.src.sge(off + at, n as u32);
                sg.push(s).map_err(|e| e.to_string())?;
                at += n;
            }
            let signaled = rng.chance(50);
            qp.post_send(SendWr {
                wr_id: 0,
                op: SendOp::Write {
                    remote_stag: remote.0,
                    remote_to: remote.1 + off as u64,
                },
                sg_list: sg,
                signaled,
                fence: false,
            })
            .map_err(|e| format!("post Write: {e}"))?;
            qp.post_send(SendWr {
                wr_id: 1,
                op: SendOp::Read {
                    remote_stag: remote.0,
                    remote_to: remote.1 + off as u64,
                },
                sg_list: r.dst.sge(off, len as u32).into(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| format!("post Read: {e}"))?;
            expected += 1 + usize::from(signaled);
            checks.push(Check::ReadBack { at: off, len, seed });
        }
        let deadline = Instant::now() + WAIT;
        for k in 0..expected {
            let c = r.cq.wait(left(deadline)).ok_or_else(|| {
                format!(
                    "batch {batch}: {k} of {expected} completions in {WAIT:?}; {:?}",
                    qp.status()
                )
            })?;
            if c.wc.status != WcStatus::Success {
                return Err(format!("batch {batch}: {c:?}; {:?}", qp.status()));
            }
        }
        for c in checks {
            match c {
                Check::ReadBack { at, len, seed } => {
                    if bytes(&r.dst, at, len) != pattern(seed, len) {
                        return Err(format!(
                            "batch {batch}: {len} octets read back at {at} differ"
                        ));
                    }
                    tally.writes_read_back += 1;
                    tally.bytes_checked += len as u64;
                }
                Check::Echo { len, seed } => {
                    if bytes(&r.echo, 0, len) != pattern(seed, len) {
                        return Err(format!("batch {batch}: echo of {len} octets differs"));
                    }
                    tally.echoes += 1;
                    tally.bytes_checked += len as u64;
                }
            }
        }
    }
    Ok(())
}

/// Ends the connection one of three ways.
fn end(qp: &QueuePair, r: &Regions, rng: &mut Rng, tally: &mut Tally) -> Result<(), String> {
    match rng.range(0, 2) {
        0 => {
            qp.disconnect();
            tally.client_disconnects += 1;
            finished(qp, "client disconnect")
        }
        1 => {
            qp.post_send(SendWr {
                wr_id: 9,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sg_list: SgeList::default(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| format!("post the empty Send: {e}"))?;
            let c = r.cq.wait(WAIT).ok_or("the empty Send not completed")?;
            if c.wc.status != WcStatus::Success {
                return Err(format!("the empty Send: {c:?}"));
            }
            // The server's close ends ours.
            let done = finished(qp, "client after the server's disconnect");
            qp.disconnect();
            tally.server_disconnects += 1;
            done
        }
        _ => {
            qp.abort();
            tally.aborts += 1;
            finished(qp, "client abort")
        }
    }
}

/// One client thread: connections with random work until `until`.
fn client_loop(
    connect: &(dyn Fn(&Regions) -> Result<Connection, String> + Sync),
    seed: u64,
    until: Instant,
) -> Result<Tally, String> {
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    let r = Regions::new()?;
    while Instant::now() < until {
        let conn = connect(&r)?;
        tally.connections += 1;
        let w = &conn.private_data;
        if w.len() != 12 {
            return Err(format!("reply private data of {} octets", w.len()));
        }
        let stag = Stag(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
        let mut to = [0u8; 8];
        to.copy_from_slice(&w[4..12]);
        let remote = (stag, u64::from_be_bytes(to));
        let n = tally.connections;
        work(&conn.qp, &r, remote, &mut rng, &mut tally)
            .map_err(|e| format!("connection {n}: {e}"))?;
        end(&conn.qp, &r, &mut rng, &mut tally).map_err(|e| format!("connection {n}: {e}"))?;
        // Whatever the end flushed (the unsignaled Writes report nothing).
        while r.cq.try_next().is_some() {}
    }
    Ok(tally)
}

fn soak(port: u16, engine_clients: bool) {
    let bed = relay_bed_or_skip!();
    let seconds: u64 = env("SOAK_SECONDS", 15);
    let seed: u64 = env("SOAK_SEED", 1);
    let loss: f64 = env("SOAK_LOSS", 0.01);
    let mtu: u32 = env("SOAK_MTU", 1500);
    if mtu != 1500 {
        bed.set_mtu(mtu).expect("the relay bed's MTU");
    }
    println!(
        "soak: {seconds} s, seed {seed}, loss {loss}, MTU {mtu}, {CLIENTS} clients on {}",
        if engine_clients {
            "an engine"
        } else {
            "the socket transport"
        }
    );
    let relay = Relay::start(RelayConfig {
        netns: Some(NS_RELAY.into()),
        dev_a: RELAY_DEV_A.into(),
        dev_b: RELAY_DEV_B.into(),
        seed,
        loss,
        reorder: loss,
        duplicate: loss / 2.0,
        delay: Duration::from_micros(50),
        jitter: Duration::from_micros(100),
        mtu: mtu as usize,
        lifetime: Duration::from_secs(seconds + 300),
        ..RelayConfig::default()
    })
    .unwrap_or_else(|e| panic!("relay: {e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let srv = {
        let stop = stop.clone();
        spawn_in_ns(NS_A, move || server(port, ready_tx, stop))
    };
    if ready_rx.recv_timeout(WAIT).is_err() {
        panic!("server did not start: {:?}", srv.join());
    }
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let clients = spawn_in_ns(
        NS_B,
        move || -> Result<(Tally, Option<EngineCounters>), String> {
            let addr = SocketAddr::from((ADDR_A, port));
            let mut engine = if engine_clients {
                Some(
                    XdpEngine::start(DEV_B, XdpEngineConfig::default())
                        .map_err(|e| format!("client engine: {e}"))?,
                )
            } else {
                None
            };
            let connect = |r: &Regions| {
                match &engine {
                    Some(e) => e.connect(addr, &r.pd, &r.cq, &params(), b"soak"),
                    None => datapath::connect(addr, &r.pd, &r.cq, &params(), b"soak"),
                }
                .map_err(|e| format!("connect: {e}"))
            };
            let results: Vec<_> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..CLIENTS as u64)
                    .map(|t| s.spawn(move || client_loop(&connect, seed ^ (t << 32), until)))
                    .collect();
                threads.into_iter().map(|t| t.join()).collect()
            });
            let mut tally = Tally::default();
            for (t, r) in results.into_iter().enumerate() {
                let r = r.map_err(|_| format!("client {t} panicked"))?;
                tally.add(&r.map_err(|e| format!("client {t}: {e}"))?);
            }
            let counters = engine.as_mut().map(|e| {
                e.stop();
                e.counters()
            });
            Ok((tally, counters))
        },
    );
    let clients = clients.join().expect("client threads");
    stop.store(true, Ordering::Relaxed);
    let server = srv.join().expect("server thread");
    let relay = relay.stop().unwrap_or_else(|e| panic!("relay: {e}"));
    println!("relay: {relay:?}");
    let ((tally, client), (server, accepted)) = match (clients, server) {
        (Ok(c), Ok(s)) => (c, s),
        (c, s) => panic!("clients: {:?}\nserver: {:?}", c.err(), s.err()),
    };
    println!(
        "soak: {:.1} s, {tally:?}; server accepted {accepted}",
        started.elapsed().as_secs_f64()
    );
    let mut engines = vec![("server", server)];
    engines.extend(client.map(|c| ("client", c)));
    for (who, e) in &engines {
        let c = &e.conns;
        println!(
            "{who} engine: established {}, ended {}, retransmissions {}, RTOs {}, \
             placed out of order {} B, held peak {} B, crc errors {}, terminates {} sent / {} received",
            e.established,
            e.ended,
            c.retransmissions,
            c.rto_expirations,
            c.bytes_placed_out_of_order,
            c.held_peak,
            c.crc_errors,
            c.terminates_sent,
            c.terminates_received
        );
        assert!(e.error.is_none(), "{who}: {:?}", e.error);
        assert_eq!(c.crc_errors, 0, "{who}");
        assert_eq!(c.terminates_sent, 0, "{who}");
        assert_eq!(c.terminates_received, 0, "{who}");
        assert_eq!(c.held_bytes, 0, "{who}: nothing left in a reassembly store");
        assert_eq!(e.established, tally.connections, "{who}");
    }
    assert_eq!(accepted, tally.connections);
    assert!(tally.connections >= CLIENTS as u64, "{tally:?}");
    assert!(tally.writes_read_back > 0 && tally.echoes > 0, "{tally:?}");
    if loss > 0.0 {
        assert!(relay.a_to_b.dropped + relay.b_to_a.dropped > 0, "{relay:?}");
    }
}

#[test]
fn engine_clients() {
    soak(19_635, true);
}

#[test]
fn socket_clients() {
    soak(19_636, false);
}
