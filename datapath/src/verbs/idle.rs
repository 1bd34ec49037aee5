//! Queue pairs created before their connection (verbs' `rdma_create_qp` or `ibv_create_qp`
//! before `rdma_connect` or `rdma_accept`): [`IdleQp`] has its number and takes receives at
//! once; connecting or accepting turns it into a running [`QueuePair`] with the same number
//! and those receives in place before the peer can send anything.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Mutex;

use rdmap::{RecvWr, WcOpcode, WcStatus, WorkCompletion};

use crate::memory::ProtectionDomain;
use crate::verbs::cm::{receive_queue_alone, ConnectParams, ConnectRequest, Connection};
use crate::verbs::cm_events::{push_outcome, CmEventChannel, ConnectAttempt};
use crate::verbs::cq::{Completion, CompletionQueue, CqSink};
use crate::verbs::qp::{next_qp_num, post_initial_recvs, QpAttr, QpStart};
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
    num: u32,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) params: ConnectParams,
    recvs: Mutex<PostedRecvs>,
}

/// The receives posted to an [`IdleQp`], and a receive queue of its depth that has taken
/// each as the connect or accept will post it (the checks and errors of
/// [`crate::Device::connect_with_recvs`]).
struct PostedRecvs {
    wrs: Vec<RecvWr>,
    check: rdmap::QueuePair,
}

impl std::fmt::Debug for IdleQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleQp")
            .field("num", &self.num)
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
        Ok(IdleQp {
            num: next_qp_num(),
            pd: pd.clone(),
            cq: cq.clone(),
            params: params.clone(),
            recvs: Mutex::new(PostedRecvs {
                wrs: Vec::new(),
                check,
            }),
        })
    }

    /// The queue pair's number (`ibv_qp.qp_num`), which the running queue pair keeps (and
    /// its [`crate::Completion`]s carry).
    pub fn num(&self) -> u32 {
        self.num
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
        let mut recvs = self.recvs.lock().unwrap_or_else(|e| e.into_inner());
        if self.params.srq.is_some() {
            return Err(DatapathError::InvalidWorkRequest(
                rdmap::RdmapError::SrqAttached,
            ));
        }
        let PostedRecvs { wrs, check } = &mut *recvs;
        post_initial_recvs(check, &self.pd.table.snapshot(), vec![wr])?;
        wrs.push(wr);
        Ok(())
    }

    /// Posts a list of receives in order (`ibv_post_recv` with a chain): each as
    /// [`IdleQp::post_recv`] says; [`PostListError::posted`] says how many went before the
    /// one that failed (verbs' `bad_wr`), which stay posted.
    pub fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<usize, PostListError> {
        PostListError::post_each(wrs, |wr| self.post_recv(wr))
    }

    /// How many receives are posted.
    pub fn recvs_posted(&self) -> usize {
        self.recvs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .wrs
            .len()
    }

    /// Moves the queue pair to Error before any connection (`ibv_modify_qp` to
    /// `IBV_QPS_ERR`): each receive posted to it completes with
    /// [`rdmap::WcStatus::WrFlushError`] on its receive completion queue, in the order
    /// posted, before this returns, as when its connect or accept fails. (Dropping it instead
    /// is `ibv_destroy_qp`: no completion.)
    pub fn flush(self) {
        self.into_parts().flushes.flush();
    }

    /// What the transport starts the queue pair with (its number and its receives), and the
    /// flushes of those receives should the connect or accept fail.
    pub(crate) fn into_parts(self) -> IdleParts {
        let recvs = self.recvs.into_inner().unwrap_or_else(|e| e.into_inner());
        let flushes = RecvFlushes {
            num: self.num,
            wr_ids: recvs.wrs.iter().map(|wr| wr.wr_id).collect(),
            cq: CqSink::new(&self.cq, self.params.recv_cq.as_ref()),
        };
        let start = QpStart {
            num: self.num,
            recvs: recvs.wrs,
        };
        IdleParts {
            start,
            pd: self.pd,
            cq: self.cq,
            params: self.params,
            flushes,
        }
    }
}

/// An [`IdleQp`] taken apart for its connect or accept.
pub(crate) struct IdleParts {
    pub(crate) start: QpStart,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) params: ConnectParams,
    pub(crate) flushes: RecvFlushes,
}

/// The receives posted to an [`IdleQp`], to complete as flushed if its connect or accept
/// fails. The application has the queue pair's number and its receives' buffers are its own:
/// as a verbs queue pair goes to ERR when its connection cannot be made (siw moves it there
/// and flushes its queues), each receive completes with [`WcStatus::WrFlushError`] on the
/// queue pair's receive completion queue, before the call returns or its event is queued, so
/// that the application gets its buffers back. A failed call has handed nothing to the
/// queue pair's completion queues (the transports give a connection its completion queue
/// only when the caller gets the queue pair), so each receive completes once.
pub(crate) struct RecvFlushes {
    num: u32,
    wr_ids: Vec<u64>,
    cq: CqSink,
}

impl RecvFlushes {
    /// Passes `outcome` on, the receives flushed first if it is a failure.
    pub(crate) fn after<T>(self, outcome: Result<T, DatapathError>) -> Result<T, DatapathError> {
        if outcome.is_err() {
            self.flush();
        }
        outcome
    }

    /// [`RecvFlushes::after`] if there are receives to flush.
    pub(crate) fn after_maybe<T>(
        flushes: Option<RecvFlushes>,
        outcome: Result<T, DatapathError>,
    ) -> Result<T, DatapathError> {
        match flushes {
            Some(flushes) => flushes.after(outcome),
            None => outcome,
        }
    }

    fn flush(self) {
        for wr_id in self.wr_ids {
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
        qp.flushes.after(outcome)
    }

    /// [`ConnectRequest::accept_qp`] on an event channel (`rdma_accept` on an id whose
    /// channel the application waits on): the arguments are checked now (a refusal rejects
    /// the request and is returned, as `accept_qp`'s), then the Reply is sent from a thread
    /// of its own and the outcome queued on `channel`, tagged with `context`:
    /// [`crate::CmEvent::Established`] with the connection (whose queue pair then reports
    /// [`crate::CmEvent::Disconnected`] there), or [`crate::CmEvent::ConnectError`].
    pub fn accept_qp_async(
        mut self,
        qp: IdleQp,
        private_data: &[u8],
        channel: &CmEventChannel,
        context: u64,
    ) -> Result<(), DatapathError> {
        let qp = qp.into_parts();
        self.adopt(qp.params);
        let request = match self.check_accept(&qp.pd, private_data, &qp.start) {
            Ok(request) => request,
            Err(e) => return qp.flushes.after(Err(e)),
        };
        let (pd, cq, start, flushes) = (qp.pd, qp.cq, qp.start, qp.flushes);
        let private_data = private_data.to_vec();
        let channel = channel.clone();
        let attempt = ConnectAttempt::new();
        // The request goes to the thread once it runs: should no thread be had, it is still
        // here to reject (the peer hears of it now, not at its MPA timeout), and the
        // receives to flush.
        let (hand_over, take) = std::sync::mpsc::sync_channel::<(ConnectRequest, RecvFlushes)>(1);
        let spawned = std::thread::Builder::new()
            .name("iwarp-cm-accept".into())
            .spawn(move || {
                let Ok((request, flushes)) = take.recv() else {
                    return;
                };
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    request.finish_accept(&pd, &cq, &private_data, start)
                }))
                .unwrap_or_else(|cause| Err(crate::error::panicked("accepting", &*cause)));
                push_outcome(&channel, context, &attempt, flushes.after(outcome));
            });
        if let Err(e) = spawned {
            let _ = request.reject(&[]);
            return flushes.after(Err(e.into()));
        }
        // The thread waits for it: the channel has room for it, and its receiver lives.
        let _ = hand_over.send((request, flushes));
        Ok(())
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
