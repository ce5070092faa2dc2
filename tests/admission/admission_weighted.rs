//! Weighted quotas per credential (issue #12 item 3): requests *and* tokens
//! (and input tokens), reserved all or nothing, refunded when a call is
//! refused or dropped, settled against the actual usage, and held back by
//! a server hint of the same name alone. Manual clock: exact counts.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use backpressure::admission::{Admission, Builder, CallSpec, Provider};
use backpressure::headers::ServerHint;
use backpressure::Status;
use backpressure::{ManualClock, Quota};

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

/// 10 requests a second, 10,000 tokens and 6,000 input tokens a minute
/// (fixed rates), on one manual clock.
fn builder(clock: &ManualClock) -> Builder<ManualClock, ManualClock> {
    Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .fixed_rates()
        .default_quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
        .resource("tokens", per_minute(10_000))
        .resource("input_tokens", per_minute(6_000))
}

fn layer() -> (ManualClock, Admission<ManualClock, ManualClock>) {
    let clock = ManualClock::new();
    let admission = builder(&clock).build();
    (clock, admission)
}

fn left(a: &Admission<ManualClock, ManualClock>) -> [u32; 3] {
    [
        a.available("key", "requests").unwrap(),
        a.available("key", "tokens").unwrap(),
        a.available("key", "input_tokens").unwrap(),
    ]
}

fn now<F: Future>(f: F) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    pin!(f).as_mut().poll(&mut Context::from_waker(&waker))
}

#[test]
fn a_three_quota_call_takes_all_or_nothing() {
    let (_s, a) = layer();
    let spec = CallSpec::new("complete", "key")
        .cost("tokens", 4_000)
        .cost("input_tokens", 3_500);
    let Poll::Ready(Ok(t)) = now(a.admit(&spec)) else {
        panic!("fits")
    };
    drop(t);
    assert_eq!(left(&a), [9, 6_000, 2_500]);
    // Tokens would fit (6,000 left) but input tokens would not (2,500 left,
    // refilling at 100/s: a wait far past the inline 2 s): refused, and
    // neither the request nor the tokens are taken.
    let Poll::Ready(Err(t)) = now(a.admit(&spec)) else {
        panic!("refused at once")
    };
    assert_eq!(t.status, Status::RateLimited);
    assert_eq!(t.scope, "quota:input_tokens");
    assert!(t.retry_after_ms.is_some());
    assert_eq!(left(&a), [9, 6_000, 2_500], "nothing consumed by a refusal");
    // More than a quota ever holds is a quota problem, not a wait.
    let huge = CallSpec::new("complete", "key").cost("tokens", 20_000);
    let Poll::Ready(Err(t)) = now(a.admit(&huge)) else {
        panic!("refused")
    };
    assert_eq!(t.status, Status::QuotaExhausted);
    assert_eq!(left(&a), [9, 6_000, 2_500]);
}

/// Drains `a`'s requests, so the call it returns (2,000 tokens and 1,000
/// input tokens) sleeps for its request slot while holding its token
/// reservations.
fn drained(a: &Admission<ManualClock, ManualClock>) -> CallSpec {
    for _ in 0..10 {
        let Poll::Ready(Ok(t)) = now(a.admit(&CallSpec::new("t", "key"))) else {
            panic!()
        };
        drop(t);
    }
    CallSpec::new("complete", "key")
        .cost("tokens", 2_000)
        .cost("input_tokens", 1_000)
}

#[test]
fn a_dropped_admit_gives_every_reservation_back() {
    let (sleeper, a) = layer();
    let spec = drained(&a);
    {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut admit = pin!(a.admit(&spec));
        assert!(admit.as_mut().poll(&mut cx).is_pending());
        assert_eq!(left(&a), [0, 8_000, 5_000], "reserved while it sleeps");
        sleeper.advance(Duration::from_millis(50));
        assert!(admit.as_mut().poll(&mut cx).is_pending());
    } // dropped here, before its instant
    assert_eq!(left(&a), [0, 10_000, 6_000], "every reservation came back");
}

/// The same with three weighted quotas, so the request cell and the three
/// quotas fill every inline place of the call's reservations: each comes
/// back (cargo-mutants: `k.cells == 0` to `!=` in `Reserved::cancel_all`,
/// whose fast path then returned with every place full and gave nothing
/// back, survived while no test filled all four).
#[test]
fn a_dropped_admit_with_every_place_filled_gives_every_reservation_back() {
    let clock = ManualClock::new();
    let a = builder(&clock)
        .resource("output_tokens", per_minute(4_000))
        .build();
    let spec = drained(&a).cost("output_tokens", 500);
    let all = |a: &Admission<ManualClock, ManualClock>| {
        let [requests, tokens, input] = left(a);
        [
            requests,
            tokens,
            input,
            a.available("key", "output_tokens").unwrap(),
        ]
    };
    {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut admit = pin!(a.admit(&spec));
        assert!(admit.as_mut().poll(&mut cx).is_pending());
        assert_eq!(
            all(&a),
            [0, 8_000, 5_000, 3_500],
            "reserved while it sleeps"
        );
    }
    assert_eq!(
        all(&a),
        [0, 10_000, 6_000, 4_000],
        "every reservation came back"
    );
}

#[test]
fn settle_charges_the_excess_and_refunds_the_surplus() {
    let (_s, a) = layer();
    let spec = CallSpec::new("complete", "key").cost("tokens", 3_000);
    let Poll::Ready(Ok(mut t)) = now(a.admit(&spec)) else {
        panic!()
    };
    assert_eq!(t.settle("tokens", 1_000), -2_000);
    assert_eq!(a.available("key", "tokens"), Some(9_000));
    // A second settle starts from what the first left (1,000), and the
    // refund is spent: nothing more comes back.
    assert_eq!(t.settle("tokens", 500), 0);
    assert_eq!(a.available("key", "tokens"), Some(9_000));
    drop(t);

    let Poll::Ready(Ok(mut t)) = now(a.admit(&spec)) else {
        panic!()
    };
    assert_eq!(a.available("key", "tokens"), Some(6_000));
    assert_eq!(
        t.settle("tokens", 5_000),
        2_000,
        "2,000 more than estimated"
    );
    assert_eq!(a.available("key", "tokens"), Some(4_000));
    // A later settle charges only what the earlier one did not (10,000
    // against 5,000); beyond what is left it becomes debt the next call
    // waits for.
    assert_eq!(t.settle("tokens", 10_000), 5_000);
    assert_eq!(a.available("key", "tokens"), Some(0));
    assert_eq!(t.settle("bytes", 10), 0, "not admitted for it");
    drop(t);
    let small = CallSpec::new("complete", "key").cost("tokens", 100);
    let Poll::Ready(Err(refused)) = now(a.admit(&small)) else {
        panic!("in debt")
    };
    assert_eq!(refused.scope, "quota:tokens");
}

#[test]
fn a_refund_after_another_reservation_is_not_given() {
    let (_s, a) = layer();
    let spec = CallSpec::new("complete", "key").cost("tokens", 3_000);
    let Poll::Ready(Ok(mut first)) = now(a.admit(&spec)) else {
        panic!()
    };
    let Poll::Ready(Ok(mut second)) = now(a.admit(&spec)) else {
        panic!()
    };
    // `second` is stacked on `first`: refunding `first` could free cells
    // `second` holds, so it is refused (errs towards admitting less).
    assert_eq!(first.settle("tokens", 0), 0);
    assert_eq!(second.settle("tokens", 0), -3_000);
    assert_eq!(a.available("key", "tokens"), Some(7_000));
}

#[test]
fn a_spent_tokens_hint_holds_back_only_the_tokens_quota() {
    let (_s, a) = layer();
    for headers in [
        [
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "30s"),
        ],
        [
            ("anthropic-ratelimit-tokens-remaining", "0"),
            ("anthropic-ratelimit-tokens-reset", "30"),
        ],
    ] {
        let (_s, a2) = layer();
        let hint = ServerHint::from_headers(headers, SystemTime::now());
        assert!(hint
            .policies
            .iter()
            .any(|p| p.name.as_deref() == Some("tokens")));
        assert_eq!(
            a2.observe("complete", "key", 200, &hint),
            None,
            "{headers:?}"
        );
        // A call that needs tokens waits for the reset: refused now.
        let Poll::Ready(Err(t)) =
            now(a2.admit(&CallSpec::new("complete", "key").cost("tokens", 1)))
        else {
            panic!("{headers:?}")
        };
        assert_eq!(t.scope, "quota:tokens");
        assert!(t.retry_after_ms.unwrap() >= 29_000, "{t:?}");
        // One that needs none goes at once; so do input tokens.
        let Poll::Ready(Ok(_)) = now(a2.admit(&CallSpec::new("list", "key"))) else {
            panic!("{headers:?}")
        };
        let Poll::Ready(Ok(_)) =
            now(a2.admit(&CallSpec::new("embed", "key").cost("input_tokens", 10)))
        else {
            panic!("{headers:?}")
        };
    }
    drop(a);
}

/// Through `Runner`, the reply's `used` entries settle every attempt: an
/// over-use is charged as debt, an under-use refunded, and a failed
/// attempt's usage is charged too (the server counted it).
#[test]
fn the_runner_settles_what_each_reply_says_it_used() {
    use backpressure::admission::{Call, CallResult, Reply, Runner};
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    use std::sync::Arc;

    let (_sleeper, admission) = layer();
    let runner: Runner<u32, String, _, _> = Runner::new(admission.clone(), Duration::from_secs(30))
        .retries(
            backpressure::retry::Backoff::new(Duration::ZERO, Duration::ZERO),
            1,
        );
    let attempts = Arc::new(AtomicU32::new(0));
    let spec = |cost| CallSpec::new("complete", "key").cost("tokens", cost);

    // Estimated 1,000, used 3,000: 2,000 more as debt.
    let over = Call::new(spec(1_000), || async {
        Ok(Reply::new(200, 1).used("tokens", 3_000))
    });
    // Estimated 2,000, used 500: 1,500 back.
    let under = Call::new(spec(2_000), || async {
        Ok(Reply::new(200, 2).used("tokens", 500))
    });
    let results = futures::executor::block_on(runner.execute(vec![over]));
    assert!(matches!(results[0], CallResult::Done { .. }));
    assert_eq!(left(&admission)[1], 10_000 - 3_000);
    futures::executor::block_on(runner.execute(vec![under]));
    assert_eq!(left(&admission)[1], 10_000 - 3_000 - 500);

    // A 503 that used 700 of its 800, then a success that used 100: both
    // attempts are charged what the server counted.
    let n = attempts.clone();
    let retried = Call::new(spec(800), move || {
        let first = n.fetch_add(1, SeqCst) == 0;
        async move {
            Ok(if first {
                Reply::new(503, 0).used("tokens", 700)
            } else {
                Reply::new(200, 3).used("tokens", 100)
            })
        }
    });
    let results = futures::executor::block_on(runner.execute(vec![retried]));
    assert!(
        matches!(results[0], CallResult::Done { .. }),
        "{:?}",
        results[0]
    );
    assert_eq!(attempts.load(SeqCst), 2);
    assert_eq!(left(&admission)[1], 10_000 - 3_000 - 500 - 700 - 100);
}

/// A server that reports fewer tokens left than this process believes
/// (someone else spends the key) lowers the local quota to what it said;
/// one that reports more changes nothing (this process's own calls in
/// flight may not have reached it yet).
#[test]
fn a_smaller_remaining_from_the_server_lowers_the_local_quota() {
    let (_s, a) = layer();
    let hint = |left: &str| {
        ServerHint::from_headers(
            [
                ("x-ratelimit-limit-tokens", "10000"),
                ("x-ratelimit-remaining-tokens", left),
                ("x-ratelimit-reset-tokens", "6s"),
            ],
            SystemTime::now(),
        )
    };
    let Poll::Ready(Ok(t)) = now(a.admit(&CallSpec::new("complete", "key").cost("tokens", 1_000)))
    else {
        panic!("admitted")
    };
    assert_eq!(left(&a)[1], 9_000);
    // More than we believe: kept as is.
    assert_eq!(t.observe(200, &hint("9500")), None);
    assert_eq!(left(&a)[1], 9_000);
    // Less: lowered to the server's count, and only the tokens quota.
    assert_eq!(t.observe(200, &hint("2500")), None);
    assert_eq!(left(&a), [9, 2_500, 6_000]);
    // A call costing more than is left now waits (refused at once here,
    // with the wait for 500 tokens at 10,000/min: 3 s).
    let Poll::Ready(Err(refused)) =
        now(a.admit(&CallSpec::new("complete", "key").cost("tokens", 3_000)))
    else {
        panic!("refused")
    };
    assert_eq!(refused.status, Status::RateLimited);
    assert_eq!(refused.retry_after_ms, Some(3_000));
}

/// A layer with more weighted quotas than a ticket keeps inline: the
/// fifth one still settles, and a refusal still gives every one back.
#[test]
fn a_fifth_quota_settles_and_refunds_like_the_first() {
    let names = ["q0", "q1", "q2", "q3", "q4"];
    let builder = Admission::builder()
        .sleeper(ManualClock::new())
        .clock(ManualClock::new())
        .fixed_rates();
    let a = names
        .iter()
        .fold(builder, |b, n| b.resource(*n, per_minute(100)))
        .build();
    let spec = CallSpec::new("t", "key").cost("q0", 10).cost("q4", 60);
    let Poll::Ready(Ok(mut t)) = now(a.admit(&spec)) else {
        panic!("fits")
    };
    assert_eq!(t.settle("q4", 25), -35);
    assert_eq!(t.settle("q0", 15), 5);
    drop(t);
    assert_eq!(a.available("key", "q4"), Some(75));
    assert_eq!(a.available("key", "q0"), Some(85));
    // More than the fifth quota's burst: refused, and the first quota's
    // reservation given back.
    let spec = CallSpec::new("t", "key").cost("q0", 10).cost("q4", 200);
    let Poll::Ready(Err(e)) = now(a.admit(&spec)) else {
        panic!("refused")
    };
    assert_eq!(e.status, Status::QuotaExhausted);
    assert_eq!(a.available("key", "q0"), Some(85));
}

/// A refund is given at most once: after it, the bucket can hand the very
/// same stamps to the next call, and a second settle must not give that
/// call's cells away.
#[test]
fn a_second_settle_never_refunds_another_calls_cells() {
    let (_s, a) = layer();
    let spec = CallSpec::new("complete", "key").cost("tokens", 1_000);
    let Poll::Ready(Ok(mut first)) = now(a.admit(&spec)) else {
        panic!()
    };
    assert_eq!(first.settle("tokens", 0), -1_000);
    assert_eq!(a.available("key", "tokens"), Some(10_000));
    // The next call reserves from the same base: the same stamps.
    let Poll::Ready(Ok(second)) = now(a.admit(&spec)) else {
        panic!()
    };
    assert_eq!(a.available("key", "tokens"), Some(9_000));
    assert_eq!(first.settle("tokens", 0), 0);
    assert_eq!(
        a.available("key", "tokens"),
        Some(9_000),
        "second's cells stay taken"
    );
    drop((first, second));
}

/// A usage far above the estimate was charged one burst at a time: a
/// `settle("tokens", u32::MAX)` on a burst-1 quota ran for minutes. It is
/// one charge, and the debt shows as a refusal past any retry worth making.
#[test]
fn a_huge_reported_usage_is_charged_at_once_not_one_burst_at_a_time() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock)
        .fixed_rates()
        .resource("tokens", Quota::per_second(NonZeroU32::new(1).unwrap()))
        .build();
    let spec = CallSpec::new("complete", "key").cost("tokens", 1);
    let Poll::Ready(Ok(mut ticket)) = now(admission.admit(&spec)) else {
        panic!("fits")
    };
    // A hang fails here (the channel times out), not the whole suite.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let charged = ticket.settle("tokens", u32::MAX);
        tx.send((charged, ticket)).unwrap();
    });
    let (charged, ticket) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("settle spun instead of charging at once");
    drop(ticket);
    assert_eq!(charged, i64::from(u32::MAX - 1));
    assert_eq!(admission.available("key", "tokens"), Some(0));
    let Poll::Ready(Err(t)) = now(admission.admit(&spec)) else {
        panic!("the debt admits nothing")
    };
    assert_eq!(t.status, Status::QuotaExhausted, "{t}");
}

/// A place settled to 0 read as "no reservation", so `settle(0)` then
/// `settle(800)` charged nothing. It charges the 800.
#[test]
fn a_settle_to_zero_keeps_metering_later_usage() {
    let (_s, a) = layer();
    let spec = CallSpec::new("complete", "key").cost("tokens", 500);
    let Poll::Ready(Ok(mut t)) = now(a.admit(&spec)) else {
        panic!("fits")
    };
    assert_eq!(t.settle("tokens", 0), -500);
    assert_eq!(t.settle("tokens", 800), 800);
    drop(t);
    assert_eq!(left(&a)[1], 10_000 - 800);
}

/// A call admitted without a tokens estimate is still charged what the
/// server says it used.
#[test]
fn usage_on_a_quota_the_call_reserved_nothing_on_is_charged() {
    let (_s, a) = layer();
    let Poll::Ready(Ok(mut t)) = now(a.admit(&CallSpec::new("complete", "key"))) else {
        panic!("fits")
    };
    assert_eq!(t.settle("tokens", 700), 700);
    drop(t);
    assert_eq!(left(&a)[1], 10_000 - 700);
}

/// `cost("tokns", 1800)` on a layer whose quota is `tokens` was admitted
/// uncharged. It is refused, naming the quotas the layer has, and takes
/// nothing.
#[test]
fn a_misspelt_cost_is_refused_not_free() {
    let (_s, a) = layer();
    let spec = CallSpec::new("complete", "key").cost("tokns", 1_800);
    let Poll::Ready(Err(t)) = now(a.admit(&spec)) else {
        panic!("a misspelt cost was admitted")
    };
    assert_eq!(t.status, Status::QuotaExhausted);
    assert_eq!(t.scope, "quota:tokns");
    assert!(t.hint.contains("tokens"), "{t}");
    assert_eq!(left(&a), [10, 10_000, 6_000], "nothing was taken");
    // The request quota is a quota too.
    let spec = CallSpec::new("complete", "key").cost("requests", 2);
    assert!(matches!(now(a.admit(&spec)), Poll::Ready(Ok(_))));
}

/// A 429 for tokens (requests left) lowered the *request* rate and held
/// every call. It holds the tokens quota alone, and the learned request
/// rate does not move.
#[test]
fn a_429_for_tokens_holds_the_tokens_quota_not_the_request_rate() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .inline_wait(Duration::ZERO)
        .resource("tokens", per_minute(10_000))
        .build();
    let plain = CallSpec::new("complete", "key");
    let Poll::Ready(Ok(t)) = now(admission.admit(&plain)) else {
        panic!("fits")
    };
    let rate = admission.learned_rate("key");
    for names in [
        [
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-remaining-requests", "40"),
        ],
        [
            ("anthropic-ratelimit-tokens-remaining", "0"),
            ("anthropic-ratelimit-requests-remaining", "40"),
        ],
    ] {
        let hint = ServerHint::from_headers(
            [("retry-after", "20")].into_iter().chain(names),
            SystemTime::now(),
        );
        t.observe(429, &hint);
        assert_eq!(
            admission.learned_rate("key"),
            rate,
            "the request rate moved"
        );
        // A call that needs no tokens goes; one that does waits the hold.
        // (A second for the request quota's own pace.)
        clock.advance(Duration::from_secs(1));
        let Poll::Ready(Ok(go)) = now(admission.admit(&plain)) else {
            panic!("a call without tokens was held back")
        };
        drop(go);
        clock.advance(Duration::from_secs(1));
        let Poll::Ready(Err(held)) = now(admission.admit(&plain.clone().cost("tokens", 100)))
        else {
            panic!("a tokens call went out inside the hold")
        };
        assert_eq!(held.scope, "quota:tokens", "{held}");
        admission.lift_hold("key");
    }
}

/// Issue #25, item 4: a request limit with a window the server names
/// (Kong's `x-ratelimit-limit-minute`, `RateLimit-Policy`, or Anthropic's
/// names, whose window is always the minute) is the learned rate from the
/// first reply on: 180 a minute paces the key at 3/s. (OpenAI's names
/// carry no window unless the layer is told the provider: servers using
/// them count over different ones.)
#[test]
fn a_providers_request_limit_is_learned_from_the_first_reply() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .inline_wait(Duration::ZERO)
        .build();
    for (key, headers, rate) in [
        (
            "kong-key",
            [
                ("x-ratelimit-limit-minute", "180"),
                ("x-ratelimit-remaining-minute", "179"),
            ],
            3.0,
        ),
        (
            "ietf-key",
            [
                ("ratelimit-policy", r#""requests";q=50;w=60"#),
                ("ratelimit", r#""requests";r=49;t=60"#),
            ],
            50.0 / 60.0,
        ),
        (
            "anthropic-key",
            [
                ("anthropic-ratelimit-requests-limit", "50"),
                ("anthropic-ratelimit-requests-remaining", "49"),
            ],
            50.0 / 60.0,
        ),
    ] {
        let spec = CallSpec::new("complete", key);
        let Poll::Ready(Ok(t)) = now(admission.admit(&spec)) else {
            panic!("the first call fits")
        };
        assert_eq!(
            admission.learned_rate(key),
            Some(10.0),
            "the starting guess"
        );
        t.observe(200, &ServerHint::from_headers(headers, SystemTime::now()));
        let learned = admission.learned_rate(key).unwrap();
        assert!((learned - rate).abs() < 1e-6, "{key}: {learned}");
        // Paced at the server's rate: the next call right away is told to
        // come back one period later, not at the old guess's.
        let Poll::Ready(Err(refused)) = now(admission.admit(&spec)) else {
            panic!("{key}: a second call went out at once")
        };
        let wait = refused.retry_after().unwrap().as_secs_f64();
        assert!((wait - 1.0 / rate).abs() < 0.01, "{key}: told {wait} s");
    }
}

/// Issue #25, item 4 (tokens): a server's token limit with its window
/// (`RateLimit-Policy`) is a ceiling on the layer's weighted quota of the
/// same name from the first reply on (`input-tokens` is the layer's
/// `input_tokens`); a configured quota below it is left alone.
#[test]
fn a_providers_token_limit_lowers_a_guessed_tokens_quota() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .resource("tokens", per_minute(1_000_000))
        .resource("input_tokens", per_minute(1_000))
        .build();
    let spec = CallSpec::new("complete", "key")
        .cost("tokens", 100)
        .cost("input_tokens", 100);
    let Poll::Ready(Ok(t)) = now(admission.admit(&spec)) else {
        panic!("fits")
    };
    assert_eq!(admission.available("key", "tokens"), Some(999_900));
    let hint = ServerHint::from_headers(
        [(
            "ratelimit-policy",
            r#""tokens";q=120000;w=60, "input-tokens";q=40000;w=60"#,
        )],
        SystemTime::now(),
    );
    t.observe(200, &hint);
    // 120,000 a minute now, the 100 used still counted.
    assert_eq!(admission.available("key", "tokens"), Some(119_900));
    clock.advance(Duration::from_millis(20));
    assert_eq!(
        admission.available("key", "tokens"),
        Some(119_900 + 40),
        "refills at the server's 2,000/s"
    );
    // 1,000 a minute configured, below the server's 40,000: kept (at
    // 40,000 a minute the 20 ms would have given back 13).
    assert_eq!(admission.available("key", "input_tokens"), Some(900));
}

/// The regression `agent_fanout` showed: its server uses OpenAI's header
/// names over 1 s windows, and a minute assumed for them read 4,000
/// tokens a second as 66, refusing most of a turn for 20 s. A limit that
/// states no window never lowers a quota.
#[test]
fn a_limit_without_a_window_never_lowers_a_quota() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .resource("tokens", Quota::per_second(NonZeroU32::new(4_000).unwrap()))
        .build();
    let spec = CallSpec::new("complete", "key").cost("tokens", 500);
    let Poll::Ready(Ok(t)) = now(admission.admit(&spec)) else {
        panic!("fits")
    };
    let hint = ServerHint::from_headers(
        [
            ("x-ratelimit-limit-tokens", "4000"),
            ("x-ratelimit-remaining-tokens", "3500"),
            ("x-ratelimit-reset-tokens", "125ms"),
        ],
        SystemTime::now(),
    );
    t.observe(200, &hint);
    clock.advance(Duration::from_millis(125));
    assert_eq!(admission.available("key", "tokens"), Some(4_000));
}

/// A layer told `Provider::OpenAi` (no inline wait, manual time), an
/// 805-token call spec, and that call's ticket, admitted.
fn openai_first_call() -> (
    ManualClock,
    Admission<ManualClock, ManualClock>,
    CallSpec,
    backpressure::admission::Ticket<ManualClock, ManualClock>,
) {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .inline_wait(Duration::ZERO)
        .provider(Provider::OpenAi)
        .build();
    let spec = CallSpec::new("chat", "key").cost("tokens", 805);
    let Poll::Ready(Ok(t)) = now(admission.admit(&spec)) else {
        panic!("the first call fits")
    };
    (clock, admission, spec, t)
}

/// Issue #25, item 4: told the provider, a layer with no quota configured
/// learns OpenAI's per-minute numbers from the first reply: the request
/// limit paces the key (180 a minute: 3/s) and the token limit becomes a
/// `tokens` quota of 2,000 a second with a second's worth of burst, which
/// then holds calls back by what they cost.
#[test]
fn told_the_provider_a_layer_learns_openais_minute_limits() {
    let (clock, admission, _, t) = openai_first_call();
    let reply = ServerHint::from_headers(
        [
            ("x-ratelimit-limit-requests", "180"),
            ("x-ratelimit-limit-tokens", "120000"),
            ("x-ratelimit-remaining-requests", "2"),
            ("x-ratelimit-remaining-tokens", "1195"),
            ("x-ratelimit-reset-requests", "333ms"),
            ("x-ratelimit-reset-tokens", "403ms"),
        ],
        SystemTime::now(),
    );
    t.observe(200, &reply);
    let rate = admission.learned_rate("key").unwrap();
    assert!((rate - 3.0).abs() < 1e-9, "{rate}");
    // The server's remaining, lower than a fresh second's worth: charged.
    assert_eq!(admission.available("key", "tokens"), Some(1_195));
    clock.advance(Duration::from_millis(100));
    assert_eq!(
        admission.available("key", "tokens"),
        Some(1_395),
        "refills at 2,000/s"
    );
    clock.advance(Duration::from_secs(10));
    assert_eq!(
        admission.available("key", "tokens"),
        Some(2_000),
        "a burst of one second's worth, not the minute's 120,000"
    );
    // A 1,800-token call fits the burst; a second one a request slot later
    // (340 ms) does not (200 + 680 refilled), and is told when the other
    // 920 will have refilled (460 ms at 2,000/s).
    let big = CallSpec::new("chat", "key").cost("tokens", 1_800);
    let Poll::Ready(Ok(first)) = now(admission.admit(&big)) else {
        panic!("fits the burst")
    };
    clock.advance(Duration::from_millis(340));
    let Poll::Ready(Err(refused)) = now(admission.admit(&big)) else {
        panic!("a second call went out past the tokens left")
    };
    assert_eq!(refused.scope, "quota:tokens", "{refused}");
    let wait = refused.retry_after().unwrap();
    assert!(
        wait >= Duration::from_millis(460) && wait < Duration::from_millis(520),
        "{refused}"
    );
    drop(first);

    // Without the provider, the same reply sets nothing (see
    // `a_limit_without_a_window_never_lowers_a_quota`).
    let plain = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .build();
    let Poll::Ready(Ok(t)) = now(plain.admit(&CallSpec::new("chat", "key"))) else {
        panic!("fits")
    };
    t.observe(200, &reply);
    let rate = plain.learned_rate("key").unwrap();
    assert!(
        rate >= 10.0,
        "a success from the 10/s guess, not 3/s: {rate}"
    );
    assert_eq!(plain.available("key", "tokens"), None, "no tokens quota");
}

/// A learned quota's burst is a guess at the server's slice, so a call
/// costing more than it is not refused for good: it waits for a full burst
/// and goes. (A configured quota refuses it: the operator said so.)
#[test]
fn a_call_bigger_than_a_learned_burst_waits_for_a_full_one() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .inline_wait(Duration::from_secs(5))
        .provider(Provider::Anthropic)
        .build();
    let reply = ServerHint::from_headers(
        [
            ("anthropic-ratelimit-requests-limit", "600"),
            ("anthropic-ratelimit-input-tokens-limit", "30000"),
        ],
        SystemTime::now(),
    );
    admission.observe("messages", "key", 200, &reply);
    assert_eq!(admission.available("key", "input_tokens"), Some(500));
    let big = CallSpec::new("messages", "key").cost("input_tokens", 4_000);
    let Poll::Ready(Ok(t)) = now(admission.admit(&big)) else {
        panic!("a call bigger than the learned burst was refused")
    };
    drop(t);
    // It took the whole burst, no more: the next call waits a second for
    // it, not eight.
    assert_eq!(admission.available("key", "input_tokens"), Some(0));
    clock.advance(Duration::from_secs(1));
    assert_eq!(admission.available("key", "input_tokens"), Some(500));
    let configured = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .resource(
            "input_tokens",
            Quota::per_second(NonZeroU32::new(500).unwrap()),
        )
        .build();
    let Poll::Ready(Err(refused)) = now(configured.admit(&big)) else {
        panic!("a configured quota let a call past its burst")
    };
    assert_eq!(refused.status, Status::QuotaExhausted, "{refused}");
}

/// Issue #25, item 3: a 429 whose headers say requests are left was not
/// for requests, even when the token count it names is not zero (805
/// asked, 400 left): it holds the tokens quota, and the request rate does
/// not move.
#[test]
fn a_429_with_requests_left_is_charged_to_the_scarcest_quota() {
    let (clock, admission, spec, t) = openai_first_call();
    let rate = admission.learned_rate("key");
    let hint = ServerHint::from_headers(
        [
            ("retry-after", "1"),
            ("x-ratelimit-remaining-requests", "2"),
            ("x-ratelimit-remaining-tokens", "400"),
            ("x-ratelimit-reset-tokens", "803ms"),
        ],
        SystemTime::now(),
    );
    assert_eq!(t.observe(429, &hint), Some(Duration::from_millis(803)));
    assert_eq!(
        admission.learned_rate("key"),
        rate,
        "the request rate moved"
    );
    clock.advance(Duration::from_millis(200));
    let Poll::Ready(Ok(go)) = now(admission.admit(&CallSpec::new("chat", "key"))) else {
        panic!("a call without tokens was held back")
    };
    drop(go);
    clock.advance(Duration::from_millis(200)); // the request pace; 400 ms of 803
    let Poll::Ready(Err(held)) = now(admission.admit(&spec)) else {
        panic!("a tokens call went out inside the hold")
    };
    assert_eq!(held.scope, "quota:tokens", "{held}");
}

/// The same on a minute's scale (a server enforcing a minute's limit in
/// slices reports `remaining` of the minute, never 0 on a 429): the policy
/// with the smallest share left is the one spent. Tokens scarcer: the
/// tokens quota is held and the rate keeps the server's 3/s; requests
/// scarcer: the key is held.
#[test]
fn on_a_minutes_scale_the_smallest_share_left_is_the_quota_spent() {
    let (clock, admission, spec, t) = openai_first_call();
    let reply = |requests: &'static str, tokens: &'static str| {
        ServerHint::from_headers(
            [
                ("retry-after", "1"),
                ("x-ratelimit-limit-requests", "180"),
                ("x-ratelimit-limit-tokens", "120000"),
                ("x-ratelimit-remaining-requests", requests),
                ("x-ratelimit-remaining-tokens", tokens),
                ("x-ratelimit-reset-tokens", "803ms"),
            ],
            SystemTime::now(),
        )
    };
    // 1.1% of the requests used, 1.3% of the tokens.
    assert_eq!(
        t.observe(429, &reply("178", "118390")),
        Some(Duration::from_millis(803))
    );
    let rate = admission.learned_rate("key").unwrap();
    assert!(
        (rate - 3.0).abs() < 1e-9,
        "the server's limit, no cut: {rate}"
    );
    clock.advance(Duration::from_millis(400));
    let Poll::Ready(Ok(go)) = now(admission.admit(&CallSpec::new("chat", "key"))) else {
        panic!("a call without tokens was held back")
    };
    drop(go);
    clock.advance(Duration::from_millis(340));
    let Poll::Ready(Err(held)) = now(admission.admit(&spec)) else {
        panic!("a tokens call went out inside the hold")
    };
    assert_eq!(held.scope, "quota:tokens", "{held}");

    // 1.7% of the requests used, 0.7% of the tokens: a requests 429.
    admission.lift_hold("key");
    clock.advance(Duration::from_secs(1));
    admission.observe("chat", "key", 429, &reply("177", "119195"));
    let Poll::Ready(Err(held)) = now(admission.admit(&CallSpec::new("chat", "key"))) else {
        panic!("a call went out inside a request hold")
    };
    assert_eq!(held.scope, "api_key", "{held}");
}

/// A hold that lands while a call sleeps for its instant sends it back to
/// reserve behind the hold: its weighted reservations are given back
/// first, so they are counted once, not twice (cargo-mutants found no
/// test of that path with every quota reserved).
#[test]
fn a_call_requeued_behind_a_hold_holds_its_tokens_once() {
    let (sleeper, a) = layer();
    let spec = drained(&a);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut admit = pin!(a.admit(&spec));
    assert!(admit.as_mut().poll(&mut cx).is_pending());
    assert_eq!(left(&a)[1..], [8_000, 5_000], "reserved while it sleeps");
    // A 429 lands: the key is held for a second, past the call's instant.
    let hint = ServerHint::from_headers([("retry-after", "1")], SystemTime::now());
    a.observe("t", "key", 429, &hint);
    sleeper.advance(Duration::from_millis(100));
    assert!(
        admit.as_mut().poll(&mut cx).is_pending(),
        "queued behind the hold"
    );
    let [_, tokens, input] = left(&a);
    // Given back (to full: the 100 ms refilled the rest) and taken again.
    assert_eq!([tokens, input], [8_000, 5_000], "one reservation each");
}
