//! Setup shared by the veth-bed tests of the AF_XDP engine against a socket-transport peer:
//! the peer listens in `iwb` on [`ADDR_B`], the engine runs in `iwa` on [`DEV_A`].

use std::net::SocketAddr;
use std::sync::mpsc::Sender;
use std::time::Duration;

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::ProtectionDomain;
use datapath::{
    Access, CompletionQueue, ConnectParams, ConnectRequest, Connection, Device, Listener,
    MemoryRegion, QueuePair, RecvWr, SendOp, SendWr, Transport, WcOpcode, WcStatus,
};
use testbed::{enter_ns, ADDR_B, DEV_A, NS_A, NS_B};

/// Connection parameters with a bounded setup time (10 s).
pub fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    }
}

/// Moves the calling thread into `iwb`, listens on `ADDR_B:port`, says `ready`, and waits up
/// to `within` for a connection request.
pub fn listen_in_b(
    port: u16,
    ready: &Sender<()>,
    within: Duration,
) -> Result<ConnectRequest, String> {
    listen_in_b_with(port, ready, within, params())
}

/// [`listen_in_b`] with the listener's connection parameters given.
pub fn listen_in_b_with(
    port: u16,
    ready: &Sender<()>,
    within: Duration,
    params: ConnectParams,
) -> Result<ConnectRequest, String> {
    enter_ns(NS_B).map_err(|e| e.to_string())?;
    let listener = Listener::bind(SocketAddr::from((ADDR_B, port)), params)
        .map_err(|e| format!("listen: {e}"))?;
    let _ = ready.send(());
    listener
        .accept_timeout(within)
        .map_err(|e| format!("accept: {e}"))?
        .ok_or_else(|| "no connection request in time".to_string())
}

/// Moves the calling thread into `iwa`, starts the engine on `DEV_A` with `cfg` and connects
/// to `ADDR_B:port`.
pub fn engine_connect_in_a(
    cfg: XdpEngineConfig,
    port: u16,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
) -> Result<(XdpEngine, Connection), String> {
    enter_ns(NS_A).map_err(|e| e.to_string())?;
    let engine = XdpEngine::start(DEV_A, cfg).map_err(|e| format!("engine: {e}"))?;
    let conn = engine
        .connect(SocketAddr::from((ADDR_B, port)), pd, cq, &params(), &[])
        .map_err(|e| format!("connect: {e}"))?;
    Ok((engine, conn))
}

/// Starts the engine on `dev` inside namespace `ns`.
pub fn start_engine(ns: &'static str, dev: &'static str) -> XdpEngine {
    testbed::in_ns(ns, move || {
        XdpEngine::start(dev, XdpEngineConfig::default())
    })
    .unwrap_or_else(|e| panic!("engine on {dev}: {e}"))
}

/// Which stack runs one end of a connection on the bed: an engine (on its namespace's
/// device), or the socket transport (kernel TCP) in namespace `iwb`.
#[derive(Clone, Copy)]
pub enum Stack<'a> {
    Engine(&'a XdpEngine),
    Socket,
}

impl Stack<'_> {
    pub fn name(&self) -> &'static str {
        match self {
            Stack::Engine(_) => "engine",
            Stack::Socket => "socket",
        }
    }

    pub fn listen(&self, port: u16, p: ConnectParams) -> Listener {
        match self {
            Stack::Engine(e) => e.listen(port, p),
            Stack::Socket => testbed::in_ns(NS_B, move || {
                Listener::bind(SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)), p)
            }),
        }
        .unwrap_or_else(|e| panic!("listen on {port}: {e}"))
    }

    pub fn connect(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        p: &ConnectParams,
        private_data: &[u8],
    ) -> Result<Connection, datapath::DatapathError> {
        match self {
            Stack::Engine(e) => e.connect(addr, pd, cq, p, private_data),
            Stack::Socket => {
                testbed::in_ns(NS_B, || datapath::connect(addr, pd, cq, p, private_data))
            }
        }
    }
}

/// Moves into `iwb`, accepts one connection on `port` (socket transport) with `count` receives
/// of `len` octets posted, each into its own slot, checks that `count` Sends arrive in order,
/// Send `i` carrying `expected(i)` (each waited for up to `within`), and waits for the client
/// to close.
pub fn receive_sends(
    port: u16,
    ready: &Sender<()>,
    count: u64,
    len: usize,
    within: Duration,
    expected: impl Fn(u64) -> Vec<u8>,
) -> Result<(), String> {
    let req = listen_in_b(port, ready, within)?;
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let buf = pd
        .register(len * count as usize, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let recvs = (0..count)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: buf.sge(i as usize * len, len as u32).into(),
        })
        .collect();
    let conn = req
        .accept_with_recvs(&pd, &cq, &[], recvs)
        .map_err(|e| format!("accept: {e}"))?;
    let qp = conn.qp;
    let mut got = vec![0u8; len];
    for i in 0..count {
        let c = cq
            .wait(within)
            .ok_or_else(|| format!("no receive completion {i}: {:?}", qp.status()))?;
        if c.wc.status != WcStatus::Success || c.wc.opcode != WcOpcode::Recv || c.wc.wr_id != i {
            return Err(format!("receive {i}: unexpected completion {c:?}"));
        }
        buf.read(i as usize * len, &mut got);
        if got != expected(i) {
            return Err(format!("Send {i}: wrong data"));
        }
    }
    if !qp.wait_finished(within) {
        return Err(format!("client did not close: {:?}", qp.status()));
    }
    qp.disconnect();
    Ok(())
}

/// A receive of `len` octets into slot `i % 4` of `mr`.
pub fn slot_recv(mr: &MemoryRegion, i: u64, len: usize) -> RecvWr {
    RecvWr {
        wr_id: i,
        sg_list: mr.sge((i % 4) as usize * len, len as u32).into(),
    }
}

/// A signaled Send of slot `i % 4` (`len` octets) of `mr`.
pub fn slot_send(mr: &MemoryRegion, i: u64, len: usize) -> SendWr {
    SendWr {
        wr_id: i,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: mr.sge((i % 4) as usize * len, len as u32).into(),
        signaled: true,
        fence: false,
    }
}

/// The queue pair of [`echo_rounds`] with what it uses (its buffer must outlive the echoes
/// still in flight; fields drop in order, the queue pair first).
pub struct Echoed {
    pub qp: QueuePair,
    _cq: CompletionQueue,
    _buf: MemoryRegion,
    _pd: ProtectionDomain,
}

/// Moves into `iwb`, accepts one connection on `port` (socket transport, four receives of
/// `len` octets posted), echoes `rounds` Sends back (blocking waits, up to `within` each),
/// calling `before_echo(round)` before each echo, and returns the queue pair.
pub fn echo_rounds(
    port: u16,
    ready: &Sender<()>,
    rounds: u64,
    len: usize,
    within: Duration,
    mut before_echo: impl FnMut(u64) -> Result<(), String>,
) -> Result<Echoed, String> {
    let req = listen_in_b(port, ready, within)?;
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let buf = pd
        .register(len * 4, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let recvs = (0..4).map(|i| slot_recv(&buf, i, len)).collect();
    let conn = req
        .accept_with_recvs(&pd, &cq, &[], recvs)
        .map_err(|e| format!("accept: {e}"))?;
    let qp = conn.qp;
    let mut got = 0;
    while got < rounds {
        let c = cq
            .wait(within)
            .ok_or_else(|| format!("no completion after {got} rounds: {:?}", qp.status()))?;
        if c.wc.status != WcStatus::Success {
            return Err(format!("failed completion {c:?}"));
        }
        if c.wc.opcode != WcOpcode::Recv {
            continue;
        }
        let i = c.wc.wr_id;
        before_echo(got)?;
        qp.post_send(slot_send(&buf, i, len))
            .map_err(|e| format!("echo: {e}"))?;
        // Reposted before the client's next Send can arrive (the echo's Send goes first, and
        // the client sends again only once it has the echo).
        qp.post_recv(slot_recv(&buf, i + 4, len))
            .map_err(|e| format!("repost: {e}"))?;
        got += 1;
    }
    Ok(Echoed {
        qp,
        _cq: cq,
        _buf: buf,
        _pd: pd,
    })
}

/// Runs `server` on a thread, waits up to `setup` for it to say it is ready, runs `client` on
/// another, and returns the client's result; an error or panic on either side fails the test.
pub fn against<T: Send + 'static>(
    server: impl FnOnce(Sender<()>) -> Result<(), String> + Send + 'static,
    client: impl FnOnce() -> Result<T, String> + Send + 'static,
    setup: Duration,
) -> T {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // (A panic on the server's thread is printed where it happens; its result channel then
    // closes.)
    std::thread::spawn(move || {
        let _ = done_tx.send(server(ready_tx));
    });
    if ready_rx.recv_timeout(setup).is_err() {
        // Its result if it ended (an error), without waiting long for one that hangs.
        let r = done_rx.recv_timeout(Duration::from_secs(1));
        panic!("server did not start within {setup:?}: {r:?}");
    }
    let cli = std::thread::spawn(client);
    // The client's error first: a server waiting for a client that failed before connecting
    // would otherwise hold the test.
    let c = cli
        .join()
        .expect("client thread")
        .unwrap_or_else(|e| panic!("client: {e}"));
    match done_rx.recv_timeout(setup + crate::common::WAIT) {
        Ok(s) => s.unwrap_or_else(|e| panic!("server: {e}")),
        Err(_) => panic!("the server did not finish (or panicked) after the client did"),
    }
    c
}

/// [`against`] with the client on an engine: `client` runs on a thread in `iwa` with an engine
/// started on [`DEV_A`], after `server` said it is ready; a panic on either side fails the test.
pub fn engine_against<T: Send + 'static>(
    server: impl FnOnce(Sender<()>) -> Result<(), String> + Send + 'static,
    client: impl FnOnce(&XdpEngine) -> T + Send + 'static,
) -> T {
    against(
        server,
        move || {
            enter_ns(NS_A).map_err(|e| e.to_string())?;
            let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default())
                .map_err(|e| format!("engine on {DEV_A}: {e}"))?;
            Ok(client(&engine))
        },
        crate::common::WAIT,
    )
}

/// [`engine_against`] with the engine opened as a [`Device`] (the verbs entry points:
/// `connect_qp`, `connect_async`, ...); `client` fails the test with its error.
#[allow(dead_code)]
pub fn device_against<T: Send + 'static>(
    server: impl FnOnce(Sender<()>) -> Result<(), String> + Send + 'static,
    client: impl FnOnce(&Device) -> Result<T, String> + Send + 'static,
) -> T {
    against(
        server,
        move || {
            enter_ns(NS_A).map_err(|e| e.to_string())?;
            let device = Device::open(Transport::Xdp {
                ifname: DEV_A.into(),
                config: Box::default(),
            })
            .map_err(|e| format!("engine on {DEV_A}: {e}"))?;
            client(&device)
        },
        crate::common::WAIT,
    )
}

/// Connects from the socket transport in `iwb` to the engine's listening `port` in `iwa` and
/// accepts on `listener` with `recvs` posted (checking that the request names the engine's
/// address and port); returns (client, server).
pub fn socket_client_to_engine(
    listener: &Listener,
    port: u16,
    client: &crate::common::Side,
    server: &crate::common::Side,
    recvs: Vec<RecvWr>,
) -> (Connection, Connection) {
    std::thread::scope(|s| {
        let connecting = s.spawn(|| {
            Stack::Socket.connect(
                SocketAddr::from((testbed::ADDR_A, port)),
                &client.pd,
                &client.cq,
                &params(),
                &[],
            )
        });
        let request = listener
            .accept_timeout(crate::common::WAIT)
            .expect("accept")
            .expect("a connection request");
        // `rdma_get_local_addr` on the request's id: the engine's address and port.
        assert_eq!(
            request.local_addr(),
            SocketAddr::from((testbed::ADDR_A, port))
        );
        let accepted = request
            .accept_with_recvs(&server.pd, &server.cq, &[], recvs)
            .expect("accept the request");
        let connected = connecting
            .join()
            .expect("client thread")
            .expect("the client connects");
        (connected, accepted)
    })
}
