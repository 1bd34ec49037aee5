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

use std::cell::RefCell;
use std::rc::Rc;

use rdmap::RegionBuffer;

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
