//! The GCRA script and how it is called: one `EVALSHA` per decision,
//! `EVAL` after a `NOSCRIPT` reply (a restarted or flushed server).
//!
//! # Arithmetic
//!
//! The script runs the same rule as the local bucket (`bucket/gcra.rs`),
//! in integer **microseconds** on Redis's own clock (`TIME`), so no
//! client's clock skew can over-admit:
//!
//! ```text
//! at       = now + not_before       (0 unless another quota holds the call)
//! ready    = max(tat - (τ - n*T), at)  admit iff ready <= now (+ max_wait)
//! new tat  = max(tat, at) + n*T
//! ```
//!
//! `not_before` is capped at `max_wait` by the caller.
//!
//! Lua 5.1 numbers are doubles, exact for integers below 2^53 (`now` in µs
//! reaches 2^53 in 2255). The period is the quota's nanoseconds rounded
//! *up* to whole µs (the shared rate never exceeds the one asked for); the
//! tolerance, every wait and every penalty are capped at 2^51 µs, so every
//! sum stays below 2^53 and `floor` of a quotient is exact. Values are
//! written back with `%.0f` (`tostring` keeps only 14 digits).
//!
//! # The key
//!
//! A hash `{t: tat, p: penalty}`. `p` is the latest penalty's target: a
//! lease returning cells or a refund never lowers `tat` below it, so a 429
//! seen by one process holds every process back until its retry time.
//!
//! A quota set at run time (`set_quota`) is stored as `qt` (period, µs) and
//! `qb` (burst). It is advice: each process takes it within its own
//! [`Bounds`], and every reply starts with the quota in force for the
//! caller, so every process adopts it at its next round trip. The
//! conversion keeps the debt in cells as `bucket/gcra.rs` `convert` does
//! (none forgiven; a running penalty's part kept in time), capped at 2^51
//! µs; where `debt * T'` passes 2^53 it rounds up one more µs (safe side).
//!
//! Every write `PEXPIRE`s the key: when the bucket is full again (at least
//! 1 ms); when the key states a quota, `τ` and a minute (`KEEP_MS`) later,
//! so a process starting meanwhile still learns it. Nothing is
//! `PERSIST`ed. On an explicit clock (tests) the expiry gets an hour
//! (`EXPLICIT_MS`) more. A key found without an expiry gets one.
//!
//! # Bounds
//!
//! A process sends its own quota (the one it was built with, or the last
//! it set itself) and its bounds ([`Bounds::new`]). The script takes a
//! stored `(T, b)` as
//!
//! ```text
//! T' = clamp(T, min_period, max_period)
//! b' = min(b, max_burst, max(1, floor(window / T')))
//! ```
//!
//! - `min_period`: the shorter of the built-with and own periods (the
//!   ceiling);
//! - `max_period`: [`FLOOR_FACTOR`] (1000) times its own period;
//! - `max_burst`: the larger burst; `window`: the longer tolerance of the
//!   two quotas, at least [`MIN_WINDOW_US`] (one second).
//!
//! So a process admits at most `max_burst + t / min_period` over any span
//! `t`, whatever the key says. A stored quota outside the bounds is not
//! rewritten (another process may hold it legitimately): each process
//! clamps it and logs once (`tracing`). When the key states no quota, the
//! reply brings the process's own again.
//!
//! # Refunds of dropped reservations
//!
//! Each call carries the refunds of reservations dropped before their wait
//! had passed: `(before, after, n)`, sorted by `after`, highest first, each
//! applied as a `cancel` (`tat = max(before, p)` when `tat == after`), so a
//! stack of dropped reservations unwinds in one call; one with another
//! process's take on top stays taken. The reply's first field is the
//! number of cells given back.
//!
//! The script owns the key. A value it could not have written (not a hash,
//! a field outside the integers in `[0, now + 2^52]`) is repaired on the
//! safe side, to an empty bucket refilling from now, with a warning in the
//! Redis log: the caller sees an ordinary denial with a real wait.

use ::redis::aio::ConnectionLike;
use ::redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind};

/// The script's source.
pub(super) const SOURCE: &str = include_str!("gcra.lua");

/// Cap on the tolerance, waits and penalties, in microseconds (see the
/// module docs).
pub(super) const MAX_MICROS: u64 = 1 << 51;

/// The floor under a stored quota: its period at most this many times the
/// process's own (a rate no slower than 1/1000 of its own).
pub(super) const FLOOR_FACTOR: u64 = 1000;

/// The shortest window a stored burst is measured against, µs (one
/// second: limits are stated per second or longer, and a limit the
/// admission layer stores has a second's worth of burst).
pub(super) const MIN_WINDOW_US: u64 = 1_000_000;

/// One request to the script.
#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    /// Take `n` cells usable within `max_wait` µs, as of `not_before` µs
    /// from now (the call goes no earlier), plus up to `extra` more when
    /// they are usable now; first give back `give` unused cells.
    Take {
        n: u32,
        max_wait: u64,
        extra: u32,
        give: u32,
        not_before: u64,
    },
    /// Undo a take whose `tat` is still on top.
    Cancel { refund: Refund },
    /// Admit nothing before `now + retry` µs; first give back `give`.
    Penalize { retry: u64, give: u32 },
    /// Give back `give` unused cells (leased, or reserved and not used).
    Give { give: u32 },
    /// Take `n` cells now whatever the wait and the burst (debt capped at
    /// `MAX_MICROS` ahead); first give back `give`.
    Charge { n: u32, give: u32 },
    /// How many cells fit now.
    Available,
    /// Store `params` with the key, converting its state (debt kept in
    /// cells, no burst opened).
    SetQuota { params: Params },
    /// A full bucket, no penalty; a stored quota stays.
    Reset,
}

/// A take to undo if it is still on top of the key (`tat == after`): the
/// `tat` it found, the one it wrote (µs), and its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Refund {
    pub(super) before: u64,
    pub(super) after: u64,
    pub(super) n: u32,
}

/// The quota as the script sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Params {
    pub(super) period_us: u64,
    pub(super) burst: u32,
}

/// What a process takes a stored quota within (see *Bounds* in the
/// module docs); the script clamps to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Bounds {
    /// The ceiling's period: no faster than this.
    pub(super) min_period_us: u64,
    /// The floor's period: no slower than this.
    pub(super) max_period_us: u64,
    /// The ceiling's burst.
    pub(super) max_burst: u32,
    /// A stored burst gives at most this span's cells at its period.
    pub(super) window_us: u64,
}

impl Bounds {
    /// The bounds of a process built with `configured` whose own quota
    /// (what it was built with, or the last it set) is `own`. Both passed
    /// `params_of`, so every product here is at most 2^51.
    pub(super) fn new(configured: Params, own: Params) -> Bounds {
        let tolerance = |p: Params| p.period_us.saturating_mul(p.burst as u64);
        Bounds {
            min_period_us: configured.period_us.min(own.period_us),
            // At least the own period: that is at most 2^51 too.
            max_period_us: own.period_us.saturating_mul(FLOOR_FACTOR).min(MAX_MICROS),
            max_burst: configured.burst.max(own.burst),
            window_us: tolerance(configured)
                .max(tolerance(own))
                .clamp(MIN_WINDOW_US, MAX_MICROS),
        }
    }

    /// Whether `quota` is within the bounds: what every quota a reply
    /// brings must be (the script clamps to them; a reply outside them is
    /// not the script's).
    pub(super) fn hold(&self, quota: Params) -> bool {
        let Params { period_us, burst } = quota;
        (self.min_period_us..=self.max_period_us).contains(&period_us)
            && (1..=self.max_burst).contains(&burst)
            && (burst == 1 || period_us.saturating_mul(burst as u64) <= self.window_us)
    }
}

/// Everything one script call sends.
#[derive(Clone, Copy, Debug)]
pub(super) struct Call<'a> {
    /// This process's own quota: in force when the key states none.
    pub(super) params: Params,
    /// What a stored quota is taken within.
    pub(super) bounds: Bounds,
    /// Refunds of reservations dropped unused, highest `after` first.
    pub(super) refunds: &'a [Refund],
    pub(super) op: Op,
}

/// Builds the arguments after `KEYS`.
fn args(cmd: &mut Cmd, now_us: Option<u64>, call: Call<'_>) {
    let name = match call.op {
        Op::Take { .. } => "take",
        Op::Cancel { .. } => "cancel",
        Op::Penalize { .. } => "penalize",
        Op::Give { .. } => "give",
        Op::Charge { .. } => "charge",
        Op::Available => "available",
        Op::SetQuota { .. } => "set_quota",
        Op::Reset => "reset",
    };
    cmd.arg(name)
        .arg(call.params.period_us)
        .arg(call.params.burst)
        .arg(call.bounds.min_period_us)
        .arg(call.bounds.max_period_us)
        .arg(call.bounds.max_burst)
        .arg(call.bounds.window_us);
    match now_us {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(call.refunds.len());
    for r in call.refunds {
        cmd.arg(r.before).arg(r.after).arg(r.n);
    }
    match call.op {
        Op::Take {
            n,
            max_wait,
            extra,
            give,
            not_before,
        } => cmd
            .arg(n)
            .arg(max_wait)
            .arg(extra)
            .arg(give)
            .arg(not_before),
        Op::Cancel { refund } => cmd.arg(refund.before).arg(refund.after),
        Op::Penalize { retry, give } => cmd.arg(retry).arg(give),
        Op::Give { give } => cmd.arg(give),
        Op::Charge { n, give } => cmd.arg(n).arg(give),
        Op::SetQuota { params } => cmd.arg(params.period_us).arg(params.burst),
        Op::Available | Op::Reset => cmd,
    };
}

/// Runs `call` on `key`: `EVALSHA`, then `EVAL` (which also caches the
/// script again) if the server does not know the hash. Returns the reply
/// and how many round trips it took.
pub(super) async fn run<C: ConnectionLike + Send>(
    conn: &mut C,
    script: &Script,
    key: &str,
    now_us: Option<u64>,
    call: Call<'_>,
) -> (RedisResult<Vec<i64>>, u64) {
    let mut cmd = ::redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(1).arg(key);
    args(&mut cmd, now_us, call);
    match cmd.query_async::<Vec<i64>>(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            let mut cmd = ::redis::cmd("EVAL");
            cmd.arg(SOURCE).arg(1).arg(key);
            args(&mut cmd, now_us, call);
            (cmd.query_async::<Vec<i64>>(conn).await, 2)
        }
        reply => (reply, 1),
    }
}

#[cfg(test)]
mod tests {
    use super::{Bounds, Params, MAX_MICROS};

    fn q(period_us: u64, burst: u32) -> Params {
        Params { period_us, burst }
    }

    #[test]
    fn the_bounds_of_a_5_per_second_process() {
        let own = q(200_000, 5);
        let b = Bounds::new(own, own);
        assert_eq!(
            b,
            Bounds {
                min_period_us: 200_000,
                max_period_us: 200_000_000,
                max_burst: 5,
                window_us: 1_000_000,
            }
        );
        assert!(b.hold(own));
        // Slower, burst within a second of it: advice taken as is.
        assert!(b.hold(q(1_000_000, 1)));
        assert!(b.hold(q(400_000, 2)));
        // Faster, a larger burst, slower than the floor, or more burst than
        // a second gives at the stored rate: never.
        assert!(!b.hold(q(1, 4_294_967_295)));
        assert!(!b.hold(q(200_000, 6)));
        assert!(!b.hold(q(MAX_MICROS, 1)));
        assert!(!b.hold(q(400_000, 3)));
        // The floor's own cell.
        assert!(b.hold(q(200_000_000, 1)));
    }

    #[test]
    fn a_stated_higher_limit_raises_the_ceiling_and_both_quotas_hold() {
        let configured = q(10_000, 10);
        let told = q(1_000, 100);
        let b = Bounds::new(configured, told);
        assert_eq!((b.min_period_us, b.max_burst), (1_000, 100));
        assert_eq!(b.max_period_us, 1_000_000, "1000 of its own periods");
        assert!(b.hold(told) && b.hold(configured));
        // Told lower: the configured quota stays the ceiling.
        let b = Bounds::new(configured, q(1_000_000, 1));
        assert_eq!((b.min_period_us, b.max_burst), (10_000, 10));
        assert!(b.hold(configured) && b.hold(q(1_000_000, 1)));
    }

    #[test]
    fn the_floor_and_window_stay_within_the_script_cap() {
        let long = q(MAX_MICROS, 1);
        let b = Bounds::new(long, long);
        assert_eq!((b.max_period_us, b.window_us), (MAX_MICROS, MAX_MICROS));
        assert!(b.hold(long));
    }
}
