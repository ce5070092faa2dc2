//! Unit tests of `breaker.rs`.

use super::*;

const MS: u64 = 1_000_000;

fn cfg(n: u32) -> CircuitBreaker {
    CircuitBreaker::new()
        .consecutive_failures(n)
        .cool_down(Duration::from_millis(1))
}

#[test]
fn opens_after_the_failures_in_a_row_and_an_answer_resets_the_run() {
    let c = Circuit::default();
    let cfg = cfg(3);
    c.record(&cfg, Outcome::Failed, 0, true);
    c.record(&cfg, Outcome::Failed, 0, true);
    c.record(&cfg, Outcome::Answered, 0, true);
    c.record(&cfg, Outcome::Failed, 0, true);
    c.record(&cfg, Outcome::Failed, 0, true);
    assert_eq!(c.admit(10, MS), Admit::Closed, "an answer broke the run");
    // 429s are no verdict either way.
    c.record(&cfg, Outcome::Capacity, 0, true);
    c.record(&cfg, Outcome::Failed, 10, true);
    assert_eq!(
        c.admit(11, MS),
        Admit::Refused {
            until: MS + 10,
            trial: false
        }
    );
}

#[test]
fn one_trial_after_the_cool_down_and_its_failure_reopens() {
    let c = Circuit::default();
    let cfg = cfg(1);
    c.record(&cfg, Outcome::Failed, 0, true);
    // Open: answers count for nothing until the cool-down is over.
    c.record(&cfg, Outcome::Answered, 1, true);
    assert!(matches!(
        c.admit(MS - 1, MS),
        Admit::Refused {
            until: MS,
            trial: false
        }
    ));
    assert_eq!(c.admit(MS, 5 * MS), Admit::Trial(6 * MS));
    assert_eq!(
        c.admit(MS + 1, 5 * MS),
        Admit::Refused {
            until: 6 * MS,
            trial: true
        }
    );
    c.record(&cfg, Outcome::Failed, 2 * MS, true);
    assert_eq!(
        c.admit(3 * MS - 1, MS),
        Admit::Refused {
            until: 3 * MS,
            trial: false
        }
    );
    assert!(matches!(c.admit(3 * MS, MS), Admit::Trial(_)));
    c.record(&cfg, Outcome::Capacity, 3 * MS + 1, true);
    assert_eq!(
        c.admit(3 * MS + 1, MS),
        Admit::Closed,
        "a 429 proves the server up"
    );
}

#[test]
fn a_trial_given_back_or_lapsed_makes_the_next_call_the_trial() {
    let c = Circuit::default();
    let cfg = cfg(1);
    c.record(&cfg, Outcome::Failed, 0, true);
    let Admit::Trial(lapse) = c.admit(2 * MS, MS) else {
        panic!("due")
    };
    c.release(lapse);
    let Admit::Trial(second) = c.admit(2 * MS + 1, MS) else {
        panic!("given back: due at once")
    };
    // A stale release (the first trial's) does not free the second.
    c.release(lapse);
    assert!(matches!(
        c.admit(2 * MS + 2, MS),
        Admit::Refused { trial: true, .. }
    ));
    // Never answered: it lapses, and the next call is the trial.
    assert!(matches!(c.admit(second, MS), Admit::Trial(_)));
    // Answered: a release after it changes nothing.
    c.record(&cfg, Outcome::Answered, second, true);
    c.release(second + MS);
    assert_eq!(c.admit(second, MS), Admit::Closed);
}

#[test]
fn a_pass_gives_its_trial_back_unless_kept() {
    let c = Arc::new(Circuit::default());
    c.record(&cfg(1), Outcome::Failed, 0, true);
    let Admit::Trial(lapse) = c.admit(MS, MS) else {
        panic!("due")
    };
    drop(Pass {
        circuit: c.clone(),
        trial: lapse,
    });
    let Admit::Trial(lapse) = c.admit(MS, MS) else {
        panic!("given back")
    };
    Pass {
        circuit: c.clone(),
        trial: lapse,
    }
    .keep();
    assert!(matches!(
        c.admit(MS, MS),
        Admit::Refused { trial: true, .. }
    ));
}

#[test]
fn the_ratio_opens_on_a_window_that_failed_enough() {
    let c = Circuit::default();
    let cfg = cfg(100).failure_ratio(0.5, 4);
    // 1 of 4: closed, and the window starts afresh.
    for o in [
        Outcome::Failed,
        Outcome::Answered,
        Outcome::Answered,
        Outcome::Answered,
    ] {
        c.record(&cfg, o, 0, true);
    }
    assert_eq!(c.admit(0, MS), Admit::Closed);
    // 2 of 4 (never 2 in a row): open.
    for o in [
        Outcome::Failed,
        Outcome::Answered,
        Outcome::Failed,
        Outcome::Answered,
    ] {
        assert_eq!(c.admit(0, MS), Admit::Closed);
        c.record(&cfg, o, 5, true);
    }
    assert!(matches!(c.admit(5, MS), Admit::Refused { until, .. } if until == MS + 5));
}

#[test]
fn bad_settings_are_clamped() {
    let b = CircuitBreaker::new()
        .consecutive_failures(0)
        .failure_ratio(f64::NAN, 0)
        .cool_down(Duration::ZERO);
    assert_eq!(b.consecutive, 1);
    assert_eq!(b.ratio, None);
    assert_eq!(b.cool_down, Duration::from_millis(1));
    assert_eq!(CircuitBreaker::new().failure_ratio(1.5, 10).ratio, None);
    assert_eq!(CircuitBreaker::new().failure_ratio(-0.5, 10).ratio, None);
    // 0 would open on every window: off, like any ratio outside (0, 1].
    assert_eq!(CircuitBreaker::new().failure_ratio(0.0, 10).ratio, None);
    assert_eq!(
        CircuitBreaker::new().failure_ratio(1.0, 10).ratio,
        Some((1.0, 10))
    );
    let b = CircuitBreaker::new()
        .consecutive_failures(u32::MAX)
        .failure_ratio(1.0, u32::MAX)
        .cool_down(Duration::MAX);
    assert_eq!(b.consecutive, CircuitBreaker::MAX_COUNT);
    assert_eq!(b.ratio, Some((1.0, CircuitBreaker::MAX_COUNT)));
    // Instants saturate instead of wrapping into the tag.
    let c = Circuit::default();
    c.record(&b.consecutive_failures(1), Outcome::Failed, u64::MAX, true);
    assert!(matches!(c.admit(u64::MAX, u64::MAX), Admit::Trial(VALUE)));
}

#[test]
fn the_map_stays_bounded_and_keeps_what_it_must() {
    let b = Breakers::new(cfg(1));
    let tool: Arc<str> = Arc::from("t");
    let held = b.circuit(&tool, "held");
    let open = b.circuit(&tool, "open");
    open.record(&b.config, Outcome::Failed, 0, true);
    drop(open);
    for i in 0..MAX_CIRCUITS + 10 {
        drop(b.circuit(&tool, &i.to_string()));
    }
    assert!(b.len() <= MAX_CIRCUITS);
    assert!(Arc::ptr_eq(&held, &b.circuit(&tool, "held")));
    assert!(matches!(
        b.circuit(&tool, "open").admit(1, MS),
        Admit::Refused { .. }
    ));
}

/// While a trial is out, only the trial's own answer decides.
#[test]
fn a_stale_answer_does_not_decide_the_half_open_state() {
    let c = Circuit::default();
    let cfg = cfg(1);
    c.record(&cfg, Outcome::Failed, 0, false);
    assert_eq!(c.admit(MS, MS), Admit::Trial(2 * MS));
    // A stale success: the trial is still out.
    c.record(&cfg, Outcome::Answered, MS + 1, false);
    assert!(matches!(
        c.admit(MS + 2, MS),
        Admit::Refused { trial: true, .. }
    ));
    // A stale failure: no fresh cool-down either.
    c.record(&cfg, Outcome::Failed, MS + 3, false);
    assert!(matches!(
        c.admit(MS + 4, MS),
        Admit::Refused { trial: true, .. }
    ));
    // The trial's own answer closes it.
    c.record(&cfg, Outcome::Answered, MS + 5, true);
    assert_eq!(c.admit(MS + 6, MS), Admit::Closed);
}

/// A full map of failed-once circuits sweeps, and new pairs still get registered circuits.
#[test]
fn no_breaker_past_16384_failing_pairs_is_fixed_a_new_pair_still_opens() {
    let b = Breakers::new(cfg(2));
    let tool: Arc<str> = Arc::from("t");
    for i in 0..MAX_CIRCUITS {
        // One failure each: closed, but not clean.
        b.circuit(&tool, &i.to_string())
            .record(&b.config, Outcome::Failed, 0, false);
    }
    for _ in 0..2 {
        b.circuit(&tool, "new")
            .record(&b.config, Outcome::Failed, 0, false);
    }
    assert!(matches!(
        b.circuit(&tool, "new").admit(1, MS),
        Admit::Refused { .. }
    ));
    // The sweep freed room in one go: the map is well below its bound.
    assert!(b.len() <= MAX_CIRCUITS / 4 * 3 + 1, "{}", b.len());
}

/// At the largest settings the counts still fit their fields without spilling into the tag.
#[test]
fn the_largest_counts_open_the_circuit_before_they_spill_into_the_tag() {
    let cfg = CircuitBreaker::new()
        .consecutive_failures(u32::MAX)
        .failure_ratio(1.0, u32::MAX)
        .cool_down(Duration::from_millis(1));
    let c = Circuit::default();
    for _ in 1..CircuitBreaker::MAX_COUNT {
        c.record(&cfg, Outcome::Failed, 7, false);
    }
    assert_eq!(c.admit(7, MS), Admit::Closed);
    assert_eq!(c.word.load(Ordering::Relaxed) & TAG, CLOSED);
    c.record(&cfg, Outcome::Failed, 7, false);
    assert_eq!(
        c.admit(8, MS),
        Admit::Refused {
            until: MS + 7,
            trial: false
        }
    );
}

/// Each answer is classified as the breaker counts it (408 answered, 429 capacity).
#[test]
fn each_answer_is_classified_as_the_docs_say() {
    use crate::headers::ServerHint;
    let none = ServerHint::default();
    let told = ServerHint {
        retry_after: Some(Duration::from_secs(1)),
        ..ServerHint::default()
    };
    for (status, hint, want) in [
        (Some(200), &none, Outcome::Answered),
        (Some(404), &none, Outcome::Answered),
        (Some(408), &none, Outcome::Answered),
        (Some(429), &none, Outcome::Capacity),
        (Some(503), &told, Outcome::Capacity),
        (Some(503), &none, Outcome::Failed),
        (Some(500), &none, Outcome::Failed),
        (None, &none, Outcome::Failed),
    ] {
        assert_eq!(
            outcome(crate::retry::reply_class(status, hint), status),
            want,
            "{status:?} {hint:?}"
        );
    }
    // A 429 between failures neither trips nor resets the run.
    let c = Circuit::default();
    let cfg = cfg(2);
    c.record(&cfg, Outcome::Failed, 0, false);
    c.record(
        &cfg,
        outcome(crate::retry::reply_class(Some(429), &none), Some(429)),
        0,
        false,
    );
    assert_eq!(c.admit(0, MS), Admit::Closed);
    c.record(&cfg, Outcome::Failed, 0, false);
    assert!(matches!(c.admit(0, MS), Admit::Refused { .. }));
}

/// A full map forgets unheld closed circuits first, keeping every open one.
#[test]
fn a_full_map_forgets_closed_circuits_before_any_open_one() {
    let b = Breakers::new(cfg(1));
    let tool: Arc<str> = Arc::from("t");
    let open: Vec<String> = (0..200).map(|i| format!("open-{i}")).collect();
    for key in &open {
        b.circuit(&tool, key)
            .record(&b.config, Outcome::Failed, 0, false);
    }
    for i in 0..MAX_CIRCUITS {
        drop(b.circuit(&tool, &i.to_string()));
    }
    assert!(b.len() <= MAX_CIRCUITS);
    for key in &open {
        assert!(
            matches!(b.circuit(&tool, key).admit(1, MS), Admit::Refused { .. }),
            "{key} was forgotten while closed circuits were left to forget"
        );
    }
}

/// With every circuit open, a sweep forgets unheld ones down to three quarters, no further.
#[test]
fn a_map_full_of_open_circuits_forgets_unheld_ones_down_to_three_quarters() {
    let b = Breakers::new(cfg(1));
    let tool: Arc<str> = Arc::from("t");
    let held = b.circuit(&tool, "held");
    held.record(&b.config, Outcome::Failed, 0, false);
    for i in 1..MAX_CIRCUITS {
        b.circuit(&tool, &i.to_string())
            .record(&b.config, Outcome::Failed, 0, false);
    }
    assert_eq!(b.len(), MAX_CIRCUITS);
    let _new = b.circuit(&tool, "new");
    assert_eq!(b.len(), MAX_CIRCUITS / 4 * 3 + 1);
    assert!(Arc::ptr_eq(&held, &b.circuit(&tool, "held")));
    assert!(matches!(held.admit(1, MS), Admit::Refused { .. }));
}

/// Below the bound nothing is forgotten.
#[test]
fn below_the_bound_a_closed_circuit_keeps_its_run_of_failures() {
    let b = Breakers::new(cfg(2));
    let tool: Arc<str> = Arc::from("t");
    b.circuit(&tool, "a")
        .record(&b.config, Outcome::Failed, 0, false);
    drop(b.circuit(&tool, "b"));
    assert_eq!(b.len(), 2);
    b.circuit(&tool, "a")
        .record(&b.config, Outcome::Failed, 0, false);
    assert!(matches!(
        b.circuit(&tool, "a").admit(1, MS),
        Admit::Refused { .. }
    ));
}

/// Sweeps stay amortised: at most 10 entries visited per new pair.
#[test]
fn a_breaker_past_its_circuit_cap_does_not_scan_for_every_new_pair() {
    let b = Breakers::new(cfg(2));
    // Enough pairs that a late sweep would let the map pass its bound.
    let pairs = 40_000;
    for i in 0..pairs {
        // A tool each, failing twice: open, so the first sweep frees nothing.
        let tool: Arc<str> = Arc::from(format!("t{i}"));
        for _ in 0..2 {
            b.circuit(&tool, "k")
                .record(&b.config, Outcome::Failed, 0, false);
        }
    }
    assert!(b.len() <= MAX_CIRCUITS, "{}", b.len());
    // The first sweep found the map full of open circuits: two visits.
    assert!(b.visited() >= 2 * MAX_CIRCUITS, "visited {}", b.visited());
    assert!(
        b.visited() <= 10 * pairs,
        "visited {} for {pairs} pairs",
        b.visited()
    );

    // Held circuits cannot be forgotten; sweeps still come a quarter apart.
    let b = Breakers::new(cfg(2));
    let tool: Arc<str> = Arc::from("t");
    let held: Vec<_> = (0..MAX_CIRCUITS)
        .map(|i| b.circuit(&tool, &i.to_string()))
        .collect();
    for i in 0..pairs {
        drop(b.circuit(&tool, &format!("new{i}")));
    }
    assert!(
        b.visited() <= 10 * pairs,
        "visited {} for {pairs} pairs",
        b.visited()
    );
    assert_eq!(held.len(), MAX_CIRCUITS);
}
