//! The AF_XDP port (`datapath::xsk`) on the veth test bed (`scripts/netns.sh`): namespaces `iwa`
//! (`iwa0`, 10.77.0.1) and `iwb` (`iwb0`, 10.77.0.2), four queues each.
//!
//! Needs root. Without root (or when the bed cannot be made) each test prints `SKIPPED: <why>`
//! and passes, except under `CI=true`, where it fails with the reason. Tests serialise on the
//! same file lock as the other test-bed users (`/run/lock/iwarp-netns.lock`), bring the bed up
//! fresh and always take it down (also when an assertion fails).
//!
//! This binary installs a counting global allocator: it counts only on a thread that switched
//! counting on, so the other tests are unaffected.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datapath::xsk::packet::{tcp_flags, write_tcp_frame, TcpFrame, TcpFrameSpec};
use datapath::xsk::steering::{ActiveMode, AttachMode, SteeringProgram};
use datapath::xsk::{
    interface_info, neighbour, next_hop_mac, resolve_next_hop, xdp_device_features, BindMode,
    BusyPoll, BusyPollState, XskConfig, XskError, XskSocket,
};
use socket2::{Domain, Protocol, Socket, Type};
use testbed::*;

// ---------------------------------------------------------------- counting allocator

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note_alloc() {
    if COUNTING.with(|c| c.get()) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only an
// atomic and a const-initialised thread-local (neither allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---------------------------------------------------------------- test bed

/// `Tcp: OutRsts` of the calling thread's namespace.
fn tcp_out_rsts() -> u64 {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("read snmp");
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let names: Vec<&str> = tcp.next().expect("Tcp header").split_whitespace().collect();
    let values: Vec<&str> = tcp.next().expect("Tcp values").split_whitespace().collect();
    let i = names.iter().position(|n| *n == "OutRsts").expect("OutRsts");
    values[i].parse().expect("number")
}

fn copy_cfg() -> XskConfig {
    XskConfig {
        bind_mode: BindMode::Copy,
        ..XskConfig::default()
    }
}

/// Frame spec from this namespace's `dev` to `dst` (MAC resolved through the neighbour table).
fn spec_to(dev: &str, dst: Ipv4Addr, src_port: u16, dst_port: u16) -> TcpFrameSpec {
    let info = interface_info(dev).expect("interface facts");
    let (src_ip, _) = info.ipv4.expect("interface has an IPv4 address");
    let (route, dst_mac) =
        resolve_next_hop(dst, Duration::from_secs(3)).expect("next hop MAC resolves");
    assert_eq!(route.ifindex, info.index, "route to {dst} leaves by {dev}");
    TcpFrameSpec {
        src_mac: info.mac,
        dst_mac,
        src_ip,
        dst_ip: dst,
        src_port,
        dst_port,
        seq: 1,
        ack: 0,
        flags: tcp_flags::ACK | tcp_flags::PSH,
        window: 65535,
        ip_id: 0,
    }
}

fn pattern(seq: u32, p: &mut [u8]) {
    for (i, b) in p.iter_mut().enumerate() {
        *b = (seq as usize).wrapping_add(i) as u8;
    }
}

/// An AF_PACKET socket in `iwb` that sees every frame there (100 ms read timeout).
fn capture_in_b() -> Socket {
    in_ns(NS_B, || {
        let proto = Protocol::from(i32::from((libc::ETH_P_ALL as u16).to_be()));
        let s = Socket::new(Domain::PACKET, Type::RAW, Some(proto)).expect("AF_PACKET socket");
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        s
    })
}

/// The frames from `iwa` to TCP port `dport` that `capture` sees within 3 s, until `count`:
/// (sequence number, frame length), sorted; each with valid IPv4 and TCP checksums and the
/// payload [`pattern`] of its sequence number.
fn frames_seen(capture: &Socket, dport: u16, count: usize) -> Vec<(u32, usize)> {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 65536];
    while seen.len() < count && Instant::now() < deadline {
        let n = match (&*capture).read(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => panic!("AF_PACKET read: {e}"),
        };
        let Some(f) = TcpFrame::parse(&buf[..n]) else {
            continue;
        };
        if f.src_ip() != ADDR_A || f.dst_port() != dport {
            continue;
        }
        assert!(f.ipv4_checksum_ok(), "IPv4 checksum of {:?}", f);
        assert!(f.tcp_checksum_ok(), "TCP checksum of {:?}", f);
        let mut want = vec![0u8; f.payload().len()];
        pattern(f.seq(), &mut want);
        assert_eq!(f.payload(), &want[..], "payload of seq {}", f.seq());
        seen.push((f.seq(), n));
    }
    seen.sort();
    seen
}

// ---------------------------------------------------------------- tests

/// Interface facts over rtnetlink match the bed: MAC, address, MTU, queue count; ARP resolution
/// from an empty neighbour table works.
#[test]
fn interface_facts_and_neighbour_resolution() {
    let _bed = bed_or_skip!();
    let mac_b = in_ns(NS_B, || interface_info(DEV_B).expect("iwb0").mac);
    in_ns(NS_A, || {
        let info = interface_info(DEV_A).expect("iwa0");
        assert_eq!(info.ipv4, Some((ADDR_A, 24)));
        assert_eq!(info.mtu, 1500);
        assert_eq!((info.rx_queues, info.tx_queues), (QUEUES, QUEUES));
        assert_ne!(info.mac, [0; 6]);
        let t = Instant::now();
        let (route, mac) = resolve_next_hop(ADDR_B, Duration::from_secs(3)).expect("resolve");
        assert_eq!(route.next_hop, ADDR_B);
        assert_eq!(route.ifindex, info.index);
        assert_eq!(route.src, Some(ADDR_A));
        assert_eq!(mac, mac_b, "neighbour table MAC of 10.77.0.2 is iwb0's");
        println!("resolved {ADDR_B} -> {mac:02x?} in {:?}", t.elapsed());
        match resolve_next_hop(Ipv4Addr::new(10, 77, 0, 99), Duration::from_millis(300)) {
            Err(XskError::NeighbourUnresolved { ip, .. }) => {
                assert_eq!(ip, Ipv4Addr::new(10, 77, 0, 99))
            }
            other => panic!("absent host must not resolve: {other:?}"),
        }
    });
}

/// What veth says of its XDP support through the `netdev` generic netlink family: multi-buffer
/// receive, no AF_XDP zero-copy (so its sockets' packets are never limited by
/// `xdp_zc_max_segs`, which only a zero-copy socket obeys).
#[test]
fn veth_xdp_device_features() {
    let _bed = bed_or_skip!();
    in_ns(NS_A, || {
        let info = interface_info(DEV_A).expect("iwa0");
        let f = xdp_device_features(info.index)
            .expect("generic netlink")
            .expect("the netdev family knows iwa0");
        println!("iwa0: {f:?}");
        assert_ne!(
            f.xdp_features & 32,
            0,
            "veth receives multi-buffer XDP: {f:?}"
        );
        assert_eq!(f.xdp_features & 8, 0, "veth has no AF_XDP zero-copy: {f:?}");
        assert!(f.zc_max_segs >= 1);
    });
}

/// An address behind a router: the kernel's neighbour table has no entry for it, and
/// `next_hop_mac` (what the engine's next-hop cache asks when it knows nothing of an address)
/// gives the gateway's MAC; a route by another interface gives none.
#[test]
fn next_hop_mac_of_an_address_behind_a_router_is_the_gateways() {
    let _bed = bed_or_skip!();
    let routed = Ipv4Addr::new(10, 99, 0, 2);
    let mac_b = in_ns(NS_B, || interface_info(DEV_B).expect("iwb0").mac);
    let status = std::process::Command::new("ip")
        .args(["-n", NS_A, "route", "add", "10.99.0.0/24", "via"])
        .arg(ADDR_B.to_string())
        .args(["dev", DEV_A])
        .status()
        .expect("ip route");
    assert!(status.success(), "ip route add: {status}");
    in_ns(NS_A, || {
        let info = interface_info(DEV_A).expect("iwa0");
        resolve_next_hop(ADDR_B, Duration::from_secs(3)).expect("the gateway resolves");
        assert_eq!(
            neighbour(info.index, routed).expect("netlink"),
            None,
            "no neighbour entry for the routed address itself"
        );
        assert_eq!(
            next_hop_mac(info.index, routed).expect("netlink"),
            Some(mac_b),
            "the gateway's MAC"
        );
        assert_eq!(
            next_hop_mac(info.index, ADDR_B).expect("netlink"),
            Some(mac_b)
        );
        // Loopback (index 1) is not the way to it.
        assert_eq!(next_hop_mac(1, routed).expect("netlink"), None);
    });
}

/// A frame built in a UMEM frame and sent from the TX ring of a socket in `iwa` arrives in `iwb`
/// (seen by an AF_PACKET socket there) with valid IPv4 and TCP checksums and intact payload;
/// `send_until` ends its batch where the source runs dry.
#[test]
fn tx_ring_frame_arrives_in_peer_with_valid_checksums() {
    let _bed = bed_or_skip!();
    const DPORT: u16 = 17101;
    let capture = capture_in_b();
    let sizes = [64usize, 1514];
    in_ns(NS_A, || {
        let mut xsk = XskSocket::open(DEV_A, 0, &copy_cfg()).expect("AF_XDP socket on iwa0/0");
        assert!(!xsk.is_zero_copy(), "veth has no zero-copy");
        let spec = spec_to(DEV_A, ADDR_B, 40001, DPORT);
        let sent = xsk
            .send_batch(sizes.len(), |i, buf| {
                let s = TcpFrameSpec {
                    seq: 1000 + i as u32,
                    ..spec
                };
                write_tcp_frame(buf, &s, sizes[i], |p| pattern(s.seq, p)).unwrap()
            })
            .unwrap();
        assert_eq!(sent, sizes.len());
        // A source that runs dry: a skipped frame goes on, `None` ends the batch at once (the
        // call is not offered the batch's other frames).
        let mut offered = 0;
        let sent = xsk
            .send_until(32, |i, buf| {
                offered += 1;
                match i {
                    0 => Some(0),
                    1 => {
                        let s = TcpFrameSpec { seq: 1002, ..spec };
                        Some(write_tcp_frame(buf, &s, 64, |p| pattern(s.seq, p)).unwrap())
                    }
                    _ => None,
                }
            })
            .unwrap();
        assert_eq!((sent, offered), (1, 3), "queued, frames offered");
        assert!(
            xsk.drain_tx(Duration::from_secs(2)).unwrap(),
            "TX completes"
        );
        let st = xsk.stats();
        assert_eq!((st.tx_frames, st.tx_completed), (3, 3), "{st:?}");
        assert_eq!(st.tx_invalid_descs, 0, "{st:?}");
    });
    let seen = frames_seen(&capture, DPORT, sizes.len() + 1);
    assert_eq!(
        seen,
        vec![(1000, 64), (1001, 1514), (1002, 64)],
        "frames seen in iwb (seq, length)"
    );
}

/// Multi-buffer transmit (`XskConfig::multi_buffer`) at MTU 9000: a 9014-octet frame goes out
/// as three UMEM frames (the first two marked `XDP_PKT_CONTD`) and arrives in `iwb` whole;
/// `send_until` on such a socket skips a frame its source leaves empty and ends the batch where
/// the source runs dry, as on a single-buffer socket.
#[test]
fn multi_buffer_tx_spans_frames_and_send_until_ends_dry() {
    let bed = bed_or_skip!();
    bed.set_mtu(9000).expect("MTU 9000");
    const DPORT: u16 = 17102;
    let capture = capture_in_b();
    // (seq, frame octets): a jumbo frame (MTU 9000 plus the Ethernet header), a small one.
    let sizes = [(2000u32, 9014usize), (2001, 64)];
    in_ns(NS_A, || {
        let cfg = XskConfig {
            multi_buffer: true,
            ..copy_cfg()
        };
        let mut xsk = XskSocket::open(DEV_A, 0, &cfg).expect("multi-buffer AF_XDP socket");
        assert!(xsk.packet_capacity() >= 9014, "{}", xsk.packet_capacity());
        let spec = spec_to(DEV_A, ADDR_B, 40002, DPORT);
        let mut offered = 0;
        let sent = xsk
            .send_until(32, |i, buf| {
                offered += 1;
                let (seq, len) = match i {
                    0 => sizes[0],
                    1 => return Some(0),
                    2 => sizes[1],
                    _ => return None,
                };
                let s = TcpFrameSpec { seq, ..spec };
                Some(write_tcp_frame(buf, &s, len, |p| pattern(seq, p)).unwrap())
            })
            .unwrap();
        assert_eq!((sent, offered), (2, 4), "packets queued, packets offered");
        assert!(
            xsk.drain_tx(Duration::from_secs(2)).unwrap(),
            "TX completes"
        );
        let st = xsk.stats();
        assert_eq!(
            (st.tx_frames, st.tx_completed, st.tx_multi_frame),
            (4, 4, 1),
            "three frames for the jumbo packet, one for the small one: {st:?}"
        );
        assert_eq!(st.tx_invalid_descs, 0, "{st:?}");
    });
    let seen = frames_seen(&capture, DPORT, sizes.len());
    assert_eq!(
        seen,
        vec![(2000, 9014), (2001, 64)],
        "frames seen in iwb (seq, length)"
    );
}

/// A multi-buffer socket limited to two frames a packet (what a zero-copy driver's
/// `xdp_zc_max_segs` of 2 does; veth has no zero-copy, so the limit is set by hand): its packet
/// capacity is two frames', the writer is offered that room, and a packet of that size goes
/// out as two frames and arrives whole, also with a kick batch of one.
#[test]
fn a_frames_per_packet_limit_bounds_what_is_sent() {
    let bed = bed_or_skip!();
    bed.set_mtu(9000).expect("MTU 9000");
    const DPORT: u16 = 17103;
    let capture = capture_in_b();
    let mut len = 0;
    in_ns(NS_A, || {
        let cfg = XskConfig {
            multi_buffer: true,
            kick_batch: 1,
            ..copy_cfg()
        };
        let mut xsk = XskSocket::open(DEV_A, 0, &cfg).expect("multi-buffer AF_XDP socket");
        xsk.limit_frames_per_packet(2);
        assert_eq!(xsk.packet_capacity(), 2 * xsk.frame_capacity());
        len = xsk.packet_capacity();
        let spec = spec_to(DEV_A, ADDR_B, 40003, DPORT);
        let mut room = 0;
        let sent = xsk
            .send_until(32, |i, buf| {
                room = room.max(buf.len());
                (i == 0).then(|| {
                    let s = TcpFrameSpec { seq: 3000, ..spec };
                    write_tcp_frame(buf, &s, len, |p| pattern(3000, p)).unwrap()
                })
            })
            .unwrap();
        assert_eq!(sent, 1);
        assert_eq!(room, len, "the writer is offered two frames' room");
        assert!(
            xsk.drain_tx(Duration::from_secs(2)).unwrap(),
            "TX completes"
        );
        let st = xsk.stats();
        assert_eq!((st.tx_frames, st.tx_multi_frame), (2, 1), "{st:?}");
        assert_eq!(st.tx_invalid_descs, 0, "{st:?}");
    });
    let seen = frames_seen(&capture, DPORT, 1);
    assert_eq!(seen, vec![(3000, len)], "frames seen in iwb (seq, length)");
}

/// A SYN from the kernel of `iwb` to a steered port lands in an AF_XDP RX ring in `iwa` (program
/// attached, one socket per queue put in the XSKMAP), and the kernel of `iwa` never answers it.
/// Runs in generic and in driver mode.
#[test]
fn steered_syn_lands_in_rx_ring_and_kernel_sends_no_rst() {
    let _bed = bed_or_skip!();
    for (mode, expect, port) in [
        (AttachMode::Generic, ActiveMode::Generic, 17201u16),
        (AttachMode::Driver, ActiveMode::Driver, 17202),
    ] {
        in_ns(NS_A, || {
            let mut prog = SteeringProgram::load(false).expect("load steering program");
            assert_eq!(prog.attach(DEV_A, mode).expect("attach"), expect);
            prog.steer_port(ADDR_A, port).unwrap();
            let mut socks = XskSocket::open_queues(DEV_A, 0..QUEUES, &copy_cfg()).expect("open");
            for s in &socks {
                prog.bind_socket(s.queue(), s.fd()).expect("bind_socket");
            }
            let rsts = tcp_out_rsts();
            let err = in_ns(NS_B, || {
                TcpStream::connect_timeout(
                    &SocketAddr::V4(SocketAddrV4::new(ADDR_A, port)),
                    Duration::from_millis(1300),
                )
            })
            .expect_err("connect to a steered port must not complete");
            assert_eq!(err.kind(), io::ErrorKind::TimedOut, "got {err}");
            let mut syns = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(1);
            while syns.is_empty() && Instant::now() < deadline {
                for s in socks.iter_mut() {
                    let q = s.queue();
                    let batch = s.recv_batch(64);
                    // Whole-frame prefetches, past the batch's end too: hints only, they
                    // neither panic nor change a frame (the checksums below still hold).
                    for i in 0..batch.len() + 3 {
                        batch.prefetch(i);
                    }
                    for f in batch.iter().filter_map(TcpFrame::parse) {
                        if f.dst_port() == port && f.flags() & tcp_flags::SYN != 0 {
                            assert!(f.ipv4_checksum_ok() && f.tcp_checksum_ok());
                            assert_eq!(f.src_ip(), ADDR_B);
                            syns.push(q);
                        }
                    }
                }
            }
            assert!(!syns.is_empty(), "{mode} mode: no SYN in any RX ring");
            assert_eq!(
                tcp_out_rsts(),
                rsts,
                "{mode} mode: kernel in iwa sent a RST"
            );
            let c = prog.counters().unwrap();
            assert!(c.redirected >= syns.len() as u64, "{c:?}");
            println!("{mode} mode: SYN(s) on queue(s) {syns:?}, counters {c:?}");
        });
        // Let the queues be released before the next round binds them again.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Binding a queue that is held fails with `Busy` after the bounded retries; a queue freed a
/// moment ago binds again (retrying through EBUSY); a queue beyond the device's is refused.
#[test]
fn busy_queue_retry_and_range() {
    let _bed = bed_or_skip!();
    in_ns(NS_A, || {
        let held = XskSocket::open(DEV_A, 1, &copy_cfg()).expect("open queue 1");
        let quick = XskConfig {
            bind_attempts: 2,
            bind_retry_delay: Duration::from_millis(50),
            ..copy_cfg()
        };
        match XskSocket::open(DEV_A, 1, &quick) {
            Err(e @ XskError::Busy { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("EBUSY") && msg.contains("2 bind attempts"),
                    "{msg}"
                );
            }
            other => panic!("expected Busy, got {other:?}"),
        }
        drop(held);
        let again = XskSocket::open(DEV_A, 1, &copy_cfg()).expect("rebind after close");
        assert_eq!(again.queue(), 1);
        match XskSocket::open(DEV_A, QUEUES, &copy_cfg()) {
            Err(XskError::QueueOutOfRange { queues, .. }) => assert_eq!(queues, QUEUES),
            other => panic!("expected QueueOutOfRange, got {other:?}"),
        }
        let all = XskSocket::open_queues(DEV_A, [0, 2, 3], &copy_cfg()).expect("other queues");
        assert_eq!(all.len(), 3);
    });
}

/// Steady state of TX (socket in `iwb`) and RX (sockets in `iwa`, steered): 10,000 frames sent
/// and received with zero heap allocations on the polling thread.
#[test]
fn no_allocation_per_packet_on_rx_and_tx_paths() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 17301;
    const WARMUP: usize = 1_000;
    const MEASURED: usize = 10_000;
    const SIZE: usize = 128;
    let (mut tx, spec) = in_ns(NS_B, || {
        let tx = XskSocket::open(DEV_B, 0, &copy_cfg()).expect("TX socket in iwb");
        (tx, spec_to(DEV_B, ADDR_A, 40002, PORT))
    });
    in_ns(NS_A, || {
        let mut prog = SteeringProgram::load(false).unwrap();
        prog.attach(DEV_A, AttachMode::Generic).unwrap();
        prog.steer_port(ADDR_A, PORT).unwrap();
        let mut rx = XskSocket::open_queues(DEV_A, 0..QUEUES, &copy_cfg()).unwrap();
        for s in &rx {
            prog.bind_socket(s.queue(), s.fd()).unwrap();
        }
        let mut seq = 0u32;
        let mut run = |frames: usize, count: bool| -> (usize, u64) {
            let before = ALLOCS.load(Ordering::Relaxed);
            COUNTING.with(|c| c.set(count));
            let mut sent = 0;
            let mut got = 0;
            let mut bad = 0u64;
            let deadline = Instant::now() + Duration::from_secs(30);
            while got < frames && Instant::now() < deadline {
                if sent < frames && sent - got < 256 {
                    let n = (frames - sent).min(32);
                    sent += tx
                        .send_batch(n, |_, buf| {
                            seq = seq.wrapping_add(1);
                            let s = TcpFrameSpec { seq, ..spec };
                            write_tcp_frame(buf, &s, SIZE, |p| p.fill(0x5a)).unwrap_or(0)
                        })
                        .unwrap();
                }
                tx.flush().unwrap();
                for s in rx.iter_mut() {
                    let b = s.recv_batch(64);
                    for f in b.iter() {
                        match TcpFrame::parse(f) {
                            Some(t) if t.dst_port() == PORT && t.tcp_checksum_ok() => got += 1,
                            _ => bad += 1,
                        }
                    }
                }
            }
            COUNTING.with(|c| c.set(false));
            let allocs = ALLOCS.load(Ordering::Relaxed) - before;
            assert_eq!(bad, 0, "unexpected frames in the RX rings");
            (got, allocs)
        };
        // The counter itself works: one allocation on this thread while counting is one.
        let before = ALLOCS.load(Ordering::Relaxed);
        COUNTING.with(|c| c.set(true));
        drop(std::hint::black_box(Vec::<u8>::with_capacity(64)));
        COUNTING.with(|c| c.set(false));
        assert_eq!(
            ALLOCS.load(Ordering::Relaxed) - before,
            1,
            "counting allocator"
        );
        let (got, _) = run(WARMUP, false);
        assert_eq!(got, WARMUP, "warm-up frames received");
        let (got, allocs) = run(MEASURED, true);
        let stats: Vec<_> = rx.iter().map(|s| (s.queue(), s.stats())).collect();
        assert_eq!(got, MEASURED, "frames received; rx stats {stats:?}");
        assert_eq!(
            allocs, 0,
            "heap allocations during {MEASURED} frames each way"
        );
        println!(
            "{MEASURED} frames of {SIZE} B: 0 allocations; tx {:?}; rx per queue {:?}",
            tx.stats(),
            stats
                .iter()
                .map(|(q, s)| (*q, s.rx_frames))
                .collect::<Vec<_>>()
        );
    });
}

/// Rings of 8 frames, one frame at a time, 3,000 times, the receiver busy-polling on another
/// thread: each frame reaches an RX ring whose fill ring is otherwise full, and the receiver can
/// see the frame before the kernel has published its fill-ring consumer position. No frame may
/// be lost or refused back to the fill ring (a leak would empty an 8-frame pool within a few
/// rounds).
#[test]
fn tiny_rings_lose_no_frames() {
    use std::sync::atomic::{AtomicBool, AtomicU32};
    let _bed = bed_or_skip!();
    const PORT: u16 = 17401;
    const ROUNDS: u32 = 3_000;
    let tiny = XskConfig {
        rx_ring: 8,
        tx_ring: 8,
        max_batch: 8,
        kick_batch: 8,
        ..copy_cfg()
    };
    let (mut tx, spec) = in_ns(NS_B, || {
        let tx = XskSocket::open(DEV_B, 0, &tiny).expect("TX socket in iwb");
        (tx, spec_to(DEV_B, ADDR_A, 40003, PORT))
    });
    let received = AtomicU32::new(0);
    let stop = AtomicBool::new(false);
    let drops = in_ns(NS_A, || {
        let mut prog = SteeringProgram::load(false).unwrap();
        prog.attach(DEV_A, AttachMode::Driver).unwrap();
        prog.steer_port(ADDR_A, PORT).unwrap();
        let mut rx = XskSocket::open_queues(DEV_A, 0..QUEUES, &tiny).unwrap();
        for s in &rx {
            prog.bind_socket(s.queue(), s.fd()).unwrap();
        }
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    for s in rx.iter_mut() {
                        let b = s.recv_batch(8);
                        let n = b.iter().filter_map(TcpFrame::parse).count();
                        received.fetch_add(n as u32, Ordering::Release);
                    }
                }
            });
            let _stop = StopOnDrop(&stop);
            for seq in 0..ROUNDS {
                let sent = tx
                    .send_batch(1, |_, buf| {
                        write_tcp_frame(buf, &TcpFrameSpec { seq, ..spec }, 64, |p| p.fill(1))
                            .unwrap_or(0)
                    })
                    .unwrap();
                assert_eq!(sent, 1, "round {seq}: TX frame queued");
                let deadline = Instant::now() + Duration::from_secs(2);
                while received.load(Ordering::Acquire) <= seq {
                    assert!(Instant::now() < deadline, "round {seq}: frame lost");
                    tx.flush().unwrap();
                }
            }
            assert!(tx.drain_tx(Duration::from_secs(2)).unwrap());
        });
        rx.iter()
            .map(|s| s.stats().rx_dropped + s.stats().rx_ring_full)
            .sum::<u64>()
    });
    assert_eq!(received.load(Ordering::Acquire), ROUNDS);
    assert_eq!(drops, 0, "kernel drops on the RX side");
}

/// Sets the flag when dropped (also while unwinding), so a polling thread stops.
struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `XskConfig::busy_poll` sets SO_PREFER_BUSY_POLL, SO_BUSY_POLL and SO_BUSY_POLL_BUDGET on the
/// socket (read back from the kernel), a socket without it has none, and on veth, which has
/// no zero-copy, the default bind (`BindMode::Auto`: zero-copy where the driver offers it)
/// comes up in copy mode and says so.
#[test]
fn busy_poll_options_are_applied_and_veth_binds_in_copy_mode() {
    let _bed = bed_or_skip!();
    in_ns(NS_A, || {
        let bp = BusyPoll {
            usecs: 50,
            budget: 16,
            prefer: true,
        };
        let cfg = XskConfig {
            busy_poll: Some(bp),
            ..XskConfig::default()
        };
        let mut sock = XskSocket::open(DEV_A, 2, &cfg).expect("open with busy polling");
        // An empty receive busy-polls (recvfrom) instead of waking the fill ring.
        assert!(sock.recv_batch(16).is_empty());
        assert_eq!(sock.stats().busy_polls, 1);
        // The budget cannot be read back (the kernel does not report it); it was set, or the
        // socket would not have opened.
        assert_eq!(
            sock.busy_poll_state().expect("getsockopt"),
            BusyPollState {
                usecs: 50,
                prefer: true
            }
        );
        assert!(!sock.is_zero_copy(), "veth has no AF_XDP zero-copy");
        drop(sock);
        let plain = XskSocket::open(DEV_A, 3, &XskConfig::default()).expect("open");
        assert_eq!(
            plain.busy_poll_state().expect("getsockopt"),
            BusyPollState {
                usecs: 0,
                prefer: false
            }
        );
    });
}

/// The value of `key` in `/proc/meminfo` (the huge page pool is the system's, not a
/// namespace's), as written there.
fn meminfo(key: &str) -> String {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("read /proc/meminfo");
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("{key} in /proc/meminfo"))
}

/// `HugePages_Free` in `/proc/meminfo`.
fn huge_pages_free() -> u64 {
    meminfo("HugePages_Free").parse().expect("a number")
}

/// Reserves `n` more huge pages (`/proc/sys/vm/nr_hugepages`) and gives them back on drop.
struct HugePageReservation(String);

impl HugePageReservation {
    fn more(n: u64) -> Self {
        const PATH: &str = "/proc/sys/vm/nr_hugepages";
        let before = std::fs::read_to_string(PATH).expect("read nr_hugepages");
        let old: u64 = before.trim().parse().expect("a number");
        std::fs::write(PATH, format!("{}\n", old + n)).expect("write nr_hugepages");
        HugePageReservation(before)
    }
}

impl Drop for HugePageReservation {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/vm/nr_hugepages", &self.0);
    }
}

/// A UMEM on huge pages gives them back when its socket closes, whatever its length: one of
/// 8 MiB + 32 KiB (`rx_ring: 2048, tx_ring: 8`) was mapped over five 2 MiB pages and unmapped
/// by its own length, which the kernel refuses for a huge-page mapping, so every socket kept
/// its pages until the process ended.
#[test]
fn huge_page_umems_are_given_back_when_their_socket_closes() {
    let _bed = bed_or_skip!();
    // Five 2 MiB pages hold the UMEM below; with other default huge pages (1 GiB ones, or
    // another architecture's) the socket would rightly take normal pages.
    if meminfo("Hugepagesize") != "2048 kB" {
        let why = "the default huge page size is not 2 MiB";
        assert!(!testbed::ci(), "{why} (CI=true, so this fails)");
        testbed::skipped(why);
        return;
    }
    let _reserved = HugePageReservation::more(8);
    let free = huge_pages_free();
    assert!(
        free >= 5,
        "could not reserve huge pages for the test: {free} free (memory too fragmented?)"
    );
    let cfg = XskConfig {
        rx_ring: 2048,
        tx_ring: 8,
        ..copy_cfg()
    };
    in_ns(NS_A, || {
        for round in 0..3 {
            let sock = XskSocket::open(DEV_A, 0, &cfg).expect("open");
            assert!(sock.hugepages(), "round {round}: the UMEM is on huge pages");
            assert!(huge_pages_free() < free, "round {round}: huge pages taken");
            drop(sock);
            // The kernel may release a UMEM from a work queue after the close.
            let deadline = Instant::now() + Duration::from_secs(2);
            while huge_pages_free() != free && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(
                huge_pages_free(),
                free,
                "round {round}: the socket's huge pages were not given back"
            );
        }
    });
}

/// A device running fewer queues than it has (`ethtool -L iwa0 rx 2 tx 2`: veth keeps four
/// allocated): a queue between the running and the allocated count is out of range, said as
/// such (the kernel refuses to bind it with EINVAL, which said nothing of the queue).
#[test]
fn a_queue_allocated_but_not_running_is_out_of_range() {
    let _bed = bed_or_skip!();
    let ethtool = |args: &str| {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", NS_A, "ethtool", "-L", DEV_A])
            .args(args.split(' '))
            .output()
            .expect("run ethtool");
        assert!(out.status.success(), "ethtool -L {args}: {out:?}");
    };
    ethtool("rx 2 tx 2");
    in_ns(NS_A, || {
        let cfg = copy_cfg();
        match XskSocket::open(DEV_A, 2, &cfg) {
            Err(XskError::QueueOutOfRange { queues: 2, .. }) => {}
            other => panic!("expected QueueOutOfRange of 2 queues, got {other:?}"),
        }
        XskSocket::open(DEV_A, 1, &cfg).expect("a running queue");
    });
    ethtool(&format!("rx {QUEUES} tx {QUEUES}"));
}

/// One of an AF_XDP socket's rings mapped a second time, to see its indices and to change
/// what the kernel put on it, as a kernel bug or a stray write into the mapping would.
struct RingMap {
    base: *mut u8,
    len: usize,
    producer: usize,
    consumer: usize,
    desc: usize,
    mask: u32,
}

impl RingMap {
    /// The RX ring of `fd`, of `entries` descriptors.
    fn rx(fd: i32, entries: u32) -> Self {
        let size = std::mem::size_of::<libc::xdp_desc>();
        Self::map(fd, entries, size, libc::XDP_PGOFF_RX_RING, |o| o.rx)
    }

    /// The fill ring of `fd`'s UMEM, of `entries` addresses.
    fn fill(fd: i32, entries: u32) -> Self {
        let pgoff = libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t;
        Self::map(fd, entries, std::mem::size_of::<u64>(), pgoff, |o| o.fr)
    }

    fn map(
        fd: i32,
        entries: u32,
        entry_size: usize,
        pgoff: libc::off_t,
        ring: fn(&libc::xdp_mmap_offsets) -> libc::xdp_ring_offset,
    ) -> Self {
        // SAFETY: xdp_mmap_offsets is plain integers; all-zero is a valid value.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut optlen = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` and `optlen` are live and `optlen` is the buffer's size.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut optlen,
            )
        };
        assert_eq!(rc, 0, "XDP_MMAP_OFFSETS: {}", io::Error::last_os_error());
        let off = ring(&off);
        let len = off.desc as usize + entries as usize * entry_size;
        // SAFETY: a new shared mapping of one of the socket's rings at an address the kernel
        // picks; no memory of ours is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        RingMap {
            base: base.cast(),
            len,
            producer: off.producer as usize,
            consumer: off.consumer as usize,
            desc: off.desc as usize,
            mask: entries - 1,
        }
    }

    fn index(&self, at: usize) -> u32 {
        // SAFETY: the index lies in the mapping, 4-aligned (the kernel's layout), and the
        // kernel and xsk-rs access it only atomically.
        unsafe { &*(self.base.add(at) as *const AtomicU32) }.load(Ordering::Acquire)
    }

    /// The producer's index.
    fn produced(&self) -> u32 {
        self.index(self.producer)
    }

    /// The consumer's index.
    fn consumed(&self) -> u32 {
        self.index(self.consumer)
    }

    /// Entries produced and not yet consumed.
    fn waiting(&self) -> u32 {
        self.produced().wrapping_sub(self.consumed())
    }

    /// The entry at ring index `i` of a ring of `T` (one produced: neither side writes it
    /// again until the ring comes round).
    fn entry<T: Copy>(&self, i: u32) -> T {
        // SAFETY: slot `i & mask` of the ring's entries, inside the mapping (`T` is the
        // ring's entry type, of the size mapped); produced before the index read that
        // acquired it.
        unsafe {
            (self.base.add(self.desc) as *const T)
                .add((i & self.mask) as usize)
                .read()
        }
    }

    /// Changes the address and length of the RX descriptor at ring index `i`, one the kernel
    /// produced and the socket has not consumed (so neither writes it meanwhile).
    fn set_desc(&self, i: u32, addr: Option<u64>, len: Option<u32>) {
        // SAFETY: slot `i & mask` of the RX ring's descriptors, inside the mapping; the kernel
        // wrote it before its producer's release, which `waiting` acquired, and will not write
        // it again before the socket consumes it; the socket reads it only in `recv_batch`,
        // called after this on this thread.
        unsafe {
            let slot =
                (self.base.add(self.desc) as *mut libc::xdp_desc).add((i & self.mask) as usize);
            let mut desc = slot.read();
            desc.addr = addr.unwrap_or(desc.addr);
            desc.len = len.unwrap_or(desc.len);
            slot.write(desc);
        }
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped only here.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Sends TCP frames of `(seq, frame length)` from an AF_XDP socket on `iwb0`'s queue 0 to
/// `iwa`'s `port`, each with the [`pattern`] of its sequence number (call in `iwb`).
fn send_from_b(port: u16, frames: &[(u32, usize)], multi_buffer: bool) {
    let cfg = XskConfig {
        multi_buffer,
        ..copy_cfg()
    };
    let mut xsk = XskSocket::open(DEV_B, 0, &cfg).expect("an AF_XDP socket in iwb");
    let spec = spec_to(DEV_B, ADDR_A, 40010, port);
    let sent = xsk
        .send_batch(frames.len(), |i, buf| {
            let (seq, len) = frames[i];
            let s = TcpFrameSpec { seq, ..spec };
            write_tcp_frame(buf, &s, len, |p| pattern(seq, p)).unwrap()
        })
        .unwrap();
    assert_eq!(sent, frames.len());
    assert!(
        xsk.drain_tx(Duration::from_secs(2)).unwrap(),
        "TX completes"
    );
}

/// Waits until one of `rings` holds `count` received frames and returns its index.
fn ring_with(rings: &[RingMap], count: u32) -> usize {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        if let Some(q) = rings.iter().position(|r| r.waiting() >= count) {
            return q;
        }
        let waiting: Vec<u32> = rings.iter().map(RingMap::waiting).collect();
        assert!(
            Instant::now() < deadline,
            "no RX ring has {count} frames: {waiting:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The (sequence number, frame length) of each packet of `batch`, checked: valid checksums
/// and each payload its sequence number's [`pattern`].
fn received(batch: &datapath::xsk::RxBatch<'_>) -> Vec<(u32, usize)> {
    batch
        .iter()
        .map(|frame| {
            let f = TcpFrame::parse(frame).expect("a TCP frame");
            assert!(f.ipv4_checksum_ok() && f.tcp_checksum_ok(), "{f:?}");
            let mut want = vec![0u8; f.payload().len()];
            pattern(f.seq(), &mut want);
            assert_eq!(f.payload(), &want[..], "payload of seq {}", f.seq());
            (f.seq(), frame.len())
        })
        .collect()
}

/// Descriptors on the RX ring that name no frame of the RX pool the kernel held (past the
/// UMEM, a TX frame, across two chunks, a frame received already), written over ones the
/// kernel produced, are never read or lent: their packets are dropped (on a multi-buffer
/// socket all of a packet's frames), they are counted (`rx_descs_refused`) and not given back
/// to the fill ring, while the good frames of the batch are. The socket then receives what
/// follows, in step with the kernel.
#[test]
fn rx_descriptors_of_no_frame_the_kernel_held_are_dropped_unread() {
    let bed = bed_or_skip!();
    const PORT: u16 = 17210;
    for multi_buffer in [false, true] {
        if multi_buffer {
            bed.set_mtu(9000).expect("MTU 9000");
        }
        in_ns(NS_A, || {
            let cfg = XskConfig {
                multi_buffer,
                ..copy_cfg()
            };
            let frame = u64::from(cfg.frame_size);
            let rx_pool = u64::from(cfg.rx_ring) * frame;
            let umem_len = rx_pool + u64::from(cfg.tx_ring) * frame;
            let mut prog = SteeringProgram::load(multi_buffer).expect("load steering program");
            prog.attach(DEV_A, AttachMode::Driver).expect("attach");
            prog.steer_port(ADDR_A, PORT).unwrap();
            let mut socks = XskSocket::open_queues(DEV_A, 0..QUEUES, &cfg).expect("open");
            for s in &socks {
                prog.bind_socket(s.queue(), s.fd()).expect("bind_socket");
            }
            let rings: Vec<RingMap> = socks
                .iter()
                .map(|s| RingMap::rx(s.fd(), cfg.rx_ring))
                .collect();
            let fills: Vec<RingMap> = socks
                .iter()
                .map(|s| RingMap::fill(s.fd(), cfg.rx_ring * 2))
                .collect();

            // The frames received, which of them are changed, and the addresses of those the
            // socket must give back to the fill ring.
            let addr = |q: usize, i: u32| rings[q].entry::<libc::xdp_desc>(i).addr;
            let (first, frames, kept, later) = if multi_buffer {
                // A jumbo packet (three frames) and a small one; the jumbo's middle frame is
                // made to lie past the UMEM: the jumbo goes, all three of its frames, and its
                // first and last go back to the fill ring with the small one's.
                let frames = [(10, 9014), (11, 64)];
                in_ns(NS_B, || send_from_b(PORT, &frames, true));
                let q = ring_with(&rings, 4);
                let c = rings[q].consumed();
                let kept = vec![addr(q, c), addr(q, c + 2), addr(q, c + 3)];
                rings[q].set_desc(c + 1, Some(umem_len + 256), None);
                (q, 4, kept, vec![(12, 9014), (13, 64)])
            } else {
                // Past the UMEM, a TX frame, across two chunks, intact, and a second
                // descriptor of the intact one's frame.
                let frames = [(1, 100), (2, 100), (3, 100), (4, 100), (5, 100)];
                in_ns(NS_B, || send_from_b(PORT, &frames, false));
                let q = ring_with(&rings, 5);
                let c = rings[q].consumed();
                let intact = addr(q, c + 3);
                rings[q].set_desc(c, Some(umem_len + 256), None);
                rings[q].set_desc(c + 1, Some(rx_pool + 256), None);
                rings[q].set_desc(c + 2, None, Some(cfg.frame_size));
                rings[q].set_desc(c + 4, Some(intact), None);
                (q, 5, vec![intact], vec![(6, 100), (7, 100)])
            };
            let q = first;
            let filled = fills[q].produced();
            let batch = socks[q].recv_batch(64);
            assert_eq!(batch.frames(), frames);
            let got = received(&batch);
            drop(batch);
            let given_back: Vec<u64> = (filled..fills[q].produced())
                .map(|i| fills[q].entry::<u64>(i))
                .collect();
            let st = socks[q].stats();
            println!(
                "multi-buffer {multi_buffer}: received {got:?}, \
                 {given_back:x?} back to the fill ring, {st:?}"
            );
            let expected_refused = if multi_buffer { 1 } else { 4 };
            assert_eq!(
                got,
                if multi_buffer {
                    vec![(11, 64)]
                } else {
                    vec![(4, 100)]
                },
                "only the intact packet is lent"
            );
            assert_eq!(st.rx_descs_refused, expected_refused, "{st:?}");
            assert_eq!(
                given_back, kept,
                "the frames taken, and only they, went back to the fill ring"
            );
            assert_eq!(st.rx_multi_frame, 0, "{st:?}");

            // What follows arrives whole, the socket's indices in step with the kernel's.
            in_ns(NS_B, || send_from_b(PORT, &later, multi_buffer));
            let want = if multi_buffer { 4 } else { 2 };
            let q = ring_with(&rings, want);
            assert_eq!(q, first, "the later frames came on another queue");
            let batch = socks[q].recv_batch(64);
            assert_eq!(received(&batch), later);
            drop(batch);
            let st = socks[q].stats();
            assert_eq!(st.rx_descs_refused, expected_refused, "{st:?}");
            assert_eq!(st.rx_multi_frame, u64::from(multi_buffer), "{st:?}");
            drop(rings);
            drop(fills);
            drop(socks);
            drop(prog);
        });
        // Let the queues be released before the next round binds them again.
        std::thread::sleep(Duration::from_millis(50));
    }
}
