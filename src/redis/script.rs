//! The GCRA script (`gcra.lua`) and how it is called: one `EVALSHA` per
//! decision, `EVAL` after `NOSCRIPT` (a restarted or flushed server).
//!
//! # Arithmetic
//!
//! The rule of `bucket/gcra.rs`, in integer **microseconds** on Redis's
//! clock (`TIME`), so no client's clock skew can over-admit:
//!
//! ```text
//! at       = now + not_before       (0 unless another quota holds the call)
//! ready    = max(tat - (τ - n*T), at)  admit iff ready <= now (+ max_wait)
//! new tat  = max(tat, at) + n*T
//! ```
//!
//! The caller caps `not_before` at `max_wait`. Lua numbers are doubles,
//! exact below 2^53: the period is rounded *up* to whole µs, and the
//! tolerance, waits and penalties are capped at 2^51 µs, so every sum stays
//! exact. Values are written back with `%.0f` (`tostring` keeps 14 digits).
//!
//! # The key
//!
//! A hash `{t: tat, p: penalty}`: a give-back or refund never lowers `tat`
//! below `p`, so a 429 seen by one process holds every process back. A
//! quota from `set_quota` is stored as `qt` (period, µs) and `qb` (burst);
//! every reply starts with the quota in force for the caller. Converting
//! keeps the debt in cells, like `convert` in `bucket/gcra.rs`.
//!
//! Every write `PEXPIRE`s the key: when the bucket is full again (at least
//! 1 ms); when it states a quota, `τ` plus a minute (`KEEP_MS`); on an
//! explicit clock an hour (`EXPLICIT_MS`) more. Nothing is `PERSIST`ed; a
//! key found without an expiry gets one.
//!
//! # Bounds
//!
//! A stored quota is advice. Each call sends the process's own quota and
//! its [`Bounds`]; the script takes a stored `(T, b)` as
//!
//! ```text
//! T' = clamp(T, min_period, max_period)
//! b' = min(b, max_burst, max(1, floor(window / T')))
//! ```
//!
//! so a process admits at most `max_burst + t / min_period` over any span
//! `t`, whatever the key says. An out-of-bounds quota is clamped, not
//! rewritten (another process may hold it legitimately).
//!
//! # Settles, once
//!
//! A call's usage above or below its estimate is a settle: `+n` cells of
//! debt (whatever the wait and the burst, capped at `MAX_MICROS` ahead) or
//! `-n` given back. Each carries its bucket's `writer` id and a sequence
//! number; the script keeps the highest applied per writer in the key
//! (`w<writer>`, for at least a minute) and skips any it has applied, so a
//! settle whose reply was lost is sent again with the next round trip and
//! applied once. A writer's queue is sent whole, oldest first, so what is
//! applied is always a prefix, and the stored sequence is never past the
//! newest a call carries: one that is (written by someone else, to skip
//! every settle) is taken as none.
//!
//! # Refunds
//!
//! Each call carries the refunds of reservations dropped before their wait
//! had passed, `(before, after, n)` highest `after` first, each applied as
//! a `cancel` (`tat = max(before, p)` when `tat == after`), so a stack of
//! them unwinds in one call. The reply's first field is the cells given back.
//!
//! The script owns the key: a value it could not have written is repaired
//! on the safe side (an empty bucket refilling from now), with a warning in
//! the Redis log.

use ::redis::aio::ConnectionLike;
use ::redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind};

/// The script's source.
pub(super) const SOURCE: &str = include_str!("gcra.lua");

/// Cap on the tolerance, waits and penalties, in microseconds.
pub(super) const MAX_MICROS: u64 = 1 << 51;

/// The floor under a stored quota: its period at most this many times the
/// process's own (a rate no slower than 1/1000 of its own).
pub(super) const FLOOR_FACTOR: u64 = 1000;

/// The shortest window a stored burst is measured against, µs (one second).
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
    /// Give back `give` unused leased cells (the queued settles ride along).
    Give { give: u32 },
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

/// What a process takes a stored quota within; the script clamps to them.
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
    /// The bounds of a process built with `configured` whose own quota is
    /// `own`. Both passed `params_of`, so every product here is at most 2^51.
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

    /// Whether `quota` is within the bounds, as every quota a reply brings
    /// must be.
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
    /// The settles `(sequence, cells)` of `writer` not known applied.
    pub(super) writer: u64,
    pub(super) settles: &'a [(u64, i64)],
    pub(super) op: Op,
}

/// Builds the arguments after `KEYS`.
fn args(cmd: &mut Cmd, now_us: Option<u64>, call: Call<'_>) {
    let name = match call.op {
        Op::Take { .. } => "take",
        Op::Cancel { .. } => "cancel",
        Op::Penalize { .. } => "penalize",
        Op::Give { .. } => "give",
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
    cmd.arg(call.writer).arg(call.settles.len());
    for (seq, cells) in call.settles {
        cmd.arg(*seq).arg(*cells);
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
        Op::SetQuota { params } => cmd.arg(params.period_us).arg(params.burst),
        Op::Available | Op::Reset => cmd,
    };
}

/// Runs `call` on `key`: `EVALSHA`, then `EVAL` on `NOSCRIPT`. Returns the
/// reply and the round trips taken.
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
