//! Taking back octets passed up but not yet acknowledged (`Connection::renege_from`, for IFT's
//! speculative placement, draft-williams-iwarp-ift-01 section 8): the ACK that would have
//! covered them is withheld, the out-of-order ranges beyond are forgotten (RFC 2018 section 8),
//! and the octets are passed up again when they come again. Refused once an ACK covered them,
//! outside pass-up mode, and after the peer's FIN was taken in order; a FIN that arrived out of
//! order waits for the octets taken back, and nothing beyond it is taken.
mod common;
use common::*;
use tcp_engine::sim::Network;
use tcp_engine::wire::{SackBlock, TcpFlags, TcpOptions};
use tcp_engine::{Config, Event, Instant, RxMode, SegmentRepr, State, TakeBack};

const MSS: usize = 1000;

fn pass_up() -> Config {
    Config {
        rx_mode: RxMode::PassUp,
        timestamps: false,
        ..Config::default()
    }
}

/// Our own stream sender (no timestamps, MSS-sized segments) connected to a pass-up receiver.
fn sender_and_pass_up_receiver() -> (Peer, Peer, Network) {
    let stream = Config {
        timestamps: false,
        mss: MSS as u16,
        ..Config::default()
    };
    let receiver = Config {
        mss: MSS as u16,
        ..pass_up()
    };
    established_pair(stream, receiver)
}

/// Feeds the server a data segment of `len` octets at stream offset `off` as the client would
/// send it; returns the stream offsets passed up and the ack numbers of the server's packets
/// emitted right after, if `transmit`.
fn feed(c: &Peer, s: &mut Peer, off: u64, len: usize, transmit: bool) -> (Vec<u64>, Vec<u32>) {
    feed_answering(c, s, off, len, transmit, false, |_| None)
}

/// [`feed`], the segment carrying a FIN if `fin`, the pass-up answering what `answer` gives
/// for each stream offset passed up.
fn feed_answering(
    c: &Peer,
    s: &mut Peer,
    off: u64,
    len: usize,
    transmit: bool,
    fin: bool,
    answer: impl Fn(u64) -> Option<TakeBack>,
) -> (Vec<u64>, Vec<u32>) {
    let t = c.conn().four_tuple();
    let payload = vec![0x5a; len];
    let seg = SegmentRepr {
        tos: 0,
        src_addr: t.local_addr,
        dst_addr: t.remote_addr,
        src_port: t.local_port,
        dst_port: t.remote_port,
        seq: s.conn().rcv_stream_start().wrapping_add(off as u32),
        ack: c.conn().rcv_nxt(),
        flags: TcpFlags {
            ack: true,
            fin,
            ..TcpFlags::default()
        },
        window: 1000,
        options: TcpOptions::default(),
        payload: &payload,
    };
    let mut passed = Vec::new();
    let now = Instant::from_millis(20_000);
    s.conn_mut().handle_segment(now, &seg, |p| {
        passed.push(p.stream_offset);
        answer(p.stream_offset)
    });
    let mut acks = Vec::new();
    let mut buf = [0u8; 2048];
    if transmit {
        while let Some(n) = s.conn_mut().poll_transmit(now, &mut buf) {
            acks.push(SegmentRepr::parse(&buf[..n]).expect("valid segment").ack);
        }
    }
    (passed, acks)
}

#[test]
fn octets_taken_back_before_their_ack_are_passed_up_again() {
    let (c, mut s, _net) = established(pass_up());
    let start = s.conn().rcv_stream_start();
    // Out of order (acknowledged with a SACK for it), then the segment filling the hole.
    let (passed, _) = feed(&c, &mut s, MSS as u64, MSS, true);
    assert_eq!(passed, [MSS as u64]);
    let (passed, _) = feed(&c, &mut s, 0, MSS, false);
    assert_eq!(passed, [0]);
    assert_eq!(s.conn().rcv_nxt_offset(), 2 * MSS as u64);
    // The upper layer wants the second segment again, before any ACK covered it.
    assert!(s.conn_mut().renege_from(MSS as u64));
    assert_eq!(s.conn().rcv_nxt_offset(), MSS as u64);
    assert_eq!(s.conn().stats().reneged, 1);
    let mut buf = [0u8; 2048];
    let n = s
        .conn_mut()
        .poll_transmit(Instant::from_millis(20_000), &mut buf)
        .expect("an ACK");
    let ack = SegmentRepr::parse(&buf[..n]).expect("valid").ack;
    assert_eq!(
        ack,
        start.wrapping_add(MSS as u32),
        "the ACK stops at the taken-back octets"
    );
    // They come again and are passed up again.
    let (passed, acks) = feed(&c, &mut s, MSS as u64, MSS, true);
    assert_eq!(passed, [MSS as u64]);
    assert_eq!(acks, [start.wrapping_add(2 * MSS as u32)]);
    // Acknowledged now: no longer the receiver's to take back.
    assert!(!s.conn_mut().renege_from(MSS as u64));
    assert!(!s.conn_mut().renege_from(0));
    assert!(
        s.conn_mut().renege_from(2 * MSS as u64),
        "nothing there: nothing to refuse"
    );
}

/// The peer's last segment, with its FIN, arrives before the one before it and is taken
/// back: the FIN stays known and closes the connection once the octets come again; after
/// that, nothing can be taken back.
#[test]
fn a_fin_out_of_order_waits_for_the_octets_taken_back() {
    let (c, mut s, _net) = established(pass_up());
    let (passed, _) = feed_answering(&c, &mut s, MSS as u64, MSS, true, true, |_| None);
    assert_eq!(passed, [MSS as u64]);
    assert_eq!(
        s.conn().state(),
        State::Established,
        "the FIN is not in order yet"
    );
    assert!(
        !s.conn_mut().renege_from(3 * MSS as u64),
        "nothing lies beyond the FIN"
    );
    assert!(s.conn_mut().renege_from(MSS as u64));
    let (passed, _) = feed(&c, &mut s, 0, MSS, true);
    assert_eq!(passed, [0]);
    assert_eq!(
        s.conn().rcv_nxt_offset(),
        MSS as u64,
        "the taken-back octets are missing"
    );
    assert_eq!(s.conn().state(), State::Established);
    // They come again, without the FIN flag this time: the FIN known before takes effect.
    let (passed, _) = feed(&c, &mut s, MSS as u64, MSS, true);
    assert_eq!(passed, [MSS as u64]);
    assert_eq!(s.conn().state(), State::CloseWait);
    assert!(
        !s.conn_mut().renege_from(2 * MSS as u64),
        "the FIN was taken"
    );
}

/// Octets beyond a FIN that arrived out of order are not the peer's (RFC 9293 3.10.7.4): they
/// are neither passed up nor counted, so that once the gap before the FIN fills, RCV.NXT
/// reaches the FIN and the connection closes. (They were taken: RCV.NXT jumped past the FIN,
/// which then never took effect.) A second FIN elsewhere does not move the first.
#[test]
fn octets_beyond_an_out_of_order_fin_are_not_taken() {
    let (c, mut s, _net) = established(pass_up());
    let (passed, _) = feed_answering(&c, &mut s, MSS as u64, 0, true, true, |_| None);
    assert!(passed.is_empty());
    let (passed, _) = feed(&c, &mut s, MSS as u64, MSS, true);
    assert!(passed.is_empty(), "beyond the FIN: {passed:?}");
    let (passed, _) = feed_answering(&c, &mut s, MSS as u64 / 2, 0, true, true, |_| None);
    assert!(passed.is_empty());
    let (passed, _) = feed(&c, &mut s, 0, MSS, true);
    assert_eq!(passed, [0]);
    assert_eq!(s.conn().rcv_nxt_offset(), MSS as u64);
    assert_eq!(s.conn().state(), State::CloseWait, "the FIN taken in order");

    // Octets held beyond the gap before the FIN came, and beyond the FIN's place, are
    // forgotten when it comes: the gap filling brings RCV.NXT to the FIN, not past it (which
    // left it never taken, and every later segment beyond its place dropped).
    let (c, mut s, _net) = established(pass_up());
    let (passed, _) = feed(&c, &mut s, MSS as u64, MSS, true);
    assert_eq!(passed, [MSS as u64], "held beyond the gap");
    let fin = MSS as u64 + MSS as u64 / 2;
    let _ = feed_answering(&c, &mut s, fin, 0, true, true, |_| None);
    let (passed, _) = feed(&c, &mut s, 0, MSS, true);
    assert_eq!(passed, [0]);
    assert_eq!(s.conn().rcv_nxt_offset(), fin);
    assert_eq!(s.conn().state(), State::CloseWait);
}

/// The segment that fills the gap before an out-of-order FIN is where an upper layer finds
/// that it must give back what lies beyond the gap (IFT's speculation proved wrong there).
/// Answered in the pass-up, the octets are taken back before the FIN is taken: the FIN stays
/// known and closes the connection once they come again. Asked for after the call, it is too
/// late: the FIN was taken with the gap filled.
#[test]
fn a_take_back_answered_in_the_pass_up_comes_before_the_fin() {
    for in_the_pass_up in [true, false] {
        let (c, mut s, _net) = established(pass_up());
        let _ = feed_answering(&c, &mut s, MSS as u64, MSS, true, true, |_| None);
        let (passed, _) = feed_answering(&c, &mut s, 0, MSS, true, false, |off| {
            (in_the_pass_up && off == 0).then_some(TakeBack { from: MSS as u64 })
        });
        assert_eq!(passed, [0]);
        if !in_the_pass_up {
            assert_eq!(s.conn().state(), State::CloseWait);
            assert!(!s.conn_mut().renege_from(MSS as u64), "too late");
            continue;
        }
        assert_eq!(s.conn().rcv_nxt_offset(), MSS as u64);
        assert_eq!(s.conn().state(), State::Established);
        assert_eq!(s.conn().stats().reneged, 1);
        let (passed, _) = feed(&c, &mut s, MSS as u64, MSS, true);
        assert_eq!(passed, [MSS as u64], "passed up again");
        assert_eq!(s.conn().state(), State::CloseWait);
        while let Some(ev) = s.conn_mut().poll_event() {
            assert!(!matches!(ev, Event::TakeBackRefused { .. }), "{ev:?}");
        }
    }
}

/// A take-back answered for one gap of a segment: the segment's later gaps are not passed up,
/// and they are missing again, as is everything the receiver held beyond.
#[test]
fn a_take_back_stops_the_rest_of_the_segment() {
    let (c, mut s, _net) = established(pass_up());
    let _ = feed(&c, &mut s, MSS as u64, MSS, true);
    let _ = feed(&c, &mut s, 3 * MSS as u64, MSS, true);
    // One segment over [0, 3 MSS): gaps [0, MSS) and [2 MSS, 3 MSS).
    let half = MSS as u64 / 2;
    let (passed, _) = feed_answering(&c, &mut s, 0, 3 * MSS, true, false, |off| {
        (off == 0).then_some(TakeBack { from: half })
    });
    assert_eq!(passed, [0]);
    assert_eq!(s.conn().rcv_nxt_offset(), half);
    let (passed, _) = feed(&c, &mut s, 0, 4 * MSS, true);
    assert_eq!(passed, [half], "all of it comes again, in one piece");
    assert_eq!(s.conn().rcv_nxt_offset(), 4 * MSS as u64);
}

/// With every segment's data passed up whole (`pass_up_duplicates`, octets received before
/// included), a take-back answered for one still takes back from where it says.
#[test]
fn a_take_back_with_duplicates_passed_up() {
    let (c, mut s, _net) = established(Config {
        pass_up_duplicates: true,
        ..pass_up()
    });
    let _ = feed(&c, &mut s, MSS as u64, MSS, true);
    let (passed, acks) = feed_answering(&c, &mut s, 0, 2 * MSS, true, false, |off| {
        (off == 0).then_some(TakeBack { from: MSS as u64 })
    });
    assert_eq!(passed, [0], "one pass-up, duplicates included");
    assert_eq!(s.conn().rcv_nxt_offset(), MSS as u64);
    let start = s.conn().rcv_stream_start();
    assert_eq!(acks, [start.wrapping_add(MSS as u32)], "an ACK at once");
}

/// A take-back of octets already acknowledged cannot be honoured: TCP says so with an event,
/// and acknowledges what it has.
#[test]
fn a_take_back_of_acknowledged_octets_is_refused_with_an_event() {
    let (c, mut s, _net) = established(pass_up());
    let (_, acks) = feed(&c, &mut s, 0, MSS, true);
    assert!(!acks.is_empty(), "an ACK covered the first segment");
    let _ = feed_answering(&c, &mut s, MSS as u64, MSS, true, false, |_| {
        Some(TakeBack { from: 0 })
    });
    assert_eq!(s.conn().rcv_nxt_offset(), 2 * MSS as u64);
    let mut refused = Vec::new();
    while let Some(ev) = s.conn_mut().poll_event() {
        if let Event::TakeBackRefused { offset } = ev {
            refused.push(offset);
        }
    }
    assert_eq!(refused, [0]);
}

/// A duplicate of out-of-order octets is reported with a D-SACK (RFC 2883); taken back before
/// the ACK goes out, those octets are no longer held, and the ACK carries no block for them
/// (the sender would read it as a SACK and never send them again).
#[test]
fn octets_taken_back_lose_their_d_sack() {
    let (c, mut s, _net) = established(pass_up());
    let _ = feed(&c, &mut s, 0, MSS, true);
    let _ = feed(&c, &mut s, 2 * MSS as u64, MSS, false);
    let _ = feed(&c, &mut s, 2 * MSS as u64, MSS, false);
    assert!(s.conn_mut().renege_from(2 * MSS as u64));
    let mut buf = [0u8; 2048];
    let n = s
        .conn_mut()
        .poll_transmit(Instant::from_millis(20_000), &mut buf)
        .expect("an ACK");
    let ack = SegmentRepr::parse(&buf[..n]).expect("valid");
    assert_eq!(
        ack.options.sack_blocks(),
        &[],
        "no block for octets not held"
    );
}

/// A D-SACK that reaches past the octets taken back keeps its part below them: those octets
/// are still held, so their duplicate is still news for the sender (RFC 2883), and a block
/// that ended past them would read as a SACK of octets no longer held.
#[test]
fn a_d_sack_straddling_the_take_back_keeps_its_part_below_it() {
    let (c, mut s, _net) = established(pass_up());
    let _ = feed(&c, &mut s, 0, MSS, true);
    let _ = feed(&c, &mut s, 2 * MSS as u64, MSS, false);
    let _ = feed(&c, &mut s, 2 * MSS as u64, MSS, false);
    let at = 2 * MSS as u64 + MSS as u64 / 2;
    assert!(s.conn_mut().renege_from(at));
    let mut buf = [0u8; 2048];
    let n = s
        .conn_mut()
        .poll_transmit(Instant::from_millis(20_000), &mut buf)
        .expect("an ACK");
    let ack = SegmentRepr::parse(&buf[..n]).expect("valid");
    let seq = |off: u64| s.conn().rcv_stream_start().wrapping_add(off as u32);
    let kept = SackBlock {
        left: seq(2 * MSS as u64),
        right: seq(at),
    };
    // The D-SACK first, then the SACK block of the out-of-order octets still held, which
    // holds it (RFC 2883 4.1.2); no block reaches past the octets taken back.
    assert_eq!(ack.options.sack_blocks(), &[kept, kept]);
}

/// Our sender holds the segment at its cumulative point as SACKed (a receiver that SACKed it
/// and then discarded it, RFC 2018 section 8; or a wrong block), and the ACKs stop there. When
/// its retransmission timer fires, it sends that segment again, rather than only what it
/// holds as unacknowledged and unSACKed (nothing, here: the connection would hang).
#[test]
fn a_timeout_resends_a_sacked_segment_at_the_cumulative_point() {
    let (mut c, s, _net) = sender_and_pass_up_receiver();
    let now = Instant::from_millis(20_000);
    assert_eq!(c.conn_mut().send(&[0x77u8; MSS]).expect("send"), MSS);
    let mut buf = [0u8; 2048];
    let n = c
        .conn_mut()
        .poll_transmit(now, &mut buf)
        .expect("a segment");
    let first = SegmentRepr::parse(&buf[..n]).expect("valid").seq;
    // The receiver's ACK stays at the segment and SACKs it.
    let t = s.conn().four_tuple();
    let mut options = TcpOptions::default();
    options.set_sack_blocks(&[SackBlock {
        left: first,
        right: first.wrapping_add(MSS as u32),
    }]);
    let ack = SegmentRepr {
        tos: 0,
        src_addr: t.local_addr,
        dst_addr: t.remote_addr,
        src_port: t.local_port,
        dst_port: t.remote_port,
        seq: s.conn().snd_nxt(),
        ack: first,
        flags: TcpFlags {
            ack: true,
            ..TcpFlags::default()
        },
        window: 1000,
        options,
        payload: &[],
    };
    c.conn_mut()
        .handle_segment(now + std::time::Duration::from_millis(1), &ack, |_| {});
    // The loss probe finds nothing in flight to send; the retransmission timer comes next.
    let mut sent = None;
    for _ in 0..4 {
        let Some(fire) = c.conn().poll_timeout() else {
            break;
        };
        c.conn_mut().handle_timeout(fire);
        if let Some(n) = c.conn_mut().poll_transmit(fire, &mut buf) {
            sent = Some(n);
            break;
        }
    }
    assert_eq!(c.conn().stats().rto_expirations, 1);
    let n = sent.expect("the segment again");
    let again = SegmentRepr::parse(&buf[..n]).expect("valid");
    assert_eq!(again.seq, first);
    assert_eq!(again.payload.len(), MSS);
    assert_eq!(c.conn().stats().peer_reneged, 1);
}

#[test]
fn refused_outside_pass_up_mode() {
    let (_c, mut s, _net) = established(Config {
        timestamps: false,
        ..Config::default()
    });
    assert!(!s.conn_mut().renege_from(0));
}

/// Our own sender against a receiver that reneges: segments 2-4 arrive while segment 1 is
/// lost and are SACKed; segment 1 comes again and the receiver takes back 3-4. Its next ACK
/// stops at segment 3, which the sender holds as SACKed: the sender sees the reneging and
/// sends 3 and 4 again at once, without waiting for its retransmission timeout.
#[test]
fn our_sender_resends_what_the_receiver_took_back() {
    let (mut c, mut s, _net) = sender_and_pass_up_receiver();
    let mut now = Instant::from_millis(20_000);
    let data = vec![0x77u8; 4 * MSS];
    assert_eq!(c.conn_mut().send(&data).expect("send"), 4 * MSS);
    let mut buf = [0u8; 2048];
    let mut segs = Vec::new();
    while let Some(n) = c.conn_mut().poll_transmit(now, &mut buf) {
        segs.push(buf[..n].to_vec());
    }
    assert_eq!(segs.len(), 4, "four full segments");
    let start = s.conn().rcv_stream_start();
    let offset_of = |p: &[u8]| {
        let r = SegmentRepr::parse(p).expect("valid");
        u64::from(r.seq.wrapping_sub(start))
    };
    // Deliver to the server, collecting what it passes up and the ACKs it sends.
    let deliver = |s: &mut Peer, c: &mut Peer, p: &[u8], now: Instant| -> Vec<u64> {
        let seg = SegmentRepr::parse(p).expect("valid");
        let mut passed = Vec::new();
        s.conn_mut()
            .handle_segment(now, &seg, |u| passed.push(u.stream_offset));
        let mut b = [0u8; 2048];
        while let Some(n) = s.conn_mut().poll_transmit(now, &mut b) {
            let a = SegmentRepr::parse(&b[..n]).expect("valid");
            c.conn_mut().handle_segment(now, &a, |_| {});
        }
        passed
    };
    for p in &segs[1..] {
        deliver(&mut s, &mut c, p, now);
    }
    // Segment 1 again (as a retransmission would bring it): everything is in; then the
    // receiver takes back segments 3 and 4 before acknowledging them.
    now += std::time::Duration::from_millis(1);
    let seg1 = SegmentRepr::parse(&segs[0]).expect("valid");
    s.conn_mut().handle_segment(now, &seg1, |_| {});
    assert_eq!(s.conn().rcv_nxt_offset(), 4 * MSS as u64);
    assert!(s.conn_mut().renege_from(2 * MSS as u64));
    let mut b = [0u8; 2048];
    while let Some(n) = s.conn_mut().poll_transmit(now, &mut b) {
        let a = SegmentRepr::parse(&b[..n]).expect("valid");
        assert_eq!(a.ack, start.wrapping_add(2 * MSS as u32));
        c.conn_mut().handle_segment(now, &a, |_| {});
    }
    assert_eq!(c.conn().stats().peer_reneged, 1);
    // Segments 3 and 4 go again now, and are passed up again.
    let mut again = Vec::new();
    while let Some(n) = c.conn_mut().poll_transmit(now, &mut buf) {
        let p = buf[..n].to_vec();
        if !SegmentRepr::parse(&p).expect("valid").payload.is_empty() {
            again.push(offset_of(&p));
            let passed = deliver(&mut s, &mut c, &p, now);
            assert_eq!(passed, [offset_of(&p)]);
        }
    }
    assert_eq!(again, [2 * MSS as u64, 3 * MSS as u64]);
    assert_eq!(s.conn().rcv_nxt_offset(), 4 * MSS as u64);
}
