//! Memory regions, STags and protection checks (RFC 5040 2.3, 5.1-5.3, 7.2;
//! RFC 5042 2.2.4 and 2.2.5 on Protection Domains and STag scope, 6.1.1 on STags).
//!
//! A [`MemoryTable`] holds the registered regions of one adapter. Each region belongs to
//! a Protection Domain ([`PdId`]); an STag is honoured on an RDMAP stream only if the
//! stream's queue pair is in the same PD (RFC 5042 6.1.1; RFC 5040 7.2's "STag not
//! associated with RDMAP Stream"). An STag is `index << 8 | key`: the index names the table
//! slot, the key is changed on every (re-)registration so a stale STag held by a peer stops
//! working (RFC 5042 6.3.3, accessing a buffer after the transfer). STag index 0 is never
//! allocated, so STag 0 (and the STag 1 of siw's zero-length RTR Write) never name a region.

use std::collections::VecDeque;
use std::ops::{BitAnd, BitOr, BitOrAssign};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mpa::crc::Crc32c;

use crate::error::RdmapError;
pub use crate::types::{AccessViolation, Stag};
use crate::wire::AtomicOp;

/// Why [`RegionBuffer::atomic_at`] could not operate on a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAtomic {
    /// The word's address is not 64-bit aligned in memory (RFC 7306 5.1.1).
    Misaligned,
    /// This buffer type has no atomic access (the trait's default).
    Unsupported,
}

/// Access rights of a region (RFC 5040 2.3; RFC 5042 2.2.2). Local read is always
/// allowed. A bit set, like the `bitflags` crate's types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);
    /// The local ULP may receive into the region (Recv buffers, Read sinks).
    pub const LOCAL_WRITE: Access = Access(1 << 0);
    /// The peer may read the region with RDMA Read.
    pub const REMOTE_READ: Access = Access(1 << 1);
    /// The peer may write the region with RDMA Write.
    pub const REMOTE_WRITE: Access = Access(1 << 2);
    /// The peer may target the region with Atomic Operations (RFC 7306 5; verbs'
    /// `IBV_ACCESS_REMOTE_ATOMIC`).
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// Every right.
    pub const ALL: Access = Access(0b1111);

    /// The raw bits.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Rights from raw bits; unknown bits are dropped.
    pub const fn from_bits_truncate(bits: u8) -> Access {
        Access(bits & Self::ALL.0)
    }

    /// True if every right in `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if no right is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// True if any right lets the peer reach the region (read, write or atomics): the
    /// region is enabled for remote access (RFC 5040 8.1.1).
    pub const fn is_remote(self) -> bool {
        self.0 & (Self::REMOTE_READ.0 | Self::REMOTE_WRITE.0 | Self::REMOTE_ATOMIC.0) != 0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for Access {
    type Output = Access;
    fn bitand(self, rhs: Access) -> Access {
        Access(self.0 & rhs.0)
    }
}

/// A Protection Domain identifier (RFC 5042 2.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PdId(pub u32);

/// The bytes behind a registered region.
///
/// Methods take `&self`: implementations use interior mutability (the datapath's
/// implementation writes through raw pointers into pinned memory; [`VecBuffer`] uses a
/// `Mutex`). [`MemoryTable`] and [`crate::QueuePair`] only ever call `read_at` and
/// `write_at` with `offset + len <= self.len()`, after checking the request against the
/// region's bounds; implementations may panic on an out-of-range call.
pub trait RegionBuffer {
    /// Length of the region in octets.
    fn len(&self) -> usize;

    /// True for a zero-length region.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `dst.len()` octets starting at `offset` into `dst`.
    fn read_at(&self, offset: usize, dst: &mut [u8]);

    /// Copies `dst.len()` octets starting at `offset` into `dst`, like
    /// [`read_at`](Self::read_at), and continues `crc_state` over exactly the octets written to
    /// `dst`: a transmitter's MPA CRC (RFC 5044 4.4) over payload it copies out of the region,
    /// as the running CRC32c register ([`Crc32c::state`]). The default reads, then computes the
    /// CRC over `dst`; an implementation that can fold each octet into the CRC as it copies it
    /// (one pass instead of two, never reading `dst` back) overrides it.
    fn read_at_crc(&self, offset: usize, dst: &mut [u8], crc_state: &mut u32) {
        self.read_at(offset, dst);
        let mut crc = Crc32c::with_state(*crc_state);
        crc.update(dst);
        *crc_state = crc.state();
    }

    /// [`read_at_crc`](Self::read_at_crc) that also gives the RFC 1071 ones' complement sum
    /// of the octets written to `dst` (`dst[0]` the high-order octet of a 16-bit word), if the
    /// implementation computes it in the same pass: a transmitter's share of the TCP checksum
    /// (RFC 9293 3.1) of the payload it copies into a segment. `None` (the default, which
    /// calls `read_at_crc`): the caller sums `dst` itself.
    fn read_at_crc_sum(&self, offset: usize, dst: &mut [u8], crc_state: &mut u32) -> Option<u16> {
        self.read_at_crc(offset, dst, crc_state);
        None
    }

    /// Copies `src` into the region starting at `offset`. Placement writes each segment's
    /// payload with one call (a message's last octet, placed early, with a call of its own
    /// after the rest of the message: [`PlacedEarly`](crate::PlacedEarly)): an implementation
    /// whose bytes another thread polls makes `src`'s last octet visible after the rest (as
    /// a NIC's in-order DMA does, which perftest's latency tests rely on; datapath's
    /// `PinnedBuffer` does).
    fn write_at(&self, offset: usize, src: &[u8]);

    /// A hint that `[offset, offset + len)` will soon be read (a transmitter asks for the
    /// next FPDU's payload while writing the current one). Reads nothing; the default does
    /// nothing.
    fn prefetch(&self, offset: usize, len: usize) {
        let _ = (offset, len);
    }

    /// Another handle to the same bytes that keeps them alive after the region is
    /// deregistered, if this buffer type can give one without allocating (an `Arc` clone): a
    /// transmitter holds it while a Read Response segment read from the region may still be
    /// retransmitted (RFC 5040 4.2: the responder cannot know when the Response is
    /// acknowledged). `None` (the default): the transmitter looks the region up again for each
    /// (re)transmission.
    fn share(&self) -> Option<SharedBuffer> {
        None
    }

    /// Performs `op` (RFC 7306 5.1) atomically on the 64-bit word at `offset`, read and
    /// written in the memory's own byte order (5.1.1: "performed in the endian format of the
    /// target memory"), and returns the value it held before. Atomic with respect to every
    /// other `atomic_at` on the same bytes, whichever queue pair or thread calls it, and (for
    /// memory the application shares) to the application's own atomic instructions on that
    /// word. `offset + 8 <= self.len()` is checked by the caller.
    ///
    /// Errors: [`NotAtomic::Misaligned`] if the word is not 8-aligned in memory;
    /// [`NotAtomic::Unsupported`] (the default) if the buffer type cannot do it.
    fn atomic_at(&self, offset: usize, op: AtomicOp) -> Result<u64, NotAtomic> {
        let _ = (offset, op);
        Err(NotAtomic::Unsupported)
    }

    /// Whether the word at `offset` lies at a 64-bit aligned address in memory: an Atomic
    /// Request's TO "MUST represent a ULP Buffer address that is 64-bit aligned" (RFC 7306
    /// 5.2.1), whatever the region's base TO. The default judges by the offset, for buffers
    /// whose first octet is so aligned.
    fn is_atomic_aligned(&self, offset: usize) -> bool {
        offset.is_multiple_of(8)
    }
}

/// A shared handle to a region's bytes ([`RegionBuffer::share`]).
pub type SharedBuffer = Arc<dyn RegionBuffer + Send + Sync>;

/// A heap-backed [`RegionBuffer`] for tests and examples. Clones share the bytes (as the
/// datapath's `Arc`-backed regions do), so [`RegionBuffer::share`] works for it too, without
/// allocating.
#[derive(Debug, Clone, Default)]
pub struct VecBuffer {
    bytes: Arc<VecBytes>,
}

/// The bytes behind a [`VecBuffer`].
#[derive(Debug, Default)]
struct VecBytes(Mutex<Vec<u8>>);

impl VecBytes {
    fn lock(&self) -> MutexGuard<'_, Vec<u8>> {
        // Plain bytes: a panic elsewhere cannot leave them inconsistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl RegionBuffer for VecBytes {
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self.lock()[offset..offset + dst.len()]);
    }

    fn write_at(&self, offset: usize, src: &[u8]) {
        self.lock()[offset..offset + src.len()].copy_from_slice(src);
    }

    /// Under the buffer's lock, so atomic with respect to every other access through it.
    /// Alignment is the offset's ([`RegionBuffer::is_atomic_aligned`]'s default).
    fn atomic_at(&self, offset: usize, op: AtomicOp) -> Result<u64, NotAtomic> {
        if !self.is_atomic_aligned(offset) {
            return Err(NotAtomic::Misaligned);
        }
        let mut bytes = self.lock();
        let word = bytes
            .get_mut(offset..offset + 8)
            .and_then(|w| <&mut [u8; 8]>::try_from(w).ok())
            .ok_or(NotAtomic::Misaligned)?;
        Ok(op.apply_to_ne_bytes(word))
    }
}

impl VecBuffer {
    /// A zero-filled buffer of `len` octets.
    pub fn zeroed(len: usize) -> VecBuffer {
        VecBuffer::from_vec(vec![0; len])
    }

    /// A buffer holding `bytes`.
    pub fn from_vec(bytes: Vec<u8>) -> VecBuffer {
        VecBuffer {
            bytes: Arc::new(VecBytes(Mutex::new(bytes))),
        }
    }

    /// A copy of the current contents.
    pub fn to_vec(&self) -> Vec<u8> {
        self.bytes.lock().clone()
    }

    /// The buffer's contents (a copy if a clone or shared handle still holds them).
    pub fn into_vec(self) -> Vec<u8> {
        match Arc::try_unwrap(self.bytes) {
            Ok(b) => b.0.into_inner().unwrap_or_else(|e| e.into_inner()),
            Err(shared) => shared.lock().clone(),
        }
    }
}

impl RegionBuffer for VecBuffer {
    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        self.bytes.read_at(offset, dst)
    }

    fn write_at(&self, offset: usize, src: &[u8]) {
        self.bytes.write_at(offset, src)
    }

    fn share(&self) -> Option<SharedBuffer> {
        Some(self.bytes.clone())
    }

    fn atomic_at(&self, offset: usize, op: AtomicOp) -> Result<u64, NotAtomic> {
        self.bytes.atomic_at(offset, op)
    }
}

/// A registered region.
#[derive(Debug, Clone)]
struct Region<B> {
    pd: PdId,
    buffer: B,
    base_to: u64,
    access: Access,
    /// False after an invalidation. Shared by every copy of the table that holds this
    /// registration ([`MemoryTable`] is `Clone` for copy-on-write snapshots), so an
    /// invalidation through one copy is seen through all; a re-registration starts a new one.
    valid: Arc<AtomicBool>,
}

#[derive(Debug, Clone)]
struct Slot<B> {
    /// The key of the most recent registration in this slot.
    key: u8,
    /// Registrations of this slot so far (mod 256): the position in its key sequence.
    uses: u8,
    region: Option<Region<B>>,
}

impl<B> Slot<B> {
    /// Moves the slot on to its next registration's key: the next of its key sequence that
    /// differs from the key it has now (which may be one the caller chose,
    /// [`MemoryTable::reregister_with_key`]), so that no STag of its last registration stays
    /// valid. Two steps at most: the sequence is a bijection of the registration count, so
    /// two consecutive keys differ.
    fn next_key(&mut self, scramble: Option<StagScramble>, index: u32) -> u8 {
        for _ in 0..2 {
            self.uses = self.uses.wrapping_add(1);
            let key = scramble.map_or(self.uses, |s| s.key(index, self.uses));
            if key != self.key {
                self.key = key;
                break;
            }
        }
        self.key
    }
}

/// Whether one registration of a region still stands: false once it is invalidated (a local
/// invalidate, a peer's Send with Invalidate) or re-registered, in every copy of the table at
/// once; a deregistration leaves it as it was. What a transport holding the region's bytes
/// past its check (a Read Response's source, [`RegionBuffer::share`]) asks before each read.
#[derive(Debug, Clone)]
pub struct RegionLive(Arc<AtomicBool>);

impl RegionLive {
    /// Whether the registration still stands.
    #[inline]
    pub fn is_live(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What the owner may see of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    /// The region's Protection Domain.
    pub pd: PdId,
    /// TO of the region's first octet.
    pub base_to: u64,
    /// Length in octets.
    pub len: u64,
    /// Access rights.
    pub access: Access,
    /// False once invalidated (until re-registered).
    pub valid: bool,
}

/// The registered regions of one adapter, indexed by STag.
///
/// Registration changes take `&mut self`; lookups and invalidation take `&self`, so a
/// transport may read (and invalidate through) a snapshot while its owner prepares the next
/// version on a clone (copy-on-write): invalidation state is shared between the copies.
#[derive(Debug, Clone)]
pub struct MemoryTable<B> {
    slots: Vec<Slot<B>>,
    /// Free slots, oldest first: a freed slot is reused only after every other free one.
    free: VecDeque<u32>,
    /// With a secret: how slots and keys become the STags a peer sees.
    scramble: Option<StagScramble>,
    /// This table's contents apart from invalidations ([`MemoryTable::version`]): unique per
    /// process, shared by a copy until either changes (a registration, re-registration or
    /// deregistration gives the changed one a new id).
    id: u64,
    /// Invalidations, counted across every copy (as the regions' `valid` flags are shared).
    invalidations: Arc<AtomicU64>,
    /// The streams (queue pairs) that reach the table's regions now ([`StreamMember`]),
    /// counted across every copy.
    streams: Arc<AtomicU32>,
}

/// One stream's membership of a [`MemoryTable`]'s protection domain
/// ([`MemoryTable::join_stream`]), given up when dropped. The table's STags are scoped to the
/// protection domain, so every STag enabled for remote access is shared on all its member
/// streams (what [`MemoryTable::invalidate`] must know: RFC 5040 8.1.1 rule 7).
#[derive(Debug)]
pub struct StreamMember(Arc<AtomicU32>);

impl Drop for StreamMember {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a check against a [`MemoryTable`] depended on: equal versions mean that every check
/// ([`MemoryTable::validate`]) answers as it did, so a caller that checked a range may skip
/// checking it again (a send queue, segment after segment of one element). Any registration,
/// re-registration, deregistration or invalidation gives a new version. The default is no
/// table's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TableVersion {
    table: u64,
    invalidations: u64,
}

/// Source of [`MemoryTable`] ids (0 is no table's).
static NEXT_TABLE_ID: AtomicU64 = AtomicU64::new(1);

/// Where [`MemoryTable::validate_hinted`] last found an STag. The default remembers
/// nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct StagHint {
    stag: u32,
    slot: u32,
    /// The table's STag mapping ([`MemoryTable::mapping`]; `None` for a table without a
    /// secret, whose slot is the STag index, and in the default hint, whose STag 0 names slot
    /// 0, never a region's).
    mapping: Option<u64>,
}

/// Free slots a table keeps before it reuses the oldest one.
const FREE_QUARANTINE: usize = 64;

/// Unpredictable STags (RFC 5042 6.1.1: a peer must not be able to guess a valid STag): the
/// STag index is a keyed permutation of the table slot (a four-round Feistel network over
/// the 24 index bits), and each slot's key is its registration count through a permutation
/// of the 256 key values keyed by the secret and the slot (a four-round Feistel network over
/// the 8 key bits), so a slot's key comes back only after 256 registrations of it, and one
/// slot's keys say nothing of another's.
#[derive(Debug, Clone, Copy)]
struct StagScramble {
    /// The secret the rest is derived from (names the mapping, [`MemoryTable::mapping`]).
    secret: u64,
    /// Round keys of the index permutation.
    rounds: [u64; 4],
    /// Round keys of the slots' key permutations.
    key_rounds: [u64; 4],
}

impl StagScramble {
    fn new(secret: u64) -> StagScramble {
        // Expand the secret (splitmix64): round keys and the key sequence.
        let mut x = secret;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let rounds = [next(), next(), next(), next()];
        let key_rounds = [next(), next(), next(), next()];
        StagScramble {
            secret,
            rounds,
            key_rounds,
        }
    }

    fn round(key: u64, half: u32) -> u32 {
        ((u64::from(half) ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as u32 & 0xFFF
    }

    /// Slot -> STag index (a bijection of the 24-bit space).
    fn index_of(&self, slot: u32) -> u32 {
        let (mut l, mut r) = ((slot >> 12) & 0xFFF, slot & 0xFFF);
        for &k in &self.rounds {
            (l, r) = (r, l ^ Self::round(k, r));
        }
        (l << 12) | r
    }

    /// STag index -> slot (the inverse of [`StagScramble::index_of`]).
    fn slot_of(&self, index: u32) -> u32 {
        let (mut l, mut r) = ((index >> 12) & 0xFFF, index & 0xFFF);
        for &k in self.rounds.iter().rev() {
            (l, r) = (r ^ Self::round(k, l), l);
        }
        (l << 12) | r
    }

    /// The key of slot `slot`'s `n`th registration: `n` through a Feistel network over its
    /// two 4-bit halves whose round function mixes the slot with the round key (a bijection
    /// of u8 for each slot).
    fn key(&self, slot: u32, n: u8) -> u8 {
        let (mut l, mut r) = (n >> 4, n & 0xF);
        for &k in &self.key_rounds {
            let mixed = ((u64::from(slot) << 4) | u64::from(r)) ^ k;
            let f = (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as u8;
            (l, r) = (r, l ^ f);
        }
        (l << 4) | r
    }
}

impl<B: RegionBuffer> Default for MemoryTable<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: RegionBuffer> MemoryTable<B> {
    /// An empty table. Slot 0 is reserved so that no STag below 0x100 is ever valid.
    pub fn new() -> Self {
        MemoryTable {
            slots: vec![Slot {
                key: 0,
                uses: 0,
                region: None,
            }],
            free: VecDeque::new(),
            scramble: None,
            id: NEXT_TABLE_ID.fetch_add(1, Ordering::Relaxed),
            invalidations: Arc::new(AtomicU64::new(0)),
            streams: Arc::new(AtomicU32::new(0)),
        }
    }

    /// Counts a stream (a queue pair of this protection domain) among those that reach the
    /// table's regions, until the returned membership is dropped.
    pub fn join_stream(&self) -> StreamMember {
        self.streams.fetch_add(1, Ordering::AcqRel);
        StreamMember(self.streams.clone())
    }

    /// The streams that are members now ([`MemoryTable::join_stream`]).
    pub fn streams(&self) -> u32 {
        self.streams.load(Ordering::Acquire)
    }

    /// An empty table whose STags a peer cannot predict (RFC 5042 6.1.1): indices and keys
    /// are keyed permutations under `secret` (take it from a good random source; the table
    /// does no I/O). [`MemoryTable::new`]'s STags are the plain slot numbers, for tests and
    /// simulations.
    pub fn with_secret(secret: u64) -> Self {
        let mut table = Self::new();
        table.scramble = Some(StagScramble::new(secret));
        table
    }

    /// The STag index a slot goes by.
    fn index_of(&self, slot: u32) -> u32 {
        self.scramble.map_or(slot, |s| s.index_of(slot))
    }

    /// A registration, re-registration or deregistration was made: a new version, which no
    /// copy of the table shares.
    fn changed(&mut self) {
        self.id = NEXT_TABLE_ID.fetch_add(1, Ordering::Relaxed);
    }

    /// The table's current [`TableVersion`].
    #[inline]
    pub fn version(&self) -> TableVersion {
        TableVersion {
            table: self.id,
            invalidations: self.invalidations.load(Ordering::Acquire),
        }
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.region.is_some()).count()
    }

    /// True if no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers `buffer` as the TO range `base_to .. base_to + len` of `pd` with
    /// `access`, and returns its STag.
    ///
    /// # Panics
    /// When 2^24 - 1 regions are registered at once (see [`MemoryTable::try_register`]).
    pub fn register(&mut self, pd: PdId, buffer: B, base_to: u64, access: Access) -> Stag {
        match self.try_register(pd, buffer, base_to, access) {
            Ok(stag) => stag,
            Err(_) => panic!("memory table full: 2^24 - 1 regions registered"),
        }
    }

    /// [`MemoryTable::register`] that reports a full table as
    /// [`RdmapError::MemoryTableFull`].
    pub fn try_register(
        &mut self,
        pd: PdId,
        buffer: B,
        base_to: u64,
        access: Access,
    ) -> Result<Stag, RdmapError> {
        let region = Region {
            pd,
            buffer,
            base_to,
            access,
            valid: Arc::new(AtomicBool::new(true)),
        };
        // A freed slot waits until FREE_QUARANTINE others are free too (or the table is
        // full), so an STag index does not come back right after its deregistration.
        let reuse = self.free.len() > FREE_QUARANTINE
            || u32::try_from(self.slots.len()).map_or(true, |n| n > Stag::MAX_INDEX);
        let index = match if reuse { self.free.pop_front() } else { None } {
            Some(index) => index,
            None => loop {
                let index = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                if index > Stag::MAX_INDEX {
                    return Err(RdmapError::MemoryTableFull);
                }
                self.slots.push(Slot {
                    key: 0,
                    uses: 0,
                    region: None,
                });
                // The slot whose index is 0 is never used: STag index 0 is never valid.
                if self.index_of(index) != 0 {
                    break index;
                }
            },
        };
        let scramble = self.scramble;
        let slot = &mut self.slots[index as usize];
        let key = slot.next_key(scramble, index);
        slot.region = Some(region);
        self.changed();
        Ok(Stag::new(self.index_of(index), key))
    }

    fn slot_index(&self, stag: Stag) -> Option<usize> {
        if stag.index() == 0 {
            return None;
        }
        let index = self
            .scramble
            .as_ref()
            .map_or(stag.index(), |s| s.slot_of(stag.index())) as usize;
        let slot = self.slots.get(index)?;
        (slot.key == stag.key() && slot.region.is_some()).then_some(index)
    }

    fn region(&self, stag: Stag) -> Option<&Region<B>> {
        self.slots.get(self.slot_index(stag)?)?.region.as_ref()
    }

    /// Which STag-to-slot mapping this table uses (its secret; `None`: the identity). Copies of
    /// a table share it.
    fn mapping(&self) -> Option<u64> {
        self.scramble.as_ref().map(|s| s.secret)
    }

    /// [`MemoryTable::region`] through `hint`: the slot found for the same STag last time
    /// in a table of the same mapping is taken without the index permutation (its key and
    /// region are checked as always).
    fn region_hinted(&self, stag: Stag, hint: &mut StagHint) -> Option<&Region<B>> {
        let mapping = self.mapping();
        let index = if hint.stag == stag.raw() && hint.mapping == mapping {
            hint.slot as usize
        } else {
            let index = self.slot_index(stag)?;
            *hint = StagHint {
                stag: stag.raw(),
                // At most 2^24 slots.
                slot: index as u32,
                mapping,
            };
            index
        };
        let slot = self.slots.get(index)?;
        if index == 0 || slot.key != stag.key() {
            return None;
        }
        slot.region.as_ref()
    }

    /// Re-registers the region named by `stag` with a new PD, base TO and access, under
    /// a new key (RFC 5042 6.3.3). The old STag stops working; an invalidated region
    /// becomes valid again. The buffer is kept.
    pub fn reregister(
        &mut self,
        stag: Stag,
        pd: PdId,
        base_to: u64,
        access: Access,
    ) -> Result<Stag, RdmapError> {
        self.reregister_keyed(stag, pd, base_to, access, None)
    }

    /// [`MemoryTable::reregister`] with the new key chosen by the caller (verbs lets the
    /// consumer pick the 8-bit key of an STag); it must differ from the current one.
    pub fn reregister_with_key(
        &mut self,
        stag: Stag,
        pd: PdId,
        base_to: u64,
        access: Access,
        key: u8,
    ) -> Result<Stag, RdmapError> {
        if key == stag.key() {
            return Err(RdmapError::UnknownStag { stag });
        }
        self.reregister_keyed(stag, pd, base_to, access, Some(key))
    }

    fn reregister_keyed(
        &mut self,
        stag: Stag,
        pd: PdId,
        base_to: u64,
        access: Access,
        key: Option<u8>,
    ) -> Result<Stag, RdmapError> {
        let index = self
            .slot_index(stag)
            .ok_or(RdmapError::UnknownStag { stag })?;
        let scramble = self.scramble;
        let slot = &mut self.slots[index];
        let Some(region) = slot.region.as_mut() else {
            return Err(RdmapError::UnknownStag { stag });
        };
        // The old identity dies in every copy of the table at once, as a local invalidate
        // makes it (a transport checks against the copy it took at the start of its turn, which
        // still knows the old key and rights: RFC 5040 8.1.1 wants the old rights gone when
        // this returns). A new registration identity: a new flag.
        region.valid.store(false, Ordering::Release);
        self.invalidations.fetch_add(1, Ordering::AcqRel);
        region.pd = pd;
        region.base_to = base_to;
        region.access = access;
        region.valid = Arc::new(AtomicBool::new(true));
        match key {
            Some(k) => slot.key = k,
            None => {
                slot.next_key(scramble, index as u32);
            }
        }
        let stag = Stag::new(stag.index(), slot.key);
        self.changed();
        Ok(stag)
    }

    /// Removes the region and returns its buffer. The STag (and any older key of the
    /// slot) is invalid from now on.
    pub fn deregister(&mut self, stag: Stag) -> Result<B, RdmapError> {
        let index = self
            .slot_index(stag)
            .ok_or(RdmapError::UnknownStag { stag })?;
        let region = self.slots[index]
            .region
            .take()
            .ok_or(RdmapError::UnknownStag { stag })?;
        self.free.push_back(index as u32);
        self.changed();
        Ok(region.buffer)
    }

    /// Invalidates `stag` on behalf of a peer's Send with Invalidate on a stream of PD
    /// `pd` (RFC 5040 5.3): the STag must name a valid region of that PD that is enabled for
    /// remote access, and only while the PD has at most one stream
    /// ([`MemoryTable::join_stream`]): "An RNIC MUST ensure that a Remote Peer is not able to
    /// invalidate an STag enabled for remote access, if the STag is shared on multiple
    /// streams" (RFC 5040 8.1.1 rule 7), and an STag here is shared by every stream of its PD.
    /// An STag without remote rights was never advertised ("Invalidate STag" names "a
    /// previously explicitly Advertised STag", RFC 5040 2.4), yet the peer may have learnt it
    /// (a Read Request carries its sink's), and it is shared by every stream of the PD too:
    /// refused whatever the streams, so that one peer cannot end the receives and Reads of the
    /// other connections (RFC 5042 6.4.5). After this the STag fails every check with
    /// [`AccessViolation::InvalidStag`] until re-registered.
    ///
    /// Errors: [`RdmapError::CannotInvalidate`] with the reason
    /// ([`AccessViolation::AccessRights`] for a shared STag or one without remote rights).
    pub fn invalidate_remote(&self, stag: Stag, pd: PdId) -> Result<(), RdmapError> {
        self.invalidate_as(stag, pd, true)
    }

    /// Invalidates `stag` for its owner (verbs' Local Invalidate): any valid region of PD
    /// `pd`, whatever its rights and however many streams share it (RFC 5040 8.1.1 rule 7
    /// limits the remote peer only). After this the STag fails every check with
    /// [`AccessViolation::InvalidStag`] until re-registered.
    ///
    /// Errors: [`RdmapError::CannotInvalidate`] with [`AccessViolation::InvalidStag`] for an
    /// STag that names no valid region (invalidated already), `StagNotAssociated` for one of
    /// another PD.
    pub fn invalidate(&self, stag: Stag, pd: PdId) -> Result<(), RdmapError> {
        self.invalidate_as(stag, pd, false)
    }

    fn invalidate_as(&self, stag: Stag, pd: PdId, by_peer: bool) -> Result<(), RdmapError> {
        let cannot = |reason| RdmapError::CannotInvalidate { stag, reason };
        let index = self
            .slot_index(stag)
            .ok_or(cannot(AccessViolation::InvalidStag))?;
        let region = self.slots[index]
            .region
            .as_ref()
            .ok_or(cannot(AccessViolation::InvalidStag))?;
        if !region.valid.load(Ordering::Acquire) {
            return Err(cannot(AccessViolation::InvalidStag));
        }
        if region.pd != pd {
            return Err(cannot(AccessViolation::StagNotAssociated));
        }
        if by_peer && (!region.access.is_remote() || self.streams() > 1) {
            return Err(cannot(AccessViolation::AccessRights));
        }
        region.valid.store(false, Ordering::Release);
        self.invalidations.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// The standing of `stag`'s registration, for a holder of its bytes ([`RegionLive`]);
    /// `None` for an STag that names no region.
    pub fn live(&self, stag: Stag) -> Option<RegionLive> {
        self.region(stag).map(|r| RegionLive(r.valid.clone()))
    }

    /// The buffer of a registered region (valid or invalidated), for its owner.
    pub fn get(&self, stag: Stag) -> Option<&B> {
        self.region(stag).map(|r| &r.buffer)
    }

    /// The attributes of a registered region.
    pub fn info(&self, stag: Stag) -> Option<RegionInfo> {
        self.region(stag).map(|r| RegionInfo {
            pd: r.pd,
            base_to: r.base_to,
            len: r.buffer.len() as u64,
            access: r.access,
            valid: r.valid.load(Ordering::Acquire),
        })
    }

    /// Checks an access of `len` octets at `to` through `stag` from a stream of PD
    /// `pd` needing `needed` rights, and returns the buffer and the offset of `to` in
    /// it. `offset + len <= buffer.len()` is guaranteed on success.
    ///
    /// The checks run in this order, and the first failure is returned (RFC 5040 7.2
    /// rule 4, RFC 5041 7.1): STag valid (registered, current key, not invalidated),
    /// PD matches, access rights, no 64-bit TO wrap, range inside the region. A
    /// zero-length access still needs a valid STag; callers skip the check entirely
    /// for zero-length messages (RFC 5041 7.1).
    pub fn validate(
        &self,
        stag: Stag,
        pd: PdId,
        needed: Access,
        to: u64,
        len: u64,
    ) -> Result<(&B, usize), AccessViolation> {
        let region = self.region(stag).ok_or(AccessViolation::InvalidStag)?;
        Self::check(region, pd, needed, to, len)
    }

    /// [`MemoryTable::validate`] for a caller that checks the same STag many times in a row
    /// (a transmit ring, FPDU after FPDU): `hint` remembers where the STag was found, so the
    /// next check of it skips the STag index permutation. Same checks, same results.
    pub fn validate_hinted(
        &self,
        stag: Stag,
        pd: PdId,
        needed: Access,
        to: u64,
        len: u64,
        hint: &mut StagHint,
    ) -> Result<(&B, usize), AccessViolation> {
        let region = self
            .region_hinted(stag, hint)
            .ok_or(AccessViolation::InvalidStag)?;
        Self::check(region, pd, needed, to, len)
    }

    /// The checks of [`MemoryTable::validate`] after the STag lookup.
    #[inline]
    fn check(
        region: &Region<B>,
        pd: PdId,
        needed: Access,
        to: u64,
        len: u64,
    ) -> Result<(&B, usize), AccessViolation> {
        if !region.valid.load(Ordering::Acquire) {
            return Err(AccessViolation::InvalidStag);
        }
        if region.pd != pd {
            return Err(AccessViolation::StagNotAssociated);
        }
        if !region.access.contains(needed) {
            return Err(AccessViolation::AccessRights);
        }
        let end = to.checked_add(len).ok_or(AccessViolation::ToWrap)?;
        let region_end = u128::from(region.base_to) + region.buffer.len() as u128;
        if to < region.base_to || u128::from(end) > region_end {
            return Err(AccessViolation::BaseBounds);
        }
        let offset =
            usize::try_from(to - region.base_to).map_err(|_| AccessViolation::BaseBounds)?;
        Ok((&region.buffer, offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PD: PdId = PdId(7);

    #[test]
    fn the_stag_index_permutation_is_a_bijection_of_24_bits() {
        let s = StagScramble::new(0x5eed);
        for slot in (0..=Stag::MAX_INDEX)
            .step_by(997)
            .chain([0, 1, Stag::MAX_INDEX])
        {
            let index = s.index_of(slot);
            assert!(index <= Stag::MAX_INDEX);
            assert_eq!(s.slot_of(index), slot);
        }
        for slot in [1, 2, 0x1234, Stag::MAX_INDEX] {
            let keys: std::collections::HashSet<u8> = (0..=255u8).map(|n| s.key(slot, n)).collect();
            assert_eq!(keys.len(), 256, "a slot's keys: all 256 before one repeats");
        }
    }

    /// RFC 5042 6.1.1: 1,000 registrations (with deregistrations among them) show no
    /// sequence a peer could extrapolate: no STag twice, indices not in order or at a
    /// constant stride, keys not counting up, and another secret gives other STags.
    #[test]
    fn stags_of_a_table_with_a_secret_are_unpredictable() {
        let run = |secret| {
            let mut t = MemoryTable::with_secret(secret);
            let mut stags = Vec::new();
            for i in 0..1000u32 {
                let stag = t.register(PD, VecBuffer::zeroed(8), 0, Access::REMOTE_WRITE);
                assert_ne!(stag.index(), 0);
                assert_eq!(
                    t.validate(stag, PD, Access::REMOTE_WRITE, 0, 8).map(|_| ()),
                    Ok(())
                );
                stags.push(stag);
                if i % 3 == 0 {
                    // Freed slots come back last, under another key.
                    t.deregister(stag).unwrap();
                    assert!(t.validate(stag, PD, Access::NONE, 0, 1).is_err());
                }
            }
            stags
        };
        let a = run(1);
        let distinct: std::collections::HashSet<u32> = a.iter().map(|s| s.0).collect();
        assert_eq!(distinct.len(), a.len(), "an STag came back");
        let steps: Vec<i64> = a
            .windows(2)
            .map(|w| i64::from(w[1].index()) - i64::from(w[0].index()))
            .collect();
        let most_common = steps
            .iter()
            .map(|d| steps.iter().filter(|e| *e == d).count())
            .max()
            .unwrap();
        assert!(most_common < 10, "{most_common} equal index steps");
        assert!(
            steps.iter().filter(|&&d| d > 0).count() < 700,
            "indices mostly ascend"
        );
        let key_steps = a
            .windows(2)
            .filter(|w| w[1].key() == w[0].key().wrapping_add(1))
            .count();
        assert!(key_steps < 50, "{key_steps} keys one above the last");
        let b = run(2);
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(same < 5, "{same} STags alike under two secrets");
        // The first region of every table is not a fixed STag.
        assert_ne!(a[0], b[0]);
        assert_ne!(a[0], Stag(0x101));
    }

    /// One STag's key says nothing of another slot's (RFC 5042 6.1.1): the first
    /// registrations of many slots do not share a key, nor do their second ones follow the
    /// first by one common rule.
    #[test]
    fn keys_of_different_slots_are_unrelated() {
        let mut t = MemoryTable::with_secret(5);
        let firsts: Vec<Stag> = (0..256)
            .map(|_| t.register(PD, VecBuffer::zeroed(8), 0, Access::REMOTE_WRITE))
            .collect();
        let distinct = |keys: &mut dyn Iterator<Item = u8>| {
            keys.collect::<std::collections::HashSet<u8>>().len()
        };
        let first_keys = distinct(&mut firsts.iter().map(|s| s.key()));
        assert!(first_keys > 100, "{first_keys} distinct first keys");
        let steps = distinct(&mut firsts.iter().map(|&s| {
            let again = t.reregister(s, PD, 0, Access::REMOTE_WRITE).unwrap();
            again.key().wrapping_sub(s.key())
        }));
        assert!(
            steps > 100,
            "{steps} distinct steps from the first key to the second"
        );
    }

    /// A key the caller chose (`reregister_with_key`) that happens to be the slot's next
    /// automatic one is not handed out again by the next re-registration, whichever it is:
    /// the STag the caller chose stops working.
    #[test]
    fn an_automatic_key_never_repeats_a_chosen_one() {
        for chosen in 0..=255u8 {
            let mut t = MemoryTable::with_secret(11);
            let first = t.register(PD, VecBuffer::zeroed(8), 0, Access::REMOTE_WRITE);
            if chosen == first.key() {
                continue; // refused: a new key must differ
            }
            let picked = t
                .reregister_with_key(first, PD, 0, Access::REMOTE_WRITE, chosen)
                .unwrap();
            let next = t.reregister(picked, PD, 0, Access::REMOTE_WRITE).unwrap();
            assert_ne!(next, picked, "key {chosen} handed out again");
            assert!(t.validate(picked, PD, Access::NONE, 0, 1).is_err());
        }
    }

    #[test]
    fn a_slot_reregistered_many_times_does_not_reuse_a_key_soon() {
        let mut t = MemoryTable::with_secret(9);
        let mut stag = t.register(PD, VecBuffer::zeroed(8), 0, Access::NONE);
        let mut seen = vec![stag];
        for _ in 0..255 {
            stag = t.reregister(stag, PD, 0, Access::NONE).unwrap();
            assert!(!seen.contains(&stag), "key reused within 256 registrations");
            seen.push(stag);
        }
        // The consumer may pick the key (verbs); the old STag dies either way.
        let chosen = t
            .reregister_with_key(stag, PD, 0, Access::NONE, stag.key().wrapping_add(7))
            .unwrap();
        assert_eq!(chosen.key(), stag.key().wrapping_add(7));
        assert!(t.validate(stag, PD, Access::NONE, 0, 1).is_err());
        assert!(t.validate(chosen, PD, Access::NONE, 0, 1).is_ok());
    }

    fn table_with_region(access: Access) -> (MemoryTable<VecBuffer>, Stag) {
        let mut table = MemoryTable::new();
        let stag = table.register(PD, VecBuffer::zeroed(100), 0x1000, access);
        (table, stag)
    }

    #[test]
    fn access_flags() {
        let a = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        assert!(a.contains(Access::REMOTE_WRITE));
        assert!(!a.contains(Access::REMOTE_READ));
        assert!(a.contains(Access::NONE));
        assert_eq!(Access::from_bits_truncate(0xFF), Access::ALL);
        assert!((a & Access::REMOTE_READ).is_empty());
    }

    #[test]
    fn register_never_hands_out_index_zero() {
        let (table, stag) = table_with_region(Access::ALL);
        assert_ne!(stag.index(), 0);
        assert_eq!(
            table.validate(Stag(0), PD, Access::NONE, 0x1000, 1).err(),
            Some(AccessViolation::InvalidStag)
        );
        assert_eq!(
            table.validate(Stag(1), PD, Access::NONE, 0x1000, 1).err(),
            Some(AccessViolation::InvalidStag)
        );
    }

    #[test]
    fn validate_returns_offset_and_buffer() {
        let (table, stag) = table_with_region(Access::ALL);
        let (buf, off) = table
            .validate(stag, PD, Access::REMOTE_WRITE, 0x1010, 84)
            .unwrap();
        assert_eq!(off, 0x10);
        assert_eq!(buf.len(), 100);
        assert!(table.validate(stag, PD, Access::NONE, 0x1064, 0).is_ok());
    }

    #[test]
    fn validate_reports_each_violation() {
        let (table, stag) = table_with_region(Access::LOCAL_WRITE | Access::REMOTE_READ);
        let check = |stag, pd, needed, to, len| table.validate(stag, pd, needed, to, len).err();
        assert_eq!(
            check(Stag(stag.0 + 1), PD, Access::NONE, 0x1000, 1),
            Some(AccessViolation::InvalidStag)
        );
        assert_eq!(
            check(stag, PdId(8), Access::NONE, 0x1000, 1),
            Some(AccessViolation::StagNotAssociated)
        );
        assert_eq!(
            check(stag, PD, Access::REMOTE_WRITE, 0x1000, 1),
            Some(AccessViolation::AccessRights)
        );
        assert_eq!(
            check(stag, PD, Access::REMOTE_READ, u64::MAX, 2),
            Some(AccessViolation::ToWrap)
        );
        assert_eq!(
            check(stag, PD, Access::REMOTE_READ, 0xFFF, 1),
            Some(AccessViolation::BaseBounds)
        );
        assert_eq!(
            check(stag, PD, Access::REMOTE_READ, 0x1000, 101),
            Some(AccessViolation::BaseBounds)
        );
        assert_eq!(
            check(stag, PD, Access::REMOTE_READ, 0x1064, 1),
            Some(AccessViolation::BaseBounds)
        );
    }

    /// Every change a check depends on gives a new version; a copy keeps the version until
    /// either copy changes, and an invalidation through one copy shows in both.
    #[test]
    fn the_version_changes_with_everything_a_check_depends_on() {
        let mut t = MemoryTable::with_secret(3);
        let v0 = t.version();
        assert_ne!(v0, TableVersion::default());
        assert_ne!(
            v0,
            MemoryTable::<VecBuffer>::new().version(),
            "another table"
        );
        let a = t.register(PD, VecBuffer::zeroed(8), 0, Access::ALL);
        let v1 = t.version();
        assert_ne!(v1, v0);
        assert_eq!(t.version(), v1, "a lookup changes nothing");
        let a = t.reregister(a, PD, 0, Access::LOCAL_WRITE).unwrap();
        let v2 = t.version();
        assert_ne!(v2, v1);
        let copy = t.clone();
        assert_eq!(copy.version(), v2);
        copy.invalidate(a, PD).unwrap();
        let v3 = t.version();
        assert_ne!(v3, v2);
        assert_eq!(copy.version(), v3);
        assert!(copy.invalidate(a, PD).is_err());
        assert_eq!(t.version(), v3, "a refused invalidation changes nothing");
        t.deregister(a).unwrap();
        assert_ne!(t.version(), v3);
        let v4 = t.version();
        assert!(t.deregister(a).is_err());
        assert_eq!(t.version(), v4, "a refused deregistration changes nothing");
        // Two copies that each change differently part ways.
        let (mut x, mut y) = (t.clone(), t.clone());
        x.register(PD, VecBuffer::zeroed(8), 0, Access::ALL);
        y.register(PD, VecBuffer::zeroed(16), 0, Access::NONE);
        assert_ne!(x.version(), y.version());
        assert_ne!(x.version(), v4);
        assert_eq!(t.version(), v4, "the original is unchanged");
    }

    /// The hinted lookup answers as the plain one through every change a remembered slot
    /// can see: deregistration, the slot reused under another key, invalidation, a hint from
    /// another table (another secret), and a table without a secret.
    #[test]
    fn a_hinted_check_answers_as_the_plain_one() {
        let same = |t: &MemoryTable<VecBuffer>, stag, hint: &mut StagHint| {
            let plain = t.validate(stag, PD, Access::NONE, 0, 8).map(|(_, o)| o);
            let hinted = t
                .validate_hinted(stag, PD, Access::NONE, 0, 8, hint)
                .map(|(_, o)| o);
            assert_eq!(plain, hinted, "{stag:?}");
            plain
        };
        for secret in [Some(1), None] {
            let mut t = match secret {
                Some(s) => MemoryTable::with_secret(s),
                None => MemoryTable::new(),
            };
            let mut hint = StagHint::default();
            assert!(same(&t, Stag(0), &mut hint).is_err());
            let a = t.register(PD, VecBuffer::zeroed(8), 0, Access::ALL);
            assert_eq!(same(&t, a, &mut hint), Ok(0));
            assert_eq!(same(&t, a, &mut hint), Ok(0));
            // Another table's STag with this table's hint, and this one's with the other's.
            let mut other = MemoryTable::with_secret(2);
            let b = other.register(PD, VecBuffer::zeroed(8), 0, Access::ALL);
            let mut other_hint = StagHint::default();
            assert_eq!(same(&other, b, &mut other_hint), Ok(0));
            let _ = same(&t, b, &mut other_hint);
            let _ = same(&other, a, &mut hint);
            // Deregistered, then its slot reused (after the quarantine) under another key.
            assert_eq!(same(&t, a, &mut hint), Ok(0));
            t.deregister(a).unwrap();
            assert!(same(&t, a, &mut hint).is_err());
            let mut newest = a;
            for _ in 0..=FREE_QUARANTINE {
                newest = t.register(PD, VecBuffer::zeroed(8), 0, Access::ALL);
                let _ = same(&t, a, &mut hint);
                let _ = same(&t, newest, &mut hint);
                t.deregister(newest).unwrap();
            }
            assert!(same(&t, newest, &mut hint).is_err());
            // Invalidated through the STag the hint remembers.
            let c = t.register(PD, VecBuffer::zeroed(8), 0, Access::ALL);
            assert_eq!(same(&t, c, &mut hint), Ok(0));
            t.invalidate(c, PD).unwrap();
            assert_eq!(same(&t, c, &mut hint), Err(AccessViolation::InvalidStag));
        }
    }

    #[test]
    fn region_at_top_of_to_space_does_not_overflow() {
        let mut table = MemoryTable::new();
        let stag = table.register(PD, VecBuffer::zeroed(16), u64::MAX - 15, Access::ALL);
        assert_eq!(
            table
                .validate(stag, PD, Access::NONE, u64::MAX - 15, 15)
                .map(|(_, o)| o),
            Ok(0)
        );
        assert_eq!(
            table
                .validate(stag, PD, Access::NONE, u64::MAX - 15, 16)
                .err(),
            Some(AccessViolation::ToWrap)
        );
    }

    #[test]
    fn reregister_changes_key_and_kills_old_stag() {
        let (mut table, old) = table_with_region(Access::REMOTE_WRITE);
        let new = table
            .reregister(old, PD, 0x2000, Access::REMOTE_READ)
            .unwrap();
        assert_eq!(new.index(), old.index());
        assert_ne!(new.key(), old.key());
        assert_eq!(
            table.validate(old, PD, Access::NONE, 0x2000, 1).err(),
            Some(AccessViolation::InvalidStag)
        );
        assert!(table
            .validate(new, PD, Access::REMOTE_READ, 0x2000, 100)
            .is_ok());
        assert!(matches!(
            table.reregister(old, PD, 0, Access::NONE),
            Err(RdmapError::UnknownStag { .. })
        ));
    }

    /// A copy of the table taken before a re-registration (a transport's, for its turn) stops
    /// taking the old STag at once: the old rights die everywhere, and the copy's version
    /// changes, so that checks it remembered are made again.
    #[test]
    fn reregister_kills_the_old_stag_in_copies_too() {
        let (mut table, old) = table_with_region(Access::REMOTE_WRITE);
        let copy = table.clone();
        let version = copy.version();
        assert!(copy
            .validate(old, PD, Access::REMOTE_WRITE, 0x1000, 8)
            .is_ok());
        let new = table
            .reregister(old, PD, 0x1000, Access::REMOTE_READ)
            .unwrap();
        assert_eq!(
            copy.validate(old, PD, Access::REMOTE_WRITE, 0x1000, 8)
                .err(),
            Some(AccessViolation::InvalidStag),
            "the old copy still takes the old STag"
        );
        assert_ne!(copy.version(), version);
        assert!(table
            .validate(new, PD, Access::REMOTE_READ, 0x1000, 8)
            .is_ok());
    }

    /// A registration's standing, held past its check, falls with an invalidation through
    /// any copy and with a re-registration, not with a deregistration.
    #[test]
    fn a_held_standing_falls_with_invalidation_and_reregistration_only() {
        let (mut table, stag) = table_with_region(Access::REMOTE_READ);
        let live = table.live(stag).expect("registered");
        assert!(live.is_live());
        let stag = table.reregister(stag, PD, 0, Access::REMOTE_READ).unwrap();
        assert!(!live.is_live(), "re-registered");
        let live = table.live(stag).expect("registered");
        table.clone().invalidate(stag, PD).unwrap();
        assert!(!live.is_live(), "invalidated through a copy");
        let stag = table.reregister(stag, PD, 0, Access::REMOTE_READ).unwrap();
        let live = table.live(stag).expect("registered");
        table.deregister(stag).unwrap();
        assert!(live.is_live(), "a deregistration leaves it standing");
        assert!(table.live(stag).is_none());
    }

    #[test]
    fn deregister_returns_buffer_and_reuse_gets_new_key() {
        let (mut table, stag) = table_with_region(Access::ALL);
        let buf = table.deregister(stag).unwrap();
        assert_eq!(buf.len(), 100);
        assert!(table.is_empty());
        assert!(table.deregister(stag).is_err());
        // The freed slot waits while fewer than FREE_QUARANTINE others are free: new ones go
        // first.
        let next = table.register(PD, VecBuffer::zeroed(4), 0, Access::ALL);
        assert_ne!(next.index(), stag.index());
        let mut others: Vec<Stag> = (0..FREE_QUARANTINE)
            .map(|_| table.register(PD, VecBuffer::zeroed(4), 0, Access::ALL))
            .collect();
        for s in others.drain(..) {
            table.deregister(s).unwrap();
        }
        // Now it is the oldest of more than FREE_QUARANTINE free slots: it comes back, under
        // a new key.
        let again = table.register(PD, VecBuffer::zeroed(4), 0, Access::ALL);
        assert_eq!(again.index(), stag.index());
        assert_ne!(again, stag);
        assert!(table.get(stag).is_none());
        assert!(table.get(again).is_some());
    }

    #[test]
    fn invalidate_checks_pd_and_sticks() {
        let (mut table, stag) = table_with_region(Access::ALL);
        assert_eq!(
            table.invalidate(stag, PdId(99)),
            Err(RdmapError::CannotInvalidate {
                stag,
                reason: AccessViolation::StagNotAssociated
            })
        );
        table.invalidate(stag, PD).unwrap();
        assert_eq!(
            table.validate(stag, PD, Access::NONE, 0x1000, 1).err(),
            Some(AccessViolation::InvalidStag)
        );
        assert_eq!(
            table.invalidate(stag, PD),
            Err(RdmapError::CannotInvalidate {
                stag,
                reason: AccessViolation::InvalidStag
            })
        );
        assert_eq!(table.info(stag).map(|i| i.valid), Some(false));
        let revived = table.reregister(stag, PD, 0x1000, Access::ALL).unwrap();
        assert!(table.validate(revived, PD, Access::NONE, 0x1000, 1).is_ok());
    }

    /// A peer may invalidate only a region with remote rights, and only while one stream
    /// shares it (RFC 5040 8.1.1 rule 7); the owner may invalidate any valid region however
    /// many streams share it.
    #[test]
    fn the_owner_invalidates_what_a_peer_may_not() {
        let (mut table, remote) = table_with_region(Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let local = table.register(PD, VecBuffer::zeroed(8), 0, Access::LOCAL_WRITE);
        let refused = |stag| {
            Err(RdmapError::CannotInvalidate {
                stag,
                reason: AccessViolation::AccessRights,
            })
        };
        let one = table.join_stream();
        assert_eq!(table.invalidate_remote(local, PD), refused(local));
        let two = table.join_stream();
        assert_eq!(table.invalidate_remote(remote, PD), refused(remote));
        assert_eq!(table.info(remote).map(|i| i.valid), Some(true));
        table.invalidate(remote, PD).unwrap();
        table.invalidate(local, PD).unwrap();
        assert_eq!(table.info(remote).map(|i| i.valid), Some(false));
        assert_eq!(table.info(local).map(|i| i.valid), Some(false));
        drop((one, two));
        let again = table
            .reregister(remote, PD, 0x1000, Access::REMOTE_WRITE)
            .unwrap();
        let _alone = table.join_stream();
        table.invalidate_remote(again, PD).unwrap();
    }

    #[test]
    fn vec_buffer_reads_and_writes() {
        let b = VecBuffer::zeroed(8);
        b.write_at(2, &[1, 2, 3]);
        let mut out = [0u8; 4];
        b.read_at(1, &mut out);
        assert_eq!(out, [0, 1, 2, 3]);
        assert_eq!(b.into_vec(), vec![0, 0, 1, 2, 3, 0, 0, 0]);
    }
}
