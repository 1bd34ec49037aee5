//! Shared test harness: a `Peer` that wraps a `Connection` (or a listener
//! that accepts one) as a simulator endpoint, feeds it a source stream
//! (bytes or records) and checks what it receives.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use tcp_engine::ranges::RangeSet;
use tcp_engine::sim::{Direction, Endpoint, LinkConfig, Network, PacketTooBig, Rng};
use tcp_engine::{
    Config, Connection, Event, FourTuple, Instant, IsnGenerator, RxMode, SegmentRepr, State,
    TxMode, TxSource, TxSourceError,
};

pub const A_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const B_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const A_PORT: u16 = 40000;
pub const B_PORT: u16 = 5000;

pub fn client_tuple() -> FourTuple {
    FourTuple {
        local_addr: A_ADDR,
        local_port: A_PORT,
        remote_addr: B_ADDR,
        remote_port: B_PORT,
    }
}

pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub struct Peer {
    pub conn: Option<Connection>,
    pub listen: Option<Config>,
    pub isn: IsnGenerator,
    // Sending.
    pub src: Arc<Vec<u8>>,
    pub queued: usize,
    pub record_rng: Rng,
    pub record_ends: Vec<u64>,
    pub close_when_sent: bool,
    pub close_on_peer_fin: bool,
    /// [`TxMode::Source`]: what the source was asked for.
    pub fills: SourceFills,
    // Receiving.
    pub dest: Vec<u8>,
    pub received: usize,
    pub coverage: RangeSet,
    pub passed_twice: u64,
    pub passed_out_of_order: u64,
    pub passed_pieces: u64,
    pub max_ooo_held: u64,
    pub events: Vec<Event>,
    pub malformed: u64,
    /// Ranges placed in posted RDMA buffers ([`Connection::next_placed`]), in stream order.
    pub placed: Vec<tcp_engine::RdmaPlaced>,
    /// Packets written in pieces of this many octets ([`Connection::poll_transmit_split`],
    /// as into the frames of a multi-buffer AF_XDP packet) instead of one buffer.
    pub split: Option<usize>,
}

impl Peer {
    pub fn client(cfg: Config, src: Arc<Vec<u8>>, seed: u64) -> Peer {
        let isn = IsnGenerator::new([seed as u8; 16]);
        let conn = Connection::connect(cfg, client_tuple(), &isn, Instant::ZERO);
        Peer::with(Some(conn), None, isn, src, seed)
    }

    pub fn server(cfg: Config, src: Arc<Vec<u8>>, seed: u64) -> Peer {
        let isn = IsnGenerator::new([seed as u8 ^ 0x5a; 16]);
        Peer::with(None, Some(cfg), isn, src, seed)
    }

    pub fn from_conn(conn: Connection, src: Arc<Vec<u8>>, seed: u64) -> Peer {
        let isn = IsnGenerator::new([seed as u8; 16]);
        Peer::with(Some(conn), None, isn, src, seed)
    }

    fn with(
        conn: Option<Connection>,
        listen: Option<Config>,
        isn: IsnGenerator,
        src: Arc<Vec<u8>>,
        seed: u64,
    ) -> Peer {
        Peer {
            conn,
            listen,
            isn,
            src,
            queued: 0,
            record_rng: Rng::new(seed ^ 0xabcdef),
            record_ends: Vec::new(),
            close_when_sent: false,
            close_on_peer_fin: false,
            fills: SourceFills::default(),
            dest: Vec::new(),
            received: 0,
            coverage: RangeSet::new(1 << 20),
            passed_twice: 0,
            passed_out_of_order: 0,
            passed_pieces: 0,
            max_ooo_held: 0,
            events: Vec::new(),
            malformed: 0,
            placed: Vec::new(),
            split: None,
        }
    }

    pub fn expect(mut self, len: usize) -> Self {
        self.dest = vec![0u8; len];
        self
    }

    pub fn conn(&self) -> &Connection {
        self.conn.as_ref().expect("connection exists")
    }

    pub fn conn_mut(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("connection exists")
    }

    pub fn state(&self) -> Option<State> {
        self.conn.as_ref().map(|c| c.state())
    }

    /// Complete byte-exact reception of `dest.len()` octets.
    pub fn received_all(&self) -> bool {
        self.received == self.dest.len()
    }

    pub fn sent_all_acked(&self) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|c| c.bytes_acked() as usize == self.src.len())
    }

    fn pump(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        while let Some(e) = conn.poll_event() {
            if e == Event::PeerClosed && self.close_on_peer_fin {
                conn.close();
            }
            self.events.push(e);
        }
        if matches!(conn.state(), State::Established | State::CloseWait) {
            match conn_tx_mode(conn) {
                TxMode::Stream => {
                    while self.queued < self.src.len() {
                        match conn.send(&self.src[self.queued..]) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => self.queued += n,
                        }
                    }
                }
                TxMode::Records | TxMode::Source => {
                    while self.queued < self.src.len() {
                        let len =
                            next_record_len(&mut self.record_rng).min(self.src.len() - self.queued);
                        let rec = &self.src[self.queued..self.queued + len];
                        let queued = if conn_tx_mode(conn) == TxMode::Source {
                            conn.send_record_len(len)
                        } else {
                            conn.send_record(rec)
                        };
                        if queued.is_err() {
                            // Put the length back: regenerate next time.
                            break;
                        }
                        self.queued += len;
                        self.record_ends.push(self.queued as u64);
                    }
                }
            }
            if self.queued == self.src.len() && self.close_when_sent {
                self.close_when_sent = false;
                conn.close();
            }
        }
        if conn_rx_mode(conn) == RxMode::InOrder {
            loop {
                let n = conn.recv(&mut self.dest[self.received..]);
                if n == 0 {
                    // A range placed in a posted RDMA buffer: passed, not read.
                    if let Some(p) = conn.next_placed() {
                        self.received += p.len as usize;
                        self.placed.push(p);
                        continue;
                    }
                    break;
                }
                self.received += n;
            }
        }
        self.max_ooo_held = self.max_ooo_held.max(conn.ooo_bytes_held());
    }
}

pub fn next_record_len(rng: &mut Rng) -> usize {
    match rng.range(0, 9) {
        0..=3 => rng.range(16, 300) as usize,
        4..=7 => rng.range(300, 1400) as usize,
        _ => rng.range(1400, 6000) as usize,
    }
}

fn conn_tx_mode(c: &Connection) -> TxMode {
    c.config().tx_mode
}

fn conn_rx_mode(c: &Connection) -> RxMode {
    c.config().rx_mode
}

impl Endpoint for Peer {
    fn receive(&mut self, now: Instant, packet: &[u8]) {
        let seg = match SegmentRepr::parse(packet) {
            Ok(s) => s,
            Err(_) => {
                self.malformed += 1;
                return;
            }
        };
        if self.conn.is_none() {
            if let Some(cfg) = self.listen.clone() {
                self.conn = Connection::accept(cfg, &seg, &self.isn, now);
            }
            self.pump();
            return;
        }
        let Peer {
            conn,
            dest,
            received,
            coverage,
            passed_twice,
            passed_out_of_order,
            passed_pieces,
            ..
        } = self;
        let Some(conn) = conn.as_mut() else { return };
        let rcv_nxt_before = conn.rcv_nxt_offset();
        conn.handle_segment(now, &seg, |p| {
            let s = p.stream_offset;
            let e = s + p.data.len() as u64;
            let mut fresh = 0;
            coverage.for_each_gap(s, e, |a, b| fresh += b - a);
            if fresh != e - s {
                *passed_twice += 1;
            }
            coverage.insert(s, e);
            if s > rcv_nxt_before {
                *passed_out_of_order += 1;
            }
            *passed_pieces += 1;
            let end = (e as usize).min(dest.len());
            if (s as usize) < end {
                dest[s as usize..end].copy_from_slice(&p.data[..end - s as usize]);
            }
            *received =
                coverage
                    .ranges()
                    .first()
                    .map_or(0, |r| if r.start == 0 { r.end as usize } else { 0 });
        });
        self.pump();
    }

    fn transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.pump();
        let conn = self.conn.as_mut()?;
        let mut source = PeerSource {
            src: &self.src,
            acked: conn.bytes_acked(),
            fills: &mut self.fills,
        };
        if let Some(piece) = self.split {
            // Adjacent pieces of `buf`, but separate slices to TCP: what it writes must
            // come out as one packet.
            let (head, tail) = buf.split_at_mut(piece.min(buf.len()));
            let mut tail: Vec<&mut [u8]> = tail.chunks_mut(piece).collect();
            return conn.poll_transmit_split(now, head, &mut tail, &mut source);
        }
        if conn_tx_mode(conn) == TxMode::Source {
            return conn.poll_transmit_with(now, buf, &mut source);
        }
        conn.poll_transmit(now, buf)
    }

    fn next_timeout(&self) -> Option<Instant> {
        self.conn.as_ref()?.poll_timeout()
    }

    fn on_timeout(&mut self, now: Instant) {
        if let Some(c) = self.conn.as_mut() {
            c.handle_timeout(now);
        }
        self.pump();
    }

    fn on_packet_too_big(&mut self, now: Instant, report: PacketTooBig) {
        if let Some(c) = self.conn.as_mut() {
            // Later reports of a burst name the MTU already taken: ignored.
            let _ = c.handle_packet_too_big(now, report.seq, report.mtu);
        }
    }
}

/// What a [`TxMode::Source`] peer's source was asked for.
#[derive(Debug, Default)]
pub struct SourceFills {
    /// Calls.
    pub calls: u64,
    /// Octets produced.
    pub octets: u64,
    /// Calls for octets below the highest offset produced before (retransmissions).
    pub refills: u64,
    /// End of the highest range produced so far.
    pub high: u64,
    /// Calls for octets already acknowledged, or past the source (must stay 0).
    pub bad: u64,
}

/// A peer's source stream as a [`TxSource`] (the octets live outside TCP).
struct PeerSource<'a> {
    src: &'a [u8],
    acked: u64,
    fills: &'a mut SourceFills,
}

impl TxSource for PeerSource<'_> {
    fn fill(&mut self, stream_offset: u64, out: &mut [u8]) -> Result<(), TxSourceError> {
        let f = &mut *self.fills;
        f.calls += 1;
        let end = stream_offset + out.len() as u64;
        let Some(bytes) = self.src.get(stream_offset as usize..end as usize) else {
            f.bad += 1;
            return Err(TxSourceError {
                offset: stream_offset,
                len: out.len(),
            });
        };
        if stream_offset < self.acked {
            f.bad += 1;
        }
        if stream_offset < f.high {
            f.refills += 1;
        }
        f.high = f.high.max(end);
        f.octets += out.len() as u64;
        out.copy_from_slice(bytes);
        Ok(())
    }

    /// The sum of the octets produced, as a copy that sums on the way gives it (the engine's
    /// transmitter): every source-mode transfer checksums its segments through
    /// `SegmentRepr::emit_with_summed`'s precomputed-payload path, and the receiving side
    /// verifies them.
    fn fill_summed(
        &mut self,
        stream_offset: u64,
        out: &mut [u8],
    ) -> Result<Option<u16>, TxSourceError> {
        self.fill(stream_offset, out)?;
        Ok(Some(tcp_engine::wire::Checksum::new().add_bytes(out).sum()))
    }
}

pub fn random_bytes(len: usize, seed: u64) -> Arc<Vec<u8>> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    Arc::new(v)
}

pub fn lossy(loss: f64) -> LinkConfig {
    LinkConfig {
        loss,
        duplicate: if loss > 0.0 { 0.01 } else { 0.0 },
        reorder: if loss > 0.0 { 0.02 } else { 0.0 },
        jitter: Duration::from_micros(2),
        ..LinkConfig::default()
    }
}

pub struct Outcome {
    pub ok: bool,
    pub elapsed: Duration,
    pub client: Peer,
    pub server: Peer,
    pub net: Network,
}

/// A client/server pair and network ready to run.
pub fn setup(
    seed: u64,
    size: usize,
    fwd: LinkConfig,
    rev: LinkConfig,
    client_cfg: Config,
    server_cfg: Config,
) -> (Peer, Peer, Network) {
    let src = random_bytes(size, seed);
    let client = Peer::client(client_cfg, src, seed);
    let server = Peer::server(server_cfg, Arc::new(Vec::new()), seed).expect(size);
    (client, server, Network::new(fwd, rev, seed))
}

/// A client and a server (seed 1, loss-free links) run until both are ESTABLISHED.
pub fn established_pair(client_cfg: Config, server_cfg: Config) -> (Peer, Peer, Network) {
    let (mut c, mut s, mut net) = setup(1, 0, lossy(0.0), lossy(0.0), client_cfg, server_cfg);
    let ok = net.run(
        &mut c,
        &mut s,
        Instant::from_millis(10_000),
        |c, s, _| c.state() == Some(State::Established) && s.state() == Some(State::Established),
        |_, _, _| {},
    );
    assert!(ok, "the handshake did not complete");
    (c, s, net)
}

/// [`established_pair`] with one configuration for both sides.
pub fn established(cfg: Config) -> (Peer, Peer, Network) {
    established_pair(cfg.clone(), cfg)
}

/// Run until the server has every byte and the client has it acknowledged.
pub fn run_until_done(
    client: &mut Peer,
    server: &mut Peer,
    net: &mut Network,
    limit: Duration,
    tap: impl FnMut(Direction, Instant, &[u8]),
) -> bool {
    net.run(
        client,
        server,
        Instant::ZERO + limit,
        |c, s, _| s.received_all() && c.sent_all_acked(),
        tap,
    ) && server.dest[..] == client.src[..]
}

#[allow(clippy::too_many_arguments)]
/// Client sends `size` octets to the server over `fwd`/`rev` links.
pub fn transfer(
    seed: u64,
    size: usize,
    fwd: LinkConfig,
    rev: LinkConfig,
    client_cfg: Config,
    server_cfg: Config,
    limit: Duration,
    mut tap: impl FnMut(Direction, Instant, &[u8]),
) -> Outcome {
    let src = random_bytes(size, seed);
    let mut client = Peer::client(client_cfg, src.clone(), seed);
    let mut server = Peer::server(server_cfg, Arc::new(Vec::new()), seed).expect(size);
    let mut net = Network::new(fwd, rev, seed);
    let ok = net.run(
        &mut client,
        &mut server,
        Instant::ZERO + limit,
        |c, s, _| s.received_all() && c.sent_all_acked(),
        &mut tap,
    );
    let ok = ok && server.dest[..] == src[..];
    Outcome {
        ok,
        elapsed: net.now - Instant::ZERO,
        client,
        server,
        net,
    }
}

/// First-transmission boundaries and the record boundaries of a sender, to
/// check MPA segmentation rules on the wire.
#[derive(Default)]
pub struct BoundaryCheck {
    pub first_tx: HashMap<u64, u32>,
    pub violations: Vec<String>,
    pub data_segments: u64,
    pub retransmissions_checked: u64,
}

/// The peer's pure ACK of `ack` to `conn` (its next expected octet as the sequence number, a
/// full window), carrying `blocks` as SACK blocks and no other option (for a connection
/// without timestamps).
pub fn peer_ack(
    conn: &mut Connection,
    now: Instant,
    ack: u32,
    blocks: &[tcp_engine::wire::SackBlock],
) {
    peer_ack_window(conn, now, ack, u16::MAX, blocks);
}

/// [`peer_ack`] with `window` in its window field.
pub fn peer_ack_window(
    conn: &mut Connection,
    now: Instant,
    ack: u32,
    window: u16,
    blocks: &[tcp_engine::wire::SackBlock],
) {
    let t = conn.four_tuple();
    let mut options = tcp_engine::wire::TcpOptions::default();
    options.set_sack_blocks(blocks);
    let seg = SegmentRepr {
        tos: 0,
        src_addr: t.remote_addr,
        dst_addr: t.local_addr,
        src_port: t.remote_port,
        dst_port: t.local_port,
        seq: conn.rcv_nxt(),
        ack,
        flags: tcp_engine::wire::TcpFlags {
            ack: true,
            ..Default::default()
        },
        window,
        options,
        payload: &[],
    };
    conn.handle_segment(now, &seg, |_| None);
}

/// The data segments `conn` sends at `now`, as (first sequence number, one past the last).
pub fn sent_now(conn: &mut Connection, now: Instant) -> Vec<(u32, u32)> {
    let mut buf = vec![0u8; 65536];
    let mut sent = Vec::new();
    while let Some(n) = conn.poll_transmit(now, &mut buf) {
        let seg = SegmentRepr::parse(&buf[..n]).expect("our own segment parses");
        let len = seg.payload.len() as u32;
        if len > 0 {
            sent.push((seg.seq, seg.seq.wrapping_add(len)));
        }
        assert!(sent.len() < 100_000, "runaway transmit");
    }
    sent
}

/// A connected client of `cfg`, driven by hand (window scaling and timestamps off, so that the peer's window
/// field is its window in octets), its peer's window opened, and the time.
pub fn driven_client(cfg: Config) -> (Connection, Instant) {
    driven(Config {
        window_scaling: false,
        ..cfg
    })
}

/// [`driven_client`] with window scaling as `cfg` says: the peer's window field is scaled
/// by the shift its SYN offered (`cfg.max_recv_window` sets it), for windows beyond 64 KiB.
pub fn driven_client_scaled(cfg: Config) -> (Connection, Instant) {
    driven(cfg)
}

/// A connected client of `cfg` without timestamps, its peer's window opened, and the time.
fn driven(cfg: Config) -> (Connection, Instant) {
    let cfg = Config {
        timestamps: false,
        ..cfg
    };
    let (mut c, _s, net) = established(cfg);
    let mut conn = c.conn.take().expect("client connection");
    let nxt = conn.snd_nxt();
    peer_ack(&mut conn, net.now, nxt, &[]);
    (conn, net.now)
}
