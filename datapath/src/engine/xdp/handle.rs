//! The application's way in to an engine thread: [`Handle`] (setup commands answered with a
//! deadline) and the providers behind a [`Listener`](crate::Listener) ([`XdpListen`]) and a
//! [`ConnectRequest`] (`PendingRequest`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::log_rate::LogRate;
use crate::memory::ProtectionDomain;
use crate::verbs::cm::{
    recv_request, ConnectParams, ConnectRequest, ListenProvider, PendingProvider,
};
use crate::verbs::cq::{CompletionQueue, CqSink};
use crate::verbs::qp::{QpStart, QueuePair};
use crate::xdp_tcp::ConnId;
use crate::DatapathError;

use super::commands::{handover, EngineCmd, RequestMsg};
use super::wake::Wake;

/// The application's way to the engine thread.
#[derive(Clone)]
pub(super) struct Handle {
    pub(super) cmds: Sender<EngineCmd>,
    pub(super) wake: Arc<Wake>,
}

impl Handle {
    pub(super) fn call<T>(
        &self,
        cmd: EngineCmd,
        rx: Receiver<Result<T, DatapathError>>,
        timeout: Duration,
        what: &'static str,
    ) -> Result<T, DatapathError> {
        self.send(cmd)?;
        Self::reply(rx, timeout, what)
    }

    /// Hands the engine a command: [`DatapathError::Disconnected`] if the engine has stopped.
    /// A failed wake-up is logged, not returned: the command is queued, and the engine takes
    /// it at its next look all the same (a sleeping or parked engine thread looks at least
    /// every 50 ms: its idle wait, its counters' refresh). An error would tell the
    /// caller the command was not given (an accept or reject the application would repeat,
    /// or give up on, while the engine carries it out).
    pub(super) fn send(&self, cmd: EngineCmd) -> Result<(), DatapathError> {
        self.cmds
            .send(cmd)
            .map_err(|_| DatapathError::Disconnected)?;
        self.wake_engine();
        Ok(())
    }

    /// Wakes the engine for a queued command, logging (at most a line a second) a failure.
    fn wake_engine(&self) {
        static LINES: LogRate = LogRate::new(1);
        if let Err(e) = self.wake.wake_engine() {
            if let Some(suppressed) = LINES.admit() {
                tracing::warn!(
                    suppressed,
                    "waking the engine failed ({e}): the command goes at its next look"
                );
            }
        }
    }

    /// Waits up to `timeout` for a command's reply.
    pub(super) fn reply<T>(
        rx: Receiver<Result<T, DatapathError>>,
        timeout: Duration,
        what: &'static str,
    ) -> Result<T, DatapathError> {
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => Err(DatapathError::Timeout(what)),
            Err(RecvTimeoutError::Disconnected) => Err(DatapathError::Disconnected),
        }
    }
}

/// The longest a dropped listener waits for the engine's shards to stop listening, to reject
/// the Requests they queued until then ([`XdpListen`]'s drop).
const UNLISTEN_WAIT: Duration = Duration::from_secs(1);

/// A listening port of the engine (behind [`Listener`](crate::Listener)).
pub(super) struct XdpListen {
    pub(super) rx: Receiver<RequestMsg>,
    /// Every shard's handle (requests name their shard).
    pub(super) handles: Vec<Handle>,
    pub(super) local: SocketAddr,
}

impl Drop for XdpListen {
    /// Stops listening on every shard (`rdma_destroy_id` of a listening id): the port takes no
    /// new connection; those accepted already live on. Then the Requests no accept took are
    /// rejected (Reply with R=1), as a dropped [`ConnectRequest`] is: each shard drops its
    /// end of the queue as it stops listening, so none comes after the queue says so (a
    /// stopped engine's at once; a shard that does not answer is waited for
    /// [`UNLISTEN_WAIT`] at most).
    fn drop(&mut self) {
        for handle in &self.handles {
            // An engine that stopped listens no more anyway.
            let _ = handle.send(EngineCmd::Unlisten {
                port: self.local.port(),
            });
        }
        let deadline = Instant::now() + UNLISTEN_WAIT;
        while let Ok(msg) = self.rx.recv_deadline(deadline) {
            if let Some(handle) = self.handles.get(msg.shard) {
                let pending = PendingRequest {
                    id: msg.id,
                    handle: handle.clone(),
                };
                Box::new(pending).abandon(&ConnectParams::default());
            }
        }
    }
}

impl ListenProvider for XdpListen {
    fn local_addr(&self) -> Result<SocketAddr, DatapathError> {
        Ok(self.local)
    }

    /// The next MPA Request (waiting forever with `None`); `Ok(None)` when `timeout` passed.
    fn accept(
        &self,
        params: &ConnectParams,
        timeout: Option<Duration>,
    ) -> Result<Option<ConnectRequest>, DatapathError> {
        let Some(msg) = recv_request(&self.rx, timeout)? else {
            return Ok(None);
        };
        let handle = self
            .handles
            .get(msg.shard)
            .ok_or(DatapathError::Disconnected)?
            .clone();
        let pending = PendingRequest { id: msg.id, handle };
        Ok(Some(ConnectRequest::new(
            Box::new(pending),
            msg.info,
            msg.peer,
            self.local,
            params.clone(),
        )))
    }
}

/// A connection of the engine whose MPA Request waits for the application (behind
/// [`ConnectRequest`]). Dropped without an answer, it is rejected
/// ([`PendingProvider::abandon`]).
struct PendingRequest {
    id: ConnId,
    handle: Handle,
}

impl PendingProvider for PendingRequest {
    fn accept(
        self: Box<Self>,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        private_data: &[u8],
        start: QpStart,
        params: &ConnectParams,
    ) -> Result<QueuePair, DatapathError> {
        let cqs = CqSink::new(cq, params.recv_cq.as_ref());
        cqs.attach(self.handle.wake.clone());
        let (tx, rx) = handover();
        let cmd = EngineCmd::Accept {
            id: self.id,
            pd: pd.clone(),
            cq: cqs,
            private_data: private_data.to_vec(),
            start,
            params: params.clone(),
            reply: tx,
        };
        self.handle.send(cmd)?;
        let parts = rx.wait(params.setup_timeout, "accepting the MPA Request")?;
        Ok(QueuePair::from_parts(parts))
    }

    fn reject(
        self: Box<Self>,
        private_data: &[u8],
        params: &ConnectParams,
    ) -> Result<(), DatapathError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let cmd = EngineCmd::Reject {
            id: self.id,
            private_data: private_data.to_vec(),
            reply: tx,
        };
        self.handle
            .call(cmd, rx, params.setup_timeout, "rejecting the MPA Request")
    }

    fn abandon(self: Box<Self>, _params: &ConnectParams) {
        // Nobody waits for the engine's answer: its reply finds the receiver gone.
        let (tx, _rx) = crossbeam_channel::bounded(1);
        let _ = self.handle.send(EngineCmd::Reject {
            id: self.id,
            private_data: Vec::new(),
            reply: tx,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;
    use std::sync::atomic::Ordering;

    use super::super::wake::{Wake, SLEEPING};

    /// A command queued for a sleeping engine whose wake-up fails (its socket's reader gone)
    /// is given all the same: `send` says so rather than an error the caller would act on,
    /// and the command waits in the queue for the engine's next look.
    #[test]
    fn a_failed_wake_up_still_gives_the_command() {
        let (tx, rx) = UnixDatagram::pair().expect("socket pair");
        drop(rx);
        let wake = Wake::new(tx, false, Duration::from_millis(50)).expect("wake");
        wake.state.store(SLEEPING, Ordering::SeqCst);
        assert!(wake.wake_engine().is_err(), "the wake-up itself fails");
        let (cmds, queued) = crossbeam_channel::unbounded();
        let handle = Handle {
            cmds,
            wake: Arc::new(wake),
        };
        handle.send(EngineCmd::Unlisten { port: 7 }).expect("given");
        assert!(matches!(
            queued.try_recv(),
            Ok(EngineCmd::Unlisten { port: 7 })
        ));
        // An engine that stopped (its queue gone) is another matter.
        drop(queued);
        assert!(matches!(
            handle.send(EngineCmd::Unlisten { port: 7 }),
            Err(DatapathError::Disconnected)
        ));
    }
}
