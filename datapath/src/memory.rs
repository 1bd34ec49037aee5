//! Registered memory: pinned, page-aligned buffers behind memory regions (RFC 5040 2.3 / RFC 5042
//! 5: a region is named by an STag, belongs to one protection domain and carries access rights).
//!
//! The protocol crate `rdmap` keeps the registration table ([`rdmap::MemoryTable`]); this module
//! owns the bytes. [`PinnedBuffer`] is the only place that touches them through raw pointers.

use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rdmap::{Access, MemoryTable, PdId, RegionBuffer, Stag};

use crate::copy_crc::{copy_crc32c, copy_crc32c_sum, crc_update};
use crate::DatapathError;

const PAGE: usize = 4096;
/// The x86-64 (and usual aarch64) transparent huge page size.
const HUGE_PAGE: usize = 2 << 20;

/// Zeroed, page-aligned memory of its own (an anonymous mapping), locked into RAM (`mlock`) when
/// the process may do so.
///
/// The engine thread writes into it (placement) and reads from it (transmit) while the
/// application may read and write it too: like any RDMA buffer, the application must not touch
/// bytes that a posted operation is using until that operation completes. All access goes through
/// bounds-checked copies, so no access can reach outside the buffer.
pub struct PinnedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// Octets mapped (`len` rounded up to whole pages, at least one).
    map_len: usize,
    locked: bool,
}

// SAFETY: the buffer is plain bytes owned by this value; every access is a bounds-checked raw
// copy (no references into the buffer escape), so moving it or sharing it across threads cannot
// create dangling or out-of-bounds accesses. Concurrent use of the same bytes by the application
// and the engine is governed by the work-request rules documented above, as with any RDMA memory.
unsafe impl Send for PinnedBuffer {}
// SAFETY: see the `Send` impl: shared access only ever happens through bounds-checked copies.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` zeroed bytes (at least one page), page-aligned, and tries to `mlock` them.
    ///
    /// The bytes are an anonymous mapping of their own (zero-filled by the kernel, nothing
    /// touched here before the advice below): a buffer of a huge page or more starts on a
    /// huge-page boundary and is advised `MADV_HUGEPAGE` *before* `mlock` faults its pages in, so
    /// that with transparent huge pages in `madvise` mode (the usual default) those faults take
    /// 2 MiB pages. (An allocator's zeroed, aligned allocation writes its zeros first: every page
    /// was then faulted in at 4 KiB before any advice could apply.) One TLB entry then covers
    /// 2 MiB of the engine's copies in and out of the buffer instead of 4 KiB.
    pub fn new(len: usize) -> Result<Self, DatapathError> {
        let map_len = len.max(1).div_ceil(PAGE) * PAGE;
        let huge = map_len >= HUGE_PAGE;
        // Room to move the start to a huge-page boundary; the slack is unmapped again below.
        let slack = if huge { HUGE_PAGE } else { 0 };
        let reserve = map_len
            .checked_add(slack)
            .ok_or(DatapathError::InvalidArgument("memory region too large"))?;
        // SAFETY: a new private anonymous mapping at an address of the kernel's choosing; it
        // aliases nothing we own.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(DatapathError::OutOfMemory(map_len));
        }
        let base = raw as usize;
        let start = if huge {
            base.next_multiple_of(HUGE_PAGE)
        } else {
            base
        };
        let head = start - base;
        let tail = reserve - head - map_len;
        // SAFETY: both ranges are page-aligned parts of the mapping just made (`head` and `tail`
        // are multiples of the page size, `start` and `start + map_len` page-aligned), outside
        // the `map_len` octets kept; nothing refers to them. A failure would only leave them
        // mapped and unused.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((start + map_len) as *mut libc::c_void, tail);
            }
        }
        let ptr = NonNull::new(start as *mut u8).ok_or(DatapathError::OutOfMemory(map_len))?;
        if huge {
            // Best effort: a failure (THP off or unsupported) leaves 4 KiB pages.
            // SAFETY: the range is the mapping we own; the advice changes no contents.
            let _ = unsafe { libc::madvise(ptr.as_ptr().cast(), map_len, libc::MADV_HUGEPAGE) };
        }
        // SAFETY: `ptr` points to the `map_len` octets mapped above; mlock only changes paging
        // (and faults the pages in, as zeros).
        let locked = unsafe { libc::mlock(ptr.as_ptr().cast(), map_len) } == 0;
        Ok(Self {
            ptr,
            len,
            map_len,
            locked,
        })
    }

    /// Length in bytes as requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `mlock` succeeded (it needs `CAP_IPC_LOCK` or a large enough `RLIMIT_MEMLOCK`).
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// Address of the first byte (what verbs calls the region's virtual address).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn clamp(&self, offset: usize, want: usize) -> usize {
        if offset >= self.len {
            0
        } else {
            want.min(self.len - offset)
        }
    }

    /// Copies `dst.len()` bytes from `offset`; bytes past the end are left untouched.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) {
        let n = self.clamp(offset, dst.len());
        if n == 0 {
            return;
        }
        fence(Ordering::Acquire);
        // SAFETY: `offset + n <= self.len` (clamped above), so the source range lies inside our
        // allocation; `dst` is a distinct, valid slice of at least `n` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), n);
        }
    }

    /// [`PinnedBuffer::read_at`] that also continues the CRC32c register `crc_state` over the
    /// copied octets in the same pass (the crate's one-pass copy + CRC routine): the CRC covers
    /// exactly what was written to `dst`, and `dst` is never read back. Octets of `dst` past the end of the
    /// buffer are left untouched and, as with the two-pass default of
    /// `RegionBuffer::read_at_crc`, go into the CRC as they are.
    pub fn read_at_crc(&self, offset: usize, dst: &mut [u8], crc_state: &mut u32) {
        let n = self.clamp(offset, dst.len());
        let (copied, rest) = dst.split_at_mut(n);
        if n > 0 {
            fence(Ordering::Acquire);
            // SAFETY: `offset + n <= self.len` (clamped above), so the source range lies inside
            // our allocation; `copied` is a distinct, valid slice of `n` bytes (no reference into
            // this buffer is ever handed out, so it cannot overlap the source).
            *crc_state = unsafe { copy_crc32c(self.ptr.as_ptr().add(offset), copied, *crc_state) };
        }
        *crc_state = crc_update(*crc_state, rest);
    }

    /// [`PinnedBuffer::read_at_crc`] that also returns the ones' complement sum of `dst` (as
    /// `tcp_engine::wire::Checksum::sum` gives it), computed by the same pass from the
    /// registers the octets are copied through (the TCP checksum's share of the payload).
    pub fn read_at_crc_sum(&self, offset: usize, dst: &mut [u8], crc_state: &mut u32) -> u16 {
        let n = self.clamp(offset, dst.len());
        let (copied, rest) = dst.split_at_mut(n);
        let mut sum = 0;
        if n > 0 {
            fence(Ordering::Acquire);
            // SAFETY: as in `read_at_crc`: `offset + n <= self.len`, `copied` is a distinct,
            // valid slice of `n` bytes that cannot overlap the source.
            (*crc_state, sum) =
                unsafe { copy_crc32c_sum(self.ptr.as_ptr().add(offset), copied, *crc_state) };
        }
        if !rest.is_empty() {
            *crc_state = crc_update(*crc_state, rest);
            let r = tcp_engine::wire::Checksum::new().add_bytes(rest).sum();
            // `rest` starts at offset `n` of `dst`: an odd start adds its sum byte-swapped.
            let r = if n % 2 == 1 { r.swap_bytes() } else { r };
            sum = tcp_engine::wire::Checksum::new()
                .add_sum(sum)
                .add_sum(r)
                .sum();
        }
        sum
    }

    /// Asks the CPU to bring `[offset, offset + len)` (clamped to the buffer) into its cache
    /// (x86-64 `prefetcht0` per cache line); reads nothing, does nothing elsewhere.
    pub fn prefetch(&self, offset: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let n = self.clamp(offset, len);
            let mut k = 0;
            while k < n {
                // SAFETY: `offset + k < self.len` (clamped above), so the address lies inside our
                // allocation; a prefetch never faults and neither reads nor writes memory
                // visibly, and SSE (which defines it) is part of the x86-64 baseline.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(self.ptr.as_ptr().add(offset + k).cast()) };
                k += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (offset, len);
    }

    /// Copies `src` to `offset`; bytes that would fall past the end are dropped.
    pub fn write_at(&self, offset: usize, src: &[u8]) {
        let n = self.clamp(offset, src.len());
        if n == 0 {
            return;
        }
        // SAFETY: `offset + n <= self.len` (clamped above), so the destination range lies inside
        // our allocation; `src` is a valid slice of at least `n` bytes that cannot overlap it
        // (no reference into this buffer is ever handed out).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), n);
        }
        fence(Ordering::Release);
    }

    /// Reads one byte with volatile semantics, for polling memory that a remote peer writes
    /// (perftest's latency tests wait for the last byte of a message this way).
    pub fn read_volatile(&self, offset: usize) -> Option<u8> {
        if offset >= self.len {
            return None;
        }
        // SAFETY: `offset < self.len`, inside our allocation; u8 has no alignment requirement.
        let v = unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(offset)) };
        fence(Ordering::Acquire);
        Some(v)
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`map_len` are exactly the mapping `new` kept; nothing else refers to
        // the buffer once the last owner drops it. Unmapping also unlocks the pages.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.map_len);
        }
    }
}

/// The buffer type the registration table holds: a shared handle to pinned bytes.
#[derive(Clone)]
pub struct RegionMemory(pub(crate) Arc<PinnedBuffer>);

impl RegionBuffer for RegionMemory {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        self.0.read_at(offset, dst)
    }
    fn read_at_crc(&self, offset: usize, dst: &mut [u8], crc_state: &mut u32) {
        self.0.read_at_crc(offset, dst, crc_state)
    }
    fn read_at_crc_sum(&self, offset: usize, dst: &mut [u8], crc_state: &mut u32) -> Option<u16> {
        Some(self.0.read_at_crc_sum(offset, dst, crc_state))
    }
    fn write_at(&self, offset: usize, src: &[u8]) {
        self.0.write_at(offset, src)
    }
    fn prefetch(&self, offset: usize, len: usize) {
        self.0.prefetch(offset, len)
    }
    fn share(&self) -> Option<rdmap::SharedBuffer> {
        // An `Arc` clone: an atomic increment, no allocation.
        Some(self.0.clone())
    }
}

impl RegionBuffer for PinnedBuffer {
    fn len(&self) -> usize {
        PinnedBuffer::len(self)
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        PinnedBuffer::read_at(self, offset, dst)
    }
    fn read_at_crc(&self, offset: usize, dst: &mut [u8], crc_state: &mut u32) {
        PinnedBuffer::read_at_crc(self, offset, dst, crc_state)
    }
    fn read_at_crc_sum(&self, offset: usize, dst: &mut [u8], crc_state: &mut u32) -> Option<u16> {
        Some(PinnedBuffer::read_at_crc_sum(self, offset, dst, crc_state))
    }
    fn write_at(&self, offset: usize, src: &[u8]) {
        PinnedBuffer::write_at(self, offset, src)
    }
    fn prefetch(&self, offset: usize, len: usize) {
        PinnedBuffer::prefetch(self, offset, len)
    }
}

/// The registration table shared by the application (register/deregister) and the engine
/// threads of the protection domain's queue pairs (lookups while placing). The engine takes the
/// lock once per batch of received bytes or transmitted ULPDUs, not per packet.
pub(crate) type SharedTable = Arc<Mutex<MemoryTable<RegionMemory>>>;

pub(crate) fn lock_table(t: &SharedTable) -> MutexGuard<'_, MemoryTable<RegionMemory>> {
    // A panic while holding the lock cannot leave the table half-updated in a way that breaks
    // memory safety (it only holds metadata), so recover from poisoning.
    t.lock().unwrap_or_else(|e| e.into_inner())
}

static NEXT_PD: AtomicU32 = AtomicU32::new(1);

/// A protection domain (RFC 5040 2.3, RFC 5042 5.2): memory regions and queue pairs of one PD
/// can reach each other; a remote access through a queue pair of another PD is refused.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) id: PdId,
    pub(crate) table: SharedTable,
}

impl Default for ProtectionDomain {
    fn default() -> Self {
        Self::new()
    }
}

impl ProtectionDomain {
    /// A new, empty protection domain.
    pub fn new() -> Self {
        let id = PdId(NEXT_PD.fetch_add(1, Ordering::Relaxed));
        Self {
            id,
            table: Arc::new(Mutex::new(MemoryTable::new())),
        }
    }

    /// The domain's identifier.
    pub fn id(&self) -> PdId {
        self.id
    }

    /// Allocates and registers `len` bytes of pinned memory with the given access rights.
    /// The region's tagged offset base (TO) is its virtual address, as with verbs.
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion, DatapathError> {
        let buf = Arc::new(PinnedBuffer::new(len)?);
        let base_to = buf.addr();
        let stag =
            lock_table(&self.table).register(self.id, RegionMemory(buf.clone()), base_to, access);
        Ok(MemoryRegion {
            stag,
            buf,
            access,
            pd: self.clone(),
        })
    }
}

/// A registered memory region: pinned bytes named by an [`Stag`]. Dropping it deregisters it.
pub struct MemoryRegion {
    stag: Stag,
    buf: Arc<PinnedBuffer>,
    access: Access,
    pd: ProtectionDomain,
}

impl MemoryRegion {
    /// The STag (index and key) that names this region locally and remotely.
    pub fn stag(&self) -> Stag {
        self.stag
    }
    /// The tagged offset of the first byte (the buffer's virtual address).
    pub fn base_to(&self) -> u64 {
        self.buf.addr()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// Access rights granted at registration.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Whether the pages are locked in RAM.
    pub fn is_pinned(&self) -> bool {
        self.buf.is_locked()
    }
    /// Copies bytes out of the region (bounds-checked; short reads past the end).
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.buf.read_at(offset, dst)
    }
    /// Copies bytes into the region (bounds-checked; bytes past the end are dropped).
    pub fn write(&self, offset: usize, src: &[u8]) {
        self.buf.write_at(offset, src)
    }
    /// Volatile read of one byte, for polling memory the peer writes.
    pub fn read_volatile(&self, offset: usize) -> Option<u8> {
        self.buf.read_volatile(offset)
    }
    /// A local scatter/gather element covering `len` bytes at `offset` of this region.
    pub fn sge(&self, offset: usize, len: u32) -> rdmap::Sge {
        rdmap::Sge {
            stag: self.stag,
            to: self.base_to().wrapping_add(offset as u64),
            len,
        }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let _ = lock_table(&self.pd.table).deregister(self.stag);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_of_a_huge_page_or_more_start_on_a_huge_page_boundary() {
        for len in [HUGE_PAGE, 3 * HUGE_PAGE + 5] {
            let b = PinnedBuffer::new(len).unwrap();
            assert_eq!(b.addr() % HUGE_PAGE as u64, 0, "{len}");
            b.write_at(len - 1, &[7]);
            assert_eq!(b.read_volatile(len - 1), Some(7));
        }
        let small = PinnedBuffer::new(HUGE_PAGE - PAGE).unwrap();
        assert_eq!(small.addr() % PAGE as u64, 0);
    }

    /// `AnonHugePages` of the process mapping that is exactly `[addr, addr + len)`
    /// (`/proc/self/smaps`); `None` if there is none (e.g. merged with a neighbour).
    fn huge_page_octets(addr: u64, len: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let header = format!("{:x}-{:x} ", addr, addr + len as u64);
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&header));
        lines.next()?;
        let kb = lines
            .take_while(|l| !l.split_whitespace().next().is_some_and(|w| w.contains('-')))
            .find_map(|l| l.strip_prefix("AnonHugePages:"))?;
        Some(
            kb.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()?
                * 1024,
        )
    }

    /// The buffer is advised before anything faults its pages in, so that transparent huge
    /// pages back it (an allocator's zeroing used to fault every page in at 4 KiB first).
    #[test]
    fn large_buffers_get_transparent_huge_pages() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !thp.contains("[always]") && !thp.contains("[madvise]") {
            eprintln!(
                "skipped: transparent huge pages are off here ({})",
                thp.trim()
            );
            return;
        }
        let len = 4 * HUGE_PAGE;
        let b = PinnedBuffer::new(len).unwrap();
        // Faulted in by `mlock`; touched as well in case `mlock` was refused.
        for at in (0..len).step_by(HUGE_PAGE) {
            b.write_at(at, &[1]);
        }
        let huge =
            huge_page_octets(b.addr(), len).expect("the buffer's mapping in /proc/self/smaps");
        assert!(
            huge >= HUGE_PAGE as u64,
            "{huge} octets of {len} on huge pages (THP: {})",
            thp.trim()
        );
        let mut out = [9u8; 3];
        b.read_at(HUGE_PAGE - 1, &mut out);
        assert_eq!(out, [0, 1, 0], "zeroed apart from what was written");
    }

    #[test]
    fn pinned_buffer_is_bounds_checked() {
        let b = PinnedBuffer::new(10).unwrap();
        b.write_at(8, &[1, 2, 3, 4]);
        let mut out = [9u8; 4];
        b.read_at(8, &mut out);
        assert_eq!(out, [1, 2, 9, 9]);
        b.write_at(100, &[1]);
        assert_eq!(b.read_volatile(9), Some(2));
        assert_eq!(b.read_volatile(10), None);
        assert_eq!(b.addr() % PAGE as u64, 0);
    }
}
