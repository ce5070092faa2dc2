//! Jitter bounds and means with fixed seeds, a wave of simultaneous
//! retries, deadline refusal and the retry policy's decisions. Time is a
//! `ManualClock`; nothing here sleeps.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use backpressure::headers::ServerHint;
use backpressure::retry::{Backoff, Deadline, Decision, Jitter, RetryPolicy};
use backpressure::Status;
use backpressure::{Clock, ManualClock};

const MS: Duration = Duration::from_millis(1);
const DRAWS: u32 = 10_000;

fn backoff(jitter: Jitter, seed: u64) -> Backoff {
    Backoff::new(100 * MS, 10_000 * MS)
        .jitter(jitter)
        .seed(seed)
}

fn hint(headers: &[(&str, &str)]) -> ServerHint {
    ServerHint::from_headers(headers.iter().copied(), SystemTime::UNIX_EPOCH)
}

#[test]
fn every_delay_within_its_bounds() {
    for seed in 0..4 {
        for attempt in 0..40 {
            let v = backoff(Jitter::None, seed).ceiling(attempt);
            assert_eq!(
                v,
                (100 * MS * 2u32.saturating_pow(attempt)).min(10_000 * MS)
            );
            assert_eq!(backoff(Jitter::None, seed).delay(attempt), v);
            let mut full = backoff(Jitter::Full, seed);
            let mut equal = backoff(Jitter::Equal, seed);
            for _ in 0..50 {
                assert!(full.delay(attempt) <= v);
                let e = equal.delay(attempt);
                assert!(e >= v / 2 && e <= v, "{e:?} outside [{:?}, {v:?}]", v / 2);
            }
        }
        let mut dec = backoff(Jitter::Decorrelated, seed);
        let mut previous = 100 * MS;
        for attempt in 0..200 {
            let d = dec.delay(attempt);
            let hi = (previous * 3).min(10_000 * MS);
            assert!(d >= 100 * MS && d <= hi, "{d:?} outside [100ms, {hi:?}]");
            previous = d;
        }
    }
}

/// Mean of `DRAWS` delays at one attempt.
fn mean(b: &mut Backoff, attempt: u32) -> f64 {
    let total: Duration = (0..DRAWS).map(|_| b.delay(attempt)).sum();
    total.as_secs_f64() / f64::from(DRAWS)
}

#[test]
fn mean_of_ten_thousand_draws_is_within_two_percent() {
    // attempt 3: v = 800 ms.
    let full = mean(&mut backoff(Jitter::Full, 11), 3);
    assert!((full / 0.400 - 1.0).abs() < 0.02, "full jitter mean {full}");
    let equal = mean(&mut backoff(Jitter::Equal, 12), 3);
    assert!(
        (equal / 0.600 - 1.0).abs() < 0.02,
        "equal jitter mean {equal}"
    );
    // Capped: v = 10 s from attempt 7 on.
    let capped = mean(&mut backoff(Jitter::Full, 13), 1_000);
    assert!((capped / 5.0 - 1.0).abs() < 0.02, "capped mean {capped}");
}

#[test]
fn decorrelated_spreads_and_grows() {
    let mut b = backoff(Jitter::Decorrelated, 5);
    let mut seen = HashSet::new();
    let mut late = Duration::ZERO;
    for attempt in 0..DRAWS {
        let d = b.delay(attempt % 20);
        seen.insert(d);
        if attempt % 20 >= 10 {
            late += d;
        }
    }
    assert!(seen.len() > 9_000, "only {} distinct delays", seen.len());
    // Chains of 10+ steps sit well above the base (the walk drifts up
    // towards the cap), unlike a constant delay.
    let late_mean = late / (DRAWS / 2);
    assert!(late_mean > 1_000 * MS, "late mean {late_mean:?}");
}

#[test]
fn same_seed_same_delays() {
    let mut a = backoff(Jitter::Full, 99);
    let mut b = backoff(Jitter::Full, 99);
    for attempt in 0..100 {
        assert_eq!(a.delay(attempt), b.delay(attempt));
    }
}

#[test]
fn a_wave_of_100_retries_never_lands_on_one_instant() {
    let clock = ManualClock::starting_at(1_000);
    let template = RetryPolicy::new(backoff(Jitter::Full, 2024));
    let mut backoff_instants = HashSet::new();
    let mut server_instants = HashSet::new();
    let told = hint(&[("retry-after", "2")]);
    for _ in 0..100 {
        // Every call failed at the same instant.
        let mut policy = template.fork();
        let mut deadline = Deadline::after(clock.clone(), Duration::from_secs(60));
        let Decision::Retry { after } = policy.decide(&ServerHint::default(), &mut deadline) else {
            panic!("a 100 ms backoff fits in 60 s")
        };
        assert!(after <= 100 * MS);
        backoff_instants.insert(clock.now_nanos() + after.as_nanos() as u64);

        // All told the same Retry-After: none earlier than asked, none
        // together.
        let mut policy = template.fork();
        let mut deadline = Deadline::after(clock.clone(), Duration::from_secs(60));
        let Decision::Retry { after } = policy.decide(&told, &mut deadline) else {
            panic!("2 s fits in 60 s")
        };
        assert!(after >= 2_000 * MS && after <= 2_100 * MS, "{after:?}");
        server_instants.insert(clock.now_nanos() + after.as_nanos() as u64);
    }
    assert_eq!(backoff_instants.len(), 100);
    assert_eq!(server_instants.len(), 100);
}

#[test]
fn a_retry_past_the_deadline_is_refused_not_slept() {
    let clock = ManualClock::new();
    let mut deadline = Deadline::after(clock.clone(), 1_400 * MS);
    let mut policy = RetryPolicy::new(backoff(Jitter::None, 0)).max_retries(10);
    let none = ServerHint::default();
    let mut slept = Vec::new();
    let surfaced = loop {
        match policy.decide(&none, &mut deadline) {
            Decision::Retry { after } => {
                slept.push(after);
                clock.advance(after);
            }
            Decision::NotRetried(s) => break s,
            other => panic!("{other:?}"),
        }
    };
    // 100 + 200 + 400 = 700 ms slept; 800 ms does not fit the 700 left.
    assert_eq!(slept, [100 * MS, 200 * MS, 400 * MS]);
    assert_eq!(surfaced.status, Status::TimedOut);
    assert_eq!(surfaced.retry_after(), Some(800 * MS));
    assert_eq!(
        deadline.remaining(),
        700 * MS,
        "the refused wait cost nothing"
    );
    assert!(clock.now_nanos() <= deadline.at_nanos());
}

#[test]
fn the_server_overrides_the_backoff() {
    let mut deadline = Deadline::never(ManualClock::new());
    let mut policy = RetryPolicy::new(Backoff::new(MS, 10 * MS).seed(1));
    let Decision::Retry { after } = policy.decide(&hint(&[("retry-after", "3")]), &mut deadline)
    else {
        panic!()
    };
    assert!(after >= Duration::from_secs(3) && after <= Duration::from_secs(3) + MS);

    // remaining = 0 waits for the reset, not for the next 429.
    let exhausted = hint(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "7")]);
    let Decision::Retry { after } = policy.decide(&exhausted, &mut deadline) else {
        panic!()
    };
    assert!(after >= Duration::from_secs(7));
}

#[test]
fn an_hour_against_thirty_seconds_is_the_server_saying_stop() {
    let clock = ManualClock::new();
    let mut deadline = Deadline::after(clock, Duration::from_secs(30));
    let mut policy = RetryPolicy::default().clamp(Duration::from_secs(600));
    let told = hint(&[("retry-after", "3600"), ("x-ratelimit-scope", "org")]);
    let Decision::NotRetried(s) = policy.decide(&told, &mut deadline) else {
        panic!()
    };
    assert_eq!(s.status, Status::RateLimited);
    assert_eq!(s.retry_after(), Some(Duration::from_secs(3600)));
    assert_eq!(s.scope, "server:org");
    assert!(
        s.hint.contains("1 h") && s.hint.contains("org"),
        "{}",
        s.hint
    );
    assert_eq!(
        deadline.remaining(),
        Duration::from_secs(30),
        "nothing charged"
    );

    // Within the deadline but beyond the clamp: still stop.
    let mut deadline = Deadline::never(ManualClock::new());
    let mut policy = RetryPolicy::default().clamp(Duration::from_secs(5));
    let Decision::NotRetried(s) = policy.decide(&hint(&[("retry-after", "6")]), &mut deadline)
    else {
        panic!()
    };
    assert_eq!(s.status, Status::RateLimited);
}

/// A server wait of exactly the clamp is slept; a nanosecond more is not.
#[test]
fn a_wait_of_exactly_the_clamp_is_slept_and_a_nanosecond_more_is_not() {
    let decide = |wait: &str| {
        let mut policy = RetryPolicy::new(Backoff::new(Duration::ZERO, Duration::ZERO))
            .clamp(Duration::from_secs(30));
        let mut deadline = Deadline::never(ManualClock::new());
        policy.decide(&hint(&[("retry-after", wait)]), &mut deadline)
    };
    let slept = Decision::Retry {
        after: Duration::from_secs(30),
    };
    assert_eq!(decide("30"), slept);
    let Decision::NotRetried(t) = decide("30.000000001") else {
        panic!()
    };
    assert_eq!(t.status, Status::RateLimited);
    assert_eq!(t.retry_after(), Some(Duration::from_millis(30_001)));
}

#[test]
fn the_exact_server_wait_when_jitter_would_not_fit() {
    let deadline = Deadline::after(ManualClock::new(), Duration::from_secs(2));
    let policy = RetryPolicy::new(Backoff::new(Duration::from_secs(1), Duration::from_secs(1)));
    for _ in 0..20 {
        let mut policy = policy.fork();
        let mut deadline = deadline.clone();
        assert_eq!(
            policy.decide(&hint(&[("retry-after", "2")]), &mut deadline),
            Decision::Retry {
                after: Duration::from_secs(2)
            }
        );
    }
}

#[test]
fn the_attempt_cap_gives_up() {
    let mut deadline = Deadline::never(ManualClock::new());
    let mut policy = RetryPolicy::new(backoff(Jitter::Full, 3)).max_retries(3);
    for _ in 0..3 {
        assert!(matches!(
            policy.decide(&ServerHint::default(), &mut deadline),
            Decision::Retry { .. }
        ));
    }
    assert_eq!(policy.retries(), 3);
    assert_eq!(
        policy.decide(&hint(&[("retry-after", "1")]), &mut deadline),
        Decision::GiveUp
    );
    assert_eq!(
        policy.decide(&ServerHint::default(), &mut deadline),
        Decision::GiveUp
    );
}

#[test]
fn huge_attempt_numbers_never_overflow() {
    let mut deadline = Deadline::never(ManualClock::new());
    let mut policy =
        RetryPolicy::new(Backoff::new(Duration::MAX, Duration::MAX).jitter(Jitter::Equal))
            .max_retries(u32::MAX);
    for _ in 0..100 {
        let _ = policy.decide(&ServerHint::default(), &mut deadline);
    }
    let mut b = Backoff::new(Duration::MAX, Duration::MAX).jitter(Jitter::Decorrelated);
    for attempt in [0, 1, 63, 64, u32::MAX] {
        assert!(b.delay(attempt) <= Duration::from_nanos(u64::MAX));
    }
}

/// Issue #10, item 4: `Deadline::charge` accepted a zero wait at zero
/// budget (`0 > 0` is false), so an expired deadline kept granting
/// `Retry { after: 0 }` for `Retry-After: 0` or a zero backoff.
#[test]
fn expired_deadline_grants_no_zero_wait_retry() {
    let clock = ManualClock::new();
    let mut deadline = Deadline::after(clock.clone(), Duration::from_secs(1));
    clock.advance(Duration::from_secs(2));
    let mut policy =
        RetryPolicy::new(Backoff::new(Duration::ZERO, Duration::ZERO)).max_retries(u32::MAX);
    for _ in 0..10 {
        for h in [hint(&[("retry-after", "0")]), ServerHint::default()] {
            match policy.decide(&h, &mut deadline) {
                Decision::NotRetried(s) => assert_eq!(s.status, Status::TimedOut),
                other => panic!("a retry after the deadline: {other:?}"),
            }
        }
    }

    // Exactly at the deadline counts as passed; just before, a zero wait
    // still fits.
    let clock = ManualClock::starting_at(10);
    let mut deadline = Deadline::at(clock.clone(), 11);
    assert!(deadline.charge(Duration::ZERO).is_ok());
    clock.advance(Duration::from_nanos(1));
    assert!(deadline.is_expired());
    assert!(deadline.charge(Duration::ZERO).is_err());
    // A wait ending exactly at the deadline fits, and then nothing does.
    let mut deadline = Deadline::at(clock.clone(), 20);
    assert!(deadline.charge(Duration::from_nanos(9)).is_ok());
    assert!(deadline.charge(Duration::ZERO).is_err());
}

/// Issue #12 (with #10 item 14): a 429 that outlasted the retries was a
/// `GiveUp` for the policy, and only the runner knew to make it a rate
/// limit. The policy surfaces it as `rate_limited` with the server's wait.
#[test]
fn a_capacity_answer_outlasting_the_cap_is_rate_limited_not_give_up() {
    let clock = ManualClock::new();
    let mut deadline = Deadline::after(clock.clone(), Duration::from_secs(60));
    let mut policy = RetryPolicy::new(backoff(Jitter::None, 1)).max_retries(2);
    let told = hint(&[("retry-after", "1"), ("x-ratelimit-scope", "org")]);
    for _ in 0..2 {
        let Decision::Readmit { after } = policy.decide_reply(Some(429), &told, &mut deadline)
        else {
            panic!("1 s fits")
        };
        assert!(after >= Duration::from_secs(1));
        clock.advance(after);
    }
    let Decision::Surface(t) = policy.decide_reply(Some(429), &told, &mut deadline) else {
        panic!("the cap is reached")
    };
    assert_eq!(t.status, Status::RateLimited);
    assert_eq!(t.scope, "server:org");
    assert_eq!(t.retry_after(), Some(Duration::from_secs(1)));
    assert!(t.hint.contains("after 3 requests"), "{}", t.hint);
    // A fault at the cap is a plain give-up.
    assert_eq!(
        policy.decide_reply(Some(500), &ServerHint::default(), &mut deadline),
        Decision::GiveUp
    );
    // Final answers and successes are never retried, and cost nothing.
    let mut fresh = RetryPolicy::default();
    for status in [Some(200), Some(404)] {
        assert_eq!(
            fresh.decide_reply(status, &told, &mut deadline),
            Decision::Stop
        );
    }
    assert_eq!(fresh.retries(), 0);
}

/// A bare 429 waits the second `Ticket::observe` holds the credential for,
/// not the (shorter) backoff: the server's answer is read one way.
#[test]
fn a_bare_429_waits_the_same_second_as_the_hold() {
    let mut deadline = Deadline::never(ManualClock::new());
    let mut policy = RetryPolicy::new(backoff(Jitter::None, 1));
    let Decision::Readmit { after } =
        policy.decide_reply(Some(429), &ServerHint::default(), &mut deadline)
    else {
        panic!()
    };
    assert!(after >= RetryPolicy::BARE_429_HOLD, "{after:?}");
    assert!(after <= RetryPolicy::BARE_429_HOLD + 100 * MS, "{after:?}");
    // A 429 past the deadline is still the server's limit: rate_limited.
    let clock = ManualClock::new();
    let mut gone = Deadline::after(clock.clone(), Duration::from_secs(1));
    clock.advance(Duration::from_secs(2));
    let Decision::Surface(t) =
        policy.decide_reply(Some(429), &hint(&[("retry-after", "0")]), &mut gone)
    else {
        panic!()
    };
    assert_eq!(t.status, Status::RateLimited);
}

/// A fork keeps its template's settings (retry cap, clamp, backoff) and
/// starts its own count, while the template (shared, never mutated) keeps
/// none.
#[test]
fn a_fork_keeps_the_templates_settings_with_a_count_of_its_own() {
    let clock = ManualClock::new();
    let template = RetryPolicy::new(Backoff::new(Duration::from_secs(3), Duration::from_secs(3)))
        .max_retries(1)
        .clamp(Duration::from_millis(500));
    for _ in 0..2 {
        let mut policy = template.fork();
        let mut deadline = Deadline::after(clock.clone(), Duration::from_secs(60));
        let Decision::Retry { after } = policy.decide(&ServerHint::default(), &mut deadline) else {
            panic!("one retry")
        };
        assert!(
            after <= Duration::from_secs(3),
            "the template's backoff: {after:?}"
        );
        assert_eq!(policy.retries(), 1);
        let told = hint(&[("retry-after", "1")]);
        assert!(
            matches!(policy.decide(&told, &mut deadline), Decision::GiveUp),
            "the template's cap of 1"
        );
    }
    // The clamp: a 1 s server wait is past the template's 500 ms.
    let mut policy = template.fork();
    let mut deadline = Deadline::after(clock.clone(), Duration::from_secs(60));
    let told = hint(&[("retry-after", "1")]);
    assert!(matches!(
        policy.decide(&told, &mut deadline),
        Decision::NotRetried(_)
    ));
}
