//! Quota changes: a bucket's state carried from one quota to another.

use crate::bucket::quota::Quota;

/// Converts a `tat` from quota `old` to quota `new` at `now`, by the
/// debt `D = tat - now` the bucket holds, with `held_until` the end of the
/// latest server hold (0: none):
///
/// * `D == 0` (full): `tat` is returned as it is. A full bucket stays
///   full, whatever the change.
/// * A server hold still running (`held_until > now`) with the bucket
///   held past its next cell (`D > τ_old - T_old`): the wait until the
///   next cell, `D - (τ_old - T_old)`, is the hold's up to its end, and
///   that part is kept as time, so a server's `Retry-After` survives any
///   quota change; what lies past the hold's end is cells reserved behind
///   it, kept as cells (`× T_new / T_old`, rounded up to a nanosecond).
///   The bucket is drained behind it under the new quota (`τ_new -
///   T_new`).
/// * Otherwise the whole debt is cells, taken or reserved, and stays that
///   many cells at the new period: `D * T_new / T_old`, rounded up to a
///   nanosecond. Nothing is forgiven: cells reserved past the new burst
///   leave the bucket over-drawn (its next cell waits for them), so a
///   change of quota and back never frees what calls already hold. Raising
///   the burst opens the difference at once (those cells were never taken);
///   lowering the rate makes the same cells last longer.
///
/// Monotonic in the debt within each case. (A hold enforced in full
/// leaves the bucket past its next cell until it ends: the penalty's
/// target is `hold end + τ - T`, and only a reset, which ends the hold,
/// lowers `tat` below it. One recorded longer than enforced may find the
/// bucket within its burst, whose debt then converts as cells.)
///
/// No term adds periods, so converting back and forth never builds debt
/// beyond a nanosecond of rounding per change. Never overflows (u128
/// inside, capped at `u64::MAX`). A hold recorded longer than the one
/// enforced (a server's wait past the layer's cap) only makes more of the
/// wait count as time, which errs towards admitting less.
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

/// The conversion a learned rate's change uses (the admission layer's
/// adaptive rates): what lies past the burst is kept as time, whatever
/// made it (a hold, or calls already queued: their instants are fixed
/// and they go when they were told), with the bucket drained behind it;
/// a debt within the burst is kept in cells, capped at the new burst.
/// A learned change keeps the burst, so the cap frees nothing there; it
/// is what the learned rate's simulations were measured with. Monotonic
/// in the debt; never overflows.
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
