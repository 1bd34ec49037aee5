//! Interoperability with an implementation we did not write: smoltcp's TCP
//! in the same simulator, both roles (our client -> smoltcp server, smoltcp
//! client -> our server in MPA pass-up mode), across the loss matrix with
//! reordering and duplication, followed by a clean close.
mod common;
use common::*;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use smoltcp::iface::{Config as IfaceConfig, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint};
use tcp_engine::sim::{Endpoint, Network};
use tcp_engine::{Config, Instant, State};

thread_local! {
    static SMOL_NOW_MS: Cell<u32> = const { Cell::new(0) };
}

fn smol_tsval() -> u32 {
    SMOL_NOW_MS.with(|c| c.get())
}

#[derive(Default)]
struct SimDevice {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
}

struct Rx(Vec<u8>);
struct Tx<'a>(&'a mut VecDeque<Vec<u8>>);

impl RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut v = vec![0u8; len];
        let r = f(&mut v);
        self.0.push_back(v);
        r
    }
}

impl Device for SimDevice {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;
    fn receive(&mut self, _t: smoltcp::time::Instant) -> Option<(Rx, Tx<'_>)> {
        let p = self.rx.pop_front()?;
        Some((Rx(p), Tx(&mut self.tx)))
    }
    fn transmit(&mut self, _t: smoltcp::time::Instant) -> Option<Tx<'_>> {
        Some(Tx(&mut self.tx))
    }
    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ip;
        c.max_transmission_unit = 1500;
        c
    }
}

struct SmolPeer {
    iface: Interface,
    sockets: SocketSet<'static>,
    handle: SocketHandle,
    dev: SimDevice,
    src: Arc<Vec<u8>>,
    sent: usize,
    dest: Vec<u8>,
    received: usize,
    close_when_sent: bool,
    close_on_peer_fin: bool,
    now: Instant,
}

fn smol_now(now: Instant) -> smoltcp::time::Instant {
    smoltcp::time::Instant::from_micros(now.as_micros() as i64)
}

impl SmolPeer {
    fn new(addr: std::net::Ipv4Addr, src: Arc<Vec<u8>>, expect: usize, seed: u64) -> SmolPeer {
        let mut dev = SimDevice::default();
        let mut cfg = IfaceConfig::new(HardwareAddress::Ip);
        cfg.random_seed = seed;
        let mut iface = Interface::new(cfg, &mut dev, smol_now(Instant::ZERO));
        iface.update_ip_addrs(|a| {
            a.push(IpCidr::new(IpAddress::Ipv4(addr), 24))
                .expect("room");
        });
        let mut sock = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; 256 << 10]),
            tcp::SocketBuffer::new(vec![0; 256 << 10]),
        );
        sock.set_tsval_generator(Some(smol_tsval));
        sock.set_nagle_enabled(false);
        let mut sockets = SocketSet::new(vec![]);
        let handle = sockets.add(sock);
        SmolPeer {
            iface,
            sockets,
            handle,
            dev,
            src,
            sent: 0,
            dest: vec![0; expect],
            received: 0,
            close_when_sent: false,
            close_on_peer_fin: false,
            now: Instant::ZERO,
        }
    }

    fn socket(&mut self) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(self.handle)
    }

    fn poll(&mut self, now: Instant) {
        self.now = now;
        SMOL_NOW_MS.with(|c| c.set(now.as_millis() as u32));
        for _ in 0..4 {
            let t = smol_now(now);
            self.iface.poll(t, &mut self.dev, &mut self.sockets);
            let src = self.src.clone();
            let (close_when_sent, close_on_fin) = (self.close_when_sent, self.close_on_peer_fin);
            let mut sent = self.sent;
            let mut received = self.received;
            let mut dest = std::mem::take(&mut self.dest);
            let sock = self.socket();
            while sock.can_send() && sent < src.len() {
                match sock.send_slice(&src[sent..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => sent += n,
                }
            }
            if close_when_sent && sent == src.len() && sock.state() == tcp::State::Established {
                sock.close();
            }
            while sock.can_recv() {
                match sock.recv_slice(&mut dest[received..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => received += n,
                }
            }
            if close_on_fin && !sock.may_recv() && sock.state() == tcp::State::CloseWait {
                sock.close();
            }
            self.sent = sent;
            self.received = received;
            self.dest = dest;
        }
    }
}

impl Endpoint for SmolPeer {
    fn receive(&mut self, now: Instant, packet: &[u8]) {
        self.dev.rx.push_back(packet.to_vec());
        self.poll(now);
    }
    fn transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        if self.dev.tx.is_empty() {
            self.poll(now);
        }
        let p = self.dev.tx.pop_front()?;
        buf[..p.len()].copy_from_slice(&p);
        Some(p.len())
    }
    fn next_timeout(&self) -> Option<Instant> {
        // poll_at needs &mut; approximate with a 1 ms tick while the socket
        // is not closed (smoltcp's timers are millisecond-grained).
        None.or(Some(self.now + Duration::from_millis(1)))
    }
    fn on_timeout(&mut self, now: Instant) {
        self.poll(now);
    }
}

fn matrix() -> [(f64, usize); 4] {
    [
        (0.0, 2 << 20),
        (0.01, 1 << 20),
        (0.05, 256 << 10),
        (0.2, 64 << 10),
    ]
}

#[test]
fn ours_client_to_smoltcp_server() {
    for (i, (loss, size)) in matrix().into_iter().enumerate() {
        let seed = 700 + i as u64;
        let src = random_bytes(size, seed);
        let mut ours = Peer::client(Config::default(), src.clone(), seed);
        ours.close_when_sent = true;
        let mut smol = SmolPeer::new(B_ADDR, Arc::new(Vec::new()), size, seed);
        smol.socket().listen(B_PORT).expect("listen");
        smol.close_on_peer_fin = true;
        let mut net = Network::new(lossy(loss), lossy(loss), seed);
        let ok = net.run(
            &mut ours,
            &mut smol,
            Instant::from_millis(3_600_000),
            |o, s, _| s.received == size && o.state() == Some(State::TimeWait),
            |_, _, _| {},
        );
        assert!(
            ok,
            "loss {loss}: smoltcp received {} of {size}, ours {:?} {:?}",
            smol.received,
            ours.state(),
            ours.conn().stats()
        );
        assert_eq!(smol.dest[..], src[..]);
        println!(
            "ours->smoltcp loss {loss}: {size} bytes in {:?} virtual, retransmitted {}",
            net.now - Instant::ZERO,
            ours.conn().stats().retransmitted_segments
        );
    }
}

#[test]
fn smoltcp_client_to_ours_server_mpa_pass_up() {
    for (i, (loss, size)) in matrix().into_iter().enumerate() {
        let seed = 800 + i as u64;
        let src = random_bytes(size, seed);
        let mut smol = SmolPeer::new(A_ADDR, src.clone(), 0, seed);
        let cx = smol.iface.context();
        smol.sockets
            .get_mut::<tcp::Socket>(smol.handle)
            .connect(cx, IpEndpoint::new(IpAddress::Ipv4(B_ADDR), B_PORT), A_PORT)
            .expect("connect");
        smol.close_when_sent = true;
        let mut ours = Peer::server(Config::mpa(), Arc::new(Vec::new()), seed).expect(size);
        ours.close_on_peer_fin = true;
        let mut net = Network::new(lossy(loss), lossy(loss), seed);
        let ok = net.run(
            &mut smol,
            &mut ours,
            Instant::from_millis(3_600_000),
            |s, o, _| {
                o.received_all()
                    && o.state() == Some(State::Closed)
                    && s.socket().state() == tcp::State::TimeWait
            },
            |_, _, _| {},
        );
        assert!(
            ok,
            "loss {loss}: ours received {} of {size}, ours {:?}",
            ours.received,
            ours.state()
        );
        assert_eq!(ours.dest[..], src[..]);
        assert_eq!(ours.passed_twice, 0);
        assert_eq!(ours.max_ooo_held, 0);
        println!("smoltcp->ours loss {loss}: {size} bytes in {:?} virtual, out-of-order pieces passed up {}", net.now - Instant::ZERO, ours.passed_out_of_order);
    }
}
