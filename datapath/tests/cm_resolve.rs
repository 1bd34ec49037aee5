//! An active side's steps before it connects, as rdma_cm events (`rdma_resolve_addr`,
//! `rdma_resolve_route`): `Device::resolve_addr` queues `AddrResolved` with the local address a
//! connection leaves from, or `AddrError`; `Device::resolve_route` queues `RouteResolved` or
//! `RouteError`, each tagged with the caller's context. The socket transport on loopback (no
//! root), and the AF_XDP engine on the veth bed (root; skips, or fails under `CI=true`,
//! without it): its routes must leave through its interface, and its next hop must answer
//! the kernel's neighbour resolution.

use std::net::SocketAddr;
use std::time::Duration;

use datapath::engine::XdpEngineConfig;
use datapath::xdp_tcp::XdpTcpError;
use datapath::{CmEvent, CmEventChannel, DatapathError, Device, Transport};
use testbed::*;

const WAIT: Duration = Duration::from_secs(10);

/// The AF_XDP engine opened in `iwa`, its neighbour resolutions waiting up to
/// `neighbour_timeout`.
fn engine_in_a(neighbour_timeout: Duration) -> Device {
    in_ns(NS_A, || {
        let mut config = XdpEngineConfig::default();
        config.driver.neighbour_timeout = neighbour_timeout;
        Device::open(Transport::Xdp {
            ifname: DEV_A.into(),
            config: Box::new(config),
        })
        .expect("engine")
    })
}

fn next(ch: &CmEventChannel, what: &str) -> CmEvent {
    ch.wait_event(WAIT)
        .unwrap_or_else(|| panic!("no event: {what}"))
}

#[test]
fn socket_transport_resolves_address_and_route_as_events() {
    let device = Device::socket();
    let ch = CmEventChannel::new().expect("channel");
    let peer: SocketAddr = "127.0.0.1:7471".parse().expect("addr");
    device.resolve_addr(peer, &ch, 11);
    match next(&ch, "address") {
        CmEvent::AddrResolved {
            context: 11,
            local_addr,
        } => assert_eq!(local_addr, "127.0.0.1:0".parse().expect("addr")),
        other => panic!("{other:?}"),
    }
    device.resolve_route(peer, &ch, 12).expect("resolve_route");
    match next(&ch, "route") {
        CmEvent::RouteResolved { context: 12 } => {}
        other => panic!("{other:?}"),
    }
    assert!(ch.get_event().is_none());
}

/// `rdma_resolve_addr` with a source address (rping's `-I`): one of ours is named back with
/// its port; one the host does not have fails at once with `EADDRNOTAVAIL` (unless the host
/// binds any address: `net.ipv4.ip_nonlocal_bind`), another family with `EINVAL`.
#[test]
fn socket_transport_resolves_from_a_source_address() {
    let device = Device::socket();
    let ch = CmEventChannel::new().expect("channel");
    let peer: SocketAddr = "127.0.0.1:7471".parse().expect("addr");
    let src: SocketAddr = "127.0.0.2:5000".parse().expect("addr");
    device
        .resolve_addr_from(src, peer, &ch, 1)
        .expect("from 127.0.0.2");
    match next(&ch, "from 127.0.0.2") {
        CmEvent::AddrResolved {
            context: 1,
            local_addr,
        } => assert_eq!(local_addr, src),
        other => panic!("{other:?}"),
    }
    let nonlocal_bind = std::fs::read_to_string("/proc/sys/net/ipv4/ip_nonlocal_bind")
        .is_ok_and(|v| v.trim() != "0");
    if nonlocal_bind {
        assert!(
            !testbed::ci(),
            "net.ipv4.ip_nonlocal_bind is set: the foreign-source refusal cannot be tested"
        );
        testbed::skipped("the foreign source: net.ipv4.ip_nonlocal_bind is set");
    } else {
        let foreign: SocketAddr = "192.0.2.1:0".parse().expect("addr");
        match device.resolve_addr_from(foreign, peer, &ch, 2) {
            Err(error) => assert_eq!(error.errno(), libc::EADDRNOTAVAIL, "{error}"),
            Ok(()) => panic!("a source not ours: {:?}", ch.get_event()),
        }
    }
    match device.resolve_addr_from("[::1]:0".parse().expect("addr"), peer, &ch, 3) {
        Err(error) => assert_eq!(error.errno(), libc::EINVAL, "{error}"),
        Ok(()) => panic!("another family: {:?}", ch.get_event()),
    }
    assert!(ch.get_event().is_none());
}

/// The engine opened in `iwa`, its resolutions asked from a thread in the test's own network
/// namespace: routes and neighbours are looked up in the engine's.
#[test]
fn engine_resolves_address_and_route_through_its_interface() {
    let _bed = bed_or_skip!();
    let device = engine_in_a(Duration::from_millis(300));
    {
        let ch = CmEventChannel::new().expect("channel");
        let peer = SocketAddr::from((ADDR_B, 7471));

        device.resolve_addr(peer, &ch, 1);
        match next(&ch, "the peer's address") {
            CmEvent::AddrResolved {
                context: 1,
                local_addr,
            } => assert_eq!(local_addr, SocketAddr::from((ADDR_A, 0))),
            other => panic!("{other:?}"),
        }
        // Loopback is reached through `lo`, not the engine's interface.
        device.resolve_addr("127.0.0.1:7471".parse().expect("addr"), &ch, 2);
        match next(&ch, "loopback") {
            CmEvent::AddrError {
                context: 2,
                error: DatapathError::Xdp(XdpTcpError::WrongInterface { .. }),
            } => {}
            other => panic!("{other:?}"),
        }
        device.resolve_addr("[::1]:7471".parse().expect("addr"), &ch, 3);
        match next(&ch, "IPv6") {
            CmEvent::AddrError {
                context: 3,
                error: DatapathError::InvalidArgument(_),
            } => {}
            other => panic!("{other:?}"),
        }

        // From the engine's own address (its port named back), and from another.
        device
            .resolve_addr_from(SocketAddr::from((ADDR_A, 5000)), peer, &ch, 6)
            .expect("from the engine's address");
        match next(&ch, "from the engine's address") {
            CmEvent::AddrResolved {
                context: 6,
                local_addr,
            } => assert_eq!(local_addr, SocketAddr::from((ADDR_A, 5000))),
            other => panic!("{other:?}"),
        }
        match device.resolve_addr_from(SocketAddr::from((ADDR_B, 0)), peer, &ch, 7) {
            Err(error) => assert_eq!(error.errno(), libc::EADDRNOTAVAIL, "{error}"),
            Ok(()) => panic!("a source not the engine's: {:?}", ch.get_event()),
        }

        device.resolve_route(peer, &ch, 4).expect("resolve_route");
        match next(&ch, "the peer's route") {
            CmEvent::RouteResolved { context: 4 } => {}
            other => panic!("{other:?}"),
        }
        // On the link, but nobody has the address: the neighbour resolution times out.
        let nobody = SocketAddr::from((std::net::Ipv4Addr::new(10, 77, 0, 99), 7471));
        device.resolve_route(nobody, &ch, 5).expect("resolve_route");
        match next(&ch, "an address nobody answers for") {
            CmEvent::RouteError { context: 5, error } => println!("route error: {error}"),
            other => panic!("{other:?}"),
        }
        assert!(ch.get_event().is_none());
    }
    drop(device);
}

/// A route resolution under way (nobody answers for the address: the kernel's neighbour
/// resolution would wait its whole timeout, 20 s here) when the engine stops: its caller is
/// told at once (`RouteError`, `Disconnected`), not when that wait ends.
#[test]
fn an_engine_that_stops_answers_a_resolution_under_way_at_once() {
    let _bed = bed_or_skip!();
    let device = engine_in_a(Duration::from_secs(20));
    let ch = CmEventChannel::new().expect("channel");
    let nobody = SocketAddr::from((std::net::Ipv4Addr::new(10, 77, 0, 98), 7471));
    device.resolve_route(nobody, &ch, 8).expect("resolve_route");
    std::thread::sleep(Duration::from_millis(300));
    assert!(ch.get_event().is_none(), "resolved while nobody answers");
    let _ = device.close();
    match ch.wait_event(Duration::from_secs(5)) {
        Some(CmEvent::RouteError {
            context: 8,
            error: DatapathError::Disconnected,
        }) => {}
        other => panic!("{other:?}"),
    }
}
