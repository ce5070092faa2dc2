//! [`RetryBudget`]: retries as a share of first attempts, shared by every
//! call that uses it, so a failing dependency sees at most `1 + ratio`
//! times its normal traffic, not `1 + max_retries` times.
//!
//! One word holds the balance (thousandths of a retry) and the time of its
//! last change (ms, wrapping). Every first attempt deposits `ratio`; every
//! retry withdraws one. The balance decays exponentially with the window as
//! time constant. A floor of `min_per_sec` (its own token bucket) lets a
//! quiet caller still retry. Every change is one CAS.

use core::fmt;
use core::num::NonZeroU32;
use core::time::Duration;

use crate::bucket::{Quota, TokenBucket};
use crate::clock::{Clock, DefaultClock};
use crate::sync::{AtomicU64, Ordering};

/// Thousandths of a retry per unit of balance.
const MILLI: f64 = 1_000.0;

/// How far ahead of a thread's `now` a racing thread's stamp can be: far
/// more than any race, far less than the 49.7-day wrap.
const BEHIND_MS: u32 = 60_000;

/// A process-wide retry budget: over a sliding window, retries are at most
/// `ratio` × first attempts, plus a floor of `min_per_sec`. Share one
/// through [`RetryPolicy::budget`](crate::retry::RetryPolicy::budget).
///
/// # Examples
///
/// ```
/// use backpressure::retry::RetryBudget;
/// use backpressure::ManualClock;
/// use std::time::Duration;
///
/// // 20% of first attempts, no floor.
/// let budget = RetryBudget::with_clock(0.2, 0, Duration::from_secs(10), ManualClock::new());
/// for _ in 0..10 {
///     budget.deposit(); // ten calls' first attempts
/// }
/// assert!(budget.try_withdraw());
/// assert!(budget.try_withdraw());
/// assert!(!budget.try_withdraw(), "two retries for ten calls");
/// ```
pub struct RetryBudget<C: Clock = DefaultClock> {
    /// `balance_milli << 32 | stamp_ms`.
    state: AtomicU64,
    /// Thousandths of a retry each first attempt deposits.
    deposit: u32,
    /// The decay's time constant, in milliseconds (at least 1).
    window_ms: f64,
    floor: Option<TokenBucket<C>>,
    clock: C,
}

impl RetryBudget<DefaultClock> {
    /// A budget of `ratio` retries per first attempt (clamped to `[0,
    /// 1000]`; NaN is 0) over `window` (at least 1 ms), plus `min_per_sec`
    /// retries a second whatever the traffic.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::RetryBudget;
    /// use std::time::Duration;
    /// let budget = RetryBudget::new(0.1, 1, Duration::from_secs(10));
    /// assert!(budget.try_withdraw(), "the floor");
    /// ```
    pub fn new(ratio: f64, min_per_sec: u32, window: Duration) -> Self {
        RetryBudget::with_clock(ratio, min_per_sec, window, DefaultClock::new())
    }
}

impl<C: Clock + Clone> RetryBudget<C> {
    /// [`new`](RetryBudget::new) on `clock`.
    pub fn with_clock(ratio: f64, min_per_sec: u32, window: Duration, clock: C) -> Self {
        let ratio = if ratio.is_nan() {
            0.0
        } else {
            ratio.clamp(0.0, 1_000.0)
        };
        let floor = NonZeroU32::new(min_per_sec)
            .map(|n| TokenBucket::with_clock(Quota::per_second(n), clock.clone()));
        let budget = RetryBudget {
            state: AtomicU64::new(0),
            deposit: (ratio * MILLI).round() as u32,
            window_ms: (window.as_secs_f64() * 1e3).max(1.0),
            floor,
            clock,
        };
        budget
            .state
            .store(pack(0, budget.now_ms()), Ordering::Relaxed);
        budget
    }

    /// Records a call's first attempt: `ratio` more retries to spend.
    pub fn deposit(&self) {
        self.update(|balance| Some(balance.saturating_add(self.deposit)));
    }

    /// Takes one retry from the balance, else from the floor; `false` when
    /// neither has one.
    pub fn try_withdraw(&self) -> bool {
        let from_balance = self.update(|balance| balance.checked_sub(MILLI as u32));
        from_balance
            || self
                .floor
                .as_ref()
                .is_some_and(|f| f.try_acquire(1).is_ok())
    }

    /// The retries the balance holds now (without the floor).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::retry::RetryBudget;
    /// use backpressure::ManualClock;
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let budget = RetryBudget::with_clock(0.5, 0, Duration::from_secs(10), clock.clone());
    /// budget.deposit();
    /// budget.deposit();
    /// assert_eq!(budget.available(), 1.0);
    /// clock.advance(Duration::from_secs(10));
    /// assert!((budget.available() - 1.0 / std::f64::consts::E).abs() < 0.01);
    /// ```
    pub fn available(&self) -> f64 {
        // Relaxed: a snapshot for stats; nothing else is read with it.
        let (balance, stamp) = unpack(self.state.load(Ordering::Relaxed));
        f64::from(self.decayed(balance, stamp, self.now_ms())) / MILLI
    }

    /// Applies `f` to the decayed balance in one CAS loop; `false` (nothing
    /// written) when `f` refuses.
    fn update(&self, f: impl Fn(u32) -> Option<u32>) -> bool {
        // Relaxed throughout: the word is its own and only datum.
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            let now = self.now_ms();
            let (balance, stamp) = unpack(current);
            let Some(next) = f(self.decayed(balance, stamp, now)) else {
                return false;
            };
            match self.state.compare_exchange_weak(
                current,
                pack(next, now),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// `balance` written at `stamp`, decayed to `now` (milliseconds).
    fn decayed(&self, balance: u32, stamp: u32, now: u32) -> u32 {
        let elapsed = now.wrapping_sub(stamp);
        // A stamp at most `BEHIND_MS` ahead of `now` is a racing writer and
        // decays nothing; any other difference is elapsed time.
        if elapsed == 0 || elapsed > u32::MAX - BEHIND_MS {
            return balance;
        }
        let kept = (-f64::from(elapsed) / self.window_ms).exp();
        (f64::from(balance) * kept) as u32
    }

    fn now_ms(&self) -> u32 {
        // Truncated to 32 bits: the difference of two stamps is what counts.
        (self.clock.now_nanos() / 1_000_000) as u32
    }
}

fn pack(balance: u32, stamp: u32) -> u64 {
    u64::from(balance) << 32 | u64::from(stamp)
}

fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

impl<C: Clock + Clone> fmt::Debug for RetryBudget<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ratio", &(f64::from(self.deposit) / MILLI))
            .field("window_ms", &self.window_ms)
            .field("available", &self.available())
            .field("floor", &self.floor.is_some())
            .finish()
    }
}

/// What [`RetryPolicy`](crate::retry::RetryPolicy) needs of a budget.
pub(crate) trait Allowance: fmt::Debug + Send + Sync {
    fn deposit(&self);
    fn try_withdraw(&self) -> bool;
}

impl<C: Clock + Clone + Send + Sync> Allowance for RetryBudget<C> {
    fn deposit(&self) {
        RetryBudget::deposit(self);
    }

    fn try_withdraw(&self) -> bool {
        RetryBudget::try_withdraw(self)
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    /// A balance idle for over `u32::MAX / 2` ms still decays.
    #[test]
    fn retry_budget_forgets_to_decay_after_25_idle_days_is_fixed() {
        let c = ManualClock::new();
        let b = RetryBudget::with_clock(1.0, 0, Duration::from_secs(10), c.clone());
        for _ in 0..100 {
            b.deposit();
        }
        c.advance(Duration::from_secs(26 * 24 * 3600));
        assert!(b.available() < 1.0, "{}", b.available());
        assert!(!b.try_withdraw());
        assert_eq!(b.decayed(1_000, 10, 5), 1_000);
    }

    /// The balance counts retries, decays by e per window, then the floor.
    #[test]
    fn the_balance_counts_retries_decays_by_e_per_window_and_falls_back_to_the_floor() {
        let c = ManualClock::new();
        let b = RetryBudget::with_clock(1.0, 0, Duration::from_secs(10), c.clone());
        for _ in 0..3 {
            b.deposit();
        }
        assert_eq!(b.available(), 3.0);
        assert!(b.try_withdraw());
        assert_eq!(b.available(), 2.0);
        c.advance(Duration::from_secs(10));
        assert!(
            (b.available() - 2.0 / std::f64::consts::E).abs() < 0.01,
            "{}",
            b.available()
        );
        let floored = RetryBudget::with_clock(0.0, 1, Duration::from_secs(10), c.clone());
        assert!(floored.try_withdraw());
        assert!(!floored.try_withdraw());
        assert_eq!(b.decayed(1_000, BEHIND_MS + 1, 0), 0);
        assert_eq!(b.decayed(1_000, BEHIND_MS, 0), 1_000);
        let shown = format!("{b:?}");
        assert!(
            shown.contains("ratio: 1.0") && shown.contains("window_ms: 10000.0"),
            "{shown}"
        );
    }
}
