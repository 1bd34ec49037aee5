//! A [`Device`]: the transport an application opens (verbs' `ibv_open_device` of a device
//! list's entry, rdma_cm's choice of device by address), serving the one API of
//! [`crate::verbs`]: the socket transport (kernel TCP, any address, no privileges) or the
//! AF_XDP engine on an interface (root).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::engine::xdp::{EngineCounters, XdpEngine, XdpEngineConfig};
use crate::memory::ProtectionDomain;
use crate::socket;
use crate::verbs::cm::{ConnectParams, Connection, Listener};
use crate::verbs::cm_events::{push_outcome, CmEventChannel};
use crate::verbs::cq::CompletionQueue;
use crate::DatapathError;
use rdmap::RecvWr;

/// Which transport a [`Device`] runs.
#[derive(Debug, Clone)]
pub enum Transport {
    /// MPA/DDP/RDMAP over kernel TCP sockets, one thread per connection.
    Socket,
    /// The poll-mode engine: our TCP over AF_XDP on `ifname`, with its options.
    Xdp {
        /// The interface (its IPv4 address is the engine's).
        ifname: String,
        /// Engine options (threads, pinning, rings, inline progress, ...).
        config: Box<XdpEngineConfig>,
    },
}

/// An open transport: listen and connect through it; everything else (protection domains,
/// regions, completion queues, queue pairs) is the same API whichever it is. For the AF_XDP
/// engine, dropping the device stops the engine (its queue pairs end with it).
pub struct Device {
    engine: Option<XdpEngine>,
}

impl Device {
    /// Opens `transport`: nothing to do for sockets; starts the engine on its interface for
    /// AF_XDP (root; fails with the engine's error, e.g. no such interface, not root).
    pub fn open(transport: Transport) -> Result<Device, DatapathError> {
        let engine = match transport {
            Transport::Socket => None,
            Transport::Xdp { ifname, config } => Some(XdpEngine::start(&ifname, *config)?),
        };
        Ok(Device { engine })
    }

    /// The socket transport.
    pub fn socket() -> Device {
        Device { engine: None }
    }

    /// The engine, if this device is the AF_XDP one (its counters, shards, ...).
    pub fn engine(&self) -> Option<&XdpEngine> {
        self.engine.as_ref()
    }

    /// The address this device listens on for `port`: the engine's interface address, or
    /// `bind` for sockets.
    pub fn listen_addr(&self, bind: IpAddr, port: u16) -> SocketAddr {
        match &self.engine {
            Some(e) => SocketAddr::from((e.local_ip(), port)),
            None => SocketAddr::new(bind, port),
        }
    }

    /// The engine's IPv4 address; `None` for sockets (any local address).
    pub fn local_ip(&self) -> Option<Ipv4Addr> {
        self.engine.as_ref().map(XdpEngine::local_ip)
    }

    /// Listens (`rdma_listen`): on `addr` for sockets; on `addr`'s port at the interface's
    /// address for the engine (whose IP is that of its interface: `addr`'s must be it or
    /// unspecified).
    pub fn listen(
        &self,
        addr: SocketAddr,
        params: ConnectParams,
    ) -> Result<Listener, DatapathError> {
        if params.backlog > crate::verbs::cm::MAX_BACKLOG {
            return Err(DatapathError::InvalidArgument(
                "a listener's backlog is at most MAX_BACKLOG (65536) Requests",
            ));
        }
        match &self.engine {
            None => Listener::bind(addr, params),
            Some(e) => {
                let ip = addr.ip();
                if !ip.is_unspecified() && ip != IpAddr::V4(e.local_ip()) {
                    return Err(DatapathError::InvalidArgument(
                        "the engine listens on its interface's address only",
                    ));
                }
                e.listen(addr.port(), params)
            }
        }
    }

    /// Connects (`rdma_connect`) and starts the queue pair.
    pub fn connect(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
        private_data: &[u8],
    ) -> Result<Connection, DatapathError> {
        self.connect_with_recvs(addr, pd, cq, params, private_data, Vec::new())
    }

    /// [`Device::connect`] with `recvs` posted to the queue pair before the peer can send
    /// anything, as verbs applications post receives between `rdma_create_qp` and
    /// `rdma_connect`. iWARP has no receiver-not-ready retry: a Send that finds no posted
    /// buffer ends the connection (RFC 5041 7.1), and with peer-to-peer setup (RFC 6581, an
    /// RTR) or a responder that does not wait for the first FPDU, the peer may send before
    /// `connect` returns.
    ///
    /// The receives count against `params.rq_depth`. Receives that cannot be posted fail the
    /// call before the peer sees a connection: more than the depth with `RecvQueueFull`, any
    /// with `params.srq` with `InvalidWorkRequest` (as `post_recv` on such a queue pair), one
    /// naming memory the queue pair may not write with `InvalidArgument`. If the connect fails
    /// later (rejected, timed out), they go with the queue pair the application never got: no
    /// completion reports them.
    pub fn connect_with_recvs(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
        private_data: &[u8],
        recvs: Vec<RecvWr>,
    ) -> Result<Connection, DatapathError> {
        match &self.engine {
            None => socket::connect_with_recvs(addr, pd, cq, params, private_data, recvs),
            Some(e) => e.connect_with_recvs(addr, pd, cq, params, private_data, recvs),
        }
    }

    /// Starts connecting and returns at once (`rdma_connect` on an event channel): the outcome
    /// is queued on `channel`, tagged with `context`, as `CmEvent::Established` (whose queue
    /// pair then also reports `CmEvent::Disconnected` there), `CmEvent::Rejected` or
    /// `CmEvent::ConnectError` (see [`crate::CmEvent`]). A thread waits for the outcome (the
    /// socket transport's connect runs on it).
    #[allow(clippy::too_many_arguments)]
    pub fn connect_async(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
        private_data: &[u8],
        channel: &CmEventChannel,
        context: u64,
    ) -> Result<(), DatapathError> {
        let recvs = Vec::new();
        self.connect_async_with_recvs(addr, pd, cq, params, private_data, recvs, channel, context)
    }

    /// [`Device::connect_async`] with `recvs` posted before the peer can send anything (see
    /// [`Device::connect_with_recvs`]).
    #[allow(clippy::too_many_arguments)]
    pub fn connect_async_with_recvs(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
        private_data: &[u8],
        recvs: Vec<RecvWr>,
        channel: &CmEventChannel,
        context: u64,
    ) -> Result<(), DatapathError> {
        let wait: Box<dyn FnOnce() -> Result<Connection, DatapathError> + Send> = match &self.engine
        {
            Some(e) => e.start_connect(addr, pd, cq, params, private_data, recvs)?,
            None => {
                let (pd, cq, params) = (pd.clone(), cq.clone(), params.clone());
                let private_data = private_data.to_vec();
                Box::new(move || {
                    socket::connect_with_recvs(addr, &pd, &cq, &params, &private_data, recvs)
                })
            }
        };
        let channel = channel.clone();
        std::thread::Builder::new()
            .name("iwarp-cm-connect".into())
            .spawn(move || push_outcome(&channel, context, wait()))?;
        Ok(())
    }

    /// Stops the engine (closing its connections) and returns its final counters; `None` for
    /// sockets.
    pub fn close(self) -> Option<EngineCounters> {
        let mut engine = self.engine?;
        engine.stop();
        Some(engine.counters())
    }
}
