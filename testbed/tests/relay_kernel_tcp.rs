//! The test relay's corruption and path MTU drop against the kernel's own TCP on the relay bed
//! (`scripts/netns-relay.sh`): a plain socket in `iwra` sends to one in `iwrb` through the
//! relay in `iwrr`.
//!
//! * Corruption: the segments the relay corrupts (their TCP checksums recomputed) are accepted
//!   by the receiving kernel (no checksum errors counted there) and reach the application with
//!   exactly the bits the relay flipped: only a check above TCP (MPA's CRC) could catch them.
//! * Path MTU drop: once the relay drops packets over the new MTU and answers them with ICMP
//!   "fragmentation needed", the sending kernel lowers its MSS (its route to the receiver
//!   carries the MTU) and the transfer completes byte-exact.
//!
//! Needs root; skips (or fails under `CI=true`) otherwise.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use testbed::relay::*;
use testbed::{in_ns, relay_bed_or_skip, spawn_in_ns};

const WAIT: Duration = Duration::from_secs(30);

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
        .collect()
}

fn relay(cfg: RelayConfig) -> Relay {
    Relay::start(RelayConfig {
        netns: Some(NS_RELAY.into()),
        dev_a: RELAY_DEV_A.into(),
        dev_b: RELAY_DEV_B.into(),
        lifetime: Duration::from_secs(120),
        ..cfg
    })
    .unwrap_or_else(|e| panic!("relay: {e}"))
}

/// The socket's current MSS (`TCP_MAXSEG`).
fn mss(s: &TcpStream) -> u32 {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live and sized for the call; the kernel writes at most `len`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_MAXSEG: {}", std::io::Error::last_os_error());
    v as u32
}

/// The kernel's `Tcp: InCsumErrors` in the calling thread's namespace.
fn tcp_checksum_errors() -> u64 {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp");
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().expect("Tcp names"), tcp.next().expect("Tcp"));
    let i = names
        .split_whitespace()
        .position(|n| n == "InCsumErrors")
        .expect("InCsumErrors");
    values
        .split_whitespace()
        .nth(i)
        .and_then(|v| v.parse().ok())
        .expect("InCsumErrors value")
}

/// Sends `data` from A to B over kernel TCP through the running relay; returns what B read
/// and A's MSS before and after.
fn transfer(port: u16, data: &[u8]) -> (Vec<u8>, u32, u32) {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let len = data.len();
    let receiver = spawn_in_ns(NS_B, move || -> std::io::Result<Vec<u8>> {
        let l = TcpListener::bind((ADDR_B, port))?;
        let _ = ready_tx.send(());
        l.set_nonblocking(true)?;
        let deadline = Instant::now() + WAIT;
        let mut s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(std::io::ErrorKind::TimedOut.into());
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e),
            }
        };
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(WAIT))?;
        let mut got = Vec::with_capacity(len);
        s.read_to_end(&mut got)?;
        Ok(got)
    });
    ready_rx.recv_timeout(WAIT).expect("receiver did not start");
    let data = data.to_vec();
    let (before, after) = in_ns(NS_A, move || {
        let addr = SocketAddr::from((ADDR_B, port));
        let mut s = TcpStream::connect_timeout(&addr, WAIT).expect("connect");
        s.set_write_timeout(Some(WAIT)).unwrap();
        let before = mss(&s);
        s.write_all(&data).expect("send");
        s.shutdown(std::net::Shutdown::Write).expect("shutdown");
        // Wait for the receiver's FIN: everything sent was acknowledged by then.
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).expect("close");
        (before, mss(&s))
    });
    let got = receiver.join().expect("receiver thread").expect("receiver");
    (got, before, after)
}

#[test]
fn corrupted_segments_pass_kernel_tcp_with_exactly_the_bits_flipped() {
    let _bed = relay_bed_or_skip!();
    const LEN: usize = 1 << 20;
    let r = relay(RelayConfig {
        seed: 31,
        corrupt: 0.5,
        corrupt_bits: 4,
        corrupt_toward: Toward::B,
        corrupt_start: Start::AfterBytes(100_000),
        corrupt_max: 8,
        ..RelayConfig::default()
    });
    let errors_before = in_ns(NS_B, tcp_checksum_errors);
    let data = pattern(LEN);
    let (got, _, _) = transfer(19_720, &data);
    let stats = r.stop().expect("relay");
    println!("relay: {stats:#?}");
    assert_eq!(got.len(), LEN);
    let bits: u64 = got
        .iter()
        .zip(&data)
        .map(|(a, b)| u64::from((a ^ b).count_ones()))
        .sum();
    let first = got.iter().zip(&data).position(|(a, b)| a != b);
    println!("{bits} bits differ, the first at octet {first:?}");
    assert_eq!(stats.a_to_b.corrupted, 8);
    assert_eq!(stats.b_to_a.corrupted, 0);
    assert_eq!(
        bits, stats.a_to_b.corrupted_bits,
        "every flipped bit arrived"
    );
    // Not before the segment in which the 100,000th octet came (of at most 1448).
    assert!(first.is_some_and(|i| i + 1448 >= 100_000), "{first:?}");
    assert_eq!(
        in_ns(NS_B, tcp_checksum_errors),
        errors_before,
        "the receiving kernel found no bad TCP checksum"
    );
}

#[test]
fn path_mtu_drop_makes_kernel_tcp_lower_its_mss() {
    let _bed = relay_bed_or_skip!();
    const LEN: usize = 4 << 20;
    const MTU: u16 = 1200;
    let r = relay(RelayConfig {
        seed: 32,
        path_mtu: Some(PathMtu::new(MTU, Start::AfterBytes(256 << 10))),
        ..RelayConfig::default()
    });
    let data = pattern(LEN);
    let t = Instant::now();
    let (got, before, after) = transfer(19_721, &data);
    let took = t.elapsed();
    let stats = r.stop().expect("relay");
    println!("relay: {stats:#?}");
    let route = Command::new("ip")
        .args(["-n", NS_A, "route", "get", &ADDR_B.to_string()])
        .output()
        .expect("ip route get");
    let route = String::from_utf8_lossy(&route.stdout);
    println!(
        "A's MSS {before} -> {after}; {took:?}; route: {}",
        route.trim()
    );
    assert!(got == data, "the transfer is byte-exact");
    let d = &stats.a_to_b;
    assert!(d.mtu_dropped > 0 && d.icmp_sent > 0, "{d:?}");
    assert_eq!(
        d.icmp_sent, d.mtu_dropped,
        "every dropped segment had DF set"
    );
    // 1500 - 40 - 12 (timestamps) before, 1200 - 40 - 12 after.
    assert_eq!(before, 1448);
    assert_eq!(after, u32::from(MTU) - 52);
    assert!(route.contains(&format!("mtu {MTU}")), "{route}");
    // Nothing from B was large.
    assert_eq!(stats.b_to_a.mtu_dropped, 0);
}
