//! The application's own memory, moved without a copy by the API: each side registers buffers
//! it allocated itself (a `Vec<u8>` handed to `register_buffer`, a `Box<[u8]>` registered by
//! pointer with `register_raw`), then 64 MiB go by RDMA Write, 64 MiB by RDMA Read and 64 MiB
//! by Send, Writes and Sends gathered from scatter/gather lists of four elements over two
//! regions and Sends scattered over receive lists of four elements cut elsewhere. The data is
//! checked in those very bytes (the addresses the test allocated), and neither protection
//! domain's count of bytes copied by the API moves. Both sides hold their protection domain's
//! registration lock through the transfers: the transports (the engine's turns, the socket
//! transport's threads) read the registration table without it, or the test would hang. The
//! server then deregisters the Read source with `deregister` (`ibv_dereg_mr`) once the
//! client's last Send says its Reads are done, and frees its memory while the connection still
//! lives.
//!
//! * `socket_transport_on_loopback`: both sides over kernel TCP on 127.0.0.1.
//! * `engine_to_engine_on_the_bed`: AF_XDP engines in the veth bed's two namespaces (root;
//!   `SKIPPED` without the bed, a failure under `CI=true`).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, Connection, DatapathError, Listener, MemoryRegion,
    ProtectionDomain, RecvWr, SendOp, SendWr, Sge, SgeList, Stag, WcOpcode, WcStatus,
};
use testbed::*;

const MIB: usize = 1 << 20;
/// Octets per operation kind.
const TOTAL: usize = 64 * MIB;
/// Octets per message.
const MSG: usize = 4 * MIB;
const MSGS: usize = TOTAL / MSG;
const WAIT: Duration = Duration::from_secs(60);
const PORT: u16 = 19_531;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    }
}

fn list(pieces: &[(&MemoryRegion, usize, usize)]) -> SgeList {
    let sges: Vec<Sge> = pieces
        .iter()
        .map(|&(mr, off, len)| mr.sge(off, len as u32))
        .collect();
    SgeList::from_slice(&sges).expect("at most MAX_SGE elements")
}

/// Message `m` of the Send stream: 4 MiB gathered as 1 MiB from each source region in turn
/// (two elements in each).
fn send_source(a: &MemoryRegion, b: &MemoryRegion, m: usize) -> SgeList {
    let half = m * 2 * MIB;
    list(&[
        (a, half, MIB),
        (b, half, MIB),
        (a, half + MIB, MIB),
        (b, half + MIB, MIB),
    ])
}

/// Where message `m` of the Send stream lands: its 4 MiB slot of the receive region, cut into
/// 1 MiB + 1.5 MiB + 1 MiB + 512 KiB, the elements covering the slot's parts in the order
/// [2, 3), [0, 1.5), [3, 4), [1.5, 2) MiB.
fn recv_list(recv: &MemoryRegion, m: usize) -> SgeList {
    let slot = m * MSG;
    list(&[
        (recv, slot + 2 * MIB, MIB),
        (recv, slot, 3 * MIB / 2),
        (recv, slot + 3 * MIB, MIB),
        (recv, slot + 3 * MIB / 2, MIB / 2),
    ])
}

/// The Send stream's bytes as the receive lists place them: message by message, each
/// element's part of the message where its element points.
fn expected_recv(send_a: &[u8], send_b: &[u8]) -> Vec<u8> {
    let mut want = vec![0u8; TOTAL];
    for m in 0..MSGS {
        let half = m * 2 * MIB;
        let mut msg = Vec::with_capacity(MSG);
        msg.extend_from_slice(&send_a[half..half + MIB]);
        msg.extend_from_slice(&send_b[half..half + MIB]);
        msg.extend_from_slice(&send_a[half + MIB..half + 2 * MIB]);
        msg.extend_from_slice(&send_b[half + MIB..half + 2 * MIB]);
        let slot = m * MSG;
        let cuts = [
            (slot + 2 * MIB, MIB),
            (slot, 3 * MIB / 2),
            (slot + 3 * MIB, MIB),
            (slot + 3 * MIB / 2, MIB / 2),
        ];
        let mut at = 0;
        for (dst, len) in cuts {
            want[dst..dst + len].copy_from_slice(&msg[at..at + len]);
            at += len;
        }
    }
    want
}

/// The region's bytes, in place, after the transfers into it completed.
fn in_place(mr: &MemoryRegion) -> &[u8] {
    // SAFETY: every transfer into the region has completed and the peer writes nothing more.
    unsafe { mr.as_slice() }
}

fn same(got: &[u8], want: &[u8], what: &str) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} octets, want {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: first difference at octet {i}")),
    }
}

/// The server: Write target (a `Vec`), Read source (a `Box<[u8]>` by pointer) and receive
/// region (a `Vec`), all the test's own allocations.
fn server(listener: Listener, ready: mpsc::Sender<()>) -> Result<(), String> {
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let target = vec![0u8; TOTAL];
    let target_addr = target.as_ptr() as u64;
    let target = pd
        .register_buffer(target, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(|e| e.to_string())?;
    let mut source: Box<[u8]> = pattern(1, TOTAL).into_boxed_slice();
    // SAFETY: `source` outlives the region: it is freed only after `deregister` said that
    // nothing holds its bytes.
    let source_mr = unsafe {
        pd.register_raw(source.as_mut_ptr(), TOTAL, Access::REMOTE_READ)
            .map_err(|e| e.to_string())?
    };
    let recv = pd
        .register_buffer(vec![0u8; TOTAL], Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    if target.base_to() != target_addr || source_mr.base_to() != source.as_ptr() as u64 {
        return Err("a region's TO base is not the application's address".into());
    }
    let mut recvs: Vec<RecvWr> = (0..MSGS)
        .map(|m| RecvWr {
            wr_id: m as u64,
            sg_list: recv_list(&recv, m),
        })
        .collect();
    // The client's last Send (empty), once its Reads have completed.
    recvs.push(RecvWr {
        wr_id: MSGS as u64,
        sg_list: SgeList::new(),
    });
    // Registration is held off from here until the transfers are checked: the transports read
    // the registration table without its lock, so nothing below waits for it.
    let hold = pd.hold_registrations();
    let _ = ready.send(());
    let req = listener
        .accept_timeout(WAIT)
        .map_err(|e| format!("accept: {e}"))?
        .ok_or("no connection request in time")?;
    let mut welcome = Vec::new();
    for mr in [&target, &source_mr] {
        welcome.extend_from_slice(&mr.stag().0.to_be_bytes());
        welcome.extend_from_slice(&mr.base_to().to_be_bytes());
    }
    let conn = req
        .accept_with_recvs(&pd, &cq, &welcome, recvs)
        .map_err(|e| format!("accept: {e}"))?;
    let qp = conn.qp;
    for m in 0..MSGS {
        let c = cq
            .wait(WAIT)
            .ok_or_else(|| format!("no receive completion {m}: {:?}", qp.status()))?;
        let want = (m as u64, WcOpcode::Recv, WcStatus::Success, MSG as u32);
        if (c.wc.wr_id, c.wc.opcode, c.wc.status, c.wc.byte_len) != want {
            return Err(format!("receive {m}: {c:?}"));
        }
    }
    // The Sends followed the Writes on the stream: the Writes are placed.
    same(in_place(&target), &pattern(2, TOTAL), "Write target")?;
    let want = expected_recv(&pattern(3, TOTAL), &pattern(4, TOTAL));
    same(in_place(&recv), &want, "Send receive region")?;
    drop(hold);
    let c = cq
        .wait(WAIT)
        .ok_or_else(|| format!("no last Send: {:?}", qp.status()))?;
    if (c.wc.wr_id, c.wc.status, c.wc.byte_len) != (MSGS as u64, WcStatus::Success, 0) {
        return Err(format!("the last Send: {c:?}"));
    }
    // The client's Reads are done, the connection lives: the Read source leaves
    // (`ibv_dereg_mr`, then `free`). Read Responses sent may still wait for their
    // acknowledgement; `deregister` returns once nothing holds the bytes, so the memory goes
    // at once.
    if let Err(e) = source_mr.deregister() {
        // Something may still read the bytes: they must outlive it.
        let _ = Box::leak(source);
        return Err(format!("deregistering the Read source: {e}"));
    }
    drop(source);
    if !qp.wait_finished(WAIT) {
        return Err(format!("client did not close: {:?}", qp.status()));
    }
    qp.disconnect();
    if pd.copied_bytes() != 0 {
        return Err(format!("the API copied {} octets", pd.copied_bytes()));
    }
    let target: Vec<u8> = target.into_buffer().map_err(|e| e.to_string())?;
    if target.as_ptr() as u64 != target_addr {
        return Err("the Write target came back moved".into());
    }
    Ok(())
}

type Connect<'a> =
    dyn Fn(&ProtectionDomain, &CompletionQueue, &[u8]) -> Result<Connection, DatapathError> + 'a;

/// The client: Write sources and Send sources (`Vec`s, two regions each kind) and the Read
/// sink (a `Vec`).
fn client(connect: &Connect<'_>) -> Result<(), String> {
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let reg = |v: Vec<u8>, access| pd.register_buffer(v, access).map_err(|e| e.to_string());
    let w = pattern(2, TOTAL);
    let (w_a, w_b) = (w[..TOTAL / 2].to_vec(), w[TOTAL / 2..].to_vec());
    drop(w);
    let write_a = reg(w_a, Access::NONE)?;
    let write_b = reg(w_b, Access::NONE)?;
    let send_a = reg(pattern(3, TOTAL / 2), Access::NONE)?;
    let send_b = reg(pattern(4, TOTAL / 2), Access::NONE)?;
    let sink_vec = vec![0u8; TOTAL];
    let sink_addr = sink_vec.as_ptr() as u64;
    let sink = reg(sink_vec, Access::LOCAL_WRITE)?;
    // As on the server: no registration change can happen until the transfers are checked.
    let hold = pd.hold_registrations();
    let conn = connect(&pd, &cq, b"app memory").map_err(|e| format!("connect: {e}"))?;
    let p = &conn.private_data;
    if p.len() != 24 {
        return Err(format!("reply private data of {} octets", p.len()));
    }
    let stag = |o: usize| Stag(u32::from_be_bytes(p[o..o + 4].try_into().unwrap()));
    let to = |o: usize| u64::from_be_bytes(p[o + 4..o + 12].try_into().unwrap());
    let (target, target_to, source, source_to) = (stag(0), to(0), stag(12), to(12));
    let qp = conn.qp;
    let post = |wr_id: u64, op: SendOp, sg_list: SgeList| {
        qp.post_send(SendWr {
            wr_id,
            op,
            sg_list,
            signaled: true,
            fence: false,
        })
        .map_err(|e| format!("post {wr_id}: {e}"))
    };
    let half = TOTAL / 2;
    for m in 0..MSGS {
        // Each Write gathers 1 MiB from each half of the Write stream, twice, in order of
        // the target: message m covers target [m * 4 MiB, (m + 1) * 4 MiB).
        let (region, base) = if m * MSG < half {
            (&write_a, m * MSG)
        } else {
            (&write_b, m * MSG - half)
        };
        let parts = list(&[
            (region, base, MIB),
            (region, base + MIB, MIB),
            (region, base + 2 * MIB, MIB),
            (region, base + 3 * MIB, MIB),
        ]);
        let op = SendOp::Write {
            remote_stag: target,
            remote_to: target_to + (m * MSG) as u64,
        };
        post(100 + m as u64, op, parts)?;
    }
    for m in 0..MSGS {
        let op = SendOp::Read {
            remote_stag: source,
            remote_to: source_to + (m * MSG) as u64,
        };
        post(200 + m as u64, op, list(&[(&sink, m * MSG, MSG)]))?;
    }
    for m in 0..MSGS {
        let op = SendOp::Send {
            solicited: false,
            invalidate: None,
        };
        post(300 + m as u64, op, send_source(&send_a, &send_b, m))?;
    }
    let mut done = 0;
    while done < 3 * MSGS {
        let c = cq
            .wait(WAIT)
            .ok_or_else(|| format!("{done} completions; {:?}", qp.status()))?;
        if c.wc.status != WcStatus::Success || c.wc.byte_len != MSG as u32 {
            return Err(format!("{c:?}; {:?}", qp.status()));
        }
        done += 1;
    }
    if sink.base_to() != sink_addr {
        return Err("the Read sink's TO base is not the application's address".into());
    }
    same(in_place(&sink), &pattern(1, TOTAL), "Read sink")?;
    // The Reads are done: the server may let their source go.
    let last = SendOp::Send {
        solicited: false,
        invalidate: None,
    };
    post(400, last, SgeList::new())?;
    let c = cq
        .wait(WAIT)
        .ok_or_else(|| format!("the last Send did not complete: {:?}", qp.status()))?;
    if (c.wc.wr_id, c.wc.status) != (400, WcStatus::Success) {
        return Err(format!("the last Send: {c:?}"));
    }
    qp.disconnect();
    drop(hold);
    if pd.copied_bytes() != 0 {
        return Err(format!("the API copied {} octets", pd.copied_bytes()));
    }
    Ok(())
}

#[test]
fn socket_transport_on_loopback() {
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), params()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    let srv = std::thread::spawn(move || server(listener, ready_tx));
    ready_rx.recv_timeout(WAIT).expect("server ready");
    let connect = |pd: &ProtectionDomain, cq: &CompletionQueue, pdata: &[u8]| {
        datapath::connect(addr, pd, cq, &params(), pdata)
    };
    let c = client(&connect);
    let s = srv.join().expect("server thread");
    c.unwrap_or_else(|e| panic!("client: {e}"));
    s.unwrap_or_else(|e| panic!("server: {e}"));
}

#[test]
fn engine_to_engine_on_the_bed() {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let srv = spawn_in_ns(NS_A, move || {
        let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default())
            .map_err(|e| format!("server engine: {e}"))?;
        let listener = engine
            .listen(PORT, params())
            .map_err(|e| format!("listen: {e}"))?;
        server(listener, ready_tx)
    });
    if ready_rx.recv_timeout(WAIT).is_err() {
        panic!("server did not start: {:?}", srv.join());
    }
    let cli = spawn_in_ns(NS_B, move || {
        let engine = XdpEngine::start(DEV_B, XdpEngineConfig::default())
            .map_err(|e| format!("client engine: {e}"))?;
        let addr = SocketAddr::from((ADDR_A, PORT));
        let connect = |pd: &ProtectionDomain, cq: &CompletionQueue, pdata: &[u8]| {
            engine.connect(addr, pd, cq, &params(), pdata)
        };
        client(&connect)
    });
    let c = cli.join().expect("client thread");
    let s = srv.join().expect("server thread");
    c.unwrap_or_else(|e| panic!("client: {e}"));
    s.unwrap_or_else(|e| panic!("server: {e}"));
}
