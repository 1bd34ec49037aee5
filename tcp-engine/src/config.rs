//! Per-connection configuration.

use crate::cc::{CongestionAlgorithm, SlowStart};
use core::time::Duration;

/// How the application hands data to TCP for transmission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TxMode {
    /// Plain byte stream: segments are cut at EMSS wherever that falls.
    #[default]
    Stream,
    /// MPA-aware (RFC 5044 5, draft-ietf-rddp-mpa-01 5.3): the caller gives
    /// whole records (FPDUs); every segment starts with a record and holds
    /// only whole records, packing several when they fit; a record larger
    /// than EMSS is split at EMSS; retransmissions keep the boundaries.
    Records,
    /// Records as in [`TxMode::Records`], but TCP holds none of their octets: the caller
    /// announces each record's length ([`crate::Connection::send_record_len`]) and produces
    /// the octets of any stream range on demand, for first transmission and retransmission
    /// alike, through the [`crate::TxSource`] given to
    /// [`crate::Connection::poll_transmit_with`] (so an MPA layer can frame FPDUs straight
    /// into the packet buffer from registered memory and keep no retransmission copy). The
    /// caller keeps what it needs to reproduce the octets until
    /// [`crate::Connection::bytes_acked`] passes them.
    Source,
}

/// How received data goes to the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RxMode {
    /// Plain in-order delivery through [`crate::Connection::recv`]; out-of-
    /// order data is buffered inside TCP.
    #[default]
    InOrder,
    /// MPA-aware (RFC 5044 3.1.2 "passing" vs. "delivering"): every accepted
    /// segment's new data is passed up at once with its sequence number, even
    /// out of order, and TCP keeps none of it. The window advertised is what
    /// the upper layer says it can still place.
    PassUp,
}

/// Connection parameters. `Config::default()` is a datacenter profile: see
/// the field documentation for each choice.
#[derive(Debug, Clone)]
pub struct Config {
    /// MSS we advertise (RFC 9293 3.7.1); default 1460 (1500-octet MTU).
    pub mss: u16,
    /// Initial path MTU for the send side; default 1500.
    pub path_mtu: u16,
    /// The lowest path MTU a "packet too big" report may set
    /// ([`crate::Connection::handle_packet_too_big`]); reports below it are ignored (RFC 5927
    /// 7.2: a forged tiny MTU would make every segment mostly headers). Default 552, Linux's
    /// `min_pmtu` (512 octets of data and 40 of headers).
    pub min_path_mtu: u16,
    /// How long a path MTU lowered by "packet too big" reports is kept: this long after the
    /// last believed report, the path MTU goes back to [`path_mtu`](Self::path_mtu) (the
    /// first hop's), so that a path that grew again is used whole (RFC 1191 6.3: at least 5
    /// minutes, 10 recommended; Linux's `mtu_expires`, 600 s). If the path is still narrow,
    /// the next large segment draws a new report and the path MTU falls again. `None` keeps
    /// it lowered for the connection's life. Default 10 minutes.
    pub path_mtu_expiry: Option<Duration>,
    /// Transmit API.
    pub tx_mode: TxMode,
    /// Receive API.
    pub rx_mode: RxMode,
    /// Send buffer capacity in octets (unacknowledged + unsent data).
    pub send_buffer: usize,
    /// `InOrder`: receive buffer size (the window). `PassUp`: the initial
    /// receive window until [`crate::Connection::set_receive_window`].
    pub recv_buffer: usize,
    /// Largest receive window we will ever offer; decides our window-scale
    /// shift (RFC 7323 2.3).
    pub max_recv_window: u64,
    /// Most disjoint out-of-order ranges tracked past `rcv_nxt`; a segment
    /// that would need another is dropped (and counted).
    pub max_ooo_ranges: usize,
    /// Offer window scaling (RFC 7323 2).
    pub window_scaling: bool,
    /// Offer timestamps (RFC 7323 3, PAWS 5).
    pub timestamps: bool,
    /// PAWS reordering tolerance (RFC 7323 5.3 R1, relaxed): a segment is
    /// dropped as an old duplicate only if its TSval is older than TS.Recent
    /// by more than this. Strict R1 (zero) drops legitimately reordered
    /// segments: a retransmission that fills a hole moves TS.Recent past the
    /// TSvals of segments sent before it and still in flight, so every one
    /// of them that arrives after it is discarded and must be sent again
    /// (Linux allows one tick). PAWS only has to reject segments from an
    /// earlier wrap of the sequence space, which are at least 2^32 octets
    /// old: default 20 ms keeps that true up to 1.7 Tbit/s while accepting
    /// reordering of up to 20 ms.
    pub paws_tolerance: Duration,
    /// Offer SACK (RFC 2018).
    pub sack: bool,
    /// Offer the TCP RDMA option (draft-csapuntz-tcprdma-00 3.2: its 2-octet form on the SYN
    /// and the SYN-ACK; it is in use only when both sides sent it,
    /// [`crate::Connection::rdma_option_enabled`]). A SYN-ACK carrying a SYN cookie never
    /// offers it (the cookie cannot remember the offer). Default off.
    pub rdma_option: bool,
    /// Congestion controller.
    pub congestion: CongestionAlgorithm,
    /// Initial window in segments (RFC 6928: 10).
    pub initial_window_segments: u32,
    /// Slow start's growth per ACK (RFC 3465 L; default: every octet acknowledged counts, as
    /// in Linux, so that stretch ACKs do not slow slow start down).
    pub slow_start: SlowStart,
    /// RTO before any RTT sample (RFC 6298 2.1: 1 s).
    pub initial_rto: Duration,
    /// Floor on the RTO's variance term, so on the RTO too: RTO = SRTT + max(`min_rto`,
    /// 4 RTTVAR), as Linux floors it (RFC 6298 2.4 floors the whole RTO at 1 s; Linux's
    /// `rto_min` is 200 ms). Default
    /// 5 ms: on microsecond-RTT links a 200 ms floor makes every tail loss
    /// cost ~10^4 RTTs. RACK-TLP recovers most losses without the RTO, and
    /// 5 ms stays above the delayed-ACK timeouts this engine uses, so
    /// spurious timeouts from delayed ACKs are rare. Raise it for WAN peers
    /// with 40 ms delayed ACKs.
    pub min_rto: Duration,
    /// Ceiling on the RTO (RFC 6298 2.5: at least 60 s). A ceiling below `min_rto` is raised
    /// to it: the floor wins.
    pub max_rto: Duration,
    /// Retransmission timeouts in a row before the connection is aborted, once the series
    /// has also lasted as long as that many timeouts doubling from `min_rto` would (an RTT
    /// sample, from a SACK say, collapses the backoff, RFC 6298 5.7; Linux's `tcp_retries2`
    /// is a time the same way).
    pub max_retransmissions: u32,
    /// SYN-ACK retransmissions before a half-open connection (SYN-RECEIVED) is dropped.
    /// Default 5, as Linux's `tcp_synack_retries`: about a minute with the 1 s initial RTO
    /// (1 + 2 + 4 + 8 + 16 + 32 s), so that a peer that never completes the handshake holds a
    /// listener's backlog slot no longer.
    pub max_synack_retransmissions: u32,
    /// Delayed-ACK timeout (RFC 1122 4.2.3.2, RFC 5681 4.2: < 500 ms, ACK at
    /// least every second full segment); `None` acks every segment.
    /// Default 500 us.
    pub delayed_ack: Option<Duration>,
    /// Data segments acknowledged at once at connection start (quick-ACK,
    /// lets the peer's slow start grow without waiting on delayed ACKs).
    pub quickack_segments: u32,
    /// In-order data segments received before an ACK is sent at once (after the quick-ACK
    /// segments). 2 is RFC 5681 4.2's "at least every second full-sized segment" (RFC 1122
    /// 4.2.3.2). A larger value sends stretch ACKs while data streams in (RFC 9293 3.8.6.3;
    /// RFC 2525 2.13 on their cost to the sender's window growth, which byte counting, RFC
    /// 3465, limits): out-of-order data, data filling a hole and duplicates are still
    /// acknowledged at once (RFC 5681 4.2), a segment with PSH (the sender drained what it
    /// had queued) falls back to every second segment (a lone one still waits, so a reply can
    /// carry its ACK), and, as always, the delayed-ACK timer bounds the wait. Below 1 means 1.
    /// Default 2.
    pub ack_every_segments: u32,
    /// Peer's assumed worst-case ACK delay for the tail-loss probe
    /// (RFC 8985 7.2 WCDelAckT).
    pub peer_max_ack_delay: Duration,
    /// Use RACK-TLP (RFC 8985) when the peer supports SACK.
    pub rack_tlp: bool,
    /// Keepalive (RFC 9293 3.8.4): idle time before the first probe, the
    /// interval between probes and how many unanswered probes abort (at least one probe
    /// is sent, and probes at most every millisecond). No probe while sent data is
    /// outstanding or data waits to go (MUST-26): the retransmission and persist timers watch
    /// the peer then. `None` (default) disables it.
    pub keepalive: Option<(Duration, Duration, u32)>,
    /// User timeout (RFC 5482; RFC 9293 3.10.8 USER TIMEOUT, the R2 of 3.8.3): when data has waited this long
    /// on the peer without progress (unacknowledged, or unsent behind a window that never
    /// opens), the connection aborts with [`crate::Event::TimedOut`]. `None` (default):
    /// only `max_retransmissions` ends it.
    pub user_timeout: Option<Duration>,
    /// TIME-WAIT duration (RFC 9293 3.6.1's 2 MSL). Default 60 s, as Linux's
    /// `TCP_TIMEWAIT_LEN` (RFC 9293 3.4.2 takes MSL as 2 minutes). The peer's FIN again
    /// restarts it, but not beyond four periods after TIME-WAIT began.
    pub time_wait: Duration,
    /// Longest time in FIN-WAIT-2, waiting for the peer's FIN (as Linux's `tcp_fin_timeout`
    /// for a connection its application closed): our FIN is acknowledged, so no timer of RFC
    /// 9293 runs, and a peer that never closes its side (its kernel answering keepalives from
    /// CLOSE-WAIT, or sending an octet now and then) would hold the connection for ever. On
    /// expiry the connection is reset and closed ([`crate::Event::Closed`],
    /// `ConnStats::fin_wait2_timeouts`). Data the peer sends meanwhile is still received, but
    /// does not extend the time: a half-closed connection receives for this long at most
    /// after our FIN. `None`: wait for ever. Default 60 s.
    pub fin_wait2_timeout: Option<Duration>,
    /// The IPv4 Type of Service octet of every segment the connection (or a listener, for
    /// its SYN-ACKs and the connections it accepts) sends (`IP_TOS`, rdma_cm's
    /// `RDMA_OPTION_ID_TOS`): the DSCP in its upper six bits (RFC 2474 3). Its lower two bits,
    /// the ECN field, are sent as 0 (Not-ECT) whatever they hold here, as Linux does for TCP:
    /// this TCP does not negotiate ECN (RFC 3168 6.1.1). Default 0.
    pub tos: u8,
    /// Nagle's algorithm (RFC 9293 3.7.4); off by default.
    pub nagle: bool,
    /// Most challenge ACKs per second (RFC 5961 7).
    pub challenge_ack_limit: u32,
    /// Least time between two duplicate ACKs answering segments without data that fall
    /// outside the receive window or fail PAWS (RFC 9293 3.10.7.4 first, RFC 7323 5.3 R1), as
    /// Linux's `tcp_invalid_ratelimit`: two ends whose states disagree do not trade ACKs for
    /// ever, and a blind sender does not draw a reply per packet. Segments carrying data or a
    /// FIN are always answered (the ACK may carry the D-SACK their sender needs). Default
    /// 500 ms.
    pub invalid_ack_interval: Duration,
    /// `PassUp`: hand up again data that was already passed up.
    pub pass_up_duplicates: bool,
}

/// The ECN field of the Type of Service octet (RFC 3168 5).
const ECN_MASK: u8 = 0x03;

impl Default for Config {
    fn default() -> Self {
        Config {
            mss: 1460,
            path_mtu: 1500,
            min_path_mtu: 552,
            path_mtu_expiry: Some(Duration::from_secs(600)),
            tx_mode: TxMode::Stream,
            rx_mode: RxMode::InOrder,
            send_buffer: 4 << 20,
            recv_buffer: 4 << 20,
            max_recv_window: 64 << 20,
            max_ooo_ranges: 64,
            window_scaling: true,
            timestamps: true,
            paws_tolerance: Duration::from_millis(20),
            sack: true,
            congestion: CongestionAlgorithm::Cubic,
            initial_window_segments: 10,
            slow_start: SlowStart::default(),
            initial_rto: Duration::from_secs(1),
            min_rto: Duration::from_millis(5),
            max_rto: Duration::from_secs(60),
            max_retransmissions: 15,
            max_synack_retransmissions: 5,
            delayed_ack: Some(Duration::from_micros(500)),
            quickack_segments: 16,
            ack_every_segments: 2,
            peer_max_ack_delay: Duration::from_millis(1),
            rack_tlp: true,
            keepalive: None,
            user_timeout: None,
            time_wait: Duration::from_secs(60),
            fin_wait2_timeout: Some(Duration::from_secs(60)),
            tos: 0,
            nagle: false,
            challenge_ack_limit: 100,
            invalid_ack_interval: Duration::from_millis(500),
            pass_up_duplicates: false,
            rdma_option: false,
        }
    }
}

impl Config {
    /// The Type of Service octet as sent: [`tos`](Self::tos) with the ECN field cleared.
    pub fn sent_tos(&self) -> u8 {
        self.tos & !ECN_MASK
    }

    /// The MPA profile: record transmit and pass-up receive.
    pub fn mpa() -> Self {
        Config {
            tx_mode: TxMode::Records,
            rx_mode: RxMode::PassUp,
            ..Config::default()
        }
    }
}
