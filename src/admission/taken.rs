//! The `Taken` hand-off (its `keep` uses `ptr::read`; run under miri):
//! every slot, budget unit and trial comes back exactly once.

use super::*;
use crate::clock::ManualClock;
use core::task::{Context, Poll};

fn poll<F: Future>(f: core::pin::Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(futures::task::noop_waker_ref()))
}

#[test]
fn every_path_through_taken_gives_back_or_keeps_exactly_once() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .clock(clock.clone())
        .sleeper(clock.clone())
        .global_concurrency(1)
        .run_budget(10)
        .fixed_rates()
        .default_quota(crate::Quota::per_second(
            core::num::NonZeroU32::new(1_000).expect("non-zero"),
        ))
        .circuit_breaker(CircuitBreaker::new().consecutive_failures(1))
        .build();
    let spec = CallSpec::new("t", "k");
    // At once: kept by the ticket.
    let first = futures::executor::block_on(admission.admit(&spec)).unwrap();
    // Waits for the slot (staged path), then is dropped mid-wait.
    {
        let mut waiting = core::pin::pin!(admission.admit(&spec));
        assert!(poll(waiting.as_mut()).is_pending());
        assert_eq!(admission.waiting(), 1);
    }
    assert_eq!(admission.waiting(), 0);
    // Waits, then is handed the slot.
    let mut next = Box::pin(admission.admit(&spec));
    assert!(poll(next.as_mut()).is_pending());
    drop(first);
    let second = match poll(next.as_mut()) {
        Poll::Ready(Ok(t)) => t,
        other => panic!("handed the freed slot: {other:?}"),
    };
    second.observe(500, &crate::headers::ServerHint::default());
    drop(second);
    // The circuit opened; after its cool-down the rate stage refuses the
    // trial, so the trial and the slots come back.
    clock.advance(Duration::from_secs(5));
    let hint = crate::headers::ServerHint::from_headers(
        [("retry-after", "600")],
        std::time::UNIX_EPOCH, // a delay in seconds: no wall clock needed
    );
    admission.observe("t", "k", 429, &hint);
    let refused = futures::executor::block_on(admission.admit(&spec)).unwrap_err();
    assert_eq!(refused.status, Status::QuotaExhausted);
    assert!(admission.inner.slots.try_take(
        &admission.inner.slots.tool("t").unwrap(),
        Priority::INTERACTIVE
    ));
    let tool = admission.inner.slots.tool("t").unwrap();
    admission
        .inner
        .slots
        .give_back(&tool, Priority::INTERACTIVE);
    // The trial came back too: with the hold lifted, this call is it.
    admission.lift_hold("k");
    let trial = futures::executor::block_on(admission.admit(&spec)).unwrap();
    let during = futures::executor::block_on(admission.admit(&spec)).unwrap_err();
    assert_eq!(during.status, Status::Unavailable, "the trial is out");
    assert!(during.hint.contains("trial"), "{during:?}");
    drop(trial);
    // 3 kept; the refused and the dropped ones given back.
    assert_eq!(admission.stats().admitted, 3);
}
