mod common;
use common::*;
use std::time::Duration;
use tcp_engine::{Config, CongestionAlgorithm};

#[test]
fn small_transfer_no_loss() {
    let o = transfer(
        1,
        200_000,
        lossy(0.0),
        lossy(0.0),
        Config::default(),
        Config::default(),
        Duration::from_secs(10),
        |_, _, _| {},
    );
    assert!(
        o.ok,
        "received {} of 200000, client state {:?} server {:?}",
        o.server.received,
        o.client.state(),
        o.server.state()
    );
}

#[test]
fn probe_matrix() {
    for &loss in &[0.01, 0.05, 0.2] {
        for seed in 0..20u64 {
            for cc in [CongestionAlgorithm::Cubic, CongestionAlgorithm::NewReno] {
                for sack in [true, false] {
                    let cfg = Config {
                        congestion: cc,
                        sack,
                        ..Config::default()
                    };
                    let o = transfer(
                        seed,
                        300_000,
                        lossy(loss),
                        lossy(loss),
                        cfg.clone(),
                        cfg,
                        Duration::from_secs(300),
                        |_, _, _| {},
                    );
                    if !o.ok {
                        println!("FAIL loss {loss} seed {seed} {cc:?} sack {sack}: recv {} acked {} states {:?} {:?} t={:?} stats {:?}", o.server.received, o.client.conn().bytes_acked(), o.client.state(), o.server.state(), o.elapsed, o.client.conn().stats());
                    }
                }
            }
        }
        println!("loss {loss} done");
    }
}
