//! Queue pairs as perftest drives them: the out-of-band "communication" queue pair (one Send
//! per message, strictly alternating, client first) and a data queue pair whose completions
//! are waited for with a deadline.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use datapath::{
    Access, Completion, CompletionChannel, CompletionQueue, MemoryRegion, ProtectionDomain,
    QueuePair, RecvWr, SendOp, SendRequest, SendWr, WcOpcode, WcStatus,
};

use super::error::PerftestError;
use super::wire::{Dest, DEST_LEN};

/// Octets of each of the two slots of the communication buffer (receive, send); perftest's
/// largest message is a `pingpong_dest` (56 octets).
const SLOT: usize = 64;
const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;

/// A short description of a queue pair's state, for error messages.
pub fn qp_state(qp: &QueuePair) -> String {
    let st = qp.status();
    let mut s = format!("queue pair {:?}", st.state);
    if let Some(t) = st.remote_terminate {
        s += &format!("; peer sent Terminate {t:?}");
    }
    if let Some(t) = st.sent_terminate {
        s += &format!("; we sent Terminate {t:?}");
    }
    if let Some(e) = st.error {
        s += &format!("; {e}");
    }
    if st.finished {
        s += "; connection closed";
    }
    s
}

/// A queue pair with its own completion queue, waited on with a per-step deadline.
pub struct Qp {
    pub qp: QueuePair,
    cq: CompletionQueue,
    pub step_timeout: Duration,
    /// Completions taken off the queue while waiting for something else.
    stash: VecDeque<Completion>,
    /// `-e`: waits go through this completion channel (the queue armed first).
    channel: Option<CompletionChannel>,
}

impl Qp {
    pub fn new(qp: QueuePair, cq: CompletionQueue, step_timeout: Duration) -> Self {
        Self {
            qp,
            cq,
            step_timeout,
            stash: VecDeque::new(),
            channel: None,
        }
    }

    /// Waits through `channel` (`-e`: `ibv_req_notify_cq` + `ibv_get_cq_event`).
    pub fn with_channel(mut self, channel: Option<CompletionChannel>) -> Self {
        self.channel = channel;
        self
    }

    /// A completion within `d`: the queue's blocking wait, or with a channel: look, arm,
    /// look again (one may have come before the arming and fire no event), wait for the event.
    fn wait_cq(&self, d: Duration) -> Option<Completion> {
        let Some(ch) = &self.channel else {
            return self.cq.wait(d);
        };
        if let Some(c) = self.cq.try_next() {
            return Some(c);
        }
        if self.cq.req_notify(false).is_err() {
            return self.cq.wait(d);
        }
        if let Some(c) = self.cq.try_next() {
            return Some(c);
        }
        ch.wait_event(d);
        self.cq.try_next()
    }

    fn fail(&self, step: &str, c: &Completion) -> PerftestError {
        PerftestError::Completion {
            step: step.to_string(),
            opcode: c.wc.opcode,
            status: c.wc.status,
            wr_id: c.wc.wr_id,
            state: qp_state(&self.qp),
        }
    }

    /// The next successful completion, waiting at most the step timeout.
    pub fn next(&mut self, step: &str) -> Result<Completion, PerftestError> {
        if let Some(c) = self.stash.pop_front() {
            return Ok(c);
        }
        let deadline = Instant::now() + self.step_timeout;
        loop {
            if let Some(c) = self.wait_cq(Duration::from_millis(20)) {
                return if c.wc.status == WcStatus::Success {
                    Ok(c)
                } else {
                    Err(self.fail(step, &c))
                };
            }
            if self.qp.status().finished && self.cq.is_empty() {
                return Err(PerftestError::Closed {
                    step: step.to_string(),
                    state: qp_state(&self.qp),
                });
            }
            if Instant::now() > deadline {
                return Err(PerftestError::Timeout {
                    step: step.to_string(),
                    after: self.step_timeout,
                    state: qp_state(&self.qp),
                });
            }
        }
    }

    /// A successful completion if one arrives within `d` (an error completion fails).
    pub fn wait_for(
        &mut self,
        step: &str,
        d: Duration,
    ) -> Result<Option<Completion>, PerftestError> {
        if let Some(c) = self.stash.pop_front() {
            return Ok(Some(c));
        }
        match self.wait_cq(d) {
            None => Ok(None),
            Some(c) if c.wc.status == WcStatus::Success => Ok(Some(c)),
            Some(c) => Err(self.fail(step, &c)),
        }
    }

    /// Waits for the completion with exactly `wr_id`, keeping others for later.
    pub fn wait_id(&mut self, step: &str, wr_id: u64) -> Result<Completion, PerftestError> {
        let mut kept = VecDeque::new();
        let res = loop {
            match self.next(step) {
                Ok(c) if c.wc.wr_id == wr_id => break Ok(c),
                Ok(c) => kept.push_back(c),
                Err(e) => break Err(e),
            }
        };
        kept.extend(self.stash.drain(..));
        self.stash = kept;
        res
    }

    /// Fails unless the connection is still up (for spin loops that poll memory).
    pub fn check_alive(&self, step: &str) -> Result<(), PerftestError> {
        let st = self.qp.status();
        if st.finished || st.remote_terminate.is_some() || st.error.is_some() {
            return Err(PerftestError::Closed {
                step: step.to_string(),
                state: qp_state(&self.qp),
            });
        }
        Ok(())
    }

    /// Posts a work request; a refused post names the step.
    pub fn post(&self, step: &str, wr: SendWr) -> Result<(), PerftestError> {
        self.qp
            .post_send(wr)
            .map_err(|e| PerftestError::datapath(step, e))
    }

    /// Posts a Send or Write whose elements lie in `src`: inline when `-I` covers it
    /// (`inline_size`, 0 for none), as it is otherwise.
    pub fn post_from(
        &self,
        step: &str,
        wr: SendWr,
        src: &MemoryRegion,
        inline_size: u64,
    ) -> Result<(), PerftestError> {
        match crate::inline::request(wr, src, inline_size) {
            SendRequest::Inline(inline) => self
                .qp
                .post_send_inline(inline)
                .map_err(|e| PerftestError::datapath(step, e)),
            SendRequest::Wr(wr) => self.post(step, wr),
        }
    }

    /// Posts a receive.
    pub fn post_recv(&self, step: &str, wr: RecvWr) -> Result<(), PerftestError> {
        self.qp
            .post_recv(wr)
            .map_err(|e| PerftestError::datapath(step, e))
    }
}

/// The communication queue pair (perftest's `user_comm` with `-R`).
pub struct Comm {
    q: Qp,
    mr: MemoryRegion,
    server: bool,
    /// Messages exchanged so far (for error messages).
    pub messages: u64,
}

impl Comm {
    /// Registers the two-slot buffer.
    pub fn region(pd: &ProtectionDomain) -> Result<MemoryRegion, PerftestError> {
        let mr = pd
            .register(2 * SLOT, Access::LOCAL_WRITE)
            .map_err(|e| PerftestError::datapath("registering the communication buffer", e))?;
        crate::net::note_unpinned(&mr);
        Ok(mr)
    }

    /// The receive that must be posted before the peer's first message can arrive.
    pub fn recv_wr(mr: &MemoryRegion) -> RecvWr {
        RecvWr {
            wr_id: WR_RECV,
            sg_list: mr.sge(0, SLOT as u32).into(),
        }
    }

    pub fn new(q: Qp, mr: MemoryRegion, server: bool) -> Self {
        Self {
            q,
            mr,
            server,
            messages: 0,
        }
    }

    /// How long each later step may take.
    pub fn set_step_timeout(&mut self, d: Duration) {
        self.q.step_timeout = d;
    }

    pub fn qp_mut(&mut self) -> &mut QueuePair {
        &mut self.q.qp
    }

    /// Sends one message and waits for its completion.
    pub fn send(&mut self, step: &str, data: &[u8]) -> Result<(), PerftestError> {
        if data.len() > SLOT {
            return Err(PerftestError::Protocol {
                step: step.to_string(),
                detail: format!("message of {} octets exceeds {SLOT}", data.len()),
            });
        }
        self.mr.write(SLOT, data);
        self.q.post(
            step,
            SendWr {
                wr_id: WR_SEND,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sg_list: self.mr.sge(SLOT, data.len() as u32).into(),
                signaled: true,
                fence: false,
            },
        )?;
        self.q.wait_id(step, WR_SEND)?;
        self.messages += 1;
        Ok(())
    }

    /// Waits for one message of exactly `want` octets, then reposts the receive.
    pub fn recv(&mut self, step: &str, want: usize) -> Result<Vec<u8>, PerftestError> {
        let c = self.q.wait_id(step, WR_RECV)?;
        if c.wc.opcode != WcOpcode::Recv || c.wc.byte_len as usize != want {
            return Err(PerftestError::Protocol {
                step: step.to_string(),
                detail: format!(
                    "peer's message {} has {} octets, this step of perftest 6.06's exchange \
                     has {want} (is the peer another perftest version or test?)",
                    self.messages + 1,
                    c.wc.byte_len
                ),
            });
        }
        let mut b = vec![0u8; want];
        self.mr.read(0, &mut b);
        // The next receive; after the last message the peer may already have closed, which
        // the next step (if any) reports.
        let _ = self.q.qp.post_recv(Self::recv_wr(&self.mr));
        self.messages += 1;
        Ok(b)
    }

    /// One `ctx_xchg_data` exchange: the client sends first, the server answers.
    pub fn exchange(
        &mut self,
        step: &str,
        mine: &[u8],
        want: usize,
    ) -> Result<Vec<u8>, PerftestError> {
        if self.server {
            let theirs = self.recv(step, want)?;
            self.send(step, mine)?;
            Ok(theirs)
        } else {
            self.send(step, mine)?;
            self.recv(step, want)
        }
    }

    /// One `ctx_hand_shake`: both sides' `pingpong_dest`.
    pub fn handshake(&mut self, step: &str, mine: &Dest) -> Result<Dest, PerftestError> {
        let b = self.exchange(step, &mine.encode(), DEST_LEN)?;
        decode_dest(step, &b)
    }

    /// The server's half of a handshake, first half: the client's `pingpong_dest` (the server
    /// may act before it answers with [`send_dest`](Self::send_dest)).
    pub fn recv_dest(&mut self, step: &str) -> Result<Dest, PerftestError> {
        let b = self.recv(step, DEST_LEN)?;
        decode_dest(step, &b)
    }

    /// The server's half of a handshake, second half.
    pub fn send_dest(&mut self, step: &str, mine: &Dest) -> Result<(), PerftestError> {
        self.send(step, &mine.encode())
    }
}

fn decode_dest(step: &str, b: &[u8]) -> Result<Dest, PerftestError> {
    Dest::decode(b).ok_or_else(|| PerftestError::Protocol {
        step: step.to_string(),
        detail: format!("pingpong_dest of {} octets", b.len()),
    })
}
