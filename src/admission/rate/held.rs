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

use super::super::Admission;
use crate::bucket::gcra::Ticket as Stamps;
use crate::clock::Clock;
use crate::sleep::Sleeper;

/// Which bucket a reservation came from: the credential's request quota,
/// its server scope, or the index of a weighted quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::admission) enum Source {
    Requests,
    Resource(usize),
    Scope,
    /// The background share of the request quota (never settled).
    Background,
}

impl Source {
    /// Where a ticket keeps this source's reservation; a server scope's
    /// cell is never settled, so it has no place.
    #[inline]
    pub(in crate::admission) fn place(self) -> Option<Place> {
        match self {
            Source::Requests => Some(Place(0)),
            Source::Resource(i) => Some(Place(i.saturating_add(1))),
            Source::Scope | Source::Background => None,
        }
    }
}

/// A quota's place in [`Held`]: the request quota at 0, weighted quota `i`
/// at `1 + i`. Made only by [`Source::place`], read back by
/// [`Place::source`]: the one spot that knows the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::admission) struct Place(usize);

impl Place {
    /// Its index: 0 for the request quota, `1 + i` for weighted quota `i`.
    #[inline]
    pub(in crate::admission) fn index(self) -> usize {
        self.0
    }

    /// The quota kept at this place.
    #[inline]
    pub(in crate::admission) fn source(self) -> Source {
        match self.0 {
            0 => Source::Requests,
            i => Source::Resource(i - 1),
        }
    }
}

/// One reservation, 24 bytes: the cells and what gives them back.
#[derive(Clone, Copy, Debug)]
pub(in crate::admission) struct Kept {
    before: u64,
    after: u64,
    /// The bucket's epoch + 1 (epochs are 31 bits): a niche, so that
    /// [`Held`] needs no tag of its own.
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

    /// `cells` already settled: counted, and never given back again (the
    /// stamps are gone; `EMPTY` is the same epoch with no cells).
    pub(in crate::admission) fn settled(cells: u32) -> Kept {
        Kept {
            cells,
            ..Kept::EMPTY
        }
    }

    /// Whether the stamps can still give the cells back (not settled).
    pub(in crate::admission) fn refundable(&self) -> bool {
        self.epoch != NonZeroU32::MAX
    }

    /// The stamps to give the cells back with.
    pub(in crate::admission) fn stamps(&self) -> Stamps {
        Stamps {
            before: self.before,
            after: self.after,
            epoch: self.epoch.get() - 1,
        }
    }
}

/// The reservations a ticket keeps, by [`Place`] (a server scope's cell
/// is never settled, so it is not kept). Inline for up to three weighted quotas (96 bytes,
/// no tag: `Kept`'s niche tells the two apart); a layer with more spills
/// to the heap.
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

    /// The place to settle quota `place` on: the call's reservation there,
    /// or an empty place (nothing reserved, so any usage is excess). A
    /// place settled to 0 is still a place: a later settle charges what
    /// the server reports beyond it.
    pub(in crate::admission) fn place_mut(&mut self, place: Place) -> &mut Kept {
        if place.0 >= self.all().len() {
            self.set(place, Kept::EMPTY);
        }
        &mut self.all_mut()[place.0]
    }

    /// Puts `kept` at `place`, spilling to the heap past the fourth.
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

/// The reservations of a call being admitted, by place as in [`Held`]
/// (so keeping them moves them once). Until [`keep`](Self::keep),
/// dropping it gives every one back (a refused or cancelled call consumes
/// nothing the buckets can refund).
pub(in crate::admission) struct Reserved<'a, S: Sleeper, C: Clock> {
    admission: &'a Admission<S, C>,
    credential: &'a str,
    /// The server scope's key, for a call that reserves a cell of it.
    pub(in crate::admission) scope: Option<&'a (String, String)>,
    held: Held,
    /// The server scope's cell: given back if the call is not admitted,
    /// never settled.
    scoped: Option<Kept>,
    /// What the call placed in its quotas' windows (see `fit`), taken
    /// back with the reservations.
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

    /// The reservations taken so far, by place.
    pub(in crate::admission) fn taken(&self) -> impl Iterator<Item = (Place, &Kept)> {
        self.held
            .all()
            .iter()
            .enumerate()
            .filter(|(_, k)| k.cells > 0)
            .map(|(i, k)| (Place(i), k))
    }

    /// What the call placed in its quotas' windows (see `fit`).
    pub(in crate::admission) fn set_placed(&mut self, placed: super::fit::Placed) {
        self.placed = Some(placed);
    }

    pub(in crate::admission) fn push(
        &mut self,
        source: Source,
        stamps: Option<Stamps>,
        cells: u32,
    ) {
        // `None`: zero cells, nothing to give back.
        let Some(stamps) = stamps else { return };
        let kept = Kept::new(stamps, cells);
        match source.place() {
            Some(place) => self.held.set(place, kept),
            None => self.scoped = Some(kept),
        }
    }

    /// `cells` of weighted quota `source` taken from a shared limiter:
    /// kept without stamps (settled as `cells`), so that giving them back
    /// queues a refund to the shared limiter instead (`cancel_some`).
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
                    // Taken from a shared limiter (`push_shared`): its
                    // refund needs a round trip, so it is queued.
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

    /// The cells are used now: hand them to the ticket, which may settle
    /// them against the actual usage.
    pub(in crate::admission) fn keep(&mut self) -> Held {
        self.scoped = None;
        self.placed = None;
        core::mem::replace(&mut self.held, Held::EMPTY)
    }
}

impl<S: Sleeper, C: Clock> Admission<S, C> {
    /// Gives `kept` back to the bucket of `source` for `credential` (the
    /// server scope `scope`), if that bucket has taken nothing since (see
    /// `Scoped::cancel_stamps`).
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
