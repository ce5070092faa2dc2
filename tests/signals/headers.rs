//! Header vectors for every syntax `ServerHint` reads, as one table: each
//! case is a response's headers, the time it arrived, and the whole hint
//! rendered as a line, so a wrong field anywhere fails the case.

use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backpressure::headers::ServerHint;

/// Unix 1700000000 = Tue, 14 Nov 2023 22:13:20 GMT.
const T0: u64 = 1_700_000_000;
const DATE: &str = "Tue, 14 Nov 2023 22:13:20 GMT";

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn opt<T: std::fmt::Debug>(v: &Option<T>) -> String {
    v.as_ref().map_or("-".into(), |v| format!("{v:?}"))
}

/// The whole hint on one line.
fn render(h: &ServerHint) -> String {
    let mut s = format!(
        "retry={} limit={} remaining={} used={} reset={} scope={} wait={}",
        opt(&h.retry_after),
        opt(&h.limit),
        opt(&h.remaining),
        opt(&h.used),
        opt(&h.reset_after),
        h.scope.as_deref().unwrap_or("-"),
        opt(&h.wait()),
    );
    for p in &h.policies {
        write!(
            s,
            " | {} q={} qu={} w={} r={} t={}",
            p.name.as_deref().unwrap_or("(unnamed)"),
            opt(&p.quota),
            p.quota_unit.as_deref().unwrap_or("-"),
            opt(&p.window),
            opt(&p.remaining),
            opt(&p.reset_after),
        )
        .unwrap();
    }
    s
}

struct Case {
    name: &'static str,
    headers: &'static [(&'static str, &'static str)],
    now: u64,
    want: &'static str,
}

const NOTHING: &str = "retry=- limit=- remaining=- used=- reset=- scope=- wait=-";

#[rustfmt::skip]
const CASES: &[Case] = &[
    // --- Retry-After -----------------------------------------------------
    Case { name: "delta seconds", headers: &[("Retry-After", "120")], now: T0,
        want: "retry=120s limit=- remaining=- used=- reset=- scope=- wait=120s" },
    Case { name: "zero", headers: &[("retry-after", "0")], now: T0,
        want: "retry=0ns limit=- remaining=- used=- reset=- scope=- wait=0ns" },
    Case { name: "fractional seconds", headers: &[("retry-after", "1.5")], now: T0,
        want: "retry=1.5s limit=- remaining=- used=- reset=- scope=- wait=1.5s" },
    Case { name: "surrounding whitespace", headers: &[("RETRY-AFTER", " \t7 ")], now: T0,
        want: "retry=7s limit=- remaining=- used=- reset=- scope=- wait=7s" },
    Case { name: "IMF-fixdate, no Date: against now", headers: &[("Retry-After", "Tue, 14 Nov 2023 22:15:20 GMT")], now: T0,
        want: "retry=120s limit=- remaining=- used=- reset=- scope=- wait=120s" },
    Case { name: "RFC 850 date", headers: &[("Retry-After", "Tuesday, 14-Nov-23 22:15:20 GMT")], now: T0,
        want: "retry=120s limit=- remaining=- used=- reset=- scope=- wait=120s" },
    Case { name: "asctime date", headers: &[("Retry-After", "Tue Nov 14 22:15:20 2023")], now: T0,
        want: "retry=120s limit=- remaining=- used=- reset=- scope=- wait=120s" },
    Case { name: "asctime, one-digit day", headers: &[("Retry-After", "Thu Nov  2 22:13:20 2023")], now: T0 - 12 * 86_400 - 60,
        want: "retry=60s limit=- remaining=- used=- reset=- scope=- wait=60s" },
    Case { name: "date in the past is zero, never negative", headers: &[("Retry-After", "Tue, 14 Nov 2023 22:13:00 GMT")], now: T0,
        want: "retry=0ns limit=- remaining=- used=- reset=- scope=- wait=0ns" },
    Case { name: "skewed local clock: the response's Date rules",
        headers: &[("Date", DATE), ("Retry-After", "Tue, 14 Nov 2023 22:15:20 GMT")], now: T0 + 3_600,
        want: "retry=120s limit=- remaining=- used=- reset=- scope=- wait=120s" },
    Case { name: "skew the other way, Date after Retry-After",
        headers: &[("Retry-After", "Tue, 14 Nov 2023 22:15:20 GMT"), ("date", DATE)], now: T0 - 86_400,
        want: "retry=120s limit=- remaining=- used=- reset=- scope=- wait=120s" },
    Case { name: "invalid Date falls back to now",
        headers: &[("Date", "yesterday"), ("Retry-After", "Tue, 14 Nov 2023 22:15:20 GMT")], now: T0 + 20,
        want: "retry=100s limit=- remaining=- used=- reset=- scope=- wait=100s" },
    Case { name: "retry-after-ms", headers: &[("retry-after-ms", "1500")], now: T0,
        want: "retry=1.5s limit=- remaining=- used=- reset=- scope=- wait=1.5s" },
    Case { name: "x-ms-retry-after-ms, fractional", headers: &[("x-ms-retry-after-ms", "12.5")], now: T0,
        want: "retry=12.5ms limit=- remaining=- used=- reset=- scope=- wait=12.5ms" },
    Case { name: "Azure sends all three: the precise one wins",
        headers: &[("retry-after", "2"), ("x-ms-retry-after-ms", "1800"), ("retry-after-ms", "1500")], now: T0,
        want: "retry=1.5s limit=- remaining=- used=- reset=- scope=- wait=1.5s" },
    Case { name: "garbage Retry-After skipped, second line used",
        headers: &[("retry-after", "soon"), ("retry-after", "-3"), ("retry-after", "4")], now: T0,
        want: "retry=4s limit=- remaining=- used=- reset=- scope=- wait=4s" },
    Case { name: "wrong weekday is not a date", headers: &[("Retry-After", "Mon, 14 Nov 2023 22:15:20 GMT")], now: T0,
        want: NOTHING },
    Case { name: "huge delta is capped", headers: &[("Retry-After", "99999999999999999999999999")], now: T0,
        want: "retry=4294967295s limit=- remaining=- used=- reset=- scope=- wait=4294967295s" },

    // --- IETF RateLimit, current structured form --------------------------
    Case { name: "RateLimit + RateLimit-Policy (Strings)",
        headers: &[("RateLimit-Policy", r#""burst";q=100;w=60, "daily";q=1000;w=86400;qu="requests""#),
                   ("RateLimit", r#""burst";r=0;t=30, "daily";r=900;t=5000"#)], now: T0,
        want: "retry=- limit=100 remaining=0 used=- reset=30s scope=- wait=30s \
               | burst q=100 qu=- w=60s r=0 t=30s | daily q=1000 qu=requests w=86400s r=900 t=5000s" },
    Case { name: "Token names, as in the draft's examples",
        headers: &[("RateLimit-Policy", "burst;q=100;w=60"), ("RateLimit", "burst;r=50;t=30")], now: T0,
        want: "retry=- limit=100 remaining=50 used=- reset=30s scope=- wait=- | burst q=100 qu=- w=60s r=50 t=30s" },
    Case { name: "RateLimit alone",
        headers: &[("ratelimit", r#""default";r=50;t=30"#)], now: T0,
        want: "retry=- limit=- remaining=50 used=- reset=30s scope=- wait=- | default q=- qu=- w=- r=50 t=30s" },
    Case { name: "repeated RateLimit lines combine",
        headers: &[("RateLimit", r#""a";r=5;t=1"#), ("RateLimit", r#""b";r=0;t=9"#)], now: T0,
        want: "retry=- limit=- remaining=0 used=- reset=9s scope=- wait=9s | a q=- qu=- w=- r=5 t=1s | b q=- qu=- w=- r=0 t=9s" },
    Case { name: "negative and non-integer parameters skipped",
        headers: &[("RateLimit", r#""x";r=-1;t=?1, "y";r=3;t=4"#)], now: T0,
        want: "retry=- limit=- remaining=3 used=- reset=4s scope=- wait=- | x q=- qu=- w=- r=- t=- | y q=- qu=- w=- r=3 t=4s" },
    Case { name: "malformed structured field is skipped, the rest count",
        headers: &[("RateLimit", r#""x";r=5;t="#), ("retry-after", "1")], now: T0,
        want: "retry=1s limit=- remaining=- used=- reset=- scope=- wait=1s" },

    // --- IETF RateLimit, older forms ---------------------------------------
    Case { name: "dictionary draft",
        headers: &[("RateLimit", "limit=100, remaining=50, reset=5")], now: T0,
        want: "retry=- limit=100 remaining=50 used=- reset=5s scope=- wait=-" },
    Case { name: "split fields",
        headers: &[("RateLimit-Limit", "100"), ("RateLimit-Remaining", "0"), ("RateLimit-Reset", "5")], now: T0,
        want: "retry=- limit=100 remaining=0 used=- reset=5s scope=- wait=5s" },
    Case { name: "split fields, limit with policy list",
        headers: &[("RateLimit-Limit", "10, 10;w=1, 50;w=60"), ("RateLimit-Policy", "10;w=1, 50;w=60")], now: T0,
        want: "retry=- limit=10 remaining=- used=- reset=- scope=- wait=- \
               | (unnamed) q=10 qu=- w=1s r=- t=- | (unnamed) q=50 qu=- w=60s r=- t=-" },
    Case { name: "IETF beats X-RateLimit",
        headers: &[("x-ratelimit-remaining", "7"), ("ratelimit-remaining", "3"), ("RateLimit", "limit=10, remaining=2, reset=1")], now: T0,
        want: "retry=- limit=10 remaining=2 used=- reset=1s scope=- wait=-" },

    // --- X-RateLimit-* -------------------------------------------------------
    Case { name: "GitHub: epoch reset against Date, used, resource",
        headers: &[("date", DATE), ("x-ratelimit-limit", "5000"), ("x-ratelimit-remaining", "0"),
                   ("x-ratelimit-used", "5000"), ("x-ratelimit-reset", "1700000060"), ("x-ratelimit-resource", "core")],
        now: T0 + 45,
        want: "retry=- limit=5000 remaining=0 used=5000 reset=60s scope=core wait=60s" },
    Case { name: "remaining derived from limit - used",
        headers: &[("x-ratelimit-limit", "60"), ("x-ratelimit-used", "61")], now: T0,
        want: "retry=- limit=60 remaining=0 used=61 reset=- scope=- wait=-" },
    Case { name: "Discord: decimals, reset-after preferred, bucket",
        headers: &[("X-RateLimit-Limit", "5"), ("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "1700000001.5"),
                   ("X-RateLimit-Reset-After", "1.337"), ("X-RateLimit-Bucket", "abcd1234")], now: T0 - 100,
        want: "retry=- limit=5 remaining=0 used=- reset=1.337s scope=abcd1234 wait=1.337s" },
    Case { name: "Discord 429: retry-after beats reset, scope beats bucket",
        headers: &[("X-RateLimit-Bucket", "abcd1234"), ("X-RateLimit-Scope", "shared"), ("Retry-After", "3"),
                   ("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset-After", "64.57")], now: T0,
        want: "retry=3s limit=- remaining=0 used=- reset=64.57s scope=shared wait=3s" },
    Case { name: "epoch seconds with a fraction",
        headers: &[("x-ratelimit-reset", "1700000002.25"), ("x-ratelimit-remaining", "0")], now: T0,
        want: "retry=- limit=- remaining=0 used=- reset=2.25s scope=- wait=2.25s" },
    Case { name: "epoch milliseconds",
        headers: &[("x-rate-limit-reset", "1700000001500"), ("x-rate-limit-remaining", "0")], now: T0,
        want: "retry=- limit=- remaining=0 used=- reset=1.5s scope=- wait=1.5s" },
    Case { name: "last delta below 10^9 seconds",
        headers: &[("x-ratelimit-reset", "999999999")], now: T0,
        want: "retry=- limit=- remaining=- used=- reset=999999999s scope=- wait=-" },
    Case { name: "epoch microseconds: skipped",
        headers: &[("x-ratelimit-reset", "1700000001500000")], now: T0,
        want: NOTHING },
    Case { name: "epoch in the past is zero",
        headers: &[("x-ratelimit-reset", "1600000000")], now: T0,
        want: "retry=- limit=- remaining=- used=- reset=0ns scope=- wait=-" },
    Case { name: "RFC 3339 reset",
        headers: &[("x-ratelimit-reset", "2023-11-14T22:13:50Z")], now: T0,
        want: "retry=- limit=- remaining=- used=- reset=30s scope=- wait=-" },
    Case { name: "RFC 3339 reset with offset and fraction",
        headers: &[("x-ratelimit-reset", "2023-11-15T00:13:50.5+02:00")], now: T0,
        want: "retry=- limit=- remaining=- used=- reset=30.5s scope=- wait=-" },
    Case { name: "RFC 3339 reset against a skewed Date",
        headers: &[("date", DATE), ("x-ratelimit-reset", "2023-11-14T22:13:50Z")], now: T0 + 600,
        want: "retry=- limit=- remaining=- used=- reset=30s scope=- wait=-" },
    Case { name: "Go duration reset",
        headers: &[("x-ratelimit-reset", "1h2m3.5s")], now: T0,
        want: "retry=- limit=- remaining=- used=- reset=3723.5s scope=- wait=-" },
    Case { name: "OpenAI: per-resource limits, the binding one summarised",
        headers: &[("x-ratelimit-limit-requests", "60"), ("x-ratelimit-limit-tokens", "150000"),
                   ("x-ratelimit-remaining-requests", "59"), ("x-ratelimit-remaining-tokens", "0"),
                   ("x-ratelimit-reset-requests", "1s"), ("x-ratelimit-reset-tokens", "6m0s")], now: T0,
        want: "retry=- limit=150000 remaining=0 used=- reset=360s scope=- wait=360s \
               | requests q=60 qu=- w=- r=59 t=1s | tokens q=150000 qu=- w=- r=0 t=360s" },
    Case { name: "OpenAI: millisecond reset",
        headers: &[("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "12ms")], now: T0,
        want: "retry=- limit=- remaining=0 used=- reset=12ms scope=- wait=12ms | requests q=- qu=- w=- r=0 t=12ms" },
    Case { name: "Anthropic: RFC 3339 per-resource resets",
        headers: &[("date", DATE), ("anthropic-ratelimit-requests-limit", "50"),
                   ("anthropic-ratelimit-requests-remaining", "0"),
                   ("anthropic-ratelimit-requests-reset", "2023-11-14T22:14:20Z"),
                   ("anthropic-ratelimit-input-tokens-remaining", "1000"),
                   ("anthropic-ratelimit-input-tokens-reset", "2023-11-14T22:13:21Z")], now: T0,
        want: "retry=- limit=50 remaining=0 used=- reset=60s scope=- wait=60s \
               | requests q=50 qu=- w=60s r=0 t=60s | input-tokens q=- qu=- w=- r=1000 t=1s" },
    Case { name: "a top-level counter and an exhausted policy: the longest wait",
        headers: &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "5"),
                   ("x-ratelimit-remaining-tokens", "0"), ("x-ratelimit-reset-tokens", "20s")], now: T0,
        want: "retry=- limit=- remaining=0 used=- reset=5s scope=- wait=20s | tokens q=- qu=- w=- r=0 t=20s" },
    Case { name: "a stated window beats the one a header name implies",
        headers: &[("x-ratelimit-limit-minute", "100"), ("RateLimit-Policy", r#""minute";q=100;w=1"#),
                   ("ratelimit-limit-second", "5")], now: T0,
        want: "retry=- limit=- remaining=- used=- reset=- scope=- wait=- \
               | minute q=100 qu=- w=1s r=- t=- | second q=5 qu=- w=- r=- t=-" },
    Case { name: "Kong-style window suffix",
        headers: &[("X-RateLimit-Limit-Minute", "10"), ("X-RateLimit-Remaining-Minute", "9")], now: T0,
        want: "retry=- limit=10 remaining=9 used=- reset=- scope=- wait=- | minute q=10 qu=- w=60s r=9 t=-" },

    // --- garbage -----------------------------------------------------------
    Case { name: "unparseable counters skipped",
        headers: &[("x-ratelimit-limit", "-1"), ("x-ratelimit-remaining", "lots"), ("x-ratelimit-reset", "1e3"),
                   ("x-ratelimit-limit", "99999999999999999999999"), ("x-ratelimit-scope", "bad\u{7}scope"),
                   ("x-ratelimit-used", "2")], now: T0,
        want: "retry=- limit=- remaining=- used=2 reset=- scope=- wait=-" },
    Case { name: "unknown headers ignored",
        headers: &[("content-type", "text/plain"), ("x-ratelimit-", "1"), ("x-ratelimit-foo-bar", "1"), ("ratelimit-", "")],
        now: T0, want: NOTHING },
];

#[test]
fn every_syntax() {
    let mut failures = Vec::new();
    for case in CASES {
        let hint = ServerHint::from_headers(case.headers.iter().copied(), at(case.now));
        let got = render(&hint);
        let want = case.want.split_whitespace().collect::<Vec<_>>().join(" ");
        if got != want {
            failures.push(format!("{}\n   got: {got}\n  want: {want}", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn names_and_values_as_bytes() {
    let headers: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"Retry-After".to_vec(), b"\xff\xfe".to_vec()), // not UTF-8: skipped
        (b"X-Ratelimit-\xc3\xa9".to_vec(), b"1".to_vec()), // not ASCII: skipped
        (b"retry-after".to_vec(), b"2".to_vec()),
    ];
    let hint = ServerHint::from_headers(headers, at(T0));
    assert_eq!(hint.retry_after, Some(Duration::from_secs(2)));
}

#[cfg(feature = "http")]
#[test]
fn from_header_map_reads_repeated_and_mixed_case() {
    let mut map = http::HeaderMap::new();
    map.append("RateLimit", r#""a";r=5;t=1"#.parse().unwrap());
    map.append("ratelimit", r#""b";r=0;t=9"#.parse().unwrap());
    map.insert("X-RateLimit-Scope", "org".parse().unwrap());
    let hint = ServerHint::from_header_map(&map, at(T0));
    assert_eq!(hint.wait(), Some(Duration::from_secs(9)));
    assert_eq!(hint.scope.as_deref(), Some("org"));
    assert_eq!(hint.policies.len(), 2);
}

#[cfg(feature = "serde")]
#[test]
fn serde_round_trip_in_milliseconds() {
    let hint = ServerHint::from_headers(
        [
            ("retry-after", "1.0000001"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-scope", "user"),
            ("RateLimit-Policy", r#""burst";q=100;w=60"#),
        ],
        at(T0),
    );
    let json = serde_json::to_value(&hint).unwrap();
    assert_eq!(json["retry_after_ms"], 1001, "rounded up, never down");
    assert_eq!(json["scope"], "user");
    assert_eq!(json["policies"][0]["window_ms"], 60_000);
    let back: ServerHint = serde_json::from_value(json).unwrap();
    assert_eq!(back.retry_after, Some(Duration::from_millis(1001)));
    assert_eq!(back.policies, hint.policies);
    let sparse: ServerHint = serde_json::from_str(r#"{"remaining": 3}"#).unwrap();
    assert_eq!(sparse.remaining, Some(3));
    assert_eq!(sparse.retry_after, None);
}

/// Issue #10, item 12: a response `Date` of 1970 was trusted, so an epoch
/// reset of 1700000000 became a 53-year wait. A `Date` more than
/// `MAX_DATE_SKEW` from ours is ignored in favour of `now`.
#[test]
fn server_date_of_1970_is_ignored_not_a_53_year_wait() {
    let reset = |date: &str, now: u64| {
        ServerHint::from_headers(
            [
                ("date", date),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1700000060"),
            ],
            at(now),
        )
        .reset_after
    };
    let secs = |s| Some(Duration::from_secs(s));
    assert_eq!(reset("Thu, 01 Jan 1970 00:00:00 GMT", T0), secs(60));
    // Far in the future is as wrong as far in the past.
    assert_eq!(reset("Fri, 31 Dec 9999 23:59:59 GMT", T0), secs(60));
    // Within a day, the server's clock still rules (ours may be off).
    assert_eq!(
        reset("Tue, 14 Nov 2023 22:13:00 GMT", T0 + 86_400 - 20),
        secs(80)
    );
    assert_eq!(reset(DATE, T0 + 86_400), secs(60));
    assert_eq!(reset(DATE, T0 - 86_400), secs(60));
    // A second past the day: ours.
    assert_eq!(reset(DATE, T0 + 86_401), secs(0));
    assert_eq!(reset(DATE, T0 - 86_401), secs(86_461));
    assert_eq!(ServerHint::MAX_DATE_SKEW, Duration::from_secs(86_400));
}

/// Issue #10, item 12: `httpdate` reads years from 1970 only, so a
/// `Retry-After` date before 1970 was skipped (`None`) instead of read as
/// the past it is: a zero wait.
#[test]
fn retry_after_date_before_1970_is_a_zero_wait() {
    for date in [
        "Wed, 31 Dec 1969 23:59:59 GMT",
        "Mon, 01 Jan 1900 00:00:00 GMT",
        "Sat, 01 Jan 0000 00:00:00 GMT",
        "Wed Dec 31 23:59:59 1969",
    ] {
        let hint = ServerHint::from_headers([("retry-after", date)], at(T0));
        assert_eq!(hint.retry_after, Some(Duration::ZERO), "{date}");
        let hint = ServerHint::from_headers(
            [("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", date)],
            at(T0),
        );
        assert_eq!(hint.reset_after, Some(Duration::ZERO), "{date}");
    }
    // Still a date: a wrong weekday before 1970 is skipped like any other.
    let hint = ServerHint::from_headers([("retry-after", "Thu, 31 Dec 1969 23:59:59 GMT")], at(T0));
    assert_eq!(hint.retry_after, None);
    // And it is the right instant: a `now` before 1970 waits until then.
    let hint = ServerHint::from_headers(
        [("retry-after", "Wed, 31 Dec 1969 23:59:59 GMT")],
        UNIX_EPOCH - Duration::from_secs(61),
    );
    assert_eq!(hint.retry_after, Some(Duration::from_secs(60)));
}

/// Issue #10, item 12: `jiff` stops at 9999-12-30T22:00Z, so an RFC 3339
/// reset on 9999-12-31 was skipped while 9999-12-30 was capped. Every
/// far-future form is capped alike.
#[test]
fn rfc3339_reset_in_year_9999_is_capped_like_the_day_before() {
    let reset = |v: &str| {
        ServerHint::from_headers(
            [("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", v)],
            at(T0),
        )
        .reset_after
    };
    let max = Some(ServerHint::MAX_DURATION);
    for v in [
        "9999-12-30T00:00:00Z",
        "9999-12-31T00:00:00Z",
        "9999-12-31T23:59:59.999999999Z",
        "9999-12-31T23:59:59-23:59",
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "Fri Dec 31 23:59:59 9999",
        "999999999999999",
        "99999999999h",
    ] {
        assert_eq!(reset(v), max, "{v}");
    }
    // Not a date: still skipped.
    assert_eq!(reset("9999-02-29T00:00:00Z"), None);
    assert_eq!(reset("9999-12-32T00:00:00Z"), None);
}
