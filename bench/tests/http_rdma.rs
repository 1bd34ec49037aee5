//! `iwarp-bench http-server` / `http-client`: HTTP/1.1 with the TCP RDMA option
//! (draft-csapuntz-tcprdma-00) over our TCP on AF_XDP, on the veth bed and behind the relay's
//! loss and reordering, and against unmodified software (`curl`, `python3 -m http.server`)
//! on kernel TCP, which ignores the option.
//!
//! What is checked: every body byte-exact (the client compares `/gen/` bodies with the
//! generator, files by SHA-256 against the test's own); with the option in use every body
//! octet is placed straight into the buffer posted for its request (the engine's counters
//! agree with the HTTP layer's) and the stream carries the heads only, so no body octet went
//! through the reassembly ring, out-of-order arrivals included.
//!
//! Sizes are bounded for CI (`HTTP_GET_MIB`, default 128, and `HTTP_RELAY_MIB`, default 32,
//! raise them by hand: the acceptance runs use 1024). Needs root and the beds; without them
//! each test prints `SKIPPED: <why>` and passes, except under `CI=true`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{bench_in, json, KillOnDrop, OutputWithin, Tool, RUN_LIMIT};
use serde_json::Value;
use sha2::{Digest, Sha256};
use testbed::relay::{self, Relay, RelayConfig, NS_RELAY, RELAY_DEV_A, RELAY_DEV_B};
use testbed::{bed_or_skip, relay_bed_or_skip};

const MIB: u64 = 1 << 20;

/// A bed's names: the client's side A, the server's side B.
struct Sides {
    ns_a: &'static str,
    dev_a: &'static str,
    ns_b: &'static str,
    dev_b: &'static str,
    addr_b: std::net::Ipv4Addr,
}

const VETH: Sides = Sides {
    ns_a: testbed::NS_A,
    dev_a: testbed::DEV_A,
    ns_b: testbed::NS_B,
    dev_b: testbed::DEV_B,
    addr_b: testbed::ADDR_B,
};

const RELAYED: Sides = Sides {
    ns_a: relay::NS_A,
    dev_a: relay::DEV_A,
    ns_b: relay::NS_B,
    dev_b: relay::DEV_B,
    addr_b: relay::ADDR_B,
};

fn mib_from_env(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// Starts `http-server` on side B of `bed` on `port`, exiting after `connections`.
fn server(sides: &Sides, port: u16, connections: u64, extra: &[&str]) -> Tool {
    let (port, conns) = (port.to_string(), connections.to_string());
    let mut args = vec![
        "http-server",
        "--iface",
        sides.dev_b,
        "--port",
        &port,
        "--connections",
        &conns,
    ];
    args.extend_from_slice(extra);
    let mut t = Tool::start(bench_in(sides.ns_b, &args));
    t.wait_for("listening on", Duration::from_secs(30));
    t
}

/// Runs `http-client` on side A of `bed` against the server on `port`; its report.
fn client(sides: &Sides, port: u16, args: &[&str]) -> Value {
    let to = format!("{}:{port}", sides.addr_b);
    let mut all = vec!["http-client", "--iface", sides.dev_a, "--quiet"];
    all.extend_from_slice(args);
    all.push(&to);
    let t = Tool::start(bench_in(sides.ns_a, &all));
    let (out, err) = t.finish(Duration::from_secs(300));
    json(&out, &err, "http-client")
}

fn finish(t: Tool) -> Value {
    let (out, err) = t.finish(Duration::from_secs(30));
    json(&out, &err, "http-server")
}

fn u(v: &Value, path: &[&str]) -> u64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("{path:?} missing in {v}"))
}

/// A GET run with the option in use: all of every body placed, the stream heads only.
fn assert_all_placed(c: &Value, requests: u64) {
    assert_eq!(u(c, &["requests"]), requests, "{c}");
    let body = requests * MIB;
    assert_eq!(u(c, &["body_octets"]), body, "{c}");
    assert_eq!(c["verified"], "generator", "{c}");
    assert_eq!(c["rdma"]["option_in_use"], true, "{c}");
    assert_eq!(u(c, &["body_octets_placed"]), body, "{c}");
    assert_eq!(
        u(c, &["rdma", "placed_in_order"]) + u(c, &["rdma", "placed_out_of_order"]),
        body,
        "the engine's placed octets are the body octets: {c}"
    );
    assert_eq!(
        u(c, &["rdma", "delivered_in_order"]),
        u(c, &["head_octets"]),
        "the stream carried the response heads only: {c}"
    );
    assert_eq!(u(c, &["rdma", "malformed"]), 0, "{c}");
}

/// GETs and PUTs between our client and server on the veth bed, with the option and without.
#[test]
fn gets_and_puts_are_placed_on_the_veth_bed() {
    let _bed = bed_or_skip!();
    let mib = mib_from_env("HTTP_GET_MIB", 128);
    let count = mib.to_string();

    // GET, option on at both ends: bodies placed.
    let s = server(&VETH, 18_800, 1, &[]);
    let c = client(&VETH, 18_800, &["--count", &count, "--size", "1048576"]);
    let srv = finish(s);
    println!("GET, option on: {c}\nserver: {srv}");
    assert_all_placed(&c, mib);
    assert_eq!(u(&c, &["rdma", "refused"]), 0, "{c}");
    assert!(
        u(&srv, &["rdma", "options_sent"]) >= mib * MIB / 1460,
        "{srv}"
    );
    assert_eq!(u(&srv, &["body_octets_sent"]), mib * MIB, "{srv}");

    // The same client without the option: an ordinary stream copy, the same bodies.
    let s = server(&VETH, 18_801, 1, &[]);
    let c = client(
        &VETH,
        18_801,
        &["--count", "16", "--size", "1048576", "--rdma-option", "off"],
    );
    let srv = finish(s);
    println!("GET, option off: {c}");
    assert_eq!(c["rdma"]["option_in_use"], false, "{c}");
    assert_eq!(u(&c, &["body_octets_placed"]), 0, "{c}");
    assert_eq!(
        u(&c, &["rdma", "delivered_in_order"]),
        16 * MIB + u(&c, &["head_octets"]),
        "{c}"
    );
    assert_eq!(u(&srv, &["rdma", "options_sent"]), 0, "{srv}");

    // PUT: unsolicited bodies (U bit) placed in the buffers the server offered for them.
    let s = server(&VETH, 18_802, 1, &[]);
    let c = client(
        &VETH,
        18_802,
        &["--method", "put", "--count", "32", "--size", "1048576"],
    );
    let srv = finish(s);
    println!("PUT: {c}\nserver: {srv}");
    assert_eq!(c["verified"], "sha256", "{c}");
    assert_eq!(u(&c, &["requests"]), 32, "{c}");
    assert_eq!(u(&srv, &["puts"]), 32, "{srv}");
    assert_eq!(u(&srv, &["body_octets_received"]), 32 * MIB, "{srv}");
    // Every body but the first placed whole, and of the first all but what the segment that
    // completes the handshake carries: that segment's data is passed up before the server has
    // the connection to post buffers on; the segments after it, even in the same receive
    // batch, find them (the engine accepts at once).
    assert!(u(&srv, &["bodies_placed_whole"]) >= 31, "{srv}");
    let unplaced = 32 * MIB - u(&srv, &["body_octets_placed"]);
    assert!(unplaced <= 1460, "{unplaced} body octets not placed: {srv}");
    assert_eq!(
        u(&srv, &["rdma", "delivered_in_order"]),
        u(&srv, &["head_octets"]) + unplaced,
        "the server's stream carried the request heads and the unplaced octets only: {srv}"
    );
    assert!(u(&c, &["rdma", "options_sent"]) > 0, "{c}");

    // Pipelined deeper than the server posts buffers ahead: bodies that find none come
    // through the stream, every one intact.
    let s = server(&VETH, 18_803, 1, &[]);
    let c = client(
        &VETH,
        18_803,
        &[
            "--method", "put", "--count", "64", "--size", "65536", "--depth", "16",
        ],
    );
    let srv = finish(s);
    println!("PUT, depth 16: {c}\nserver: {srv}");
    assert_eq!(u(&c, &["requests"]), 64, "{c}");
    assert_eq!(u(&srv, &["puts"]), 64, "{srv}");
    assert_eq!(u(&srv, &["body_octets_received"]), 64 * 65536, "{srv}");
    let unplaced = 64 * 65536 - u(&srv, &["body_octets_placed"]);
    assert_eq!(
        u(&srv, &["rdma", "delivered_in_order"]),
        u(&srv, &["head_octets"]) + unplaced,
        "{srv}"
    );
}

/// GETs through the relay dropping 1 % and then 5 % of the segments and reordering others:
/// out-of-order segments are placed straight into the posted buffers.
#[test]
fn gets_are_placed_out_of_order_behind_loss_and_reordering() {
    let _bed = relay_bed_or_skip!();
    let mib = mib_from_env("HTTP_RELAY_MIB", 32);
    let count = mib.to_string();
    for (i, loss) in [0.01, 0.05].into_iter().enumerate() {
        let relay = Relay::start(RelayConfig {
            netns: Some(NS_RELAY.into()),
            dev_a: RELAY_DEV_A.into(),
            dev_b: RELAY_DEV_B.into(),
            seed: 27 + i as u64,
            loss,
            reorder: 0.02,
            lifetime: Duration::from_secs(600),
            ..RelayConfig::default()
        })
        .unwrap_or_else(|e| panic!("relay: {e}"));
        let port = 18_810 + i as u16;
        let s = server(&RELAYED, port, 1, &[]);
        let c = client(&RELAYED, port, &["--count", &count, "--size", "1048576"]);
        let srv = finish(s);
        let stats = relay.stop().expect("relay");
        println!("loss {loss}: {c}\nserver: {srv}\nrelay: {stats:?}");
        assert!(stats.a_to_b.dropped + stats.b_to_a.dropped > 0, "{stats:?}");
        assert_all_placed(&c, mib);
        assert!(
            u(&c, &["rdma", "placed_out_of_order"]) > 0,
            "nothing was placed out of order: {c}"
        );
        assert!(u(&srv, &["rdma", "retransmitted_segments"]) > 0, "{srv}");
    }
}

/// Pseudo-random file contents (any generator will do: the test hashes what it wrote).
fn write_file(path: &Path, len: usize, mut x: u64) -> String {
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = c.len();
        c.copy_from_slice(&x.to_le_bytes()[..n]);
    }
    std::fs::write(path, &v).expect("write the file");
    Sha256::digest(&v)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn sha256_file(path: &Path) -> String {
    let v = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(&v)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn scratch_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// `curl` in side A's namespace (kernel TCP), failing on HTTP errors, bounded in time.
fn curl() -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", VETH.ns_a, "curl", "-sS", "--fail"])
        .args(["--max-time", "60"]);
    c
}

/// `curl` on kernel TCP (which ignores option 25) against our annotating server: byte-exact
/// downloads (two on one keep-alive connection) and an upload.
#[test]
fn curl_downloads_from_our_server() {
    let _bed = bed_or_skip!();
    let dir = scratch_dir("http-curl");
    let want = write_file(&dir.join("object.bin"), 3_000_001, 0x5eed_0001);
    let s = server(
        &VETH,
        18_820,
        2,
        &["--dir", dir.to_str().expect("utf-8 path")],
    );
    let url = format!("http://{}:18820/object.bin", VETH.addr_b);
    let (one, two) = (dir.join("one"), dir.join("two"));
    let out = curl()
        .args([&url, "-o"])
        .arg(&one)
        .args([&url, "-o"])
        .arg(&two)
        .output_within(RUN_LIMIT)
        .expect("run curl");
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sha256_file(&one), want, "first download differs");
    assert_eq!(sha256_file(&two), want, "second download differs");
    // An upload: the server answers with the SHA-256 of what it received.
    let out = curl()
        .arg("-T")
        .arg(dir.join("object.bin"))
        .arg(format!("http://{}:18820/upload", VETH.addr_b))
        .output_within(RUN_LIMIT)
        .expect("run curl -T");
    assert!(
        out.status.success(),
        "curl -T: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want);
    let srv = finish(s);
    println!("server: {srv}");
    assert_eq!(u(&srv, &["gets"]), 2, "{srv}");
    assert_eq!(u(&srv, &["puts"]), 1, "{srv}");
    // curl asks before it sends a body over 1 MiB (Expect: 100-continue), and got its answer.
    assert_eq!(u(&srv, &["continues_sent"]), 1, "{srv}");
    assert_eq!(srv["rdma"]["option_in_use"], false, "{srv}");
    assert_eq!(u(&srv, &["rdma", "options_sent"]), 0, "{srv}");
}

/// Our client (option offered, not taken) downloads from `python3 -m http.server` on kernel
/// TCP: byte-exact, every octet through the stream.
#[test]
fn our_client_downloads_from_a_kernel_http_server() {
    let _bed = bed_or_skip!();
    let dir = scratch_dir("http-python");
    let want = write_file(&dir.join("object.bin"), 2_500_000, 0x5eed_0002);
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let addr = VETH.addr_b.to_string();
    let py = Command::new("ip")
        .args([
            "netns",
            "exec",
            VETH.ns_b,
            python,
            "-m",
            "http.server",
            "18830",
        ])
        .args(["--bind", &addr, "--directory"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start python3 -m http.server");
    // Killed however the test ends (a panicking client left it serving in iwb).
    let py = KillOnDrop(py);
    // Until it answers (at most 20 s; each probe at most 2 s).
    let mut up = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let probe = Command::new("ip")
            .args(["netns", "exec", VETH.ns_b, "curl", "-s", "--max-time", "2"])
            .args(["-o", "/dev/null"])
            .arg(format!("http://{}:18830/", VETH.addr_b))
            .status();
        if probe.is_ok_and(|s| s.success()) {
            up = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let result = up.then(|| {
        client(
            &VETH,
            18_830,
            &["--path", "/object.bin", "--size", "2500000", "--count", "1"],
        )
    });
    drop(py);
    let c = result.expect("python3 -m http.server did not answer within 20 s");
    println!("client: {c}");
    assert_eq!(c["sha256"], want.as_str(), "{c}");
    assert_eq!(c["verified"], "first", "{c}");
    assert_eq!(u(&c, &["body_octets"]), 2_500_000, "{c}");
    assert_eq!(c["rdma"]["option_in_use"], false, "{c}");
    assert_eq!(
        u(&c, &["rdma", "delivered_in_order"]),
        2_500_000 + u(&c, &["head_octets"]),
        "{c}"
    );
}

/// A client that connects and then says nothing is reset after `--idle-timeout`, and the
/// server counts it.
#[test]
fn idle_connections_are_reset() {
    let _bed = bed_or_skip!();
    let s = server(&VETH, 18_840, 1, &["--idle-timeout", "1"]);
    // Connects, sends nothing, and waits (at most 20 s) for the server to give up on it.
    let script = format!(
        "import socket\n\
         s = socket.create_connection(('{}', 18840), timeout=20)\n\
         try:\n    print(len(s.recv(1)))\n\
         except ConnectionResetError:\n    print('reset')\n",
        VETH.addr_b
    );
    let said = python_in_a(&script);
    assert!(
        matches!(said.as_str(), "reset" | "0"),
        "the idle client saw {said:?}"
    );
    let srv = finish(s);
    assert_eq!(u(&srv, &["idle_resets"]), 1, "{srv}");
}

/// Runs `script` with python3 in side A's namespace of the veth bed; what it printed.
fn python_in_a(script: &str) -> String {
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let out = Command::new("ip")
        .args(["netns", "exec", VETH.ns_a, python, "-c", script])
        .output_within(RUN_LIMIT)
        .expect("run python3");
    assert!(
        out.status.success(),
        "python3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Whether a python client's line says it was reset within `within` seconds.
fn reset_within(said: &str, within: f64) -> bool {
    said.strip_prefix("reset ")
        .and_then(|t| t.parse::<f64>().ok())
        .is_some_and(|t| t <= within)
}

/// Runs `script` (a python client of the server on `port`, which prints `reset SECONDS` when
/// reset) against a server with `--idle-timeout 1`: the client must be reset within 8 s and
/// the server count it as slow, not idle.
fn slow_client_is_cut_off(port: u16, script: &str, who: &str) {
    let s = server(&VETH, port, 1, &["--idle-timeout", "1"]);
    let said = python_in_a(script);
    assert!(reset_within(&said, 8.0), "{who}: {said}");
    let srv = finish(s);
    assert_eq!(u(&srv, &["slow_resets"]), 1, "{srv}");
    assert_eq!(u(&srv, &["idle_resets"]), 0, "{srv}");
}

/// A client that drips its request head an octet every 0.2 s (each octet progress, so the
/// idle timeout never comes) is reset once the head is not whole `--idle-timeout` after it
/// began, and counted as slow.
#[test]
fn a_request_head_dripped_an_octet_at_a_time_is_cut_off() {
    let _bed = bed_or_skip!();
    let script = format!(
        "import socket, time\n\
         s = socket.create_connection(('{}', 18841), timeout=20)\n\
         start = time.time()\n\
         try:\n\
         \x20   s.sendall(b'GET /gen/1/100 HTTP/1.1\\r\\n')\n\
         \x20   while time.time() - start < 15:\n\
         \x20       s.sendall(b'X')\n\
         \x20       time.sleep(0.2)\n\
         \x20   print('not reset')\n\
         except (ConnectionResetError, BrokenPipeError):\n\
         \x20   print('reset %.1f' % (time.time() - start))\n",
        VETH.addr_b
    );
    slow_client_is_cut_off(18_841, &script, "the dripping client");
}

/// A client that asks for 64 MiB and reads 1 KiB every 0.2 s (each read acknowledges
/// something, so the idle timeout never comes) is reset once its response moved less than
/// 64 KiB in an `--idle-timeout`, and counted as slow.
#[test]
fn a_client_reading_a_trickle_is_cut_off() {
    let _bed = bed_or_skip!();
    let script = format!(
        "import socket, time\n\
         s = socket.socket()\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)\n\
         s.settimeout(20)\n\
         s.connect(('{}', 18842))\n\
         s.sendall(b'GET /gen/1/67108864 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n\
         start = time.time()\n\
         try:\n\
         \x20   while time.time() - start < 15:\n\
         \x20       if not s.recv(1024):\n\
         \x20           break\n\
         \x20       time.sleep(0.2)\n\
         \x20   print('not reset')\n\
         except ConnectionResetError:\n\
         \x20   print('reset %.1f' % (time.time() - start))\n",
        VETH.addr_b
    );
    slow_client_is_cut_off(18_842, &script, "the trickling reader");
}

/// A client that pipelines 32 GETs deep for longer than `--idle-timeout` is served to the
/// end: the server stops reading while 16 responses are queued, with whole heads waiting in
/// its buffer, which is not a head coming slowly; each request read starts its answer's time
/// afresh.
#[test]
fn a_pipelining_client_is_not_taken_for_a_slow_one() {
    let _bed = bed_or_skip!();
    let s = server(&VETH, 18_843, 1, &["--idle-timeout", "0.3"]);
    let c = client(
        &VETH,
        18_843,
        &["--count", "400", "--size", "1048576", "--depth", "32"],
    );
    let srv = finish(s);
    println!("pipelined, depth 32: {c}\nserver: {srv}");
    assert_eq!(u(&c, &["requests"]), 400, "{c}");
    assert_eq!(u(&srv, &["slow_resets"]), 0, "{srv}");
    assert_eq!(u(&srv, &["idle_resets"]), 0, "{srv}");
}

/// The start of a python client script for the server on `port` (`--max-object` 128 MiB):
/// two clients (`hogs`) announce 128 MiB bodies, and once told `100 Continue` (their heads
/// read, the bodies' budget taken) send an octet each; then a third (`c`) sends a 10-octet
/// PUT whole.
fn two_hogs_and_a_small_put(port: u16) -> String {
    format!(
        "import socket, time\n\
         at = ('{}', {port})\n\
         big = b'PUT /big HTTP/1.1\\r\\nContent-Length: 134217728\\r\\n\
         Expect: 100-continue\\r\\n\\r\\n'\n\
         hogs = [socket.create_connection(at, timeout=20) for _ in range(2)]\n\
         for h in hogs:\n\
         \x20   h.sendall(big)\n\
         \x20   assert h.recv(100).startswith(b'HTTP/1.1 100'), 'no 100 Continue'\n\
         \x20   h.sendall(b'x')\n\
         c = socket.create_connection(at, timeout=20)\n\
         c.sendall(b'PUT /small HTTP/1.1\\r\\nContent-Length: 10\\r\\n\\r\\n0123456789')\n",
        VETH.addr_b
    )
}

/// Request bodies share one budget (twice `--max-object`, at least 256 MiB), reserved by
/// what their heads announce: two clients that announce 128 MiB each and send one octet take
/// all of it, and a third client's 10-octet PUT waits unread until one of them leaves, then
/// is answered. Without the budget every connection could make the server hold up to
/// `--max-object`.
#[test]
fn request_bodies_share_one_budget() {
    let _bed = bed_or_skip!();
    let s = server(&VETH, 18_844, 3, &["--max-object", "134217728"]);
    let script = two_hogs_and_a_small_put(18_844)
        + "c.settimeout(1.5)\n\
           try:\n\
           \x20   print('answered while the budget was taken: %r' % c.recv(200))\n\
           except socket.timeout:\n\
           \x20   hogs[0].close()\n\
           \x20   c.settimeout(20)\n\
           \x20   got = c.recv(200)\n\
           \x20   print('answered after' if got.startswith(b'HTTP/1.1 200') else 'got %r' % got)\n\
           hogs[1].close()\n\
           c.close()\n";
    let said = python_in_a(&script);
    assert_eq!(said, "answered after");
    let srv = finish(s);
    assert_eq!(u(&srv, &["bodies_waited"]), 1, "{srv}");
    assert_eq!(u(&srv, &["puts"]), 1, "{srv}");
}

/// A head that waits for room in the bodies' budget longer than `--idle-timeout` is answered
/// `503 Service Unavailable`, and its connection ends: two clients sending 128 MiB bodies
/// steadily (fast enough not to be slow) hold the budget, and a third's small PUT is told
/// the server is busy within a few seconds instead of waiting on them.
#[test]
fn a_body_waiting_past_the_idle_timeout_is_told_busy() {
    let _bed = bed_or_skip!();
    let s = server(
        &VETH,
        18_845,
        3,
        &["--max-object", "134217728", "--idle-timeout", "1"],
    );
    let script = two_hogs_and_a_small_put(18_845)
        + "c.settimeout(0.2)\n\
           start, said = time.time(), 'no answer'\n\
           while time.time() - start < 10:\n\
           \x20   for h in hogs:\n\
           \x20       h.sendall(b'x' * 131072)\n\
           \x20   try:\n\
           \x20       got = c.recv(200)\n\
           \x20       said = '%s after %.1f' % (got.split(b'\\r\\n')[0].decode(), time.time() - start)\n\
           \x20       break\n\
           \x20   except socket.timeout:\n\
           \x20       pass\n\
           print(said)\n\
           for s in hogs + [c]:\n\
           \x20   s.close()\n";
    let said = python_in_a(&script);
    let after = said
        .strip_prefix("HTTP/1.1 503 Service Unavailable after ")
        .and_then(|t| t.parse::<f64>().ok());
    // Told after --idle-timeout (1 s) of waiting, not before, and well within its 6 s.
    assert!(
        after.is_some_and(|t| (0.8..6.0).contains(&t)),
        "the waiting client: {said}"
    );
    let srv = finish(s);
    assert_eq!(u(&srv, &["busy_refusals"]), 1, "{srv}");
    assert_eq!(u(&srv, &["bodies_waited"]), 1, "{srv}");
    assert_eq!(u(&srv, &["slow_resets"]), 0, "the hogs moved enough: {srv}");
}

/// Mistakes are one line on stderr and a failing status, before anything is opened (no root
/// or bed needed).
#[test]
fn http_tools_fail_clearly() {
    for (args, says) in [
        (&["http-client", "10.0.0.1:80"][..], "--iface is required"),
        (
            &[
                "http-client",
                "--iface",
                "lo",
                "--count",
                "0",
                "10.0.0.1:80",
            ],
            "--count must be between 1",
        ),
        (
            &[
                "http-client",
                "--iface",
                "lo",
                "--depth",
                "0",
                "10.0.0.1:80",
            ],
            "--depth must be at least 1",
        ),
        (
            &[
                "http-client",
                "--iface",
                "lo",
                "--path",
                "/gen/1/5",
                "10.0.0.1:80",
            ],
            "--size must match",
        ),
        (
            &["http-server", "--iface", "lo", "--max-object", "5000000000"],
            "--max-object must be below 4 GiB",
        ),
    ] {
        let out = Command::new(common::bin())
            .args(args)
            .output_within(RUN_LIMIT)
            .expect("run iwarp-bench");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
