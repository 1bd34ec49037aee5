//! A region registered just before a work request names it is always found by the engine: the
//! engine reads registration tables without a lock (a version per turn), so a turn that began
//! before the registration reads its table again when a work request arrives. 1,000 rounds:
//! queue 1 MiB Writes (so the engine's turns are long, busy with frames and ACKs), register a
//! fresh region, and post at once a Write from it and a Read into it; both must succeed.
//! Needs root and the veth bed (`SKIPPED` without, a failure under `CI=true`).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, Pinning, ProtectionDomain, SendOp, SendWr, Stag,
    WcStatus,
};
use testbed::*;

const PORT: u16 = 19_591;
const WAIT: Duration = Duration::from_secs(20);
const ROUNDS: u64 = 1000;
const BIG: usize = 1 << 20;

#[test]
fn a_region_registered_just_before_a_post_is_found() {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let srv = spawn_in_ns(NS_A, move || -> Result<(), String> {
        let engine =
            XdpEngine::start(DEV_A, XdpEngineConfig::default()).map_err(|e| e.to_string())?;
        let listener = engine
            .listen(PORT, ConnectParams::default())
            .map_err(|e| e.to_string())?;
        ready_tx.send(()).map_err(|_| "gone")?;
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| e.to_string())?
            .ok_or("no connection")?;
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let mr = pd
            .register(
                BIG,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .map_err(|e| e.to_string())?;
        let mut offer = mr.stag().0.to_be_bytes().to_vec();
        offer.extend_from_slice(&mr.base_to().to_be_bytes());
        let conn = req.accept(&pd, &cq, &offer).map_err(|e| e.to_string())?;
        let _ = done_rx.recv_timeout(WAIT * 3);
        drop(conn);
        Ok(())
    });
    ready_rx.recv_timeout(WAIT).expect("server ready");
    let cli = spawn_in_ns(NS_B, move || -> Result<(), String> {
        let engine =
            XdpEngine::start(DEV_B, XdpEngineConfig::default()).map_err(|e| e.to_string())?;
        let pd = ProtectionDomain::new().with_pinning(Pinning::BestEffort);
        let cq = CompletionQueue::new();
        let conn = engine
            .connect(
                SocketAddr::from((ADDR_A, PORT)),
                &pd,
                &cq,
                &ConnectParams::default(),
                b"",
            )
            .map_err(|e| format!("connect: {e}"))?;
        let p = &conn.private_data;
        let stag = Stag(u32::from_be_bytes(p[..4].try_into().unwrap()));
        let to = u64::from_be_bytes(p[4..12].try_into().unwrap());
        let big = pd.register(BIG, Access::NONE).map_err(|e| e.to_string())?;
        let post = |wr: SendWr| conn.qp.post_send(wr).map_err(|e| e.to_string());
        for round in 0..ROUNDS {
            // Load: unsignaled 1 MiB Writes ahead of the round's requests.
            for _ in 0..2 {
                post(SendWr {
                    wr_id: u64::MAX,
                    op: SendOp::Write {
                        remote_stag: stag,
                        remote_to: to,
                    },
                    sg_list: big.sge(0, BIG as u32).into(),
                    signaled: false,
                    fence: false,
                })?;
            }
            // The Write's source and the Read's sink, registered just before the post: the
            // Read brings back what the Write put there (it follows it on the stream).
            let fill = (round % 255) as u8 + 1;
            let src = pd
                .register_buffer(vec![fill; 4096], Access::LOCAL_WRITE)
                .map_err(|e| e.to_string())?;
            let sink = pd
                .register_buffer(vec![0u8; 4096], Access::LOCAL_WRITE)
                .map_err(|e| e.to_string())?;
            for (wr_id, op, mr) in [
                (
                    round * 2,
                    SendOp::Write {
                        remote_stag: stag,
                        remote_to: to,
                    },
                    &src,
                ),
                (
                    round * 2 + 1,
                    SendOp::Read {
                        remote_stag: stag,
                        remote_to: to,
                    },
                    &sink,
                ),
            ] {
                post(SendWr {
                    wr_id,
                    op,
                    sg_list: mr.sge(0, 4096).into(),
                    signaled: true,
                    fence: false,
                })?;
            }
            let mut done = Vec::new();
            for _ in 0..2 {
                let c = cq.wait(WAIT).ok_or("no completion")?;
                if c.wc.status != WcStatus::Success {
                    return Err(format!("round {round}: {c:?}"));
                }
                done.push(c.wc.wr_id);
            }
            done.sort_unstable();
            if done != [round * 2, round * 2 + 1] {
                return Err(format!("round {round}: completions {done:?}"));
            }
            let mut got = vec![0u8; 4096];
            sink.read(0, &mut got);
            if got.iter().any(|&b| b != fill) {
                return Err(format!(
                    "round {round}: the Read brought back something else"
                ));
            }
        }
        drop(conn);
        Ok(())
    });
    let c = cli.join().expect("client");
    let _ = done_tx.send(());
    let s = srv.join().expect("server");
    c.unwrap_or_else(|e| panic!("client: {e}"));
    s.unwrap_or_else(|e| panic!("server: {e}"));
}
