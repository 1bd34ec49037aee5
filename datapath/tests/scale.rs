//! Scale: 10,000 established iWARP connections on one AF_XDP engine (in `iwa`), opened from an
//! engine in `iwb`, each doing a verified Write and a verified Send; the setup rate, and the
//! heap each connection holds once established and idle (a counting allocator; both ends run
//! in this process, so the figure is per connection end). Then the connection setup rate of
//! the socket transport beside the engine's, 1,000 connections each, in the same run.
//! Needs root and the veth bed (`SKIPPED` without, a failure under `CI=true`).
//!
//! `IWARP_SCALE_CONNS` sets the number of engine connections: 2,000 by default (CI), 10,000
//! for the run by hand recorded in `docs/BENCHMARKS.md` (its table in the history), which takes
//! about 4 minutes: an engine turn costs O(live connections) (`xdp_tcp`'s module
//! documentation), so setting up and closing slow down as connections accumulate.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, Connection, Listener, MemoryRegion, ProtectionDomain,
    RecvWr, SendOp, SendWr, Stag, WcStatus,
};
use testbed::*;

#[path = "common/live_heap.rs"]
mod live_heap;

#[global_allocator]
static GLOBAL: live_heap::Counting = live_heap::Counting;

const PORT: u16 = 19_641;
const SOCKET_PORT: u16 = 19_642;
const WAIT: Duration = Duration::from_secs(60);
/// Octets each connection Writes, and Sends.
const WRITE_LEN: usize = 64;
const SEND_LEN: usize = 32;
/// Threads opening connections at once.
const CONNECTORS: usize = 8;
/// Connections of the socket transport's setup-rate run (a thread per connection per side).
const SOCKET_CONNS: usize = 1000;

fn conns() -> usize {
    std::env::var("IWARP_SCALE_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(30),
        sq_depth: 4,
        rq_depth: 4,
        backlog: 1024,
        ..ConnectParams::default()
    }
}

/// The engine's settings for many small connections: per-connection buffers sized for
/// messages of a few KiB (the defaults are for bulk transfers: see the figures).
fn engine_config(conns: usize) -> XdpEngineConfig {
    let mut cfg = XdpEngineConfig::default();
    cfg.driver.max_connections = conns + 1024;
    cfg.backlog = 1024;
    cfg.reassembly_capacity = 64 << 10;
    cfg.max_placed_fpdus = 64;
    cfg.max_tx_fpdus = 64;
    cfg.tx_ahead = 64 << 10;
    cfg.tcp.send_buffer = 64 << 10;
    cfg.tcp.recv_buffer = 64 << 10;
    cfg
}

/// Lifts the open-file limit to its hard limit: every active open reserves its ephemeral port
/// with a kernel socket.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a struct on our stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn pattern(i: usize, len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|k| (i as u8) ^ (i >> 8) as u8 ^ (k as u8).wrapping_mul(salt))
        .collect()
}

fn offer(mr: &MemoryRegion, off: usize) -> Vec<u8> {
    let mut p = mr.stag().0.to_be_bytes().to_vec();
    p.extend_from_slice(&(mr.base_to() + off as u64).to_be_bytes());
    p
}

/// What the listening side saw.
struct Served {
    accepted: usize,
    verified: usize,
}

/// The listening engine: accepts `n` connections (private data: the connection's index),
/// each with a receive posted and its own slice of one region to Write into, then checks
/// every Send and every slice.
fn serve(
    n: usize,
    ready: mpsc::Sender<()>,
    go_verify: mpsc::Receiver<()>,
) -> Result<Served, String> {
    let engine = XdpEngine::start(DEV_A, engine_config(n)).map_err(|e| e.to_string())?;
    let listener = engine.listen(PORT, params()).map_err(|e| e.to_string())?;
    let pd = ProtectionDomain::new();
    // A receive completion per connection, and room for their flushes.
    let cq = CompletionQueue::create(2 * n, None, 0).map_err(|e| e.to_string())?;
    let sink = pd
        .register(n * WRITE_LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(|e| e.to_string())?;
    let inbox = pd
        .register(n * SEND_LEN, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let _ = ready.send(());
    let mut held: Vec<Connection> = Vec::with_capacity(n);
    while held.len() < n {
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| format!("accept: {e}"))?
            .ok_or_else(|| format!("only {} connections arrived", held.len()))?;
        let p = req.private_data();
        let i = u32::from_be_bytes(p.get(..4).ok_or("no index")?.try_into().unwrap()) as usize;
        if i >= n {
            return Err(format!("index {i} out of range"));
        }
        let recv = RecvWr {
            wr_id: i as u64,
            sg_list: inbox.sge(i * SEND_LEN, SEND_LEN as u32).into(),
        };
        let conn = req
            .accept_with_recvs(&pd, &cq, &offer(&sink, i * WRITE_LEN), vec![recv])
            .map_err(|e| format!("accept {i}: {e}"))?;
        held.push(conn);
    }
    let accepted = held.len();
    // Every Send arrives after its connection's Write was placed (RDMAP orders them).
    let mut seen = vec![false; n];
    let deadline = Instant::now() + WAIT;
    let mut got = 0;
    while got < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let c = cq
            .wait(left)
            .ok_or_else(|| format!("{got} of {n} Sends arrived"))?;
        if c.wc.status != WcStatus::Success {
            return Err(format!("receive failed: {c:?}"));
        }
        let i = c.wc.wr_id as usize;
        if seen.get(i).copied() != Some(false) {
            return Err(format!("receive {i} completed twice or out of range"));
        }
        seen[i] = true;
        got += 1;
    }
    let mut verified = 0;
    let mut buf = vec![0u8; WRITE_LEN.max(SEND_LEN)];
    for i in 0..n {
        inbox.read(i * SEND_LEN, &mut buf[..SEND_LEN]);
        if buf[..SEND_LEN] != pattern(i, SEND_LEN, 7)[..] {
            return Err(format!("connection {i}: the Send's bytes differ"));
        }
        sink.read(i * WRITE_LEN, &mut buf[..WRITE_LEN]);
        if buf[..WRITE_LEN] != pattern(i, WRITE_LEN, 3)[..] {
            return Err(format!("connection {i}: the Write's bytes differ"));
        }
        verified += 1;
    }
    let _ = go_verify.recv_timeout(WAIT);
    drop(held);
    Ok(Served { accepted, verified })
}

/// The connecting engine's result: setup time, heap per connection end, completions.
struct Opened {
    setup: Duration,
    heap_per_conn: i64,
}

fn open_all(n: usize) -> Result<(Opened, Vec<Connection>, XdpEngine), String> {
    raise_nofile();
    let engine = XdpEngine::start(DEV_B, engine_config(n)).map_err(|e| e.to_string())?;
    let pd = ProtectionDomain::new();
    // Two signaled requests per connection before any is polled.
    let cq = CompletionQueue::create(2 * n, None, 0).map_err(|e| e.to_string())?;
    let src = pd
        .register(n * (WRITE_LEN + SEND_LEN), Access::NONE)
        .map_err(|e| e.to_string())?;
    for i in 0..n {
        src.write(i * (WRITE_LEN + SEND_LEN), &pattern(i, WRITE_LEN, 3));
        src.write(
            i * (WRITE_LEN + SEND_LEN) + WRITE_LEN,
            &pattern(i, SEND_LEN, 7),
        );
    }
    let before = live_heap::live();
    let started = Instant::now();
    let addr = SocketAddr::from((ADDR_A, PORT));
    let per = n.div_ceil(CONNECTORS);
    let opened: Result<Vec<Vec<(usize, Connection)>>, String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..CONNECTORS)
            .map(|w| {
                let (engine, pd, cq) = (&engine, &pd, &cq);
                s.spawn(move || -> Result<Vec<(usize, Connection)>, String> {
                    let mut mine = Vec::new();
                    for i in (w * per)..((w + 1) * per).min(n) {
                        let conn = engine
                            .connect(addr, pd, cq, &params(), &(i as u32).to_be_bytes())
                            .map_err(|e| format!("connect {i}: {e}"))?;
                        mine.push((i, conn));
                    }
                    Ok(mine)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().map_err(|_| "connector panicked".to_string())?)
            .collect()
    });
    let setup = started.elapsed();
    let mut conns: Vec<Connection> = Vec::with_capacity(n);
    for (i, conn) in opened?.into_iter().flatten() {
        let p = &conn.private_data;
        let stag = Stag(u32::from_be_bytes(p[..4].try_into().unwrap()));
        let to = u64::from_be_bytes(p[4..12].try_into().unwrap());
        let base = i * (WRITE_LEN + SEND_LEN);
        conn.qp
            .post_send(SendWr {
                wr_id: 2 * i as u64,
                op: SendOp::Write {
                    remote_stag: stag,
                    remote_to: to,
                },
                sg_list: src.sge(base, WRITE_LEN as u32).into(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| format!("Write {i}: {e}"))?;
        conn.qp
            .post_send(SendWr {
                wr_id: 2 * i as u64 + 1,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sg_list: src.sge(base + WRITE_LEN, SEND_LEN as u32).into(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| format!("Send {i}: {e}"))?;
        conns.push(conn);
    }
    let deadline = Instant::now() + WAIT;
    for k in 0..2 * n {
        let left = deadline.saturating_duration_since(Instant::now());
        let c = cq
            .wait(left)
            .ok_or_else(|| format!("{k} of {} completions", 2 * n))?;
        if c.wc.status != WcStatus::Success {
            return Err(format!("{c:?}"));
        }
    }
    // Idle now: what the connections hold (both ends live in this process).
    std::thread::sleep(Duration::from_millis(200));
    let heap_per_conn = (live_heap::live() - before) / (2 * n as i64);
    Ok((
        Opened {
            setup,
            heap_per_conn,
        },
        conns,
        engine,
    ))
}

/// The socket transport's setup rate: `SOCKET_CONNS` connections to a socket listener in
/// `iwa`, from `CONNECTORS` threads in `iwb`.
fn socket_setup_rate() -> Result<f64, String> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = spawn_in_ns(NS_A, move || -> Result<Vec<Connection>, String> {
        let listener = Listener::bind(SocketAddr::from((ADDR_A, SOCKET_PORT)), params())
            .map_err(|e| e.to_string())?;
        let _ = ready_tx.send(());
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let mut held = Vec::with_capacity(SOCKET_CONNS);
        while held.len() < SOCKET_CONNS {
            let req = listener
                .accept_timeout(WAIT)
                .map_err(|e| e.to_string())?
                .ok_or("socket accept timed out")?;
            held.push(req.accept(&pd, &cq, b"").map_err(|e| e.to_string())?);
        }
        Ok(held)
    });
    ready_rx.recv_timeout(WAIT).map_err(|_| "socket listener")?;
    let took = in_ns(NS_B, || -> Result<Duration, String> {
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let addr = SocketAddr::from((ADDR_A, SOCKET_PORT));
        let per = SOCKET_CONNS / CONNECTORS;
        let started = Instant::now();
        let all: Result<Vec<Vec<Connection>>, String> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..CONNECTORS)
                .map(|_| {
                    let (pd, cq) = (&pd, &cq);
                    s.spawn(move || -> Result<Vec<Connection>, String> {
                        (0..per)
                            .map(|_| {
                                datapath::connect(addr, pd, cq, &params(), b"")
                                    .map_err(|e| e.to_string())
                            })
                            .collect()
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().map_err(|_| "connector panicked".to_string())?)
                .collect()
        });
        let took = started.elapsed();
        drop(all?);
        Ok(took)
    })?;
    let held = server.join().map_err(|_| "socket server panicked")??;
    drop(held);
    Ok(SOCKET_CONNS as f64 / took.as_secs_f64())
}

#[test]
fn thousands_of_connections_on_one_engine() {
    let _bed = bed_or_skip!();
    let n = conns();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (verify_tx, verify_rx) = mpsc::channel();
    let server = spawn_in_ns(NS_A, move || serve(n, ready_tx, verify_rx));
    ready_rx.recv_timeout(WAIT).expect("listening engine ready");
    let client = spawn_in_ns(NS_B, move || open_all(n));
    let opened = client.join().expect("client thread");
    let (opened, conns, engine) = opened.unwrap_or_else(|e| panic!("connecting side: {e}"));
    let _ = verify_tx.send(());
    let served = server
        .join()
        .expect("server thread")
        .unwrap_or_else(|e| panic!("listening side: {e}"));
    drop(conns);
    drop(engine);
    let engine_rate = n as f64 / opened.setup.as_secs_f64();
    let socket_rate = socket_setup_rate().unwrap_or_else(|e| panic!("socket transport: {e}"));
    println!(
        "{n} connections: set up in {:?} ({engine_rate:.0}/s); {} Writes and Sends verified; \
         heap per idle connection end {} octets; socket transport: {socket_rate:.0} \
         connections/s ({SOCKET_CONNS}), engine/socket {:.2}",
        opened.setup,
        served.verified,
        opened.heap_per_conn,
        engine_rate / socket_rate
    );
    assert_eq!(served.accepted, n);
    assert_eq!(served.verified, n);
}
