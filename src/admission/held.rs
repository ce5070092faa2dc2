//! The reservations of one call: [`Reserved`] while `admit` takes them
//! (dropped, it gives them back), [`Held`] once a ticket keeps them (to
//! settle them after the reply).
//!
//! Neither holds a bucket: a reservation is its stamps, and giving it back
//! looks the bucket up again by key (`Scoped::cancel_stamps`), which
//! refuses when the key's bucket was dropped and created again meanwhile.
//! So a reservation clones no `Arc`, the bucket stays in its table slot,
//! and a ticket stays 128 bytes (it is moved a few times per call; larger
//! moves are a `memcpy` call each).

use core::num::NonZeroU32;

use smallvec::SmallVec;

use super::Admission;
use crate::bucket::gcra::Ticket as Stamps;
use crate::clock::Clock;
use crate::sleep::Sleeper;

/// Which bucket a reservation came from: the credential's request quota,
/// its server scope, or the index of a weighted quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    Requests,
    Resource(usize),
    Scope,
}

/// One reservation, 24 bytes: the cells and what gives them back.
#[derive(Clone, Copy, Debug)]
pub(super) struct Kept {
    before: u64,
    after: u64,
    /// The bucket's epoch + 1 (epochs are 31 bits): a niche, so that
    /// [`Held`] needs no tag of its own.
    epoch: NonZeroU32,
    /// 0: an empty place in [`Held`].
    pub(super) cells: u32,
}

impl Kept {
    const EMPTY: Kept = Kept {
        before: 0,
        after: 0,
        epoch: NonZeroU32::MAX,
        cells: 0,
    };

    pub(super) fn new(stamps: Stamps, cells: u32) -> Kept {
        Kept {
            before: stamps.before,
            after: stamps.after,
            epoch: NonZeroU32::MIN.saturating_add(stamps.epoch),
            cells,
        }
    }

    /// The stamps to give the cells back with.
    pub(super) fn stamps(&self) -> Stamps {
        Stamps {
            before: self.before,
            after: self.after,
            epoch: self.epoch.get() - 1,
        }
    }
}

/// The reservations a ticket keeps, by place: the request quota at 0, the
/// weighted quota `i` at `1 + i` (a server scope's cell is never settled,
/// so it is not kept). Inline for up to three weighted quotas (96 bytes,
/// no tag: `Kept`'s niche tells the two apart); a layer with more spills
/// to the heap.
#[derive(Debug)]
pub(super) enum Held {
    Inline([Kept; 4]),
    Spilled(Box<[Kept]>),
}

// The point of the layout: no tag beside the four places.
const _: () = assert!(core::mem::size_of::<Held>() == 4 * core::mem::size_of::<Kept>());

impl Held {
    /// The reservation at `place`, if the call made one.
    pub(super) fn get(&self, place: usize) -> Option<&Kept> {
        let all: &[Kept] = match self {
            Held::Inline(k) => k,
            Held::Spilled(k) => k,
        };
        all.get(place).filter(|k| k.cells > 0)
    }

    fn place(source: Source) -> Option<usize> {
        match source {
            Source::Requests => Some(0),
            Source::Resource(i) => i.checked_add(1),
            Source::Scope => None,
        }
    }
}

/// The reservations of a call being admitted. Until [`keep`](Self::keep),
/// dropping it gives every one back (a refused or cancelled call consumes
/// nothing the buckets can refund).
pub(super) struct Reserved<'a, S: Sleeper, C: Clock> {
    admission: &'a Admission<S, C>,
    credential: &'a str,
    /// The server scope's key, for a call that reserves a cell of it.
    pub(super) scope: Option<&'a (String, String)>,
    list: SmallVec<[(Source, Kept); 4]>,
}

impl<'a, S: Sleeper, C: Clock> Reserved<'a, S, C> {
    pub(super) fn new(
        admission: &'a Admission<S, C>,
        credential: &'a str,
        scope: Option<&'a (String, String)>,
    ) -> Self {
        Self {
            admission,
            credential,
            scope,
            list: SmallVec::new(),
        }
    }

    pub(super) fn push(&mut self, source: Source, stamps: Option<Stamps>, cells: u32) {
        // `None`: zero cells, nothing to give back.
        if let Some(stamps) = stamps {
            self.list.push((source, Kept::new(stamps, cells)));
        }
    }

    pub(super) fn cancel_all(&mut self) {
        for (source, kept) in self.list.drain(..) {
            let _ = self
                .admission
                .undo(self.credential, self.scope, source, &kept);
        }
    }

    /// The cells are used now: hand them to the ticket, which may settle
    /// them against the actual usage.
    pub(super) fn keep(&mut self) -> Held {
        // By reference, then cleared (so `Drop` gives nothing back): the
        // list is not moved.
        let places = self.list.iter().filter_map(|(s, _)| Held::place(*s));
        let len = places.max().map_or(0, |p| p + 1);
        let mut held = if len <= 4 {
            Held::Inline([Kept::EMPTY; 4])
        } else {
            Held::Spilled(vec![Kept::EMPTY; len].into_boxed_slice())
        };
        let all: &mut [Kept] = match &mut held {
            Held::Inline(k) => k,
            Held::Spilled(k) => k,
        };
        for (source, kept) in &self.list {
            if let Some(place) = Held::place(*source) {
                all[place] = *kept;
            }
        }
        self.list.clear();
        held
    }
}

impl<S: Sleeper, C: Clock> Drop for Reserved<'_, S, C> {
    fn drop(&mut self) {
        self.cancel_all();
    }
}
