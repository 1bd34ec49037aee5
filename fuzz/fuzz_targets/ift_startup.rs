//! IFT's adaption indication and exchange (draft-williams-iwarp-ift-01 section 4).
//!
//! Input: a mode octet (its top bit: repair the CRC), then per mode:
//! - 0, indication: `IndicationRepr::parse_bytes` on the rest. A parsed indication re-emits
//!   to the same octets but the reserved flag bits and octets (which it clears) and parses
//!   back to itself; one that fails fails for the magic, the CRC or the BC version.
//! - 1, Responder / 2, Initiator: a config from the input, then the rest fed as the peer's
//!   indication in pieces sized by the input, with time moving on. Asserts: it never takes
//!   more than 64 octets and, while it needs more, takes all it is given; when it decides,
//!   the 64 octets it took parse, and the outcome follows the rules (R agrees, the phase is
//!   the other side's, the policy holds, VTags cross); a Responder's phase 1 parses and says
//!   our config; an error is final and repeated, and has a reason (a timeout, a wrong magic
//!   number, or an indication that fails to parse or to meet those rules: an acceptable one
//!   is never refused).
//!
//! With the repair bit, the first 64 octets of what is parsed or fed (when there are as many)
//! get their CRC field recomputed over the 60 before it (section 4.1), as `segment_parser`
//! repairs checksums: a mutation of a flag or the VTag then still reaches the policy and the
//! outcome rules instead of failing the CRC.
//!
//! Nothing may panic.
#![no_main]

use std::time::{Duration, Instant};

use ift::wire::{IndicationRepr, Phase, INDICATION_LEN};
use ift::{CrcPolicy, IftConfig, IftError, Initiator, Negotiated, Responder};
use iwarp_fuzz::Input;
use libfuzzer_sys::fuzz_target;

fn config(input: &mut Input) -> IftConfig {
    let f = input.u16();
    IftConfig {
        rdma: f & 1 == 0,
        header_crc: f & 2 != 0,
        payload_crc: f & 4 != 0,
        check_crcs: f & 8 == 0,
        accept: CrcPolicy {
            require_header_crc: f & 16 != 0,
            require_payload_crc: f & 32 != 0,
            require_checked: f & 64 != 0,
        },
        allow_speculative: f & 128 != 0,
        vtag: input.u16(),
        timeout: Duration::from_millis(u64::from(input.u16())),
    }
}

fn indication(bytes: &[u8]) {
    let Some(parsed) = IndicationRepr::parse_bytes(bytes) else {
        assert!(bytes.len() < INDICATION_LEN);
        return;
    };
    match parsed {
        Ok(repr) => {
            let out = repr.to_bytes();
            assert_eq!(out[..8], bytes[..8], "magic or versions changed");
            let mask = ift::wire::flags::DEFINED.to_be_bytes();
            for i in 0..4 {
                assert_eq!(out[8 + i], bytes[8 + i] & mask[i], "flags changed");
            }
            assert_eq!(out[12..16], bytes[12..16], "VTag or interval changed");
            assert!(out[16..60].iter().all(|&b| b == 0));
            assert_eq!(IndicationRepr::parse_bytes(&out), Some(Ok(repr)));
        }
        Err(e) => assert!(
            matches!(
                e,
                IftError::BadMagic { .. }
                    | IftError::IndicationCrc { .. }
                    | IftError::IncompatibleVersion { .. }
            ),
            "{e:?}"
        ),
    }
}

/// The rules of section 4.2 for `ours` given the peer's indication `peer`.
fn check_outcome(ours: &IftConfig, peer: &IndicationRepr, n: &Negotiated) {
    assert_eq!(peer.rdma, ours.rdma);
    assert_eq!(n.rdma, ours.rdma);
    assert!(peer.bc_version <= 1);
    assert_eq!((n.tx.vtag, n.rx.vtag), (peer.vtag, ours.vtag));
    assert_eq!(
        (n.tx.header_crc, n.tx.payload_crc),
        (ours.header_crc, ours.payload_crc)
    );
    assert_eq!(
        (n.rx.header_crc, n.rx.payload_crc),
        (peer.header_crc, peer.payload_crc)
    );
    assert_eq!(n.rx.verify, ours.check_crcs);
    assert_eq!(n.may_speculate, peer.speculative);
    if ours.accept.require_header_crc {
        assert!(peer.header_crc);
    }
    if ours.accept.require_payload_crc {
        assert!(peer.payload_crc);
    }
    if ours.accept.require_checked {
        assert!(!(ours.header_crc && peer.ignores_header_crc));
        assert!(!(ours.payload_crc && peer.ignores_payload_crc));
    }
}

/// An exchange that failed with `e` after `fed` (every octet given so far) had a reason to: a
/// timeout, a magic number other than "RDDP", or a whole indication that is not an acceptable
/// one of the phase `expected` (it does not parse: CRC, BC version; another phase; R differs;
/// the policy refuses its CRC choices).
fn check_refusal(ours: &IftConfig, expected: Phase, fed: &[u8], e: &IftError) {
    if *e == IftError::StartupTimeout {
        return;
    }
    let Some(parsed) = IndicationRepr::parse_bytes(fed) else {
        assert!(
            fed.len() >= 4 && fed[..4] != *b"RDDP",
            "refused {} octets of an indication that starts right: {e:?}",
            fed.len()
        );
        return;
    };
    let Ok(peer) = parsed else {
        return;
    };
    assert!(
        !iwarp_fuzz::ift_acceptable(ours, &peer, expected),
        "refused an acceptable indication {peer:?}: {e:?}"
    );
}

fn exchange(input: &mut Input, responder: bool, repair: bool) {
    let cfg = config(input);
    let mut now = Instant::now();
    let mut resp = Responder::new(cfg.clone(), now);
    let mut init = Initiator::new(cfg.clone(), now);
    if !responder {
        let ours = IndicationRepr::parse_bytes(init.indication())
            .unwrap()
            .unwrap();
        assert_eq!(ours, cfg.indication(Phase::Zero));
    }
    let sizes: Vec<u8> = input.bytes(16).to_vec();
    let mut stream = input.rest().to_vec();
    if repair {
        repair_crc(&mut stream);
    }
    let mut taken = Vec::new();
    let mut at = 0;
    for (k, &size) in sizes.iter().enumerate() {
        let piece = &stream[at..(at + usize::from(size % 80)).min(stream.len())];
        now += Duration::from_millis(u64::from(size >> 5) * 100);
        let res = if responder {
            resp.feed(piece, now)
                .map(|(u, d)| (u, d.map(|(n, reply)| (n, Some(reply)))))
        } else {
            init.feed(piece, now)
                .map(|(u, d)| (u, d.map(|n| (n, None))))
        };
        match res {
            Ok((used, None)) => {
                assert_eq!(used, piece.len(), "needs more but left octets");
                taken.extend_from_slice(piece);
                at += used;
                assert!(taken.len() < INDICATION_LEN);
            }
            Ok((used, Some((n, reply)))) => {
                assert!(used <= piece.len());
                taken.extend_from_slice(&piece[..used]);
                assert_eq!(taken.len(), INDICATION_LEN, "decided on a part");
                let peer = IndicationRepr::parse_bytes(&taken).unwrap().unwrap();
                let expected = if responder { Phase::Zero } else { Phase::One };
                assert_eq!(peer.phase, expected);
                check_outcome(&cfg, &peer, &n);
                if let Some(reply) = reply {
                    let r = IndicationRepr::parse_bytes(&reply).unwrap().unwrap();
                    assert_eq!(r, cfg.indication(Phase::One));
                }
                return;
            }
            Err(e) => {
                let expected = if responder { Phase::Zero } else { Phase::One };
                let fed = [&taken[..], piece].concat();
                check_refusal(&cfg, expected, &fed, &e);
                let again = if responder {
                    resp.feed(piece, now).err()
                } else {
                    init.feed(piece, now).err()
                };
                assert_eq!(again, Some(e), "error not repeated");
                return;
            }
        }
        if k > 0 && at >= stream.len() {
            return;
        }
    }
}

/// Recomputes the CRC of the indication at the start of `bytes` (if it is whole).
fn repair_crc(bytes: &mut [u8]) {
    if bytes.len() >= INDICATION_LEN {
        let crc = iwarp_fuzz::crc32c(&bytes[..60]);
        bytes[60..64].copy_from_slice(&crc.to_le_bytes());
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let mode = input.u8();
    let repair = mode & 0x80 != 0;
    match (mode & 0x7F) % 3 {
        0 => {
            let mut bytes = input.rest().to_vec();
            if repair {
                repair_crc(&mut bytes);
            }
            indication(&bytes)
        }
        1 => exchange(&mut input, true, repair),
        _ => exchange(&mut input, false, repair),
    }
});
