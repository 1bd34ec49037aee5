//! IFT framing (draft-williams-iwarp-ift-01) on the AF_XDP engine, on the veth test bed
//! (`scripts/netns.sh`): engine to engine, engine server with a socket-transport client, and
//! socket-transport server with an engine client. In each, one connection per choice of header
//! and payload CRCs (the four where both ends choose alike, and two where they differ) moves an
//! RDMA Write, a Send and an RDMA Read of every size from 1 octet to 16 MiB (both sides of the
//! MULPDU among them), checked byte for byte, with the octets after each untouched. IFT carries
//! no private data, so the server hands the client its regions' STags inside the test process.
//!
//! Needs root. Without root (or without the bed) each test prints `SKIPPED: <why>` and passes,
//! except under `CI=true`, where it fails with the reason. Tests serialise with every other
//! test-bed user on `/run/lock/iwarp-netns.lock`, bring the bed up fresh and take it down.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    Access, Agreed, CompletionQueue, ConnectParams, Framing, Listener, MemoryRegion,
    ProtectionDomain, RecvWr, SendOp, SendWr, Stag, WcOpcode, WcStatus,
};
use ift::IftConfig;
use testbed::*;

const WAIT: Duration = Duration::from_secs(30);
const PORT: u16 = 19_615;
const SENTINEL: u8 = 0xEE;
const TAIL: usize = 64;

/// (client HC, PC), (server HC, PC) of each connection.
const CASES: [((bool, bool), (bool, bool)); 6] = [
    ((false, false), (false, false)),
    ((true, false), (true, false)),
    ((false, true), (false, true)),
    ((true, true), (true, true)),
    ((true, false), (false, true)),
    ((false, false), (true, true)),
];

#[derive(Clone, Copy, Debug)]
enum Kind {
    Engine(&'static str),
    Socket,
}

fn ift_params(header_crc: bool, payload_crc: bool) -> ConnectParams {
    ConnectParams {
        framing: Framing::Ift(IftConfig {
            header_crc,
            payload_crc,
            // Replaced by a fresh random one per connection.
            ..IftConfig::with_vtag(0)
        }),
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    }
}

/// The sizes moved on a connection whose MULPDU is `m`: tiny ones, both sides of the largest
/// payload one tagged (m - 14) and one untagged (m - 18) frame carries, and 64 KiB to 16 MiB.
fn sizes(m: usize) -> Vec<usize> {
    let mut v = vec![1, 2, 100];
    v.extend([m - 19, m - 18, m - 17, m - 15, m - 14, m - 13, m, m + 1]);
    v.extend([65_536, 1 << 20, 16 << 20]);
    v
}

/// The largest size of [`sizes`], and room for it with the sentinel after it.
const MAX: usize = 16 << 20;
const REGION: usize = MAX + TAIL;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (i as u64 ^ seed.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            (x >> 56) as u8
        })
        .collect()
}

fn bytes(mr: &MemoryRegion, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v);
    v
}

fn ift_of(agreed: &Agreed) -> Result<ift::Negotiated, String> {
    match agreed {
        Agreed::Ift { negotiated, .. } => Ok(*negotiated),
        other => Err(format!("not an IFT connection: {other:?}")),
    }
}

fn start_engine(kind: Kind, who: &str) -> Result<Option<XdpEngine>, String> {
    match kind {
        Kind::Engine(dev) => XdpEngine::start(dev, XdpEngineConfig::default())
            .map(Some)
            .map_err(|e| format!("{who} engine: {e}")),
        Kind::Socket => Ok(None),
    }
}

/// What the server tells the client of each connection: its Write target and Read source
/// (STag, TO).
struct Regions {
    target: (Stag, u64),
    source: (Stag, u64),
}

/// How many sizes [`sizes`] gives (at any MULPDU): the server posts a receive for each.
fn size_count() -> usize {
    sizes(1500).len()
}

/// The server: a listener per case (its own CRC choice), each connection accepted with a
/// receive per size posted; checks what each connection agreed, every Send it receives and
/// the Write before it. Before each size it puts a sentinel after where the data will end
/// and tells the client to go on.
fn server(
    kind: Kind,
    ready: mpsc::Sender<()>,
    regions: mpsc::Sender<Regions>,
    mulpdus: mpsc::Receiver<usize>,
    go: mpsc::Sender<()>,
) -> Result<(), String> {
    let engine = start_engine(kind, "server")?;
    let mut listeners = Vec::new();
    for (k, (_, (hc, pc))) in CASES.iter().enumerate() {
        let port = PORT + k as u16;
        let params = ift_params(*hc, *pc);
        let l = match &engine {
            Some(e) => e.listen(port, params),
            None => Listener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)), params),
        }
        .map_err(|e| format!("listen on {port}: {e}"))?;
        listeners.push(l);
    }
    let _ = ready.send(());
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let reg = |access| pd.register(REGION, access).map_err(|e| e.to_string());
    let target = reg(Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let source = reg(Access::REMOTE_READ)?;
    let recv = reg(Access::LOCAL_WRITE)?;
    source.write(0, &pattern(7, MAX));
    let prepare = |size: usize| {
        recv.write(size, &[SENTINEL; TAIL]);
        target.write(size, &[SENTINEL; TAIL]);
    };
    for (k, (client, server)) in CASES.iter().enumerate() {
        let what = format!("case {k} (client {client:?}, server {server:?})");
        let req = listeners[k]
            .accept_timeout(WAIT)
            .map_err(|e| format!("{what}: accept: {e}"))?
            .ok_or(format!("{what}: no connection request in time"))?;
        if req.info().is_some() || !req.private_data().is_empty() {
            return Err(format!("{what}: an IFT request with MPA information"));
        }
        let recvs = (0..size_count())
            .map(|i| RecvWr {
                wr_id: i as u64,
                sg_list: recv.sge(0, MAX as u32).into(),
            })
            .collect::<Vec<_>>();
        let conn = req
            .accept_with_recvs(&pd, &cq, &[], recvs)
            .map_err(|e| format!("{what}: accept: {e}"))?;
        let qp = conn.qp;
        let agreed = ift_of(qp.agreed()).map_err(|e| format!("{what}: {e}"))?;
        if (agreed.tx.header_crc, agreed.tx.payload_crc) != *server
            || (agreed.rx.header_crc, agreed.rx.payload_crc) != *client
            || !agreed.rx.verify
        {
            return Err(format!("{what}: server agreed {agreed:?}"));
        }
        regions
            .send(Regions {
                target: (target.stag(), target.base_to()),
                source: (source.stag(), source.base_to()),
            })
            .map_err(|_| "the client is gone")?;
        let m = mulpdus
            .recv_timeout(WAIT)
            .map_err(|_| format!("{what}: no MULPDU from the client"))?;
        let list = sizes(m);
        prepare(list[0]);
        go.send(()).map_err(|_| "the client is gone")?;
        for (i, &size) in list.iter().enumerate() {
            let c = cq.wait(WAIT).ok_or_else(|| {
                format!("{what}: no receive for {size} octets: {:?}", qp.status())
            })?;
            if c.wc.status != WcStatus::Success
                || c.wc.opcode != WcOpcode::Recv
                || c.wc.wr_id != i as u64
                || c.wc.byte_len as usize != size
            {
                return Err(format!("{what}: size {size}: unexpected completion {c:?}"));
            }
            let sent = [&pattern(2000 + size as u64, size)[..], &[SENTINEL; TAIL]].concat();
            if bytes(&recv, 0, size + TAIL) != sent {
                return Err(format!("{what}: size {size}: Send data differs"));
            }
            // The Send followed the Write on the same stream: the Write is placed.
            let written = [&pattern(3000 + size as u64, size)[..], &[SENTINEL; TAIL]].concat();
            if bytes(&target, 0, size + TAIL) != written {
                return Err(format!("{what}: size {size}: Write data differs"));
            }
            if let Some(&next) = list.get(i + 1) {
                prepare(next);
            }
            go.send(()).map_err(|_| "the client is gone")?;
        }
        if !qp.wait_finished(WAIT) {
            return Err(format!(
                "{what}: not closed by the client: {:?}",
                qp.status()
            ));
        }
        qp.disconnect();
    }
    print_counters("server", engine)
}

/// The client: one connection per case, every size as Write, Send and Read, all checked.
fn client(
    kind: Kind,
    server: Ipv4Addr,
    regions: mpsc::Receiver<Regions>,
    mulpdus: mpsc::Sender<usize>,
    go: mpsc::Receiver<()>,
) -> Result<(), String> {
    let engine = start_engine(kind, "client")?;
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let reg = |access| pd.register(REGION, access).map_err(|e| e.to_string());
    let src = reg(Access::NONE)?;
    let send_src = reg(Access::NONE)?;
    let sink = reg(Access::LOCAL_WRITE)?;
    let source_data = pattern(7, MAX);
    let wait_go = |what: &str| {
        go.recv_timeout(WAIT)
            .map_err(|_| format!("{what}: the server did not go on"))
    };
    for (k, (client, server_crcs)) in CASES.iter().enumerate() {
        let what = format!("case {k} (client {client:?}, server {server_crcs:?})");
        let addr = SocketAddr::from((server, PORT + k as u16));
        let params = ift_params(client.0, client.1);
        let conn = match &engine {
            Some(e) => e.connect(addr, &pd, &cq, &params, &[]),
            None => datapath::connect(addr, &pd, &cq, &params, &[]),
        }
        .map_err(|e| format!("{what}: connect: {e}"))?;
        let qp = conn.qp;
        let agreed = ift_of(qp.agreed()).map_err(|e| format!("{what}: {e}"))?;
        if (agreed.tx.header_crc, agreed.tx.payload_crc) != *client
            || (agreed.rx.header_crc, agreed.rx.payload_crc) != *server_crcs
        {
            return Err(format!("{what}: client agreed {agreed:?}"));
        }
        let r = regions
            .recv_timeout(WAIT)
            .map_err(|_| format!("{what}: no regions from the server"))?;
        let m = qp.mulpdu();
        mulpdus.send(m).map_err(|_| "the server is gone")?;
        for size in sizes(m) {
            wait_go(&what)?;
            let s = size as u32;
            src.write(0, &pattern(3000 + size as u64, size));
            send_src.write(0, &pattern(2000 + size as u64, size));
            sink.write(0, &vec![SENTINEL; size + TAIL]);
            let post = |wr_id: u64, op: SendOp, sge: datapath::Sge| {
                qp.post_send(SendWr {
                    wr_id,
                    op,
                    sg_list: sge.into(),
                    signaled: true,
                    fence: false,
                })
                .map_err(|e| format!("{what}: post: {e}"))
            };
            post(
                1,
                SendOp::Write {
                    remote_stag: r.target.0,
                    remote_to: r.target.1,
                },
                src.sge(0, s),
            )?;
            post(
                2,
                SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                send_src.sge(0, s),
            )?;
            post(
                3,
                SendOp::Read {
                    remote_stag: r.source.0,
                    remote_to: r.source.1,
                },
                sink.sge(0, s),
            )?;
            let mut seen = Vec::new();
            while seen.len() < 3 {
                let c = cq.wait(WAIT).ok_or_else(|| {
                    format!(
                        "{what}: size {size}: completions {seen:?}: {:?}",
                        qp.status()
                    )
                })?;
                if c.wc.status != WcStatus::Success || c.wc.byte_len as usize != size {
                    return Err(format!("{what}: size {size}: {c:?}; {:?}", qp.status()));
                }
                seen.push(c.wc.wr_id);
            }
            seen.sort_unstable();
            if seen != [1, 2, 3] {
                return Err(format!("{what}: size {size}: completions {seen:?}"));
            }
            let read = [&source_data[..size], &[SENTINEL; TAIL]].concat();
            if bytes(&sink, 0, size + TAIL) != read {
                return Err(format!("{what}: size {size}: Read data differs"));
            }
        }
        // The server has checked the last Send.
        wait_go(&what)?;
        qp.disconnect();
        if !qp.status().finished {
            return Err(format!(
                "{what}: disconnect did not finish: {:?}",
                qp.status()
            ));
        }
    }
    print_counters("client", engine)
}

/// Stops the engine (which publishes its final counters), prints and checks them.
fn print_counters(who: &str, engine: Option<XdpEngine>) -> Result<(), String> {
    let Some(mut engine) = engine else {
        return Ok(());
    };
    engine.stop();
    let c = engine.counters();
    println!("{who} engine counters: {c:#?}");
    if c.conns.fpdus_tx == 0 || c.conns.fpdus_rx == 0 || (c.established as usize) < CASES.len() {
        return Err(format!("{who}: engine counters show no IFT traffic: {c:?}"));
    }
    if c.conns.crc_errors != 0 || c.conns.terminates_sent != 0 {
        return Err(format!("{who}: errors on a clean link: {c:?}"));
    }
    Ok(())
}

/// Server in `iwa`, client in `iwb` (or the other way round).
fn case(server_kind: Kind, client_kind: Kind, server_in_a: bool) {
    let _bed = bed_or_skip!();
    let t = Instant::now();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (regions_tx, regions_rx) = mpsc::channel();
    let (mulpdu_tx, mulpdu_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let (sns, cns, saddr) = if server_in_a {
        (NS_A, NS_B, ADDR_A)
    } else {
        (NS_B, NS_A, ADDR_B)
    };
    let srv = spawn_in_ns(sns, move || {
        server(server_kind, ready_tx, regions_tx, mulpdu_rx, go_tx)
    });
    if ready_rx.recv_timeout(WAIT).is_err() {
        let r = srv.join();
        panic!("server did not start: {r:?}");
    }
    let cli = spawn_in_ns(cns, move || {
        client(client_kind, saddr, regions_rx, mulpdu_tx, go_rx)
    });
    let c = cli.join().expect("client thread");
    let s = srv.join().expect("server thread");
    println!(
        "IFT: {server_kind:?} server, {client_kind:?} client: {:?}",
        t.elapsed()
    );
    c.unwrap_or_else(|e| panic!("client: {e}"));
    s.unwrap_or_else(|e| panic!("server: {e}"));
}

#[test]
fn ift_engine_to_engine_every_crc_choice_every_size() {
    case(Kind::Engine(DEV_A), Kind::Engine(DEV_B), true);
}

#[test]
fn ift_engine_server_socket_client_every_crc_choice_every_size() {
    case(Kind::Engine(DEV_A), Kind::Socket, true);
}

#[test]
fn ift_socket_server_engine_client_every_crc_choice_every_size() {
    case(Kind::Socket, Kind::Engine(DEV_A), false);
}

/// IFT's DDP mode (R clear) has no queue pair to run: the engine's listen and connect refuse
/// it before anything is made, as the socket transport's do (`api_limits`). (The engine took
/// it and ran RDMAP over a framing both ends had agreed was not RDMA.)
#[test]
fn the_engine_refuses_ift_without_rdma_mode() {
    let _bed = bed_or_skip!();
    let refused = in_ns(NS_A, || {
        let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default()).expect("engine");
        let params = ConnectParams {
            framing: Framing::Ift(IftConfig {
                rdma: false,
                ..IftConfig::with_vtag(1)
            }),
            ..ConnectParams::default()
        };
        let listen = engine.listen(19_624, params.clone()).err();
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        let addr = SocketAddr::from((ADDR_B, 19_625));
        let connect = engine.connect(addr, &pd, &cq, &params, &[]).err();
        (listen, connect)
    });
    for e in [refused.0, refused.1] {
        assert!(
            matches!(e, Some(datapath::DatapathError::InvalidArgument(_))),
            "{e:?}"
        );
    }
}
