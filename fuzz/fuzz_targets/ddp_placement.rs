//! DDP (RFC 5041): header parsing, the tagged checks, and untagged placement and delivery,
//! with the payload copied into guarded memory where the checks say (as the ULP does).
//!
//! Input: a few knobs (queue number, first MSN, queue capacity), then operations: parse
//! arbitrary octets as a DDP segment; place a tagged segment (header and buffer from the input)
//! after `check_tagged`; post an untagged buffer; place or locate an untagged segment; poll
//! deliveries; plan a message with `Segmenter`; record ranges in a `MessageTracker`.
//!
//! Asserts: nothing panics; a header that parses re-emits to the same octets (reserved bits
//! cleared) and the checked view agrees with it; `check_tagged` only passes offsets whose
//! whole payload lies in the buffer; every copy `place`/`locate` allow lies inside the posted
//! buffer (the guards around every buffer are unchanged after each input); deliveries come in
//! MSN order, one per posted buffer, with every octet of the message placed and the length
//! the Last segment fixed; `Segmenter` plans cover a message exactly once; a tracker's ranges
//! stay sorted, disjoint and within the message end.
#![no_main]

use ddp::wire::control;
use ddp::{
    check_tagged, DdpError, DdpHeader, DdpSegment, MessageTracker, Segmenter, TaggedBuffer,
    TaggedHeader, UntaggedHeader, UntaggedQueue,
};
use iwarp_fuzz::{Arena, ArenaRegion, Input};
use libfuzzer_sys::fuzz_target;
use rdmap::RegionBuffer;

fn parse(bytes: &[u8]) {
    let view = DdpSegment::new_checked(bytes);
    let Ok((hdr, payload)) = DdpHeader::parse(bytes) else {
        assert!(view.is_err(), "the view accepts what the parser refuses");
        return;
    };
    let view = view.expect("the view refuses what the parser accepts");
    assert_eq!(view.header(), Ok(hdr));
    assert_eq!(view.payload(), payload);
    assert_eq!(view.header_len(), hdr.header_len());
    assert_eq!(payload, &bytes[hdr.header_len()..]);
    assert_eq!(
        (view.is_tagged(), view.is_last()),
        (hdr.is_tagged(), hdr.last())
    );
    match hdr {
        DdpHeader::Tagged(t) => {
            assert_eq!((view.stag(), view.to()), (Some(t.stag), Some(t.to)));
            assert_eq!((view.qn(), view.msn(), view.mo()), (None, None, None));
        }
        DdpHeader::Untagged(u) => {
            assert_eq!(
                (view.qn(), view.msn(), view.mo()),
                (Some(u.qn), Some(u.msn), Some(u.mo))
            );
            assert_eq!((view.stag(), view.to()), (None, None));
        }
    }
    let mut out = [0u8; 18];
    let n = hdr.emit(&mut out);
    assert_eq!(n, hdr.header_len());
    assert_eq!(
        out[0],
        bytes[0] & !control::RESERVED,
        "control field changed"
    );
    assert_eq!(out[1..n], bytes[1..n], "header fields changed");
    assert_eq!(DdpHeader::parse(&out[..n]).map(|(h, _)| h), Ok(hdr));
    assert_eq!(
        hdr.emit(&mut out[..n - 1]),
        0,
        "emitted into a short buffer"
    );
}

/// A posted untagged buffer and what the target knows was placed in it.
struct Posted {
    region: ArenaRegion,
    placed: Vec<bool>,
    /// Message end fixed by a Last segment.
    end: Option<usize>,
    msn: u32,
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let qn = u32::from(input.u8() % 4);
    let first_msn = match input.u8() % 4 {
        0 => ddp::INITIAL_MSN,
        1 => u32::MAX - u32::from(input.u8() % 8),
        _ => input.u32(),
    };
    let max_posted = usize::from(input.u8() % 12);
    let arena = Arena::new();
    let mut queue: UntaggedQueue<usize> = UntaggedQueue::with_next_msn(qn, max_posted, first_msn);
    let mut posted: Vec<Posted> = Vec::new();
    let mut next_post_msn = first_msn;
    let mut next_delivery = first_msn;
    // Tagged buffers: (region, base TO).
    let mut tagged: Vec<(ArenaRegion, u64)> = Vec::new();
    let mut trackers = [MessageTracker::new(), MessageTracker::new()];

    for _ in 0..128 {
        if input.is_empty() {
            break;
        }
        match input.u8() % 8 {
            0 => {
                let n = usize::from(input.u8() % 48);
                parse(input.bytes(n));
            }
            1 => {
                // A tagged buffer and a segment aimed near (or far from) it.
                if tagged.len() < 4 && input.u8() & 1 == 0 {
                    let len = usize::from(input.u16() % 600);
                    let base = match input.u8() % 3 {
                        0 => u64::from(input.u32()),
                        1 => u64::MAX - u64::from(input.u16()),
                        _ => input.u64(),
                    };
                    tagged.push((arena.region(len, 0x11), base));
                }
                let Some(i) = (!tagged.is_empty()).then(|| usize::from(input.u8()) % tagged.len())
                else {
                    continue;
                };
                let (region, base) = &tagged[i];
                let to = match input.u8() % 3 {
                    0 => base.wrapping_add(u64::from(input.u16() % 700)),
                    1 => base.wrapping_sub(u64::from(input.u8())),
                    _ => input.u64(),
                };
                let hdr = TaggedHeader {
                    last: input.u8() & 1 != 0,
                    rsvd_ulp: 0x40,
                    stag: 0x100,
                    to,
                };
                let n = usize::from(input.u16() % 700);
                let payload = input.bytes(n);
                let buf = TaggedBuffer {
                    base_to: *base,
                    len: region.len() as u64,
                };
                match check_tagged(&hdr, payload.len(), &buf) {
                    Ok(offset) => {
                        if !payload.is_empty() {
                            assert_eq!(to.wrapping_sub(*base), offset, "offset is not TO - base");
                            assert!(
                                offset <= buf.len && payload.len() as u64 <= buf.len - offset,
                                "check_tagged passed a segment beyond its buffer"
                            );
                        }
                        region.write_at(offset as usize, payload);
                    }
                    Err(e) => assert!(matches!(e, DdpError::ToWrap | DdpError::BaseBounds)),
                }
            }
            2 => {
                let len = u32::from(input.u16() % 2048);
                let region = arena.region(len as usize, 0x22);
                match queue.post(len, posted.len()) {
                    Ok(()) => {
                        posted.push(Posted {
                            region,
                            placed: vec![false; len as usize],
                            end: None,
                            msn: next_post_msn,
                        });
                        next_post_msn = next_post_msn.wrapping_add(1);
                    }
                    Err(e) => {
                        assert_eq!(e, DdpError::QueueFull { max_posted });
                        assert_eq!(queue.posted(), max_posted);
                    }
                }
            }
            3 | 4 => {
                let record = input.u8();
                let hdr = UntaggedHeader {
                    last: record & 2 != 0,
                    rsvd_ulp: [0x43, 0, 0, 0, 0],
                    qn: if record & 4 != 0 { input.u32() } else { qn },
                    msn: match input.u8() % 4 {
                        0 => input.u32(),
                        n => queue.next_msn().wrapping_add(u32::from(n) - 1),
                    },
                    mo: match input.u8() % 3 {
                        0 => input.u32(),
                        1 => u32::from(input.u8()),
                        _ => u32::from(input.u16() % 2100),
                    },
                };
                let n = usize::from(input.u16() % 600);
                let payload = input.bytes(n);
                let result = if record & 1 != 0 {
                    queue.place(&hdr, payload.len())
                } else {
                    queue.locate(&hdr, payload.len())
                };
                if let Ok(p) = result {
                    assert_eq!((p.msn, p.offset), (hdr.msn, hdr.mo));
                    assert_eq!(hdr.qn, qn);
                    let b = &mut posted[p.cookie];
                    assert_eq!(b.msn, hdr.msn, "placed into another message's buffer");
                    let at = p.offset as usize;
                    assert!(
                        at <= b.placed.len() && payload.len() <= b.placed.len() - at,
                        "placement beyond the posted buffer"
                    );
                    b.region.write_at(at, payload);
                    if record & 1 != 0 {
                        for x in &mut b.placed[at..at + payload.len()] {
                            *x = true;
                        }
                        if hdr.last {
                            b.end = Some(at + payload.len());
                        }
                    }
                }
            }
            5 => {
                while let Some(d) = queue.poll_delivery() {
                    assert_eq!(d.msn, next_delivery, "delivered out of MSN order");
                    next_delivery = next_delivery.wrapping_add(1);
                    let b = &posted[d.cookie];
                    assert_eq!(b.msn, d.msn, "delivered another message's buffer");
                    let len = d.len as usize;
                    assert_eq!(
                        b.end,
                        Some(len),
                        "length differs from the Last segment's end"
                    );
                    assert!(
                        b.placed[..len].iter().all(|&x| x),
                        "delivered with octets missing"
                    );
                }
            }
            6 => {
                let len = u64::from(input.u16()) << (input.u8() % 3 * 4);
                let max = usize::from(input.u16());
                let mut next = 0u64;
                let mut count = 0u64;
                let segmenter = Segmenter::new(len, max);
                let expected = segmenter.remaining_segments();
                for plan in segmenter.take(4096) {
                    assert_eq!(plan.offset, next, "a gap or overlap in the plan");
                    assert!(plan.len <= max.max(1));
                    next += plan.len as u64;
                    count += 1;
                    assert_eq!(plan.last, next == len, "L bit misplaced");
                }
                if count < 4096 {
                    assert_eq!(next, len, "the plan does not cover the message");
                    assert_eq!(count, expected);
                }
            }
            _ => {
                let t = &mut trackers[usize::from(input.u8() & 1)];
                let offset = u64::from(input.u16());
                let len = u64::from(input.u16() % 512);
                let last = input.u8() & 1 != 0;
                let before = *t;
                match t.record(offset, len, last) {
                    Ok(()) => {
                        let r = t.ranges();
                        assert!(
                            r.windows(2).all(|w| w[0].1 < w[1].0),
                            "ranges overlap or touch"
                        );
                        assert!(r.iter().all(|&(s, e)| s < e));
                        if let Some(end) = t.total_len() {
                            assert!(
                                r.last().is_none_or(|&(_, e)| e <= end),
                                "placed past the end"
                            );
                        }
                        if len > 0 {
                            assert!(r.iter().any(|&(s, e)| s <= offset && offset + len <= e));
                        }
                    }
                    Err(_) => assert_eq!(*t, before, "a refused record changed the tracker"),
                }
            }
        }
    }
    arena.check();
});
