//! Hostile and slow peers during MPA startup, attacking a listener in `iwa` (the AF_XDP engine
//! or the socket transport) from the peer namespace `iwb` with raw kernel TCP: silent and slow
//! Requests and one the application never answers are cut off at their deadlines while another
//! client connects at once; malformed Requests are refused with the MPA error RFC 5044 names
//! (seen in `Listener::stats`), closing that connection only; Requests beyond the backlog are
//! rejected; an Initiator that receives an FPDU instead of the Reply fails with `InvalidKey`,
//! and one whose responder leaves before its Reply with `ConnectionLost`; a responder whose
//! queue pair fails before the peer's first FPDU closes at once, sending no Terminate.
//! Needs root and the veth bed (`SKIPPED` without, a failure under `CI=true`).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use datapath::engine::XdpEngineConfig;
use datapath::{
    CmEvent, CmEventChannel, CompletionQueue, ConnectParams, ConnectRequest, DatapathError, Device,
    ListenStats, MpaConfig, ProtectionDomain, Transport,
};
use mpa::MpaError;
use testbed::*;

const WAIT: Duration = Duration::from_secs(20);
/// The startup and accept deadlines of the listener under attack.
const DEADLINE: Duration = Duration::from_secs(2);

fn params(backlog: usize) -> ConnectParams {
    ConnectParams {
        mpa: MpaConfig {
            timeout: DEADLINE,
            accept_timeout: DEADLINE,
            ..MpaConfig::default()
        },
        setup_timeout: Duration::from_secs(10),
        backlog,
        ..ConnectParams::default()
    }
}

fn device(engine: bool) -> Device {
    let transport = if engine {
        Transport::Xdp {
            ifname: DEV_A.into(),
            config: Box::new(XdpEngineConfig::default()),
        }
    } else {
        Transport::Socket
    };
    Device::open(transport).expect("open the device in iwa")
}

/// A valid MPA Request (revision 1 keeps the frame simple to corrupt) with `private_data`.
fn request(private_data: &[u8]) -> Vec<u8> {
    let config = MpaConfig {
        rev: 1,
        ..MpaConfig::default()
    };
    mpa::Initiator::new(config, private_data, Instant::now())
        .expect("request")
        .request()
        .to_vec()
}

/// Whether the listener closed `s` within `within` (EOF or reset), having sent nothing.
fn closed_silently(s: &mut TcpStream, within: Duration) -> Result<(), String> {
    s.set_read_timeout(Some(within))
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => Ok(()),
        Ok(n) => Err(format!("the listener sent {n} octets instead of closing")),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
        Err(e) => Err(format!("not closed within {within:?}: {e}")),
    }
}

/// The listener side in `iwa`: hands out the listener to `body` once the peer may start.
fn serve<T: Send + 'static>(
    engine: bool,
    port: u16,
    backlog: usize,
    ready: mpsc::Sender<()>,
    body: impl FnOnce(&datapath::Listener, &Device) -> Result<T, String> + Send + 'static,
) -> std::thread::JoinHandle<Result<T, String>> {
    spawn_in_ns(NS_A, move || {
        let dev = device(engine);
        let listener = dev
            .listen(SocketAddr::from((ADDR_A, port)), params(backlog))
            .map_err(|e| format!("listen: {e}"))?;
        let _ = ready.send(());
        body(&listener, &dev)
    })
}

/// Accepts the next Request within `within`.
fn next(listener: &datapath::Listener, within: Duration) -> Result<ConnectRequest, String> {
    listener
        .accept_timeout(within)
        .map_err(|e| format!("accept: {e}"))?
        .ok_or_else(|| format!("no Request within {within:?} ({:?})", listener.stats()))
}

fn good_client(port: u16, private_data: &[u8]) -> Result<Duration, String> {
    let start = Instant::now();
    let pd = ProtectionDomain::new();
    let cq = CompletionQueue::new();
    let conn = datapath::connect(
        SocketAddr::from((ADDR_A, port)),
        &pd,
        &cq,
        &params(64),
        private_data,
    )
    .map_err(|e| format!("the good client's connect: {e}"))?;
    let took = start.elapsed();
    drop(conn);
    Ok(took)
}

fn slow_silent_and_unanswered(engine: bool, port: u16) {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let server = serve(engine, port, 64, ready_tx, move |listener, _dev| {
        // The Request nobody answers arrives first, then the good client's (which the peer
        // starts once told that the first is here).
        let held = next(listener, WAIT)?;
        if held.private_data() != b"hold" {
            return Err("expected the held Request first".into());
        }
        let _ = held_tx.send(());
        let good = next(listener, WAIT)?;
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let conn = good
            .accept(&pd, &cq, b"welcome")
            .map_err(|e| format!("accepting the good client: {e}"))?;
        // Past the accept deadline, the held Request's connection is gone.
        std::thread::sleep(DEADLINE + Duration::from_millis(1500));
        let late = held.accept(&pd, &cq, b"too late");
        drop(conn);
        Ok((late.err().map(|e| e.to_string()), listener.stats()))
    });
    ready_rx.recv_timeout(WAIT).expect("listener ready");
    let peer = spawn_in_ns(NS_B, move || -> Result<(), String> {
        let addr = SocketAddr::from((ADDR_A, port));
        let connect = || TcpStream::connect_timeout(&addr, WAIT).map_err(|e| e.to_string());
        let start = Instant::now();
        let mut silent = connect()?;
        let mut slow = connect()?;
        let mut held = connect()?;
        held.write_all(&request(b"hold"))
            .map_err(|e| e.to_string())?;
        // The slow one drips its Request, an octet every 300 ms (it would need 7 s).
        let drip = std::thread::spawn(move || {
            for octet in request(b"slow") {
                if slow.write_all(&[octet]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
            closed_silently(&mut slow, WAIT)
        });
        held_rx
            .recv_timeout(WAIT)
            .map_err(|_| "the listener never handed out the held Request")?;
        let took = good_client(port, b"good")?;
        if took > Duration::from_secs(1) {
            return Err(format!(
                "the good client waited {took:?} behind the slow ones"
            ));
        }
        closed_silently(&mut silent, WAIT).map_err(|e| format!("silent peer: {e}"))?;
        let cut = start.elapsed();
        if cut < DEADLINE - Duration::from_millis(200) || cut > DEADLINE * 3 {
            return Err(format!(
                "silent peer cut off after {cut:?}, deadline {DEADLINE:?}"
            ));
        }
        drip.join()
            .map_err(|_| "drip thread")?
            .map_err(|e| format!("slow peer: {e}"))?;
        // The held connection is closed at the accept deadline; the Reply never came.
        closed_silently(&mut held, WAIT).map_err(|e| format!("unanswered peer: {e}"))?;
        let cut = start.elapsed();
        if cut < DEADLINE - Duration::from_millis(200) || cut > DEADLINE * 3 {
            return Err(format!("unanswered peer cut off after {cut:?}"));
        }
        Ok(())
    });
    let peer = peer.join().expect("peer thread");
    let (late, stats) = server.join().expect("server thread").expect("server");
    peer.expect("peer");
    println!("engine {engine}: late accept: {late:?}; {stats:?}");
    assert!(late.is_some(), "accepting after the deadline succeeded");
    assert_eq!(stats.accept_timeouts, 1, "{stats:?}");
    assert_eq!(stats.startup_timeouts, 2, "{stats:?}");
    assert_eq!(stats.refused, 0, "{stats:?}");
}

#[test]
fn engine_slow_silent_and_unanswered_peers_are_cut_off_while_another_connects() {
    slow_silent_and_unanswered(true, 19_611);
}

#[test]
fn socket_slow_silent_and_unanswered_peers_are_cut_off_while_another_connects() {
    slow_silent_and_unanswered(false, 19_612);
}

/// A malformed Request: what it is, its octets, and the MPA error it must be refused with.
type Malformed = (&'static str, Vec<u8>, fn(&MpaError) -> bool);

fn malformed() -> Vec<Malformed> {
    let good = request(b"x");
    let mut bad_key = good.clone();
    bad_key[4] ^= 0x20;
    let mut rev0 = good.clone();
    rev0[17] = 0;
    let mut too_long = good[..18].to_vec();
    too_long.extend_from_slice(&600u16.to_be_bytes());
    too_long.extend_from_slice(&[0u8; 600]);
    vec![
        ("bad key", bad_key, |e| matches!(e, MpaError::InvalidKey)),
        ("revision 0", rev0, |e| {
            matches!(e, MpaError::UnsupportedRevision { rev: 0 })
        }),
        ("PD_Length 600", too_long, |e| {
            matches!(e, MpaError::PrivateDataTooLong { len: 600, .. })
        }),
    ]
}

fn wait_stats(
    listener: &datapath::Listener,
    done: impl Fn(&ListenStats) -> bool,
) -> Result<ListenStats, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let stats = listener.stats();
        if done(&stats) {
            return Ok(stats);
        }
        if Instant::now() >= deadline {
            return Err(format!("stats never got there: {stats:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn malformed_requests(engine: bool, port: u16) {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (sent_tx, sent_rx) = mpsc::channel::<usize>();
    let (seen_tx, seen_rx) = mpsc::channel::<()>();
    let server = serve(engine, port, 64, ready_tx, move |listener, _dev| {
        let cases = malformed();
        for (i, (what, _, named)) in cases.iter().enumerate() {
            let n = sent_rx.recv_timeout(WAIT).map_err(|_| "peer gone")?;
            assert_eq!(n, i);
            let stats = wait_stats(listener, |s| s.refused == i as u64 + 1)?;
            let error = stats.last_refusal.clone().ok_or("no error recorded")?;
            if !named(&error) {
                return Err(format!("{what}: refused with {error:?}"));
            }
            println!("engine {engine}: {what}: {error} (code {})", error.code());
            let _ = seen_tx.send(());
        }
        // The truncated one and a good client: the listener still serves.
        let good = next(listener, WAIT)?;
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let conn = good
            .accept(&pd, &cq, b"")
            .map_err(|e| format!("accept after the attacks: {e}"))?;
        drop(conn);
        Ok(listener.stats())
    });
    ready_rx.recv_timeout(WAIT).expect("listener ready");
    let peer = spawn_in_ns(NS_B, move || -> Result<(), String> {
        let addr = SocketAddr::from((ADDR_A, port));
        for (i, (what, bytes, _)) in malformed().into_iter().enumerate() {
            let mut s = TcpStream::connect_timeout(&addr, WAIT).map_err(|e| e.to_string())?;
            s.write_all(&bytes).map_err(|e| e.to_string())?;
            let _ = sent_tx.send(i);
            closed_silently(&mut s, WAIT).map_err(|e| format!("{what}: {e}"))?;
            seen_rx.recv_timeout(WAIT).map_err(|_| "listener gone")?;
        }
        // Truncated: half a Request, then the end of the stream.
        let mut s = TcpStream::connect_timeout(&addr, WAIT).map_err(|e| e.to_string())?;
        s.write_all(&request(b"cut")[..10])
            .map_err(|e| e.to_string())?;
        s.shutdown(std::net::Shutdown::Write)
            .map_err(|e| e.to_string())?;
        closed_silently(&mut s, WAIT).map_err(|e| format!("truncated: {e}"))?;
        good_client(port, b"good")?;
        Ok(())
    });
    peer.join().expect("peer thread").expect("peer");
    let stats = server.join().expect("server thread").expect("server");
    println!("engine {engine}: {stats:?}");
    assert_eq!(stats.refused, 3, "{stats:?}");
    assert_eq!(stats.closed_early, 1, "{stats:?}");
}

#[test]
fn engine_malformed_requests_are_refused_and_the_listener_goes_on() {
    malformed_requests(true, 19_613);
}

#[test]
fn socket_malformed_requests_are_refused_and_the_listener_goes_on() {
    malformed_requests(false, 19_614);
}

/// Peers that complete TCP's handshake and send no Request: an engine shard keeps at most a
/// quarter of its connection table waiting for Requests (4 of 16 here); one more is
/// reset at once (`ListenStats::over_starting`), so that such peers cannot take the whole
/// table for the startup deadline at a time. Once those connections end, a client connects
/// at once.
#[test]
fn engine_connections_waiting_for_their_request_are_bounded() {
    let _bed = bed_or_skip!();
    const PORT: u16 = 19_602;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let server = spawn_in_ns(NS_A, move || -> Result<ListenStats, String> {
        // One shard: one table of 16, 4 of them for connections waiting for a Request.
        let mut config = XdpEngineConfig {
            shard_per_queue: false,
            ..XdpEngineConfig::default()
        };
        config.driver.max_connections = 16;
        let dev = Device::open(Transport::Xdp {
            ifname: DEV_A.into(),
            config: Box::new(config),
        })
        .map_err(|e| format!("open: {e}"))?;
        let listener = dev
            .listen(SocketAddr::from((ADDR_A, PORT)), params(64))
            .map_err(|e| format!("listen: {e}"))?;
        let _ = ready_tx.send(());
        let good = next(&listener, WAIT)?;
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let conn = good
            .accept(&pd, &cq, b"welcome")
            .map_err(|e| format!("accepting the good client: {e}"))?;
        let _ = done_rx.recv_timeout(WAIT);
        drop(conn);
        Ok(listener.stats())
    });
    ready_rx.recv_timeout(WAIT).expect("listener ready");
    let peer = spawn_in_ns(NS_B, move || -> Result<(), String> {
        let addr = SocketAddr::from((ADDR_A, PORT));
        let connect = || TcpStream::connect_timeout(&addr, WAIT).map_err(|e| e.to_string());
        let silent: Vec<TcpStream> = (0..4)
            .map(|i| connect().map_err(|e| format!("silent connection {i}: {e}")))
            .collect::<Result<_, _>>()?;
        // Let the engine take the four before the fifth comes.
        std::thread::sleep(Duration::from_millis(200));
        let start = Instant::now();
        // Reset as soon as the handshake completes: the reset may reach the connect itself.
        match TcpStream::connect_timeout(&addr, WAIT) {
            Ok(mut over) => {
                closed_silently(&mut over, WAIT).map_err(|e| format!("the fifth: {e}"))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => return Err(format!("the fifth's connect: {e}")),
        }
        if start.elapsed() > DEADLINE / 2 {
            return Err(format!(
                "the fifth was cut off after {:?}, not at once",
                start.elapsed()
            ));
        }
        // The four end (their FINs end their startups): a client is taken at once again.
        drop(silent);
        std::thread::sleep(Duration::from_millis(200));
        let took = good_client(PORT, b"good")?;
        if took > Duration::from_secs(1) {
            return Err(format!("the good client waited {took:?}"));
        }
        Ok(())
    });
    let peer = peer.join().expect("peer thread");
    let _ = done_tx.send(());
    let stats = server.join().expect("server thread");
    println!("{stats:?}");
    peer.expect("peer");
    let stats = stats.expect("server");
    assert!(stats.over_starting >= 1, "{stats:?}");
}

/// With a backlog of 2 unanswered Requests, a third is rejected (Reply with R=1), and once
/// the application answers one, a new Request is taken again.
fn backlog(engine: bool, port: u16) {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (step_tx, step_rx) = mpsc::channel::<()>();
    let (back_tx, back_rx) = mpsc::channel::<()>();
    let server = serve(engine, port, 2, ready_tx, move |listener, _dev| {
        step_rx.recv_timeout(WAIT).map_err(|_| "peer gone")?;
        let stats = wait_stats(listener, |s| s.over_backlog == 1)?;
        // Take the two waiting ones; reject both; the next Request gets through.
        let a = next(listener, WAIT)?;
        let b = next(listener, WAIT)?;
        a.reject(b"").map_err(|e| e.to_string())?;
        b.reject(b"").map_err(|e| e.to_string())?;
        let _ = back_tx.send(());
        let c = next(listener, WAIT)?;
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let conn = c
            .accept(&pd, &cq, b"")
            .map_err(|e| format!("accept after the backlog drained: {e}"))?;
        drop(conn);
        Ok(stats)
    });
    ready_rx.recv_timeout(WAIT).expect("listener ready");
    let peer = spawn_in_ns(NS_B, move || -> Result<(), String> {
        let addr = SocketAddr::from((ADDR_A, port));
        let mut waiting = Vec::new();
        for i in 0..2 {
            let mut s = TcpStream::connect_timeout(&addr, WAIT).map_err(|e| e.to_string())?;
            s.write_all(&request(format!("wait{i}").as_bytes()))
                .map_err(|e| e.to_string())?;
            waiting.push(s);
        }
        std::thread::sleep(Duration::from_millis(300));
        let mut third = TcpStream::connect_timeout(&addr, WAIT).map_err(|e| e.to_string())?;
        third
            .write_all(&request(b"third"))
            .map_err(|e| e.to_string())?;
        // The third gets a Reply with R=1, then the end of the stream.
        rejected(&mut third).map_err(|e| format!("the third Request: {e}"))?;
        let _ = step_tx.send(());
        back_rx.recv_timeout(WAIT).map_err(|_| "listener gone")?;
        good_client(port, b"after")?;
        drop(waiting);
        Ok(())
    });
    peer.join().expect("peer thread").expect("peer");
    let stats = server.join().expect("server thread").expect("server");
    assert_eq!(stats.over_backlog, 1, "{stats:?}");
}

/// Requests waiting for the application when it drops its listener are rejected (Reply with
/// R=1), as a dropped `ConnectRequest` is, not closed bare: with a backlog of 1 and two
/// Requests, one waits and one is rejected over the backlog; dropping the listener rejects
/// the one that waited.
fn waiting_requests_of_a_dropped_listener(engine: bool, port: u16) {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (step_tx, step_rx) = mpsc::channel::<()>();
    let server = serve(engine, port, 1, ready_tx, move |listener, _dev| {
        step_rx.recv_timeout(WAIT).map_err(|_| "peer gone")?;
        // Returning drops the listener with one Request waiting.
        wait_stats(listener, |s| s.over_backlog == 1)
    });
    ready_rx.recv_timeout(WAIT).expect("listener ready");
    let peer = spawn_in_ns(NS_B, move || -> Result<(), String> {
        let addr = SocketAddr::from((ADDR_A, port));
        let mut clients = Vec::new();
        for i in 0..2 {
            let mut s = TcpStream::connect_timeout(&addr, WAIT).map_err(|e| e.to_string())?;
            s.write_all(&request(format!("wait{i}").as_bytes()))
                .map_err(|e| e.to_string())?;
            clients.push(s);
        }
        let _ = step_tx.send(());
        for (i, s) in clients.iter_mut().enumerate() {
            rejected(s).map_err(|e| format!("Request {i}: {e}"))?;
        }
        Ok(())
    });
    let stats = server.join().expect("server thread").expect("server");
    peer.join().expect("peer thread").expect("peer");
    assert_eq!(stats.over_backlog, 1, "{stats:?}");
}

#[test]
fn engine_requests_waiting_on_a_dropped_listener_are_rejected() {
    waiting_requests_of_a_dropped_listener(true, 19_673);
}

#[test]
fn socket_requests_waiting_on_a_dropped_listener_are_rejected() {
    waiting_requests_of_a_dropped_listener(false, 19_620);
}

#[test]
fn engine_requests_beyond_the_backlog_are_rejected() {
    backlog(true, 19_615);
}

#[test]
fn socket_requests_beyond_the_backlog_are_rejected() {
    backlog(false, 19_616);
}

/// Whether `s` gets a Reply with R=1 (byte 16, bit 0x20) within `WAIT`.
fn rejected(s: &mut TcpStream) -> Result<(), String> {
    s.set_read_timeout(Some(WAIT)).map_err(|e| e.to_string())?;
    let mut reply = [0u8; 20];
    s.read_exact(&mut reply)
        .map_err(|e| format!("no Reply: {e}"))?;
    if &reply[..16] != b"MPA ID Rep Frame" || reply[16] & 0x20 == 0 {
        return Err(format!("got {reply:02x?}, not a rejection"));
    }
    Ok(())
}

/// Through an event channel (`Listener::notify`) the backlog holds as with `accept`: with a
/// backlog of 2 and an application that answers nothing, 2 requests reach the channel, 2 more
/// wait in the listener, and the rest get a Reply with R=1 (before, the listener's thread
/// moved every Request onto the channel at once: no Request was ever refused, and each held
/// its descriptor until its accept deadline, a flood of valid Requests took them all).
/// Answering one lets the next in.
fn backlog_through_an_event_channel(engine: bool, port: u16) {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (step_tx, step_rx) = mpsc::channel::<()>();
    let (back_tx, back_rx) = mpsc::channel::<()>();
    let server = spawn_in_ns(NS_A, move || -> Result<(ListenStats, usize), String> {
        let dev = device(engine);
        let mut p = params(2);
        // Nothing here expires while the test looks.
        p.mpa.accept_timeout = WAIT;
        let listener = dev
            .listen(SocketAddr::from((ADDR_A, port)), p)
            .map_err(|e| format!("listen: {e}"))?;
        let channel = CmEventChannel::new().map_err(|e| e.to_string())?;
        let notifying = listener.notify(&channel).map_err(|e| e.to_string())?;
        let _ = ready_tx.send(());
        step_rx.recv_timeout(WAIT).map_err(|_| "peer gone")?;
        let stats = notifying.stats();
        // The requests on the channel, taken and left unanswered.
        let mut held = Vec::new();
        while let Some(event) = channel.wait_event(Duration::from_millis(500)) {
            match event {
                CmEvent::ConnectRequest(r) => held.push(r),
                other => return Err(format!("unexpected {other:?}")),
            }
        }
        let on_channel = held.len();
        // One answered: a place in the backlog for the next waiting in the listener.
        held.pop()
            .ok_or("no request on the channel")?
            .reject(b"")
            .map_err(|e| e.to_string())?;
        match channel.wait_event(WAIT) {
            Some(CmEvent::ConnectRequest(_)) => {}
            other => return Err(format!("after an answer: {other:?}, not the next request")),
        }
        let _ = back_tx.send(());
        Ok((stats, on_channel))
    });
    ready_rx.recv_timeout(WAIT).expect("listener ready");
    let peer = spawn_in_ns(NS_B, move || -> Result<(), String> {
        let addr = SocketAddr::from((ADDR_A, port));
        let mut streams = Vec::new();
        for i in 0..6 {
            let mut s = TcpStream::connect_timeout(&addr, WAIT).map_err(|e| e.to_string())?;
            s.write_all(&request(format!("request {i}").as_bytes()))
                .map_err(|e| e.to_string())?;
            streams.push(s);
            std::thread::sleep(Duration::from_millis(150));
        }
        for (i, s) in streams.iter_mut().enumerate().skip(4) {
            rejected(s).map_err(|e| format!("request {i}: {e}"))?;
        }
        let _ = step_tx.send(());
        back_rx.recv_timeout(WAIT).map_err(|_| "listener gone")?;
        drop(streams);
        Ok(())
    });
    peer.join().expect("peer thread").expect("peer");
    let (stats, on_channel) = server.join().expect("server thread").expect("server");
    assert_eq!(on_channel, 2, "requests on the channel at once");
    assert_eq!(stats.over_backlog, 2, "{stats:?}");
}

#[test]
fn engine_requests_beyond_the_backlog_of_an_event_channel_are_rejected() {
    backlog_through_an_event_channel(true, 19_621);
}

#[test]
fn socket_requests_beyond_the_backlog_of_an_event_channel_are_rejected() {
    backlog_through_an_event_channel(false, 19_622);
}

/// Connects from `iwa` (the engine or the socket transport) to a raw TCP listener on `port` in
/// `iwb` that does `peer` with the connection; the connect's error, if it failed, and the
/// peer's outcome.
fn connect_to_raw_peer(
    engine: bool,
    port: u16,
    peer: impl FnOnce(TcpStream) -> Result<(), String> + Send + 'static,
) -> (Option<DatapathError>, Result<(), String>) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let peer = spawn_in_ns(NS_B, move || -> Result<(), String> {
        let l = TcpListener::bind(SocketAddr::from((ADDR_B, port))).map_err(|e| e.to_string())?;
        let _ = ready_tx.send(());
        let s = common::accept_within(&l, WAIT).map_err(|e| e.to_string())?;
        peer(s)
    });
    ready_rx.recv_timeout(WAIT).expect("peer ready");
    let ours = spawn_in_ns(NS_A, move || {
        let dev = device(engine);
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        dev.connect(SocketAddr::from((ADDR_B, port)), &pd, &cq, &params(64), b"")
            .err()
    });
    let error = ours.join().expect("our side");
    (error, peer.join().expect("peer thread"))
}

/// A responder that sends an FPDU where its Reply belongs: the Initiator fails with
/// `InvalidKey` (RFC 5044 7.1.2 rule 5, code 4) and only that connection ends.
fn fpdu_before_reply(engine: bool, port: u16) {
    let _bed = bed_or_skip!();
    let (error, _) = connect_to_raw_peer(engine, port, |mut s| {
        // An untagged FPDU: ULPDU_Length 18, DDP/RDMAP Send header, 4 payload octets, CRC.
        let mut fpdu = vec![0x00, 0x12, 0x41, 0x43];
        fpdu.extend_from_slice(&[0; 20]);
        s.write_all(&fpdu).map_err(|e| e.to_string())?;
        let mut sink = Vec::new();
        s.set_read_timeout(Some(WAIT)).map_err(|e| e.to_string())?;
        let _ = s.read_to_end(&mut sink);
        Ok(())
    });
    println!("engine {engine}: {error:?}");
    assert!(
        matches!(error, Some(DatapathError::Mpa(MpaError::InvalidKey))),
        "{error:?}"
    );
}

#[test]
fn engine_initiator_refuses_an_fpdu_before_the_reply() {
    fpdu_before_reply(true, 19_617);
}

#[test]
fn socket_initiator_refuses_an_fpdu_before_the_reply() {
    fpdu_before_reply(false, 19_618);
}

/// A receive the queue pair refuses (its element names no region) fails the queue pair, and
/// on a responder that has not yet received the peer's first FPDU the Terminate that would
/// say so may not go (RFC 5044 7.1.2 rule 4): the connection closes without it at once,
/// the receive completing in error, rather than waiting with its Terminate for an FPDU the
/// silent peer never sends.
fn refusal_before_the_first_fpdu(engine: bool, port: u16) {
    let _bed = bed_or_skip!();
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = serve(engine, port, 64, ready_tx, |listener, _dev| {
        let req = next(listener, WAIT)?;
        let pd = ProtectionDomain::new();
        let cq = CompletionQueue::new();
        let conn = req
            .accept(&pd, &cq, b"")
            .map_err(|e| format!("accept: {e}"))?;
        let buf = pd
            .register(64, datapath::Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let bad = datapath::RecvWr {
            wr_id: 9,
            sg_list: datapath::Sge {
                stag: datapath::Stag(buf.stag().0 ^ 0x0100_0000),
                to: buf.base_to(),
                len: 64,
            }
            .into(),
        };
        let posted = Instant::now();
        conn.qp.post_recv(bad).map_err(|e| format!("post: {e}"))?;
        if !conn.qp.wait_finished(WAIT) {
            return Err("the queue pair never ended".into());
        }
        let took = posted.elapsed();
        let completion = cq
            .wait(WAIT)
            .ok_or("no completion for the refused receive")?;
        Ok((took, conn.qp.status(), completion.wc))
    });
    ready_rx.recv_timeout(WAIT).expect("listener ready");
    let peer = spawn_in_ns(NS_B, move || -> Result<Vec<u8>, String> {
        let addr = SocketAddr::from((ADDR_A, port));
        let mut s = TcpStream::connect_timeout(&addr, WAIT).map_err(|e| e.to_string())?;
        s.write_all(&request(b"")).map_err(|e| e.to_string())?;
        // The Reply, then the close; nothing is ever sent to it.
        s.set_read_timeout(Some(WAIT)).map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        match s.read_to_end(&mut got) {
            Ok(_) => Ok(got),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(got),
            Err(e) => Err(format!("not closed: {e} (after {} octets)", got.len())),
        }
    });
    let got = peer.join().expect("peer thread").expect("peer");
    let (took, status, wc) = server.join().expect("server thread").expect("server");
    println!("engine {engine}: ended {took:?} after the post; {status:?}; {wc:?}");
    assert_eq!(got.len(), 20, "the Reply and nothing after it: {got:02x?}");
    assert!(took < Duration::from_secs(5), "ended after {took:?}");
    assert_eq!(
        status.error,
        Some(datapath::QpError::ClosedLocally(
            iwarp_conn::UNSENDABLE_TERMINATE
        ))
    );
    assert_eq!(status.sent_terminate, None);
    assert_eq!(
        (wc.wr_id, wc.status),
        (9, datapath::WcStatus::LocalProtectionError)
    );
}

#[test]
fn engine_responder_refusing_a_receive_before_the_first_fpdu_closes_at_once() {
    refusal_before_the_first_fpdu(true, 19_604);
}

#[test]
fn socket_responder_refusing_a_receive_before_the_first_fpdu_closes_at_once() {
    refusal_before_the_first_fpdu(false, 19_605);
}

/// A responder that closes, or resets, the connection after reading the Request and before
/// its Reply: the Initiator's connect fails with `MpaError::ConnectionLost` on both
/// transports.
fn gone_before_reply(engine: bool, port: u16) {
    let _bed = bed_or_skip!();
    for reset in [false, true] {
        let (error, peer) = connect_to_raw_peer(engine, port, move |mut s| {
            let mut request = [0u8; 20];
            s.read_exact(&mut request).map_err(|e| e.to_string())?;
            if reset {
                socket2::SockRef::from(&s)
                    .set_linger(Some(Duration::ZERO))
                    .map_err(|e| e.to_string())?;
            }
            drop(s);
            Ok(())
        });
        peer.expect("peer");
        println!("engine {engine}, reset {reset}: {error:?}");
        assert!(
            matches!(error, Some(DatapathError::Mpa(MpaError::ConnectionLost))),
            "reset {reset}: {error:?}"
        );
    }
}

#[test]
fn engine_initiator_whose_responder_leaves_before_the_reply_lost_the_connection() {
    gone_before_reply(true, 19_606);
}

#[test]
fn socket_initiator_whose_responder_leaves_before_the_reply_lost_the_connection() {
    gone_before_reply(false, 19_607);
}
