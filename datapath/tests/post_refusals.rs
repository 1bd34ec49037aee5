//! Work requests wrong by themselves fail the post at once, as verbs' `ibv_post_send` and
//! `ibv_post_recv` fail with `EINVAL`, and queue nothing: `DatapathError::InvalidWorkRequest`
//! naming the RDMAP check (an extension's opcode without the RFC 7306 extensions, a Read with
//! two sink elements, an inline Read, an Atomic whose sink is not one 64-bit word, Immediate
//! Data with a payload, a receive on a queue pair fed by a shared receive queue). The socket
//! transport on loopback; the AF_XDP engine on the veth bed (root, `SKIPPED` without, a failure
//! under `CI=true`): the handle learns the queue pair's settings from either transport, and
//! reports them (`QueuePair::attr`, verbs' `ibv_query_qp`).

mod common;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use common::{bed, establish_ok, params as loopback_params, ServerPlan, Side, WAIT};
use datapath::{
    Access, AtomicOp, CompletionQueue, ConnectParams, DatapathError, InlineData, InlineSendWr,
    Listener, MemoryRegion, MpaConfig, QpAttr, QpState, QueuePair, RdmapError, RecvWr, SendOp,
    SendWr, SgeList, SharedReceiveQueue, Stag, WcStatus, MAX_INLINE_DATA, MAX_SGE,
};
use testbed::{bed_or_skip, ADDR_A, ADDR_B};

/// A signaled request of `op` over `sg_list`.
fn wr(op: SendOp, sg_list: SgeList) -> SendWr {
    SendWr {
        wr_id: 9,
        op,
        sg_list,
        signaled: true,
        fence: false,
    }
}

fn read() -> SendOp {
    SendOp::Read {
        remote_stag: Stag(0x100),
        remote_to: 0,
    }
}

fn fetch_add() -> SendOp {
    SendOp::Atomic {
        remote_stag: Stag(0x100),
        remote_to: 0,
        op: AtomicOp::FetchAdd { add: 1, mask: 0 },
    }
}

/// `res` is the refusal `want`.
fn refused(res: Result<(), DatapathError>, want: RdmapError, what: &str) {
    match res {
        Err(DatapathError::InvalidWorkRequest(e)) if e == want => {}
        other => panic!("{what}: {other:?}, not the refusal {want:?}"),
    }
}

/// The refusals of a queue pair without the extensions, its receives from a shared receive
/// queue; nothing reaches the completion queue.
fn plain_refusals(qp: &QueuePair, cq: &CompletionQueue, sink: &MemoryRegion) {
    let two = SgeList::from_slice(&[sink.sge(0, 8), sink.sge(8, 8)]).expect("two elements");
    refused(
        qp.post_send(wr(read(), two)),
        RdmapError::ReadSinkNotContiguous,
        "a Read into two elements",
    );
    refused(
        qp.post_send(wr(fetch_add(), sink.sge(0, 8).into())),
        RdmapError::ExtensionsOff,
        "an Atomic without the extensions",
    );
    let inline_read = InlineSendWr {
        wr_id: 10,
        op: read(),
        data: InlineData::new(&[1, 2, 3]).expect("inline data"),
        signaled: true,
        fence: false,
    };
    refused(
        qp.post_send_inline(inline_read),
        RdmapError::NotInlinable,
        "an inline Read",
    );
    match qp.post_send_list([wr(read(), two)]) {
        Err(e) if e.posted == 0 => refused(
            Err(e.source),
            RdmapError::ReadSinkNotContiguous,
            "a list's Read into two elements",
        ),
        other => panic!("a list of one refused request: {other:?}"),
    }
    let recv = RecvWr {
        wr_id: 11,
        sg_list: sink.sge(0, 8).into(),
    };
    refused(
        qp.post_recv(recv),
        RdmapError::SrqAttached,
        "a receive on a queue pair fed by a shared receive queue",
    );
    let stray = cq.wait(Duration::from_millis(300));
    assert!(stray.is_none(), "a refused request completed: {stray:?}");
}

/// The refusals of a queue pair with the extensions on.
fn extension_refusals(qp: &QueuePair, cq: &CompletionQueue, sink: &MemoryRegion) {
    refused(
        qp.post_send(wr(fetch_add(), sink.sge(0, 4).into())),
        RdmapError::AtomicSink { len: 4 },
        "an Atomic into four octets",
    );
    let immediate = SendOp::Immediate {
        solicited: false,
        immediate: 7,
    };
    refused(
        qp.post_send(wr(immediate, sink.sge(0, 8).into())),
        RdmapError::ImmediatePayload { len: 8 },
        "Immediate Data with a payload",
    );
    let stray = cq.wait(Duration::from_millis(300));
    assert!(stray.is_none(), "a refused request completed: {stray:?}");
    // A list refused part way: the Send before the refused Read is posted and completes (the
    // peer has a receive posted for it), the Read and what follows are not.
    let send = SendWr {
        wr_id: 20,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sg_list: sink.sge(0, 16).into(),
        signaled: true,
        fence: false,
    };
    let two = SgeList::from_slice(&[sink.sge(0, 8), sink.sge(8, 8)]).expect("two elements");
    match qp.post_send_list([send, wr(read(), two), send]) {
        Err(e) if e.posted == 1 => refused(
            Err(e.source),
            RdmapError::ReadSinkNotContiguous,
            "the list's second request",
        ),
        other => panic!("a list refused at its second request: {other:?}"),
    }
    let c = cq.wait(WAIT).expect("the list's Send completes");
    assert_eq!((c.wc.wr_id, c.wc.status), (20, WcStatus::Success), "{c:?}");
    let stray = cq.wait(Duration::from_millis(300));
    assert!(stray.is_none(), "more of the list completed: {stray:?}");
}

/// A receive of `inbox` for the list's Send of [`extension_refusals`].
fn server_recv(inbox: &MemoryRegion) -> RecvWr {
    RecvWr {
        wr_id: 1,
        sg_list: inbox.sge(0, 64).into(),
    }
}

/// `qp`'s attributes are those `params` asked for (IRD and ORD as both ends offer them).
fn check_attr(qp: &QueuePair, params: &ConnectParams, extensions: bool) {
    let a = qp.attr();
    let want = QpAttr {
        state: QpState::Rts,
        sq_depth: params.sq_depth,
        rq_depth: if extensions { params.rq_depth } else { 0 },
        max_sge: MAX_SGE,
        max_inline_data: MAX_INLINE_DATA,
        ird: params.mpa.ird,
        ord: params.mpa.ord,
        mulpdu: a.mulpdu,
        srq: !extensions,
        extensions,
        local: qp.local_addr(),
        peer: qp.peer_addr(),
        tos: params.tos,
    };
    assert_ne!(a.local.port(), 0, "{a:?}");
    assert_eq!(a, want);
    assert!(a.mulpdu > 0 && a.mulpdu < 65536, "{a:?}");
}

/// Our end's parameters: a shared receive queue of `pd` and the extensions off, or no shared
/// receive queue, the extensions on and a Type of Service (DSCP AF11).
fn ours(base: ConnectParams, side: &Side, extensions: bool) -> ConnectParams {
    ConnectParams {
        srq: (!extensions).then(|| SharedReceiveQueue::new(&side.pd, 4).expect("srq")),
        rdmap_extensions: extensions,
        tos: if extensions { 0x28 } else { 0 },
        ..base
    }
}

fn sink(side: &Side) -> MemoryRegion {
    side.pd
        .register(64, Access::LOCAL_WRITE)
        .expect("a sink region")
}

#[test]
fn socket_requests_wrong_by_themselves_fail_the_post() {
    for extensions in [false, true] {
        let listener = Listener::bind(common::any_port(), loopback_params(MpaConfig::default()))
            .expect("listen");
        let (client, server) = (Side::new(), Side::new());
        let params = ours(loopback_params(MpaConfig::default()), &client, extensions);
        let inbox = server.pd.register(64, Access::LOCAL_WRITE).expect("inbox");
        let plan = ServerPlan {
            side: &server,
            private_data: &[],
            recvs: vec![server_recv(&inbox)],
        };
        let (c, s) = establish_ok(&listener, &client, &params, plan);
        let sink = sink(&client);
        check_attr(&c.qp, &params, extensions);
        // Each end's address is what the other sees (`rdma_get_local_addr`, `..._peer_addr`).
        assert_eq!(c.qp.local_addr(), s.qp.peer_addr());
        assert_eq!(s.qp.local_addr(), c.qp.peer_addr());
        if extensions {
            extension_refusals(&c.qp, &client.cq, &sink);
        } else {
            plain_refusals(&c.qp, &client.cq, &sink);
        }
    }
}

#[test]
fn engine_requests_wrong_by_themselves_fail_the_post() {
    let _bed = bed_or_skip!();
    for (port, extensions) in [(19_663u16, false), (19_664, true)] {
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let (seen_tx, seen_rx) = mpsc::channel();
        let server = move |ready| {
            let req = bed::listen_in_b(port, &ready, WAIT)?;
            let side = Side::new();
            let inbox = side
                .pd
                .register(64, Access::LOCAL_WRITE)
                .map_err(|e| e.to_string())?;
            let conn = req
                .accept_with_recvs(&side.pd, &side.cq, &[], vec![server_recv(&inbox)])
                .map_err(|e| e.to_string())?;
            let _ = seen_tx.send(conn.qp.peer_addr());
            let _ = done_rx.recv_timeout(WAIT);
            Ok(())
        };
        bed::engine_against(server, move |engine| {
            let side = Side::new();
            let params = ours(bed::params(), &side, extensions);
            let conn = engine
                .connect(
                    SocketAddr::from((ADDR_B, port)),
                    &side.pd,
                    &side.cq,
                    &params,
                    &[],
                )
                .expect("connect");
            let sink = sink(&side);
            check_attr(&conn.qp, &params, extensions);
            // The engine's address is what the kernel's end sees (`rdma_get_local_addr`).
            let seen = seen_rx.recv_timeout(WAIT).expect("the server's view");
            assert_eq!(conn.qp.local_addr(), seen);
            assert_eq!(seen.ip(), std::net::IpAddr::from(ADDR_A));
            if extensions {
                extension_refusals(&conn.qp, &side.cq, &sink);
            } else {
                plain_refusals(&conn.qp, &side.cq, &sink);
            }
            let _ = done_tx.send(());
        });
    }
}

/// A queue pair made without a receive queue (`rq_depth` 0) refuses a receive with
/// `EINVAL`, as siw does; `ENOMEM` (a full queue) would have a verbs program poll and post
/// again for ever.
#[test]
fn a_queue_pair_without_a_receive_queue_refuses_receives() {
    let listener =
        Listener::bind(common::any_port(), loopback_params(MpaConfig::default())).expect("listen");
    let (client, server) = (Side::new(), Side::new());
    let params = ConnectParams {
        rq_depth: 0,
        ..loopback_params(MpaConfig::default())
    };
    let (c, _s) = common::establish_plain(&listener, &client, &server, &params);
    let inbox = client.pd.register(64, Access::LOCAL_WRITE).expect("inbox");
    let err =
        c.qp.post_recv(server_recv(&inbox))
            .expect_err("a receive taken");
    assert!(matches!(err, DatapathError::InvalidArgument(_)), "{err:?}");
    assert_eq!(err.errno(), libc::EINVAL);
    let err =
        c.qp.post_recv_list([server_recv(&inbox)])
            .expect_err("a list of receives taken");
    assert_eq!(
        (err.posted, err.source.errno()),
        (0, libc::EINVAL),
        "{err:?}"
    );
    common::assert_no_more(&client.cq);
    // The same before a connection (`rdma_create_qp`, then `ibv_post_recv`).
    let idle = datapath::IdleQp::new(&client.pd, &client.cq, &params).expect("idle queue pair");
    let err = idle
        .post_recv(server_recv(&inbox))
        .expect_err("a receive taken");
    assert_eq!(err.errno(), libc::EINVAL, "{err:?}");
}
