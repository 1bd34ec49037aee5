//! Connection management from an event loop (rdma_cm's event channel): a listener queues
//! connection requests, `Device::connect_async` queues the outcome of an attempt
//! (established, rejected, failed), and a queue pair queues its disconnection; both sides wait
//! in epoll on the channels' descriptors. Socket transport on loopback.

use std::os::fd::AsRawFd;
use std::time::Duration;

use datapath::{
    Access, CmEvent, CmEventChannel, CompletionQueue, ConnectParams, DatapathError, Device, IdleQp,
    Listener, ProtectionDomain, QpError, RecvWr, WcStatus,
};

const WAIT: Duration = Duration::from_secs(20);

/// True if `fd` becomes readable within `timeout` (epoll).
fn readable(fd: i32, timeout: Duration) -> bool {
    // SAFETY: epoll calls on a descriptor the test owns and one it creates and closes; the
    // event structures live on the stack.
    unsafe {
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        assert!(ep >= 0);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev), 0);
        let n = libc::epoll_wait(ep, &mut ev, 1, timeout.as_millis() as i32);
        libc::close(ep);
        n == 1
    }
}

/// The next event, after epoll says the channel is readable.
fn next(ch: &CmEventChannel, what: &str) -> CmEvent {
    assert!(readable(ch.as_raw_fd(), WAIT), "no event: {what}");
    ch.get_event()
        .unwrap_or_else(|| panic!("readable but no event: {what}"))
}

fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(5),
        ..ConnectParams::default()
    }
}

/// A socket-transport server listening on `bind` (port 0) with its requests on a channel,
/// and a client's channel: (device, server channel, client channel, listening address, the
/// notifying listener to keep).
fn listening_on(
    bind: &str,
) -> (
    Device,
    CmEventChannel,
    CmEventChannel,
    std::net::SocketAddr,
    datapath::NotifyingListener,
) {
    let server_ch = CmEventChannel::new().unwrap();
    let client_ch = CmEventChannel::new().unwrap();
    let listener = Listener::bind(bind.parse().unwrap(), params()).unwrap();
    let addr = listener.local_addr().unwrap();
    let listening = listener.notify(&server_ch).unwrap();
    assert_eq!(
        listening.local_addr(),
        addr,
        "the notifying listener's address"
    );
    (Device::socket(), server_ch, client_ch, addr, listening)
}

#[test]
fn connect_accept_reject_and_disconnect_as_events() {
    let (device, server_ch, client_ch, addr, _listening) = listening_on("127.0.0.1:0");
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    assert!(server_ch.get_event().is_none());

    // Accepted.
    device
        .connect_async(addr, &pd, &cq, &params(), b"first", &client_ch, 7)
        .unwrap();
    let CmEvent::ConnectRequest(req) = next(&server_ch, "first request") else {
        panic!("not a connect request");
    };
    assert_eq!(req.private_data(), b"first");
    let (spd, scq) = (ProtectionDomain::new(), CompletionQueue::new());
    let server_conn = req.accept(&spd, &scq, b"welcome").unwrap();
    server_conn.qp.notify_disconnect(&server_ch);
    let CmEvent::Established {
        context: 7,
        connection,
    } = next(&client_ch, "established")
    else {
        panic!("not established");
    };
    assert_eq!(connection.private_data, b"welcome");

    // Rejected, with private data.
    device
        .connect_async(addr, &pd, &cq, &params(), b"second", &client_ch, 8)
        .unwrap();
    let CmEvent::ConnectRequest(req) = next(&server_ch, "second request") else {
        panic!("not a connect request");
    };
    req.reject(b"not you").unwrap();
    match next(&client_ch, "rejected") {
        CmEvent::Rejected {
            context: 8,
            private_data,
            peer_params,
        } => {
            assert_eq!(private_data, b"not you");
            // RFC 6581 9.1: the Reject's IRD and ORD (MPA revision 2 by default).
            let block = peer_params.expect("the Reject's RFC 6581 block");
            assert_eq!((block.ird, block.ord), (params().mpa.ird, params().mpa.ord));
        }
        other => panic!("{other:?}"),
    }

    // The client closes: the server's queue pair reports it.
    let server_qp = server_conn.qp.num();
    let client_qp = connection.qp.num();
    drop(connection);
    // Our own close, reported on the channel the attempt used, with no error.
    match next(&client_ch, "our disconnection") {
        CmEvent::Disconnected { qp_num, error } => {
            assert_eq!((qp_num, error), (client_qp, None));
        }
        other => panic!("{other:?}"),
    }
    match next(&server_ch, "disconnected") {
        CmEvent::Disconnected { qp_num, error } => {
            assert_eq!(qp_num, server_qp);
            assert!(
                matches!(error, None | Some(QpError::PeerClosed | QpError::PeerReset)),
                "{error:?}"
            );
        }
        other => panic!("{other:?}"),
    }

    // Nobody listens: a connection error.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    device
        .connect_async(closed, &pd, &cq, &params(), b"", &client_ch, 9)
        .unwrap();
    match next(&client_ch, "connect error") {
        CmEvent::ConnectError {
            context: 9,
            error: DatapathError::Io(e),
        } => {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
            assert_eq!(DatapathError::Io(e).errno(), libc::ECONNREFUSED);
        }
        other => panic!("{other:?}"),
    }
    assert!(client_ch.get_event().is_none());
}

/// A SYN nobody answers (a listener whose accept queue is full drops it) ends the connect at
/// `setup_timeout` with a timeout, `ETIMEDOUT` as on the AF_XDP engine (rdma_cm's
/// `RDMA_CM_EVENT_UNREACHABLE`); it was an `Io` error of no errno (`EIO`).
#[test]
fn a_connect_nobody_answers_times_out_with_etimedout() {
    use socket2::{Domain, Socket, Type};
    let full = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    full.bind(
        &"127.0.0.1:0"
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )
    .unwrap();
    full.listen(0).unwrap();
    let addr = full.local_addr().unwrap().as_socket().unwrap();
    // One connection fills an accept queue of backlog 0; later SYNs are dropped.
    let _filler = std::net::TcpStream::connect_timeout(&addr, WAIT).unwrap();
    let device = Device::socket();
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let ch = CmEventChannel::new().unwrap();
    let quick = ConnectParams {
        setup_timeout: Duration::from_millis(300),
        ..params()
    };
    device
        .connect_async(addr, &pd, &cq, &quick, b"", &ch, 5)
        .unwrap();
    match next(&ch, "connect error") {
        CmEvent::ConnectError { context: 5, error } => {
            assert!(matches!(error, DatapathError::Timeout(_)), "{error:?}");
            assert_eq!(error.errno(), libc::ETIMEDOUT);
        }
        other => panic!("{other:?}"),
    }
}

/// Two listeners on one event channel (rdma_cm's `listen_id`): each request says which
/// listener it came to by the context that listener was given; a plain `notify` gives 0.
#[test]
fn requests_of_two_listeners_on_one_channel_name_their_listener() {
    let device = Device::socket();
    let server_ch = CmEventChannel::new().unwrap();
    let client_ch = CmEventChannel::new().unwrap();
    let (a, b, c) = (
        Listener::bind("127.0.0.1:0".parse().unwrap(), params()).unwrap(),
        Listener::bind("127.0.0.1:0".parse().unwrap(), params()).unwrap(),
        Listener::bind("127.0.0.1:0".parse().unwrap(), params()).unwrap(),
    );
    let addrs = [
        a.local_addr().unwrap(),
        b.local_addr().unwrap(),
        c.local_addr().unwrap(),
    ];
    let _a = a.notify_with_context(&server_ch, 0xa).unwrap();
    let _b = b.notify_with_context(&server_ch, 0xb).unwrap();
    let _c = c.notify(&server_ch).unwrap();
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    for (addr, want) in addrs.into_iter().zip([0xa, 0xb, 0]) {
        device
            .connect_async(addr, &pd, &cq, &params(), b"", &client_ch, want)
            .unwrap();
        let CmEvent::ConnectRequest(req) = next(&server_ch, "a request") else {
            panic!("not a connect request");
        };
        assert_eq!(req.listen_context(), want, "the request to {addr}");
        req.reject(b"").unwrap();
        assert!(matches!(
            next(&client_ch, "rejected"),
            CmEvent::Rejected { context, .. } if context == want
        ));
    }
}

/// `ConnectAttempt::cancel` (rdma_destroy_id on an id still connecting): cancelled before its
/// outcome, no event of the attempt is ever queued and the connection the peer accepted is
/// reset; once the outcome is queued, cancel says so and the event stays.
#[test]
fn a_cancelled_connect_attempt_queues_nothing_and_resets_what_it_made() {
    let device = Device::socket();
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), params()).unwrap();
    let addr = listener.local_addr().unwrap();
    let client_ch = CmEventChannel::new().unwrap();
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());

    // Cancelled while the peer has not answered yet.
    let attempt = device
        .connect_async(addr, &pd, &cq, &params(), b"", &client_ch, 1)
        .unwrap();
    assert!(attempt.cancel(), "cancelled before its outcome");
    assert!(attempt.cancel(), "cancelled twice");
    let req = listener
        .accept_timeout(WAIT)
        .unwrap()
        .expect("the attempt's request");
    let (spd, scq) = (ProtectionDomain::new(), CompletionQueue::new());
    // The client resets the connection as soon as the Reply makes it: the accept may already
    // find it gone.
    if let Ok(server) = req.accept(&spd, &scq, b"") {
        let deadline = std::time::Instant::now() + WAIT;
        while !server.qp.status().finished && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let st = server.qp.status();
        assert!(
            st.finished,
            "the cancelled attempt's connection lives on: {st:?}"
        );
        assert!(
            matches!(st.error, Some(QpError::PeerReset | QpError::PeerClosed)),
            "{st:?}"
        );
    }
    assert!(
        client_ch.wait_event(Duration::from_millis(300)).is_none(),
        "a cancelled attempt queued an event"
    );

    // Cancelled after its outcome was queued: too late, the event stays.
    let attempt = device
        .connect_async(addr, &pd, &cq, &params(), b"", &client_ch, 2)
        .unwrap();
    let req = listener
        .accept_timeout(WAIT)
        .unwrap()
        .expect("the attempt's request");
    let _server = req.accept(&spd, &scq, b"").unwrap();
    assert!(readable(client_ch.as_raw_fd(), WAIT), "no outcome");
    assert!(!attempt.cancel(), "cancelled after its outcome was queued");
    match client_ch.get_event() {
        Some(CmEvent::Established { context: 2, .. }) => {}
        other => panic!("{other:?}"),
    }
}

/// `rdma_destroy_id` on a request's id while `accept_qp_async` accepts it: the accept's
/// `ConnectAttempt::cancel` says it was cancelled, no event of the accept is ever queued,
/// the connection it still made is reset (the active side, told it was accepted, sees it
/// end) and the queue pair's receive completes flushed. (The accept runs on a thread of its
/// own and may queue its outcome before the cancel: then the cancel says so, and the test
/// tries again.)
#[test]
fn a_cancelled_accept_queues_nothing_and_resets_what_it_made() {
    for _ in 0..20 {
        let (device, server_ch, client_ch, addr, _listening) = listening_on("127.0.0.1:0");
        let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
        device
            .connect_async(addr, &pd, &cq, &params(), b"", &client_ch, 7)
            .unwrap();
        let CmEvent::ConnectRequest(req) = next(&server_ch, "request") else {
            panic!("not a connect request");
        };
        let (spd, scq) = (ProtectionDomain::new(), CompletionQueue::new());
        let sink = spd.register(64, Access::LOCAL_WRITE).unwrap();
        let qp = IdleQp::new(&spd, &scq, &params()).unwrap();
        qp.post_recv(RecvWr {
            wr_id: 5,
            sg_list: sink.sge(0, 64).into(),
        })
        .unwrap();
        let accepting = req.accept_qp_async(qp, b"", &server_ch, 42).unwrap();
        if !accepting.cancel() {
            assert!(
                matches!(
                    next(&server_ch, "the accept's outcome"),
                    CmEvent::Established { context: 42, .. }
                ),
                "cancel said the outcome was queued"
            );
            continue;
        }
        let c = scq
            .wait(WAIT)
            .expect("the receive of the cancelled accept's queue pair");
        assert_eq!(
            (c.wc.wr_id, c.wc.status),
            (5, WcStatus::WrFlushError),
            "{c:?}"
        );
        assert!(
            server_ch.wait_event(Duration::from_millis(300)).is_none(),
            "a cancelled accept queued an event"
        );
        // The active side heard it accepted, then saw it end.
        match next(&client_ch, "the active side's outcome") {
            CmEvent::Established { connection, .. } => {
                assert!(connection.qp.wait_finished(WAIT), "it lives on");
                let st = connection.qp.status();
                assert!(
                    matches!(st.error, Some(QpError::PeerReset | QpError::PeerClosed)),
                    "{st:?}"
                );
            }
            CmEvent::ConnectError { .. } | CmEvent::Rejected { .. } => {}
            other => panic!("{other:?}"),
        }
        return;
    }
    panic!("no accept could be cancelled before its outcome in 20 tries");
}

/// The passive side on its event channel (`rdma_create_qp` on the request's id, then
/// `rdma_accept`, then `RDMA_CM_EVENT_ESTABLISHED`, as rping's server waits for it):
/// `accept_qp_async` queues `Established` with the queue pair created for the request; an
/// accept whose arguments are refused fails at once and rejects the request.
#[test]
fn an_accept_on_a_channel_queues_established_for_the_passive_side() {
    let (device, server_ch, client_ch, addr, _listening) = listening_on("127.0.0.1:0");
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let (spd, scq) = (ProtectionDomain::new(), CompletionQueue::new());

    device
        .connect_async(addr, &pd, &cq, &params(), b"", &client_ch, 7)
        .unwrap();
    let CmEvent::ConnectRequest(req) = next(&server_ch, "request") else {
        panic!("not a connect request");
    };
    assert_eq!(
        req.local_addr(),
        addr,
        "rdma_get_local_addr on the request's id"
    );
    let qp = IdleQp::new(&spd, &scq, &params()).unwrap();
    let num = qp.num();
    req.accept_qp_async(qp, b"welcome", &server_ch, 42).unwrap();
    // Both kept until the end: a dropped connection closes, and reports it on the channel.
    let _server_conn = match next(&server_ch, "the passive side's established") {
        CmEvent::Established {
            context: 42,
            connection,
        } => {
            assert_eq!(connection.qp.num(), num, "the queue pair created for it");
            connection
        }
        other => panic!("{other:?}"),
    };
    let _client_conn = match next(&client_ch, "the active side's established") {
        CmEvent::Established {
            context: 7,
            connection,
        } => {
            assert_eq!(connection.private_data, b"welcome");
            connection
        }
        other => panic!("{other:?}"),
    };

    // Refused at once: more private data than MPA carries (RFC 5044 7.1: 512 octets).
    device
        .connect_async(addr, &pd, &cq, &params(), b"", &client_ch, 8)
        .unwrap();
    let CmEvent::ConnectRequest(req) = next(&server_ch, "second request") else {
        panic!("not a connect request");
    };
    let qp = IdleQp::new(&spd, &scq, &params()).unwrap();
    assert!(req.accept_qp_async(qp, &[0; 600], &server_ch, 43).is_err());
    match next(&client_ch, "refused") {
        CmEvent::Rejected { context: 8, .. } => {}
        other => panic!("{other:?}"),
    }
    assert!(
        server_ch.get_event().is_none(),
        "no event of a refused accept"
    );
}

/// A request to a listener on the unspecified address names the specific address the peer
/// connected to (`rdma_get_local_addr` on the request's id), not the wildcard.
#[test]
fn a_request_to_a_wildcard_listener_names_the_address_connected_to() {
    let (device, server_ch, client_ch, wildcard, _listening) = listening_on("0.0.0.0:0");
    let port = wildcard.port();
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let to: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    device
        .connect_async(to, &pd, &cq, &params(), b"", &client_ch, 1)
        .unwrap();
    let CmEvent::ConnectRequest(req) = next(&server_ch, "request") else {
        panic!("not a connect request");
    };
    assert_eq!(req.local_addr(), to);
    req.reject(b"").unwrap();
}

/// No event within a short while.
fn quiet(ch: &CmEventChannel, what: &str) {
    if readable(ch.as_raw_fd(), Duration::from_millis(200)) {
        panic!("{what}: an event: {:?}", ch.get_event());
    }
}

/// A connection's end is reported once: `notify_disconnect` on a queue pair whose end
/// `connect_async`'s hook reported already queues nothing more (it queued a second
/// `Disconnected` when the end came before the call). `stop_notifications` before a queue
/// pair is dropped (`rdma_destroy_id`) keeps its end off the channel.
#[test]
fn an_end_is_reported_once_and_not_after_notifications_stop() {
    let (device, server_ch, client_ch, addr, _listening) = listening_on("127.0.0.1:0");
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let (spd, scq) = (ProtectionDomain::new(), CompletionQueue::new());
    let accept_one = || {
        device
            .connect_async(addr, &pd, &cq, &params(), b"", &client_ch, 7)
            .unwrap();
        let CmEvent::ConnectRequest(req) = next(&server_ch, "request") else {
            panic!("not a connect request");
        };
        let server_conn = req.accept(&spd, &scq, b"").unwrap();
        let CmEvent::Established { connection, .. } = next(&client_ch, "established") else {
            panic!("not established");
        };
        (server_conn, connection)
    };

    // The server closes at once; the client's end is reported by connect_async's hook.
    let (server_conn, client_conn) = accept_one();
    drop(server_conn);
    assert!(client_conn.qp.wait_finished(WAIT));
    match next(&client_ch, "the end") {
        CmEvent::Disconnected { qp_num, .. } => assert_eq!(qp_num, client_conn.qp.num()),
        other => panic!("{other:?}"),
    }
    client_conn.qp.notify_disconnect(&client_ch);
    quiet(&client_ch, "an end reported already");
    drop(client_conn);
    quiet(&client_ch, "a dropped queue pair whose end was reported");

    // Destroyed while running, notifications stopped first: nothing on either channel.
    let (server_conn, client_conn) = accept_one();
    server_conn.qp.notify_disconnect(&server_ch);
    client_conn.qp.stop_notifications();
    client_conn.qp.notify_disconnect(&client_ch);
    drop(client_conn);
    // The server's end follows the client's: once it is reported, the client's was due.
    match next(&server_ch, "the peer's end") {
        CmEvent::Disconnected { qp_num, .. } => assert_eq!(qp_num, server_conn.qp.num()),
        other => panic!("{other:?}"),
    }
    quiet(
        &client_ch,
        "a queue pair destroyed after stop_notifications",
    );
}

/// What a connect would only fail later (as an event, or once the peer accepted: the socket
/// transport attached a shared receive queue after the MPA exchange) is refused at the call,
/// as `rdma_connect` returns `EINVAL`: private data MPA cannot carry, a shared receive queue
/// of another protection domain. Nothing reaches the listener.
#[test]
fn a_connect_with_arguments_it_cannot_use_fails_at_the_call() {
    let (device, server_ch, client_ch, addr, _listening) = listening_on("127.0.0.1:0");
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let refused = device.connect_async(addr, &pd, &cq, &params(), &[0u8; 600], &client_ch, 1);
    assert!(
        matches!(refused, Err(DatapathError::Mpa(_))),
        "{:?}",
        refused.err()
    );
    let foreign = datapath::SharedReceiveQueue::new(&ProtectionDomain::new(), 4).unwrap();
    let with_srq = ConnectParams {
        srq: Some(foreign),
        ..params()
    };
    let refused = device.connect(addr, &pd, &cq, &with_srq, b"");
    assert!(
        matches!(refused, Err(DatapathError::InvalidArgument(_))),
        "{:?}",
        refused.err()
    );
    let refused = device.connect_async(addr, &pd, &cq, &with_srq, b"", &client_ch, 2);
    assert!(
        matches!(refused, Err(DatapathError::InvalidArgument(_))),
        "{:?}",
        refused.err()
    );
    quiet(&client_ch, "refused connects");
    quiet(&server_ch, "refused connects");
}

/// A raw peer that sent a valid MPA Request to `addr`, reading with a timeout of `WAIT`.
fn raw_requester(addr: std::net::SocketAddr) -> (std::net::TcpStream, mpa::Initiator) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("read timeout");
    let ini = mpa::Initiator::new(mpa::MpaConfig::default(), b"", std::time::Instant::now())
        .expect("initiator");
    s.write_all(ini.request()).expect("send the Request");
    (s, ini)
}

/// What the raw peer reads until the listener closes: the Reply's outcome if one came, and
/// how long the close took.
fn read_until_closed(
    s: &mut std::net::TcpStream,
    ini: &mut mpa::Initiator,
) -> (Option<Result<mpa::InitiatorEvent, mpa::MpaError>>, Duration) {
    use std::io::Read;
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("not closed within {WAIT:?}: {e}"),
        }
    }
    let outcome = (!got.is_empty()).then(|| {
        ini.feed(&got, std::time::Instant::now())
            .map(|(_, event)| event)
    });
    (outcome, started.elapsed())
}

/// A listener's requests still queued on the channel when it is dropped are rejected and
/// their events removed (rdma_destroy_id of a listening id: no event names it afterwards);
/// another listener's on the same channel stay.
#[test]
fn dropping_a_notifying_listener_rejects_its_queued_requests() {
    let ch = CmEventChannel::new().unwrap();
    let bind = || Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectParams::default());
    let (a, b) = (bind().unwrap(), bind().unwrap());
    let (addr_a, addr_b) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let a = a.notify_with_context(&ch, 1).unwrap();
    let b = b.notify_with_context(&ch, 2).unwrap();
    let (mut peer_a, mut ini_a) = raw_requester(addr_a);
    // A's request queued (the channel readable), then B's on its way.
    assert!(readable(ch.as_raw_fd(), WAIT), "A's request not queued");
    let (_peer_b, _ini_b) = raw_requester(addr_b);
    drop(a);
    let (outcome, took) = read_until_closed(&mut peer_a, &mut ini_a);
    assert!(
        matches!(outcome, Some(Ok(mpa::InitiatorEvent::Rejected { .. }))),
        "{outcome:?} after {took:?}"
    );
    match ch.wait_event(WAIT) {
        Some(CmEvent::ConnectRequest(r)) => assert_eq!(r.listen_context(), 2),
        other => panic!("B's request: {other:?}"),
    }
    assert!(ch.get_event().is_none(), "an event of the dropped listener");
    assert!(
        !readable(ch.as_raw_fd(), Duration::ZERO),
        "readable with no event"
    );
    drop(b);
}

/// A request taken from a listener that is then dropped keeps its accept deadline: left
/// unanswered, its connection closes at it (before, nothing closed it any more once the
/// listener's thread was gone: the peer waited for its own timeout, the descriptor stayed).
#[test]
fn a_request_outliving_its_listener_keeps_its_accept_deadline() {
    let mut params = ConnectParams::default();
    params.mpa.accept_timeout = Duration::from_millis(300);
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), params).unwrap();
    let (mut peer, mut ini) = raw_requester(listener.local_addr().unwrap());
    let request = listener.accept_timeout(WAIT).unwrap().expect("the Request");
    drop(listener);
    let (outcome, took) = read_until_closed(&mut peer, &mut ini);
    assert!(outcome.is_none(), "a Reply came: {outcome:?}");
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    let server = (ProtectionDomain::new(), CompletionQueue::new());
    assert!(
        request.accept(&server.0, &server.1, &[]).is_err(),
        "accepted after its deadline"
    );
}
