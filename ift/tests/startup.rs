//! The adaption exchange (draft section 4): both ends agreeing, every flag rule, the version
//! rules, a bad CRC, the wrong phase, an MPA peer, the deadline.

use std::time::{Duration, Instant};

use ift::wire::{IndicationRepr, Phase, INDICATION_LEN};
use ift::{CrcPolicy, IftConfig, IftError, Initiator, Negotiated, Responder};

fn run(a: IftConfig, b: IftConfig) -> (Result<Negotiated, IftError>, Result<Negotiated, IftError>) {
    let now = Instant::now();
    let mut init = Initiator::new(a, now);
    let mut resp = Responder::new(b, now);
    let phase0 = init.indication().to_vec();
    let (reply, rn) = match resp.feed(&phase0, now) {
        Ok((used, Some((n, reply)))) => {
            assert_eq!(used, INDICATION_LEN);
            (reply, n)
        }
        Ok((_, None)) => panic!("a whole phase 0 left the responder waiting"),
        Err(e) => return (Err(e.clone()), Err(e)),
    };
    let i = match init.feed(&reply, now) {
        Ok((used, Some(n))) => {
            assert_eq!(used, INDICATION_LEN);
            Ok(n)
        }
        Ok((_, None)) => panic!("a whole phase 1 left the initiator waiting"),
        Err(e) => Err(e),
    };
    (i, Ok(rn))
}

#[test]
fn both_ends_agree_on_vtags_crcs_and_speculation() {
    let a = IftConfig::with_vtag(0x1111);
    let b = IftConfig {
        payload_crc: false,
        allow_speculative: false,
        ..IftConfig::with_vtag(0x2222)
    };
    let (i, r) = run(a, b);
    let (i, r) = (i.unwrap(), r.unwrap());
    // Each side's frames carry the other's VTag and its own CRC choice.
    assert_eq!((i.tx.vtag, r.rx.vtag), (0x2222, 0x2222));
    assert_eq!((r.tx.vtag, i.rx.vtag), (0x1111, 0x1111));
    assert_eq!((i.tx.header_crc, i.tx.payload_crc), (true, true));
    assert_eq!((r.rx.header_crc, r.rx.payload_crc), (true, true));
    assert_eq!((r.tx.header_crc, r.tx.payload_crc), (true, false));
    assert_eq!((i.rx.header_crc, i.rx.payload_crc), (true, false));
    assert!(i.rx.verify && r.rx.verify);
    // SP is permission for the other end.
    assert!(!i.may_speculate, "B did not allow speculation");
    assert!(r.may_speculate, "A allowed it");
    assert!(i.rdma && r.rdma);
}

#[test]
fn ddp_mode_when_both_clear_r_and_an_error_when_they_disagree() {
    let ddp = |v| IftConfig {
        rdma: false,
        ..IftConfig::with_vtag(v)
    };
    let (i, r) = run(ddp(1), ddp(2));
    assert!(!i.unwrap().rdma && !r.unwrap().rdma);
    let (i, r) = run(IftConfig::with_vtag(1), ddp(2));
    let e = IftError::ModeMismatch {
        ours: false,
        theirs: true,
    };
    assert_eq!((i, r), (Err(e.clone()), Err(e)));
    // The responder finds the disagreement in phase 0 and answers nothing.
    let (_, r) = run(ddp(1), IftConfig::with_vtag(2));
    assert_eq!(
        r,
        Err(IftError::ModeMismatch {
            ours: true,
            theirs: false
        })
    );
}

#[test]
fn unacceptable_crc_choices_abort() {
    let strict = |policy| IftConfig {
        accept: policy,
        ..IftConfig::with_vtag(9)
    };
    let no_hc = IftConfig {
        header_crc: false,
        ..IftConfig::with_vtag(1)
    };
    let no_pc = IftConfig {
        payload_crc: false,
        ..IftConfig::with_vtag(1)
    };
    let ignores = IftConfig {
        check_crcs: false,
        ..IftConfig::with_vtag(1)
    };
    let need_hc = CrcPolicy {
        require_header_crc: true,
        ..CrcPolicy::default()
    };
    let need_pc = CrcPolicy {
        require_payload_crc: true,
        ..CrcPolicy::default()
    };
    let need_checked = CrcPolicy {
        require_checked: true,
        ..CrcPolicy::default()
    };
    for (peer, policy, ok) in [
        (no_hc.clone(), need_hc, false),
        (no_hc.clone(), need_pc, true),
        (no_pc.clone(), need_pc, false),
        (no_pc, need_hc, true),
        (ignores.clone(), need_checked, false),
        (ignores.clone(), need_hc, true),
        (no_hc, need_checked, true),
    ] {
        // The responder judges the initiator's phase 0.
        let (_, r) = run(peer.clone(), strict(policy));
        assert_eq!(r.is_ok(), ok, "{peer:?} against {policy:?}: {r:?}");
        if !ok {
            assert!(matches!(r, Err(IftError::Unacceptable(_))), "{r:?}");
        }
        // And the initiator the responder's phase 1.
        let (i, _) = run(strict(policy), peer.clone());
        assert_eq!(i.is_ok(), ok, "{policy:?} against {peer:?}: {i:?}");
    }
    // A peer ignoring CRCs while we send none is no concern of require_checked.
    let silent = IftConfig {
        header_crc: false,
        payload_crc: false,
        ..strict(need_checked)
    };
    assert!(run(ignores, silent).1.is_ok());
}

/// Feeds a hand-made phase 0 to a responder.
fn respond_to(ind: IndicationRepr) -> Result<Negotiated, IftError> {
    let now = Instant::now();
    let mut resp = Responder::new(IftConfig::with_vtag(5), now);
    resp.feed(&ind.to_bytes(), now)
        .map(|(_, n)| n.expect("whole").0)
}

fn phase0() -> IndicationRepr {
    IftConfig::with_vtag(0x4242).indication(Phase::Zero)
}

#[test]
fn versions_markers_and_phases() {
    // A newer version that is backward compatible with ours is accepted.
    assert!(respond_to(IndicationRepr {
        version: 7,
        ..phase0()
    })
    .is_ok());
    assert_eq!(
        respond_to(IndicationRepr {
            version: 2,
            bc_version: 2,
            ..phase0()
        }),
        Err(IftError::IncompatibleVersion {
            version: 2,
            bc_version: 2
        })
    );
    // A peer offering and asking for Markers: we offer neither, so none flow (section 4.2's
    // rule), and the exchange succeeds.
    let n = respond_to(IndicationRepr {
        sends_markers: true,
        wants_markers: true,
        marker_interval: 512,
        ..phase0()
    })
    .unwrap();
    assert_eq!(n.tx.vtag, 0x4242);
    let ours = IftConfig::with_vtag(1).indication(Phase::One);
    assert!(!ours.sends_markers && !ours.wants_markers && ours.marker_interval == 0);
    // Phase 1 where phase 0 belongs, and the other way round.
    assert_eq!(
        respond_to(IndicationRepr {
            phase: Phase::One,
            ..phase0()
        }),
        Err(IftError::WrongPhase {
            expected: 0,
            found: 1
        })
    );
    let now = Instant::now();
    let mut init = Initiator::new(IftConfig::with_vtag(1), now);
    assert_eq!(
        init.feed(&phase0().to_bytes(), now),
        Err(IftError::WrongPhase {
            expected: 1,
            found: 0
        })
    );
}

#[test]
fn a_bad_crc_or_an_mpa_peer_fails_and_the_error_repeats() {
    let now = Instant::now();
    let mut b = phase0().to_bytes();
    b[20] ^= 0x10; // a reserved octet: still covered by the CRC
    let mut resp = Responder::new(IftConfig::with_vtag(5), now);
    let e = resp.feed(&b, now).unwrap_err();
    assert!(matches!(e, IftError::IndicationCrc { .. }), "{e:?}");
    assert_eq!(resp.feed(&b, now), Err(e));

    // An MPA Responder's Reply: known for what it is after four octets.
    let mut init = Initiator::new(IftConfig::with_vtag(1), now);
    let mpa = b"MPA ID Rep Frame\x40\x02\x00\x00";
    let e = init.feed(&mpa[..4], now).unwrap_err();
    assert!(e.to_string().contains("speaks MPA"), "{e}");
    assert_eq!(init.feed(&mpa[4..], now), Err(e));
}

#[test]
fn pieces_of_any_size_and_frames_after_the_indication() {
    let now = Instant::now();
    let mut resp = Responder::new(IftConfig::with_vtag(5), now);
    let mut init = Initiator::new(IftConfig::with_vtag(6), now);
    // Phase 0 one octet at a time.
    let phase0 = init.indication().to_vec();
    let mut reply = None;
    for (k, octet) in phase0.iter().enumerate() {
        let (used, done) = resp.feed(std::slice::from_ref(octet), now).unwrap();
        assert_eq!(used, 1);
        assert_eq!(done.is_some(), k == INDICATION_LEN - 1);
        reply = done;
    }
    let (_, reply) = reply.unwrap();
    // Phase 1 in two pieces, the second followed by frame octets the initiator leaves.
    let mut stream = reply.to_vec();
    stream.extend_from_slice(&[0xAA; 40]);
    assert_eq!(init.feed(&stream[..30], now), Ok((30, None)));
    let (used, n) = init.feed(&stream[30..], now).unwrap();
    assert_eq!(used, INDICATION_LEN - 30);
    assert_eq!(n.unwrap().tx.vtag, 5);
    assert!(
        init.feed(&stream[64..], now).is_err(),
        "the exchange is over"
    );
}

#[test]
fn the_exchange_has_a_deadline() {
    let now = Instant::now();
    let cfg = IftConfig {
        timeout: Duration::from_secs(2),
        ..IftConfig::with_vtag(1)
    };
    let mut init = Initiator::new(cfg.clone(), now);
    assert_eq!(init.poll_timeout(), Some(now + Duration::from_secs(2)));
    assert_eq!(init.handle_timeout(now + Duration::from_secs(1)), Ok(()));
    assert_eq!(
        init.feed(&[0x52, 0x44], now + Duration::from_secs(1)),
        Ok((2, None))
    );
    let late = now + Duration::from_secs(2);
    assert_eq!(init.handle_timeout(late), Err(IftError::StartupTimeout));
    assert_eq!(init.feed(&[0x44], late), Err(IftError::StartupTimeout));
    assert_eq!(init.poll_timeout(), None);

    let mut resp = Responder::new(cfg, now);
    let phase0 = Initiator::new(IftConfig::with_vtag(3), now)
        .indication()
        .to_vec();
    assert_eq!(resp.feed(&phase0, late), Err(IftError::StartupTimeout));
    // Once done, no deadline is left.
    let mut resp = Responder::new(IftConfig::with_vtag(4), now);
    resp.feed(&phase0, now).unwrap();
    assert_eq!(resp.poll_timeout(), None);
    assert_eq!(resp.handle_timeout(late), Ok(()));
}
