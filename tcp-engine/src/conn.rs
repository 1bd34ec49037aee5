//! One TCP connection: the RFC 9293 state machine with RFC 5961 checks,
//! RFC 7323 window scaling/timestamps/PAWS, RFC 2018 SACK, RFC 8985 RACK-TLP
//! (SACK peers) and RFC 5681/6582/3042 fast retransmit, NewReno recovery and
//! limited transmit (non-SACK peers), RFC 6298 retransmission timer, delayed
//! ACK, persist timer and keepalive. Sans-IO: segments and time go in,
//! packets and deadlines come out.

use std::collections::VecDeque;

use crate::cc::CongestionControl;
use crate::config::{Config, RxMode, TxMode};
use crate::isn::IsnGenerator;
use crate::ranges::{Range, RangeSet};
use crate::rdma_rx::{RdmaPlaced, RdmaPostError, RdmaReceive};
use crate::rdma_tx::{RdmaSections, RdmaSend};
use crate::rtt::RttEstimator;
use crate::seq::{seq_diff, seq_ge, seq_gt, seq_le, seq_lt, SeqAnchor};
use crate::syncookie;
use crate::time::{earliest, Instant};
use crate::wire::{
    Checksum, DataHeader, FourTuple, SackBlock, SegmentRepr, TcpFlags, TcpOptions, IPV4_HEADER_LEN,
    TCP_HEADER_LEN, TIMESTAMP_OPTION_SPACE,
};
use core::time::Duration;

/// RFC 9293 3.3.2 connection states (LISTEN lives in [`crate::table`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No connection.
    Closed,
    /// SYN sent, waiting for SYN-ACK.
    SynSent,
    /// SYN received and SYN-ACK sent.
    SynReceived,
    /// Open.
    Established,
    /// We closed; our FIN not yet acknowledged.
    FinWait1,
    /// Our FIN acknowledged; waiting for the peer's.
    FinWait2,
    /// Peer closed; we may still send.
    CloseWait,
    /// Both closed simultaneously; waiting for the ACK of our FIN.
    Closing,
    /// Peer closed first, then we did; waiting for the ACK of our FIN.
    LastAck,
    /// Waiting 2 MSL before forgetting the connection.
    TimeWait,
}

impl State {
    fn synchronized(self) -> bool {
        !matches!(self, State::Closed | State::SynSent | State::SynReceived)
    }

    /// Data the application queued, and the FIN behind it, still go out (RFC 9293 3.10.4:
    /// a CLOSE queues the FIN after the preceding SENDs). CLOSING included: a peer's FIN that
    /// arrives while ours still waits behind queued data moves FIN-WAIT-1 to CLOSING, and the
    /// data must still be sent (without it the connection stalled until the user timeout).
    fn may_send_queued(self) -> bool {
        matches!(
            self,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::LastAck
                | State::Closing
        )
    }
}

/// Something the application should know about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The handshake completed.
    Connected,
    /// The effective send MSS changed (MPA recomputes MULPDU, RFC 5044 5.3.2).
    EmssChanged(u16),
    /// The peer sent FIN and all data before it has been received.
    PeerClosed,
    /// The connection closed normally (TIME-WAIT or LAST-ACK ended).
    Closed,
    /// The peer reset the connection.
    Reset,
    /// Retransmissions or keepalives went unanswered; the connection aborted.
    TimedOut,
    /// A pass-up's [`TakeBack`] could not be honoured ([`Connection::renege_from`] refused
    /// it): the octets from `offset` on will be acknowledged though the upper layer let
    /// them go. The upper layer's stream is broken; it should end the connection.
    TakeBackRefused {
        /// The [`TakeBack::from`] refused.
        offset: u64,
    },
    /// [`TxMode::Source`]: the [`TxSource`] could not produce octets TCP had to send (for
    /// example a retransmission whose source memory is gone); the connection aborted (RST).
    SourceFailed,
}

/// Why a [`TxSource`] could not produce the octets asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("transmit source cannot produce {len} octets at stream offset {offset}")]
pub struct TxSourceError {
    /// Stream offset of the first octet asked for.
    pub offset: u64,
    /// Octets asked for.
    pub len: usize,
}

/// Produces the octets of the send stream on demand ([`TxMode::Source`]).
///
/// Stream offsets count from 0 at the first octet after the SYN (ISS + 1), like
/// [`Connection::bytes_acked`] and [`PassedUp::stream_offset`]. TCP asks only for octets of
/// records announced with [`Connection::send_record_len`] and not yet acknowledged; the same
/// range may be asked for again (retransmission) and must give the same octets.
pub trait TxSource {
    /// Writes the stream octets `[stream_offset, stream_offset + out.len())` into `out`
    /// (for example straight into a packet buffer).
    fn fill(&mut self, stream_offset: u64, out: &mut [u8]) -> Result<(), TxSourceError>;

    /// [`fill`](Self::fill), and the RFC 1071 ones' complement sum of the octets written to
    /// `out` (`out[0]` the high-order octet of a 16-bit word, as [`Checksum::sum`] gives it)
    /// if the source computed it on the way, e.g. while copying them: TCP then checksums only
    /// its header and pseudo-header and adds this (RFC 1071 2(A), 2(C)) instead of reading the
    /// payload back. `None` (the default, which calls `fill`): TCP sums `out` itself. A wrong
    /// sum puts a segment with a bad checksum on the wire, which the peer drops (RFC 9293 3.1).
    ///
    /// [`Checksum::sum`]: crate::wire::Checksum::sum
    fn fill_summed(
        &mut self,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u16>, TxSourceError> {
        self.fill(stream_offset, out).map(|()| None)
    }

    /// Writes the `len` stream octets from `stream_offset` on into a packet in pieces (see
    /// [`Connection::poll_transmit_split`]): `first` whole, then on through `rest` in order,
    /// the last piece written only as far as `len` goes. Returns their ones' complement sum.
    /// The default fills piece by piece with [`fill_summed`](Self::fill_summed)
    /// ([`fill_in_pieces`]); a source that carries state across an FPDU (its CRC) writes the
    /// pieces in one pass instead.
    fn fill_split(
        &mut self,
        stream_offset: u64,
        len: usize,
        first: &mut [u8],
        rest: &mut [&mut [u8]],
    ) -> Result<u16, TxSourceError> {
        fill_in_pieces(stream_offset, len, first, rest, |offset, out| {
            self.fill_summed(offset, out)
        })
    }
}

/// Writes the `len` stream octets from `stream_offset` on into `first` and then through
/// `rest` in order (the last piece only as far as `len` goes), one `fill(offset, piece)` per
/// piece, and returns the ones' complement sum of all of them: each piece's sum as `fill`
/// gives it, or read back from the piece where it gives none, added at the piece's offset
/// (RFC 1071 2(B)). `TxSourceError` if the pieces hold fewer than `len` octets.
pub fn fill_in_pieces(
    stream_offset: u64,
    len: usize,
    first: &mut [u8],
    rest: &mut [&mut [u8]],
    mut fill: impl FnMut(u64, &mut [u8]) -> Result<Option<u16>, TxSourceError>,
) -> Result<u16, TxSourceError> {
    let mut sum = Checksum::new();
    let mut at = 0;
    for piece in std::iter::once(first).chain(rest.iter_mut().map(|p| &mut **p)) {
        if at == len {
            break;
        }
        let n = piece.len().min(len - at);
        if n == 0 {
            continue;
        }
        let out = &mut piece[..n];
        let part = match fill(stream_offset + at as u64, out)? {
            Some(part) => part,
            None => Checksum::new().add_bytes(out).sum(),
        };
        sum = sum.add_sum_at(at, part);
        at += n;
    }
    if at < len {
        return Err(TxSourceError {
            offset: stream_offset + at as u64,
            len: len - at,
        });
    }
    Ok(sum.sum())
}

/// Octets a packet in pieces holds: `first` and every piece of `rest`.
#[inline]
pub fn pieces_len(first: &[u8], rest: &[&mut [u8]]) -> usize {
    first.len() + rest.iter().map(|p| p.len()).sum::<usize>()
}

/// Copies `src` into `first` and then on through `rest` in order, as far as they hold it;
/// returns the octets copied (a packet built in one buffer, put into its frames).
#[inline]
pub fn copy_to_pieces(src: &[u8], first: &mut [u8], rest: &mut [&mut [u8]]) -> usize {
    let mut at = 0;
    for piece in std::iter::once(first).chain(rest.iter_mut().map(|p| &mut **p)) {
        let n = piece.len().min(src.len() - at);
        piece[..n].copy_from_slice(&src[at..at + n]);
        at += n;
    }
    at
}

/// Where [`Connection::poll_transmit_split`] writes a packet: the headers at the start of
/// `head`, a data segment's payload from there on through `tail` in order (contiguous when
/// `tail` is empty).
struct PacketOut<'a, 'b> {
    head: &'a mut [u8],
    tail: &'a mut [&'b mut [u8]],
}

/// The source used where none is given: it produces nothing.
struct NoSource;

impl TxSource for NoSource {
    fn fill(&mut self, stream_offset: u64, out: &mut [u8]) -> Result<(), TxSourceError> {
        Err(TxSourceError {
            offset: stream_offset,
            len: out.len(),
        })
    }
}

/// Data passed up in [`RxMode::PassUp`] at the moment TCP accepts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassedUp<'a> {
    /// TCP sequence number of `data[0]`.
    pub seq: u32,
    /// Stream offset of `data[0]` (0 = first octet after the SYN).
    pub stream_offset: u64,
    /// The octets (borrowed from the received packet).
    pub data: &'a [u8],
    /// Octets of our own send stream the peer has acknowledged, this segment's ACK included
    /// ([`Connection::bytes_acked`]; the ACK is processed before the data is passed up), so
    /// an upper layer can release what was acknowledged before acting on what arrived.
    pub acked: u64,
}

/// An upper layer's answer to data passed up ([`Connection::handle_segment`]): take the
/// octets from stream offset `from` on back, as [`Connection::renege_from`] does, before
/// anything after them in the segment is taken (the rest of its data, and a FIN that it
/// would have put in order). Given back in the same call, a gap-filling segment cannot have
/// the peer's FIN taken in between, as it could if the upper layer asked only later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakeBack {
    /// Stream offset of the first octet given back.
    pub from: u64,
}

/// What a pass-up callback may return: nothing (`()`), or `Option<TakeBack>`.
pub trait PassUpReply {
    /// The octets to take back, if any.
    fn take_back(self) -> Option<TakeBack>;
}

impl PassUpReply for () {
    fn take_back(self) -> Option<TakeBack> {
        None
    }
}

impl PassUpReply for Option<TakeBack> {
    fn take_back(self) -> Option<TakeBack> {
        self
    }
}

/// Why a send call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The connection cannot send (not open, or already closed for sending).
    #[error("connection not open for sending")]
    NotOpen,
    /// The send buffer has no room for the whole record.
    #[error("send buffer full")]
    BufferFull,
    /// The call does not match the configured [`TxMode`].
    #[error("wrong transmit mode for this call")]
    WrongMode,
    /// Records must not be empty.
    #[error("empty record")]
    EmptyRecord,
    /// [`Connection::send_record_with`]: the writer produced another length than announced
    /// (nothing was queued).
    #[error("record writer produced {produced} octets, {announced} announced")]
    RecordLength {
        /// The length announced.
        announced: usize,
        /// The octets the writer produced.
        produced: usize,
    },
    /// [`Connection::send_rdma`]: the octets would end past the 32-bit Buffer Offset of the
    /// TCP RDMA option (draft-csapuntz-tcprdma-00 3.1).
    #[error("RDMA section past a 4 GiB buffer")]
    RdmaBufferOffset,
    /// [`Connection::send_rdma`]: the octets would end past the transfer's Total Length
    /// (draft-csapuntz-tcprdma-00 3.1.4-3.1.5: a receiver refuses such a segment's option).
    #[error("RDMA section past its transfer's total length")]
    RdmaPastTotal,
    /// [`Connection::send_rdma`]: another Total Length than an earlier section of the same
    /// transfer still unacknowledged named (3.1.4: one total per transfer; a receiver refuses
    /// the segments that differ).
    #[error("RDMA transfer named with two total lengths")]
    RdmaTotalChanged,
}

/// The most buffers a connection takes for RDMA transfers at once
/// ([`Connection::post_rdma_buffer`]).
pub const MAX_RDMA_BUFFERS: usize = 256;

/// Why [`Connection::handle_packet_too_big`] (or the table's) did not act on a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketTooBigError {
    /// No connection has the quoted 4-tuple (the table's lookup).
    #[error("no connection for the quoted segment")]
    NoConnection,
    /// The connection is not synchronized (RFC 9293 3.3.2): nothing of ours it could quote.
    #[error("connection not synchronized")]
    NotSynchronized,
    /// The quoted sequence number is not of data in flight (RFC 5927 4.1): stale or forged.
    #[error("quoted sequence number not in flight")]
    SequenceNotInFlight,
    /// The MTU is below the floor ([`Config::min_path_mtu`], RFC 5927 7.2): likely forged.
    #[error("MTU {mtu} below the floor {floor}")]
    MtuBelowFloor {
        /// The MTU the report named.
        mtu: u16,
        /// The floor.
        floor: u16,
    },
    /// The MTU is not below the current path MTU (RFC 1191 3: reports never raise it); the
    /// usual case for the further reports a burst of oversized segments draws.
    #[error("MTU {mtu} not below the path MTU {path_mtu}")]
    MtuNotSmaller {
        /// The MTU the report named.
        mtu: u16,
        /// The connection's path MTU, unchanged.
        path_mtu: u16,
    },
}

/// Counters (monotonic unless noted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Segments processed.
    pub segments_in: u64,
    /// Segments sent with a TCP RDMA option describing transfer data
    /// ([`Connection::send_rdma`]), first transmissions and retransmissions.
    pub rdma_options_sent: u64,
    /// Segments received with a TCP RDMA option describing transfer data (the 16- or 20-octet
    /// form, the option in use).
    pub rdma_options_received: u64,
    /// Octets placed straight into a posted buffer, arriving in order.
    pub rdma_placed_in_order: u64,
    /// Octets placed straight into a posted buffer, arriving out of order.
    pub rdma_placed_out_of_order: u64,
    /// Segments whose RDMA option was well formed but not acted on (unknown RID, offsets
    /// past the segment or the buffer, unsolicited data for a buffer not offered for it,
    /// another total length than the transfer's earlier segments named, octets of the
    /// buffer another part of the stream wrote, or no room left to track placement): their
    /// data went through the stream as ordinary data (draft-csapuntz-tcprdma-00 6.1).
    pub rdma_refused: u64,
    /// Segments whose first RDMA option was malformed (a length the draft does not define;
    /// 3.3), while the option is in use: ordinary data. (An option of any kind running past
    /// the options makes the segment malformed as TCP: it is dropped.)
    pub rdma_malformed: u64,
    /// Octets the ULP read in order through the stream ([`Connection::recv`]), as opposed to
    /// octets placed in posted buffers.
    pub delivered_in_order: u64,
    /// Packets emitted.
    pub segments_out: u64,
    /// Data segments retransmitted (any reason).
    pub retransmitted_segments: u64,
    /// Retransmission timeouts.
    pub rto_expirations: u64,
    /// Series of retransmission timeouts of data: the first timeout, and those that followed
    /// it before the data outstanding at it was acknowledged, count one. (A SYN's or
    /// SYN-ACK's timeouts are not counted here.)
    pub rto_series: u64,
    /// Fast-recovery episodes entered.
    pub fast_recoveries: u64,
    /// Tail-loss probes sent.
    pub tlp_probes: u64,
    /// Segments dropped as outside the receive window.
    pub out_of_window: u64,
    /// Segments dropped by PAWS (RFC 7323 5).
    pub paws_drops: u64,
    /// Challenge ACKs sent (RFC 5961).
    pub challenge_acks: u64,
    /// Duplicate ACKs not sent for segments without data outside the window or failing PAWS
    /// (`Config::invalid_ack_interval`).
    pub invalid_acks_skipped: u64,
    /// Segments dropped because the out-of-order range table was full.
    pub ooo_range_limit_drops: u64,
    /// Segments that arrived beyond `rcv_nxt`.
    pub ooo_segments: u64,
    /// Segments carrying only data already received.
    pub duplicate_segments: u64,
    /// Octets passed up in `PassUp` mode.
    pub passed_up_bytes: u64,
    /// Times octets passed up were taken back before being acknowledged
    /// ([`Connection::renege_from`]).
    pub reneged: u64,
    /// Times the peer was seen to have discarded data it had SACKed (a SACKed segment at the
    /// cumulative acknowledgement point): those segments were sent again.
    pub peer_reneged: u64,
    /// Window probes and keepalives sent.
    pub probes: u64,
    /// Window probes sent (RFC 9293 3.8.6.1; of [`ConnStats::probes`]).
    pub window_probes: u64,
    /// Aborts by the user timeout (`Config::user_timeout`).
    pub user_timeouts: u64,
    /// Connections reset after waiting `Config::fin_wait2_timeout` in FIN-WAIT-2 for a FIN
    /// the peer never sent.
    pub fin_wait2_timeouts: u64,
    /// Path MTU reductions by believed "packet too big" reports
    /// ([`Connection::handle_packet_too_big`]).
    pub path_mtu_reductions: u64,
    /// Lowered path MTUs raised back to the first hop's when they expired
    /// ([`Config::path_mtu_expiry`]).
    pub path_mtu_raises: u64,
    /// Scoreboard entries SACK marking and RACK loss detection looked at (the work the
    /// peer's ACKs made; runs of SACKed entries are jumped over, not looked at).
    pub sack_scan_steps: u64,
    /// D-SACK blocks received (RFC 2883: the peer got a segment twice).
    pub dsacks_received: u64,
    /// D-SACK blocks sent.
    pub dsacks_sent: u64,
    /// Congestion responses undone because every retransmission of the
    /// episode was reported duplicate by D-SACK (RFC 3708).
    pub dsack_undos: u64,
    /// Series of retransmission timeouts ([`rto_series`](Self::rto_series)) found spurious by
    /// the first one's timestamp (Eifel, RFC 3522) and undone (RFC 4015).
    pub spurious_rtos: u64,
    /// Nanoseconds in which unsent data waited for the peer's receive window
    /// (RFC 4898 tcpEStatsPerfSndLimTimeRwin).
    pub snd_lim_time_rwin_ns: u64,
    /// Nanoseconds in which unsent data waited for the congestion window
    /// (RFC 4898 tcpEStatsPerfSndLimTimeCwnd).
    pub snd_lim_time_cwnd_ns: u64,
    /// Nanoseconds in which data was in flight and the sender had nothing more it
    /// could send: nothing unsent queued (the application, or the layer above
    /// pacing what it queues), or as many segments in flight as the connection
    /// tracks (RFC 4898 tcpEStatsPerfSndLimTimeSnd, less the time with nothing
    /// in flight, which is idle rather than limited).
    pub snd_lim_time_sender_ns: u64,
}

/// What held back new data when the sender last stopped (RFC 4898 section 4,
/// tcpEStatsPerfSndLim*): the state whose time [`ConnStats`] accumulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendLimit {
    PeerWindow,
    Cwnd,
    Sender,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SegState {
    InFlight,
    Sacked,
    Lost,
}

/// The most spans [`SackedSpans`] keeps.
const SACKED_SPANS: usize = 16;

/// Stream ranges (positions) every scoreboard entry inside of which is SACKed: the SACK blocks
/// (RFC 2018 4) as processed, merged, sorted, at most [`SACKED_SPANS`] (when full the lowest
/// goes: it is the next to be acknowledged). SACK marking and RACK loss detection jump over
/// the entries inside one instead of looking at each again on every ACK: a block that grows
/// by a segment per ACK (a receiver behind one lost segment) costs a segment per ACK, not the
/// whole block, and a peer repeating large blocks makes us do little. Entries only stop being
/// SACKed when every SACK is forgotten (reneging, RFC 2018 8) and are only split when lost
/// (a smaller path MTU): both clear the spans. No allocation.
#[derive(Debug, Clone, Copy, Default)]
struct SackedSpans {
    spans: [(u64, u64); SACKED_SPANS],
    len: usize,
}

impl SackedSpans {
    fn clear(&mut self) {
        self.len = 0;
    }

    /// The end of the span holding position `pos`, if one does.
    fn end_of_span_holding(&self, pos: u64) -> Option<u64> {
        self.spans[..self.len]
            .iter()
            .find(|&&(l, r)| l <= pos && pos < r)
            .map(|&(_, r)| r)
    }

    /// Adds `[l, r)`, merged with the spans it overlaps or touches.
    fn add(&mut self, mut l: u64, mut r: u64) {
        let mut kept = [(0u64, 0u64); SACKED_SPANS];
        let mut n = 0;
        for &(a, b) in &self.spans[..self.len] {
            if b < l || a > r {
                kept[n] = (a, b);
                n += 1;
            } else {
                l = l.min(a);
                r = r.max(b);
            }
        }
        if n == SACKED_SPANS {
            // Full: the lowest span goes.
            kept.copy_within(1.., 0);
            n -= 1;
        }
        let at = kept[..n].partition_point(|&(a, _)| a < l);
        kept.copy_within(at..n, at + 1);
        kept[at] = (l, r);
        self.spans = kept;
        self.len = n + 1;
    }

    /// Forgets what lies below `pos` (cumulatively acknowledged).
    fn drop_below(&mut self, pos: u64) {
        let gone = self.spans[..self.len]
            .iter()
            .take_while(|&&(_, r)| r <= pos)
            .count();
        if gone > 0 {
            self.spans.copy_within(gone..self.len, 0);
            self.len -= gone;
        }
    }
}

/// A transmitted segment: its boundaries are fixed at first transmission.
#[derive(Debug, Clone, Copy)]
struct TxSegment {
    start: u64,
    len: u32,
    fin: bool,
    state: SegState,
    xmit_time: Instant,
    /// Times sent again, saturating (only whether it was matters; a `u8` keeps the entry at
    /// 24 octets with [`TxSegment::dsacked`]).
    retransmits: u8,
    /// A D-SACK reported its last retransmission unnecessary (counted once for the undo
    /// episode, RFC 3708).
    dsacked: bool,
}

// The scoreboard holds up to `max_tracked` of these, walked per ACK: kept at three words.
const _: () = assert!(core::mem::size_of::<TxSegment>() == 24);

impl TxSegment {
    /// A data segment in flight, its `start`, `len` and `xmit_time` to be set.
    const IN_FLIGHT: TxSegment = TxSegment {
        start: 0,
        len: 0,
        fin: false,
        state: SegState::InFlight,
        xmit_time: Instant::ZERO,
        retransmits: 0,
        dsacked: false,
    };

    fn seq_len(&self) -> u64 {
        u64::from(self.len) + u64::from(self.fin)
    }
    fn end(&self) -> u64 {
        self.start + self.seq_len()
    }
}

/// What one ACK's newly acknowledged segments (cumulatively or by SACK) say about the round
/// trip: Karn's algorithm (RFC 6298 3) over the whole ACK.
///
/// An ACK gives an RTT sample, from the latest first transmission it newly acknowledges, only
/// if it newly acknowledges no part of a retransmitted segment and reports no duplicate
/// (D-SACK, RFC 2883 4): either may be what the peer answered, and then whatever else it newly
/// acknowledges may have arrived long before, its own ACKs lost. Under loss both ways such
/// repeats are common: a retransmission filling a hole draws an ACK whose SACK blocks repeat
/// what lost ACKs had reported, and taken as a sample that made a path of milliseconds an
/// RTO of seconds (the relay's 20 % loss test stalled on it for a minute).
///
/// Stricter than RFC 6298 3's wording (which speaks of the retransmitted segment's own ACK),
/// and than Linux, which takes the SACK part's sample exactly when Karn's rule refuses the
/// cumulative part's (`tcp_ack_update_rtt`): that is the stale sample above.
#[derive(Debug, Clone, Copy, Default)]
struct AckTiming {
    /// The latest first transmission among the segments newly acknowledged whole and never
    /// sent again.
    newest_sent: Option<Instant>,
    /// The latest first transmission among never-retransmitted segments of which only a part
    /// is acknowledged.
    newest_part_sent: Option<Instant>,
    /// Some part of a retransmitted segment was (or, in a SACK block, may have been) newly
    /// acknowledged.
    retransmission_acked: bool,
    /// The ACK carries a D-SACK block.
    duplicate_reported: bool,
}

impl AckTiming {
    /// `e` is newly acknowledged whole.
    fn note_acked(&mut self, e: &TxSegment) {
        if e.retransmits == 0 {
            self.newest_sent = self.newest_sent.max(Some(e.xmit_time));
        } else {
            self.retransmission_acked = true;
        }
    }

    /// A part of `e` is, or (a SACK block cutting into it: nothing records which parts were
    /// SACKed before) may be, newly acknowledged: a middlebox, a receiver trimming to its
    /// window or one reneging inside it cut the segment, and the part may be the ACK's
    /// trigger.
    fn note_acked_part(&mut self, e: &TxSegment) {
        if e.retransmits == 0 {
            self.newest_part_sent = self.newest_part_sent.max(Some(e.xmit_time));
        } else {
            self.retransmission_acked = true;
        }
    }

    /// The RTT sample the ACK gives at `now`, if any. A part's transmission counts only beside
    /// a whole segment's (it can then only shorten the sample): a block repeating the same
    /// part on every ACK gives none of its own.
    fn sample(&self, now: Instant) -> Option<Duration> {
        if self.retransmission_acked || self.duplicate_reported {
            return None;
        }
        let sent = self
            .newest_sent?
            .max(self.newest_part_sent.unwrap_or(Instant::ZERO));
        Some(now - sent)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct RackState {
    xmit_ts: Option<Instant>,
    end: u64,
    rtt: Duration,
}

/// The most scoreboard entries one D-SACK block is looked up in for retransmissions it
/// reports (`Connection::on_dsack`).
const MAX_DSACK_WALK: usize = 64;

/// One congestion response (fast recovery or RTO) that may still be undone
/// (RFC 3708 2 / Linux `undo_retrans`): the retransmissions sent since, which
/// D-SACK reports take back one by one.
#[derive(Debug, Clone, Copy)]
struct UndoEpisode {
    /// SND.UNA when the episode began.
    marker: u64,
    /// SND.MAX when it began.
    high: u64,
    /// Retransmissions of data in `[marker, high)` not yet reported duplicate.
    retrans: u32,
}

/// RACK reordering window state (RFC 8985 6.2 steps 3-4).
#[derive(Debug, Clone, Copy)]
struct ReoState {
    /// Highest end of a delivered segment (RACK.fack).
    fack: u64,
    /// A never-retransmitted segment was delivered below `fack`.
    seen: bool,
    /// RACK.reo_wnd_mult.
    mult: u32,
    /// RACK.dsack_round: SND.MAX when the multiplier last grew.
    dsack_round: Option<u64>,
    /// RACK.reo_wnd_persist.
    persist: u32,
}

#[derive(Debug, Clone, Copy)]
struct PendingRst {
    seq: u32,
    ack: Option<u32>,
}

/// A TCP connection.
#[derive(Debug)]
pub struct Connection {
    cfg: Config,
    tuple: FourTuple,
    state: State,
    events: VecDeque<Event>,
    stats: ConnStats,
    /// The application reads nothing more ([`Connection::close_orphaned`]).
    orphaned: bool,
    /// Window probes sent while only our FIN waited for the window, the connection orphaned.
    orphan_fin_probes: u32,

    // ---- send side (positions: 0 = ISS + 1) ----
    snd: SeqAnchor,
    syn_acked: bool,
    syn_due: bool,
    syn_sent_at: Option<Instant>,
    /// When the latest copy of our SYN (SYN-ACK) went, and the TSval it carried, if any.
    syn_last_sent: Option<(Instant, u32)>,
    syn_retransmitted: bool,
    /// Our SYN (SYN-ACK)'s retransmission timer expired (RFC 6298 5.7).
    syn_timed_out: bool,
    snd_una: u64,
    snd_nxt: u64,
    send_buf: VecDeque<u8>,
    send_buf_base: u64,
    /// [`TxMode::Source`]: octets announced (the send buffer stays empty).
    source_len: u64,
    /// Ends of the records queued and not yet sent (at most [`Connection::max_tracked`]).
    record_ends: VecDeque<u64>,
    /// Sections of the send stream that are data of RDMA transfers ([`Connection::send_rdma`]).
    rdma_tx: RdmaSections,
    /// Buffers posted for RDMA transfers and the stream ranges placed in them
    /// ([`Connection::post_rdma_buffer`]).
    rdma_rx: RdmaReceive,
    /// Most entries `record_ends` and `scoreboard` hold: their capacity, allocated with the
    /// connection and never grown on the per-segment path (records past it are refused with
    /// `BufferFull`, new segments wait for ACKs to free entries).
    max_tracked: usize,
    fin_queued: bool,
    fin_sent: bool,
    snd_wnd: u64,
    max_snd_wnd: u64,
    snd_wl1: u32,
    snd_wl2: u32,
    snd_wscale: u8,
    peer_mss: u16,
    path_mtu: u16,
    /// The path MTU before any report lowered it: the first hop's ([`Config::path_mtu`], or
    /// what [`Connection::set_path_mtu`] set).
    first_hop_mtu: u16,
    /// When a lowered path MTU goes back to `first_hop_mtu` ([`Config::path_mtu_expiry`]).
    path_mtu_expires: Option<Instant>,
    emss: u16,
    /// One entry per segment sent and not yet cumulatively acknowledged (at most
    /// `max_tracked`).
    scoreboard: VecDeque<TxSegment>,
    /// Stream ranges every scoreboard entry inside of which is SACKed: the SACK blocks as
    /// processed, merged (see [`SackedSpans`]). SACK marking and RACK jump over them.
    sacked_spans: SackedSpans,
    pipe: u64,
    lost_count: usize,
    cc: Box<dyn CongestionControl>,
    rtt: RttEstimator,
    rack: RackState,
    reo: ReoState,
    undo: Option<UndoEpisode>,
    /// TSval of the first retransmission after a timeout, until the first ACK
    /// of new data tells whether the timeout was spurious (RFC 3522).
    eifel_tsval: Option<u32>,
    /// TSecr of the ACK being processed (timestamps on).
    ack_tsecr: Option<u32>,
    fast_recovery: Option<u64>,
    rto_recover: Option<u64>,
    dupacks: u32,
    dupack_credit: u64,
    /// Queued data waited for the peer's window (zero, or too small for the next segment):
    /// the window update that lets it out ends the persist timer's backoff and the stall.
    window_blocked: bool,
    /// How much of the congestion window the sender used, for its growth (RFC 7661).
    cwnd_use: CwndUse,
    limited_transmit: u32,
    ignore_cwnd_credit: u32,
    rto_deadline: Option<Instant>,
    rto_retries: u32,
    /// When the first timeout of the current series (`rto_retries` from 1) fired.
    rto_series_start: Instant,
    tlp_deadline: Option<Instant>,
    tlp_outstanding: bool,
    /// The send-limited state entered and when (see [`SendLimit`]); `None` while
    /// sending or idle.
    send_limit: Option<(SendLimit, Instant)>,
    rack_deadline: Option<Instant>,
    persist_deadline: Option<Instant>,
    persist_backoff: u32,
    /// Window probes in a row that no acceptable ACK answered: at
    /// `Config::max_retransmissions` the peer is taken for gone (a peer that answers them,
    /// its window still shut, keeps the connection for as long as it likes, RFC 1122
    /// 4.2.2.17).
    persist_unanswered: u32,
    probe_due: bool,
    /// No scoreboard entry below this stream position is `Lost`: where the search for the
    /// next retransmission starts (from the front, it cost what lies before the first lost
    /// entry, per retransmission: n²/4 over a recovery whose every other segment is SACKed).
    lost_floor: u64,
    /// The persist timer fired with data held back by sender SWS avoidance: the next segment
    /// may be as small as the window (RFC 9293 3.8.6.2.1 (4), the override timeout), once.
    sws_override: bool,
    pending_rst: Option<PendingRst>,

    // ---- receive side (positions: 0 = IRS + 1) ----
    rcv: SeqAnchor,
    rcv_nxt: u64,
    fin_received: bool,
    peer_fin_pos: Option<u64>,
    rcv_wscale: u8,
    rcv_ranges: RangeSet,
    /// A duplicate range to report in the next ACK (RFC 2883 D-SACK).
    dsack: Option<(u64, u64)>,
    rcv_buf: Vec<u8>,
    rcv_read: u64,
    ulp_window: u64,
    rcv_adv_right: u64,
    ack_pending: bool,
    ack_now: bool,
    delack_deadline: Option<Instant>,
    unacked_segments: u32,
    quickack_left: u32,

    // ---- options ----
    offered_wscale: bool,
    sack_enabled: bool,
    /// Both sides offered the TCP RDMA option (draft-csapuntz-tcprdma-00 3.2).
    rdma_option_enabled: bool,
    ts_enabled: bool,
    ts_offset: u32,
    ts_recent: Option<u32>,
    /// When TS.Recent was last set: older than [`PAWS_IDLE_LIMIT`], it is invalid.
    ts_recent_at: Instant,
    last_ack_sent: u32,
    /// `rcv_nxt` when the last ACK went out: octets below it are acknowledged for good.
    rcv_nxt_acked: u64,
    /// The data segments' headers, built again when the handshake settles `ts_enabled`.
    data_header: DataHeader,

    // ---- misc timers ----
    time_wait_deadline: Option<Instant>,
    /// The latest `time_wait_deadline` the peer's FIN again may push it to.
    time_wait_last: Option<Instant>,
    /// When FIN-WAIT-2 gives up on the peer's FIN (`Config::fin_wait2_timeout`).
    fin_wait2_deadline: Option<Instant>,
    keepalive_deadline: Option<Instant>,
    keepalive_unanswered: u32,
    /// When the peer was last heard (a segment that passed the sequence check with an
    /// acceptable ACK, `heard_from_peer`). The keepalive deadline is not moved per segment (that
    /// would reschedule the connection's timer on every packet): when it expires, a segment
    /// heard since re-arms it from here instead of a probe going out.
    last_heard: Instant,
    /// Since when data has waited on the peer without progress (unacknowledged, or unsent
    /// behind a closed window): the user timeout counts from here.
    stalled_since: Option<Instant>,
    challenge_window_start: Instant,
    challenge_count: u32,
    /// The last segment made a challenge ACK due (the table may withdraw it under its global
    /// limit, [`Connection::take_challenge_ack`]).
    challenge_due: bool,
    /// Whether an ACK was already due before the challenge ACK made one due: withdrawing the
    /// challenge must not withdraw it.
    ack_due_before_challenge: bool,
    /// When the last duplicate ACK answering an invalid segment without data went
    /// (`Config::invalid_ack_interval`).
    last_invalid_ack: Option<Instant>,
}

const DEFAULT_SEND_MSS: u16 = 536;

/// How many `Config::time_wait` periods after TIME-WAIT began the peer's FIN again may still
/// restart the period (RFC 9293 3.10.7.4 restarts it at each; a bound keeps a peer resending
/// its FIN from holding the connection for good).
const TIME_WAIT_RESTARTS: u32 = 4;

/// The shortest time between keepalive probes (`Config::keepalive`'s interval is raised to it).
const MIN_KEEPALIVE_INTERVAL: Duration = Duration::from_millis(1);

/// How long TS.Recent stays valid without being set (RFC 7323 5.5: 24 days, within which a
/// timestamp clock of at most 1 ms a tick cannot move by half its range).
const PAWS_IDLE_LIMIT: Duration = Duration::from_secs(24 * 24 * 60 * 60);

fn wscale_for(max_window: u64) -> u8 {
    let mut s = 0u8;
    while s < 14 && (max_window >> s) > 65535 {
        s += 1;
    }
    s
}

impl Connection {
    fn new(cfg: Config, tuple: FourTuple, iss: u32, ts_offset: u32, now: Instant) -> Self {
        let data_header = DataHeader::new(&tuple, false, cfg.sent_tos());
        let cc = cfg.congestion.build(
            u64::from(cfg.initial_window_segments) * u64::from(DEFAULT_SEND_MSS).max(1460),
            cfg.slow_start,
        );
        let rtt = RttEstimator::new(cfg.initial_rto, cfg.min_rto, cfg.max_rto);
        let rcv_wscale = if cfg.window_scaling {
            wscale_for(cfg.max_recv_window)
        } else {
            0
        };
        // Room past the nominal buffer for rounding the window up to the scale unit instead
        // of down (see `window_field`): one unit for the round-up, one more (less an octet)
        // so that keeping an edge already rounded up does not at once need a retraction.
        let rcv_buf = match cfg.rx_mode {
            RxMode::InOrder => vec![0u8; cfg.recv_buffer.max(1) + (2 << rcv_wscale) - 1],
            RxMode::PassUp => Vec::new(),
        };
        let ulp_window = cfg.recv_buffer as u64;
        let quickack = cfg.quickack_segments;
        let path_mtu = cfg.path_mtu;
        let max_tracked = cfg.send_buffer.div_ceil(1024).clamp(1024, 1 << 16);
        Connection {
            tuple,
            state: State::Closed,
            events: VecDeque::with_capacity(8),
            stats: ConnStats::default(),
            orphaned: false,
            orphan_fin_probes: 0,
            snd: SeqAnchor { isn: iss },
            syn_acked: false,
            syn_due: false,
            syn_sent_at: None,
            syn_last_sent: None,
            syn_retransmitted: false,
            syn_timed_out: false,
            snd_una: 0,
            snd_nxt: 0,
            // These three are allocated on the first data queued (`reserve_for_sending`).
            send_buf: VecDeque::new(),
            send_buf_base: 0,
            source_len: 0,
            record_ends: VecDeque::new(),
            rdma_tx: RdmaSections::new(max_tracked),
            rdma_rx: RdmaReceive::new(MAX_RDMA_BUFFERS, max_tracked),
            max_tracked,
            fin_queued: false,
            fin_sent: false,
            snd_wnd: 0,
            max_snd_wnd: 0,
            snd_wl1: 0,
            snd_wl2: 0,
            snd_wscale: 0,
            peer_mss: DEFAULT_SEND_MSS,
            path_mtu,
            first_hop_mtu: path_mtu,
            path_mtu_expires: None,
            emss: DEFAULT_SEND_MSS,
            scoreboard: VecDeque::new(),
            sacked_spans: SackedSpans::default(),
            pipe: 0,
            lost_count: 0,
            cc,
            rtt,
            rack: RackState::default(),
            reo: ReoState {
                fack: 0,
                seen: false,
                mult: 1,
                dsack_round: None,
                persist: 0,
            },
            undo: None,
            eifel_tsval: None,
            ack_tsecr: None,
            fast_recovery: None,
            rto_recover: None,
            dupacks: 0,
            dupack_credit: 0,
            window_blocked: false,
            cwnd_use: CwndUse::default(),
            limited_transmit: 0,
            ignore_cwnd_credit: 0,
            rto_deadline: None,
            rto_retries: 0,
            rto_series_start: Instant::ZERO,
            tlp_deadline: None,
            tlp_outstanding: false,
            send_limit: None,
            rack_deadline: None,
            persist_deadline: None,
            persist_backoff: 0,
            persist_unanswered: 0,
            probe_due: false,
            lost_floor: 0,
            sws_override: false,
            pending_rst: None,
            rcv: SeqAnchor { isn: 0 },
            rcv_nxt: 0,
            fin_received: false,
            peer_fin_pos: None,
            rcv_wscale,
            rcv_ranges: RangeSet::new(cfg.max_ooo_ranges),
            dsack: None,
            rcv_buf,
            rcv_read: 0,
            ulp_window,
            rcv_adv_right: 0,
            ack_pending: false,
            ack_now: false,
            delack_deadline: None,
            unacked_segments: 0,
            quickack_left: quickack,
            offered_wscale: cfg.window_scaling,
            sack_enabled: false,
            rdma_option_enabled: false,
            ts_enabled: false,
            ts_offset,
            ts_recent: None,
            ts_recent_at: now,
            last_ack_sent: 0,
            rcv_nxt_acked: 0,
            data_header,
            time_wait_deadline: None,
            time_wait_last: None,
            fin_wait2_deadline: None,
            keepalive_deadline: None,
            keepalive_unanswered: 0,
            last_heard: now,
            stalled_since: None,
            challenge_window_start: now,
            challenge_count: 0,
            challenge_due: false,
            ack_due_before_challenge: false,
            last_invalid_ack: None,
            cfg,
        }
    }

    /// Active open (RFC 9293 3.10.1): the connection starts in SYN-SENT and
    /// its SYN is the first thing [`Connection::poll_transmit`] emits.
    pub fn connect(cfg: Config, tuple: FourTuple, isn: &IsnGenerator, now: Instant) -> Self {
        let mut c = Connection::new(
            cfg,
            tuple,
            isn.isn(&tuple, now),
            isn.timestamp_offset(&tuple),
            now,
        );
        c.state = State::SynSent;
        c.syn_due = true;
        c.recompute_emss(false);
        c
    }

    /// Passive open from a SYN that reached a listener (RFC 9293 3.10.7.2):
    /// the connection starts in SYN-RECEIVED and emits a SYN-ACK. Returns
    /// `None` if `syn` is not a plain SYN (no ACK, no RST).
    pub fn accept(
        cfg: Config,
        syn: &SegmentRepr<'_>,
        isn: &IsnGenerator,
        now: Instant,
    ) -> Option<Self> {
        Connection::accept_with(cfg, syn, isn, now, None)
    }

    /// [`Connection::accept`] for a SYN that ended the TIME-WAIT of the same 4-tuple's
    /// previous incarnation ([`Connection::time_wait_successor_isn`]): the ISN is
    /// `isn_floor`, above every sequence number that incarnation used (RFC 6191 2, as Linux
    /// picks it).
    pub fn accept_with(
        cfg: Config,
        syn: &SegmentRepr<'_>,
        isn: &IsnGenerator,
        now: Instant,
        isn_floor: Option<u32>,
    ) -> Option<Self> {
        if !syn.flags.syn || syn.flags.ack || syn.flags.rst {
            return None;
        }
        let tuple = FourTuple::of_received(syn);
        let mut c = Connection::new(
            cfg,
            tuple,
            isn_floor.unwrap_or_else(|| isn.isn(&tuple, now)),
            isn.timestamp_offset(&tuple),
            now,
        );
        c.take_syn_options(syn, now);
        c.state = State::SynReceived;
        c.syn_due = true;
        c.recompute_emss(false);
        Some(c)
    }

    /// The SYN-ACK a listener with `cfg` sends for `syn` without keeping any state: its
    /// sequence number is the SYN cookie `cookie` ([`crate::syncookie`], RFC 4987 3.6), its
    /// options those of [`Connection::accept`]'s SYN-ACK, except that window scaling and
    /// SACK are offered only when timestamps carry them back.
    pub fn cookie_syn_ack(
        cfg: &Config,
        syn: &SegmentRepr<'_>,
        cookie: u32,
        isn: &IsnGenerator,
        now: Instant,
    ) -> SegmentRepr<'static> {
        let tuple = FourTuple::of_received(syn);
        let mut options = TcpOptions::default();
        options.mss = Some(cfg.mss);
        if let (true, Some((peer_tsval, _))) = (cfg.timestamps, syn.options.timestamp) {
            let peer_wscale = syn.options.window_scale.filter(|_| cfg.window_scaling);
            if peer_wscale.is_some() {
                options.window_scale = Some(wscale_for(cfg.max_recv_window));
            }
            options.sack_permitted = cfg.sack && syn.options.sack_permitted;
            let ts_now = (now.as_millis() as u32).wrapping_add(isn.timestamp_offset(&tuple));
            let tsval = syncookie::encode_timestamp(ts_now, peer_wscale, options.sack_permitted);
            options.timestamp = Some((tsval, peer_tsval));
        }
        SegmentRepr {
            src_addr: syn.dst_addr,
            tos: cfg.sent_tos(),
            dst_addr: syn.src_addr,
            src_port: syn.dst_port,
            dst_port: syn.src_port,
            seq: cookie,
            ack: syn.seq.wrapping_add(1),
            flags: TcpFlags {
                syn: true,
                ack: true,
                ..TcpFlags::default()
            },
            window: cfg.recv_buffer.min(65_535) as u16,
            options,
            payload: &[],
        }
    }

    /// The connection a SYN cookie stood for, rebuilt from `ack`, the segment that brought it
    /// back (RFC 4987 3.6): in SYN-RECEIVED as if [`Connection::cookie_syn_ack`]'s SYN-ACK
    /// had come from it (no RTT sample from it), with the peer's MSS from the cookie
    /// (`mss_index` in [`syncookie::MSS_TABLE`]) and its window scale and SACK from the
    /// timestamp echoed; `ack` is then to be handled as usual.
    pub fn from_cookie(
        cfg: Config,
        ack: &SegmentRepr<'_>,
        mss_index: u8,
        isn: &IsnGenerator,
        now: Instant,
    ) -> Self {
        let tuple = FourTuple::of_received(ack);
        let mut options = TcpOptions::default();
        options.mss = syncookie::MSS_TABLE.get(usize::from(mss_index)).copied();
        if let Some((tsval, tsecr)) = ack.options.timestamp {
            let (wscale, sack) = syncookie::decode_timestamp(tsecr);
            options.window_scale = wscale;
            options.sack_permitted = sack;
            options.timestamp = Some((tsval, 0));
        }
        let syn = SegmentRepr {
            src_addr: ack.src_addr,
            tos: ack.tos,
            dst_addr: ack.dst_addr,
            src_port: ack.src_port,
            dst_port: ack.dst_port,
            seq: ack.seq.wrapping_sub(1),
            ack: 0,
            flags: TcpFlags {
                syn: true,
                ..TcpFlags::default()
            },
            window: ack.window,
            options,
            payload: &[],
        };
        let iss = ack.ack.wrapping_sub(1);
        let mut c = Connection::new(cfg, tuple, iss, isn.timestamp_offset(&tuple), now);
        c.take_syn_options(&syn, now);
        c.state = State::SynReceived;
        c.recompute_emss(false);
        c.syn_due = false;
        c.syn_retransmitted = true;
        c.window_field(true);
        c.last_ack_sent = syn.seq.wrapping_add(1);
        c
    }

    // ------------------------------------------------------------------
    // Accessors
    // ------------------------------------------------------------------

    /// Current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// The connection's addresses.
    pub fn four_tuple(&self) -> FourTuple {
        self.tuple
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &ConnStats {
        &self.stats
    }

    /// Next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Effective send MSS: the largest payload of a segment we send
    /// (RFC 9293 3.7.1: min(peer MSS, path MTU - 40) minus fixed options).
    pub fn emss(&self) -> u16 {
        self.emss
    }

    /// `RCV.NXT` as a sequence number: everything before it has been
    /// received in order (what MPA calls deliverable).
    pub fn rcv_nxt(&self) -> u32 {
        self.rcv
            .seq_of(self.rcv_nxt)
            .wrapping_add(u32::from(self.fin_received))
    }

    /// `RCV.NXT` as a stream offset (data only; excludes a received FIN).
    pub fn rcv_nxt_offset(&self) -> u64 {
        self.rcv_nxt
    }

    /// The peer's initial sequence number plus one: the sequence number of
    /// stream offset 0.
    pub fn rcv_stream_start(&self) -> u32 {
        self.rcv.seq_of(0)
    }

    /// `SND.NXT` as a sequence number (after any FIN sent).
    pub fn snd_nxt(&self) -> u32 {
        if !self.syn_acked && !self.state.synchronized() {
            return self.snd.isn.wrapping_add(1);
        }
        self.snd
            .seq_of(self.snd_nxt)
            .wrapping_add(u32::from(self.fin_sent))
    }

    /// `SND.UNA` as a sequence number.
    pub fn snd_una(&self) -> u32 {
        self.snd.seq_of(self.snd_una)
    }

    /// Our stream offset 0 as a sequence number.
    pub fn snd_stream_start(&self) -> u32 {
        self.snd.seq_of(0)
    }

    /// Octets of out-of-order payload held inside TCP. Always 0 in
    /// [`RxMode::PassUp`]: TCP has no receive buffer in that mode.
    pub fn ooo_bytes_held(&self) -> u64 {
        match self.cfg.rx_mode {
            RxMode::InOrder => self.rcv_ranges.covered(),
            RxMode::PassUp => 0,
        }
    }

    /// Capacity of TCP's receive buffer (0 in [`RxMode::PassUp`]): `recv_buffer` plus just
    /// under two window-scale units, the room for offering a window rounded up to the unit
    /// (RFC 7323 2.4) rather than a zero or retracted one.
    pub fn receive_buffer_capacity(&self) -> usize {
        self.rcv_buf.capacity()
    }

    /// Octets acknowledged by the peer so far (stream offset of `SND.UNA`).
    pub fn bytes_acked(&self) -> u64 {
        self.snd_una.min(self.data_end())
    }

    /// Octets queued and not yet acknowledged.
    pub fn send_queue_len(&self) -> usize {
        (self.data_end() - self.send_buf_base) as usize
    }

    /// Free space in the send buffer: 0 also while as many records as the connection tracks
    /// wait to be sent (see [`Connection::max_tracked`]).
    pub fn send_capacity(&self) -> usize {
        if self.record_ends.len() >= self.max_tracked {
            return 0;
        }
        self.cfg.send_buffer.saturating_sub(self.send_queue_len())
    }

    /// Most records queued unsent, and most segments in flight, this connection tracks: a
    /// full send buffer of 1 KiB segments (`send_buffer / 1024`, at least 1024, at most 65 536;
    /// 4096 at the default 4 MiB). Its bookkeeping is allocated for that many when the first
    /// data is queued (a connection that has sent nothing, such as a passive one whose ULP has
    /// not answered yet, holds none of it) and never grows: beyond it records are refused
    /// (`BufferFull`) and new segments wait for ACKs, so small records cost no allocation on
    /// the per-segment path.
    pub fn max_tracked(&self) -> usize {
        self.max_tracked
    }

    /// Current congestion window (octets).
    pub fn cwnd(&self) -> u64 {
        self.cc.cwnd()
    }

    /// Smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    /// Current retransmission timeout.
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }

    /// Whether SACK was negotiated.
    pub fn sack_enabled(&self) -> bool {
        self.sack_enabled
    }

    /// Whether the TCP RDMA option may be used on this connection: both sides offered it on
    /// their SYNs (draft-csapuntz-tcprdma-00 3.2).
    pub fn rdma_option_enabled(&self) -> bool {
        self.rdma_option_enabled
    }

    /// Whether timestamps were negotiated.
    pub fn timestamps_enabled(&self) -> bool {
        self.ts_enabled
    }

    /// Window-scale shifts `(ours, peer's)` in effect.
    pub fn window_scales(&self) -> (u8, u8) {
        (self.rcv_wscale, self.snd_wscale)
    }

    /// The peer's current send window as we know it (scaled).
    pub fn peer_window(&self) -> u64 {
        self.snd_wnd
    }

    fn data_end(&self) -> u64 {
        match self.cfg.tx_mode {
            TxMode::Source => self.source_len,
            _ => self.send_buf_base + self.send_buf.len() as u64,
        }
    }

    // ------------------------------------------------------------------
    // Application calls
    // ------------------------------------------------------------------

    fn can_queue(&self) -> bool {
        matches!(
            self.state,
            State::SynSent | State::SynReceived | State::Established | State::CloseWait
        ) && !self.fin_queued
    }

    /// Whether a record of `len` octets may be queued now, in `mode`: the connection's
    /// transmit mode, open for sending, not empty, and room for all of it.
    /// Allocates the send side's bookkeeping at the size it never grows past (see
    /// [`Connection::max_tracked`]), and in `Records` and `Stream` mode the send buffer, on
    /// the first data queued.
    fn reserve_for_sending(&mut self) {
        if self.record_ends.capacity() >= self.max_tracked {
            return;
        }
        self.record_ends.reserve_exact(self.max_tracked);
        self.scoreboard.reserve_exact(self.max_tracked);
        if self.cfg.tx_mode != TxMode::Source {
            self.send_buf.reserve_exact(self.cfg.send_buffer);
        }
    }

    fn admit_record(&self, mode: TxMode, len: usize) -> Result<(), SendError> {
        if self.cfg.tx_mode != mode {
            return Err(SendError::WrongMode);
        }
        if !self.can_queue() {
            return Err(SendError::NotOpen);
        }
        if len == 0 {
            return Err(SendError::EmptyRecord);
        }
        if len > self.send_capacity() {
            return Err(SendError::BufferFull);
        }
        Ok(())
    }

    /// Queue one whole record (an MPA FPDU) for transmission, in
    /// [`TxMode::Records`]. All or nothing.
    pub fn send_record(&mut self, record: &[u8]) -> Result<(), SendError> {
        self.send_record_vectored(&[record])
    }

    /// Queue one record given as several parts (e.g. header and payload),
    /// copied once into the send buffer.
    pub fn send_record_vectored(&mut self, parts: &[&[u8]]) -> Result<(), SendError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.admit_record(TxMode::Records, len)?;
        self.reserve_for_sending();
        for p in parts {
            self.send_buf.extend(p.iter().copied());
        }
        self.record_ends.push_back(self.data_end());
        Ok(())
    }

    /// Queue one record of `len` octets written in place by `write`, which gets a function
    /// appending octets to the send buffer (so a record can be framed straight into it, no
    /// intermediate copy). All or nothing: if `write` appends other than `len` octets, they are
    /// taken back and [`SendError::RecordLength`] returned.
    pub fn send_record_with(
        &mut self,
        len: usize,
        write: impl FnOnce(&mut dyn FnMut(&[u8])),
    ) -> Result<(), SendError> {
        self.admit_record(TxMode::Records, len)?;
        self.reserve_for_sending();
        let before = self.send_buf.len();
        let buf = &mut self.send_buf;
        write(&mut |bytes: &[u8]| buf.extend(bytes.iter().copied()));
        let produced = self.send_buf.len() - before;
        if produced != len {
            self.send_buf.truncate(before);
            return Err(SendError::RecordLength {
                announced: len,
                produced,
            });
        }
        self.record_ends.push_back(self.data_end());
        Ok(())
    }

    /// Announce one whole record of `len` octets in [`TxMode::Source`]: TCP takes no octets,
    /// only the length; they are asked for from the [`TxSource`] given to
    /// [`Connection::poll_transmit_with`] when the record (or part of it) is sent or
    /// retransmitted. All or nothing.
    #[inline]
    pub fn send_record_len(&mut self, len: usize) -> Result<(), SendError> {
        self.admit_record(TxMode::Source, len)?;
        self.reserve_for_sending();
        self.source_len += len as u64;
        self.record_ends.push_back(self.source_len);
        Ok(())
    }

    /// The stream offset the next record announced with [`Connection::send_record_len`]
    /// (or queued with the other send calls) starts at.
    pub fn send_stream_end(&self) -> u64 {
        self.data_end()
    }

    /// Queue bytes in [`TxMode::Stream`]; returns how many fit.
    pub fn send(&mut self, data: &[u8]) -> Result<usize, SendError> {
        if self.cfg.tx_mode != TxMode::Stream {
            return Err(SendError::WrongMode);
        }
        if !self.can_queue() {
            return Err(SendError::NotOpen);
        }
        Ok(self.queue_stream(data))
    }

    /// Queues what fits of `data` in the send buffer ([`TxMode::Stream`], checked by the
    /// caller); returns how much.
    fn queue_stream(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.send_capacity());
        if n > 0 {
            self.reserve_for_sending();
        }
        self.send_buf.extend(data[..n].iter().copied());
        n
    }

    /// Queue bytes in [`TxMode::Stream`] that are data of an RDMA transfer (the TCP RDMA
    /// option, draft-csapuntz-tcprdma-00): every segment carrying any of them carries the
    /// option (3.1.8) describing its run of them (one run per segment, section 4), with the
    /// same annotation when retransmitted; such segments give up the option's octets of
    /// payload. Returns how many fit, as [`Connection::send`]; the next call for the same
    /// transfer continues the section when its `buffer_offset` follows on. When the option is
    /// not in use on the connection ([`Connection::rdma_option_enabled`]) the octets go as
    /// ordinary data: the stream is the same, only the annotation is missing. Octets that
    /// would end past a 4 GiB buffer ([`SendError::RdmaBufferOffset`]) or past the transfer's
    /// `total_length` ([`SendError::RdmaPastTotal`]) are refused whole either way; with the
    /// option in use, so is a total other than the one an unacknowledged section of the
    /// transfer named ([`SendError::RdmaTotalChanged`]; the receiver remembers totals longer,
    /// and refuses the segments that differ): a receiver would refuse their option (section
    /// 6.1, 3.1.4).
    pub fn send_rdma(&mut self, data: &[u8], rdma: RdmaSend) -> Result<usize, SendError> {
        if self.cfg.tx_mode != TxMode::Stream {
            return Err(SendError::WrongMode);
        }
        // The whole call's octets are checked, not only those there is room for now, so
        // that what is refused does not depend on the send buffer.
        let end = u64::from(rdma.buffer_offset) + data.len() as u64;
        if end > 1 << 32 {
            return Err(SendError::RdmaBufferOffset);
        }
        if rdma.total_length.is_some_and(|t| end > u64::from(t)) {
            return Err(SendError::RdmaPastTotal);
        }
        if !self.rdma_tx.same_total(&rdma) {
            return Err(SendError::RdmaTotalChanged);
        }
        if !self.rdma_option_enabled {
            return self.send(data);
        }
        if !self.can_queue() {
            return Err(SendError::NotOpen);
        }
        let start = self.data_end();
        if !self.rdma_tx.has_room(start, &rdma) {
            return Ok(0);
        }
        let n = data.len().min(self.send_capacity());
        let n = self.queue_stream(&data[..n]);
        self.rdma_tx.push(start, n as u64, rdma);
        Ok(n)
    }

    /// Posts `buf` for the RDMA transfer `rid` (the TCP RDMA option in use,
    /// [`RxMode::InOrder`]): the data of segments whose option names `rid` is placed straight
    /// into it at the option's Buffer Offset, in or out of order, once every check passes
    /// (draft-csapuntz-tcprdma-00 6.1: the data within the segment and the run within `buf`;
    /// the U bit only if `unsolicited` offers the buffer for unsolicited data; one total
    /// length per transfer, where named); a segment that fails one is ordinary data. In-order
    /// reading ([`Connection::recv`]) stops at each placed range, which
    /// [`Connection::next_placed`] reports and passes. At most [`MAX_RDMA_BUFFERS`].
    pub fn post_rdma_buffer(
        &mut self,
        rid: crate::wire::rdma::Rid,
        buf: Vec<u8>,
        unsolicited: bool,
    ) -> Result<(), RdmaPostError> {
        if self.cfg.rx_mode != RxMode::InOrder {
            return Err(RdmaPostError::WrongMode);
        }
        self.rdma_rx.post(rid, buf, unsolicited)
    }

    /// Takes back the buffer posted for `rid` (with what was placed in it).
    pub fn take_rdma_buffer(&mut self, rid: crate::wire::rdma::Rid) -> Option<Vec<u8>> {
        self.rdma_rx.take(rid)
    }

    /// The next stream range placed in a posted buffer, once in-order reading has reached it
    /// ([`Connection::recv`] returns 0 there): passes it, as reading would.
    pub fn next_placed(&mut self) -> Option<RdmaPlaced> {
        let p = self.rdma_rx.pop_at(self.rcv_read, self.rcv_nxt)?;
        self.rcv_read += p.len;
        self.after_read(p.len);
        Some(p)
    }

    /// Where in-order reading stops: `rcv_nxt`, or the next placed range.
    fn readable_end(&self) -> u64 {
        match self.rdma_rx.next_start() {
            Some(s) => s.min(self.rcv_nxt),
            None => self.rcv_nxt,
        }
    }

    /// Read in-order data ([`RxMode::InOrder`]); returns octets copied.
    pub fn recv(&mut self, out: &mut [u8]) -> usize {
        if self.cfg.rx_mode != RxMode::InOrder {
            return 0;
        }
        let avail = (self.readable_end() - self.rcv_read) as usize;
        let n = avail.min(out.len());
        let cap = self.rcv_buf.len();
        let mut copied = 0;
        while copied < n {
            let idx = ((self.rcv_read + copied as u64) % cap as u64) as usize;
            let run = (n - copied).min(cap - idx);
            out[copied..copied + run].copy_from_slice(&self.rcv_buf[idx..idx + run]);
            copied += run;
        }
        self.rcv_read += n as u64;
        self.stats.delivered_in_order += n as u64;
        self.after_read(n as u64);
        n
    }

    /// Octets were read (or passed, placed): a window update when the window opens enough
    /// (RFC 9293 3.8.6.2.2).
    fn after_read(&mut self, n: u64) {
        if n > 0 && self.state.synchronized() {
            let nominal = self.nominal_recv_buffer();
            let new_right = self.rcv_read + nominal;
            let threshold = (nominal / 2).min(u64::from(self.cfg.mss));
            if new_right >= self.rcv_adv_right + threshold {
                self.ack_now = true;
            }
        }
    }

    /// Octets readable in order right now ([`RxMode::InOrder`]; up to the next placed range).
    pub fn recv_available(&self) -> usize {
        (self.readable_end() - self.rcv_read) as usize
    }

    /// [`RxMode::PassUp`]: how many octets past `rcv_nxt` the upper layer can
    /// still place. The advertised window follows it (never shrinking the
    /// right edge already offered, RFC 9293 3.8.6.2.2).
    pub fn set_receive_window(&mut self, octets: u64) {
        let opened = octets > self.ulp_window;
        self.ulp_window = octets;
        if opened && self.state.synchronized() {
            let right = self.rcv_nxt + octets;
            if right >= self.rcv_adv_right + u64::from(self.cfg.mss) {
                self.ack_now = true;
            }
        }
    }

    /// [`Connection::close`] by an application that will read nothing more either (a
    /// `close(2)` rather than a `shutdown(2)` of the sending side: Linux's orphan): once our
    /// FIN is acknowledged the connection only lingers, in FIN-WAIT-2 as in TIME-WAIT
    /// ([`Connection::is_lingering`]), and may be ended early when lingering connections
    /// crowd the table.
    pub fn close_orphaned(&mut self) {
        self.orphaned = true;
        self.close();
    }

    /// Close the sending direction (RFC 9293 3.10.4): FIN goes after the
    /// queued data. In SYN-RECEIVED the FIN waits for the handshake to complete (RFC 9293
    /// 3.10.4 lets it go at once when nothing is queued; waiting keeps our SYN on its own
    /// retransmission timer and limit, and the ACK of it moves on to FIN-WAIT-1).
    pub fn close(&mut self) {
        match self.state {
            State::SynSent => self.enter_closed(None),
            State::SynReceived => self.fin_queued = true,
            State::Established => {
                self.fin_queued = true;
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.fin_queued = true;
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// Abort (RFC 9293 3.10.5): send RST if synchronized, drop everything. The RST's sequence
    /// number is past a FIN we sent (`queue_reset`).
    pub fn abort(&mut self) {
        if self.state.synchronized() || self.state == State::SynReceived {
            self.queue_reset();
        }
        self.enter_closed(None);
    }

    /// Sets the path MTU as is (at least 68, RFC 1191 3), up or down, without any check and
    /// without retransmitting: for a path MTU learned otherwise than from the network (a
    /// route's MTU, a local interface). Recomputes EMSS and reports a change. A "packet too
    /// big" report from the network goes through [`Connection::handle_packet_too_big`].
    pub fn set_path_mtu(&mut self, mtu: u16) {
        self.path_mtu = mtu.max(68);
        self.first_hop_mtu = self.path_mtu;
        self.path_mtu_expires = None;
        self.recompute_emss(true);
    }

    /// The path MTU the send side uses (the largest IPv4 packet it emits).
    pub fn path_mtu(&self) -> u16 {
        self.path_mtu
    }

    /// A "packet too big" report for one of our segments: an ICMP "fragmentation needed and
    /// DF set" (RFC 792, RFC 1191 4) whose quoted TCP header carried sequence number `seq`
    /// and which named `mtu` as the next hop's MTU. Sans-IO: the caller parsed the message
    /// ([`crate::wire::parse_frag_needed`]) and found this connection by the quoted 4-tuple
    /// ([`crate::table::ConnectionTable::handle_packet_too_big`] does both lookups).
    ///
    /// ICMP is easy to forge, so the report is believed only if (RFC 5927 4.1) `seq` lies in
    /// SND.UNA..SND.NXT (the sent and not yet acknowledged octets, FIN included: a real
    /// report is about data in flight; a blind attacker must guess a window of them), else
    /// [`PacketTooBigError::SequenceNotInFlight`], and only on a synchronized connection
    /// ([`PacketTooBigError::NotSynchronized`]: our SYNs are far below any MTU). It is then
    /// ignored if `mtu` is below [`Config::min_path_mtu`] (RFC 5927 7.2: a forged tiny MTU
    /// would cut throughput by the headers' share; Linux's floor is 552;
    /// [`PacketTooBigError::MtuBelowFloor`]), or not below the current path MTU (RFC 1191 3:
    /// a report never raises the estimate; the further reports a burst of oversized segments
    /// draws name the MTU already taken; [`PacketTooBigError::MtuNotSmaller`]).
    ///
    /// Believed, it lowers the path MTU and EMSS (RFC 9293 3.7.1 and 3.7.2; new segments and
    /// the MULPDU of new FPDUs follow, [`Event::EmssChanged`]) and, as Linux's
    /// `tcp_simple_retransmit`, marks the segments in flight that are now larger than EMSS as
    /// lost, so that [`Connection::poll_transmit`] resends them at once, split at EMSS,
    /// instead of waiting for loss detection or the retransmission timeout. Unlike Linux, only
    /// those sent since the reported segment (it included): on a path that keeps order both
    /// ways, the first report to arrive is about the first segment the router dropped, so the
    /// segments sent before it went through before the MTU fell (Linux resends those too, a
    /// window of duplicates on a fast path); one the router dropped out of that order (its
    /// report then stale, [`PacketTooBigError::MtuNotSmaller`]) is left to SACK and RACK
    /// (RFC 8985) or the timeout. RFC 1191 6.4: this is not a congestion signal, so the
    /// congestion window is not cut; the segments leave the pipe (they are not in the
    /// network), and go out again as the window allows. The lowered path MTU holds for
    /// [`Config::path_mtu_expiry`] after the last believed report, then goes back to the
    /// first hop's (RFC 1191 6.3). Returns the new EMSS. No allocation (the splits happen as
    /// segments are resent).
    pub fn handle_packet_too_big(
        &mut self,
        now: Instant,
        seq: u32,
        mtu: u16,
    ) -> Result<u16, PacketTooBigError> {
        if !self.state.synchronized() {
            return Err(PacketTooBigError::NotSynchronized);
        }
        let Some(pos) = self
            .snd
            .pos_of(seq, self.snd_una)
            .filter(|&p| p >= self.snd_una && p < self.snd_max())
        else {
            return Err(PacketTooBigError::SequenceNotInFlight);
        };
        let floor = self.cfg.min_path_mtu.max(68);
        if mtu < floor {
            return Err(PacketTooBigError::MtuBelowFloor { mtu, floor });
        }
        if mtu >= self.path_mtu {
            return Err(PacketTooBigError::MtuNotSmaller {
                mtu,
                path_mtu: self.path_mtu,
            });
        }
        self.path_mtu = mtu;
        self.recompute_emss(true);
        self.stats.path_mtu_reductions += 1;
        self.path_mtu_expires = self.cfg.path_mtu_expiry.map(|d| now + d);
        let emss = u32::from(self.emss);
        // The segment reported, and when it was sent: whatever was sent before it reached the
        // router before it (on a path that keeps order) and may have passed; whatever was sent
        // since and is too large was dropped too.
        let i = self.scoreboard.partition_point(|e| e.end() <= pos);
        let from = self.scoreboard.get(i).map(|e| (e.xmit_time, e.start));
        let mut marked = false;
        for e in self.scoreboard.iter_mut() {
            let since = from
                .is_none_or(|(t, start)| e.xmit_time > t || (e.xmit_time == t && e.start >= start));
            if e.state == SegState::InFlight && e.len > emss && since {
                e.state = SegState::Lost;
                self.lost_floor = self.lost_floor.min(e.start);
                self.pipe -= e.seq_len();
                self.lost_count += 1;
                marked = true;
            }
        }
        if marked {
            // Resending what the router dropped is no probe for a tail loss.
            self.tlp_deadline = None;
        }
        self.update_stall(now);
        Ok(self.emss)
    }

    /// A lowered path MTU expired (RFC 1191 6.3): back to the first hop's, new segments and
    /// FPDUs sized by it ([`Event::EmssChanged`]); a path still narrow reports again.
    fn expire_path_mtu(&mut self) {
        self.path_mtu_expires = None;
        if self.path_mtu < self.first_hop_mtu {
            self.path_mtu = self.first_hop_mtu;
            self.recompute_emss(true);
            self.stats.path_mtu_raises += 1;
        }
    }

    fn recompute_emss(&mut self, report: bool) {
        let ts = if self.ts_enabled || (!self.state.synchronized() && self.cfg.timestamps) {
            TIMESTAMP_OPTION_SPACE as u16
        } else {
            0
        };
        let by_mtu = self
            .path_mtu
            .saturating_sub((IPV4_HEADER_LEN + TCP_HEADER_LEN) as u16);
        let emss = self.peer_mss.min(by_mtu).saturating_sub(ts).max(64);
        if emss != self.emss {
            self.emss = emss;
            if report {
                self.events.push_back(Event::EmssChanged(emss));
            }
        }
    }

    // ------------------------------------------------------------------
    // Timers
    // ------------------------------------------------------------------

    /// When [`Connection::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = earliest(self.rto_deadline, self.tlp_deadline);
        t = earliest(t, self.rack_deadline);
        t = earliest(t, self.persist_deadline);
        t = earliest(t, self.delack_deadline);
        t = earliest(t, self.time_wait_deadline);
        t = earliest(t, self.fin_wait2_deadline);
        t = earliest(t, self.user_timeout_deadline());
        t = earliest(t, self.path_mtu_expires);
        earliest(t, self.keepalive_deadline)
    }

    /// When the user timeout (RFC 5482, RFC 9293 3.10.8) ends the connection if the peer
    /// makes no progress before.
    fn user_timeout_deadline(&self) -> Option<Instant> {
        Some(self.stalled_since? + self.cfg.user_timeout?)
    }

    /// Starts or stops the user timeout's clock: it runs while data waits on the peer
    /// (unacknowledged, or unsent, e.g. behind a zero window); progress restarts it.
    fn update_stall(&mut self, now: Instant) {
        if self.cfg.user_timeout.is_none() {
            return;
        }
        let waiting =
            self.state.synchronized() && (self.snd_una < self.snd_max() || self.has_new_data());
        if !waiting {
            self.stalled_since = None;
        } else if self.stalled_since.is_none() {
            self.stalled_since = Some(now);
        }
    }

    /// Whether a RST is due (an abort's, or one answering a segment): it is the first thing
    /// [`Connection::poll_transmit`] writes, whatever the state, and stays due until a buffer
    /// holds it.
    pub fn rst_due(&self) -> bool {
        self.pending_rst.is_some()
    }

    /// Whether [`Connection::poll_transmit`] has something to emit now.
    pub fn wants_transmit(&self) -> bool {
        self.pending_rst.is_some()
            || self.syn_due
            || self.ack_now
            || self.probe_due
            || self.lost_count > 0
            || self.has_new_data()
    }

    fn has_new_data(&self) -> bool {
        self.state.may_send_queued()
            && (self.snd_nxt < self.data_end() || (self.fin_queued && !self.fin_sent))
    }

    /// Run expired timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.user_timeout_deadline().is_some_and(|d| d <= now) {
            self.stats.user_timeouts += 1;
            self.abort_timed_out();
            return;
        }
        self.update_stall(now);
        if self.time_wait_deadline.is_some_and(|d| d <= now) {
            self.time_wait_deadline = None;
            self.enter_closed(Some(Event::Closed));
            return;
        }
        if self.fin_wait2_deadline.is_some_and(|d| d <= now) {
            // The peer never closed its side: reset it (its CLOSE-WAIT learns the
            // connection is gone) and forget the connection.
            self.stats.fin_wait2_timeouts += 1;
            self.queue_reset();
            self.enter_closed(Some(Event::Closed));
            return;
        }
        if self.delack_deadline.is_some_and(|d| d <= now) {
            self.delack_deadline = None;
            if self.ack_pending {
                self.ack_now = true;
            }
        }
        if self.path_mtu_expires.is_some_and(|d| d <= now) {
            self.expire_path_mtu();
        }
        if self.rack_deadline.is_some_and(|d| d <= now) {
            self.rack_deadline = None;
            self.rack_detect_loss(now);
        }
        if self.tlp_deadline.is_some_and(|d| d <= now) {
            self.tlp_deadline = None;
            self.on_tlp_timeout(now);
        }
        if self.rto_deadline.is_some_and(|d| d <= now) {
            self.rto_deadline = None;
            self.on_rto(now);
        }
        if self.persist_deadline.is_some_and(|d| d <= now) {
            self.persist_deadline = None;
            if self.persist_unanswered >= self.cfg.max_retransmissions {
                // Nothing acceptable heard across as many probes as retransmissions are
                // allowed: gone (the window was shut, so no retransmission timer ran).
                self.abort_timed_out();
                return;
            }
            if self.orphaned && self.fin_queued && !self.fin_sent && self.snd_nxt >= self.data_end()
            {
                // Only our FIN waits for the window, and nobody will read or close any more: a
                // peer answering every probe with a zero window would hold the connection for
                // good. At most as many probes as retransmissions (as Linux bounds an orphan's
                // probes, `tcp_orphan_retries`).
                self.orphan_fin_probes += 1;
                if self.orphan_fin_probes > self.cfg.max_retransmissions {
                    self.abort_timed_out();
                    return;
                }
            }
            self.persist_unanswered += 1;
            self.probe_due = true;
            self.sws_override = true;
            self.stats.probes += 1;
            self.stats.window_probes += 1;
            self.persist_backoff = (self.persist_backoff + 1).min(16);
        }
        if self.keepalive_deadline.is_some_and(|d| d <= now) {
            self.keepalive_deadline = None;
            if let Some((idle, interval, count)) = self.cfg.keepalive {
                // "Keep-alive packets MUST only be sent when no sent data is outstanding"
                // (RFC 9293 3.8.4, MUST-26): while data is in flight or waits to go, the
                // retransmission and persist timers and the user timeout watch the peer.
                if self.snd_una < self.snd_max() || self.has_new_data() {
                    self.keepalive_unanswered = 0;
                    self.keepalive_deadline = Some(now + idle.max(MIN_KEEPALIVE_INTERVAL));
                    return;
                }
                let quiet_until = self.last_heard + idle;
                if self.keepalive_unanswered == 0 && quiet_until > now {
                    // Heard from the peer within `idle`: no probe yet.
                    self.keepalive_deadline = Some(quiet_until);
                    return;
                }
                // At least one probe, and not one every turn (`Config::keepalive`).
                if self.keepalive_unanswered >= count.max(1) {
                    self.abort_timed_out();
                    return;
                }
                self.keepalive_unanswered += 1;
                self.probe_due = true;
                self.stats.probes += 1;
                self.keepalive_deadline = Some(now + interval.max(MIN_KEEPALIVE_INTERVAL));
            }
        }
    }

    /// Queues a RST of our own (an abort's or a timeout's). Its sequence number is SND.NXT
    /// past any FIN we sent, which is the peer's RCV.NXT exactly once it has our FIN (RFC 5961
    /// 3.2 takes only that), and inside its window if the FIN was lost (the peer then sends a
    /// challenge ACK, which the closed connection answers with a RST it accepts); but no
    /// further than the window the peer offered (as Linux's `tcp_acceptable_seq`: a FIN sent
    /// into a zero window may have been dropped). Before the FIN, the two are the same.
    fn queue_reset(&mut self) {
        let edge = self.snd_una.saturating_add(self.snd_wnd);
        self.pending_rst = Some(PendingRst {
            seq: self.snd.seq_of(self.snd_max().min(edge)),
            ack: None,
        });
    }

    fn abort_timed_out(&mut self) {
        if self.state.synchronized() {
            self.queue_reset();
        }
        self.enter_closed(Some(Event::TimedOut));
    }

    fn on_rto(&mut self, now: Instant) {
        self.stats.rto_expirations += 1;
        self.rto_retries += 1;
        if self.rto_retries == 1 {
            self.rto_series_start = now;
        }
        let limit = match self.state {
            // A half-open connection ties up a listener's backlog: bounded like Linux's
            // tcp_synack_retries (5: about a minute with a 1 s initial RTO).
            State::SynReceived => self.cfg.max_synack_retransmissions,
            _ => self.cfg.max_retransmissions,
        };
        // The limit counts timeouts that back off. A new RTT sample (a SACK, say) collapses
        // the backoff (RFC 6298 5.7), so timeouts may come closer together: the series also
        // has to have lasted as long as `limit` backed-off timeouts from the floor would
        // (as Linux's tcp_retries2 is a time), or a peer that SACKs while one segment is
        // stuck would be given up on within a few hundred milliseconds.
        if self.rto_retries > limit && now - self.rto_series_start >= self.give_up_after(limit) {
            self.abort_timed_out();
            return;
        }
        self.rtt.back_off();
        match self.state {
            State::SynSent | State::SynReceived => {
                self.syn_due = true;
                self.syn_retransmitted = true;
                self.syn_timed_out = true;
                return;
            }
            State::Closed | State::TimeWait => return,
            _ => {}
        }
        if self.scoreboard.is_empty() {
            return;
        }
        // RFC 6298 5.4-5.6 and RFC 5681 3.1: loss window, everything
        // outstanding (not SACKed) is to be resent, slow start again.
        let flight = self.snd_max() - self.snd_una;
        // Only the first timeout of a series sets ssthresh (RFC 5681 3.1: "held constant" on
        // later ones). Before, each reduced again: two timeouts in a row left CUBIC 2 segments
        // of ssthresh, and an undo restored the state after the first.
        let first = self.rto_recover.is_none();
        if first {
            self.stats.rto_series += 1;
            // First timeout of a series: its retransmission's TSval decides
            // whether it was spurious (RFC 3522 3.2), and D-SACK may undo it.
            self.eifel_tsval = self.ts_enabled.then(|| self.tsval(now));
            self.begin_undo_episode();
        }
        self.cc
            .on_retransmission_timeout(now, flight, u32::from(self.emss), first);
        // A SACKed segment at the cumulative point when the timer fires: the peer discarded
        // what it SACKed (RFC 2018 section 8: after a timeout the sender SHOULD turn off its
        // SACKed bits), or it would have acknowledged it. Everything goes again.
        if self
            .scoreboard
            .front()
            .is_some_and(|e| e.state == SegState::Sacked)
        {
            self.forget_sacks();
        }
        for e in self.scoreboard.iter_mut() {
            if e.state == SegState::InFlight {
                e.state = SegState::Lost;
                self.lost_floor = self.lost_floor.min(e.start);
                self.lost_count += 1;
            }
        }
        self.pipe = 0;
        self.dupack_credit = 0;
        self.dupacks = 0;
        self.limited_transmit = 0;
        self.ignore_cwnd_credit = 0;
        self.fast_recovery = None;
        self.rto_recover = Some(self.snd_max());
        self.tlp_deadline = None;
        self.tlp_outstanding = false;
        self.rack_deadline = None;
        self.rto_deadline = Some(now + self.rtt.rto());
    }

    /// How long a series of `limit` retransmission timeouts lasts at the least: each
    /// doubling from `Config::min_rto` (16 times at most, as the backoff does), up to
    /// `Config::max_rto`.
    fn give_up_after(&self, limit: u32) -> Duration {
        let max = self.cfg.max_rto.max(self.cfg.min_rto);
        (0..limit.min(64))
            .map(|k| {
                self.cfg
                    .min_rto
                    .checked_mul(1u32 << k.min(16))
                    .map_or(max, |d| d.min(max))
            })
            .fold(Duration::ZERO, Duration::saturating_add)
    }

    fn on_tlp_timeout(&mut self, now: Instant) {
        // RFC 8985 7.3: send one probe, new data if possible, else the last
        // segment sent.
        // In fast recovery only to find a lost retransmission when nothing
        // else is going out: while segments marked lost wait for the window,
        // the ACK clock drives them and a probe would only add to the queue.
        if self.rto_recover.is_some()
            || self.scoreboard.is_empty()
            || (self.fast_recovery.is_some() && self.lost_count > 0)
        {
            return;
        }
        self.stats.tlp_probes += 1;
        self.tlp_outstanding = true;
        if self.new_segment_may_go() {
            self.grant_cwnd_credit();
        } else if let Some(last) = self
            .scoreboard
            .iter_mut()
            .rev()
            .find(|e| e.state == SegState::InFlight)
        {
            last.state = SegState::Lost;
            self.lost_floor = self.lost_floor.min(last.start);
            self.pipe -= last.seq_len();
            self.lost_count += 1;
            self.grant_cwnd_credit();
        }
        self.rto_deadline = Some(now + self.rtt.rto());
    }

    /// Whether a window of `window` octets from `ack_pos` (the stream position acknowledged)
    /// lets a segment of queued data out (true with nothing queued).
    fn window_fits_next(&self, ack_pos: u64, window: u64) -> bool {
        if self.snd_nxt >= self.data_end() {
            // Only a FIN may wait: it takes one sequence number of the window.
            return !self.fin_queued || self.fin_sent || ack_pos + window > self.snd_nxt;
        }
        self.window_allows(ack_pos + window) > 0
    }

    /// Octets of the next segment of queued data a peer window whose right edge is at
    /// `wnd_right` lets out: the next segment whole, or, if the window holds at least half
    /// the largest one the peer offered (sender SWS avoidance, RFC 9293 3.8.6.2.1), as much
    /// as it holds (in record modes, of whole records: a record is never split for the
    /// window); 0 if none.
    fn window_allows(&self, wnd_right: u64) -> u64 {
        let len = self.next_segment_len();
        let wnd_avail = wnd_right.saturating_sub(self.snd_nxt);
        if len <= wnd_avail {
            return len;
        }
        // Less than the segment only into at least half the largest window the peer offered
        // (sender SWS avoidance): a peer whose whole window is smaller than a segment still
        // gets data, a window opening a little at a time does not draw small segments.
        // Unless the persist timer fired with data held back (RFC 9293 3.8.6.2.1 (4): "to avoid
        // a resulting deadlock, it is necessary to have a timeout to force transmission of
        // data"): a window kept below both, with the peer waiting for octets we hold, would
        // never move. The persist timer is that timeout, as Linux's `tcp_write_wakeup`.
        if wnd_avail == 0 || (wnd_avail < self.max_snd_wnd / 2 && !self.sws_override) {
            return 0;
        }
        match self.cfg.tx_mode {
            // The whole records that fit: a record is never split for the window.
            TxMode::Records | TxMode::Source => self.records_within(wnd_avail),
            TxMode::Stream => wnd_avail,
        }
    }

    /// Octets of the whole records from SND.NXT that fit in `room`, as one segment; 0 if the
    /// first does not fit.
    fn records_within(&self, room: u64) -> u64 {
        let mut len = 0;
        for &end in self.record_ends.iter() {
            let l = end - self.snd_nxt;
            if l > room {
                break;
            }
            len = l;
        }
        len
    }

    /// Whether a segment of new data could go out now but for the congestion window (RFC 8985
    /// 7.3's "the receive window allows"): one is queued, it fits the peer's window, and
    /// Nagle would not hold it. Otherwise the probe resends the last segment: a credit granted
    /// for new data that cannot go out would wait, unused, for a later send.
    fn new_segment_may_go(&self) -> bool {
        if self.snd_nxt >= self.data_end() || !self.state.may_send_queued() {
            return false;
        }
        let len = self.window_allows(self.snd_una + self.snd_wnd);
        len > 0 && !self.nagle_holds(len)
    }

    /// Whether Nagle's algorithm (RFC 1122 4.2.3.4) holds back a new segment of `len` octets:
    /// it is less than a full one and data is unacknowledged. With the TCP RDMA option's
    /// sections queued a full segment is what the position allows (cut where a transfer's
    /// section starts or ends, and short of its option's octets: draft-csapuntz-tcprdma-00
    /// 3.4), so that only a segment short for want of data or window is held, as without.
    fn nagle_holds(&self, len: u64) -> bool {
        if !self.cfg.nagle || self.snd_max() <= self.snd_una {
            return false;
        }
        let emss = u64::from(self.emss);
        let full = if self.cfg.tx_mode == TxMode::Stream && !self.rdma_tx.is_empty() {
            self.rdma_tx.segment_len(self.snd_nxt, u64::MAX, emss)
        } else {
            emss
        };
        len < full
    }

    /// Lets the next segment out whatever the congestion window says (a fast retransmit, a
    /// loss probe: RFC 5681 3.2 step 4, RFC 6675 5 step 4.3, RFC 8985 7.3). Credits not used
    /// by then do not pile up: at most two wait (a probe and a retransmission in one turn),
    /// and a retransmission timeout or the end of recovery clears them.
    fn grant_cwnd_credit(&mut self) {
        self.ignore_cwnd_credit = (self.ignore_cwnd_credit + 1).min(2);
    }

    fn arm_tlp(&mut self, now: Instant) {
        // Also in fast recovery (RFC 8985 arms it only outside): with a
        // window of two or three segments a lost retransmission is seen by
        // RACK only when something sent after it is delivered, and with
        // nothing more allowed out, only the RTO would end the wait.
        if !self.sack_enabled
            || !self.cfg.rack_tlp
            || self.rto_recover.is_some()
            || self.tlp_outstanding
        {
            return;
        }
        // 2 SRTT, not before an ACK is overdue by the measured variation
        // either (SRTT + 4 RTTVAR): with ACKs that come late by a varying
        // amount (a loaded receiver), 2 SRTT alone probes before they arrive.
        let Some(base) = self.rtt.pto_base() else {
            return;
        };
        let pto = match self.rtt.srtt() {
            // A lone segment's ACK may be delayed (RFC 8985 7.2).
            Some(srtt) if self.pipe <= u64::from(self.emss) => {
                (srtt * 2 + self.cfg.peer_max_ack_delay).max(base)
            }
            _ => base,
        };
        let pto = pto.max(Duration::from_micros(10));
        // RFC 8985 7.2: a probe that would come after the RTO goes at the RTO's time instead
        // (and takes its place: `on_tlp_timeout` arms the RTO again). Dropped, as it was, a
        // path whose SRTT is above half the RTO floor never probed: PTO (at least 2 SRTT, or
        // SRTT + 4 RTTVAR) is the RTO there, and every lost tail was a timeout.
        let deadline = now + pto;
        self.tlp_deadline = Some(self.rto_deadline.map_or(deadline, |r| deadline.min(r)));
    }

    // ------------------------------------------------------------------
    // Receiving
    // ------------------------------------------------------------------

    /// Process a segment addressed to this connection (RFC 9293 3.10.7).
    /// In [`RxMode::PassUp`] new data is given to `pass_up` before this
    /// returns; in [`RxMode::InOrder`] it is buffered for
    /// [`Connection::recv`]. `pass_up` may answer with a [`TakeBack`]
    /// ([`PassUpReply`]): those octets are taken back before the segment's FIN.
    pub fn handle_segment<R: PassUpReply, F: FnMut(PassedUp<'_>) -> R>(
        &mut self,
        now: Instant,
        seg: &SegmentRepr<'_>,
        mut pass_up: F,
    ) {
        let mut pass_up = |p: PassedUp<'_>| pass_up(p).take_back();
        self.stats.segments_in += 1;
        match self.state {
            State::Closed => {}
            State::SynSent => self.on_segment_syn_sent(now, seg),
            _ => self.on_segment_synchronized(now, seg, &mut pass_up),
        }
        self.update_stall(now);
    }

    fn take_syn_options(&mut self, syn: &SegmentRepr<'_>, now: Instant) {
        self.rcv = SeqAnchor { isn: syn.seq };
        self.rcv_nxt = 0;
        self.rcv_read = 0;
        self.peer_mss = syn.options.mss.unwrap_or(DEFAULT_SEND_MSS).max(64);
        // RFC 7323 2.2: both sides must send the option for scaling to apply.
        match (syn.options.window_scale, self.offered_wscale) {
            (Some(s), true) => self.snd_wscale = s.min(14),
            _ => {
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
                self.offered_wscale = false;
            }
        }
        self.sack_enabled = self.cfg.sack && syn.options.sack_permitted;
        // Any RDMA option on the SYN (or SYN-ACK) is the peer's offer; its 2-octet form is
        // the one meant for it (draft-csapuntz-tcprdma-00 3.2).
        self.rdma_option_enabled = self.cfg.rdma_option && syn.options.rdma.is_some();
        if let (true, Some((tsval, _))) = (self.cfg.timestamps, syn.options.timestamp) {
            self.ts_enabled = true;
            self.ts_recent = Some(tsval);
            self.ts_recent_at = now;
        } else {
            self.ts_enabled = false;
        }
        self.data_header = DataHeader::new(&self.tuple, self.ts_enabled, self.cfg.sent_tos());
        // The window in a SYN is never scaled (RFC 7323 2.2).
        self.snd_wnd = u64::from(syn.window);
        self.max_snd_wnd = self.snd_wnd;
        self.snd_wl1 = syn.seq;
        self.snd_wl2 = syn.ack;
        let _ = now;
    }

    fn on_segment_syn_sent(&mut self, now: Instant, seg: &SegmentRepr<'_>) {
        // RFC 9293 3.10.7.3.
        let iss = self.snd.isn;
        let ack_ok = seg.flags.ack && seg.ack == iss.wrapping_add(1);
        if seg.flags.ack && !ack_ok {
            if !seg.flags.rst {
                self.pending_rst = Some(PendingRst {
                    seq: seg.ack,
                    ack: None,
                });
            }
            return;
        }
        if seg.flags.rst {
            if ack_ok {
                self.enter_closed(Some(Event::Reset));
            }
            return;
        }
        if !seg.flags.syn {
            return;
        }
        self.take_syn_options(seg, now);
        self.cc = self.cfg.congestion.build(0, self.cfg.slow_start);
        self.recompute_emss(false);
        self.reset_cc();
        if ack_ok {
            self.syn_acked = true;
            self.syn_due = false;
            self.sample_handshake(seg, now);
            self.rto_deadline = None;
            self.rto_retries = 0;
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
            self.establish(now);
            self.ack_now = true;
        } else {
            // Simultaneous open: SYN-RECEIVED, send SYN-ACK.
            self.state = State::SynReceived;
            self.syn_due = true;
        }
    }

    /// The handshake's RTT sample from `seg`, which acknowledges our SYN (SYN-ACK), if it gives
    /// one ([`handshake_sent_at`](Self::handshake_sent_at)); a handshake whose SYN timed out
    /// and gave none starts data transmission with a 3 s RTO (RFC 6298 5.7).
    fn sample_handshake(&mut self, seg: &SegmentRepr<'_>, now: Instant) {
        if let Some(t) = self.handshake_sent_at(seg) {
            self.rtt.sample(now - t);
        } else if self.syn_timed_out {
            self.rtt.fall_back_after_syn_timeout();
        }
    }

    /// When the SYN (SYN-ACK) that `seg` answers went, for the handshake's RTT sample: the
    /// only copy's time if it went once (Karn's algorithm, RFC 6298 3); if it went again, the
    /// latest copy's, provided `seg` echoes that copy's timestamp (RFC 7323 4.1: the TSecr
    /// names the transmission it answers, as Linux measures it). Otherwise none, and the RTO
    /// stays backed off until a later sample.
    fn handshake_sent_at(&self, seg: &SegmentRepr<'_>) -> Option<Instant> {
        if !self.syn_retransmitted {
            return self.syn_sent_at;
        }
        let (at, tsval) = self.syn_last_sent?;
        let (_, tsecr) = seg.options.timestamp?;
        (tsecr == tsval).then_some(at)
    }

    fn reset_cc(&mut self) {
        let iw = u64::from(self.cfg.initial_window_segments) * u64::from(self.emss);
        self.cc = self.cfg.congestion.build(iw, self.cfg.slow_start);
    }

    fn establish(&mut self, now: Instant) {
        self.state = State::Established;
        self.recompute_emss(false);
        self.reset_cc();
        self.events.push_back(Event::Connected);
        if let Some((idle, _, _)) = self.cfg.keepalive {
            self.keepalive_deadline = Some(now + idle);
        }
    }

    /// `InOrder`: the receive buffer's nominal size (`recv_buffer`), what the window offers
    /// before rounding.
    fn nominal_recv_buffer(&self) -> u64 {
        self.cfg.recv_buffer.max(1) as u64
    }

    /// The right edge of the receive window: what the buffer (or the upper layer) has room
    /// for, or the edge already offered if that lies further (RFC 9293 3.8.6.2.2: offered
    /// window is not taken back).
    fn rcv_window_right(&self) -> u64 {
        let right = match self.cfg.rx_mode {
            RxMode::InOrder => self.rcv_read + self.nominal_recv_buffer(),
            RxMode::PassUp => self.rcv_nxt + self.ulp_window,
        };
        right.max(self.rcv_adv_right)
    }

    /// `InOrder`: the stream offset just past what the ring can hold (nominal buffer plus
    /// the rounding room).
    fn rcv_ring_right(&self) -> u64 {
        self.rcv_read + self.rcv_buf.len() as u64
    }

    /// The furthest right edge the receiver can hold data up to: the whole ring (`InOrder`,
    /// nominal buffer plus the rounding room), the upper layer's window (`PassUp`, which
    /// grants no more), and never less than the edge already offered.
    fn rcv_buffer_limit(&self) -> u64 {
        let limit = match self.cfg.rx_mode {
            RxMode::InOrder => self.rcv_ring_right(),
            RxMode::PassUp => self.rcv_nxt + self.ulp_window,
        };
        limit.max(self.rcv_window_right())
    }

    /// Whether a reply to a segment outside the window (a challenge ACK, a SYN-ACK sent again)
    /// may go now: at most `Config::challenge_ack_limit` a second (RFC 5961 7). Counts it.
    fn out_of_window_reply_allowed(&mut self, now: Instant) -> bool {
        if now - self.challenge_window_start >= Duration::from_secs(1) {
            self.challenge_window_start = now;
            self.challenge_count = 0;
        }
        if self.challenge_count < self.cfg.challenge_ack_limit {
            self.challenge_count += 1;
            return true;
        }
        false
    }

    fn challenge_ack(&mut self, now: Instant) {
        if self.out_of_window_reply_allowed(now) {
            self.stats.challenge_acks += 1;
            if !self.challenge_due {
                self.ack_due_before_challenge = self.ack_now;
            }
            self.ack_now = true;
            self.challenge_due = true;
        }
    }

    /// The duplicate ACK answering a segment outside the window or failing PAWS: always for
    /// one that carries data or a FIN, or is a keepalive probe (SEG.SEQ = RCV.NXT - 1, RFC
    /// 9293 3.8.4; a prober may ask more often than the interval), at most one per
    /// `Config::invalid_ack_interval` for the rest.
    fn ack_invalid(&mut self, now: Instant, seg: &SegmentRepr<'_>) {
        let keepalive = seg.seq == self.rcv_nxt().wrapping_sub(1);
        if seg.seq_len() == 0 && !keepalive {
            if self
                .last_invalid_ack
                .is_some_and(|t| now - t < self.cfg.invalid_ack_interval)
            {
                self.stats.invalid_acks_skipped += 1;
                return;
            }
            self.last_invalid_ack = Some(now);
        }
        self.ack_now = true;
    }

    /// True if the last segment handled made a challenge ACK due (RFC 5961 7); clears the
    /// mark. A connection table asks after each segment to apply its global limit.
    pub fn take_challenge_ack(&mut self) -> bool {
        std::mem::take(&mut self.challenge_due)
    }

    /// Withdraws the challenge ACK the last segment made due (a global limit said no): a
    /// segment that calls for a challenge ACK is otherwise dropped, so the only ACK still due
    /// is one an earlier segment made due (an out-of-order segment's duplicate ACK, say).
    pub fn withdraw_challenge_ack(&mut self) {
        self.ack_now = self.ack_due_before_challenge;
        self.stats.challenge_acks = self.stats.challenge_acks.saturating_sub(1);
    }

    /// Timestamp bookkeeping (RFC 7323 4.3): the segment's TSval becomes TS.Recent if the
    /// segment starts at or below Last.ACK.sent and the TSval is not older.
    fn note_ts_recent(&mut self, now: Instant, seg: &SegmentRepr<'_>) {
        if !self.ts_enabled {
            return;
        }
        if let Some((tsval, _)) = seg.options.timestamp {
            if seq_le(seg.seq, self.last_ack_sent)
                && self.ts_recent.is_none_or(|r| seq_ge(tsval, r))
            {
                self.ts_recent = Some(tsval);
                self.ts_recent_at = now;
            }
        }
    }

    fn on_segment_synchronized(
        &mut self,
        now: Instant,
        seg: &SegmentRepr<'_>,
        pass_up: &mut dyn FnMut(PassedUp<'_>) -> Option<TakeBack>,
    ) {
        let rcv_nxt_seq = self.rcv_nxt();
        // PAWS (RFC 7323 5.3 R1), with a reordering tolerance
        // (`Config::paws_tolerance`; our TS clock ticks in milliseconds).
        if self.ts_enabled && !seg.flags.rst {
            if let (Some((tsval, _)), Some(recent)) = (seg.options.timestamp, self.ts_recent) {
                let tolerance = u32::try_from(self.cfg.paws_tolerance.as_millis())
                    .unwrap_or(u32::MAX)
                    .min(1 << 30);
                if seq_lt(tsval.wrapping_add(tolerance), recent) {
                    if now - self.ts_recent_at > PAWS_IDLE_LIMIT {
                        // RFC 7323 5.5: after more than 24 days idle the peer's clock may
                        // have moved on by more than half its range, and TS.Recent is
                        // invalid: the segment is judged without it and may set it anew.
                        self.ts_recent = None;
                    } else {
                        self.stats.paws_drops += 1;
                        self.ack_invalid(now, seg);
                        return;
                    }
                }
            }
        }
        // The SYN that opened this connection, again: our SYN-ACK did not reach its sender.
        // RFC 9293 3.10.7.4 would only ACK it (it is not acceptable), and an ACK without SYN
        // is dropped in SYN-SENT (3.10.7.3), so the handshake would wait for our own
        // retransmission timer. The SYN-ACK goes again now instead (as Linux answers it),
        // rate-limited as challenge ACKs are; its ACK is measured only if it echoes this
        // copy's timestamp (`handshake_sent_at`).
        if self.state == State::SynReceived
            && seg.flags.syn
            && !seg.flags.ack
            && !seg.flags.rst
            && seg.seq == self.rcv.isn
        {
            // Echoed in the SYN-ACK, its timestamp measures the handshake for the peer (SEG.SEQ
            // is below Last.ACK.sent).
            self.note_ts_recent(now, seg);
            if self.out_of_window_reply_allowed(now) {
                self.syn_due = true;
                self.syn_retransmitted = true;
            }
            return;
        }
        // Acceptability (RFC 9293 3.10.7.4 first).
        let seg_len = i64::from(seg.seq_len());
        let right = self.rcv_window_right();
        let wnd = (right - self.rcv_nxt) as i64 - i64::from(self.fin_received);
        let wnd = wnd.max(0);
        let rel = seq_diff(seg.seq, rcv_nxt_seq);
        let acceptable = match (seg_len, wnd) {
            (0, 0) => rel == 0,
            (0, _) => rel >= 0 && rel < wnd,
            (_, 0) => false,
            (_, _) => (rel >= 0 && rel < wnd) || (rel + seg_len > 0 && rel + seg_len - 1 < wnd),
        };
        // Zero window: still process ACK/RST on an exact-sequence segment.
        let zero_window_ok = wnd == 0 && rel == 0;
        if !acceptable && !zero_window_ok {
            self.stats.out_of_window += 1;
            if seg.flags.syn && !seg.flags.rst && self.state != State::SynReceived {
                // RFC 5961 4.2: a SYN, whatever its sequence number, draws a (rate-limited)
                // challenge ACK.
                self.challenge_ack(now);
                return;
            }
            if !seg.payload.is_empty() && rel < 0 {
                // An old duplicate: report it (RFC 2883 4.1.1). `rel` counts from RCV.NXT
                // past a received FIN; the stream offset does not.
                let start = self.rcv_nxt as i64 + i64::from(self.fin_received) + rel;
                let end = start + seg.payload.len() as i64;
                if start >= 0 && end as u64 <= self.rcv_nxt {
                    self.note_duplicate(start as u64, end as u64);
                }
            }
            if !seg.flags.rst {
                self.ack_invalid(now, seg);
                // Only the peer's FIN again restarts the 2 MSL (RFC 9293 3.10.7.4): not any
                // FIN outside the window, which a blind sender could repeat to hold the
                // connection in TIME-WAIT for good.
                let its_fin_again = seg.flags.fin
                    && seg.seq.wrapping_add(seg.seq_len()) == rcv_nxt_seq
                    && self.fin_received;
                if its_fin_again && self.state == State::TimeWait {
                    // At most until `TIME_WAIT_RESTARTS` periods after TIME-WAIT began: a peer
                    // resending its FIN just inside each period would hold it for good.
                    let restarted = now + self.cfg.time_wait;
                    self.time_wait_deadline = Some(
                        self.time_wait_last
                            .map_or(restarted, |last| restarted.min(last)),
                    );
                }
            }
            return;
        }
        // RST (RFC 5961 3.2).
        if seg.flags.rst {
            if rel == 0 {
                self.enter_closed(Some(if self.state == State::TimeWait {
                    Event::Closed
                } else {
                    Event::Reset
                }));
            } else {
                self.challenge_ack(now);
            }
            return;
        }
        // SYN in a synchronized state (RFC 5961 4.2); a retransmitted SYN in SYN-RECEIVED
        // was answered above.
        if seg.flags.syn {
            self.challenge_ack(now);
            return;
        }
        if !seg.flags.ack {
            return;
        }
        // ACK (RFC 9293 3.10.7.4 fifth, RFC 5961 5.2).
        if self.state == State::SynReceived {
            if seg.ack == self.snd.isn.wrapping_add(1) {
                self.syn_acked = true;
                self.syn_due = false;
                self.sample_handshake(seg, now);
                self.rto_deadline = None;
                self.rto_retries = 0;
                self.snd_wnd = u64::from(seg.window) << self.snd_wscale;
                self.max_snd_wnd = self.snd_wnd;
                self.snd_wl1 = seg.seq;
                self.snd_wl2 = seg.ack;
                self.establish(now);
                if self.fin_queued {
                    self.state = State::FinWait1;
                }
            } else {
                self.pending_rst = Some(PendingRst {
                    seq: seg.ack,
                    ack: None,
                });
                return;
            }
        } else if !self.process_ack(now, seg) {
            return;
        }
        self.heard_from_peer(now);
        // TS.Recent (RFC 7323 5.3 R3) only from a segment whose ACK was acceptable: updated
        // before the ACK check (as R3's order has it), a blind segment that merely overlaps
        // RCV.NXT could set a TSval far ahead, and PAWS would then drop every segment of the
        // real peer (Linux updates it after the check too).
        self.note_ts_recent(now, seg);
        // Data (RFC 9293 3.10.7.4 seventh).
        let data_ok = matches!(
            self.state,
            State::Established | State::FinWait1 | State::FinWait2
        );
        if data_ok && (!seg.payload.is_empty() || seg.flags.fin) {
            self.process_data(now, seg, rel, pass_up);
        } else if seg.flags.fin && self.state == State::TimeWait {
            // A FIN at or past RCV.NXT: not the peer's FIN again (that one is behind RCV.NXT
            // and restarts the 2 MSL above), so acknowledged without restarting it.
            self.ack_now = true;
        } else if seg.flags.fin || !seg.payload.is_empty() {
            // Retransmitted FIN or data in CLOSE-WAIT/CLOSING/LAST-ACK.
            self.ack_now = true;
        }
    }

    fn snd_max(&self) -> u64 {
        self.snd_nxt + u64::from(self.fin_sent)
    }

    /// Keepalive (RFC 9293 3.8.4, RFC 1122 4.2.3.6): the peer was heard, by a segment that
    /// passed the sequence check with an acceptable ACK (an answered probe among them), so the
    /// idle time starts again. Not by any segment on the connection's four-tuple: an off-path
    /// sender of segments that are then dropped would keep a dead peer's connection forever.
    /// Not in TIME-WAIT, which is quiet for its 2 MSL (RFC 9293 3.6.1).
    fn heard_from_peer(&mut self, now: Instant) {
        let Some((idle, _, _)) = self.cfg.keepalive else {
            return;
        };
        if self.state == State::TimeWait {
            return;
        }
        self.last_heard = now;
        if self.keepalive_unanswered > 0 {
            // A probe was answered (or anything else came): back to idle watching.
            self.keepalive_unanswered = 0;
            self.keepalive_deadline = Some(now + idle);
        } else if self.keepalive_deadline.is_none() {
            self.keepalive_deadline = Some(now + idle);
        }
    }

    /// Returns false when the segment must be dropped.
    fn process_ack(&mut self, now: Instant, seg: &SegmentRepr<'_>) -> bool {
        let snd_max = self.snd_max();
        let Some(ack_pos) = self.snd.pos_of(seg.ack, self.snd_una) else {
            self.challenge_ack(now);
            return false;
        };
        if ack_pos > snd_max {
            // Acks something not yet sent (RFC 9293, RFC 5961 5.2): an ACK, throttled as
            // challenge ACKs are (RFC 5961 7), so that two ends out of step do not trade ACKs
            // as fast as they can.
            self.challenge_ack(now);
            return false;
        }
        if ack_pos + self.max_snd_wnd.max(1) < self.snd_una {
            self.challenge_ack(now);
            return false;
        }
        let window = u64::from(seg.window) << self.snd_wscale;
        let window_changed = window != self.snd_wnd;
        // Window update (RFC 9293 3.10.7.4, SND.WL1/WL2).
        if seq_lt(self.snd_wl1, seg.seq)
            || (self.snd_wl1 == seg.seq && seq_le(self.snd_wl2, seg.ack))
        {
            self.snd_wnd = window;
            self.max_snd_wnd = self.max_snd_wnd.max(window);
            self.snd_wl1 = seg.seq;
            self.snd_wl2 = seg.ack;
            // An acceptable ACK, the answer to a window probe among them.
            self.persist_unanswered = 0;
            if self.window_blocked && self.window_fits_next(ack_pos, window) {
                self.window_blocked = false;
                self.persist_deadline = None;
                self.persist_backoff = 0;
                // The window opened: progress for the user timeout. Not a window too small
                // for the next segment: a peer alternating 0 and 1 would hold the connection
                // past its user timeout with nothing ever moving.
                self.stalled_since = None;
            }
        }
        let newly_acked = ack_pos.saturating_sub(self.snd_una);
        self.ack_tsecr = if self.ts_enabled {
            seg.options.timestamp.map(|(_, ecr)| ecr)
        } else {
            None
        };
        let mut delivered_any = false;
        let mut timing = AckTiming::default();
        let entries_before = self.scoreboard.len();
        if newly_acked > 0 {
            self.eifel_check();
            self.on_cumulative_ack(now, ack_pos, &mut timing);
            self.sacked_spans.drop_below(ack_pos);
            delivered_any = true;
        }
        if self.sack_enabled && !seg.options.sack_blocks().is_empty() {
            delivered_any |=
                self.on_sack_blocks(now, ack_pos, seg.options.sack_blocks(), &mut timing);
        }
        if let Some(rtt) = timing.sample(now) {
            self.rtt.sample(rtt);
        }
        if delivered_any {
            self.tlp_outstanding = false;
        }
        // RFC 5681 2: a duplicate acknowledges SND.UNA itself, not less (an old ACK, late).
        let is_dupack = ack_pos == self.snd_una
            && newly_acked == 0
            && seg.payload.is_empty()
            && !seg.flags.fin
            && !window_changed
            && self.snd_max() > self.snd_una;
        if newly_acked > 0 {
            self.cwnd_use.on_ack(ack_pos, self.snd_max());
            self.dupacks = 0;
            // Limited transmit's allowance belongs to the duplicate ACKs of one run (RFC 3042
            // 2: "upon the receipt of the first two consecutive duplicate ACKs"): unused, it
            // ends with them, or a receiver repeating "one new ACK, two duplicates" would
            // pile up credit to send past the congestion window later.
            self.limited_transmit = 0;
            let smss = u32::from(self.emss);
            match self.fast_recovery {
                Some(recover) if self.snd_una < recover => {
                    // Partial ACK (RFC 6582 3.2 step 3): the first unacknowledged segment
                    // is resent, once it is another one. A partial ACK inside the head
                    // segment (one octet at a time: ACK division) would resend it whole,
                    // past the window, for every such ACK.
                    if !self.sack_enabled && self.scoreboard.len() < entries_before {
                        self.mark_first_lost();
                        self.dupack_credit = self
                            .dupack_credit
                            .saturating_sub(newly_acked.saturating_sub(u64::from(smss)));
                    }
                }
                Some(_) => {
                    // Full ACK: leave recovery (RFC 6582 3.2 step 3 / RFC 6675 5).
                    self.fast_recovery = None;
                    self.dupack_credit = 0;
                    self.ignore_cwnd_credit = 0;
                }
                None => {
                    // The window grows only while it is used (RFC 7661 4.1, as Linux's
                    // `tcp_is_cwnd_limited`): a peer that holds its window small while
                    // acknowledging promptly (or an application that sends little) would
                    // otherwise grow it without bound, to be spent in one burst later.
                    if self.cwnd_use.allows_growth(self.cc.cwnd()) {
                        self.cc.on_ack(now, newly_acked, smss, self.rtt.srtt());
                    } else {
                        self.cc.on_ack_unused(now);
                    }
                }
            }
            if self.snd_una >= self.snd_max() {
                // Nothing in flight: idle until the next send (`on_transmit_start`).
                self.cc.on_idle(now);
            }
            if self.rto_recover.is_some_and(|r| self.snd_una >= r) {
                self.rto_recover = None;
            }
        } else if is_dupack {
            self.dupacks = self.dupacks.saturating_add(1);
            if !self.sack_enabled {
                self.on_dupack_newreno(now);
            }
        }
        if self.sack_enabled && self.cfg.rack_tlp {
            self.rack_detect_loss(now);
        } else if self.sack_enabled {
            self.dupthresh_detect_loss(now);
        }
        // FIN acknowledged?
        if self.fin_sent && self.snd_una >= self.snd_max() {
            match self.state {
                State::FinWait1 => {
                    self.state = State::FinWait2;
                    self.fin_wait2_deadline = self.cfg.fin_wait2_timeout.map(|t| now + t);
                }
                State::Closing => self.enter_time_wait(now),
                State::LastAck => {
                    self.enter_closed(Some(Event::Closed));
                    return false;
                }
                _ => {}
            }
        }
        // Timers (RFC 6298 5.2, 5.3). Progress ends a series of timeouts: the retransmission
        // limit counts timeouts in a row, not over the connection's life.
        if self.snd_una >= self.snd_max() {
            self.rtt.reset_backoff();
            if newly_acked > 0 {
                self.rto_retries = 0;
            }
            if self.snd_nxt >= self.data_end() {
                // Everything acknowledged, nothing queued: idle from here.
                self.note_send_limit(now, None);
            }
            self.rto_deadline = None;
            self.tlp_deadline = None;
            self.rack_deadline = None;
        } else if newly_acked > 0 {
            self.rtt.reset_backoff();
            self.rto_deadline = Some(now + self.rtt.rto());
            self.rto_retries = 0;
            self.arm_tlp(now);
        } else if delivered_any && self.fast_recovery.is_some() {
            self.arm_tlp(now);
        }
        true
    }

    fn on_dupack_newreno(&mut self, now: Instant) {
        let smss = u64::from(self.emss);
        if self.fast_recovery.is_some() {
            // Each further duplicate means a segment left the network
            // (RFC 5681 3.2 step 4, expressed as pipe credit), but no more can have left
            // than are in flight (the note to step 4; Linux's `tcp_limit_reno_sacked`): a
            // burst of duplicates beyond them (Savage et al.'s "DupACK spoofing") would
            // otherwise let as many segments out at once past the window.
            self.dupack_credit = (self.dupack_credit + smss).min(self.pipe);
            return;
        }
        if self.dupacks < 3 {
            // Limited transmit (RFC 3042).
            self.limited_transmit += 1;
            return;
        }
        if self.dupacks == 3 && self.rto_recover.is_none() {
            // Fast retransmit (RFC 5681 3.2 steps 2-3, RFC 6582 3.2 step 2); recovery's own
            // rule sends from here, not limited transmit's leftovers.
            self.limited_transmit = 0;
            let flight = self.snd_max() - self.snd_una;
            self.begin_undo_episode();
            self.cc.on_congestion_event(now, flight, self.emss.into());
            self.fast_recovery = Some(self.snd_max());
            self.stats.fast_recoveries += 1;
            self.mark_first_lost();
            self.dupack_credit = (3 * smss).min(self.pipe);
        }
    }

    fn mark_first_lost(&mut self) {
        if let Some(e) = self.scoreboard.front_mut() {
            if e.state == SegState::InFlight {
                e.state = SegState::Lost;
                self.lost_floor = self.lost_floor.min(e.start);
                self.pipe -= e.seq_len();
                self.lost_count += 1;
                self.grant_cwnd_credit();
            }
        }
    }

    fn rack_update(&mut self, now: Instant, e: &TxSegment) {
        // RFC 8985 6.2 step 2: ignore possibly-spurious retransmission samples.
        let rtt = now - e.xmit_time;
        if e.retransmits > 0 && self.rtt.min_rtt().is_some_and(|m| rtt < m) {
            return;
        }
        // ... or when the ACK echoes a timestamp older than the
        // retransmission: the original was delivered.
        if e.retransmits > 0
            && self
                .ack_tsecr
                .is_some_and(|ecr| seq_lt(ecr, self.tsval(e.xmit_time)))
        {
            return;
        }
        let newer = match self.rack.xmit_ts {
            None => true,
            Some(t) => e.xmit_time > t || (e.xmit_time == t && e.end() > self.rack.end),
        };
        if newer {
            self.rack.xmit_ts = Some(e.xmit_time);
            self.rack.end = e.end();
            self.rack.rtt = rtt;
        }
    }

    /// RFC 8985 6.2 step 3: a never-retransmitted segment delivered below
    /// the highest delivered end means the path reorders.
    fn note_delivered(&mut self, e: &TxSegment) {
        if e.retransmits == 0 && e.end() < self.reo.fack {
            self.reo.seen = true;
        }
        self.reo.fack = self.reo.fack.max(e.end());
    }

    /// Takes the segments up to `ack_pos` off the scoreboard, noting in `timing` when they
    /// were sent and whether any was retransmitted.
    fn on_cumulative_ack(&mut self, now: Instant, ack_pos: u64, timing: &mut AckTiming) {
        while let Some(e) = self.scoreboard.front_mut() {
            let e_end = e.end();
            if e_end <= ack_pos {
                let e = *e;
                self.scoreboard.pop_front();
                match e.state {
                    SegState::InFlight => self.pipe -= e.seq_len(),
                    SegState::Lost => self.lost_count -= 1,
                    SegState::Sacked => {}
                }
                if e.state != SegState::Sacked {
                    self.note_delivered(&e);
                    self.rack_update(now, &e);
                    timing.note_acked(&e);
                }
            } else if e.start < ack_pos {
                // Partially acknowledged (the peer or a middlebox re-segmented).
                if e.state != SegState::Sacked {
                    timing.note_acked_part(e);
                }
                let trimmed = ack_pos - e.start;
                e.start = ack_pos;
                e.len -= trimmed as u32;
                if e.state == SegState::InFlight {
                    self.pipe -= trimmed;
                }
                break;
            } else {
                break;
            }
        }
        let data_acked = ack_pos.min(self.data_end());
        let drop = ((data_acked - self.send_buf_base) as usize).min(self.send_buf.len());
        self.send_buf.drain(..drop);
        self.send_buf_base = data_acked;
        self.rdma_tx.release_to(data_acked);
        if ack_pos > self.snd_una {
            // Progress: the user timeout's clock starts again.
            self.stalled_since = None;
        }
        self.snd_una = ack_pos;
        // RFC 2018 section 8: a receiver may discard data it has only SACKed (ours does for
        // IFT's speculative placement, `renege_from`). A SACKed segment right at the
        // cumulative point shows it did: had the peer kept it, this ACK would cover it. Every
        // SACK is then forgotten and those segments are sent again, as after a timeout
        // (RFC 6675 section 5.1 clears the scoreboard then for the same reason).
        if self
            .scoreboard
            .front()
            .is_some_and(|e| e.state == SegState::Sacked && e.start == ack_pos)
        {
            self.forget_sacks();
        }
    }

    /// The peer reneged (RFC 2018 section 8): every segment held as SACKed is lost, to be
    /// sent again (`ConnStats::peer_reneged`).
    fn forget_sacks(&mut self) {
        self.stats.peer_reneged += 1;
        self.sacked_spans.clear();
        for e in self.scoreboard.iter_mut() {
            if e.state == SegState::Sacked {
                e.state = SegState::Lost;
                self.lost_floor = self.lost_floor.min(e.start);
                self.lost_count += 1;
            }
        }
    }

    /// If scoreboard entry `i` lies wholly inside a SACKed span, the index of the first entry
    /// past the span (every one before it inside, so SACKed: see [`SackedSpans`]).
    fn past_sacked_span(&self, i: usize) -> Option<usize> {
        let e = self.scoreboard.get(i)?;
        let end = self.sacked_spans.end_of_span_holding(e.start)?;
        if e.end() > end {
            return None;
        }
        let j = self.scoreboard.partition_point(|x| x.end() <= end);
        (j > i).then_some(j)
    }

    /// Mark segments covered by SACK blocks (RFC 2018 4, RFC 6675 4), noting in `timing` when
    /// the newly SACKed ones were sent.
    fn on_sack_blocks(
        &mut self,
        now: Instant,
        ack_pos: u64,
        blocks: &[SackBlock],
        timing: &mut AckTiming,
    ) -> bool {
        let mut any = false;
        let snd_max = self.snd_max();
        for (k, b) in blocks.iter().enumerate() {
            let (Some(l), Some(r)) = (
                self.snd.pos_of(b.left, self.snd_una),
                self.snd.pos_of(b.right, self.snd_una),
            ) else {
                continue;
            };
            if l >= r || r > snd_max {
                continue;
            }
            // D-SACK (RFC 2883 4): the first block lies below the cumulative
            // ACK, or inside the second block.
            if k == 0 {
                let inside_next = blocks.get(1).is_some_and(|n| {
                    let nl = self.snd.pos_of(n.left, self.snd_una);
                    let nr = self.snd.pos_of(n.right, self.snd_una);
                    matches!((nl, nr), (Some(nl), Some(nr)) if nl <= l && r <= nr)
                });
                if r <= ack_pos || inside_next {
                    self.on_dsack(l, r);
                    timing.duplicate_reported = true;
                    continue;
                }
            }
            if l < self.snd_una {
                continue; // invalid
            }
            let mut i = self.scoreboard.partition_point(|e| e.end() <= l);
            while i < self.scoreboard.len() {
                let e = self.scoreboard[i];
                if e.start >= r {
                    break;
                }
                self.stats.sack_scan_steps += 1;
                if let Some(j) = self.past_sacked_span(i) {
                    i = j;
                    continue;
                }
                if e.start >= l && e.end() <= r && e.state != SegState::Sacked {
                    match e.state {
                        SegState::InFlight => self.pipe -= e.seq_len(),
                        SegState::Lost => self.lost_count -= 1,
                        SegState::Sacked => {}
                    }
                    self.scoreboard[i].state = SegState::Sacked;
                    self.note_delivered(&e);
                    self.rack_update(now, &e);
                    timing.note_acked(&e);
                    any = true;
                } else if e.state != SegState::Sacked {
                    // The block holds a part of it: the part may be the ACK's trigger.
                    timing.note_acked_part(&e);
                }
                i += 1;
            }
            // The entries wholly inside this block are SACKed now: their run, from the
            // first one's start to the last one's end, is a span. On entry boundaries, so
            // that spans merged later cover whole SACKed entries only, and an entry trimmed by
            // a partial cumulative ACK cannot come to lie inside one.
            let lo = self.scoreboard.partition_point(|e| e.start < l);
            let hi = self.scoreboard.partition_point(|e| e.end() <= r);
            if lo < hi {
                let (from, to) = (self.scoreboard[lo].start, self.scoreboard[hi - 1].end());
                self.sacked_spans.add(from, to);
            }
        }
        any
    }

    fn enter_loss_recovery(&mut self, now: Instant) {
        if self.fast_recovery.is_some() || self.rto_recover.is_some() {
            return;
        }
        let flight = self.snd_max() - self.snd_una;
        self.begin_undo_episode();
        self.cc.on_congestion_event(now, flight, self.emss.into());
        self.fast_recovery = Some(self.snd_max());
        self.stats.fast_recoveries += 1;
        // Fast retransmit: the first lost segment goes out now whatever the
        // reduced window says (RFC 5681 3.2 step 4, RFC 6675 5 step 4.3);
        // with a window of a few segments it could otherwise wait for ACKs
        // of segments that may be lost too, until the RTO.
        self.grant_cwnd_credit();
        self.tlp_deadline = None;
        self.arm_tlp(now);
        // RFC 8985 6.2 step 4: after 16 recoveries without D-SACK the
        // reordering window shrinks back.
        self.reo.persist = self.reo.persist.saturating_sub(1);
        if self.reo.persist == 0 {
            self.reo.mult = 1;
        }
    }

    fn begin_undo_episode(&mut self) {
        self.undo = Some(UndoEpisode {
            marker: self.snd_una,
            high: self.snd_max(),
            retrans: 0,
        });
    }

    /// A D-SACK block `[l, r)` (stream positions): the peer received that
    /// data twice (RFC 2883). Grows the RACK reordering window once per
    /// round (RFC 8985 6.2 step 4) and undoes the congestion response when
    /// every retransmission of the episode proved unnecessary (RFC 3708).
    fn on_dsack(&mut self, l: u64, r: u64) {
        self.stats.dsacks_received += 1;
        if self.reo.dsack_round.is_none_or(|end| self.snd_una >= end) {
            self.reo.mult = self.reo.mult.saturating_add(1).min(64);
            self.reo.dsack_round = Some(self.snd_max());
            self.reo.persist = 16;
        }
        let Some(u) = self.undo else {
            return;
        };
        if l < u.marker || r > u.high || u.retrans == 0 {
            return;
        }
        // Retransmissions reported unnecessary: above SND.UNA, those of the scoreboard's
        // segments in the block that were retransmitted, each once (as Linux's
        // `tcp_sacktag_one`); a segment the network duplicated, never retransmitted, or a
        // D-SACK repeated by a duplicated ACK, counts nothing. Below SND.UNA the segments are
        // gone: the block counts one (as Linux: a segment sent twice again is reported twice
        // with the same range, which a duplicated ACK's report cannot be told from). A block
        // reports one duplicated range, a few segments:
        // the walk stops after `MAX_DSACK_WALK` of them, so that a peer's block over the whole
        // flight on every ACK costs no more.
        let reported = if l >= self.snd_una {
            let mut n = 0;
            let first = self.scoreboard.partition_point(|e| e.end() <= l);
            for i in first..first.saturating_add(MAX_DSACK_WALK) {
                let Some(e) = self.scoreboard.get_mut(i) else {
                    break;
                };
                if e.start >= r {
                    break;
                }
                self.stats.sack_scan_steps += 1;
                if e.retransmits > 0 && !e.dsacked {
                    e.dsacked = true;
                    n += 1;
                }
            }
            n
        } else {
            1
        };
        if let Some(u) = self.undo.as_mut() {
            if reported > 0 {
                u.retrans = u.retrans.saturating_sub(reported);
                if u.retrans == 0 {
                    self.undo = None;
                    self.cc.undo();
                    self.stats.dsack_undos += 1;
                }
            }
        }
    }

    /// Eifel detection (RFC 3522 3.2) on the first ACK of new data after a
    /// timeout (its TSecr in `ack_tsecr`): if it echoes a TSval older than
    /// the retransmission's, the original transmission arrived and the
    /// timeout was spurious. Response (RFC 4015): restore the congestion
    /// window and stop resending what is still marked lost (it goes back to
    /// in flight; RACK and the RTO still watch it).
    fn eifel_check(&mut self) {
        let Some(rtx_ts) = self.eifel_tsval.take() else {
            return;
        };
        let Some(tsecr) = self.ack_tsecr else {
            return;
        };
        if !seq_lt(tsecr, rtx_ts) {
            return;
        }
        self.stats.spurious_rtos += 1;
        self.cc.undo();
        self.undo = None;
        self.rto_recover = None;
        for e in self.scoreboard.iter_mut() {
            if e.state == SegState::Lost && e.retransmits == 0 {
                e.state = SegState::InFlight;
                self.pipe += e.seq_len();
                self.lost_count -= 1;
            }
        }
    }

    /// RACK loss detection (RFC 8985 6.2 step 5).
    fn rack_detect_loss(&mut self, now: Instant) {
        let Some(rack_ts) = self.rack.xmit_ts else {
            return;
        };
        // RFC 8985 6.2 step 4: min_RTT / 4, scaled by the D-SACK multiplier
        // once reordering was seen, at most SRTT.
        let base = self.rtt.min_rtt().map_or(Duration::ZERO, |m| m / 4);
        let reo_wnd = if self.reo.seen {
            let w = base.saturating_mul(self.reo.mult);
            self.rtt.srtt().map_or(w, |s| w.min(s)).max(base)
        } else {
            base
        };
        let mut next: Option<Instant> = None;
        let mut lost_any = false;
        let rack_end = self.rack.end;
        // Never-retransmitted segments were sent in sequence order: once one was sent after
        // RACK.xmit_ts, or at that same instant but ending above RACK.end (a turn sends many
        // segments with one timestamp), every later entry was sent later or ends higher, so
        // none was sent before the segment RACK remembers.
        let sent_after = |e: &TxSegment| {
            e.retransmits == 0
                && (e.xmit_time > rack_ts || (e.xmit_time == rack_ts && e.end() > rack_end))
        };
        let mut i = 0;
        while i < self.scoreboard.len() {
            self.stats.sack_scan_steps += 1;
            if sent_after(&self.scoreboard[i]) {
                break;
            }
            // A run of SACKed entries is jumped over (none of them is in flight); should its
            // last one have been sent after RACK's, so was everything beyond.
            if let Some(j) = self.past_sacked_span(i) {
                if sent_after(&self.scoreboard[j - 1]) {
                    break;
                }
                i = j;
                continue;
            }
            let e = &mut self.scoreboard[i];
            i += 1;
            if e.state != SegState::InFlight {
                continue;
            }
            let sent_before =
                e.xmit_time < rack_ts || (e.xmit_time == rack_ts && e.end() <= self.rack.end);
            if !sent_before {
                continue;
            }
            let deadline = e.xmit_time + self.rack.rtt + reo_wnd;
            if deadline <= now {
                e.state = SegState::Lost;
                self.lost_floor = self.lost_floor.min(e.start);
                self.pipe -= e.seq_len();
                self.lost_count += 1;
                lost_any = true;
            } else {
                next = earliest(next, Some(deadline));
            }
        }
        self.rack_deadline = next;
        if lost_any {
            self.enter_loss_recovery(now);
        }
    }

    /// RFC 6675 IsLost without RACK: DupThresh (3) SACKed segments above.
    fn dupthresh_detect_loss(&mut self, now: Instant) {
        let mut sacked_above = 0u32;
        let mut lost_any = false;
        for e in self.scoreboard.iter_mut().rev() {
            match e.state {
                SegState::Sacked => sacked_above += 1,
                // Not a retransmission again (RFC 6675 NextSeg rule (1.a): above HighRxt): it
                // was marked on every ACK, and went once per ACK. A lost retransmission waits
                // for the RTO (rules (3) and (4), the rescue, are not done).
                SegState::InFlight if sacked_above >= 3 && e.retransmits == 0 => {
                    e.state = SegState::Lost;
                    self.lost_floor = self.lost_floor.min(e.start);
                    self.pipe -= e.seq_len();
                    self.lost_count += 1;
                    lost_any = true;
                }
                _ => {}
            }
        }
        if lost_any {
            self.enter_loss_recovery(now);
        }
    }

    fn process_data(
        &mut self,
        now: Instant,
        seg: &SegmentRepr<'_>,
        rel: i64,
        pass_up: &mut dyn FnMut(PassedUp<'_>) -> Option<TakeBack>,
    ) {
        let start_i = self.rcv_nxt as i64 + rel;
        let payload = seg.payload;
        let end_i = start_i + payload.len() as i64;
        // Nothing beyond the peer's FIN, once it is known (RFC 9293 3.10.7.4: the FIN is the
        // last of its sequence space), even if it came out of order: octets there would move
        // RCV.NXT past the FIN, which then never takes effect.
        let right = self.peer_fin_pos.map_or(self.rcv_window_right(), |fin| {
            self.rcv_window_right().min(fin)
        });
        // `InOrder`: nothing past the ring, though the window may offer a little more after
        // rounding up (`window_field`); the rest is dropped and comes again.
        let held_right = match self.cfg.rx_mode {
            RxMode::InOrder => right.min(self.rcv_ring_right()),
            RxMode::PassUp => right,
        };
        let a = start_i.max(self.rcv_nxt as i64) as u64;
        let b = (end_i.max(0) as u64).min(held_right);
        let was_in_order = start_i as u64 <= self.rcv_nxt && start_i >= 0;
        let had_holes = !self.rcv_ranges.is_empty();
        let mut accepted_fin = seg.flags.fin && end_i >= 0 && (end_i as u64) <= right;
        let mut take_back: Option<u64> = None;
        if !payload.is_empty() && start_i < self.rcv_nxt as i64 && end_i > 0 {
            // Partly a duplicate of in-order data (RFC 2883 4.1.1).
            let d0 = start_i.max(0) as u64;
            let d1 = (end_i as u64).min(self.rcv_nxt);
            if d0 < d1 {
                self.note_duplicate(d0, d1);
            }
        } else if a < b && a > self.rcv_nxt {
            // Wholly inside out-of-order data already received (4.1.2).
            let mut fresh = 0;
            self.rcv_ranges
                .for_each_gap(a, b, |g0, g1| fresh += g1 - g0);
            if fresh == 0 {
                self.note_duplicate(a, b);
            }
        }
        if a < b {
            if a > self.rcv_nxt && self.rcv_ranges.would_overflow(a, b) {
                self.stats.ooo_range_limit_drops += 1;
                self.ack_now = true;
                return;
            }
            if a > self.rcv_nxt {
                self.stats.ooo_segments += 1;
            }
            let off = |p: u64| (p as i64 - start_i) as usize;
            match self.cfg.rx_mode {
                RxMode::PassUp => {
                    let rcv = self.rcv;
                    let acked = self.bytes_acked();
                    let mut passed = 0u64;
                    if self.cfg.pass_up_duplicates {
                        take_back = pass_up(PassedUp {
                            seq: rcv.seq_of(a),
                            stream_offset: a,
                            data: &payload[off(a)..off(b)],
                            acked,
                        })
                        .map(|t| t.from);
                        passed += b - a;
                    } else {
                        self.rcv_ranges.for_each_gap(a, b, |g0, g1| {
                            if take_back.is_some_and(|t| g0 >= t) {
                                return; // given back: it comes again
                            }
                            let reply = pass_up(PassedUp {
                                seq: rcv.seq_of(g0),
                                stream_offset: g0,
                                data: &payload[off(g0)..off(g1)],
                                acked,
                            });
                            passed += g1 - g0;
                            if let Some(t) = reply {
                                take_back = Some(take_back.map_or(t.from, |x| x.min(t.from)));
                            }
                        });
                    }
                    self.stats.passed_up_bytes += passed;
                    if passed == 0 {
                        self.stats.duplicate_segments += 1;
                    }
                }
                RxMode::InOrder => {
                    // The run the segment's RDMA option places, if any: its octets go to the
                    // posted buffer, not to the ring (draft-csapuntz-tcprdma-00).
                    let mut run = None;
                    if self.rdma_option_enabled && start_i >= 0 {
                        if seg.options.rdma_malformed {
                            self.stats.rdma_malformed += 1;
                        } else if seg.options.rdma.is_some() {
                            if matches!(
                                seg.options.rdma,
                                Some(crate::wire::rdma::RdmaOption::Transfer(_))
                            ) {
                                self.stats.rdma_options_received += 1;
                            }
                            match self.rdma_rx.accept(
                                seg.options.rdma,
                                start_i as u64,
                                payload.len(),
                            ) {
                                Ok(r) => run = r,
                                Err(_) => self.stats.rdma_refused += 1,
                            }
                        }
                    }
                    let (rs, re) = run.map_or((b, b), |r| (r.start.clamp(a, b), r.end.clamp(a, b)));
                    let cap = self.rcv_buf.len();
                    for (from, to) in [(a, rs), (re, b)] {
                        let mut p = from;
                        while p < to {
                            let idx = (p % cap as u64) as usize;
                            let n = ((to - p) as usize).min(cap - idx);
                            self.rcv_buf[idx..idx + n]
                                .copy_from_slice(&payload[off(p)..off(p) + n]);
                            p += n as u64;
                        }
                    }
                    if let (Some(run), true) = (run, rs < re) {
                        // Only octets not received before: nothing is placed twice.
                        let in_order = a <= self.rcv_nxt;
                        let (ranges, rx) = (&self.rcv_ranges, &mut self.rdma_rx);
                        let mut placed = 0;
                        ranges.for_each_gap(rs, re, |g0, g1| {
                            rx.place(&run, g0, &payload[off(g0)..off(g1)]);
                            placed += g1 - g0;
                        });
                        if in_order {
                            self.stats.rdma_placed_in_order += placed;
                        } else {
                            self.stats.rdma_placed_out_of_order += placed;
                        }
                    }
                }
            }
            if a <= self.rcv_nxt {
                let n = self.rcv_nxt.max(b);
                self.rcv_nxt = self.rcv_ranges.advance_from(n);
            } else {
                self.rcv_ranges.insert(a, b);
            }
        } else if !payload.is_empty() {
            self.stats.duplicate_segments += 1;
            self.ack_now = true;
        }
        if b < end_i.max(0) as u64 {
            accepted_fin = false; // FIN beyond the window
        }
        // The first FIN stays where it is: another at another place is not the peer's. One
        // below what is in order already (data came beyond it) is not taken: RCV.NXT could
        // never reach it. Octets held beyond it are forgotten (no ACK covered them: they lie
        // beyond a gap), so that the gap filling brings RCV.NXT to the FIN.
        if accepted_fin && self.peer_fin_pos.is_none() && end_i as u64 >= self.rcv_nxt {
            let fin = end_i as u64;
            self.forget_received_from(fin);
            self.peer_fin_pos = Some(fin);
        }
        if let Some(t) = take_back {
            // Before the FIN below is taken: the octets before it are missing again. The ACK
            // that tells the peer goes out at once.
            if self.renege_from(t) {
                self.ack_now = true;
            } else {
                self.events.push_back(Event::TakeBackRefused { offset: t });
            }
        }
        // ACK policy (RFC 5681 4.2, RFC 1122 4.2.3.2).
        if !payload.is_empty() {
            self.ack_pending = true;
            self.unacked_segments += 1;
            if !was_in_order || had_holes || self.cfg.delayed_ack.is_none() {
                self.ack_now = true;
            } else if self.quickack_left > 0 {
                self.quickack_left -= 1;
                self.ack_now = true;
            } else if self.unacked_segments >= self.cfg.ack_every_segments.max(1)
                || seg.flags.psh && self.unacked_segments >= 2
            {
                self.ack_now = true;
            } else if self.delack_deadline.is_none() {
                if let Some(d) = self.cfg.delayed_ack {
                    self.delack_deadline = Some(now + d);
                }
            }
        }
        // FIN in order (RFC 9293 3.10.7.4 eighth).
        if let Some(fp) = self.peer_fin_pos {
            if fp == self.rcv_nxt && !self.fin_received {
                self.fin_received = true;
                self.ack_now = true;
                self.events.push_back(Event::PeerClosed);
                match self.state {
                    State::Established => self.state = State::CloseWait,
                    State::FinWait1 => {
                        if self.fin_sent && self.snd_una >= self.snd_max() {
                            self.enter_time_wait(now);
                        } else {
                            self.state = State::Closing;
                        }
                    }
                    State::FinWait2 => self.enter_time_wait(now),
                    _ => {}
                }
            }
        }
    }

    fn note_duplicate(&mut self, start: u64, end: u64) {
        if self.sack_enabled {
            self.dsack = Some((start, end));
        }
    }

    fn enter_time_wait(&mut self, now: Instant) {
        self.state = State::TimeWait;
        self.time_wait_deadline = Some(now + self.cfg.time_wait);
        self.time_wait_last = Some(
            now + self
                .cfg
                .time_wait
                .checked_mul(TIME_WAIT_RESTARTS)
                .unwrap_or(Duration::MAX),
        );
        self.fin_wait2_deadline = None;
        self.rto_deadline = None;
        self.tlp_deadline = None;
        self.rack_deadline = None;
        self.persist_deadline = None;
        self.keepalive_deadline = None;
        self.delack_deadline = None;
        self.path_mtu_expires = None;
    }

    /// Whether `syn` (a SYN without ACK or RST, for this 4-tuple) may end this connection's
    /// TIME-WAIT and open a new incarnation (RFC 6191 2, RFC 1122 4.2.2.13, as Linux judges
    /// it): its sequence number lies beyond RCV.NXT, or its timestamp is newer than TS.Recent
    /// (and PAWS would not drop it). Returns the ISN the new incarnation takes, above every
    /// sequence number this one sent (SND.NXT + 65537); `None` leaves TIME-WAIT as it is.
    pub fn time_wait_successor_isn(&self, syn: &SegmentRepr<'_>) -> Option<u32> {
        if self.state != State::TimeWait || !syn.flags.syn || syn.flags.ack || syn.flags.rst {
            return None;
        }
        let (newer, older) = match (self.ts_enabled, syn.options.timestamp, self.ts_recent) {
            (true, Some((tsval, _)), Some(recent)) => {
                (seq_gt(tsval, recent), seq_lt(tsval, recent))
            }
            _ => (false, false),
        };
        let later = seq_gt(syn.seq, self.rcv_nxt());
        // A timestamp older than TS.Recent is what PAWS drops, whatever the sequence number.
        (!older && (later || newer)).then(|| self.snd_nxt().wrapping_add(65_537))
    }

    /// Ends TIME-WAIT at once for a new incarnation of the 4-tuple
    /// ([`Connection::time_wait_successor_isn`]): the connection is closed
    /// ([`Event::Closed`]).
    pub fn end_time_wait(&mut self) {
        if self.state == State::TimeWait {
            self.enter_closed(Some(Event::Closed));
        }
    }

    /// Whether the connection only lingers after its close: in TIME-WAIT, or in FIN-WAIT-2
    /// (everything we sent, our FIN too, acknowledged; waiting for the peer's FIN) once the
    /// application said it reads nothing more ([`Connection::close_orphaned`]; a half-closed
    /// connection whose application still reads is not lingering).
    pub fn is_lingering(&self) -> bool {
        match self.state {
            State::TimeWait => true,
            State::FinWait2 => self.orphaned,
            _ => false,
        }
    }

    /// Ends a lingering connection ([`Connection::is_lingering`]) before its time, as the
    /// table does when lingering connections would crowd out new ones (Linux's
    /// `tcp_max_tw_buckets`, `tcp_max_orphans`): TIME-WAIT closes at once, FIN-WAIT-2 is reset
    /// and closed as at `Config::fin_wait2_timeout`. Nothing we sent is lost: the peer
    /// acknowledged all of it. Returns whether it ended.
    pub fn end_lingering(&mut self) -> bool {
        if !self.is_lingering() {
            return false;
        }
        if self.state == State::TimeWait {
            self.end_time_wait();
        } else {
            self.queue_reset();
            self.enter_closed(Some(Event::Closed));
        }
        true
    }

    fn enter_closed(&mut self, event: Option<Event>) {
        self.state = State::Closed;
        self.rto_deadline = None;
        self.tlp_deadline = None;
        self.rack_deadline = None;
        self.persist_deadline = None;
        self.keepalive_deadline = None;
        self.delack_deadline = None;
        self.time_wait_deadline = None;
        self.fin_wait2_deadline = None;
        self.path_mtu_expires = None;
        self.sacked_spans.clear();
        self.syn_due = false;
        self.ack_now = false;
        self.probe_due = false;
        self.lost_count = 0;
        self.scoreboard.clear();
        if let Some(e) = event {
            self.events.push_back(e);
        }
    }

    // ------------------------------------------------------------------
    // Transmitting
    // ------------------------------------------------------------------

    fn tsval(&self, now: Instant) -> u32 {
        (now.as_millis() as u32).wrapping_add(self.ts_offset)
    }

    /// The window field of an outgoing segment; records the right edge it offers.
    ///
    /// A SYN's window is not scaled (RFC 7323 2.2). Otherwise the field is the window in
    /// units of 2^Rcv.Wind.Shift (RFC 7323 2.3), and a window that is not a whole number of
    /// units must be rounded. Rounded down, a free window smaller than one unit becomes a zero
    /// window (the peer stops and persist-probes though there is room), and an edge offered
    /// before moves left whenever RCV.NXT advanced by a part of a unit (RFC 7323 2.4). So:
    /// the window rounded down when that keeps the offered edge and is not zero; else rounded
    /// up (as Linux's `tcp_select_window` does). `InOrder` keeps just under two units of
    /// room past its nominal size for that, and keeps an offered edge even where a reader
    /// that lags has left no room for it (RFC 7323 2.4's "beyond the buffer" choice: octets
    /// past the ring are dropped when they come, and sent again). A `PassUp` upper layer's
    /// window is never exceeded: there, if rounding up does not fit, the most whole units it
    /// holds, which retracts the edge by less than a unit (the case RFC 7323 2.4 leaves to
    /// the sender, RFC 1122 4.2.2.16).
    fn window_field(&mut self, syn: bool) -> u16 {
        let right = self.rcv_window_right();
        let wnd = right.saturating_sub(self.rcv_nxt);
        if syn {
            let field = wnd.min(65535);
            self.rcv_adv_right = self.rcv_adv_right.max(self.rcv_nxt + field);
            return field as u16;
        }
        let shift = self.rcv_wscale;
        let promised = self.rcv_adv_right.saturating_sub(self.rcv_nxt);
        let down = wnd >> shift;
        let up = wnd.div_ceil(1 << shift);
        let room = self.rcv_buffer_limit() - self.rcv_nxt;
        let units = if (down << shift) >= promised && (down > 0 || wnd == 0) {
            down
        } else if (up << shift) <= room || self.cfg.rx_mode == RxMode::InOrder {
            // `InOrder` keeps the offered edge even past its ring (RFC 7323 2.4's "beyond
            // the buffer"): `process_data` drops what arrives past the ring, unacknowledged.
            up
        } else {
            room >> shift
        };
        let field = units.min(65535);
        self.rcv_adv_right = self.rcv_adv_right.max(self.rcv_nxt + (field << shift));
        field as u16
    }

    fn base_repr(&mut self, now: Instant, seq: u32, flags: TcpFlags) -> SegmentRepr<'static> {
        let syn = flags.syn;
        let window = self.window_field(syn);
        let mut options = TcpOptions::default();
        if syn {
            options.mss = Some(self.cfg.mss);
            let is_synack = flags.ack;
            if self.offered_wscale && self.cfg.window_scaling {
                options.window_scale = Some(self.rcv_wscale);
            }
            options.sack_permitted = self.cfg.sack && (!is_synack || self.sack_enabled);
            if self.cfg.rdma_option && (!is_synack || self.rdma_option_enabled) {
                options.rdma = Some(crate::wire::rdma::RdmaOption::Permitted);
            }
            if self.cfg.timestamps && (!is_synack || self.ts_enabled) {
                options.timestamp = Some((self.tsval(now), self.ts_recent.unwrap_or(0)));
            }
        } else if self.ts_enabled {
            options.timestamp = Some((self.tsval(now), self.ts_recent.unwrap_or(0)));
        }
        SegmentRepr {
            src_addr: self.tuple.local_addr,
            tos: self.cfg.sent_tos(),
            dst_addr: self.tuple.remote_addr,
            src_port: self.tuple.local_port,
            dst_port: self.tuple.remote_port,
            seq,
            ack: if flags.ack { self.rcv_nxt() } else { 0 },
            flags,
            window,
            options,
            payload: &[],
        }
    }

    fn add_sack_blocks(&mut self, repr: &mut SegmentRepr<'_>, payload_len: usize) {
        if !self.sack_enabled || (self.rcv_ranges.is_empty() && self.dsack.is_none()) {
            return;
        }
        let max_blocks = if self.ts_enabled { 3 } else { 4 };
        let mut blocks = [SackBlock::default(); 4];
        // A D-SACK block goes first (RFC 2883 4), once.
        let mut n_d = 0;
        if let Some((d0, d1)) = self.dsack.take() {
            blocks[0] = SackBlock {
                left: self.rcv.seq_of(d0),
                right: self.rcv.seq_of(d1),
            };
            n_d = 1;
            self.stats.dsacks_sent += 1;
        }
        let mut recent = [Range {
            start: 0,
            end: 0,
            touched: 0,
        }; 4];
        let n = n_d + self.rcv_ranges.most_recent(&mut recent[..max_blocks - n_d]);
        for (b, r) in blocks[n_d..].iter_mut().zip(&recent[..n - n_d]) {
            *b = SackBlock {
                left: self.rcv.seq_of(r.start),
                right: self.rcv.seq_of(r.end),
            };
        }
        let mut n_fit = n;
        // Keep the packet within MSS + fixed options when carrying data, and the options
        // within 40 octets (an RDMA option takes up to 20 of them).
        let rdma = repr.options.rdma.map_or(0, |r| r.len().next_multiple_of(4));
        let others = repr.options.wire_len();
        while n_fit > 0 {
            let extra = 4 + 8 * n_fit;
            let fits_mss = payload_len == 0 || payload_len + rdma + extra <= usize::from(self.emss);
            if fits_mss && others + extra <= crate::wire::TCP_MAX_OPTIONS_LEN {
                break;
            }
            n_fit -= 1;
        }
        repr.options.set_sack_blocks(&blocks[..n_fit]);
    }

    fn after_emit_ack(&mut self, repr: &SegmentRepr<'_>) {
        self.after_emit(repr.flags.ack.then_some(repr.ack));
    }

    /// A segment went out carrying acknowledgment number `ack` (`None`: no ACK flag).
    #[inline]
    fn after_emit(&mut self, ack: Option<u32>) {
        self.stats.segments_out += 1;
        if let Some(ack) = ack {
            self.ack_pending = false;
            self.ack_now = false;
            self.delack_deadline = None;
            self.unacked_segments = 0;
            self.last_ack_sent = ack;
            self.rcv_nxt_acked = self.rcv_nxt;
        }
    }

    /// [`RxMode::PassUp`]: takes back the octets from stream offset `offset` on, which were
    /// passed up but not acknowledged yet, so that the peer sends them again and they are
    /// passed up again (what an upper layer that placed some of them too early needs, IFT's
    /// speculative placement, draft-williams-iwarp-ift-01 section 8: "withhold TCP
    /// acknowledgement ... and force the remote end to retransmit"). `RCV.NXT` returns to
    /// `offset` and the out-of-order ranges from there are forgotten: a receiver may discard
    /// what it has only SACKed (RFC 2018 section 8), and the sender keeps it until it is
    /// acknowledged cumulatively. Ours sees it at the next ACK (a SACKed segment at the
    /// cumulative point, `ConnStats::peer_reneged`) and resends; others at their
    /// retransmission timeout, where RFC 2018 section 8 has them ignore SACK state. The right window
    /// edge stays where it was offered. Refused (`false`, nothing changed) outside `PassUp`,
    /// once an ACK at or beyond `offset` went out (those octets are the peer's to forget), or
    /// once the peer's FIN was taken in order (RFC 9293 3.10.7.4: the connection has moved on).
    /// A FIN that arrived out of order is kept where it is: it takes effect once the octets
    /// before it, sent again, are in (the peer keeps its FIN until it is acknowledged too).
    pub fn renege_from(&mut self, offset: u64) -> bool {
        if self.cfg.rx_mode != RxMode::PassUp
            || offset < self.rcv_nxt_acked
            || self.fin_received
            || self.peer_fin_pos.is_some_and(|fin| offset > fin)
        {
            return false;
        }
        self.rcv_nxt = self.rcv_nxt.min(offset);
        self.forget_received_from(offset);
        self.stats.reneged += 1;
        true
    }

    /// Forgets the out-of-order octets received at and beyond `offset` (at or above RCV.NXT),
    /// placed ones included.
    fn forget_received_from(&mut self, offset: u64) {
        self.rcv_ranges.truncate_from(offset);
        // What the TCP RDMA option placed of them goes too.
        self.rdma_rx.forget_from(offset);
        if let Some((start, end)) = self.dsack {
            if end > offset {
                // A D-SACK (RFC 2883) of octets no longer held would read as a SACK of them;
                // its part below them still reports a duplicate of octets held.
                self.dsack = (start < offset).then_some((start, offset));
            }
        }
    }

    /// Emit the next packet (IPv4 + TCP) into `buf`; returns its length.
    /// Call until it returns `None`. In [`TxMode::Source`] no data is sent (use
    /// [`Connection::poll_transmit_with`]).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        let out = &mut PacketOut {
            head: buf,
            tail: &mut [],
        };
        self.poll_transmit_inner(now, out, None)
    }

    /// [`Connection::poll_transmit`] for [`TxMode::Source`]: the payload of a data segment,
    /// new or retransmitted, is written into `buf` by `source` (the other modes copy from the
    /// send buffer and never call it). If `source` fails, nothing is sent, the connection
    /// aborts (RST) and [`Event::SourceFailed`] is reported.
    pub fn poll_transmit_with(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        source: &mut dyn TxSource,
    ) -> Option<usize> {
        let out = &mut PacketOut {
            head: buf,
            tail: &mut [],
        };
        self.poll_transmit_inner(now, out, Some(source))
    }

    /// [`Connection::poll_transmit_with`] into a packet buffer in pieces (the frames of a
    /// multi-buffer AF_XDP packet): the IPv4 and TCP headers at the start of `head`, a data
    /// segment's payload from there on through `tail` in order, written in
    /// [`TxMode::Source`] by `source` in one call ([`TxSource::fill_split`]) and in the other
    /// modes copied from the send buffer piece by piece. Control segments go in `head` alone.
    /// Returns the packet's length, all pieces together.
    pub fn poll_transmit_split(
        &mut self,
        now: Instant,
        head: &mut [u8],
        tail: &mut [&mut [u8]],
        source: &mut dyn TxSource,
    ) -> Option<usize> {
        let out = &mut PacketOut { head, tail };
        self.poll_transmit_inner(now, out, Some(source))
    }

    fn poll_transmit_inner(
        &mut self,
        now: Instant,
        out: &mut PacketOut<'_, '_>,
        source: Option<&mut dyn TxSource>,
    ) -> Option<usize> {
        self.update_stall(now);
        if let Some(rst) = self.pending_rst {
            let flags = TcpFlags {
                rst: true,
                ack: rst.ack.is_some(),
                ..TcpFlags::default()
            };
            let mut repr = self.base_repr(now, rst.seq, flags);
            repr.ack = rst.ack.unwrap_or(0);
            repr.options = TcpOptions::default();
            repr.window = 0;
            // Due until it is written: a buffer too small for it leaves it for the next call.
            let n = repr.emit(out.head).ok()?;
            self.pending_rst = None;
            self.stats.segments_out += 1;
            return Some(n);
        }
        match self.state {
            State::Closed => return None,
            State::SynSent | State::SynReceived => {
                if !self.syn_due {
                    return self.emit_pure_ack_if_due(now, out.head);
                }
                let ack = self.state == State::SynReceived;
                let flags = TcpFlags {
                    syn: true,
                    ack,
                    ..TcpFlags::default()
                };
                let repr = self.base_repr(now, self.snd.isn, flags);
                let n = repr.emit(out.head).ok()?;
                self.after_emit_ack(&repr);
                self.syn_due = false;
                if self.syn_sent_at.is_none() {
                    self.syn_sent_at = Some(now);
                }
                self.syn_last_sent = repr.options.timestamp.map(|(tsval, _)| (now, tsval));
                if self.rto_deadline.is_none() {
                    self.rto_deadline = Some(now + self.rtt.rto());
                }
                return Some(n);
            }
            _ => {}
        }
        // Without a source, a Source-mode connection sends no data (only control segments);
        // the other modes never call the source.
        let data = source.is_some() || self.cfg.tx_mode != TxMode::Source;
        let mut no_source = NoSource;
        let source = source.unwrap_or(&mut no_source);
        if data {
            if let Some(n) = self.try_retransmit(now, out, source) {
                return Some(n);
            }
            if self.state == State::Closed {
                // The source failed: send the RST.
                return self.poll_transmit_inner(now, out, None);
            }
            if let Some(n) = self.try_send_new(now, out, source) {
                return Some(n);
            }
            if self.state == State::Closed {
                return self.poll_transmit_inner(now, out, None);
            }
        }
        if self.probe_due {
            // Window probe / keepalive: an already-acknowledged sequence
            // number, no data, so record boundaries are never disturbed; the
            // peer answers with an ACK carrying its window (RFC 9293 3.8.6.1,
            // RFC 1122 4.2.3.6).
            let seq = self.snd.seq_of(self.snd_una).wrapping_sub(1);
            let repr = self.base_repr(
                now,
                seq,
                TcpFlags {
                    ack: true,
                    ..TcpFlags::default()
                },
            );
            let n = repr.emit(out.head).ok()?;
            self.probe_due = false;
            // No data fit: the next persist timeout tries again; a window that opens a little
            // meanwhile does not draw a small segment.
            self.sws_override = false;
            self.after_emit_ack(&repr);
            // The next window probe only while data waits for the window: a keepalive of an
            // idle connection arming it would probe for ever, the backoff growing, and the
            // next zero-window episode would start from that backoff.
            if self.window_blocked {
                self.arm_persist(now);
            }
            return Some(n);
        }
        self.emit_pure_ack_if_due(now, out.head)
    }

    fn emit_pure_ack_if_due(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        if !self.ack_now || !self.state.synchronized() && self.state != State::SynReceived {
            return None;
        }
        let seq = self
            .snd
            .seq_of(self.snd_nxt)
            .wrapping_add(u32::from(self.fin_sent));
        let seq = if self.syn_acked || self.state.synchronized() {
            seq
        } else {
            self.snd.isn.wrapping_add(1)
        };
        let mut repr = self.base_repr(
            now,
            seq,
            TcpFlags {
                ack: true,
                ..TcpFlags::default()
            },
        );
        self.add_sack_blocks(&mut repr, 0);
        let n = repr.emit(buf).ok()?;
        self.after_emit_ack(&repr);
        Some(n)
    }

    fn effective_pipe(&self) -> u64 {
        if self.sack_enabled {
            self.pipe
        } else {
            self.pipe.saturating_sub(self.dupack_credit)
        }
    }

    fn emit_data(
        &mut self,
        now: Instant,
        out: &mut PacketOut<'_, '_>,
        start: u64,
        len: u32,
        fin: bool,
        source: &mut dyn TxSource,
    ) -> Option<usize> {
        let psh = len > 0 && start + u64::from(len) == self.data_end();
        let seq = self.snd.seq_of(start);
        // A data segment without SACK blocks (the usual one) from the connection's prebuilt
        // headers; FIN, SACK- and RDMA-option-carrying segments through the general emitter.
        let sacks = self.sack_enabled && (!self.rcv_ranges.is_empty() || self.dsack.is_some());
        let rdma = if self.rdma_tx.is_empty() {
            None
        } else {
            self.rdma_tx.annotate(start, u64::from(len))
        };
        let headers = if fin || sacks || rdma.is_some() {
            let flags = TcpFlags {
                ack: true,
                fin,
                psh,
                ..TcpFlags::default()
            };
            let mut r = self.base_repr(now, seq, flags);
            r.options.rdma = rdma;
            if rdma.is_some() {
                self.stats.rdma_options_sent += 1;
            }
            self.add_sack_blocks(&mut r, len as usize);
            Headers::General(r)
        } else {
            // The same fields, in the same order, as `base_repr` computes them.
            Headers::Prebuilt {
                window: self.window_field(false),
                ts: (self.tsval(now), self.ts_recent.unwrap_or(0)),
                ack: self.rcv_nxt(),
            }
        };
        let mut failed = None;
        let from_source = self.cfg.tx_mode == TxMode::Source;
        let off = if from_source {
            0
        } else {
            (start - self.send_buf_base) as usize
        };
        let (a, b) = self.send_buf.as_slices();
        // The modes other than `Source`: the segment's payload octets from `at` on, into
        // `piece`, from the send buffer.
        let copy = |at: usize, piece: &mut [u8]| {
            let mut o = 0;
            let mut s = off + at;
            let l = piece.len();
            if s < a.len() {
                let run = (a.len() - s).min(l);
                piece[..run].copy_from_slice(&a[s..s + run]);
                o = run;
                s = 0;
            } else {
                s -= a.len();
            }
            if o < l {
                piece[o..].copy_from_slice(&b[s..s + (l - o)]);
            }
        };
        let payload_len = len as usize;
        let (emitted, ack) = if out.tail.is_empty() {
            let fill = |payload: &mut [u8]| {
                if !from_source {
                    copy(0, payload);
                    return None;
                }
                if payload.is_empty() {
                    return None;
                }
                match source.fill_summed(start, payload) {
                    Ok(sum) => sum,
                    Err(e) => {
                        failed = Some(e);
                        None
                    }
                }
            };
            match headers {
                Headers::General(r) => (r.emit_with_summed(out.head, payload_len, fill), r.ack),
                Headers::Prebuilt { window, ts, ack } => {
                    let h = &self.data_header;
                    let n = h.emit_summed(out.head, seq, ack, psh, window, ts, payload_len, fill);
                    (n, ack)
                }
            }
        } else {
            // In pieces: the payload starts after the headers in `head` and runs on through
            // the tail, written by one call of the source.
            let header_len = match &headers {
                Headers::General(r) => r.header_len(),
                Headers::Prebuilt { .. } => self.data_header.header_len(),
            };
            if header_len + payload_len > pieces_len(out.head, out.tail) {
                return None;
            }
            let tail = &mut *out.tail;
            let fill = |first: &mut [u8]| {
                if payload_len == 0 {
                    return 0;
                }
                let first_len = first.len().min(payload_len);
                let first = &mut first[..first_len];
                let filled = if from_source {
                    source.fill_split(start, payload_len, first, tail)
                } else {
                    fill_in_pieces(start, payload_len, first, tail, |offset, piece| {
                        copy((offset - start) as usize, piece);
                        Ok(None)
                    })
                };
                filled.unwrap_or_else(|e| {
                    failed = Some(e);
                    0
                })
            };
            match headers {
                Headers::General(r) => (r.emit_split(out.head, payload_len, fill), r.ack),
                Headers::Prebuilt { window, ts, ack } => {
                    let h = &self.data_header;
                    let n = h.emit_split(out.head, seq, ack, psh, window, ts, payload_len, fill);
                    (n, ack)
                }
            }
        };
        let n = emitted.ok()?;
        if failed.is_some() {
            // The octets cannot be produced: the stream cannot continue (a hole would be
            // filled with garbage), so the connection is reset.
            self.abort();
            self.events.push_back(Event::SourceFailed);
            return None;
        }
        self.after_emit(Some(ack));
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.rtt.rto());
        }
        Some(n)
    }

    fn try_retransmit(
        &mut self,
        now: Instant,
        out: &mut PacketOut<'_, '_>,
        source: &mut dyn TxSource,
    ) -> Option<usize> {
        if self.lost_count == 0 {
            return None;
        }
        let floor = self
            .scoreboard
            .partition_point(|e| e.start < self.lost_floor);
        let found = self
            .scoreboard
            .range(floor..)
            .position(|e| e.state == SegState::Lost)
            .map(|k| floor + k);
        let idx = match found {
            Some(idx) => idx,
            None => {
                // Every place that marks an entry lost lowers the floor: a lost entry below it
                // is a bug; found from the front all the same.
                debug_assert!(false, "a lost segment below lost_floor");
                self.scoreboard
                    .iter()
                    .position(|e| e.state == SegState::Lost)?
            }
        };
        let mut e = self.scoreboard[idx];
        self.lost_floor = e.start;
        let emss = if self.rdma_tx.is_empty() {
            u32::from(self.emss)
        } else {
            self.rdma_tx
                .cap_at(e.start, u64::from(e.len), u64::from(self.emss)) as u32
        };
        if e.len > emss {
            // The path MTU shrank since first transmission: split at EMSS
            // (the first piece keeps the original start boundary).
            let rest = TxSegment {
                start: e.start + u64::from(emss),
                len: e.len - emss,
                ..e
            };
            e.len = emss;
            e.fin = false;
            self.scoreboard[idx] = e;
            self.scoreboard.insert(idx + 1, rest);
            // A piece of a lost segment may now lie wholly inside a SACKed span.
            self.sacked_spans.clear();
            self.lost_count += 1;
        }
        let len = e.seq_len();
        let pipe = self.effective_pipe();
        let cwnd = self.cc.cwnd();
        if self.ignore_cwnd_credit > 0 {
            self.ignore_cwnd_credit -= 1;
        } else if pipe > 0 && pipe + len > cwnd {
            return None;
        }
        let n = self.emit_data(now, out, e.start, e.len, e.fin, source)?;
        let s = &mut self.scoreboard[idx];
        s.state = SegState::InFlight;
        s.xmit_time = now;
        s.retransmits = s.retransmits.saturating_add(1);
        s.dsacked = false;
        let start = s.start;
        self.pipe += len;
        self.lost_count -= 1;
        self.stats.retransmitted_segments += 1;
        if let Some(u) = self.undo.as_mut() {
            if start >= u.marker && start < u.high {
                u.retrans += 1;
            }
        }
        self.arm_tlp(now);
        Some(n)
    }

    fn next_segment_len(&self) -> u64 {
        let avail = self.data_end() - self.snd_nxt;
        let emss = u64::from(self.emss);
        match self.cfg.tx_mode {
            TxMode::Stream if !self.rdma_tx.is_empty() => {
                self.rdma_tx
                    .segment_len(self.snd_nxt, self.data_end(), emss)
            }
            TxMode::Stream => avail.min(emss),
            TxMode::Records | TxMode::Source => {
                // The whole records that fit EMSS; a first record larger than EMSS is split
                // (it may be partly sent already).
                match self.records_within(emss) {
                    0 if !self.record_ends.is_empty() => emss,
                    whole => whole,
                }
            }
        }
    }

    fn arm_persist(&mut self, now: Instant) {
        if self.persist_deadline.is_none() && self.pipe == 0 && self.scoreboard.is_empty() {
            let base = self.rtt.rto();
            let d = base
                .saturating_mul(1 << self.persist_backoff.min(10))
                .min(self.rtt.max_rto());
            self.persist_deadline = Some(now + d);
        }
    }

    fn try_send_new(
        &mut self,
        now: Instant,
        out: &mut PacketOut<'_, '_>,
        source: &mut dyn TxSource,
    ) -> Option<usize> {
        if !self.state.may_send_queued() {
            return None;
        }
        let data_end = self.data_end();
        if self.snd_nxt < data_end {
            let len = self.window_allows(self.snd_una + self.snd_wnd);
            if len == 0 {
                self.window_blocked = true;
                self.arm_persist(now);
                self.note_send_limit(now, Some(SendLimit::PeerWindow));
                return None;
            }
            if self.nagle_holds(len) {
                self.note_send_limit(now, Some(SendLimit::Sender));
                return None;
            }
            let pipe = self.effective_pipe();
            let cwnd = self.cc.cwnd();
            if pipe > 0 && pipe + len > cwnd {
                self.cwnd_use.limited = true;
                if self.ignore_cwnd_credit > 0 {
                    self.ignore_cwnd_credit -= 1;
                } else if self.limited_transmit > 0 {
                    self.limited_transmit -= 1;
                } else {
                    self.note_send_limit(now, Some(SendLimit::Cwnd));
                    return None;
                }
            }
            if self.scoreboard.len() >= self.max_tracked {
                // As many segments in flight as tracked: wait for ACKs to free entries.
                self.note_send_limit(now, Some(SendLimit::Sender));
                return None;
            }
            self.note_send_limit(now, None);
            let start = self.snd_nxt;
            let n = self.emit_data(now, out, start, len as u32, false, source)?;
            self.snd_nxt += len;
            if self.sws_override {
                // The data is the window probe.
                self.sws_override = false;
                self.probe_due = false;
            }
            while self.record_ends.front().is_some_and(|&e| e <= self.snd_nxt) {
                self.record_ends.pop_front();
            }
            if self.scoreboard.is_empty() {
                // The first data after an idle time (RFC 9438 5.8).
                self.cc.on_transmit_start(now);
            }
            // Pushed as a constant and filled in place: `push_back` is not inlined, and it
            // read a segment built on the stack back in wider loads than the stores that
            // wrote it, which waited for them (failed store forwarding) per segment sent.
            self.scoreboard.push_back(TxSegment::IN_FLIGHT);
            if let Some(e) = self.scoreboard.back_mut() {
                e.start = start;
                e.len = len as u32;
                e.xmit_time = now;
            }
            self.pipe += len;
            self.cwnd_use.flight = self.cwnd_use.flight.max(self.pipe);
            self.arm_tlp(now);
            self.note_sent_all(now);
            return Some(n);
        }
        if self.fin_queued && !self.fin_sent && self.scoreboard.len() < self.max_tracked {
            if self.snd_nxt >= self.snd_una + self.snd_wnd {
                // The FIN takes a sequence number (RFC 9293 3.4, SEG.LEN), which a shut
                // window does not hold: a receiver may drop it, and, answering every
                // retransmission with its zero window, would see us time out. It waits
                // behind the window as data does, the persist timer probing (3.8.6.1).
                self.window_blocked = true;
                self.arm_persist(now);
                self.note_send_limit(now, Some(SendLimit::PeerWindow));
                return None;
            }
            let start = self.snd_nxt;
            let n = self.emit_data(now, out, start, 0, true, source)?;
            self.fin_sent = true;
            self.scoreboard.push_back(TxSegment {
                start,
                len: 0,
                fin: true,
                state: SegState::InFlight,
                xmit_time: now,
                retransmits: 0,
                dsacked: false,
            });
            self.pipe += 1;
            self.note_sent_all(now);
            return Some(n);
        }
        // Nothing unsent: limited by the sender while data is in flight, idle after.
        let limit = (self.snd_una < self.snd_max()).then_some(SendLimit::Sender);
        self.note_send_limit(now, limit);
        None
    }

    /// After a segment of new data or the FIN: with nothing left unsent, the sender limits
    /// from now on (data is in flight), as the next offer would find; the connection table
    /// makes none once the connection says it wants nothing more ([`wants_transmit`]).
    ///
    /// [`wants_transmit`]: Connection::wants_transmit
    #[inline]
    fn note_sent_all(&mut self, now: Instant) {
        if !self.has_new_data() {
            self.note_send_limit(now, Some(SendLimit::Sender));
        }
    }

    /// Ends the current send-limited state (adding its time to [`ConnStats`]) and
    /// enters `limit` (`None`: sending or idle). Staying in the same state keeps
    /// its start; from none to none is a no-op (once per segment sent).
    #[inline]
    fn note_send_limit(&mut self, now: Instant, limit: Option<SendLimit>) {
        if let Some((cur, since)) = self.send_limit {
            if Some(cur) == limit {
                return;
            }
            let ns = u64::try_from(now.saturating_since(since).as_nanos()).unwrap_or(u64::MAX);
            let slot = match cur {
                SendLimit::PeerWindow => &mut self.stats.snd_lim_time_rwin_ns,
                SendLimit::Cwnd => &mut self.stats.snd_lim_time_cwnd_ns,
                SendLimit::Sender => &mut self.stats.snd_lim_time_sender_ns,
            };
            *slot = slot.saturating_add(ns);
        }
        self.send_limit = limit.map(|l| (l, now));
    }
}

/// How much of its congestion window a sender used, over the round trip under way and the one
/// before it (a round ends when what was in flight at its start is acknowledged), for
/// congestion window validation (RFC 7661; Linux's `tcp_is_cwnd_limited`).
#[derive(Debug, Default, Clone, Copy)]
struct CwndUse {
    /// The stream position whose acknowledgement ends the round.
    round_end: u64,
    /// Most octets in flight after a send, this round and the last.
    flight: u64,
    prev_flight: u64,
    /// A send found the window full, this round and the last.
    limited: bool,
    prev_limited: bool,
}

impl CwndUse {
    /// New data acknowledged up to `ack_pos`, `snd_max` the highest sent: past the round's
    /// end, a new round begins.
    fn on_ack(&mut self, ack_pos: u64, snd_max: u64) {
        if ack_pos >= self.round_end {
            self.prev_flight = self.flight;
            self.prev_limited = self.limited;
            self.flight = 0;
            self.limited = false;
            self.round_end = snd_max;
        }
    }

    /// Whether a window of `cwnd` octets was used enough to grow: a send found it full, or
    /// (slow start's doubling) it is less than twice the most that was in flight.
    fn allows_growth(&self, cwnd: u64) -> bool {
        self.limited || self.prev_limited || cwnd < 2 * self.flight.max(self.prev_flight)
    }
}

/// How a data segment's IPv4 and TCP headers are written (`Connection::emit_data`).
enum Headers {
    /// The general emitter: FIN, SACK blocks.
    General(SegmentRepr<'static>),
    /// The connection's prebuilt headers ([`DataHeader`]) with these fields.
    Prebuilt {
        window: u16,
        ts: (u32, u32),
        ack: u32,
    },
}

/// The reset to send in reply to a segment that matches no connection
/// (RFC 9293 3.10.7.1). `None` for an incoming RST.
pub fn reset_reply<'a>(seg: &SegmentRepr<'_>) -> Option<SegmentRepr<'a>> {
    if seg.flags.rst {
        return None;
    }
    let (seq, ack, flags) = if seg.flags.ack {
        (
            seg.ack,
            0,
            TcpFlags {
                rst: true,
                ..TcpFlags::default()
            },
        )
    } else {
        (
            0,
            seg.seq.wrapping_add(seg.seq_len()),
            TcpFlags {
                rst: true,
                ack: true,
                ..TcpFlags::default()
            },
        )
    };
    Some(SegmentRepr {
        src_addr: seg.dst_addr,
        // No connection's setting applies: the segment's own DSCP, as Linux answers a
        // segment no socket owns (its ECN field cleared: this TCP does not do ECN).
        tos: seg.tos & 0xfc,
        dst_addr: seg.src_addr,
        src_port: seg.dst_port,
        dst_port: seg.src_port,
        seq,
        ack,
        flags,
        window: 0,
        options: TcpOptions::default(),
        payload: &[],
    })
}

/// Whether `seq` lies in `[lo, hi)` in sequence space.
pub fn seq_in_range(seq: u32, lo: u32, hi: u32) -> bool {
    seq_ge(seq, lo) && seq_lt(seq, hi)
}
