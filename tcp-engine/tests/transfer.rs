//! Bulk transfers through the simulator: byte-exact completion under loss,
//! reordering, duplication, re-segmentation and an MTU drop; MPA record
//! segmentation and pass-up receive; goodput under 1% loss.
mod common;
use common::*;
use std::time::{Duration, Instant as WallClock};
use tcp_engine::sim::{Direction, LinkConfig, Rng};
use tcp_engine::{Config, CongestionAlgorithm, Event, Instant, SegmentRepr, TxMode};

const MIB: usize = 1 << 20;

fn describe(o: &Outcome) -> String {
    format!(
        "received {} of {}, acked {}, states {:?}/{:?}, t={:?}, client {:?}, link {:?}",
        o.server.received,
        o.server.dest.len(),
        o.client.conn.as_ref().map_or(0, |c| c.bytes_acked()),
        o.client.state(),
        o.server.state(),
        o.elapsed,
        o.client.conn.as_ref().map(|c| c.stats().clone()),
        o.net.a_to_b.stats
    )
}

/// 64 MiB byte-exact under 0, 1, 5 and 20 % loss in both directions, with
/// 1 % duplication, 2 % reordering and jitter; CUBIC with SACK/RACK-TLP.
#[test]
fn bulk_64mib_loss_matrix() {
    let size = env_usize("TCP_BULK_MIB", 64) * MIB;
    for (i, &loss) in [0.0, 0.01, 0.05, 0.2].iter().enumerate() {
        let started = WallClock::now();
        let o = transfer(
            100 + i as u64,
            size,
            lossy(loss),
            lossy(loss),
            Config::default(),
            Config::default(),
            Duration::from_secs(3600),
            |_, _, _| {},
        );
        assert!(o.ok, "loss {loss}: {}", describe(&o));
        let st = o.client.conn().stats();
        println!(
            "64MiB loss {loss}: virtual {:?}, wall {:?}, retransmitted {}, rto {}, recoveries {}, tlp {}",
            o.elapsed,
            started.elapsed(),
            st.retransmitted_segments,
            st.rto_expirations,
            st.fast_recoveries,
            st.tlp_probes
        );
        if loss > 0.0 {
            assert!(st.retransmitted_segments > 0);
        }
    }
}

/// The same matrix at 64 MiB for NewReno without SACK (RFC 6582 recovery),
/// at 0 and 1 %, and 4 MiB at 5 and 20 % (go-back-N after RTO is slow).
#[test]
fn bulk_newreno_no_sack_loss_matrix() {
    let cfg = Config {
        congestion: CongestionAlgorithm::NewReno,
        sack: false,
        ..Config::default()
    };
    for (i, &(loss, mib)) in [(0.0, 64), (0.01, 64), (0.05, 4), (0.2, 4)]
        .iter()
        .enumerate()
    {
        let mib = mib.min(env_usize("TCP_BULK_MIB", 64));
        let o = transfer(
            200 + i as u64,
            mib * MIB,
            lossy(loss),
            lossy(loss),
            cfg.clone(),
            cfg.clone(),
            Duration::from_secs(3600),
            |_, _, _| {},
        );
        assert!(o.ok, "loss {loss}: {}", describe(&o));
        assert!(!o.client.conn().sack_enabled());
        if loss > 0.0 {
            assert!(o.client.conn().stats().fast_recoveries > 0);
        }
    }
}

/// Hundreds of short seeded runs (TCP_SEEDS, default 200) over a random mix
/// of loss, both congestion controllers, SACK on/off, stream and MPA modes.
#[test]
fn many_seeds_short_transfers() {
    let seeds = env_usize("TCP_SEEDS", 200) as u64;
    for seed in 0..seeds {
        let mut r = Rng::new(seed * 7919);
        let loss = [0.0, 0.01, 0.05, 0.2][r.range(0, 3) as usize];
        let mut cfg = if r.chance(0.5) {
            Config::mpa()
        } else {
            Config::default()
        };
        cfg.congestion = if r.chance(0.5) {
            CongestionAlgorithm::Cubic
        } else {
            CongestionAlgorithm::NewReno
        };
        cfg.sack = r.chance(0.7);
        cfg.timestamps = r.chance(0.8);
        cfg.window_scaling = r.chance(0.8);
        if r.chance(0.3) {
            cfg.delayed_ack = None;
        }
        let size = r.range(1, 120_000) as usize;
        let mut link = lossy(loss);
        link.split = if r.chance(0.2) { 0.05 } else { 0.0 };
        link.merge = if r.chance(0.2) { 0.05 } else { 0.0 };
        let o = transfer(
            seed,
            size,
            link.clone(),
            link,
            cfg.clone(),
            cfg.clone(),
            Duration::from_secs(3600),
            |_, _, _| {},
        );
        assert!(
            o.ok,
            "seed {seed} loss {loss} cfg {cfg:?}: {}",
            describe(&o)
        );
        assert_eq!(o.server.passed_twice, 0, "seed {seed}");
        assert_eq!(
            o.server.max_ooo_held * (cfg.rx_mode == tcp_engine::RxMode::PassUp) as u64,
            0
        );
    }
}

/// A middlebox splits and merges segments (keeping sequence numbers) under
/// 1 % loss: still byte-exact, both receive modes.
#[test]
fn resegmenting_middlebox() {
    for (i, cfg) in [Config::default(), Config::mpa()].into_iter().enumerate() {
        let mut link = lossy(0.01);
        link.split = 0.2;
        link.merge = 0.2;
        let o = transfer(
            300 + i as u64,
            4 * MIB,
            link.clone(),
            link,
            cfg.clone(),
            cfg,
            Duration::from_secs(600),
            |_, _, _| {},
        );
        assert!(o.ok, "{}", describe(&o));
        assert!(
            o.net.a_to_b.stats.split > 100 && o.net.a_to_b.stats.merged > 100,
            "{:?}",
            o.net.a_to_b.stats
        );
        assert_eq!(o.server.passed_twice, 0);
    }
}

/// The path MTU drops from 1500 to 1280 mid-transfer: the sender learns it
/// (packet-too-big report), reports the new EMSS as an event, resplits
/// retransmissions and completes byte-exact. Both transmit modes.
#[test]
fn mtu_drop_mid_transfer() {
    for (i, cfg) in [Config::default(), Config::mpa()].into_iter().enumerate() {
        let size = 8 * MIB;
        let (mut c, mut s, mut net) = setup(
            400 + i as u64,
            size,
            lossy(0.01),
            lossy(0.01),
            cfg.clone(),
            cfg,
        );
        let half = net.run(
            &mut c,
            &mut s,
            tcp_engine::Instant::from_millis(60_000),
            |_, s, _| s.received > size / 2,
            |_, _, _| {},
        );
        assert!(half);
        assert_eq!(c.conn().emss(), 1448);
        net.a_to_b.cfg.mtu = 1280;
        let mut oversize_after_drop = 0u64;
        let mut drop_seen = false;
        let ok = run_until_done(
            &mut c,
            &mut s,
            &mut net,
            Duration::from_secs(600),
            |d, _, p| {
                if d == Direction::AtoB {
                    if p.len() > 1280 {
                        if drop_seen {
                            oversize_after_drop += 1;
                        }
                    } else {
                        drop_seen = true;
                    }
                }
            },
        );
        assert!(ok, "received {}", s.received);
        assert!(
            c.events.contains(&Event::EmssChanged(1280 - 40 - 12)),
            "{:?}",
            c.events
        );
        assert_eq!(c.conn().emss(), 1228);
        assert!(net.a_to_b.stats.too_big > 0);
        // After the first packet that fit, only in-flight packets already
        // queued may exceed the MTU: no new oversize packets are emitted
        // once the report is processed (allow the burst already in flight).
        assert!(oversize_after_drop < 64, "{oversize_after_drop}");
    }
}

/// Check MPA segmentation on the wire: each data segment starts at a
/// record start (or at an EMSS split point of a record larger than EMSS),
/// ends at a record end (or such a split point), and a retransmission has
/// the same length as the first transmission.
fn check_record_segments(
    segs: &[(u32, u32)],
    stream_start: u32,
    record_ends: &[u64],
    emss: u64,
) -> (usize, u64) {
    let mut first_tx = std::collections::HashMap::new();
    let mut violations = 0;
    let mut retransmissions = 0;
    for &(seq, len) in segs {
        let pos = u64::from(seq.wrapping_sub(stream_start));
        let end = pos + u64::from(len);
        let i = record_ends.partition_point(|&e| e <= pos);
        let r_start = if i == 0 { 0 } else { record_ends[i - 1] };
        let r_end = record_ends[i];
        let big = r_end - r_start > emss;
        let start_ok = pos == r_start || (big && (pos - r_start) % emss == 0);
        let end_ok = record_ends.binary_search(&end).is_ok()
            || (big && end < r_end && (end - r_start) % emss == 0);
        if !start_ok || !end_ok {
            violations += 1;
        }
        match first_tx.insert(pos, len) {
            Some(l) if l != len => violations += 1,
            Some(_) => retransmissions += 1,
            None => {}
        }
    }
    (violations, retransmissions)
}

/// MPA mode under 5 % loss with reordering and duplication: every data
/// segment (first transmissions and retransmissions) begins with a record
/// and holds whole records; retransmissions keep the original boundaries;
/// out-of-order data is passed up once with correct sequence numbers; TCP
/// holds zero out-of-order bytes. The same run in InOrder mode does buffer
/// out-of-order data (so the counter is live).
#[test]
fn mpa_records_and_pass_up_under_loss() {
    for (k, loss) in [0.01, 0.05, 0.2].into_iter().enumerate() {
        let size = 4 * MIB;
        let mut segs = Vec::new();
        let (mut c, mut s, mut net) = setup(
            500 + k as u64,
            size,
            lossy(loss),
            lossy(loss),
            Config::mpa(),
            Config::mpa(),
        );
        let ok = run_until_done(
            &mut c,
            &mut s,
            &mut net,
            Duration::from_secs(3600),
            |d, _, p| {
                if d == Direction::AtoB {
                    if let Ok(r) = SegmentRepr::parse(p) {
                        if !r.payload.is_empty() {
                            segs.push((r.seq, r.payload.len() as u32));
                        }
                    }
                }
            },
        );
        assert!(ok, "loss {loss}: received {}", s.received);
        let (violations, retx) = check_record_segments(
            &segs,
            c.conn().snd_stream_start(),
            &c.record_ends,
            u64::from(c.conn().emss()),
        );
        assert_eq!(violations, 0, "loss {loss}");
        assert!(retx > 0, "loss {loss}: no retransmission was checked");
        assert!(
            c.record_ends.windows(2).any(|w| w[1] - w[0] > 1448),
            "some records exceed EMSS"
        );
        assert_eq!(s.passed_twice, 0);
        assert!(
            s.passed_out_of_order > 0,
            "loss {loss}: nothing passed up out of order"
        );
        assert_eq!(s.max_ooo_held, 0);
        assert_eq!(s.conn().receive_buffer_capacity(), 0);
        assert_eq!(s.conn().stats().passed_up_bytes, size as u64);
        // Control: InOrder mode buffers out-of-order bytes under the same impairments.
        let o = transfer(
            500 + k as u64,
            size,
            lossy(loss),
            lossy(loss),
            Config::default(),
            Config::default(),
            Duration::from_secs(3600),
            |_, _, _| {},
        );
        assert!(o.ok);
        assert!(o.server.max_ooo_held > 0);
    }
}

/// Packets written in pieces (`Connection::poll_transmit_split`, as into the frames of a
/// multi-buffer AF_XDP packet) under 1 % loss with reordering and duplication, in the source
/// and stream modes, with SACK blocks and timestamps in the headers: the receiver gets the
/// exact stream, every segment's checksum verified.
#[test]
fn packets_in_pieces_under_loss() {
    for (k, mode) in [TxMode::Source, TxMode::Stream].into_iter().enumerate() {
        for piece in [333, 700] {
            let size = MIB;
            let mut cfg = Config::mpa();
            cfg.tx_mode = mode;
            let (mut c, mut s, mut net) = setup(
                900 + k as u64 + piece as u64,
                size,
                lossy(0.01),
                lossy(0.01),
                cfg,
                Config::mpa(),
            );
            c.split = Some(piece);
            s.split = Some(piece);
            let mut pieces_long = 0;
            let ok = run_until_done(
                &mut c,
                &mut s,
                &mut net,
                Duration::from_secs(3600),
                |_, _, p| {
                    // Malformed or badly summed segments would be counted by the receiver.
                    pieces_long += usize::from(p.len() > piece);
                },
            );
            let what = format!("{mode:?} in pieces of {piece}");
            assert!(ok, "{what}: received {}", s.received);
            assert_eq!(s.malformed, 0, "{what}");
            assert!(
                pieces_long > 100,
                "{what}: {pieces_long} packets past the first piece"
            );
            assert!(
                c.conn().stats().retransmitted_segments > 0,
                "{what}: no loss recovered"
            );
            assert_eq!(c.fills.bad, 0, "{what}");
        }
    }
}

/// `TxMode::Source` under 1 % and 5 % loss with reordering and duplication: TCP holds no
/// octets; every segment, first transmission or retransmission, is produced by the source
/// (which is asked again for lost ranges, never for acknowledged ones); the boundaries are
/// those of `TxMode::Records` and the receiver gets the exact stream.
#[test]
fn source_mode_records_under_loss() {
    for (k, loss) in [0.01, 0.05].into_iter().enumerate() {
        let size = 2 * MIB;
        let mut segs = Vec::new();
        let mut cfg = Config::mpa();
        cfg.tx_mode = TxMode::Source;
        let (mut c, mut s, mut net) = setup(
            700 + k as u64,
            size,
            lossy(loss),
            lossy(loss),
            cfg,
            Config::mpa(),
        );
        let ok = run_until_done(
            &mut c,
            &mut s,
            &mut net,
            Duration::from_secs(3600),
            |d, _, p| {
                if d == Direction::AtoB {
                    if let Ok(r) = SegmentRepr::parse(p) {
                        if !r.payload.is_empty() {
                            segs.push((r.seq, r.payload.len() as u32));
                        }
                    }
                }
            },
        );
        assert!(ok, "loss {loss}: received {}", s.received);
        assert_eq!(c.conn().send_queue_len(), 0, "everything acknowledged");
        let (violations, retx) = check_record_segments(
            &segs,
            c.conn().snd_stream_start(),
            &c.record_ends,
            u64::from(c.conn().emss()),
        );
        assert_eq!(violations, 0, "loss {loss}");
        assert!(retx > 0, "loss {loss}: no retransmission on the wire");
        let f = &c.fills;
        assert_eq!(
            f.bad, 0,
            "loss {loss}: source asked for acknowledged or unknown octets"
        );
        assert!(
            f.refills > 0,
            "loss {loss}: no retransmission came from the source"
        );
        assert!(
            f.refills >= c.conn().stats().retransmitted_segments,
            "loss {loss}: every retransmitted segment was read from the source"
        );
        assert!(f.octets > size as u64);
        assert_eq!(f.calls, segs.len() as u64, "one fill per data segment sent");
    }
}

/// A source that cannot produce the octets of a retransmission aborts the connection (RST,
/// `Event::SourceFailed`) instead of sending anything else.
#[test]
fn source_failure_aborts() {
    use tcp_engine::{TxSource, TxSourceError};
    struct Once(bool);
    impl TxSource for Once {
        fn fill(&mut self, off: u64, out: &mut [u8]) -> Result<(), TxSourceError> {
            if self.0 {
                return Err(TxSourceError {
                    offset: off,
                    len: out.len(),
                });
            }
            self.0 = true;
            out.fill(7);
            Ok(())
        }
    }
    let mut cfg = Config::mpa();
    cfg.tx_mode = TxMode::Source;
    let isn = tcp_engine::IsnGenerator::new([1; 16]);
    let mut a = tcp_engine::Connection::connect(cfg, common::client_tuple(), &isn, Instant::ZERO);
    assert_eq!(a.send_record(b"x"), Err(tcp_engine::SendError::WrongMode));
    let mut buf = vec![0u8; 2048];
    let n = a.poll_transmit(Instant::ZERO, &mut buf).expect("SYN");
    let syn_pkt = buf[..n].to_vec();
    let syn = SegmentRepr::parse(&syn_pkt).expect("parse");
    let isn_b = tcp_engine::IsnGenerator::new([2; 16]);
    let mut b =
        tcp_engine::Connection::accept(Config::mpa(), &syn, &isn_b, Instant::ZERO).expect("accept");
    let n = b.poll_transmit(Instant::ZERO, &mut buf).expect("SYN-ACK");
    let synack_pkt = buf[..n].to_vec();
    let synack = SegmentRepr::parse(&synack_pkt).expect("parse");
    a.handle_segment(Instant::ZERO, &synack, |_| {});
    assert_eq!(a.state(), tcp_engine::State::Established);
    a.send_record_len(100).expect("record");
    let mut src = Once(false);
    // Control segments may come first (the ACK of the SYN-ACK); then the data segment.
    let mut data = None;
    for _ in 0..4 {
        let Some(n) = a.poll_transmit_with(Instant::ZERO, &mut buf, &mut src) else {
            break;
        };
        let seg = SegmentRepr::parse(&buf[..n]).expect("parse");
        if !seg.payload.is_empty() {
            assert!(seg.payload.iter().all(|&b| b == 7));
            data = Some(seg.payload.len());
        }
    }
    assert_eq!(data, Some(100));
    // No ACK: the RTO fires and the retransmission asks the source, which fails.
    let later = Instant::ZERO + Duration::from_secs(2);
    a.handle_timeout(later);
    let n = a
        .poll_transmit_with(later, &mut buf, &mut src)
        .expect("RST");
    let rst = SegmentRepr::parse(&buf[..n]).expect("parse");
    assert!(rst.flags.rst && rst.payload.is_empty());
    assert_eq!(a.state(), tcp_engine::State::Closed);
    let mut events = Vec::new();
    while let Some(e) = a.poll_event() {
        events.push(e);
    }
    assert!(events.contains(&Event::SourceFailed), "{events:?}");
}

/// Goodput under 1 % random loss as a fraction of loss-free goodput, on a
/// 10 Gb/s, 10 us one-way link (printed, not asserted against time).
#[test]
fn goodput_one_percent_loss() {
    let size = env_usize("TCP_GOODPUT_MIB", 32) * MIB;
    let plain = LinkConfig {
        queue_limit: Some(256),
        ..LinkConfig::default()
    };
    let lossy1 = LinkConfig {
        loss: 0.01,
        ..plain.clone()
    };
    for cc in [CongestionAlgorithm::Cubic, CongestionAlgorithm::NewReno] {
        let cfg = Config {
            congestion: cc,
            ..Config::default()
        };
        let base = transfer(
            600,
            size,
            plain.clone(),
            plain.clone(),
            cfg.clone(),
            cfg.clone(),
            Duration::from_secs(600),
            |_, _, _| {},
        );
        let lossy = transfer(
            601,
            size,
            lossy1.clone(),
            lossy1.clone(),
            cfg.clone(),
            cfg.clone(),
            Duration::from_secs(600),
            |_, _, _| {},
        );
        assert!(base.ok && lossy.ok);
        let gbps = |o: &Outcome| size as f64 * 8.0 / o.elapsed.as_secs_f64() / 1e9;
        println!(
            "goodput {cc:?}: loss-free {:.2} Gb/s, 1% loss {:.2} Gb/s, fraction {:.3}",
            gbps(&base),
            gbps(&lossy),
            gbps(&lossy) / gbps(&base)
        );
        assert!(gbps(&lossy) > 0.0);
    }
}
