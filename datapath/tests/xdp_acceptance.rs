//! Issue #5's correctness acceptance on the veth test bed (`scripts/netns.sh`): the AF_XDP
//! engine (`XdpEngine`) against itself and against the socket transport (kernel TCP).
//!
//! * `matrix_*`: Write, Read and Send, content verified, in every combination of MPA revision
//!   (1, 2), CRC (off; asked by both, by the client only, by the server only: RFC 5044 7.1.1
//!   makes CRCs used when either end asks) and Markers (none, client->server only,
//!   server->client only, both: each end's M bit asks for Markers in the stream it *receives*,
//!   RFC 5044 7.1.1), for each pairing: engine <-> engine, engine server <-> socket client,
//!   socket server <-> engine client. Every combination moves 1 B, 1461 B (one MSS plus an odd
//!   part), 4 KiB, 64 KiB + 1 and 1 MiB on one connection, and 16 MiB too where Markers go
//!   both ways, in the default setting (revision 2, CRCs, no Markers) and with each RTR kind
//!   (the largest transfers where framing is hardest; the rest would only repeat them). Both
//!   ends' `Negotiated` are
//!   checked against the expected outcome. Three more combinations per pairing use revision 2's
//!   peer-to-peer model, one per RTR kind (RFC 6581 9.2).
//! * `reject_*`: a reject with private data, engine server -> socket client, socket server ->
//!   engine client and engine -> engine (revisions 1 and 2); the engine's listener then accepts
//!   and serves the next connection.
//! * `sixty_four_connections_*`: 64 connections open at once between the namespaces (engine
//!   client, and socket clients), each moving verified data while all are open, then all closed
//!   without a Terminate.
//! * `terminate_*`: a peer in the other namespace (the socket transport over kernel TCP, or the
//!   engine, connecting to the engine; or the socket transport accepting the engine's connection)
//!   puts on the wire, each on its own connection to the engine: a tagged Write with an
//!   invalid STag, a Write past the region's end, a Write into a region without remote write
//!   access, a Read Request with an invalid source STag. Each must draw the Terminate of RFC 5040
//!   7 / RFC 5041 7 (this project's mapping: `rdmap::TerminateCause::code`), with the copied
//!   headers of RFC 5040 Figure 10, and write nothing outside the region. A raw peer (kernel
//!   TCP, our `mpa` and `ddp` crates, no queue pair) adds FPDUs no conforming sender produces: a
//!   CRC mismatch, a Send with no buffer for its MSN, a Send longer than its buffer, an invalid
//!   QN, DDP and RDMAP version errors. Meanwhile another connection to the same engine moves
//!   verified data before, during and after.
//!
//! Needs root. Without root (or without the bed) each test prints `SKIPPED: <why>` and passes,
//! except under `CI=true`, where it fails with the reason. Tests serialise with every other
//! test-bed user on `/run/lock/iwarp-netns.lock`, bring the bed up fresh and take it down.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use datapath::engine::{EngineCounters, XdpEngine, XdpEngineConfig};
use datapath::{
    Access, Completion, CompletionQueue, ConnectParams, ConnectRequest, Connection, DatapathError,
    Listener, MemoryRegion, MpaConfig, ProtectionDomain, QpState, RecvWr, SendOp, SendWr, Stag,
    WcOpcode, WcStatus,
};
use ddp::DdpHeader;
use rdmap::wire::{layer, rdmap_etype};
use rdmap::ReadRequest;
use testbed::*;

/// Upper bound of any single wait (setup, one completion, a close).
const WAIT: Duration = Duration::from_secs(30);
const ALL: Access = Access::ALL;

// ---------------------------------------------------------------------------------------------
// Helpers

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

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn check_bytes(got: &[u8], want: &[u8], what: &str) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} octets, want {}", got.len(), want.len()));
    }
    match first_difference(got, want) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: differs first at octet {i}")),
    }
}

fn mpa(rev: u8, crc: bool, markers: bool) -> MpaConfig {
    MpaConfig {
        rev,
        crc,
        markers,
        ..MpaConfig::default()
    }
}

fn params(mpa: MpaConfig) -> ConnectParams {
    ConnectParams {
        mpa,
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    }
}

fn start_engine(ns: &'static str, dev: &'static str) -> XdpEngine {
    in_ns(ns, move || {
        XdpEngine::start(dev, XdpEngineConfig::default())
    })
    .unwrap_or_else(|e| panic!("engine on {dev}: {e}"))
}

/// Which stack runs one end of a connection.
#[derive(Clone, Copy)]
enum Stack<'a> {
    Engine(&'a XdpEngine),
    /// The socket transport (kernel TCP) in namespace `iwb`.
    Socket,
}

impl Stack<'_> {
    fn name(&self) -> &'static str {
        match self {
            Stack::Engine(_) => "engine",
            Stack::Socket => "socket",
        }
    }

    fn listen(&self, port: u16, p: ConnectParams) -> Listener {
        match self {
            Stack::Engine(e) => e.listen(port, p),
            Stack::Socket => in_ns(NS_B, move || {
                Listener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)), p)
            }),
        }
        .unwrap_or_else(|e| panic!("listen on {port}: {e}"))
    }

    fn connect(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        p: &ConnectParams,
        private_data: &[u8],
    ) -> Result<Connection, DatapathError> {
        match self {
            Stack::Engine(e) => e.connect(addr, pd, cq, p, private_data),
            Stack::Socket => in_ns(NS_B, || datapath::connect(addr, pd, cq, p, private_data)),
        }
    }
}

/// Waits for the next completion on `cq`.
fn next(cq: &CompletionQueue, what: &str) -> Result<Completion, String> {
    cq.wait(WAIT)
        .ok_or_else(|| format!("no completion in {WAIT:?}: {what}"))
}

/// The next completion must be `(wr_id, opcode, status)`.
fn expect_wc(
    cq: &CompletionQueue,
    wr_id: u64,
    opcode: WcOpcode,
    status: WcStatus,
) -> Result<Completion, String> {
    let c = next(cq, &format!("wr {wr_id} {opcode:?}"))?;
    if (c.wc.wr_id, c.wc.opcode, c.wc.status) != (wr_id, opcode, status) {
        return Err(format!(
            "completion {c:?}, want wr {wr_id} {opcode:?} {status:?}"
        ));
    }
    Ok(c)
}

/// Accepts the next request on `listener` (answering with `reply`, after posting `recvs`) while
/// `client` connects from this thread's scope; returns (client, server).
fn establish(
    listener: &Listener,
    server_pd: &ProtectionDomain,
    server_cq: &CompletionQueue,
    reply: &[u8],
    recvs: Vec<RecvWr>,
    client: impl FnOnce() -> Result<Connection, DatapathError> + Send,
) -> Result<(Connection, Connection), String> {
    std::thread::scope(|s| {
        let srv = s.spawn(move || {
            let req = listener
                .accept_timeout(WAIT)
                .map_err(|e| format!("accept: {e}"))?
                .ok_or("no connection request in time")?;
            req.accept_with_recvs(server_pd, server_cq, reply, recvs)
                .map_err(|e| format!("accept: {e}"))
        });
        let c = client().map_err(|e| format!("connect: {e}"));
        let s = srv.join().expect("accepting thread");
        match (c, s) {
            (Ok(c), Ok(s)) => Ok((c, s)),
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
            (Err(c), Err(s)) => Err(format!("{c}; {s}")),
        }
    })
}

fn sge_recv(mr: &MemoryRegion, wr_id: u64, off: usize, len: usize) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: mr.sge(off, len as u32).into(),
    }
}

fn write_wr(wr_id: u64, src: &MemoryRegion, off: usize, len: usize, stag: Stag, to: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Write {
            remote_stag: stag,
            remote_to: to,
        },
        sg_list: src.sge(off, len as u32).into(),
        signaled: true,
        fence: false,
    }
}

fn read_wr(wr_id: u64, sink: &MemoryRegion, off: usize, len: usize, stag: Stag, to: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Read {
            remote_stag: stag,
            remote_to: to,
        },
        sg_list: sink.sge(off, len as u32).into(),
        signaled: true,
        fence: false,
    }
}

fn send_wr(wr_id: u64, src: &MemoryRegion, off: usize, len: usize) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: src.sge(off, len as u32).into(),
        signaled: true,
        fence: false,
    }
}

/// The engine's counters after it stopped, checked for errors (`crc_errors` is how many CRC
/// failures the test provoked).
fn stop_and_check(name: &str, mut engine: XdpEngine, crc_errors: u64) -> EngineCounters {
    engine.stop();
    let c = engine.counters();
    println!(
        "{name} engine: established {}, ended {}, FPDUs rx {} tx {}, CRC errors {}, Terminates \
         sent {} received {}, retransmissions {} (timeouts {}, loss probes {}, undone as \
         spurious {}), error {:?}",
        c.established,
        c.ended,
        c.conns.fpdus_rx,
        c.conns.fpdus_tx,
        c.conns.crc_errors,
        c.conns.terminates_sent,
        c.conns.terminates_received,
        c.conns.retransmissions,
        c.conns.rto_expirations,
        c.conns.loss_probes,
        c.conns.spurious_undone,
        c.error
    );
    assert_eq!(c.error, None, "{name} engine stopped with an error");
    assert_eq!(c.conns.crc_errors, crc_errors, "{name} engine: CRC errors");
    c
}

/// Octets of `sizes` laid out one after another, each starting on a 4 KiB boundary.
fn layout(sizes: &[usize]) -> (Vec<usize>, usize) {
    let mut offsets = Vec::new();
    let mut at = 0;
    for &s in sizes {
        offsets.push(at);
        at += s.div_ceil(4096).max(1) * 4096;
    }
    (offsets, at)
}

// ---------------------------------------------------------------------------------------------
// 1. The interop matrix

/// Which end asks for CRCs (RFC 5044 7.1.1: used when either asks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Crc {
    Off,
    Both,
    ClientOnly,
    ServerOnly,
}

impl Crc {
    fn asks(self) -> (bool, bool) {
        match self {
            Crc::Off => (false, false),
            Crc::Both => (true, true),
            Crc::ClientOnly => (true, false),
            Crc::ServerOnly => (false, true),
        }
    }
}

/// Which directions carry Markers. Each end's M bit asks for Markers in what it receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Markers {
    None,
    /// client -> server only (the server asks).
    ToServer,
    /// server -> client only (the client asks).
    ToClient,
    Both,
}

impl Markers {
    /// (client's M bit, server's M bit).
    fn asks(self) -> (bool, bool) {
        match self {
            Markers::None => (false, false),
            Markers::ToServer => (false, true),
            Markers::ToClient => (true, false),
            Markers::Both => (true, true),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Combo {
    rev: u8,
    crc: Crc,
    markers: Markers,
    /// Revision 2 only: the client asks for the peer-to-peer model offering only this RTR
    /// kind (RFC 6581 9.2); the responder supports all three.
    rtr: Option<mpa::RtrKind>,
}

impl Combo {
    fn client_params(&self) -> ConnectParams {
        let mut p = params(mpa(self.rev, self.crc.asks().0, self.markers.asks().0));
        if let Some(kind) = self.rtr {
            p.mpa.peer_to_peer = true;
            p.mpa.rtr_send = kind == mpa::RtrKind::Send;
            p.mpa.rtr_write = kind == mpa::RtrKind::Write;
            p.mpa.rtr_read = kind == mpa::RtrKind::Read;
        }
        p
    }

    fn server_params(&self) -> ConnectParams {
        params(mpa(self.rev, self.crc.asks().1, self.markers.asks().1))
    }

    /// The outcome both ends must agree on, from the client's view:
    /// (rev, crc, markers client->server, markers server->client).
    fn expected(&self) -> (u8, bool, bool, bool) {
        let (cc, sc) = self.crc.asks();
        let (cm, sm) = self.markers.asks();
        (self.rev, cc || sc, sm, cm)
    }

    /// The sizes this combination moves: [`SIZES`] where Markers go both ways, in the default
    /// setting (revision 2, CRCs, no Markers) and with an RTR; all but the 16 MiB elsewhere.
    fn sizes(&self) -> &'static [usize] {
        let default = self.rev == 2 && self.crc == Crc::Both && self.markers == Markers::None;
        if self.markers == Markers::Both || self.rtr.is_some() || default {
            &SIZES
        } else {
            &SIZES[..SIZES.len() - 1]
        }
    }
}

/// A combination moves each of these sizes as a Write, a Read and a Send: 1 B, one MSS plus
/// an odd part, a page, 64 KiB + 1, 1 MiB and 16 MiB ([`Combo::sizes`]: some leave out the
/// last).
const SIZES: [usize; 6] = [1, 1461, 4096, 65_537, 1 << 20, 16 << 20];

/// One side's memory for the matrix, registered once per test and reused by every combination
/// (each combination uses its own data seeds, so stale contents cannot pass a check).
struct MatrixMem {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    /// Server: Write target. Client: Write source.
    a: MemoryRegion,
    /// Server: Read source. Client: Read sink.
    b: MemoryRegion,
    /// Server: receive buffers. Client: Send source.
    c: MemoryRegion,
}

impl MatrixMem {
    fn new() -> MatrixMem {
        let pd = ProtectionDomain::new();
        let len = layout(&SIZES).1;
        let reg = || pd.register(len, ALL).expect("register");
        let (a, b, c) = (reg(), reg(), reg());
        MatrixMem {
            cq: CompletionQueue::new(),
            pd,
            a,
            b,
            c,
        }
    }
}

/// One combination: connect, check `Negotiated` on both ends, then for each size a Write, a
/// Read and a Send from the client, all verified, then a clean close.
#[allow(clippy::too_many_arguments)]
fn run_combo(
    listener: &Listener,
    client_stack: Stack<'_>,
    addr: SocketAddr,
    combo: Combo,
    sizes: &[usize],
    seed: u64,
    srv: &MatrixMem,
    cli: &MatrixMem,
) -> Result<(), String> {
    let (offsets, _) = layout(sizes);
    let seed_of = |what: u64, i: usize| seed * 1000 + what * 100 + i as u64;
    for (i, &size) in sizes.iter().enumerate() {
        srv.b.write(offsets[i], &pattern(seed_of(1, i), size));
        cli.a.write(offsets[i], &pattern(seed_of(2, i), size));
        cli.c.write(offsets[i], &pattern(seed_of(3, i), size));
    }
    let recvs = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| sge_recv(&srv.c, i as u64, offsets[i], size))
        .collect();
    let mut welcome = Vec::new();
    for mr in [&srv.a, &srv.b] {
        welcome.extend_from_slice(&mr.stag().0.to_be_bytes());
        welcome.extend_from_slice(&mr.base_to().to_be_bytes());
    }
    let hello = format!("combo {seed}");
    let cp = combo.client_params();
    let (c, s) = establish(listener, &srv.pd, &srv.cq, &welcome, recvs, || {
        client_stack.connect(addr, &cli.pd, &cli.cq, &cp, hello.as_bytes())
    })?;
    if c.private_data != welcome {
        return Err(format!("reply private data {:?}", c.private_data));
    }
    if s.private_data != hello.as_bytes() {
        return Err(format!("request private data {:?}", s.private_data));
    }
    let (rev, crc, to_server, to_client) = combo.expected();
    let cn = c.qp.negotiated().expect("MPA");
    let sn = s.qp.negotiated().expect("MPA");
    let got_c = (cn.rev, cn.crc, cn.markers_tx, cn.markers_rx);
    let got_s = (sn.rev, sn.crc, sn.markers_rx, sn.markers_tx);
    if got_c != (rev, crc, to_server, to_client)
        || got_s != got_c
        || cn.rtr != combo.rtr
        || sn.rtr != combo.rtr
    {
        return Err(format!(
            "negotiated: client {cn:?}, server {sn:?}; want rev {rev} crc {crc} markers \
             c->s {to_server} s->c {to_client}"
        ));
    }
    let stag = |b: &[u8], o: usize| Stag(u32::from_be_bytes(b[o..o + 4].try_into().unwrap()));
    let to = |b: &[u8], o: usize| u64::from_be_bytes(b[o + 4..o + 12].try_into().unwrap());
    let w = &c.private_data;
    let (wstag, wto, rstag, rto) = (stag(w, 0), to(w, 0), stag(w, 12), to(w, 12));
    for (i, &size) in sizes.iter().enumerate() {
        let off = offsets[i];
        let post = |wr| c.qp.post_send(wr).map_err(|e| format!("post: {e}"));
        post(write_wr(1, &cli.a, off, size, wstag, wto + off as u64))?;
        post(read_wr(2, &cli.b, off, size, rstag, rto + off as u64))?;
        post(send_wr(3, &cli.c, off, size))?;
        for (id, op) in [
            (1, WcOpcode::Write),
            (2, WcOpcode::Read),
            (3, WcOpcode::Send),
        ] {
            expect_wc(&cli.cq, id, op, WcStatus::Success)
                .map_err(|e| format!("size {size} client: {e}; {:?}", c.qp.status()))?;
        }
        check_bytes(
            &bytes(&cli.b, off, size),
            &pattern(seed_of(1, i), size),
            &format!("size {size} Read data"),
        )?;
        let r = expect_wc(&srv.cq, i as u64, WcOpcode::Recv, WcStatus::Success)
            .map_err(|e| format!("size {size} server: {e}; {:?}", s.qp.status()))?;
        if r.wc.byte_len as usize != size {
            return Err(format!("size {size}: received {} octets", r.wc.byte_len));
        }
        check_bytes(
            &bytes(&srv.c, off, size),
            &pattern(seed_of(3, i), size),
            &format!("size {size} Send data"),
        )?;
        // The Send followed the Write on the same stream, so the Write is placed.
        check_bytes(
            &bytes(&srv.a, off, size),
            &pattern(seed_of(2, i), size),
            &format!("size {size} Write data"),
        )?;
    }
    let (c, s) = (c, s);
    c.qp.disconnect();
    if !s.qp.wait_finished(WAIT) {
        return Err(format!("server side did not close: {:?}", s.qp.status()));
    }
    s.qp.disconnect();
    for (who, st) in [("client", c.qp.status()), ("server", s.qp.status())] {
        if st.sent_terminate.is_some() || st.remote_terminate.is_some() || !st.finished {
            return Err(format!("{who} did not close cleanly: {st:?}"));
        }
    }
    if let Some(x) = cli.cq.try_next().or_else(|| srv.cq.try_next()) {
        return Err(format!("unexpected completion {x:?}"));
    }
    Ok(())
}

/// Every combination for one pairing; `server` listens (in `iwa` for the engine, `iwb` for the
/// socket transport), `client` connects from the other namespace.
fn matrix(pairing: &str, server: Stack<'_>, client: Stack<'_>, server_addr: Ipv4Addr) {
    let t0 = Instant::now();
    println!(
        "{pairing}: Write, Read and Send of {SIZES:?} octets per combination (16 MiB in some)"
    );
    let (srv, cli) = (MatrixMem::new(), MatrixMem::new());
    let mut combos = Vec::new();
    for rev in [1, 2] {
        for crc in [Crc::Off, Crc::Both, Crc::ClientOnly, Crc::ServerOnly] {
            for markers in [
                Markers::None,
                Markers::ToServer,
                Markers::ToClient,
                Markers::Both,
            ] {
                combos.push(Combo {
                    rev,
                    crc,
                    markers,
                    rtr: None,
                });
            }
        }
    }
    // The peer-to-peer model, each RTR kind (the initiator's first FPDU).
    for (kind, markers) in [
        (mpa::RtrKind::Send, Markers::None),
        (mpa::RtrKind::Write, Markers::Both),
        (mpa::RtrKind::Read, Markers::ToServer),
    ] {
        combos.push(Combo {
            rev: 2,
            crc: Crc::Both,
            markers,
            rtr: Some(kind),
        });
    }
    // One listener per server-side setting, kept for the whole run (an engine's port stays
    // steered until the engine stops).
    let mut listeners: Vec<((u8, bool, bool), Listener)> = Vec::new();
    let mut port = 19_600;
    let mut failures = Vec::new();
    for (n, combo) in combos.iter().enumerate() {
        let sp = combo.server_params();
        let key = (sp.mpa.rev, sp.mpa.crc, sp.mpa.markers);
        let idx = match listeners.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                port += 1;
                listeners.push((key, server.listen(port, sp)));
                listeners.len() - 1
            }
        };
        let listener = &listeners[idx].1;
        let addr = SocketAddr::from((server_addr, listener.local_addr().unwrap().port()));
        let t = Instant::now();
        let res = run_combo(
            listener,
            client,
            addr,
            *combo,
            combo.sizes(),
            n as u64 + 1,
            &srv,
            &cli,
        );
        println!(
            "{pairing}: rev {} crc {:?} markers {:?} rtr {:?}: {} in {:?}",
            combo.rev,
            combo.crc,
            combo.markers,
            combo.rtr,
            match &res {
                Ok(()) => "verified".to_string(),
                Err(e) => format!("FAILED: {e}"),
            },
            t.elapsed()
        );
        if let Err(e) = res {
            failures.push(format!("{combo:?}: {e}"));
            // Leave no completion behind for the next combination.
            while srv.cq.try_next().is_some() || cli.cq.try_next().is_some() {}
        }
    }
    println!(
        "{pairing}: {} combinations, {} failed, {:?}",
        combos.len(),
        failures.len(),
        t0.elapsed()
    );
    assert!(failures.is_empty(), "{pairing}: {failures:#?}");
}

#[test]
fn matrix_engine_to_engine() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    let b = start_engine(NS_B, DEV_B);
    matrix(
        "engine<->engine",
        Stack::Engine(&a),
        Stack::Engine(&b),
        ADDR_A,
    );
    let ca = stop_and_check("server (iwa)", a, 0);
    let cb = stop_and_check("client (iwb)", b, 0);
    assert_eq!((ca.established, cb.established), (35, 35));
}

#[test]
fn matrix_engine_server_socket_client() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    matrix(
        "engine server<-socket client",
        Stack::Engine(&a),
        Stack::Socket,
        ADDR_A,
    );
    let ca = stop_and_check("server (iwa)", a, 0);
    assert_eq!(ca.established, 35);
}

#[test]
fn matrix_socket_server_engine_client() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    matrix(
        "socket server<-engine client",
        Stack::Socket,
        Stack::Engine(&a),
        ADDR_B,
    );
    let ca = stop_and_check("client (iwa)", a, 0);
    assert_eq!(ca.established, 35);
}

// ---------------------------------------------------------------------------------------------
// 2. Reject with private data

/// `server` rejects the first request with private data (the client must see the reject and
/// the data), then accepts the second one, which must work.
fn reject_case(server: Stack<'_>, client: Stack<'_>, server_addr: Ipv4Addr, rev: u8, port: u16) {
    let p = params(mpa(rev, true, false));
    let listener = server.listen(port, p.clone());
    let addr = SocketAddr::from((server_addr, port));
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let why = format!("no room at the inn (rev {rev})");
    // `client` connects with `private_data`; the listener's side does `answer` with the request.
    let answered = |private_data: &[u8], answer: &(dyn Fn(ConnectRequest) + Sync)| {
        std::thread::scope(|s| {
            let srv = s.spawn(|| {
                let req = listener
                    .accept_timeout(WAIT)
                    .expect("accept")
                    .expect("no request in time");
                assert_eq!(req.private_data(), private_data);
                answer(req);
            });
            let res = client.connect(addr, &pd, &cq, &p, private_data);
            srv.join().expect("answering thread");
            res
        })
    };
    let res = answered(b"may I?", &|req| {
        req.reject(why.as_bytes()).expect("reject")
    });
    match res {
        Err(DatapathError::Rejected {
            private_data,
            peer_params,
        }) => {
            assert_eq!(private_data, why.as_bytes(), "reject private data");
            // RFC 6581 9.1: a revision 2 Reject's IRD and ORD reach the application.
            assert_eq!(peer_params.is_some(), rev == 2, "{peer_params:?}");
        }
        Err(e) => panic!("{} client: {e}, want a reject", client.name()),
        Ok(_) => panic!("{} client: connected, want a reject", client.name()),
    }
    // A request dropped unanswered is rejected, without private data (as iw_cm does for an
    // id destroyed with a connect request): the initiator hears of it at once. It waited for
    // the accept timeout before, and the engine held the connection that long.
    match answered(b"anyone?", &drop::<ConnectRequest>) {
        Err(DatapathError::Rejected { private_data, .. }) => assert!(private_data.is_empty()),
        Err(e) => panic!(
            "{} client: {e}, want a reject of the dropped request",
            client.name()
        ),
        Ok(_) => panic!("{} client: connected to a dropped request", client.name()),
    }
    // The same listener serves the next request.
    let (spd, scq) = (ProtectionDomain::new(), CompletionQueue::new());
    let buf = spd.register(4096, ALL).unwrap();
    let src = pd.register(4096, ALL).unwrap();
    let data = pattern(u64::from(port), 3000);
    src.write(0, &data);
    let (c, s) = establish(
        &listener,
        &spd,
        &scq,
        b"welcome",
        vec![sge_recv(&buf, 7, 0, 4096)],
        || client.connect(addr, &pd, &cq, &p, b"again"),
    )
    .unwrap_or_else(|e| panic!("after the reject: {e}"));
    assert_eq!(c.private_data, b"welcome");
    c.qp.post_send(send_wr(1, &src, 0, 3000)).unwrap();
    expect_wc(&cq, 1, WcOpcode::Send, WcStatus::Success).unwrap();
    let r = expect_wc(&scq, 7, WcOpcode::Recv, WcStatus::Success).unwrap();
    assert_eq!(r.wc.byte_len, 3000);
    check_bytes(&bytes(&buf, 0, 3000), &data, "Send after the reject").unwrap();
    drop(c);
    assert!(s.qp.wait_finished(WAIT));
    s.qp.disconnect();
    println!(
        "{} server rejected {} client (rev {rev}) with {} octets of private data, then served \
         the next connection",
        server.name(),
        client.name(),
        why.len()
    );
}

/// An accept that fails locally (its receive work request is refused) on the engine: the
/// request is used up, so it is rejected at once, and the client must hear the reject (not
/// wait for its MPA timeout); the listener serves the next one.
fn failed_accept_case(engine: &XdpEngine, client: Stack<'_>, port: u16) {
    let mut lp = params(mpa(2, true, false));
    // Far beyond the client's: only a prompt answer can end the client's wait in time.
    lp.mpa.timeout = Duration::from_secs(300);
    let listener = engine.listen(port, lp).expect("listen");
    let addr = SocketAddr::from((ADDR_A, port));
    let mut cp = params(mpa(2, true, false));
    cp.mpa.timeout = Duration::from_secs(20);
    cp.setup_timeout = Duration::from_secs(20);
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let (spd, scq) = (ProtectionDomain::new(), CompletionQueue::new());
    let small = spd.register(4096, ALL).unwrap();
    let t = Instant::now();
    let (c, s) = std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let req = listener
                .accept_timeout(WAIT)
                .expect("accept")
                .expect("no request in time");
            // 8 KiB into a 4 KiB region: refused, and the Request rejected.
            req.accept_with_recvs(&spd, &scq, b"", vec![sge_recv(&small, 1, 0, 8192)])
                .map(|_| ())
        });
        let c = client.connect(addr, &pd, &cq, &cp, b"x").map(|_| ());
        (c, srv.join().expect("accepting thread"))
    });
    assert!(
        matches!(s, Err(DatapathError::InvalidArgument(_))),
        "engine accept: {s:?}"
    );
    match c {
        Err(DatapathError::Rejected { .. }) => {}
        other => panic!("{} client: {other:?}, want a reject", client.name()),
    }
    println!(
        "engine's failed accept: {} client was rejected after {:?}",
        client.name(),
        t.elapsed()
    );
    let buf = spd.register(4096, ALL).unwrap();
    let (c, s) = establish(
        &listener,
        &spd,
        &scq,
        b"",
        vec![sge_recv(&buf, 2, 0, 4096)],
        || client.connect(addr, &pd, &cq, &cp, b"y"),
    )
    .unwrap_or_else(|e| panic!("after the failed accept: {e}"));
    drop(c);
    assert!(s.qp.wait_finished(WAIT));
    s.qp.disconnect();
}

#[test]
fn reject_with_private_data() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    let b = start_engine(NS_B, DEV_B);
    for rev in [1, 2] {
        let port = 19_700 + u16::from(rev) * 10;
        reject_case(Stack::Engine(&a), Stack::Socket, ADDR_A, rev, port);
        reject_case(Stack::Socket, Stack::Engine(&a), ADDR_B, rev, port + 1);
        reject_case(Stack::Engine(&a), Stack::Engine(&b), ADDR_A, rev, port + 2);
    }
    failed_accept_case(&a, Stack::Socket, 19_750);
    failed_accept_case(&a, Stack::Engine(&b), 19_751);
    let ca = stop_and_check("iwa", a, 0);
    stop_and_check("iwb", b, 0);
    assert_eq!(ca.conns.terminates_sent + ca.conns.terminates_received, 0);
}

// ---------------------------------------------------------------------------------------------
// 3. 64 connections at once

const CONNS: usize = 64;
/// Per connection: a Write and a Read of this size, and a Send of a quarter of it.
const CHUNK: usize = 128 << 10;

/// `CONNS` clients connect to the engine in `iwa` at once; once all are up (a barrier), each
/// writes, reads and sends its own data, verified on both ends; once all are verified (a
/// barrier), all disconnect. Every close must be clean (no Terminate, no flushed work).
fn many_connections(server: &XdpEngine, client: Stack<'_>, port: u16) {
    let t0 = Instant::now();
    let p = params(mpa(2, true, false));
    let listener = server.listen(port, p.clone()).expect("listen");
    let addr = SocketAddr::from((ADDR_A, port));
    let spd = ProtectionDomain::new();
    let wtarget = spd.register(CONNS * CHUNK, ALL).unwrap();
    let rsource = spd.register(CONNS * CHUNK, ALL).unwrap();
    let recvbuf = spd.register(CONNS * CHUNK, ALL).unwrap();
    let cpd = ProtectionDomain::new();
    let wsource = cpd.register(CONNS * CHUNK, ALL).unwrap();
    let rsink = cpd.register(CONNS * CHUNK, ALL).unwrap();
    let ssource = cpd.register(CONNS * CHUNK, ALL).unwrap();
    for i in 0..CONNS {
        let off = i * CHUNK;
        rsource.write(off, &pattern(10_000 + i as u64, CHUNK));
        wsource.write(off, &pattern(20_000 + i as u64, CHUNK));
        ssource.write(off, &pattern(30_000 + i as u64, CHUNK / 4));
    }
    let all_up = Barrier::new(CONNS);
    let all_done = Barrier::new(CONNS);
    let errors = std::sync::Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        // The server: accepts every connection (each with its own CQ and one posted receive),
        // then checks each connection's Write and Send on its own thread.
        let srv = s.spawn(|| {
            let mut conns = Vec::new();
            for _ in 0..CONNS {
                let req = match listener.accept_timeout(WAIT) {
                    Ok(Some(r)) => r,
                    Ok(None) => return Err(format!("no request after {}", conns.len())),
                    Err(e) => return Err(format!("accept after {}: {e}", conns.len())),
                };
                let i: usize = match std::str::from_utf8(req.private_data())
                    .ok()
                    .and_then(|t| t.parse().ok())
                {
                    Some(i) if i < CONNS => i,
                    _ => return Err(format!("request private data {:?}", req.private_data())),
                };
                let cq = CompletionQueue::new();
                let recv = sge_recv(&recvbuf, i as u64, i * CHUNK, CHUNK / 4);
                let mut welcome = Vec::new();
                for mr in [&wtarget, &rsource] {
                    welcome.extend_from_slice(&mr.stag().0.to_be_bytes());
                    welcome.extend_from_slice(&mr.base_to().to_be_bytes());
                }
                let conn = req
                    .accept_with_recvs(&spd, &cq, &welcome, vec![recv])
                    .map_err(|e| format!("accept {i}: {e}"))?;
                conns.push((i, conn, cq));
            }
            let checks: Vec<_> = conns
                .into_iter()
                .map(|(i, conn, cq)| {
                    let (wtarget, recvbuf) = (&wtarget, &recvbuf);
                    s.spawn(move || -> Result<(), String> {
                        let off = i * CHUNK;
                        let r = expect_wc(&cq, i as u64, WcOpcode::Recv, WcStatus::Success)
                            .map_err(|e| format!("server {i}: {e}"))?;
                        if r.wc.byte_len as usize != CHUNK / 4 {
                            return Err(format!("server {i}: {} octets", r.wc.byte_len));
                        }
                        check_bytes(
                            &bytes(recvbuf, off, CHUNK / 4),
                            &pattern(30_000 + i as u64, CHUNK / 4),
                            &format!("server {i}: Send"),
                        )?;
                        check_bytes(
                            &bytes(wtarget, off, CHUNK),
                            &pattern(20_000 + i as u64, CHUNK),
                            &format!("server {i}: Write"),
                        )?;
                        if !conn.qp.wait_finished(WAIT) {
                            return Err(format!("server {i}: not closed: {:?}", conn.qp.status()));
                        }
                        conn.qp.disconnect();
                        let st = conn.qp.status();
                        if st.sent_terminate.is_some() || st.remote_terminate.is_some() {
                            return Err(format!("server {i}: {st:?}"));
                        }
                        if let Some(x) = cq.try_next() {
                            return Err(format!("server {i}: unexpected completion {x:?}"));
                        }
                        Ok(())
                    })
                })
                .collect();
            let mut errs = Vec::new();
            for c in checks {
                if let Err(e) = c.join().expect("server check thread") {
                    errs.push(e);
                }
            }
            if errs.is_empty() {
                Ok(())
            } else {
                Err(errs.join("; "))
            }
        });
        let clients: Vec<_> = (0..CONNS)
            .map(|i| {
                let (p, cpd) = (&p, &cpd);
                let (wsource, rsink, ssource) = (&wsource, &rsink, &ssource);
                let (all_up, all_done, errors) = (&all_up, &all_done, &errors);
                let f = move || {
                    let cq = CompletionQueue::new();
                    let res = match client {
                        Stack::Engine(e) => e.connect(addr, cpd, &cq, p, i.to_string().as_bytes()),
                        Stack::Socket => {
                            datapath::connect(addr, cpd, &cq, p, i.to_string().as_bytes())
                        }
                    };
                    // Every thread reaches both barriers, failed or not.
                    all_up.wait();
                    let run = || -> Result<datapath::QueuePair, String> {
                        let c = res.map_err(|e| format!("client {i}: connect: {e}"))?;
                        let w = &c.private_data;
                        // Checked here: a panic below would leave the others at `all_done`.
                        if w.len() < 24 {
                            return Err(format!("client {i}: private data {w:?}"));
                        }
                        let stag =
                            |o: usize| Stag(u32::from_be_bytes(w[o..o + 4].try_into().unwrap()));
                        let to =
                            |o: usize| u64::from_be_bytes(w[o + 4..o + 12].try_into().unwrap());
                        let off = i * CHUNK;
                        let post = |wr| c.qp.post_send(wr).map_err(|e| format!("post: {e}"));
                        post(write_wr(
                            1,
                            wsource,
                            off,
                            CHUNK,
                            stag(0),
                            to(0) + off as u64,
                        ))?;
                        post(read_wr(2, rsink, off, CHUNK, stag(12), to(12) + off as u64))?;
                        post(send_wr(3, ssource, off, CHUNK / 4))?;
                        for (id, op) in [
                            (1, WcOpcode::Write),
                            (2, WcOpcode::Read),
                            (3, WcOpcode::Send),
                        ] {
                            expect_wc(&cq, id, op, WcStatus::Success)
                                .map_err(|e| format!("client {i}: {e}; {:?}", c.qp.status()))?;
                        }
                        check_bytes(
                            &bytes(rsink, off, CHUNK),
                            &pattern(10_000 + i as u64, CHUNK),
                            &format!("client {i}: Read"),
                        )?;
                        Ok(c.qp)
                    };
                    let qp = run();
                    all_done.wait();
                    let res = qp.and_then(|qp| {
                        qp.disconnect();
                        let st = qp.status();
                        if !st.finished
                            || st.sent_terminate.is_some()
                            || st.remote_terminate.is_some()
                            || st.error.is_some()
                        {
                            return Err(format!("client {i}: unclean close {st:?}"));
                        }
                        if let Some(x) = cq.try_next() {
                            return Err(format!("client {i}: unexpected completion {x:?}"));
                        }
                        Ok(())
                    });
                    if let Err(e) = res {
                        errors.lock().unwrap().push(e);
                    }
                };
                match client {
                    Stack::Engine(_) => s.spawn(f),
                    Stack::Socket => scoped_in_ns(s, NS_B, f),
                }
            })
            .collect();
        for c in clients {
            c.join().expect("client thread");
        }
        if let Err(e) = srv.join().expect("server thread") {
            errors.lock().unwrap().push(e);
        }
    });
    let errors = errors.into_inner().unwrap();
    println!(
        "{CONNS} {} clients -> engine server: {} failed, {:?} ({} KiB Write + {} KiB Read + {} \
         KiB Send each, all open at once)",
        client.name(),
        errors.len(),
        t0.elapsed(),
        CHUNK >> 10,
        CHUNK >> 10,
        CHUNK >> 12
    );
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn sixty_four_connections_engine_to_engine() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    let b = start_engine(NS_B, DEV_B);
    many_connections(&a, Stack::Engine(&b), 19_800);
    let ca = stop_and_check("server (iwa)", a, 0);
    let cb = stop_and_check("client (iwb)", b, 0);
    assert_eq!((ca.established, cb.established), (64, 64));
    assert_eq!(ca.ended, 64, "server connections removed after close");
    let t = ca.conns.terminates_sent + ca.conns.terminates_received;
    assert_eq!(
        t + cb.conns.terminates_sent + cb.conns.terminates_received,
        0
    );
}

#[test]
fn sixty_four_connections_socket_clients() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    many_connections(&a, Stack::Socket, 19_801);
    let ca = stop_and_check("server (iwa)", a, 0);
    assert_eq!(ca.established, 64);
    assert_eq!(ca.ended, 64, "server connections removed after close");
    assert_eq!(ca.conns.terminates_sent + ca.conns.terminates_received, 0);
}

// ---------------------------------------------------------------------------------------------
// 4. Terminates for bad FPDUs from the wire, while another connection keeps working

const TREGION: usize = 16 << 10;

/// The engine server's memory for the bad peers, every region pre-filled with `before`.
struct Victim {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    /// LOCAL_WRITE | REMOTE_WRITE: writable by the peer, not readable.
    target: MemoryRegion,
    /// LOCAL_WRITE | REMOTE_READ: readable, not writable, by the peer.
    readable: MemoryRegion,
    /// LOCAL_WRITE only (the posted receives).
    private: MemoryRegion,
    before: Vec<u8>,
}

/// What a bad peer does on its connection.
#[derive(Clone, Copy, Debug)]
enum Bad {
    /// A tagged Write naming an STag the engine never registered.
    WriteInvalidStag,
    /// A Write of several segments starting inside the target region and running past its end.
    WriteBeyondEnd,
    /// A Write into a region registered without REMOTE_WRITE.
    WriteWithoutAccess,
    /// A Read Request whose source STag the engine never registered.
    ReadInvalidSourceStag,
}

const UNREGISTERED: Stag = Stag::new(0x00AB_CDEF, 0x5A);
const BAD_WRITE_LEN: usize = 6000;

impl Bad {
    /// (Layer, EType, Error Code) of the Terminate: RFC 5041 7.2 for the sink of a tagged
    /// Write (DDP tagged buffer errors; access rights, which DDP has no code for, an invalid
    /// STag, as siw), RFC 5040 7 / Figure 10 remote protection for a Read Request's source.
    fn want(self) -> (u8, u8, u8) {
        match self {
            Bad::WriteInvalidStag | Bad::WriteWithoutAccess => (layer::DDP, 1, 0x00),
            Bad::WriteBeyondEnd => (layer::DDP, 1, 0x01),
            Bad::ReadInvalidSourceStag => (layer::RDMAP, rdmap_etype::REMOTE_PROTECTION, 0x00),
        }
    }

    /// The remote STag and TO the bad work request names.
    fn target(self, v: &Victim) -> (Stag, u64) {
        match self {
            Bad::WriteInvalidStag => (UNREGISTERED, v.target.base_to()),
            Bad::WriteBeyondEnd => (
                v.target.stag(),
                v.target.base_to() + (TREGION - 3000) as u64,
            ),
            Bad::WriteWithoutAccess => (v.readable.stag(), v.readable.base_to()),
            Bad::ReadInvalidSourceStag => (UNREGISTERED, v.readable.base_to()),
        }
    }
}

/// Which end of the bad peer's connection the engine is.
#[derive(Clone, Copy)]
enum Role<'a> {
    /// The engine accepts on `listener`; the peer connects with `peer`.
    EngineServer {
        listener: &'a Listener,
        addr: SocketAddr,
        peer: Stack<'a>,
    },
    /// The engine connects to the peer: the socket transport listening in `iwb`.
    EngineClient {
        engine: &'a XdpEngine,
        listener: &'a Listener,
        addr: SocketAddr,
    },
}

/// One bad peer on its own connection to the engine: the bad work request goes on the wire
/// from `peer`; the peer must receive the Terminate `bad.want()` with the copied headers of RFC
/// 5040 Figure 10, the engine must have sent exactly that one and flushed its posted receive,
/// and nothing may be written outside what the request could legally reach.
fn bad_peer(role: Role<'_>, v: &Victim, bad: Bad) -> Result<(), String> {
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let src = pd.register(TREGION, ALL).unwrap();
    let data = pattern(4242, BAD_WRITE_LEN);
    src.write(0, &data);
    let sink = pd.register(TREGION, ALL).unwrap();
    let p = params(mpa(2, true, false));
    // `c` is the peer's queue pair, `s` the engine's.
    let (c, s) = match role {
        Role::EngineServer {
            listener,
            addr,
            peer,
        } => establish(
            listener,
            &v.pd,
            &v.cq,
            &[],
            vec![sge_recv(&v.private, 1, 0, 64)],
            || peer.connect(addr, &pd, &cq, &p, format!("{bad:?}").as_bytes()),
        )?,
        Role::EngineClient {
            engine,
            listener,
            addr,
        } => {
            let rbuf = pd.register(64, ALL).unwrap();
            let (s, c) = establish(
                listener,
                &pd,
                &cq,
                &[],
                vec![sge_recv(&rbuf, 7, 0, 64)],
                || engine.connect(addr, &v.pd, &v.cq, &p, format!("{bad:?}").as_bytes()),
            )?;
            // The engine posts its receive, then sends first: the socket transport's Responder
            // sends nothing before a valid FPDU (RFC 5044 7.1.2 rule 4).
            let post =
                s.qp.post_recv(sge_recv(&v.private, 1, 0, 64))
                    .and_then(|()| s.qp.post_send(send_wr(5, &v.private, 1024, 16)));
            post.map_err(|e| format!("engine post: {e}"))?;
            expect_wc(&v.cq, 5, WcOpcode::Send, WcStatus::Success)?;
            expect_wc(&cq, 7, WcOpcode::Recv, WcStatus::Success)?;
            (c, s)
        }
    };
    let (stag, to) = bad.target(v);
    let is_read = matches!(bad, Bad::ReadInvalidSourceStag);
    let wr = if is_read {
        read_wr(10, &sink, 0, 64, stag, to)
    } else {
        let len = match bad {
            Bad::WriteBeyondEnd => BAD_WRITE_LEN,
            _ => 100,
        };
        write_wr(10, &src, 0, len, stag, to)
    };
    c.qp.post_send(wr).map_err(|e| format!("post: {e}"))?;
    if !c.qp.wait_finished(WAIT) || !s.qp.wait_finished(WAIT) {
        return Err(format!(
            "did not end: peer {:?}, engine {:?}",
            c.qp.status(),
            s.qp.status()
        ));
    }
    let (cs, ss) = (c.qp.status(), s.qp.status());
    let term = cs
        .remote_terminate
        .ok_or_else(|| format!("the peer got no Terminate: {cs:?}; engine {ss:?}"))?;
    if (term.layer, term.etype, term.code) != bad.want() {
        return Err(format!("Terminate {term:?}, want {:?}", bad.want()));
    }
    if ss.sent_terminate.as_ref() != Some(&term) || ss.remote_terminate.is_some() {
        return Err(format!("engine side {ss:?}, peer got {term:?}"));
    }
    if cs.state != QpState::Error || ss.state != QpState::Error {
        return Err(format!(
            "states: peer {:?}, engine {:?}",
            cs.state, ss.state
        ));
    }
    // RFC 5040 Figure 10: the refused segment's DDP header (and, for a Read Request, the
    // Read Request header).
    let copied = term
        .ddp_header
        .as_ref()
        .ok_or_else(|| format!("no DDP header in {term:?}"))?;
    let header = DdpHeader::parse(copied.as_bytes())
        .map_err(|e| format!("copied DDP header: {e}"))?
        .0;
    match (bad, header) {
        (Bad::ReadInvalidSourceStag, DdpHeader::Untagged(h)) => {
            if (h.qn, h.msn) != (1, 1) {
                return Err(format!("copied header {h:?}"));
            }
            let want = ReadRequest {
                sink_stag: sink.stag().raw(),
                sink_to: sink.base_to(),
                size: 64,
                src_stag: stag.raw(),
                src_to: to,
            };
            if term.read_request != Some(want) {
                return Err(format!("Read Request in the Terminate: {term:?}"));
            }
        }
        (Bad::WriteBeyondEnd, DdpHeader::Tagged(h)) => {
            // The first segment that does not fit; the ones before it may have been placed.
            let end = v.target.base_to() + TREGION as u64;
            let seg_end = h.to + u64::from(term.segment_len.unwrap_or(0));
            if h.stag != stag.raw() || h.to < to || h.to >= end || seg_end <= end {
                return Err(format!("copied header {h:?}, {term:?}"));
            }
        }
        (_, DdpHeader::Tagged(h)) if !is_read => {
            if (h.stag, h.to, h.last) != (stag.raw(), to, true) || term.segment_len != Some(100) {
                return Err(format!("copied header {h:?}, {term:?}"));
            }
        }
        (_, h) => return Err(format!("copied header {h:?}")),
    }
    // The work completions. A refused Read completes with a remote access error. A refused
    // Write: the socket transport completed it when it was handed to TCP, before the peer could
    // object (Success); the engine completes it only when TCP reports it acknowledged, and the
    // segment carrying the Terminate (which acknowledges the refused octets, and with the
    // multi-segment WriteBeyondEnd maybe those after them) is processed before the Sends and
    // Writes it acknowledges complete: the Terminate names the Write (STag, TO) and it
    // completes with a remote access error. Exact while no ACK covering the Write's last octet
    // overtakes the segment carrying the Terminate (the engine sends nothing before it; a lost
    // and retransmitted Terminate segment on a lossy path could be overtaken).
    let acked_completion = matches!(
        role,
        Role::EngineServer {
            peer: Stack::Engine(_),
            ..
        }
    );
    let want = if is_read || acked_completion {
        WcStatus::RemoteAccessError
    } else {
        WcStatus::Success
    };
    let opcode = if is_read {
        WcOpcode::Read
    } else {
        WcOpcode::Write
    };
    expect_wc(&cq, 10, opcode, want)?;
    expect_wc(&v.cq, 1, WcOpcode::Recv, WcStatus::WrFlushError)?;
    if let Some(x) = cq.try_next().or_else(|| v.cq.try_next()) {
        return Err(format!("unexpected completion {x:?}"));
    }
    check_bytes(
        &bytes(&sink, 0, TREGION),
        &vec![0; TREGION],
        "peer's Read sink",
    )?;
    // Nothing written outside the region: the other regions untouched, and the target
    // changed only by segments of the out-of-bounds Write that fit inside it.
    check_bytes(
        &bytes(&v.readable, 0, TREGION),
        &v.before,
        "readable region",
    )?;
    check_bytes(&bytes(&v.private, 0, TREGION), &v.before, "private region")?;
    let now = bytes(&v.target, 0, TREGION);
    // Where the out-of-bounds Write starts in the target (the other bad requests name other
    // regions, at addresses that may lie below the target's).
    let start = match bad {
        Bad::WriteBeyondEnd => Some((to - v.target.base_to()) as usize),
        _ => None,
    };
    for (i, (&got, &was)) in now.iter().zip(&v.before).enumerate() {
        let written = match start {
            Some(start) if i >= start => Some(data[i - start]),
            _ => None,
        };
        if got != was && Some(got) != written {
            return Err(format!("target region octet {i} changed"));
        }
    }
    // For the next peer.
    v.target.write(0, &v.before);
    Ok(())
}

/// What a raw peer (kernel TCP plus our `mpa` and `ddp` crates, no queue pair) sends after one
/// valid FPDU: FPDUs no conforming sender would produce.
#[derive(Clone, Copy, Debug)]
enum Raw {
    /// A Write into the target region whose CRC does not match (one payload octet flipped
    /// after framing).
    CrcMismatch,
    /// A Send with MSN 2 while only one receive is posted (and unused).
    SendWithoutBuffer,
    /// A Send of 100 octets into the posted 64-octet receive.
    SendTooLong,
    /// An untagged segment on queue number 3 (RDMAP uses 0, 1 and 2).
    InvalidQueueNumber,
    /// A tagged segment with DDP version 2.
    DdpVersion,
    /// An RDMA Write whose RDMAP version is 2.
    RdmapVersion,
}

impl Raw {
    /// RFC 5044 8 (LLP code 2), RFC 5041 7.2, RFC 5040 Figure 9.
    fn want(self) -> (u8, u8, u8) {
        match self {
            Raw::CrcMismatch => (layer::LLP, 0, 0x02),
            Raw::SendWithoutBuffer => (layer::DDP, 2, 0x02),
            Raw::SendTooLong => (layer::DDP, 2, 0x05),
            Raw::InvalidQueueNumber => (layer::DDP, 2, 0x01),
            Raw::DdpVersion => (layer::DDP, 1, 0x04),
            Raw::RdmapVersion => (layer::RDMAP, rdmap_etype::REMOTE_OPERATION, 0x05),
        }
    }
}

/// An RDMAP control byte: RV 1 (or `rv`) and the opcode (RFC 5040 4.3).
fn rdmap_ctrl(rv: u8, opcode: rdmap::Opcode) -> u8 {
    (rv << 6) | opcode as u8
}

fn tagged_ulpdu(ctrl: u8, stag: Stag, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0u8; ddp::TAGGED_HEADER_LEN];
    DdpHeader::Tagged(ddp::TaggedHeader {
        last: true,
        rsvd_ulp: ctrl,
        stag: stag.raw(),
        to,
    })
    .emit(&mut u);
    u.extend_from_slice(payload);
    u
}

fn untagged_ulpdu(ctrl: u8, qn: u32, msn: u32, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0u8; ddp::UNTAGGED_HEADER_LEN];
    DdpHeader::Untagged(ddp::UntaggedHeader {
        last: true,
        rsvd_ulp: [ctrl, 0, 0, 0, 0],
        qn,
        msn,
        mo: 0,
    })
    .emit(&mut u);
    u.extend_from_slice(payload);
    u
}

/// A raw peer in `iwb` over kernel TCP: MPA startup with `mpa::Initiator`, one valid RDMA Write
/// (which rewrites the first 64 octets of the target with what they already hold, so the
/// Responder may send, RFC 5044 7.1.2 rule 4), then the bad FPDU; it reads FPDUs until the
/// Terminate and the close. Checks the Terminate, the engine's own account of it, its posted
/// receive ended in error, and the engine's regions unchanged.
fn raw_peer(addr: SocketAddr, listener: &Listener, v: &Victim, bad: Raw) -> Result<(), String> {
    use std::io::{Read, Write};
    let accepted = std::thread::scope(|s| {
        let srv = s.spawn(|| -> Result<Connection, String> {
            let req = listener
                .accept_timeout(WAIT)
                .map_err(|e| format!("accept: {e}"))?
                .ok_or("no request in time")?;
            req.accept_with_recvs(&v.pd, &v.cq, b"", vec![sge_recv(&v.private, 1, 0, 64)])
                .map_err(|e| format!("accept: {e}"))
        });
        let peer = in_ns(NS_B, || -> Result<_, String> {
            let now = Instant::now();
            let mut init =
                mpa::Initiator::new(mpa(2, true, false), b"raw", now).map_err(|e| e.to_string())?;
            let mut tcp = std::net::TcpStream::connect_timeout(&addr, WAIT)
                .map_err(|e| format!("connect: {e}"))?;
            tcp.set_read_timeout(Some(WAIT))
                .map_err(|e| e.to_string())?;
            tcp.write_all(init.request()).map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; 4096];
            let mut pending = Vec::new();
            loop {
                let n = tcp.read(&mut buf).map_err(|e| format!("reply: {e}"))?;
                if n == 0 {
                    return Err("closed before the MPA Reply".into());
                }
                pending.extend_from_slice(&buf[..n]);
                let (used, ev) = init
                    .feed(&pending, Instant::now())
                    .map_err(|e| format!("MPA: {e}"))?;
                pending.drain(..used);
                match ev {
                    mpa::InitiatorEvent::NeedMore => continue,
                    mpa::InitiatorEvent::Accepted { negotiated, .. } => {
                        return Ok((tcp, negotiated, pending))
                    }
                    mpa::InitiatorEvent::Rejected { .. } => return Err("rejected".into()),
                }
            }
        });
        let s = srv.join().expect("accepting thread");
        match (peer, s) {
            (Ok(p), Ok(s)) => Ok((p, s)),
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    });
    let ((mut tcp, negotiated, leftover), s) = accepted?;
    let mut enc = negotiated.encoder();
    let mut out = Vec::new();
    let write = rdmap_ctrl(1, rdmap::Opcode::Write);
    let (tstag, tto) = (v.target.stag(), v.target.base_to());
    let first = tagged_ulpdu(write, tstag, tto, &v.before[..64]);
    enc.encode(&first, &mut out).map_err(|e| e.to_string())?;
    let send = rdmap_ctrl(1, rdmap::Opcode::Send);
    let payload = pattern(31, 100);
    let ulpdu = match bad {
        Raw::CrcMismatch => tagged_ulpdu(write, tstag, tto + 1000, &payload),
        Raw::SendWithoutBuffer => untagged_ulpdu(send, 0, 2, &payload[..10]),
        Raw::SendTooLong => untagged_ulpdu(send, 0, 1, &payload),
        Raw::InvalidQueueNumber => untagged_ulpdu(send, 3, 1, &payload[..10]),
        Raw::DdpVersion => {
            let mut u = tagged_ulpdu(write, tstag, tto + 1000, &payload);
            u[0] = (u[0] & !0x03) | 2;
            u
        }
        Raw::RdmapVersion => {
            tagged_ulpdu(rdmap_ctrl(2, rdmap::Opcode::Write), tstag, tto, &payload)
        }
    };
    let at = out.len();
    enc.encode(&ulpdu, &mut out).map_err(|e| e.to_string())?;
    if matches!(bad, Raw::CrcMismatch) {
        // MPA header (2) + DDP header (14) + 10 octets into the payload.
        out[at + 2 + ddp::TAGGED_HEADER_LEN + 10] ^= 0x5a;
    }
    in_ns(NS_B, || tcp.write_all(&out)).map_err(|e| format!("send: {e}"))?;
    // Read FPDUs until the connection closes; the Terminate is on queue 2.
    let mut dec = negotiated.decoder();
    let mut term = None;
    let mut feed = |bytes: &[u8]| -> Result<(), String> {
        dec.feed(bytes, |u| {
            if let Ok((DdpHeader::Untagged(h), payload)) = DdpHeader::parse(u) {
                if h.qn == 2 {
                    term = Some(rdmap::TerminateHeader::parse(payload));
                }
            }
        })
        .map_err(|e| format!("peer's decoder: {e}"))
    };
    feed(&leftover)?;
    let mut buf = vec![0u8; 4096];
    let deadline = Instant::now() + WAIT;
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => feed(&buf[..n])?,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => return Err(format!("reading: {e}")),
        }
        if Instant::now() > deadline {
            return Err("the engine did not close".into());
        }
    }
    let term = term
        .ok_or("no Terminate before the close")?
        .map_err(|e| format!("Terminate: {e}"))?;
    if (term.layer, term.etype, term.code) != bad.want() {
        return Err(format!("Terminate {term:?}, want {:?}", bad.want()));
    }
    if !s.qp.wait_finished(WAIT) {
        return Err(format!("engine side did not end: {:?}", s.qp.status()));
    }
    let ss = s.qp.status();
    if ss.sent_terminate != Some(term) || ss.state != QpState::Error {
        return Err(format!("engine side {ss:?}, peer got {term:?}"));
    }
    // Figure 10: DDP errors copy the DDP header of the segment, LLP errors copy nothing.
    let copied = term.ddp_header.map(|h| h.as_bytes().to_vec());
    let want_copy =
        (term.layer != layer::LLP).then(|| ulpdu[..copied.as_ref().map_or(0, Vec::len)].to_vec());
    if copied != want_copy {
        return Err(format!("copied header {copied:?}, want {want_copy:?}"));
    }
    let r = next(&v.cq, "the engine's posted receive")?;
    if r.wc.wr_id != 1 || r.wc.status == WcStatus::Success {
        return Err(format!("the engine's receive: {r:?}"));
    }
    if let Some(x) = v.cq.try_next() {
        return Err(format!("unexpected completion {x:?}"));
    }
    for (what, mr) in [
        ("target", &v.target),
        ("readable", &v.readable),
        ("private", &v.private),
    ] {
        check_bytes(&bytes(mr, 0, TREGION), &v.before, &format!("{what} region"))?;
    }
    Ok(())
}

/// The bystander: on its own connection to the same engine, Writes 64 KiB then Reads it back
/// (RFC 5040 5.5: a Read Request is served after it is delivered, so it sees the Write before
/// it), checks it, and counts rounds until `stop`.
fn bystander(
    c: &Connection,
    cq: &CompletionQueue,
    pd: &ProtectionDomain,
    remote: (Stag, u64),
    rounds: &AtomicU64,
    stop: &AtomicBool,
) -> Result<(), String> {
    const LEN: usize = 64 << 10;
    let src = pd.register(LEN, ALL).unwrap();
    let sink = pd.register(LEN, ALL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() > deadline {
            return Err("bystander ran out of time".into());
        }
        n += 1;
        let data = pattern(50_000 + n, LEN);
        src.write(0, &data);
        let post = |wr| c.qp.post_send(wr).map_err(|e| format!("post: {e}"));
        post(write_wr(1, &src, 0, LEN, remote.0, remote.1))?;
        post(read_wr(2, &sink, 0, LEN, remote.0, remote.1))?;
        expect_wc(cq, 1, WcOpcode::Write, WcStatus::Success)
            .map_err(|e| format!("bystander round {n}: {e}; {:?}", c.qp.status()))?;
        expect_wc(cq, 2, WcOpcode::Read, WcStatus::Success)
            .map_err(|e| format!("bystander round {n}: {e}; {:?}", c.qp.status()))?;
        check_bytes(
            &bytes(&sink, 0, LEN),
            &data,
            &format!("bystander round {n}"),
        )?;
        rounds.store(n, Ordering::Relaxed);
    }
    Ok(())
}

/// Waits (bounded) until the bystander has done at least `n` rounds.
fn wait_rounds(rounds: &AtomicU64, n: u64, failed: &AtomicBool) {
    let deadline = Instant::now() + WAIT;
    while rounds.load(Ordering::Relaxed) < n {
        assert!(!failed.load(Ordering::Relaxed), "the bystander failed");
        assert!(
            Instant::now() < deadline,
            "the bystander stalled at {rounds:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn terminate_for_bad_fpdus_while_serving_others() {
    let _bed = bed_or_skip!();
    let a = start_engine(NS_A, DEV_A);
    let b = start_engine(NS_B, DEV_B);
    let port = 19_900;
    let p = params(mpa(2, true, false));
    let listener = a.listen(port, p.clone()).expect("listen");
    let addr = SocketAddr::from((ADDR_A, port));
    let v = {
        let pd = ProtectionDomain::new();
        let before = pattern(777, TREGION);
        let target = pd
            .register(TREGION, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let readable = pd
            .register(TREGION, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
        let private = pd.register(TREGION, Access::LOCAL_WRITE).unwrap();
        for mr in [&target, &readable, &private] {
            mr.write(0, &before);
        }
        Victim {
            pd,
            cq: CompletionQueue::new(),
            target,
            readable,
            private,
            before,
        }
    };
    // The bystander: an engine client in iwb, to a region of its own on the engine server.
    let by_mem = v.pd.register(64 << 10, ALL).unwrap();
    let by_pd = ProtectionDomain::new();
    let by_cq = CompletionQueue::new();
    let by_server_cq = CompletionQueue::new();
    let (by_c, by_s) = establish(&listener, &v.pd, &by_server_cq, &[], vec![], || {
        b.connect(addr, &by_pd, &by_cq, &p, b"bystander")
    })
    .expect("bystander connection");
    let rounds = AtomicU64::new(0);
    let (stop, failed) = (AtomicBool::new(false), AtomicBool::new(false));
    let mut results = Vec::new();
    std::thread::scope(|s| {
        let by = s.spawn(|| {
            let r = bystander(
                &by_c,
                &by_cq,
                &by_pd,
                (by_mem.stag(), by_mem.base_to()),
                &rounds,
                &stop,
            );
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            r
        });
        wait_rounds(&rounds, 5, &failed);
        let before = rounds.load(Ordering::Relaxed);
        let socket_server = Stack::Socket.listen(port + 1, p.clone());
        let roles = [
            (
                "socket peer -> engine server",
                Role::EngineServer {
                    listener: &listener,
                    addr,
                    peer: Stack::Socket,
                },
            ),
            (
                "engine peer -> engine server",
                Role::EngineServer {
                    listener: &listener,
                    addr,
                    peer: Stack::Engine(&b),
                },
            ),
            (
                "socket server peer -> engine client",
                Role::EngineClient {
                    engine: &a,
                    listener: &socket_server,
                    addr: SocketAddr::from((ADDR_B, port + 1)),
                },
            ),
        ];
        for (name, role) in roles {
            for bad in [
                Bad::WriteInvalidStag,
                Bad::WriteBeyondEnd,
                Bad::WriteWithoutAccess,
                Bad::ReadInvalidSourceStag,
            ] {
                let t = Instant::now();
                let r = bad_peer(role, &v, bad);
                if r.is_err() {
                    // A failed case returns before its clean-up: restore the target region and
                    // drop what it left on the shared queue, so the next case is judged alone.
                    v.target.write(0, &v.before);
                    std::thread::sleep(Duration::from_millis(200));
                    while v.cq.try_next().is_some() {}
                }
                println!(
                    "{name}, {bad:?}: {} in {:?} (bystander at round {})",
                    match &r {
                        Ok(()) => format!("Terminate {:?} as expected", bad.want()),
                        Err(e) => format!("FAILED: {e}"),
                    },
                    t.elapsed(),
                    rounds.load(Ordering::Relaxed)
                );
                results.push(r.map_err(|e| format!("{name} {bad:?}: {e}")));
            }
        }
        for bad in [
            Raw::CrcMismatch,
            Raw::SendWithoutBuffer,
            Raw::SendTooLong,
            Raw::InvalidQueueNumber,
            Raw::DdpVersion,
            Raw::RdmapVersion,
        ] {
            let t = Instant::now();
            let r = raw_peer(addr, &listener, &v, bad);
            println!(
                "raw peer, {bad:?}: {} in {:?} (bystander at round {})",
                match &r {
                    Ok(()) => format!("Terminate {:?} as expected", bad.want()),
                    Err(e) => format!("FAILED: {e}"),
                },
                t.elapsed(),
                rounds.load(Ordering::Relaxed)
            );
            results.push(r.map_err(|e| format!("raw {bad:?}: {e}")));
        }
        let after_bad = rounds.load(Ordering::Relaxed);
        wait_rounds(&rounds, after_bad + 5, &failed);
        stop.store(true, Ordering::Relaxed);
        let by_result = by.join().expect("bystander thread");
        println!(
            "bystander: {} verified rounds in all, {} while the bad peers ran ({before} before)",
            rounds.load(Ordering::Relaxed),
            after_bad - before
        );
        results.push(by_result.map_err(|e| format!("bystander: {e}")));
        if after_bad <= before {
            results.push(Err(
                "the bystander moved no data while the bad peers ran".into()
            ));
        }
    });
    let st = by_s.qp.status();
    assert_eq!(
        (st.state, st.sent_terminate, st.remote_terminate),
        (QpState::Rts, None, None),
        "bystander, engine side"
    );
    drop(by_c);
    drop(by_s);
    let errors: Vec<_> = results.into_iter().filter_map(Result::err).collect();
    let ca = stop_and_check("server (iwa)", a, 1);
    stop_and_check("bad peers (iwb)", b, 0);
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(ca.conns.terminates_sent, 18, "one Terminate per bad peer");
}
