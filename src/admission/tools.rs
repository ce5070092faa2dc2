//! The per-tool registry: each tool's pool, budget and learned server
//! scope, created with the defaults on first use and bounded.

use core::time::Duration;
use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};

use super::cache::{self, Cache, Generation};
use super::pools::{Pool, SlotPolicy};
use super::stats::Counters;

thread_local! {
    /// This thread's last few tool lookups (see `cache.rs`).
    static TOOLS: std::cell::RefCell<Cache<ToolState>> =
        const { std::cell::RefCell::new(Cache::new()) };
}
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering, Ordering::Relaxed};
use crate::throttled::{Status, Throttled};

#[derive(Clone, Debug)]
pub(super) struct ToolConfig {
    pub(super) cap: usize,
    pub(super) policy: SlotPolicy,
    pub(super) budget: Option<u32>,
    pub(super) lanes: bool,
}

pub(super) struct ToolState {
    pub(super) name: Arc<str>,
    /// Created on first use with the defaults: may be evicted once idle.
    dynamic: bool,
    pub(super) pool: Pool,
    pub(super) policy: SlotPolicy,
    /// Calls admitted in this run, against `budget`.
    pub(super) used: AtomicU32,
    pub(super) budget: Option<u32>,
    /// The server scope (from limit headers) this tool was seen under.
    pub(super) server_scope: RwLock<Option<String>>,
    /// Whether `server_scope` was ever set (the lock is read only then).
    pub(super) scoped: AtomicBool,
    /// Answers sent in the latest second and the one before (`second << 32 |
    /// credential tag << 16 | before << 8 | latest`), when the layer learns:
    /// what the tool's own limit let one credential through, once it
    /// refuses. Answers of two credentials tag it `MIXED`: no one's.
    answered: AtomicU64,
    pub(super) counters: Counters,
}

impl ToolState {
    /// Held only by the registry's `maps` maps, and it has used no
    /// budget. A reader cloning it concurrently either raises the count or
    /// runs on an untracked tool, which is harmless (its slots are its own).
    fn is_idle(self: &Arc<Self>, maps: usize) -> bool {
        // Relaxed: a counter, read by the registry's single writer.
        Arc::strong_count(self) == maps && self.used.load(Ordering::Relaxed) == 0
    }

    pub(super) fn new(
        name: &str,
        cfg: &ToolConfig,
        expected_latency: Duration,
        dynamic: bool,
    ) -> Self {
        Self {
            name: Arc::from(name),
            dynamic,
            pool: match cfg.lanes {
                // No cap on a tool's pool: background calls are capped on the global one.
                true => Pool::new(cfg.cap, expected_latency).with_lanes(usize::MAX),
                false => Pool::new(cfg.cap, expected_latency),
            },
            policy: cfg.policy,
            used: AtomicU32::new(0),
            budget: cfg.budget,
            server_scope: RwLock::new(None),
            scoped: AtomicBool::new(false),
            answered: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }

    /// Counts an answer to `credential`'s request sent at `sent_at` (ns).
    pub(super) fn note_answered(&self, credential: &str, sent_at: u64) {
        let (second, own) = ((sent_at / 1_000_000_000) & 0xffff_ffff, tag(credential));
        // Relaxed: a statistic; the compare-and-swap alone keeps the count.
        let _ = self.answered.fetch_update(Relaxed, Relaxed, |w| {
            let (at, was, latest) = (w >> 32, (w >> 16) & 0xffff, w & 0xff);
            let tag = if was == 0 || was == own { own } else { MIXED };
            Some(match second {
                s if s == at => s << 32 | tag << 16 | (w & 0xff00) | (latest + 1).min(0xff),
                s if s == at + 1 => s << 32 | tag << 16 | latest << 8 | 1,
                s if s < at => w, // a late answer of an older second
                s => s << 32 | own << 16 | 1,
            })
        });
    }

    /// The most answers `credential` was sent in one second of the last two
    /// before `now`; 0 if another credential's answers are counted too.
    pub(super) fn answered_per_second(&self, credential: &str, now: u64) -> u64 {
        // Relaxed: see `note_answered`.
        let w = self.answered.load(Ordering::Relaxed);
        let (at, was, before, latest) = (w >> 32, (w >> 16) & 0xffff, (w >> 8) & 0xff, w & 0xff);
        match ((now / 1_000_000_000) & u64::from(u32::MAX)).saturating_sub(at) {
            _ if was != tag(credential) => 0,
            0 => before.max(latest),
            1 => latest,
            _ => 0,
        }
    }
}

/// Answers of more than one credential.
const MIXED: u64 = 0xffff;

/// A credential's 16-bit tag in `answered`, in `1..MIXED`.
fn tag(credential: &str) -> u64 {
    ahash::RandomState::with_seeds(1, 2, 3, 4).hash_one(credential) % (MIXED - 1) + 1
}

pub(super) struct Tools {
    /// Read without a lock; replaced whole by a writer holding `write`, so
    /// a lookup costs no atomic read-modify-write.
    map: ArcSwap<ToolMap>,
    /// Bumped after every store to `map`: validates the per-thread cache.
    generation: Generation,
    /// Serializes writers (new tools, evictions) and `close_all`.
    write: Mutex<()>,
    /// At most this many tools created on first use.
    max_dynamic: usize,
    default: ToolConfig,
    expected_latency: Duration,
}

type ToolMap = HashMap<String, Arc<ToolState>, ahash::RandomState>;

impl Tools {
    pub(super) fn new(
        configured: HashMap<String, ToolConfig>,
        default: ToolConfig,
        max_dynamic: usize,
        expected_latency: Duration,
    ) -> Self {
        let map: ToolMap = configured
            .into_iter()
            .map(|(name, cfg)| {
                let state = Arc::new(ToolState::new(&name, &cfg, expected_latency, false));
                (name, state)
            })
            .collect();
        Self {
            map: ArcSwap::from_pointee(map),
            generation: Generation::new(),
            write: Mutex::new(()),
            max_dynamic,
            default,
            expected_latency,
        }
    }

    /// The state of `tool`, created with the defaults on first use. Dynamic
    /// tools are capped at `max_dynamic`: idle ones are evicted first (losing
    /// their learned hold time and scope), and a new name is refused only if
    /// none is idle.
    #[inline]
    pub(super) fn get(&self, tool: &str) -> Result<Arc<ToolState>, Throttled> {
        cache::lookup(&TOOLS, &self.generation, tool, || {
            let t = self.get_uncached(tool)?;
            let name = t.name.clone();
            Ok((t, Some(name)))
        })
    }

    fn get_uncached(&self, tool: &str) -> Result<Arc<ToolState>, Throttled> {
        if let Some(t) = self.map.load().get(tool) {
            return Ok(t.clone());
        }
        self.insert(tool)
    }

    #[cold]
    fn insert(&self, tool: &str) -> Result<Arc<ToolState>, Throttled> {
        let _writer = self.write.lock();
        let current = self.map.load_full();
        if let Some(t) = current.get(tool) {
            return Ok(t.clone());
        }
        let mut tools: ToolMap = (*current).clone();
        let dynamic = tools.values().filter(|t| t.dynamic).count();
        if dynamic >= self.max_dynamic {
            // Held by `current`, its copy `tools`, and nothing else: idle.
            tools.retain(|_, t| !(t.dynamic && t.is_idle(2)));
            let left = tools.values().filter(|t| t.dynamic).count();
            if left >= self.max_dynamic {
                return Err(Throttled::new(
                    Status::Shed,
                    format!("tool:{tool}"),
                    format!(
                        "{left} tools not configured by name are in use, the most this layer tracks; \
                         retry once some finish, or configure the tool by name"
                    ),
                ));
            }
        }
        let state = Arc::new(ToolState::new(
            tool,
            &self.default,
            self.expected_latency,
            true,
        ));
        tools.insert(tool.to_string(), state.clone());
        self.map.store(Arc::new(tools));
        self.generation.bump();
        Ok(state)
    }

    pub(super) fn peek(&self, name: &str) -> Option<Arc<ToolState>> {
        self.map.load().get(name).cloned()
    }

    pub(super) fn all(&self) -> Vec<Arc<ToolState>> {
        self.map.load().values().cloned().collect()
    }

    /// Closes every tool's pool. Under the writer lock: a tool created
    /// concurrently is either walked here or sees the closed flag (stored
    /// before this call) when `admit` checks again.
    pub(super) fn close_all(&self) {
        let _writer = self.write.lock();
        for tool in self.map.load().values() {
            tool.pool.close();
        }
    }

    pub(super) fn reset_budgets(&self) {
        for t in self.map.load().values() {
            // Relaxed: counters.
            t.used.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    /// The answers of the latest two seconds; older seconds count nothing.
    #[test]
    fn answered_per_second_counts_the_last_two_seconds() {
        const S: u64 = 1_000_000_000;
        let cfg = ToolConfig {
            cap: 1,
            policy: SlotPolicy::Wait,
            budget: None,
            lanes: false,
        };
        let tool = ToolState::new("t", &cfg, Duration::ZERO, false);
        for at in [10 * S, 10 * S + 1, 10 * S + 2, 11 * S, 9 * S] {
            tool.note_answered("a", at); // the late 9 s answer changes nothing
        }
        assert_eq!(tool.answered_per_second("a", 11 * S + S / 2), 3);
        assert_eq!(tool.answered_per_second("a", 12 * S), 1);
        assert_eq!(tool.answered_per_second("a", 13 * S), 0);
        // Another credential's answers tell nothing about "a"'s, nor theirs.
        assert_eq!(tool.answered_per_second("b", 11 * S + S / 2), 0);
        tool.note_answered("b", 11 * S);
        assert_eq!(tool.answered_per_second("a", 11 * S + S / 2), 0);
        assert_eq!(tool.answered_per_second("b", 11 * S + S / 2), 0);
    }
}
