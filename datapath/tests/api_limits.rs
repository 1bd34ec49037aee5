//! Arguments too large for what they size get a typed error, not a panic nor an allocation
//! the size of the address space: a shared receive queue's `max_wr` and a listener's backlog
//! (both queues are allocated whole). No root, no bed.

use datapath::{
    ConnectParams, DatapathError, Device, ProtectionDomain, SharedReceiveQueue, MAX_BACKLOG,
    MAX_SRQ_WR,
};

#[test]
fn an_srq_larger_than_max_srq_wr_is_refused() {
    let pd = ProtectionDomain::new();
    for max_wr in [0, MAX_SRQ_WR + 1, usize::MAX] {
        assert!(
            matches!(
                SharedReceiveQueue::new(&pd, max_wr),
                Err(DatapathError::InvalidArgument(_))
            ),
            "max_wr {max_wr}"
        );
    }
    assert!(SharedReceiveQueue::new(&pd, 1).is_ok());
}

#[test]
fn a_backlog_larger_than_max_backlog_is_refused() {
    let dev = Device::socket();
    let addr = "127.0.0.1:0".parse().expect("address");
    for backlog in [MAX_BACKLOG + 1, usize::MAX] {
        let params = ConnectParams {
            backlog,
            ..ConnectParams::default()
        };
        assert!(
            matches!(
                dev.listen(addr, params),
                Err(DatapathError::InvalidArgument(_))
            ),
            "backlog {backlog}"
        );
    }
    let params = ConnectParams {
        backlog: MAX_BACKLOG,
        ..ConnectParams::default()
    };
    assert!(dev.listen(addr, params).is_ok());
}

/// IFT framing's DDP mode (R clear) has no queue pair to run: a listen or a connect asking
/// for it is refused before anything is made (one check, `ConnectParams::check`, for both
/// transports; the engine's refusal is tested on the bed in `xdp_ift`).
#[test]
fn ift_without_rdma_mode_is_refused() {
    let dev = Device::socket();
    let params = ConnectParams {
        framing: datapath::Framing::Ift(ift::IftConfig {
            rdma: false,
            ..ift::IftConfig::with_vtag(1)
        }),
        ..ConnectParams::default()
    };
    let addr = "127.0.0.1:0".parse().expect("address");
    assert!(matches!(
        dev.listen(addr, params.clone()),
        Err(DatapathError::InvalidArgument(_))
    ));
    let (pd, cq) = (ProtectionDomain::new(), datapath::CompletionQueue::new());
    assert!(matches!(
        dev.connect(
            "127.0.0.1:9".parse().expect("address"),
            &pd,
            &cq,
            &params,
            &[]
        ),
        Err(DatapathError::InvalidArgument(_))
    ));
}

/// Keepalive times and counts, and a user timeout, beyond what the kernel takes (or of
/// zero) are refused by the listen or connect, before any connection is made: on the socket
/// transport the kernel would refuse them only once the MPA exchange was done, the peer told
/// "accepted". So is a close timeout of zero or above `MAX_CLOSE_TIMEOUT`.
#[test]
fn keepalive_and_user_timeout_beyond_the_kernels_are_refused() {
    use datapath::{Keepalive, MAX_CLOSE_TIMEOUT, MAX_USER_TIMEOUT};
    use std::time::Duration;
    let dev = Device::socket();
    let addr = "127.0.0.1:0".parse().expect("address");
    let over = Keepalive::MAX_TIME + Duration::from_secs(1);
    let bad = [
        ConnectParams {
            keepalive: Some(Keepalive {
                idle: over,
                ..Keepalive::default()
            }),
            ..ConnectParams::default()
        },
        ConnectParams {
            keepalive: Some(Keepalive {
                interval: over,
                ..Keepalive::default()
            }),
            ..ConnectParams::default()
        },
        ConnectParams {
            keepalive: Some(Keepalive {
                probes: Keepalive::MAX_PROBES + 1,
                ..Keepalive::default()
            }),
            ..ConnectParams::default()
        },
        ConnectParams {
            user_timeout: Some(MAX_USER_TIMEOUT + Duration::from_millis(1)),
            ..ConnectParams::default()
        },
        // Zero: "none" to Linux, at once to our TCP; `None` says "none".
        ConnectParams {
            user_timeout: Some(Duration::ZERO),
            ..ConnectParams::default()
        },
        // Zero probes or times: our TCP would give up without probing, or probe every turn.
        ConnectParams {
            keepalive: Some(Keepalive {
                probes: 0,
                ..Keepalive::default()
            }),
            ..ConnectParams::default()
        },
        ConnectParams {
            keepalive: Some(Keepalive {
                idle: Duration::ZERO,
                ..Keepalive::default()
            }),
            ..ConnectParams::default()
        },
        ConnectParams {
            keepalive: Some(Keepalive {
                interval: Duration::ZERO,
                ..Keepalive::default()
            }),
            ..ConnectParams::default()
        },
        ConnectParams {
            close_timeout: Duration::ZERO,
            ..ConnectParams::default()
        },
        ConnectParams {
            close_timeout: MAX_CLOSE_TIMEOUT + Duration::from_nanos(1),
            ..ConnectParams::default()
        },
    ];
    // Nobody listens on the port: a connect that got past the check would be refused by TCP.
    let nobody = "127.0.0.1:9".parse().expect("address");
    let (pd, cq) = (ProtectionDomain::new(), datapath::CompletionQueue::new());
    for params in bad {
        assert!(
            matches!(
                dev.listen(addr, params.clone()),
                Err(DatapathError::InvalidArgument(_))
            ),
            "listen {params:?}"
        );
        assert!(
            matches!(
                dev.connect(nobody, &pd, &cq, &params, &[]),
                Err(DatapathError::InvalidArgument(_))
            ),
            "connect {params:?}"
        );
    }
    let at_the_limits = ConnectParams {
        keepalive: Some(Keepalive {
            idle: Keepalive::MAX_TIME,
            interval: Keepalive::MAX_TIME,
            probes: Keepalive::MAX_PROBES,
        }),
        user_timeout: Some(MAX_USER_TIMEOUT),
        close_timeout: MAX_CLOSE_TIMEOUT,
        ..ConnectParams::default()
    };
    assert!(dev.listen(addr, at_the_limits).is_ok());
    let shortest = ConnectParams {
        user_timeout: Some(Duration::from_nanos(1)),
        close_timeout: Duration::from_nanos(1),
        ..ConnectParams::default()
    };
    assert!(dev.listen(addr, shortest).is_ok());
}

/// A listener whose MPA configuration no Responder takes (a `rev` other than 1 or 2) is
/// refused when it is made, as a connect with it is: it listened before, and every
/// connection it took was closed at once with nothing logged nor counted.
#[test]
fn a_listener_with_an_mpa_configuration_no_responder_takes_is_refused() {
    let dev = Device::socket();
    let addr = "127.0.0.1:0".parse().expect("address");
    for rev in [0, 3] {
        let params = ConnectParams {
            mpa: datapath::MpaConfig {
                rev,
                ..datapath::MpaConfig::default()
            },
            ..ConnectParams::default()
        };
        match dev.listen(addr, params) {
            Err(DatapathError::Mpa(mpa::MpaError::Local(_))) => {}
            Err(e) => panic!("rev {rev}: {e}"),
            Ok(_) => panic!("rev {rev}: listening"),
        }
    }
}
