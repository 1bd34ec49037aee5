//! `iwarp-bench rping`: the ping-pong of rdma-core's `rping` (librdmacm/examples/rping.c),
//! message for message, so either side can be the real `rping` (for example on Linux siw).
//!
//! The exchange, per ping (all control messages are one 16-octet `struct rping_rdma_info`:
//! be64 buf, be32 rkey, be32 size):
//!
//! 1. the client fills its *start* buffer with rping's text pattern and Sends its info;
//! 2. the server RDMA-Reads `size` octets of it into its own buffer, then Sends a go-ahead
//!    (rping's server Sends its never-filled info buffer: 16 zero octets);
//! 3. the client Sends the info of its *sink* buffer;
//! 4. the server RDMA-Writes `strlen(data) + 1` octets of what it read into the sink and Sends
//!    a second go-ahead;
//! 5. the client compares sink and start.
//!
//! rping has no private data in its connection setup, and keeps one receive posted on each side,
//! reposted before the next message can arrive. The connection ends when the client
//! disconnects after `-C` pings; the server serves one connection and exits.
//!
//! Unlike rping, both sides always check the data: the server checks what it read against
//! rping's pattern, the client checks the echo (rping does that only with `-V`). Sizes up to
//! 64 MiB are accepted (real rping takes 26 to 65535 octets).

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use datapath::{
    Access, Completion, CompletionQueue, ConnectParams, IdleQp, MemoryRegion, MpaConfig,
    ProtectionDomain, QueuePair, RecvWr, SendOp, SendWr, Stag, WcOpcode, WcStatus,
};

use crate::net::Net;
use crate::{OnOff, Transport};

/// Octets of `struct rping_rdma_info`.
const INFO_LEN: usize = 16;
/// rping's default port.
const RPING_PORT: u16 = 7174;
/// The largest ping we accept (rping itself stops at 65535).
const MAX_SIZE: u32 = 64 << 20;
/// Receive slots kept posted (rping keeps one; more cost nothing).
const RECV_SLOTS: u64 = 2;

const WR_RECV: u64 = 1 << 56;
const WR_SEND: u64 = 2 << 56;
const WR_READ: u64 = 3 << 56;
const WR_WRITE: u64 = 4 << 56;
const WR_KIND: u64 = 0xFF << 56;

/// rping-compatible options (`rping -s|-c [-vVd] [-S size] [-C count] [-a addr] [-p port]`).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "iwarp-bench rping",
    about = "rping-compatible ping-pong (RDMA Read, RDMA Write, Send) over the iWARP stack"
)]
pub struct RpingCli {
    /// Server side (serves one connection).
    #[arg(
        short = 's',
        conflicts_with = "client",
        required_unless_present = "client"
    )]
    pub server: bool,
    /// Client side.
    #[arg(short = 'c')]
    pub client: bool,
    /// Address: the server to reach (client), the address to bind (server; default any).
    #[arg(short = 'a')]
    pub addr: Option<String>,
    /// TCP port.
    #[arg(short = 'p', default_value_t = RPING_PORT)]
    pub port: u16,
    /// Pings to run (client; 0 = until interrupted, as rping). A server given -C fails
    /// unless exactly that many pings ran (-C 0: no check, as rping's server).
    #[arg(short = 'C')]
    pub count: Option<u64>,
    /// Ping data size in octets (client: what it sends; server: its buffer, grown on demand).
    #[arg(short = 'S', default_value_t = 64)]
    pub size: u32,
    /// Print the ping data, as rping does.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Validate the ping data (always done; accepted for rping compatibility).
    #[arg(short = 'V')]
    pub validate: bool,
    /// Print each step.
    #[arg(short = 'd')]
    pub debug: bool,
    /// MPA revision to use: 1 (RFC 5044) or 2 (RFC 6581, what rdma_cm/siw use).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub mpa_rev: u8,
    /// CRC32C on FPDUs: `off` only takes effect if the peer also asks for off.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub crc: OnOff,
    /// Seconds for connection setup (client: TCP connect and MPA; server: waiting for the
    /// client too).
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Seconds any single step (a completion) may take before the run fails.
    #[arg(long, default_value_t = 30.0)]
    pub step_timeout: f64,
    /// Client: milliseconds to wait after the MPA Reply before the first Send. Linux siw as
    /// responder can miss an FPDU that arrives right after its Reply (siw_accept sends the
    /// Reply before it hands the socket's data_ready callback to the QP), which a real rping
    /// client, slower to send, never hits; 100 avoids it.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub settle_ms: u64,
    /// Transport: `socket` (kernel TCP) or `xdp` (our TCP over AF_XDP on `--iface`, root;
    /// the server then listens on the interface's address whatever -a says).
    #[arg(long, value_enum, default_value_t = Transport::Socket)]
    pub transport: Transport,
    /// Interface for `--transport xdp`.
    #[arg(long)]
    pub iface: Option<String>,
    /// `--transport xdp`: write every frame the engine receives and sends to FILE (pcap, as
    /// `iwarp-bench --pcap`).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    /// `--transport xdp`: where the steering XDP program runs (`auto`: the driver's native
    /// XDP, else generic; `driver`; `generic`), as `iwarp-bench --xdp-mode`.
    #[arg(long, value_enum)]
    pub xdp_mode: Option<crate::cli::XdpMode>,
}

/// Entry point: `args` starts with "rping".
pub fn main(args: impl IntoIterator<Item = String>) -> ExitCode {
    let cli: RpingCli = match crate::parse_args(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if cli.size == 0 || cli.size > MAX_SIZE {
        eprintln!("rping: -S must be between 1 and {MAX_SIZE}");
        return ExitCode::from(2);
    }
    let ok = |t: f64| t > 0.0 && t <= 3600.0;
    if !ok(cli.timeout) || !ok(cli.step_timeout) {
        eprintln!(
            "rping: --timeout and --step-timeout must be more than 0 and at most 3600 seconds"
        );
        return ExitCode::from(2);
    }
    let net = match Net::start(
        cli.transport,
        cli.iface.as_deref(),
        cli.pcap.as_deref(),
        cli.xdp_mode,
    ) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("rping: {e}");
            return ExitCode::FAILURE;
        }
    };
    let res = if cli.server {
        run_server(&cli, &net)
    } else {
        match cli.addr.as_deref() {
            None => Err("the client needs -a ADDR".to_string()),
            Some(host) => resolve(host, cli.port).and_then(|a| run_client(&cli, &net, a)),
        }
    };
    let (engine, pcap) = net.finish();
    if let Some(report) = engine {
        eprintln!("rping: {}", report.line());
    }
    if let Some(p) = pcap {
        eprintln!("rping: {}", p.line());
    }
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rping: {e}");
            ExitCode::FAILURE
        }
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))
}

fn params(cli: &RpingCli) -> ConnectParams {
    ConnectParams {
        mpa: MpaConfig {
            rev: cli.mpa_rev,
            crc: cli.crc.on(),
            markers: false,
            ..MpaConfig::default()
        },
        sq_depth: 16,
        rq_depth: 16,
        setup_timeout: Duration::from_secs_f64(cli.timeout),
        ..ConnectParams::default()
    }
}

/// `struct rping_rdma_info`, all fields big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaInfo {
    /// Buffer address (our TO).
    pub buf: u64,
    /// rkey (our STag).
    pub rkey: u32,
    /// Length in octets.
    pub size: u32,
}

impl RdmaInfo {
    /// The 16 wire octets.
    pub fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.buf.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }
    /// From the 16 wire octets.
    pub fn decode(b: &[u8; INFO_LEN]) -> Self {
        Self {
            buf: u64::from_be_bytes(b[..8].try_into().expect("8 octets")),
            rkey: u32::from_be_bytes(b[8..12].try_into().expect("4 octets")),
            size: u32::from_be_bytes(b[12..].try_into().expect("4 octets")),
        }
    }
}

/// rping's ping data for ping number `ping` (rping_test_client): `"rdma-ping-%d: "` (cut by
/// snprintf to `size - 1` characters), then letters cycling through 'A'..='z' starting at
/// `65 + ping % 58`, and a NUL in the last octet.
pub fn ping_data(ping: u64, size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size];
    if size == 0 {
        return buf;
    }
    // rping's counter is a C int; its text is what %d prints.
    let head = format!("rdma-ping-{}: ", ping as i32);
    let cc = head.len();
    let n = cc.min(size - 1);
    buf[..n].copy_from_slice(&head.as_bytes()[..n]);
    let mut c = 65 + (ping % 58) as u8;
    for b in buf.iter_mut().skip(cc) {
        *b = c;
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    buf[size - 1] = 0;
    buf
}

/// The text part of ping data (up to the first NUL), for printing.
fn text(data: &[u8]) -> String {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

fn first_mismatch(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// One connected side: its queue pair, completion queue and control buffers.
struct Peer {
    qp: QueuePair,
    cq: CompletionQueue,
    /// `RECV_SLOTS` receive slots, then two send slots, of `INFO_LEN` octets each.
    ctrl: MemoryRegion,
    recv_posted: u64,
    sent: u64,
    step_timeout: Duration,
    debug: bool,
    /// Receive completions that arrived while waiting for something else.
    early_recvs: Vec<Completion>,
}

/// What ended a wait.
enum Waited {
    Done(Completion),
    /// The connection went away (peer disconnect) before the completion arrived.
    Closed(String),
}

impl Peer {
    fn new(qp: QueuePair, cq: CompletionQueue, ctrl: MemoryRegion, cli: &RpingCli) -> Self {
        Self {
            qp,
            cq,
            ctrl,
            recv_posted: 0,
            sent: 0,
            step_timeout: Duration::from_secs_f64(cli.step_timeout),
            debug: cli.debug,
            early_recvs: Vec::new(),
        }
    }

    fn log(&self, what: std::fmt::Arguments) {
        if self.debug {
            eprintln!("rping: {what}");
        }
    }

    fn reason(&self) -> String {
        let st = self.qp.status();
        let mut s = format!("queue pair {:?}", st.state);
        if let Some(t) = st.remote_terminate {
            s += &format!("; peer sent Terminate {t:?}");
        }
        if let Some(t) = st.sent_terminate {
            s += &format!("; we sent Terminate {t:?}");
        }
        if let Some(e) = st.error {
            s += &format!("; {e}");
        }
        s
    }

    fn post_recv(&mut self) -> Result<(), String> {
        let slot = self.recv_posted % RECV_SLOTS;
        self.recv_posted += 1;
        self.qp
            .post_recv(recv_wr(&self.ctrl, slot))
            .map_err(|e| format!("post receive: {e}"))
    }

    fn send_info(&mut self, info: &[u8; INFO_LEN]) -> Result<(), String> {
        let slot = RECV_SLOTS + self.sent % 2;
        self.sent += 1;
        let off = slot as usize * INFO_LEN;
        self.ctrl.write(off, info);
        self.qp
            .post_send(SendWr {
                wr_id: WR_SEND | slot,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sg_list: self.ctrl.sge(off, INFO_LEN as u32).into(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| format!("post send: {e}"))
    }

    /// Waits for the next completion of `kind` (send completions are consumed on the way;
    /// receives are kept for later unless asked for). Any failed completion is an error, except
    /// a flushed one once the connection has gone (reported as `Closed`).
    fn wait_for(&mut self, kind: u64, what: &str) -> Result<Waited, String> {
        if kind == WR_RECV && !self.early_recvs.is_empty() {
            return Ok(Waited::Done(self.early_recvs.remove(0)));
        }
        let deadline = Instant::now() + self.step_timeout;
        loop {
            let c = match self.cq.wait(Duration::from_millis(20)) {
                Some(c) => c,
                None => {
                    if self.qp.status().finished && self.cq.is_empty() {
                        return Ok(Waited::Closed(self.reason()));
                    }
                    if Instant::now() > deadline {
                        return Err(format!(
                            "no {what} within {:?}: {}",
                            self.step_timeout,
                            self.reason()
                        ));
                    }
                    continue;
                }
            };
            let ck = c.wc.wr_id & WR_KIND;
            if c.wc.status != WcStatus::Success {
                if c.wc.status == WcStatus::WrFlushError {
                    return Ok(Waited::Closed(self.reason()));
                }
                return Err(format!(
                    "{:?} completion failed with {:?} while waiting for {what}: {}",
                    c.wc.opcode,
                    c.wc.status,
                    self.reason()
                ));
            }
            if ck == kind {
                return Ok(Waited::Done(c));
            }
            match ck {
                WR_SEND => self.log(format_args!("send completion")),
                WR_RECV => self.early_recvs.push(c),
                _ => {
                    return Err(format!(
                        "unexpected {:?} completion while waiting for {what}",
                        c.wc.opcode
                    ))
                }
            }
        }
    }

    /// Waits for a received `rping_rdma_info` and reposts the receive slot.
    fn recv_info(&mut self, what: &str) -> Result<Option<RdmaInfo>, String> {
        let c = match self.wait_for(WR_RECV, what)? {
            Waited::Done(c) => c,
            Waited::Closed(_) => return Ok(None),
        };
        if c.wc.opcode != WcOpcode::Recv || c.wc.byte_len as usize != INFO_LEN {
            return Err(format!(
                "received bogus data, size {} (want {INFO_LEN}) while waiting for {what}",
                c.wc.byte_len
            ));
        }
        let slot = c.wc.wr_id & !WR_KIND;
        let mut b = [0u8; INFO_LEN];
        self.ctrl.read(slot as usize * INFO_LEN, &mut b);
        // rping reposts its one receive before waking the test loop.
        self.post_recv()?;
        let info = RdmaInfo::decode(&b);
        self.log(format_args!(
            "received rkey {:x} addr {:x} len {} ({what})",
            info.rkey, info.buf, info.size
        ));
        Ok(Some(info))
    }

    fn must(&mut self, kind: u64, what: &str) -> Result<Completion, String> {
        match self.wait_for(kind, what)? {
            Waited::Done(c) => Ok(c),
            Waited::Closed(r) => Err(format!("connection ended while waiting for {what}: {r}")),
        }
    }
}

fn recv_wr(ctrl: &MemoryRegion, slot: u64) -> RecvWr {
    RecvWr {
        wr_id: WR_RECV | slot,
        sg_list: ctrl.sge(slot as usize * INFO_LEN, INFO_LEN as u32).into(),
    }
}

fn ctrl_region(pd: &ProtectionDomain) -> Result<MemoryRegion, String> {
    let mr = pd
        .register((RECV_SLOTS as usize + 2) * INFO_LEN, Access::LOCAL_WRITE)
        .map_err(|e| format!("register control buffer: {e}"))?;
    crate::net::note_unpinned(&mr);
    Ok(mr)
}

fn data_region(pd: &ProtectionDomain, len: u32) -> Result<MemoryRegion, String> {
    let mr = pd
        .register(
            len as usize,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .map_err(|e| format!("register {len}-octet buffer: {e}"))?;
    crate::net::note_unpinned(&mr);
    Ok(mr)
}

fn describe(qp: &QueuePair) -> String {
    crate::net::describe_agreed(qp)
}

fn run_server(cli: &RpingCli, net: &Net) -> Result<(), String> {
    let host = cli.addr.as_deref().unwrap_or("0.0.0.0");
    let bind = resolve(host, cli.port)?;
    let (listener, addr) = net.listen(&bind.ip().to_string(), cli.port, params(cli))?;
    // Scripts start their client after this line: from here a SYN reaches the listener.
    eprintln!("rping: server listening on {addr}");
    let pd = crate::net::protection_domain();
    let cq = CompletionQueue::new();
    let ctrl = ctrl_region(&pd)?;
    let mut data = data_region(&pd, cli.size)?;
    let req = listener
        .accept_timeout(Duration::from_secs_f64(cli.timeout))
        .map_err(|e| format!("connect: {e}"))?
        .ok_or_else(|| format!("connect: no client within {} s", cli.timeout))?;
    if cli.debug {
        eprintln!(
            "rping: connect request from {} ({:?})",
            req.peer_addr(),
            req.info()
        );
    }
    // As rping does: the queue pair created on the request's id (`rdma_create_qp`), its
    // receives posted (`ibv_post_recv`), then `rdma_accept`.
    let qp = IdleQp::new(&pd, &cq, &params(cli)).map_err(|e| format!("create the QP: {e}"))?;
    qp.post_recv_list((0..RECV_SLOTS).map(|s| recv_wr(&ctrl, s)))
        .map_err(|e| format!("post the receives: {e}"))?;
    let conn = req.accept_qp(qp, &[]).map_err(|e| format!("accept: {e}"))?;
    let mut peer = Peer::new(conn.qp, cq, ctrl, cli);
    peer.recv_posted = RECV_SLOTS;
    peer.log(format_args!("connected: {}", describe(&peer.qp)));
    // rping's server Sends its info buffer, which it never fills: 16 zero octets.
    let go_ahead = [0u8; INFO_LEN];
    let mut pings: u64 = 0;
    let mut verified: u64 = 0;
    // Each turn waits for the client's start buffer; its disconnect ends the loop.
    while let Some(src) = peer.recv_info("the client's start buffer")? {
        if src.size > MAX_SIZE {
            return Err(format!("client buffer of {} octets is too large", src.size));
        }
        if src.size as usize > data.len() {
            data = data_region(&pd, src.size)?;
        }
        peer.qp
            .post_send(SendWr {
                wr_id: WR_READ,
                op: SendOp::Read {
                    remote_stag: Stag(src.rkey),
                    remote_to: src.buf,
                },
                sg_list: data.sge(0, src.size).into(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| format!("post RDMA Read: {e}"))?;
        let c = peer.must(WR_READ, "the RDMA Read")?;
        if c.wc.byte_len != src.size {
            return Err(format!(
                "RDMA Read completed with {} octets, asked for {}",
                c.wc.byte_len, src.size
            ));
        }
        let mut got = vec![0u8; src.size as usize];
        data.read(0, &mut got);
        let want = ping_data(pings, got.len());
        if let Some(at) = first_mismatch(&got, &want) {
            return Err(format!(
                "data mismatch in ping {pings} at octet {at} of {}: read {:#04x}, rping's \
                 pattern has {:#04x}",
                got.len(),
                got[at],
                want[at]
            ));
        }
        verified += u64::from(src.size);
        if cli.verbose > 0 {
            println!("server ping data: {}", text(&got));
        }
        peer.send_info(&go_ahead)?;
        let Some(sink) = peer.recv_info("the client's sink buffer")? else {
            return Err(format!(
                "connection ended in ping {pings} before the sink buffer arrived: {}",
                peer.reason()
            ));
        };
        // rping writes strlen(rdma_buf) + 1 octets.
        let len = got
            .iter()
            .position(|&b| b == 0)
            .map_or(got.len(), |p| p + 1) as u32;
        if len > sink.size {
            return Err(format!(
                "client's sink buffer ({} octets) is smaller than the ping ({len})",
                sink.size
            ));
        }
        peer.qp
            .post_send(SendWr {
                wr_id: WR_WRITE,
                op: SendOp::Write {
                    remote_stag: Stag(sink.rkey),
                    remote_to: sink.buf,
                },
                sg_list: data.sge(0, len).into(),
                signaled: true,
                fence: false,
            })
            .map_err(|e| format!("post RDMA Write: {e}"))?;
        peer.must(WR_WRITE, "the RDMA Write")?;
        peer.send_info(&go_ahead)?;
        pings += 1;
        peer.log(format_args!("ping {pings} done"));
    }
    let st = peer.qp.status();
    if let Some(t) = st.remote_terminate {
        return Err(format!(
            "after {pings} pings the client sent Terminate {t:?}"
        ));
    }
    if let Some(t) = st.sent_terminate {
        return Err(format!("after {pings} pings we sent Terminate {t:?}"));
    }
    // -C 0 is rping's "no count": nothing to check.
    if let Some(want) = cli.count.filter(|&n| n != 0) {
        if pings != want {
            return Err(format!("{pings} pings ran, -C asked for {want}"));
        }
    }
    println!(
        "rping server: {pings} pings, {verified} octets read and verified, client {} ({})",
        peer.qp.peer_addr(),
        describe(&peer.qp)
    );
    Ok(())
}

fn run_client(cli: &RpingCli, net: &Net, addr: SocketAddr) -> Result<(), String> {
    let pd = crate::net::protection_domain();
    let cq = CompletionQueue::new();
    let ctrl = ctrl_region(&pd)?;
    let start = data_region(&pd, cli.size)?;
    let sink = data_region(&pd, cli.size)?;
    // As rping does: `rdma_create_qp`, its receives posted, then `rdma_connect`.
    let qp = IdleQp::new(&pd, &cq, &params(cli)).map_err(|e| format!("create the QP: {e}"))?;
    qp.post_recv_list((0..RECV_SLOTS).map(|s| recv_wr(&ctrl, s)))
        .map_err(|e| format!("post the receives: {e}"))?;
    let conn = net
        .connect_qp(qp, addr, &[])
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    let mut peer = Peer::new(conn.qp, cq, ctrl, cli);
    peer.recv_posted = RECV_SLOTS;
    peer.log(format_args!("connected: {}", describe(&peer.qp)));
    std::thread::sleep(Duration::from_millis(cli.settle_ms));
    let size = cli.size as usize;
    let count = cli.count.unwrap_or(0);
    let zeros = vec![0u8; size];
    let mut ping: u64 = 0;
    while count == 0 || ping < count {
        let data = ping_data(ping, size);
        start.write(0, &data);
        sink.write(0, &zeros);
        peer.send_info(
            &RdmaInfo {
                buf: start.base_to(),
                rkey: start.stag().raw(),
                size: cli.size,
            }
            .encode(),
        )?;
        if peer
            .recv_info("the server's go-ahead after its RDMA Read")?
            .is_none()
        {
            return Err(format!(
                "connection ended in ping {ping} waiting for the go-ahead after the Read: {}",
                peer.reason()
            ));
        }
        peer.send_info(
            &RdmaInfo {
                buf: sink.base_to(),
                rkey: sink.stag().raw(),
                size: cli.size,
            }
            .encode(),
        )?;
        if peer
            .recv_info("the server's go-ahead after its RDMA Write")?
            .is_none()
        {
            return Err(format!(
                "connection ended in ping {ping} waiting for the go-ahead after the Write: {}",
                peer.reason()
            ));
        }
        let mut got = vec![0u8; size];
        sink.read(0, &mut got);
        if let Some(at) = first_mismatch(&got, &data) {
            return Err(format!(
                "data mismatch in ping {ping} at octet {at} of {size}: sink has {:#04x}, \
                 sent {:#04x}",
                got[at], data[at]
            ));
        }
        if cli.verbose > 0 {
            println!("ping data: {}", text(&got));
        }
        ping += 1;
    }
    let desc = describe(&peer.qp);
    let st = peer.qp.status();
    if let Some(t) = st.remote_terminate {
        return Err(format!(
            "after {ping} pings the server sent Terminate {t:?}"
        ));
    }
    peer.qp.disconnect();
    println!("rping client: {ping} pings of {size} octets verified, server {addr} ({desc})");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_round_trips_big_endian() {
        let i = RdmaInfo {
            buf: 0x0102_0304_0506_0708,
            rkey: 0x1122_3344,
            size: 0x10,
        };
        let b = i.encode();
        assert_eq!(
            b,
            [1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44, 0, 0, 0, 0x10]
        );
        assert_eq!(RdmaInfo::decode(&b), i);
    }

    #[test]
    fn ping_data_matches_rping() {
        // rping -S 32, ping 0: "rdma-ping-0: " then A.. from 'A', NUL last.
        let d = ping_data(0, 32);
        assert_eq!(&d[..13], b"rdma-ping-0: ");
        assert_eq!(&d[13..31], b"ABCDEFGHIJKLMNOPQR");
        assert_eq!(d[31], 0);
        // Ping 1 starts at 'B'; the cycle wraps from 'z' (122) to 'A'.
        let d = ping_data(1, 80);
        assert_eq!(d[13], b'B');
        assert_eq!(d[13 + (122 - 66) + 1], b'A');
        // Ping 57 starts at 'z'; ping 58 wraps to 'A' again.
        assert_eq!(ping_data(57, 40)[14], b'z');
        assert_eq!(ping_data(58, 40)[14], b'A');
        // Shorter than the header: snprintf's cut, then the NUL.
        let d = ping_data(7, 5);
        assert_eq!(&d, b"rdma\0");
        assert_eq!(text(&ping_data(3, 20)), "rdma-ping-3: DEFGHI");
    }

    #[test]
    fn cli_takes_rping_flags() {
        let c = RpingCli::try_parse_from(["rping", "-c", "-a", "10.0.0.1", "-C", "5", "-S", "100"])
            .unwrap();
        assert!(c.client && !c.server);
        assert_eq!((c.count, c.size, c.port), (Some(5), 100, RPING_PORT));
        let c = RpingCli::try_parse_from(["rping", "-s", "-vVd", "-p", "9"]).unwrap();
        assert!(c.server && c.validate && c.debug && c.verbose == 1 && c.port == 9);
        assert!(RpingCli::try_parse_from(["rping", "-s", "-c"]).is_err());
        assert!(RpingCli::try_parse_from(["rping"]).is_err());
    }

    #[test]
    fn mismatch_positions() {
        assert_eq!(first_mismatch(b"abc", b"abc"), None);
        assert_eq!(first_mismatch(b"abc", b"abd"), Some(2));
        assert_eq!(first_mismatch(b"ab", b"abc"), Some(2));
    }
}
