//! Registered memory: pinned, page-aligned buffers behind memory regions (RFC 5040 2.3 / RFC 5042
//! 5: a region is named by an STag, belongs to one protection domain and carries access rights).
//!
//! The protocol crate `rdmap` keeps the registration table ([`rdmap::MemoryTable`]); this module
//! owns the bytes. [`PinnedBuffer`] is the only place that touches them through raw pointers.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use std::time::{Duration, Instant};

use rdmap::{Access, MemoryTable, PdId, RegionBuffer, Stag};

use crate::turn::TransportTurn;
use crate::DatapathError;
use copy_crc::{copy_crc32c, copy_crc32c_sum, crc_update};

const PAGE: usize = 4096;
/// The x86-64 (and usual aarch64) transparent huge page size.
const HUGE_PAGE: usize = 2 << 20;

/// Zeroed, page-aligned memory of its own (an anonymous mapping), locked into RAM (`mlock`) when
/// the process may do so.
///
/// The engine thread writes into it (placement) and reads from it (transmit) while the
/// application may read and write it too: like any RDMA buffer, the application must not touch
/// bytes that a posted operation is using until that operation completes. All access goes through
/// bounds-checked copies, so no access can reach outside the buffer. The buffer is memory a
/// device writes (see the `Send` impl): copies from several threads into the same bytes at once,
/// whether the engine's, the application's or both, race and leave bytes of either, as with a
/// NIC's DMA.
pub struct PinnedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// Whose bytes these are.
    backing: Backing,
    /// The page-aligned range `mlock` locked (`None`: not locked).
    locked: Option<(usize, usize)>,
    /// `locked` given back already: by a hand-back, or at a raw region's deregistration
    /// ([`PinnedBuffer::release_borrowed_lock`]).
    lock_released: AtomicBool,
}

/// Where a [`PinnedBuffer`]'s bytes come from.
enum Backing {
    /// An anonymous mapping of our own, `map_len` octets (`len` rounded up to whole pages).
    Mapping { map_len: usize },
    /// The application's memory, named by pointer and length
    /// ([`ProtectionDomain::register_raw`]): its caller keeps it valid while the buffer lives.
    Borrowed,
    /// The application's buffer, owned until handed back ([`ProtectionDomain::register_buffer`]);
    /// a pointer from `Box::into_raw`, turned back into its box exactly once (hand-back or drop).
    Owned(NonNull<dyn RegionStorage>),
}

/// Memory an application can hand to [`ProtectionDomain::register_buffer`]: anything that is
/// a mutable byte slice whose bytes stay put while it is not touched (`Vec<u8>`, `Box<[u8]>`,
/// `memmap2::MmapMut`, ...). The bytes are taken once, at registration; the value itself is
/// touched again only to hand it back ([`MemoryRegion::into_buffer`]) or drop it.
pub trait RegionStorage: Send + 'static {
    /// The bytes the region covers.
    fn region_bytes(&mut self) -> &mut [u8];
    /// The value as `Any`, for [`MemoryRegion::into_buffer`].
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

impl<T: AsMut<[u8]> + Send + 'static> RegionStorage for T {
    fn region_bytes(&mut self) -> &mut [u8] {
        self.as_mut()
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// Whether registration locks a region's pages into RAM (`mlock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pinning {
    /// Lock them, or fail registration with [`DatapathError::PinFailed`] naming
    /// `RLIMIT_MEMLOCK` (the default: a page the kernel moves or swaps out under a transfer
    /// costs a fault on the engine's path).
    #[default]
    Required,
    /// Try to lock them; go on unlocked if the process may not (see
    /// [`MemoryRegion::is_pinned`]).
    BestEffort,
    /// Do not lock them.
    Off,
}

/// The soft `RLIMIT_MEMLOCK`, as text for an error message.
fn memlock_limit() -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into our local.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return "an unknown amount".into();
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("{} bytes", lim.rlim_cur)
    }
}

/// The pages this process locked for buffers, counted: `mlock` does not count (one `munlock`
/// undoes any number of `mlock`s of a page), and two buffers may share a page (two small heap
/// buffers, or regions the application registered over overlapping memory), so unlocking one
/// buffer's pages must leave locked those another buffer still covers.
static LOCKED_PAGES: Mutex<PageLocks> = Mutex::new(PageLocks::new());

/// How many buffers cover each page, as a step function over addresses: each key starts a run
/// of addresses up to the next key, all covered by its count of buffers; no run before the
/// first key or from the last key on (whose count is 0). Two keys per buffer at most, so each
/// change touches the runs within its range and a logarithmic search.
struct PageLocks {
    runs: std::collections::BTreeMap<usize, u32>,
}

impl PageLocks {
    const fn new() -> Self {
        Self {
            runs: std::collections::BTreeMap::new(),
        }
    }

    /// The count of the run `at` lies in.
    fn count_at(&self, at: usize) -> u32 {
        self.runs.range(..=at).next_back().map_or(0, |(_, c)| *c)
    }

    /// Makes `at` start a run (splitting the one it lies in).
    fn split(&mut self, at: usize) {
        if !self.runs.contains_key(&at) {
            let c = self.count_at(at);
            self.runs.insert(at, c);
        }
    }

    /// Drops the keys in `[start, end]` that begin a run of the same count as the run before
    /// them (and a leading run of 0), so that the map stays two keys per distinct range.
    fn merge(&mut self, start: usize, end: usize) {
        let keys: Vec<usize> = self.runs.range(start..=end).map(|(k, _)| *k).collect();
        for k in keys {
            let before = self.runs.range(..k).next_back().map_or(0, |(_, c)| *c);
            if self.runs.get(&k) == Some(&before) {
                self.runs.remove(&k);
            }
        }
    }

    /// One more buffer covers `[start, end)` (page-aligned).
    fn add(&mut self, start: usize, end: usize) {
        self.split(start);
        self.split(end);
        for (_, c) in self.runs.range_mut(start..end) {
            *c += 1;
        }
        self.merge(start, end);
    }

    /// One buffer fewer covers `[start, end)` (page-aligned; added before); the ranges no
    /// buffer covers any more, to unlock.
    fn remove(&mut self, start: usize, end: usize) -> Vec<(usize, usize)> {
        self.split(start);
        self.split(end);
        let mut free: Vec<(usize, usize)> = Vec::new();
        let mut iter = self.runs.range_mut(start..end).peekable();
        while let Some((&k, c)) = iter.next() {
            *c = c.saturating_sub(1);
            if *c == 0 {
                let run_end = iter.peek().map_or(end, |(&n, _)| n);
                match free.last_mut() {
                    Some(last) if last.1 == k => last.1 = run_end,
                    _ => free.push((k, run_end)),
                }
            }
        }
        self.merge(start, end);
        free
    }
}

/// The page counts, locked. Held across each `mlock` and its count, and across each release
/// and its `munlock`s: otherwise a page another thread's buffer has just counted (its `mlock`
/// a no-op, the page being locked) could be unlocked by a release that found it unused a
/// moment before.
fn page_locks() -> MutexGuard<'static, PageLocks> {
    LOCKED_PAGES.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer lets go of its locked range: the pages no other buffer covers are unlocked.
fn release_locked(start: usize, len: usize, unlock: bool) {
    let mut locks = page_locks();
    let free = locks.remove(start, start + len);
    if unlock {
        for (s, e) in free {
            // SAFETY: munlock changes paging only, never memory contents. The pages are those
            // `lock_pages` locked for a buffer still mapped: ours (unmapped after this), or the
            // caller's, which `from_raw`'s contract keeps mapped until the buffer drops and
            // `register_raw`'s until the region is deregistered, when its lock is given back
            // (`release_borrowed_lock`).
            unsafe { libc::munlock(s as *const libc::c_void, e - s) };
        }
    }
}

/// Locks the pages of `[addr, addr + len)` as `pinning` asks; the page-aligned range locked.
fn lock_pages(
    addr: usize,
    len: usize,
    pinning: Pinning,
) -> Result<Option<(usize, usize)>, DatapathError> {
    if pinning == Pinning::Off || len == 0 {
        return Ok(None);
    }
    let start = addr & !(PAGE - 1);
    let end = addr
        .checked_add(len)
        .and_then(|e| e.checked_next_multiple_of(PAGE))
        .ok_or(DatapathError::InvalidArgument(
            "the memory's range runs past the end of the address space",
        ))?;
    let mut locks = page_locks();
    // SAFETY: mlock only changes paging of the range (faulting its pages in); the caller's
    // memory covers `[addr, addr + len)`, and the rest of its first and last pages is mapped too.
    if unsafe { libc::mlock(start as *const libc::c_void, end - start) } == 0 {
        locks.add(start, end);
        return Ok(Some((start, end - start)));
    }
    drop(locks);
    let source = io::Error::last_os_error();
    match pinning {
        Pinning::Required => Err(DatapathError::PinFailed {
            len,
            limit: memlock_limit(),
            source,
        }),
        _ => Ok(None),
    }
}

// SAFETY: the buffer is plain bytes this value owns or that its creator promised stay valid
// while it lives (`from_raw`), plus, for an owned buffer, a `Send` value touched only when it is
// handed back or dropped (by whoever holds the last handle); every access of ours is a
// bounds-checked raw copy, and the only references into the bytes come from `unsafe` accessors
// whose callers take on the aliasing rules. So moving it or sharing it across threads cannot
// create dangling or out-of-bounds accesses. Concurrent use of the same bytes by the application
// and the engine is governed by the work-request rules documented above, as with any RDMA memory.
// What those rules do not exclude (the application polling a byte a peer's Write is placing,
// two connections placing overlapping Writes from two engine threads) is a data race in the
// Rust memory model, which has no notion of memory a device writes: we treat registered memory
// as such memory, accessed only through raw copies (never through references of ours), as every
// RDMA binding does; the values read are bytes that were written, in no promised order.
unsafe impl Send for PinnedBuffer {}
// SAFETY: see the `Send` impl: shared access only ever happens through bounds-checked copies
// (or the `unsafe` accessors, on their callers' guarantee).
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
        Self::allocate(len, Pinning::BestEffort)
    }

    /// [`PinnedBuffer::new`] with the pinning asked for.
    pub fn allocate(len: usize, pinning: Pinning) -> Result<Self, DatapathError> {
        let map_len = len
            .max(1)
            .div_ceil(PAGE)
            .checked_mul(PAGE)
            .ok_or(DatapathError::InvalidArgument("memory region too large"))?;
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
        let buffer = Self {
            ptr,
            len,
            backing: Backing::Mapping { map_len },
            locked: None,
            lock_released: AtomicBool::new(false),
        };
        // Faults the pages in (as zeros) after the advice above. On failure `buffer` unmaps.
        let mut buffer = buffer;
        buffer.locked = lock_pages(start, map_len, pinning)?;
        Ok(buffer)
    }

    /// The application's `len` bytes at `ptr`, locked as `pinning` asks.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, by this process's threads, from
    /// now until the buffer is dropped (and every clone of the `Arc` the region keeps it in is
    /// gone: the engine may still be reading it for a retransmission until the region is
    /// deregistered). Nothing else may free or unmap it meanwhile. While the buffer lives, the
    /// bytes are reached through raw pointers ([`PinnedBuffer::as_ptr`]) or the buffer's own
    /// copies, never through a Rust reference (`&[u8]`, `&mut [u8]`, a slice of the `Vec` they
    /// came from) alive while anything else may read or write them: a transport places into
    /// them and reads them at times the application does not see, and a reference promises
    /// the compiler that no such access happens. A slice of these bytes is never passed to the
    /// buffer's own copies (`read_at`, `write_at` and the like) either.
    pub unsafe fn from_raw(
        ptr: *mut u8,
        len: usize,
        pinning: Pinning,
    ) -> Result<Self, DatapathError> {
        let ptr = NonNull::new(ptr).ok_or(DatapathError::InvalidArgument("null pointer"))?;
        let locked = lock_pages(ptr.as_ptr() as usize, len, pinning)?;
        Ok(Self {
            ptr,
            len,
            backing: Backing::Borrowed,
            locked,
            lock_released: AtomicBool::new(false),
        })
    }

    /// The application's buffer, owned by the region until handed back
    /// ([`PinnedBuffer::into_storage`]) or dropped, locked as `pinning` asks.
    pub fn from_storage<S: RegionStorage>(
        storage: S,
        pinning: Pinning,
    ) -> Result<Self, DatapathError> {
        let owned: NonNull<dyn RegionStorage> =
            NonNull::from(Box::leak(Box::new(storage) as Box<dyn RegionStorage>));
        let raw = owned.as_ptr();
        // SAFETY: `raw` is the box leaked just above (rebuilt with `Box::from_raw` when the
        // buffer goes): valid and unaliased; the `&mut` is used only for its pointer and length
        // on the next line, and that pointer is the only way the bytes are reached afterwards
        // until the box is rebuilt.
        let bytes = unsafe { (*raw).region_bytes() };
        let (addr, len) = (bytes.as_mut_ptr(), bytes.len());
        let mut buffer = Self {
            ptr: NonNull::new(addr).unwrap_or(NonNull::dangling()),
            len,
            backing: Backing::Owned(owned),
            locked: None,
            lock_released: AtomicBool::new(false),
        };
        // On failure `buffer` drops the box.
        buffer.locked = lock_pages(addr as usize, len, pinning)?;
        Ok(buffer)
    }

    /// Hands an application's buffer back ([`PinnedBuffer::from_storage`]); `None` for memory
    /// that is not an owned buffer of type `S`.
    pub fn into_storage<S: RegionStorage>(mut self) -> Option<S> {
        let Backing::Owned(owned) = self.backing else {
            return None;
        };
        self.unlock();
        self.backing = Backing::Borrowed;
        // SAFETY: the pointer came from `Box::into_raw` and is rebuilt once: `backing` no longer
        // names it, so drop will not.
        let boxed = unsafe { Box::from_raw(owned.as_ptr()) };
        match boxed.into_any().downcast::<S>() {
            Ok(s) => Some(*s),
            // A different type: it is dropped here, as a drop of the region would.
            Err(_) => None,
        }
    }

    /// Lets go of the buffer's locked pages: those no other buffer covers are unlocked
    /// (`munlock`), unless `munmap` is about to (`unlock` false).
    fn release_pages(&self, unlock: bool) {
        if let Some((start, len)) = self.locked {
            if !self.lock_released.swap(true, Ordering::AcqRel) {
                release_locked(start, len, unlock);
            }
        }
    }

    fn unlock(&self) {
        self.release_pages(true);
    }

    /// Gives back the lock of the application's memory ([`PinnedBuffer::from_raw`]) now, while
    /// the memory is still the caller's to name: a region registered with
    /// [`ProtectionDomain::register_raw`] does so when it is deregistered, since its memory may
    /// be freed before the transports drop their last handle to the buffer (an engine's stale
    /// table), and a `munlock` then could unlock pages the range has been reused for. The
    /// transports' accesses meanwhile are unaffected (the pages may be paged out, no more).
    fn release_borrowed_lock(&self) {
        if matches!(self.backing, Backing::Borrowed) {
            self.unlock();
        }
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
        self.locked.is_some() && !self.lock_released.load(Ordering::Acquire)
    }

    /// Pointer to the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
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

    /// Copies `dst.len()` bytes from `offset`; bytes of `dst` past the end of the buffer (a
    /// call out of range, which callers check against: a clamp, not a path) are zeroed, so
    /// that a frame cut short never carries what it held before (another connection's octets).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) {
        let n = self.clamp(offset, dst.len());
        if let Some(rest) = dst.get_mut(n..) {
            rest.fill(0);
        }
        if n == 0 {
            return;
        }
        fence(Ordering::Acquire);
        // SAFETY: `offset + n <= self.len` (clamped above), so the source range lies inside our
        // allocation; `dst` is a valid slice of at least `n` bytes. `copy` (memmove) even if an
        // application broke the raw memory's contract and handed us a slice of these bytes.
        unsafe {
            std::ptr::copy(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), n);
        }
    }

    /// [`PinnedBuffer::read_at`] that also continues the CRC32c register `crc_state` over the
    /// copied octets in the same pass (the crate's one-pass copy + CRC routine): the CRC covers
    /// exactly what was written to `dst`, and `dst` is never read back. Octets of `dst` past the
    /// end of the buffer are zeroed (as [`PinnedBuffer::read_at`]) and go into the CRC so.
    pub fn read_at_crc(&self, offset: usize, dst: &mut [u8], crc_state: &mut u32) {
        let n = self.clamp(offset, dst.len());
        let (copied, rest) = dst.split_at_mut(n);
        rest.fill(0);
        if n > 0 {
            fence(Ordering::Acquire);
            // SAFETY: `offset + n <= self.len` (clamped above), so the source range lies inside
            // our allocation; `copied` is a distinct, valid slice of `n` bytes (references into
            // this buffer come only from `MemoryRegion::as_slice`/`as_mut_slice`, whose callers
            // promise that nothing of ours writes or reads through the buffer meanwhile, so a
            // slice we are handed does not overlap the range we copy).
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
        rest.fill(0);
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

    /// Whether the word at `offset` lies at a 64-bit aligned address (RFC 7306 5.2.1: an
    /// Atomic Request's TO must name a 64-bit aligned ULP buffer address).
    pub fn is_atomic_aligned(&self, offset: usize) -> bool {
        (self.ptr.as_ptr() as usize)
            .wrapping_add(offset)
            .is_multiple_of(std::mem::align_of::<AtomicU64>())
    }

    /// Performs `op` (RFC 7306 5.1) on the 64-bit word at `offset` with one CPU atomic
    /// read-modify-write (a compare-and-exchange loop) on the memory itself, in this host's
    /// byte order: atomic with respect to every other Atomic Operation from any connection and
    /// to the application's own atomic instructions on the same word (RFC 7306 5.3 asks for
    /// the first; sharing registered memory with the application needs the second). Not atomic
    /// with respect to plain accesses to the same bytes (RDMA Writes placed there, Reads of
    /// them, the application's plain loads and stores): RFC 7306 5 recommends not mixing them
    /// on a word used for atomics. Returns the original value.
    ///
    /// Errors: [`NotAtomic::Misaligned`](rdmap::memory::NotAtomic) if the word's address is
    /// not 8-aligned or it does not lie inside the buffer.
    pub fn atomic_at(
        &self,
        offset: usize,
        op: rdmap::wire::AtomicOp,
    ) -> Result<u64, rdmap::memory::NotAtomic> {
        if self.clamp(offset, 8) != 8 || !self.is_atomic_aligned(offset) {
            return Err(rdmap::memory::NotAtomic::Misaligned);
        }
        // SAFETY: the word's address is 8-aligned and its 8 bytes lie inside our allocation
        // (both checked above), which stays alive while `self` does. Concurrent accesses to
        // these bytes by other means are not excluded: like every access the transports make
        // to registered memory (`read_at`/`write_at` copy while the application may write), we
        // treat it as memory a device shares with the program, which the Rust memory model
        // does not describe; what holds is that every atomic access to the word (ours from any
        // engine thread, the application's) is a hardware atomic on it, so atomics never
        // interfere with each other. Plain accesses racing with them are the application's
        // choice, as with DMA.
        let word = unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast::<u64>()) };
        let mut current = word.load(Ordering::Acquire);
        loop {
            match word.compare_exchange_weak(
                current,
                op.apply(current),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(original) => return Ok(original),
                Err(now) => current = now,
            }
        }
    }

    /// Copies `src` to `offset`; bytes that would fall past the end are dropped.
    ///
    /// The last octet copied becomes visible to other threads after all the others: a
    /// thread that sees it (through [`PinnedBuffer::read_volatile`]) sees the whole write.
    /// This is the ordering perftest's latency tests, and applications that poll a message's
    /// last octet, rely on from RDMA NICs. (memmove alone may store a copy's first octets
    /// last; Intel SDM vol. 3A 9.2.4 likewise has order-dependent code store a discrete
    /// flag after a fast-string copy.)
    pub fn write_at(&self, offset: usize, src: &[u8]) {
        let n = self.clamp(offset, src.len());
        let Some(body) = n.checked_sub(1) else {
            return;
        };
        // SAFETY: `offset + n <= self.len` (clamped above), so the destination range lies inside
        // our allocation; `src` is a valid slice of at least `n` bytes. It may not alias these
        // bytes (a reference into this buffer comes only from the `unsafe` accessors and from
        // raw memory under `from_raw`'s contract, whose holders promise that nothing writes the
        // bytes behind it meanwhile); `copy` (memmove) keeps a broken promise from turning an
        // overlap into a wrong copy.
        unsafe {
            std::ptr::copy(src.as_ptr(), self.ptr.as_ptr().add(offset), body);
        }
        // SAFETY: `offset + body < self.len`, inside our allocation; a byte needs no
        // alignment. Other threads may access the byte meanwhile, and not only atomically (the
        // application polling it, another write's memmove, an Atomic Operation's 8-octet
        // word): outside `from_ptr`'s contract and the Rust memory model, as memory a NIC
        // writes by DMA is (see `atomic_at`); each access is one the hardware makes whole.
        let last = unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(offset + body)) };
        // Release: the copy above is visible before this store is.
        last.store(src[body], Ordering::Release);
        // And all of it before whatever the caller stores next (a completion).
        fence(Ordering::Release);
    }

    /// Reads one byte for polling memory that a remote peer writes (perftest's latency tests
    /// wait for the last byte of a message this way). The engine thread may be writing the
    /// byte meanwhile: as with memory a NIC writes by DMA, the value is one the byte held. A
    /// byte that was the last of a write (a placed segment's last octet) is read with
    /// Acquire: the rest of that write is visible once it is (see
    /// [`PinnedBuffer::write_at`]); and a Write's last octet is placed after every segment
    /// of the Write, even when they came out of order (`rdmap::PlacedEarly`).
    pub fn read_volatile(&self, offset: usize) -> Option<u8> {
        if offset >= self.len {
            return None;
        }
        // SAFETY: `offset < self.len`, inside our allocation; a byte needs no alignment.
        // Written concurrently, and not only atomically, as `write_at` says.
        let byte = unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(offset)) };
        Some(byte.load(Ordering::Acquire))
    }
}

impl PinnedBuffer {
    /// What the last owner's drop does: the pages' lock given back, the mapping unmapped or
    /// the application's storage dropped. Leaves a borrowed buffer with no lock behind, whose
    /// own drop then does nothing.
    fn release_now(&mut self) {
        match std::mem::replace(&mut self.backing, Backing::Borrowed) {
            Backing::Mapping { map_len } => {
                self.release_pages(false);
                // SAFETY: `ptr`/`map_len` are exactly the mapping `allocate` kept; nothing else
                // refers to the buffer once the last owner drops it, and the backing no longer
                // names it. Unmapping also unlocks.
                unsafe {
                    libc::munmap(self.ptr.as_ptr().cast(), map_len);
                }
            }
            Backing::Borrowed => self.unlock(),
            Backing::Owned(owned) => {
                self.unlock();
                // SAFETY: the pointer came from `Box::into_raw` and was not rebuilt
                // (`into_storage` replaces the backing when it does, as this did above):
                // rebuilt and dropped once.
                drop(unsafe { Box::from_raw(owned.as_ptr()) });
            }
        }
        self.locked = None;
    }

    /// The buffer's bytes and lock moved into a new value, this one left borrowed with no
    /// lock (its drop does nothing).
    fn take_carcass(&mut self) -> PinnedBuffer {
        PinnedBuffer {
            ptr: self.ptr,
            len: self.len,
            backing: std::mem::replace(&mut self.backing, Backing::Borrowed),
            locked: self.locked.take(),
            lock_released: AtomicBool::new(*self.lock_released.get_mut()),
        }
    }
}

/// Hands `buffer` to the thread that releases buffers whose last handle went on a transport's
/// thread (started at the first); gives it back if there is none to be had.
fn release_elsewhere(buffer: PinnedBuffer) -> Result<(), PinnedBuffer> {
    /// The releasing thread's inbox; `None` until one runs (tried again at each release
    /// while none could be started).
    static RELEASER: Mutex<Option<std::sync::mpsc::Sender<PinnedBuffer>>> = Mutex::new(None);
    let mut releaser = RELEASER.lock().unwrap_or_else(|e| e.into_inner());
    if releaser.is_none() {
        let (tx, rx) = std::sync::mpsc::channel::<PinnedBuffer>();
        let started = std::thread::Builder::new()
            .name("iwarp-mem-release".into())
            .spawn(move || {
                for buffer in rx {
                    // An application's storage whose drop panics takes only itself down.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        drop(buffer);
                    }));
                }
            });
        if started.is_ok() {
            *releaser = Some(tx);
        }
    }
    match releaser.as_ref() {
        Some(tx) => tx.send(buffer).map_err(|back| back.0),
        None => Err(buffer),
    }
}

impl Drop for PinnedBuffer {
    /// On a transport's thread ([`TransportTurn`], an engine thread whose stale table view held
    /// the last handle of a region the application dropped), a buffer of ours or of the
    /// application's storage is released on another thread: unmapping a large region takes
    /// time, the page-lock count waits while another thread's registration locks its pages
    /// (`lock_pages` holds it across the `mlock`), and the storage's drop is the
    /// application's code; the connections that thread serves wait for none of it. Borrowed
    /// memory is released here: its caller may free it once the buffer is gone.
    fn drop(&mut self) {
        if !matches!(self.backing, Backing::Borrowed) && TransportTurn::is_in() {
            if let Err(mut carcass) = release_elsewhere(self.take_carcass()) {
                carcass.release_now();
            }
            return;
        }
        self.release_now();
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
    fn atomic_at(
        &self,
        offset: usize,
        op: rdmap::wire::AtomicOp,
    ) -> Result<u64, rdmap::memory::NotAtomic> {
        self.0.atomic_at(offset, op)
    }
    fn is_atomic_aligned(&self, offset: usize) -> bool {
        self.0.is_atomic_aligned(offset)
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
    fn atomic_at(
        &self,
        offset: usize,
        op: rdmap::wire::AtomicOp,
    ) -> Result<u64, rdmap::memory::NotAtomic> {
        PinnedBuffer::atomic_at(self, offset, op)
    }
    fn is_atomic_aligned(&self, offset: usize) -> bool {
        PinnedBuffer::is_atomic_aligned(self, offset)
    }
    fn prefetch(&self, offset: usize, len: usize) {
        PinnedBuffer::prefetch(self, offset, len)
    }
}

/// A protection domain's registration table, shared by the application (registration) and the
/// transports (lookups while placing and transmitting, invalidation by a peer's Send with
/// Invalidate).
///
/// Read-copy-update: the transports read the current version through [`RegionTable::snapshot`]
/// (`arc_swap`: an atomic load and a reference count, never a lock, never waiting for a
/// registration), once per engine turn or socket batch; the application's changes
/// ([`RegionTable::update`]) copy the table, change the copy and publish it, serialised among
/// themselves by a mutex that only registration takes. Invalidation state is shared between
/// versions (see [`MemoryTable`]), so a peer's invalidation through a snapshot holds in every
/// version. A region leaves a transport's reach once no snapshot holding it is in use: the
/// buffer stays alive until then (`Arc`), so a transfer in flight never touches freed memory.
pub(crate) struct RegionTable {
    current: ArcSwap<MemoryTable<RegionMemory>>,
    /// Bumped after each publication: a reader compares it with the version it holds (one
    /// load) before it reads the table again.
    version: AtomicU64,
    writer: Mutex<()>,
}

/// A table version a transport holds, with its number ([`RegionTable::versioned`]).
pub(crate) struct TableVersion {
    pub(crate) version: u64,
    pub(crate) table: TableSnapshot,
}

pub(crate) type SharedTable = Arc<RegionTable>;

/// 64 bits from the kernel's random source: `getrandom(2)` (which blocks only before the pool
/// is first initialised at boot; tried again when a signal interrupts it), else `/dev/urandom`
/// (a sandbox that refuses the system call). Should both fail, the clock mixed with the address
/// space, which a peer could narrow down: said in the log.
pub(crate) fn random_u64() -> u64 {
    let mut v = 0u64;
    for _ in 0..8 {
        // SAFETY: getrandom writes at most 8 octets into our local u64.
        let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
        if n == 8 {
            return v;
        }
        if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
    }
    let mut octets = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut octets))
        .is_ok()
    {
        return u64::from_ne_bytes(octets);
    }
    tracing::warn!(
        "no random source (getrandom and /dev/urandom failed): STags and connection \
         identifiers are keyed by the clock, which a peer could narrow down"
    );
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (&v as *const u64 as u64).rotate_left(32)
}

/// The table version a transport reads.
pub(crate) type TableSnapshot = Arc<MemoryTable<RegionMemory>>;

impl RegionTable {
    /// An empty table whose STags a peer cannot predict (RFC 5042 6.1.1): keyed by a secret
    /// from the kernel's random source.
    pub(crate) fn new() -> Self {
        RegionTable {
            current: ArcSwap::from_pointee(MemoryTable::with_secret(random_u64())),
            version: AtomicU64::new(0),
            writer: Mutex::new(()),
        }
    }

    /// The current version (lock-free).
    pub(crate) fn snapshot(&self) -> TableSnapshot {
        self.current.load_full()
    }

    /// The current version with its number (the number read first: the table is at least
    /// that new).
    pub(crate) fn versioned(&self) -> TableVersion {
        let version = self.version.load(Ordering::Acquire);
        TableVersion {
            version,
            table: self.current.load_full(),
        }
    }

    /// Whether a change was published since `held` was read (one atomic load).
    pub(crate) fn changed_since(&self, held: &TableVersion) -> bool {
        self.version.load(Ordering::Acquire) != held.version
    }

    /// Applies `change` to a copy of the current version and publishes the copy. O(regions);
    /// registration is not on any per-packet path.
    pub(crate) fn update<R>(&self, change: impl FnOnce(&mut MemoryTable<RegionMemory>) -> R) -> R {
        // A panic in a change leaves the published version as it was: recover from poisoning.
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = MemoryTable::clone(&self.current.load());
        let out = change(&mut next);
        self.current.store(Arc::new(next));
        self.version.fetch_add(1, Ordering::Release);
        out
    }

    /// Holds off registration changes while the guard lives (for tests that show the
    /// transports never wait for them).
    pub(crate) fn hold_writer(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }
}

static NEXT_PD: AtomicU32 = AtomicU32::new(1);

/// A protection domain (RFC 5040 2.3, RFC 5042 2.2.4; `ibv_alloc_pd`): memory regions and queue
/// pairs of one PD can reach each other; a remote access through a queue pair of another PD is
/// refused. Cloning gives another handle to the same domain.
///
/// A region's STag is valid on every connection of its domain (there are no memory windows):
/// give a peer that must not reach the other connections' regions a domain of its own (RFC
/// 5042 6.1.1, 6.4.5).
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) id: PdId,
    pub(crate) table: SharedTable,
    /// How this handle's registrations lock their pages.
    pinning: Pinning,
    /// Octets the API copied into or out of this domain's regions ([`MemoryRegion::read`],
    /// [`MemoryRegion::write`]): the copies an application makes when it does not use the
    /// bytes in place.
    copied: Arc<AtomicU64>,
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
            table: Arc::new(RegionTable::new()),
            pinning: Pinning::Required,
            copied: Arc::new(AtomicU64::new(0)),
        }
    }

    /// This handle with registrations that lock their pages as `pinning` says (the default is
    /// [`Pinning::Required`]). The domain itself is the same.
    pub fn with_pinning(mut self, pinning: Pinning) -> Self {
        self.pinning = pinning;
        self
    }

    /// The domain's identifier.
    pub fn id(&self) -> PdId {
        self.id
    }

    /// Holds off registration changes of this domain (register, deregister, re-register)
    /// while the guard lives. For tests that show the transports never wait for the
    /// registration lock: transfers complete while it is held.
    #[doc(hidden)]
    pub fn hold_registrations(&self) -> impl Drop + '_ {
        self.table.hold_writer()
    }

    /// How many handles on this domain's registration table there are: the application's
    /// (this one, its clones, its regions') and the transports' (a connection of the domain,
    /// an engine serving one). For tests that show a transport lets go of a domain.
    #[doc(hidden)]
    pub fn table_holders(&self) -> usize {
        Arc::strong_count(&self.table)
    }

    /// Octets copied so far by [`MemoryRegion::read`] and [`MemoryRegion::write`] on this
    /// domain's regions (transfers that place and send in place leave it unchanged).
    pub fn copied_bytes(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    /// Allocates and registers `len` zeroed bytes with the given access rights (remote write
    /// or atomic rights need [`Access::LOCAL_WRITE`] too, as with `ibv_reg_mr`:
    /// [`DatapathError::InvalidArgument`] otherwise, as for every registration): an anonymous
    /// mapping of its own, page-aligned (2 MiB-aligned from 2 MiB up, advised
    /// `MADV_HUGEPAGE`), locked per [`ProtectionDomain::with_pinning`]. The region's tagged
    /// offset base (TO) is its virtual address, as with verbs.
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion, DatapathError> {
        check_access(access)?;
        self.register_pinned(PinnedBuffer::allocate(len, self.pinning)?, access)
    }

    /// Registers the application's own buffer (`ibv_reg_mr` on memory the region then owns):
    /// a `Vec<u8>`, a `Box<[u8]>`, a `memmap2::MmapMut` of a file or of huge pages, ... The
    /// engine places into these very bytes and transmits from them, with no copy; reach them
    /// with [`MemoryRegion::as_ptr`] and the slice accessors. [`MemoryRegion::into_buffer`]
    /// deregisters and hands the buffer back. The TO base is the bytes' virtual address.
    /// Rights as [`ProtectionDomain::register`] takes them (refused: the buffer is dropped).
    pub fn register_buffer<S: RegionStorage>(
        &self,
        buffer: S,
        access: Access,
    ) -> Result<MemoryRegion, DatapathError> {
        check_access(access)?;
        self.register_pinned(PinnedBuffer::from_storage(buffer, self.pinning)?, access)
    }

    /// Registers `len` bytes of the application's memory at `addr` (`ibv_reg_mr(pd, addr, len,
    /// access)`). The TO base is `addr`. Rights as [`ProtectionDomain::register`] takes them.
    ///
    /// # Safety
    /// `addr` must be valid for reads and writes of `len` bytes until the region is
    /// deregistered and the transports are done with it: [`MemoryRegion::deregister`]
    /// returning `Ok` says both (`ibv_dereg_mr`), as does a [`Deregistration`]
    /// ([`MemoryRegion::start_deregister`]) that said it was released, once it is dropped.
    /// Dropping a region instead deregisters it at once but says nothing of when the
    /// transports are done: an engine turn under way may still place a peer's Write with the
    /// table it read before the drop, on any queue pair of the protection domain (a peer may
    /// use a region's STag on any of them), and a Read Response holds its source until
    /// acknowledged. So after a drop the memory must stay valid until every queue pair of the
    /// protection domain has finished ([`crate::QpStatus::finished`], or
    /// [`crate::QueuePair::wait_finished`] returned true): free raw memory after
    /// `deregister`, not after a drop. Nothing else may free or unmap the memory meanwhile.
    /// While registered, the bytes are reached through raw pointers (`addr`,
    /// [`MemoryRegion::as_ptr`]), the region's copies ([`MemoryRegion::read`],
    /// [`MemoryRegion::write`]) or its `unsafe` slice accessors on their terms, never through
    /// another Rust reference (a slice of the `Vec` the address came from, say) alive while a
    /// transport may read or write them (a posted work request uses them, a peer may write or
    /// read them), and a slice of them is never given to the region's own `read` or `write`.
    /// The pages' lock (`mlock`) is given back when the region is deregistered (or dropped).
    pub unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, DatapathError> {
        check_access(access)?;
        // SAFETY: the caller's promise, passed on.
        let buf = unsafe { PinnedBuffer::from_raw(addr, len, self.pinning)? };
        self.register_pinned(buf, access)
    }

    fn register_pinned(
        &self,
        buf: PinnedBuffer,
        access: Access,
    ) -> Result<MemoryRegion, DatapathError> {
        let buf = Arc::new(buf);
        let base_to = buf.addr();
        let stag = self
            .table
            .update(|t| t.try_register(self.id, RegionMemory(buf.clone()), base_to, access))
            .map_err(|_| DatapathError::RegionTableFull)?;
        Ok(MemoryRegion {
            stag,
            buf,
            access,
            pd: self.clone(),
        })
    }
}

/// `ibv_reg_mr`'s (and `ibv_rereg_mr`'s) rule on rights: remote write or atomic access needs
/// local write (verbs fails with `EINVAL`): memory the peer may change is memory the local
/// side may change.
fn check_access(access: Access) -> Result<(), DatapathError> {
    let peer_writes =
        access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
    if peer_writes && !access.contains(Access::LOCAL_WRITE) {
        return Err(DatapathError::InvalidArgument(
            "remote write or atomic access needs LOCAL_WRITE too (as ibv_reg_mr)",
        ));
    }
    Ok(())
}

/// How long [`MemoryRegion::into_buffer`] waits for a transport to let go of the bytes.
const HAND_BACK_WAIT: Duration = Duration::from_secs(1);

/// How long [`MemoryRegion::deregister`] waits for the transports to let go of the bytes: a
/// Read Response holds them until the peer acknowledges it, which on a lossy path takes
/// retransmissions (as long as `QueuePair::disconnect` waits for a close).
const DEREGISTER_WAIT: Duration = Duration::from_secs(10);

/// Waits until `buf` is the only handle to its bytes (the region was deregistered: the
/// transports reach them only through handles they took before), up to `deadline`. The
/// AF_XDP engine reads its tables again even when idle (a turn at least every
/// `XdpTcpConfig::max_wait` while it has connections, 50 ms without, or when its parked
/// thread wakes), the socket transport holds a table only while it handles one event, and a
/// Read Response holds its source until acknowledged.
fn sole_handle(
    mut buf: Arc<PinnedBuffer>,
    deadline: Instant,
) -> Result<PinnedBuffer, DatapathError> {
    loop {
        match Arc::try_unwrap(buf) {
            Ok(p) => return Ok(p),
            Err(b) if Instant::now() < deadline => {
                buf = b;
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(_) => return Err(DatapathError::RegionInUse),
        }
    }
}

/// A registered memory region (`ibv_mr`): bytes named by an [`Stag`]. Dropping it deregisters
/// it.
///
/// **Access to the bytes.** The engine writes into a region when a peer's Write, a Read
/// Response or a Send lands in it, and reads it to transmit, at times the application does not
/// see. As with any RDMA memory, the application must not touch bytes that a posted work
/// request uses until it completes, nor bytes a peer may write (a region with
/// [`Access::REMOTE_WRITE`] advertised to it) unless its own protocol says the peer is done.
/// [`MemoryRegion::read`] and [`MemoryRegion::write`] copy and are always safe;
/// [`MemoryRegion::as_ptr`] gives the address for the application's own access;
/// [`MemoryRegion::as_slice`] and [`MemoryRegion::as_mut_slice`] are `unsafe` because Rust
/// requires that nothing writes the bytes behind a `&[u8]` (nor touches those behind a
/// `&mut [u8]`) while it lives, which only the application's protocol can guarantee.
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
    /// Access rights granted at registration (or at the last re-registration).
    pub fn access(&self) -> Access {
        self.access
    }
    /// Whether the pages are locked in RAM.
    pub fn is_pinned(&self) -> bool {
        self.buf.is_locked()
    }
    /// The address of the first byte: the application's own access to the bytes the engine
    /// places into and sends from (see the type's documentation for when that is allowed).
    pub fn as_ptr(&self) -> *mut u8 {
        self.buf.as_ptr()
    }
    /// The region's bytes as a slice, without a copy.
    ///
    /// # Safety
    /// While the slice lives nothing may write the bytes: no posted receive, Read sink or
    /// Write/Read Response from the peer may land in them (see the type's documentation). A
    /// region registered with `REMOTE_WRITE` can be written by its peer at any time, whatever
    /// the peer said: `invalidate` and `reregister` let a Write checked just before them
    /// land after, so only [`MemoryRegion::deregister`] ends that; read such a region with
    /// [`MemoryRegion::read`] unless the peer is trusted.
    pub unsafe fn as_slice(&self) -> &[u8] {
        fence(Ordering::Acquire);
        // SAFETY: the pointer and length describe the region's memory, valid while `self`
        // lives; the caller guarantees nothing writes it while the slice lives.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr(), self.buf.len()) }
    }
    /// The region's bytes as a mutable slice, without a copy.
    ///
    /// # Safety
    /// While the slice lives nothing else may read or write the bytes: no work request of the
    /// application's that uses them may be outstanding, no peer may write or read them (a
    /// peer's RDMA Read is answered from the region, and a Read Response's octets are read
    /// again for a retransmission until the peer acknowledges them: only
    /// [`MemoryRegion::deregister`] says when that has ended), and no other slice of them may
    /// exist.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, and the caller guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_ptr(), self.buf.len()) }
    }
    /// Copies bytes out of the region (bounds-checked; short reads past the end). Counted in
    /// [`ProtectionDomain::copied_bytes`].
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.pd
            .copied
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        self.buf.read_at(offset, dst)
    }
    /// Copies bytes into the region (bounds-checked; bytes past the end are dropped). Counted
    /// in [`ProtectionDomain::copied_bytes`].
    pub fn write(&self, offset: usize, src: &[u8]) {
        self.pd
            .copied
            .fetch_add(src.len() as u64, Ordering::Relaxed);
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

    /// Re-registers the region under a new STag key (RFC 5042 6.3.3; `ibv_rereg_mr` with new
    /// access): the old STag stops working at once (locally and for the peer), an invalidated
    /// region becomes valid again, and the rights become `access` (narrowed or widened). The
    /// new STag is returned and from then on given by [`MemoryRegion::stag`].
    ///
    /// "At once": every access checked after the call fails. One a transport thread checked
    /// just before it (the placement of one DDP segment, or the fill of one Read Response FPDU,
    /// as on siw) may still finish after the call returns; [`MemoryRegion::deregister`] is the
    /// call that waits until no transport touches the bytes.
    pub fn reregister(&mut self, access: Access) -> Result<Stag, DatapathError> {
        check_access(access)?;
        let (pd, base_to) = (self.pd.id, self.base_to());
        let stag = self
            .pd
            .table
            .update(|t| t.reregister(self.stag, pd, base_to, access))
            .map_err(|_| DatapathError::InvalidArgument("the region is no longer registered"))?;
        self.stag = stag;
        self.access = access;
        Ok(stag)
    }

    /// Invalidates the region's STag locally (verbs' Local Invalidate, RFC 5040 5.3's
    /// invalidation done by the owner), whatever its rights and however many connections
    /// share its protection domain (RFC 5040 8.1.1 rule 7 limits the peer, not the owner):
    /// every access through it fails from now on until [`MemoryRegion::reregister`] gives it
    /// a new key (an access a transport thread checked just before the call may still finish,
    /// as [`MemoryRegion::reregister`] says). Fails only if it is invalid already.
    pub fn invalidate(&self) -> Result<(), DatapathError> {
        self.pd
            .table
            .snapshot()
            .invalidate(self.stag, self.pd.id)
            .map_err(|_| DatapathError::InvalidArgument("the STag is invalidated already"))
    }

    /// Whether the STag is valid (registered with its current key and not invalidated).
    pub fn is_valid(&self) -> bool {
        self.pd
            .table
            .snapshot()
            .info(self.stag)
            .is_some_and(|i| i.valid)
    }

    /// Deregisters the region and hands back the buffer given to
    /// [`ProtectionDomain::register_buffer`] (as type `S`). A transport may still hold the
    /// bytes for a transfer in flight: this waits up to a second for it to let go, then fails
    /// with [`DatapathError::RegionInUse`] (the buffer is then freed when the transport lets
    /// go). Fails with [`DatapathError::InvalidArgument`] for a region of another kind or type
    /// (the buffer is dropped).
    pub fn into_buffer<S: RegionStorage>(self) -> Result<S, DatapathError> {
        let buf = self.buf.clone();
        // Deregisters: the transports reach the bytes only through `Arc` clones from now on.
        drop(self);
        let pinned = sole_handle(buf, Instant::now() + HAND_BACK_WAIT)?;
        pinned.into_storage().ok_or(DatapathError::InvalidArgument(
            "the region does not own a buffer of that type",
        ))
    }

    /// Deregisters the region and waits until no transport uses its bytes (`ibv_dereg_mr`):
    /// when it returns `Ok`, nothing reads or writes them any more, so memory given to
    /// [`ProtectionDomain::register_raw`] may be freed (and a region's own buffer has been,
    /// or, called on a transport's thread such as in a hook, is being, on a thread of its
    /// own).
    /// Accesses by a peer from then on fail as those of an unknown STag (RFC 5040 2.1), from
    /// the transport's next look at the table (an engine turn in progress when this is called
    /// may still place a segment it checked before; the wait covers it), Read Requests
    /// already received but not yet answered included: deregister a region a
    /// peer reads only once its Reads are done, or its connection ends in a Terminate.
    /// Waits up to 10 s (a Read Response holds its source until the peer acknowledges it),
    /// then fails with [`DatapathError::RegionInUse`]: the region is deregistered all the
    /// same, but a transfer still holds the bytes, so raw memory must then live until every
    /// queue pair of the protection domain has finished. To be able to wait again (verbs'
    /// `ibv_dereg_mr` failing with `EBUSY` and called again), use
    /// [`MemoryRegion::start_deregister`].
    pub fn deregister(self) -> Result<(), DatapathError> {
        self.deregister_within(DEREGISTER_WAIT)
    }

    /// [`MemoryRegion::deregister`], waiting up to `wait`.
    fn deregister_within(self, wait: Duration) -> Result<(), DatapathError> {
        if self.start_deregister().wait(wait) {
            Ok(())
        } else {
            Err(DatapathError::RegionInUse)
        }
    }

    /// Deregisters the region now and returns what waits for the transports to let go of its
    /// bytes ([`Deregistration::wait`], as often as needed): peers' accesses fail from now
    /// on (from the transport's next look at the table), as [`MemoryRegion::deregister`]
    /// says. Until the [`Deregistration`] says the bytes are released, a transport may still
    /// read them: a Read Response queued or resent from the region sends what they hold
    /// then, including what the application wrote after this call (invalidate the region
    /// first, [`MemoryRegion::invalidate`], to stop a queued Read Response at once: its
    /// connection is reset).
    pub fn start_deregister(self) -> Deregistration {
        let buf = self.buf.clone();
        // Deregisters: the transports reach the bytes only through `Arc` clones from now on.
        drop(self);
        Deregistration { buf }
    }
}

/// A deregistered region whose bytes a transport may still hold
/// ([`MemoryRegion::start_deregister`]). Holding it keeps the bytes of a region that owned
/// its buffer; raw memory ([`ProtectionDomain::register_raw`]) may be freed once
/// [`Deregistration::wait`] or [`Deregistration::is_released`] has said true and the
/// `Deregistration` is dropped (the pages' lock, `munlock`, was given back at the
/// deregistration; for a region's own buffer, at the drop).
pub struct Deregistration {
    buf: Arc<PinnedBuffer>,
}

impl Deregistration {
    /// Waits up to `timeout` until no transport holds the bytes; true when none does (then
    /// nothing reads or writes them any more). A Read Response holds its source until the
    /// peer acknowledges it, a queue pair that ended holds nothing.
    pub fn wait(&self, timeout: Duration) -> bool {
        crate::verbs::timeout::poll_until(timeout, Duration::from_micros(200), || {
            self.is_released()
        })
    }

    /// True when no transport holds the bytes any more (this handle alone has them).
    pub fn is_released(&self) -> bool {
        if Arc::strong_count(&self.buf) != 1 {
            return false;
        }
        // The count's load is relaxed: order the last holder's accesses (released by its
        // drop's decrement) before whatever the caller does with the memory next.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        true
    }
}

impl std::fmt::Debug for Deregistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deregistration")
            .field("released", &self.is_released())
            .finish()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let stag = self.stag;
        let _ = self.pd.table.update(|t| t.deregister(stag));
        self.buf.release_borrowed_lock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer whose last handle goes on a transport's thread (an engine thread's stale table
    /// view) is released on another thread: the drop returns while the page-lock count is
    /// held elsewhere (as a registration holds it across its `mlock`), and the pages are given
    /// back once it is free.
    #[test]
    fn a_buffer_dropped_on_a_transport_thread_is_released_elsewhere() {
        let buffer = PinnedBuffer::new(64 * 1024).expect("buffer");
        if !buffer.is_locked() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "mlock refused under CI"
            );
            testbed::skipped("mlock refused (not root, small RLIMIT_MEMLOCK)");
            return;
        }
        let start = buffer.addr() as usize;
        let held = page_locks();
        let (tx, rx) = std::sync::mpsc::channel();
        let engine = std::thread::spawn(move || {
            let _turn = TransportTurn::enter();
            let began = Instant::now();
            drop(buffer);
            let _ = tx.send(began.elapsed());
        });
        let took = rx
            .recv_timeout(Duration::from_secs(2))
            .expect("the drop waited for the page-lock count");
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert!(held.count_at(start) > 0, "released under the held count");
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(10);
        while page_locks().count_at(start) > 0 {
            assert!(Instant::now() < deadline, "the pages were never given back");
            std::thread::sleep(Duration::from_millis(1));
        }
        engine.join().expect("the transport thread");
    }

    /// perftest's latency tests (and applications like them) poll a message's last octet and
    /// then use the whole message: a write's last octet must not show before the rest. memmove
    /// may store a copy's first octets after its last ones (glibc's vector copies load the
    /// head first and store it last in one of their two directions), so without the ordering
    /// the head read here is now and then the previous message's. The rounds alternate
    /// between a source in a heap chunk and one in its own mapping, on either side of the
    /// destination, so that both directions are taken wherever the allocator puts them.
    #[test]
    fn a_write_is_whole_once_its_last_octet_shows() {
        const LEN: usize = 1024;
        const ROUNDS: u32 = 300_000;
        let mut sources = [vec![0u8; LEN + 8], vec![0u8; 1 << 20]];
        let b = PinnedBuffer::new(LEN).unwrap();
        let acked = AtomicU32::new(0);
        let torn = AtomicU32::new(0);
        let give_up = Instant::now() + Duration::from_secs(20);
        // A spin that yields now and then (the two threads may share a core) and ends at
        // `give_up` (false then).
        let spin_until = |done: &dyn Fn() -> bool| {
            let mut spins = 0u32;
            while !done() {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1024) {
                    if Instant::now() > give_up {
                        return false;
                    }
                    std::thread::yield_now();
                }
                std::hint::spin_loop();
            }
            true
        };
        let stamp = |k: u32| (k % 255 + 1) as u8;
        let rounds = std::thread::scope(|s| {
            s.spawn(|| {
                let mut head = [0u8; 64];
                for k in 1..=ROUNDS {
                    if !spin_until(&|| b.read_volatile(LEN - 1) == Some(stamp(k))) {
                        return;
                    }
                    b.read_at(0, &mut head);
                    if head.iter().any(|&x| x != stamp(k)) {
                        torn.fetch_add(1, Ordering::Relaxed);
                    }
                    acked.store(k, Ordering::Release);
                }
            });
            for k in 1..=ROUNDS {
                // Unaligned, as a payload behind its headers is.
                let msg = &mut sources[k as usize % 2][5..5 + LEN];
                msg.fill(stamp(k));
                b.write_at(0, msg);
                if !spin_until(&|| acked.load(Ordering::Acquire) >= k) {
                    return k - 1;
                }
            }
            ROUNDS
        });
        assert!(rounds > 0, "the poller never saw a write");
        assert_eq!(
            torn.load(Ordering::Relaxed),
            0,
            "of {rounds} writes, these showed their last octet before their first"
        );
    }

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
    fn an_application_buffer_is_registered_in_place_and_handed_back() {
        let pd = ProtectionDomain::new().with_pinning(Pinning::BestEffort);
        let mut v = vec![0u8; 10_000];
        v[9_999] = 5;
        let addr = v.as_ptr() as u64;
        let mr = pd.register_buffer(v, Access::LOCAL_WRITE).unwrap();
        assert_eq!((mr.base_to(), mr.len()), (addr, 10_000), "the very bytes");
        // SAFETY: nothing else uses the region in this test.
        unsafe { mr.as_mut_slice()[1] = 7 };
        // SAFETY: as above.
        assert_eq!(unsafe { mr.as_slice() }[9_999], 5);
        assert_eq!(pd.copied_bytes(), 0);
        let mut one = [0u8; 1];
        mr.read(1, &mut one);
        assert_eq!((one, pd.copied_bytes()), ([7], 1));
        let stag = mr.stag();
        let v: Vec<u8> = mr.into_buffer().unwrap();
        assert_eq!((v.as_ptr() as u64, v[1], v.len()), (addr, 7, 10_000));
        assert!(pd.table.snapshot().info(stag).is_none(), "deregistered");

        // A Box<[u8]>, asked back as the wrong type: refused, not misread.
        let mr = pd
            .register_buffer(vec![1u8; 64].into_boxed_slice(), Access::NONE)
            .unwrap();
        assert!(matches!(
            mr.into_buffer::<Vec<u8>>(),
            Err(DatapathError::InvalidArgument(_))
        ));
    }

    /// RFC 5042 6.1.1 through the API: each protection domain's STags come from its own
    /// random secret, so neither the first STag nor the sequence is a constant a peer knows.
    #[test]
    fn stags_of_protection_domains_are_unpredictable() {
        let stags = |pd: &ProtectionDomain| -> Vec<Stag> {
            let regions: Vec<MemoryRegion> = (0..1000)
                .map(|_| pd.register_buffer(vec![0u8; 8], Access::NONE).unwrap())
                .collect();
            regions.iter().map(MemoryRegion::stag).collect()
        };
        let pinning = Pinning::BestEffort;
        let a = stags(&ProtectionDomain::new().with_pinning(pinning));
        let b = stags(&ProtectionDomain::new().with_pinning(pinning));
        assert_ne!(a[0], b[0], "two domains start at the same STag");
        assert_ne!(a[0], Stag(0x101));
        let ascending = a.windows(2).filter(|w| w[1].0 > w[0].0).count();
        assert!(
            (300..700).contains(&ascending),
            "{ascending} of 999 steps ascend"
        );
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(same < 5, "{same} STags alike in two domains");
    }

    /// Remote write or atomic rights without local write are refused at registration and
    /// re-registration, as `ibv_reg_mr` and `ibv_rereg_mr` refuse them (`EINVAL`).
    #[test]
    fn remote_write_or_atomic_rights_need_local_write() {
        let pd = ProtectionDomain::new().with_pinning(Pinning::Off);
        for access in [
            Access::REMOTE_WRITE,
            Access::REMOTE_ATOMIC,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        ] {
            assert!(
                matches!(
                    pd.register(64, access),
                    Err(DatapathError::InvalidArgument(_))
                ),
                "{access:?}"
            );
            assert!(matches!(
                pd.register_buffer(vec![0u8; 64], access),
                Err(DatapathError::InvalidArgument(_))
            ));
        }
        let mut mr = pd.register(64, Access::REMOTE_READ).unwrap();
        assert!(matches!(
            mr.reregister(Access::REMOTE_WRITE),
            Err(DatapathError::InvalidArgument(_))
        ));
        assert!(mr.is_valid(), "a refused re-registration changes nothing");
        mr.reregister(Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .expect("with local write");
        assert!(pd.register(64, Access::ALL).is_ok());
    }

    /// The owner's Local Invalidate works however many connections share the protection
    /// domain (two joined streams: a peer's Send with Invalidate would be refused).
    #[test]
    fn local_invalidate_of_a_region_two_connections_share() {
        let pd = ProtectionDomain::new().with_pinning(Pinning::Off);
        let mr = pd
            .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let table = pd.table.snapshot();
        let _streams = (table.join_stream(), table.join_stream());
        assert!(table.invalidate_remote(mr.stag(), pd.id).is_err());
        mr.invalidate().expect("the owner may always invalidate");
        assert!(!mr.is_valid());
        assert!(mr.invalidate().is_err(), "invalid already");
    }

    #[test]
    fn raw_registration_reregistration_and_invalidation() {
        let pd = ProtectionDomain::new().with_pinning(Pinning::BestEffort);
        let mut mem = vec![3u8; 8192];
        // SAFETY: `mem` outlives the region (dropped at the end of this test, after `mr`).
        let mut mr = unsafe {
            pd.register_raw(
                mem.as_mut_ptr(),
                mem.len(),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
        }
        .unwrap();
        assert_eq!(mr.base_to(), mem.as_ptr() as u64);
        let old = mr.stag();
        let t = |stag, need| {
            pd.table
                .snapshot()
                .validate(stag, pd.id, need, mem.as_ptr() as u64, 8)
                .map(|_| ())
        };
        assert_eq!(t(old, Access::REMOTE_WRITE), Ok(()));
        mr.invalidate().unwrap();
        assert!(!mr.is_valid());
        assert!(mr.invalidate().is_err(), "invalid already");
        assert!(t(old, Access::NONE).is_err());
        let new = mr.reregister(Access::REMOTE_READ).unwrap();
        assert_ne!(new, old);
        assert_eq!(mr.stag(), new);
        assert!(mr.is_valid());
        assert!(t(old, Access::NONE).is_err(), "the old key stays dead");
        assert_eq!(t(new, Access::REMOTE_READ), Ok(()));
        assert!(t(new, Access::REMOTE_WRITE).is_err(), "rights narrowed");
        drop(mr);
        assert_eq!(mem[0], 3);
    }

    /// `deregister` (`ibv_dereg_mr`) returns only once no transport holds the bytes: here a
    /// table version a transport read before (as an engine turn or a socket transport's event
    /// holds one), let go of 100 ms later on another thread. The region is gone from the
    /// current version at once.
    #[test]
    fn deregistering_waits_until_the_transports_let_go() {
        let pd = ProtectionDomain::new().with_pinning(Pinning::BestEffort);
        let mut mem = vec![5u8; 4096];
        // SAFETY: `mem` outlives the region: `deregister` returns before it is dropped, and
        // returns only once nothing holds the bytes.
        let mr =
            unsafe { pd.register_raw(mem.as_mut_ptr(), mem.len(), Access::REMOTE_READ) }.unwrap();
        let stag = mr.stag();
        let held = pd.table.snapshot();
        let let_go = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let holder = {
            let let_go = let_go.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                assert!(held.info(stag).is_some(), "the held version has the region");
                let_go.store(true, Ordering::SeqCst);
                drop(held);
            })
        };
        assert!(mr.deregister().is_ok());
        assert!(
            let_go.load(Ordering::SeqCst),
            "returned while a transport held the bytes"
        );
        assert!(pd.table.snapshot().info(stag).is_none());
        holder.join().unwrap();
        drop(mem);
    }

    /// A holder that does not let go in time: `RegionInUse`, the region deregistered all the
    /// same (a peer's access fails as of an unknown STag), the bytes still held.
    #[test]
    fn deregistering_gives_up_on_a_holder_that_keeps_the_bytes() {
        let pd = ProtectionDomain::new();
        let mr = pd
            .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let stag = mr.stag();
        let held = pd.table.snapshot();
        assert!(matches!(
            mr.deregister_within(Duration::from_millis(50)),
            Err(DatapathError::RegionInUse)
        ));
        assert!(pd.table.snapshot().info(stag).is_none());
        assert!(held.info(stag).is_some(), "the holder keeps its bytes");
    }

    /// A deregistration started while a holder keeps the bytes can be waited on again, and
    /// says released once the holder lets go (`ibv_dereg_mr` failing with `EBUSY`, then called
    /// again).
    #[test]
    fn a_started_deregistration_is_waited_on_again_until_released() {
        let pd = ProtectionDomain::new();
        let mr = pd
            .register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let stag = mr.stag();
        let held = pd.table.snapshot();
        let d = mr.start_deregister();
        assert!(
            pd.table.snapshot().info(stag).is_none(),
            "deregistered at once"
        );
        assert!(!d.is_released());
        assert!(
            !d.wait(Duration::from_millis(20)),
            "the holder still has the bytes"
        );
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(held);
        });
        assert!(
            d.wait(Duration::from_secs(10)),
            "released once the holder let go"
        );
        assert!(d.is_released());
        holder.join().unwrap();
    }

    /// The page-lock counts: overlapping ranges, one removed, leave the shared pages counted;
    /// each removal returns just the pages nobody covers any more; the map empties.
    #[test]
    fn page_locks_count_overlapping_ranges() {
        const P: usize = PAGE;
        let mut l = PageLocks::new();
        l.add(0, 3 * P);
        l.add(P, 4 * P);
        l.add(10 * P, 11 * P);
        assert_eq!(l.count_at(0), 1);
        assert_eq!(l.count_at(2 * P), 2);
        assert_eq!(l.count_at(3 * P), 1);
        assert_eq!(l.count_at(5 * P), 0);
        assert_eq!(l.remove(0, 3 * P), [(0, P)]);
        assert_eq!(l.count_at(2 * P), 1);
        assert_eq!(l.remove(10 * P, 11 * P), [(10 * P, 11 * P)]);
        assert_eq!(l.remove(P, 4 * P), [(P, 4 * P)]);
        assert!(l.runs.is_empty(), "{:?}", l.runs);
        // The same range twice (two small buffers on one page): the second keeps it.
        l.add(0, P);
        l.add(0, P);
        assert!(l.remove(0, P).is_empty());
        assert_eq!(l.remove(0, P), [(0, P)]);
        // Nested, then the outer one goes first: the ends are freed, the middle kept.
        l.add(0, 4 * P);
        l.add(P, 2 * P);
        assert_eq!(l.remove(0, 4 * P), [(0, P), (2 * P, 4 * P)]);
        assert_eq!(l.remove(P, 2 * P), [(P, 2 * P)]);
        assert!(l.runs.is_empty(), "{:?}", l.runs);
    }

    /// Whether the page at `addr` is locked: its mapping's `Locked` equals its `Size` in
    /// `/proc/self/smaps` (the kernel splits a mapping where locking changes).
    fn page_locked(addr: usize) -> bool {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut inside = false;
        let mut size = None;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = a <= addr && addr < b;
                        continue;
                    }
                }
            }
            if !inside {
                continue;
            }
            let kb = |l: &str| -> usize {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("Size:") {
                size = Some(kb(line));
            } else if line.starts_with("Locked:") {
                return size == Some(kb(line));
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    /// Two regions over overlapping memory (as two small heap buffers on one page are):
    /// dropping one unlocks only the pages the other does not cover.
    #[test]
    fn unlocking_a_buffer_leaves_pages_another_covers_locked() {
        const P: usize = PAGE;
        let base = anonymous_pages(4);
        // SAFETY: both ranges lie in the mapping, which outlives the buffers.
        let (a, b) = unsafe {
            (
                PinnedBuffer::from_raw(base as *mut u8, 3 * P - 10, Pinning::BestEffort),
                PinnedBuffer::from_raw((base + P + 5) as *mut u8, 3 * P - 5, Pinning::BestEffort),
            )
        };
        let (a, b) = (a.expect("a"), b.expect("b"));
        if !(a.is_locked() && b.is_locked()) {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "mlock refused under CI"
            );
            testbed::skipped("mlock refused (not root, small RLIMIT_MEMLOCK)");
        } else {
            assert!((0..4).all(|i| page_locked(base + i * P)));
            drop(a);
            assert!(
                !page_locked(base),
                "the page only the dropped buffer covered"
            );
            assert!(
                (1..4).all(|i| page_locked(base + i * P)),
                "pages the other buffer covers were unlocked"
            );
            drop(b);
            assert!((0..4).all(|i| !page_locked(base + i * P)));
        }
        // SAFETY: the mapping made above; no buffer refers to it any more.
        unsafe { libc::munmap(base as *mut libc::c_void, 4 * P) };
    }

    /// The address of a fresh private anonymous mapping of `pages` pages (the caller unmaps it).
    fn anonymous_pages(pages: usize) -> usize {
        // SAFETY: a new mapping at an address of the kernel's choosing; it aliases nothing.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        base as usize
    }

    /// A raw region gives its pages' lock back when it is deregistered, not when a transport
    /// drops its last handle (an engine's stale table can hold one after the application may
    /// free the memory, and a `munlock` then would reach whatever the range became).
    #[test]
    fn a_raw_region_unlocks_its_pages_when_deregistered() {
        const P: usize = PAGE;
        let base = anonymous_pages(2);
        let pd = ProtectionDomain::new();
        // SAFETY: the mapping outlives every handle to the buffer (dropped below first).
        let mr = unsafe { pd.register_raw(base as *mut u8, 2 * P, Access::LOCAL_WRITE) }
            .expect("register");
        if !mr.is_pinned() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "mlock refused under CI"
            );
            testbed::skipped("mlock refused (not root, small RLIMIT_MEMLOCK)");
        } else {
            assert!(page_locked(base) && page_locked(base + P));
            // What a transport's table holds.
            let held = mr.buf.clone();
            drop(mr);
            assert!(
                !page_locked(base) && !page_locked(base + P),
                "the lock outlived the deregistration"
            );
            assert!(!held.is_locked());
            drop(held);
            assert!(!page_locked(base));
        }
        // SAFETY: the mapping made above; no buffer refers to it any more.
        unsafe { libc::munmap(base as *mut libc::c_void, 2 * P) };
    }

    /// `mlock` refused (no `CAP_IPC_LOCK` on this thread and a tiny `RLIMIT_MEMLOCK`):
    /// required pinning fails with an error that names the limit; best effort goes on.
    #[test]
    fn a_refused_mlock_names_rlimit_memlock() {
        std::thread::spawn(|| {
            drop_ipc_lock_capability();
            let mut old = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit/setrlimit on locals. The limit is the process's; the other
            // tests' threads keep CAP_IPC_LOCK (capabilities are per thread) or pin best effort.
            unsafe {
                libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut old);
                let low = libc::rlimit {
                    rlim_cur: 4096,
                    rlim_max: old.rlim_max,
                };
                libc::setrlimit(libc::RLIMIT_MEMLOCK, &low);
            }
            let pd = ProtectionDomain::new();
            let res = pd.register(1 << 20, Access::NONE);
            let best = pd
                .clone()
                .with_pinning(Pinning::BestEffort)
                .register(1 << 20, Access::NONE);
            // SAFETY: restores the limit read above.
            unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &old) };
            match res {
                Err(e @ DatapathError::PinFailed { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("RLIMIT_MEMLOCK"), "{text}");
                    assert!(text.contains("ulimit -l"), "{text}");
                }
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("mlock of 1 MiB succeeded under a 4 KiB limit"),
            }
            assert!(!best.unwrap().is_pinned());
        })
        .join()
        .unwrap();
    }

    /// Clears `CAP_IPC_LOCK` from the calling thread's effective capabilities (raw `capset`,
    /// which changes only the calling thread).
    fn drop_ipc_lock_capability() {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const VERSION_3: u32 = 0x2008_0522;
        const CAP_IPC_LOCK: u32 = 14;
        let mut header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let mut data = [Data::default(); 2];
        // SAFETY: capget/capset with a version-3 header and two data words on our stack.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()),
                0
            );
            data[0].effective &= !(1 << CAP_IPC_LOCK);
            assert_eq!(
                libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()),
                0
            );
        }
    }

    #[test]
    fn pinned_buffer_is_bounds_checked() {
        let b = PinnedBuffer::new(10).unwrap();
        b.write_at(8, &[1, 2, 3, 4]);
        // Past the end, zeros (never what the destination held: a frame's earlier octets).
        let mut out = [9u8; 4];
        b.read_at(8, &mut out);
        assert_eq!(out, [1, 2, 0, 0]);
        let (mut out, mut crc) = ([9u8; 4], !0);
        b.read_at_crc(8, &mut out, &mut crc);
        assert_eq!((out, crc), ([1, 2, 0, 0], crc_update(!0, &[1, 2, 0, 0])));
        let (mut out, mut crc) = ([9u8; 4], !0);
        let sum = b.read_at_crc_sum(8, &mut out, &mut crc);
        assert_eq!((out, crc), ([1, 2, 0, 0], crc_update(!0, &[1, 2, 0, 0])));
        let want = tcp_engine::wire::Checksum::new()
            .add_bytes(&[1, 2, 0, 0])
            .sum();
        assert_eq!(sum, want);
        b.write_at(100, &[1]);
        assert_eq!(b.read_volatile(9), Some(2));
        assert_eq!(b.read_volatile(10), None);
        assert_eq!(b.addr() % PAGE as u64, 0);
    }
}
