//! `iwarp-relay`'s argument checks, without a test bed (nothing here needs root): a value out
//! of range is refused with exit 2 and a message naming the option, before anything is set up,
//! and never with a panic.

use std::process::Command;
use std::time::Duration;

use testbed::process::OutputWithin;

#[test]
fn out_of_range_arguments_are_refused_with_exit_2() {
    for (args, option) in [
        (&["--seconds", "nan"][..], "--seconds"),
        (&["--seconds", "inf"], "--seconds"),
        (&["--seconds", "0"], "--seconds"),
        (&["--seconds=-5"], "--seconds"),
        (&["--seconds", "0.01"], "--seconds"),
        (&["--seconds", "100000"], "--seconds"),
        (&["--reorder=-0.5", "--loss", "0.5"], "--reorder"),
        (&["--loss=-0.1"], "--loss"),
        (&["--loss", "nan"], "--loss"),
        (&["--loss", "0.6", "--reorder", "0.6"], "--reorder"),
        (&["--duplicate=-1"], "--duplicate"),
        (&["--corrupt", "1.5"], "--corrupt"),
        (&["--jitter-us", "18446744073709551615"], "--jitter-us"),
        (&["--delay-us", "10000001"], "--delay-us"),
    ] {
        // Killed after 10 s: a regression that took a refused value would otherwise relay for
        // as long as that value said (up to 100,000 s here).
        let out = Command::new(env!("CARGO_BIN_EXE_iwarp-relay"))
            .args(args)
            .output_within(Duration::from_secs(10))
            .expect("run iwarp-relay");
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(option), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
}
