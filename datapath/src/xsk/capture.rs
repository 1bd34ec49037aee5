//! Packet capture of an AF_XDP socket's frames to a pcap file.
//!
//! tcpdump cannot see the engine's traffic: XDP redirects received frames into the AF_XDP
//! socket before any packet tap, and AF_XDP transmission bypasses the taps. A [`Capture`] sees
//! every frame where the engine does: a socket given a [`CaptureTap`] (through
//! [`XskConfig::capture`](super::XskConfig::capture)) copies each frame it takes from its RX
//! ring and each frame it puts on its TX ring, with the time it did so, into a bounded ring of
//! buffers allocated when the capture is created; a writer thread empties the ring into the
//! file. The data path never waits and never allocates for it: when the ring is full the
//! frame is counted in [`CaptureStats::dropped`] and not written. A socket without a tap pays
//! one branch per batch.
//!
//! The file is the classic pcap format with nanosecond timestamps (magic `0xa1b23c4d`, version
//! 2.4, link type 1 = Ethernet), which Wireshark, tshark and tcpdump read.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

/// The pcap magic number for nanosecond timestamps.
const PCAP_MAGIC_NS: u32 = 0xa1b2_3c4d;
/// LINKTYPE_ETHERNET.
const LINKTYPE_ETHERNET: u32 = 1;
/// Octets of the global header.
pub const PCAP_HEADER_LEN: usize = 24;
/// Octets of a record header.
pub const PCAP_RECORD_HEADER_LEN: usize = 16;

/// The pcap global header (little-endian, nanosecond timestamps, Ethernet).
pub fn pcap_header(snaplen: u32) -> [u8; PCAP_HEADER_LEN] {
    let mut h = [0u8; PCAP_HEADER_LEN];
    h[0..4].copy_from_slice(&PCAP_MAGIC_NS.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    // thiszone (8..12) and sigfigs (12..16) are zero.
    h[16..20].copy_from_slice(&snaplen.to_le_bytes());
    h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
    h
}

/// The header of one record: the capture time in nanoseconds since the Unix epoch, the octets
/// saved and the frame's length on the wire.
pub fn pcap_record_header(unix_ns: u64, saved: u32, orig_len: u32) -> [u8; PCAP_RECORD_HEADER_LEN] {
    let mut h = [0u8; PCAP_RECORD_HEADER_LEN];
    let secs = u32::try_from(unix_ns / 1_000_000_000).unwrap_or(u32::MAX);
    let nanos = (unix_ns % 1_000_000_000) as u32;
    h[0..4].copy_from_slice(&secs.to_le_bytes());
    h[4..8].copy_from_slice(&nanos.to_le_bytes());
    h[8..12].copy_from_slice(&saved.to_le_bytes());
    h[12..16].copy_from_slice(&orig_len.to_le_bytes());
    h
}

/// The default snap length: the four 4 KiB UMEM frames a received packet may span at most
/// (`xsk::MAX_FRAMES_PER_PACKET`, checked at compile time by the socket, which owns that
/// limit).
pub const DEFAULT_SNAPLEN: usize = 4 * 4096;

/// How a [`Capture`] is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureConfig {
    /// Buffers in the ring between the sockets and the writer thread (allocated at creation):
    /// frames that find none free are dropped and counted.
    pub slots: usize,
    /// Octets kept of each frame (the pcap snap length); longer frames are cut and counted in
    /// [`CaptureStats::truncated`]. The default holds a whole packet of the most UMEM frames
    /// of the default size a packet may span ([`DEFAULT_SNAPLEN`]: an
    /// MTU 9000 segment whole, its MPA CRC at the end included).
    pub snaplen: usize,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            slots: 4096,
            snaplen: DEFAULT_SNAPLEN,
        }
    }
}

/// What a capture did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Frames the sockets handed to the capture (received and transmitted).
    pub seen: u64,
    /// Frames written to the file.
    pub written: u64,
    /// Frames not written: the ring was full (the writer fell behind), the file failed, or
    /// the capture had finished.
    pub dropped: u64,
    /// Frames written cut to the snap length.
    pub truncated: u64,
    /// The first write error, after which nothing more is written.
    pub error: Option<String>,
}

/// One captured frame on its way to the writer.
struct Record {
    unix_ns: u64,
    orig_len: u32,
    data: Vec<u8>,
}

struct Shared {
    free_tx: Sender<Vec<u8>>,
    free_rx: Receiver<Vec<u8>>,
    full_tx: Sender<Record>,
    snaplen: usize,
    /// Set by [`Capture::finish`]: taps stop handing frames over.
    finished: AtomicBool,
    seen: AtomicU64,
    written: AtomicU64,
    dropped: AtomicU64,
    truncated: AtomicU64,
    error: Mutex<Option<String>>,
}

/// A socket's handle on a [`Capture`]: cheap to clone, one per socket.
#[derive(Clone)]
pub struct CaptureTap {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CaptureTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureTap")
            .field("snaplen", &self.shared.snaplen)
            .finish_non_exhaustive()
    }
}

impl CaptureTap {
    /// Hands one frame to the capture, stamped now. Never blocks, never allocates: without a
    /// free buffer the frame is counted as dropped.
    pub fn record(&self, frame: &[u8]) {
        self.record_pieces(&[frame]);
    }

    /// [`record`](Self::record) of a frame held in pieces (the UMEM frames of a multi-buffer
    /// packet), joined in order into the record.
    pub fn record_pieces(&self, pieces: &[&[u8]]) {
        let s = &*self.shared;
        s.seen.fetch_add(1, Ordering::Relaxed);
        if s.finished.load(Ordering::Relaxed) {
            s.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let Ok(mut data) = s.free_rx.try_recv() else {
            s.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let orig_len: usize = pieces.iter().map(|p| p.len()).sum();
        data.clear();
        for piece in pieces {
            // Within the capacity reserved at creation: no allocation.
            let keep = piece.len().min(s.snaplen.saturating_sub(data.len()));
            data.extend_from_slice(&piece[..keep]);
        }
        let rec = Record {
            unix_ns,
            orig_len: u32::try_from(orig_len).unwrap_or(u32::MAX),
            data,
        };
        if let Err(e) = s.full_tx.try_send(rec) {
            // Cannot happen (the full queue holds every buffer), but keep the buffer.
            let _ = s.free_tx.try_send(e.into_inner().data);
            s.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A pcap file being written from the frames of the sockets that hold its [`CaptureTap`]s.
/// [`Capture::finish`] writes what is queued, closes the file and reports.
pub struct Capture {
    shared: Arc<Shared>,
    /// The writer thread; it hands its queue back when it ends.
    writer: Option<JoinHandle<Receiver<Record>>>,
    path: PathBuf,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// How long the writer waits for a frame before it looks whether the capture finished.
const WRITER_POLL: Duration = Duration::from_millis(20);
/// How often a busy writer hands what it wrote to the file.
const FLUSH_EVERY: Duration = Duration::from_millis(200);

impl Capture {
    /// Creates (truncates) `path`, writes the pcap header, allocates the ring and starts the
    /// writer thread.
    pub fn create(path: &Path, cfg: CaptureConfig) -> io::Result<Capture> {
        if cfg.slots == 0 || cfg.snaplen == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a capture needs at least one slot and a snap length above 0",
            ));
        }
        let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        let snaplen = u32::try_from(cfg.snaplen).unwrap_or(u32::MAX);
        out.write_all(&pcap_header(snaplen))?;
        let (free_tx, free_rx) = crossbeam_channel::bounded(cfg.slots);
        let (full_tx, full_rx) = crossbeam_channel::bounded(cfg.slots);
        for _ in 0..cfg.slots {
            // Bounded at `slots`: never full here.
            let _ = free_tx.try_send(Vec::with_capacity(cfg.snaplen));
        }
        let shared = Arc::new(Shared {
            free_tx,
            free_rx,
            full_tx,
            snaplen: cfg.snaplen,
            finished: AtomicBool::new(false),
            seen: AtomicU64::new(0),
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            error: Mutex::new(None),
        });
        let s = shared.clone();
        let writer = std::thread::Builder::new()
            .name("iwarp-pcap".into())
            .spawn(move || {
                write_records(&s, &full_rx, out);
                full_rx
            })?;
        Ok(Capture {
            shared,
            writer: Some(writer),
            path: path.to_owned(),
        })
    }

    /// A handle for a socket ([`XskConfig::capture`](super::XskConfig::capture)).
    pub fn tap(&self) -> CaptureTap {
        CaptureTap {
            shared: self.shared.clone(),
        }
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The counts so far.
    pub fn stats(&self) -> CaptureStats {
        let s = &*self.shared;
        CaptureStats {
            seen: s.seen.load(Ordering::Relaxed),
            written: s.written.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            truncated: s.truncated.load(Ordering::Relaxed),
            error: s.error.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }

    /// Stops taking frames (later ones count as dropped), writes what is queued, flushes and
    /// closes the file, and returns the final counts. Stop the engine first to have all of
    /// its frames.
    pub fn finish(mut self) -> CaptureStats {
        self.stop();
        self.stats()
    }

    fn stop(&mut self) {
        self.shared.finished.store(true, Ordering::SeqCst);
        if let Some(w) = self.writer.take() {
            match w.join() {
                // A tap that passed the `finished` check just before it was set may have
                // queued a frame after the writer's last look: counted, not lost silently.
                Ok(full) => {
                    let late = full.try_iter().count() as u64;
                    self.shared.dropped.fetch_add(late, Ordering::Relaxed);
                }
                Err(_) => self.set_error("the capture writer panicked".into()),
            }
        }
    }

    fn set_error(&self, e: String) {
        let mut g = self.shared.error.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert(e);
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The writer thread's file: records go in until the first error. Each record reaches the
/// file whole: the buffer's flushes fall between records, never inside one, so a file read
/// while it is written, or left by a run killed before [`Capture::finish`], ends with a whole
/// record (Wireshark reads it without "cut short in the middle of a packet").
struct PcapFile {
    out: BufWriter<File>,
    failed: bool,
    /// A record larger than the whole buffer, header and data joined for one write (empty
    /// until the first such record: with the default sizes there is none).
    joined: Vec<u8>,
}

impl PcapFile {
    /// Records go to `out`, which already holds the global header.
    fn new(out: BufWriter<File>) -> Self {
        PcapFile {
            out,
            failed: false,
            joined: Vec::new(),
        }
    }

    /// Writes one record (or counts it dropped after an error) and returns its buffer.
    fn write(&mut self, s: &Shared, rec: Record) {
        if !self.failed {
            let saved = rec.data.len() as u32;
            let header = pcap_record_header(rec.unix_ns, saved, rec.orig_len);
            let res = self.write_whole(&header, &rec.data);
            match res {
                Ok(()) => {
                    s.written.fetch_add(1, Ordering::Relaxed);
                    if saved < rec.orig_len {
                        s.truncated.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(e) => self.fail(s, &e),
            }
        }
        if self.failed {
            s.dropped.fetch_add(1, Ordering::Relaxed);
        }
        // Bounded at the number of buffers: never full.
        let _ = s.free_tx.try_send(rec.data);
    }

    /// Puts `header` and `data` into the file as one piece. `BufWriter::write_all` flushes its
    /// buffer first when a write does not fit the room left, so two writes (header, then data)
    /// could leave a header without its data on disk: the buffer is flushed here before the
    /// record when it does not fit, and a record larger than the whole buffer goes to the
    /// file in one write.
    fn write_whole(&mut self, header: &[u8], data: &[u8]) -> io::Result<()> {
        let len = header.len() + data.len();
        if self.out.capacity() - self.out.buffer().len() < len {
            self.out.flush()?;
        }
        if len <= self.out.capacity() {
            // Both fit the room left: neither write flushes.
            self.out.write_all(header)?;
            self.out.write_all(data)
        } else {
            // The buffer is empty now; a write of at least its capacity goes straight to the
            // file.
            self.joined.clear();
            self.joined.extend_from_slice(header);
            self.joined.extend_from_slice(data);
            self.out.write_all(&self.joined)
        }
    }

    fn flush(&mut self, s: &Shared) {
        if !self.failed {
            if let Err(e) = self.out.flush() {
                self.fail(s, &e);
            }
        }
    }

    fn fail(&mut self, s: &Shared, e: &io::Error) {
        self.failed = true;
        let mut g = s.error.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert(format!("writing the capture: {e}"));
    }
}

/// The writer thread: records to the file until the capture finishes and its queue is empty.
fn write_records(s: &Shared, full: &Receiver<Record>, out: BufWriter<File>) {
    let mut file = PcapFile::new(out);
    let mut flushed = Instant::now();
    loop {
        match full.recv_timeout(WRITER_POLL) {
            Ok(rec) => {
                file.write(s, rec);
                // Busy too: what is written reaches the file at least this often, so that a
                // run killed before `finish` loses at most the last moments.
                if flushed.elapsed() >= FLUSH_EVERY {
                    file.flush(s);
                    flushed = Instant::now();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if s.finished.load(Ordering::SeqCst) {
                    break;
                }
                // Idle: what is written is in the file now (a reader may follow it).
                file.flush(s);
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // Frames handed over before `finished` was seen.
    while let Ok(rec) = full.try_recv() {
        file.write(s, rec);
    }
    file.flush(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_global_header_says_pcap_2_4_nanoseconds_ethernet() {
        assert_eq!(
            pcap_header(4096),
            [
                0x4d, 0x3c, 0xb2, 0xa1, // magic, nanosecond resolution, little-endian
                2, 0, 4, 0, // version 2.4
                0, 0, 0, 0, // thiszone
                0, 0, 0, 0, // sigfigs
                0, 0x10, 0, 0, // snaplen 4096
                1, 0, 0, 0, // LINKTYPE_ETHERNET
            ]
        );
    }

    #[test]
    fn a_record_header_splits_seconds_and_nanoseconds() {
        let ns = 1_700_000_000 * 1_000_000_000 + 123_456_789;
        let h = pcap_record_header(ns, 60, 1514);
        assert_eq!(&h[0..4], &1_700_000_000u32.to_le_bytes());
        assert_eq!(&h[4..8], &123_456_789u32.to_le_bytes());
        assert_eq!(&h[8..12], &60u32.to_le_bytes());
        assert_eq!(&h[12..16], &1514u32.to_le_bytes());
    }

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("iwarp-capture-{}-{name}.pcap", std::process::id()))
    }

    /// The records of a file written by a capture: (time, saved octets, length on the wire).
    fn records(path: &Path) -> Vec<(u64, Vec<u8>, u32)> {
        let b = std::fs::read(path).expect("read");
        assert_eq!(&b[..4], &PCAP_MAGIC_NS.to_le_bytes());
        let mut at = PCAP_HEADER_LEN;
        let mut out = Vec::new();
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 octets"));
        while at < b.len() {
            let ns = u64::from(u32_at(at)) * 1_000_000_000 + u64::from(u32_at(at + 4));
            let saved = u32_at(at + 8) as usize;
            let orig = u32_at(at + 12);
            let start = at + PCAP_RECORD_HEADER_LEN;
            out.push((ns, b[start..start + saved].to_vec(), orig));
            at = start + saved;
        }
        out
    }

    /// With the default sizes a packet over the most UMEM frames a packet may span (an MTU
    /// 9000 segment is three of them) is written whole: its MPA CRC, at the end, is in the
    /// file.
    #[test]
    fn the_default_snap_length_keeps_a_whole_multi_frame_packet() {
        let path = temp("jumbo");
        let cap = Capture::create(&path, CaptureConfig::default()).expect("create");
        let frame: Vec<u8> = (0..DEFAULT_SNAPLEN / 4096 * 3840)
            .map(|i| i as u8)
            .collect();
        let pieces: Vec<&[u8]> = frame.chunks(3840).collect();
        cap.tap().record_pieces(&pieces);
        let st = cap.finish();
        assert_eq!((st.written, st.truncated), (1, 0), "{st:?}");
        let recs = records(&path);
        let _ = std::fs::remove_file(&path);
        assert_eq!(recs[0].1, frame);
    }

    #[test]
    fn frames_are_written_in_order_cut_at_the_snap_length() {
        let path = temp("order");
        let cap = Capture::create(
            &path,
            CaptureConfig {
                slots: 64,
                snaplen: 100,
            },
        )
        .expect("create");
        let tap = cap.tap();
        let frames: Vec<Vec<u8>> = (0..50u8)
            .map(|i| (0..20 + usize::from(i) * 3).map(|k| i ^ k as u8).collect())
            .collect();
        for (i, f) in frames.iter().enumerate() {
            if i % 2 == 0 {
                tap.record(f);
            } else {
                // In three pieces, as the frames of a multi-buffer packet: joined in order.
                let (a, rest) = f.split_at(f.len() / 3);
                let (b, c) = rest.split_at(rest.len() / 2);
                tap.record_pieces(&[a, b, c]);
            }
            // The writer keeps up with 64 buffers at this pace.
            std::thread::sleep(Duration::from_micros(200));
        }
        let st = cap.finish();
        assert_eq!(st.seen, 50);
        assert_eq!(st.written + st.dropped, 50, "{st:?}");
        assert_eq!(st.dropped, 0, "{st:?}");
        let long = frames.iter().filter(|f| f.len() > 100).count() as u64;
        assert_eq!(st.truncated, long);
        let recs = records(&path);
        assert_eq!(recs.len(), 50);
        for (i, ((ns, saved, orig), f)) in recs.iter().zip(&frames).enumerate() {
            assert_eq!(*orig as usize, f.len(), "record {i}");
            assert_eq!(saved[..], f[..f.len().min(100)], "record {i}");
            if i > 0 {
                assert!(*ns >= recs[i - 1].0, "timestamps go forward");
            }
        }
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_full_ring_drops_and_counts_instead_of_waiting() {
        let path = temp("full");
        let cap = Capture::create(
            &path,
            CaptureConfig {
                slots: 4,
                snaplen: 64,
            },
        )
        .expect("create");
        let tap = cap.tap();
        // Far more than the ring holds, as fast as possible: some are dropped, none waits.
        for i in 0..10_000u32 {
            tap.record(&i.to_le_bytes());
        }
        let st = cap.finish();
        assert_eq!(st.seen, 10_000);
        assert_eq!(st.written + st.dropped, 10_000, "{st:?}");
        assert_eq!(records(&path).len() as u64, st.written);
        // After finish, a tap only counts.
        tap.record(&[1, 2, 3]);
        let _ = std::fs::remove_file(&path);
    }

    /// Octets at the end of the pcap file at `path` that are not a whole record (a record
    /// header without all its data, or part of a header); the whole records are counted.
    fn whole_records(path: &Path) -> (usize, usize) {
        let b = std::fs::read(path).expect("read");
        assert!(b.len() >= PCAP_HEADER_LEN, "no global header");
        let (mut at, mut whole) = (PCAP_HEADER_LEN, 0);
        while at + PCAP_RECORD_HEADER_LEN <= b.len() {
            let saved = u32::from_le_bytes(b[at + 8..at + 12].try_into().expect("4 octets"));
            let end = at + PCAP_RECORD_HEADER_LEN + saved as usize;
            if end > b.len() {
                break;
            }
            whole += 1;
            at = end;
        }
        (whole, b.len() - at)
    }

    /// The file behind a small buffer holds only whole records after each write, whatever
    /// the buffer's flushes (a run killed at any moment leaves no record cut short), also for
    /// a record larger than the whole buffer.
    #[test]
    fn a_flush_of_the_buffer_never_splits_a_record() {
        let path = temp("whole");
        let (free_tx, free_rx) = crossbeam_channel::bounded(1);
        let (full_tx, _full_rx) = crossbeam_channel::bounded(1);
        let s = Shared {
            free_tx,
            free_rx,
            full_tx,
            snaplen: 1000,
            finished: AtomicBool::new(false),
            seen: AtomicU64::new(0),
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            error: Mutex::new(None),
        };
        let mut out = BufWriter::with_capacity(100, File::create(&path).expect("create"));
        out.write_all(&pcap_header(1000)).expect("header");
        out.flush().expect("flush");
        let mut file = PcapFile::new(out);
        let sizes = [60, 60, 60, 10, 84, 60, 200, 60, 1, 99];
        for (i, &len) in sizes.iter().enumerate() {
            file.write(
                &s,
                Record {
                    unix_ns: i as u64,
                    orig_len: len as u32,
                    data: vec![i as u8; len],
                },
            );
            let (whole, rest) = whole_records(&path);
            assert_eq!(
                rest, 0,
                "after record {i} ({len} octets): {whole} whole records, then part of one"
            );
            // A buffer to the free queue per record: take it back for the next.
            let _ = s.free_rx.try_recv();
        }
        file.flush(&s);
        assert_eq!(whole_records(&path), (sizes.len(), 0));
        assert_eq!(s.written.load(Ordering::Relaxed), sizes.len() as u64);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn an_empty_ring_is_refused() {
        let path = temp("empty");
        let err = Capture::create(
            &path,
            CaptureConfig {
                slots: 0,
                snaplen: 64,
            },
        )
        .expect_err("zero slots");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
