//! Loom model of `RetryBudget`'s account: one word, changed by a
//! compare-and-swap loop. Two callers racing for the last retry must not
//! both get it, and a deposit racing a withdrawal must not be lost (a
//! lost update would either mint retries or swallow a call's deposit).

use std::time::Duration;

use crate::clock::ManualClock;
use crate::retry::RetryBudget;
use crate::sync::Arc;

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b
}

/// A budget of one retry per first attempt (no floor, no decay within
/// the model), with one first attempt paid in.
fn one_retry() -> Arc<RetryBudget<ManualClock>> {
    let budget = Arc::new(RetryBudget::with_clock(
        1.0,
        0,
        Duration::from_secs(10),
        ManualClock::new(),
    ));
    budget.deposit();
    budget
}

#[test]
fn two_callers_race_for_the_last_retry() {
    builder().check(|| {
        let budget = one_retry();
        let other = budget.clone();
        let racer = loom::thread::spawn(move || other.try_withdraw());
        let mine = budget.try_withdraw();
        let theirs = racer.join().unwrap();
        assert!(
            mine != theirs,
            "one retry, taken {}",
            u8::from(mine) + u8::from(theirs)
        );
    });
}

#[test]
fn a_deposit_racing_a_withdrawal_is_kept() {
    builder().check(|| {
        let budget = one_retry();
        let other = budget.clone();
        let depositor = loom::thread::spawn(move || other.deposit());
        assert!(budget.try_withdraw(), "the first deposit pays for one");
        depositor.join().unwrap();
        // The second deposit is still there, whatever the order.
        assert!(budget.try_withdraw());
        assert!(!budget.try_withdraw());
    });
}
