//! `Admission::stats` counts what a throttling fake saw (issue #12 item 5):
//! every request the fake served was an admitted call, every refusal is
//! counted under its status, per tool and per credential.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::Duration;

use backpressure::admission::{Admission, CallSpec, SlotPolicy};
use backpressure::Status;
use backpressure::{ManualClock, Quota};

fn now<F: Future>(f: F) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    pin!(f).as_mut().poll(&mut Context::from_waker(&waker))
}

#[test]
fn stats_count_admissions_and_refusals_per_tool_and_credential() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .fixed_rates()
        .default_quota(Quota::per_second(NonZeroU32::new(3).unwrap()))
        .inline_wait(Duration::ZERO)
        .tool("refund", 1, SlotPolicy::FailFast)
        .build();
    // The fake: counts the requests it serves.
    let mut served = 0;
    let mut held = Vec::new();
    for i in 0..5 {
        match now(admission.admit(&CallSpec::new("search", "a"))) {
            Poll::Ready(Ok(t)) => {
                served += 1;
                held.push(t);
            }
            Poll::Ready(Err(t)) => assert_eq!(t.status, Status::RateLimited, "call {i}"),
            Poll::Pending => panic!("no wait inline"),
        }
    }
    let Poll::Ready(Ok(refund)) = now(admission.admit(&CallSpec::new("refund", "b"))) else {
        panic!()
    };
    served += 1;
    let Poll::Ready(Err(shed)) = now(admission.admit(&CallSpec::new("refund", "b"))) else {
        panic!()
    };
    assert_eq!(shed.status, Status::Shed);

    let stats = admission.stats();
    assert_eq!(stats.admitted, served);
    assert_eq!(stats.in_flight, 4);
    assert_eq!(stats.refused.rate_limited, 2);
    assert_eq!(stats.refused.shed, 1);
    assert_eq!(stats.refused.total(), 3);
    let names: Vec<_> = stats.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["refund", "search"]);
    let (refund_s, search) = (&stats.tools[0], &stats.tools[1]);
    assert_eq!(
        (
            search.admitted,
            search.in_flight,
            search.refused.rate_limited
        ),
        (3, 3, 2)
    );
    assert_eq!(
        (
            refund_s.admitted,
            refund_s.in_flight,
            refund_s.refused.shed,
            refund_s.cap
        ),
        (1, 1, 1, 1)
    );
    let (a, b) = (&stats.credentials[0], &stats.credentials[1]);
    assert_eq!(
        (
            a.credential.as_str(),
            a.admitted,
            a.refused.rate_limited,
            a.available
        ),
        ("a", 3, 2, Some(0))
    );
    assert_eq!(
        (b.credential.as_str(), b.admitted, b.refused.shed),
        ("b", 1, 1)
    );
    assert_eq!(a.learned_rate, None, "fixed rates");

    drop(held);
    drop(refund);
    let stats = admission.stats();
    assert_eq!(stats.in_flight, 0);
    assert!(stats.tools.iter().all(|t| t.in_flight == 0));
    assert!(stats.credentials.iter().all(|c| c.in_flight == 0));
    admission.close();
    let _ = now(admission.admit(&CallSpec::new("search", "a")));
    assert_eq!(admission.stats().refused.closed, 1);
}

/// Issue #10 item 11: every distinct tool name grew the registry for good
/// (200,000 names: +52 MB). Now it stays at the cap, evicting idle tools,
/// and refuses a new name only while every tracked tool is busy.
#[test]
fn a_flood_of_tool_names_keeps_the_registry_bounded() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock)
        .fixed_rates()
        .default_quota(Quota::per_second(NonZeroU32::new(1_000_000).unwrap()))
        .tool("configured", 1, SlotPolicy::Wait)
        .max_tools(16)
        .build();
    for i in 0..20_000 {
        let Poll::Ready(Ok(t)) = now(admission.admit(&CallSpec::new(format!("tool-{i}"), "k")))
        else {
            panic!("call {i}")
        };
        drop(t);
    }
    let tools = admission.stats().tools;
    assert!(tools.len() <= 16 + 1, "{} tools tracked", tools.len());
    assert!(
        tools.iter().any(|t| t.name == "configured"),
        "configured tools stay"
    );
    // 16 busy tools: a 17th name is refused, not tracked.
    let busy: Vec<_> = (0..16)
        .map(
            |i| match now(admission.admit(&CallSpec::new(format!("busy-{i}"), "k"))) {
                Poll::Ready(Ok(t)) => t,
                _ => panic!("busy {i}"),
            },
        )
        .collect();
    let Poll::Ready(Err(t)) = now(admission.admit(&CallSpec::new("one-too-many", "k"))) else {
        panic!("refused")
    };
    assert_eq!(t.status, Status::Shed);
    assert_eq!(t.scope, "tool:one-too-many");
    drop(busy);
    assert!(matches!(
        now(admission.admit(&CallSpec::new("one-too-many", "k"))),
        Poll::Ready(Ok(_))
    ));
}

/// Issue #45: a layer told a provider whose replies never state a limit
/// (a recipe that builds `Reply`s without headers) says so after 16 of
/// them; one reply that states a limit clears it for good.
#[test]
fn a_provider_that_never_states_a_limit_is_reported() {
    use backpressure::admission::Provider;
    use backpressure::headers::ServerHint;
    let silent = Admission::builder().provider(Provider::OpenAi).build();
    for i in 1..=16 {
        assert!(!silent.stats().provider_silent, "after {} replies", i - 1);
        silent.observe("chat", "key", 200, &ServerHint::default());
    }
    assert!(silent.stats().provider_silent);

    let stating = Admission::builder().provider(Provider::OpenAi).build();
    let limits = ServerHint::from_headers(
        [("x-ratelimit-limit-requests", "180")],
        std::time::SystemTime::now(),
    );
    stating.observe("chat", "key", 200, &limits);
    for _ in 0..32 {
        stating.observe("chat", "key", 200, &ServerHint::default());
    }
    assert!(!stating.stats().provider_silent);
    // Not told a provider: nothing to expect.
    let plain = Admission::builder().build();
    for _ in 0..32 {
        plain.observe("chat", "key", 200, &ServerHint::default());
    }
    assert!(!plain.stats().provider_silent);
}

/// cargo-mutants (issue #40): the warning of a silent provider is logged
/// once, at its 16th silent reply, not at every other one.
#[cfg(feature = "tracing")]
#[test]
fn a_silent_provider_is_warned_about_once() {
    use backpressure::admission::Provider;
    use backpressure::headers::ServerHint;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata};

    /// Counts the warnings logged.
    struct Warnings(Arc<AtomicUsize>);
    impl tracing::Subscriber for Warnings {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            if *event.metadata().level() == Level::WARN {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    let warned = Arc::new(AtomicUsize::new(0));
    let silent = Admission::builder().provider(Provider::OpenAi).build();
    tracing::subscriber::with_default(Warnings(warned.clone()), || {
        for i in 1..=40 {
            silent.observe("chat", "key", 200, &ServerHint::default());
            let expected = usize::from(i >= 16);
            assert_eq!(warned.load(Ordering::SeqCst), expected, "after {i} replies");
        }
    });
}
