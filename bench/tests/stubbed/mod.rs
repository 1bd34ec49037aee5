//! Running a script of `scripts/` with stubs in place of the project's binaries (the scripts
//! take `BIN=` and the like): the tests of `scripts_demo.rs` and `scripts_bench_relay.rs`, and
//! `compare_interrupted.rs` (stubs on `PATH`).
//! Each stub server appends its process number to `$STUB_DIR/servers`, each stub client that
//! runs until stopped to `$STUB_DIR/clients`.
#![allow(dead_code)] // each test file uses a different subset

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a script may run before the test kills it and fails.
const SCRIPT_LIMIT: Duration = Duration::from_secs(120);

/// Root, or `SKIPPED: <why>` (a failure under `CI=true`): the scripts bring the project's
/// test beds up.
pub fn root_or_skip(why: &str) -> bool {
    if testbed::is_root() {
        return true;
    }
    if testbed::ci() {
        panic!("CI=true, so this fails: {why}");
    }
    testbed::skipped(why);
    false
}

/// A fresh directory for one test's stubs (its `STUB_DIR`).
pub fn stub_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iwarp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("stub dir");
    dir
}

/// Writes an executable script `name` with `text` into `dir`.
pub fn stub(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a stub");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// What one run of a script left.
pub struct ScriptRun {
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The stub servers that ran.
    pub servers: Vec<u32>,
    /// Those still running when the script ended (killed since).
    pub live_servers: Vec<u32>,
    /// The stub clients that recorded themselves (`$STUB_DIR/clients`).
    pub clients: Vec<u32>,
    /// Those still running when the script ended (killed since).
    pub live_clients: Vec<u32>,
}

/// The process numbers listed in `file`, one a line (none if it is absent).
pub fn pids(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Whether process `pid` still runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// Reads `pipe` to its end in a thread; what it read comes on the channel.
fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    rx
}

/// What [`drain`] read, once the pipe closed (5 s at most: a process the script left behind
/// may hold it, which the text then says).
fn drained(rx: &mpsc::Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(5))
        .unwrap_or_else(|_| "(not closed: a process the script started still holds it)".into())
}

/// Runs `scripts/NAME` with `env` and `STUB_DIR=dir` (and without the variables `unset`), for
/// at most two minutes (then killed, and the test fails); the stub servers still running after
/// it are killed (so that they free the beds' lock) and reported.
pub fn run_script(
    name: &str,
    dir: &Path,
    env: &[(&str, &std::ffi::OsStr)],
    unset: &[&str],
) -> ScriptRun {
    let (child, out, err) = start_script(name, dir, env, unset);
    let status = wait_until(child, Instant::now() + SCRIPT_LIMIT);
    finish_script(name, dir, status, SCRIPT_LIMIT, &out, &err)
}

/// [`run_script`], but once `ready(dir)` holds (looked at every 50 ms, for at most two
/// minutes) the script is sent `signal` (`"TERM"`, `"INT"`), then has `limit` to end (or it is
/// killed, and the test fails).
pub fn run_script_signalled(
    name: &str,
    dir: &Path,
    env: &[(&str, &std::ffi::OsStr)],
    ready: impl Fn(&Path) -> bool,
    signal: &str,
    limit: Duration,
) -> ScriptRun {
    let (mut child, out, err) = start_script(name, dir, env, &[]);
    let deadline = Instant::now() + SCRIPT_LIMIT;
    while !ready(dir) {
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            // (Still running at the deadline: killed, and `finish_script` fails the test.)
            let status = wait_until(child, Instant::now());
            let run = finish_script(name, dir, status, SCRIPT_LIMIT, &out, &err);
            panic!(
                "scripts/{name} ended before it was ready for the signal (exit {:?}): {}",
                run.code, run.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{signal} {}", child.id());
    let status = wait_until(child, Instant::now() + limit);
    finish_script(name, dir, status, limit, &out, &err)
}

/// Starts `scripts/NAME` as [`run_script`] says; its stdout and stderr are read on threads.
fn start_script(
    name: &str,
    dir: &Path,
    env: &[(&str, &std::ffi::OsStr)],
    unset: &[&str],
) -> (Child, mpsc::Receiver<String>, mpsc::Receiver<String>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(name);
    let mut cmd = Command::new(&script);
    for var in unset {
        cmd.env_remove(var);
    }
    let mut child = cmd
        .envs(env.iter().copied())
        .env("STUB_DIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start scripts/{name}: {e}"));
    let (out, err) = (
        drain(child.stdout.take().expect("stdout")),
        drain(child.stderr.take().expect("stderr")),
    );
    (child, out, err)
}

/// The child's status once it ended, or `None` after killing it at `deadline`.
fn wait_until(mut child: Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the script left ([`ScriptRun`]); the stubs still running are killed first (so that
/// they free the beds' lock), and a script that was still running (`status` `None`, killed
/// after `limit`) fails the test.
fn finish_script(
    name: &str,
    dir: &Path,
    status: Option<ExitStatus>,
    limit: Duration,
    out: &mpsc::Receiver<String>,
    err: &mpsc::Receiver<String>,
) -> ScriptRun {
    let (servers, clients) = (pids(&dir.join("servers")), pids(&dir.join("clients")));
    let live = |pids: &[u32]| -> Vec<u32> { pids.iter().copied().filter(|&p| alive(p)).collect() };
    let (live_servers, live_clients) = (live(&servers), live(&clients));
    for pid in live_servers.iter().chain(&live_clients) {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
    // After the stubs are gone (they would hold the beds' lock).
    let Some(status) = status else {
        panic!(
            "scripts/{name} still running after {limit:?} (killed); stderr: {}",
            drained(err)
        );
    };
    // A stub left running held the pipes open: read once they are gone.
    let (stdout, stderr) = (drained(out), drained(err));
    ScriptRun {
        code: status.code(),
        signal: status.signal(),
        stdout,
        stderr,
        servers,
        live_servers,
        clients,
        live_clients,
    }
}
