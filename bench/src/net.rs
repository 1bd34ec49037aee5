//! The transport under the rping- and perftest-compatible modes: the kernel socket transport,
//! or our TCP over AF_XDP (`datapath::engine::XdpEngine`, root only), chosen per run and
//! opened as a `datapath::Device`: the rest of the run uses only the API.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use datapath::{
    CompletionQueue, ConnectParams, Connection, DatapathError, Device, IdleQp, Listener,
    MemoryRegion, Pinning, ProtectionDomain, Transport as DeviceTransport,
};

use datapath::engine::XdpEngineConfig;
use datapath::xsk::Capture;

use crate::cli::XdpMode;
use crate::engine_report::EngineReport;
use crate::pcap::PcapReport;
use crate::Transport;

/// A protection domain for a tool's run: its registrations lock their pages (`mlock`) where the
/// process may, and go on unpinned where it may not (a user without root, whose
/// `RLIMIT_MEMLOCK`, 8 MiB by default, is less than a bandwidth test's buffers), as the
/// socket transport needs no pinning to be correct; [`note_unpinned`] says so once.
pub fn protection_domain() -> ProtectionDomain {
    ProtectionDomain::new().with_pinning(Pinning::BestEffort)
}

/// Says once per process, on stderr, that a region of the run is not pinned: the kernel may
/// page it out under a transfer (results then include the faults).
pub fn note_unpinned(mr: &MemoryRegion) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !mr.is_pinned() && !SAID.swap(true, Ordering::Relaxed) {
        eprintln!(
            "iwarp-bench: warning: registered memory is not pinned (mlock refused: raise the \
             locked-memory limit, `ulimit -l`, or run as root); the run goes on with pageable \
             buffers"
        );
    }
}

/// Opens the API's device of `transport`: for [`Transport::Xdp`] the AF_XDP engine on `iface`
/// with `config`, its steering program attached as `xdp_mode` says (`--xdp-mode`; the
/// engine's default, `auto`, without), its frames captured to `pcap` if given (`--pcap`).
/// Both are refused with a reason for the socket transport, which has neither.
pub fn open_device(
    transport: Transport,
    iface: Option<&str>,
    pcap: Option<&Path>,
    xdp_mode: Option<XdpMode>,
    mut config: Box<XdpEngineConfig>,
) -> Result<(Device, Option<Capture>), String> {
    if transport != Transport::Xdp {
        if xdp_mode.is_some() {
            return Err(
                "--xdp-mode is for --transport xdp (the socket transport runs no XDP)".into(),
            );
        }
        // Refuses --pcap with a reason.
        crate::pcap::start(pcap, transport)?;
        return Ok((Device::socket(), None));
    }
    if let Some(m) = xdp_mode {
        config.driver.attach_mode = m.into();
    }
    let iface = iface.ok_or("--transport xdp needs --iface")?;
    let capture = crate::pcap::start(pcap, transport)?;
    config.driver.xsk.capture = capture.as_ref().map(Capture::tap);
    match Device::open(DeviceTransport::Xdp {
        ifname: iface.to_owned(),
        config,
    }) {
        Ok(d) => Ok((d, capture)),
        Err(e) => {
            // No engine, no frames: leave no empty capture behind, if it is a plain file (not
            // `/dev/stdout`, a pipe or a link, which are not ours to remove).
            if let Some(c) = capture {
                let path = c.path().to_owned();
                drop(c);
                let plain = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file());
                if plain {
                    let _ = std::fs::remove_file(path);
                }
            }
            Err(format!("starting the AF_XDP engine on {iface}: {e}"))
        }
    }
}

/// The chosen transport: a [`Device`] of the API (which holds the engine for `xdp`; it must
/// outlive its queue pairs).
pub struct Net {
    device: Device,
    /// `--pcap`: the engine's frames go to this capture.
    capture: Option<Capture>,
}

impl Net {
    /// Starts the AF_XDP engine on `iface` for [`Transport::Xdp`] (its steering program
    /// attached as `xdp_mode` says, its frames captured to `pcap` if given); nothing for
    /// sockets.
    pub fn start(
        transport: Transport,
        iface: Option<&str>,
        pcap: Option<&Path>,
        xdp_mode: Option<XdpMode>,
    ) -> Result<Self, String> {
        let (device, capture) = open_device(transport, iface, pcap, xdp_mode, Box::default())?;
        Ok(Self { device, capture })
    }

    /// Listens on `port`: on `bind` (socket transport) or the engine's interface address.
    pub fn listen(
        &self,
        bind: &str,
        port: u16,
        params: ConnectParams,
    ) -> Result<(Listener, SocketAddr), String> {
        let ip = bind
            .parse()
            .map_err(|e| format!("bad bind address {bind}: {e}"))?;
        let addr = self.device.listen_addr(ip, port);
        let l = self
            .device
            .listen(addr, params)
            .map_err(|e| format!("listening on {addr}: {e}"))?;
        // The port the listener has (the kernel's choice for port 0).
        let addr = l.local_addr().unwrap_or(addr);
        Ok((l, addr))
    }

    /// One connection attempt (the rdma_cm `connect` step).
    pub fn connect(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
        private_data: &[u8],
    ) -> Result<Connection, DatapathError> {
        self.device.connect(addr, pd, cq, params, private_data)
    }

    /// Connects a queue pair created before (`rdma_connect` after `rdma_create_qp`).
    pub fn connect_qp(
        &self,
        qp: IdleQp,
        addr: SocketAddr,
        private_data: &[u8],
    ) -> Result<Connection, DatapathError> {
        self.device.connect_qp(qp, addr, private_data)
    }

    /// Connects, retrying while nobody listens yet (connection refused or reset), for up to
    /// `patience`, `pause` apart.
    pub fn connect_retrying(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
        patience: Duration,
        pause: Duration,
    ) -> Result<(Connection, u32), DatapathError> {
        let deadline = Instant::now() + patience;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.connect(addr, pd, cq, params, &[]) {
                Ok(c) => return Ok((c, attempts)),
                Err(e) if not_listening(&e) && Instant::now() + pause < deadline => {
                    std::thread::sleep(pause);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Stops the engine (if any) and returns its counters, then finishes the capture (if any)
    /// and returns what it wrote.
    pub fn finish(self) -> (Option<EngineReport>, Option<PcapReport>) {
        let engine = self.device.close().map(|c| EngineReport::new(&c));
        (engine, self.capture.map(PcapReport::finish))
    }
}

/// What a connection's startup agreed on, in a line: MPA's revision, CRC and Markers, or
/// IFT's CRCs each way; then IRD/ORD and the RTR.
pub fn describe_agreed(qp: &datapath::QueuePair) -> String {
    let on = |b: bool| if b { "on" } else { "off" };
    let a = qp.agreed();
    let framing = match a {
        datapath::Agreed::Mpa(n) => format!(
            "MPA rev {}, CRC {}, markers rx {} tx {}, RTR {:?}",
            n.rev,
            on(n.crc),
            on(n.markers_rx),
            on(n.markers_tx),
            n.rtr
        ),
        datapath::Agreed::Ift { negotiated: n, .. } => format!(
            "IFT, header CRC tx {} rx {}, payload CRC tx {} rx {}",
            on(n.tx.header_crc),
            on(n.rx.header_crc),
            on(n.tx.payload_crc),
            on(n.rx.payload_crc)
        ),
    };
    format!("{framing}, IRD {} ORD {}", a.ird(), a.ord())
}

/// The startup's agreement for a JSON report: `framing`, and MPA's fields or IFT's.
pub fn agreed_json(qp: &datapath::QueuePair) -> serde_json::Value {
    match qp.agreed() {
        datapath::Agreed::Mpa(n) => serde_json::json!({
            "framing": "mpa",
            "mpa_rev": n.rev,
            "crc": n.crc,
            "markers_rx": n.markers_rx,
            "markers_tx": n.markers_tx,
        }),
        datapath::Agreed::Ift { negotiated: n, .. } => serde_json::json!({
            "framing": "ift",
            "header_crc_tx": n.tx.header_crc,
            "payload_crc_tx": n.tx.payload_crc,
            "header_crc_rx": n.rx.header_crc,
            "payload_crc_rx": n.rx.payload_crc,
            "crc": n.tx.payload_crc || n.rx.payload_crc,
            "markers_rx": false,
            "markers_tx": false,
        }),
    }
}

/// True for the errors of a peer that is not listening (yet): TCP refused or reset. The AF_XDP
/// engine reports a reset answering its SYN as `ConnectionRefused`, like a kernel socket; a
/// connection lost later during MPA setup (code 1) is retried too.
pub fn not_listening(e: &DatapathError) -> bool {
    match e {
        DatapathError::Mpa(mpa::MpaError::ConnectionLost) => true,
        DatapathError::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
        ),
        _ => false,
    }
}
