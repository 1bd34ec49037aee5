//! The glue to TCP: [`App`], the driver's view of the engine for one turn, whose [`TcpApp`]
//! callbacks run the connections (segments passed up to placement, queue-pair commands, events
//! and completions, FPDUs filled into frames), and the connection settings derived from the
//! engine's ([`State::conn_config`], [`tx_mode`]).

use std::sync::Arc;

use crossbeam_channel::{TryRecvError, TrySendError};
use rdmap::{MemoryTable, PdId, QpConfig, QpState, RecvWr};
use tcp_engine::{Instant, PassedUp, State as TcpState, TakeBack};

use crate::engine::{ConnConfig, ConnEvent, IwarpConn};
use crate::log_rate::peer_line;
use crate::memory::{RegionMemory, SharedTable};
use crate::probe::{self, Mark};
use crate::verbs::cm::{with_fresh_vtag, ConnectParams, Framing};
use crate::verbs::qp::{Agreed, Cmd, QpParts, Shared, TakenSend};
use crate::xdp_tcp::{ConnId, Connection as TcpConnection, Event as TcpEvent, TcpApp};
use crate::xsk::PayloadDigest;
use crate::{DatapathError, QpError};
use iwarp_conn::SegmentDigest;

use super::commands::RequestMsg;
use super::config::{add_counters, XdpEngineConfig};
use super::slots::{Slot, Waiter};
use super::wake::{ListenPort, SlotWaker, State, TableView};

/// Queue-pair commands taken per connection per turn (so one busy poster cannot starve the
/// others or the receive side).
const CMD_BUDGET: usize = 256;

impl State {
    pub(super) fn now(&self) -> Instant {
        let nanos = self.epoch.elapsed().as_nanos();
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    pub(super) fn conn_config(&self, params: &ConnectParams, pd: PdId) -> ConnConfig {
        ConnConfig {
            mpa: params.mpa.clone(),
            qp: QpConfig {
                pd,
                sq_depth: params.sq_depth,
                rq_depth: params.rq_depth,
                extensions: params.rdmap_extensions,
                ..QpConfig::default()
            },
            reassembly_capacity: self.cfg.reassembly_capacity,
            max_placed_fpdus: self.cfg.max_placed_fpdus,
            tx_ahead: self.cfg.tx_ahead,
            max_tx_fpdus: self.cfg.max_tx_fpdus,
            ift: match &params.framing {
                Framing::Mpa => None,
                Framing::Ift(cfg) => Some(with_fresh_vtag(cfg)),
            },
            held_timeout: Some(held_timeout(params.user_timeout)),
            reassembly_budget: Some(self.budget.clone()),
        }
    }

    /// A connection (slot) now uses PD table `table`.
    pub(super) fn use_table(&mut self, table: usize) {
        if let Some(users) = self.table_users.get_mut(table) {
            *users += 1;
        }
    }

    /// A connection (slot) that used PD table `table` is gone.
    fn release_table(&mut self, table: usize) {
        if let Some(users) = self.table_users.get_mut(table) {
            *users = users.saturating_sub(1);
            self.tables_unused |= *users == 0;
        }
    }
}

/// How long the peer's octets may wait beyond a gap it does not fill: as long as our own data
/// may wait on the peer (the user timeout), or, with none, the default: every resource a peer
/// makes us hold has a deadline.
fn held_timeout(user_timeout: Option<std::time::Duration>) -> std::time::Duration {
    user_timeout.unwrap_or(iwarp_conn::DEFAULT_HELD_TIMEOUT)
}

/// The TCP transmit mode of the engine's connections.
pub(super) fn tx_mode(cfg: &XdpEngineConfig) -> tcp_engine::TxMode {
    if cfg.tx_copy {
        tcp_engine::TxMode::Records
    } else {
        tcp_engine::TxMode::Source
    }
}

/// The driver's view of the engine for one turn: the state plus the PD tables as of the turn's
/// start (snapshots: no lock, see `RegionTable`), read again when a work request arrives.
pub(super) struct App<'a> {
    pub(super) st: &'a mut State,
    pub(super) mem: &'a mut [TableView],
    /// The tables themselves, for reading a newer version.
    pub(super) tables: &'a [SharedTable],
}

fn table_of<'t>(
    table: Option<usize>,
    mem: &'t [TableView],
    scratch: &'t MemoryTable<RegionMemory>,
) -> &'t MemoryTable<RegionMemory> {
    match table.and_then(|i| mem.get(i)).and_then(Option::as_ref) {
        Some(v) => &v.table,
        None => scratch,
    }
}

/// Reads the PD table `table` again if it changed since the turn read it: a work request may
/// name a region registered after the turn began (but before the request was posted, so
/// before it is taken). The rest of the turn, transmission included, sees that version or a
/// newer one (versions only move forward). One atomic load per work request, none per packet
/// (but per segment while a queue pair's posters start: [`take_starting_recvs`]).
fn refresh_table(mem: &mut [TableView], tables: &[SharedTable], table: Option<usize>) {
    if let Some(i) = table {
        if let (Some(view), Some(table)) = (mem.get_mut(i), tables.get(i)) {
            if view.as_ref().is_none_or(|v| table.changed_since(v)) {
                *view = Some(table.versioned());
            }
        }
    }
}

/// Posts a receive taken from the application to the connection's queue pair: one it refuses
/// completes in error in its place.
fn post_taken_recv(
    conn: &mut IwarpConn,
    shared: &Shared,
    wr: RecvWr,
    mem: &MemoryTable<RegionMemory>,
) {
    let wr_id = wr.wr_id;
    if let Err(e) = conn.qp_mut().post_recv(wr, mem) {
        shared.refuse_taken_recv(conn.qp_mut(), wr_id, &e);
    }
}

/// Takes the receives the slot's queue pair's posters took while it started
/// ([`crate::verbs::qp::StartingPosts::take`]) into its queue pair.
fn take_starting_recvs(
    slot: &mut Slot,
    mem: &mut [TableView],
    tables: &[SharedTable],
    scratch: &MemoryTable<RegionMemory>,
) {
    let Some(posters) = slot.posters.take() else {
        return;
    };
    posters.take(&mut |wr| post_starting_recv(slot, wr, mem, tables, scratch));
    slot.posters = Some(posters);
}

/// Posts a receive the slot's queue pair's posters took while it started, reading the PD
/// table again first as for a queued work request (the receive was checked against the
/// table as it was when posted, which may be newer than this turn's).
fn post_starting_recv(
    slot: &mut Slot,
    wr: RecvWr,
    mem: &mut [TableView],
    tables: &[SharedTable],
    scratch: &MemoryTable<RegionMemory>,
) {
    refresh_table(mem, tables, slot.table);
    let table = table_of(slot.table, mem, scratch);
    post_taken_recv(&mut slot.conn, &slot.shared, wr, table);
}

impl App<'_> {
    /// Takes the connection's work requests from the application into its queue pair: in the
    /// service (`before_data` false) at most `CMD_BUDGET` a turn, a Close included; before
    /// received data is placed (`before_data`), all that are queued (the post-time queue
    /// limits bound them), up to a Close, which is left to the service (`Slot::close_taken`)
    /// so that the data and the acknowledgements this turn brings count first.
    fn take_commands(&mut self, id: ConnId, before_data: bool) {
        let State {
            slots,
            scratch,
            progress,
            wake,
            attention_local,
            ..
        } = &mut *self.st;
        let Some(slot) = slots.get_mut(&id) else {
            return;
        };
        if let Some(rx) = &slot.cmds {
            let mut close = slot.close_taken && !before_data;
            let budget = if before_data { usize::MAX } else { CMD_BUDGET };
            for _ in 0..budget {
                if close || slot.close_taken {
                    break;
                }
                let cmd = match rx.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => Cmd::Close,
                };
                slot.account.took(&cmd);
                *progress = true;
                refresh_table(self.mem, self.tables, slot.table);
                let mem = table_of(slot.table, self.mem, scratch);
                match cmd {
                    Cmd::Send(wr) => {
                        let taken = TakenSend::of(&wr);
                        if let Err(e) = slot.conn.qp_mut().post_send(wr, mem) {
                            let qp = slot.conn.qp_mut();
                            slot.shared.refuse_taken_send(qp, taken, &e);
                        }
                    }
                    Cmd::SendInline(wr) => {
                        let taken = TakenSend::of_inline(&wr);
                        if let Err(e) = slot.conn.qp_mut().post_send_inline(wr) {
                            let qp = slot.conn.qp_mut();
                            slot.shared.refuse_taken_send(qp, taken, &e);
                        }
                    }
                    Cmd::Recv(wr) => post_taken_recv(&mut slot.conn, &slot.shared, wr, mem),
                    Cmd::Panic => panic!("injected by a test (QueuePair::inject_transport_panic)"),
                    Cmd::Close if before_data => slot.close_taken = true,
                    Cmd::Close => close = true,
                }
            }
            if !close && !before_data && !rx.is_empty() {
                // More than a turn takes (or one posted meanwhile): the rest wait as a request
                // nobody took does (the next posting turn runs in full, a parked engine thread
                // wakes).
                wake.pending
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = wake.wake_engine();
            }
            if close {
                slot.close_taken = false;
                if !slot.closing {
                    slot.closing = true;
                    slot.conn.close();
                }
                // Nothing follows a Close (other threads may still post while the handle
                // disconnects): any request still queued is flushed all the same, after the
                // queue pair's own, and later posts never reach the transport (refused, or
                // flushed by the handle once the queue pair has finished in Error).
                slot.stop_posts();
            }
        }
        if slot.overrun_pending() {
            // A completion was lost: the service resets the connection.
            attention_local.push(id);
        }
    }

    /// Keeps the FPDU CRC of the segment being received for its `on_data` (where its data
    /// lies, to match the octets TCP passes up); returns the sum for TCP's checksum.
    fn keep_digest(&mut self, payload: &[u8], digest: SegmentDigest) -> u16 {
        self.st.rx_crc = digest.hold(payload);
        probe::mark(Mark::PayloadSummed);
        digest.sum
    }
}

impl TcpApp for App<'_> {
    fn has_new_work(&mut self) -> bool {
        // A turn reads the queues after this load, and a poster counts after queueing: a
        // request counted after this load is seen by the next turn's.
        let posted = self
            .st
            .wake
            .posted
            .load(std::sync::atomic::Ordering::SeqCst);
        let new = posted != self.st.seen_posts || !self.st.attention_local.is_empty();
        self.st.seen_posts = posted;
        new
    }

    fn attention(&mut self, mark: &mut dyn FnMut(ConnId)) {
        let st = &mut *self.st;
        // As the driver decides (`xdp_tcp::SERVICE_ALL_MAX`): when the count first passes it,
        // requests posted just before are seen at the next full round (at most 20 ms on).
        // Stored only when it changes: every post reads it, and a store each turn would take
        // the cache line from the posting thread's core each time.
        let many = st.slots.len() > crate::xdp_tcp::SERVICE_ALL_MAX;
        if st.many.load(std::sync::atomic::Ordering::Relaxed) != many {
            st.many.store(many, std::sync::atomic::Ordering::Relaxed);
        }
        while let Ok(id) = st.attention_rx.try_recv() {
            if let Some(named) = st.slots.get_mut(&id).and_then(|s| s.named.as_ref()) {
                // A swap, not a store: it reads the value a poster's swap wrote (which saw the
                // name still set and so sent no second one) and so acquires that poster's
                // queued request for the service that follows.
                named.swap(false, std::sync::atomic::Ordering::SeqCst);
            }
            mark(id);
        }
        for id in st.attention_local.drain(..) {
            mark(id);
        }
    }

    fn deliver_received(&mut self, id: ConnId) -> Option<bool> {
        let slot = self.st.slots.get_mut(&id)?;
        // Events and a changed queue-pair state (a Terminate, an error) are the service's:
        // its completions go out with the status that explains them.
        if slot.needs_service() {
            return None;
        }
        let delivered = slot.deliver_completions();
        if slot.overrun_pending() {
            // A completion was lost: the service resets the connection.
            self.st.attention_local.push(id);
        }
        self.st.progress |= delivered;
        Some(delivered)
    }

    fn payload_sum(&mut self, payload: &[u8]) -> u16 {
        self.keep_digest(payload, SegmentDigest::of(payload))
    }

    fn payload_digested(&mut self, payload: &[u8], digest: PayloadDigest) -> u16 {
        self.keep_digest(
            payload,
            SegmentDigest::read(payload, digest.sum, digest.crc),
        )
    }

    fn on_data(&mut self, id: ConnId, data: PassedUp<'_>) -> Option<TakeBack> {
        // A receive posted before this segment arrived is in place for it, even if the peer
        // heard of it another way than through this connection (a turn receives before it
        // serves): what is queued is taken first (two loads when nothing is).
        if self
            .st
            .slots
            .get_mut(&id)
            .is_some_and(|s| s.cmds.as_ref().is_some_and(|c| !c.is_empty()))
        {
            self.take_commands(id, true);
        }
        // The CRC found as this segment was summed, if TCP passes up all of its data.
        let crc = self.st.rx_crc.take().and_then(|h| h.for_data(data.data));
        let State {
            slots,
            early,
            scratch,
            ..
        } = &mut *self.st;
        let take_back = match slots.get_mut(&id) {
            Some(slot) => {
                if slot.posters.is_some() {
                    // A queue pair created before its connection, still starting: what its
                    // posters took is in place for this data (the peer's first Sends may
                    // follow its MPA Reply in this very segment).
                    take_starting_recvs(slot, self.mem, self.tables, scratch);
                }
                let mem = table_of(slot.table, self.mem, scratch);
                probe::mark(Mark::DataPassedUp);
                let take_back = slot.conn.on_data_with_crc(data, crc, mem);
                probe::mark(Mark::DataPlaced);
                take_back
            }
            None => {
                early.entry(id).or_default().push((
                    data.seq,
                    data.stream_offset,
                    data.data.to_vec(),
                ));
                None
            }
        };
        self.st.progress = true;
        take_back
    }

    fn on_accept(&mut self, id: ConnId, tcp: &mut TcpConnection) {
        let tuple = tcp.four_tuple();
        let early = self.st.early.remove(&id);
        // A connection this side cannot take is reset, not closed: closed, it would go on
        // passing up whatever the peer sends, with no slot to take it (`early` would grow).
        let Some(ListenPort { params, record, .. }) = self.st.listeners.get(&tuple.local_port)
        else {
            tcp.abort();
            return;
        };
        // At most a quarter of the shard's table unclaimed (`State::unclaimed`), as the
        // socket transport's listener keeps at most a quarter of its descriptors waiting.
        if self.st.unclaimed >= (self.st.cfg.driver.max_connections / 4).max(1) {
            record.over_starting();
            tcp.abort();
            return;
        }
        // The PD is the one given to `accept`; until then the queue pair is a placeholder
        // (no PD has number 0, no queues: a connection that has passed no MPA check yet
        // costs little) and is replaced before Full Operation.
        let mut cfg = self.st.conn_config(params, PdId(0));
        cfg.qp = QpConfig {
            pd: PdId(0),
            sq_depth: 0,
            rq_depth: 0,
            ird: 0,
            ord: 0,
            extensions: false,
        };
        let now = self.st.now();
        let conn = match IwarpConn::responder(cfg, self.st.epoch, now) {
            Ok(c) => c,
            Err(_) => {
                tcp.abort();
                return;
            }
        };
        // Numbered by the accept, which gives it a queue pair.
        let mut slot = Slot::new(conn, None, tuple, 0, params.close_timeout);
        slot.unclaimed = true;
        self.st.unclaimed += 1;
        tracing::debug!(peer = %slot.peer, local_port = tuple.local_port, "TCP connection accepted");
        // Given back while replayed: TCP takes it back here, as it would have in the pass-up,
        // and what was passed up after it comes again too.
        let mut taken_back: Option<u64> = None;
        for (seq, stream_offset, bytes) in early.into_iter().flatten() {
            let keep = taken_back.map_or(bytes.len(), |t| {
                t.saturating_sub(stream_offset).min(bytes.len() as u64) as usize
            });
            if keep == 0 {
                continue;
            }
            let data = PassedUp {
                seq,
                stream_offset,
                data: &bytes[..keep],
                // Nothing was sent on a connection not yet accepted.
                acked: 0,
            };
            if let Some(t) = slot.conn.on_data(data, &self.st.scratch) {
                taken_back = Some(taken_back.map_or(t.from, |x| x.min(t.from)));
            }
        }
        if let Some(offset) = taken_back {
            if !tcp.renege_from(offset) {
                slot.conn.on_tcp_event(TcpEvent::TakeBackRefused { offset });
            }
        }
        self.st.slots.insert(id, slot);
        self.st.progress = true;
    }

    fn on_event(&mut self, id: ConnId, tcp: &mut TcpConnection, event: TcpEvent) {
        if let Some(slot) = self.st.slots.get_mut(&id) {
            slot.conn.on_tcp_acked(tcp.bytes_acked());
            slot.conn.on_tcp_event(event);
            self.st.progress = true;
        }
    }

    fn on_poll(&mut self, id: ConnId, tcp: &mut TcpConnection, now: Instant) {
        self.take_commands(id, false);
        let State {
            slots,
            listeners,
            unclaimed,
            scratch,
            established,
            progress,
            wake,
            shard,
            attention_tx,
            attention_local,
            many,
            ..
        } = &mut *self.st;
        let Some(slot) = slots.get_mut(&id) else {
            return;
        };
        // The application's abort, or its disconnect giving up on the graceful close
        // (`Shared::request_abort`): reset the connection (`Slot::reset`). Then a completion
        // lost to a full completion queue, if any.
        if slot.shared.abort_requested() && slot.reset(tcp) {
            tracing::info!(peer = %slot.peer, "the application reset the connection");
        }
        slot.reset_if_overrun(tcp);
        slot.reset_if_close_stalled(tcp, now);
        let mem = table_of(slot.table, self.mem, scratch);
        slot.conn.poll(tcp, mem, now);
        while let Some(ev) = slot.conn.poll_event() {
            *progress = true;
            match ev {
                ConnEvent::Request(_) | ConnEvent::IftRequest(_) => {
                    let info = match ev {
                        ConnEvent::Request(info) => {
                            peer_line!(
                                info,
                                peer = %slot.peer,
                                rev = info.rev,
                                crc = info.crc,
                                markers = info.markers,
                                private_data = info.private_data.len(),
                                "MPA Request received"
                            );
                            Some(info)
                        }
                        ConnEvent::IftRequest(n) => {
                            peer_line!(
                                info,
                                peer = %slot.peer,
                                header_crc = n.rx.header_crc,
                                payload_crc = n.rx.payload_crc,
                                "IFT phase 0 adaption indication received"
                            );
                            None
                        }
                        _ => None,
                    };
                    let msg = RequestMsg {
                        id,
                        info,
                        peer: slot.peer,
                        shard: *shard,
                    };
                    // The listener's queue of Requests waiting for the application is
                    // bounded (`ConnectParams::backlog`): beyond it, or with nobody listening
                    // any more, the Request is rejected (Reply with R=1) and the connection
                    // closes; one left waiting ends at `MpaConfig::accept_timeout`.
                    let listener = listeners.get(&slot.local_port);
                    let delivered = match listener.map(|l| l.requests.try_send(msg)) {
                        Some(Ok(())) => true,
                        Some(Err(TrySendError::Full(_))) => {
                            listener.inspect(|l| l.record.over_backlog());
                            false
                        }
                        _ => false,
                    };
                    if delivered {
                        // Bounded from now on by the listener's backlog.
                        claimed(slot, unclaimed);
                    } else {
                        let _ = slot.conn.reject(&[]);
                    }
                }
                ConnEvent::Established { private_data } => {
                    *established += 1;
                    let agreed = if let Some(n) = slot.conn.negotiated().cloned() {
                        peer_line!(
                            info,
                            peer = %slot.peer,
                            rev = n.rev,
                            crc = n.crc,
                            markers_tx = n.markers_tx,
                            markers_rx = n.markers_rx,
                            "MPA Full Operation"
                        );
                        Agreed::Mpa(n)
                    } else if let Some(n) = slot.conn.ift_negotiated().copied() {
                        peer_line!(
                            info,
                            peer = %slot.peer,
                            header_crc_tx = n.tx.header_crc,
                            payload_crc_tx = n.tx.payload_crc,
                            header_crc_rx = n.rx.header_crc,
                            payload_crc_rx = n.rx.payload_crc,
                            "IFT Full Operation"
                        );
                        let ord = slot.conn.qp().ord();
                        let ird = slot.conn.qp().ird();
                        Agreed::Ift {
                            negotiated: n,
                            ird,
                            ord,
                        }
                    } else {
                        continue;
                    };
                    let Some(mulpdu) = slot.conn.mulpdu(tcp.emss()) else {
                        continue;
                    };
                    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
                    slot.cmds = Some(cmd_rx);
                    let named = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    slot.named = Some(named.clone());
                    let waker = Arc::new(SlotWaker::new(
                        wake.clone(),
                        id,
                        named,
                        attention_tx.clone(),
                        many.clone(),
                    ));
                    let qp_cfg = *slot.conn.qp().config();
                    // Receives its posters took while it started go to the queue pair now,
                    // before the application can have it (and post to it directly).
                    take_starting_recvs(slot, self.mem, self.tables, scratch);
                    // Receives posted with the connect or accept (or taken so) count against
                    // the receive queue from the start.
                    slot.account.publish(slot.conn.qp(), &slot.shared);
                    // So is the state (RTS): the application reads it as soon as it has the
                    // queue pair, before this turn's service would publish it. Any other
                    // state (the stream failed right behind the Reply) is left to the
                    // events that say why, which come first.
                    if slot.conn.qp().state() == QpState::Rts {
                        slot.publish(false);
                    }
                    let parts = QpParts {
                        num: slot.num,
                        cmds: cmd_tx,
                        waker,
                        shared: slot.shared.clone(),
                        agreed,
                        mulpdu,
                        local: {
                            let t = tcp.four_tuple();
                            std::net::SocketAddr::from((t.local_addr, t.local_port))
                        },
                        peer: slot.peer,
                        tos: tcp.config().tos,
                        thread: None,
                        sq_depth: qp_cfg.sq_depth,
                        rq_depth: qp_cfg.rq_depth,
                        srq: slot.conn.qp().has_srq(),
                        extensions: qp_cfg.extensions,
                        cq: slot.waiter.cq().cloned(),
                        close_timeout: slot.close_drain,
                    };
                    let path = slot.posters.is_some().then(|| parts.post_path());
                    let taken = match std::mem::replace(&mut slot.waiter, Waiter::None) {
                        Waiter::Connect(tx, cq) => {
                            tx.deliver(Ok((parts, private_data))).then_some(cq)
                        }
                        Waiter::Accept(tx, cq) => tx.deliver(Ok(parts)).then_some(cq),
                        Waiter::None => None,
                    };
                    // Its posters post to the running queue pair from now on (unless the start's
                    // end, on the caller's thread, came first), before its completions can reach
                    // the application. Not before the hand-over: a caller that gave up fails
                    // the queue pair, and its posters must then still be starting.
                    // Receives posted since the take above go to the queue pair too, each
                    // published under the posters' lock (the caller may be posting already).
                    if let (Some(posters), Some(path), Some(_)) =
                        (slot.posters.take(), path, &taken)
                    {
                        let (mem, tables) = (&mut *self.mem, self.tables);
                        posters.run(&path, &mut |wr| {
                            post_starting_recv(slot, wr, mem, tables, scratch);
                            slot.account.publish(slot.conn.qp(), &slot.shared);
                        });
                    }
                    // The application has the queue pair: its completions go to its queue.
                    slot.cq = taken;
                    if slot.cq.is_none() {
                        // The application gave up waiting: nobody will use this connection,
                        // nor see the receives it posted with the call complete.
                        slot.cmds = None;
                        slot.closing = true;
                        slot.conn.close();
                    }
                }
                ConnEvent::Rejected {
                    private_data,
                    peer_params,
                } => {
                    peer_line!(info, peer = %slot.peer, "MPA Request rejected by the peer");
                    slot.closing = true;
                    slot.fail_waiter(DatapathError::Rejected {
                        private_data,
                        peer_params,
                    });
                }
                ConnEvent::StartupFailed(e) => {
                    peer_line!(warn, peer = %slot.peer, error = %e, "MPA startup failed");
                    if matches!(slot.waiter, Waiter::None) {
                        // A passive connection the application has not accepted: its
                        // listener counts why it ended.
                        if let Some(l) = listeners.get(&slot.local_port) {
                            l.record.startup_failed(&e);
                        }
                    }
                    slot.set_error(QpError::Startup(e.clone()));
                    slot.fail_waiter(DatapathError::Mpa(e));
                }
                ConnEvent::IftStartupFailed(e) => {
                    peer_line!(warn, peer = %slot.peer, error = %e, "IFT adaption exchange failed");
                    if matches!(slot.waiter, Waiter::None) {
                        if let Some(l) = listeners.get(&slot.local_port) {
                            l.record.ift_startup_failed(&e);
                        }
                    }
                    slot.set_error(QpError::Ift(e.clone()));
                    slot.fail_waiter(DatapathError::Ift(e));
                }
                ConnEvent::IftFailed(e) => {
                    peer_line!(warn, peer = %slot.peer, error = %e, "IFT frame error: Terminate sent");
                    slot.set_error(QpError::Ift(e));
                }
                ConnEvent::ConnectionRefused => {
                    peer_line!(info, peer = %slot.peer, "connection refused (TCP reset)");
                    slot.set_error(QpError::Refused);
                    slot.fail_waiter(DatapathError::Io(std::io::Error::from(
                        std::io::ErrorKind::ConnectionRefused,
                    )));
                }
                ConnEvent::MpaFailed(e) => {
                    if slot.conn.qp().local_terminate().is_some() {
                        peer_line!(warn, peer = %slot.peer, error = %e, "MPA error: Terminate sent");
                    } else {
                        // A responder that may send nothing yet (RFC 5044 7.1.2 rule 4).
                        peer_line!(warn, peer = %slot.peer, error = %e, "MPA error: connection closed");
                    }
                    slot.set_error(QpError::Mpa(e));
                }
                ConnEvent::ClosedLocally(reason) => {
                    peer_line!(warn, peer = %slot.peer, reason, "connection closed");
                    slot.set_error(QpError::ClosedLocally(reason));
                }
                ConnEvent::TransmitSourceFailed(e) => {
                    peer_line!(warn, peer = %slot.peer, error = %e, "a frame's source memory is gone: connection reset");
                    slot.set_error(QpError::TransmitSourceFailed);
                }
                ConnEvent::TransportClosed(how) => {
                    peer_line!(info, peer = %slot.peer, how = ?how, "TCP connection ended");
                    if !slot.closing {
                        slot.set_error(transport_closed_error(how));
                    }
                    slot.fail_waiter(DatapathError::Disconnected);
                }
            }
        }
        *progress |= slot.deliver_completions();
        let ended = matches!(
            tcp.state(),
            TcpState::FinWait2 | TcpState::TimeWait | TcpState::Closed
        );
        if ended {
            claimed(slot, unclaimed);
        }
        let done = (slot.closing || slot.conn.qp().state() == QpState::Error) && ended;
        if slot.overrun_pending() {
            if done {
                // Ending now: the lost completion is what failed it (nothing to reset).
                slot.reset_if_overrun(tcp);
            } else {
                // A completion was lost just now: the next service resets the connection.
                attention_local.push(id);
            }
        }
        slot.publish(done);
    }

    fn fill_tx(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<(), tcp_engine::TxSourceError> {
        self.fill_tx_summed(id, stream_offset, out).map(|_| ())
    }

    fn fill_tx_summed(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u16>, tcp_engine::TxSourceError> {
        let State { slots, scratch, .. } = &mut *self.st;
        match slots.get_mut(&id) {
            Some(slot) => {
                let mem = table_of(slot.table, self.mem, scratch);
                slot.conn.fill(stream_offset, out, mem).map(Some)
            }
            None => Err(tcp_engine::TxSourceError {
                offset: stream_offset,
                len: out.len(),
            }),
        }
    }

    fn fill_tx_split(
        &mut self,
        id: ConnId,
        stream_offset: u64,
        len: usize,
        first: &mut [u8],
        rest: &mut [&mut [u8]],
    ) -> Result<u16, tcp_engine::TxSourceError> {
        let State {
            slots,
            scratch,
            tx_joined,
            ..
        } = &mut *self.st;
        match slots.get_mut(&id) {
            Some(slot) => {
                let mem = table_of(slot.table, self.mem, scratch);
                slot.conn
                    .fill_split(stream_offset, len, first, rest, mem, tx_joined)
            }
            None => Err(tcp_engine::TxSourceError {
                offset: stream_offset,
                len,
            }),
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.st
            .slots
            .values()
            .flat_map(|s| [s.conn.poll_timeout(), s.close_deadline()])
            .flatten()
            .min()
    }

    fn on_closed(&mut self, id: ConnId, _tcp: TcpConnection) {
        self.st.early.remove(&id);
        if let Some(mut slot) = self.st.slots.remove(&id) {
            tracing::debug!(peer = %slot.peer, "connection closed and released");
            if let Some(table) = slot.table {
                self.st.release_table(table);
            }
            claimed(&mut slot, &mut self.st.unclaimed);
            slot.finish(QpError::PeerClosed);
            add_counters(&mut self.st.ended, &slot.conn.counters());
            self.st.ended_conns += 1;
            self.st.progress = true;
        }
    }
}

/// A passive connection's Request is queued for the application, or its TCP connection has
/// as good as ended: the shard counts it as unclaimed no more (once).
fn claimed(slot: &mut Slot, unclaimed: &mut usize) {
    if std::mem::take(&mut slot.unclaimed) {
        *unclaimed = unclaimed.saturating_sub(1);
    }
}

/// What a TCP connection's end means to the queue pair on it.
fn transport_closed_error(how: tcp_engine::Event) -> QpError {
    use tcp_engine::Event as E;
    match how {
        // (The last three never end a connection.)
        E::PeerClosed
        | E::Closed
        | E::Connected
        | E::EmssChanged(_)
        | E::TakeBackRefused { .. } => QpError::PeerClosed,
        E::Reset => QpError::PeerReset,
        E::TimedOut => QpError::PeerUnreachable,
        E::SourceFailed => QpError::TransmitSourceFailed,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Octets held beyond a gap end the connection when our data would, and without a user
    /// timeout after the default: never held for ever.
    #[test]
    fn held_octets_always_have_a_deadline() {
        let t = Duration::from_secs(7);
        assert_eq!(super::held_timeout(Some(t)), t);
        assert_eq!(super::held_timeout(None), iwarp_conn::DEFAULT_HELD_TIMEOUT);
    }
}
