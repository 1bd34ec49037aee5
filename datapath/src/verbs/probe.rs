//! Discovery of the RDMAP extensions of RFC 7306. The RFC leaves discovery to the application
//! protocol (1.1: a ULP that knows its peer supports them enables them); where nothing says,
//! [`probe_rdmap_extensions`] finds out by trying, on a connection made for it.

use std::time::{Duration, Instant};

use rdmap::wire::{layer, rdmap_code, rdmap_etype};

use crate::error::DatapathError;
use crate::memory::ProtectionDomain;
use crate::verbs::cq::CompletionQueue;
use crate::verbs::qp::QueuePair;
use crate::{Access, AtomicOp, SendOp, SendWr, Stag, WcStatus};

/// What [`probe_rdmap_extensions`] found out about the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtensionSupport {
    /// The peer took the Atomic Request: it answered it, or refused its target with a
    /// protection error (it parsed the request to check the target).
    Supported,
    /// The peer terminated with "Unexpected OpCode" (RFC 5040 4.8, remote operation error):
    /// to it, opcode 1010b is reserved.
    Unsupported,
    /// The peer ended the connection some other way (the Terminate it sent, if any).
    Unknown(Option<rdmap::TerminateInfo>),
}

/// The work request id of the probe's FetchAdd.
const PROBE_WR_ID: u64 = u64::MAX - 0x7306;

/// Sends one FetchAdd with Add Data 0 (which changes nothing) on `qp`, whose connection must
/// have the extensions on ([`crate::ConnectParams::rdmap_extensions`]) and must carry nothing
/// else: a peer without them terminates it. `target` is a word of the peer's that it lets us
/// reach (STag and 8-aligned TO); any value will do when only the answer matters (a peer that
/// supports the extensions refuses a bad target with a protection error, which says as much).
/// Completions of `cq` other than the probe's are dropped. Waits at most `timeout`; after a
/// timeout the connection is unusable (the probe's 8-octet sink is gone, so a late answer ends
/// it): close it.
///
/// Errors: [`DatapathError::Timeout`] when the peer neither answers nor ends the connection
/// in time; the errors of registering the 8-octet sink in `pd` and of posting.
pub fn probe_rdmap_extensions(
    qp: &QueuePair,
    cq: &CompletionQueue,
    pd: &ProtectionDomain,
    target: (Stag, u64),
    timeout: Duration,
) -> Result<ExtensionSupport, DatapathError> {
    let sink = pd.register(8, Access::LOCAL_WRITE)?;
    qp.post_send(SendWr {
        wr_id: PROBE_WR_ID,
        op: SendOp::Atomic {
            remote_stag: target.0,
            remote_to: target.1,
            op: AtomicOp::fetch_add(0),
        },
        sg_list: sink.sge(0, 8).into(),
        signaled: true,
        fence: false,
    })?;
    let deadline = super::timeout::deadline_after(timeout);
    let status = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let c = cq
            .wait(left)
            .ok_or(DatapathError::Timeout("no answer to the RFC 7306 probe"))?;
        if c.wc.wr_id == PROBE_WR_ID {
            break c.wc.status;
        }
    };
    if status == WcStatus::Success {
        return Ok(ExtensionSupport::Supported);
    }
    // The Terminate arrives with (or just before) the completion it caused.
    let terminate = loop {
        let st = qp.status();
        if st.remote_terminate.is_some() || st.finished || Instant::now() >= deadline {
            break st.remote_terminate;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    Ok(match terminate {
        Some(t) if t.layer == layer::RDMAP && t.etype == rdmap_etype::REMOTE_PROTECTION => {
            ExtensionSupport::Supported
        }
        Some(t)
            if t.layer == layer::RDMAP
                && t.etype == rdmap_etype::REMOTE_OPERATION
                && t.code == rdmap_code::UNEXPECTED_OPCODE =>
        {
            ExtensionSupport::Unsupported
        }
        other => ExtensionSupport::Unknown(other),
    })
}
