//! Concurrency pools: a global one and one per tool. A call takes its
//! tool's slot first and the global slot second, so a call waiting for a
//! saturated tool holds no global slot (no head-of-line blocking across
//! tools). Each wait is bounded by a queue capacity and the deadline.

use core::future::Future;
use core::pin::Pin;
use core::task::Poll;
use core::time::Duration;
use std::sync::Arc;

use super::lanes::{Lanes, Priority, Wait};
use crate::semaphore::Semaphore;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};
use crate::throttled::{Status, Throttled};

/// What a tool does when no slot is free.
///
/// # Examples
///
/// ```
/// use backpressure::admission::SlotPolicy;
/// let reads = SlotPolicy::Wait;              // short idempotent reads
/// let writes = SlotPolicy::FailFast;         // approvals that may expire
/// let background = SlotPolicy::Queue(16);    // low-priority work
/// assert_ne!(reads, writes);
/// # let _ = background;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotPolicy {
    /// Wait in FIFO order until the call's deadline (bounded only by the
    /// admission-wide wait-queue capacity). The default.
    Wait,
    /// Never wait for a slot: shed at once with a drain estimate.
    FailFast,
    /// Wait, but with at most this many of the tool's calls waiting; more
    /// are shed at once.
    Queue(usize),
}

/// One pool of concurrency slots, its waiting count and mean hold time.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) sem: Arc<Semaphore>,
    pub(crate) cap: usize,
    waiting: AtomicUsize,
    /// EWMA of how long a slot is held, in nanos.
    hold_ns: AtomicU64,
    /// When a slot last came free (layer clock; 0: never); lets the drain
    /// estimate notice hung calls.
    released_ns: AtomicU64,
    /// With priority lanes, the waiting calls (the semaphore then has no
    /// waiters of its own). Boxed to keep a pool without lanes small.
    lanes: Option<Box<Lanes>>,
}

/// Why slots were not granted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SlotError {
    /// The queue was full (or fail-fast): shed, with `ahead` calls in front.
    Full { ahead: usize },
    /// The deadline passed while waiting.
    TimedOut,
    /// The pool's semaphore was closed.
    Closed,
}

/// One more waiter in a waiting count, until the wait ends, however it ends.
pub(super) struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    /// Counts a waiter in `count`; returns how many were counted before it.
    pub(super) fn new(count: &'a AtomicUsize) -> (usize, Self) {
        // Relaxed: advisory counts; a race can overshoot a bound by the number
        // of racing callers, never unboundedly.
        (count.fetch_add(1, Ordering::Relaxed), Waiting(count))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // Relaxed: the count is advisory; it guards no memory.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Pool {
    /// A pool of `cap` slots, clamped to `1..=Semaphore::MAX_PERMITS`.
    pub(crate) fn new(cap: usize, expected_hold: Duration) -> Self {
        let cap = cap.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            sem: Arc::new(Semaphore::new(cap)),
            cap,
            waiting: AtomicUsize::new(0),
            hold_ns: AtomicU64::new(crate::clock::saturating_nanos(expected_hold)),
            released_ns: AtomicU64::new(0),
            lanes: None,
        }
    }

    /// Serves waiters by priority, with at most `background_cap` slots held
    /// by background calls.
    pub(crate) fn with_lanes(mut self, background_cap: usize) -> Self {
        self.lanes = Some(Box::new(Lanes::new(background_cap)));
        self
    }

    /// The most slots background calls may hold, if capped.
    pub(crate) fn background_cap(&self) -> Option<usize> {
        self.lanes
            .as_ref()
            .map(|l| l.background_cap())
            .filter(|&c| c < self.cap)
    }

    /// Takes a slot now if one is free to `priority`; held as a count.
    #[inline]
    pub(crate) fn try_take(&self, priority: Priority) -> bool {
        match &self.lanes {
            None => self.sem.try_take(1).is_ok(),
            Some(lanes) => lanes.try_take(&self.sem, priority),
        }
    }

    /// Gives back a slot a call of a background priority (or not) held.
    #[inline]
    pub(crate) fn release(&self, background: bool) {
        match &self.lanes {
            None => self.sem.release(1, crate::semaphore::Guess::NONE),
            Some(lanes) => lanes.release(&self.sem, background),
        }
    }

    /// Closes the pool: waiting and later acquires fail; held slots stay valid.
    pub(crate) fn close(&self) {
        self.sem.close();
        if let Some(lanes) = &self.lanes {
            lanes.close();
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.cap.saturating_sub(self.sem.available_permits())
    }

    pub(crate) fn waiting(&self) -> usize {
        // Relaxed: advisory.
        self.waiting.load(Ordering::Relaxed)
    }

    /// The running mean of how long a slot is held.
    pub(crate) fn mean_hold(&self) -> Duration {
        // Relaxed: advisory.
        Duration::from_nanos(self.hold_ns.load(Ordering::Relaxed))
    }

    /// Folds one hold time into the mean (weight 1/8); a slot came free at `now`.
    pub(crate) fn record_hold(&self, sample: u64, now: u64) {
        // Relaxed: advisory.
        self.released_ns.store(now, Ordering::Relaxed);
        // Relaxed: an estimate. A load and a store, not a CAS loop: every ticket
        // drops through the global pool; a lost sample only weighs the next more.
        let old = self.hold_ns.load(Ordering::Relaxed);
        self.hold_ns
            .store(old - old / 8 + sample / 8, Ordering::Relaxed);
    }

    /// Little's law: with `ahead` calls in front and `cap` slots, the
    /// `retry_after` for a call shed at `now` is `ceil((ahead + 1) / cap)`
    /// mean holds (longer if a full pool has not released for a while).
    pub(crate) fn drain_estimate(&self, ahead: usize, now: u64) -> Duration {
        // Relaxed: advisory.
        let mut hold = self.hold_ns.load(Ordering::Relaxed);
        let released = self.released_ns.load(Ordering::Relaxed);
        if released != 0 && self.in_flight() >= self.cap {
            hold = hold.max(now.saturating_sub(released));
        }
        let rounds = (ahead as u64 + 1).div_ceil(self.cap.max(1) as u64);
        Duration::from_nanos(hold.saturating_mul(rounds))
    }

    /// How often a slot comes free on average, in ns: the spacing of the
    /// instants told to calls shed together.
    pub(crate) fn drain_step(&self) -> u64 {
        // Relaxed: advisory.
        self.hold_ns.load(Ordering::Relaxed) / self.cap.max(1) as u64
    }

    /// Takes one slot now, or waits for it within the policy's queue bound
    /// and `timeout`; held as a count. A refused or dropped wait holds
    /// nothing. `shared_*` are the admission-wide wait count and capacity.
    pub(crate) async fn acquire<T: Future<Output = ()>>(
        &self,
        call: Caller<'_>,
        shared_waiting: &AtomicUsize,
        shared_cap: usize,
        timeout: Pin<&mut T>,
    ) -> Result<(), SlotError> {
        if self.try_take(call.priority) {
            return Ok(());
        }
        if self.sem.is_closed() {
            return Err(SlotError::Closed);
        }
        let own_cap = match call.policy {
            SlotPolicy::FailFast => 0,
            SlotPolicy::Wait => usize::MAX,
            SlotPolicy::Queue(n) => n,
        };
        let (ahead, _mine) = Waiting::new(&self.waiting);
        let (shared_ahead, _shared) = Waiting::new(shared_waiting);
        if ahead >= own_cap || shared_ahead >= shared_cap {
            return Err(SlotError::Full { ahead });
        }
        let Some(lanes) = &self.lanes else {
            let acquire = self.sem.acquire();
            return within(async { acquire.await.map(|p| p.forget()) }, timeout).await;
        };
        let waiter = match lanes.take_or_wait(&self.sem, call.priority, call.tenant) {
            None => return Err(SlotError::Closed),
            Some(Ok(())) => return Ok(()),
            Some(Err(waiter)) => waiter,
        };
        // Out of its lane however the wait ends, unless it got a slot.
        let mut guard = LaneGuard {
            lanes,
            sem: &self.sem,
            waiter: &waiter,
            done: false,
        };
        let got = within(Wait { waiter: &waiter }, timeout).await;
        guard.done = got.is_ok();
        got
    }
}

/// `wait`'s answer (an error: the pool closed), unless `timeout` ends first.
async fn within<T: Future<Output = ()>, E>(
    wait: impl Future<Output = Result<(), E>>,
    mut timeout: Pin<&mut T>,
) -> Result<(), SlotError> {
    let mut wait = core::pin::pin!(wait);
    core::future::poll_fn(|cx| match wait.as_mut().poll(cx) {
        Poll::Ready(r) => Poll::Ready(r.map_err(|_| SlotError::Closed)),
        Poll::Pending => timeout.as_mut().poll(cx).map(|()| Err(SlotError::TimedOut)),
    })
    .await
}

/// Who is asking for a slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caller<'a> {
    pub(crate) policy: SlotPolicy,
    pub(crate) priority: Priority,
    pub(crate) tenant: &'a str,
}

/// Takes a waiter out of its lane when its wait ends without a slot.
struct LaneGuard<'a> {
    lanes: &'a Lanes,
    sem: &'a Semaphore,
    waiter: &'a Arc<super::lanes::Waiter>,
    done: bool,
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.lanes.cancel(self.sem, self.waiter);
        }
    }
}

/// A slot held as a count, given back if dropped before [`keep`](Self::keep).
struct Taken<'a> {
    pool: &'a Pool,
    background: bool,
}

impl Taken<'_> {
    fn keep(self) {
        core::mem::forget(self);
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.pool.release(self.background);
    }
}

/// Takes the tool's slot, then the global one; both held as counts.
pub(crate) async fn acquire_both<T: Future<Output = ()>>(
    tool: &Pool,
    global: &Pool,
    call: Caller<'_>,
    shared_waiting: &AtomicUsize,
    shared_cap: usize,
    mut timeout: Pin<&mut T>,
) -> Result<(), (SlotError, Which)> {
    // A background call under a cap takes its global slot first, so while
    // waiting for the cap it holds none of its tool's slots. No wait cycle:
    // the cap leaves the other global slots to interactive calls.
    if call.priority.is_background() && global.background_cap().is_some() {
        global
            .acquire(call, shared_waiting, shared_cap, timeout.as_mut())
            .await
            .map_err(|e| (e, Which::Global))?;
        let global_slot = Taken {
            pool: global,
            background: true,
        };
        tool.acquire(call, shared_waiting, shared_cap, timeout)
            .await
            .map_err(|e| (e, Which::Tool))?;
        global_slot.keep();
        return Ok(());
    }
    tool.acquire(call, shared_waiting, shared_cap, timeout.as_mut())
        .await
        .map_err(|e| (e, Which::Tool))?;
    let tool_slot = Taken {
        pool: tool,
        background: call.priority.is_background(),
    };
    // The global pool has no per-tool policy: wait in lane order within
    // the shared bound.
    let global_policy = match call.policy {
        SlotPolicy::FailFast => SlotPolicy::FailFast,
        _ => SlotPolicy::Wait,
    };
    let global_call = Caller {
        policy: global_policy,
        ..call
    };
    global
        .acquire(global_call, shared_waiting, shared_cap, timeout)
        .await
        .map_err(|e| (e, Which::Global))?;
    tool_slot.keep();
    Ok(())
}

/// Which pool refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    Tool,
    Global,
}

/// The refusal for a call whose slots were not granted; a shed call is
/// told `told`.
pub(super) fn slot_refusal(tool: &str, e: SlotError, which: Which, told: Duration) -> Throttled {
    let scope = match which {
        Which::Tool => format!("tool:{tool}"),
        Which::Global => "global".to_string(),
    };
    match e {
        SlotError::Full { .. } => Throttled::new(
            Status::Shed,
            scope,
            "too many calls are waiting; retry after the drain estimate",
        )
        .with_retry_after(told),
        SlotError::TimedOut => Throttled::new(
            Status::TimedOut,
            scope,
            "no slot came free before the call's deadline",
        ),
        SlotError::Closed => Throttled::new(Status::Closed, scope, "the pool is closed"),
    }
}
