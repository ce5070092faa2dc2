//! Issue #11 through the whole layer: `Runner` + `Admission`, told nothing
//! about the server's limit, against a simulated GCRA server (R/s, burst 2,
//! `429` + `Retry-After: 1`, no limit headers) on a manual clock. Eight
//! callers run a closed loop for 30 simulated seconds, each waiting out a
//! `Throttled`'s `retry_after_ms` as a model would.
//!
//! Asserted on what the server saw (counts), never on wall time:
//! achieved >= 92% of R and <= 5% of requests answered 429, for R below
//! and above the starting guess of 10/s; and the old fixed default storms
//! the slow server (the regression this fixes).

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::Duration;

use backpressure::admission::{Admission, Call, CallResult, CallSpec, Reply, Runner, SlotPolicy};
use backpressure::headers::ServerHint;
use backpressure::{Clock, ManualClock, Sleeper};

const MS: u64 = 1_000_000;
const SECONDS: u64 = 30;
const CALLERS: usize = 8;

/// GCRA at `rate`/s with a burst of 2 (or `burst`), on the manual clock.
struct Server {
    clock: ManualClock,
    period: u64,
    burst: u64,
    tat: Mutex<u64>,
    requests: AtomicU64,
    throttled: AtomicU64,
}

impl Server {
    fn new(clock: &ManualClock, rate: f64) -> Arc<Self> {
        Self::with_burst(clock, rate, 2)
    }

    /// nginx's `limit_req burst=b` lets `b + 1` through at once.
    fn with_burst(clock: &ManualClock, rate: f64, burst: u64) -> Arc<Self> {
        Arc::new(Self {
            clock: clock.clone(),
            period: (1e9 / rate) as u64,
            burst,
            tat: Mutex::new(0),
            requests: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
        })
    }

    fn admit(&self) -> bool {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let now = self.clock.now_nanos();
        let mut tat = self.tat.lock().unwrap();
        let t = (*tat).max(now);
        if t + self.period - now <= self.burst * self.period {
            *tat = t + self.period;
            true
        } else {
            self.throttled.fetch_add(1, Ordering::SeqCst);
            false
        }
    }
}

/// One request to the simulated server: a 5 ms round trip, and `429` +
/// `Retry-After: 1` when it refuses.
fn fetch(spec: CallSpec, server: &Arc<Server>, sleeper: &ManualClock) -> Call<u16, String> {
    let (server, sleeper) = (server.clone(), sleeper.clone());
    Call::new(spec, move || {
        let (server, sleeper) = (server.clone(), sleeper.clone());
        async move {
            let ok = server.admit();
            sleeper.sleep(Duration::from_millis(5)).await;
            if ok {
                Ok(Reply::new(200, 200))
            } else {
                let hint =
                    ServerHint::from_headers([("retry-after", "1")], std::time::SystemTime::now());
                Ok(Reply::new(429, 429).with_hint(hint))
            }
        }
    })
}

struct Outcome {
    requests: u64,
    ok: u64,
    throttled: u64,
    failed: u64,
}

fn run(rate: f64, fixed: bool) -> Outcome {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let server = Server::new(&clock, rate);
    let builder = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock.clone())
        .tool("fetch", CALLERS, SlotPolicy::Wait);
    let admission = if fixed {
        builder.fixed_rates().build()
    } else {
        builder.build()
    };
    let runner: Runner<u16, String, _, _> = Runner::new(admission, Duration::ZERO);
    let end = SECONDS * 1_000 * MS;
    let failed = AtomicU64::new(0);
    let caller = || async {
        while clock.now_nanos() < end {
            let call = fetch(CallSpec::new("fetch", "key"), &server, &sleeper);
            match runner.one(call).await {
                CallResult::Done { .. } => {}
                CallResult::Throttled(t) => {
                    let wait = t.retry_after().unwrap_or(Duration::from_secs(1));
                    sleeper.sleep(wait).await;
                }
                _ => {
                    failed.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    };
    let all = futures::future::join_all((0..CALLERS).map(|_| caller()));
    let mut all = pin!(all);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    // 1 ms steps; the loops stop at `end`, the last calls finish after it.
    for _ in 0..(SECONDS + 10) * 1_000 {
        if all.as_mut().poll(&mut cx).is_ready() {
            break;
        }
        sleeper.advance(Duration::from_millis(1));
    }
    assert!(
        all.as_mut().poll(&mut cx).is_ready(),
        "callers did not finish"
    );
    let requests = server.requests.load(Ordering::SeqCst);
    let throttled = server.throttled.load(Ordering::SeqCst);
    Outcome {
        requests,
        ok: requests - throttled,
        throttled,
        failed: failed.load(Ordering::SeqCst),
    }
}

fn share(o: &Outcome, rate: f64) -> f64 {
    o.ok as f64 / (rate * SECONDS as f64)
}

fn report(label: &str, rate: f64, o: &Outcome) {
    println!(
        "{label:>8} R={rate:>4}: requests {:>5}, 429s {:>4} ({:>4.1}%), failed {}, achieved {:>5.1}% of R",
        o.requests,
        o.throttled,
        100.0 * o.throttled as f64 / o.requests.max(1) as f64,
        o.failed,
        100.0 * share(o, rate)
    );
}

#[test]
fn told_nothing_the_layer_learns_a_slow_servers_rate_without_a_429_storm() {
    for rate in [2.0, 4.0] {
        let o = run(rate, false);
        report("adaptive", rate, &o);
        assert_eq!(o.failed, 0, "a 429 is never a failure");
        assert!(
            o.throttled as f64 <= 0.05 * o.requests as f64,
            "R={rate}: {} of {} requests were 429s",
            o.throttled,
            o.requests
        );
        assert!(
            share(&o, rate) >= 0.92,
            "R={rate}: {:.2} of R",
            share(&o, rate)
        );
    }
}

#[test]
fn told_nothing_the_layer_uses_a_fast_servers_capacity() {
    for rate in [25.0, 40.0] {
        let o = run(rate, false);
        report("adaptive", rate, &o);
        assert_eq!(o.failed, 0);
        assert!(
            o.throttled as f64 <= 0.05 * o.requests as f64,
            "R={rate}: {} of {} requests were 429s",
            o.throttled,
            o.requests
        );
        assert!(
            share(&o, rate) >= 0.92,
            "R={rate}: {:.2} of R",
            share(&o, rate)
        );
    }
}

/// The regression: the fixed default of 10/s storms a 4/s server and
/// leaves a 25/s server mostly idle.
#[test]
fn a_fixed_default_rate_storms_slow_servers_and_starves_fast_ones() {
    let slow = run(4.0, true);
    report("fixed", 4.0, &slow);
    assert!(
        slow.throttled as f64 > 0.2 * slow.requests as f64,
        "{} of {}",
        slow.throttled,
        slow.requests
    );
    let fast = run(25.0, true);
    report("fixed", 25.0, &fast);
    assert!(share(&fast, 25.0) < 0.5, "{:.2}", share(&fast, 25.0));
}

/// One turn: `calls` calls at once through `Runner::execute` (deadline
/// 30 s), told nothing. Returns the simulated makespan, the server's counts,
/// the calls done, and the rate learned at the end.
struct Turn {
    makespan: Duration,
    requests: u64,
    throttled: u64,
    done: usize,
    learned: f64,
}

fn turn(rate: f64, calls: usize, quota: Option<backpressure::Quota>) -> Turn {
    turn_on(2, rate, calls, quota)
}

/// [`turn`] against a server letting `burst` through at once.
fn turn_on(burst: u64, rate: f64, calls: usize, quota: Option<backpressure::Quota>) -> Turn {
    let clock = ManualClock::new();
    let sleeper = clock.clone();
    let server = Server::with_burst(&clock, rate, burst);
    let mut builder = Admission::builder()
        .sleeper(sleeper.clone())
        .clock(clock.clone())
        .tool("fetch", CALLERS, SlotPolicy::Wait);
    if let Some(q) = quota {
        builder = builder.default_quota(q);
    }
    let runner: Runner<u16, String, _, _> = Runner::new(builder.build(), Duration::ZERO);
    let done = AtomicU64::new(0);
    // Each call is re-issued after a refusal's `retry_after_ms`, as a
    // model told "rate_limited" would, until it is done.
    let call = || async {
        loop {
            let spec = CallSpec::new("fetch", "key")
                .write()
                .deadline(Duration::from_secs(30));
            let call = fetch(spec, &server, &sleeper);
            match runner.one(call).await {
                CallResult::Done { .. } => {
                    done.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                CallResult::Throttled(t) => {
                    let wait = t.retry_after().unwrap_or(Duration::from_secs(1));
                    sleeper.sleep(wait).await;
                }
                _ => return,
            }
        }
    };
    let all = futures::future::join_all((0..calls).map(|_| call()));
    let mut all = pin!(all);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    while all.as_mut().poll(&mut cx).is_pending() {
        assert!(clock.now_nanos() < 120_000 * MS, "the turn did not finish");
        sleeper.advance(Duration::from_millis(1));
    }
    let requests = server.requests.load(Ordering::SeqCst);
    Turn {
        makespan: Duration::from_nanos(clock.now_nanos()),
        requests,
        throttled: server.throttled.load(Ordering::SeqCst),
        done: done.load(Ordering::SeqCst) as usize,
        learned: runner.admission().learned_rate("key").unwrap_or(0.0),
    }
}

fn report_turn(label: &str, rate: f64, t: &Turn) {
    println!(
        "{label:>8} R={rate:>4}: makespan {:>5.2} s, requests {:>3}, 429s {:>2}, done {}, learned {:.2}",
        t.makespan.as_secs_f64(),
        t.requests,
        t.throttled,
        t.done,
        t.learned
    );
}

fn guess() -> Option<backpressure::Quota> {
    Some(backpressure::Quota::per_second(
        std::num::NonZeroU32::new(10).unwrap(),
    ))
}

/// Issue #20, item 7: `Quota::per_second(10)` implies a burst of 10; the
/// learned bucket bursts no more than the server is believed to allow, so
/// against a 4/s server the guess costs no more 429s than no quota (it
/// cost 7 to none's 1 when the burst went out as given), and a cut no
/// longer forgets the cells of reservations that still go after the hold.
#[test]
fn a_guessed_quota_costs_no_more_429s_than_none() {
    let none = turn(4.0, 60, None);
    let guessed = turn(4.0, 60, guess());
    report_turn("none", 4.0, &none);
    report_turn("guess", 4.0, &guessed);
    assert_eq!((none.done, guessed.done), (60, 60));
    assert!(
        guessed.throttled <= none.throttled,
        "guess {} 429s, none {}",
        guessed.throttled,
        none.throttled
    );
    // The guess is a ceiling: above the server's rate it is learned down.
    assert!((guessed.learned - 4.0).abs() <= 0.6, "{}", guessed.learned);
}

/// Issue #20, item 8: learn within one turn. 60 calls, told nothing,
/// against a server at R (burst 2, `Retry-After: 1`), each refused call
/// re-issued when its `retry_after_ms` says: at most 10% of requests are
/// 429s, the learned rate ends within 15% of R, and the turn ends within
/// 1.3x of the best a client that obeys one `Retry-After` can do: the hold,
/// then (calls - 2 bursts) / R.
#[test]
fn one_turn_learns_the_servers_rate() {
    for rate in [4.0, 25.0] {
        let t = turn(rate, 60, None);
        report_turn("none", rate, &t);
        assert_eq!(t.done, 60);
        assert!(
            t.throttled as f64 <= 0.1 * t.requests as f64,
            "R={rate}: {} of {}",
            t.throttled,
            t.requests
        );
        assert!(
            (t.learned - rate).abs() <= 0.15 * rate,
            "R={rate}: learned {}",
            t.learned
        );
        let best = 1.0 + (60.0 - 4.0) / rate;
        assert!(
            t.makespan.as_secs_f64() <= 1.3 * best,
            "R={rate}: {:?} against a best of {best:.2} s",
            t.makespan
        );
    }
}

/// Issue #41, item 2: nginx's `limit_req burst=2` lets three requests
/// through at once, one more than the controller assumes, and the floor
/// its first 429 proves then comes out above the rate (27.4/s for 25/s
/// on a real nginx): a second 429 and a second hold in the same turn.
/// Read with one cell more and approached slowly, the turn draws one 429
/// at 25/s (before: 2, 4.43 s) and ends within 1.15x of the best; at
/// 4/s, where the first 429 comes too early to measure anything, three
/// (before: 5, 17.52 s).
#[test]
fn one_turn_against_nginx_shaped_bursts() {
    for (rate, most) in [(25.0, 1), (4.0, 3)] {
        let t = turn_on(3, rate, 60, None);
        report_turn("nginx", rate, &t);
        assert_eq!(t.done, 60);
        assert!(t.throttled <= most, "R={rate}: {} 429s", t.throttled);
        // Three at once, then the rate: the best after one hold.
        let best = 1.0 + (60.0 - 6.0) / rate;
        if rate > 10.0 {
            assert!(
                t.makespan.as_secs_f64() <= 1.15 * best,
                "R={rate}: {:?} against a best of {best:.2} s",
                t.makespan
            );
        }
    }
}
