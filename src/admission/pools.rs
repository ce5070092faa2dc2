//! Concurrency pools: a global one and one per tool, admitted together.
//!
//! A call takes its tool's slot first and the global slot second. So a call
//! waiting for a saturated tool holds no global slot, and the calls of a
//! saturated tool never stand in front of other tools' calls (there is no
//! head-of-line blocking across tools); within one tool, the semaphore's
//! FIFO orders the calls. Each wait is bounded: by a queue capacity (the
//! call is shed at once, with a drain estimate, when the queue is full) and
//! by the call's deadline.

use core::future::Future;
use core::pin::Pin;
use core::task::Poll;
use core::time::Duration;
use std::sync::Arc;

use crate::semaphore::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
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

/// One pool of concurrency slots with its waiting count and an estimate
/// of how long a slot is held.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) sem: Arc<Semaphore>,
    pub(crate) cap: usize,
    /// Calls currently waiting for a slot of this pool.
    waiting: AtomicUsize,
    /// Exponentially weighted mean of how long a slot is held, in nanos.
    hold_ns: AtomicU64,
}

/// Why slots were not granted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SlotError {
    /// The queue was full (or the policy is fail-fast): shed with this
    /// drain estimate.
    Full { estimate: Duration },
    /// The deadline passed while waiting.
    TimedOut,
    /// The pool's semaphore was closed.
    Closed,
}

/// Decrements a waiting counter when the wait ends, however it ends.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // Relaxed: the count is advisory (a queue bound and an estimate),
        // it guards no memory.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Pool {
    pub(crate) fn new(cap: usize, expected_hold: Duration) -> Self {
        Self {
            sem: Arc::new(Semaphore::new(cap)),
            cap,
            waiting: AtomicUsize::new(0),
            hold_ns: AtomicU64::new(crate::clock::saturating_nanos(expected_hold)),
        }
    }

    /// Closes the pool: every waiting and later acquire fails with
    /// [`SlotError::Closed`]; slots already held stay valid.
    pub(crate) fn close(&self) {
        self.sem.close();
    }

    /// Calls holding a slot now.
    pub(crate) fn in_flight(&self) -> usize {
        self.cap.saturating_sub(self.sem.available_permits())
    }

    /// Calls waiting for a slot now.
    pub(crate) fn waiting(&self) -> usize {
        // Relaxed: advisory.
        self.waiting.load(Ordering::Relaxed)
    }

    /// The running mean of how long a slot is held.
    pub(crate) fn mean_hold(&self) -> Duration {
        // Relaxed: advisory.
        Duration::from_nanos(self.hold_ns.load(Ordering::Relaxed))
    }

    /// Folds one observed hold time into the mean (weight 1/8).
    pub(crate) fn record_hold(&self, sample: u64) {
        // Relaxed: an estimate. A load and a store, not a read-modify-write:
        // every ticket of the layer drops through the global pool, and a CAS
        // loop there would make this one hot line a point of contention. A
        // sample lost to a concurrent drop only weighs the next one more.
        let old = self.hold_ns.load(Ordering::Relaxed);
        self.hold_ns
            .store(old - old / 8 + sample / 8, Ordering::Relaxed);
    }

    /// Little's law: with `ahead` calls in front and `cap` slots each held
    /// for the mean hold time, the last of them starts after about
    /// `ceil((ahead + 1) / cap)` hold times. That is the honest
    /// `retry_after` for a call shed now.
    pub(crate) fn drain_estimate(&self, ahead: usize) -> Duration {
        // Relaxed: advisory.
        let hold = self.hold_ns.load(Ordering::Relaxed);
        let rounds = (ahead as u64 + 1).div_ceil(self.cap.max(1) as u64);
        Duration::from_nanos(hold.saturating_mul(rounds))
    }

    /// How often, on average, a slot comes free (the mean hold over the
    /// slots), in nanoseconds: the spacing of the instants told to calls
    /// shed together.
    pub(crate) fn drain_step(&self) -> u64 {
        // Relaxed: advisory.
        self.hold_ns.load(Ordering::Relaxed) / self.cap.max(1) as u64
    }

    /// Takes one slot now, or waits for it within the policy's queue bound
    /// and until `timeout` completes.
    ///
    /// `shared_waiting` is the admission-wide count of waiting calls and
    /// `shared_cap` its capacity.
    pub(crate) async fn acquire<T: Future<Output = ()>>(
        &self,
        policy: SlotPolicy,
        shared_waiting: &AtomicUsize,
        shared_cap: usize,
        timeout: Pin<&mut T>,
    ) -> Result<OwnedSemaphorePermit, SlotError> {
        match self.sem.clone().try_acquire_owned() {
            Ok(p) => return Ok(p),
            Err(TryAcquireError::Closed) => return Err(SlotError::Closed),
            Err(TryAcquireError::NoPermits) => {}
        }
        let own_cap = match policy {
            SlotPolicy::FailFast => 0,
            SlotPolicy::Wait => usize::MAX,
            SlotPolicy::Queue(n) => n,
        };
        // Relaxed: advisory counts; a race can let one call past the bound
        // by the number of racing callers, never unboundedly.
        let ahead = self.waiting.fetch_add(1, Ordering::Relaxed);
        let _mine = Waiting(&self.waiting);
        let shared_ahead = shared_waiting.fetch_add(1, Ordering::Relaxed);
        let _shared = Waiting(shared_waiting);
        if ahead >= own_cap || shared_ahead >= shared_cap {
            return Err(SlotError::Full {
                estimate: self.drain_estimate(ahead),
            });
        }
        let mut acquire = core::pin::pin!(self.sem.clone().acquire_owned());
        let mut timeout = timeout;
        core::future::poll_fn(|cx| {
            if let Poll::Ready(r) = acquire.as_mut().poll(cx) {
                return Poll::Ready(r.map_err(|_| SlotError::Closed));
            }
            match timeout.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(SlotError::TimedOut)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

/// Takes the tool's slot, then the global one (see the module docs).
pub(crate) async fn acquire_both<T: Future<Output = ()>>(
    tool: &Pool,
    global: &Pool,
    policy: SlotPolicy,
    shared_waiting: &AtomicUsize,
    shared_cap: usize,
    mut timeout: Pin<&mut T>,
) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), (SlotError, Which)> {
    let tool_slot = tool
        .acquire(policy, shared_waiting, shared_cap, timeout.as_mut())
        .await
        .map_err(|e| (e, Which::Tool))?;
    // The global pool has no per-tool policy: a call that holds its tool's
    // slot waits for a global one in FIFO order, within the shared bound.
    let global_policy = match policy {
        SlotPolicy::FailFast => SlotPolicy::FailFast,
        _ => SlotPolicy::Wait,
    };
    let global_slot = global
        .acquire(global_policy, shared_waiting, shared_cap, timeout)
        .await
        .map_err(|e| (e, Which::Global))?;
    Ok((tool_slot, global_slot))
}

/// Which pool refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    Tool,
    Global,
}

/// The refusal for a call of `tool` whose slots were not granted.
pub(super) fn slot_refusal(tool: &str, e: SlotError, which: Which) -> Throttled {
    let scope = match which {
        Which::Tool => format!("tool:{tool}"),
        Which::Global => "global".to_string(),
    };
    match e {
        SlotError::Full { estimate } => Throttled::new(
            Status::Shed,
            scope,
            "too many calls are waiting; retry after the drain estimate",
        )
        .with_retry_after(estimate),
        SlotError::TimedOut => Throttled::new(
            Status::TimedOut,
            scope,
            "no slot came free before the call's deadline",
        ),
        SlotError::Closed => Throttled::new(Status::Closed, scope, "the pool is closed"),
    }
}
