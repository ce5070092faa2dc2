//! `Runner`: coalescing, retries and surfacing, asserted on the requests a
//! fake server saw (counts and start-time orderings), never on durations.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use backpressure::admission::{Admission, Call, CallFailure, CallResult, CallSpec, Reply, Runner};
use backpressure::headers::ServerHint;
use backpressure::retry::Backoff;
use backpressure::Provenance;
use backpressure::Status;

/// A scripted answer: status and headers.
type Answer = (u16, Vec<(&'static str, String)>);

/// Answers each request from a script of statuses (then 200s), recording
/// when each request started.
#[derive(Default)]
struct Script {
    statuses: Mutex<Vec<Answer>>,
    starts: Mutex<Vec<Instant>>,
    sent: AtomicUsize,
}

impl Script {
    fn new(statuses: Vec<Answer>) -> Arc<Self> {
        Arc::new(Self {
            statuses: Mutex::new(statuses.into_iter().rev().collect()),
            ..Default::default()
        })
    }

    fn call(self: &Arc<Self>, spec: CallSpec, key: Option<&str>) -> Call<String> {
        let me = self.clone();
        let call = Call::new(spec, move || {
            let me = me.clone();
            async move {
                me.starts.lock().unwrap().push(Instant::now());
                let n = me.sent.fetch_add(1, Ordering::SeqCst);
                let (status, headers) = me.statuses.lock().unwrap().pop().unwrap_or((200, vec![]));
                tokio::time::sleep(Duration::from_millis(5)).await;
                let hint = ServerHint::from_headers(
                    headers.iter().map(|(n, v)| (*n, v.as_bytes())),
                    SystemTime::now(),
                );
                Ok(Reply::new(status, format!("reply {n}")).with_hint(hint))
            }
        });
        match key {
            Some(k) => call.coalesce_key(k),
            None => call,
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

#[test]
fn identical_reads_share_one_request_writes_never_do() {
    let script = Script::new(vec![]);
    let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::from_secs(3));
    let results = rt().block_on(runner.execute(vec![
        script.call(CallSpec::new("search", "k"), Some("q=refund")),
        script.call(CallSpec::new("search", "k"), Some("q=refund")),
        script.call(CallSpec::new("search", "k"), Some("q=billing")),
        script.call(CallSpec::new("refund", "k").write(), Some("id=1")),
        script.call(CallSpec::new("refund", "k").write(), Some("id=1")),
    ]));
    // 2 distinct reads + 2 writes.
    assert_eq!(script.sent.load(Ordering::SeqCst), 4);
    assert_eq!(results[0].value(), results[1].value());
    let provenances: Vec<_> = results[..2]
        .iter()
        .map(|r| match r {
            CallResult::Done { provenance, .. } => *provenance,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(provenances.contains(&Provenance::Leader));
    assert!(provenances.contains(&Provenance::Joined) || provenances.contains(&Provenance::Cached));
    assert_ne!(
        results[3].value(),
        results[4].value(),
        "writes were coalesced"
    );

    // Within the TTL the same read is served from the turn's cache...
    let again = rt().block_on(runner.execute(vec![
        script.call(CallSpec::new("search", "k"), Some("q=refund")),
    ]));
    assert!(matches!(
        again[0],
        CallResult::Done {
            provenance: Provenance::Cached,
            ..
        }
    ));
    assert_eq!(script.sent.load(Ordering::SeqCst), 4);
    // ...until the turn ends.
    runner.clear_cache();
    rt().block_on(runner.execute(vec![
        script.call(CallSpec::new("search", "k"), Some("q=refund")),
    ]));
    assert_eq!(script.sent.load(Ordering::SeqCst), 5);
}

#[test]
fn a_429_is_retried_after_retry_after_invisibly() {
    let script = Script::new(vec![(429, vec![("retry-after", "0.2".into())])]);
    let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::ZERO);
    let results =
        rt().block_on(runner.execute(vec![script.call(CallSpec::new("search", "k"), None)]));
    assert!(
        matches!(results[0], CallResult::Done { attempts: 2, .. }),
        "{results:?}"
    );
    let starts = script.starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 2);
    // The retry started no earlier than Retry-After after the first
    // request (which answered after it started).
    assert!(starts[1].duration_since(starts[0]) >= Duration::from_millis(200));
}

#[test]
fn a_long_retry_after_is_surfaced_not_slept() {
    let script = Script::new(vec![(429, vec![("retry-after", "30".into())])]);
    let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::ZERO);
    let results =
        rt().block_on(runner.execute(vec![script.call(CallSpec::new("search", "k"), None)]));
    let t = results[0].throttled().expect("surfaced");
    assert_eq!(t.status, Status::RateLimited);
    assert_eq!(t.scope, "api_key");
    assert!(t.retry_after_ms.unwrap() > 29_000);
    assert_eq!(script.sent.load(Ordering::SeqCst), 1, "no second request");
}

/// Issue #59 item 6: `Retry-After: 99999999999` told the caller that got
/// it 4,294,967,295 s, while the layer holds the key 300 s at most and
/// told every later caller 5 min. Each is told when it would be admitted.
#[test]
fn no_caller_is_told_a_wait_past_the_layers_cap_on_holds() {
    let script = Script::new(vec![(429, vec![("retry-after", "99999999999".into())])]);
    let admission = Admission::builder().build();
    let runner: Runner<String> = Runner::new(admission.clone(), Duration::ZERO);
    let results =
        rt().block_on(runner.execute(vec![script.call(CallSpec::new("search", "k"), None)]));
    let first = results[0].throttled().expect("surfaced");
    assert_eq!(first.status, Status::QuotaExhausted, "{first}");
    let told = first.retry_after_ms.unwrap();
    assert!((299_000..=300_000).contains(&told), "told {told} ms");
    let later =
        futures::executor::block_on(admission.admit(&CallSpec::new("search", "k"))).unwrap_err();
    assert_eq!(later.status, first.status);
    assert!(
        later.retry_after_ms.unwrap() <= told,
        "{later} after {first}"
    );
    assert_eq!(script.sent.load(Ordering::SeqCst), 1);
}

#[test]
fn transient_failures_retry_within_the_deadline_then_fail() {
    // Three 503s, backoff 300 ms fixed, deadline 500 ms: the first retry fits,
    // the second would pass the deadline and is not slept. A bare 503 is a
    // fault, not a rate limit: the call fails with it, saying why it stopped.
    let script = Script::new(vec![(503, vec![]), (503, vec![]), (503, vec![])]);
    let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::ZERO).retries(
        Backoff::new(Duration::from_millis(300), Duration::from_millis(300))
            .jitter(backpressure::retry::Jitter::None),
        5,
    );
    let spec = CallSpec::new("search", "k").deadline(Duration::from_millis(500));
    let results = rt().block_on(runner.execute(vec![script.call(spec, None)]));
    match &results[0] {
        CallResult::Failed {
            error: CallFailure::Status { status: 503 },
            not_retried: Some(t),
            attempts: 2,
        } => assert_eq!(t.status, Status::TimedOut, "{t}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(script.sent.load(Ordering::SeqCst), 2);
}

#[test]
fn results_come_back_in_input_order() {
    let script = Script::new(vec![]);
    let runner: Runner<String> = Runner::new(Admission::builder().build(), Duration::ZERO);
    let calls = (0..6)
        .map(|i| script.call(CallSpec::new(format!("tool{i}"), "k"), None))
        .collect();
    let results = rt().block_on(runner.execute(calls));
    assert_eq!(results.len(), 6);
    assert!(results.iter().all(|r| r.value().is_some()));
}

/// The scenario through the runner: 5 calls, 3 allowed per window,
/// the server saying so in its headers: exactly 5 requests, none surfaced.
#[test]
fn five_calls_three_allowed_through_the_runner() {
    let reset = || {
        vec![
            ("ratelimit-remaining", "0".to_string()),
            ("ratelimit-reset", "0.2".to_string()),
        ]
    };
    let script = Script::new(vec![
        (200, vec![("ratelimit-remaining", "2".into())]),
        (200, vec![("ratelimit-remaining", "1".into())]),
        (200, reset()),
    ]);
    let admission = Admission::builder()
        .tool("search", 1, backpressure::admission::SlotPolicy::Wait)
        .build();
    let runner: Runner<String> = Runner::new(admission, Duration::ZERO);
    let calls = (0..5)
        .map(|_| script.call(CallSpec::new("search", "k"), None))
        .collect();
    let results = rt().block_on(runner.execute(calls));
    assert!(results.iter().all(|r| r.value().is_some()), "{results:?}");
    let starts = script.starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 5);
    assert!(starts[3].duration_since(starts[2]) >= Duration::from_millis(200));
    assert!(starts[4] >= starts[3]);
}

/// Issue #23, item 4: a server answering 503 to everything. Each call's
/// own cap (3 retries) would send 4 requests a call; a shared budget of
/// 20% of first attempts (no floor) holds the whole turn to
/// (1 + 0.2) x calls, and every call still ends with its last answer.
#[test]
fn a_retry_budget_holds_a_storm_of_503s_to_its_ratio() {
    use backpressure::retry::{RetryBudget, RetryPolicy};
    const CALLS: usize = 40;
    let run = |budget: Option<Arc<RetryBudget>>| {
        let script = Script::new(vec![(503, vec![]); 4 * CALLS]);
        let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(2));
        let mut policy = RetryPolicy::new(backoff).max_retries(3);
        if let Some(b) = budget {
            policy = policy.budget(b);
        }
        // No rate limit of our own: only the retry policy shapes traffic.
        let admission = Admission::builder()
            .global_concurrency(64)
            .default_tool(64, backpressure::admission::SlotPolicy::Wait)
            .fixed_rates()
            .default_quota(backpressure::Quota::per_second(
                std::num::NonZeroU32::new(1_000_000).unwrap(),
            ))
            .build();
        let runner: Runner<String> = Runner::new(admission, Duration::ZERO).retry_policy(policy);
        let calls = (0..CALLS)
            .map(|_| script.call(CallSpec::new("search", "k").write(), None))
            .collect();
        let results = rt().block_on(runner.execute(calls));
        let failed = results
            .iter()
            .filter(|r| {
                matches!(
                    r,
                    CallResult::Failed {
                        error: CallFailure::Status { status: 503 },
                        ..
                    }
                )
            })
            .count();
        (script.sent.load(Ordering::SeqCst), failed)
    };
    let (unbudgeted, failed) = run(None);
    assert_eq!((unbudgeted, failed), (4 * CALLS, CALLS));
    let budget = Arc::new(RetryBudget::new(0.2, 0, Duration::from_secs(60)));
    let (sent, failed) = run(Some(budget));
    assert_eq!(failed, CALLS, "every call ends with its 503");
    assert!(sent >= CALLS, "every call was sent once: {sent}");
    // And the budget paid for some: 20% of 40 first attempts.
    assert!(sent > CALLS, "the budget paid for no retry: {sent}");
    assert!(
        sent <= CALLS + CALLS / 5,
        "{sent} requests for {CALLS} calls"
    );
}
