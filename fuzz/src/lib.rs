//! Helpers shared by the iWARP fuzz targets (`fuzz_targets/`):
//!
//! - [`Input`] reads fixed-width values off the fuzz input (zeros once it runs out) and
//!   [`Seed`] writes them in the same layout, so seeds can be built in code.
//! - [`Arena`]: registered regions carved out of one buffer with guard octets on both sides
//!   of each, and a log of every write, so a target can assert that nothing was written
//!   outside a region (the guards are unchanged) and only where it was allowed.
//! - [`crc32c`]: a bitwise CRC32c, independent of the table/SIMD one the `mpa` crate uses.
//! - [`ref_fpdu`]: an independent reading of one FPDU at a stream position (RFC 5044 4.1 to
//!   4.4): its ULPDU, where it ends, whether its CRC and its Markers are right.
//! - [`Templates`]: RDMAP/DDP segments from the input aimed at a target's regions.
//! - [`check_writes`]: the checks of the writes an arena logged (where they may land, none
//!   while the target may not write).
//! - The harness of the connection targets (`iwarp_conn`, `iwarp_startup`): an [`Endpoint`]
//!   (an `IwarpConn`, its memory and events, segments handed to it and the packets it
//!   emits), its application ([`App`]: receives, Reads, Writes and Sends posted, and where
//!   they let the peer write), and the peer's stream from the input ([`PeerSender`] adds
//!   FPDUs and raw octets to a target's [`PeerStream`], [`PeerHeader`] heads its segments).

use std::cell::RefCell;
use std::net::Ipv4Addr;
use std::ops::Range;
use std::rc::Rc;

use iwarp_conn::{ConnEvent, HeldCrc, IwarpConn, SegmentDigest};
use rdmap::{Access, MemoryTable, PdId, RecvWr, RegionBuffer, SendOp, SendWr, Sge, SgeList, Stag};
use tcp_engine::wire::TcpFlags;
use tcp_engine::{Config, Connection, FourTuple, Instant, SegmentRepr, TxMode};

/// Reads fixed-width little-endian values off the fuzz input; zeros once it runs out.
#[derive(Debug, Clone)]
pub struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    /// Reads `data` from its start.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input(data)
    }

    /// True once every octet was read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Octets left.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// One octet (0 past the end).
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    /// Two octets, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// Four octets, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// Eight octets, little-endian.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }

    /// Up to `n` octets (fewer at the end of the input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.0.len())
    }
}

/// Builds an input in the layout [`Input`] reads (for the committed seeds).
#[derive(Debug, Clone, Default)]
pub struct Seed(pub Vec<u8>);

impl Seed {
    /// An empty input.
    pub fn new() -> Seed {
        Seed(Vec::new())
    }

    /// Appends one octet.
    pub fn u8(&mut self, v: u8) -> &mut Seed {
        self.0.push(v);
        self
    }

    /// Appends two octets, little-endian.
    pub fn u16(&mut self, v: u16) -> &mut Seed {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends four octets, little-endian.
    pub fn u32(&mut self, v: u32) -> &mut Seed {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends eight octets, little-endian.
    pub fn u64(&mut self, v: u64) -> &mut Seed {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends octets as they are.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Seed {
        self.0.extend_from_slice(v);
        self
    }
}

/// A small deterministic generator (xorshift64*) for choices derived from one input value.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15 | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// CRC32c (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: the reference the
/// targets check the `mpa` crate's CRC against.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Octets of guard before and after every region.
pub const GUARD: usize = 64;

/// One write a region received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRec {
    /// The region ([`ArenaRegion::id`]).
    pub region: usize,
    /// Offset in the region.
    pub offset: usize,
    /// Octets written.
    pub len: usize,
    /// The octets, when the arena records them ([`Arena::record_data`]).
    pub data: Vec<u8>,
}

#[derive(Debug, Default)]
struct ArenaInner {
    bytes: Vec<u8>,
    /// (start, len) of each region.
    regions: Vec<(usize, usize)>,
    writes: Vec<WriteRec>,
    record_data: bool,
    /// An access reached past the end of the whole arena (or overflowed).
    escaped: bool,
    /// A read reached past the end of its region.
    read_out_of_bounds: bool,
}

/// Guard octet at arena position `i`.
fn guard_byte(i: usize) -> u8 {
    0xA5 ^ (i as u8).wrapping_mul(7)
}

/// One buffer holding every region of a test, each between guards (see the crate docs).
#[derive(Debug, Clone, Default)]
pub struct Arena(Rc<RefCell<ArenaInner>>);

/// A region of an [`Arena`]: what a target registers in its `MemoryTable`. Its accesses go
/// to the arena without a bounds check of their own, so a write past the region's end lands
/// in the guard after it (and in the write log) instead of panicking here.
#[derive(Debug, Clone)]
pub struct ArenaRegion {
    arena: Arena,
    id: usize,
    start: usize,
    len: usize,
}

impl Arena {
    /// An empty arena (a leading guard only).
    pub fn new() -> Arena {
        let arena = Arena::default();
        arena.push_guard();
        arena
    }

    fn push_guard(&self) {
        let mut inner = self.0.borrow_mut();
        let at = inner.bytes.len();
        inner.bytes.extend((at..at + GUARD).map(guard_byte));
    }

    /// Keep the octets of every write in the log (off by default).
    pub fn record_data(&self, on: bool) {
        self.0.borrow_mut().record_data = on;
    }

    /// A new region of `len` octets filled with `fill`, followed by a guard.
    pub fn region(&self, len: usize, fill: u8) -> ArenaRegion {
        let (id, start) = {
            let mut inner = self.0.borrow_mut();
            let start = inner.bytes.len();
            inner.bytes.resize(start + len, fill);
            let id = inner.regions.len();
            inner.regions.push((start, len));
            (id, start)
        };
        self.push_guard();
        ArenaRegion {
            arena: self.clone(),
            id,
            start,
            len,
        }
    }

    /// Panics unless every guard octet is unchanged, no access left the arena, no read left
    /// its region, and every logged write lies inside its region.
    pub fn check(&self) {
        let inner = self.0.borrow();
        assert!(!inner.escaped, "an access reached outside the whole arena");
        assert!(
            !inner.read_out_of_bounds,
            "a read reached outside its region"
        );
        let mut at = 0;
        let mut guards = Vec::new();
        for &(start, len) in &inner.regions {
            guards.push(at..start);
            at = start + len;
        }
        guards.push(at..inner.bytes.len());
        for guard in guards {
            for i in guard {
                assert_eq!(
                    inner.bytes[i],
                    guard_byte(i),
                    "guard octet {i} changed: a write went outside its region"
                );
            }
        }
        for w in &inner.writes {
            let len = inner.regions[w.region].1;
            assert!(
                w.offset <= len && w.len <= len - w.offset,
                "write of {} at {} outside region {} of {len} octets",
                w.len,
                w.offset,
                w.region
            );
        }
    }

    /// Writes logged so far.
    pub fn writes(&self) -> Vec<WriteRec> {
        self.0.borrow().writes.clone()
    }

    /// Number of writes logged so far.
    pub fn write_count(&self) -> usize {
        self.0.borrow().writes.len()
    }

    /// The current octets of region `id`.
    pub fn contents(&self, id: usize) -> Vec<u8> {
        let inner = self.0.borrow();
        let (start, len) = inner.regions[id];
        inner.bytes[start..start + len].to_vec()
    }

    /// The whole arena (regions and guards).
    pub fn snapshot(&self) -> Vec<u8> {
        self.0.borrow().bytes.clone()
    }
}

impl ArenaRegion {
    /// The region's index in its arena (as in [`WriteRec::region`]).
    pub fn id(&self) -> usize {
        self.id
    }
}

impl RegionBuffer for ArenaRegion {
    fn len(&self) -> usize {
        self.len
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        let mut inner = self.arena.0.borrow_mut();
        if offset
            .checked_add(dst.len())
            .is_none_or(|end| end > self.len)
        {
            inner.read_out_of_bounds = true;
        }
        let from = self.start.saturating_add(offset);
        match inner.bytes.get(from..from.saturating_add(dst.len())) {
            Some(src) => dst.copy_from_slice(src),
            None => inner.escaped = true,
        }
    }

    fn write_at(&self, offset: usize, src: &[u8]) {
        let mut inner = self.arena.0.borrow_mut();
        let data = if inner.record_data {
            src.to_vec()
        } else {
            Vec::new()
        };
        inner.writes.push(WriteRec {
            region: self.id,
            offset,
            len: src.len(),
            data,
        });
        let to = self.start.saturating_add(offset);
        match inner.bytes.get_mut(to..to.saturating_add(src.len())) {
            Some(dst) => dst.copy_from_slice(src),
            None => inner.escaped = true,
        }
    }

    /// A read and a logged write of the word (the arena has one thread): what an Atomic
    /// Operation (RFC 7306 5.1) writes is checked like any other write.
    fn atomic_at(
        &self,
        offset: usize,
        op: rdmap::wire::AtomicOp,
    ) -> Result<u64, rdmap::memory::NotAtomic> {
        if !self.is_atomic_aligned(offset) {
            return Err(rdmap::memory::NotAtomic::Misaligned);
        }
        let mut word = [0u8; 8];
        self.read_at(offset, &mut word);
        let original = op.apply_to_ne_bytes(&mut word);
        self.write_at(offset, &word);
        Ok(original)
    }
}

/// Marker interval (RFC 5044 4.3).
const MARKER_INTERVAL: u64 = 512;

/// One FPDU as read independently of the `mpa` crate (see [`ref_fpdu`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefFpdu {
    /// Position just after its CRC field.
    pub end: u64,
    /// The ULPDU (Markers removed).
    pub ulpdu: Vec<u8>,
    /// With a Marker right before the header (at or after the floor): whether the CRC field
    /// matches CRC32c over that Marker and the covered octets after it.
    pub crc_with_before: Option<bool>,
    /// Whether the CRC field matches CRC32c over the covered octets from the header on.
    pub crc_without_before: bool,
    /// With a Marker position right before the header (wherever the floor is): whether the
    /// CRC field matches CRC32c over a Marker between FPDUs (FPDUPTR 0, RFC 5044 4.3) and the
    /// covered octets, which a locator that starts at the header without that Marker's
    /// octets assumes.
    pub crc_with_zero_marker: Option<bool>,
    /// With a Marker right before the header: whether its FPDUPTR is 0.
    pub marker_before_ok: Option<bool>,
    /// Every Marker after the header points back to it.
    pub markers_inside_ok: bool,
}

impl RefFpdu {
    /// Checks as a receiver that read the stream from the floor on must make them: the CRC
    /// covers the Marker right before the header when there is one.
    pub fn exact_ok(&self, crc: bool, markers: bool) -> bool {
        let crc_ok = self.crc_with_before.unwrap_or(self.crc_without_before);
        (!crc || crc_ok)
            && (!markers || (self.markers_inside_ok && self.marker_before_ok.unwrap_or(true)))
    }

    /// Checks as a receiver that may have started at the header itself (a locator scan): the
    /// Marker right before it either is part of the FPDU, checked and covered, or is not, or
    /// is taken to be a Marker between FPDUs (all zero) and covered.
    pub fn lenient_ok(&self, crc: bool, markers: bool) -> bool {
        if markers && !self.markers_inside_ok {
            return false;
        }
        let with = self.crc_with_before.is_some_and(|c| c || !crc)
            && (!markers || self.marker_before_ok.unwrap_or(true));
        let without = !crc || self.crc_without_before;
        let zero = markers && self.crc_with_zero_marker == Some(true);
        with || without || zero
    }
}

/// Reads the FPDU whose ULPDU_Length field is at stream position `header` (positions
/// relative to SeqStart; `octet(p)` gives the octet at `p`, `None` when it is unknown).
/// With `markers`, every position that is a multiple of 512 starts a 4-octet Marker. The CRC
/// covers the octets from the header (or the Marker right before it, if that is at or after
/// `floor`) up to the first octet of the CRC field, Markers included, and not the Markers
/// inside the CRC field (RFC 5044 4.4). `None` when an octet it needs is unknown.
pub fn ref_fpdu(
    octet: impl Fn(u64) -> Option<u8>,
    header: u64,
    markers: bool,
    floor: u64,
) -> Option<RefFpdu> {
    let is_marker = |p: u64| markers && p.is_multiple_of(MARKER_INTERVAL);
    let fpduptr = |m: u64| -> Option<u64> {
        Some(u64::from(
            u16::from_be_bytes([octet(m.checked_add(2)?)?, octet(m.checked_add(3)?)?]) & !3,
        ))
    };
    let before = header
        .checked_sub(4)
        .filter(|&m| is_marker(m) && m >= floor);
    let mut markers_inside_ok = true;
    // Covered octets from the header on, Markers included, up to the CRC field.
    let mut covered = Vec::new();
    let mut pos = header;
    let mut fields = Vec::new();
    let mut crc_field = Vec::new();
    // Non-Marker octets wanted: header (2), ULPDU and PAD, CRC (4).
    let mut wanted = 2usize;
    let mut stage = 0;
    let mut len = 0;
    loop {
        if stage == 2 && wanted == 0 {
            // A Marker at the end belongs to what follows.
            break;
        }
        if is_marker(pos) {
            if fpduptr(pos)? != pos - header {
                markers_inside_ok = false;
            }
            for i in 0..4 {
                let b = octet(pos + i)?;
                // A Marker before the CRC field's first octet is covered; inside it, not.
                if stage < 2 || crc_field.is_empty() {
                    covered.push(b);
                }
            }
            pos += 4;
            continue;
        }
        if wanted == 0 {
            match stage {
                0 => {
                    len = usize::from(u16::from_be_bytes([fields[0], fields[1]]));
                    fields.clear();
                    wanted = len + (4 - (len + 2) % 4) % 4;
                    stage = 1;
                }
                _ => {
                    wanted = 4;
                    stage = 2;
                }
            }
            continue;
        }
        let b = octet(pos)?;
        if stage < 2 {
            covered.push(b);
            fields.push(b);
        } else {
            crc_field.push(b);
        }
        pos += 1;
        wanted -= 1;
    }
    let received = u32::from_le_bytes([crc_field[0], crc_field[1], crc_field[2], crc_field[3]]);
    let crc_without_before = crc32c(&covered) == received;
    let crc_with_zero_marker = header
        .checked_sub(4)
        .filter(|&m| is_marker(m))
        .map(|_| crc32c(&[[0u8; 4].as_slice(), &covered].concat()) == received);
    let (crc_with_before, marker_before_ok) = match before {
        Some(m) => {
            let mut with = Vec::with_capacity(covered.len() + 4);
            for i in 0..4 {
                with.push(octet(m + i)?);
            }
            with.extend_from_slice(&covered);
            (Some(crc32c(&with) == received), Some(fpduptr(m)? == 0))
        }
        None => (None, None),
    };
    fields.truncate(len);
    Some(RefFpdu {
        end: pos,
        ulpdu: fields,
        crc_with_before,
        crc_without_before,
        crc_with_zero_marker,
        marker_before_ok,
        markers_inside_ok,
    })
}

/// One IFT frame as read independently of the `ift` crate (see [`ref_ift_frame`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefFrame {
    /// Position just after the frame.
    pub end: u64,
    /// The ULPDU: the DDP header and the payload, CRCs removed.
    pub ulpdu: Vec<u8>,
    /// Every CRC the frame carries matches CRC32c over what it covers.
    pub crcs_ok: bool,
}

/// Reads the IFT frame (draft-williams-iwarp-ift-01 section 5.1) whose six-octet header
/// (header_size, payload_size, VTag, each 16 bits big-endian) is at stream position `at`:
/// the DDP header of header_size octets, its CRC with `header_crc` (over the six octets and
/// the DDP header), the payload of payload_size octets, its CRC with `payload_crc`; no
/// padding. The VTag is not checked (a reader stricter than this one finds fewer frames);
/// header_size must be a DDP header's, 14 or 18 octets, and a header CRC must match before
/// the payload is read, as every receiver requires: so that reading every position of a
/// stream does not read 64 KiB at each. `None` when the header fails those or an octet it
/// needs is unknown.
pub fn ref_ift_frame(
    octet: impl Fn(u64) -> Option<u8>,
    at: u64,
    header_crc: bool,
    payload_crc: bool,
) -> Option<RefFrame> {
    let read = |from: u64, n: u64| -> Option<Vec<u8>> {
        (from..from.checked_add(n)?).map(&octet).collect()
    };
    let head = read(at, 6)?;
    let header_size = u64::from(u16::from_be_bytes([head[0], head[1]]));
    let payload_size = u64::from(u16::from_be_bytes([head[2], head[3]]));
    if header_size != 14 && header_size != 18 {
        return None;
    }
    let mut pos = at + 6;
    let ddp_header = read(pos, header_size)?;
    pos += header_size;
    let mut crcs_ok = true;
    if header_crc {
        let field = read(pos, 4)?;
        let mut covered = head.clone();
        covered.extend_from_slice(&ddp_header);
        if crc32c(&covered).to_le_bytes()[..] != field[..] {
            return None;
        }
        pos += 4;
    }
    let payload = read(pos, payload_size)?;
    pos += payload_size;
    if payload_crc {
        let field = read(pos, 4)?;
        crcs_ok &= crc32c(&payload).to_le_bytes()[..] == field[..];
        pos += 4;
    }
    let mut ulpdu = ddp_header;
    ulpdu.extend_from_slice(&payload);
    Some(RefFrame {
        end: pos,
        ulpdu,
        crcs_ok,
    })
}

/// True when `needle` (non-empty) occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Builds RDMAP/DDP segments (ULPDUs) from the input, aimed at a target's regions so that
/// many pass the first checks: STags are picked among the regions' (or any value), TOs near a
/// region (or any value).
#[derive(Debug, Clone)]
pub struct Templates {
    /// Raw STag of each region (a deregistered or foreign one included).
    pub stags: Vec<u32>,
    /// Base TO of each region.
    pub bases: Vec<u64>,
    /// Length of each region.
    pub lens: Vec<usize>,
    /// The peer's regions (STag, TO) the target's Writes go to: what a Terminate naming one
    /// of those Writes copies (may be empty).
    pub peer_regions: Vec<(u32, u64)>,
}

/// An untagged DDP header with its RDMAP control octet (RFC 5041 4.3, RFC 5040 4.1).
pub fn untagged_header(ctrl: u8, rdmap: u8, inval: u32, qn: u32, msn: u32, mo: u32) -> Vec<u8> {
    let mut v = vec![ctrl, rdmap];
    v.extend_from_slice(&inval.to_be_bytes());
    v.extend_from_slice(&qn.to_be_bytes());
    v.extend_from_slice(&msn.to_be_bytes());
    v.extend_from_slice(&mo.to_be_bytes());
    v
}

/// A tagged DDP header with its RDMAP control octet (RFC 5041 4.2).
pub fn tagged_header(ctrl: u8, rdmap: u8, stag: u32, to: u64) -> Vec<u8> {
    let mut v = vec![ctrl, rdmap];
    v.extend_from_slice(&stag.to_be_bytes());
    v.extend_from_slice(&to.to_be_bytes());
    v
}

impl Templates {
    /// Templates aimed at regions of these STags, base TOs and lengths (no peer regions).
    pub fn new(stags: &[Stag], bases: &[u64], lens: &[usize]) -> Templates {
        Templates {
            stags: stags.iter().map(|s| s.raw()).collect(),
            bases: bases.to_vec(),
            lens: lens.to_vec(),
            peer_regions: Vec::new(),
        }
    }

    /// An STag (and the region it names, for picking a TO).
    pub fn stag(&self, input: &mut Input) -> (u32, usize) {
        let n = self.stags.len();
        let i = usize::from(input.u8()) % (n + 1);
        if i == n {
            (input.u32(), 0)
        } else {
            (self.stags[i], i)
        }
    }

    /// A TO near region `region`, or any.
    pub fn to(&self, input: &mut Input, region: usize) -> u64 {
        let base = self.bases[region];
        match input.u8() % 4 {
            0 => input.u64(),
            1 => base.wrapping_sub(u64::from(input.u8() % 32)),
            _ => base.wrapping_add(u64::from(input.u16()) % (self.lens[region] as u64 + 64)),
        }
    }

    /// One ULPDU: raw octets, an RDMA Write or Read Response, a Send (any of its four
    /// opcodes, or RFC 7306's Immediate Data), an RDMA Read Request or (RFC 7306) an Atomic
    /// Request, a Terminate or (RFC 7306) an Atomic Response, fields from the input.
    pub fn ulpdu(&self, input: &mut Input) -> Vec<u8> {
        let kind = input.u8();
        let flags = input.u8();
        let last = flags & 1 != 0;
        match kind % 6 {
            0 => {
                let n = usize::from(input.u8() % 64);
                input.bytes(n).to_vec()
            }
            1 | 2 => {
                let ctrl = match flags >> 6 {
                    0 => input.u8(),
                    _ => 0x81 | if last { 0x40 } else { 0 },
                };
                let rdmap = match (flags >> 1) & 3 {
                    0 => input.u8(),
                    1 => 0x42,
                    _ => 0x40,
                };
                let (stag, region) = self.stag(input);
                let to = self.to(input, region);
                let mut v = tagged_header(ctrl, rdmap, stag, to);
                let n = usize::from(input.u8() % 160);
                v.extend_from_slice(input.bytes(n));
                v
            }
            3 => {
                let ctrl = match flags >> 6 {
                    0 => input.u8(),
                    _ => 0x01 | if last { 0x40 } else { 0 },
                };
                let rdmap = match (flags >> 1) & 7 {
                    0 => input.u8(),
                    n => 0x42 + n,
                };
                let (inval, _) = self.stag(input);
                let qn = if flags & 0x10 != 0 { input.u32() } else { 0 };
                let msn = match input.u8() {
                    0 => input.u32(),
                    n => u32::from(n % 6),
                };
                let mo = match input.u8() {
                    0 => input.u32(),
                    n => u32::from(n),
                };
                let mut v = untagged_header(ctrl, rdmap, inval, qn, msn, mo);
                let n = usize::from(input.u8() % 160);
                v.extend_from_slice(input.bytes(n));
                v
            }
            4 if flags & 0x20 != 0 => {
                // RFC 7306 5.2.1, Figure 4.
                let msn = u32::from(input.u8() % 4);
                let ctrl = if flags & 4 != 0 { 0x01 } else { 0x41 };
                let mut v = untagged_header(ctrl, 0x4A, 0, 1, msn, 0);
                let aopcode = match input.u8() % 4 {
                    0 => input.u8() & 0x0F,
                    1 => 2,
                    _ => 0,
                };
                v.extend_from_slice(&u32::from(aopcode).to_be_bytes());
                v.extend_from_slice(&input.u32().to_be_bytes()); // Request Identifier
                let (stag, region) = self.stag(input);
                v.extend_from_slice(&stag.to_be_bytes());
                v.extend_from_slice(&self.to(input, region).to_be_bytes());
                for _ in 0..4 {
                    v.extend_from_slice(&input.u64().to_be_bytes()); // data and masks
                }
                if flags & 8 != 0 {
                    v.truncate(v.len() - usize::from(input.u8() % 52));
                }
                v
            }
            4 => {
                let msn = u32::from(input.u8() % 4);
                let mo = if flags & 2 != 0 {
                    u32::from(input.u8())
                } else {
                    0
                };
                let ctrl = if flags & 4 != 0 { 0x01 } else { 0x41 };
                let mut v = untagged_header(ctrl, 0x41, 0, 1, msn, mo);
                v.extend_from_slice(&input.u32().to_be_bytes()); // sink STag
                v.extend_from_slice(&input.u64().to_be_bytes()); // sink TO
                let size = match input.u8() % 3 {
                    0 => input.u32(),
                    _ => u32::from(input.u16() % 300),
                };
                v.extend_from_slice(&size.to_be_bytes());
                let (src, region) = self.stag(input);
                v.extend_from_slice(&src.to_be_bytes());
                v.extend_from_slice(&self.to(input, region).to_be_bytes());
                if flags & 8 != 0 {
                    v.truncate(v.len() - usize::from(input.u8() % 28));
                }
                v
            }
            _ if flags & 0x20 != 0 => {
                // RFC 7306 5.2.2, Figure 6: on QN 3.
                let msn = u32::from(input.u8() % 4);
                let mut v = untagged_header(0x41, 0x4B, 0, 3, msn, 0);
                v.extend_from_slice(&input.u32().to_be_bytes()); // Original Request Identifier
                v.extend_from_slice(&input.u64().to_be_bytes()); // Original Remote Data Value
                if flags & 8 != 0 {
                    v.truncate(v.len() - usize::from(input.u8() % 12));
                }
                v
            }
            _ => {
                let mut v = untagged_header(0x41, 0x47, 0, 2, 1, 0);
                if flags & 0x10 != 0 {
                    v.extend_from_slice(&self.terminate(input));
                } else {
                    let n = usize::from(input.u8() % 64);
                    v.extend_from_slice(input.bytes(n));
                }
                v
            }
        }
    }

    /// A Terminate's header (RFC 5040 4.8) as a peer that refused one of the target's
    /// segments writes it: layer, error type and code from the input, and, if D, the copied
    /// DDP header of a segment the target may have sent (a Read Request or a Send, by QN and
    /// a small MSN, or a Write to one of [`Templates::peer_regions`]), with M a segment
    /// length and with R a Read Request header.
    fn terminate(&self, input: &mut Input) -> Vec<u8> {
        let (layer, etype, code) = (input.u8() % 3, input.u8() & 0x0F, input.u8());
        let what = input.u8();
        let msn = 1 + u32::from(input.u8() % 4);
        let segment = match what % 4 {
            0 => None,
            1 => Some(untagged_header(0x41, 0x41, 0, 1, msn, 0)),
            2 => Some(untagged_header(0x41, 0x43, 0, 0, msn, 0)),
            _ => {
                let pick = usize::from(input.u8());
                let (stag, to) = match self.peer_regions.len() {
                    0 => (input.u32(), input.u64()),
                    n => self.peer_regions[pick % n],
                };
                Some(tagged_header(0xC1, 0x40, stag, to))
            }
        };
        let header = rdmap::TerminateHeader {
            layer,
            etype,
            code,
            segment_len: (what & 0x10 != 0).then(|| input.u16()),
            ddp_header: segment
                .as_deref()
                .and_then(rdmap::wire::CopiedDdpHeader::from_segment),
            read_request: (what & 0x20 != 0).then(|| rdmap::ReadRequest {
                sink_stag: input.u32(),
                sink_to: input.u64(),
                size: input.u32(),
                src_stag: input.u32(),
                src_to: input.u64(),
            }),
        };
        let mut out = vec![0u8; header.buffer_len()];
        header.emit(&mut out);
        out
    }
}

/// Panics unless the writes `arena` logged from the `from`-th on are allowed: none at all when
/// `frozen` is `Some(when)` (the message says "written {when}"), and each inside one of the
/// ranges `allowed` lists for its region (`allowed[region]`, offsets in the region; a write of
/// no octets may be anywhere). `each` then checks each write further.
pub fn check_writes(
    arena: &Arena,
    allowed: &[Vec<Range<usize>>],
    from: usize,
    frozen: Option<&str>,
    mut each: impl FnMut(&WriteRec),
) {
    let writes = arena.writes();
    if let Some(when) = frozen {
        assert_eq!(writes.len(), from, "written {when}: {:?}", &writes[from..]);
    }
    for w in &writes[from..] {
        let ok = allowed[w.region]
            .iter()
            .any(|r| w.offset >= r.start && w.offset + w.len <= r.end);
        assert!(ok || w.len == 0, "write not allowed: {w:?}");
        each(w);
    }
}

/// The protection domain the connection targets register their regions in.
pub const PD: PdId = PdId(1);

/// The Initiator's four-tuple in the connection targets: 10.0.0.1:40000 to 10.0.0.2:5000.
pub const INITIATOR_TUPLE: FourTuple = FourTuple {
    local_addr: Ipv4Addr::new(10, 0, 0, 1),
    local_port: 40000,
    remote_addr: Ipv4Addr::new(10, 0, 0, 2),
    remote_port: 5000,
};

/// The Responder's four-tuple: [`INITIATOR_TUPLE`] seen from the other end.
pub const RESPONDER_TUPLE: FourTuple = FourTuple {
    local_addr: INITIATOR_TUPLE.remote_addr,
    local_port: INITIATOR_TUPLE.remote_port,
    remote_addr: INITIATOR_TUPLE.local_addr,
    remote_port: INITIATOR_TUPLE.local_port,
};

/// The TCP config of the connection targets: `Config::mpa()` without timestamps, transmitting
/// from the iWARP connection's source (`TxMode::Source`) when `source`.
pub fn tcp_config(source: bool) -> Config {
    let mut cfg = Config::mpa();
    if source {
        cfg.tx_mode = TxMode::Source;
    }
    cfg.timestamps = false;
    cfg
}

/// Runs `tcp`'s timers if one is due at `now`.
pub fn run_due_timers(tcp: &mut Connection, now: Instant) {
    if tcp.poll_timeout().is_some_and(|d| d <= now) {
        tcp.handle_timeout(now);
    }
}

/// What the AF_XDP engine keeps of a received segment's payload as it sums it for TCP's
/// checksum: the CRC of the one FPDU it holds, if it holds one.
pub fn held_crc(payload: &[u8]) -> Option<HeldCrc> {
    SegmentDigest::of(payload).hold(payload)
}

/// What TCP passed up to an [`Endpoint`]'s connection.
#[derive(Debug, Clone, Copy, Default)]
pub struct Delivered {
    /// Octets passed up in all (octets passed up again counted again).
    pub octets: u64,
    /// The highest stream offset passed up (the end of the data passed up furthest).
    pub end: u64,
}

/// One end of a connection target's connection: its `IwarpConn`, the memory it places into
/// (an [`Arena`] whose regions are registered in a `MemoryTable`), the events it reported and
/// what TCP passed up to it. Its `tcp_engine::Connection` is the target's, passed to each call
/// (a listener has none until the SYN arrives).
pub struct Endpoint {
    /// The iWARP connection.
    pub iw: IwarpConn,
    /// Its memory, every write logged.
    pub arena: Arena,
    /// The arena's regions as registered.
    pub mem: MemoryTable<ArenaRegion>,
    /// The events it reported, in order.
    pub events: Vec<ConnEvent>,
    /// Segments reach the connection as the AF_XDP engine passes them: `on_data_with_crc`
    /// with the CRC read with the segment's checksum ([`held_crc`]); else `on_data`.
    pub digest: bool,
    /// What TCP passed up to it.
    pub delivered: Delivered,
}

impl Endpoint {
    /// An end around `iw`, its memory empty.
    pub fn new(iw: IwarpConn, digest: bool) -> Endpoint {
        Endpoint {
            iw,
            arena: Arena::new(),
            mem: MemoryTable::new(),
            events: Vec::new(),
            digest,
            delivered: Delivered::default(),
        }
    }

    /// Registers one region per entry of `bases`, `lens` and `access` (region `i`: `lens[i]`
    /// octets of the arena filled with `0x10 + i`, at base TO `bases[i]`, with `access[i]`, in
    /// protection domain `pd(i)`); returns their STags in that order.
    pub fn register(
        &mut self,
        bases: &[u64],
        lens: &[usize],
        access: &[Access],
        pd: impl Fn(usize) -> PdId,
    ) -> Vec<Stag> {
        assert!(
            bases.len() == lens.len() && lens.len() == access.len(),
            "one base, length and access per region"
        );
        bases
            .iter()
            .zip(lens)
            .zip(access)
            .enumerate()
            .map(|(i, ((&base, &len), &access))| {
                let region = self.arena.region(len, 0x10 + i as u8);
                self.mem.register(pd(i), region, base, access)
            })
            .collect()
    }

    /// Hands one segment to the connection through `tcp`: what TCP passes up goes to
    /// `on_data`, or with [`Endpoint::digest`] to `on_data_with_crc` with the CRC the segment
    /// holds given when the data is that whole segment.
    pub fn segment(&mut self, tcp: &mut Connection, now: Instant, seg: &SegmentRepr<'_>) {
        let Endpoint {
            iw,
            mem,
            digest,
            delivered,
            ..
        } = self;
        let held = digest.then(|| held_crc(seg.payload)).flatten();
        tcp.handle_segment(now, seg, |data| {
            delivered.octets += data.data.len() as u64;
            delivered.end = delivered
                .end
                .max(data.stream_offset + data.data.len() as u64);
            match held {
                Some(h) => {
                    let crc = h.for_data(data.data);
                    iw.on_data_with_crc(data, crc, mem)
                }
                None => iw.on_data(data, mem),
            }
        });
    }

    /// The packets the connection emits through `tcp` now (256 at most); each must parse, and
    /// `sent` sees each parsed.
    pub fn transmit(
        &mut self,
        tcp: &mut Connection,
        now: Instant,
        mut sent: impl FnMut(&SegmentRepr<'_>),
    ) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 9100];
        for _ in 0..256 {
            let Some(n) = self.iw.poll_transmit(tcp, &self.mem, now, &mut buf) else {
                break;
            };
            match SegmentRepr::parse(&buf[..n]) {
                Ok(seg) => sent(&seg),
                Err(e) => panic!("emitted an unparseable packet: {e:?}"),
            }
            out.push(buf[..n].to_vec());
        }
        out
    }
}

/// Which of a target's regions its [`App`] posts into and sends from.
#[derive(Debug, Clone, Copy)]
pub struct AppLayout {
    /// Where its receives land: four 128-octet slots, one a receive.
    pub recv: usize,
    /// Where its Reads' sinks are: three 128-octet slots, one a Read.
    pub sink: usize,
    /// What its Sends and Writes carry (never written).
    pub src: usize,
    /// Its Sends and Writes are shorter than this (and than the source region).
    pub send_len: u16,
}

/// The application of a connection target: it posts up to four receives (one or two elements
/// each) and up to three Reads (of up to 128 octets), and Writes and Sends, on the target's
/// queue pair, and keeps where what it posted lets the peer write.
#[derive(Debug, Clone)]
pub struct App {
    /// The STag of each region.
    pub stags: Vec<Stag>,
    bases: Vec<u64>,
    lens: Vec<usize>,
    layout: AppLayout,
    /// Where the peer may write each region (offsets in the region): what [`check_writes`]
    /// takes. The target adds the regions it may write anywhere; posting adds the rest.
    pub allowed: Vec<Vec<Range<usize>>>,
    next_recv: usize,
    next_read: usize,
}

impl App {
    /// The application of regions of these STags, base TOs and lengths, none writable yet.
    pub fn new(stags: Vec<Stag>, bases: &[u64], lens: &[usize], layout: AppLayout) -> App {
        App {
            allowed: vec![Vec::new(); stags.len()],
            stags,
            bases: bases.to_vec(),
            lens: lens.to_vec(),
            layout,
            next_recv: 0,
            next_read: 0,
        }
    }

    /// [`Templates`] aimed at its regions.
    pub fn templates(&self) -> Templates {
        Templates::new(&self.stags, &self.bases, &self.lens)
    }

    /// Posts the next receive on `end`'s queue pair (none after the fourth) and allows its
    /// elements.
    pub fn post_recv(&mut self, end: &mut Endpoint) {
        if self.next_recv >= 4 {
            return;
        }
        let layouts: [&[(u64, u32)]; 4] = [
            &[(0, 48)],
            &[(0, 16), (64, 32)],
            &[(8, 8), (40, 40)],
            &[(0, 64), (64, 64)],
        ];
        let recv = self.layout.recv;
        let i = self.next_recv;
        self.next_recv += 1;
        let base = 128 * i as u64;
        let mut sg_list = SgeList::new();
        for &(off, len) in layouts[i] {
            let _ = sg_list.push(Sge {
                stag: self.stags[recv],
                to: self.bases[recv] + base + off,
                len,
            });
            let start = (base + off) as usize;
            self.allowed[recv].push(start..start + len as usize);
        }
        let wr = RecvWr {
            wr_id: 100 + i as u64,
            sg_list,
        };
        let _ = end.iw.qp_mut().post_recv(wr, &end.mem);
    }

    /// Posts a Read (while fewer than three were posted; its sink allowed), a Write or a Send
    /// on `end`'s queue pair, its kind, length, remote STag and TO from the input.
    pub fn post_send(&mut self, input: &mut Input, end: &mut Endpoint) {
        let AppLayout {
            sink,
            src,
            send_len,
            ..
        } = self.layout;
        let op = input.u8();
        let len = u32::from(input.u16() % send_len);
        let wr = if op & 1 == 0 && self.next_read < 3 {
            let off = 128 * self.next_read as u64;
            self.next_read += 1;
            let size = len.min(128);
            self.allowed[sink].push(off as usize..(off + u64::from(size)) as usize);
            SendWr {
                wr_id: 200 + self.next_read as u64,
                op: SendOp::Read {
                    remote_stag: Stag(input.u32()),
                    remote_to: input.u64(),
                },
                sg_list: Sge {
                    stag: self.stags[sink],
                    to: self.bases[sink] + off,
                    len: size,
                }
                .into(),
                signaled: true,
                fence: false,
            }
        } else {
            SendWr {
                wr_id: 300,
                op: if op & 2 != 0 {
                    SendOp::Write {
                        remote_stag: Stag(input.u32()),
                        remote_to: input.u64(),
                    }
                } else {
                    SendOp::Send {
                        solicited: op & 4 != 0,
                        invalidate: None,
                    }
                },
                sg_list: Sge {
                    stag: self.stags[src],
                    to: self.bases[src],
                    len: len.min(self.lens[src] as u32),
                }
                .into(),
                signaled: op & 8 == 0,
                fence: false,
            }
        };
        let _ = end.iw.qp_mut().post_send(wr, &end.mem);
    }
}

/// What a segment the input sends as the peer carries besides its data.
#[derive(Debug, Clone, Copy)]
pub struct PeerHeader {
    /// Its flags.
    pub flags: TcpFlags,
    /// Its acknowledgement number.
    pub ack: u32,
    /// Its window.
    pub window: u16,
    /// The input chose flags, an ACK or a window of its own, or FIN: what may stop what the
    /// target sends.
    pub odd: bool,
}

impl PeerHeader {
    /// Reads the header of a segment to `tcp` as `mode` says: `mode & 0xE0 == 0xE0` flags from
    /// the next input octet (else ACK, PSH with bit 0, FIN when the high nibble is 1); by bits
    /// 1-2 the ACK of what `tcp` sent (0, 1), `snd_una` plus an input offset (2) or any (3); with
    /// bit 3 a window from the input (else 65535).
    pub fn read(input: &mut Input, mode: u8, tcp: &Connection) -> PeerHeader {
        let odd_flags = mode & 0xE0 == 0xE0;
        let flags = if odd_flags {
            TcpFlags::from_byte(input.u8())
        } else {
            TcpFlags {
                ack: true,
                psh: mode & 1 != 0,
                fin: mode & 0xF0 == 0x10,
                ..TcpFlags::default()
            }
        };
        let ack = match mode >> 1 & 3 {
            0 | 1 => tcp.snd_nxt(),
            2 => tcp.snd_una().wrapping_add(u32::from(input.u16())),
            _ => input.u32(),
        };
        let window = if mode & 8 != 0 { input.u16() } else { 65535 };
        PeerHeader {
            flags,
            ack,
            window,
            odd: odd_flags || mode & 8 != 0 || mode >> 1 & 3 >= 2 || flags.fin,
        }
    }

    /// The segment with this header and `payload` at `seq`, from the peer to the connection of
    /// four-tuple `t`.
    pub fn segment<'a>(&self, t: &FourTuple, seq: u32, payload: &'a [u8]) -> SegmentRepr<'a> {
        SegmentRepr {
            tos: 0,
            src_addr: t.remote_addr,
            dst_addr: t.local_addr,
            src_port: t.remote_port,
            dst_port: t.local_port,
            seq,
            ack: self.ack,
            flags: self.flags,
            window: self.window,
            options: Default::default(),
            payload,
        }
    }
}

/// The peer's stream as a connection target builds it from the input (what [`PeerSender`]
/// adds to).
pub trait PeerStream {
    /// Appends one FPDU (or IFT frame) carrying `ulpdu`; `change` (where, and what to XOR)
    /// changes an octet of it after framing.
    fn fpdu(&mut self, ulpdu: &[u8], change: Option<(u16, u8)>);

    /// Appends raw octets.
    fn raw(&mut self, bytes: &[u8]);

    /// Whether the peer's FPDUs carry Markers.
    fn markers(&self) -> bool;

    /// Octets in the stream so far.
    fn octets(&self) -> usize;
}

/// What the input has the peer add to its stream: FPDUs of template ULPDUs aimed at the
/// target's regions, Writes and Sends of several FPDUs (the Sends numbered from MSN 1), raw
/// octets.
#[derive(Debug, Clone)]
pub struct PeerSender {
    templates: Templates,
    next_msn: u32,
    /// Messages of several FPDUs are shorter than this.
    max_message: u16,
    /// Such a message stops once the stream is longer than this.
    max_stream: usize,
}

impl PeerSender {
    /// A sender of ULPDUs from `templates`, of messages shorter than `max_message` that stop
    /// once the stream is longer than `max_stream`.
    pub fn new(templates: Templates, max_message: u16, max_stream: usize) -> PeerSender {
        PeerSender {
            templates,
            next_msn: 1,
            max_message,
            max_stream,
        }
    }

    /// One FPDU of a template ULPDU ([`Templates::ulpdu`]); with `op & 0x80` an octet of it
    /// changed after framing (where and how from the input).
    pub fn template(&self, input: &mut Input, op: u8, stream: &mut impl PeerStream) {
        let ulpdu = self.templates.ulpdu(input);
        let change = (op & 0x80 != 0).then(|| (input.u16(), input.u8()));
        stream.fpdu(&ulpdu, change);
    }

    /// A Write (`op & 0x40`) or a Send in several FPDUs, each within the MULPDU the input
    /// picks, the Write's STag and TO from the templates.
    pub fn message(&mut self, input: &mut Input, op: u8, stream: &mut impl PeerStream) {
        let write = op & 0x40 != 0;
        let message = Message::read(
            input,
            &self.templates,
            write,
            self.max_message,
            self.next_msn,
        );
        self.next_msn = self.next_msn.wrapping_add(1);
        for u in message.ulpdus() {
            stream.fpdu(&u, None);
            if stream.octets() > self.max_stream {
                break;
            }
        }
    }

    /// Raw octets: up to 255 from the input, with Markers a multiple of four (as every FPDU
    /// is long).
    pub fn raw(&self, input: &mut Input, stream: &mut impl PeerStream) {
        let n = usize::from(input.u8());
        let mut raw = input.bytes(n).to_vec();
        if stream.markers() {
            raw.truncate(raw.len() & !3);
        }
        stream.raw(&raw);
    }
}

/// A message the peer sends in several FPDUs: an RDMA Write or a Send (queue 0), each FPDU's
/// ULPDU carrying at most a MULPDU of its payload.
#[derive(Debug, Clone)]
struct Message {
    write: bool,
    stag: u32,
    to: u64,
    msn: u32,
    len: usize,
    mulpdu: usize,
    fill: u8,
}

impl Message {
    /// Reads the message's length (below `max_len`), MULPDU (16 to 1415 octets), the fill of
    /// its payload and, even for a Send, a Write's STag and TO ([`Templates::stag`],
    /// [`Templates::to`]); a Send's MSN is `msn`.
    fn read(
        input: &mut Input,
        templates: &Templates,
        write: bool,
        max_len: u16,
        msn: u32,
    ) -> Message {
        let len = usize::from(input.u16() % max_len);
        let mulpdu = 16 + usize::from(input.u16() % 1400);
        let fill = input.u8();
        let (stag, region) = templates.stag(input);
        let to = templates.to(input, region);
        Message {
            write,
            stag,
            to,
            msn,
            len,
            mulpdu,
            fill,
        }
    }

    /// Its ULPDUs in order (one, without payload, for an empty message), L set on the last.
    fn ulpdus(&self) -> impl Iterator<Item = Vec<u8>> + '_ {
        let mut at = 0;
        let mut done = false;
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            let n = self.mulpdu.min(self.len - at);
            let last = at + n == self.len;
            let l = if last { 0x40 } else { 0 };
            let mut u = if self.write {
                tagged_header(0x81 | l, 0x40, self.stag, self.to.wrapping_add(at as u64))
            } else {
                untagged_header(0x01 | l, 0x43, 0, 0, self.msn, at as u32)
            };
            u.extend((at..at + n).map(|i| self.fill ^ (i as u8).wrapping_mul(13)));
            at += n;
            done = last;
            Some(u)
        })
    }
}

/// Whether an IFT end configured as `ours` takes the peer's indication `peer` in phase
/// `phase` (draft-williams-iwarp-ift-01, the adaption exchange), read from the draft apart
/// from the `ift` crate's own judgement: the phase and the RDMA bit agree, the peer sends each
/// CRC `ours.accept` requires, and, when the policy asks for checked CRCs, the peer does not
/// ignore a CRC we send.
pub fn ift_acceptable(
    ours: &ift::IftConfig,
    peer: &ift::wire::IndicationRepr,
    phase: ift::wire::Phase,
) -> bool {
    let policy = ours.accept;
    let ignores_ours = (ours.header_crc && peer.ignores_header_crc)
        || (ours.payload_crc && peer.ignores_payload_crc);
    peer.phase == phase
        && peer.rdma == ours.rdma
        && (peer.header_crc || !policy.require_header_crc)
        && (peer.payload_crc || !policy.require_payload_crc)
        && !(policy.require_checked && ignores_ours)
}
