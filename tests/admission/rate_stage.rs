//! The rate stage's waits and refusals, on a manual clock that starts far
//! from zero. cargo-mutants (issue #21, item 13) found a wait computed as
//! `ready_at + now` instead of `ready_at - now` undetected: every test
//! before started its clock at 0, where the two agree.

use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

use backpressure::admission::{Admission, Builder, CallSpec};
use backpressure::headers::ServerHint;
use backpressure::{ManualClock, Quota, Status, TokenBucket};
use futures::FutureExt;

/// A million seconds in: far from the origin.
const LATE: u64 = 1_000_000 * 1_000_000_000;
const MS: Duration = Duration::from_millis(1);

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// A builder whose sleeps and rates both run on `clock`.
fn on(clock: &ManualClock) -> Builder<ManualClock, ManualClock> {
    Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
}

/// 10 calls a second for the credential `k`, one at a time (no learning).
fn layer(clock: &ManualClock) -> Admission<ManualClock, ManualClock> {
    on(clock)
        .quota("k", Quota::per_second(nz(10)).allow_burst(nz(1)))
        .fixed_rates()
        .build()
}

/// `credential`'s call answered 429 with `Retry-After: retry_after`.
fn answered_429(a: &Admission<ManualClock, ManualClock>, credential: &str, retry_after: &str) {
    let ticket = a
        .admit(&CallSpec::new("t", credential))
        .now_or_never()
        .unwrap()
        .unwrap();
    let hint = ServerHint::from_headers([("retry-after", retry_after)], SystemTime::now());
    ticket.observe(429, &hint);
}

/// `credential`'s next call, decided at once.
fn admit_now(
    a: &Admission<ManualClock, ManualClock>,
    credential: &str,
) -> Result<backpressure::admission::Ticket<ManualClock, ManualClock>, backpressure::Throttled> {
    a.admit(&CallSpec::new("t", credential))
        .now_or_never()
        .expect("decided without a wait")
}

/// `call` (not polled yet) waits, is still waiting a millisecond before
/// `at` from now, and is admitted at `at`.
fn admitted_at<T, F: std::future::Future<Output = Result<T, backpressure::Throttled>>>(
    mut call: std::pin::Pin<&mut F>,
    clock: &ManualClock,
    at: Duration,
) {
    assert!(call.as_mut().now_or_never().is_none(), "it waits");
    clock.advance(at - MS);
    assert!(call.as_mut().now_or_never().is_none(), "not before {at:?}");
    clock.advance(MS);
    assert!(
        matches!(call.as_mut().now_or_never(), Some(Ok(_))),
        "at {at:?}"
    );
}

/// 5,000 new credentials, one call each: past the registry's 4,096.
fn flood(a: &Admission<ManualClock, ManualClock>) {
    for i in 0..5_000 {
        drop(admit_now(a, &format!("tenant-{i}")).unwrap());
    }
}

/// One call a minute for `k`, and nothing learned; `k`'s first call taken.
fn one_a_minute_spent(clock: &ManualClock) -> Admission<ManualClock, ManualClock> {
    let a = on(clock)
        .quota("k", Quota::per_minute(nz(1)))
        .fixed_rates()
        .build();
    drop(
        a.admit(&CallSpec::new("t", "k"))
            .now_or_never()
            .unwrap()
            .unwrap(),
    );
    a
}

#[test]
fn a_call_waiting_for_its_cell_goes_at_the_cells_instant_on_a_late_clock() {
    let clock = ManualClock::starting_at(LATE);
    let a = layer(&clock);
    let first = a.admit(&CallSpec::new("t", "k")).now_or_never().unwrap();
    assert!(first.is_ok());
    let spec = CallSpec::new("t", "k");
    admitted_at(std::pin::pin!(a.admit(&spec)), &clock, 100 * MS);
}

#[test]
fn a_server_scopes_hold_is_waited_from_now_on_a_late_clock() {
    let clock = ManualClock::starting_at(LATE);
    let a = on(&clock).fixed_rates().build();
    let ticket = a
        .admit(&CallSpec::new("search", "k"))
        .now_or_never()
        .unwrap()
        .unwrap();
    // The server names the limit: the hold covers this tool's calls.
    let hint = ServerHint::from_headers(
        [("retry-after", "1"), ("x-ratelimit-scope", "search")],
        SystemTime::now(),
    );
    assert_eq!(hint.scope.as_deref(), Some("search"));
    ticket.observe(429, &hint);
    drop(ticket);
    let spec = CallSpec::new("search", "k");
    // Held for a second.
    admitted_at(std::pin::pin!(a.admit(&spec)), &clock, 1_000 * MS);
}

#[test]
fn a_wait_past_the_deadline_says_so_and_one_past_the_inline_wait_says_that() {
    let clock = ManualClock::starting_at(LATE);
    let a = one_a_minute_spent(&clock);
    // The next cell is a minute away: past a 10 s deadline...
    let short = CallSpec::new("t", "k").deadline(Duration::from_secs(10));
    let t = a.admit(&short).now_or_never().unwrap().unwrap_err();
    assert_eq!(t.status, Status::RateLimited);
    assert!(t.hint.contains("after its deadline"), "{}", t.hint);
    // ... and within a 2 min one, but past the 2 s inline wait.
    let long = CallSpec::new("t", "k").deadline(Duration::from_secs(120));
    let t = a.admit(&long).now_or_never().unwrap().unwrap_err();
    assert_eq!(t.status, Status::RateLimited);
    assert!(t.hint.contains("could still wait inline"), "{}", t.hint);
    // The second call refused on this limit is told the turn after the
    // first one's (a minute later), not the same instant.
    let told = t.retry_after().unwrap();
    assert!(
        told >= Duration::from_secs(119) && told <= Duration::from_secs(121),
        "{told:?}"
    );
}

#[test]
fn a_shared_quota_is_enforced_on_the_fast_path() {
    // The shared limiter allows one call a minute; the credential's local
    // default (10/s) would admit more. Both calls need no wait, so both
    // take the fast path unless it knows the credential is shared.
    let clock = ManualClock::starting_at(LATE);
    let shared = TokenBucket::with_clock(Quota::per_minute(nz(1)), clock.clone());
    let a = on(&clock)
        .shared_quota("k", shared)
        .inline_wait(Duration::ZERO)
        .build();
    assert!(a
        .admit(&CallSpec::new("t", "k"))
        .now_or_never()
        .unwrap()
        .is_ok());
    let refused = a.admit(&CallSpec::new("t", "k")).now_or_never().unwrap();
    assert_eq!(refused.unwrap_err().status, Status::RateLimited);
    // Another credential is local, and admitted.
    assert!(a
        .admit(&CallSpec::new("t", "other"))
        .now_or_never()
        .unwrap()
        .is_ok());
}

#[test]
fn a_wait_of_exactly_the_remaining_deadline_fits_it() {
    // The boundary of "past the deadline": a wait equal to what is left
    // fits the deadline; only the inline wait refuses it.
    let clock = ManualClock::starting_at(LATE);
    let a = one_a_minute_spent(&clock);
    let exact = CallSpec::new("t", "k").deadline(Duration::from_secs(60));
    let t = a.admit(&exact).now_or_never().unwrap().unwrap_err();
    assert_eq!(t.status, Status::RateLimited);
    assert!(t.hint.contains("could still wait inline"), "{}", t.hint);
}

#[test]
fn a_hold_of_exactly_the_cap_is_rate_limited_not_quota_exhausted() {
    // `max_retry_after` is the longest hold worth waiting for: a server
    // wait of exactly that is still a rate limit; only a longer one is the
    // operator's problem.
    let clock = ManualClock::starting_at(LATE);
    let a = on(&clock)
        .max_retry_after(Duration::from_secs(10))
        .fixed_rates()
        .build();
    answered_429(&a, "k", "10");
    let t = admit_now(&a, "k").unwrap_err();
    assert_eq!(t.status, Status::RateLimited, "{t}");
    assert_eq!(t.retry_after(), Some(Duration::from_secs(10)));
    // One second more is past the cap.
    answered_429(&a, "j", "11");
    let t = admit_now(&a, "j").unwrap_err();
    assert_eq!(t.status, Status::QuotaExhausted, "{t}");
}

#[test]
fn a_hold_that_ends_before_a_sleepers_instant_does_not_move_it() {
    // A call sleeps towards its cell 100 ms away; a 429 meanwhile holds
    // the key for 50 ms, which ends before that instant: the call still
    // goes at its cell, not a cell later.
    let clock = ManualClock::starting_at(LATE);
    let a = layer(&clock);
    let first = a
        .admit(&CallSpec::new("t", "k"))
        .now_or_never()
        .unwrap()
        .unwrap();
    let spec = CallSpec::new("t", "k");
    let mut second = Box::pin(a.admit(&spec));
    assert!(second.as_mut().now_or_never().is_none());
    clock.advance(10 * MS);
    let mut short = ServerHint::default();
    short.retry_after = Some(50 * MS);
    first.observe(429, &short);
    drop(first);
    clock.advance(90 * MS);
    assert!(
        matches!(second.as_mut().now_or_never(), Some(Ok(_))),
        "at its cell"
    );
}

/// Two layers (two processes, say) whose credential `k` shares one limiter.
fn two_sharing(clock: &ManualClock) -> [Admission<ManualClock, ManualClock>; 2] {
    let shared = std::sync::Arc::new(TokenBucket::with_clock(
        Quota::per_second(nz(100)),
        clock.clone(),
    ));
    let layer = || {
        on(clock)
            .shared_quota("k", shared.clone())
            .inline_wait(Duration::ZERO)
            .build()
    };
    [layer(), layer()]
}

#[test]
fn a_429_seen_by_one_layer_holds_every_layer_sharing_the_key() {
    let clock = ManualClock::starting_at(LATE);
    let [a, b] = two_sharing(&clock);
    let ticket = a
        .admit(&CallSpec::new("t", "k"))
        .now_or_never()
        .unwrap()
        .unwrap();
    ticket.observe(
        429,
        &ServerHint::from_headers([("retry-after", "2")], SystemTime::now()),
    );
    drop(ticket);
    // `a`'s next admit pushes the hold to the shared limiter first.
    let t = a
        .admit(&CallSpec::new("t", "k"))
        .now_or_never()
        .unwrap()
        .unwrap_err();
    assert_eq!(t.status, Status::RateLimited);
    // `b` never saw the 429, and is held too, for the same two seconds.
    let t = b
        .admit(&CallSpec::new("t", "k"))
        .now_or_never()
        .unwrap()
        .unwrap_err();
    assert_eq!(t.status, Status::RateLimited);
    let told = t.retry_after().unwrap();
    assert!(
        told > Duration::from_millis(1_900) && told <= Duration::from_secs(2),
        "{told:?}"
    );
    clock.advance(Duration::from_secs(2));
    assert!(b
        .admit(&CallSpec::new("t", "k"))
        .now_or_never()
        .unwrap()
        .is_ok());
}

#[test]
fn a_shared_quota_changed_by_another_process_moves_the_calls_sleeping_on_it() {
    // A queues three calls on a shared 10/s quota (burst 1): their cells
    // are at 100, 200 and 300 ms. At 10 ms another process stores 2/s,
    // which the limiter applies to the cells queued in it (now at 460,
    // 960 and 1,460 ms). A learns of it at its next round trip (a fourth
    // call's reservation), knowing only that it came after its last one
    // (at 0 ms), and its sleepers go at 2/s from then, the latest the
    // limiter's cells can be: at 500, 1,000 and 1,500 ms, not at their
    // old instants, which the server's 2/s would refuse.
    let clock = ManualClock::starting_at(LATE);
    let shared = std::sync::Arc::new(TokenBucket::with_clock(
        Quota::per_second(nz(10)).allow_burst(nz(1)),
        clock.clone(),
    ));
    let a = on(&clock)
        .shared_quota("k", shared.clone())
        .inline_wait(Duration::from_secs(5))
        .build();
    let spec = CallSpec::new("t", "k");
    let first = a.admit(&spec).now_or_never().unwrap().unwrap();
    let mut queued: Vec<_> = (0..3).map(|_| Box::pin(a.admit(&spec))).collect();
    for call in &mut queued {
        assert!(call.as_mut().now_or_never().is_none());
    }
    clock.advance(10 * MS);
    shared.set_quota(Quota::new(2.0, 1).unwrap());
    // Another tool: the first tool's four slots are taken.
    let other_tool = CallSpec::new("u", "k");
    let mut fourth = Box::pin(a.admit(&other_tool));
    assert!(fourth.as_mut().now_or_never().is_none());
    let mut at = 10;
    for due in [500, 1_000, 1_500] {
        clock.advance((due - 1 - at) * MS);
        let ready: Vec<bool> = queued
            .iter_mut()
            .map(|c| matches!(c.as_mut().now_or_never(), Some(Ok(_))))
            .collect();
        assert!(ready.iter().all(|r| !r), "before {due} ms: {ready:?}");
        clock.advance(MS);
        at = due;
        let mut call = queued.remove(0);
        assert!(
            matches!(call.as_mut().now_or_never(), Some(Ok(_))),
            "at {due} ms"
        );
    }
    // The fourth call was reserved at 2/s, behind the limiter's three
    // moved cells: at 1,960 ms.
    clock.advance(459 * MS);
    assert!(fourth.as_mut().now_or_never().is_none());
    clock.advance(MS);
    assert!(matches!(fourth.as_mut().now_or_never(), Some(Ok(_))));
    drop(first);
}

#[test]
fn a_runner_pushes_a_shared_hold_as_soon_as_the_call_ends() {
    use backpressure::admission::{Call, CallResult, Reply, Runner};
    use backpressure::retry::RetryPolicy;
    let clock = ManualClock::starting_at(LATE);
    let [a, b] = two_sharing(&clock);
    let runner: Runner<(), String, _, _> =
        Runner::new(a, Duration::ZERO).retry_policy(RetryPolicy::default().max_retries(0));
    let call = Call::new(CallSpec::new("t", "k"), || async {
        let hint = ServerHint::from_headers([("retry-after", "2")], SystemTime::now());
        Ok(Reply::new(429, ()).with_hint(hint))
    });
    let result = runner.one(call).now_or_never().unwrap();
    assert!(matches!(result, CallResult::Throttled(_)), "{result:?}");
    // No later admit on the runner's layer: the hold reached the shared
    // limiter when the call ended.
    let t = b
        .admit(&CallSpec::new("t", "k"))
        .now_or_never()
        .unwrap()
        .unwrap_err();
    assert_eq!(t.status, Status::RateLimited);
}

#[test]
fn past_4096_credentials_one_with_a_hold_keeps_what_it_learned() {
    // A full registry forgets only idle credentials (full buckets, no
    // hold). `x` was cut by a 429 and is held: it keeps its learned rate
    // however many new credentials arrive (cargo-mutants: `is_full_at`
    // answering `true` forgot it).
    let clock = ManualClock::starting_at(LATE);
    let a = on(&clock).build();
    answered_429(&a, "x", "5");
    let learned = a.learned_rate("x").expect("x is tracked");
    assert!(learned < 10.0, "the 429 cut the guess: {learned}");
    flood(&a);
    assert_eq!(
        a.learned_rate("x"),
        Some(learned),
        "x was forgotten while held"
    );
}

#[test]
fn past_4096_credentials_one_in_debt_keeps_what_it_learned() {
    // No hold this time: `y` learned the server's stated rate from a 200
    // and has spent a cell (its bucket is not full yet). It is not idle,
    // and a full registry keeps it (cargo-mutants: `&&` to `||` in
    // `is_full_at` forgot it).
    let clock = ManualClock::starting_at(LATE);
    let a = on(&clock).build();
    let ticket = admit_now(&a, "y").unwrap();
    let stated = ServerHint::from_headers([("x-ratelimit-limit-minute", "180")], SystemTime::now());
    ticket.observe(200, &stated);
    drop(ticket);
    let learned = a.learned_rate("y").expect("y is tracked");
    assert!(
        (learned - 3.0).abs() < 0.01,
        "180 a minute is 3/s: {learned}"
    );
    flood(&a);
    assert_eq!(
        a.learned_rate("y"),
        Some(learned),
        "y was forgotten while in debt"
    );
}

#[test]
fn past_4096_credentials_idle_ones_whose_buckets_remain_make_room() {
    // 4,096 credentials each spend a cell, then a second passes: their
    // buckets are full again, and still in the registry (a sweep has only
    // cleared their second-chance bits), and nothing holds them. The next
    // credential finds room and learns a rate of its own. (The 10,000
    // tenant test of `admission_layer.rs` waits until the buckets are
    // swept out, which hid a mutant: `held_until() <= now` to `>` in
    // `is_full_at` kept every idle credential whose bucket remained.)
    let clock = ManualClock::starting_at(LATE);
    let a = on(&clock).build();
    for i in 0..4_096 {
        drop(admit_now(&a, &format!("tenant-{i}")).unwrap());
    }
    assert_eq!(a.learned_rate("tenant-0"), Some(10.0));
    drop(admit_now(&a, "busy").unwrap());
    assert_eq!(a.learned_rate("busy"), None, "full: every tenant is busy");
    clock.advance(Duration::from_secs(1));
    drop(admit_now(&a, "late").unwrap());
    assert_eq!(a.learned_rate("late"), Some(10.0), "no room was made");
    assert_eq!(a.learned_rate("tenant-0"), None, "an idle one was kept");
}

/// Issue #23 item 1, the rate: 40 background calls arrive at once on a
/// 10/s key, then an interactive call every 200 ms (the half the
/// background share leaves). Stepped 10 ms at a time on the manual clock:
/// returns when each interactive call was admitted after its arrival, and
/// how many background calls were admitted in the first 4 s.
fn background_flood_then_interactive(share: f64) -> (Vec<Duration>, usize) {
    let clock = ManualClock::starting_at(LATE);
    let a = on(&clock)
        .quota("k", Quota::per_second(nz(10)).allow_burst(nz(1)))
        .fixed_rates()
        .inline_wait(Duration::from_secs(10))
        .priority_lanes(1.0)
        .background_rate_share(share)
        .build();
    let background = CallSpec::new("t", "k")
        .priority(backpressure::admission::Priority::BACKGROUND)
        .deadline(Duration::from_secs(10));
    let interactive = CallSpec::new("t", "k").deadline(Duration::from_secs(10));
    let mut flood: Vec<_> = (0..40).map(|_| Box::pin(a.admit(&background))).collect();
    let mut waiting = Vec::new();
    let mut waits = Vec::new();
    let mut background_admitted = 0;
    // 4 s of arrivals, and 200 ms more to admit the last one.
    for step in 0..420u32 {
        let now = Duration::from_millis(10) * step;
        // Polled first: the flood is queued before anyone else arrives.
        flood.retain_mut(|call| match call.as_mut().now_or_never() {
            Some(Ok(_ticket)) => {
                background_admitted += usize::from(step < 400);
                false
            }
            Some(Err(t)) => panic!("a background call refused within its wait: {t:?}"),
            None => true,
        });
        if step % 20 == 10 && step < 400 {
            waiting.push((now, Box::pin(a.admit(&interactive))));
        }
        waiting.retain_mut(|(arrived, call)| match call.as_mut().now_or_never() {
            Some(Ok(_ticket)) => {
                waits.push(now - *arrived);
                false
            }
            Some(Err(t)) => panic!("{t:?}"),
            None => true,
        });
        clock.advance(Duration::from_millis(10));
    }
    (waits, background_admitted)
}

#[test]
fn background_calls_take_at_most_their_share_of_a_keys_rate() {
    let (waits, background) = background_flood_then_interactive(0.5);
    assert_eq!(waits.len(), 20, "every interactive call was admitted");
    // Half of 10/s for 4 s, plus the one the share's burst holds.
    assert!(
        (19..=21).contains(&background),
        "{background} background calls"
    );
    assert!(
        waits.iter().all(|w| *w <= 100 * MS),
        "an interactive call waits at most one cell behind a background one: {waits:?}"
    );
    // Off (a share of 1): all of the rate open to the background calls: the four holding the
    // tool's slots have booked the next cells, and every interactive call
    // waits behind them (first in line for a slot, not for a cell).
    let (waits, background) = background_flood_then_interactive(1.0);
    assert!(background > 21, "{background} background calls");
    assert!(waits.iter().all(|w| *w >= 400 * MS), "{waits:?}");
}

/// A background call refused for its class's share says so, and a turn
/// taken by a call that is then refused (its tool's one slot is busy)
/// comes back for the next background call.
#[test]
fn a_background_share_refuses_in_its_own_scope_and_gets_unused_turns_back() {
    use backpressure::admission::{Priority, SlotPolicy};
    let clock = ManualClock::starting_at(LATE);
    let a = on(&clock)
        .quota("k", Quota::per_second(nz(10)).allow_burst(nz(1)))
        .fixed_rates()
        .tool("t", 1, SlotPolicy::FailFast)
        .background_rate_share(0.1) // one background call a second
        .build();
    let background = CallSpec::new("t", "k")
        .priority(Priority::BACKGROUND)
        .deadline(Duration::from_millis(500));
    let holder = admit_now(&a, "other").unwrap();
    let shed = a.admit(&background).now_or_never().unwrap().unwrap_err();
    assert_eq!(shed.status, Status::Shed, "{shed:?}");
    drop(holder);
    let first = a
        .admit(&background)
        .now_or_never()
        .expect("the shed call's turn came back: no wait")
        .unwrap();
    drop(first);
    clock.advance(100 * MS); // the key's own cell is free again
    let refused = a.admit(&background).now_or_never().unwrap().unwrap_err();
    assert_eq!(refused.status, Status::RateLimited, "{refused:?}");
    assert_eq!(refused.scope, "api_key:background");
    assert!(
        refused
            .hint
            .starts_with("background calls draw on their share"),
        "{refused:?}"
    );
    let after = refused.retry_after().unwrap();
    assert!(after > 800 * MS && after <= 900 * MS, "{after:?}");
    // An interactive call on the same key is not held to the share.
    drop(admit_now(&a, "k").unwrap());
}
