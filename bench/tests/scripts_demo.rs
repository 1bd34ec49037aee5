//! `scripts/demo.sh` run with a stub in place of `iwarp-bench` (`BIN=stub`): the script falls
//! back to the socket transport on loopback only where AF_XDP is not possible (here: the engine
//! cannot start), and any other failure of its AF_XDP run (a data check) ends it non-zero; its
//! client tries again only while it finds the connection refused.
//!
//! The script brings the real veth test bed up (`scripts/netns.sh`, under the bed's lock, which
//! it takes itself), so these tests need root. Without it they print `SKIPPED: <why>` and pass,
//! except under `CI=true`, where they fail with the reason. (The SIGTERM test runs over the
//! socket transport on loopback: no bed, no root.)

/// The stub: what it was asked is appended to `$STUB_DIR/calls` ("SIDE TRANSPORT TEST"), each
/// server's pid to `$STUB_DIR/servers`; `$STUB_MODE` picks how the AF_XDP runs go:
/// * `ok`: both sides succeed;
/// * `noengine`: either side fails as iwarp-bench does when the AF_XDP engine cannot start;
/// * `mismatch`: the client fails its data check, the server waits (as one whose client went
///   away would);
/// * `rejected`: the client's connection is refused by the server's MPA layer (not by TCP),
///   the server waits;
/// * `late`: the client finds the connection refused (nobody listening yet) three times in
///   each test, then succeeds;
/// * `hang`: over either transport, the server says it listens and the client records its pid
///   in `$STUB_DIR/clients`, and both run until stopped.
///
/// Other runs over the socket transport succeed.
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
[ "$transport" = xdp ] || [ "$mode" = hang ] || mode=ok
if [ "$side" = server ]; then
  echo $$ >>"$STUB_DIR/servers"
  case $mode in
    noengine) echo "iwarp-bench: starting the AF_XDP engine on iwa0: stub: no XDP here" >&2; exit 1 ;;
    mismatch|rejected|hang) echo "iwarp-bench: $test server listening (stub)" >&2; exec sleep 60 ;;
    *) echo "iwarp-bench: $test server listening (stub)" >&2; sleep 3; exit 0 ;;
  esac
fi
case $mode in
  noengine) echo "iwarp-bench: starting the AF_XDP engine on iwb0: stub: no XDP here" >&2; exit 1 ;;
  mismatch) echo "iwarp-bench: data mismatch in message 0 at octet 17 (stub)" >&2; exit 1 ;;
  hang) echo $$ >>"$STUB_DIR/clients"; exec sleep 60 ;;
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

mod stubbed;

/// What one run of the script left: its status and output, the stub's records.
struct Run {
    run: stubbed::ScriptRun,
    /// The stub's calls, one "SIDE TRANSPORT TEST" each.
    calls: Vec<String>,
    /// Its status and output, for messages.
    text: String,
}

/// Runs `scripts/demo.sh` with the stub in `mode` (root, or `None` after `SKIPPED`); no stub
/// server may be left running.
fn demo(mode: &str) -> Option<Run> {
    if !stubbed::root_or_skip(
        "not root: scripts/demo.sh runs AF_XDP on the veth test bed only as root",
    ) {
        return None;
    }
    let dir = stubbed::stub_dir(&format!("demo-{mode}"));
    let bin = stubbed::stub(&dir, "iwarp-bench", STUB);
    let run = stubbed::run_script(
        "demo.sh",
        &dir,
        &[("BIN", bin.as_os_str()), ("STUB_MODE", mode.as_ref())],
        &["DEMO_TRANSPORT"],
    );
    let calls = std::fs::read_to_string(dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        run.code, run.stdout, run.stderr
    );
    assert!(
        run.live_servers.is_empty(),
        "stub servers left running: {:?}\n{text}",
        run.live_servers
    );
    Some(Run { run, calls, text })
}

#[test]
fn a_data_check_failing_over_af_xdp_fails_the_demo() {
    let Some(Run { run, calls, text }) = demo("mismatch") else {
        return;
    };
    assert_eq!(run.code, Some(1), "{text}");
    assert!(
        run.stderr.contains("data mismatch"),
        "the client's error is shown: {text}"
    );
    assert!(run.stderr.contains("not falling back"), "{text}");
    assert!(
        !calls.iter().any(|c| c.contains(" socket ")),
        "no socket run hides the failure: {:?}",
        calls
    );
}

#[test]
fn an_engine_that_cannot_start_falls_back_to_sockets() {
    let Some(Run { run, calls, text }) = demo("noengine") else {
        return;
    };
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
            assert!(calls.contains(&call), "no {call}: {:?}", calls);
        }
    }
}

#[test]
fn a_connection_refused_by_mpa_is_not_retried() {
    let Some(Run { run, calls, text }) = demo("rejected") else {
        return;
    };
    assert_eq!(run.code, Some(1), "{text}");
    let tries = calls.iter().filter(|c| *c == "client xdp write-bw").count();
    assert_eq!(tries, 1, "the client ran once: {:?}\n{text}", calls);
    assert!(run.stderr.contains("refused the MPA Request"), "{text}");
}

#[test]
fn a_client_too_early_tries_again_and_the_demo_passes() {
    let Some(Run { run, calls, text }) = demo("late") else {
        return;
    };
    assert_eq!(run.code, Some(0), "{text}");
    assert!(!run.stdout.contains("falling back"), "{text}");
    let tries = |test: &str| {
        let call = format!("client xdp {test}");
        calls.iter().filter(|c| **c == call).count()
    };
    assert_eq!(tries("write-bw"), 4, "{:?}", calls);
    assert_eq!(tries("write-lat"), 4, "{:?}", calls);
    assert!(!calls.iter().any(|c| c.contains(" socket ")), "{:?}", calls);
}

/// A SIGTERM while the demo's client runs ends the demo within seconds, as the signal does (143
/// for its caller), with its server and client stopped (the trap of scripts/lib/jobs.sh's
/// `on_exit`; the client run by `waited`, so the trap need not wait for it to end) and its
/// temporary directory removed. Over the socket transport on loopback (`DEMO_TRANSPORT`): no
/// bed, no root.
#[test]
fn a_sigterm_stops_the_demos_server_and_client() {
    let dir = stubbed::stub_dir("demo-sigterm");
    let tmpdir = dir.join("tmp");
    std::fs::create_dir_all(&tmpdir).expect("stub dir");
    let bin = stubbed::stub(&dir, "iwarp-bench", STUB);
    let started = std::time::Instant::now();
    let run = stubbed::run_script_signalled(
        "demo.sh",
        &dir,
        &[
            ("BIN", bin.as_os_str()),
            ("STUB_MODE", "hang".as_ref()),
            ("DEMO_TRANSPORT", "socket".as_ref()),
            ("TMPDIR", tmpdir.as_os_str()),
        ],
        |dir| !stubbed::pids(&dir.join("clients")).is_empty(),
        "TERM",
        std::time::Duration::from_secs(20),
    );
    let left_in_tmpdir: Vec<_> = std::fs::read_dir(&tmpdir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "exit {:?} signal {:?} after {:?}\nstdout:\n{}\nstderr:\n{}",
        run.code,
        run.signal,
        started.elapsed(),
        run.stdout,
        run.stderr
    );
    assert!(
        run.signal == Some(15) || run.code == Some(143),
        "ended as SIGTERM does: {text}"
    );
    assert!(!run.servers.is_empty() && !run.clients.is_empty(), "{text}");
    assert!(
        run.live_servers.is_empty() && run.live_clients.is_empty(),
        "left running: servers {:?}, clients {:?}\n{text}",
        run.live_servers,
        run.live_clients
    );
    assert!(
        left_in_tmpdir.is_empty(),
        "left: {left_in_tmpdir:?}\n{text}"
    );
}
