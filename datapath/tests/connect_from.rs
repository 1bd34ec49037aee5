//! Connecting from a given address (`ConnectParams::local_addr`; rdma_cm's `rdma_resolve_addr`
//! with a source address, rping's `-I`, perftest's `--source_ip`): the connection's local
//! address is the one asked for, as both ends see it; a port in use fails the connect, and so
//! do an address of the other family and one the transport cannot send from. The socket transport on loopback; the
//! AF_XDP engine on the veth bed (root, `SKIPPED` without, a failure under `CI=true`) against
//! the socket transport in `iwb`.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::mpsc;

use common::{bed, Side, WAIT};
use datapath::{Access, ConnectParams, DatapathError, Listener, MpaConfig, WcOpcode, WcStatus};
use testbed::{bed_or_skip, ADDR_A, ADDR_B};

fn from(local: SocketAddr, base: ConnectParams) -> ConnectParams {
    ConnectParams {
        local_addr: Some(local),
        ..base
    }
}

#[test]
fn socket_connects_from_the_address_asked_for() {
    let params = common::params(MpaConfig::default());
    let listener = Listener::bind(common::any_port(), params.clone()).expect("listen");
    let addr = listener.local_addr().expect("address");
    let client = Side::new();
    // A port taken by a listening socket: the bind fails, nothing reaches the listener.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to take");
    let busy = from(taken.local_addr().expect("its address"), params.clone());
    match datapath::connect(addr, &client.pd, &client.cq, &busy, &[]) {
        Err(DatapathError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse),
        Err(e) => panic!("from a port in use: {e}"),
        Ok(_) => panic!("connected from a port in use"),
    }
    // An IPv6 address to an IPv4 peer: refused before any socket is bound.
    let v6 = from("[::1]:0".parse().expect("an IPv6 address"), params.clone());
    match datapath::connect(addr, &client.pd, &client.cq, &v6, &[]) {
        Err(DatapathError::InvalidArgument(_)) => {}
        Err(e) => panic!("from an address of the other family: {e}"),
        Ok(_) => panic!("connected from an address of the other family"),
    }
    // A free port of another loopback address.
    let local = {
        let probe = std::net::TcpListener::bind("127.0.0.2:0").expect("a free port");
        probe.local_addr().expect("its address")
    };
    let (c, s) = std::thread::scope(|scope| {
        let connecting = scope.spawn(|| {
            datapath::connect(
                addr,
                &client.pd,
                &client.cq,
                &from(local, params.clone()),
                &[],
            )
        });
        let server = Side::new();
        let s = listener
            .accept_timeout(WAIT)
            .expect("accept")
            .expect("a request")
            .accept(&server.pd, &server.cq, &[])
            .expect("accept");
        (
            connecting.join().expect("client thread").expect("connect"),
            s,
        )
    });
    assert_eq!(c.qp.local_addr(), local);
    assert_eq!(s.qp.peer_addr(), local);
}

#[test]
fn engine_connects_from_the_port_asked_for() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_670;
    const SOURCE: u16 = 19_671;
    let (seen_tx, seen_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let server = move |ready| {
        let req = bed::listen_in_b(PORT, &ready, WAIT)?;
        let side = Side::new();
        let conn = req
            .accept(&side.pd, &side.cq, &[])
            .map_err(|e| e.to_string())?;
        let _ = seen_tx.send(conn.qp.peer_addr());
        let _ = done_rx.recv_timeout(WAIT);
        Ok(())
    };
    bed::engine_against(server, move |engine| {
        let side = Side::new();
        let server_addr = SocketAddr::from((ADDR_B, PORT));
        // Not the interface's address: refused before anything is sent.
        let elsewhere = from(SocketAddr::from((ADDR_B, 0)), bed::params());
        match engine.connect(server_addr, &side.pd, &side.cq, &elsewhere, &[]) {
            Err(DatapathError::InvalidArgument(_)) => {}
            Err(e) => panic!("from another host's address: {e}"),
            Ok(_) => panic!("connected from another host's address"),
        }
        let local = SocketAddr::from((IpAddr::V4(Ipv4Addr::UNSPECIFIED), SOURCE));
        let conn = engine
            .connect(
                server_addr,
                &side.pd,
                &side.cq,
                &from(local, bed::params()),
                &[],
            )
            .expect("connect");
        let want = SocketAddr::from((ADDR_A, SOURCE));
        assert_eq!(conn.qp.local_addr(), want);
        let seen = seen_rx.recv_timeout(WAIT).expect("the server's view");
        assert_eq!(seen, want);
        let _ = done_tx.send(());
    });
}

/// A second connect from the port a live connection uses, to the same peer, fails with the
/// tuple in use and leaves the live connection alone. Before, the failed connect removed the
/// live connection's steering entry on its way out: the peer's segments went to the kernel,
/// which reset the peer, and no echo came back.
#[test]
fn engine_connect_from_a_port_in_use_leaves_the_live_connection() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_610;
    const SOURCE: u16 = 19_619;
    const LEN: usize = 64;
    const ROUNDS: u64 = 3;
    let server = move |ready| {
        let echoed = bed::echo_rounds(PORT, &ready, ROUNDS, LEN, WAIT, |_| Ok(()))?;
        let _ = echoed.qp.wait_finished(WAIT);
        echoed.qp.disconnect();
        Ok(())
    };
    bed::engine_against(server, move |engine| {
        let side = Side::new();
        let server_addr = SocketAddr::from((ADDR_B, PORT));
        let local = SocketAddr::from((IpAddr::V4(Ipv4Addr::UNSPECIFIED), SOURCE));
        let params = from(local, bed::params());
        let buf = side
            .pd
            .register(4 * LEN, Access::LOCAL_WRITE)
            .expect("register");
        let recvs = (0..4).map(|i| bed::slot_recv(&buf, i, LEN)).collect();
        let conn = engine
            .connect_with_recvs(server_addr, &side.pd, &side.cq, &params, &[], recvs)
            .expect("connect");
        let src = side
            .pd
            .register(LEN, Access::LOCAL_WRITE)
            .expect("register");
        let round = |i: u64| {
            conn.qp
                .post_send(bed::slot_send(&src, 0, LEN))
                .expect("post");
            let mut got: Vec<_> = common::collect(&side.cq, 2, &format!("round {i}"))
                .iter()
                .map(|c| (c.wc.opcode, c.wc.status))
                .collect();
            got.sort_by_key(|&(op, _)| op == WcOpcode::Recv);
            assert_eq!(
                got,
                [
                    (WcOpcode::Send, WcStatus::Success),
                    (WcOpcode::Recv, WcStatus::Success)
                ],
                "round {i}"
            );
            conn.qp
                .post_recv(bed::slot_recv(&buf, i + 4, LEN))
                .expect("repost");
        };
        round(0);
        // Connects go to the engine's shards in turn: one of these reaches the shard that
        // owns the connection.
        for _ in 0..engine.shards() {
            let again = Side::new();
            match engine.connect(server_addr, &again.pd, &again.cq, &params, &[]) {
                Err(e @ DatapathError::Xdp(_)) => assert_eq!(e.errno(), libc::EADDRINUSE, "{e}"),
                Err(e) => panic!("a connect from a tuple in use: {e}"),
                Ok(_) => panic!("connected twice from one tuple"),
            }
        }
        for i in 1..ROUNDS {
            round(i);
        }
        assert!(conn.qp.status().error.is_none(), "{:?}", conn.qp.status());
        conn.qp.disconnect();
    });
}
