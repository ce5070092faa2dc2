//! The reservations of one call: [`Reserved`] while `admit` takes them
//! (dropped, it gives them back), [`Held`] once a ticket keeps them.
//! Neither holds a bucket: giving back looks it up by key and refuses if
//! it was recreated meanwhile. This keeps a ticket at 128 bytes.

use core::num::NonZeroU32;

use super::super::Admission;
use crate::bucket::gcra::Ticket as Stamps;
use crate::clock::Clock;
use crate::sleep::Sleeper;

/// Which bucket a reservation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::admission) enum Source {
    Requests,
    Resource(usize),
    Scope,
    /// The background share of the request quota (never settled).
    Background,
}

impl Source {
    /// Where a ticket keeps this source's reservation (scope and background
    /// cells are never settled: none).
    #[inline]
    pub(in crate::admission) fn place(self) -> Option<Place> {
        match self {
            Source::Requests => Some(Place(0)),
            Source::Resource(i) => Some(Place(i.saturating_add(1))),
            Source::Scope | Source::Background => None,
        }
    }
}

/// A quota's place in [`Held`]: requests at 0, weighted quota `i` at
/// `1 + i`. Only [`Source::place`] and [`Place::source`] know the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::admission) struct Place(usize);

impl Place {
    #[inline]
    pub(in crate::admission) fn index(self) -> usize {
        self.0
    }

    #[inline]
    pub(in crate::admission) fn source(self) -> Source {
        match self.0 {
            0 => Source::Requests,
            i => Source::Resource(i - 1),
        }
    }
}

/// One reservation, 24 bytes: the cells and the stamps to give them back.
#[derive(Clone, Copy, Debug)]
pub(in crate::admission) struct Kept {
    before: u64,
    after: u64,
    /// The bucket's epoch + 1: a niche, so [`Held`] needs no tag.
    epoch: NonZeroU32,
    /// 0: an empty place in [`Held`].
    pub(in crate::admission) cells: u32,
}

impl Kept {
    const EMPTY: Kept = Kept {
        before: 0,
        after: 0,
        epoch: NonZeroU32::MAX,
        cells: 0,
    };

    pub(in crate::admission) fn new(stamps: Stamps, cells: u32) -> Kept {
        Kept {
            before: stamps.before,
            after: stamps.after,
            epoch: NonZeroU32::MIN.saturating_add(stamps.epoch),
            cells,
        }
    }

    /// `cells` already settled: counted, never given back again.
    pub(in crate::admission) fn settled(cells: u32) -> Kept {
        Kept {
            cells,
            ..Kept::EMPTY
        }
    }

    pub(in crate::admission) fn refundable(&self) -> bool {
        self.epoch != NonZeroU32::MAX
    }

    pub(in crate::admission) fn stamps(&self) -> Stamps {
        Stamps {
            before: self.before,
            after: self.after,
            epoch: self.epoch.get() - 1,
        }
    }
}

/// The reservations a ticket keeps, by [`Place`]. Inline for up to three
/// weighted quotas (no tag, via `Kept`'s niche); more spill to the heap.
#[derive(Debug)]
pub(in crate::admission) enum Held {
    Inline([Kept; 4]),
    Spilled(Box<[Kept]>),
}

// The point of the layout: no tag beside the four places.
const _: () = assert!(core::mem::size_of::<Held>() == 4 * core::mem::size_of::<Kept>());

impl Held {
    const EMPTY: Held = Held::Inline([Kept::EMPTY; 4]);

    fn all(&self) -> &[Kept] {
        match self {
            Held::Inline(k) => k,
            Held::Spilled(k) => k,
        }
    }

    fn all_mut(&mut self) -> &mut [Kept] {
        match self {
            Held::Inline(k) => k,
            Held::Spilled(k) => k,
        }
    }

    /// The reservation at `place` to settle on (empty if nothing was
    /// reserved, so any usage is excess).
    pub(in crate::admission) fn place_mut(&mut self, place: Place) -> &mut Kept {
        if place.0 >= self.all().len() {
            self.set(place, Kept::EMPTY);
        }
        &mut self.all_mut()[place.0]
    }

    #[inline]
    fn set(&mut self, Place(place): Place, kept: Kept) {
        if place >= self.all().len() {
            let mut more = vec![Kept::EMPTY; place + 1];
            more[..self.all().len()].copy_from_slice(self.all());
            *self = Held::Spilled(more.into_boxed_slice());
        }
        self.all_mut()[place] = kept;
    }
}

/// The reservations of a call being admitted, laid out as in [`Held`].
/// Until [`keep`](Self::keep), dropping it gives every one back.
pub(in crate::admission) struct Reserved<'a, S: Sleeper, C: Clock> {
    admission: &'a Admission<S, C>,
    credential: &'a str,
    pub(in crate::admission) scope: Option<&'a (String, String)>,
    held: Held,
    /// The server scope's cell: given back if not admitted, never settled.
    scoped: Option<Kept>,
    /// What the call placed in its quotas' windows, taken back with it.
    placed: Option<super::fit::Placed>,
}

impl<'a, S: Sleeper, C: Clock> Reserved<'a, S, C> {
    pub(in crate::admission) fn new(
        admission: &'a Admission<S, C>,
        credential: &'a str,
        scope: Option<&'a (String, String)>,
    ) -> Self {
        Self {
            admission,
            credential,
            scope,
            held: Held::EMPTY,
            scoped: None,
            placed: None,
        }
    }

    pub(in crate::admission) fn taken(&self) -> impl Iterator<Item = (Place, &Kept)> {
        self.held
            .all()
            .iter()
            .enumerate()
            .filter(|(_, k)| k.cells > 0)
            .map(|(i, k)| (Place(i), k))
    }

    pub(in crate::admission) fn set_placed(&mut self, placed: super::fit::Placed) {
        self.placed = Some(placed);
    }

    pub(in crate::admission) fn push(
        &mut self,
        source: Source,
        stamps: Option<Stamps>,
        cells: u32,
    ) {
        let Some(stamps) = stamps else { return };
        let kept = Kept::new(stamps, cells);
        match source.place() {
            Some(place) => self.held.set(place, kept),
            None => self.scoped = Some(kept),
        }
    }

    /// `cells` of a weighted quota taken from a shared limiter: kept without
    /// stamps, so giving them back queues a shared refund instead.
    pub(in crate::admission) fn push_shared(&mut self, source: Source, cells: u32) {
        if let Some(place) = source.place() {
            self.held.set(place, Kept::settled(cells));
        }
    }

    #[inline]
    pub(in crate::admission) fn cancel_all(&mut self) {
        if self.scoped.is_none()
            && self.placed.is_none()
            && self.held.all().iter().all(|k| k.cells == 0)
        {
            return;
        }
        self.cancel_some();
    }

    #[cold]
    fn cancel_some(&mut self) {
        let (admission, credential, scope) = (self.admission, self.credential, self.scope);
        for (place, kept) in self.held.all_mut().iter_mut().enumerate() {
            if kept.cells > 0 {
                let source = Place(place).source();
                if kept.refundable() {
                    let _ = admission.undo(credential, scope, source, kept);
                } else if let Source::Resource(i) = source {
                    // Shared: the refund needs a round trip, so it is queued.
                    let name = &admission.inner.rates.resources[i].name;
                    let refund = -i64::from(kept.cells);
                    admission
                        .inner
                        .rates
                        .shared
                        .queue_settle(credential, name, refund);
                }
                *kept = Kept::EMPTY;
            }
        }
        if let Some(kept) = self.scoped.take() {
            let _ = admission.undo(credential, scope, Source::Scope, &kept);
        }
        if let Some(placed) = self.placed.take()
            && let Some(state) = admission.inner.rates.peek_credential(credential)
        {
            state.fits.remove(&placed);
        }
    }

    /// The cells are used now: hand them to the ticket.
    pub(in crate::admission) fn keep(&mut self) -> Held {
        self.scoped = None;
        self.placed = None;
        core::mem::replace(&mut self.held, Held::EMPTY)
    }
}

impl<S: Sleeper, C: Clock> Admission<S, C> {
    /// Gives `kept` back to `source`'s bucket, if it has taken nothing since.
    pub(in crate::admission) fn undo(
        &self,
        credential: &str,
        scope: Option<&(String, String)>,
        source: Source,
        kept: &Kept,
    ) -> bool {
        let inner = &*self.inner;
        let stamps = kept.stamps();
        match source {
            Source::Requests => inner.rates.credentials.cancel_stamps(credential, stamps),
            Source::Resource(i) => inner.rates.resources[i]
                .buckets
                .cancel_stamps(credential, stamps),
            Source::Scope => {
                scope.is_some_and(|k| inner.rates.server_scopes.cancel_stamps(k, stamps))
            }
            Source::Background => inner
                .rates
                .background
                .as_ref()
                .is_some_and(|b| b.buckets.cancel_stamps(credential, stamps)),
        }
    }
}

impl<S: Sleeper, C: Clock> Drop for Reserved<'_, S, C> {
    #[inline]
    fn drop(&mut self) {
        self.cancel_all();
    }
}
