//! Startup (RFC 5044 section 7.1.2, RFC 6581) tests: Request/Reply round trips, rejection,
//! limits, Keys, revisions, IRD/ORD and RTR negotiation, timeouts and stream boundaries.

use std::time::{Duration, Instant};

use mpa::wire::{EnhancedParams, FrameKind, MpaFrameRepr, IRD_ORD_NO_NEGOTIATION};
use mpa::{
    Initiator, InitiatorEvent, MpaConfig, MpaError, Negotiated, RequestInfo, Responder, RtrKind,
};

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// Feeds the whole Request to a fresh Responder and returns it with the RequestInfo.
fn responder_with(config: MpaConfig, request: &[u8], now: Instant) -> (Responder, RequestInfo) {
    let mut responder = Responder::new(config, now).unwrap();
    let (consumed, info) = responder.feed(request, now).unwrap();
    assert_eq!(consumed, request.len());
    (responder, info.expect("complete Request"))
}

fn accepted(event: InitiatorEvent) -> (Negotiated, Vec<u8>) {
    match event {
        InitiatorEvent::Accepted {
            negotiated,
            private_data,
        } => (negotiated, private_data),
        other => panic!("expected Accepted, got {other:?}"),
    }
}

/// A full exchange: returns (initiator outcome, responder outcome, reply bytes).
fn handshake(
    initiator_config: MpaConfig,
    responder_config: MpaConfig,
) -> Result<(Negotiated, Negotiated, Vec<u8>), MpaError> {
    let now = Instant::now();
    let mut initiator = Initiator::new(initiator_config, b"hello", now)?;
    let mut responder = Responder::new(responder_config, now)?;
    let (consumed, info) = responder.feed(initiator.request(), now)?;
    assert_eq!(consumed, initiator.request().len());
    assert_eq!(info.unwrap().private_data, b"hello");
    let (reply, responder_side) = responder.accept(b"welcome")?;
    let (consumed, event) = initiator.feed(&reply, now)?;
    assert_eq!(consumed, reply.len());
    let (initiator_side, private_data) = accepted(event);
    assert_eq!(private_data, b"welcome");
    Ok((initiator_side, responder_side, reply))
}

#[test]
fn derived_rev2_request_vector() {
    let config = MpaConfig {
        crc: false,
        markers: false,
        ird: 16,
        ord: 16,
        ..MpaConfig::default()
    };
    let initiator = Initiator::new(config.clone(), &[], Instant::now()).unwrap();
    assert_eq!(
        initiator.request(),
        &hex("4d504120494420526571204672616d65 10 02 0004 0010 0010")[..]
    );
    let with_crc = Initiator::new(
        MpaConfig {
            crc: true,
            ..config
        },
        &[],
        Instant::now(),
    )
    .unwrap();
    assert_eq!(
        with_crc.request(),
        &hex("4d504120494420526571204672616d65 50 02 0004 0010 0010")[..]
    );
}

#[test]
fn rev2_round_trip() {
    let (initiator, responder, reply) =
        handshake(MpaConfig::default(), MpaConfig::default()).unwrap();
    assert_eq!(
        reply,
        [
            &b"MPA ID Rep Frame"[..],
            &hex("50 02 000b 0010 0010"),
            b"welcome"
        ]
        .concat()
    );
    for side in [&initiator, &responder] {
        assert_eq!(side.rev, 2);
        assert!(side.crc);
        assert!(!side.markers_tx && !side.markers_rx);
        assert_eq!((side.ird, side.ord), (16, 16));
        assert_eq!(side.rtr, None);
        assert!(side.peer_params.is_some());
    }
    assert!(responder.responder_waits_for_fpdu);
    assert!(!initiator.responder_waits_for_fpdu);
}

#[test]
fn responder_may_be_told_not_to_wait_for_the_first_fpdu() {
    let quick = MpaConfig {
        responder_waits_for_fpdu: false,
        ..MpaConfig::default()
    };
    let (initiator, responder, reply) = handshake(MpaConfig::default(), quick).unwrap();
    assert!(!responder.responder_waits_for_fpdu);
    assert!(!initiator.responder_waits_for_fpdu);
    // The Reply on the wire is the same as a waiting Responder's.
    let (_, _, waiting_reply) = handshake(MpaConfig::default(), MpaConfig::default()).unwrap();
    assert_eq!(reply, waiting_reply);
}

/// With an RTR agreed (peer-to-peer) the Responder waits for it even when told not to wait
/// for the Initiator's first FPDU: that setting is for client-server startups (RFC 5044
/// 7.1.2 rule 4, RFC 6581 5).
#[test]
fn a_responder_told_not_to_wait_still_waits_for_an_rtr() {
    let p2p = MpaConfig {
        peer_to_peer: true,
        ..MpaConfig::default()
    };
    let quick = MpaConfig {
        responder_waits_for_fpdu: false,
        ..MpaConfig::default()
    };
    let (initiator, responder, _) = handshake(p2p, quick).unwrap();
    assert!(responder.rtr.is_some() && initiator.rtr.is_some());
    assert!(responder.responder_waits_for_fpdu);
}

#[test]
fn rev1_round_trip_has_no_block() {
    let rev1 = MpaConfig {
        rev: 1,
        ..MpaConfig::default()
    };
    let now = Instant::now();
    let initiator = Initiator::new(rev1.clone(), b"pd", now).unwrap();
    assert_eq!(
        initiator.request(),
        &[&b"MPA ID Req Frame"[..], &hex("40 01 0002"), b"pd"].concat()[..]
    );
    let (initiator_side, responder_side, reply) = handshake(rev1, MpaConfig::default()).unwrap();
    // A Rev 2 Responder answers a Rev 1 Request with a plain Rev 1 Reply.
    assert_eq!(
        reply,
        [&b"MPA ID Rep Frame"[..], &hex("40 01 0007"), b"welcome"].concat()
    );
    assert_eq!(initiator_side.rev, 1);
    assert_eq!(responder_side.rev, 1);
    assert_eq!(responder_side.peer_params, None);
    assert_eq!(initiator_side.peer_params, None);
}

#[test]
fn siw_request_is_accepted() {
    // Linux siw as Initiator: S=1, Rev 2, IRD=ORD=1, C=0, M=0.
    let request = hex("4d504120494420526571204672616d65 10 02 0004 0001 0001");
    let now = Instant::now();
    let (mut responder, info) = responder_with(MpaConfig::default(), &request, now);
    assert_eq!(info.rev, 2);
    assert!(!info.crc && !info.markers);
    assert_eq!(info.enhanced.map(|p| (p.ird, p.ord)), Some((1, 1)));
    assert!(info.private_data.is_empty());
    let (reply, negotiated) = responder.accept(&[]).unwrap();
    // Our ORD is capped by siw's IRD (1); our IRD is our actual 16; C=1 is our default.
    assert_eq!(
        reply,
        hex("4d504120494420526570204672616d65 50 02 0004 0010 0001")
    );
    assert!(negotiated.crc, "CRC is used because we sent C=1");
    assert_eq!((negotiated.ird, negotiated.ord), (16, 1));
}

#[test]
fn reply_says_crc_when_the_initiator_asked_for_it() {
    // siw built with mpa_crc_required: C=1 in the Request. Our Responder configured with CRC
    // off must still answer C=1 (CRC is used either way, and siw refuses a Reply with C=0).
    let request = hex("4d504120494420526571204672616d65 50 02 0004 0001 0001");
    let config = MpaConfig {
        crc: false,
        ..MpaConfig::default()
    };
    let (mut responder, info) = responder_with(config, &request, Instant::now());
    assert!(info.crc);
    let (reply, negotiated) = responder.accept(&[]).unwrap();
    assert_eq!(reply[16] & 0x40, 0x40, "C bit in the Reply");
    assert!(negotiated.crc);
}

#[test]
fn reject_path_carries_private_data() {
    let now = Instant::now();
    let mut initiator = Initiator::new(MpaConfig::default(), b"let me in", now).unwrap();
    let (mut responder, info) = responder_with(MpaConfig::default(), initiator.request(), now);
    assert_eq!(info.private_data, b"let me in");
    let reply = responder.reject(b"no room").unwrap();
    let repr = MpaFrameRepr::parse_bytes(&reply).unwrap();
    assert!(repr.reject);
    assert_eq!(repr.kind, FrameKind::Reply);
    assert_eq!(repr.private_data, b"no room");
    let (consumed, event) = initiator.feed(&reply, now).unwrap();
    assert_eq!(consumed, reply.len());
    assert_eq!(
        event,
        InitiatorEvent::Rejected {
            private_data: b"no room".to_vec(),
            peer_params: Some(EnhancedParams {
                ird: 16,
                ord: 16,
                ..EnhancedParams::default()
            }),
        }
    );
    assert_eq!(initiator.feed(b"x", now), Err(MpaError::Rejected));
    assert_eq!(MpaError::Rejected.code(), 1);
    assert_eq!(responder.accept(&[]), Err(MpaError::Rejected));
    assert_eq!(initiator.poll_timeout(), None);
}

/// RFC 6581 9.1: a Reject is a reply too: an Initiator's 0x3FFF ("do not negotiate") is
/// answered with 0x3FFF in the other field, and the block reaches the Initiator's ULP.
#[test]
fn a_reject_answers_0x3fff_and_passes_its_block_up() {
    let now = Instant::now();
    let config = MpaConfig {
        ird: 2,
        ord: IRD_ORD_NO_NEGOTIATION,
        ..MpaConfig::default()
    };
    let mut initiator = Initiator::new(config, &[], now).unwrap();
    let responder_config = MpaConfig {
        ird: 3,
        ord: 5,
        ..MpaConfig::default()
    };
    let (mut responder, _) = responder_with(responder_config, initiator.request(), now);
    let reply = responder.reject(b"later").unwrap();
    let block = MpaFrameRepr::parse_bytes(&reply).unwrap().enhanced.unwrap();
    assert_eq!((block.ird, block.ord), (IRD_ORD_NO_NEGOTIATION, 5));
    match initiator.feed(&reply, now).unwrap().1 {
        InitiatorEvent::Rejected { peer_params, .. } => assert_eq!(peer_params, Some(block)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn private_data_limits() {
    let now = Instant::now();
    // Sending: 512 octets in total, so 508 for the ULP with the Rev 2 block.
    assert!(Initiator::new(MpaConfig::default(), &[0; 508], now).is_ok());
    assert!(matches!(
        Initiator::new(MpaConfig::default(), &[0; 509], now),
        Err(MpaError::Local(_))
    ));
    let rev1 = MpaConfig {
        rev: 1,
        ..MpaConfig::default()
    };
    assert!(Initiator::new(rev1.clone(), &[0; 512], now).is_ok());
    assert!(Initiator::new(rev1, &[0; 513], now).is_err());

    // Receiving: PD_Length above 512 closes, even before the private data arrives.
    let mut too_long = hex("4d504120494420526571204672616d65 40 01 0201");
    let mut responder = Responder::new(MpaConfig::default(), now).unwrap();
    let error = responder.feed(&too_long, now).unwrap_err();
    assert_eq!(error, MpaError::PrivateDataTooLong { len: 513, max: 512 });
    assert_eq!(error.code(), 4);
    too_long.extend_from_slice(&[0; 513]);
    assert_eq!(responder.feed(&too_long, now), Err(error));

    // A lower configured cap applies to the whole PD_Length.
    let capped = MpaConfig {
        max_private_data: 16,
        ..MpaConfig::default()
    };
    let sixteen = Initiator::new(MpaConfig::default(), &[7; 12], now).unwrap();
    let (_, info) = responder_with(capped.clone(), sixteen.request(), now);
    assert_eq!(info.private_data, [7; 12]);
    let seventeen = Initiator::new(MpaConfig::default(), &[7; 13], now).unwrap();
    let mut responder = Responder::new(capped, now).unwrap();
    assert_eq!(
        responder.feed(seventeen.request(), now),
        Err(MpaError::PrivateDataTooLong { len: 17, max: 16 })
    );

    // Accept/reject with too much private data is a local error.
    let plain = Initiator::new(MpaConfig::default(), &[], now).unwrap();
    let (mut responder, _) = responder_with(MpaConfig::default(), plain.request(), now);
    assert!(matches!(
        responder.accept(&[0; 509]),
        Err(MpaError::Local(_))
    ));
    assert!(responder.accept(&[0; 508]).is_ok());
}

#[test]
fn wrong_key_closes_immediately() {
    let now = Instant::now();
    let mut responder = Responder::new(MpaConfig::default(), now).unwrap();
    // The Key is checked as it arrives: "MPA ID Rep" is wrong from its 10th octet on.
    let (consumed, info) = responder.feed(b"MPA ID Re", now).unwrap();
    assert_eq!((consumed, info), (9, None));
    let error = responder.feed(b"p", now).unwrap_err();
    assert_eq!(error, MpaError::InvalidKey);
    assert_eq!(error.code(), 4);
    assert_eq!(responder.feed(b"q Frame", now), Err(MpaError::InvalidKey));

    // An Initiator receiving a Request (Initiator/Initiator startup) fails the same way.
    let mut initiator = Initiator::new(MpaConfig::default(), &[], now).unwrap();
    let request = initiator.request().to_vec();
    assert_eq!(initiator.feed(&request, now), Err(MpaError::InvalidKey));
}

#[test]
fn revisions_are_checked() {
    let now = Instant::now();
    let rev0 = hex("4d504120494420526571204672616d65 c0 00 0000");
    let mut responder = Responder::new(MpaConfig::default(), now).unwrap();
    let error = responder.feed(&rev0, now).unwrap_err();
    assert_eq!(error, MpaError::UnsupportedRevision { rev: 0 });
    assert_eq!(error.code(), 4);

    // A Rev 0 Reply is refused as well.
    let mut initiator = Initiator::new(MpaConfig::default(), &[], now).unwrap();
    let rev0_reply = hex("4d504120494420526570204672616d65 c0 00 0000");
    assert_eq!(
        initiator.feed(&rev0_reply, now),
        Err(MpaError::UnsupportedRevision { rev: 0 })
    );

    // A Rev 2 Reply to a Rev 1 Request is invalid.
    let rev1 = MpaConfig {
        rev: 1,
        ..MpaConfig::default()
    };
    let mut initiator = Initiator::new(rev1.clone(), &[], now).unwrap();
    let rev2_reply = hex("4d504120494420526570204672616d65 50 02 0004 0010 0010");
    assert_eq!(
        initiator.feed(&rev2_reply, now),
        Err(MpaError::UnsupportedRevision { rev: 2 })
    );

    // A Responder limited to Rev 1 treats an enhanced Request as malformed (RFC 6581 10).
    let enhanced = Initiator::new(MpaConfig::default(), &[], now).unwrap();
    let mut responder = Responder::new(rev1, now).unwrap();
    let error = responder.feed(enhanced.request(), now).unwrap_err();
    assert!(matches!(error, MpaError::InvalidFrame(_)));
    assert_eq!(error.code(), 4);

    // A Rev 2 Request without S gets a Rev 2 Reply without S.
    let plain_rev2 = hex("4d504120494420526571204672616d65 40 02 0000");
    let (mut responder, info) = responder_with(MpaConfig::default(), &plain_rev2, now);
    assert_eq!((info.rev, info.enhanced), (2, None));
    let (reply, _) = responder.accept(&[]).unwrap();
    assert_eq!(reply, hex("4d504120494420526570204672616d65 40 02 0000"));

    assert!(Initiator::new(
        MpaConfig {
            rev: 3,
            ..MpaConfig::default()
        },
        &[],
        now
    )
    .is_err());
    assert!(Responder::new(
        MpaConfig {
            rev: 0,
            ..MpaConfig::default()
        },
        now
    )
    .is_err());
}

#[test]
fn crc_is_used_if_either_side_asks_and_markers_are_per_direction() {
    let quiet = MpaConfig {
        crc: false,
        ..MpaConfig::default()
    };
    let (i, r, _) = handshake(quiet.clone(), quiet.clone()).unwrap();
    assert!(!i.crc && !r.crc);
    let (i, r, _) = handshake(quiet.clone(), MpaConfig::default()).unwrap();
    assert!(i.crc && r.crc);
    let (i, r, _) = handshake(MpaConfig::default(), quiet).unwrap();
    assert!(i.crc && r.crc);

    let wants_markers = MpaConfig {
        markers: true,
        ..MpaConfig::default()
    };
    let (i, r, _) = handshake(wants_markers.clone(), MpaConfig::default()).unwrap();
    assert!(i.markers_rx && !i.markers_tx);
    assert!(r.markers_tx && !r.markers_rx);
    let (i, r, _) = handshake(MpaConfig::default(), wants_markers).unwrap();
    assert!(i.markers_tx && !i.markers_rx);
    assert!(r.markers_rx && !r.markers_tx);
}

#[test]
fn ird_ord_negotiation() {
    let initiator = MpaConfig {
        ird: 4,
        ord: 8,
        ..MpaConfig::default()
    };
    let responder = MpaConfig {
        ird: 2,
        ord: 16,
        ..MpaConfig::default()
    };
    let (i, r, reply) = handshake(initiator, responder).unwrap();
    // Responder: ORD capped by the Initiator's IRD (4), IRD its actual 2.
    assert_eq!((r.ird, r.ord), (2, 4));
    let block = MpaFrameRepr::parse_bytes(&reply).unwrap().enhanced.unwrap();
    assert_eq!((block.ird, block.ord), (2, 4));
    // Initiator: ORD lowered to the Responder's IRD, IRD kept (it covers the Responder's ORD).
    assert_eq!((i.ird, i.ord), (4, 2));
    assert_eq!(i.peer_params.map(|p| (p.ird, p.ord)), Some((2, 4)));
    assert_eq!(r.peer_params.map(|p| (p.ird, p.ord)), Some((4, 8)));
}

/// `rdma_accept`'s `responder_resources` / `initiator_depth`: the IRD and ORD set for the one
/// Request replace the configuration's in the Reply and the outcome; only while the Request
/// waits, and only 14 bits.
#[test]
fn ird_ord_set_for_one_accept() {
    let now = Instant::now();
    let initiator_config = MpaConfig {
        ird: 4,
        ord: 8,
        ..MpaConfig::default()
    };
    let mut initiator = Initiator::new(initiator_config, &[], now).unwrap();
    let mut responder = Responder::new(MpaConfig::default(), now).unwrap();
    assert!(responder.set_ird_ord(1, 1).is_err(), "no Request yet");
    responder.feed(initiator.request(), now).unwrap();
    assert!(responder.set_ird_ord(0x4000, 1).is_err(), "15 bits");
    responder.set_ird_ord(3, 2).unwrap();
    let (reply, r) = responder.accept(&[]).unwrap();
    assert_eq!((r.ird, r.ord), (3, 2));
    let block = MpaFrameRepr::parse_bytes(&reply).unwrap().enhanced.unwrap();
    assert_eq!((block.ird, block.ord), (3, 2));
    let (i, _) = accepted(initiator.feed(&reply, now).unwrap().1);
    assert_eq!((i.ird, i.ord), (4, 3));
    assert!(responder.set_ird_ord(1, 1).is_err(), "answered already");
}

#[test]
fn ird_ord_0x3fff_means_do_not_negotiate() {
    let initiator = MpaConfig {
        ird: IRD_ORD_NO_NEGOTIATION,
        ord: IRD_ORD_NO_NEGOTIATION,
        ..MpaConfig::default()
    };
    let responder = MpaConfig {
        ird: 3,
        ord: 5,
        ..MpaConfig::default()
    };
    let (i, r, reply) = handshake(initiator, responder).unwrap();
    let block = MpaFrameRepr::parse_bytes(&reply).unwrap().enhanced.unwrap();
    assert_eq!(
        (block.ird, block.ord),
        (IRD_ORD_NO_NEGOTIATION, IRD_ORD_NO_NEGOTIATION)
    );
    assert_eq!((r.ird, r.ord), (3, 5), "the Responder keeps its own values");
    assert_eq!(
        (i.ird, i.ord),
        (IRD_ORD_NO_NEGOTIATION, IRD_ORD_NO_NEGOTIATION)
    );

    // Only the Initiator's ORD is 0x3FFF: only the reply IRD is 0x3FFF.
    let initiator = MpaConfig {
        ird: 2,
        ord: IRD_ORD_NO_NEGOTIATION,
        ..MpaConfig::default()
    };
    let (i, r, reply) = handshake(initiator, MpaConfig::default()).unwrap();
    let block = MpaFrameRepr::parse_bytes(&reply).unwrap().enhanced.unwrap();
    assert_eq!((block.ird, block.ord), (IRD_ORD_NO_NEGOTIATION, 2));
    assert_eq!((r.ird, r.ord), (16, 2));
    assert_eq!((i.ird, i.ord), (2, IRD_ORD_NO_NEGOTIATION));
    assert!(Initiator::new(
        MpaConfig {
            ird: 0x4000,
            ..MpaConfig::default()
        },
        &[],
        Instant::now()
    )
    .is_err());
}

/// A Reply frame with the given block, as some other Responder might send it.
fn reply_with(block: EnhancedParams) -> Vec<u8> {
    MpaFrameRepr {
        kind: FrameKind::Reply,
        markers: false,
        crc: true,
        reject: false,
        rev: 2,
        enhanced: Some(block),
        private_data: &[],
    }
    .to_vec()
    .unwrap()
}

#[test]
fn insufficient_ird_is_error_6() {
    let now = Instant::now();
    let config = MpaConfig {
        ird: 4,
        ..MpaConfig::default()
    };
    let mut initiator = Initiator::new(config, &[], now).unwrap();
    let reply = reply_with(EnhancedParams {
        ird: 8,
        ord: 10,
        ..EnhancedParams::default()
    });
    let error = initiator.feed(&reply, now).unwrap_err();
    assert_eq!(
        error,
        MpaError::InsufficientIrd {
            required: 10,
            available: 4
        }
    );
    assert_eq!(error.code(), 6);
    assert_eq!(initiator.feed(&[], now), Err(error));
    // RFC 6581 9.1: the Initiator must send a Terminate (code 6) in the Reply's framing.
    assert!(initiator.terminate_encoder().is_some());
}

#[test]
fn other_reply_failures_send_no_terminate() {
    let now = Instant::now();
    // A Reply with a wrong Key: no framing was agreed, the connection just closes.
    let mut initiator = Initiator::new(MpaConfig::default(), &[], now).unwrap();
    let mut reply = reply_with(EnhancedParams::default());
    reply[0] ^= 0xff;
    assert_eq!(initiator.feed(&reply, now), Err(MpaError::InvalidKey));
    assert!(initiator.terminate_encoder().is_none());
    // Nor after a timeout.
    let mut initiator = Initiator::new(MpaConfig::default(), &[], now).unwrap();
    let later = now + Duration::from_secs(60);
    assert!(initiator.handle_timeout(later).is_err());
    assert!(initiator.terminate_encoder().is_none());
}

#[test]
fn peer_to_peer_rtr_selection() {
    let initiator = MpaConfig {
        peer_to_peer: true,
        rtr_send: false,
        rtr_write: true,
        rtr_read: true,
        ..MpaConfig::default()
    };
    let request = Initiator::new(initiator.clone(), &[], Instant::now()).unwrap();
    let block = MpaFrameRepr::parse_bytes(request.request())
        .unwrap()
        .enhanced
        .unwrap();
    assert!(block.peer_to_peer && block.rtr_write && block.rtr_read && !block.rtr_send);

    // Both support Write: Write is picked, and the Reply flags exactly that.
    let (i, r, reply) = handshake(initiator.clone(), MpaConfig::default()).unwrap();
    assert_eq!(i.rtr, Some(RtrKind::Write));
    assert_eq!(r.rtr, Some(RtrKind::Write));
    let block = MpaFrameRepr::parse_bytes(&reply).unwrap().enhanced.unwrap();
    assert!(block.peer_to_peer && block.rtr_write && !block.rtr_read && !block.rtr_send);

    // The Responder only takes Read: Read, and the Responder's IRD is at least 1 for it.
    let read_only = MpaConfig {
        ird: 0,
        rtr_send: false,
        rtr_write: false,
        rtr_read: true,
        ..MpaConfig::default()
    };
    let (i, r, _) = handshake(initiator.clone(), read_only.clone()).unwrap();
    assert_eq!((i.rtr, r.rtr), (Some(RtrKind::Read), Some(RtrKind::Read)));
    assert_eq!(r.ird, 1);
    assert_eq!(i.ord, 1);
    // The same when the Initiator does not negotiate (ORD 0x3FFF): the Responder still keeps
    // the one slot the RTR's Read needs.
    let unnegotiated = MpaConfig {
        ord: IRD_ORD_NO_NEGOTIATION,
        ..initiator.clone()
    };
    let (_, r, _) = handshake(unnegotiated, read_only).unwrap();
    assert_eq!((r.rtr, r.ird), (Some(RtrKind::Read), 1));

    // Client-server: no RTR, even though the flags are configured.
    let (i, r, reply) = handshake(MpaConfig::default(), MpaConfig::default()).unwrap();
    assert_eq!((i.rtr, r.rtr), (None, None));
    let block = MpaFrameRepr::parse_bytes(&reply).unwrap().enhanced.unwrap();
    assert!(!block.peer_to_peer && !block.rtr_write && !block.rtr_read && !block.rtr_send);
}

/// RFC 6581 9.2, nothing in common: a Responder that supports several kinds offers the one
/// it gets ready for, alone (offering the others too would let the Initiator send an RTR it
/// is not ready for: a zero-length Send with no receive set aside, a Read with no IRD slot).
#[test]
fn with_no_common_rtr_the_responder_offers_the_kind_it_expects() {
    let now = Instant::now();
    let write_only = MpaConfig {
        peer_to_peer: true,
        rtr_send: false,
        rtr_write: true,
        rtr_read: false,
        ..MpaConfig::default()
    };
    let send_or_read = MpaConfig {
        rtr_send: true,
        rtr_write: false,
        rtr_read: true,
        ..MpaConfig::default()
    };
    let initiator = Initiator::new(write_only, &[], now).unwrap();
    let (mut responder, _) = responder_with(send_or_read, initiator.request(), now);
    let (reply, negotiated) = responder.accept(&[]).unwrap();
    let block = MpaFrameRepr::parse_bytes(&reply).unwrap().enhanced.unwrap();
    let expected = negotiated.rtr.expect("a kind to expect");
    let offered = [
        (RtrKind::Send, block.rtr_send),
        (RtrKind::Write, block.rtr_write),
        (RtrKind::Read, block.rtr_read),
    ];
    let offered: Vec<_> = offered
        .iter()
        .filter(|(_, on)| *on)
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(offered, [expected], "{block:?}");
}

#[test]
fn no_matching_rtr_is_error_7() {
    let now = Instant::now();
    let initiator_config = MpaConfig {
        peer_to_peer: true,
        rtr_send: false,
        rtr_write: true,
        rtr_read: false,
        ..MpaConfig::default()
    };
    let send_only = MpaConfig {
        rtr_send: true,
        rtr_write: false,
        rtr_read: false,
        ..MpaConfig::default()
    };
    let mut initiator = Initiator::new(initiator_config.clone(), &[], now).unwrap();
    let (mut responder, _) = responder_with(send_only.clone(), initiator.request(), now);
    // RFC 6581 9.2: with nothing in common the Responder accepts, offering what it supports,
    // and expects the kind it prefers.
    let (reply, negotiated) = responder.accept(&[]).unwrap();
    assert_eq!(negotiated.rtr, Some(RtrKind::Send));
    assert!(negotiated.responder_waits_for_fpdu);
    let block = MpaFrameRepr::parse_bytes(&reply).unwrap().enhanced.unwrap();
    assert!(block.peer_to_peer && block.rtr_send && !block.rtr_write && !block.rtr_read);
    // The Initiator can send none of it: code 7, and a Terminate to send in the agreed
    // framing (CRCs on: the Reply's C).
    assert!(
        initiator.terminate_encoder().is_none(),
        "nothing failed yet"
    );
    let error = initiator.feed(&reply, now).unwrap_err();
    assert_eq!(error, MpaError::NoMatchingRtr);
    assert_eq!(error.code(), 7);
    assert_eq!(
        initiator.terminate_encoder(),
        Some(mpa::FpduEncoder::new(true, false))
    );
    // A Responder can still reject, advertising what it supports.
    let mut initiator = Initiator::new(initiator_config.clone(), &[], now).unwrap();
    let (mut responder, _) = responder_with(send_only, initiator.request(), now);
    let reply = responder.reject(b"send only").unwrap();
    let block = MpaFrameRepr::parse_bytes(&reply).unwrap().enhanced.unwrap();
    assert!(block.peer_to_peer && block.rtr_send && !block.rtr_write);
    assert!(matches!(
        initiator.feed(&reply, now).unwrap().1,
        InitiatorEvent::Rejected { .. }
    ));
    assert!(
        initiator.terminate_encoder().is_none(),
        "a rejection sends nothing"
    );
    // A Responder configured with no RTR kind at all cannot accept a peer-to-peer Request.
    let initiator = Initiator::new(initiator_config.clone(), &[], now).unwrap();
    let none = MpaConfig {
        rtr_send: false,
        rtr_write: false,
        rtr_read: false,
        ..MpaConfig::default()
    };
    let (mut responder, _) = responder_with(none, initiator.request(), now);
    assert_eq!(responder.accept(&[]), Err(MpaError::NoMatchingRtr));

    // An accepting Reply that offers nothing the Initiator can send: error 7.
    let mut initiator = Initiator::new(initiator_config.clone(), &[], now).unwrap();
    let reply = reply_with(EnhancedParams {
        ird: 16,
        ord: 16,
        peer_to_peer: true,
        rtr_send: true,
        ..EnhancedParams::default()
    });
    assert_eq!(initiator.feed(&reply, now), Err(MpaError::NoMatchingRtr));

    // A Reply that does not echo A: error 7.
    let mut initiator = Initiator::new(initiator_config, &[], now).unwrap();
    let reply = reply_with(EnhancedParams {
        ird: 16,
        ord: 16,
        ..EnhancedParams::default()
    });
    assert_eq!(initiator.feed(&reply, now), Err(MpaError::NoMatchingRtr));

    // Peer-to-peer without any RTR kind to offer is a configuration error.
    let nothing = MpaConfig {
        peer_to_peer: true,
        rtr_send: false,
        rtr_write: false,
        rtr_read: false,
        ..MpaConfig::default()
    };
    assert!(matches!(
        Initiator::new(nothing, &[], now),
        Err(MpaError::Local(_))
    ));
}

#[test]
fn startup_times_out() {
    let start = Instant::now();
    let config = MpaConfig {
        timeout: Duration::from_secs(2),
        ..MpaConfig::default()
    };
    let deadline = start + Duration::from_secs(2);

    let mut initiator = Initiator::new(config.clone(), &[], start).unwrap();
    assert_eq!(initiator.poll_timeout(), Some(deadline));
    assert_eq!(
        initiator.handle_timeout(start + Duration::from_secs(1)),
        Ok(())
    );
    let error = initiator.handle_timeout(deadline).unwrap_err();
    assert_eq!(error, MpaError::StartupTimeout);
    assert_eq!(error.code(), 1);
    assert_eq!(initiator.poll_timeout(), None);
    assert_eq!(
        initiator.feed(b"MPA", deadline),
        Err(MpaError::StartupTimeout)
    );

    // Data arriving after the deadline does not rescue the startup.
    let mut late = Initiator::new(config.clone(), &[], start).unwrap();
    assert_eq!(late.feed(b"MPA", deadline), Err(MpaError::StartupTimeout));

    let mut responder = Responder::new(config.clone(), start).unwrap();
    assert_eq!(responder.poll_timeout(), Some(deadline));
    assert_eq!(
        responder.handle_timeout(deadline),
        Err(MpaError::StartupTimeout)
    );

    // Once the Request is in, the startup timer gives way to the accept timer: the ULP has
    // `accept_timeout` from the Request's arrival to answer it.
    let config = MpaConfig {
        accept_timeout: Duration::from_secs(5),
        ..config
    };
    let initiator = Initiator::new(config.clone(), &[], start).unwrap();
    let arrival = start + Duration::from_secs(1);
    let (mut responder, _) = responder_with(config.clone(), initiator.request(), arrival);
    let accept_deadline = arrival + Duration::from_secs(5);
    assert_eq!(responder.poll_timeout(), Some(accept_deadline));
    assert_eq!(responder.handle_timeout(deadline), Ok(()));
    let error = responder.handle_timeout(accept_deadline).unwrap_err();
    assert_eq!(error, MpaError::AcceptTimeout);
    assert_eq!(error.code(), 1);
    assert_eq!(responder.poll_timeout(), None);
    assert_eq!(responder.accept(&[]).unwrap_err(), MpaError::AcceptTimeout);

    // Answered in time, no timer is left.
    let (mut responder, _) = responder_with(config, initiator.request(), arrival);
    responder.accept(&[]).unwrap();
    assert_eq!(responder.poll_timeout(), None);
    assert_eq!(
        responder.handle_timeout(accept_deadline + Duration::from_secs(60)),
        Ok(())
    );
}

#[test]
fn byte_at_a_time_startup() {
    let now = Instant::now();
    let mut initiator = Initiator::new(MpaConfig::default(), b"private", now).unwrap();
    let request = initiator.request().to_vec();
    let mut responder = Responder::new(MpaConfig::default(), now).unwrap();
    let mut info = None;
    for (index, byte) in request.iter().enumerate() {
        let (consumed, got) = responder.feed(std::slice::from_ref(byte), now).unwrap();
        assert_eq!(consumed, 1);
        assert_eq!(got.is_some(), index == request.len() - 1);
        info = got.or(info);
    }
    assert_eq!(info.unwrap().private_data, b"private");
    let (reply, _) = responder.accept(b"also private").unwrap();
    let mut outcome = None;
    for (index, byte) in reply.iter().enumerate() {
        let (consumed, event) = initiator.feed(std::slice::from_ref(byte), now).unwrap();
        assert_eq!(consumed, 1);
        if index < reply.len() - 1 {
            assert_eq!(event, InitiatorEvent::NeedMore);
        } else {
            outcome = Some(event);
        }
    }
    let (_, private_data) = accepted(outcome.unwrap());
    assert_eq!(private_data, b"also private");
}

#[test]
fn octets_after_the_frames_are_left_for_the_fpdu_decoder() {
    let now = Instant::now();
    let wants_markers = MpaConfig {
        markers: true,
        ..MpaConfig::default()
    };
    let mut initiator = Initiator::new(wants_markers.clone(), b"req", now).unwrap();
    let mut responder = Responder::new(wants_markers, now).unwrap();

    // Initiator -> Responder: the Request, then (later) the first FPDUs, in one buffer.
    let request = initiator.request().to_vec();
    let mut stream = request.clone();
    stream.extend_from_slice(b"trailing");
    let (consumed, info) = responder.feed(&stream, now).unwrap();
    assert_eq!(consumed, request.len());
    assert!(info.is_some());
    let (reply, responder_side) = responder.accept(b"rep").unwrap();

    // Responder -> Initiator: the Reply followed by FPDUs in the same read.
    let mut responder_encoder = responder_side.encoder();
    assert!(responder_encoder.markers_enabled());
    let mut to_initiator = reply.clone();
    responder_encoder
        .encode(b"first", &mut to_initiator)
        .unwrap();
    responder_encoder
        .encode(b"second", &mut to_initiator)
        .unwrap();
    let (consumed, event) = initiator.feed(&to_initiator, now).unwrap();
    assert_eq!(consumed, reply.len());
    let (initiator_side, _) = accepted(event);
    let mut decoder = initiator_side.decoder();
    let mut got = Vec::new();
    decoder
        .feed(&to_initiator[consumed..], |u| got.push(u.to_vec()))
        .unwrap();
    assert_eq!(got, [b"first".to_vec(), b"second".to_vec()]);

    // And the other direction, from the Initiator's encoder to the Responder's decoder.
    let mut encoder = initiator_side.encoder();
    let mut to_responder = Vec::new();
    encoder.encode(b"rtr-or-first", &mut to_responder).unwrap();
    let mut decoder = responder_side.decoder();
    let mut got = Vec::new();
    decoder
        .feed(&to_responder, |u| got.push(u.to_vec()))
        .unwrap();
    assert_eq!(got, [b"rtr-or-first".to_vec()]);
    // Feeding more into a finished startup is refused rather than silently consumed.
    assert!(initiator.feed(b"more", now).is_err());
    assert!(responder.feed(b"more", now).is_err());
}

#[test]
fn malformed_enhanced_request_is_error_4() {
    let now = Instant::now();
    // S=1 with Rev 1: a reserved bit there, not checked on reception (RFC 5044 7.1.1): a
    // Rev 1 Request whose 4 octets are private data.
    let rev1 = hex("4d504120494420526571204672616d65 10 01 0004 0001 0001");
    let mut responder = Responder::new(MpaConfig::default(), now).unwrap();
    let (_, info) = responder.feed(&rev1, now).expect("a Rev 1 Request");
    let info = info.expect("complete");
    assert_eq!((info.rev, info.enhanced), (1, None));
    assert_eq!(info.private_data, [0, 1, 0, 1]);
    // S=1 with PD_Length 2.
    let bad = hex("4d504120494420526571204672616d65 10 02 0002 0001");
    let mut responder = Responder::new(MpaConfig::default(), now).unwrap();
    assert_eq!(responder.feed(&bad, now).unwrap_err().code(), 4);
}

#[test]
fn unenhanced_reply_to_enhanced_request_keeps_local_values() {
    // A Responder that answers without the RFC 6581 block (Rev 1, or Rev 2 with S=0) did not
    // negotiate: the Initiator keeps its own IRD/ORD and the client-server model, unless it
    // asked for peer-to-peer.
    let now = Instant::now();
    let config = MpaConfig {
        ird: 3,
        ord: 5,
        ..MpaConfig::default()
    };
    for reply in [
        hex("4d504120494420526570204672616d65 00 01 0000"),
        hex("4d504120494420526570204672616d65 00 02 0000"),
    ] {
        let mut initiator = Initiator::new(config.clone(), &[], now).unwrap();
        let (consumed, event) = initiator.feed(&reply, now).unwrap();
        assert_eq!(consumed, 20);
        let (negotiated, _) = accepted(event);
        assert_eq!(negotiated.rev, reply[17]);
        assert_eq!(
            (negotiated.ird, negotiated.ord, negotiated.rtr),
            (3, 5, None)
        );
        assert!(negotiated.crc, "we sent C=1");
        assert_eq!(negotiated.peer_params, None);
    }
    // Unless the Initiator asked for peer-to-peer: an unenhanced Reply agrees to no RTR
    // (RFC 6581 9.2: code 7, and the Terminate in the Reply's framing).
    let p2p = MpaConfig {
        peer_to_peer: true,
        ..config.clone()
    };
    for reply in [
        hex("4d504120494420526570204672616d65 00 01 0000"),
        hex("4d504120494420526570204672616d65 00 02 0000"),
    ] {
        let mut initiator = Initiator::new(p2p.clone(), &[], now).unwrap();
        assert_eq!(initiator.feed(&reply, now), Err(MpaError::NoMatchingRtr));
        assert_eq!(
            initiator.terminate_encoder(),
            Some(mpa::FpduEncoder::new(true, false))
        );
    }
    // But S=1 in a Reply to a Rev 1 Request is malformed.
    let rev1 = MpaConfig {
        rev: 1,
        ..MpaConfig::default()
    };
    let mut initiator = Initiator::new(rev1, &[], now).unwrap();
    let reply = hex("4d504120494420526570204672616d65 10 02 0004 0001 0001");
    assert_eq!(initiator.feed(&reply, now).unwrap_err().code(), 4);
}
