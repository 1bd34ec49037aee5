//! The relay bed (`scripts/netns-relay.sh`): hosts in namespaces `iwra` and `iwrb`, joined
//! through namespace `iwrr`, where a test relay forwards frames between `rra0` and `rrb0`.
//! Separate from the plain bed (other names, other subnet); it takes the same lock
//! ([`crate::RelayBed`]).
//!
//! The test relay ([`Relay`], also the `iwarp-relay` binary of this crate): an L2 forwarder
//! between two interfaces (the relay namespace) that impairs the TCP traffic it forwards, to
//! put the AF_XDP engine through real loss, reordering, re-segmentation, duplication,
//! corruption, delay and a shrinking path MTU on the test bed.
//!
//! Frames are read and written with `AF_PACKET` sockets (the relay's ends are promiscuous and
//! carry no addresses, so the kernel there only watches). Everything that is not IPv4 TCP (ARP)
//! is forwarded unchanged (but delayed and MTU-checked like the rest, steps 5 and 6). TCP
//! segments, per direction:
//!
//! 1. *MSS clamp* (optional): the MSS option of SYNs is lowered, as middleboxes do, so senders
//!    make FPDUs smaller than the segments the relay may build;
//! 2. *Re-segmentation* (optional): the payload of contiguous data segments is gathered (held
//!    for at most [`RelayConfig::hold`]) and cut again at random offsets into segments of up to
//!    the link's MTU, with fresh IPv4 and TCP checksums; FIN, PSH, the newest ACK, window and
//!    options ride on the last piece; out-of-sequence segments (retransmissions) flush what is
//!    gathered and start anew. FPDUs then no longer start segments.
//! 3. *Loss, corruption, duplication*: each resulting segment (pure ACKs included) is dropped
//!    with probability [`RelayConfig::loss`]; a data segment that is not dropped has 1 to
//!    [`RelayConfig::corrupt_bits`] distinct bits of its payload flipped with probability
//!    [`RelayConfig::corrupt`] (in the directions of [`RelayConfig::corrupt_toward`], from
//!    [`RelayConfig::corrupt_start`], at most [`RelayConfig::corrupt_max`] segments), its TCP
//!    checksum recomputed so that TCP accepts it and only MPA's CRC can tell; then the segment
//!    is sent twice with probability [`RelayConfig::duplicate`]: the copy goes out right
//!    behind it, or at once when the segment itself is held back (step 4).
//! 4. *Reordering*: with [`RelayConfig::reorder`] a segment (not its duplicate) is held back
//!    until 1 to [`RelayConfig::reorder_frames`] later frames of its direction have passed (or
//!    [`RelayConfig::reorder_delay`] has), else forwarded at once.
//! 5. *Path MTU drop* (optional, [`RelayConfig::path_mtu`]): from its start on, every IPv4
//!    packet longer than the new MTU is dropped, as a router with a smaller next hop does; one
//!    with DF set (our senders and Linux set it) is answered with an ICMP "fragmentation
//!    needed" (type 3 code 4, RFC 792) carrying the next-hop MTU (RFC 1191 section 4) and the
//!    packet's IPv4 header and first 8 payload octets, sent back to the sender's MAC and IPv4
//!    address from [`PathMtu::router`]. The relay never fragments.
//! 6. *Delay and jitter* (optional): every frame leaves [`RelayConfig::delay`] plus a uniform
//!    draw from 0 to [`RelayConfig::jitter`] after it arrived. Frames are sent in the order of
//!    their departure times, so jitter reorders frames that arrive closer together than it
//!    (as on real paths with several queues or links; counted as `jitter_reordered`).
//!
//! Frames are parsed and checksums rewritten with `tcp_engine::wire` ([`EthernetFrame`],
//! [`Ipv4TcpView`], [`wire::fill_checksums`], [`wire::Checksum`]), the engine's own frame view
//! and checksum.
//!
//! Decisions come from seeded generators (xorshift), so a seed gives the same decisions for
//! the same sequence of frames. Loss, reordering and re-segmentation share one generator;
//! duplication, corruption and jitter each draw from their own generator per direction, only
//! for the frames they may act on, so that corruption, for one, hits the same data segments
//! of a direction with the same bits whatever the other direction does (without loss, which
//! decides first which segments there are). Counters are kept per
//! direction ([`DirStats`]); [`Relay::stats`] reads them while the relay runs. The relay runs
//! on its own thread until [`Relay::stop`] (or drop) or its `lifetime` ends.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ffi::CString;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tcp_engine::wire::{
    self, Checksum, EthernetFrame, Ipv4TcpView, ETHERNET_HEADER_LEN, ETHERTYPE_IPV4,
};

/// Namespace of host A.
pub const NS_A: &str = "iwra";
/// Namespace of host B.
pub const NS_B: &str = "iwrb";
/// Namespace of the relay.
pub const NS_RELAY: &str = "iwrr";
/// Host A's interface.
pub const DEV_A: &str = "iwra0";
/// Host B's interface.
pub const DEV_B: &str = "iwrb0";
/// The relay's interface towards A.
pub const RELAY_DEV_A: &str = "rra0";
/// The relay's interface towards B.
pub const RELAY_DEV_B: &str = "rrb0";
/// Host A's address.
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
/// Host B's address.
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
/// The address the relay's ICMP messages come from by default ([`PathMtu::router`]): in the
/// bed's subnet, owned by no host.
pub const ROUTER: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 254);

/// Errors of the test relay.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// A socket or namespace operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// The relay thread ended abnormally.
    #[error("relay thread: {0}")]
    Thread(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RelayError {
    let what = what.into();
    move |source| RelayError::Io { what, source }
}

/// What the relay does to the traffic.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Network namespace to run in (`None`: the caller's).
    pub netns: Option<String>,
    /// Interface towards host A.
    pub dev_a: String,
    /// Interface towards host B.
    pub dev_b: String,
    /// Seed of the decisions.
    pub seed: u64,
    /// Probability a TCP segment is dropped.
    pub loss: f64,
    /// Probability a TCP segment is held back (reordered).
    pub reorder: f64,
    /// A held-back segment goes out after 1..=this many later frames of its direction.
    pub reorder_frames: u32,
    /// ... or after this long, whichever comes first.
    pub reorder_delay: Duration,
    /// Gather and re-cut data segments at random offsets.
    pub resegment: bool,
    /// Longest a gathered piece waits for the next contiguous segment.
    pub hold: Duration,
    /// Lower the MSS option of SYNs to this.
    pub mss_clamp: Option<u16>,
    /// Largest IPv4 packet the relay builds (the links' MTU).
    pub mtu: usize,
    /// Probability a TCP segment that was not dropped is sent twice.
    pub duplicate: f64,
    /// Probability a data segment (payload, no SYN or RST) that was not dropped has bits of its
    /// payload flipped (its checksums recomputed).
    pub corrupt: f64,
    /// A corrupted segment has 1 to this many distinct payload bits flipped (uniform count;
    /// at least 1).
    pub corrupt_bits: u32,
    /// The directions whose data segments may be corrupted.
    pub corrupt_toward: Toward,
    /// When corruption begins (each direction on its own with [`Start::AfterBytes`]).
    pub corrupt_start: Start,
    /// Most segments corrupted in each direction.
    pub corrupt_max: u64,
    /// One-way delay added to every frame.
    pub delay: Duration,
    /// Each frame is delayed by a further uniform draw from 0 to this (frames may overtake
    /// each other).
    pub jitter: Duration,
    /// A path MTU that shrinks mid-run (`None`: the links' MTU throughout).
    pub path_mtu: Option<PathMtu>,
    /// The relay stops by itself after this long.
    pub lifetime: Duration,
}

/// Which directions of the relay an impairment acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Toward {
    /// Frames from A to B and from B to A.
    #[default]
    Both,
    /// Frames going to host A (from B).
    A,
    /// Frames going to host B (from A).
    B,
}

impl Toward {
    /// True if the direction towards B (`toward_b`) or towards A (`!toward_b`) is included.
    pub fn includes(self, toward_b: bool) -> bool {
        match self {
            Toward::Both => true,
            Toward::A => !toward_b,
            Toward::B => toward_b,
        }
    }
}

/// When an impairment begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Start {
    /// From the relay's first frame.
    #[default]
    Now,
    /// Once this long has passed since the relay started.
    After(Duration),
    /// In a direction, once the relay has received this many TCP payload octets in it
    /// (retransmissions included; [`DirStats::payload_in`]).
    AfterBytes(u64),
}

/// A path MTU drop: from `start` on, IPv4 packets longer than `mtu` are dropped and, with DF
/// set, answered with an ICMP "fragmentation needed" from `router` (see the module
/// documentation, step 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathMtu {
    /// The new path MTU (largest IPv4 packet forwarded), carried as the ICMP's next-hop MTU.
    pub mtu: u16,
    /// When the drop begins (both directions).
    pub start: Start,
    /// Source address of the ICMP messages: the router whose next hop is too small. The relay
    /// has no address of its own; Linux accepts any unicast source.
    pub router: Ipv4Addr,
}

impl PathMtu {
    /// A drop to `mtu` from `start`, ICMP from [`ROUTER`].
    pub fn new(mtu: u16, start: Start) -> PathMtu {
        PathMtu {
            mtu,
            start,
            router: ROUTER,
        }
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            netns: None,
            dev_a: String::new(),
            dev_b: String::new(),
            seed: 1,
            loss: 0.0,
            reorder: 0.0,
            reorder_frames: 8,
            reorder_delay: Duration::from_millis(2),
            resegment: false,
            hold: Duration::from_micros(300),
            mss_clamp: None,
            mtu: 1500,
            duplicate: 0.0,
            corrupt: 0.0,
            corrupt_bits: 1,
            corrupt_toward: Toward::Both,
            corrupt_start: Start::Now,
            corrupt_max: u64::MAX,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            path_mtu: None,
            lifetime: Duration::from_secs(600),
        }
    }
}

/// Counters of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirStats {
    /// Frames received.
    pub frames_in: u64,
    /// Frames sent.
    pub frames_out: u64,
    /// Frames forwarded untouched because they are not IPv4 TCP.
    pub other: u64,
    /// TCP segments received.
    pub tcp_in: u64,
    /// TCP segments with payload received.
    pub data_in: u64,
    /// TCP segments dropped.
    pub dropped: u64,
    /// TCP segments held back and sent after later ones (a held segment no other frame
    /// passed before its deadline is not counted: it was only delayed).
    pub reordered: u64,
    /// Data segments built by re-segmentation.
    pub pieces: u64,
    /// Of those, pieces that start inside a segment the sender sent (not at its first octet).
    pub unaligned_pieces: u64,
    /// SYNs whose MSS option was lowered.
    pub mss_clamped: u64,
    /// TCP payload octets received (retransmissions included).
    pub payload_in: u64,
    /// TCP segments sent twice.
    pub duplicated: u64,
    /// Data segments forwarded with payload bits flipped and checksums recomputed.
    pub corrupted: u64,
    /// Payload bits flipped in those.
    pub corrupted_bits: u64,
    /// Frames that went through the delay line (delay or jitter set).
    pub delayed: u64,
    /// Of those, frames that left it after a frame that entered it later (jitter overtook
    /// them).
    pub jitter_reordered: u64,
    /// IPv4 packets dropped for being longer than the path MTU.
    pub mtu_dropped: u64,
    /// ICMP "fragmentation needed" messages sent back to the sender of this direction.
    pub icmp_sent: u64,
    /// Frames the relay had to send on (ICMP replies included) that were refused: a full
    /// queue (`EAGAIN`, `ENOBUFS`), lost as a full switch port loses them, or a link going
    /// away with the bed (`ENXIO`, `ENETDOWN`).
    pub tx_refused: u64,
    /// Frames received longer than the relay's buffer (64 KiB), not forwarded.
    pub rx_truncated: u64,
    /// Frames the kernel dropped before the relay read them (its receive buffer full:
    /// `PACKET_STATISTICS`' `tp_drops`), lost as a full switch port loses them.
    pub rx_dropped: u64,
}

/// Counters of both directions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// From A to B.
    pub a_to_b: DirStats,
    /// From B to A.
    pub b_to_a: DirStats,
}

/// A running relay (see the module documentation).
pub struct Relay {
    stop: Arc<AtomicBool>,
    /// The counters as the relay thread last published them.
    live: Arc<Mutex<RelayStats>>,
    thread: Option<JoinHandle<Result<RelayStats, RelayError>>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").finish_non_exhaustive()
    }
}

impl Relay {
    /// Opens the relay's sockets (in `cfg.netns`) and starts forwarding. Needs root.
    pub fn start(cfg: RelayConfig) -> Result<Relay, RelayError> {
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Mutex::new(RelayStats::default()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let flag = stop.clone();
        let published = live.clone();
        let thread = std::thread::Builder::new()
            .name("iwarp-relay".into())
            .spawn(move || {
                let opened = (|| -> Result<(PacketSocket, PacketSocket), RelayError> {
                    if let Some(ns) = &cfg.netns {
                        crate::enter_ns(ns).map_err(io_err(format!("netns {ns}")))?;
                    }
                    let a = PacketSocket::open(&cfg.dev_a)?;
                    let b = PacketSocket::open(&cfg.dev_b)?;
                    Ok((a, b))
                })();
                let (a, b) = match opened {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let text = e.to_string();
                        let _ = ready_tx.send(Err(e));
                        return Err(RelayError::Thread(text));
                    }
                };
                run(cfg, a, b, &flag, &published)
            })
            .map_err(io_err("spawning the relay thread"))?;
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(Relay {
                stop,
                live,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                // Should it open its sockets later, it must not forward unseen.
                stop.store(true, Ordering::Relaxed);
                Err(RelayError::Thread("did not start".into()))
            }
        }
    }

    /// The counters so far (the relay thread publishes them after each round of frames it
    /// handled; what it is handling now is not in them yet).
    pub fn stats(&self) -> RelayStats {
        match self.live.lock() {
            Ok(s) => *s,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    /// Whether the relay thread has ended (an error stopped it; [`Relay::stop`] tells which).
    pub fn has_ended(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stops forwarding and returns the counters.
    pub fn stop(mut self) -> Result<RelayStats, RelayError> {
        self.finish()
    }

    fn finish(&mut self) -> Result<RelayStats, RelayError> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| RelayError::Thread("panicked".into()))?,
            None => Err(RelayError::Thread("already stopped".into())),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.finish();
        }
    }
}

/// A non-blocking `AF_PACKET` raw socket bound to one interface, promiscuous, that does not
/// see its own transmissions.
struct PacketSocket {
    fd: OwnedFd,
}

fn setsockopt_int(fd: &OwnedFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: passes a pointer to a live i32 and its size; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl PacketSocket {
    fn open(dev: &str) -> Result<PacketSocket, RelayError> {
        let name = CString::new(dev).map_err(|_| RelayError::Thread(format!("bad name {dev}")))?;
        // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io_err(format!("interface {dev}"))(
                io::Error::last_os_error(),
            ));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // Protocol 0: the socket receives nothing until `bind` names the interface and the
        // protocol (with ETH_P_ALL here it would take frames of every interface until then).
        // SAFETY: plain socket(2) call; the result is checked before use.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(io_err("AF_PACKET socket (root needed)")(
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let what = format!("AF_PACKET socket on {dev}");
        setsockopt_int(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)
            .map_err(io_err(what.clone()))?;
        setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20)
            .map_err(io_err(what.clone()))?;
        setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 8 << 20)
            .map_err(io_err(what.clone()))?;
        // SAFETY: an all-zero sockaddr_ll is a valid value of the type.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll and its size is passed with it.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io_err(what)(io::Error::last_os_error()));
        }
        // SAFETY: an all-zero packet_mreq is a valid value of the type.
        let mut mreq: libc::packet_mreq = unsafe { std::mem::zeroed() };
        mreq.mr_ifindex = ifindex as i32;
        mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
        // SAFETY: passes a pointer to a live packet_mreq and its size; the kernel only reads it.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                (&mreq as *const libc::packet_mreq).cast(),
                std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io_err(format!("promiscuous {dev}"))(
                io::Error::last_os_error(),
            ));
        }
        Ok(PacketSocket { fd })
    }

    /// One frame into `buf`, or `None` when none is waiting.
    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the duration of the call.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(n as usize))
    }

    /// Frames the kernel dropped for this socket since the last call (a full receive buffer);
    /// reading `PACKET_STATISTICS` resets the kernel's counters.
    fn take_drops(&self) -> io::Result<u64> {
        // SAFETY: an all-zero tpacket_stats is a valid value of the type.
        let mut st: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `st` is valid for writes of `len` bytes and `len` is live for the call.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(u64::from(st.tp_drops))
    }

    /// Sends one frame; a full queue drops it (as a switch would), reported as `false`.
    fn send(&self, frame: &[u8]) -> io::Result<bool> {
        // SAFETY: `frame` is valid for reads of `frame.len()` bytes for the duration of the call.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if send_refused(&e) { Ok(false) } else { Err(e) };
        }
        Ok(true)
    }
}

/// Whether a failed send lost the frame the way a full or vanished link does, rather than
/// failing the relay: a full send buffer (`EAGAIN`), a full receiver (veth's peer queue or
/// XDP ring: `NET_XMIT_DROP`, which `AF_PACKET` reports as `ENOBUFS`), or the peer end gone
/// (namespace deleted: the bed is going away).
fn send_refused(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
        || matches!(
            e.raw_os_error(),
            Some(libc::ENOBUFS | libc::ENXIO | libc::ENETDOWN)
        )
}

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi].
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.next() % span,
            None => self.next(), // the whole of u64
        }
    }
}

const ETH_LEN: usize = ETHERNET_HEADER_LEN;
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;

/// The parsed offsets of an IPv4 TCP frame.
#[derive(Debug, Clone, Copy)]
struct Tcp {
    /// Offset of the TCP header.
    tcp: usize,
    /// Offset of the payload.
    payload: usize,
    /// End of the IPv4 packet (frames may carry Ethernet padding after it).
    end: usize,
    seq: u32,
    flags: u8,
    ports: (u16, u16),
}

/// The offsets of an Ethernet/IPv4/TCP frame whose lengths check out (its checksums are not
/// verified: the relay forwards what it gets, as a switch would). Fragments are not TCP here
/// (our senders set DF and never fragment).
fn parse_tcp(f: &[u8]) -> Option<Tcp> {
    let eth = EthernetFrame::new_checked(f).ok()?;
    if eth.ethertype() != ETHERTYPE_IPV4 {
        return None;
    }
    let v = Ipv4TcpView::new_unverified(eth.payload()).ok()?;
    let tcp = ETH_LEN + v.ip_header_len();
    Some(Tcp {
        tcp,
        payload: tcp + v.tcp_header_len(),
        end: ETH_LEN + v.packet().len(),
        seq: v.tcp().sequence_number(),
        flags: v.control_bits(),
        ports: (v.tcp().source_port(), v.tcp().destination_port()),
    })
}

/// Rewrites the IPv4 header checksum and the TCP checksum of a frame parsed as `t`.
fn fix_checksums(f: &mut [u8], t: &Tcp) {
    let filled = wire::fill_checksums(&mut f[ETH_LEN..t.end]);
    debug_assert_eq!(filled, Ok(t.end - ETH_LEN), "a frame parse_tcp accepted");
}

/// Lowers the MSS option of a SYN to `clamp`; true if it changed.
fn clamp_mss(f: &mut [u8], t: &Tcp, clamp: u16) -> bool {
    let mut i = t.tcp + 20;
    while i < t.payload {
        match f[i] {
            0 => break,
            1 => i += 1,
            kind => {
                let Some(&len) = f.get(i + 1) else { break };
                let len = usize::from(len);
                if len < 2 || i + len > t.payload {
                    break;
                }
                if kind == 2 && len == 4 {
                    let mss = u16::from_be_bytes([f[i + 2], f[i + 3]]);
                    if mss > clamp {
                        f[i + 2..i + 4].copy_from_slice(&clamp.to_be_bytes());
                        return true;
                    }
                    return false;
                }
                i += len;
            }
        }
    }
    false
}

/// Data gathered for re-cutting: the newest segment's headers, and the contiguous payload.
struct Gathered {
    /// Ethernet + IPv4 + TCP headers of the newest segment.
    headers: Vec<u8>,
    t: Tcp,
    seq: u32,
    data: Vec<u8>,
    /// Offsets into `data` where a sender's segment started.
    starts: Vec<usize>,
    fin: bool,
    since: Instant,
}

struct Held {
    frame: Vec<u8>,
    after: u32,
    deadline: Instant,
    /// A frame was sent on after this one was held (it is reordered, not only delayed).
    passed: bool,
}

/// A frame in the delay line: it leaves at `at`; `order` numbers the frames as they entered.
struct Delayed {
    at: Instant,
    order: u64,
    frame: Vec<u8>,
}

impl PartialEq for Delayed {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Delayed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// The generators of one direction's own impairments (see the module documentation).
struct Streams {
    duplicate: Rng,
    corrupt: Rng,
    jitter: Rng,
}

impl Streams {
    fn new(seed: u64, toward_b: bool) -> Streams {
        let dir: u64 = if toward_b { 0x100 } else { 0x200 };
        Streams {
            duplicate: Rng::new(seed ^ (dir + 1).rotate_left(40)),
            corrupt: Rng::new(seed ^ (dir + 2).rotate_left(40)),
            jitter: Rng::new(seed ^ (dir + 3).rotate_left(40)),
        }
    }
}

struct Direction {
    /// True for frames from A to B.
    toward_b: bool,
    /// Frames ready to go out, in order.
    outbox: Vec<Vec<u8>>,
    /// Frames to send back where this direction's frames come from (ICMP).
    replies: Vec<Vec<u8>>,
    gathered: Option<Gathered>,
    held: Vec<Held>,
    /// The delay line, earliest departure first.
    delayed: BinaryHeap<Reverse<Delayed>>,
    /// Frames that entered the delay line so far.
    delay_order: u64,
    /// Highest `order` that left the delay line so far (plus one; 0: none yet).
    delay_left: u64,
    streams: Streams,
    stats: DirStats,
    ip_id: u16,
}

struct Ctx<'a> {
    cfg: &'a RelayConfig,
    rng: Rng,
    /// When the relay started ([`Start::After`]).
    started: Instant,
}

impl Direction {
    fn new(seed: u64, toward_b: bool) -> Direction {
        Direction {
            toward_b,
            outbox: Vec::new(),
            replies: Vec::new(),
            gathered: None,
            held: Vec::new(),
            delayed: BinaryHeap::new(),
            delay_order: 0,
            delay_left: 0,
            streams: Streams::new(seed, toward_b),
            stats: DirStats::default(),
            ip_id: 0,
        }
    }

    /// True once `start` has come for this direction.
    fn begun(&self, start: Start, ctx: &Ctx<'_>, now: Instant) -> bool {
        match start {
            Start::Now => true,
            Start::After(d) => now.saturating_duration_since(ctx.started) >= d,
            Start::AfterBytes(n) => self.stats.payload_in >= n,
        }
    }

    fn take_frame(&mut self, ctx: &mut Ctx<'_>, frame: &mut [u8], now: Instant) -> io::Result<()> {
        self.stats.frames_in += 1;
        let Some(t) = parse_tcp(frame) else {
            self.stats.other += 1;
            self.emit(ctx, frame.to_vec(), now);
            return Ok(());
        };
        self.stats.tcp_in += 1;
        let frame = &mut frame[..t.end];
        let has_data = t.end > t.payload;
        if has_data {
            self.stats.data_in += 1;
            self.stats.payload_in += (t.end - t.payload) as u64;
        }
        if t.flags & SYN != 0 {
            if let Some(clamp) = ctx.cfg.mss_clamp {
                if clamp_mss(frame, &t, clamp) {
                    fix_checksums(frame, &t);
                    self.stats.mss_clamped += 1;
                }
            }
        }
        if ctx.cfg.resegment && has_data && t.flags & (SYN | RST) == 0 {
            return self.gather(ctx, frame, t, now);
        }
        if t.flags & (FIN | RST) != 0 {
            self.flush(ctx, now)?;
        }
        self.impair(ctx, frame.to_vec(), now)
    }

    fn gather(&mut self, ctx: &mut Ctx<'_>, frame: &[u8], t: Tcp, now: Instant) -> io::Result<()> {
        let contiguous = self.gathered.as_ref().is_some_and(|g| {
            !g.fin && g.t.ports == t.ports && g.seq.wrapping_add(g.data.len() as u32) == t.seq
        });
        if !contiguous {
            self.flush(ctx, now)?;
        }
        let payload = &frame[t.payload..t.end];
        match &mut self.gathered {
            Some(g) => {
                g.headers.clear();
                g.headers.extend_from_slice(&frame[..t.payload]);
                g.t = t;
                g.starts.push(g.data.len());
                g.data.extend_from_slice(payload);
                g.fin = t.flags & FIN != 0;
            }
            None => {
                self.gathered = Some(Gathered {
                    headers: frame[..t.payload].to_vec(),
                    t,
                    seq: t.seq,
                    data: payload.to_vec(),
                    starts: vec![0],
                    fin: t.flags & FIN != 0,
                    since: now,
                });
            }
        }
        // Cut pieces at random sizes while more than a full segment is gathered.
        while let Some(g) = &self.gathered {
            let max = self.max_payload(ctx, g, now);
            if g.data.len() <= max {
                break;
            }
            let n = ctx.rng.range(max as u64 / 2, max as u64).max(1) as usize;
            self.cut(ctx, n, now)?;
        }
        if self.gathered.as_ref().is_some_and(|g| g.fin) {
            self.flush(ctx, now)?;
        }
        Ok(())
    }

    /// The most payload a re-cut segment carries: what the link's MTU holds, or the path
    /// MTU's once it has dropped (a re-segmenting middlebox knows its own way out; segments
    /// the senders sent too large still meet the drop and its ICMP).
    fn max_payload(&self, ctx: &Ctx<'_>, g: &Gathered, now: Instant) -> usize {
        let mtu = match ctx.cfg.path_mtu {
            Some(p) if self.begun(p.start, ctx, now) => ctx.cfg.mtu.min(usize::from(p.mtu)),
            _ => ctx.cfg.mtu,
        };
        mtu.saturating_sub(g.t.payload - ETH_LEN).max(1)
    }

    /// Sends the first `n` gathered octets as one segment.
    fn cut(&mut self, ctx: &mut Ctx<'_>, n: usize, now: Instant) -> io::Result<()> {
        let Some(g) = &mut self.gathered else {
            return Ok(());
        };
        let n = n.min(g.data.len());
        let last = n == g.data.len();
        let aligned = g.starts.first() == Some(&0);
        let mut f = Vec::with_capacity(g.headers.len() + n);
        f.extend_from_slice(&g.headers);
        f.extend_from_slice(&g.data[..n]);
        let t = Tcp {
            end: f.len(),
            seq: g.seq,
            ..g.t
        };
        let ip_total = (f.len() - ETH_LEN) as u16;
        f[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&ip_total.to_be_bytes());
        self.ip_id = self.ip_id.wrapping_add(1);
        f[ETH_LEN + 4..ETH_LEN + 6].copy_from_slice(&self.ip_id.to_be_bytes());
        f[t.tcp + 4..t.tcp + 8].copy_from_slice(&g.seq.to_be_bytes());
        let mut flags = g.t.flags & !(FIN | PSH);
        if last {
            flags |= g.t.flags & (FIN | PSH);
        }
        f[t.tcp + 13] = flags;
        fix_checksums(&mut f, &t);
        self.stats.pieces += 1;
        if !aligned {
            self.stats.unaligned_pieces += 1;
        }
        if last {
            self.gathered = None;
        } else {
            g.data.drain(..n);
            g.seq = g.seq.wrapping_add(n as u32);
            g.starts.retain(|&s| s >= n);
            for s in &mut g.starts {
                *s -= n;
            }
        }
        self.impair(ctx, f, now)
    }

    /// Sends everything gathered (one segment: it fits, see `gather`).
    fn flush(&mut self, ctx: &mut Ctx<'_>, now: Instant) -> io::Result<()> {
        if let Some(n) = self.gathered.as_ref().map(|g| g.data.len()) {
            self.cut(ctx, n, now)?;
        }
        Ok(())
    }

    fn impair(&mut self, ctx: &mut Ctx<'_>, mut frame: Vec<u8>, now: Instant) -> io::Result<()> {
        let x = ctx.rng.unit();
        if x < ctx.cfg.loss {
            self.stats.dropped += 1;
            return Ok(());
        }
        self.corrupt(ctx, &mut frame, now);
        let copy = (ctx.cfg.duplicate > 0.0 && self.streams.duplicate.unit() < ctx.cfg.duplicate)
            .then(|| frame.clone());
        if x < ctx.cfg.loss + ctx.cfg.reorder {
            if let Some(copy) = copy {
                self.stats.duplicated += 1;
                self.pass(ctx, copy, now);
            }
            // Held after its own copy went: that copy is not a later frame overtaking it.
            let after = ctx.rng.range(1, u64::from(ctx.cfg.reorder_frames.max(1))) as u32;
            self.held.push(Held {
                frame,
                after,
                deadline: now + ctx.cfg.reorder_delay,
                passed: false,
            });
        } else {
            self.pass(ctx, frame, now);
            if let Some(copy) = copy {
                self.stats.duplicated += 1;
                self.pass(ctx, copy, now);
            }
        }
        Ok(())
    }

    /// Sends a frame on, and the held frames that enough frames have now passed (in the order
    /// they were held).
    fn pass(&mut self, ctx: &mut Ctx<'_>, frame: Vec<u8>, now: Instant) {
        let sent = self.emit(ctx, frame, now);
        let mut i = 0;
        while i < self.held.len() {
            self.held[i].after -= 1;
            self.held[i].passed |= sent;
            if self.held[i].after == 0 {
                let h = self.held.remove(i);
                let sent = self.emit(ctx, h.frame, now);
                self.stats.reordered += u64::from(h.passed && sent);
            } else {
                i += 1;
            }
        }
    }

    /// Flips 1..=`corrupt_bits` distinct payload bits of a data segment, if this one is to be
    /// corrupted, and recomputes its checksums.
    fn corrupt(&mut self, ctx: &mut Ctx<'_>, frame: &mut [u8], now: Instant) {
        let cfg = ctx.cfg;
        if cfg.corrupt <= 0.0
            || self.stats.corrupted >= cfg.corrupt_max
            || !cfg.corrupt_toward.includes(self.toward_b)
            || !self.begun(cfg.corrupt_start, ctx, now)
        {
            return;
        }
        let Some(t) = parse_tcp(frame) else { return };
        if t.end <= t.payload || t.flags & (SYN | RST) != 0 {
            return;
        }
        let rng = &mut self.streams.corrupt;
        if rng.unit() >= cfg.corrupt {
            return;
        }
        let payload = &mut frame[t.payload..t.end];
        let bits = payload.len() as u64 * 8;
        let want = rng.range(1, u64::from(cfg.corrupt_bits.max(1)).min(bits));
        let mut flipped: Vec<u64> = Vec::with_capacity(want as usize);
        // Distinct bits: a bit drawn twice is drawn again (a bounded number of times; a
        // flip undone by a second one would leave the segment intact).
        for _ in 0..want * 16 {
            if flipped.len() as u64 == want {
                break;
            }
            let bit = rng.range(0, bits - 1);
            if !flipped.contains(&bit) {
                flipped.push(bit);
                payload[(bit / 8) as usize] ^= 0x80 >> (bit % 8);
            }
        }
        fix_checksums(frame, &t);
        self.stats.corrupted += 1;
        self.stats.corrupted_bits += flipped.len() as u64;
    }

    /// Hands a frame to the path after the relay: the path MTU, then the delay line; false if
    /// the path MTU dropped it.
    fn emit(&mut self, ctx: &mut Ctx<'_>, frame: Vec<u8>, now: Instant) -> bool {
        if let Some(p) = ctx.cfg.path_mtu {
            if self.begun(p.start, ctx, now) {
                if let Some(ip) = parse_ipv4(&frame) {
                    if ip.total > usize::from(p.mtu) {
                        self.stats.mtu_dropped += 1;
                        self.ip_id = self.ip_id.wrapping_add(1);
                        if let Some(icmp) = frag_needed(&frame, p.mtu, p.router, self.ip_id) {
                            self.stats.icmp_sent += 1;
                            self.replies.push(icmp);
                        }
                        return false;
                    }
                }
            }
        }
        let (delay, jitter) = (ctx.cfg.delay, ctx.cfg.jitter);
        if delay.is_zero() && jitter.is_zero() {
            self.outbox.push(frame);
            return true;
        }
        let extra = if jitter.is_zero() {
            Duration::ZERO
        } else {
            let ns = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
            Duration::from_nanos(self.streams.jitter.range(0, ns))
        };
        self.stats.delayed += 1;
        self.delayed.push(Reverse(Delayed {
            at: now + delay + extra,
            order: self.delay_order,
            frame,
        }));
        self.delay_order += 1;
        true
    }

    /// Time-driven work: gathered data held too long, held-back frames due, delayed frames
    /// due.
    fn timers(&mut self, ctx: &mut Ctx<'_>, now: Instant) -> io::Result<()> {
        if self
            .gathered
            .as_ref()
            .is_some_and(|g| now.duration_since(g.since) >= ctx.cfg.hold)
        {
            self.flush(ctx, now)?;
        }
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].deadline <= now {
                let h = self.held.remove(i);
                let sent = self.emit(ctx, h.frame, now);
                self.stats.reordered += u64::from(h.passed && sent);
            } else {
                i += 1;
            }
        }
        while self.delayed.peek().is_some_and(|d| d.0.at <= now) {
            let Some(Reverse(d)) = self.delayed.pop() else {
                break;
            };
            if d.order < self.delay_left {
                self.stats.jitter_reordered += 1;
            } else {
                self.delay_left = d.order + 1;
            }
            self.outbox.push(d.frame);
        }
        Ok(())
    }

    fn next_deadline(&self, hold: Duration) -> Option<Instant> {
        let g = self.gathered.as_ref().map(|g| g.since + hold);
        let h = self.held.iter().map(|h| h.deadline).min();
        let d = self.delayed.peek().map(|d| d.0.at);
        [g, h, d].into_iter().flatten().min()
    }
}

/// The fields of an IPv4 packet the path MTU drop looks at.
#[derive(Debug, Clone, Copy)]
struct Ipv4Info {
    /// IPv4 header length.
    header_len: usize,
    /// IPv4 total length.
    total: usize,
    /// Don't Fragment set.
    df: bool,
    /// Fragment offset (in 8-octet units).
    frag_offset: u16,
    protocol: u8,
    src: [u8; 4],
}

/// The IPv4 header of an Ethernet frame, if it is IPv4 and its lengths fit the frame.
fn parse_ipv4(f: &[u8]) -> Option<Ipv4Info> {
    let eth = EthernetFrame::new_checked(f).ok()?;
    if eth.ethertype() != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = eth.payload();
    let (&vihl, _) = ip.split_first()?;
    let header_len = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || header_len < 20 || ip.len() < header_len {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if total < header_len || total > ip.len() {
        return None;
    }
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    Some(Ipv4Info {
        header_len,
        total,
        df: frag & 0x4000 != 0,
        frag_offset: frag & 0x1fff,
        protocol: ip[9],
        src: [ip[12], ip[13], ip[14], ip[15]],
    })
}

/// ICMP type "destination unreachable" (RFC 792).
const ICMP_DEST_UNREACHABLE: u8 = 3;
/// ICMP code "fragmentation needed and DF set" (RFC 792).
const ICMP_FRAG_NEEDED: u8 = 4;
const IP_PROTOCOL_ICMP: u8 = 1;

/// The ICMP "fragmentation needed and DF set" a router sends back for `frame`, an IPv4 packet
/// it cannot forward to a next hop of `mtu` (RFC 792; RFC 1191 section 4: the next-hop MTU in
/// the low 16 bits of the second word): an Ethernet frame to the packet's source MAC (from its
/// destination MAC), an IPv4 packet from `router` to the packet's source (identification
/// `ip_id`), the ICMP message carrying the packet's IPv4 header and its first 8 payload
/// octets. `None` when no ICMP may be sent (RFC 1122 3.2.2, RFC 1812 4.3.2.7): not IPv4, DF
/// clear (a router would fragment), not the first fragment, or itself ICMP (never an error
/// about an error; the bed carries no other ICMP).
fn frag_needed(frame: &[u8], mtu: u16, router: Ipv4Addr, ip_id: u16) -> Option<Vec<u8>> {
    let ip = parse_ipv4(frame)?;
    if !ip.df || ip.frag_offset != 0 || ip.protocol == IP_PROTOCOL_ICMP {
        return None;
    }
    let quoted = &frame[ETH_LEN..ETH_LEN + (ip.header_len + 8).min(ip.total)];
    let icmp_len = 8 + quoted.len();
    let total = 20 + icmp_len;
    let mut f = vec![0u8; ETH_LEN + total];
    // Ethernet: back to the sender.
    f[0..6].copy_from_slice(&frame[6..12]);
    f[6..12].copy_from_slice(&frame[0..6]);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    // IPv4.
    let h = ETH_LEN;
    f[h] = 0x45;
    f[h + 2..h + 4].copy_from_slice(&(total as u16).to_be_bytes());
    f[h + 4..h + 6].copy_from_slice(&ip_id.to_be_bytes());
    f[h + 8] = 64;
    f[h + 9] = IP_PROTOCOL_ICMP;
    f[h + 12..h + 16].copy_from_slice(&router.octets());
    f[h + 16..h + 20].copy_from_slice(&ip.src);
    let sum = Checksum::new().add_bytes(&f[h..h + 20]).finish();
    f[h + 10..h + 12].copy_from_slice(&sum.to_be_bytes());
    // ICMP.
    let m = h + 20;
    f[m] = ICMP_DEST_UNREACHABLE;
    f[m + 1] = ICMP_FRAG_NEEDED;
    f[m + 6..m + 8].copy_from_slice(&mtu.to_be_bytes());
    f[m + 8..].copy_from_slice(quoted);
    let sum = Checksum::new().add_bytes(&f[m..]).finish();
    f[m + 2..m + 4].copy_from_slice(&sum.to_be_bytes());
    Some(f)
}

fn run(
    cfg: RelayConfig,
    a: PacketSocket,
    b: PacketSocket,
    stop: &AtomicBool,
    live: &Mutex<RelayStats>,
) -> Result<RelayStats, RelayError> {
    let started = Instant::now();
    let a_fd = a.fd.as_raw_fd();
    let b_fd = b.fd.as_raw_fd();
    // Frames read on A's side go out on B's, and the other way round; replies (ICMP) go back
    // out where their direction's frames come from.
    let (a_rx, b_rx) = (a, b);
    let mut dirs = [
        Direction::new(cfg.seed, true),
        Direction::new(cfg.seed, false),
    ];
    let rx = [&a_rx, &b_rx];
    let tx = [&b_rx, &a_rx];
    let mut ctx = Ctx {
        cfg: &cfg,
        rng: Rng::new(cfg.seed),
        started,
    };
    let mut buf = vec![0u8; 1 << 16];
    let stats = |dirs: &[Direction; 2]| RelayStats {
        a_to_b: dirs[0].stats,
        b_to_a: dirs[1].stats,
    };
    let res = (|| -> io::Result<()> {
        while !stop.load(Ordering::Relaxed) && started.elapsed() < cfg.lifetime {
            let mut any = false;
            for (i, sock) in rx.iter().enumerate() {
                // A bounded batch per side, so one busy direction cannot starve the other.
                for _ in 0..64 {
                    let Some(n) = sock.recv(&mut buf)? else { break };
                    any = true;
                    if n > buf.len() {
                        dirs[i].stats.rx_truncated += 1; // larger than any frame of the bed
                        continue;
                    }
                    dirs[i].take_frame(&mut ctx, &mut buf[..n], Instant::now())?;
                }
            }
            if !any {
                // Between bursts (at least every 20 ms when idle) and at the end.
                for (i, sock) in rx.iter().enumerate() {
                    dirs[i].stats.rx_dropped += sock.take_drops()?;
                }
            }
            let now = Instant::now();
            for (i, d) in dirs.iter_mut().enumerate() {
                d.timers(&mut ctx, now)?;
                for f in d.outbox.drain(..) {
                    if tx[i].send(&f)? {
                        d.stats.frames_out += 1;
                    } else {
                        d.stats.tx_refused += 1;
                    }
                }
                for f in d.replies.drain(..) {
                    if !rx[i].send(&f)? {
                        d.stats.tx_refused += 1;
                    }
                }
            }
            if let Ok(mut l) = live.lock() {
                *l = stats(&dirs);
            }
            if any {
                continue;
            }
            let next = dirs.iter().filter_map(|d| d.next_deadline(cfg.hold)).min();
            let wait = next
                .map(|t| t.saturating_duration_since(now))
                .unwrap_or(Duration::from_millis(20))
                .min(Duration::from_millis(20));
            let mut fds = [
                libc::pollfd {
                    fd: a_fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: b_fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ts = libc::timespec {
                tv_sec: wait.as_secs() as libc::time_t,
                tv_nsec: libc::c_long::from(wait.subsec_nanos() as i32),
            };
            // SAFETY: `fds` and `ts` are live for the call; a null signal mask is allowed.
            let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
        for (i, sock) in rx.iter().enumerate() {
            dirs[i].stats.rx_dropped += sock.take_drops()?;
        }
        Ok(())
    })();
    res.map_err(io_err("forwarding"))?;
    Ok(stats(&dirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet + IPv4 + TCP frame with `payload`, checksums filled in.
    fn frame(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; ETH_LEN + 20 + 32];
        f[12] = 0x08;
        let ip = ETH_LEN;
        f[ip] = 0x45;
        f[ip + 6] = 0x40; // DF
        f[ip + 8] = 64;
        f[ip + 9] = 6;
        f[ip + 12..ip + 16].copy_from_slice(&[10, 78, 0, 1]);
        f[ip + 16..ip + 20].copy_from_slice(&[10, 78, 0, 2]);
        let tcp = ip + 20;
        f[tcp..tcp + 2].copy_from_slice(&40000u16.to_be_bytes());
        f[tcp + 2..tcp + 4].copy_from_slice(&5000u16.to_be_bytes());
        f[tcp + 4..tcp + 8].copy_from_slice(&seq.to_be_bytes());
        f[tcp + 12] = 8 << 4;
        f[tcp + 13] = flags | 0x10;
        // MSS option, then NOPs and a timestamp-sized filler.
        f[tcp + 20..tcp + 24].copy_from_slice(&[2, 4, 0x05, 0xb4]);
        for b in &mut f[tcp + 24..tcp + 32] {
            *b = 1;
        }
        f.extend_from_slice(payload);
        let total = (f.len() - ETH_LEN) as u16;
        f[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
        let t = parse_tcp(&f).unwrap();
        fix_checksums(&mut f, &t);
        f
    }

    fn checksums_ok(f: &[u8]) -> bool {
        Ipv4TcpView::new_checked(&f[ETH_LEN..]).is_ok()
    }

    #[test]
    fn checksums_and_mss_clamp() {
        let mut f = frame(7, SYN, b"");
        assert!(checksums_ok(&f));
        let t = parse_tcp(&f).unwrap();
        assert!(clamp_mss(&mut f, &t, 700));
        fix_checksums(&mut f, &t);
        assert!(checksums_ok(&f));
        assert_eq!(u16::from_be_bytes([f[t.tcp + 22], f[t.tcp + 23]]), 700);
        assert!(!clamp_mss(&mut f, &t, 1000), "never raised");
        // Odd payload lengths and Ethernet padding after the IPv4 packet.
        let mut g = frame(9, PSH, b"abc");
        assert!(checksums_ok(&g));
        g.extend_from_slice(&[0xee; 7]);
        let t = parse_tcp(&g).unwrap();
        assert_eq!(&g[t.payload..t.end], b"abc");
    }

    #[test]
    fn resegmenting_keeps_the_stream_and_cuts_inside_segments() {
        let cfg = RelayConfig {
            resegment: true,
            ..RelayConfig::default()
        };
        let mut ctx = Ctx {
            cfg: &cfg,
            rng: Rng::new(3),
            started: Instant::now(),
        };
        let mut d = Direction::new(3, true);
        let now = Instant::now();
        let stream: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 1) as u8).collect();
        let mut at = 0;
        let mut seg = 0;
        while at < stream.len() {
            let n = (300 + seg * 137 % 900).min(stream.len() - at);
            let fin = if at + n == stream.len() { FIN } else { 0 };
            let mut f = frame(1000 + at as u32, PSH | fin, &stream[at..at + n]);
            d.take_frame(&mut ctx, &mut f, now).unwrap();
            at += n;
            seg += 1;
        }
        d.timers(&mut ctx, now + Duration::from_secs(1)).unwrap();
        let mut got = Vec::new();
        let mut next = 1000u32;
        for f in &d.outbox {
            assert!(checksums_ok(f));
            assert!(f.len() - ETH_LEN <= cfg.mtu);
            let t = parse_tcp(f).unwrap();
            assert_eq!(t.seq, next);
            next += (t.end - t.payload) as u32;
            got.extend_from_slice(&f[t.payload..t.end]);
        }
        assert_eq!(got, stream);
        let last = parse_tcp(d.outbox.last().unwrap()).unwrap();
        assert_eq!(last.flags & FIN, FIN);
        assert!(
            d.stats.unaligned_pieces > d.stats.pieces / 2,
            "{:?}",
            d.stats
        );
    }

    fn ctx(cfg: &RelayConfig) -> Ctx<'_> {
        Ctx {
            cfg,
            rng: Rng::new(cfg.seed),
            started: Instant::now(),
        }
    }

    /// Feeds `frames` to a fresh direction (towards B if `toward_b`, else towards A) and runs
    /// its timers `after` later; returns it.
    fn feed(cfg: &RelayConfig, toward_b: bool, frames: &[Vec<u8>], after: Duration) -> Direction {
        let mut c = ctx(cfg);
        let mut d = Direction::new(cfg.seed, toward_b);
        let now = c.started;
        for f in frames {
            let mut f = f.clone();
            d.take_frame(&mut c, &mut f, now).unwrap();
        }
        d.timers(&mut c, now + after).unwrap();
        d
    }

    fn data_frames(n: usize, len: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let payload: Vec<u8> = (0..len).map(|j| (i * 31 + j * 7) as u8).collect();
                frame(1000 + (i * len) as u32, PSH, &payload)
            })
            .collect()
    }

    /// A held segment that leaves at its deadline with nothing sent after it was delayed, not
    /// reordered; nor does its own duplicate, sent on at once, overtake it.
    #[test]
    fn held_segments_count_as_reordered_only_when_passed() {
        let held_only = RelayConfig {
            reorder: 1.0,
            ..RelayConfig::default()
        };
        let late = held_only.reorder_delay + Duration::from_millis(1);
        let d = feed(&held_only, true, &data_frames(1, 100), late);
        assert_eq!((d.outbox.len(), d.stats.reordered), (1, 0), "{:?}", d.stats);
        let with_copy = RelayConfig {
            duplicate: 1.0,
            ..held_only.clone()
        };
        let d = feed(&with_copy, true, &data_frames(1, 100), late);
        assert_eq!(d.outbox.len(), 2);
        assert_eq!(
            (d.stats.duplicated, d.stats.reordered),
            (1, 0),
            "{:?}",
            d.stats
        );
        // Held segments some later segment passed are reordered.
        let some = RelayConfig {
            reorder: 0.5,
            ..RelayConfig::default()
        };
        let d = feed(&some, true, &data_frames(200, 100), late);
        assert_eq!(d.outbox.len(), 200);
        assert!(d.stats.reordered > 50, "{:?}", d.stats);
    }

    /// Held segments due together leave in the order they were held (they were swapped out
    /// of order), and, nothing having passed them, none counts as reordered.
    #[test]
    fn held_segments_due_together_leave_in_order() {
        let cfg = RelayConfig {
            reorder: 1.0,
            ..RelayConfig::default()
        };
        let input = data_frames(5, 100);
        let d = feed(
            &cfg,
            true,
            &input,
            cfg.reorder_delay + Duration::from_millis(1),
        );
        assert_eq!(d.outbox, input);
        assert_eq!(d.stats.reordered, 0, "{:?}", d.stats);
    }

    /// Loss and reordering happen at the configured rates (seeded, within a few standard
    /// deviations of the expectation), and nothing is lost but what is counted as dropped.
    #[test]
    fn loss_and_reordering_follow_their_probabilities() {
        for seed in [1, 2, 3] {
            let cfg = RelayConfig {
                seed,
                loss: 0.05,
                reorder: 0.05,
                ..RelayConfig::default()
            };
            let n = 4000;
            let late = cfg.reorder_delay + Duration::from_millis(1);
            let d = feed(&cfg, true, &data_frames(n, 100), late);
            // Expected 200 each, standard deviation ~14.
            assert!((150..=250).contains(&d.stats.dropped), "{:?}", d.stats);
            assert!((150..=250).contains(&d.stats.reordered), "{:?}", d.stats);
            assert_eq!(d.outbox.len() as u64 + d.stats.dropped, n as u64);
        }
    }

    /// A held frame is overtaken by 1 to `reorder_frames` frames passed on at once, and by
    /// frames held after it and let go first (each released by one of its passes); with
    /// few frames held (3 %) that stays within twice the depth for this seed (a bound of the
    /// seed's draws, not of the relay); the depth is reached; exactly the frames overtaken
    /// count as reordered.
    #[test]
    fn reordering_depth_is_bounded_by_reorder_frames() {
        let k = 4;
        let cfg = RelayConfig {
            reorder: 0.03,
            reorder_frames: k,
            reorder_delay: Duration::from_secs(10),
            ..RelayConfig::default()
        };
        let input = data_frames(3000, 100);
        let d = feed(&cfg, true, &input, Duration::from_secs(11));
        assert_eq!(d.outbox.len(), input.len());
        let index = |f: &Vec<u8>| input.iter().position(|g| g == f).unwrap();
        let order: Vec<usize> = d.outbox.iter().map(index).collect();
        // For each frame, how many frames that came in after it went out before it.
        let overtaken_by: Vec<usize> = order
            .iter()
            .enumerate()
            .map(|(p, &i)| order[..p].iter().filter(|&&j| j > i).count())
            .collect();
        let deepest = overtaken_by.iter().copied().max().unwrap();
        assert!(
            (k as usize..=2 * k as usize).contains(&deepest),
            "deepest {deepest}"
        );
        let overtaken = overtaken_by.iter().filter(|&&c| c > 0).count() as u64;
        assert_eq!(overtaken, d.stats.reordered, "{:?}", d.stats);
    }

    /// A frame the path MTU drops does not pass a held frame: released by it, the held frame
    /// is not counted as reordered; released by a frame that goes on, it is.
    #[test]
    fn a_frame_dropped_by_the_path_mtu_does_not_reorder() {
        let cfg = RelayConfig {
            path_mtu: Some(PathMtu::new(1000, Start::AfterBytes(0))),
            ..RelayConfig::default()
        };
        let small = data_frames(2, 100);
        let large = frame(5000, PSH, &[3; 1400]);
        for (passing, reordered) in [(large, 0), (small[1].clone(), 1)] {
            let mut c = ctx(&cfg);
            let now = c.started;
            let mut d = Direction::new(cfg.seed, true);
            d.held.push(Held {
                frame: small[0].clone(),
                after: 1,
                deadline: now + Duration::from_secs(1),
                passed: false,
            });
            d.pass(&mut c, passing, now);
            assert!(d.held.is_empty());
            assert_eq!(d.outbox.last(), Some(&small[0]));
            assert_eq!(d.stats.reordered, reordered, "{:?}", d.stats);
        }
    }

    /// A full receiver (`ENOBUFS` from veth's full peer queue through AF_PACKET) or send
    /// buffer loses the frame, counted; other errors stop the relay.
    #[test]
    fn a_full_receiver_loses_the_frame_rather_than_the_relay() {
        for errno in [libc::ENOBUFS, libc::EAGAIN, libc::ENXIO, libc::ENETDOWN] {
            assert!(
                send_refused(&io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
        for errno in [libc::EINVAL, libc::EPERM, libc::EBADF, libc::EMSGSIZE] {
            assert!(
                !send_refused(&io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
    }

    #[test]
    fn random_ranges_cover_the_whole_of_u64() {
        let mut rng = Rng::new(7);
        let draws: Vec<u64> = (0..64).map(|_| rng.range(0, u64::MAX)).collect();
        assert!(draws.iter().any(|&x| x > u64::MAX / 2));
        for _ in 0..1000 {
            let x = rng.range(5, 9);
            assert!((5..=9).contains(&x));
        }
        assert_eq!(rng.range(u64::MAX, u64::MAX), u64::MAX);
    }

    fn bits_differing(a: &[u8], b: &[u8]) -> u32 {
        a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum()
    }

    #[test]
    fn corruption_flips_payload_bits_and_recomputes_the_checksums() {
        let cfg = RelayConfig {
            corrupt: 1.0,
            corrupt_bits: 5,
            ..RelayConfig::default()
        };
        let mut input = data_frames(200, 1000);
        input.push(frame(5, SYN, b""));
        input.push(frame(6, 0, b""));
        let d = feed(&cfg, true, &input, Duration::ZERO);
        assert_eq!(d.outbox.len(), input.len());
        let mut bits = 0;
        let mut seen = [false; 6];
        for (sent, got) in input.iter().zip(&d.outbox) {
            assert!(checksums_ok(got), "TCP must accept it");
            let t = parse_tcp(got).unwrap();
            // Headers as sent but for the checksums (IPv4 10..12, TCP 16..18).
            let mut a = sent[..t.payload].to_vec();
            let mut b = got[..t.payload].to_vec();
            for v in [&mut a, &mut b] {
                v[ETH_LEN + 10..ETH_LEN + 12].fill(0);
                v[t.tcp + 16..t.tcp + 18].fill(0);
            }
            assert_eq!(a, b);
            let n = bits_differing(&sent[t.payload..], &got[t.payload..]);
            if t.end == t.payload {
                assert_eq!(n, 0, "no payload, nothing to corrupt");
            } else {
                assert!((1..=5).contains(&n), "{n} bits flipped");
                seen[n as usize] = true;
            }
            bits += u64::from(n);
        }
        assert_eq!(seen, [false, true, true, true, true, true]);
        assert_eq!(d.stats.corrupted, 200);
        assert_eq!(d.stats.corrupted_bits, bits);
    }

    #[test]
    fn corruption_keeps_to_its_direction_start_limit_and_seed() {
        let input = data_frames(100, 500);
        let cfg = RelayConfig {
            corrupt: 0.5,
            corrupt_bits: 3,
            corrupt_toward: Toward::A,
            corrupt_start: Start::AfterBytes(10 * 500),
            corrupt_max: 20,
            ..RelayConfig::default()
        };
        // Towards B: not corrupted.
        let d = feed(&cfg, true, &input, Duration::ZERO);
        assert_eq!(d.outbox, input);
        assert_eq!(d.stats.corrupted, 0);
        // Towards A: not before 5,000 octets arrived (the 10th segment reaches it), 20 at most.
        let d = feed(&cfg, false, &input, Duration::ZERO);
        assert_eq!(d.outbox[..9], input[..9]);
        let hit: Vec<usize> = (0..input.len())
            .filter(|&i| d.outbox[i] != input[i])
            .collect();
        assert_eq!(hit.len(), 20);
        assert_eq!(d.stats.corrupted, 20);
        assert!(hit[0] >= 9 && hit[19] < 99, "{hit:?}");
        // The same seed hits the same segments with the same bits; another seed does not.
        let again = feed(&cfg, false, &input, Duration::ZERO);
        assert_eq!(again.outbox, d.outbox);
        let other = feed(
            &RelayConfig {
                seed: 2,
                ..cfg.clone()
            },
            false,
            &input,
            Duration::ZERO,
        );
        assert_ne!(other.outbox, d.outbox);
    }

    #[test]
    fn duplication_sends_a_copy_right_behind() {
        let input = data_frames(1000, 100);
        let cfg = RelayConfig {
            duplicate: 0.25,
            ..RelayConfig::default()
        };
        let d = feed(&cfg, true, &input, Duration::ZERO);
        let dups = d.stats.duplicated as usize;
        assert!((150..350).contains(&dups), "{dups}");
        assert_eq!(d.outbox.len(), input.len() + dups);
        let mut out = d.outbox.iter().peekable();
        for f in &input {
            assert_eq!(out.next(), Some(f));
            if out.peek() == Some(&f) {
                out.next();
            }
        }
        assert_eq!(out.next(), None);
    }

    #[test]
    fn delay_and_jitter_hold_frames_and_jitter_reorders_them() {
        let input = data_frames(500, 100);
        let cfg = RelayConfig {
            delay: Duration::from_millis(1),
            jitter: Duration::from_millis(2),
            ..RelayConfig::default()
        };
        let mut c = ctx(&cfg);
        let mut d = Direction::new(cfg.seed, true);
        let t0 = c.started;
        for (i, f) in input.iter().enumerate() {
            let mut f = f.clone();
            // One frame every 10 us: 5 ms of frames, far closer together than the jitter.
            d.take_frame(&mut c, &mut f, t0 + Duration::from_micros(10 * i as u64))
                .unwrap();
        }
        assert_eq!(d.stats.delayed, 500);
        d.timers(&mut c, t0 + Duration::from_micros(999)).unwrap();
        assert!(d.outbox.is_empty(), "nothing leaves before the delay");
        assert_eq!(
            d.next_deadline(cfg.hold).map(|t| t >= t0 + cfg.delay),
            Some(true)
        );
        d.timers(&mut c, t0 + Duration::from_millis(9)).unwrap();
        assert_eq!(d.outbox.len(), 500);
        assert!(d.next_deadline(cfg.hold).is_none());
        let mut sorted = d.outbox.clone();
        sorted.sort_by_key(|f| parse_tcp(f).unwrap().seq);
        assert_eq!(sorted, input, "every frame once");
        assert_ne!(d.outbox, input, "jitter reorders");
        assert!(d.stats.jitter_reordered > 100, "{:?}", d.stats);
        // A delay without jitter keeps the order.
        let cfg = RelayConfig {
            delay: Duration::from_millis(1),
            ..RelayConfig::default()
        };
        let d = feed(&cfg, true, &input, Duration::from_millis(2));
        assert_eq!(d.outbox, input);
        assert_eq!(d.stats.jitter_reordered, 0);
    }

    /// Checks an ICMP "fragmentation needed" built for `sent` (an Ethernet/IPv4/TCP frame).
    fn check_frag_needed(icmp: &[u8], sent: &[u8], mtu: u16, router: Ipv4Addr) {
        let h = ETH_LEN;
        // Ethernet: to the sender's MAC, from the MAC it sent to.
        assert_eq!(icmp[0..6], sent[6..12]);
        assert_eq!(icmp[6..12], sent[0..6]);
        assert_eq!(icmp[12..14], [0x08, 0x00]);
        // IPv4: a 20-octet header that sums right, ICMP, from the router to the sender.
        let ip = &icmp[h..];
        assert_eq!(ip[0], 0x45);
        assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), ip.len());
        assert_eq!(ip[9], IP_PROTOCOL_ICMP);
        assert_eq!(Checksum::new().add_bytes(&ip[..20]).finish(), 0);
        assert_eq!(ip[12..16], router.octets());
        assert_eq!(ip[16..20], sent[h + 12..h + 16]);
        // ICMP: type 3 code 4, a checksum over the message that sums right, the unused half
        // word zero, the next-hop MTU, the IPv4 header and 8 octets (ports, sequence number).
        let m = &ip[20..];
        assert_eq!((m[0], m[1]), (3, 4));
        assert_eq!(Checksum::new().add_bytes(m).finish(), 0);
        assert_eq!(m[4..6], [0, 0]);
        assert_eq!(u16::from_be_bytes([m[6], m[7]]), mtu);
        assert_eq!(m[8..], sent[h..h + 20 + 8]);
    }

    #[test]
    fn frag_needed_carries_the_mtu_header_and_eight_octets() {
        let mut sent = frame(0x0102_0304, PSH, &[0xab; 1400]);
        sent[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 0xb]);
        sent[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0xa]);
        let router = Ipv4Addr::new(192, 0, 2, 1);
        let icmp = frag_needed(&sent, 1280, router, 7).unwrap();
        assert_eq!(icmp.len(), ETH_LEN + 20 + 8 + 20 + 8);
        check_frag_needed(&icmp, &sent, 1280, router);
        assert_eq!(icmp[ETH_LEN + 4..ETH_LEN + 6], 7u16.to_be_bytes());
        // The quoted TCP header starts with the ports and the sequence number.
        let q = ETH_LEN + 20 + 8 + 20;
        assert_eq!(icmp[q..q + 4], [0x9c, 0x40, 0x13, 0x88]);
        assert_eq!(icmp[q + 4..q + 8], [1, 2, 3, 4]);
        // No ICMP without DF, for later fragments, or about ICMP.
        let mut no_df = sent.clone();
        no_df[ETH_LEN + 6] = 0;
        assert!(frag_needed(&no_df, 1280, router, 7).is_none());
        let mut later = sent.clone();
        later[ETH_LEN + 7] = 1;
        assert!(frag_needed(&later, 1280, router, 7).is_none());
        let mut icmp_pkt = sent.clone();
        icmp_pkt[ETH_LEN + 9] = IP_PROTOCOL_ICMP;
        assert!(frag_needed(&icmp_pkt, 1280, router, 7).is_none());
        // Not IPv4 (ARP), or a total length beyond the frame.
        let mut arp = sent.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(frag_needed(&arp, 1280, router, 7).is_none());
        assert!(frag_needed(&sent[..200], 1280, router, 7).is_none());
    }

    #[test]
    fn path_mtu_drop_answers_large_packets_with_icmp_from_its_start() {
        let cfg = RelayConfig {
            path_mtu: Some(PathMtu::new(1000, Start::AfterBytes(5 * 1400))),
            ..RelayConfig::default()
        };
        let mut input = data_frames(10, 1400);
        input.push(frame(99, 0, b""));
        input.push(frame(100, PSH, &[1; 900]));
        let mut no_df = frame(200, PSH, &[2; 1400]);
        no_df[ETH_LEN + 6] = 0;
        let t = parse_tcp(&no_df).unwrap();
        fix_checksums(&mut no_df, &t);
        input.push(no_df);
        let d = feed(&cfg, true, &input, Duration::ZERO);
        // The first 4 pass; from the 5th (whose octets reach the start) large ones are dropped.
        assert_eq!(d.outbox[..4], input[..4]);
        assert_eq!(d.outbox[4..], input[10..12], "small packets still pass");
        assert_eq!(d.stats.mtu_dropped, 7);
        assert_eq!(d.stats.icmp_sent, 6, "none for the packet without DF");
        assert_eq!(d.replies.len(), 6);
        for (icmp, sent) in d.replies.iter().zip(&input[4..10]) {
            check_frag_needed(icmp, sent, 1000, ROUTER);
        }
        // A start in time.
        let cfg = RelayConfig {
            path_mtu: Some(PathMtu::new(1000, Start::After(Duration::from_secs(5)))),
            ..RelayConfig::default()
        };
        let d = feed(&cfg, true, &input, Duration::ZERO);
        assert_eq!(d.outbox, input);
        let mut c = ctx(&cfg);
        let mut d = Direction::new(1, true);
        let mut f = input[0].clone();
        let later = c.started + Duration::from_secs(5);
        d.take_frame(&mut c, &mut f, later).unwrap();
        assert_eq!((d.outbox.len(), d.replies.len()), (0, 1));
    }

    #[test]
    fn rng_is_seeded() {
        let mut a = Rng::new(5);
        let mut b = Rng::new(5);
        for _ in 0..100 {
            assert_eq!(a.next(), b.next());
        }
        let mut c = Rng::new(5);
        for _ in 0..10_000 {
            let x = c.unit();
            assert!((0.0..1.0).contains(&x));
            let r = c.range(3, 9);
            assert!((3..=9).contains(&r));
        }
    }
}
