//! The engine's connections: a [`Slot`] per connection (its `IwarpConn`, the queue pair's
//! application side, who waits for its setup) and the [`SlotMap`] that finds them by [`ConnId`].

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crossbeam_channel::Receiver;
use rdmap::{QpState, TerminateCause};
use tcp_engine::State as TcpState;

use crate::engine::IwarpConn;
use crate::log_rate::peer_line;
use crate::verbs::cq::{Completion, CqSink};
use crate::verbs::qp::{Cmd, QpParts, QueueAccount, Shared, StartingPosts};
use crate::xdp_tcp::{ConnId, Connection as TcpConnection, Event as TcpEvent};
use crate::{DatapathError, QpError};

use super::commands::Handover;

/// Who waits for a connection's setup to end, with the completion queue the connection gets
/// when the caller has its queue pair ([`Slot::cq`]).
pub(super) enum Waiter {
    None,
    Connect(Handover<(QpParts, Vec<u8>)>, CqSink),
    Accept(Handover<QpParts>, CqSink),
}

impl Waiter {
    /// The completion queues of the connection waited for.
    pub(super) fn cq(&self) -> Option<&CqSink> {
        match self {
            Waiter::None => None,
            Waiter::Connect(_, cq) | Waiter::Accept(_, cq) => Some(cq),
        }
    }
}

pub(super) struct Slot {
    pub(super) conn: IwarpConn,
    /// Index of its PD's table in the engine's list (`None` until the PD is known).
    pub(super) table: Option<usize>,
    pub(super) num: u32,
    /// A queue pair created before its connection: the receives its posters take while it
    /// starts, handed to it as the application is given it ([`StartingPosts::run`]).
    pub(super) posters: Option<Box<dyn StartingPosts>>,
    pub(super) local_port: u16,
    pub(super) peer: SocketAddr,
    pub(super) cmds: Option<Receiver<Cmd>>,
    /// The application's completion queue, once it has the queue pair (set at the hand-over).
    pub(super) cq: Option<CqSink>,
    pub(super) shared: Arc<Shared>,
    pub(super) waiter: Waiter,
    pub(super) closing: bool,
    /// The engine's stop closed the connection (the application had not): its end records
    /// [`QpError::EngineStopped`], unless something else failed it first.
    pub(super) closed_by_stop: bool,
    /// Set by the queue pair's waker while the engine has not taken the connection's name
    /// (see `wake::SlotWaker`); cleared by the engine before it reads the requests.
    pub(super) named: Option<Arc<AtomicBool>>,
    /// The work requests taken from `cmds`, for the queue pair's post-time queue limits.
    pub(super) account: QueueAccount,
    /// A Close taken before received data was placed, for the service to carry out.
    pub(super) close_taken: bool,
    /// A completion found the completion queue full and was lost: the service resets the
    /// connection ([`Slot::reset_if_overrun`]).
    cq_overrun: Cell<bool>,
    /// The overrun was dealt with (the error recorded, the connection reset).
    cq_overrun_done: bool,
    last_state: Option<QpState>,
    /// When a connection we are closing stops waiting for the peer to take what it has
    /// queued, and is reset ([`Slot::reset_if_close_stalled`]); set at the first service
    /// after the close began, cleared once it has done its part.
    close_deadline: Option<tcp_engine::Instant>,
    /// The close's deadline has done its part (passed, or our data and FIN were taken).
    close_deadline_spent: bool,
    /// The longest a connection we close waits for the peer to take what it has queued
    /// before it is reset ([`Slot::reset_if_close_stalled`]): `QueuePair::disconnect`'s
    /// graceful wait, [`crate::ConnectParams::close_timeout`] (the connect's; for a
    /// connection a listener accepted, the accept's, `ConnectRequest::close_timeout`, else
    /// the listener's, as for one it turned away).
    pub(super) close_drain: std::time::Duration,
    /// A passive connection counted in the shard's `State::unclaimed` until its Request is
    /// queued for the application, or its TCP connection has as good as ended (FIN-WAIT-2,
    /// TIME-WAIT, closed: the table's lingering limit holds it then).
    pub(super) unclaimed: bool,
}

impl Slot {
    pub(super) fn new(
        conn: IwarpConn,
        table: Option<usize>,
        tuple: tcp_engine::FourTuple,
        num: u32,
        close_drain: std::time::Duration,
    ) -> Slot {
        let state = conn.qp().state();
        Slot {
            conn,
            table,
            num,
            posters: None,
            local_port: tuple.local_port,
            peer: SocketAddr::from((tuple.remote_addr, tuple.remote_port)),
            cmds: None,
            cq: None,
            shared: Shared::new(state),
            waiter: Waiter::None,
            closing: false,
            closed_by_stop: false,
            named: None,
            account: QueueAccount::default(),
            close_taken: false,
            cq_overrun: Cell::new(false),
            cq_overrun_done: false,
            last_state: None,
            close_deadline: None,
            close_deadline_spent: false,
            close_drain,
            unclaimed: false,
        }
    }

    /// A connection we are closing (the application's Close, a handover nobody took, the
    /// engine's stop), or whose queue pair is ending by itself (Closing, Terminate or Error:
    /// a bad FPDU, a Terminate, the peer's FIN), gets its close timeout (`close_drain`) for
    /// the peer to take
    /// what it has queued (a Terminate among it) and our FIN, as a disconnect waits before
    /// its reset; then it is reset. A peer that reads a trickle keeps acknowledging (TCP's
    /// user timeout, which needs a stall, never fires), or one that answers window probes for
    /// ever: either would hold the connection, its buffers and its table slot, its queue pair
    /// unfinished and its end unreported, for as long as it liked behind a `start_disconnect`
    /// (nobody waiting in `disconnect` to reset it), a queue pair whose last handle went on a
    /// transport thread, or one in Error its application left alone (as the socket
    /// transport bounds it, `error_drain`). The time counts from the first service after the
    /// ending began: a close the application starts later does not restart it. True if it
    /// reset.
    pub(super) fn reset_if_close_stalled(
        &mut self,
        tcp: &mut TcpConnection,
        now: tcp_engine::Instant,
    ) -> bool {
        let ending = matches!(
            self.conn.qp().state(),
            QpState::Closing | QpState::Terminate | QpState::Error
        );
        if !(self.closing || ending) || self.close_deadline_spent {
            return false;
        }
        if matches!(
            tcp.state(),
            TcpState::FinWait2 | TcpState::TimeWait | TcpState::Closed
        ) {
            // Our data and FIN are acknowledged (FIN-WAIT-2 has its own bound), or the
            // connection is gone: nothing left to wait for, and no deadline to wake for.
            self.close_deadline = None;
            self.close_deadline_spent = true;
            return false;
        }
        let at = *self.close_deadline.get_or_insert(now + self.close_drain);
        if now < at {
            return false;
        }
        // Done, whatever the reset finds: a deadline left in the past would keep the engine
        // from sleeping.
        self.close_deadline = None;
        self.close_deadline_spent = true;
        if !self.reset(tcp) {
            return false;
        }
        peer_line!(
            info,
            peer = %self.peer,
            "closing: the peer did not take what was queued in time; reset"
        );
        true
    }

    /// When [`Slot::reset_if_close_stalled`] next has something to do.
    pub(super) fn close_deadline(&self) -> Option<tcp_engine::Instant> {
        self.close_deadline
    }

    /// Records what ended the connection (see `Shared::set_error`).
    pub(super) fn set_error(&self, error: QpError) {
        let terminate = self.conn.qp().remote_terminate();
        match &terminate {
            Some(t) => peer_line!(
                info,
                peer = %self.peer,
                error = %error,
                terminate = ?t,
                "queue pair in error: the peer sent a Terminate"
            ),
            None => tracing::debug!(peer = %self.peer, error = %error, "queue pair in error"),
        }
        self.shared.set_error(error, terminate);
    }

    /// Fails the connect or accept waiting for this connection.
    pub(super) fn fail_waiter(&mut self, e: DatapathError) {
        match std::mem::replace(&mut self.waiter, Waiter::None) {
            Waiter::None => {}
            Waiter::Connect(tx, _) => {
                tx.deliver(Err(e));
            }
            Waiter::Accept(tx, _) => {
                tx.deliver(Err(e));
            }
        }
    }

    /// Whether a completion was lost to a full completion queue and the service has yet to
    /// reset the connection for it.
    pub(super) fn overrun_pending(&self) -> bool {
        self.cq_overrun.get() && !self.cq_overrun_done
    }

    /// After a completion was lost to a full completion queue (verbs' CQ overrun): the queue
    /// pair fails with [`QpError::CqOverrun`] and, unless its connection is closing already,
    /// the connection is reset (its outstanding requests flush). True if it did something.
    pub(super) fn reset_if_overrun(&mut self, tcp: &mut TcpConnection) -> bool {
        if !self.overrun_pending() {
            return false;
        }
        self.cq_overrun_done = true;
        if self.shared.lock().finished {
            // Its end is published already (with what ended it).
            return false;
        }
        self.set_error(QpError::CqOverrun);
        if self.reset(tcp) {
            tracing::warn!(peer = %self.peer, "completion queue overrun: connection reset");
        }
        true
    }

    /// Resets the connection (RFC 9293 3.10.5 ABORT): the queue pair flushes, and TCP, closed,
    /// reads nothing more from the queue pair's memory nor passes anything up to it. Not once
    /// a close has got as far as FIN-WAIT-2 (the queue pair is finished there: TIME-WAIT
    /// stays). True if it reset.
    pub(super) fn reset(&mut self, tcp: &mut TcpConnection) -> bool {
        if matches!(
            tcp.state(),
            TcpState::FinWait2 | TcpState::TimeWait | TcpState::Closed
        ) {
            return false;
        }
        self.closing = true;
        tcp.abort();
        self.conn.on_tcp_event(TcpEvent::Reset);
        true
    }

    /// Hands the queue pair's completions to the completion queue. A connection has one only
    /// once its caller has the queue pair (the hand-over): until then its completions stay in
    /// the queue pair, and if the call fails they go nowhere, so that a caller never sees
    /// completions of a queue pair it does not get (the receives it posted with the call,
    /// flushed).
    pub(super) fn deliver_completions(&mut self) -> bool {
        let Some(cq) = &self.cq else {
            return false;
        };
        let mut any = false;
        while let Some(wc) = self.conn.qp_mut().poll_completion() {
            if !any {
                // The places these completions free, before the application can see them.
                self.account.publish(self.conn.qp(), &self.shared);
            }
            any = true;
            let c = Completion {
                qp_num: self.num,
                wc,
            };
            if cq.deliver(c).is_err() {
                self.cq_overrun.set(true);
            }
        }
        any
    }

    /// Whether the connection has something only its service hands out: an event, a Close
    /// taken before received data, or a queue-pair state not yet published (a Terminate received, an error); or octets it gave
    /// back to TCP, which the peer is to hear of at once ([`IwarpConn::needs_poll`]).
    pub(super) fn needs_service(&self) -> bool {
        self.conn.has_event()
            || self.close_taken
            || self.last_state != Some(self.conn.qp().state())
            || self.conn.needs_poll()
            || self.overrun_pending()
    }

    pub(super) fn publish(&mut self, finished: bool) {
        let state = self.conn.qp().state();
        if self.last_state == Some(state) && !finished {
            return;
        }
        self.last_state = Some(state);
        let qp = self.conn.qp();
        drop(
            self.shared
                .publish(state, qp.remote_terminate(), qp.local_terminate()),
        );
        if finished {
            self.stop_posts();
            self.shared.mark_finished(state);
        }
    }

    /// Takes no more work requests from the application and completes those still queued as
    /// flushed ([`Shared::stop_posts`]), after the queue pair's own completions.
    pub(super) fn stop_posts(&mut self) {
        // The queue pair's own completions go first (its flushed receives among them).
        self.deliver_completions();
        let Slot {
            conn,
            cq,
            num,
            shared,
            cmds,
            ..
        } = self;
        // The receiver is dropped only after the flush: should a push panic part way (at an
        // engine's shutdown, where that is caught), the rest is still there to flush again.
        // Send requests complete behind the queue pair's own (which may wait for the transmit
        // ring, `rdmap::QueuePair::set_sources_busy`); receives flush at once, as the queue
        // pair's did.
        shared.stop_posts_behind(cmds.as_ref(), conn.qp_mut(), cq.as_ref(), *num);
        *cmds = None;
        self.deliver_completions();
    }

    /// The connection is over: the queue pair flushed, completions out, status final.
    pub(super) fn finish(&mut self, why: QpError) {
        // Nothing is sent from the queue pair's memory any more: flushed requests complete.
        self.conn.transport_gone();
        self.conn
            .qp_mut()
            .on_transport_error(TerminateCause::ConnectionLost);
        self.deliver_completions();
        if self.overrun_pending() {
            // A completion lost before the end: that is what failed.
            self.cq_overrun_done = true;
            self.set_error(QpError::CqOverrun);
        }
        if self.closed_by_stop {
            // (An error recorded during the stop's grace, an overrun or a Terminate, stays;
            // an engine that failed meanwhile says so.)
            let failed = matches!(why, QpError::EngineFailed);
            self.set_error(if failed { why } else { QpError::EngineStopped });
        } else if !self.closing {
            self.set_error(why);
        }
        self.fail_waiter(DatapathError::Disconnected);
        self.publish(true);
    }
}

/// The engine's connections by [`ConnId`]: a vector indexed by the table's slot index
/// ([`ConnId::index`], small and dense), the generation checked. The slot is looked up for
/// every segment received (`on_data`) and every segment built (`fill_tx`): an index and a
/// compare, no hashing and probing.
pub(super) struct SlotMap<V = Slot> {
    v: Vec<Option<(ConnId, V)>>,
    len: usize,
}

impl<V> Default for SlotMap<V> {
    fn default() -> Self {
        SlotMap {
            v: Vec::new(),
            len: 0,
        }
    }
}

impl<V> SlotMap<V> {
    pub(super) fn get_mut(&mut self, id: &ConnId) -> Option<&mut V> {
        match self.v.get_mut(id.index()) {
            Some(Some((k, s))) if k == id => Some(s),
            _ => None,
        }
    }

    /// Inserts `slot` for `id`, returning what `id`'s place held (an older generation's slot
    /// included: the table reused the index, so that connection is gone).
    pub(super) fn insert(&mut self, id: ConnId, slot: V) -> Option<V> {
        let i = id.index();
        if self.v.len() <= i {
            self.v.resize_with(i + 1, || None);
        }
        let old = self.v[i].replace((id, slot)).map(|(_, s)| s);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub(super) fn remove(&mut self, id: &ConnId) -> Option<V> {
        let e = self.v.get_mut(id.index())?;
        if e.as_ref().is_some_and(|(k, _)| k == id) {
            self.len -= 1;
            e.take().map(|(_, s)| s)
        } else {
            None
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many connections are held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.v.iter().filter_map(|e| e.as_ref().map(|(_, s)| s))
    }

    /// The connections' ids.
    pub(super) fn keys(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.v.iter().filter_map(|e| e.as_ref().map(|(id, _)| *id))
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.v.iter_mut().filter_map(|e| e.as_mut().map(|(_, s)| s))
    }

    /// Takes every connection out.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = (ConnId, V)> + '_ {
        self.len = 0;
        self.v.drain(..).flatten()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use tcp_engine::Instant;

    use super::*;

    #[test]
    fn slot_map_keys_by_index_and_generation() {
        // Ids as the table hands them out: a removed connection's index comes back under a
        // new generation, and the old id must find nothing.
        let mut table = tcp_engine::table::ConnectionTable::new([7; 16], 8);
        let tuple = |port| tcp_engine::FourTuple {
            local_addr: Ipv4Addr::new(10, 0, 0, 1),
            local_port: port,
            remote_addr: Ipv4Addr::new(10, 0, 0, 2),
            remote_port: 4791,
        };
        let cfg = tcp_engine::Config::default();
        let connect = |t: &mut tcp_engine::table::ConnectionTable, port| {
            t.connect(cfg.clone(), tuple(port), Instant::ZERO)
        };
        let a = connect(&mut table, 1000).expect("a");
        let b = connect(&mut table, 1001).expect("b");
        let mut m: SlotMap<u32> = SlotMap::default();
        assert!(m.is_empty());
        assert_eq!(m.insert(b, 2), None);
        assert_eq!(m.insert(a, 1), None);
        assert_eq!(m.get_mut(&a).copied(), Some(1));
        assert_eq!(m.get_mut(&b).copied(), Some(2));
        assert!(table.remove(a).is_some());
        let c = connect(&mut table, 1002).expect("c");
        assert_eq!(c.index(), a.index(), "the table reuses the slot");
        assert_ne!(c, a);
        assert_eq!(m.get_mut(&c), None, "a new generation is not the old one");
        assert_eq!(m.remove(&c), None);
        assert_eq!(m.remove(&a), Some(1));
        assert_eq!(m.get_mut(&a), None);
        assert_eq!(m.insert(c, 3), None);
        for v in m.values_mut() {
            *v += 10;
        }
        let mut all: Vec<u32> = m.values().copied().collect();
        all.sort_unstable();
        assert_eq!(all, [12, 13]);
        let drained: Vec<(ConnId, u32)> = m.drain().collect();
        assert_eq!(drained.len(), 2);
        assert!(m.is_empty());
        assert_eq!(m.get_mut(&b), None);
    }
}
