//! Shared helpers for the loopback end-to-end tests of the socket transport: connection setup
//! with bounded waits, completion collection, deterministic data patterns, and a TCP relay that
//! can hold and corrupt the client-to-server stream.

#![allow(dead_code)]

pub mod bed;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use datapath::{
    connect, Completion, CompletionQueue, ConnectParams, ConnectRequest, Connection, DatapathError,
    Listener, MemoryRegion, MpaConfig, ProtectionDomain, QueuePair, RecvWr, SendOp, SendWr,
    SgeList, Stag, WcOpcode, WcStatus,
};

/// Sets its flag when dropped: a thread told to stop by the flag stops even if the code that
/// would set it panics first (a scope would otherwise wait for that thread forever).
pub struct SetOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Upper bound for any single wait in these tests (connection setup, one completion, the end of
/// an engine). Generous because the machine is shared, but finite so nothing can hang CI.
pub const WAIT: Duration = Duration::from_secs(20);

/// The next connection `listener` takes, waiting at most `within`: a test whose other side
/// failed before connecting fails with a timeout instead of waiting for ever. The listener is
/// left non-blocking; the stream is blocking.
pub fn accept_within(listener: &TcpListener, within: Duration) -> std::io::Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + within;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no connection within {within:?}"),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// What is left until `deadline` (at least a millisecond, so a wait still looks once): the
/// share of a session's deadline the next wait gets.
pub fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Loopback with port 0: the kernel picks a free port.
pub fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// MPA settings for one side.
pub fn mpa(rev: u8, crc: bool, markers: bool) -> MpaConfig {
    MpaConfig {
        rev,
        crc,
        markers,
        ..MpaConfig::default()
    }
}

/// Connection parameters around `mpa`, with a bounded setup time.
pub fn params(mpa: MpaConfig) -> ConnectParams {
    ConnectParams {
        mpa,
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    }
}

/// Peer-to-peer setup (an RTR: with it the responder may send the moment the RTR arrives,
/// RFC 6581) and a receive queue of `rq_depth`, with a bounded setup time.
pub fn p2p(rq_depth: usize) -> ConnectParams {
    ConnectParams {
        mpa: MpaConfig {
            peer_to_peer: true,
            ..MpaConfig::default()
        },
        rq_depth,
        ..params(MpaConfig::default())
    }
}

/// Listens on loopback with `params`; a thread takes the first connection request (waiting
/// up to [`WAIT`]) and hands it to `serve`. Returns the address and the thread.
pub fn serve_one(
    params: ConnectParams,
    serve: impl FnOnce(ConnectRequest) -> Result<(), String> + Send + 'static,
) -> (SocketAddr, std::thread::JoinHandle<Result<(), String>>) {
    let listener = Listener::bind(any_port(), params).expect("listen");
    let addr = listener.local_addr().expect("address");
    let server = std::thread::spawn(move || {
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| e.to_string())?
            .ok_or("no connection request")?;
        serve(req)
    });
    (addr, server)
}

/// A protection domain and a completion queue: what one side of a test owns.
#[derive(Clone, Default)]
pub struct Side {
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
}

impl Side {
    pub fn new() -> Self {
        Self::default()
    }

    /// A side whose completion queue holds `cqe` completions.
    pub fn with_cqe(cqe: usize) -> Self {
        Side {
            pd: ProtectionDomain::new(),
            cq: CompletionQueue::create(cqe, None, 0).expect("a completion queue"),
        }
    }
}

/// A receive queue deep enough that posts race a connection's end rather than fill it
/// ([`post_recvs_until_the_end`]); the completion queue taking its receives holds as many
/// and the few posts flushed at once after the end ([`DEEP_CQE`]).
pub const DEEP_RQ: usize = 1 << 18;

/// Completions a queue taking [`DEEP_RQ`] receives holds.
pub const DEEP_CQE: usize = DEEP_RQ + 64;

/// What the server does with the next connection request.
pub struct ServerPlan<'a> {
    pub side: &'a Side,
    pub private_data: &'a [u8],
    pub recvs: Vec<RecvWr>,
}

/// Accepts one connection on `listener` (bounded wait) while `connect`ing to `addr` from this
/// thread. Returns the client's and the server's results.
pub fn establish(
    listener: &Listener,
    addr: SocketAddr,
    client: &Side,
    client_params: &ConnectParams,
    client_private_data: &[u8],
    server: ServerPlan<'_>,
) -> (
    Result<Connection, DatapathError>,
    Result<Connection, DatapathError>,
) {
    std::thread::scope(|s| {
        let accepting = s.spawn(move || {
            let request = listener
                .accept_timeout(WAIT)?
                .ok_or(DatapathError::Timeout("test accept"))?;
            let (pd, cq) = (&server.side.pd, &server.side.cq);
            if server.recvs.is_empty() {
                request.accept(pd, cq, server.private_data)
            } else {
                request.accept_with_recvs(pd, cq, server.private_data, server.recvs)
            }
        });
        let client_result = connect(
            addr,
            &client.pd,
            &client.cq,
            client_params,
            client_private_data,
        );
        let server_result = accepting.join().expect("accepting thread panicked");
        (client_result, server_result)
    })
}

/// [`establish`] that must succeed, connecting straight to the listener.
pub fn establish_ok(
    listener: &Listener,
    client: &Side,
    client_params: &ConnectParams,
    server: ServerPlan<'_>,
) -> (Connection, Connection) {
    let addr = listener.local_addr().unwrap();
    let (c, s) = establish(listener, addr, client, client_params, &[], server);
    (
        c.expect("client connect failed"),
        s.expect("server accept failed"),
    )
}

/// [`establish_ok`] with a server that posts no receives and sends no private data.
pub fn establish_plain(
    listener: &Listener,
    client: &Side,
    server: &Side,
    params: &ConnectParams,
) -> (Connection, Connection) {
    establish_ok(
        listener,
        client,
        params,
        ServerPlan {
            side: server,
            private_data: &[],
            recvs: Vec::new(),
        },
    )
}

/// The next completion, or a panic naming `what` once [`WAIT`] has passed.
pub fn next_wc(cq: &CompletionQueue, what: &str) -> Completion {
    cq.wait(WAIT)
        .unwrap_or_else(|| panic!("no completion within {WAIT:?} while waiting for {what}"))
}

/// Waits for the next completion and checks it is `wr_id` with `opcode` and `status`.
pub fn expect_wc(
    cq: &CompletionQueue,
    wr_id: u64,
    opcode: WcOpcode,
    status: WcStatus,
) -> Completion {
    let c = next_wc(cq, &format!("wr {wr_id} {opcode:?} {status:?}"));
    assert_eq!(
        (c.wc.wr_id, c.wc.opcode, c.wc.status),
        (wr_id, opcode, status),
        "unexpected completion {c:?}"
    );
    c
}

/// Collects exactly `n` completions (bounded wait for each).
pub fn collect(cq: &CompletionQueue, n: usize, what: &str) -> Vec<Completion> {
    (0..n).map(|_| next_wc(cq, what)).collect()
}

/// Checks that no further completion comes for 200 ms: one a transport's thread produces a
/// moment later is seen too (a `try_next` right away would see only what is queued already).
pub fn assert_no_more(cq: &CompletionQueue) {
    stays_empty(cq, "unexpected extra completion");
}

/// Nothing arrives on `cq` for 200 ms (bounded, blocking wait).
pub fn stays_empty(cq: &CompletionQueue, what: &str) {
    let stray = cq.wait(Duration::from_millis(200));
    assert!(stray.is_none(), "{what}: {stray:?}");
}

/// Posts zero-length receives on `qp` as fast as it takes them (`wr_id` 0, 1, ...; pausing
/// while its receive queue is full) until the connection's end stops them, and returns how
/// many were accepted: the first post refused with `Disconnected` (ending, or ended
/// gracefully), or the first accepted after the transport was seen to have finished (in Error a
/// post is taken and completes flushed at once). Bounded by [`WAIT`].
pub fn post_recvs_until_the_end(qp: &QueuePair, what: &str) -> u64 {
    let deadline = Instant::now() + WAIT;
    let mut accepted = 0u64;
    loop {
        let finished = qp.status().finished;
        let wr = RecvWr {
            wr_id: accepted,
            sg_list: SgeList::new(),
        };
        match qp.post_recv(wr) {
            Ok(()) => {
                accepted += 1;
                if finished {
                    return accepted;
                }
            }
            Err(DatapathError::Disconnected) => return accepted,
            // The receive queue is full (nothing is sent to these): wait for the end.
            Err(DatapathError::RecvQueueFull { .. }) => {
                std::thread::sleep(Duration::from_micros(20))
            }
            Err(e) => panic!("{what}: a post failed with {e}"),
        }
        assert!(Instant::now() < deadline, "{what}: the posts never ended");
    }
}

/// Checks that each of the `accepted` receives of [`post_recvs_until_the_end`] completed
/// exactly once, none successfully (nothing was sent to them), and that nothing else is
/// queued on `cq`.
pub fn each_completed_once(cq: &CompletionQueue, accepted: u64, what: &str) {
    let mut completed = vec![false; accepted as usize];
    for _ in 0..accepted {
        let wc = cq
            .wait(WAIT)
            .unwrap_or_else(|| panic!("{what}: an accepted post never completed"))
            .wc;
        assert_eq!(wc.opcode, WcOpcode::Recv, "{what}");
        assert_ne!(
            wc.status,
            WcStatus::Success,
            "{what}: nothing was sent to it"
        );
        let seen = completed
            .get_mut(wc.wr_id as usize)
            .unwrap_or_else(|| panic!("{what}: completion of a refused post {wc:?}"));
        assert!(!*seen, "{what}: two completions of {}", wc.wr_id);
        *seen = true;
    }
    if let Some(c) = cq.try_next() {
        panic!("{what}: unexpected extra completion {c:?}");
    }
}

/// `len` pseudo-random bytes from `seed` (xorshift64*): cheap to make, and any misplaced,
/// dropped or duplicated run of bytes shows.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The bytes of a region.
pub fn region_bytes(mr: &MemoryRegion, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(offset, &mut v);
    v
}

/// Asserts equality of two byte strings, reporting the first difference instead of dumping
/// megabytes.
pub fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if got != want {
        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        let diffs = got.iter().zip(want).filter(|(a, b)| a != b).count();
        panic!(
            "{what}: {diffs} bytes differ, first at {i}: got {:#04x}, want {:#04x}",
            got[i], want[i]
        );
    }
}

/// Plays the MPA Responder on `s` (default settings: CRCs, no Markers) until the whole
/// Request has arrived (reads bounded by [`WAIT`]); returns the Responder, ready to accept or
/// reject it. Bytes after the Request are not read.
pub fn read_mpa_request(s: &mut TcpStream) -> Result<mpa::Responder, String> {
    s.set_read_timeout(Some(WAIT)).map_err(|e| e.to_string())?;
    let mut responder =
        mpa::Responder::new(MpaConfig::default(), Instant::now()).map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    loop {
        // One octet at a time: nothing after the Request is taken from the stream.
        let n = s.read(&mut byte).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before the Request".into());
        }
        let (_, info) = responder
            .feed(&byte, Instant::now())
            .map_err(|e| e.to_string())?;
        if info.is_some() {
            return Ok(responder);
        }
    }
}

/// Length on the wire of the FPDU carrying a `ulpdu_len`-octet ULPDU without Markers
/// (RFC 5044 4.1: 2-octet ULPDU_Length, ULPDU, pad to a multiple of 4, 4-octet CRC field, which
/// is present, as zero, even when CRCs are not in use).
pub fn fpdu_len(ulpdu_len: usize) -> usize {
    (2 + ulpdu_len).div_ceil(4) * 4 + 4
}

// ---------------------------------------------------------------------------------------------
// The relay: client -> relay -> server, one connection.
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct RelayState {
    /// Octets read from the client so far (held ones included).
    c2s_read: u64,
    /// Octets read from the server so far.
    s2c_read: u64,
    /// Client-to-server forwarding is paused.
    hold: bool,
    /// Client-to-server stream offset of the octet to flip.
    corrupt_at: Option<u64>,
    /// (offset, original, replacement) of the octet flipped.
    corrupted: Option<(u64, u8, u8)>,
    /// The client-to-server direction has ended.
    c2s_done: bool,
    /// The server-to-client direction has ended.
    s2c_done: bool,
}

struct RelayShared {
    state: Mutex<RelayState>,
    changed: Condvar,
}

impl RelayShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, RelayState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A TCP forwarder between one client and the server, able to pause the client-to-server
/// direction (to make the order of events deterministic) and to flip one octet of it.
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<RelayShared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on a free loopback port; the first connection to it is forwarded to `server`.
    pub fn start(server: SocketAddr) -> Relay {
        let listener = TcpListener::bind(any_port()).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(RelayShared {
            state: Mutex::new(RelayState::default()),
            changed: Condvar::new(),
        });
        let sh = shared.clone();
        let acceptor = std::thread::spawn(move || {
            let Ok(client) = accept_within(&listener, WAIT) else {
                return;
            };
            let server = TcpStream::connect_timeout(&server, WAIT).unwrap();
            client.set_nodelay(true).unwrap();
            server.set_nodelay(true).unwrap();
            let (c_in, s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let sh2 = sh.clone();
            std::thread::spawn(move || pump_c2s(c_in, s_out, sh2));
            pump(server, client, &sh);
        });
        Relay {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// Where the client should connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Octets read from the client so far.
    pub fn c2s_read(&self) -> u64 {
        self.shared.lock().c2s_read
    }

    /// Octets read from the server so far.
    pub fn s2c_read(&self) -> u64 {
        self.shared.lock().s2c_read
    }

    /// Pauses client-to-server forwarding (octets are still read from the client and held).
    pub fn hold(&self) {
        self.shared.lock().hold = true;
    }

    /// Resumes client-to-server forwarding.
    pub fn release(&self) {
        self.shared.lock().hold = false;
        self.shared.changed.notify_all();
    }

    /// Flips the octet `k` octets after everything the client has sent so far.
    pub fn corrupt_in(&self, k: u64) {
        let mut st = self.shared.lock();
        st.corrupt_at = Some(st.c2s_read + k);
    }

    /// The octet flipped: (stream offset, original value, value forwarded).
    pub fn corrupted(&self) -> Option<(u64, u8, u8)> {
        self.shared.lock().corrupted
    }

    /// Waits (bounded) until at least `n` octets have been read from the client.
    pub fn wait_c2s_read(&self, n: u64) {
        let deadline = Instant::now() + WAIT;
        let mut st = self.shared.lock();
        while st.c2s_read < n {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "relay saw {} of {n} client octets within {WAIT:?}",
                st.c2s_read
            );
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits (bounded) until both directions have ended; true when they did.
    pub fn wait_closed(&self) -> bool {
        let deadline = Instant::now() + WAIT;
        let mut st = self.shared.lock();
        while !(st.c2s_done && st.s2c_done) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Never leave a held pump behind.
        self.release();
        if let Some(a) = self.acceptor.take() {
            if a.is_finished() {
                let _ = a.join();
            }
        }
    }
}

/// Server to client: plain forwarding, counted.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &RelayShared) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        shared.lock().s2c_read += n as u64;
        shared.changed.notify_all();
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    shared.lock().s2c_done = true;
    shared.changed.notify_all();
}

/// Client to server: a reader that keeps reading (and counting, and corrupting) while the
/// direction is held, and a writer that forwards what was read once it is not.
fn pump_c2s(mut from: TcpStream, mut to: TcpStream, shared: Arc<RelayShared>) {
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let sh = shared.clone();
    let writer = std::thread::spawn(move || {
        while let Ok(chunk) = rx.recv() {
            let deadline = Instant::now() + WAIT;
            let mut st = sh.lock();
            while st.hold && Instant::now() < deadline {
                st = sh
                    .changed
                    .wait_timeout(st, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            drop(st);
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut st = shared.lock();
        let start = st.c2s_read;
        if let Some(at) = st.corrupt_at {
            if (start..start + n as u64).contains(&at) {
                let i = (at - start) as usize;
                let original = buf[i];
                buf[i] ^= 0x5A;
                st.corrupted = Some((at, original, buf[i]));
                st.corrupt_at = None;
            }
        }
        st.c2s_read += n as u64;
        drop(st);
        shared.changed.notify_all();
        if tx.send(buf[..n].to_vec()).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.join();
    shared.lock().c2s_done = true;
    shared.changed.notify_all();
}

// ---------------------------------------------------------------------------------------------
// Verified transfers: RDMA Write, Send and RDMA Read of a list of sizes over one connection.
// ---------------------------------------------------------------------------------------------

/// A message size, absolute or relative to a MULPDU that is only known once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// This many octets.
    Bytes(usize),
    /// The client's MULPDU plus this (Writes and Sends go client to server).
    Mulpdu(i64),
    /// The server's MULPDU plus this (Read Responses go server to client).
    ServerMulpdu(i64),
}

impl Size {
    fn resolve(self, client_mulpdu: usize, server_mulpdu: usize) -> usize {
        let rel = |m: usize, k: i64| usize::try_from(m as i64 + k).expect("size below zero");
        match self {
            Size::Bytes(n) => n,
            Size::Mulpdu(k) => rel(client_mulpdu, k),
            Size::ServerMulpdu(k) => rel(server_mulpdu, k),
        }
    }

    /// Room needed before the MULPDU is known (a MULPDU never exceeds 65535 here: the
    /// transport caps it at the MPA limit).
    fn capacity(self) -> usize {
        match self {
            Size::Bytes(n) => n,
            Size::Mulpdu(k) | Size::ServerMulpdu(k) => (65_535 + k.max(0)) as usize,
        }
    }
}

/// The full size list: tiny messages, both sides of the MULPDU (the ULPDU limit) and of the
/// payload a single tagged (MULPDU - 14) or untagged (MULPDU - 18) segment holds, 64 KiB, 1 MiB
/// and 16 MiB.
pub fn full_sizes() -> Vec<Size> {
    let mut v = vec![Size::Bytes(1), Size::Bytes(2), Size::Bytes(100)];
    v.extend(
        [-19, -18, -17, -15, -14, -13, -1, 0, 1]
            .into_iter()
            .map(Size::Mulpdu),
    );
    v.extend([-15, -14, -13].into_iter().map(Size::ServerMulpdu));
    v.extend([
        Size::Bytes(65_536),
        Size::Bytes(1 << 20),
        Size::Bytes(16 << 20),
    ]);
    v
}

/// What a verified transfer run saw.
pub struct RunInfo {
    pub client_agreed: datapath::Agreed,
    pub server_agreed: datapath::Agreed,
    pub client_mulpdu: usize,
    pub server_mulpdu: usize,
    /// The sizes actually moved, in order.
    pub sizes: Vec<usize>,
}

impl RunInfo {
    /// The client's MPA parameters (the run used MPA).
    pub fn client_negotiated(&self) -> &datapath::Negotiated {
        match &self.client_agreed {
            datapath::Agreed::Mpa(n) => n,
            other => panic!("the client's connection did not use MPA: {other:?}"),
        }
    }

    /// The server's MPA parameters (the run used MPA).
    pub fn server_negotiated(&self) -> &datapath::Negotiated {
        match &self.server_agreed {
            datapath::Agreed::Mpa(n) => n,
            other => panic!("the server's connection did not use MPA: {other:?}"),
        }
    }
}

const SENTINEL: u8 = 0xEE;
const TAIL: usize = 64;

/// Connects through `addr` (the listener itself or a relay in front of it), then for every
/// size: the client RDMA-Writes a fresh pattern into a server region and Sends it into a
/// posted receive; once the receive completes (Sends are delivered after the preceding Write
/// is placed) both copies are checked byte for byte, with the octets after them untouched;
/// then the client RDMA-Reads that many octets of a server region and checks them. Finally
/// the client disconnects and the server's queue pair must end. Every completion is checked.
pub fn verified_transfers(
    listener: &Listener,
    addr: SocketAddr,
    client_params: &ConnectParams,
    sizes: &[Size],
    seed: u64,
) -> RunInfo {
    use datapath::{Access, SendOp, SendWr};
    let (client, server) = (Side::new(), Side::new());
    let max = sizes.iter().map(|s| s.capacity()).max().unwrap_or(0).max(1);

    let c_src = client.pd.register(max, Access::NONE).unwrap();
    let c_sink = client.pd.register(max + TAIL, Access::LOCAL_WRITE).unwrap();
    let s_target = server
        .pd
        .register(max + TAIL, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let s_source = server.pd.register(max, Access::REMOTE_READ).unwrap();
    let source_data = pattern(seed ^ 0xABCD, max);
    s_source.write(0, &source_data);
    s_target.write(0, &vec![SENTINEL; max + TAIL]);
    let recv_regions: Vec<MemoryRegion> = sizes
        .iter()
        .map(|s| {
            server
                .pd
                .register(s.capacity() + TAIL, Access::LOCAL_WRITE)
                .unwrap()
        })
        .collect();
    let recvs = sizes
        .iter()
        .zip(&recv_regions)
        .enumerate()
        .map(|(i, (s, mr))| RecvWr {
            wr_id: i as u64,
            sg_list: mr.sge(0, s.capacity() as u32).into(),
        })
        .collect();

    let (c, s) = establish(
        listener,
        addr,
        &client,
        client_params,
        &[],
        ServerPlan {
            side: &server,
            private_data: &[],
            recvs,
        },
    );
    let (c, s) = (c.expect("connect"), s.expect("accept"));
    let (client_mulpdu, server_mulpdu) = (c.qp.mulpdu(), s.qp.mulpdu());
    let mut moved = Vec::new();

    for (i, size) in sizes.iter().enumerate() {
        let n = size.resolve(client_mulpdu, server_mulpdu);
        assert!(n <= size.capacity(), "{size:?} resolved to {n}");
        moved.push(n);
        let id = 10 * i as u64;
        let what = |op: &str| format!("{op} of {n} octets ({size:?})");

        // RDMA Write then Send of the same fresh data.
        let data = pattern(seed.wrapping_add(i as u64), n);
        c_src.write(0, &data);
        s_target.write(n, &[SENTINEL; TAIL]);
        c.qp.post_send(SendWr {
            wr_id: id,
            op: SendOp::Write {
                remote_stag: s_target.stag(),
                remote_to: s_target.base_to(),
            },
            sg_list: c_src.sge(0, n as u32).into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
        c.qp.post_send(SendWr {
            wr_id: id + 1,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: c_src.sge(0, n as u32).into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
        let recv = expect_wc(&server.cq, i as u64, WcOpcode::Recv, WcStatus::Success);
        assert_eq!(recv.wc.byte_len as usize, n, "{}", what("Send"));
        assert_eq!(recv.qp_num, s.qp.num());
        assert_bytes_eq(
            &region_bytes(&s_target, 0, n + TAIL),
            &[&data[..], &[SENTINEL; TAIL]].concat(),
            &what("RDMA Write"),
        );
        let room = size.capacity() + TAIL;
        let mut want = data.clone();
        want.resize(room, 0);
        assert_bytes_eq(
            &region_bytes(&recv_regions[i], 0, room),
            &want,
            &what("Send"),
        );
        let w = expect_wc(&client.cq, id, WcOpcode::Write, WcStatus::Success);
        assert_eq!(w.wc.byte_len as usize, n);
        let sd = expect_wc(&client.cq, id + 1, WcOpcode::Send, WcStatus::Success);
        assert_eq!(sd.wc.byte_len as usize, n);

        // RDMA Read into a sink reset to the sentinel.
        c_sink.write(0, &vec![SENTINEL; n + TAIL]);
        c.qp.post_send(SendWr {
            wr_id: id + 2,
            op: SendOp::Read {
                remote_stag: s_source.stag(),
                remote_to: s_source.base_to(),
            },
            sg_list: c_sink.sge(0, n as u32).into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
        let r = expect_wc(&client.cq, id + 2, WcOpcode::Read, WcStatus::Success);
        assert_eq!(r.wc.byte_len as usize, n);
        assert_eq!(r.qp_num, c.qp.num());
        assert_bytes_eq(
            &region_bytes(&c_sink, 0, n + TAIL),
            &[&source_data[..n], &[SENTINEL; TAIL]].concat(),
            &what("RDMA Read"),
        );
    }

    let info = RunInfo {
        client_agreed: c.qp.agreed().clone(),
        server_agreed: s.qp.agreed().clone(),
        client_mulpdu,
        server_mulpdu,
        sizes: moved,
    };
    assert_eq!(c.qp.status().error, None);
    assert_eq!(s.qp.status().error, None);
    c.qp.disconnect();
    assert!(s.qp.wait_finished(WAIT), "server QP did not end");
    assert_no_more(&client.cq);
    assert_no_more(&server.cq);
    info
}

/// An RDMA Write of `len` octets from the start of `src` to `stag`/`to`, signaled.
pub fn write_wr(wr_id: u64, src: &MemoryRegion, len: usize, stag: Stag, to: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Write {
            remote_stag: stag,
            remote_to: to,
        },
        sg_list: src.sge(0, len as u32).into(),
        signaled: true,
        fence: false,
    }
}

/// An RDMA Read of `len` octets from `stag`/`to` into the start of `sink`, signaled.
pub fn read_wr(wr_id: u64, sink: &MemoryRegion, len: usize, stag: Stag, to: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Read {
            remote_stag: stag,
            remote_to: to,
        },
        sg_list: sink.sge(0, len as u32).into(),
        signaled: true,
        fence: false,
    }
}

/// A Send of `len` octets from the start of `src`, signaled.
pub fn send_wr(wr_id: u64, src: &MemoryRegion, len: usize) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: src.sge(0, len as u32).into(),
        signaled: true,
        fence: false,
    }
}
