//! `scripts/bench-relay.sh` run with stubs in place of `iwarp-bench` and `iwarp-relay`
//! (`BIN=`, `RELAY=`): a row whose client or relay fails ends the script non-zero with the
//! row's logs (the relay's error among them) on stderr, no server left running and no
//! temporary directory left behind; a SIGTERM while a row runs ends it likewise, as the signal
//! does.
//!
//! The script brings the real relay bed up (`scripts/netns-relay.sh`, under the beds' lock,
//! which it takes itself), so these tests need root. Without it they print `SKIPPED: <why>`
//! and pass, except under `CI=true`, where they fail with the reason.

mod stubbed;

/// The `iwarp-bench` stub: a server (no `10.78.0.1` among its arguments) records its pid in
/// `$STUB_DIR/servers`, says it listens and waits a minute; a client fails at once, or with
/// `$STUB_MODE` `clienthang` records its pid in `$STUB_DIR/clients` and waits a minute.
const BENCH_STUB: &str = r#"#!/usr/bin/env bash
for a; do
  if [ "$a" = 10.78.0.1 ]; then
    if [ "$STUB_MODE" = clienthang ]; then
      echo $$ >>"$STUB_DIR/clients"
      exec sleep 60
    fi
    echo "iwarp-bench: connect to 10.78.0.1:18800: timed out (stub client)" >&2
    exit 1
  fi
done
echo $$ >>"$STUB_DIR/servers"
echo "iwarp-bench: write-bw server listening (stub)" >&2
exec sleep 60
"#;

/// The `iwarp-relay` stub: with `$STUB_MODE` `relayfail` it fails at its start; otherwise it
/// records its pid in `$STUB_DIR/relays` and forwards (says so) until its standard input ends,
/// then prints counters.
const RELAY_STUB: &str = r#"#!/usr/bin/env bash
if [ "$STUB_MODE" = relayfail ]; then
  echo "iwarp-relay: opening iwrr0: stub failure" >&2
  exit 1
fi
echo $$ >>"$STUB_DIR/relays"
echo "iwarp-relay: forwarding (stub)" >&2
cat >/dev/null
echo "relay a->b: DirStats { dropped: 0 }"
echo "relay b->a: DirStats { dropped: 0 }"
"#;

/// What one run of the script left.
struct Run {
    run: stubbed::ScriptRun,
    /// What the script left in its temporary directory's parent (`TMPDIR`).
    left_in_tmpdir: Vec<String>,
}

/// Runs `ROWS=aligned-1 scripts/bench-relay.sh` with the stubs, the relay's in `mode` (root,
/// or `None` after `SKIPPED`); no stub server may be left running.
fn bench_relay(mode: &str) -> Option<Run> {
    bench_relay_signalled(mode, false)
}

/// [`bench_relay`], sent SIGTERM once the row's client runs when `term` (then given 20 s to
/// end); no stub server, client or relay may be left running.
fn bench_relay_signalled(mode: &str, term: bool) -> Option<Run> {
    if !stubbed::root_or_skip("not root: scripts/bench-relay.sh needs root (the relay bed)") {
        return None;
    }
    let dir = stubbed::stub_dir(&format!("bench-relay-{mode}"));
    let tmpdir = dir.join("tmp");
    std::fs::create_dir_all(&tmpdir).expect("stub dir");
    let bench = stubbed::stub(&dir, "iwarp-bench", BENCH_STUB);
    let relay = stubbed::stub(&dir, "iwarp-relay", RELAY_STUB);
    let env: &[(&str, &std::ffi::OsStr)] = &[
        ("BIN", bench.as_os_str()),
        ("RELAY", relay.as_os_str()),
        ("ROWS", "aligned-1".as_ref()),
        ("STUB_MODE", mode.as_ref()),
        ("TMPDIR", tmpdir.as_os_str()),
    ];
    let run = match term {
        false => stubbed::run_script("bench-relay.sh", &dir, env, &[]),
        true => stubbed::run_script_signalled(
            "bench-relay.sh",
            &dir,
            env,
            |dir| !stubbed::pids(&dir.join("clients")).is_empty(),
            "TERM",
            std::time::Duration::from_secs(20),
        ),
    };
    let relays = stubbed::pids(&dir.join("relays"));
    let live_relays: Vec<u32> = relays
        .iter()
        .copied()
        .filter(|&p| stubbed::alive(p))
        .collect();
    for pid in &live_relays {
        let _ = std::process::Command::new("kill")
            .arg("-9")
            .arg(pid.to_string())
            .status();
    }
    let left_in_tmpdir = std::fs::read_dir(&tmpdir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        run.live_servers.is_empty() && run.live_clients.is_empty() && live_relays.is_empty(),
        "left running: servers {:?}, clients {:?}, relays {live_relays:?}\n{}",
        run.live_servers,
        run.live_clients,
        run.stderr
    );
    Some(Run {
        run,
        left_in_tmpdir,
    })
}

#[test]
fn a_failed_client_stops_its_server_and_shows_every_log() {
    let Some(Run {
        run,
        left_in_tmpdir,
    }) = bench_relay("clientfail")
    else {
        return;
    };
    let err = &run.stderr;
    assert_eq!(run.code, Some(1), "{err}");
    assert!(!run.servers.is_empty(), "{err}");
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
    assert!(left_in_tmpdir.is_empty(), "left: {left_in_tmpdir:?}");
}

#[test]
fn a_relay_that_fails_at_its_start_is_reported() {
    let Some(Run {
        run,
        left_in_tmpdir,
    }) = bench_relay("relayfail")
    else {
        return;
    };
    let err = &run.stderr;
    assert_eq!(run.code, Some(1), "{err}");
    assert!(err.contains("the relay ended before it forwarded"), "{err}");
    assert!(
        err.contains("opening iwrr0: stub failure"),
        "the relay's error: {err}"
    );
    assert!(run.servers.is_empty(), "no server without a relay: {err}");
    assert!(left_in_tmpdir.is_empty(), "left: {left_in_tmpdir:?}");
}

/// A SIGTERM while a row's client runs ends the script within seconds, as the signal does (143
/// for its caller), with the row's server, client and relay stopped (the trap of
/// scripts/lib/jobs.sh's `on_exit`; the client run by `waited`) and no temporary directory
/// left behind.
#[test]
fn a_sigterm_stops_the_rows_server_client_and_relay() {
    let Some(Run {
        run,
        left_in_tmpdir,
    }) = bench_relay_signalled("clienthang", true)
    else {
        return;
    };
    let err = &run.stderr;
    assert!(
        run.signal == Some(15) || run.code == Some(143),
        "exit {:?} signal {:?}: {err}",
        run.code,
        run.signal
    );
    assert!(!run.servers.is_empty() && !run.clients.is_empty(), "{err}");
    assert!(left_in_tmpdir.is_empty(), "left: {left_in_tmpdir:?}");
}
