//! Quota changes: a bucket's state carried from one quota to another.

use crate::bucket::quota::Quota;

/// Converts a `tat` from quota `old` to `new` at `now`, by the debt
/// `D = tat - now`, with `held_until` the end of the latest server hold
/// (0: none):
///
/// * `D == 0` (full): `tat` is returned as it is.
/// * A hold still running with the bucket held past its next cell
///   (`D > τ_old - T_old`): the wait until the next cell is kept as time
///   up to the hold's end (a `Retry-After` survives any quota change);
///   what lies past it is cells, scaled `× T_new / T_old` (rounded up).
/// * Otherwise the whole debt is cells: `D * T_new / T_old`, rounded up.
///   Nothing is forgiven: a burst lowered below the debt leaves the bucket
///   over-drawn.
///
/// Monotonic in the debt within each case; converting back and forth builds
/// at most a nanosecond of rounding per change. Never overflows.
pub(crate) fn convert(tat: u64, now: u64, old: Quota, new: Quota, held_until: u64) -> u64 {
    let debt = tat.saturating_sub(now) as u128;
    if debt == 0 {
        return tat;
    }
    let (t_old, tau_old) = (old.period as u128, old.tolerance() as u128);
    let (t_new, tau_new) = (new.period as u128, new.tolerance() as u128);
    // Both are below 2^64: the product fits in u128.
    let cells = |debt: u128| (debt * t_new).div_ceil(t_old);
    // `tau >= period` (burst >= 1): neither subtraction wraps.
    let (next_old, next_new) = (tau_old - t_old, tau_new - t_new);
    let hold = u128::from(held_until.saturating_sub(now));
    let kept = if hold > 0 && debt > next_old {
        let wait = debt - next_old;
        let in_hold = wait.min(hold);
        next_new
            .saturating_add(in_hold)
            .saturating_add(cells(wait - in_hold))
    } else {
        cells(debt)
    };
    (now as u128).saturating_add(kept).min(u64::MAX as u128) as u64
}

/// The conversion for a learned rate's change: debt past the burst is kept
/// as time (queued calls keep their instants), with the bucket drained
/// behind it; debt within the burst is kept in cells, capped at the new
/// burst. Monotonic in the debt; never overflows.
pub(crate) fn convert_keeping_queue(tat: u64, now: u64, old: Quota, new: Quota) -> u64 {
    let debt = tat.saturating_sub(now) as u128;
    if debt == 0 {
        return tat;
    }
    let (t_old, tau_old) = (old.period as u128, old.tolerance() as u128);
    let (t_new, tau_new) = (new.period as u128, new.tolerance() as u128);
    let cells = |debt: u128| (debt * t_new).div_ceil(t_old).min(tau_new);
    let kept = if debt > tau_old {
        // `tau >= period` (burst >= 1), so neither subtraction wraps.
        let wait = debt - (tau_old - t_old);
        ((tau_new - t_new) + wait).max(cells(tau_old))
    } else {
        cells(debt)
    };
    (now as u128 + kept).min(u64::MAX as u128) as u64
}
