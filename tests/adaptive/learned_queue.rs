//! A learned rate's change reaches the calls already waiting on it.
//!
//! Eight calls queue on a credential learned at its starting guess (10/s,
//! one at a time: their cells 100 ms apart), then a reply states the
//! server's limit. The queued calls move to the new rate at once, in
//! their order, spaced by its period: sooner after a raise, later after a
//! cut. Before, they kept the instants they were given at the old rate: a
//! raise reached only the calls that came after the queue, and a cut let
//! the queue go at the old rate, above what the server had just said.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::{Duration, SystemTime};

use backpressure::admission::{Admission, CallSpec};
use backpressure::headers::ServerHint;
use backpressure::{Clock, ManualClock};

const MS: u64 = 1_000_000;

type Admit = Pin<Box<dyn Future<Output = bool>>>;

/// Eight calls on `key` queued at t = 0, then `policy` stated by a reply;
/// returns when each call was admitted, in ms, in the order they asked.
fn queue_then_told(policy: &str) -> Vec<u64> {
    queue_then_told_within(policy, Duration::from_secs(60))
        .into_iter()
        .map(|(at, ok)| {
            assert!(ok, "refused at {at} ms");
            at
        })
        .collect()
}

/// [`queue_then_told`] for calls with `deadline`: when each call was
/// decided, in ms, and whether it was admitted.
fn queue_then_told_within(policy: &str, deadline: Duration) -> Vec<(u64, bool)> {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .inline_wait(Duration::from_secs(30))
        .build();
    let mut calls: Vec<Admit> = (0..8)
        .map(|_| {
            let a = admission.clone();
            Box::pin(async move {
                let spec = CallSpec::new("t", "key").deadline(deadline);
                a.admit(&spec).await.is_ok()
            }) as Admit
        })
        .collect();
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut done = vec![None; calls.len()];
    let mut poll_all = |calls: &mut Vec<Admit>, done: &mut Vec<Option<(u64, bool)>>, now: u64| {
        for (i, call) in calls.iter_mut().enumerate() {
            if done[i].is_none()
                && let std::task::Poll::Ready(ok) = call.as_mut().poll(&mut cx)
            {
                done[i] = Some((now / MS, ok));
            }
        }
    };
    poll_all(&mut calls, &mut done, 0);
    assert_eq!(done.iter().flatten().count(), 1, "one goes, seven queue");
    let hint = ServerHint::from_headers([("ratelimit-policy", policy)], SystemTime::now());
    admission.observe("t", "key", 200, &hint);
    while done.iter().any(Option::is_none) {
        assert!(clock.now_nanos() < 10_000 * MS, "the queue never drained");
        clock.advance(Duration::from_millis(1));
        poll_all(&mut calls, &mut done, clock.now_nanos());
    }
    done.into_iter().flatten().collect()
}

#[test]
fn a_learned_raise_moves_the_queued_calls_to_the_new_rate() {
    let at = queue_then_told(r#""requests";q=50;w=1"#);
    println!("admitted at {at:?} ms");
    // In order, 20 ms apart (50/s) from the first: not 100 ms apart.
    let expected: Vec<u64> = (0..8).map(|i| i * 20).collect();
    assert_eq!(at, expected);
}

#[test]
fn a_learned_cut_moves_the_queued_calls_later() {
    let at = queue_then_told(r#""requests";q=2;w=1"#);
    println!("admitted at {at:?} ms");
    // 2/s from now on: none of them in the 100 ms slots of the old rate.
    let expected: Vec<u64> = (0..8).map(|i| i * 500).collect();
    assert_eq!(at, expected);
}

#[test]
fn a_learned_cut_that_moves_a_call_past_its_deadline_refuses_it_then() {
    let decided = queue_then_told_within(r#""requests";q=2;w=1"#, Duration::from_secs(1));
    println!("decided at {decided:?} (ms, admitted)");
    // Admitted at 2/s while that fits the 1 s deadline; the others are
    // told at the first poll after the reply (1 ms), not at their old
    // 100 ms slots nor past the deadline.
    assert_eq!(
        decided,
        vec![
            (0, true),
            (500, true),
            (1000, true),
            (1, false),
            (1, false),
            (1, false),
            (1, false),
            (1, false)
        ]
    );
}
