//! perftest's `-I/--inline_size N`: Sends and RDMA Writes of at most N octets are posted
//! inline (`QueuePair::post_send_inline`, verbs' `IBV_SEND_INLINE`): their payload is copied
//! out of the registered buffer into the work request when it is posted, instead of being
//! gathered from the region when the message goes out. No effect on the wire (perftest
//! exchanges no inline size either: each side is given its own).

use datapath::{
    InlineData, InlineSendWr, MemoryRegion, SendOp, SendRequest, SendWr, MAX_INLINE_DATA,
};

/// Checks `-I N` for a test: at most [`MAX_INLINE_DATA`], and only where a Send or Write
/// carries the data. perftest offers no `-I` for Read and Atomic tests and sets their inline
/// size to 0 (`force_dependecies`): `-I 0` is accepted there, a larger one refused rather than
/// dropped.
pub fn check(n: Option<u32>, sends_or_writes: bool) -> Result<(), String> {
    match n {
        Some(n) if n as usize > MAX_INLINE_DATA => Err(format!(
            "-I {n}: a work request carries at most {MAX_INLINE_DATA} octets inline"
        )),
        Some(n) if n > 0 && !sends_or_writes => {
            Err("-I applies to Sends and RDMA Writes, not to Read or Atomic tests".into())
        }
        _ => Ok(()),
    }
}

/// `wr` as the work request to post: inline when `-I` covers it ([`inline_wr`]), as it is
/// otherwise.
pub fn request(wr: SendWr, src: &MemoryRegion, inline_size: u64) -> SendRequest {
    match inline_wr(&wr, src, inline_size) {
        Some(inline) => SendRequest::Inline(inline),
        None => SendRequest::Wr(wr),
    }
}

/// `wr` as an inline work request when `-I` covers it: a Send or Write (with or without
/// Immediate Data) of at most `inline_size` octets, every element of its list in `src`.
/// `None`: post it as it is.
pub fn inline_wr(wr: &SendWr, src: &MemoryRegion, inline_size: u64) -> Option<InlineSendWr> {
    let inlinable = matches!(
        wr.op,
        SendOp::Send { .. }
            | SendOp::Write { .. }
            | SendOp::SendImmediate { .. }
            | SendOp::WriteImmediate { .. }
    );
    if !inlinable || wr.sg_list.total_len() > inline_size {
        return None;
    }
    let mut buf = [0u8; MAX_INLINE_DATA];
    let mut at = 0;
    for sge in wr.sg_list.as_slice() {
        if sge.stag != src.stag() {
            return None;
        }
        let off = usize::try_from(sge.to.checked_sub(src.base_to())?).ok()?;
        let dst = buf.get_mut(at..at + sge.len as usize)?;
        src.read(off, dst);
        at += dst.len();
    }
    Some(InlineSendWr {
        wr_id: wr.wr_id,
        op: wr.op,
        data: InlineData::new(&buf[..at]).ok()?,
        signaled: wr.signaled,
        fence: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datapath::{Access, ProtectionDomain, Stag};

    #[test]
    fn sends_and_writes_up_to_the_size_go_inline_with_their_octets() {
        let pd = ProtectionDomain::new();
        let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
        mr.write(100, &[1, 2, 3, 4]);
        let write = SendWr {
            wr_id: 9,
            op: SendOp::Write {
                remote_stag: Stag(5),
                remote_to: 0,
            },
            sg_list: mr.sge(100, 4).into(),
            signaled: false,
            fence: false,
        };
        let w = inline_wr(&write, &mr, 4).expect("inline");
        assert_eq!((w.wr_id, w.op, w.signaled), (9, write.op, false));
        assert_eq!(w.data.as_slice(), &[1, 2, 3, 4]);
        assert_eq!(inline_wr(&write, &mr, 3), None, "longer than -I");
        let read = SendWr {
            op: SendOp::Read {
                remote_stag: Stag(5),
                remote_to: 0,
            },
            ..write
        };
        assert_eq!(inline_wr(&read, &mr, 64), None, "a Read is never inline");
        let other = pd.register(64, Access::LOCAL_WRITE).unwrap();
        assert_eq!(
            inline_wr(&write, &other, 64),
            None,
            "another region's element"
        );
    }

    #[test]
    fn the_size_is_checked() {
        assert!(check(None, false).is_ok());
        assert!(check(Some(MAX_INLINE_DATA as u32), true).is_ok());
        assert!(check(Some(MAX_INLINE_DATA as u32 + 1), true).is_err());
        assert!(check(Some(16), false).is_err());
        // Nothing inline asked for: fine for a Read or Atomic test too (perftest's 0 there).
        assert!(check(Some(0), false).is_ok());
    }
}
