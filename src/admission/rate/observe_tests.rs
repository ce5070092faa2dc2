//! Unit tests of `observe.rs`: how a reply's headers are read.

use super::*;

fn hint(limit: u64, remaining: u64) -> ServerHint {
    ServerHint {
        limit: Some(limit),
        remaining: Some(remaining),
        policies: vec![crate::headers::Policy {
            quota: Some(limit),
            remaining: Some(remaining),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn a_share_of_a_limit_leaves_its_headroom_to_the_others() {
    let h = with_share(&hint(100, 60), 0.5);
    assert_eq!((h.limit, h.remaining), (Some(50), Some(10)));
    assert_eq!(
        (h.policies[0].quota, h.policies[0].remaining),
        (Some(50), Some(10))
    );
    // Below the headroom: none left for this layer.
    assert_eq!(with_share(&hint(100, 30), 0.5).remaining, Some(0));
    // At least one request of a limit; a limit of 0 stays 0.
    let h = with_share(&hint(10, 10), 0.0);
    assert_eq!((h.limit, h.remaining), (Some(1), Some(1)));
    let h = with_share(&hint(0, 0), 0.5);
    assert_eq!((h.limit, h.remaining), (Some(0), Some(0)));
    // The whole key.
    assert_eq!(with_share(&hint(7, 3), 1.0).remaining, Some(3));
}

use crate::headers::Policy;

/// A named policy: `quota` (its limit) and `window` as given.
fn policy(name: Option<&str>, quota: Option<u64>, window: Option<Duration>) -> Policy {
    Policy {
        name: name.map(Into::into),
        quota,
        window,
        ..Default::default()
    }
}

/// A policy `name` with `remaining` of `quota` left, resetting in `reset`.
fn left(name: &str, quota: Option<u64>, remaining: u64, reset: Option<Duration>) -> Policy {
    Policy {
        remaining: Some(remaining),
        reset_after: reset,
        ..policy(Some(name), quota, None)
    }
}

fn with(policies: Vec<Policy>) -> ServerHint {
    ServerHint {
        policies,
        ..Default::default()
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// A name that only starts like a quota's is another quota.
#[test]
fn a_name_is_the_same_quota_only_whole() {
    assert!(same_name("input-tokens", "INPUT_tokens"));
    assert!(!same_name("tokens", "tokens_in"));
    assert!(!same_name("input_tokens", "input"));
    assert!(!same_name("tokens", "tokenz"));
}

/// Only a named limit without a window is given the provider's.
#[test]
fn only_a_named_limit_without_a_window_is_given_one() {
    let cases = [
        (policy(Some("tokens"), Some(10), None), true),
        (
            policy(Some("tokens"), Some(10), Some(Duration::from_secs(5))),
            false,
        ),
        (
            policy(Some("tokens"), None, Some(Duration::from_secs(5))),
            false,
        ),
        (policy(Some("tokens"), None, None), false),
        (policy(None, Some(10), None), false),
        (policy(None, None, None), false),
    ];
    for (p, needs) in cases {
        let hint = with(vec![p.clone()]);
        assert_eq!(needs_window(&hint), needs, "{p:?}");
        let given = with_window(&hint, MINUTE).policies[0].window;
        assert_eq!(given, if needs { Some(MINUTE) } else { p.window }, "{p:?}");
    }
}

/// The quota a 429 spends is the named one with nothing left.
#[test]
fn a_429_spends_the_quota_with_nothing_left() {
    let hint = with(vec![left("tokens", Some(1_000), 0, None)]);
    assert_eq!(
        spent_quota(&hint).and_then(|p| p.name.as_deref()),
        Some("tokens")
    );
    // Requests spent: a request limit, not a weighted quota.
    let hint = with(vec![
        left(REQUESTS, Some(10), 0, None),
        left("tokens", Some(1_000), 0, None),
    ]);
    assert!(spent_quota(&hint).is_none());
    // None at 0: the scarcest share (a limit of 0 counts as a full share).
    let hint = with(vec![
        left(REQUESTS, None, 3, None),
        left("tokens", Some(0), 5, None),
        left("input_tokens", Some(10), 15, None),
    ]);
    assert_eq!(
        spent_quota(&hint).and_then(|p| p.name.as_deref()),
        Some("tokens")
    );
}

/// A reply's wait on the requests is a spent request limit's reset only.
#[test]
fn only_a_spent_request_limit_waits_the_requests() {
    let clock = crate::clock::ManualClock::new();
    let tokens = [Resource {
        name: "tokens".into(),
        buckets: crate::keyed::Scoped::with_clock(
            crate::Quota::new(1_000.0, 1_000).unwrap(),
            clock,
        ),
        learned: false,
    }];
    let five = Some(Duration::from_secs(5));
    // The top-level count spent, with the tokens policy at 0: the tokens'.
    let mut hint = with(vec![left("tokens", Some(1_000), 0, five)]);
    hint.remaining = Some(0);
    hint.reset_after = five;
    assert_eq!(request_wait(&hint, &tokens), None);
    // The same with the tokens not metered here: the requests wait.
    assert_eq!(request_wait::<crate::clock::ManualClock>(&hint, &[]), five);
    // The top-level count spent, the metered tokens not: the requests'.
    let mut hint = with(vec![left("tokens", Some(1_000), 10, five)]);
    hint.remaining = Some(0);
    hint.reset_after = five;
    assert_eq!(request_wait(&hint, &tokens), five);
    // A limit with some left waits nobody, metered or not.
    let hint = with(vec![left("daily", Some(1_000), 10, Some(MINUTE))]);
    assert_eq!(request_wait(&hint, &tokens), None);
    let hint = with(vec![left("daily", Some(1_000), 0, Some(MINUTE))]);
    assert_eq!(request_wait(&hint, &tokens), Some(MINUTE));
}
