//! `Device::attr` (verbs' `ibv_query_device` and `ibv_query_port`): each limit it reports is
//! one the API enforces, with the error its documentation names, on both transports and at
//! every entry point (the device's, the transport's own, `connect_async`, an accept) before a
//! connection is made (an accept rejects its Request); values at the limit are taken. The
//! socket transport on loopback; the AF_XDP engine on the veth bed (root, `SKIPPED` without,
//! a failure under `CI=true`), whose port reports the interface's address and MTU.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Side, WAIT};
use datapath::engine::xdp::XdpEngineConfig;
use datapath::{
    CmEventChannel, ConnectParams, DatapathError, Device, Framing, InlineData, Listener, MpaConfig,
    PortState, Sge, SgeList, Transport,
};
use testbed::{bed_or_skip, ADDR_A, ADDR_B, DEV_A, DEV_B, NS_A, NS_B};

/// How long a listener is watched for a request that must not come.
const QUIET: Duration = Duration::from_millis(300);

fn invalid<T>(r: Result<T, DatapathError>, what: &str) {
    match r {
        Err(DatapathError::InvalidArgument(_)) => {}
        Err(e) => panic!("{what}: {e}, not InvalidArgument"),
        Ok(_) => panic!("{what}: taken"),
    }
}

#[test]
fn socket_device_enforces_the_limits_it_reports() {
    let dev = Device::socket();
    let attr = dev.attr();
    assert_eq!(attr.port.addr, None);
    assert_eq!(attr.port.mtu, None);
    assert_eq!(attr.port.state, PortState::Active);
    assert_eq!((attr.port.mac, attr.port.gid()), (None, [0; 16]));
    assert_eq!(attr.node_guid, 0);
    assert_eq!(attr.fw_ver, env!("CARGO_PKG_VERSION"));
    assert_eq!(attr.max_qp, None);
    assert!(attr.atomics_global);
    let base = common::params(MpaConfig::default());
    let deep = |sq: usize, rq: usize| ConnectParams {
        sq_depth: sq,
        rq_depth: rq,
        ..base.clone()
    };
    let any = common::any_port();
    // Listening, through the device and through the transport's own entry point.
    invalid(
        dev.listen(any, deep(attr.max_qp_wr + 1, 1)),
        "a listener's send queues deeper than max_qp_wr",
    );
    invalid(
        Listener::bind(
            any,
            ConnectParams {
                backlog: attr.max_backlog + 1,
                ..base.clone()
            },
        ),
        "Listener::bind with a backlog beyond the largest",
    );
    let listener = dev
        .listen(any, deep(attr.max_qp_wr, attr.max_qp_wr))
        .expect("a listener at max_qp_wr");
    let addr = listener.local_addr().expect("address");
    let client = Side::new();
    // Connecting: refused before the peer sees anything.
    let refused = [
        (
            deep(attr.max_qp_wr + 1, 1),
            "a send queue deeper than max_qp_wr",
        ),
        (
            deep(1, attr.max_qp_wr + 1),
            "a receive queue deeper than max_qp_wr",
        ),
        (
            ConnectParams {
                mpa: MpaConfig {
                    ird: attr.max_qp_rd_atom + 1,
                    ..MpaConfig::default()
                },
                ..base.clone()
            },
            "an IRD beyond max_qp_rd_atom",
        ),
        (
            ConnectParams {
                mpa: MpaConfig {
                    ord: attr.max_qp_init_rd_atom + 1,
                    ..MpaConfig::default()
                },
                framing: Framing::Ift(ift::IftConfig::with_vtag(0)),
                ..base.clone()
            },
            "an ORD beyond max_qp_init_rd_atom with IFT framing",
        ),
    ];
    let events = CmEventChannel::new().expect("event channel");
    for (params, what) in &refused {
        invalid(dev.connect(addr, &client.pd, &client.cq, params, &[]), what);
        invalid(
            dev.connect_async(addr, &client.pd, &client.cq, params, &[], &events, 7),
            what,
        );
    }
    assert!(
        listener.accept_timeout(QUIET).expect("listener").is_none(),
        "a refused connect reached the listener"
    );
    // An accept that asks for too much rejects the request.
    std::thread::scope(|scope| {
        let connecting = scope.spawn(|| dev.connect(addr, &client.pd, &client.cq, &base, &[]));
        let server = Side::new();
        let req = listener
            .accept_timeout(WAIT)
            .expect("accept")
            .expect("a request");
        invalid(
            req.queue_depths(1, attr.max_qp_wr + 1)
                .accept(&server.pd, &server.cq, &[]),
            "accepting with a receive queue deeper than max_qp_wr",
        );
        match connecting.join().expect("client thread") {
            Err(DatapathError::Rejected { .. }) => {}
            Err(e) => panic!("the initiator of a refused accept: {e}"),
            Ok(_) => panic!("the initiator of a refused accept connected"),
        }
    });
    // At the limits: taken.
    let most = ConnectParams {
        mpa: MpaConfig {
            ird: attr.max_qp_rd_atom,
            ord: attr.max_qp_init_rd_atom,
            ..MpaConfig::default()
        },
        ..deep(attr.max_qp_wr, attr.max_qp_wr)
    };
    std::thread::scope(|scope| {
        let connecting = scope.spawn(|| dev.connect(addr, &client.pd, &client.cq, &most, &[]));
        let server = Side::new();
        let req = listener
            .accept_timeout(WAIT)
            .expect("accept")
            .expect("a request");
        let s = req
            .accept(&server.pd, &server.cq, &[])
            .expect("accept at the limits");
        let c = connecting
            .join()
            .expect("client thread")
            .expect("connect at the limits");
        assert_eq!(c.qp.attr().sq_depth, attr.max_qp_wr);
        assert_eq!(s.qp.attr().rq_depth, attr.max_qp_wr);
    });
    // Work requests: the scatter/gather and inline limits.
    let sge = Sge {
        stag: datapath::Stag(0),
        to: 0,
        len: 1,
    };
    assert!(SgeList::from_slice(&vec![sge; attr.max_sge]).is_some());
    assert!(SgeList::from_slice(&vec![sge; attr.max_sge + 1]).is_none());
    assert!(InlineData::new(&vec![0; attr.max_inline_data]).is_ok());
    assert!(InlineData::new(&vec![0; attr.max_inline_data + 1]).is_err());
}

#[test]
fn engine_device_reports_its_port_and_enforces_its_limits() {
    let bed = bed_or_skip!();
    const PORT: u16 = 19_672;
    const MTU: u16 = 3000;
    bed.set_mtu(u32::from(MTU)).expect("bed MTU");
    let dev = testbed::in_ns(NS_A, || {
        Device::open(Transport::Xdp {
            ifname: DEV_A.into(),
            config: Box::new(XdpEngineConfig::default()),
        })
    })
    .expect("engine device");
    let attr = dev.attr();
    let engine = dev.engine().expect("the engine");
    assert_eq!(attr.port.addr, Some(ADDR_A));
    assert_eq!(attr.port.mtu, Some(MTU));
    let per_shard = XdpEngineConfig::default().driver.max_connections;
    assert_eq!(attr.max_qp, Some(per_shard * engine.shards()));
    let base = common::bed::params();
    invalid(
        engine.listen(
            PORT,
            ConnectParams {
                backlog: attr.max_backlog + 1,
                ..base.clone()
            },
        ),
        "XdpEngine::listen with a backlog beyond the largest",
    );
    invalid(
        dev.listen(
            SocketAddr::from((ADDR_A, PORT)),
            ConnectParams {
                rq_depth: attr.max_qp_wr + 1,
                ..base.clone()
            },
        ),
        "an engine listener's receive queues deeper than max_qp_wr",
    );
    let side = Side::new();
    invalid(
        dev.connect(
            SocketAddr::from((ADDR_B, PORT)),
            &side.pd,
            &side.cq,
            &ConnectParams {
                sq_depth: attr.max_qp_wr + 1,
                ..base.clone()
            },
            &[],
        ),
        "an engine connect with a send queue deeper than max_qp_wr",
    );
}

/// Sets `DEV_B` (the peer end of the engine's veth) down, and up again when dropped.
struct PeerDown;

impl PeerDown {
    fn set(up: bool) -> Result<(), String> {
        let state = if up { "up" } else { "down" };
        let out = std::process::Command::new("ip")
            .args(["-n", NS_B, "link", "set", DEV_B, state])
            .output()
            .map_err(|e| format!("ip: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ip link set {DEV_B} {state}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }
}

impl Drop for PeerDown {
    fn drop(&mut self) {
        if let Err(e) = PeerDown::set(true) {
            eprintln!("restoring the bed: {e}");
        }
    }
}

/// `attr` answers on another thread's network namespace than the engine's.
fn port_state(dev: &Device) -> PortState {
    dev.attr().port.state
}

/// The engine's port (`ibv_query_port`, `ibv_query_gid`, `ibv_query_device`'s `node_guid`):
/// its MAC is the interface's, the GID the MAC and zeros as iWARP devices report it, the node
/// GUID its modified EUI-64; the state follows the link as of each query (the peer's end of
/// the veth down: no carrier, `Down`; up again, `Active`), whichever namespace asks.
#[test]
fn engine_port_reports_its_link_state_gid_and_guid() {
    let _bed = bed_or_skip!();
    let (dev, info) = testbed::in_ns(NS_A, || {
        let info = datapath::xsk::interface_info(DEV_A).map_err(|e| e.to_string())?;
        let dev = Device::open(Transport::Xdp {
            ifname: DEV_A.into(),
            config: Box::new(XdpEngineConfig::default()),
        })
        .map_err(|e| e.to_string())?;
        Ok::<_, String>((dev, info))
    })
    .expect("engine device");
    let attr = dev.attr();
    assert_eq!(attr.port.mac, Some(info.mac));
    let mut gid = [0u8; 16];
    gid[..6].copy_from_slice(&info.mac);
    assert_eq!(attr.port.gid(), gid);
    let m = info.mac;
    assert_eq!(
        attr.node_guid.to_be_bytes(),
        [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]
    );
    assert_eq!(attr.port.state, PortState::Active);
    {
        let _restore = PeerDown;
        PeerDown::set(false).expect("the peer's end down");
        let deadline = std::time::Instant::now() + WAIT;
        while port_state(&dev) != PortState::Down {
            assert!(
                std::time::Instant::now() < deadline,
                "no carrier, still Active"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let deadline = std::time::Instant::now() + WAIT;
    while port_state(&dev) != PortState::Active {
        assert!(
            std::time::Instant::now() < deadline,
            "the link is back, still Down"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A device's clones are handles on one engine (as every `rdma_cm_id::verbs` names the one
/// context of its device): dropping one leaves the engine to the others, `close` on one of
/// several stops nothing, and the last handle's `close` stops it, leaving the interface free
/// for another engine.
#[test]
fn clones_of_an_engine_device_share_one_engine() {
    let _bed = bed_or_skip!();
    let open = || {
        testbed::in_ns(NS_A, || {
            Device::open(Transport::Xdp {
                ifname: DEV_A.into(),
                config: Box::new(XdpEngineConfig::default()),
            })
        })
    };
    let dev = open().expect("engine device");
    let (second, third) = (dev.clone(), dev.clone());
    let engine = dev.engine().expect("the engine") as *const _;
    assert!(std::ptr::eq(engine, second.engine().expect("shared")));
    drop(dev);
    assert_eq!(second.local_ip(), Some(ADDR_A), "the engine runs on");
    assert!(
        third.close().is_some(),
        "one handle of several: counters so far"
    );
    // The engine still holds the interface: another cannot start there.
    assert!(
        open().is_err(),
        "a second engine started beside a running one"
    );
    assert!(second.close().is_some(), "the last handle stops it");
    let again = open().expect("the interface is free once the last handle closed");
    drop(again);
}
