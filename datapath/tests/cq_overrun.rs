//! A completion queue holds its `cqe` completions (`CompletionQueue::create`), as verbs' does:
//! a completion that finds it full is lost, the queue reports the overrun (`is_overrun`,
//! `AsyncEvent::CqError`) and the queue pair that completed into it fails with
//! `QpError::CqOverrun` (`AsyncEvent::QpFatal`), its connection reset; what the queue held
//! stays to be polled. The socket transport on loopback, and the AF_XDP engine on the veth bed
//! (root, `SKIPPED` without, a failure under `CI=true`) against a socket-transport peer.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{any_port, bed, establish_ok, params, stays_empty, ServerPlan, Side, WAIT};
use datapath::{
    Access, AsyncEvent, AsyncEventChannel, CompletionQueue, Connection, DatapathError, Device,
    Listener, MemoryRegion, MpaConfig, QpError, RecvWr, SendOp, SendWr, WcStatus, MAX_CQE,
};
use testbed::{bed_or_skip, ADDR_B};

/// Completions the client's queue holds.
const CQE: usize = 4;

/// Receives for the peer (more than the client sends), and the region they point into.
fn recvs(side: &Side) -> (MemoryRegion, Vec<RecvWr>) {
    let inbox = side.pd.register(8 * 64, Access::LOCAL_WRITE).unwrap();
    let wrs = (0..8u64)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: inbox.sge(i as usize * 64, 64).into(),
        })
        .collect();
    (inbox, wrs)
}

/// A signaled Send of `src`'s first 64 octets.
fn send(src: &MemoryRegion, wr_id: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: src.sge(0, 64).into(),
        signaled: true,
        fence: false,
    }
}

/// The client posts one signaled Send more than its queue holds and polls nothing: the
/// queue's first [`CQE`] completions are there, in order; the next was lost; the queue reports
/// the overrun, and the queue pair failed with `CqOverrun`, once each.
fn overrun_fails_the_queue_pair(conn: &Connection, side: &Side) {
    let channel = AsyncEventChannel::new().unwrap();
    side.cq.notify_async(&channel, 5);
    conn.qp.notify_async(&channel, 6);
    let src = side.pd.register(64, Access::LOCAL_WRITE).unwrap();
    for i in 0..=CQE as u64 {
        conn.qp.post_send(send(&src, i)).expect("post a Send");
    }
    assert!(
        conn.qp.wait_finished(WAIT),
        "the queue pair whose completion was lost ends"
    );
    let mut events = Vec::new();
    while events.len() < 2 {
        match channel.wait_event(WAIT) {
            Some(e) => events.push(e),
            None => panic!("two events (CqError, QpFatal); got {events:?}"),
        }
    }
    assert!(
        events.contains(&AsyncEvent::CqError { context: 5 }),
        "{events:?}"
    );
    assert!(
        events.contains(&AsyncEvent::QpFatal {
            qp_num: conn.qp.num(),
            context: 6,
            error: QpError::CqOverrun,
        }),
        "{events:?}"
    );
    assert!(channel.wait_event(Duration::from_millis(200)).is_none());
    assert!(side.cq.is_overrun());
    assert_eq!(side.cq.capacity(), CQE);
    let mut got = Vec::new();
    assert_eq!(side.cq.poll(&mut got, 2 * CQE), CQE);
    for (i, c) in got.iter().enumerate() {
        assert_eq!((c.wc.wr_id, c.wc.status), (i as u64, WcStatus::Success));
    }
    stays_empty(&side.cq, "the rest was lost");
}

#[test]
fn a_queue_holds_1_to_max_cqe() {
    for cqe in [0, MAX_CQE + 1] {
        assert!(matches!(
            CompletionQueue::create(cqe, None, 0),
            Err(DatapathError::InvalidArgument(_))
        ));
    }
    assert_eq!(CompletionQueue::create(1, None, 0).unwrap().capacity(), 1);
    assert_eq!(Device::socket().attr().max_cqe, MAX_CQE);
    assert_eq!(CompletionQueue::new().capacity(), datapath::DEFAULT_CQE);
}

/// A connection over the socket transport on loopback, the server with [`recvs`] posted (and
/// the region they point into).
fn establish_with_recvs(client: &Side, server: &Side) -> (Connection, Connection, MemoryRegion) {
    let p = params(MpaConfig::default());
    let listener = Listener::bind(any_port(), p.clone()).unwrap();
    let (inbox, recvs) = recvs(server);
    let plan = ServerPlan {
        side: server,
        private_data: &[],
        recvs,
    };
    let (c, s) = establish_ok(&listener, client, &p, plan);
    (c, s, inbox)
}

#[test]
fn socket_transport_overrun_fails_the_queue_pair() {
    let (client, server) = (Side::with_cqe(CQE), Side::new());
    let (c, s, _inbox) = establish_with_recvs(&client, &server);
    overrun_fails_the_queue_pair(&c, &client);
    assert!(s.qp.wait_finished(WAIT), "the peer's queue pair, reset");
    assert_eq!(s.qp.status().error, Some(QpError::PeerReset));
}

/// The peer's side of the engine tests: its queue pair ends, reset by the engine.
fn ended_by_reset(conn: &Connection) -> Result<(), String> {
    if !conn.qp.wait_finished(WAIT) {
        return Err("the peer's queue pair did not end".into());
    }
    match conn.qp.status().error {
        Some(QpError::PeerReset) => Ok(()),
        other => Err(format!("the peer's queue pair ended with {other:?}")),
    }
}

#[test]
fn engine_overrun_fails_the_queue_pair() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_678;
    let server = move |ready| {
        let req = bed::listen_in_b(PORT, &ready, WAIT)?;
        let side = Side::new();
        let (_inbox, recvs) = recvs(&side);
        let conn = req
            .accept_with_recvs(&side.pd, &side.cq, &[], recvs)
            .map_err(|e| format!("accept: {e}"))?;
        ended_by_reset(&conn)
    };
    bed::engine_against(server, move |engine| {
        let side = Side::with_cqe(CQE);
        let conn = engine
            .connect(
                SocketAddr::from((ADDR_B, PORT)),
                &side.pd,
                &side.cq,
                &bed::params(),
                &[],
            )
            .expect("connect");
        overrun_fails_the_queue_pair(&conn, &side);
    });
}

/// A post to a queue pair ended in Error whose flushed completion finds the queue full is
/// refused (`CompletionQueueFull`), nothing lost and the queue not overrun; once the queue is
/// polled the same post completes flushed.
#[test]
fn a_post_after_the_end_into_a_full_queue_is_refused() {
    let (client, server) = (Side::with_cqe(1), Side::new());
    let (c, s, _inbox) = establish_with_recvs(&client, &server);
    let src = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(send(&src, 1)).expect("a Send");
    let deadline = std::time::Instant::now() + WAIT;
    while client.cq.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the Send's completion"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    s.qp.abort();
    assert!(c.qp.wait_finished(WAIT));
    assert_eq!(c.qp.status().error, Some(QpError::PeerReset));
    match c.qp.post_send(send(&src, 2)) {
        Err(DatapathError::CompletionQueueFull) => {}
        other => panic!("a post into the full queue: {other:?}"),
    }
    assert!(!client.cq.is_overrun());
    let first = client.cq.try_next().expect("the Send's completion");
    assert_eq!((first.wc.wr_id, first.wc.status), (1, WcStatus::Success));
    c.qp.post_send(send(&src, 3)).expect("room again");
    let flushed = client.cq.try_next().expect("the flushed post");
    assert_eq!(
        (flushed.wc.wr_id, flushed.wc.status),
        (3, WcStatus::WrFlushError)
    );
}

/// The engine's overrun found on its receive path (a receive completion handed out as the
/// Send is placed, outside the connection's service): the connection is still reset and the
/// queue pair fails with `CqOverrun`. The engine posts 8 receives into a queue of 4 and an
/// unsignaled Send (the initiator sends first); the peer answers with 5 Sends.
#[test]
fn engine_overrun_on_the_receive_path_fails_the_queue_pair() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_679;
    let server = move |ready| {
        let req = bed::listen_in_b(PORT, &ready, WAIT)?;
        let side = Side::new();
        let (_inbox, recvs) = recvs(&side);
        let conn = req
            .accept_with_recvs(&side.pd, &side.cq, &[], recvs)
            .map_err(|e| format!("accept: {e}"))?;
        // The Responder holds its FPDUs until the Initiator's first arrives (RFC 5044 7.1.2
        // rule 4): the client's Send, then ours.
        match side.cq.wait(WAIT) {
            Some(c) if c.wc.status == WcStatus::Success => {}
            other => return Err(format!("the client's Send: {other:?}")),
        }
        let src = side
            .pd
            .register(64, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        for i in 0..=CQE as u64 {
            if let Err(e) = conn.qp.post_send(send(&src, i)) {
                return Err(format!("Send {i}: {e}"));
            }
        }
        ended_by_reset(&conn)
    };
    bed::engine_against(server, move |engine| {
        let side = Side::with_cqe(CQE);
        let (_inbox, recvs) = recvs(&side);
        let channel = AsyncEventChannel::new().unwrap();
        side.cq.notify_async(&channel, 5);
        let conn = engine
            .connect_with_recvs(
                SocketAddr::from((ADDR_B, PORT)),
                &side.pd,
                &side.cq,
                &bed::params(),
                &[],
                recvs,
            )
            .expect("connect");
        conn.qp.notify_async(&channel, 6);
        // Unsignaled: the queue is for the receives.
        let src = side.pd.register(64, Access::LOCAL_WRITE).unwrap();
        let first = SendWr {
            signaled: false,
            ..send(&src, 100)
        };
        conn.qp.post_send(first).expect("the first Send");
        assert!(
            conn.qp.wait_finished(WAIT),
            "the engine's queue pair ends: overrun {}, len {}, {:?}",
            side.cq.is_overrun(),
            side.cq.len(),
            conn.qp.status()
        );
        assert_eq!(conn.qp.status().error, Some(QpError::CqOverrun));
        assert_eq!(
            channel.wait_event(WAIT),
            Some(AsyncEvent::CqError { context: 5 })
        );
        match channel.wait_event(WAIT) {
            Some(AsyncEvent::QpFatal {
                context: 6,
                error: QpError::CqOverrun,
                ..
            }) => {}
            other => panic!("QpFatal: {other:?}"),
        }
        let mut got = Vec::new();
        assert_eq!(side.cq.poll(&mut got, 2 * CQE), CQE);
        for (i, c) in got.iter().enumerate() {
            assert_eq!((c.wc.wr_id, c.wc.status), (i as u64, WcStatus::Success));
        }
    });
}
