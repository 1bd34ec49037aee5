//! The messages of setup calls: the commands application threads hand an engine thread
//! ([`EngineCmd`]: listen, connect, accept, reject, shutdown), the one-shot channels that answer
//! them ([`Reply`]) and the MPA Requests an engine thread passes to a listener ([`RequestMsg`]).

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;

use crossbeam_channel::Sender;
use mpa::RequestInfo;
use rdmap::RecvWr;

use crate::memory::ProtectionDomain;
use crate::verbs::cm::{ConnectParams, ListenRecord};
use crate::verbs::cq::CqSink;
use crate::verbs::qp::QpParts;
use crate::xdp_tcp::ConnId;
use crate::DatapathError;

pub(super) type Reply<T> = Sender<Result<T, DatapathError>>;

pub(super) struct RequestMsg {
    pub(super) id: ConnId,
    /// The MPA Request; `None` for an IFT phase 0 adaption indication.
    pub(super) info: Option<RequestInfo>,
    pub(super) peer: SocketAddr,
    /// The shard whose connection it is.
    pub(super) shard: usize,
}

pub(super) enum EngineCmd {
    Listen {
        port: u16,
        params: ConnectParams,
        requests: Sender<RequestMsg>,
        record: Arc<ListenRecord>,
        reply: Reply<()>,
    },
    Connect {
        addr: SocketAddrV4,
        pd: ProtectionDomain,
        cq: CqSink,
        params: ConnectParams,
        private_data: Vec<u8>,
        recvs: Vec<RecvWr>,
        reply: Reply<(QpParts, Vec<u8>)>,
    },
    Accept {
        id: ConnId,
        pd: ProtectionDomain,
        cq: CqSink,
        private_data: Vec<u8>,
        recvs: Vec<RecvWr>,
        params: ConnectParams,
        reply: Reply<QpParts>,
    },
    Reject {
        id: ConnId,
        private_data: Vec<u8>,
        reply: Reply<()>,
    },
    Shutdown,
    /// Makes the engine thread panic in its turn (tests of the failure path).
    Panic,
}
