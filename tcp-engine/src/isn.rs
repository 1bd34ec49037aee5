//! Initial sequence numbers (RFC 9293 3.4.1, RFC 6528):
//! `ISN = M + F(localip, localport, remoteip, remoteport, secretkey)` where
//! `M` is a 4-microsecond clock and `F` is SipHash-2-4 keyed with a secret
//! the caller supplies (and should draw from a CSPRNG at start-up).

use crate::time::Instant;
use crate::wire::FourTuple;

/// Keyed ISN generator. Also derives the per-connection timestamp offset
/// (RFC 7323 5.4 recommends a random offset per connection).
#[derive(Clone)]
pub struct IsnGenerator {
    k0: u64,
    k1: u64,
}

impl core::fmt::Debug for IsnGenerator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("IsnGenerator { key: <secret> }")
    }
}

impl IsnGenerator {
    /// A generator keyed with a 128-bit secret.
    pub fn new(key: [u8; 16]) -> Self {
        let mut a = [0u8; 8];
        let mut b = [0u8; 8];
        a.copy_from_slice(&key[..8]);
        b.copy_from_slice(&key[8..]);
        IsnGenerator {
            k0: u64::from_le_bytes(a),
            k1: u64::from_le_bytes(b),
        }
    }

    fn hash_tuple(&self, t: &FourTuple, domain: u8) -> u64 {
        let mut m = [0u8; 13];
        m[..4].copy_from_slice(&t.local_addr.octets());
        m[4..6].copy_from_slice(&t.local_port.to_be_bytes());
        m[6..10].copy_from_slice(&t.remote_addr.octets());
        m[10..12].copy_from_slice(&t.remote_port.to_be_bytes());
        m[12] = domain;
        siphash24(self.k0, self.k1, &m)
    }

    /// The ISN for a connection on `tuple` opened at `now`.
    pub fn isn(&self, tuple: &FourTuple, now: Instant) -> u32 {
        let m = (now.as_micros() / 4) as u32;
        m.wrapping_add(self.hash_tuple(tuple, 0) as u32)
    }

    /// The two keyed hashes of a SYN cookie ([`crate::syncookie`]) for `tuple`: one of the
    /// tuple alone, one of the tuple and the cookie's `minute`.
    pub fn cookie_hashes(&self, tuple: &FourTuple, minute: u32) -> (u32, u32) {
        let h1 = self.hash_tuple(tuple, 2) as u32;
        let mut m = [0u8; 16];
        m[..4].copy_from_slice(&tuple.local_addr.octets());
        m[4..6].copy_from_slice(&tuple.local_port.to_be_bytes());
        m[6..10].copy_from_slice(&tuple.remote_addr.octets());
        m[10..12].copy_from_slice(&tuple.remote_port.to_be_bytes());
        m[12..].copy_from_slice(&minute.to_be_bytes());
        // Domain 3: `hash_tuple` uses 0 to 2 over 13 octets; this message has 16.
        let h2 = siphash24(self.k0 ^ 3, self.k1, &m) as u32;
        (h1, h2)
    }

    /// A keyed hash of `value`, for the table's other secrets (the challenge-ACK budget of
    /// each second).
    pub fn keyed(&self, value: u64) -> u64 {
        // Domain 4 (a key of its own): `hash_tuple` and `cookie_hashes` use 0 to 3.
        siphash24(self.k0 ^ 4, self.k1, &value.to_be_bytes())
    }

    /// The timestamp-clock offset for a connection on `tuple`.
    pub fn timestamp_offset(&self, tuple: &FourTuple) -> u32 {
        self.hash_tuple(tuple, 1) as u32
    }
}

/// SipHash-2-4 (Aumasson and Bernstein), 64-bit output.
pub fn siphash24(k0: u64, k1: u64, msg: &[u8]) -> u64 {
    let mut v0 = k0 ^ 0x736f_6d65_7073_6575;
    let mut v1 = k1 ^ 0x646f_7261_6e64_6f6d;
    let mut v2 = k0 ^ 0x6c79_6765_6e65_7261;
    let mut v3 = k1 ^ 0x7465_6462_7974_6573;
    let round = |v0: &mut u64, v1: &mut u64, v2: &mut u64, v3: &mut u64| {
        *v0 = v0.wrapping_add(*v1);
        *v1 = v1.rotate_left(13);
        *v1 ^= *v0;
        *v0 = v0.rotate_left(32);
        *v2 = v2.wrapping_add(*v3);
        *v3 = v3.rotate_left(16);
        *v3 ^= *v2;
        *v0 = v0.wrapping_add(*v3);
        *v3 = v3.rotate_left(21);
        *v3 ^= *v0;
        *v2 = v2.wrapping_add(*v1);
        *v1 = v1.rotate_left(17);
        *v1 ^= *v2;
        *v2 = v2.rotate_left(32);
    };
    let mut chunks = msg.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let m = u64::from_le_bytes(w);
        v3 ^= m;
        round(&mut v0, &mut v1, &mut v2, &mut v3);
        round(&mut v0, &mut v1, &mut v2, &mut v3);
        v0 ^= m;
    }
    let rem = chunks.remainder();
    let mut last = [0u8; 8];
    last[..rem.len()].copy_from_slice(rem);
    last[7] = msg.len() as u8;
    let m = u64::from_le_bytes(last);
    v3 ^= m;
    round(&mut v0, &mut v1, &mut v2, &mut v3);
    round(&mut v0, &mut v1, &mut v2, &mut v3);
    v0 ^= m;
    v2 ^= 0xff;
    for _ in 0..4 {
        round(&mut v0, &mut v1, &mut v2, &mut v3);
    }
    v0 ^ v1 ^ v2 ^ v3
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    #[test]
    fn siphash_reference_vector() {
        // Reference vector from the SipHash paper: key 00..0f, message 00..0e.
        let k0 = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        let k1 = u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]);
        let msg: Vec<u8> = (0u8..15).collect();
        assert_eq!(siphash24(k0, k1, &msg), 0xa129_ca61_49be_45e5);
    }

    #[test]
    fn isn_depends_on_tuple_key_and_clock() {
        let t = FourTuple {
            local_addr: Ipv4Addr::new(1, 1, 1, 1),
            local_port: 1,
            remote_addr: Ipv4Addr::new(2, 2, 2, 2),
            remote_port: 2,
        };
        let mut t2 = t;
        t2.remote_port = 3;
        let g = IsnGenerator::new([7; 16]);
        let g2 = IsnGenerator::new([8; 16]);
        assert_ne!(g.isn(&t, Instant::ZERO), g.isn(&t2, Instant::ZERO));
        assert_ne!(g.isn(&t, Instant::ZERO), g2.isn(&t, Instant::ZERO));
        let later = Instant::from_micros(400);
        assert_eq!(g.isn(&t, later).wrapping_sub(g.isn(&t, Instant::ZERO)), 100);
    }
}
