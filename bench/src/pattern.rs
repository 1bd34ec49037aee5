//! Position-based test patterns: byte `i` of a buffer filled with seed `s` is a function of `s`
//! and `i` only, so any slice can be produced or checked on its own, at memory speed.

fn word(seed: u64, index: u64) -> [u8; 8] {
    // splitmix64 of (seed, index): cheap and without visible structure.
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(index.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).to_le_bytes()
}

/// Fills `buf` with the pattern bytes at positions `offset..offset + buf.len()`.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut pos = offset;
    let mut i = 0;
    while i < buf.len() {
        let w = word(seed, pos / 8);
        let start = (pos % 8) as usize;
        let n = (8 - start).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&w[start..start + n]);
        i += n;
        pos += n as u64;
    }
}

/// Index of the first byte of `buf` that differs from the pattern at `offset`, if any.
pub fn first_mismatch(seed: u64, offset: u64, buf: &[u8]) -> Option<usize> {
    let mut expect = [0u8; 4096];
    let mut i = 0;
    while i < buf.len() {
        let n = expect.len().min(buf.len() - i);
        fill(seed, offset + i as u64, &mut expect[..n]);
        if buf[i..i + n] != expect[..n] {
            let j = buf[i..i + n]
                .iter()
                .zip(&expect[..n])
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some(i + j);
        }
        i += n;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_agree_with_the_whole() {
        let mut whole = vec![0u8; 1000];
        fill(7, 0, &mut whole);
        let mut part = vec![0u8; 333];
        fill(7, 101, &mut part);
        assert_eq!(&whole[101..434], &part[..]);
        assert_eq!(first_mismatch(7, 101, &part), None);
        part[200] ^= 1;
        assert_eq!(first_mismatch(7, 101, &part), Some(200));
        let mut other = vec![0u8; 64];
        fill(8, 0, &mut other);
        assert_ne!(&whole[..64], &other[..]);
    }
}
