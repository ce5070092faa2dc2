//! Priority lanes: one pool's waiting calls, served by priority (lower
//! first), then the credential served least recently, then arrival order;
//! and the cap on slots background calls hold. A freed slot is handed
//! straight to the next waiter, so the semaphore has permits only while
//! no eligible call waits. Invariant (no lost wake-up): a waiter enqueues
//! under the lock after one more try, and slots are released to the
//! semaphore under the same lock.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use crate::semaphore::Semaphore;
use crate::sync::Mutex;

/// A call's priority: lower is served first. Calls at
/// [`BACKGROUND`](Self::BACKGROUND) or above are background calls, which
/// [`Builder::priority_lanes`](super::Builder::priority_lanes) and
/// [`Builder::background_rate_share`](super::Builder::background_rate_share)
/// can cap.
///
/// # Examples
///
/// ```
/// use backpressure::admission::{CallSpec, Priority};
/// let chat = CallSpec::new("search", "key"); // interactive by default
/// let agent = CallSpec::new("search", "key").priority(Priority::BACKGROUND);
/// assert!(chat.priority < agent.priority);
/// assert!(Priority::new(200).is_background());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(u8);

impl Priority {
    /// A call a person is waiting for: served first. The default.
    pub const INTERACTIVE: Priority = Priority(0);
    /// Work nobody waits on (a background agent, a crawl): served after every
    /// interactive call.
    pub const BACKGROUND: Priority = Priority(128);

    /// Priority `level` (0 first); 128 and above are background.
    pub const fn new(level: u8) -> Self {
        Priority(level)
    }

    /// Whether calls of this priority are background calls.
    pub const fn is_background(self) -> bool {
        self.0 >= Self::BACKGROUND.0
    }
}

/// What a waiter was told.
#[derive(Debug)]
enum Cell {
    Waiting(Option<Waker>),
    Granted,
    Closed,
}

#[derive(Debug)]
pub(crate) struct Waiter {
    tenant: Box<str>,
    priority: Priority,
    cell: Mutex<Cell>,
}

#[derive(Debug, Default)]
struct State {
    /// Waiting calls by priority, each queue in arrival order.
    queues: BTreeMap<Priority, VecDeque<Arc<Waiter>>>,
    /// Hand-offs so far; `last_served` holds each credential's latest.
    served: u64,
    last_served: HashMap<Box<str>, u64>,
    background_held: usize,
    closed: bool,
}

/// At most this many credentials are remembered for fairness; past it,
/// those with no call waiting are forgotten (erring towards serving them).
const MAX_TENANTS: usize = 4096;

#[derive(Debug)]
pub(crate) struct Lanes {
    state: Mutex<State>,
    background_cap: usize,
}

impl Lanes {
    pub(crate) fn new(background_cap: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            background_cap,
        }
    }

    pub(crate) fn background_cap(&self) -> usize {
        self.background_cap
    }

    /// A slot now, without waiting, for a call of `priority`; only a
    /// background call takes the lock (to count against the cap).
    pub(crate) fn try_take(&self, sem: &Semaphore, priority: Priority) -> bool {
        if !priority.is_background() {
            return sem.try_take(1).is_ok();
        }
        let mut state = self.state.lock();
        if state.background_held >= self.background_cap || sem.try_take(1).is_err() {
            return false;
        }
        state.background_held += 1;
        true
    }

    /// A slot taken now (`Ok`), or the waiter enqueued in its lane (`Err`);
    /// `None`: closed.
    pub(crate) fn take_or_wait(
        &self,
        sem: &Semaphore,
        priority: Priority,
        tenant: &str,
    ) -> Option<Result<(), Arc<Waiter>>> {
        let background = priority.is_background();
        let mut state = self.state.lock();
        if state.closed || sem.is_closed() {
            return None;
        }
        // Again under the lock (see the module docs): no lost wake-up.
        let ahead = state.queues.range(..=priority).any(|(_, q)| !q.is_empty());
        let capped = background && state.background_held >= self.background_cap;
        if !ahead && !capped && sem.try_take(1).is_ok() {
            if background {
                state.background_held += 1;
            }
            return Some(Ok(()));
        }
        let waiter = Arc::new(Waiter {
            tenant: tenant.into(),
            priority,
            cell: Mutex::new(Cell::Waiting(None)),
        });
        state
            .queues
            .entry(priority)
            .or_default()
            .push_back(waiter.clone());
        Some(Err(waiter))
    }

    /// A held slot is free: handed to the next waiter, or released to the
    /// semaphore.
    pub(crate) fn release(&self, sem: &Semaphore, background: bool) {
        let mut woken = Vec::new();
        {
            let mut state = self.state.lock();
            if background {
                state.background_held = state.background_held.saturating_sub(1);
            }
            let mut slot = true;
            // The freed slot first; then, while capped background waiters may now
            // go, any permit the semaphore has.
            while let Some(waiter) = self.next(&mut state) {
                if !slot && sem.try_take(1).is_err() {
                    // No slot for it after all: back to the front of its lane.
                    let p = waiter.priority;
                    state.queues.entry(p).or_default().push_front(waiter);
                    break;
                }
                slot = false;
                if waiter.priority.is_background() {
                    state.background_held += 1;
                }
                state.served += 1;
                let served = state.served;
                if state.last_served.len() >= MAX_TENANTS
                    && !state.last_served.contains_key(&waiter.tenant)
                {
                    let waiting: std::collections::HashSet<&str> = state
                        .queues
                        .values()
                        .flatten()
                        .map(|w| &*w.tenant)
                        .collect();
                    let keep: HashMap<Box<str>, u64> = state
                        .last_served
                        .iter()
                        .filter(|(t, _)| waiting.contains(&***t))
                        .map(|(t, s)| (t.clone(), *s))
                        .collect();
                    state.last_served = keep;
                }
                state.last_served.insert(waiter.tenant.clone(), served);
                let mut cell = waiter.cell.lock();
                if let Cell::Waiting(w) = core::mem::replace(&mut *cell, Cell::Granted) {
                    woken.extend(w);
                }
            }
            if slot {
                sem.release(1, crate::semaphore::Guess::NONE);
            }
        }
        for w in woken {
            w.wake();
        }
    }

    /// Removes and returns the waiter to serve next (see the module docs).
    fn next(&self, state: &mut State) -> Option<Arc<Waiter>> {
        let capped = state.background_held >= self.background_cap;
        let State {
            queues,
            last_served,
            ..
        } = state;
        let (priority, queue) = queues
            .iter_mut()
            .find(|(p, q)| !(q.is_empty() || (capped && p.is_background())))?;
        let priority = *priority;
        let at = queue
            .iter()
            .enumerate()
            .min_by_key(|(i, w)| (last_served.get(&w.tenant).copied().unwrap_or(0), *i))
            .map(|(i, _)| i)?;
        let waiter = queue.remove(at);
        if queue.is_empty() {
            queues.remove(&priority);
        }
        waiter
    }

    /// A waiter gave up: out of its lane, and a slot it was handed passed on.
    pub(crate) fn cancel(&self, sem: &Semaphore, waiter: &Arc<Waiter>) {
        let granted = {
            let mut state = self.state.lock();
            let p = waiter.priority;
            if let Some(q) = state.queues.get_mut(&p) {
                q.retain(|w| !Arc::ptr_eq(w, waiter));
                if q.is_empty() {
                    state.queues.remove(&p);
                }
            }
            matches!(*waiter.cell.lock(), Cell::Granted)
        };
        if granted {
            self.release(sem, waiter.priority.is_background());
        }
    }

    /// Every waiter is told the pool is closed; later waits are refused.
    pub(crate) fn close(&self) {
        let mut woken = Vec::new();
        {
            let mut state = self.state.lock();
            state.closed = true;
            for waiter in core::mem::take(&mut state.queues).into_values().flatten() {
                let mut cell = waiter.cell.lock();
                if let Cell::Waiting(w) = core::mem::replace(&mut *cell, Cell::Closed) {
                    woken.extend(w);
                }
            }
        }
        for w in woken {
            w.wake();
        }
    }
}

/// Waits for a waiter's slot: `Ok` when handed one, `Err` when closed.
/// The caller must [`Lanes::cancel`] it if it stops waiting first.
pub(crate) struct Wait<'a> {
    pub(crate) waiter: &'a Arc<Waiter>,
}

impl Future for Wait<'_> {
    type Output = Result<(), ()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut cell = self.waiter.cell.lock();
        match &mut *cell {
            Cell::Granted => Poll::Ready(Ok(())),
            Cell::Closed => Poll::Ready(Err(())),
            Cell::Waiting(w) => {
                match w {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *w = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    const I: Priority = Priority::INTERACTIVE;
    const B: Priority = Priority::BACKGROUND;

    /// A pool of `permits` with every permit taken.
    fn full(permits: usize, background_cap: usize) -> (Semaphore, Lanes) {
        let sem = Semaphore::new(permits);
        for _ in 0..permits {
            sem.try_take(1).unwrap();
        }
        (sem, Lanes::new(background_cap))
    }

    fn wait(lanes: &Lanes, sem: &Semaphore, p: Priority, tenant: &str) -> Arc<Waiter> {
        match lanes.take_or_wait(sem, p, tenant) {
            Some(Err(w)) => w,
            other => panic!("expected to wait: {other:?}"),
        }
    }

    fn state(w: &Arc<Waiter>) -> Poll<Result<(), ()>> {
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        Pin::new(&mut Wait { waiter: w }).poll(&mut cx)
    }

    fn granted(w: &Arc<Waiter>) -> bool {
        state(w) == Poll::Ready(Ok(()))
    }

    #[test]
    fn an_interactive_waiter_goes_before_background_ones_that_came_first() {
        let (sem, lanes) = full(1, usize::MAX);
        let b1 = wait(&lanes, &sem, B, "k");
        let b2 = wait(&lanes, &sem, B, "k");
        let i1 = wait(&lanes, &sem, I, "k");
        lanes.release(&sem, false);
        assert!(granted(&i1) && !granted(&b1) && !granted(&b2));
        lanes.release(&sem, false);
        assert!(granted(&b1) && !granted(&b2), "FIFO within a priority");
        lanes.release(&sem, true);
        assert!(granted(&b2));
        lanes.release(&sem, true);
        assert_eq!(
            sem.available_permits(),
            1,
            "nobody waits: back to the semaphore"
        );
    }

    #[test]
    fn within_a_priority_the_credential_served_least_recently_goes_next() {
        let (sem, lanes) = full(1, usize::MAX);
        let a: Vec<_> = (0..3).map(|_| wait(&lanes, &sem, I, "a")).collect();
        let b = wait(&lanes, &sem, I, "b");
        lanes.release(&sem, false);
        assert!(granted(&a[0]), "neither served yet: arrival order");
        lanes.release(&sem, false);
        assert!(
            granted(&b) && !granted(&a[1]),
            "b never served: before a's second"
        );
        lanes.release(&sem, false);
        assert!(granted(&a[1]) && !granted(&a[2]));
    }

    #[test]
    fn background_calls_hold_at_most_their_cap_and_interactive_ones_the_rest() {
        let sem = Semaphore::new(4);
        let lanes = Lanes::new(2);
        assert!(lanes.try_take(&sem, B));
        assert!(lanes.try_take(&sem, B));
        assert!(!lanes.try_take(&sem, B), "capped, with two slots free");
        let b3 = wait(&lanes, &sem, B, "k");
        assert!(lanes.try_take(&sem, I));
        assert!(lanes.try_take(&sem, I));
        // An interactive slot freed: b3 is still capped; the semaphore gets it.
        lanes.release(&sem, false);
        assert!(!granted(&b3));
        assert_eq!(sem.available_permits(), 1);
        // A background slot freed: b3 takes it.
        lanes.release(&sem, true);
        assert!(granted(&b3));
        assert_eq!(sem.available_permits(), 1);
        // Capped again: the free slot is an interactive call's.
        assert!(!lanes.try_take(&sem, B));
        assert!(lanes.try_take(&sem, I));
    }

    #[test]
    fn a_slot_handed_to_a_waiter_that_gave_up_is_passed_on() {
        let (sem, lanes) = full(1, usize::MAX);
        let w1 = wait(&lanes, &sem, I, "k");
        let w2 = wait(&lanes, &sem, I, "k");
        lanes.release(&sem, false);
        assert!(granted(&w1));
        lanes.cancel(&sem, &w1); // its deadline passed as it was handed the slot
        assert!(granted(&w2));
        // A waiter that gives up before being served just leaves.
        let w3 = wait(&lanes, &sem, I, "k");
        lanes.cancel(&sem, &w3);
        lanes.release(&sem, false);
        assert!(!granted(&w3));
        assert_eq!(sem.available_permits(), 1);
    }

    #[test]
    fn closing_wakes_every_waiter_refused() {
        let (sem, lanes) = full(1, usize::MAX);
        let w = wait(&lanes, &sem, B, "k");
        sem.close();
        lanes.close();
        assert_eq!(state(&w), Poll::Ready(Err(())));
        assert!(lanes.take_or_wait(&sem, I, "k").is_none());
    }
}
