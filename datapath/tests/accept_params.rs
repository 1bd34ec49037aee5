//! What one accept sets for its own queue pair, whatever the listener's parameters say
//! (`ConnectRequest::queue_depths`, `ird_ord`; verbs' `rdma_create_qp` caps on the request's id
//! and `rdma_accept`'s `responder_resources` / `initiator_depth`): the queue depths, and the
//! IRD and ORD the MPA Reply offers and both ends then run with (RFC 6581 9.1). The socket
//! transport on loopback; the AF_XDP engine as responder on the veth bed (root, `SKIPPED`
//! without, a failure under `CI=true`) to a socket-transport client.

mod common;

use std::net::SocketAddr;

use common::{bed, Side, WAIT};
use datapath::{ConnectParams, Connection, DatapathError, Listener, MpaConfig, QueuePair};
use testbed::{bed_or_skip, ADDR_A, DEV_A, NS_A};

/// The accept's own settings.
const SQ: usize = 8;
const RQ: usize = 2;
const IRD: u16 = 3;
const ORD: u16 = 2;

/// Accepts the next request on `listener` with the accept's own depths and IRD/ORD (this
/// thread), while `connect` runs on another; returns (client, server).
fn accept_with_own_settings(
    listener: &Listener,
    connect: impl FnOnce() -> Result<Connection, DatapathError> + Send,
) -> (Connection, Connection) {
    std::thread::scope(|scope| {
        let client = scope.spawn(connect);
        let server = Side::new();
        let req = listener
            .accept_timeout(WAIT)
            .expect("accept")
            .expect("a request");
        // What the initiator offered (RFC 6581 enhanced setup): the listener's defaults.
        let offered = req
            .info()
            .and_then(|i| i.enhanced)
            .expect("an enhanced Request");
        assert_eq!((offered.ird, offered.ord), (16, 16));
        let s = req
            .queue_depths(SQ, RQ)
            .ird_ord(IRD, ORD)
            .accept(&server.pd, &server.cq, &[])
            .expect("accept");
        let c = client.join().expect("client thread").expect("connect");
        // The handles keep nothing of `server`'s queue: completions are not looked at.
        (c, s)
    })
}

/// The server runs with the accept's settings; the client's ORD is the server's IRD.
fn check(client: &QueuePair, server: &QueuePair, what: &str) {
    let s = server.attr();
    assert_eq!(
        (s.sq_depth, s.rq_depth, s.ird, s.ord),
        (SQ, RQ, IRD, ORD),
        "{what}: the server's queue pair"
    );
    let c = client.attr();
    assert_eq!((c.ird, c.ord), (16, IRD), "{what}: the client's queue pair");
}

fn params() -> ConnectParams {
    common::params(MpaConfig::default())
}

#[test]
fn socket_accept_sets_its_own_depths_and_ird_ord() {
    let listener = Listener::bind(common::any_port(), params()).expect("listen");
    let addr = listener.local_addr().expect("address");
    let client = Side::new();
    let (c, s) = accept_with_own_settings(&listener, || {
        datapath::connect(addr, &client.pd, &client.cq, &params(), &[])
    });
    check(&c.qp, &s.qp, "socket");
}

#[test]
fn engine_accept_sets_its_own_depths_and_ird_ord() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_668;
    let engine = bed::start_engine(NS_A, DEV_A);
    let listener = bed::Stack::Engine(&engine).listen(PORT, bed::params());
    let client = Side::new();
    let (c, s) = accept_with_own_settings(&listener, || {
        let addr = SocketAddr::from((ADDR_A, PORT));
        bed::Stack::Socket.connect(addr, &client.pd, &client.cq, &bed::params(), &[])
    });
    check(&c.qp, &s.qp, "engine");
}
