//! `iwarp-bench rping` against itself on loopback: the rping exchange the siw interop suite
//! (`scripts/siw-vm.sh test`) runs against Linux siw, here at sizes real rping cannot take
//! (16 B and 1 MiB) and with every MPA revision and CRC setting, both sides checking the data.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn rping_pair(
    size: u32,
    count: u32,
    server_args: &[&str],
    client_args: &[&str],
) -> (String, String) {
    rping_pair_counts(size, (count, count), server_args, client_args)
}

/// [`rping_pair`] with the server's and the client's `-C` apart.
fn rping_pair_counts(
    size: u32,
    (server_count, count): (u32, u32),
    server_args: &[&str],
    client_args: &[&str],
) -> (String, String) {
    let (server, client) = with_free_port(|port| {
        let mut server = Command::new(bin())
            .args(["rping", "-s", "-a", "127.0.0.1", "-p", port])
            .args(["-C", &server_count.to_string()])
            .args(["--timeout", "20"])
            .args(server_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rping server");
        let client = client_once_listening(&mut server, || {
            Command::new(bin())
                .args(["rping", "-c", "-a", "127.0.0.1", "-p", port])
                .args(["-C", &count.to_string(), "-S", &size.to_string()])
                .args(client_args)
                .output_within(RUN_LIMIT)
                .expect("run rping client")
        });
        (wait_with_timeout(server, Duration::from_secs(60)), client)
    });
    let (co, ce) = (
        String::from_utf8_lossy(&client.stdout).into_owned(),
        String::from_utf8_lossy(&client.stderr).into_owned(),
    );
    let (so, se) = (
        String::from_utf8_lossy(&server.stdout).into_owned(),
        String::from_utf8_lossy(&server.stderr).into_owned(),
    );
    assert!(
        client.status.success() && server.status.success(),
        "size {size} {server_args:?} {client_args:?}\nclient: {co}{ce}\nserver: {so}{se}"
    );
    (so, co)
}

#[test]
fn sizes_revisions_and_crc() {
    for size in [16u32, 4096, 1 << 20] {
        for rev in ["1", "2"] {
            for crc in ["on", "off"] {
                let args = ["--mpa-rev", rev, "--crc", crc];
                let (so, co) = rping_pair(size, 5, &args, &args);
                assert!(
                    co.contains(&format!("5 pings of {size} octets verified")),
                    "{co}"
                );
                assert!(so.contains("rping server: 5 pings"), "{so}");
                let want = format!("MPA rev {rev}, CRC {crc}");
                assert!(co.contains(&want) && so.contains(&want), "{want}: {co}{so}");
            }
        }
    }
}

/// `-C 0` is rping's "no count": on the server it asks for no count check, so a client's 5
/// pings pass (as real rping's server, which has no count check at all).
#[test]
fn server_count_0_checks_no_count() {
    let (so, co) = rping_pair_counts(64, (0, 5), &[], &[]);
    assert!(co.contains("5 pings of 64 octets verified"), "{co}");
    assert!(so.contains("rping server: 5 pings"), "{so}");
}

#[test]
fn verbose_prints_ping_data_like_rping() {
    let (so, co) = rping_pair(32, 2, &["-v"], &["-v"]);
    assert!(
        co.contains("ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQR\n"),
        "{co}"
    );
    assert!(
        co.contains("ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRS\n"),
        "{co}"
    );
    assert!(
        so.contains("server ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRS\n"),
        "{so}"
    );
}

#[test]
fn server_fails_when_count_differs() {
    let (server, ()) = with_free_port(|port| {
        let mut server = Command::new(bin())
            .args(["rping", "-s", "-a", "127.0.0.1", "-p", port, "-C", "3"])
            .args(["--timeout", "20"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rping server");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = Command::new(bin())
                .args(["rping", "-c", "-a", "127.0.0.1", "-p", port, "-C", "2"])
                .output_within(RUN_LIMIT)
                .expect("run rping client");
            let server_gone = matches!(server.try_wait(), Ok(Some(_)));
            if out.status.success() || server_gone || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (wait_with_timeout(server, Duration::from_secs(30)), ())
    });
    assert!(!server.status.success());
    assert!(
        String::from_utf8_lossy(&server.stderr).contains("2 pings ran, -C asked for 3"),
        "{}",
        String::from_utf8_lossy(&server.stderr)
    );
}
