//! Property tests: reassembly through `UntaggedQueue` under reordering and duplication
//! (RFC 5041 5.3, 5.4), header round trips and robustness (4), tagged checks (7.1),
//! and `MessageTracker` against a bitmap model.

use ddp::{
    check_tagged, DdpError, DdpHeader, Delivered, MessageTracker, Segmenter, TaggedBuffer,
    TaggedHeader, UntaggedHeader, UntaggedQueue, MAX_TRACKED_RANGES,
};
use proptest::prelude::*;

const QN: u32 = 0;

/// Payload octet `offset` of message `index`: distinct enough to catch misplacement.
fn pattern(index: usize, offset: u64) -> u8 {
    (index as u64 * 131 + offset * 7 + offset / 251) as u8
}

#[derive(Debug, Clone, Copy)]
struct WireSegment {
    index: usize,
    hdr: UntaggedHeader,
    len: usize,
}

fn scenario() -> impl Strategy<Value = (u32, usize, Vec<u64>, Vec<WireSegment>, Vec<bool>)> {
    (
        prop_oneof![Just(1u32), Just(0xFFFF_FFF0u32), any::<u32>()],
        1usize..200,
        prop::collection::vec(0u64..3000, 1..12),
    )
        .prop_flat_map(|(first_msn, max_payload, raw_lens)| {
            // At most 2 * MAX_TRACKED_RANGES - 1 segments per message, so that even the
            // worst shuffle cannot leave more than MAX_TRACKED_RANGES disjoint pieces.
            let cap = ((2 * MAX_TRACKED_RANGES - 1) * max_payload) as u64;
            let lens: Vec<u64> = raw_lens.iter().map(|&l| l.min(cap)).collect();
            let mut segments = Vec::new();
            for (index, &len) in lens.iter().enumerate() {
                for plan in Segmenter::new(len, max_payload) {
                    segments.push(WireSegment {
                        index,
                        hdr: UntaggedHeader {
                            last: plan.last,
                            rsvd_ulp: [0x43, 0, 0, 0, 0],
                            qn: QN,
                            msn: first_msn.wrapping_add(index as u32),
                            mo: plan.offset as u32,
                        },
                        len: plan.len,
                    });
                }
            }
            let n = segments.len();
            let dup_picks = prop::collection::vec(0..n, 0..=n.min(20));
            (
                Just(first_msn),
                Just(max_payload),
                Just(lens),
                Just(segments),
                dup_picks,
            )
        })
        .prop_flat_map(|(first_msn, max_payload, lens, mut segments, dup_picks)| {
            for pick in dup_picks {
                segments.push(segments[pick]);
            }
            let n = segments.len();
            (
                Just(first_msn),
                Just(max_payload),
                Just(lens),
                Just(segments).prop_shuffle(),
                prop::collection::vec(any::<bool>(), n),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn shuffled_duplicated_segments_deliver_every_message_once_in_order(
        (first_msn, _max_payload, lens, segments, poll_after) in scenario()
    ) {
        let mut queue = UntaggedQueue::with_next_msn(QN, lens.len(), first_msn);
        // Buffers a little larger than the messages; cookie = message index.
        let mut buffers: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l as usize + 3]).collect();
        for (index, buf) in buffers.iter().enumerate() {
            queue.post(buf.len() as u32, index).unwrap();
        }
        let mut delivered: Vec<Delivered<usize>> = Vec::new();
        for (seg, poll) in segments.iter().zip(poll_after) {
            if seg.index < delivered.len() {
                // A late duplicate of a message already delivered: its MSN is behind the
                // window now, so it is rejected and nothing is placed (delivered once).
                prop_assert_eq!(
                    queue.place(&seg.hdr, seg.len),
                    Err(DdpError::MsnRange { msn: seg.hdr.msn })
                );
                continue;
            }
            let placement = queue.place(&seg.hdr, seg.len).unwrap();
            prop_assert_eq!(placement.cookie, seg.index);
            prop_assert_eq!(placement.msn, seg.hdr.msn);
            let start = placement.offset as usize;
            for (i, octet) in buffers[placement.cookie][start..start + seg.len].iter_mut().enumerate() {
                *octet = pattern(seg.index, u64::from(seg.hdr.mo) + i as u64);
            }
            if poll {
                delivered.extend(std::iter::from_fn(|| queue.poll_delivery()));
            }
        }
        delivered.extend(std::iter::from_fn(|| queue.poll_delivery()));

        prop_assert_eq!(delivered.len(), lens.len());
        for (index, d) in delivered.iter().enumerate() {
            prop_assert_eq!(d.cookie, index);
            prop_assert_eq!(d.msn, first_msn.wrapping_add(index as u32));
            prop_assert_eq!(u64::from(d.len), lens[index]);
            let content = &buffers[index][..d.len as usize];
            prop_assert!(content.iter().enumerate().all(|(o, &b)| b == pattern(index, o as u64)));
        }
        prop_assert_eq!(queue.posted(), 0);
        prop_assert_eq!(queue.next_msn(), first_msn.wrapping_add(lens.len() as u32));
    }

    #[test]
    fn parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
        match DdpHeader::parse(&bytes) {
            Ok((hdr, payload)) => {
                prop_assert_eq!(hdr.header_len() + payload.len(), bytes.len());
                prop_assert_eq!(bytes[0] & 0x03, 1);
            }
            Err(DdpError::TaggedVersion | DdpError::UntaggedVersion) => {
                prop_assert_ne!(bytes[0] & 0x03, 1);
            }
            Err(DdpError::HeaderTruncated { len, .. }) => prop_assert_eq!(len, bytes.len()),
            Err(other) => prop_assert!(false, "unexpected error {:?}", other),
        }
        let seg = ddp::DdpSegment::new_unchecked(&bytes[..]);
        let _ = (seg.stag(), seg.to(), seg.qn(), seg.msn(), seg.mo(), seg.payload());
    }

    #[test]
    fn header_round_trip(
        tagged in any::<bool>(), last in any::<bool>(), ulp in any::<[u8; 5]>(),
        a in any::<u32>(), b in any::<u32>(), c in any::<u32>(), to in any::<u64>(),
        payload in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let hdr = if tagged {
            DdpHeader::Tagged(TaggedHeader { last, rsvd_ulp: ulp[0], stag: a, to })
        } else {
            DdpHeader::Untagged(UntaggedHeader { last, rsvd_ulp: ulp, qn: a, msn: b, mo: c })
        };
        let mut buf = vec![0u8; hdr.header_len() + payload.len()];
        prop_assert_eq!(hdr.emit(&mut buf), hdr.header_len());
        buf[hdr.header_len()..].copy_from_slice(&payload);
        let (parsed, rest) = DdpHeader::parse(&buf).unwrap();
        prop_assert_eq!(parsed, hdr);
        prop_assert_eq!(rest, &payload[..]);
    }

    /// The TO is drawn around the buffer (from 8 KiB before its base to 8 KiB past its end,
    /// the base anywhere, near the top of the TO space one time in four) or anywhere: drawn
    /// independently, a TO would practically never fall inside the buffer or wrap, and only
    /// the out-of-bounds answer would ever be checked.
    #[test]
    fn tagged_check_accepts_exactly_the_in_bounds_segments(
        base_to in prop_oneof![3 => any::<u64>(), 1 => (u64::MAX - (2 << 20))..=u64::MAX],
        buf_len in 0u64..1 << 20,
        near in prop::option::weighted(0.9, -8192i64..(1 << 20) + 8192),
        far in any::<u64>(),
        len in 1usize..4096,
    ) {
        let to = near.map_or(far, |off| base_to.wrapping_add_signed(off));
        let buf = TaggedBuffer { base_to, len: buf_len };
        let hdr = TaggedHeader { last: true, rsvd_ulp: 0x40, stag: 1, to };
        let model_end = u128::from(to) + len as u128;
        let result = check_tagged(&hdr, len, &buf);
        if model_end > u128::from(u64::MAX) {
            prop_assert_eq!(result, Err(DdpError::ToWrap));
        } else if to >= base_to && model_end <= u128::from(base_to) + u128::from(buf_len) {
            prop_assert_eq!(result, Ok(to - base_to));
        } else {
            prop_assert_eq!(result, Err(DdpError::BaseBounds));
        }
    }

    #[test]
    fn tracker_matches_a_bitmap_model(
        ops in prop::collection::vec((0u64..64, 0u64..16, prop::bool::weighted(0.1)), 0..60)
    ) {
        let mut tracker = MessageTracker::new();
        let mut placed = [false; 80];
        let mut end: Option<u64> = None;
        for (offset, len, last) in ops {
            let before = tracker;
            let seg_end = offset + len;
            match tracker.record(offset, len, last) {
                Ok(()) => {
                    for bit in &mut placed[offset as usize..seg_end as usize] { *bit = true; }
                    if last { end = Some(seg_end); }
                }
                Err(DdpError::BeyondMessageEnd) => {
                    prop_assert_eq!(tracker, before);
                    let highest = placed.iter().rposition(|&p| p).map_or(0, |i| i as u64 + 1);
                    let inconsistent = match end {
                        Some(e) => if last { e != seg_end } else { seg_end > e },
                        None => last && highest > seg_end,
                    };
                    prop_assert!(inconsistent);
                }
                Err(DdpError::TooManyRanges) => {
                    prop_assert_eq!(tracker, before);
                    prop_assert_eq!(tracker.ranges().len(), MAX_TRACKED_RANGES);
                }
                Err(other) => prop_assert!(false, "unexpected {:?}", other),
            }
            let placed_count = placed.iter().filter(|&&p| p).count() as u64;
            prop_assert_eq!(tracker.placed_octets(), placed_count);
            let model_complete = end.is_some_and(|e| placed[..e as usize].iter().all(|&p| p));
            prop_assert_eq!(tracker.is_complete(), model_complete);
            prop_assert_eq!(tracker.total_len(), end);
        }
    }
}
