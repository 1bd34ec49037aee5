//! A queue pair with a completion queue of its own for receives (`ConnectParams::recv_cq`,
//! `ConnectRequest::use_recv_cq`; verbs' `ibv_qp_init_attr.recv_cq` beside `send_cq`): receive
//! completions, flushed ones included, go to it and nowhere else, send completions to the
//! queue given to the connect or accept; an armed receive queue's channel fires for a received
//! Send. The socket transport on loopback; the AF_XDP engine on the veth bed (root, `SKIPPED`
//! without, a failure under `CI=true`), as initiator and as responder, where polling only the
//! receive completion queue drives the engine (inline progress).

mod common;

use std::net::SocketAddr;
use std::time::Instant;

use common::{bed, expect_wc, send_wr, stays_empty, write_wr, Side, WAIT};
use datapath::engine::XdpEngineConfig;
use datapath::{
    Access, CompletionChannel, CompletionQueue, ConnectParams, Listener, MemoryRegion, MpaConfig,
    QueuePair, RecvWr, SendOp, SendWr, SgeList, SharedReceiveQueue, WcOpcode, WcStatus,
};
use testbed::{bed_or_skip, enter_ns, ADDR_B, DEV_A, NS_A};

const LEN: usize = 64;

/// A receive of slot `i` (of four) of `mr`.
fn recv(mr: &MemoryRegion, i: u64) -> RecvWr {
    bed::slot_recv(mr, i, LEN)
}

/// One side: its send completion queue (`side.cq`), its receive completion queue with a
/// channel, and a region of four receive slots.
struct Ends {
    side: Side,
    recv_cq: CompletionQueue,
    channel: CompletionChannel,
    buf: MemoryRegion,
}

impl Ends {
    fn new() -> Ends {
        let side = Side::new();
        let channel = CompletionChannel::new().expect("channel");
        let recv_cq = CompletionQueue::with_channel(&channel);
        let buf = side
            .pd
            .register(LEN * 4, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .expect("region");
        Ends {
            side,
            recv_cq,
            channel,
            buf,
        }
    }

    fn params(&self, base: ConnectParams) -> ConnectParams {
        ConnectParams {
            recv_cq: Some(self.recv_cq.clone()),
            ..base
        }
    }
}

/// `from` sends a Send and an RDMA Write to `to`, which has receives posted: `from`'s two
/// send completions on its send queue and none on its receive queue; `to`'s receive completion
/// on its receive queue, whose armed channel fires for it, and none on its send queue.
fn exchange(from: &QueuePair, f: &Ends, to: &Ends, what: &str) {
    to.recv_cq.req_notify(false).expect("arm");
    let src = f.side.pd.register(LEN, Access::LOCAL_WRITE).expect("src");
    src.write(0, &[0x3c; LEN]);
    from.post_send(send_wr(1, &src, LEN)).expect("send");
    from.post_send(write_wr(
        2,
        &src,
        LEN,
        to.buf.stag(),
        to.buf.base_to() + 3 * LEN as u64,
    ))
    .expect("write");
    expect_wc(&f.side.cq, 1, WcOpcode::Send, WcStatus::Success);
    expect_wc(&f.side.cq, 2, WcOpcode::Write, WcStatus::Success);
    let fired = to
        .channel
        .wait_event(WAIT)
        .expect("the receive queue's event");
    assert!(
        fired.same_queue(&to.recv_cq),
        "{what}: the event names the receive queue"
    );
    let c = expect_wc(&to.recv_cq, 0, WcOpcode::Recv, WcStatus::Success);
    assert_eq!(c.wc.byte_len, LEN as u32, "{what}: {c:?}");
    stays_empty(&to.side.cq, &format!("{what}: the receiver's send queue"));
    stays_empty(
        &f.recv_cq,
        &format!("{what}: the sender's receive queue ({:?})", from.status()),
    );
}

#[test]
fn socket_receive_completions_go_to_the_receive_completion_queue() {
    let (client, server) = (Ends::new(), Ends::new());
    let listener =
        Listener::bind(common::any_port(), common::params(MpaConfig::default())).expect("listen");
    let addr = listener.local_addr().expect("address");
    let (c, s) = std::thread::scope(|scope| {
        let accepting = scope.spawn(|| {
            let req = listener
                .accept_timeout(WAIT)
                .expect("accept")
                .expect("a request");
            let recvs = (0..2).map(|i| recv(&server.buf, i)).collect();
            req.use_recv_cq(&server.recv_cq)
                .accept_with_recvs(&server.side.pd, &server.side.cq, &[], recvs)
                .expect("accept")
        });
        let params = client.params(common::params(MpaConfig::default()));
        let c = datapath::connect(addr, &client.side.pd, &client.side.cq, &params, &[])
            .expect("connect");
        (c, accepting.join().expect("accepting thread"))
    });
    c.qp.post_recv(recv(&client.buf, 0))
        .expect("client receive");
    exchange(&c.qp, &client, &server, "client to server");
    exchange(&s.qp, &server, &client, "server to client");
    // The server's second receive, never used, is flushed when the connection ends: onto its
    // receive queue.
    c.qp.disconnect();
    s.qp.disconnect();
    expect_wc(&server.recv_cq, 1, WcOpcode::Recv, WcStatus::WrFlushError);
    stays_empty(&server.side.cq, "the server's send queue after the flush");
}

/// Receives taken from a shared receive queue, and those that Immediate Data completes
/// (RFC 7306: a Write with Immediate Data, an Immediate Data message), complete on the queue
/// pair's receive completion queue too.
#[test]
fn socket_srq_and_immediate_receives_go_to_the_receive_completion_queue() {
    let (client, server) = (Ends::new(), Ends::new());
    let extended = ConnectParams {
        rdmap_extensions: true,
        ..common::params(MpaConfig::default())
    };
    let listener = Listener::bind(common::any_port(), extended.clone()).expect("listen");
    let addr = listener.local_addr().expect("address");
    let srq = SharedReceiveQueue::new(&server.side.pd, 8).expect("srq");
    for i in 0..3 {
        srq.post_recv(recv(&server.buf, i)).expect("srq receive");
    }
    let (c, _s) = std::thread::scope(|scope| {
        let accepting = scope.spawn(|| {
            let req = listener
                .accept_timeout(WAIT)
                .expect("accept")
                .expect("a request");
            req.use_srq(&srq)
                .use_recv_cq(&server.recv_cq)
                .accept(&server.side.pd, &server.side.cq, &[])
                .expect("accept")
        });
        let params = client.params(extended.clone());
        let c = datapath::connect(addr, &client.side.pd, &client.side.cq, &params, &[])
            .expect("connect");
        (c, accepting.join().expect("accepting thread"))
    });
    let src = client
        .side
        .pd
        .register(LEN, Access::LOCAL_WRITE)
        .expect("src");
    let ops = [
        SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        SendOp::WriteImmediate {
            remote_stag: server.buf.stag(),
            remote_to: server.buf.base_to() + 3 * LEN as u64,
            solicited: false,
            immediate: 7,
        },
        SendOp::Immediate {
            solicited: false,
            immediate: 8,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let sg_list = match op {
            SendOp::Immediate { .. } => SgeList::new(),
            _ => src.sge(0, LEN as u32).into(),
        };
        c.qp.post_send(SendWr {
            wr_id: 10 + i as u64,
            op,
            sg_list,
            signaled: true,
            fence: false,
        })
        .expect("post");
    }
    for (i, opcode) in [WcOpcode::Send, WcOpcode::Write, WcOpcode::Immediate]
        .into_iter()
        .enumerate()
    {
        expect_wc(&client.side.cq, 10 + i as u64, opcode, WcStatus::Success);
    }
    for (wr_id, opcode) in [
        (0, WcOpcode::Recv),
        (1, WcOpcode::RecvImmediate),
        (2, WcOpcode::RecvImmediate),
    ] {
        expect_wc(&server.recv_cq, wr_id, opcode, WcStatus::Success);
    }
    stays_empty(&server.side.cq, "the server's send queue");
    stays_empty(&client.recv_cq, "the client's receive queue");
}

/// Rounds the engine client runs against the echo server.
const ROUNDS: u64 = 50;

/// An engine client whose receive completion queue is its own, polled alone (`try_next`):
/// every echo's receive completion is there, every Send's on the send queue, and the
/// application's polls of the receive queue ran the engine's turns.
#[test]
fn engine_receive_completion_queue_drives_the_engine() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_666;
    let server = |ready| {
        let echoed = bed::echo_rounds(PORT, &ready, ROUNDS, LEN, WAIT, |_| Ok(()))?;
        let _ = echoed.qp.wait_finished(WAIT);
        echoed.qp.disconnect();
        Ok(())
    };
    let client = || -> Result<u64, String> {
        enter_ns(NS_A).map_err(|e| e.to_string())?;
        let cfg = XdpEngineConfig {
            // One engine thread (as xdp_engine_inline): the turns counted are its.
            shard_per_queue: false,
            ..XdpEngineConfig::default()
        };
        let mut engine = datapath::engine::XdpEngine::start(DEV_A, cfg)
            .map_err(|e| format!("engine on {DEV_A}: {e}"))?;
        let ends = Ends::new();
        let params = ends.params(bed::params());
        let recvs = (0..4).map(|i| recv(&ends.buf, i)).collect();
        let conn = engine
            .connect_with_recvs(
                SocketAddr::from((ADDR_B, PORT)),
                &ends.side.pd,
                &ends.side.cq,
                &params,
                &[],
                recvs,
            )
            .map_err(|e| format!("connect: {e}"))?;
        let src = ends
            .side
            .pd
            .register(LEN, Access::LOCAL_WRITE)
            .expect("src");
        for i in 0..ROUNDS {
            conn.qp
                .post_send(bed::slot_send(&src, 0, LEN))
                .map_err(|e| format!("round {i}: send: {e}"))?;
            let start = Instant::now();
            let c = loop {
                if let Some(c) = ends.recv_cq.try_next() {
                    break c;
                }
                if start.elapsed() > WAIT {
                    return Err(format!("round {i}: no echo: {:?}", conn.qp.status()));
                }
                std::hint::spin_loop();
            };
            if (c.wc.opcode, c.wc.status, c.wc.wr_id) != (WcOpcode::Recv, WcStatus::Success, i) {
                return Err(format!("round {i}: on the receive queue: {c:?}"));
            }
            // Waiting hands the work back to the engine thread: no turn of the application's
            // but for the receive queue's polls.
            let c = ends
                .side
                .cq
                .wait(WAIT)
                .ok_or(format!("round {i}: no send completion"))?;
            if (c.wc.opcode, c.wc.status) != (WcOpcode::Send, WcStatus::Success) {
                return Err(format!("round {i}: on the send queue: {c:?}"));
            }
            conn.qp
                .post_recv(recv(&ends.buf, i + 4))
                .map_err(|e| format!("round {i}: repost: {e}"))?;
        }
        let app_turns = engine.counters().app_turns;
        conn.qp.disconnect();
        engine.stop();
        Ok(app_turns)
    };
    let app_turns = bed::against(server, client, WAIT);
    assert!(
        app_turns > 0,
        "polling the receive completion queue ran no turn of the engine"
    );
}

/// The engine as responder (`use_recv_cq`) to a socket-transport client in `iwb`.
#[test]
fn engine_accept_with_a_receive_completion_queue() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_667;
    let engine = bed::start_engine(NS_A, DEV_A);
    let listener = bed::Stack::Engine(&engine).listen(PORT, bed::params());
    let (server, client) = (Ends::new(), Ends::new());
    let conns = std::thread::scope(|scope| {
        let connecting = scope.spawn(|| {
            let addr = SocketAddr::from((testbed::ADDR_A, PORT));
            let params = client.params(bed::params());
            bed::Stack::Socket.connect(addr, &client.side.pd, &client.side.cq, &params, &[])
        });
        let req = listener
            .accept_timeout(WAIT)
            .expect("accept")
            .expect("a request");
        let recvs = (0..2).map(|i| recv(&server.buf, i)).collect();
        let s = req
            .use_recv_cq(&server.recv_cq)
            .accept_with_recvs(&server.side.pd, &server.side.cq, &[], recvs)
            .expect("accept");
        let c = connecting
            .join()
            .expect("connecting thread")
            .expect("connect");
        (c, s)
    });
    let (c, s) = conns;
    c.qp.post_recv(recv(&client.buf, 0))
        .expect("client receive");
    exchange(&c.qp, &client, &server, "socket client to engine");
    exchange(&s.qp, &server, &client, "engine to socket client");
    c.qp.disconnect();
    s.qp.disconnect();
    expect_wc(&server.recv_cq, 1, WcOpcode::Recv, WcStatus::WrFlushError);
    stays_empty(&server.side.cq, "the engine's send queue after the flush");
}
