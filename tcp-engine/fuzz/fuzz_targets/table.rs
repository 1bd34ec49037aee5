//! The connection table under arbitrary packets: one listener (backlog, table size, SYN
//! cookies on or off and the listening address from the input) and packets from a few client
//! addresses and ports, to the listening port and to a closed one. The input picks each
//! packet's flags, sequence and acknowledgment numbers, either free or answering what the
//! table sent that client (its SYN-ACK, cookie or not, or the connection's own numbers), so
//! that handshakes complete, through a cookie too, and data, FINs and RSTs land in and near
//! the windows; between packets the clock moves and timers run, the application accepts,
//! removes, reports a "packet too big" or stops and starts listening.
//!
//! Checked after every step: nothing panics; the table never holds more than its size; every
//! packet it sends parses and goes to a client that sent it something; a connection made from
//! a SYN cookie answers a SYN-ACK the table sent to that client with that sequence number
//! (the same cookie may make a connection again after the first was removed: a cookie is
//! stateless, good for its minutes); the timer deadline is never in the past after
//! `handle_timeout`.
#![no_main]

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tcp_engine::table::ConnectionTable;
use tcp_engine::wire::{TcpFlags, TcpOptions};
use tcp_engine::{Config, FourTuple, Instant};
use tcp_engine_fuzz::{for_each_transmitted, from_remote, Input};

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const PORT: u16 = 5000;
const CLOSED_PORT: u16 = 5001;

/// One of eight clients (four addresses, two ports) toward the listening or the closed port,
/// as the table sees it (local: the server).
fn tuple(pick: u8) -> FourTuple {
    FourTuple {
        local_addr: SERVER,
        local_port: if pick & 8 != 0 { CLOSED_PORT } else { PORT },
        remote_addr: Ipv4Addr::new(10, 0, 1, pick & 3),
        remote_port: 40_000 + u16::from((pick >> 2) & 1),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let knobs = input.u8();
    let backlog = usize::from(knobs & 3) + 1;
    let max_connections = usize::from((knobs >> 2) & 7) + 1;
    let cookies = knobs & 0x20 == 0;
    let listen_addr = if knobs & 0x40 != 0 {
        SERVER
    } else {
        Ipv4Addr::UNSPECIFIED
    };
    let mut table = ConnectionTable::new([3; 16], max_connections);
    table.set_syn_cookies(cookies);
    let cfg = Config {
        send_buffer: 64 << 10,
        recv_buffer: 64 << 10,
        ..Config::default()
    };
    table.listen(listen_addr, PORT, backlog, cfg.clone());
    let mut listening = true;

    let mut buf = vec![0u8; 2048];
    let mut pkt = vec![0u8; 2048];
    let payload: Vec<u8> = (0..1500u32).map(|i| (i * 131 + 7) as u8).collect();
    let mut now = Instant::from_millis(1);
    // Per client (table-side tuple): the last SYN-ACK's (ISS, ACK), and every ISS of a
    // SYN-ACK sent to it.
    let mut syn_acks: [Option<(u32, u32)>; 16] = [None; 16];
    let mut sent_iss: HashSet<(FourTuple, u32)> = HashSet::new();
    // Clients that sent the table something (a packet may only go to one of them).
    let mut heard: HashSet<FourTuple> = HashSet::new();

    for _ in 0..256 {
        if input.is_empty() {
            break;
        }
        match input.u8() % 8 {
            // A packet (half the ops).
            0..=3 => {
                let pick = input.u8() % 16;
                let t = tuple(pick);
                let mode = input.u8();
                let flags = TcpFlags::from_byte(input.u8());
                let len = usize::from(input.u16()) % (payload.len() + 1);
                let (free_seq, free_ack) = (input.u32(), input.u32());
                let (seq, ack) = match mode % 4 {
                    // Answer the last SYN-ACK sent to this client (completes a handshake,
                    // brings a cookie back).
                    0 | 1 => match syn_acks[usize::from(pick)] {
                        Some((iss, peer_ack)) => (peer_ack, iss.wrapping_add(1)),
                        None => (free_seq, free_ack),
                    },
                    // Near the connection's own numbers.
                    2 => match table.lookup(&t).and_then(|id| table.get(id)) {
                        Some(c) => (
                            c.rcv_nxt().wrapping_add(free_seq >> (mode >> 3)),
                            c.snd_nxt().wrapping_add(free_ack >> (mode >> 3)),
                        ),
                        None => (free_seq, free_ack),
                    },
                    _ => (free_seq, free_ack),
                };
                let mut options = TcpOptions::default();
                if mode & 4 != 0 {
                    options.mss = Some(input.u16());
                    options.window_scale = Some(input.u8() % 16);
                    options.sack_permitted = true;
                    options.timestamp = Some((input.u32(), input.u32()));
                }
                let seg = from_remote(&t, seq, ack, flags, input.u16(), options, &payload[..len]);
                let Ok(n) = seg.emit(&mut pkt) else {
                    continue;
                };
                heard.insert(t);
                let validated = table.stats().syncookies_validated;
                let _ = table.handle_packet(now, &pkt[..n], |_, _| {});
                if table.stats().syncookies_validated > validated {
                    assert!(
                        sent_iss.contains(&(t, ack.wrapping_sub(1))),
                        "a connection from a cookie the table never sent"
                    );
                }
            }
            4 => {
                now += Duration::from_micros(u64::from(input.u32() % 4_000_000));
                if table.poll_timeout().is_some_and(|d| d <= now) {
                    table.handle_timeout(now);
                    if let Some(d) = table.poll_timeout() {
                        assert!(d > now, "a timer is still due right after handle_timeout");
                    }
                }
            }
            5 => {
                if let Some(id) = table.accept(listen_addr, PORT) {
                    if input.u8() & 1 != 0 {
                        if let Some(c) = table.get_mut(id) {
                            let _ = c.send(&payload[..usize::from(input.u8())]);
                            c.close();
                        }
                    }
                }
            }
            6 => {
                let t = tuple(input.u8() % 16);
                match input.u8() % 4 {
                    0 => {
                        if let Some(id) = table.lookup(&t) {
                            if let Some(mut c) = table.remove(id) {
                                c.abort();
                            }
                        }
                    }
                    1 => {
                        let (seq, mtu) = (input.u32(), input.u16());
                        let seq = match table.lookup(&t).and_then(|id| table.get(id)) {
                            Some(c) => c.snd_una().wrapping_add(seq % 4096),
                            None => seq,
                        };
                        let _ = table.handle_packet_too_big(now, &t, seq, mtu);
                    }
                    _ => {
                        if listening {
                            table.unlisten(listen_addr, PORT);
                        } else {
                            table.listen(listen_addr, PORT, backlog, cfg.clone());
                        }
                        listening = !listening;
                    }
                }
            }
            _ => {
                let t = tuple(input.u8() % 16);
                if let Some(c) = table.lookup(&t).and_then(|id| table.get_mut(id)) {
                    let mut sink = [0u8; 4096];
                    let _ = c.recv(&mut sink);
                    if input.u8() & 1 != 0 {
                        c.close();
                    }
                }
            }
        }
        assert!(
            table.len() <= max_connections,
            "{} connections in a table of {max_connections}",
            table.len()
        );
        for_each_transmitted(
            &mut buf,
            |b| table.poll_transmit(now, b),
            |seg| {
                // The client it goes to, as the table sees it (local: the server).
                let to = FourTuple {
                    local_addr: seg.src_addr,
                    local_port: seg.src_port,
                    remote_addr: seg.dst_addr,
                    remote_port: seg.dst_port,
                };
                assert!(
                    heard.contains(&to),
                    "a packet to a client that sent nothing"
                );
                if seg.flags.syn && seg.flags.ack {
                    let i = (0..16u8)
                        .find(|&p| tuple(p) == to)
                        .expect("one of the clients");
                    syn_acks[usize::from(i)] = Some((seg.seq, seg.ack));
                    sent_iss.insert((to, seg.seq));
                }
            },
        );
    }
});
