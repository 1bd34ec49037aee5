//! RFC 7306 over both transports on the veth bed: Atomic Operations and Immediate Data engine
//! to engine, engine to socket transport and socket transport to engine (each side as
//! requester and as responder), FetchAdds from eight queue pairs on one counter that the
//! responder's application increments at the same time with its own atomic instructions,
//! CmpSwap as a lock, and a peer whose extensions are off. Needs root and the bed (`SKIPPED`
//! without, a failure under `CI=true`).
//!
//! `IWARP_ATOMIC_OPS` sets the FetchAdds per queue pair of the counter test (default 100,000).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::bed::{start_engine, Stack};
use datapath::{
    Access, AtomicOp, CompletionQueue, ConnectParams, Connection, MemoryRegion, ProtectionDomain,
    QpError, RecvWr, SendOp, SendWr, SgeList, Stag, WcOpcode, WcStatus,
};
use testbed::*;

const WAIT: Duration = Duration::from_secs(30);
/// Atomic Requests each queue pair keeps outstanding.
const WINDOW: usize = 16;
/// The counter's offset in the responder's region (word 1).
const COUNTER: usize = 8;
const REGION: usize = 4096;

fn params(extensions: bool) -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(10),
        rdmap_extensions: extensions,
        ..ConnectParams::default()
    }
}

/// What a responder offers in its private data: its region's STag and base TO.
fn offer(mr: &MemoryRegion) -> Vec<u8> {
    let mut v = mr.stag().0.to_be_bytes().to_vec();
    v.extend_from_slice(&mr.base_to().to_be_bytes());
    v
}

fn offered(conn: &Connection) -> (Stag, u64) {
    let p = &conn.private_data;
    (
        Stag(u32::from_be_bytes(p[..4].try_into().unwrap())),
        u64::from_be_bytes(p[4..12].try_into().unwrap()),
    )
}

/// Accepts `n` connection requests on `listener`, each with a zero-length receive posted
/// (`recvs`) or none, offering `mr`.
fn accept_n(
    listener: &datapath::Listener,
    n: usize,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    recvs: bool,
) -> Result<Vec<Connection>, String> {
    let mut conns = Vec::new();
    for _ in 0..n {
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| e.to_string())?
            .ok_or("no request")?;
        let recvs = if recvs {
            vec![RecvWr {
                wr_id: 1,
                sg_list: SgeList::new(),
            }]
        } else {
            Vec::new()
        };
        conns.push(
            req.accept_with_recvs(pd, cq, &offer(mr), recvs)
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(conns)
}

/// Connects from `stack` to `addr` with the extensions `ext`.
fn dial(
    stack: Stack<'_>,
    addr: SocketAddr,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    ext: bool,
) -> Result<Connection, String> {
    stack
        .connect(addr, pd, cq, &params(ext), b"")
        .map_err(|e| format!("{} connect: {e}", stack.name()))
}

/// The Terminate the peer sent on `conn`, waited for up to [`WAIT`] (it arrives with, or just
/// after, the completion it caused): its layer, type and code.
fn remote_terminate(conn: &Connection) -> Option<(u8, u8, u8)> {
    let deadline = Instant::now() + WAIT;
    loop {
        let st = conn.qp.status();
        if let Some(t) = st.remote_terminate {
            return Some((t.layer, t.etype, t.code));
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The responder's word at `offset`, read with an atomic load (the peer's Atomic Operations
/// are CPU atomics on these very bytes).
fn word(mr: &MemoryRegion, offset: usize) -> &AtomicU64 {
    assert!(offset + 8 <= REGION && offset.is_multiple_of(8));
    // SAFETY: `offset` is 8-aligned inside the region (checked), whose memory is a page-aligned
    // mapping that outlives every use here (the region is held by the caller); every access to
    // this word, ours and the engine's, is atomic.
    unsafe { AtomicU64::from_ptr(mr.as_ptr().add(offset).cast::<u64>()) }
}

fn post(conn: &Connection, wr_id: u64, op: SendOp, sg_list: SgeList) -> Result<(), String> {
    conn.qp
        .post_send(SendWr {
            wr_id,
            op,
            sg_list,
            signaled: true,
            fence: false,
        })
        .map_err(|e| format!("post {wr_id}: {e}"))
}

fn next(
    cq: &CompletionQueue,
    conn: &Connection,
    what: &str,
) -> Result<datapath::Completion, String> {
    cq.wait(WAIT)
        .ok_or_else(|| format!("{what}: no completion; {:?}", conn.qp.status()))
}

/// One atomic, waited for: the original value.
fn one_atomic(
    conn: &Connection,
    cq: &CompletionQueue,
    sink: &MemoryRegion,
    target: (Stag, u64),
    op: AtomicOp,
) -> Result<u64, String> {
    post(
        conn,
        1,
        SendOp::Atomic {
            remote_stag: target.0,
            remote_to: target.1,
            op,
        },
        sink.sge(0, 8).into(),
    )?;
    let c = next(cq, conn, "atomic")?;
    let want = match op {
        AtomicOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        AtomicOp::CmpSwap { .. } => WcOpcode::CmpSwap,
    };
    if (c.wc.opcode, c.wc.status, c.wc.byte_len) != (want, WcStatus::Success, 8) {
        return Err(format!("atomic: {c:?}"));
    }
    let mut b = [0u8; 8];
    sink.read(0, &mut b);
    Ok(u64::from_ne_bytes(b))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Each operation moves the right values and completes with the right completion: FetchAdd
/// and CmpSwap (matching and not) return the original value and change the word; a Write with
/// Immediate places its data and completes a receive (with no buffer) with the value; an
/// Immediate Data with SE completes the next receive, solicited.
fn values(server: Stack<'_>, client: Stack<'_>, server_addr: std::net::Ipv4Addr, port: u16) {
    let listener = server.listen(port, params(true));
    let (tx, rx) = mpsc::channel::<()>();
    let res = std::thread::scope(|s| {
        let srv = s.spawn(move || -> Result<(), String> {
            let req = listener
                .accept_timeout(WAIT)
                .map_err(|e| e.to_string())?
                .ok_or("no request")?;
            let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
            let mr = pd
                .register(
                    REGION,
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
                )
                .map_err(|e| e.to_string())?;
            word(&mr, COUNTER).store(10, Ordering::SeqCst);
            let rbuf = pd
                .register(64, Access::LOCAL_WRITE)
                .map_err(|e| e.to_string())?;
            let recvs = vec![
                RecvWr {
                    wr_id: 70,
                    sg_list: SgeList::new(),
                },
                RecvWr {
                    wr_id: 71,
                    sg_list: rbuf.sge(0, 64).into(),
                },
            ];
            let conn = req
                .accept_with_recvs(&pd, &cq, &offer(&mr), recvs)
                .map_err(|e| e.to_string())?;
            let mut got = Vec::new();
            for _ in 0..2 {
                let c = next(&cq, &conn, "server receive")?;
                got.push((
                    c.wc.wr_id,
                    c.wc.opcode,
                    c.wc.status,
                    c.wc.byte_len,
                    c.wc.immediate,
                    c.wc.solicited,
                ));
            }
            let want = vec![
                (
                    70,
                    WcOpcode::RecvImmediate,
                    WcStatus::Success,
                    0,
                    Some(0x0102_0304_0506_0708),
                    false,
                ),
                (
                    71,
                    WcOpcode::RecvImmediate,
                    WcStatus::Success,
                    0,
                    Some(42),
                    true,
                ),
            ];
            if got != want {
                return Err(format!("server completions {got:?}, want {want:?}"));
            }
            let mut untouched = vec![0xFFu8; 64];
            rbuf.read(0, &mut untouched);
            if untouched != vec![0u8; 64] {
                return Err("Immediate Data placed something in its receive's buffer".into());
            }
            let mut data = vec![0u8; 2048];
            mr.read(1024, &mut data);
            if data != pattern(2048, 5) {
                return Err("the Write with Immediate's data is not in place".into());
            }
            let counter = word(&mr, COUNTER).load(Ordering::SeqCst);
            if counter != 99 {
                return Err(format!("counter {counter}, want 99"));
            }
            // Hold the connection until the client is done with it.
            let _ = rx.recv_timeout(WAIT);
            drop(conn);
            Ok(())
        });
        let cli = (|| -> Result<(), String> {
            let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
            let conn = dial(
                client,
                SocketAddr::from((server_addr, port)),
                &pd,
                &cq,
                true,
            )?;
            let (stag, base) = offered(&conn);
            let counter = (stag, base + COUNTER as u64);
            let sink = pd
                .register(8, Access::LOCAL_WRITE)
                .map_err(|e| e.to_string())?;
            let steps = [
                (AtomicOp::fetch_add(5), 10),
                (AtomicOp::cmp_swap(15, 99), 15),
                (AtomicOp::cmp_swap(15, 7), 99),
            ];
            for (op, original) in steps {
                let got = one_atomic(&conn, &cq, &sink, counter, op)?;
                if got != original {
                    return Err(format!("{op:?}: original {got}, want {original}"));
                }
            }
            let src = pd.register(2048, Access::NONE).map_err(|e| e.to_string())?;
            src.write(0, &pattern(2048, 5));
            post(
                &conn,
                2,
                SendOp::WriteImmediate {
                    remote_stag: stag,
                    remote_to: base + 1024,
                    solicited: false,
                    immediate: 0x0102_0304_0506_0708,
                },
                src.sge(0, 2048).into(),
            )?;
            post(
                &conn,
                3,
                SendOp::Immediate {
                    solicited: true,
                    immediate: 42,
                },
                SgeList::new(),
            )?;
            for (wr_id, opcode) in [(2, WcOpcode::Write), (3, WcOpcode::Immediate)] {
                let c = next(&cq, &conn, "client")?;
                if (c.wc.wr_id, c.wc.opcode, c.wc.status) != (wr_id, opcode, WcStatus::Success) {
                    return Err(format!("client completion {c:?}"));
                }
            }
            Ok(())
        })();
        let _ = tx.send(());
        let srv = srv.join().expect("server thread");
        cli.and(srv)
    });
    if let Err(e) = res {
        panic!("{} server, {} client: {e}", server.name(), client.name());
    }
}

#[test]
fn atomics_and_immediates_on_every_pair_of_transports() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    let b = start_engine(NS_B, DEV_B);
    values(Stack::Engine(&a), Stack::Engine(&b), ADDR_A, 19_641);
    values(Stack::Engine(&a), Stack::Socket, ADDR_A, 19_642);
    values(Stack::Socket, Stack::Engine(&a), ADDR_B, 19_643);
}

/// `n` FetchAdds of 1 on `target`, [`WINDOW`] outstanding: the original values, in order.
fn fetch_adds(
    conn: &Connection,
    cq: &CompletionQueue,
    pd: &ProtectionDomain,
    target: (Stag, u64),
    n: usize,
) -> Result<Vec<u64>, String> {
    let sinks = pd
        .register(8 * WINDOW, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let (mut posted, mut done) = (0usize, 0usize);
    let mut originals = Vec::with_capacity(n);
    while done < n {
        while posted < n && posted - done < WINDOW {
            post(
                conn,
                posted as u64,
                SendOp::Atomic {
                    remote_stag: target.0,
                    remote_to: target.1,
                    op: AtomicOp::fetch_add(1),
                },
                sinks.sge(8 * (posted % WINDOW), 8).into(),
            )?;
            posted += 1;
        }
        let c = next(cq, conn, "FetchAdd")?;
        if (c.wc.wr_id, c.wc.opcode, c.wc.status)
            != (done as u64, WcOpcode::FetchAdd, WcStatus::Success)
        {
            return Err(format!("FetchAdd {done}: {c:?}"));
        }
        let mut b = [0u8; 8];
        sinks.read(8 * (done % WINDOW), &mut b);
        originals.push(u64::from_ne_bytes(b));
        done += 1;
    }
    Ok(originals)
}

/// Eight queue pairs, four from an engine and four from a socket transport, each doing
/// `IWARP_ATOMIC_OPS` FetchAdds of 1 on one counter of the responder's, while the responder's
/// application adds 1 to it with its own atomic instructions from the moment every queue pair is
/// connected until all are done: the counter ends at the exact sum, and every FetchAdd saw a
/// different original value (none lost or applied twice, RFC 7306 5.3). The responder is the
/// engine, then the socket transport.
fn fetch_adds_add_up(
    server: Stack<'_>,
    clients: [Stack<'_>; 2],
    addr: std::net::Ipv4Addr,
    port: u16,
    ops: usize,
) {
    let listener = server.listen(port, params(true));
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let mr = pd
        .register(REGION, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
        .expect("register");
    word(&mr, COUNTER).store(1000, Ordering::SeqCst);
    let connected = std::sync::Barrier::new(9);
    let done = std::sync::atomic::AtomicBool::new(false);
    let started = Instant::now();
    let (conns, local, originals) = std::thread::scope(|s| {
        let (mr, connected, done) = (&mr, &connected, &done);
        let srv = s.spawn(|| accept_n(&listener, 8, &pd, &cq, mr, false));
        let app = s.spawn(move || {
            connected.wait();
            let mut n = 0u64;
            // A few every 20 us: the clients keep the cores.
            while !done.load(Ordering::Acquire) {
                for _ in 0..4 {
                    word(mr, COUNTER).fetch_add(1, Ordering::SeqCst);
                }
                n += 4;
                std::thread::sleep(Duration::from_micros(20));
            }
            n
        });
        let clients: Vec<_> = (0..8)
            .map(|i| {
                let stack = clients[i / 4];
                s.spawn(move || -> Result<Vec<u64>, String> {
                    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
                    let conn =
                        stack.connect(SocketAddr::from((addr, port)), &pd, &cq, &params(true), b"");
                    // Everyone passes the barrier, connected or not, so nothing waits forever.
                    connected.wait();
                    let conn =
                        conn.map_err(|e| format!("{} client {i}: connect: {e}", stack.name()))?;
                    let (stag, base) = offered(&conn);
                    fetch_adds(&conn, &cq, &pd, (stag, base + COUNTER as u64), ops)
                        .map_err(|e| format!("{} client {i}: {e}", stack.name()))
                })
            })
            .collect();
        // The application thread stops even if a client thread panicked.
        let stop_app = common::SetOnDrop(done);
        let originals: Vec<_> = clients
            .into_iter()
            .map(|c| c.join().expect("client thread"))
            .collect();
        drop(stop_app);
        let local = app.join().expect("application thread");
        (srv.join().expect("server thread"), local, originals)
    });
    let took = started.elapsed();
    let _conns = conns.unwrap_or_else(|e| panic!("{} server: {e}", server.name()));
    let mut all = Vec::with_capacity(8 * ops);
    for r in originals {
        all.extend(r.unwrap_or_else(|e| panic!("{} server: {e}", server.name())));
    }
    let counter = word(&mr, COUNTER).load(Ordering::SeqCst);
    println!(
        "{} server: 8 x {ops} FetchAdds and {local} local increments at the same time in \
         {took:?}: counter {counter} ({:.0} remote FetchAdds/s)",
        server.name(),
        (8 * ops) as f64 / took.as_secs_f64()
    );
    assert!(
        local > 0,
        "the application did not run beside the FetchAdds"
    );
    let sum = 1000 + 8 * ops as u64 + local;
    assert_eq!(counter, sum, "{}: the exact sum", server.name());
    all.sort_unstable();
    let before = all.len();
    all.dedup();
    assert_eq!(
        all.len(),
        before,
        "{}: two FetchAdds saw the same original value",
        server.name()
    );
    assert!(all.iter().all(|&v| (1000..sum).contains(&v)));
}

#[test]
fn fetch_adds_from_eight_queue_pairs_and_the_application_add_up() {
    let _bed = bed_or_skip!();
    let ops: usize = std::env::var("IWARP_ATOMIC_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let a = start_engine(NS_A, DEV_A);
    let b = start_engine(NS_B, DEV_B);
    fetch_adds_add_up(
        Stack::Engine(&a),
        [Stack::Engine(&b), Stack::Socket],
        ADDR_A,
        19_644,
        ops,
    );
    fetch_adds_add_up(
        Stack::Socket,
        [Stack::Engine(&a), Stack::Socket],
        ADDR_B,
        19_654,
        ops,
    );
}

/// CmpSwap as a lock (0 free, else the holder's id + 1) taken by eight queue pairs, four from
/// the peer's engine and four from its socket transport; each holder increments a plain (not
/// atomic) counter next to the lock with an RDMA Read and an RDMA Write, then releases. If two
/// holders were ever in at once, increments would be lost: the counter ends at the exact
/// number of critical sections.
#[test]
fn cmp_swap_as_a_lock_never_lets_two_holders_in() {
    let _bed = bed_or_skip!();
    const ROUNDS: u64 = 40;
    const LOCK: usize = 0;
    const PLAIN: usize = 64;
    let a = start_engine(NS_A, DEV_A);
    let b = start_engine(NS_B, DEV_B);
    let port = 19_645;
    let listener = Stack::Engine(&a).listen(port, params(true));
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let mr = pd
        .register(
            REGION,
            Access::LOCAL_WRITE
                | Access::REMOTE_ATOMIC
                | Access::REMOTE_READ
                | Access::REMOTE_WRITE,
        )
        .expect("register");
    let (conns, results) = std::thread::scope(|s| {
        let mr = &mr;
        let srv = s.spawn(|| accept_n(&listener, 8, &pd, &cq, mr, false));
        let clients: Vec<_> = (0..8u64)
            .map(|id| {
                let stack = if id < 4 {
                    Stack::Engine(&b)
                } else {
                    Stack::Socket
                };
                s.spawn(move || -> Result<u64, String> {
                    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
                    let conn = dial(stack, SocketAddr::from((ADDR_A, port)), &pd, &cq, true)?;
                    let (stag, base) = offered(&conn);
                    let lock = (stag, base + LOCK as u64);
                    let buf = pd
                        .register(16, Access::LOCAL_WRITE)
                        .map_err(|e| e.to_string())?;
                    let mut spins = 0;
                    for _ in 0..ROUNDS {
                        while one_atomic(&conn, &cq, &buf, lock, AtomicOp::cmp_swap(0, id + 1))?
                            != 0
                        {
                            spins += 1;
                        }
                        // Read the plain counter, write it back plus one.
                        post(
                            &conn,
                            10,
                            SendOp::Read {
                                remote_stag: stag,
                                remote_to: base + PLAIN as u64,
                            },
                            buf.sge(8, 8).into(),
                        )?;
                        next(&cq, &conn, "Read")?;
                        let mut v = [0u8; 8];
                        buf.read(8, &mut v);
                        buf.write(8, &(u64::from_ne_bytes(v) + 1).to_ne_bytes());
                        post(
                            &conn,
                            11,
                            SendOp::Write {
                                remote_stag: stag,
                                remote_to: base + PLAIN as u64,
                            },
                            buf.sge(8, 8).into(),
                        )?;
                        next(&cq, &conn, "Write")?;
                        // The release follows the Write on this stream: the responder places
                        // the Write before it performs the CmpSwap (RFC 7306 5.4 rule 5).
                        let held =
                            one_atomic(&conn, &cq, &buf, lock, AtomicOp::cmp_swap(id + 1, 0))?;
                        if held != id + 1 {
                            return Err(format!("queue pair {id} released a lock held by {held}"));
                        }
                    }
                    Ok(spins)
                })
            })
            .collect();
        let results: Vec<_> = clients
            .into_iter()
            .map(|c| c.join().expect("client thread"))
            .collect();
        (srv.join().expect("server thread"), results)
    });
    let _conns = conns.unwrap_or_else(|e| panic!("server: {e}"));
    let mut spins = 0;
    for (id, r) in results.into_iter().enumerate() {
        spins += r.unwrap_or_else(|e| panic!("queue pair {id}: {e}"));
    }
    let plain = word(&mr, PLAIN).load(Ordering::SeqCst);
    println!("8 x {ROUNDS} critical sections, {spins} CmpSwaps found the lock taken");
    assert_eq!(plain, 8 * ROUNDS, "increments lost: two holders at once");
    assert_eq!(word(&mr, LOCK).load(Ordering::SeqCst), 0, "left locked");
}

/// A responder whose extensions are off (RFC 7306 1.1: the default): an Atomic Request or an
/// Immediate Data message gets RFC 5040's Terminate for an unexpected opcode (remote
/// operation error, code 6), the requester's work request completes with
/// `RemoteOperationError` (the Immediate Data message with `Success` when the peer's TCP
/// acknowledged it in a segment before the Terminate), and the engine keeps serving its
/// other connections.
#[test]
fn a_peer_without_the_extensions_terminates_them_as_unexpected_opcodes() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    let b = start_engine(NS_B, DEV_B);
    for (server, client, addr, port) in [
        (Stack::Engine(&a), Stack::Engine(&b), ADDR_A, 19_646u16),
        (Stack::Socket, Stack::Engine(&a), ADDR_B, 19_647),
    ] {
        let listener = server.listen(port, params(false));
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let mr = pd.register(REGION, Access::ALL).expect("register");
        let res = std::thread::scope(|s| {
            let srv = s.spawn(|| accept_n(&listener, 3, &pd, &cq, &mr, true));
            let cli = (|| -> Result<(), String> {
                let cpd = ProtectionDomain::new();
                let ccq = CompletionQueue::new();
                let connect = |ext| dial(client, SocketAddr::from((addr, port)), &cpd, &ccq, ext);
                let sink = cpd
                    .register(64, Access::LOCAL_WRITE)
                    .map_err(|e| e.to_string())?;
                for (i, op) in [
                    SendOp::Atomic {
                        remote_stag: mr.stag(),
                        remote_to: mr.base_to(),
                        op: AtomicOp::fetch_add(1),
                    },
                    SendOp::Immediate {
                        solicited: false,
                        immediate: 1,
                    },
                ]
                .into_iter()
                .enumerate()
                {
                    let conn = connect(true)?;
                    let sg: SgeList = match op {
                        SendOp::Atomic { .. } => sink.sge(0, 8).into(),
                        _ => SgeList::new(),
                    };
                    let acked_first_allowed = !matches!(op, SendOp::Atomic { .. });
                    post(&conn, i as u64, op, sg)?;
                    let c = next(&ccq, &conn, "refused")?;
                    // An Immediate Data message, like a Send, completes once the peer's TCP
                    // has acknowledged it (RFC 5040 5.5): when that ACK comes in a segment of
                    // its own, before the Terminate (kernel TCP acknowledging at once under
                    // load), the completion says Success and the Terminate follows. An Atomic
                    // Request waits for its Response, so the Terminate always decides.
                    let refused = c.wc.status == WcStatus::RemoteOperationError
                        || acked_first_allowed && c.wc.status == WcStatus::Success;
                    if !refused || c.wc.wr_id != i as u64 {
                        return Err(format!("op {i}: {c:?}"));
                    }
                    let t = remote_terminate(&conn).ok_or(format!("op {i}: no Terminate"))?;
                    if t != (0, 2, 6) {
                        return Err(format!("op {i}: Terminate {t:?}"));
                    }
                    let st = conn.qp.status();
                    if !matches!(st.error, Some(QpError::RemoteTerminate(_))) {
                        return Err(format!("op {i}: error {:?}", st.error));
                    }
                }
                // The responder still serves a connection that keeps to RFC 5040.
                let conn = connect(false)?;
                post(
                    &conn,
                    9,
                    SendOp::Read {
                        remote_stag: mr.stag(),
                        remote_to: mr.base_to(),
                    },
                    sink.sge(0, 64).into(),
                )?;
                let c = next(&ccq, &conn, "Read")?;
                if (c.wc.wr_id, c.wc.status) != (9, WcStatus::Success) {
                    return Err(format!("Read after the refusals: {c:?}"));
                }
                Ok(())
            })();
            let srv = srv.join().expect("server thread");
            cli.and(srv.map(drop))
        });
        if let Err(e) = res {
            panic!("{} server, {} client: {e}", server.name(), client.name());
        }
    }
}

/// The discovery probe (a FetchAdd of 0 on a connection made for it): a peer with the
/// extensions answers (or, for a target it refuses, terminates with a protection error); one
/// without terminates with "Unexpected OpCode".
#[test]
fn the_probe_tells_peers_with_and_without_the_extensions_apart() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    let cases = [
        (
            Stack::Engine(&a),
            Stack::Socket,
            ADDR_A,
            true,
            true,
            19_648u16,
        ),
        (
            Stack::Engine(&a),
            Stack::Socket,
            ADDR_A,
            true,
            false,
            19_649,
        ),
        (
            Stack::Engine(&a),
            Stack::Socket,
            ADDR_A,
            false,
            true,
            19_650,
        ),
        (
            Stack::Socket,
            Stack::Engine(&a),
            ADDR_B,
            false,
            true,
            19_651,
        ),
    ];
    for (server, client, addr, server_ext, good_target, port) in cases {
        let listener = server.listen(port, params(server_ext));
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let mr = pd
            .register(REGION, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
            .expect("register");
        let found = std::thread::scope(|s| {
            let srv = s.spawn(|| {
                let req = listener.accept_timeout(WAIT).ok().flatten()?;
                req.accept(&pd, &cq, &offer(&mr)).ok()
            });
            let (cpd, ccq) = (ProtectionDomain::new(), CompletionQueue::new());
            let conn =
                dial(client, SocketAddr::from((addr, port)), &cpd, &ccq, true).expect("connect");
            let target = if good_target {
                offered(&conn)
            } else {
                (Stag(0), 0)
            };
            let found = datapath::probe_rdmap_extensions(&conn.qp, &ccq, &cpd, target, WAIT)
                .expect("probe");
            drop(srv.join().expect("server thread"));
            found
        });
        let want = if server_ext {
            datapath::ExtensionSupport::Supported
        } else {
            datapath::ExtensionSupport::Unsupported
        };
        assert_eq!(
            found,
            want,
            "{} server (extensions {server_ext}), {} client, good target {good_target}",
            server.name(),
            client.name()
        );
        if server_ext && good_target {
            assert_eq!(
                word(&mr, 0).load(Ordering::SeqCst),
                0,
                "Add Data 0 changes nothing"
            );
        }
    }
}

/// A Terminate's layer, error type and code, and the opcodes of the ULPDUs before it.
type Terminated = ((u8, u8, u8), Vec<u8>);

/// A raw iWARP initiator over kernel TCP: the MPA exchange through `mpa::Initiator`, then
/// FPDUs of ULPDUs we build byte by byte (what our own requester would never send).
struct RawPeer {
    s: std::net::TcpStream,
    enc: mpa::FpduEncoder,
    dec: mpa::FpduDecoder,
    negotiated: mpa::Negotiated,
    /// The responder's private data: its region's STag and base TO.
    offer: (Stag, u64),
}

impl RawPeer {
    fn connect(addr: SocketAddr, ord: u16) -> Result<RawPeer, String> {
        use std::io::{Read, Write};
        let config = mpa::MpaConfig {
            ord,
            ..mpa::MpaConfig::default()
        };
        let mut init = mpa::Initiator::new(config, b"", std::time::Instant::now())
            .map_err(|e| e.to_string())?;
        let mut s = std::net::TcpStream::connect_timeout(&addr, WAIT).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(WAIT)).map_err(|e| e.to_string())?;
        s.write_all(init.request()).map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        loop {
            let mut chunk = [0u8; 512];
            let n = s
                .read(&mut chunk)
                .map_err(|e| format!("reading the Reply: {e}"))?;
            if n == 0 {
                return Err("closed before the Reply".into());
            }
            buf.extend_from_slice(&chunk[..n]);
            match init
                .feed(&buf, std::time::Instant::now())
                .map_err(|e| e.to_string())?
            {
                (_, mpa::InitiatorEvent::NeedMore) => continue,
                (
                    used,
                    mpa::InitiatorEvent::Accepted {
                        negotiated,
                        private_data,
                    },
                ) => {
                    if used != buf.len() {
                        return Err("FPDUs right after the Reply".into());
                    }
                    let offer = (
                        Stag(u32::from_be_bytes(private_data[..4].try_into().unwrap())),
                        u64::from_be_bytes(private_data[4..12].try_into().unwrap()),
                    );
                    return Ok(RawPeer {
                        s,
                        enc: mpa::FpduEncoder::new(negotiated.crc, negotiated.markers_tx),
                        dec: mpa::FpduDecoder::new(negotiated.crc, negotiated.markers_rx),
                        negotiated,
                        offer,
                    });
                }
                (_, other) => return Err(format!("MPA: {other:?}")),
            }
        }
    }

    /// An Atomic Request ULPDU with QN 1 MSN `msn`, its AOpCode word set to `aopcode`.
    fn atomic_request(&self, msn: u32, aopcode: u8) -> Vec<u8> {
        let mut ulpdu = vec![0x41, 0x4A, 0, 0, 0, 0];
        ulpdu.extend_from_slice(&1u32.to_be_bytes());
        ulpdu.extend_from_slice(&msn.to_be_bytes());
        ulpdu.extend_from_slice(&0u32.to_be_bytes());
        let request = rdmap::wire::AtomicRequest {
            op: AtomicOp::fetch_add(1),
            request_id: msn,
            stag: self.offer.0 .0,
            to: self.offer.1,
        };
        let mut header = request.to_bytes();
        header[3] = aopcode;
        ulpdu.extend_from_slice(&header);
        ulpdu
    }

    fn send(&mut self, ulpdus: &[Vec<u8>]) -> Result<(), String> {
        use std::io::Write;
        let mut out = Vec::new();
        for u in ulpdus {
            self.enc.encode(u, &mut out).map_err(|e| e.to_string())?;
        }
        self.s.write_all(&out).map_err(|e| e.to_string())
    }

    /// Reads FPDUs until a Terminate (QN 2) arrives: its layer, type and code, and the ULPDUs
    /// (opcodes) before it.
    fn terminate(&mut self) -> Result<Terminated, String> {
        use std::io::Read;
        let mut before = Vec::new();
        let mut found = None;
        loop {
            let mut chunk = [0u8; 2048];
            let n = self
                .s
                .read(&mut chunk)
                .map_err(|e| format!("no Terminate: {e}"))?;
            if n == 0 {
                return Err(format!("closed without a Terminate; before it {before:?}"));
            }
            self.dec
                .feed(&chunk[..n], |u| {
                    if found.is_some() || u.len() < 18 {
                        return;
                    }
                    if u[1] & 0x0F == 7 {
                        found = rdmap::wire::TerminateHeader::parse(&u[18..])
                            .ok()
                            .map(|t| (t.layer, t.etype, t.code));
                    } else {
                        before.push(u[1] & 0x0F);
                    }
                })
                .map_err(|e| e.to_string())?;
            if let Some(t) = found {
                return Ok((t, before));
            }
        }
    }
}

/// Each error of RFC 7306 section 8 from the wire. From a raw peer, what our requester never
/// sends: an Atomic Request with an unsupported AOpCode (5.2.1 rule 4) gets "Unexpected
/// OpCode", and more Atomic Requests than the responder's IRD gets the Terminate of RFC 5040 for
/// exceeding it (remote operation, catastrophic for the stream), answered only for the ones
/// within IRD. From our requester: a misaligned target (8.2: remote operation, catastrophic for
/// the stream), a region without REMOTE_ATOMIC (remote protection, access rights) and one out
/// of bounds (remote protection, base or bounds), each completing its work request with the
/// matching remote error. The responder (engine or socket transport) goes on serving its other
/// connections.
#[test]
fn atomic_requests_a_peer_must_refuse_from_a_raw_peer() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    for (server, addr, port) in [
        (Stack::Engine(&a), ADDR_A, 19_652u16),
        (Stack::Socket, ADDR_B, 19_653),
    ] {
        let listener = server.listen(port, params(true));
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let mr = pd
            .register(REGION, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
            .expect("register");
        let no_atomics = pd
            .register(REGION, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .expect("register");
        let res = std::thread::scope(|s| {
            let srv = s.spawn(|| accept_n(&listener, 6, &pd, &cq, &mr, false));
            let raw = in_ns(NS_B, || -> Result<u64, String> {
                let to = SocketAddr::from((addr, port));
                // An AOpCode of 0001b.
                let mut p = RawPeer::connect(to, 4)?;
                let bad = p.atomic_request(1, 0x1);
                p.send(&[bad])?;
                let (t, _) = p.terminate()?;
                if t != (0, 2, 6) {
                    return Err(format!("unsupported AOpCode: Terminate {t:?}"));
                }
                // IRD + 1 Atomic Requests at once. Asked for a large ORD, MPA gives us the
                // responder's IRD (RFC 6581 9.1).
                let mut p = RawPeer::connect(to, 256)?;
                let ird = u32::from(p.negotiated.ord);
                let burst: Vec<_> = (1..=ird + 1).map(|msn| p.atomic_request(msn, 0)).collect();
                p.send(&burst)?;
                let (t, before) = p.terminate()?;
                if t != (0, 2, 7) {
                    return Err(format!("beyond IRD {ird}: Terminate {t:?}"));
                }
                if before.len() > ird as usize || before.iter().any(|&op| op != 0xB) {
                    return Err(format!("beyond IRD {ird}: answered {before:?} first"));
                }
                Ok(before.len() as u64)
            });
            // Our requester, towards targets the responder must refuse.
            let refused = (|| -> Result<(), String> {
                let (cpd, ccq) = (ProtectionDomain::new(), CompletionQueue::new());
                let sink = cpd
                    .register(8, Access::LOCAL_WRITE)
                    .map_err(|e| e.to_string())?;
                let cases = [
                    (
                        "misaligned",
                        mr.stag(),
                        mr.base_to() + 4,
                        (0, 2, 7),
                        WcStatus::RemoteOperationError,
                    ),
                    (
                        "no REMOTE_ATOMIC",
                        no_atomics.stag(),
                        no_atomics.base_to(),
                        (0, 1, 2),
                        WcStatus::RemoteAccessError,
                    ),
                    (
                        "out of bounds",
                        mr.stag(),
                        mr.base_to() + REGION as u64,
                        (0, 1, 1),
                        WcStatus::RemoteAccessError,
                    ),
                ];
                for (what, stag, to, code, status) in cases {
                    let conn = dial(
                        Stack::Socket,
                        SocketAddr::from((addr, port)),
                        &cpd,
                        &ccq,
                        true,
                    )?;
                    post(
                        &conn,
                        1,
                        SendOp::Atomic {
                            remote_stag: stag,
                            remote_to: to,
                            op: AtomicOp::fetch_add(1),
                        },
                        sink.sge(0, 8).into(),
                    )?;
                    let c = next(&ccq, &conn, what)?;
                    if c.wc.status != status {
                        return Err(format!("{what}: {c:?}"));
                    }
                    let t = remote_terminate(&conn).ok_or(format!("{what}: no Terminate"))?;
                    if t != code {
                        return Err(format!("{what}: Terminate {t:?}"));
                    }
                }
                Ok(())
            })();
            // The responder still serves another connection.
            let served = (|| -> Result<u64, String> {
                let (cpd, ccq) = (ProtectionDomain::new(), CompletionQueue::new());
                let conn = dial(
                    Stack::Socket,
                    SocketAddr::from((addr, port)),
                    &cpd,
                    &ccq,
                    true,
                )?;
                let sink = cpd
                    .register(8, Access::LOCAL_WRITE)
                    .map_err(|e| e.to_string())?;
                one_atomic(&conn, &ccq, &sink, offered(&conn), AtomicOp::fetch_add(1))
            })();
            let srv = srv.join().expect("server thread");
            refused?;
            let answered = raw?;
            let original = served?;
            srv.map(|_| (answered, original))
        });
        let (answered, original) = res.unwrap_or_else(|e| panic!("{} server: {e}", server.name()));
        // The unsupported one changed nothing; of the burst, exactly the ones answered before
        // the Terminate were performed (an Atomic runs when its Response is generated).
        assert_eq!(original, answered, "{}", server.name());
        assert_eq!(
            word(&mr, 0).load(Ordering::SeqCst),
            answered + 1,
            "{}",
            server.name()
        );
    }
}
