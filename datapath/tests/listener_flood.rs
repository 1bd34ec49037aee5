//! A flood of silent TCP connections against the socket transport's listeners: all of them
//! together keep at most a quarter of the process's descriptor limit waiting for their MPA
//! Request (closing the rest at once, counted in `ListenStats::over_starting`), so the flood
//! cannot take every descriptor the application has, at one listener or at several, and a
//! real client still connects. Loopback; this test
//! lowers the process's `RLIMIT_NOFILE`, so it is alone in its test binary.

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use datapath::{CompletionQueue, ConnectParams, ListenStats, Listener, ProtectionDomain};

const WAIT: Duration = Duration::from_secs(20);

/// The process's soft descriptor limit set to `n` (the hard one kept).
fn limit_descriptors(n: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit read and write a valid rlimit owned by this frame.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = n.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

/// The sum of `count` over the listeners' stats once it reaches `at`, or after [`WAIT`].
fn total_once_at(listeners: &[Listener], at: u64, count: impl Fn(&ListenStats) -> u64) -> u64 {
    let total = || listeners.iter().map(|l| count(&l.stats())).sum::<u64>();
    let deadline = Instant::now() + WAIT;
    while total() < at && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    total()
}

#[test]
fn a_flood_of_silent_connections_is_held_to_a_quarter_of_the_descriptors() {
    // 40 waiting at most, at the three listeners together (each kept 40 before: 60 in all);
    // the flood of 60 and the listeners' side of those they keep fit.
    limit_descriptors(160);
    let params = ConnectParams {
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    };
    let listeners: Vec<Listener> = (0..3)
        .map(|_| Listener::bind("127.0.0.1:0".parse().unwrap(), params.clone()).unwrap())
        .collect();
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut flood: Vec<TcpStream> = (0..60)
        .map(|i| TcpStream::connect(addrs[i % 3]).unwrap_or_else(|e| panic!("flood {i}: {e}")))
        .collect();
    let over_starting = total_once_at(&listeners, 20, |s| s.over_starting);
    let stats: Vec<_> = listeners.iter().map(Listener::stats).collect();
    assert_eq!(over_starting, 20, "{stats:?}");
    // The 20 turned away see their connection end; the 40 kept do not (yet).
    let mut ended = 0;
    for s in &mut flood {
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut b = [0u8; 1];
        // The end (EOF or a reset) shows at once; a kept connection times the read out.
        match s.read(&mut b) {
            Ok(0) => ended += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => ended += 1,
            _ => {}
        }
    }
    assert_eq!(ended, 20, "connections turned away");
    // The flood gone (each listener sees the end of the connections it kept), a real client
    // connects.
    drop(flood);
    let ended = total_once_at(&listeners, 40, |s| s.closed_early);
    assert_eq!(ended, 40, "the kept connections' ends seen");
    let listener = &listeners[0];
    let addr = addrs[0];
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    std::thread::scope(|s| {
        let client = s.spawn(|| datapath::connect(addr, &pd, &cq, &params, b"real"));
        let req = listener
            .accept_timeout(WAIT)
            .expect("accept")
            .expect("the real client's request");
        assert_eq!(req.private_data(), b"real");
        let (spd, scq) = (ProtectionDomain::new(), CompletionQueue::new());
        let _server = req.accept(&spd, &scq, b"").expect("accept it");
        client
            .join()
            .expect("client thread")
            .expect("the real client connects");
    });
}
