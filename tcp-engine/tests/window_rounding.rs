//! The receive window under window scaling (RFC 7323 2.3, 2.4): a window field is the window
//! shifted right by Rcv.Wind.Shift, so a free window of fewer octets than one scale unit
//! (2^shift) would become a zero window, and a window rounded down moves the right edge
//! already offered to the left. The receiver rounds up to the unit where its buffer has room
//! (an `InOrder` buffer keeps just under two units of room past its nominal size for it) and
//! keeps the right edge it offered (RFC 9293 3.8.6.2.2). A `PassUp` upper layer's window is
//! never exceeded.
mod common;
use common::*;
use std::time::Duration;
use tcp_engine::sim::Direction;
use tcp_engine::wire::{TcpFlags, TcpOptions};
use tcp_engine::{Config, Instant, SegmentRepr};

/// Receive buffer of the receiver under test: not a multiple of the scale unit.
const BUF: usize = 10_000;
/// Its window-scale shift: 4 MiB maximum window needs shift 7.
const SHIFT: u8 = 7;
const UNIT: u64 = 1 << SHIFT;

/// A sender of odd-sized records.
fn records() -> Config {
    Config {
        tx_mode: tcp_engine::TxMode::Records,
        ..Config::default()
    }
}

fn small_receiver() -> Config {
    Config {
        recv_buffer: BUF,
        max_recv_window: 4 << 20,
        ..Config::default()
    }
}

/// The right edge (sequence space) an ACK from the receiver offers: SEG.ACK + SEG.WND << shift;
/// `None` for SYNs (unscaled) and segments without ACK.
fn offered_right(packet: &[u8]) -> Option<u32> {
    let seg = SegmentRepr::parse(packet).ok()?;
    if seg.flags.syn || !seg.flags.ack || seg.flags.rst {
        return None;
    }
    Some(seg.ack.wrapping_add(u32::from(seg.window) << SHIFT))
}

#[test]
fn free_window_below_one_scale_unit_is_not_offered_as_zero() {
    // The receiver's application reads nothing until the sender has everything acknowledged;
    // 50 octets of the 10,000 stay free.
    let size = BUF - 50;
    let (mut c, mut s, mut net) = setup(71, size, lossy(0.0), lossy(0.0), Config::default(), {
        small_receiver()
    });
    s.dest = Vec::new();
    let mut zero_windows_offered = 0;
    let ok = net.run(
        &mut c,
        &mut s,
        Instant::from_millis(5_000),
        |c, _, _| c.sent_all_acked(),
        |d, _, p| {
            if d == Direction::BtoA {
                if let Ok(seg) = SegmentRepr::parse(p) {
                    if !seg.flags.syn && seg.window == 0 {
                        zero_windows_offered += 1;
                    }
                }
            }
        },
    );
    assert!(ok, "the sender's data was not acknowledged");
    assert_eq!(s.conn().window_scales().0, SHIFT);
    assert_eq!(s.conn().rcv_nxt_offset(), size as u64);
    assert_eq!(zero_windows_offered, 0, "a zero window with 50 octets free");
    let w = c.conn().peer_window();
    assert!(
        w >= 50 && w % UNIT == 0,
        "the sender sees a window of {w} octets, not the free 50 rounded up to {UNIT}"
    );
    // The application reads again: everything arrives intact.
    s.dest = vec![0; size];
    let ok = run_until_done(
        &mut c,
        &mut s,
        &mut net,
        Duration::from_secs(10),
        |_, _, _| {},
    );
    assert!(ok, "the data did not arrive intact");
}

#[test]
fn offered_right_edge_never_moves_left_while_the_reader_keeps_up() {
    // 400 KB in odd-sized records; the application reads in rounds of 7,777 octets (fewer
    // than the buffer), so the free window is rarely a whole number of units.
    let size = 400_000;
    let client = Config {
        tx_mode: tcp_engine::TxMode::Records,
        ..Config::default()
    };
    let (mut c, mut s, mut net) = setup(72, size, lossy(0.0), lossy(0.0), client, {
        small_receiver()
    });
    let mut edges = Edges::default();
    let mut tap = |d: Direction, _: Instant, p: &[u8]| edges.see(d, p);
    let mut read_to = 0usize;
    let limit = Instant::from_millis(60_000);
    while read_to < size && net.now < limit {
        read_to = (read_to + 7_777).min(size);
        let mut dest = std::mem::take(&mut s.dest);
        dest.resize(read_to, 0);
        s.dest = dest;
        net.run(
            &mut c,
            &mut s,
            limit,
            |_, s, _| s.received == read_to,
            &mut tap,
        );
    }
    assert!(
        net.run(
            &mut c,
            &mut s,
            limit,
            |c, s, _| s.received_all() && c.sent_all_acked(),
            &mut tap
        ),
        "the transfer did not finish"
    );
    assert_eq!(s.dest[..], c.src[..], "data differ");
    assert!(edges.acks > 100, "only {} ACKs", edges.acks);
    assert!(
        edges.retractions.is_empty(),
        "the right edge moved left {} times (by {:?} octets) in {} ACKs",
        edges.retractions.len(),
        &edges.retractions[..edges.retractions.len().min(10)],
        edges.acks
    );
}

#[test]
fn pass_up_window_is_never_exceeded() {
    // An upper layer that can take 10,000 octets: the offered window is rounded down to
    // 78 units (9,984 octets), never up past what the upper layer said it can place.
    let server = Config {
        recv_buffer: BUF,
        max_recv_window: 4 << 20,
        ..Config::mpa()
    };
    let client = Config::mpa();
    let (mut c, mut s, mut net) = established_pair(client, server);
    s.conn_mut().set_receive_window(BUF as u64);
    let mut windows = Vec::new();
    c.conn_mut()
        .send_record(&[7u8; 100])
        .expect("queue a record");
    net.run(
        &mut c,
        &mut s,
        Instant::from_millis(2_000),
        |_, _, _| false,
        |d, _, p| {
            if d == Direction::BtoA {
                if let Ok(seg) = SegmentRepr::parse(p) {
                    if !seg.flags.syn {
                        windows.push((seg.ack, u64::from(seg.window) << SHIFT));
                    }
                }
            }
        },
    );
    assert!(!windows.is_empty());
    for (_, w) in &windows {
        assert!(
            *w <= BUF as u64,
            "window {w} past the upper layer's {BUF}: {windows:?}"
        );
    }
}

/// Right edges offered from B to A, and how often (and by how much) one lay left of the
/// furthest offered before.
#[derive(Default)]
struct Edges {
    right: Option<u32>,
    acks: u64,
    retractions: Vec<u32>,
    /// Octets the receiver held when its application began to read.
    held: u64,
}

impl Edges {
    fn see(&mut self, d: Direction, p: &[u8]) {
        if d != Direction::BtoA {
            return;
        }
        let Some(r) = offered_right(p) else { return };
        self.acks += 1;
        match self.right {
            Some(prev) if (r.wrapping_sub(prev) as i32) < 0 => {
                self.retractions.push(prev.wrapping_sub(r))
            }
            Some(prev) if r == prev => {}
            _ => self.right = Some(r),
        }
    }
}

fn lagging_reader(seed: u64, size: usize, client: Config) -> Edges {
    let (mut c, mut s, mut net) =
        setup(seed, size, lossy(0.0), lossy(0.0), client, small_receiver());
    s.dest = Vec::new();
    let mut edges = Edges::default();
    net.run(
        &mut c,
        &mut s,
        Instant::from_millis(3_000),
        |c, _, _| c.sent_all_acked(),
        |d, _, p| edges.see(d, p),
    );
    // Nothing was read: what the receiver holds fits its ring.
    let held = s.conn().rcv_nxt_offset();
    assert!(
        held <= s.conn().receive_buffer_capacity() as u64,
        "seed {seed} size {size}: {held} octets held"
    );
    edges.held = held;
    s.dest = vec![0; size];
    let ok = run_until_done(
        &mut c,
        &mut s,
        &mut net,
        Duration::from_secs(20),
        |d, _, p| edges.see(d, p),
    );
    assert!(ok, "seed {seed} size {size}: data did not arrive intact");
    edges
}

#[test]
fn offered_right_edge_never_moves_left_while_the_reader_lags() {
    // The application reads nothing while odd-sized records arrive, then everything: each
    // ACK's right edge lies at or right of every edge offered before, though RCV.NXT moves by
    // parts of a unit (rounded down, the edge would move left by up to 127 octets).
    for size in [4_000, 8_000, 9_900, 10_100] {
        for seed in 80..83 {
            let e = lagging_reader(seed, size, records());
            assert!(e.acks >= 4, "seed {seed} size {size}: {} ACKs", e.acks);
            assert!(
                e.retractions.is_empty(),
                "seed {seed} size {size}: the right edge moved left by {:?} octets in {} ACKs",
                e.retractions,
                e.acks
            );
        }
    }
}

#[test]
fn octets_past_the_ring_are_dropped_not_written_over_unread_data() {
    // 30,000 octets at a reader that reads nothing for 3 s: the offered edge, kept, ends up
    // past the ring (nominal 10,000 + 255); what arrives past the ring is dropped, sent
    // again once the reader has made room, and everything arrives intact.
    let e = lagging_reader(90, 30_000, Config::default());
    assert!(
        e.held > BUF as u64,
        "the room past the nominal buffer was not used: {} held",
        e.held
    );
    assert!(e.retractions.is_empty(), "{:?}", e.retractions);
}

/// A hand-driven peer of one receiver under test (no timestamps or SACK: plain segments).
struct Hand {
    conn: tcp_engine::Connection,
    /// The peer's ISN + 1: sequence number of stream octet 0.
    base: u32,
    /// The receiver's sequence number the peer acknowledges.
    ack: u32,
    now: Instant,
}

impl Hand {
    fn syn_peer() -> Hand {
        let base = 1_000_000u32;
        let t = client_tuple();
        let mut syn_flags = ACK_FLAGS;
        syn_flags.ack = false;
        syn_flags.syn = true;
        let mut options = TcpOptions::default();
        options.mss = Some(1460);
        options.window_scale = Some(0);
        let syn = SegmentRepr {
            tos: 0,
            src_addr: t.local_addr,
            dst_addr: t.remote_addr,
            src_port: t.local_port,
            dst_port: t.remote_port,
            seq: base - 1,
            ack: 0,
            flags: syn_flags,
            window: 65535,
            options,
            payload: &[],
        };
        let cfg = Config {
            timestamps: false,
            sack: false,
            delayed_ack: None,
            ..small_receiver()
        };
        let isn = tcp_engine::IsnGenerator::new([9; 16]);
        let now = Instant::from_millis(1);
        let mut conn = tcp_engine::Connection::accept(cfg, &syn, &isn, now).expect("accept");
        let synack = Hand::out(&mut conn, now);
        let s = SegmentRepr::parse(&synack[0]).expect("SYN-ACK");
        let mut h = Hand {
            conn,
            base,
            ack: s.seq.wrapping_add(1),
            now,
        };
        h.send(0, &[]);
        assert_eq!(h.conn.state(), tcp_engine::State::Established);
        h
    }

    fn out(conn: &mut tcp_engine::Connection, now: Instant) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        let mut buf = [0u8; 2048];
        while let Some(n) = conn.poll_transmit(now, &mut buf) {
            v.push(buf[..n].to_vec());
        }
        v
    }

    /// Sends `data` at stream offset `off`; returns the right edge (stream offset) of the
    /// last ACK the receiver sent in answer, if any.
    fn send(&mut self, off: u64, data: &[u8]) -> Option<u64> {
        let t = client_tuple();
        let seg = SegmentRepr {
            tos: 0,
            src_addr: t.local_addr,
            dst_addr: t.remote_addr,
            src_port: t.local_port,
            dst_port: t.remote_port,
            seq: self.base.wrapping_add(off as u32),
            ack: self.ack,
            flags: ACK_FLAGS,
            window: 65535,
            options: TcpOptions::default(),
            payload: data,
        };
        self.now += Duration::from_millis(1);
        self.conn.handle_segment(self.now, &seg, |_| {});
        Hand::out(&mut self.conn, self.now)
            .iter()
            .rev()
            .find_map(|p| SegmentRepr::parse(p).ok())
            .map(|s| u64::from(s.ack.wrapping_sub(self.base)) + (u64::from(s.window) << SHIFT))
    }
}

const ACK_FLAGS: TcpFlags = TcpFlags {
    ack: true,
    fin: false,
    syn: false,
    rst: false,
    psh: false,
    urg: false,
};

fn octet(i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9) >> 11) as u8
}

#[test]
fn an_edge_kept_past_the_ring_drops_what_does_not_fit() {
    // The peer always sends one octet short of the offered edge and the application reads
    // nothing: each ACK rounds the remaining octet up to a whole unit, so the kept edge creeps
    // past the ring. What arrives past the ring is dropped (not acknowledged), and the unread
    // octets at the ring's start are not written over.
    let mut h = Hand::syn_peer();
    let ring = h.conn.receive_buffer_capacity() as u64;
    let mut sent = 0u64;
    let mut edge = h.send(0, &[]).unwrap_or(BUF as u64);
    let mut rounds = 0;
    while edge <= ring && rounds < 10_000 {
        rounds += 1;
        let len = (edge - sent - 1).min(1000);
        let data: Vec<u8> = (sent..sent + len).map(octet).collect();
        edge = h.send(sent, &data).expect("an ACK");
        sent += len;
    }
    assert!(
        edge > ring,
        "the edge stayed within the ring after {rounds} rounds"
    );
    // Fill up to the offered edge: only what fits the ring is taken.
    let data: Vec<u8> = (sent..edge).map(octet).collect();
    h.send(sent, &data);
    assert_eq!(
        h.conn.rcv_nxt_offset(),
        ring,
        "the ring holds {ring} octets"
    );
    let mut got = vec![0u8; ring as usize + 1000];
    let n = h.conn.recv(&mut got);
    assert_eq!(n as u64, ring);
    let want: Vec<u8> = (0..ring).map(octet).collect();
    assert!(got[..n] == want[..], "unread data was written over");
}
