//! The circuit breaker per (tool, credential). Each circuit is one atomic
//! word, changed by CAS: tag in bits 62-63; `CLOSED` holds failures in a
//! row (bits 0-20), answers (21-41) and failures (42-61) of the ratio
//! window; `OPEN` the instant the cool-down ends; `TRIAL` the instant the
//! trial lapses. Capacity answers (429) neither trip nor reset it.

use core::time::Duration;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::saturating_nanos;
use crate::sync::{AtomicU64, Ordering};

/// When a circuit opens, and for how long: see
/// [`Builder::circuit_breaker`](super::Builder::circuit_breaker).
///
/// A circuit is kept per (tool, credential). It opens after
/// [`consecutive_failures`](Self::consecutive_failures) failures in a row,
/// or (if set) when [`failure_ratio`](Self::failure_ratio)'s share of a
/// window of answers failed. A failure is a 5xx (but a 503 with
/// `Retry-After`), a transport error, or no answer by the deadline; 429s
/// never count.
///
/// While open, calls are refused at once with
/// [`Status::Unavailable`](crate::Status::Unavailable) and `retry_after_ms`
/// set to the cool-down left. After the cool-down one trial call goes out:
/// an answer closes the circuit, a failure reopens it. A trial dropped
/// unanswered only delays the next one (by one cool-down at most).
///
/// # Examples
///
/// ```
/// use backpressure::admission::{Admission, CallSpec, CircuitBreaker};
/// use backpressure::headers::ServerHint;
/// use backpressure::{ManualClock, Status};
/// use std::time::Duration;
/// # futures::executor::block_on(async {
/// let clock = ManualClock::new();
/// let admission = Admission::builder()
///     .clock(clock.clone())
///     .circuit_breaker(CircuitBreaker::new().consecutive_failures(2).cool_down(Duration::from_secs(5)))
///     .build();
/// let spec = CallSpec::new("search", "key");
/// for _ in 0..2 {
///     let ticket = admission.admit(&spec).await.unwrap();
///     ticket.observe(500, &ServerHint::default());
/// }
/// let refused = admission.admit(&spec).await.unwrap_err();
/// assert_eq!(refused.status, Status::Unavailable);
/// assert_eq!(refused.retry_after_ms, Some(5_000));
///
/// clock.advance(Duration::from_secs(5));
/// let trial = admission.admit(&spec).await.unwrap(); // one trial
/// assert_eq!(admission.admit(&spec).await.unwrap_err().status, Status::Unavailable);
/// trial.observe(200, &ServerHint::default());
/// drop(trial);
/// assert!(admission.admit(&spec).await.is_ok()); // closed again
/// # });
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CircuitBreaker {
    consecutive: u32,
    /// The failure share, and the window of answers it is judged over.
    ratio: Option<(f64, u32)>,
    cool_down: Duration,
}

impl CircuitBreaker {
    /// The most failures in a row, and the largest ratio window, a circuit
    /// counts; larger settings are clamped to it.
    pub const MAX_COUNT: u32 = (1 << 20) - 1;

    /// Opens after 5 failures in a row, for 5 s; no failure ratio.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::CircuitBreaker;
    /// let breaker = CircuitBreaker::new();
    /// # let _ = breaker;
    /// ```
    pub fn new() -> Self {
        Self {
            consecutive: 5,
            ratio: None,
            cool_down: Duration::from_secs(5),
        }
    }

    /// Opens after `n` failures in a row (clamped to `1..=MAX_COUNT`).
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.consecutive = n.clamp(1, Self::MAX_COUNT);
        self
    }

    /// Also opens when at least `ratio` of a window of `window` answers
    /// (clamped to `1..=MAX_COUNT`) failed; a ratio outside `(0, 1]` turns it
    /// off. Windows are tumbling, not sliding.
    pub fn failure_ratio(mut self, ratio: f64, window: u32) -> Self {
        self.ratio =
            (ratio > 0.0 && ratio <= 1.0).then(|| (ratio, window.clamp(1, Self::MAX_COUNT)));
        self
    }

    /// How long a circuit stays open before a trial (clamped to at least
    /// 1 ms, and to about 73 years).
    pub fn cool_down(mut self, d: Duration) -> Self {
        self.cool_down = d.clamp(Duration::from_millis(1), Duration::from_nanos(VALUE));
        self
    }

    /// The cool-down, after the clamp.
    pub(super) fn cool_down_nanos(&self) -> u64 {
        saturating_nanos(self.cool_down)
    }
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::new()
    }
}

const TAG: u64 = 0b11 << 62;
const CLOSED: u64 = 0;
const OPEN: u64 = 0b01 << 62;
const TRIAL: u64 = 0b10 << 62;
/// The low bits: an instant (saturating).
const VALUE: u64 = !TAG;
const FIELD: u64 = (1 << 21) - 1;
const CALLS_SHIFT: u32 = 21;
const FAILED_SHIFT: u32 = 42;

/// What an answer says about the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It answered (a 2xx, a 4xx): the server is up.
    Answered,
    /// A 5xx, a transport error, no answer by the deadline.
    Failed,
    /// Its capacity (429, 503 with `Retry-After`): no verdict while closed,
    /// but an answer while a trial is out.
    Capacity,
}

/// What an answer (`None`: no answer) says about the server.
pub(crate) fn outcome(class: crate::retry::ReplyClass, status: Option<u16>) -> Outcome {
    use crate::retry::ReplyClass;
    match class {
        ReplyClass::Capacity => Outcome::Capacity,
        // A 408 is the client's slowness, not the server failing.
        ReplyClass::Transient if status != Some(408) => Outcome::Failed,
        _ => Outcome::Answered,
    }
}

/// What [`Circuit::admit`] lets through.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// The circuit is closed.
    Closed,
    /// The trial call, out until this instant at the latest.
    Trial(u64),
    /// Open until this instant; `trial` when a trial is out.
    Refused { until: u64, trial: bool },
}

/// One (tool, credential)'s breaker state (see the module docs).
#[derive(Debug)]
pub(crate) struct Circuit {
    word: AtomicU64,
}

impl Default for Circuit {
    fn default() -> Self {
        Self {
            word: AtomicU64::new(CLOSED),
        }
    }
}

impl Circuit {
    /// Whether a call may go now; a trial is out for at most `trial_for` ns.
    pub(crate) fn admit(&self, now: u64, trial_for: u64) -> Admit {
        // Relaxed throughout: the word is the circuit's only state, and no other
        // memory is published through it.
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            let (tag, at) = (word & TAG, word & VALUE);
            match tag {
                CLOSED => return Admit::Closed,
                _ if now < at => {
                    return Admit::Refused {
                        until: at,
                        trial: tag == TRIAL,
                    }
                }
                // Due, or the trial out has lapsed: this call is the trial.
                _ => {
                    let lapse = now.saturating_add(trial_for).min(VALUE);
                    match self.word.compare_exchange_weak(
                        word,
                        TRIAL | lapse,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => return Admit::Trial(lapse),
                        Err(w) => word = w,
                    }
                }
            }
        }
    }

    /// Records an answer. While a trial is out only the trial's answer
    /// decides (a late answer of a call sent before the circuit opened counts
    /// for nothing); while open, nothing counts.
    pub(crate) fn record(&self, cfg: &CircuitBreaker, outcome: Outcome, now: u64, trial: bool) {
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            let next = match word & TAG {
                TRIAL if !trial => return,
                TRIAL => match outcome {
                    Outcome::Failed => open_until(now, cfg),
                    Outcome::Answered | Outcome::Capacity => CLOSED,
                },
                CLOSED => match closed_next(word, cfg, outcome, now) {
                    Some(next) => next,
                    None => return,
                },
                _ => return,
            };
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(w) => word = w,
            }
        }
    }

    /// The trial out until `lapse` was not sent after all: the circuit is due
    /// at once, so the next call is the trial.
    pub(crate) fn release(&self, lapse: u64) {
        // A failed CAS: the circuit moved on; nothing to give back.
        let _ =
            self.word
                .compare_exchange(TRIAL | lapse, OPEN, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Closed: forgetting it loses a failure count at most, never a refusal.
    fn is_closed(&self) -> bool {
        self.word.load(Ordering::Relaxed) & TAG == CLOSED
    }
}

fn open_until(now: u64, cfg: &CircuitBreaker) -> u64 {
    OPEN | now.saturating_add(cfg.cool_down_nanos()).min(VALUE)
}

/// A closed circuit's next word after `outcome`, or `None` if unchanged
/// (no write on the hot path).
fn closed_next(word: u64, cfg: &CircuitBreaker, outcome: Outcome, now: u64) -> Option<u64> {
    let mut run = word & FIELD;
    let mut calls = (word >> CALLS_SHIFT) & FIELD;
    let mut failed = (word >> FAILED_SHIFT) & FIELD;
    match outcome {
        Outcome::Capacity => return None,
        Outcome::Answered => run = 0,
        Outcome::Failed => {
            run += 1;
            failed += 1;
            if run >= u64::from(cfg.consecutive) {
                return Some(open_until(now, cfg));
            }
        }
    }
    if let Some((ratio, window)) = cfg.ratio {
        calls += 1;
        if calls >= u64::from(window) {
            #[allow(clippy::cast_precision_loss)] // both below 2^21
            if failed as f64 >= ratio * calls as f64 {
                return Some(open_until(now, cfg));
            }
            calls = 0;
            failed = 0;
        }
    } else {
        calls = 0;
        failed = 0;
    }
    let next = CLOSED | run | (calls << CALLS_SHIFT) | (failed << FAILED_SHIFT);
    (next != word).then_some(next)
}

/// A (tool, credential) pair as the map stores it.
type PairKey = (Arc<str>, Arc<str>);

/// A (tool, credential) pair hashed as the stored tuple is, so a lookup
/// allocates nothing.
#[derive(Hash)]
struct Pair<'a>(&'a str, &'a str);

impl hashbrown::Equivalent<PairKey> for Pair<'_> {
    fn equivalent(&self, key: &PairKey) -> bool {
        *key.0 == *self.0 && *key.1 == *self.1
    }
}

/// The layer's circuits, one per (tool, credential), bounded by
/// forgetting clean circuits nobody holds.
#[derive(Debug)]
pub(super) struct Breakers {
    pub(super) config: CircuitBreaker,
    map: Mutex<Map>,
}

#[derive(Debug)]
struct Map {
    circuits: hashbrown::HashMap<PairKey, Arc<Circuit>, std::collections::hash_map::RandomState>,
    /// The size at which the next new pair sweeps, keeping sweeps amortised
    /// over a quarter of the map.
    sweep_at: usize,
    #[cfg(all(test, not(feature = "loom")))]
    visited: usize,
}

/// At most this many circuits are tracked (but those held by a call in
/// admission); a sweep forgets unheld closed, then unheld open ones, down
/// to three quarters.
pub(super) const MAX_CIRCUITS: usize = 16_384;

impl Breakers {
    pub(super) fn new(config: CircuitBreaker) -> Self {
        Self {
            config,
            map: Mutex::new(Map {
                circuits: hashbrown::HashMap::default(),
                sweep_at: MAX_CIRCUITS,
                #[cfg(all(test, not(feature = "loom")))]
                visited: 0,
            }),
        }
    }

    /// The circuit of (`tool`, `credential`), created closed.
    pub(super) fn circuit(&self, tool: &Arc<str>, credential: &str) -> Arc<Circuit> {
        let mut map = self.map.lock();
        if let Some(c) = map.circuits.get(&Pair(tool, credential)) {
            return c.clone();
        }
        if map.circuits.len() >= map.sweep_at {
            map.sweep();
        }
        let circuit = Arc::<Circuit>::default();
        map.circuits
            .insert((tool.clone(), Arc::from(credential)), circuit.clone());
        circuit
    }

    #[cfg(all(test, not(feature = "loom")))]
    pub(super) fn len(&self) -> usize {
        self.map.lock().circuits.len()
    }

    #[cfg(all(test, not(feature = "loom")))]
    pub(super) fn visited(&self) -> usize {
        self.map.lock().visited
    }
}

impl Map {
    /// Forgets unheld closed circuits, then unheld open ones while more than
    /// three quarters of the map remain.
    #[cold]
    fn sweep(&mut self) {
        let unheld = |c: &Arc<Circuit>| Arc::strong_count(c) == 1;
        #[cfg(all(test, not(feature = "loom")))]
        {
            self.visited += self.circuits.len();
        }
        self.circuits.retain(|_, c| !(unheld(c) && c.is_closed()));
        let target = MAX_CIRCUITS / 4 * 3;
        let mut len = self.circuits.len();
        if len > target {
            #[cfg(all(test, not(feature = "loom")))]
            {
                self.visited += len;
            }
            self.circuits.retain(|_, c| {
                let forget = len > target && unheld(c);
                len -= usize::from(forget);
                !forget
            });
        }
        self.sweep_at = MAX_CIRCUITS.max(len + len.max(MAX_CIRCUITS) / 4);
    }
}

/// A call's place in its circuit while being admitted: a trial not
/// admitted after all is given back on drop.
#[derive(Debug)]
pub(crate) struct Pass {
    pub(crate) circuit: Arc<Circuit>,
    /// The trial's lapse instant, or 0 (not a trial, or kept).
    pub(crate) trial: u64,
}

impl Pass {
    /// The call is admitted: a trial stays out. Returns whether it is one.
    pub(crate) fn keep(mut self) -> bool {
        core::mem::take(&mut self.trial) != 0
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        if self.trial != 0 {
            self.circuit.release(self.trial);
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
#[path = "breaker_tests.rs"]
mod tests;
