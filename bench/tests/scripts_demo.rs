//! `scripts/demo.sh` run with a stub in place of `iwarp-bench` (`BIN=stub`): the script falls
//! back to the socket transport on loopback only where AF_XDP is not possible (here: the engine
//! cannot start), and any other failure of its AF_XDP run (a data check) ends it non-zero; its
//! client tries again only while it finds the connection refused.
//!
//! The script brings the real veth test bed up (`scripts/netns.sh`, under the bed's lock, which
//! it takes itself), so these tests need root. Without it they print `SKIPPED: <why>` and pass,
//! except under `CI=true`, where they fail with the reason.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The stub: what it was asked is appended to `$STUB_DIR/calls` ("SIDE TRANSPORT TEST"), each
/// server's pid to `$STUB_DIR/servers`; `$STUB_MODE` picks how the AF_XDP runs go:
/// * `ok`: both sides succeed;
/// * `noengine`: either side fails as iwarp-bench does when the AF_XDP engine cannot start;
/// * `mismatch`: the client fails its data check, the server waits (as one whose client went
///   away would);
/// * `rejected`: the client's connection is refused by the server's MPA layer (not by TCP),
///   the server waits;
/// * `late`: the client finds the connection refused (nobody listening yet) three times in
///   each test, then succeeds.
///
/// Runs over the socket transport always succeed.
const STUB: &str = r#"#!/usr/bin/env bash
test=$1
shift
transport=socket addr=""
while [ $# -gt 0 ]; do
  case $1 in
    --transport) transport=$2; shift 2 ;;
    --iface|--bind|--port|-s|-n) shift 2 ;;
    -*) shift ;;
    *) addr=$1; shift ;;
  esac
done
side=server
[ -z "$addr" ] || side=client
echo "$side $transport $test" >>"$STUB_DIR/calls"
mode=$STUB_MODE
[ "$transport" = xdp ] || mode=ok
if [ "$side" = server ]; then
  echo $$ >>"$STUB_DIR/servers"
  case $mode in
    noengine) echo "iwarp-bench: starting the AF_XDP engine on iwa0: stub: no XDP here" >&2; exit 1 ;;
    mismatch|rejected) echo "iwarp-bench: $test server listening (stub)" >&2; exec sleep 60 ;;
    *) echo "iwarp-bench: $test server listening (stub)" >&2; sleep 3; exit 0 ;;
  esac
fi
case $mode in
  noengine) echo "iwarp-bench: starting the AF_XDP engine on iwb0: stub: no XDP here" >&2; exit 1 ;;
  mismatch) echo "iwarp-bench: data mismatch in message 0 at octet 17 (stub)" >&2; exit 1 ;;
  rejected) echo "iwarp-bench: connect to $addr: the server refused the MPA Request (stub)" >&2; exit 1 ;;
  late)
    n=$(grep -c "^client xdp $test$" "$STUB_DIR/calls")
    if [ "$n" -le 3 ]; then
      echo "iwarp-bench: connect to $addr:18515: I/O error: connection refused" >&2
      exit 1
    fi ;;
esac
echo "stub $test client: done"
"#;

/// What one run of the script left: its status, output and the stub's records.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// The stub's calls, one "SIDE TRANSPORT TEST" each.
    calls: Vec<String>,
    /// Stub servers still running after the script ended.
    live_servers: Vec<u32>,
}

/// Root, or `SKIPPED` (a failure under `CI=true`).
fn root_or_skip() -> bool {
    if testbed::is_root() {
        return true;
    }
    let why = "not root: scripts/demo.sh runs AF_XDP on the veth test bed only as root";
    if testbed::ci() {
        panic!("CI=true, so this fails: {why}");
    }
    testbed::skipped(why);
    false
}

/// A directory of its own for one test's stub.
fn stub_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iwarp-demo-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("stub dir");
    let stub = dir.join("iwarp-bench");
    std::fs::write(&stub, STUB).expect("write the stub");
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// Reads `pipe` to its end in a thread.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    })
}

/// Whether process `pid` still runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// Runs `scripts/demo.sh` with the stub in `mode`, for at most two minutes (then killed).
fn demo(mode: &str) -> Run {
    let dir = stub_dir(mode);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/demo.sh");
    let mut child = Command::new(script)
        .env("BIN", dir.join("iwarp-bench"))
        .env("STUB_DIR", &dir)
        .env("STUB_MODE", mode)
        .env_remove("DEMO_TRANSPORT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start scripts/demo.sh");
    let (out, err) = (
        drain(child.stdout.take().expect("stdout")),
        drain(child.stderr.take().expect("stderr")),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("scripts/demo.sh still running after 120 s (stub mode {mode})");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let live_servers: Vec<u32> = read("servers")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|&pid| alive(pid))
        .collect();
    // A stub server left running holds the pipes open: read them only when none is.
    let (stdout, stderr) = if live_servers.is_empty() {
        (
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default(),
        )
    } else {
        Default::default()
    };
    let calls = read("calls").lines().map(str::to_owned).collect();
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        code: status.code(),
        stdout,
        stderr,
        calls,
        live_servers,
    }
}

/// Kills the stub servers a failed run left behind (so that they free the bed's lock).
fn reap(run: &Run) {
    for pid in &run.live_servers {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
}

#[test]
fn a_data_check_failing_over_af_xdp_fails_the_demo() {
    if !root_or_skip() {
        return;
    }
    let run = demo("mismatch");
    reap(&run);
    let text = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(
        run.live_servers.is_empty(),
        "stub servers left running: {:?}",
        run.live_servers
    );
    assert_eq!(run.code, Some(1), "{text}");
    assert!(
        run.stderr.contains("data mismatch"),
        "the client's error is shown: {text}"
    );
    assert!(run.stderr.contains("not falling back"), "{text}");
    assert!(
        !run.calls.iter().any(|c| c.contains(" socket ")),
        "no socket run hides the failure: {:?}",
        run.calls
    );
}

#[test]
fn an_engine_that_cannot_start_falls_back_to_sockets() {
    if !root_or_skip() {
        return;
    }
    let run = demo("noengine");
    reap(&run);
    let text = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(
        run.live_servers.is_empty(),
        "stub servers left running: {:?}",
        run.live_servers
    );
    assert_eq!(run.code, Some(0), "{text}");
    assert!(
        run.stdout.contains("falling back to the socket transport"),
        "{text}"
    );
    assert!(
        run.stderr.contains("starting the AF_XDP engine on"),
        "the reason is shown: {text}"
    );
    for test in ["write-bw", "write-lat"] {
        for side in ["server", "client"] {
            let call = format!("{side} socket {test}");
            assert!(run.calls.contains(&call), "no {call}: {:?}", run.calls);
        }
    }
}

#[test]
fn a_connection_refused_by_mpa_is_not_retried() {
    if !root_or_skip() {
        return;
    }
    let run = demo("rejected");
    reap(&run);
    let text = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(
        run.live_servers.is_empty(),
        "stub servers left running: {:?}",
        run.live_servers
    );
    assert_eq!(run.code, Some(1), "{text}");
    let tries = run
        .calls
        .iter()
        .filter(|c| *c == "client xdp write-bw")
        .count();
    assert_eq!(tries, 1, "the client ran once: {:?}\n{text}", run.calls);
    assert!(run.stderr.contains("refused the MPA Request"), "{text}");
}

#[test]
fn a_client_too_early_tries_again_and_the_demo_passes() {
    if !root_or_skip() {
        return;
    }
    let run = demo("late");
    reap(&run);
    let text = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(
        run.live_servers.is_empty(),
        "stub servers left running: {:?}",
        run.live_servers
    );
    assert_eq!(run.code, Some(0), "{text}");
    assert!(!run.stdout.contains("falling back"), "{text}");
    let tries = |test: &str| {
        let call = format!("client xdp {test}");
        run.calls.iter().filter(|c| **c == call).count()
    };
    assert_eq!(tries("write-bw"), 4, "{:?}", run.calls);
    assert_eq!(tries("write-lat"), 4, "{:?}", run.calls);
    assert!(
        !run.calls.iter().any(|c| c.contains(" socket ")),
        "{:?}",
        run.calls
    );
}
