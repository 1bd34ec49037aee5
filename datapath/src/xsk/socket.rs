//! One AF_XDP socket with its own UMEM and frame allocator.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use xsk_rs::config::{
    BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig,
};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue, Umem};

use super::capture::CaptureTap;
use super::error::{euid, XskError};
use super::frame_book::FrameBook;
use super::join::{self, PayloadDigest};
use super::netlink;
use crate::probe::{self, Mark};

/// How the socket binds: copy or zero-copy (`XDP_COPY` / `XDP_ZEROCOPY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BindMode {
    /// Let the kernel choose: zero-copy where the driver supports it, copy otherwise.
    #[default]
    Auto,
    /// Force copy mode (works on every interface, the only mode on veth).
    Copy,
    /// Force zero-copy (fails where the driver cannot).
    ZeroCopy,
}

/// Sizes and behaviour of an [`XskSocket`].
///
/// The UMEM holds `rx_ring + tx_ring` frames of `frame_size` bytes: `rx_ring` frames cycle
/// through the fill and RX rings, `tx_ring` frames through the free list, the TX ring and the
/// completion ring. The RX and completion rings are as large as their frame pools; the fill and
/// TX rings are twice as large, because the kernel publishes its consumer position on them only
/// after it has published the frame on the other ring (RX, completion): a frame can come back
/// to us while its old slot still looks taken, so a ring only as large as the pool could look
/// full. Twice the pool never does, so no ring can overflow or refuse a frame.
#[derive(Debug, Clone)]
pub struct XskConfig {
    /// RX ring size and RX frame pool (power of two); the fill ring is twice as large. Default
    /// 512: the frames the kernel copies received packets into (in copy mode, on the CPU of
    /// whoever transmitted them; on veth, the peer's sender) cycle through the whole pool, so a
    /// smaller pool keeps them in cache. The pool is also the burst the socket can take while
    /// its thread is away: 512 frames are ~1.4 ms at veth's ~360 000 frames/s, 0.6 ms at 10
    /// Gbit/s line rate; raise it for faster NICs.
    pub rx_ring: u32,
    /// Completion ring size and TX frame pool (power of two); the TX ring is twice as large.
    pub tx_ring: u32,
    /// UMEM frame size (power of two, 2048..=65536); 4096 leaves 3840 bytes for a packet.
    pub frame_size: u32,
    /// Copy or zero-copy.
    pub bind_mode: BindMode,
    /// Bind with `XDP_USE_NEED_WAKEUP` and kick only when the kernel asks for it; without it,
    /// every TX batch is kicked.
    pub need_wakeup: bool,
    /// Try to back the UMEM with huge pages (`MAP_HUGETLB`), falling back to normal pages when
    /// none are reserved (`/proc/sys/vm/nr_hugepages` is 0 by default). The UMEM then takes
    /// whole huge pages (its frame count rounded up; the frames past `rx_ring + tx_ring` stay
    /// unused), and normal pages when that would more than double it.
    pub hugepages: bool,
    /// Frames per `sendto` kick (the kernel's copy-mode TX sends at most 32 per call).
    pub kick_batch: u32,
    /// Largest batch handed out by `recv_batch` / taken by one completion sweep (with
    /// `multi_buffer`, a receive batch may hold up to `MAX_FRAMES_PER_PACKET - 1` frames more:
    /// the rest of a packet the limit cut).
    pub max_batch: u32,
    /// Bind attempts while the queue is busy (EBUSY).
    pub bind_attempts: u32,
    /// Wait between bind attempts.
    pub bind_retry_delay: Duration,
    /// Copy every frame received and transmitted to this packet capture (`None`: no
    /// capture, one branch per batch).
    pub capture: Option<CaptureTap>,
    /// Busy polling of the socket's NAPI context (`None`: interrupts, the default).
    pub busy_poll: Option<BusyPoll>,
    /// Multi-buffer AF_XDP (`XDP_USE_SG`, Linux 6.6): a packet may span up to
    /// [`MAX_FRAMES_PER_PACKET`] frames, the frames of one packet all but the last marked
    /// `XDP_PKT_CONTD` in their descriptor's options, so packets larger than a frame (jumbo
    /// frames) pass. Received multi-frame packets are joined into one buffer of the socket
    /// before they are handed out; transmitted ones are written straight into their frames
    /// ([`XskSocket::send_framed`]), or built in one buffer and copied into them
    /// ([`XskSocket::send_batch`]).
    /// Needs an XDP program that handles multi-buffer packets (`xdp.frags`). Off: a packet is
    /// one frame (the fast path, no copy).
    pub multi_buffer: bool,
}

/// The most UMEM frames one packet spans with [`XskConfig::multi_buffer`]: 4 frames of a
/// 4 KiB UMEM hold 15 360 octets, room for a 9000-octet MTU (Linux caps a multi-buffer
/// packet at 17 frames, `MAX_SKB_FRAGS` + 1). A received packet of more frames is dropped
/// (counted); none longer is built.
pub const MAX_FRAMES_PER_PACKET: usize = 4;

// A capture keeps the whole of the longest packet a socket takes in (at the default 4 KiB
// frames).
const _: () = assert!(super::capture::DEFAULT_SNAPLEN >= MAX_FRAMES_PER_PACKET * 4096);

/// `XDP_PKT_CONTD` (include/uapi/linux/if_xdp.h): more frames of this packet follow.
const XDP_PKT_CONTD: u32 = 1;

/// Busy polling for a real NIC (the kernel's AF_XDP busy-poll mode): the socket's receive
/// path runs the driver's NAPI poll from the application's `recvfrom`/`sendto` instead of from
/// interrupts. Set on the socket as `SO_PREFER_BUSY_POLL`, `SO_BUSY_POLL` and
/// `SO_BUSY_POLL_BUDGET` (socket(7)); with it the receive path calls `recvfrom` whenever its
/// ring is empty, which is what drives NAPI. It pays off only with the NIC's interrupts
/// deferred, e.g. `echo 2 > /sys/class/net/IF/napi_defer_hard_irqs` and
/// `echo 200000 > /sys/class/net/IF/gro_flush_timeout`; veth has no NAPI to gain from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusyPoll {
    /// `SO_BUSY_POLL`: microseconds a blocking receive busy-polls before it sleeps.
    pub usecs: u32,
    /// `SO_BUSY_POLL_BUDGET`: packets one busy poll may process (the kernel caps it).
    pub budget: u16,
    /// `SO_PREFER_BUSY_POLL`: keep the NIC's interrupts off while the application polls.
    pub prefer: bool,
}

impl Default for BusyPoll {
    /// The kernel documentation's example: 20 us, a budget of 64, preferred.
    fn default() -> Self {
        BusyPoll {
            usecs: 20,
            budget: 64,
            prefer: true,
        }
    }
}

/// What the kernel reports of a socket's busy polling ([`XskSocket::busy_poll_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusyPollState {
    /// `SO_BUSY_POLL`.
    pub usecs: u32,
    /// `SO_PREFER_BUSY_POLL`.
    pub prefer: bool,
}

/// `SO_PREFER_BUSY_POLL` (include/uapi/asm-generic/socket.h).
const SO_PREFER_BUSY_POLL: libc::c_int = 69;
/// `SO_BUSY_POLL_BUDGET`.
const SO_BUSY_POLL_BUDGET: libc::c_int = 70;

fn set_int_option(fd: RawFd, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and its size is passed; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn get_int_option(fd: RawFd, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of the sizes passed; the kernel writes at
    // most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The system's default huge page size (`Hugepagesize` in `/proc/meminfo`): the one
/// `MAP_HUGETLB` without a size flag maps.
fn default_huge_page_size() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("Hugepagesize:"))?;
    let mut words = line.split_whitespace().skip(1);
    let n: u64 = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(n.checked_mul(1024)?)
}

/// The frame count of a UMEM of at least `frames` frames of `frame_size` octets on huge pages
/// of `page` octets: rounded up to whole pages. A `MAP_HUGETLB` mapping is unmapped only by a
/// length that is a multiple of its page size (`munmap` fails with `EINVAL` otherwise, and
/// xsk-rs unmaps the length it mapped), so a UMEM of another length kept its huge pages until
/// the process ended. `None` (normal pages) when rounding up would more than double the UMEM,
/// or the page is not a whole number of frames.
fn huge_page_frames(frames: u32, frame_size: u32, page: u64) -> Option<u32> {
    let frame = u64::from(frame_size);
    if frame == 0 || page == 0 || !page.is_multiple_of(frame) {
        return None;
    }
    let len = u64::from(frames) * frame;
    let rounded = len.div_ceil(page).checked_mul(page)?;
    (rounded <= 2 * len).then(|| u32::try_from(rounded / frame).ok())?
}

/// Sets the three busy-poll options on `fd`.
fn apply_busy_poll(fd: RawFd, bp: BusyPoll) -> io::Result<()> {
    set_int_option(fd, SO_PREFER_BUSY_POLL, libc::c_int::from(bp.prefer))?;
    set_int_option(
        fd,
        libc::SO_BUSY_POLL,
        libc::c_int::try_from(bp.usecs).unwrap_or(libc::c_int::MAX),
    )?;
    set_int_option(fd, SO_BUSY_POLL_BUDGET, libc::c_int::from(bp.budget))
}

impl Default for XskConfig {
    fn default() -> Self {
        Self {
            rx_ring: 512,
            tx_ring: 2048,
            frame_size: 4096,
            bind_mode: BindMode::Auto,
            need_wakeup: true,
            hugepages: true,
            kick_batch: 32,
            max_batch: 64,
            bind_attempts: 10,
            bind_retry_delay: Duration::from_millis(200),
            capture: None,
            busy_poll: None,
            multi_buffer: false,
        }
    }
}

/// The kernel's XDP headroom at the start of every UMEM frame (`XDP_PACKET_HEADROOM`).
const XDP_HEADROOM: u32 = 256;

/// The largest MTU at which every driver we know of runs an XDP program without multi-buffer
/// support in native mode (mlx5: 3498; veth: 3506).
const PLAIN_XDP_MTU_MAX: u32 = 3498;

impl XskConfig {
    /// Largest packet one frame holds: the frame size less the kernel's XDP headroom.
    pub fn frame_capacity(&self) -> usize {
        self.frame_size.saturating_sub(XDP_HEADROOM) as usize
    }

    /// The largest packet sockets of this config take: one frame's, or
    /// [`MAX_FRAMES_PER_PACKET`] frames' with [`XskConfig::multi_buffer`].
    pub fn packet_capacity(&self) -> usize {
        if self.multi_buffer {
            self.frame_capacity() * MAX_FRAMES_PER_PACKET
        } else {
            self.frame_capacity()
        }
    }

    /// This config for an interface of `mtu`: multi-buffer sockets when a packet of the MTU
    /// (with its Ethernet header) does not fit one frame.
    pub fn for_mtu(&self, mtu: u32) -> XskConfig {
        XskConfig {
            multi_buffer: self.multi_buffer || mtu as usize + 14 > self.frame_capacity(),
            ..self.clone()
        }
    }

    /// Whether the steering program must be the multi-buffer (`xdp.frags`) variant: for
    /// multi-buffer sockets, and above MTU 3498, where drivers refuse native XDP to a program
    /// without it (veth at 3506, mlx5 at 3498) though a packet still fits one frame (a socket
    /// without `XDP_USE_SG` takes a multi-buffer packet that fits one frame).
    pub fn needs_frags_program(&self, mtu: u32) -> bool {
        self.multi_buffer || mtu > PLAIN_XDP_MTU_MAX
    }

    fn validate(&self) -> Result<(), XskError> {
        let pow2 = |v: u32| v.is_power_of_two();
        let ok = |v: u32| pow2(v) && (8..=1 << 20).contains(&v);
        if !ok(self.rx_ring) || !ok(self.tx_ring) {
            return Err(XskError::InvalidConfig(
                "ring sizes must be powers of two from 8 to 1048576",
            ));
        }
        if !pow2(self.frame_size) || !(2048..=65536).contains(&self.frame_size) {
            return Err(XskError::InvalidConfig(
                "frame size must be a power of two between 2048 and 65536",
            ));
        }
        if self.kick_batch == 0 || self.max_batch == 0 || self.bind_attempts == 0 {
            return Err(XskError::InvalidConfig(
                "kick_batch, max_batch and bind_attempts must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Counters of one socket: ours and the kernel's (`XDP_STATISTICS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames taken from the RX ring.
    pub rx_frames: u64,
    /// Frames put on the TX ring.
    pub tx_frames: u64,
    /// TX frames completed by the kernel.
    pub tx_completed: u64,
    /// `sendto` kicks issued.
    pub tx_kicks: u64,
    /// Fill-ring wakeups issued.
    pub fill_wakeups: u64,
    /// Busy polls issued (`recvfrom` on an empty RX ring, [`BusyPoll`]).
    pub busy_polls: u64,
    /// Kernel: frames dropped for other reasons (e.g. no fill-ring frame).
    pub rx_dropped: u64,
    /// Kernel: frames dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Kernel: times the fill ring was found empty.
    pub fill_ring_empty: u64,
    /// Kernel: invalid RX descriptors.
    pub rx_invalid_descs: u64,
    /// Kernel: invalid TX descriptors.
    pub tx_invalid_descs: u64,
    /// Kernel: times the TX ring was found empty on a kick.
    pub tx_ring_empty: u64,
    /// Received packets that spanned several frames ([`XskConfig::multi_buffer`]), joined.
    pub rx_multi_frame: u64,
    /// Received multi-frame packets dropped: more than [`MAX_FRAMES_PER_PACKET`] frames, or
    /// cut short (their last frame not received with them).
    pub rx_multi_frame_dropped: u64,
    /// Received multi-frame packets whose TCP payload the join summed and CRC'd as it copied
    /// them ([`PayloadDigest`]).
    pub rx_multi_frame_digested: u64,
    /// Transmitted packets that spanned several frames.
    pub tx_multi_frame: u64,
    /// Received descriptors that name no frame of the RX pool the kernel held (outside the
    /// pool, across chunks, a frame received already): never read, never given back to the
    /// fill ring, their packets dropped (with the rest of their frames; a kernel that keeps
    /// its side of the rings never hands one over).
    pub rx_descs_refused: u64,
    /// Completions that name no TX frame the kernel holds (outside the TX pool, inside a
    /// frame, a frame completed already or never sent): not taken back as free frames.
    pub tx_completions_refused: u64,
}

/// One received packet of a batch in which some packet spans several frames.
#[derive(Debug, Clone, Copy)]
enum RxPacket {
    /// In one frame: the descriptor's index in the batch.
    Frame(usize),
    /// Joined from several frames into the socket's `rx_joined`, at this range, with what the
    /// join read of its TCP payload.
    Joined {
        at: usize,
        len: usize,
        digest: Option<PayloadDigest>,
    },
}

/// One packet of a multi-buffer receive batch, as its frames' `XDP_PKT_CONTD` flags delimit
/// it ([`split_packets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PacketSpan {
    /// In one frame: its index in the batch.
    Frame(usize),
    /// Over the frames `first..end` of the batch (2 to [`MAX_FRAMES_PER_PACKET`]).
    Frames(usize, usize),
    /// Over more frames than [`MAX_FRAMES_PER_PACKET`]: dropped.
    TooLong,
    /// Its last frame is not in the batch (the chain ran past the room for it): dropped, and
    /// the rest of it skipped at the start of the next batch.
    Cut,
}

/// Splits a receive batch of `n` frames into packets by whether each frame says more of its
/// packet follow (`contd(i)`, the descriptor's `XDP_PKT_CONTD`), calling `packet` for each in
/// order. With `discarding` the batch starts inside a packet dropped before (cut at the end of
/// the last batch): its frames up to and including the one that ends it are skipped. Returns
/// whether the next batch starts inside a dropped packet (this one ended in a [`PacketSpan::Cut`]
/// one, or is wholly the rest of one still going on).
fn split_packets(
    n: usize,
    mut discarding: bool,
    contd: impl Fn(usize) -> bool,
    mut packet: impl FnMut(PacketSpan),
) -> bool {
    let mut i = 0;
    while discarding && i < n {
        discarding = contd(i);
        i += 1;
    }
    if discarding {
        return true;
    }
    while i < n {
        let first = i;
        while i < n && contd(i) {
            i += 1;
        }
        if i == n {
            packet(PacketSpan::Cut);
            return true;
        }
        i += 1;
        packet(match i - first {
            1 => PacketSpan::Frame(first),
            frames if frames > MAX_FRAMES_PER_PACKET => PacketSpan::TooLong,
            _ => PacketSpan::Frames(first, i),
        });
    }
    false
}

/// Octets of a frame's headers prefetched: of each received frame as its batch is taken
/// ([`RxBatch::prefetch`] asks for the rest). The Ethernet, IPv4, TCP (with options) and
/// MPA/DDP/RDMAP headers of an engine segment lie in the first 128.
const HEADER_PREFETCH: usize = 128;

/// An AF_XDP socket bound to one queue, with its UMEM, four rings and frame allocator.
///
/// The socket is `Send`: build it, then move it to the thread that polls it.
pub struct XskSocket {
    ifname: String,
    queue: u32,
    // The rings hold the socket (and through it the UMEM) alive; `umem` is kept for frame access.
    rx: RxQueue,
    tx: TxQueue,
    fq: FillQueue,
    cq: CompQueue,
    umem: Umem,
    /// Free TX frames (capacity = all TX frames, so pushing never allocates).
    free_tx: Vec<FrameDesc>,
    /// Scratch for descriptors taken from the RX ring (length = max_batch, plus
    /// `MAX_FRAMES_PER_PACKET - 1` for the rest of a cut multi-frame packet).
    rx_descs: Vec<FrameDesc>,
    /// Scratch for descriptors going to the TX ring (length = kick_batch x the frames a
    /// packet may take).
    tx_descs: Vec<FrameDesc>,
    /// Scratch for descriptors taken from the completion ring (length = max_batch).
    comp_descs: Vec<FrameDesc>,
    /// RX frames that the fill ring refused (kept until it takes them; never expected).
    fill_pending: Vec<FrameDesc>,
    tx_in_flight: usize,
    tx_ring_size: usize,
    frame_capacity: usize,
    need_wakeup: bool,
    hugepages: bool,
    zero_copy: bool,
    /// The most frames of one packet: 1, or on a multi-buffer socket
    /// [`MAX_FRAMES_PER_PACKET`] (fewer in zero-copy mode when the driver takes fewer).
    frames_per_packet: usize,
    stats: XskStats,
    /// What a descriptor the kernel hands back must name ([`FrameBook`]).
    book: FrameBook,
    capture: Option<CaptureTap>,
    /// Busy polling: `recvfrom` on every empty receive (see [`BusyPoll`]).
    busy_poll: bool,
    /// Bound with `XDP_USE_SG` ([`XskConfig::multi_buffer`]).
    multi_buffer: bool,
    /// The packets of the current RX batch when one of them spans several frames (else empty:
    /// packet `i` is frame `i`).
    rx_packets: Vec<RxPacket>,
    /// Whether `rx_packets` describes the current batch.
    rx_indexed: bool,
    /// Whether a descriptor of the current batch was refused ([`FrameBook::take_rx`]).
    rx_outside: bool,
    /// Which descriptors of the current batch were refused (valid up to the batch's size
    /// while `rx_outside`).
    rx_refused: Vec<bool>,
    /// The frames of a packet cut short (its last frame was still on the RX ring when its
    /// batch ended) are being dropped: the next batch skips frames up to that packet's end.
    rx_discarding: bool,
    /// The octets of the current batch's multi-frame packets, joined (room for a full batch
    /// of the largest packets, allocated when the socket opens), used up to `rx_joined_len`.
    rx_joined: Vec<u8>,
    rx_joined_len: usize,
    /// A packet being built before it is copied into its frames (multi-buffer `send_batch`).
    tx_joined: Vec<u8>,
}

impl std::fmt::Debug for XskSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskSocket")
            .field("ifname", &self.ifname)
            .field("queue", &self.queue)
            .field("fd", &self.fd())
            .field("hugepages", &self.hugepages)
            .field("zero_copy", &self.zero_copy)
            .field("frames_per_packet", &self.frames_per_packet)
            .field("tx_in_flight", &self.tx_in_flight)
            .finish()
    }
}

fn os_error(e: &(dyn std::error::Error + 'static)) -> io::Error {
    match e.source().and_then(|s| s.downcast_ref::<io::Error>()) {
        Some(io) => io
            .raw_os_error()
            .map(io::Error::from_raw_os_error)
            .unwrap_or_else(|| io::Error::other(io.to_string())),
        None => io::Error::other(e.to_string()),
    }
}

/// Maps a kernel error of UMEM/socket setup to a typed error.
fn classify(ifname: &str, queue: u32, detail: &'static str, e: io::Error) -> XskError {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => XskError::NotRoot {
            op: detail,
            uid: euid(),
        },
        Some(libc::ENODEV) => XskError::InterfaceNotFound(ifname.to_owned()),
        Some(libc::EAFNOSUPPORT) | Some(libc::EOPNOTSUPP) | Some(libc::EPROTONOSUPPORT) => {
            XskError::NoXdpSupport {
                ifname: ifname.to_owned(),
                queue,
                detail,
                source: e,
            }
        }
        _ => XskError::Setup {
            ifname: ifname.to_owned(),
            queue,
            detail,
            source: e,
        },
    }
}

/// The most frames of one packet the driver of `ifindex` takes in zero-copy mode (its
/// `xdp_zc_max_segs`, at most [`MAX_FRAMES_PER_PACKET`]): a longer multi-buffer packet would be
/// dropped on transmit, so the socket sends none. One frame when the kernel does not say
/// (before Linux 6.3, zero-copy multi-buffer did not exist).
fn zero_copy_max_frames(ifname: &str, ifindex: u32) -> usize {
    let segs = match netlink::xdp_device_features(ifindex) {
        Ok(Some(f)) => f.zc_max_segs as usize,
        Ok(None) => 1,
        Err(e) => {
            tracing::warn!(ifname, error = %e, "xdp_zc_max_segs not readable: one frame a packet");
            1
        }
    };
    let frames = segs.clamp(1, MAX_FRAMES_PER_PACKET);
    if frames < MAX_FRAMES_PER_PACKET {
        tracing::info!(
            ifname,
            frames,
            "zero-copy driver: packets of at most {frames} frame(s)"
        );
    }
    frames
}

/// Whether the bound socket runs in zero-copy mode (`XDP_OPTIONS`).
fn query_zero_copy(fd: RawFd) -> bool {
    const XDP_OPTIONS: libc::c_int = 8;
    const XDP_OPTIONS_ZEROCOPY: u32 = 1;
    let mut flags: u32 = 0;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: `flags` and `len` are valid for writes of the sizes passed; the kernel writes at
    // most `len` bytes (struct xdp_options is one u32).
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_XDP,
            XDP_OPTIONS,
            (&mut flags as *mut u32).cast(),
            &mut len,
        )
    };
    rc == 0 && flags & XDP_OPTIONS_ZEROCOPY != 0
}

impl XskSocket {
    /// Creates a UMEM and an AF_XDP socket bound to `queue` of `ifname` (in the calling thread's
    /// network namespace), fills the fill ring, and returns the socket. While the queue is busy
    /// (EBUSY, e.g. a socket on it closed less than ~0.2 s ago) it retries up to
    /// `cfg.bind_attempts` times, `cfg.bind_retry_delay` apart.
    pub fn open(ifname: &str, queue: u32, cfg: &XskConfig) -> Result<Self, XskError> {
        cfg.validate()?;
        let info = netlink::interface_info(ifname)?;
        // The queues running, not all allocated: binding to one not running fails with
        // EINVAL, which said nothing of the queue.
        let (rx, tx) = super::ethtool::running_queues(ifname, (info.rx_queues, info.tx_queues));
        let queues = rx.min(tx);
        if queue >= queues {
            return Err(XskError::QueueOutOfRange {
                ifname: ifname.to_owned(),
                queue,
                queues,
            });
        }
        let start = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_open(ifname, info.index, queue, cfg) {
                Err(XskError::Setup { source, .. })
                    if source.raw_os_error() == Some(libc::EBUSY) =>
                {
                    if attempt >= cfg.bind_attempts {
                        return Err(XskError::Busy {
                            ifname: ifname.to_owned(),
                            queue,
                            attempts: attempt,
                            waited: start.elapsed(),
                        });
                    }
                    std::thread::sleep(cfg.bind_retry_delay);
                }
                other => return other,
            }
        }
    }

    /// Opens one socket per queue in `queues` (each with its own UMEM).
    pub fn open_queues(
        ifname: &str,
        queues: impl IntoIterator<Item = u32>,
        cfg: &XskConfig,
    ) -> Result<Vec<Self>, XskError> {
        queues
            .into_iter()
            .map(|q| Self::open(ifname, q, cfg))
            .collect()
    }

    fn try_open(ifname: &str, ifindex: u32, queue: u32, cfg: &XskConfig) -> Result<Self, XskError> {
        let invalid = XskError::InvalidConfig("ring or frame size rejected");
        let qsize =
            |n: u32| QueueSize::new(n).map_err(|_| XskError::InvalidConfig("ring size rejected"));
        let umem_cfg = UmemConfig::builder()
            .frame_size(FrameSize::new(cfg.frame_size).map_err(|_| invalid)?)
            .fill_queue_size(qsize(cfg.rx_ring * 2)?)
            .comp_queue_size(qsize(cfg.tx_ring)?)
            .build()
            .map_err(|_| XskError::InvalidConfig("UMEM configuration rejected"))?;
        let frames = cfg.rx_ring + cfg.tx_ring;
        let count =
            std::num::NonZeroU32::new(frames).ok_or(XskError::InvalidConfig("no frames"))?;
        let setup = |detail, e: &(dyn std::error::Error + 'static)| {
            classify(ifname, queue, detail, os_error(e))
        };
        let huge_count = cfg
            .hugepages
            .then(default_huge_page_size)
            .flatten()
            .and_then(|page| huge_page_frames(frames, cfg.frame_size, page))
            .and_then(std::num::NonZeroU32::new);
        let (umem, mut descs, hugepages) = match huge_count.map(|n| Umem::new(umem_cfg, n, true)) {
            Some(Ok((u, mut d))) => {
                // The frames past those the rings use stay unused.
                d.truncate(frames as usize);
                (u, d, true)
            }
            // No huge pages reserved (or another hugepage failure): normal pages.
            _ => match Umem::new(umem_cfg, count, false) {
                Ok((u, d)) => (u, d, false),
                Err(e) => return Err(setup("creating the UMEM", &e)),
            },
        };

        let mut bind = BindFlags::empty();
        if cfg.need_wakeup {
            bind |= BindFlags::XDP_USE_NEED_WAKEUP;
        }
        if cfg.multi_buffer {
            bind |= BindFlags::XDP_USE_SG;
        }
        match cfg.bind_mode {
            BindMode::Auto => {}
            BindMode::Copy => bind |= BindFlags::XDP_COPY,
            BindMode::ZeroCopy => bind |= BindFlags::XDP_ZEROCOPY,
        }
        let sock_cfg = SocketConfig::builder()
            .rx_queue_size(qsize(cfg.rx_ring)?)
            .tx_queue_size(qsize(cfg.tx_ring * 2)?)
            .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
            .bind_flags(bind)
            .build();
        let iface: Interface = ifname
            .parse()
            .map_err(|_| XskError::InterfaceNotFound(ifname.to_owned()))?;
        // SAFETY: the UMEM was created just above and is used by this socket only (not shared),
        // and libxdp's program loading is inhibited, so the double-free hazard documented for a
        // shared UMEM on an already bound (interface, queue) cannot arise.
        let (tx, rx, rings) = unsafe { Socket::new(sock_cfg, &umem, &iface, queue) }
            .map_err(|e| setup("binding the AF_XDP socket", &e))?;
        let (mut fq, cq) = rings.ok_or_else(|| XskError::Setup {
            ifname: ifname.to_owned(),
            queue,
            detail: "binding the AF_XDP socket",
            source: io::Error::other("libxdp returned no fill/completion rings"),
        })?;

        let rx_frames = cfg.rx_ring as usize;
        let tx_base = descs.get(rx_frames).map_or(0, |d| d.addr());
        let mut book = FrameBook::new(cfg.rx_ring, cfg.tx_ring, cfg.frame_size, tx_base);
        // SAFETY: these descriptors are fresh frames of this UMEM that nothing else uses; from
        // here on the kernel owns them until they come back on the RX ring.
        let filled = unsafe { fq.produce(&descs[..rx_frames]) };
        if filled != rx_frames {
            return Err(XskError::Setup {
                ifname: ifname.to_owned(),
                queue,
                detail: "filling the fill ring",
                source: io::Error::other(format!("only {filled} of {rx_frames} frames accepted")),
            });
        }
        for d in &descs[..rx_frames] {
            book.give_rx(d.addr());
        }
        let free_tx: Vec<FrameDesc> = descs.drain(rx_frames..).collect();
        let fd = rx.fd().as_raw_fd();
        if let Some(bp) = cfg.busy_poll {
            apply_busy_poll(fd, bp)
                .map_err(|e| classify(ifname, queue, "setting the busy-poll socket options", e))?;
        }
        let frame_capacity = (cfg.frame_size - umem_cfg.xdp_headroom()) as usize;
        let zero_copy = query_zero_copy(fd);
        let frames_per_packet = if cfg.multi_buffer {
            MAX_FRAMES_PER_PACKET.min(if zero_copy {
                zero_copy_max_frames(ifname, ifindex)
            } else {
                MAX_FRAMES_PER_PACKET
            })
        } else {
            1
        };
        let frames_room = if cfg.multi_buffer {
            MAX_FRAMES_PER_PACKET
        } else {
            1
        };
        let joined = if cfg.multi_buffer {
            frame_capacity * frames_room
        } else {
            0
        };
        Ok(Self {
            ifname: ifname.to_owned(),
            queue,
            tx_ring_size: 2 * free_tx.len(),
            fill_pending: Vec::with_capacity(rx_frames),
            free_tx,
            // Room for the rest of a packet the batch limit cut. The arrays hold packets of
            // MAX_FRAMES_PER_PACKET frames whatever the transmit limit: what is received is
            // not the driver's transmit limit, and `send_framed` takes that many frames a
            // packet before it offers `frames_per_packet` of them.
            rx_descs: vec![FrameDesc::default(); cfg.max_batch as usize + frames_room - 1],
            tx_descs: vec![FrameDesc::default(); cfg.kick_batch as usize * frames_room],
            comp_descs: vec![FrameDesc::default(); cfg.max_batch as usize],
            rx,
            tx,
            fq,
            cq,
            umem,
            tx_in_flight: 0,
            frame_capacity,
            need_wakeup: cfg.need_wakeup,
            hugepages,
            zero_copy,
            frames_per_packet,
            stats: XskStats::default(),
            book,
            capture: cfg.capture.clone(),
            busy_poll: cfg.busy_poll.is_some(),
            multi_buffer: cfg.multi_buffer,
            // (Used by a single-buffer socket only for a batch with a refused descriptor.)
            rx_packets: Vec::with_capacity(cfg.max_batch as usize + MAX_FRAMES_PER_PACKET),
            rx_indexed: false,
            rx_outside: false,
            rx_refused: vec![false; cfg.max_batch as usize + frames_room - 1],
            rx_discarding: false,
            rx_joined: vec![0; joined * cfg.max_batch as usize],
            rx_joined_len: 0,
            tx_joined: vec![0; joined],
        })
    }

    /// The socket's file descriptor, for the XSKMAP (`SteeringProgram::bind_socket(queue, fd)`)
    /// or for `poll`.
    pub fn fd(&self) -> RawFd {
        self.rx.fd().as_raw_fd()
    }

    /// The queue this socket is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// The interface this socket is bound to.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Largest packet a frame can hold (frame size less the XDP headroom).
    pub fn frame_capacity(&self) -> usize {
        self.frame_capacity
    }

    /// Largest packet the socket receives and sends: a frame's capacity, or, bound for
    /// multi-buffer, [`MAX_FRAMES_PER_PACKET`] frames' (in zero-copy mode no more frames than
    /// the driver takes in one packet, its `xdp_zc_max_segs`).
    pub fn packet_capacity(&self) -> usize {
        self.frame_capacity * self.frames_per_packet
    }

    /// Limits a multi-buffer socket to `frames` frames a packet (at least 1, at most
    /// [`MAX_FRAMES_PER_PACKET`]), as a zero-copy driver's `xdp_zc_max_segs` does: for tests on
    /// links without zero-copy (veth). Not for applications.
    #[doc(hidden)]
    pub fn limit_frames_per_packet(&mut self, frames: usize) {
        if self.multi_buffer {
            self.frames_per_packet = frames.clamp(1, MAX_FRAMES_PER_PACKET);
        }
    }

    /// Whether the socket is bound for multi-buffer packets ([`XskConfig::multi_buffer`]).
    pub fn is_multi_buffer(&self) -> bool {
        self.multi_buffer
    }

    /// True if the UMEM is backed by huge pages (false: huge pages were not asked for or none
    /// were available, so normal pages are used).
    pub fn hugepages(&self) -> bool {
        self.hugepages
    }

    /// True if the kernel runs this socket in zero-copy mode.
    pub fn is_zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// `recvfrom(fd, NULL, 0, MSG_DONTWAIT)`: with the busy-poll options set, the kernel runs
    /// the driver's NAPI poll for this socket's queue. Its errors (EAGAIN with nothing to do,
    /// EBUSY) mean only that nothing was polled this time.
    fn busy_poll_kick(&self) {
        // SAFETY: a zero-length receive with a null buffer and no address: the kernel writes
        // nothing to user memory; `fd` is this socket's open descriptor.
        let _ = unsafe {
            libc::recvfrom(
                self.fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    }

    /// The busy-poll options as the kernel reports them for this socket (zero and false
    /// unless [`XskConfig::busy_poll`] set them). The kernel does not report
    /// `SO_BUSY_POLL_BUDGET` (getsockopt: ENOPROTOOPT); a socket that opened has it set.
    pub fn busy_poll_state(&self) -> io::Result<BusyPollState> {
        let fd = self.fd();
        Ok(BusyPollState {
            usecs: u32::try_from(get_int_option(fd, libc::SO_BUSY_POLL)?).unwrap_or(0),
            prefer: get_int_option(fd, SO_PREFER_BUSY_POLL)? != 0,
        })
    }

    /// TX frames on the TX ring or in the kernel, not yet completed.
    pub fn tx_in_flight(&self) -> usize {
        self.tx_in_flight
    }

    /// TX frames free for [`send_batch`](Self::send_batch) right now (completions not yet
    /// reaped are not counted; [`complete`](Self::complete) reaps them).
    pub fn tx_free(&self) -> usize {
        self.free_tx.len()
    }

    /// Whether enough TX frames are free for one more packet right now: one, or on a
    /// multi-buffer socket the most a packet may span (the frames are taken before the packet's
    /// length is known).
    pub fn tx_has_room_for_a_packet(&self) -> bool {
        let needed = if self.multi_buffer {
            MAX_FRAMES_PER_PACKET
        } else {
            1
        };
        self.free_tx.len() >= needed
    }

    /// Takes up to `max` (at most `max_batch`) received frames from the RX ring, without
    /// waiting; with multi-buffer up to `MAX_FRAMES_PER_PACKET - 1` more, to finish a packet
    /// the limit cut. The returned batch lends read-only views of the frames; dropping it
    /// returns them to the fill ring. When nothing arrived and the kernel asked for a
    /// fill-ring wakeup, wakes it (zero-copy drivers need that to go on receiving).
    pub fn recv_batch(&mut self, max: usize) -> RxBatch<'_> {
        if !self.fill_pending.is_empty() {
            // SAFETY: frames of this UMEM received earlier and owned by us (no view of them is
            // alive: the batch that lent them was dropped); the kernel owns them from here.
            if unsafe { self.fq.produce(&self.fill_pending) } > 0 {
                for d in &self.fill_pending {
                    self.book.give_rx(d.addr());
                }
                self.fill_pending.clear();
            }
        }
        // The descriptors past `max_batch` take the rest of a multi-frame packet.
        let spare = if self.multi_buffer {
            MAX_FRAMES_PER_PACKET - 1
        } else {
            0
        };
        let want = max.min(self.rx_descs.len() - spare);
        // SAFETY: `rx_descs` is scratch owned by us; `consume` overwrites its first `n` entries
        // with descriptors of frames of this socket's UMEM that the kernel has handed back.
        let mut n = unsafe { self.rx.consume(&mut self.rx_descs[..want]) };
        self.rx_indexed = false;
        if self.multi_buffer && n > 0 {
            n = self.finish_cut_packet(n);
        }
        // Checked before any view of a frame is made: a descriptor that names no frame of the
        // RX pool the kernel held is refused, which makes the batch indexed, so that its
        // packet is left out, and is not given back to the fill ring (a descriptor the kernel
        // got wrong may name a chunk it still owns, or one we hold).
        let mut in_pool = true;
        for (desc, refused) in self.rx_descs[..n].iter().zip(&mut self.rx_refused) {
            *refused = !self.book.take_rx(desc.addr(), desc.lengths().data());
            in_pool &= !*refused;
        }
        self.rx_outside = !in_pool;
        if n > 0 && (self.multi_buffer || !in_pool) {
            self.index_packets(n, in_pool);
        }
        if n == 0 && self.busy_poll {
            // Only `recvfrom` runs the driver's NAPI poll for an AF_XDP socket (`poll(2)`
            // busy-polls only with the net.core.busy_poll sysctl set).
            self.stats.busy_polls += 1;
            self.busy_poll_kick();
        } else if n == 0 && self.need_wakeup && self.fq.needs_wakeup() {
            self.stats.fill_wakeups += 1;
            let _ = self.fq.wakeup(self.rx.fd_mut(), 0);
        }
        self.stats.rx_frames += n as u64;
        if let Some(tap) = &self.capture {
            if self.rx_indexed {
                for p in &self.rx_packets {
                    match *p {
                        // SAFETY: as below.
                        RxPacket::Frame(i) => {
                            tap.record(unsafe { self.umem.data(&self.rx_descs[i]) }.contents())
                        }
                        RxPacket::Joined { at, len, .. } => {
                            tap.record(&self.rx_joined[at..at + len])
                        }
                    }
                }
            } else {
                for desc in &self.rx_descs[..n] {
                    // SAFETY: a descriptor the kernel just handed back on the RX ring, taken as
                    // a frame of the RX pool it held (an unindexed batch has no other): a frame
                    // of this UMEM that nobody writes until it returns to the fill ring.
                    tap.record(unsafe { self.umem.data(desc) }.contents());
                }
            }
        }
        // Every frame's headers at once: the kernel wrote them on another CPU (veth's receive
        // runs in the peer's thread), and a TCP header with options ends past the first cache
        // line; read one after the other, each line is a transfer from that CPU the receive
        // path waits for (the checksum of a received ACK was the sender's largest wait for it).
        for (desc, &refused) in self.rx_descs[..n].iter().zip(&self.rx_refused) {
            if in_pool || !refused {
                self.prefetch_frame(desc);
            }
        }
        RxBatch { sock: self, n }
    }

    /// Multi-buffer: when the last of the `n` descriptors taken says more frames of its packet
    /// follow, takes them too (the kernel publishes a packet's frames together, so they are on
    /// the ring; the batch limit cut the packet). Returns the new count.
    fn finish_cut_packet(&mut self, mut n: usize) -> usize {
        while n < self.rx_descs.len() && self.rx_descs[n - 1].options() & XDP_PKT_CONTD != 0 {
            // SAFETY: as in `recv_batch`: scratch owned by us, overwritten with descriptors
            // the kernel handed back.
            let got = unsafe { self.rx.consume(&mut self.rx_descs[n..n + 1]) };
            if got == 0 {
                break;
            }
            n += got;
        }
        n
    }

    /// When a packet of the `n` descriptors spans several frames (multi-buffer), or a
    /// descriptor was refused (`in_pool` false), lists the batch's packets (`rx_packets`)
    /// and joins each multi-frame one into `rx_joined`. A packet of more than
    /// [`MAX_FRAMES_PER_PACKET`] frames, one whose last frame is missing, or one with a
    /// refused descriptor is dropped ([`split_packets`]): its frames go back to the fill ring
    /// with the batch, the refused ones excepted.
    fn index_packets(&mut self, n: usize, in_pool: bool) {
        let multi_buffer = self.multi_buffer;
        let contd = |d: &FrameDesc| multi_buffer && d.options() & XDP_PKT_CONTD != 0;
        if in_pool && !self.rx_discarding && !self.rx_descs[..n].iter().any(contd) {
            return;
        }
        let XskSocket {
            rx_descs,
            rx_packets,
            rx_joined,
            rx_joined_len,
            rx_discarding,
            umem,
            stats,
            rx_refused,
            ..
        } = self;
        rx_packets.clear();
        *rx_joined_len = 0;
        let descs = &rx_descs[..n];
        *rx_discarding = split_packets(
            n,
            *rx_discarding,
            |i| contd(&descs[i]),
            |span| {
                let (first, end) = match span {
                    PacketSpan::Frame(i) => (i, i + 1),
                    PacketSpan::TooLong | PacketSpan::Cut => {
                        stats.rx_multi_frame_dropped += 1;
                        return;
                    }
                    PacketSpan::Frames(first, end) => (first, end),
                };
                // (Counted as they are kept from the fill ring, when the batch is dropped.)
                if !in_pool && rx_refused[first..end].iter().any(|&r| r) {
                    return;
                }
                if end - first == 1 {
                    rx_packets.push(RxPacket::Frame(first));
                    return;
                }
                let mut frames: [&[u8]; MAX_FRAMES_PER_PACKET] = [&[]; MAX_FRAMES_PER_PACKET];
                for (slot, desc) in frames.iter_mut().zip(&descs[first..end]) {
                    // SAFETY: a descriptor the kernel just handed back on the RX ring, taken as
                    // a frame of the RX pool it held (`recv_batch`; checked just above): a
                    // frame of this UMEM that nobody writes until it returns to the fill ring.
                    *slot = unsafe { umem.data(desc) }.contents();
                }
                let frames = &frames[..end - first];
                let len: usize = frames.iter().map(|f| f.len()).sum();
                let at = *rx_joined_len;
                // Room for every packet of a batch at its largest (reserved at open); a batch
                // holds at most `max_batch` packets.
                let Some(dst) = rx_joined.get_mut(at..at + len) else {
                    stats.rx_multi_frame_dropped += 1;
                    return;
                };
                let digest = join::join(frames, dst);
                *rx_joined_len += len;
                stats.rx_multi_frame += 1;
                stats.rx_multi_frame_digested += u64::from(digest.is_some());
                rx_packets.push(RxPacket::Joined { at, len, digest });
            },
        );
        self.rx_indexed = true;
    }

    /// Waits up to `timeout` for the RX ring to have frames (`poll`), for callers that do not
    /// busy-poll. Returns true if frames are ready.
    pub fn wait_readable(&mut self, timeout: Duration) -> Result<bool, XskError> {
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        self.rx.poll(ms).map_err(XskError::Wakeup)
    }

    /// Queues up to `n` frames for transmission. For each frame, `fill(i, buf)` gets the frame's
    /// index in this call and its whole buffer ([`frame_capacity`](Self::frame_capacity) bytes)
    /// and returns the frame's length (0 skips the frame, lengths above the buffer are clipped).
    /// Frames go to the TX ring `kick_batch` at a time, each batch followed by a `sendto` kick
    /// (only when the kernel asks for one, with need-wakeup) and a reap of the completion ring.
    /// Fewer than `n` are queued when free TX frames run out: reap completions and call again.
    /// Returns how many were queued.
    ///
    /// On a multi-buffer socket `buf` holds [`packet_capacity`](Self::packet_capacity) bytes
    /// and a packet longer than a frame goes out in several (see [`XskConfig::multi_buffer`]);
    /// the count returned is of packets.
    pub fn send_batch<F>(&mut self, n: usize, mut fill: F) -> Result<usize, XskError>
    where
        F: FnMut(usize, &mut [u8]) -> usize,
    {
        self.send_until(n, |i, buf| Some(fill(i, buf)))
    }

    /// [`send_batch`](Self::send_batch) for a source that can run dry: `fill` returning `None`
    /// says nothing more is to be sent, and the call queues what it has and ends there (a
    /// latency-bound sender queues one frame; without the end it would be offered, and take
    /// from the free list and put back, every frame of the batch).
    pub fn send_until<F>(&mut self, n: usize, fill: F) -> Result<usize, XskError>
    where
        F: FnMut(usize, &mut [u8]) -> Option<usize>,
    {
        if self.multi_buffer {
            return self.send_batch_joined(n, fill);
        }
        self.send_single(n, fill)
    }

    /// [`send_until`](Self::send_until) on a single-buffer socket: a packet per frame.
    fn send_single<F>(&mut self, n: usize, mut fill: F) -> Result<usize, XskError>
    where
        F: FnMut(usize, &mut [u8]) -> Option<usize>,
    {
        if self.free_tx.len() < n {
            self.complete();
        }
        let mut index = 0;
        let mut queued = 0;
        let mut dry = false;
        while index < n && !dry {
            let chunk = (n - index).min(self.tx_descs.len()).min(self.free_tx.len());
            if chunk == 0 {
                break;
            }
            let mut k = 0;
            for _ in 0..chunk {
                let Some(mut desc) = self.free_tx.pop() else {
                    break;
                };
                // No prefetch of the next free frame: the free list is a stack, so it is one
                // the kernel read during the last kick (its lines and its page's translation
                // are warm), and while the sender streams payload from a cold source the
                // prefetch instruction itself waited for a free miss buffer.
                let len = {
                    // SAFETY: `desc` came from the free list, so it is a frame of this UMEM
                    // that neither the kernel (it is on no ring) nor any other view is using.
                    let mut data = unsafe { self.umem.data_mut(&mut desc) };
                    let mut cursor = data.cursor();
                    let cap = cursor.buf_len();
                    cursor.set_pos(cap);
                    let len = fill(index, data.contents_mut()).map(|l| l.min(cap));
                    data.cursor().set_pos(len.unwrap_or(0));
                    len
                };
                index += 1;
                let Some(len) = len else {
                    self.free_tx.push(desc);
                    dry = true;
                    break;
                };
                if len == 0 {
                    self.free_tx.push(desc);
                } else {
                    self.tx_descs[k] = desc;
                    k += 1;
                }
            }
            if k == 0 {
                continue;
            }
            // SAFETY: the descriptors are frames of this UMEM taken from the free list and
            // written above; from here the kernel owns them until they come back on the
            // completion ring.
            let produced = unsafe { self.tx.produce(&self.tx_descs[..k]) };
            if produced == 0 {
                // TX ring full (cannot happen with the ring twice the TX frame pool, but keep
                // the frames rather than lose them).
                self.free_tx.extend_from_slice(&self.tx_descs[..k]);
                self.kick()?;
                break;
            }
            if let Some(tap) = &self.capture {
                for desc in &self.tx_descs[..produced] {
                    // SAFETY: frames of this UMEM written above and now on the TX ring: until
                    // they complete, the kernel only reads them, as this does.
                    tap.record(unsafe { self.umem.data(desc) }.contents());
                }
            }
            for d in &self.tx_descs[..produced] {
                self.book.lend_tx(d.addr());
            }
            self.tx_in_flight += produced;
            self.stats.tx_frames += produced as u64;
            queued += produced;
            self.kick()?;
            // In copy mode the kick has sent the frames and the kernel has usually completed
            // them already: reaping now puts them on top of the free list, so the next batch
            // writes frames the kernel has just read (in cache) rather than ones last used a
            // turn ago, which a turn's worth of frames, copies and ACKs has pushed out.
            self.complete();
        }
        Ok(queued)
    }

    /// [`send_until`](Self::send_until) with each packet written straight into its frames:
    /// `fill(i, frames)` gets the frames a packet may take, in order, each
    /// [`frame_capacity`](Self::frame_capacity) octets (one on a single-buffer socket,
    /// [`MAX_FRAMES_PER_PACKET`] on a multi-buffer one, fewer in zero-copy mode when the
    /// driver takes fewer: [`packet_capacity`](Self::packet_capacity)), and returns the packet's length: its
    /// octets run through the frames in order, each frame but the packet's last filled whole
    /// (0 skips the packet, lengths above the frames' room are clipped, `None` says nothing
    /// more is to be sent). On a multi-buffer socket a packet of several frames goes to the TX
    /// ring as one, all its frames but the last marked `XDP_PKT_CONTD`. Returns the packets
    /// queued.
    pub fn send_framed<F>(&mut self, n: usize, mut fill: F) -> Result<usize, XskError>
    where
        F: FnMut(usize, &mut [&mut [u8]]) -> Option<usize>,
    {
        if !self.multi_buffer {
            return self.send_single(n, |i, buf| fill(i, &mut [buf]));
        }
        let cap = self.frame_capacity;
        let mut index = 0;
        let mut queued = 0;
        let mut dry = false;
        while index < n && !dry {
            let mut k = 0;
            let mut packets = 0;
            let mut out_of_frames = false;
            while index < n && k + MAX_FRAMES_PER_PACKET <= self.tx_descs.len() {
                if self.free_tx.len() < MAX_FRAMES_PER_PACKET {
                    self.complete();
                    if self.free_tx.len() < MAX_FRAMES_PER_PACKET {
                        out_of_frames = true;
                        break;
                    }
                }
                // The top MAX_FRAMES_PER_PACKET of the free stack (there are that many: checked
                // above), the warmest first.
                let mut descs = [FrameDesc::default(); MAX_FRAMES_PER_PACKET];
                let top = self.free_tx.len() - MAX_FRAMES_PER_PACKET;
                for (d, free) in descs.iter_mut().zip(self.free_tx[top..].iter().rev()) {
                    *d = *free;
                }
                self.free_tx.truncate(top);
                let len = {
                    // SAFETY: the descriptors came from the free list, so they are distinct
                    // frames of this UMEM that neither the kernel (they are on no ring) nor
                    // any other view is using.
                    let mut views = descs.each_mut().map(|d| unsafe { self.umem.data_mut(d) });
                    for v in &mut views {
                        v.cursor().set_pos(cap);
                    }
                    let mut frames = views.each_mut().map(|v| v.contents_mut());
                    // A zero-copy driver may take fewer frames a packet: only those are
                    // offered (the packet writer sees the room it has).
                    let offered = self.frames_per_packet;
                    fill(index, &mut frames[..offered]).map(|l| l.min(cap * offered))
                };
                index += 1;
                // Frames not used go back with the first taken (the warmest) on top.
                let Some(len) = len else {
                    self.free_tx.extend(descs.iter().rev());
                    dry = true;
                    break;
                };
                let frames = len.div_ceil(cap);
                for (f, desc) in descs.iter_mut().enumerate().take(frames) {
                    {
                        // SAFETY: as above; the view written in `fill` is gone.
                        let mut data = unsafe { self.umem.data_mut(desc) };
                        data.cursor().set_pos((len - f * cap).min(cap));
                    }
                    desc.set_options(if f + 1 < frames { XDP_PKT_CONTD } else { 0 });
                    self.tx_descs[k + f] = *desc;
                }
                self.free_tx.extend(descs[frames..].iter().rev());
                if frames == 0 {
                    continue;
                }
                if let Some(tap) = &self.capture {
                    let mut pieces: [&[u8]; MAX_FRAMES_PER_PACKET] = [&[]; MAX_FRAMES_PER_PACKET];
                    for (piece, desc) in pieces.iter_mut().zip(&self.tx_descs[k..k + frames]) {
                        // SAFETY: frames of this UMEM written above and on no ring yet: this
                        // reads them and nothing writes them.
                        *piece = unsafe { self.umem.data(desc) }.contents();
                    }
                    tap.record_pieces(&pieces[..frames]);
                }
                k += frames;
                packets += 1;
                if frames > 1 {
                    self.stats.tx_multi_frame += 1;
                }
            }
            if k > 0 {
                // SAFETY: the descriptors are frames of this UMEM taken from the free list and
                // written above; from here the kernel owns them until they come back on the
                // completion ring. (The ring takes all of them or none.)
                let produced = unsafe { self.tx.produce(&self.tx_descs[..k]) };
                if produced == 0 {
                    self.free_tx.extend_from_slice(&self.tx_descs[..k]);
                    self.kick()?;
                    break;
                }
                for d in &self.tx_descs[..produced] {
                    self.book.lend_tx(d.addr());
                }
                self.tx_in_flight += produced;
                self.stats.tx_frames += produced as u64;
                queued += packets;
                self.kick()?;
                self.complete();
            }
            if out_of_frames {
                break;
            }
        }
        Ok(queued)
    }

    /// [`send_batch`](Self::send_batch) on a multi-buffer socket, for a `fill` that writes a
    /// packet into one buffer: each packet is built in `tx_joined`, then copied into its
    /// frames ([`send_framed`](Self::send_framed) writes them without the copy).
    fn send_batch_joined<F>(&mut self, n: usize, mut fill: F) -> Result<usize, XskError>
    where
        F: FnMut(usize, &mut [u8]) -> Option<usize>,
    {
        let mut joined = std::mem::take(&mut self.tx_joined);
        // The writer sees the room a packet has (less than the joined buffer's when a
        // zero-copy driver takes fewer frames a packet).
        let room = self.packet_capacity().min(joined.len());
        let sent = self.send_framed(n, |i, frames| {
            let len = fill(i, &mut joined[..room])?.min(room);
            let (first, rest) = frames.split_first_mut()?;
            Some(tcp_engine::copy_to_pieces(&joined[..len], first, rest))
        });
        self.tx_joined = joined;
        sent
    }

    /// Prefetches the first [`HEADER_PREFETCH`] octets of frame `desc` (a received one not yet
    /// returned to the fill ring) (x86-64 `prefetcht0` per cache line);
    /// reads and writes nothing, does nothing elsewhere.
    #[inline]
    fn prefetch_frame(&self, desc: &FrameDesc) {
        self.prefetch_frame_octets(desc, 0, HEADER_PREFETCH);
    }

    /// Prefetches octets `from..to` of frame `desc` (ours, as for
    /// [`prefetch_frame`](Self::prefetch_frame); clamped to the frame), one `prefetcht0` per
    /// cache line.
    #[inline]
    fn prefetch_frame_octets(&self, desc: &FrameDesc, from: usize, to: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: `desc` is a frame of this UMEM that is ours: on the free list, or handed
            // back by the kernel on the RX ring, taken as a frame of the RX pool (`recv_batch`;
            // the callers prefetch no other) and not yet on the fill ring (the kernel writes
            // neither); this view only yields its address and is dropped here.
            let base = unsafe { self.umem.data(desc) }.contents().as_ptr();
            let mut k = from;
            while k < to.min(self.frame_capacity) {
                // SAFETY: a prefetch never faults and neither reads nor writes memory visibly
                // (the address, formed with `wrapping_add`, is not dereferenced; past a start
                // the XDP program moved forward it can lie beyond the chunk, harmlessly), and
                // SSE (which defines it) is part of the x86-64 baseline.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(k).cast()) };
                k += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (desc, from, to);
    }

    fn kick(&mut self) -> Result<(), XskError> {
        if !self.need_wakeup || self.tx.needs_wakeup() {
            self.stats.tx_kicks += 1;
            probe::mark(Mark::KickStart);
            self.tx.wakeup().map_err(XskError::Wakeup)?;
            probe::mark(Mark::KickDone);
        }
        Ok(())
    }

    /// Reaps the completion ring: frames the kernel has sent go back to the free list. Returns
    /// how many.
    pub fn complete(&mut self) -> usize {
        let mut total = 0;
        loop {
            // SAFETY: `comp_descs` is scratch owned by us; `consume` writes the descriptors the
            // kernel put on the completion ring, each taken back below only if it names a TX
            // frame we lent it (then that frame is ours again).
            let n = unsafe { self.cq.consume(&mut self.comp_descs) };
            for d in &self.comp_descs[..n] {
                if self.book.take_back_tx(d.addr()) {
                    // The free list's capacity is the whole TX pool and each frame comes back
                    // once, so this never reallocates.
                    self.free_tx.push(*d);
                    total += 1;
                } else {
                    // No frame of ours, or one the kernel did not hold: never written.
                    self.stats.tx_completions_refused += 1;
                }
            }
            if n < self.comp_descs.len() {
                break;
            }
        }
        self.tx_in_flight -= total.min(self.tx_in_flight);
        self.stats.tx_completed += total as u64;
        total
    }

    /// Reaps completions and, if frames still wait on the TX ring, kicks the kernel again (in
    /// copy mode a kick sends at most 32). Returns the frames completed.
    pub fn flush(&mut self) -> Result<usize, XskError> {
        let done = self.complete();
        let pending_on_ring = self.tx_ring_pending();
        if pending_on_ring > 0 {
            self.kick()?;
        }
        Ok(done)
    }

    /// True if no frame waits on the TX ring for the kernel to take it.
    pub fn tx_ring_idle(&mut self) -> bool {
        self.tx_ring_pending() == 0
    }

    /// True if a receive now would find nothing and owe the kernel nothing: no frame on the
    /// RX ring, none waiting to go back to the fill ring, no wake-up asked for by the fill
    /// ring, and no busy polling (whose `recvfrom` must run on every empty receive).
    pub fn rx_idle(&mut self) -> bool {
        self.fill_pending.is_empty()
            && !self.busy_poll
            && !(self.need_wakeup && self.fq.needs_wakeup())
            && self.rx.nb_avail(1) == 0
    }

    fn tx_ring_pending(&mut self) -> usize {
        let free = self.tx.nb_free_exact() as usize;
        self.tx_ring_size.saturating_sub(free)
    }

    /// Flushes until every queued frame is completed or `timeout` passes. Returns true if all
    /// completed.
    pub fn drain_tx(&mut self, timeout: Duration) -> Result<bool, XskError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.flush()?;
            if self.tx_in_flight == 0 {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::hint::spin_loop();
        }
    }

    /// Our counters and the kernel's `XDP_STATISTICS` (zeros where the kernel would not say).
    pub fn stats(&self) -> XskStats {
        let mut s = self.stats;
        if let Ok(k) = self.rx.fd().xdp_statistics() {
            s.rx_dropped = k.rx_dropped();
            s.rx_ring_full = k.rx_ring_full();
            s.fill_ring_empty = k.rx_fill_ring_empty_descs();
            s.rx_invalid_descs = k.rx_invalid_descs();
            s.tx_invalid_descs = k.tx_invalid_descs();
            s.tx_ring_empty = k.tx_ring_empty_descs();
        }
        s
    }
}

/// Received frames on loan from an [`XskSocket`]; dropping the batch gives them back to the fill
/// ring.
pub struct RxBatch<'a> {
    sock: &'a mut XskSocket,
    n: usize,
}

impl RxBatch<'_> {
    /// Number of packets (frames, unless a multi-buffer packet spans several).
    pub fn len(&self) -> usize {
        if self.sock.rx_indexed {
            self.sock.rx_packets.len()
        } else {
            self.n
        }
    }

    /// True if nothing was received.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Frames taken from the RX ring for this batch (more than [`len`](Self::len) when
    /// packets span several): what says whether the ring had more than a batch.
    pub fn frames(&self) -> usize {
        self.n
    }

    /// The bytes of packet `i`, or `None` if `i >= len()`.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let i = if self.sock.rx_indexed {
            match *self.sock.rx_packets.get(i)? {
                RxPacket::Frame(d) => d,
                RxPacket::Joined { at, len, .. } => return self.sock.rx_joined.get(at..at + len),
            }
        } else {
            i
        };
        let desc = self.sock.rx_descs[..self.n].get(i)?;
        // SAFETY: the descriptor came from this socket's RX ring, taken as a frame of its RX
        // pool the kernel held (an unindexed batch holds no other; an indexed one lists only
        // packets whose frames were), so it describes a frame of its UMEM that the kernel has
        // handed over; it goes back to the fill ring only when the batch is dropped, which
        // ends every borrow of `self`.
        Some(unsafe { self.sock.umem.data(desc) }.contents())
    }

    /// Asks the CPU for the rest of frame `i`'s cache lines, past the headers
    /// [`XskSocket::recv_batch`] already asked for (reads nothing; nothing if `i >= len()`). A
    /// receiver that reads whole frames (checksum, CRC, placement) calls this a frame or two
    /// ahead, so that the lines the kernel wrote on the sending CPU (veth) travel while it
    /// works on the frame before, not while it waits for them one by one.
    #[inline]
    pub fn prefetch(&self, i: usize) {
        if self.sock.rx_indexed {
            // (Joined packets were just written: in cache.)
            return;
        }
        if let Some(desc) = self.sock.rx_descs[..self.n].get(i) {
            self.sock
                .prefetch_frame_octets(desc, HEADER_PREFETCH, desc.lengths().data());
        }
    }

    /// What joining packet `i` read of its TCP payload, for a multi-frame packet that had one
    /// to digest ([`PayloadDigest`]); `None` for other packets.
    pub fn digest(&self, i: usize) -> Option<PayloadDigest> {
        if !self.sock.rx_indexed {
            return None;
        }
        match *self.sock.rx_packets.get(i)? {
            RxPacket::Joined { digest, .. } => digest,
            RxPacket::Frame(_) => None,
        }
    }

    /// Iterates the packets in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }
}

impl Drop for RxBatch<'_> {
    fn drop(&mut self) {
        if self.n == 0 {
            return;
        }
        let sock = &mut *self.sock;
        let mut n = self.n;
        if sock.rx_outside {
            // Only the frames taken go back (`recv_batch`); the refused ones are counted.
            let mut kept = 0;
            for i in 0..n {
                if !sock.rx_refused[i] {
                    sock.rx_descs[kept] = sock.rx_descs[i];
                    kept += 1;
                }
            }
            sock.stats.rx_descs_refused += (n - kept) as u64;
            n = kept;
            sock.rx_outside = false;
        }
        // SAFETY: the frames came from this socket's RX ring and every view of them borrowed
        // this batch, which is being dropped; handing them to the fill ring gives them back to
        // the kernel. The fill ring is twice the RX frame pool, so it always has room.
        if n > 0 && unsafe { sock.fq.produce(&sock.rx_descs[..n]) } == 0 {
            // Keep them for the next `recv_batch` (capacity = RX pool: no allocation).
            sock.fill_pending.extend_from_slice(&sock.rx_descs[..n]);
            return;
        }
        for d in &sock.rx_descs[..n] {
            sock.book.give_rx(d.addr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}

    #[test]
    fn socket_is_send() {
        assert_send::<XskSocket>();
    }

    /// A UMEM on huge pages takes whole pages (or normal pages when that would more than
    /// double it): the default 10 MiB UMEM is five 2 MiB pages as it is; 8 MiB + 32 KiB
    /// (`rx_ring: 2048, tx_ring: 8`) grows to 10 MiB; 64 KiB stays on normal pages.
    #[test]
    fn huge_page_umems_take_whole_pages() {
        const MIB2: u64 = 2 << 20;
        assert_eq!(huge_page_frames(512 + 2048, 4096, MIB2), Some(2560));
        assert_eq!(huge_page_frames(2048 + 8, 4096, MIB2), Some(2560));
        assert_eq!(huge_page_frames(16, 4096, MIB2), None);
        assert_eq!(huge_page_frames(256, 4096, MIB2), Some(512));
        assert_eq!(huge_page_frames(2560, 4096, 1 << 30), None);
        assert_eq!(huge_page_frames(2560, 4096, 3 << 20 | 1), None);
        assert_eq!(huge_page_frames(u32::MAX, 65536, MIB2), None);
        assert_eq!(huge_page_frames(0, 4096, MIB2), Some(0));
    }

    /// `split_packets` over frames flagged `c` (more follow) or `l` (last of its packet):
    /// the packets it reports and whether the next batch starts inside a dropped one.
    fn split(flags: &str, discarding: bool) -> (Vec<PacketSpan>, bool) {
        let contd: Vec<bool> = flags.chars().map(|f| f == 'c').collect();
        let mut packets = Vec::new();
        let next = split_packets(contd.len(), discarding, |i| contd[i], |p| packets.push(p));
        (packets, next)
    }

    #[test]
    fn split_packets_by_their_continuation_flags() {
        use PacketSpan::*;
        assert_eq!(split("", false), (vec![], false));
        assert_eq!(
            split("lll", false),
            (vec![Frame(0), Frame(1), Frame(2)], false)
        );
        assert_eq!(split("cl", false), (vec![Frames(0, 2)], false));
        assert_eq!(
            split("lcccll", false),
            (vec![Frame(0), Frames(1, 5), Frame(5)], false),
            "four frames: the most a packet may take"
        );
        assert_eq!(
            split("ccccllcl", false),
            (vec![TooLong, Frame(5), Frames(6, 8)], false),
            "five frames: dropped, the packets after it kept"
        );
        assert_eq!(
            split("lclcc", false),
            (vec![Frame(0), Frames(1, 3), Cut], true),
            "the batch ends inside a packet"
        );
        assert_eq!(split("c", false), (vec![Cut], true));
    }

    #[test]
    fn split_packets_skips_the_rest_of_a_cut_packet() {
        use PacketSpan::*;
        assert_eq!(
            split("clcl", true),
            (vec![Frames(2, 4)], false),
            "the cut packet's last two frames skipped"
        );
        assert_eq!(split("ll", true), (vec![Frame(1)], false), "its last frame");
        assert_eq!(
            split("ccc", true),
            (vec![], true),
            "all of it, and more to come"
        );
        assert_eq!(split("", true), (vec![], true));
    }

    #[test]
    fn config_validation() {
        assert!(XskConfig::default().validate().is_ok());
        let bad = XskConfig {
            rx_ring: 1000,
            ..XskConfig::default()
        };
        assert!(matches!(bad.validate(), Err(XskError::InvalidConfig(_))));
        let bad = XskConfig {
            frame_size: 1024,
            ..XskConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn errno_classification() {
        let e = classify("x", 0, "t", io::Error::from_raw_os_error(libc::EPERM));
        assert!(matches!(e, XskError::NotRoot { .. }));
        let e = classify(
            "x",
            0,
            "t",
            io::Error::from_raw_os_error(libc::EAFNOSUPPORT),
        );
        assert!(matches!(e, XskError::NoXdpSupport { .. }));
        let e = classify("x", 0, "t", io::Error::from_raw_os_error(libc::EBUSY));
        assert!(matches!(e, XskError::Setup { .. }));
    }

    #[test]
    fn open_missing_interface_is_typed() {
        match XskSocket::open("nonexistent-if0", 0, &XskConfig::default()) {
            Err(XskError::InterfaceNotFound(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}
