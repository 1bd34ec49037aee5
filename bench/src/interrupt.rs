//! SIGINT or SIGTERM as a request to stop: the handler only records it (a flag, and which signal
//! came first), which the run reads.
//!
//! * `--run_infinitely`: the run loop ends as a finished one does (the server checks the data)
//!   and the process exits normally.
//! * `compare`: the running measurement's children are stopped, no further one starts, the
//!   results so far are printed and the bed goes down; then the signal ends the process as
//!   it would have uncaught ([`end_by`]; [`exit_code`] should it not).
//!
//! Either way the next SIGINT or SIGTERM ends the process at once (the default action).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// The first signal caught (0: none yet).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The signals [`install`] catches.
const CAUGHT: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe: atomic operations, and sigaction, which POSIX lists among the
    // functions a signal handler may call (XSH 2.4.3, "Signal Actions").
    let _ = SIGNAL.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
    REQUESTED.store(true, Ordering::SeqCst);
    // The next SIGINT or SIGTERM, whichever, ends the process: this one's own handler is
    // already reset (`SA_RESETHAND`), the other one's is here.
    for other in CAUGHT {
        // SAFETY: a zeroed sigaction is "SIG_DFL (0), no flags, empty mask"; `sigaction` reads
        // the struct we pass and writes nothing back (old action null).
        unsafe {
            let default: libc::sigaction = std::mem::zeroed();
            libc::sigaction(other, &default, std::ptr::null_mut());
        }
    }
}

/// Routes the next SIGINT (Ctrl-C) or SIGTERM to [`requested`] instead of ending the process;
/// the one after that, of either kind, ends it as usual (`SA_RESETHAND`, and the handler
/// resets the other), so a run that does not stop can still be interrupted.
pub fn install() -> Result<(), String> {
    for sig in CAUGHT {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler is an
        // `extern "C"` function that only touches atomics and calls `sigaction`
        // (async-signal-safe), and `sigaction` reads the struct we pass and writes nothing
        // back (old action null). Both signals are blocked while the handler runs, so a second
        // one waits for it and then meets the default action.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            for blocked in CAUGHT {
                libc::sigaddset(&mut action.sa_mask, blocked);
            }
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

/// The first signal that arrived after [`install`], if one did.
pub fn signal() -> Option<libc::c_int> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// "SIGINT", "SIGTERM" (or "signal N").
pub fn name(sig: libc::c_int) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// The status a shell gives a command that `sig` ended: 128 + its number (130 for SIGINT,
/// 143 for SIGTERM).
pub fn exit_code(sig: libc::c_int) -> u8 {
    u8::try_from(128 + sig).unwrap_or(u8::MAX)
}

/// Ends the process by `sig` as its default action does, so that a shell running us in a loop
/// stops too (a command that exits 130 instead is just a failed one to the loop). Flushes our
/// standard output first. Returns only if the signal did not end the process.
pub fn end_by(sig: libc::c_int) {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: a zeroed sigaction is "SIG_DFL, no flags, empty mask"; `sigaction` reads the
    // struct we pass and writes nothing back (old action null); `raise` takes no pointer.
    unsafe {
        let default: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, &default, std::ptr::null_mut());
        libc::raise(sig);
    }
}
