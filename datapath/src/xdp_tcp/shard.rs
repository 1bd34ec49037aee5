//! Shards: one [`super::XdpTcp`] per RX queue of an interface, each on its own thread, and what
//! they share to send each other the segments of flows that arrive on the wrong queue.
//!
//! The steering program cannot redirect a packet into the AF_XDP socket of another queue (the
//! kernel refuses a socket bound to a queue other than the packet's), and nothing makes a flow
//! arrive on the queue of the shard that owns it: a Linux peer on veth picks its TX queue by a
//! random per-socket `txhash` (and re-hashes after an RTO), a NIC by RSS. So:
//!
//! * [`FlowDirectory`]: which shard owns which flow, keyed by (remote IPv4 address, remote
//!   port, local port) packed into one `u64` (the local address is the interface's). A
//!   fixed-capacity open-addressing table of `AtomicU64` keys and `AtomicU32` owners, placed by
//!   a keyed hash and probed at most `MAX_PROBE` slots: readers (every received segment) never
//!   lock and never allocate; writers (connection setup and teardown only) serialize on a mutex
//!   among themselves, so insert-if-absent is exact.
//! * [`Inbox`]: per shard, a bounded set of preallocated frame buffers passed through two
//!   bounded lock-free queues (free and full buffer indices): a shard that receives a segment
//!   of a flow another shard owns copies the frame into one of the owner's buffers and queues
//!   it, no allocation; when none is free the segment is dropped and counted (TCP recovers).
//!   The owner is woken by a datagram on its inbox socket only while it says it sleeps.

use crate::xsk::PayloadDigest;
use std::cell::UnsafeCell;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crossbeam_channel::{Receiver, Sender};
use tcp_engine::wire::Ipv4TcpPeek;

/// An empty directory slot (never a key: a remote address of 0.0.0.0 is refused).
const EMPTY: u64 = 0;
/// A slot whose key was removed (never a key: 255.255.255.255 is refused as a remote address).
const TOMBSTONE: u64 = u64::MAX;
/// The most slots a lookup or a claim probes from a key's start slot: a key is only ever
/// placed within them, so a lookup that has probed them all knows the key is absent, however
/// many tombstones churn has left (a peer can choose which slots its claims and removals
/// touch only as far as it can guess the keyed hash; the bound holds regardless).
const MAX_PROBE: usize = 256;

/// A flow's directory key: remote IPv4 address, remote port, local port. `None` for remote
/// addresses no connection can have (0.0.0.0, 255.255.255.255), whose packets are never
/// handed off.
pub fn flow_key(remote: Ipv4Addr, remote_port: u16, local_port: u16) -> Option<u64> {
    let ip = u32::from(remote);
    if ip == 0 || ip == u32::MAX {
        return None;
    }
    Some(u64::from(ip) << 32 | u64::from(remote_port) << 16 | u64::from(local_port))
}

/// The (remote address, remote port, local port) of a key from [`flow_key`].
pub fn flow_of_key(key: u64) -> (Ipv4Addr, u16, u16) {
    (
        Ipv4Addr::from((key >> 32) as u32),
        (key >> 16) as u16,
        key as u16,
    )
}

/// The key of a received IPv4/TCP packet (source address and port, destination port), or
/// `None` if it is too short to say or from an impossible address.
pub(crate) fn packet_key(packet: &Ipv4TcpPeek<'_>) -> Option<u64> {
    let (src_port, dst_port) = packet.ports()?;
    flow_key(packet.src_addr(), src_port, dst_port)
}

/// The directory is full (more live flows than its capacity allows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("flow directory full ({0} slots)")]
pub struct DirectoryFull(pub usize);

/// Which shard owns which flow (see the module documentation).
pub struct FlowDirectory {
    keys: Box<[AtomicU64]>,
    owners: Box<[AtomicU32]>,
    mask: usize,
    /// Slots probed at most ([`MAX_PROBE`], or the whole table if smaller).
    probe_limit: usize,
    /// The hash's secret: peers choose keys (addresses and ports) but cannot tell which
    /// slots they land on, so they cannot pile their flows onto another's probe run.
    seed: (u64, u64),
    /// Serializes writers (setup and teardown); readers never take it.
    writer: Mutex<()>,
    /// Slots probed by lookups (tests only).
    #[cfg(test)]
    probed: std::sync::atomic::AtomicUsize,
    /// Claims made (tests only).
    #[cfg(test)]
    pub(crate) claims: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for FlowDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowDirectory")
            .field("capacity", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl FlowDirectory {
    /// A directory of at least `capacity` slots (rounded up to a power of two, at least 16).
    /// Give it about twice the flows expected at once: probes stay short.
    pub fn new(capacity: usize) -> Self {
        use std::hash::BuildHasher;
        let n = capacity.max(16).next_power_of_two();
        // The process's random hash keys (std seeds them from the OS), drawn afresh.
        let random = std::collections::hash_map::RandomState::new();
        FlowDirectory {
            keys: (0..n).map(|_| AtomicU64::new(EMPTY)).collect(),
            owners: (0..n).map(|_| AtomicU32::new(0)).collect(),
            mask: n - 1,
            probe_limit: n.min(MAX_PROBE),
            seed: (random.hash_one(1u8), random.hash_one(2u8) | 1),
            writer: Mutex::new(()),
            #[cfg(test)]
            probed: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(test)]
            claims: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Slots in the table.
    pub fn capacity(&self) -> usize {
        self.keys.len()
    }

    fn start(&self, key: u64) -> usize {
        // A keyed folded multiply (as foldhash's): the 128-bit product of the key, mixed
        // with one secret, and the other, its halves folded together.
        let m = u128::from(key ^ self.seed.0) * u128::from(self.seed.1);
        ((m >> 64) as u64 ^ m as u64) as usize & self.mask
    }

    /// The owner of `key`, without locking or allocating. `None` if no shard owns it.
    pub fn lookup(&self, key: u64) -> Option<u32> {
        if key == EMPTY || key == TOMBSTONE {
            return None;
        }
        let mut i = self.start(key);
        for _ in 0..self.probe_limit {
            #[cfg(test)]
            self.probed.fetch_add(1, Ordering::Relaxed);
            let k = self.keys[i].load(Ordering::Acquire);
            if k == key {
                // Written before the key was published (Release), so visible after the Acquire.
                return Some(self.owners[i].load(Ordering::Relaxed));
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `owner` the owner of `key` unless some shard owns it already; returns the owner
    /// (`owner` itself if the claim succeeded). Setup path only (takes the writers' mutex).
    pub fn claim(&self, key: u64, owner: u32) -> Result<u32, DirectoryFull> {
        if key == EMPTY || key == TOMBSTONE {
            return Err(DirectoryFull(self.keys.len()));
        }
        let _w = self.lock();
        #[cfg(test)]
        self.claims.fetch_add(1, Ordering::Relaxed);
        let mut i = self.start(key);
        let mut free = None;
        for _ in 0..self.probe_limit {
            let k = self.keys[i].load(Ordering::Relaxed);
            if k == key {
                return Ok(self.owners[i].load(Ordering::Relaxed));
            }
            if k == TOMBSTONE && free.is_none() {
                free = Some(i);
            }
            if k == EMPTY {
                free.get_or_insert(i);
                break;
            }
            i = (i + 1) & self.mask;
        }
        let i = free.ok_or(DirectoryFull(self.keys.len()))?;
        // The owner first, then the key (Release): a reader that sees the key sees the owner.
        self.owners[i].store(owner, Ordering::Relaxed);
        self.keys[i].store(key, Ordering::Release);
        Ok(owner)
    }

    /// Forgets `key` if `owner` owns it; true if it did. Teardown path only.
    pub fn remove(&self, key: u64, owner: u32) -> bool {
        let _w = self.lock();
        match self.find(key) {
            Some(i) if self.owners[i].load(Ordering::Relaxed) == owner => {
                self.vacate(i);
                true
            }
            _ => false,
        }
    }

    fn find(&self, key: u64) -> Option<usize> {
        let mut i = self.start(key);
        for _ in 0..self.probe_limit {
            let k = self.keys[i].load(Ordering::Relaxed);
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Removes every key of `owner` for which `keep` says false (a shard's periodic sweep of
    /// flows its table dropped by itself, e.g. half-open connections that timed out). Returns
    /// how many were removed. O(capacity); teardown path.
    pub fn retain_owned(&self, owner: u32, mut keep: impl FnMut(u64) -> bool) -> usize {
        let _w = self.lock();
        let mut removed = 0;
        for (i, (k, o)) in self.keys.iter().zip(self.owners.iter()).enumerate() {
            let key = k.load(Ordering::Relaxed);
            if key == EMPTY || key == TOMBSTONE || o.load(Ordering::Relaxed) != owner {
                continue;
            }
            if !keep(key) {
                self.vacate(i);
                removed += 1;
            }
        }
        removed
    }

    /// Empties slot `i` (writers' mutex held). Readers probe from a key's start slot to the
    /// first empty one, so a slot in the middle of a run becomes a tombstone (keys placed
    /// beyond it stay reachable). A slot whose successor is empty ends every run through it:
    /// it becomes empty, and so do the tombstones right before it, which ended runs only
    /// there. Without that, ordinary churn would turn every empty slot into a tombstone in
    /// time; churn chosen to defeat it (a peer walking back from a live key) still can, and
    /// then `MAX_PROBE` is what bounds a lookup of an absent key.
    fn vacate(&self, i: usize) {
        if self.keys[(i + 1) & self.mask].load(Ordering::Relaxed) != EMPTY {
            self.keys[i].store(TOMBSTONE, Ordering::Release);
            return;
        }
        self.keys[i].store(EMPTY, Ordering::Release);
        let mut j = i;
        for _ in 1..self.keys.len() {
            j = j.wrapping_sub(1) & self.mask;
            if self.keys[j].load(Ordering::Relaxed) != TOMBSTONE {
                break;
            }
            self.keys[j].store(EMPTY, Ordering::Release);
        }
    }

    /// Slots holding neither a key nor a tombstone.
    #[cfg(test)]
    fn empty_slots(&self) -> usize {
        self.keys
            .iter()
            .filter(|k| k.load(Ordering::Relaxed) == EMPTY)
            .count()
    }
}

/// One preallocated frame buffer of an [`Inbox`].
struct FrameBuf(UnsafeCell<Box<[u8]>>);

/// A shard's bounded inbox of frames handed over by other shards (see the module
/// documentation).
/// A frame queued in an inbox: its buffer's index, its length, and what the join of a
/// multi-frame packet read of its TCP payload (the same octets, copied).
type Queued = (u32, u32, Option<PayloadDigest>);

pub struct Inbox {
    bufs: Box<[FrameBuf]>,
    free_tx: Sender<u32>,
    free_rx: Receiver<u32>,
    full_tx: Sender<Queued>,
    full_rx: Receiver<Queued>,
    /// Set by the owner while it sleeps (or is about to): senders then write `wake_tx`.
    asleep: AtomicBool,
    wake_tx: UnixDatagram,
    wake_rx: UnixDatagram,
}

// SAFETY: a buffer is touched only by the thread holding its index: taken from `free_rx` to
// write it, or from `full_rx` to read it (any thread with the `ShardSet` may call the `pop`s,
// but only the one that received an index touches its buffer). Every path returns a taken
// index to exactly one queue or loses it (a panic), never duplicates it, so an index is in at
// most one queue or held by at most one thread at a time; the queues' send/receive order each
// holder's accesses before the next's (crossbeam's channels synchronize with acquire/release).
unsafe impl Sync for Inbox {}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("buffers", &self.bufs.len())
            .field("queued", &self.full_rx.len())
            .finish_non_exhaustive()
    }
}

impl Inbox {
    /// An inbox of `buffers` frames of `frame_size` octets each (both at least 1).
    pub fn new(buffers: usize, frame_size: usize) -> io::Result<Self> {
        let buffers = buffers.clamp(1, u32::MAX as usize);
        let (free_tx, free_rx) = crossbeam_channel::bounded(buffers);
        let (full_tx, full_rx) = crossbeam_channel::bounded(buffers);
        let bufs: Box<[FrameBuf]> = (0..buffers)
            .map(|_| {
                FrameBuf(UnsafeCell::new(
                    vec![0u8; frame_size.max(1)].into_boxed_slice(),
                ))
            })
            .collect();
        for i in 0..buffers as u32 {
            // Cannot fail: the channel holds exactly `buffers` indices.
            let _ = free_tx.try_send(i);
        }
        let (wake_tx, wake_rx) = UnixDatagram::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        Ok(Inbox {
            bufs,
            free_tx,
            free_rx,
            full_tx,
            full_rx,
            asleep: AtomicBool::new(false),
            wake_tx,
            wake_rx,
        })
    }

    /// Copies `frame` into a free buffer and queues it for the owner, waking it if it sleeps.
    /// False (nothing queued) if no buffer is free or the frame does not fit. No allocation,
    /// no lock.
    pub fn push(&self, frame: &[u8]) -> bool {
        self.push_digested(frame, None)
    }

    /// [`push`](Self::push) with what joining the packet read of its payload, handed to the
    /// owner with the frame ([`pop_with_digest`](Self::pop_with_digest)).
    pub fn push_digested(&self, frame: &[u8], digest: Option<PayloadDigest>) -> bool {
        let Ok(i) = self.free_rx.try_recv() else {
            return false;
        };
        let Some(buf) = self.bufs.get(i as usize) else {
            return false;
        };
        // SAFETY: index `i` came out of the free queue, so no other thread holds it (see the
        // `Sync` impl): this thread has the buffer to itself until it queues the index.
        let dst = unsafe { &mut *buf.0.get() };
        if frame.len() > dst.len() {
            let _ = self.free_tx.try_send(i);
            return false;
        }
        dst[..frame.len()].copy_from_slice(frame);
        if self
            .full_tx
            .try_send((i, frame.len() as u32, digest))
            .is_err()
        {
            // Cannot happen (the full queue holds every buffer); give the buffer back.
            let _ = self.free_tx.try_send(i);
            return false;
        }
        fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::SeqCst) {
            // WouldBlock: wake-ups are pending already.
            let _ = self.wake_tx.send(&[1]);
        }
        true
    }

    /// The owner: takes the next queued frame, hands it to `f`, and frees the buffer. False if
    /// the inbox was empty.
    pub fn pop_with(&self, f: impl FnOnce(&[u8])) -> bool {
        self.pop_with_digest(|frame, _| f(frame))
    }

    /// [`pop_with`](Self::pop_with), also giving the digest the frame was pushed with.
    pub fn pop_with_digest(&self, f: impl FnOnce(&[u8], Option<PayloadDigest>)) -> bool {
        let Ok((i, len, digest)) = self.full_rx.try_recv() else {
            return false;
        };
        if let Some(buf) = self.bufs.get(i as usize) {
            // SAFETY: index `i` came out of the full queue, so the pusher has finished writing
            // and no other thread holds it until it goes back to the free queue below.
            let src = unsafe { &*buf.0.get() };
            f(src.get(..len as usize).unwrap_or(&[]), digest);
        }
        let _ = self.free_tx.try_send(i);
        true
    }

    /// Frames queued.
    pub fn len(&self) -> usize {
        self.full_rx.len()
    }

    /// True if no frame is queued.
    pub fn is_empty(&self) -> bool {
        self.full_rx.is_empty()
    }

    /// The owner is about to sleep: from now on pushers wake it. Returns false (and stays
    /// awake) if a frame is queued already.
    pub fn sleep_begin(&self) -> bool {
        self.asleep.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !self.full_rx.is_empty() {
            self.asleep.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The owner woke: pushers stop writing the wake-up socket, which is drained.
    pub fn sleep_end(&self) {
        self.asleep.store(false, Ordering::SeqCst);
        let mut b = [0u8; 64];
        while self.wake_rx.recv(&mut b).is_ok() {}
    }

    /// The socket that becomes readable when a frame is pushed while the owner sleeps.
    pub fn wake_fd(&self) -> RawFd {
        self.wake_rx.as_raw_fd()
    }
}

/// What the shards of one interface share: the flow directory and every shard's inbox.
#[derive(Debug)]
pub struct ShardSet {
    /// Which shard owns which flow.
    pub directory: FlowDirectory,
    /// Inbox of shard `i` at index `i`.
    pub inboxes: Vec<Inbox>,
}

impl ShardSet {
    /// `shards` inboxes of `inbox_frames` buffers of `frame_size` octets, and a directory for
    /// `max_flows` flows at once.
    pub fn new(
        shards: usize,
        inbox_frames: usize,
        frame_size: usize,
        max_flows: usize,
    ) -> io::Result<Self> {
        Ok(ShardSet {
            directory: FlowDirectory::new(max_flows.saturating_mul(2)),
            inboxes: (0..shards)
                .map(|_| Inbox::new(inbox_frames, frame_size))
                .collect::<io::Result<_>>()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn key(n: u32) -> u64 {
        flow_key(
            Ipv4Addr::from(0x0a00_0000 + n),
            40000 + (n % 1000) as u16,
            7471,
        )
        .unwrap()
    }

    #[test]
    fn keys_round_trip_and_impossible_addresses_have_none() {
        let k = flow_key(Ipv4Addr::new(10, 77, 0, 2), 51234, 7471).unwrap();
        assert_eq!(flow_of_key(k), (Ipv4Addr::new(10, 77, 0, 2), 51234, 7471));
        assert_eq!(flow_key(Ipv4Addr::UNSPECIFIED, 1, 2), None);
        assert_eq!(flow_key(Ipv4Addr::BROADCAST, 1, 2), None);
    }

    #[test]
    fn packet_key_reads_source_and_ports() {
        let mut ip = [0u8; 40];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&40u16.to_be_bytes());
        ip[9] = 6;
        ip[12..16].copy_from_slice(&[10, 77, 0, 2]);
        ip[20..22].copy_from_slice(&51234u16.to_be_bytes());
        ip[22..24].copy_from_slice(&7471u16.to_be_bytes());
        let peek = Ipv4TcpPeek::new(&ip).expect("peek");
        assert_eq!(
            packet_key(&peek),
            flow_key(Ipv4Addr::new(10, 77, 0, 2), 51234, 7471)
        );
        // An IHL that leaves no room for the ports.
        ip[0] = 0x4f;
        assert_eq!(packet_key(&Ipv4TcpPeek::new(&ip).expect("peek")), None);
        // From an impossible address.
        ip[0] = 0x45;
        ip[12..16].fill(0);
        assert_eq!(packet_key(&Ipv4TcpPeek::new(&ip).expect("peek")), None);
    }

    #[test]
    fn insert_lookup_remove() {
        let d = FlowDirectory::new(64);
        assert_eq!(d.lookup(key(1)), None);
        assert_eq!(d.claim(key(1), 2), Ok(2));
        assert_eq!(d.claim(key(2), 3), Ok(3));
        // A second claim of an owned key returns the owner, not the claimant.
        assert_eq!(d.claim(key(1), 0), Ok(2));
        assert_eq!(d.lookup(key(1)), Some(2));
        assert_eq!(d.lookup(key(2)), Some(3));
        // Only the owner removes.
        assert!(!d.remove(key(1), 3));
        assert!(d.remove(key(1), 2));
        assert!(!d.remove(key(1), 2));
        assert_eq!(d.lookup(key(1)), None);
        assert_eq!(d.lookup(key(2)), Some(3));
        // The tombstone is reused and keys behind it are still found.
        assert_eq!(d.claim(key(1), 1), Ok(1));
        assert_eq!(d.lookup(key(1)), Some(1));
        assert_eq!(d.claim(EMPTY, 1), Err(DirectoryFull(64)));
        assert_eq!(d.lookup(TOMBSTONE), None);
    }

    #[test]
    fn colliding_keys_probe_past_tombstones() {
        let d = FlowDirectory::new(16);
        // 16 keys in 16 slots: every probe sequence wraps; all found.
        for n in 0..16 {
            assert_eq!(d.claim(key(n), n), Ok(n));
        }
        for n in 0..16 {
            assert_eq!(d.lookup(key(n)), Some(n), "key {n}");
        }
        // Remove every other key; the rest stay reachable past the tombstones.
        for n in (0..16).step_by(2) {
            assert!(d.remove(key(n), n));
        }
        for n in 0..16 {
            let want = if n % 2 == 0 { None } else { Some(n) };
            assert_eq!(d.lookup(key(n)), want, "key {n}");
        }
    }

    #[test]
    fn a_full_table_refuses_and_recovers_after_removal() {
        let d = FlowDirectory::new(16);
        for n in 0..16 {
            assert_eq!(d.claim(key(n), 0), Ok(0));
        }
        assert_eq!(d.claim(key(99), 0), Err(DirectoryFull(16)));
        // A full table still answers lookups, present or absent, in bounded time.
        assert_eq!(d.lookup(key(99)), None);
        assert_eq!(d.lookup(key(7)), Some(0));
        assert!(d.remove(key(7), 0));
        assert_eq!(d.claim(key(99), 1), Ok(1));
        assert_eq!(d.lookup(key(99)), Some(1));
    }

    #[test]
    fn churn_leaves_no_tombstones_behind() {
        let d = FlowDirectory::new(32);
        let slots = d.capacity();
        for round in 0..200u32 {
            // Neighbouring keys cluster: runs of several slots, removed in a scrambled order.
            let keys: Vec<u64> = (0..20).map(|n| key(round * 20 + n)).collect();
            for &k in &keys {
                assert_eq!(d.claim(k, 1), Ok(1));
            }
            for n in (0..20).map(|n| (n * 7 + round as usize) % 20) {
                if n % 3 == 0 {
                    assert!(d.remove(keys[n], 1));
                }
            }
            // Every key left is still found, every removed one is gone.
            for (n, &k) in keys.iter().enumerate() {
                assert_eq!(
                    d.lookup(k),
                    (n % 3 != 0).then_some(1),
                    "round {round} key {n}"
                );
            }
            assert_eq!(d.retain_owned(1, |_| false), 13);
            assert_eq!(d.empty_slots(), slots, "round {round}: tombstones left");
        }
    }

    /// helper-82's attack: one live flow, then a claim and a removal per slot walking back
    /// round the table from it (each removal leaves a tombstone, its successor being taken),
    /// until no slot is empty: a lookup of an absent key (every stray segment) probed the
    /// whole table, and a SYN's claim again, under the writers' mutex, for good. Probes stop
    /// at `MAX_PROBE` slots now; claims still find room and keys are still found.
    #[test]
    fn tombstones_everywhere_leave_probes_bounded() {
        let d = FlowDirectory::new(1024);
        let n = d.capacity();
        assert!(n > MAX_PROBE);
        let live = key(0);
        assert_eq!(d.claim(live, 1), Ok(1));
        let at = d.start(live);
        let mut next = 1u32;
        let mut key_at = |slot: usize| loop {
            let k = key(next);
            next += 1;
            if d.start(k) == slot {
                return k;
            }
        };
        for back in 1..n {
            let slot = at.wrapping_sub(back) & d.mask;
            let k = key_at(slot);
            assert_eq!(d.claim(k, 2), Ok(2));
            assert!(d.remove(k, 2));
        }
        assert_eq!(d.empty_slots(), 0, "every slot but one a tombstone");
        let absent = key(u32::MAX / 2);
        let before = d.probed.load(Ordering::Relaxed);
        assert_eq!(d.lookup(absent), None);
        let probes = d.probed.load(Ordering::Relaxed) - before;
        assert!(
            probes <= MAX_PROBE,
            "{probes} slots probed for an absent key"
        );
        assert_eq!(d.lookup(live), Some(1));
        assert_eq!(d.claim(absent, 3), Ok(3));
        assert_eq!(d.lookup(absent), Some(3));
    }

    #[test]
    fn retain_owned_sweeps_only_the_owners_keys() {
        let d = FlowDirectory::new(64);
        for n in 0..20 {
            d.claim(key(n), n % 2).unwrap();
        }
        // Shard 0 keeps keys below 10.
        let removed = d.retain_owned(0, |k| k < key(10));
        assert_eq!(removed, 5);
        for n in 0..20 {
            let want = if n % 2 == 0 && n >= 10 {
                None
            } else {
                Some(n % 2)
            };
            assert_eq!(d.lookup(key(n)), want, "key {n}");
        }
    }

    #[test]
    fn concurrent_readers_see_stable_keys_while_writers_churn() {
        let d = Arc::new(FlowDirectory::new(256));
        // Stable keys owned by shard 1, never touched by the writers.
        for n in 0..64 {
            d.claim(key(n), 1).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2u32)
            .map(|w| {
                let (d, stop) = (d.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut rounds = 0u32;
                    while !stop.load(Ordering::Relaxed) && rounds < 20_000 {
                        let k = key(1000 + w * 100 + rounds % 50);
                        assert_eq!(d.claim(k, 10 + w), Ok(10 + w));
                        assert!(d.remove(k, 10 + w));
                        rounds += 1;
                    }
                })
            })
            .collect();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        for n in 0..64 {
                            assert_eq!(d.lookup(key(n)), Some(1));
                        }
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().expect("reader");
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().expect("writer");
        }
    }

    #[test]
    fn concurrent_claims_of_one_key_have_one_winner() {
        for round in 0..50 {
            let d = Arc::new(FlowDirectory::new(64));
            let k = key(round);
            let got: Vec<u32> = (0..4u32)
                .map(|s| {
                    let d = d.clone();
                    std::thread::spawn(move || d.claim(k, s).unwrap())
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            assert!(got.iter().all(|&o| o == got[0]), "{got:?}");
            assert_eq!(d.lookup(k), Some(got[0]));
        }
    }

    #[test]
    fn inbox_passes_frames_and_drops_when_full() {
        let inbox = Inbox::new(4, 64).unwrap();
        for n in 0..4u8 {
            assert!(inbox.push(&[n; 10]));
        }
        assert!(!inbox.push(&[9; 10]), "a full inbox refuses");
        assert!(!Inbox::new(1, 8).unwrap().push(&[0; 9]), "too long");
        assert_eq!(inbox.len(), 4);
        let mut seen = Vec::new();
        while inbox.pop_with(|f| seen.push(f.to_vec())) {}
        assert_eq!(seen, (0..4u8).map(|n| vec![n; 10]).collect::<Vec<_>>());
        assert!(inbox.is_empty());
        assert!(inbox.push(&[7; 64]), "buffers come back");
    }

    #[test]
    fn inbox_hands_a_joined_packets_digest_over_with_it() {
        let inbox = Inbox::new(4, 64).unwrap();
        let d = PayloadDigest {
            len: 8,
            sum: 0x1234,
            crc: 0xdead_beef,
        };
        assert!(inbox.push_digested(&[1; 30], Some(d)));
        assert!(inbox.push(&[2; 30]));
        let mut seen = Vec::new();
        while inbox.pop_with_digest(|f, digest| seen.push((f[0], digest))) {}
        assert_eq!(seen, vec![(1, Some(d)), (2, None)]);
    }

    #[test]
    fn inbox_wakes_a_sleeping_owner_only() {
        let inbox = Inbox::new(8, 64).unwrap();
        let mut b = [0u8; 8];
        assert!(inbox.push(&[1]));
        assert!(inbox.wake_rx.recv(&mut b).is_err(), "awake: no datagram");
        assert!(!inbox.sleep_begin(), "a queued frame keeps it awake");
        inbox.pop_with(|_| {});
        assert!(inbox.sleep_begin());
        assert!(inbox.push(&[2]));
        assert!(inbox.wake_rx.recv(&mut b).is_ok(), "asleep: woken");
        inbox.sleep_end();
        assert!(inbox.push(&[3]));
        assert!(inbox.wake_rx.recv(&mut b).is_err());
    }

    #[test]
    fn inbox_across_threads() {
        let inbox = Arc::new(Inbox::new(16, 256).unwrap());
        let pusher = {
            let inbox = inbox.clone();
            std::thread::spawn(move || {
                let mut pushed = 0u32;
                let mut n = 0u32;
                while pushed < 5000 && n < 5_000_000 {
                    n += 1;
                    let frame = [(pushed % 251) as u8; 200];
                    if inbox.push(&frame) {
                        pushed += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
                pushed
            })
        };
        let mut got = 0u32;
        let mut spins = 0u32;
        while got < 5000 && spins < 5_000_000 {
            spins += 1;
            let want = (got % 251) as u8;
            if !inbox.pop_with(|f| {
                assert_eq!(f.len(), 200);
                assert!(f.iter().all(|&b| b == want));
            }) {
                std::thread::yield_now();
                continue;
            }
            got += 1;
        }
        assert_eq!(pusher.join().unwrap(), 5000);
        assert_eq!(got, 5000);
    }
}
