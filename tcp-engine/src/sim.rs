//! A deterministic network simulator for tests: two endpoints joined by two
//! one-way links with delay, jitter, serialization at a fixed bandwidth, a
//! drop-tail queue, random loss, reordering, duplication, a re-segmenting
//! middlebox (splits and merges TCP payloads keeping sequence numbers) and a
//! path MTU that can drop mid-transfer. Time is virtual; randomness comes
//! from a seeded xoshiro256** generator, so a seed reproduces a run exactly.

use std::collections::BTreeMap;

use crate::time::Instant;
use crate::wire::{Ipv4TcpView, SegmentRepr, TcpFlags, IPV4_HEADER_LEN, TCP_HEADER_LEN};
use core::time::Duration;

/// xoshiro256** seeded through SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.next_f64() < p
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Fill `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Impairments of one direction.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub delay: Duration,
    /// Extra uniform random delay in `[0, jitter]` (reorders packets).
    pub jitter: Duration,
    /// Probability a packet is dropped.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet is held back by `reorder_delay`.
    pub reorder: f64,
    /// Hold-back for reordered packets.
    pub reorder_delay: Duration,
    /// If above `reorder_delay`: each reordered packet is held for a uniform
    /// random time in `[reorder_delay, reorder_delay_max]` instead.
    pub reorder_delay_max: Duration,
    /// If non-zero, a reordered packet is instead held back until 1 to this
    /// many later packets of the link have been sent (or `reorder_delay_max`,
    /// at least `reorder_delay`, has passed), as the test relay does.
    pub reorder_frames: u32,
    /// Probability that a packet starts a stall of the link: it and every
    /// packet sent after it are not delivered before the stall ends (order
    /// kept), as when a descheduled host leaves its ring unserved.
    pub stall: f64,
    /// Longest stall; each one lasts a uniform random time up to this.
    pub stall_max: Duration,
    /// Serialization rate in bits per second (`None`: infinite).
    pub bandwidth_bps: Option<u64>,
    /// Drop-tail queue limit in packets (`None`: unbounded).
    pub queue_limit: Option<usize>,
    /// Packets larger than this are dropped and reported as "packet too big".
    pub mtu: u16,
    /// Probability the middlebox splits a data segment in two.
    pub split: f64,
    /// Probability the middlebox merges a data segment into the previous
    /// queued, contiguous one.
    pub merge: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            delay: Duration::from_micros(10),
            jitter: Duration::ZERO,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(20),
            reorder_delay_max: Duration::ZERO,
            reorder_frames: 0,
            stall: 0.0,
            stall_max: Duration::ZERO,
            bandwidth_bps: Some(10_000_000_000),
            queue_limit: Some(1000),
            mtu: 1500,
            split: 0.0,
            merge: 0.0,
        }
    }
}

/// What a link did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Packets offered.
    pub offered: u64,
    /// Packets delivered.
    pub delivered: u64,
    /// Dropped at random.
    pub lost: u64,
    /// Dropped by the queue limit.
    pub queue_drops: u64,
    /// Dropped for exceeding the MTU.
    pub too_big: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Split by the middlebox.
    pub split: u64,
    /// Merged by the middlebox.
    pub merged: u64,
    /// Stalls started.
    pub stalls: u64,
}

/// One direction of the network.
#[derive(Debug)]
pub struct Link {
    /// Impairments (may be changed between steps, e.g. the MTU).
    pub cfg: LinkConfig,
    rng: Rng,
    queue: BTreeMap<(Instant, u64), Vec<u8>>,
    order: u64,
    last_key: Option<(Instant, u64)>,
    tx_free_at: Instant,
    stall_until: Instant,
    held: Vec<(u32, Instant, Vec<u8>)>,
    /// Counters.
    pub stats: LinkStats,
    /// A "packet too big" report not yet given to the sender (the first of those since it
    /// was last given one: the first a router sends back is the first to arrive).
    pub pending_too_big: Option<PacketTooBig>,
}

/// What a link reports to the sender of a packet longer than its MTU, as a router's ICMP
/// "fragmentation needed" would (RFC 1191 4: the next-hop MTU; RFC 792: the quoted header,
/// of which TCP reads the sequence number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketTooBig {
    /// The link's MTU.
    pub mtu: u16,
    /// The sequence number of the segment dropped.
    pub seq: u32,
}

fn resegment_ok(r: &SegmentRepr<'_>) -> bool {
    !r.flags.syn && !r.flags.rst && !r.payload.is_empty()
}

impl Link {
    /// A link with its own random stream.
    pub fn new(cfg: LinkConfig, seed: u64) -> Self {
        Link {
            cfg,
            rng: Rng::new(seed),
            queue: BTreeMap::new(),
            order: 0,
            last_key: None,
            tx_free_at: Instant::ZERO,
            stall_until: Instant::ZERO,
            held: Vec::new(),
            stats: LinkStats::default(),
            pending_too_big: None,
        }
    }

    fn enqueue(&mut self, at: Instant, packet: Vec<u8>) -> (Instant, u64) {
        self.order += 1;
        let key = (at, self.order);
        self.queue.insert(key, packet);
        key
    }

    /// Offer a packet at `now`.
    pub fn send(&mut self, now: Instant, packet: &[u8]) {
        self.stats.offered += 1;
        if packet.len() > usize::from(self.cfg.mtu) {
            self.stats.too_big += 1;
            // The first report of a burst is the one that arrives first.
            if let (None, Ok(v)) = (self.pending_too_big, Ipv4TcpView::new_unverified(packet)) {
                self.pending_too_big = Some(PacketTooBig {
                    mtu: self.cfg.mtu,
                    seq: v.tcp().sequence_number(),
                });
            }
            return;
        }
        if self.rng.chance(self.cfg.loss) {
            self.stats.lost += 1;
            return;
        }
        if self.cfg.queue_limit.is_some_and(|l| self.queue.len() >= l) {
            self.stats.queue_drops += 1;
            return;
        }
        let mut depart = now;
        if let Some(bps) = self.cfg.bandwidth_bps {
            let start = self.tx_free_at.max(now);
            let ser = Duration::from_nanos((packet.len() as u64 * 8 * 1_000_000_000) / bps.max(1));
            self.tx_free_at = start + ser;
            depart = self.tx_free_at;
        }
        let mut at = depart + self.cfg.delay;
        if !self.cfg.jitter.is_zero() {
            at += Duration::from_nanos(self.rng.range(0, self.cfg.jitter.as_nanos() as u64));
        }
        if self.rng.chance(self.cfg.stall) {
            let d = self.rng.range(0, self.cfg.stall_max.as_nanos() as u64);
            self.stall_until = self.stall_until.max(now + Duration::from_nanos(d));
            self.stats.stalls += 1;
        }
        at = at.max(self.stall_until);
        if self.cfg.reorder_frames > 0 && self.rng.chance(self.cfg.reorder) {
            let frames = self.rng.range(1, u64::from(self.cfg.reorder_frames)) as u32;
            let hold = self.cfg.reorder_delay_max.max(self.cfg.reorder_delay);
            self.held.push((frames, at + hold, packet.to_vec()));
            return;
        }
        if self.cfg.reorder_frames == 0 && self.rng.chance(self.cfg.reorder) {
            let lo = self.cfg.reorder_delay;
            let hi = self.cfg.reorder_delay_max;
            at += if hi > lo {
                Duration::from_nanos(self.rng.range(lo.as_nanos() as u64, hi.as_nanos() as u64))
            } else {
                lo
            };
        }
        // Middlebox: merge into the previous queued contiguous segment.
        if self.rng.chance(self.cfg.merge) {
            if let Some(key) = self.last_key {
                if let Some(prev) = self.queue.get(&key) {
                    if let Some((merged, rest)) = merge_segments(prev, packet, self.cfg.mtu) {
                        self.queue.insert(key, merged);
                        self.stats.merged += 1;
                        if let Some(rest) = rest {
                            self.last_key = Some(self.enqueue(at, rest));
                        }
                        return;
                    }
                }
            }
        }
        let dup = self.rng.chance(self.cfg.duplicate);
        if self.rng.chance(self.cfg.split) {
            if let Some((a, b)) = split_segment(packet, &mut self.rng) {
                self.stats.split += 1;
                self.enqueue(at, a);
                self.last_key = Some(self.enqueue(at, b));
                return;
            }
        }
        self.last_key = Some(self.enqueue(at, packet.to_vec()));
        self.release_held(at);
        if dup {
            self.stats.duplicated += 1;
            let later = at + Duration::from_nanos(self.rng.range(0, 20_000));
            self.enqueue(later, packet.to_vec());
        }
    }

    /// One more packet passed the held-back ones (arriving at `at`): those
    /// whose count ran out follow it.
    fn release_held(&mut self, at: Instant) {
        let mut i = 0;
        while i < self.held.len() {
            self.held[i].0 -= 1;
            if self.held[i].0 == 0 {
                let (_, _, p) = self.held.swap_remove(i);
                self.enqueue(at, p);
            } else {
                i += 1;
            }
        }
    }

    /// When the next packet is due.
    pub fn next_delivery(&self) -> Option<Instant> {
        let held = self.held.iter().map(|h| h.1).min();
        crate::time::earliest(self.queue.keys().next().map(|k| k.0), held)
    }

    /// Take the next packet due at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<Vec<u8>> {
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].1 <= now {
                let (_, t, p) = self.held.swap_remove(i);
                self.enqueue(t, p);
            } else {
                i += 1;
            }
        }
        let (&key, _) = self.queue.iter().next()?;
        if key.0 > now {
            return None;
        }
        if self.last_key == Some(key) {
            self.last_key = None;
        }
        self.stats.delivered += 1;
        self.queue.remove(&key)
    }

    /// Packets in the link.
    pub fn queued(&self) -> usize {
        self.queue.len() + self.held.len()
    }
}

fn emit_vec(repr: &SegmentRepr<'_>) -> Option<Vec<u8>> {
    let mut v = vec![0u8; repr.packet_len()];
    let n = repr.emit(&mut v).ok()?;
    v.truncate(n);
    Some(v)
}

fn split_segment(packet: &[u8], rng: &mut Rng) -> Option<(Vec<u8>, Vec<u8>)> {
    let r = SegmentRepr::parse(packet).ok()?;
    if !resegment_ok(&r) || r.payload.len() < 2 {
        return None;
    }
    let k = rng.range(1, r.payload.len() as u64 - 1) as usize;
    let mut first = r;
    first.payload = &r.payload[..k];
    first.flags = TcpFlags {
        fin: false,
        psh: false,
        ..r.flags
    };
    let mut second = r;
    second.payload = &r.payload[k..];
    second.seq = r.seq.wrapping_add(k as u32);
    Some((emit_vec(&first)?, emit_vec(&second)?))
}

/// Coalesce `next` into `prev` (contiguous payloads); if the result exceeds
/// the MTU, re-cut it: the first packet full-sized, the rest in a second.
fn merge_segments(prev: &[u8], next: &[u8], mtu: u16) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let p = SegmentRepr::parse(prev).ok()?;
    let q = SegmentRepr::parse(next).ok()?;
    if !resegment_ok(&p) || !resegment_ok(&q) || p.flags.fin {
        return None;
    }
    if p.src_port != q.src_port || p.dst_port != q.dst_port {
        return None;
    }
    if p.seq.wrapping_add(p.payload.len() as u32) != q.seq {
        return None;
    }
    let total = p.payload.len() + q.payload.len();
    let max_payload =
        usize::from(mtu).checked_sub(IPV4_HEADER_LEN + TCP_HEADER_LEN + q.options.wire_len())?;
    let mut payload = Vec::with_capacity(total);
    payload.extend_from_slice(p.payload);
    payload.extend_from_slice(q.payload);
    let cut = total.min(max_payload);
    if cut <= p.payload.len() {
        return None;
    }
    let mut m = q;
    m.seq = p.seq;
    m.payload = &payload[..cut];
    if cut < total {
        m.flags = TcpFlags {
            fin: false,
            psh: false,
            ..q.flags
        };
        let mut rest = q;
        rest.seq = p.seq.wrapping_add(cut as u32);
        rest.payload = &payload[cut..];
        Some((emit_vec(&m)?, Some(emit_vec(&rest)?)))
    } else {
        Some((emit_vec(&m)?, None))
    }
}

/// One side of a simulated conversation.
pub trait Endpoint {
    /// A packet arrived.
    fn receive(&mut self, now: Instant, packet: &[u8]);
    /// Emit the next packet into `buf`, if any.
    fn transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize>;
    /// Next deadline.
    fn next_timeout(&self) -> Option<Instant>;
    /// Deadline reached.
    fn on_timeout(&mut self, now: Instant);
    /// The link dropped a packet of ours as too big and reports it.
    fn on_packet_too_big(&mut self, _now: Instant, _report: PacketTooBig) {}
}

/// Which way a packet went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From endpoint A to B.
    AtoB,
    /// From endpoint B to A.
    BtoA,
}

/// Two links and a virtual clock.
#[derive(Debug)]
pub struct Network {
    /// Virtual time.
    pub now: Instant,
    /// A's outgoing link.
    pub a_to_b: Link,
    /// B's outgoing link.
    pub b_to_a: Link,
    buf: Vec<u8>,
}

impl Network {
    /// A network with per-direction impairments; `seed` drives both links.
    pub fn new(a_to_b: LinkConfig, b_to_a: LinkConfig, seed: u64) -> Self {
        Network {
            now: Instant::ZERO,
            a_to_b: Link::new(a_to_b, seed.wrapping_mul(2).wrapping_add(1)),
            b_to_a: Link::new(b_to_a, seed.wrapping_mul(2).wrapping_add(2)),
            buf: vec![0u8; 65536],
        }
    }

    /// Run until `done` returns true (checked after each step) or virtual
    /// time passes `limit`. `tap` sees every packet as it is sent. Returns
    /// whether `done` became true. Panics, naming both endpoints' timers, after a million
    /// steps without the clock moving (a timer that stays due after it ran would otherwise
    /// spin here for good).
    pub fn run<A: Endpoint, B: Endpoint>(
        &mut self,
        a: &mut A,
        b: &mut B,
        limit: Instant,
        mut done: impl FnMut(&mut A, &mut B, Instant) -> bool,
        mut tap: impl FnMut(Direction, Instant, &[u8]),
    ) -> bool {
        // Steps taken at one instant: an endpoint whose timer stays due after it ran, or two
        // that answer each other for ever without time passing, would spin here for good (a
        // hung test, not a failed one).
        let mut steps_now = 0u32;
        let mut at = self.now;
        loop {
            if done(a, b, self.now) {
                return true;
            }
            if self.now != at {
                (at, steps_now) = (self.now, 0);
            }
            steps_now += 1;
            assert!(
                steps_now <= MAX_STEPS_AT_ONE_INSTANT,
                "the simulation made no progress in time at {:?}: timers A {:?}, B {:?}",
                self.now,
                a.next_timeout(),
                b.next_timeout()
            );
            let mut progress = false;
            while let Some(n) = a.transmit(self.now, &mut self.buf) {
                tap(Direction::AtoB, self.now, &self.buf[..n]);
                self.a_to_b.send(self.now, &self.buf[..n]);
                progress = true;
            }
            while let Some(n) = b.transmit(self.now, &mut self.buf) {
                tap(Direction::BtoA, self.now, &self.buf[..n]);
                self.b_to_a.send(self.now, &self.buf[..n]);
                progress = true;
            }
            if let Some(report) = self.a_to_b.pending_too_big.take() {
                a.on_packet_too_big(self.now, report);
                progress = true;
            }
            if let Some(report) = self.b_to_a.pending_too_big.take() {
                b.on_packet_too_big(self.now, report);
                progress = true;
            }
            while let Some(p) = self.a_to_b.pop_due(self.now) {
                b.receive(self.now, &p);
                progress = true;
            }
            while let Some(p) = self.b_to_a.pop_due(self.now) {
                a.receive(self.now, &p);
                progress = true;
            }
            if a.next_timeout().is_some_and(|t| t <= self.now) {
                a.on_timeout(self.now);
                progress = true;
            }
            if b.next_timeout().is_some_and(|t| t <= self.now) {
                b.on_timeout(self.now);
                progress = true;
            }
            if progress {
                continue;
            }
            let next = [
                self.a_to_b.next_delivery(),
                self.b_to_a.next_delivery(),
                a.next_timeout(),
                b.next_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            match next {
                Some(t) if t <= limit => self.now = t.max(self.now),
                _ => return done(a, b, self.now),
            }
        }
    }
}

/// The most steps [`Network::run`] takes without the clock moving before it fails the test.
const MAX_STEPS_AT_ONE_INSTANT: u32 = 1_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_uniformish() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let mut hits = 0;
        for _ in 0..10_000 {
            assert_eq!(a.next_u64(), b.next_u64());
            if a.chance(0.2) {
                hits += 1;
            }
            b.chance(0.2);
        }
        assert!((1800..2200).contains(&hits), "{hits}");
    }

    /// An endpoint whose timer is still due after it ran.
    struct Stuck;

    impl Endpoint for Stuck {
        fn receive(&mut self, _: Instant, _: &[u8]) {}
        fn transmit(&mut self, _: Instant, _: &mut [u8]) -> Option<usize> {
            None
        }
        fn next_timeout(&self) -> Option<Instant> {
            Some(Instant::ZERO)
        }
        fn on_timeout(&mut self, _: Instant) {}
    }

    /// A run that cannot move the clock fails instead of hanging.
    #[test]
    #[should_panic(expected = "no progress in time")]
    fn a_timer_that_stays_due_fails_the_run() {
        let mut net = Network::new(LinkConfig::default(), LinkConfig::default(), 1);
        net.run(
            &mut Stuck,
            &mut Stuck,
            Instant::from_millis(10),
            |_, _, _| false,
            |_, _, _| {},
        );
    }
}
