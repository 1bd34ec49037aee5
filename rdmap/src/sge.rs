//! Scatter/gather lists: the local memory of a work request as up to [`MAX_SGE`] pieces of
//! registered regions (verbs' `ibv_sge` array), gathered into one message on transmit and
//! scattered from one message on receive.

use crate::types::Stag;

/// Most scatter/gather elements one work request carries (verbs' `max_sge`; Linux siw offers
/// 6, Chelsio's iWARP adapters 4). The list is kept inline in the work request, which moves by
/// value from the application to the engine and into the send queue: each element makes every
/// post 16 octets longer to copy, whether used or not.
pub const MAX_SGE: usize = 8;

/// A local memory range: `len` octets at TO `to` of the region `stag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Local STag.
    pub stag: Stag,
    /// Tagged offset of the first octet.
    pub to: u64,
    /// Length in octets.
    pub len: u32,
}

/// The scatter/gather list of a work request: at most [`MAX_SGE`] elements, in message order.
/// Empty (or all elements of length zero) for a zero-length message. Kept inline (no
/// allocation), so a work request stays a plain value.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SgeList {
    len: u8,
    sges: [Sge; MAX_SGE],
}

/// [`SgeList::push`] on a list that holds [`MAX_SGE`] elements already.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a scatter/gather list holds at most {MAX_SGE} elements")]
pub struct SgeListFull;

impl SgeList {
    /// An empty list (a zero-length message).
    pub const fn new() -> SgeList {
        SgeList {
            len: 0,
            sges: [Sge {
                stag: Stag(0),
                to: 0,
                len: 0,
            }; MAX_SGE],
        }
    }

    /// The list of `sges`, or `None` if they are more than [`MAX_SGE`].
    pub fn from_slice(sges: &[Sge]) -> Option<SgeList> {
        let mut list = SgeList::new();
        for &s in sges {
            list.push(s).ok()?;
        }
        Some(list)
    }

    /// Appends an element.
    pub fn push(&mut self, sge: Sge) -> Result<(), SgeListFull> {
        let slot = self
            .sges
            .get_mut(usize::from(self.len))
            .ok_or(SgeListFull)?;
        *slot = sge;
        self.len += 1;
        Ok(())
    }

    /// The elements.
    pub fn as_slice(&self) -> &[Sge] {
        &self.sges[..usize::from(self.len)]
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// True for an empty list.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The message length: the sum of the elements' lengths.
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|s| u64::from(s.len)).sum()
    }

    /// The piece of the list that holds message offset `offset`: the element and how far into
    /// it, with at most `max` octets (fewer at the element's end). `None` past the end. Empty
    /// elements are skipped.
    #[inline]
    pub fn piece_at(&self, offset: u64, max: u64) -> Option<(Sge, u64)> {
        let mut start = 0u64;
        for s in self.as_slice() {
            let len = u64::from(s.len);
            if offset < start + len {
                let into = offset - start;
                let n = (len - into).min(max);
                return Some((
                    Sge {
                        stag: s.stag,
                        to: s.to.wrapping_add(into),
                        // At most `s.len`.
                        len: n as u32,
                    },
                    n,
                ));
            }
            start += len;
        }
        None
    }

    /// The pieces of the list covering `len` octets from message offset `offset`, in order
    /// (each at most one element's part); fewer octets if the list ends first.
    pub fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = Sge> + '_ {
        let mut at = offset;
        let end = offset.saturating_add(len);
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let (piece, n) = self.piece_at(at, end - at)?;
            at += n;
            Some(piece)
        })
    }
}

impl Default for SgeList {
    fn default() -> Self {
        SgeList::new()
    }
}

impl std::fmt::Debug for SgeList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl From<Sge> for SgeList {
    fn from(sge: Sge) -> SgeList {
        let mut list = SgeList::new();
        list.sges[0] = sge;
        list.len = 1;
        list
    }
}

impl From<Option<Sge>> for SgeList {
    fn from(sge: Option<Sge>) -> SgeList {
        sge.map_or(SgeList::new(), SgeList::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(stag: u32, to: u64, len: u32) -> Sge {
        Sge {
            stag: Stag(stag),
            to,
            len,
        }
    }

    #[test]
    fn pieces_split_at_element_boundaries_and_skip_empty_elements() {
        let list = SgeList::from_slice(&[sge(1, 100, 10), sge(2, 0, 0), sge(3, 500, 5)]).unwrap();
        assert_eq!(list.total_len(), 15);
        let got: Vec<_> = list.pieces(8, 5).collect();
        assert_eq!(got, vec![sge(1, 108, 2), sge(3, 500, 3)]);
        assert_eq!(list.piece_at(10, 100), Some((sge(3, 500, 5), 5)));
        assert_eq!(list.piece_at(15, 1), None);
        assert_eq!(list.pieces(12, 100).count(), 1, "stops at the end");
    }

    #[test]
    fn a_list_holds_at_most_max_sge() {
        let mut list = SgeList::new();
        for i in 0..MAX_SGE {
            list.push(sge(1, i as u64, 1)).unwrap();
        }
        assert_eq!(list.push(sge(1, 0, 1)), Err(SgeListFull));
        assert!(SgeList::from_slice(&[sge(1, 0, 1); MAX_SGE + 1]).is_none());
        assert_eq!(list.len(), MAX_SGE);
    }
}
