//! IFT frames (draft section 5.1): header_size, payload_size, the receiver's VTag, the DDP
//! header, the header CRC if negotiated, the DDP payload, the payload CRC if negotiated; no
//! padding, so CRCs fall at any alignment (the draft's second figure).
//!
//! The header CRC covers the six octets of the IFT header (both sizes and the VTag: the draft
//! names "header_size and payload_size" and the VTag lies between them and the DDP header) and
//! the DDP header; the payload CRC covers the payload. Both are CRC32c as MPA's.

use crate::error::IftError;
use crate::wire::{
    crc_from_wire, crc_to_wire, frame_len, FrameHeader, FrameHeaderRepr, CRC_LEN, FRAME_HEADER_LEN,
};
use ddp::wire::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};

/// The longest frame: an untagged DDP header, both CRCs and a payload of 65535 octets (the
/// 16-bit payload_size).
pub const MAX_FRAME_LEN: usize =
    FRAME_HEADER_LEN + UNTAGGED_HEADER_LEN + CRC_LEN + u16::MAX as usize + CRC_LEN;

/// How one direction's frames are built: from the adaption indications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameFormat {
    /// Frames carry a header CRC (the sender's HC).
    pub header_crc: bool,
    /// Frames carry a payload CRC (the sender's PC).
    pub payload_crc: bool,
    /// The receiver's VTag, in every frame.
    pub vtag: u16,
    /// Receiving: the CRCs present are checked (the receiver did not say IH/IP). Sending:
    /// unused.
    pub verify: bool,
}

/// The least [`FrameFormat::mulpdu`] answers, as MPA's (`mpa::MIN_MULPDU`): a segment too
/// small for it carries a frame in more than one.
pub const MIN_MULPDU: usize = 128;

impl FrameFormat {
    /// The largest ULPDU (DDP header and payload) one frame of this format carries in a TCP
    /// segment of `emss` octets: the IFT header and the CRCs the format has come off (no
    /// padding, no Markers: section 5.1); never below [`MIN_MULPDU`].
    pub fn mulpdu(&self, emss: usize) -> usize {
        let crcs = usize::from(self.header_crc) + usize::from(self.payload_crc);
        emss.saturating_sub(FRAME_HEADER_LEN + crcs * CRC_LEN)
            .max(MIN_MULPDU)
    }
}

/// Builds frames.
#[derive(Debug, Clone, Copy)]
pub struct FrameEncoder {
    fmt: FrameFormat,
}

impl FrameEncoder {
    /// Frames of `fmt`.
    pub fn new(fmt: FrameFormat) -> FrameEncoder {
        FrameEncoder { fmt }
    }

    /// Octets of the frame of a ULPDU of `ulpdu_len` octets whose DDP header is
    /// `header_len` octets.
    pub fn frame_len(&self, header_len: usize, ulpdu_len: usize) -> usize {
        frame_len(
            header_len,
            ulpdu_len.saturating_sub(header_len),
            self.fmt.header_crc,
            self.fmt.payload_crc,
        )
    }

    /// Appends the frame of one DDP segment to `out`: `ulpdu` is the DDP header followed by
    /// the payload, as DDP/RDMAP build it. Returns the frame's length.
    pub fn encode(&self, ulpdu: &[u8], out: &mut Vec<u8>) -> Result<usize, IftError> {
        let Some(&first) = ulpdu.first() else {
            return Err(IftError::Local("an empty ULPDU has no DDP header"));
        };
        let h = ddp::wire::header_len_of(first);
        if ulpdu.len() < h {
            return Err(IftError::Local("the ULPDU is shorter than its DDP header"));
        }
        let (header, payload) = ulpdu.split_at(h);
        let payload_size = u16::try_from(payload.len())
            .map_err(|_| IftError::Local("a DDP payload of more than 65535 octets"))?;
        let start = out.len();
        let mut ift = [0u8; FRAME_HEADER_LEN];
        FrameHeaderRepr {
            header_size: h as u16,
            payload_size,
            vtag: self.fmt.vtag,
        }
        .emit(&mut ift);
        out.extend_from_slice(&ift);
        out.extend_from_slice(header);
        if self.fmt.header_crc {
            let crc = mpa::crc::crc32c(&out[start..]);
            out.extend_from_slice(&crc_to_wire(crc));
        }
        out.extend_from_slice(payload);
        if self.fmt.payload_crc {
            out.extend_from_slice(&crc_to_wire(mpa::crc::crc32c(payload)));
        }
        Ok(out.len() - start)
    }
}

/// One received frame's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The DDP header.
    pub ddp_header: &'a [u8],
    /// The DDP payload (RDMAP headers included).
    pub payload: &'a [u8],
}

/// Checks what can be checked of a frame's first octets (the IFT header and the DDP header's
/// first octet): the VTag and header_size. Returns the frame's whole length.
fn check_start(fmt: &FrameFormat, b: &[u8]) -> Result<usize, IftError> {
    let Some(view) = FrameHeader::new_checked(b) else {
        return Err(IftError::Local("a frame header is six octets"));
    };
    let h = FrameHeaderRepr::parse(&view);
    if h.vtag != fmt.vtag {
        return Err(IftError::BadVtag {
            found: h.vtag,
            expected: fmt.vtag,
        });
    }
    let expected = match b.get(FRAME_HEADER_LEN) {
        Some(&first) => ddp::wire::header_len_of(first),
        // Not known yet: at least a plausible length.
        None if h.header_size as usize == TAGGED_HEADER_LEN => TAGGED_HEADER_LEN,
        None => UNTAGGED_HEADER_LEN,
    };
    if h.header_size as usize != expected {
        return Err(IftError::BadHeaderSize {
            found: h.header_size,
            expected,
        });
    }
    Ok(frame_len(
        expected,
        usize::from(h.payload_size),
        fmt.header_crc,
        fmt.payload_crc,
    ))
}

/// With header CRCs checked: the header CRC of the frame that `b` begins, once `b` holds it
/// (nothing to say before). So that a frame whose header is damaged (its payload_size among
/// it) fails as soon as its header has come, not only once as many octets as that size says
/// have (up to 64 KiB of the frames behind it, or never, if the stream then goes quiet).
fn check_header_crc_early(fmt: &FrameFormat, b: &[u8]) -> Result<(), IftError> {
    if !(fmt.header_crc && fmt.verify) {
        return Ok(());
    }
    let Some(&first) = b.get(FRAME_HEADER_LEN) else {
        return Ok(());
    };
    let header_end = FRAME_HEADER_LEN + ddp::wire::header_len_of(first);
    let Some(crc) = b.get(header_end..header_end + CRC_LEN) else {
        return Ok(());
    };
    let (found, computed) = (crc_from_wire(crc), mpa::crc::crc32c(&b[..header_end]));
    if found != computed {
        return Err(IftError::HeaderCrc { found, computed });
    }
    Ok(())
}

/// Checks a whole frame (`b` is exactly one) and returns its parts.
fn check_frame<'a>(fmt: &FrameFormat, b: &'a [u8]) -> Result<Frame<'a>, IftError> {
    let len = check_start(fmt, b)?;
    debug_assert_eq!(len, b.len());
    let h = ddp::wire::header_len_of(b[FRAME_HEADER_LEN]);
    let header_end = FRAME_HEADER_LEN + h;
    let mut at = header_end;
    if fmt.header_crc {
        let found = crc_from_wire(&b[at..at + CRC_LEN]);
        if fmt.verify {
            let computed = mpa::crc::crc32c(&b[..header_end]);
            if found != computed {
                return Err(IftError::HeaderCrc { found, computed });
            }
        }
        at += CRC_LEN;
    }
    let payload_end = b.len() - if fmt.payload_crc { CRC_LEN } else { 0 };
    let payload = &b[at..payload_end];
    if fmt.payload_crc && fmt.verify {
        let found = crc_from_wire(&b[payload_end..]);
        let computed = mpa::crc::crc32c(payload);
        if found != computed {
            return Err(IftError::PayloadCrc { found, computed });
        }
    }
    Ok(Frame {
        ddp_header: &b[FRAME_HEADER_LEN..header_end],
        payload,
    })
}

/// The frame at the start of `bytes`, if one lies there whole and passes every check `fmt`
/// asks for (VTag, header_size, then the header CRC, then the payload CRC): its length and
/// parts. `None` otherwise. For a receiver that guesses where a frame starts in a segment that
/// arrived out of order (section 8, speculative placement): a guess that fails any check is no
/// frame, and no error is reported for it.
pub fn whole_frame_at<'a>(fmt: &FrameFormat, bytes: &'a [u8]) -> Option<(usize, Frame<'a>)> {
    if bytes.len() <= FRAME_HEADER_LEN {
        return None;
    }
    let len = check_start(fmt, bytes).ok()?;
    let frame = check_frame(fmt, bytes.get(..len)?).ok()?;
    Some((len, frame))
}

/// Reads frames from a byte stream taken in any pieces. A frame that fails a check ends the
/// stream: the decoder then refuses everything with the same error (the connection ends).
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    fmt: FrameFormat,
    /// A frame's octets received so far, when it did not arrive in one piece (at most
    /// [`MAX_FRAME_LEN`]).
    partial: Vec<u8>,
    /// The frame's length once its header is known.
    need: Option<usize>,
    failed: Option<IftError>,
}

impl FrameDecoder {
    /// Reads frames of `fmt`.
    pub fn new(fmt: FrameFormat) -> FrameDecoder {
        FrameDecoder {
            fmt,
            partial: Vec::new(),
            need: None,
            failed: None,
        }
    }

    /// Octets held of a frame not yet complete.
    pub fn buffered(&self) -> usize {
        self.partial.len()
    }

    /// Octets its buffer for a frame that did not arrive in one piece has allocated (grown to
    /// hold frames of up to [`MAX_FRAME_LEN`]; kept for the next such frame).
    pub fn buffer_capacity(&self) -> usize {
        self.partial.capacity()
    }

    fn fail(&mut self, e: IftError) -> IftError {
        self.failed = Some(e.clone());
        self.partial.clear();
        e
    }

    /// Takes the next piece of the stream and calls `on_frame` for each frame it completes,
    /// in stream order. Frames that lie whole in `bytes` are handed out in place; the rest
    /// of a frame is kept until its remaining octets come.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        mut on_frame: impl FnMut(Frame<'_>),
    ) -> Result<(), IftError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        // First complete a frame begun in an earlier piece.
        if !self.partial.is_empty() {
            let taken = self.continue_partial(bytes)?;
            bytes = &bytes[taken..];
            let Some(need) = self.need.filter(|&n| self.partial.len() == n) else {
                return Ok(());
            };
            let checked = check_frame(&self.fmt, &self.partial[..need]).map(&mut on_frame);
            self.partial.clear();
            self.need = None;
            if let Err(e) = checked {
                return Err(self.fail(e));
            }
        }
        // Then whole frames in place.
        while bytes.len() > FRAME_HEADER_LEN {
            let len = match check_start(&self.fmt, bytes) {
                Ok(len) => len,
                Err(e) => return Err(self.fail(e)),
            };
            if bytes.len() < len {
                if let Err(e) = check_header_crc_early(&self.fmt, bytes) {
                    return Err(self.fail(e));
                }
                break;
            }
            match check_frame(&self.fmt, &bytes[..len]) {
                Ok(f) => on_frame(f),
                Err(e) => return Err(self.fail(e)),
            }
            bytes = &bytes[len..];
        }
        // The beginning of the next frame.
        if !bytes.is_empty() {
            self.continue_partial(bytes)?;
        }
        Ok(())
    }

    /// Adds octets of `bytes` to the partial frame, up to its end; returns how many.
    fn continue_partial(&mut self, bytes: &[u8]) -> Result<usize, IftError> {
        let mut used = 0;
        if self.need.is_none() {
            // Up to the DDP header's first octet, which fixes the header's length.
            let want = (FRAME_HEADER_LEN + 1).saturating_sub(self.partial.len());
            let n = want.min(bytes.len());
            self.partial.extend_from_slice(&bytes[..n]);
            used = n;
            if self.partial.len() < FRAME_HEADER_LEN + 1 {
                return Ok(used);
            }
            match check_start(&self.fmt, &self.partial) {
                Ok(len) => self.need = Some(len),
                Err(e) => return Err(self.fail(e)),
            }
        }
        let need = self.need.unwrap_or(0);
        let n = need
            .saturating_sub(self.partial.len())
            .min(bytes.len() - used);
        self.partial.extend_from_slice(&bytes[used..used + n]);
        if self.partial.len() < need {
            if let Err(e) = check_header_crc_early(&self.fmt, &self.partial) {
                return Err(self.fail(e));
            }
        }
        Ok(used + n)
    }
}
