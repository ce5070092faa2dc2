//! The slot stage: the global pool, the tool registry and the
//! admission-wide bound on waiting calls.

use core::future::Future;
use core::pin::Pin;
use core::time::Duration;
use std::sync::Arc;

use super::lanes::Priority;
use super::pools::{self, Caller, Pool, SlotError, Which};
use super::spec::CallSpec;
use super::tools::{ToolState, Tools};
use crate::clock::saturating_nanos;
use crate::sync::{AtomicUsize, Ordering};
use crate::throttled::Status;
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

    #[inline]
    pub(super) fn peek_tool(&self, name: &str) -> Option<Arc<ToolState>> {
        self.tools.peek(name)
    }

    pub(super) fn tools(&self) -> &Tools {
        &self.tools
    }

    /// Takes both slots now, or neither. Held as counts: a ticket gives them
    /// back in its `Drop`, a call not admitted with [`give_back`](Self::give_back).
    #[inline]
    pub(super) fn try_take(&self, tool: &ToolState, priority: Priority) -> bool {
        if !tool.pool.try_take(priority) {
            return false;
        }
        if !self.global.try_take(priority) {
            tool.pool.release(priority.is_background());
            return false;
        }
        true
    }

    /// Gives back both slots of a call that was not admitted.
    #[cold]
    pub(super) fn give_back(&self, tool: &ToolState, priority: Priority) {
        tool.pool.release(priority.is_background());
        self.global.release(priority.is_background());
    }

    /// Takes both slots, waiting until `timeout`; held as counts. A refused
    /// or dropped wait holds nothing.
    pub(super) async fn take<T: Future<Output = ()>>(
        &self,
        tool: &ToolState,
        priority: Priority,
        tenant: &str,
        timeout: Pin<&mut T>,
    ) -> Result<(), (SlotError, Which)> {
        let call = Caller {
            policy: tool.policy,
            priority,
            tenant,
        };
        pools::acquire_both(
            &tool.pool,
            &self.global,
            call,
            &self.waiting,
            self.queue_capacity,
            timeout,
        )
        .await
    }

    pub(super) fn pool<'a>(&'a self, tool: &'a ToolState, which: Which) -> &'a Pool {
        match which {
            Which::Tool => &tool.pool,
            Which::Global => &self.global,
        }
    }

    /// A ticket's global slot, held `held` ns, given back at `now`.
    #[inline]
    pub(super) fn release_global(&self, held: u64, now: u64, background: bool) {
        self.global.record_hold(held, now);
        self.global.release(background);
    }

    pub(super) fn global(&self) -> &Pool {
        &self.global
    }

    pub(super) fn in_flight(&self) -> usize {
        self.global.in_flight()
    }

    pub(super) fn waiting(&self) -> usize {
        // Relaxed: advisory.
        self.waiting.load(Ordering::Relaxed)
    }

    pub(super) fn reset_budgets(&self) {
        self.tools.reset_budgets();
    }

    /// Closes every pool: waiters wake refused, later calls are refused.
    pub(super) fn close(&self) {
        self.tools.close_all();
        self.global.close();
    }

    pub(super) fn bounds(&self) -> (usize, usize) {
        (self.global.cap, self.queue_capacity)
    }
}

impl<S: crate::sleep::Sleeper, C: crate::clock::Clock> super::Admission<S, C> {
    /// Words a slot refusal; calls shed together are told instants one drain
    /// step apart (see `stagger.rs`).
    #[cold]
    pub(super) fn slot_refusal(
        &self,
        spec: &CallSpec,
        tool: &ToolState,
        e: pools::SlotError,
        which: pools::Which,
    ) -> Throttled {
        let inner = &*self.inner;
        let mut told = Duration::ZERO;
        let e = match e {
            pools::SlotError::Full { ahead } => {
                let limit = match which {
                    pools::Which::Tool => format!("tool:{}", spec.tool),
                    pools::Which::Global => "global".to_string(),
                };
                let pool = inner.slots.pool(tool, which);
                let now = inner.clock.now_nanos();
                let estimate = pool.drain_estimate(ahead, now);
                let ready = now.saturating_add(saturating_nanos(estimate));
                let at = inner.told.tell(&limit, now, ready, pool.drain_step(), None);
                told = Duration::from_nanos(at - now);
                e
            }
            // A background call held back for its class says so.
            pools::SlotError::TimedOut
                if spec.priority.is_background() && which == pools::Which::Global =>
            {
                if let Some(cap) = inner.slots.global().background_cap() {
                    return Throttled::new(
                        Status::TimedOut,
                        "global:background",
                        format!(
                            "background calls hold at most {cap} of the {} global slots and yield to \
                             interactive ones; none came free before the call's deadline",
                            inner.slots.global().cap
                        ),
                    );
                }
                e
            }
            e => e,
        };
        pools::slot_refusal(&spec.tool, e, which, told)
    }
}
