//! The RDMAP extensions of RFC 7306: the Atomic Operation Request and Response headers (5.2.1,
//! 5.2.2) and the Immediate Data header (6.2), each as a checked view over bytes and a parsed
//! representation with `parse`/`emit`, and the two atomic operations themselves (5.1.1,
//! 5.1.2) as pure functions of the original value.
//!
//! All fields are big-endian on the wire (5.1.1); the operations act on the target memory's
//! own byte order, which is the caller's business ([`AtomicOp::apply`] takes and returns
//! plain `u64`s).

use super::field::{be_u32, be_u64, truncated};
use crate::error::RdmapError;

/// Octets of the Atomic Operation Request header (RFC 7306 5.2.1, Figure 4).
pub const ATOMIC_REQUEST_LEN: usize = 52;

/// Octets of the Atomic Operation Response header (RFC 7306 5.2.2, Figure 6).
pub const ATOMIC_RESPONSE_LEN: usize = 12;

/// Octets of the Immediate Data header (RFC 7306 6.2, Figure 7): the whole payload of an
/// Immediate Data message, which must carry exactly this many (6.3).
pub const IMMEDIATE_DATA_LEN: usize = 8;

/// Atomic Operation Codes (RFC 7306 5.2.1, Figure 5; registry of 10.1).
pub mod aopcode {
    /// 0000b FetchAdd.
    pub const FETCH_ADD: u8 = 0x0;
    /// 0010b CmpSwap.
    pub const CMP_SWAP: u8 = 0x2;
    /// The AOpCode bits of the request's first word.
    pub const MASK: u32 = 0x0F;
}

mod req_field {
    pub const AOPCODE_WORD: usize = 0;
    pub const REQUEST_ID: usize = 4;
    pub const STAG: usize = 8;
    pub const TO: usize = 12;
    pub const ADD_SWAP_DATA: usize = 20;
    pub const ADD_SWAP_MASK: usize = 28;
    pub const COMPARE_DATA: usize = 36;
    pub const COMPARE_MASK: usize = 44;
}

mod resp_field {
    pub const REQUEST_ID: usize = 0;
    pub const ORIGINAL: usize = 4;
}

/// A checked view of an Atomic Operation Request header (RFC 7306 5.2.1, Figure 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicRequestView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AtomicRequestView<T> {
    /// Wraps `buffer` without checking its length; accessors read missing fields as 0
    /// (never panic). Use [`AtomicRequestView::new_checked`] for bytes from the network.
    pub const fn new_unchecked(buffer: T) -> Self {
        AtomicRequestView { buffer }
    }

    /// Wraps `buffer`, checking it holds at least [`ATOMIC_REQUEST_LEN`] octets.
    pub fn new_checked(buffer: T) -> Result<Self, RdmapError> {
        let have = buffer.as_ref().len();
        if have < ATOMIC_REQUEST_LEN {
            return Err(truncated(ATOMIC_REQUEST_LEN, have));
        }
        Ok(AtomicRequestView { buffer })
    }

    fn u32_at(&self, at: usize) -> u32 {
        be_u32(self.buffer.as_ref(), at).unwrap_or(0)
    }

    fn u64_at(&self, at: usize) -> u64 {
        be_u64(self.buffer.as_ref(), at).unwrap_or(0)
    }

    /// Atomic Operation Code (the low 4 bits of the first word; the 28 reserved bits above
    /// it are ignored on receive).
    pub fn aopcode(&self) -> u8 {
        (self.u32_at(req_field::AOPCODE_WORD) & aopcode::MASK) as u8
    }

    /// Request Identifier, reflected in the Response.
    pub fn request_id(&self) -> u32 {
        self.u32_at(req_field::REQUEST_ID)
    }

    /// Remote STag.
    pub fn stag(&self) -> u32 {
        self.u32_at(req_field::STAG)
    }

    /// Remote Tagged Offset.
    pub fn to(&self) -> u64 {
        self.u64_at(req_field::TO)
    }

    /// Add or Swap Data.
    pub fn add_swap_data(&self) -> u64 {
        self.u64_at(req_field::ADD_SWAP_DATA)
    }

    /// Add or Swap Mask.
    pub fn add_swap_mask(&self) -> u64 {
        self.u64_at(req_field::ADD_SWAP_MASK)
    }

    /// Compare Data.
    pub fn compare_data(&self) -> u64 {
        self.u64_at(req_field::COMPARE_DATA)
    }

    /// Compare Mask.
    pub fn compare_mask(&self) -> u64 {
        self.u64_at(req_field::COMPARE_MASK)
    }
}

/// What an Atomic Operation does to the 64-bit word it targets (RFC 7306 5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// FetchAdd (5.1.1): `add` added to each field of the word; a bit set in `mask` marks
    /// the most significant bit of a field, whose carry out is discarded (mask 0: one 64-bit
    /// addition).
    FetchAdd {
        /// Add Data.
        add: u64,
        /// Add Mask.
        mask: u64,
    },
    /// CmpSwap (5.1.2): if the word equals `compare` in the bits of `compare_mask`, its bits
    /// in `swap_mask` are replaced by those of `swap`.
    CmpSwap {
        /// Compare Data.
        compare: u64,
        /// Compare Mask.
        compare_mask: u64,
        /// Swap Data.
        swap: u64,
        /// Swap Mask.
        swap_mask: u64,
    },
}

impl AtomicOp {
    /// Unmasked FetchAdd: one 64-bit addition (the verbs `IBV_WR_ATOMIC_FETCH_AND_ADD`).
    pub const fn fetch_add(add: u64) -> AtomicOp {
        AtomicOp::FetchAdd { add, mask: 0 }
    }

    /// Unmasked CmpSwap: the whole word compared and swapped (the verbs
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`).
    pub const fn cmp_swap(compare: u64, swap: u64) -> AtomicOp {
        AtomicOp::CmpSwap {
            compare,
            compare_mask: u64::MAX,
            swap,
            swap_mask: u64::MAX,
        }
    }

    /// The AOpCode of this operation (Figure 5).
    pub fn aopcode(&self) -> u8 {
        match self {
            AtomicOp::FetchAdd { .. } => aopcode::FETCH_ADD,
            AtomicOp::CmpSwap { .. } => aopcode::CMP_SWAP,
        }
    }

    /// Applies the operation to a word held in this host's byte order (5.1.1: "performed in
    /// the endian format of the target memory"); returns the original value. Not atomic by
    /// itself: for buffers that serialize their accesses.
    pub fn apply_to_ne_bytes(&self, word: &mut [u8; 8]) -> u64 {
        let original = u64::from_ne_bytes(*word);
        *word = self.apply(original).to_ne_bytes();
        original
    }

    /// The value the word holds after the operation, given the value it held before
    /// (`original`): the pseudocode of 5.1.1 (FetchAdd) and 5.1.2 (CmpSwap).
    pub fn apply(&self, original: u64) -> u64 {
        match *self {
            AtomicOp::FetchAdd { add, mask } => {
                // Add with the field tops cleared: a carry into a field's top bit stops
                // there. The top bit is then the sum of its two bits and that carry, with
                // the carry out of it dropped.
                let low = (original & !mask).wrapping_add(add & !mask);
                low ^ ((original ^ add) & mask)
            }
            AtomicOp::CmpSwap {
                compare,
                compare_mask,
                swap,
                swap_mask,
            } => {
                if (compare ^ original) & compare_mask == 0 {
                    (original & !swap_mask) | (swap & swap_mask)
                } else {
                    original
                }
            }
        }
    }
}

/// The fields of an Atomic Operation Request header (RFC 7306 5.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicRequest {
    /// The operation and its operands.
    pub op: AtomicOp,
    /// Request Identifier, chosen by the requester and reflected in the Response.
    pub request_id: u32,
    /// Remote STag.
    pub stag: u32,
    /// Remote Tagged Offset: must name a 64-bit aligned address (5.1.1).
    pub to: u64,
}

impl AtomicRequest {
    /// Parses the first [`ATOMIC_REQUEST_LEN`] octets of `bytes`.
    ///
    /// Errors: [`RdmapError::Truncated`] when shorter; [`RdmapError::UnsupportedAtomic`] for
    /// an AOpCode other than FetchAdd and CmpSwap (5.2.1 rule 4).
    pub fn parse(bytes: &[u8]) -> Result<AtomicRequest, RdmapError> {
        let v = AtomicRequestView::new_checked(bytes)?;
        let op = match v.aopcode() {
            aopcode::FETCH_ADD => AtomicOp::FetchAdd {
                add: v.add_swap_data(),
                mask: v.add_swap_mask(),
            },
            aopcode::CMP_SWAP => AtomicOp::CmpSwap {
                compare: v.compare_data(),
                compare_mask: v.compare_mask(),
                swap: v.add_swap_data(),
                swap_mask: v.add_swap_mask(),
            },
            other => return Err(RdmapError::UnsupportedAtomic { aopcode: other }),
        };
        Ok(AtomicRequest {
            op,
            request_id: v.request_id(),
            stag: v.stag(),
            to: v.to(),
        })
    }

    /// The 52 octets of this header. FetchAdd sends Compare Data 0 and Compare Mask all
    /// ones (5.2.1: "set to zero on transmit", "set to ffffffffffffffffh").
    pub fn to_bytes(&self) -> [u8; ATOMIC_REQUEST_LEN] {
        let (data, mask, compare, compare_mask) = match self.op {
            AtomicOp::FetchAdd { add, mask } => (add, mask, 0, u64::MAX),
            AtomicOp::CmpSwap {
                compare,
                compare_mask,
                swap,
                swap_mask,
            } => (swap, swap_mask, compare, compare_mask),
        };
        let mut out = [0u8; ATOMIC_REQUEST_LEN];
        let mut put = |at: usize, bytes: &[u8]| out[at..at + bytes.len()].copy_from_slice(bytes);
        put(
            req_field::AOPCODE_WORD,
            &u32::from(self.op.aopcode()).to_be_bytes(),
        );
        put(req_field::REQUEST_ID, &self.request_id.to_be_bytes());
        put(req_field::STAG, &self.stag.to_be_bytes());
        put(req_field::TO, &self.to.to_be_bytes());
        put(req_field::ADD_SWAP_DATA, &data.to_be_bytes());
        put(req_field::ADD_SWAP_MASK, &mask.to_be_bytes());
        put(req_field::COMPARE_DATA, &compare.to_be_bytes());
        put(req_field::COMPARE_MASK, &compare_mask.to_be_bytes());
        out
    }

    /// Writes the header into `out`; returns [`ATOMIC_REQUEST_LEN`], or 0 (nothing
    /// written) if `out` is shorter.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        match out.get_mut(..ATOMIC_REQUEST_LEN) {
            Some(dst) => {
                dst.copy_from_slice(&self.to_bytes());
                ATOMIC_REQUEST_LEN
            }
            None => 0,
        }
    }
}

/// A checked view of an Atomic Operation Response header (RFC 7306 5.2.2, Figure 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicResponseView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AtomicResponseView<T> {
    /// Wraps `buffer`, checking it holds at least [`ATOMIC_RESPONSE_LEN`] octets.
    pub fn new_checked(buffer: T) -> Result<Self, RdmapError> {
        let have = buffer.as_ref().len();
        if have < ATOMIC_RESPONSE_LEN {
            return Err(truncated(ATOMIC_RESPONSE_LEN, have));
        }
        Ok(AtomicResponseView { buffer })
    }

    /// Original Request Identifier.
    pub fn request_id(&self) -> u32 {
        be_u32(self.buffer.as_ref(), resp_field::REQUEST_ID).unwrap_or(0)
    }

    /// Original Remote Data Value.
    pub fn original(&self) -> u64 {
        be_u64(self.buffer.as_ref(), resp_field::ORIGINAL).unwrap_or(0)
    }
}

/// The fields of an Atomic Operation Response header (RFC 7306 5.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicResponse {
    /// Original Request Identifier: the Request Identifier of the request answered.
    pub request_id: u32,
    /// Original Remote Data Value: the word before the operation.
    pub original: u64,
}

impl AtomicResponse {
    /// Parses the first [`ATOMIC_RESPONSE_LEN`] octets of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<AtomicResponse, RdmapError> {
        let v = AtomicResponseView::new_checked(bytes)?;
        Ok(AtomicResponse {
            request_id: v.request_id(),
            original: v.original(),
        })
    }

    /// The 12 octets of this header.
    pub fn to_bytes(&self) -> [u8; ATOMIC_RESPONSE_LEN] {
        let mut out = [0u8; ATOMIC_RESPONSE_LEN];
        out[..resp_field::ORIGINAL].copy_from_slice(&self.request_id.to_be_bytes());
        out[resp_field::ORIGINAL..].copy_from_slice(&self.original.to_be_bytes());
        out
    }

    /// Writes the header into `out`; returns [`ATOMIC_RESPONSE_LEN`], or 0 (nothing
    /// written) if `out` is shorter.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        match out.get_mut(..ATOMIC_RESPONSE_LEN) {
            Some(dst) => {
                dst.copy_from_slice(&self.to_bytes());
                ATOMIC_RESPONSE_LEN
            }
            None => 0,
        }
    }
}

/// The Immediate Data header (RFC 7306 6.2, Figure 7): the 8 octets an Immediate Data
/// message carries, exactly (6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmediateData(pub [u8; IMMEDIATE_DATA_LEN]);

impl ImmediateData {
    /// The payload of an Immediate Data message, which must be exactly
    /// [`IMMEDIATE_DATA_LEN`] octets (6.3: "The Remote Peer MUST check").
    ///
    /// Errors: [`RdmapError::BadImmediateLength`] otherwise.
    pub fn parse(payload: &[u8]) -> Result<ImmediateData, RdmapError> {
        let bytes: [u8; IMMEDIATE_DATA_LEN] = payload
            .try_into()
            .map_err(|_| RdmapError::BadImmediateLength { len: payload.len() })?;
        Ok(ImmediateData(bytes))
    }

    /// Writes the 8 octets into `out`; returns [`IMMEDIATE_DATA_LEN`], or 0 if `out` is
    /// shorter.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        match out.get_mut(..IMMEDIATE_DATA_LEN) {
            Some(dst) => {
                dst.copy_from_slice(&self.0);
                IMMEDIATE_DATA_LEN
            }
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figure 4 filled in: CmpSwap, Request Identifier 0x0A0B0C0D, STag 0x00012301, TO
    /// 0x1000, Swap Data 0x1111..., Swap Mask all ones, Compare Data 0x2222..., Compare
    /// Mask 0x00000000FFFFFFFF.
    const CMP_SWAP_REQUEST: [u8; 52] = [
        0x00, 0x00, 0x00, 0x02, // reserved, AOpCode 0010b
        0x0A, 0x0B, 0x0C, 0x0D, // Request Identifier
        0x00, 0x01, 0x23, 0x01, // Remote STag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, // Remote Tagged Offset
        0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, // Add or Swap Data
        0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, // Add or Swap Mask
        0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, // Compare Data
        0x00, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFF, // Compare Mask
    ];

    #[test]
    fn atomic_request_figure_4_cmp_swap() {
        let r = AtomicRequest::parse(&CMP_SWAP_REQUEST).expect("parse");
        assert_eq!(
            r,
            AtomicRequest {
                op: AtomicOp::CmpSwap {
                    compare: 0x2222_2222_2222_2222,
                    compare_mask: 0x0000_0000_FFFF_FFFF,
                    swap: 0x1111_1111_1111_1111,
                    swap_mask: u64::MAX,
                },
                request_id: 0x0A0B_0C0D,
                stag: 0x0001_2301,
                to: 0x1000,
            }
        );
        assert_eq!(r.to_bytes(), CMP_SWAP_REQUEST);
        let mut out = [0u8; 60];
        assert_eq!(r.emit(&mut out), 52);
        assert_eq!(out[..52], CMP_SWAP_REQUEST);
        assert_eq!(r.emit(&mut out[..51]), 0);
        let v = AtomicRequestView::new_checked(&CMP_SWAP_REQUEST[..]).expect("view");
        assert_eq!(
            (v.aopcode(), v.stag(), v.to()),
            (aopcode::CMP_SWAP, 0x0001_2301, 0x1000)
        );
    }

    #[test]
    fn atomic_request_fetch_add_sends_the_fixed_compare_fields() {
        let r = AtomicRequest {
            op: AtomicOp::fetch_add(5),
            request_id: 7,
            stag: 0x100,
            to: 8,
        };
        let b = r.to_bytes();
        assert_eq!(b[..4], [0, 0, 0, 0]);
        assert_eq!(b[20..28], 5u64.to_be_bytes());
        assert_eq!(b[28..36], [0; 8], "Add Mask 0: one 64-bit addition");
        assert_eq!(b[36..44], [0; 8], "Compare Data zero on transmit");
        assert_eq!(b[44..52], [0xFF; 8], "Compare Mask all ones on transmit");
        assert_eq!(AtomicRequest::parse(&b), Ok(r));
    }

    #[test]
    fn atomic_request_reserved_bits_ignored_and_unknown_aopcodes_refused() {
        let mut b = CMP_SWAP_REQUEST;
        b[..4].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0xF2]);
        assert!(AtomicRequest::parse(&b).is_ok(), "reserved bits ignored");
        for code in [0x1u8, 0x3, 0x7, 0xF] {
            b[3] = code;
            assert_eq!(
                AtomicRequest::parse(&b),
                Err(RdmapError::UnsupportedAtomic { aopcode: code })
            );
        }
        assert_eq!(
            AtomicRequest::parse(&CMP_SWAP_REQUEST[..51]),
            Err(RdmapError::Truncated {
                needed: 52,
                have: 51
            })
        );
    }

    #[test]
    fn atomic_response_figure_6() {
        let bytes = [
            0x0A, 0x0B, 0x0C, 0x0D, // Original Request Identifier
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // Original Remote Data Value
        ];
        let r = AtomicResponse::parse(&bytes).expect("parse");
        assert_eq!(
            r,
            AtomicResponse {
                request_id: 0x0A0B_0C0D,
                original: 0x0102_0304_0506_0708
            }
        );
        assert_eq!(r.to_bytes(), bytes);
        assert!(matches!(
            AtomicResponse::parse(&bytes[..11]),
            Err(RdmapError::Truncated { .. })
        ));
    }

    #[test]
    fn immediate_data_is_exactly_eight_octets() {
        let d = ImmediateData::parse(&[1, 2, 3, 4, 5, 6, 7, 8]).expect("8 octets");
        let mut out = [0u8; 8];
        assert_eq!(d.emit(&mut out), 8);
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8]);
        for len in [0usize, 7, 9, 16] {
            assert_eq!(
                ImmediateData::parse(&vec![0; len]),
                Err(RdmapError::BadImmediateLength { len })
            );
        }
    }

    /// The bit-serial pseudocode of RFC 7306 5.1.1, as written there.
    fn fetch_add_pseudocode(original: u64, add: u64, mask: u64) -> u64 {
        let mut bit_location: u64 = 1;
        let mut carry = 0u64;
        let mut remote = 0u64;
        for bit in 0..64 {
            if bit != 0 {
                bit_location <<= 1;
            }
            let val1 = (original & bit_location) >> bit;
            let val2 = (add & bit_location) >> bit;
            let mut sum = carry + val1 + val2;
            carry = (sum & 2) >> 1;
            sum &= 1;
            if sum != 0 {
                remote |= bit_location;
            }
            carry = u64::from(carry != 0 && mask & bit_location == 0);
        }
        remote
    }

    #[test]
    fn fetch_add_matches_the_rfc_pseudocode() {
        // A small xorshift: fixed seed, many masks and values.
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let special = [0, 1, u64::MAX, 0x8000_0000_0000_0000, 0x8080_8080_8080_8080];
        for &mask in special.iter() {
            for &a in special.iter() {
                for &b in special.iter() {
                    let op = AtomicOp::FetchAdd { add: b, mask };
                    assert_eq!(op.apply(a), fetch_add_pseudocode(a, b, mask));
                }
            }
        }
        for _ in 0..20_000 {
            let (a, b, mask) = (next(), next(), next());
            let op = AtomicOp::FetchAdd { add: b, mask };
            assert_eq!(
                op.apply(a),
                fetch_add_pseudocode(a, b, mask),
                "{a:x} {b:x} {mask:x}"
            );
        }
        // Mask 0: a plain 64-bit addition, wrapping.
        assert_eq!(AtomicOp::fetch_add(1).apply(u64::MAX), 0);
        // Two 32-bit fields: no carry from the low field into the high one.
        let two = AtomicOp::FetchAdd {
            add: 0x0000_0001_0000_0001,
            mask: 0x8000_0000_8000_0000,
        };
        assert_eq!(two.apply(0x0000_0005_FFFF_FFFF), 0x0000_0006_0000_0000);
    }

    #[test]
    fn cmp_swap_follows_the_rfc_pseudocode() {
        let op = AtomicOp::cmp_swap(5, 9);
        assert_eq!(op.apply(5), 9);
        assert_eq!(op.apply(6), 6);
        // Masked: compare the low half only, swap the high half only.
        let masked = AtomicOp::CmpSwap {
            compare: 0xAAAA_AAAA_0000_0007,
            compare_mask: 0x0000_0000_FFFF_FFFF,
            swap: 0x1234_5678_9999_9999,
            swap_mask: 0xFFFF_FFFF_0000_0000,
        };
        assert_eq!(masked.apply(0xFFFF_FFFF_0000_0007), 0x1234_5678_0000_0007);
        assert_eq!(masked.apply(0xFFFF_FFFF_0000_0008), 0xFFFF_FFFF_0000_0008);
    }
}
