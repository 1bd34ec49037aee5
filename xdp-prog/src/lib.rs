//! XDP steering program and its typed loader.
//!
//! `bpf/steer.c` (built by `build.rs` with clang, embedded here) redirects the IPv4 TCP packets
//! of iWARP flows into AF_XDP sockets and passes everything else to the kernel:
//!
//! * a packet whose destination address and TCP port are steered
//!   ([`SteeringProgram::steer_port`], for listeners; the same port on another address of the
//!   host stays the kernel's) or whose 4-tuple is steered ([`SteeringProgram::steer_flow`], for
//!   connections)
//!   goes to the AF_XDP socket bound to the packet's RX queue
//!   ([`SteeringProgram::bind_socket`]); with no socket bound there it goes to the kernel;
//! * an ICMP "fragmentation needed" (type 3 code 4, RFC 792 and RFC 1191 4) whose quoted TCP
//!   segment, read in reverse, is a steered flow's or came from a steered listener goes to that
//!   socket too (the engine lowers the connection's path MTU; the kernel has no socket for it);
//! * the first fragment of an IPv4 datagram carrying a segment steered as above is dropped
//!   (the engine's TCP does not reassemble; the kernel would reset the connection);
//! * priority tags (VLAN ID 0, as peers marking priority for DCB/PFC send; 802.1Q or 802.1ad,
//!   up to four stacked) are looked through, and taken off a frame that goes to a socket, so
//!   the engine always gets untagged frames;
//! * everything else (ARP, other ICMP, other TCP, IPv6, frames of a VLAN or behind more
//!   than four tags, other IPv4 fragments) goes to the kernel.
//!
//! [`SteeringProgram`] loads the object, attaches it to one interface (native/driver or
//! generic/SKB mode), edits the steering maps, binds sockets to queues, reads the per-CPU
//! counters, and detaches when dropped, leaving the interface as it was.
//!
//! Needs root (CAP_BPF and CAP_NET_ADMIN). Interface names are resolved in the network
//! namespace of the *calling thread*, so a caller that uses `setns` on one thread attaches
//! inside that namespace. The attachment is a BPF link (kernel 5.9+): detaching works from any
//! thread.
//!
//! ```no_run
//! use xdp_prog::{AttachMode, SteeringProgram};
//! let mut prog = SteeringProgram::load(false)?;
//! let mode = prog.attach("iwa0", AttachMode::Auto)?;
//! prog.steer_port(std::net::Ipv4Addr::new(10, 77, 0, 1), 4791)?;
//! // prog.bind_socket(queue, xsk_fd)?;  // an AF_XDP socket already bound to (iwa0, queue)
//! println!("attached in {mode} mode, counters {:?}", prog.counters()?);
//! # Ok::<(), xdp_prog::XdpError>(())
//! ```

use std::{fmt, io, net::Ipv4Addr, os::fd::RawFd};

use aya::{
    maps::{HashMap, IterableMap, MapData, MapError, PerCpuArray, XskMap},
    programs::{xdp::XdpLink, ProgramError, Xdp, XdpMode},
    Ebpf, EbpfError, EbpfLoader,
};
use thiserror::Error;

/// The compiled `bpf/steer.c`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.o"));

/// Number of entries of the `xsks` map: RX queues 0..MAX_QUEUES can have a socket.
/// Must match `MAX_QUEUES` in `bpf/steer.c`.
pub const MAX_QUEUES: u32 = 64;
// `SteeringProgram::bound` is a u64 bitmask over the queues.
const _: () = assert!(MAX_QUEUES <= 64);

const PROG: &str = "steer";
const PROG_FRAGS: &str = "steer_frags";
const MAP_PORTS: &str = "steer_ports";
const MAP_FLOWS: &str = "steer_flows";
/// Connections steered at once with [`SteeringProgram::load`] (`steer_flows`' size in
/// `bpf/steer.c`); [`SteeringProgram::load_sized`] makes room for more.
pub const DEFAULT_FLOWS: u32 = 65_536;
const MAP_XSKS: &str = "xsks";
const MAP_COUNTERS: &str = "counters";

// Counter slots, as in bpf/steer.c.
const COUNTER_REDIRECTED: u32 = 0;
const COUNTER_PASSED: u32 = 1;
const COUNTER_NO_SOCKET: u32 = 2;
const COUNTER_ICMP_REDIRECTED: u32 = 3;
const COUNTER_FRAGMENT_DROPPED: u32 = 4;

/// Linux `IFNAMSIZ` (including the terminating NUL).
const IFNAMSIZ: usize = 16;

/// How to attach the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttachMode {
    /// Native XDP, run by the driver (`XDP_FLAGS_DRV_MODE`); fails when the driver lacks it.
    Driver,
    /// Generic XDP, run by the kernel stack on the skb (`XDP_FLAGS_SKB_MODE`); works anywhere.
    Generic,
    /// Driver mode, falling back to generic mode when the driver refuses.
    Auto,
}

/// The mode an attached program actually runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActiveMode {
    /// Native (driver) XDP.
    Driver,
    /// Generic (SKB) XDP.
    Generic,
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttachMode::Driver => "driver",
            AttachMode::Generic => "generic",
            AttachMode::Auto => "auto",
        })
    }
}

impl fmt::Display for ActiveMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ActiveMode::Driver => "driver",
            ActiveMode::Generic => "generic",
        })
    }
}

impl ActiveMode {
    fn xdp_mode(self) -> XdpMode {
        match self {
            ActiveMode::Driver => XdpMode::Driver,
            ActiveMode::Generic => XdpMode::Skb,
        }
    }
}

/// A TCP/IPv4 4-tuple as carried by a *received* packet: `saddr:sport` is the remote peer,
/// `daddr:dport` this host. Values are in host byte order; the conversion to the wire order
/// the program matches on happens in one place (`FourTuple::key`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FourTuple {
    /// Source address of received packets (the peer).
    pub saddr: Ipv4Addr,
    /// Destination address of received packets (this host).
    pub daddr: Ipv4Addr,
    /// Source TCP port of received packets (the peer's port).
    pub sport: u16,
    /// Destination TCP port of received packets (this host's port).
    pub dport: u16,
}

impl FourTuple {
    /// The `struct flow_key` of `bpf/steer.c`: saddr, daddr, sport, dport, network byte order.
    fn key(&self) -> [u8; 12] {
        let mut k = [0u8; 12];
        k[0..4].copy_from_slice(&self.saddr.octets());
        k[4..8].copy_from_slice(&self.daddr.octets());
        k[8..10].copy_from_slice(&port_key(self.sport));
        k[10..12].copy_from_slice(&port_key(self.dport));
        k
    }
}

/// A TCP port as the program sees it in the packet: network byte order.
fn port_key(port: u16) -> [u8; 2] {
    port.to_be_bytes()
}

/// The `struct listen_key` of `bpf/steer.c`: the address and port a listener takes packets
/// on, network byte order, two zero octets of padding.
fn listen_key(addr: Ipv4Addr, port: u16) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[0..4].copy_from_slice(&addr.octets());
    k[4..6].copy_from_slice(&port_key(port));
    k
}

/// Packet counts summed over all CPUs. Every packet the program sees is counted exactly once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Steered packets redirected into an AF_XDP socket.
    pub redirected: u64,
    /// Packets passed to the kernel because they are not steered.
    pub passed: u64,
    /// Steered packets passed to the kernel because no AF_XDP socket is bound to their RX queue.
    pub no_socket: u64,
    /// ICMP "fragmentation needed" messages about steered flows redirected into an AF_XDP
    /// socket (not counted in `redirected`).
    pub icmp_redirected: u64,
    /// First fragments of IPv4 datagrams carrying a steered TCP segment, dropped: the
    /// engine's TCP does not reassemble, and the kernel, had it reassembled them, would have
    /// reset the peer's connection (it has no socket for the flow). The later fragments go
    /// to the kernel, which never completes the datagram without its first.
    pub fragments_dropped: u64,
}

impl Counters {
    /// The counts accumulated since `earlier` (a previous reading).
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            redirected: self.redirected.wrapping_sub(earlier.redirected),
            passed: self.passed.wrapping_sub(earlier.passed),
            no_socket: self.no_socket.wrapping_sub(earlier.no_socket),
            icmp_redirected: self.icmp_redirected.wrapping_sub(earlier.icmp_redirected),
            fragments_dropped: self
                .fragments_dropped
                .wrapping_sub(earlier.fragments_dropped),
        }
    }
}

/// Errors of the loader. Every failure is reported as one of these, never as a panic.
#[derive(Debug, Error)]
pub enum XdpError {
    /// The kernel refused the program variant for packets of several buffers (`xdp.frags`,
    /// Linux 5.18 on), which an MTU above 3498 (or multi-buffer sockets) needs.
    #[error(
        "the kernel refused the XDP program for multi-buffer packets (xdp.frags needs Linux \
         5.18 or later), which an MTU above 3498 needs: lower the MTU to 3498 or run a newer \
         kernel ({0})"
    )]
    FragsUnsupported(String),
    /// The process lacks the privileges (CAP_BPF and CAP_NET_ADMIN, or CAP_SYS_ADMIN).
    #[error("permission denied while {op}: run as root (needs CAP_BPF and CAP_NET_ADMIN)")]
    PermissionDenied {
        /// What was being done.
        op: &'static str,
    },
    /// No interface of that name in the calling thread's network namespace.
    #[error("network interface `{0}` not found (in this thread's network namespace)")]
    InterfaceNotFound(String),
    /// The interface cannot run XDP in the requested mode (e.g. driver mode on `lo`).
    #[error("XDP {mode} mode is not supported on `{ifname}`: {source}")]
    ModeNotSupported {
        /// Interface name.
        ifname: String,
        /// The refused mode.
        mode: ActiveMode,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// Native XDP refused because the MTU (on veth: the peer's MTU, limit 3506) is too large
    /// for a program without multi-buffer support.
    #[error(
        "MTU of `{ifname}` (on veth: of its peer) is too large for native XDP without \
         multi-buffer support: lower the MTU, or use generic mode (`--xdp-mode generic`); a \
         program loaded with `frags` (the engine loads one above MTU 3498) lifts the limit"
    )]
    MtuTooLarge {
        /// Interface name.
        ifname: String,
    },
    /// Another XDP program is already attached to the interface (possibly in the other mode).
    #[error("another XDP program is already attached to `{ifname}` ({holder}): {source}")]
    InterfaceBusy {
        /// Interface name.
        ifname: String,
        /// Who holds it: the processes holding an XDP link on the interface, or how to find
        /// out ([`xdp_holders`]).
        holder: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// This program is already attached (to `ifname`); detach first.
    #[error("the steering program is already attached to `{0}`; detach it first")]
    AlreadyAttached(String),
    /// Attaching failed for another reason.
    #[error("attaching XDP in {mode} mode to `{ifname}` failed: {source}")]
    Attach {
        /// Interface name.
        ifname: String,
        /// The requested mode.
        mode: ActiveMode,
        /// aya's error.
        #[source]
        source: ProgramError,
    },
    /// Loading the object or the program failed (includes the verifier log).
    #[error("loading the XDP program failed: {0}")]
    Load(String),
    /// The queue index is beyond the `xsks` map.
    #[error("RX queue {queue} is out of range (the program supports queues 0..{MAX_QUEUES})")]
    QueueOutOfRange {
        /// The queue asked for.
        queue: u32,
    },
    /// The fd is not an AF_XDP socket bound to an interface queue.
    #[error(
        "fd {fd} is not a bound AF_XDP socket (bind it to the interface queue first): {source}"
    )]
    InvalidSocket {
        /// The fd passed in.
        fd: RawFd,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// The steering map has no room left.
    #[error("steering map `{0}` is full")]
    MapFull(&'static str),
    /// Any other map operation failure.
    #[error("BPF map `{map}` operation failed: {source}")]
    Map {
        /// Map name.
        map: &'static str,
        /// aya's error.
        #[source]
        source: MapError,
    },
}

/// The OS error code inside an aya map error, if any.
fn map_errno(e: &MapError) -> Option<i32> {
    match e {
        MapError::SyscallError(s) => s.io_error.raw_os_error(),
        MapError::CreateError { io_error, .. } => io_error.raw_os_error(),
        MapError::IoError(e) => e.raw_os_error(),
        _ => None,
    }
}

/// The OS error code inside an aya program error, if any.
fn program_errno(e: &ProgramError) -> Option<i32> {
    match e {
        ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
        ProgramError::LoadError { io_error, .. } => io_error.raw_os_error(),
        ProgramError::XdpError(aya::programs::xdp::XdpError::NetlinkError(n)) => n.raw_os_error(),
        ProgramError::NetlinkError(n) => n.raw_os_error(),
        ProgramError::IOError(e) => e.raw_os_error(),
        ProgramError::MapError(m) => map_errno(m),
        _ => None,
    }
}

fn ebpf_errno(e: &EbpfError) -> Option<i32> {
    match e {
        EbpfError::MapError(m) => map_errno(m),
        EbpfError::ProgramError(p) => program_errno(p),
        _ => None,
    }
}

/// Whether the running kernel's version is below `version` (major, minor); false when it
/// cannot be read.
fn kernel_before(version: (u32, u32)) -> bool {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .and_then(|release| parse_release(&release))
        .is_some_and(|running| running < version)
}

/// The major and minor numbers of a kernel release string ("6.1.0-57-amd64").
fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn is_eperm(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::EPERM) | Some(libc::EACCES))
}

/// Linux capability numbers (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// The calling thread's effective capability set, from `/proc/thread-self/status`
/// (`None` when it cannot be read; then the kernel's EPERM is the check).
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Fails with [`XdpError::PermissionDenied`] unless the thread may load BPF and administer
/// the network (CAP_SYS_ADMIN implies both).
fn check_caps(op: &'static str) -> Result<(), XdpError> {
    let Some(caps) = effective_caps() else {
        return Ok(());
    };
    let has = |c: u32| caps & (1u64 << c) != 0;
    let bpf = has(CAP_BPF) || has(CAP_SYS_ADMIN);
    let net = has(CAP_NET_ADMIN) || has(CAP_SYS_ADMIN);
    if bpf && net {
        Ok(())
    } else {
        Err(XdpError::PermissionDenied { op })
    }
}

/// A process holding an XDP link (a `bpf_link` fd of type xdp) on an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdpHolder {
    /// Its process id.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
}

/// The processes that hold an XDP link on `ifname` in the calling thread's network namespace,
/// found through `/proc/*/fdinfo` (a link's fdinfo says `link_type: xdp` and its `ifindex`)
/// and the namespaces of their threads. Empty when none is found: the program was then
/// attached another way (netlink, `ip link set ... xdp`), or by a process we may not inspect.
pub fn xdp_holders(ifname: &str) -> Vec<XdpHolder> {
    let Ok(name) = std::ffi::CString::new(ifname) else {
        return Vec::new();
    };
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    let own_ns = std::fs::read_link("/proc/thread-self/ns/net").ok();
    if ifindex == 0 || own_ns.is_none() {
        return Vec::new();
    }
    let wanted = format!("ifindex:\t{ifindex}");
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut holders = Vec::new();
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let holds = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| {
                std::fs::read_to_string(fd.path()).is_ok_and(|info| {
                    info.contains("link_type:\txdp") && info.lines().any(|l| l == wanted)
                })
            });
        // Interface indices are per namespace: one of the holder's threads must be in ours.
        let same_ns = || {
            std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|t| std::fs::read_link(t.path().join("ns/net")).ok() == own_ns)
        };
        if holds && same_ns() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim().to_string())
                .unwrap_or_default();
            holders.push(XdpHolder { pid, comm });
        }
    }
    holders
}

fn describe_holders(ifname: &str) -> String {
    let holders = xdp_holders(ifname);
    if holders.is_empty() {
        // Netlink answers `xdp off` for a generic program without removing it, cannot
        // remove a link, and an EEXIST can come from the device above.
        return format!(
            "not held by a process through a BPF link: attached through netlink (`ip -d link \
             show {ifname}` says `xdp` or `xdpgeneric`; `ip link set dev {ifname} xdp off`, or \
             `xdpgeneric off` for a generic one, detaches it), or a BPF link pinned in bpffs \
             (`bpftool link show`; `bpftool link detach id N` or removing its pin); with \
             nothing attached to {ifname}, a device above it (bond, team) holds one"
        );
    }
    let list: Vec<String> = holders
        .iter()
        .map(|h| format!("process {} `{}`", h.pid, h.comm))
        .collect();
    format!("held by {}", list.join(", "))
}

/// Rejects names the kernel could never accept (`dev_valid_name`), so they do not reach aya (which would panic
/// on an interior NUL).
fn valid_ifname(ifname: &str) -> bool {
    !ifname.is_empty()
        && ifname.len() < IFNAMSIZ
        && !ifname.contains(['\0', '/', ':'])
        && !ifname.contains(char::is_whitespace)
}

/// The loaded steering program: its maps and (once attached) its XDP link.
///
/// Dropping it detaches the program (the interface is left as it was before `attach`) and
/// frees the program and its maps.
pub struct SteeringProgram {
    // Field order is drop order: the link goes first (detach), then the program, then maps.
    link: Option<XdpLink>,
    attached: Option<(String, ActiveMode)>,
    /// Why [`AttachMode::Auto`] fell back to generic mode: the driver mode's error.
    driver_refused: Option<String>,
    ebpf: Ebpf,
    prog_name: &'static str,
    ports: HashMap<MapData, [u8; 8], u8>,
    flows: HashMap<MapData, [u8; 12], u8>,
    xsks: XskMap<MapData>,
    /// Bit q set = a socket was put in `xsks[q]` (the kernel cannot be asked: XSKMAP lookups
    /// from user space are not supported, and deleting an empty slot succeeds).
    bound: u64,
    counters: PerCpuArray<MapData, u64>,
}

impl fmt::Debug for SteeringProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SteeringProgram")
            .field("program", &self.prog_name)
            .field("attached", &self.attached)
            .finish_non_exhaustive()
    }
}

impl SteeringProgram {
    /// Loads the embedded object into the kernel: the maps and one of its two programs,
    /// `steer` (SEC "xdp") or, when `frags` is true, `steer_frags` (SEC "xdp.frags", needed for
    /// native XDP on veth when the peer MTU is above 3506).
    pub fn load(frags: bool) -> Result<Self, XdpError> {
        Self::load_sized(frags, DEFAULT_FLOWS)
    }

    /// [`SteeringProgram::load`] with room for `flows` connections steered at once (the
    /// `steer_flows` map's size, at least [`DEFAULT_FLOWS`]): an engine sizes it for all its
    /// shards' connections together. The kernel allocates the map's entries up front (about
    /// 100 octets each).
    pub fn load_sized(frags: bool, flows: u32) -> Result<Self, XdpError> {
        check_caps("loading the XDP program")?;
        let load_err = |e: EbpfError| {
            if is_eperm(ebpf_errno(&e)) {
                XdpError::PermissionDenied {
                    op: "loading the XDP program",
                }
            } else {
                XdpError::Load(e.to_string())
            }
        };
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(MAP_FLOWS, flows.max(DEFAULT_FLOWS))
            .load(OBJECT)
            .map_err(load_err)?;
        let prog_name = if frags { PROG_FRAGS } else { PROG };
        let prog: &mut Xdp = ebpf
            .program_mut(prog_name)
            .ok_or_else(|| XdpError::Load(format!("object has no program `{prog_name}`")))?
            .try_into()
            .map_err(|e: ProgramError| XdpError::Load(e.to_string()))?;
        prog.load().map_err(|e| {
            let errno = program_errno(&e);
            if is_eperm(errno) {
                XdpError::PermissionDenied {
                    op: "loading the XDP program",
                }
            } else if frags && errno == Some(libc::EINVAL) && kernel_before((5, 18)) {
                // A kernel before 5.18 refuses BPF_F_XDP_HAS_FRAGS itself.
                XdpError::FragsUnsupported(e.to_string())
            } else {
                XdpError::Load(e.to_string())
            }
        })?;

        fn take(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, XdpError> {
            ebpf.take_map(name)
                .ok_or_else(|| XdpError::Load(format!("object has no map `{name}`")))
        }
        let wrong = |name: &'static str| move |source| XdpError::Map { map: name, source };
        let ports = HashMap::try_from(take(&mut ebpf, MAP_PORTS)?).map_err(wrong(MAP_PORTS))?;
        let flows = HashMap::try_from(take(&mut ebpf, MAP_FLOWS)?).map_err(wrong(MAP_FLOWS))?;
        let xsks = XskMap::try_from(take(&mut ebpf, MAP_XSKS)?).map_err(wrong(MAP_XSKS))?;
        let counters =
            PerCpuArray::try_from(take(&mut ebpf, MAP_COUNTERS)?).map_err(wrong(MAP_COUNTERS))?;
        Ok(SteeringProgram {
            link: None,
            attached: None,
            driver_refused: None,
            ebpf,
            prog_name,
            ports,
            flows,
            xsks,
            bound: 0,
            counters,
        })
    }

    /// Why an [`AttachMode::Auto`] attach runs in generic mode: the error native (driver)
    /// mode failed with. `None` if it runs natively or generic mode was asked for.
    pub fn driver_refused(&self) -> Option<&str> {
        self.driver_refused.as_deref()
    }

    /// Whether this is the multi-buffer (`xdp.frags`) variant.
    pub fn is_frags(&self) -> bool {
        self.prog_name == PROG_FRAGS
    }

    /// Attaches the program to `ifname` (resolved in the calling thread's network namespace)
    /// and returns the mode it runs in. [`AttachMode::Auto`] tries driver mode first and falls
    /// back to generic mode when the driver refuses.
    pub fn attach(&mut self, ifname: &str, mode: AttachMode) -> Result<ActiveMode, XdpError> {
        if let Some((name, _)) = &self.attached {
            return Err(XdpError::AlreadyAttached(name.clone()));
        }
        check_caps("attaching the XDP program")?;
        self.driver_refused = None;
        if !valid_ifname(ifname) {
            return Err(XdpError::InterfaceNotFound(ifname.to_string()));
        }
        let active = match mode {
            AttachMode::Driver => self.attach_in(ifname, ActiveMode::Driver)?,
            AttachMode::Generic => self.attach_in(ifname, ActiveMode::Generic)?,
            AttachMode::Auto => match self.attach_in(ifname, ActiveMode::Driver) {
                Ok(m) => m,
                Err(
                    e @ (XdpError::ModeNotSupported { .. }
                    | XdpError::MtuTooLarge { .. }
                    | XdpError::Attach { .. }),
                ) => {
                    let m = self.attach_in(ifname, ActiveMode::Generic)?;
                    self.driver_refused = Some(e.to_string());
                    m
                }
                Err(e) => return Err(e),
            },
        };
        self.attached = Some((ifname.to_string(), active));
        Ok(active)
    }

    fn attach_in(&mut self, ifname: &str, mode: ActiveMode) -> Result<ActiveMode, XdpError> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(self.prog_name)
            .ok_or_else(|| XdpError::Load(format!("object has no program `{}`", self.prog_name)))?
            .try_into()
            .map_err(|e: ProgramError| XdpError::Load(e.to_string()))?;
        let id = prog.attach(ifname, mode.xdp_mode()).map_err(|source| {
            let errno = program_errno(&source);
            let ifname = ifname.to_string();
            match (&source, errno) {
                (ProgramError::UnknownInterface { .. }, _) | (_, Some(libc::ENODEV)) => {
                    XdpError::InterfaceNotFound(ifname)
                }
                (_, Some(libc::EPERM) | Some(libc::EACCES)) => XdpError::PermissionDenied {
                    op: "attaching the XDP program",
                },
                (_, Some(libc::ERANGE)) => XdpError::MtuTooLarge { ifname },
                (_, Some(libc::EOPNOTSUPP)) => XdpError::ModeNotSupported {
                    ifname,
                    mode,
                    source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
                },
                (_, Some(e @ (libc::EBUSY | libc::EEXIST))) => XdpError::InterfaceBusy {
                    holder: describe_holders(&ifname),
                    ifname,
                    source: io::Error::from_raw_os_error(e),
                },
                _ => XdpError::Attach {
                    ifname,
                    mode,
                    source,
                },
            }
        })?;
        let link = prog.take_link(id).map_err(|source| XdpError::Attach {
            ifname: ifname.to_string(),
            mode,
            source,
        })?;
        self.link = Some(link);
        Ok(mode)
    }

    /// The interface and mode the program is attached to, if it is.
    pub fn attached(&self) -> Option<(&str, ActiveMode)> {
        self.attached.as_ref().map(|(n, m)| (n.as_str(), *m))
    }

    /// Detaches the program; the interface is left as it was before [`Self::attach`]. Does
    /// nothing when not attached. Dropping the program does the same.
    pub fn detach(&mut self) {
        // Dropping the BPF link detaches it (no pinning is used).
        self.link = None;
        self.attached = None;
    }

    /// Steers every IPv4 TCP packet to `addr:port` (a listener; host byte order). Packets to
    /// the same port on another address of the host stay the kernel's.
    pub fn steer_port(&mut self, addr: Ipv4Addr, port: u16) -> Result<(), XdpError> {
        self.ports
            .insert(listen_key(addr, port), 1, 0)
            .map_err(|e| map_update_error(MAP_PORTS, e))
    }

    /// Stops steering `addr:port`. Returns whether it was steered.
    pub fn unsteer_port(&mut self, addr: Ipv4Addr, port: u16) -> Result<bool, XdpError> {
        map_remove_result(MAP_PORTS, self.ports.remove(&listen_key(addr, port)))
    }

    /// Steers the packets of one connection (see [`FourTuple`] for the direction).
    pub fn steer_flow(&mut self, flow: FourTuple) -> Result<(), XdpError> {
        self.flows
            .insert(flow.key(), 1, 0)
            .map_err(|e| map_update_error(MAP_FLOWS, e))
    }

    /// Stops steering one connection. Returns whether it was steered.
    pub fn unsteer_flow(&mut self, flow: FourTuple) -> Result<bool, XdpError> {
        map_remove_result(MAP_FLOWS, self.flows.remove(&flow.key()))
    }

    /// Makes `fd` the AF_XDP socket for RX queue `queue`: steered packets arriving on that
    /// queue go to it. The socket must already be bound (`bind(2)` with `sockaddr_xdp`) to the
    /// attached interface and to the same queue, else the kernel drops the redirected packets.
    /// The map does not keep the socket open: closing it removes it from the map (the kernel's
    /// `xsk_release`), and steered packets of that queue then go to the kernel (counted
    /// `no_socket`); what this program records as bound is what was asked of it, not that.
    pub fn bind_socket(&mut self, queue: u32, fd: RawFd) -> Result<(), XdpError> {
        if queue >= MAX_QUEUES {
            return Err(XdpError::QueueOutOfRange { queue });
        }
        self.xsks
            .set(queue, fd, 0)
            .map_err(|e| match map_errno(&e) {
                Some(code @ (libc::EOPNOTSUPP | libc::ENOTSOCK | libc::EBADF | libc::EINVAL)) => {
                    XdpError::InvalidSocket {
                        fd,
                        source: io::Error::from_raw_os_error(code),
                    }
                }
                _ => map_update_error(MAP_XSKS, e),
            })?;
        self.bound |= 1 << queue;
        Ok(())
    }

    /// Removes the socket of RX queue `queue` (steered packets on it then go to the kernel).
    /// Returns whether one was bound.
    pub fn unbind_socket(&mut self, queue: u32) -> Result<bool, XdpError> {
        if queue >= MAX_QUEUES {
            return Err(XdpError::QueueOutOfRange { queue });
        }
        let was_bound = self.bound & (1 << queue) != 0;
        match self.xsks.unset(queue) {
            Ok(()) => {}
            Err(e) if map_errno(&e) == Some(libc::ENOENT) => {}
            Err(e) => return Err(map_update_error(MAP_XSKS, e)),
        }
        self.bound &= !(1 << queue);
        Ok(was_bound)
    }

    /// How many connections `steer_flows` holds (its size in the kernel: see
    /// [`SteeringProgram::load_sized`]).
    pub fn flow_capacity(&self) -> Result<u32, XdpError> {
        self.flows
            .map()
            .info()
            .map(|i| i.max_entries())
            .map_err(|source| XdpError::Map {
                map: MAP_FLOWS,
                source,
            })
    }

    /// The counters summed over all CPUs.
    pub fn counters(&self) -> Result<Counters, XdpError> {
        let sum = |slot: u32| -> Result<u64, XdpError> {
            let values = self
                .counters
                .get(&slot, 0)
                .map_err(|source| XdpError::Map {
                    map: MAP_COUNTERS,
                    source,
                })?;
            Ok(values.iter().fold(0u64, |a, v| a.wrapping_add(*v)))
        };
        Ok(Counters {
            redirected: sum(COUNTER_REDIRECTED)?,
            passed: sum(COUNTER_PASSED)?,
            no_socket: sum(COUNTER_NO_SOCKET)?,
            icmp_redirected: sum(COUNTER_ICMP_REDIRECTED)?,
            fragments_dropped: sum(COUNTER_FRAGMENT_DROPPED)?,
        })
    }
}

impl Drop for SteeringProgram {
    fn drop(&mut self) {
        self.detach();
    }
}

fn map_update_error(map: &'static str, e: MapError) -> XdpError {
    match map_errno(&e) {
        Some(libc::E2BIG) | Some(libc::ENOSPC) => XdpError::MapFull(map),
        Some(libc::EPERM) | Some(libc::EACCES) => XdpError::PermissionDenied {
            op: "updating a BPF map",
        },
        _ => XdpError::Map { map, source: e },
    }
}

/// `Ok(true)` when removed, `Ok(false)` when the key was absent.
fn map_remove_result(map: &'static str, r: Result<(), MapError>) -> Result<bool, XdpError> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if map_errno(&e) == Some(libc::ENOENT) => Ok(false),
        Err(MapError::KeyNotFound | MapError::ElementNotFound) => Ok(false),
        Err(e) => Err(map_update_error(map, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With no process holding the interface, the hint names every way a program can hold
    /// it and the command that frees each: `xdp off` alone left a generic program attached
    /// (netlink picks the native mode), cannot remove a pinned link, and pointed at the wrong
    /// device when one above it held the program.
    #[test]
    fn an_unheld_interface_is_told_how_each_kind_of_program_is_removed() {
        let hint = describe_holders("nosuchif0");
        for what in ["xdp off", "xdpgeneric off", "bpftool link detach", "bond"] {
            assert!(hint.contains(what), "{what}: {hint}");
        }
    }

    /// Only a kernel before 5.18 is told it lacks `xdp.frags`: the release strings of the
    /// kernels it runs on parse to their major and minor numbers.
    #[test]
    fn kernel_releases_parse_to_major_and_minor() {
        assert_eq!(parse_release("6.1.0-57-amd64\n"), Some((6, 1)));
        assert_eq!(parse_release("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(parse_release("6.18.2"), Some((6, 18)));
        assert_eq!(parse_release("garbage"), None);
    }

    #[test]
    fn flow_key_is_network_order() {
        let t = FourTuple {
            saddr: Ipv4Addr::new(10, 77, 0, 2),
            daddr: Ipv4Addr::new(10, 77, 0, 1),
            sport: 0x1234,
            dport: 4791,
        };
        assert_eq!(
            t.key(),
            [
                10,
                77,
                0,
                2,
                10,
                77,
                0,
                1,
                0x12,
                0x34,
                (4791 >> 8) as u8,
                (4791 & 0xff) as u8
            ]
        );
        assert_eq!(port_key(0x0102), [1, 2]);
    }

    #[test]
    fn listen_key_is_network_order() {
        assert_eq!(
            listen_key(Ipv4Addr::new(10, 77, 0, 1), 0x1234),
            [10, 77, 0, 1, 0x12, 0x34, 0, 0]
        );
    }

    #[test]
    fn steering_program_is_send() {
        fn send<T: Send>() {}
        send::<SteeringProgram>();
    }

    #[test]
    fn counters_since() {
        let a = Counters {
            redirected: 5,
            passed: 10,
            no_socket: 1,
            icmp_redirected: 3,
            fragments_dropped: 2,
        };
        let b = Counters {
            redirected: 7,
            passed: 15,
            no_socket: 1,
            icmp_redirected: 4,
            fragments_dropped: 5,
        };
        assert_eq!(
            b.since(&a),
            Counters {
                redirected: 2,
                passed: 5,
                no_socket: 0,
                icmp_redirected: 1,
                fragments_dropped: 3,
            }
        );
    }

    #[test]
    fn bad_interface_names_are_rejected_without_panic() {
        for name in ["", "a\0b", "x/y", "this-name-is-too-long0", "sp ace"] {
            assert!(!valid_ifname(name), "{name:?}");
        }
        assert!(valid_ifname("iwa0"));
    }

    #[test]
    fn object_has_both_programs_and_all_maps() {
        // Parsing needs no privileges.
        let obj = aya_obj_names(OBJECT);
        for name in [
            PROG,
            PROG_FRAGS,
            MAP_PORTS,
            MAP_FLOWS,
            MAP_XSKS,
            MAP_COUNTERS,
        ] {
            assert!(obj.iter().any(|n| n == name), "missing {name} in {obj:?}");
        }
    }

    /// Symbol names of the ELF object (a crude check that needs no BPF privileges).
    fn aya_obj_names(obj: &[u8]) -> Vec<String> {
        let mut names = Vec::new();
        for w in obj.split(|b| *b == 0) {
            if let Ok(s) = std::str::from_utf8(w) {
                if !s.is_empty() && s.chars().all(|c| c.is_ascii_graphic()) {
                    names.push(s.to_string());
                }
            }
        }
        names
    }
}
