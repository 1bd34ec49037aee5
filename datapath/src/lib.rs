//! iWARP (RDMAP / DDP / MPA) for applications, in the verbs vocabulary: protection domains,
//! memory regions over the application's own memory, completion queues with an epoll-able
//! completion channel, queue pairs with scatter/gather lists, shared receive queues, and
//! rdma_cm-style connection management (blocking, or through an event channel). One API, two
//! transports behind a [`Device`]: the *socket transport* (the sans-IO `mpa`, `ddp` and `rdmap`
//! crates over a kernel TCP socket, MPA's "dual stack", draft-ietf-rddp-mpa-01 6.1.4; no
//! privileges) and the *AF_XDP engine* ([`engine::xdp::XdpEngine`]: our own TCP over AF_XDP,
//! payload placed straight into registered memory, even out of order; root).
//!
//! # Quick start
//!
//! A server lets a client RDMA Write into a buffer the server allocated itself, over the
//! socket transport on loopback (`Device::open(Transport::Xdp { .. })` instead runs the same
//! code on the AF_XDP engine):
//!
//! ```
//! use datapath::{Access, CompletionQueue, ConnectParams, Device, ProtectionDomain};
//! use datapath::{SendOp, SendWr, Stag, WcStatus};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), datapath::DatapathError> {
//! let device = Device::socket();
//! let listener = device.listen("127.0.0.1:0".parse().unwrap(), ConnectParams::default())?;
//! let addr = listener.local_addr()?;
//!
//! // The server: its own buffer, registered in place; where it is goes in the MPA Reply.
//! let server = std::thread::spawn(move || -> Result<Vec<u8>, datapath::DatapathError> {
//!     let pd = ProtectionDomain::new();
//!     let cq = CompletionQueue::new();
//!     let mr = pd.register_buffer(vec![0u8; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//!     let mut where_ = mr.stag().0.to_be_bytes().to_vec();
//!     where_.extend_from_slice(&mr.base_to().to_be_bytes());
//!     let request = listener.accept()?;
//!     let mut conn = request.accept(&pd, &cq, &where_)?;
//!     conn.qp.wait_finished(Duration::from_secs(10)); // the client closes when done
//!     conn.qp.disconnect();
//!     mr.into_buffer::<Vec<u8>>() // the very Vec, with the client's bytes in it
//! });
//!
//! // The client: RDMA Write from its own buffer into the server's.
//! let pd = ProtectionDomain::new();
//! let cq = CompletionQueue::new();
//! let src = pd.register_buffer(b"hello, iWARP".to_vec(), Access::NONE)?;
//! let conn = device.connect(addr, &pd, &cq, &ConnectParams::default(), b"")?;
//! let stag = Stag(u32::from_be_bytes(conn.private_data[..4].try_into().unwrap()));
//! let to = u64::from_be_bytes(conn.private_data[4..12].try_into().unwrap());
//! conn.qp.post_send(SendWr {
//!     wr_id: 1,
//!     op: SendOp::Write { remote_stag: stag, remote_to: to },
//!     sg_list: src.sge(0, 12).into(),
//!     signaled: true,
//!     fence: false,
//! })?;
//! let done = cq.wait(Duration::from_secs(10)).expect("a completion");
//! assert_eq!(done.wc.status, WcStatus::Success);
//! drop(conn); // disconnects
//! let bytes = server.join().unwrap()?;
//! assert_eq!(&bytes[..12], b"hello, iWARP");
//! # Ok(())
//! # }
//! ```
//!
//! `datapath/examples/` has a Write/Read/Send client and server over either transport, the
//! client optionally waiting for completions in epoll.

mod device;
pub mod engine;
mod error;
mod log_rate;
mod memory;
pub mod probe;
mod socket;
mod turn;
mod verbs;
pub mod xdp_tcp;
pub mod xsk;

pub use device::{Device, DeviceAttr, PortAttr, PortState, Transport};
pub use error::{DatapathError, PostListError, QpError};
pub use memory::{
    Deregistration, MemoryRegion, PinnedBuffer, Pinning, ProtectionDomain, RegionStorage,
};
pub use mpa::wire::EnhancedParams;
pub use mpa::{MpaConfig, Negotiated};
pub use rdmap::{
    Access, AtomicOp, InlineData, InlineSendWr, InlineTooLong, QpState, RdmapError, RecvWr, SendOp,
    SendWr, Sge, SgeList, Stag, WcOpcode, WcStatus, WorkCompletion, MAX_INLINE_DATA, MAX_SGE,
};
pub use socket::{connect, connect_with_recvs};
pub use verbs::async_events::{AsyncEvent, AsyncEventChannel};
pub use verbs::cm::{
    ConnectParams, ConnectRequest, Connection, Framing, Keepalive, ListenStats, Listener,
    MAX_BACKLOG, MAX_CLOSE_TIMEOUT, MAX_IRD_ORD, MAX_QP_WR, MAX_USER_TIMEOUT,
};
pub use verbs::cm_events::{
    CmEvent, CmEventChannel, ConnectAttempt, ListenerId, NotifyingListener,
};
pub use verbs::cq::{Completion, CompletionChannel, CompletionQueue, DEFAULT_CQE, MAX_CQE};
pub use verbs::idle::{IdleQp, QpPoster};
pub use verbs::probe::{probe_rdmap_extensions, ExtensionSupport};
pub use verbs::qp::{Agreed, QpAttr, QpStatus, QueuePair, SendRequest};
pub use verbs::srq::{SharedReceiveQueue, MAX_SRQ_WR};
