//! The AF_XDP engine through a lossy relay on the test bed (`scripts/netns-relay.sh`): engine
//! (iwra, server) <-> relay (iwrr, `testbed::relay`) <-> engine (iwrb, client).
//!
//! Each case moves Writes, Reads and Sends of a few MiB through the relay and checks every
//! byte, then checks the engines' counters against what the relay did:
//!
//! * header-aligned senders, 1% and 5% loss and reordering: out-of-order FPDUs are placed
//!   straight into the destination (bytes placed out of order > 0) while the reassembly store
//!   holds nothing (peak 0), and the senders retransmitted;
//! * a re-segmenting relay (segments gathered and cut again at random offsets, MSS clamped so
//!   FPDUs are smaller than the segments it builds) with Markers both ways and 2% loss and
//!   reordering: FPDUs are still placed out of order, and what is held at each gap stays
//!   under the bound `gap_bound` explains (the pieces of the FPDUs the gap cuts).
//!
//! Read Requests act only in order (RFC 5040 5.3), so an early one would be held. The client
//! posts each round's Read first and starts a round only after the server's "round done"
//! message, which the server sends once everything of the previous round arrived: a Read
//! Request is then always the oldest unacknowledged octets of its direction and can never
//! arrive ahead of a gap. Every other message may.
//!
//! The server's Read source has two halves, used by alternate rounds: the server rewrites a
//! half for round r + 1 once round r's Write and Send have arrived, and nothing tells it that
//! round r's Read Response has been read by then (the client posts its Write and Send right
//! behind its Read). Round r - 1's Read, which used that half, has completed at the client
//! before round r began. Rewriting the half a Read may still be reading would be an
//! application race (RFC 5040 puts no order between a responder's later local writes and a
//! Read Response it is generating), not something an RDMA stack can make deterministic.
//!
//! Needs root; skips (or fails under `CI=true`) otherwise.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use datapath::engine::{EngineCounters, XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, MemoryRegion, MpaConfig, ProtectionDomain, RecvWr,
    SendOp, SendWr, WcOpcode, WcStatus,
};
use testbed::relay::*;
use testbed::{relay_bed_or_skip, spawn_in_ns};

/// Message sizes of the rounds (each round: one Read, one Write, one Send of this size).
const ROUNDS: [usize; 3] = [4096, 1 << 20, 2 << 20];
const REGION: usize = 2 << 20;

/// Where round `r`'s Read source lies in the server's Read region (alternate halves).
fn read_half(r: usize) -> usize {
    (r % 2) * REGION
}
const WAIT: Duration = Duration::from_secs(60);
const PORT: u16 = 19_615;
/// The "round done" message the server sends.
const DONE_LEN: usize = 8;

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (i as u64 ^ (seed as u64).rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            (x >> 56) as u8
        })
        .collect()
}

fn bytes(mr: &MemoryRegion, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v);
    v
}

fn params(mpa: &MpaConfig) -> ConnectParams {
    ConnectParams {
        mpa: mpa.clone(),
        setup_timeout: Duration::from_secs(20),
        ..ConnectParams::default()
    }
}

fn stop(mut engine: XdpEngine) -> EngineCounters {
    engine.stop();
    engine.counters()
}

const ALL: Access = Access::ALL;

fn server(mpa: MpaConfig, ready: std::sync::mpsc::Sender<()>) -> Result<EngineCounters, String> {
    let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default())
        .map_err(|e| format!("server engine: {e}"))?;
    let listener = engine
        .listen(PORT, params(&mpa))
        .map_err(|e| format!("listen: {e}"))?;
    let _ = ready.send(());
    let req = listener
        .accept_timeout(WAIT)
        .map_err(|e| format!("accept: {e}"))?
        .ok_or("no connection request in time")?;
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let wbuf = pd.register(REGION, ALL).map_err(|e| e.to_string())?;
    let rbuf = pd.register(2 * REGION, ALL).map_err(|e| e.to_string())?;
    let recv = pd.register(REGION, ALL).map_err(|e| e.to_string())?;
    let done = pd.register(4096, ALL).map_err(|e| e.to_string())?;
    let recvs = vec![RecvWr {
        wr_id: 0,
        sg_list: recv.sge(0, ROUNDS[0] as u32).into(),
    }];
    let mut welcome = Vec::new();
    for mr in [&wbuf, &rbuf] {
        welcome.extend_from_slice(&mr.stag().0.to_be_bytes());
        welcome.extend_from_slice(&mr.base_to().to_be_bytes());
    }
    rbuf.write(read_half(0), &pattern(1000, ROUNDS[0]));
    let conn = req
        .accept_with_recvs(&pd, &cq, &welcome, recvs)
        .map_err(|e| format!("accept: {e}"))?;
    let mut qp = conn.qp;
    for (r, &size) in ROUNDS.iter().enumerate() {
        let c = cq
            .wait(WAIT)
            .ok_or_else(|| format!("round {r}: no receive completion: {:?}", qp.status()))?;
        if c.wc.status != WcStatus::Success
            || c.wc.opcode != WcOpcode::Recv
            || c.wc.byte_len as usize != size
        {
            return Err(format!("round {r}: unexpected completion {c:?}"));
        }
        if bytes(&recv, 0, size) != pattern(2000 + r, size) {
            return Err(format!("round {r}: Send data differs"));
        }
        // The Send followed the Write on the same stream, so the Write is placed.
        if bytes(&wbuf, 0, size) != pattern(3000 + r, size) {
            return Err(format!("round {r}: Write data differs"));
        }
        // The next round's Read source and receive, then "round done".
        if let Some(&next) = ROUNDS.get(r + 1) {
            rbuf.write(read_half(r + 1), &pattern(1000 + r + 1, next));
            qp.post_recv(RecvWr {
                wr_id: r as u64 + 1,
                sg_list: recv.sge(0, next as u32).into(),
            })
            .map_err(|e| format!("post_recv: {e}"))?;
        }
        done.write(0, &(r as u64).to_be_bytes());
        qp.post_send(SendWr {
            wr_id: 100 + r as u64,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: done.sge(0, DONE_LEN as u32).into(),
            signaled: true,
        })
        .map_err(|e| format!("post_send: {e}"))?;
        let c = cq
            .wait(WAIT)
            .ok_or_else(|| format!("round {r}: \"done\" not completed: {:?}", qp.status()))?;
        if c.wc.status != WcStatus::Success || c.wc.opcode != WcOpcode::Send {
            return Err(format!("round {r}: \"done\": {c:?}"));
        }
    }
    if !qp.wait_finished(WAIT) {
        return Err(format!(
            "connection not closed by the client: {:?}",
            qp.status()
        ));
    }
    qp.disconnect();
    Ok(stop(engine))
}

fn client(mpa: MpaConfig) -> Result<EngineCounters, String> {
    let engine = XdpEngine::start(DEV_B, XdpEngineConfig::default())
        .map_err(|e| format!("client engine: {e}"))?;
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let src = pd.register(REGION, ALL).map_err(|e| e.to_string())?;
    let dst = pd.register(REGION, ALL).map_err(|e| e.to_string())?;
    let send_src = pd.register(REGION, ALL).map_err(|e| e.to_string())?;
    let done = pd.register(4096, ALL).map_err(|e| e.to_string())?;
    let addr = SocketAddr::from((ADDR_A, PORT));
    let conn = engine
        .connect(addr, &pd, &cq, &params(&mpa), b"relay client")
        .map_err(|e| format!("connect: {e}"))?;
    let w = &conn.private_data;
    if w.len() != 24 {
        return Err(format!("reply private data of {} bytes", w.len()));
    }
    let stag = |o: usize| datapath::Stag(u32::from_be_bytes(w[o..o + 4].try_into().unwrap()));
    let to = |o: usize| u64::from_be_bytes(w[o + 4..o + 12].try_into().unwrap());
    let (wstag, wto, rstag, rto) = (stag(0), to(0), stag(12), to(12));
    let mut qp = conn.qp;
    for r in 0..ROUNDS.len() {
        qp.post_recv(RecvWr {
            wr_id: 200 + r as u64,
            sg_list: done.sge(r * DONE_LEN, DONE_LEN as u32).into(),
        })
        .map_err(|e| format!("post_recv: {e}"))?;
    }
    for (r, &size) in ROUNDS.iter().enumerate() {
        src.write(0, &pattern(3000 + r, size));
        send_src.write(0, &pattern(2000 + r, size));
        let ops = [
            (
                1,
                SendOp::Read {
                    remote_stag: rstag,
                    remote_to: rto + read_half(r) as u64,
                },
                dst.sge(0, size as u32),
            ),
            (
                2,
                SendOp::Write {
                    remote_stag: wstag,
                    remote_to: wto,
                },
                src.sge(0, size as u32),
            ),
            (
                3,
                SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                send_src.sge(0, size as u32),
            ),
        ];
        for (wr_id, op, local) in ops {
            qp.post_send(SendWr {
                wr_id,
                op,
                sg_list: local.into(),
                signaled: true,
            })
            .map_err(|e| format!("post: {e}"))?;
        }
        // Our three work requests and the server's "round done".
        let mut seen = Vec::new();
        while seen.len() < 4 {
            let c = cq.wait(WAIT).ok_or_else(|| {
                format!("round {r}: completions so far {seen:?}; {:?}", qp.status())
            })?;
            if c.wc.status != WcStatus::Success {
                return Err(format!("round {r}: {c:?}; {:?}", qp.status()));
            }
            seen.push(c.wc.wr_id);
        }
        if !seen.contains(&(200 + r as u64)) {
            return Err(format!("round {r}: completions {seen:?}"));
        }
        if bytes(&dst, 0, size) != pattern(1000 + r, size) {
            return Err(format!("round {r}: Read data differs"));
        }
        if bytes(&done, r * DONE_LEN, DONE_LEN) != (r as u64).to_be_bytes() {
            return Err(format!("round {r}: \"done\" message differs"));
        }
    }
    qp.disconnect();
    if !qp.status().finished {
        return Err(format!("disconnect did not finish: {:?}", qp.status()));
    }
    Ok(stop(engine))
}

struct Run {
    server: EngineCounters,
    client: EngineCounters,
    relay: RelayStats,
}

/// One session through a relay configured by `relay`, with `mpa` on both ends.
fn run(relay: RelayConfig, mpa: MpaConfig) -> Run {
    let t = Instant::now();
    let relay = Relay::start(RelayConfig {
        netns: Some(NS_RELAY.into()),
        dev_a: RELAY_DEV_A.into(),
        dev_b: RELAY_DEV_B.into(),
        lifetime: Duration::from_secs(300),
        ..relay
    })
    .unwrap_or_else(|e| panic!("relay: {e}"));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let m = mpa.clone();
    let srv = spawn_in_ns(NS_A, move || server(m, ready_tx));
    if ready_rx.recv_timeout(WAIT).is_err() {
        let r = srv.join();
        panic!("server did not start: {r:?}");
    }
    let cli = spawn_in_ns(NS_B, move || client(mpa));
    let c = cli.join().expect("client thread");
    let s = srv.join().expect("server thread");
    let relay = relay.stop().unwrap_or_else(|e| panic!("relay: {e}"));
    println!("relay: {relay:#?}");
    println!("took {:?}", t.elapsed());
    let client = c.unwrap_or_else(|e| panic!("client: {e}\nrelay {relay:?}"));
    let server = s.unwrap_or_else(|e| panic!("server: {e}\nrelay {relay:?}"));
    println!("server engine: {:#?}", server.conns);
    println!("client engine: {:#?}", client.conns);
    for (who, e) in [("server", &server), ("client", &client)] {
        assert!(e.error.is_none(), "{who}: {:?}", e.error);
        assert_eq!(e.conns.crc_errors, 0, "{who}");
        assert_eq!(e.conns.terminates_sent, 0, "{who}");
        assert_eq!(e.established, 1, "{who}");
    }
    Run {
        server,
        client,
        relay,
    }
}

fn aligned(loss: f64, seed: u64) {
    let _bed = relay_bed_or_skip!();
    let r = run(
        RelayConfig {
            seed,
            loss,
            reorder: loss,
            ..RelayConfig::default()
        },
        MpaConfig::default(),
    );
    let (s, c) = (&r.server.conns, &r.client.conns);
    assert!(r.relay.a_to_b.dropped + r.relay.b_to_a.dropped > 0);
    assert!(r.relay.a_to_b.reordered + r.relay.b_to_a.reordered > 0);
    // Writes and Sends (server) and Read Responses (client) placed out of order, from the
    // segments themselves: nothing held.
    for (who, e) in [("server", s), ("client", c)] {
        assert!(e.bytes_placed_out_of_order > 0, "{who}: {e:?}");
        assert_eq!(e.held_peak, 0, "{who}: {e:?}");
        assert_eq!(e.held_total, 0, "{who}: {e:?}");
        assert!(e.retransmissions > 0, "{who}: {e:?}");
    }
}

#[test]
fn aligned_loss_reorder_1_percent() {
    aligned(0.01, 11);
}

#[test]
fn aligned_loss_reorder_5_percent() {
    aligned(0.05, 12);
}

#[test]
fn resegmenting_relay_with_markers() {
    let _bed = relay_bed_or_skip!();
    let r = run(
        RelayConfig {
            seed: 13,
            loss: 0.02,
            reorder: 0.02,
            resegment: true,
            mss_clamp: Some(MSS_CLAMP),
            ..RelayConfig::default()
        },
        MpaConfig {
            markers: true,
            ..MpaConfig::default()
        },
    );
    let (s, c) = (&r.server.conns, &r.client.conns);
    for (who, e, d) in [
        ("server", s, &r.relay.b_to_a),
        ("client", c, &r.relay.a_to_b),
    ] {
        println!(
            "{who}: held peak {} octets ({:.1} FPDUs of at most {FPDU_MAX}) at {} gaps, most \
             held at one gap {} octets, longest held run {} octets, {} held in all, {} FPDUs \
             placed out of order, {} of {} relayed data segments cut inside a sender's segment",
            e.held_peak,
            e.held_peak as f64 / FPDU_MAX as f64,
            e.held_peak_gaps,
            e.held_gap_peak,
            e.held_run_peak,
            e.held_total,
            e.fpdus_placed_out_of_order,
            d.unaligned_pieces,
            d.pieces
        );
        // FPDUs no longer start segments ...
        assert!(d.unaligned_pieces * 2 > d.pieces, "{who}: {d:?}");
        // (a SYN the relay drops comes again and is clamped again)
        assert!(d.mss_clamped >= 1, "{who}: {d:?}");
        // ... yet Markers locate them in out-of-order segments, which are placed at once;
        assert!(e.fpdus_placed_out_of_order > 50, "{who}: {e:?}");
        // pieces of cut FPDUs are held, at each gap within `gap_bound`,
        assert!(e.held_total > 0, "{who}: {e:?}");
        assert!(e.held_gap_peak < gap_bound(), "{who}: {e:?}");
        assert!(e.held_run_peak < gap_bound(), "{who}: {e:?}");
        assert!(e.held_peak_gaps >= 1, "{who}: {e:?}");
        assert!(e.held_peak < e.held_peak_gaps * gap_bound(), "{who}: {e:?}");
        assert!(e.retransmissions > 0, "{who}: {e:?}");
    }
}

/// The relay lowers the MSS to this, so FPDUs (at most `FPDU_MAX` octets) are about half the
/// segments it builds (up to 1448 octets of payload).
const MSS_CLAMP: u16 = 700;
/// The largest FPDU the senders make: EMSS (MSS less 12 octets of timestamps).
const FPDU_MAX: u64 = MSS_CLAMP as u64 - 12;

/// The bound on the octets held at one gap (`ConnCounters::held_gap_peak`), and why.
///
/// Out of order, the store keeps the octets of a segment that are not inside an FPDU located
/// and placed. A gap (a hole in what arrived, or the end of what arrived so far) cuts the FPDU
/// it starts in (X) and the one it ends in (Y; the same FPDU when the gap lies inside one):
/// X's front (from its header up to the gap) and Y's back (after the gap) cannot be checked
/// and placed before the rest arrives, so any receiver holds them: together less than two
/// FPDUs, less than one when X is Y. When X is Y and its ULPDU_Length arrived, that says where
/// the FPDU after it starts, beyond the gap, and the run after the gap is framed from there.
/// When the gap swallowed Y's ULPDU_Length, the run after it is framed from the first header
/// one of its Markers points at, and the FPDUs before that header are found backwards from it
/// (CRC-checked). Until such a header has arrived, nothing tells where Y ends, and the run
/// counts whole for this gap: Y's back and the front of the next FPDU, which holds no Marker
/// of the run yet, so less than 512 octets of it (RFC 5044 section 5). So: under
/// 2 x 688 + 512 = 1888 octets at a gap, under 688 when it lies inside an FPDU after its
/// header. `engine_reorder.rs` checks the store after every segment against what the cut
/// FPDUs' pieces need (equal in relay-like orders with 64 KiB Writes) and both per-gap bounds.
/// Held runs are within the same bound.
fn gap_bound() -> u64 {
    2 * FPDU_MAX + 512
}
