//! The RDMAP error enum, the Terminate Layer / EType / Error Code values of RFC 5040 4.8
//! Figure 9 ([`layer`], [`rdmap_etype`], [`rdmap_code`], also re-exported from
//! [`crate::wire`]) and the single mapping of errors to Terminate codes (RFC 5040 4.8
//! Figure 9, RFC 5041 7.2).

use ddp::DdpError;

use crate::types::{AccessViolation, QpState, Stag};

/// Terminate Layer values (RFC 5040 4.8, Figure 9).
pub mod layer {
    /// RDMAP.
    pub const RDMAP: u8 = 0x0;
    /// DDP.
    pub const DDP: u8 = 0x1;
    /// LLP (MPA).
    pub const LLP: u8 = 0x2;
}

/// RDMAP error types for Layer 0 (RFC 5040 Figure 9).
pub mod rdmap_etype {
    /// Local catastrophic error (no code).
    pub const LOCAL_CATASTROPHIC: u8 = 0x0;
    /// Remote protection error.
    pub const REMOTE_PROTECTION: u8 = 0x1;
    /// Remote operation error.
    pub const REMOTE_OPERATION: u8 = 0x2;
}

/// RDMAP error codes for Layer 0 (RFC 5040 Figure 9).
pub mod rdmap_code {
    /// Invalid STag (protection).
    pub const INVALID_STAG: u8 = 0x00;
    /// Base or bounds violation (protection).
    pub const BASE_BOUNDS: u8 = 0x01;
    /// Access rights violation (protection).
    pub const ACCESS_RIGHTS: u8 = 0x02;
    /// STag not associated with RDMAP stream (protection).
    pub const STAG_NOT_ASSOCIATED: u8 = 0x03;
    /// TO wrap (protection).
    pub const TO_WRAP: u8 = 0x04;
    /// Invalid RDMAP version (operation).
    pub const INVALID_VERSION: u8 = 0x05;
    /// Unexpected OpCode (operation).
    pub const UNEXPECTED_OPCODE: u8 = 0x06;
    /// Catastrophic error, localized to RDMAP stream (operation).
    pub const CATASTROPHIC_STREAM: u8 = 0x07;
    /// Catastrophic error, global (operation).
    pub const CATASTROPHIC_GLOBAL: u8 = 0x08;
    /// STag cannot be invalidated (protection or operation).
    pub const CANNOT_INVALIDATE: u8 = 0x09;
    /// Unspecified error.
    pub const UNSPECIFIED: u8 = 0xFF;
}

/// Every error of the RDMAP layer: wire parsing, inbound protocol errors (each of which
/// becomes a Terminate, see [`RdmapError::terminate_code`]) and local API misuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdmapError {
    // ---- wire ----
    /// A header is shorter than its format requires.
    #[error("RDMAP header truncated: need {needed} octets, have {have}")]
    Truncated {
        /// Octets required.
        needed: usize,
        /// Octets present.
        have: usize,
    },
    /// RV in the RDMAP control byte is not 1 (RFC 5040 7.2 rule 3).
    #[error("invalid RDMAP version {version}")]
    InvalidVersion {
        /// The RV field received.
        version: u8,
    },
    /// A reserved opcode, or an opcode on the wrong buffer model or queue, or a message
    /// that is not expected now (RFC 5040 7.2 rule 2).
    #[error("unexpected RDMAP opcode {opcode:#x}")]
    UnexpectedOpcode {
        /// The opcode received.
        opcode: u8,
    },

    // ---- inbound errors (each produces a Terminate) ----
    /// An error of the DDP layer (RFC 5041 7.1).
    #[error("DDP: {0}")]
    Ddp(#[from] DdpError),
    /// The tagged sink buffer of an RDMA Write or Read Response failed its check.
    #[error("tagged sink STag {stag}: {violation}")]
    SinkAccess {
        /// The STag carried by the segment.
        stag: Stag,
        /// The failed check.
        violation: AccessViolation,
    },
    /// The data source of an inbound RDMA Read Request failed its check (RFC 5040 7.2
    /// rule 4 for Read Requests).
    #[error("Read Request source STag {stag}: {violation}")]
    SourceAccess {
        /// The Data Source STag.
        stag: Stag,
        /// The failed check.
        violation: AccessViolation,
    },
    /// A Send with Invalidate named an STag that cannot be invalidated (RFC 5040 5.3).
    #[error("STag {stag} cannot be invalidated: {reason}")]
    CannotInvalidate {
        /// The Invalidate STag.
        stag: Stag,
        /// Why not.
        reason: AccessViolation,
    },
    /// More inbound Read Requests outstanding than the IRD allows (RFC 5040 6.1).
    #[error("inbound RDMA Read Request beyond IRD {ird}")]
    IrdExceeded {
        /// The negotiated IRD.
        ird: u16,
    },
    /// An inbound RDMA Read Request whose header is not the 28 octets of 4.4.
    #[error("malformed RDMA Read Request ({len} octets)")]
    MalformedReadRequest {
        /// Message length received.
        len: u32,
    },
    /// A local resource failed while processing inbound data.
    #[error("local catastrophic error")]
    LocalCatastrophic,
    /// An Atomic Request whose target is not 64-bit aligned (RFC 7306 5.1.1, 8.2).
    #[error("Atomic Request for tagged offset {to:#x}: not 64-bit aligned")]
    AtomicMisaligned {
        /// The Remote Tagged Offset of the request.
        to: u64,
    },
    /// An Atomic Request whose target failed a check of its region (RFC 7306 5.2, as an
    /// RDMA Read's source, RFC 5040 7.2 rule 4).
    #[error("Atomic Request STag {stag}: {violation}")]
    AtomicAccess {
        /// The Remote STag of the request.
        stag: Stag,
        /// What the check found.
        violation: AccessViolation,
    },
    /// An Atomic Request with an Atomic Operation Code this implementation does not
    /// support (RFC 7306 5.2.1 rule 4).
    #[error("unsupported Atomic Operation Code {aopcode:#x}")]
    UnsupportedAtomic {
        /// The AOpCode received.
        aopcode: u8,
    },
    /// An Atomic Response that answers no outstanding Atomic Request, or another one than
    /// the next (RFC 7306 5.2.2 rule 7).
    #[error("Atomic Response for request {request_id:#x}: not the next outstanding one")]
    UnexpectedAtomicResponse {
        /// The Original Request Identifier received.
        request_id: u32,
    },
    /// The sink of an Atomic Response (our 8 octets for the original value) no longer passes
    /// its checks: deregistered since the request was posted (RFC 7306 8.1 rule 2).
    #[error("Atomic Response sink STag {stag}: {violation}")]
    AtomicResponseSink {
        /// The sink's STag.
        stag: Stag,
        /// What the check found.
        violation: AccessViolation,
    },
    /// An Atomic Request message that is not 52 octets (RFC 7306 5.2.1, Figure 4).
    #[error("malformed Atomic Request ({len} octets)")]
    MalformedAtomicRequest {
        /// The length received.
        len: u32,
    },
    /// An Immediate Data message that does not carry exactly 8 octets (RFC 7306 6.3).
    #[error("Immediate Data message of {len} octets (must be 8)")]
    BadImmediateLength {
        /// The length received.
        len: usize,
    },

    // ---- local API errors (never sent to the peer) ----
    /// The queue pair's state does not allow the operation.
    #[error("operation not allowed in state {state:?}")]
    InvalidState {
        /// The current state.
        state: QpState,
    },
    /// The send queue holds `sq_depth` work requests.
    #[error("send queue full")]
    SendQueueFull,
    /// Only a Send or an RDMA Write (with or without Immediate Data) carries its payload
    /// inline; a Read or an Atomic names a local sink instead.
    #[error("only a Send or an RDMA Write work request carries inline data")]
    NotInlinable,
    /// The receive queue holds `rq_depth` work requests.
    #[error("receive queue full")]
    RecvQueueFull,
    /// A local scatter/gather element failed its check.
    #[error("local STag {stag}: {violation}")]
    LocalAccess {
        /// The local STag.
        stag: Stag,
        /// The failed check.
        violation: AccessViolation,
    },
    /// No region with this STag is registered.
    #[error("unknown STag {stag}")]
    UnknownStag {
        /// The STag.
        stag: Stag,
    },
    /// Every STag index is in use.
    #[error("memory table full")]
    MemoryTableFull,
    /// A work request's scatter/gather list adds up to more than 2^32 - 1 octets.
    #[error("message of {len} octets is longer than 2^32 - 1")]
    MessageTooLong {
        /// The list's total length.
        len: u64,
    },
    /// An RDMA Read's sink spans more than one scatter/gather element: a Read Request names
    /// one Data Sink STag and TO (RFC 5040 4.4).
    #[error("an RDMA Read's sink must be one scatter/gather element")]
    ReadSinkNotContiguous,
    /// The queue pair takes its receive buffers from a shared receive queue: receives are
    /// posted there, and one is attached only before any receive was posted.
    #[error("the queue pair uses a shared receive queue")]
    SrqAttached,
    /// A work request of RFC 7306 on a queue pair whose extensions are off
    /// ([`crate::QpConfig::extensions`]).
    #[error("RDMAP extensions (RFC 7306) are off on this queue pair")]
    ExtensionsOff,
    /// An Atomic work request whose sink is not one element of 8 octets.
    #[error("an Atomic's sink must be one scatter/gather element of 8 octets, not {len}")]
    AtomicSink {
        /// The list's total length.
        len: u64,
    },
    /// An RDMA Read or Atomic work request on a queue pair whose ORD is 0: no Read or Atomic
    /// Request may ever be outstanding (RFC 5040 6.1, RFC 7306 5.2), so it could never be sent.
    #[error("an RDMA Read or Atomic on a queue pair whose ORD is 0")]
    ZeroOrd,
    /// An Immediate Data work request with a scatter/gather list (it carries no data).
    #[error("an Immediate Data work request carries no data ({len} octets given)")]
    ImmediatePayload {
        /// The list's total length.
        len: u64,
    },
}

/// (Layer, EType, Error Code) of a Terminate (RFC 5040 4.8, Figure 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateCode {
    /// [`layer::RDMAP`], [`layer::DDP`] or [`layer::LLP`].
    pub layer: u8,
    /// Error type.
    pub etype: u8,
    /// Error code.
    pub code: u8,
}

impl TerminateCode {
    /// A code triple.
    pub const fn new(layer: u8, etype: u8, code: u8) -> TerminateCode {
        TerminateCode { layer, etype, code }
    }

    /// Whether the Terminate carries the DDP header and segment length of the segment
    /// that caused it (RFC 5040 Figure 10): yes for DDP errors and RDMAP protection and
    /// operation errors, no for LLP errors nor for a local catastrophic error of either layer
    /// (4.8: "The DDP Header is not present if the Terminate Error Type is a Local
    /// Catastrophic Error"; DDP's type 0 is one too, RFC 5041 7.2).
    pub fn includes_ddp_header(&self) -> bool {
        match self.layer {
            layer::DDP | layer::RDMAP => self.etype != rdmap_etype::LOCAL_CATASTROPHIC,
            _ => false,
        }
    }

    /// Whether the Terminate carries the Read Request header, given the error was caused
    /// by a Read Request (Figure 10: RDMAP remote protection errors only).
    pub fn includes_read_request(&self) -> bool {
        self.layer == layer::RDMAP && self.etype == rdmap_etype::REMOTE_PROTECTION
    }
}

/// Why a queue pair terminates: the single place where causes are mapped to the
/// (Layer, EType, Error Code) of RFC 5040 Figure 9 and RFC 5041 7.2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminateCause {
    /// A protocol error detected by this RDMAP/DDP endpoint.
    Error(RdmapError),
    /// An LLP (MPA) error reported by the transport: Layer 2, EType 0 and the MPA error
    /// code of RFC 5044 8 / RFC 6581 (e.g. 0x02 CRC mismatch).
    Llp {
        /// The MPA error code.
        code: u8,
    },
    /// A local catastrophic error (Layer 0, EType 0, no code).
    LocalCatastrophic,
    /// The LLP connection is gone: no Terminate can be sent (RFC 5040 6.2, LLP
    /// Abortive Termination).
    ConnectionLost,
}

impl TerminateCause {
    /// The codes of the Terminate to send, or `None` when no Terminate is sent
    /// (connection lost, or a local API error that concerns no peer).
    pub fn code(&self) -> Option<TerminateCode> {
        use rdmap_code::*;
        use rdmap_etype::*;
        let rdmap = |etype, code| Some(TerminateCode::new(layer::RDMAP, etype, code));
        let ddp_tagged = |code| Some(TerminateCode::new(layer::DDP, 0x1, code));
        let err = match self {
            TerminateCause::Error(err) => err,
            TerminateCause::Llp { code } => return Some(TerminateCode::new(layer::LLP, 0, *code)),
            TerminateCause::LocalCatastrophic => return rdmap(LOCAL_CATASTROPHIC, 0),
            TerminateCause::ConnectionLost => return None,
        };
        match err {
            RdmapError::InvalidVersion { .. } => rdmap(REMOTE_OPERATION, INVALID_VERSION),
            RdmapError::UnexpectedOpcode { .. } => rdmap(REMOTE_OPERATION, UNEXPECTED_OPCODE),
            // RFC 7306 8.2: a misaligned target is a Remote Operation Error, "Catastrophic
            // error, localized to RDMAP Stream".
            RdmapError::AtomicMisaligned { .. } => rdmap(REMOTE_OPERATION, CATASTROPHIC_STREAM),
            // RFC 7306 5.2.1 rule 4 names no code: the AOpCode is an opcode we do not
            // implement.
            // An Atomic Response that answers nothing outstanding: as a Read Response that
            // does, an unexpected opcode.
            RdmapError::UnsupportedAtomic { .. } | RdmapError::UnexpectedAtomicResponse { .. } => {
                rdmap(REMOTE_OPERATION, UNEXPECTED_OPCODE)
            }
            RdmapError::AtomicResponseSink { .. } => rdmap(REMOTE_OPERATION, CATASTROPHIC_STREAM),
            RdmapError::BadImmediateLength { .. } | RdmapError::MalformedAtomicRequest { .. } => {
                rdmap(REMOTE_OPERATION, UNSPECIFIED)
            }

            // A short Terminate/other RDMAP header: the message is malformed.
            RdmapError::Truncated { .. } | RdmapError::MalformedReadRequest { .. } => {
                rdmap(REMOTE_OPERATION, UNSPECIFIED)
            }
            RdmapError::Ddp(e) => Some(TerminateCode::new(layer::DDP, e.etype(), e.code())),
            // The sink of a Write / Read Response: DDP tagged buffer errors (RFC 5041
            // 7.2). Access rights, which DDP has no code for, are an invalid STag (as siw
            // does: `siw_tagged_error`): RFC 5040 Figure 10's RDMAP remote protection
            // codes are for Read Requests and Sends with Invalidate only.
            RdmapError::SinkAccess { violation, .. } => match violation {
                AccessViolation::InvalidStag | AccessViolation::AccessRights => ddp_tagged(0x00),
                AccessViolation::BaseBounds => ddp_tagged(0x01),
                AccessViolation::StagNotAssociated => ddp_tagged(0x02),
                AccessViolation::ToWrap => ddp_tagged(0x03),
            },
            // The source of a Read Request: RDMAP remote protection (7.2 rule 4); the target
            // of an Atomic Request is addressed the same way (RFC 7306 5.2).
            RdmapError::SourceAccess { violation, .. }
            | RdmapError::AtomicAccess { violation, .. } => rdmap(
                REMOTE_PROTECTION,
                match violation {
                    AccessViolation::InvalidStag => INVALID_STAG,
                    AccessViolation::BaseBounds => BASE_BOUNDS,
                    AccessViolation::AccessRights => ACCESS_RIGHTS,
                    AccessViolation::StagNotAssociated => STAG_NOT_ASSOCIATED,
                    AccessViolation::ToWrap => TO_WRAP,
                },
            ),
            // 5.3: "STag cannot be invalidated". An STag of another PD is a protection
            // error, an STag that names no valid region an operation error (as siw).
            RdmapError::CannotInvalidate { reason, .. } => match reason {
                AccessViolation::StagNotAssociated | AccessViolation::AccessRights => {
                    rdmap(REMOTE_PROTECTION, CANNOT_INVALIDATE)
                }
                _ => rdmap(REMOTE_OPERATION, CANNOT_INVALIDATE),
            },
            // Beyond IRD: remote operation, catastrophic for the stream (as siw).
            RdmapError::IrdExceeded { .. } => rdmap(REMOTE_OPERATION, CATASTROPHIC_STREAM),
            RdmapError::LocalCatastrophic => rdmap(LOCAL_CATASTROPHIC, 0),
            RdmapError::InvalidState { .. }
            | RdmapError::SendQueueFull
            | RdmapError::NotInlinable
            | RdmapError::RecvQueueFull
            | RdmapError::LocalAccess { .. }
            | RdmapError::UnknownStag { .. }
            | RdmapError::MemoryTableFull
            | RdmapError::MessageTooLong { .. }
            | RdmapError::ReadSinkNotContiguous
            | RdmapError::ExtensionsOff
            | RdmapError::AtomicSink { .. }
            | RdmapError::ImmediatePayload { .. }
            | RdmapError::ZeroOrd
            | RdmapError::SrqAttached => None,
        }
    }
}

impl RdmapError {
    /// The Terminate this error produces when detected on inbound data; `None` for
    /// local API errors. Delegates to [`TerminateCause::code`], the one mapping.
    pub fn terminate_code(&self) -> Option<TerminateCode> {
        TerminateCause::Error(self.clone()).code()
    }

    /// Terminate Layer, if this error is reported to the peer.
    pub fn layer(&self) -> Option<u8> {
        self.terminate_code().map(|c| c.layer)
    }

    /// Terminate EType, if this error is reported to the peer.
    pub fn etype(&self) -> Option<u8> {
        self.terminate_code().map(|c| c.etype)
    }

    /// Terminate Error Code, if this error is reported to the peer.
    pub fn code(&self) -> Option<u8> {
        self.terminate_code().map(|c| c.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(err: RdmapError) -> Option<(u8, u8, u8)> {
        err.terminate_code().map(|c| (c.layer, c.etype, c.code))
    }

    #[test]
    fn sink_errors_are_ddp_tagged_access_rights_an_invalid_stag() {
        let s = |violation| RdmapError::SinkAccess {
            stag: Stag(0x100),
            violation,
        };
        assert_eq!(code(s(AccessViolation::InvalidStag)), Some((1, 1, 0)));
        assert_eq!(code(s(AccessViolation::BaseBounds)), Some((1, 1, 1)));
        assert_eq!(code(s(AccessViolation::StagNotAssociated)), Some((1, 1, 2)));
        assert_eq!(code(s(AccessViolation::ToWrap)), Some((1, 1, 3)));
        assert_eq!(code(s(AccessViolation::AccessRights)), Some((1, 1, 0)));
    }

    #[test]
    fn source_errors_are_rdmap_protection() {
        let s = |violation| RdmapError::SourceAccess {
            stag: Stag(0x100),
            violation,
        };
        assert_eq!(code(s(AccessViolation::InvalidStag)), Some((0, 1, 0)));
        assert_eq!(code(s(AccessViolation::BaseBounds)), Some((0, 1, 1)));
        assert_eq!(code(s(AccessViolation::AccessRights)), Some((0, 1, 2)));
        assert_eq!(code(s(AccessViolation::StagNotAssociated)), Some((0, 1, 3)));
        assert_eq!(code(s(AccessViolation::ToWrap)), Some((0, 1, 4)));
    }

    #[test]
    fn operation_and_other_codes() {
        assert_eq!(
            code(RdmapError::InvalidVersion { version: 0 }),
            Some((0, 2, 5))
        );
        assert_eq!(
            code(RdmapError::UnexpectedOpcode { opcode: 9 }),
            Some((0, 2, 6))
        );
        assert_eq!(code(RdmapError::IrdExceeded { ird: 1 }), Some((0, 2, 7)));
        assert_eq!(
            code(RdmapError::Ddp(DdpError::MsnRange { msn: 5 })),
            Some((1, 2, 3))
        );
        assert_eq!(
            code(RdmapError::CannotInvalidate {
                stag: Stag(0x100),
                reason: AccessViolation::StagNotAssociated
            }),
            Some((0, 1, 9))
        );
        assert_eq!(
            code(RdmapError::CannotInvalidate {
                stag: Stag(0x100),
                reason: AccessViolation::InvalidStag
            }),
            Some((0, 2, 9))
        );
        assert_eq!(code(RdmapError::SendQueueFull), None);
        assert_eq!(
            TerminateCause::Llp { code: 2 }.code(),
            Some(TerminateCode::new(2, 0, 2))
        );
        assert_eq!(TerminateCause::ConnectionLost.code(), None);
        assert_eq!(
            TerminateCause::LocalCatastrophic.code(),
            Some(TerminateCode::new(0, 0, 0))
        );
    }

    #[test]
    fn figure_10_header_inclusion() {
        assert!(TerminateCode::new(1, 2, 2).includes_ddp_header());
        assert!(TerminateCode::new(0, 2, 6).includes_ddp_header());
        assert!(TerminateCode::new(0, 1, 0).includes_read_request());
        assert!(!TerminateCode::new(0, 2, 6).includes_read_request());
        assert!(!TerminateCode::new(0, 0, 0).includes_ddp_header());
        assert!(!TerminateCode::new(1, 0, 0).includes_ddp_header());
        assert!(!TerminateCode::new(2, 0, 2).includes_ddp_header());
    }
}
