//! A shared receive queue (verbs' SRQ): eight queue pairs of one protection domain take their
//! receive buffers from one queue, each Send lands in whichever buffer is next, and the low
//! watermark fires once when the posted buffers run low.
//!
//! * `eight_qps_share_one_srq_over_sockets`: socket transport on loopback.
//! * `eight_qps_share_one_srq_on_the_engine`: the AF_XDP engine as the server on the veth bed,
//!   socket-transport clients (root; `SKIPPED` without the bed, a failure under `CI=true`).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, DatapathError, Listener, ProtectionDomain, RecvWr,
    SendOp, SendWr, SharedReceiveQueue, WcOpcode, WcStatus,
};
use testbed::*;

const QPS: usize = 8;
/// Sends per client.
const SENDS: usize = 8;
const BUF: usize = 4096;
/// Buffers posted: more than the Sends, so none is refused; the limit is crossed on the way.
const POSTED: usize = QPS * SENDS + 8;
const LIMIT: usize = 16;
const WAIT: Duration = Duration::from_secs(30);
const PORT: u16 = 19_533;

fn params(srq: Option<SharedReceiveQueue>) -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(10),
        srq,
        ..ConnectParams::default()
    }
}

/// The message client `c` sends as its Send `i`: its numbers, then a pattern.
fn message(c: usize, i: usize) -> Vec<u8> {
    let mut m = vec![c as u8, i as u8];
    m.extend((0..BUF - 2 - c * 100 - i).map(|k| (k * 31 + c * 7 + i) as u8));
    m
}

/// The server: one PD, one CQ, one SRQ for all its connections; checks every Send.
fn server(listener: Listener, ready: mpsc::Sender<()>) -> Result<(), String> {
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let srq = SharedReceiveQueue::new(&pd, POSTED).map_err(|e| e.to_string())?;
    let recv = pd
        .register_buffer(vec![0u8; POSTED * BUF], Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    for b in 0..POSTED {
        srq.post_recv(RecvWr {
            wr_id: b as u64,
            sg_list: recv.sge(b * BUF, BUF as u32).into(),
        })
        .map_err(|e| e.to_string())?;
    }
    // A full queue refuses more; an element of another PD is refused when posted.
    if !matches!(
        srq.post_recv(RecvWr {
            wr_id: 999,
            sg_list: recv.sge(0, 1).into(),
        }),
        Err(DatapathError::RecvQueueFull { depth: POSTED })
    ) {
        return Err("a full SRQ took another receive".into());
    }
    // ibv_modify_srq's EINVAL: a limit above the queue's capacity.
    if !matches!(
        srq.arm_limit(srq.capacity() + 1),
        Err(DatapathError::InvalidArgument(_))
    ) || srq.limit() != 0
    {
        return Err("a limit above the capacity was armed".into());
    }
    srq.arm_limit(LIMIT)
        .map_err(|e| format!("arm_limit: {e}"))?;
    if srq.limit() != LIMIT {
        return Err(format!("armed limit reads {}", srq.limit()));
    }
    let _ = ready.send(());
    let mut qps = Vec::new();
    for _ in 0..QPS {
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| format!("accept: {e}"))?
            .ok_or("no connection request in time")?;
        let conn = req
            .use_srq(&srq)
            .accept(&pd, &cq, &[])
            .map_err(|e| format!("accept: {e}"))?;
        qps.push(conn.qp);
    }
    // Every Send lands in a distinct buffer; each client's Sends arrive in its order.
    let mut used = HashSet::new();
    let mut next = [0usize; QPS];
    let nums: Vec<u32> = qps.iter().map(|q| q.num()).collect();
    for _ in 0..QPS * SENDS {
        let c = cq
            .wait(WAIT)
            .ok_or_else(|| format!("receive completions stopped; SRQ {srq:?}"))?;
        if c.wc.status != WcStatus::Success || c.wc.opcode != WcOpcode::Recv {
            return Err(format!("{c:?}"));
        }
        if !nums.contains(&c.qp_num) {
            return Err(format!("completion of an unknown QP: {c:?}"));
        }
        let b = c.wc.wr_id as usize;
        if !used.insert(b) {
            return Err(format!("buffer {b} used twice"));
        }
        let mut got = vec![0u8; c.wc.byte_len as usize];
        recv.read(b * BUF, &mut got);
        let (client, i) = (got[0] as usize, got[1] as usize);
        if client >= QPS || i != next[client] || got != message(client, i) {
            return Err(format!("buffer {b}: wrong or out-of-order message"));
        }
        next[client] += 1;
    }
    if srq.len() != POSTED - QPS * SENDS {
        return Err(format!(
            "{} receives left, want {}",
            srq.len(),
            POSTED - QPS * SENDS
        ));
    }
    if !srq.wait_limit_event(WAIT) {
        return Err("the low-watermark event did not fire".into());
    }
    if srq.try_limit_event() {
        return Err("the low watermark fired twice for one arming".into());
    }
    if srq.limit() != 0 {
        return Err(format!("the fired limit still reads {}", srq.limit()));
    }
    for qp in qps {
        qp.wait_finished(WAIT);
        qp.disconnect();
    }
    Ok(())
}

fn client(c: usize, addr: SocketAddr) -> Result<(), String> {
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let src = pd
        .register(SENDS * BUF, Access::NONE)
        .map_err(|e| e.to_string())?;
    for i in 0..SENDS {
        src.write(i * BUF, &message(c, i));
    }
    let conn = datapath::connect(addr, &pd, &cq, &params(None), &[])
        .map_err(|e| format!("client {c}: connect: {e}"))?;
    let qp = conn.qp;
    for i in 0..SENDS {
        let len = message(c, i).len() as u32;
        qp.post_send(SendWr {
            wr_id: i as u64,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: src.sge(i * BUF, len).into(),
            signaled: true,
            fence: false,
        })
        .map_err(|e| e.to_string())?;
    }
    for _ in 0..SENDS {
        let wc = cq
            .wait(WAIT)
            .ok_or_else(|| format!("client {c}: {:?}", qp.status()))?;
        if wc.wc.status != WcStatus::Success {
            return Err(format!("client {c}: {wc:?}"));
        }
    }
    qp.disconnect();
    Ok(())
}

fn clients(addr: SocketAddr) -> Result<(), String> {
    let handles: Vec<_> = (0..QPS)
        .map(|c| std::thread::spawn(move || client(c, addr)))
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| "client thread panicked".to_string())??;
    }
    Ok(())
}

#[test]
fn eight_qps_share_one_srq_over_sockets() {
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), params(None)).unwrap();
    let addr = listener.local_addr().unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    let srv = std::thread::spawn(move || server(listener, ready_tx));
    ready_rx.recv_timeout(WAIT).expect("server ready");
    let c = clients(addr);
    let s = srv.join().expect("server thread");
    c.unwrap_or_else(|e| panic!("clients: {e}"));
    s.unwrap_or_else(|e| panic!("server: {e}"));
}

#[test]
fn eight_qps_share_one_srq_on_the_engine() {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let srv = spawn_in_ns(NS_A, move || {
        let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default())
            .map_err(|e| format!("server engine: {e}"))?;
        let listener = engine
            .listen(PORT, params(None))
            .map_err(|e| format!("listen: {e}"))?;
        server(listener, ready_tx)
    });
    if ready_rx.recv_timeout(WAIT).is_err() {
        panic!("server did not start: {:?}", srv.join());
    }
    let cli = spawn_in_ns(NS_B, move || clients(SocketAddr::from((ADDR_A, PORT))));
    let c = cli.join().expect("clients thread");
    let s = srv.join().expect("server thread");
    c.unwrap_or_else(|e| panic!("clients: {e}"));
    s.unwrap_or_else(|e| panic!("server: {e}"));
}
