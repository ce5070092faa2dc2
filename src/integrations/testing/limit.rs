//! The fake server's own limiters, apart from the crate's primitives on
//! purpose: a witness must not share the bugs of what it judges.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How the fake server limits each key.
///
/// # Examples
///
/// ```
/// use backpressure::testing::Limit;
/// use std::time::Duration;
/// let rolling = Limit::Window { requests: 10, window: Duration::from_secs(1) };
/// let gcra = Limit::Gcra { period: Duration::from_millis(100), burst: 5 };
/// assert_ne!(rolling, gcra);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// At most `requests` admitted in any rolling `window` (a sliding log,
    /// as many API gateways count).
    Window {
        /// Requests per window (0 refuses everything).
        requests: usize,
        /// The window.
        window: Duration,
    },
    /// GCRA: one request per `period`, up to `burst` at once (nginx
    /// `limit_req`, Envoy, ...).
    Gcra {
        /// The time one request costs.
        period: Duration,
        /// Requests allowed at once (0 is taken as 1).
        burst: u32,
    },
}

/// A verdict: admitted with what is left, or refused with the wait.
#[derive(Clone, Copy, Debug)]
pub(super) struct Verdict {
    pub(super) admitted: bool,
    /// Requests left after this one (0 when refused).
    pub(super) remaining: u64,
    /// Until the quota is restored: the wait when refused.
    pub(super) reset: Duration,
}

impl Verdict {
    /// Refused, with the wait `reset`.
    fn refused(reset: Duration) -> Self {
        Verdict {
            admitted: false,
            remaining: 0,
            reset,
        }
    }
}

impl Limit {
    /// The quota and window announced in headers.
    pub(super) fn announced(&self) -> (u64, Duration) {
        match *self {
            Limit::Window { requests, window } => (requests as u64, window),
            Limit::Gcra { period, burst } => {
                let burst = burst.max(1);
                (u64::from(burst), period.saturating_mul(burst))
            }
        }
    }
}

/// Per-key state of one limit.
#[derive(Debug)]
pub(super) struct Limiter {
    limit: Limit,
    /// Window: admitted instants; GCRA: the theoretical arrival time.
    keys: HashMap<String, KeyState>,
}

#[derive(Debug)]
enum KeyState {
    Log(VecDeque<Instant>),
    Tat(Instant),
}

impl Limiter {
    pub(super) fn new(limit: Limit) -> Self {
        Limiter {
            limit,
            keys: HashMap::new(),
        }
    }

    pub(super) fn check(&mut self, key: &str, now: Instant) -> Verdict {
        match self.limit {
            Limit::Window { requests, window } => {
                let state = self
                    .keys
                    .entry(key.to_string())
                    .or_insert_with(|| KeyState::Log(VecDeque::new()));
                let KeyState::Log(log) = state else {
                    unreachable!("one limit kind per server")
                };
                while log
                    .front()
                    .is_some_and(|&t| now.saturating_duration_since(t) >= window)
                {
                    log.pop_front();
                }
                let until_oldest_expires = |log: &VecDeque<Instant>| {
                    log.front().map_or(Duration::ZERO, |&t| {
                        window.saturating_sub(now.saturating_duration_since(t))
                    })
                };
                if log.len() >= requests {
                    let reset = if requests == 0 {
                        window
                    } else {
                        until_oldest_expires(log)
                    };
                    return Verdict::refused(reset);
                }
                log.push_back(now);
                Verdict {
                    admitted: true,
                    remaining: (requests - log.len()) as u64,
                    reset: until_oldest_expires(log),
                }
            }
            Limit::Gcra { period, burst } => {
                let burst = burst.max(1);
                let tolerance = period.saturating_mul(burst);
                let state = self
                    .keys
                    .entry(key.to_string())
                    .or_insert(KeyState::Tat(now));
                let KeyState::Tat(tat) = state else {
                    unreachable!("one limit kind per server")
                };
                let base = (*tat).max(now);
                // A period no `Instant` can add: refused, with the period as the wait.
                let Some(new_tat) = base.checked_add(period) else {
                    return Verdict::refused(period);
                };
                let debt = new_tat - now;
                if debt > tolerance {
                    return Verdict::refused(debt - tolerance);
                }
                *tat = new_tat;
                let left = tolerance - debt;
                let remaining = if period.is_zero() {
                    u64::from(burst)
                } else {
                    (left.as_nanos() / period.as_nanos()) as u64
                };
                Verdict {
                    admitted: true,
                    remaining,
                    reset: debt,
                }
            }
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    /// `Limit::Gcra { period: Duration::MAX, .. }` refuses instead of panicking.
    #[test]
    fn a_period_no_instant_can_hold_refuses_instead_of_panicking() {
        let mut l = Limiter::new(Limit::Gcra {
            period: Duration::MAX,
            burst: 3,
        });
        let v = l.check("k", Instant::now());
        assert!(!v.admitted);
        assert_eq!(v.reset, Duration::MAX);
    }

    #[test]
    fn window_admits_requests_per_rolling_window() {
        let mut l = Limiter::new(Limit::Window {
            requests: 2,
            window: Duration::from_secs(1),
        });
        let t0 = Instant::now();
        assert!(l.check("k", t0).admitted);
        assert!(l.check("k", t0 + Duration::from_millis(400)).admitted);
        let v = l.check("k", t0 + Duration::from_millis(500));
        assert!(!v.admitted);
        assert_eq!(v.reset, Duration::from_millis(500));
        assert!(l.check("other", t0).admitted);
        assert!(l.check("k", t0 + Duration::from_secs(1)).admitted);
    }

    #[test]
    fn gcra_admits_the_burst_then_one_per_period() {
        let mut l = Limiter::new(Limit::Gcra {
            period: Duration::from_millis(100),
            burst: 3,
        });
        let t0 = Instant::now();
        for left in [2, 1, 0] {
            let v = l.check("k", t0);
            assert!(v.admitted);
            assert_eq!(v.remaining, left);
        }
        let v = l.check("k", t0);
        assert!(!v.admitted);
        assert_eq!(v.reset, Duration::from_millis(100));
        assert!(l.check("k", t0 + Duration::from_millis(100)).admitted);
    }
}
