//! From header pairs to a [`ServerHint`]: name dispatch, precedence and the
//! IETF structured fields (via `sfv`). One pass collects every field into
//! an [`Acc`]; absolute times stay absolute until `Date` is known.

use std::time::{Duration, SystemTime};

use sfv::{BareItem, Dictionary, List, ListEntry, Parser};

use super::value::{self, When, NANOS_PER_MILLI, NANOS_PER_SEC};
use super::{Policy, ServerHint};

/// Longest scope or policy name kept, in bytes; longer ones are skipped.
const MAX_NAME_LEN: usize = 256;
/// Bytes of `RateLimit` / `RateLimit-Policy` kept across repeated lines.
const MAX_STRUCTURED_LEN: usize = 16 * 1024;
/// Most policies kept from one response.
const MAX_POLICIES: usize = 32;

/// Where a top-level field came from; a lower rank wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    /// `RateLimit` structured fields (current and dictionary drafts).
    Ietf,
    /// `RateLimit-Limit` and friends (older drafts).
    IetfSplit,
    /// `X-RateLimit-*` / `X-Rate-Limit-*`.
    Vendor,
}

/// A value with its field's rank; the best rank wins, then the first seen.
#[derive(Clone, Copy, Debug)]
struct Ranked<T>(Option<(Rank, T)>);

impl<T> Default for Ranked<T> {
    fn default() -> Self {
        Ranked(None)
    }
}

impl<T> Ranked<T> {
    fn offer(&mut self, rank: Rank, v: Option<T>) {
        if let Some(v) = v
            && self.0.as_ref().is_none_or(|(r, _)| rank < *r)
        {
            self.0 = Some((rank, v));
        }
    }
    fn get(self) -> Option<T> {
        self.0.map(|(_, v)| v)
    }
}

/// A policy while collecting (times not yet resolved).
#[derive(Debug, Default)]
struct RawPolicy {
    name: Option<String>,
    quota: Option<u64>,
    quota_unit: Option<String>,
    window: Option<u128>,
    /// The window the vendor header family documents, used only when
    /// nothing states one.
    documented_window: Option<u128>,
    remaining: Option<u64>,
    reset: Option<When>,
}

#[derive(Debug, Default)]
pub(super) struct Acc {
    /// The first `Date` value, parsed only if an absolute time needs it.
    date: Option<String>,
    retry_after: Option<When>,
    retry_after_ms: Option<When>,
    ms_retry_after_ms: Option<When>,
    limit: Ranked<u64>,
    remaining: Ranked<u64>,
    used: Ranked<u64>,
    /// Relative resets, kept apart so they beat absolute ones of the same
    /// rank (Discord sends both).
    reset_after: Ranked<When>,
    reset_at: Ranked<When>,
    scope: [Option<String>; 3],
    policies: Vec<RawPolicy>,
    ratelimit: String,
    ratelimit_policy: String,
}

/// Whether [`Acc::add`] could use a header of this (lower-case) name: a
/// cheap filter for responses with no limit headers.
#[inline]
pub(super) fn is_candidate(name: &str) -> bool {
    name == "date"
        || name.starts_with("retry-after")
        || name.starts_with("ratelimit")
        || name.starts_with("x-rate")
        || name.starts_with("anthropic-ratelimit-")
        || name == "x-ms-retry-after-ms"
}

/// One of the counters a rate-limit header carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Limit,
    Remaining,
    Reset,
    Used,
}

impl Field {
    fn from_name(s: &str) -> Option<Field> {
        Some(match s {
            "limit" => Field::Limit,
            "remaining" => Field::Remaining,
            "reset" => Field::Reset,
            "used" => Field::Used,
            _ => return None,
        })
    }
}

/// The window a vendor header's per-resource limit names itself (Kong's
/// `x-ratelimit-limit-{second,minute,hour,day}`; Anthropic's is the minute).
fn documented_window(resource: &str) -> Option<u128> {
    let secs: u128 = match resource {
        "minute" => 60,
        "second" => 1,
        "hour" => 3_600,
        "day" => 86_400,
        _ => return None,
    };
    Some(secs * NANOS_PER_SEC)
}

/// Anthropic's limits (requests, input, output and all tokens) count per
/// minute: <https://docs.anthropic.com/en/api/rate-limits>.
const ANTHROPIC_WINDOW: u128 = 60 * NANOS_PER_SEC;

impl Acc {
    /// Takes one header. `name` is lower-case ASCII; `v` is trimmed UTF-8.
    pub(super) fn add(&mut self, name: &str, v: &str) {
        match name {
            "date" => {
                if self.date.is_none() && v.len() <= 64 {
                    self.date = Some(v.to_owned());
                }
            }
            "retry-after" => set_first(
                &mut self.retry_after,
                value::parse_retry_after(v, NANOS_PER_SEC),
            ),
            "retry-after-ms" => set_first(
                &mut self.retry_after_ms,
                value::parse_retry_after(v, NANOS_PER_MILLI),
            ),
            "x-ms-retry-after-ms" => set_first(
                &mut self.ms_retry_after_ms,
                value::parse_retry_after(v, NANOS_PER_MILLI),
            ),
            "ratelimit" => append_line(&mut self.ratelimit, v),
            "ratelimit-policy" => append_line(&mut self.ratelimit_policy, v),
            _ => self.add_prefixed(name, v),
        }
    }

    fn add_prefixed(&mut self, name: &str, v: &str) {
        if let Some(rest) = name.strip_prefix("anthropic-ratelimit-") {
            // <resource>-<field>: `anthropic-ratelimit-input-tokens-reset`.
            if let Some((resource, field)) = rest.rsplit_once('-')
                && let Some(field) = Field::from_name(field)
            {
                self.add_policy_field(resource, field, v, Some(ANTHROPIC_WINDOW));
            }
            return;
        }
        let (rank, rest) = if let Some(rest) = name.strip_prefix("ratelimit-") {
            (Rank::IetfSplit, rest)
        } else if let Some(rest) = name
            .strip_prefix("x-ratelimit-")
            .or_else(|| name.strip_prefix("x-rate-limit-"))
        {
            (Rank::Vendor, rest)
        } else {
            return;
        };
        match rest {
            "limit" => self.limit.offer(rank, parse_limit(v)),
            "remaining" => self.remaining.offer(rank, value::parse_u64(v)),
            "used" => self.used.offer(rank, value::parse_u64(v)),
            "reset" => self.offer_reset(rank, value::parse_reset(v)),
            // Discord: always a delta, in (fractional) seconds.
            "reset-after" => self.offer_reset(rank, value::parse_seconds(v).map(When::After)),
            "scope" => set_first(&mut self.scope[0], scope_name(v)),
            "resource" => set_first(&mut self.scope[1], scope_name(v)),
            "bucket" => set_first(&mut self.scope[2], scope_name(v)),
            _ => {
                // <field>-<resource>: `x-ratelimit-reset-requests`,
                // `x-ratelimit-limit-minute`.
                if let Some((field, resource)) = rest.split_once('-')
                    && let Some(field) = Field::from_name(field)
                {
                    let window = (rank == Rank::Vendor)
                        .then(|| documented_window(resource))
                        .flatten();
                    self.add_policy_field(resource, field, v, window);
                }
            }
        }
    }

    fn offer_reset(&mut self, rank: Rank, v: Option<When>) {
        match v {
            Some(When::After(_)) => self.reset_after.offer(rank, v),
            Some(When::At(_)) => self.reset_at.offer(rank, v),
            None => {}
        }
    }

    /// The best reset: the better rank; on a tie, relative over absolute.
    fn best_reset(&self) -> Option<When> {
        match (self.reset_after.0, self.reset_at.0) {
            (Some((ra, a)), Some((rb, b))) => Some(if ra <= rb { a } else { b }),
            (a, b) => a.or(b).map(|(_, w)| w),
        }
    }

    /// `window`: the window the header family documents for this resource,
    /// if any.
    fn add_policy_field(&mut self, resource: &str, field: Field, v: &str, window: Option<u128>) {
        let Some(p) = self.policy_named(Some(resource)) else {
            return;
        };
        match field {
            Field::Limit => {
                set_first(&mut p.quota, parse_limit(v));
                set_first(&mut p.documented_window, window);
            }
            Field::Remaining => set_first(&mut p.remaining, value::parse_u64(v)),
            Field::Reset => set_first(&mut p.reset, value::parse_reset(v)),
            // A per-resource `used` is not kept; `remaining` says more.
            Field::Used => {}
        }
    }

    /// The policy called `name` (created if new; unnamed ones always are);
    /// `None` once [`MAX_POLICIES`] are kept or the name is unusable.
    fn policy_named(&mut self, name: Option<&str>) -> Option<&mut RawPolicy> {
        if let Some(n) = name {
            if n.is_empty() || n.len() > MAX_NAME_LEN {
                return None;
            }
            if let Some(i) = self
                .policies
                .iter()
                .position(|p| p.name.as_deref() == Some(n))
            {
                return Some(&mut self.policies[i]);
            }
        }
        if self.policies.len() >= MAX_POLICIES {
            return None;
        }
        self.policies.push(RawPolicy {
            name: name.map(str::to_owned),
            ..RawPolicy::default()
        });
        self.policies.last_mut()
    }

    pub(super) fn finish(mut self, now: SystemTime) -> ServerHint {
        self.parse_structured();
        // Absolute times are read against the server's own `Date`, unless
        // it is more than `MAX_DATE_SKEW` off ours.
        let now = value::unix_nanos(now);
        let max_skew = ServerHint::MAX_DATE_SKEW.as_nanos() as i128;
        let reference = self
            .date
            .as_deref()
            .filter(|_| self.needs_reference())
            .and_then(value::parse_http_date)
            .filter(|date| date.abs_diff(now) <= max_skew as u128)
            .unwrap_or(now);
        let wait = |w: When| cap(w.wait_from(reference));

        let mut hint = ServerHint {
            // The precise forms describe the same wait as `Retry-After`.
            retry_after: self
                .retry_after_ms
                .or(self.ms_retry_after_ms)
                .or(self.retry_after)
                .map(wait),
            limit: self.limit.get(),
            remaining: self.remaining.get(),
            used: self.used.get(),
            reset_after: self.best_reset().map(wait),
            policies: Vec::with_capacity(self.policies.len()),
            scope: self.scope.into_iter().flatten().next(),
        };
        if hint.remaining.is_none()
            && let (Some(limit), Some(used)) = (hint.limit, hint.used)
        {
            hint.remaining = Some(limit.saturating_sub(used));
        }
        for p in self.policies {
            hint.policies.push(Policy {
                name: p.name,
                quota: p.quota,
                quota_unit: p.quota_unit,
                window: p.window.or(p.documented_window).map(cap),
                remaining: p.remaining,
                reset_after: p.reset.map(wait),
            });
        }
        // No top-level counters: summarise the binding policy.
        if hint.remaining.is_none()
            && hint.limit.is_none()
            && hint.reset_after.is_none()
            && let Some(p) = hint
                .policies
                .iter()
                .filter(|p| p.remaining.is_some())
                .min_by_key(|p| (p.remaining, core::cmp::Reverse(p.reset_after)))
        {
            hint.limit = p.quota;
            hint.remaining = p.remaining;
            hint.reset_after = p.reset_after;
        }
        hint
    }

    /// Whether any time collected is absolute.
    fn needs_reference(&self) -> bool {
        let at = |w: &Option<When>| matches!(w, Some(When::At(_)));
        at(&self.retry_after)
            || at(&self.retry_after_ms)
            || at(&self.ms_retry_after_ms)
            || self.reset_at.0.is_some()
            || self.policies.iter().any(|p| at(&p.reset))
    }

    /// `RateLimit` and `RateLimit-Policy`, once every line is in.
    fn parse_structured(&mut self) {
        let policy = core::mem::take(&mut self.ratelimit_policy);
        if !policy.is_empty()
            && let Ok(list) = Parser::new(&policy).parse::<List>()
        {
            for entry in &list {
                self.add_structured(entry, true);
            }
        }
        let rl = core::mem::take(&mut self.ratelimit);
        if rl.is_empty() {
            return;
        }
        // The dictionary draft: `limit=100, remaining=50, reset=5`.
        if let Ok(dict) = Parser::new(&rl).parse::<Dictionary>() {
            let int = |k: &str| match dict.get(k) {
                Some(ListEntry::Item(i)) => non_negative(&i.bare_item),
                _ => None,
            };
            let (limit, remaining, reset) = (int("limit"), int("remaining"), int("reset"));
            if limit.is_some() || remaining.is_some() || reset.is_some() {
                self.limit.offer(Rank::Ietf, limit);
                self.remaining.offer(Rank::Ietf, remaining);
                let reset = reset.map(|s| When::After(u128::from(s) * NANOS_PER_SEC));
                self.offer_reset(Rank::Ietf, reset);
                return;
            }
        }
        // The current draft: `"default";r=50;t=30, "daily";r=900;t=5000`.
        if let Ok(list) = Parser::new(&rl).parse::<List>() {
            for entry in &list {
                self.add_structured(entry, false);
            }
        }
    }

    /// One member of `RateLimit-Policy` (`is_policy`) or `RateLimit`: a
    /// String or Token name, or an Integer (the older unnamed form).
    fn add_structured(&mut self, entry: &ListEntry, is_policy: bool) {
        let ListEntry::Item(item) = entry else {
            return;
        };
        let (name, bare_quota) = match &item.bare_item {
            BareItem::String(s) => (Some(s.as_str()), None),
            BareItem::Token(t) => (Some(t.as_str()), None),
            b @ BareItem::Integer(_) if is_policy => (None, non_negative(b)),
            _ => return,
        };
        let param = |k: &str| item.params.get(k);
        let int = |k: &str| param(k).and_then(non_negative);
        let Some(p) = self.policy_named(name) else {
            return;
        };
        if is_policy {
            set_first(&mut p.quota, int("q").or(bare_quota));
            set_first(
                &mut p.window,
                int("w").map(|s| u128::from(s) * NANOS_PER_SEC),
            );
            let unit = param("qu").and_then(|b| match b {
                BareItem::String(s) => Some(s.as_str()),
                BareItem::Token(t) => Some(t.as_str()),
                _ => None,
            });
            set_first(&mut p.quota_unit, unit.and_then(scope_name));
        } else {
            set_first(&mut p.remaining, int("r"));
            set_first(
                &mut p.reset,
                int("t").map(|s| When::After(u128::from(s) * NANOS_PER_SEC)),
            );
        }
    }
}

fn set_first<T>(slot: &mut Option<T>, v: Option<T>) {
    if slot.is_none() {
        *slot = v;
    }
}

/// Joins repeated field lines as RFC 9110 §5.3 combines them.
fn append_line(buf: &mut String, v: &str) {
    if v.is_empty() || buf.len() + v.len() + 2 > MAX_STRUCTURED_LEN {
        return;
    }
    if !buf.is_empty() {
        buf.push_str(", ");
    }
    buf.push_str(v);
}

/// A limit: `100`, or the older list form `100, 100;w=60` (first member).
fn parse_limit(v: &str) -> Option<u64> {
    value::parse_u64(v).or_else(|| {
        let list = Parser::new(v).parse::<List>().ok()?;
        match list.first()? {
            ListEntry::Item(i) => non_negative(&i.bare_item),
            ListEntry::InnerList(_) => None,
        }
    })
}

/// A structured Integer that is not negative.
fn non_negative(b: &BareItem) -> Option<u64> {
    b.as_integer()
        .and_then(|i| u64::try_from(i64::from(i)).ok())
}

/// A scope or unit name: non-empty, bounded, printable ASCII.
fn scope_name(v: &str) -> Option<String> {
    let ok = !v.is_empty()
        && v.len() <= MAX_NAME_LEN
        && v.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    ok.then(|| v.to_owned())
}

/// Nanoseconds as a `Duration`, capped at [`ServerHint::MAX_DURATION`].
fn cap(nanos: u128) -> Duration {
    let max = ServerHint::MAX_DURATION;
    if nanos >= max.as_nanos() {
        return max;
    }
    // Below the cap (about 136 years) the value fits in u64 nanoseconds.
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}
