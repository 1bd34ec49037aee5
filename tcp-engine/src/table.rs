//! The connection table: O(1) demultiplexing by 4-tuple (a hash map into a
//! slab), listeners with a backlog (RFC 9293 3.10.7.2), RST replies for
//! segments that match nothing (3.10.7.1), a ready queue for transmission
//! and a timer heap, so the cost per packet does not grow with the number
//! of connections.

use std::collections::{HashMap, VecDeque};

use crate::config::Config;
use crate::conn::{
    reset_reply, Connection, PacketTooBigError, PassUpReply, PassedUp, State, TakeBack, TxSource,
    TxSourceError,
};
use crate::isn::IsnGenerator;
use crate::syncookie;
use crate::time::Instant;
use crate::timers::TimerQueue;
use crate::wire::{FourTuple, SegmentRepr, WireError};
use core::net::Ipv4Addr;

/// The transmit sources of the table's [`crate::TxMode::Source`] connections, by handle
/// (see [`ConnectionTable::poll_transmit_with`]).
pub trait TxSources {
    /// [`TxSource::fill`] for connection `id`.
    fn fill(&mut self, id: ConnId, stream_offset: u64, out: &mut [u8])
        -> Result<(), TxSourceError>;

    /// [`TxSource::fill_summed`] for connection `id`; the default calls
    /// [`fill`](Self::fill) and gives no sum.
    fn fill_summed(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u16>, TxSourceError> {
        self.fill(id, stream_offset, out).map(|()| None)
    }

    /// [`TxSource::fill_split`] for connection `id`; the default fills piece by piece with
    /// [`fill_summed`](Self::fill_summed).
    fn fill_split(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        len: usize,
        first: &mut [u8],
        rest: &mut [&mut [u8]],
    ) -> Result<u16, TxSourceError> {
        crate::conn::fill_in_pieces(stream_offset, len, first, rest, |offset, out| {
            self.fill_summed(id, offset, out)
        })
    }
}

/// What processing a received packet calls back into ([`ConnectionTable::handle_packet_with`]).
pub trait Receiver {
    /// The ones' complement sum of a segment's data (RFC 1071, as
    /// [`Checksum::sum`](crate::wire::Checksum::sum) gives it), the payload's share of the TCP
    /// checksum (RFC 9293 3.1), before the segment is checked further or matched to a
    /// connection. A receiver that reads the data for more than the checksum (an FPDU's CRC)
    /// can do both in one read here; a wrong sum fails the checksum.
    fn payload_sum(&mut self, payload: &[u8]) -> u16 {
        crate::wire::Checksum::new().add_bytes(payload).sum()
    }

    /// Data passed up ([`crate::RxMode::PassUp`]) for connection `id`; the answer as
    /// [`Connection::handle_segment`]'s callback gives it.
    fn pass_up(&mut self, id: ConnId, data: PassedUp<'_>) -> Option<TakeBack>;
}

/// A closure as a [`Receiver`] that sums payloads the plain way.
struct PassUpFn<F>(F);

impl<R: PassUpReply, F: FnMut(ConnId, PassedUp<'_>) -> R> Receiver for PassUpFn<F> {
    fn pass_up(&mut self, id: ConnId, data: PassedUp<'_>) -> Option<TakeBack> {
        (self.0)(id, data).take_back()
    }
}

/// One connection's view of a [`TxSources`].
struct SourceOf<'a> {
    id: ConnId,
    sources: &'a mut dyn TxSources,
}

impl TxSource for SourceOf<'_> {
    fn fill(&mut self, stream_offset: u64, out: &mut [u8]) -> Result<(), TxSourceError> {
        self.sources.fill(self.id, stream_offset, out)
    }

    fn fill_summed(
        &mut self,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u16>, TxSourceError> {
        self.sources.fill_summed(self.id, stream_offset, out)
    }

    fn fill_split(
        &mut self,
        stream_offset: u64,
        len: usize,
        first: &mut [u8],
        rest: &mut [&mut [u8]],
    ) -> Result<u16, TxSourceError> {
        self.sources
            .fill_split(self.id, stream_offset, len, first, rest)
    }
}

/// Handle of a connection in the table (stale handles are detected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId {
    index: u32,
    generation: u32,
}

impl ConnId {
    /// The connection's slot in the table: small and dense (a slot is reused, under a new
    /// generation, after its connection is removed), for arrays indexed by connection.
    pub fn index(self) -> usize {
        self.index as usize
    }
}

/// Why a table operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// A connection with this 4-tuple exists.
    #[error("4-tuple in use")]
    TupleInUse,
    /// The table is at its configured capacity.
    #[error("connection table full")]
    Full,
}

/// Packet-level counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Packets dropped because they failed parsing, by reason.
    pub bad_checksum: u64,
    /// Bad IPv4 header or not TCP or fragments.
    pub bad_ip: u64,
    /// Bad data offset.
    pub bad_data_offset: u64,
    /// Truncated or malformed options.
    pub bad_options: u64,
    /// Truncated packets.
    pub truncated: u64,
    /// Segments for no connection and no listener.
    pub no_connection: u64,
    /// RSTs generated for such segments.
    pub resets_sent: u64,
    /// SYNs dropped because a listener's backlog was full (SYN cookies off; with them on, the
    /// SYN is answered with a cookie, `syncookies_sent`).
    pub backlog_drops: u64,
    /// Connections created from SYNs (or SYN cookies).
    pub passive_opens: u64,
    /// Passive connections whose handshake completed, queued for [`ConnectionTable::accept`].
    pub queued_for_accept: u64,
    /// SYN-ACKs sent with a SYN cookie (the listener's half-open queue was full).
    pub syncookies_sent: u64,
    /// Cookie SYN-ACKs not sent: too many replies were waiting to go out.
    pub syncookies_dropped: u64,
    /// ACKs that brought back a good SYN cookie (each made a connection).
    pub syncookies_validated: u64,
    /// ACKs for no connection to a listening port whose cookie was not good.
    pub syncookies_failed: u64,
    /// ACKs with a good cookie dropped because the listener's accept queue was full (or the
    /// table): no RST, as Linux's default (`tcp_abort_on_overflow` 0), so the client's next
    /// segment gets in once the application has accepted, while the cookie is good (a client
    /// that speaks first, as MPA's and IFT's do, resends its first data; one that waits for
    /// the server to speak comes back only with its keepalive).
    pub syncookies_deferred: u64,
    /// Segments to a listening port with neither SYN, ACK nor RST (a bare FIN, a NULL
    /// segment), dropped without a reply (RFC 9293 3.10.7.2).
    pub listen_ignored: u64,
    /// Challenge ACKs (RFC 5961 7) withheld by the table-wide limit
    /// ([`ConnectionTable::set_challenge_ack_limit`]).
    pub challenge_acks_limited: u64,
    /// SYNs that ended a 4-tuple's TIME-WAIT and opened a new incarnation at a listener
    /// (RFC 6191).
    pub time_wait_reused: u64,
    /// Connections in TIME-WAIT or FIN-WAIT-2 ended early because more than a quarter of the
    /// table lingered so ([`ConnectionTable`]'s lingering limit).
    pub lingering_ended: u64,
    /// SYNs (and returning SYN cookies) dropped because every slot of the table was taken.
    pub table_full_drops: u64,
}

/// What an ACK to a listening port did with a SYN cookie ([`ConnectionTable`]'s
/// `cookie_connection`).
enum Cookie {
    /// No good cookie (or none may come back now): the ACK is for no connection.
    None,
    /// A good cookie, but no room for its connection now: dropped, no RST.
    Deferred,
    /// A good cookie: the connection at this index.
    Connection(u32),
}

/// A table-wide limit on challenge ACKs per second (Linux's `tcp_challenge_ack_limit`), on
/// top of each connection's own (`Config::challenge_ack_limit`): an attacker spraying
/// spoofed RSTs or SYNs over many connections cannot make the host answer each of them.
///
/// Each second's budget is drawn afresh, secretly (a keyed hash of the window's number),
/// between half and one and a half times the limit (Linux's answer to CVE-2016-5696): with a
/// fixed budget shared by every connection, an off-path attacker who spends it on its own
/// connections could count how much of it a spoofed segment on someone else's connection used
/// up, and so learn whether that connection exists and where its sequence numbers lie
/// (RFC 5961 10).
#[derive(Debug)]
struct ChallengeLimit {
    per_second: u32,
    window_start: Option<Instant>,
    /// Windows begun so far (the budget's hash input).
    windows: u64,
    budget: u32,
    sent: u32,
}

impl ChallengeLimit {
    fn allow(&mut self, now: Instant, isn: &IsnGenerator) -> bool {
        match self.window_start {
            Some(start) if now - start < core::time::Duration::from_secs(1) => {}
            _ => {
                self.window_start = Some(now);
                self.sent = 0;
                self.windows = self.windows.wrapping_add(1);
                self.budget = match self.per_second {
                    0 => 0,
                    p => {
                        let spread = isn.keyed(self.windows) % u64::from(p);
                        p.div_ceil(2).saturating_add(spread as u32)
                    }
                };
            }
        }
        if self.sent < self.budget {
            self.sent += 1;
            true
        } else {
            false
        }
    }
}

/// The default of [`ConnectionTable::set_challenge_ack_limit`] (Linux's former default).
pub const DEFAULT_CHALLENGE_ACK_LIMIT: u32 = 1000;

#[derive(Debug)]
struct Listener {
    config: Config,
    backlog: usize,
    pending: usize,
    accept_queue: VecDeque<ConnId>,
    /// When (the cookies' clock) it last answered a SYN with a cookie: only within a
    /// cookie's lifetime after that is an ACK for no connection taken for a cookie's return.
    cookie_sent_at: Option<u32>,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    conn: Option<Connection>,
    tuple: Option<FourTuple>,
    listener: Option<(Ipv4Addr, u16)>,
    queued_for_accept: bool,
    deadline: Option<Instant>,
    ready: bool,
    /// The connection lingers now ([`Connection::is_lingering`]: TIME-WAIT, or FIN-WAIT-2
    /// orphaned), counted in `lingering_now` and queued in `lingering`.
    lingering: bool,
}

/// The connections by 4-tuple, remembering the last received segment's hit: one connection's
/// segments usually come in runs, and the map's SipHash (kept: the tuples come from the
/// network) ran once per segment. Every change of the map forgets that hit, so the two never
/// disagree.
#[derive(Debug)]
struct TupleIndex {
    map: HashMap<FourTuple, u32>,
    last_rx: Option<(FourTuple, u32)>,
}

impl TupleIndex {
    fn with_capacity(n: usize) -> Self {
        TupleIndex {
            map: HashMap::with_capacity(n),
            last_rx: None,
        }
    }

    fn get(&self, tuple: &FourTuple) -> Option<u32> {
        self.map.get(tuple).copied()
    }

    /// [`TupleIndex::get`] for a received segment's tuple, from the last hit when it is the
    /// same tuple again.
    fn get_received(&mut self, tuple: &FourTuple) -> Option<u32> {
        match self.last_rx {
            Some((t, index)) if t == *tuple => Some(index),
            _ => {
                let index = self.get(tuple);
                self.last_rx = index.map(|i| (*tuple, i));
                index
            }
        }
    }

    fn insert(&mut self, tuple: FourTuple, index: u32) {
        self.map.insert(tuple, index);
        self.last_rx = None;
    }

    fn remove(&mut self, tuple: &FourTuple) {
        self.map.remove(tuple);
        self.last_rx = None;
    }
}

/// All connections of one engine.
#[derive(Debug)]
pub struct ConnectionTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    by_tuple: TupleIndex,
    listeners: HashMap<(Ipv4Addr, u16), Listener>,
    isn: IsnGenerator,
    /// Each slot's earliest deadline (one entry per slot).
    timers: TimerQueue,
    ready: VecDeque<u32>,
    /// Replies sent for no connection: RSTs, and SYN-ACKs carrying SYN cookies.
    control: VecDeque<SegmentRepr<'static>>,
    syn_cookies: bool,
    max_connections: usize,
    stats: TableStats,
    challenge: ChallengeLimit,
    /// Connections that came to linger (TIME-WAIT, or FIN-WAIT-2 orphaned), oldest first;
    /// entries of connections that no longer linger are skipped when met, and dropped
    /// together when they outnumber the table's slots.
    lingering: VecDeque<ConnId>,
    /// The connections lingering now (slots whose `lingering` is set).
    lingering_now: usize,
    /// The most lingering connections kept: a quarter of the table.
    max_lingering: usize,
}

/// Whether a SYN cookie `l` sent may still come back at `now_minute` (the cookies' clock):
/// one was sent within a cookie's lifetime.
fn cookie_may_return(l: &Listener, now_minute: u32) -> bool {
    l.cookie_sent_at
        .is_some_and(|m| now_minute.wrapping_sub(m) <= syncookie::MAX_AGE_MINUTES)
}

/// The most replies for no connection (RSTs, cookie SYN-ACKs) waiting to be sent.
const MAX_PENDING_CONTROL: usize = 256;

/// The SYN cookies' clock: minutes of `now`.
fn minute(now: Instant) -> u32 {
    (now.as_millis() / 60_000) as u32
}

impl ConnectionTable {
    /// A table for up to `max_connections`, with the ISN secret `isn_key`.
    pub fn new(isn_key: [u8; 16], max_connections: usize) -> Self {
        ConnectionTable {
            slots: Vec::with_capacity(max_connections),
            free: Vec::with_capacity(max_connections),
            by_tuple: TupleIndex::with_capacity(max_connections),
            listeners: HashMap::new(),
            isn: IsnGenerator::new(isn_key),
            timers: TimerQueue::with_capacity(max_connections),
            ready: VecDeque::with_capacity(max_connections),
            control: VecDeque::with_capacity(MAX_PENDING_CONTROL),
            syn_cookies: true,
            max_connections,
            stats: TableStats::default(),
            challenge: ChallengeLimit {
                per_second: DEFAULT_CHALLENGE_ACK_LIMIT,
                window_start: None,
                windows: 0,
                budget: 0,
                sent: 0,
            },
            lingering: VecDeque::with_capacity(max_connections),
            lingering_now: 0,
            max_lingering: (max_connections / 4).max(1),
        }
    }

    /// Challenge ACKs per second the whole table sends, on average (default
    /// [`DEFAULT_CHALLENGE_ACK_LIMIT`]), on top of each connection's limit: each second's
    /// budget is drawn in secret between half and one and a half times it (see the limit's
    /// documentation); 0 sends none. Takes effect from the next second.
    pub fn set_challenge_ack_limit(&mut self, per_second: u32) {
        self.challenge.per_second = per_second;
    }

    /// Counters.
    pub fn stats(&self) -> &TableStats {
        &self.stats
    }

    /// Live connections (including TIME-WAIT and not yet removed closed ones).
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether the table holds no connection.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Accept connections on `addr:port` (`addr` unspecified: any address);
    /// at most `backlog` connections may be half-open or waiting in
    /// [`ConnectionTable::accept`].
    pub fn listen(&mut self, addr: Ipv4Addr, port: u16, backlog: usize, config: Config) {
        self.listeners.insert(
            (addr, port),
            Listener {
                config,
                backlog,
                pending: 0,
                accept_queue: VecDeque::with_capacity(backlog),
                cookie_sent_at: None,
            },
        );
    }

    /// Stops accepting connections on `addr:port` (a CLOSE of a socket in LISTEN, RFC 9293
    /// 3.10.4): SYNs to it meet no connection from now on (a RST, 3.10.7.1). The listener's
    /// connections nobody took with [`ConnectionTable::accept`] yet, half-open or waiting in
    /// its queue, are aborted (their RST queued, 3.10.4 ABORT) and their slots freed once it
    /// is sent; connections already accepted are not affected. Returns whether there was such
    /// a listener.
    pub fn unlisten(&mut self, addr: Ipv4Addr, port: u16) -> bool {
        let key = (addr, port);
        if self.listeners.remove(&key).is_none() {
            return false;
        }
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            if slot.listener != Some(key) {
                continue;
            }
            let Some(conn) = slot.conn.as_mut() else {
                continue;
            };
            conn.abort();
            if let Some(t) = slot.tuple.take() {
                self.by_tuple.remove(&t);
            }
            // Unaccepted now: freed when it leaves the ready queue with its RST sent.
            slot.queued_for_accept = false;
            let index = index as u32;
            if conn.wants_transmit() {
                self.mark_ready(index);
            } else {
                self.reap_unaccepted(index);
            }
        }
        true
    }

    /// Take an established connection from a listener's queue.
    pub fn accept(&mut self, addr: Ipv4Addr, port: u16) -> Option<ConnId> {
        let l = self.listeners.get_mut(&(addr, port))?;
        let id = l.accept_queue.pop_front()?;
        l.pending = l.pending.saturating_sub(1);
        if let Some(slot) = self.slots.get_mut(id.index as usize) {
            slot.listener = None;
        }
        Some(id)
    }

    fn insert(
        &mut self,
        conn: Connection,
        listener: Option<(Ipv4Addr, u16)>,
    ) -> Result<ConnId, TableError> {
        let tuple = conn.four_tuple();
        if self.by_tuple.get(&tuple).is_some() {
            return Err(TableError::TupleInUse);
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                if self.slots.len() >= self.max_connections {
                    return Err(TableError::Full);
                }
                self.slots.push(Slot {
                    generation: 0,
                    conn: None,
                    tuple: None,
                    listener: None,
                    queued_for_accept: false,
                    deadline: None,
                    ready: false,
                    lingering: false,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.conn = Some(conn);
        slot.tuple = Some(tuple);
        slot.listener = listener;
        slot.queued_for_accept = false;
        slot.deadline = None;
        self.timers.set(index, None);
        slot.ready = false;
        let id = ConnId {
            index,
            generation: slot.generation,
        };
        self.by_tuple.insert(tuple, index);
        self.mark_ready(index);
        Ok(id)
    }

    /// Active open.
    pub fn connect(
        &mut self,
        config: Config,
        tuple: FourTuple,
        now: Instant,
    ) -> Result<ConnId, TableError> {
        if self.by_tuple.get(&tuple).is_some() {
            return Err(TableError::TupleInUse);
        }
        let conn = Connection::connect(config, tuple, &self.isn, now);
        self.insert(conn, None)
    }

    /// The connection for `tuple`, O(1).
    pub fn lookup(&self, tuple: &FourTuple) -> Option<ConnId> {
        let index = self.by_tuple.get(tuple)?;
        let slot = &self.slots[index as usize];
        Some(ConnId {
            index,
            generation: slot.generation,
        })
    }

    fn slot(&self, id: ConnId) -> Option<&Slot> {
        self.slots
            .get(id.index as usize)
            .filter(|s| s.generation == id.generation && s.conn.is_some())
    }

    /// Read access to a connection.
    pub fn get(&self, id: ConnId) -> Option<&Connection> {
        self.slot(id)?.conn.as_ref()
    }

    /// Write access (sending, closing, reading): the connection is queued
    /// for transmission and its timers are re-read at the next poll.
    pub fn get_mut(&mut self, id: ConnId) -> Option<&mut Connection> {
        self.slot(id)?;
        self.mark_ready(id.index);
        self.slots[id.index as usize].conn.as_mut()
    }

    /// Forget a connection (normally once it is closed).
    pub fn remove(&mut self, id: ConnId) -> Option<Connection> {
        self.slot(id)?;
        let slot = &mut self.slots[id.index as usize];
        if let Some(t) = slot.tuple.take() {
            if self.by_tuple.get(&t) == Some(id.index) {
                self.by_tuple.remove(&t);
            }
        }
        if let Some(key) = slot.listener.take() {
            if let Some(l) = self.listeners.get_mut(&key) {
                l.pending = l.pending.saturating_sub(1);
                l.accept_queue.retain(|q| *q != id);
            }
        }
        slot.generation = slot.generation.wrapping_add(1);
        slot.deadline = None;
        if std::mem::take(&mut slot.lingering) {
            self.lingering_now -= 1;
        }
        let conn = slot.conn.take();
        self.timers.set(id.index, None);
        self.free.push(id.index);
        conn
    }

    fn mark_ready(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        if !slot.ready {
            slot.ready = true;
            self.ready.push_back(index);
        }
    }

    fn count_error(&mut self, e: WireError) {
        let s = &mut self.stats;
        match e {
            WireError::BadTcpChecksum | WireError::BadIpv4Checksum => s.bad_checksum += 1,
            WireError::BadDataOffset => s.bad_data_offset += 1,
            WireError::TruncatedOption | WireError::BadOptionLength => s.bad_options += 1,
            WireError::Truncated => s.truncated += 1,
            _ => s.bad_ip += 1,
        }
    }

    /// Process one received IPv4 packet. Malformed packets are counted and
    /// dropped. Data passed up (PassUp mode) goes to `pass_up` with the
    /// connection's handle; it may answer as [`Connection::handle_segment`]'s callback does.
    pub fn handle_packet<R: PassUpReply>(
        &mut self,
        now: Instant,
        packet: &[u8],
        pass_up: impl FnMut(ConnId, PassedUp<'_>) -> R,
    ) -> Result<Option<ConnId>, WireError> {
        self.handle_packet_with(now, packet, &mut PassUpFn(pass_up))
    }

    /// [`handle_packet`](Self::handle_packet) calling back into `rx`: its
    /// [`payload_sum`](Receiver::payload_sum) for the TCP checksum, then its
    /// [`pass_up`](Receiver::pass_up) for data.
    pub fn handle_packet_with<R: Receiver + ?Sized>(
        &mut self,
        now: Instant,
        packet: &[u8],
        rx: &mut R,
    ) -> Result<Option<ConnId>, WireError> {
        let seg = match SegmentRepr::parse_summing(packet, |p| rx.payload_sum(p)) {
            Ok(s) => s,
            Err(e) => {
                self.count_error(e);
                return Err(e);
            }
        };
        let mut pass_up = |id: ConnId, data: PassedUp<'_>| rx.pass_up(id, data);
        let tuple = FourTuple::of_received(&seg);
        let is_syn = seg.flags.syn && !seg.flags.ack && !seg.flags.rst;
        let mut isn_floor = None;
        if let Some(index) = self.by_tuple.get_received(&tuple) {
            isn_floor = is_syn
                .then(|| self.end_time_wait_for(index, &seg))
                .flatten();
            if isn_floor.is_none() {
                return Ok(self.on_connection_segment(now, index, &seg, &mut pass_up));
            }
        }
        // No connection: a listener may take a SYN, or the ACK of a SYN cookie.
        let key = self.listener_for(&seg);
        if let (Some(key), true) = (key, seg.flags.ack && !seg.flags.syn && !seg.flags.rst) {
            match self.cookie_connection(now, key, &seg) {
                Cookie::Connection(index) => {
                    return Ok(self.on_connection_segment(now, index, &seg, &mut pass_up));
                }
                Cookie::Deferred => return Ok(None),
                Cookie::None => {}
            }
        }
        if key.is_some() && !seg.flags.syn && !seg.flags.ack && !seg.flags.rst {
            // LISTEN, "any other control or text-bearing segment": drop it (RFC 9293
            // 3.10.7.2).
            self.stats.listen_ignored += 1;
            return Ok(None);
        }
        if is_syn {
            if let Some(key) = key {
                let Some(l) = self.listeners.get_mut(&key) else {
                    return Ok(None);
                };
                if l.pending >= l.backlog {
                    if !self.syn_cookies {
                        self.stats.backlog_drops += 1;
                    } else if self.control.len() >= MAX_PENDING_CONTROL {
                        self.stats.syncookies_dropped += 1;
                    } else {
                        let tuple = FourTuple::of_received(&seg);
                        let index = syncookie::mss_index(seg.options.mss.unwrap_or(536));
                        let cookie =
                            syncookie::encode(&self.isn, &tuple, seg.seq, minute(now), index);
                        let reply =
                            Connection::cookie_syn_ack(&l.config, &seg, cookie, &self.isn, now);
                        self.control.push_back(reply);
                        l.cookie_sent_at = Some(minute(now));
                        self.stats.syncookies_sent += 1;
                    }
                    return Ok(None);
                }
                let cfg = l.config.clone();
                if let Some(conn) = Connection::accept_with(cfg, &seg, &self.isn, now, isn_floor) {
                    match self.insert(conn, Some(key)) {
                        Ok(id) => {
                            if let Some(l) = self.listeners.get_mut(&key) {
                                l.pending += 1;
                            }
                            self.stats.passive_opens += 1;
                            if isn_floor.is_some() {
                                self.stats.time_wait_reused += 1;
                            }
                            return Ok(Some(id));
                        }
                        Err(TableError::Full) => self.stats.table_full_drops += 1,
                        Err(_) => {}
                    }
                }
                return Ok(None);
            }
        }
        self.stats.no_connection += 1;
        if let Some(rst) = reset_reply(&seg) {
            if self.control.len() < MAX_PENDING_CONTROL {
                self.control.push_back(rst);
            }
        }
        Ok(None)
    }

    /// The listener `seg` is addressed to: its address and port, or any address at its port.
    fn listener_for(&self, seg: &SegmentRepr<'_>) -> Option<(Ipv4Addr, u16)> {
        if self.listeners.contains_key(&(seg.dst_addr, seg.dst_port)) {
            Some((seg.dst_addr, seg.dst_port))
        } else if self
            .listeners
            .contains_key(&(Ipv4Addr::UNSPECIFIED, seg.dst_port))
        {
            Some((Ipv4Addr::UNSPECIFIED, seg.dst_port))
        } else {
            None
        }
    }

    /// Whether a segment for no connection, addressed to `dst`:`dst_port`, may make one now:
    /// a SYN (`syn`) that a listener has room for in its backlog, or an ACK that may bring
    /// back a SYN cookie the listener sent recently enough ([`ConnectionTable::handle_packet_with`]
    /// makes a connection of nothing else). When false, the table answers such a segment
    /// without keeping anything of it (a cookie SYN-ACK, a RST, nothing): a driver that
    /// shares flows between several tables need not claim the flow before it hands the
    /// segment over, so that a flood of SYNs answered with cookies, or of stray ACKs, writes
    /// nothing anywhere.
    pub fn may_open(&self, now: Instant, dst: Ipv4Addr, dst_port: u16, syn: bool) -> bool {
        let l = self
            .listeners
            .get(&(dst, dst_port))
            .or_else(|| self.listeners.get(&(Ipv4Addr::UNSPECIFIED, dst_port)));
        let Some(l) = l else {
            return false;
        };
        if syn {
            l.pending < l.backlog
        } else {
            self.syn_cookies && cookie_may_return(l, minute(now))
        }
    }

    /// A SYN for the connection in slot `index`: if that connection is in TIME-WAIT, a
    /// listener takes the SYN's address and port and has room for it (its backlog, and a
    /// slot of the table: the new incarnation is made at once, never a cookie), and the SYN
    /// may open a new incarnation ([`Connection::time_wait_successor_isn`], RFC 6191), the
    /// old one is closed (its owner reaps it as any closed connection) and its 4-tuple
    /// freed. Returns the new incarnation's ISN. Otherwise TIME-WAIT stays as it is.
    fn end_time_wait_for(&mut self, index: u32, syn: &SegmentRepr<'_>) -> Option<u32> {
        let key = self.listener_for(syn)?;
        let room = self
            .listeners
            .get(&key)
            .is_some_and(|l| l.pending < l.backlog)
            && (!self.free.is_empty() || self.slots.len() < self.max_connections);
        if !room {
            return None;
        }
        let slot = &mut self.slots[index as usize];
        let conn = slot.conn.as_mut()?;
        let isn = conn.time_wait_successor_isn(syn)?;
        conn.end_time_wait();
        if let Some(t) = slot.tuple.take() {
            self.by_tuple.remove(&t);
        }
        let id = ConnId {
            index,
            generation: slot.generation,
        };
        Self::follow_lingering(slot, id, &mut self.lingering, &mut self.lingering_now);
        self.mark_ready(index);
        Some(isn)
    }

    /// The connection a SYN cookie stood for, if `ack` (for no connection, to the listener
    /// `key`) brings back a good one and the listener's accept queue has room: made in
    /// SYN-RECEIVED, to take `ack` (RFC 4987 3.6). A good one that finds the accept queue (or
    /// the table) full is [`Cookie::Deferred`]: dropped without a reply, for the client to
    /// send again.
    fn cookie_connection(
        &mut self,
        now: Instant,
        key: (Ipv4Addr, u16),
        ack: &SegmentRepr<'_>,
    ) -> Cookie {
        if !self.syn_cookies {
            return Cookie::None;
        }
        // Only while a cookie it sent may still come back (as Linux's
        // `tcp_synq_no_recent_overflow`): otherwise every stray ACK to a listening port would
        // be a guess at a cookie, one in ~3.6e8 of which opens a connection, data and all.
        let now_minute = minute(now);
        let recent = self
            .listeners
            .get(&key)
            .is_some_and(|l| cookie_may_return(l, now_minute));
        if !recent {
            return Cookie::None;
        }
        let tuple = FourTuple::of_received(ack);
        let peer_isn = ack.seq.wrapping_sub(1);
        let cookie = ack.ack.wrapping_sub(1);
        let Some(mss_index) = syncookie::check(&self.isn, &tuple, peer_isn, cookie, now_minute)
        else {
            self.stats.syncookies_failed += 1;
            return Cookie::None;
        };
        let Some(l) = self.listeners.get(&key) else {
            return Cookie::None;
        };
        if l.accept_queue.len() >= l.backlog {
            self.stats.syncookies_deferred += 1;
            return Cookie::Deferred;
        }
        let conn = Connection::from_cookie(l.config.clone(), ack, mss_index, &self.isn, now);
        let id = match self.insert(conn, Some(key)) {
            Ok(id) => id,
            Err(e) => {
                if e == TableError::Full {
                    self.stats.table_full_drops += 1;
                    self.stats.syncookies_deferred += 1;
                    return Cookie::Deferred;
                }
                return Cookie::None;
            }
        };
        if let Some(l) = self.listeners.get_mut(&key) {
            l.pending += 1;
        }
        self.stats.passive_opens += 1;
        self.stats.syncookies_validated += 1;
        Cookie::Connection(id.index)
    }

    /// A "packet too big" report (an ICMP "fragmentation needed", RFC 792 and RFC 1191 4)
    /// about the segment of the connection `tuple` (from our side: the quoted segment's
    /// source is local, [`crate::wire::QuotedTcp::sender_tuple`]) with sequence number `seq`,
    /// naming next-hop MTU `mtu`: the connection validates it and lowers its path MTU
    /// ([`Connection::handle_packet_too_big`], RFC 5927 4.1 and 7.2), and is queued to
    /// resend at once what no longer fits. O(1) lookup, no allocation. Returns the
    /// connection and its new EMSS.
    pub fn handle_packet_too_big(
        &mut self,
        now: Instant,
        tuple: &FourTuple,
        seq: u32,
        mtu: u16,
    ) -> Result<(ConnId, u16), PacketTooBigError> {
        let index = self
            .by_tuple
            .get(tuple)
            .ok_or(PacketTooBigError::NoConnection)?;
        let slot = &mut self.slots[index as usize];
        let id = ConnId {
            index,
            generation: slot.generation,
        };
        let conn = slot.conn.as_mut().ok_or(PacketTooBigError::NoConnection)?;
        let emss = conn.handle_packet_too_big(now, seq, mtu)?;
        self.mark_ready(index);
        Ok((id, emss))
    }

    /// Whether a listener whose queue of half-open connections is full answers SYNs with SYN
    /// cookies ([`crate::syncookie`], RFC 4987 3.6; on by default, as Linux's
    /// `tcp_syncookies = 1`) instead of dropping them.
    pub fn set_syn_cookies(&mut self, on: bool) {
        self.syn_cookies = on;
    }

    /// A segment for the connection in slot `index`.
    #[inline]
    fn on_connection_segment<F: FnMut(ConnId, PassedUp<'_>) -> Option<TakeBack>>(
        &mut self,
        now: Instant,
        index: u32,
        seg: &SegmentRepr<'_>,
        pass_up: &mut F,
    ) -> Option<ConnId> {
        let slot = &mut self.slots[index as usize];
        let id = ConnId {
            index,
            generation: slot.generation,
        };
        let mut entered_lingering = false;
        if let Some(conn) = slot.conn.as_mut() {
            conn.handle_segment(now, seg, |p| pass_up(id, p));
            if conn.take_challenge_ack() && !self.challenge.allow(now, &self.isn) {
                conn.withdraw_challenge_ack();
                self.stats.challenge_acks_limited += 1;
            }
            let state = conn.state();
            if state == State::Closed {
                if let Some(t) = slot.tuple.take() {
                    self.by_tuple.remove(&t);
                }
            }
            entered_lingering =
                Self::follow_lingering(slot, id, &mut self.lingering, &mut self.lingering_now);
            if let (Some(key), false) = (slot.listener, slot.queued_for_accept) {
                if !matches!(state, State::SynReceived | State::Closed) {
                    slot.queued_for_accept = true;
                    if let Some(l) = self.listeners.get_mut(&key) {
                        l.accept_queue.push_back(id);
                        self.stats.queued_for_accept += 1;
                    }
                }
            }
        }
        if entered_lingering {
            self.limit_lingering();
        }
        if self.reap_unaccepted(index) {
            return None;
        }
        self.mark_ready(index);
        Some(id)
    }

    /// Keeps at most `max_lingering` connections lingering (TIME-WAIT, or FIN-WAIT-2 once
    /// the application reads nothing more: [`Connection::is_lingering`]): beyond it the
    /// oldest is ended ([`Connection::end_lingering`]; its owner reaps it as any closed
    /// connection). A peer that opens and closes connections in a loop (a failed MPA startup
    /// ends with our FIN: five packets leave a connection in TIME-WAIT for 60 s, or in
    /// FIN-WAIT-2 if it never sends its own FIN) would otherwise fill the table and every new
    /// connection would be refused. Amortized O(1): each connection enters the queue once.
    fn limit_lingering(&mut self) {
        while self.lingering_now > self.max_lingering {
            let Some(id) = self.lingering.pop_front() else {
                return;
            };
            // An entry of a connection that no longer lingers (closed, removed, reused) is
            // dropped as met.
            let Some(slot) = self
                .slots
                .get_mut(id.index as usize)
                .filter(|s| s.generation == id.generation && s.lingering)
            else {
                continue;
            };
            slot.lingering = false;
            self.lingering_now -= 1;
            if let Some(conn) = slot.conn.as_mut() {
                if conn.end_lingering() {
                    if let Some(t) = slot.tuple.take() {
                        self.by_tuple.remove(&t);
                    }
                    self.stats.lingering_ended += 1;
                    self.mark_ready(id.index);
                }
            }
        }
        // Entries of connections that stopped lingering by themselves pile up behind a
        // long-lived one at the front: dropped together once they outnumber the slots
        // (amortized O(1): the queue is then at most the live count).
        if self.lingering.len() > self.max_connections {
            let slots = &self.slots;
            self.lingering.retain(|id| {
                slots
                    .get(id.index as usize)
                    .is_some_and(|s| s.generation == id.generation && s.lingering)
            });
        }
    }

    /// Brings `slot`'s `lingering` mark (and the count) in line with its connection: set when
    /// it came to linger (queued as `id`; returns true), cleared when it stopped (closed).
    fn follow_lingering(
        slot: &mut Slot,
        id: ConnId,
        queue: &mut VecDeque<ConnId>,
        now: &mut usize,
    ) -> bool {
        let lingers = slot.conn.as_ref().is_some_and(Connection::is_lingering);
        match (slot.lingering, lingers) {
            (false, true) => {
                slot.lingering = true;
                *now += 1;
                queue.push_back(id);
                true
            }
            (true, false) => {
                slot.lingering = false;
                *now -= 1;
                false
            }
            _ => false,
        }
    }

    fn reschedule(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        let d = slot.conn.as_ref().and_then(|c| c.poll_timeout());
        if d != slot.deadline {
            slot.deadline = d;
            self.timers.set(index, d);
        }
    }

    /// Emit the next packet of any connection (or a pending RST).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.poll_transmit_inner(now, buf, &mut [], None)
    }

    /// [`ConnectionTable::poll_transmit`] with the sources of [`crate::TxMode::Source`]
    /// connections ([`Connection::poll_transmit_with`]).
    pub fn poll_transmit_with(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        sources: &mut dyn TxSources,
    ) -> Option<usize> {
        self.poll_transmit_inner(now, buf, &mut [], Some(sources))
    }

    /// [`ConnectionTable::poll_transmit_with`] into a packet buffer in pieces (the frames of
    /// a multi-buffer AF_XDP packet; [`Connection::poll_transmit_split`]): headers at the start
    /// of `head`, a data segment's payload from there on through `tail`; control segments and
    /// the table's replies in `head` alone.
    pub fn poll_transmit_split(
        &mut self,
        now: Instant,
        head: &mut [u8],
        tail: &mut [&mut [u8]],
        sources: &mut dyn TxSources,
    ) -> Option<usize> {
        self.poll_transmit_inner(now, head, tail, Some(sources))
    }

    fn poll_transmit_inner(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        tail: &mut [&mut [u8]],
        mut sources: Option<&mut dyn TxSources>,
    ) -> Option<usize> {
        // A reply stays queued until a buffer holds it (one that cannot be written at all
        // is dropped).
        if let Some(reply) = self.control.front() {
            match reply.emit(buf) {
                Ok(n) => {
                    if reply.flags.rst {
                        self.stats.resets_sent += 1;
                    }
                    self.control.pop_front();
                    return Some(n);
                }
                Err(WireError::BufferTooSmall) => {}
                Err(_) => {
                    self.control.pop_front();
                }
            }
        }
        while let Some(&index) = self.ready.front() {
            let slot = &mut self.slots[index as usize];
            if let Some(conn) = slot.conn.as_mut() {
                let id = ConnId {
                    index,
                    generation: slot.generation,
                };
                let sent = match sources.as_deref_mut() {
                    Some(sources) => {
                        conn.poll_transmit_split(now, buf, tail, &mut SourceOf { id, sources })
                    }
                    None => conn.poll_transmit(now, buf),
                };
                if let Some(n) = sent {
                    if !conn.wants_transmit() {
                        // That was its last segment for now: it leaves the queue here, not
                        // on the next offer (which would go through every kind of segment it
                        // might send to find none: a latency-bound sender's every message).
                        self.leave_ready_front(index);
                    }
                    return Some(n);
                }
                if conn.rst_due() {
                    // The buffer was too small for its RST (nothing else stops one): it stays
                    // first in the queue for the next call.
                    return None;
                }
            }
            self.leave_ready_front(index);
        }
        None
    }

    /// The connection in slot `index`, at the head of the ready queue, leaves it; its
    /// deadline is brought up to date with what it sent.
    fn leave_ready_front(&mut self, index: u32) {
        self.slots[index as usize].ready = false;
        self.ready.pop_front();
        self.reschedule(index);
        // A listener's connection it reset as it stopped ([`ConnectionTable::unlisten`]):
        // its RST is out.
        self.reap_unaccepted(index);
    }

    /// Connections with a pending deadline: the timer queue's entries, at most one per
    /// connection however often its deadlines move.
    pub fn timers_pending(&self) -> usize {
        self.timers.len()
    }

    /// The earliest deadline of any connection.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|(d, _)| d)
    }

    /// Run every expired timer.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((d, index)) = self.timers.peek() {
            if d > now {
                break;
            }
            self.timers.pop();
            let slot = &mut self.slots[index as usize];
            debug_assert_eq!(slot.deadline, Some(d), "the queue follows the slots");
            slot.deadline = None;
            let id = ConnId {
                index,
                generation: slot.generation,
            };
            if let Some(conn) = slot.conn.as_mut() {
                conn.handle_timeout(now);
                if conn.state() == State::Closed {
                    if let Some(t) = slot.tuple.take() {
                        self.by_tuple.remove(&t);
                    }
                }
            }
            if Self::follow_lingering(slot, id, &mut self.lingering, &mut self.lingering_now) {
                self.limit_lingering();
            }
            if !self.reap_unaccepted(index) {
                self.mark_ready(index);
            }
        }
    }

    /// A passive connection that died before it reached the accept queue
    /// (RST or retransmission timeout in SYN-RECEIVED) was never handed to
    /// anyone, so nobody would `remove` it: free its slot and its backlog
    /// place here (RFC 9293 3.10.7.4: it goes back to LISTEN). Returns true
    /// if the slot was freed.
    fn reap_unaccepted(&mut self, index: u32) -> bool {
        let slot = &self.slots[index as usize];
        // (An accepted connection, the common case, is told by its first test.)
        if slot.listener.is_none() || slot.queued_for_accept {
            return false;
        }
        if !slot
            .conn
            .as_ref()
            .is_some_and(|c| c.state() == State::Closed)
        {
            return false;
        }
        let id = ConnId {
            index,
            generation: slot.generation,
        };
        self.remove(id).is_some()
    }
}
