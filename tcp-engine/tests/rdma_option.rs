//! Sending with the TCP RDMA option (draft-csapuntz-tcprdma-00; `Connection::send_rdma`): a
//! stream laid out as HTTP responses (a header, then a body that is an RDMA transfer whose RID
//! is the response's index, section 5.2) crosses the simulator, with and without loss and
//! reordering. Every segment is checked on the wire: one that carries octets of a body carries
//! the option (3.1.8), with the Buffer Offset, Data Offset and Data Length of exactly those
//! octets (one run of one transfer per segment, section 4), gives up the option's octets of
//! payload, and carries the same annotation when retransmitted; one that carries none has no
//! option. The receiver (which does not use the option) reads the stream byte-exact. With the
//! option not negotiated, nothing is annotated and the stream is the same.
mod common;
use common::*;
use std::sync::Arc;
use std::time::Duration;
use tcp_engine::sim::{Direction, Network, Rng};
use tcp_engine::wire::rdma::{RdmaFlags, RdmaOption, RdmaTransfer, Rid};
use tcp_engine::{Config, RdmaSend, SegmentRepr};

/// One response: its header's stream range and its body's.
struct Response {
    header: std::ops::Range<usize>,
    body: std::ops::Range<usize>,
}

fn responses(seed: u64, count: usize) -> (Vec<u8>, Vec<Response>) {
    let mut rng = Rng::new(seed);
    let mut stream = Vec::new();
    let mut out = Vec::new();
    for _ in 0..count {
        let h = rng.range(60, 400) as usize;
        let b = rng.range(0, 40_000) as usize;
        let start = stream.len();
        let mut bytes = vec![0u8; h + b];
        rng.fill(&mut bytes);
        stream.extend_from_slice(&bytes);
        out.push(Response {
            header: start..start + h,
            body: start + h..start + h + b,
        });
    }
    (stream, out)
}

/// A client and a server over links with `loss` (and reordering), run until both are
/// ESTABLISHED.
fn connected(seed: u64, loss: f64, c_cfg: Config, s_cfg: Config) -> (Peer, Peer, Network) {
    let (mut c, mut s, mut net) = setup(seed, 0, lossy(loss), lossy(loss), c_cfg, s_cfg);
    let established = net.run(
        &mut c,
        &mut s,
        tcp_engine::Instant::from_millis(10_000),
        |c, s, _| {
            c.state() == Some(tcp_engine::State::Established)
                && s.state() == Some(tcp_engine::State::Established)
        },
        |_, _, _| {},
    );
    assert!(established);
    (c, s, net)
}

struct Seen {
    annotated: u64,
    /// Annotated segments the receiver, which posted no buffer, took as ordinary data.
    refused: u64,
    plain_data: u64,
    retransmitted_annotated: u64,
}

/// Runs the transfer; checks every data segment the client sends against the responses.
fn run(seed: u64, loss: f64, server_offers: bool) -> Seen {
    let cfg = Config {
        rdma_option: true,
        ..Config::default()
    };
    let server_cfg = Config {
        rdma_option: server_offers,
        ..Config::default()
    };
    let (stream, resp) = responses(seed, 24);
    let (mut c, mut s, mut net) = connected(seed, loss, cfg, server_cfg);
    assert_eq!(c.conn().rdma_option_enabled(), server_offers);
    // Queue the whole stream: headers as ordinary data, bodies in two calls each (the second
    // continues the section).
    let conn = c.conn_mut();
    for (i, r) in resp.iter().enumerate() {
        assert_eq!(conn.send(&stream[r.header.clone()]), Ok(r.header.len()));
        let mid = r.body.start + r.body.len() / 3;
        for (from, to) in [(r.body.start, mid), (mid, r.body.end)] {
            let send = RdmaSend {
                rid: Rid::new(i as u64).expect("rid"),
                buffer_offset: (from - r.body.start) as u32,
                total_length: Some(r.body.len() as u32),
                unsolicited: false,
            };
            assert_eq!(conn.send_rdma(&stream[from..to], send), Ok(to - from));
        }
    }
    let emss = usize::from(conn.emss());
    c.src = Arc::new(stream.clone());
    c.queued = stream.len();
    s.dest = vec![0u8; stream.len()];
    s.received = 0;

    let mut seq0 = None;
    let mut sent = std::collections::HashMap::new();
    let mut seen = Seen {
        annotated: 0,
        refused: 0,
        plain_data: 0,
        retransmitted_annotated: 0,
    };
    // The first body with octets in `[from, to)`.
    let body_in = |from: usize, to: usize| {
        resp.iter()
            .position(|r| !r.body.is_empty() && r.body.end > from && r.body.start < to)
    };
    let ok = run_until_done(
        &mut c,
        &mut s,
        &mut net,
        Duration::from_secs(120),
        |dir, _, pkt| {
            if dir != Direction::AtoB {
                return;
            }
            let seg = SegmentRepr::parse(pkt).expect("our own segments parse");
            if seg.payload.is_empty() {
                assert_eq!(
                    seg.options.rdma, None,
                    "an option on a segment without data"
                );
                return;
            }
            let seq0 = *seq0.get_or_insert(seg.seq);
            let off = seg.seq.wrapping_sub(seq0) as usize;
            let end = off + seg.payload.len();
            assert_eq!(seg.payload, &stream[off..end], "payload at {off}");
            // The bodies the segment touches.
            let Some(i) = body_in(off, end) else {
                assert_eq!(
                    seg.options.rdma, None,
                    "option on [{off}, {end}) of no body"
                );
                seen.plain_data += 1;
                return;
            };
            if !server_offers {
                assert_eq!(seg.options.rdma, None, "annotated without negotiation");
                seen.plain_data += 1;
                return;
            }
            let r = &resp[i];
            let (from, to) = (off.max(r.body.start), end.min(r.body.end));
            assert!(
                to == end || body_in(to, end).is_none(),
                "[{off}, {end}) holds octets of two bodies"
            );
            let Some(RdmaOption::Transfer(t)) = seg.options.rdma else {
                panic!("[{off}, {end}) carries body {i} without the option");
            };
            assert_eq!(t.rid.get(), i as u64);
            assert_eq!(t.total_length, Some(r.body.len() as u32));
            assert_eq!(usize::from(t.data_offset), from - off);
            assert_eq!(usize::from(t.data_length), to - from);
            assert_eq!(t.buffer_offset as usize, from - r.body.start);
            assert_eq!(t.data_range(seg.payload.len()), Ok(from - off..to - off));
            assert!(
                seg.payload.len() + 20 <= emss,
                "the option's octets off the payload"
            );
            seen.annotated += 1;
            if let Some(prev) = sent.insert((off, end), t) {
                assert_eq!(prev, t, "a retransmission annotated otherwise");
                seen.retransmitted_annotated += 1;
            }
        },
    );
    assert!(ok, "transfer incomplete");
    seen.refused = s.conn().stats().rdma_refused;
    assert_eq!(
        c.conn().stats().rdma_options_sent,
        seen.annotated,
        "counted as sent"
    );
    seen
}

#[test]
fn bodies_are_annotated_segment_by_segment() {
    let seen = run(3, 0.0, true);
    // Every body cut in pieces of at most EMSS - 20 octets, each piece annotated; the
    // receiver posted no buffer, so it read them all through the stream (byte-exact).
    assert!(seen.annotated > 24, "{} annotated", seen.annotated);
    assert_eq!(
        seen.refused, seen.annotated,
        "unknown RIDs are ordinary data"
    );
    assert_eq!(seen.retransmitted_annotated, 0);
}

#[test]
fn retransmissions_carry_the_same_annotation() {
    let mut retransmitted = 0;
    for seed in [5, 6, 7] {
        let seen = run(seed, 0.05, true);
        assert!(seen.annotated > 24);
        retransmitted += seen.retransmitted_annotated;
    }
    assert!(retransmitted > 0, "the loss exercised no retransmission");
}

#[test]
fn without_the_peers_offer_nothing_is_annotated() {
    let seen = run(9, 0.01, false);
    assert_eq!(seen.annotated, 0);
    assert!(seen.plain_data > 0);
}

/// The receiver posts a buffer per body (RID = the response's index): every body octet lands
/// in its buffer, in or out of order, never through the ring; the headers are read in order
/// as usual, and the placed ranges are reported between them, in stream order.
fn run_placed(seed: u64, loss: f64) -> (u64, u64) {
    let cfg = Config {
        rdma_option: true,
        ..Config::default()
    };
    let (stream, resp) = responses(seed, 24);
    let (mut c, mut s, mut net) = connected(seed, loss, cfg.clone(), cfg);
    for (i, r) in resp.iter().enumerate() {
        if !r.body.is_empty() {
            s.conn_mut()
                .post_rdma_buffer(
                    Rid::new(i as u64).expect("rid"),
                    vec![0; r.body.len()],
                    false,
                )
                .expect("post");
        }
    }
    let conn = c.conn_mut();
    for (i, r) in resp.iter().enumerate() {
        assert_eq!(conn.send(&stream[r.header.clone()]), Ok(r.header.len()));
        let send = RdmaSend {
            rid: Rid::new(i as u64).expect("rid"),
            buffer_offset: 0,
            total_length: None,
            unsolicited: false,
        };
        assert_eq!(
            conn.send_rdma(&stream[r.body.clone()], send),
            Ok(r.body.len())
        );
    }
    c.src = Arc::new(stream.clone());
    c.queued = stream.len();
    s.dest = vec![0u8; stream.len()];
    let done = net.run(
        &mut c,
        &mut s,
        tcp_engine::Instant::from_millis(120_000),
        |c, s, _| s.received == stream.len() && c.sent_all_acked(),
        |_, _, _| {},
    );
    assert!(
        done,
        "transfer incomplete: {} of {}",
        s.received,
        stream.len()
    );
    // The headers came through the stream; the bodies were placed, each range once.
    let mut at = 0;
    let placed_list = s.placed.clone();
    let mut placed = placed_list.iter().peekable();
    for (i, r) in resp.iter().enumerate() {
        assert_eq!(
            &s.dest[r.header.clone()],
            &stream[r.header.clone()],
            "header {i}"
        );
        at = at.max(r.header.end);
        let mut covered = 0;
        while let Some(p) = placed.next_if(|p| (p.stream_offset as usize) < r.body.end) {
            assert_eq!(p.rid.get(), i as u64);
            assert_eq!(
                p.stream_offset as usize,
                r.body.start + p.buffer_offset as usize
            );
            assert_eq!(
                p.stream_offset as usize, at,
                "ranges in stream order, no gap"
            );
            at += p.len as usize;
            covered += p.len as usize;
            // Nothing of a placed range went to the ring (the stream's copy stays zero).
            assert!(s.dest[p.stream_offset as usize..at].iter().all(|&b| b == 0));
        }
        assert_eq!(covered, r.body.len(), "body {i} placed whole");
        let buf = s
            .conn_mut()
            .take_rdma_buffer(Rid::new(i as u64).expect("rid"));
        if !r.body.is_empty() {
            assert_eq!(buf.as_deref(), Some(&stream[r.body.clone()]), "body {i}");
        }
    }
    let st = s.conn().stats();
    let bodies: usize = resp.iter().map(|r| r.body.len()).sum();
    assert_eq!(
        (st.rdma_placed_in_order + st.rdma_placed_out_of_order) as usize,
        bodies,
        "every body octet placed once"
    );
    assert_eq!(st.rdma_refused, 0);
    (st.rdma_placed_in_order, st.rdma_placed_out_of_order)
}

#[test]
fn bodies_are_placed_in_the_posted_buffers() {
    // (The loss-free link still jitters, so some segments arrive out of order.)
    let (in_order, _) = run_placed(11, 0.0);
    assert!(in_order > 0);
    let mut ooo = 0;
    for seed in [12, 13, 14] {
        ooo += run_placed(seed, 0.05).1;
    }
    assert!(ooo > 0, "loss and reordering placed nothing out of order");
}

/// A segment from the peer to `conn` (driven by hand, no timestamps): `off` octets past where
/// its stream began (`base`), `payload`, `transfer` as its RDMA option, a FIN if `fin`.
fn from_peer(
    conn: &mut tcp_engine::Connection,
    now: tcp_engine::Instant,
    base: u32,
    off: u32,
    payload: &[u8],
    transfer: Option<RdmaTransfer>,
    fin: bool,
) {
    let t = conn.four_tuple();
    let mut options = tcp_engine::wire::TcpOptions::default();
    options.rdma = transfer.map(RdmaOption::Transfer);
    let seg = SegmentRepr {
        tos: 0,
        src_addr: t.remote_addr,
        dst_addr: t.local_addr,
        src_port: t.remote_port,
        dst_port: t.local_port,
        seq: base.wrapping_add(off),
        ack: conn.snd_nxt(),
        flags: tcp_engine::wire::TcpFlags {
            ack: true,
            fin,
            ..Default::default()
        },
        window: u16::MAX,
        options,
        payload,
    };
    conn.handle_segment(now, &seg, |_| None);
}

/// A connection with the option in use, driven by hand as the receiver of the peer's
/// [`from_peer`] segments, and the time.
fn rdma_receiver() -> (tcp_engine::Connection, tcp_engine::Instant) {
    driven_client(Config {
        rdma_option: true,
        ..Config::default()
    })
}

/// The option of a segment that carries `len` octets of transfer `rid` at `buffer_offset`,
/// from the start of its payload.
fn transfer(rid: Rid, buffer_offset: u32, len: u16) -> Option<RdmaTransfer> {
    Some(RdmaTransfer {
        flags: RdmaFlags::default(),
        rid,
        buffer_offset,
        data_offset: 0,
        data_length: len,
        total_length: None,
    })
}

/// A FIN the peer sends below octets that were placed out of order: the stream ends at the
/// FIN, so what was placed beyond it is forgotten with the rest TCP held there, and when the
/// gap below fills, delivery reaches the FIN: the octets through the stream, the placed range
/// cut at the FIN, then the peer's close. Before, the placed range, reaching past the end of
/// the stream, was never delivered and the stream stalled short of it.
#[test]
fn a_fin_below_placed_octets_cuts_what_was_placed_at_it() {
    let (mut conn, now) = rdma_receiver();
    assert!(conn.rdma_option_enabled());
    let rid = Rid::new(1).expect("rid");
    conn.post_rdma_buffer(rid, vec![0; 100], false)
        .expect("post");
    let base = conn.rcv_nxt();
    from_peer(
        &mut conn,
        now,
        base,
        1000,
        &[0xab; 100],
        transfer(rid, 0, 100),
        false,
    );
    from_peer(&mut conn, now, base, 1050, &[], None, true);
    from_peer(&mut conn, now, base, 0, &[0x11; 1000], None, false);
    let mut out = vec![0u8; 4096];
    assert_eq!(conn.recv(&mut out), 1000);
    assert!(out[..1000].iter().all(|&b| b == 0x11));
    let placed = conn.next_placed().expect("the placed octets below the FIN");
    assert_eq!(
        (
            placed.stream_offset,
            placed.len,
            placed.rid,
            placed.buffer_offset
        ),
        (1000, 50, rid, 0)
    );
    assert_eq!(conn.next_placed(), None);
    assert_eq!(conn.recv(&mut out), 0);
    assert_eq!(conn.state(), tcp_engine::State::CloseWait);
}

/// Ranges placed in a buffer the application took back are not joined with ranges placed in
/// the next buffer posted for the same RID, though they continue each other in the stream
/// and at the buffer offsets: each is reported for the buffer it went into.
#[test]
fn a_buffer_posted_again_for_its_rid_starts_its_own_placed_ranges() {
    let (mut conn, now) = rdma_receiver();
    let rid = Rid::new(1).expect("rid");
    conn.post_rdma_buffer(rid, vec![0; 20], false)
        .expect("post");
    let base = conn.rcv_nxt();
    from_peer(
        &mut conn,
        now,
        base,
        0,
        &[1; 10],
        transfer(rid, 0, 10),
        false,
    );
    let first = conn.take_rdma_buffer(rid).expect("the first buffer");
    assert_eq!(&first[..10], &[1; 10]);
    conn.post_rdma_buffer(rid, vec![0; 20], false)
        .expect("post again");
    from_peer(
        &mut conn,
        now,
        base,
        10,
        &[2; 10],
        transfer(rid, 10, 10),
        false,
    );
    let a = conn.next_placed().expect("the first buffer's range");
    assert_eq!((a.stream_offset, a.len, a.buffer_offset), (0, 10, 0));
    let b = conn.next_placed().expect("the second buffer's range");
    assert_eq!((b.stream_offset, b.len, b.buffer_offset), (10, 10, 10));
    let second = conn.take_rdma_buffer(rid).expect("the second buffer");
    assert_eq!(&second[10..], &[2; 10]);
}

/// With Nagle's algorithm on, segments of an RDMA transfer (each short of a full segment by
/// its option's octets, draft section 3.4) go as a full window would: a segment is held only
/// when it is short for want of data. Before, each counted as small, and one went per round
/// trip.
#[test]
fn nagle_lets_a_transfers_segments_go_together() {
    let cfg = Config {
        rdma_option: true,
        nagle: true,
        ..Config::default()
    };
    let (mut conn, now) = driven_client(cfg);
    let send = RdmaSend {
        rid: Rid::new(1).expect("rid"),
        buffer_offset: 0,
        total_length: None,
        unsolicited: false,
    };
    assert_eq!(conn.send_rdma(&[7u8; 65536], send), Ok(65536));
    let sent = sent_now(&mut conn, now);
    assert!(
        sent.len() >= 4,
        "{} segments before the first ACK: {sent:?}",
        sent.len()
    );
}

/// What a receiver would refuse (draft-csapuntz-tcprdma-00 3.1.4-3.1.5, 6.1) is refused to
/// the sender, whole, before anything is queued: octets past the transfer's total length, a
/// second total for a transfer, octets past a 4 GiB buffer.
#[test]
fn send_rdma_refuses_what_a_receiver_would() {
    let cfg = Config {
        rdma_option: true,
        ..Config::default()
    };
    let (mut conn, _) = driven_client(cfg);
    let rid = Rid::new(1).expect("rid");
    let send = |buffer_offset, total_length| RdmaSend {
        rid,
        buffer_offset,
        total_length,
        unsolicited: false,
    };
    let before = conn.send_capacity();
    assert_eq!(
        conn.send_rdma(&[1u8; 101], send(0, Some(100))),
        Err(tcp_engine::SendError::RdmaPastTotal)
    );
    assert_eq!(
        conn.send_rdma(&[1u8; 10], send(u32::MAX - 5, None)),
        Err(tcp_engine::SendError::RdmaBufferOffset)
    );
    assert_eq!(conn.send_capacity(), before, "nothing queued");
    assert_eq!(conn.send_rdma(&[1u8; 60], send(0, Some(100))), Ok(60));
    assert_eq!(
        conn.send_rdma(&[1u8; 40], send(60, Some(120))),
        Err(tcp_engine::SendError::RdmaTotalChanged)
    );
    // The 16-octet form names no total: allowed between sections that name one.
    assert_eq!(conn.send_rdma(&[1u8; 20], send(60, None)), Ok(20));
    assert_eq!(conn.send_rdma(&[1u8; 20], send(80, Some(100))), Ok(20));
    // Another transfer has a total of its own.
    let other = RdmaSend {
        rid: Rid::new(2).expect("rid"),
        ..send(0, Some(5))
    };
    assert_eq!(conn.send_rdma(&[1u8; 5], other), Ok(5));
}
