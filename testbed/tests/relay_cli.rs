//! `iwarp-relay`'s argument checks, without a test bed (nothing here needs root): a value out
//! of range is refused with exit 2 and a message naming the option, before anything is set up,
//! and never with a panic.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `iwarp-relay` with `args`, killed after 10 s: a regression that took a refused value
/// would otherwise relay for as long as that value said (up to 100,000 s here).
fn relay(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_iwarp-relay"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run iwarp-relay");
    let mut stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = stderr.read_to_end(&mut all);
        all
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        match child.try_wait().expect("wait for iwarp-relay") {
            Some(status) => break status,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                panic!("{args:?}: iwarp-relay still running after 10 s");
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    Output {
        status,
        stdout: Vec::new(),
        stderr: reader.join().expect("stderr reader"),
    }
}

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
        let out = relay(args);
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(option), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
}
