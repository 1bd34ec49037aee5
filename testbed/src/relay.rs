//! The relay bed (`scripts/netns-relay.sh`): hosts in namespaces `iwra` and `iwrb`, joined
//! through namespace `iwrr`, where a test relay forwards frames between `rra0` and `rrb0`.
//! Separate from the plain bed (other names, other subnet); it takes the same lock
//! ([`crate::RelayBed`]).
//!
//! The test relay ([`Relay`], also the `iwarp-relay` binary of this crate): an L2 forwarder
//! between two interfaces (the relay namespace) that impairs the TCP traffic it forwards, to
//! put the AF_XDP engine through real loss, reordering and re-segmentation on the test bed.
//!
//! Frames are read and written with `AF_PACKET` sockets (the relay's ends are promiscuous and
//! carry no addresses, so the kernel there only watches). Everything that is not IPv4 TCP (ARP)
//! is forwarded unchanged. TCP segments, per direction:
//!
//! 1. *MSS clamp* (optional): the MSS option of SYNs is lowered, as middleboxes do, so senders
//!    make FPDUs smaller than the segments the relay may build;
//! 2. *Re-segmentation* (optional): the payload of contiguous data segments is gathered (held
//!    for at most [`RelayConfig::hold`]) and cut again at random offsets into segments of up to
//!    the link's MTU, with fresh IPv4 and TCP checksums; FIN, PSH, the newest ACK, window and
//!    options ride on the last piece; out-of-sequence segments (retransmissions) flush what is
//!    gathered and start anew. FPDUs then no longer start segments.
//! 3. *Loss and reordering*: each resulting segment (pure ACKs included) is dropped with
//!    probability [`RelayConfig::loss`], or with [`RelayConfig::reorder`] held back until 1 to
//!    [`RelayConfig::reorder_frames`] later frames of its direction have passed (or
//!    [`RelayConfig::reorder_delay`] has), else forwarded at once.
//!
//! Frames are parsed and checksums rewritten with `tcp_engine::wire` ([`EthernetFrame`],
//! [`Ipv4TcpView`], [`wire::fill_checksums`]), the engine's own frame view and checksum.
//!
//! Decisions come from a seeded generator (xorshift), so a seed gives the same decisions for
//! the same sequence of frames. The relay runs on its own thread until [`Relay::stop`] (or drop)
//! or its `lifetime` ends.

use std::ffi::CString;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tcp_engine::wire::{self, EthernetFrame, Ipv4TcpView, ETHERNET_HEADER_LEN, ETHERTYPE_IPV4};

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
    /// The relay stops by itself after this long.
    pub lifetime: Duration,
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
    /// TCP segments held back and sent after later ones.
    pub reordered: u64,
    /// Data segments built by re-segmentation.
    pub pieces: u64,
    /// Of those, pieces that start inside a segment the sender sent (not at its first octet).
    pub unaligned_pieces: u64,
    /// SYNs whose MSS option was lowered.
    pub mss_clamped: u64,
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
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let flag = stop.clone();
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
                run(cfg, a, b, &flag)
            })
            .map_err(io_err("spawning the relay thread"))?;
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(Relay {
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(RelayError::Thread("did not start".into())),
        }
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
        // SAFETY: plain socket(2) call; the result is checked before use.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(proto),
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
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(false),
                // The peer end went down (namespace deleted): the bed is going away.
                _ if e.raw_os_error() == Some(libc::ENXIO)
                    || e.raw_os_error() == Some(libc::ENETDOWN) =>
                {
                    Ok(false)
                }
                _ => Err(e),
            };
        }
        Ok(true)
    }
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
        lo + self.next() % (hi - lo + 1)
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
}

struct Direction {
    /// Frames ready to go out, in order.
    outbox: Vec<Vec<u8>>,
    gathered: Option<Gathered>,
    held: Vec<Held>,
    stats: DirStats,
    ip_id: u16,
}

struct Ctx<'a> {
    cfg: &'a RelayConfig,
    rng: Rng,
}

impl Direction {
    fn new() -> Direction {
        Direction {
            outbox: Vec::new(),
            gathered: None,
            held: Vec::new(),
            stats: DirStats::default(),
            ip_id: 0,
        }
    }

    fn take_frame(&mut self, ctx: &mut Ctx<'_>, frame: &mut [u8], now: Instant) -> io::Result<()> {
        self.stats.frames_in += 1;
        let Some(t) = parse_tcp(frame) else {
            self.stats.other += 1;
            self.emit(frame.to_vec());
            return Ok(());
        };
        self.stats.tcp_in += 1;
        let frame = &mut frame[..t.end];
        let has_data = t.end > t.payload;
        if has_data {
            self.stats.data_in += 1;
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
            let max = self.max_payload(ctx, g);
            if g.data.len() <= max {
                break;
            }
            let n = ctx.rng.range(max as u64 / 2, max as u64) as usize;
            self.cut(ctx, n, now)?;
        }
        if self.gathered.as_ref().is_some_and(|g| g.fin) {
            self.flush(ctx, now)?;
        }
        Ok(())
    }

    fn max_payload(&self, ctx: &Ctx<'_>, g: &Gathered) -> usize {
        ctx.cfg.mtu.saturating_sub(g.t.payload - ETH_LEN).max(1)
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

    fn impair(&mut self, ctx: &mut Ctx<'_>, frame: Vec<u8>, now: Instant) -> io::Result<()> {
        let x = ctx.rng.unit();
        if x < ctx.cfg.loss {
            self.stats.dropped += 1;
            return Ok(());
        }
        if x < ctx.cfg.loss + ctx.cfg.reorder {
            let after = ctx.rng.range(1, u64::from(ctx.cfg.reorder_frames.max(1))) as u32;
            self.held.push(Held {
                frame,
                after,
                deadline: now + ctx.cfg.reorder_delay,
            });
            return Ok(());
        }
        self.emit(frame);
        // Held frames go out once enough later ones have passed them.
        let mut i = 0;
        while i < self.held.len() {
            self.held[i].after -= 1;
            if self.held[i].after == 0 {
                let h = self.held.swap_remove(i);
                self.stats.reordered += 1;
                self.emit(h.frame);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    fn emit(&mut self, frame: Vec<u8>) {
        self.outbox.push(frame);
    }

    /// Time-driven work: gathered data held too long, held-back frames due.
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
                let h = self.held.swap_remove(i);
                self.stats.reordered += 1;
                self.emit(h.frame);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    fn next_deadline(&self, hold: Duration) -> Option<Instant> {
        let g = self.gathered.as_ref().map(|g| g.since + hold);
        let h = self.held.iter().map(|h| h.deadline).min();
        match (g, h) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

fn run(
    cfg: RelayConfig,
    a: PacketSocket,
    b: PacketSocket,
    stop: &AtomicBool,
) -> Result<RelayStats, RelayError> {
    let started = Instant::now();
    let a_fd = a.fd.as_raw_fd();
    let b_fd = b.fd.as_raw_fd();
    // Frames read on A's side go out on B's, and the other way round.
    let (a_rx, b_rx) = (a, b);
    let mut dirs = [Direction::new(), Direction::new()];
    let rx = [&a_rx, &b_rx];
    let tx = [&b_rx, &a_rx];
    let mut ctx = Ctx {
        cfg: &cfg,
        rng: Rng::new(cfg.seed),
    };
    let mut buf = vec![0u8; 1 << 16];
    let res = (|| -> io::Result<()> {
        while !stop.load(Ordering::Relaxed) && started.elapsed() < cfg.lifetime {
            let mut any = false;
            for (i, sock) in rx.iter().enumerate() {
                // A bounded batch per side, so one busy direction cannot starve the other.
                for _ in 0..64 {
                    let Some(n) = sock.recv(&mut buf)? else { break };
                    any = true;
                    if n > buf.len() {
                        continue; // truncated: larger than any frame of the bed
                    }
                    dirs[i].take_frame(&mut ctx, &mut buf[..n], Instant::now())?;
                }
            }
            let now = Instant::now();
            for (d, out) in dirs.iter_mut().zip(tx) {
                d.timers(&mut ctx, now)?;
                for f in d.outbox.drain(..) {
                    if out.send(&f)? {
                        d.stats.frames_out += 1;
                    }
                }
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
        Ok(())
    })();
    res.map_err(io_err("forwarding"))?;
    Ok(RelayStats {
        a_to_b: dirs[0].stats,
        b_to_a: dirs[1].stats,
    })
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
        };
        let mut d = Direction::new();
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
