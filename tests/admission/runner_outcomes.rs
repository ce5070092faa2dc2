//! What a call ends as, and when its requests start, on a manual clock:
//! the regressions of issue #10 items 3, 10, 14, 15, 16, 17 and 19.
//!
//! Every test drives the runner by hand: poll, then move the manual clock
//! by 1 ms, so request start times are exact and nothing depends on how
//! fast this machine is.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use backpressure::admission::{
    Admission, Call, CallFailure, CallResult, CallSpec, Reply, Runner, SlotPolicy,
};
use backpressure::headers::ServerHint;
use backpressure::Status;
use backpressure::{ManualClock, Quota, Sleeper};

const MS: u64 = 1_000_000;

/// One scripted answer: a status with headers, or a transport error.
type Answer = Result<(u16, Vec<(&'static str, &'static str)>), &'static str>;

/// A fake server on the manual clock: answers from a script (then 200),
/// after `latency`, recording each request's start time (ms).
struct Fake {
    sleeper: ManualClock,
    latency: Duration,
    script: Mutex<Vec<Answer>>,
    starts: Mutex<Vec<u64>>,
    sent: AtomicUsize,
}

impl Fake {
    fn new(sleeper: &ManualClock, latency: Duration, script: Vec<Answer>) -> Arc<Self> {
        Arc::new(Self {
            sleeper: sleeper.clone(),
            latency,
            script: Mutex::new(script.into_iter().rev().collect()),
            starts: Mutex::new(Vec::new()),
            sent: AtomicUsize::new(0),
        })
    }

    fn call(self: &Arc<Self>, spec: CallSpec) -> Call<u64> {
        let me = self.clone();
        Call::new(spec, move || {
            let me = me.clone();
            async move {
                let start = me.sleeper.now_nanos_ms();
                me.starts.lock().unwrap().push(start);
                me.sent.fetch_add(1, Ordering::SeqCst);
                let answer = me.script.lock().unwrap().pop().unwrap_or(Ok((200, vec![])));
                me.sleeper.sleep(me.latency).await;
                match answer {
                    Ok((status, headers)) => {
                        let hint = ServerHint::from_headers(headers, std::time::SystemTime::now());
                        Ok(Reply::new(status, start).with_hint(hint))
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        })
    }

    fn starts(&self) -> Vec<u64> {
        self.starts.lock().unwrap().clone()
    }
}

trait Millis {
    fn now_nanos_ms(&self) -> u64;
}

impl Millis for ManualClock {
    fn now_nanos_ms(&self) -> u64 {
        use backpressure::Clock;
        self.now_nanos() / MS
    }
}

/// Polls `fut` to completion, moving the manual clock 1 ms between polls
/// (at most `limit_ms` of simulated time).
fn drive<F: Future>(sleeper: &ManualClock, limit_ms: u64, fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    for _ in 0..limit_ms {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        sleeper.advance(Duration::from_millis(1));
    }
    panic!("not done after {limit_ms} simulated ms");
}

fn manual() -> (ManualClock, ManualClock) {
    let clock = ManualClock::new();
    (clock.clone(), clock)
}

fn per_second(n: u32, burst: u32) -> Quota {
    Quota::per_second(NonZeroU32::new(n).unwrap()).allow_burst(NonZeroU32::new(burst).unwrap())
}

/// Item 14: a 429 that outlasts the retries was `Failed { status: 429 }`.
#[test]
fn a_429_that_outlasts_the_retries_is_throttled_not_failed() {
    let (clock, sleeper) = manual();
    let ra = || Ok((429, vec![("retry-after", "1")]));
    let fake = Fake::new(
        &sleeper,
        Duration::from_millis(5),
        vec![ra(), ra(), ra(), ra(), ra()],
    );
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock)
        .build();
    let runner: Runner<u64, String, _, _> = Runner::new(admission, Duration::ZERO);
    let results = drive(
        &sleeper,
        60_000,
        runner.execute(vec![fake.call(CallSpec::new("search", "k"))]),
    );
    let t = results[0]
        .throttled()
        .unwrap_or_else(|| panic!("{results:?}"));
    assert_eq!(t.status, Status::RateLimited);
    assert_eq!(t.scope, "api_key");
    assert_eq!(t.retry_after_ms, Some(1000));
    assert_eq!(
        t.attempts, 4,
        "the requests it sent travel with the refusal"
    );
    // 1 + 3 retries, each after the server's hold.
    let starts = fake.starts();
    assert_eq!(starts.len(), 4, "{starts:?}");
    for w in starts.windows(2) {
        assert!(
            w[1] >= w[0] + 5 + 1000,
            "a retry started inside the hold: {starts:?}"
        );
    }
}

/// Item 15: calls booked at 10/s against a 4/s server kept starting inside
/// the server's `Retry-After` hold after a 429.
#[test]
fn no_booked_call_starts_inside_the_servers_hold() {
    let (clock, sleeper) = manual();
    // The second request (at 100 ms) is throttled for 1 s; its reply lands
    // at 150 ms, while the calls booked at 200, 300 and 400 ms sleep.
    let fake = Fake::new(
        &sleeper,
        Duration::from_millis(50),
        vec![Ok((200, vec![])), Ok((429, vec![("retry-after", "1")]))],
    );
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock)
        .default_quota(per_second(10, 1))
        .tool("search", 8, SlotPolicy::Wait)
        .build();
    let runner: Runner<u64, String, _, _> = Runner::new(admission, Duration::ZERO);
    let calls = (0..5)
        .map(|_| fake.call(CallSpec::new("search", "k")))
        .collect();
    let results = drive(&sleeper, 60_000, runner.execute(calls));
    assert!(results.iter().all(|r| r.value().is_some()), "{results:?}");
    let starts = fake.starts();
    assert_eq!(starts.len(), 6, "5 calls + 1 retry: {starts:?}");
    let hold = 150..1150;
    assert!(
        starts.iter().all(|s| !hold.contains(s)),
        "a request started inside the hold {hold:?}: {starts:?}"
    );
    // After the hold, the quota spaces them again: no burst at 1150 ms.
    let mut after: Vec<u64> = starts.iter().copied().filter(|s| *s >= 1150).collect();
    after.sort_unstable();
    assert_eq!(after.len(), 4, "{starts:?}");
    for w in after.windows(2) {
        assert!(w[1] - w[0] >= 99, "bunched after the hold: {after:?}");
    }
}

/// Item 16: with the server down, retries that did not fit the inline wait
/// came back as `rate_limited` on `api_key`, and "connection refused" was
/// lost.
#[test]
fn a_refused_connection_is_never_rate_limited() {
    let (clock, sleeper) = manual();
    let refused = || Err("connection refused");
    let fake = Fake::new(
        &sleeper,
        Duration::from_millis(1),
        (0..64).map(|_| refused()).collect(),
    );
    // A tight quota, so retries are refused by our own limiter.
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock)
        .default_quota(per_second(1, 2))
        .inline_wait(Duration::from_millis(200))
        .build();
    let runner: Runner<u64, String, _, _> = Runner::new(admission, Duration::ZERO);
    let calls = (0..8)
        .map(|_| fake.call(CallSpec::new("search", "k")))
        .collect();
    let results = drive(&sleeper, 120_000, runner.execute(calls));
    for r in &results {
        match r {
            CallResult::Failed {
                error: CallFailure::Transport(e),
                ..
            } => assert_eq!(e.as_str(), "connection refused"),
            // A call never sent (its first admit was refused) is throttled
            // by our quota: that one is a rate limit of ours.
            CallResult::Throttled(t) => {
                assert_eq!(t.status, Status::RateLimited);
            }
            other => panic!("{other:?}"),
        }
    }
    let sent: u32 = results
        .iter()
        .map(|r| match r {
            CallResult::Failed { attempts, .. } => *attempts,
            _ => 0,
        })
        .sum();
    assert_eq!(sent as usize, fake.sent.load(Ordering::SeqCst));
    // Every call that sent something failed with the transport error.
    assert!(results
        .iter()
        .filter(|r| matches!(r, CallResult::Failed { .. }))
        .all(|r| !matches!(r, CallResult::Throttled(_))));
    assert!(results
        .iter()
        .any(|r| matches!(r, CallResult::Failed { attempts, .. } if *attempts >= 1)));
}

/// Item 17: `attempts` was 0 on every `Failed` of a coalesced read.
#[test]
fn failed_reports_the_requests_it_sent() {
    let (clock, sleeper) = manual();
    let fake = Fake::new(
        &sleeper,
        Duration::from_millis(1),
        vec![Ok((404, vec![])), Ok((500, vec![])), Ok((500, vec![]))],
    );
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock)
        .build();
    let runner: Runner<u64, String, _, _> = Runner::new(admission, Duration::ZERO).retries(
        backpressure::retry::Backoff::new(Duration::from_millis(10), Duration::from_millis(10)),
        1,
    );
    let read = |k: &str| fake.call(CallSpec::new("get", "k")).coalesce_key(k);
    let results = drive(&sleeper, 10_000, runner.execute(vec![read("a")]));
    assert!(
        matches!(
            results[0],
            CallResult::Failed {
                error: CallFailure::Status { status: 404 },
                attempts: 1,
                ..
            }
        ),
        "{results:?}"
    );
    // Two identical reads: the leader sent 2 (500, retry, 500); the
    // follower joined and sent none.
    let results = drive(&sleeper, 10_000, runner.execute(vec![read("b"), read("b")]));
    let attempts: Vec<u32> = results
        .iter()
        .map(|r| match r {
            CallResult::Failed {
                error: CallFailure::Status { status: 500 },
                attempts,
                ..
            } => *attempts,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(attempts, [2, 0]);
    assert_eq!(fake.sent.load(Ordering::SeqCst), 3);
}

/// Item 10: one call's panic escaped `execute`, and every other result of
/// the turn was lost.
#[test]
fn a_panicking_call_is_contained_and_the_turn_completes() {
    let (clock, sleeper) = manual();
    let fake = Fake::new(&sleeper, Duration::from_millis(1), vec![]);
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock)
        .global_concurrency(2)
        .build();
    let runner: Runner<u64, String, _, _> = Runner::new(admission, Duration::ZERO);
    let boom = |key: Option<&str>| {
        let call = Call::new(CallSpec::new("get", "k"), || async {
            panic!("tool exploded");
            #[allow(unreachable_code)]
            Ok(Reply::new(200, 0u64))
        });
        match key {
            Some(k) => call.coalesce_key(k),
            None => call,
        }
    };
    let calls = vec![
        fake.call(CallSpec::new("get", "k")),
        boom(None),
        boom(Some("x")),
        boom(Some("x")),
        fake.call(CallSpec::new("get", "k")),
    ];
    let results = drive(&sleeper, 10_000, runner.execute(calls));
    assert!(results[0].value().is_some(), "{results:?}");
    assert!(results[4].value().is_some(), "{results:?}");
    for r in &results[1..4] {
        match r {
            CallResult::Panicked { message } => assert!(message.contains("tool exploded")),
            other => panic!("{other:?}"),
        }
    }
    // The slots came back: two calls fit the global cap of 2 again.
    let again = drive(
        &sleeper,
        10_000,
        runner.execute(vec![
            fake.call(CallSpec::new("get", "k")),
            fake.call(CallSpec::new("get", "k")),
        ]),
    );
    assert!(again.iter().all(|r| r.value().is_some()));
}

/// Item 3: `close()` woke nobody; a waiting call reported `timed_out` at its
/// deadline.
#[test]
fn close_wakes_every_waiting_admit_and_keeps_tickets_valid() {
    let (clock, sleeper) = manual();
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock)
        .tool("slot", 1, SlotPolicy::Wait)
        .default_quota(per_second(1, 1))
        .build();
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let held = futures::executor::block_on(admission.admit(&CallSpec::new("slot", "a")))
        .expect("first call");
    let rate = futures::executor::block_on(admission.admit(&CallSpec::new("other", "b")))
        .expect("b's token");
    // One call waits for the tool slot, one sleeps for b's next token.
    let (slot_spec, token_spec) = (CallSpec::new("slot", "a"), CallSpec::new("other", "b"));
    let mut for_slot = pin!(admission.admit(&slot_spec));
    let mut for_token = pin!(admission.admit(&token_spec));
    assert!(for_slot.as_mut().poll(&mut cx).is_pending());
    assert!(for_token.as_mut().poll(&mut cx).is_pending());
    sleeper.advance(Duration::from_millis(100));
    assert!(for_slot.as_mut().poll(&mut cx).is_pending());
    assert!(for_token.as_mut().poll(&mut cx).is_pending());

    admission.close();
    // The next poll answers, with no time passing.
    for fut in [
        for_slot.as_mut().poll(&mut cx),
        for_token.as_mut().poll(&mut cx),
    ] {
        match fut {
            Poll::Ready(Err(t)) => assert_eq!(t.status, Status::Closed),
            other => panic!("{:?}", other.map(|r| r.map(|_| ()))),
        }
    }
    // Tickets already issued stay valid.
    assert_eq!(held.tool(), "slot");
    let hint = ServerHint::from_headers([("retry-after", "1")], std::time::SystemTime::now());
    assert!(rate.observe(429, &hint).is_some());
    drop((held, rate));
    let after = futures::executor::block_on(admission.admit(&CallSpec::new("new_tool", "c")));
    assert_eq!(after.unwrap_err().status, Status::Closed);
}

/// Item 19: only `Throttled` serialized; a harness wrote the JSON of done and
/// failed calls by hand.
#[cfg(feature = "serde")]
#[test]
fn every_call_result_serializes_with_a_status() {
    use backpressure::Provenance;
    use backpressure::Throttled;
    let done: CallResult<&str> = CallResult::Done {
        value: "[#1]",
        provenance: Provenance::Joined,
        attempts: 0,
    };
    assert_eq!(
        serde_json::to_value(&done).unwrap(),
        serde_json::json!({"status": "done", "value": "[#1]", "provenance": "joined", "attempts": 0})
    );
    let throttled: CallResult<&str> = CallResult::Throttled(
        Throttled::new(Status::RateLimited, "api_key", "wait")
            .with_retry_after(Duration::from_millis(1500)),
    );
    assert_eq!(
        serde_json::to_value(&throttled).unwrap(),
        serde_json::json!({"status": "rate_limited", "scope": "api_key", "retry_after_ms": 1500, "hint": "wait"})
    );
    let failed: CallResult<&str> = CallResult::Failed {
        error: CallFailure::Transport(Arc::new("connection refused".into())),
        not_retried: None,
        attempts: 2,
    };
    assert_eq!(
        serde_json::to_value(&failed).unwrap(),
        serde_json::json!({"status": "failed", "http_status": 0, "error": "connection refused", "attempts": 2})
    );
    // A status, and the refusal of its retry, as one more object.
    let refused: CallResult<&str> = CallResult::Failed {
        error: CallFailure::Status { status: 503 },
        not_retried: Some(Throttled::new(Status::TimedOut, "deadline", "no time left")),
        attempts: 1,
    };
    assert_eq!(
        serde_json::to_value(&refused).unwrap(),
        serde_json::json!({
            "status": "failed", "http_status": 503, "error": "the server answered 503", "attempts": 1,
            "not_retried": {"status": "timed_out", "scope": "deadline", "hint": "no time left"}
        })
    );
    let panicked: CallResult<&str> = CallResult::Panicked {
        message: "boom".into(),
    };
    assert_eq!(
        serde_json::to_value(&panicked).unwrap(),
        serde_json::json!({"status": "panicked", "message": "boom"})
    );
}

/// The caller's own transport error: not `Clone`, compared by identity.
#[derive(Debug)]
struct Refused {
    port: u16,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "connection refused on port {}", self.port)
    }
}

impl std::error::Error for Refused {}

/// Issue #12 item 2: a transport error reached the caller as a `String`
/// (`AttemptFuture<V>` was `Result<Reply<V>, String>`). It is now the
/// caller's type, and coalesced followers share the leader's one value.
#[test]
fn a_transport_error_reaches_the_caller_typed_and_shared_by_followers() {
    let (clock, sleeper) = manual();
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock)
        .build();
    let runner: Runner<u64, Refused, _, _> = Runner::new(admission, Duration::ZERO);
    let sent = Arc::new(AtomicUsize::new(0));
    let read = || {
        let (sent, sleeper) = (sent.clone(), sleeper.clone());
        Call::new(CallSpec::new("get", "k"), move || {
            let (sent, sleeper) = (sent.clone(), sleeper.clone());
            async move {
                sent.fetch_add(1, Ordering::SeqCst);
                sleeper.sleep(Duration::from_millis(1)).await;
                Err::<Reply<u64>, _>(Refused { port: 8080 })
            }
        })
        .coalesce_key("a")
    };
    let results = drive(&sleeper, 60_000, runner.execute(vec![read(), read()]));
    let (errors, attempts): (Vec<_>, Vec<_>) = results
        .iter()
        .map(|r| match r {
            CallResult::Failed {
                error: CallFailure::Transport(e),
                not_retried: None,
                attempts,
            } => (e.clone(), *attempts),
            other => panic!("{other:?}"),
        })
        .unzip();
    assert_eq!(errors[0].port, 8080);
    assert!(Arc::ptr_eq(&errors[0], &errors[1]), "one error, shared");
    // The leader sent 1 + 3 retries; the follower joined.
    assert_eq!(attempts, [4, 0]);
    assert_eq!(sent.load(Ordering::SeqCst), 4);
    let failure = results[0].failure().unwrap();
    assert_eq!(failure.to_string(), "connection refused on port 8080");
    assert!(std::error::Error::source(failure).is_some());
}

/// Issue #12 item 1: the retry cap lived in `Runner` and in `RetryPolicy`,
/// and a server's wait was judged by the admission's inline wait, not by
/// the policy's clamp. The policy given to the runner is now the one
/// setting for both: 5 s fits its 10 s clamp, so the call sleeps it and
/// retries (the 2 s inline wait made it `rate_limited` before), and its
/// cap of 1 retry is the only cap.
#[test]
fn the_runners_policy_is_the_one_cap_and_clamp() {
    use backpressure::retry::RetryPolicy;
    let (clock, sleeper) = manual();
    let ra = || Ok((429, vec![("retry-after", "5")]));
    let fake = Fake::new(&sleeper, Duration::from_millis(5), vec![ra(), ra(), ra()]);
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock)
        .build();
    let policy = RetryPolicy::default()
        .max_retries(1)
        .clamp(Duration::from_secs(10));
    let runner: Runner<u64, String, _, _> =
        Runner::new(admission, Duration::ZERO).retry_policy(policy);
    let results = drive(
        &sleeper,
        60_000,
        runner.execute(vec![fake.call(CallSpec::new("search", "k"))]),
    );
    let t = results[0]
        .throttled()
        .unwrap_or_else(|| panic!("{results:?}"));
    assert_eq!(t.status, Status::RateLimited);
    assert_eq!(t.retry_after_ms, Some(5000));
    let starts = fake.starts();
    assert_eq!(starts.len(), 2, "1 + the policy's 1 retry: {starts:?}");
    assert!(starts[1] >= starts[0] + 5 + 5000, "{starts:?}");

    // Beyond the clamp: surfaced at once, nothing slept.
    let fake = Fake::new(&sleeper, Duration::from_millis(5), vec![ra()]);
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(sleeper.clone())
        .build();
    let tight = RetryPolicy::default().clamp(Duration::from_secs(1));
    let runner: Runner<u64, String, _, _> =
        Runner::new(admission, Duration::ZERO).retry_policy(tight);
    let results = drive(
        &sleeper,
        1_000,
        runner.execute(vec![fake.call(CallSpec::new("search", "k"))]),
    );
    assert_eq!(results[0].throttled().unwrap().status, Status::RateLimited);
    assert_eq!(fake.starts().len(), 1);
}

/// Issue #10 item 3, through the runner: `close()` during a retry's wait
/// ends the call at the next poll, as a failure with `closed` as the reason
/// after a fault, as `closed` itself after a 429.
#[test]
fn close_during_a_retry_wait_ends_the_call_at_once() {
    let (clock, sleeper) = manual();
    let fake = Fake::new(
        &sleeper,
        Duration::from_millis(1),
        vec![Ok((503, vec![])), Ok((429, vec![("retry-after", "1.5")]))],
    );
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock)
        .build();
    let runner: Runner<u64, String, _, _> = Runner::new(admission, Duration::ZERO).retries(
        backpressure::retry::Backoff::new(Duration::from_secs(10), Duration::from_secs(10))
            .jitter(backpressure::retry::Jitter::None),
        3,
    );
    // Two credentials, so neither call waits for the other's token.
    let spec = |key: &str| CallSpec::new("get", key).deadline(Duration::from_secs(60));
    let mut turn = pin!(runner.execute(vec![fake.call(spec("a")), fake.call(spec("b"))]));
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    for _ in 0..100 {
        assert!(turn.as_mut().poll(&mut cx).is_pending());
        sleeper.advance(Duration::from_millis(1));
    }
    assert_eq!(fake.sent.load(Ordering::SeqCst), 2, "both in their waits");
    runner.admission().close();
    let Poll::Ready(results) = turn.as_mut().poll(&mut cx) else {
        panic!("close did not end the waits")
    };
    match &results[0] {
        CallResult::Failed {
            error: CallFailure::Status { status: 503 },
            not_retried: Some(t),
            attempts: 1,
        } => assert_eq!(t.status, Status::Closed),
        other => panic!("{other:?}"),
    }
    assert_eq!(results[1].throttled().unwrap().status, Status::Closed);
    assert_eq!(fake.sent.load(Ordering::SeqCst), 2);
}

/// A request that never answers held the call past its deadline (the
/// deadline bounded only the waits). It is dropped at the deadline: the
/// call is `timed_out` with the one request it sent, and nothing retries.
#[test]
fn a_request_that_never_answers_is_dropped_at_the_deadline() {
    let (clock, sleeper) = manual();
    let admission = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock.clone())
        .build();
    let runner: Runner<u64, String, _, _> = Runner::new(admission.clone(), Duration::ZERO);
    let sent = Arc::new(AtomicUsize::new(0));
    let s = sent.clone();
    let call = Call::new(
        CallSpec::new("search", "k").deadline(Duration::from_millis(300)),
        move || {
            s.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<Reply<u64>, String>>()
        },
    );
    let result = drive(&sleeper, 10_000, runner.one(call));
    let t = result.throttled().unwrap_or_else(|| panic!("{result:?}"));
    assert_eq!(
        (t.status, t.scope.as_str(), t.attempts),
        (Status::TimedOut, "deadline", 1)
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    // Answered at the deadline, not later.
    use backpressure::Clock;
    assert!(
        clock.now_nanos() <= 301 * MS,
        "{} ms",
        clock.now_nanos() / MS
    );
    assert_eq!(admission.stats().in_flight, 0, "the ticket came back");
}
