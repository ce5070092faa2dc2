//! Loom model of a circuit's word (`admission/breaker.rs`): one atomic,
//! changed by compare-and-swap. Two calls racing for the trial of a due
//! circuit must not both get it (the server would see two trials), two
//! failures racing in a closed circuit must both count (a lost update
//! would keep it closed past its threshold), a trial given back must
//! leave the circuit due, never stuck with no trial out, and an answer
//! racing a new call must close it.

use std::time::Duration;

use crate::admission::breaker::{Admit, Circuit, Outcome};
use crate::admission::CircuitBreaker;
use crate::sync::Arc;

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b
}

fn cfg(failures: u32) -> CircuitBreaker {
    CircuitBreaker::new()
        .consecutive_failures(failures)
        .cool_down(Duration::from_millis(1))
}

/// Open, and due at instant `DUE`.
fn due() -> Arc<Circuit> {
    let c = Arc::new(Circuit::default());
    c.record(&cfg(1), Outcome::Failed, 0, false);
    c
}

const DUE: u64 = 1_000_000;
/// How long a trial is out.
const OUT: u64 = 1_000_000;

#[test]
fn two_calls_race_for_the_trial_of_a_due_circuit() {
    builder().check(|| {
        let c = due();
        let other = c.clone();
        let racer = loom::thread::spawn(move || other.admit(DUE, OUT));
        let mine = c.admit(DUE, OUT);
        let theirs = racer.join().unwrap();
        let trials = [&mine, &theirs]
            .iter()
            .filter(|a| matches!(a, Admit::Trial(_)))
            .count();
        assert_eq!(trials, 1, "{mine:?} {theirs:?}");
    });
}

#[test]
fn two_failures_racing_in_a_closed_circuit_both_count() {
    builder().check(|| {
        let c = Arc::new(Circuit::default());
        let other = c.clone();
        let failer = loom::thread::spawn(move || other.record(&cfg(2), Outcome::Failed, 0, false));
        c.record(&cfg(2), Outcome::Failed, 0, false);
        failer.join().unwrap();
        assert!(
            matches!(c.admit(0, OUT), Admit::Refused { trial: false, .. }),
            "two failures of two: open"
        );
    });
}

#[test]
fn a_trial_given_back_racing_a_call_leaves_the_circuit_due() {
    builder().check(|| {
        let c = due();
        let Admit::Trial(lapse) = c.admit(DUE, OUT) else {
            panic!("due")
        };
        let other = c.clone();
        let caller = loom::thread::spawn(move || other.admit(DUE, OUT));
        c.release(lapse);
        match caller.join().unwrap() {
            // Before the release: refused, and the next call is the trial.
            Admit::Refused { trial: true, .. } => {
                assert!(matches!(c.admit(DUE, OUT), Admit::Trial(_)))
            }
            // After it: that call is the trial, and the only one.
            Admit::Trial(_) => {
                assert!(matches!(
                    c.admit(DUE, OUT),
                    Admit::Refused { trial: true, .. }
                ))
            }
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn a_trial_answer_racing_a_call_closes_the_circuit() {
    builder().check(|| {
        let c = due();
        let Admit::Trial(_) = c.admit(DUE, OUT) else {
            panic!("due")
        };
        let other = c.clone();
        let trial =
            loom::thread::spawn(move || other.record(&cfg(1), Outcome::Answered, DUE, true));
        let during = c.admit(DUE, OUT);
        trial.join().unwrap();
        assert!(
            matches!(during, Admit::Closed | Admit::Refused { trial: true, .. }),
            "{during:?}"
        );
        assert_eq!(c.admit(DUE, OUT), Admit::Closed);
    });
}

/// Issue #40 item 4: a stale failure (a call admitted before the circuit
/// opened) racing the trial's own success: whatever the order, the trial
/// decides, and the circuit ends closed (two failures in a row open it,
/// so a stale one landing after the close only counts one).
#[test]
fn a_stale_failure_racing_the_trials_answer_leaves_the_trial_to_decide() {
    builder().check(|| {
        let c = due();
        let Admit::Trial(_) = c.admit(DUE, OUT) else {
            panic!("due")
        };
        let other = c.clone();
        let stale = loom::thread::spawn(move || other.record(&cfg(2), Outcome::Failed, DUE, false));
        c.record(&cfg(2), Outcome::Answered, DUE, true);
        stale.join().unwrap();
        assert_eq!(c.admit(DUE, OUT), Admit::Closed);
    });
}
