//! Issue #41, item 1: a 429 the bucket did not predict, on a quota whose
//! rate is the server's own stated limit, fits that quota to a rolling
//! window: after idle, the next burst puts at most one burst in any span
//! (not a burst plus its refill), so the same 429 does not come back at
//! every turn's start. Manual clock: exact instants.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use backpressure::admission::{Admission, CallSpec, Provider};
use backpressure::headers::ServerHint;
use backpressure::ManualClock;

fn now<F: Future>(f: F) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    pin!(f).poll(&mut Context::from_waker(&waker))
}

/// A layer told OpenAI, refusing any call that would wait.
fn layer(clock: &ManualClock) -> Admission<ManualClock, ManualClock> {
    Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .provider(Provider::OpenAi)
        .inline_wait(Duration::ZERO)
        .build()
}

/// OpenAI's headers: 6,000 requests (100 a second, never the limit here)
/// and 120,000 tokens (2,000 a second) a minute; a 429 for tokens adds
/// `retry-after: 1` and nothing left.
fn reply(tokens_left: &str, retry_after: Option<&str>) -> ServerHint {
    let mut headers = vec![
        ("x-ratelimit-limit-requests", "6000"),
        ("x-ratelimit-limit-tokens", "120000"),
        ("x-ratelimit-remaining-requests", "5990"),
        ("x-ratelimit-remaining-tokens", tokens_left),
    ];
    if let Some(wait) = retry_after {
        headers.push(("retry-after", wait));
    }
    ServerHint::from_headers(headers, SystemTime::now())
}

fn call() -> CallSpec {
    CallSpec::new("chat", "key").cost("tokens", 805)
}

/// Admits calls of 805 tokens from the current instant until the tokens
/// refuse one, letting the clock run to each call's request slot (the
/// request rate paces them 10 ms apart), and returns how many went and
/// the instant the refused one was told, from the first call.
fn burst(
    admission: &Admission<ManualClock, ManualClock>,
    clock: &ManualClock,
) -> (usize, Duration) {
    let (mut went, mut ran) = (0, Duration::ZERO);
    loop {
        match now(admission.admit(&call())) {
            Poll::Ready(Ok(ticket)) => {
                went += 1;
                drop(ticket);
            }
            Poll::Ready(Err(refused)) if refused.scope == "api_key" => {
                let slot = refused.retry_after().unwrap();
                assert!(slot <= Duration::from_millis(10), "{refused}");
                clock.advance(slot);
                ran += slot;
            }
            Poll::Ready(Err(refused)) => {
                assert_eq!(refused.scope, "quota:tokens", "{refused}");
                return (went, ran + refused.retry_after().unwrap());
            }
            Poll::Pending => panic!("an inline wait of zero never sleeps"),
        }
    }
}

/// A layer whose first reply stated the limits (2,000 tokens a second, a
/// second's worth of burst), idle for 5 s since.
fn told_the_limits() -> (ManualClock, Admission<ManualClock, ManualClock>) {
    let clock = ManualClock::new();
    let admission = layer(&clock);
    let Poll::Ready(Ok(first)) = now(admission.admit(&call())) else {
        panic!("the first call goes")
    };
    first.observe(200, &reply("119195", None));
    drop(first);
    clock.advance(Duration::from_secs(5));
    (clock, admission)
}

fn windowed(admission: &Admission<ManualClock, ManualClock>) -> Vec<String> {
    admission.stats().credentials[0].windowed.clone()
}

#[test]
fn a_tokens_429_fits_the_quota_to_a_rolling_window() {
    let (clock, admission) = told_the_limits();

    // The bucket: two calls at once, the third when 415 tokens refill.
    let (went, at) = burst(&admission, &clock);
    assert_eq!(went, 2);
    assert_ms(at, Duration::from_nanos(207_500_000), "the bucket's refill");
    assert!(windowed(&admission).is_empty());

    // It goes then, and a server counting a rolling second refuses it:
    // 2,415 tokens in 207 ms. The rate is the server's own, so the shape
    // is what was wrong.
    clock.advance(Duration::from_nanos(207_500_000 - 10_000_000));
    let Poll::Ready(Ok(third)) = now(admission.admit(&call())) else {
        panic!("the third call goes once its tokens refilled")
    };
    third.observe(429, &reply("0", Some("1")));
    drop(third);
    assert_eq!(windowed(&admission), ["tokens"]);

    // The next turn, from idle: still two calls at once, and the third is
    // told the window's instant (the first leaves a second later, plus
    // 1/64 for the requests' transit), not the refill's.
    clock.advance(Duration::from_secs(5));
    let (went, at) = burst(&admission, &clock);
    assert_eq!(went, 2);
    let span = Duration::from_secs(1) + Duration::from_secs(1) / 64;
    assert_ms(at, span, "the window's instant");
    // Then the next two go, and no more: over any long run the window
    // admits the bucket's rate, never a burst plus its refill. (Had a
    // refused call left its units in the window, the second would not.)
    for _ in 0..3 {
        clock.advance(span - Duration::from_millis(10));
        let (went, at) = burst(&admission, &clock);
        assert_eq!(went, 2);
        assert_ms(at, span, "the window's instant");
    }
}

/// `told` is `expected` rounded up to the millisecond (as a refusal says
/// it).
fn assert_ms(told: Duration, expected: Duration, what: &str) {
    assert!(
        told >= expected && told - expected < Duration::from_millis(1),
        "{what}: told {told:?}, expected {expected:?}"
    );
}

#[test]
fn a_429_deep_in_a_busy_run_fits_nothing() {
    let (clock, admission) = told_the_limits();
    // Three seconds of calls, each at its bucket's instant: the bucket is
    // never full again after the first, so the run is one busy period.
    let mut ran = Duration::ZERO;
    let mut last = None;
    while ran < Duration::from_secs(3) {
        let (went, at) = burst(&admission, &clock);
        assert!(went <= 2, "{went} at once");
        clock.advance(at);
        ran += at;
        let Poll::Ready(Ok(t)) = now(admission.admit(&call())) else {
            panic!("a call at its instant goes")
        };
        last = Some(t);
    }
    // A 429 there is not about the shape (the bucket paced at the rate):
    // another user of the key, or usage nothing metered.
    last.unwrap().observe(429, &reply("0", Some("1")));
    assert!(windowed(&admission).is_empty());
}

#[test]
fn a_429_on_a_guessed_rate_fits_nothing() {
    let clock = ManualClock::new();
    let admission = layer(&clock);
    // No limit stated: the request rate is a guess, and a bare 429 cuts
    // it (the rate is what may be wrong); no quota gets a window.
    let Poll::Ready(Ok(t)) = now(admission.admit(&CallSpec::new("chat", "key"))) else {
        panic!("the first call goes")
    };
    let guess = admission.learned_rate("key").unwrap();
    t.observe(429, &ServerHint::default());
    drop(t);
    assert!(admission.learned_rate("key").unwrap() < guess);
    assert!(windowed(&admission).is_empty());
}

#[test]
fn a_requests_429_under_a_stated_request_limit_fits_the_requests() {
    let clock = ManualClock::new();
    let admission = layer(&clock);
    let spec = CallSpec::new("chat", "key");
    let Poll::Ready(Ok(t)) = now(admission.admit(&spec)) else {
        panic!("the first call goes")
    };
    // 180 a minute: 3 a second; a 429 for requests (none left).
    let hint = ServerHint::from_headers(
        [
            ("x-ratelimit-limit-requests", "180"),
            ("x-ratelimit-remaining-requests", "0"),
            ("retry-after", "1"),
        ],
        SystemTime::now(),
    );
    t.observe(429, &hint);
    drop(t);
    assert_eq!(windowed(&admission), ["requests"]);
}
