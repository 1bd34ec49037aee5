//! The Internet checksum (RFC 1071): the 16-bit ones' complement of the ones' complement sum
//! of the data taken as big-endian 16-bit words, an odd last octet padded with a zero octet.
//! IPv4 header (RFC 791 3.1) and TCP (RFC 9293 3.1, over the pseudo-header) both use it.
//!
//! The sum is computed the way RFC 1071 section 2 (A, B, C) allows: in any order, in any word
//! size, carries added back in ("deferred carries"), byte order fixed at the end. Here each
//! 4 octets are taken as a little-endian 32-bit word added into a 64-bit accumulator (no carry
//! can be lost before 2^32 words, far beyond any IPv4 packet), eight accumulators per 32-octet
//! block so that the additions are independent (the compiler keeps them in vector registers),
//! and the carries are folded into 16 bits once, at the end. Summing little-endian words gives
//! the byte-swapped sum (RFC 1071 2(B)), swapped back when folded. This is several times faster
//! than summing 16-bit words one after the other (a TCP checksum over every segment sent and
//! received is on the engine's per-packet path).

/// A running RFC 1071 sum. Every slice added must start at an even offset of the checksummed
/// data (a 16-bit word boundary); only the last one may have an odd length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checksum {
    /// Sum of little-endian words (32-bit or 16-bit), carries not yet folded.
    acc: u64,
}

impl Checksum {
    /// An empty sum.
    pub const fn new() -> Checksum {
        Checksum { acc: 0 }
    }

    /// The sum accumulated elsewhere the way this type does (e.g. by a copy kernel that sums
    /// what it copies): octets at even offsets of the checksummed data as the low-order octets
    /// of little-endian words (16-, 32- or 64-bit lanes added up), carries not folded (RFC 1071
    /// 2(B), 2(C)). [`sum`](Self::sum) folds it and swaps it into the big-endian sum.
    #[inline]
    pub const fn from_le_sum(acc: u64) -> Checksum {
        Checksum { acc }
    }

    /// Adds `data` (see the type's documentation for alignment within the checksummed data).
    #[inline]
    pub fn add_bytes(self, data: &[u8]) -> Checksum {
        Checksum {
            acc: fold64(self.acc) + sum_le(data),
        }
    }

    /// [`add_bytes`](Self::add_bytes) for short data (headers: a few tens of octets), eight
    /// octets per addition without the block loop's setup: each little-endian 64-bit word
    /// adds its two 32-bit halves, a last partial word padded with zero octets (RFC 1071 4.1:
    /// an odd last octet is the high-order octet of a word). The same sum for any length; meant
    /// for at most a few hundred octets (no carry is lost below 2^28 octets).
    #[inline]
    pub fn add_short(self, data: &[u8]) -> Checksum {
        let mut acc = fold64(self.acc);
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            let mut q = [0u8; 8];
            q.copy_from_slice(w);
            let v = u64::from_le_bytes(q);
            acc += (v & 0xffff_ffff) + (v >> 32);
        }
        // The last 0-7 octets as a 32-bit, a 16-bit word and an octet, each loaded at its
        // size (not gathered into a buffer first: a wide load of narrow stores just made
        // waits for them).
        let mut rest = words.remainder();
        if let Some((w, r)) = rest.split_first_chunk::<4>() {
            acc += u64::from(u32::from_le_bytes(*w));
            rest = r;
        }
        if let Some((w, r)) = rest.split_first_chunk::<2>() {
            acc += u64::from(u16::from_le_bytes(*w));
            rest = r;
        }
        if let Some(&b) = rest.first() {
            acc += u64::from(b);
        }
        Checksum { acc }
    }

    /// Adds one 16-bit word given as its two octets in wire order.
    #[inline]
    pub fn add_2(self, word: [u8; 2]) -> Checksum {
        Checksum {
            acc: self.acc + u64::from(u16::from_le_bytes(word)),
        }
    }

    /// Adds two 16-bit words given as four octets in wire order (e.g. an IPv4 address).
    #[inline]
    pub fn add_4(self, words: [u8; 4]) -> Checksum {
        Checksum {
            acc: self.acc + u64::from(u32::from_le_bytes(words)),
        }
    }

    /// Adds the ones' complement sum of other data, as [`sum`](Self::sum) gives it, that
    /// continues the checksummed data at an even offset (RFC 1071 2(A): the sum of a
    /// concatenation is the sum of its parts' sums). Data that starts at an odd offset adds
    /// its sum byte-swapped (RFC 1071 2(B)).
    #[inline]
    pub fn add_sum(self, sum: u16) -> Checksum {
        Checksum {
            acc: self.acc + u64::from(sum.swap_bytes()),
        }
    }

    /// [`add_sum`](Self::add_sum) of the sum of data that starts at offset `at` of the
    /// checksummed data: byte-swapped when `at` is odd (RFC 1071 2(B)).
    #[inline]
    pub fn add_sum_at(self, at: usize, sum: u16) -> Checksum {
        self.add_sum(if at % 2 == 1 { sum.swap_bytes() } else { sum })
    }

    /// The ones' complement sum, as a big-endian value (`to_be_bytes` gives the wire octets).
    #[inline]
    pub fn sum(self) -> u16 {
        fold16(self.acc).swap_bytes()
    }

    /// The checksum field's value: the ones' complement of [`sum`](Self::sum). A received
    /// header or segment whose field is included verifies when its sum is `0xffff`, i.e. when
    /// this is 0.
    #[inline]
    pub fn finish(self) -> u16 {
        !self.sum()
    }
}

/// Folds a 64-bit sum of 16-bit words into 16 bits, carries added back (RFC 1071 2(C)).
#[inline]
fn fold16(acc: u64) -> u16 {
    let s = (acc & 0xffff_ffff) + (acc >> 32); // at most 33 bits
    let s = (s & 0xffff_ffff) + (s >> 32); // at most 32 bits
    let s = (s & 0xffff) + (s >> 16); // at most 17 bits
    let s = (s & 0xffff) + (s >> 16); // 16 bits
    s as u16
}

/// Folds a sum down to 33 bits so that more can be added without overflow.
#[inline]
fn fold64(acc: u64) -> u64 {
    (acc & 0xffff_ffff) + (acc >> 32)
}

/// Sum of `data` as little-endian 32-bit words (a trailing 16-bit word and odd octet as
/// little-endian words too), carries kept in the upper bits. Bounded: 2^32 words at most per
/// call keep every accumulator below 2^64 (any slice on a 64-bit target up to 16 GiB; packets
/// are at most 64 KiB).
#[inline]
fn sum_le(data: &[u8]) -> u64 {
    // Eight independent lanes, one 32-bit word each per 32-octet block: the compiler turns
    // this into vector additions (widening 32-bit words into 64-bit lanes).
    let mut acc = [0u64; 8];
    let mut blocks = data.chunks_exact(32);
    for b in &mut blocks {
        for (k, a) in acc.iter_mut().enumerate() {
            let w = u32::from_le_bytes([b[4 * k], b[4 * k + 1], b[4 * k + 2], b[4 * k + 3]]);
            *a += u64::from(w);
        }
    }
    let mut s: u64 = acc.iter().sum();
    let rest = blocks.remainder();
    let mut words = rest.chunks_exact(4);
    for w in &mut words {
        s += u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    }
    let tail = words.remainder();
    if tail.len() >= 2 {
        s += u64::from(u16::from_le_bytes([tail[0], tail[1]]));
    }
    if tail.len() & 1 == 1 {
        // The odd last octet is the high-order octet of a word padded with zero (RFC 1071
        // 4.1): little-endian, the low-order one.
        s += u64::from(tail[tail.len() - 1]);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::checksum::Sum16BitWords;

    /// Plain RFC 1071 4.1 (the reference C loop): 16-bit big-endian words one by one.
    fn reference(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        let mut i = 0;
        while i + 1 < data.len() {
            sum += u32::from(u16::from_be_bytes([data[i], data[i + 1]]));
            i += 2;
        }
        if i < data.len() {
            sum += u32::from(data[i]) << 8;
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(Checksum::new().add_bytes(&data).sum(), 0xddf2);
        assert_eq!(Checksum::new().add_bytes(&data).finish(), !0xddf2);
        assert_eq!(reference(&data), 0xddf2);
    }

    #[test]
    fn odd_octet_is_the_high_half_of_a_padded_word() {
        assert_eq!(Checksum::new().add_bytes(&[0xab]).sum(), 0xab00);
        assert_eq!(Checksum::new().add_bytes(&[1, 2, 3]).sum(), 0x0402);
        assert_eq!(Checksum::new().add_bytes(&[]).sum(), 0);
        assert_eq!(Checksum::new().add_bytes(&[]).finish(), 0xffff);
    }

    #[test]
    fn carries_fold_back() {
        // All ones: every partial sum carries.
        for len in [2usize, 8, 32, 33, 64, 1500, 9000, 65535] {
            let data = vec![0xffu8; len];
            assert_eq!(
                Checksum::new().add_bytes(&data).sum(),
                reference(&data),
                "len {len}"
            );
        }
    }

    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn agrees_with_etherparse_and_the_reference_over_random_lengths_and_alignments() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let buf: Vec<u8> = (0..70_000).map(|_| xorshift(&mut rng) as u8).collect();
        let mut lens: Vec<usize> = (0..=130).collect();
        lens.extend([1447, 1448, 1459, 1460, 1461, 4095, 9001, 65535]);
        for _ in 0..300 {
            lens.push((xorshift(&mut rng) % 66_000) as usize);
        }
        for (k, &len) in lens.iter().enumerate() {
            // Start at every alignment within a cache line over the runs.
            let at = k % 64;
            let data = &buf[at..at + len];
            let ours = Checksum::new().add_bytes(data);
            let theirs = Sum16BitWords::new().add_slice(data);
            assert_eq!(
                ours.sum().to_be_bytes(),
                (!theirs.ones_complement()).to_ne_bytes(),
                "len {len} at {at}"
            );
            assert_eq!(
                ours.finish().to_be_bytes(),
                theirs.ones_complement().to_ne_bytes(),
                "len {len} at {at}"
            );
            assert_eq!(ours.sum(), reference(data), "len {len} at {at}");
        }
    }

    #[test]
    fn pseudo_header_words_and_split_slices() {
        let mut rng = 7u64;
        for _ in 0..200 {
            let src = (xorshift(&mut rng) as u32).to_be_bytes();
            let dst = (xorshift(&mut rng) as u32).to_be_bytes();
            let len = (xorshift(&mut rng) % 3000) as usize;
            let data: Vec<u8> = (0..len).map(|_| xorshift(&mut rng) as u8).collect();
            // Split at an even offset: the same sum as one slice.
            let cut = (xorshift(&mut rng) as usize % (len + 1)) & !1;
            let ours = Checksum::new()
                .add_4(src)
                .add_4(dst)
                .add_2([0, 6])
                .add_2((len as u16).to_be_bytes())
                .add_bytes(&data[..cut])
                .add_bytes(&data[cut..]);
            let theirs = Sum16BitWords::new()
                .add_4bytes(src)
                .add_4bytes(dst)
                .add_2bytes([0, 6])
                .add_2bytes((len as u16).to_be_bytes())
                .add_slice(&data);
            assert_eq!(
                ours.finish().to_be_bytes(),
                theirs.ones_complement().to_ne_bytes()
            );
            let mut whole = Vec::new();
            whole.extend_from_slice(&src);
            whole.extend_from_slice(&dst);
            whole.extend_from_slice(&[0, 6]);
            whole.extend_from_slice(&(len as u16).to_be_bytes());
            whole.extend_from_slice(&data);
            assert_eq!(ours.sum(), reference(&whole));
        }
    }

    #[test]
    fn sums_of_parts_add_up_at_even_and_odd_offsets() {
        let mut rng = 31u64;
        let data: Vec<u8> = (0..4000).map(|_| xorshift(&mut rng) as u8).collect();
        for _ in 0..400 {
            let len = (xorshift(&mut rng) % 4000) as usize;
            let whole = &data[..len];
            // Three parts at arbitrary cuts (odd ones included): each summed on its own, added
            // in byte-swapped when it starts at an odd offset.
            let mut cuts = [
                (xorshift(&mut rng) as usize) % (len + 1),
                (xorshift(&mut rng) as usize) % (len + 1),
            ];
            cuts.sort_unstable();
            let mut c = Checksum::new().add_2([0, 6]);
            for (a, b) in [(0, cuts[0]), (cuts[0], cuts[1]), (cuts[1], len)] {
                let s = Checksum::new().add_bytes(&whole[a..b]).sum();
                c = c.add_sum(if a % 2 == 1 { s.swap_bytes() } else { s });
            }
            let want = Checksum::new().add_2([0, 6]).add_bytes(whole);
            assert_eq!(c.sum(), want.sum(), "len {len} cuts {cuts:?}");
            assert_eq!(c.finish(), want.finish(), "len {len} cuts {cuts:?}");
        }
    }

    #[test]
    fn short_sums_match_the_block_sum_for_every_length_and_alignment() {
        let mut rng = 0x51u64;
        let buf: Vec<u8> = (0..600).map(|_| xorshift(&mut rng) as u8).collect();
        for at in 0..16 {
            for len in 0..=300 {
                let data = &buf[at..at + len];
                let start = Checksum::new().add_4([0xff, 0xfe, 0x12, 0x34]);
                assert_eq!(
                    start.add_short(data).sum(),
                    start.add_bytes(data).sum(),
                    "len {len} at {at}"
                );
                assert_eq!(Checksum::new().add_short(data).sum(), reference(data));
            }
        }
        for len in [1usize, 2, 7, 8, 9, 20, 32, 60, 80, 299] {
            let ones = vec![0xffu8; len];
            assert_eq!(Checksum::new().add_short(&ones).sum(), reference(&ones));
        }
    }

    #[test]
    fn an_accumulated_little_endian_sum_folds_like_ours() {
        let mut rng = 0x77u64;
        for len in [0usize, 1, 2, 3, 8, 33, 1460, 9001] {
            let data: Vec<u8> = (0..len).map(|_| xorshift(&mut rng) as u8).collect();
            // 32-bit little-endian lanes, the tail padded with zero octets.
            let mut acc = 0u64;
            for w in data.chunks(4) {
                let mut q = [0u8; 4];
                q[..w.len()].copy_from_slice(w);
                acc += u64::from(u32::from_le_bytes(q));
            }
            assert_eq!(
                Checksum::from_le_sum(acc).sum(),
                reference(&data),
                "len {len}"
            );
        }
        assert_eq!(Checksum::from_le_sum(u64::MAX).sum(), 0xffff);
    }

    #[test]
    fn a_field_holding_the_checksum_verifies() {
        let mut rng = 99u64;
        for len in [20usize, 21, 40, 1460, 1461] {
            let mut data: Vec<u8> = (0..len).map(|_| xorshift(&mut rng) as u8).collect();
            data[10] = 0;
            data[11] = 0;
            let c = Checksum::new().add_bytes(&data).finish();
            data[10..12].copy_from_slice(&c.to_be_bytes());
            assert_eq!(Checksum::new().add_bytes(&data).finish(), 0, "len {len}");
        }
    }
}
