//! Quota changes: a bucket's state carried from one quota to another.

use crate::bucket::quota::Quota;

/// Converts a `tat` from quota `old` to quota `new` at `now`, by the
/// debt `D = tat - now` the bucket holds:
///
/// * `D == 0` (full): `tat` is returned as it is. A full bucket stays
///   full, whatever the change.
/// * `0 < D <= τ_old` (some of the burst is used): the debt is `D / T_old`
///   cells, and stays that many cells at the new period, `D * T_new /
///   T_old`, rounded up to a whole nanosecond. It is clamped to the new
///   burst (`τ_new`): cells beyond it are forgiven, so a lowered burst
///   leaves the bucket drained, not locked out past it. Lowering the rate
///   makes the same cells last longer; raising the burst opens the
///   difference at once (those cells were never taken).
/// * `D > τ_old` (held back past a whole burst: a penalty, or reservations
///   queued beyond the burst): the wait until the next single cell,
///   `D - (τ_old - T_old)`, is kept, and the new bucket is drained behind
///   it. So a server's `Retry-After` survives any quota change. The
///   result is never less than what the whole burst converts to as cells
///   (the case above at `D = τ_old`): without that floor, a bucket one
///   nanosecond past its burst could come out with less debt than a
///   bucket exactly at it (when the rate falls, the drained burst's next
///   cell is a new period away, while the kept wait is an old one). The
///   floor only ever lengthens the wait, to the new quota's own refill.
///
/// No term adds periods, so converting back and forth never builds debt:
/// flipping between two quotas leaves a held bucket's wait as it was, and
/// the cells of any other at most its debt rounded up to a whole cell.
/// Never lowers a debt below what the cells admitted (or the penalty)
/// cost under the new quota, apart from the documented clamp; never
/// overflows (u128 inside, capped at `u64::MAX`).
pub(crate) fn convert(tat: u64, now: u64, old: Quota, new: Quota) -> u64 {
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
