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
//! earliest = tat - (τ - n*T)        admit iff earliest <= now (+ max_wait)
//! new tat  = max(tat, now) + n*T
//! ```
//!
//! Lua 5.1 numbers are doubles, exact for integers below 2^53. `now` is
//! about 1.8 * 10^15 µs today (2^53 µs is the year 2255); the period is the
//! quota's nanoseconds rounded *up* to whole microseconds (so the shared
//! rate never exceeds the one asked for), and the tolerance `τ = burst*T`,
//! every wait and every penalty are capped at 2^51 µs (71 years), so every
//! sum the script forms stays below 2^53. Divisions (`available`, lease
//! sizes) divide integers below 2^53, where `floor` of the rounded quotient
//! is the exact integer quotient. Values are written back with `%.0f`
//! (Lua's `tostring` keeps only 14 digits).
//!
//! # The key
//!
//! A hash `{t: tat, p: penalty}`. `p` is the latest penalty's target: a
//! lease returning cells or a refund never lowers `tat` below it, so a 429
//! seen by one process holds every process back until its retry time. The
//! key `PEXPIRE`s when the bucket is full again (`tat - now`, at least
//! 1 ms): idle keys cost nothing.
//!
//! The script owns the key. A value it could not have written (not a
//! hash, a field that is not an integer in `[0, now + 2^52]`: `1e300`,
//! `abc`, `-1`, `inf`) is repaired on the safe side, to an empty bucket
//! refilling from now (`tat = max(tat, p, now + τ)`, keeping a valid
//! field), with a warning in the Redis log. The caller then sees an
//! ordinary denial with a real wait, never a zero-wait one.

use ::redis::aio::ConnectionManager;
use ::redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind};

/// The script's source.
pub(super) const SOURCE: &str = include_str!("gcra.lua");

/// Cap on the tolerance, waits and penalties, in microseconds (see the
/// module docs).
pub(super) const MAX_MICROS: u64 = 1 << 51;

/// One request to the script.
#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    /// Take `n` cells usable within `max_wait` µs, plus up to `extra` more
    /// when they are usable now; first give back `give` unused cells.
    Take {
        n: u32,
        max_wait: u64,
        extra: u32,
        give: u32,
    },
    /// Undo a take whose `tat` is still on top.
    Cancel { before: u64, after: u64 },
    /// Admit nothing before `now + retry` µs; first give back `give`.
    Penalize { retry: u64, give: u32 },
    /// Give back `give` unused leased cells.
    Give { give: u32 },
    /// How many cells fit now.
    Available,
}

/// The quota as the script sees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Params {
    pub(super) period_us: u64,
    pub(super) burst: u32,
}

/// Builds the arguments after `KEYS`.
fn args(cmd: &mut Cmd, params: Params, now_us: Option<u64>, op: Op) {
    let name = match op {
        Op::Take { .. } => "take",
        Op::Cancel { .. } => "cancel",
        Op::Penalize { .. } => "penalize",
        Op::Give { .. } => "give",
        Op::Available => "available",
    };
    cmd.arg(name).arg(params.period_us).arg(params.burst);
    match now_us {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    match op {
        Op::Take {
            n,
            max_wait,
            extra,
            give,
        } => cmd.arg(n).arg(max_wait).arg(extra).arg(give),
        Op::Cancel { before, after } => cmd.arg(before).arg(after),
        Op::Penalize { retry, give } => cmd.arg(retry).arg(give),
        Op::Give { give } => cmd.arg(give),
        Op::Available => cmd,
    };
}

/// Runs `op` on `key`: `EVALSHA`, then `EVAL` (which also caches the
/// script again) if the server does not know the hash. Returns the reply
/// and how many round trips it took.
pub(super) async fn run(
    conn: &mut ConnectionManager,
    script: &Script,
    key: &str,
    params: Params,
    now_us: Option<u64>,
    op: Op,
) -> (RedisResult<Vec<i64>>, u64) {
    let mut cmd = ::redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(1).arg(key);
    args(&mut cmd, params, now_us, op);
    match cmd.query_async::<Vec<i64>>(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            let mut cmd = ::redis::cmd("EVAL");
            cmd.arg(SOURCE).arg(1).arg(key);
            args(&mut cmd, params, now_us, op);
            (cmd.query_async::<Vec<i64>>(conn).await, 2)
        }
        reply => (reply, 1),
    }
}
