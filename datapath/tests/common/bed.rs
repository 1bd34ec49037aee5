//! Setup shared by the veth-bed tests of the AF_XDP engine against a socket-transport peer:
//! the peer listens in `iwb` on [`ADDR_B`], the engine runs in `iwa` on [`DEV_A`].

use std::net::SocketAddr;
use std::sync::mpsc::Sender;
use std::time::Duration;

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::ProtectionDomain;
use datapath::{CompletionQueue, ConnectParams, ConnectRequest, Connection, Listener};
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
    enter_ns(NS_B).map_err(|e| e.to_string())?;
    let listener = Listener::bind(SocketAddr::from((ADDR_B, port)), params())
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
