//! A minimal AF_XDP socket for tests, on raw libc: one UMEM, a fill ring (filled once) and an
//! RX ring, bound in copy mode to one interface queue. Enough to show that a packet reached
//! the socket's RX ring; the real engine lives in `datapath`.

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    ptr,
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

/// Frames in the UMEM (also the ring sizes; a power of two).
const FRAMES: u32 = 64;
/// Frame size (aligned mode: a power of two between 2048 and the page size).
const FRAME_SIZE: u32 = 4096;

/// One mmap()ed region, unmapped on drop.
struct Mapping {
    addr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(fd: RawFd, len: usize, offset: libc::off_t, shared_with: bool) -> io::Result<Self> {
        let (flags, fd) = if shared_with {
            (libc::MAP_SHARED | libc::MAP_POPULATE, fd)
        } else {
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
        };
        // SAFETY: a fresh mapping at an address the kernel picks; no existing memory is touched.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            addr: addr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `addr`/`len` describe a mapping made by `Mapping::new` and unmapped only here.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// A single-producer/single-consumer ring shared with the kernel.
struct Ring {
    map: Mapping,
    producer: usize,
    consumer: usize,
    desc: usize,
    mask: u32,
}

impl Ring {
    fn counter(&self, off: usize) -> &AtomicU32 {
        // SAFETY: `off` is the producer or consumer offset the kernel reported for this ring;
        // the u32 there is 4-byte aligned, inside the mapping, and lives as long as `self`.
        // The kernel accesses it atomically too.
        unsafe { &*(self.map.addr.add(off) as *const AtomicU32) }
    }
    fn producer(&self) -> &AtomicU32 {
        self.counter(self.producer)
    }
    fn consumer(&self) -> &AtomicU32 {
        self.counter(self.consumer)
    }
    /// Pointer to descriptor `idx` (masked) of type `T`.
    fn desc<T>(&self, idx: u32) -> *mut T {
        let i = (idx & self.mask) as usize;
        // SAFETY: the ring was mapped with room for `mask + 1` descriptors of this type after
        // `desc` (see `Xsk::new`).
        unsafe { self.map.addr.add(self.desc + i * size_of::<T>()).cast() }
    }
}

/// A received frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The queue the socket is bound to.
    pub queue: u32,
    /// The whole Ethernet frame.
    pub data: Vec<u8>,
}

/// An AF_XDP socket bound to (ifindex, queue) in copy mode, with its own UMEM.
pub struct Xsk {
    // Drop order: socket first (the kernel stops writing), then the mappings.
    fd: OwnedFd,
    queue: u32,
    rx: Ring,
    _fill: Ring,
    umem: Mapping,
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn setsockopt<T>(fd: RawFd, opt: libc::c_int, val: &T) -> io::Result<()> {
    // SAFETY: `val` points at a live T and the length passed is its size.
    check(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            opt,
            (val as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    })
}

impl Xsk {
    /// Creates the socket in the calling thread's network namespace and binds it to queue
    /// `queue` of interface `ifindex` (copy mode). Retries while the queue is still busy from a
    /// socket closed moments ago (EBUSY for ~0.2 s on veth).
    pub fn new(ifindex: u32, queue: u32) -> io::Result<Xsk> {
        // SAFETY: plain socket creation; the fd is owned right away.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let sfd = fd.as_raw_fd();

        let umem_len = (FRAMES * FRAME_SIZE) as usize;
        let umem = Mapping::new(-1, umem_len, 0, false)?;
        let reg = libc::xdp_umem_reg {
            addr: umem.addr as u64,
            len: umem_len as u64,
            chunk_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(sfd, libc::XDP_UMEM_REG, &reg)?;
        setsockopt(sfd, libc::XDP_UMEM_FILL_RING, &FRAMES)?;
        setsockopt(sfd, libc::XDP_UMEM_COMPLETION_RING, &FRAMES)?;
        setsockopt(sfd, libc::XDP_RX_RING, &FRAMES)?;

        // SAFETY: xdp_mmap_offsets is plain integers; all-zero is a valid value.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut optlen = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off`/`optlen` are live and `optlen` is the buffer's size.
        check(unsafe {
            libc::getsockopt(
                sfd,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut optlen,
            )
        })?;

        let fill_len = off.fr.desc as usize + FRAMES as usize * size_of::<u64>();
        let fill = Ring {
            map: Mapping::new(
                sfd,
                fill_len,
                libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t,
                true,
            )?,
            producer: off.fr.producer as usize,
            consumer: off.fr.consumer as usize,
            desc: off.fr.desc as usize,
            mask: FRAMES - 1,
        };
        let rx_len = off.rx.desc as usize + FRAMES as usize * size_of::<libc::xdp_desc>();
        let rx = Ring {
            map: Mapping::new(sfd, rx_len, libc::XDP_PGOFF_RX_RING, true)?,
            producer: off.rx.producer as usize,
            consumer: off.rx.consumer as usize,
            desc: off.rx.desc as usize,
            mask: FRAMES - 1,
        };

        // Hand every frame to the kernel.
        let prod = fill.producer().load(Ordering::Relaxed);
        for i in 0..FRAMES {
            // SAFETY: the fill ring holds FRAMES u64 descriptors; we are its only producer.
            unsafe { fill.desc::<u64>(prod + i).write((i * FRAME_SIZE) as u64) };
        }
        fill.producer().store(prod + FRAMES, Ordering::Release);

        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_COPY,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            // SAFETY: `sa` is a live sockaddr_xdp and the length is its size.
            let rc = unsafe {
                libc::bind(
                    sfd,
                    (&sa as *const libc::sockaddr_xdp).cast(),
                    size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            match check(rc) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(50))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Xsk {
            fd,
            queue,
            rx,
            _fill: fill,
            umem,
        })
    }

    /// The socket's fd (for `SteeringProgram::bind_socket`).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The queue it is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Takes every frame now in the RX ring (copied out; frames are not recycled).
    pub fn drain(&mut self) -> Vec<Frame> {
        let mut out = Vec::new();
        let prod = self.rx.producer().load(Ordering::Acquire);
        let mut cons = self.rx.consumer().load(Ordering::Relaxed);
        while cons != prod {
            // SAFETY: entries between consumer and producer were published by the kernel
            // (Acquire above) and are ours to read until we advance the consumer.
            let desc: libc::xdp_desc = unsafe { self.rx.desc::<libc::xdp_desc>(cons).read() };
            let (addr, len) = (desc.addr as usize, desc.len as usize);
            if addr + len <= self.umem.len {
                // SAFETY: the frame lies inside the UMEM (checked) and the kernel finished
                // writing it before publishing the descriptor.
                let bytes = unsafe { std::slice::from_raw_parts(self.umem.addr.add(addr), len) };
                out.push(Frame {
                    queue: self.queue,
                    data: bytes.to_vec(),
                });
            }
            cons = cons.wrapping_add(1);
        }
        self.rx.consumer().store(cons, Ordering::Release);
        out
    }
}
