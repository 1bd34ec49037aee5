//! The engine's process dies or meets another: after `kill -9` of a process running the
//! engine on `iwa0`, the interface carries kernel TCP again at once (the XDP program goes with
//! the process's BPF link, the AF_XDP sockets with its fds) and a new engine starts on it; a
//! second process that starts an engine on an interface in use gets an error naming the
//! holder's process. Needs root and the veth bed (`SKIPPED` without, a failure under
//! `CI=true`).
//!
//! Its own harness (`harness = false`): the binary re-runs itself with `--hold PORT` as the
//! process that holds the interface; it prints libtest's summary line for `scripts/test.sh`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use datapath::engine::{XdpEngine, XdpEngineConfig};
use datapath::ConnectParams;
use testbed::*;

const PORT: u16 = 19_631;
const WAIT: Duration = Duration::from_secs(20);
/// The holder ends by itself after this.
const HOLD_AT_MOST: Duration = Duration::from_secs(60);

type Test = fn() -> Result<(), String>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--hold") {
        let port = args.get(i + 1).and_then(|p| p.parse().ok()).unwrap_or(PORT);
        std::process::exit(match hold(port) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("holder: {e}");
                1
            }
        });
    }
    if args.iter().any(|a| a == "--list") {
        println!("kill_9_leaves_kernel_tcp_working: test");
        println!("a_second_process_is_told_who_holds_the_interface: test");
        return;
    }
    let tests: [(&str, Test); 2] = [
        (
            "kill_9_leaves_kernel_tcp_working",
            kill_9_leaves_kernel_tcp_working,
        ),
        (
            "a_second_process_is_told_who_holds_the_interface",
            a_second_process_is_told_who_holds_the_interface,
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in tests {
        match test() {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(e) => {
                println!("test {name} ... FAILED\n    {e}");
                failed += 1;
            }
        }
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; 0 ignored; 0 measured; \
         0 filtered out"
    );
    if failed > 0 {
        std::process::exit(101);
    }
}

/// The holder process: the engine on `iwa0`, listening on `port`; says `ready` and waits to
/// be killed (ending by itself after [`HOLD_AT_MOST`]).
fn hold(port: u16) -> Result<(), String> {
    enter_ns(NS_A).map_err(|e| e.to_string())?;
    let engine = XdpEngine::start(DEV_A, XdpEngineConfig::default()).map_err(|e| e.to_string())?;
    let _listener = engine
        .listen(port, ConnectParams::default())
        .map_err(|e| e.to_string())?;
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    std::thread::sleep(HOLD_AT_MOST);
    Ok(())
}

/// The bed, or `None` (skipped, said why) outside CI.
fn bed() -> Result<Option<Bed>, String> {
    match Bed::up() {
        Ok(bed) => Ok(Some(bed)),
        Err(why) if ci() => Err(format!(
            "test bed unavailable (CI=true, so this fails): {why}"
        )),
        Err(why) => {
            testbed::skipped(&why);
            Ok(None)
        }
    }
}

/// Starts the holder and waits for its `ready`.
fn holder() -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["--hold", &PORT.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the holder: {e}"))?;
    let stdout = child.stdout.take().ok_or("holder stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(WAIT) {
        Ok(line) if line.trim() == "ready" => Ok(child),
        other => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!("the holder did not get ready: {other:?}"))
        }
    }
}

fn xdp_attached() -> bool {
    let out = Command::new("ip")
        .args(["-n", NS_A, "-d", "link", "show", DEV_A])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.contains("prog/xdp")
}

fn kill_9_leaves_kernel_tcp_working() -> Result<(), String> {
    let Some(_bed) = bed()? else { return Ok(()) };
    let mut child = holder()?;
    if !xdp_attached() {
        let _ = child.kill();
        return Err("the holder runs but no XDP program is attached to iwa0".into());
    }
    // SIGKILL: no destructor, no detach of our own.
    child.kill().map_err(|e| e.to_string())?;
    child.wait().map_err(|e| e.to_string())?;
    let killed = Instant::now();
    while xdp_attached() {
        if killed.elapsed() > Duration::from_secs(2) {
            return Err("XDP still attached 2 s after kill -9".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let detached = killed.elapsed();
    // Kernel TCP on the engine's own port, at once: a kernel listener in iwa, a client in iwb.
    let listener = in_ns(NS_A, || TcpListener::bind(SocketAddr::from((ADDR_A, PORT))))
        .map_err(|e| format!("kernel listen on the engine's port after kill -9: {e}"))?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf)?;
        s.write_all(&buf)
    });
    let echoed = in_ns(NS_B, || -> std::io::Result<[u8; 5]> {
        let mut s = TcpStream::connect_timeout(&SocketAddr::from((ADDR_A, PORT)), WAIT)?;
        s.set_read_timeout(Some(WAIT))?;
        s.write_all(b"hello")?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf)?;
        Ok(buf)
    })
    .map_err(|e| format!("kernel TCP to iwa0 after kill -9: {e}"))?;
    let _ = server.join();
    let carried = killed.elapsed();
    if &echoed != b"hello" {
        return Err(format!("kernel TCP echoed {echoed:?}"));
    }
    // And a new engine takes the interface.
    in_ns(NS_A, || {
        XdpEngine::start(DEV_A, XdpEngineConfig::default()).map(drop)
    })
    .map_err(|e| format!("a new engine on iwa0 after kill -9: {e}"))?;
    println!("kill -9: XDP gone after {detached:?}, kernel TCP echoed after {carried:?}");
    if carried > Duration::from_secs(3) {
        return Err(format!("kernel TCP needed {carried:?} after kill -9"));
    }
    Ok(())
}

fn a_second_process_is_told_who_holds_the_interface() -> Result<(), String> {
    let Some(_bed) = bed()? else { return Ok(()) };
    let mut child = holder()?;
    let pid = child.id();
    let result = in_ns(NS_A, || {
        XdpEngine::start(DEV_A, XdpEngineConfig::default()).map(drop)
    });
    let _ = child.kill();
    let _ = child.wait();
    let error = match result {
        Ok(()) => return Err("a second engine started on an interface in use".into()),
        Err(e) => e.to_string(),
    };
    println!("second process: {error}");
    if !error.contains(&format!("process {pid} ")) {
        return Err(format!(
            "the error does not name the holder (pid {pid}): {error}"
        ));
    }
    Ok(())
}
