//! Helpers for tests that run `iwarp-bench` as a process.
#![allow(dead_code)] // each test file uses a different subset

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::{ADDR_A, NS_A, NS_B};

/// Path of the built `iwarp-bench`.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_iwarp-bench"))
}

/// `iwarp-bench <args>` inside namespace `ns` (`ip netns exec`), stdout and stderr piped.
pub fn bench_in(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(bin()).args(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// Runs `f` (which starts a server on the port it is given, runs its client and returns the
/// server's output first) with a port from [`free_port`], and again with a fresh port, up to
/// four times, while the server reports its port taken (between [`free_port`] and the server's
/// bind another test's connection may get it as its ephemeral port).
pub fn with_free_port<T>(mut f: impl FnMut(&str) -> (Output, T)) -> (Output, T) {
    let mut attempt = 0;
    loop {
        let port = free_port().to_string();
        let (server, rest) = f(&port);
        if port_taken(&server) && attempt < 4 {
            attempt += 1;
            continue;
        }
        return (server, rest);
    }
}

/// Runs `iwarp-bench` server and client for `test` with `args` on loopback; returns both
/// outputs (server, client). The client retries while the server is not yet listening. A port
/// taken between [`free_port`] and the server's bind (another test's connection may get it as
/// its ephemeral port) is replaced by a fresh one ([`with_free_port`]).
pub fn run_pair(test: &str, port: u16, args: &[&str]) -> (Output, Output) {
    run_pair_with(test, port, args, &[])
}

/// [`run_pair`] with `client_args` given to the client only.
pub fn run_pair_with(
    test: &str,
    port: u16,
    args: &[&str],
    client_args: &[&str],
) -> (Output, Output) {
    run_pair_sides(test, port, args, &[], client_args)
}

/// [`run_pair`] with `server_args` given to the server only and `client_args` to the client
/// only.
pub fn run_pair_sides(
    test: &str,
    port: u16,
    args: &[&str],
    server_args: &[&str],
    client_args: &[&str],
) -> (Output, Output) {
    let first = run_pair_on_sides(test, &port.to_string(), args, server_args, client_args);
    if !port_taken(&first.0) {
        return first;
    }
    with_free_port(|port| run_pair_on_sides(test, port, args, server_args, client_args))
}

/// [`run_pair`] on `port` only: a taken port shows as the server's bind error.
pub fn run_pair_on(test: &str, port: &str, args: &[&str]) -> (Output, Output) {
    run_pair_on_sides(test, port, args, &[], &[])
}

/// [`run_pair_on`] with `server_args` given to the server only and `client_args` to the
/// client only.
pub fn run_pair_on_sides(
    test: &str,
    port: &str,
    args: &[&str],
    server_args: &[&str],
    client_args: &[&str],
) -> (Output, Output) {
    let mut server: Child = Command::new(bin())
        .args([test, "--bind", "127.0.0.1", "--port", port])
        .args(args)
        .args(server_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    let client = client_once_listening(&mut server, || {
        Command::new(bin())
            .args([test, "--port", port])
            .args(args)
            .args(client_args)
            .arg("127.0.0.1")
            .output_within(RUN_LIMIT)
            .expect("run client")
    });
    (wait_with_timeout(server, Duration::from_secs(60)), client)
}

/// Runs the client (`run`) again while it finds the server not yet listening (connection
/// refused), for up to 20 s; returns its last output. Stops early once `server` has exited: a
/// server that ended without listening (its port taken) will not come.
pub fn client_once_listening(server: &mut Child, mut run: impl FnMut() -> Output) -> Output {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = run();
        let refused = String::from_utf8_lossy(&out.stderr).contains("refused");
        let server_gone = matches!(server.try_wait(), Ok(Some(_)));
        if out.status.success() || !refused || server_gone || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a server's output says its port was taken when it bound it.
pub fn port_taken(server: &Output) -> bool {
    String::from_utf8_lossy(&server.stderr).contains("Address already in use")
}

/// Sends SIGINT (Ctrl-C) to a child.
pub fn interrupt(child: &Child) {
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -INT {}", child.id());
}

/// A helper process (a capture) killed and reaped when dropped: a test that panics leaves none
/// behind (a tcpdump left running would keep the test's output pipe open, and the suite would
/// never end).
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGINT to `child` and waits for its end, killing it after `within`.
pub fn interrupt_within(child: &mut Child, within: Duration) {
    // Not `interrupt`: a child that has ended already is no failure here.
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + within;
    while matches!(child.try_wait(), Ok(None)) {
        if Instant::now() > deadline {
            eprintln!(
                "[test: {} killed, still running {within:?} after SIGINT]",
                child.id()
            );
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads a child's stdout on a thread: each line to the returned channel as it comes, all of
/// it as the thread's result once the pipe closes (`wait_with_timeout` then finds no stdout
/// to collect: put it back into its `Output`).
pub fn stream_stdout(child: &mut Child) -> (mpsc::Receiver<String>, JoinHandle<Vec<u8>>) {
    let stdout = child.stdout.take().expect("a piped stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        // Split on bytes, not `lines`: a line that is not UTF-8 must not stop the reading.
        for line in BufReader::new(stdout).split(b'\n').map_while(Result::ok) {
            all.extend_from_slice(&line);
            all.push(b'\n');
            let _ = tx.send(String::from_utf8_lossy(&line).into_owned());
        }
        all
    });
    (rx, reader)
}

/// Waits until `n` of the lines from `lines` pass `wanted`; false if `within` passes first
/// (or the lines end).
pub fn lines_seen(
    lines: &mpsc::Receiver<String>,
    n: usize,
    wanted: impl Fn(&str) -> bool,
    within: Duration,
) -> bool {
    let deadline = Instant::now() + within;
    let mut seen = 0;
    while seen < n {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if wanted(&line) => seen += 1,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    true
}

/// How long a test lets one run of `iwarp-bench` (or of a tool beside it) take before it
/// kills it: a hung run fails its test instead of holding the suite.
pub const RUN_LIMIT: Duration = Duration::from_secs(120);

pub use testbed::process::{wait_with_timeout, OutputWithin};

/// True when running as root.
pub fn is_root() -> bool {
    // The effective uid is the third field of the Uid: line.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Whether `cmd` is on PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output_within(RUN_LIMIT)
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// In CI a missing prerequisite is a failure; elsewhere the test is skipped with the reason.
pub fn require(ok: bool, why: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
        panic!("CI=true but {why}");
    }
    testbed::skipped(why);
    false
}

/// Waits until a capture file has stopped growing for `quiet`, at most `limit`. tcpdump `-U`
/// writes each packet when it reads it from the kernel; on a loaded machine it lags behind the
/// run, and packets still queued when it gets SIGINT are never written (a fixed short sleep
/// before stopping it lost the last Writes of a run under load).
pub fn wait_until_file_settles(path: &Path, quiet: Duration, limit: Duration) {
    let start = Instant::now();
    let size = || std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut last = size();
    let mut since = Instant::now();
    while start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
        let now = size();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return;
        }
    }
}

/// `tshark -V` of a capture. Our Send payloads (control messages) are not RPC-over-RDMA or SMB
/// Direct: those heuristic dissectors are disabled so they do not claim them and report them
/// as malformed. Heuristic dissectors (MPA's among them) go first: an ephemeral port that
/// some protocol registered (48898 is Beckhoff AMS's) would otherwise take the stream.
pub fn tshark_verbose(path: &Path) -> String {
    let out = Command::new("tshark")
        .args(["-n", "-V", "-o", "tcp.try_heuristic_first:TRUE"])
        .args(["--disable-protocol", "rpcordma"])
        .args(["--disable-protocol", "smb_direct", "-r"])
        .arg(path)
        .output_within(RUN_LIMIT)
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// How many times `needle` occurs in `hay`.
pub fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

// ---------------------------------------------------------------------------------------------
// Runs on the veth bed with `--json`.

pub fn parse(what: &str, out: &std::process::Output) -> Value {
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed:\n{so}\n{se}");
    serde_json::from_str(so.trim())
        .unwrap_or_else(|e| panic!("{what}: stdout is not one JSON object ({e}):\n{so}\n{se}"))
}

/// Counter `name` of a side's `"engine"` object (fails the test when absent or not a number).
pub fn counter(side: &Value, name: &str) -> u64 {
    side["engine"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no engine counter {name:?} in {side}"))
}

/// Runs `server_args` in `iwa` (the veth bed's `testbed::NS_A`) and `client_args` (then the server's address) in `iwb`, both
/// `iwarp-bench`; returns the client's and the server's JSON. With --json the server says
/// nothing when it listens: the client retries while the server's kernel still answers the SYN
/// with a reset.
pub fn bed_run(server_args: &[String], client_args: &[String]) -> (Value, Value) {
    let (client, server) = bed_pair(server_args, client_args);
    (parse("client", &client), parse("server", &server))
}

/// [`bed_run`]'s outputs as they are (client, server), whatever they say.
pub fn bed_pair(server_args: &[String], client_args: &[String]) -> (Output, Output) {
    bed_pair_in((NS_A, ADDR_A), server_args, NS_B, client_args)
}

/// [`bed_pair`] with the server in namespace `server.0` at address `server.1` and the client
/// in `client_ns`.
pub fn bed_pair_in(
    server: (&str, Ipv4Addr),
    server_args: &[String],
    client_ns: &str,
    client_args: &[String],
) -> (Output, Output) {
    let (server_ns, server_addr) = server;
    let server = bench_in(
        server_ns,
        &server_args.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .spawn()
    .expect("start server");
    let addr = server_addr.to_string();
    let mut client_args: Vec<&str> = client_args.iter().map(String::as_str).collect();
    client_args.push(&addr);
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = loop {
        let out = bench_in(client_ns, &client_args)
            .output_within(RUN_LIMIT)
            .expect("run client");
        let refused = String::from_utf8_lossy(&out.stderr).contains("refused");
        if out.status.success() || !refused || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let server = wait_with_timeout(server, Duration::from_secs(60));
    (client, server)
}

/// A tool process whose stderr lines are collected on a thread; killed if dropped before
/// [`Tool::finish`] (a test that panics leaves no server behind).
pub struct Tool {
    child: Option<Child>,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Tool {
    pub fn start(mut cmd: Command) -> Tool {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start iwarp-bench");
        let err = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Tool {
            child: Some(child),
            stderr: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `what`; returns it.
    pub fn wait_for(&mut self, what: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) if line.contains(what) => return line,
                Ok(line) => self.seen.push(line),
                Err(_) => {
                    let status = self.child.take().map(|mut c| {
                        let _ = c.kill();
                        c.wait()
                    });
                    self.seen.extend(self.stderr.try_iter());
                    panic!(
                        "no {what:?} from iwarp-bench within {timeout:?}; exit {status:?}, stderr: {:?}",
                        self.seen
                    );
                }
            }
        }
    }

    /// Waits for the process (killed after `timeout`); its output, and every stderr line it
    /// wrote: read until its reader has forwarded the last (the pipe closed; 2 s at most, for
    /// a pipe another process still holds).
    pub fn finish(mut self, timeout: Duration) -> (Output, String) {
        let child = self.child.take().expect("a Tool is finished once");
        let out = wait_with_timeout(child, timeout);
        let mut err = std::mem::take(&mut self.seen);
        let until = Instant::now() + Duration::from_secs(2);
        while let Ok(line) = self
            .stderr
            .recv_timeout(until.saturating_duration_since(Instant::now()))
        {
            err.push(line);
        }
        (out, err.join("\n"))
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn json(out: &Output, stderr: &str, what: &str) -> serde_json::Value {
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {s}\nstderr:\n{stderr}",
        out.status
    );
    serde_json::from_str(s.trim()).unwrap_or_else(|e| {
        panic!("{what}: stdout is not one JSON object ({e}):\n{s}\nstderr:\n{stderr}")
    })
}
