//! A user without root runs the socket transport, as `scripts/demo.sh` does where AF_XDP is
//! impossible: a bandwidth test registers more than the default locked-memory limit (8 MiB)
//! allows, so registration pins where it may and the run goes on, saying once that its memory
//! is not pinned. Run as root, the test drops to `nobody` (`setpriv`) with a 1 MiB limit
//! (`prlimit`) around a copy of the binary it can read; without root it prints `SKIPPED` (a
//! failure under `CI=true`).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};

use common::*;

/// `iwarp-bench ARGS` as user `nobody` with a 1 MiB locked-memory limit.
fn as_nobody(bin: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new("prlimit");
    c.args(["--memlock=1048576:1048576", "--"])
        .args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ])
        .arg(bin)
        .args(args);
    c
}

#[test]
fn a_user_without_root_runs_write_bw_over_sockets_unpinned() {
    if !require(
        is_root() && have("setpriv") && have("prlimit"),
        "dropping to an unprivileged user needs root, setpriv and prlimit",
    ) {
        return;
    }
    // A copy `nobody` can read and run, wherever the build lives.
    let dir = std::env::temp_dir().join(format!("iwarp-unprivileged-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let exe = dir.join("iwarp-bench");
    std::fs::copy(bin(), &exe).expect("copy the binary");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // The temporary directory may be one `nobody` cannot reach or run from (TMPDIR under
    // /root, /tmp mounted noexec).
    let runs = as_nobody(&exe, &["--version"])
        .output_within(RUN_LIMIT)
        .is_ok_and(|o| o.status.success());
    if !require(
        runs,
        "user nobody cannot run a copy of the binary in the temporary directory",
    ) {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let args = ["--transport", "socket", "-s", "65536", "-n", "200"];
    let (server, client): (Output, Output) = with_free_port(|port| {
        let mut server = as_nobody(&exe, &["write-bw", "--bind", "127.0.0.1", "--port", port])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the server");
        let client = client_once_listening(&mut server, || {
            as_nobody(&exe, &["write-bw", "--port", port])
                .args(args)
                .arg("127.0.0.1")
                .output_within(RUN_LIMIT)
                .expect("run the client")
        });
        (
            wait_with_timeout(server, std::time::Duration::from_secs(60)),
            client,
        )
    });
    let _ = std::fs::remove_dir_all(&dir);
    for (who, out) in [("server", &server), ("client", &client)] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{who} failed: {err}");
        assert!(
            err.contains("not pinned"),
            "{who} did not say its memory is not pinned: {err}"
        );
    }
    assert!(String::from_utf8_lossy(&client.stderr).contains("data verified"));
}
