//! Grammars of single header values: numbers, Go-style durations, dates.
//!
//! Everything works in `u128` nanoseconds (relative) or `i128` Unix
//! nanoseconds (absolute) and saturates; the caller caps the result. Dates
//! are parsed by `httpdate` and `jiff`.

use std::time::{SystemTime, UNIX_EPOCH};

pub(super) const NANOS_PER_MILLI: u128 = 1_000_000;
pub(super) const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A point in time or a span, as a header stated it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum When {
    /// This many nanoseconds from the response.
    After(u128),
    /// Unix time in nanoseconds.
    At(i128),
}

impl When {
    /// The wait from `reference` (Unix nanoseconds), never negative.
    pub(super) fn wait_from(self, reference: i128) -> u128 {
        match self {
            When::After(n) => n,
            When::At(at) => u128::try_from(at.saturating_sub(reference)).unwrap_or(0),
        }
    }
}

/// `digits [ "." digits ]`: no sign, no exponent, no spaces inside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Decimal {
    /// The integer part, saturating.
    int: u128,
    /// The first (at most 18) fraction digits as an integer ...
    frac: u64,
    /// ... and how many digits that is.
    frac_digits: u32,
    /// A non-zero digit was dropped past the 18th.
    frac_rest: bool,
}

impl Decimal {
    /// Parses `s` in full; `None` on anything else (signs, empty, "1.", ...).
    pub(super) fn parse(s: &str) -> Option<Decimal> {
        let (int_s, frac_s) = match s.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (s, None),
        };
        if int_s.is_empty() && frac_s.is_none_or(str::is_empty) {
            return None;
        }
        let mut int: u128 = 0;
        for b in int_s.bytes() {
            let d = digit(b)?;
            int = int.saturating_mul(10).saturating_add(u128::from(d));
        }
        let (mut frac, mut frac_digits, mut frac_rest) = (0u64, 0u32, false);
        if let Some(f) = frac_s {
            if f.is_empty() {
                return None;
            }
            for b in f.bytes() {
                let d = digit(b)?;
                if frac_digits < 18 {
                    frac = frac * 10 + u64::from(d);
                    frac_digits += 1;
                } else if d != 0 {
                    frac_rest = true;
                }
            }
        }
        Some(Decimal {
            int,
            frac,
            frac_digits,
            frac_rest,
        })
    }

    /// `self * unit_nanos`, rounded up and saturating (`unit_nanos` is at
    /// most an hour).
    pub(super) fn scaled(self, unit_nanos: u128) -> u128 {
        let whole = self.int.saturating_mul(unit_nanos);
        // frac < 10^18 and unit <= 3.6e12: the product fits in u128.
        let num = u128::from(self.frac) * unit_nanos;
        let den = 10u128.pow(self.frac_digits);
        let mut part = num / den;
        if !num.is_multiple_of(den) || (self.frac_rest && unit_nanos > 0) {
            part += 1;
        }
        whole.saturating_add(part)
    }
}

fn digit(b: u8) -> Option<u8> {
    b.is_ascii_digit().then(|| b - b'0')
}

/// A non-negative integer of digits only; `None` if empty or past `u64`.
pub(super) fn parse_u64(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Seconds, possibly fractional (`120`, `1.5`).
pub(super) fn parse_seconds(s: &str) -> Option<u128> {
    Decimal::parse(s).map(|d| d.scaled(NANOS_PER_SEC))
}

/// A Go `time.Duration` string without sign (`1s`, `6m0s`, `1h2m3.5s`), or
/// the bare `0`.
pub(super) fn parse_go_duration(s: &str) -> Option<u128> {
    if s == "0" {
        return Some(0);
    }
    let mut rest = s;
    let mut total: u128 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .bytes()
            .position(|b| !(b.is_ascii_digit() || b == b'.'))
            .unwrap_or(rest.len());
        let number = Decimal::parse(&rest[..num_len])?;
        rest = &rest[num_len..];
        // Longest unit first: "ms" before "m", "µs" before anything.
        const UNITS: [(&str, u128); 8] = [
            ("ns", 1),
            ("us", 1_000),
            ("µs", 1_000),
            ("μs", 1_000),
            ("ms", NANOS_PER_MILLI),
            ("s", NANOS_PER_SEC),
            ("m", 60 * NANOS_PER_SEC),
            ("h", 3_600 * NANOS_PER_SEC),
        ];
        let (unit, nanos) = UNITS.iter().find(|(u, _)| rest.starts_with(u))?;
        rest = &rest[unit.len()..];
        total = total.saturating_add(number.scaled(*nanos));
    }
    Some(total)
}

/// An HTTP-date in any of RFC 9110's three forms, any year 0000 to 9999.
pub(super) fn parse_http_date(s: &str) -> Option<i128> {
    match httpdate::parse_http_date(s) {
        Ok(t) => Some(unix_nanos(t)),
        Err(_) => parse_http_date_before_1970(s),
    }
}

/// Nanoseconds in 400 Gregorian years, after which every weekday repeats.
const GREGORIAN_CYCLE_NANOS: i128 = 146_097 * 86_400 * NANOS_PER_SEC as i128;

/// `httpdate` reads 1970 to 9999 only, so an earlier date is shifted `400·k`
/// years later (same weekday), validated, and shifted back.
fn parse_http_date_before_1970(s: &str) -> Option<i128> {
    let year_at = match s.len() {
        29 => 12, // "Sun, 06 Nov 1994 08:49:37 GMT"
        24 => 20, // "Sun Nov  6 08:49:37 1994"
        _ => return None,
    };
    let digits = s.get(year_at..year_at + 4)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let year: u32 = digits.parse().ok()?;
    if year >= 1970 {
        return None;
    }
    let cycles = (1970 - year).div_ceil(400);
    let shifted = format!(
        "{}{:04}{}",
        &s[..year_at],
        year + 400 * cycles,
        &s[year_at + 4..]
    );
    let t = httpdate::parse_http_date(&shifted).ok()?;
    Some(unix_nanos(t) - i128::from(cycles) * GREGORIAN_CYCLE_NANOS)
}

/// An RFC 3339 timestamp with an offset, any year from 0000 to 9999.
pub(super) fn parse_rfc3339(s: &str) -> Option<i128> {
    // Cheap pre-check so numbers and durations never reach the parser.
    if s.len() < 20 || !s.as_bytes()[..4].iter().all(u8::is_ascii_digit) || s.as_bytes()[4] != b'-'
    {
        return None;
    }
    match s.parse::<jiff::Timestamp>() {
        Ok(t) => Some(t.as_nanosecond()),
        // `jiff` stops at 9999-12-30T22:00Z: a year-9999 time is valid if
        // the same text in 9998 (also non-leap) is; it is past the cap.
        Err(_) if s.starts_with("9999-") => format!("9998{}", &s[4..])
            .parse::<jiff::Timestamp>()
            .ok()
            .map(|_| i128::MAX),
        Err(_) => None,
    }
}

/// `t` as Unix nanoseconds (negative before 1970).
pub(super) fn unix_nanos(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i128::try_from(d.as_nanos()).unwrap_or(i128::MAX),
        Err(e) => i128::try_from(e.duration().as_nanos()).map_or(i128::MIN, |n| -n),
    }
}

/// Numbers in a reset field at or above this are Unix times in seconds
/// (2001-09-09); below, a delta in seconds (up to ~31.7 years).
pub(super) const EPOCH_SECONDS_FROM: u128 = 1_000_000_000;
/// At or above this, Unix times in milliseconds (2001-09-09 in ms).
pub(super) const EPOCH_MILLIS_FROM: u128 = 1_000_000_000_000;
/// At or above this the number is not a time we know how to read; skipped.
pub(super) const EPOCH_MILLIS_UNTIL: u128 = 1_000_000_000_000_000;

/// A reset field: a number classified by magnitude, an RFC 3339
/// timestamp, a Go-style duration, or an HTTP-date.
pub(super) fn parse_reset(s: &str) -> Option<When> {
    if let Some(d) = Decimal::parse(s) {
        let n = d.int;
        return if n < EPOCH_SECONDS_FROM {
            Some(When::After(d.scaled(NANOS_PER_SEC)))
        } else if n < EPOCH_MILLIS_FROM {
            i128::try_from(d.scaled(NANOS_PER_SEC)).ok().map(When::At)
        } else if n < EPOCH_MILLIS_UNTIL {
            i128::try_from(d.scaled(NANOS_PER_MILLI)).ok().map(When::At)
        } else {
            None
        };
    }
    if let Some(at) = parse_rfc3339(s) {
        return Some(When::At(at));
    }
    if let Some(n) = parse_go_duration(s) {
        return Some(When::After(n));
    }
    parse_http_date(s).map(When::At)
}

/// `Retry-After` (and `retry-after-ms` with `unit = NANOS_PER_MILLI`):
/// a non-negative decimal in `unit`, or (seconds only) an HTTP-date.
pub(super) fn parse_retry_after(s: &str, unit: u128) -> Option<When> {
    if let Some(d) = Decimal::parse(s) {
        return Some(When::After(d.scaled(unit)));
    }
    if unit == NANOS_PER_SEC {
        return parse_http_date(s).map(When::At);
    }
    None
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn decimals() {
        assert_eq!(parse_seconds("0"), Some(0));
        assert_eq!(parse_seconds("1.5"), Some(1_500_000_000));
        assert_eq!(parse_seconds(".5"), Some(500_000_000));
        assert_eq!(parse_seconds("0.0000000001"), Some(1), "rounds up");
        assert_eq!(
            parse_seconds("0.0000000000000000000001"),
            Some(1),
            "a digit past the 18th still rounds up"
        );
        for bad in ["", ".", "1.", "-1", "+1", "1e3", "1 ", "1,5", "١"] {
            assert_eq!(parse_seconds(bad), None, "{bad:?}");
        }
        let huge = "9".repeat(200);
        assert!(parse_seconds(&huge).is_some_and(|n| n > 0));
        assert_eq!(
            parse_retry_after("12.5", NANOS_PER_MILLI),
            Some(When::After(12_500_000))
        );
    }

    #[test]
    fn go_durations() {
        let s = |n: u128| n * NANOS_PER_SEC;
        for (input, want) in [
            ("0", Some(0)),
            ("1s", Some(s(1))),
            ("6m0s", Some(s(360))),
            ("12ms", Some(12 * NANOS_PER_MILLI)),
            ("1h2m3.5s", Some(s(3723) + 500 * NANOS_PER_MILLI)),
            ("1.5h", Some(s(5400))),
            ("300us", Some(300_000)),
            ("300µs", Some(300_000)),
            ("300μs", Some(300_000)),
            ("7ns", Some(7)),
            ("2m30s", Some(s(150))),
            ("", None),
            ("1", None),
            ("1x", None),
            ("s", None),
            ("-1s", None),
            ("1s ", None),
            ("1.s", None),
        ] {
            assert_eq!(parse_go_duration(input), want, "{input:?}");
        }
    }

    #[test]
    fn reset_by_magnitude() {
        assert_eq!(parse_reset("30"), Some(When::After(30 * NANOS_PER_SEC)));
        assert_eq!(
            parse_reset("999999999"),
            Some(When::After(999_999_999 * NANOS_PER_SEC))
        );
        assert_eq!(
            parse_reset("1000000000"),
            Some(When::At(1_000_000_000 * 1_000_000_000))
        );
        assert_eq!(
            parse_reset("1700000000.5"),
            Some(When::At(1_700_000_000_500_000_000))
        );
        assert_eq!(
            parse_reset("1700000000123"),
            Some(When::At(1_700_000_000_123_000_000))
        );
        assert_eq!(
            parse_reset("1700000000123456"),
            None,
            "microseconds: skipped"
        );
    }

    #[test]
    fn when_never_negative() {
        assert_eq!(When::At(5).wait_from(10), 0);
        assert_eq!(When::At(i128::MAX).wait_from(i128::MIN), u128::MAX >> 1);
        assert_eq!(When::At(i128::MIN).wait_from(i128::MAX), 0);
    }
}
