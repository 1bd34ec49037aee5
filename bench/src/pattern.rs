//! Position-based test patterns: byte `i` of a buffer filled with seed `s` is a function of `s`
//! and `i` only, so any slice can be produced or checked on its own, at memory speed.

/// The pattern word at word index `index` (octets `8 * index ..`), little-endian.
#[inline(always)]
fn word(seed: u64, index: u64) -> u64 {
    // splitmix64 of (seed, index): cheap and without visible structure.
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(index.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Octets of `buf` (at stream position `offset`) before the first whole pattern word.
fn head_len(offset: u64, len: usize) -> usize {
    (((8 - offset % 8) % 8) as usize).min(len)
}

/// Fills `buf` with the pattern bytes at positions `offset..offset + buf.len()`.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let head = head_len(offset, buf.len());
    let (first, rest) = buf.split_at_mut(head);
    fill_bytes(seed, offset, first);
    let pos = offset + head as u64;
    let mut words = rest.chunks_exact_mut(8);
    let mut index = pos / 8;
    for w in &mut words {
        w.copy_from_slice(&word(seed, index).to_le_bytes());
        index += 1;
    }
    let tail = words.into_remainder();
    fill_bytes(seed, index * 8, tail);
}

/// [`fill`] for the parts of a buffer that are not whole words: each pattern word computed
/// once for the octets of it that `buf` holds.
fn fill_bytes(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut i = 0;
    while i < buf.len() {
        let (w, n) = word_part(seed, offset + i as u64, buf.len() - i);
        buf[i..i + n].copy_from_slice(&w[..n]);
        i += n;
    }
}

/// The pattern octets from stream position `pos` to the end of its word, at most `max` of
/// them: (the octets, how many).
#[inline(always)]
fn word_part(seed: u64, pos: u64, max: usize) -> ([u8; 8], usize) {
    let start = (pos % 8) as usize;
    let mut w = [0u8; 8];
    let n = (8 - start).min(max);
    w[..n].copy_from_slice(&word(seed, pos / 8).to_le_bytes()[start..start + n]);
    (w, n)
}

/// Index of the first byte of `buf` that differs from the pattern at `offset`, if any.
/// Compares whole words (four at a time) against the pattern computed in registers, at
/// several GB/s: the bandwidth tests check every message this way.
pub fn first_mismatch(seed: u64, offset: u64, buf: &[u8]) -> Option<usize> {
    let head = head_len(offset, buf.len());
    if let Some(i) = first_mismatch_bytes(seed, offset, &buf[..head]) {
        return Some(i);
    }
    let rest = &buf[head..];
    let first_index = (offset + head as u64) / 8;
    let mut quads = rest.chunks_exact(32);
    let mut index = first_index;
    for q in &mut quads {
        let mut diff = 0;
        for (k, w) in q.chunks_exact(8).enumerate() {
            let got = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
            diff |= got ^ word(seed, index + k as u64);
        }
        if diff != 0 {
            let at = head + ((index - first_index) * 8) as usize;
            return first_mismatch_bytes(seed, offset + at as u64, q).map(|i| at + i);
        }
        index += 4;
    }
    let at = head + ((index - first_index) * 8) as usize;
    first_mismatch_bytes(seed, offset + at as u64, quads.remainder()).map(|i| at + i)
}

/// [`first_mismatch`] for the parts of a buffer that are not four-word blocks: each pattern
/// word computed once (a latency test checks every 64-octet message on its round trip).
fn first_mismatch_bytes(seed: u64, offset: u64, buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < buf.len() {
        let (w, n) = word_part(seed, offset + i as u64, buf.len() - i);
        if let Some(k) = buf[i..i + n].iter().zip(&w[..n]).position(|(a, b)| a != b) {
            return Some(i + k);
        }
        i += n;
    }
    None
}

/// The first octets of message `index` (at most 8, `len` the message's length) whose octets
/// are otherwise `seed`'s pattern at `offset`: the pattern there XORed with the index
/// (little-endian). Two messages through the same slot differ in them unless their indices
/// agree in the octets the head holds (a 1-octet message: indices 256 apart), so a slot still
/// holding an earlier message is told from the one expected. Returns the octets and how many.
pub fn index_head(seed: u64, offset: u64, index: u64, len: usize) -> ([u8; 8], usize) {
    let n = len.min(8);
    let mut head = [0u8; 8];
    fill(seed, offset, &mut head[..n]);
    for (h, i) in head.iter_mut().zip(index.to_le_bytes()).take(n) {
        *h ^= i;
    }
    (head, n)
}

/// Index of the first octet of `buf` that differs from message `index` ([`index_head`], then
/// the pattern at `offset`), if any.
pub fn first_message_mismatch(seed: u64, offset: u64, index: u64, buf: &[u8]) -> Option<usize> {
    let (head, n) = index_head(seed, offset, index, buf.len());
    if let Some(k) = buf[..n].iter().zip(&head[..n]).position(|(a, b)| a != b) {
        return Some(k);
    }
    first_mismatch(seed, offset + n as u64, &buf[n..]).map(|i| n + i)
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

    /// The bytes themselves (splitmix64 of seed 7 and the word index, little-endian, computed
    /// apart from this code): a client and a server of different builds must agree on them.
    #[test]
    fn known_bytes() {
        let mut b = [0u8; 16];
        fill(7, 0, &mut b);
        assert_eq!(
            b,
            [
                0xe1, 0x32, 0x45, 0x1f, 0xbe, 0x9a, 0x82, 0x2c, 0x7d, 0x4c, 0xfd, 0xe5, 0x35, 0x9d,
                0x3f, 0xd3
            ]
        );
        let mut b = [0u8; 8];
        fill(7, 13, &mut b);
        assert_eq!(b, [0x9d, 0x3f, 0xd3, 0x3d, 0xd3, 0x32, 0x40, 0xca]);
    }

    /// The word-wise check finds the first wrong byte wherever it is, at every alignment of
    /// the buffer's offset and length (head, whole words, four-word blocks, tail).
    #[test]
    fn first_mismatch_finds_every_position() {
        for offset in 0..9u64 {
            for len in [0usize, 1, 7, 8, 9, 31, 32, 33, 70] {
                let mut buf = vec![0u8; len];
                fill(5, offset, &mut buf);
                assert_eq!(first_mismatch(5, offset, &buf), None, "{offset} {len}");
                for at in 0..len {
                    let mut bad = buf.clone();
                    bad[at] ^= 0x10;
                    if at + 1 < len {
                        bad[len - 1] ^= 0x01; // a later difference must not be reported first
                    }
                    assert_eq!(
                        first_mismatch(5, offset, &bad),
                        Some(at),
                        "{offset} {len} {at}"
                    );
                }
            }
        }
    }

    /// A slot that still holds the previous round's message (the one `slots` before, through
    /// the same slot, with the same position-based pattern) is rejected; the fresh one passes.
    #[test]
    fn a_stale_message_is_rejected() {
        for len in [1usize, 2, 7, 8, 9, 64, 4096] {
            for slots in [1u64, 2, 128, 1000, 1024] {
                if len == 1 && slots % 256 == 0 {
                    continue; // one octet holds the index modulo 256 only
                }
                let (offset, index) = (3 * len as u64, 5 * slots + 3);
                let message = |i: u64| {
                    let mut m = vec![0u8; len];
                    fill(9, offset, &mut m);
                    let (head, n) = index_head(9, offset, i, len);
                    m[..n].copy_from_slice(&head[..n]);
                    m
                };
                let fresh = message(index);
                assert_eq!(first_message_mismatch(9, offset, index, &fresh), None);
                let stale = message(index - slots);
                let at = first_message_mismatch(9, offset, index, &stale);
                assert!(at.is_some_and(|k| k < len.min(8)), "{len} {slots}: {at:?}");
                // Past the head they are alike: the position-based pattern alone (all that
                // was checked before) cannot tell them apart.
                assert_eq!(stale[len.min(8)..], fresh[len.min(8)..]);
                // A fresh head over a body that is not the pattern is rejected too.
                if len > 8 {
                    let mut bad = fresh.clone();
                    bad[len - 1] ^= 1;
                    assert_eq!(
                        first_message_mismatch(9, offset, index, &bad),
                        Some(len - 1)
                    );
                }
            }
        }
    }
}
