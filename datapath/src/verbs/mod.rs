//! The application API, in verbs' terms: protection domains and memory regions
//! ([`crate::ProtectionDomain`], [`crate::MemoryRegion`]), completion queues and channels ([`cq`]),
//! shared receive queues ([`srq`]), queue pairs ([`qp`]; before their connection, [`idle`]) and
//! rdma_cm-style connection management ([`cm`]). Both transports (the socket transport,
//! [`crate::socket`], and the AF_XDP engine, [`crate::engine::xdp`]) serve this one layer; nothing
//! in it names either.

pub(crate) mod async_events;
pub(crate) mod cm;
pub(crate) mod cm_events;
pub(crate) mod cq;
mod event_queue;
pub(crate) mod idle;
pub(crate) mod probe;
pub(crate) mod qp;
pub(crate) mod srq;
pub(crate) mod timeout;
