//! Feature `metrics`: the counters, gauge and histogram a recorder sees
//! match the decisions made (metrics-util's debugging recorder).
#![cfg(feature = "metrics")]

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll};

use backpressure::admission::{Admission, CallSpec, SlotPolicy};
use backpressure::Status;
use backpressure::{ManualClock, Quota};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};

fn now<F: Future>(f: F) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    pin!(f).as_mut().poll(&mut Context::from_waker(&waker))
}

type Entry = (
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
);

fn value<'a>(
    snapshot: &'a [Entry],
    kind: MetricKind,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a DebugValue> {
    snapshot
        .iter()
        .find(|(k, ..)| {
            k.kind() == kind
                && k.key().name() == name
                && labels
                    .iter()
                    .all(|(ln, lv)| k.key().labels().any(|l| l.key() == *ln && l.value() == *lv))
        })
        .map(|(_, _, _, v)| v)
}

#[test]
fn metrics_report_every_decision() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let clock = ManualClock::new();
        let admission = Admission::builder()
            .sleeper(clock.clone())
            .clock(clock)
            .fixed_rates()
            .default_quota(Quota::per_second(NonZeroU32::new(100).unwrap()))
            .tool("refund", 1, SlotPolicy::FailFast)
            .build();
        let Poll::Ready(Ok(a)) = now(admission.admit(&CallSpec::new("refund", "k"))) else {
            panic!()
        };
        let Poll::Ready(Err(t)) = now(admission.admit(&CallSpec::new("refund", "k"))) else {
            panic!()
        };
        assert_eq!(t.status, Status::Shed);
        let Poll::Ready(Ok(b)) = now(admission.admit(&CallSpec::new("search", "k"))) else {
            panic!()
        };
        drop(a);
        let snap = snapshotter.snapshot().into_vec();
        assert_eq!(
            value(
                &snap,
                MetricKind::Counter,
                "backpressure_admitted_total",
                &[("tool", "refund")]
            ),
            Some(&DebugValue::Counter(1))
        );
        assert_eq!(
            value(
                &snap,
                MetricKind::Counter,
                "backpressure_refused_total",
                &[("tool", "refund"), ("status", "shed")]
            ),
            Some(&DebugValue::Counter(1))
        );
        let in_flight = |tool| match value(
            &snap,
            MetricKind::Gauge,
            "backpressure_in_flight",
            &[("tool", tool)],
        ) {
            Some(DebugValue::Gauge(g)) => g.into_inner(),
            other => panic!("{other:?}"),
        };
        assert_eq!(in_flight("refund"), 0.0);
        assert_eq!(in_flight("search"), 1.0);
        match value(
            &snap,
            MetricKind::Histogram,
            "backpressure_admission_wait_seconds",
            &[("tool", "search")],
        ) {
            Some(DebugValue::Histogram(h)) => assert_eq!(h.len(), 1),
            other => panic!("{other:?}"),
        }
        drop(b);
    });
}

/// An open circuit's refusals (issue #23 item 3) reach the recorder as
/// `status="unavailable"`, and `Admission::stats` counts them.
#[test]
fn an_open_circuit_refusal_is_counted_as_unavailable() {
    use backpressure::admission::CircuitBreaker;
    use backpressure::headers::ServerHint;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let clock = ManualClock::new();
        let admission = Admission::builder()
            .sleeper(clock.clone())
            .clock(clock)
            .circuit_breaker(CircuitBreaker::new().consecutive_failures(1))
            .build();
        let spec = CallSpec::new("search", "k");
        let Poll::Ready(Ok(t)) = now(admission.admit(&spec)) else {
            panic!()
        };
        t.observe(500, &ServerHint::default());
        drop(t);
        for _ in 0..2 {
            let Poll::Ready(Err(refused)) = now(admission.admit(&spec)) else {
                panic!()
            };
            assert_eq!(refused.status, Status::Unavailable);
        }
        let snap = snapshotter.snapshot().into_vec();
        assert_eq!(
            value(
                &snap,
                MetricKind::Counter,
                "backpressure_refused_total",
                &[("tool", "search"), ("status", "unavailable")]
            ),
            Some(&DebugValue::Counter(2))
        );
        let stats = admission.stats();
        assert_eq!(stats.refused.unavailable, 2);
        assert_eq!(stats.refused.get(Status::Unavailable), 2);
        assert_eq!(stats.refused.total(), 2);
    });
}
