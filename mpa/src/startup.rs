//! The MPA startup phase: the Request/Reply exchange of RFC 5044 section 7.1.2 with the
//! enhanced (RFC 6581) IRD/ORD and peer-to-peer RTR negotiation.
//!
//! [`Initiator`] sends the Request and reads the Reply; [`Responder`] reads the Request and,
//! once its ULP has looked at the private data, accepts or rejects. Both consume exactly the
//! frame they wait for: octets after it are FPDUs and belong to the [`FpduDecoder`]. Both are
//! sans-IO: octets in, octets out, and time passed in as [`Instant`].
//!
//! Rules applied:
//! - Keys are checked as they arrive (wrong Key: [`MpaError::InvalidKey`], code 4).
//! - PD_Length above 512 or above [`MpaConfig::max_private_data`] closes (code 4).
//! - Rev 0 (RDMA Consortium framing) is refused, code 4: this stack only speaks version 1
//!   DDP/RDMAP (RFC 5044 appendix C, "non-permissive"). A Rev 1 Request gets a Rev 1 Reply
//!   without the RFC 6581 block; Rev 2 with S=1 gets a Rev 2 Reply with it (RFC 6581 section
//!   10). A Request with a revision above 2 is answered as Rev 2.
//! - CRCs are used if either side sent C=1 (RFC 5044 section 7.1.1 "C"); Markers are inserted
//!   towards a side that sent M=1 ("M").
//! - IRD/ORD (RFC 6581 section 9.1): the Responder sets its ORD to at most the Initiator's
//!   IRD and replies with its actual IRD and ORD; the Initiator needs an IRD of at least the
//!   Responder's ORD (else [`MpaError::InsufficientIrd`], code 6) and lowers its ORD to at
//!   most the Responder's IRD. 0x3FFF means "do not negotiate": it is echoed and the local
//!   value is kept.
//! - RTR (RFC 6581 section 9.2): an Initiator with `peer_to_peer` flags every RTR type it
//!   can send; the Responder echoes A and picks exactly one common type (preferring a
//!   zero-length Write, then Read, then Send), or, with none in common, offers the types it
//!   supports; an Initiator that can send none of the offered types fails with
//!   [`MpaError::NoMatchingRtr`] and sends a Terminate with code 7
//!   ([`Initiator::terminate_encoder`]), as it does with code 6 for an IRD it cannot give.
//!
//! [`FpduDecoder`]: crate::FpduDecoder

use std::time::{Duration, Instant};

use crate::wire::{
    EnhancedParams, FrameKind, MpaFrameRepr, ENHANCED_PARAMS_LEN, FRAME_HEADER_LEN,
    IRD_ORD_NO_NEGOTIATION, KEY_LEN, MAX_PRIVATE_DATA,
};
use crate::{FpduDecoder, FpduEncoder, MpaError};

/// Local settings for the startup exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaConfig {
    /// MPA revision to use: 1 (RFC 5044) or 2 (RFC 6581, sends the IRD/ORD block with S=1).
    /// A Responder configured with 1 refuses enhanced Requests. Default 2.
    pub rev: u8,
    /// The C bit we send: we want CRCs. RFC 5044 section 4.4 requires this to default to
    /// true; only an administrator should turn it off. Default true.
    pub crc: bool,
    /// The M bit we send: we want to receive Markers. Default false.
    pub markers: bool,
    /// Our IRD (inbound RDMA Read queue depth), at most 0x3FFF (which means "do not
    /// negotiate"). Default 16.
    pub ird: u16,
    /// Our ORD (outbound RDMA Read queue depth), at most 0x3FFF. Default 16.
    pub ord: u16,
    /// Initiator: ask for the peer-to-peer model, with an RTR message (RFC 6581 section 9.2).
    /// Default false.
    pub peer_to_peer: bool,
    /// RTR as a zero-length Send is supported (Initiator: can send; Responder: can accept).
    /// Default true.
    pub rtr_send: bool,
    /// RTR as a zero-length RDMA Write is supported. Default true.
    pub rtr_write: bool,
    /// RTR as a zero-length RDMA Read is supported. Default true.
    pub rtr_read: bool,
    /// The most private data (PD_Length, RFC 6581 block included) accepted from the peer;
    /// never more than 512. Default 512.
    pub max_private_data: usize,
    /// How long the startup may take before it fails (RFC 5044 section 7.1.2 rules 8 and 10);
    /// for a peer-to-peer Responder, also how long after its accept the Initiator's RTR may
    /// take ([`MpaError::RtrTimeout`], RFC 6581 section 5; the transports keep that deadline).
    /// Default 10 s.
    pub timeout: Duration,
    /// Responder: how long a valid Request may wait for the ULP's accept or reject before the
    /// connection fails with [`MpaError::AcceptTimeout`], so that a peer whose Request nobody
    /// answers holds nothing for good. Counted from the Request's arrival. Default 10 s.
    pub accept_timeout: Duration,
    /// Responder: hold our first FPDU until the Initiator's first one arrived (RFC 5044
    /// section 7.1.2 rule 4). Default true. Linux siw's responder does not wait, and siw as
    /// rdma_cm Initiator asks for no RTR when the ULP requested no RDMA Reads (IRD = ORD = 0,
    /// no peer-to-peer flag), so a ULP whose responder speaks first (perftest's write-lat)
    /// needs false to meet it.
    pub responder_waits_for_fpdu: bool,
}

impl Default for MpaConfig {
    fn default() -> Self {
        MpaConfig {
            rev: 2,
            crc: true,
            markers: false,
            ird: 16,
            ord: 16,
            peer_to_peer: false,
            rtr_send: true,
            rtr_write: true,
            rtr_read: true,
            max_private_data: MAX_PRIVATE_DATA,
            timeout: Duration::from_secs(10),
            accept_timeout: Duration::from_secs(10),
            responder_waits_for_fpdu: true,
        }
    }
}

impl MpaConfig {
    fn validate(&self) -> Result<(), MpaError> {
        if !(1..=2).contains(&self.rev) {
            return Err(MpaError::Local("MpaConfig::rev must be 1 or 2"));
        }
        if self.ird > IRD_ORD_NO_NEGOTIATION || self.ord > IRD_ORD_NO_NEGOTIATION {
            return Err(MpaError::Local("MpaConfig IRD/ORD must fit in 14 bits"));
        }
        Ok(())
    }

    fn supported_rtr(&self) -> RtrOptions {
        RtrOptions {
            send: self.rtr_send,
            write: self.rtr_write,
            read: self.rtr_read,
        }
    }

    fn receive_cap(&self) -> usize {
        self.max_private_data.min(MAX_PRIVATE_DATA)
    }
}

/// The message the Initiator sends as its Ready-to-Receive indication in the peer-to-peer
/// model (RFC 6581 section 9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtrKind {
    /// A zero-length Send (flag B).
    Send,
    /// A zero-length RDMA Write (flag C).
    Write,
    /// A zero-length RDMA Read Request (flag D).
    Read,
}

/// A set of RTR kinds, as carried by flags B, C and D.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct RtrOptions {
    send: bool,
    write: bool,
    read: bool,
}

impl RtrOptions {
    fn of(params: &EnhancedParams) -> RtrOptions {
        RtrOptions {
            send: params.rtr_send,
            write: params.rtr_write,
            read: params.rtr_read,
        }
    }

    fn intersect(self, other: RtrOptions) -> RtrOptions {
        RtrOptions {
            send: self.send && other.send,
            write: self.write && other.write,
            read: self.read && other.read,
        }
    }

    /// Our preference: a zero-length Write needs neither a receive buffer nor an IRD slot,
    /// a Read needs an IRD slot, a Send a posted receive.
    fn preferred(self) -> Option<RtrKind> {
        if self.write {
            Some(RtrKind::Write)
        } else if self.read {
            Some(RtrKind::Read)
        } else if self.send {
            Some(RtrKind::Send)
        } else {
            None
        }
    }

    fn only(kind: RtrKind) -> RtrOptions {
        RtrOptions {
            send: kind == RtrKind::Send,
            write: kind == RtrKind::Write,
            read: kind == RtrKind::Read,
        }
    }

    fn apply(self, params: &mut EnhancedParams) {
        params.rtr_send = self.send;
        params.rtr_write = self.write;
        params.rtr_read = self.read;
    }
}

/// The outcome of a successful startup: how Full Operation runs on this side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// The MPA revision in use (the Reply's).
    pub rev: u8,
    /// CRCs are generated and checked: either side sent C=1.
    pub crc: bool,
    /// We insert Markers in what we send: the peer sent M=1.
    pub markers_tx: bool,
    /// We receive Markers: we sent M=1.
    pub markers_rx: bool,
    /// Our IRD after negotiation (0x3FFF: left to the ULP).
    pub ird: u16,
    /// Our ORD after negotiation (0x3FFF: left to the ULP).
    pub ord: u16,
    /// Peer-to-peer model: the RTR message the Initiator sends first (the Initiator must send
    /// it before anything else; the Responder should expect it). `None`: client-server.
    pub rtr: Option<RtrKind>,
    /// True on the Responder: it must receive and validate one FPDU before it sends any FPDU
    /// or Marker (RFC 5044 section 7.1.2 rule 4).
    pub responder_waits_for_fpdu: bool,
    /// The peer's RFC 6581 block as received, to be passed to the ULP (section 9.1).
    pub peer_params: Option<EnhancedParams>,
}

impl Negotiated {
    /// An encoder for our sending direction, at SeqStart.
    pub fn encoder(&self) -> FpduEncoder {
        FpduEncoder::new(self.crc, self.markers_tx)
    }

    /// A decoder for our receiving direction, at SeqStart.
    pub fn decoder(&self) -> FpduDecoder {
        FpduDecoder::new(self.crc, self.markers_rx)
    }
}

/// Accumulates one Request or Reply frame from the stream without reading past it.
#[derive(Debug, Clone)]
struct FrameReader {
    kind: FrameKind,
    max_private_data: usize,
    buf: Vec<u8>,
}

impl FrameReader {
    fn new(kind: FrameKind, max_private_data: usize) -> FrameReader {
        FrameReader {
            kind,
            max_private_data,
            buf: Vec::with_capacity(FRAME_HEADER_LEN),
        }
    }

    /// Octets the complete frame has, once the fixed part is in.
    fn frame_len(&self) -> Option<usize> {
        match self.buf.get(KEY_LEN + 2..FRAME_HEADER_LEN) {
            Some(&[hi, lo]) => Some(FRAME_HEADER_LEN + usize::from(u16::from_be_bytes([hi, lo]))),
            _ => None,
        }
    }

    /// Takes what it needs from `bytes`; returns the octets consumed and whether the frame
    /// is complete.
    fn feed(&mut self, bytes: &[u8]) -> Result<(usize, bool), MpaError> {
        let mut consumed = 0;
        if self.buf.len() < FRAME_HEADER_LEN {
            let take = (FRAME_HEADER_LEN - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(bytes.get(..take).unwrap_or(&[]));
            consumed = take;
            // RFC 5044 7.1.2 rule 5: check the Key; no need to wait for all of it.
            let key_part = self.buf.len().min(KEY_LEN);
            if self.buf.get(..key_part) != self.kind.key().get(..key_part) {
                return Err(MpaError::InvalidKey);
            }
            let Some(frame_len) = self.frame_len() else {
                return Ok((consumed, false));
            };
            let pd_len = frame_len - FRAME_HEADER_LEN;
            if pd_len > self.max_private_data {
                return Err(MpaError::PrivateDataTooLong {
                    len: pd_len,
                    max: self.max_private_data,
                });
            }
            self.buf.reserve_exact(pd_len);
        }
        let frame_len = self.frame_len().unwrap_or(FRAME_HEADER_LEN);
        let rest = bytes.get(consumed..).unwrap_or(&[]);
        let take = frame_len.saturating_sub(self.buf.len()).min(rest.len());
        self.buf.extend_from_slice(rest.get(..take).unwrap_or(&[]));
        consumed += take;
        Ok((consumed, self.buf.len() == frame_len))
    }

    fn repr(&self) -> Result<MpaFrameRepr<'_>, MpaError> {
        MpaFrameRepr::parse_bytes(&self.buf)
    }
}

fn deadline(now: Instant, timeout: Duration) -> Option<Instant> {
    now.checked_add(timeout)
}

fn timed_out(deadline: Option<Instant>, now: Instant) -> bool {
    deadline.is_some_and(|deadline| now >= deadline)
}

/// Checks private data we are to send in a Request or Reply: at most 512 octets with the
/// RFC 6581 block (4 octets, `enhanced`) that comes first (RFC 5044 7.1, RFC 6581 9); more is
/// [`MpaError::Local`]. A responder can check before it answers what [`Responder::accept`]
/// would refuse (`enhanced`: the Request was an enhanced one).
pub fn check_private_data_to_send(private_data: &[u8], enhanced: bool) -> Result<(), MpaError> {
    let block = if enhanced { ENHANCED_PARAMS_LEN } else { 0 };
    if block + private_data.len() > MAX_PRIVATE_DATA {
        return Err(MpaError::Local(
            "private data to send exceeds 512 octets (508 with the RFC 6581 block)",
        ));
    }
    Ok(())
}

/// What [`Initiator::feed`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitiatorEvent {
    /// The Reply is not complete yet.
    NeedMore,
    /// The Responder accepted (R=0): enter Full Operation.
    Accepted {
        /// How Full Operation runs.
        negotiated: Negotiated,
        /// The Responder's ULP private data (after any RFC 6581 block).
        private_data: Vec<u8>,
    },
    /// The Responder rejected (R=1): MPA is left, the TCP connection stays open for the ULP to
    /// close (RFC 5044 section 7.1.2 rule 3).
    Rejected {
        /// The Responder's ULP private data (after any RFC 6581 block).
        private_data: Vec<u8>,
        /// The Responder's RFC 6581 block, if its Reject carried one: its IRD and ORD (a
        /// Responder may name the ORD it needs there) and RTR kinds, which the Initiator
        /// passes to its ULP for a Reject as for an accept (RFC 6581 9.1).
        peer_params: Option<EnhancedParams>,
    },
}

#[derive(Debug, Clone)]
enum InitiatorState {
    AwaitingReply(FrameReader),
    Accepted,
    Rejected,
    Failed(MpaError),
}

/// The Initiator side of the startup (RFC 5044 section 7.1.2): sends the Request, then reads
/// and checks the Reply.
#[derive(Debug, Clone)]
pub struct Initiator {
    config: MpaConfig,
    request: Vec<u8>,
    deadline: Option<Instant>,
    state: InitiatorState,
    /// Set when an accepting Reply failed the RFC 6581 negotiation: (CRC, Markers towards
    /// the Responder), the framing the Terminate goes out in.
    terminate_framing: Option<(bool, bool)>,
}

impl Initiator {
    /// What [`Initiator::new`] refuses, without building anything: a configuration that does
    /// not validate, peer-to-peer negotiation without Rev 2 or without an RTR kind (RFC 6581
    /// 9), private data MPA cannot carry (7.1: 512 octets, 508 with the RFC 6581 block). For a
    /// caller that refuses a connect before it opens a connection.
    pub fn check(config: &MpaConfig, private_data: &[u8]) -> Result<(), MpaError> {
        config.validate()?;
        let enhanced = config.rev >= 2;
        if config.peer_to_peer && config.supported_rtr().preferred().is_none() {
            return Err(MpaError::Local(
                "peer-to-peer needs at least one RTR kind (rtr_send, rtr_write, rtr_read)",
            ));
        }
        if config.peer_to_peer && !enhanced {
            return Err(MpaError::Local("peer-to-peer negotiation needs Rev 2"));
        }
        check_private_data_to_send(private_data, enhanced)
    }

    /// Builds the Request for `config` with the ULP's `private_data` (at most 512 octets, 508
    /// with Rev 2). The startup must finish by `now + config.timeout`.
    pub fn new(
        config: MpaConfig,
        private_data: &[u8],
        now: Instant,
    ) -> Result<Initiator, MpaError> {
        Self::check(&config, private_data)?;
        let enhanced = config.rev >= 2;
        let params = enhanced.then(|| {
            let mut params = EnhancedParams {
                ird: config.ird,
                ord: config.ord,
                peer_to_peer: config.peer_to_peer,
                ..EnhancedParams::default()
            };
            if config.peer_to_peer {
                config.supported_rtr().apply(&mut params);
            }
            params
        });
        let request = MpaFrameRepr {
            kind: FrameKind::Request,
            markers: config.markers,
            crc: config.crc,
            reject: false,
            rev: config.rev,
            enhanced: params,
            private_data,
        }
        .to_vec()?;
        let reader = FrameReader::new(FrameKind::Reply, config.receive_cap());
        Ok(Initiator {
            deadline: deadline(now, config.timeout),
            config,
            request,
            state: InitiatorState::AwaitingReply(reader),
            terminate_framing: None,
        })
    }

    /// The Request frame to send.
    pub fn request(&self) -> &[u8] {
        &self.request
    }

    /// Consumes octets of the Reply, never more: returns how many were used (octets after the
    /// Reply are FPDUs) and what happened. Errors close the connection (codes 4, 6, 7, or 1
    /// for a timeout) and are repeated by later calls.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        now: Instant,
    ) -> Result<(usize, InitiatorEvent), MpaError> {
        let reader = match &mut self.state {
            InitiatorState::AwaitingReply(reader) => reader,
            InitiatorState::Accepted => {
                return Err(MpaError::Local("the Reply was already accepted"))
            }
            InitiatorState::Rejected => return Err(MpaError::Rejected),
            InitiatorState::Failed(error) => return Err(error.clone()),
        };
        if timed_out(self.deadline, now) {
            return Err(self.fail(MpaError::StartupTimeout));
        }
        let (consumed, complete) = match reader.feed(bytes) {
            Ok(progress) => progress,
            Err(error) => return Err(self.fail(error)),
        };
        if !complete {
            return Ok((consumed, InitiatorEvent::NeedMore));
        }
        let outcome = match reader.repr() {
            Ok(reply) => {
                let outcome = Initiator::judge_reply(&self.config, &reply);
                if let Err(MpaError::InsufficientIrd { .. } | MpaError::NoMatchingRtr) = outcome {
                    self.terminate_framing = Some((self.config.crc || reply.crc, reply.markers));
                }
                outcome
            }
            Err(error) => Err(error),
        };
        match outcome {
            Ok((event, state)) => {
                self.state = state;
                Ok((consumed, event))
            }
            Err(error) => Err(self.fail(error)),
        }
    }

    fn fail(&mut self, error: MpaError) -> MpaError {
        self.state = InitiatorState::Failed(error.clone());
        error
    }

    /// After an accepting Reply whose IRD or RTR options this Initiator cannot meet (codes 6
    /// and 7 from [`Initiator::feed`]), the encoder for the Terminate it must send before it
    /// closes (RFC 6581 9.1, 9.2: Layer 2, EType 0 and the code), at SeqStart in the framing
    /// the Reply agreed. `None` after any other outcome: a Reply that failed otherwise leaves
    /// no framing to send in (RFC 5044 7.1.2: the connection just closes).
    pub fn terminate_encoder(&self) -> Option<FpduEncoder> {
        match (&self.state, self.terminate_framing) {
            (InitiatorState::Failed(_), Some((crc, markers))) => {
                Some(FpduEncoder::new(crc, markers))
            }
            _ => None,
        }
    }

    /// RFC 5044 7.1.2 rule 3 and RFC 6581 9.1 to 9.3, from the Initiator's side.
    fn judge_reply(
        config: &MpaConfig,
        reply: &MpaFrameRepr<'_>,
    ) -> Result<(InitiatorEvent, InitiatorState), MpaError> {
        if reply.rev == 0 || reply.rev > config.rev {
            return Err(MpaError::UnsupportedRevision { rev: reply.rev });
        }
        if reply.enhanced.is_some() && config.rev < 2 {
            return Err(MpaError::InvalidFrame(
                "S=1 in a Reply to a Request without the RFC 6581 block",
            ));
        }
        let private_data = reply.private_data.to_vec();
        if reply.reject {
            return Ok((
                InitiatorEvent::Rejected {
                    private_data,
                    peer_params: reply.enhanced,
                },
                InitiatorState::Rejected,
            ));
        }
        let (ird, ord, rtr) = match reply.enhanced {
            // A Responder that answered without the block (Rev 1, or S=0) did not negotiate.
            // RFC 6581 section 10 has an enhanced Responder answer enhanced and an
            // unenhanced one close, and lets the Initiator retry with RFC 5044's startup;
            // we take such a Reply as that startup at once (older Rev 1 peers answer so):
            // our values, the client-server model. Not when we asked for peer-to-peer: an
            // application that needs the Responder free to send first would wait for an RTR
            // nobody agreed to (no compatible RTR model, RFC 6581 9.2).
            None if config.peer_to_peer => return Err(MpaError::NoMatchingRtr),
            None => (config.ird, config.ord, None),
            Some(responder) => Initiator::negotiate(config, &responder)?,
        };
        let negotiated = Negotiated {
            rev: reply.rev,
            crc: config.crc || reply.crc,
            markers_tx: reply.markers,
            markers_rx: config.markers,
            ird,
            ord,
            rtr,
            responder_waits_for_fpdu: false,
            peer_params: reply.enhanced,
        };
        Ok((
            InitiatorEvent::Accepted {
                negotiated,
                private_data,
            },
            InitiatorState::Accepted,
        ))
    }

    /// RFC 6581 9.1 (IRD/ORD) and 9.2 (RTR), Initiator side.
    fn negotiate(
        config: &MpaConfig,
        responder: &EnhancedParams,
    ) -> Result<(u16, u16, Option<RtrKind>), MpaError> {
        let ird = config.ird;
        if responder.ord != IRD_ORD_NO_NEGOTIATION
            && ird != IRD_ORD_NO_NEGOTIATION
            && responder.ord > ird
        {
            return Err(MpaError::InsufficientIrd {
                required: responder.ord,
                available: ird,
            });
        }
        let ord = if responder.ird == IRD_ORD_NO_NEGOTIATION || config.ord == IRD_ORD_NO_NEGOTIATION
        {
            config.ord
        } else {
            config.ord.min(responder.ird)
        };
        let rtr = match (config.peer_to_peer, responder.peer_to_peer) {
            (false, false) => None,
            // The Responder must echo A (RFC 6581 9.2); anything else is no compatible model.
            (true, false) | (false, true) => return Err(MpaError::NoMatchingRtr),
            (true, true) => {
                let common = config.supported_rtr().intersect(RtrOptions::of(responder));
                Some(common.preferred().ok_or(MpaError::NoMatchingRtr)?)
            }
        };
        Ok((ird, ord, rtr))
    }

    /// When [`Initiator::handle_timeout`] must be called if no Reply has arrived; `None` once
    /// the startup is over.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            InitiatorState::AwaitingReply(_) => self.deadline,
            _ => None,
        }
    }

    /// Fails the startup with [`MpaError::StartupTimeout`] if the deadline has passed while
    /// still waiting for the Reply.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), MpaError> {
        match &self.state {
            InitiatorState::AwaitingReply(_) if timed_out(self.deadline, now) => {
                Err(self.fail(MpaError::StartupTimeout))
            }
            InitiatorState::Failed(error) => Err(error.clone()),
            _ => Ok(()),
        }
    }
}

/// The Request as seen by the Responder's ULP, which decides to accept or reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// Rev of the Request.
    pub rev: u8,
    /// M: the Initiator wants Markers from us.
    pub markers: bool,
    /// C: the Initiator wants CRCs.
    pub crc: bool,
    /// The RFC 6581 block (S=1).
    pub enhanced: Option<EnhancedParams>,
    /// The Initiator's ULP private data (after any RFC 6581 block).
    pub private_data: Vec<u8>,
}

#[derive(Debug, Clone)]
enum ResponderState {
    AwaitingRequest(FrameReader),
    RequestReceived(RequestInfo),
    Accepted,
    Rejected,
    Failed(MpaError),
}

/// The Responder side of the startup (RFC 5044 section 7.1.2): reads and checks the Request,
/// then builds the Reply when its ULP accepts or rejects.
#[derive(Debug, Clone)]
pub struct Responder {
    config: MpaConfig,
    deadline: Option<Instant>,
    state: ResponderState,
}

impl Responder {
    /// What [`Responder::new`] refuses, without building anything: a configuration that does
    /// not validate (a `rev` other than 1 or 2, IRD or ORD beyond 14 bits). For a listener,
    /// which refuses it when it is made rather than failing every connection it takes.
    pub fn check(config: &MpaConfig) -> Result<(), MpaError> {
        config.validate()
    }

    /// A Responder waiting for a Request until `now + config.timeout`.
    pub fn new(config: MpaConfig, now: Instant) -> Result<Responder, MpaError> {
        Responder::check(&config)?;
        let reader = FrameReader::new(FrameKind::Request, config.receive_cap());
        Ok(Responder {
            deadline: deadline(now, config.timeout),
            config,
            state: ResponderState::AwaitingRequest(reader),
        })
    }

    /// Consumes octets of the Request, never more: returns how many were used and, once the
    /// Request is complete and valid, what it asks for. Errors close the connection (code 4,
    /// or 1 for a timeout) and are repeated by later calls.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        now: Instant,
    ) -> Result<(usize, Option<RequestInfo>), MpaError> {
        let reader = match &mut self.state {
            ResponderState::AwaitingRequest(reader) => reader,
            ResponderState::RequestReceived(_) | ResponderState::Accepted => {
                return Err(MpaError::Local("the Request was already received"))
            }
            ResponderState::Rejected => return Err(MpaError::Rejected),
            ResponderState::Failed(error) => return Err(error.clone()),
        };
        if timed_out(self.deadline, now) {
            return Err(self.fail(MpaError::StartupTimeout));
        }
        let (consumed, complete) = match reader.feed(bytes) {
            Ok(progress) => progress,
            Err(error) => return Err(self.fail(error)),
        };
        if !complete {
            return Ok((consumed, None));
        }
        let info = match reader.repr() {
            Ok(request) => Responder::judge_request(&self.config, &request),
            Err(error) => Err(error),
        };
        match info {
            Ok(info) => {
                self.deadline = deadline(now, self.config.accept_timeout);
                self.state = ResponderState::RequestReceived(info.clone());
                Ok((consumed, Some(info)))
            }
            Err(error) => Err(self.fail(error)),
        }
    }

    fn fail(&mut self, error: MpaError) -> MpaError {
        self.state = ResponderState::Failed(error.clone());
        error
    }

    /// RFC 5044 7.1.1 "Rev" and RFC 6581 section 10.
    fn judge_request(
        config: &MpaConfig,
        request: &MpaFrameRepr<'_>,
    ) -> Result<RequestInfo, MpaError> {
        if request.rev == 0 {
            return Err(MpaError::UnsupportedRevision { rev: 0 });
        }
        if request.enhanced.is_some() && config.rev < 2 {
            // An unenhanced Responder treats S=1 as improperly formatted (RFC 6581 10).
            return Err(MpaError::InvalidFrame(
                "S=1 Request while enhanced connection setup is disabled",
            ));
        }
        Ok(RequestInfo {
            rev: request.rev,
            markers: request.markers,
            crc: request.crc,
            enhanced: request.enhanced,
            private_data: request.private_data.to_vec(),
        })
    }

    /// RFC 6581 9.1 and 9.2, Responder side: our reply block and the local outcome.
    fn negotiate(
        &self,
        initiator: &EnhancedParams,
    ) -> Result<(EnhancedParams, u16, u16, Option<RtrKind>), MpaError> {
        let config = &self.config;
        // RFC 6581 9.2: one common kind, flagged alone; with none in common, "at least one
        // RTR indication type option it supports": the one we prefer, flagged alone too, since
        // it is the one we get ready for (a Send's zero-length receive, a Read's IRD slot), so
        // an Initiator that sends an RTR sends that one (a correct one, offered only kinds it
        // cannot send, sends a Terminate with code 7); supporting none is a configuration the
        // RFC does not allow an enhanced Responder.
        let (rtr, offered) = if initiator.peer_to_peer {
            let supported = config.supported_rtr();
            let common = supported.intersect(RtrOptions::of(initiator));
            let kind = common
                .preferred()
                .or(supported.preferred())
                .ok_or(MpaError::NoMatchingRtr)?;
            (Some(kind), RtrOptions::only(kind))
        } else {
            (None, RtrOptions::default())
        };
        // Our ORD may not exceed the Initiator's IRD.
        let (reply_ord, ord) =
            if initiator.ird == IRD_ORD_NO_NEGOTIATION || config.ord == IRD_ORD_NO_NEGOTIATION {
                (IRD_ORD_NO_NEGOTIATION, config.ord)
            } else {
                let ord = config.ord.min(initiator.ird);
                (ord, ord)
            };
        // Our IRD is what we really have; a zero-length Read RTR needs at least one slot,
        // negotiated or not.
        let have = if rtr == Some(RtrKind::Read) {
            config.ird.max(1)
        } else {
            config.ird
        };
        let (reply_ird, ird) =
            if initiator.ord == IRD_ORD_NO_NEGOTIATION || config.ird == IRD_ORD_NO_NEGOTIATION {
                (IRD_ORD_NO_NEGOTIATION, have)
            } else {
                (have, have)
            };
        let mut reply = EnhancedParams {
            ird: reply_ird,
            ord: reply_ord,
            peer_to_peer: initiator.peer_to_peer,
            ..EnhancedParams::default()
        };
        offered.apply(&mut reply);
        Ok((reply, ird, ord, rtr))
    }

    fn request(&self) -> Result<&RequestInfo, MpaError> {
        match &self.state {
            ResponderState::RequestReceived(info) => Ok(info),
            ResponderState::Failed(error) => Err(error.clone()),
            ResponderState::Rejected => Err(MpaError::Rejected),
            _ => Err(MpaError::Local("no Request waiting for an answer")),
        }
    }

    fn reply_rev(&self, request: &RequestInfo) -> u8 {
        request.rev.min(self.config.rev)
    }

    /// Sets the IRD and ORD this Responder offers and negotiates with (RFC 6581 9.1) in
    /// place of its configuration's, for the one connection it answers: `rdma_accept`'s
    /// `responder_resources` and `initiator_depth`. Only while the Request waits for an
    /// answer; each at most 0x3FFF ("do not negotiate").
    pub fn set_ird_ord(&mut self, ird: u16, ord: u16) -> Result<(), MpaError> {
        self.request()?;
        let config = MpaConfig {
            ird,
            ord,
            ..self.config.clone()
        };
        config.validate()?;
        self.config = config;
        Ok(())
    }

    /// Accepts the Request: returns the Reply (R=0) to send, carrying `private_data`, and how
    /// Full Operation runs. A peer-to-peer Initiator that offers no RTR kind we support gets
    /// the kinds we do support (RFC 6581 9.2) and answers with a Terminate (code 7); fails
    /// with [`MpaError::NoMatchingRtr`] only when this Responder is configured with no RTR
    /// kind at all.
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(Vec<u8>, Negotiated), MpaError> {
        let request = self.request()?;
        check_private_data_to_send(private_data, request.enhanced.is_some())?;
        let (block, ird, ord, rtr) = match &request.enhanced {
            Some(initiator) => {
                let (block, ird, ord, rtr) = self.negotiate(initiator)?;
                (Some(block), ird, ord, rtr)
            }
            None => (None, self.config.ird, self.config.ord, None),
        };
        let rev = self.reply_rev(request);
        // RFC 5044 7.1.1: if either side sent C=1, both use CRCs. Say so in the Reply too:
        // an Initiator that requires CRCs (Linux siw built with mpa_crc_required, cxgb4)
        // refuses a Reply with C=0 even though the CRC would be used anyway.
        let crc = self.config.crc || request.crc;
        let reply = MpaFrameRepr {
            kind: FrameKind::Reply,
            markers: self.config.markers,
            crc,
            reject: false,
            rev,
            enhanced: block,
            private_data,
        }
        .to_vec()?;
        let negotiated = Negotiated {
            rev,
            crc,
            markers_tx: request.markers,
            markers_rx: self.config.markers,
            ird,
            ord,
            rtr,
            // With an RTR agreed (peer-to-peer, RFC 6581 5), waiting for it is the RTR's
            // whole point, whatever the configuration says for client-server startups.
            responder_waits_for_fpdu: self.config.responder_waits_for_fpdu || rtr.is_some(),
            peer_params: request.enhanced,
        };
        self.state = ResponderState::Accepted;
        Ok((reply, negotiated))
    }

    /// Rejects the Request: returns the Reply (R=1) carrying `private_data`. MPA is left; the
    /// TCP connection stays open for the ULP (RFC 5044 section 7.1.2 rule 2). An enhanced
    /// Request gets our own IRD/ORD and supported RTR kinds in the block (RFC 6581 9.1, 9.2).
    pub fn reject(&mut self, private_data: &[u8]) -> Result<Vec<u8>, MpaError> {
        let request = self.request()?;
        check_private_data_to_send(private_data, request.enhanced.is_some())?;
        let block = request.enhanced.map(|initiator| {
            // RFC 6581 9.1: an Initiator's 0x3FFF ("do not negotiate") is answered with
            // 0x3FFF in the other field, in a Reject as in an accepting Reply.
            let no_value = |theirs: u16, ours: u16| {
                if theirs == IRD_ORD_NO_NEGOTIATION {
                    IRD_ORD_NO_NEGOTIATION
                } else {
                    ours
                }
            };
            let mut block = EnhancedParams {
                ird: no_value(initiator.ord, self.config.ird),
                ord: no_value(initiator.ird, self.config.ord),
                peer_to_peer: initiator.peer_to_peer,
                ..EnhancedParams::default()
            };
            if initiator.peer_to_peer {
                self.config.supported_rtr().apply(&mut block);
            }
            block
        });
        let reply = MpaFrameRepr {
            kind: FrameKind::Reply,
            markers: self.config.markers,
            crc: self.config.crc,
            reject: true,
            rev: self.reply_rev(request),
            enhanced: block,
            private_data,
        }
        .to_vec()?;
        self.state = ResponderState::Rejected;
        Ok(reply)
    }

    /// When [`Responder::handle_timeout`] must be called: while the Request is awaited, and
    /// while it waits for the ULP's answer; `None` once answered.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            ResponderState::AwaitingRequest(_) | ResponderState::RequestReceived(_) => {
                self.deadline
            }
            _ => None,
        }
    }

    /// Fails the startup with [`MpaError::StartupTimeout`] if the deadline has passed while
    /// still waiting for the Request (RFC 5044 section 7.1.2 rule 8: Responder/Responder
    /// startups), or with [`MpaError::AcceptTimeout`] if the ULP left a valid Request
    /// unanswered for [`MpaConfig::accept_timeout`].
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), MpaError> {
        match &self.state {
            ResponderState::AwaitingRequest(_) if timed_out(self.deadline, now) => {
                Err(self.fail(MpaError::StartupTimeout))
            }
            ResponderState::RequestReceived(_) if timed_out(self.deadline, now) => {
                Err(self.fail(MpaError::AcceptTimeout))
            }
            ResponderState::Failed(error) => Err(error.clone()),
            _ => Ok(()),
        }
    }
}
