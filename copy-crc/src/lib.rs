//! A copy that computes the MPA CRC (RFC 5044 4.4: CRC32c, the iSCSI polynomial 0x1EDC6F41,
//! reflected 0x82F63B78) of the octets it moves, in one pass: each block of 64 (or 16) octets is
//! loaded once into a vector register, stored to the destination and folded into the CRC from that
//! register. The transmitter copies FPDU payload from registered memory into the UMEM frame
//! this way (`datapath::PinnedBuffer`'s `RegionBuffer::read_at_crc`); a copy followed by
//! a CRC pass over the destination would read back lines the copy just wrote, and the profile
//! showed that pass waiting on them.
//!
//! The fold (the method of Intel's "Fast CRC Computation for Generic Polynomials Using
//! PCLMULQDQ Instruction", in the bit-reflected form): a 128-bit lane holding the polynomial
//! `A = H x^64 + L` (the register's low quadword `H` is the earlier, higher-degree half) is
//! moved `D` bits further along the message by `H * (x^(D+63) mod P) + L * (x^(D-1) mod P)`
//! (a carry-less product of reflected operands is the reflected product times `x`, hence the
//! `- 1`), which is congruent to `A x^D` modulo `P` and fits in 96 bits; the next `D` bits
//! of message are XORed on. At the end the lanes are congruent to the message (with the
//! running register XORed into its first four octets), so the `crc32` instruction over their
//! octets from a zero register gives the CRC register; the last octets (fewer than a block)
//! go through `crc32` directly. The constants are computed here, not copied.
//!
//! The `_sum` variants also give the RFC 1071 ones' complement sum of the octets copied (the
//! TCP checksum's share of the payload, `tcp_engine::TxSource::fill_summed`), from the same
//! registers: each 64-bit lane of a block adds its low and high 32-bit halves into 64-bit
//! accumulators (little-endian words: the byte-swapped sum, RFC 1071 2(B), swapped back at
//! the end), so TCP does not read the frame again to checksum it.
//!
//! Two routines, chosen once at run time: four 64-octet accumulators (AVX-512F, VPCLMULQDQ,
//! SSE4.2), or four 16-octet ones (PCLMULQDQ, SSE4.2); without either (and off x86-64), and
//! below 64 octets, [`copy_crc32c`] copies, then runs the CRC over the copy.

use mpa::crc::Crc32c;

/// The iSCSI polynomial without its `x^32` term, normal (not reflected) bit order.
#[cfg(target_arch = "x86_64")]
const POLY: u64 = 0x1EDC_6F41;

/// `x^n mod P` as a normal-order 32-bit polynomial.
#[cfg(target_arch = "x86_64")]
const fn xpow_mod(n: u32) -> u64 {
    let mut r: u64 = 1;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= (1 << 32) | POLY;
        }
        i += 1;
    }
    r
}

/// `x^n mod P` as the 64-bit reflected operand of a carry-less multiply (coefficient of `x^d`
/// in bit `63 - d`).
#[cfg(target_arch = "x86_64")]
const fn fold_key(n: u32) -> u64 {
    xpow_mod(n).reverse_bits()
}

/// The two keys that move a 128-bit lane `d` bits on: for its low quadword and its high one.
#[cfg(target_arch = "x86_64")]
const fn fold_keys(d: u32) -> (u64, u64) {
    (fold_key(d + 63), fold_key(d - 1))
}

/// Copies `dst.len()` octets from `src` to `dst` and returns the CRC32c register `state`
/// ([`Crc32c::state`]) continued over them, reading each source octet once (the vector paths
/// never read `dst`; below their minimum length, or without the CPU features, the octets are
/// copied first and the CRC taken over `dst`, which the exclusive borrow keeps as written).
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` octets and must not overlap `dst`. Octets
/// written concurrently by another thread may be copied old or new, but the CRC always covers
/// exactly what was written to `dst`.
pub unsafe fn copy_crc32c(src: *const u8, dst: &mut [u8], state: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= x86::MIN_LEN {
        match x86::level() {
            // SAFETY (both): the features the routine is compiled for were detected on this
            // CPU; the caller guarantees `src` for `dst.len()` reads, not overlapping `dst`.
            x86::Level::Avx512 => {
                return unsafe { x86::copy_crc(src, dst.as_mut_ptr(), dst.len(), state) }
            }
            x86::Level::Sse => {
                return unsafe { x86::copy_crc_sse(src, dst.as_mut_ptr(), dst.len(), state) }
            }
            x86::Level::None => {}
        }
    }
    // SAFETY: as the caller guarantees.
    unsafe { copy_then_crc(src, dst, state) }
}

/// [`copy_crc32c`] that also returns the ones' complement sum of the octets copied, as
/// `tcp_engine::wire::Checksum::sum` gives it for `dst` (`dst[0]` the high-order octet of a
/// 16-bit word), computed from the registers the copy moves them through.
///
/// # Safety
/// As for [`copy_crc32c`].
pub unsafe fn copy_crc32c_sum(src: *const u8, dst: &mut [u8], state: u32) -> (u32, u16) {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= x86::MIN_LEN {
        let (c, le) = match x86::level() {
            // SAFETY (both): as in `copy_crc32c`.
            x86::Level::Avx512 => unsafe {
                x86::copy_crc_sum::<true, true>(src, dst.as_mut_ptr(), dst.len(), state)
            },
            x86::Level::Sse => unsafe {
                x86::copy_crc_sse_sum::<true, true>(src, dst.as_mut_ptr(), dst.len(), state)
            },
            x86::Level::None => {
                // SAFETY: as the caller guarantees.
                return unsafe { copy_then_crc_sum(src, dst, state) };
            }
        };
        return (c, fold_le(le));
    }
    // SAFETY: as the caller guarantees.
    unsafe { copy_then_crc_sum(src, dst, state) }
}

/// The CRC32c register `state` continued over `bytes`, and the ones' complement sum of
/// `bytes` (as `tcp_engine::wire::Checksum::sum` gives it, `bytes[0]` the high-order octet of
/// a 16-bit word), reading each octet once: [`copy_crc32c_sum`]'s loop without the stores. A
/// receiver verifies a segment's TCP checksum and an FPDU's CRC (RFC 5044 4.4) in the one read
/// of the payload this way, before anything is placed.
pub fn crc32c_sum(bytes: &[u8], state: u32) -> (u32, u16) {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() >= x86::MIN_LEN {
        let src = bytes.as_ptr();
        // Never written: the routines store only with `STORE`.
        let dst = src.cast_mut();
        let (c, le) = match x86::level() {
            // SAFETY (both): the features the routine is compiled for were detected on this
            // CPU; `src` is valid for `bytes.len()` reads; without `STORE` nothing is written
            // through `dst`.
            x86::Level::Avx512 => unsafe {
                x86::copy_crc_sum::<true, false>(src, dst, bytes.len(), state)
            },
            x86::Level::Sse => unsafe {
                x86::copy_crc_sse_sum::<true, false>(src, dst, bytes.len(), state)
            },
            x86::Level::None => return two_pass_crc_sum(bytes, state),
        };
        return (c, fold_le(le));
    }
    two_pass_crc_sum(bytes, state)
}

/// The portable fallback of [`crc32c_sum`]: a CRC pass, then a sum.
fn two_pass_crc_sum(bytes: &[u8], state: u32) -> (u32, u16) {
    (
        crc_update(state, bytes),
        tcp_engine::wire::Checksum::new().add_bytes(bytes).sum(),
    )
}

/// [`copy_crc32c`] from a slice: copies `src[..dst.len()]` into `dst` and returns the CRC32c
/// register continued over the copied octets. Safe: `src` and `dst` are distinct slices.
///
/// # Panics
/// If `src` is shorter than `dst`.
pub fn copy_crc32c_from(src: &[u8], dst: &mut [u8], state: u32) -> u32 {
    assert!(src.len() >= dst.len(), "source shorter than destination");
    // SAFETY: `src` holds at least `dst.len()` readable octets; a shared and a mutable borrow
    // cannot overlap.
    unsafe { copy_crc32c(src.as_ptr(), dst, state) }
}

/// [`copy_crc32c_sum`] from a slice (see [`copy_crc32c_from`]).
///
/// # Panics
/// If `src` is shorter than `dst`.
pub fn copy_crc32c_sum_from(src: &[u8], dst: &mut [u8], state: u32) -> (u32, u16) {
    assert!(src.len() >= dst.len(), "source shorter than destination");
    // SAFETY: as in `copy_crc32c_from`.
    unsafe { copy_crc32c_sum(src.as_ptr(), dst, state) }
}

/// Asks the CPU to bring the cache lines of `value` into its cache (x86-64 `prefetcht0` per
/// line); reads nothing visibly, does nothing elsewhere.
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = std::ptr::from_ref(value).cast::<i8>();
        let mut k = 0;
        while k < std::mem::size_of::<T>() {
            // SAFETY: `p + k` lies inside `value` (k < its size); a prefetch never faults and
            // neither reads nor writes memory visibly, and SSE (which defines it) is part of
            // the x86-64 baseline.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(k)) };
            k += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// The portable fallback of [`copy_crc32c_sum`]: a copy, then a CRC pass and a sum over `dst`.
///
/// # Safety
/// As for [`copy_crc32c`].
pub(crate) unsafe fn copy_then_crc_sum(src: *const u8, dst: &mut [u8], state: u32) -> (u32, u16) {
    // SAFETY: as the caller guarantees.
    let c = unsafe { copy_then_crc(src, dst, state) };
    (c, tcp_engine::wire::Checksum::new().add_bytes(dst).sum())
}

/// A sum of little-endian 32-bit words (carries in the upper bits) folded to the RFC 1071 sum
/// of the same octets as big-endian 16-bit words (RFC 1071 2(B), 2(C)).
#[inline]
fn fold_le(acc: u64) -> u16 {
    tcp_engine::wire::Checksum::from_le_sum(acc).sum()
}

/// The portable two-pass fallback: a copy, then a CRC pass over `dst`.
///
/// # Safety
/// As for [`copy_crc32c`].
pub(crate) unsafe fn copy_then_crc(src: *const u8, dst: &mut [u8], state: u32) -> u32 {
    // SAFETY: the caller guarantees `src` for `dst.len()` reads, not overlapping `dst`.
    unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
    crc_update(state, dst)
}

/// The CRC32c register `state` continued over `bytes`. The few octets of header, PAD and
/// Markers an FPDU adds go through the `crc32` instruction (SSE4.2, detected at run time)
/// without `crc-fast`'s per-call dispatch; longer runs, and other CPUs, through [`Crc32c`].
pub fn crc_update(state: u32, bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() <= x86::SMALL && std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: SSE4.2 was detected on this CPU.
        return unsafe { x86::crc_small(state, bytes) };
    }
    let mut crc = Crc32c::with_state(state);
    crc.update(bytes);
    crc.state()
}

/// The CRC32c register `state` continued over an FPDU's ULPDU_Length field (`len`, sent
/// big-endian, RFC 5044 4.1) followed by `head`: [`crc_update`] over the two in one call, the
/// length fed from the value rather than from octets just stored.
pub fn crc_update_len_head(state: u32, len: u16, head: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if head.len() <= x86::SMALL && std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: SSE4.2 was detected on this CPU.
        return unsafe { x86::crc_len_head(state, len, head) };
    }
    crc_update(crc_update(state, &len.to_be_bytes()), head)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::fold_keys;

    /// Below this the setup costs more than it saves; the caller uses the fallback.
    pub(crate) const MIN_LEN: usize = 64;
    /// Longest input [`crc_small`] is used for (one `crc32` chain of three-cycle steps).
    pub(crate) const SMALL: usize = 128;

    /// Four 64-octet accumulators: each moves 256 octets per step. Four 16-octet ones (the
    /// SSE routine): 64 octets per step, then 16.
    const K2048: (u64, u64) = fold_keys(2048);
    const K1536: (u64, u64) = fold_keys(1536);
    const K1024: (u64, u64) = fold_keys(1024);
    const K512: (u64, u64) = fold_keys(512);
    const K384: (u64, u64) = fold_keys(384);
    const K256: (u64, u64) = fold_keys(256);
    const K128: (u64, u64) = fold_keys(128);

    /// Which routine the CPU runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Level {
        /// [`copy_crc`]: AVX-512F, VPCLMULQDQ and SSE4.2.
        Avx512,
        /// [`copy_crc_sse`]: PCLMULQDQ and SSE4.2.
        Sse,
        /// Neither: the two-pass fallback.
        None,
    }

    /// 0: not yet checked, else 1 + the level.
    static LEVEL: AtomicU8 = AtomicU8::new(0);

    /// The CPU's [`Level`], detected once.
    pub(crate) fn level() -> Level {
        match LEVEL.load(Ordering::Relaxed) {
            1 => Level::Avx512,
            2 => Level::Sse,
            3 => Level::None,
            _ => {
                let sse =
                    is_x86_feature_detected!("pclmulqdq") && is_x86_feature_detected!("sse4.2");
                let (l, v) = if sse
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("vpclmulqdq")
                {
                    (Level::Avx512, 1)
                } else if sse {
                    (Level::Sse, 2)
                } else {
                    (Level::None, 3)
                };
                LEVEL.store(v, Ordering::Relaxed);
                l
            }
        }
    }

    /// The same key pair in every 128-bit lane.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn keys(k: (u64, u64)) -> __m512i {
        _mm512_set_epi64(
            k.1 as i64, k.0 as i64, k.1 as i64, k.0 as i64, k.1 as i64, k.0 as i64, k.1 as i64,
            k.0 as i64,
        )
    }

    /// Each lane of `acc` moved on by the keys' distance, XORed with `next`.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold(acc: __m512i, k: __m512i, next: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128::<0x00>(acc, k);
        let hi = _mm512_clmulepi64_epi128::<0x11>(acc, k);
        // 0x96: three-way XOR.
        _mm512_ternarylogic_epi64::<0x96>(lo, hi, next)
    }

    /// Loads 64 octets from `src + i`, stores them to `dst + i` if `STORE`, returns them.
    ///
    /// # Safety
    /// `src + i` valid for 64 octets, and with `STORE` `dst + i` too.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn move64<const STORE: bool>(src: *const u8, dst: *mut u8, i: usize) -> __m512i {
        // SAFETY: the caller guarantees 64 readable octets at `src + i` and, with `STORE`, 64
        // writable ones at `dst + i`; both intrinsics are unaligned.
        unsafe {
            let v = _mm512_loadu_si512(src.add(i).cast());
            if STORE {
                _mm512_storeu_si512(dst.add(i).cast(), v);
            }
            v
        }
    }

    /// The CRC register after the 64 octets of `z` from a zero register.
    #[inline]
    #[target_feature(enable = "avx512f,sse4.2")]
    fn reduce(z: __m512i) -> u32 {
        let mut c = 0u64;
        for q in [
            _mm512_extracti32x4_epi32::<0>(z),
            _mm512_extracti32x4_epi32::<1>(z),
            _mm512_extracti32x4_epi32::<2>(z),
            _mm512_extracti32x4_epi32::<3>(z),
        ] {
            c = _mm_crc32_u64(c, _mm_cvtsi128_si64(q) as u64);
            c = _mm_crc32_u64(c, _mm_extract_epi64::<1>(q) as u64);
        }
        c as u32
    }

    /// The CRC register `state` continued over `bytes`, eight octets per `crc32`.
    #[target_feature(enable = "sse4.2")]
    pub(crate) fn crc_small(state: u32, bytes: &[u8]) -> u32 {
        let mut c = u64::from(state);
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut q = [0u8; 8];
            q.copy_from_slice(w);
            c = _mm_crc32_u64(c, u64::from_le_bytes(q));
        }
        let mut c = c as u32;
        for &b in words.remainder() {
            c = _mm_crc32_u8(c, b);
        }
        c
    }

    /// [`crc_small`] over the big-endian octets of `len`, then `head`.
    #[target_feature(enable = "sse4.2")]
    pub(crate) fn crc_len_head(state: u32, len: u16, head: &[u8]) -> u32 {
        // `crc32` takes a 16-bit operand's low-order octet first: the wire's first octet
        // (the length's high-order one) goes low.
        let c = _mm_crc32_u16(state, len.swap_bytes());
        crc_small(c, head)
    }

    /// Copies octets `[i, len)` (fewer than 64) from `src` to `dst` eight at a time, the CRC
    /// register `c` continued over them with `crc32`.
    ///
    /// # Safety
    /// `src` valid for `len` reads, with `STORE` `dst` for `len` writes (else not written).
    ///
    /// With `SUM`, also adds the octets to `sum` as little-endian 32-bit words relative to
    /// `dst` (`i` is even: a multiple of 16), an odd octet at its place in a 16-bit word.
    #[inline]
    #[target_feature(enable = "sse4.2")]
    unsafe fn tail<const SUM: bool, const STORE: bool>(
        src: *const u8,
        dst: *mut u8,
        mut i: usize,
        len: usize,
        c: u32,
        sum: &mut u64,
    ) -> u32 {
        let mut c = u64::from(c);
        while i + 8 <= len {
            // SAFETY: `i + 8 <= len`; unaligned 8-octet access on both sides.
            let v = unsafe { src.add(i).cast::<u64>().read_unaligned() };
            if STORE {
                // SAFETY: as above.
                unsafe { dst.add(i).cast::<u64>().write_unaligned(v) };
            }
            c = _mm_crc32_u64(c, v);
            if SUM {
                *sum += (v & 0xffff_ffff) + (v >> 32);
            }
            i += 8;
        }
        let mut c = c as u32;
        while i < len {
            // SAFETY: `i < len`.
            let v = unsafe { src.add(i).read() };
            if STORE {
                // SAFETY: as above.
                unsafe { dst.add(i).write(v) };
            }
            c = _mm_crc32_u8(c, v);
            if SUM {
                *sum += u64::from(v) << (8 * (i & 1));
            }
            i += 1;
        }
        c
    }

    /// The 64-bit lanes' 32-bit halves of `v` added into `acc` (two lanes per input lane).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sum512(acc: __m512i, v: __m512i) -> __m512i {
        let lo = _mm512_and_si512(v, _mm512_set1_epi64(0xffff_ffff));
        // One addition on the accumulator's dependency chain per block.
        _mm512_add_epi64(acc, _mm512_add_epi64(lo, _mm512_srli_epi64::<32>(v)))
    }

    /// As [`sum512`] for 16 octets.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn sum128(acc: __m128i, v: __m128i) -> __m128i {
        let lo = _mm_and_si128(v, _mm_set1_epi64x(0xffff_ffff));
        _mm_add_epi64(acc, _mm_add_epi64(lo, _mm_srli_epi64::<32>(v)))
    }

    /// The key pair of a 128-bit fold.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn keys128(k: (u64, u64)) -> __m128i {
        _mm_set_epi64x(k.1 as i64, k.0 as i64)
    }

    /// `acc` moved on by the keys' distance, XORed with `next`.
    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    fn fold128(acc: __m128i, k: __m128i, next: __m128i) -> __m128i {
        let lo = _mm_clmulepi64_si128::<0x00>(acc, k);
        let hi = _mm_clmulepi64_si128::<0x11>(acc, k);
        _mm_xor_si128(_mm_xor_si128(lo, hi), next)
    }

    /// Loads 16 octets from `src + i`, stores them to `dst + i` if `STORE`, returns them.
    ///
    /// # Safety
    /// `src + i` valid for 16 octets, and with `STORE` `dst + i` too.
    #[inline]
    #[target_feature(enable = "sse2")]
    unsafe fn move16<const STORE: bool>(src: *const u8, dst: *mut u8, i: usize) -> __m128i {
        // SAFETY: the caller guarantees 16 readable octets at `src + i` and, with `STORE`, 16
        // writable ones at `dst + i`; both intrinsics are unaligned.
        unsafe {
            let v = _mm_loadu_si128(src.add(i).cast());
            if STORE {
                _mm_storeu_si128(dst.add(i).cast(), v);
            }
            v
        }
    }

    /// [`copy_crc`] for CPUs without AVX-512: four 16-octet accumulators.
    ///
    /// # Safety
    /// The CPU has PCLMULQDQ and SSE4.2; `src` is valid for `len >= MIN_LEN` reads, `dst` for
    /// `len` writes, and they do not overlap.
    #[target_feature(enable = "pclmulqdq,sse4.2")]
    pub(crate) unsafe fn copy_crc_sse(src: *const u8, dst: *mut u8, len: usize, state: u32) -> u32 {
        // SAFETY: as the caller guarantees.
        unsafe { copy_crc_sse_sum::<false, true>(src, dst, len, state).0 }
    }

    /// [`copy_crc_sse`], and with `SUM` the octets' sum as little-endian 32-bit words (else 0).
    ///
    /// # Safety
    /// As for [`copy_crc_sse`]; without `STORE` nothing is written through `dst` (it may be
    /// `src` itself) and only `src` need be valid, for `len` reads.
    #[target_feature(enable = "pclmulqdq,sse4.2")]
    pub(crate) unsafe fn copy_crc_sse_sum<const SUM: bool, const STORE: bool>(
        src: *const u8,
        dst: *mut u8,
        len: usize,
        state: u32,
    ) -> (u32, u64) {
        debug_assert!(len >= MIN_LEN);
        let mut s = _mm_setzero_si128();
        // SAFETY (all `move16` below): `i + 16 <= len` at each call.
        let (a0, mut b, mut c, mut d) = unsafe {
            (
                move16::<STORE>(src, dst, 0),
                move16::<STORE>(src, dst, 16),
                move16::<STORE>(src, dst, 32),
                move16::<STORE>(src, dst, 48),
            )
        };
        if SUM {
            s = sum128(sum128(sum128(sum128(s, a0), b), c), d);
        }
        let mut a = _mm_xor_si128(a0, _mm_cvtsi32_si128(state as i32));
        let mut i = 64;
        let k = keys128(K512);
        while i + 64 <= len {
            // SAFETY: `i + 64 <= len`.
            unsafe {
                let (va, vb, vc, vd) = (
                    move16::<STORE>(src, dst, i),
                    move16::<STORE>(src, dst, i + 16),
                    move16::<STORE>(src, dst, i + 32),
                    move16::<STORE>(src, dst, i + 48),
                );
                if SUM {
                    s = sum128(sum128(sum128(sum128(s, va), vb), vc), vd);
                }
                a = fold128(a, k, va);
                b = fold128(b, k, vb);
                c = fold128(c, k, vc);
                d = fold128(d, k, vd);
            }
            i += 64;
        }
        let k = keys128(K128);
        let mut x = fold128(a, keys128(K384), d);
        x = fold128(b, keys128(K256), x);
        x = fold128(c, k, x);
        while i + 16 <= len {
            // SAFETY: `i + 16 <= len`.
            let v = unsafe { move16::<STORE>(src, dst, i) };
            if SUM {
                s = sum128(s, v);
            }
            x = fold128(x, k, v);
            i += 16;
        }
        let r = _mm_crc32_u64(0, _mm_cvtsi128_si64(x) as u64);
        let r = _mm_crc32_u64(r, _mm_extract_epi64::<1>(x) as u64);
        let mut sum = (_mm_cvtsi128_si64(s) as u64).wrapping_add(_mm_extract_epi64::<1>(s) as u64);
        // SAFETY: `i <= len`, the same ranges as the caller's.
        let c = unsafe { tail::<SUM, STORE>(src, dst, i, len, r as u32, &mut sum) };
        (c, sum)
    }

    /// Copies `len >= MIN_LEN` octets from `src` to `dst` and returns the CRC register
    /// continued from `state` over them.
    ///
    /// # Safety
    /// The CPU has AVX-512F, VPCLMULQDQ and SSE4.2; `src` is valid for `len` reads, `dst` for
    /// `len` writes, and they do not overlap.
    #[target_feature(enable = "avx512f,vpclmulqdq,sse4.2")]
    pub(crate) unsafe fn copy_crc(src: *const u8, dst: *mut u8, len: usize, state: u32) -> u32 {
        // SAFETY: as the caller guarantees.
        unsafe { copy_crc_sum::<false, true>(src, dst, len, state).0 }
    }

    /// [`copy_crc`], and with `SUM` the octets' sum as little-endian 32-bit words (else 0),
    /// added up from the same registers.
    ///
    /// # Safety
    /// As for [`copy_crc`]; without `STORE` nothing is written through `dst` (it may be `src`
    /// itself) and only `src` need be valid, for `len` reads.
    #[target_feature(enable = "avx512f,vpclmulqdq,sse4.2")]
    pub(crate) unsafe fn copy_crc_sum<const SUM: bool, const STORE: bool>(
        src: *const u8,
        dst: *mut u8,
        len: usize,
        state: u32,
    ) -> (u32, u64) {
        debug_assert!(len >= MIN_LEN);
        let mut s = _mm512_setzero_si512();
        // The running register enters as an XOR on the first four octets.
        let seed = _mm512_castsi128_si512(_mm_cvtsi32_si128(state as i32));
        let seed = _mm512_maskz_mov_epi64(1, seed);
        let mut i;
        let mut z;
        if len >= 256 {
            // SAFETY (all `move64` below): `i + 64 <= len` at each call.
            let (a0, mut b, mut c, mut d) = unsafe {
                (
                    move64::<STORE>(src, dst, 0),
                    move64::<STORE>(src, dst, 64),
                    move64::<STORE>(src, dst, 128),
                    move64::<STORE>(src, dst, 192),
                )
            };
            // Four sums, one per block of the step, so that no chain of additions is longer
            // than the CRC folds'.
            let zero = _mm512_setzero_si512();
            let (mut sa, mut sb, mut sc, mut sd) = if SUM {
                (
                    sum512(zero, a0),
                    sum512(zero, b),
                    sum512(zero, c),
                    sum512(zero, d),
                )
            } else {
                (zero, zero, zero, zero)
            };
            let mut a = _mm512_xor_si512(a0, seed);
            i = 256;
            let k = keys(K2048);
            while i + 256 <= len {
                // SAFETY: `i + 256 <= len`.
                unsafe {
                    let (va, vb, vc, vd) = (
                        move64::<STORE>(src, dst, i),
                        move64::<STORE>(src, dst, i + 64),
                        move64::<STORE>(src, dst, i + 128),
                        move64::<STORE>(src, dst, i + 192),
                    );
                    if SUM {
                        sa = sum512(sa, va);
                        sb = sum512(sb, vb);
                        sc = sum512(sc, vc);
                        sd = sum512(sd, vd);
                    }
                    a = fold(a, k, va);
                    b = fold(b, k, vb);
                    c = fold(c, k, vc);
                    d = fold(d, k, vd);
                }
                i += 256;
            }
            if SUM {
                s = _mm512_add_epi64(_mm512_add_epi64(sa, sb), _mm512_add_epi64(sc, sd));
            }
            // a, b, c, d lie 192, 128, 64 and 0 octets before the end of what was read.
            z = fold(a, keys(K1536), d);
            z = fold(b, keys(K1024), z);
            z = fold(c, keys(K512), z);
        } else {
            // SAFETY: `len >= 64`.
            let v = unsafe { move64::<STORE>(src, dst, 0) };
            if SUM {
                s = sum512(s, v);
            }
            z = _mm512_xor_si512(v, seed);
            i = 64;
        }
        let k = keys(K512);
        while i + 64 <= len {
            // SAFETY: `i + 64 <= len`.
            let v = unsafe { move64::<STORE>(src, dst, i) };
            if SUM {
                s = sum512(s, v);
            }
            z = fold(z, k, v);
            i += 64;
        }
        let mut sum = if SUM {
            _mm512_reduce_add_epi64(s) as u64
        } else {
            0
        };
        // SAFETY: `i <= len`, the same ranges as the caller's.
        let c = unsafe { tail::<SUM, STORE>(src, dst, i, len, reduce(z), &mut sum) };
        (c, sum)
    }
}

/// A seeded pseudo-random source for the tests: each call gives a number below its argument
/// (a 64-bit LCG, the high bits).
#[cfg(test)]
fn test_rng(seed: u64) -> impl FnMut(usize) -> usize {
    let mut x = seed;
    move |m: usize| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize % m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpa::crc::crc32c;

    fn data(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    type Copy = unsafe fn(*const u8, &mut [u8], u32) -> u32;

    /// Copies `src[s..s + len]` to a destination at offset `d` with `copy`, the CRC continued
    /// from `split` octets fed before; checks the copy, the CRC against the reference and
    /// that nothing around the destination was touched.
    fn check(copy: Copy, src: &[u8], s: usize, d: usize, len: usize, split: usize) {
        let split = split.min(len);
        let mut crc = Crc32c::new();
        // The first `split` octets through the reference, the rest through `copy`.
        crc.update(&src[s..s + split]);
        let mut out = vec![0x5Au8; len + d + 80];
        let rest = len - split;
        // SAFETY: `src[s + split..]` holds at least `rest` octets; `out` is a separate vector.
        let state = unsafe {
            copy(
                src.as_ptr().add(s + split),
                &mut out[d..d + rest],
                crc.state(),
            )
        };
        assert_eq!(
            &out[d..d + rest],
            &src[s + split..s + len],
            "copy len {len} s {s} d {d}"
        );
        assert!(
            out[..d].iter().chain(&out[d + rest..]).all(|&b| b == 0x5A),
            "outside, len {len}"
        );
        assert_eq!(
            !state,
            crc32c(&src[s..s + len]),
            "crc len {len} s {s} d {d} split {split}"
        );
    }

    /// The vector routines called directly (the fallback below their minimum length).
    ///
    /// # Safety
    ///
    /// As [`copy_crc32c`]'s (`src` readable for `dst.len()` octets, not overlapping `dst`), and
    /// the CPU has AVX-512 (`x86::level()` is `Avx512`).
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512(src: *const u8, dst: &mut [u8], state: u32) -> u32 {
        if dst.len() < x86::MIN_LEN {
            // SAFETY: as the caller guarantees.
            return unsafe { copy_then_crc(src, dst, state) };
        }
        // SAFETY: only called when `x86::level()` is `Avx512`; ranges as the caller's.
        unsafe { x86::copy_crc(src, dst.as_mut_ptr(), dst.len(), state) }
    }

    /// # Safety
    ///
    /// As [`copy_crc32c`]'s, and `x86::level()` is not `None`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn sse(src: *const u8, dst: &mut [u8], state: u32) -> u32 {
        if dst.len() < x86::MIN_LEN {
            // SAFETY: as the caller guarantees.
            return unsafe { copy_then_crc(src, dst, state) };
        }
        // SAFETY: only called when `x86::level()` is not `None`; ranges as the caller's.
        unsafe { x86::copy_crc_sse(src, dst.as_mut_ptr(), dst.len(), state) }
    }

    /// Of one kind of routine, those this CPU can run: the dispatching one, the fallback, and
    /// each vector one its features allow (`vector`: the SSE and the AVX-512 routine).
    fn listed<T>(dispatch: T, fallback: T, vector: Option<(T, T)>) -> Vec<(&'static str, T)> {
        let mut r = vec![("dispatch", dispatch), ("fallback", fallback)];
        #[cfg(target_arch = "x86_64")]
        if let Some((sse, avx512)) = vector {
            let level = x86::level();
            if level != x86::Level::None {
                r.push(("sse", sse));
            }
            if level == x86::Level::Avx512 {
                r.push(("avx512", avx512));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = vector;
        r
    }

    /// The copying routines this CPU can run.
    fn routines() -> Vec<(&'static str, Copy)> {
        #[cfg(target_arch = "x86_64")]
        let vector = Some((sse as Copy, avx512 as Copy));
        #[cfg(not(target_arch = "x86_64"))]
        let vector = None;
        listed(copy_crc32c, copy_then_crc, vector)
    }

    #[test]
    fn fused_copy_matches_the_reference_for_every_length_and_alignment() {
        let src = data(4096 + 128, 7);
        let mut next = test_rng(0x1234_5678);
        let routines = routines();
        eprintln!(
            "routines: {:?}",
            routines.iter().map(|r| r.0).collect::<Vec<_>>()
        );
        for len in 0..=4096 {
            for &(_, copy) in &routines {
                let (s, d) = (next(64), next(64));
                check(copy, &src, s, d, len, 0);
                // The CRC continued from a state that is not the initial one.
                let split = next(len + 1);
                check(copy, &src, s, d, len, split);
            }
        }
    }

    type CopySum = unsafe fn(*const u8, &mut [u8], u32) -> (u32, u16);

    /// # Safety
    ///
    /// As [`avx512`]'s.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512_sum(src: *const u8, dst: &mut [u8], state: u32) -> (u32, u16) {
        if dst.len() < x86::MIN_LEN {
            // SAFETY: as the caller guarantees.
            return unsafe { copy_then_crc_sum(src, dst, state) };
        }
        // SAFETY: only called when `x86::level()` is `Avx512`; ranges as the caller's.
        let (c, le) =
            unsafe { x86::copy_crc_sum::<true, true>(src, dst.as_mut_ptr(), dst.len(), state) };
        (c, fold_le(le))
    }

    /// # Safety
    ///
    /// As [`sse`]'s.
    #[cfg(target_arch = "x86_64")]
    unsafe fn sse_sum(src: *const u8, dst: &mut [u8], state: u32) -> (u32, u16) {
        if dst.len() < x86::MIN_LEN {
            // SAFETY: as the caller guarantees.
            return unsafe { copy_then_crc_sum(src, dst, state) };
        }
        // SAFETY: only called when `x86::level()` is not `None`; ranges as the caller's.
        let (c, le) =
            unsafe { x86::copy_crc_sse_sum::<true, true>(src, dst.as_mut_ptr(), dst.len(), state) };
        (c, fold_le(le))
    }

    /// The summing routines this CPU can run, as [`routines`].
    fn sum_routines() -> Vec<(&'static str, CopySum)> {
        #[cfg(target_arch = "x86_64")]
        let vector = Some((sse_sum as CopySum, avx512_sum as CopySum));
        #[cfg(not(target_arch = "x86_64"))]
        let vector = None;
        listed(copy_crc32c_sum, copy_then_crc_sum, vector)
    }

    /// The summing copies give the same copy and CRC as the plain ones and the sum
    /// `tcp_engine::wire::Checksum` computes over the destination, for every length up to
    /// 4096 at random source and destination alignments, from any CRC state.
    #[test]
    fn summing_copies_match_the_reference_checksum_for_every_length_and_alignment() {
        use tcp_engine::wire::Checksum;
        // All ones somewhere: lanes that carry.
        let mut src = data(4096 + 128, 5);
        src[1000..1700].fill(0xff);
        let mut next = test_rng(0x5eed_0001);
        let routines = sum_routines();
        for len in 0..=4096 {
            for &(name, copy) in &routines {
                let (s, d) = (next(64), next(64));
                let state = next(1 << 20) as u32 ^ 0xFFFF_FFFF;
                let mut out = vec![0x5Au8; len + d + 80];
                // SAFETY: `src[s..]` holds at least `len` octets; `out` is a separate vector.
                let (crc, sum) = unsafe { copy(src.as_ptr().add(s), &mut out[d..d + len], state) };
                let what = format!("{name} len {len} s {s} d {d}");
                assert_eq!(&out[d..d + len], &src[s..s + len], "{what}");
                assert!(
                    out[..d].iter().chain(&out[d + len..]).all(|&b| b == 0x5A),
                    "{what}"
                );
                let mut want = Crc32c::with_state(state);
                want.update(&src[s..s + len]);
                assert_eq!(crc, want.state(), "crc {what}");
                assert_eq!(
                    sum,
                    Checksum::new().add_bytes(&src[s..s + len]).sum(),
                    "sum {what}"
                );
            }
        }
    }

    type ReadSum = fn(&[u8], u32) -> (u32, u16);

    /// The reading routines this CPU can run: the dispatch, the fallback and each vector
    /// routine without its stores.
    fn read_routines() -> Vec<(&'static str, ReadSum)> {
        #[cfg(target_arch = "x86_64")]
        fn sse(bytes: &[u8], state: u32) -> (u32, u16) {
            if bytes.len() < x86::MIN_LEN {
                return two_pass_crc_sum(bytes, state);
            }
            let src = bytes.as_ptr();
            // SAFETY: only listed when `x86::level()` is not `None`; `src` valid for
            // `bytes.len()` reads; nothing is stored without `STORE`.
            let (c, le) = unsafe {
                x86::copy_crc_sse_sum::<true, false>(src, src.cast_mut(), bytes.len(), state)
            };
            (c, fold_le(le))
        }
        #[cfg(target_arch = "x86_64")]
        fn avx512(bytes: &[u8], state: u32) -> (u32, u16) {
            if bytes.len() < x86::MIN_LEN {
                return two_pass_crc_sum(bytes, state);
            }
            let src = bytes.as_ptr();
            // SAFETY: only listed when `x86::level()` is `Avx512`; as in `sse`.
            let (c, le) = unsafe {
                x86::copy_crc_sum::<true, false>(src, src.cast_mut(), bytes.len(), state)
            };
            (c, fold_le(le))
        }
        #[cfg(target_arch = "x86_64")]
        let vector = Some((sse as ReadSum, avx512 as ReadSum));
        #[cfg(not(target_arch = "x86_64"))]
        let vector = None;
        listed(crc32c_sum, two_pass_crc_sum, vector)
    }

    /// The reading routines give the reference CRC and sum, and leave the input as it was,
    /// for every length up to 4096 at random alignments, from any CRC state.
    #[test]
    fn reading_crc_and_sum_match_the_reference_for_every_length_and_alignment() {
        use tcp_engine::wire::Checksum;
        let mut src = data(4096 + 128, 9);
        src[2000..2600].fill(0xff);
        let copy = src.clone();
        let mut next = test_rng(0x5eed_0002);
        let routines = read_routines();
        assert!(routines.len() >= 2);
        for len in 0..=4096 {
            for &(name, read) in &routines {
                let s = next(64);
                let state = next(1 << 20) as u32 ^ 0xFFFF_FFFF;
                let (crc, sum) = read(&src[s..s + len], state);
                let mut want = Crc32c::with_state(state);
                want.update(&src[s..s + len]);
                assert_eq!(crc, want.state(), "crc {name} len {len} s {s}");
                assert_eq!(
                    sum,
                    Checksum::new().add_bytes(&src[s..s + len]).sum(),
                    "sum {name} len {len} s {s}"
                );
            }
        }
        assert_eq!(src, copy, "input written");
    }

    /// `pages` readable and writable pages between two inaccessible ones: an access one octet
    /// before or after them faults.
    struct Guarded {
        base: *mut u8,
        len: usize,
    }

    /// The page size (4 KiB here; 16 or 64 KiB on some arm64 kernels).
    fn page() -> usize {
        // SAFETY: sysconf reads a constant of the system; no memory is involved.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n).unwrap_or(4096)
    }

    impl Guarded {
        fn new(pages: usize) -> Guarded {
            let page = page();
            let total = (pages + 2) * page;
            // SAFETY: a fresh anonymous private mapping; the result is checked.
            let map = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    total,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(map, libc::MAP_FAILED, "mmap");
            // SAFETY: the pages between the first and the last of the mapping just made.
            let base = unsafe { map.cast::<u8>().add(page) };
            let len = pages * page;
            // SAFETY: `base..base + len` lies inside the mapping.
            let rc =
                unsafe { libc::mprotect(base.cast(), len, libc::PROT_READ | libc::PROT_WRITE) };
            assert_eq!(rc, 0, "mprotect");
            Guarded { base, len }
        }

        /// `n` octets flush against the leading guard (`at_end` false) or the trailing one.
        fn slice(&mut self, n: usize, at_end: bool) -> &mut [u8] {
            assert!(n <= self.len);
            let start = if at_end { self.len - n } else { 0 };
            // SAFETY: `start..start + n` lies in the accessible pages, borrowed through `self`.
            unsafe { std::slice::from_raw_parts_mut(self.base.add(start), n) }
        }
    }

    impl Drop for Guarded {
        fn drop(&mut self) {
            let page = page();
            // SAFETY: the whole mapping `new` made, unmapped once.
            unsafe { libc::munmap(self.base.sub(page).cast(), self.len + 2 * page) };
        }
    }

    /// No routine reads a source octet, or writes a destination octet, outside its buffer:
    /// the buffers sit flush against inaccessible pages (before and after), so an over-read
    /// in a vector tail, which the comparisons above cannot see inside a page, faults. Every
    /// length up to 300, and lengths around the vector widths, a page and a jumbo frame.
    #[test]
    fn no_routine_reaches_past_its_buffers() {
        let mut src_pages = Guarded::new(4);
        let mut dst_pages = Guarded::new(4);
        let lens = (0..=300)
            .chain(500..=530)
            .chain(1020..=1040)
            .chain(4090..=4100)
            .chain(9000..=9010)
            .chain([16_383, 16_384]);
        let (copies, sums, reads) = (routines(), sum_routines(), read_routines());
        for len in lens {
            let want_data = data(len, len as u64);
            for (src_end, dst_end) in [(false, false), (true, true), (false, true), (true, false)] {
                let src = src_pages.slice(len, src_end);
                src.copy_from_slice(&want_data);
                let src: &[u8] = src;
                let want = crc32c(src);
                for &(name, read) in &reads {
                    assert_eq!(!read(src, !0).0, want, "{name} len {len}");
                }
                assert_eq!(!crc_update(!0, src), want, "crc_update len {len}");
                if len <= 300 {
                    let got = crc_update_len_head(0x1234_5678, 7, src);
                    let mut c = Crc32c::with_state(0x1234_5678);
                    c.update(&7u16.to_be_bytes());
                    c.update(src);
                    assert_eq!(got, c.state(), "crc_update_len_head len {len}");
                }
                for &(name, copy) in &copies {
                    let dst = dst_pages.slice(len, dst_end);
                    // SAFETY: `src` holds `len` readable octets in another mapping.
                    let crc = unsafe { copy(src.as_ptr(), dst, !0) };
                    assert_eq!((!crc, &*dst), (want, src), "{name} len {len}");
                }
                for &(name, copy) in &sums {
                    let dst = dst_pages.slice(len, dst_end);
                    // SAFETY: as above.
                    let (crc, _) = unsafe { copy(src.as_ptr(), dst, !0) };
                    assert_eq!((!crc, &*dst), (want, src), "{name} len {len}");
                }
            }
        }
    }

    #[test]
    fn small_updates_match_the_reference() {
        let src = data(600, 11);
        for len in 0..=300 {
            for s in [0, 1, 7, 13] {
                let mut want = Crc32c::new();
                want.update(&src[..s]);
                let before = want.state();
                want.update(&src[s..s + len]);
                assert_eq!(
                    crc_update(before, &src[s..s + len]),
                    want.state(),
                    "len {len}"
                );
            }
        }
    }

    #[test]
    fn length_and_header_updates_match_the_reference() {
        let src = data(200, 5);
        for head_len in 0..=130 {
            for len in [0u16, 1, 0x00ff, 0x0100, 0x1234, 0xfedc, u16::MAX] {
                for state in [0u32, 0xFFFF_FFFF, 0x1234_5678] {
                    let mut want = Crc32c::with_state(state);
                    want.update(&len.to_be_bytes());
                    want.update(&src[..head_len]);
                    assert_eq!(
                        crc_update_len_head(state, len, &src[..head_len]),
                        want.state(),
                        "head {head_len} len {len:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn vector_routines_continue_any_state() {
        let src = data(1200, 3);
        for (name, copy) in routines() {
            for len in 0..=1100 {
                for state in [0u32, 0xFFFF_FFFF, 0x1234_5678] {
                    let mut out = vec![0u8; len];
                    // SAFETY: `src` holds 1200 >= len octets and `out` is a separate vector.
                    let got = unsafe { copy(src.as_ptr(), &mut out, state) };
                    let mut want = Crc32c::with_state(state);
                    want.update(&src[..len]);
                    assert_eq!(got, want.state(), "{name} len {len} state {state:#x}");
                    assert_eq!(out, &src[..len], "{name}");
                }
            }
        }
    }

    #[test]
    fn fold_keys_are_powers_of_x() {
        // x^32 mod P is P's low part; multiplying by x 32 more times agrees with squaring.
        assert_eq!(xpow_mod(32), POLY);
        assert_eq!(xpow_mod(0), 1);
        assert_eq!(xpow_mod(31), 1 << 31);
        let sq = clmul_mod(xpow_mod(100), xpow_mod(100));
        assert_eq!(sq, xpow_mod(200));
    }

    /// `a * b mod P`, normal bit order, bit by bit.
    fn clmul_mod(a: u64, b: u64) -> u64 {
        let mut r = 0u64;
        for i in (0..32).rev() {
            r <<= 1;
            if r & (1 << 32) != 0 {
                r ^= (1 << 32) | POLY;
            }
            if b & (1 << i) != 0 {
                r ^= a;
            }
        }
        r
    }
}
