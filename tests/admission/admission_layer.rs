//! Admission against a throttling fake downstream that records when each
//! request started. The assertions are on those timestamps (orderings and
//! lower bounds, which a slow machine cannot break) and on counts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use backpressure::admission::{Admission, CallSpec, SlotPolicy};
use backpressure::headers::ServerHint;
use backpressure::Quota;
use backpressure::Status;

/// Lets `allowed` requests per key through per fixed window, then answers
/// 429 with `Retry-After` until the window ends. Every 2xx carries
/// `RateLimit-Remaining` / `RateLimit-Reset`, as real APIs do.
struct Fake {
    allowed: usize,
    window: Duration,
    epoch: Instant,
    starts: Mutex<Vec<Instant>>,
    windows: Mutex<HashMap<String, (u128, usize)>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    throttled: AtomicUsize,
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Answer {
    fn hint(&self) -> ServerHint {
        ServerHint::from_headers(
            self.headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
            SystemTime::now(),
        )
    }
}

impl Fake {
    fn new(allowed: usize, window: Duration) -> Arc<Self> {
        Arc::new(Self {
            allowed,
            window,
            epoch: Instant::now(),
            starts: Mutex::new(Vec::new()),
            windows: Mutex::new(HashMap::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            throttled: AtomicUsize::new(0),
        })
    }

    async fn call(&self, key: &str, latency: Duration) -> Answer {
        let now = Instant::now();
        self.starts.lock().unwrap().push(now);
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(n, Ordering::SeqCst);
        let since = now.duration_since(self.epoch).as_nanos();
        let index = since / self.window.as_nanos();
        let reset = self.window.as_nanos() - since % self.window.as_nanos();
        let reset = Duration::from_nanos(reset as u64);
        let verdict = {
            let mut w = self.windows.lock().unwrap();
            let e = w.entry(key.to_string()).or_insert((index, 0));
            if e.0 != index {
                *e = (index, 0);
            }
            if e.1 < self.allowed {
                e.1 += 1;
                Ok(self.allowed - e.1)
            } else {
                Err(())
            }
        };
        tokio::time::sleep(latency).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let ms = |d: Duration| format!("{:.3}", d.as_secs_f64());
        match verdict {
            Ok(remaining) => Answer {
                status: 200,
                headers: vec![
                    ("RateLimit-Limit".into(), self.allowed.to_string()),
                    ("RateLimit-Remaining".into(), remaining.to_string()),
                    ("RateLimit-Reset".into(), ms(reset)),
                ],
            },
            Err(()) => {
                self.throttled.fetch_add(1, Ordering::SeqCst);
                Answer {
                    status: 429,
                    headers: vec![("Retry-After".into(), ms(reset))],
                }
            }
        }
    }

    fn starts(&self) -> Vec<Instant> {
        let mut s = self.starts.lock().unwrap().clone();
        s.sort();
        s
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

/// 5 calls, 3 allowed per 0.2 s window: the third response says
/// `remaining: 0`, so calls 4 and 5 wait for the reset instead of drawing a
/// 429. Exactly 5 requests, none surfaced as rate_limited.
#[test]
fn remaining_zero_waits_for_reset_instead_of_the_next_429() {
    let fake = Fake::new(3, Duration::from_millis(200));
    let admission = Admission::builder()
        .tool("search", 1, SlotPolicy::Wait)
        .default_quota(Quota::per_second(std::num::NonZeroU32::new(1000).unwrap()))
        .build();
    let results = rt().block_on(async {
        let calls = (0..5).map(|_| {
            let (admission, fake) = (admission.clone(), fake.clone());
            tokio::spawn(async move {
                let ticket = admission.admit(&CallSpec::new("search", "key")).await?;
                let answer = fake.call("key", Duration::from_millis(5)).await;
                ticket.observe(answer.status, &answer.hint());
                Ok::<u16, backpressure::Throttled>(answer.status)
            })
        });
        let mut out = Vec::new();
        for c in calls.collect::<Vec<_>>() {
            out.push(c.await.unwrap());
        }
        out
    });
    assert!(results.iter().all(|r| r == &Ok(200)), "{results:?}");
    let starts = fake.starts();
    assert_eq!(starts.len(), 5, "exactly one request per call");
    assert_eq!(fake.throttled.load(Ordering::SeqCst), 0);
    // Requests 4 and 5 start in the next window: at least the time the
    // server said was left after request 3 finished.
    let third_window = starts[2].duration_since(fake.epoch).as_nanos() / 200_000_000;
    for s in &starts[3..] {
        let w = s.duration_since(fake.epoch).as_nanos() / 200_000_000;
        assert!(w > third_window, "request started in the exhausted window");
    }
}

/// A Retry-After beyond the call's deadline: the call is refused at once
/// and the request is never sent.
#[test]
fn retry_after_beyond_deadline_is_surfaced_and_not_sent() {
    let fake = Fake::new(100, Duration::from_secs(1));
    let admission = Admission::builder().build();
    rt().block_on(async {
        let hint = ServerHint::from_headers([("retry-after", "10")], SystemTime::now());
        assert_eq!(
            admission.observe("search", "key", 429, &hint),
            Some(Duration::from_secs(10))
        );
        let spec = CallSpec::new("search", "key").deadline(Duration::from_secs(1));
        let refused = admission.admit(&spec).await.unwrap_err();
        assert_eq!(refused.status, Status::RateLimited);
        assert_eq!(refused.scope, "api_key");
        let after = refused.retry_after_ms.unwrap();
        assert!((9_000..=10_000).contains(&after), "{after}");
        // Another credential is not held back.
        let other = admission
            .admit(&CallSpec::new("search", "other"))
            .await
            .unwrap();
        let answer = fake.call("other", Duration::ZERO).await;
        assert_eq!(answer.status, 200);
        drop(other);
    });
    assert_eq!(
        fake.starts().len(),
        1,
        "the held-back call must not be sent"
    );
}

/// A hold longer than the max honoured Retry-After is quota_exhausted.
#[test]
fn daily_quota_is_quota_exhausted() {
    let admission = Admission::builder()
        .max_retry_after(Duration::from_secs(60))
        .build();
    let hint = ServerHint::from_headers([("retry-after", "86400")], SystemTime::now());
    admission.observe("search", "key", 429, &hint);
    let refused =
        futures::executor::block_on(admission.admit(&CallSpec::new("search", "key"))).unwrap_err();
    assert_eq!(refused.status, Status::QuotaExhausted);
    assert!(!refused.status.is_retryable());
}

/// Queue full: calls are shed at once with a drain estimate, and nothing
/// waits past its deadline.
#[test]
fn full_queue_sheds_with_drain_estimate() {
    let admission = Admission::builder()
        .tool("export", 1, SlotPolicy::Queue(2))
        .expected_latency(Duration::from_millis(500))
        .build();
    rt().block_on(async {
        let holder = admission
            .admit(&CallSpec::new("export", "k"))
            .await
            .unwrap();
        let spec = CallSpec::new("export", "k").deadline(Duration::from_millis(300));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (a, s) = (admission.clone(), spec.clone());
                tokio::spawn(async move { a.admit(&s).await.map(drop) })
            })
            .collect();
        // Wait until both are queued (a count, not a timing assumption).
        while admission.waiting() < 2 {
            tokio::task::yield_now().await;
        }
        let shed = admission.admit(&spec).await.unwrap_err();
        assert_eq!(shed.status, Status::Shed);
        assert_eq!(shed.scope, "tool:export");
        // Two ahead, one slot, 500 ms each: the third starts in ~1.5 s.
        assert_eq!(shed.retry_after_ms, Some(1500));
        for w in waiters {
            let err = w.await.unwrap().unwrap_err();
            assert_eq!(err.status, Status::TimedOut);
        }
        assert_eq!(admission.waiting(), 0);
        drop(holder);
        // Everything was given back: the slot is free again.
        let again = admission.admit(&CallSpec::new("export", "k")).await;
        assert!(again.is_ok());
    });
}

/// 12 calls, capacity 4: never more than 4 in flight at the server, all 12
/// complete, one request each.
#[test]
fn twelve_calls_capacity_four() {
    let fake = Fake::new(1000, Duration::from_secs(1));
    let admission = Admission::builder()
        .tool("get_usage", 4, SlotPolicy::Wait)
        .default_quota(Quota::per_second(std::num::NonZeroU32::new(1000).unwrap()))
        .build();
    let ok = rt().block_on(async {
        let calls: Vec<_> = (0..12)
            .map(|_| {
                let (a, f) = (admission.clone(), fake.clone());
                tokio::spawn(async move {
                    let t = a.admit(&CallSpec::new("get_usage", "k")).await.unwrap();
                    let answer = f.call("k", Duration::from_millis(20)).await;
                    drop(t);
                    answer.status
                })
            })
            .collect();
        let mut ok = 0;
        for c in calls {
            ok += usize::from(c.await.unwrap() == 200);
        }
        ok
    });
    assert_eq!(ok, 12);
    assert_eq!(fake.starts().len(), 12);
    let max = fake.max_in_flight.load(Ordering::SeqCst);
    assert!(max <= 4, "max in flight {max}");
    assert!(max >= 2, "the calls never overlapped: {max}");
}

/// A saturated tool does not block another tool, and a call waiting for
/// its tool holds no global slot.
#[test]
fn saturated_tool_does_not_block_other_tools() {
    let admission = Admission::builder()
        .global_concurrency(2)
        .tool("slow", 1, SlotPolicy::Wait)
        .build();
    rt().block_on(async {
        let slow = admission.admit(&CallSpec::new("slow", "k")).await.unwrap();
        let a = admission.clone();
        let queued =
            tokio::spawn(async move { a.admit(&CallSpec::new("slow", "k")).await.map(drop) });
        while admission.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        // One global slot is still free for another tool.
        let fast = admission.admit(&CallSpec::new("fast", "k")).await.unwrap();
        drop(fast);
        drop(slow);
        assert!(queued.await.unwrap().is_ok());
    });
}

/// Dropping a waiting admit gives everything back.
#[test]
fn cancelled_admit_returns_its_place() {
    let admission = Admission::builder()
        .tool("t", 1, SlotPolicy::Wait)
        .run_budget(3)
        .build();
    rt().block_on(async {
        let holder = admission.admit(&CallSpec::new("t", "k")).await.unwrap();
        let a = admission.clone();
        let waiter = tokio::spawn(async move { a.admit(&CallSpec::new("t", "k")).await.map(drop) });
        while admission.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(admission.waiting(), 0);
        drop(holder);
        // The cancelled call's budget unit came back: two more fit.
        drop(admission.admit(&CallSpec::new("t", "k")).await.unwrap());
        drop(admission.admit(&CallSpec::new("t", "k")).await.unwrap());
        let refused = admission.admit(&CallSpec::new("t", "k")).await.unwrap_err();
        assert_eq!(refused.status, Status::BudgetExhausted);
    });
}

/// Two processes' worth of local limiters on one key: each keeps its own
/// 10/s, together they send about twice the key's rate. This is what a
/// local limiter cannot prevent (the `redis` feature can).
#[test]
fn two_local_admissions_on_one_key_exceed_its_rate() {
    let clock = backpressure::ManualClock::new();
    let make = || {
        Admission::builder()
            .clock(clock.clone())
            .default_quota(Quota::per_second(std::num::NonZeroU32::new(10).unwrap()))
            .inline_wait(Duration::ZERO)
            .build()
    };
    let (a, b) = (make(), make());
    let mut admitted = 0;
    for _ in 0..100 {
        for adm in [&a, &b] {
            if futures::executor::block_on(adm.admit(&CallSpec::new("t", "shared"))).is_ok() {
                admitted += 1;
            }
        }
        clock.advance(Duration::from_millis(10));
    }
    // One second: the key allows burst 10 + 10/s * 1 s = 20.
    let bound = 10 + 10;
    assert!(admitted > bound, "admitted {admitted}");
    assert!(admitted <= 2 * bound, "admitted {admitted}");
}

#[test]
fn little_law_helper() {
    assert_eq!(
        backpressure::admission::Builder::concurrency_for(10.0, Duration::from_millis(400)),
        4
    );
    assert_eq!(
        backpressure::admission::Builder::concurrency_for(0.5, Duration::from_millis(100)),
        1
    );
    assert_eq!(
        backpressure::admission::Builder::concurrency_for(-3.0, Duration::from_secs(1)),
        1
    );
}

#[cfg(feature = "serde")]
#[test]
fn throttled_serializes_as_the_model_reads_it() {
    let t = backpressure::Throttled::new(Status::RateLimited, "api_key", "wait for the key")
        .with_retry_after(Duration::from_millis(4200));
    assert_eq!(
        serde_json::to_string(&t).unwrap(),
        r#"{"status":"rate_limited","scope":"api_key","retry_after_ms":4200,"hint":"wait for the key"}"#
    );
    let back: backpressure::Throttled =
        serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
    assert_eq!(back, t);
    let shed = backpressure::Throttled::new(Status::BudgetExhausted, "run", "done");
    assert_eq!(
        serde_json::to_string(&shed).unwrap(),
        r#"{"status":"budget_exhausted","scope":"run","hint":"done"}"#
    );
    // Every status serializes as its wire name, and reads back.
    for status in [
        Status::RateLimited,
        Status::Shed,
        Status::TimedOut,
        Status::Closed,
        Status::BudgetExhausted,
        Status::QuotaExhausted,
        Status::Unavailable,
    ] {
        let json = serde_json::to_string(&status).unwrap();
        assert_eq!(json, format!("\"{}\"", status.as_str()));
        assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), status);
    }
    assert_eq!(Status::Unavailable.as_str(), "unavailable");
}

/// Six calls refused together on one bucket used to be told the same
/// instant, so a model re-issued them as one burst. Each is told when its
/// own turn would come: the next slot plus one period per call before it.
#[test]
fn calls_refused_together_are_told_staggered_instants() {
    use backpressure::ManualClock;
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .clock(clock.clone())
        .sleeper(clock.clone())
        .fixed_rates()
        .default_quota(Quota::per_second(std::num::NonZeroU32::new(4).unwrap()))
        .inline_wait(Duration::ZERO)
        .build();
    let spec = CallSpec::new("search", "key");
    futures::executor::block_on(async {
        // The tickets are dropped at once: only the rate is in the way.
        for _ in 0..4 {
            drop(admission.admit(&spec).await.unwrap());
        }
        let mut told = Vec::new();
        for _ in 0..6 {
            let t = admission.admit(&spec).await.unwrap_err();
            assert_eq!(t.status, Status::RateLimited);
            // The words agree with the numbers.
            let ms = t.retry_after_ms.unwrap();
            let words = if ms < 1000 {
                format!("{ms} ms")
            } else {
                format!("{} s", ms as f64 / 1000.0)
            };
            assert!(t.hint.contains(&format!("in {words}")), "{t}");
            assert!(t.hint.contains("0 ms it could still wait"), "{t}");
            told.push(t.retry_after_ms.unwrap());
        }
        assert_eq!(told, [250, 500, 750, 1000, 1250, 1500]);
        // Once the promises have passed, the bucket's own next slot again.
        clock.advance(Duration::from_secs(2));
        for _ in 0..4 {
            drop(admission.admit(&spec).await.unwrap());
        }
        assert_eq!(
            admission.admit(&spec).await.unwrap_err().retry_after_ms,
            Some(250)
        );
    });
}

/// Calls shed together by a full queue are told instants one drain step
/// apart.
#[test]
fn calls_shed_together_are_told_staggered_drain_estimates() {
    let admission = Admission::builder()
        .tool("refund", 1, SlotPolicy::FailFast)
        .expected_latency(Duration::from_millis(400))
        .build();
    let spec = CallSpec::new("refund", "key");
    futures::executor::block_on(async {
        let _running = admission.admit(&spec).await.unwrap();
        let mut told = Vec::new();
        for _ in 0..3 {
            let t = admission.admit(&spec).await.unwrap_err();
            assert_eq!(t.status, Status::Shed);
            told.push(t.retry_after_ms.unwrap());
        }
        assert!(told.windows(2).all(|w| w[1] > w[0]), "{told:?}");
        assert_eq!(told[1] - told[0], 400, "{told:?}");
    });
}

/// `Retry-After: 999999999` held a credential for ~31.7 years, and no API
/// lifted it. The hold is capped at `max_retry_after` (refusals during it
/// read `quota_exhausted`, with the server's word), and `lift_hold` ends it.
#[test]
fn a_hostile_retry_after_holds_at_most_max_retry_after_and_can_be_lifted() {
    use backpressure::ManualClock;
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .clock(clock.clone())
        .sleeper(clock.clone())
        .max_retry_after(Duration::from_secs(300))
        .build();
    let spec = CallSpec::new("search", "key");
    let hint = ServerHint::from_headers([("retry-after", "999999999")], SystemTime::now());
    // The hold applied is what observe reports (issue #40 item 7).
    assert_eq!(
        admission.observe("search", "key", 429, &hint),
        Some(Duration::from_secs(300))
    );
    futures::executor::block_on(async {
        // While it lasts, a refusal says what the server said (an
        // operator's problem, not a retry), and tells when it would be
        // admitted: the capped hold.
        let t = admission.admit(&spec).await.unwrap_err();
        assert_eq!(t.status, Status::QuotaExhausted, "{t}");
        assert_eq!(t.retry_after(), Some(Duration::from_secs(300)), "{t}");
        // But the key is held for the cap only, then probed again.
        // (3 s before its end: longer than the 2 s waited inline.)
        clock.advance(Duration::from_secs(297));
        assert!(admission.admit(&spec).await.is_err());
        clock.advance(Duration::from_secs(4));
        drop(
            admission
                .admit(&spec)
                .await
                .expect("the capped hold is over"),
        );

        admission.observe("search", "key", 429, &hint);
        assert!(admission.admit(&spec).await.is_err());
        admission.lift_hold("key");
        drop(
            admission
                .admit(&spec)
                .await
                .expect("the operator lifted it"),
        );
    });
}

/// Past 4,096 credentials a new one was never tracked (nothing learned),
/// and every admit on it cloned the whole registry. Idle credentials are
/// forgotten to make room: a gateway with 10,000 tenants keeps learning,
/// and the registry stays bounded.
#[test]
fn past_4096_credentials_idle_ones_make_room_for_new_ones() {
    use backpressure::ManualClock;
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .clock(clock.clone())
        .sleeper(clock.clone())
        .build();
    futures::executor::block_on(async {
        for i in 0..10_000 {
            let key = format!("tenant-{i}");
            drop(
                admission
                    .admit(&CallSpec::new("search", key))
                    .await
                    .unwrap(),
            );
            if i % 1_000 == 999 {
                // The tenants' buckets fill up again: they are idle.
                clock.advance(Duration::from_secs(2));
            }
        }
        assert!(
            admission.learned_rate("tenant-9999").is_some(),
            "the newest tenant was not tracked"
        );
        let tracked = admission.stats().credentials.len();
        assert!(tracked <= 4_096, "{tracked} credentials tracked");
    });
}

/// Issue #23 item 3: a trial that a later stage refuses (its tool is
/// busy) is given back at once, so the next call is the trial; a trial
/// that is never answered (its ticket dropped) is out for one cool-down
/// at most. Without that, the circuit would refuse every call for good.
#[test]
fn a_circuit_trial_refused_later_or_dropped_unanswered_is_given_back() {
    use backpressure::ManualClock;
    futures::executor::block_on(async {
        let clock = ManualClock::new();
        let admission = Admission::builder()
            .clock(clock.clone())
            .tool("search", 1, SlotPolicy::FailFast)
            .circuit_breaker(one_failure_opens())
            .build();
        let spec = CallSpec::new("search", "key");
        let other = CallSpec::new("search", "other-key");
        admission
            .admit(&spec)
            .await
            .unwrap()
            .observe(502, &ServerHint::default());
        // Another credential's call holds the tool's only slot.
        let busy = admission.admit(&other).await.unwrap();
        clock.advance(Duration::from_secs(1));
        let shed = admission.admit(&spec).await.unwrap_err();
        assert_eq!(shed.status, Status::Shed, "the trial, refused by the slots");
        drop(busy);
        // Given back: this call is the trial; dropped unanswered.
        drop(admission.admit(&spec).await.unwrap());
        // Out for one cool-down: calls are refused, told to come back a
        // tenth of it later (the trial is usually answered by then).
        let refused = admission.admit(&spec).await.unwrap_err();
        assert_eq!(refused.status, Status::Unavailable);
        assert_eq!(refused.scope, "circuit:search");
        assert_eq!(refused.retry_after_ms, Some(100));
        clock.advance(Duration::from_secs(1));
        // Lapsed: this one is the trial, and the only one.
        let trial = admission.admit(&spec).await.unwrap();
        assert_eq!(
            admission.admit(&spec).await.unwrap_err().status,
            Status::Unavailable
        );
        // A 429 is the server up: closed (the 429 holds the key for 1 s).
        trial.observe(429, &ServerHint::default());
        drop(trial);
        clock.advance(Duration::from_secs(1));
        assert!(admission.admit(&spec).await.is_ok());
        assert_eq!(admission.stats().refused.unavailable, 2);
        // Another credential has its own circuit, closed all along.
        assert!(admission.admit(&other).await.is_ok());
    });
}

/// Issue #23 item 1: with priority lanes, calls waiting at one priority
/// are served fairly across credentials (the one handed a slot from the
/// queue least recently goes next), not in arrival order: a credential
/// that queued three calls first does not make another's one call wait
/// behind all three.
/// Without lanes the same calls go first come, first served.
#[tokio::test(flavor = "current_thread")]
async fn waiting_calls_are_served_fairly_across_credentials() {
    async fn order(lanes: bool) -> Vec<&'static str> {
        let mut builder = Admission::builder().global_concurrency(1);
        if lanes {
            builder = builder.priority_lanes(1.0);
        }
        let admission = builder
            .fixed_rates()
            .default_quota(Quota::per_second(
                std::num::NonZeroU32::new(1_000_000).unwrap(),
            ))
            .build();
        let first = admission.admit(&CallSpec::new("t", "a")).await.unwrap();
        let served = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for credential in ["a", "a", "a", "b"] {
            let (layer, served) = (admission.clone(), served.clone());
            tasks.push(tokio::spawn(async move {
                let ticket = layer.admit(&CallSpec::new("t", credential)).await.unwrap();
                served.lock().unwrap().push(credential);
                tokio::task::yield_now().await;
                drop(ticket);
            }));
            // Each call queued before the next arrives.
            while admission.waiting() < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        Arc::try_unwrap(served).unwrap().into_inner().unwrap()
    }
    // Neither was handed a slot from the queue yet: arrival order first;
    // then b, served least recently, before a's next two.
    assert_eq!(order(true).await, ["a", "b", "a", "a"]);
    assert_eq!(order(false).await, ["a", "a", "a", "b"]);
}

/// Issue #40 item 3: a trial's lapse was `min(cool_down, deadline)`, and
/// a lapse equal to now counted as due: 100 calls with `deadline(0)` in
/// the half-open state let several trials through at one instant.
#[test]
fn several_half_open_trials_at_once_is_fixed_one_trial_per_instant() {
    use backpressure::ManualClock;
    futures::executor::block_on(async {
        let clock = ManualClock::new();
        let admission = Admission::builder()
            .clock(clock.clone())
            .sleeper(clock.clone())
            // No rate limit in the way: every refusal is the circuit's.
            .fixed_rates()
            .default_quota(Quota::per_second(
                std::num::NonZeroU32::new(1_000_000).unwrap(),
            ))
            .circuit_breaker(one_failure_opens())
            .build();
        let spec = CallSpec::new("search", "key").deadline(Duration::ZERO);
        let ticket = admission.admit(&spec).await.unwrap();
        ticket.observe(500, &ServerHint::default());
        drop(ticket);
        clock.advance(Duration::from_secs(1));
        let mut trials = Vec::new();
        for _ in 0..100 {
            // All at one instant.
            if let Ok(t) = admission.admit(&spec).await {
                trials.push(t);
            }
        }
        assert_eq!(trials.len(), 1, "trials let through");
    });
}

/// Issue #40 item 2: every refusal of an open circuit went through the
/// stagger, and a promise still ahead pushed each later refusal a step
/// further: a lone caller asking every 100 ms of a 1 s cool-down was
/// told 1,000 ms each time. It is told the cool-down left.
#[test]
fn the_breaker_tells_a_lone_caller_the_cool_down_left_not_more() {
    use backpressure::ManualClock;
    futures::executor::block_on(async {
        let clock = ManualClock::new();
        let admission = Admission::builder()
            .clock(clock.clone())
            .sleeper(clock.clone())
            .circuit_breaker(one_failure_opens())
            .build();
        let spec = CallSpec::new("search", "key");
        let ticket = admission.admit(&spec).await.unwrap();
        ticket.observe(500, &ServerHint::default());
        drop(ticket);
        for left in (1..=10).rev() {
            let refused = admission.admit(&spec).await.unwrap_err();
            assert_eq!(
                refused.retry_after_ms,
                Some(left * 100),
                "with {left}00 ms left"
            );
            clock.advance(Duration::from_millis(100));
        }
    });
}

/// Issue #40 item 7: `Ticket::observe` says it returns the hold applied,
/// but returned the server's wait: 999,999,999 s for a key held 300 s.
#[test]
fn observe_returns_the_servers_wait_not_the_hold_applied_is_fixed() {
    futures::executor::block_on(async {
        let admission = Admission::builder()
            .clock(backpressure::ManualClock::new())
            .build();
        let ticket = admission
            .admit(&CallSpec::new("search", "key"))
            .await
            .unwrap();
        let hint = ServerHint::from_headers([("retry-after", "999999999")], SystemTime::now());
        assert_eq!(ticket.observe(429, &hint), Some(Duration::from_secs(300)));
    });
}

/// Issue #40 item 8: a reset of 99,999,999,999 s on a 200 held the key
/// 300 s (`max_retry_after`), but callers were told 136 years.
#[test]
fn told_136_years_for_a_300_s_hold_is_fixed() {
    futures::executor::block_on(async {
        let clock = backpressure::ManualClock::new();
        let admission = Admission::builder().clock(clock.clone()).build();
        let ticket = admission
            .admit(&CallSpec::new("search", "key"))
            .await
            .unwrap();
        let hint = ServerHint::from_headers(
            [
                ("ratelimit-remaining", "0"),
                ("ratelimit-reset", "99999999999"),
            ],
            SystemTime::now(),
        );
        ticket.observe(200, &hint);
        drop(ticket);
        let refused = admission
            .admit(&CallSpec::new("search", "key"))
            .await
            .unwrap_err();
        assert_eq!(refused.status, Status::QuotaExhausted, "{refused}");
        let told = refused.retry_after().unwrap();
        assert!(told <= Duration::from_secs(300), "told {told:?}");
        // And it is true: admitted once the capped hold is over.
        clock.advance(told);
        assert!(admission
            .admit(&CallSpec::new("search", "key"))
            .await
            .is_ok());
    });
}

/// Issue #40 item 9: a reported usage of 2^40 tokens settled as
/// `u32::MAX` and held a 2,000/s quota at 0 for some 24 days. One settle
/// holds the key no longer than a server's hold may (300 s).
#[test]
fn a_bogus_usage_pins_a_quota_for_weeks_is_fixed() {
    futures::executor::block_on(async {
        let clock = backpressure::ManualClock::new();
        let admission = Admission::builder()
            .clock(clock.clone())
            .sleeper(clock.clone())
            .resource(
                "tokens",
                Quota::per_second(std::num::NonZeroU32::new(2_000).unwrap()),
            )
            .build();
        let spec = CallSpec::new("complete", "key").cost("tokens", 100);
        let mut ticket = admission.admit(&spec).await.unwrap();
        ticket.settle("tokens", u32::MAX);
        drop(ticket);
        assert!(admission.admit(&spec).await.is_err());
        clock.advance(Duration::from_secs(301));
        assert!(
            admission.admit(&spec).await.is_ok(),
            "still held 301 s later"
        );
    });
}

/// Calls an open circuit refuses together are told distinct instants a
/// tenth of the cool-down apart, all within one cool-down past its end:
/// no wave when it closes, and no drift (issue #40 item 2).
#[test]
fn calls_refused_together_by_an_open_circuit_are_spread_within_one_cool_down() {
    futures::executor::block_on(async {
        let (_clock, admission) = breaker_layer();
        let spec = CallSpec::new("search", "key");
        admission
            .admit(&spec)
            .await
            .unwrap()
            .observe(500, &ServerHint::default());
        let mut told = Vec::new();
        for _ in 0..25 {
            let refused = admission.admit(&spec).await.unwrap_err();
            told.push(refused.retry_after_ms.unwrap());
        }
        assert_eq!(
            &told[..10],
            &[1_000, 1_100, 1_200, 1_300, 1_400, 1_500, 1_600, 1_700, 1_800, 1_900]
        );
        assert!(
            told.iter().all(|&ms| (1_000..2_000).contains(&ms)),
            "{told:?}"
        );
    });
}

/// Polls `fut` once with a waker that does nothing.
fn poll_once<F: std::future::Future + Unpin>(fut: &mut F) -> std::task::Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
    std::pin::Pin::new(fut).poll(&mut cx)
}

/// Issue #40 item 11: `waiting()` counted the calls queued for a slot but
/// not the background calls sleeping for their turn in their class's
/// share of the rate (0 while 19 waited).
#[test]
fn waiting_missed_calls_waiting_for_their_background_turn_is_fixed() {
    use backpressure::admission::Priority;
    let clock = backpressure::ManualClock::new();
    let admission = Admission::builder()
        .clock(clock.clone())
        .sleeper(clock.clone())
        .fixed_rates()
        .default_quota(Quota::per_second(std::num::NonZeroU32::new(10).unwrap()))
        .priority_lanes(0.5)
        .background_rate_share(0.5)
        .inline_wait(Duration::from_secs(30))
        .build();
    let spec = CallSpec::new("sync", "key")
        .priority(Priority::BACKGROUND)
        .deadline(Duration::from_secs(30));
    let mut calls: Vec<_> = (0..20).map(|_| Box::pin(admission.admit(&spec))).collect();
    let mut pending = 0;
    for call in calls.iter_mut() {
        pending += usize::from(poll_once(call).is_pending());
    }
    assert!(pending >= 10, "{pending} waiting for their turn");
    assert_eq!(admission.waiting(), pending);
    drop(calls);
    assert_eq!(
        admission.waiting(),
        0,
        "a dropped call is no longer counted"
    );
}

/// Issue #40 item 11: a call that got its slot only at its deadline (the
/// call ahead of it held it that long) was refused `rate_limited`, "this
/// call's slot is in 500 ms, after its deadline". It timed out waiting.
#[test]
fn a_slot_that_comes_free_at_the_deadline_is_timed_out_not_rate_limited() {
    let clock = backpressure::ManualClock::new();
    let admission = Admission::builder()
        .clock(clock.clone())
        .sleeper(clock.clone())
        .fixed_rates()
        .default_quota(Quota::per_second(std::num::NonZeroU32::new(1).unwrap()))
        .tool("search", 1, SlotPolicy::Wait)
        .build();
    let first =
        futures::executor::block_on(admission.admit(&CallSpec::new("search", "key"))).unwrap();
    let spec = CallSpec::new("search", "key").deadline(Duration::from_millis(500));
    let mut second = Box::pin(admission.admit(&spec));
    assert!(poll_once(&mut second).is_pending());
    clock.advance(Duration::from_millis(500));
    drop(first);
    let std::task::Poll::Ready(Err(t)) = poll_once(&mut second) else {
        panic!("the second call should be refused at its deadline")
    };
    assert_eq!(t.status, Status::TimedOut, "{t}");
}

/// A breaker that opens on one failure, for a second.
fn one_failure_opens() -> backpressure::admission::CircuitBreaker {
    backpressure::admission::CircuitBreaker::new()
        .consecutive_failures(1)
        .cool_down(Duration::from_secs(1))
}

/// Issue #40 item 4, through the layer: while the trial is out, the 200
/// of a call admitted before the circuit opened does not close it; the
/// trial's own 200 does.
#[test]
fn a_stale_answer_decided_the_half_open_state_is_fixed() {
    futures::executor::block_on(async {
        let (clock, admission) = breaker_layer();
        let spec = CallSpec::new("search", "key");
        let stale = admission.admit(&spec).await.unwrap();
        admission
            .admit(&spec)
            .await
            .unwrap()
            .observe(500, &ServerHint::default());
        clock.advance(Duration::from_secs(1));
        let trial = admission.admit(&spec).await.unwrap();
        stale.observe(200, &ServerHint::default());
        drop(stale);
        let refused = admission.admit(&spec).await.unwrap_err();
        assert_eq!(
            refused.status,
            Status::Unavailable,
            "the trial is still out"
        );
        trial.observe(200, &ServerHint::default());
        drop(trial);
        assert!(
            admission.admit(&spec).await.is_ok(),
            "the trial's answer closed it"
        );
    });
}

/// A layer on a manual clock whose circuits open on one failure.
fn breaker_layer() -> (
    backpressure::ManualClock,
    Admission<backpressure::DefaultSleeper, backpressure::ManualClock>,
) {
    let clock = backpressure::ManualClock::new();
    let admission = Admission::builder()
        .clock(clock.clone())
        .circuit_breaker(one_failure_opens())
        .build();
    (clock, admission)
}

/// Issue #40 item 11: a call shed by a full pool was told the mean hold of
/// the calls that had finished (99 ms) while the calls in flight had hung
/// for seconds. With every slot taken and none given back for longer than
/// the mean hold, the estimate is at least that long.
#[test]
fn a_shed_call_is_not_told_the_mean_hold_while_the_calls_in_flight_hang() {
    use backpressure::ManualClock;
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .clock(clock.clone())
        .sleeper(clock.clone())
        .tool("export", 1, SlotPolicy::FailFast)
        .expected_latency(Duration::from_millis(100))
        .build();
    let spec = CallSpec::new("export", "k");
    futures::executor::block_on(async {
        // Quick calls: the mean hold is 100 ms.
        for _ in 0..8 {
            let ticket = admission.admit(&spec).await.unwrap();
            clock.advance(Duration::from_millis(100));
            drop(ticket);
        }
        let told = |t: backpressure::Throttled| {
            assert_eq!(t.status, Status::Shed, "{t}");
            t.retry_after().unwrap()
        };
        // A call that hangs: shed at once, the estimate is the mean hold.
        let hung = admission.admit(&spec).await.unwrap();
        let quick = told(admission.admit(&spec).await.unwrap_err());
        assert_eq!(quick, Duration::from_millis(100));
        // Five seconds later it still holds the slot: not 100 ms any more.
        clock.advance(Duration::from_secs(5));
        let later = told(admission.admit(&spec).await.unwrap_err());
        assert!(later >= Duration::from_secs(5), "told {later:?}");
        let stats = admission.stats();
        let export = stats.tools.iter().find(|t| t.name == "export").unwrap();
        assert!(
            export.drain_estimate >= Duration::from_secs(5),
            "{export:?}"
        );
        assert_eq!(export.mean_hold, Duration::from_millis(100));
        drop(hung);
    });
}

/// A builder on a manual clock (its sleeper too) with fixed rates: what
/// the slot tests below start from.
fn on_manual_clock() -> (
    backpressure::ManualClock,
    backpressure::admission::Builder<backpressure::ManualClock, backpressure::ManualClock>,
) {
    let clock = backpressure::ManualClock::new();
    let builder = Admission::builder()
        .clock(clock.clone())
        .sleeper(clock.clone())
        .fixed_rates();
    (clock, builder)
}

/// cargo-mutants (issue #40): a tool's stats count the calls queued for
/// its slots (`Pool::waiting` could return 0 with no test noticing).
#[test]
fn a_tools_stats_count_the_calls_queued_for_its_slots() {
    let (_clock, builder) = on_manual_clock();
    let admission = builder.tool("export", 1, SlotPolicy::Wait).build();
    let spec = CallSpec::new("export", "k").deadline(Duration::from_secs(30));
    let export = || {
        let stats = admission.stats();
        let t = stats.tools.iter().find(|t| t.name == "export").unwrap();
        (t.in_flight, t.waiting)
    };
    let held = futures::executor::block_on(admission.admit(&spec)).unwrap();
    let mut calls: Vec<_> = (0..3).map(|_| Box::pin(admission.admit(&spec))).collect();
    for call in calls.iter_mut() {
        assert!(poll_once(call).is_pending());
    }
    assert_eq!(export(), (1, 3));
    drop(calls);
    assert_eq!(export(), (1, 0));
    drop(held);
    assert_eq!(export(), (0, 0));
}

/// cargo-mutants (issue #40): a background call that the background cap
/// holds back until its deadline says so (scope `global:background`, the
/// cap in its words); a share of the whole pool is no cap, and a call
/// that waited for the pool itself is not told it was the cap.
#[test]
fn a_background_call_held_back_by_the_cap_says_so() {
    use backpressure::admission::Priority;
    for (share, held, capped) in [(0.5, 2, true), (1.0, 4, false)] {
        let (clock, builder) = on_manual_clock();
        let admission = builder.global_concurrency(4).priority_lanes(share).build();
        let spec = CallSpec::new("crawl", "k")
            .priority(Priority::BACKGROUND)
            .deadline(Duration::from_millis(500));
        let tickets: Vec<_> = (0..held)
            .map(|i| match poll_once(&mut Box::pin(admission.admit(&spec))) {
                std::task::Poll::Ready(r) => r.unwrap(),
                std::task::Poll::Pending => panic!("share {share}: call {i} waits"),
            })
            .collect();
        let mut waiting = Box::pin(admission.admit(&spec));
        assert!(poll_once(&mut waiting).is_pending(), "share {share}");
        clock.advance(Duration::from_millis(500));
        let std::task::Poll::Ready(Err(t)) = poll_once(&mut waiting) else {
            panic!("share {share}: refused at its deadline")
        };
        assert_eq!(t.status, Status::TimedOut, "{t}");
        assert_eq!(t.scope == "global:background", capped, "share {share}: {t}");
        if capped {
            assert!(t.hint.contains("at most 2 of the 4 global slots"), "{t}");
        }
        drop(tickets);
    }
}

/// cargo-mutants (issue #40): a call that takes its tool's slot and then
/// finds the global pool full follows its tool's policy there: fail-fast
/// is shed at once and gives its tool slot back; a bounded queue waits
/// for the global slot (the global pool has no per-tool bound).
#[test]
fn a_tool_slot_taken_before_a_full_global_pool_is_given_back_or_kept_waiting() {
    let (_clock, builder) = on_manual_clock();
    let admission = builder
        .global_concurrency(1)
        .tool("fast", 2, SlotPolicy::FailFast)
        .tool("queued", 2, SlotPolicy::Queue(0))
        .build();
    let in_flight = |name: &str| {
        let stats = admission.stats();
        stats
            .tools
            .iter()
            .find(|t| t.name == name)
            .unwrap()
            .in_flight
    };
    let spec = |tool| CallSpec::new(tool, "k").deadline(Duration::from_secs(30));
    let (other, fast, queued) = (spec("other"), spec("fast"), spec("queued"));
    let hog = futures::executor::block_on(admission.admit(&other)).unwrap();
    let std::task::Poll::Ready(Err(t)) = poll_once(&mut Box::pin(admission.admit(&fast))) else {
        panic!("fail-fast: shed at once")
    };
    assert_eq!(t.status, Status::Shed, "{t}");
    assert_eq!(in_flight("fast"), 0, "its tool slot was given back");
    let mut queued = Box::pin(admission.admit(&queued));
    assert!(
        poll_once(&mut queued).is_pending(),
        "waits for the global slot"
    );
    assert_eq!(in_flight("queued"), 1);
    drop(hog);
    let std::task::Poll::Ready(Ok(ticket)) = poll_once(&mut queued) else {
        panic!("admitted once the global slot is free")
    };
    drop(ticket);
}

/// cargo-mutants (issue #40): with priority lanes, a call whose wait ends
/// without a slot (its deadline passed) leaves its lane: the slot that
/// comes free next goes to a live call, not to the one that gave up.
#[test]
fn a_lane_waiter_that_times_out_leaves_its_lane() {
    let (clock, builder) = on_manual_clock();
    let admission = builder.global_concurrency(1).priority_lanes(1.0).build();
    let spec = CallSpec::new("search", "k").deadline(Duration::from_millis(500));
    let held = futures::executor::block_on(admission.admit(&spec)).unwrap();
    let mut gives_up = Box::pin(admission.admit(&spec));
    assert!(poll_once(&mut gives_up).is_pending());
    clock.advance(Duration::from_millis(500));
    assert!(matches!(
        poll_once(&mut gives_up),
        std::task::Poll::Ready(Err(_))
    ));
    drop(held);
    let std::task::Poll::Ready(Ok(next)) = poll_once(&mut Box::pin(admission.admit(&spec))) else {
        panic!("the free slot went to the call that gave up")
    };
    assert_eq!(admission.stats().in_flight, 1);
    drop(next);
    assert_eq!(admission.stats().in_flight, 0);
}

/// cargo-mutants (issue #40): a 429 that says nothing holds the key for
/// `RetryPolicy::BARE_429_HOLD`, so the next call is not the one to find
/// out the same way (a guard on the status could go unnoticed).
#[test]
fn a_bare_429_holds_the_key_for_the_bare_hold() {
    use backpressure::retry::RetryPolicy;
    let (clock, builder) = on_manual_clock();
    let admission = builder.build();
    let spec = CallSpec::new("search", "k");
    let t = futures::executor::block_on(admission.admit(&spec)).unwrap();
    t.observe(429, &ServerHint::default());
    drop(t);
    let hurried = CallSpec::new("search", "k").deadline(Duration::from_millis(10));
    let refused = futures::executor::block_on(admission.admit(&hurried)).unwrap_err();
    assert_eq!(refused.status, Status::RateLimited, "{refused}");
    assert_eq!(refused.retry_after(), Some(RetryPolicy::BARE_429_HOLD));
    clock.advance(RetryPolicy::BARE_429_HOLD);
    assert!(futures::executor::block_on(admission.admit(&hurried)).is_ok());
}

/// cargo-mutants (issue #40): `reset_run` resets each tool's budget too,
/// not only the run's.
#[test]
fn reset_run_gives_each_tool_its_budget_back() {
    let (_clock, builder) = on_manual_clock();
    let admission = builder.tool_budget("search", 1).build();
    let spec = CallSpec::new("search", "k");
    drop(futures::executor::block_on(admission.admit(&spec)).unwrap());
    let refused = futures::executor::block_on(admission.admit(&spec)).unwrap_err();
    assert_eq!(refused.status, Status::BudgetExhausted, "{refused}");
    admission.reset_run();
    assert!(futures::executor::block_on(admission.admit(&spec)).is_ok());
}

/// cargo-mutants (issue #40): `Debug` shows the global cap and the queue
/// bound as configured.
#[test]
fn debug_shows_the_global_cap_and_the_queue_bound() {
    let (_clock, builder) = on_manual_clock();
    let admission = builder.global_concurrency(7).queue_capacity(9).build();
    let shown = format!("{admission:?}");
    assert!(
        shown.contains("global_cap: 7") && shown.contains("queue_capacity: 9"),
        "{shown}"
    );
}

/// cargo-mutants (issue #40): only a background call that timed out on
/// the global pool is told the background cap held it; an interactive
/// call timing out there, or a background one on its tool's pool, is told
/// its own pool.
#[test]
fn only_a_background_call_at_the_global_pool_is_told_the_background_cap() {
    use backpressure::admission::Priority;
    let soon = Duration::from_millis(500);
    // Interactive, on a full global pool with a background cap.
    let (clock, builder) = on_manual_clock();
    let admission = builder.global_concurrency(1).priority_lanes(0.5).build();
    let held = futures::executor::block_on(admission.admit(&CallSpec::new("chat", "k"))).unwrap();
    let hurried = CallSpec::new("chat", "k").deadline(soon);
    let mut waiting = Box::pin(admission.admit(&hurried));
    assert!(poll_once(&mut waiting).is_pending());
    clock.advance(soon);
    let std::task::Poll::Ready(Err(t)) = poll_once(&mut waiting) else {
        panic!("refused at its deadline")
    };
    assert_eq!(
        (t.status, t.scope.as_str()),
        (Status::TimedOut, "global"),
        "{t}"
    );
    drop(held);
    // Background, on its tool's full pool.
    let (clock, builder) = on_manual_clock();
    let admission = builder
        .global_concurrency(4)
        .priority_lanes(0.5)
        .tool("crawl", 1, SlotPolicy::Queue(4))
        .build();
    let spec = CallSpec::new("crawl", "k")
        .priority(Priority::BACKGROUND)
        .deadline(soon);
    let held = futures::executor::block_on(admission.admit(&spec)).unwrap();
    let mut waiting = Box::pin(admission.admit(&spec));
    assert!(poll_once(&mut waiting).is_pending());
    clock.advance(soon);
    let std::task::Poll::Ready(Err(t)) = poll_once(&mut waiting) else {
        panic!("refused at its deadline")
    };
    assert_eq!(
        (t.status, t.scope.as_str()),
        (Status::TimedOut, "tool:crawl"),
        "{t}"
    );
    drop(held);
}

/// cargo-mutants (issue #40): `observe_error` counts as a failure for the
/// breaker, and `report` returns the hold as `observe` does.
#[test]
fn an_error_opens_the_breaker_and_report_returns_the_hold() {
    use backpressure::admission::CircuitBreaker;
    let (_clock, builder) = on_manual_clock();
    let admission = builder
        .circuit_breaker(CircuitBreaker::new().consecutive_failures(1))
        .build();
    let spec = CallSpec::new("search", "k");
    let t = futures::executor::block_on(admission.admit(&spec)).unwrap();
    assert_eq!(
        format!("{t:?}"),
        r#"Ticket { tool: "search", credential: "<redacted>", .. }"#
    );
    t.observe_error();
    drop(t);
    let refused = futures::executor::block_on(admission.admit(&spec)).unwrap_err();
    assert_eq!(refused.status, Status::Unavailable, "{refused}");

    let (_clock, builder) = on_manual_clock();
    let admission = builder.build();
    let t = futures::executor::block_on(admission.admit(&spec)).unwrap();
    let hint = ServerHint::from_headers([("retry-after", "30")], SystemTime::now());
    let held = futures::executor::block_on(t.report(429, &hint));
    assert_eq!(held, Some(Duration::from_secs(30)));
}

/// cargo-mutants (issue #40): a dropped ticket gives its global slot back
/// to its own class: two background calls dropped let two more in at
/// once; an interactive call dropped does not make room for a third
/// background one.
#[test]
fn a_dropped_ticket_gives_its_slot_back_to_its_own_class() {
    use backpressure::admission::Priority;
    let (_clock, builder) = on_manual_clock();
    // Background calls hold at most 2 of the 4 global slots.
    let admission = builder.global_concurrency(4).priority_lanes(0.5).build();
    let bg = CallSpec::new("crawl", "k").priority(Priority::BACKGROUND);
    let admit_now = |spec: &CallSpec| match poll_once(&mut Box::pin(admission.admit(spec))) {
        std::task::Poll::Ready(r) => Some(r.unwrap()),
        std::task::Poll::Pending => None,
    };
    let first: Vec<_> = (0..2)
        .map(|_| admit_now(&bg).expect("under the cap"))
        .collect();
    drop(first);
    let held: Vec<_> = (0..2)
        .map(|_| admit_now(&bg).expect("given back"))
        .collect();
    let interactive = admit_now(&CallSpec::new("chat", "k")).expect("a free slot");
    drop(interactive);
    assert!(admit_now(&bg).is_none(), "the background cap is still full");
    drop(held);
}

/// cargo-mutants (issue #40): a ticket's hold is measured from when it
/// was admitted, so a pool whose calls take a second tells a shed call
/// about a second, not nothing.
#[test]
fn a_shed_call_is_told_the_hold_the_calls_before_it_took() {
    let (clock, builder) = on_manual_clock();
    let admission = builder.tool("t", 1, SlotPolicy::FailFast).build();
    let spec = CallSpec::new("t", "k");
    for _ in 0..3 {
        let t = futures::executor::block_on(admission.admit(&spec)).unwrap();
        clock.advance(Duration::from_secs(1));
        drop(t);
    }
    let _held = futures::executor::block_on(admission.admit(&spec)).unwrap();
    let shed = futures::executor::block_on(admission.admit(&spec)).unwrap_err();
    assert_eq!(shed.status, Status::Shed, "{shed}");
    let told = shed.retry_after().expect("a shed call is told when");
    assert!(told >= Duration::from_millis(500), "{shed}");
}

/// cargo-mutants (issue #40): a background call's send time is its
/// admission instant, not the instant with its class bit (`started`
/// masks it off; `|` to `&` in the mask read it as ~2^63 ns, later than
/// any cut): a background call's 429 to a request sent before the rate
/// was cut does not cut it again.
#[test]
fn a_background_calls_stale_429_does_not_cut_the_learned_rate_twice() {
    use backpressure::admission::Priority;
    use backpressure::ManualClock;
    futures::executor::block_on(async {
        let clock = ManualClock::new();
        let ten = Quota::per_second(std::num::NonZeroU32::new(10).unwrap());
        let admission = Admission::builder()
            .clock(clock.clone())
            .quota("key", ten)
            .background_rate_share(0.5)
            .inline_wait(Duration::ZERO)
            .build();
        let crawl = CallSpec::new("crawl", "key").priority(Priority::BACKGROUND);
        let stale = admission.admit(&crawl).await.unwrap();
        clock.advance(Duration::from_millis(500));
        let search = admission
            .admit(&CallSpec::new("search", "key"))
            .await
            .unwrap();
        clock.advance(Duration::from_millis(200));
        let guess = admission.learned_rate("key").unwrap();
        search.observe(429, &ServerHint::default());
        let cut = admission.learned_rate("key").unwrap();
        assert!(cut < guess, "{cut} after {guess}");
        // Sent 500 ms before the call that cut it: the same news.
        stale.observe(429, &ServerHint::default());
        assert_eq!(admission.learned_rate("key"), Some(cut));
    });
}

/// cargo-mutants (issue #40): interactive calls draw nothing on the
/// background share of the rate (the share's guard was `||` of three
/// conditions; `&&` made every call take a background turn), and a
/// credential shared across processes is not split at all.
#[test]
fn interactive_calls_and_a_shared_credential_take_no_background_turn() {
    use backpressure::admission::Priority;
    use backpressure::{ManualClock, TokenBucket};
    futures::executor::block_on(async {
        let ten = Quota::per_second(std::num::NonZeroU32::new(10).unwrap());
        let shared = std::sync::Arc::new(TokenBucket::with_clock(ten, ManualClock::new()));
        let admission = Admission::builder()
            .clock(ManualClock::new())
            .quota("key", ten)
            .fixed_rates()
            .background_rate_share(0.2)
            .global_concurrency(64)
            .default_tool(64, backpressure::admission::SlotPolicy::Wait)
            .shared_quota("org", shared.clone())
            .inline_wait(Duration::ZERO)
            .build();
        let mut held = Vec::new();
        for i in 0..5 {
            let t = admission.admit(&CallSpec::new("search", "key")).await;
            held.push(t.unwrap_or_else(|e| panic!("interactive call {i}: {e}")));
        }
        // The background share (2 at once) is still whole.
        let crawl = CallSpec::new("crawl", "key").priority(Priority::BACKGROUND);
        for i in 0..2 {
            let t = admission.admit(&crawl).await;
            held.push(t.unwrap_or_else(|e| panic!("background call {i}: {e}")));
        }
        assert_eq!(
            admission.admit(&crawl).await.unwrap_err().scope,
            "api_key:background"
        );
        // On the shared credential, background calls take the shared
        // quota's cells, 10 of them, not a local share of 2.
        let org = CallSpec::new("crawl", "org").priority(Priority::BACKGROUND);
        for i in 0..10 {
            let t = admission.admit(&org).await;
            held.push(t.unwrap_or_else(|e| panic!("shared background call {i}: {e}")));
        }
        assert_eq!(shared.available(), 0);
    });
}

/// cargo-mutants (issue #40): a trial with no time of its own (deadline
/// 0) is out for a tenth of the cool-down, so a call 50 ms later (of a
/// 1 s cool-down) is refused, not a second trial (`/ 10` as `% 10` gave
/// it 1 ns); and a failure opens the circuit at the instant it is seen,
/// on a clock far from 0 (it was read only for failures: reading none
/// opened it at 0, already past).
#[test]
fn a_deadline_zero_trial_is_out_a_tenth_of_the_cool_down_on_a_late_clock() {
    use backpressure::ManualClock;
    futures::executor::block_on(async {
        let clock = ManualClock::starting_at(1_000_000_000_000);
        let admission = Admission::builder()
            .clock(clock.clone())
            .sleeper(clock.clone())
            .fixed_rates()
            .default_quota(Quota::per_second(
                std::num::NonZeroU32::new(1_000_000).unwrap(),
            ))
            .circuit_breaker(one_failure_opens())
            .build();
        let spec = CallSpec::new("search", "key").deadline(Duration::ZERO);
        let ticket = admission.admit(&spec).await.unwrap();
        ticket.observe(500, &ServerHint::default());
        drop(ticket);
        let refused = admission.admit(&spec).await.unwrap_err();
        assert_eq!(
            refused.retry_after_ms,
            Some(1_000),
            "open for the cool-down"
        );
        clock.advance(Duration::from_secs(1));
        let trial = admission.admit(&spec).await.unwrap();
        clock.advance(Duration::from_millis(50));
        assert!(
            admission.admit(&spec).await.is_err(),
            "the trial is still out"
        );
        clock.advance(Duration::from_millis(50));
        assert!(admission.admit(&spec).await.is_ok(), "its tenth lapsed");
        drop(trial);
    });
}

/// Issue #59 item 6: `global_concurrency(usize::MAX)` (and a tool cap of
/// `usize::MAX`) panicked in `build`. Clamped to the semaphore's most,
/// it admits as many calls as asked.
#[test]
fn no_panic_building_a_layer_with_usize_max_slots() {
    use backpressure::admission::SlotPolicy;
    let admission = Admission::builder()
        .global_concurrency(usize::MAX)
        .tool("search", usize::MAX, SlotPolicy::FailFast)
        .default_tool(usize::MAX, SlotPolicy::FailFast)
        .fixed_rates()
        .default_quota(Quota::per_second(std::num::NonZeroU32::new(1_000).unwrap()))
        .build();
    futures::executor::block_on(async {
        let mut held = Vec::new();
        for tool in ["search", "other"] {
            for _ in 0..50 {
                held.push(admission.admit(&CallSpec::new(tool, "key")).await.unwrap());
            }
        }
        assert_eq!(held.len(), 100);
        assert_eq!(admission.stats().in_flight, 100);
    });
}
