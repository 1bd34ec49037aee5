//! The adaption exchange (draft section 4): the initiator sends phase 0, the responder checks
//! it and answers with phase 1, the initiator checks that; each side then knows how its frames
//! are built and how the peer's are read ([`Negotiated`]). Sans-IO, like MPA's startup: octets
//! and time in, octets and outcomes out, a deadline for the whole exchange.
//!
//! Section 4 also says the indication MUST NOT be the first offer of RDDP: the ULP or the port
//! has agreed on it before. Here that agreement is configuration on both ends (the
//! application asks for IFT); an MPA peer answers with an MPA frame, which fails the exchange
//! at once with [`IftError::BadMagic`] naming MPA.

use std::time::{Duration, Instant};

use crate::error::IftError;
use crate::frame::FrameFormat;
use crate::wire::{IndicationRepr, Phase, BC_VERSION, INDICATION_LEN, VERSION};

/// What we accept of the peer's CRC choices (HC, PC, IH, IP; section 4.2: a choice the
/// receiver finds unacceptable aborts the connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CrcPolicy {
    /// The peer's frames must carry a header CRC.
    pub require_header_crc: bool,
    /// The peer's frames must carry a payload CRC.
    pub require_payload_crc: bool,
    /// The peer must check the CRCs we send (no IH while we send header CRCs, no IP while we
    /// send payload CRCs).
    pub require_checked: bool,
}

/// One end's side of the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IftConfig {
    /// R: RDMA mode (both ends must agree).
    pub rdma: bool,
    /// HC: our frames carry a header CRC.
    pub header_crc: bool,
    /// PC: our frames carry a payload CRC.
    pub payload_crc: bool,
    /// We check the CRCs the peer's frames carry (false: we say IH and IP).
    pub check_crcs: bool,
    /// What we accept of the peer's CRC choices.
    pub accept: CrcPolicy,
    /// SP: the peer may place our frames speculatively (section 8).
    pub allow_speculative: bool,
    /// Our VTag: the peer puts it in every frame it sends us. Draw it from a good random
    /// source (section 4.2): it makes a stale or stray frame unlikely to pass.
    pub vtag: u16,
    /// The exchange must end within this.
    pub timeout: Duration,
}

impl IftConfig {
    /// Both CRCs sent and checked, any choice of the peer accepted, RDMA mode, speculative
    /// placement allowed, a 10 s deadline, and `vtag`.
    pub fn with_vtag(vtag: u16) -> IftConfig {
        IftConfig {
            rdma: true,
            header_crc: true,
            payload_crc: true,
            check_crcs: true,
            accept: CrcPolicy::default(),
            allow_speculative: true,
            vtag,
            timeout: Duration::from_secs(10),
        }
    }

    /// Our indication of `phase`. We never offer Markers (SM, RM clear, interval 0): the
    /// draft leaves them to be defined, and by section 4.2's rule none then flow either way.
    pub fn indication(&self, phase: Phase) -> IndicationRepr {
        IndicationRepr {
            version: VERSION,
            bc_version: BC_VERSION,
            phase,
            rdma: self.rdma,
            header_crc: self.header_crc,
            payload_crc: self.payload_crc,
            ignores_header_crc: !self.check_crcs,
            ignores_payload_crc: !self.check_crcs,
            speculative: self.allow_speculative,
            sends_markers: false,
            wants_markers: false,
            vtag: self.vtag,
            marker_interval: 0,
        }
    }
}

/// What the exchange agreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// RDMA mode (both set R) or DDP mode (both clear).
    pub rdma: bool,
    /// Our frames: our HC and PC, the peer's VTag.
    pub tx: FrameFormat,
    /// The peer's frames: its HC and PC, our VTag, and whether we check their CRCs.
    pub rx: FrameFormat,
    /// We may place the peer's frames speculatively (it set SP).
    pub may_speculate: bool,
    /// The peer's protocol version.
    pub peer_version: u16,
}

/// Applies section 4.2's rules to the peer's indication.
fn negotiate(ours: &IftConfig, peer: &IndicationRepr) -> Result<Negotiated, IftError> {
    if peer.rdma != ours.rdma {
        return Err(IftError::ModeMismatch {
            ours: ours.rdma,
            theirs: peer.rdma,
        });
    }
    let policy = ours.accept;
    if policy.require_header_crc && !peer.header_crc {
        return Err(IftError::Unacceptable(
            "its frames carry no header CRC (HC clear) and we require one",
        ));
    }
    if policy.require_payload_crc && !peer.payload_crc {
        return Err(IftError::Unacceptable(
            "its frames carry no payload CRC (PC clear) and we require one",
        ));
    }
    if policy.require_checked
        && ((ours.header_crc && peer.ignores_header_crc)
            || (ours.payload_crc && peer.ignores_payload_crc))
    {
        return Err(IftError::Unacceptable(
            "it ignores CRCs we send (IH or IP set) and we require them checked",
        ));
    }
    Ok(Negotiated {
        rdma: ours.rdma,
        tx: FrameFormat {
            header_crc: ours.header_crc,
            payload_crc: ours.payload_crc,
            vtag: peer.vtag,
            verify: false,
        },
        rx: FrameFormat {
            header_crc: peer.header_crc,
            payload_crc: peer.payload_crc,
            vtag: ours.vtag,
            verify: ours.check_crcs,
        },
        may_speculate: peer.speculative,
        peer_version: peer.version,
    })
}

/// Gathers the 64 octets of one indication from pieces.
#[derive(Debug, Clone)]
struct Reader {
    got: [u8; INDICATION_LEN],
    len: usize,
}

impl Reader {
    fn new() -> Reader {
        Reader {
            got: [0; INDICATION_LEN],
            len: 0,
        }
    }

    /// Takes what it still needs of `bytes`; returns how many and, once whole, the parse.
    fn take(&mut self, bytes: &[u8]) -> (usize, Option<Result<IndicationRepr, IftError>>) {
        let n = (INDICATION_LEN - self.len).min(bytes.len());
        self.got[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
        // The magic number is known after four octets: an MPA peer fails at once.
        if self.len >= 4 && self.len < INDICATION_LEN {
            let magic = u32::from_be_bytes([self.got[0], self.got[1], self.got[2], self.got[3]]);
            if magic != crate::wire::MAGIC {
                return (n, Some(Err(IftError::BadMagic { found: magic })));
            }
        }
        if self.len < INDICATION_LEN {
            return (n, None);
        }
        (n, IndicationRepr::parse_bytes(&self.got))
    }
}

fn deadline(now: Instant, timeout: Duration) -> Option<Instant> {
    now.checked_add(timeout)
}

#[derive(Debug, Clone)]
enum State {
    Awaiting(Reader),
    Done,
    Failed(IftError),
}

impl State {
    fn check_open(&self) -> Result<(), IftError> {
        match self {
            State::Awaiting(_) => Ok(()),
            State::Done => Err(IftError::Local("the exchange is over")),
            State::Failed(e) => Err(e.clone()),
        }
    }
}

/// One side's exchange: its config, deadline and progress.
#[derive(Debug, Clone)]
struct Exchange {
    cfg: IftConfig,
    deadline: Option<Instant>,
    state: State,
}

impl Exchange {
    fn new(cfg: IftConfig, now: Instant) -> Exchange {
        Exchange {
            deadline: deadline(now, cfg.timeout),
            cfg,
            state: State::Awaiting(Reader::new()),
        }
    }

    /// Reads the peer's indication of phase `expected` from `bytes`, negotiating once it is
    /// whole.
    fn feed(
        &mut self,
        expected: Phase,
        bytes: &[u8],
        now: Instant,
    ) -> Result<(usize, Option<Negotiated>), IftError> {
        self.state.check_open()?;
        if self.deadline.is_some_and(|d| now >= d) {
            self.state = State::Failed(IftError::StartupTimeout);
            return Err(IftError::StartupTimeout);
        }
        let State::Awaiting(reader) = &mut self.state else {
            return Err(IftError::Local("the exchange is over"));
        };
        let (used, parsed) = reader.take(bytes);
        let outcome = match parsed {
            None => return Ok((used, None)),
            Some(Err(e)) => Err(e),
            Some(Ok(peer)) if peer.phase != expected => Err(IftError::WrongPhase {
                expected: expected.number(),
                found: peer.phase.number(),
            }),
            Some(Ok(peer)) => negotiate(&self.cfg, &peer),
        };
        match outcome {
            Ok(n) => {
                self.state = State::Done;
                Ok((used, Some(n)))
            }
            Err(e) => {
                self.state = State::Failed(e.clone());
                Err(e)
            }
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        matches!(self.state, State::Awaiting(_))
            .then_some(self.deadline)
            .flatten()
    }

    fn handle_timeout(&mut self, now: Instant) -> Result<(), IftError> {
        match &self.state {
            State::Awaiting(_) if self.deadline.is_some_and(|d| now >= d) => {
                self.state = State::Failed(IftError::StartupTimeout);
                Err(IftError::StartupTimeout)
            }
            State::Failed(e) => Err(e.clone()),
            _ => Ok(()),
        }
    }
}

/// The initiator (node A): sends phase 0, reads and checks phase 1.
#[derive(Debug, Clone)]
pub struct Initiator {
    exchange: Exchange,
    indication: [u8; INDICATION_LEN],
}

impl Initiator {
    /// Builds our phase 0 indication; the exchange must end by `now + cfg.timeout`.
    pub fn new(cfg: IftConfig, now: Instant) -> Initiator {
        Initiator {
            indication: cfg.indication(Phase::Zero).to_bytes(),
            exchange: Exchange::new(cfg, now),
        }
    }

    /// The phase 0 indication to send.
    pub fn indication(&self) -> &[u8] {
        &self.indication
    }

    /// Consumes octets of the responder's phase 1 indication, never more: returns how many
    /// were used (octets after it are frames) and, once it is whole and acceptable, what was
    /// agreed. An error is final and repeated by later calls.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        now: Instant,
    ) -> Result<(usize, Option<Negotiated>), IftError> {
        self.exchange.feed(Phase::One, bytes, now)
    }

    /// When [`Initiator::handle_timeout`] must be called, while the exchange goes on.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.exchange.poll_timeout()
    }

    /// Fails the exchange with [`IftError::StartupTimeout`] once its deadline has passed.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), IftError> {
        self.exchange.handle_timeout(now)
    }
}

/// The responder (node B): reads and checks phase 0, answers with phase 1.
#[derive(Debug, Clone)]
pub struct Responder {
    exchange: Exchange,
}

impl Responder {
    /// Waits for the initiator's phase 0 until `now + cfg.timeout`.
    pub fn new(cfg: IftConfig, now: Instant) -> Responder {
        Responder {
            exchange: Exchange::new(cfg, now),
        }
    }

    /// Consumes octets of the initiator's phase 0 indication, never more. Once it is whole and
    /// acceptable: what was agreed and our phase 1 indication to send (frames may follow it at
    /// once). An error is final and repeated by later calls; the connection is then closed
    /// without an answer (section 4.2: abort).
    #[allow(clippy::type_complexity)]
    pub fn feed(
        &mut self,
        bytes: &[u8],
        now: Instant,
    ) -> Result<(usize, Option<(Negotiated, [u8; INDICATION_LEN])>), IftError> {
        let (used, n) = self.exchange.feed(Phase::Zero, bytes, now)?;
        let reply = || self.exchange.cfg.indication(Phase::One).to_bytes();
        Ok((used, n.map(|n| (n, reply()))))
    }

    /// When [`Responder::handle_timeout`] must be called, while the exchange goes on.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.exchange.poll_timeout()
    }

    /// Fails the exchange with [`IftError::StartupTimeout`] once its deadline has passed.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), IftError> {
        self.exchange.handle_timeout(now)
    }
}
