//! What can end a perftest-compatible run.

use std::time::Duration;

use datapath::{DatapathError, WcOpcode, WcStatus};

/// Errors of a perftest-compatible run, each naming the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum PerftestError {
    /// Command line, address, engine or listener trouble before any peer was involved.
    #[error("{0}")]
    Setup(String),
    /// The datapath refused an operation or a connection failed.
    #[error("{step}: {source}")]
    Datapath {
        step: String,
        #[source]
        source: Box<DatapathError>,
    },
    /// Nothing happened within the step's deadline.
    #[error("{step}: nothing within {after:?} ({state})")]
    Timeout {
        step: String,
        after: Duration,
        state: String,
    },
    /// The connection went away.
    #[error("{step}: connection ended ({state})")]
    Closed { step: String, state: String },
    /// A work request failed.
    #[error("{step}: {opcode:?} work request {wr_id:#x} completed with {status:?} ({state})")]
    Completion {
        step: String,
        opcode: WcOpcode,
        status: WcStatus,
        wr_id: u64,
        state: String,
    },
    /// The peer did not follow perftest 6.06's exchange.
    #[error("{step}: {detail}")]
    Protocol { step: String, detail: String },
    /// Data arrived or was read back wrong.
    #[error("{step}: data mismatch: {detail}")]
    Mismatch { step: String, detail: String },
}

impl PerftestError {
    pub(super) fn datapath(step: &str, source: DatapathError) -> Self {
        Self::Datapath {
            step: step.to_string(),
            source: Box::new(source),
        }
    }
    pub(super) fn protocol(step: &str, detail: String) -> Self {
        Self::Protocol {
            step: step.to_string(),
            detail,
        }
    }
    pub(super) fn mismatch(step: &str, detail: String) -> Self {
        Self::Mismatch {
            step: step.to_string(),
            detail,
        }
    }
}
