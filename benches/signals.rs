//! Cost of reading a response's rate-limit headers and of one backoff draw:
//! what a harness pays per response and per retry. No peer does both, so
//! the numbers stand alone.

use std::hint::black_box;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backpressure::headers::ServerHint;
use backpressure::retry::{Backoff, Deadline, Jitter, RetryPolicy};
use backpressure::ManualClock;
use criterion::{criterion_group, criterion_main, Criterion};

const GITHUB: &[(&str, &str)] = &[
    ("content-type", "application/json; charset=utf-8"),
    ("date", "Tue, 14 Nov 2023 22:13:20 GMT"),
    ("x-ratelimit-limit", "5000"),
    ("x-ratelimit-remaining", "4999"),
    ("x-ratelimit-reset", "1700003600"),
    ("x-ratelimit-used", "1"),
    ("x-ratelimit-resource", "core"),
    ("etag", "W/\"abc\""),
];

const OPENAI: &[(&str, &str)] = &[
    ("date", "Tue, 14 Nov 2023 22:13:20 GMT"),
    ("x-ratelimit-limit-requests", "60"),
    ("x-ratelimit-limit-tokens", "150000"),
    ("x-ratelimit-remaining-requests", "59"),
    ("x-ratelimit-remaining-tokens", "149984"),
    ("x-ratelimit-reset-requests", "1s"),
    ("x-ratelimit-reset-tokens", "6m0s"),
];

const IETF: &[(&str, &str)] = &[
    (
        "ratelimit-policy",
        r#""burst";q=100;w=60, "daily";q=1000;w=86400"#,
    ),
    ("ratelimit", r#""burst";r=50;t=30, "daily";r=900;t=5000"#),
];

const RETRY_AFTER_DATE: &[(&str, &str)] = &[
    ("date", "Tue, 14 Nov 2023 22:13:20 GMT"),
    ("retry-after", "Tue, 14 Nov 2023 22:15:20 GMT"),
];

fn headers(c: &mut Criterion) {
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut g = c.benchmark_group("server_hint");
    for (name, h) in [
        ("github", GITHUB),
        ("openai", OPENAI),
        ("ietf_structured", IETF),
        ("retry_after_date", RETRY_AFTER_DATE),
        ("no_limit_headers", &GITHUB[..1]),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| ServerHint::from_headers(black_box(h).iter().copied(), black_box(now)))
        });
    }
    g.finish();
}

fn backoff(c: &mut Criterion) {
    let mut g = c.benchmark_group("backoff");
    for jitter in [Jitter::Full, Jitter::Decorrelated] {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(10))
            .jitter(jitter)
            .seed(1);
        g.bench_function(format!("delay_{jitter:?}"), |bench| {
            bench.iter(|| b.delay(black_box(5)))
        });
    }
    let hint = ServerHint::from_headers([("retry-after", "1")], SystemTime::now());
    let template = RetryPolicy::default();
    g.bench_function("decide_with_hint", |b| {
        b.iter(|| {
            let mut policy = template.fork();
            let mut deadline = Deadline::after(ManualClock::new(), Duration::from_secs(30));
            policy.decide(black_box(&hint), &mut deadline)
        })
    });
    g.finish();
}

criterion_group!(benches, headers, backoff);
criterion_main!(benches);
