//! The parked engine thread's watchdog (inline progress): a one-shot timer (`timerfd`,
//! `CLOCK_MONOTONIC`) that the application's polls keep pushing into the future and that the
//! parked engine thread sleeps on. While the application polls, it never expires, and the
//! engine thread sleeps undisturbed on the application's core; once the application stops
//! polling without blocking in a wait (it computes, or sleeps), it expires within
//! [`XdpEngineConfig::park_max`](super::XdpEngineConfig::park_max) of the last push, and the
//! engine thread takes its turns back: received frames and TCP timers never wait longer.
//!
//! A push is one system call (`timerfd_settime`), made by a poll that found nothing to do once
//! half of `park_max` has passed since the last push, or by any poll once three quarters have
//! (an application that never polls idle): 500 a second at the default 4 ms, against the
//! context switch on the application's core of a thread that wakes itself to look. (A push
//! costs too: on a virtual machine it reprograms the core's timer, so pushes every 500 us,
//! at a `park_max` of 2 ms, doubled write-lat's p99 on the veth bed.)

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A one-shot monotonic timer whose expiry makes its file descriptor readable.
#[derive(Debug)]
pub(super) struct Watchdog {
    fd: OwnedFd,
}

impl Watchdog {
    /// A disarmed timer.
    pub(super) fn new() -> io::Result<Watchdog> {
        // SAFETY: timerfd_create takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created above and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Watchdog { fd })
    }

    /// Sets the timer to expire `after` from now (at least a nanosecond), replacing any
    /// earlier setting and clearing an expiry not yet read.
    pub(super) fn arm(&self, after: Duration) -> io::Result<()> {
        self.set(after.max(Duration::from_nanos(1)))
    }

    /// Stops the timer (and clears an expiry not yet read).
    pub(super) fn disarm(&self) -> io::Result<()> {
        self.set(Duration::ZERO)
    }

    /// `timerfd_settime` with `after` from now, zero to disarm.
    fn set(&self, after: Duration) -> io::Result<()> {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: libc::c_long::from(after.subsec_nanos() as i32),
            },
        };
        // SAFETY: `spec` is valid for the call; a null old-value pointer is allowed.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Clears an expiry that has not been read; true if there was one.
    pub(super) fn take_expiry(&self) -> bool {
        let mut count = [0u8; 8];
        // SAFETY: reads at most `count.len()` octets into `count`, owned by this frame; the
        // descriptor is non-blocking.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
        n == count.len() as isize
    }

    /// The descriptor to wait on (readable once the timer expired).
    pub(super) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(w: &Watchdog, wait: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: w.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd owned by this frame.
        unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
    }

    #[test]
    fn expires_once_after_its_time_unless_pushed() {
        let w = Watchdog::new().expect("timerfd");
        assert!(!w.take_expiry(), "a new watchdog has expired");
        // Pushed forward every 50 ms for 300 ms, longer than the 200 ms it is armed for: it
        // has not expired. (A push that came too late, this thread preempted on a loaded
        // machine, spoils the try: tried again.)
        const ARMED: Duration = Duration::from_millis(200);
        let mut pushed_in_time = false;
        for _ in 0..5 {
            w.arm(ARMED).expect("arm");
            let mut last = std::time::Instant::now();
            pushed_in_time = (0..6).all(|_| {
                std::thread::sleep(Duration::from_millis(50));
                let late = last.elapsed() >= ARMED * 3 / 4;
                w.arm(ARMED).expect("push");
                last = std::time::Instant::now();
                !late
            });
            if pushed_in_time {
                break;
            }
            let _ = readable(&w, Duration::from_secs(5));
            let _ = w.take_expiry();
        }
        assert!(pushed_in_time, "no try pushed the watchdog in time");
        assert!(!w.take_expiry(), "expired although pushed forward in time");
        assert!(
            readable(&w, Duration::from_secs(5)),
            "never expired once no longer pushed"
        );
        assert!(w.take_expiry());
        assert!(!w.take_expiry(), "one expiry read twice");
        assert!(
            !readable(&w, Duration::from_millis(50)),
            "a one-shot timer expired again"
        );
        // Disarmed, and an expiry not yet read cleared by arming again.
        w.arm(Duration::from_millis(20)).expect("arm");
        w.disarm().expect("disarm");
        assert!(
            !readable(&w, Duration::from_millis(100)),
            "expired disarmed"
        );
        w.arm(Duration::from_millis(1)).expect("arm");
        assert!(readable(&w, Duration::from_secs(5)), "never expired");
        w.arm(Duration::from_secs(60)).expect("arm again");
        assert!(!w.take_expiry(), "arming left the earlier expiry");
    }
}
