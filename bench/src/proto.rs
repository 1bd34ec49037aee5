//! What client and server tell each other in MPA private data, and how they size buffers.
//!
//! Hello (client -> server, in the MPA Request) and Welcome (server -> client, in the Reply) are
//! fixed-layout big-endian records that fit in the 508 octets RFC 6581 leaves to the ULP.

use clap::ValueEnum;

/// Largest message size a run may use (16 MiB).
pub const MAX_SIZE: u64 = 16 << 20;
/// Cap on the data buffer each side registers.
pub const MAX_BUFFER: u64 = 64 << 20;
/// Seed of the client's data pattern.
pub const CLIENT_SEED: u64 = 0x00C1_1E47;
/// Seed of the server's data pattern.
pub const SERVER_SEED: u64 = 0x05E7_77E7;
/// Bytes of one control message (phase acknowledgement or credit).
pub const CTRL_LEN: usize = 16;
/// Control receive buffers each side keeps posted.
pub const CTRL_SLOTS: usize = 64;

/// The client's hello; its version changes with anything two iwarp-bench builds must agree
/// on (IWB6: `-b`'s Report may carry milliseconds; IWB7: bandwidth and ping-pong messages
/// carry their index, write-bw's phase ends with [`Ctrl::Done`]; IWB8: the hello carries
/// `-r` and `-f`, `-b`'s Report is followed by [`Ctrl::Peak`]), so that mismatched builds
/// refuse each other at once (see [`is_other_version`]).
const HELLO_MAGIC: &[u8; 4] = b"IWB8";

/// Whether `private_data` is the hello of an iwarp-bench of another version.
pub fn is_other_version(private_data: &[u8]) -> bool {
    private_data.starts_with(b"IWB") && !private_data.starts_with(HELLO_MAGIC)
}
const WELCOME_MAGIC: &[u8; 4] = b"IWB2";

/// The client's description of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Hello {
    pub test: TestKind,
    /// `--write-with-imm` / `--send-with-imm`: each Write or Send is followed by RFC 7306
    /// Immediate Data (the RDMAP extensions on at both ends).
    pub imm: bool,
    pub tx_depth: u32,
    /// Message slots the bandwidth tests cycle through (`--slots`); 0: `tx_depth`.
    pub slots: u32,
    pub iters: u64,
    pub duration_ms: u64,
    pub sizes: Vec<u64>,
    /// `-q`: connections (queue pairs) the client opens for the run, each with this hello;
    /// the server accepts that many and serves them at once.
    pub qps: u16,
    /// `-b`: the client opens a second connection, marked `reverse`, on which the roles are
    /// swapped (the server sends, the client checks), both directions at once.
    pub bidirectional: bool,
    /// This connection is `-b`'s reverse one.
    pub reverse: bool,
    /// send-bw's `-r`: the receives the server keeps posted, the client's credit window
    /// ([`Hello::send_credits`]); 0: the default.
    pub rx_depth: u32,
    /// `-f`: with `-D`, the whole seconds left out of the measurement at each end (`None`: a
    /// quarter of `-D`'s, [`crate::stats::SampleWindow`]).
    pub margin: Option<u32>,
}

/// Most receives `-r` may ask for, as perftest's (`MAX_RX`).
pub const MAX_RX_DEPTH: u32 = 16384;
/// Most data receives a send-bw server keeps posted for the client's credit ([`Hello::send_credits`]):
/// its receive queue's depth (`ConnectParams::default().rq_depth`, 4096) less the one for
/// the phase-done Send.
pub const MAX_POSTED_RECEIVES: u32 = 4095;

/// Most queue pairs (`-q`) one run may use.
pub const MAX_QPS: u16 = 64;
/// Most memory the data buffers of one run's queue pairs may take at each end.
pub const MAX_SESSION_MEMORY: u64 = 1 << 30;
/// The longest `-D` a hello may ask for: the command line's limit, an hour.
pub const MAX_DURATION_MS: u64 = 3_600_000;

/// A registered buffer as the peer needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuf {
    pub stag: u32,
    pub to: u64,
    pub len: u64,
}

impl Hello {
    /// Encodes the hello plus the client's buffer.
    pub fn encode(&self, buf: RemoteBuf) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(HELLO_MAGIC);
        v.push(self.test.code());
        v.push(u8::from(self.imm));
        v.extend_from_slice(&self.tx_depth.to_be_bytes());
        v.extend_from_slice(&self.slots.to_be_bytes());
        v.extend_from_slice(&self.iters.to_be_bytes());
        v.extend_from_slice(&self.duration_ms.to_be_bytes());
        encode_buf(&mut v, buf);
        v.push(self.sizes.len() as u8);
        for s in &self.sizes {
            v.extend_from_slice(&s.to_be_bytes());
        }
        v.extend_from_slice(&self.qps.to_be_bytes());
        v.push(u8::from(self.bidirectional) | u8::from(self.reverse) << 1);
        v.extend_from_slice(&self.rx_depth.to_be_bytes());
        v.extend_from_slice(&self.margin.unwrap_or(u32::MAX).to_be_bytes());
        v
    }

    /// Decodes a hello; `None` for anything malformed.
    pub fn decode(b: &[u8]) -> Option<(Hello, RemoteBuf)> {
        let mut r = Reader(b);
        if r.take(4)? != HELLO_MAGIC {
            return None;
        }
        let test = TestKind::from_code(r.u8()?)?;
        let imm = match r.u8()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let tx_depth = r.u32()?;
        let slots = r.u32()?;
        let iters = r.u64()?;
        let duration_ms = r.u64()?;
        let buf = decode_buf(&mut r)?;
        let n = r.u8()?;
        let sizes = (0..n).map(|_| r.u64()).collect::<Option<Vec<_>>>()?;
        let qps = u16::from_be_bytes(r.take(2)?.try_into().ok()?);
        let flags = r.u8()?;
        let (bidirectional, reverse) = (flags & 1 != 0, flags & 2 != 0);
        let rx_depth = r.u32()?;
        let margin = Some(r.u32()?).filter(|&m| m != u32::MAX);
        let ok = !sizes.is_empty()
            && (1..=MAX_QPS).contains(&qps)
            && flags <= 3
            && (!reverse || bidirectional)
            // -b: write-bw, one queue pair each way.
            && (!bidirectional || (test == TestKind::WriteBw && qps == 1))
            && sizes.iter().all(|&s| (1..=MAX_SIZE).contains(&s))
            && (1..=1024).contains(&tx_depth)
            && slots <= 1024
            && (iters > 0 || duration_ms > 0)
            // -r: send-bw's, as the command line allows it.
            && (rx_depth == 0 || (test == TestKind::SendBw && rx_depth <= MAX_RX_DEPTH))
            // -f: with -D only, leaving a window between the margins.
            && margin.is_none_or(|m| {
                duration_ms != u64::MAX && u64::from(m) * 2000 < duration_ms
            })
            // As the command line allows (`--duration` at most an hour; `--run_infinitely`
            // asks for u64::MAX: until the client is interrupted).
            && (duration_ms <= MAX_DURATION_MS || duration_ms == u64::MAX)
            // The client's buffer as it names it: at least what the run uses, its addresses
            // not past the end of the 64-bit space.
            && buf.to.checked_add(buf.len).is_some();
        let hello = Hello {
            test,
            imm,
            tx_depth,
            slots,
            iters,
            duration_ms,
            sizes,
            qps,
            bidirectional,
            reverse,
            rx_depth,
            margin,
        };
        // What one hello makes the server register: a buffer per queue pair.
        let memory = hello.buffer_len().saturating_mul(u64::from(qps));
        (ok && memory <= MAX_SESSION_MEMORY && buf.len >= hello.buffer_len())
            .then_some((hello, buf))
    }

    /// Length both sides register for the data buffer: room for `tx_depth` messages of the
    /// largest size (at least two, for the ping and pong slots; with send-bw's `-r`, room for
    /// that many receives if more, at most [`MAX_POSTED_RECEIVES`]), capped at [`MAX_BUFFER`].
    pub fn buffer_len(&self) -> u64 {
        let max = self.sizes.iter().copied().max().unwrap_or(1);
        let messages = self
            .tx_depth
            .max(self.rx_depth.min(MAX_POSTED_RECEIVES))
            .max(2);
        (max * u64::from(messages)).clamp(2 * max, MAX_BUFFER.max(2 * max))
    }

    /// Receive slots of the largest size in the buffer (send tests post receives this big, so
    /// buffers posted during one size serve the next).
    pub fn recv_slots(&self) -> u64 {
        let max = self.sizes.iter().copied().max().unwrap_or(1);
        (self.buffer_len() / max).max(1)
    }

    /// Receive buffers a send-bw server advertises as the client's initial credit (iWARP has
    /// no receiver-not-ready retry, so a Send must never find the receive queue empty).
    pub fn send_credits(&self) -> u64 {
        match self.rx_depth {
            // perftest's default receive depth of the send tests (`DEF_RX_SEND`).
            0 => self.recv_slots().min(512),
            r => self.recv_slots().min(u64::from(r.min(MAX_POSTED_RECEIVES))),
        }
    }

    /// How many message slots of `size` the bandwidth tests cycle through: as many as fit in
    /// the buffer, never more than `tx_depth`, nor than `--slots` when given.
    pub fn slots(&self, size: u64) -> u64 {
        let fit = (self.buffer_len() / size).clamp(1, u64::from(self.tx_depth.max(2)));
        match self.slots {
            0 => fit,
            n => fit.min(u64::from(n)),
        }
    }
}

/// Encodes the server's welcome (its buffer).
pub fn encode_welcome(buf: RemoteBuf) -> Vec<u8> {
    let mut v = WELCOME_MAGIC.to_vec();
    encode_buf(&mut v, buf);
    v
}

/// Decodes the server's welcome.
pub fn decode_welcome(b: &[u8]) -> Option<RemoteBuf> {
    let mut r = Reader(b);
    if r.take(4)? != WELCOME_MAGIC {
        return None;
    }
    // Its addresses not past the end of the 64-bit space (the client checks the length
    // against the run's).
    decode_buf(&mut r).filter(|b| b.to.checked_add(b.len).is_some())
}

fn encode_buf(v: &mut Vec<u8>, b: RemoteBuf) {
    v.extend_from_slice(&b.stag.to_be_bytes());
    v.extend_from_slice(&b.to.to_be_bytes());
    v.extend_from_slice(&b.len.to_be_bytes());
}

fn decode_buf(r: &mut Reader<'_>) -> Option<RemoteBuf> {
    Some(RemoteBuf {
        stag: r.u32()?,
        to: r.u64()?,
        len: r.u64()?,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
    }
}

/// Control messages (Sends into the peer's control buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ctrl {
    /// Server -> client: the phase's data was checked (`ok`), the next phase may start.
    PhaseAck { ok: bool, checked_bytes: u64 },
    /// Server -> client: `n` more receive buffers are posted (send-bw flow control).
    Credit { n: u32 },
    /// Client -> server: an atomic test's phase is over after `ops` operations (each added 1
    /// to the server's counter, or swapped it for the next value), or write-bw's after `ops`
    /// Writes (which say what each slot must hold last).
    Done { ops: u64 },
    /// `-b`'s reverse connection, checking side -> sending side: receives posted, go.
    Ready,
    /// `-b`'s reverse connection, sending side -> checking side, after each phase: what the
    /// sender measured (`iterations` in `micros` microseconds), for the client's sum. On the
    /// wire in microseconds, or in milliseconds (flag 1) for phases longer than 32 bits of
    /// microseconds hold (71 minutes).
    Report { iterations: u64, micros: u64 },
    /// `-b`'s reverse connection, sending side -> checking side, after each [`Ctrl::Report`]:
    /// the sender's peak as the shortest time per message, in picoseconds
    /// ([`crate::stats::PeakTimes::fastest`]); 0: none measured.
    Peak { picos: u64 },
}

impl Ctrl {
    pub fn encode(self) -> [u8; CTRL_LEN] {
        let mut b = [0u8; CTRL_LEN];
        match self {
            Ctrl::PhaseAck { ok, checked_bytes } => {
                b[0] = 1;
                b[1] = u8::from(ok);
                b[8..16].copy_from_slice(&checked_bytes.to_be_bytes());
            }
            Ctrl::Credit { n } => {
                b[0] = 2;
                b[4..8].copy_from_slice(&n.to_be_bytes());
            }
            Ctrl::Done { ops } => {
                b[0] = 3;
                b[8..16].copy_from_slice(&ops.to_be_bytes());
            }
            Ctrl::Ready => b[0] = 4,
            Ctrl::Report { iterations, micros } => {
                b[0] = 5;
                let time = match u32::try_from(micros) {
                    Ok(us) => us,
                    Err(_) => {
                        b[1] = 1;
                        u32::try_from(micros / 1000).unwrap_or(u32::MAX)
                    }
                };
                b[4..8].copy_from_slice(&time.to_be_bytes());
                b[8..16].copy_from_slice(&iterations.to_be_bytes());
            }
            Ctrl::Peak { picos } => {
                b[0] = 6;
                b[8..16].copy_from_slice(&picos.to_be_bytes());
            }
        }
        b
    }
    pub fn decode(b: &[u8]) -> Option<Ctrl> {
        let mut r = Reader(b);
        let kind = r.u8()?;
        let flag = r.u8()?;
        r.take(2)?;
        let n = r.u32()?;
        let v = r.u64()?;
        match kind {
            1 => Some(Ctrl::PhaseAck {
                ok: flag == 1,
                checked_bytes: v,
            }),
            2 => Some(Ctrl::Credit { n }),
            3 => Some(Ctrl::Done { ops: v }),
            4 => Some(Ctrl::Ready),
            5 => Some(Ctrl::Report {
                iterations: v,
                micros: u64::from(n) * if flag == 1 { 1000 } else { 1 },
            }),
            6 => Some(Ctrl::Peak { picos: v }),
            _ => None,
        }
    }
}

/// Which test.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestKind {
    WriteBw,
    WriteLat,
    ReadBw,
    ReadLat,
    SendBw,
    SendLat,
    /// RFC 7306 Atomic Operations streamed (perftest's `ib_atomic_bw`).
    AtomicBw,
    /// RFC 7306 Atomic Operations one at a time (perftest's `ib_atomic_lat`).
    AtomicLat,
}

impl TestKind {
    /// Bandwidth (streaming) rather than latency (ping-pong) test.
    pub fn is_bw(self) -> bool {
        matches!(
            self,
            Self::WriteBw | Self::ReadBw | Self::SendBw | Self::AtomicBw
        )
    }
    /// An RFC 7306 Atomic Operations test: 8-octet operations on the server's counter, with
    /// the RDMAP extensions on at both ends.
    pub fn is_atomic(self) -> bool {
        matches!(self, Self::AtomicBw | Self::AtomicLat)
    }
    /// Wire code in the hello message.
    pub fn code(self) -> u8 {
        self as u8
    }
    /// Inverse of [`code`](Self::code).
    pub fn from_code(c: u8) -> Option<Self> {
        [
            Self::WriteBw,
            Self::WriteLat,
            Self::ReadBw,
            Self::ReadLat,
            Self::SendBw,
            Self::SendLat,
            Self::AtomicBw,
            Self::AtomicLat,
        ]
        .get(usize::from(c))
        .copied()
    }
    /// Name as typed on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::WriteBw => "write-bw",
            Self::WriteLat => "write-lat",
            Self::ReadBw => "read-bw",
            Self::ReadLat => "read-lat",
            Self::SendBw => "send-bw",
            Self::SendLat => "send-lat",
            Self::AtomicBw => "atomic-bw",
            Self::AtomicLat => "atomic-lat",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_rejects_garbage() {
        let h = Hello {
            test: TestKind::SendBw,
            imm: true,
            tx_depth: 128,
            slots: 2,
            iters: 10,
            duration_ms: 0,
            sizes: vec![2, 4, 8],
            qps: 4,
            bidirectional: true,
            reverse: true,
            rx_depth: 0,
            margin: None,
        };
        let b = RemoteBuf {
            stag: 0x1234,
            to: 0xdead_beef,
            len: 4096,
        };
        // -b: write-bw with one queue pair only; -q alone is fine.
        assert_eq!(
            Hello::decode(&h.encode(b)),
            None,
            "-b with send-bw and -q 4"
        );
        let q4 = Hello {
            bidirectional: false,
            reverse: false,
            ..h.clone()
        };
        assert_eq!(Hello::decode(&q4.encode(b)), Some((q4, b)));
        let h = Hello {
            test: TestKind::WriteBw,
            qps: 1,
            ..h
        };
        let enc = h.encode(b);
        assert!(enc.len() <= 508);
        assert_eq!(Hello::decode(&enc), Some((h.clone(), b)));
        // A run's buffers are bounded at each end.
        let huge = Hello {
            bidirectional: false,
            reverse: false,
            qps: MAX_QPS,
            sizes: vec![MAX_SIZE],
            ..h
        };
        assert_eq!(Hello::decode(&huge.encode(b)), None);
        assert_eq!(Hello::decode(&enc[..enc.len() - 1]), None);
        assert_eq!(Hello::decode(b"nope"), None);
        assert_eq!(decode_welcome(&encode_welcome(b)), Some(b));
        // What a peer announces is held to what our own command line allows: -D at most an
        // hour, a buffer at least the run's, whose addresses do not wrap.
        let timed = Hello {
            iters: 0,
            duration_ms: MAX_DURATION_MS,
            ..h.clone()
        };
        assert!(Hello::decode(&timed.encode(b)).is_some());
        let too_long = Hello {
            duration_ms: MAX_DURATION_MS + 1,
            ..timed
        };
        assert_eq!(Hello::decode(&too_long.encode(b)), None);
        let infinite = Hello {
            duration_ms: u64::MAX,
            ..too_long
        };
        assert!(
            Hello::decode(&infinite.encode(b)).is_some(),
            "--run_infinitely"
        );
        let small = RemoteBuf {
            len: h.buffer_len() - 1,
            ..b
        };
        assert_eq!(Hello::decode(&h.encode(small)), None);
        let wrapping = RemoteBuf {
            to: u64::MAX - 100,
            ..b
        };
        assert_eq!(Hello::decode(&h.encode(wrapping)), None);
        assert_eq!(decode_welcome(&encode_welcome(wrapping)), None);
        for c in [
            Ctrl::PhaseAck {
                ok: true,
                checked_bytes: 99,
            },
            Ctrl::Credit { n: 7 },
            Ctrl::Done { ops: 1 << 40 },
            Ctrl::Ready,
            Ctrl::Report {
                iterations: 5000,
                micros: 123_456,
            },
            Ctrl::Report {
                iterations: 1 << 40,
                micros: u64::from(u32::MAX),
            },
            Ctrl::Peak { picos: 0 },
            Ctrl::Peak {
                picos: 12_345_678_901,
            },
        ] {
            assert_eq!(Ctrl::decode(&c.encode()), Some(c));
        }
        // A phase longer than 32 bits of microseconds (71.6 minutes) goes in milliseconds.
        let long = Ctrl::Report {
            iterations: 7,
            micros: 3 * 3_600_000_000 + 123_456,
        };
        assert_eq!(
            Ctrl::decode(&long.encode()),
            Some(Ctrl::Report {
                iterations: 7,
                micros: 3 * 3_600_000_000 + 123_000,
            })
        );
    }

    #[test]
    fn all_sizes_fit_the_hello_and_the_buffer() {
        let mut h = Hello {
            test: TestKind::WriteBw,
            imm: false,
            tx_depth: 128,
            slots: 0,
            iters: 1,
            duration_ms: 0,
            sizes: (1..=23).map(|e| 1u64 << e).collect(),
            qps: 1,
            bidirectional: false,
            reverse: false,
            rx_depth: 0,
            margin: None,
        };
        assert!(
            h.encode(RemoteBuf {
                stag: 0,
                to: 0,
                len: 0
            })
            .len()
                <= 508
        );
        assert_eq!(h.buffer_len(), MAX_BUFFER);
        assert_eq!(h.slots(1 << 23), 8);
        assert_eq!(h.slots(2), 128);
        // `--slots 2`: two slots whatever fits, as perftest reuses its buffer.
        h.slots = 2;
        assert_eq!(h.slots(1 << 23), 2);
        assert_eq!(h.slots(2), 2);
        h.slots = 1000;
        assert_eq!(h.slots(1 << 23), 8);
    }

    /// IWB8's `-r` and `-f`: they round-trip, `-r` sets send-bw's credit window (the buffer
    /// grows to hold the receives), and what the command line refuses a hello may not say.
    #[test]
    fn rx_depth_and_margin_travel_in_the_hello() {
        let h = Hello {
            test: TestKind::SendBw,
            imm: false,
            tx_depth: 128,
            slots: 0,
            iters: 0,
            duration_ms: 5000,
            sizes: vec![4096],
            qps: 1,
            bidirectional: false,
            reverse: false,
            rx_depth: 300,
            margin: Some(2),
        };
        let b = RemoteBuf {
            stag: 1,
            to: 0,
            len: 1 << 30,
        };
        assert_eq!(Hello::decode(&h.encode(b)), Some((h.clone(), b)));
        assert_eq!((h.buffer_len(), h.send_credits()), (300 * 4096, 300));
        let default = Hello {
            rx_depth: 0,
            margin: None,
            ..h.clone()
        };
        assert_eq!(
            Hello::decode(&default.encode(b)),
            Some((default.clone(), b))
        );
        assert_eq!(
            (default.buffer_len(), default.send_credits()),
            (128 * 4096, 128)
        );
        let small = Hello {
            rx_depth: 16,
            ..default.clone()
        };
        assert_eq!(small.send_credits(), 16);
        // perftest's largest -r, of small messages: as many as the receive queue holds.
        let most = Hello {
            rx_depth: MAX_RX_DEPTH,
            sizes: vec![64],
            ..default.clone()
        };
        assert_eq!(most.send_credits(), u64::from(MAX_POSTED_RECEIVES));
        assert_eq!(
            MAX_POSTED_RECEIVES as usize + 1,
            datapath::ConnectParams::default().rq_depth
        );
        for bad in [
            // -r outside send-bw, or above perftest's MAX_RX.
            Hello {
                test: TestKind::WriteBw,
                ..h.clone()
            },
            Hello {
                rx_depth: MAX_RX_DEPTH + 1,
                ..h.clone()
            },
            // -f leaving no window, or without -D.
            Hello {
                margin: Some(3),
                ..h.clone()
            },
            Hello {
                margin: Some(0),
                iters: 10,
                duration_ms: 0,
                ..h.clone()
            },
        ] {
            assert_eq!(Hello::decode(&bad.encode(b)), None, "{bad:?}");
        }
        // An IWB7 hello is another version's.
        let mut old = h.encode(b);
        old[3] = b'7';
        assert!(is_other_version(&old) && Hello::decode(&old).is_none());
    }
}
