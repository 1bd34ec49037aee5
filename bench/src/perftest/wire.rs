//! What perftest 6.06 (Debian 12's `perftest` 4.5+0.17) puts on its out-of-band channel, and
//! where in its buffers its data operations land.
//!
//! With `-R` every exchange travels as one Send on a separate rdma_cm connection (the
//! "communication" queue pair; perftest_communication.c: `rdma_write_data`/`rdma_read_data`,
//! `rdma_write_keys`/`rdma_read_keys`). Each side keeps one receive of
//! `sizeof(struct pingpong_dest)` (56 octets) posted and reposts it after each message; the
//! client always sends first and the server answers, so a message never finds the receive
//! queue empty. Numbers are big-endian (perftest's HAVE_ENDIAN build).

/// Octets of `struct pingpong_dest` on x86-64 (4 padding octets before `vaddr`).
pub const DEST_LEN: usize = 56;
/// Octets of the version string exchange (`MAX_VERSION`).
pub const VERSION_LEN: usize = 16;
/// The perftest version whose exchange sequence this module implements.
pub const OUR_VERSION: &str = "6.06";
/// perftest refuses peers older than this (`check_version_compatibility`).
pub const MIN_PEER_VERSION: f64 = 5.70;
/// Our `cycle_buffer` (perftest: the page size).
pub const OUR_CYCLE_BUFFER: u32 = 4096;
/// Our `cache_line_size` (perftest: sysfs coherency_line_size, 64 on x86).
pub const OUR_CACHE_LINE: u32 = 64;
/// Our MTU in the `check_mtu` exchange: "5" (IBV_MTU_4096). perftest keeps the smaller of its
/// own and the peer's value, so 4096 never lowers the peer's; iWARP ignores it anyway.
pub const OUR_MTU: &[u8; 2] = b"5\0";

/// The octets of an MTU as perftest's exchange names it (an `ibv_mtu` code as ASCII digits:
/// `128 << code`); 0 for anything else.
pub fn mtu_octets(b: &[u8]) -> u32 {
    match b.first() {
        Some(&c @ b'1'..=b'5') => 128 << (c - b'0'),
        _ => 0,
    }
}

/// `struct pingpong_dest`: what each side tells the other about its queue pair and buffer.
/// With rdma_cm only `rkey` and `vaddr` matter; the rest is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    pub lid: u32,
    pub out_reads: u32,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub gid: [u8; 16],
    pub srqn: u32,
    pub gid_index: u32,
}

impl Dest {
    /// The 56 wire octets (`rdma_write_keys`: `htobe32`/`htobe64` per field, the GID raw).
    pub fn encode(&self) -> [u8; DEST_LEN] {
        let mut b = [0u8; DEST_LEN];
        b[0..4].copy_from_slice(&self.lid.to_be_bytes());
        b[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&self.gid_index.to_be_bytes());
        b
    }

    /// From the wire octets; `None` unless exactly [`DEST_LEN`] long.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != DEST_LEN {
            return None;
        }
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&b[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        Some(Self {
            lid: u32_at(0),
            out_reads: u32_at(4),
            qpn: u32_at(8),
            psn: u32_at(12),
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid,
            srqn: u32_at(48),
            gid_index: u32_at(52),
        })
    }
}

/// The 16-octet version field: the string, NUL-padded.
pub fn version_bytes(v: &str) -> [u8; VERSION_LEN] {
    let mut b = [0u8; VERSION_LEN];
    let n = v.len().min(VERSION_LEN - 1);
    b[..n].copy_from_slice(&v.as_bytes()[..n]);
    b
}

/// The peer's version string (up to the first NUL) and its value as perftest's `atof` reads it
/// (the leading decimal number; 0 when there is none).
pub fn parse_version(b: &[u8]) -> (String, f64) {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let s = String::from_utf8_lossy(&b[..end]).into_owned();
    let mut dot = false;
    let num: String = s
        .trim_start()
        .chars()
        .take_while(|&c| {
            let first_dot = c == '.' && !dot;
            dot |= c == '.';
            c.is_ascii_digit() || first_dot
        })
        .collect();
    let v = num.parse::<f64>().unwrap_or(0.0);
    (s, v)
}

/// A big-endian 32-bit value (`hton_int`), as `check_sys_data` sends it.
pub fn be32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// Reads a big-endian 32-bit value; `None` unless 4 octets.
pub fn read_be32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.try_into().ok()?))
}

/// `struct bw_report_data` as `xchg_bw_reports` sends it: five 8-octet messages (size, iters,
/// peak, average, message rate), integers and IEEE doubles big-endian. Bandwidth is in MB/s
/// with MB = 2^20 octets (perftest's default report format), message rate in Mpps.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    pub size: u64,
    pub iters: u64,
    pub bw_peak: f64,
    pub bw_avg: f64,
    pub msg_rate: f64,
}

impl BwReport {
    /// The five messages in order.
    pub fn encode(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// From the five messages.
    pub fn decode(m: &[[u8; 8]; 5]) -> Self {
        let f = |b: [u8; 8]| f64::from_bits(u64::from_be_bytes(b));
        Self {
            size: u64::from_be_bytes(m[0]),
            iters: u64::from_be_bytes(m[1]),
            bw_peak: f(m[2]),
            bw_avg: f(m[3]),
            msg_rate: f(m[4]),
        }
    }
}

/// Where perftest's data operations land for one message size (perftest_resources.h:
/// `BUFF_SIZE`, `INC`, `increase_rem_addr`/`increase_loc_addr`).
///
/// A bandwidth test whose message fits twice in the cycle buffer walks its local and remote
/// addresses in lockstep through `slots` slots `inc` apart (message `i` uses slot `i % slots`);
/// larger messages always use offset 0. Latency tests always use offset 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub size: u64,
    /// The larger of both sides' cycle buffers (`check_sys_data`).
    pub cycle: u64,
    /// The larger of both sides' cache line sizes.
    pub cache_line: u64,
}

impl Geometry {
    /// `INC(size, cache_line)`: the slot pitch.
    pub fn inc(&self) -> u64 {
        let cl = self.cache_line.max(1);
        if self.size > cl {
            self.size.div_ceil(cl) * cl
        } else {
            cl
        }
    }

    /// `BUFF_SIZE(size, cycle)`: the offset of the advertised (second) half of perftest's
    /// buffer from its start.
    pub fn buff_size(&self) -> u64 {
        self.size.max(self.cycle)
    }

    /// Slots a bandwidth test cycles through (1 when the message exceeds half the cycle).
    pub fn slots(&self) -> u64 {
        if self.size <= self.cycle / 2 {
            (self.cycle / self.inc()).max(1)
        } else {
            1
        }
    }

    /// Offset of message `i`'s slot in a bandwidth test.
    pub fn slot_offset(&self, i: u64) -> u64 {
        (i % self.slots()) * self.inc()
    }

    /// Octets from the advertised address that a bandwidth test can touch.
    pub fn span(&self) -> u64 {
        (self.slots() - 1) * self.inc() + self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_layout_matches_struct_pingpong_dest() {
        let d = Dest {
            lid: 1,
            out_reads: 2,
            qpn: 3,
            psn: 0x00AB_CDEF,
            rkey: 0x1122_3344,
            vaddr: 0x0102_0304_0506_0708,
            gid: [9; 16],
            srqn: 5,
            gid_index: 6,
        };
        let b = d.encode();
        assert_eq!(&b[12..16], &[0x00, 0xAB, 0xCD, 0xEF]);
        assert_eq!(&b[16..20], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&b[20..24], &[0, 0, 0, 0], "padding before vaddr");
        assert_eq!(&b[24..32], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[32..48], &[9; 16]);
        assert_eq!(Dest::decode(&b), Some(d));
        assert_eq!(Dest::decode(&b[..55]), None);
    }

    #[test]
    fn versions_and_reports() {
        let v = version_bytes("6.06");
        assert_eq!(&v[..5], b"6.06\0");
        assert_eq!(parse_version(&v), ("6.06".to_string(), 6.06));
        assert_eq!(parse_version(b"5.70.1\0\0").1, 5.7);
        assert_eq!(parse_version(b"junk").1, 0.0);
        let r = BwReport {
            size: 65536,
            iters: 100,
            bw_peak: 1234.5,
            bw_avg: 1000.25,
            msg_rate: 0.016,
        };
        let m = r.encode();
        assert_eq!(m[0], [0, 0, 0, 0, 0, 1, 0, 0]);
        // 1234.5 = 0x40934A0000000000
        assert_eq!(m[2], [0x40, 0x93, 0x4A, 0, 0, 0, 0, 0]);
        assert_eq!(BwReport::decode(&m), r);
        assert_eq!(read_be32(&be32(4096)), Some(4096));
        assert_eq!(read_be32(&[0, 0, 16]), None);
    }

    #[test]
    fn geometry_follows_perftest_address_cycling() {
        // 64-octet messages in a 4096-octet cycle: 64 slots of 64.
        let g = Geometry {
            size: 64,
            cycle: 4096,
            cache_line: 64,
        };
        assert_eq!((g.inc(), g.slots(), g.span()), (64, 64, 4096));
        assert_eq!(g.slot_offset(63), 4032);
        assert_eq!(g.slot_offset(64), 0);
        // Small messages still take a whole cache line.
        let g = Geometry { size: 2, ..g };
        assert_eq!((g.inc(), g.slots(), g.span()), (64, 64, 63 * 64 + 2));
        // 100 octets round up to 128: 32 slots.
        let g = Geometry { size: 100, ..g };
        assert_eq!((g.inc(), g.slots()), (128, 32));
        // More than half the cycle: no cycling.
        let g = Geometry { size: 2049, ..g };
        assert_eq!((g.slots(), g.span(), g.buff_size()), (1, 2049, 4096));
        let g = Geometry { size: 65536, ..g };
        assert_eq!((g.slots(), g.span(), g.buff_size()), (1, 65536, 65536));
    }
}
