//! IFT framing (draft-williams-iwarp-ift-01) over the socket transport, on loopback: the
//! adaption exchange picks each direction's CRCs, then Write, Send and Read of every size
//! (1 octet to 16 MiB, both sides of the MULPDU) move byte-exact with every combination of
//! header and payload CRCs; an IFT end and an MPA end fail their setup at once, each saying
//! why. The AF_XDP engine's IFT is tested on the veth bed (`xdp_ift.rs`).

mod common;

use std::time::{Duration, Instant};

use common::*;
use datapath::{Agreed, ConnectParams, DatapathError, Framing, Listener};
use ift::{IftConfig, IftError};

fn ift_params(header_crc: bool, payload_crc: bool) -> ConnectParams {
    ConnectParams {
        framing: Framing::Ift(IftConfig {
            header_crc,
            payload_crc,
            // Replaced by a fresh random one per connection.
            ..IftConfig::with_vtag(0)
        }),
        ..params(mpa(2, true, false))
    }
}

/// The listener's statistics once it has refused one connection (bounded wait).
fn once_refused(listener: &Listener) -> datapath::ListenStats {
    let deadline = Instant::now() + Duration::from_secs(5);
    while listener.stats().refused == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = listener.stats();
    assert_eq!(stats.refused, 1, "{stats:?}");
    stats
}

/// The listener closes `s` (end of stream, or a reset) without sending anything, within its
/// read timeout: a timeout (the connection left open) or octets fail.
fn closed_silently(s: &mut std::net::TcpStream, what: &str) {
    use std::io::Read;
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("{what}: the connection did not close silently: {other:?}"),
    }
}

fn ift_of(agreed: &Agreed) -> ift::Negotiated {
    match agreed {
        Agreed::Ift { negotiated, .. } => *negotiated,
        other => panic!("not an IFT connection: {other:?}"),
    }
}

/// Every size both ways, for each choice of (client HC, client PC) and (server HC, server
/// PC): the four symmetric ones and two where the directions differ. Each direction's frames
/// carry the sender's choice, the VTags are the receivers' (and differ between connections).
#[test]
fn every_crc_combination_moves_every_size_byte_exact() {
    let cases = [
        ((false, false), (false, false)),
        ((true, false), (true, false)),
        ((false, true), (false, true)),
        ((true, true), (true, true)),
        ((true, false), (false, true)),
        ((false, false), (true, true)),
    ];
    let mut vtags = Vec::new();
    for (seed, (client, server)) in cases.into_iter().enumerate() {
        let listener = Listener::bind(any_port(), ift_params(server.0, server.1)).unwrap();
        let addr = listener.local_addr().unwrap();
        let info = verified_transfers(
            &listener,
            addr,
            &ift_params(client.0, client.1),
            &full_sizes(),
            seed as u64,
        );
        let (c, s) = (ift_of(&info.client_agreed), ift_of(&info.server_agreed));
        assert_eq!(
            (c.tx.header_crc, c.tx.payload_crc),
            client,
            "{client:?} {server:?}"
        );
        assert_eq!((c.rx.header_crc, c.rx.payload_crc), server);
        assert_eq!((s.tx.header_crc, s.tx.payload_crc), server);
        assert_eq!((s.rx.header_crc, s.rx.payload_crc), client);
        assert_eq!(c.tx.vtag, s.rx.vtag, "the client sends the server's VTag");
        assert_eq!(s.tx.vtag, c.rx.vtag, "the server sends the client's VTag");
        assert!(c.rx.verify && s.rx.verify, "both check the CRCs they get");
        vtags.push(c.rx.vtag);
        // The frame overhead is the IFT header and the sender's CRCs.
        let crcs = |(h, p): (bool, bool)| 4 * (usize::from(h) + usize::from(p));
        assert_eq!(
            info.client_mulpdu + 6 + crcs(client),
            info.server_mulpdu + 6 + crcs(server),
            "both fill the same MSS"
        );
    }
    vtags.sort_unstable();
    vtags.dedup();
    assert!(vtags.len() >= cases.len() - 1, "VTags repeat: {vtags:?}");
}

/// An IFT initiator against an MPA listener: the listener refuses the indication as a bad MPA
/// key and closes, and the initiator reports the connection lost in the IFT exchange; both at
/// once, not at a timeout.
#[test]
fn an_ift_initiator_and_an_mpa_listener_both_fail_at_once() {
    let listener = Listener::bind(any_port(), params(mpa(2, true, false))).unwrap();
    let addr = listener.local_addr().unwrap();
    let client = Side::new();
    let mut p = ift_params(true, true);
    p.setup_timeout = Duration::from_secs(20);
    let started = Instant::now();
    let err = datapath::connect(addr, &client.pd, &client.cq, &p, &[])
        .err()
        .expect("an MPA listener cannot accept IFT");
    assert!(
        matches!(err, DatapathError::Ift(IftError::ConnectionLost)),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let stats = once_refused(&listener);
    assert!(
        matches!(stats.last_refusal, Some(mpa::MpaError::InvalidKey)),
        "{stats:?}"
    );
}

/// An MPA initiator against an IFT listener: the listener sees an MPA Request where the
/// indication should be (its magic is MPA's key) and closes at once; the initiator's MPA
/// startup fails then, not at its timeout.
#[test]
fn an_mpa_initiator_and_an_ift_listener_both_fail_at_once() {
    let listener = Listener::bind(any_port(), ift_params(true, true)).unwrap();
    let addr = listener.local_addr().unwrap();
    let client = Side::new();
    let mut p = params(mpa(2, true, false));
    p.setup_timeout = Duration::from_secs(20);
    let started = Instant::now();
    let err = datapath::connect(addr, &client.pd, &client.cq, &p, &[])
        .err()
        .expect("an IFT listener cannot accept MPA");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}: {err}",
        started.elapsed()
    );
    let stats = once_refused(&listener);
    let refusal = stats.last_ift_refusal.expect("the listener's IFT error");
    assert!(matches!(refusal, IftError::BadMagic { .. }), "{refusal:?}");
    assert!(
        refusal.to_string().contains("the peer speaks MPA"),
        "{refusal}"
    );
}

/// IFT carries no private data: asking for some is refused before anything is sent, in a
/// connect and in a reject (which then rejects bare, as the request's drop does).
#[test]
fn private_data_with_ift_is_refused() {
    use std::io::Write;
    let listener = Listener::bind(any_port(), ift_params(true, true)).unwrap();
    let addr = listener.local_addr().unwrap();
    let client = Side::new();
    let err = datapath::connect(addr, &client.pd, &client.cq, &ift_params(true, true), b"hi")
        .err()
        .expect("private data refused");
    assert!(matches!(err, DatapathError::InvalidArgument(_)), "{err:?}");

    let mut raw = std::net::TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    let ini = ift::Initiator::new(IftConfig::with_vtag(7), Instant::now());
    raw.write_all(ini.indication()).unwrap();
    let req = listener.accept_timeout(WAIT).unwrap().expect("no request");
    let err = req
        .reject(b"go away")
        .expect_err("private data in an IFT reject");
    assert!(matches!(err, DatapathError::InvalidArgument(_)), "{err:?}");
    closed_silently(&mut raw, "rejected");
}

/// Through a relay that flips one octet of the client's stream, one 16 KiB Write after a Send
/// went through: with the payload CRC a flipped payload octet, with the header CRC a flipped
/// DDP header octet (the Write's STag field), is caught before anything of the frame is
/// placed; the server reports the IFT error, sends a Terminate of layer LLP with code 2 (a CRC
/// error, as MPA's), and both queue pairs end. The target region is untouched.
#[test]
fn a_corrupted_frame_is_never_placed_and_ends_the_connection() {
    use datapath::{Access, QpError, QpState, RecvWr, WcOpcode, WcStatus};
    use rdmap::wire::layer;
    const LEN: usize = 16 * 1024;
    // Frame: 6 octets of IFT header, the 14-octet tagged DDP header (RDMAP's STag at octets
    // 2-5 of it), the 4-octet header CRC, then the payload.
    for (what, offset) in [("payload", 6 + 14 + 4 + 1000), ("header", 6 + 3)] {
        let p = ift_params(true, true);
        let listener = Listener::bind(any_port(), p.clone()).unwrap();
        let relay = Relay::start(listener.local_addr().unwrap());
        let (client, server) = (Side::new(), Side::new());
        let recv_buf = server.pd.register(64, Access::LOCAL_WRITE).unwrap();
        let target = server
            .pd
            .register(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        target.write(0, &[0xEE; LEN]);
        let (c, s) = establish(
            &listener,
            relay.addr(),
            &client,
            &p,
            &[],
            ServerPlan {
                side: &server,
                private_data: &[],
                recvs: vec![
                    RecvWr {
                        wr_id: 1,
                        sg_list: recv_buf.sge(0, 64).into(),
                    },
                    RecvWr {
                        wr_id: 2,
                        sg_list: recv_buf.sge(0, 64).into(),
                    },
                ],
            },
        );
        let (c, s) = (c.unwrap(), s.unwrap());
        let src = client.pd.register(LEN, Access::NONE).unwrap();
        src.write(0, &pattern(5, LEN));
        c.qp.post_send(send_wr(9, &src, 64)).unwrap();
        expect_wc(&server.cq, 1, WcOpcode::Recv, WcStatus::Success);
        expect_wc(&client.cq, 9, WcOpcode::Send, WcStatus::Success);

        relay.hold();
        relay.corrupt_in(offset);
        c.qp.post_send(write_wr(10, &src, LEN, target.stag(), target.base_to()))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while relay.corrupted().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (_, original, now) = relay.corrupted().expect("the relay flipped nothing");
        assert_ne!(original, now);
        relay.release();

        assert!(
            c.qp.wait_finished(WAIT),
            "{what}: the client's QP did not end"
        );
        assert!(
            s.qp.wait_finished(WAIT),
            "{what}: the server's QP did not end"
        );
        assert_eq!(s.qp.status().state, QpState::Error);
        let err = s.qp.status().error.expect("the server reported no error");
        match what {
            "payload" => assert!(
                matches!(err, QpError::Ift(IftError::PayloadCrc { .. })),
                "{what}: {err:?}"
            ),
            _ => assert!(
                matches!(err, QpError::Ift(IftError::HeaderCrc { .. })),
                "{what}: {err:?}"
            ),
        }
        let term =
            c.qp.status()
                .remote_terminate
                .expect("the client got no Terminate");
        assert_eq!(
            (term.layer, term.etype, term.code),
            (layer::LLP, 0, 2),
            "{what}"
        );
        assert_bytes_eq(&region_bytes(&target, 0, LEN), &[0xEE; LEN], what);
    }
}

/// A raw IFT peer (the `ift` crate's initiator over a plain TCP socket) against our listener:
/// after the exchange its frame carries a VTag other than ours. The server refuses it (nothing
/// placed, the connection ends with `IftError::BadVtag`) and says so in a Terminate of layer
/// LLP, code 3, framed with the peer's own VTag.
#[test]
fn a_frame_with_the_wrong_vtag_is_refused_with_a_terminate() {
    use std::io::{Read, Write};
    let listener = Listener::bind(any_port(), ift_params(true, true)).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Side::new();
    let mut raw = std::net::TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    let mut ini = ift::Initiator::new(IftConfig::with_vtag(0x1234), Instant::now());
    raw.write_all(ini.indication()).unwrap();
    let req = listener.accept_timeout(WAIT).unwrap().expect("no request");
    assert!(req.info().is_none(), "IFT has no MPA Request");
    assert_eq!(req.offered_ird_ord(), None, "nor IRD and ORD");
    let conn = req.accept(&server.pd, &server.cq, &[]).unwrap();
    let mut reply = [0u8; 64];
    raw.read_exact(&mut reply).unwrap();
    let (used, n) = ini.feed(&reply, Instant::now()).unwrap();
    let n = n.expect("the exchange is complete");
    assert_eq!(used, 64);
    assert_eq!(n.rx.vtag, 0x1234, "the server sends our VTag");
    // An untagged Send, last segment (DDP control 0x41, RDMAP Send 0x43), QN 0, MSN 1, MO 0.
    let mut ulpdu = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
    ulpdu.extend_from_slice(b"hello");
    let wrong = ift::FrameFormat {
        vtag: n.tx.vtag ^ 0x0101,
        ..n.tx
    };
    let mut frame = Vec::new();
    ift::FrameEncoder::new(wrong)
        .encode(&ulpdu, &mut frame)
        .unwrap();
    raw.write_all(&frame).unwrap();

    assert!(conn.qp.wait_finished(WAIT), "the server's QP did not end");
    let err = conn.qp.status().error.expect("no error reported");
    assert!(
        matches!(err, datapath::QpError::Ift(IftError::BadVtag { .. })),
        "{err:?}"
    );
    // The Terminate comes back as an IFT frame with our VTag.
    let mut decoder = ift::FrameDecoder::new(n.rx);
    let mut terminate = None;
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + WAIT;
    while terminate.is_none() && Instant::now() < deadline {
        let got = raw.read(&mut buf).unwrap();
        assert!(got > 0, "closed before the Terminate");
        decoder
            .feed(&buf[..got], |f| {
                terminate = Some(rdmap::TerminateHeader::parse(f.payload).expect("Terminate"));
            })
            .unwrap();
    }
    let t = terminate.expect("no Terminate");
    assert_eq!(
        (t.layer, t.etype, t.code),
        (rdmap::wire::layer::LLP, 0, 3),
        "{t:?}"
    );
}

/// An indication the application never answers: the listener closes the connection at the
/// accept timeout and counts it; a late accept fails.
#[test]
fn an_unanswered_ift_request_is_closed_at_the_accept_timeout() {
    use std::io::Write;
    let mut p = ift_params(true, true);
    p.mpa.accept_timeout = Duration::from_millis(300);
    let listener = Listener::bind(any_port(), p).unwrap();
    let mut raw = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    let ini = ift::Initiator::new(IftConfig::with_vtag(7), Instant::now());
    raw.write_all(ini.indication()).unwrap();
    let req = listener.accept_timeout(WAIT).unwrap().expect("no request");
    let started = Instant::now();
    closed_silently(&mut raw, "no reply");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let server = Side::new();
    let late = req.accept(&server.pd, &server.cq, &[]).err();
    assert!(
        matches!(late, Some(DatapathError::Ift(IftError::AcceptTimeout))),
        "{late:?}"
    );
    let stats = listener.stats();
    assert_eq!((stats.accept_timeouts, stats.startup_timeouts), (1, 0));
}

/// A responder that never answers the indication: the initiator gives up at its setup
/// deadline.
#[test]
fn an_initiator_gives_up_at_its_setup_deadline() {
    let silent = std::net::TcpListener::bind(any_port()).unwrap();
    let addr = silent.local_addr().unwrap();
    let mut p = ift_params(true, true);
    p.setup_timeout = Duration::from_millis(500);
    let client = Side::new();
    let started = Instant::now();
    let err = datapath::connect(addr, &client.pd, &client.cq, &p, &[])
        .err()
        .expect("nobody answers");
    assert!(
        matches!(
            err,
            DatapathError::Timeout(_) | DatapathError::Ift(IftError::StartupTimeout)
        ),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(silent);
}

/// The exchange's deadline is `IftConfig::timeout` on both sides, as on the engine: a listener
/// whose MPA timeout is long closes a silent connection at the IFT one, and an initiator
/// whose setup timeout is long gives up at it too (`IftError::StartupTimeout`).
#[test]
fn the_ift_exchange_ends_at_its_own_timeout() {
    let short = |mut p: ConnectParams| {
        if let Framing::Ift(cfg) = &mut p.framing {
            cfg.timeout = Duration::from_millis(300);
        }
        p.mpa.timeout = Duration::from_secs(20);
        p.setup_timeout = Duration::from_secs(20);
        p
    };
    let listener = Listener::bind(any_port(), short(ift_params(true, true))).unwrap();
    let mut silent = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    silent.set_read_timeout(Some(WAIT)).unwrap();
    let started = Instant::now();
    closed_silently(&mut silent, "a silent peer");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the listener closed after {took:?}"
    );
    assert_eq!(listener.stats().startup_timeouts, 1);

    let quiet = std::net::TcpListener::bind(any_port()).unwrap();
    let client = Side::new();
    let started = Instant::now();
    let err = datapath::connect(
        quiet.local_addr().unwrap(),
        &client.pd,
        &client.cq,
        &short(ift_params(true, true)),
        &[],
    )
    .err()
    .expect("nobody answers");
    let took = started.elapsed();
    assert!(
        matches!(err, DatapathError::Ift(IftError::StartupTimeout)),
        "{err:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "the initiator gave up after {took:?}"
    );
    drop(quiet);
}
