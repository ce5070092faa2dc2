//! `headers`: arbitrary header names and bytes through [`ServerHint`], its
//! clamp and the [`RetryPolicy`].
//! Nothing may panic, and every duration must be bounded: each field by
//! [`ServerHint::MAX_DURATION`], the `Date`'s effect by
//! [`ServerHint::MAX_DATE_SKEW`], a retry's wait within the policy's clamp
//! by the deadline and never earlier than the server asked.
//!
//! Input: 8 bytes of "now", 4 of clamp (ms), 4 of deadline budget (ms), 8
//! of RNG seed, then headers: a selector byte (below 0x80 a known name,
//! else the next `sel & 0x3f` bytes), a length byte and that many value
//! bytes (a length at or above 0xc0 picks a known value shape instead, with
//! the next byte spliced in).

use std::time::{Duration, UNIX_EPOCH};

use backpressure::headers::ServerHint;
use backpressure::retry::{Backoff, Deadline, Decision, RetryPolicy};
use backpressure::{ManualClock, Status};

/// `d` in whole milliseconds, rounded up, saturating (as `retry_after_ms`).
fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

const NAMES: &[&str] = &[
    "retry-after",
    "Retry-After",
    "retry-after-ms",
    "x-ms-retry-after-ms",
    "date",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-after",
    "x-ratelimit-used",
    "x-rate-limit-reset",
    "x-ratelimit-scope",
    "x-ratelimit-bucket",
    "x-ratelimit-resource",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-limit-requests",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-tokens-remaining",
];

const VALUES: &[&str] = &[
    "120",
    "1.5",
    "0",
    "99999999999999999999999",
    "Tue, 14 Nov 2023 22:13:20 GMT",
    "Tuesday, 14-Nov-23 22:13:20 GMT",
    "Tue Nov 14 22:13:20 2023",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "Thu, 01 Jan 1970 00:00:00 GMT",
    "Wed, 31 Dec 1969 23:59:59 GMT",
    "Mon, 01 Jan 1900 00:00:00 GMT",
    "Wed Dec 31 23:59:59 1969",
    "9999-12-31T00:00:00Z",
    "1700000000",
    "1700000000.123",
    "1700000000123",
    "999999999",
    "2023-11-14T22:13:50Z",
    "9999-12-31T23:59:59.999999999-23:59",
    "6m0s",
    "1h2m3.5s",
    "12ms",
    "9999999999999999h",
    r#""burst";q=100;w=60, "daily";q=1000;w=86400"#,
    r#""burst";r=0;t=30"#,
    "burst;r=0;t=999999999999999",
    "limit=100, remaining=0, reset=5",
    "10, 10;w=1, 50;w=60",
];

fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if data.len() < n {
        return None;
    }
    let (head, rest) = data.split_at(n);
    *data = rest;
    Some(head)
}

fn take_u64(data: &mut &[u8], n: usize) -> u64 {
    let mut buf = [0u8; 8];
    if let Some(b) = take(data, n) {
        buf[..n].copy_from_slice(b);
    }
    u64::from_le_bytes(buf)
}

/// Runs one input; panics if an invariant breaks.
pub fn headers(mut data: &[u8]) {
    let data = &mut data;
    let secs = take_u64(data, 8) as i64 % 400_000_000_000; // ±12,000 years
    let now = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    }
    .unwrap_or(UNIX_EPOCH);
    // The longest server wait the policy sleeps through.
    let clamp = Duration::from_millis(take_u64(data, 4));
    let budget = Duration::from_millis(take_u64(data, 4));
    let seed = take_u64(data, 8);

    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    while let Some(&[sel]) = take(data, 1) {
        let name = if sel < 0x80 {
            NAMES[usize::from(sel) % NAMES.len()].as_bytes().to_vec()
        } else {
            let n = usize::from(sel & 0x3f).min(data.len());
            take(data, n).unwrap_or_default().to_vec()
        };
        let Some(&[len]) = take(data, 1) else {
            pairs.push((name, Vec::new()));
            break;
        };
        let value = if len >= 0xc0 {
            let mut v = VALUES[usize::from(len - 0xc0) % VALUES.len()]
                .as_bytes()
                .to_vec();
            if let Some(&[b]) = take(data, 1) {
                let at = usize::from(b) % (v.len() + 1);
                v.insert(at, b);
            }
            v
        } else {
            let n = usize::from(len).min(data.len());
            take(data, n).unwrap_or_default().to_vec()
        };
        pairs.push((name, value));
    }

    let hint = ServerHint::from_headers(pairs.iter().map(|(n, v)| (n, v)), now);
    check(&hint);
    let undated = ServerHint::from_headers(
        pairs
            .iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case(b"date"))
            .map(|(n, v)| (n, v)),
        now,
    );
    date_moves_waits_by_at_most_the_skew(&hint, &undated);

    let clock = ManualClock::starting_at(seed >> 8);
    let mut deadline = Deadline::after(clock.clone(), budget);
    let mut policy = RetryPolicy::new(Backoff::new(Duration::from_millis(100), budget).seed(seed))
        .clamp(clamp)
        .max_retries(3);
    for _ in 0..4 {
        let before = deadline.remaining();
        match policy.decide(&hint, &mut deadline) {
            Decision::Retry { after } => {
                assert!(!before.is_zero(), "retried after the deadline passed");
                assert!(
                    after <= before,
                    "retry {after:?} past the budget {before:?}"
                );
                if let Some(w) = hint.wait() {
                    assert!(after >= w, "retried after {after:?}, earlier than {w:?}");
                    assert!(w <= clamp, "slept through {w:?} beyond {clamp:?}");
                }
                clock.advance(after);
            }
            Decision::NotRetried(s) => {
                // In whole milliseconds, rounded up: at least the wait.
                let r = s.retry_after().expect("a surfaced decision says when");
                match s.status {
                    Status::RateLimited => {
                        assert_eq!(s.retry_after_ms, hint.wait().map(ceil_ms));
                        assert!(r > before.min(clamp), "{r:?} fitted; why stop?");
                    }
                    _ if before.is_zero() => {
                        // Expired: no retry, whatever the wait.
                        assert_eq!(s.status, Status::TimedOut);
                    }
                    _ => {
                        assert!(hint.wait().is_none() && r <= budget);
                        assert!(r > before, "{r:?} fitted in {before:?}; why stop?");
                    }
                }
                assert_eq!(
                    deadline.remaining(),
                    before,
                    "a surfaced wait costs nothing"
                );
                break;
            }
            Decision::GiveUp => break,
            Decision::Stop => unreachable!("`decide` is about a failed attempt"),
            // `decide` is about a fault: never the server's capacity.
            d @ (Decision::Readmit { .. } | Decision::Surface(_)) => {
                panic!("a fault decided as capacity: {d:?}")
            }
            d => panic!("a decision this model does not know: {d:?}"),
        }
    }
}

/// The response's `Date` is trusted only within
/// [`ServerHint::MAX_DATE_SKEW`] of `now`, so with or without it every wait
/// differs by at most that much, and nothing else changes.
fn date_moves_waits_by_at_most_the_skew(dated: &ServerHint, undated: &ServerHint) {
    let skew = ServerHint::MAX_DATE_SKEW;
    let close = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
        (Some(a), Some(b)) => assert!(
            a.abs_diff(b) <= skew,
            "the Date moved a wait from {b:?} to {a:?}"
        ),
        (a, b) => assert_eq!(a, b),
    };
    close(dated.retry_after, undated.retry_after);
    close(dated.reset_after, undated.reset_after);
    assert_eq!(dated.policies.len(), undated.policies.len());
    for (p, q) in dated.policies.iter().zip(&undated.policies) {
        close(p.reset_after, q.reset_after);
        assert_eq!((p.remaining, p.window), (q.remaining, q.window));
    }
}

fn check(hint: &ServerHint) {
    let max = ServerHint::MAX_DURATION;
    let mut durations = vec![hint.retry_after, hint.reset_after, hint.wait()];
    for p in &hint.policies {
        durations.extend([p.window, p.reset_after]);
    }
    for d in durations.into_iter().flatten() {
        assert!(d <= max, "{d:?} exceeds the cap");
    }
    if hint.retry_after.is_some() {
        assert_eq!(
            hint.wait(),
            hint.retry_after,
            "Retry-After beats every reset"
        );
    }
    if let Some(s) = &hint.scope {
        assert!(!s.is_empty() && s.len() <= 256);
    }
    assert!(hint.policies.len() <= 32);
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_byte_strings_keep_every_duration_bounded() {
        let mut rng = fastrand::Rng::with_seed(0x4ead);
        let runs = if cfg!(miri) { 30 } else { 5_000 };
        for _ in 0..runs {
            let len = rng.usize(24..160);
            let mut data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            // Two runs in three: plausible clocks, known names and shapes.
            if rng.u8(..3) > 0 {
                data.truncate(24);
                data[..8].copy_from_slice(&rng.i64(0..4_000_000_000).to_le_bytes());
                data[8..12].copy_from_slice(&rng.u32(..120_000).to_le_bytes());
                data[12..16].copy_from_slice(&rng.u32(..120_000).to_le_bytes());
                for _ in 0..rng.usize(1..6) {
                    let splice = *b"0123456789 .;-,=\"Zsm"
                        .get(rng.usize(..21))
                        .unwrap_or(&b'0');
                    data.extend([rng.u8(..0x80), 0xc0 | rng.u8(..0x3f), splice]);
                }
            }
            super::headers(&data);
        }
    }
}
