//! `scripts/bench-relay.sh` run with stubs in place of `iwarp-bench` and `iwarp-relay`
//! (`BIN=`, `RELAY=`): a row whose client or relay fails ends the script non-zero with the
//! row's logs (the relay's error among them) on stderr, no server left running and no
//! temporary directory left behind.
//!
//! The script brings the real relay bed up (`scripts/netns-relay.sh`, under the beds' lock,
//! which it takes itself), so these tests need root. Without it they print `SKIPPED: <why>`
//! and pass, except under `CI=true`, where they fail with the reason.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The `iwarp-bench` stub: a server (no `10.78.0.1` among its arguments) records its pid in
/// `$STUB_DIR/servers`, says it listens and waits a minute; a client fails at once.
const BENCH_STUB: &str = r#"#!/usr/bin/env bash
for a; do
  if [ "$a" = 10.78.0.1 ]; then
    echo "iwarp-bench: connect to 10.78.0.1:18800: timed out (stub client)" >&2
    exit 1
  fi
done
echo $$ >>"$STUB_DIR/servers"
echo "iwarp-bench: write-bw server listening (stub)" >&2
exec sleep 60
"#;

/// The `iwarp-relay` stub: with `$STUB_MODE` `relayfail` it fails at its start; otherwise it
/// forwards (says so) until its standard input ends, then prints counters.
const RELAY_STUB: &str = r#"#!/usr/bin/env bash
if [ "$STUB_MODE" = relayfail ]; then
  echo "iwarp-relay: opening iwrr0: stub failure" >&2
  exit 1
fi
echo "iwarp-relay: forwarding (stub)" >&2
cat >/dev/null
echo "relay a->b: DirStats { dropped: 0 }"
echo "relay b->a: DirStats { dropped: 0 }"
"#;

/// What one run of the script left.
struct Run {
    code: Option<i32>,
    stderr: String,
    /// Stub servers still running after the script ended.
    live_servers: Vec<u32>,
    /// What the script left in its temporary directory's parent (`TMPDIR`).
    left_in_tmpdir: Vec<String>,
    /// Whether any stub server ran.
    servers_started: bool,
}

/// Root, or `SKIPPED` (a failure under `CI=true`).
fn root_or_skip() -> bool {
    if testbed::is_root() {
        return true;
    }
    let why = "not root: scripts/bench-relay.sh needs root (the relay bed)";
    if testbed::ci() {
        panic!("CI=true, so this fails: {why}");
    }
    testbed::skipped(why);
    false
}

/// Writes an executable script `name` with `text` into `dir`.
fn stub(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a stub");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Whether process `pid` still runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// Runs `ROWS=aligned-1 scripts/bench-relay.sh` with the stubs, the relay's in `mode`, for at
/// most two minutes (then killed).
fn bench_relay(mode: &str) -> Run {
    let dir = std::env::temp_dir().join(format!("iwarp-bench-relay-{}-{mode}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tmpdir = dir.join("tmp");
    std::fs::create_dir_all(&tmpdir).expect("stub dir");
    let bench = stub(&dir, "iwarp-bench", BENCH_STUB);
    let relay = stub(&dir, "iwarp-relay", RELAY_STUB);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/bench-relay.sh");
    let mut child = Command::new(script)
        .env("BIN", bench)
        .env("RELAY", relay)
        .env("ROWS", "aligned-1")
        .env("STUB_DIR", &dir)
        .env("STUB_MODE", mode)
        .env("TMPDIR", &tmpdir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start scripts/bench-relay.sh");
    let mut pipe = child.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("scripts/bench-relay.sh still running after 120 s (relay stub {mode})");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let servers: Vec<u32> = std::fs::read_to_string(dir.join("servers"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let live_servers: Vec<u32> = servers.iter().copied().filter(|&p| alive(p)).collect();
    // A stub server left running holds the pipe open: read it only when none is.
    let stderr = if live_servers.is_empty() {
        err.join().unwrap_or_default()
    } else {
        String::new()
    };
    let left_in_tmpdir = std::fs::read_dir(&tmpdir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for pid in &live_servers {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        code: status.code(),
        stderr,
        live_servers,
        left_in_tmpdir,
        servers_started: !servers.is_empty(),
    }
}

#[test]
fn a_failed_client_stops_its_server_and_shows_every_log() {
    if !root_or_skip() {
        return;
    }
    let run = bench_relay("clientfail");
    assert!(
        run.live_servers.is_empty(),
        "servers left running: {:?}",
        run.live_servers
    );
    let err = &run.stderr;
    assert_eq!(run.code, Some(1), "{err}");
    assert!(run.servers_started, "{err}");
    assert!(err.contains("the client failed"), "{err}");
    assert!(
        err.contains("timed out (stub client)"),
        "the client's log: {err}"
    );
    assert!(
        err.contains("server listening (stub)"),
        "the server's log: {err}"
    );
    assert!(
        err.contains("iwarp-relay: forwarding (stub)"),
        "the relay's log: {err}"
    );
    assert!(
        err.contains("relay b->a: DirStats"),
        "the relay stopped: {err}"
    );
    assert!(
        run.left_in_tmpdir.is_empty(),
        "left: {:?}",
        run.left_in_tmpdir
    );
}

#[test]
fn a_relay_that_fails_at_its_start_is_reported() {
    if !root_or_skip() {
        return;
    }
    let run = bench_relay("relayfail");
    assert!(
        run.live_servers.is_empty(),
        "servers left running: {:?}",
        run.live_servers
    );
    let err = &run.stderr;
    assert_eq!(run.code, Some(1), "{err}");
    assert!(err.contains("the relay ended before it forwarded"), "{err}");
    assert!(
        err.contains("opening iwrr0: stub failure"),
        "the relay's error: {err}"
    );
    assert!(!run.servers_started, "no server without a relay: {err}");
    assert!(
        run.left_in_tmpdir.is_empty(),
        "left: {:?}",
        run.left_in_tmpdir
    );
}
