//! SIGINT as a request to stop (`--run_infinitely`): the handler only sets a flag, which the
//! run loop reads; the run then ends as a finished one does (the server checks the data) and
//! the process exits normally.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Routes the next SIGINT (Ctrl-C) or SIGTERM to [`requested`] instead of ending the process;
/// the one after that ends it as usual (`SA_RESETHAND`), so a run that does not stop can still
/// be interrupted.
pub fn install() -> Result<(), String> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler is an
        // `extern "C"` function that only stores to an atomic (async-signal-safe), and
        // `sigaction` reads the struct we pass and writes nothing back (old action null).
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(format!(
                "cannot catch signal {sig}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// True once SIGINT or SIGTERM arrived after [`install`].
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
