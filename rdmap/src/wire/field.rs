//! Big-endian field reads shared by the RDMAP headers' views (RFC 5040 4: network order).

use crate::error::RdmapError;

pub(super) fn be_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

pub(super) fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_be_bytes(b))
}

pub(super) fn be_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

pub(super) fn truncated(needed: usize, have: usize) -> RdmapError {
    RdmapError::Truncated { needed, have }
}
