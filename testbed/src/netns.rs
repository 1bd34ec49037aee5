//! Running threads inside the bed's network namespaces.

use std::fs::File;
use std::io;
use std::thread::{JoinHandle, Scope, ScopedJoinHandle};

/// Moves the calling thread into network namespace `ns`, a file under `/run/netns` as `ip
/// netns add` makes it (`setns(CLONE_NEWNET)` changes only the calling thread's namespace:
/// sockets it creates afterwards, AF_XDP, netlink, UDP, TCP, belong to `ns`; other threads
/// are not affected). Needs CAP_SYS_ADMIN. The error names the file and the step that failed.
pub fn enter_ns(ns: &str) -> io::Result<()> {
    let path = format!("/run/netns/{ns}");
    let file =
        File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("open {path}: {e}")))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("setns {path}: {e}"))
    })
}

/// [`enter_ns`] for test threads: panics with the reason if it fails.
fn enter_ns_or_panic(ns: &str) {
    enter_ns(ns).unwrap_or_else(|e| panic!("{e}"));
}

/// Runs `f` on a fresh thread inside network namespace `ns` and returns its result (sockets
/// belong to the namespace of the thread that creates them). A panic in `f` propagates.
pub fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter_ns_or_panic(ns);
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Starts `f` on a new thread inside network namespace `ns`.
pub fn spawn_in_ns<T: Send + 'static>(
    ns: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    std::thread::spawn(move || {
        enter_ns_or_panic(ns);
        f()
    })
}

/// Starts `f` on a thread of scope `s` inside network namespace `ns`.
pub fn scoped_in_ns<'s, 'e, T: Send + 's>(
    s: &'s Scope<'s, 'e>,
    ns: &'static str,
    f: impl FnOnce() -> T + Send + 's,
) -> ScopedJoinHandle<'s, T> {
    s.spawn(move || {
        enter_ns_or_panic(ns);
        f()
    })
}
