//! SYN cookies (RFC 4987 section 3.6): when a listener's queue of half-open connections is
//! full, the SYN-ACK's sequence number carries what the connection needs and no state is
//! kept; the ACK that completes the handshake brings it back, and only then is a connection
//! made. A flood of spoofed SYNs then costs a SYN-ACK each, never memory.
//!
//! The sequence number, as Linux's `secure_tcp_syn_cookie` lays it out:
//! `H1(tuple) + peer ISN + (minute << 24) + ((H2(tuple, minute) + MSS index) mod 2^24)`, with
//! `H1` and `H2` SipHash-2-4 under the table's ISN secret. A cookie is good in the minute it
//! was made and the [`MAX_AGE_MINUTES`] after (two to three minutes). The MSS is one of [`MSS_TABLE`] (2 bits).
//!
//! Window scale and SACK-permitted ride in the low 6 bits of the SYN-ACK's TSval, as Linux's
//! `cookie_init_timestamp` does: bits 0-3 the peer's window shift (15: none), bit 4 SACK; the
//! peer echoes them in TSecr. Without timestamps there is nowhere to keep them, so a cookie
//! SYN-ACK to a peer that sent no timestamp offers neither window scaling nor SACK.

use crate::isn::IsnGenerator;
use crate::wire::FourTuple;

/// The MSS values a cookie can carry: the largest not above the peer's is used.
pub const MSS_TABLE: [u16; 4] = [536, 1300, 1460, 8960];
/// How many minutes after the one it was made in a cookie stays good (so two to three
/// minutes in all).
pub const MAX_AGE_MINUTES: u32 = 2;
/// TSval bits that carry options.
const TS_OPTION_BITS: u32 = 6;
const TS_OPTION_MASK: u32 = (1 << TS_OPTION_BITS) - 1;
const TS_NO_WSCALE: u32 = 0xf;
const TS_SACK: u32 = 1 << 4;

/// The index in [`MSS_TABLE`] of the largest MSS not above `peer_mss`.
pub fn mss_index(peer_mss: u16) -> u8 {
    MSS_TABLE.iter().rposition(|&m| m <= peer_mss).unwrap_or(0) as u8
}

/// The ISN of a cookie SYN-ACK for a SYN on `tuple` (as seen by us) with sequence number
/// `peer_isn`, at `minute` (any clock in minutes; only its low 8 bits are kept).
pub fn encode(
    isn: &IsnGenerator,
    tuple: &FourTuple,
    peer_isn: u32,
    minute: u32,
    mss_index: u8,
) -> u32 {
    let (h1, h2) = isn.cookie_hashes(tuple, minute & 0xff);
    h1.wrapping_add(peer_isn)
        .wrapping_add((minute & 0xff) << 24)
        .wrapping_add(h2.wrapping_add(u32::from(mss_index & 3)) & 0x00ff_ffff)
}

/// Checks the cookie an ACK brings back (its acknowledgment number less one) for `tuple` and
/// the peer's ISN (the ACK's sequence number less one) at `minute`: the MSS index if it is
/// ours and at most [`MAX_AGE_MINUTES`] old.
pub fn check(
    isn: &IsnGenerator,
    tuple: &FourTuple,
    peer_isn: u32,
    cookie: u32,
    minute: u32,
) -> Option<u8> {
    let (h1, _) = isn.cookie_hashes(tuple, 0);
    let rest = cookie.wrapping_sub(h1).wrapping_sub(peer_isn);
    let made = rest >> 24;
    if (minute & 0xff).wrapping_sub(made) & 0xff > MAX_AGE_MINUTES {
        return None;
    }
    let (_, h2) = isn.cookie_hashes(tuple, made);
    let data = rest.wrapping_sub(h2) & 0x00ff_ffff;
    (data < MSS_TABLE.len() as u32).then_some(data as u8)
}

/// The TSval of a cookie SYN-ACK at timestamp clock `ts_now`: its low bits carry the peer's
/// window shift (`None`: the peer offered no scaling) and SACK-permitted. Never later than
/// `ts_now` (the clock must not run backwards for the peer, RFC 7323 5.4).
pub fn encode_timestamp(ts_now: u32, peer_wscale: Option<u8>, sack: bool) -> u32 {
    let mut options = peer_wscale.map_or(TS_NO_WSCALE, |s| u32::from(s.min(14)));
    if sack {
        options |= TS_SACK;
    }
    let ts = (ts_now & !TS_OPTION_MASK) | options;
    if ts > ts_now {
        ts.wrapping_sub(1 << TS_OPTION_BITS)
    } else {
        ts
    }
}

/// What a cookie SYN-ACK's TSval, echoed in an ACK's TSecr, said: the peer's window shift
/// and SACK-permitted.
pub fn decode_timestamp(tsecr: u32) -> (Option<u8>, bool) {
    let wscale = tsecr & 0xf;
    let wscale = (wscale != TS_NO_WSCALE).then(|| wscale.min(14) as u8);
    (wscale, tsecr & TS_SACK != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::net::Ipv4Addr;

    fn tuple(port: u16) -> FourTuple {
        FourTuple {
            local_addr: Ipv4Addr::new(10, 0, 0, 1),
            local_port: 5000,
            remote_addr: Ipv4Addr::new(10, 0, 0, 2),
            remote_port: port,
        }
    }

    #[test]
    fn a_cookie_comes_back_with_its_mss_in_its_minute_and_two_after() {
        let g = IsnGenerator::new([9; 16]);
        for idx in 0..4u8 {
            let c = encode(&g, &tuple(40_000), 0xdead_beef, 1000, idx);
            for minute in 1000..=1000 + MAX_AGE_MINUTES {
                assert_eq!(check(&g, &tuple(40_000), 0xdead_beef, c, minute), Some(idx));
            }
            assert_eq!(check(&g, &tuple(40_000), 0xdead_beef, c, 1003), None);
            // The minute counter wraps at 256 without harm.
            let c = encode(&g, &tuple(40_000), 7, 255, idx);
            assert_eq!(check(&g, &tuple(40_000), 7, c, 256), Some(idx));
        }
    }

    #[test]
    fn a_cookie_is_bound_to_its_tuple_isn_and_secret() {
        let g = IsnGenerator::new([9; 16]);
        let c = encode(&g, &tuple(40_000), 100, 5, 2);
        assert_eq!(check(&g, &tuple(40_001), 100, c, 5), None);
        // (An ISN off by less than the MSS table's size only shifts the index, as in Linux's
        // layout: the ISN is not secret, the hashes are.)
        assert_eq!(check(&g, &tuple(40_000), 1100, c, 5), None);
        assert_eq!(
            check(&IsnGenerator::new([8; 16]), &tuple(40_000), 100, c, 5),
            None
        );
        // Guessing: of 100,000 random cookies for one tuple, about 4 in 2^24 per minute
        // window pass (data < 4 in 24 bits, three minutes): none expected.
        let mut x = 0x1234_5678u32;
        let passed = (0..100_000)
            .filter(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                check(&g, &tuple(40_000), 100, x, 5).is_some()
            })
            .count();
        assert!(passed <= 1, "{passed} guessed cookies passed");
    }

    #[test]
    fn mss_takes_the_largest_entry_not_above_the_peers() {
        assert_eq!(MSS_TABLE[usize::from(mss_index(1460))], 1460);
        assert_eq!(MSS_TABLE[usize::from(mss_index(1459))], 1300);
        assert_eq!(MSS_TABLE[usize::from(mss_index(9000))], 8960);
        assert_eq!(MSS_TABLE[usize::from(mss_index(100))], 536);
    }

    #[test]
    fn options_ride_in_the_timestamp_without_moving_the_clock_forward() {
        for now in [0u32, 63, 64, 1_000_000, u32::MAX] {
            for (wscale, sack) in [
                (None, false),
                (Some(7), true),
                (Some(0), false),
                (Some(14), true),
            ] {
                let ts = encode_timestamp(now, wscale, sack);
                assert!(ts <= now || now < 64, "{ts} > {now}");
                assert!(now.wrapping_sub(ts) < 128);
                assert_eq!(decode_timestamp(ts), (wscale, sack));
            }
        }
    }
}
