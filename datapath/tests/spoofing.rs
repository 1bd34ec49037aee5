//! Neighbour-cache poisoning from the peer's namespace: while a peer (socket transport, in
//! `iwb`) moves verified data with the AF_XDP engine (in `iwa`), raw frames from an
//! `AF_PACKET` socket in `iwb` carry SYNs that spoof the peer's IPv4 address from another MAC,
//! valid and with bad checksums. The engine must keep answering the real peer: the transfer
//! stays intact, and the spoofed half-open connections are the only thing the SYNs make.
//! A SYN forged from an address the engine knows nothing of, from a MAC nobody has, does not
//! keep the real host of that address from connecting.
//! A SYN flood: 100,000 SYNs from spoofed addresses that never answer, while a transfer
//! runs and a new client connects: the listener answers with SYN cookies once its half-open
//! queue is full, and both connections carry verified data.
//! Needs root and the veth bed (`SKIPPED` without, a failure under `CI=true`).

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::{
    Access, CompletionQueue, ConnectParams, MemoryRegion, ProtectionDomain, SendOp, SendWr, Stag,
    WcStatus,
};
use tcp_engine::wire::{
    EthernetFrame, EthernetRepr, SegmentRepr, TcpFlags, TcpOptions, ETHERTYPE_IPV4,
};
use testbed::*;

const PORT: u16 = 19_571;
const WAIT: Duration = Duration::from_secs(20);
const LEN: usize = 64 << 10;
const FORGED_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x66, 0x66];

fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    }
}

/// The MAC address of `dev` in namespace `ns`.
fn mac_of(ns: &str, dev: &str) -> [u8; 6] {
    let out = Command::new("ip")
        .args(["-n", ns, "-o", "link", "show", dev])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC in {text:?}"));
    let mut mac = [0u8; 6];
    for (m, part) in mac.iter_mut().zip(hex.split(':')) {
        *m = u8::from_str_radix(part, 16).expect("hex");
    }
    mac
}

/// A raw Ethernet socket on `dev` of the calling thread's namespace.
struct RawSocket(i32);

impl RawSocket {
    fn on(dev: &str) -> RawSocket {
        let name = std::ffi::CString::new(dev).unwrap();
        // SAFETY: plain system calls with arguments on our stack; the descriptor is owned by
        // the value returned and closed on drop.
        unsafe {
            let ifindex = libc::if_nametoindex(name.as_ptr());
            assert_ne!(ifindex, 0, "no interface {dev}");
            let fd = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                i32::from((libc::ETH_P_ALL as u16).to_be()),
            );
            assert!(
                fd >= 0,
                "AF_PACKET socket: {}",
                std::io::Error::last_os_error()
            );
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_ifindex = ifindex as i32;
            sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
            let rc = libc::bind(
                fd,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
            RawSocket(fd)
        }
    }

    /// Sends `frame`; while the device's queue is full (`ENOBUFS`: the flood outruns veth),
    /// waits and tries again, for at most 5 s.
    fn send(&self, frame: &[u8]) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            // SAFETY: sends `frame.len()` octets from a live slice on our bound socket.
            let n = unsafe { libc::send(self.0, frame.as_ptr().cast(), frame.len(), 0) };
            if n == frame.len() as isize {
                return;
            }
            let e = std::io::Error::last_os_error();
            let full = matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::EAGAIN));
            assert!(
                n < 0 && full && std::time::Instant::now() < deadline,
                "raw send: {n}: {e}"
            );
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        // SAFETY: closes the descriptor this value owns.
        unsafe { libc::close(self.0) };
    }
}

/// A SYN from `ADDR_B:src_port` (the peer's address) to the engine's listening port, from
/// the forger's MAC; with `bad_checksum` its TCP checksum is off by one.
fn forged_syn(dst_mac: [u8; 6], src_port: u16, bad_checksum: bool) -> Vec<u8> {
    syn_from(dst_mac, ADDR_B, src_port, PORT, bad_checksum)
}

fn syn_from(
    dst_mac: [u8; 6],
    src_addr: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    bad_checksum: bool,
) -> Vec<u8> {
    let seg = SegmentRepr {
        tos: 0,
        src_addr,
        dst_addr: ADDR_A,
        src_port,
        dst_port,
        seq: 0x1234_5678 ^ u32::from(src_port),
        ack: 0,
        flags: TcpFlags {
            syn: true,
            ..TcpFlags::default()
        },
        window: 64_000,
        options: {
            let mut o = TcpOptions::default();
            o.mss = Some(1460);
            o
        },
        payload: b"",
    };
    let mut frame = vec![0u8; 14 + seg.packet_len()];
    EthernetRepr {
        src: FORGED_MAC,
        dst: dst_mac,
        ethertype: ETHERTYPE_IPV4,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut frame[..]));
    let n = seg.emit(&mut frame[14..]).expect("emit");
    frame.truncate(14 + n);
    if bad_checksum {
        // TCP checksum field: 14 (Ethernet) + 20 (IPv4) + 16.
        frame[14 + 20 + 16] ^= 1;
    }
    frame
}

/// The engine's side: `conns` connections on `port`, each with a region the peer writes into
/// and reads back from; returns the engine's counters.
fn server(
    port: u16,
    conns: usize,
    ready: mpsc::Sender<()>,
    done: mpsc::Receiver<()>,
) -> Result<datapath::engine::EngineCounters, String> {
    let mut engine =
        XdpEngine::start(DEV_A, XdpEngineConfig::default()).map_err(|e| e.to_string())?;
    let listener = engine.listen(port, params()).map_err(|e| e.to_string())?;
    let _ = ready.send(());
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let mut accepted = Vec::new();
    for _ in 0..conns {
        let req = listener
            .accept_timeout(WAIT)
            .map_err(|e| e.to_string())?
            .ok_or("no connection")?;
        let mr = pd
            .register(
                LEN,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .map_err(|e| e.to_string())?;
        let mut offer = mr.stag().0.to_be_bytes().to_vec();
        offer.extend_from_slice(&mr.base_to().to_be_bytes());
        let conn = req.accept(&pd, &cq, &offer).map_err(|e| e.to_string())?;
        accepted.push((conn, mr));
    }
    let _ = done.recv_timeout(WAIT * 3);
    for (conn, _) in accepted {
        let st = conn.qp.status();
        drop(conn);
        // The peer closes when it is done; anything else ended the connection early.
        if !matches!(st.error, None | Some(datapath::QpError::PeerClosed)) {
            return Err(format!("the engine's connection ended: {st:?}"));
        }
    }
    // Stopped, its threads publish their last counters (running, every 50 ms or so).
    drop(listener);
    engine.stop();
    Ok(engine.counters())
}

/// The peer's side of one connection: the queue pair and the engine's region.
struct Peer {
    conn: datapath::Connection,
    remote: (Stag, u64),
}

fn connect_peer(port: u16, cq: &CompletionQueue, pd: &ProtectionDomain) -> Result<Peer, String> {
    let conn = datapath::connect(SocketAddr::from((ADDR_A, port)), pd, cq, &params(), b"")
        .map_err(|e| format!("connect: {e}"))?;
    let p = &conn.private_data;
    let remote = (
        Stag(u32::from_be_bytes(p[..4].try_into().unwrap())),
        u64::from_be_bytes(p[4..12].try_into().unwrap()),
    );
    Ok(Peer { conn, remote })
}

/// One verified round: Write a pattern into the engine's region, Read it back.
fn round(
    qp: &datapath::QueuePair,
    cq: &CompletionQueue,
    src: &MemoryRegion,
    sink: &MemoryRegion,
    remote: (Stag, u64),
    seed: u8,
) -> Result<(), String> {
    let data: Vec<u8> = (0..LEN)
        .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
        .collect();
    src.write(0, &data);
    let post = |wr_id, op, mr: &MemoryRegion| {
        qp.post_send(SendWr {
            wr_id,
            op,
            sg_list: mr.sge(0, LEN as u32).into(),
            signaled: true,
            fence: false,
        })
        .map_err(|e| e.to_string())
    };
    let (stag, to) = remote;
    post(
        1,
        SendOp::Write {
            remote_stag: stag,
            remote_to: to,
        },
        src,
    )?;
    post(
        2,
        SendOp::Read {
            remote_stag: stag,
            remote_to: to,
        },
        sink,
    )?;
    for _ in 0..2 {
        let c = cq
            .wait(WAIT)
            .ok_or_else(|| format!("round {seed}: no completion; {:?}", qp.status()))?;
        if c.wc.status != WcStatus::Success {
            return Err(format!("round {seed}: {c:?}; {:?}", qp.status()));
        }
    }
    let mut back = vec![0u8; LEN];
    sink.read(0, &mut back);
    if back != data {
        return Err(format!("round {seed}: Read brought back other bytes"));
    }
    Ok(())
}

#[test]
fn syns_spoofing_a_connected_peer_leave_its_transfer_intact() {
    let _bed = bed_or_skip!();
    let engine_mac = mac_of(NS_A, DEV_A);
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let srv = spawn_in_ns(NS_A, move || server(PORT, 1, ready_tx, done_rx));
    ready_rx.recv_timeout(WAIT).expect("engine ready");
    let peer = spawn_in_ns(NS_B, move || -> Result<u32, String> {
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let src = pd.register(LEN, Access::NONE).map_err(|e| e.to_string())?;
        let sink = pd
            .register(LEN, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let Peer { conn, remote } = connect_peer(PORT, &cq, &pd)?;
        let raw = RawSocket::on(DEV_B);
        let mut rounds = 0;
        round(&conn.qp, &cq, &src, &sink, remote, 1)?;
        rounds += 1;
        // 1,000 forged SYNs, a valid and a bad checksum in turn, from other ports of the
        // peer's address, between verified rounds.
        for burst in 0..10u16 {
            for k in 0..100u16 {
                let port = 20_000 + burst * 100 + k;
                raw.send(&forged_syn(engine_mac, port, k % 2 == 1));
            }
            round(&conn.qp, &cq, &src, &sink, remote, burst as u8 + 2)?;
            rounds += 1;
        }
        drop(conn);
        Ok(rounds)
    });
    let rounds = peer.join().expect("peer thread");
    let _ = done_tx.send(());
    let served = srv.join().expect("engine thread");
    let rounds = rounds.unwrap_or_else(|e| panic!("peer: {e}"));
    served.unwrap_or_else(|e| panic!("engine: {e}"));
    assert_eq!(rounds, 11);
}

const FLOOD_PORT: u16 = 19_572;
const FLOOD: u32 = 100_000;

/// 100,000 SYNs from 100 spoofed addresses that never answer (10.77.0.100-199, from the
/// forger's MAC) while a connection moves verified data, and a new client connects in the
/// middle of it: the engine's half-open queue fills (backlog 64), then every SYN is answered
/// with a SYN cookie and nothing is kept; the new client's connection comes from its cookie.
#[test]
fn a_syn_flood_leaves_new_clients_and_running_transfers_intact() {
    let _bed = bed_or_skip!();
    let engine_mac = mac_of(NS_A, DEV_A);
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let srv = spawn_in_ns(NS_A, move || server(FLOOD_PORT, 2, ready_tx, done_rx));
    ready_rx.recv_timeout(WAIT).expect("engine ready");
    let peer = spawn_in_ns(NS_B, move || -> Result<(u32, Duration), String> {
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let src = pd.register(LEN, Access::NONE).map_err(|e| e.to_string())?;
        let sink = pd
            .register(LEN, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let first = connect_peer(FLOOD_PORT, &cq, &pd)?;
        round(&first.conn.qp, &cq, &src, &sink, first.remote, 1)?;
        let (filled_tx, filled_rx) = mpsc::channel();
        let flood = spawn_in_ns(NS_B, move || {
            let raw = RawSocket::on(DEV_B);
            let started = std::time::Instant::now();
            for i in 0..FLOOD {
                let from = Ipv4Addr::new(10, 77, 0, 100 + (i % 100) as u8);
                let port = 1024 + (i / 100) as u16;
                raw.send(&syn_from(engine_mac, from, port, FLOOD_PORT, false));
                if i == FLOOD / 10 {
                    let _ = filled_tx.send(());
                }
            }
            started.elapsed()
        });
        // The new client, once the flood has filled every shard's half-open queue: 10,000
        // SYNs, spread over the queues by their flows, ahead of the client's SYN in each ring.
        filled_rx
            .recv_timeout(WAIT)
            .map_err(|_| "the flood did not start")?;
        let second = connect_peer(FLOOD_PORT, &cq, &pd)?;
        let mut rounds = 1;
        let mut seed = 2u8;
        while !flood.is_finished() || rounds < 6 {
            for p in [&first, &second] {
                round(&p.conn.qp, &cq, &src, &sink, p.remote, seed)?;
                seed = seed.wrapping_add(1);
                rounds += 1;
            }
        }
        let took = flood.join().map_err(|_| "flood thread")?;
        drop((first, second));
        Ok((rounds, took))
    });
    let result = peer.join().expect("peer thread");
    let _ = done_tx.send(());
    let counters = srv.join().expect("engine thread");
    let (rounds, took) = result.unwrap_or_else(|e| panic!("peer: {e}"));
    let counters = counters.unwrap_or_else(|e| panic!("engine: {e}"));
    let t = &counters.driver.table;
    println!(
        "{FLOOD} spoofed SYNs in {took:?}; {rounds} verified rounds; cookies sent {}, dropped {}, \
         validated {}, failed {}; half-open connections made {}; backlog drops {}",
        t.syncookies_sent,
        t.syncookies_dropped,
        t.syncookies_validated,
        t.syncookies_failed,
        t.passive_opens,
        t.backlog_drops
    );
    assert!(t.syncookies_sent > 0, "no SYN cookies: {t:?}");
    assert_eq!(
        t.syncookies_validated, 1,
        "the new client did not come through its cookie"
    );
    // The first client, each shard's half-open queue (the backlog, 64, per queue), the new
    // client: nothing more was kept.
    let kept = u64::from(QUEUES) * XdpEngineConfig::default().backlog as u64 + 2;
    assert!(t.passive_opens <= kept, "{t:?}");
}

const UNSEEN_PORT: u16 = 19_573;

/// A SYN forged from an address the engine knows nothing of yet, from a MAC nobody has: the
/// engine takes that MAC for the address (its SYN-ACK has to go somewhere), but only until a
/// real SYN from the address comes. Before, the forger's MAC stayed, so the real host's
/// SYN-ACKs went nowhere and it could not connect at all.
#[test]
fn a_syn_forged_from_an_unseen_address_does_not_keep_its_host_out() {
    let _bed = bed_or_skip!();
    const HOST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 50);
    let engine_mac = mac_of(NS_A, DEV_A);
    let added = Command::new("ip")
        .args(["-n", NS_B, "addr", "add", "10.77.0.50/24", "dev", DEV_B])
        .status()
        .expect("ip addr add");
    assert!(added.success(), "a second address for the host in {NS_B}");
    // One engine thread: the forged SYN and the host's land on the same next-hop cache
    // (with a shard per queue they may not, and the host's shard would know nothing yet).
    let config = XdpEngineConfig {
        shard_per_queue: false,
        ..XdpEngineConfig::default()
    };
    let engine = in_ns(NS_A, || XdpEngine::start(DEV_A, config)).expect("engine");
    let _listener = in_ns(NS_A, || engine.listen(UNSEEN_PORT, params())).expect("listen");
    let connected = in_ns(NS_B, || {
        // From a port outside the kernel's ephemeral range (32768-60999).
        RawSocket::on(DEV_B).send(&syn_from(engine_mac, HOST, 20_001, UNSEEN_PORT, false));
        // The forger's MAC learnt first: the engine made a half-open connection of its SYN
        // (counters are published every 50 ms or so).
        let deadline = std::time::Instant::now() + WAIT;
        while engine.counters().driver.table.passive_opens == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the forged SYN was not answered"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        s.bind(&SocketAddr::from((HOST, 0)).into())
            .expect("bind the host's address");
        s.connect_timeout(
            &SocketAddr::from((ADDR_A, UNSEEN_PORT)).into(),
            Duration::from_secs(4),
        )
    });
    connected.expect("the real host connects after a forged SYN from its address");
}
