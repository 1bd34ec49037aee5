//! What can go wrong in IFT's startup and framing.

/// The first four octets of an MPA Request or Reply ("MPA "): what an IFT endpoint reads where
/// it expects an adaption indication when the peer speaks MPA.
pub(crate) const MPA_KEY_START: u32 = 0x4D50_4120;

/// An IFT error. Each one ends the connection (the draft names no error codes; the layer
/// above reports the cause).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IftError {
    /// The adaption indication does not start with the magic number (section 4.1).
    #[error(
        "adaption indication magic {found:#010x}, not 0x52444450 (\"RDDP\"){}",
        if *found == MPA_KEY_START { ": the peer speaks MPA, not IFT" } else { "" }
    )]
    BadMagic {
        /// What was there.
        found: u32,
    },
    /// The adaption indication's CRC does not match (section 4.2: it is always present).
    #[error("adaption indication CRC {found:#010x}, computed {computed:#010x}")]
    IndicationCrc {
        /// The CRC field.
        found: u32,
        /// The CRC of the 60 octets before it.
        computed: u32,
    },
    /// The peer's BC version is above ours: incompatible (section 4.2).
    #[error("adaption indication version {version}, BC version {bc_version}: we implement 1")]
    IncompatibleVersion {
        /// The peer's version.
        version: u16,
        /// The peer's backward-compatible version.
        bc_version: u16,
    },
    /// The indication is of the other phase (PH, section 4.2): phase 0 comes from the
    /// initiator, phase 1 from the responder.
    #[error("adaption indication of phase {found}, expected phase {expected}")]
    WrongPhase {
        /// The phase expected.
        expected: u8,
        /// The phase received.
        found: u8,
    },
    /// The two ends disagree on RDMA mode (R, section 4.2: "MUST be closed in error").
    #[error("RDMA mode: ours {ours}, the peer's {theirs}; both ends must agree (R bit)")]
    ModeMismatch {
        /// Our R.
        ours: bool,
        /// The peer's R.
        theirs: bool,
    },
    /// The peer's CRC choice is one our policy does not accept (HC, PC, IH, IP, section 4.2).
    #[error("the peer's CRC choice is unacceptable: {0}")]
    Unacceptable(&'static str),
    /// The peer closed the connection before the exchange was complete: an MPA responder
    /// does on an IFT indication (RFC 5044 7.1.2), as does an IFT listener that refuses our
    /// indication, rejects the connection or is over its backlog.
    #[error(
        "the peer closed the connection during the IFT adaption exchange (an MPA peer does, \
         and an IFT listener that turns the connection down)"
    )]
    ConnectionLost,
    /// The exchange did not finish by its deadline.
    #[error("IFT startup timed out")]
    StartupTimeout,
    /// The application neither accepted nor rejected the connection within its accept
    /// timeout (`MpaConfig::accept_timeout`, which IFT listeners use too): it was closed.
    #[error("the connection request was left unanswered past the accept timeout")]
    AcceptTimeout,
    /// A local mistake (a call out of turn, a value out of range).
    #[error("{0}")]
    Local(&'static str),
    /// The initiator sent more beyond its adaption indication, before our phase 1, than a
    /// responder holds: it cannot have framed it for our VTag, which it does not know yet
    /// (section 4.2).
    #[error("the peer sent data beyond its adaption indication before the exchange ended")]
    DataBeforeExchange,
    /// A frame's header_size is not the length of the DDP header it precedes.
    #[error("IFT frame header_size {found}: its DDP header is {expected} octets")]
    BadHeaderSize {
        /// The header_size field.
        found: u16,
        /// The DDP header's length (14 tagged, 18 untagged).
        expected: usize,
    },
    /// A frame carries a VTag other than ours (section 4.2: the receiver's VTag).
    #[error("IFT frame VTag {found:#06x}, ours is {expected:#06x}")]
    BadVtag {
        /// The frame's VTag.
        found: u16,
        /// The VTag we sent in our adaption indication.
        expected: u16,
    },
    /// The header CRC does not match: nothing of the frame may be trusted or placed.
    #[error("IFT header CRC {found:#010x}, computed {computed:#010x}")]
    HeaderCrc {
        /// The CRC field.
        found: u32,
        /// The CRC of the IFT and DDP headers.
        computed: u32,
    },
    /// The payload CRC does not match.
    #[error("IFT payload CRC {found:#010x}, computed {computed:#010x}")]
    PayloadCrc {
        /// The CRC field.
        found: u32,
        /// The CRC of the payload.
        computed: u32,
    },
    /// A frame placed speculatively (section 8) is not where the frames before it, read in
    /// order, end: the guess was wrong, and its octets are no longer there to place again.
    #[error(
        "a frame placed speculatively at TCP stream offset {offset} is not where the frames \
         before it end"
    )]
    SpeculationMismatch {
        /// Its offset in the TCP stream.
        offset: u64,
    },
}

impl IftError {
    /// The code of the Terminate (layer LLP, RFC 5040 7.2) that reports this error to the
    /// peer. The draft defines none; these follow MPA's (RFC 5044 8) for the nearest fault: 1
    /// the exchange ended (timeout, connection lost), 2 a CRC error, 3 a frame whose lengths or VTag are wrong,
    /// 4 an adaption indication not acceptable, 5 a local error.
    pub fn code(&self) -> u8 {
        match self {
            IftError::StartupTimeout | IftError::AcceptTimeout | IftError::ConnectionLost => 1,
            IftError::HeaderCrc { .. } | IftError::PayloadCrc { .. } => 2,
            IftError::BadHeaderSize { .. }
            | IftError::BadVtag { .. }
            | IftError::DataBeforeExchange
            | IftError::SpeculationMismatch { .. } => 3,
            IftError::BadMagic { .. }
            | IftError::IndicationCrc { .. }
            | IftError::IncompatibleVersion { .. }
            | IftError::WrongPhase { .. }
            | IftError::ModeMismatch { .. }
            | IftError::Unacceptable(_) => 4,
            IftError::Local(_) => 5,
        }
    }
}
