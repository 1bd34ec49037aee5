//! A connection that `Device::connect_async` established and nobody took: once every handle of
//! the event channel it was queued on is dropped, the connection closes as a dropped
//! `Connection` does, and the peer sees it end. Socket transport on loopback.

use std::os::fd::AsRawFd;
use std::time::Duration;

use datapath::{CmEventChannel, CompletionQueue, ConnectParams, Device, Listener, QueuePair};
use datapath::{ProtectionDomain, QpError};

/// Bound on each wait for the other side (setup, an accept).
const WAIT: Duration = Duration::from_secs(20);
/// How long the server's queue pair may take to see the dropped connection end.
const END_WAIT: Duration = Duration::from_secs(15);

fn params() -> ConnectParams {
    ConnectParams {
        setup_timeout: Duration::from_secs(10),
        ..ConnectParams::default()
    }
}

/// True if `fd` becomes readable within `timeout` (`poll(2)`), without reading it.
fn readable(fd: i32, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack, count 1.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
    n == 1
}

/// Starts a `connect_async` to a fresh listener and accepts it; returns the client's channel
/// and the server's queue pair.
fn connect_and_accept(device: &Device) -> (CmEventChannel, QueuePair) {
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), params()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let channel = CmEventChannel::new().unwrap();
    device
        .connect_async(addr, &pd, &cq, &params(), b"", &channel, 1)
        .unwrap();
    let request = listener
        .accept_timeout(WAIT)
        .unwrap()
        .expect("a connection request");
    let (spd, scq) = (ProtectionDomain::new(), CompletionQueue::new());
    let server = request.accept(&spd, &scq, b"").unwrap();
    (channel, server.qp)
}

/// The server's queue pair ends within [`END_WAIT`], by the client's close.
fn ends(server: &QueuePair, what: &str) {
    assert!(
        server.wait_finished(END_WAIT),
        "{what}: the server's connection did not end: {:?}",
        server.status()
    );
    let error = server.status().error;
    assert!(
        matches!(error, None | Some(QpError::PeerClosed | QpError::PeerReset)),
        "{what}: {error:?}"
    );
}

/// The `Established` event is queued and the channel dropped without taking it.
#[test]
fn an_established_connection_dropped_with_its_channel_closes() {
    let device = Device::socket();
    let (channel, server) = connect_and_accept(&device);
    assert!(
        readable(channel.as_raw_fd(), WAIT),
        "no Established event queued"
    );
    drop(channel);
    ends(&server, "dropped after the event was queued");
}

/// The channel is dropped before the outcome is queued: the connecting thread holds the last
/// handle, and the connection closes when it lets go.
#[test]
fn a_connection_established_after_its_channel_was_dropped_closes() {
    let device = Device::socket();
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), params()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (pd, cq) = (ProtectionDomain::new(), CompletionQueue::new());
    let channel = CmEventChannel::new().unwrap();
    device
        .connect_async(addr, &pd, &cq, &params(), b"", &channel, 1)
        .unwrap();
    drop(channel);
    let request = listener
        .accept_timeout(WAIT)
        .unwrap()
        .expect("a connection request");
    let (spd, scq) = (ProtectionDomain::new(), CompletionQueue::new());
    let server = request.accept(&spd, &scq, b"").unwrap();
    ends(&server.qp, "dropped before the event was queued");
}
