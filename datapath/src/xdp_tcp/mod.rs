//! Poll-mode TCP over AF_XDP: our own TCP (`tcp-engine`) fed by the AF_XDP port ([`crate::xsk`])
//! and the XDP steering program (`xdp-prog`).
//!
//! [`XdpTcp`] owns, on one thread:
//!
//! * one [`XskSocket`] per selected RX queue of one interface (all queues by default: a flow's
//!   packets, and retransmitted SYNs in particular, can land on any queue);
//! * the attached [`SteeringProgram`], with every socket in its XSKMAP;
//! * a [`ConnectionTable`] (the sans-IO TCP: O(1) demultiplexing, timers, RST replies);
//! * the next-hop MAC cache (see below) and the clock: `std::time::Instant` read once per turn
//!   and handed to the table as a [`tcp_engine::Instant`] (the library never reads a clock).
//!
//! **Steering.** A listener's port is steered as a port ([`XdpTcp::listen`]): every TCP packet
//! to it, SYNs and the accepted connections alike, comes to us, so accepted connections need no
//! map entry of their own. An active open ([`XdpTcp::connect`]) steers its exact 4-tuple as a
//! flow, removed when the connection is removed. In both cases a kernel TCP socket is *bound*
//! to the local address and port for as long as we use it: the kernel then does not hand that
//! port to one of its own connections, and a port already in kernel use is a clear
//! [`XdpTcpError::PortInUse`]. A listening port's socket also listens, with a filter that drops
//! every segment, so that no kernel socket can take the port either (`SO_REUSEADDR` lets one
//! share a port merely bound). Packets that arrive on a queue without a socket go to the
//! kernel, which drops those for a listening port (the reservation's filter) and answers an
//! active open's with a RST: select a subset of queues only on an interface configured with
//! that many queues.
//!
//! **Next hop.** An active open resolves the route and the neighbour (ARP) entry through
//! rtnetlink first ([`crate::xsk::resolve_next_hop`], blocking up to
//! [`XdpTcpConfig::neighbour_timeout`]; the route must leave through our interface). A passive
//! open answers the MAC address its SYN came from, learned only once the SYN passed every
//! check and opened a connection, and only for an address nothing is known of (a forged SYN
//! cannot redirect a known peer's traffic). Any other destination (a RST for a stray
//! segment) is looked up once in the kernel's neighbour table (not resolved); unknown, the
//! packet is dropped and counted ([`XdpTcpStats::tx_no_mac`]).
//!
//! **One turn** ([`XdpTcp::poll`]): take up to [`XdpTcpConfig::rx_batch`] frames from each
//! socket, parse Ethernet/IPv4 (anything else is dropped and counted), hand each IPv4 TCP packet
//! to [`ConnectionTable::handle_packet`] (its passed-up data goes to [`TcpApp::on_data`]) and
//! each ICMP one to the path MTU handling (below); hand new
//! connections of listeners to [`TcpApp::on_accept`]; for every live connection report its
//! events ([`TcpApp::on_event`]) and call [`TcpApp::on_poll`] (the application sends, reads,
//! sets its receive window, closes), then forget closed ones ([`TcpApp::on_closed`]); run
//! expired timers; then write every packet the table has into TX frames (the Ethernet header
//! and the table's IPv4 packet straight into the UMEM frame, no intermediate buffer), in
//! batches of [`XskConfig::kick_batch`] frames per `sendto` kick (veth's copy mode moves 32
//! frames per kick), at most [`XdpTcpConfig::tx_turn_frames`] per turn if set (by default a
//! turn sends all it may), and reap completions. The turn never blocks; [`XdpTcp::turn`] adds a
//! sleep in `ppoll(2)` on the sockets after [`XdpTcpConfig::idle_spins`] idle turns, bounded
//! by the next TCP deadline.
//!
//! **Costs.** Per packet: no allocation in steady state (the table, the UMEM frames, the
//! neighbour cache's last-hit shortcut and the connection list are all preallocated;
//! `datapath/tests/xdp_tcp.rs` counts). Per turn: O(live connections) for events and
//! `on_poll`, which is right for the tens of queue pairs an engine thread serves; an interest
//! list would be the next step for thousands. All transmission leaves from the first selected
//! queue's socket.
//!
//! **Shards.** [`XdpTcp::open_shards`] opens one driver per queue instead (each with one
//! socket, receiving and transmitting on its queue, and its own table), sharing one attached
//! program ([`XdpPort`]); segments that arrive on a shard that does not own their flow are
//! handed over ([`shard`]). Each shard is meant for its own thread.
//!
//! **Path MTU** (RFC 1191, RFC 9293 3.7.2). Our segments leave with DF set, so a router whose
//! next hop cannot take one drops it and answers with an ICMP "fragmentation needed" (RFC 792,
//! type 3 code 4) that names the next hop's MTU (RFC 1191 4) and quotes the segment's IPv4
//! header and first 8 octets. The steering program redirects such a message into the AF_XDP
//! socket of its queue when the quoted segment, reversed, is of a steered flow or port
//! (`xdp-prog`; other ICMP goes to the kernel); the driver parses it
//! ([`tcp_engine::wire::parse_frag_needed`]: lengths, both checksums, addressed to the quoted
//! segment's source) and gives it to the table
//! ([`ConnectionTable::handle_packet_too_big`]), which believes it only for a connection of
//! the quoted 4-tuple, a quoted sequence number in flight (RFC 5927 4.1) and an MTU from the
//! floor ([`tcp_engine::Config::min_path_mtu`], 552 as Linux, RFC 5927 7.2) to below the
//! connection's path MTU (RFC 1191 3). The connection then lowers its EMSS (new segments,
//! and the MPA layer's MULPDU for new FPDUs, follow) and resends at once, split at the new
//! EMSS, the reported segment and what it sent since that no longer fits, without cutting its
//! congestion window (as Linux's `tcp_simple_retransmit`, RFC 1191 6.4; see
//! [`Connection::handle_packet_too_big`]). Counted in [`XdpTcpStats::icmp_frag_needed`],
//! [`XdpTcpStats::icmp_frag_needed_stale`] and [`XdpTcpStats::icmp_rejected`]. A shard routes
//! the message by the quoted flow like a segment: one about another shard's flow goes to that
//! shard's inbox. Ten minutes after the last report believed, the connection tries the
//! interface's MTU again ([`tcp_engine::Config::path_mtu_expiry`], RFC 1191 6.3): a path that
//! is still narrow reports again. Not done: a per-destination cache (each connection learns
//! for itself; a new one starts from the interface's MTU again), and PLPMTUD (RFC 4821) for
//! paths that drop the ICMP (black holes).
//!
//! **Upper layer.** [`TcpApp`] is the seam the iWARP engine plugs into: in MPA mode
//! ([`tcp_engine::Config::mpa`]) `on_data` receives every accepted segment's payload at once
//! with its sequence number and stream offset (in order or not), and `on_poll` queues whole
//! FPDUs with `send_record` and sets the receive window; in stream mode
//! ([`tcp_engine::Config::default`]) `on_poll` uses `send` and `recv` (what `iwarp-bench
//! tcp-sink` / `tcp-source` do).

mod frame;
pub mod shard;

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tcp_engine::table::{ConnectionTable, TableError, TableStats};

use crate::probe::{self, Mark};
use crate::xsk::packet::ETH_HLEN;
use crate::xsk::rss::RssTable;
use crate::xsk::steering::{
    ActiveMode, AttachMode, Counters, FourTuple as FlowKey, SteeringProgram, XdpError,
    DEFAULT_FLOWS,
};
use crate::xsk::{
    resolve_next_hop, InterfaceQuery, PayloadDigest, XskConfig, XskError, XskSocket, XskStats,
};
use frame::Neighbours;
use shard::ShardSet;

/// The sans-IO TCP this driver runs, re-exported for its users.
pub use tcp_engine as engine;
pub use tcp_engine::table::ConnId;
pub use tcp_engine::{Config as TcpConfig, Connection, Event, PassedUp, State, TakeBack};

/// IPv4 + TCP headers without options.
const IP_TCP_HEADERS: u16 = 40;
/// Smallest MTU an IPv4 host must handle (RFC 791).
const MIN_MTU: u16 = 576;

/// Received frames whole in flight to this CPU ahead of the one being processed. A data frame
/// is read in full (checksum, CRC, placement), and on veth the kernel wrote it on the sending
/// CPU: prefetched only as each frame was reached, its cache lines came over one after another
/// while the receiver waited (the checksum's loads, 85-460 ns per data frame in the receiving
/// engine's profile, 45-60 with this). Two frames ahead give each prefetch a frame's work to
/// land behind.
const RX_PREFETCH_AHEAD: usize = 2;

/// The layer above TCP: what the driver calls during [`XdpTcp::poll`]. Every method has an
/// empty default, so an application implements only what it uses.
///
/// For a passive connection, `on_data` (MPA pass-up mode) can come before `on_accept`: the ACK
/// that completes the handshake may carry data. `on_accept` follows right after that segment,
/// before the next received one.
pub trait TcpApp {
    /// Data passed up at once as TCP accepts it ([`tcp_engine::RxMode::PassUp`]): the
    /// sequence number and stream offset of `data.data[0]`, in order or not, each octet once.
    /// The bytes are borrowed from the received UMEM frame. The answer may give octets back
    /// to TCP ([`tcp_engine::TakeBack`], as `Connection::handle_segment`'s callback does).
    fn on_data(&mut self, id: ConnId, data: PassedUp<'_>) -> Option<TakeBack> {
        let _ = (id, data);
        None
    }

    /// The ones' complement sum of a received segment's data (the TCP checksum's share, RFC
    /// 9293 3.1; as `tcp_engine::wire::Checksum::sum` gives it), asked for while the segment is
    /// checked, before its connection is known and before [`on_data`](Self::on_data). An
    /// application that reads the data for more (an iWARP receiver: the CRC of the FPDU it
    /// holds) does both here in one read and keeps the rest for `on_data`. A wrong sum drops
    /// the segment as corrupted.
    fn payload_sum(&mut self, payload: &[u8]) -> u16 {
        tcp_engine::wire::Checksum::new().add_bytes(payload).sum()
    }

    /// [`payload_sum`](Self::payload_sum) for a multi-frame packet whose join already read
    /// the payload (`digest`: its sum, and the CRC32c of all of it but its last four octets):
    /// returns the sum, and keeps the CRC for `on_data` if the application checks one.
    fn payload_digested(&mut self, payload: &[u8], digest: PayloadDigest) -> u16 {
        let _ = payload;
        digest.sum
    }

    /// A listener's connection completed its handshake and is now the application's.
    fn on_accept(&mut self, id: ConnId, conn: &mut Connection) {
        let _ = (id, conn);
    }

    /// An event of the connection ([`Event::Connected`], [`Event::PeerClosed`], ...).
    fn on_event(&mut self, id: ConnId, conn: &mut Connection, event: Event) {
        let _ = (id, conn, event);
    }

    /// Called for a live connection after the turn's received packets: queue data (`send`,
    /// `send_record`), read in-order data (`recv`), set the receive window, close or abort.
    /// `now` is the driver's clock, as the TCP library sees it. Every turn for every
    /// connection while there are at most 64; beyond that, in a turn where a segment, an
    /// event, the accept or open, or [`TcpApp::attention`] named the connection, and at least
    /// every 20 ms.
    fn on_poll(&mut self, id: ConnId, conn: &mut Connection, now: engine::Instant) {
        let _ = (id, conn, now);
    }

    /// Names (through `mark`) the connections the application has work for this turn
    /// (requests it queued for them), so that their `on_poll` comes now and not at the next
    /// full round.
    fn attention(&mut self, mark: &mut dyn FnMut(ConnId)) {
        let _ = mark;
    }

    /// An answering poll ([`XdpTcp::poll_answering`]) that passed data up may return before
    /// it services the connections: hand out now what the data received for connection `id`
    /// finished (its completions), for the application that waits for them; its `on_poll`
    /// and events come in the next poll. Returns whether anything was handed out, or `None`
    /// if the connection needs its service in this poll (an event, a state change to
    /// publish), which the poll then runs. The default asks for the service.
    fn deliver_received(&mut self, id: ConnId) -> Option<bool> {
        let _ = id;
        None
    }

    /// [`tcp_engine::TxMode::Source`] connections: write the stream octets
    /// `[stream_offset, stream_offset + out.len())` of connection `id` into `out` (a UMEM
    /// frame) while the driver builds a data segment, first transmission or retransmission
    /// ([`tcp_engine::TxSource`]). Failing resets the connection.
    fn fill_tx(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<(), tcp_engine::TxSourceError> {
        let _ = id;
        Err(tcp_engine::TxSourceError {
            offset: stream_offset,
            len: out.len(),
        })
    }

    /// [`fill_tx`](Self::fill_tx), and the ones' complement sum of the octets written if the
    /// application computed it on the way ([`tcp_engine::TxSource::fill_summed`]); the
    /// default calls `fill_tx` and gives none (TCP sums the payload itself).
    fn fill_tx_summed(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u16>, tcp_engine::TxSourceError> {
        self.fill_tx(id, stream_offset, out).map(|()| None)
    }

    /// [`fill_tx_summed`](Self::fill_tx_summed) into a packet in pieces (the frames of a
    /// multi-buffer packet; [`tcp_engine::TxSource::fill_split`]): the `len` octets from
    /// `stream_offset` on, `first` whole and then through `rest`. The default fills piece by
    /// piece with `fill_tx_summed`.
    fn fill_tx_split(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        len: usize,
        first: &mut [u8],
        rest: &mut [&mut [u8]],
    ) -> Result<u16, tcp_engine::TxSourceError> {
        tcp_engine::fill_in_pieces(stream_offset, len, first, rest, |offset, out| {
            self.fill_tx_summed(id, offset, out)
        })
    }

    /// Whether the application queued work for the driver (requests for its connections)
    /// since the last call. Called at the start of every [`XdpTcp::poll`]; a poll after a
    /// quiet one (see there) that finds no frame and no deadline due returns at once unless
    /// this says yes. The default, `true`, makes every poll a full one.
    fn has_new_work(&mut self) -> bool {
        true
    }

    /// The application's own next deadline (e.g. an MPA startup timeout), so that
    /// [`XdpTcp::turn`] and [`XdpTcp::wait`] do not sleep past it. TCP's deadlines are the
    /// driver's business.
    fn poll_timeout(&self) -> Option<engine::Instant> {
        None
    }

    /// The connection reached CLOSED and was removed from the table (and its steering entry
    /// and port reservation released); `conn` is its final state (statistics).
    fn on_closed(&mut self, id: ConnId, conn: Connection) {
        let _ = (id, conn);
    }
}

/// Settings of an [`XdpTcp`].
#[derive(Debug, Clone)]
pub struct XdpTcpConfig {
    /// RX queues to own (one AF_XDP socket each); `None`: all queues of the interface.
    pub queues: Option<Vec<u32>>,
    /// How to attach the steering program.
    pub attach_mode: AttachMode,
    /// AF_XDP socket settings (ring sizes, frame size, kick batch).
    pub xsk: XskConfig,
    /// Most connections at once (the table's capacity), per shard; the steering program has
    /// room for every shard's together (at least `xdp_prog::DEFAULT_FLOWS`).
    pub max_connections: usize,
    /// Most frames taken from each socket per turn (at most the socket's
    /// [`XskConfig::max_batch`], which bounds each take).
    pub rx_batch: usize,
    /// Most frames transmitted per turn, in whole kick batches (rounded up; 0: no limit, as
    /// many as the connections have ready and the TX pool takes). Received frames, ACKs above
    /// all, are read only at the start of a turn: without a limit a bulk sender's turn sends
    /// its whole window (~350 frames, ~1 ms on the veth bed) and holds the ACKs that arrive
    /// meanwhile until the turn ends, which makes the round trip as long as the window and
    /// leaves the window no slack for a peer that is late (docs/benchmarks-history.md, "Where the
    /// round trip's millisecond goes"). Default 0: a limit shortens the round trip (64: p50
    /// ~0.15 ms instead of ~0.5 ms) but bought no write-bw on the veth bed (64: 0.94 of no
    /// limit, 256: 0.99).
    pub tx_turn_frames: usize,
    /// Idle turns in a row before [`XdpTcp::turn`] sleeps in `ppoll`.
    pub idle_spins: u32,
    /// Longest sleep of [`XdpTcp::turn`] (it also wakes at the next TCP deadline or a frame).
    pub max_wait: Duration,
    /// How long [`XdpTcp::connect`] waits for the next hop's ARP reply.
    pub neighbour_timeout: Duration,
    /// Most cached next-hop addresses.
    pub max_neighbours: usize,
    /// The ISN and SYN-cookie secret (RFC 6528, RFC 4987 3.6); `None`: 16 bytes from
    /// `/dev/urandom`, one for all the shards of [`XdpTcp::open_shards`].
    pub isn_key: Option<[u8; 16]>,
    /// Shards ([`XdpTcp::open_shards`]): frames each shard's inbox holds for segments other
    /// shards received for its flows (preallocated, each the MTU plus the Ethernet header,
    /// at most what a packet's UMEM frames hold: ~9 KiB each at MTU 9000); when full,
    /// handed-over segments are dropped (and counted).
    pub inbox_frames: usize,
}

impl Default for XdpTcpConfig {
    fn default() -> Self {
        Self {
            queues: None,
            attach_mode: AttachMode::Auto,
            xsk: XskConfig::default(),
            max_connections: 1024,
            rx_batch: 64,
            tx_turn_frames: 0,
            idle_spins: 32,
            max_wait: Duration::from_millis(5),
            neighbour_timeout: Duration::from_secs(3),
            max_neighbours: 4096,
            isn_key: None,
            inbox_frames: 2048,
        }
    }
}

/// Errors of the driver.
#[derive(Debug, thiserror::Error)]
pub enum XdpTcpError {
    /// The AF_XDP port failed (not root, interface missing, no AF_XDP support, netlink, ARP).
    #[error(transparent)]
    Xsk(#[from] XskError),
    /// The steering program failed (not root, attach refused, map full).
    #[error(transparent)]
    Steering(#[from] XdpError),
    /// The interface has no IPv4 address to speak TCP from.
    #[error("interface {0:?} has no IPv4 address")]
    NoIpv4Address(String),
    /// The interface's MTU (or the UMEM frame) is too small for IPv4 TCP.
    #[error("interface {ifname:?}: usable MTU {mtu} is below {MIN_MTU}")]
    MtuTooSmall {
        /// Interface.
        ifname: String,
        /// The usable MTU (interface MTU, limited by the UMEM frame).
        mtu: u32,
    },
    /// No queue selected.
    #[error("no RX queue selected")]
    NoQueues,
    /// The interface spreads received packets over more queues than the engine can serve:
    /// packets on the others would go to the kernel, which answers them with RSTs (or drops
    /// them), so connections hashed there would fail.
    #[error(
        "{ifname} receives on {rx} queues but the engine serves at most {served} (an AF_XDP \
         socket needs a running TX queue of the same number, and the steering program's map \
         holds {max}): lower them, e.g. `ethtool -L {ifname} combined {served}`",
        max = crate::xsk::steering::MAX_QUEUES
    )]
    TooManyQueues {
        /// Interface.
        ifname: String,
        /// RX queues it runs.
        rx: u32,
        /// Queues the engine can serve.
        served: u32,
    },
    /// The route to the peer does not leave through our interface.
    #[error(
        "{addr} is reached through interface index {route_ifindex}, not {ifname} (index {ifindex})"
    )]
    WrongInterface {
        /// The peer.
        addr: Ipv4Addr,
        /// Where the kernel's route goes.
        route_ifindex: u32,
        /// Our interface.
        ifname: String,
        /// Its index.
        ifindex: u32,
    },
    /// The local port is taken by a kernel socket.
    #[error("TCP port {port} on {addr} is in use by a kernel socket: {source}")]
    PortInUse {
        /// Local address.
        addr: Ipv4Addr,
        /// Port.
        port: u16,
        /// The kernel's answer.
        source: io::Error,
    },
    /// Reserving a local port with the kernel failed otherwise.
    #[error("reserving a TCP port on {addr} with the kernel: {source}")]
    Reserve {
        /// Local address.
        addr: Ipv4Addr,
        /// The kernel's answer.
        source: io::Error,
    },
    /// The connection table refused (full, or the 4-tuple is in use).
    #[error("connection table: {0}")]
    Table(#[from] TableError),
    /// `ppoll` on the sockets failed.
    #[error("waiting for packets: {0}")]
    Wait(io::Error),
    /// Reading the ISN secret failed.
    #[error("reading 16 random bytes from /dev/urandom: {0}")]
    Random(io::Error),
    /// The shards' flow directory is full.
    #[error(transparent)]
    DirectoryFull(#[from] shard::DirectoryFull),
    /// Making a shard's inbox (its wake-up socket) failed.
    #[error("making a shard inbox: {0}")]
    Inbox(io::Error),
}

/// Counters of the driver (the table's own are in [`XdpTcpStats::table`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XdpTcpStats {
    /// Frames taken from the RX rings.
    pub rx_frames: u64,
    /// Frames dropped because they are not IPv4/TCP.
    pub rx_not_ipv4_tcp: u64,
    /// TCP segments dropped because they are for another IPv4 address than the engine's:
    /// answered, the table would reset them from an address that is not ours.
    pub rx_not_for_us: u64,
    /// Frames dropped because they came to another MAC address than the interface's (a NIC
    /// in promiscuous mode, a switch flooding an unknown address), or to a broadcast or
    /// multicast address: not for this host, as the kernel judges it. The first to another
    /// unicast address in a second has the interface's address read again (it may have
    /// changed).
    pub rx_other_mac: u64,
    /// IPv4 packets the table rejected (checksum, header, options; by reason in `table`).
    pub rx_malformed: u64,
    /// Packets put on the TX ring.
    pub tx_packets: u64,
    /// Packets dropped for lack of a next-hop MAC address.
    pub tx_no_mac: u64,
    /// Turns that ended with packets still waiting because no TX frame was free.
    pub tx_frames_exhausted: u64,
    /// Connections accepted from listeners.
    pub accepted: u64,
    /// Connections removed after reaching CLOSED.
    pub closed: u64,
    /// Sleeps in `ppoll`.
    pub waits: u64,
    /// Polls that returned at once: the poll before found nothing to do and nothing arrived
    /// since (no frame, no request, no deadline due).
    pub quiet_polls: u64,
    /// Turns for one connection on the thread that posted work to it
    /// ([`XdpTcp::poll_posted`]): its service and the transmission, nothing received (those
    /// it turned into full turns are not counted).
    pub posting_turns: u64,
    /// Answering polls ([`XdpTcp::poll_answering`]) that returned to the application with
    /// the received data placed and its completions handed out, before any service.
    pub answering_returns: u64,
    /// Shards: segments received here for a flow another shard owns, copied to its inbox.
    pub handoffs_out: u64,
    /// Shards: segments other shards handed to this one (taken from its inbox).
    pub handoffs_in: u64,
    /// Shards: segments for another shard's flow dropped because its inbox was full.
    pub handoff_drops: u64,
    /// Shards: SYNs (and ACKs that might have brought back a SYN cookie) dropped because the
    /// flow directory was full.
    pub directory_full: u64,
    /// ICMP "fragmentation needed" messages believed (see the module documentation, *Path
    /// MTU*): a connection's path MTU lowered, and what was dropped resent at once.
    pub icmp_frag_needed: u64,
    /// ICMP "fragmentation needed" messages for a segment in flight of a connection of ours
    /// that named an MTU not below its path MTU: the further reports of a burst of oversized
    /// segments, after the first lowered it (RFC 1191 3).
    pub icmp_frag_needed_stale: u64,
    /// ICMP messages dropped: malformed (lengths, checksums), not a "fragmentation needed"
    /// about a TCP segment sent from this host, for no connection of this driver, quoting a
    /// sequence number not in flight (RFC 5927 4.1) or naming an MTU below the floor (RFC 5927
    /// 7.2): forged, or stale.
    pub icmp_rejected: u64,
    /// The kernel's count of frames for this driver's sockets that it dropped before they
    /// reached an RX ring (`XDP_STATISTICS` `rx_dropped` + `rx_ring_full`: the ring or the fill
    /// ring had no room, i.e. the driver's thread fell behind by a whole RX frame pool).
    pub rx_kernel_drops: u64,
    /// Packets received over several UMEM frames (multi-buffer AF_XDP, jumbo MTUs), joined
    /// (summed over this driver's sockets).
    pub rx_multi_frame: u64,
    /// Multi-frame packets the sockets dropped: more than `xsk::MAX_FRAMES_PER_PACKET`
    /// frames, or cut short (`XskStats::rx_multi_frame_dropped`).
    pub rx_multi_frame_dropped: u64,
    /// Multi-frame packets whose checksum TCP checked from the sum the join computed as it
    /// copied them (`xsk::PayloadDigest`, `TcpApp::payload_digested`): read once. Counted by
    /// the shard that processed the packet, which may not be the one whose socket received
    /// it (a hand-off): only the sum over shards compares with `rx_multi_frame`.
    pub rx_multi_frame_digested: u64,
    /// Packets sent over several UMEM frames.
    pub tx_multi_frame: u64,
    /// Descriptors the kernel handed back that name no frame of ours it held: received ones
    /// outside the RX pool (dropped unread, with their packets) and completions not taken
    /// back (`XskStats::rx_descs_refused`, `tx_completions_refused`; zero with a kernel that
    /// keeps its side of the rings).
    pub descs_refused: u64,
    /// The connection table's counters.
    pub table: TableStats,
}

impl XdpTcpStats {
    /// Adds `o`'s counters to these (sums over shards).
    pub fn add(&mut self, o: &XdpTcpStats) {
        self.rx_frames += o.rx_frames;
        self.rx_not_ipv4_tcp += o.rx_not_ipv4_tcp;
        self.rx_not_for_us += o.rx_not_for_us;
        self.rx_other_mac += o.rx_other_mac;
        self.rx_malformed += o.rx_malformed;
        self.tx_packets += o.tx_packets;
        self.tx_no_mac += o.tx_no_mac;
        self.tx_frames_exhausted += o.tx_frames_exhausted;
        self.accepted += o.accepted;
        self.closed += o.closed;
        self.waits += o.waits;
        self.quiet_polls += o.quiet_polls;
        self.posting_turns += o.posting_turns;
        self.answering_returns += o.answering_returns;
        self.handoffs_out += o.handoffs_out;
        self.handoffs_in += o.handoffs_in;
        self.handoff_drops += o.handoff_drops;
        self.directory_full += o.directory_full;
        self.icmp_frag_needed += o.icmp_frag_needed;
        self.icmp_frag_needed_stale += o.icmp_frag_needed_stale;
        self.icmp_rejected += o.icmp_rejected;
        self.rx_kernel_drops += o.rx_kernel_drops;
        self.rx_multi_frame += o.rx_multi_frame;
        self.rx_multi_frame_dropped += o.rx_multi_frame_dropped;
        self.rx_multi_frame_digested += o.rx_multi_frame_digested;
        self.tx_multi_frame += o.tx_multi_frame;
        self.descs_refused += o.descs_refused;
        // Destructured whole: a counter added to the table is summed or fails to compile.
        let TableStats {
            bad_checksum,
            bad_ip,
            bad_data_offset,
            bad_options,
            truncated,
            no_connection,
            resets_sent,
            backlog_drops,
            passive_opens,
            queued_for_accept,
            syncookies_sent,
            syncookies_dropped,
            syncookies_validated,
            syncookies_failed,
            syncookies_deferred,
            listen_ignored,
            challenge_acks_limited,
            time_wait_reused,
            lingering_ended,
            table_full_drops,
        } = o.table;
        let t = &mut self.table;
        t.bad_checksum += bad_checksum;
        t.bad_ip += bad_ip;
        t.bad_data_offset += bad_data_offset;
        t.bad_options += bad_options;
        t.truncated += truncated;
        t.no_connection += no_connection;
        t.resets_sent += resets_sent;
        t.backlog_drops += backlog_drops;
        t.passive_opens += passive_opens;
        t.queued_for_accept += queued_for_accept;
        t.syncookies_sent += syncookies_sent;
        t.syncookies_dropped += syncookies_dropped;
        t.syncookies_validated += syncookies_validated;
        t.syncookies_failed += syncookies_failed;
        t.syncookies_deferred += syncookies_deferred;
        t.listen_ignored += listen_ignored;
        t.challenge_acks_limited += challenge_acks_limited;
        t.time_wait_reused += time_wait_reused;
        t.lingering_ended += lingering_ended;
        t.table_full_drops += table_full_drops;
    }
}

/// A connection the application knows about.
#[derive(Debug)]
struct Tracked {
    id: ConnId,
    /// The steered 4-tuple (active opens only).
    flow: Option<FlowKey>,
    /// Shards: its key in the flow directory.
    dir_key: Option<u64>,
    /// Kernel socket bound to the local port (active opens only; listeners hold their own).
    _reservation: Option<Socket>,
    /// The listening port it was accepted on (passive opens only).
    listen_port: Option<u16>,
}

#[derive(Debug)]
struct Listening {
    port: u16,
    /// Shared by the shards listening on the port.
    reservation: Arc<Socket>,
}

/// What the drivers (shards) of one interface share: the attached steering program, the
/// listeners' kernel port reservations and the interface's facts. Steering changes lock its
/// mutex (connection setup and teardown only, never per packet).
pub struct XdpPort {
    // Field order is drop order: the program detaches first.
    prog: Mutex<SteeringProgram>,
    mode: ActiveMode,
    /// Listening ports' reservations, shared by every shard listening on the port.
    listens: Mutex<HashMap<u16, Weak<Socket>>>,
    ifname: String,
    ifindex: u32,
    /// The interface's MAC address, its six octets in the low ones of a u64: read at open and
    /// again when frames come to another ([`XdpPort::recheck_mac`]).
    mac: AtomicU64,
    /// Looks the interface up again (in the namespace the port was opened in); when the MAC
    /// address was last re-read.
    mac_query: Mutex<(InterfaceQuery, Option<Instant>)>,
    local_ip: Ipv4Addr,
    mtu: u32,
    /// Queues usable: every RX queue the interface runs ([`XdpTcpError::TooManyQueues`] when
    /// the TX queues or the XSKMAP's size are fewer).
    queues: u32,
    /// The NIC's RSS key and indirection table, or why they are unknown (veth has none):
    /// with them a connecting shard picks a source port whose replies land on its own queue.
    rss: Result<RssTable, String>,
    /// Packets of the MTU do not fit one UMEM frame: the multi-buffer program (`xdp.frags`)
    /// is attached and the sockets bind for multi-buffer packets.
    multi_buffer: bool,
}

impl std::fmt::Debug for XdpPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpPort")
            .field("ifname", &self.ifname)
            .field("local_ip", &self.local_ip)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl XdpPort {
    /// Loads and attaches the steering program on `ifname` (in the calling thread's network
    /// namespace) and reads the interface's facts. Needs root.
    pub fn open(ifname: &str, cfg: &XdpTcpConfig, sharded: bool) -> Result<Self, XdpTcpError> {
        let mut query = InterfaceQuery::open()?;
        let info = query.info(ifname)?;
        let (rx, tx) =
            crate::xsk::ethtool::running_queues(ifname, (info.rx_queues, info.tx_queues));
        let served = rx.min(tx).min(crate::xsk::steering::MAX_QUEUES);
        if rx > served {
            return Err(XdpTcpError::TooManyQueues {
                ifname: ifname.to_owned(),
                rx,
                served,
            });
        }
        let (local_ip, _) = info
            .ipv4
            .ok_or_else(|| XdpTcpError::NoIpv4Address(ifname.to_owned()))?;
        let xsk = cfg.xsk.for_mtu(info.mtu);
        let (multi_buffer, frame_capacity) = (xsk.multi_buffer, xsk.frame_capacity());
        // Room in the steering program for every connection the tables may hold (one table,
        // or one per selected queue, each of `max_connections`): the map's default would
        // refuse the connections beyond it (`XdpError::MapFull`). A size the kernel refuses
        // falls back to the default, said in the log.
        let tables = if sharded {
            cfg.queues.as_ref().map_or(served as usize, Vec::len)
        } else {
            1
        };
        let flows = cfg
            .max_connections
            .saturating_mul(tables)
            .min(MAX_STEERED_FLOWS as usize) as u32;
        let frags = xsk.needs_frags_program(info.mtu);
        let mut prog = match SteeringProgram::load_sized(frags, flows) {
            Err(e)
                if flows > DEFAULT_FLOWS
                    && !matches!(
                        e,
                        XdpError::PermissionDenied { .. } | XdpError::FragsUnsupported(_)
                    ) =>
            {
                tracing::warn!(
                    ifname,
                    flows,
                    error = %e,
                    "loading the steering program with a flow map of this size failed: \
                     trying the default size ({DEFAULT_FLOWS} connections)"
                );
                SteeringProgram::load(frags)?
            }
            other => other?,
        };
        let mode = prog.attach(ifname, cfg.attach_mode)?;
        if let Some(why) = prog.driver_refused() {
            tracing::warn!(
                ifname,
                driver_mode = why,
                "native XDP refused: the steering program runs as generic XDP, on the kernel's \
                 socket buffers (slower)"
            );
        } else {
            tracing::info!(ifname, asked = %cfg.attach_mode, "steering program attached ({mode} XDP)");
        }
        if multi_buffer {
            tracing::info!(
                ifname,
                mtu = info.mtu,
                frame_capacity,
                "multi-buffer AF_XDP: packets of the MTU span several UMEM frames (xdp.frags \
                 program, XDP_USE_SG sockets)"
            );
        }
        let rss = RssTable::read(ifname).map_err(|e| e.to_string());
        match &rss {
            Ok(t) => tracing::info!(
                ifname,
                key_octets = t.sizes().0,
                table_entries = t.sizes().1,
                "RSS known: connecting shards pick source ports whose replies land on their queue"
            ),
            Err(why) => tracing::info!(
                ifname,
                "RSS unknown ({why}): source ports left to the kernel, replies on another \
                 shard's queue are handed over"
            ),
        }
        Ok(XdpPort {
            prog: Mutex::new(prog),
            mode,
            listens: Mutex::new(HashMap::new()),
            ifname: ifname.to_owned(),
            ifindex: info.index,
            mac: AtomicU64::new(mac_bits(info.mac)),
            mac_query: Mutex::new((query, None)),
            local_ip,
            mtu: info.mtu,
            queues: served,
            rss,
            multi_buffer,
        })
    }

    /// The interface's MAC address (as last read).
    pub(crate) fn mac(&self) -> [u8; 6] {
        let b = self.mac.load(Ordering::Relaxed).to_be_bytes();
        [b[2], b[3], b[4], b[5], b[6], b[7]]
    }

    /// Frames came to another unicast MAC address than ours: the interface's may have changed
    /// since the port opened (a bond failing over, `ip link set ... address`, a bridge
    /// recomputing its own), and the peers, whose ARP caches the kernel answers, send to the
    /// new one. Re-reads it, at most once a [`MAC_RECHECK`] and never waiting for another
    /// shard doing the same; frames are received and sent with the new one from then on.
    fn recheck_mac(&self) {
        let Ok(mut q) = self.mac_query.try_lock() else {
            return;
        };
        let now = Instant::now();
        if q.1.is_some_and(|at| now.duration_since(at) < MAC_RECHECK) {
            return;
        }
        q.1 = Some(now);
        // One RTM_GETLINK for our interface's index (not a dump of every interface, and not
        // by name: a renamed one's successor is not ours).
        match q.0.mac(self.ifindex) {
            Ok(mac) if mac != self.mac() => {
                tracing::warn!(
                    ifname = %self.ifname,
                    old = ?self.mac(),
                    new = ?mac,
                    "the interface's MAC address changed: the engine takes the new one"
                );
                self.mac.store(mac_bits(mac), Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(ifname = %self.ifname, error = %e, "re-reading the MAC address")
            }
        }
    }

    /// The queues `cfg` selects (all usable ones by default). A subset is taken as asked, with
    /// a warning: the steering program steers by flow, not by queue, so a steered segment the
    /// NIC puts on a queue without an engine socket goes to the kernel, which resets it.
    pub fn select_queues(&self, cfg: &XdpTcpConfig) -> Result<Vec<u32>, XdpTcpError> {
        let queues: Vec<u32> = match &cfg.queues {
            Some(q) => q.clone(),
            None => (0..self.queues).collect(),
        };
        if queues.is_empty() {
            return Err(XdpTcpError::NoQueues);
        }
        let unserved: Vec<u32> = (0..self.queues).filter(|q| !queues.contains(q)).collect();
        if !unserved.is_empty() {
            tracing::warn!(
                ifname = %self.ifname,
                ?unserved,
                "queues of the interface left without an engine socket: segments of the \
                 engine's connections that arrive there go to the kernel, which resets them \
                 (serve every queue, or lower the channels with `ethtool -L`)"
            );
        }
        Ok(queues)
    }

    /// Our IPv4 address (the interface's first).
    pub fn local_ip(&self) -> Ipv4Addr {
        self.local_ip
    }

    /// The interface.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    fn prog(&self) -> MutexGuard<'_, SteeringProgram> {
        self.prog.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reservation of listening port `port`, shared with every driver of this port
    /// listening on it: the first one reserves the port with the kernel and steers it. Port 0
    /// takes a port the kernel picks (a new reservation each time). Returns the reservation and
    /// the port.
    fn reserve_listen(&self, port: u16) -> Result<(Arc<Socket>, u16), XdpTcpError> {
        let mut listens = self.listens.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sock) = listens.get(&port).and_then(Weak::upgrade) {
            return Ok((sock, port));
        }
        let (sock, bound) = reserve_port(self.local_ip, port)?;
        hold_listening(&sock).map_err(|source| match source.raw_os_error() {
            // A socket bound to the port since (with SO_REUSEADDR) and listening first.
            Some(libc::EADDRINUSE) => XdpTcpError::PortInUse {
                addr: self.local_ip,
                port: bound,
                source,
            },
            _ => XdpTcpError::Reserve {
                addr: self.local_ip,
                source,
            },
        })?;
        self.prog().steer_port(self.local_ip, bound)?;
        let sock = Arc::new(sock);
        listens.insert(bound, Arc::downgrade(&sock));
        Ok((sock, bound))
    }
}

impl XdpPort {
    /// Gives back one driver's share of a listening port's reservation; the last share
    /// unsteers the port, then closes the kernel socket that held it (in that order: a kernel
    /// socket that took the port in between would have its segments steered to us).
    fn release_listen(&self, listening: Listening) {
        let mut listens = self.listens.lock().unwrap_or_else(|e| e.into_inner());
        let port = listening.port;
        // Exact under the lock: the shares are the listeners' `Listening`s (the map holds a
        // weak reference, upgraded only under the lock).
        if Arc::strong_count(&listening.reservation) == 1 {
            listens.remove(&port);
            // Failing to unsteer leaves the port's packets steered to sockets that drop them
            // (no listener, no connection): what a port nobody listens on gets anyway.
            if let Err(e) = self.prog().unsteer_port(self.local_ip, port) {
                tracing::warn!(port, error = %e, "a listening port could not be unsteered");
            }
        }
        drop(listening);
    }
}

/// The most connections the steering program's flow map is sized for (4M entries, about
/// 400 MB of kernel memory allocated at load): a larger `max_connections` x tables is
/// clamped to it.
const MAX_STEERED_FLOWS: u32 = 1 << 22;

/// How often at most [`XdpPort::recheck_mac`] looks the interface up.
const MAC_RECHECK: Duration = Duration::from_secs(1);

/// A MAC address in the low six octets of a u64.
fn mac_bits(mac: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[2..].copy_from_slice(&mac);
    u64::from_be_bytes(b)
}

/// A shard's place among the shards of its interface.
#[derive(Debug)]
struct ShardCtx {
    index: u32,
    set: Arc<ShardSet>,
}

impl ShardCtx {
    fn inbox(&self) -> Option<&shard::Inbox> {
        self.set.inboxes.get(self.index as usize)
    }

    /// Copies `frame` to shard `owner`'s inbox.
    fn hand_off(
        &self,
        owner: u32,
        frame: &[u8],
        digest: Option<PayloadDigest>,
        stats: &mut XdpTcpStats,
    ) {
        match self.set.inboxes.get(owner as usize) {
            Some(inbox) if inbox.push_digested(frame, digest) => stats.handoffs_out += 1,
            _ => stats.handoff_drops += 1,
        }
    }
}

/// How often a shard sweeps its stale flow-directory entries.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Up to this many live connections, every turn services every connection
/// ([`TcpApp::on_poll`]); above it, a turn services the connections that need it (see
/// [`Attention`]) and all of them once per [`SERVICE_ALL_EVERY`].
pub(crate) const SERVICE_ALL_MAX: usize = 64;
/// With more than [`SERVICE_ALL_MAX`] connections, how often every connection is serviced
/// anyway: what no segment, event or application request announces (the application's own
/// deadlines, a timer that ended a connection) waits at most this long.
const SERVICE_ALL_EVERY: Duration = Duration::from_millis(20);

/// Quiet polls read the clock once in this many while they come fast ([`XdpTcp::poll`]).
const QUIET_CLOCK_STRIDE: u64 = 16;

/// How old the clock reading of quiet polls may grow between readings (16 polls) before every
/// quiet poll reads it, by default ([`XdpTcp::set_quiet_clock_lag`]): a tenth of the engine's
/// default `park_max` (4 ms), whose watchdog the application's polls push, and which takes a
/// reading older than a quarter of it for an application that stopped polling.
const QUIET_CLOCK_LAG: Duration = Duration::from_micros(400);

/// The connections a turn must service: those a received segment, an accept, an active
/// open or the application ([`TcpApp::attention`]) named since the last service. A list and
/// a flag per table slot (allocated once, at the table's size): marking is O(1), no
/// allocation.
#[derive(Debug)]
struct Attention {
    list: Vec<ConnId>,
    marked: Vec<bool>,
}

impl Attention {
    fn new(capacity: usize) -> Attention {
        Attention {
            list: Vec::with_capacity(capacity),
            marked: vec![false; capacity],
        }
    }

    fn mark(&mut self, id: ConnId) {
        if let Some(m) = self.marked.get_mut(id.index()) {
            if !*m {
                *m = true;
                self.list.push(id);
            }
        }
    }
}

/// Poll-mode TCP over AF_XDP on one interface (see the module documentation).
pub struct XdpTcp {
    // Field order is drop order: the (last driver's) port detaches the program first (the
    // kernel gets the interface's traffic back), then the sockets close, then the port
    // reservations go.
    port: Arc<XdpPort>,
    shard: Option<ShardCtx>,
    /// When (TCP clock, nanoseconds) the shard last swept its directory entries.
    last_sweep: u64,
    socks: Vec<XskSocket>,
    pollfds: Vec<libc::pollfd>,
    table: ConnectionTable,
    conns: Vec<Tracked>,
    attention: Attention,
    /// When (TCP clock, nanoseconds) every connection was last serviced.
    last_service_all: u64,
    listeners: Vec<Listening>,
    /// Listeners stopped while connections they accepted live: their ports stay steered (and
    /// reserved) for those connections until the last one closes.
    retired: Vec<Listening>,
    neigh: Neighbours,
    mtu: u16,
    epoch: std::time::Instant,
    idle_turns: u32,
    /// Turns in a row whose expired TCP timers waited for a full receive batch to drain.
    timers_deferred: u32,
    /// The last full poll found nothing to do and left nothing behind (see [`XdpTcp::poll`]);
    /// with the deadline (TCP clock) before which the next one can only come from a frame or
    /// the application.
    quiet: Option<Option<tcp_engine::Instant>>,
    /// The last poll left its service, timers and transmission to this one
    /// ([`XdpTcp::poll_answering`]).
    deferred: bool,
    /// The last clock reading of a poll ([`XdpTcp::polled_at`]).
    polled_at: tcp_engine::Instant,
    /// Quiet polls read the clock every `quiet_clock_stride`th poll: 16 while they come fast,
    /// 1 once 16 of them take longer than `quiet_clock_lag` ([`QUIET_CLOCK_LAG`]).
    quiet_clock_stride: u64,
    quiet_clock_lag: Duration,
    stats: XdpTcpStats,
    cfg: XdpTcpConfig,
}

impl std::fmt::Debug for XdpTcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpTcp")
            .field("ifname", &self.port.ifname)
            .field("local_ip", &self.port.local_ip)
            .field("mode", &self.port.mode)
            .field("queues", &self.queues())
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

fn random_key() -> Result<[u8; 16], XdpTcpError> {
    use std::io::Read;
    let mut key = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(XdpTcpError::Random)?;
    Ok(key)
}

/// Ephemeral ports a shard tries for one whose replies land on its queue
/// ([`XdpTcp::source_port`]): with 64 queues, one in three connections finds none.
const RSS_PORT_TRIES: usize = 64;

/// A reservation of a listening port listens, with a socket filter that drops every segment
/// (nothing reaches it but what the steering program passes, which is not for a listener of
/// ours), so that no kernel socket can take the port while we listen on it: the kernel lets a
/// socket bound with `SO_REUSEADDR` (as most servers' are) share a port with another such
/// socket that is merely bound, and then listen on it, and every segment for it would come to
/// us. A SYN that reaches the kernel (a queue without our socket) is dropped rather than
/// accepted by it.
fn hold_listening(sock: &Socket) -> io::Result<()> {
    // Classic BPF `ret #0`: keep nothing of any packet.
    let drop_all = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    sock.attach_filter(&drop_all)?;
    sock.listen(0)
}

/// Binds (never listens) a kernel TCP socket to `addr:port` (0: any free port) so the kernel
/// leaves the port to us (a listening port's is then made to listen, `hold_listening`).
/// Returns the socket and the port.
fn reserve_port(addr: Ipv4Addr, port: u16) -> Result<(Socket, u16), XdpTcpError> {
    let reserve = |source| XdpTcpError::Reserve { addr, source };
    let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).map_err(reserve)?;
    // Lets us take a port whose old kernel connections linger in TIME-WAIT, never one a kernel
    // socket is bound to or listens on.
    sock.set_reuse_address(true).map_err(reserve)?;
    sock.bind(&SocketAddrV4::new(addr, port).into())
        .map_err(|source| match source.raw_os_error() {
            Some(libc::EADDRINUSE) => XdpTcpError::PortInUse { addr, port, source },
            _ => XdpTcpError::Reserve { addr, source },
        })?;
    let bound = sock
        .local_addr()
        .map_err(reserve)?
        .as_socket_ipv4()
        .map(|a| a.port())
        .ok_or_else(|| reserve(io::Error::other("bound socket has no IPv4 address")))?;
    Ok((sock, bound))
}

/// Sleeps until one of `fds` is readable or `timeout` passes (a negative descriptor is left
/// out). Returns how many are readable; 0 if a signal interrupted the sleep.
pub(crate) fn ppoll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is an exclusively borrowed slice of initialised `pollfd`s, and the length
    // passed is its length; `ts` is a valid timespec that outlives the call; a null signal
    // mask leaves the thread's mask unchanged. The kernel only writes the `revents` fields.
    let rc = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(rc as usize)
}

impl XdpTcp {
    /// Opens the driver on `ifname` (in the calling thread's network namespace): loads and
    /// attaches the steering program, opens one AF_XDP socket per selected queue and puts each
    /// into the program's XSKMAP. Nothing is steered until [`listen`](Self::listen) or
    /// [`connect`](Self::connect). Needs root.
    pub fn open(ifname: &str, cfg: XdpTcpConfig) -> Result<Self, XdpTcpError> {
        let port = Arc::new(XdpPort::open(ifname, &cfg, false)?);
        let queues = port.select_queues(&cfg)?;
        Self::on_port(port, &queues, cfg, None)
    }

    /// Opens one driver (a *shard*) per selected queue of `ifname` (see [`shard`]), sharing
    /// one attached steering program: each shard has one AF_XDP socket (receiving and
    /// transmitting on its queue), its own connection table, and an inbox; a segment that
    /// arrives on a shard that does not own its flow is copied to the owner's inbox. Each
    /// shard is meant to run on its own thread. Needs root.
    pub fn open_shards(ifname: &str, mut cfg: XdpTcpConfig) -> Result<Vec<Self>, XdpTcpError> {
        // One key for every shard, so that a cookie's check does not depend on the shard.
        // (A cookie's ACK is taken for one only by a shard that sent a cookie within a
        // cookie's lifetime: the NIC hashes the ACK's 4-tuple to the queue its SYN came on,
        // so it comes back to the shard that answered the SYN, unless the NIC's RSS table
        // changed in between; then the client's ACK gets a RST and it connects again.)
        if cfg.isn_key.is_none() {
            cfg.isn_key = Some(random_key()?);
        }
        let port = Arc::new(XdpPort::open(ifname, &cfg, true)?);
        let queues = port.select_queues(&cfg)?;
        let set = Arc::new(
            ShardSet::new(
                queues.len(),
                cfg.inbox_frames,
                // A received packet holds at most the MTU and the Ethernet header, and the
                // engine takes none larger than its sockets do.
                (port.mtu as usize + ETH_HLEN).min(cfg.xsk.for_mtu(port.mtu).packet_capacity()),
                cfg.max_connections.saturating_mul(queues.len()),
            )
            .map_err(XdpTcpError::Inbox)?,
        );
        queues
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let ctx = ShardCtx {
                    index: i as u32,
                    set: set.clone(),
                };
                Self::on_port(port.clone(), &[q], cfg.clone(), Some(ctx))
            })
            .collect()
    }

    fn on_port(
        port: Arc<XdpPort>,
        queues: &[u32],
        cfg: XdpTcpConfig,
        shard: Option<ShardCtx>,
    ) -> Result<Self, XdpTcpError> {
        let isn_key = match cfg.isn_key {
            Some(k) => k,
            None => random_key()?,
        };
        // What holds for every shard alike is said once, by the first.
        let first = shard.as_ref().is_none_or(|s| s.index == 0);
        let socks = open_sockets(&port, queues, &cfg.xsk, first)?;
        {
            let mut prog = port.prog();
            for s in &socks {
                prog.bind_socket(s.queue(), s.fd())?;
            }
        }
        let frame_mtu = socks
            .iter()
            .map(|s| s.packet_capacity().saturating_sub(ETH_HLEN))
            .min()
            .unwrap_or(0);
        let mtu = (port.mtu as usize)
            .min(frame_mtu)
            .min(usize::from(u16::MAX));
        if mtu < port.mtu as usize && first {
            tracing::warn!(
                ifname = port.ifname.as_str(),
                interface_mtu = port.mtu,
                mtu,
                "the engine's packets are limited to what its UMEM frames hold: MSS from MTU {mtu}"
            );
        }
        if mtu < usize::from(MIN_MTU) {
            return Err(XdpTcpError::MtuTooSmall {
                ifname: port.ifname.clone(),
                mtu: mtu as u32,
            });
        }
        let mut pollfds: Vec<libc::pollfd> = socks
            .iter()
            .map(|s| libc::pollfd {
                fd: s.fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if let Some(inbox) = shard.as_ref().and_then(|s| s.inbox()) {
            pollfds.push(libc::pollfd {
                fd: inbox.wake_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        Ok(Self {
            socks,
            pollfds,
            table: ConnectionTable::new(isn_key, cfg.max_connections),
            conns: Vec::with_capacity(cfg.max_connections),
            attention: Attention::new(cfg.max_connections),
            last_service_all: 0,
            listeners: Vec::new(),
            retired: Vec::new(),
            neigh: Neighbours::new(port.ifindex, cfg.max_neighbours),
            mtu: mtu as u16,
            epoch: std::time::Instant::now(),
            idle_turns: 0,
            timers_deferred: 0,
            quiet: None,
            deferred: false,
            polled_at: tcp_engine::Instant::from_nanos(0),
            quiet_clock_stride: QUIET_CLOCK_STRIDE,
            quiet_clock_lag: QUIET_CLOCK_LAG,
            stats: XdpTcpStats::default(),
            cfg,
            port,
            shard,
            last_sweep: 0,
        })
    }

    /// Shards: this shard's index among the shards of its interface.
    pub fn shard_index(&self) -> Option<usize> {
        self.shard.as_ref().map(|s| s.index as usize)
    }

    /// Shards: the shared inboxes and this shard's index, for an engine thread that sleeps
    /// elsewhere than in [`wait`](Self::wait) and must be woken by hand-offs
    /// ([`shard::Inbox::sleep_begin`], [`shard::Inbox::wake_fd`]).
    pub fn shard_set(&self) -> Option<(Arc<ShardSet>, usize)> {
        self.shard
            .as_ref()
            .map(|s| (s.set.clone(), s.index as usize))
    }

    /// The interface.
    pub fn ifname(&self) -> &str {
        &self.port.ifname
    }

    /// Our IPv4 address (the interface's first).
    pub fn local_ip(&self) -> Ipv4Addr {
        self.port.local_ip
    }

    /// The MTU TCP uses: the interface's, limited by what a UMEM frame holds.
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// The mode the steering program runs in.
    pub fn xdp_mode(&self) -> ActiveMode {
        self.port.mode
    }

    /// The RX queues owned.
    pub fn queues(&self) -> Vec<u32> {
        self.socks.iter().map(|s| s.queue()).collect()
    }

    /// True if the AF_XDP sockets run in zero-copy mode.
    pub fn zero_copy(&self) -> bool {
        self.socks.iter().all(|s| s.is_zero_copy())
    }

    /// A TCP configuration for this interface: [`TcpConfig::default`] (stream mode) with the
    /// path MTU and MSS of [`mtu`](Self::mtu).
    pub fn tcp_config(&self) -> TcpConfig {
        self.fit(TcpConfig {
            path_mtu: self.mtu,
            mss: self.mtu - IP_TCP_HEADERS,
            ..TcpConfig::default()
        })
    }

    /// Lowers a configuration's path MTU and MSS to what the interface carries.
    fn fit(&self, mut cfg: TcpConfig) -> TcpConfig {
        cfg.path_mtu = cfg.path_mtu.min(self.mtu);
        cfg.mss = cfg.mss.min(self.mtu - IP_TCP_HEADERS);
        cfg
    }

    /// The `std::time::Instant` that the TCP clock's zero stands for.
    pub fn epoch(&self) -> std::time::Instant {
        self.epoch
    }

    /// Adds a file descriptor (e.g. an application's wake-up socket) that ends
    /// [`wait`](Self::wait)'s sleep when it becomes readable. The caller keeps it open for as
    /// long as the driver lives and drains it.
    pub fn add_wake_fd(&mut self, fd: std::os::fd::RawFd) {
        self.quiet = None;
        self.pollfds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
    }

    /// The driver's clock as the TCP library sees it.
    fn now(&self) -> tcp_engine::Instant {
        let nanos = self.epoch.elapsed().as_nanos();
        tcp_engine::Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Accepts connections on `port` of our address with `cfg` (its MTU and MSS lowered to the
    /// interface's): reserves the port with the kernel and steers it; port 0 listens on a port
    /// the kernel picks. Returns the port. At most `backlog` connections may be half-open or not
    /// yet handed to [`TcpApp::on_accept`].
    pub fn listen(
        &mut self,
        port: u16,
        backlog: usize,
        cfg: TcpConfig,
    ) -> Result<u16, XdpTcpError> {
        self.quiet = None;
        if port != 0 && self.listeners.iter().any(|l| l.port == port) {
            return Err(XdpTcpError::PortInUse {
                addr: self.port.local_ip,
                port,
                source: io::Error::from_raw_os_error(libc::EADDRINUSE),
            });
        }
        // A port stopped while its connections live is still reserved and steered.
        let listening = match self
            .retired
            .iter()
            .position(|l| port != 0 && l.port == port)
        {
            Some(i) => self.retired.swap_remove(i),
            None => {
                let (reservation, port) = self.port.reserve_listen(port)?;
                Listening { port, reservation }
            }
        };
        let port = listening.port;
        let cfg = self.fit(cfg);
        self.table.listen(self.port.local_ip, port, backlog, cfg);
        self.listeners.push(listening);
        Ok(port)
    }

    /// Stops accepting connections on `port` (a listening socket closed): new SYNs get a RST,
    /// connections not yet handed to [`TcpApp::on_accept`] are reset
    /// ([`ConnectionTable::unlisten`]), those accepted live on. The port stays steered and
    /// reserved with the kernel until the last of them closes (and every other driver of the
    /// interface listening on it stopped too). Returns whether it was listening there.
    pub fn unlisten(&mut self, port: u16) -> bool {
        let Some(i) = self.listeners.iter().position(|l| l.port == port) else {
            return false;
        };
        self.quiet = None;
        let listening = self.listeners.swap_remove(i);
        self.table.unlisten(self.port.local_ip, port);
        self.retired.push(listening);
        self.release_retired();
        true
    }

    /// Releases the stopped listeners none of whose connections lives any more.
    fn release_retired(&mut self) {
        let mut i = 0;
        while i < self.retired.len() {
            let port = self.retired[i].port;
            if self.conns.iter().any(|c| c.listen_port == Some(port)) {
                i += 1;
            } else {
                self.port.release_listen(self.retired.swap_remove(i));
            }
        }
    }

    /// A source port for a connection to `remote`, reserved with the kernel. A shard on a NIC
    /// whose RSS configuration is known takes the first of the kernel's ephemeral ports whose
    /// replies (from `remote` to us) the NIC hashes onto the shard's own queue: about N tries
    /// for N queues, all reservations held until the choice so that none comes twice. After
    /// [`RSS_PORT_TRIES`] it keeps the last one; its segments are then handed over to this
    /// shard like those of any flow that arrives on another queue.
    fn source_port(&self, remote: SocketAddrV4) -> Result<(Socket, u16), XdpTcpError> {
        let local_ip = self.port.local_ip;
        let (Some(_), Ok(rss), [sock]) = (&self.shard, &self.port.rss, self.socks.as_slice())
        else {
            return reserve_port(local_ip, 0);
        };
        let queue = sock.queue();
        let mut tried = Vec::new();
        for _ in 0..RSS_PORT_TRIES {
            let (reservation, port) = reserve_port(local_ip, 0)?;
            if rss.queue_of(remote, SocketAddrV4::new(local_ip, port)) == queue {
                return Ok((reservation, port));
            }
            tried.push((reservation, port));
        }
        tracing::debug!(%remote, queue, "no source port of {RSS_PORT_TRIES} lands on our queue");
        tried.pop().map_or_else(|| reserve_port(local_ip, 0), Ok)
    }

    /// Opens a connection to `remote` with `cfg` (MTU and MSS lowered to the interface's):
    /// resolves the next hop (blocking up to [`XdpTcpConfig::neighbour_timeout`]), reserves an
    /// ephemeral port with the kernel, steers the 4-tuple and queues the SYN (sent by the next
    /// [`poll`](Self::poll)). [`Event::Connected`] reports the handshake's end.
    pub fn connect(&mut self, remote: SocketAddrV4, cfg: TcpConfig) -> Result<ConnId, XdpTcpError> {
        self.connect_from(0, remote, cfg)
    }

    /// [`XdpTcp::connect`] from source port `local_port` of our address, reserved with the
    /// kernel (a port in use fails with [`XdpTcpError::PortInUse`]); 0 picks one as `connect`
    /// does.
    pub fn connect_from(
        &mut self,
        local_port: u16,
        remote: SocketAddrV4,
        cfg: TcpConfig,
    ) -> Result<ConnId, XdpTcpError> {
        let (route, mac) = resolve_next_hop(*remote.ip(), self.cfg.neighbour_timeout)?;
        self.check_route(*remote.ip(), &route)?;
        self.connect_via(local_port, remote, mac, cfg)
    }

    /// How long a next hop's resolution may take ([`XdpTcpConfig::neighbour_timeout`]).
    pub fn neighbour_timeout(&self) -> Duration {
        self.cfg.neighbour_timeout
    }

    /// The MAC address of the next hop towards `remote` if the kernel knows it now (no
    /// resolution, no waiting: two netlink queries); `None` when it has to be resolved first
    /// ([`crate::xsk::resolve_next_hop`], then [`XdpTcp::check_route`] and
    /// [`XdpTcp::connect_via`]), which an engine does off its thread. Fails if the route
    /// leaves by another interface.
    pub fn known_next_hop(&self, remote: Ipv4Addr) -> Result<Option<[u8; 6]>, XdpTcpError> {
        let (route, mac) = crate::xsk::known_next_hop(remote)?;
        self.check_route(remote, &route)?;
        Ok(mac)
    }

    /// Fails unless `route` (towards `addr`) leaves through our interface.
    pub fn check_route(
        &self,
        addr: Ipv4Addr,
        route: &crate::xsk::Route,
    ) -> Result<(), XdpTcpError> {
        if route.ifindex != self.port.ifindex {
            return Err(XdpTcpError::WrongInterface {
                addr,
                route_ifindex: route.ifindex,
                ifname: self.port.ifname.clone(),
                ifindex: self.port.ifindex,
            });
        }
        Ok(())
    }

    /// [`XdpTcp::connect_from`] with the next hop's MAC address resolved already (through
    /// our interface: [`XdpTcp::known_next_hop`] or [`XdpTcp::check_route`]).
    pub fn connect_via(
        &mut self,
        local_port: u16,
        remote: SocketAddrV4,
        next_hop: [u8; 6],
        cfg: TcpConfig,
    ) -> Result<ConnId, XdpTcpError> {
        self.quiet = None;
        let mac = next_hop;
        self.neigh.learn(*remote.ip(), mac);
        let (reservation, local_port) = match local_port {
            0 => self.source_port(remote)?,
            port => reserve_port(self.port.local_ip, port)?,
        };
        let flow = FlowKey {
            saddr: *remote.ip(),
            daddr: self.port.local_ip,
            sport: remote.port(),
            dport: local_port,
        };
        let tuple = tcp_engine::FourTuple {
            local_addr: self.port.local_ip,
            local_port,
            remote_addr: *remote.ip(),
            remote_port: remote.port(),
        };
        // A tuple in use (an explicit source port connected twice) is refused before the
        // steering entry and the directory claim are touched: both are the live connection's,
        // and undoing them on the way out would send its segments to the kernel (which resets
        // the peer).
        if self.table.lookup(&tuple).is_some() {
            return Err(XdpTcpError::Table(TableError::TupleInUse));
        }
        // Shards: the flow is ours before the SYN leaves, so that a SYN-ACK arriving on
        // another shard's queue comes here.
        let dir_key = match &self.shard {
            Some(sh) => match shard::flow_key(*remote.ip(), remote.port(), local_port) {
                Some(key) => {
                    if sh.set.directory.claim(key, sh.index)? != sh.index {
                        return Err(XdpTcpError::Table(TableError::TupleInUse));
                    }
                    Some(key)
                }
                None => None,
            },
            None => None,
        };
        let unclaim = |this: &Self| {
            if let (Some(sh), Some(key)) = (&this.shard, dir_key) {
                sh.set.directory.remove(key, sh.index);
            }
        };
        if let Err(e) = self.port.prog().steer_flow(flow) {
            unclaim(self);
            return Err(e.into());
        }
        let cfg = self.fit(cfg);
        let now = self.now();
        let id = match self.table.connect(cfg, tuple, now) {
            Ok(id) => id,
            Err(e) => {
                let _ = self.port.prog().unsteer_flow(flow);
                unclaim(self);
                return Err(e.into());
            }
        };
        self.conns.push(Tracked {
            id,
            flow: Some(flow),
            dir_key,
            _reservation: Some(reservation),
            listen_port: None,
        });
        self.attention.mark(id);
        Ok(id)
    }

    /// A connection, for reading its state and statistics.
    pub fn connection(&self, id: ConnId) -> Option<&Connection> {
        self.table.get(id)
    }

    /// A connection, for sending, reading, closing outside [`TcpApp::on_poll`].
    pub fn connection_mut(&mut self, id: ConnId) -> Option<&mut Connection> {
        self.quiet = None;
        self.table.get_mut(id)
    }

    /// How old quiet polls' clock reading ([`polled_at`](Self::polled_at)) may grow before
    /// every quiet poll reads the clock ([`QUIET_CLOCK_LAG`] by default): the engine sets a
    /// tenth of its `park_max`.
    pub fn set_quiet_clock_lag(&mut self, lag: Duration) {
        self.quiet_clock_lag = lag;
    }

    /// The next quiet poll reads the clock (and the stride of its readings starts again): the
    /// polls to come may be slower than those before (an engine thread that spun hands its
    /// turns to an application's polls).
    pub fn read_clock_next_poll(&mut self) {
        self.quiet_clock_stride = 1;
    }

    /// When (on the clock of [`epoch`](Self::epoch)) the last [`poll`](Self::poll) or
    /// [`poll_answering`](Self::poll_answering) read the clock: at most 16 polls before the last
    /// one while polls come fast (quiet polls read it every 16th), the last one while they come
    /// slowly ([`set_quiet_clock_lag`](Self::set_quiet_clock_lag)). What tells a parked engine thread whether the application
    /// still polls (inline progress).
    pub fn polled_at(&self) -> tcp_engine::Instant {
        self.polled_at
    }

    /// True if the table holds no connection (half-open ones included).
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Live connections the application has (accepted or connected, not yet closed).
    pub fn connections(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.conns.iter().map(|t| t.id)
    }

    /// The driver's and the table's counters, with the kernel's drop counters of its sockets
    /// (one `getsockopt` per socket).
    pub fn stats(&self) -> XdpTcpStats {
        let mut s = self.stats.clone();
        s.table = self.table.stats().clone();
        for k in self.socks.iter().map(|x| x.stats()) {
            s.rx_kernel_drops += k.rx_dropped + k.rx_ring_full;
            s.rx_multi_frame += k.rx_multi_frame;
            s.rx_multi_frame_dropped += k.rx_multi_frame_dropped;
            s.tx_multi_frame += k.tx_multi_frame;
            s.descs_refused += k.rx_descs_refused + k.tx_completions_refused;
        }
        s
    }

    /// Each socket's counters (ours and the kernel's).
    pub fn xsk_stats(&self) -> Vec<XskStats> {
        self.socks.iter().map(|s| s.stats()).collect()
    }

    /// The steering program's counters.
    pub fn steering_counters(&self) -> Result<Counters, XdpTcpError> {
        Ok(self.port.prog().counters()?)
    }

    /// How many connections the steering program holds (for every driver of the interface
    /// together: `max_connections` times the tables, at least `xdp_prog::DEFAULT_FLOWS`).
    pub fn steering_flow_capacity(&self) -> Result<u32, XdpTcpError> {
        Ok(self.port.prog().flow_capacity()?)
    }

    /// One turn of the loop (see the module documentation); never blocks. Returns true if
    /// anything happened (frames received or sent, connections accepted, events, closes).
    pub fn poll<A: TcpApp + ?Sized>(&mut self, app: &mut A) -> Result<bool, XdpTcpError> {
        self.poll_inner(app, false)
    }

    /// [`poll`](Self::poll) for a thread that runs the driver between its own requests and
    /// waits for what arrives (an application polling for completions or for data landing in
    /// its memory): a poll that passed received data up returns once the data is placed and
    /// what it finished is handed out ([`TcpApp::deliver_received`]), leaving the connections'
    /// service, timers and transmission to the next poll, which runs in full. What the
    /// application waits for is in its memory and its completion queue that much sooner (a
    /// write-lat reply is posted before any service). The reply the application then posts
    /// carries the acknowledgement a transmission now would have sent alone, in one pass
    /// instead of two.
    /// At most one poll in a row defers; one that received only acknowledgements (a sender's
    /// window opening) does not.
    pub fn poll_answering<A: TcpApp + ?Sized>(&mut self, app: &mut A) -> Result<bool, XdpTcpError> {
        self.poll_inner(app, true)
    }

    /// A turn for connection `id`, whose application just queued work for it, on the
    /// posting thread: that connection's service ([`TcpApp::on_poll`], which takes the
    /// work, and its events), then the transmission, which sends what it queued. No frame is
    /// received, no other connection serviced and no timer run: the next poll (a full one)
    /// does that, and services `id` again. What a posted request costs before its frame
    /// leaves is its own connection's work alone. A full poll instead when frames wait or a
    /// TCP timer is due.
    pub fn poll_posted<A: TcpApp + ?Sized>(
        &mut self,
        app: &mut A,
        id: ConnId,
    ) -> Result<bool, XdpTcpError> {
        // Frames wait (a sender posting without polling), or a TCP timer is due: a full turn
        // takes them, so that a run of posts does not leave the acknowledgements it waits
        // for on the RX ring, nor a retransmission for later.
        let now = self.now();
        if !self.nothing_received() || self.table.poll_timeout().is_some_and(|d| d <= now) {
            return self.poll_inner(app, false);
        }
        probe::mark(Mark::PollStart);
        self.stats.posting_turns += 1;
        // The next poll runs in full and services this connection again (a close it
        // reached is handled there).
        self.quiet = None;
        self.attention.mark(id);
        let (serviced, _) = self.service_one(app, id, now);
        probe::mark(Mark::Serviced);
        probe::mark(Mark::TransmitStart);
        let (sent, _) = self.transmit(now, app)?;
        probe::mark(Mark::Transmitted);
        Ok(serviced || sent)
    }

    fn poll_inner<A: TcpApp + ?Sized>(
        &mut self,
        app: &mut A,
        defer: bool,
    ) -> Result<bool, XdpTcpError> {
        let app_work = app.has_new_work();
        if let Some(until) = self.quiet {
            // The clock is read every 16th quiet poll only (a clock reading costs as much as
            // the rest of such a poll): a deadline passes at most 15 of them late, and
            // `polled_at` is as old. Every poll reads it while 16 polls would take longer than
            // `quiet_clock_lag`: `polled_at` says whether the application still polls (inline
            // progress), and 16 slow polls made it look stopped.
            if !app_work && self.nothing_received() {
                let stride = self.quiet_clock_stride;
                let due = self.stats.quiet_polls.is_multiple_of(stride) && {
                    let now = self.now();
                    let since = now.saturating_since(self.polled_at);
                    let per_poll = since / u32::try_from(stride).unwrap_or(u32::MAX);
                    self.quiet_clock_stride =
                        if per_poll * QUIET_CLOCK_STRIDE as u32 > self.quiet_clock_lag {
                            1
                        } else {
                            QUIET_CLOCK_STRIDE
                        };
                    self.polled_at = now;
                    until.is_some_and(|d| now >= d)
                };
                if !due {
                    self.stats.quiet_polls += 1;
                    return Ok(false);
                }
            }
            self.quiet = None;
        }
        probe::mark(Mark::PollStart);
        let now = self.now();
        self.polled_at = now;
        let (mut work, backlog, passed_up) = self.receive(now, app);
        probe::mark(Mark::Received);
        // An answering poll returns with the data placed and what it finished handed out;
        // the service, timers and transmission wait for the next poll. Not when this poll
        // took new requests: their transmission (the reply) goes now.
        if defer && passed_up && !app_work && !self.deferred {
            // The connections that received (marked by the receive, serviced by the next
            // poll, or by this one if one of them needs it now).
            let mut serviced_later = true;
            for &id in &self.attention.list {
                match app.deliver_received(id) {
                    Some(delivered) => work |= delivered,
                    None => {
                        serviced_later = false;
                        break;
                    }
                }
            }
            if serviced_later {
                self.deferred = true;
                self.stats.answering_returns += 1;
                probe::mark(Mark::Delivered);
                return Ok(work);
            }
        }
        // An answering poll whose connections needed their service now still leaves timers
        // and transmission to the next poll.
        let deferring = defer && passed_up && !app_work && !self.deferred;
        self.deferred = false;
        work |= self.accept_new(app);
        work |= self.service(app, now);
        probe::mark(Mark::Serviced);
        if deferring {
            self.deferred = true;
            return Ok(work);
        }
        // A poll that received or serviced something reads the clock again: what it sends
        // carries timestamps (RTT samples) and arms timers from the time it is sent, not from
        // before a batch of frames was processed. One that found nothing needs no second
        // reading.
        let now = if work { self.now() } else { now };
        let mut timers_fired = false;
        if self.table.poll_timeout().is_some_and(|d| d <= now) {
            // A full batch means more frames wait in a ring, and after the thread was
            // descheduled they hold the ACKs the expired timers are waiting for: firing the
            // timers first would retransmit what has arrived. Drain first, for a few turns.
            if backlog && self.timers_deferred < 8 {
                self.timers_deferred += 1;
            } else {
                self.timers_deferred = 0;
                self.table.handle_timeout(now);
                timers_fired = true;
            }
        }
        probe::mark(Mark::TransmitStart);
        let (sent, tx_settled) = self.transmit(now, app)?;
        probe::mark(Mark::Transmitted);
        work |= sent;
        self.sweep(now);
        // Quiet: nothing happened, nothing waits for a later turn (a full receive batch,
        // deferred timers, segments or frames left unsent), and every connection was serviced
        // (with many, a turn services only those named, and all of them now and then).
        // (A timer that fired may have closed a connection without sending anything: the
        // next poll's service removes it.)
        if !work
            && !backlog
            && !timers_fired
            && self.timers_deferred == 0
            && tx_settled
            && self.conns.len() <= SERVICE_ALL_MAX
        {
            let sweep = self.shard.as_ref().map(|_| {
                tcp_engine::Instant::from_nanos(
                    self.last_sweep
                        .saturating_add(SWEEP_EVERY.as_nanos() as u64),
                )
            });
            self.quiet = Some(
                [self.table.poll_timeout(), app.poll_timeout(), sweep]
                    .into_iter()
                    .flatten()
                    .min(),
            );
        }
        Ok(work)
    }

    /// Makes the next [`poll`](Self::poll) a full one (the caller changed something the
    /// driver cannot see).
    pub fn unquiet(&mut self) {
        self.quiet = None;
    }

    /// True if no frame waits on any RX ring or in the shard's inbox, and receiving owes the
    /// kernel nothing (see [`XskSocket::rx_idle`]).
    fn nothing_received(&mut self) -> bool {
        if let Some(inbox) = self.shard.as_ref().and_then(|s| s.inbox()) {
            if !inbox.is_empty() {
                return false;
            }
        }
        self.socks.iter_mut().all(|s| s.rx_idle())
    }

    /// Shards: once per [`SWEEP_EVERY`], forgets this shard's directory entries whose flow
    /// the table no longer has (half-open connections the table dropped by itself).
    fn sweep(&mut self, now: tcp_engine::Instant) {
        let Some(sh) = &self.shard else { return };
        let nanos = now.as_nanos();
        if nanos.saturating_sub(self.last_sweep) < SWEEP_EVERY.as_nanos() as u64 {
            return;
        }
        self.last_sweep = nanos;
        let (table, local_addr) = (&self.table, self.port.local_ip);
        sh.set.directory.retain_owned(sh.index, |key| {
            let (remote_addr, remote_port, local_port) = shard::flow_of_key(key);
            let tuple = tcp_engine::FourTuple {
                local_addr,
                local_port,
                remote_addr,
                remote_port,
            };
            table.lookup(&tuple).is_some()
        });
    }

    /// [`poll`](Self::poll), and after [`XdpTcpConfig::idle_spins`] idle turns in a row a sleep
    /// in `ppoll` until a frame arrives, the next TCP deadline, or
    /// [`XdpTcpConfig::max_wait`]. What a dedicated engine thread calls in its loop.
    pub fn turn<A: TcpApp + ?Sized>(&mut self, app: &mut A) -> Result<bool, XdpTcpError> {
        let work = self.poll(app)?;
        if work {
            self.idle_turns = 0;
        } else {
            self.idle_turns = self.idle_turns.saturating_add(1);
            if self.idle_turns >= self.cfg.idle_spins {
                self.wait(app, self.cfg.max_wait)?;
            }
        }
        Ok(work)
    }

    /// Sleeps until a frame arrives on any socket, the next TCP deadline, the application's
    /// next deadline ([`TcpApp::poll_timeout`]), or `max`. Returns true if a frame is ready.
    pub fn wait<A: TcpApp + ?Sized>(
        &mut self,
        app: &A,
        max: Duration,
    ) -> Result<bool, XdpTcpError> {
        let now = self.now();
        let mut timeout = max;
        for deadline in [self.table.poll_timeout(), app.poll_timeout()]
            .into_iter()
            .flatten()
        {
            timeout = timeout.min(deadline.saturating_since(now));
        }
        if timeout.is_zero() {
            return Ok(false);
        }
        let inbox = self.shard.as_ref().and_then(|s| s.inbox());
        if let Some(inbox) = inbox {
            if !inbox.sleep_begin() {
                return Ok(true);
            }
        }
        self.stats.waits += 1;
        let ready = ppoll(&mut self.pollfds, timeout);
        if let Some(inbox) = inbox {
            inbox.sleep_end();
        }
        Ok(ready.map_err(XdpTcpError::Wait)? > 0)
    }

    /// Takes a batch from each socket (and, for a shard, from its inbox); returns (any frame,
    /// some batch was full, some segment passed data up to the application).
    fn receive<A: TcpApp + ?Sized>(
        &mut self,
        now: tcp_engine::Instant,
        app: &mut A,
    ) -> (bool, bool, bool) {
        let Self {
            socks,
            table,
            neigh,
            stats,
            cfg,
            shard,
            attention,
            listeners,
            conns,
            port,
            ..
        } = self;
        let mut rx = Rx {
            local_mac: port.mac(),
            other_mac_seen: false,
            table,
            neigh,
            stats,
            attention,
            now,
            passed_up: false,
            accept: AcceptTo {
                listeners,
                conns,
                local_ip: port.local_ip,
                sharded: shard.is_some(),
            },
        };
        let mut any = false;
        let mut full = false;
        if let Some(inbox) = shard.as_ref().and_then(|s| s.inbox()) {
            for _ in 0..cfg.rx_batch {
                if !inbox.pop_with_digest(|frame, digest| {
                    probe::mark(Mark::FrameSeen);
                    rx.stats.handoffs_in += 1;
                    rx.frame(frame, digest, None, app);
                }) {
                    break;
                }
                any = true;
            }
            full |= !inbox.is_empty();
        }
        for sock in socks.iter_mut() {
            let batch = sock.recv_batch(cfg.rx_batch);
            if batch.is_empty() {
                continue;
            }
            probe::mark(Mark::FrameSeen);
            any = true;
            // Frames, not packets: a full ring gives full batches of frames (of at most the
            // socket's `max_batch`, whatever `rx_batch` asks: compared with `rx_batch` alone, a
            // larger one never saw a full batch, and the backlog went unnoticed).
            full |= batch.frames() >= cfg.rx_batch.min(cfg.xsk.max_batch as usize);
            for i in 0..RX_PREFETCH_AHEAD {
                batch.prefetch(i);
            }
            for i in 0..batch.len() {
                batch.prefetch(i + RX_PREFETCH_AHEAD);
                let Some(frame) = batch.get(i) else { break };
                rx.stats.rx_frames += 1;
                rx.frame(frame, batch.digest(i), shard.as_ref(), app);
            }
        }
        if rx.other_mac_seen {
            port.recheck_mac();
        }
        (any, full, rx.passed_up)
    }

    fn accept_new<A: TcpApp + ?Sized>(&mut self, app: &mut A) -> bool {
        let mut to = AcceptTo {
            listeners: &self.listeners,
            conns: &mut self.conns,
            local_ip: self.port.local_ip,
            sharded: self.shard.is_some(),
        };
        to.accept(&mut self.table, &mut self.stats, &mut self.attention, app)
    }

    /// Events, `on_poll` and removal of closed connections: every connection each turn while
    /// there are at most [`SERVICE_ALL_MAX`], else those that need it ([`Attention`]) and all
    /// of them every [`SERVICE_ALL_EVERY`], so that a turn costs what happened, not how many
    /// connections are open.
    fn service<A: TcpApp + ?Sized>(&mut self, app: &mut A, now: engine::Instant) -> bool {
        let attention = &mut self.attention;
        app.attention(&mut |id| attention.mark(id));
        let nanos = now.as_nanos();
        let all = self.conns.len() <= SERVICE_ALL_MAX
            || nanos.saturating_sub(self.last_service_all) >= SERVICE_ALL_EVERY.as_nanos() as u64;
        let mut any = false;
        let mut marked = std::mem::take(&mut self.attention.list);
        for id in marked.drain(..) {
            if let Some(m) = self.attention.marked.get_mut(id.index()) {
                *m = false;
            }
            if !all {
                let (had, closed) = self.service_one(app, id, now);
                any |= had;
                if closed {
                    // Linear, but only when a connection ends.
                    if let Some(i) = self.conns.iter().position(|t| t.id == id) {
                        any = true;
                        self.remove_closed(app, i);
                    }
                }
            }
        }
        self.attention.list = marked;
        if !all {
            return any;
        }
        self.last_service_all = nanos;
        let mut i = 0;
        while i < self.conns.len() {
            let id = self.conns[i].id;
            let (had, closed) = self.service_one(app, id, now);
            any |= had;
            if !closed {
                i += 1;
                continue;
            }
            any = true;
            self.remove_closed(app, i);
        }
        any
    }

    /// Events and `on_poll` of one connection; whether anything happened, and whether it is
    /// closed (or gone).
    fn service_one<A: TcpApp + ?Sized>(
        &mut self,
        app: &mut A,
        id: ConnId,
        now: engine::Instant,
    ) -> (bool, bool) {
        let mut any = false;
        let closed = match self.table.get_mut(id) {
            Some(conn) => {
                // A connection queues a handful of events at most per segment; the bound
                // only guards against a misbehaving application re-arming them forever.
                for _ in 0..64 {
                    let Some(ev) = conn.poll_event() else { break };
                    any = true;
                    app.on_event(id, conn, ev);
                }
                app.on_poll(id, conn, now);
                for _ in 0..64 {
                    let Some(ev) = conn.poll_event() else { break };
                    any = true;
                    app.on_event(id, conn, ev);
                }
                // A connection the application aborted is closed with its RST still to
                // send: it goes after this turn's transmission has sent it.
                conn.state() == State::Closed && !conn.wants_transmit()
            }
            None => true,
        };
        (any, closed)
    }

    /// Forgets the closed connection at position `i` of the live list.
    fn remove_closed<A: TcpApp + ?Sized>(&mut self, app: &mut A, i: usize) {
        let tracked = self.conns.swap_remove(i);
        if let Some(flow) = tracked.flow {
            // Failing to unsteer leaves a stale map entry for a 4-tuple nobody uses; the
            // connection is gone either way.
            let _ = self.port.prog().unsteer_flow(flow);
        }
        if let (Some(sh), Some(key)) = (&self.shard, tracked.dir_key) {
            // A new incarnation of the 4-tuple (a SYN that ended this one's TIME-WAIT, RFC
            // 6191) is this shard's too: it keeps the claim.
            let successor = self.table.get(tracked.id).is_some_and(|c| {
                self.table
                    .lookup(&c.four_tuple())
                    .is_some_and(|other| other != tracked.id)
            });
            if !successor {
                sh.set.directory.remove(key, sh.index);
            }
        }
        self.stats.closed += 1;
        if let Some(conn) = self.table.remove(tracked.id) {
            app.on_closed(tracked.id, conn);
        }
        if tracked.listen_port.is_some() && !self.retired.is_empty() {
            self.release_retired();
        }
    }

    /// Builds and queues what the connections have to send, then kicks. Returns (anything
    /// sent, nothing left: the table had no more and no frame waits on the TX ring).
    fn transmit<A: TcpApp + ?Sized>(
        &mut self,
        now: tcp_engine::Instant,
        app: &mut A,
    ) -> Result<(bool, bool), XdpTcpError> {
        let Self {
            socks,
            table,
            neigh,
            stats,
            port,
            mtu,
            ..
        } = self;
        let sock = &mut socks[0];
        let pool = sock.tx_free() + sock.tx_in_flight();
        let batch = usize::try_from(self.cfg.xsk.kick_batch)
            .unwrap_or(32)
            .max(1);
        let limit = ETH_HLEN + usize::from(*mtu);
        let src_mac = port.mac();
        let mut sent_any = false;
        let mut exhausted = false;
        let mut sources = AppSources(app);
        // Bounded: each round either queues frames or ends the loop; the TX pool bounds the
        // number of rounds that can queue, and so does `tx_turn_frames` (frames left over go
        // in the next turn, after that turn has read the frames received meanwhile).
        let mut rounds = pool / batch;
        if self.cfg.tx_turn_frames > 0 {
            rounds = rounds.min(self.cfg.tx_turn_frames.div_ceil(batch) - 1);
        }
        for _ in 0..=rounds {
            // Each packet straight into its frames (several on a multi-buffer socket): the
            // headers in the first, a data segment's payload on through the rest, cut at the
            // MTU.
            let queued = sock.send_framed(batch, |_, frames| {
                let (first, rest) = frames.split_first_mut()?;
                let cap = first.len().min(limit);
                let mut room = limit - cap;
                let mut pieces = 0;
                for piece in rest.iter_mut() {
                    if room == 0 {
                        break;
                    }
                    let n = piece.len().min(room);
                    *piece = &mut std::mem::take(piece)[..n];
                    room -= n;
                    pieces += 1;
                }
                let (eth, ip) = first[..cap].split_at_mut(ETH_HLEN);
                let tail = &mut rest[..pieces];
                let Some(len) = table.poll_transmit_split(now, ip, tail, &mut sources) else {
                    exhausted = true;
                    return None;
                };
                probe::mark(Mark::FrameWritten);
                match neigh.lookup(frame::ipv4_dst(&ip[..len.min(ip.len())])) {
                    Some(dst_mac) => {
                        frame::write_eth(eth, dst_mac, src_mac);
                        Some(ETH_HLEN + len)
                    }
                    None => {
                        stats.tx_no_mac += 1;
                        Some(0)
                    }
                }
            })?;
            stats.tx_packets += queued as u64;
            sent_any |= queued > 0;
            if exhausted {
                break;
            }
            if queued == 0 && !sock.tx_has_room_for_a_packet() {
                stats.tx_frames_exhausted += 1;
                break;
            }
        }
        sock.flush()?;
        Ok((sent_any, exhausted && sock.tx_ring_idle()))
    }
}

/// Whether a socket setup error may be the kernel or driver refusing `XDP_USE_SG` (and not,
/// say, a busy queue).
fn multi_buffer_refused(e: &XskError) -> bool {
    let errno = match e {
        XskError::NoXdpSupport { source, .. } | XskError::Setup { source, .. } => {
            source.raw_os_error()
        }
        _ => None,
    };
    matches!(errno, Some(libc::EINVAL) | Some(libc::EOPNOTSUPP))
}

/// The AF_XDP sockets of `queues`, bound for multi-buffer packets when the port needs them.
/// Where the driver cannot do multi-buffer in zero-copy mode, copy mode is tried (when the
/// bind mode was left to the kernel); where the kernel refuses multi-buffer binding at all
/// (before Linux 6.6), single-frame sockets, said in the log (the MTU the engine uses is then
/// what one frame holds).
/// `say`: log what happened (one shard of several says it for all).
fn open_sockets(
    port: &XdpPort,
    queues: &[u32],
    xsk: &XskConfig,
    say: bool,
) -> Result<Vec<XskSocket>, XdpTcpError> {
    let mut xsk = xsk.clone();
    xsk.multi_buffer |= port.multi_buffer;
    let open = |xsk: &XskConfig| XskSocket::open_queues(&port.ifname, queues.iter().copied(), xsk);
    let first = match open(&xsk) {
        Err(e) if xsk.multi_buffer && multi_buffer_refused(&e) => e,
        other => return Ok(other?),
    };
    if xsk.bind_mode == crate::xsk::BindMode::Auto {
        let copy = XskConfig {
            bind_mode: crate::xsk::BindMode::Copy,
            ..xsk.clone()
        };
        if let Ok(socks) = open(&copy) {
            if say {
                tracing::info!(
                ifname = port.ifname.as_str(),
                error = %first,
                "multi-buffer AF_XDP bound in copy mode (the zero-copy bind failed)"
                );
            }
            return Ok(socks);
        }
    }
    if say {
        tracing::warn!(
            ifname = port.ifname.as_str(),
            error = %first,
            "binding for multi-buffer AF_XDP (XDP_USE_SG) failed: packets limited to one UMEM \
             frame"
        );
    }
    xsk.multi_buffer = false;
    Ok(open(&xsk)?)
}

/// What receiving one frame needs (the driver's fields, borrowed apart from its sockets).
struct Rx<'a> {
    /// The interface's MAC address: frames to any other are not ours.
    local_mac: [u8; 6],
    /// A frame came to another unicast MAC address (see [`XdpPort::recheck_mac`]).
    other_mac_seen: bool,
    table: &'a mut ConnectionTable,
    neigh: &'a mut Neighbours,
    stats: &'a mut XdpTcpStats,
    attention: &'a mut Attention,
    now: tcp_engine::Instant,
    /// Some segment passed data up to the application.
    passed_up: bool,
    /// Where a connection whose handshake a segment completes goes at once, so that the
    /// application has it (and may post its buffers) before the segments after it in the same
    /// batch: a client's first data often comes right behind its last handshake ACK.
    accept: AcceptTo<'a>,
}

/// What accepting a listener's completed connections touches besides the table.
struct AcceptTo<'a> {
    listeners: &'a [Listening],
    conns: &'a mut Vec<Tracked>,
    local_ip: Ipv4Addr,
    sharded: bool,
}

impl AcceptTo<'_> {
    /// Hands every connection in the listeners' accept queues to the application
    /// (`on_accept`); true if there was any.
    fn accept<A: TcpApp + ?Sized>(
        &mut self,
        table: &mut ConnectionTable,
        stats: &mut XdpTcpStats,
        attention: &mut Attention,
        app: &mut A,
    ) -> bool {
        let mut any = false;
        for l in self.listeners {
            // Bounded by the backlog: the accept queue holds at most that many.
            while let Some(id) = table.accept(self.local_ip, l.port) {
                any = true;
                stats.accepted += 1;
                let dir_key = self.sharded.then_some(()).and_then(|_| {
                    let t = table.get(id)?.four_tuple();
                    shard::flow_key(t.remote_addr, t.remote_port, t.local_port)
                });
                self.conns.push(Tracked {
                    id,
                    flow: None,
                    dir_key,
                    _reservation: None,
                    listen_port: Some(l.port),
                });
                attention.mark(id);
                if let Some(conn) = table.get_mut(id) {
                    app.on_accept(id, conn);
                }
            }
        }
        any
    }
}

impl Rx<'_> {
    /// One received frame. For a shard (`shard` is `None` for frames from the inbox, which
    /// were routed already): a segment of a flow another shard owns is copied to its inbox; a
    /// SYN or ACK of a flow nobody owns is claimed for this shard before the table sees it
    /// (and the claim dropped if the table made no connection of it).
    ///
    /// `digest`: what joining a multi-frame packet read of its TCP payload, if it did.
    fn frame<A: TcpApp + ?Sized>(
        &mut self,
        frame: &[u8],
        digest: Option<PayloadDigest>,
        shard: Option<&ShardCtx>,
        app: &mut A,
    ) {
        // A frame to another station's MAC address (a NIC in promiscuous mode, a switch
        // flooding an unknown address) or to a group address: not for this host, as the
        // kernel judges it (it takes only PACKET_HOST frames for TCP, and drops other hosts'
        // before IP); the steering program looks at addresses and ports alone.
        match frame.get(..6) {
            Some(dst) if dst == self.local_mac => {}
            dst => {
                self.stats.rx_other_mac += 1;
                // (The group bit: broadcast and multicast are never ours for TCP.)
                self.other_mac_seen |= dst.is_some_and(|d| d[0] & 1 == 0);
                return;
            }
        }
        let Some((peek, src_mac)) = frame::ipv4_tcp_packet(frame) else {
            match frame::ipv4_icmp_packet(frame) {
                Some(ip) => self.icmp(ip, frame, shard),
                None => self.stats.rx_not_ipv4_tcp += 1,
            }
            return;
        };
        let (ip, src_ip) = (peek.packet(), peek.src_addr());
        // A segment for another address (the steering program matches our address too:
        // defence in depth): not ours to answer. The table would take it for a stray segment
        // and reset it from that address, a RST forged from a host we are not, sent where
        // its sender chose.
        if peek.dst_addr() != self.accept.local_ip {
            self.stats.rx_not_for_us += 1;
            return;
        }
        let syn = peek.is_syn();
        let mut claimed = None;
        if let Some(sh) = shard {
            if let Some(key) = shard::packet_key(&peek) {
                let dir = &sh.set.directory;
                // A SYN, or an ACK that may bring back a SYN cookie (the SYN left no state,
                // and its claim was dropped), may open a connection here: claim its flow
                // first, so that its later segments on other shards come here. Not when the
                // table would answer it without state (a SYN beyond the backlog gets a
                // cookie; an ACK with no cookie out, or to no listener, a RST): a flood of
                // those neither takes the writers' mutex nor churns the directory.
                // (Asked of flows nobody owns only: not per segment of a connection.)
                let opens = || {
                    (syn || peek.may_complete_cookie())
                        && peek.ports().is_some_and(|(_, dst_port)| {
                            self.table
                                .may_open(self.now, peek.dst_addr(), dst_port, syn)
                        })
                };
                let owner = match dir.lookup(key) {
                    None if opens() => match dir.claim(key, sh.index) {
                        Ok(o) => {
                            if o == sh.index {
                                claimed = Some(key);
                            }
                            Some(o)
                        }
                        Err(_) => {
                            // A connection no directory entry names would have its segments
                            // that land on other shards answered with RSTs: refuse it (the
                            // peer retries its SYN).
                            self.stats.directory_full += 1;
                            return;
                        }
                    },
                    o => o,
                };
                if let Some(o) = owner.filter(|&o| o != sh.index) {
                    sh.hand_off(o, frame, digest, self.stats);
                    return;
                }
            }
        }
        let opens = self.table.stats().passive_opens;
        let cookies = self.table.stats().syncookies_sent;
        let queued = self.table.stats().queued_for_accept;
        let mut rx = AppReceiver {
            app,
            passed_up: false,
            digest,
            digest_used: false,
        };
        probe::mark(Mark::FrameRouted);
        let res = self.table.handle_packet_with(self.now, ip, &mut rx);
        probe::mark(Mark::SegmentDone);
        self.passed_up |= rx.passed_up;
        self.stats.rx_multi_frame_digested += u64::from(rx.digest_used);
        if self.table.stats().queued_for_accept != queued {
            // A handshake completed: the MAC its last segment came from had our SYN-ACK.
            self.neigh.confirm(src_ip, src_mac);
            self.accept
                .accept(self.table, self.stats, self.attention, app);
        }
        // The SYN passed every check and opened a connection: its source MAC is the next hop
        // to answer through, if nothing is known of the address yet (see `Neighbours`).
        if syn && self.table.stats().passive_opens > opens {
            self.neigh.learn_passive(src_ip, src_mac);
        } else if syn && self.table.stats().syncookies_sent > cookies {
            // Answered with a cookie (the backlog full): what another SYN alone taught gives
            // way as it would with room, but nothing new is cached (a flood would churn it).
            self.neigh.replace_unconfirmed(src_ip, src_mac);
        }
        match res {
            Ok(Some(id)) => self.attention.mark(id),
            Ok(None) => {}
            Err(_) => self.stats.rx_malformed += 1,
        }
        if let (Some(sh), Some(key)) = (shard, claimed) {
            if !matches!(res, Ok(Some(_))) {
                sh.set.directory.remove(key, sh.index);
            }
        }
    }

    /// One received ICMP packet (`ip`, of `frame`): an ICMP "fragmentation needed" about a
    /// segment of ours lowers its connection's path MTU (see the module documentation, *Path
    /// MTU*). For a shard (`shard` is `None` for frames from the inbox), a message about a
    /// flow another shard owns is copied to that shard's inbox, as its segments are.
    /// Zero-copy parse, no allocation; nothing in the message is trusted before the table
    /// checked it.
    fn icmp(&mut self, ip: &[u8], frame: &[u8], shard: Option<&ShardCtx>) {
        let Ok((outer, msg)) = tcp_engine::wire::parse_frag_needed(ip) else {
            self.stats.icmp_rejected += 1;
            return;
        };
        let q = msg.quoted;
        // An ICMP error goes to the source of the datagram it quotes (RFC 792).
        if outer.dst_addr != q.src_addr {
            self.stats.icmp_rejected += 1;
            return;
        }
        if let Some(sh) = shard {
            let owner = shard::flow_key(q.dst_addr, q.dst_port, q.src_port)
                .and_then(|key| sh.set.directory.lookup(key));
            match owner {
                Some(o) if o != sh.index => {
                    sh.hand_off(o, frame, None, self.stats);
                    return;
                }
                Some(_) => {}
                None => {
                    self.stats.icmp_rejected += 1;
                    return;
                }
            }
        }
        let tuple = q.sender_tuple();
        match self
            .table
            .handle_packet_too_big(self.now, &tuple, q.seq, msg.next_hop_mtu)
        {
            Ok(_) => self.stats.icmp_frag_needed += 1,
            Err(tcp_engine::PacketTooBigError::MtuNotSmaller { .. }) => {
                self.stats.icmp_frag_needed_stale += 1
            }
            Err(_) => self.stats.icmp_rejected += 1,
        }
    }
}

/// The application as what a received packet calls back into ([`TcpApp::payload_sum`],
/// [`TcpApp::on_data`]).
struct AppReceiver<'a, A: ?Sized> {
    app: &'a mut A,
    passed_up: bool,
    /// What joining the packet read of its payload.
    digest: Option<PayloadDigest>,
    /// Whether TCP took the payload's sum from `digest`.
    digest_used: bool,
}

impl<A: TcpApp + ?Sized> tcp_engine::table::Receiver for AppReceiver<'_, A> {
    fn payload_sum(&mut self, payload: &[u8]) -> u16 {
        match self.digest.take() {
            // The join parsed the same headers: the same octets (the length says so too).
            Some(d) if d.len == payload.len() => {
                self.digest_used = true;
                self.app.payload_digested(payload, d)
            }
            _ => self.app.payload_sum(payload),
        }
    }

    fn pass_up(&mut self, id: ConnId, data: PassedUp<'_>) -> Option<TakeBack> {
        self.passed_up = true;
        self.app.on_data(id, data)
    }
}

/// The application as the table's transmit sources ([`TcpApp::fill_tx`]).
struct AppSources<'a, A: ?Sized>(&'a mut A);

impl<A: TcpApp + ?Sized> tcp_engine::table::TxSources for AppSources<'_, A> {
    fn fill(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<(), tcp_engine::TxSourceError> {
        self.0.fill_tx(id, stream_offset, out)
    }

    fn fill_summed(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u16>, tcp_engine::TxSourceError> {
        self.0.fill_tx_summed(id, stream_offset, out)
    }

    fn fill_split(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        len: usize,
        first: &mut [u8],
        rest: &mut [&mut [u8]],
    ) -> Result<u16, tcp_engine::TxSourceError> {
        self.0.fill_tx_split(id, stream_offset, len, first, rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserving_an_ephemeral_port_and_refusing_a_taken_one() {
        let (sock, port) = reserve_port(Ipv4Addr::LOCALHOST, 0).expect("reserve");
        assert_ne!(port, 0);
        let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listener");
        let taken = l.local_addr().expect("addr").port();
        match reserve_port(Ipv4Addr::LOCALHOST, taken) {
            Err(XdpTcpError::PortInUse { port, .. }) => assert_eq!(port, taken),
            other => panic!("expected PortInUse, got {other:?}"),
        }
        drop(sock);
    }

    #[test]
    fn ppoll_times_out_on_an_idle_fd() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        use std::os::fd::AsRawFd;
        let mut fds = [libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let t = std::time::Instant::now();
        assert_eq!(
            ppoll(&mut fds, Duration::from_millis(20)).expect("ppoll"),
            0
        );
        assert!(t.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn open_on_a_missing_interface_is_a_typed_error() {
        match XdpTcp::open("nonexistent-if0", XdpTcpConfig::default()) {
            Err(XdpTcpError::Xsk(XskError::InterfaceNotFound(n))) => {
                assert_eq!(n, "nonexistent-if0")
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn driver_is_send() {
        fn send<T: Send>() {}
        send::<XdpTcp>();
    }

    /// The receive path ([`Rx::frame`], [`Rx::icmp`]) without an interface: path MTU
    /// messages and the shards' routing of segments.
    mod rx {
        use super::*;
        use tcp_engine::wire::{emit_frag_needed, FragNeededRepr, QuotedTcp, SegmentRepr};
        use tcp_engine::{FourTuple, IsnGenerator};

        const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
        const REMOTE: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
        const ROUTER: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 254);

        struct NoApp;
        impl TcpApp for NoApp {}

        fn tuple() -> FourTuple {
            FourTuple {
                local_addr: LOCAL,
                local_port: 40000,
                remote_addr: REMOTE,
                remote_port: 5000,
            }
        }

        /// A table whose one connection (to a peer made here) has three 1448-octet segments
        /// in flight; their sequence numbers.
        fn table_in_flight() -> (ConnectionTable, ConnId, Vec<u32>) {
            let now = tcp_engine::Instant::ZERO;
            let mut table = ConnectionTable::new([1; 16], 4);
            let id = table
                .connect(TcpConfig::default(), tuple(), now)
                .expect("connect");
            let mut buf = vec![0u8; 2048];
            let n = table.poll_transmit(now, &mut buf).expect("SYN");
            let syn = SegmentRepr::parse(&buf[..n]).expect("SYN");
            let isn = IsnGenerator::new([2; 16]);
            let mut peer =
                Connection::accept(TcpConfig::default(), &syn, &isn, now).expect("accept");
            let n = peer.poll_transmit(now, &mut buf).expect("SYN-ACK");
            let synack = buf[..n].to_vec();
            assert_eq!(table.handle_packet(now, &synack, |_, _| {}), Ok(Some(id)));
            while table.poll_transmit(now, &mut buf).is_some() {}
            let conn = table.get_mut(id).expect("connection");
            assert_eq!(conn.send(&[9u8; 3 * 1448]), Ok(3 * 1448));
            let mut seqs = Vec::new();
            while let Some(n) = table.poll_transmit(now, &mut buf) {
                assert_eq!(n, 1500);
                seqs.push(SegmentRepr::parse(&buf[..n]).expect("segment").seq);
            }
            assert_eq!(seqs.len(), 3);
            (table, id, seqs)
        }

        /// An Ethernet frame carrying the router's ICMP "fragmentation needed" about our
        /// segment `seq` of `quoted` (our side's tuple), naming `mtu`.
        fn frame_of(quoted: FourTuple, seq: u32, mtu: u16) -> Vec<u8> {
            let msg = FragNeededRepr {
                next_hop_mtu: mtu,
                quoted: QuotedTcp {
                    src_addr: quoted.local_addr,
                    dst_addr: quoted.remote_addr,
                    src_port: quoted.local_port,
                    dst_port: quoted.remote_port,
                    seq,
                    total_len: 1500,
                },
            };
            let mut f = vec![0u8; ETH_HLEN + 56];
            frame::write_eth(&mut f[..ETH_HLEN], [2; 6], [4; 6]);
            let n = emit_frag_needed(ROUTER, 1, &msg, &mut f[ETH_HLEN..]).expect("emit");
            assert_eq!(n, 56);
            f
        }

        fn receive(table: &mut ConnectionTable, stats: &mut XdpTcpStats, frame: &[u8]) {
            receive_on(table, stats, frame, None);
        }

        /// `ip` in an Ethernet frame.
        fn framed(ip: &[u8]) -> Vec<u8> {
            let mut f = vec![0u8; ETH_HLEN];
            frame::write_eth(&mut f, [2; 6], [4; 6]);
            f.extend_from_slice(ip);
            f
        }

        fn receive_on(
            table: &mut ConnectionTable,
            stats: &mut XdpTcpStats,
            frame: &[u8],
            shard: Option<&ShardCtx>,
        ) {
            let mut neigh = Neighbours::new(0, 4);
            let mut attention = Attention::new(16);
            let mut conns = Vec::new();
            let mut rx = Rx {
                local_mac: [2; 6],
                other_mac_seen: false,
                table,
                neigh: &mut neigh,
                stats,
                attention: &mut attention,
                now: tcp_engine::Instant::from_millis(1),
                passed_up: false,
                accept: AcceptTo {
                    listeners: &[],
                    conns: &mut conns,
                    local_ip: LOCAL,
                    sharded: shard.is_some(),
                },
            };
            rx.frame(frame, None, shard, &mut NoApp);
        }

        /// Forged or stale messages (a sequence number not in flight, an unknown 4-tuple, an
        /// MTU below the floor, a bad checksum, another ICMP message, one not addressed to
        /// the quoted segment's source) are counted and change nothing; the real one lowers
        /// the path MTU and the oversized segments go out again at once; the rest of its
        /// burst is stale.
        #[test]
        fn forged_messages_change_nothing_and_the_real_one_lowers_the_path_mtu() {
            let (mut table, id, seqs) = table_in_flight();
            let mut stats = XdpTcpStats::default();
            let (t, now) = (tuple(), tcp_engine::Instant::from_millis(1));
            let mut forged = vec![
                frame_of(t, seqs[0].wrapping_sub(1), 1200),
                frame_of(t, seqs[2].wrapping_add(1448), 1200),
                frame_of(
                    FourTuple {
                        remote_port: 5001,
                        ..t
                    },
                    seqs[1],
                    1200,
                ),
                frame_of(t, seqs[1], 551),
                frame_of(t, seqs[1], 0),
            ];
            let mut bad_sum = frame_of(t, seqs[1], 1200);
            bad_sum[ETH_HLEN + 20 + 2] ^= 1;
            forged.push(bad_sum);
            let mut echo = frame_of(t, seqs[1], 1200);
            echo[ETH_HLEN + 20] = 8; // echo request
            tcp_engine::wire::Icmpv4Packet::new_unchecked(&mut echo[ETH_HLEN + 20..])
                .fill_checksum();
            forged.push(echo);
            let mut elsewhere = frame_of(t, seqs[1], 1200);
            elsewhere[ETH_HLEN + 19] = 9; // to 10.78.0.9, quoting our segment
            tcp_engine::wire::Ipv4Packet::new_unchecked(&mut elsewhere[ETH_HLEN..]).fill_checksum();
            forged.push(elsewhere);
            let mut buf = vec![0u8; 2048];
            for (i, f) in forged.iter().enumerate() {
                receive(&mut table, &mut stats, f);
                assert_eq!(stats.icmp_rejected, i as u64 + 1, "message {i}");
                let conn = table.get(id).expect("connection");
                assert_eq!((conn.path_mtu(), conn.emss()), (1500, 1448), "message {i}");
                assert!(
                    table.poll_transmit(now, &mut buf).is_none(),
                    "message {i}: nothing resent"
                );
            }
            assert_eq!(
                (stats.icmp_frag_needed, stats.icmp_frag_needed_stale),
                (0, 0)
            );
            assert_eq!((stats.rx_not_ipv4_tcp, stats.rx_malformed), (0, 0));
            // The same MTU as now: stale.
            receive(&mut table, &mut stats, &frame_of(t, seqs[1], 1500));
            assert_eq!(stats.icmp_frag_needed_stale, 1);
            // The real one, then the rest of its burst.
            receive(&mut table, &mut stats, &frame_of(t, seqs[0], 1200));
            receive(&mut table, &mut stats, &frame_of(t, seqs[1], 1200));
            receive(&mut table, &mut stats, &frame_of(t, seqs[2], 1200));
            assert_eq!(stats.icmp_frag_needed, 1);
            assert_eq!(stats.icmp_frag_needed_stale, 3);
            assert_eq!(stats.icmp_rejected, forged.len() as u64);
            let conn = table.get(id).expect("connection");
            assert_eq!((conn.path_mtu(), conn.emss()), (1200, 1148));
            let mut resent = Vec::new();
            while let Some(n) = table.poll_transmit(now, &mut buf) {
                resent.push(n);
            }
            assert_eq!(resent, [1200, 352, 1200, 352, 1200, 352]);
        }

        /// A SYN for another address at a listening port (the steering program matches ports
        /// alone) is dropped unanswered: the table's RST for it would come from an address
        /// that is not ours. The same SYN to our address opens a connection.
        #[test]
        fn a_segment_for_another_address_is_not_answered() {
            let mut server = listening_server();
            let mut stats = XdpTcpStats::default();
            for (to, answered) in [(Ipv4Addr::new(10, 78, 0, 77), false), (LOCAL, true)] {
                let syn = framed(&client_syn(to));
                assert_eq!(answers(&mut server, &mut stats, &syn), answered, "to {to}");
                assert_eq!(server.len(), usize::from(answered), "to {to}");
            }
            assert_eq!(stats.rx_not_for_us, 1);
        }

        /// A table listening on port 40000 of any address.
        fn listening_server() -> ConnectionTable {
            let mut server = ConnectionTable::new([1; 16], 8);
            server.listen(Ipv4Addr::UNSPECIFIED, 40000, 4, TcpConfig::default());
            server
        }

        /// A client's SYN from `REMOTE` to port 40000 of `to`: its IPv4 packet.
        fn client_syn(to: Ipv4Addr) -> Vec<u8> {
            let now = tcp_engine::Instant::from_millis(1);
            let mut client = ConnectionTable::new([2; 16], 4);
            let t = FourTuple {
                local_addr: REMOTE,
                local_port: 5000,
                remote_addr: to,
                remote_port: 40000,
            };
            client
                .connect(TcpConfig::default(), t, now)
                .expect("connect");
            let mut buf = vec![0u8; 2048];
            let n = client.poll_transmit(now, &mut buf).expect("SYN");
            buf.truncate(n);
            buf
        }

        /// Whether `server` answers `frame`.
        fn answers(server: &mut ConnectionTable, stats: &mut XdpTcpStats, frame: &[u8]) -> bool {
            receive_on(server, stats, frame, None);
            let mut buf = vec![0u8; 2048];
            server
                .poll_transmit(tcp_engine::Instant::from_millis(1), &mut buf)
                .is_some()
        }

        /// A SYN to our address and port but to another station's MAC address (a
        /// promiscuous NIC, a flooding switch) or to the broadcast address is not for us, as
        /// the kernel judges it: dropped unanswered. The same SYN to our MAC opens a
        /// connection.
        #[test]
        fn a_frame_for_another_mac_address_is_not_answered() {
            let mut server = listening_server();
            let mut stats = XdpTcpStats::default();
            for (mac, answered) in [([6; 6], false), ([0xff; 6], false), ([2; 6], true)] {
                let mut syn = framed(&client_syn(LOCAL));
                syn[..6].copy_from_slice(&mac);
                let replied = answers(&mut server, &mut stats, &syn);
                assert_eq!(replied, answered, "to {mac:x?}");
                assert_eq!(server.len(), usize::from(answered), "to {mac:x?}");
            }
            assert_eq!(stats.rx_other_mac, 2);
        }

        /// Shards: a client whose SYN got a SYN cookie (the half-open queue is full) and whose
        /// ACK arrives on another shard: that shard claims the flow before the cookie makes
        /// the connection, so the client's later segments on the first shard go to it and
        /// are not answered with a RST.
        #[test]
        fn a_cookie_ack_claims_its_flow_for_the_shard_that_took_it() {
            let now = tcp_engine::Instant::from_millis(1);
            let mut server = ConnectionTable::new([1; 16], 8);
            server.listen(LOCAL, 40000, 1, TcpConfig::default());
            let set = Arc::new(ShardSet::new(2, 4, 2048, 16).expect("shards"));
            let ctx = |index| ShardCtx {
                index,
                set: set.clone(),
            };
            let mut stats = XdpTcpStats::default();
            let mut buf = vec![0u8; 2048];
            // A spoofed SYN fills the half-open queue (backlog 1).
            let mut other = ConnectionTable::new([3; 16], 4);
            let far = FourTuple {
                local_addr: Ipv4Addr::new(10, 78, 0, 9),
                local_port: 777,
                remote_addr: LOCAL,
                remote_port: 40000,
            };
            other
                .connect(TcpConfig::default(), far, now)
                .expect("connect");
            let n = other.poll_transmit(now, &mut buf).expect("SYN");
            receive_on(&mut server, &mut stats, &framed(&buf[..n]), Some(&ctx(0)));
            while server.poll_transmit(now, &mut buf).is_some() {}
            // The client's SYN on shard 0 gets a cookie and leaves no claim.
            let mut client = ConnectionTable::new([2; 16], 4);
            let t = FourTuple {
                local_addr: REMOTE,
                local_port: 5000,
                remote_addr: LOCAL,
                remote_port: 40000,
            };
            let cid = client
                .connect(TcpConfig::default(), t, now)
                .expect("connect");
            let n = client.poll_transmit(now, &mut buf).expect("SYN");
            receive_on(&mut server, &mut stats, &framed(&buf[..n]), Some(&ctx(0)));
            assert_eq!(server.stats().syncookies_sent, 1);
            let key = shard::flow_key(REMOTE, 5000, 40000).expect("key");
            assert_eq!(set.directory.lookup(key), None);
            let n = server.poll_transmit(now, &mut buf).expect("cookie SYN-ACK");
            client
                .handle_packet(now, &buf[..n], |_, _| {})
                .expect("SYN-ACK");
            // Its ACK arrives on shard 1, which claims the flow and makes the connection.
            let n = client.poll_transmit(now, &mut buf).expect("ACK");
            receive_on(&mut server, &mut stats, &framed(&buf[..n]), Some(&ctx(1)));
            assert_eq!(server.stats().syncookies_validated, 1);
            assert_eq!(set.directory.lookup(key), Some(1));
            // Data on shard 0 goes to shard 1; nothing answers it with a RST.
            let conn = client.get_mut(cid).expect("client");
            assert_eq!(conn.send(b"after the cookie"), Ok(16));
            let n = client.poll_transmit(now, &mut buf).expect("data");
            receive_on(&mut server, &mut stats, &framed(&buf[..n]), Some(&ctx(0)));
            assert_eq!(stats.handoffs_out, 1);
            assert_eq!(server.stats().no_connection, 0);
            // A stray ACK for no connection claims nothing for long: the claim is dropped.
            let stray = client.get_mut(cid).expect("client");
            assert_eq!(stray.send(b"x"), Ok(1));
            let n = client.poll_transmit(now, &mut buf).expect("data");
            let mut f = framed(&buf[..n]);
            // Another source port: no connection, no cookie.
            f[ETH_HLEN + 20..ETH_HLEN + 22].copy_from_slice(&5001u16.to_be_bytes());
            tcp_engine::wire::fill_checksums(&mut f[ETH_HLEN..]).expect("checksums");
            receive_on(&mut server, &mut stats, &f, Some(&ctx(0)));
            let stray_key = shard::flow_key(REMOTE, 5001, 40000).expect("key");
            assert_eq!(set.directory.lookup(stray_key), None);
            assert_eq!(server.stats().syncookies_failed, 1);
        }

        /// Shards: a segment the table answers without keeping state (a SYN to no listener, a
        /// SYN beyond the backlog answered with a cookie, an ACK to a listener that sent no
        /// cookie) claims no flow: a flood of them takes no lock and leaves the directory as
        /// it was. A SYN with room in the backlog, and an ACK while a cookie may come back,
        /// still claim first.
        #[test]
        fn segments_answered_without_state_claim_no_flow() {
            use std::sync::atomic::Ordering::Relaxed;
            let mut server = ConnectionTable::new([1; 16], 8);
            server.listen(LOCAL, 40000, 1, TcpConfig::default());
            let set = Arc::new(ShardSet::new(2, 4, 2048, 16).expect("shards"));
            let ctx = ShardCtx {
                index: 0,
                set: set.clone(),
            };
            let mut stats = XdpTcpStats::default();
            let claims = || set.directory.claims.load(Relaxed);
            // A SYN from `port` to `to_port`, or an ACK made of it (flags only).
            let segment = |port: u16, to_port: u16, ack: bool| {
                let mut f = framed(&client_syn(LOCAL));
                let tcp = ETH_HLEN + 20;
                f[tcp..tcp + 2].copy_from_slice(&port.to_be_bytes());
                f[tcp + 2..tcp + 4].copy_from_slice(&to_port.to_be_bytes());
                if ack {
                    f[tcp + 13] = 0x10;
                }
                tcp_engine::wire::fill_checksums(&mut f[ETH_HLEN..]).expect("checksums");
                f
            };
            for port in 6000..6010 {
                receive_on(
                    &mut server,
                    &mut stats,
                    &segment(port, 40001, false),
                    Some(&ctx),
                );
                receive_on(
                    &mut server,
                    &mut stats,
                    &segment(port, 40000, true),
                    Some(&ctx),
                );
            }
            assert_eq!(claims(), 0, "no listener, no cookie out");
            assert_eq!(server.stats().no_connection, 20);
            // The first SYN has room (backlog 1): claimed; the rest get cookies.
            for port in 7000..7010 {
                receive_on(
                    &mut server,
                    &mut stats,
                    &segment(port, 40000, false),
                    Some(&ctx),
                );
            }
            assert_eq!((server.len(), server.stats().syncookies_sent), (1, 9));
            assert_eq!(claims(), 1, "only the SYN that made a connection");
            // A cookie is out: an ACK may bring it back, and is claimed until the table says.
            receive_on(
                &mut server,
                &mut stats,
                &segment(8000, 40000, true),
                Some(&ctx),
            );
            assert_eq!(claims(), 2);
            let key = shard::flow_key(REMOTE, 8000, 40000).expect("key");
            assert_eq!(set.directory.lookup(key), None, "the claim dropped");
        }

        /// Shards: a message about a flow another shard owns goes to that shard's inbox; one
        /// about a flow nobody owns is rejected.
        #[test]
        fn a_shard_hands_a_message_to_the_flows_owner() {
            let (mut table, _, seqs) = table_in_flight();
            let set = Arc::new(ShardSet::new(2, 4, 256, 16).expect("shards"));
            let ctx = ShardCtx {
                index: 0,
                set: set.clone(),
            };
            let t = tuple();
            let f = frame_of(t, seqs[0], 1200);
            let mut stats = XdpTcpStats::default();
            receive_on(&mut table, &mut stats, &f, Some(&ctx));
            assert_eq!(stats.icmp_rejected, 1, "nobody owns the flow");
            let key = shard::flow_key(REMOTE, 5000, 40000).expect("key");
            assert_eq!(set.directory.claim(key, 1), Ok(1));
            receive_on(&mut table, &mut stats, &f, Some(&ctx));
            assert_eq!(stats.handoffs_out, 1);
            assert_eq!(stats.icmp_rejected, 1);
            let mut handed = Vec::new();
            assert!(set.inboxes[1].pop_with(|b| handed.extend_from_slice(b)));
            assert_eq!(handed, f);
            // The owner (here: this table) believes it from its inbox.
            receive_on(&mut table, &mut stats, &handed, None);
            assert_eq!(stats.icmp_frag_needed, 1);
            // Owned by this shard: handled here.
            assert!(set.directory.remove(key, 1));
            assert_eq!(set.directory.claim(key, 0), Ok(0));
            receive_on(
                &mut table,
                &mut stats,
                &frame_of(t, seqs[1], 1000),
                Some(&ctx),
            );
            assert_eq!((stats.icmp_frag_needed, stats.handoffs_out), (2, 1));
        }
    }
}
