//! Where a socket's frames lie in its UMEM and which of them the kernel holds: what the kernel
//! hands back on the RX and completion rings is checked against it before any view of a frame
//! is made. The rings are memory the process can write, and `xsk-rs` turns a
//! descriptor into a slice with no bounds check, so a wrong descriptor (a kernel bug, a stray
//! write into the mapping) would otherwise become a read outside the UMEM, a frame written
//! while the kernel owns it, or two writable views of one frame.
//!
//! The layout is the socket's (aligned mode, chunks of a power-of-two size): the RX pool's
//! frames first, cycling between the fill and RX rings, then the TX pool's, cycling between
//! the free list, the TX ring and the completion ring. The two pools never trade frames.

/// The RX and TX pools of one socket's UMEM, and the frames of each the kernel holds.
#[derive(Debug)]
pub(super) struct FrameBook {
    /// Octets of the RX pool (its frames from the UMEM's start).
    rx_len: usize,
    /// One bit per RX frame: set while it is on the fill ring (the kernel's to write), until
    /// it comes back on the RX ring.
    rx_given: Vec<u64>,
    /// The chunk size less one.
    chunk_mask: usize,
    /// log2 of the chunk size.
    chunk_shift: u32,
    /// Address of the first TX frame's data (its chunk plus the headroom every frame's data
    /// starts after); the other TX frames follow a chunk apart.
    tx_base: usize,
    /// Frames of the TX pool.
    tx_frames: usize,
    /// One bit per TX frame: set while it is on the TX ring or in the kernel's hands, until
    /// its completion is taken back.
    tx_lent: Vec<u64>,
}

impl FrameBook {
    /// The book of a UMEM of `chunk_size`-octet chunks (a power of two) whose first
    /// `rx_frames` frames are the RX pool and whose `tx_frames` TX frames start with the one
    /// whose data is at `tx_base`.
    pub(super) fn new(rx_frames: u32, tx_frames: u32, chunk_size: u32, tx_base: usize) -> Self {
        debug_assert!(chunk_size.is_power_of_two());
        let tx_frames = tx_frames as usize;
        FrameBook {
            rx_len: rx_frames as usize * chunk_size as usize,
            rx_given: vec![0; (rx_frames as usize).div_ceil(64)],
            chunk_mask: chunk_size as usize - 1,
            chunk_shift: chunk_size.trailing_zeros(),
            tx_base,
            tx_frames,
            tx_lent: vec![0; tx_frames.div_ceil(64)],
        }
    }

    /// Whether a received frame of `len` octets at `addr` lies in one chunk of the RX pool
    /// (in aligned mode the kernel writes a frame into the chunk it took from the fill ring,
    /// after the headroom).
    #[inline]
    fn holds_rx(&self, addr: usize, len: usize) -> bool {
        addr < self.rx_len && (addr & self.chunk_mask).saturating_add(len) <= self.chunk_mask + 1
    }

    /// Notes that the RX frame at `addr` (one of ours, in the RX pool) went on the fill ring.
    #[inline]
    pub(super) fn give_rx(&mut self, addr: usize) {
        debug_assert!(addr < self.rx_len, "not an RX frame: {addr:#x}");
        let frame = addr >> self.chunk_shift;
        if let Some(word) = self.rx_given.get_mut(frame / 64) {
            debug_assert!(
                *word & (1 << (frame % 64)) == 0,
                "RX frame {frame} given twice"
            );
            *word |= 1 << (frame % 64);
        }
    }

    /// Takes a received frame of `len` octets at `addr`: true if it lies in one chunk of the
    /// RX pool ([`holds_rx`](Self::holds_rx)) whose frame the kernel held (then it is ours
    /// until given back), false for anything else (outside the pool, across chunks, a frame
    /// received already and not given back since).
    #[inline]
    pub(super) fn take_rx(&mut self, addr: usize, len: usize) -> bool {
        if !self.holds_rx(addr, len) {
            return false;
        }
        let frame = addr >> self.chunk_shift;
        let (word, bit) = (frame / 64, 1u64 << (frame % 64));
        let given = self.rx_given[word] & bit != 0;
        self.rx_given[word] &= !bit;
        given
    }

    /// The TX frame whose data starts at `addr`, if there is one.
    #[inline]
    fn tx_frame(&self, addr: usize) -> Option<usize> {
        let offset = addr.wrapping_sub(self.tx_base);
        let frame = offset >> self.chunk_shift;
        (offset & self.chunk_mask == 0 && frame < self.tx_frames).then_some(frame)
    }

    /// Notes that the TX frame at `addr` (one of the free list's) went on the TX ring.
    #[inline]
    pub(super) fn lend_tx(&mut self, addr: usize) {
        let frame = self.tx_frame(addr);
        debug_assert!(frame.is_some(), "not a TX frame's start: {addr:#x}");
        if let Some(frame) = frame {
            let word = &mut self.tx_lent[frame / 64];
            debug_assert!(
                *word & (1 << (frame % 64)) == 0,
                "TX frame {frame} lent twice"
            );
            *word |= 1 << (frame % 64);
        }
    }

    /// Takes back the TX frame a completion names: true if `addr` is the start of a TX
    /// frame's data that was lent and not yet taken back (then it is the free list's again),
    /// false for anything else (outside the TX pool, inside a frame, a second completion of
    /// one frame, one never sent).
    #[inline]
    pub(super) fn take_back_tx(&mut self, addr: usize) -> bool {
        let Some(frame) = self.tx_frame(addr) else {
            return false;
        };
        let (word, bit) = (frame / 64, 1u64 << (frame % 64));
        let lent = self.tx_lent[word] & bit != 0;
        self.tx_lent[word] &= !bit;
        lent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four RX frames, then three TX frames, of 4 KiB chunks with data 256 octets in.
    fn book() -> FrameBook {
        FrameBook::new(4, 3, 4096, 4 * 4096 + 256)
    }

    /// A received frame must lie in one chunk of the RX pool: the last octet of the last RX
    /// chunk is in, one more is not, the TX pool is not, and no length wraps the check.
    #[test]
    fn received_frames_must_lie_in_one_chunk_of_the_rx_pool() {
        let b = book();
        assert!(b.holds_rx(0, 0));
        assert!(b.holds_rx(256, 3840), "a whole frame after the headroom");
        assert!(b.holds_rx(3 * 4096 + 256, 3840), "the last RX chunk's");
        assert!(
            !b.holds_rx(3 * 4096 + 256, 3841),
            "one octet into the next chunk"
        );
        assert!(!b.holds_rx(4096 + 4000, 200), "across two chunks");
        assert!(!b.holds_rx(4 * 4096 + 256, 64), "a TX frame");
        assert!(!b.holds_rx(7 * 4096 + 256, 64), "past the UMEM");
        assert!(!b.holds_rx(usize::MAX, 1));
        assert!(!b.holds_rx(256, usize::MAX), "a length that would wrap");
        assert!(!b.holds_rx(256, u32::MAX as usize));
    }

    /// A received frame is taken only if it lies in a chunk of the RX pool the kernel held,
    /// and only once until given back again.
    #[test]
    fn a_received_frame_is_taken_only_if_the_kernel_held_it() {
        let mut b = book();
        let rx = |i: usize| i * 4096 + 256;
        assert!(!b.take_rx(rx(1), 64), "never given");
        b.give_rx(rx(1));
        b.give_rx(rx(3));
        assert!(
            !b.take_rx(rx(1) - 256, 5000),
            "across chunks: refused, still the kernel's"
        );
        assert!(
            b.take_rx(rx(1) + 4, 60),
            "anywhere in the chunk (a program moved the start)"
        );
        assert!(!b.take_rx(rx(1), 64), "a second time");
        assert!(!b.take_rx(4 * 4096 + 256, 64), "a TX frame");
        assert!(b.take_rx(rx(3), 3840));
        b.give_rx(rx(1));
        assert!(b.take_rx(rx(1), 64), "given again");
    }

    /// A completion gives back a TX frame only if it names the start of one that was lent,
    /// and only once.
    #[test]
    fn a_completion_takes_back_only_a_lent_tx_frame_once() {
        let mut b = book();
        let tx = |i: usize| 4 * 4096 + 256 + i * 4096;
        assert!(!b.take_back_tx(tx(0)), "never lent");
        b.lend_tx(tx(0));
        b.lend_tx(tx(2));
        assert!(b.take_back_tx(tx(2)));
        assert!(
            !b.take_back_tx(tx(2)),
            "a second completion of the same frame"
        );
        assert!(!b.take_back_tx(tx(0) + 64), "inside a lent frame");
        assert!(!b.take_back_tx(tx(0) - 4096), "an RX frame's place");
        assert!(!b.take_back_tx(tx(3)), "past the TX pool");
        assert!(!b.take_back_tx(usize::MAX));
        assert!(!b.take_back_tx(0));
        assert!(b.take_back_tx(tx(0)), "still lent after the refusals");
        b.lend_tx(tx(0));
        assert!(b.take_back_tx(tx(0)), "lent again");
    }

    /// The bitmap covers every TX frame of a pool that is not a multiple of 64.
    #[test]
    fn every_tx_frame_of_a_large_pool_has_its_bit() {
        let mut b = FrameBook::new(512, 2048 + 5, 4096, 512 * 4096 + 256);
        for i in [0, 63, 64, 2047, 2048, 2052] {
            let addr = 512 * 4096 + 256 + i * 4096;
            b.lend_tx(addr);
            assert!(b.take_back_tx(addr), "frame {i}");
        }
        assert!(
            !b.take_back_tx(512 * 4096 + 256 + 2053 * 4096),
            "one past the pool"
        );
    }
}
