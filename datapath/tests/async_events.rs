//! Asynchronous events ([`AsyncEventChannel`], verbs' `ibv_get_async_event`): a queue pair whose
//! connection fails reports `QpFatal` (the application's own abort does not), one fed by a
//! shared receive queue reports `QpLastWqeReached` when it ends however it ends, and a shared
//! receive queue reports `SrqLimitReached` when a take crosses its armed low watermark; the
//! channel's descriptor is readable while an event waits. The socket transport on loopback,
//! and the AF_XDP engine on the veth bed (root, `SKIPPED` without, a failure under `CI=true`)
//! against a socket-transport peer that resets.

mod common;

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

use common::{any_port, bed, establish_plain, params, Side, WAIT};
use datapath::{
    Access, AsyncEvent, AsyncEventChannel, CmEvent, CmEventChannel, ConnectParams, Device,
    Listener, MpaConfig, QpError, RecvWr, SendOp, SendWr, SharedReceiveQueue, Transport,
};
use testbed::{bed_or_skip, ADDR_A, ADDR_B, DEV_A};

/// No event arrives within a short while.
fn quiet(channel: &AsyncEventChannel, what: &str) {
    if let Some(e) = channel.wait_event(Duration::from_millis(200)) {
        panic!("{what}: an event: {e:?}");
    }
}

/// True when `fd` is readable now.
fn readable(fd: i32) -> bool {
    readable_within(fd, 0)
}

/// Whether `fd` becomes readable within `ms` milliseconds (without taking anything).
fn readable_within(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// The client's queue pair fails (the server resets): `QpFatal` with its number, context and
/// cause, the descriptor readable until it is taken. The server, which aborted, reports nothing.
#[test]
fn a_failed_connection_reports_qp_fatal_an_abort_does_not() {
    let p = params(MpaConfig::default());
    let listener = Listener::bind(any_port(), p.clone()).unwrap();
    let (client, server) = (Side::new(), Side::new());
    let (c, s) = establish_plain(&listener, &client, &server, &p);
    let (ours, theirs) = (
        AsyncEventChannel::new().unwrap(),
        AsyncEventChannel::new().unwrap(),
    );
    c.qp.notify_async(&ours, 7);
    s.qp.notify_async(&theirs, 8);
    assert!(!readable(ours.as_raw_fd()));
    s.qp.abort();
    assert!(c.qp.wait_finished(WAIT));
    // The queue pair is marked finished before its end is reported: the event may come a
    // moment after.
    assert!(
        readable_within(ours.as_raw_fd(), WAIT.as_millis() as i32),
        "the descriptor once an event waits"
    );
    match ours.wait_event(WAIT) {
        Some(AsyncEvent::QpFatal {
            qp_num,
            context: 7,
            error: QpError::PeerReset,
        }) if qp_num == c.qp.num() => {}
        other => panic!("the reset queue pair: {other:?}"),
    }
    assert!(!readable(ours.as_raw_fd()), "the descriptor once taken");
    quiet(&ours, "after QpFatal");
    quiet(&theirs, "the queue pair that aborted");
}

/// A graceful close reports nothing; a queue pair that already ended reports at once, once.
#[test]
fn a_graceful_close_reports_nothing_an_ended_qp_at_once() {
    let p = params(MpaConfig::default());
    let listener = Listener::bind(any_port(), p.clone()).unwrap();
    let (client, server) = (Side::new(), Side::new());
    let (c, s) = establish_plain(&listener, &client, &server, &p);
    let channel = AsyncEventChannel::new().unwrap();
    c.qp.notify_async(&channel, 1);
    s.qp.notify_async(&channel, 2);
    c.qp.disconnect();
    assert!(c.qp.wait_finished(WAIT) && s.qp.wait_finished(WAIT));
    quiet(&channel, "a graceful close");

    // Another pair, the server reset; the client asks only once it has ended.
    let (client, server) = (Side::new(), Side::new());
    let (c, s) = establish_plain(&listener, &client, &server, &p);
    s.qp.abort();
    assert!(c.qp.wait_finished(WAIT));
    c.qp.notify_async(&channel, 3);
    match channel.get_event() {
        Some(AsyncEvent::QpFatal { context: 3, .. }) => {}
        other => panic!("an ended queue pair: {other:?}"),
    }
    c.qp.notify_async(&channel, 4);
    quiet(&channel, "an end reported already");
}

/// A shared receive queue's low watermark, and its queue pair's last-WQE event: the server's
/// queue pair takes its receives from an SRQ armed at 2 with 3 posted; the client's second Send
/// leaves 1, which fires `SrqLimitReached` once; the client's graceful close ends the server's
/// queue pair, which reports `QpLastWqeReached` (and no `QpFatal`).
#[test]
fn srq_limit_and_last_wqe_reached() {
    let server = Side::new();
    let srq = SharedReceiveQueue::new(&server.pd, 8).unwrap();
    let inbox = server.pd.register(3 * 64, Access::LOCAL_WRITE).unwrap();
    for i in 0..3u64 {
        srq.post_recv(RecvWr {
            wr_id: i,
            sg_list: inbox.sge(i as usize * 64, 64).into(),
        })
        .unwrap();
    }
    let channel = AsyncEventChannel::new().unwrap();
    srq.notify_limit(&channel, 40);
    srq.arm_limit(2).expect("arm the limit");
    let p = params(MpaConfig::default());
    let with_srq = ConnectParams {
        srq: Some(srq.clone()),
        ..p.clone()
    };
    let listener = Listener::bind(any_port(), with_srq).unwrap();
    let client = Side::new();
    let (c, s) = establish_plain(&listener, &client, &server, &p);
    s.qp.notify_async(&channel, 41);
    let src = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    for i in 0..2 {
        c.qp.post_send(SendWr {
            wr_id: i,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sg_list: src.sge(0, 64).into(),
            signaled: true,
            fence: false,
        })
        .unwrap();
    }
    common::collect(&server.cq, 2, "the server's receives");
    assert_eq!(
        channel.wait_event(WAIT),
        Some(AsyncEvent::SrqLimitReached { context: 40 })
    );
    // Not in the SRQ's own queue as well: left there untaken, a later arming's
    // `wait_limit_event` took it for its own.
    assert!(!srq.try_limit_event(), "the event went to the channel only");
    quiet(&channel, "one event per arming");
    c.qp.disconnect();
    assert!(s.qp.wait_finished(WAIT));
    match channel.wait_event(WAIT) {
        Some(AsyncEvent::QpLastWqeReached {
            qp_num,
            context: 41,
        }) if qp_num == s.qp.num() => {}
        other => panic!("the SRQ queue pair's end: {other:?}"),
    }
    quiet(&channel, "a graceful end: no QpFatal");
}

/// The engine's queue pair whose peer resets: `QpFatal`.
#[test]
fn engine_qp_reset_by_its_peer_reports_qp_fatal() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_676;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let server = move |ready| {
        let req = bed::listen_in_b(PORT, &ready, WAIT)?;
        let side = Side::new();
        let conn = req
            .accept(&side.pd, &side.cq, &[])
            .map_err(|e| format!("accept: {e}"))?;
        // Reset once the client is listening for events.
        let _ = done_rx.recv_timeout(WAIT);
        conn.qp.abort();
        Ok(())
    };
    bed::engine_against(server, move |engine| {
        let side = Side::new();
        let conn = engine
            .connect(
                SocketAddr::from((ADDR_B, PORT)),
                &side.pd,
                &side.cq,
                &bed::params(),
                &[],
            )
            .expect("connect");
        let channel = AsyncEventChannel::new().unwrap();
        conn.qp.notify_async(&channel, 9);
        let _ = done_tx.send(());
        match channel.wait_event(WAIT) {
            Some(AsyncEvent::QpFatal {
                qp_num,
                context: 9,
                error: QpError::PeerReset,
            }) if qp_num == conn.qp.num() => {}
            other => panic!("the engine's reset queue pair: {other:?}"),
        }
    });
}

/// The engine fails (an injected panic in its threads): the device reports `DeviceFatal` once,
/// and its queue pair `QpFatal` (`EngineFailed`). An engine stopped normally reports nothing,
/// for itself or its queue pair (`EngineStopped` is the application's doing: its
/// `Disconnected` alone says it), and its queue pair's status names the stop.
#[test]
fn engine_failure_reports_device_fatal_a_stop_does_not() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_677;
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let peer = testbed::spawn_in_ns(testbed::NS_B, move || -> Result<(), String> {
        // Once to the engine stopped normally, once to the one that fails.
        for _ in 0..2 {
            ready_rx.recv_timeout(WAIT).map_err(|_| "no listener")?;
            let side = Side::new();
            let conn = datapath::connect(
                SocketAddr::from((ADDR_A, PORT)),
                &side.pd,
                &side.cq,
                &bed::params(),
                &[],
            )
            .map_err(|e| format!("connect: {e}"))?;
            let _ = done_rx.recv_timeout(WAIT);
            drop(conn);
        }
        Ok(())
    });
    testbed::in_ns(testbed::NS_A, move || {
        let accept_one = |device: &Device| {
            let listener = device
                .listen(SocketAddr::from((ADDR_A, PORT)), bed::params())
                .expect("listen");
            let _ = ready_tx.send(());
            let req = listener
                .accept_timeout(WAIT)
                .expect("accept")
                .expect("a connection request");
            let side = Side::new();
            let conn = req.accept(&side.pd, &side.cq, &[]).expect("accept");
            (side, conn)
        };
        let quiet_device = Device::open(Transport::Xdp {
            ifname: DEV_A.into(),
            config: Box::default(),
        })
        .expect("engine");
        let channel = AsyncEventChannel::new().unwrap();
        quiet_device.notify_async(&channel);
        let (_side, conn) = accept_one(&quiet_device);
        conn.qp.notify_async(&channel, 4);
        let _ = quiet_device.close();
        assert!(conn.qp.wait_finished(WAIT));
        quiet(&channel, "an engine stopped normally, with its queue pair");
        // Its status says what ended it (it was the same as after its own disconnect).
        assert_eq!(conn.qp.status().error, Some(QpError::EngineStopped));
        let _ = done_tx.send(());
        drop(conn);

        let device = Device::open(Transport::Xdp {
            ifname: DEV_A.into(),
            config: Box::default(),
        })
        .expect("engine");
        device.notify_async(&channel);
        let (_side, conn) = accept_one(&device);
        conn.qp.notify_async(&channel, 5);
        device.engine().expect("the engine").inject_panic();
        // Every shard fails; the device's event may come before or after the queue pair's
        // (another shard may fail first).
        let (mut fatal, mut device_fatal) = (0, 0);
        for _ in 0..2 {
            match channel.wait_event(WAIT) {
                Some(AsyncEvent::QpFatal {
                    context: 5,
                    error: QpError::EngineFailed,
                    ..
                }) => fatal += 1,
                Some(AsyncEvent::DeviceFatal) => device_fatal += 1,
                other => panic!("the events of a failed engine: {other:?}"),
            }
        }
        assert_eq!((fatal, device_fatal), (1, 1));
        quiet(&channel, "one DeviceFatal");
        let _ = done_tx.send(());
    });
    peer.join().expect("peer thread").expect("peer");
}

/// A notifying listener of an engine that fails queues `ListenError` on its channel, naming
/// the listener (its id, and its context, which two listeners here share); a listener
/// dropped with its error still queued takes it back.
#[test]
fn a_failed_engine_ends_its_notifying_listeners_with_listen_error() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_681;
    testbed::in_ns(testbed::NS_A, || {
        let device = Device::open(Transport::Xdp {
            ifname: DEV_A.into(),
            config: Box::default(),
        })
        .expect("engine");
        let channel = CmEventChannel::new().unwrap();
        let listen = |port: u16| {
            device
                .listen(SocketAddr::from((ADDR_A, port)), bed::params())
                .expect("listen")
                .notify_with_context(&channel, 3)
                .expect("notify")
        };
        let mut listeners = vec![listen(PORT), listen(PORT + 1)];
        device.engine().expect("the engine").inject_panic();
        let first = match channel.wait_event(WAIT) {
            Some(CmEvent::ListenError {
                context: 3,
                listener,
                error,
            }) => {
                eprintln!("ListenError: {error}");
                listener
            }
            other => panic!("the failed engine's listener: {other:?}"),
        };
        let i = listeners
            .iter()
            .position(|l| l.id() == first)
            .expect("the error names one of the listeners");
        let taken = listeners.swap_remove(i);
        // The other one's error, queued (its thread looks at its requests every 100 ms).
        let wait_ms = WAIT.as_millis() as i32;
        assert!(
            readable_within(channel.as_raw_fd(), wait_ms),
            "the second listener's error"
        );
        drop(listeners);
        assert!(
            channel.get_event().is_none(),
            "a dropped listener's error stayed queued"
        );
        drop(taken);
    });
}
