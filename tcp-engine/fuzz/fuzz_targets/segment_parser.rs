//! The segment parser on arbitrary bytes: `Ipv4TcpView::new_checked`, `SegmentRepr::parse` and
//! `TcpOptions::parse` and the receive path's `Ipv4TcpPeek` must never panic, whatever parses
//! must re-emit and parse back to the same segment, and the peek must see in it what the parse
//! sees (addresses, ports, connection request or not).
//!
//! Input: one mode byte, then the packet (IPv4 header onwards). Mode bit 0 set: the IPv4 and
//! TCP checksums are recomputed first, so mutations reach the header, length and option
//! decoding behind the checksum checks (random bytes almost never carry a valid checksum).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tcp_engine::wire::{Ipv4TcpPeek, Ipv4TcpView, TcpOptions, WireError, TCP_MAX_OPTIONS_LEN};
use tcp_engine::SegmentRepr;

/// One's-complement sum of big-endian 16-bit words (odd tail padded with zero).
fn sum16(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Recomputes the IPv4 header checksum and the TCP checksum where the lengths allow it.
fn repair_checksums(p: &mut [u8]) {
    if p.len() < 20 {
        return;
    }
    let ihl = usize::from(p[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if ihl < 20 || ihl > p.len() {
        return;
    }
    p[10] = 0;
    p[11] = 0;
    let c = !fold(sum16(0, &p[..ihl]));
    p[10..12].copy_from_slice(&c.to_be_bytes());
    if total > p.len() || total < ihl + 20 {
        return;
    }
    let (src, dst) = ([p[12], p[13], p[14], p[15]], [p[16], p[17], p[18], p[19]]);
    let tcp = &mut p[ihl..total];
    tcp[16] = 0;
    tcp[17] = 0;
    let mut acc = sum16(0, &src);
    acc = sum16(acc, &dst);
    acc += 6 + tcp.len() as u32;
    let c = !fold(sum16(acc, tcp));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut packet = rest.to_vec();
    if mode & 1 != 0 {
        repair_checksums(&mut packet);
    }
    let _ = TcpOptions::parse(rest);
    let view = Ipv4TcpView::new_checked(&packet);
    let parsed = SegmentRepr::parse(&packet);
    // The repr is the view plus option decoding: it fails only where the view does, or on
    // the options.
    match (&view, &parsed) {
        (Ok(_), Ok(_)) | (Err(_), Err(_)) => {}
        (Ok(_), Err(WireError::TruncatedOption | WireError::BadOptionLength)) => {}
        _ => panic!("view and repr disagree: {view:?} / {parsed:?}"),
    }
    // The receive path's first look (`Ipv4TcpPeek`) never panics, and on every packet that
    // parses it sees what the parse sees.
    let peek = Ipv4TcpPeek::new(&packet);
    if let Some(p) = &peek {
        let _ = (
            p.ports(),
            p.is_syn(),
            p.may_complete_cookie(),
            p.src_addr(),
            p.dst_addr(),
        );
    }
    let Ok(seg) = parsed else {
        return;
    };
    let p = peek.unwrap_or_else(|| panic!("a segment that parses is not peeked at: {seg:?}"));
    let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    assert_eq!(
        p.packet().len(),
        total,
        "the peek is not cut at the total length"
    );
    assert_eq!((p.src_addr(), p.dst_addr()), (seg.src_addr, seg.dst_addr));
    assert_eq!(p.ports(), Some((seg.src_port, seg.dst_port)));
    let f = seg.flags;
    assert_eq!(p.is_syn(), f.syn && !f.ack && !f.rst, "is_syn: {f:?}");
    assert_eq!(
        p.may_complete_cookie(),
        f.ack && !f.syn && !f.rst,
        "may_complete_cookie: {f:?}"
    );
    let mut buf = vec![0u8; seg.packet_len()];
    if seg.options.wire_len() > TCP_MAX_OPTIONS_LEN {
        // Parsed from unpadded options that our padded layout cannot hold (e.g. window scale
        // and four SACK blocks): emitting must refuse, not write a broken header.
        assert_eq!(seg.emit(&mut buf), Err(WireError::OptionsTooLong));
        return;
    }
    let n = seg
        .emit(&mut buf)
        .unwrap_or_else(|e| panic!("a parsed segment does not re-emit: {e:?}: {seg:?}"));
    let again = SegmentRepr::parse(&buf[..n])
        .unwrap_or_else(|e| panic!("a re-emitted segment does not parse: {e:?}: {seg:?}"));
    // Emitting writes a zero acknowledgment number when ACK is off (RFC 9293 3.1: the field
    // means nothing then); everything else must survive unchanged.
    let mut expect = seg;
    if !expect.flags.ack {
        expect.ack = 0;
    }
    // A malformed RDMA option is not read (the segment is ordinary data), so not re-emitted.
    expect.options.rdma_malformed = false;
    assert_eq!(again, expect, "emit/parse round trip changed the segment");
});
