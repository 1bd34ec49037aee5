//! The veth test bed for root tests: namespaces `iwa` and `iwb` joined by veth `iwa0`
//! (10.77.0.1/24) and `iwb0` (10.77.0.2/24), made by `scripts/netns.sh`.
//!
//! Every test that uses the bed holds [`Bed`] for its duration: it takes an exclusive lock
//! (tests of several crates and scripts share one bed), brings the bed up fresh, and brings it
//! down when dropped, also while unwinding from a failed assertion. [`bed_or_skip!`] turns
//! a bed that cannot be had into a skip with the reason, or into a failure when `CI=true`.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

mod netns;
pub mod process;
pub mod relay;

pub use netns::{enter_ns, in_ns, scoped_in_ns, spawn_in_ns};

/// Namespace of the first host.
pub const NS_A: &str = "iwa";
/// Namespace of the second host.
pub const NS_B: &str = "iwb";
/// The first host's veth end.
pub const DEV_A: &str = "iwa0";
/// The second host's veth end.
pub const DEV_B: &str = "iwb0";
/// The first host's address.
pub const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// The second host's address.
pub const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
/// RX/TX queues of each veth end.
pub const QUEUES: u32 = 4;
/// The lock every user of the bed takes (scripts take it with `flock` too).
pub const LOCK_PATH: &str = "/run/lock/iwarp-netns.lock";

/// True when running under CI (`CI=true`), where a test that cannot run must fail.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Says a test is skipped and why: `SKIPPED: <why>` on standard error, written past the test
/// harness's capture of `print!` and `eprint!` (which drops a passing test's output), so that
/// the line reaches the run's log and `scripts/test.sh` counts it.
pub fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

/// True when the effective user is root (read from `/proc/self/status`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// `scripts/netns.sh` of this workspace.
pub fn netns_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/netns.sh")
}

/// Runs `scripts/netns.sh ARG`.
pub fn run_script(arg: &str) -> Result<(), String> {
    run_bed_script(&netns_script(), arg)
}

/// Runs a bed script (`scripts/netns.sh` or `scripts/netns-relay.sh`) with `arg`.
fn run_bed_script(script: &Path, arg: &str) -> Result<(), String> {
    let name = script.file_name().map_or_else(
        || script.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    run(
        Command::new(script).arg(arg),
        &format!("scripts/{name} {arg}"),
    )
}

/// Sets the MTU of interface `dev` in namespace `ns` (`ip -n NS link set dev DEV mtu MTU`).
pub fn set_mtu(ns: &str, dev: &str, mtu: u32) -> Result<(), String> {
    let mtu = mtu.to_string();
    let args = ["-n", ns, "link", "set", "dev", dev, "mtu", &mtu];
    run(
        Command::new("ip").args(args),
        &format!("ip {}", args.join(" ")),
    )
}

/// Runs `cmd` (described as `what` in the error) to its end; its standard error in the error
/// if it fails.
fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("running {what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Takes the lock every bed user shares, waiting for other users (at most [`BED_LOCK_WAIT`],
/// [`BED_LOCK_WAIT_CI`] under CI, and no longer once `stop` says so); `what` names the bed in
/// the errors. After 10 s it says on stderr who holds the lock. Once one wait of this process
/// has given up, the others give up at once: a leaked holder costs one wait, not one per test.
fn take_bed_lock(what: &str, stop: &dyn Fn() -> bool) -> Result<File, String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static GAVE_UP: AtomicBool = AtomicBool::new(false);
    if !is_root() {
        return Err(format!(
            "not root: the {what} (network namespaces, veth, XDP, AF_XDP) needs root"
        ));
    }
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_PATH)
        .map_err(|e| format!("opening {LOCK_PATH}: {e}"))?;
    let limit = if ci() {
        BED_LOCK_WAIT_CI
    } else {
        BED_LOCK_WAIT
    };
    let started = std::time::Instant::now();
    let mut said = false;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(lock),
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(format!("locking {LOCK_PATH}: {e}"))
            }
        }
        if GAVE_UP.load(Ordering::Relaxed) {
            return Err(format!(
                "the {what}'s lock {LOCK_PATH} is still held by {} (an earlier wait gave up)",
                lock_holders(&lock)
            ));
        }
        if stop() {
            return Err(format!("stopped while waiting for the {what}'s lock"));
        }
        let waited = started.elapsed();
        if waited > limit {
            GAVE_UP.store(true, Ordering::Relaxed);
            return Err(format!(
                "the {what}'s lock {LOCK_PATH} is still held after {limit:?}, by {}",
                lock_holders(&lock)
            ));
        }
        if !said && waited > std::time::Duration::from_secs(10) {
            said = true;
            // Not `eprintln!`: a test's output is captured, and this is for whoever waits.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "testbed: waiting for the bed lock {LOCK_PATH}, held by {}",
                lock_holders(&lock)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// How long a bed user waits for the others before it gives up, saying who holds the lock,
/// instead of waiting without end behind a hung or leaked holder: a benchmark script holds the
/// bed for as long as it runs.
pub const BED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// [`BED_LOCK_WAIT`] under CI (`CI=true`), where only the suite's own users take turns, each
/// for seconds (a script's children may keep the lock a minute after a killed script).
pub const BED_LOCK_WAIT_CI: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// The processes holding `lock`: those with a descriptor of the lock file whose
/// `/proc/PID/fdinfo` shows a lock (flock's lock belongs to the open file, which a script's
/// children inherit: `/proc/locks` names only the process that took it, often a `flock`
/// command long gone), each with its command line.
fn lock_holders(lock: &File) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(ours) = lock.metadata().map(|m| (m.dev(), m.ino())) else {
        return "an unknown process".into();
    };
    let mut holders = Vec::new();
    for proc in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = proc.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let holds = std::fs::read_dir(proc.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| {
                let same_file =
                    std::fs::metadata(fd.path()).is_ok_and(|m| (m.dev(), m.ino()) == ours);
                same_file
                    && std::fs::read_to_string(proc.path().join("fdinfo").join(fd.file_name()))
                        .is_ok_and(|info| info.lines().any(|l| l.starts_with("lock:")))
            });
        if holds {
            let cmd = std::fs::read(proc.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            holders.push(format!("pid {pid} ({})", cmd.trim()));
        }
    }
    if holders.is_empty() {
        "an unknown process".into()
    } else {
        holders.join(", ")
    }
}

/// The test bed, up for as long as this lives.
pub struct Bed {
    _lock: File,
}

impl Bed {
    /// Takes the lock (waiting for other users), then brings up a fresh bed.
    pub fn up() -> Result<Bed, String> {
        Bed::up_unless(&|| false)
    }

    /// [`Bed::up`], giving up the wait for the lock once `stop` says so (an interrupted
    /// tool).
    pub fn up_unless(stop: &dyn Fn() -> bool) -> Result<Bed, String> {
        let lock = take_bed_lock("test bed", stop)?;
        // Start from a fresh bed, whatever an interrupted run left behind.
        run_script("down")?;
        let bed = Bed { _lock: lock };
        run_script("up")?;
        Ok(bed)
    }

    /// Both veth ends at `mtu`; the bed comes down with the test, so nothing needs setting
    /// back. (Native XDP on one end checks the other end's MTU when it attaches.)
    pub fn set_mtu(&self, mtu: u32) -> Result<(), String> {
        set_mtu(NS_B, DEV_B, mtu)?;
        set_mtu(NS_A, DEV_A, mtu)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Err(e) = run_script("down") {
            eprintln!("warning: {e}");
        }
    }
}

/// Gets the test bed or returns from the test: `SKIPPED: <why>` outside CI, a failure under
/// `CI=true`.
#[macro_export]
macro_rules! bed_or_skip {
    () => {
        match $crate::Bed::up() {
            Ok(bed) => bed,
            Err(why) => {
                if $crate::ci() {
                    panic!("test bed unavailable (CI=true, so this fails): {why}");
                }
                $crate::skipped(&why);
                return;
            }
        }
    };
}

/// `scripts/netns-relay.sh` of this workspace.
pub fn relay_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/netns-relay.sh")
}

fn run_relay_script(arg: &str) -> Result<(), String> {
    run_bed_script(&relay_script(), arg)
}

/// The relay bed (see [`relay`]), up for as long as this lives. The relay itself is the
/// test's to start ([`relay::Relay`]); without one, A and B cannot reach each other.
pub struct RelayBed {
    _lock: File,
}

impl RelayBed {
    /// Takes the bed lock (waiting for other users), then brings up a fresh relay bed.
    pub fn up() -> Result<RelayBed, String> {
        let lock = take_bed_lock("relay bed", &|| false)?;
        let bed = RelayBed { _lock: lock };
        run_relay_script("up")?;
        Ok(bed)
    }

    /// Every end of the relay bed (`iwra0`, the relay's `rra0` and `rrb0`, `iwrb0`) at `mtu`.
    pub fn set_mtu(&self, mtu: u32) -> Result<(), String> {
        use relay::{DEV_A, DEV_B, NS_A, NS_B, NS_RELAY, RELAY_DEV_A, RELAY_DEV_B};
        for (ns, dev) in [
            (NS_A, DEV_A),
            (NS_RELAY, RELAY_DEV_A),
            (NS_RELAY, RELAY_DEV_B),
            (NS_B, DEV_B),
        ] {
            set_mtu(ns, dev, mtu)?;
        }
        Ok(())
    }
}

impl Drop for RelayBed {
    fn drop(&mut self) {
        if let Err(e) = run_relay_script("down") {
            eprintln!("warning: {e}");
        }
    }
}

/// Gets the relay bed or returns from the test, like [`bed_or_skip!`].
#[macro_export]
macro_rules! relay_bed_or_skip {
    () => {
        match $crate::RelayBed::up() {
            Ok(bed) => bed,
            Err(why) => {
                if $crate::ci() {
                    panic!("relay bed unavailable (CI=true, so this fails): {why}");
                }
                $crate::skipped(&why);
                return;
            }
        }
    };
}
