//! A [`Device`]: the transport an application opens (verbs' `ibv_open_device` of a device
//! list's entry, rdma_cm's choice of device by address), serving the one API of
//! [`crate::verbs`]: the socket transport (kernel TCP, any address, no privileges) or the
//! AF_XDP engine on an interface (root).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::engine::xdp::{EngineCounters, PendingConnect, XdpEngine, XdpEngineConfig};
use crate::memory::ProtectionDomain;
use crate::socket;
use crate::verbs::async_events::{AsyncEvent, AsyncEventChannel};
use crate::verbs::cm::{
    check_connect, ConnectParams, Connection, Listener, MAX_BACKLOG, MAX_IRD_ORD, MAX_QP_WR,
};
use crate::verbs::cm_events::{push_outcome, CmEvent, CmEventChannel, ConnectAttempt};
use crate::verbs::cq::CompletionQueue;
use crate::verbs::idle::{IdleHandOver, IdleQp};
use crate::verbs::qp::QpStart;
use crate::verbs::srq::MAX_SRQ_WR;
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

/// What a [`Device`] supports ([`Device::attr`]): verbs' `ibv_query_device` and the parts of
/// `ibv_query_port` an iWARP device has. Each limit is one the API enforces; the field says
/// what exceeding it returns (queue depths, IRD/ORD and the backlog are checked by every
/// connect, listen and accept before a connection is made: [`ConnectParams`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// `max_qp_wr`: work requests a send or receive queue holds ([`MAX_QP_WR`]; more in
    /// [`ConnectParams`] fails the connect, listen or accept with
    /// [`DatapathError::InvalidArgument`]).
    pub max_qp_wr: usize,
    /// `max_sge`: elements of a work request's scatter/gather list ([`rdmap::MAX_SGE`]; an
    /// [`rdmap::SgeList`] holds no more).
    pub max_sge: usize,
    /// `max_sge_rd`: non-empty elements a Read's sink may have (a Read places into one
    /// contiguous range: more fails the post with [`DatapathError::InvalidWorkRequest`]).
    pub max_sge_rd: usize,
    /// `max_inline_data`: octets a Send or Write may carry inline
    /// ([`rdmap::MAX_INLINE_DATA`]).
    pub max_inline_data: usize,
    /// `max_msg_sz`: octets of one message, its elements together (RFC 5040's Read Message
    /// Size and the length a receive reports are 32 bits); more completes the request with
    /// a local length error.
    pub max_msg_size: u64,
    /// `max_mr`: regions a protection domain holds at once (2^24 - 1 STag indices;
    /// [`DatapathError::RegionTableFull`] beyond).
    pub max_mr: usize,
    /// `max_qp_rd_atom`: the largest IRD a queue pair offers ([`MAX_IRD_ORD`]).
    pub max_qp_rd_atom: u16,
    /// `max_qp_init_rd_atom`: the largest ORD a queue pair asks for ([`MAX_IRD_ORD`]).
    pub max_qp_init_rd_atom: u16,
    /// `max_srq_wr`: receives a shared receive queue holds ([`MAX_SRQ_WR`]).
    pub max_srq_wr: usize,
    /// `max_cqe`: completions a completion queue holds ([`crate::MAX_CQE`]; more fails
    /// [`crate::CompletionQueue::create`]).
    pub max_cqe: usize,
    /// `max_srq_sge`: elements of a receive posted to a shared receive queue.
    pub max_srq_sge: usize,
    /// `max_qp`: the most connections the device holds at once; `None` when only the system
    /// limits them (the socket transport: a thread and a socket each). On the AF_XDP engine
    /// this bounds its TCP connections, those in TIME-WAIT (60 s after a close) and those
    /// waiting for an accept included, and each shard has its own share: a connect beyond
    /// its shard's fails with [`DatapathError::Xdp`] (the connection table is full).
    pub max_qp: Option<usize>,
    /// Most Requests a listener keeps waiting for accept or reject ([`MAX_BACKLOG`]).
    pub max_backlog: usize,
    /// `atomic_cap`: RFC 7306's Atomic Operations (masked Fetch-and-Add and Compare-and-Swap
    /// on 64-bit words) are atomic with respect to every CPU of the host (verbs'
    /// `IBV_ATOMIC_GLOB`: they are the CPU's own atomic instructions on the region's memory),
    /// on queue pairs with [`ConnectParams::rdmap_extensions`].
    pub atomics_global: bool,
    /// `fw_ver`: this library's version (no firmware below it).
    pub fw_ver: &'static str,
    /// `node_guid`: the modified EUI-64 of the engine's interface MAC address (RFC 4291
    /// appendix A: `ff:fe` in the middle, the universal/local bit flipped), as siw derives its
    /// node GUID; the octets in network order are `node_guid.to_be_bytes()` (verbs'
    /// `__be64`). 0 for the socket transport, which has no interface of its own.
    pub node_guid: u64,
    /// The port: its state, addresses and MTU.
    pub port: PortAttr,
}

/// A port's state (`ibv_port_attr.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// `IBV_PORT_ACTIVE`: the interface is up and has a carrier; the socket transport's port
    /// always (the kernel routes through whichever interface reaches the peer).
    Active,
    /// `IBV_PORT_DOWN`: the interface is down, has no carrier, or is gone.
    Down,
}

/// A device's port ([`DeviceAttr::port`]; the parts of `ibv_query_port` an iWARP device has).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// The IPv4 address it speaks from (the GID an iWARP device derives from it); `None` for
    /// the socket transport, which speaks from any address of the host.
    pub addr: Option<Ipv4Addr>,
    /// `active_mtu`: the MTU its TCP sizes segments from (and FPDUs from them, RFC 5044 5.1's
    /// MULPDU), as the engine found it when it started ([`XdpEngine::mtu`]); `None` for the
    /// socket transport, where the kernel's path to each peer decides.
    pub mtu: Option<u16>,
    /// `state`: whether the engine's interface passes packets, as of the query.
    pub state: PortState,
    /// The engine's interface MAC address (when it started); `None` for the socket transport.
    pub mac: Option<[u8; 6]>,
}

impl PortAttr {
    /// `ibv_query_gid` of index 0: the MAC address in the first six octets, the rest zero,
    /// as iWARP devices (siw among them) report their GID; all zero for the socket transport.
    pub fn gid(&self) -> [u8; 16] {
        let mut gid = [0u8; 16];
        if let Some(mac) = self.mac {
            gid[..6].copy_from_slice(&mac);
        }
        gid
    }
}

/// A source address [`Device::checked_source`] found to be ours.
enum Source {
    /// The engine's address, with the port to name.
    Engine { port: u16 },
    /// The socket transport's route probe, bound to the source, and the port to name.
    Socket {
        probe: std::net::UdpSocket,
        port: u16,
    },
}

/// The event of an address resolution's outcome.
fn addr_event(outcome: Result<SocketAddr, DatapathError>, context: u64) -> CmEvent {
    match outcome {
        Ok(local_addr) => CmEvent::AddrResolved {
            context,
            local_addr,
        },
        Err(error) => CmEvent::AddrError { context, error },
    }
}

/// The modified EUI-64 of a MAC address (RFC 4291 appendix A), as a number whose big-endian
/// octets are the identifier.
fn eui64_of(mac: [u8; 6]) -> u64 {
    let [a, b, c, d, e, f] = mac;
    u64::from_be_bytes([a ^ 0x02, b, c, 0xff, 0xfe, d, e, f])
}

/// An open transport: listen and connect through it; everything else (protection domains,
/// regions, completion queues, queue pairs) is the same API whichever it is. For the AF_XDP
/// engine, dropping the device's last handle stops the engine (its queue pairs end with it).
///
/// Cloning gives another handle to the same device (the same engine), as every
/// `rdma_cm_id::verbs` of a process names the one `ibv_context` of its device: a program that
/// opens the device itself and then uses the context an id carries uses one engine, not two.
#[derive(Clone)]
pub struct Device {
    engine: Option<std::sync::Arc<XdpEngine>>,
}

/// What an asynchronous connect starts with: the queue pair's parts, and the receives to
/// flush if it fails (those of an [`IdleQp`]; receives posted with the call itself belong to
/// a queue pair the application never gets, and complete nowhere).
struct Connect {
    addr: SocketAddr,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    params: ConnectParams,
    start: QpStart,
    hand_over: Option<IdleHandOver>,
}

impl Device {
    /// Opens `transport`: nothing to do for sockets; starts the engine on its interface for
    /// AF_XDP (root; fails with the engine's error, e.g. no such interface, not root).
    pub fn open(transport: Transport) -> Result<Device, DatapathError> {
        let engine = match transport {
            Transport::Socket => None,
            Transport::Xdp { ifname, config } => {
                Some(std::sync::Arc::new(XdpEngine::start(&ifname, *config)?))
            }
        };
        Ok(Device { engine })
    }

    /// The socket transport.
    pub fn socket() -> Device {
        Device { engine: None }
    }

    /// The engine, if this device is the AF_XDP one (its counters, shards, ...).
    pub fn engine(&self) -> Option<&XdpEngine> {
        self.engine.as_deref()
    }

    /// What the device supports (`ibv_query_device`, `ibv_query_port`).
    pub fn attr(&self) -> DeviceAttr {
        DeviceAttr {
            max_qp_wr: MAX_QP_WR,
            max_sge: rdmap::MAX_SGE,
            max_sge_rd: 1,
            max_inline_data: rdmap::MAX_INLINE_DATA,
            max_msg_size: u64::from(u32::MAX),
            max_mr: rdmap::Stag::MAX_INDEX as usize,
            max_qp_rd_atom: MAX_IRD_ORD,
            max_qp_init_rd_atom: MAX_IRD_ORD,
            max_srq_wr: MAX_SRQ_WR,
            max_cqe: crate::MAX_CQE,
            max_srq_sge: rdmap::MAX_SGE,
            max_qp: self.engine.as_deref().map(XdpEngine::max_connections),
            max_backlog: MAX_BACKLOG,
            atomics_global: true,
            fw_ver: env!("CARGO_PKG_VERSION"),
            node_guid: self.engine.as_deref().map_or(0, |e| eui64_of(e.mac())),
            port: PortAttr {
                addr: self.local_ip(),
                mtu: self.engine.as_deref().map(XdpEngine::mtu),
                state: match self.engine.as_deref().map(XdpEngine::link_up) {
                    None | Some(true) => PortState::Active,
                    Some(false) => PortState::Down,
                },
                mac: self.engine.as_deref().map(XdpEngine::mac),
            },
        }
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
        self.engine.as_deref().map(XdpEngine::local_ip)
    }

    /// Listens (`rdma_listen`): on `addr` for sockets; on `addr`'s port at the interface's
    /// address for the engine (whose IP is that of its interface: `addr`'s must be it or
    /// unspecified).
    pub fn listen(
        &self,
        addr: SocketAddr,
        params: ConnectParams,
    ) -> Result<Listener, DatapathError> {
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
        let start = QpStart::with_recvs(recvs);
        self.connect_start(addr, pd, cq, params, private_data, start)
    }

    /// Connects a queue pair created before (`rdma_connect` after `rdma_create_qp`): as
    /// [`Device::connect_with_recvs`] with the queue pair's protection domain, completion
    /// queue, parameters and posted receives; the running queue pair keeps its number. If it
    /// fails, the receives complete as flushed first (see [`IdleQp`]).
    pub fn connect_qp(
        &self,
        qp: IdleQp,
        addr: SocketAddr,
        private_data: &[u8],
    ) -> Result<Connection, DatapathError> {
        let qp = qp.into_parts();
        let outcome = self.connect_start(addr, &qp.pd, &qp.cq, &qp.params, private_data, qp.start);
        qp.hand_over.after(outcome)
    }

    fn connect_start(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
        private_data: &[u8],
        start: QpStart,
    ) -> Result<Connection, DatapathError> {
        match &self.engine {
            None => socket::connect_start(addr, pd, cq, params, private_data, start),
            Some(e) => e.start_connect(addr, pd, cq, params, private_data, start)?(),
        }
    }

    /// Starts connecting and returns at once (`rdma_connect` on an event channel): the outcome
    /// is queued on `channel`, tagged with `context`, as `CmEvent::Established` (whose queue
    /// pair then also reports `CmEvent::Disconnected` there), `CmEvent::Rejected` or
    /// `CmEvent::ConnectError` (see [`crate::CmEvent`]). A thread waits for the outcome (the
    /// socket transport's connect runs on it). The returned [`ConnectAttempt`] cancels it
    /// (`rdma_destroy_id` on the connecting id); dropping it leaves the attempt running.
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
    ) -> Result<ConnectAttempt, DatapathError> {
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
    ) -> Result<ConnectAttempt, DatapathError> {
        let connect = Connect {
            addr,
            pd: pd.clone(),
            cq: cq.clone(),
            params: params.clone(),
            start: QpStart::with_recvs(recvs),
            hand_over: None,
        };
        self.connect_async_start(connect, private_data, channel, context)
    }

    /// Starts connecting a queue pair created before and returns at once: as
    /// [`Device::connect_async`], with the queue pair's protection domain, completion queue,
    /// parameters and posted receives (see [`Device::connect_qp`]).
    pub fn connect_qp_async(
        &self,
        qp: IdleQp,
        addr: SocketAddr,
        private_data: &[u8],
        channel: &CmEventChannel,
        context: u64,
    ) -> Result<ConnectAttempt, DatapathError> {
        let qp = qp.into_parts();
        let connect = Connect {
            addr,
            pd: qp.pd,
            cq: qp.cq,
            params: qp.params,
            start: qp.start,
            hand_over: Some(qp.hand_over),
        };
        self.connect_async_start(connect, private_data, channel, context)
    }

    fn connect_async_start(
        &self,
        connect: Connect,
        private_data: &[u8],
        channel: &CmEventChannel,
        context: u64,
    ) -> Result<ConnectAttempt, DatapathError> {
        let Connect {
            addr,
            pd,
            cq,
            params,
            start,
            hand_over,
        } = connect;
        let started = match &self.engine {
            // `start_connect` checks the parameters itself.
            Some(e) => e.start_connect(addr, &pd, &cq, &params, private_data, start),
            // Refused here, as by the synchronous connect and the engine, rather than as an
            // event.
            None => check_connect(&params, &pd, private_data, &start.recvs).map(|()| {
                let private_data = private_data.to_vec();
                let wait: PendingConnect = Box::new(move || {
                    socket::connect_start(addr, &pd, &cq, &params, &private_data, start)
                });
                wait
            }),
        };
        let wait = match started {
            Ok(wait) => wait,
            Err(e) => {
                if let Some(hand_over) = hand_over {
                    hand_over.fail();
                }
                return Err(e);
            }
        };
        let channel = channel.clone();
        let attempt = ConnectAttempt::new();
        let outcome_of = attempt.clone();
        // The attempt goes to the thread once it runs: should no thread be had, the receives
        // are still here to flush.
        let (give, take) = std::sync::mpsc::sync_channel::<(PendingConnect, _)>(1);
        let spawned = std::thread::Builder::new()
            .name("iwarp-cm-connect".into())
            .spawn(move || {
                let Ok((wait, hand_over)) = take.recv() else {
                    return;
                };
                // A panic (a bug, possibly reached by the peer's bytes in the socket
                // transport's startup) is this attempt's error, not a lost event.
                let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(wait))
                    .unwrap_or_else(|cause| Err(crate::error::panicked("connecting", &*cause)));
                let outcome = IdleHandOver::after_maybe(hand_over, waited);
                push_outcome(&channel, context, &outcome_of, outcome);
            });
        if let Err(e) = spawned {
            // Dropping the wait gives up the attempt: the engine drops the connection.
            drop(wait);
            if let Some(hand_over) = hand_over {
                hand_over.fail();
            }
            return Err(e.into());
        }
        // The thread waits for it: the channel has room for it, and its receiver lives.
        let _ = give.send((wait, hand_over));
        Ok(attempt)
    }

    /// Resolves `dst` as `rdma_resolve_addr` does, and queues the outcome on `channel`,
    /// tagged with `context`, before it returns: [`CmEvent::AddrResolved`] with the local
    /// address a connection to `dst` leaves from (the kernel's route lookup; no packet is
    /// sent), or [`CmEvent::AddrError`]. On the AF_XDP engine the route must leave through the
    /// engine's interface (else [`crate::xdp_tcp::XdpTcpError::WrongInterface`]), `dst` must be
    /// IPv4, and the local address is the engine's; the engine thread looks the route up, in
    /// the engine's network namespace (a stopped engine: [`DatapathError::Disconnected`]).
    pub fn resolve_addr(&self, dst: SocketAddr, channel: &CmEventChannel, context: u64) {
        let any = match dst {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)),
        };
        let outcome = self
            .checked_source(any)
            .and_then(|source| self.local_addr_from(source, dst));
        channel.push(addr_event(outcome, context));
    }

    /// [`Device::resolve_addr`] from a source address (`rdma_resolve_addr` with `src_addr`,
    /// or after `rdma_bind_addr`; rping's `-I`, perftest's `--source_ip`). As
    /// `rdma_resolve_addr` does, it fails at once if `src` is of another family than `dst`
    /// ([`DatapathError::InvalidArgument`], `EINVAL`) or not an address of ours (`EADDRNOTAVAIL`:
    /// on the AF_XDP engine, not the engine's; on the socket transport, one the kernel will
    /// not bind, so a host with `net.ipv4.ip_nonlocal_bind` set takes any); the unspecified
    /// address lets the route choose. Otherwise the outcome is an event:
    /// [`CmEvent::AddrResolved`] names the source with `src`'s port, or
    /// [`CmEvent::AddrError`]. Connect from it with
    /// [`ConnectParams::local_addr`](crate::ConnectParams::local_addr).
    pub fn resolve_addr_from(
        &self,
        src: SocketAddr,
        dst: SocketAddr,
        channel: &CmEventChannel,
        context: u64,
    ) -> Result<(), DatapathError> {
        if src.is_ipv4() != dst.is_ipv4() {
            return Err(DatapathError::InvalidArgument(
                "source and destination addresses of different families",
            ));
        }
        let source = self.checked_source(src)?;
        channel.push(addr_event(self.local_addr_from(source, dst), context));
        Ok(())
    }

    /// `src` as a source address of ours: on the AF_XDP engine, the engine's address or the
    /// unspecified one; on the socket transport, one the kernel binds (the route probe bound
    /// to it, an IPv6 scope kept). Else `EADDRNOTAVAIL`.
    fn checked_source(&self, src: SocketAddr) -> Result<Source, DatapathError> {
        let not_ours = || DatapathError::Io(std::io::Error::from_raw_os_error(libc::EADDRNOTAVAIL));
        match &self.engine {
            Some(e) if !src.ip().is_unspecified() && src.ip() != e.local_ip() => Err(not_ours()),
            Some(_) => Ok(Source::Engine { port: src.port() }),
            None => {
                let mut from = src;
                from.set_port(0);
                match std::net::UdpSocket::bind(from) {
                    Ok(probe) => Ok(Source::Socket {
                        probe,
                        port: src.port(),
                    }),
                    Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => Err(not_ours()),
                    Err(e) => Err(DatapathError::Io(e)),
                }
            }
        }
    }

    /// The local address a connection to `dst` from `source` leaves from, with the source's
    /// port.
    fn local_addr_from(
        &self,
        source: Source,
        dst: SocketAddr,
    ) -> Result<SocketAddr, DatapathError> {
        match (source, &self.engine) {
            (Source::Engine { port }, Some(e)) => {
                let SocketAddr::V4(v4) = dst else {
                    return Err(DatapathError::InvalidArgument(
                        "the AF_XDP engine speaks IPv4 only",
                    ));
                };
                e.route_check(*v4.ip())?;
                Ok(SocketAddr::from((e.local_ip(), port)))
            }
            (Source::Socket { probe, port }, _) => {
                // Connected to `dst`, the probe learns the kernel's route (and the source
                // address, if it was bound to none); nothing is sent. `dst` itself (an IPv6
                // scope kept), at a port a UDP connect takes.
                let mut to = dst;
                to.set_port(dst.port().max(1));
                probe.connect(to)?;
                Ok(SocketAddr::new(probe.local_addr()?.ip(), port))
            }
            (Source::Engine { .. }, None) => Err(DatapathError::Disconnected),
        }
    }

    /// Resolves the route to `dst` as `rdma_resolve_route` does, and queues the outcome on
    /// `channel`, tagged with `context`: [`CmEvent::RouteResolved`] or
    /// [`CmEvent::RouteError`]. On the AF_XDP engine the next hop's MAC address is resolved
    /// through the kernel's neighbour table (ARP), on a thread of its own, waiting up to the
    /// engine's `neighbour_timeout` (3 s by default), and the route must still leave through
    /// the engine's interface; the socket transport leaves that to the kernel's TCP when it
    /// connects, and queues `RouteResolved` at once. On the engine both are looked up in its
    /// network namespace, whichever the calling thread is in. Returns `Ok`: every outcome is
    /// an event (a stopped engine's, `RouteError` with [`DatapathError::Disconnected`]).
    pub fn resolve_route(
        &self,
        dst: SocketAddr,
        channel: &CmEventChannel,
        context: u64,
    ) -> Result<(), DatapathError> {
        let outcome = move |r: Result<(), DatapathError>| match r {
            Ok(()) => CmEvent::RouteResolved { context },
            Err(error) => CmEvent::RouteError { context, error },
        };
        let Some(e) = &self.engine else {
            channel.push(outcome(Ok(())));
            return Ok(());
        };
        let SocketAddr::V4(v4) = dst else {
            channel.push(outcome(Err(DatapathError::InvalidArgument(
                "the AF_XDP engine speaks IPv4 only",
            ))));
            return Ok(());
        };
        // Weak: the engine thread tells the outcome, and must never drop the channel's last
        // handle (the connections queued on it would close there, waiting for that thread).
        let channel = channel.downgrade();
        e.resolve_route(*v4.ip(), move |r| channel.push(outcome(r)));
        Ok(())
    }

    /// Sends the device's own asynchronous event to `channel`: [`AsyncEvent::DeviceFatal`] when
    /// the AF_XDP engine fails (a thread's panic or a fatal driver error; its queue pairs end
    /// with [`crate::QpError::EngineFailed`], each reporting [`AsyncEvent::QpFatal`] where
    /// asked), at once if it has failed already. Not when it is stopped. The socket transport
    /// has no device-wide failure: nothing is sent. A second call replaces the first.
    pub fn notify_async(&self, channel: &AsyncEventChannel) {
        if let Some(e) = &self.engine {
            let channel = channel.clone();
            e.on_failure(std::sync::Arc::new(move || {
                channel.push(AsyncEvent::DeviceFatal)
            }));
        }
    }

    /// Stops the engine (closing its connections) and returns its final counters, if this is
    /// the device's last handle; with other handles left, only this one goes (the engine runs
    /// on for them) and the counters so far are returned. `None` for sockets.
    pub fn close(self) -> Option<EngineCounters> {
        match std::sync::Arc::try_unwrap(self.engine?) {
            Ok(mut engine) => {
                engine.stop();
                Some(engine.counters())
            }
            Err(shared) => Some(shared.counters()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4291 appendix A's example: 34-56-78-9A-BC-DE becomes 36-56-78-FF-FE-9A-BC-DE.
    #[test]
    fn node_guid_is_the_modified_eui64_of_the_mac() {
        let guid = eui64_of([0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde]);
        assert_eq!(
            guid.to_be_bytes(),
            [0x36, 0x56, 0x78, 0xff, 0xfe, 0x9a, 0xbc, 0xde]
        );
    }
}
