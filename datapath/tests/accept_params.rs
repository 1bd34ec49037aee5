//! What one accept sets for its own queue pair, whatever the listener's parameters say
//! (`ConnectRequest::queue_depths`, `ird_ord`; verbs' `rdma_create_qp` caps on the request's id
//! and `rdma_accept`'s `responder_resources` / `initiator_depth`): the queue depths, and the
//! IRD and ORD the MPA Reply offers and both ends then run with (RFC 6581 9.1); with IFT
//! framing (no negotiation) the server's queue pair runs with them as they are. An IRD beyond
//! 14 bits fails the accept. The socket transport on loopback; the AF_XDP engine as responder
//! on the veth bed (root, `SKIPPED` without, a failure under `CI=true`) to a socket-transport
//! client.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{bed, stays_empty, Side, WAIT};
use datapath::{
    Access, ConnectParams, ConnectRequest, Connection, DatapathError, Framing, Listener, MpaConfig,
    ProtectionDomain, QueuePair, RdmapError, RecvWr, SendOp, SendWr, SgeList, SharedReceiveQueue,
    Stag,
};
use ift::IftConfig;
use testbed::{bed_or_skip, ADDR_A, DEV_A, NS_A};

/// The accept's own settings.
const SQ: usize = 8;
const RQ: usize = 2;
const IRD: u16 = 3;
const ORD: u16 = 2;

/// The framings the tests run with.
fn framings(base: ConnectParams) -> [(ConnectParams, &'static str); 2] {
    let ift = ConnectParams {
        // The VTag is drawn afresh per connection.
        framing: Framing::Ift(IftConfig::with_vtag(0)),
        ..base.clone()
    };
    [(base, "mpa"), (ift, "ift")]
}

/// An accept of a request, as a test makes it.
type Accept<'a> = &'a dyn Fn(ConnectRequest) -> Result<Connection, DatapathError>;

/// Accepts the next request on `listener` with the accept's own depths and IRD/ORD (this
/// thread), while `connect` runs on another; returns (client, server). First refuses an
/// accept with an IRD beyond 14 bits, one with more receives than its receive queue holds,
/// one with a shared receive queue of another protection domain, one with private data
/// MPA cannot carry (IFT: any) and one with a close timeout of zero: each fails with its
/// error and rejects its Request (the initiator hears `Rejected` with MPA; IFT has no
/// reject, its connection closes), and takes the next request.
fn accept_with_own_settings(
    listener: &Listener,
    mpa: bool,
    connect: impl Fn() -> Result<Connection, DatapathError> + Send + Sync,
) -> (Connection, Connection) {
    std::thread::scope(|scope| {
        let server = Side::new();
        let too_many: Vec<RecvWr> = (0..=RQ as u64)
            .map(|wr_id| RecvWr {
                wr_id,
                sg_list: SgeList::new(),
            })
            .collect();
        let other = ProtectionDomain::new();
        let foreign = SharedReceiveQueue::new(&other, 4).expect("an SRQ of another PD");
        let refusals: [(Accept<'_>, &str); 5] = [
            (
                &|req| req.ird_ord(0x4000, ORD).accept(&server.pd, &server.cq, &[]),
                "an IRD of 15 bits",
            ),
            (
                &|req| {
                    req.queue_depths(SQ, RQ).accept_with_recvs(
                        &server.pd,
                        &server.cq,
                        &[],
                        too_many.clone(),
                    )
                },
                "more receives than the receive queue holds",
            ),
            (
                &|req| req.use_srq(&foreign).accept(&server.pd, &server.cq, &[]),
                "a shared receive queue of another protection domain",
            ),
            (
                &|req| req.accept(&server.pd, &server.cq, &[7; 600]),
                "600 octets of private data",
            ),
            (
                &|req| {
                    req.close_timeout(Duration::ZERO)
                        .accept(&server.pd, &server.cq, &[])
                },
                "a close timeout of zero",
            ),
        ];
        for (accept, what) in refusals {
            let refused = scope.spawn(&connect);
            let req = listener
                .accept_timeout(WAIT)
                .expect("accept")
                .expect("a request");
            let e = match accept(req) {
                Err(e) => e,
                Ok(_) => panic!("{what}: accepted"),
            };
            let named = match what {
                "more receives than the receive queue holds" => {
                    matches!(e, DatapathError::RecvQueueFull { .. })
                }
                "600 octets of private data" if mpa => matches!(e, DatapathError::Mpa(_)),
                _ => matches!(e, DatapathError::InvalidArgument(_)),
            };
            assert!(named, "{what}: {e}");
            match refused.join().expect("client thread") {
                Err(DatapathError::Rejected { .. }) => {}
                Err(_) if !mpa => {}
                Err(e) => panic!("{what}: the initiator got {e}, not a reject"),
                Ok(_) => panic!("{what}: the initiator connected"),
            }
        }
        let client = scope.spawn(&connect);
        let req = listener
            .accept_timeout(WAIT)
            .expect("accept")
            .expect("a request");
        // What the initiator offered (RFC 6581 enhanced setup): the defaults; IFT offers
        // nothing.
        let offered = req.offered_ird_ord();
        assert_eq!(offered, req.info().map(|_| (16, 16)));
        let s = req
            .queue_depths(SQ, RQ)
            .ird_ord(IRD, ORD)
            .accept(&server.pd, &server.cq, &[])
            .expect("accept");
        let c = client.join().expect("client thread").expect("connect");
        (c, s)
    })
}

/// The server runs with the accept's settings; with MPA the client's ORD is the server's IRD,
/// with IFT the client keeps its own.
fn check(client: &QueuePair, server: &QueuePair, what: &str) {
    let s = server.attr();
    assert_eq!(
        (s.sq_depth, s.rq_depth, s.ird, s.ord),
        (SQ, RQ, IRD, ORD),
        "{what}: the server's queue pair"
    );
    let want_ord = match client.agreed().framing() {
        "mpa" => IRD,
        _ => 16,
    };
    let c = client.attr();
    assert_eq!(
        (c.ird, c.ord),
        (16, want_ord),
        "{what}: the client's queue pair"
    );
}

#[test]
fn socket_accept_sets_its_own_depths_and_ird_ord() {
    for (params, framing) in framings(common::params(MpaConfig::default())) {
        let listener = Listener::bind(common::any_port(), params.clone()).expect("listen");
        let addr = listener.local_addr().expect("address");
        let client = Side::new();
        let mpa = framing == "mpa";
        let (c, s) = accept_with_own_settings(&listener, mpa, || {
            datapath::connect(addr, &client.pd, &client.cq, &params, &[])
        });
        check(&c.qp, &s.qp, &format!("socket, {framing}"));
    }
}

#[test]
fn engine_accept_sets_its_own_depths_and_ird_ord() {
    let _bed = bed_or_skip!();
    let engine = bed::start_engine(NS_A, DEV_A);
    for ((params, framing), port) in framings(bed::params()).into_iter().zip([19_668, 19_669]) {
        let listener = bed::Stack::Engine(&engine).listen(port, params.clone());
        let client = Side::new();
        let (c, s) = accept_with_own_settings(&listener, framing == "mpa", || {
            let addr = SocketAddr::from((ADDR_A, port));
            bed::Stack::Socket.connect(addr, &client.pd, &client.cq, &params, &[])
        });
        check(&c.qp, &s.qp, &format!("engine, {framing}"));
    }
}

/// An accept with IRD 0 leaves the initiator an ORD of 0 (RFC 6581 9.1): a Read it posts could
/// never be sent, and fails the post (`EINVAL`) rather than waiting in the send queue forever.
#[test]
fn socket_a_read_with_no_ord_fails_the_post() {
    let params = common::params(MpaConfig::default());
    let listener = Listener::bind(common::any_port(), params.clone()).expect("listen");
    let addr = listener.local_addr().expect("address");
    let (client, server) = (Side::new(), Side::new());
    let (c, _s) = std::thread::scope(|scope| {
        let connecting =
            scope.spawn(|| datapath::connect(addr, &client.pd, &client.cq, &params, &[]));
        let req = listener
            .accept_timeout(WAIT)
            .expect("accept")
            .expect("a request");
        let s = req
            .ird_ord(0, ORD)
            .accept(&server.pd, &server.cq, &[])
            .expect("accept");
        (
            connecting.join().expect("client thread").expect("connect"),
            s,
        )
    });
    assert_eq!(c.qp.attr().ord, 0);
    let sink = client.pd.register(64, Access::LOCAL_WRITE).expect("sink");
    let read = SendWr {
        wr_id: 1,
        op: SendOp::Read {
            remote_stag: Stag(0x100),
            remote_to: 0,
        },
        sg_list: sink.sge(0, 64).into(),
        signaled: true,
        fence: false,
    };
    match c.qp.post_send(read) {
        Err(DatapathError::InvalidWorkRequest(RdmapError::ZeroOrd)) => {}
        other => panic!("a Read with ORD 0: {other:?}"),
    }
    stays_empty(&client.cq, "the refused Read completed");
}
