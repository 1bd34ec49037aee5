//! The sans-IO queue pair (RFC 5040 5, 6, 7).
//!
//! A [`QueuePair`] turns work requests into DDP segments ([`QueuePair::poll_transmit`])
//! and received DDP segments into placements and completions
//! ([`QueuePair::on_ulpdu`]). It owns no memory: the bytes live in a [`MemoryTable`]
//! passed to each call. It never does I/O and never reads a clock.
//!
//! # Completion policy
//! RFC 5040 5.5 rule 14 leaves "successfully completed at the DDP layer" to the
//! implementation; [`TxCompletion`] chooses (see [`QueuePair::set_tx_completion`]):
//! - [`TxCompletion::HandOff`] (the default; the socket transport, which cannot see TCP's
//!   acknowledgements): Send and RDMA Write work requests complete ([`WcStatus::Success`])
//!   when their Last ULPDU has been handed out by [`QueuePair::poll_transmit`] or
//!   [`QueuePair::poll_transmit_segment`]: the transport has taken it.
//! - [`TxCompletion::Acknowledged`] (the AF_XDP engine, whose TCP reports how far the peer
//!   has acknowledged the stream): the hand-out of the Last ULPDU is flagged
//!   ([`TxSegment::completes`]), and the work request completes when the transport calls
//!   [`QueuePair::message_acknowledged`] once the last octet of that FPDU is acknowledged.
//!   Until then the application must leave the source buffer alone (the transport re-reads
//!   it to retransmit). Work requests not yet acknowledged when the stream dies or closes
//!   are flushed.
//!
//! The one place that decides this is `QueuePair::message_handed_out`.
//! - A peer's Terminate (RFC 5040 4.8) copies the DDP header of the segment it refused; the
//!   work request that header names, if not yet completed, completes with the remote error
//!   ([`WcStatus::RemoteAccessError`] / [`WcStatus::RemoteOperationError`]), Sends and Writes
//!   the peer took before it complete, the rest is flushed (`apply_remote_terminate`). Under
//!   `HandOff` a Send or Write handed out whole has completed before the peer could object,
//!   so only a Read or a partly handed-out message can be named; under `Acknowledged` a
//!   transport that takes a segment's ACK before its data reports it with
//!   [`QueuePair::message_acknowledged_deferred`], so that a Terminate in that segment can
//!   still name a message the ACK covers.
//! - An RDMA Read completes when the Last segment of its Read Response has been placed
//!   (rule 19).
//! - Completions of the send queue come out in submission order (rule 15): a Send
//!   posted after a Read completes after the Read.
//! - A send work request posted unsignaled ([`SendWr::signaled`] false) completes the same
//!   way but reports only a failure (an error or a flush), not its success.
//! - A Receive completes when DDP delivers its message, in MSN order (rule 16).
//!
//! # Transmit without copying the payload
//! [`QueuePair::poll_transmit`] copies each segment's payload out of the registered
//! source into the caller's buffer. [`QueuePair::poll_transmit_segment`] produces the same
//! segments but hands out only the headers (and the few inline octets of Read Requests,
//! Terminates and RTRs); the payload is described ([`TxPayload`]: STag, TO, length and the
//! access right it was read with), checked now exactly as the copying path checks it, for
//! the transport to read from the region when (and as often as) it builds the FPDU.
//!
//! # Transmit scheduling
//! Read Responses leave in the order their Requests arrived (rule 20) and send queue
//! messages in posting order (rule 13). Between the two, [`QueuePair::poll_transmit`]
//! alternates ULPDU by ULPDU, except that two *tagged* messages (an RDMA Write and a Read
//! Response) are never interleaved with each other: a started one is finished first.
//! RFC 5041 does not forbid that interleaving, but receivers such as Linux siw keep one
//! tagged reassembly context. So a long Write delays a Read Response by at most the rest
//! of that Write, and untagged traffic (Sends, Read Requests) interleaves freely.

use std::collections::VecDeque;
use std::ops::Range;

use ddp::{
    DdpError, DdpHeader, TaggedHeader, UntaggedHeader, UntaggedQueue, TAGGED_HEADER_LEN,
    UNTAGGED_HEADER_LEN,
};

use crate::error::{RdmapError, TerminateCause, TerminateCode};
use crate::inline::InlineData;
use crate::memory::{
    Access, AccessViolation, MemoryTable, NotAtomic, PdId, RegionBuffer, Stag, TableVersion,
};
pub use crate::types::QpState;
pub use crate::wire::AtomicOp;
use crate::wire::{
    invalidate_stag, layer, queue, rdmap_etype, AtomicRequest, AtomicResponse, CopiedDdpHeader,
    ImmediateData, Opcode, RdmapControl, ReadRequest, TerminateHeader, TerminateView,
    ATOMIC_REQUEST_LEN, ATOMIC_RESPONSE_LEN, IMMEDIATE_DATA_LEN, READ_REQUEST_LEN,
};

/// Queue pair parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// Protection Domain of the QP: only STags of this PD are honoured on its stream.
    pub pd: PdId,
    /// Send work requests that may be outstanding (posted and not yet completed).
    pub sq_depth: usize,
    /// Receive work requests that may be posted.
    pub rq_depth: usize,
    /// Inbound RDMA Read Requests that may be outstanding (RFC 5040 6.1), until
    /// [`QueuePair::enter_rts`] sets the negotiated value.
    pub ird: u16,
    /// Outbound RDMA Read Requests that may be outstanding, until
    /// [`QueuePair::enter_rts`] sets the negotiated value. Atomic Requests count against
    /// IRD and ORD together with Read Requests (RFC 7306 5.2).
    pub ord: u16,
    /// The RDMAP extensions of RFC 7306 (Atomic Operations, Immediate Data) on this stream.
    /// Off by default: an application turns them on only when its ULP knows the peer
    /// supports them (RFC 7306 1.1). Off, their opcodes are refused as RFC 5040's reserved
    /// ones (Terminate "Unexpected OpCode"), QN 3 is an invalid DDP queue, and work requests
    /// that would send them are refused at posting ([`RdmapError::ExtensionsOff`]).
    pub extensions: bool,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            pd: PdId(0),
            sq_depth: 128,
            rq_depth: 128,
            ird: 16,
            ord: 16,
            extensions: false,
        }
    }
}

pub use crate::sge::{Sge, SgeList, MAX_SGE};

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Send (5.3), with Solicited Event and/or with Invalidate of the peer's STag.
    Send {
        /// Send with Solicited Event.
        solicited: bool,
        /// Send with Invalidate: the peer STag to invalidate.
        invalidate: Option<Stag>,
    },
    /// RDMA Write (5.1) of the local data to the peer's tagged buffer.
    Write {
        /// Peer STag.
        remote_stag: Stag,
        /// Peer TO of the first octet.
        remote_to: u64,
    },
    /// RDMA Read (5.2) of the peer's tagged buffer into the local sink.
    Read {
        /// Peer (data source) STag.
        remote_stag: Stag,
        /// Peer TO of the first octet.
        remote_to: u64,
    },
    /// An Atomic Operation (RFC 7306 5) on the peer's 64-bit word at `remote_to` (8-aligned);
    /// the word's original value is written into the local sink (one scatter/gather element
    /// of exactly 8 octets, LOCAL_WRITE) in this host's byte order. Verbs'
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD` is [`AtomicOp::fetch_add`], `IBV_WR_ATOMIC_CMP_AND_SWP`
    /// [`AtomicOp::cmp_swap`]. Needs [`QpConfig::extensions`].
    Atomic {
        /// Peer STag (REMOTE_ATOMIC).
        remote_stag: Stag,
        /// Peer TO of the word.
        remote_to: u64,
        /// The operation and its operands.
        op: AtomicOp,
    },
    /// RDMA Write followed by an Immediate Data message (RFC 7306 6: the "RDMA Write with
    /// Immediate Data" of InfiniBand): the peer's receive completes with `immediate` once the
    /// Write is placed. Verbs' `IBV_WR_RDMA_WRITE_WITH_IMM`. Needs [`QpConfig::extensions`].
    WriteImmediate {
        /// Peer STag.
        remote_stag: Stag,
        /// Peer TO of the first octet.
        remote_to: u64,
        /// The Immediate Data message with Solicited Event (RFC 7306 6.2), so that the
        /// peer's completion is solicited (verbs' `IBV_SEND_SOLICITED`).
        solicited: bool,
        /// The 8 octets of Immediate Data, as a big-endian number on the wire.
        immediate: u64,
    },
    /// Send followed by an Immediate Data message (RFC 7306 6, Figure 7's table: completed in
    /// order at the peer): the peer completes two receives, the Send's and then one carrying
    /// `immediate`. Needs [`QpConfig::extensions`].
    SendImmediate {
        /// The Immediate Data message with Solicited Event.
        solicited: bool,
        /// The 8 octets of Immediate Data.
        immediate: u64,
    },
    /// An Immediate Data message alone (RFC 7306 6.3): consumes one receive at the peer,
    /// which completes with `immediate`. The scatter/gather list must be empty. Needs
    /// [`QpConfig::extensions`].
    Immediate {
        /// Immediate Data with Solicited Event.
        solicited: bool,
        /// The 8 octets of Immediate Data.
        immediate: u64,
    },
}

impl SendOp {
    /// The opcode of this operation's completion.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send { .. } | SendOp::SendImmediate { .. } => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteImmediate { .. } => WcOpcode::Write,
            SendOp::Read { .. } => WcOpcode::Read,
            SendOp::Atomic {
                op: AtomicOp::FetchAdd { .. },
                ..
            } => WcOpcode::FetchAdd,
            SendOp::Atomic {
                op: AtomicOp::CmpSwap { .. },
                ..
            } => WcOpcode::CmpSwap,
            SendOp::Immediate { .. } => WcOpcode::Immediate,
        }
    }

    /// True for the operations of RFC 7306.
    pub fn is_extension(&self) -> bool {
        matches!(
            self,
            SendOp::Atomic { .. }
                | SendOp::WriteImmediate { .. }
                | SendOp::SendImmediate { .. }
                | SendOp::Immediate { .. }
        )
    }
}

/// A send queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local data: the source of a Send or Write, gathered in list order (up to [`MAX_SGE`]
    /// elements), or the sink of a Read (one element: a Read Request names one sink, RFC 5040
    /// 4.4). Empty, or elements of length zero, for a zero-length message.
    pub sg_list: SgeList,
    /// Whether its successful completion is reported. `false` (verbs' unsignaled work
    /// request, `IBV_SEND_SIGNALED` left out): the request completes as usual, in submission
    /// order, and frees its send queue entry, but no [`WorkCompletion`] with
    /// [`WcStatus::Success`] is queued; a later signaled request's completion tells that it
    /// is done (rule 15: in order). A request that fails, or is flushed, is always reported.
    /// Bandwidth applications signal one request in many (perftest's `--cq-mod`).
    pub signaled: bool,
    /// Read fence (verbs' `IBV_SEND_FENCE`): the request is not started until every Read and
    /// Atomic posted before it has completed (its Response placed). RFC 5040 5.5 lets a later
    /// Send reach the peer's application before the peer has sent an earlier Read's Response;
    /// a Send that tells the peer it may reuse what was read must be fenced.
    pub fence: bool,
}

/// A send work request whose payload was copied into it when it was built ([`InlineData`]:
/// verbs' `IBV_SEND_INLINE`): a Send or an RDMA Write, with or without Immediate Data. The
/// message on the wire is the one a [`SendWr`] with the same octets in registered memory
/// produces; the queue pair keeps the copy until the message is handed out whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlineSendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// A Send, RDMA Write, Send with Immediate or RDMA Write with Immediate.
    pub op: SendOp,
    /// The payload.
    pub data: InlineData,
    /// As [`SendWr::signaled`].
    pub signaled: bool,
    /// As [`SendWr::fence`].
    pub fence: bool,
}

impl SendWr {
    /// The checks of the request by itself, before any memory or queue is looked at (what
    /// verbs' `ibv_post_send` refuses with `EINVAL`): an extension's opcode needs the RFC 7306
    /// extensions on (`extensions`, [`RdmapError::ExtensionsOff`]); a Read names one sink
    /// (RFC 5040 4.4: one Data Sink STag and TO, [`RdmapError::ReadSinkNotContiguous`]); an
    /// Atomic's sink is one 64-bit word (RFC 7306 5.1, [`RdmapError::AtomicSink`]); an
    /// Immediate Data message carries no payload (RFC 7306 Figure 3,
    /// [`RdmapError::ImmediatePayload`]).
    pub fn check_shape(&self, extensions: bool) -> Result<(), RdmapError> {
        if self.op.is_extension() && !extensions {
            return Err(RdmapError::ExtensionsOff);
        }
        let pieces = || self.sg_list.as_slice().iter().filter(|s| s.len > 0).count();
        match self.op {
            SendOp::Read { .. } if pieces() > 1 => Err(RdmapError::ReadSinkNotContiguous),
            SendOp::Atomic { .. } if pieces() != 1 || self.sg_list.total_len() != 8 => {
                Err(RdmapError::AtomicSink {
                    len: self.sg_list.total_len(),
                })
            }
            SendOp::Immediate { .. } if self.sg_list.total_len() != 0 => {
                Err(RdmapError::ImmediatePayload {
                    len: self.sg_list.total_len(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Whether the request can run on a queue pair whose ORD is `ord`: a Read or an Atomic
    /// needs at least one outstanding Request ([`RdmapError::ZeroOrd`]; RFC 5040 6.1, RFC
    /// 7306 5.2: Atomics count against ORD).
    pub fn check_ord(&self, ord: u16) -> Result<(), RdmapError> {
        match self.op {
            SendOp::Read { .. } | SendOp::Atomic { .. } if ord == 0 => Err(RdmapError::ZeroOrd),
            _ => Ok(()),
        }
    }
}

impl InlineSendWr {
    /// The checks of the request by itself ([`SendWr::check_shape`]): only a Send or an RDMA
    /// Write (with Immediate Data or not) carries its payload inline
    /// ([`RdmapError::NotInlinable`]).
    pub fn check_shape(&self, extensions: bool) -> Result<(), RdmapError> {
        match self.op {
            SendOp::Send { .. }
            | SendOp::Write { .. }
            | SendOp::SendImmediate { .. }
            | SendOp::WriteImmediate { .. } => {}
            SendOp::Read { .. } | SendOp::Atomic { .. } | SendOp::Immediate { .. } => {
                return Err(RdmapError::NotInlinable)
            }
        }
        if self.op.is_extension() && !extensions {
            return Err(RdmapError::ExtensionsOff);
        }
        Ok(())
    }
}

/// A receive queue work request: one untagged buffer for one inbound Send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The buffer: an inbound Send is scattered over the elements in list order (up to
    /// [`MAX_SGE`]). Empty accepts only a zero-length Send.
    pub sg_list: SgeList,
}

/// The operation a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A Send work request.
    Send,
    /// An RDMA Write work request.
    Write,
    /// An RDMA Read work request.
    Read,
    /// A receive work request.
    Recv,
    /// An Atomic FetchAdd work request (RFC 7306 5.1.1).
    FetchAdd,
    /// An Atomic CmpSwap work request (RFC 7306 5.1.2).
    CmpSwap,
    /// An Immediate Data work request ([`SendOp::Immediate`]).
    Immediate,
    /// A receive work request that an Immediate Data message completed
    /// ([`WorkCompletion::immediate`]); nothing was placed in its buffer, and its `byte_len`
    /// is 0, also after an RDMA Write with Immediate (InfiniBand's
    /// `IBV_WC_RECV_RDMA_WITH_IMM` carries the Write's length; on iWARP the Write and the
    /// Immediate Data are separate messages, RFC 7306 6, and the sink does not know it).
    RecvImmediate,
}

/// Completion status (verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A local length check failed.
    LocalLengthError,
    /// A local STag check failed.
    LocalProtectionError,
    /// A local queue pair operation failed.
    LocalQpOperationError,
    /// The peer reported a protection error for this request (Terminate).
    RemoteAccessError,
    /// The peer reported an operation error for this request (Terminate).
    RemoteOperationError,
    /// The peer's request could not be honoured (e.g. a Send with Invalidate of an STag
    /// that cannot be invalidated).
    RemoteInvalidRequestError,
    /// The queue pair left RTS before this request was done.
    WrFlushError,
    /// Unrecoverable error.
    FatalError,
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Its operation.
    pub opcode: WcOpcode,
    /// Outcome.
    pub status: WcStatus,
    /// Octets transferred (received, for a Recv); 0 unless successful.
    pub byte_len: u32,
    /// For a Recv: the local STag a Send with Invalidate invalidated.
    pub invalidated: Option<Stag>,
    /// For a Recv: the Send carried the Solicited Event flag.
    pub solicited: bool,
    /// For [`WcOpcode::RecvImmediate`]: the Immediate Data (RFC 7306 6.1).
    pub immediate: Option<u64>,
}

impl WorkCompletion {
    /// The completion of a work request that did not succeed: no octets, no receive details.
    pub fn failed(wr_id: u64, opcode: WcOpcode, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            opcode,
            status,
            byte_len: 0,
            invalidated: None,
            solicited: false,
            immediate: None,
        }
    }
}

/// What [`QueuePair::poll_transmit`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxUlpdu {
    /// The RDMA message the segment belongs to.
    pub opcode: Opcode,
    /// The DDP Last flag.
    pub last: bool,
    /// Octets appended to `out` (DDP header, RDMAP header, payload).
    pub len: usize,
}

/// When a Send or RDMA Write work request completes (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TxCompletion {
    /// When the Last ULPDU has been handed to the transport.
    #[default]
    HandOff,
    /// When the transport reports the Last ULPDU acknowledged by the peer
    /// ([`QueuePair::message_acknowledged`]).
    Acknowledged,
}

/// The payload of a segment from [`QueuePair::poll_transmit_segment`], left in registered
/// memory: `len` octets at tagged offset `to` of `stag`, validated (protection domain of the
/// QP, access `access`, bounds) when handed out. A transport reading it later (first
/// transmission or retransmission) validates it again with the same arguments
/// ([`MemoryTable::validate`]): the region may have been deregistered since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxPayload {
    /// The source region.
    pub stag: Stag,
    /// Tagged offset of the first octet.
    pub to: u64,
    /// Octets.
    pub len: u32,
    /// The access right needed ([`Access::NONE`] for the QP's own Send/Write source,
    /// [`Access::REMOTE_READ`] for a Read Response).
    pub access: Access,
}

/// What [`QueuePair::poll_transmit_segment`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxSegment {
    /// The segment: opcode, Last flag and the whole ULPDU length (headers, inline octets
    /// and `payload`).
    pub ulpdu: TxUlpdu,
    /// The payload left in registered memory (follows the octets appended to `out`).
    pub payload: Option<TxPayload>,
    /// Under [`TxCompletion::Acknowledged`]: this is the Last segment of a Send or Write
    /// whose completion waits for [`QueuePair::message_acknowledged`].
    pub completes: bool,
}

/// The zero-length message an MPA v2 peer-to-peer initiator sends as its Ready To
/// Receive (RFC 6581 9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RtrKind {
    /// Zero-length Send (consumes a receive buffer at the responder).
    Send,
    /// Zero-length RDMA Write, STag 1, TO 0 (as siw sends it).
    Write,
    /// Zero-length RDMA Read Request (the responder answers with a zero-length Read
    /// Response).
    Read,
}

/// What the peer's Terminate said (RFC 5040 4.8).
pub type TerminateInfo = TerminateHeader;

/// Octets of the buffer posted on the Terminate queue (QN 2): room for the largest
/// Terminate header (52 octets) with slack for peers that append more.
const TERMINATE_BUFFER_LEN: usize = 128;

/// STag of siw's zero-length RTR Write (IWARP-WIRE.md 7).
const RTR_WRITE_STAG: u32 = 1;

/// A receive buffer on QN 0.
#[derive(Debug, Clone, Copy)]
// The small variant is the rare RTR sink; boxing the common one would allocate per receive.
#[allow(clippy::large_enum_variant)]
enum RecvSlot {
    User(RecvWr),
    /// Swallows the peer's zero-length RTR Send (see [`QueuePair::expect_rtr`]).
    RtrSink,
}

/// A receive refused when the transport took it, waiting for the receives posted before it
/// ([`QueuePair::complete_recv_in_error`], [`QueuePair::fail_recv_in_place`]).
#[derive(Debug)]
struct HeldRecvRefusal {
    /// Receives taken before it: it completes once that many have.
    taken_before: u64,
    completion: WorkCompletion,
    /// It fails the queue pair when it completes.
    fails_the_queue_pair: bool,
}

#[derive(Debug, Clone, Copy)]
struct SqEntry {
    wr: SendWr,
    seq: u64,
    /// Octets already handed out.
    sent: u64,
    /// The message length (the scatter/gather list's total).
    total: u64,
    /// RFC 7306 6: the work request's Immediate Data message is next (its Send or Write, if
    /// it has one, is out).
    tail: bool,
    /// The payload is the front of [`QueuePair::inline_data`] (the scatter/gather list is
    /// empty).
    inline: bool,
    /// Message offset up to which the source was found valid (the end of the element
    /// checked last) in the memory table of version `checked_in`: while the table is
    /// unchanged, later segments of that element handed out by reference skip the check.
    checked_to: u64,
    checked_in: TableVersion,
    /// It failed its local checks when the transport took it
    /// ([`QueuePair::fail_send_in_place`]): at the head it completes with this status and the
    /// queue pair fails.
    refused: Option<WcStatus>,
}

/// The parts of the send queue's head one transmitted segment needs.
#[derive(Debug, Clone, Copy)]
struct SqHead {
    op: SendOp,
    seq: u64,
    sent: u64,
    total: u64,
    tail: bool,
    inline: bool,
    checked_to: u64,
}

/// Completion bookkeeping of one send work request, kept in submission order.
#[derive(Debug, Clone, Copy)]
struct CompletionSlot {
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
    status: Option<WcStatus>,
    /// [`SendWr::signaled`].
    signaled: bool,
}

/// An RDMA Read Request we sent whose Response has not fully arrived.
#[derive(Debug, Clone, Copy)]
struct OutstandingRead {
    /// Completion slot; `None` for an RTR Read.
    seq: Option<u64>,
    /// MSN of the Read Request on QN 1 (to match the peer's Terminate).
    msn: u32,
    sink_stag: u32,
    sink_to: u64,
    size: u32,
    /// Octets of its Read Response delivered so far, in order from `sink_to`.
    received: u32,
}

/// An Atomic Request we sent whose Response has not arrived (RFC 7306 5.2.2).
#[derive(Debug, Clone, Copy)]
struct OutstandingAtomic {
    /// Completion slot.
    seq: u64,
    /// MSN of the Atomic Request on QN 1 (to match the peer's Terminate); also its Request
    /// Identifier.
    msn: u32,
    /// Where the original value goes: 8 octets at `to` of `stag`.
    sink_stag: Stag,
    sink_to: u64,
}

/// A Send or RDMA Write whose Last segment was handed out under
/// [`TxCompletion::Acknowledged`] and whose acknowledgement is awaited.
#[derive(Debug, Clone, Copy)]
struct AwaitingAck {
    /// Completion slot.
    seq: u64,
    /// What names it in a Terminate.
    name: MessageName,
}

/// How the DDP header a Terminate copies (RFC 5040 4.8, Figure 10) names one of our Sends
/// or RDMA Writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MessageName {
    /// An untagged segment on QN 0 with this MSN (RFC 5041 5.2, 5.3).
    Send { msn: u32 },
    /// A tagged segment of an RDMA Write to `stag` whose TO lies in the `len` octets from
    /// `to` (the segments handed out so far).
    Write { stag: u32, to: u64, len: u64 },
    /// An Immediate Data message on QN 0 with MSN `msn` (RFC 7306 6), or the Send
    /// (`send_msn`) or RDMA Write (`write`: STag, TO, length) its work request sent before it.
    Immediate {
        msn: u32,
        send_msn: Option<u32>,
        write: Option<(u32, u64, u64)>,
    },
}

impl MessageName {
    /// Whether the copied header `hdr` is one of this message's segments.
    fn named_by(&self, hdr: &DdpHeader) -> bool {
        match (*self, hdr) {
            (MessageName::Send { msn }, DdpHeader::Untagged(h)) => {
                h.qn == queue::SEND
                    && h.msn == msn
                    && RdmapControl::parse(h.rsvd_ulp[0]).is_ok_and(|c| c.opcode.is_send())
            }
            (MessageName::Write { stag, to, len }, DdpHeader::Tagged(h)) => {
                // A zero-length Write is one segment at `to`.
                h.stag == stag
                    && h.to.wrapping_sub(to) < len.max(1)
                    && RdmapControl::parse(h.rsvd_ulp).is_ok_and(|c| c.opcode == Opcode::Write)
            }
            (
                MessageName::Immediate {
                    msn,
                    send_msn,
                    write,
                },
                hdr,
            ) => {
                let own = matches!(hdr, DdpHeader::Untagged(h) if h.qn == queue::SEND
                    && h.msn == msn
                    && RdmapControl::parse(h.rsvd_ulp[0]).is_ok_and(|c| c.opcode.is_immediate()));
                own || send_msn.is_some_and(|msn| MessageName::Send { msn }.named_by(hdr))
                    || write.is_some_and(|(stag, to, len)| {
                        MessageName::Write { stag, to, len }.named_by(hdr)
                    })
            }
            _ => false,
        }
    }
}

/// An inbound RDMA Read Request to answer, or (RFC 7306 5.2: on the same queue, answered in
/// the same order) an Atomic Request.
#[derive(Debug, Clone, Copy)]
struct ReadResponseJob {
    request: ReadRequest,
    /// An Atomic Request, performed when its Response is generated (after every Read
    /// Response before it, RFC 7306 7); `request` is then unused.
    atomic: Option<AtomicRequest>,
    /// The DDP header and payload length of the Request's Last segment (for a
    /// Terminate raised while responding).
    request_segment: Option<(CopiedDdpHeader, u16)>,
    /// QN 1 staging slot to re-post once answered.
    slot: u16,
    /// Octets already handed out.
    sent: u32,
}

/// The RDMAP opcode and Invalidate STag of a Send (or the Immediate Data of an Immediate
/// Data message) whose Last segment has arrived.
#[derive(Debug, Clone, Copy)]
struct InboundSend {
    msn: u32,
    opcode: Opcode,
    invalidate: u32,
    immediate: u64,
    /// A Send with Invalidate's Last segment (DDP header and payload length), for the
    /// Terminate of an invalidation that fails when the message is delivered, possibly by a
    /// later segment (an earlier MSN that arrived after it): RFC 5040 7.1 names the message
    /// in error.
    segment: Option<(CopiedDdpHeader, u16)>,
}

/// A staged inbound message of QN 1: a Read Request, or (RFC 7306) an Atomic Request.
#[derive(Debug, Clone, Copy)]
struct StagedRequest {
    bytes: [u8; ATOMIC_REQUEST_LEN],
    /// Whether the message is an Atomic Request (else a Read Request): set by the first of
    /// its segments that arrives, which every later one must agree with; `None` again once
    /// the message is delivered, for the next one in this buffer.
    atomic: Option<bool>,
    /// The DDP header (and payload length) of the segment that carried it, for a Terminate
    /// about it (4.8): a request can be delivered by a later segment (an earlier MSN that
    /// arrived after it).
    segment: Option<(CopiedDdpHeader, u16)>,
}

/// An inbound error with the context its Terminate needs.
#[derive(Debug)]
struct Fault {
    error: RdmapError,
    /// The Read Request that caused the error, when one did (Figure 10: R bit).
    read_request: Option<ReadRequest>,
    /// The segment in error when it is not the one being received (a staged request that
    /// segment's arrival delivered): its DDP header goes in the Terminate (4.8).
    segment: Option<(CopiedDdpHeader, u16)>,
}

impl From<RdmapError> for Fault {
    fn from(error: RdmapError) -> Fault {
        Fault {
            error,
            read_request: None,
            segment: None,
        }
    }
}

impl From<DdpError> for Fault {
    fn from(error: DdpError) -> Fault {
        Fault::from(RdmapError::Ddp(error))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxSource {
    SendQueue,
    ReadResponse,
}

/// The length a receive buffer is taken as: its elements' total (overlapping ones counted
/// each time), at most 2^32 - 1 octets, the longest message (RFC 5041 5.2's 32-bit MO): a
/// buffer longer than any message is taken, as verbs takes one longer than `max_msg_sz`.
fn recv_len(sg_list: &SgeList) -> u32 {
    u32::try_from(sg_list.total_len()).unwrap_or(u32::MAX)
}

/// The sans-IO RDMAP queue pair. See the module documentation for the completion and
/// scheduling policy.
#[derive(Debug)]
pub struct QueuePair {
    cfg: QpConfig,
    state: QpState,
    ird: u16,
    ord: u16,

    // ---- transmit side ----
    sq: VecDeque<SqEntry>,
    /// The payloads of the inline entries of `sq`, in queue order: one per entry whose
    /// `inline` is set, dropped when that entry leaves the queue.
    inline_data: VecDeque<InlineData>,
    slots: VecDeque<CompletionSlot>,
    /// Sequence number of `slots.front()`.
    slots_base: u64,
    /// The transport still holds FPDUs of handed-out requests that it reads from the
    /// application's memory when it (re)sends them ([`QueuePair::set_sources_busy`]): every
    /// send completion that is not an acknowledgement (flushes, failures, a remote
    /// Terminate's verdicts, its Successes included) waits until it no longer does.
    sources_busy: bool,
    /// The transport still holds Read Response segments whose data it reads from the region
    /// when it sends or resends them ([`QueuePair::set_read_responses_unacknowledged`]): an
    /// Atomic Request behind them waits ([`QueuePair::read_response_ready`]).
    read_responses_unacknowledged: bool,
    next_seq: u64,
    outstanding_reads: VecDeque<OutstandingRead>,
    outstanding_atomics: VecDeque<OutstandingAtomic>,
    read_responses: VecDeque<ReadResponseJob>,
    tx_send_msn: u32,
    tx_read_msn: u32,
    tx_terminate_msn: u32,
    tx_atomic_msn: u32,
    rtr_pending: Option<RtrKind>,
    /// Fair alternation between the send queue and Read Responses.
    prefer_read_response: bool,
    terminate_tx: Option<TerminateHeader>,
    terminate_sent: bool,
    tx_completion: TxCompletion,
    /// Sends/Writes handed out and waiting for their acknowledgement, in hand-out (=
    /// stream) order.
    awaiting_ack: VecDeque<AwaitingAck>,
    /// The oldest of `awaiting_ack` that are acknowledged and complete at
    /// [`QueuePair::complete_acknowledged`].
    acked_pending: usize,
    /// Set by `message_handed_out` when the segment being produced awaits its ACK.
    tx_completes: bool,

    // ---- receive side ----
    rq: UntaggedQueue<RecvSlot>,
    /// The RTR sink buffer is posted and not yet consumed.
    rtr_sink_pending: bool,
    rrq: UntaggedQueue<u16>,
    read_staging: Vec<StagedRequest>,
    /// QN 3 (RFC 7306 5.2.2 rule 5): one buffer per Atomic Request that may be outstanding.
    arq: UntaggedQueue<u16>,
    atomic_staging: Vec<[u8; ATOMIC_RESPONSE_LEN]>,
    tq: UntaggedQueue<()>,
    terminate_staging: [u8; TERMINATE_BUFFER_LEN],
    inbound_sends: VecDeque<InboundSend>,
    remote_terminate: Option<TerminateInfo>,
    completions: VecDeque<WorkCompletion>,
    /// Receives refused at posting ([`QueuePair::complete_recv_in_error`]) that wait for the
    /// receives posted before them, each with the count of receives posted before it.
    held_recv_refusals: VecDeque<HeldRecvRefusal>,
    /// A refused receive that fails the queue pair came due before it ran (Idle):
    /// [`QueuePair::enter_rts`] fails it.
    fail_on_rts: bool,
    /// A refused receive that fails the queue pair completed while a segment was processed:
    /// no more receives complete in that segment, and once its own outcome is settled (a
    /// Terminate of its own goes first) the queue pair fails.
    refused_recv_due: bool,
    /// The receive (by its message's MSN) a Send failed in: it completes with this status
    /// rather than flushed when the queue pair fails (as siw: a Send longer than its receive
    /// is `LocalLengthError`, one its receive's memory cannot take `LocalProtectionError`).
    failed_recv: Option<(u32, WcStatus)>,
    /// Receive work requests taken into `rq` so far (posted, or from a shared queue)...
    recvs_taken: u64,
    /// ... and those of them completed (consumed or flushed).
    recvs_completed: u64,
    /// The shared receive queue the receive buffers come from, if one is attached.
    srq: Option<SrqSlot>,
    /// The stream's membership of its protection domain's table while it runs
    /// ([`QueuePair::join_stream`]); given up when its work is flushed.
    stream: Option<crate::memory::StreamMember>,
}

/// Where a queue pair attached to a shared receive queue (verbs' SRQ) takes its receive
/// buffers: one per inbound Send message, taken when the message is processed in order
/// (a Send whose buffer is not taken yet is not placed early). The source checked each
/// buffer's scatter/gather list against the protection domain when it was posted; placement
/// checks every piece again.
pub trait RecvSource: Send {
    /// The next posted receive, if any.
    fn take(&mut self) -> Option<RecvWr>;
}

/// An attached [`RecvSource`] (a field of a `Debug` type).
struct SrqSlot(Box<dyn RecvSource>);

impl std::fmt::Debug for SrqSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SrqSlot")
    }
}

impl QueuePair {
    /// A queue pair in [`QpState::Idle`].
    pub fn new(cfg: QpConfig) -> Self {
        let mut qp = QueuePair {
            cfg,
            state: QpState::Idle,
            ird: cfg.ird,
            ord: cfg.ord,
            sq: VecDeque::new(),
            inline_data: VecDeque::new(),
            slots: VecDeque::new(),
            slots_base: 0,
            next_seq: 0,
            outstanding_reads: VecDeque::new(),
            outstanding_atomics: VecDeque::new(),
            read_responses: VecDeque::new(),
            tx_send_msn: ddp::INITIAL_MSN,
            tx_read_msn: ddp::INITIAL_MSN,
            tx_terminate_msn: ddp::INITIAL_MSN,
            tx_atomic_msn: ddp::INITIAL_MSN,
            rtr_pending: None,
            prefer_read_response: false,
            terminate_tx: None,
            terminate_sent: false,
            tx_completion: TxCompletion::HandOff,
            sources_busy: false,
            read_responses_unacknowledged: false,
            awaiting_ack: VecDeque::new(),
            acked_pending: 0,
            tx_completes: false,
            rq: UntaggedQueue::new(queue::SEND, cfg.rq_depth.saturating_add(1)),
            rtr_sink_pending: false,
            rrq: UntaggedQueue::new(queue::READ_REQUEST, 0),
            read_staging: Vec::new(),
            arq: UntaggedQueue::new(queue::ATOMIC_RESPONSE, 0),
            atomic_staging: Vec::new(),
            tq: UntaggedQueue::new(queue::TERMINATE, 1),
            terminate_staging: [0; TERMINATE_BUFFER_LEN],
            inbound_sends: VecDeque::new(),
            remote_terminate: None,
            completions: VecDeque::new(),
            held_recv_refusals: VecDeque::new(),
            fail_on_rts: false,
            refused_recv_due: false,
            failed_recv: None,
            recvs_taken: 0,
            recvs_completed: 0,
            srq: None,
            stream: None,
        };
        qp.setup_read_queue(cfg.ird);
        qp.setup_atomic_queue(cfg.ord);
        // A fresh queue with capacity 1 always takes one buffer.
        let _ = qp.tq.post(TERMINATE_BUFFER_LEN as u32, ());
        qp
    }

    /// Posts `ird` staging buffers on QN 1: one per inbound Read Request that may be
    /// outstanding (RFC 5040 5.2.2).
    fn setup_read_queue(&mut self, ird: u16) {
        self.rrq = UntaggedQueue::new(queue::READ_REQUEST, usize::from(ird));
        let empty = StagedRequest {
            bytes: [0; ATOMIC_REQUEST_LEN],
            atomic: None,
            segment: None,
        };
        self.read_staging = vec![empty; usize::from(ird)];
        for slot in 0..ird {
            // Capacity is `ird`, so these posts cannot fail.
            let _ = self.rrq.post(self.request_buffer_len(), slot);
        }
    }

    /// Octets of a QN 1 buffer: a Read Request, or with the extensions an Atomic Request
    /// (RFC 7306 5.2.2 rule 4: the same queue takes both).
    fn request_buffer_len(&self) -> u32 {
        if self.cfg.extensions {
            ATOMIC_REQUEST_LEN as u32
        } else {
            READ_REQUEST_LEN as u32
        }
    }

    /// With the extensions, posts `ord` buffers on QN 3, one per Atomic Request that may be
    /// outstanding (RFC 7306 5.2.2 rule 5); without, QN 3 takes nothing.
    fn setup_atomic_queue(&mut self, ord: u16) {
        let n = if self.cfg.extensions { ord } else { 0 };
        self.arq = UntaggedQueue::new(queue::ATOMIC_RESPONSE, usize::from(n));
        self.atomic_staging = vec![[0; ATOMIC_RESPONSE_LEN]; usize::from(n)];
        for slot in 0..n {
            // Capacity is `n`, so these posts cannot fail.
            let _ = self.arq.post(ATOMIC_RESPONSE_LEN as u32, slot);
        }
    }

    /// Moves the QP to RTS with the IRD/ORD negotiated by MPA (RFC 6581 9.1). Only
    /// from [`QpState::Idle`]; ignored otherwise.
    pub fn enter_rts(&mut self, ird: u16, ord: u16) {
        if self.state != QpState::Idle {
            return;
        }
        self.ird = ird;
        self.ord = ord;
        self.setup_read_queue(ird);
        self.setup_atomic_queue(ord);
        self.state = QpState::Rts;
        if std::mem::take(&mut self.fail_on_rts) {
            self.fail_for_a_refused_recv();
        }
    }

    /// Counts this queue pair among the streams of its protection domain's table `mem`
    /// ([`MemoryTable::join_stream`]) until it closes or fails: a peer may invalidate an
    /// STag enabled for remote access only while no other stream shares it (RFC 5040 8.1.1
    /// rule 7). A transport calls it for each connection's queue pair.
    pub fn join_stream<B: RegionBuffer>(&mut self, mem: &MemoryTable<B>) {
        if self.stream.is_none() && !matches!(self.state, QpState::Closing | QpState::Error) {
            self.stream = Some(mem.join_stream());
        }
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The IRD in force.
    pub fn ird(&self) -> u16 {
        self.ird
    }

    /// The ORD in force.
    pub fn ord(&self) -> u16 {
        self.ord
    }

    /// The Protection Domain.
    pub fn pd(&self) -> PdId {
        self.cfg.pd
    }

    /// Queues the MPA v2 peer-to-peer RTR (RFC 6581 9.2): it is sent before anything
    /// else once the QP is in RTS. Call before any other message went out.
    pub fn send_rtr(&mut self, kind: RtrKind) {
        if matches!(self.state, QpState::Idle | QpState::Rts) {
            self.rtr_pending = Some(kind);
        }
    }

    /// Responder side of peer-to-peer mode: the peer's first message will be an RTR of
    /// `kind`. For [`RtrKind::Send`] an internal zero-length buffer is put in front of
    /// the posted receive buffers so the RTR consumes no user receive work request. RTR
    /// Writes and Reads need no preparation (zero-length messages pass unchecked, and a
    /// zero-length Read Request is answered like any other). Only in
    /// [`QpState::Idle`].
    pub fn expect_rtr(&mut self, kind: RtrKind) -> Result<(), RdmapError> {
        if self.state != QpState::Idle {
            return Err(RdmapError::InvalidState { state: self.state });
        }
        if kind == RtrKind::Send {
            let posted = self.rq.drain();
            self.rq.post(0, RecvSlot::RtrSink)?;
            self.rtr_sink_pending = true;
            for slot in posted {
                let len = match &slot {
                    RecvSlot::User(wr) => recv_len(&wr.sg_list),
                    RecvSlot::RtrSink => 0,
                };
                self.rq.post(len, slot)?;
            }
        }
        Ok(())
    }

    /// What the peer reported in its Terminate, if it sent one.
    pub fn remote_terminate(&self) -> Option<TerminateInfo> {
        self.remote_terminate
    }

    /// The Terminate this QP queued or sent, if any.
    pub fn local_terminate(&self) -> Option<TerminateHeader> {
        self.terminate_tx
    }

    /// Whether [`QueuePair::poll_transmit`] would produce a ULPDU now.
    pub fn has_pending_transmit(&self) -> bool {
        if self.terminate_tx.is_some() && !self.terminate_sent {
            return true;
        }
        self.state == QpState::Rts && (self.rtr_pending.is_some() || self.pick_source().is_some())
    }

    // ------------------------------------------------------------------------------
    // posting
    // ------------------------------------------------------------------------------

    fn check_postable(&self) -> Result<(), RdmapError> {
        match self.state {
            QpState::Idle | QpState::Rts => Ok(()),
            state => Err(RdmapError::InvalidState { state }),
        }
    }

    /// Scatters `len` octets at message offset `offset` over a receive buffer's list (placing
    /// `bytes` if given; `None`: placed already, only checked). Every piece is checked (the
    /// buffer's PD, LOCAL_WRITE, bounds) before anything is written; false if a check fails or
    /// the list ends first, and then nothing was written.
    fn scatter<B: RegionBuffer>(
        &self,
        sg_list: &SgeList,
        offset: u64,
        len: u64,
        bytes: Option<&[u8]>,
        mem: &MemoryTable<B>,
    ) -> bool {
        let check = |piece: &Sge| {
            mem.validate(
                piece.stag,
                self.cfg.pd,
                Access::LOCAL_WRITE,
                piece.to,
                u64::from(piece.len),
            )
        };
        let mut covered = 0u64;
        for piece in sg_list.pieces(offset, len) {
            if check(&piece).is_err() {
                return false;
            }
            covered += u64::from(piece.len);
        }
        if covered != len {
            return false;
        }
        if let Some(bytes) = bytes {
            let mut done = 0usize;
            for piece in sg_list.pieces(offset, len) {
                let n = piece.len as usize;
                let (Ok((buffer, at)), Some(part)) = (check(&piece), bytes.get(done..done + n))
                else {
                    return false;
                };
                buffer.write_at(at, part);
                done += n;
            }
        }
        true
    }

    /// Checks a local scatter/gather list of a message to send, element by element (a
    /// zero-length element needs no check), and that the message fits a 32-bit length (the
    /// completion's byte count, and an untagged message's MO, RFC 5041 5.2).
    fn check_local<B: RegionBuffer>(
        &self,
        sg_list: &SgeList,
        needed: Access,
        mem: &MemoryTable<B>,
    ) -> Result<(), RdmapError> {
        if sg_list.total_len() > u64::from(u32::MAX) {
            return Err(RdmapError::MessageTooLong {
                len: sg_list.total_len(),
            });
        }
        self.check_elements(sg_list, needed, mem)
    }

    /// Checks each element of a local scatter/gather list (a zero-length element needs no
    /// check): an STag of the queue pair's PD with `needed`, the range in bounds.
    fn check_elements<B: RegionBuffer>(
        &self,
        sg_list: &SgeList,
        needed: Access,
        mem: &MemoryTable<B>,
    ) -> Result<(), RdmapError> {
        for sge in sg_list.as_slice().iter().filter(|s| s.len > 0) {
            mem.validate(sge.stag, self.cfg.pd, needed, sge.to, u64::from(sge.len))
                .map_err(|violation| RdmapError::LocalAccess {
                    stag: sge.stag,
                    violation,
                })?;
        }
        Ok(())
    }

    /// Posts a send work request.
    ///
    /// Checked now, failing with an error and leaving nothing queued: the state (Idle
    /// or RTS; work posted in Idle waits for RTS), send queue space (`sq_depth` work
    /// requests posted and not yet completed, Reads included until their Response is
    /// placed), and the local element: a valid STag of the QP's PD, in bounds, and
    /// for a Read sink the LOCAL_WRITE right ([`RdmapError::LocalAccess`]). A
    /// zero-length element is not checked. Nothing about the remote STag is checked
    /// here: the peer does that. In RTS, a Read or Atomic with an ORD of 0 fails with
    /// [`RdmapError::ZeroOrd`] (in Idle the ORD is not known yet: one posted then, followed
    /// by [`QueuePair::enter_rts`] with ORD 0, completes with
    /// [`WcStatus::LocalQpOperationError`] when it reaches the head of the send queue, and
    /// the queue pair terminates as for any local failure of the head: what went before it
    /// completes first, flushed if it still awaited its acknowledgement under
    /// [`TxCompletion::Acknowledged`]).
    pub fn post_send<B: RegionBuffer>(
        &mut self,
        wr: SendWr,
        mem: &MemoryTable<B>,
    ) -> Result<(), RdmapError> {
        self.check_postable()?;
        if self.slots.len() >= self.cfg.sq_depth {
            return Err(RdmapError::SendQueueFull);
        }
        wr.check_shape(self.cfg.extensions)?;
        if self.state == QpState::Rts {
            // The ORD is known once in RTS (work posted in Idle waits for it).
            wr.check_ord(self.ord)?;
        }
        // A Read's or an Atomic's local element is where the answer lands.
        let needed = match wr.op {
            SendOp::Read { .. } | SendOp::Atomic { .. } => Access::LOCAL_WRITE,
            _ => Access::NONE,
        };
        self.check_local(&wr.sg_list, needed, mem)?;
        let total = wr.sg_list.total_len();
        self.enqueue_send(wr, total, false);
        Ok(())
    }

    /// Posts a Send or RDMA Write whose payload travels in the work request
    /// ([`InlineSendWr`]). Checked now as [`QueuePair::post_send`]: the state, send queue
    /// space, and the operation ([`RdmapError::NotInlinable`] for a Read, an Atomic or a
    /// lone Immediate Data message). No memory region is involved.
    pub fn post_send_inline(&mut self, wr: InlineSendWr) -> Result<(), RdmapError> {
        self.check_postable()?;
        if self.slots.len() >= self.cfg.sq_depth {
            return Err(RdmapError::SendQueueFull);
        }
        wr.check_shape(self.cfg.extensions)?;
        let send = SendWr {
            wr_id: wr.wr_id,
            op: wr.op,
            sg_list: SgeList::new(),
            signaled: wr.signaled,
            fence: wr.fence,
        };
        self.inline_data.push_back(wr.data);
        self.enqueue_send(send, wr.data.len() as u64, true);
        Ok(())
    }

    /// Queues a checked send work request of `total` octets and its completion slot.
    fn enqueue_send(&mut self, wr: SendWr, total: u64, inline: bool) {
        self.enqueue(wr, wr.op.wc_opcode(), total, inline, None);
    }

    /// Queues a send queue entry and its completion slot (reporting `opcode`); `refused`: it
    /// fails in its place ([`QueuePair::fail_send_in_place`]).
    fn enqueue(
        &mut self,
        wr: SendWr,
        opcode: WcOpcode,
        total: u64,
        inline: bool,
        refused: Option<WcStatus>,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.slots.push_back(CompletionSlot {
            wr_id: wr.wr_id,
            opcode,
            // At most u32::MAX: checked by the callers.
            byte_len: total as u32,
            status: None,
            signaled: wr.signaled,
        });
        self.sq.push_back(SqEntry {
            wr,
            seq,
            sent: 0,
            total,
            tail: matches!(wr.op, SendOp::Immediate { .. }),
            inline,
            checked_to: 0,
            checked_in: TableVersion::default(),
            refused,
        });
    }

    /// Queues a send work request that failed its local checks when the transport took it
    /// (an invalid local STag or element, `LocalProtectionError`; a message too long,
    /// `LocalLengthError`), to fail in its place as a verbs device fails one when it reaches
    /// it: once every request posted before it is handed out, it completes with `status` and
    /// the queue pair fails as for a source found bad while sending (a Terminate, Local
    /// Catastrophic; the requests after it flushed). If the queue pair ends first, it is
    /// flushed with the others. It holds a send queue entry until then; with `fence` (the work
    /// request's) it waits, as a fenced request does, for the Reads and Atomics before it.
    pub fn fail_send_in_place(
        &mut self,
        wr_id: u64,
        opcode: WcOpcode,
        status: WcStatus,
        fence: bool,
    ) {
        // What it asked for matters no more: an empty Send that fails when it is the head.
        let wr = SendWr {
            wr_id,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: SgeList::new(),
            signaled: true,
            fence,
        };
        self.enqueue(wr, opcode, 0, false, Some(status));
    }

    /// Whether the transport still reads handed-out requests' payload from the application's
    /// memory (a transport that sends from registered memory and keeps FPDUs until they are
    /// acknowledged, so that it can resend them). While it does, requests flushed by a close
    /// or an error (RFC 5040 6.2, 5.4), failed, or completed by a remote Terminate (RFC 5040
    /// 6.2.1) wait to complete: verbs gives a buffer back to the application with its
    /// request's completion, and octets read from it after that could be the application's
    /// next message, sent under this one's headers and CRC. Set it false once the transport
    /// has released those FPDUs (acknowledged, or the connection gone). A Success is taken as
    /// the peer's acknowledgement: a transport that sets this completes its requests on
    /// acknowledgement ([`TxCompletion::Acknowledged`]).
    pub fn set_sources_busy(&mut self, busy: bool) {
        if self.sources_busy != busy {
            self.sources_busy = busy;
            if !busy {
                self.release_slots();
            }
        }
    }

    /// Whether the transport still holds Read Response segments handed out by reference
    /// ([`QueuePair::poll_transmit_segment`]'s payloads: their data is read from the region
    /// when a segment is sent, and again when it is resent) that are not yet acknowledged. While
    /// it does, an Atomic Request at the head of the responder's queue waits: RFC 7306 7 has
    /// the Atomic Response generated only after the Read Responses before it, whose data must
    /// then be the memory before the Atomic Operation, however late the transport reads it or
    /// however often it resends it. A transport that copies the payload when the segment is
    /// built ([`QueuePair::poll_transmit`]) never sets it.
    pub fn set_read_responses_unacknowledged(&mut self, unacknowledged: bool) {
        self.read_responses_unacknowledged = unacknowledged;
    }

    /// Completes a send queue work request that [`QueuePair::post_send`] or
    /// [`QueuePair::post_send_inline`] refused, with `status` (the caller's mapping of the
    /// error), in its place: after every request posted before it (rule 15), as verbs
    /// completes a request whose local checks fail. It holds a send queue entry until then,
    /// as such a request does on a verbs device (a full queue's refusal is counted beyond
    /// `sq_depth`).
    pub fn complete_send_in_error(&mut self, wr_id: u64, opcode: WcOpcode, status: WcStatus) {
        self.next_seq += 1;
        self.slots.push_back(CompletionSlot {
            wr_id,
            opcode,
            byte_len: 0,
            status: Some(status),
            signaled: true,
        });
        self.release_slots();
    }

    /// Removes the send queue's head (and its inline payload).
    fn pop_sq(&mut self) {
        if self.sq.pop_front().is_some_and(|e| e.inline) {
            self.inline_data.pop_front();
        }
    }

    /// Posts a receive work request: one buffer for the next inbound Send. Checked:
    /// state (Idle or RTS), `rq_depth`, and the element (valid STag of the QP's PD, in
    /// bounds, LOCAL_WRITE). A buffer may be longer than any message (2^32 - 1 octets at
    /// most, RFC 5041 5.2's MO): it is taken as that long, as verbs takes a receive longer
    /// than `max_msg_sz`.
    pub fn post_recv<B: RegionBuffer>(
        &mut self,
        wr: RecvWr,
        mem: &MemoryTable<B>,
    ) -> Result<(), RdmapError> {
        self.check_postable()?;
        if self.srq.is_some() {
            return Err(RdmapError::SrqAttached);
        }
        if self.recv_queue_used() >= self.cfg.rq_depth {
            return Err(RdmapError::RecvQueueFull);
        }
        self.check_elements(&wr.sg_list, Access::LOCAL_WRITE, mem)?;
        let len = recv_len(&wr.sg_list);
        self.rq.post(len, RecvSlot::User(wr))?;
        self.recvs_taken += 1;
        Ok(())
    }

    /// Completes a receive work request that [`QueuePair::post_recv`] refused, with `status`
    /// (the caller's mapping of the error), in its place: after every receive posted before
    /// it, as verbs completes a receive queue in order. It holds a receive queue entry until
    /// then (it counts in [`QueuePair::recv_queue_used`]); with the queue full (a refusal
    /// for [`RdmapError::RecvQueueFull`]) or a shared receive queue attached (whose buffers
    /// are not this queue's), it completes at once.
    pub fn complete_recv_in_error(&mut self, wr_id: u64, status: WcStatus) {
        self.refuse_recv(wr_id, status, false);
    }

    /// [`QueuePair::complete_recv_in_error`] of a receive that failed its local checks (an
    /// invalid local STag or element, `LocalProtectionError`), which then fails the queue
    /// pair as a verbs device fails one whose next receive is bad: the receives posted before
    /// it complete, then it completes with `status` and a Terminate (Local Catastrophic)
    /// ends the stream, so that no later Send lands in the receive after it. Before the
    /// queue pair runs (Idle) the failure waits for [`QueuePair::enter_rts`].
    pub fn fail_recv_in_place(&mut self, wr_id: u64, status: WcStatus) {
        self.refuse_recv(wr_id, status, true);
    }

    fn refuse_recv(&mut self, wr_id: u64, status: WcStatus, fails_the_queue_pair: bool) {
        let completion = WorkCompletion::failed(wr_id, WcOpcode::Recv, status);
        if self.recvs_completed == self.recvs_taken
            || self.srq.is_some()
            || self.recv_queue_used() >= self.cfg.rq_depth
        {
            self.completions.push_back(completion);
            if fails_the_queue_pair {
                self.fail_for_a_refused_recv();
            }
        } else {
            self.held_recv_refusals.push_back(HeldRecvRefusal {
                taken_before: self.recvs_taken,
                completion,
                fails_the_queue_pair,
            });
        }
    }

    /// A refused receive that fails the queue pair reached its turn: in RTS the Terminate
    /// (Local Catastrophic) is raised now; in Idle at [`QueuePair::enter_rts`].
    fn fail_for_a_refused_recv(&mut self) {
        match self.state {
            QpState::Rts => self.raise_terminate(TerminateHeader::bare(
                layer::RDMAP,
                rdmap_etype::LOCAL_CATASTROPHIC,
                0,
            )),
            QpState::Idle => self.fail_on_rts = true,
            _ => {}
        }
    }

    /// Queues the completion of a receive taken into `rq`, and after it the refusals that
    /// were waiting for it.
    fn complete_recv(&mut self, completion: WorkCompletion) {
        self.completions.push_back(completion);
        self.recvs_completed += 1;
        while let Some(held) = self.held_recv_refusals.front() {
            if held.taken_before > self.recvs_completed {
                break;
            }
            if let Some(held) = self.held_recv_refusals.pop_front() {
                self.completions.push_back(held.completion);
                if held.fails_the_queue_pair {
                    // Raised by `process` once the segment's own outcome is known.
                    self.refused_recv_due = true;
                }
            }
        }
    }

    /// Attaches a shared receive queue: from now on inbound Sends take their buffers from
    /// `source` ([`RecvSource`]), and [`QueuePair::post_recv`] fails with
    /// [`RdmapError::SrqAttached`]. Fails the same way if receives were posted already. On
    /// error, buffers taken from the source and not yet used are flushed with the queue
    /// pair's other work requests (`WrFlushError`), as its own receives would be.
    pub fn attach_srq(&mut self, source: Box<dyn RecvSource>) -> Result<(), RdmapError> {
        if self.srq.is_some() || self.rq.posted() > self.rtr_sink_posted() {
            return Err(RdmapError::SrqAttached);
        }
        self.srq = Some(SrqSlot(source));
        Ok(())
    }

    /// Takes a buffer from the shared receive queue for the Send message `msn`, processed in
    /// order, if it is the message just past those holding buffers and each of those has had
    /// its Last segment. A sender sends its messages in MSN order (RFC 5041 5.3), so in order
    /// a message needs a buffer only when its first segment comes, and only once the message
    /// before it has ended: a peer naming an MSN ahead, or beginning a message before it
    /// ended the one before, takes nothing (it gets the RFC 5041 7.1 untagged-buffer
    /// Terminate), so it can hold at most the buffer of the one message it has begun, not
    /// drain a queue shared with other connections (RFC 5042 6.4.3.1).
    fn take_from_srq(&mut self, msn: u32) {
        let Some(SrqSlot(source)) = self.srq.as_mut() else {
            return;
        };
        let posted = self.rq.posted();
        if msn.wrapping_sub(self.rq.next_msn()) as usize != posted
            || posted >= self.rq.max_posted()
            || !self.rq.every_message_ended()
        {
            return;
        }
        let Some(wr) = source.take() else {
            return;
        };
        // The source checked the list. `post` cannot fail below `max_posted`.
        let len = recv_len(&wr.sg_list);
        if self.rq.post(len, RecvSlot::User(wr)).is_ok() {
            self.recvs_taken += 1;
        }
    }

    fn rtr_sink_posted(&self) -> usize {
        // The RTR sink, if any, is the front buffer; it is delivered before any other.
        usize::from(self.rtr_sink_pending)
    }

    /// True if a shared receive queue gives this queue pair its receive buffers
    /// ([`QueuePair::attach_srq`]).
    pub fn has_srq(&self) -> bool {
        self.srq.is_some()
    }

    /// The queue pair's parameters.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// Places of the send queue in use: send work requests posted and not yet completed
    /// (what [`QpConfig::sq_depth`] bounds). A request leaves it when its completion is
    /// queued for [`QueuePair::poll_completion`] (or, unsignaled, would have been).
    pub fn send_queue_used(&self) -> usize {
        self.slots.len()
    }

    /// Receive work requests posted on the queue pair and not yet used or flushed (what
    /// [`QpConfig::rq_depth`] bounds); 0 with a shared receive queue attached. A receive
    /// leaves it when its completion is queued for [`QueuePair::poll_completion`].
    pub fn recv_queue_used(&self) -> usize {
        if self.srq.is_some() {
            return 0;
        }
        self.rq.posted().saturating_sub(self.rtr_sink_posted()) + self.held_recv_refusals.len()
    }

    /// The next completion, if any.
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.completions.pop_front()
    }

    // ------------------------------------------------------------------------------
    // completion bookkeeping
    // ------------------------------------------------------------------------------

    /// Sets the status of the send work request `seq` (first status wins) and releases
    /// completions that are now at the head of the submission order.
    fn finish_slot(&mut self, seq: u64, status: WcStatus) {
        if let Some(index) = seq.checked_sub(self.slots_base) {
            if let Some(slot) = usize::try_from(index)
                .ok()
                .and_then(|i| self.slots.get_mut(i))
            {
                if slot.status.is_none() {
                    slot.status = Some(status);
                }
            }
        }
        self.release_slots();
    }

    fn release_slots(&mut self) {
        while let Some(slot) = self.slots.front() {
            let Some(status) = slot.status else { break };
            // A success comes from the peer's acknowledgement (or, for a Read, from its
            // Response): the request's octets are no longer read. Any other completion (a
            // flush, a local error, a remote Terminate's verdict, successes included, on
            // requests it may not have acknowledged) can come while the transport still
            // resends the request's octets from its buffer, which is not the application's
            // again until it stops: a peer that withholds its ACKs and sends a Terminate
            // would otherwise read what the application writes there next.
            let acknowledged = status == WcStatus::Success && self.remote_terminate.is_none();
            if self.sources_busy && !acknowledged {
                break;
            }
            let slot = *slot;
            self.slots.pop_front();
            self.slots_base += 1;
            if status == WcStatus::Success && !slot.signaled {
                continue;
            }
            self.completions.push_back(WorkCompletion {
                wr_id: slot.wr_id,
                opcode: slot.opcode,
                status,
                byte_len: if status == WcStatus::Success {
                    slot.byte_len
                } else {
                    0
                },
                invalidated: None,
                solicited: false,
                immediate: None,
            });
        }
    }

    /// The completion policy for Sends and RDMA Writes (see the module documentation):
    /// complete now, or once the transport reports the Last ULPDU acknowledged.
    fn message_handed_out(&mut self, seq: u64, name: MessageName) {
        match self.tx_completion {
            TxCompletion::HandOff => self.finish_slot(seq, WcStatus::Success),
            TxCompletion::Acknowledged => {
                self.awaiting_ack.push_back(AwaitingAck { seq, name });
                self.tx_completes = true;
            }
        }
    }

    /// Chooses when Sends and RDMA Writes complete (see the module documentation). Set it
    /// before anything is handed out.
    pub fn set_tx_completion(&mut self, policy: TxCompletion) {
        self.tx_completion = policy;
    }

    /// The completion policy in force.
    pub fn tx_completion(&self) -> TxCompletion {
        self.tx_completion
    }

    /// Under [`TxCompletion::Acknowledged`]: the oldest segment handed out with
    /// [`TxSegment::completes`] set has been acknowledged by the peer; its work request
    /// completes (in submission order, RFC 5040 5.5 rule 15). Calls beyond the segments
    /// handed out (or after the QP flushed them) do nothing.
    pub fn message_acknowledged(&mut self) {
        self.message_acknowledged_deferred();
        self.complete_acknowledged();
    }

    /// [`QueuePair::message_acknowledged`] for a transport that takes a TCP segment's ACK
    /// before its data: the work request completes at the next
    /// [`QueuePair::complete_acknowledged`], called once the segment's data has been
    /// processed. A Terminate in that data which names it (the peer's TCP received the
    /// octets, its RDMAP refused them) completes it with the remote error instead.
    pub fn message_acknowledged_deferred(&mut self) {
        self.acked_pending = (self.acked_pending + 1).min(self.awaiting_ack.len());
    }

    /// Completes ([`WcStatus::Success`]) what [`QueuePair::message_acknowledged_deferred`]
    /// reported acknowledged; nothing if a Terminate flushed it meanwhile.
    pub fn complete_acknowledged(&mut self) {
        for _ in 0..std::mem::take(&mut self.acked_pending) {
            if let Some(done) = self.awaiting_ack.pop_front() {
                self.finish_slot(done.seq, WcStatus::Success);
            }
        }
    }

    /// Sends and Writes handed out whose acknowledgement is awaited.
    pub fn awaiting_acknowledgement(&self) -> usize {
        self.awaiting_ack.len()
    }

    /// Flushes every outstanding work request with [`WcStatus::WrFlushError`] (RFC 5040
    /// 5.4, 6.2.1: outstanding messages "SHOULD be considered Completed in error").
    fn flush_all(&mut self) {
        self.stream = None;
        self.rtr_pending = None;
        self.awaiting_ack.clear();
        self.acked_pending = 0;
        self.sq.clear();
        self.inline_data.clear();
        self.outstanding_reads.clear();
        self.outstanding_atomics.clear();
        self.read_responses.clear();
        for slot in self.slots.iter_mut() {
            if slot.status.is_none() {
                slot.status = Some(WcStatus::WrFlushError);
            }
        }
        self.release_slots();
        let mut msn = self.rq.next_msn();
        let failed = self.failed_recv.take();
        for slot in self.rq.drain() {
            if let RecvSlot::User(wr) = slot {
                let status = match failed {
                    Some((at, status)) if at == msn => status,
                    _ => WcStatus::WrFlushError,
                };
                self.complete_recv(WorkCompletion::failed(wr.wr_id, WcOpcode::Recv, status));
            }
            msn = msn.wrapping_add(1);
        }
        // Every receive is done: no refusal waits any more.
        self.recvs_completed = self.recvs_taken;
        while let Some(held) = self.held_recv_refusals.pop_front() {
            self.completions.push_back(held.completion);
        }
        // The queue pair is ending already.
        self.refused_recv_due = false;
        self.rtr_sink_pending = false;
        self.rrq.drain();
        self.arq.drain();
        self.tq.drain();
        self.inbound_sends.clear();
    }

    fn enter_error(&mut self) {
        self.state = QpState::Error;
        self.flush_all();
    }

    /// Queues `header` as the one Terminate of this stream (RFC 5040 5.4, 7.1 rule 4:
    /// the first error wins) and enters [`QpState::Terminate`].
    fn raise_terminate(&mut self, header: TerminateHeader) {
        if self.terminate_tx.is_some() || matches!(self.state, QpState::Error) {
            return;
        }
        self.terminate_tx = Some(header);
        self.state = QpState::Terminate;
    }

    // ------------------------------------------------------------------------------
    // teardown and transport events
    // ------------------------------------------------------------------------------

    /// Graceful close (RFC 5040 6.2): moves to [`QpState::Closing`] and flushes every
    /// outstanding work request. A queued Terminate is still handed out.
    pub fn close(&mut self) {
        match self.state {
            QpState::Idle | QpState::Rts => {
                self.state = QpState::Closing;
                self.flush_all();
            }
            QpState::Terminate => self.flush_all(),
            QpState::Closing | QpState::Error => {}
        }
    }

    /// An error below RDMAP. For [`TerminateCause::ConnectionLost`] nothing can be sent:
    /// the QP enters [`QpState::Error`] and flushes. Otherwise the Terminate of the cause
    /// (no copied headers: RFC 5040 Figure 10 for LLP and catastrophic errors) is
    /// queued, and the QP enters Error once it has been handed out.
    pub fn on_transport_error(&mut self, cause: TerminateCause) {
        match cause.code() {
            None => {
                self.terminate_tx = self.terminate_tx.filter(|_| self.terminate_sent);
                self.enter_error();
            }
            Some(code) => {
                self.raise_terminate(TerminateHeader::bare(code.layer, code.etype, code.code));
            }
        }
    }

    // ------------------------------------------------------------------------------
    // transmit
    // ------------------------------------------------------------------------------

    fn sq_ready(&self) -> bool {
        match self.sq.front() {
            Some(entry) => match entry.wr.op {
                // RFC 7306 5.2: Atomic Requests share ORD with Read Requests. With an ORD of
                // 0 (one posted in Idle) the head is "ready" to fail (`emit_sq_segment`).
                SendOp::Read { .. } | SendOp::Atomic { .. } => {
                    let outstanding = self.outstanding_reads.len() + self.outstanding_atomics.len();
                    (!entry.wr.fence || outstanding == 0)
                        && (self.ord == 0 || outstanding < usize::from(self.ord))
                }
                // A fenced request waits for every earlier Read and Atomic (`SendWr::fence`).
                _ if entry.wr.fence => {
                    self.outstanding_reads.is_empty() && self.outstanding_atomics.is_empty()
                }
                _ => true,
            },
            None => false,
        }
    }

    /// Whether the responder's queue has a Read or Atomic Response to emit now: an Atomic
    /// Request waits while Read Responses before it are unacknowledged and would be read from
    /// memory again (RFC 7306 7; [`QueuePair::set_read_responses_unacknowledged`]).
    #[inline]
    fn read_response_ready(&self) -> bool {
        self.read_responses
            .front()
            .is_some_and(|job| job.atomic.is_none() || !self.read_responses_unacknowledged)
    }

    #[inline]
    fn pick_source(&self) -> Option<TxSource> {
        let sq = self.sq_ready();
        let rr = self.read_response_ready();
        match (sq, rr) {
            (false, false) => None,
            (true, false) => Some(TxSource::SendQueue),
            (false, true) => Some(TxSource::ReadResponse),
            (true, true) => {
                let sq_write = self.sq.front().filter(|e| {
                    matches!(
                        e.wr.op,
                        SendOp::Write { .. } | SendOp::WriteImmediate { .. }
                    ) && !e.tail
                });
                let rr_started = self.read_responses.front().is_some_and(|j| j.sent > 0);
                match sq_write {
                    // Never interleave two tagged messages.
                    Some(w) if w.sent > 0 => Some(TxSource::SendQueue),
                    Some(_) if rr_started => Some(TxSource::ReadResponse),
                    _ if self.prefer_read_response => Some(TxSource::ReadResponse),
                    _ => Some(TxSource::SendQueue),
                }
            }
        }
    }

    /// Builds the next ULPDU (DDP header, RDMAP header, payload), appends it to `out`
    /// and describes it; `None` when nothing is ready.
    ///
    /// Data segments carry at most `max_ulpdu` octets (the MULPDU: payload =
    /// `max_ulpdu` - DDP header length, at least 1). Read Requests (46 octets) and
    /// Terminates (at most 70) are always sent whole; MPA's MULPDU floor of 128 octets
    /// covers them.
    ///
    /// Order: the Terminate if one is queued (after it nothing is ever returned again
    /// and the QP is in [`QpState::Error`], everything flushed); otherwise, in RTS only,
    /// the RTR, then send queue messages (posting order; a Read Request waits while ORD
    /// Reads are outstanding) and Read Responses (request order), alternated fairly (see
    /// the module documentation).
    pub fn poll_transmit<B: RegionBuffer>(
        &mut self,
        max_ulpdu: usize,
        mem: &MemoryTable<B>,
        out: &mut Vec<u8>,
    ) -> Option<TxUlpdu> {
        self.poll_transmit_inner(max_ulpdu, mem, out, false)
            .map(|(tx, _)| tx)
    }

    /// [`QueuePair::poll_transmit`] without copying the payload: the same segments in the
    /// same order, but only the DDP and RDMAP headers and inline octets (Read Request,
    /// Terminate, RTR) are appended to `out`; a payload in registered memory is described
    /// in [`TxSegment::payload`] (already validated as [`QueuePair::poll_transmit`] would).
    pub fn poll_transmit_segment<B: RegionBuffer>(
        &mut self,
        max_ulpdu: usize,
        mem: &MemoryTable<B>,
        out: &mut Vec<u8>,
    ) -> Option<TxSegment> {
        self.tx_completes = false;
        let (ulpdu, payload) = self.poll_transmit_inner(max_ulpdu, mem, out, true)?;
        let completes = std::mem::take(&mut self.tx_completes);
        Some(TxSegment {
            ulpdu,
            payload,
            completes,
        })
    }

    // Inlined, like `emit_sq_segment`: a result returned through the stack is written field
    // by field and then moved in 16-octet pieces, a load that cannot be forwarded from the
    // narrower stores and waits for them to reach the cache (the hottest instruction of the
    // sender's rdmap work per FPDU).
    #[inline(always)]
    fn poll_transmit_inner<B: RegionBuffer>(
        &mut self,
        max_ulpdu: usize,
        mem: &MemoryTable<B>,
        out: &mut Vec<u8>,
        by_ref: bool,
    ) -> Option<(TxUlpdu, Option<TxPayload>)> {
        if self.terminate_sent {
            return None;
        }
        if self.terminate_tx.is_some() {
            return Some((self.emit_terminate(out), None));
        }
        if self.state != QpState::Rts {
            return None;
        }
        if let Some(kind) = self.rtr_pending.take() {
            return Some((self.emit_rtr(kind, out), None));
        }
        let source = self.pick_source()?;
        let both = self.sq_ready() && self.read_response_ready();
        let tx = match source {
            TxSource::SendQueue => self.emit_sq_segment(max_ulpdu, mem, out, by_ref),
            TxSource::ReadResponse => {
                match self.emit_read_response_segment(max_ulpdu, mem, out, by_ref) {
                    Ok(tx) => tx,
                    Err(header) => self.terminate_instead(header, out),
                }
            }
        };
        if both {
            self.prefer_read_response = source == TxSource::SendQueue;
        }
        Some(tx)
    }

    /// Appends a DDP header and room for `payload_len` octets; returns the payload range.
    fn push_segment(out: &mut Vec<u8>, header: &DdpHeader, payload_len: usize) -> Range<usize> {
        let start = out.len();
        let header_len = header.header_len();
        out.resize(start + header_len + payload_len, 0);
        header.emit(&mut out[start..]);
        start + header_len..start + header_len + payload_len
    }

    fn untagged(
        opcode: Opcode,
        invalidate: u32,
        qn: u32,
        msn: u32,
        mo: u32,
        last: bool,
    ) -> DdpHeader {
        DdpHeader::Untagged(UntaggedHeader {
            last,
            rsvd_ulp: RdmapControl { opcode }.untagged_rsvd_ulp(invalidate),
            qn,
            msn,
            mo,
        })
    }

    fn tagged(opcode: Opcode, stag: u32, to: u64, last: bool) -> DdpHeader {
        DdpHeader::Tagged(TaggedHeader {
            last,
            rsvd_ulp: RdmapControl { opcode }.to_byte(),
            stag,
            to,
        })
    }

    /// Appends the Terminate message (RFC 5040 4.8: DDP untagged, queue 2, Last) carrying
    /// `header`, numbered `msn`.
    fn push_terminate(out: &mut Vec<u8>, header: &TerminateHeader, msn: u32) {
        let ddp = Self::untagged(Opcode::Terminate, 0, queue::TERMINATE, msn, 0, true);
        let payload = Self::push_segment(out, &ddp, header.buffer_len());
        header.emit(&mut out[payload]);
    }

    /// The Terminate message (its ULPDU: DDP header and Terminate header) a transport sends
    /// for `cause` before any queue pair runs on the stream: the MPA Initiator that cannot
    /// take the Reply's IRD or RTR options (RFC 6581 9.1, 9.2: Layer 2, EType 0, code 6 or
    /// 7). The first message of the Terminate queue (MSN 1); `None` for a cause that sends
    /// nothing ([`TerminateCause::ConnectionLost`]).
    pub fn startup_terminate(cause: TerminateCause) -> Option<Vec<u8>> {
        let code = cause.code()?;
        let mut out = Vec::new();
        let header = TerminateHeader::bare(code.layer, code.etype, code.code);
        Self::push_terminate(&mut out, &header, ddp::INITIAL_MSN);
        Some(out)
    }

    fn emit_terminate(&mut self, out: &mut Vec<u8>) -> TxUlpdu {
        let header = self.terminate_tx.unwrap_or(TerminateHeader::bare(
            layer::RDMAP,
            rdmap_etype::LOCAL_CATASTROPHIC,
            0,
        ));
        let start = out.len();
        Self::push_terminate(out, &header, self.tx_terminate_msn);
        self.tx_terminate_msn = self.tx_terminate_msn.wrapping_add(1);
        self.terminate_sent = true;
        self.enter_error();
        TxUlpdu {
            opcode: Opcode::Terminate,
            last: true,
            len: out.len() - start,
        }
    }

    fn emit_rtr(&mut self, kind: RtrKind, out: &mut Vec<u8>) -> TxUlpdu {
        let start = out.len();
        let opcode = match kind {
            RtrKind::Send => {
                let hdr = Self::untagged(Opcode::Send, 0, queue::SEND, self.tx_send_msn, 0, true);
                self.tx_send_msn = self.tx_send_msn.wrapping_add(1);
                Self::push_segment(out, &hdr, 0);
                Opcode::Send
            }
            RtrKind::Write => {
                Self::push_segment(
                    out,
                    &Self::tagged(Opcode::Write, RTR_WRITE_STAG, 0, true),
                    0,
                );
                Opcode::Write
            }
            RtrKind::Read => {
                let msn = self.tx_read_msn;
                self.tx_read_msn = self.tx_read_msn.wrapping_add(1);
                let hdr = Self::untagged(Opcode::ReadRequest, 0, queue::READ_REQUEST, msn, 0, true);
                let payload = Self::push_segment(out, &hdr, READ_REQUEST_LEN);
                ReadRequest::default().emit(&mut out[payload]);
                self.outstanding_reads.push_back(OutstandingRead {
                    seq: None,
                    msn,
                    sink_stag: 0,
                    sink_to: 0,
                    size: 0,
                    received: 0,
                });
                Opcode::ReadRequest
            }
        };
        TxUlpdu {
            opcode,
            last: true,
            len: out.len() - start,
        }
    }

    /// The send queue head's payload could not be had (its source failed its check, or its
    /// inline octets are missing): the segment begun at `start` is dropped, the work request
    /// completes with `status` and the Terminate goes out instead
    /// ([`QueuePair::fail_locally`]).
    #[cold]
    fn fail_head(
        &mut self,
        seq: u64,
        start: usize,
        out: &mut Vec<u8>,
        status: WcStatus,
    ) -> (TxUlpdu, Option<TxPayload>) {
        out.truncate(start);
        self.pop_sq();
        self.finish_slot(seq, status);
        self.fail_locally(out)
    }

    /// One segment of the send queue's head message. A local failure (the source
    /// region vanished or changed since posting) completes the work request with
    /// [`WcStatus::LocalProtectionError`] and emits the Terminate to send instead
    /// ([`QueuePair::fail_locally`]). Returns the segment as it is, not in a `Result` with
    /// the Terminate header: that larger value went through the stack on every segment.
    #[inline(always)]
    fn emit_sq_segment<B: RegionBuffer>(
        &mut self,
        max_ulpdu: usize,
        mem: &MemoryTable<B>,
        out: &mut Vec<u8>,
        by_ref: bool,
    ) -> (TxUlpdu, Option<TxPayload>) {
        let Some(head) = self.sq.front() else {
            return self.fail_locally(out);
        };
        if let Some(status) = head.refused {
            return self.fail_head(head.seq, out.len(), out, status);
        }
        let version = mem.version();
        // What this segment needs of the head, without copying its scatter/gather list.
        let entry = SqHead {
            op: head.wr.op,
            seq: head.seq,
            sent: head.sent,
            total: head.total,
            tail: head.tail,
            inline: head.inline,
            checked_to: if head.checked_in == version {
                head.checked_to
            } else {
                0
            },
        };
        if entry.tail {
            return self.emit_immediate(entry, out);
        }
        if self.ord == 0 && matches!(entry.op, SendOp::Read { .. } | SendOp::Atomic { .. }) {
            // Posted in Idle, before the ORD was known (`post_send` refuses it in RTS): it
            // could never be sent (RFC 5040 6.1), so it fails instead of holding the queue.
            return self.fail_head(entry.seq, out.len(), out, WcStatus::LocalQpOperationError);
        }
        // A Read's or an Atomic's local sink: its first element (a Read or Atomic has one).
        let sink = || head.wr.sg_list.piece_at(0, u64::MAX).map(|(s, _)| s);
        if let SendOp::Atomic {
            remote_stag,
            remote_to,
            op,
        } = entry.op
        {
            let Some(sink) = sink() else {
                return self.fail_locally(out);
            };
            return self.emit_atomic_request(entry.seq, sink, remote_stag, remote_to, op, out);
        }
        let header_len = match entry.op {
            SendOp::Write { .. } | SendOp::WriteImmediate { .. } => TAGGED_HEADER_LEN,
            _ => UNTAGGED_HEADER_LEN,
        };
        let room = max_ulpdu.saturating_sub(header_len).max(1) as u64;
        // A segment gathers from one element: it ends where the element does (DDP lets a
        // message be cut anywhere, RFC 5041 5.1). `rest`: the element from `sent` to its end.
        let rest = if entry.inline {
            None
        } else {
            head.wr.sg_list.piece_at(entry.sent, u64::MAX)
        };
        let start = out.len();
        if let SendOp::Read {
            remote_stag,
            remote_to,
        } = entry.op
        {
            let sink = sink();
            let request = ReadRequest {
                sink_stag: sink.map_or(0, |s| s.stag.raw()),
                sink_to: sink.map_or(0, |s| s.to),
                size: sink.map_or(0, |s| s.len),
                src_stag: remote_stag.raw(),
                src_to: remote_to,
            };
            let msn = self.tx_read_msn;
            self.tx_read_msn = self.tx_read_msn.wrapping_add(1);
            let hdr = Self::untagged(Opcode::ReadRequest, 0, queue::READ_REQUEST, msn, 0, true);
            let payload = Self::push_segment(out, &hdr, READ_REQUEST_LEN);
            request.emit(&mut out[payload]);
            self.pop_sq();
            self.outstanding_reads.push_back(OutstandingRead {
                seq: Some(entry.seq),
                msn,
                sink_stag: request.sink_stag,
                sink_to: request.sink_to,
                size: request.size,
                received: 0,
            });
            return (
                TxUlpdu {
                    opcode: Opcode::ReadRequest,
                    last: true,
                    len: out.len() - start,
                },
                None,
            );
        }

        let total = entry.total;
        let len = if entry.inline {
            room.min(total - entry.sent)
        } else {
            rest.map_or(0, |(_, n)| n.min(room))
        };
        let last = entry.sent + len == total;
        let (opcode, hdr) = match entry.op {
            SendOp::Write {
                remote_stag,
                remote_to,
            }
            | SendOp::WriteImmediate {
                remote_stag,
                remote_to,
                ..
            } => (
                Opcode::Write,
                Self::tagged(
                    Opcode::Write,
                    remote_stag.raw(),
                    remote_to.wrapping_add(entry.sent),
                    last,
                ),
            ),
            SendOp::Send {
                solicited,
                invalidate,
            } => {
                let opcode = Opcode::send(solicited, invalidate.is_some());
                let mo = u32::try_from(entry.sent).unwrap_or(u32::MAX);
                let inv = invalidate.map_or(0, Stag::raw);
                (
                    opcode,
                    Self::untagged(opcode, inv, queue::SEND, self.tx_send_msn, mo, last),
                )
            }
            SendOp::SendImmediate { .. } => {
                // A plain Send; the Solicited Event goes on the Immediate Data after it.
                let mo = u32::try_from(entry.sent).unwrap_or(u32::MAX);
                (
                    Opcode::Send,
                    Self::untagged(Opcode::Send, 0, queue::SEND, self.tx_send_msn, mo, last),
                )
            }
            SendOp::Read { .. } | SendOp::Atomic { .. } | SendOp::Immediate { .. } => {
                return self.fail_locally(out)
            }
        };
        // Inline octets go into the segment itself: no region holds them.
        let in_out = !by_ref || entry.inline;
        let payload = Self::push_segment(out, &hdr, if in_out { len as usize } else { 0 });
        let mut reference = None;
        if len > 0 && entry.inline {
            // `sent + len <= total` = the payload's length (the entry's own).
            let from = entry.sent as usize;
            let data = self.inline_data.front().map(InlineData::as_slice);
            match data.and_then(|d| d.get(from..from + len as usize)) {
                Some(octets) => out[payload].copy_from_slice(octets),
                None => {
                    return self.fail_head(entry.seq, start, out, WcStatus::LocalQpOperationError)
                }
            }
        } else if len > 0 {
            let Some((sge, rest_len)) = rest else {
                return self.fail_head(entry.seq, start, out, WcStatus::LocalProtectionError);
            };
            if by_ref {
                // By reference the payload is read, and checked again, when TCP sends it
                // (`TxRing::fill`). Here the rest of the element is checked whole, and again
                // only once the memory table changed, so that a source gone since posting
                // completes the work request in error.
                if entry.sent + len > entry.checked_to {
                    if mem
                        .validate(sge.stag, self.cfg.pd, Access::NONE, sge.to, rest_len)
                        .is_err()
                    {
                        return self.fail_head(
                            entry.seq,
                            start,
                            out,
                            WcStatus::LocalProtectionError,
                        );
                    }
                    if let Some(head) = self.sq.front_mut() {
                        head.checked_to = entry.sent + rest_len;
                        head.checked_in = version;
                    }
                }
                reference = Some(TxPayload {
                    stag: sge.stag,
                    to: sge.to,
                    // At most one ULPDU (<= 65535 octets).
                    len: len as u32,
                    access: Access::NONE,
                });
            } else {
                match mem.validate(sge.stag, self.cfg.pd, Access::NONE, sge.to, len) {
                    Ok((buffer, offset)) => buffer.read_at(offset, &mut out[payload]),
                    Err(_) => {
                        return self.fail_head(
                            entry.seq,
                            start,
                            out,
                            WcStatus::LocalProtectionError,
                        )
                    }
                }
            }
        }
        if let Some(head) = self.sq.front_mut() {
            head.sent += len;
        }
        if last
            && matches!(
                entry.op,
                SendOp::WriteImmediate { .. } | SendOp::SendImmediate { .. }
            )
        {
            // RFC 7306 6: the Immediate Data message follows; the work request completes
            // with it.
            if opcode.is_send() {
                self.tx_send_msn = self.tx_send_msn.wrapping_add(1);
            }
            if let Some(head) = self.sq.front_mut() {
                head.tail = true;
            }
        } else if last {
            // Named before the queue and the MSN move on (a Read never gets here).
            let Some(name) = self.sq_head_name(total) else {
                return self.fail_locally(out);
            };
            self.pop_sq();
            if opcode.is_send() {
                self.tx_send_msn = self.tx_send_msn.wrapping_add(1);
            }
            self.message_handed_out(entry.seq, name);
        }
        (
            TxUlpdu {
                opcode,
                last,
                len: out.len() - start + reference.map_or(0, |r| r.len as usize),
            },
            reference,
        )
    }

    /// The Immediate Data message (RFC 7306 6.2, 6.3) of the send queue's head: alone, or
    /// after its Send or RDMA Write went out. The work request completes with it.
    fn emit_immediate(&mut self, entry: SqHead, out: &mut Vec<u8>) -> (TxUlpdu, Option<TxPayload>) {
        let (solicited, immediate, send_msn, write) = match entry.op {
            SendOp::Immediate {
                solicited,
                immediate,
            } => (solicited, immediate, None, None),
            SendOp::SendImmediate {
                solicited,
                immediate,
            } => (
                solicited,
                immediate,
                Some(self.tx_send_msn.wrapping_sub(1)),
                None,
            ),
            SendOp::WriteImmediate {
                remote_stag,
                remote_to,
                solicited,
                immediate,
            } => (
                solicited,
                immediate,
                None,
                Some((remote_stag.raw(), remote_to, entry.total)),
            ),
            _ => return self.fail_locally(out),
        };
        let opcode = if solicited {
            Opcode::ImmediateDataSe
        } else {
            Opcode::ImmediateData
        };
        let start = out.len();
        let msn = self.tx_send_msn;
        let hdr = Self::untagged(opcode, 0, queue::SEND, msn, 0, true);
        let payload = Self::push_segment(out, &hdr, IMMEDIATE_DATA_LEN);
        ImmediateData(immediate.to_be_bytes()).emit(&mut out[payload]);
        self.pop_sq();
        self.tx_send_msn = msn.wrapping_add(1);
        let name = MessageName::Immediate {
            msn,
            send_msn,
            write,
        };
        self.message_handed_out(entry.seq, name);
        (
            TxUlpdu {
                opcode,
                last: true,
                len: out.len() - start,
            },
            None,
        )
    }

    /// The Atomic Request (RFC 7306 5.2.1) of the send queue's head, on QN 1 with the Read
    /// Requests; its MSN is also its Request Identifier. The work request completes when the
    /// Response arrives (5.4 rule 7).
    fn emit_atomic_request(
        &mut self,
        seq: u64,
        sink: Sge,
        remote_stag: Stag,
        remote_to: u64,
        op: AtomicOp,
        out: &mut Vec<u8>,
    ) -> (TxUlpdu, Option<TxPayload>) {
        let start = out.len();
        let msn = self.tx_read_msn;
        self.tx_read_msn = msn.wrapping_add(1);
        let request = AtomicRequest {
            op,
            request_id: msn,
            stag: remote_stag.raw(),
            to: remote_to,
        };
        let hdr = Self::untagged(Opcode::AtomicRequest, 0, queue::READ_REQUEST, msn, 0, true);
        let payload = Self::push_segment(out, &hdr, ATOMIC_REQUEST_LEN);
        request.emit(&mut out[payload]);
        self.pop_sq();
        self.outstanding_atomics.push_back(OutstandingAtomic {
            seq,
            msn,
            sink_stag: sink.stag,
            sink_to: sink.to,
        });
        (
            TxUlpdu {
                opcode: Opcode::AtomicRequest,
                last: true,
                len: out.len() - start,
            },
            None,
        )
    }

    /// A local failure of the send queue's head (RFC 5040 7.1 rule 1: local catastrophic, no
    /// headers): the Terminate in the segment's place.
    fn fail_locally(&mut self, out: &mut Vec<u8>) -> (TxUlpdu, Option<TxPayload>) {
        let header = TerminateHeader::bare(layer::RDMAP, rdmap_etype::LOCAL_CATASTROPHIC, 0);
        self.terminate_instead(header, out)
    }

    /// Raises the Terminate `header` and emits it in place of the segment that failed.
    fn terminate_instead(
        &mut self,
        header: TerminateHeader,
        out: &mut Vec<u8>,
    ) -> (TxUlpdu, Option<TxPayload>) {
        self.raise_terminate(header);
        (self.emit_terminate(out), None)
    }

    /// How a Terminate names the Send or Write at the head of the send queue, with `len`
    /// octets of it handed out; `None` for a Read.
    fn sq_head_name(&self, len: u64) -> Option<MessageName> {
        let head = self.sq.front()?;
        match head.wr.op {
            SendOp::Send { .. } => Some(MessageName::Send {
                msn: self.tx_send_msn,
            }),
            SendOp::SendImmediate { .. } => Some(MessageName::Send {
                // Once its Send is out, the MSN has moved on to the Immediate Data's.
                msn: if head.tail {
                    self.tx_send_msn.wrapping_sub(1)
                } else {
                    self.tx_send_msn
                },
            }),
            SendOp::Write {
                remote_stag,
                remote_to,
            }
            | SendOp::WriteImmediate {
                remote_stag,
                remote_to,
                ..
            } => Some(MessageName::Write {
                stag: remote_stag.raw(),
                to: remote_to,
                len,
            }),
            SendOp::Read { .. } | SendOp::Atomic { .. } | SendOp::Immediate { .. } => None,
        }
    }

    /// One segment of the oldest pending Read Response. The data source is checked
    /// again for every segment (the owner may have deregistered it since the Request
    /// arrived); a failure is a remote protection Terminate carrying the Request's DDP
    /// header and its Read Request header updated to the progress made (4.8).
    fn emit_read_response_segment<B: RegionBuffer>(
        &mut self,
        max_ulpdu: usize,
        mem: &MemoryTable<B>,
        out: &mut Vec<u8>,
        by_ref: bool,
    ) -> Result<(TxUlpdu, Option<TxPayload>), TerminateHeader> {
        let Some(job) = self.read_responses.front().copied() else {
            return Err(TerminateHeader::bare(
                layer::RDMAP,
                rdmap_etype::LOCAL_CATASTROPHIC,
                0,
            ));
        };
        if let Some(atomic) = job.atomic {
            return self.emit_atomic_response(job, atomic, mem, out);
        }
        let start = out.len();
        let request = job.request;
        let room = max_ulpdu.saturating_sub(TAGGED_HEADER_LEN).max(1);
        let remaining = request.size - job.sent;
        let len = (remaining as usize).min(room);
        let last = len == remaining as usize;
        let hdr = Self::tagged(
            Opcode::ReadResponse,
            request.sink_stag,
            request.sink_to.wrapping_add(u64::from(job.sent)),
            last,
        );
        let payload = Self::push_segment(out, &hdr, if by_ref { 0 } else { len });
        let mut reference = None;
        if len > 0 {
            let src = Stag(request.src_stag);
            let src_to = request.src_to.wrapping_add(u64::from(job.sent));
            match mem.validate(src, self.cfg.pd, Access::REMOTE_READ, src_to, len as u64) {
                Ok((buffer, offset)) => {
                    if by_ref {
                        reference = Some(TxPayload {
                            stag: src,
                            to: src_to,
                            len: len as u32,
                            access: Access::REMOTE_READ,
                        });
                    } else {
                        buffer.read_at(offset, &mut out[payload]);
                    }
                }
                Err(violation) => {
                    out.truncate(start);
                    let error = RdmapError::SourceAccess {
                        stag: src,
                        violation,
                    };
                    let code = TerminateCause::Error(error).code();
                    return Err(Self::terminate_for(
                        code,
                        job.request_segment,
                        Some(request.advanced_by(job.sent)),
                    ));
                }
            }
        }
        let sent = job.sent + len as u32;
        if last {
            self.read_responses.pop_front();
            // The slot was taken from the queue at delivery, so there is room.
            let _ = self.rrq.post(self.request_buffer_len(), job.slot);
        } else if let Some(head) = self.read_responses.front_mut() {
            head.sent = sent;
        }
        Ok((
            TxUlpdu {
                opcode: Opcode::ReadResponse,
                last,
                len: out.len() - start + reference.map_or(0, |r| r.len as usize),
            },
            reference,
        ))
    }

    /// Performs the Atomic Request at the head of the responder's queue and emits its
    /// Response (RFC 7306 5.2.2) on QN 3. Performed now, when its turn comes after every Read
    /// Response before it (7: "Atomic Response Message will not be generated until RDMA Read
    /// Response has been generated"; with a transport that reads their data when it sends
    /// them, once they are acknowledged: [`QueuePair::set_read_responses_unacknowledged`]),
    /// with one CPU atomic operation on the registered memory
    /// ([`RegionBuffer::atomic_at`], 5.3). The target was checked at delivery and is checked
    /// again (it may have been deregistered since); a failure is the Terminate of 8.2.
    fn emit_atomic_response<B: RegionBuffer>(
        &mut self,
        job: ReadResponseJob,
        atomic: AtomicRequest,
        mem: &MemoryTable<B>,
        out: &mut Vec<u8>,
    ) -> Result<(TxUlpdu, Option<TxPayload>), TerminateHeader> {
        let fail = |error: RdmapError| {
            let code = TerminateCause::Error(error).code();
            Self::terminate_for(code, job.request_segment, None)
        };
        let (buffer, offset) = self.atomic_target(mem, &atomic).map_err(fail)?;
        let original = buffer.atomic_at(offset, atomic.op).map_err(|e| {
            fail(match e {
                NotAtomic::Misaligned => RdmapError::AtomicMisaligned { to: atomic.to },
                NotAtomic::Unsupported => RdmapError::LocalCatastrophic,
            })
        })?;
        let start = out.len();
        let msn = self.tx_atomic_msn;
        self.tx_atomic_msn = msn.wrapping_add(1);
        let hdr = Self::untagged(
            Opcode::AtomicResponse,
            0,
            queue::ATOMIC_RESPONSE,
            msn,
            0,
            true,
        );
        let payload = Self::push_segment(out, &hdr, ATOMIC_RESPONSE_LEN);
        AtomicResponse {
            request_id: atomic.request_id,
            original,
        }
        .emit(&mut out[payload]);
        self.read_responses.pop_front();
        // The slot was taken from the queue at delivery, so there is room.
        let _ = self.rrq.post(self.request_buffer_len(), job.slot);
        Ok((
            TxUlpdu {
                opcode: Opcode::AtomicResponse,
                last: true,
                len: out.len() - start,
            },
            None,
        ))
    }

    /// The word an Atomic Request targets, checked as RFC 7306 asks: its region as an RDMA
    /// Read's source with REMOTE_ATOMIC, 8 octets in bounds (5.2), and a 64-bit aligned address
    /// in memory (5.2.1, 8.2).
    fn atomic_target<'m, B: RegionBuffer>(
        &self,
        mem: &'m MemoryTable<B>,
        atomic: &AtomicRequest,
    ) -> Result<(&'m B, usize), RdmapError> {
        let stag = Stag(atomic.stag);
        let (buffer, offset) = mem
            .validate(stag, self.cfg.pd, Access::REMOTE_ATOMIC, atomic.to, 8)
            .map_err(|violation| RdmapError::AtomicAccess { stag, violation })?;
        if !buffer.is_atomic_aligned(offset) {
            return Err(RdmapError::AtomicMisaligned { to: atomic.to });
        }
        Ok((buffer, offset))
    }

    /// The Terminate for `code`, with the headers RFC 5040 Figure 10 asks for.
    fn terminate_for(
        code: Option<TerminateCode>,
        segment: Option<(CopiedDdpHeader, u16)>,
        read_request: Option<ReadRequest>,
    ) -> TerminateHeader {
        let code = code.unwrap_or(TerminateCode::new(
            layer::RDMAP,
            rdmap_etype::LOCAL_CATASTROPHIC,
            0,
        ));
        let mut header = TerminateHeader::bare(code.layer, code.etype, code.code);
        if code.includes_ddp_header() {
            if let Some((ddp_header, segment_len)) = segment {
                header.ddp_header = Some(ddp_header);
                header.segment_len = Some(segment_len);
            }
        }
        if code.includes_read_request() {
            header.read_request = read_request;
        }
        header
    }

    // ------------------------------------------------------------------------------
    // receive
    // ------------------------------------------------------------------------------

    /// Processes one received DDP segment, its header (14 octets tagged, 18 untagged, RFC
    /// 5041 4.2, 4.3) and its payload (RDMAP headers included) apart, as a framing that
    /// carries them apart hands them up (IFT), in stream order: places data into `mem` and
    /// generates completions.
    ///
    /// On a protocol error (every check of RFC 5040 7.2 and RFC 5041 7.1) it queues the
    /// Terminate the RFCs name, enters [`QpState::Terminate`] and returns the error.
    /// In Closing, Terminate and Error it silently drops the segment (RFC 5041 7.1: "DDP
    /// MUST silently drop any subsequent incoming DDP Segments"); in Idle it refuses it
    /// with [`RdmapError::InvalidState`]. Nothing is ever written outside a registered
    /// region that passed its checks, and no input panics.
    pub fn on_segment<B: RegionBuffer>(
        &mut self,
        ddp_header: &[u8],
        payload: &[u8],
        mem: &MemoryTable<B>,
    ) -> Result<(), RdmapError> {
        self.process(ddp_header, Payload::Bytes(payload), mem)
    }

    /// Receives one ULPDU (DDP header, then payload) in stream order: what
    /// [`QueuePair::on_segment`] does for a framing that delivers the two contiguous (MPA).
    pub fn on_ulpdu<B: RegionBuffer>(
        &mut self,
        ulpdu: &[u8],
        mem: &MemoryTable<B>,
    ) -> Result<(), RdmapError> {
        let Some((header, payload)) = split_ulpdu(ulpdu) else {
            // Too short for any DDP header: `receive` reports the right error.
            return self.process(ulpdu, Payload::Bytes(&[]), mem);
        };
        self.process(header, Payload::Bytes(payload), mem)
    }

    /// Places the payload of a ULPDU that arrived ahead of the in-order point (RFC 5041
    /// 5.3: placement may happen in any order; delivery happens in order), without any
    /// other effect. Returns what was placed ([`PlacedEarly`]) when the payload is now in its
    /// final place (but for a held last octet); the caller keeps only the ULPDU's header and
    /// that, and calls [`on_placed_ulpdu`](Self::on_placed_ulpdu) when the stream reaches it.
    /// Returns `None` when it cannot be placed early (Read
    /// Requests and Terminates are acted on only in order, zero-length or malformed
    /// segments, a segment that fails a check, a Send beyond the posted receives): the
    /// caller keeps the whole ULPDU and hands it to [`on_ulpdu`](Self::on_ulpdu) in order,
    /// which reports any error at its proper place in the stream.
    ///
    /// Early placement only writes where the in-order check will also allow: a region of
    /// this PD with the needed access, the sink of an outstanding Read, a posted receive.
    pub fn place_early<B: RegionBuffer>(
        &self,
        ulpdu: &[u8],
        mem: &MemoryTable<B>,
    ) -> Option<PlacedEarly> {
        let (header, payload) = split_ulpdu(ulpdu)?;
        self.place_segment_early(header, payload, mem)
    }

    /// [`place_early`](Self::place_early) of a DDP segment whose header and payload are
    /// apart (a framing that puts a CRC between them, as IFT's header CRC): `ddp_header` is
    /// exactly the DDP header (14 or 18 octets).
    pub fn place_segment_early<B: RegionBuffer>(
        &self,
        ddp_header: &[u8],
        payload: &[u8],
        mem: &MemoryTable<B>,
    ) -> Option<PlacedEarly> {
        if self.state != QpState::Rts {
            return None;
        }
        let (header, rest) = DdpHeader::parse(ddp_header).ok()?;
        if !rest.is_empty() || payload.is_empty() {
            return None;
        }
        let len = payload.len() as u64;
        match header {
            DdpHeader::Tagged(hdr) => {
                let control = RdmapControl::parse(hdr.rsvd_ulp).ok()?;
                let stag = Stag(hdr.stag);
                let access = match control.opcode {
                    Opcode::Write => Access::REMOTE_WRITE,
                    Opcode::ReadResponse => {
                        let end = hdr.to.checked_add(len)?;
                        let inside_a_sink = self.outstanding_reads.iter().any(|r| {
                            r.sink_stag == hdr.stag
                                && hdr.to >= r.sink_to
                                && r.sink_to.checked_add(u64::from(r.size)) >= Some(end)
                        });
                        if !inside_a_sink {
                            return None;
                        }
                        Access::LOCAL_WRITE
                    }
                    _ => return None,
                };
                let (buffer, offset) = mem.validate(stag, self.cfg.pd, access, hdr.to, len).ok()?;
                // The message's last octet waits for the in-order pass (`held_last`): it shows
                // only after every octet before it, however the segments came.
                let (body, held_last) = match payload.split_last() {
                    Some((last, body)) if hdr.last => (body, Some(*last)),
                    _ => (payload, None),
                };
                if !body.is_empty() {
                    buffer.write_at(offset, body);
                }
                Some(PlacedEarly { held_last })
            }
            DdpHeader::Untagged(hdr) => {
                if hdr.qn != queue::SEND {
                    return None;
                }
                match RdmapControl::parse(hdr.rsvd_ulp[0]) {
                    // Sends only: Immediate Data (QN 0 too) places nothing, it is processed in
                    // order; with the extensions off it is refused there.
                    Ok(c) if c.opcode.is_send() => {}
                    _ => return None,
                }
                let placement = self.rq.locate(&hdr, payload.len()).ok()?;
                let RecvSlot::User(wr) = &placement.cookie else {
                    return None;
                };
                let offset = u64::from(placement.offset);
                self.scatter(&wr.sg_list, offset, len, Some(payload), mem)
                    .then_some(PlacedEarly { held_last: None })
            }
        }
    }

    /// In-order processing of a ULPDU whose payload [`place_early`](Self::place_early)
    /// already placed: `header` is the ULPDU's DDP header (its first 14 or 18 octets) and
    /// `payload_len` the length of the payload that followed it. Does everything
    /// [`on_ulpdu`](Self::on_ulpdu) does except copying the payload again: checks,
    /// placement records, delivery, completions, Terminate on error; and writes the last
    /// octet `placed` held back, once the checks pass.
    pub fn on_placed_ulpdu<B: RegionBuffer>(
        &mut self,
        header: &[u8],
        payload_len: usize,
        placed: PlacedEarly,
        mem: &MemoryTable<B>,
    ) -> Result<(), RdmapError> {
        let payload = Payload::Placed {
            len: payload_len,
            held_last: placed.held_last,
        };
        self.process(header, payload, mem)
    }

    fn process<B: RegionBuffer>(
        &mut self,
        header: &[u8],
        payload: Payload<'_>,
        mem: &MemoryTable<B>,
    ) -> Result<(), RdmapError> {
        match self.state {
            QpState::Rts => {}
            QpState::Idle => return Err(RdmapError::InvalidState { state: self.state }),
            QpState::Closing | QpState::Terminate | QpState::Error => return Ok(()),
        }
        let result = match self.receive(header, payload, mem) {
            Ok(()) => Ok(()),
            Err(fault) => {
                let code = TerminateCause::Error(fault.error.clone()).code();
                let segment = fault.segment.or_else(|| {
                    CopiedDdpHeader::from_segment(header).map(|h| {
                        let len = u16::try_from(payload.len()).unwrap_or(u16::MAX);
                        (h, len)
                    })
                });
                let header = Self::terminate_for(code, segment, fault.read_request);
                self.raise_terminate(header);
                Err(fault.error)
            }
        };
        // After the segment's own Terminate, if it raised one (the first one stands).
        if std::mem::take(&mut self.refused_recv_due) {
            self.fail_for_a_refused_recv();
        }
        result
    }

    fn receive<B: RegionBuffer>(
        &mut self,
        ddp_header: &[u8],
        payload: Payload<'_>,
        mem: &MemoryTable<B>,
    ) -> Result<(), Fault> {
        let (header, _) = DdpHeader::parse(ddp_header)?;
        match header {
            DdpHeader::Tagged(hdr) => {
                let opcode = RdmapControl::parse(hdr.rsvd_ulp)?.opcode;
                match opcode {
                    Opcode::Write => self.receive_write(&hdr, payload, mem),
                    Opcode::ReadResponse => self.receive_read_response(&hdr, payload, mem),
                    other => Err(RdmapError::UnexpectedOpcode {
                        opcode: other as u8,
                    }
                    .into()),
                }
            }
            DdpHeader::Untagged(hdr) => {
                // DDP validates the QN before RDMAP looks at the opcode. QN 3 exists only
                // with the extensions (RFC 7306 10.2).
                let top = if self.cfg.extensions {
                    queue::ATOMIC_RESPONSE
                } else {
                    queue::TERMINATE
                };
                if hdr.qn > top {
                    return Err(DdpError::InvalidQn { qn: hdr.qn }.into());
                }
                let opcode = RdmapControl::parse(hdr.rsvd_ulp[0])?.opcode;
                // Without the extensions their opcodes are RFC 5040's reserved ones.
                if (opcode.is_extension() && !self.cfg.extensions)
                    || opcode.queue_number() != Some(hdr.qn)
                {
                    return Err(RdmapError::UnexpectedOpcode {
                        opcode: opcode as u8,
                    }
                    .into());
                }
                match hdr.qn {
                    queue::SEND => self.receive_send(opcode, &hdr, ddp_header, payload, mem),
                    queue::READ_REQUEST => {
                        let bytes = payload.bytes().ok_or(RdmapError::LocalCatastrophic)?;
                        let segment = CopiedDdpHeader::from_segment(ddp_header)
                            .map(|h| (h, u16::try_from(bytes.len()).unwrap_or(u16::MAX)));
                        self.receive_read_request(&hdr, opcode, bytes, segment, mem)
                    }
                    queue::TERMINATE => {
                        let bytes = payload.bytes().ok_or(RdmapError::LocalCatastrophic)?;
                        self.receive_terminate(&hdr, bytes)
                    }
                    _ => {
                        let bytes = payload.bytes().ok_or(RdmapError::LocalCatastrophic)?;
                        self.receive_atomic_response(&hdr, bytes, mem)
                    }
                }
            }
        }
    }

    /// RDMA Write (5.1): placed into a region with REMOTE_WRITE of this PD. A
    /// zero-length segment is not checked (RFC 5041 7.1), so siw's RTR Write with STag 1
    /// passes.
    fn receive_write<B: RegionBuffer>(
        &mut self,
        hdr: &TaggedHeader,
        payload: Payload<'_>,
        mem: &MemoryTable<B>,
    ) -> Result<(), Fault> {
        if payload.is_empty() {
            return Ok(());
        }
        let stag = Stag(hdr.stag);
        let (buffer, offset) = mem
            .validate(
                stag,
                self.cfg.pd,
                Access::REMOTE_WRITE,
                hdr.to,
                payload.len() as u64,
            )
            .map_err(|violation| RdmapError::SinkAccess { stag, violation })?;
        payload.write_rest(buffer, offset);
        Ok(())
    }

    /// RDMA Read Response (5.2.2): must belong to the oldest outstanding Read and fall
    /// inside its sink (5.2.2 allows the sink to check STag, TO and length); then the
    /// sink region is checked like any tagged buffer (LOCAL_WRITE). Its segments, delivered
    /// in order (RFC 5041 5.1: the LLP keeps the stream's order; segments placed early are
    /// checked here too, when delivered), must follow one another from the sink's start
    /// with neither gap nor overlap, as siw checks, and the Last must end the requested
    /// range: it completes the Read only once every octet of the range has come. A segment
    /// out of its place is a base-or-bounds violation of the sink (RFC 5041 7.2; the
    /// Terminate siw sends for it).
    fn receive_read_response<B: RegionBuffer>(
        &mut self,
        hdr: &TaggedHeader,
        payload: Payload<'_>,
        mem: &MemoryTable<B>,
    ) -> Result<(), Fault> {
        let Some(read) = self.outstanding_reads.front().copied() else {
            return Err(RdmapError::UnexpectedOpcode {
                opcode: Opcode::ReadResponse as u8,
            }
            .into());
        };
        let stag = Stag(hdr.stag);
        let sink_error = |violation| RdmapError::SinkAccess { stag, violation };
        let len = payload.len() as u64;
        let sink_end = read.sink_to.checked_add(u64::from(read.size));
        // Where the next segment must start: right after those delivered before it.
        let next = read.sink_to.checked_add(u64::from(read.received));
        if !payload.is_empty() {
            if hdr.stag != read.sink_stag {
                return Err(self.read_sink_failure(read, sink_error(AccessViolation::InvalidStag)));
            }
            let Some(end) = hdr.to.checked_add(len) else {
                return Err(self.read_sink_failure(read, sink_error(AccessViolation::ToWrap)));
            };
            if Some(hdr.to) != next || Some(end) > sink_end || (hdr.last && Some(end) != sink_end) {
                return Err(self.read_sink_failure(read, sink_error(AccessViolation::BaseBounds)));
            }
            match mem.validate(stag, self.cfg.pd, Access::LOCAL_WRITE, hdr.to, len) {
                Ok((buffer, offset)) => payload.write_rest(buffer, offset),
                Err(violation) => return Err(self.read_sink_failure(read, sink_error(violation))),
            }
        } else if hdr.last
            && (read.received != read.size || (read.size != 0 && Some(hdr.to) != sink_end))
        {
            // A zero-length Last segment must still end the requested range, all of it come.
            return Err(self.read_sink_failure(read, sink_error(AccessViolation::BaseBounds)));
        }
        if hdr.last {
            self.outstanding_reads.pop_front();
            if let Some(seq) = read.seq {
                self.finish_slot(seq, WcStatus::Success);
            }
        } else if let Some(front) = self.outstanding_reads.front_mut() {
            // Within the sink (checked above): at most its size.
            front.received = front.received.saturating_add(len as u32);
        }
        Ok(())
    }

    /// A Read Response that cannot be placed fails its Read.
    fn read_sink_failure(&mut self, read: OutstandingRead, error: RdmapError) -> Fault {
        if let Some(seq) = read.seq {
            self.finish_slot(seq, WcStatus::LocalProtectionError);
        }
        error.into()
    }

    /// Send, Send with SE, Send with (SE and) Invalidate (5.3) on QN 0; with the extensions,
    /// Immediate Data (with SE) too (RFC 7306 6.3): it must carry exactly 8 octets in one
    /// segment, consumes a receive buffer and places nothing in it; its receive completes
    /// with the value ([`WcOpcode::RecvImmediate`]).
    fn receive_send<B: RegionBuffer>(
        &mut self,
        opcode: Opcode,
        hdr: &UntaggedHeader,
        ddp_header: &[u8],
        payload: Payload<'_>,
        mem: &MemoryTable<B>,
    ) -> Result<(), Fault> {
        self.take_from_srq(hdr.msn);
        if self.rtr_sink_pending && !matches!(opcode, Opcode::Send | Opcode::SendSe) {
            self.refuse_in_rtr_sink(opcode, hdr)?;
        }
        let mut immediate = 0;
        if opcode.is_immediate() {
            // DDP's checks first (RFC 7306 8.2): the MSN takes a receive, nothing is placed.
            self.rq.place(hdr, 0)?;
            let bytes = payload.bytes().ok_or(RdmapError::LocalCatastrophic)?;
            let len = bytes.len();
            if hdr.mo != 0 || !hdr.last {
                return Err(RdmapError::BadImmediateLength { len }.into());
            }
            immediate = u64::from_be_bytes(ImmediateData::parse(bytes)?.0);
        } else {
            self.place_send(hdr, payload, mem)?;
        }
        // A repeated Last segment (DDP allows repeated placement) is recorded once.
        if hdr.last && !self.inbound_sends.iter().any(|s| s.msn == hdr.msn) {
            let segment = if opcode.carries_invalidate_stag() {
                CopiedDdpHeader::from_segment(ddp_header)
                    .map(|h| (h, u16::try_from(payload.len()).unwrap_or(u16::MAX)))
            } else {
                None
            };
            self.inbound_sends.push_back(InboundSend {
                msn: hdr.msn,
                opcode,
                invalidate: invalidate_stag(&hdr.rsvd_ulp),
                immediate,
                segment,
            });
        }
        self.deliver_sends(mem)
    }

    /// The RTR sink of [`QueuePair::expect_rtr`] takes the peer's zero-length Send (RFC 6581
    /// 9.2 names a zero-length Send; with or without Solicited Event). A message of another
    /// QN 0 opcode in its place is not expected now (RFC 5040 7.2 rule 2): a Send with
    /// Invalidate would invalidate an STag with no receive to report it on, an Immediate
    /// Data message would lose its data.
    fn refuse_in_rtr_sink(&self, opcode: Opcode, hdr: &UntaggedHeader) -> Result<(), RdmapError> {
        match self.rq.locate(hdr, 0) {
            Ok(placement) if matches!(placement.cookie, RecvSlot::RtrSink) => {
                Err(RdmapError::UnexpectedOpcode {
                    opcode: opcode as u8,
                })
            }
            _ => Ok(()),
        }
    }

    /// Places a Send segment's payload into its receive buffer.
    fn place_send<B: RegionBuffer>(
        &mut self,
        hdr: &UntaggedHeader,
        payload: Payload<'_>,
        mem: &MemoryTable<B>,
    ) -> Result<(), Fault> {
        let placement = match self.rq.place(hdr, payload.len()) {
            Ok(p) => p,
            Err(e) => {
                // Both come after the MSN check: the message has a receive, too short for it
                // (an MO beyond the receive is a segment past its end). The Terminate names
                // the DDP error; the receive says what it was to the application.
                if matches!(e, DdpError::MessageTooLong | DdpError::InvalidMo) {
                    self.failed_recv = Some((hdr.msn, WcStatus::LocalLengthError));
                }
                return Err(e.into());
            }
        };
        if !payload.is_empty() {
            let RecvSlot::User(wr) = &placement.cookie else {
                // A zero-length buffer cannot take payload: `place` reported it already.
                return Err(RdmapError::LocalCatastrophic.into());
            };
            let offset = u64::from(placement.offset);
            let len = payload.len() as u64;
            if !self.scatter(&wr.sg_list, offset, len, payload.bytes(), mem) {
                // Its memory was deregistered or invalidated since it was posted.
                self.failed_recv = Some((hdr.msn, WcStatus::LocalProtectionError));
                return Err(RdmapError::LocalCatastrophic.into());
            }
        }
        Ok(())
    }

    /// Completes the receives of the QN 0 messages DDP now delivers, in MSN order.
    fn deliver_sends<B: RegionBuffer>(&mut self, mem: &MemoryTable<B>) -> Result<(), Fault> {
        // A refused receive that fails the queue pair stops the deliveries: the receives after
        // it are flushed, not given the Sends meant for it or after it.
        while !self.refused_recv_due {
            let Some(delivered) = self.rq.poll_delivery() else {
                break;
            };
            let info = self
                .inbound_sends
                .iter()
                .find(|s| s.msn == delivered.msn)
                .copied();
            self.inbound_sends.retain(|s| s.msn != delivered.msn);
            let opcode = info.map_or(Opcode::Send, |i| i.opcode);
            let wr = match delivered.cookie {
                RecvSlot::User(wr) => wr,
                RecvSlot::RtrSink => {
                    self.rtr_sink_pending = false;
                    continue;
                }
            };
            let mut completion = WorkCompletion {
                wr_id: wr.wr_id,
                opcode: WcOpcode::Recv,
                status: WcStatus::Success,
                byte_len: delivered.len,
                invalidated: None,
                solicited: opcode.is_solicited(),
                immediate: None,
            };
            if opcode.is_immediate() {
                completion.opcode = WcOpcode::RecvImmediate;
                completion.immediate = info.map(|i| i.immediate);
            }
            if opcode.carries_invalidate_stag() {
                let stag = Stag(info.map_or(0, |i| i.invalidate));
                if let Err(error) = mem.invalidate_remote(stag, self.cfg.pd) {
                    completion.status = WcStatus::RemoteInvalidRequestError;
                    completion.byte_len = 0;
                    self.complete_recv(completion);
                    return Err(Fault {
                        error,
                        read_request: None,
                        segment: info.and_then(|i| i.segment),
                    });
                }
                completion.invalidated = Some(stag);
            }
            self.complete_recv(completion);
        }
        Ok(())
    }

    /// RDMA Read Request (5.2.1) on QN 1: staged until delivered (rule 12), then the
    /// source is checked (7.2 rule 4: STag valid, same PD, REMOTE_READ, no wrap, in
    /// bounds; not for a zero-length Read) and the Response queued. With the extensions, an
    /// Atomic Request on the same queue (RFC 7306 5.2.1): checked when delivered (8.2:
    /// 64-bit aligned; its region as a Read's source, with REMOTE_ATOMIC, 8 octets), queued
    /// behind the Read Responses before it, and performed when its Response is generated.
    fn receive_read_request<B: RegionBuffer>(
        &mut self,
        hdr: &UntaggedHeader,
        opcode: Opcode,
        payload: &[u8],
        request_segment: Option<(CopiedDdpHeader, u16)>,
        mem: &MemoryTable<B>,
    ) -> Result<(), Fault> {
        let beyond_window = hdr.msn == self.rrq.next_msn().wrapping_add(self.rrq.posted() as u32);
        let placement = match self.rrq.place(hdr, payload.len()) {
            Ok(p) => p,
            Err(DdpError::MsnNoBuffer { .. } | DdpError::MsnRange { .. }) if beyond_window => {
                return Err(RdmapError::IrdExceeded { ird: self.ird }.into());
            }
            Err(e) => return Err(e.into()),
        };
        let start = placement.offset as usize;
        let staged = self
            .read_staging
            .get_mut(usize::from(placement.cookie))
            .ok_or(RdmapError::LocalCatastrophic)?;
        // Every segment of a message carries the same opcode (RFC 5041 4.3: RsvdULP is the
        // ULP's for the whole message; RFC 7306 8.2: the opcode must be valid): the first to
        // arrive, whatever its MO, sets it, and one that differs (a repeated segment included)
        // is an unexpected opcode rather than turning a Read Request into an Atomic one.
        let atomic = opcode == Opcode::AtomicRequest;
        if *staged.atomic.get_or_insert(atomic) != atomic {
            return Err(RdmapError::UnexpectedOpcode {
                opcode: opcode as u8,
            }
            .into());
        }
        staged.segment = request_segment;
        staged
            .bytes
            .get_mut(start..start + payload.len())
            .ok_or(RdmapError::LocalCatastrophic)?
            .copy_from_slice(payload);
        while let Some(delivered) = self.rrq.poll_delivery() {
            let slot = delivered.cookie;
            let staged = self
                .read_staging
                .get_mut(usize::from(slot))
                .ok_or(RdmapError::LocalCatastrophic)?;
            // The buffer's next message sets its own kind.
            let is_atomic = staged.atomic.take() == Some(true);
            let staged = *staged;
            // Errors about this request name the segment that carried it.
            let in_error = |error: RdmapError| Fault {
                error,
                read_request: None,
                segment: staged.segment,
            };
            if is_atomic {
                if delivered.len as usize != ATOMIC_REQUEST_LEN {
                    return Err(in_error(RdmapError::MalformedAtomicRequest {
                        len: delivered.len,
                    }));
                }
                let atomic = AtomicRequest::parse(&staged.bytes).map_err(in_error)?;
                self.atomic_target(mem, &atomic).map_err(in_error)?;
                self.read_responses.push_back(ReadResponseJob {
                    request: ReadRequest::default(),
                    atomic: Some(atomic),
                    request_segment: staged.segment,
                    slot,
                    sent: 0,
                });
                continue;
            }
            if delivered.len as usize != READ_REQUEST_LEN {
                return Err(in_error(RdmapError::MalformedReadRequest {
                    len: delivered.len,
                }));
            }
            let request = ReadRequest::parse(&staged.bytes).map_err(in_error)?;
            if request.size > 0 {
                let src = Stag(request.src_stag);
                mem.validate(
                    src,
                    self.cfg.pd,
                    Access::REMOTE_READ,
                    request.src_to,
                    u64::from(request.size),
                )
                .map_err(|violation| Fault {
                    error: RdmapError::SourceAccess {
                        stag: src,
                        violation,
                    },
                    read_request: Some(request),
                    segment: staged.segment,
                })?;
            }
            self.read_responses.push_back(ReadResponseJob {
                request,
                atomic: None,
                request_segment: staged.segment,
                slot,
                sent: 0,
            });
        }
        Ok(())
    }

    /// Atomic Response (RFC 7306 5.2.2) on QN 3: must answer the oldest outstanding Atomic
    /// Request (responses come in request order, rule 8; rule 7: anything else is an
    /// error); the original value goes into the request's sink in this host's byte order,
    /// and the work request completes (5.4 rule 7).
    fn receive_atomic_response<B: RegionBuffer>(
        &mut self,
        hdr: &UntaggedHeader,
        payload: &[u8],
        mem: &MemoryTable<B>,
    ) -> Result<(), Fault> {
        let placement = self.arq.place(hdr, payload.len())?;
        let start = placement.offset as usize;
        self.atomic_staging
            .get_mut(usize::from(placement.cookie))
            .and_then(|s| s.get_mut(start..start + payload.len()))
            .ok_or(RdmapError::LocalCatastrophic)?
            .copy_from_slice(payload);
        while let Some(delivered) = self.arq.poll_delivery() {
            let slot = delivered.cookie;
            let bytes = *self
                .atomic_staging
                .get(usize::from(slot))
                .ok_or(RdmapError::LocalCatastrophic)?;
            let response =
                AtomicResponse::parse(bytes.get(..delivered.len as usize).unwrap_or(&[]))?;
            let expected = self.outstanding_atomics.front().copied();
            let Some(atomic) = expected.filter(|a| a.msn == response.request_id) else {
                return Err(RdmapError::UnexpectedAtomicResponse {
                    request_id: response.request_id,
                }
                .into());
            };
            self.outstanding_atomics.pop_front();
            // The slot was taken from the queue at delivery, so there is room.
            let _ = self.arq.post(ATOMIC_RESPONSE_LEN as u32, slot);
            match mem.validate(
                atomic.sink_stag,
                self.cfg.pd,
                Access::LOCAL_WRITE,
                atomic.sink_to,
                8,
            ) {
                Ok((buffer, offset)) => {
                    buffer.write_at(offset, &response.original.to_ne_bytes());
                    self.finish_slot(atomic.seq, WcStatus::Success);
                }
                Err(violation) => {
                    // Deregistered since it was posted: the Terminate carries the Response's
                    // DDP header (RFC 7306 8.1 rule 2).
                    self.finish_slot(atomic.seq, WcStatus::LocalProtectionError);
                    return Err(RdmapError::AtomicResponseSink {
                        stag: atomic.sink_stag,
                        violation,
                    }
                    .into());
                }
            }
        }
        Ok(())
    }

    /// Terminate (5.4) on QN 2: recorded for [`QueuePair::remote_terminate`]; the work
    /// request it names completes with the remote error, everything else is flushed, and
    /// the QP enters Error (see `apply_remote_terminate`). A Terminate whose header is
    /// malformed still terminates; only its control word is kept.
    fn receive_terminate(&mut self, hdr: &UntaggedHeader, payload: &[u8]) -> Result<(), Fault> {
        let placement = self.tq.place(hdr, payload.len())?;
        let start = placement.offset as usize;
        let staged = self
            .terminate_staging
            .get_mut(start..start + payload.len())
            .ok_or(RdmapError::LocalCatastrophic)?;
        staged.copy_from_slice(payload);
        let Some(delivered) = self.tq.poll_delivery() else {
            return Ok(());
        };
        let bytes = self
            .terminate_staging
            .get(..delivered.len as usize)
            .ok_or(RdmapError::LocalCatastrophic)?;
        let info = TerminateHeader::parse(bytes).unwrap_or_else(|_| {
            let view = TerminateView::new_unchecked(bytes);
            TerminateHeader::bare(view.layer(), view.etype(), view.code())
        });
        self.apply_remote_terminate(info);
        Ok(())
    }

    /// What a peer's Terminate does to our work requests (RFC 5040 5.4, 4.8).
    ///
    /// The work request its copied DDP header names, if still outstanding, completes with
    /// the remote error of the Terminate's layer and type (RDMAP remote protection or DDP
    /// tagged buffer: [`WcStatus::RemoteAccessError`]; RDMAP remote operation or DDP
    /// untagged buffer: [`WcStatus::RemoteOperationError`]):
    /// - untagged QN 1: the RDMA Read whose Request carried that MSN;
    /// - untagged QN 0: the Send with that MSN;
    /// - tagged, RDMA Write opcode: the oldest Write to that STag whose segments handed out
    ///   so far cover that TO.
    ///
    /// A Send or Write is outstanding while it is partly handed out or, under
    /// [`TxCompletion::Acknowledged`], until its acknowledgement completed it. Under
    /// [`TxCompletion::HandOff`] (the socket transport) a Send or Write handed out whole has
    /// completed already, before the peer could object: a Terminate naming it names nothing
    /// outstanding.
    ///
    /// Sends and Writes handed out before the named work request complete
    /// [`WcStatus::Success`]: the peer processes its stream in order (RFC 5041 5), so it
    /// took them before refusing the named one. When nothing is named, those already
    /// reported acknowledged ([`QueuePair::message_acknowledged_deferred`]) complete
    /// successfully. A Terminate without a copied header blames the oldest started work
    /// request (a Read whose Request went out, a Send or Write partly handed out or not yet
    /// acknowledged). Everything else is flushed and the QP enters Error.
    fn apply_remote_terminate(&mut self, info: TerminateInfo) {
        self.remote_terminate = Some(info);
        let status = match (info.layer, info.etype) {
            (layer::RDMAP, rdmap_etype::REMOTE_PROTECTION) | (layer::DDP, 0x1) => {
                Some(WcStatus::RemoteAccessError)
            }
            (layer::RDMAP, rdmap_etype::REMOTE_OPERATION) | (layer::DDP, 0x2) => {
                Some(WcStatus::RemoteOperationError)
            }
            _ => None,
        };
        let copied = info
            .ddp_header
            .and_then(|h| DdpHeader::parse(h.as_bytes()).ok().map(|(h, _)| h));
        let named = copied.and_then(|h| self.named_by(&h));
        // What the peer took before it refused: handed out before the named request, or
        // (nothing named) reported acknowledged.
        let accepted = match named {
            Some(seq) => self.awaiting_ack.iter().filter(|a| a.seq < seq).count(),
            None => self.acked_pending,
        };
        for _ in 0..accepted {
            if let Some(done) = self.awaiting_ack.pop_front() {
                self.finish_slot(done.seq, WcStatus::Success);
            }
        }
        self.acked_pending = 0;
        let blamed = if copied.is_some() {
            named
        } else {
            self.outstanding_reads
                .iter()
                .filter_map(|r| r.seq)
                .chain(self.outstanding_atomics.iter().map(|a| a.seq))
                .chain(self.awaiting_ack.front().map(|a| a.seq))
                .chain(self.sq.front().filter(|e| e.sent > 0).map(|e| e.seq))
                .min()
        };
        if let (Some(seq), Some(status)) = (blamed, status) {
            self.finish_slot(seq, status);
        }
        // Our own Terminate cannot be waiting to go out: raising one leaves RTS, and a
        // peer's Terminate is processed only in RTS.
        self.enter_error();
    }

    /// The completion slot of the outstanding work request a Terminate's copied DDP header
    /// names (see [`QueuePair::apply_remote_terminate`]).
    fn named_by(&self, hdr: &DdpHeader) -> Option<u64> {
        if let DdpHeader::Untagged(u) = hdr {
            if u.qn == queue::READ_REQUEST {
                let read = self.outstanding_reads.iter().find(|r| r.msn == u.msn);
                let atomic = self.outstanding_atomics.iter().find(|a| a.msn == u.msn);
                return read.and_then(|r| r.seq).or(atomic.map(|a| a.seq));
            }
        }
        let head = self
            .sq
            .front()
            .filter(|e| e.sent > 0)
            .and_then(|e| Some((e.seq, self.sq_head_name(e.sent)?)));
        self.awaiting_ack
            .iter()
            .map(|a| (a.seq, a.name))
            .chain(head)
            .find(|(_, name)| name.named_by(hdr))
            .map(|(seq, _)| seq)
    }
}

/// What [`QueuePair::place_early`] placed of a segment ahead of the in-order point, for
/// [`QueuePair::on_placed_ulpdu`] when the stream reaches it.
///
/// A tagged segment that ends its message (DDP's Last flag, RFC 5041 4.2) is placed but
/// for its last octet, which the in-order pass writes: a message's last octet thus shows
/// only after all the rest of it (the segments before it are placed by then, early or in
/// order), as an application polling it expects (perftest's latency tests, and NICs, which
/// place in order; RFC 5041 5.3 leaves placement order open, so this is a choice, not a
/// duty). Overlapping Writes in flight are another matter (RFC 5040 5.5 rule 3: the last to
/// land there need not be the last sent): a held octet, written in order, may land after a
/// later Write's early placement over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedEarly {
    /// The message's last octet, not yet written.
    pub held_last: Option<u8>,
}

/// The payload of a ULPDU being processed in order: its bytes, or only its length (and a
/// held last octet) when [`QueuePair::place_early`] already put them in place.
#[derive(Debug, Clone, Copy)]
enum Payload<'a> {
    Bytes(&'a [u8]),
    Placed { len: usize, held_last: Option<u8> },
}

impl<'a> Payload<'a> {
    fn len(&self) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::Placed { len, .. } => *len,
        }
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes still to copy; `None` when they are already placed.
    fn bytes(&self) -> Option<&'a [u8]> {
        match self {
            Payload::Bytes(b) => Some(b),
            Payload::Placed { .. } => None,
        }
    }
    /// Writes what is not in place yet of a tagged segment's payload whose checks passed,
    /// at `offset` of `buffer`: all of it, the held last octet, or nothing.
    fn write_rest<B: RegionBuffer>(&self, buffer: &B, offset: usize) {
        match *self {
            Payload::Bytes(bytes) => buffer.write_at(offset, bytes),
            Payload::Placed {
                len,
                held_last: Some(last),
            } if len > 0 => buffer.write_at(offset + (len - 1), &[last]),
            Payload::Placed { .. } => {}
        }
    }
}

/// Splits a ULPDU into its DDP header and payload by the T bit (RFC 5041 4.1); `None` when
/// it is shorter than the header its T bit names.
fn split_ulpdu(ulpdu: &[u8]) -> Option<(&[u8], &[u8])> {
    let header_len = ddp::wire::DdpSegment::new_unchecked(ulpdu).header_len();
    (ulpdu.len() >= header_len).then(|| ulpdu.split_at(header_len))
}
