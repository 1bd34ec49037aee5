//! What tcp-engine's fuzz targets share.

/// Reads fixed-width values off the fuzz input; zeros once it runs out.
pub struct Input<'a>(pub &'a [u8]);

impl Input<'_> {
    /// Whether the input is used up.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The next octet.
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    /// The next two octets, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next four octets, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
}

use tcp_engine::wire::{TcpFlags, TcpOptions};
use tcp_engine::{FourTuple, SegmentRepr};

/// What the remote end of `t` sends to its local end (the side under test).
pub fn from_remote<'a>(
    t: &FourTuple,
    seq: u32,
    ack: u32,
    flags: TcpFlags,
    window: u16,
    options: TcpOptions,
    payload: &'a [u8],
) -> SegmentRepr<'a> {
    SegmentRepr {
        tos: 0,
        src_addr: t.remote_addr,
        dst_addr: t.local_addr,
        src_port: t.remote_port,
        dst_port: t.local_port,
        seq,
        ack,
        flags,
        window,
        options,
        payload,
    }
}

/// Runs a transmit loop to its end: `poll` writes the next packet into `buf` and says its
/// length; each must parse (`each` sees it), and the loop must end within 10,000 packets.
pub fn for_each_transmitted(
    buf: &mut [u8],
    mut poll: impl FnMut(&mut [u8]) -> Option<usize>,
    mut each: impl FnMut(&SegmentRepr<'_>),
) {
    let mut emitted = 0;
    while let Some(n) = poll(buf) {
        match SegmentRepr::parse(&buf[..n]) {
            Ok(seg) => each(&seg),
            Err(e) => panic!("emitted an unparseable packet: {e:?}"),
        }
        emitted += 1;
        assert!(emitted < 10_000, "the transmit loop does not end");
    }
}
