//! The examples (`datapath/examples/`) run on loopback over the socket transport: the
//! `server` with the `client`, and with the `client --epoll` (completions waited for in epoll
//! on a completion channel). `cargo test` builds the examples first.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// An example binary built by this `cargo test` (target/<profile>/examples/NAME).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} not built (cargo test builds the examples)",
        path.display()
    );
    path
}

/// Kills the child if the test fails before it is waited for.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (bounded) for the child to exit; its status and its whole output.
fn finish(mut child: Reaped, what: &str) -> (bool, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.0.try_wait().expect("try_wait") {
            let mut out = String::new();
            if let Some(mut o) = child.0.stdout.take() {
                std::io::Read::read_to_string(&mut o, &mut out).expect("stdout");
            }
            return (status.success(), out);
        }
        assert!(Instant::now() < deadline, "{what} did not exit in time");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_pair(client_args: &[&str]) -> (String, String) {
    let mut server = Reaped(
        Command::new(example("server"))
            .arg("127.0.0.1:0")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server example"),
    );
    // The server's lines, read on a thread so that every wait for them is bounded.
    let stdout = server.0.stdout.take().expect("server stdout");
    let (line_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if line_tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = lines
        .recv_timeout(Duration::from_secs(60))
        .expect("the server's first line within a minute");
    let addr = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("server said {first:?}"))
        .to_owned();
    let client = Reaped(
        Command::new(example("client"))
            .args(client_args)
            .arg(&addr)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the client example"),
    );
    let (client_ok, client_out) = finish(client, "client");
    let (server_ok, _) = finish(server, "server");
    // The rest of the server's output: its stdout is closed now that it exited.
    let mut rest = String::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) {
        rest.push_str(&line);
        rest.push('\n');
    }
    assert!(client_ok, "client failed: {client_out}");
    assert!(server_ok, "server failed: {rest}");
    (client_out, rest)
}

#[test]
fn server_and_client_examples_on_loopback() {
    let (client, server) = run_pair(&[]);
    assert!(
        client.contains("read back \"written by RDMA Write"),
        "{client}"
    );
    assert!(client.contains("client done"), "{client}");
    assert!(server.contains("client wrote 45 bytes"), "{server}");
    assert!(
        server.contains("its Send says \"done, thanks\""),
        "{server}"
    );
    assert!(server.contains("server done"), "{server}");
}

#[test]
fn client_example_waiting_in_epoll() {
    let (client, server) = run_pair(&["--epoll"]);
    assert!(client.contains("client done (epoll)"), "{client}");
    assert!(server.contains("server done"), "{server}");
}
