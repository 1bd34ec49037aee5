//! Sequence numbers and timestamps that wrap past 2^32 in the middle of a transfer (RFC 9293
//! 3.4's modular arithmetic; RFC 7323 5.2's PAWS on a wrapping timestamp clock): a 1 MiB
//! transfer under 2 % loss, duplication and reordering, so that SACK blocks, D-SACKs, RACK
//! and retransmissions straddle the wrap, arrives byte-exact, and nothing is taken for an old
//! duplicate. The client's initial sequence number (or its timestamp clock) is put just short
//! of the wrap by choosing the instant it connects.
mod common;
use common::*;
use std::sync::Arc;
use std::time::Duration;
use tcp_engine::sim::{LinkConfig, Network};
use tcp_engine::{Config, Connection, Instant, IsnGenerator};

const SIZE: usize = 1 << 20;

/// A client connecting at `t0` sends [`SIZE`] octets through lossy links with a 2 ms round
/// trip; returns the client, the server, whether every octet arrived, acknowledged, and when
/// the run ended.
fn transfer_from(t0: Instant, seed: u64) -> (Peer, Peer, bool, Instant) {
    let cfg = Config::default();
    let isn = IsnGenerator::new([seed as u8; 16]);
    let conn = Connection::connect(cfg.clone(), client_tuple(), &isn, t0);
    let mut client = Peer::from_conn(conn, random_bytes(SIZE, seed), seed);
    let mut server = Peer::server(cfg, Arc::new(Vec::new()), seed).expect(SIZE);
    let link = LinkConfig {
        delay: Duration::from_millis(1),
        ..lossy(0.02)
    };
    let mut net = Network::new(link.clone(), link, seed);
    net.now = t0;
    let ok = net.run(
        &mut client,
        &mut server,
        t0 + Duration::from_secs(300),
        |c, s, _| s.received_all() && c.sent_all_acked(),
        |_, _, _| {},
    );
    let exact = ok && server.dest[..] == client.src[..];
    (client, server, exact, net.now)
}

#[test]
fn the_sequence_space_wraps_mid_transfer() {
    for seed in [1, 2, 3] {
        let isn = IsnGenerator::new([seed as u8; 16]);
        // The ISN is the microsecond clock / 4 plus a keyed hash of the tuple.
        let hash = isn.isn(&client_tuple(), Instant::ZERO);
        let start = u32::MAX - 300_000;
        let t0 = Instant::from_micros(4 * u64::from(start.wrapping_sub(hash)));
        let (client, server, exact, _) = transfer_from(t0, seed);
        assert!(exact, "seed {seed}: not byte-exact");
        let c = client.conn();
        assert!(
            c.snd_nxt() < start,
            "seed {seed}: the sequence space did not wrap"
        );
        assert_eq!(server.conn().stats().paws_drops, 0, "seed {seed}");
        assert!(c.stats().retransmitted_segments > 0, "seed {seed}: no loss");
    }
}

#[test]
fn the_timestamp_clock_wraps_mid_transfer() {
    for seed in [1, 2, 3] {
        let isn = IsnGenerator::new([seed as u8; 16]);
        // TSval is the millisecond clock plus a keyed offset: 20 ms short of the wrap.
        let offset = isn.timestamp_offset(&client_tuple());
        let t0 = Instant::from_millis(u64::from((u32::MAX - 20).wrapping_sub(offset)));
        let (client, server, exact, end) = transfer_from(t0, seed);
        assert!(exact, "seed {seed}: not byte-exact");
        let tsval_at_end = (end.as_millis() as u32).wrapping_add(offset);
        assert!(
            tsval_at_end < 1 << 30,
            "seed {seed}: the clock did not wrap"
        );
        assert!(client.conn().timestamps_enabled());
        assert_eq!(server.conn().stats().paws_drops, 0, "seed {seed}");
        assert_eq!(client.conn().stats().paws_drops, 0, "seed {seed}");
    }
}
