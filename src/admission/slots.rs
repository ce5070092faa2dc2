//! The slot stage: the global pool, the tool registry (each tool's pool
//! and budget) and the admission-wide bound on waiting calls. `admit`
//! reaches them only through [`Slots`]' methods.

use core::future::Future;
use core::pin::Pin;
use std::sync::Arc;

use super::pools::{self, Pool, SlotError, Which};
use super::tools::{ToolState, Tools};
use crate::semaphore::{OwnedSemaphorePermit, SemaphorePermit};
use crate::sync::{AtomicUsize, Ordering};
use crate::throttled::Throttled;

/// The slots every call takes: its tool's, then the global one.
pub(super) struct Slots {
    global: Pool,
    /// Calls waiting for any slot, against `queue_capacity`.
    waiting: AtomicUsize,
    queue_capacity: usize,
    tools: Tools,
}

impl Slots {
    pub(super) fn new(global: Pool, queue_capacity: usize, tools: Tools) -> Self {
        Self {
            global,
            waiting: AtomicUsize::new(0),
            queue_capacity,
            tools,
        }
    }

    /// `name`'s state, created on first use (or refused: too many tools).
    #[inline]
    pub(super) fn tool(&self, name: &str) -> Result<Arc<ToolState>, Throttled> {
        self.tools.get(name)
    }

    /// `name`'s state if it exists; never creates one.
    #[inline]
    pub(super) fn peek_tool(&self, name: &str) -> Option<Arc<ToolState>> {
        self.tools.peek(name)
    }

    /// Every tool's state (for the stats).
    pub(super) fn tools(&self) -> &Tools {
        &self.tools
    }

    /// Both slots now, borrowed (the fast path forgets them into the
    /// ticket), or `None` with nothing kept.
    #[inline]
    pub(super) fn try_now<'a>(
        &'a self,
        tool: &'a ToolState,
    ) -> Option<(SemaphorePermit<'a>, SemaphorePermit<'a>)> {
        let tool_slot = tool.pool.sem.try_acquire().ok()?;
        let global_slot = self.global.sem.try_acquire().ok()?;
        Some((tool_slot, global_slot))
    }

    /// Both slots now, owned, or `None` with nothing kept.
    #[inline]
    pub(super) fn try_both(
        &self,
        tool: &ToolState,
    ) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        pools::try_both(&tool.pool, &self.global)
    }

    /// Both slots, waiting for them (in FIFO order, within the tool's
    /// policy and the shared queue bound) until `timeout` completes.
    pub(super) async fn acquire_both<T: Future<Output = ()>>(
        &self,
        tool: &ToolState,
        timeout: Pin<&mut T>,
    ) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), (SlotError, Which)> {
        pools::acquire_both(
            &tool.pool,
            &self.global,
            tool.policy,
            &self.waiting,
            self.queue_capacity,
            timeout,
        )
        .await
    }

    /// The pool that refused a call of `tool`.
    pub(super) fn pool<'a>(&'a self, tool: &'a ToolState, which: Which) -> &'a Pool {
        match which {
            Which::Tool => &tool.pool,
            Which::Global => &self.global,
        }
    }

    /// A ticket's global slot, held `held` ns, given back.
    #[inline]
    pub(super) fn release_global(&self, held: u64) {
        self.global.record_hold(held);
        self.global.sem.release(1);
    }

    /// Calls in flight (holding a global slot).
    pub(super) fn in_flight(&self) -> usize {
        self.global.in_flight()
    }

    /// Calls waiting for a slot right now.
    pub(super) fn waiting(&self) -> usize {
        // Relaxed: advisory.
        self.waiting.load(Ordering::Relaxed)
    }

    /// Every tool's budget counts from zero again.
    pub(super) fn reset_budgets(&self) {
        self.tools.reset_budgets();
    }

    /// Closes every pool: waiters wake refused, later calls are refused.
    pub(super) fn close(&self) {
        self.tools.close_all();
        self.global.close();
    }

    /// The global cap and the queue bound, for `Debug`.
    pub(super) fn bounds(&self) -> (usize, usize) {
        (self.global.cap, self.queue_capacity)
    }
}
