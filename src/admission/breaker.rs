//! The circuit breaker per (tool, credential): a server that keeps
//! failing (5xx, transport errors, no answer by the deadline) is not sent
//! more calls until a cool-down has passed, then one trial call tests it.
//!
//! A 429, or a 503 with `Retry-After`, is the server's capacity, not a
//! fault: it neither trips nor resets the breaker (its hold already makes
//! callers wait). Any other answer (a 2xx, a 4xx) says the server is up.
//!
//! Each circuit is one atomic word, changed by compare-and-swap:
//!
//! | tag (bits 62-63) | low 62 bits |
//! | --- | --- |
//! | `CLOSED` | failures in a row (bits 0-20), answers (21-41) and failures (42-61) in the current ratio window |
//! | `OPEN` | the instant (layer clock, ns) the cool-down ends |
//! | `TRIAL` | the instant the trial out lapses |
//!
//! A trial is out until it is answered, or for at most one cool-down (or
//! its deadline, if shorter): a trial whose ticket is dropped unanswered
//! delays the next trial by that much, never for good. A trial that a
//! later stage of admission refuses is given back at once. Tickets carry
//! nothing for this (an answer finds its circuit by name), so a layer
//! without a breaker pays one branch per call.

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
/// or (if set) when at least [`failure_ratio`](Self::failure_ratio)'s
/// share of a window of answers failed. A failure is a 5xx (but a 503
/// with `Retry-After`), a transport error, or no answer by the deadline.
/// 429s never count: they are the server's capacity, and hold the
/// credential instead.
///
/// While open, calls are refused at once with
/// [`Status::Unavailable`](crate::Status::Unavailable) and `retry_after_ms`
/// set to the cool-down left; nothing is sent. After the cool-down one
/// call goes out as a trial (the others are still refused): an answer
/// closes the circuit, a failure opens it for another cool-down. A trial
/// is out until it is answered, or for one cool-down at most (its
/// deadline, if shorter): a trial dropped unanswered only delays the
/// next one.
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
    /// The share of failed answers, and the window of answers it is
    /// judged over.
    ratio: Option<(f64, u32)>,
    cool_down: Duration,
}

impl CircuitBreaker {
    /// The most failures in a row, and the largest ratio window, a
    /// circuit counts (the fields of its word); larger settings are
    /// clamped to it.
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

    /// Also opens when, over a window of `window` answers (clamped to
    /// `1..=MAX_COUNT`), at least `ratio` of them failed. A ratio that is
    /// not a number in `(0, 1]` turns the ratio off (0 or less would open
    /// on every window; above 1 never could).
    ///
    /// Windows are counted back to back (tumbling), not sliding: each is
    /// judged when its last answer arrives, then counted afresh.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::CircuitBreaker;
    /// // Half of any 20 answers failed: open.
    /// let breaker = CircuitBreaker::new().failure_ratio(0.5, 20);
    /// # let _ = breaker;
    /// ```
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
/// The low bits: an instant (an instant past it, some 146 years of
/// uptime, saturates).
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
    /// Its capacity (a 429, a 503 with `Retry-After`): no verdict while
    /// closed, but an answer all the same while a trial is out.
    Capacity,
}

/// What an answer (`None`: no answer) says about the server, in the
/// retry policy's one classification.
pub(crate) fn outcome(status: Option<u16>, hint: &crate::headers::ServerHint) -> Outcome {
    use crate::retry::ReplyClass;
    match crate::retry::reply_class(status, hint) {
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
    /// Open until this instant (layer clock, ns); `trial` when a trial is
    /// out (until then at the latest).
    Refused { until: u64, trial: bool },
}

/// One (tool, credential)'s breaker state (see the module docs).
#[derive(Debug)]
pub(crate) struct Circuit {
    word: AtomicU64,
}

impl Default for Circuit {
    /// Closed, nothing counted.
    fn default() -> Self {
        Self {
            word: AtomicU64::new(CLOSED),
        }
    }
}

impl Circuit {
    /// Whether a call may go now (`now` on the layer clock); a trial is
    /// out for at most `trial_for` nanoseconds.
    pub(crate) fn admit(&self, now: u64, trial_for: u64) -> Admit {
        // Relaxed loads and CASes throughout: the word is the only state a
        // circuit has, and no other memory is published through it.
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

    /// Records an answer (`trial`: the answer of a call admitted as the
    /// circuit's trial). While a trial is out, only a trial's answer
    /// decides: an answer closes the circuit and a failure reopens it; a
    /// late answer of a call sent before the circuit opened counts for
    /// nothing (issue #40). While open, nothing counts.
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

    /// The trial out until `lapse` was not sent after all (a later stage
    /// of admission refused it, or its admission was cancelled): the
    /// circuit is due at once, so the next call is the trial.
    pub(crate) fn release(&self, lapse: u64) {
        // A failed CAS: an answer was recorded meanwhile, or the circuit
        // moved on; either way there is nothing to give back.
        let _ =
            self.word
                .compare_exchange(TRIAL | lapse, OPEN, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Closed (counting or not): forgetting it loses a count of
    /// failures at most, never a refusal.
    fn is_closed(&self) -> bool {
        self.word.load(Ordering::Relaxed) & TAG == CLOSED
    }
}

fn open_until(now: u64, cfg: &CircuitBreaker) -> u64 {
    OPEN | now.saturating_add(cfg.cool_down_nanos()).min(VALUE)
}

/// A closed circuit's next word after `outcome`, or `None` when it does
/// not change (an answer with nothing to reset: no write on the hot path).
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

/// A (tool, credential) pair as a caller holds it: hashed and compared
/// as the stored pair is (a tuple hashes its fields in order), so a
/// lookup allocates nothing.
#[derive(Hash)]
struct Pair<'a>(&'a str, &'a str);

impl hashbrown::Equivalent<PairKey> for Pair<'_> {
    fn equivalent(&self, key: &PairKey) -> bool {
        *key.0 == *self.0 && *key.1 == *self.1
    }
}

/// The layer's circuits, one per (tool, credential): one mutex-guarded
/// map (consulted only when a breaker is configured), bounded by
/// forgetting clean circuits nobody holds.
#[derive(Debug)]
pub(super) struct Breakers {
    pub(super) config: CircuitBreaker,
    map: Mutex<Map>,
}

#[derive(Debug)]
struct Map {
    circuits: hashbrown::HashMap<PairKey, Arc<Circuit>, std::collections::hash_map::RandomState>,
    /// The size at which the next new pair sweeps: [`MAX_CIRCUITS`], or
    /// a quarter above what a sweep could not free, so sweeps stay
    /// amortised over a quarter of the map.
    sweep_at: usize,
    /// Entries the sweeps visited, for the test that bounds them.
    #[cfg(all(test, not(feature = "loom")))]
    visited: usize,
}

/// At most this many circuits are tracked, but for those held by a call
/// in admission. Past it the closed ones nobody holds are forgotten, then
/// if needed open ones nobody holds, down to three quarters: a sweep's
/// cost is spread over a quarter of the map in new pairs, and every pair
/// has a circuit that can open (issue #40).
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

    /// Circuits tracked now.
    #[cfg(all(test, not(feature = "loom")))]
    pub(super) fn len(&self) -> usize {
        self.map.lock().circuits.len()
    }

    /// Entries visited by sweeps so far.
    #[cfg(all(test, not(feature = "loom")))]
    pub(super) fn visited(&self) -> usize {
        self.map.lock().visited
    }
}

impl Map {
    /// Makes room: forgets the closed circuits nobody holds, then, while
    /// more than three quarters of the map remain, open ones nobody holds.
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

/// A call's place in its circuit while it is being admitted: a trial
/// that a later stage refuses (or whose admission is dropped) is given
/// back. Its ticket keeps nothing: an answer finds the circuit by name.
#[derive(Debug)]
pub(crate) struct Pass {
    pub(crate) circuit: Arc<Circuit>,
    /// The trial's lapse instant, or 0 (not a trial, or kept).
    pub(crate) trial: u64,
}

impl Pass {
    /// The call is admitted: a trial stays out. Returns whether the call
    /// is the trial.
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
