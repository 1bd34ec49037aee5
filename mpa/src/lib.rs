//! MPA: Marker PDU Aligned framing for TCP (RFC 5044) with the enhanced connection setup of
//! RFC 6581, sans-IO.
//!
//! - [`crc`]: CRC32c (RFC 5044 section 4.4).
//! - [`wire`]: FPDU framing helpers, Markers and the Request/Reply frame (sections 4.1 to 4.3,
//!   7.1.1; RFC 6581 sections 6 and 9).
//! - [`FpduEncoder`] / [`FpduDecoder`]: Full Operation framing for one direction each.
//! - [`startup`]: the Request/Reply exchange (section 7.1.2, RFC 6581 section 9).
//! - [`MpaError`]: the layer's errors and their wire codes (section 8, RFC 6581 section 8).
//!
//! Nothing here does I/O or reads a clock: octets come in as slices, go out into caller
//! buffers, and time is passed in as [`std::time::Instant`].
//!
//! ```
//! use std::time::Instant;
//! use mpa::{Initiator, InitiatorEvent, MpaConfig, Responder};
//!
//! let now = Instant::now();
//! let mut initiator = Initiator::new(MpaConfig::default(), b"hello", now)?;
//! let mut responder = Responder::new(MpaConfig::default(), now)?;
//!
//! // Initiator -> Responder: the Request.
//! let (_, request) = responder.feed(initiator.request(), now)?;
//! assert_eq!(request.unwrap().private_data, b"hello");
//! let (reply, responder_side) = responder.accept(b"welcome")?;
//!
//! // Responder -> Initiator: the Reply; FPDUs may follow it in the same read.
//! let (consumed, event) = initiator.feed(&reply, now)?;
//! assert_eq!(consumed, reply.len());
//! let InitiatorEvent::Accepted { negotiated, .. } = event else { panic!("rejected") };
//!
//! // Full Operation: the Initiator sends first (the Responder waits for one FPDU).
//! let mut wire = Vec::new();
//! negotiated.encoder().encode(b"a DDP segment", &mut wire)?;
//! let mut received = Vec::new();
//! responder_side.decoder().feed(&wire, |ulpdu| received.push(ulpdu.to_vec()))?;
//! assert_eq!(received, [b"a DDP segment".to_vec()]);
//! # Ok::<(), mpa::MpaError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod crc;
mod decoder;
mod encoder;
mod error;
mod locate;
pub mod startup;
pub mod wire;

pub use decoder::{fpdu_end, FpduDecoder, FpduSpan};
pub use encoder::FpduEncoder;
pub use error::MpaError;
pub use locate::FpduLocator;
pub use startup::{
    check_private_data_to_send, Initiator, InitiatorEvent, MpaConfig, Negotiated, RequestInfo,
    Responder, RtrKind,
};

/// The smallest MULPDU MPA may offer, whatever the EMSS (RFC 5044 section 4.5).
pub const MIN_MULPDU: usize = 128;

/// MULPDU, the largest ULPDU that fits one FPDU in a TCP segment of `emss` octets (RFC 5044
/// section 4.5):
///
/// - with Markers: `EMSS - (6 + 4 * ceil(EMSS / 512) + EMSS mod 4)`, counting the worst-case
///   number of Markers;
/// - without: `EMSS - (6 + EMSS mod 4)`;
///
/// never below 128. For EMSS 1460: 1442 with Markers, 1454 without.
pub fn mulpdu(emss: usize, markers: bool) -> usize {
    let marker_overhead = if markers {
        4 * emss.div_ceil(wire::MARKER_INTERVAL)
    } else {
        0
    };
    let overhead = 6 + marker_overhead + emss % 4;
    emss.saturating_sub(overhead).max(MIN_MULPDU)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mulpdu_for_ethernet_emss() {
        assert_eq!(mulpdu(1460, true), 1442);
        assert_eq!(mulpdu(1460, false), 1454);
    }

    #[test]
    fn mulpdu_accounts_for_emss_mod_4_and_marker_count() {
        assert_eq!(mulpdu(1461, false), 1461 - 7);
        assert_eq!(mulpdu(1024, true), 1024 - 6 - 8);
        assert_eq!(mulpdu(1025, true), 1025 - 6 - 12 - 1);
        assert_eq!(mulpdu(9000, true), 9000 - 6 - 4 * 18);
    }

    #[test]
    fn mulpdu_never_below_128() {
        assert_eq!(mulpdu(100, false), 128);
        assert_eq!(mulpdu(0, true), 128);
        assert_eq!(mulpdu(134, false), 128);
        assert_eq!(mulpdu(135, false), 128);
        assert_eq!(mulpdu(136, false), 130);
    }

    #[test]
    fn mulpdu_fpdu_fits_emss() {
        // The whole FPDU, worst-case Markers included, fits in EMSS.
        for emss in 200..3000 {
            for markers in [false, true] {
                let ulpdu = mulpdu(emss, markers);
                let max_wire = (0..512u32)
                    .step_by(4)
                    .map(|position| {
                        FpduEncoder::with_position(true, markers, position).wire_len(ulpdu)
                    })
                    .max()
                    .unwrap_or(0);
                assert!(
                    max_wire <= emss,
                    "emss {emss} markers {markers}: {max_wire}"
                );
            }
        }
    }
}
