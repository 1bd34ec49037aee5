//! One iWARP connection, sans-IO: a `tcp-engine` connection (record transmit, pass-up receive),
//! MPA (startup, then Full Operation) and an [`rdmap::QueuePair`], glued together.
//!
//! Nothing here does I/O or reads a clock. The TCP connection itself is not owned: the caller
//! (the AF_XDP engine's connection table, or a test's simulator) owns it and passes it in, so
//! the same object runs under [`tcp_engine::table::ConnectionTable`] and in `tcp_engine::sim`.
//!
//! **Receive.** Every segment TCP accepts is handed to [`IwarpConn::on_data`] at once, in order
//! or not (`tcp_engine::RxMode::PassUp`):
//!
//! - *In order* (its stream offset is where processing stopped): the bytes go to the MPA
//!   startup machine and then to the in-order [`FpduDecoder`], whose verified ULPDUs go to
//!   [`QueuePair::on_ulpdu`] (placement, delivery, completions).
//! - *Out of order*, in Full Operation: [`FpduLocator`] finds the complete FPDUs the segment
//!   holds (header-aligned guess checked by CRC, Markers, or an FPDU boundary known from
//!   elsewhere: where the FPDU cut by the gap before the segment ends, from its ULPDU_Length
//!   in the in-order decoder or in a held run, draft-ietf-rddp-mpa-01 Appendix 11); each goes to
//!   [`QueuePair::place_early`]. A placed FPDU leaves only a small record (its stream span,
//!   DDP header and payload length) in a bounded table; its bytes are not kept. Everything
//!   else (bytes of FPDUs not complete in the segment, Read Requests and Terminates, which act
//!   only in order, segments where nothing could be located) is kept in the bounded
//!   *reassembly store* until the in-order point reaches it. With a header-aligned sender and
//!   CRCs on, that store stays empty. When a segment joins held octets, or a held run's
//!   framing becomes known, the run is scanned again, so the store keeps only the pieces of
//!   the FPDUs that gaps cut ([`ConnCounters::held_gap_peak`] measures it per gap).
//! - When the in-order point reaches an early-placed FPDU, the decoder is reset past it and
//!   [`QueuePair::on_placed_ulpdu`] runs: checks, delivery and completion happen in order.
//! - A CRC failure places nothing of that FPDU and stops the receive direction: Terminate of
//!   layer 2 (LLP), EType 0, with the MPA code (2 for a CRC mismatch).
//!
//! **Receive window.** Everything held lies between the in-order point and TCP's right window
//! edge, so the window offered to TCP is the store's free room: the store can never overflow
//! for a peer that respects the window. Placed FPDUs need no room at all; if the table of their
//! records is full, their bytes are held instead (never dropped: TCP has committed to them).
//!
//! **Transmit.** [`IwarpConn::poll`] asks the queue pair for DDP segments of at most MULPDU
//! octets (RFC 5044 4.5, from TCP's current EMSS, so an EMSS change takes effect at once). How
//! they reach the wire depends on the TCP connection's transmit mode:
//!
//! - `tcp_engine::TxMode::Source` (the AF_XDP engine): no payload is copied when a segment is
//!   queued. [`QueuePair::poll_transmit_segment`] gives the headers and describes the payload
//!   (STag, TO, length); a descriptor goes into a bounded ring (`tx::TxRing`,
//!   [`ConnConfig::max_tx_fpdus`]) and TCP is told only the FPDU's wire length
//!   (`send_record_len`). When TCP builds a segment, first transmission or retransmission, it
//!   asks [`IwarpConn::fill`] for the octets, which are written straight into the packet
//!   buffer: MPA header, DDP/RDMAP header, payload read from the registered region, PAD,
//!   Markers and the CRC, computed over the octets just written when the segment holds the
//!   whole FPDU (it always does unless a path MTU drop or a re-segmenting peer split it) and
//!   kept for later partial fills. Sends and Writes complete when TCP reports their last octet
//!   acknowledged (`rdmap::TxCompletion::Acknowledged`): the application must not touch the
//!   source before. If the region is gone when a retransmission needs it, the octets the peer
//!   is owed cannot be produced and no Terminate could follow them in the stream, so the TCP
//!   connection is reset (RFC 5040 5.4: the stream is torn down) and
//!   [`ConnEvent::TransmitSourceFailed`] reported; nothing outside a region is ever read.
//!   Read Responses are read from the responder's region too, but the descriptor holds the
//!   region's bytes alive (`RegionBuffer::share`, an `Arc` clone) until the segment is
//!   acknowledged: the responder's application cannot know when that is, so a deregistration
//!   must not break a retransmission (new Reads of the STag fail at once). The data is read
//!   when the segment is sent, as a hardware RNIC does (`tx` module).
//! - `tcp_engine::TxMode::Records` (kept for comparison and for callers driving TCP that way):
//!   each ULPDU is copied out of the region and framed as one FPDU straight into TCP's send
//!   buffer (`send_record_with`, the CRC computed as the octets go in); Sends and Writes
//!   complete when handed to TCP.
//!
//! Either way TCP sends whole FPDUs per segment and retransmits with the same boundaries.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

use ddp::{DdpSegment, UNTAGGED_HEADER_LEN};
use ift::{FrameDecoder, FrameEncoder, IftError};
use mpa::{
    FpduDecoder, FpduEncoder, FpduLocator, Initiator, InitiatorEvent, MpaConfig, MpaError,
    Negotiated, RequestInfo, Responder,
};
use rdmap::QpConfig;
use rdmap::{MemoryTable, PlacedEarly, QpState, QueuePair, RegionBuffer, TerminateCause};
use tcp_engine::{
    Connection as TcpConnection, Event as TcpEvent, Instant, PassedUp, SendError,
    State as TcpState, TakeBack, TxMode, TxSource, TxSourceError,
};

use crate::budget::ReassemblyBudget;
use crate::tx::{ift_frame_len, TxRing};
use crate::written::{PlacementTarget, Written};

/// MPA Markers recur every 512 octets of the stream.
const MARKER_INTERVAL: u64 = 512;
const MARKER_LEN: u64 = 4;
/// Disjoint ranges the reassembly store may hold at once. TCP keeps at most 64 out-of-order
/// ranges, but FPDUs placed early split held runs too: a conforming peer can fill the list
/// (FPDUs that may not be placed early, each between two that are), and octets that would
/// start a range beyond it are given back to TCP (`StoreRefused::TooManyRanges`).
const MAX_STORE_RANGES: usize = 1024;
/// Responder before Full Operation: what its reassembly store may hold. The Initiator sends
/// nothing but its Request (at most 532 octets) until it has the Reply (RFC 5044 7.1.2), so a
/// peer that makes us hold more is cut off; the store takes its full size
/// (`ConnConfig::reassembly_capacity`) in Full Operation. This keeps what a connection costs
/// before any MPA check has passed to a few KiB (with the queue pair's and the transmit
/// ring's buffers, which also wait for Full Operation).
const STARTUP_STORE: usize = 2048;
/// Held ranges allowed in the startup store.
const STARTUP_STORE_RANGES: usize = 8;
/// Longest held range scanned again for FPDUs when a neighbouring segment arrives.
const MAX_RELOCATE: usize = 64 << 10;
/// Most FPDUs placed from one such scan.
const MAX_RELOCATED: usize = 128;
/// Most FPDU spans kept whose end (the next FPDU's start) lies beyond the octets that framed
/// them: one per gap in the stream is needed.
const MAX_CHAINS: usize = 256;
/// Most held runs scanned one after the other by following such spans across gaps.
const MAX_CHAIN_WALK: usize = 8;
/// Most held octets before a located FPDU searched backwards for the FPDUs before it.
const MAX_BACKFILL: u64 = 4096;
/// Held octets a connection may read again (rescans of held runs, backfill's CRC checks) per
/// octet it receives: those reads only place data early, and without a bound a peer that
/// keeps a long run held (FPDUs nobody may place, a ULPDU_Length that never ends) and sends it
/// one octet at a time makes every octet cost a 64 KiB scan. Beyond the credit the scans wait:
/// the held octets are processed in order, as without early placement.
const SCAN_CREDIT_PER_OCTET: u64 = 8;
/// The credit a connection starts with, and the most it keeps.
const SCAN_CREDIT_START: u64 = 256 << 10;
const SCAN_CREDIT_MAX: u64 = 1 << 20;
/// How long the reassembly store stays empty (nothing held, nothing placed early) before
/// the memory it took at the first out-of-order octet (its ring of
/// `ConnConfig::reassembly_capacity` octets, its range list, the scan buffers) is freed. Long
/// enough that a connection losing segments now and then keeps it from one loss to the next;
/// short enough that connections a peer once sent out of order, then left idle, do not each
/// keep a megabyte.
const STORE_IDLE_RELEASE: Duration = Duration::from_secs(1);
/// IFT: most speculative placements awaiting confirmation; beyond them frames are held. Bounds
/// the check of each frame processed in order against them (section 8.2's last rule).
const MAX_UNCONFIRMED: usize = 512;

/// Why a connection closed without a Terminate when its queue pair failed (a refused receive,
/// say) at a time we may send nothing (RFC 5044 7.1.2 rule 4); both transports say it.
pub const UNSENDABLE_TERMINATE: &str =
    "the queue pair failed before the peer's first FPDU, when no Terminate may be sent";

/// How long octets of the peer's may wait beyond a gap it does not fill, by default
/// ([`ConnConfig::held_timeout`]).
pub const DEFAULT_HELD_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of one connection.
#[derive(Debug, Clone)]
pub struct ConnConfig {
    /// MPA startup settings (revision, CRC, Markers, private data limits, IRD/ORD, RTR).
    pub mpa: MpaConfig,
    /// Queue pair parameters (PD, depths, initial IRD/ORD).
    pub qp: QpConfig,
    /// Octets the reassembly store can hold; also the receive window offered to TCP.
    pub reassembly_capacity: usize,
    /// FPDUs placed ahead of the in-order point whose records can be kept at once.
    pub max_placed_fpdus: usize,
    /// Most octets queued in TCP and not yet acknowledged before no more FPDUs are framed:
    /// FPDUs already queued keep their size, so this bounds how long an EMSS change takes to
    /// reach the framing (and how early Sends and Writes complete).
    pub tx_ahead: usize,
    /// FPDUs queued and not yet acknowledged whose descriptors can be kept at once
    /// (`tcp_engine::TxMode::Source`; allocated when the connection is made).
    pub max_tx_fpdus: usize,
    /// IFT framing (draft-williams-iwarp-ift-01) instead of MPA when set: the adaption
    /// exchange replaces the MPA Request and Reply, frames replace FPDUs. Both ends must be
    /// configured for it (section 4: never the first offer of RDDP). `mpa`'s IRD, ORD,
    /// `accept_timeout` still apply; its revision, CRC, Markers, RTR and private data do not
    /// (IFT carries no private data). Frames of an out-of-order segment are placed
    /// speculatively when the peer granted SP and sends header CRCs (`IwarpConn::speculate`);
    /// the rest waits in the reassembly store.
    pub ift: Option<ift::IftConfig>,
    /// In Full Operation, how long data received beyond a gap (held in the reassembly store,
    /// or placed early and not yet delivered) may wait while the in-order point does not move:
    /// then the peer is not filling the gap (its TCP gave up retransmitting, or it means to
    /// keep our memory held) and the connection ends with a Terminate (local catastrophic
    /// error, RFC 5040 7.4.1), or, on a Responder that has received no FPDU yet and so may
    /// send none (RFC 5044 7.1.2 rule 4), closes without one. The mirror of TCP's user timeout (RFC 5482) for the peer's
    /// data. Default [`DEFAULT_HELD_TIMEOUT`]; `None`: no limit.
    pub held_timeout: Option<Duration>,
    /// Memory shared with other connections that pays for the reassembly store's ring when
    /// data first waits in it (see [`ReassemblyBudget`]); when it cannot, what arrived out of
    /// order is given back to TCP, which has the peer send it again. `None`: each store
    /// allocates freely (bounded by `reassembly_capacity` alone).
    pub reassembly_budget: Option<ReassemblyBudget>,
}

impl Default for ConnConfig {
    fn default() -> Self {
        ConnConfig {
            mpa: MpaConfig::default(),
            qp: QpConfig::default(),
            reassembly_capacity: 1 << 20,
            max_placed_fpdus: 8192,
            tx_ahead: 512 << 10,
            max_tx_fpdus: 2048,
            ift: None,
            held_timeout: Some(DEFAULT_HELD_TIMEOUT),
            reassembly_budget: None,
        }
    }
}

/// Per-connection counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnCounters {
    /// Segments TCP passed up (with data).
    pub segments: u64,
    /// Segments passed up out of order.
    pub segments_out_of_order: u64,
    /// FPDUs received and processed in order (placed early or not).
    pub fpdus_rx: u64,
    /// FPDUs sent.
    pub fpdus_tx: u64,
    /// Payload octets (after the DDP header) of FPDUs handed to the queue pair in order
    /// without early placement.
    pub bytes_placed_in_order: u64,
    /// Payload octets placed ahead of the in-order point, straight from the segment.
    pub bytes_placed_out_of_order: u64,
    /// FPDUs placed ahead of the in-order point.
    pub fpdus_placed_out_of_order: u64,
    /// Octets in the reassembly store now.
    pub held_bytes: u64,
    /// Most octets the reassembly store ever held at once.
    pub held_peak: u64,
    /// Octets that ever went into the reassembly store.
    pub held_total: u64,
    /// Longest run of contiguous octets the store ever held (after a segment was processed).
    /// With FPDUs that can all be located and placed early, a run is at most the end of one
    /// FPDU and the start of the next (anything longer holds a whole FPDU, which is placed).
    /// With more than 64 held ranges, most segments look only at the ranges around their own
    /// octets (where runs grow) and the whole list is looked at now and then, so that a peer
    /// holding 1,024 ranges does not make every segment scan them all.
    pub held_run_peak: u64,
    /// Most octets ever held at one gap (after a segment was processed). A gap is a hole in
    /// the received stream beyond the in-order point, or the end of what arrived so far. It
    /// cuts the FPDU it starts in (X) and the one it ends in (Y, the same when the gap lies
    /// inside one FPDU after its header); the octets held at it are X's front (from its
    /// header, in the run before the gap) and Y's back (in the run after it, up to the first
    /// FPDU boundary known there): what any receiver must hold, less than two FPDUs, and
    /// less than one when X is Y. Where the gap swallowed Y's ULPDU_Length, Y's end is found
    /// backwards from the first header a Marker points at (with CRCs); until such a header
    /// has arrived the run after the gap cannot be split and counts here whole: less than
    /// 512 octets (RFC 5044 section 5) of the next FPDU more. Held octets between placed
    /// FPDUs (FPDUs not placed early) count as a gap of their own. Looked at as
    /// `held_run_peak` is.
    pub held_gap_peak: u64,
    /// Gaps with octets held at them when the store held `held_peak` octets (with more than
    /// 64 held ranges: at the last new peak whose whole list was looked at, within a
    /// sixteenth of `held_peak`).
    pub held_peak_gaps: u64,
    /// Out-of-order segments in which no FPDU could be located.
    pub unlocated_segments: u64,
    /// Held octets read again to place FPDUs early (rescans of held runs, backfill's CRC
    /// checks); bounded by a credit earned per octet received.
    pub rescanned_bytes: u64,
    /// Such reads left to the in-order pass for want of credit.
    pub rescans_deferred: u64,
    /// Connections ended because data waited beyond a gap the peer never filled
    /// ([`ConnConfig::held_timeout`]).
    pub held_timeouts: u64,
    /// Times the reassembly store's memory (or, with nothing held since, the locator's buffer
    /// alone) was freed after it stayed empty for a second.
    pub store_releases: u64,
    /// Times data out of order found the reassembly budget spent
    /// ([`ConnConfig::reassembly_budget`]) or the store's list of held ranges full, and was
    /// given back to TCP.
    pub store_refusals: u64,
    /// FPDUs whose CRC did not match (in order; nothing of them was placed).
    pub crc_errors: u64,
    /// Segments TCP retransmitted.
    pub retransmissions: u64,
    /// TCP retransmission timeouts.
    pub rto_expirations: u64,
    /// TCP tail-loss probes.
    pub loss_probes: u64,
    /// TCP loss recoveries entered (each one a congestion window reduction).
    pub fast_recoveries: u64,
    /// TCP congestion responses found spurious and undone (Eifel timeouts, D-SACK).
    pub spurious_undone: u64,
    /// Segments TCP dropped by PAWS.
    pub paws_drops: u64,
    /// Nanoseconds TCP's unsent data waited for the peer's window, for the congestion
    /// window, and on the sender with data in flight (`tcp_engine::ConnStats`
    /// `snd_lim_time_*_ns`, RFC 4898): the last includes waiting on the engine's own limit
    /// on data queued ahead ([`ConnConfig::tx_ahead`]).
    pub send_limited_ns: [u64; 3],
    /// Terminate messages sent.
    pub terminates_sent: u64,
    /// Terminate messages received.
    pub terminates_received: u64,
    /// IFT: frames placed speculatively (section 8) whose place the in-order framing then
    /// confirmed (the placements themselves count in `fpdus_placed_out_of_order`).
    pub ift_speculation_confirmed: u64,
    /// IFT: frames of out-of-order segments not placed speculatively because octets of their
    /// buffer they would write were written before, or the buffer is no longer tracked
    /// (section 8.2: nothing placed before may be overwritten by a guess); they wait for the
    /// in-order pass.
    pub ift_speculation_refused: u64,
    /// IFT: frames placed speculatively whose place the in-order framing did not confirm, or
    /// that lay beyond such a frame: withdrawn, their octets taken back from TCP to be
    /// processed (placed again) in order when the peer resends them.
    pub ift_speculation_withdrawn: u64,
    /// IFT: times TCP took octets back unacknowledged after a failed confirmation
    /// (`tcp_engine::Connection::renege_from`): the ACK the peer would have had is withheld
    /// and it resends them (section 8).
    pub ift_acks_withheld: u64,
    /// IFT: frames whose header CRC did not match (nothing of them was placed).
    pub ift_header_crc_errors: u64,
    /// IFT: frames whose payload CRC did not match (nothing of them was placed).
    pub ift_payload_crc_errors: u64,
}

/// What happened to the connection, for the layer above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEvent {
    /// Responder: a valid MPA Request arrived; call [`IwarpConn::accept`] or
    /// [`IwarpConn::reject`].
    Request(RequestInfo),
    /// Full Operation started (the Initiator got an accepting Reply, or the Responder
    /// accepted). Carries the peer's private data (empty on the Responder).
    Established {
        /// The Reply's private data (Initiator side).
        private_data: Vec<u8>,
    },
    /// Initiator: the Responder rejected the connection.
    Rejected {
        /// The Reply's private data.
        private_data: Vec<u8>,
        /// The Reply's RFC 6581 block (IRD, ORD, RTR kinds), if it had one (RFC 6581 9.1).
        peer_params: Option<mpa::wire::EnhancedParams>,
    },
    /// MPA startup failed (bad frame, timeout).
    StartupFailed(MpaError),
    /// TCP was reset before it was established: nobody listens on the peer's port (what a
    /// kernel socket reports as ECONNREFUSED).
    ConnectionRefused,
    /// An MPA error in Full Operation (CRC, Marker, framing): the receive direction stopped
    /// and a Terminate was queued, unless this is a Responder that may send nothing yet
    /// (RFC 5044 7.1.2 rule 4), whose connection just closes (as for
    /// [`MpaError::RtrTimeout`]).
    MpaFailed(MpaError),
    /// A local error (a gap never filled, the reassembly store or budget refusing the peer's
    /// data) where no FPDU may be sent (a Responder before the peer's first FPDU, RFC 5044
    /// 7.1.2 rule 4, or either side before Full Operation): the connection closes without a
    /// Terminate, for this reason. (Where a Terminate may be sent, it is: the queue pair's
    /// local Terminate says why.)
    ClosedLocally(&'static str),
    /// The TCP connection ended; the TCP event says how (the peer's FIN, a normal close, the
    /// peer's reset, retransmissions unanswered, or a transmit source that failed).
    TransportClosed(TcpEvent),
    /// The octets of an FPDU TCP had to (re)transmit could not be produced (its source region
    /// was deregistered or shrank): the TCP connection was reset.
    TransmitSourceFailed(TxSourceError),
    /// IFT responder: a valid phase 0 adaption indication arrived (what was agreed); call
    /// [`IwarpConn::accept`] (which sends phase 1) or [`IwarpConn::reject`] (which closes).
    IftRequest(ift::Negotiated),
    /// The IFT adaption exchange failed (bad or unacceptable indication, timeout, the peer
    /// closed; section 4.2): the connection closes without a Terminate.
    IftStartupFailed(IftError),
    /// An IFT frame failed a check (VTag, header_size, a CRC): nothing of it was placed, the
    /// receive direction stopped and a Terminate (layer LLP, [`IftError::code`]) was queued.
    IftFailed(IftError),
}

/// Errors of the local API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// The call does not fit the connection's state (e.g. accept on an Initiator).
    #[error("not possible in this state: {0}")]
    InvalidState(&'static str),
    /// MPA refused (e.g. private data too long).
    #[error("MPA: {0}")]
    Mpa(#[from] MpaError),
    /// IFT refused (e.g. private data, which IFT does not carry).
    #[error("IFT: {0}")]
    Ift(#[from] IftError),
}

/// A placed FPDU's record: enough to process it in order without its payload.
#[derive(Debug, Clone, Copy)]
struct PlacedFpdu {
    /// TCP stream offset of its first octet (a Marker right before its header included).
    start: u64,
    /// TCP stream offset just after its CRC.
    end: u64,
    header: [u8; UNTAGGED_HEADER_LEN],
    header_len: u8,
    payload_len: u32,
    /// What `place_early` left for the in-order pass (a message's last octet).
    early: PlacedEarly,
    /// Where its payload went (for IFT's overlap check, section 8.2).
    target: Option<PlacementTarget>,
}

/// Full Operation state of the receive and transmit directions.
#[derive(Debug)]
struct Full {
    negotiated: Negotiated,
    /// TCP stream offset of the receive direction's SeqStart.
    rx_start: u64,
    decoder: FpduDecoder,
    locator: FpduLocator,
    encoder: FpduEncoder,
    /// RFC 5044 7.1.2 rule 4: the Responder sends nothing before a valid FPDU arrived.
    may_send: bool,
    /// A peer-to-peer Responder waits for the RTR (RFC 6581 5: setup ends with it); false
    /// once the first FPDU came or the connection failed, and in the client-server model
    /// (where an Initiator may stay silent as long as it likes).
    awaiting_rtr: bool,
    /// The RTR's deadline, `MpaConfig::timeout` from the first poll in Full Operation (the
    /// accept's time: `accept` is told no time).
    rtr_deadline: Option<Instant>,
}

/// IFT Full Operation: frames both ways, received ones processed in order.
#[derive(Debug)]
struct IftFull {
    negotiated: ift::Negotiated,
    decoder: FrameDecoder,
    encoder: FrameEncoder,
    /// What the peer's frames have written where (section 8.2).
    written: Written,
}

/// IFT responder: phase 0 was acceptable; the application decides by `deadline`.
#[derive(Debug)]
struct IftPending {
    negotiated: ift::Negotiated,
    reply: [u8; ift::wire::INDICATION_LEN],
    /// When the application must have answered (`MpaConfig::accept_timeout` after the
    /// indication came in); `None`, no deadline: a timeout too large for the clock.
    deadline: Option<std::time::Instant>,
}

#[derive(Debug)]
enum Phase {
    /// Initiator, waiting for the Reply.
    Initiating(Box<Initiator>),
    /// Responder, waiting for the Request.
    AwaitingRequest(Box<Responder>),
    /// Responder, the Request is in; the application decides.
    AwaitingAccept(Box<Responder>),
    Full(Box<Full>),
    /// IFT initiator, waiting for phase 1.
    IftInitiating(Box<ift::Initiator>),
    /// IFT responder, waiting for phase 0.
    IftAwaitingIndication(Box<ift::Responder>),
    /// IFT responder, phase 0 is in; the application decides.
    IftAwaitingAccept(Box<IftPending>),
    IftFull(Box<IftFull>),
    /// Rejected (either side) or failed: nothing more is processed.
    Done,
}

/// The bounded reassembly store: octets that arrived ahead of the in-order point and were not
/// placed. Octet `o` of the stream lives at `o % capacity` of a ring allocated once: everything
/// held lies within `capacity` octets of the in-order point, so no two held octets collide.
#[derive(Debug, Default)]
struct Store {
    ring: Vec<u8>,
    capacity: usize,
    max_ranges: usize,
    /// Sorted, disjoint, non-adjacent stream ranges held.
    ranges: Vec<(u64, u64)>,
    held: u64,
    /// Charged the ring's capacity when it is allocated, credited when it is freed.
    budget: Option<ReassemblyBudget>,
    /// Octets charged to `budget` now.
    charged: usize,
    /// Octets were put in since [`Store::take_used`] last asked.
    used: bool,
}

/// Why the store did not take octets.
#[derive(Debug, PartialEq, Eq)]
enum StoreRefused {
    /// The peer went past the offered window (or an octet came twice, which TCP never
    /// passes up).
    Full,
    /// The ring is not allocated and the budget cannot pay for it.
    NoMemory,
    /// The octets would start one more disjoint range and the range list is full. A
    /// conforming peer can get here (FPDUs placed early split held runs: between each two, an
    /// FPDU that may not be placed early, as a Send to a shared receive queue), so the octets
    /// are given back to TCP as for `NoMemory`, not taken for a broken peer.
    TooManyRanges,
}

impl Drop for Store {
    fn drop(&mut self) {
        self.uncharge();
    }
}

/// Which held ranges the scan that keeps the held peaks looks at after a segment
/// ([`IwarpConn::note_held_peaks`]).
#[derive(Debug, Default)]
struct PeakScan {
    /// Ranges looked at by window scans since the last whole scan.
    windows_scanned: usize,
    /// Octets held at the last new `held_peak` scanned whole.
    peak_scanned_whole: u64,
}

impl PeakScan {
    /// Up to this many held ranges every scan is whole (exact peaks).
    const WHOLE_UP_TO: usize = 64;
    /// Held ranges a scan that is not whole looks at: a segment's octets change the held
    /// runs they join and the gaps on either side of them.
    const WINDOW: usize = 8;
    /// A whole scan follows window scans that looked at this many times the ranges held.
    const WINDOWS_PER_WHOLE: usize = 4;

    /// The held ranges (indices into a list of `n`) to scan after a segment whose octets lie
    /// in the ranges `touched`, the store holding `held` octets and the peak so far being
    /// `peak`: all of them while there are at most [`Self::WHOLE_UP_TO`], at a new peak a
    /// sixteenth above the last one scanned whole, and once the window scans since the last
    /// whole scan add up to `WINDOWS_PER_WHOLE * n` ranges; else `touched` and `WINDOW / 2`
    /// ranges on either side. Over any run of segments, at most `WINDOW + WINDOW /
    /// WINDOWS_PER_WHOLE` ranges per segment besides about 1.25 per range the segments
    /// touched (a segment leaves at most one range per FPDU in it; the quarter is the whole
    /// scans they bring forward), plus the whole scans at new peaks: about 16 ln(capacity) of
    /// them in a connection's life, as the peak only rises.
    fn window(&mut self, n: usize, touched: Range<usize>, held: u64, peak: u64) -> Range<usize> {
        let new_peak = held > peak;
        let far_above = held - held.min(self.peak_scanned_whole) > self.peak_scanned_whole / 16;
        if n <= Self::WHOLE_UP_TO
            || (new_peak && far_above)
            || self.windows_scanned >= Self::WINDOWS_PER_WHOLE * n
        {
            self.windows_scanned = 0;
            if new_peak {
                self.peak_scanned_whole = held;
            }
            return 0..n;
        }
        let start = touched.start.min(n).saturating_sub(Self::WINDOW / 2);
        let end = touched
            .end
            .max(touched.start)
            .saturating_add(Self::WINDOW / 2)
            .min(n);
        self.windows_scanned += end - start;
        start..end
    }
}

/// What [`IwarpConn::held_per_gap`] found in the held ranges it scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeldShape {
    /// Gaps with octets held at them.
    gaps: u64,
    /// Most octets held at one gap.
    most_at_one_gap: u64,
    /// Longest run of contiguous held octets.
    longest_run: u64,
}

impl Store {
    fn new(capacity: usize, max_ranges: usize, budget: Option<ReassemblyBudget>) -> Store {
        Store {
            ring: Vec::new(),
            capacity: capacity.max(1),
            max_ranges: max_ranges.max(1),
            ranges: Vec::new(),
            held: 0,
            budget,
            charged: 0,
            used: false,
        }
    }

    /// Whether octets were put in since the last call.
    fn take_used(&mut self) -> bool {
        std::mem::take(&mut self.used)
    }

    /// Credits the budget with what the ring was charged.
    fn uncharge(&mut self) {
        if let Some(b) = &self.budget {
            b.give(std::mem::take(&mut self.charged));
        }
    }

    /// Moves what is held into a store of `capacity` octets and `max_ranges` ranges (larger
    /// than this one's); `base` is the in-order point.
    fn grow(
        &mut self,
        base: u64,
        capacity: usize,
        max_ranges: usize,
        budget: Option<ReassemblyBudget>,
    ) -> Result<(), StoreRefused> {
        if capacity <= self.capacity {
            return Ok(());
        }
        let old = std::mem::replace(self, Store::new(capacity, max_ranges, budget));
        for &(start, end) in &old.ranges {
            let (a, b) = old.slices(start, end);
            self.insert(base, start, a)?;
            self.insert(base, start + a.len() as u64, b)?;
        }
        Ok(())
    }

    /// Keeps `data` at stream offset `off`; `base` is the in-order point.
    fn insert(&mut self, base: u64, off: u64, data: &[u8]) -> Result<(), StoreRefused> {
        if data.is_empty() {
            return Ok(());
        }
        let end = off + data.len() as u64;
        if off < base || end > base + self.capacity as u64 {
            return Err(StoreRefused::Full);
        }
        // The first range that ends at `off` or after it; the one after it if it ends at `off`
        // (ranges neither overlap nor touch, so that one starts after `off`).
        let i = self.ranges.partition_point(|r| r.1 < off);
        let touches_prev = self.ranges.get(i).is_some_and(|r| r.1 == off);
        let j = if touches_prev { i + 1 } else { i };
        // Each octet is passed up once, so a new range never overlaps a held one; it may touch.
        if self.ranges.get(j).is_some_and(|r| r.0 < end) {
            return Err(StoreRefused::Full);
        }
        let touches_next = self.ranges.get(j).is_some_and(|r| r.0 == end);
        if !touches_prev && !touches_next && self.ranges.len() >= self.max_ranges {
            return Err(StoreRefused::TooManyRanges);
        }
        if self.ring.is_empty() {
            if let Some(b) = &self.budget {
                if !b.take(self.capacity) {
                    return Err(StoreRefused::NoMemory);
                }
                self.charged = self.capacity;
            }
            self.ring = vec![0; self.capacity];
            // Once, with the ring: the range list never grows past this.
            self.ranges.reserve_exact(self.max_ranges);
        }
        self.used = true;
        let cap = self.capacity as u64;
        let at = (off % cap) as usize;
        let first = data.len().min(self.capacity - at);
        self.ring[at..at + first].copy_from_slice(&data[..first]);
        self.ring[..data.len() - first].copy_from_slice(&data[first..]);
        self.held += data.len() as u64;
        match (touches_prev, touches_next) {
            (true, true) => {
                self.ranges[i].1 = self.ranges[j].1;
                self.ranges.remove(j);
            }
            (true, false) => self.ranges[i].1 = end,
            (false, true) => self.ranges[j].0 = off,
            (false, false) => self.ranges.insert(i, (off, end)),
        }
        Ok(())
    }

    /// The held range that contains stream offset `pos`, if any.
    fn range_containing(&self, pos: u64) -> Option<(u64, u64)> {
        let i = self.ranges.partition_point(|r| r.1 <= pos);
        self.ranges.get(i).filter(|r| r.0 <= pos).copied()
    }

    /// Forgets the held octets `[start, end)`, which must lie in one held range; false (and
    /// nothing changed) otherwise or when the split would need more ranges than allowed.
    fn remove(&mut self, start: u64, end: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.1 <= start);
        let Some(&(s, e)) = self.ranges.get(i) else {
            return false;
        };
        if start >= end || s > start || e < end {
            return false;
        }
        match (s == start, e == end) {
            (true, true) => {
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i].0 = end,
            (false, true) => self.ranges[i].1 = start,
            (false, false) => {
                if self.ranges.len() >= self.max_ranges {
                    return false;
                }
                self.ranges[i].1 = start;
                self.ranges.insert(i + 1, (end, e));
            }
        }
        self.held -= end - start;
        true
    }

    /// End of the held range that starts at `pos`, if any.
    fn range_at(&self, pos: u64) -> Option<u64> {
        self.ranges.first().filter(|r| r.0 == pos).map(|r| r.1)
    }

    /// The held octets `[start, end)` as at most two ring slices.
    fn slices(&self, start: u64, end: u64) -> (&[u8], &[u8]) {
        let cap = self.capacity as u64;
        let at = (start % cap) as usize;
        let len = (end - start) as usize;
        let first = len.min(self.capacity - at);
        (&self.ring[at..at + first], &self.ring[..len - first])
    }

    /// Forgets everything before `pos`.
    /// Copies the held octets `[start, end)` into `buf` for a scan, and empties `found` for the
    /// spans it will place; both get their fixed capacity on first use (`MAX_RELOCATE` octets,
    /// `MAX_RELOCATED` spans), so later scans allocate nothing.
    fn copy_for_scan(&self, start: u64, end: u64, buf: &mut Vec<u8>, found: &mut Vec<(u64, u64)>) {
        if buf.capacity() < MAX_RELOCATE {
            buf.reserve_exact(MAX_RELOCATE);
            found.reserve_exact(MAX_RELOCATED);
        }
        buf.clear();
        found.clear();
        let (a, b) = self.slices(start, end);
        buf.extend_from_slice(a);
        buf.extend_from_slice(b);
    }

    /// Whether the ring is allocated.
    fn is_allocated(&self) -> bool {
        !self.ring.is_empty()
    }

    /// Frees the ring and the range list when nothing is held; the next held octet allocates
    /// them again. Returns whether anything was freed.
    fn release_if_empty(&mut self) -> bool {
        if !self.ranges.is_empty() || !self.is_allocated() {
            return false;
        }
        self.ring = Vec::new();
        self.ranges = Vec::new();
        self.uncharge();
        true
    }

    /// Octets of heap the store holds.
    fn allocated(&self) -> usize {
        self.ring.capacity() + self.ranges.capacity() * std::mem::size_of::<(u64, u64)>()
    }

    /// Drops the spans a scan placed: each lies inside the one held range copied, and the
    /// caller checked there is room for every split.
    fn remove_placed(&mut self, found: &[(u64, u64)]) {
        for &(s, e) in found {
            let removed = self.remove(s, e);
            debug_assert!(removed);
        }
    }

    /// Forgets everything at or beyond `pos`.
    fn truncate_from(&mut self, pos: u64) {
        while let Some(r) = self.ranges.last_mut() {
            if r.0 >= pos {
                self.held -= r.1 - r.0;
                self.ranges.pop();
            } else {
                if r.1 > pos {
                    self.held -= r.1 - pos;
                    r.1 = pos;
                }
                break;
            }
        }
    }

    fn release_to(&mut self, pos: u64) {
        // The ranges wholly below `pos` go in one move (one at a time from the front was
        // quadratic in the ranges held).
        let k = self.ranges.partition_point(|r| r.1 <= pos);
        for r in self.ranges.drain(..k) {
            self.held -= r.1 - r.0;
        }
        if let Some(r) = self.ranges.first_mut() {
            if r.0 < pos {
                self.held -= pos - r.0;
                r.0 = pos;
            }
        }
    }
}

/// One iWARP connection: MPA and a queue pair over a TCP connection the caller owns.
#[derive(Debug)]
pub struct IwarpConn {
    cfg: ConnConfig,
    /// `std::time::Instant` of [`Instant::ZERO`] (MPA's startup deadlines use std time).
    epoch: std::time::Instant,
    now: Instant,
    initiator: bool,
    phase: Phase,
    qp: QueuePair,
    /// TCP stream offset up to which received octets have been processed in order.
    consumed: u64,
    /// The receive direction stopped (MPA error, overflow, transport gone).
    rx_dead: bool,
    /// Octets given back ([`IwarpConn::give_back`]): TCP is to take back the octets from
    /// this stream offset on, in the answer to the data being passed up, or at the end of
    /// the `poll` that gave them back (until then, octets there are ignored: they will be
    /// passed up again).
    renege_at: Option<u64>,
    /// A wrong IFT speculation is among what `renege_at` gives back.
    renege_speculation: bool,
    /// Where the last take-back of a wrong speculation that went to TCP in a pass-up's
    /// answer starts, until the next `poll` (TCP reports a refusal as an event before it):
    /// to tell a `TakeBackRefused` of it from one of octets the budget could not hold.
    speculation_answered: Option<u64>,
    /// Octets went back to TCP in a pass-up's answer since the last `poll`
    /// ([`IwarpConn::needs_poll`]).
    answered_take_back: bool,
    store: Store,
    placed: VecDeque<PlacedFpdu>,
    /// A held range copied out of the ring to be scanned again (allocated once, on first use).
    relocate_buf: Vec<u8>,
    /// Held octets that may still be read again (see [`SCAN_CREDIT_PER_OCTET`]).
    scan_credit: u64,
    /// Which held ranges the next scan for the held peaks looks at.
    peak_scan: PeakScan,
    /// While data waits beyond a gap: the first octet held when it was armed, which the
    /// in-order point must reach, and by when ([`ConnConfig::held_timeout`]).
    held_deadline: Option<(u64, Instant)>,
    /// Since when the store has been empty with its memory allocated ([`STORE_IDLE_RELEASE`]).
    store_idle_since: Option<Instant>,
    /// Spans of the FPDUs such a scan placed (allocated once).
    relocated: Vec<(u64, u64)>,
    /// FPDUs framed out of order whose end lies beyond the octets that framed them, as
    /// (stream offset of the ULPDU_Length field, stream offset where the next FPDU starts),
    /// sorted and unique by the end. Where such an end falls in a later segment or held run,
    /// that run's FPDUs are found from there (the framing carried across the gap), and only
    /// the cut FPDU's pieces stay held. Allocated once, at most [`MAX_CHAINS`].
    chains: Vec<(u64, u64)>,
    /// The in-order decoder's next FPDU start last used to rescan a held run.
    in_order_chain: u64,
    /// The MPA Request or Reply, until TCP has taken it.
    startup_record: Option<Vec<u8>>,
    /// `TxMode::Source`: the MPA Request or Reply TCP has taken (its stream offset and
    /// octets), until acknowledged.
    startup_sent: Option<(u64, Vec<u8>)>,
    /// The TCP connection's transmit mode is `TxMode::Source` (known from the first poll).
    source_mode: Option<bool>,
    /// FPDUs in flight (`TxMode::Source`).
    tx: TxRing,
    tx_started: bool,
    /// Stream offset of this direction's SeqStart (after the Request or Reply).
    tx_seq_start: u64,
    tx_failed: Option<TxSourceError>,
    /// The ULPDU being framed: grows to the largest one sent (at most MULPDU) and stays.
    ulpdu: Vec<u8>,
    /// `TxMode::Records` with IFT: the frame being queued (grows like `ulpdu`).
    frame: Vec<u8>,
    tcp_closed: bool,
    /// TCP reached ESTABLISHED (a reset before that is a refusal).
    tcp_established: bool,
    tcp_close_requested: bool,
    /// What Full Operation allocated was let go once the connection needed none of it
    /// ([`IwarpConn::release_full_buffers`]).
    full_buffers_released: bool,
    events: VecDeque<ConnEvent>,
    counters: ConnCounters,
}

impl IwarpConn {
    fn new(cfg: ConnConfig, epoch: std::time::Instant, now: Instant, phase: Phase) -> IwarpConn {
        let initiator = matches!(phase, Phase::Initiating(_) | Phase::IftInitiating(_));
        // What Full Operation needs (the transmit ring, the placement records, the ULPDU
        // buffer, the full reassembly store) is allocated when it starts (`enter_full`).
        let store = if initiator {
            Store::new(
                cfg.reassembly_capacity,
                MAX_STORE_RANGES,
                cfg.reassembly_budget.clone(),
            )
        } else {
            Store::new(STARTUP_STORE, STARTUP_STORE_RANGES, None)
        };
        IwarpConn {
            qp: QueuePair::new(cfg.qp),
            store,
            placed: VecDeque::new(),
            relocate_buf: Vec::new(),
            scan_credit: SCAN_CREDIT_START,
            peak_scan: PeakScan::default(),
            held_deadline: None,
            store_idle_since: None,
            relocated: Vec::new(),
            chains: Vec::new(),
            in_order_chain: 0,
            cfg,
            epoch,
            now,
            initiator,
            phase,
            consumed: 0,
            rx_dead: false,
            renege_at: None,
            renege_speculation: false,
            speculation_answered: None,
            answered_take_back: false,
            startup_record: None,
            startup_sent: None,
            source_mode: None,
            tx: TxRing::new(1),
            tx_started: false,
            tx_seq_start: 0,
            tx_failed: None,
            ulpdu: Vec::new(),
            frame: Vec::new(),
            tcp_closed: false,
            tcp_established: false,
            tcp_close_requested: false,
            full_buffers_released: false,
            events: VecDeque::new(),
            counters: ConnCounters::default(),
        }
    }

    /// The Initiator (active) side: the MPA Request with `private_data` is queued for the TCP
    /// connection, which may still be opening. `epoch` is the `std::time::Instant` that
    /// `tcp_engine::Instant::ZERO` stands for (MPA's deadlines are in std time).
    pub fn initiator(
        cfg: ConnConfig,
        private_data: &[u8],
        epoch: std::time::Instant,
        now: Instant,
    ) -> Result<IwarpConn, ConnError> {
        let mpa_now = epoch + Duration::from_nanos(now.as_nanos());
        if let Some(ift_cfg) = &cfg.ift {
            if !private_data.is_empty() {
                return Err(IftError::Local("IFT carries no private data").into());
            }
            let initiator = ift::Initiator::new(ift_cfg.clone(), mpa_now);
            let indication = initiator.indication().to_vec();
            let phase = Phase::IftInitiating(Box::new(initiator));
            let mut conn = IwarpConn::new(cfg, epoch, now, phase);
            conn.startup_record = Some(indication);
            return Ok(conn);
        }
        let initiator = Initiator::new(cfg.mpa.clone(), private_data, mpa_now)?;
        let request = initiator.request().to_vec();
        let mut conn = IwarpConn::new(cfg, epoch, now, Phase::Initiating(Box::new(initiator)));
        conn.startup_record = Some(request);
        Ok(conn)
    }

    /// The Responder (passive) side, for a connection a listener accepted: waits for the
    /// Request ([`ConnEvent::Request`]).
    pub fn responder(
        cfg: ConnConfig,
        epoch: std::time::Instant,
        now: Instant,
    ) -> Result<IwarpConn, ConnError> {
        let mpa_now = epoch + Duration::from_nanos(now.as_nanos());
        if let Some(ift_cfg) = &cfg.ift {
            let responder = ift::Responder::new(ift_cfg.clone(), mpa_now);
            let phase = Phase::IftAwaitingIndication(Box::new(responder));
            return Ok(IwarpConn::new(cfg, epoch, now, phase));
        }
        let responder = Responder::new(cfg.mpa.clone(), mpa_now)?;
        Ok(IwarpConn::new(
            cfg,
            epoch,
            now,
            Phase::AwaitingRequest(Box::new(responder)),
        ))
    }

    fn mpa_now(&self) -> std::time::Instant {
        self.epoch + Duration::from_nanos(self.now.as_nanos())
    }

    /// The startup phases' deadlines (MPA Request/Reply, IFT's adaption exchange, the
    /// application's accept), at the time of the last [`IwarpConn::poll`].
    fn startup_deadlines(&mut self) {
        let mpa_now = self.mpa_now();
        let timeout = match &mut self.phase {
            Phase::Initiating(i) => i.handle_timeout(mpa_now).err(),
            Phase::AwaitingRequest(r) | Phase::AwaitingAccept(r) => r.handle_timeout(mpa_now).err(),
            _ => None,
        };
        if let Some(e) = timeout {
            self.startup_failed(e);
        }
        let ift_timeout = match &mut self.phase {
            Phase::IftInitiating(i) => i.handle_timeout(mpa_now).err(),
            Phase::IftAwaitingIndication(r) => r.handle_timeout(mpa_now).err(),
            Phase::IftAwaitingAccept(p) if p.deadline.is_some_and(|d| mpa_now >= d) => {
                Some(IftError::AcceptTimeout)
            }
            _ => None,
        };
        if let Some(e) = ift_timeout {
            self.ift_startup_failed(e);
        }
    }

    /// A peer-to-peer Responder still without the RTR at its deadline closes the connection
    /// ([`MpaError::RtrTimeout`]), as a startup that never finishes does.
    fn rtr_deadline(&mut self, now: Instant) {
        let Phase::Full(full) = &mut self.phase else {
            return;
        };
        if !full.awaiting_rtr {
            return;
        }
        if full.may_send || self.rx_dead || self.qp.state() != QpState::Rts {
            // The RTR came, or the connection failed or is closing otherwise.
            full.awaiting_rtr = false;
            full.rtr_deadline = None;
            return;
        }
        match full.rtr_deadline {
            None => full.rtr_deadline = Some(now + self.cfg.mpa.timeout),
            Some(at) if now >= at => {
                full.awaiting_rtr = false;
                full.rtr_deadline = None;
                self.mpa_failed(MpaError::RtrTimeout, false);
            }
            Some(_) => {}
        }
    }

    /// A queue pair that raised a Terminate while we may send nothing (a refused receive
    /// failing it before the peer's first FPDU: RFC 5044 7.1.2 rule 4 forbids even a
    /// Terminate then) closes the connection without it ([`IwarpConn::fail_locally`]), as on
    /// an MPA error then; otherwise the Terminate would wait for an FPDU a silent peer never
    /// sends.
    fn close_unsendable_terminate(&mut self) {
        if !self.rx_dead && !self.may_send_fpdus() && self.qp.state() == QpState::Terminate {
            self.fail_locally(UNSENDABLE_TERMINATE);
        }
    }

    /// [`ConnConfig::held_timeout`]: armed when data waits beyond a gap (held octets, FPDUs
    /// placed early), marking the first octet held then; moved on once the in-order point
    /// has reached that mark (the gap below it filled), to the first octet held beyond it if
    /// any; fired when it has not by then. Not moved by in-order octets that only narrow the
    /// gap: a peer that sent one a minute below data it never joined up would otherwise hold
    /// its share of the reassembly budget for good.
    fn held_deadline(&mut self, now: Instant) {
        let Some(timeout) = self.cfg.held_timeout else {
            return;
        };
        if (self.store.held == 0 && self.placed.is_empty()) || self.rx_dead {
            self.held_deadline = None;
            return;
        }
        match self.held_deadline {
            Some((mark, at)) if self.consumed < mark => {
                if now >= at {
                    self.held_deadline = None;
                    self.counters.held_timeouts += 1;
                    self.fail_locally("data waited beyond a gap the peer never filled");
                }
            }
            _ => {
                // A held octet at or below the in-order point would be a mark never waited
                // for (re-armed at every poll): the next octet then, as the first held.
                let first = self
                    .first_held()
                    .filter(|&f| f > self.consumed)
                    .unwrap_or(self.consumed.saturating_add(1));
                self.held_deadline = Some((first, now + timeout));
            }
        }
    }

    /// The stream offset of the first octet held beyond the in-order point: the store's
    /// lowest range, or the start of the lowest FPDU placed early.
    fn first_held(&self) -> Option<u64> {
        let stored = self.store.ranges.first().map(|r| r.0);
        // Kept in stream order (`record_placed`): the first is the lowest.
        let placed = self.placed.front().map(|p| p.start);
        stored.into_iter().chain(placed).min()
    }

    /// [`STORE_IDLE_RELEASE`]: frees the reassembly store's memory and the scan buffers once the
    /// store has stayed empty, with nothing placed early, that long.
    fn release_idle_store(&mut self, now: Instant) {
        let allocated = self.store.is_allocated()
            || self.relocate_buf.capacity() != 0
            || self.locator_buffer() != 0;
        let used = self.store.take_used();
        if !allocated || used || self.store.held != 0 || !self.placed.is_empty() {
            self.store_idle_since = None;
            return;
        }
        match self.store_idle_since {
            None => self.store_idle_since = Some(now),
            Some(since) if now >= since + STORE_IDLE_RELEASE => {
                self.store_idle_since = None;
                self.store.release_if_empty();
                self.relocate_buf = Vec::new();
                self.relocated = Vec::new();
                if let Phase::Full(full) = &mut self.phase {
                    full.locator.release_buffer();
                }
                self.counters.store_releases += 1;
            }
            Some(_) => {}
        }
    }

    /// Octets of heap the connection holds for data received out of order: the reassembly
    /// store's ring and range list and the buffers of its scans. Allocated at the first
    /// out-of-order octet (the startup store's few KiB before Full Operation) and freed once
    /// the store has stayed empty for a second. (The locator's buffer, sized for the largest
    /// ULPDU at the first out-of-order segment and freed with these, is counted in
    /// [`IwarpConn::full_buffer_octets`].)
    pub fn reassembly_memory(&self) -> usize {
        self.store.allocated()
            + self.relocate_buf.capacity()
            + self.relocated.capacity() * std::mem::size_of::<(u64, u64)>()
    }

    /// The locator's buffer, sized for the largest ULPDU at its first scan.
    fn locator_buffer(&self) -> usize {
        match &self.phase {
            Phase::Full(full) => full.locator.buffer_capacity(),
            _ => 0,
        }
    }

    /// Responder: sets the IRD and ORD the MPA Reply offers for this connection in place of
    /// the configuration's ([`mpa::Responder::set_ird_ord`]; `rdma_accept`'s
    /// `responder_resources` and `initiator_depth`), while its Request waits for
    /// [`IwarpConn::accept`]. IFT negotiates neither: they are the queue pair's as they are.
    pub fn set_accept_ird_ord(&mut self, ird: u16, ord: u16) -> Result<(), ConnError> {
        match &mut self.phase {
            Phase::AwaitingAccept(responder) => Ok(responder.set_ird_ord(ird, ord)?),
            Phase::IftAwaitingAccept(_) => {
                // `enter_ift_full` starts the queue pair with these.
                self.cfg.mpa.ird = ird;
                self.cfg.mpa.ord = ord;
                Ok(())
            }
            _ => Err(ConnError::InvalidState("no MPA Request waiting")),
        }
    }

    /// Responder: accepts the Request with `private_data` in the Reply, and enters Full
    /// Operation. Receives may be posted before (the QP accepts them while connecting).
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), ConnError> {
        if self.tcp_close_requested {
            return Err(ConnError::InvalidState("the connection is closing"));
        }
        if let Phase::IftAwaitingAccept(pending) = &self.phase {
            if !private_data.is_empty() {
                return Err(IftError::Local("IFT carries no private data").into());
            }
            let (negotiated, reply) = (pending.negotiated, pending.reply);
            self.startup_record = Some(reply.to_vec());
            self.enter_ift_full(negotiated);
            self.events.push_back(ConnEvent::Established {
                private_data: Vec::new(),
            });
            return Ok(());
        }
        let Phase::AwaitingAccept(responder) = &mut self.phase else {
            return Err(ConnError::InvalidState("no MPA Request waiting"));
        };
        let (reply, negotiated) = responder.accept(private_data)?;
        self.startup_record = Some(reply);
        let rx_start = self.consumed;
        self.enter_full(negotiated, rx_start);
        self.events.push_back(ConnEvent::Established {
            private_data: Vec::new(),
        });
        Ok(())
    }

    /// Responder: rejects the Request (Reply with R=1); the connection closes once it is sent.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), ConnError> {
        if self.tcp_close_requested {
            return Err(ConnError::InvalidState("the connection is closing"));
        }
        if matches!(self.phase, Phase::IftAwaitingAccept(_)) {
            // IFT has no reject message: the connection just closes.
            self.phase = Phase::Done;
            self.qp.on_transport_error(TerminateCause::ConnectionLost);
            return Ok(());
        }
        let Phase::AwaitingAccept(responder) = &mut self.phase else {
            return Err(ConnError::InvalidState("no MPA Request waiting"));
        };
        let reply = responder.reject(private_data)?;
        self.startup_record = Some(reply);
        self.phase = Phase::Done;
        self.qp.on_transport_error(TerminateCause::ConnectionLost);
        Ok(())
    }

    fn enter_full(&mut self, negotiated: Negotiated, rx_start: u64) {
        if !self.initiator {
            if let Some(kind) = negotiated.rtr {
                // Only fails outside Idle, which a connecting QP is in.
                let _ = self.qp.expect_rtr(rtr_kind(kind));
            }
        }
        self.qp.enter_rts(negotiated.ird, negotiated.ord);
        if self.initiator {
            if let Some(kind) = negotiated.rtr {
                self.qp.send_rtr(rtr_kind(kind));
            }
        }
        let allocated = self.allocate_for_full();
        self.chains.reserve(MAX_CHAINS);
        let may_send = self.initiator || !negotiated.responder_waits_for_fpdu;
        let full = Full {
            rx_start,
            decoder: FpduDecoder::new(negotiated.crc, negotiated.markers_rx),
            locator: FpduLocator::new(negotiated.crc, negotiated.markers_rx),
            encoder: FpduEncoder::new(negotiated.crc, negotiated.markers_tx),
            may_send,
            awaiting_rtr: !may_send && negotiated.rtr.is_some(),
            rtr_deadline: None,
            negotiated,
        };
        self.phase = Phase::Full(Box::new(full));
        if !allocated {
            self.fail_locally("the reassembly budget could not hold the peer's early data");
        }
    }

    /// What Full Operation needs, either framing: the transmit ring, the placement records and
    /// the reassembly store at its full size. False if the store could not grow (the caller
    /// fails the connection once in Full Operation: [`IwarpConn::fail_locally`]).
    #[must_use]
    fn allocate_for_full(&mut self) -> bool {
        self.tx = TxRing::new(self.cfg.max_tx_fpdus.max(1));
        self.placed.reserve(self.cfg.max_placed_fpdus.min(1 << 16));
        if self
            .store
            .grow(
                self.consumed,
                self.cfg.reassembly_capacity,
                MAX_STORE_RANGES,
                self.cfg.reassembly_budget.clone(),
            )
            .is_err()
        {
            // The startup store's ranges fit a larger store, but its ring may find the budget
            // spent: the peer sent data behind its Request (or indication) before our Reply,
            // which no conforming peer does, and it is given nothing more.
            self.counters.store_refusals += 1;
            return false;
        }
        true
    }

    /// IFT Full Operation: the ring, the placement records and the full store as for MPA;
    /// IRD and ORD from `cfg.mpa` (IFT negotiates neither).
    fn enter_ift_full(&mut self, negotiated: ift::Negotiated) {
        self.qp.enter_rts(self.cfg.mpa.ird, self.cfg.mpa.ord);
        let allocated = self.allocate_for_full();
        self.phase = Phase::IftFull(Box::new(IftFull {
            decoder: FrameDecoder::new(negotiated.rx),
            encoder: FrameEncoder::new(negotiated.tx),
            written: Written::new(),
            negotiated,
        }));
        if !allocated {
            self.fail_locally("the reassembly budget could not hold the peer's early data");
        }
    }

    /// The queue pair: post work requests, poll completions, read its state.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// The queue pair, mutable.
    pub fn qp_mut(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// What MPA negotiated, once in Full Operation.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        match &self.phase {
            Phase::Full(full) => Some(&full.negotiated),
            _ => None,
        }
    }

    /// What the IFT adaption exchange agreed, once in Full Operation with IFT framing.
    pub fn ift_negotiated(&self) -> Option<&ift::Negotiated> {
        match &self.phase {
            Phase::IftFull(full) => Some(&full.negotiated),
            _ => None,
        }
    }

    /// True in Full Operation (MPA or IFT).
    pub fn is_established(&self) -> bool {
        matches!(self.phase, Phase::Full(_) | Phase::IftFull(_))
    }

    /// The largest ULPDU one segment of `emss` octets carries whole in this connection's
    /// framing (RFC 5044 4.5 for MPA, the Markers this direction sends included; IFT's frame
    /// header and CRCs otherwise), at most 65535. `None` before Full Operation.
    pub fn mulpdu(&self, emss: u16) -> Option<usize> {
        let emss = usize::from(emss);
        let m = match &self.phase {
            Phase::Full(full) => mpa::mulpdu(emss, full.negotiated.markers_tx),
            Phase::IftFull(full) => full.negotiated.tx.mulpdu(emss),
            _ => return None,
        };
        Some(m.min(usize::from(u16::MAX)))
    }

    /// Whether the connection frames with IFT.
    fn is_ift(&self) -> bool {
        self.cfg.ift.is_some()
    }

    /// The counters.
    pub fn counters(&self) -> ConnCounters {
        let mut c = self.counters;
        c.held_bytes = self.store.held;
        c.terminates_received = u64::from(self.qp.remote_terminate().is_some());
        c
    }

    /// Whether [`IwarpConn::poll`] should run before TCP transmits again: octets went back
    /// to TCP (a wrong IFT speculation, or no reassembly memory), and the peer is to hear of it
    /// at once, with what the poll does after a give-back (its in-order pass, the window).
    pub fn needs_poll(&self) -> bool {
        self.answered_take_back
    }

    /// Whether an event waits for [`IwarpConn::poll_event`].
    pub fn has_event(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<ConnEvent> {
        self.events.pop_front()
    }

    /// Starts a graceful close: the queue pair flushes, then TCP closes.
    pub fn close(&mut self) {
        self.qp.close();
    }

    /// The receive window to offer TCP past its `rcv_nxt`: the store's free room; all of it
    /// once nothing more is read (`rx_dead`: what arrives is discarded as consumed, and octets
    /// TCP passed up beyond a gap before then must not narrow it).
    fn window(&self, rcv_nxt_offset: u64) -> u64 {
        if self.rx_dead {
            return self.store.capacity as u64;
        }
        let behind = rcv_nxt_offset.saturating_sub(self.consumed);
        (self.store.capacity as u64).saturating_sub(behind)
    }

    // ------------------------------------------------------------------------------------
    // receive
    // ------------------------------------------------------------------------------------

    /// A segment's payload as TCP passed it up (in order or not, each octet once).
    ///
    /// In `TxMode::Source` the segment's ACK is taken first (its descriptors go), but the
    /// Sends and Writes it acknowledges complete after its data: a Terminate in the same
    /// segment names the one the peer refused, whose octets its TCP did receive
    /// (`QueuePair::message_acknowledged_deferred`); those before it complete, the rest flush.
    ///
    /// The answer is for TCP, as the pass-up callback's answer
    /// (`TcpConnection::handle_segment`): octets this connection gives back (a wrong IFT
    /// speculation, or octets the reassembly budget cannot hold), which TCP must take back
    /// before it takes anything after them. Dropping it leaves them given back here and
    /// acknowledged by TCP: the stream breaks.
    #[must_use = "TCP must take back the octets given back"]
    pub fn on_data<B: RegionBuffer>(
        &mut self,
        data: PassedUp<'_>,
        mem: &MemoryTable<B>,
    ) -> Option<TakeBack> {
        self.on_data_with_crc(data, None, mem)
    }

    /// [`on_data`](Self::on_data) told the CRC32c of `data.data` but its last four octets,
    /// computed as the segment was read for its TCP checksum ([`crate::SegmentDigest`]): an
    /// in-order segment that is one whole FPDU is checked against it rather than read again
    /// (`mpa::FpduDecoder::feed_spans_with_crc`), then placed. The answer as `on_data`'s.
    #[must_use = "TCP must take back the octets given back"]
    pub fn on_data_with_crc<B: RegionBuffer>(
        &mut self,
        data: PassedUp<'_>,
        covered_crc: Option<u32>,
        mem: &MemoryTable<B>,
    ) -> Option<TakeBack> {
        let source = self.source_mode == Some(true);
        if source {
            self.take_acknowledged(data.acked, true);
        }
        self.receive_segment(data, covered_crc, mem);
        if source {
            self.qp.complete_acknowledged();
        }
        let from = self.renege_at.take()?;
        self.answered_take_back = true;
        if std::mem::take(&mut self.renege_speculation) {
            self.counters.ift_acks_withheld += 1;
            self.speculation_answered = Some(from);
        }
        Some(TakeBack { from })
    }

    fn receive_segment<B: RegionBuffer>(
        &mut self,
        data: PassedUp<'_>,
        covered_crc: Option<u32>,
        mem: &MemoryTable<B>,
    ) {
        if data.data.is_empty() {
            return;
        }
        self.counters.segments += 1;
        let earned = (data.data.len() as u64).saturating_mul(SCAN_CREDIT_PER_OCTET);
        self.scan_credit = self.scan_credit.saturating_add(earned).min(SCAN_CREDIT_MAX);
        if self.rx_dead {
            // Nothing more is processed after a Terminate (RFC 5040 5.3): discard it, but as
            // consumed, so the receive window stays open. Held at a closed window, the peer
            // could never send its FIN behind the data it had queued, and the connection
            // would not close until the user timeout ended it.
            let end = data.stream_offset + data.data.len() as u64;
            self.consumed = self.consumed.max(end);
            return;
        }
        let mut off = data.stream_offset;
        let mut bytes = data.data;
        if let Some(x) = self.renege_at {
            // TCP will pass these up again once it has taken them back.
            let keep = x.saturating_sub(off).min(bytes.len() as u64) as usize;
            bytes = &bytes[..keep];
            if bytes.is_empty() {
                return;
            }
        }
        if off < self.consumed {
            // Already processed: cannot happen with a TCP that passes each octet once.
            let skip = (self.consumed - off).min(bytes.len() as u64) as usize;
            bytes = &bytes[skip..];
            off += skip as u64;
            if bytes.is_empty() {
                return;
            }
        }
        if off == self.consumed && !self.paused() {
            // The CRC covers the segment's data, only if none of it was cut off above.
            let known = covered_crc.filter(|_| bytes.len() == data.data.len());
            let used = self.process_in_order(bytes, known, mem);
            let rest = &bytes[used..];
            if !rest.is_empty() && !self.rx_dead {
                let at = off + used as u64;
                self.hold(at, rest);
            }
        } else {
            self.counters.segments_out_of_order += 1;
            let known = covered_crc.filter(|_| bytes.len() == data.data.len());
            self.out_of_order(off, bytes, known, mem);
        }
        self.drain(mem);
        self.follow_in_order_chain(mem);
        let pos = self.chains.partition_point(|c| c.1 <= self.consumed);
        self.chains.drain(..pos);
        if self.store.held > 0 {
            self.note_held_peaks(off, off + bytes.len() as u64);
        }
    }

    /// Keeps the held peaks ([`ConnCounters::held_run_peak`], `held_gap_peak`, `held_peak`
    /// and `held_peak_gaps`) after a segment of the stream octets `[start, end)`. The scan is
    /// bounded ([`PeakScan::window`]): with more than 64 held ranges, most segments scan only
    /// the ranges holding their octets and 4 on either side (where runs and gaps grew), and
    /// the whole list now and then, rather than all 1,024 a peer can make us hold (which cost
    /// a segment ~70 times its own processing). `held_peak_gaps` then comes from the last
    /// whole scan at a new peak, within a sixteenth of `held_peak`.
    fn note_held_peaks(&mut self, start: u64, end: u64) {
        let n = self.store.ranges.len();
        // The ranges holding octets of [start, end), and those right before and after it.
        let first = self.store.ranges.partition_point(|r| r.1 < start);
        let last = self.store.ranges.partition_point(|r| r.0 <= end);
        let held = self.store.held;
        let window = self
            .peak_scan
            .window(n, first..last, held, self.counters.held_peak);
        let whole = window.len() == n;
        let shape = self.held_per_gap(window);
        let c = &mut self.counters;
        c.held_run_peak = c.held_run_peak.max(shape.longest_run);
        c.held_gap_peak = c.held_gap_peak.max(shape.most_at_one_gap);
        if held > c.held_peak {
            c.held_peak = held;
            if whole {
                c.held_peak_gaps = shape.gaps;
            }
        }
    }

    /// The in-order decoder knows where the FPDU it is inside ends (its ULPDU_Length has
    /// arrived): if that lies in a held run beyond a gap, that run's FPDUs are found from there.
    fn follow_in_order_chain<B: RegionBuffer>(&mut self, mem: &MemoryTable<B>) {
        if self.rx_dead || self.store.held == 0 {
            return;
        }
        let Phase::Full(full) = &self.phase else {
            return;
        };
        let Some(next) = full.decoder.current_fpdu() else {
            return;
        };
        let next = full.rx_start + next.end;
        if next <= self.consumed || next == self.in_order_chain {
            return;
        }
        self.in_order_chain = next;
        self.walk_chain(next, (0, 0), mem);
    }

    /// Rescans held runs starting with the one holding `pos`, then, as long as a rescan ends
    /// inside an FPDU whose end lies in the next held run, that run too.
    fn walk_chain<B: RegionBuffer>(&mut self, mut pos: u64, seg: (u64, u64), mem: &MemoryTable<B>) {
        for _ in 0..MAX_CHAIN_WALK {
            if self.store.range_containing(pos).is_none() {
                return;
            }
            match self.relocate_held(pos, seg, mem) {
                Some(next) if next > pos => pos = next,
                _ => return,
            }
        }
    }

    /// Keeps the span `(header, end)` of an FPDU framed out of order whose end lies beyond
    /// the octets that framed it (no allocation: beyond [`MAX_CHAINS`] spans it is dropped,
    /// and the run after its gap is then located by Markers alone).
    fn add_chain(&mut self, span: (u64, u64)) {
        if span.1 <= self.consumed {
            return;
        }
        let i = self.chains.partition_point(|c| c.1 < span.1);
        if self.chains.get(i).is_some_and(|c| c.1 == span.1) {
            self.chains[i].0 = self.chains[i].0.min(span.0);
        } else if self.chains.len() < MAX_CHAINS {
            self.chains.insert(i, span);
        }
    }

    /// The first stream offset in `[start, end)` known to be an FPDU boundary: the end of a
    /// placed FPDU, where the in-order decoder's current FPDU ends, or the header or end of
    /// an FPDU framed out of order.
    fn known_boundary(&self, start: u64, end: u64) -> Option<u64> {
        let mut best = None::<u64>;
        let mut take = |b: u64| {
            if b >= start && b < end && best.is_none_or(|x| b < x) {
                best = Some(b);
            }
        };
        if self.placed_ends_at(start) {
            take(start);
        }
        if let Phase::Full(full) = &self.phase {
            if let Some(span) = full.decoder.current_fpdu() {
                take(full.rx_start + span.end);
            }
        }
        let i = self.chains.partition_point(|c| c.1 < start);
        for &(header, next) in self.chains[i..].iter().take(4) {
            take(header);
            take(next);
        }
        best
    }

    /// Whether a placed FPDU ends at stream offset `pos`.
    fn placed_ends_at(&self, pos: u64) -> bool {
        let i = self.placed.partition_point(|p| p.start < pos);
        i > 0 && self.placed[i - 1].end == pos
    }

    /// Whether a placed FPDU starts at stream offset `pos`.
    fn placed_starts_at(&self, pos: u64) -> bool {
        let i = self.placed.partition_point(|p| p.start < pos);
        self.placed.get(i).is_some_and(|p| p.start == pos)
    }

    /// Octets held at each gap (see [`ConnCounters::held_gap_peak`]): how many gaps hold
    /// octets, and the most one holds. Each held run is split at the gaps it touches: the
    /// part after a gap up to the first FPDU boundary known in the run is the back of the FPDU
    /// that gap cut, the rest (up to the next gap or placed FPDU) the front of the FPDU the
    /// next gap cuts. Runs lying between two placed FPDUs count as gaps of their own.
    /// Only the held ranges `window` (indices into the store's list) are looked at: a
    /// gap at the window's front edge counts only the octets after it.
    fn held_per_gap(&self, window: Range<usize>) -> HeldShape {
        let mut gaps = 0u64;
        let mut most = 0u64;
        let mut close = |octets: u64| {
            gaps += 1;
            most = most.max(octets);
        };
        let mut longest_run = 0u64;
        // The front of an FPDU cut by the gap after it: (where that gap starts, octets).
        let mut front: Option<(u64, u64)> = None;
        for &(s, e) in &self.store.ranges[window] {
            longest_run = longest_run.max(e - s);
            let gap_before = s != self.consumed && !self.placed_ends_at(s);
            let gap_after = !self.placed_starts_at(e);
            let back = if !gap_before {
                0
            } else if !gap_after {
                e - s
            } else {
                self.known_boundary(s + 1, e).map_or(e - s, |b| b - s)
            };
            if gap_before {
                let mut at_gap = back;
                if let Some((gap_start, octets)) = front.take() {
                    let i = self.placed.partition_point(|p| p.start < gap_start);
                    if self.placed.get(i).is_none_or(|p| p.start >= s) {
                        at_gap += octets; // the same gap
                    } else {
                        close(octets);
                    }
                }
                close(at_gap);
            } else if let Some((_, octets)) = front.take() {
                close(octets);
            }
            if e - s > back {
                if gap_after {
                    front = Some((e, e - s - back));
                } else {
                    close(e - s - back);
                }
            }
        }
        if let Some((_, octets)) = front {
            close(octets);
        }
        HeldShape {
            gaps,
            most_at_one_gap: most,
            longest_run,
        }
    }

    fn paused(&self) -> bool {
        matches!(
            self.phase,
            Phase::AwaitingAccept(_) | Phase::IftAwaitingAccept(_)
        )
    }

    /// Keeps octets in the reassembly store; an overflow (a peer past the window) ends the
    /// connection, a spent budget or a full range list gives the octets from `off` on back to
    /// TCP.
    fn hold(&mut self, off: u64, bytes: &[u8]) {
        match self.store.insert(self.consumed, off, bytes) {
            Ok(()) => self.counters.held_total += bytes.len() as u64,
            // (An initiator's store is budgeted from the start: FPDUs behind a lost Reply.)
            Err(StoreRefused::NoMemory | StoreRefused::TooManyRanges) if off > self.consumed => {
                self.counters.store_refusals += 1;
                self.give_back(off);
            }
            Err(_) if !self.is_established() && self.is_ift() => {
                // Data beyond the peer's indication before the exchange ended (an initiator
                // cannot know our VTag before our phase 1).
                self.ift_startup_failed(IftError::DataBeforeExchange);
            }
            Err(_) if !self.is_established() => {
                // The peer sent more than its Request before the Reply.
                self.startup_failed(MpaError::InvalidFrame(
                    "data beyond the MPA Request before the Reply",
                ));
            }
            Err(refused) => {
                if refused != StoreRefused::Full {
                    self.counters.store_refusals += 1;
                }
                self.fail_locally("the reassembly store could not hold the peer's data");
            }
        }
        // The peak is taken in `on_data`, once the segment is fully processed.
    }

    /// An out-of-order segment: place what can be placed, hold the rest. `covered_crc`: the
    /// CRC of the segment's octets as one FPDU, if the receiver computed it with the checksum
    /// (an aligned sender's segment is then checked without reading it again; MPA only).
    fn out_of_order<B: RegionBuffer>(
        &mut self,
        off: u64,
        bytes: &[u8],
        covered_crc: Option<u32>,
        mem: &MemoryTable<B>,
    ) {
        if let Phase::IftFull(full) = &self.phase {
            let n = &full.negotiated;
            if n.may_speculate && n.rx.header_crc && n.rx.verify {
                let fmt = n.rx;
                self.speculate(off, bytes, fmt, mem);
            } else {
                self.hold(off, bytes);
            }
            return;
        }
        let Phase::Full(full) = &mut self.phase else {
            self.hold(off, bytes);
            return;
        };
        if !full.locator.can_locate() || off < full.rx_start {
            self.hold(off, bytes);
            return;
        }
        let seg = (off, off + bytes.len() as u64);
        let known = self.known_boundary(seg.0, seg.1);
        let Phase::Full(full) = &mut self.phase else {
            return;
        };
        let rx_start = full.rx_start;
        let markers = full.negotiated.markers_rx;
        let position = off - rx_start;
        let qp = &self.qp;
        let placed = &mut self.placed;
        let max_placed = self.cfg.max_placed_fpdus;
        let counters = &mut self.counters;
        let store = &mut self.store;
        let consumed = self.consumed;
        let mut cursor = off;
        let mut first_placed = None;
        let mut overflow = None;
        let known = known.map(|k| k - rx_start);
        let found = full.locator.locate_from_with_crc(
            bytes,
            position,
            known,
            covered_crc,
            |span, ulpdu| {
                if placed.len() >= max_placed || overflow.is_some() {
                    return;
                }
                let header_len = DdpSegment::new_unchecked(ulpdu).header_len();
                if ulpdu.len() < header_len {
                    return;
                }
                let Some(early) = qp.place_early(ulpdu, mem) else {
                    return;
                };
                let start = fpdu_start(rx_start, span.start, markers, cursor);
                let end = rx_start + span.end;
                // Bytes between the previous placed FPDU and this one stay for the in-order pass.
                let gap = &bytes[(cursor - off) as usize..(start - off) as usize];
                if let Err(refused) = store.insert(consumed, cursor, gap) {
                    overflow = Some(refused);
                    return;
                }
                counters.held_total += gap.len() as u64;
                let (header, payload) = ulpdu.split_at(header_len);
                record_placed(placed, counters, (start, end), header, payload.len(), early);
                first_placed.get_or_insert(start);
                cursor = end;
            },
        );
        let tail = full.locator.tail();
        if found.is_none() {
            self.counters.unlocated_segments += 1;
        }
        match overflow {
            // Only the FPDUs before `cursor` were recorded: the one that found no room for
            // the octets before it comes again with them.
            Some(StoreRefused::NoMemory | StoreRefused::TooManyRanges) => {
                self.counters.store_refusals += 1;
                self.give_back(cursor);
                return;
            }
            Some(StoreRefused::Full) => {
                self.fail_locally("the peer sent beyond the reassembly store");
                return;
            }
            None => {}
        }
        let rest = &bytes[(cursor - off) as usize..];
        let at = cursor;
        self.hold(at, rest);
        let tail = tail.map(|t| (rx_start + t.start, rx_start + t.end));
        if let Some(t) = tail {
            self.add_chain(t);
        }
        // Pieces of one FPDU cut apart by a re-segmenting middlebox may now lie side by side.
        let first = self.store.range_containing(seg.0);
        let last = self.store.range_containing(seg.1 - 1);
        let mut next = self.relocate_held(seg.0, seg, mem);
        if last != first {
            next = self.relocate_held(seg.1 - 1, seg, mem);
        }
        // The FPDU the segment ends in says where the next one starts: when a held run after
        // a gap holds that position, its FPDUs are found from there.
        if let Some(next) = next.or(tail.map(|t| t.1)).filter(|&n| n > seg.1) {
            self.walk_chain(next, seg, mem);
        }
        if let Some(first) = first_placed.filter(|&f| f > off) {
            self.backfill(first, mem);
        }
    }

    /// Scans the held range around stream offset `pos` again, when it reaches beyond the
    /// segment `seg` just processed (octets of neighbouring segments joined it): the tail of one
    /// segment and the head of the next may together complete an FPDU that neither held whole
    /// (the sender was not header-aligned, or a middlebox re-cut the stream). FPDUs found are
    /// placed like those of a single segment and their octets leave the store, so it keeps
    /// about one partial FPDU per gap instead of one per segment boundary
    /// (draft-ietf-rddp-mpa-01 Appendix 11).
    ///
    /// The scan starts at the first FPDU boundary known in the run ([`Self::known_boundary`]:
    /// the end of the FPDU cut by the gap before it, when that FPDU's ULPDU_Length arrived),
    /// else where the locator finds one (header-aligned guess, Markers). Returns where the
    /// FPDU the run ends in ends, when the scan read its ULPDU_Length.
    fn relocate_held<B: RegionBuffer>(
        &mut self,
        pos: u64,
        seg: (u64, u64),
        mem: &MemoryTable<B>,
    ) -> Option<u64> {
        if self.rx_dead {
            return None;
        }
        let (start, end) = self.store.range_containing(pos)?;
        if (start >= seg.0 && end <= seg.1)
            || end - start > MAX_RELOCATE as u64
            || self.store.ranges.len() + MAX_RELOCATED > MAX_STORE_RANGES
        {
            return None;
        }
        let known = self.known_boundary(start, end);
        let Phase::Full(full) = &mut self.phase else {
            return None;
        };
        if start < full.rx_start || !full.locator.can_locate() {
            return None;
        }
        if !spend_scan_credit(&mut self.scan_credit, &mut self.counters, end - start) {
            return None;
        }
        let mut buf = std::mem::take(&mut self.relocate_buf);
        let mut found = std::mem::take(&mut self.relocated);
        self.store.copy_for_scan(start, end, &mut buf, &mut found);
        let rx_start = full.rx_start;
        let markers = full.negotiated.markers_rx;
        let qp = &self.qp;
        let placed = &mut self.placed;
        let max_placed = self.cfg.max_placed_fpdus;
        let counters = &mut self.counters;
        let mut cursor = start;
        let known = known.map(|k| k - rx_start);
        full.locator
            .locate_from(&buf, start - rx_start, known, |span, ulpdu| {
                if placed.len() >= max_placed || found.len() >= MAX_RELOCATED {
                    return;
                }
                let header_len = DdpSegment::new_unchecked(ulpdu).header_len();
                if ulpdu.len() < header_len {
                    return;
                }
                let Some(early) = qp.place_early(ulpdu, mem) else {
                    return;
                };
                let fpdu_start = fpdu_start(rx_start, span.start, markers, cursor);
                let fpdu_end = rx_start + span.end;
                let (header, payload) = ulpdu.split_at(header_len);
                record_placed(
                    placed,
                    counters,
                    (fpdu_start, fpdu_end),
                    header,
                    payload.len(),
                    early,
                );
                found.push((fpdu_start, fpdu_end));
                cursor = fpdu_end;
            });
        let tail = full
            .locator
            .tail()
            .map(|t| (rx_start + t.start, rx_start + t.end));
        self.store.remove_placed(&found);
        let first = found.first().map(|f| f.0);
        self.relocate_buf = buf;
        self.relocated = found;
        if let Some(first) = first {
            self.backfill(first, mem);
        }
        let tail = tail?;
        self.add_chain(tail);
        Some(tail.1)
    }

    /// Finds, backwards, the FPDUs held right before the FPDU placed at stream offset
    /// `first`: where a gap swallowed an FPDU's ULPDU_Length, the run after it is framed from
    /// the first header a Marker points at, and the FPDUs before that header (short ones,
    /// which hold no Marker) cannot be found forwards. Each ends where the next begins, so a
    /// held position whose ULPDU_Length ends the FPDU exactly there is a candidate, and its
    /// CRC decides (only with CRCs: without, nothing could check the guess). What is left
    /// held is the back of the FPDU the gap cut.
    fn backfill<B: RegionBuffer>(&mut self, first: u64, mem: &MemoryTable<B>) {
        if self.rx_dead || first == 0 {
            return;
        }
        let Some((start, end)) = self.store.range_containing(first - 1) else {
            return;
        };
        if end != first || self.store.ranges.len() + MAX_RELOCATED > MAX_STORE_RANGES {
            return;
        }
        let Phase::Full(full) = &mut self.phase else {
            return;
        };
        if !full.negotiated.crc || start < full.rx_start {
            return;
        }
        let start = start.max(first.saturating_sub(MAX_BACKFILL));
        if !spend_scan_credit(&mut self.scan_credit, &mut self.counters, end - start) {
            return;
        }
        let mut buf = std::mem::take(&mut self.relocate_buf);
        let mut found = std::mem::take(&mut self.relocated);
        self.store.copy_for_scan(start, end, &mut buf, &mut found);
        let rx_start = full.rx_start;
        let markers = full.negotiated.markers_rx;
        let is_marker = |pos: u64| markers && (pos - rx_start) % MARKER_INTERVAL < MARKER_LEN;
        let octet = |pos: u64| buf.get(usize::try_from(pos - start).ok()?).copied();
        let mut target = first;
        'fpdus: while found.len() < MAX_RELOCATED && self.placed.len() < self.cfg.max_placed_fpdus {
            // A Marker right before the next FPDU's header ends this FPDU.
            let fpdu_end = if markers && (target - rx_start) % MARKER_INTERVAL == MARKER_LEN {
                target - MARKER_LEN
            } else {
                target
            };
            // The shortest FPDU: ULPDU_Length and CRC around an empty ULPDU.
            let mut header = fpdu_end.saturating_sub(6);
            while header >= start {
                let second = if is_marker(header + 1) {
                    header + 1 + MARKER_LEN
                } else {
                    header + 1
                };
                if !is_marker(header) {
                    if let (Some(hi), Some(lo)) = (octet(header), octet(second)) {
                        let len = usize::from(u16::from_be_bytes([hi, lo]));
                        let rel = header - rx_start;
                        // Cheap first: the FPDU's octets without Markers must about fill
                        // the span (each Marker inside takes 4 octets more).
                        let span = (fpdu_end - header) as usize;
                        let most_markers = if markers {
                            MARKER_LEN as usize * (span / MARKER_INTERVAL as usize + 1)
                        } else {
                            0
                        };
                        let wire = mpa::wire::fpdu_len(len);
                        if wire <= span
                            && wire + most_markers >= span
                            && mpa::fpdu_end(rel, len, markers) == fpdu_end - rx_start
                        {
                            let from = (header - start) as usize;
                            let to = (fpdu_end - start) as usize;
                            let cost = (to - from) as u64;
                            if !spend_scan_credit(&mut self.scan_credit, &mut self.counters, cost) {
                                break 'fpdus;
                            }
                            let qp = &self.qp;
                            let placed = &mut self.placed;
                            let counters = &mut self.counters;
                            let mut placed_at = None;
                            full.locator.locate_from(
                                &buf[from..to],
                                rel,
                                Some(rel),
                                |span, ulpdu| {
                                    let header_len = DdpSegment::new_unchecked(ulpdu).header_len();
                                    if placed_at.is_some()
                                        || span.end != fpdu_end - rx_start
                                        || ulpdu.len() < header_len
                                    {
                                        return;
                                    }
                                    let Some(early) = qp.place_early(ulpdu, mem) else {
                                        return;
                                    };
                                    let s = fpdu_start(rx_start, span.start, markers, start);
                                    let (header, payload) = ulpdu.split_at(header_len);
                                    record_placed(
                                        placed,
                                        counters,
                                        (s, fpdu_end),
                                        header,
                                        payload.len(),
                                        early,
                                    );
                                    placed_at = Some(s);
                                },
                            );
                            if let Some(s) = placed_at {
                                found.push((s, fpdu_end));
                                target = s;
                                continue 'fpdus;
                            }
                        }
                    }
                }
                if header == 0 {
                    break;
                }
                header -= 1;
            }
            break;
        }
        self.store.remove_placed(&found);
        self.relocate_buf = buf;
        self.relocated = found;
    }

    /// Processes in-order octets at `self.consumed`; returns how many were used (fewer only
    /// when startup pauses for the application's accept).
    /// In-order octets `bytes` through the phase's decoder; `covered_crc`, the CRC of all of
    /// `bytes` but its last four octets (see [`on_data_with_crc`](Self::on_data_with_crc)).
    fn process_in_order<B: RegionBuffer>(
        &mut self,
        bytes: &[u8],
        mut covered_crc: Option<u32>,
        mem: &MemoryTable<B>,
    ) -> usize {
        let mut used = 0;
        while used < bytes.len() && !self.rx_dead {
            let rest = &bytes[used..];
            let n = match &mut self.phase {
                Phase::Initiating(initiator) => {
                    let now = self.epoch + Duration::from_nanos(self.now.as_nanos());
                    match initiator.feed(rest, now) {
                        Ok((n, InitiatorEvent::NeedMore)) => n.max(rest.len()),
                        Ok((
                            n,
                            InitiatorEvent::Accepted {
                                negotiated,
                                private_data,
                            },
                        )) => {
                            let rx_start = self.consumed + n as u64;
                            self.enter_full(negotiated, rx_start);
                            self.events
                                .push_back(ConnEvent::Established { private_data });
                            n
                        }
                        Ok((
                            _,
                            InitiatorEvent::Rejected {
                                private_data,
                                peer_params,
                            },
                        )) => {
                            self.events.push_back(ConnEvent::Rejected {
                                private_data,
                                peer_params,
                            });
                            self.phase = Phase::Done;
                            self.rx_dead = true;
                            self.qp.on_transport_error(TerminateCause::ConnectionLost);
                            rest.len()
                        }
                        Err(e) => {
                            let terminate = startup_terminate(initiator, &e);
                            self.startup_failed(e);
                            // Sent before the close that `Phase::Done` leads to.
                            self.startup_record = terminate;
                            rest.len()
                        }
                    }
                }
                Phase::AwaitingRequest(responder) => {
                    let now = self.epoch + Duration::from_nanos(self.now.as_nanos());
                    match responder.feed(rest, now) {
                        Ok((n, None)) => n.max(rest.len()),
                        Ok((n, Some(info))) => {
                            let Phase::AwaitingRequest(responder) =
                                std::mem::replace(&mut self.phase, Phase::Done)
                            else {
                                unreachable!("matched above")
                            };
                            self.phase = Phase::AwaitingAccept(responder);
                            self.events.push_back(ConnEvent::Request(info));
                            self.consumed += n as u64;
                            return used + n;
                        }
                        Err(e) => {
                            self.startup_failed(e);
                            rest.len()
                        }
                    }
                }
                Phase::AwaitingAccept(_) | Phase::IftAwaitingAccept(_) => return used,
                Phase::IftInitiating(initiator) => {
                    let now = self.epoch + Duration::from_nanos(self.now.as_nanos());
                    match initiator.feed(rest, now) {
                        Ok((n, None)) => n.max(rest.len()),
                        Ok((n, Some(negotiated))) => {
                            self.enter_ift_full(negotiated);
                            self.events.push_back(ConnEvent::Established {
                                private_data: Vec::new(),
                            });
                            n
                        }
                        Err(e) => {
                            self.ift_startup_failed(e);
                            rest.len()
                        }
                    }
                }
                Phase::IftAwaitingIndication(responder) => {
                    let now = self.epoch + Duration::from_nanos(self.now.as_nanos());
                    match responder.feed(rest, now) {
                        Ok((n, None)) => n.max(rest.len()),
                        Ok((n, Some((negotiated, reply)))) => {
                            let deadline = now.checked_add(self.cfg.mpa.accept_timeout);
                            self.phase = Phase::IftAwaitingAccept(Box::new(IftPending {
                                negotiated,
                                reply,
                                deadline,
                            }));
                            self.events.push_back(ConnEvent::IftRequest(negotiated));
                            self.consumed += n as u64;
                            return used + n;
                        }
                        Err(e) => {
                            self.ift_startup_failed(e);
                            rest.len()
                        }
                    }
                }
                Phase::IftFull(full) => {
                    let qp = &mut self.qp;
                    let counters = &mut self.counters;
                    let placed = &self.placed;
                    let IftFull {
                        decoder, written, ..
                    } = &mut **full;
                    // Section 8.2: an in-order placement over a speculative one not yet
                    // confirmed (the same octets of a buffer, written later in the stream)
                    // makes the speculative one invalid: it must be placed again, after.
                    let mut overwritten: Option<u64> = None;
                    let res = decoder.feed(rest, |frame| {
                        counters.fpdus_rx += 1;
                        let t = PlacementTarget::of(frame.ddp_header, frame.payload.len());
                        if let Some(t) = &t {
                            written.record(t, true);
                            // `placed` is in stream order: the first hit is the earliest.
                            let hit = placed
                                .iter()
                                .find(|p| p.target.is_some_and(|q| q.overlaps(t)));
                            if let Some(p) = hit {
                                overwritten = Some(overwritten.map_or(p.start, |x| x.min(p.start)));
                            }
                        }
                        if qp.on_segment(frame.ddp_header, frame.payload, mem).is_ok() {
                            counters.bytes_placed_in_order += frame.payload.len() as u64;
                        }
                    });
                    if let Err(e) = res {
                        self.ift_failed(e);
                    } else if let Some(at) = overwritten {
                        // Its octets come again from the peer and are placed in order.
                        self.withdraw_speculation(at);
                    }
                    rest.len()
                }
                Phase::Full(full) => {
                    let qp = &mut self.qp;
                    let counters = &mut self.counters;
                    let mut got_fpdu = false;
                    let known = covered_crc.take().filter(|_| used == 0);
                    let res = full.decoder.feed_spans_with_crc(rest, known, |_, ulpdu| {
                        got_fpdu = true;
                        counters.fpdus_rx += 1;
                        let header_len = DdpSegment::new_unchecked(ulpdu).header_len();
                        if qp.on_ulpdu(ulpdu, mem).is_ok() {
                            counters.bytes_placed_in_order +=
                                ulpdu.len().saturating_sub(header_len) as u64;
                        }
                    });
                    if got_fpdu {
                        full.may_send = true;
                    }
                    if let Err(e) = res {
                        let may_send = full.may_send;
                        self.mpa_failed(e, may_send);
                    }
                    rest.len()
                }
                Phase::Done => rest.len(),
            };
            used += n;
            self.consumed += n as u64;
        }
        if self.rx_dead {
            bytes.len()
        } else {
            used
        }
    }

    /// The IFT adaption exchange failed: the connection closes, no Terminate (section 4.2).
    fn ift_startup_failed(&mut self, e: IftError) {
        self.events.push_back(ConnEvent::IftStartupFailed(e));
        self.phase = Phase::Done;
        self.rx_dead = true;
        self.qp.on_transport_error(TerminateCause::ConnectionLost);
    }

    /// A frame failed a check: stop receiving, Terminate of layer LLP with the IFT code.
    fn ift_failed(&mut self, e: IftError) {
        match e {
            IftError::HeaderCrc { .. } => self.counters.ift_header_crc_errors += 1,
            IftError::PayloadCrc { .. } => self.counters.ift_payload_crc_errors += 1,
            _ => {}
        }
        if matches!(e, IftError::HeaderCrc { .. } | IftError::PayloadCrc { .. }) {
            self.counters.crc_errors += 1;
        }
        self.qp
            .on_transport_error(TerminateCause::Llp { code: e.code() });
        self.events.push_back(ConnEvent::IftFailed(e));
        self.rx_dead = true;
    }

    /// Whether we may send FPDUs, a Terminate among them: in Full Operation, unless we are an
    /// MPA Responder that has not yet received a valid FPDU (RFC 5044 7.1.2 rule 4). Before
    /// Full Operation no FPDU can be framed.
    fn may_send_fpdus(&self) -> bool {
        match &self.phase {
            Phase::Full(full) => full.may_send,
            Phase::IftFull(_) => true,
            _ => false,
        }
    }

    /// A local error (the reassembly store or the budget refusing the peer's data, a gap
    /// never filled): the connection ends, with a Terminate for a local catastrophic error
    /// (RFC 5040 7.1) where we may send one; where we may not, it just closes, as on an MPA
    /// error then. A Terminate that could never be sent would leave the queue pair in
    /// Terminate, the connection open and its work never flushed.
    fn fail_locally(&mut self, reason: &'static str) {
        if self.rx_dead {
            // Failed already (a take-back refused after an MPA error, say): the first
            // cause stands.
            return;
        }
        self.rx_dead = true;
        if self.may_send_fpdus() {
            self.qp
                .on_transport_error(TerminateCause::LocalCatastrophic);
        } else {
            self.qp.on_transport_error(TerminateCause::ConnectionLost);
            self.events.push_back(ConnEvent::ClosedLocally(reason));
        }
    }

    fn startup_failed(&mut self, e: MpaError) {
        self.events.push_back(ConnEvent::StartupFailed(e));
        self.phase = Phase::Done;
        self.rx_dead = true;
        self.qp.on_transport_error(TerminateCause::ConnectionLost);
    }

    /// An MPA error in Full Operation: stop receiving and report it (RFC 5044 8, RFC 5040
    /// 7.1: Terminate with layer LLP and the MPA code).
    fn mpa_failed(&mut self, e: MpaError, may_send: bool) {
        if matches!(
            e,
            MpaError::CrcMismatch { .. } | MpaError::LocatedMarkerCrcMismatch { .. }
        ) {
            self.counters.crc_errors += 1;
        }
        let cause = if may_send {
            TerminateCause::Llp { code: e.code() }
        } else {
            // A Responder that has not yet received a valid FPDU may send nothing, not even
            // a Terminate (RFC 5044 7.1.2 rule 4): the connection just closes.
            TerminateCause::ConnectionLost
        };
        self.qp.on_transport_error(cause);
        self.events.push_back(ConnEvent::MpaFailed(e));
        self.rx_dead = true;
    }

    /// Moves the in-order point over held octets and early-placed FPDUs as far as it can.
    fn drain<B: RegionBuffer>(&mut self, mem: &MemoryTable<B>) {
        while !self.rx_dead && !self.paused() {
            if self
                .placed
                .front()
                .is_some_and(|p| p.start == self.consumed)
            {
                self.deliver_placed(mem);
                continue;
            }
            let Some(end) = self.store.range_at(self.consumed) else {
                break;
            };
            let start = self.consumed;
            let store = std::mem::take(&mut self.store);
            let (a, b) = store.slices(start, end);
            let mut used = self.process_in_order(a, None, mem);
            if used == a.len() && !self.rx_dead {
                used += self.process_in_order(b, None, mem);
            }
            self.store = store;
            self.store.release_to(self.consumed);
            if let Some(at) = self.renege_at {
                // A withdrawal while the store was out: what it holds from there comes again.
                self.store.truncate_from(at);
            }
            if (used as u64) < end - start {
                break;
            }
        }
        if self.rx_dead {
            self.store.release_to(u64::MAX);
            self.placed.clear();
        }
    }

    /// IFT speculative placement (draft section 8) of an out-of-order segment: the frames
    /// that lie whole in it from its first octet on (our senders start a segment with a frame,
    /// as for MPA) are guessed there and confirmed by every check section 8.1 lists that the
    /// frame has: VTag, header_size and payload_size (the frame must end inside the segment),
    /// the header CRC (required: without it a guess rests on the 16-bit VTag alone, so we do
    /// not speculate) and the payload CRC if the peer sends one; then the DDP and RDMAP checks
    /// of [`QueuePair::place_segment_early`] (STag, access, TO and length for tagged frames;
    /// QN, MSN and MO against a posted receive for Sends; DDP and RDMAP versions). A frame
    /// whose target overlaps one placed speculatively and not yet confirmed is not placed
    /// (section 8.2: a placement that later proves wrong must not have overwritten one that
    /// may be right). What is not placed is held for the in-order pass, which reports any
    /// error at its place in the stream (nothing is reported speculatively); the first octet
    /// that is no valid frame ends the guessing for the segment.
    fn speculate<B: RegionBuffer>(
        &mut self,
        off: u64,
        bytes: &[u8],
        fmt: ift::FrameFormat,
        mem: &MemoryTable<B>,
    ) {
        let mut at = 0;
        let mut held_from = 0;
        while at < bytes.len() && self.placed.len() < self.cfg.max_placed_fpdus {
            // Placing a frame may split what is held around it in two: keep room for that
            // (else stop guessing and hold the rest of the segment as one range).
            if self.store.ranges.len() + 2 > self.store.max_ranges {
                break;
            }
            let Some((len, frame)) = ift::whole_frame_at(&fmt, &bytes[at..]) else {
                break;
            };
            let target = PlacementTarget::of(frame.ddp_header, frame.payload.len());
            let fresh = match (&self.phase, &target) {
                (Phase::IftFull(full), Some(t)) => full.written.may_speculate(t),
                _ => false,
            };
            if !fresh {
                self.counters.ift_speculation_refused += 1;
            }
            let placed = if fresh && self.placed.len() < MAX_UNCONFIRMED {
                self.qp
                    .place_segment_early(frame.ddp_header, frame.payload, mem)
            } else {
                None
            };
            if let Some(early) = placed {
                if let (Phase::IftFull(full), Some(t)) = (&mut self.phase, &target) {
                    full.written.record(t, false);
                }
                // The octets before it (frames not placed) wait for the in-order pass.
                let run = &bytes[held_from..at];
                self.hold(off + held_from as u64, run);
                let given_back = self.renege_at.is_some_and(|x| x <= off + at as u64);
                if self.rx_dead || given_back {
                    // (Given back: the frame comes again with the octets before it.)
                    return;
                }
                let span = (off + at as u64, off + (at + len) as u64);
                record_placed(
                    &mut self.placed,
                    &mut self.counters,
                    span,
                    frame.ddp_header,
                    frame.payload.len(),
                    early,
                );
                held_from = at + len;
            }
            at += len;
        }
        if at == 0 {
            self.counters.unlocated_segments += 1;
        }
        self.hold(off + held_from as u64, &bytes[held_from..]);
    }

    /// A speculative placement at stream offset `at` (the in-order point) was not confirmed:
    /// the guess was wrong. Its octets and everything after them are needed again, and the
    /// only copy is the peer's: every placement and held octet from `at` on is dropped, and
    /// TCP is asked (before it acknowledges them, [`IwarpConn::give_back`]) to take them
    /// back, so the peer resends them and they are processed in order (section 8: "withhold TCP
    /// acknowledgement of this segment and force the remote end to retransmit it"). If TCP
    /// can no longer (it acknowledged them), the connection ends with
    /// `IftError::SpeculationMismatch`.
    fn withdraw_speculation(&mut self, at: u64) {
        let keep = self.placed.partition_point(|p| p.start < at);
        self.counters.ift_speculation_withdrawn += (self.placed.len() - keep) as u64;
        self.renege_speculation = true;
        self.give_back(at);
    }

    /// Forgets every placement and held octet from stream offset `at` on and asks TCP to take
    /// those octets back, so that the peer sends them again: in the answer to the data being
    /// passed up ([`TakeBack`], before TCP takes anything after them, the peer's FIN included),
    /// or at the next `poll` when it happens there. For a
    /// speculation that proved wrong, or octets out of order the reassembly budget cannot
    /// pay to hold ([`ConnConfig::reassembly_budget`]; RFC 2018 section 8 lets a receiver
    /// discard what it has only SACKed). What an early placement wrote is written again,
    /// the same octets, when they come back.
    fn give_back(&mut self, at: u64) {
        let keep = self.placed.partition_point(|p| p.start < at);
        self.placed.truncate(keep);
        // (`drain` may have the store out while this runs: it truncates it again when it
        // puts it back.)
        self.store.truncate_from(at);
        self.renege_at = Some(self.renege_at.map_or(at, |x| x.min(at)));
    }

    /// A give-back's pending request to TCP ([`IwarpConn::give_back`]): before anything TCP
    /// sends could acknowledge the octets. If TCP can no longer take them back (it
    /// acknowledged them, or the peer's FIN came), a wrong speculation ends the connection
    /// with `IftError::SpeculationMismatch`, octets the budget could not hold with a
    /// Terminate (local catastrophic error).
    fn apply_renege(&mut self, tcp: &mut TcpConnection) {
        if let Some(at) = self.renege_at.take() {
            let speculation = std::mem::take(&mut self.renege_speculation);
            if !tcp.renege_from(at) {
                self.take_back_refused(at, speculation);
            } else if speculation {
                self.counters.ift_acks_withheld += 1;
            }
        }
    }

    /// TCP could not take back octets given back from `at` on: it acknowledged them, or
    /// took the peer's FIN after them. A wrong speculation (`speculation`) ends the
    /// connection with `IftError::SpeculationMismatch`, octets the budget could not hold
    /// with a Terminate (local catastrophic error).
    fn take_back_refused(&mut self, at: u64, speculation: bool) {
        if self.rx_dead {
            // Failed already: the first cause stands.
            return;
        }
        if speculation {
            self.ift_failed(IftError::SpeculationMismatch { offset: at });
        } else {
            self.fail_locally("data given back for want of memory was acknowledged already");
        }
    }

    /// The in-order point reached an FPDU placed early: skip its octets and let the queue
    /// pair do the in-order part.
    fn deliver_placed<B: RegionBuffer>(&mut self, mem: &MemoryTable<B>) {
        let Some(p) = self.placed.pop_front() else {
            return;
        };
        if let Phase::IftFull(full) = &self.phase {
            // Section 8: the speculation is confirmed from the length fields of every frame
            // before it: the in-order framing must have ended a frame right here.
            if full.decoder.buffered() != 0 {
                self.placed.push_front(p);
                self.withdraw_speculation(p.start);
                return;
            }
            self.consumed = p.end;
            self.counters.fpdus_rx += 1;
            self.counters.ift_speculation_confirmed += 1;
            let header = &p.header[..usize::from(p.header_len)];
            let _ = self
                .qp
                .on_placed_ulpdu(header, p.payload_len as usize, p.early, mem);
            return;
        }
        let Phase::Full(full) = &mut self.phase else {
            return;
        };
        let position = p.start - full.rx_start;
        if !full.decoder.at_fpdu_boundary() || full.decoder.stream_position() != position {
            // The located FPDU disagrees with the in-order framing (a CRC that matched by
            // chance, or a hostile peer): a framing error, code 3.
            let may_send = full.may_send;
            self.mpa_failed(MpaError::LocatedFpduMismatch { position }, may_send);
            return;
        }
        // A Marker read in order right before it: the located FPDU's CRC was checked with the
        // zero Marker a Marker between FPDUs is (its octets were not in that FPDU's segment),
        // so the one received must be that.
        if let Err(e) = full.decoder.check_marker_before_located() {
            let may_send = full.may_send;
            self.mpa_failed(e, may_send);
            return;
        }
        full.decoder.reset(p.end - full.rx_start);
        full.may_send = true;
        self.consumed = p.end;
        self.counters.fpdus_rx += 1;
        let header = &p.header[..usize::from(p.header_len)];
        let _ = self
            .qp
            .on_placed_ulpdu(header, p.payload_len as usize, p.early, mem);
    }

    // ------------------------------------------------------------------------------------
    // transmit, events, timers
    // ------------------------------------------------------------------------------------

    /// TCP reports the peer has acknowledged our stream up to offset `acked`
    /// (`TcpConnection::bytes_acked`): in `TxMode::Source`, Sends and Writes whose last FPDU
    /// lies below complete and their descriptors go. [`IwarpConn::poll`] and
    /// [`IwarpConn::on_data`] do this themselves; call it before [`IwarpConn::on_tcp_event`] so
    /// that what the segment carrying a FIN or a reset acknowledged completes before the queue
    /// pair is flushed.
    pub fn on_tcp_acked(&mut self, acked: u64) {
        if self.source_mode == Some(true) {
            self.release_acknowledged(acked);
        }
    }

    /// Every event `tcp` (this connection's TCP connection) has queued, each after
    /// [`IwarpConn::on_tcp_acked`] with what TCP has acknowledged by then, as the engine's
    /// driver hands them over: for callers that drive the TCP connection themselves (a
    /// simulator, tests, benches).
    pub fn take_tcp_events(&mut self, tcp: &mut TcpConnection) {
        // Bounded: only TCP queues these events, and nothing here makes it queue more.
        while let Some(ev) = tcp.poll_event() {
            self.on_tcp_acked(tcp.bytes_acked());
            self.on_tcp_event(ev);
        }
    }

    /// This connection's TCP is gone for good: nothing of the transmit ring is sent again, so
    /// the requests it was sending from complete if flushed
    /// (`rdmap::QueuePair::set_sources_busy`).
    pub fn transport_gone(&mut self) {
        self.tx.clear();
        self.startup_sent = None;
        self.qp.set_sources_busy(false);
        self.qp.set_read_responses_unacknowledged(false);
    }

    /// A TCP event of this connection.
    pub fn on_tcp_event(&mut self, event: TcpEvent) {
        match event {
            TcpEvent::Connected => self.tcp_established = true,
            TcpEvent::EmssChanged(_) => {}
            TcpEvent::TakeBackRefused { offset } => {
                let speculation = self.speculation_answered == Some(offset);
                if speculation {
                    // Counted as withheld when the answer went to TCP.
                    self.counters.ift_acks_withheld =
                        self.counters.ift_acks_withheld.saturating_sub(1);
                }
                self.take_back_refused(offset, speculation);
            }
            TcpEvent::PeerClosed
            | TcpEvent::Closed
            | TcpEvent::Reset
            | TcpEvent::TimedOut
            | TcpEvent::SourceFailed => {
                if event == TcpEvent::SourceFailed {
                    let e = self
                        .tx_failed
                        .take()
                        .unwrap_or(TxSourceError { offset: 0, len: 0 });
                    self.events.push_back(ConnEvent::TransmitSourceFailed(e));
                }
                if event != TcpEvent::PeerClosed {
                    // TCP is gone: nothing will be asked for again. (After the peer's FIN our
                    // own unacknowledged octets may still need retransmitting.)
                    self.transport_gone();
                }
                if !self.tcp_closed {
                    self.tcp_closed = true;
                    self.rx_dead = true;
                    self.qp.on_transport_error(TerminateCause::ConnectionLost);
                    if !self.is_established() && !matches!(self.phase, Phase::Done) {
                        self.events.push_back(
                            if event == TcpEvent::Reset && !self.tcp_established {
                                ConnEvent::ConnectionRefused
                            } else if self.is_ift() {
                                ConnEvent::IftStartupFailed(IftError::ConnectionLost)
                            } else {
                                ConnEvent::StartupFailed(MpaError::ConnectionLost)
                            },
                        );
                        self.phase = Phase::Done;
                    }
                    self.events.push_back(ConnEvent::TransportClosed(event));
                }
            }
        }
    }

    /// Once per turn (and after receiving): runs MPA deadlines, queues FPDUs for TCP (whole
    /// FPDUs as records, as many as TCP's send buffer takes), sets the receive window and
    /// closes TCP once the queue pair is done. `tcp` is this connection's TCP connection.
    pub fn poll<B: RegionBuffer>(
        &mut self,
        tcp: &mut TcpConnection,
        mem: &MemoryTable<B>,
        now: Instant,
    ) {
        self.now = now;
        let source = *self
            .source_mode
            .get_or_insert(tcp.config().tx_mode == TxMode::Source);
        if source && self.qp.tx_completion() != rdmap::TxCompletion::Acknowledged {
            self.qp.set_tx_completion(rdmap::TxCompletion::Acknowledged);
        }
        // Startup deadlines (MPA's, IFT's); in Full Operation there are none and the clock
        // is not converted.
        if !matches!(self.phase, Phase::Full(_) | Phase::IftFull(_) | Phase::Done) {
            self.startup_deadlines();
        } else {
            self.rtr_deadline(now);
            self.held_deadline(now);
            self.close_unsendable_terminate();
        }
        // What pass-ups gave back went to TCP with their answers, and a refusal came as a TCP
        // event before this poll.
        self.speculation_answered = None;
        self.answered_take_back = false;
        self.drain(mem);
        // What the drain gave back (an IFT placement its in-order pass did not confirm).
        self.apply_renege(tcp);
        if matches!(self.phase, Phase::Full(_) | Phase::IftFull(_)) {
            self.release_idle_store(now);
        }
        if let Some(record) = self.startup_record.take() {
            let start = tcp.send_stream_end();
            let queued = if source {
                tcp.send_record_len(record.len())
            } else {
                tcp.send_record(&record)
            };
            match queued {
                Ok(()) => {
                    self.tx_seq_start = start + record.len() as u64;
                    if source {
                        self.startup_sent = Some((start, record));
                    }
                }
                Err(SendError::BufferFull) => self.startup_record = Some(record),
                Err(_) => {}
            }
        }
        if source {
            self.release_acknowledged(tcp.bytes_acked());
            self.transmit_described(tcp, mem);
        } else {
            self.transmit(tcp, mem);
        }
        tcp.set_receive_window(self.window(tcp.rcv_nxt_offset()));
        let st = tcp.stats();
        self.counters.retransmissions = st.retransmitted_segments;
        self.counters.rto_expirations = st.rto_expirations;
        self.counters.loss_probes = st.tlp_probes;
        self.counters.fast_recoveries = st.fast_recoveries;
        self.counters.spurious_undone = st.spurious_rtos + st.dsack_undos;
        self.counters.paws_drops = st.paws_drops;
        self.counters.send_limited_ns = [
            st.snd_lim_time_rwin_ns,
            st.snd_lim_time_cwnd_ns,
            st.snd_lim_time_sender_ns,
        ];
        let done = match &self.phase {
            Phase::Done => self.startup_record.is_none(),
            _ => {
                matches!(self.qp.state(), QpState::Error | QpState::Closing)
                    && !self.qp.has_pending_transmit()
            }
        };
        if done && !self.tcp_close_requested {
            self.tcp_close_requested = true;
            // The stream is done both ways for us: nothing more is read.
            tcp.close_orphaned();
        }
        if self.tcp_close_requested
            && !self.full_buffers_released
            && self.tx.is_empty()
            && self.startup_sent.is_none()
            && matches!(
                tcp.state(),
                TcpState::FinWait2 | TcpState::TimeWait | TcpState::Closed
            )
        {
            self.release_full_buffers();
        }
    }

    /// Lets go of what Full Operation allocated (the transmit ring, the placement records,
    /// the reassembly store and the scan buffers: about 1.3 MiB with the default sizes) once
    /// the connection needs none of it: nothing more is read (the stream is done both ways
    /// for us) and TCP holds nothing of ours unacknowledged (FIN-WAIT-2, TIME-WAIT or
    /// closed), while the TCP connection itself may stay up to TIME-WAIT's 60 s (RFC 9293
    /// 3.6.1). Before, a peer opening and closing connections in a loop kept that much
    /// memory per lingering connection (up to a quarter of the table). Octets the peer still
    /// sends are discarded as consumed, as after a Terminate: the receive window stays as
    /// wide as the store's capacity, so records the peer had queued before our close still
    /// go, and its FIN behind them.
    fn release_full_buffers(&mut self) {
        self.full_buffers_released = true;
        self.rx_dead = true;
        // Nothing is queued after this (`transmit`, `transmit_described`).
        self.tx = TxRing::new(1);
        self.placed = VecDeque::new();
        self.chains = Vec::new();
        self.relocate_buf = Vec::new();
        self.relocated = Vec::new();
        // The old store gives its charge back to the reassembly budget; the new one keeps
        // the capacity (the window offered, `IwarpConn::window`) without its ring, which
        // nothing allocates again (nothing is inserted once `rx_dead`).
        self.store = Store::new(self.store.capacity, 0, None);
        self.held_deadline = None;
        self.store_idle_since = None;
        self.ulpdu = Vec::new();
        self.frame = Vec::new();
        // The decoders' buffers (the locator's reserved on its first out-of-order scan, the
        // in-order decoder's grown to the largest FPDU it buffered); nothing decodes again.
        match &mut self.phase {
            Phase::Full(full) => {
                let n = &full.negotiated;
                full.decoder = FpduDecoder::new(n.crc, n.markers_rx);
                full.locator = FpduLocator::new(n.crc, n.markers_rx);
            }
            Phase::IftFull(full) => {
                full.decoder = FrameDecoder::new(full.negotiated.rx);
                full.written.release();
            }
            _ => {}
        }
    }

    /// Octets of the buffers Full Operation allocates that this connection holds: the
    /// transmit ring, the placement records, the chains, the framing buffers (the in-order
    /// FPDU decoder's and the locator's, each up to the largest ULPDU, among them; with IFT
    /// the frame decoder's, up to the largest frame, and the record of what speculation
    /// wrote) and the reassembly memory ([`IwarpConn::reassembly_memory`]); their capacities,
    /// whether touched or not.
    pub fn full_buffer_octets(&self) -> usize {
        let decoder = match &self.phase {
            Phase::Full(full) => full.decoder.buffer_capacity() + full.locator.buffer_capacity(),
            Phase::IftFull(full) => full.decoder.buffer_capacity() + full.written.memory(),
            _ => 0,
        };
        self.tx.octets()
            + self.placed.capacity() * std::mem::size_of::<PlacedFpdu>()
            + self.chains.capacity() * std::mem::size_of::<(u64, u64)>()
            + self.ulpdu.capacity()
            + self.frame.capacity()
            + decoder
            + self.reassembly_memory()
    }

    /// Drops what the peer acknowledged (stream offsets below `acked`): the startup frame and
    /// FPDU descriptors; an FPDU ending a Send or Write completes its work request.
    fn release_acknowledged(&mut self, acked: u64) {
        self.take_acknowledged(acked, false);
    }

    /// [`IwarpConn::release_acknowledged`]; with `defer` the work requests complete at the
    /// next `QueuePair::complete_acknowledged`.
    fn take_acknowledged(&mut self, acked: u64, defer: bool) {
        if self
            .startup_sent
            .as_ref()
            .is_some_and(|(s, r)| s + r.len() as u64 <= acked)
        {
            self.startup_sent = None;
        }
        let IwarpConn { tx, qp, .. } = self;
        tx.release_to(acked, |f| match (f.completes, defer) {
            (true, false) => qp.message_acknowledged(),
            (true, true) => qp.message_acknowledged_deferred(),
            (false, _) => {}
        });
        qp.set_sources_busy(!tx.is_empty());
        qp.set_read_responses_unacknowledged(tx.has_read_responses());
    }

    /// `TxMode::Source`: queues FPDU descriptors (no payload copy) and their lengths in TCP.
    fn transmit_described<B: RegionBuffer>(
        &mut self,
        tcp: &mut TcpConnection,
        mem: &MemoryTable<B>,
    ) {
        if self.startup_record.is_some() || self.full_buffers_released {
            return;
        }
        let emss = usize::from(tcp.emss());
        // Nothing in the loop changes TCP's EMSS: the MULPDU once per turn, not per FPDU.
        let mulpdu = match &self.phase {
            Phase::Full(full) => {
                if !full.may_send {
                    return;
                }
                if !self.tx_started {
                    self.tx_started = true;
                    self.tx.start(
                        full.negotiated.crc,
                        full.negotiated.markers_tx,
                        self.tx_seq_start,
                        self.qp.pd(),
                    );
                }
                mpa::mulpdu(emss, full.negotiated.markers_tx)
            }
            Phase::IftFull(full) => {
                if !self.tx_started {
                    self.tx_started = true;
                    self.tx
                        .start_ift(full.negotiated.tx, self.tx_seq_start, self.qp.pd());
                }
                full.negotiated.tx.mulpdu(emss)
            }
            _ => return,
        }
        .min(usize::from(u16::MAX));
        loop {
            let start = tcp.send_stream_end();
            // Room for the largest FPDU this MULPDU can give (Markers and PAD included).
            if self.tx.is_full()
                || tcp.send_capacity() < self.tx.wire_len(start, mulpdu)
                || tcp.send_queue_len() >= self.cfg.tx_ahead
            {
                return;
            }
            self.ulpdu.clear();
            let Some(seg) = self.qp.poll_transmit_segment(mulpdu, mem, &mut self.ulpdu) else {
                return;
            };
            if seg.ulpdu.opcode == rdmap::wire::Opcode::Terminate {
                self.counters.terminates_sent += 1;
            }
            let pushed = self
                .tx
                .push(start, &self.ulpdu, seg.payload, seg.completes, mem);
            let queued = match pushed {
                Ok(wire_len) => {
                    // What it reads stays in use until acknowledged (a flush waits for it).
                    self.qp.set_sources_busy(true);
                    self.qp
                        .set_read_responses_unacknowledged(self.tx.has_read_responses());
                    tcp.send_record_len(wire_len).is_ok()
                }
                Err(_) => false,
            };
            if !queued {
                // Room was checked and segments fit an FPDU: only a closed TCP gets here.
                self.transport_gone();
                self.qp.on_transport_error(TerminateCause::ConnectionLost);
                return;
            }
            self.counters.fpdus_tx += 1;
        }
    }

    /// `TxMode::Source`: writes the stream octets `[offset, offset + out.len())` (the MPA
    /// Request/Reply or FPDUs queued and not yet acknowledged) into `out`, payload read from
    /// `mem`, and returns the ones' complement sum of `out` (RFC 1071, TCP's checksum of the
    /// payload, computed while writing it). What `tcp_engine::TxSource::fill_summed` calls.
    pub fn fill<B: RegionBuffer>(
        &mut self,
        offset: u64,
        out: &mut [u8],
        mem: &MemoryTable<B>,
    ) -> Result<u16, TxSourceError> {
        let mut offset = offset;
        let mut out = out;
        let mut sum = tcp_engine::wire::Checksum::new();
        let mut at = 0;
        if let Some((start, record)) = &self.startup_sent {
            let end = start + record.len() as u64;
            if offset >= *start && offset < end {
                let a = (offset - start) as usize;
                let n = (record.len() - a).min(out.len());
                out[..n].copy_from_slice(&record[a..a + n]);
                sum = sum.add_bytes(&out[..n]);
                offset += n as u64;
                out = &mut out[n..];
                at = n;
            }
        }
        if out.is_empty() {
            return Ok(sum.sum());
        }
        match self.tx.fill(offset, out, mem) {
            Ok(part) => Ok(sum.add_sum_at(at, part).sum()),
            Err(e) => {
                self.tx_failed = Some(e);
                Err(e)
            }
        }
    }

    /// [`IwarpConn::fill`] into a packet in pieces (`tcp_engine::TxSource::fill_split`): the
    /// `len` stream octets from `offset` on, `first` whole and then on through `rest`. A
    /// segment that is one whole FPDU without Markers (the usual one), its headers inside
    /// `first`, is written in one pass, its CRC carried across the pieces. Anything else
    /// (Markers, IFT frames, the MPA startup, a segment of several FPDUs or part of one) is
    /// written whole into `scratch` and copied into the pieces where `scratch` holds `len`
    /// octets (a piece-by-piece fill would compute a cut FPDU's CRC in a pass of its own),
    /// piece by piece otherwise. Returns the ones' complement sum of the octets, or
    /// `TxSourceError` if the pieces hold fewer than `len`.
    pub fn fill_split<B: RegionBuffer>(
        &mut self,
        offset: u64,
        len: usize,
        first: &mut [u8],
        rest: &mut [&mut [u8]],
        mem: &MemoryTable<B>,
        scratch: &mut [u8],
    ) -> Result<u16, TxSourceError> {
        let startup = self
            .startup_sent
            .as_ref()
            .is_some_and(|(start, record)| offset < start + record.len() as u64);
        if !startup {
            if let Some(filled) = self.tx.fill_whole_split(offset, len, first, rest, mem) {
                return filled.inspect_err(|&e| self.tx_failed = Some(e));
            }
        }
        let room = tcp_engine::pieces_len(first, rest);
        if room < len {
            return Err(TxSourceError {
                offset: offset + room as u64,
                len: len - room,
            });
        }
        if let Some(whole) = scratch.get_mut(..len) {
            let sum = self.fill(offset, whole, mem)?;
            tcp_engine::copy_to_pieces(whole, first, rest);
            return Ok(sum);
        }
        tcp_engine::fill_in_pieces(offset, len, first, rest, |offset, out| {
            self.fill(offset, out, mem).map(Some)
        })
    }

    /// Emits TCP's next packet into `buf`, the data octets from [`IwarpConn::fill`] in
    /// `TxMode::Source` (what a caller driving the TCP connection itself, like a simulator,
    /// uses instead of `TcpConnection::poll_transmit`).
    pub fn poll_transmit<B: RegionBuffer>(
        &mut self,
        tcp: &mut TcpConnection,
        mem: &MemoryTable<B>,
        now: Instant,
        buf: &mut [u8],
    ) -> Option<usize> {
        self.apply_renege(tcp);
        if tcp.config().tx_mode != TxMode::Source {
            return tcp.poll_transmit(now, buf);
        }
        let source = &mut ConnSource {
            conn: self,
            mem,
            scratch: &mut [],
        };
        tcp.poll_transmit_with(now, buf, source)
    }

    /// [`IwarpConn::poll_transmit`] into a packet in pieces (the frames of a multi-buffer
    /// packet; `TcpConnection::poll_transmit_split`): headers at the start of `head`, a data
    /// segment's payload on through `tail`, written by [`IwarpConn::fill_split`] with
    /// `scratch` lent to it.
    pub fn poll_transmit_split<B: RegionBuffer>(
        &mut self,
        tcp: &mut TcpConnection,
        mem: &MemoryTable<B>,
        now: Instant,
        head: &mut [u8],
        tail: &mut [&mut [u8]],
        scratch: &mut [u8],
    ) -> Option<usize> {
        self.apply_renege(tcp);
        let source = &mut ConnSource {
            conn: self,
            mem,
            scratch,
        };
        tcp.poll_transmit_split(now, head, tail, source)
    }

    fn transmit<B: RegionBuffer>(&mut self, tcp: &mut TcpConnection, mem: &MemoryTable<B>) {
        if self.full_buffers_released {
            return;
        }
        if matches!(self.phase, Phase::IftFull(_)) {
            self.transmit_ift_records(tcp, mem);
            return;
        }
        let Phase::Full(full) = &mut self.phase else {
            return;
        };
        if !full.may_send || self.startup_record.is_some() {
            return;
        }
        loop {
            let mulpdu = mpa::mulpdu(usize::from(tcp.emss()), full.negotiated.markers_tx)
                .min(usize::from(u16::MAX));
            // Room for the largest FPDU this MULPDU can give (Markers and PAD included).
            if tcp.send_capacity() < full.encoder.wire_len(mulpdu)
                || tcp.send_queue_len() >= self.cfg.tx_ahead
            {
                return;
            }
            self.ulpdu.clear();
            let Some(tx) = self.qp.poll_transmit(mulpdu, mem, &mut self.ulpdu) else {
                return;
            };
            if tx.opcode == rdmap::wire::Opcode::Terminate {
                self.counters.terminates_sent += 1;
            }
            // Framed straight into TCP's send buffer: header, ULPDU, PAD, CRC (computed as the
            // octets go in) and Markers, no intermediate FPDU copy.
            let wire_len = full.encoder.wire_len(self.ulpdu.len());
            let encoder = &mut full.encoder;
            let ulpdu = &self.ulpdu;
            let sent = tcp.send_record_with(wire_len, |put| {
                // A ULPDU too long for an FPDU hands nothing, which TCP refuses.
                let _ = encoder.encode_with(ulpdu, &[], put);
            });
            if sent.is_err() {
                // The capacity was checked and the ULPDU is within MULPDU: only a closed
                // TCP gets here. Nothing more can be sent.
                self.qp.on_transport_error(TerminateCause::ConnectionLost);
                return;
            }
            self.counters.fpdus_tx += 1;
        }
    }

    /// `TxMode::Records` with IFT: each ULPDU copied out of the region and framed (section
    /// 5.1) into TCP's send buffer as one record.
    fn transmit_ift_records<B: RegionBuffer>(
        &mut self,
        tcp: &mut TcpConnection,
        mem: &MemoryTable<B>,
    ) {
        let Phase::IftFull(full) = &mut self.phase else {
            return;
        };
        if self.startup_record.is_some() {
            return;
        }
        loop {
            let mulpdu = full
                .negotiated
                .tx
                .mulpdu(usize::from(tcp.emss()))
                .min(usize::from(u16::MAX));
            if tcp.send_capacity() < ift_frame_len(&full.negotiated.tx, mulpdu)
                || tcp.send_queue_len() >= self.cfg.tx_ahead
            {
                return;
            }
            self.ulpdu.clear();
            let Some(tx) = self.qp.poll_transmit(mulpdu, mem, &mut self.ulpdu) else {
                return;
            };
            if tx.opcode == rdmap::wire::Opcode::Terminate {
                self.counters.terminates_sent += 1;
            }
            self.frame.clear();
            let sent = full.encoder.encode(&self.ulpdu, &mut self.frame).is_ok()
                && tcp.send_record(&self.frame).is_ok();
            if !sent {
                // The capacity was checked and the ULPDU is within MULPDU: only a closed
                // TCP gets here. Nothing more can be sent.
                self.qp.on_transport_error(TerminateCause::ConnectionLost);
                return;
            }
            self.counters.fpdus_tx += 1;
        }
    }

    /// The earliest deadline: startup's (MPA or IFT), or in Full Operation that of octets held
    /// beyond a gap ([`ConnConfig::held_timeout`]) and the release of an idle reassembly store
    /// ([`IwarpConn::reassembly_memory`]); as a TCP instant (TCP's own deadlines come
    /// from the TCP connection).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let held = self.held_deadline.map(|(_, at)| at);
        let rtr = match &self.phase {
            Phase::Full(full) if full.awaiting_rtr => full.rtr_deadline,
            _ => None,
        };
        let release = self
            .store_idle_since
            .map(|since| since + STORE_IDLE_RELEASE);
        let deadline = match &self.phase {
            Phase::Initiating(i) => i.poll_timeout(),
            Phase::AwaitingRequest(r) | Phase::AwaitingAccept(r) => r.poll_timeout(),
            Phase::IftInitiating(i) => i.poll_timeout(),
            Phase::IftAwaitingIndication(r) => r.poll_timeout(),
            Phase::IftAwaitingAccept(p) => p.deadline,
            _ => None,
        };
        let startup = deadline.map(|d| Instant::ZERO + d.saturating_duration_since(self.epoch));
        [startup, rtr, held, release].into_iter().flatten().min()
    }

    /// Whether there is something to send that TCP has not taken yet.
    pub fn wants_transmit(&self) -> bool {
        self.startup_record.is_some()
            || matches!(&self.phase, Phase::Full(f) if f.may_send) && self.qp.has_pending_transmit()
            || matches!(&self.phase, Phase::IftFull(_)) && self.qp.has_pending_transmit()
    }
}

/// An [`IwarpConn`] and the memory it reads, as TCP's transmit source.
struct ConnSource<'a, B> {
    conn: &'a mut IwarpConn,
    mem: &'a MemoryTable<B>,
    /// Lent to [`IwarpConn::fill_split`] (empty: no joining, piece by piece).
    scratch: &'a mut [u8],
}

impl<B: RegionBuffer> TxSource for ConnSource<'_, B> {
    fn fill(&mut self, stream_offset: u64, out: &mut [u8]) -> Result<(), TxSourceError> {
        self.conn.fill(stream_offset, out, self.mem).map(|_| ())
    }

    fn fill_summed(
        &mut self,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u16>, TxSourceError> {
        self.conn.fill(stream_offset, out, self.mem).map(Some)
    }

    fn fill_split(
        &mut self,
        stream_offset: u64,
        len: usize,
        first: &mut [u8],
        rest: &mut [&mut [u8]],
    ) -> Result<u16, TxSourceError> {
        self.conn
            .fill_split(stream_offset, len, first, rest, self.mem, self.scratch)
    }
}

/// The stream position where an FPDU found at `span_start` (relative to `rx_start`) begins:
/// a Marker right before its header belongs to it (RFC 5044 section 4.3), unless that Marker
/// would lie before `floor` (the first octet scanned, or the end of the FPDU before).
fn fpdu_start(rx_start: u64, span_start: u64, markers: bool, floor: u64) -> u64 {
    let start = rx_start + span_start;
    if markers && span_start % MARKER_INTERVAL == MARKER_LEN && start >= floor + MARKER_LEN {
        start - MARKER_LEN
    } else {
        start
    }
}

/// Takes `cost` held octets' worth of rescan credit (see [`SCAN_CREDIT_PER_OCTET`]) and
/// counts them; false (counted as deferred) when the credit does not cover them.
fn spend_scan_credit(credit: &mut u64, counters: &mut ConnCounters, cost: u64) -> bool {
    if *credit < cost {
        counters.rescans_deferred += 1;
        return false;
    }
    *credit -= cost;
    counters.rescanned_bytes += cost;
    true
}

/// Records an FPDU placed ahead of delivery at stream positions `span`, keeping `placed` in
/// stream order, and counts it.
fn record_placed(
    placed: &mut VecDeque<PlacedFpdu>,
    counters: &mut ConnCounters,
    (start, end): (u64, u64),
    ddp_header: &[u8],
    payload_len: usize,
    early: PlacedEarly,
) {
    let header_len = ddp_header.len().min(UNTAGGED_HEADER_LEN);
    let mut header = [0u8; UNTAGGED_HEADER_LEN];
    header[..header_len].copy_from_slice(&ddp_header[..header_len]);
    let payload_len = payload_len as u32;
    let i = placed.partition_point(|p| p.start < start);
    placed.insert(
        i,
        PlacedFpdu {
            start,
            end,
            header,
            header_len: header_len as u8,
            payload_len,
            early,
            target: PlacementTarget::of(&ddp_header[..header_len], payload_len as usize),
        },
    );
    counters.fpdus_placed_out_of_order += 1;
    counters.bytes_placed_out_of_order += u64::from(payload_len);
}

/// The FPDU carrying the Terminate an MPA Initiator sends when the Reply accepted with IRD
/// or RTR options it cannot meet (RFC 6581 9.1, 9.2: Layer 2, EType 0, code 6 or 7), in the
/// framing the Reply agreed; `None` when `error` (what [`Initiator::feed`] returned) asks
/// for no Terminate. Both transports send it, then close.
pub fn startup_terminate(initiator: &Initiator, error: &MpaError) -> Option<Vec<u8>> {
    let mut encoder = initiator.terminate_encoder()?;
    let ulpdu = QueuePair::startup_terminate(TerminateCause::Llp { code: error.code() })?;
    let mut fpdu = Vec::new();
    encoder.encode(&ulpdu, &mut fpdu).ok()?;
    Some(fpdu)
}

/// The RTR kind MPA agreed (RFC 6581 9), as the queue pair sends or expects it.
pub fn rtr_kind(kind: mpa::RtrKind) -> rdmap::RtrKind {
    match kind {
        mpa::RtrKind::Send => rdmap::RtrKind::Send,
        mpa::RtrKind::Write => rdmap::RtrKind::Write,
        mpa::RtrKind::Read => rdmap::RtrKind::Read,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The held-peak scans stay bounded however many ranges are held: exact (whole) up to
    /// 64 ranges; above, a window per segment, a whole scan once the windows add up to four
    /// times the list, and whole scans at new peaks only when a sixteenth above the last.
    #[test]
    fn peak_scans_are_bounded_per_segment() {
        let mut scan = PeakScan::default();
        for n in [1, 10, 64] {
            assert_eq!(scan.window(n, n / 2..n / 2, 100, 1000), 0..n);
        }
        // A full list, nothing rising (a peer resending what is refused).
        let n = 1024;
        let mut scanned = 0;
        for i in 0..10_000 {
            let at = (i * 7) % (n + 1);
            let w = scan.window(n, at..at, 500, 1000);
            assert!(w.len() == n || (w.len() <= 8 && w.end <= n), "{w:?}");
            if w.len() < n {
                assert!(w.start <= at && (at < w.end || w.end == n), "{w:?} at {at}");
            }
            scanned += w.len();
        }
        // A segment that touched 30 ranges (30 small FPDUs placed between held pieces): all
        // of them, and 4 on either side.
        let mut scan = PeakScan::default();
        assert_eq!(scan.window(n, 100..130, 500, 1000), 96..134);
        assert!(scanned <= 10_000 * 10 + n, "{scanned}");
        // A peak rising by an octet a segment from 1,000 to 1,000,000: about 16 ln(1000) = 111
        // whole scans at peaks beyond the periodic ones.
        let mut scan = PeakScan::default();
        let mut scanned = 0;
        let segments = 999_000;
        for held in 1_000..1_000 + segments {
            scanned += scan.window(n, 0..0, held as u64, held as u64 - 1).len();
        }
        assert!(scanned <= segments * 10 + 120 * n, "{scanned}");
        // A new peak a sixteenth above the last one scanned whole is scanned whole.
        assert_eq!(scan.window(n, 0..0, 1_100_000, 1_000_000), 0..n);
        assert_eq!(scan.window(n, 10..10, 1_100_001, 1_100_000), 6..14);
    }

    #[test]
    fn store_merges_wraps_and_releases() {
        let mut s = Store::new(16, MAX_STORE_RANGES, None);
        s.insert(0, 4, b"efgh").unwrap();
        s.insert(0, 12, b"mnop").unwrap();
        s.insert(0, 8, b"ijkl").unwrap();
        assert_eq!(s.ranges, vec![(4, 16)]);
        assert_eq!(s.held, 12);
        assert!(s.insert(0, 14, b"x").is_err(), "overlap refused");
        assert_eq!(s.range_containing(5), Some((4, 16)));
        assert_eq!(s.range_containing(16), None);
        assert!(s.remove(6, 9));
        assert_eq!(s.ranges, vec![(4, 6), (9, 16)]);
        assert_eq!(s.held, 9);
        assert!(!s.remove(5, 10), "across ranges refused");
        assert!(s.remove(4, 6) && s.remove(9, 12));
        assert_eq!(s.ranges, vec![(12, 16)]);
        s.insert(0, 4, b"efgh").unwrap();
        s.insert(0, 8, b"ijkl").unwrap();
        assert_eq!(s.ranges, vec![(4, 16)]);
        assert_eq!(s.held, 12);
        assert!(s.insert(0, 16, b"q").is_err(), "beyond capacity refused");
        s.insert(0, 0, b"abcd").unwrap();
        assert_eq!(s.range_at(0), Some(16));
        let (a, b) = s.slices(0, 16);
        assert_eq!([a, b].concat(), b"abcdefghijklmnop");
        s.release_to(10);
        assert_eq!(s.held, 6);
        s.insert(10, 16, b"QRST").unwrap();
        let (a, b) = s.slices(10, 20);
        assert_eq!([a, b].concat(), b"klmnopQRST");
        s.release_to(u64::MAX);
        assert_eq!(s.held, 0);
        assert!(s.ranges.is_empty());
    }

    /// A range that starts where a held one ends and runs into the next held one overlaps
    /// it: refused (the check looked only at the range it touched).
    #[test]
    fn store_refuses_an_overlap_behind_a_touching_range() {
        let mut s = Store::new(64, MAX_STORE_RANGES, None);
        s.insert(0, 0, &[1; 10]).unwrap();
        s.insert(0, 20, &[2; 10]).unwrap();
        assert_eq!(s.insert(0, 10, &[3; 15]), Err(StoreRefused::Full));
        assert_eq!(s.ranges, vec![(0, 10), (20, 30)]);
        assert_eq!(s.held, 20);
        s.insert(0, 10, &[3; 10]).unwrap();
        assert_eq!(s.ranges, vec![(0, 30)]);
    }

    /// A full range list refuses only octets that would start a new range; octets that
    /// extend or join held ranges still go in.
    #[test]
    fn a_full_range_list_takes_octets_that_merge() {
        let mut s = Store::new(64, 2, None);
        s.insert(0, 0, &[1; 4]).unwrap();
        s.insert(0, 10, &[1; 4]).unwrap();
        assert_eq!(s.insert(0, 20, &[1; 4]), Err(StoreRefused::TooManyRanges));
        s.insert(0, 14, &[1; 2]).unwrap();
        s.insert(0, 4, &[1; 6]).unwrap();
        assert_eq!(s.ranges, vec![(0, 16)]);
        s.insert(0, 20, &[1; 4]).unwrap();
        assert_eq!(s.ranges, vec![(0, 16), (20, 24)]);
        assert_eq!(s.held, 20);
        s.release_to(22);
        assert_eq!(s.ranges, vec![(22, 24)]);
        assert_eq!(s.held, 2);
    }
}
