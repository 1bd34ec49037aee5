//! MPA Request/Reply frames and both startup state machines (RFC 5044 7.1, RFC 6581).
//!
//! Input: a mode octet, then per mode:
//! - 0, frame: `MpaFrameRepr::parse_bytes` on the rest. Asserts the checked view agrees with
//!   the parsed frame and that a parsed frame re-emits to the same octets (reserved flag bits
//!   cleared) and parses back to itself.
//! - 1, Initiator: a config (revision, C, M, IRD/ORD, peer-to-peer and RTR kinds, private
//!   data limit, timeout: valid or not) and private data; the Initiator is then fed arbitrary
//!   octets as the Reply, in arbitrary pieces, with time moving on. Asserts: its Request
//!   parses and says what the config says; it never takes more than it is given and, while it
//!   needs more, takes all of it; what it took when it decides is one complete Reply frame,
//!   and its decision follows from that frame and the config (revision, C/M, the IRD/ORD rules
//!   of RFC 6581 9.1, the RTR rules of 9.2); an error is final and repeated.
//! - 2, Responder: the same for the Request, then accept or reject with arbitrary private
//!   data. Asserts the Request info matches the frame consumed, and the Reply it builds
//!   parses and says what was negotiated.
//! - 3, pair: an Initiator and a Responder with independent configs, the Request and Reply
//!   passed between them in arbitrary pieces, optionally with octets changed on the way, and
//!   FPDU octets after the Reply. Asserts the Initiator stops exactly at the Reply's end, and,
//!   when nothing was changed and both sides accept, that they agree: CRC on or off, Markers
//!   each way, the RTR kind, and each side's ORD at most the other side's IRD.
//!
//! Nothing may panic.
#![no_main]

use std::time::{Duration, Instant};

use iwarp_fuzz::Input;
use libfuzzer_sys::fuzz_target;
use mpa::wire::{
    EnhancedParams, FrameKind, MpaFrame, MpaFrameRepr, IRD_ORD_NO_NEGOTIATION, MAX_PRIVATE_DATA,
};
use mpa::{Initiator, InitiatorEvent, MpaConfig, MpaError, Negotiated, Responder, RtrKind};

const NO_NEG: u16 = IRD_ORD_NO_NEGOTIATION;

/// An IRD or ORD: small, "do not negotiate", any 14-bit value, or any 16-bit value.
fn depth(input: &mut Input) -> u16 {
    let v = input.u16();
    match v >> 14 {
        0 => v & 0x1f,
        1 => NO_NEG,
        2 => v & 0x3fff,
        _ => v,
    }
}

fn config(input: &mut Input) -> MpaConfig {
    let f = input.u16();
    MpaConfig {
        rev: match f & 7 {
            0 => 1,
            7 => input.u8(),
            _ => 2,
        },
        crc: f & 8 != 0,
        markers: f & 16 != 0,
        ird: depth(input),
        ord: depth(input),
        peer_to_peer: f & 32 != 0,
        rtr_send: f & 64 == 0,
        rtr_write: f & 128 == 0,
        rtr_read: f & 256 == 0,
        max_private_data: if f & 512 != 0 {
            usize::from(input.u16() % 600)
        } else {
            MAX_PRIVATE_DATA
        },
        timeout: Duration::from_millis(u64::from(input.u16())),
        accept_timeout: Duration::from_millis(u64::from(input.u16())),
        responder_waits_for_fpdu: f & 1024 == 0,
    }
}

/// Private data to send: mostly short, sometimes over the limits.
fn private_data<'a>(input: &mut Input<'a>) -> &'a [u8] {
    let n = usize::from(input.u16() % 600);
    input.bytes(n)
}

fn rtr_offered(p: &EnhancedParams, kind: RtrKind) -> bool {
    match kind {
        RtrKind::Send => p.rtr_send,
        RtrKind::Write => p.rtr_write,
        RtrKind::Read => p.rtr_read,
    }
}

fn rtr_supported(c: &MpaConfig, kind: RtrKind) -> bool {
    match kind {
        RtrKind::Send => c.rtr_send,
        RtrKind::Write => c.rtr_write,
        RtrKind::Read => c.rtr_read,
    }
}

/// The frame mode: parse, and re-emit what parses.
fn frame(bytes: &[u8]) {
    let view = MpaFrame::new_checked(bytes);
    let Ok(repr) = MpaFrameRepr::parse_bytes(bytes) else {
        return;
    };
    let view = view.expect("a frame that parses has a valid view");
    assert_eq!(repr.pd_length(), usize::from(view.pd_length()));
    assert_eq!(repr.buffer_len(), view.frame_len());
    assert_eq!(Some(repr.kind), view.kind());
    let out = repr.to_vec().expect("a parsed frame re-emits");
    assert_eq!(out.len(), view.frame_len());
    assert_eq!(out[..16], bytes[..16], "Key changed");
    // M, C, R and (from Rev 2 on) S; below Rev 2, S is one of the reserved bits.
    let kept = if repr.rev >= 2 { 0xF0 } else { 0xE0 };
    assert_eq!(
        out[16],
        bytes[16] & kept,
        "flags changed beyond the reserved bits"
    );
    assert_eq!(
        out[17..],
        bytes[17..out.len()],
        "Rev, PD_Length or private data changed"
    );
    let again = MpaFrameRepr::parse_bytes(&out).expect("a re-emitted frame parses");
    assert_eq!(again, repr);
}

/// The Request an Initiator built says what its config says.
fn check_request(cfg: &MpaConfig, private: &[u8], request: &[u8]) {
    let r = MpaFrameRepr::parse_bytes(request).expect("our Request parses");
    assert_eq!(r.kind, FrameKind::Request);
    assert_eq!(r.buffer_len(), request.len());
    assert_eq!(
        (r.markers, r.crc, r.reject, r.rev),
        (cfg.markers, cfg.crc, false, cfg.rev)
    );
    assert_eq!(r.enhanced.is_some(), cfg.rev >= 2);
    assert_eq!(r.private_data, private);
    if let Some(p) = r.enhanced {
        assert_eq!(
            (p.ird, p.ord, p.peer_to_peer),
            (cfg.ird, cfg.ord, cfg.peer_to_peer)
        );
    }
}

/// What an Initiator with `cfg` must have decided on the Reply `reply`.
fn check_initiator_decision(cfg: &MpaConfig, reply: &MpaFrameRepr, event: &InitiatorEvent) {
    assert_eq!(reply.kind, FrameKind::Reply);
    assert!(
        reply.rev >= 1 && reply.rev <= cfg.rev,
        "accepted Rev {}",
        reply.rev
    );
    match event {
        InitiatorEvent::NeedMore => panic!("decision expected"),
        InitiatorEvent::Rejected {
            private_data,
            peer_params,
        } => {
            assert!(reply.reject);
            assert_eq!(private_data.as_slice(), reply.private_data);
            assert_eq!(*peer_params, reply.enhanced);
        }
        InitiatorEvent::Accepted {
            negotiated: n,
            private_data,
        } => {
            assert!(!reply.reject);
            assert_eq!(private_data.as_slice(), reply.private_data);
            assert_eq!(n.rev, reply.rev);
            assert_eq!(n.crc, cfg.crc || reply.crc);
            assert_eq!((n.markers_tx, n.markers_rx), (reply.markers, cfg.markers));
            assert!(!n.responder_waits_for_fpdu);
            assert_eq!(n.peer_params, reply.enhanced);
            match reply.enhanced {
                None => {
                    assert_eq!((n.ird, n.ord, n.rtr), (cfg.ird, cfg.ord, None));
                }
                Some(p) => {
                    assert_eq!(n.ird, cfg.ird);
                    if p.ord != NO_NEG && cfg.ird != NO_NEG {
                        assert!(p.ord <= cfg.ird, "accepted a Responder ORD above our IRD");
                    }
                    assert!(n.ord <= cfg.ord);
                    if p.ird != NO_NEG && cfg.ord != NO_NEG {
                        assert!(n.ord <= p.ird, "our ORD above the Responder's IRD");
                    }
                    assert_eq!(n.rtr.is_some(), cfg.peer_to_peer);
                    assert_eq!(p.peer_to_peer, cfg.peer_to_peer);
                    if let Some(kind) = n.rtr {
                        assert!(rtr_offered(&p, kind) && rtr_supported(cfg, kind));
                    }
                }
            }
        }
    }
}

/// What a Responder with `cfg` sent and decided on accepting `request` (the frame it read).
fn check_accept(cfg: &MpaConfig, request: &MpaFrameRepr, reply: &[u8], n: &Negotiated) {
    let r = MpaFrameRepr::parse_bytes(reply).expect("our Reply parses");
    assert_eq!(r.buffer_len(), reply.len());
    assert_eq!(r.kind, FrameKind::Reply);
    assert!(!r.reject);
    assert_eq!(r.rev, request.rev.min(cfg.rev));
    assert_eq!(n.rev, r.rev);
    assert_eq!(r.crc, cfg.crc || request.crc);
    assert_eq!(n.crc, r.crc);
    assert_eq!(r.markers, cfg.markers);
    assert_eq!((n.markers_tx, n.markers_rx), (request.markers, cfg.markers));
    assert_eq!(r.enhanced.is_some(), request.enhanced.is_some());
    // With an RTR agreed the Responder waits for it whatever it is told (RFC 6581 5).
    assert_eq!(
        n.responder_waits_for_fpdu,
        cfg.responder_waits_for_fpdu || n.rtr.is_some()
    );
    if let (Some(block), Some(init)) = (r.enhanced, request.enhanced) {
        assert_eq!(block.peer_to_peer, init.peer_to_peer);
        if init.ird != NO_NEG && cfg.ord != NO_NEG {
            assert!(n.ord <= init.ird, "our ORD above the Initiator's IRD");
            assert_eq!(block.ord, n.ord);
        }
        if init.ord != NO_NEG && cfg.ird != NO_NEG {
            assert_eq!(block.ird, n.ird);
        }
        assert_eq!(n.rtr.is_some(), init.peer_to_peer);
        if let Some(kind) = n.rtr {
            assert!(rtr_supported(cfg, kind) && rtr_offered(&block, kind));
            let flags = [block.rtr_send, block.rtr_write, block.rtr_read];
            // Exactly the kind we expect is offered: a common one, or with none in common
            // (RFC 6581 9.2: "at least one ... it supports") the one we prefer.
            assert_eq!(flags.iter().filter(|f| **f).count(), 1);
            if !rtr_offered(&init, kind) {
                let common = (init.rtr_send && cfg.rtr_send)
                    || (init.rtr_write && cfg.rtr_write)
                    || (init.rtr_read && cfg.rtr_read);
                assert!(!common, "a common RTR kind was not picked");
            }
        }
    } else {
        assert_eq!(n.rtr, None);
    }
}

/// Feeds `stream` to an Initiator in pieces sized by the input; returns its decision and the
/// octets it consumed, or its error.
fn feed_initiator(
    init: &mut Initiator,
    stream: &[u8],
    input: &mut Input,
    now: &mut Instant,
) -> Option<Result<(InitiatorEvent, Vec<u8>), MpaError>> {
    let mut taken = Vec::new();
    let mut at = 0;
    for _ in 0..64 {
        let n = usize::from(input.u8() % 48);
        let piece = &stream[at..(at + n).min(stream.len())];
        *now += Duration::from_millis(u64::from(input.u8() >> 4));
        if input.u8() & 0x80 != 0 {
            match init.handle_timeout(*now) {
                Ok(()) => {}
                Err(e) => {
                    assert_eq!(
                        init.feed(piece, *now).err(),
                        Some(e.clone()),
                        "error repeated"
                    );
                    return Some(Err(e));
                }
            }
        }
        match init.feed(piece, *now) {
            Ok((consumed, InitiatorEvent::NeedMore)) => {
                assert_eq!(consumed, piece.len(), "needs more but left octets");
                taken.extend_from_slice(piece);
                at += consumed;
                assert!(
                    taken.len() < 20 + MAX_PRIVATE_DATA,
                    "took more than a frame"
                );
            }
            Ok((consumed, event)) => {
                assert!(consumed <= piece.len());
                taken.extend_from_slice(&piece[..consumed]);
                assert!(
                    init.poll_timeout().is_none(),
                    "a deadline after the decision"
                );
                let again = init.feed(piece, *now);
                assert!(again.is_err(), "fed again after deciding: {again:?}");
                return Some(Ok((event, taken)));
            }
            Err(e) => {
                assert_eq!(
                    init.feed(piece, *now).err(),
                    Some(e.clone()),
                    "error repeated"
                );
                return Some(Err(e));
            }
        }
        if at >= stream.len() && n > 0 {
            return None;
        }
    }
    None
}

/// Feeds `stream` to a Responder (whose `MpaConfig::accept_timeout` is `accept_timeout`) in
/// pieces; returns the Request info and the octets it took.
fn feed_responder(
    resp: &mut Responder,
    accept_timeout: Duration,
    stream: &[u8],
    input: &mut Input,
    now: &mut Instant,
) -> Option<Result<(mpa::RequestInfo, Vec<u8>), MpaError>> {
    let mut taken = Vec::new();
    let mut at = 0;
    for _ in 0..64 {
        let n = usize::from(input.u8() % 48);
        let piece = &stream[at..(at + n).min(stream.len())];
        *now += Duration::from_millis(u64::from(input.u8() >> 4));
        if input.u8() & 0x80 != 0 {
            if let Err(e) = resp.handle_timeout(*now) {
                assert_eq!(
                    resp.feed(piece, *now).err(),
                    Some(e.clone()),
                    "error repeated"
                );
                return Some(Err(e));
            }
        }
        match resp.feed(piece, *now) {
            Ok((consumed, None)) => {
                assert_eq!(consumed, piece.len(), "needs more but left octets");
                taken.extend_from_slice(piece);
                at += consumed;
                assert!(
                    taken.len() < 20 + MAX_PRIVATE_DATA,
                    "took more than a frame"
                );
            }
            Ok((consumed, Some(info))) => {
                assert!(consumed <= piece.len());
                taken.extend_from_slice(&piece[..consumed]);
                assert_eq!(
                    resp.poll_timeout(),
                    now.checked_add(accept_timeout),
                    "after the Request, the deadline is the accept timeout's"
                );
                assert!(
                    resp.feed(piece, *now).is_err(),
                    "fed again after the Request"
                );
                return Some(Ok((info, taken)));
            }
            Err(e) => {
                assert_eq!(
                    resp.feed(piece, *now).err(),
                    Some(e.clone()),
                    "error repeated"
                );
                return Some(Err(e));
            }
        }
        if at >= stream.len() && n > 0 {
            return None;
        }
    }
    None
}

fn check_request_info(cfg: &MpaConfig, info: &mpa::RequestInfo, taken: &[u8]) -> Vec<u8> {
    let r = MpaFrameRepr::parse_bytes(taken).expect("the Request taken parses");
    assert_eq!(
        r.buffer_len(),
        taken.len(),
        "took more or less than the Request"
    );
    assert_eq!(r.kind, FrameKind::Request);
    assert!(r.rev >= 1);
    assert!(r.pd_length() <= cfg.max_private_data.min(MAX_PRIVATE_DATA));
    assert!(r.enhanced.is_none() || cfg.rev >= 2);
    assert_eq!(
        (info.rev, info.markers, info.crc, info.enhanced),
        (r.rev, r.markers, r.crc, r.enhanced)
    );
    assert_eq!(info.private_data, r.private_data);
    taken.to_vec()
}

fn initiator_mode(input: &mut Input) {
    let cfg = config(input);
    let private = private_data(input);
    let mut now = Instant::now();
    let Ok(mut init) = Initiator::new(cfg.clone(), private, now) else {
        return;
    };
    check_request(&cfg, private, init.request());
    let stream = input.rest().to_vec();
    let mut pieces = Input::new(&stream);
    // The pieces' sizes and the Reply come from the same octets: sizes from the front.
    let split = usize::from(pieces.u8()).min(stream.len());
    let (sizes, reply) = stream.split_at(split);
    let mut sizes = Input::new(sizes);
    if let Some(Ok((event, taken))) = feed_initiator(&mut init, reply, &mut sizes, &mut now) {
        let repr = MpaFrameRepr::parse_bytes(&taken).expect("the Reply taken parses");
        assert_eq!(
            repr.buffer_len(),
            taken.len(),
            "took more or less than the Reply"
        );
        assert!(repr.pd_length() <= cfg.max_private_data.min(MAX_PRIVATE_DATA));
        check_initiator_decision(&cfg, &repr, &event);
    }
}

fn responder_mode(input: &mut Input) {
    let cfg = config(input);
    let reject = input.u8() & 1 != 0;
    let private = private_data(input);
    let mut now = Instant::now();
    let Ok(mut resp) = Responder::new(cfg.clone(), now) else {
        return;
    };
    let stream = input.rest().to_vec();
    let mut front = Input::new(&stream);
    let split = usize::from(front.u8()).min(stream.len());
    let (sizes, request) = stream.split_at(split);
    let mut sizes = Input::new(sizes);
    let Some(Ok((info, taken))) =
        feed_responder(&mut resp, cfg.accept_timeout, request, &mut sizes, &mut now)
    else {
        return;
    };
    let taken = check_request_info(&cfg, &info, &taken);
    let request = MpaFrameRepr::parse_bytes(&taken).expect("parsed above");
    answer(&mut resp, &cfg, &request, reject, private);
}

/// Accepts or rejects; checks what comes out. Returns the Reply and, on accept, the outcome.
fn answer(
    resp: &mut Responder,
    cfg: &MpaConfig,
    request: &MpaFrameRepr,
    reject: bool,
    private: &[u8],
) -> Option<(Vec<u8>, Option<Negotiated>)> {
    let too_long = private.len() + if request.enhanced.is_some() { 4 } else { 0 } > 512;
    if reject {
        let reply = match resp.reject(private) {
            Ok(reply) => reply,
            Err(e) => {
                assert!(too_long, "reject failed: {e:?}");
                return None;
            }
        };
        let r = MpaFrameRepr::parse_bytes(&reply).expect("our reject Reply parses");
        assert!(r.reject && r.kind == FrameKind::Reply);
        assert_eq!(r.private_data, private);
        assert_eq!(r.enhanced.is_some(), request.enhanced.is_some());
        Some((reply, None))
    } else {
        match resp.accept(private) {
            Ok((reply, n)) => {
                assert!(!too_long);
                check_accept(cfg, request, &reply, &n);
                Some((reply, Some(n)))
            }
            Err(MpaError::NoMatchingRtr) => {
                // Only a Responder supporting no RTR kind at all refuses to accept.
                let init = request.enhanced.expect("RTR only with the block");
                assert!(init.peer_to_peer);
                assert!(!cfg.rtr_send && !cfg.rtr_write && !cfg.rtr_read);
                None
            }
            Err(e) => {
                assert!(too_long, "accept failed: {e:?}");
                None
            }
        }
    }
}

/// Applies up to a few octet changes chosen by the input; true if any changed something.
fn mangle(frame: &mut [u8], input: &mut Input) -> bool {
    let mut changed = false;
    for _ in 0..(input.u8() % 4) {
        let at = usize::from(input.u16());
        let x = input.u8();
        if let Some(b) = frame.get_mut(at % frame.len().max(1)) {
            *b ^= x;
            changed |= x != 0;
        }
    }
    changed
}

fn pair_mode(input: &mut Input) {
    let icfg = config(input);
    let rcfg = config(input);
    let ipriv = private_data(input);
    let rpriv = private_data(input);
    let reject = input.u8() & 3 == 0;
    let mut now = Instant::now();
    let (Ok(mut init), Ok(mut resp)) = (
        Initiator::new(icfg.clone(), ipriv, now),
        Responder::new(rcfg.clone(), now),
    ) else {
        return;
    };
    let mut request = init.request().to_vec();
    let mut changed = mangle(&mut request, input);
    let Some(Ok((info, taken))) =
        feed_responder(&mut resp, rcfg.accept_timeout, &request, input, &mut now)
    else {
        return;
    };
    let taken = check_request_info(&rcfg, &info, &taken);
    let request = MpaFrameRepr::parse_bytes(&taken).expect("parsed above");
    let Some((mut reply, r_neg)) = answer(&mut resp, &rcfg, &request, reject, rpriv) else {
        return;
    };
    changed |= mangle(&mut reply, input);
    let reply_len = reply.len();
    // FPDU octets may follow the Reply in the same read.
    reply.extend_from_slice(input.bytes(64));
    let Some(outcome) = feed_initiator(&mut init, &reply, input, &mut now) else {
        return;
    };
    let (event, taken) = match outcome {
        Ok(decided) => decided,
        Err(e) => {
            // Unchanged frames fail only on the Initiator's own limits (time, private data)
            // or on RTR kinds it cannot send (the Responder offered its own, RFC 6581 9.2).
            let no_common_rtr = matches!(e, MpaError::NoMatchingRtr)
                && r_neg
                    .as_ref()
                    .is_some_and(|r| r.rtr.is_some_and(|kind| !rtr_supported(&icfg, kind)));
            assert!(
                changed
                    || no_common_rtr
                    || matches!(
                        e,
                        MpaError::StartupTimeout | MpaError::PrivateDataTooLong { .. }
                    ),
                "the Initiator refused an unchanged Reply: {e:?}"
            );
            // A Terminate goes out exactly after codes 6 and 7 (RFC 6581 9.1, 9.2).
            assert_eq!(
                init.terminate_encoder().is_some(),
                matches!(
                    e,
                    MpaError::InsufficientIrd { .. } | MpaError::NoMatchingRtr
                ),
                "{e:?}"
            );
            return;
        }
    };
    let repr = MpaFrameRepr::parse_bytes(&taken).expect("the Reply taken parses");
    check_initiator_decision(&icfg, &repr, &event);
    if changed {
        return;
    }
    assert_eq!(taken.len(), reply_len, "the Initiator read past the Reply");
    match (event, r_neg) {
        (InitiatorEvent::Accepted { negotiated: i, .. }, Some(r)) => {
            assert_eq!(i.rev, r.rev);
            assert_eq!(i.crc, r.crc, "CRC use differs");
            assert_eq!(
                i.markers_tx, r.markers_rx,
                "Markers towards the Responder differ"
            );
            assert_eq!(
                i.markers_rx, r.markers_tx,
                "Markers towards the Initiator differ"
            );
            assert_eq!(i.rtr, r.rtr, "RTR kinds differ");
            // IRD/ORD are negotiated only when both frames carried the RFC 6581 block.
            let negotiated = i.peer_params.is_some() && r.peer_params.is_some();
            if negotiated && i.ord != NO_NEG && r.ird != NO_NEG {
                assert!(
                    i.ord <= r.ird,
                    "Initiator ORD {} > Responder IRD {}",
                    i.ord,
                    r.ird
                );
            }
            if negotiated && r.ord != NO_NEG && i.ird != NO_NEG {
                assert!(
                    r.ord <= i.ird,
                    "Responder ORD {} > Initiator IRD {}",
                    r.ord,
                    i.ird
                );
            }
        }
        (InitiatorEvent::Rejected { .. }, None) => {}
        (event, r) => panic!("the sides disagree: {event:?} / {r:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    match input.u8() % 4 {
        0 => frame(input.rest()),
        1 => initiator_mode(&mut input),
        2 => responder_mode(&mut input),
        _ => pair_mode(&mut input),
    }
});
