//! CRC32c as used by MPA (RFC 5044 section 4.4): the iSCSI digest polynomial (reflected
//! 0x82F63B78), initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF. The value goes on the wire least
//! significant octet first (see `IWARP-WIRE.md` 1.2).
//!
//! Backend: `crc-fast` (`CrcAlgorithm::Crc32Iscsi`), which uses the CPU's CRC32/carry-less
//! multiply instructions; `benches/crc.rs` compares it with the `crc32c` crate.

use crc_fast::{CrcAlgorithm, Digest};

/// CRC32c of `data` in one call (RFC 5044 section 4.4).
pub fn crc32c(data: &[u8]) -> u32 {
    // The algorithm is 32 bits wide, so the result always fits; truncation is exact.
    crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// Incremental CRC32c: feed the covered octets in pieces with [`Crc32c::update`] (for MPA:
/// markers and FPDU parts as they are emitted or received) and read the value with
/// [`Crc32c::finalize`].
#[derive(Clone, Copy, Debug)]
pub struct Crc32c {
    digest: Digest,
}

impl Crc32c {
    /// A fresh CRC over zero octets.
    pub fn new() -> Self {
        Crc32c {
            digest: Digest::new(CrcAlgorithm::Crc32Iscsi),
        }
    }

    /// Adds `data` to the covered octets.
    #[inline]
    pub fn update(&mut self, data: &[u8]) {
        self.digest.update(data);
    }

    /// The CRC32c of everything given to [`Crc32c::update`] so far.
    #[inline]
    pub fn finalize(&self) -> u32 {
        self.digest.finalize() as u32
    }

    /// The running register: the reflected CRC of the octets so far before the final XOR
    /// (`0xFFFFFFFF` for none; [`Crc32c::finalize`] is its complement). It is the value the
    /// x86 `crc32` instruction and a carry-less-multiply fold continue from, so a routine that
    /// computes the CRC in its own loop (a copy that folds each octet into the CRC as it moves
    /// it) can take over with [`Crc32c::with_state`].
    #[inline]
    pub fn state(&self) -> u32 {
        // A 32-bit algorithm: the register always fits.
        self.digest.get_state() as u32
    }

    /// A CRC continuing from the running register `state` (see [`Crc32c::state`]).
    #[inline]
    pub fn with_state(state: u32) -> Self {
        Crc32c {
            digest: Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(state)),
        }
    }

    /// Starts over as if freshly created.
    #[inline]
    pub fn reset(&mut self) {
        self.digest.reset();
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_is_e3069283() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn empty_input_is_zero() {
        assert_eq!(crc32c(b""), 0);
        assert_eq!(Crc32c::new().finalize(), 0);
    }

    #[test]
    fn incremental_matches_one_shot_for_every_split() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        let whole = crc32c(&data);
        for split in 0..=data.len() {
            let mut crc = Crc32c::new();
            crc.update(&data[..split]);
            crc.update(&data[split..]);
            assert_eq!(crc.finalize(), whole, "split at {split}");
        }
    }

    #[test]
    fn agrees_with_crc32c_crate() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i ^ (i >> 3)) as u8).collect();
        for len in [0, 1, 3, 15, 64, 1448, 4096, 5000] {
            assert_eq!(
                crc32c(&data[..len]),
                ::crc32c::crc32c(&data[..len]),
                "len {len}"
            );
        }
    }

    #[test]
    fn state_is_the_register_and_continues() {
        assert_eq!(Crc32c::new().state(), 0xFFFF_FFFF);
        let mut crc = Crc32c::new();
        crc.update(b"12345");
        let mut more = Crc32c::with_state(crc.state());
        more.update(b"6789");
        assert_eq!(more.finalize(), 0xE306_9283);
        assert_eq!(more.state(), !0xE306_9283);
    }

    #[test]
    fn reset_starts_over() {
        let mut crc = Crc32c::new();
        crc.update(b"garbage");
        crc.reset();
        crc.update(b"123456789");
        assert_eq!(crc.finalize(), 0xE306_9283);
    }
}
