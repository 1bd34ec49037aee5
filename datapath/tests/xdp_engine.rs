//! The AF_XDP iWARP engine (`datapath::engine::xdp::XdpEngine`) on the veth test bed
//! (`scripts/netns.sh`), through the same application API as the socket transport.
//!
//! * engine (iwa) <-> engine (iwb): our TCP on both ends;
//! * engine (iwa, server) <-> socket transport (iwb, client, kernel TCP);
//! * socket transport (iwb, server) <-> engine (iwa, client).
//!
//! Each case connects with private data both ways, then for 1 B, 4 KiB and 1 MiB does an RDMA
//! Write, an RDMA Read and a Send from the client; the server checks the written bytes and the
//! received Send, the client checks the Read data. The engines' counters are printed and must
//! show FPDUs both ways.
//!
//! The `shards_*` cases run the engine with one thread per queue (`shard_per_queue`) against
//! kernel TCP, 8 connections at once each way: kernel peers pick their TX queue at random, so
//! an engine client's segments are handed between shards (counted), and a server's
//! connections spread over the shards that received their SYNs.
//!
//! The `_at_mtu_3500` cases first raise both veth ends' MTU to 3500 (under the 3506 that
//! native XDP on veth allows): the engine must take its MSS from the interface, as kernel TCP
//! does, so both ends' MULPDU is 3442 (3500 - 40 IP/TCP - 12 timestamps - 6 MPA).
//!
//! Needs root. Without root (or without the bed) each test prints `SKIPPED: <why>` and passes,
//! except under `CI=true`, where it fails with the reason. Tests serialise with every other
//! test-bed user on `/run/lock/iwarp-netns.lock`, bring the bed up fresh and take it down.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, Listener, MemoryRegion, ProtectionDomain, RecvWr,
    SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use testbed::*;

mod common;

const SIZES: [usize; 3] = [1, 4096, 1 << 20];
/// Where size `i`'s data goes in the server's regions (disjoint, so nothing is overwritten).
const OFFSETS: [usize; 3] = [0, 4096, 8192];
const REGION: usize = 8192 + (1 << 20);
const WAIT: Duration = Duration::from_secs(30);
const PORT: u16 = 19_515;

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (i as u64 ^ (seed as u64).rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            (x >> 56) as u8
        })
        .collect()
}

fn bytes(mr: &MemoryRegion, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v);
    v
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Engine(&'static str),
    Socket,
}

fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    }
}

/// Stops the engine (which publishes its final counters), prints and checks them.
fn print_counters(who: &str, engine: Option<XdpEngine>) -> Result<(), String> {
    let Some(mut engine) = engine else {
        return Ok(());
    };
    engine.stop();
    let c = engine.counters();
    println!("{who} engine counters: {c:#?}");
    if c.conns.fpdus_tx == 0 || c.conns.fpdus_rx == 0 || c.established == 0 {
        return Err(format!("{who}: engine counters show no traffic: {c:?}"));
    }
    Ok(())
}

/// The MULPDU both ends must use at `mtu` (RFC 5044 4.5: the TCP MSS less the timestamp
/// option and MPA's header and CRC).
fn mulpdu_at(mtu: u16) -> usize {
    usize::from(mtu) - 40 - 12 - 6
}

fn check_mulpdu(who: &str, qp: &datapath::QueuePair, mtu: Option<u16>) -> Result<(), String> {
    match mtu {
        Some(m) if qp.mulpdu() != mulpdu_at(m) => Err(format!(
            "{who}: MULPDU {} at MTU {m}, want {}",
            qp.mulpdu(),
            mulpdu_at(m)
        )),
        _ => Ok(()),
    }
}

/// The server: accepts (checking the client's private data), then checks each Write and Send.
fn server(kind: Kind, ready: std::sync::mpsc::Sender<()>, mtu: Option<u16>) -> Result<(), String> {
    let engine = match kind {
        Kind::Engine(dev) => Some(
            XdpEngine::start(dev, XdpEngineConfig::default())
                .map_err(|e| format!("server engine: {e}"))?,
        ),
        Kind::Socket => None,
    };
    let listener = match &engine {
        Some(e) => e.listen(PORT, params()),
        None => Listener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT)), params()),
    }
    .map_err(|e| format!("listen: {e}"))?;
    let _ = ready.send(());
    let req = listener
        .accept_timeout(WAIT)
        .map_err(|e| format!("accept: {e}"))?
        .ok_or("no connection request in time")?;
    if req.private_data() != b"hello from the client" {
        return Err(format!("request private data {:?}", req.private_data()));
    }
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let wbuf = pd.register(REGION, all).map_err(|e| e.to_string())?;
    let rbuf = pd.register(REGION, all).map_err(|e| e.to_string())?;
    let recv = pd.register(REGION, all).map_err(|e| e.to_string())?;
    for (i, &size) in SIZES.iter().enumerate() {
        rbuf.write(OFFSETS[i], &pattern(1000 + size, size));
    }
    let recvs = SIZES
        .iter()
        .enumerate()
        .map(|(i, &size)| RecvWr {
            wr_id: i as u64,
            sg_list: recv.sge(OFFSETS[i], size as u32).into(),
        })
        .collect();
    // The client learns our regions from the reply's private data.
    let mut welcome = Vec::new();
    for mr in [&wbuf, &rbuf] {
        welcome.extend_from_slice(&mr.stag().0.to_be_bytes());
        welcome.extend_from_slice(&mr.base_to().to_be_bytes());
    }
    let conn = req
        .accept_with_recvs(&pd, &cq, &welcome, recvs)
        .map_err(|e| format!("accept: {e}"))?;
    let qp = conn.qp;
    check_mulpdu("server", &qp, mtu)?;
    for (i, &size) in SIZES.iter().enumerate() {
        let c = cq
            .wait(WAIT)
            .ok_or_else(|| format!("no receive completion for size {size}: {:?}", qp.status()))?;
        if c.wc.status != WcStatus::Success
            || c.wc.opcode != WcOpcode::Recv
            || c.wc.wr_id != i as u64
            || c.wc.byte_len as usize != size
        {
            return Err(format!("size {size}: unexpected completion {c:?}"));
        }
        if bytes(&recv, OFFSETS[i], size) != pattern(2000 + size, size) {
            return Err(format!("size {size}: Send data differs"));
        }
        // The Send followed the Write on the same stream, so the Write is placed.
        if bytes(&wbuf, OFFSETS[i], size) != pattern(3000 + size, size) {
            return Err(format!("size {size}: Write data differs"));
        }
    }
    // The client disconnects once it has its own completions.
    if !qp.wait_finished(WAIT) {
        return Err(format!(
            "connection not closed by the client: {:?}",
            qp.status()
        ));
    }
    qp.disconnect();
    print_counters("server", engine)
}

fn client(kind: Kind, server: Ipv4Addr, mtu: Option<u16>) -> Result<(), String> {
    let engine = match kind {
        Kind::Engine(dev) => Some(
            XdpEngine::start(dev, XdpEngineConfig::default())
                .map_err(|e| format!("client engine: {e}"))?,
        ),
        Kind::Socket => None,
    };
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src = pd.register(REGION, all).map_err(|e| e.to_string())?;
    let dst = pd.register(REGION, all).map_err(|e| e.to_string())?;
    let send_src = pd.register(REGION, all).map_err(|e| e.to_string())?;
    let addr = SocketAddr::from((server, PORT));
    let hello = b"hello from the client";
    let conn = match &engine {
        Some(e) => e.connect(addr, &pd, &cq, &params(), hello),
        None => datapath::connect(addr, &pd, &cq, &params(), hello),
    }
    .map_err(|e| format!("connect: {e}"))?;
    let w = &conn.private_data;
    if w.len() != 24 {
        return Err(format!("reply private data of {} bytes", w.len()));
    }
    let stag = |o: usize| datapath::Stag(u32::from_be_bytes(w[o..o + 4].try_into().unwrap()));
    let to = |o: usize| u64::from_be_bytes(w[o + 4..o + 12].try_into().unwrap());
    let (wstag, wto, rstag, rto) = (stag(0), to(0), stag(12), to(12));
    let qp = conn.qp;
    check_mulpdu("client", &qp, mtu)?;
    for (i, &size) in SIZES.iter().enumerate() {
        let off = OFFSETS[i];
        src.write(off, &pattern(3000 + size, size));
        send_src.write(off, &pattern(2000 + size, size));
        let post = |wr_id: u64, op: SendOp, local: Sge| {
            qp.post_send(SendWr {
                wr_id,
                op,
                sg_list: local.into(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| format!("post: {e}"))
        };
        post(
            1,
            SendOp::Write {
                remote_stag: wstag,
                remote_to: wto + off as u64,
            },
            src.sge(off, size as u32),
        )?;
        post(
            2,
            SendOp::Read {
                remote_stag: rstag,
                remote_to: rto + off as u64,
            },
            dst.sge(off, size as u32),
        )?;
        post(
            3,
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            send_src.sge(off, size as u32),
        )?;
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let c = cq.wait(WAIT).ok_or_else(|| {
                format!(
                    "size {size}: completions so far {seen:?}; {:?}",
                    qp.status()
                )
            })?;
            if c.wc.status != WcStatus::Success {
                return Err(format!("size {size}: {c:?}; {:?}", qp.status()));
            }
            seen.push(c.wc.wr_id);
        }
        if bytes(&dst, off, size) != pattern(1000 + size, size) {
            return Err(format!("size {size}: Read data differs"));
        }
    }
    qp.disconnect();
    if !qp.status().finished {
        return Err(format!("disconnect did not finish: {:?}", qp.status()));
    }
    print_counters("client", engine)
}

/// Server in `iwa`, client in `iwb` (or the other way round), both veth ends at `mtu` if
/// given.
fn case(server_kind: Kind, client_kind: Kind, server_in_a: bool, mtu: Option<u16>) {
    let bed = bed_or_skip!();
    if let Some(m) = mtu {
        bed.set_mtu(u32::from(m)).expect("the bed's MTU");
    }
    let t = Instant::now();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (sns, cns, saddr) = if server_in_a {
        (NS_A, NS_B, ADDR_A)
    } else {
        (NS_B, NS_A, ADDR_B)
    };
    let srv = spawn_in_ns(sns, move || server(server_kind, ready_tx, mtu));
    if ready_rx.recv_timeout(WAIT).is_err() {
        let r = srv.join();
        panic!("server did not start: {r:?}");
    }
    let cli = spawn_in_ns(cns, move || client(client_kind, saddr, mtu));
    let c = cli.join().expect("client thread");
    let s = srv.join().expect("server thread");
    println!(
        "{server_kind:?} server, {client_kind:?} client: {:?}",
        t.elapsed()
    );
    c.unwrap_or_else(|e| panic!("client: {e}"));
    s.unwrap_or_else(|e| panic!("server: {e}"));
}

#[test]
fn engine_to_engine_write_read_send() {
    case(Kind::Engine(DEV_A), Kind::Engine(DEV_B), true, None);
}

#[test]
fn engine_to_engine_at_mtu_3500() {
    case(Kind::Engine(DEV_A), Kind::Engine(DEV_B), true, Some(3500));
}

#[test]
fn engine_server_socket_client_at_mtu_3500() {
    case(Kind::Engine(DEV_A), Kind::Socket, true, Some(3500));
}

#[test]
fn engine_server_socket_client() {
    case(Kind::Engine(DEV_A), Kind::Socket, true, None);
}

#[test]
fn socket_server_engine_client() {
    case(Kind::Socket, Kind::Engine(DEV_A), false, None);
}

/// An engine client connecting to a port nobody listens on (the kernel in `iwa` answers the
/// SYN with a reset) gets "connection refused", as a kernel socket would, not an MPA error:
/// tools retry on it while a server is still starting.
#[test]
fn connect_to_a_closed_port_is_refused() {
    let _bed = bed_or_skip!();
    let r = spawn_in_ns(NS_B, || {
        let mut engine = XdpEngine::start(DEV_B, XdpEngineConfig::default())
            .map_err(|e| format!("client engine: {e}"))?;
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let addr = SocketAddr::from((ADDR_A, PORT + 1));
        let r = engine.connect(addr, &pd, &cq, &params(), b"anyone?");
        engine.stop();
        Ok::<_, String>(r.map(|_| ()))
    })
    .join()
    .expect("client thread");
    match r {
        // rdma_cm reports it as REJECTED by its errno, as the kernel's refusal on the socket
        // transport (it was EIO: an error built from its kind alone carries no errno).
        Ok(Err(e))
            if matches!(&e, datapath::DatapathError::Io(io)
                if io.kind() == std::io::ErrorKind::ConnectionRefused) =>
        {
            assert_eq!(e.errno(), libc::ECONNREFUSED, "{e}");
        }
        other => panic!("want connection refused, got {other:?}"),
    }
}

/// A connect whose next hop does not answer ARP (the engine's kernel resolves it for up to
/// 3 s) stalls nothing else of the engine: another connect made on the same engine thread
/// while it waits is established at once, and the first fails as unresolved in its time.
#[test]
fn an_unresolvable_next_hop_stalls_no_other_connect() {
    let _bed = bed_or_skip!();
    const P: u16 = 19_626;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = spawn_in_ns(NS_A, move || -> Result<(), String> {
        let listener = Listener::bind(SocketAddr::from((ADDR_A, P)), params())
            .map_err(|e| format!("listen: {e}"))?;
        let _ = ready_tx.send(());
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| format!("accept: {e}"))?
            .ok_or("no connection request")?;
        let conn = req
            .accept(&ProtectionDomain::new(), &CompletionQueue::new(), &[])
            .map_err(|e| format!("accept: {e}"))?;
        conn.qp.disconnect();
        Ok(())
    });
    ready_rx.recv_timeout(WAIT).expect("server listening");
    let r = spawn_in_ns(NS_B, || -> Result<(), String> {
        // One engine thread: both connects are its commands.
        let one = XdpEngineConfig {
            shard_per_queue: false,
            ..XdpEngineConfig::default()
        };
        let mut engine = XdpEngine::start(DEV_B, one).map_err(|e| format!("client engine: {e}"))?;
        if engine.shards() != 1 {
            return Err(format!("{} engine threads", engine.shards()));
        }
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let result = std::thread::scope(|s| {
            // An address on the link that nobody holds: ARP goes unanswered.
            let nobody = SocketAddr::from((Ipv4Addr::new(10, 77, 0, 99), P));
            let started = Instant::now();
            let (e, pd1, cq1) = (&engine, &pd, &cq);
            let stuck = s.spawn(move || e.connect(nobody, pd1, cq1, &params(), b"anyone?"));
            // The first connect is resolving once iwb's kernel holds an entry for the address
            // (incomplete: its ARP request went out).
            let asked = |arp: String| arp.lines().any(|l| l.starts_with("10.77.0.99 "));
            while !std::fs::read_to_string("/proc/thread-self/net/arp").is_ok_and(asked) {
                if started.elapsed() > WAIT {
                    return Err("the first connect never asked for 10.77.0.99's address".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let t = Instant::now();
            let conn = engine
                .connect(SocketAddr::from((ADDR_A, P)), &pd, &cq, &params(), b"hi")
                .map_err(|e| format!("connect to the server: {e}"))?;
            let took = t.elapsed();
            conn.qp.disconnect();
            let stuck = stuck.join().map_err(|_| "the first connect panicked")?;
            let failed_after = started.elapsed();
            if took > Duration::from_millis(1500) {
                return Err(format!(
                    "the second connect took {took:?}: it waited for the first one's ARP"
                ));
            }
            match stuck {
                Err(e) if e.to_string().contains("resolve") => {}
                other => return Err(format!("the unresolvable connect: {:?}", other.map(|_| ()))),
            }
            if failed_after < Duration::from_secs(2) {
                return Err(format!(
                    "the unresolvable connect failed after {failed_after:?}"
                ));
            }
            Ok(())
        });
        engine.stop();
        result
    })
    .join()
    .expect("client thread");
    let served = server.join().expect("server thread");
    r.unwrap();
    served.unwrap();
}

/// `setup_timeout` bounds TCP's handshake and the MPA exchange on the engine too, though the
/// MPA timeout is longer: a peer that takes the TCP connection and never answers the Request
/// fails the connect at the setup deadline, ended by the engine (not left running there
/// after the caller stopped waiting, its receives reported flushed).
#[test]
fn the_setup_timeout_bounds_the_engine_connect() {
    let _bed = bed_or_skip!();
    const P: u16 = 19_627;
    let silent = in_ns(NS_A, || std::net::TcpListener::bind((ADDR_A, P))).expect("listen");
    let r = spawn_in_ns(NS_B, || -> Result<Duration, String> {
        let mut engine = XdpEngine::start(DEV_B, XdpEngineConfig::default())
            .map_err(|e| format!("client engine: {e}"))?;
        let p = ConnectParams {
            setup_timeout: Duration::from_secs(1),
            ..ConnectParams::default()
        };
        assert!(
            p.mpa.timeout >= Duration::from_secs(5),
            "the MPA timeout is the longer"
        );
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let t = Instant::now();
        let r = engine.connect(SocketAddr::from((ADDR_A, P)), &pd, &cq, &p, b"hello?");
        let took = t.elapsed();
        engine.stop();
        match r {
            Ok(_) => Err("a peer that never answers was connected".into()),
            Err(e) => {
                println!("connect failed after {took:?}: {e}");
                Ok(took)
            }
        }
    })
    .join()
    .expect("client thread");
    drop(silent);
    let took = r.unwrap();
    // Not sooner either: an error of another kind (refused, wrong interface) comes at once.
    assert!(
        (Duration::from_millis(900)..Duration::from_secs(3)).contains(&took),
        "the connect failed after {took:?}, not at its 1 s setup deadline"
    );
}

// ---------------------------------------------------------------------------------------------
// Shards: one engine thread per queue

/// Connections of the shard tests, and what each moves (a Write, a Read and a Send).
const SHARD_CONNS: usize = 8;
const SHARD_CHUNK: usize = 64 << 10;
const SHARD_PORT: u16 = PORT + 7;

fn shard_engine(dev: &str) -> Result<XdpEngine, String> {
    let cfg = XdpEngineConfig {
        shard_per_queue: true,
        ..XdpEngineConfig::default()
    };
    let e = XdpEngine::start(dev, cfg).map_err(|e| format!("engine on {dev}: {e}"))?;
    if e.shards() != QUEUES as usize {
        return Err(format!("{} shards on a {QUEUES}-queue bed", e.shards()));
    }
    Ok(e)
}

/// The server of the shard tests: accepts `SHARD_CONNS` connections on `listener`, then
/// checks each one's Write and Send (the client's index is its private data).
fn shard_server(listener: Listener) -> Result<(), String> {
    let pd = ProtectionDomain::new();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let size = SHARD_CONNS * SHARD_CHUNK;
    let (wbuf, rbuf, recv) = (
        pd.register(size, all).map_err(|e| e.to_string())?,
        pd.register(size, all).map_err(|e| e.to_string())?,
        pd.register(size, all).map_err(|e| e.to_string())?,
    );
    for i in 0..SHARD_CONNS {
        rbuf.write(i * SHARD_CHUNK, &pattern(100 + i, SHARD_CHUNK));
    }
    let mut conns = Vec::new();
    for n in 0..SHARD_CONNS {
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| format!("accept: {e}"))?
            .ok_or_else(|| format!("no connection request after {n}"))?;
        let i: usize = std::str::from_utf8(req.private_data())
            .ok()
            .and_then(|t| t.parse().ok())
            .filter(|&i| i < SHARD_CONNS)
            .ok_or_else(|| format!("private data {:?}", req.private_data()))?;
        let cq = CompletionQueue::new();
        let mut welcome = Vec::new();
        for mr in [&wbuf, &rbuf] {
            welcome.extend_from_slice(&mr.stag().0.to_be_bytes());
            welcome.extend_from_slice(&mr.base_to().to_be_bytes());
        }
        let recvs = vec![RecvWr {
            wr_id: i as u64,
            sg_list: recv.sge(i * SHARD_CHUNK, SHARD_CHUNK as u32).into(),
        }];
        let conn = req
            .accept_with_recvs(&pd, &cq, &welcome, recvs)
            .map_err(|e| format!("accept {i}: {e}"))?;
        conns.push((i, conn.qp, cq));
    }
    for (i, qp, cq) in conns {
        let c = cq
            .wait(WAIT)
            .ok_or_else(|| format!("server {i}: no receive completion: {:?}", qp.status()))?;
        if c.wc.status != WcStatus::Success || c.wc.byte_len as usize != SHARD_CHUNK {
            return Err(format!("server {i}: {c:?}"));
        }
        let off = i * SHARD_CHUNK;
        if bytes(&recv, off, SHARD_CHUNK) != pattern(300 + i, SHARD_CHUNK) {
            return Err(format!("server {i}: Send data differs"));
        }
        if bytes(&wbuf, off, SHARD_CHUNK) != pattern(200 + i, SHARD_CHUNK) {
            return Err(format!("server {i}: Write data differs"));
        }
        if !qp.wait_finished(WAIT) {
            return Err(format!("server {i}: not closed: {:?}", qp.status()));
        }
        qp.disconnect();
    }
    Ok(())
}

/// The client of the shard tests: `SHARD_CONNS` connections open at once, each a Write, a
/// Read and a Send, the Read checked.
fn shard_clients(
    connect: &dyn Fn(
        usize,
        &ProtectionDomain,
        &CompletionQueue,
    ) -> Result<datapath::Connection, String>,
) -> Result<(), String> {
    let pd = ProtectionDomain::new();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let size = SHARD_CONNS * SHARD_CHUNK;
    let (src, dst, send_src) = (
        pd.register(size, all).map_err(|e| e.to_string())?,
        pd.register(size, all).map_err(|e| e.to_string())?,
        pd.register(size, all).map_err(|e| e.to_string())?,
    );
    let mut conns = Vec::new();
    for i in 0..SHARD_CONNS {
        let off = i * SHARD_CHUNK;
        src.write(off, &pattern(200 + i, SHARD_CHUNK));
        send_src.write(off, &pattern(300 + i, SHARD_CHUNK));
        let cq = CompletionQueue::new();
        let conn = connect(i, &pd, &cq)?;
        conns.push((i, conn, cq));
    }
    for (i, conn, _) in &conns {
        let off = i * SHARD_CHUNK;
        let w = &conn.private_data;
        if w.len() != 24 {
            return Err(format!(
                "client {i}: reply private data of {} bytes",
                w.len()
            ));
        }
        let stag = |o: usize| datapath::Stag(u32::from_be_bytes(w[o..o + 4].try_into().unwrap()));
        let to = |o: usize| u64::from_be_bytes(w[o + 4..o + 12].try_into().unwrap());
        let len = SHARD_CHUNK as u32;
        let wrs = [
            (
                SendOp::Write {
                    remote_stag: stag(0),
                    remote_to: to(0) + off as u64,
                },
                src.sge(off, len),
            ),
            (
                SendOp::Read {
                    remote_stag: stag(12),
                    remote_to: to(12) + off as u64,
                },
                dst.sge(off, len),
            ),
            (
                SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                send_src.sge(off, len),
            ),
        ];
        for (k, (op, local)) in wrs.into_iter().enumerate() {
            conn.qp
                .post_send(SendWr {
                    wr_id: k as u64,
                    op,
                    sg_list: local.into(),
                    signaled: true,
                    fence: false,
                })
                .map_err(|e| format!("client {i}: post: {e}"))?;
        }
    }
    for (i, conn, cq) in conns {
        for _ in 0..3 {
            let c = cq.wait(WAIT).ok_or_else(|| {
                format!("client {i}: completions missing: {:?}", conn.qp.status())
            })?;
            if c.wc.status != WcStatus::Success {
                return Err(format!("client {i}: {c:?}"));
            }
        }
        if bytes(&dst, i * SHARD_CHUNK, SHARD_CHUNK) != pattern(100 + i, SHARD_CHUNK) {
            return Err(format!("client {i}: Read data differs"));
        }
        conn.qp.disconnect();
    }
    Ok(())
}

/// Stops a sharded engine and prints and returns its counters.
fn shard_counters(who: &str, mut engine: XdpEngine) -> datapath::engine::EngineCounters {
    engine.stop();
    let c = engine.counters();
    for (k, d) in c.shard_drivers.iter().enumerate() {
        println!(
            "{who} shard {k}: {} frames in, {} out, {} handed off, {} taken over, {} dropped, \
             {} passive opens",
            d.rx_frames,
            d.tx_packets,
            d.handoffs_out,
            d.handoffs_in,
            d.handoff_drops,
            d.table.passive_opens
        );
    }
    c
}

/// A sharded engine (one thread per queue of `iwa0`) opens `SHARD_CONNS` connections to
/// kernel TCP (the socket transport in `iwb`): `connect` spreads them over the shards, and the
/// kernel's accepted sockets answer on a queue of their own random choice, so most
/// connections' segments arrive on a shard that does not own them and are handed over. Every
/// byte checked both ways; hand-offs counted; every shard carried connections.
#[test]
fn shards_engine_clients_kernel_server() {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let srv = spawn_in_ns(NS_B, move || {
        let l = Listener::bind(
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, SHARD_PORT)),
            params(),
        )
        .map_err(|e| format!("listen: {e}"))?;
        let _ = ready_tx.send(());
        shard_server(l)
    });
    ready_rx.recv_timeout(WAIT).expect("server up");
    let cli = spawn_in_ns(NS_A, || {
        let engine = shard_engine(DEV_A)?;
        let addr = SocketAddr::from((ADDR_B, SHARD_PORT));
        let r = shard_clients(&|i, pd, cq| {
            engine
                .connect(addr, pd, cq, &params(), i.to_string().as_bytes())
                .map_err(|e| format!("connect {i}: {e}"))
        });
        Ok::<_, String>((r, shard_counters("client", engine)))
    });
    let (r, c) = cli.join().expect("client thread").expect("client engine");
    srv.join()
        .expect("server thread")
        .unwrap_or_else(|e| panic!("server: {e}"));
    r.unwrap_or_else(|e| panic!("client: {e}"));
    assert_eq!(c.shards, QUEUES as usize);
    assert_eq!(c.established, SHARD_CONNS as u64, "{c:?}");
    assert!(c.driver.handoffs_in > 0, "no hand-off: {c:#?}");
    assert!(
        c.shard_drivers.iter().all(|d| d.tx_packets > 0),
        "a shard carried no connection: {c:#?}"
    );
}

/// Kernel TCP clients (the socket transport in `iwb`) connect `SHARD_CONNS` times to a sharded
/// engine: each connection belongs to the shard its SYN arrived on (the client's random TX
/// queue), so more than one shard accepts, and the one `Listener` gets them all. Every byte
/// checked both ways.
#[test]
fn shards_kernel_clients_engine_server() {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let srv = spawn_in_ns(NS_A, move || {
        let engine = shard_engine(DEV_A)?;
        let l = engine
            .listen(SHARD_PORT, params())
            .map_err(|e| format!("listen: {e}"))?;
        let _ = ready_tx.send(());
        let r = shard_server(l);
        Ok::<_, String>((r, shard_counters("server", engine)))
    });
    ready_rx.recv_timeout(WAIT).expect("server up");
    let cli = spawn_in_ns(NS_B, || {
        let addr = SocketAddr::from((ADDR_A, SHARD_PORT));
        shard_clients(&|i, pd, cq| {
            datapath::connect(addr, pd, cq, &params(), i.to_string().as_bytes())
                .map_err(|e| format!("connect {i}: {e}"))
        })
    });
    let c_res = cli.join().expect("client thread");
    let (r, c) = srv.join().expect("server thread").expect("server engine");
    c_res.unwrap_or_else(|e| panic!("client: {e}"));
    r.unwrap_or_else(|e| panic!("server: {e}"));
    assert_eq!(c.established, SHARD_CONNS as u64, "{c:?}");
    let accepting = c
        .shard_drivers
        .iter()
        .filter(|d| d.table.passive_opens > 0)
        .count();
    // All 8 on one queue has odds 4^-7.
    assert!(accepting >= 2, "one shard accepted everything: {c:#?}");
}

// ---------------------------------------------------------------------------------------------
// Posts racing the end of a connection

/// Posts from another thread race the peer's close on an engine's queue pair: every post that
/// returned `Ok` completes exactly once (flushed if the connection ended first), posts after the
/// end included (refused with `Disconnected`, or flushed at once in Error). 10 connections
/// from an engine in `iwa` to the socket transport in `iwb`, each closed by the server at a
/// different point of the stream of posts.
#[test]
fn engine_posts_racing_the_peer_s_close_all_complete() {
    const ROUNDS: u64 = 10;
    let _bed = bed_or_skip!();
    let port = PORT + 30;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = spawn_in_ns(NS_B, move || -> Result<(), String> {
        let listener = Listener::bind(SocketAddr::from((ADDR_B, port)), params())
            .map_err(|e| format!("listen: {e}"))?;
        let _ = ready_tx.send(());
        for round in 0..ROUNDS {
            let req = listener
                .accept_timeout(WAIT)
                .map_err(|e| format!("accept: {e}"))?
                .ok_or_else(|| format!("round {round}: no connection request"))?;
            let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
            let conn = req
                .accept(&pd, &cq, &[])
                .map_err(|e| format!("round {round}: accept: {e}"))?;
            std::thread::sleep(Duration::from_micros(500 * round));
            drop(conn);
        }
        Ok(())
    });
    ready_rx.recv_timeout(WAIT).expect("server not listening");
    let mut engine = common::bed::start_engine(NS_A, DEV_A);
    for round in 0..ROUNDS {
        let side = common::Side::with_cqe(common::DEEP_CQE);
        let (pd, cq) = (side.pd, side.cq);
        // A receive queue deep enough that the posts race the end rather than fill it.
        let deep = ConnectParams {
            rq_depth: common::DEEP_RQ,
            ..params()
        };
        let c = engine
            .connect(SocketAddr::from((ADDR_B, port)), &pd, &cq, &deep, &[])
            .unwrap_or_else(|e| panic!("round {round}: connect: {e}"));
        let what = format!("round {round}");
        let accepted = std::thread::scope(|scope| {
            scope
                .spawn(|| common::post_recvs_until_the_end(&c.qp, &what))
                .join()
                .expect("the posting thread panicked")
        });
        // Refused from the moment the engine stops taking work, just before it publishes the
        // end, or flushed at once after it.
        assert!(
            c.qp.wait_finished(WAIT),
            "{what}: the posts ended, and the queue pair did not"
        );
        common::each_completed_once(&cq, accepted, &what);
        println!("round {round}: {accepted} posts accepted, each completed once");
    }
    server
        .join()
        .expect("server thread")
        .unwrap_or_else(|e| panic!("server: {e}"));
    engine.stop();
}

/// The engine lets go of a protection domain's registration table once no connection of the
/// domain is left: a server that gives each client a domain of its own (the advice for peers
/// it does not trust) does not make every engine turn look at every domain it ever served,
/// nor keep their tables. Five connections one after the other, each accepted with a fresh
/// domain: after each ends, only the test's own handles on its domain remain. (Before, the
/// engine kept every domain's table for its whole life.)
#[test]
fn the_engine_lets_go_of_a_protection_domain_no_connection_uses() {
    let _bed = bed_or_skip!();
    let engine = common::bed::start_engine(NS_A, DEV_A);
    let listener = engine.listen(0, common::bed::params()).expect("listen");
    let port = listener.local_addr().expect("address").port();
    let client = common::Side::new();
    for round in 0..5 {
        let server = common::Side::new();
        let before = server.pd.table_holders();
        let (c, s) =
            common::bed::socket_client_to_engine(&listener, port, &client, &server, Vec::new());
        c.qp.disconnect();
        assert!(s.qp.wait_finished(common::WAIT), "round {round}: no end");
        drop((c, s));
        let deadline = Instant::now() + common::WAIT;
        while server.pd.table_holders() > before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            server.pd.table_holders(),
            before,
            "round {round}: the engine still holds the domain's table"
        );
    }
}

/// A peer in `iwb` (kernel TCP, raw MPA) on `port` that accepts one connection, answers its
/// MPA Request and reads to our FIN; then, with `closes`, closes its side (our connection
/// goes to TIME-WAIT), or else holds it open (ours stays in FIN-WAIT-2) until `release` says.
/// Says on `seen_fin` when it has read our FIN (and closed, with `closes`).
fn closing_peer(
    port: u16,
    closes: bool,
    seen_fin: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
) -> std::thread::JoinHandle<Result<(), String>> {
    use std::io::{Read, Write};
    let listener = in_ns(NS_B, || std::net::TcpListener::bind((ADDR_B, port))).expect("bind");
    std::thread::spawn(move || {
        let mut s = common::accept_within(&listener, WAIT).map_err(|e| e.to_string())?;
        let mut responder = common::read_mpa_request(&mut s)?;
        let (reply, _) = responder.accept(b"").map_err(|e| e.to_string())?;
        s.write_all(&reply).map_err(|e| e.to_string())?;
        let mut sink = [0u8; 4096];
        while s.read(&mut sink).map_err(|e| e.to_string())? > 0 {}
        if closes {
            drop(s);
            let _ = seen_fin.send(());
        } else {
            let _ = seen_fin.send(());
            let _ = release.recv_timeout(WAIT);
        }
        Ok(())
    })
}

/// Whether the peer's namespace holds no TCP socket on `port` but its listener
/// (`/proc/thread-self/net/tcp`: no connection, not even one waiting for the ACK of its FIN).
fn peer_socket_gone(port: u16) -> bool {
    let table = in_ns(NS_B, || {
        std::fs::read_to_string("/proc/thread-self/net/tcp")
    })
    .expect("read the peer's TCP table");
    !table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local_port = fields
            .get(1)
            .and_then(|local| local.rsplit(':').next())
            .and_then(|hex| u16::from_str_radix(hex, 16).ok());
        // State 0A is LISTEN.
        local_port == Some(port) && fields.get(3) != Some(&"0A")
    })
}

/// A stopping engine gives its connections up to a second to close, but no longer than their
/// closing exchange takes: a connection in TIME-WAIT (ours closed first, the peer's FIN
/// taken) no longer holds the stop, where it once held the end of every tool run whose engine
/// closed first for that second; one whose peer never closes its side (FIN-WAIT-2) still
/// gets the whole second.
#[test]
fn a_stopping_engine_waits_only_for_closes_not_yet_done() {
    let _bed = bed_or_skip!();
    for (port, closes) in [(19_691, true), (19_692, false)] {
        let (fin_tx, fin_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        let peer = closing_peer(port, closes, fin_tx, release_rx);
        let took = in_ns(NS_A, move || {
            let engine =
                XdpEngine::start(DEV_A, XdpEngineConfig::default()).expect("the engine on iwa0");
            let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
            let conn = engine
                .connect(SocketAddr::from((ADDR_B, port)), &pd, &cq, &params(), b"")
                .expect("connect");
            conn.qp.disconnect();
            assert!(conn.qp.status().finished, "{:?}", conn.qp.status());
            fin_rx
                .recv_timeout(WAIT)
                .expect("the peer never saw our FIN");
            if closes {
                // The peer's socket is gone once our engine has acknowledged its FIN: our
                // side is then in TIME-WAIT.
                let deadline = Instant::now() + WAIT;
                while !peer_socket_gone(port) {
                    assert!(
                        Instant::now() < deadline,
                        "our engine never took the peer's FIN"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            drop(conn);
            let started = Instant::now();
            drop(engine);
            started.elapsed()
        });
        let _ = release_tx.send(());
        peer.join().expect("the peer's thread").expect("the peer");
        println!("peer closes {closes}: the engine stopped in {took:?}");
        if closes {
            assert!(took < Duration::from_millis(700), "stop took {took:?}");
        } else {
            assert!(
                took >= Duration::from_millis(900),
                "stop took only {took:?}"
            );
        }
    }
}
