//! Queue pairs created before their connection (verbs' `rdma_create_qp` or `ibv_create_qp`
//! before `rdma_connect` or `rdma_accept`): [`IdleQp`] has its number and takes receives at
//! once; connecting or accepting turns it into a running [`QueuePair`] with the same number
//! and those receives in place before the peer can send anything.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};

use rdmap::{InlineSendWr, RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion};

use crate::memory::ProtectionDomain;
use crate::verbs::cm::{receive_queue_alone, ConnectParams, ConnectRequest, Connection};
use crate::verbs::cm_events::{push_outcome, CmEventChannel, ConnectAttempt};
use crate::verbs::cq::{Completion, CompletionQueue, CqSink};
use crate::verbs::qp::{
    next_qp_num, post_initial_recvs, PostPath, QpAttr, QpStart, SendRequest, StartingPosts,
};
use crate::{DatapathError, PostListError};

/// A queue pair that has no connection yet (RDMAP's Idle state, RFC 5040 6; verbs' queue
/// pair between `rdma_create_qp` and `rdma_connect` or `rdma_accept`).
///
/// It holds what the queue pair is made of: its protection domain, its completion queues,
/// the queue depths and shared receive queue of its [`ConnectParams`], and the receives
/// posted to it so far (`ibv_post_recv` before the connection; iWARP has no
/// receiver-not-ready retry, so a Send that arrives before its buffer ends the connection,
/// RFC 5041 7.1). [`crate::Device::connect_qp`] and
/// [`crate::ConnectRequest::accept_qp`] consume it and start the [`QueuePair`] with its
/// number and its receives posted first. If the connect or accept fails (refused at the
/// call, rejected, timed out, cancelled), the queue pair is in Error as a verbs queue pair is
/// after a failed connection: each receive posted to it completes with
/// [`rdmap::WcStatus::WrFlushError`] on its receive completion queue before the call returns
/// or its event is queued, so the application gets its buffers back; nothing else of the
/// queue pair remains.
///
/// [`QueuePair`]: crate::QueuePair
pub struct IdleQp {
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) params: ConnectParams,
    stages: Arc<Stages>,
}

/// Where the posts to one queue pair go as its life goes on, shared by its [`IdleQp`] and its
/// [`QpPoster`]s.
struct Stages {
    num: u32,
    pd: ProtectionDomain,
    /// Its receives come from a shared receive queue.
    srq: bool,
    /// The RFC 7306 extensions are on: their opcodes may be posted.
    extensions: bool,
    /// Its completion queues, for the posts it completes itself (flushed).
    cq: CqSink,
    /// Set once the queue pair runs: posts go straight to it, without the lock.
    running: OnceLock<PostPath>,
    stage: Mutex<Stage>,
}

enum Stage {
    /// No connect or accept has taken the queue pair yet: receives collect here, to be posted
    /// first when it starts.
    Idle(PostedRecvs),
    /// A connect or accept took it (and the receives posted so far) and has not finished:
    /// receives posted meanwhile collect here, for the transport to take behind those.
    Starting(Starting),
    /// It runs: see [`Stages::running`].
    Running(PostPath),
    /// Its connect or accept failed, or [`IdleQp::flush`] moved it to Error: posts complete
    /// at once, flushed, on its completion queues, as on a running queue pair in Error.
    Error,
    /// The [`IdleQp`] was dropped without a connection (`ibv_destroy_qp`).
    Destroyed,
}

/// The receives posted to a queue pair not running yet, and a receive queue of its depth that
/// has taken each as the connect or accept will post it (the checks and errors of
/// [`crate::Device::connect_with_recvs`]): those posted while it starts count against the
/// depth with those it starts with.
struct PostedRecvs {
    wrs: Vec<RecvWr>,
    check: rdmap::QueuePair,
}

/// A queue pair whose connect or accept is under way.
struct Starting {
    /// Receives posted since, not yet taken by the transport.
    recvs: PostedRecvs,
    /// The receives the transport holds, in the order posted: those it started with, then
    /// those it took while starting ([`StartingPosts::take`]). If the start fails, they
    /// complete flushed here (the transport gives a connection its completion queue only when
    /// the caller gets the queue pair). Those [`StartingPosts::run`] hands over are not
    /// recorded: the queue pair runs then, and the transport completes them.
    held: Vec<u64>,
}

impl std::fmt::Debug for IdleQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleQp")
            .field("num", &self.num())
            .field("pd", &self.pd.id())
            .field("recvs_posted", &self.recvs_posted())
            .finish()
    }
}

impl IdleQp {
    /// Creates a queue pair of `pd` whose completions go to `cq` (and its receive completions
    /// to `params.recv_cq` if set), with `params`'s queue depths, shared receive queue and
    /// RDMAP extensions (`ibv_qp_init_attr`); the rest of `params` is the connection's, used by
    /// [`crate::Device::connect_qp`]. Parameters out of bounds fail with
    /// [`DatapathError::InvalidArgument`] (see [`crate::DeviceAttr`]), and so does a shared
    /// receive queue of another protection domain.
    pub fn new(
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        params: &ConnectParams,
    ) -> Result<IdleQp, DatapathError> {
        params.check()?;
        if let Some(srq) = &params.srq {
            srq.check_pd(pd.id)?;
        }
        let check = receive_queue_alone(params, pd);
        let num = next_qp_num();
        Ok(IdleQp {
            pd: pd.clone(),
            cq: cq.clone(),
            params: params.clone(),
            stages: Arc::new(Stages {
                num,
                pd: pd.clone(),
                srq: params.srq.is_some(),
                extensions: params.rdmap_extensions,
                cq: CqSink::new(cq, params.recv_cq.as_ref()),
                running: OnceLock::new(),
                stage: Mutex::new(Stage::Idle(PostedRecvs {
                    wrs: Vec::new(),
                    check,
                })),
            }),
        })
    }

    /// The queue pair's number (`ibv_qp.qp_num`), which the running queue pair keeps (and
    /// its [`crate::Completion`]s carry).
    pub fn num(&self) -> u32 {
        self.stages.num
    }

    /// A handle that posts to this queue pair for the rest of its life (see [`QpPoster`]):
    /// here before the connection, to the running queue pair once a connect or accept has
    /// started it, even before the application has its [`crate::QueuePair`].
    pub fn poster(&self) -> QpPoster {
        QpPoster {
            stages: self.stages.clone(),
        }
    }

    /// The parameters it was created with, as connecting will use them.
    pub fn params(&self) -> &ConnectParams {
        &self.params
    }

    /// The queue pair's attributes as `ibv_query_qp` reports them before the connection
    /// (see [`QpAttr`]): state Idle, its depths and capabilities, the IRD and ORD a connect
    /// asks for (an accept's are the request's), MULPDU 0, its local address if its
    /// parameters name one (unspecified otherwise), the peer's unspecified.
    pub fn attr(&self) -> QpAttr {
        let p = &self.params;
        let unspecified = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
        QpAttr {
            state: rdmap::QpState::Idle,
            sq_depth: p.sq_depth,
            rq_depth: if p.srq.is_some() { 0 } else { p.rq_depth },
            max_sge: rdmap::MAX_SGE,
            max_inline_data: rdmap::MAX_INLINE_DATA,
            ird: p.mpa.ird,
            ord: p.mpa.ord,
            mulpdu: 0,
            srq: p.srq.is_some(),
            extensions: p.rdmap_extensions,
            local: p.local_addr.unwrap_or(unspecified),
            peer: unspecified,
            tos: p.tos,
        }
    }

    /// Sets the IRD and ORD to ask for when connecting (`rdma_connect`'s
    /// `responder_resources` and `initiator_depth`): [`ConnectParams::mpa`]'s `ird` and `ord`.
    /// An accept takes the request's instead ([`ConnectRequest::ird_ord`], `rdma_accept`'s).
    /// Values over [`crate::MAX_IRD_ORD`] fail the connect with
    /// [`DatapathError::InvalidArgument`].
    pub fn set_ird_ord(&mut self, ird: u16, ord: u16) {
        self.params.mpa.ird = ird;
        self.params.mpa.ord = ord;
    }

    /// Posts a receive, to be in place before the connection can deliver anything
    /// (`ibv_post_recv` on a queue pair not yet connected). More than the receive queue's
    /// depth ([`ConnectParams::rq_depth`]) fails with [`DatapathError::RecvQueueFull`]; a
    /// queue pair fed by a shared receive queue refuses it with
    /// [`DatapathError::InvalidWorkRequest`]; a receive naming memory the queue pair may not
    /// write (not of its protection domain, no local write access, out of bounds) with
    /// [`DatapathError::InvalidArgument`], here at the post, as
    /// [`crate::Device::connect_with_recvs`] refuses it (a running queue pair takes such a
    /// receive and completes it in error, as verbs does). Nothing is posted when it fails. The
    /// receives are checked again when the queue pair is connected or accepted: one whose
    /// region was deregistered since fails that call.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), DatapathError> {
        self.stages.post_recv(wr)
    }

    /// Posts a list of receives in order (`ibv_post_recv` with a chain): each as
    /// [`IdleQp::post_recv`] says; [`PostListError::posted`] says how many went before the
    /// one that failed (verbs' `bad_wr`), which stay posted.
    pub fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<usize, PostListError> {
        self.stages.post_recv_list(wrs)
    }

    /// How many receives are posted.
    pub fn recvs_posted(&self) -> usize {
        match &*self.stages.lock() {
            Stage::Idle(recvs) => recvs.wrs.len(),
            _ => 0,
        }
    }

    /// Moves the queue pair to Error before any connection (`ibv_modify_qp` to
    /// `IBV_QPS_ERR`): each receive posted to it completes with
    /// [`rdmap::WcStatus::WrFlushError`] on its receive completion queue, in the order
    /// posted, before this returns, as when its connect or accept fails; later posts through
    /// its [`QpPoster`]s complete flushed at once. (Dropping it instead is `ibv_destroy_qp`:
    /// no completion.)
    pub fn flush(self) {
        self.into_parts().hand_over.fail();
    }

    /// What the transport starts the queue pair with (its number and its receives), and the
    /// hand-over of its posts for when the connect or accept ends.
    pub(crate) fn into_parts(self) -> IdleParts {
        let wrs = {
            let mut stage = self.stages.lock();
            match std::mem::replace(&mut *stage, Stage::Destroyed) {
                Stage::Idle(PostedRecvs { wrs, check }) => {
                    *stage = Stage::Starting(Starting {
                        recvs: PostedRecvs {
                            wrs: Vec::new(),
                            check,
                        },
                        held: wrs.iter().map(|wr| wr.wr_id).collect(),
                    });
                    wrs
                }
                // Only an `IdleQp` moves its stage on from Idle, and this one is taken now.
                other => {
                    *stage = other;
                    Vec::new()
                }
            }
        };
        let hand_over = IdleHandOver {
            stages: self.stages.clone(),
            done: false,
        };
        let start = QpStart {
            num: self.stages.num,
            recvs: wrs,
            posters: Some(Box::new(PosterStart {
                stages: self.stages.clone(),
            })),
        };
        IdleParts {
            start,
            pd: self.pd.clone(),
            cq: self.cq.clone(),
            params: self.params.clone(),
            hand_over,
        }
    }
}

impl Drop for IdleQp {
    /// `ibv_destroy_qp` on a queue pair never connected: its receives go without completions,
    /// and its posters' posts fail from now on. (One a connect or accept took lives on.)
    fn drop(&mut self) {
        let mut stage = self.stages.lock();
        if matches!(*stage, Stage::Idle(_)) {
            *stage = Stage::Destroyed;
        }
    }
}

/// An [`IdleQp`] taken apart for its connect or accept.
pub(crate) struct IdleParts {
    pub(crate) start: QpStart,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) params: ConnectParams,
    pub(crate) hand_over: IdleHandOver,
}

/// What becomes of an [`IdleQp`]'s posts when the connect or accept that took it ends.
///
/// If it succeeds, the queue pair's posters post to the running queue pair from now on,
/// before the caller gets it: the transport may have handed them over already
/// ([`StartingPosts::run`]); if not, this does (the receives posted since the transport last
/// took them are queued to it, in order).
///
/// If it fails, the queue pair is in Error as a verbs queue pair is after a failed
/// connection (siw moves it there and flushes its queues): each receive posted to it
/// completes with [`WcStatus::WrFlushError`] on the queue pair's receive completion queue,
/// in the order posted, before the call returns or its event is queued, so that the
/// application gets its buffers back, and later posts through its posters complete flushed
/// at once. A failed call has handed nothing to the queue pair's completion queues (the
/// transports give a connection its completion queue only when the caller gets the queue
/// pair), so each receive completes once.
pub(crate) struct IdleHandOver {
    stages: Arc<Stages>,
    /// Handed over already: a hand-over dropped before (a thread that never ran) fails.
    done: bool,
}

impl IdleHandOver {
    /// Passes `outcome` on, the queue pair moved to Error first if it is a failure.
    pub(crate) fn after(
        mut self,
        outcome: Result<Connection, DatapathError>,
    ) -> Result<Connection, DatapathError> {
        match &outcome {
            Ok(connection) => {
                self.done = true;
                self.stages.run(connection.qp.post_path(), None);
            }
            Err(_) => self.fail_now(),
        }
        outcome
    }

    /// [`IdleHandOver::after`] if there is a queue pair to hand over.
    pub(crate) fn after_maybe(
        hand_over: Option<IdleHandOver>,
        outcome: Result<Connection, DatapathError>,
    ) -> Result<Connection, DatapathError> {
        match hand_over {
            Some(hand_over) => hand_over.after(outcome),
            None => outcome,
        }
    }

    /// The connect or accept failed: the queue pair is in Error (see [`IdleHandOver`]).
    pub(crate) fn fail(mut self) {
        self.fail_now();
    }

    /// Every receive posted to the queue pair completes flushed, in order, and so does every
    /// later post.
    fn fail_now(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let mut stage = self.stages.lock();
        let Stage::Starting(starting) = &mut *stage else {
            // Only a start can fail, and none does once its transport runs the queue pair.
            return;
        };
        let late: Vec<u64> = starting.recvs.wrs.iter().map(|wr| wr.wr_id).collect();
        self.stages.complete_flushed(&starting.held);
        self.stages.complete_flushed(&late);
        *stage = Stage::Error;
    }
}

impl Drop for IdleHandOver {
    fn drop(&mut self) {
        self.fail_now();
    }
}

/// [`StartingPosts`] of a queue pair created before its connection: its [`Stages`].
struct PosterStart {
    stages: Arc<Stages>,
}

impl StartingPosts for PosterStart {
    fn take(&self, post: &mut dyn FnMut(RecvWr)) {
        let mut stage = self.stages.lock();
        if let Stage::Starting(starting) = &mut *stage {
            for wr in std::mem::take(&mut starting.recvs.wrs) {
                starting.held.push(wr.wr_id);
                post(wr);
            }
        }
    }

    fn run(self: Box<Self>, path: &PostPath, post: &mut dyn FnMut(RecvWr)) {
        self.stages.run(path, Some(post));
    }
}

impl Stages {
    fn lock(&self) -> std::sync::MutexGuard<'_, Stage> {
        self.stage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Completes the receives `wr_ids` with [`WcStatus::WrFlushError`], in order.
    fn complete_flushed(&self, wr_ids: &[u64]) {
        for &wr_id in wr_ids {
            let c = Completion {
                qp_num: self.num,
                wc: WorkCompletion::failed(wr_id, WcOpcode::Recv, WcStatus::WrFlushError),
            };
            if self.cq.push(c).is_err() {
                tracing::warn!(
                    qp = self.num,
                    "completion queue full: flushed receives of a failed connection lost"
                );
                return;
            }
        }
    }

    /// [`StartingPosts::run`], which hands the receives posted since the transport last took
    /// them to `post`; or the start's end (no `post`), which queues them to `path`, whichever
    /// comes first: nothing once the queue pair runs.
    fn run(&self, path: &PostPath, post: Option<&mut dyn FnMut(RecvWr)>) {
        let mut stage = self.lock();
        let Stage::Starting(starting) = &mut *stage else {
            return;
        };
        let late = std::mem::take(&mut starting.recvs.wrs);
        if let Some(post) = post {
            late.into_iter().for_each(post);
        } else {
            let ids: Vec<u64> = late.iter().map(|wr| wr.wr_id).collect();
            if let Err(e) = path.post_recv_list(late) {
                // The queue pair ended before they could be queued (it refuses posts, or its
                // completion queue is full of flushed ones): they were accepted, so they
                // complete, flushed (before those the transport holds, which it flushes as
                // it ends: only when the stream failed right behind the hand-over).
                tracing::debug!(qp = self.num, "receives posted while starting: {e}");
                self.complete_flushed(&ids[e.posted..]);
            }
        }
        // Set before the stage says Running, both under the lock: a post that found
        // `running` unset and waits for the lock finds the stage Running.
        let _ = self.running.set(path.clone());
        *stage = Stage::Running(path.clone());
    }

    /// [`QpPoster::post_recv`] (and [`IdleQp::post_recv`]).
    fn post_recv(&self, wr: RecvWr) -> Result<(), DatapathError> {
        if let Some(path) = self.running.get() {
            return path.post_recv(wr);
        }
        let mut stage = self.lock();
        if self.srq && !matches!(*stage, Stage::Running(_) | Stage::Destroyed) {
            return Err(DatapathError::InvalidWorkRequest(
                rdmap::RdmapError::SrqAttached,
            ));
        }
        match &mut *stage {
            Stage::Idle(recvs) | Stage::Starting(Starting { recvs, .. }) => {
                let PostedRecvs { wrs, check } = recvs;
                post_initial_recvs(check, &self.pd.table.snapshot(), vec![wr])?;
                wrs.push(wr);
                Ok(())
            }
            Stage::Running(path) => path.post_recv(wr),
            Stage::Error => self.flushed(wr.wr_id, WcOpcode::Recv),
            Stage::Destroyed => Err(DatapathError::NotConnected),
        }
    }

    /// [`QpPoster::post_recv_list`] (and [`IdleQp::post_recv_list`]).
    fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<usize, PostListError> {
        if let Some(path) = self.running.get() {
            return path.post_recv_list(wrs);
        }
        PostListError::post_each(wrs, |wr| self.post_recv(wr))
    }

    /// A send work request posted to the queue pair: to the running queue pair by `post`;
    /// refused before it runs; flushed in Error. Before the queue pair runs, `shape` checks
    /// the request by itself first (as the running queue pair does).
    fn post_send(
        &self,
        wr_id: u64,
        opcode: WcOpcode,
        shape: impl FnOnce(bool) -> Result<(), rdmap::RdmapError>,
        post: impl FnOnce(&PostPath) -> Result<(), DatapathError>,
    ) -> Result<(), DatapathError> {
        if let Some(path) = self.running.get() {
            return post(path);
        }
        shape(self.extensions).map_err(DatapathError::InvalidWorkRequest)?;
        match &*self.lock() {
            Stage::Running(path) => post(path),
            Stage::Error => self.flushed(wr_id, opcode),
            Stage::Idle(_) | Stage::Starting(_) | Stage::Destroyed => {
                Err(DatapathError::NotConnected)
            }
        }
    }

    /// A post to the queue pair in Error: it completes at once, flushed, or fails with
    /// [`DatapathError::CompletionQueueFull`] if its completion queue has no room.
    fn flushed(&self, wr_id: u64, opcode: WcOpcode) -> Result<(), DatapathError> {
        self.cq
            .offer(Completion {
                qp_num: self.num,
                wc: WorkCompletion::failed(wr_id, opcode, WcStatus::WrFlushError),
            })
            .map_err(|_| DatapathError::CompletionQueueFull)
    }
}

/// A handle that posts to one queue pair through its whole life (the `ibv_qp` that
/// `ibv_post_recv` and `ibv_post_send` take, whatever the queue pair's state), from
/// [`IdleQp::poster`]; clone it freely.
///
/// Verbs programs post to a queue pair from any thread at any time: a completion thread
/// reposts a receive as soon as one completes, which on the accepting side can be before the
/// thread that accepted has taken the `Established` event (rping's server does this). An
/// [`IdleQp`] is consumed by its connect or accept, and the [`crate::QueuePair`] reaches the
/// application only with that event; a poster bridges the gap:
///
/// - before the connect or accept, receives are posted to the [`IdleQp`] (as
///   [`IdleQp::post_recv`]);
/// - while it starts, receives collect behind those it starts with (counting against the
///   receive queue's depth with them, checked as [`IdleQp::post_recv`] checks them); the
///   transport takes them, in order, before it places any received data (a Send that came
///   with the MPA Reply finds a receive posted before it arrived), and the posters post to
///   the running queue pair before it can deliver any completion and before the
///   application has the [`crate::QueuePair`];
/// - once the queue pair runs, every post goes to it as through the [`crate::QueuePair`]
///   (the same queues and checks, with all its errors), also after the queue pair has ended;
/// - if the connect or accept failed (or [`IdleQp::flush`]), posts complete at once with
///   [`WcStatus::WrFlushError`], as on a queue pair in Error.
///
/// Send work requests posted before the queue pair runs fail with
/// [`DatapathError::NotConnected`] (verbs' `ENOTCONN` for a queue pair not in RTS), and every
/// post once the [`IdleQp`] was dropped without a connection. A poster holds the running
/// queue pair's command channel: posts after the [`crate::QueuePair`] is gone are refused
/// ([`DatapathError::Disconnected`]) or flushed, as posts to an ended queue pair are.
#[derive(Clone)]
pub struct QpPoster {
    stages: Arc<Stages>,
}

impl std::fmt::Debug for QpPoster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpPoster")
            .field("num", &self.stages.num)
            .finish()
    }
}

impl QpPoster {
    /// The queue pair's number.
    pub fn num(&self) -> u32 {
        self.stages.num
    }

    /// Posts a receive (`ibv_post_recv`), at whatever stage the queue pair is (see
    /// [`QpPoster`]).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), DatapathError> {
        self.stages.post_recv(wr)
    }

    /// Posts a list of receives in order (`ibv_post_recv` with a chain): each as
    /// [`QpPoster::post_recv`]; [`PostListError::posted`] says how many went before the one
    /// that failed.
    pub fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<usize, PostListError> {
        self.stages.post_recv_list(wrs)
    }

    /// Posts a Send, RDMA Write or RDMA Read ([`crate::QueuePair::post_send`]) once the queue
    /// pair runs (see [`QpPoster`]).
    pub fn post_send(&self, wr: SendWr) -> Result<(), DatapathError> {
        let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode());
        self.stages.post_send(
            wr_id,
            opcode,
            |extensions| wr.check_shape(extensions),
            |path| path.post_send(wr),
        )
    }

    /// Posts a Send or Write with its payload inline
    /// ([`crate::QueuePair::post_send_inline`]) once the queue pair runs.
    pub fn post_send_inline(&self, wr: InlineSendWr) -> Result<(), DatapathError> {
        let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode());
        self.stages.post_send(
            wr_id,
            opcode,
            |extensions| wr.check_shape(extensions),
            |path| path.post_send_inline(wr),
        )
    }

    /// Posts a list of send work requests in order ([`crate::QueuePair::post_send_list`])
    /// once the queue pair runs; before, the first fails with
    /// [`DatapathError::NotConnected`]; in Error each completes flushed.
    pub fn post_send_list<W: Into<SendRequest>>(
        &self,
        wrs: impl IntoIterator<Item = W>,
    ) -> Result<usize, PostListError> {
        if let Some(path) = self.stages.running.get() {
            return path.post_send_list(wrs);
        }
        PostListError::post_each(wrs, |wr| match wr.into() {
            SendRequest::Wr(wr) => self.post_send(wr),
            SendRequest::Inline(wr) => self.post_send_inline(wr),
        })
    }
}

impl ConnectRequest {
    /// Accepts with a queue pair created for this request (`rdma_accept` after
    /// `rdma_create_qp` on the request's id), which becomes the running queue pair with its
    /// number and with the receives posted to it in place first. The queue pair's own
    /// settings are those it was created with (its protection domain, completion queues,
    /// queue depths, shared receive queue and RDMAP extensions), whatever this request's
    /// [`queue_depths`](Self::queue_depths), [`use_srq`](Self::use_srq),
    /// [`use_recv_cq`](Self::use_recv_cq) and [`rdmap_extensions`](Self::rdmap_extensions)
    /// say; the connection's (MPA, IRD and ORD, framing, timeouts, TOS) are the request's. It
    /// fails, and rejects the request, as [`ConnectRequest::accept_with_recvs`] does, the
    /// queue pair's receives completing as flushed first (see [`IdleQp`]).
    pub fn accept_qp(
        mut self,
        qp: IdleQp,
        private_data: &[u8],
    ) -> Result<Connection, DatapathError> {
        let qp = qp.into_parts();
        self.adopt(qp.params);
        let outcome = self.accept_start(&qp.pd, &qp.cq, private_data, qp.start);
        qp.hand_over.after(outcome)
    }

    /// [`ConnectRequest::accept_qp`] on an event channel (`rdma_accept` on an id whose
    /// channel the application waits on): the arguments are checked now (a refusal rejects
    /// the request and is returned, as `accept_qp`'s), then the Reply is sent from a thread
    /// of its own and the outcome queued on `channel`, tagged with `context`:
    /// [`crate::CmEvent::Established`] with the connection (whose queue pair then reports
    /// [`crate::CmEvent::Disconnected`] there), or [`crate::CmEvent::ConnectError`].
    ///
    /// Returns the accept's [`ConnectAttempt`]: its [`ConnectAttempt::cancel`] is
    /// `rdma_destroy_id` on the request's id while it accepts. No event of the accept is
    /// queued after it; a connection the accept still establishes is reset as soon as it is
    /// up (the peer, told it was accepted, sees it end), and the queue pair's receives
    /// complete as flushed then.
    pub fn accept_qp_async(
        mut self,
        qp: IdleQp,
        private_data: &[u8],
        channel: &CmEventChannel,
        context: u64,
    ) -> Result<ConnectAttempt, DatapathError> {
        let qp = qp.into_parts();
        self.adopt(qp.params);
        let request = match self.check_accept(&qp.pd, private_data, &qp.start) {
            Ok(request) => request,
            Err(e) => {
                qp.hand_over.fail();
                return Err(e);
            }
        };
        let (pd, cq, start, hand_over) = (qp.pd, qp.cq, qp.start, qp.hand_over);
        let private_data = private_data.to_vec();
        let channel = channel.clone();
        let attempt = ConnectAttempt::new();
        let outcome_of = attempt.clone();
        // The request goes to the thread once it runs: should no thread be had, it is still
        // here to reject (the peer hears of it now, not at its MPA timeout), and the
        // receives to flush.
        let (give, take) = std::sync::mpsc::sync_channel::<(ConnectRequest, IdleHandOver)>(1);
        let spawned = std::thread::Builder::new()
            .name("iwarp-cm-accept".into())
            .spawn(move || {
                let Ok((request, hand_over)) = take.recv() else {
                    return;
                };
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    request.finish_accept(&pd, &cq, &private_data, start)
                }))
                .unwrap_or_else(|cause| Err(crate::error::panicked("accepting", &*cause)));
                push_outcome(&channel, context, &outcome_of, hand_over.after(outcome));
            });
        if let Err(e) = spawned {
            let _ = request.reject(&[]);
            hand_over.fail();
            return Err(e.into());
        }
        // The thread waits for it: the channel has room for it, and its receiver lives.
        let _ = give.send((request, hand_over));
        Ok(attempt)
    }

    /// Takes the queue pair's own settings (see [`ConnectRequest::accept_qp`]).
    fn adopt(&mut self, qp_params: ConnectParams) {
        self.params.sq_depth = qp_params.sq_depth;
        self.params.rq_depth = qp_params.rq_depth;
        self.params.srq = qp_params.srq;
        self.params.recv_cq = qp_params.recv_cq;
        self.params.rdmap_extensions = qp_params.rdmap_extensions;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::qp::tests::handle_with_cq;
    use crate::verbs::qp::{Cmd, Shared};
    use rdmap::{QpState, SendOp, SgeList};

    fn recv(wr_id: u64) -> RecvWr {
        RecvWr {
            wr_id,
            sg_list: SgeList::new(),
        }
    }

    fn send(wr_id: u64) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: SgeList::new(),
            signaled: true,
            fence: false,
        }
    }

    /// An idle queue pair with a receive queue of `rq_depth`, and its completion queue.
    fn idle(rq_depth: usize) -> (IdleQp, CompletionQueue) {
        let cq = CompletionQueue::new();
        let params = ConnectParams {
            rq_depth,
            ..ConnectParams::default()
        };
        let qp = IdleQp::new(&ProtectionDomain::new(), &cq, &params).expect("create");
        (qp, cq)
    }

    /// The work request ids the transport's end of a command channel holds, in order.
    fn taken(cmds: &crossbeam_channel::Receiver<Cmd>) -> Vec<(char, u64)> {
        cmds.try_iter()
            .filter_map(|cmd| match cmd {
                Cmd::Recv(wr) => Some(('r', wr.wr_id)),
                Cmd::Send(wr) => Some(('s', wr.wr_id)),
                _ => None,
            })
            .collect()
    }

    /// The receives `wr_ids` of `num` (then the Sends `sends`) are on `cq`, flushed, in
    /// order, and nothing else is.
    fn flushed(cq: &CompletionQueue, num: u32, wr_ids: &[u64], sends: &[u64]) {
        let expected: Vec<_> = (wr_ids.iter().map(|&id| (id, WcOpcode::Recv)))
            .chain(sends.iter().map(|&id| (id, WcOpcode::Send)))
            .collect();
        for (wr_id, opcode) in expected {
            let c = cq
                .try_next()
                .unwrap_or_else(|| panic!("{wr_id} not flushed"));
            assert_eq!(
                (c.qp_num, c.wc.wr_id, c.wc.opcode, c.wc.status),
                (num, wr_id, opcode, WcStatus::WrFlushError),
                "{c:?}"
            );
        }
        assert!(cq.is_empty(), "more completions: {:?}", cq.try_next());
    }

    /// Receives posted through a poster before the connect or accept are the queue pair's
    /// first; those posted while it starts count against the depth with them and go to the
    /// transport's queue pair in order: those taken before it places data directly, those
    /// posted after when the transport runs it (directly too) or the start's end does
    /// (through its command channel), whichever comes first; later posts go straight to it,
    /// once. Sends wait for the queue pair to run.
    #[test]
    fn posts_while_starting_reach_the_running_queue_pair_in_order() {
        for transport_first in [true, false] {
            posts_while_starting(transport_first);
        }
    }

    fn posts_while_starting(transport_first: bool) {
        let (qp, cq) = idle(5);
        let poster = qp.poster();
        assert_eq!(poster.num(), qp.num());
        qp.post_recv(recv(1)).expect("post to the idle queue pair");
        poster.post_recv(recv(2)).expect("post through the poster");
        assert_eq!(qp.recvs_posted(), 2);
        let mut parts = qp.into_parts();
        let started: Vec<u64> = parts.start.recvs.iter().map(|wr| wr.wr_id).collect();
        assert_eq!(started, [1, 2], "the receives it starts with");
        let posters = parts.start.posters.take().expect("the posters' hand-over");

        assert_eq!(poster.post_recv_list([recv(3), recv(4)]).ok(), Some(2));
        assert!(matches!(
            poster.post_send(send(9)),
            Err(DatapathError::NotConnected)
        ));
        let mut taken_early = Vec::new();
        posters.take(&mut |wr| taken_early.push(wr.wr_id));
        assert_eq!(taken_early, [3, 4], "taken before data is placed");
        poster.post_recv(recv(5)).expect("post while starting");
        assert!(
            matches!(
                poster.post_recv(recv(6)),
                Err(DatapathError::RecvQueueFull { depth: 5 })
            ),
            "the depth counts those it started with and those taken"
        );

        let shared = Shared::new(QpState::Rts);
        let sink = CqSink::new(&cq, None);
        let (running, cmds) = handle_with_cq(shared.clone(), Some(sink));
        let path = running.post_path().clone();
        let mut posters = Some(posters);
        if transport_first {
            let mut by_transport = Vec::new();
            let post = &mut |wr: RecvWr| by_transport.push(wr.wr_id);
            posters.take().expect("unused").run(&path, post);
            assert_eq!(by_transport, [5], "taken when it runs");
        }
        let connection = parts.hand_over.after(Ok(Connection {
            qp: running,
            private_data: Vec::new(),
        }));
        let Ok(connection) = connection else {
            panic!("the outcome changed");
        };
        if !transport_first {
            assert_eq!(taken(&cmds), [('r', 5)], "queued at the start's end");
            posters
                .take()
                .expect("unused")
                .run(&path, &mut |_| panic!("taken twice"));
        }
        assert!(cmds.is_empty(), "queued twice");
        poster
            .post_recv(recv(7))
            .expect("post to the running queue pair");
        poster
            .post_send(send(8))
            .expect("send on the running queue pair");
        assert_eq!(taken(&cmds), [('r', 7), ('s', 8)]);
        assert!(cq.is_empty(), "a completion: {:?}", cq.try_next());

        // No transport here: finished, so that dropping the handle does not wait for one.
        shared.mark_finished(QpState::Error);
        drop(connection);
    }

    /// A start that fails leaves the queue pair in Error: the receives it started with, those
    /// the transport took while it started, then those posted since complete flushed in
    /// order; later posts complete flushed at once. The same when the hand-over is dropped
    /// unfinished (a thread that never ran).
    #[test]
    fn a_failed_start_flushes_every_receive_in_order_and_later_posts() {
        for dropped in [false, true] {
            let (qp, cq) = idle(4);
            let (num, poster) = (qp.num(), qp.poster());
            qp.post_recv(recv(1)).expect("post");
            let mut parts = qp.into_parts();
            poster.post_recv(recv(2)).expect("post while starting");
            let posters = parts.start.posters.take().expect("the posters' hand-over");
            posters.take(&mut |_| {});
            poster
                .post_recv(recv(3))
                .expect("post after the transport took some");
            if dropped {
                drop(parts);
            } else {
                let outcome = parts.hand_over.after(Err(DatapathError::Timeout("test")));
                assert!(outcome.is_err());
            }
            flushed(&cq, num, &[1, 2, 3], &[]);
            poster.post_recv(recv(4)).expect("post in Error");
            poster.post_send(send(5)).expect("send in Error");
            flushed(&cq, num, &[4], &[5]);
            // An extension's opcode on a queue pair without the RFC 7306 extensions.
            let bad = SendWr {
                op: SendOp::Atomic {
                    remote_stag: rdmap::Stag(1),
                    remote_to: 0,
                    op: rdmap::AtomicOp::fetch_add(1),
                },
                ..send(6)
            };
            assert!(
                matches!(
                    poster.post_send(bad),
                    Err(DatapathError::InvalidWorkRequest(_))
                ),
                "a request wrong by itself is refused in Error too"
            );
        }
    }

    /// A queue pair dropped without a connection (`ibv_destroy_qp`) completes nothing, and
    /// its posters' posts fail.
    #[test]
    fn a_destroyed_idle_queue_pair_refuses_posts() {
        let (qp, cq) = idle(4);
        let poster = qp.poster();
        poster.post_recv(recv(1)).expect("post");
        drop(qp);
        assert!(matches!(
            poster.post_recv(recv(2)),
            Err(DatapathError::NotConnected)
        ));
        assert!(matches!(
            poster.post_send(send(3)),
            Err(DatapathError::NotConnected)
        ));
        assert!(cq.is_empty());
    }

    /// [`IdleQp::flush`] is the failed start's Error: posts through a poster after it
    /// complete flushed.
    #[test]
    fn posts_after_a_flush_complete_flushed() {
        let (qp, cq) = idle(4);
        let (num, poster) = (qp.num(), qp.poster());
        poster.post_recv(recv(1)).expect("post");
        qp.flush();
        poster.post_recv(recv(2)).expect("post in Error");
        flushed(&cq, num, &[1, 2], &[]);
    }
}
