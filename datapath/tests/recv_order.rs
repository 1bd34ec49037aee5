//! A receive the queue pair refuses when it takes it (its element names no region the queue
//! pair may write) completes in its place in the receive queue, after the receives posted
//! before it, and then fails the queue pair, as a verbs device fails one whose next receive
//! is bad: the receive after it completes flushed (no Send meant for the bad one lands in
//! it), and the peer gets our Terminate. The socket transport on loopback; the AF_XDP engine
//! on the veth bed (root, `SKIPPED` without, a failure under `CI=true`).

mod common;

use std::net::SocketAddr;
use std::sync::mpsc::Sender;

use common::{assert_no_more, bed, collect, send_wr, Side, WAIT};
use datapath::{
    Access, ConnectRequest, Connection, Listener, MemoryRegion, MpaConfig, QpError, RecvWr, Sge,
    Stag, WcOpcode, WcStatus,
};
use testbed::{bed_or_skip, ADDR_B};

const LEN: usize = 64;

/// The refused receive's work request id.
const REFUSED: u64 = 100;

/// Posts a receive into slot 0, one naming a region that does not exist, and one into slot 1,
/// then the Send that tells the peer to send two Sends back; returns the receive completions
/// in the order they came.
fn receive_around_a_refusal(
    conn: &Connection,
    side: &Side,
    buf: &MemoryRegion,
) -> Vec<(u64, WcStatus)> {
    let qp = &conn.qp;
    qp.post_recv(bed::slot_recv(buf, 0, LEN))
        .expect("receive 0");
    qp.post_recv(RecvWr {
        wr_id: REFUSED,
        sg_list: Sge {
            stag: Stag(buf.stag().0 ^ 0x0100_0000),
            to: buf.base_to(),
            len: LEN as u32,
        }
        .into(),
    })
    .expect("the refused receive is taken at the post");
    qp.post_recv(bed::slot_recv(buf, 1, LEN))
        .expect("receive 1");
    let src = side.pd.register(LEN, Access::LOCAL_WRITE).expect("src");
    qp.post_send(send_wr(7, &src, LEN)).expect("the go-ahead");
    let got = collect(&side.cq, 4, "the go-ahead and three receives");
    let sends: Vec<_> = got
        .iter()
        .filter(|c| c.wc.opcode == WcOpcode::Send)
        .map(|c| (c.wc.wr_id, c.wc.status))
        .collect();
    assert_eq!(sends, [(7, WcStatus::Success)], "{got:?}");
    got.iter()
        .filter(|c| c.wc.opcode == WcOpcode::Recv)
        .map(|c| (c.wc.wr_id, c.wc.status))
        .collect()
}

fn assert_in_order(recvs: &[(u64, WcStatus)]) {
    assert_eq!(
        recvs,
        [
            (0, WcStatus::Success),
            (REFUSED, WcStatus::LocalProtectionError),
            (1, WcStatus::WrFlushError),
        ]
    );
}

/// Our queue pair failed for the refused receive: a Terminate of ours (RDMAP, Local
/// Catastrophic).
fn assert_failed_locally(conn: &Connection) {
    conn.qp.wait_finished(WAIT);
    match conn.qp.status().error {
        Some(QpError::LocalTerminate(t)) => assert_eq!((t.layer, t.etype), (0, 0), "{t:?}"),
        other => panic!("not our Terminate: {other:?}"),
    }
}

/// The peer: accepts with one receive, waits for the go-ahead, sends two Sends: the first
/// lands in receive 0 and completes; the second, meant for the refused receive, finds our
/// queue pair failed (any status), and the peer's queue pair ends with our Terminate.
fn send_two_on_go_ahead(req: ConnectRequest) -> Result<Connection, String> {
    let side = Side::new();
    let buf = side
        .pd
        .register(LEN * 4, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    let conn = req
        .accept_with_recvs(&side.pd, &side.cq, &[], vec![bed::slot_recv(&buf, 0, LEN)])
        .map_err(|e| format!("accept: {e}"))?;
    match side.cq.wait(WAIT) {
        Some(c) if c.wc.opcode == WcOpcode::Recv && c.wc.status == WcStatus::Success => {}
        other => return Err(format!("the go-ahead: {other:?}")),
    }
    for i in 1..=2 {
        conn.qp
            .post_send(bed::slot_send(&buf, i, LEN))
            .map_err(|e| format!("Send {i}: {e}"))?;
    }
    match side.cq.wait(WAIT) {
        Some(c) if c.wc.status == WcStatus::Success => {}
        other => return Err(format!("Send 1's completion: {other:?}")),
    }
    if side.cq.wait(WAIT).is_none() {
        return Err("Send 2 never completed".into());
    }
    conn.qp.wait_finished(WAIT);
    match conn.qp.status().error {
        Some(QpError::RemoteTerminate(_)) => Ok(conn),
        other => Err(format!(
            "the peer's queue pair did not get our Terminate: {other:?}"
        )),
    }
}

#[test]
fn socket_refused_receive_completes_in_its_place_and_fails_the_queue_pair() {
    let params = common::params(MpaConfig::default());
    let listener = Listener::bind(common::any_port(), params.clone()).expect("listen");
    let addr = listener.local_addr().expect("address");
    let client = Side::new();
    let buf = client
        .pd
        .register(LEN * 4, Access::LOCAL_WRITE)
        .expect("region");
    std::thread::scope(|scope| {
        let serving = scope.spawn(|| {
            let req = listener
                .accept_timeout(WAIT)
                .expect("accept")
                .expect("a request");
            send_two_on_go_ahead(req)
        });
        let c = datapath::connect(addr, &client.pd, &client.cq, &params, &[]).expect("connect");
        let recvs = receive_around_a_refusal(&c, &client, &buf);
        let s = serving.join().expect("server thread").expect("server");
        assert_in_order(&recvs);
        assert_failed_locally(&c);
        c.qp.disconnect();
        s.qp.disconnect();
    });
}

/// The send side: a Send whose element names no region, posted between two good ones,
/// fails in its place after the first went, and fails the queue pair: the one after it
/// completes flushed and never reaches the peer, which gets our Terminate instead.
#[test]
fn socket_refused_send_fails_in_its_place_and_fails_the_queue_pair() {
    let params = common::params(MpaConfig::default());
    let listener = Listener::bind(common::any_port(), params.clone()).expect("listen");
    let addr = listener.local_addr().expect("address");
    let client = Side::new();
    let src = client.pd.register(LEN, Access::NONE).expect("src");
    std::thread::scope(|scope| {
        let serving = scope.spawn(|| -> Result<Vec<(u64, WcStatus)>, String> {
            let req = listener
                .accept_timeout(WAIT)
                .map_err(|e| e.to_string())?
                .ok_or("no request")?;
            let side = Side::new();
            let buf = side
                .pd
                .register(LEN * 4, Access::LOCAL_WRITE)
                .map_err(|e| e.to_string())?;
            let recvs = (0..3).map(|i| bed::slot_recv(&buf, i, LEN)).collect();
            let conn = req
                .accept_with_recvs(&side.pd, &side.cq, &[], recvs)
                .map_err(|e| format!("accept: {e}"))?;
            let got = collect(&side.cq, 3, "the peer's three receives");
            conn.qp.wait_finished(WAIT);
            match conn.qp.status().error {
                Some(QpError::RemoteTerminate(_)) => {}
                other => return Err(format!("not our Terminate: {other:?}")),
            }
            Ok(got.iter().map(|c| (c.wc.wr_id, c.wc.status)).collect())
        });
        let c = datapath::connect(addr, &client.pd, &client.cq, &params, &[]).expect("connect");
        let mut bad = send_wr(2, &src, LEN);
        bad.sg_list = Sge {
            stag: Stag(src.stag().0 ^ 0x0100_0000),
            to: src.base_to(),
            len: LEN as u32,
        }
        .into();
        for wr in [send_wr(1, &src, LEN), bad, send_wr(3, &src, LEN)] {
            c.qp.post_send(wr).expect("taken at the post");
        }
        let got: Vec<_> = collect(&client.cq, 3, "the three Sends")
            .iter()
            .map(|c| (c.wc.wr_id, c.wc.status))
            .collect();
        assert_eq!(
            got,
            [
                (1, WcStatus::Success),
                (2, WcStatus::LocalProtectionError),
                (3, WcStatus::WrFlushError),
            ]
        );
        assert_failed_locally(&c);
        let peer = serving.join().expect("server thread").expect("server");
        assert_eq!(
            peer,
            [
                (0, WcStatus::Success),
                (1, WcStatus::WrFlushError),
                (2, WcStatus::WrFlushError),
            ]
        );
        c.qp.disconnect();
    });
}

#[test]
fn engine_refused_receive_completes_in_its_place_and_fails_the_queue_pair() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_628;
    let server = |ready: Sender<()>| {
        let req = bed::listen_in_b(PORT, &ready, WAIT)?;
        let conn = send_two_on_go_ahead(req)?;
        let _ = conn.qp.wait_finished(WAIT);
        Ok(())
    };
    let recvs = bed::engine_against(server, |engine| {
        let client = Side::new();
        let buf = client
            .pd
            .register(LEN * 4, Access::LOCAL_WRITE)
            .expect("region");
        let c = engine
            .connect(
                SocketAddr::from((ADDR_B, PORT)),
                &client.pd,
                &client.cq,
                &bed::params(),
                &[],
            )
            .expect("connect");
        let recvs = receive_around_a_refusal(&c, &client, &buf);
        assert_failed_locally(&c);
        c.qp.disconnect();
        // The connection's end flushes nothing more: every receive completed.
        assert_no_more(&client.cq);
        recvs
    });
    assert_in_order(&recvs);
}
