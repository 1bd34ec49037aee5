//! The sans-IO queue pair (RFC 5040 5, 6, 7).

/// Queue pair states (RFC 5040 6; the verbs states of an iWARP QP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, not yet connected (MPA negotiation not finished).
    Idle,
    /// Ready to send and receive.
    Rts,
    /// Graceful close in progress; nothing more is sent or accepted.
    Closing,
    /// A Terminate is queued and not yet handed to the transport.
    Terminate,
    /// Terminal: the stream is dead, all work requests are flushed.
    Error,
}
