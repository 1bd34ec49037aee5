//! `iwarp-bench http-server` and `iwarp-bench http-client`: HTTP/1.1 over our TCP on AF_XDP
//! with the TCP RDMA option (draft-csapuntz-tcprdma-00, TCP option kind 25), whose RIDs are
//! laid out as the draft's section 5.2 does for HTTP: the RID of a message's body is the index
//! of its request on the connection (the first request is 0, the upper bits zero).
//!
//! * `http-server --iface IF --port P` answers `GET /gen/SEED/LEN` with LEN pseudo-random
//!   octets (the generator of `tcp-source`), `GET /NAME` with the file NAME of `--dir`, and
//!   `PUT` or `POST` of any path with the SHA-256 (hex) of the body it received; bodies put to
//!   `/gen/SEED/LEN` must be that object (422 otherwise). Response bodies go as RDMA transfers
//!   with the U bit clear (5.2.2) when the client offered the option, and the server posts
//!   buffers (`--put-buffer` octets) for request bodies sent unsolicited (5.2.3).
//! * `http-client --iface IF ADDR:PORT` sends `--count` requests (`--method get|put|post`)
//!   pipelined `--depth` deep on one keep-alive connection. For each GET it posts a buffer for
//!   the body of the response before the request leaves, so the body is placed there straight
//!   from the received frames, in order or not; a PUT's body is an unsolicited transfer.
//!   Bodies of `/gen/` objects are compared with the generator's octets, PUT answers with the
//!   SHA-256 of what was sent.
//!
//! Without the option (`--rdma-option off`, or a peer that does not offer it, such as kernel
//! TCP, which ignores option 25) both are plain HTTP/1.1 and every octet goes through the
//! stream: `curl` downloads from the server, and the client downloads from any HTTP/1.1 or
//! 1.0 server that sends `Content-Length` (with `--count 1` when it closes after a response).
//!
//! Each prints one JSON object on stdout at the end (the server once `--connections` are
//! done): octets, time, the CPU time of its thread, and the TCP RDMA counters
//! ([`tcp_engine::ConnStats`]: options sent and received, octets placed in and out of order,
//! octets delivered through the stream, refused and malformed options).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, ValueEnum};
use datapath::xdp_tcp::engine::wire::rdma::Rid;
use datapath::xdp_tcp::engine::{ConnStats, Instant as TcpInstant, RdmaSend, SendError};
use datapath::xdp_tcp::{ConnId, Connection, Event, TcpApp, XdpTcp};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::cli::OnOff;
use crate::tcp_tools::{
    describe, gbit, hex, open_xdp, secs, Generator, Progress, ToolError, Watchdog, XdpArgs,
    XdpFacts,
};

/// Longest request or response head taken.
const MAX_HEAD: usize = 16 * 1024;
/// Requests a server posts unsolicited-body buffers ahead for: twice the client's default
/// depth, so a body that arrives in the turn before the server read the requests ahead of it
/// still finds its buffer (one that finds none goes through the stream).
const PUT_AHEAD: u64 = 8;
/// Messages read per connection per turn (so transmission keeps its share of the loop).
const MESSAGES_PER_TURN: usize = 64;
/// How long the client waits for the server's FIN once every response is in.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Generated objects the server keeps (octets) before it forgets them all.
const OBJECT_CACHE: usize = 256 << 20;

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Get,
    Put,
    Post,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
        }
    }
}

#[derive(Args, Debug, Clone)]
struct Link {
    #[command(flatten)]
    xdp: XdpArgs,
    /// Offer the TCP RDMA option (kind 25) on the SYN; it is used when both ends offer it.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    rdma_option: OnOff,
    /// Seconds the client waits for the handshake (the server waits for clients until
    /// `--connections` have come and gone, or until it is stopped).
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Seconds without progress after which the client fails as stalled and the server
    /// resets a connection (an idle keep-alive connection included). The server also resets
    /// a connection whose request head is not whole this long after its first octet, and
    /// one with a response to send or a request body coming that moves less than 64 KiB in
    /// this time (a client that drips or reads a trickle holds its place no longer).
    #[arg(long, default_value_t = 30.0)]
    idle_timeout: f64,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
}

/// Serve HTTP/1.1 with bodies annotated by the TCP RDMA option.
#[derive(Parser, Debug)]
#[command(name = "iwarp-bench http-server")]
struct ServerCli {
    #[command(flatten)]
    link: Link,
    /// TCP port to listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Exit (and print the report) after this many connections have closed; 0: never.
    #[arg(long, default_value_t = 0)]
    connections: u64,
    /// Directory whose files `GET /NAME` serves (no subdirectories; regular files only, and
    /// links to them: a FIFO or a device is refused with 403).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Octets of each buffer posted for unsolicited request bodies (PUT, POST); 0: none.
    #[arg(long, default_value_t = 1 << 20)]
    put_buffer: usize,
    /// Octets of such buffers posted at once over all connections (draft-csapuntz-tcprdma-00
    /// 6.1's quota on unsolicited data): connections beyond it get fewer or none (their
    /// bodies go through the stream).
    #[arg(long, default_value_t = 256 << 20)]
    put_budget: usize,
    /// Largest object served or body taken, in octets (at most 4 GiB - 1: the option's
    /// offsets are 32 bits).
    #[arg(long, default_value_t = 1 << 30)]
    max_object: u64,
}

/// Fetch (or upload) objects over HTTP/1.1, bodies placed by the TCP RDMA option.
#[derive(Parser, Debug)]
#[command(name = "iwarp-bench http-client")]
struct ClientCli {
    #[command(flatten)]
    link: Link,
    /// Request method.
    #[arg(long, value_enum, default_value_t = Method::Get)]
    method: Method,
    /// Request target (default `/gen/SEED/SIZE`, checked against the generator).
    #[arg(long)]
    path: Option<String>,
    /// Object size in octets: of `/gen/` objects, of the buffer posted per GET, of PUT bodies.
    #[arg(long, default_value_t = 1 << 20)]
    size: u64,
    /// Seed of the `/gen/` object.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Requests to send.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Requests outstanding at once (pipelined).
    #[arg(long, default_value_t = 4)]
    depth: u64,
    /// The server, ADDR:PORT (IPv4).
    server: SocketAddrV4,
}

#[derive(Debug, thiserror::Error)]
enum HttpError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error("malformed HTTP head: {0}")]
    BadHead(&'static str),
    #[error("HTTP head longer than {MAX_HEAD} octets")]
    HeadTooLarge,
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    #[error("a body of {len} octets, over the {max} allowed")]
    BodyTooLarge { len: u64, max: u64 },
    #[error("more than {MAX_INTERIM} interim (1xx) responses to one request")]
    TooManyInterim,
    #[error(
        "message {index}: the peer placed {len} octets for RID {rid} at buffer offset {at}, \
         where the body had reached {pos} of {body} octets"
    )]
    Misplaced {
        index: u64,
        rid: u64,
        len: u64,
        at: u64,
        pos: u64,
        body: u64,
    },
    #[error("response {index}: status {status} ({line})")]
    Status {
        index: u64,
        status: u16,
        line: String,
    },
    #[error("response {0}: the body differs from what was expected")]
    Mismatch(u64),
    #[error("response {0} answers no request sent")]
    Unrequested(u64),
    #[error("the server closed the connection after {done} of {count} responses")]
    Closed { done: u64, count: u64 },
    #[error("--{0}")]
    BadArg(&'static str),
    #[error("sending: {0}")]
    Send(#[from] SendError),
}

/// Entry point: `args` starts with the tool's own name (`iwarp-bench http-server`
/// or `iwarp-bench http-client`).
pub fn main(args: impl Iterator<Item = String>) -> ExitCode {
    let args: Vec<String> = args.collect();
    let tool = args.first().cloned().unwrap_or_default();
    let result = match tool.as_str() {
        "iwarp-bench http-server" => ServerCli::try_parse_from(&args).map(|c| {
            server(&c).and_then(|r| serde_json::to_string(&r).map_err(|e| BadJson(e).into()))
        }),
        _ => ClientCli::try_parse_from(&args).map(|c| {
            client(&c).and_then(|r| serde_json::to_string(&r).map_err(|e| BadJson(e).into()))
        }),
    };
    match result {
        Err(e) => {
            let _ = e.print();
            if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        Ok(Ok(json)) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("{tool}: {e}");
            ExitCode::FAILURE
        }
    }
}

struct BadJson(serde_json::Error);

impl From<BadJson> for HttpError {
    fn from(e: BadJson) -> Self {
        HttpError::Tool(ToolError::Io {
            what: "writing the report".into(),
            source: e.0.into(),
        })
    }
}

/// CPU time of the calling thread: the engine runs in it (`/proc/thread-self/schedstat`).
fn thread_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns = s.split_whitespace().next()?.parse::<u64>().ok()?;
    Some(Duration::from_nanos(ns))
}

/// The RID of the body of message `index` (5.2.1: zero above the request index).
fn rid(index: u64) -> Rid {
    Rid::new(index & u64::from(u32::MAX)).unwrap_or_else(|_| unreachable!("32 bits fit 46"))
}

/// The TCP RDMA counters of connections, summed.
#[derive(Serialize, Debug, Clone, Default)]
struct RdmaCounters {
    /// Whether the option was in use (on every connection counted).
    option_in_use: bool,
    /// Segments sent with an option describing transfer data.
    options_sent: u64,
    /// Segments received with one.
    options_received: u64,
    /// Octets placed straight into posted buffers, arriving in order.
    placed_in_order: u64,
    /// ... arriving out of order.
    placed_out_of_order: u64,
    /// Octets read through the stream.
    delivered_in_order: u64,
    /// Segments whose well-formed option was not acted on (their data went through the
    /// stream).
    refused: u64,
    /// Segments with a malformed option (ordinary data).
    malformed: u64,
    retransmitted_segments: u64,
    segments_in: u64,
    segments_out: u64,
}

impl RdmaCounters {
    fn add(&mut self, conn: &Connection) {
        let s: &ConnStats = conn.stats();
        self.option_in_use = conn.rdma_option_enabled() && (self.option_in_use || self.is_empty());
        self.options_sent += s.rdma_options_sent;
        self.options_received += s.rdma_options_received;
        self.placed_in_order += s.rdma_placed_in_order;
        self.placed_out_of_order += s.rdma_placed_out_of_order;
        self.delivered_in_order += s.delivered_in_order;
        self.refused += s.rdma_refused;
        self.malformed += s.rdma_malformed;
        self.retransmitted_segments += s.retransmitted_segments;
        self.segments_in += s.segments_in;
        self.segments_out += s.segments_out;
    }

    fn is_empty(&self) -> bool {
        self.segments_in == 0 && self.segments_out == 0
    }
}

// ------------------------------------------------------------------------------ messages

/// A request or response head.
#[derive(Debug, Clone)]
struct Head {
    /// The request or status line.
    line: String,
    content_length: Option<u64>,
    /// The connection stays open after this message (HTTP/1.1 unless `Connection: close`;
    /// HTTP/1.0 only with `Connection: keep-alive`).
    keep_alive: bool,
    /// `Expect: 100-continue` (RFC 9110 10.1.1): the client waits for a 100 before the body.
    expect_continue: bool,
}

impl Head {
    fn parse(octets: &[u8]) -> Result<Head, HttpError> {
        let text = std::str::from_utf8(octets).map_err(|_| HttpError::BadHead("not UTF-8"))?;
        let mut lines = text.split("\r\n");
        let line = lines.next().unwrap_or_default().to_owned();
        let words: Vec<&str> = line.split(' ').collect();
        let version = if line.starts_with("HTTP/") {
            words[0]
        } else if words.len() == 3 {
            words[2]
        } else {
            return Err(HttpError::BadHead(
                "request line is not METHOD TARGET VERSION",
            ));
        };
        let mut keep_alive = match version {
            "HTTP/1.1" => true,
            "HTTP/1.0" => false,
            _ => return Err(HttpError::BadHead("not HTTP/1.0 or HTTP/1.1")),
        };
        let mut content_length = None;
        let mut expect_continue = false;
        for h in lines.filter(|l| !l.is_empty()) {
            let (name, value) = h
                .split_once(':')
                .ok_or(HttpError::BadHead("header line without a colon"))?;
            if name.ends_with([' ', '\t']) || h.starts_with([' ', '\t']) {
                // RFC 9112 5.1 (whitespace before the colon), 5.2 (obsolete line folding).
                return Err(HttpError::BadHead(
                    "whitespace before a colon, or a folded line",
                ));
            }
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                let n = value
                    .bytes()
                    .all(|c| c.is_ascii_digit())
                    .then(|| value.parse::<u64>().ok())
                    .flatten()
                    .ok_or(HttpError::BadHead("Content-Length is not a number"))?;
                if content_length.is_some_and(|c| c != n) {
                    return Err(HttpError::BadHead("two different Content-Lengths"));
                }
                content_length = Some(n);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(HttpError::Unsupported("Transfer-Encoding"));
            } else if name.eq_ignore_ascii_case("expect") {
                expect_continue = value.eq_ignore_ascii_case("100-continue");
            } else if name.eq_ignore_ascii_case("connection") {
                if value.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if value.eq_ignore_ascii_case("keep-alive") {
                    keep_alive = true;
                }
            }
        }
        Ok(Head {
            line,
            content_length,
            keep_alive,
            expect_continue,
        })
    }

    /// A response's status code.
    fn status(&self) -> Option<u16> {
        self.line.split(' ').nth(1)?.parse().ok()
    }
}

/// A whole message read off a connection.
#[derive(Debug)]
struct Message {
    head: Head,
    body: Vec<u8>,
    /// Its index on the connection (its body's RID).
    index: u64,
    /// Body octets placed in a posted buffer (the rest came through the stream).
    placed: u64,
}

/// Interim (1xx) responses the client takes before each final response.
const MAX_INTERIM: u32 = 8;

/// The largest response body the client takes besides the object it asked for (an error
/// page, a PUT's digest).
const SMALL_BODY_MAX: u64 = 64 << 10;

/// The largest response body `http-client` takes: the object of `--size` for a GET (or a
/// small error page), a small one (the digest) for a PUT or POST. What the server says is
/// not believed beyond it: a `Content-Length` of 4 GiB would otherwise be read whole.
fn client_max_body(method: Method, size: u64) -> u64 {
    match method {
        Method::Get => size.max(SMALL_BODY_MAX),
        _ => SMALL_BODY_MAX,
    }
}

/// A body with a posted buffer may have its stream octets in one part per this many of its
/// octets, and [`MIN_PARTS`] more.
const MIN_PART: u64 = 256;
const MIN_PARTS: u64 = 16;

/// Buffers for bodies, reused (a body buffer keeps its length, so reuse writes no zeros).
#[derive(Default)]
struct Pool(Vec<Vec<u8>>);

/// Largest buffer the pool keeps.
const POOL_BUFFER_MAX: usize = 64 << 20;

impl Pool {
    fn get(&mut self, len: usize) -> Vec<u8> {
        let mut v = self.0.pop().unwrap_or_default();
        v.resize(len, 0);
        v
    }

    /// A buffer of any length (for a body that grows as its octets arrive).
    fn any(&mut self) -> Vec<u8> {
        self.0.pop().unwrap_or_default()
    }

    fn put(&mut self, v: Vec<u8>) {
        if self.0.len() < 16 && v.capacity() <= POOL_BUFFER_MAX {
            self.0.push(v);
        }
    }
}

/// The body being read.
struct BodyRead {
    head: Head,
    len: u64,
    pos: u64,
    /// A buffer is posted for it: placed ranges land there, stream octets wait in `parts`.
    posted: bool,
    /// Not posted: the body, `len` octets.
    buf: Vec<u8>,
    parts: Vec<(u64, Vec<u8>)>,
    placed: u64,
}

/// Reads HTTP messages off a connection: heads through the stream, bodies through the stream
/// and by placement into the buffer posted for their RID.
struct Incoming {
    responses: bool,
    inbuf: Vec<u8>,
    /// Index of the message being read.
    index: u64,
    body: Option<BodyRead>,
    /// RIDs a buffer is posted for (by whoever owns this reader).
    posted: BTreeSet<u64>,
    head_octets: u64,
    max_body: u64,
    /// A request head asked for `100 Continue` before its body (the server answers it).
    continue_due: bool,
    /// A request head in `inbuf` (parsed, and where it ends) that announced a body larger than
    /// the room [`Incoming::read`] was given: it stays unread until there is room.
    waiting: Option<(Head, usize)>,
    /// Request heads that had to wait so, each counted once.
    bodies_waited: u64,
    /// Interim responses read since the last whole message.
    interim: u32,
}

impl Incoming {
    fn new(responses: bool, max_body: u64) -> Self {
        Incoming {
            responses,
            inbuf: Vec::new(),
            index: 0,
            body: None,
            posted: BTreeSet::new(),
            head_octets: 0,
            max_body,
            continue_due: false,
            waiting: None,
            bodies_waited: 0,
            interim: 0,
        }
    }

    /// The octets the body being read takes of a shared budget: all it announced, from its
    /// head on (0 if none is being read).
    fn body_reserved(&self) -> u64 {
        self.body.as_ref().map_or(0, |b| b.len)
    }

    /// Whether a request or response head has begun and is not whole yet.
    fn reading_head(&self) -> bool {
        self.body.is_none() && !self.inbuf.is_empty()
    }

    /// Whether a body is being read.
    fn reading_body(&self) -> bool {
        self.body.is_some()
    }

    /// Whether a request head waits for room for its body ([`Incoming::read`]).
    fn body_waits(&self) -> bool {
        self.waiting.is_some()
    }

    /// The next whole message, if it is all in. A body is begun only if it announces at most
    /// `body_room` octets; a larger one leaves its head unread ([`Incoming::body_waits`]).
    /// After an error the message being read is dropped (its body's octets with it).
    fn read(
        &mut self,
        conn: &mut Connection,
        scratch: &mut [u8],
        pool: &mut Pool,
        body_room: u64,
    ) -> Result<Option<Message>, HttpError> {
        let r = self.read_message(conn, scratch, pool, body_room);
        if r.is_err() {
            self.body = None;
            self.waiting = None;
        }
        r
    }

    fn read_message(
        &mut self,
        conn: &mut Connection,
        scratch: &mut [u8],
        pool: &mut Pool,
        body_room: u64,
    ) -> Result<Option<Message>, HttpError> {
        loop {
            let Some(b) = self.body.as_mut() else {
                // A head that waited is not looked for and parsed again.
                let (found, waited) = match self.waiting.take() {
                    Some(w) => (Some(w), true),
                    None => {
                        let end = self.inbuf.windows(4).position(|w| w == b"\r\n\r\n");
                        let found = match end {
                            Some(end) => Some((Head::parse(&self.inbuf[..end])?, end)),
                            None => None,
                        };
                        (found, false)
                    }
                };
                if let Some((head, end)) = found {
                    let announced = head.content_length.unwrap_or(0);
                    if !self.responses && announced > body_room && announced <= self.max_body {
                        self.bodies_waited += u64::from(!waited);
                        self.waiting = Some((head, end));
                        return Ok(None);
                    }
                    self.inbuf.drain(..end + 4);
                    self.head_octets += end as u64 + 4;
                    let status = head.status().filter(|_| self.responses);
                    if status.is_some_and(|s| (100..200).contains(&s)) {
                        // An interim response (RFC 9110 15.2): no body, no message index. A
                        // few per request (a server sending them without end would otherwise
                        // keep the client waiting, each counting as progress).
                        self.interim += 1;
                        if self.interim > MAX_INTERIM {
                            return Err(HttpError::TooManyInterim);
                        }
                        continue;
                    }
                    // RFC 9112 6.3: 204 and 304 responses never have a body.
                    let len = match (head.content_length, self.responses, status) {
                        (_, true, Some(204 | 304)) => 0,
                        (Some(n), _, _) => n,
                        (None, false, _) => 0,
                        (None, true, _) => {
                            return Err(HttpError::Unsupported("a response without Content-Length"))
                        }
                    };
                    if len > self.max_body {
                        return Err(HttpError::BodyTooLarge {
                            len,
                            max: self.max_body,
                        });
                    }
                    let posted = self.posted.contains(&self.index);
                    self.continue_due = !self.responses && head.expect_continue && len > 0;
                    self.body = Some(BodyRead {
                        head,
                        len,
                        pos: 0,
                        posted,
                        // Not posted: grown as octets arrive, not from the head's word.
                        buf: if posted { Vec::new() } else { pool.any() },
                        parts: Vec::new(),
                        placed: 0,
                    });
                    continue;
                }
                if self.inbuf.len() > MAX_HEAD {
                    return Err(HttpError::HeadTooLarge);
                }
                let n = conn.recv(scratch);
                if n == 0 {
                    if let Some(p) = conn.next_placed() {
                        // Placed octets where a head belongs: the peer annotated a head.
                        return Err(HttpError::Misplaced {
                            index: self.index,
                            rid: p.rid.get(),
                            len: p.len,
                            at: p.buffer_offset,
                            pos: 0,
                            body: 0,
                        });
                    }
                    return Ok(None);
                }
                self.inbuf.extend_from_slice(&scratch[..n]);
                continue;
            };
            let left = b.len - b.pos;
            if left == 0 {
                let Some(b) = self.body.take() else {
                    unreachable!("checked above")
                };
                return Ok(Some(self.complete(conn, b, pool)));
            }
            if !self.inbuf.is_empty() {
                // Octets read with the head.
                let n = (self.inbuf.len() as u64).min(left) as usize;
                Self::stream(b, &self.inbuf[..n])?;
                self.inbuf.drain(..n);
                continue;
            }
            let want = left.min(scratch.len() as u64) as usize;
            let n = if b.posted {
                let n = conn.recv(&mut scratch[..want]);
                Self::stream(b, &scratch[..n])?;
                n
            } else {
                let at = b.pos as usize;
                Self::room(&mut b.buf, at + want, b.len as usize);
                let n = conn.recv(&mut b.buf[at..at + want]);
                b.pos += n as u64;
                n
            };
            if n > 0 {
                continue;
            }
            let Some(p) = conn.next_placed() else {
                return Ok(None);
            };
            if p.rid != rid(self.index) || p.buffer_offset != b.pos || p.len > left || !b.posted {
                return Err(HttpError::Misplaced {
                    index: self.index,
                    rid: p.rid.get(),
                    len: p.len,
                    at: p.buffer_offset,
                    pos: b.pos,
                    body: b.len,
                });
            }
            b.pos += p.len;
            b.placed += p.len;
        }
    }

    /// Body octets that came through the stream. Those of a body with a posted buffer wait in
    /// parts, at most one per [`MIN_PART`] octets of the body and [`MIN_PARTS`] more (the peer
    /// choosing what it places and what it streams could otherwise cut the body into octets,
    /// each its own part).
    fn stream(b: &mut BodyRead, octets: &[u8]) -> Result<(), HttpError> {
        if octets.is_empty() {
            return Ok(());
        }
        if b.posted {
            // Contiguous stream octets in one part: a sender cutting its body into 1-octet
            // segments costs no bookkeeping per octet.
            let parts = b.parts.len() as u64;
            match b.parts.last_mut() {
                Some((at, part)) if *at + part.len() as u64 == b.pos => {
                    part.extend_from_slice(octets)
                }
                _ if parts >= b.len / MIN_PART + MIN_PARTS => {
                    return Err(HttpError::Unsupported(
                        "a body streamed in this many pieces",
                    ));
                }
                _ => b.parts.push((b.pos, octets.to_vec())),
            }
        } else {
            let at = b.pos as usize;
            Self::room(&mut b.buf, at + octets.len(), b.len as usize);
            b.buf[at..at + octets.len()].copy_from_slice(octets);
        }
        b.pos += octets.len() as u64;
        Ok(())
    }

    /// Makes `buf` at least `need` octets long (doubling, at most `len`).
    fn room(buf: &mut Vec<u8>, need: usize, len: usize) {
        if buf.len() < need {
            buf.resize(need.max(buf.len() * 2).min(len), 0);
        }
    }

    /// Whether the message being read has a body that arrives without a posted buffer.
    fn reading_unposted(&self) -> bool {
        self.body.as_ref().is_some_and(|b| !b.posted)
    }

    fn complete(&mut self, conn: &mut Connection, b: BodyRead, pool: &mut Pool) -> Message {
        // The body is in: too late for a 100 Continue.
        self.continue_due = false;
        self.interim = 0;
        let index = self.index;
        self.index += 1;
        // A buffer posted for this index (also one posted after its head came without one).
        let buffer = self
            .posted
            .remove(&index)
            .then(|| conn.take_rdma_buffer(rid(index)))
            .flatten();
        let body = match buffer {
            Some(mut buf) if b.posted && b.len > 0 => {
                buf.resize(b.len as usize, 0);
                for (at, octets) in &b.parts {
                    let at = *at as usize;
                    buf[at..at + octets.len()].copy_from_slice(octets);
                }
                buf
            }
            other => {
                // No body (a GET at the server), or one read through the stream: a posted
                // buffer goes back to the pool with its length, for reuse without zeroing.
                if let Some(buf) = other {
                    pool.put(buf);
                }
                let mut body = b.buf;
                body.truncate(b.len as usize);
                body
            }
        };
        Message {
            head: b.head,
            body,
            index,
            placed: b.placed,
        }
    }
}

/// A message to send: its head through the stream, its body as the RDMA transfer of `rid`
/// (ordinary stream octets when the option is not in use).
struct Outgoing {
    head: Vec<u8>,
    head_sent: usize,
    body: Arc<Vec<u8>>,
    body_sent: usize,
    rid: Rid,
    unsolicited: bool,
    close_after: bool,
}

impl Outgoing {
    /// Message `index` of its connection (its body, if any, is the transfer of `rid(index)`).
    fn new(
        head: impl Into<Vec<u8>>,
        body: Arc<Vec<u8>>,
        index: u64,
        unsolicited: bool,
        close_after: bool,
    ) -> Outgoing {
        Outgoing {
            head: head.into(),
            head_sent: 0,
            body,
            body_sent: 0,
            rid: rid(index),
            unsolicited,
            close_after,
        }
    }
}

/// Queues what fits of `out`; `Ok(true)` when a message that closes the connection is done.
fn push_out(conn: &mut Connection, out: &mut VecDeque<Outgoing>) -> Result<bool, SendError> {
    while let Some(o) = out.front_mut() {
        while o.head_sent < o.head.len() {
            let n = conn.send(&o.head[o.head_sent..])?;
            if n == 0 {
                return Ok(false);
            }
            o.head_sent += n;
        }
        let total = o.body.len() as u32;
        while o.body_sent < o.body.len() {
            let send = RdmaSend {
                rid: o.rid,
                buffer_offset: o.body_sent as u32,
                total_length: Some(total),
                unsolicited: o.unsolicited,
            };
            let n = conn.send_rdma(&o.body[o.body_sent..], send)?;
            if n == 0 {
                return Ok(false);
            }
            o.body_sent += n;
        }
        let close = o.close_after;
        out.pop_front();
        if close {
            return Ok(true);
        }
    }
    Ok(false)
}

fn gen_path(seed: u64, size: u64) -> String {
    format!("/gen/{seed}/{size}")
}

/// `/gen/SEED/LEN`.
fn parse_gen(path: &str) -> Option<(u64, u64)> {
    let (seed, len) = path.strip_prefix("/gen/")?.split_once('/')?;
    Some((seed.parse().ok()?, len.parse().ok()?))
}

fn generate(seed: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    Generator::new(seed).fill(&mut v);
    v
}

fn open(link: &Link) -> Result<XdpTcp, HttpError> {
    Ok(open_xdp(&link.xdp)?)
}

// -------------------------------------------------------------------------------- server

/// What the server prints.
#[derive(Serialize, Debug)]
struct ServerReport {
    tool: &'static str,
    local: String,
    connections: u64,
    #[serde(flatten)]
    totals: ServerTotals,
    cpu_seconds: f64,
    rdma: RdmaCounters,
    xdp: XdpFacts,
}

/// What the server counts over its connections (in its report as they are).
#[derive(Serialize, Debug, Clone, Default)]
struct ServerTotals {
    requests: u64,
    gets: u64,
    puts: u64,
    /// Response body octets sent.
    body_octets_sent: u64,
    /// Request body octets received.
    body_octets_received: u64,
    /// ... of which placed straight into posted buffers.
    body_octets_placed: u64,
    /// Request bodies placed whole. A connection's first body can miss its buffer for the
    /// octets of the segment that completes the handshake: they are passed up before the
    /// server has the connection and posts buffers (they go through the stream).
    bodies_placed_whole: u64,
    /// Octets of request heads (read through the stream).
    head_octets: u64,
    /// Connections reset for making no progress for `--idle-timeout`.
    idle_resets: u64,
    /// Connections reset for being too slow: a request head not whole within
    /// `--idle-timeout` of its first octet, or a response or request body moving less than
    /// [`MIN_PROGRESS`] octets in that time.
    slow_resets: u64,
    /// `100 Continue` answers to `Expect: 100-continue`.
    continues_sent: u64,
    /// Request heads left unread for a while because the bodies other connections were
    /// sending took the budget for bodies (twice `--max-object`, at least 256 MiB).
    bodies_waited: u64,
    /// ... of which answered `503 Service Unavailable` after waiting `--idle-timeout`.
    busy_refusals: u64,
}

struct ServerPeer {
    incoming: Incoming,
    out: VecDeque<Outgoing>,
    peer_closed: bool,
    /// A response that ends the connection is queued: nothing after it is read (RFC 9112
    /// 9.6).
    stop_reading: bool,
    closing: bool,
    /// Octets moved either way when progress was last counted, and when that was (the idle
    /// timeout; with a response or body under way, progress is [`MIN_PROGRESS`] octets).
    moved: u64,
    last_progress: Instant,
    /// When the request head being read began (its first octet was read), if one is.
    head_since: Option<Instant>,
    /// Since when a head waits for room for its body ([`Incoming::body_waits`]), if one does.
    waiting_since: Option<Instant>,
}

/// Octets a connection with a response to send or a request body coming must move in each
/// `--idle-timeout` to count as making progress.
const MIN_PROGRESS: u64 = 64 << 10;

/// Responses a connection may have queued before the server stops reading its requests
/// (a client that pipelines and does not read holds no more than this).
const MAX_QUEUED_RESPONSES: usize = 16;

/// The unsent octets of a connection's queued response bodies.
fn queued_body_octets(out: &VecDeque<Outgoing>) -> u64 {
    out.iter()
        .map(|o| (o.body.len() - o.body_sent) as u64)
        .sum()
}

/// Whether a connection with `queued` responses holding `own` unsent body octets may have
/// its next request read, while all connections' queued bodies hold `all` octets: not past
/// [`MAX_QUEUED_RESPONSES`], nor while its own bodies hold `max_object` octets or more, nor
/// while everyone's hold `budget` (a client that asks for large objects and reads nothing
/// holds one, and many such clients hold `budget` together, not 16 objects each).
fn may_read_request(queued: usize, own: u64, all: u64, max_object: u64, budget: u64) -> bool {
    queued < MAX_QUEUED_RESPONSES && own < max_object.max(1) && all < budget
}

struct ServerApp {
    put_buffer: usize,
    /// Buffers for unsolicited bodies posted now, over all connections, and the most.
    posted_buffers: usize,
    max_posted_buffers: usize,
    idle: Duration,
    max_object: u64,
    dir: Option<PathBuf>,
    peers: HashMap<ConnId, ServerPeer>,
    objects: HashMap<(u64, u64), Arc<Vec<u8>>>,
    object_octets: usize,
    /// The unsent octets of every connection's queued response bodies (objects the cache
    /// shares counted once per response).
    queued_octets: u64,
    /// The octets the request bodies being read announced, over all connections.
    bodies_reserved: u64,
    /// The most either may hold: queued responses before no request is read
    /// ([`may_read_request`]), bodies being read before a head whose body does not fit waits
    /// unread ([`Incoming::body_waits`]) until others are in.
    budget: u64,
    scratch: Vec<u8>,
    pool: Pool,
    closed: u64,
    totals: ServerTotals,
    rdma: RdmaCounters,
}

/// A response with a small text body.
fn text_response(status: &str, body: &str, close: bool, index: u64) -> Outgoing {
    let head = response_head(status, body.len(), "text/plain", close) + body;
    Outgoing::new(head, Arc::default(), index, false, close)
}

/// A response's head: status line, length and type, and `Connection: close` when `close`.
fn response_head(status: &str, len: usize, content_type: &str, close: bool) -> String {
    let conn = if close { "Connection: close\r\n" } else { "" };
    format!(
        "HTTP/1.1 {status}\r\nContent-Length: {len}\r\nContent-Type: {content_type}\r\n\
         {conn}\r\n"
    )
}

impl ServerApp {
    fn object(&mut self, seed: u64, len: u64) -> Arc<Vec<u8>> {
        if let Some(o) = self.objects.get(&(seed, len)) {
            return o.clone();
        }
        if self.object_octets + len as usize > OBJECT_CACHE {
            self.objects.clear();
            self.object_octets = 0;
        }
        let o = Arc::new(generate(seed, len));
        self.object_octets += len as usize;
        self.objects.insert((seed, len), o.clone());
        o
    }

    /// The response to request `m`.
    fn respond(&mut self, m: Message) -> Outgoing {
        self.totals.requests += 1;
        let close = !m.head.keep_alive;
        let words: Vec<&str> = m.head.line.split(' ').collect();
        let (method, target) = (words[0], words.get(1).copied().unwrap_or("/"));
        let path = target.split('?').next().unwrap_or(target);
        let out = match method {
            "GET" => {
                self.totals.gets += 1;
                let body = if let Some((seed, len)) = parse_gen(path) {
                    if len > self.max_object {
                        Err(("413 Content Too Large", "object too large\n"))
                    } else {
                        Ok(self.object(seed, len))
                    }
                } else {
                    self.file(path)
                };
                match body {
                    Ok(body) => {
                        self.totals.body_octets_sent += body.len() as u64;
                        let head =
                            response_head("200 OK", body.len(), "application/octet-stream", close);
                        Outgoing::new(head, body, m.index, false, close)
                    }
                    Err((status, text)) => text_response(status, text, close, m.index),
                }
            }
            "PUT" | "POST" => {
                self.totals.puts += 1;
                self.totals.body_octets_received += m.body.len() as u64;
                self.totals.body_octets_placed += m.placed;
                if !m.body.is_empty() && m.placed == m.body.len() as u64 {
                    self.totals.bodies_placed_whole += 1;
                }
                let digest = hex(&Sha256::digest(&m.body));
                let matches = match parse_gen(path) {
                    Some((seed, len)) if len <= self.max_object => {
                        len == m.body.len() as u64 && *self.object(seed, len) == m.body
                    }
                    _ => true,
                };
                if matches {
                    text_response("200 OK", &format!("{digest}\n"), close, m.index)
                } else {
                    text_response(
                        "422 Unprocessable Content",
                        &format!("{digest}\n"),
                        close,
                        m.index,
                    )
                }
            }
            _ => text_response("405 Method Not Allowed", "GET, PUT, POST\n", close, m.index),
        };
        self.pool.put(m.body);
        out
    }

    /// Posts buffers for unsolicited request bodies (5.2.3), [`PUT_AHEAD`] requests ahead.
    fn offer_put_buffers(&mut self, peer: &mut ServerPeer, conn: &mut Connection) {
        if !conn.rdma_option_enabled() || self.put_buffer == 0 {
            return;
        }
        // Not for a body already being read through the stream (it would be split).
        let first = peer.incoming.index + u64::from(peer.incoming.reading_unposted());
        for i in first..first + PUT_AHEAD {
            if peer.incoming.posted.contains(&i) {
                continue;
            }
            if self.posted_buffers >= self.max_posted_buffers {
                break;
            }
            let buf = self.pool.get(self.put_buffer);
            if conn.post_rdma_buffer(rid(i), buf, true).is_err() {
                break;
            }
            peer.incoming.posted.insert(i);
            self.posted_buffers += 1;
        }
    }

    /// A file of `--dir`.
    fn file(&self, path: &str) -> Result<Arc<Vec<u8>>, (&'static str, &'static str)> {
        served_file(self.dir.as_deref(), path, self.max_object)
    }
}

/// The file `path` (`/NAME`) of the served directory `dir`, or the status and text of the
/// response that refuses it.
///
/// Only regular files (or links to them) are served, read to at most `max_object` octets:
/// the server has one thread, so a FIFO (whose `open` waits for a writer, whose reads wait
/// for data) would stop every connection, and a device such as `/dev/zero` (length 0 by its
/// metadata) would be read without end. What is not a regular file is refused before it is
/// opened, and again by the opened file's own metadata (it may have been replaced in
/// between), the open being non-blocking so that a FIFO put there meanwhile cannot hold it.
fn served_file(
    dir: Option<&Path>,
    path: &str,
    max_object: u64,
) -> Result<Arc<Vec<u8>>, (&'static str, &'static str)> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    const NOT_FOUND: (&str, &str) = ("404 Not Found", "not found\n");
    const NOT_REGULAR: (&str, &str) = ("403 Forbidden", "not a regular file\n");
    const TOO_LARGE: (&str, &str) = ("413 Content Too Large", "file too large\n");
    const READ_FAILED: (&str, &str) = ("500 Internal Server Error", "read failed\n");
    let dir = dir.ok_or(NOT_FOUND)?;
    let name = path.strip_prefix('/').ok_or(NOT_FOUND)?;
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(NOT_FOUND);
    }
    let path = dir.join(name);
    let regular = |m: &std::fs::Metadata| {
        if !m.file_type().is_file() {
            Err(NOT_REGULAR)
        } else if m.len() > max_object {
            Err(TOO_LARGE)
        } else {
            Ok(m.len())
        }
    };
    // Follows links, as the open does.
    regular(&std::fs::metadata(&path).map_err(|_| NOT_FOUND)?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .map_err(|_| NOT_FOUND)?;
    let len = regular(&file.metadata().map_err(|_| READ_FAILED)?)?;
    // A file that grew since: at most one octet more than may be served, to tell.
    let mut body = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(max_object.saturating_add(1))
        .read_to_end(&mut body)
        .map_err(|_| READ_FAILED)?;
    if body.len() as u64 > max_object {
        return Err(TOO_LARGE);
    }
    Ok(Arc::new(body))
}

impl TcpApp for ServerApp {
    fn on_accept(&mut self, id: ConnId, conn: &mut Connection) {
        let mut peer = ServerPeer {
            incoming: Incoming::new(false, self.max_object),
            out: VecDeque::new(),
            peer_closed: false,
            stop_reading: false,
            closing: false,
            moved: 0,
            last_progress: Instant::now(),
            head_since: None,
            waiting_since: None,
        };
        self.offer_put_buffers(&mut peer, conn);
        self.peers.insert(id, peer);
    }

    fn on_event(&mut self, id: ConnId, _conn: &mut Connection, event: Event) {
        if let (Some(p), Event::PeerClosed) = (self.peers.get_mut(&id), event) {
            p.peer_closed = true;
        }
    }

    fn on_poll(&mut self, id: ConnId, conn: &mut Connection, _now: TcpInstant) {
        let Some(mut peer) = self.peers.remove(&id) else {
            return;
        };
        let queued_before = queued_body_octets(&peer.out);
        let reserved_before = peer.incoming.body_reserved();
        // What the other connections' bodies left.
        let body_room = self
            .budget
            .saturating_sub(self.bodies_reserved.saturating_sub(reserved_before));
        if !peer.closing && !peer.stop_reading {
            self.offer_put_buffers(&mut peer, conn);
        }
        let posted_before = peer.incoming.posted.len();
        // Whether every request that arrived has been read.
        let mut drained = false;
        let mut held_back = false;
        // Heads read whole this turn (each restarts the clocks).
        let heads_before = peer.incoming.head_octets;
        if !peer.closing && !peer.stop_reading {
            for _ in 0..MESSAGES_PER_TURN {
                let own = queued_body_octets(&peer.out);
                let all = (self.queued_octets + own).saturating_sub(queued_before);
                if !may_read_request(peer.out.len(), own, all, self.max_object, self.budget) {
                    // Held back by everyone's queued bodies with nothing of its own queued:
                    // waiting for room is not idleness (no reset for --idle-timeout
                    // meanwhile). A connection whose own responses wait (its client reading
                    // slowly or not at all) is reset as before, which frees the budget.
                    held_back = peer.out.is_empty();
                    break;
                }
                match peer
                    .incoming
                    .read(conn, &mut self.scratch, &mut self.pool, body_room)
                {
                    Ok(Some(m)) => {
                        // (A head after it that waits has its own time.)
                        peer.waiting_since = None;
                        let out = self.respond(m);
                        peer.stop_reading = out.close_after;
                        peer.out.push_back(out);
                        if peer.stop_reading {
                            break;
                        }
                    }
                    Ok(None) if peer.incoming.body_waits() => {
                        // Waiting for others' bodies to come in (for --idle-timeout at
                        // most, below), as for their responses to drain.
                        held_back = peer.out.is_empty();
                        break;
                    }
                    Ok(None) => {
                        drained = true;
                        break;
                    }
                    Err(e) => {
                        let index = peer.incoming.index;
                        peer.out.push_back(text_response(
                            "400 Bad Request",
                            &format!("{e}\n"),
                            true,
                            index,
                        ));
                        peer.stop_reading = true;
                        break;
                    }
                }
            }
        }
        let now = Instant::now();
        // A head waits for room for its body no longer than --idle-timeout: it is then told
        // the server is busy (503, RFC 9110 15.6.4), and the connection ends after that. A
        // few clients sending large bodies slowly hold the budget meanwhile, but nobody
        // waits on them for good.
        if peer.incoming.body_waits() && !peer.stop_reading {
            let since = *peer.waiting_since.get_or_insert(now);
            if now.duration_since(since) > self.idle {
                self.totals.busy_refusals += 1;
                let index = peer.incoming.index;
                let text = "request bodies fill the server's budget: try again later\n";
                peer.out
                    .push_back(text_response("503 Service Unavailable", text, true, index));
                peer.stop_reading = true;
                held_back = false;
            }
        } else {
            peer.waiting_since = None;
        }
        // Messages read took their buffers back.
        self.posted_buffers -= posted_before - peer.incoming.posted.len();
        // The body's sender waits for this (its final response is queued when the body is
        // in, after it).
        if std::mem::take(&mut peer.incoming.continue_due) && !peer.stop_reading {
            self.totals.continues_sent += 1;
            let head = &b"HTTP/1.1 100 Continue\r\n\r\n"[..];
            let index = peer.incoming.index;
            peer.out
                .push_back(Outgoing::new(head, Arc::default(), index, false, false));
        }
        match push_out(conn, &mut peer.out) {
            Ok(true) => {
                conn.close();
                peer.closing = true;
                peer.out.clear();
            }
            Ok(false) => {}
            Err(_) => peer.closing = true,
        }
        // The client closed and everything it sent is answered (a request cut short by its
        // FIN never completes).
        if peer.peer_closed
            && (drained || peer.stop_reading)
            && peer.out.is_empty()
            && !peer.closing
        {
            conn.close();
            peer.closing = true;
        }
        let st = conn.stats();
        let moved = st.delivered_in_order
            + st.rdma_placed_in_order
            + st.rdma_placed_out_of_order
            + conn.bytes_acked();
        // A head must come whole within --idle-timeout of its first octet: one dripped an
        // octet at a time holds its connection no longer. Timed only while everything that
        // came was read (`drained`: what is left is one unfinished head); a head waiting
        // while the server reads nothing, its own responses queued or the turn's share
        // taken, is not the client's delay.
        let head_read = peer.incoming.head_octets != heads_before;
        if head_read {
            peer.head_since = None;
        }
        let head_late = if drained && peer.incoming.reading_head() {
            now.duration_since(*peer.head_since.get_or_insert(now)) > self.idle
        } else {
            peer.head_since = None;
            false
        };
        // With a response to send (queued here, or a window's worth in TCP) or a body
        // coming, a trickle is not progress.
        let under_way = !peer.out.is_empty()
            || peer.incoming.reading_body()
            || conn.send_queue_len() as u64 >= MIN_PROGRESS;
        let progressed = if under_way {
            moved.saturating_sub(peer.moved) >= MIN_PROGRESS
        } else {
            moved != peer.moved
        };
        if head_late {
            conn.abort();
            self.totals.slow_resets += 1;
            peer.head_since = None;
            peer.last_progress = now;
        } else if progressed || held_back || head_read {
            // (A request read starts its answer's time afresh.)
            peer.moved = moved;
            peer.last_progress = now;
        } else if now.duration_since(peer.last_progress) > self.idle {
            // Too little either way for --idle-timeout: a dead, stuck, idle or slow peer.
            conn.abort();
            if moved == peer.moved {
                self.totals.idle_resets += 1;
            } else {
                self.totals.slow_resets += 1;
            }
            peer.last_progress = now;
        }
        self.queued_octets =
            (self.queued_octets + queued_body_octets(&peer.out)).saturating_sub(queued_before);
        debug_assert!(self.bodies_reserved >= reserved_before);
        self.bodies_reserved =
            (self.bodies_reserved + peer.incoming.body_reserved()).saturating_sub(reserved_before);
        self.peers.insert(id, peer);
    }

    fn on_closed(&mut self, id: ConnId, conn: Connection) {
        if let Some(peer) = self.peers.remove(&id) {
            // Its buffers go with it, and its queued responses.
            self.posted_buffers -= peer.incoming.posted.len();
            self.queued_octets = self
                .queued_octets
                .saturating_sub(queued_body_octets(&peer.out));
            self.bodies_reserved = self
                .bodies_reserved
                .saturating_sub(peer.incoming.body_reserved());
            self.totals.bodies_waited += peer.incoming.bodies_waited;
            self.closed += 1;
            self.totals.head_octets += peer.incoming.head_octets;
            self.rdma.add(&conn);
        }
    }
}

fn server(cli: &ServerCli) -> Result<ServerReport, HttpError> {
    if cli.max_object > u64::from(u32::MAX) {
        return Err(HttpError::BadArg(
            "max-object must be below 4 GiB (32-bit offsets)",
        ));
    }
    let mut drv = open(&cli.link)?;
    let mut cfg = drv.tcp_config();
    cfg.rdma_option = cli.link.rdma_option.on();
    let offered = cfg.rdma_option;
    drv.listen(cli.port, 16, cfg).map_err(ToolError::from)?;
    let local = format!("{}:{}", drv.local_ip(), cli.port);
    eprintln!(
        "http-server: listening on {local} ({}, TCP RDMA option {})",
        describe(&drv),
        if offered { "offered" } else { "off" }
    );
    let mut app = ServerApp {
        put_buffer: cli.put_buffer,
        posted_buffers: 0,
        max_posted_buffers: cli.put_budget.checked_div(cli.put_buffer).unwrap_or(0),
        idle: secs(cli.link.idle_timeout, "idle-timeout")?,
        max_object: cli.max_object,
        dir: cli.dir.clone(),
        peers: HashMap::new(),
        objects: HashMap::new(),
        object_octets: 0,
        queued_octets: 0,
        bodies_reserved: 0,
        // Two of the largest objects, or the cache's size: what many clients that read
        // nothing, or send large bodies slowly, may make the server hold together (each
        // kind as much).
        budget: (2 * cli.max_object).max(OBJECT_CACHE as u64),
        scratch: vec![0u8; 64 * 1024],
        pool: Pool::default(),
        closed: 0,
        totals: ServerTotals::default(),
        rdma: RdmaCounters::default(),
    };
    let cpu0 = thread_cpu();
    while cli.connections == 0 || app.closed < cli.connections {
        drv.turn(&mut app).map_err(ToolError::from)?;
    }
    // One last turn so the final ACKs leave before the program detaches.
    drv.poll(&mut app).map_err(ToolError::from)?;
    let cpu = match (cpu0, thread_cpu()) {
        (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64(),
        _ => 0.0,
    };
    Ok(ServerReport {
        tool: "http-server",
        local,
        connections: app.closed,
        totals: app.totals.clone(),
        cpu_seconds: cpu,
        rdma: app.rdma.clone(),
        xdp: XdpFacts::of(&drv),
    })
}

// -------------------------------------------------------------------------------- client

/// What the client prints.
#[derive(Serialize, Debug)]
struct ClientReport {
    tool: &'static str,
    method: &'static str,
    path: String,
    server: String,
    local: String,
    requests: u64,
    /// Response (GET) or request (PUT, POST) body octets.
    body_octets: u64,
    /// Response body octets placed straight into the posted buffers.
    body_octets_placed: u64,
    /// Octets of response heads (read through the stream).
    head_octets: u64,
    /// First request queued to last response in.
    seconds: f64,
    gbit_s: f64,
    /// CPU time of the client's thread (engine included) over `seconds`.
    cpu_seconds: f64,
    cpu_ns_per_octet: f64,
    /// How bodies were checked: `generator` (`/gen/` objects), `first` (every body equal to
    /// the first), `sha256` (PUT: the server's digest of what it got).
    verified: &'static str,
    /// SHA-256 of the first response body (GET) or of the body sent (PUT, POST).
    sha256: String,
    rdma: RdmaCounters,
    xdp: XdpFacts,
}

struct ClientApp {
    id: ConnId,
    method: Method,
    path: String,
    host: String,
    size: u64,
    count: u64,
    depth: u64,
    /// `/gen/` GETs: the octets every body must be.
    expected: Option<Arc<Vec<u8>>>,
    /// PUT, POST: the body and its digest.
    upload: Arc<Vec<u8>>,
    upload_digest: String,
    first: Option<Vec<u8>>,
    incoming: Incoming,
    out: VecDeque<Outgoing>,
    pool: Pool,
    scratch: Vec<u8>,
    sent: u64,
    done: u64,
    body_octets: u64,
    body_octets_placed: u64,
    connected: Option<Instant>,
    finished: Option<Instant>,
    cpu: (Option<Duration>, Option<Duration>),
    close_sent: bool,
    peer_closed: bool,
    closed: bool,
    moved: u64,
    failure: Option<HttpError>,
    rdma: RdmaCounters,
}

impl ClientApp {
    fn request(&mut self, conn: &mut Connection) -> Result<(), HttpError> {
        let index = self.sent;
        let get = self.method == Method::Get;
        if get && conn.rdma_option_enabled() {
            let buf = self.pool.get(self.size as usize);
            if conn.post_rdma_buffer(rid(index), buf, false).is_ok() {
                self.incoming.posted.insert(index);
            }
        }
        let length = if get {
            String::new()
        } else {
            format!("Content-Length: {}\r\n", self.upload.len())
        };
        let head = format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\n{length}\r\n",
            self.method.as_str(),
            self.path,
            self.host
        );
        let body = if get {
            Arc::default()
        } else {
            self.upload.clone()
        };
        self.out
            .push_back(Outgoing::new(head, body, index, true, false));
        self.sent += 1;
        Ok(())
    }

    fn check(&mut self, m: Message) -> Result<(), HttpError> {
        if m.index >= self.sent {
            return Err(HttpError::Unrequested(m.index));
        }
        let status = m.head.status().unwrap_or(0);
        if !(200..300).contains(&status) {
            return Err(HttpError::Status {
                index: m.index,
                status,
                line: m.head.line.clone(),
            });
        }
        self.done += 1;
        if self.method == Method::Get {
            self.body_octets += m.body.len() as u64;
            self.body_octets_placed += m.placed;
            match (&self.expected, &self.first) {
                (Some(e), _) if **e != m.body => return Err(HttpError::Mismatch(m.index)),
                (None, Some(f)) if *f != m.body => return Err(HttpError::Mismatch(m.index)),
                (None, None) => {
                    self.first = Some(m.body);
                    return Ok(());
                }
                _ => {}
            }
        } else {
            self.body_octets += self.upload.len() as u64;
            if m.body.strip_suffix(b"\n").unwrap_or(&m.body) != self.upload_digest.as_bytes() {
                return Err(HttpError::Mismatch(m.index));
            }
        }
        self.pool.put(m.body);
        Ok(())
    }

    fn step(&mut self, conn: &mut Connection) -> Result<(), HttpError> {
        while self.sent < self.count && self.sent - self.done < self.depth {
            self.request(conn)?;
        }
        push_out(conn, &mut self.out)?;
        let mut drained = false;
        for _ in 0..MESSAGES_PER_TURN {
            if self.done == self.count {
                break;
            }
            match self
                .incoming
                .read(conn, &mut self.scratch, &mut self.pool, u64::MAX)?
            {
                Some(m) => self.check(m)?,
                None => {
                    drained = true;
                    break;
                }
            }
        }
        if self.done == self.count && self.finished.is_none() {
            self.finished = Some(Instant::now());
            self.cpu.1 = thread_cpu();
            conn.close();
            self.close_sent = true;
        }
        if self.peer_closed && self.done < self.count && drained {
            return Err(HttpError::Closed {
                done: self.done,
                count: self.count,
            });
        }
        Ok(())
    }
}

impl TcpApp for ClientApp {
    fn on_event(&mut self, id: ConnId, _conn: &mut Connection, event: Event) {
        if id != self.id {
            return;
        }
        match event {
            Event::Connected => {
                self.connected = Some(Instant::now());
                self.cpu.0 = thread_cpu();
            }
            Event::PeerClosed => self.peer_closed = true,
            Event::Reset if self.finished.is_none() => {
                self.failure = Some(if self.connected.is_none() {
                    ToolError::Refused(self.server()).into()
                } else {
                    ToolError::Reset(self.moved).into()
                });
            }
            Event::TimedOut if self.finished.is_none() => {
                self.failure = Some(ToolError::TimedOut(self.moved).into());
            }
            _ => {}
        }
    }

    fn on_poll(&mut self, id: ConnId, conn: &mut Connection, _now: TcpInstant) {
        if id != self.id || self.connected.is_none() || self.failure.is_some() {
            return;
        }
        if self.finished.is_none() {
            if let Err(e) = self.step(conn) {
                self.failure = Some(e);
                conn.abort();
            }
        }
        let s = conn.stats();
        self.moved = s.delivered_in_order
            + s.rdma_placed_in_order
            + s.rdma_placed_out_of_order
            + conn.bytes_acked();
    }

    fn on_closed(&mut self, id: ConnId, conn: Connection) {
        if id == self.id {
            self.closed = true;
            self.rdma.add(&conn);
        }
    }
}

impl ClientApp {
    fn server(&self) -> SocketAddrV4 {
        self.host.parse().unwrap_or(SocketAddrV4::new(0.into(), 0))
    }
}

fn client(cli: &ClientCli) -> Result<ClientReport, HttpError> {
    let link = &cli.link;
    let timeout = secs(link.timeout, "timeout")?;
    let idle = secs(link.idle_timeout, "idle-timeout")?;
    if cli.count == 0 || cli.count > u64::from(u32::MAX) {
        return Err(HttpError::BadArg("count must be between 1 and 2^32 - 1"));
    }
    if cli.depth == 0 {
        return Err(HttpError::BadArg("depth must be at least 1"));
    }
    if cli.size > u64::from(u32::MAX) {
        return Err(HttpError::BadArg(
            "size must be below 4 GiB (32-bit offsets)",
        ));
    }
    let path = cli
        .path
        .clone()
        .unwrap_or_else(|| gen_path(cli.seed, cli.size));
    let get = cli.method == Method::Get;
    let expected = match parse_gen(&path) {
        Some((seed, len)) if get => {
            if len != cli.size {
                return Err(HttpError::BadArg(
                    "size must match the /gen/ object's length",
                ));
            }
            Some(Arc::new(generate(seed, len)))
        }
        _ => None,
    };
    let upload = if get {
        Arc::default()
    } else {
        Arc::new(generate(cli.seed, cli.size))
    };
    let upload_digest = hex(&Sha256::digest(upload.as_slice()));
    let mut drv = open(link)?;
    let mut cfg = drv.tcp_config();
    cfg.rdma_option = link.rdma_option.on();
    let id = drv.connect(cli.server, cfg).map_err(ToolError::from)?;
    let local = drv
        .connection(id)
        .map(|c| {
            let t = c.four_tuple();
            format!("{}:{}", t.local_addr, t.local_port)
        })
        .unwrap_or_default();
    if !link.quiet {
        eprintln!(
            "http-client: {local} -> {} ({}), {} {path} x {}",
            cli.server,
            describe(&drv),
            cli.method.as_str(),
            cli.count
        );
    }
    let mut app = ClientApp {
        id,
        method: cli.method,
        path: path.clone(),
        host: cli.server.to_string(),
        size: cli.size,
        count: cli.count,
        depth: cli.depth,
        expected: expected.clone(),
        upload,
        upload_digest: upload_digest.clone(),
        first: None,
        incoming: Incoming::new(true, client_max_body(cli.method, cli.size)),
        out: VecDeque::new(),
        pool: Pool::default(),
        scratch: vec![0u8; 64 * 1024],
        sent: 0,
        done: 0,
        body_octets: 0,
        body_octets_placed: 0,
        connected: None,
        finished: None,
        cpu: (None, None),
        close_sent: false,
        peer_closed: false,
        closed: false,
        moved: 0,
        failure: None,
        rdma: RdmaCounters::default(),
    };
    let started = Instant::now();
    let mut progress = Progress::new(link.quiet, "http-client");
    let mut watchdog = Watchdog::new(idle);
    loop {
        drv.turn(&mut app).map_err(ToolError::from)?;
        if let Some(e) = app.failure.take() {
            // Let the abort (RST) leave before the program detaches.
            let _ = drv.poll(&mut app);
            return Err(e);
        }
        if app.closed {
            break;
        }
        match app.finished {
            Some(t) => {
                if app.peer_closed || t.elapsed() > CLOSE_GRACE {
                    break;
                }
            }
            None if app.connected.is_none() => {
                if started.elapsed() > timeout {
                    return Err(ToolError::ConnectTimeout(cli.server, timeout).into());
                }
            }
            None => {
                watchdog.check(app.moved)?;
                progress.tick(app.body_octets, Some(cli.size * cli.count));
            }
        }
    }
    drv.poll(&mut app).map_err(ToolError::from)?;
    if !app.closed {
        if let Some(c) = drv.connection(id) {
            app.rdma.add(c);
        }
    }
    let (Some(t0), Some(t1)) = (app.connected, app.finished) else {
        return Err(HttpError::Closed {
            done: app.done,
            count: cli.count,
        });
    };
    let elapsed = t1.duration_since(t0);
    let cpu = match app.cpu {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => Duration::ZERO,
    };
    let sha256 = match (&app.first, &expected) {
        _ if !get => upload_digest,
        (Some(f), _) => hex(&Sha256::digest(f)),
        (None, Some(e)) => hex(&Sha256::digest(e.as_slice())),
        (None, None) => String::new(),
    };
    Ok(ClientReport {
        tool: "http-client",
        method: cli.method.as_str(),
        path,
        server: cli.server.to_string(),
        local,
        requests: app.done,
        body_octets: app.body_octets,
        body_octets_placed: app.body_octets_placed,
        head_octets: app.incoming.head_octets,
        seconds: elapsed.as_secs_f64(),
        gbit_s: gbit(app.body_octets, elapsed),
        cpu_seconds: cpu.as_secs_f64(),
        cpu_ns_per_octet: if app.body_octets > 0 {
            cpu.as_nanos() as f64 / app.body_octets as f64
        } else {
            0.0
        },
        verified: match (get, expected.is_some()) {
            (false, _) => "sha256",
            (true, true) => "generator",
            (true, false) => "first",
        },
        sha256,
        rdma: app.rdma.clone(),
        xdp: XdpFacts::of(&drv),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datapath::xdp_tcp::engine::{Config, FourTuple, IsnGenerator, SegmentRepr, State};

    /// A client that asks for large objects and reads nothing makes the server hold one of
    /// them, not 16; many such clients hold the budget together, then nobody's next request
    /// is read until responses drain (helper-90: 16 GiB per connection before).
    #[test]
    fn queued_responses_are_bounded_in_octets() {
        const GIB: u64 = 1 << 30;
        let budget = 2 * GIB;
        // Small responses: up to the count.
        assert!(may_read_request(0, 0, 0, GIB, budget));
        assert!(may_read_request(15, 15 * 100, 15 * 100, GIB, budget));
        assert!(!may_read_request(16, 16 * 100, 16 * 100, GIB, budget));
        // One object of the largest size queued: no more requests from that connection.
        assert!(may_read_request(1, GIB - 1, GIB - 1, GIB, budget));
        assert!(!may_read_request(1, GIB, GIB, GIB, budget));
        // Others' queued bodies at the budget: nobody's next request.
        assert!(!may_read_request(0, 0, budget, GIB, budget));
        assert!(may_read_request(0, 0, budget - 1, GIB, budget));
    }

    /// A FIFO or a link to a device in the served directory is refused at once: neither
    /// waits for a writer nor reads without end (the server's one thread would hang, or
    /// grow a buffer until memory runs out). Regular files are served up to `max_object`.
    #[test]
    fn only_regular_files_are_served() {
        let dir = std::env::temp_dir().join(format!("iwarp-http-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().expect("UTF-8 path")).expect("no NUL");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        std::os::unix::fs::symlink("/dev/zero", dir.join("zero")).expect("link to /dev/zero");
        std::fs::write(dir.join("small"), b"hello").expect("write");
        std::fs::write(dir.join("large"), vec![7u8; 101]).expect("write");
        // In a thread: a server that waits for the FIFO's writer would stop the test here.
        let get = |name: &'static str| {
            let (tx, rx) = std::sync::mpsc::channel();
            let d = dir.clone();
            std::thread::spawn(move || {
                let _ = tx.send(served_file(Some(&d), &format!("/{name}"), 100).map(|b| b.len()));
            });
            rx.recv_timeout(Duration::from_secs(10))
        };
        let answer = get("fifo");
        if answer.is_err() {
            // Let a reader stuck in its open go (it takes this writer, then end of file).
            // Not blocking: with no reader (the answer was only slow) the open fails at once
            // (ENXIO) instead of waiting for one forever.
            use std::os::unix::fs::OpenOptionsExt;
            drop(
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&fifo),
            );
        }
        let refused = ("403 Forbidden", "not a regular file\n");
        assert_eq!(
            answer,
            Ok(Err(refused)),
            "a FIFO: still waiting after 10 s?"
        );
        assert_eq!(get("zero"), Ok(Err(refused)), "a link to /dev/zero");
        assert_eq!(get("small"), Ok(Ok(5)));
        assert_eq!(
            get("large"),
            Ok(Err(("413 Content Too Large", "file too large\n")))
        );
        assert_eq!(get("none"), Ok(Err(("404 Not Found", "not found\n"))));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A client and a server connection wired back to back in memory.
    struct Pair {
        client: Connection,
        server: Connection,
        now: TcpInstant,
    }

    impl Pair {
        fn new() -> Pair {
            let cfg = Config {
                rdma_option: true,
                ..Config::default()
            };
            let tuple = FourTuple {
                local_addr: [10, 0, 0, 1].into(),
                local_port: 40_000,
                remote_addr: [10, 0, 0, 2].into(),
                remote_port: 80,
            };
            let now = TcpInstant::ZERO;
            let mut client =
                Connection::connect(cfg.clone(), tuple, &IsnGenerator::new([1; 16]), now);
            let mut buf = vec![0u8; 2048];
            let n = client.poll_transmit(now, &mut buf).expect("SYN");
            let syn = SegmentRepr::parse(&buf[..n]).expect("parse the SYN");
            let server =
                Connection::accept(cfg, &syn, &IsnGenerator::new([2; 16]), now).expect("accept");
            let mut pair = Pair {
                client,
                server,
                now,
            };
            pair.pump(false);
            assert_eq!(pair.client.state(), State::Established);
            assert!(pair.client.rdma_option_enabled());
            pair
        }

        /// Moves segments both ways until neither side has any; `reverse`: each burst arrives
        /// last segment first (out of order).
        fn pump(&mut self, reverse: bool) {
            for _ in 0..10_000 {
                self.now += Duration::from_micros(10);
                let now = self.now;
                let mut moved = false;
                for dir in 0..2 {
                    let (from, to) = if dir == 0 {
                        (&mut self.client, &mut self.server)
                    } else {
                        (&mut self.server, &mut self.client)
                    };
                    let mut burst = Vec::new();
                    let mut buf = vec![0u8; 2048];
                    while let Some(n) = from.poll_transmit(now, &mut buf) {
                        burst.push(buf[..n].to_vec());
                    }
                    if reverse {
                        burst.reverse();
                    }
                    for pkt in &burst {
                        let seg = SegmentRepr::parse(pkt).expect("parse");
                        to.handle_segment(now, &seg, |_| {});
                    }
                    moved |= !burst.is_empty();
                }
                if !moved {
                    return;
                }
            }
            panic!("the pair never went quiet");
        }
    }

    /// Queues a GET response: the head in pieces of `piece` octets (pumped apart), the body
    /// as transfer `rid`.
    fn respond(pair: &mut Pair, body: &[u8], rid_of_body: u64, piece: usize) {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        for part in head.as_bytes().chunks(piece) {
            assert_eq!(pair.server.send(part), Ok(part.len()));
            pair.pump(false);
        }
        let mut at = 0;
        while at < body.len() {
            let send = RdmaSend {
                rid: rid(rid_of_body),
                buffer_offset: at as u32,
                total_length: Some(body.len() as u32),
                unsolicited: false,
            };
            at += pair
                .server
                .send_rdma(&body[at..], send)
                .expect("queue the body");
            pair.pump(true);
        }
    }

    fn read_all(pair: &mut Pair, incoming: &mut Incoming, pool: &mut Pool) -> Vec<Message> {
        let mut scratch = vec![0u8; 4096];
        let mut out = Vec::new();
        while let Some(m) = incoming
            .read(&mut pair.client, &mut scratch, pool, u64::MAX)
            .expect("read")
        {
            out.push(m);
        }
        out
    }

    #[test]
    fn pipelined_responses_are_placed_split_and_streamed_as_they_came() {
        let mut pair = Pair::new();
        let mut incoming = Incoming::new(true, 1 << 20);
        let mut pool = Pool::default();
        let bodies = [generate(1, 0), generate(2, 5_000), generate(3, 70_000)];
        // Buffers for responses 0 and 1; response 2's is 1000 octets short, so the tail of
        // its body is refused (past the buffer) and comes through the stream.
        for (i, len) in [(0, 16), (1, 5_000), (2, 69_000)] {
            pair.client
                .post_rdma_buffer(rid(i), vec![0; len], false)
                .expect("post");
            incoming.posted.insert(i);
        }
        for (i, b) in bodies.iter().enumerate() {
            // Heads cut into 7-octet pieces: a head arrives across several reads.
            respond(&mut pair, b, i as u64, 7);
        }
        let got = read_all(&mut pair, &mut incoming, &mut pool);
        assert_eq!(got.len(), 3);
        for (i, m) in got.iter().enumerate() {
            assert_eq!(m.index, i as u64);
            assert_eq!(m.head.status(), Some(200));
            assert_eq!(m.body, bodies[i], "body {i}");
        }
        assert_eq!(got[1].placed, 5_000);
        assert!(
            got[2].placed > 0 && got[2].placed <= 69_000,
            "{}",
            got[2].placed
        );
        let st = pair.client.stats();
        assert!(st.rdma_placed_out_of_order > 0, "bursts arrived reversed");
        assert_eq!(
            st.delivered_in_order,
            incoming.head_octets + 70_000 - got[2].placed,
            "the stream carried the heads and the refused tail"
        );
        assert!(incoming.posted.is_empty(), "every buffer was taken back");
    }

    #[test]
    fn a_body_placed_for_another_request_is_refused() {
        let mut pair = Pair::new();
        let mut incoming = Incoming::new(true, 1 << 20);
        let mut pool = Pool::default();
        for i in 0..2 {
            pair.client
                .post_rdma_buffer(rid(i), vec![0; 3_000], false)
                .expect("post");
            incoming.posted.insert(i);
        }
        // Response 0's body annotated as request 1's.
        respond(&mut pair, &generate(4, 3_000), 1, 64);
        let mut scratch = vec![0u8; 4096];
        match incoming.read(&mut pair.client, &mut scratch, &mut pool, u64::MAX) {
            Err(HttpError::Misplaced {
                index: 0, rid: 1, ..
            }) => {}
            other => panic!("expected Misplaced, got {other:?}"),
        }
    }

    /// The client believes a server's `Content-Length` only up to what it asked for (helper-191
    /// finding 5: a 4 GiB body was read whole whatever `--size` said), and takes a few interim
    /// responses per request, not an endless stream of them.
    #[test]
    fn the_client_bounds_what_a_server_sends() {
        assert_eq!(client_max_body(Method::Get, 1 << 20), 1 << 20);
        assert_eq!(client_max_body(Method::Get, 100), SMALL_BODY_MAX);
        assert_eq!(client_max_body(Method::Put, 1 << 30), SMALL_BODY_MAX);
        let mut scratch = vec![0u8; 4096];
        let mut pool = Pool::default();

        let mut pair = Pair::new();
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 4294967296\r\n\r\n";
        assert_eq!(pair.server.send(head), Ok(head.len()));
        pair.pump(false);
        let mut incoming = Incoming::new(true, client_max_body(Method::Get, 1 << 20));
        let r = incoming.read(&mut pair.client, &mut scratch, &mut pool, u64::MAX);
        assert!(
            matches!(
                r,
                Err(HttpError::BodyTooLarge {
                    len: 4294967296,
                    max: 1048576
                })
            ),
            "{r:?}"
        );

        for (interim, ok) in [(MAX_INTERIM, true), (MAX_INTERIM + 1, false)] {
            let mut pair = Pair::new();
            for _ in 0..interim {
                let head = b"HTTP/1.1 100 Continue\r\n\r\n";
                assert_eq!(pair.server.send(head), Ok(head.len()));
            }
            let head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi";
            assert_eq!(pair.server.send(head), Ok(head.len()));
            pair.pump(false);
            let mut incoming = Incoming::new(true, SMALL_BODY_MAX);
            let r = incoming.read(&mut pair.client, &mut scratch, &mut pool, u64::MAX);
            match r {
                Ok(Some(m)) if ok => assert_eq!(m.body, b"hi"),
                Err(HttpError::TooManyInterim) if !ok => {}
                other => panic!("{interim} interim responses: {other:?}"),
            }
        }
    }

    /// A request whose body does not fit the room given waits, its head unread, and is read
    /// whole once there is room; one larger than any body may be is refused at once.
    #[test]
    fn a_body_waits_for_room_in_the_budget() {
        let mut pair = Pair::new();
        let put = b"PUT /x HTTP/1.1\r\nContent-Length: 1000\r\n\r\n";
        assert_eq!(pair.client.send(put), Ok(put.len()));
        assert_eq!(pair.client.send(&[7; 1000]), Ok(1000));
        pair.pump(false);
        let mut incoming = Incoming::new(false, 4096);
        let (mut pool, mut scratch) = (Pool::default(), vec![0u8; 4096]);
        let mut read = |incoming: &mut Incoming, room| {
            incoming
                .read(&mut pair.server, &mut scratch, &mut pool, room)
                .expect("read")
        };
        assert!(read(&mut incoming, 999).is_none());
        assert!(incoming.body_waits());
        assert_eq!(incoming.body_reserved(), 0);
        assert!(read(&mut incoming, 999).is_none(), "still no room");
        assert_eq!(incoming.bodies_waited, 1, "one head waited");
        let m = read(&mut incoming, 1000).expect("room for it");
        assert!(!incoming.body_waits());
        assert_eq!(m.body, vec![7; 1000]);
        assert_eq!(incoming.head_octets, put.len() as u64);

        let mut pair = Pair::new();
        let put = b"PUT /x HTTP/1.1\r\nContent-Length: 5000\r\n\r\n";
        assert_eq!(pair.client.send(put), Ok(put.len()));
        pair.pump(false);
        let mut incoming = Incoming::new(false, 4096);
        let r = incoming.read(&mut pair.server, &mut scratch, &mut pool, 0);
        assert!(
            matches!(
                r,
                Err(HttpError::BodyTooLarge {
                    len: 5000,
                    max: 4096
                })
            ),
            "larger than --max-object: {r:?}"
        );
    }

    /// The stream octets of a body with a posted buffer are kept in one part while they are
    /// contiguous, and in at most one part per [`MIN_PART`] octets when placed ranges cut
    /// them: a peer alternating single placed and streamed octets is refused.
    #[test]
    fn stream_parts_of_a_posted_body_are_bounded() {
        let body = |len| BodyRead {
            head: Head::parse(b"PUT /x HTTP/1.1\r\nContent-Length: 1").expect("head"),
            len,
            pos: 0,
            posted: true,
            buf: Vec::new(),
            parts: Vec::new(),
            placed: 0,
        };
        let mut b = body(4096);
        for _ in 0..4096 {
            Incoming::stream(&mut b, &[1]).expect("contiguous");
        }
        assert_eq!(b.parts.len(), 1);
        assert_eq!(b.parts[0], (0, vec![1; 4096]));
        let mut b = body(4096);
        let mut refused = None;
        for k in 0..2048 {
            if let Err(e) = Incoming::stream(&mut b, &[1]) {
                refused = Some((k, e));
                break;
            }
            // A placed octet between each two streamed.
            b.pos += 1;
        }
        let Some((k, HttpError::Unsupported(_))) = refused else {
            panic!("never refused: {} parts", b.parts.len());
        };
        assert_eq!(k as u64, 4096 / MIN_PART + MIN_PARTS);
    }

    #[test]
    fn heads_parse_as_http_1_0_and_1_1_say() {
        let h = Head::parse(b"GET /gen/1/10 HTTP/1.1\r\nHost: x\r\n").expect("request");
        assert!(h.keep_alive);
        assert_eq!(h.content_length, None);
        let h = Head::parse(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\nServer: py").expect("reply");
        assert!(!h.keep_alive);
        assert_eq!((h.status(), h.content_length), (Some(200), Some(5)));
        let h = Head::parse(b"HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 0")
            .expect("close");
        assert!(!h.keep_alive);
        for bad in [
            &b"GET / HTTP/2\r\n"[..],
            b"GET /\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x",
            b"HTTP/1.1 200 OK\r\nContent-Length: +5",
            b"HTTP/1.1 200 OK\r\nContent-Length : 5",
            b"HTTP/1.1 200 OK\r\nX: a\r\n folded",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2",
            b"HTTP/1.1 200 OK\r\nno colon",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked",
            b"\xff\xfe",
        ] {
            assert!(
                Head::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn gen_paths_round_trip() {
        assert_eq!(parse_gen(&gen_path(7, 1 << 20)), Some((7, 1 << 20)));
        assert_eq!(parse_gen("/gen/7"), None);
        assert_eq!(parse_gen("/gen/x/1"), None);
        assert_eq!(parse_gen("/other/1/2"), None);
        assert_eq!(generate(3, 64), generate(3, 64));
        assert_ne!(generate(3, 64), generate(4, 64));
    }

    #[test]
    fn rids_are_the_request_index() {
        assert_eq!(rid(0).get(), 0);
        assert_eq!(rid(41).get(), 41);
        assert_eq!(rid(u64::from(u32::MAX)).get(), u64::from(u32::MAX));
    }
}
