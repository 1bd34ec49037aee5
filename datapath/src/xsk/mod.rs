//! The AF_XDP port: UMEM, fill/completion/RX/TX rings and a frame allocator, on `xsk-rs`.
//!
//! One [`XskSocket`] is one AF_XDP socket bound to one queue of one interface, with **its own
//! UMEM** (one UMEM per queue, not a shared one): each queue is meant to be owned by one engine
//! thread, so no frame ever crosses threads and nothing needs a lock; the cost is memory (a
//! default socket holds 512 RX and 2048 TX frames of 4 KiB = 10 MiB). For several queues, open one socket per
//! queue ([`XskSocket::open_queues`]).
//!
//! The socket does not load an XDP program (libxdp's default program is inhibited): the caller
//! attaches the project's steering program (`xdp-prog`) and puts [`XskSocket::fd`] into its
//! XSKMAP with `SteeringProgram::bind_socket(queue, fd)`.
//!
//! Receive: frames cycle between the fill ring and the RX ring. [`XskSocket::recv_batch`] takes up
//! to a batch of received frames and returns an [`RxBatch`] of borrowed views into the UMEM;
//! dropping the batch gives the frames back to the fill ring. Transmit: a free list of TX frames
//! (preallocated, no allocation per packet); [`XskSocket::send_batch`] fills frames through a
//! callback, puts them on the TX ring and kicks the kernel with `sendto` once per
//! [`XskConfig::kick_batch`] frames (copy mode, as on veth, sends at most 32 frames per kick);
//! completions, reaped after each kick, return the frames to the top of the free list (a stack),
//! so the frames written next are the ones the kernel has just read.
//!
//! Also here: interface facts, route and neighbour (ARP) lookup over rtnetlink
//! ([`interface_info`], [`resolve_next_hop`]) and frame building ([`packet`]).

pub mod capture;
mod error;
pub mod ethtool;
mod frame_book;
mod join;
mod netlink;
pub mod packet;
pub mod rss;
mod socket;

pub use capture::{Capture, CaptureConfig, CaptureStats, CaptureTap};
pub use error::XskError;
pub use join::PayloadDigest;
pub use netlink::{
    interface_info, known_next_hop, neighbour, next_hop_mac, resolve_next_hop, route_to,
    xdp_device_features, InterfaceInfo, InterfaceQuery, Route, XdpDeviceFeatures,
};
pub use socket::{
    BindMode, BusyPoll, BusyPollState, RxBatch, XskConfig, XskSocket, XskStats,
    MAX_FRAMES_PER_PACKET,
};
/// The steering program and its loader (the `xdp-prog` crate), re-exported for callers of this
/// module: attach it, steer ports or flows, and put each socket's fd into its XSKMAP.
pub use xdp_prog as steering;
