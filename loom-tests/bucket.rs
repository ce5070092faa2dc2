//! Loom models of the TokenBucket on a `ManualClock`.
//!
//! Each model runs a few threads, each a short program of bucket
//! operations, then checks the outcome is *linearizable*: some serial order
//! of the same operations (respecting each thread's program order), replayed
//! on a fresh bucket, gives every thread the same answers and leaves the
//! same state. That one check covers the invariants: no interleaving admits
//! more than the GCRA bound (a serial replay cannot), a successful cancel
//! really gave its cells back and a refused one had to be refused (the
//! replay's state and answers would differ), penalties and quota changes
//! are never lost.
//!
//! The clock does not move inside a model, so every operation sees the
//! same `now` and the serial replay is exact.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::bucket::Quota;
use crate::clock::ManualClock;
use crate::sync::Arc;
use crate::{CheckError, Reservation, ReserveError, TokenBucket};

const START: u64 = 1_000;
const PERIOD: u64 = 100;

fn quota(period: u64, burst: u32) -> Quota {
    Quota::with_period(Duration::from_nanos(period)).allow_burst(NonZeroU32::new(burst).unwrap())
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Try(u32),
    Reserve(u32, u64),
    /// Cancels this thread's latest reservation.
    CancelLast,
    Penalize(u64),
    SetQuota(Quota),
    Reset,
    /// Gives cells back without stamps (a shared settle below the estimate).
    Give(u32),
}

#[derive(Clone, Debug, PartialEq)]
enum Out {
    Try(Result<(), CheckError>),
    Reserve(Result<(u64, u64), ReserveError>),
    Cancel(bool),
    Gave(u32),
    Done,
}

type Bucket = TokenBucket<ManualClock>;

fn new_bucket(q: Quota, setup: &[Op]) -> Bucket {
    let b = TokenBucket::with_clock(q, ManualClock::starting_at(START));
    run(&b, setup);
    b
}

fn run(b: &Bucket, ops: &[Op]) -> Vec<Out> {
    let mut last: Option<Reservation<'_>> = None;
    let mut outs = Vec::new();
    for &op in ops {
        let out = match op {
            Op::Try(n) => Out::Try(b.try_acquire(n)),
            Op::Reserve(n, w) => Out::Reserve(match b.reserve(n, Duration::from_nanos(w)) {
                Ok(r) => {
                    let got = (r.ready_at(), r.wait().as_nanos() as u64);
                    last = Some(r);
                    Ok(got)
                }
                Err(e) => Err(e),
            }),
            Op::CancelLast => Out::Cancel(last.take().is_some_and(Reservation::cancel)),
            Op::Penalize(d) => {
                b.penalize(Duration::from_nanos(d));
                Out::Done
            }
            Op::SetQuota(q) => {
                b.set_quota(q);
                Out::Done
            }
            Op::Reset => {
                b.reset();
                Out::Done
            }
            Op::Give(n) => Out::Gave(b.give_back(n)),
        };
        outs.push(out);
    }
    outs
}

/// Every merge of the threads' programs that keeps each program's order,
/// as a list of thread indices.
fn merges(lens: &[usize]) -> Vec<Vec<usize>> {
    fn go(left: &mut Vec<usize>, cur: &mut Vec<usize>, all: &mut Vec<Vec<usize>>) {
        if left.iter().all(|&l| l == 0) {
            all.push(cur.clone());
            return;
        }
        for t in 0..left.len() {
            if left[t] > 0 {
                left[t] -= 1;
                cur.push(t);
                go(left, cur, all);
                cur.pop();
                left[t] += 1;
            }
        }
    }
    let mut all = Vec::new();
    go(&mut lens.to_vec(), &mut Vec::new(), &mut all);
    all
}

type State = (Vec<Vec<Out>>, u64, Quota);

/// Replays `order` serially; returns each thread's answers and the state.
/// `CancelLast` needs the reservation a thread made earlier, so the replay
/// keeps one per thread. Cancels whose index is in `refuse` are answered
/// `false` without touching the bucket (see `allowed`).
fn replay(
    q: Quota,
    setup: &[Op],
    programs: &[Vec<Op>],
    order: &[usize],
    refuse: &[(usize, usize)],
) -> State {
    let b = new_bucket(q, setup);
    let mut pcs = vec![0; programs.len()];
    let mut outs = vec![Vec::new(); programs.len()];
    let mut held: Vec<Option<Reservation<'_>>> = programs.iter().map(|_| None).collect();
    for &t in order {
        let pc = pcs[t];
        let op = programs[t][pc];
        pcs[t] += 1;
        let out = match op {
            Op::Reserve(n, w) => Out::Reserve(match b.reserve(n, Duration::from_nanos(w)) {
                Ok(r) => {
                    let got = (r.ready_at(), r.wait().as_nanos() as u64);
                    held[t] = Some(r);
                    Ok(got)
                }
                Err(e) => Err(e),
            }),
            Op::CancelLast if refuse.contains(&(t, pc)) => {
                held[t] = None;
                Out::Cancel(false)
            }
            Op::CancelLast => Out::Cancel(held[t].take().is_some_and(Reservation::cancel)),
            other => run(&b, &[other]).pop().unwrap(),
        };
        outs[t].push(out);
    }
    drop(held);
    (outs, b.raw().tat(), b.quota())
}

/// The outcomes a correct bucket may produce: every serial order, plus,
/// when another thread resets the bucket, the same orders with a cancel
/// refused (a reservation racing a reset may keep a stale epoch; see
/// `gcra.rs`). Computed once, in a single-threaded model of its own, so
/// the replays do not count against the concurrent model's branches.
fn allowed(q: Quota, setup: &'static [Op], programs: &[Vec<Op>]) -> Vec<State> {
    let mut refusals = vec![vec![]];
    for (t, p) in programs.iter().enumerate() {
        let others_reset = programs
            .iter()
            .enumerate()
            .any(|(u, p)| u != t && p.iter().any(|op| matches!(op, Op::Reset | Op::Give(_))));
        for (pc, op) in p.iter().enumerate() {
            if others_reset && matches!(op, Op::CancelLast) {
                refusals.push(vec![(t, pc)]);
            }
        }
    }
    let lens: Vec<usize> = programs.iter().map(Vec::len).collect();
    let programs = programs.to_vec();
    let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = out.clone();
    loom::model(move || {
        let mut all = Vec::new();
        for order in merges(&lens) {
            for refuse in &refusals {
                all.push(replay(q, setup, &programs, &order, refuse));
            }
        }
        *sink.lock().unwrap() = all;
    });

    out.lock().unwrap().clone()
}

/// Runs `programs` concurrently (the last on the model's main thread) and
/// asserts the outcome is one a serial execution allows.
fn check(q: Quota, setup: &'static [Op], programs: Vec<Vec<Op>>) {
    let allowed = std::sync::Arc::new(allowed(q, setup, &programs));
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    // The admin lock and the seqlock spin (yielding) while a writer holds
    // them; give loom room for those branches.
    builder.max_branches = 20_000;
    let programs = std::sync::Arc::new(programs);
    builder.check(move || {
        let bucket = Arc::new(new_bucket(q, setup));
        let (last, rest) = programs.split_last().unwrap();
        let handles: Vec<_> = rest
            .iter()
            .cloned()
            .map(|p| {
                let bucket = bucket.clone();
                loom::thread::spawn(move || run(&bucket, &p))
            })
            .collect();
        let mine = run(&bucket, last);
        let mut outs: Vec<Vec<Out>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        outs.push(mine);
        let state = (outs, bucket.raw().tat(), bucket.quota());
        spec(q, setup, &programs, &state);
        assert!(
            allowed.contains(&state),
            "not linearizable: got {state:?}\nallowed: {allowed:#?}"
        );
    });
}

/// The GCRA contract checked directly, for models of admissions,
/// reservations and cancels only (fixed quota, no reset, no penalty): the
/// cells kept never exceed `burst + (latest ready time - now) / period`, and
/// the state is exactly those cells, so a cancel that said "refunded" did
/// give its cells back and one that said "refused" left them.
fn spec(q: Quota, setup: &[Op], programs: &[Vec<Op>], (outs, tat, _): &State) {
    let plain = |op: &Op| matches!(op, Op::Try(_) | Op::Reserve(..) | Op::CancelLast);
    if !programs.iter().flatten().chain(setup).all(plain) {
        return;
    }
    let mut kept = setup
        .iter()
        .map(|op| match op {
            Op::Try(n) => *n as u64,
            _ => 0,
        })
        .sum::<u64>();
    let mut latest = START;
    for (p, o) in programs.iter().zip(outs) {
        let mut last = 0;
        for (op, out) in p.iter().zip(o) {
            match (op, out) {
                (Op::Try(n), Out::Try(Ok(()))) => kept += *n as u64,
                (Op::Reserve(n, _), Out::Reserve(Ok((ready, _)))) => {
                    kept += *n as u64;
                    last = *n as u64;
                    latest = latest.max(*ready);
                }
                (Op::CancelLast, Out::Cancel(true)) => kept -= last,
                _ => {}
            }
        }
    }
    let period = q.period().as_nanos() as u64;
    let bound = q.burst().get() as u64 + (latest - START) / period;
    assert!(kept <= bound, "{kept} cells kept, GCRA allows {bound}");
    if kept == 0 {
        assert!(*tat <= START, "nothing kept but tat {tat}");
    } else {
        assert_eq!(
            *tat,
            START + kept * period,
            "state does not match the cells kept"
        );
    }
}

const BIG: u64 = 10 * PERIOD;

#[test]
fn concurrent_admissions_never_exceed_the_burst() {
    check(
        quota(PERIOD, 2),
        &[],
        vec![vec![Op::Try(2)], vec![Op::Try(1)], vec![Op::Reserve(1, 0)]],
    );
}

#[test]
fn cancel_racing_a_reservation_and_an_admission() {
    // Drained: every cell is a reservation in the future.
    check(
        quota(PERIOD, 2),
        &[Op::Try(2)],
        vec![
            vec![Op::Reserve(1, BIG), Op::CancelLast],
            vec![Op::Reserve(1, BIG)],
            vec![Op::Try(1)],
        ],
    );
}

#[test]
fn cancel_racing_a_penalty() {
    check(
        quota(PERIOD, 2),
        &[],
        vec![
            vec![Op::Reserve(2, BIG), Op::CancelLast],
            vec![Op::Penalize(3 * PERIOD)],
        ],
    );
}

#[test]
fn cancel_racing_a_reset_and_a_refill() {
    // After the reset, `Try(2)` writes exactly the TAT the reservation
    // wrote: the stale cancel must not succeed.
    check(
        quota(PERIOD, 2),
        &[],
        vec![
            vec![Op::Reserve(2, BIG), Op::CancelLast],
            vec![Op::Reset, Op::Try(2)],
        ],
    );
    // The reset lands between the reservation's read and its CAS, and
    // `Try(2)` before it restores the value the reservation read.
    check(
        quota(PERIOD, 2),
        &[],
        vec![
            vec![Op::Reserve(2, BIG), Op::CancelLast],
            vec![Op::Try(2), Op::Reset],
        ],
    );
}

#[test]
fn quota_change_racing_an_admission() {
    // The admission sees the old quota (burst 2: fits) or the new one
    // (burst 1, slower: does not), never a mix, and its debt is converted.
    check(
        quota(PERIOD, 2),
        &[Op::Try(1)],
        vec![vec![Op::SetQuota(quota(3 * PERIOD, 1))], vec![Op::Try(1)]],
    );
}

#[test]
fn quota_change_racing_a_reservation_and_its_cancel() {
    check(
        quota(PERIOD, 2),
        &[Op::Try(2)],
        vec![
            vec![Op::SetQuota(quota(PERIOD / 2, 4))],
            vec![Op::Reserve(1, BIG), Op::CancelLast],
        ],
    );
}

#[test]
fn quota_change_racing_a_penalty() {
    check(
        quota(PERIOD, 3),
        &[Op::Try(1)],
        vec![
            vec![Op::SetQuota(quota(PERIOD / 2, 1))],
            vec![Op::Penalize(2 * PERIOD), Op::Try(1)],
        ],
    );
}

/// Issue #21, item 7: a quota change converts queued cells as cells and a
/// running hold as time, so it must see the hold of any penalty whose
/// `tat` it converts (the penalty records its end before raising `tat`,
/// and the change reads it after the `tat`). Three cells queued past a
/// burst of 1, a penalty of 5 periods racing a halved rate: 5 periods
/// (penalty first) or 6 (the change first), never the 10 a hold missed
/// would give.
#[test]
fn quota_change_racing_a_penalty_past_a_queue() {
    check(
        quota(PERIOD, 1),
        &[
            Op::Reserve(1, BIG),
            Op::Reserve(1, BIG),
            Op::Reserve(1, BIG),
        ],
        vec![
            vec![Op::SetQuota(quota(2 * PERIOD, 1))],
            vec![Op::Penalize(5 * PERIOD)],
        ],
    );
}

#[test]
fn quota_change_lowering_tat_racing_admissions() {
    // A faster rate halves the debt: `tat` goes from START + 100 down to
    // START + 50, and one admission under the new quota brings it back to
    // START + 100. A `Try` that read START + 100 under the old quota
    // (where it fits) must not land on the restored value and admit a
    // second cell: the CAS is on the stamp, which a quota change moves up
    // by one, never down.
    check(
        quota(PERIOD, 2),
        &[Op::Try(1)],
        vec![
            vec![Op::SetQuota(quota(PERIOD / 2, 2))],
            vec![Op::Try(1)],
            vec![Op::Try(1)],
        ],
    );
}

/// `Gcra::charge` (a usage settled above its estimate) racing a
/// reservation: both land, whatever the order; neither's cells are lost.
#[test]
fn a_charge_racing_a_reservation_loses_neither() {
    loom::model(|| {
        let g = Arc::new(crate::bucket::gcra::Gcra::new(quota(10, 2)));
        let g2 = g.clone();
        let t = loom::thread::spawn(move || g2.charge(3, 0));
        let reserved = g.reserve(1, u64::MAX, 0);
        t.join().unwrap();
        assert!(reserved.is_ok());
        // 3 + 1 cells of 10 ns from 0: nothing lost to a race.
        assert_eq!(g.tat(), 40);
    });
}

/// `Gcra::give` (cells given back without stamps) racing a reservation
/// and an admission: linearizable, so it never gives back past full and
/// never loses a decision landing during it (its `stamp + 1` makes a
/// decision in flight retry).
#[test]
fn a_give_racing_a_reservation_and_an_admission() {
    check(
        quota(PERIOD, 3),
        &[Op::Try(2)],
        vec![vec![Op::Give(1)], vec![Op::Reserve(1, BIG), Op::Try(1)]],
    );
}

/// `Gcra::give` racing a cancel, both under the admin lock: the cancel
/// lands before the give or is refused after it (the give voids the
/// stamps), never both a refund and a give of the same cells past full.
#[test]
fn a_give_racing_a_cancel() {
    loom::model(|| {
        let g = Arc::new(crate::bucket::gcra::Gcra::new(quota(PERIOD, 3)));
        g.charge(1, START);
        let r = g.reserve(1, u64::MAX, START).unwrap();
        let g2 = g.clone();
        let t = loom::thread::spawn(move || g2.give(1, START));
        let cancelled = g.cancel(r.ticket.unwrap());
        let gave = t.join().unwrap();
        assert_eq!(gave, 1);
        // Cancel then give: both cells back. Give then cancel: refused.
        let expected = if cancelled { START } else { START + PERIOD };
        assert_eq!(g.tat(), expected, "cancelled: {cancelled}");
    });
}

/// `Gcra::give` racing a penalty: the hold is never given back into. (A
/// give that reads the hold's end before the penalty raised `tat` gives
/// nothing: not linearizable, but it errs towards admitting less.)
#[test]
fn a_give_racing_a_penalty_keeps_the_hold() {
    loom::model(|| {
        let g = Arc::new(crate::bucket::gcra::Gcra::new(quota(PERIOD, 2)));
        g.charge(2, START);
        let g2 = g.clone();
        let t = loom::thread::spawn(move || g2.give(2, START));
        g.penalize(5 * PERIOD, START);
        let gave = t.join().unwrap();
        // The hold's `tat`: one cell fits at START + 500.
        assert_eq!(g.tat(), START + 5 * PERIOD + PERIOD, "gave {gave}");
    });
}
