//! Running a child process with a wall-clock bound, for tests and tools: a hung child is
//! killed and said so instead of holding whoever waits for it.

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Waits for a child, killing it after `timeout`, and collects what it wrote to the pipes it
/// has left (both are read meanwhile, so a child that writes more than a pipe holds does not
/// stall until killed). A killed child's stderr ends with a line saying so.
pub fn wait_with_timeout(mut child: Child, timeout: Duration) -> Output {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> Option<mpsc::Receiver<Vec<u8>>> {
        pipe.map(|mut p| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let mut all = Vec::new();
                let _ = p.read_to_end(&mut all);
                let _ = tx.send(all);
            });
            rx
        })
    }
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let deadline = Instant::now() + timeout;
    let mut killed = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                killed = true;
                let _ = child.kill();
                break child.wait().expect("wait for a killed child");
            }
        }
    };
    // A pipe ends with the child, unless a process it started still holds it: waited for
    // 10 s at most, then a note stands in for its output (the reader is left to that process).
    let until = Instant::now() + Duration::from_secs(10);
    let collect = |rx: Option<mpsc::Receiver<Vec<u8>>>| {
        rx.map(|rx| {
            rx.recv_timeout(until.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| {
                    b"\n[test: the pipe still open 10 s after the child ended]\n".to_vec()
                })
        })
        .unwrap_or_default()
    };
    let mut stderr = collect(stderr);
    if killed {
        stderr.extend(format!("\n[test: killed after {timeout:?}]\n").bytes());
    }
    Output {
        status,
        stdout: collect(stdout),
        stderr,
    }
}

/// [`Command::output`] with a wall-clock bound.
pub trait OutputWithin {
    /// Runs the command to its end as [`Command::output`] does (stdin closed, stdout and stderr
    /// captured), killing it after `limit` ([`wait_with_timeout`]).
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output>;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output> {
        let child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        Ok(wait_with_timeout(child, limit))
    }
}
