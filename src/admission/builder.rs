//! [`Builder`]: the admission layer's settings and their defaults.

use core::fmt;
use core::num::NonZeroU32;
use core::time::Duration;
use std::collections::HashMap;
use std::sync::Arc;

use crate::adaptive::AdaptiveRate;
use crate::bucket::Quota;
use crate::clock::{Clock, DefaultClock};
use crate::keyed::Scoped;
use crate::sleep::DefaultSleeper;
use crate::sync::AtomicBool;

use super::breaker::{Breakers, CircuitBreaker};
use super::budget::RunBudget;
use super::pools::{Pool, SlotPolicy};
use super::rate::learned::Learned;
use super::rate::shared::{Shared, SharedLimiter, SharedResolver, Unresolved};
use super::rate::Provider;
use super::rate::{Rates, Resource};
use super::slots::Slots;
use super::tools::{ToolConfig, Tools};
use super::{Admission, Inner};
use crate::limiter::RateLimiter;

/// Builds an [`Admission`]; every setting has a default.
///
/// | setting | default |
/// | --- | --- |
/// | global concurrency | 16 |
/// | per-tool concurrency | 4 (unknown tools too) |
/// | per-tool policy | [`SlotPolicy::Wait`] |
/// | credential quota | learned from the server, starting at 10/s ([`AdaptiveRate`]); 10/s, burst 10 with [`fixed_rates`](Builder::fixed_rates) |
/// | wait-queue capacity | 256 waiting calls |
/// | inline wait threshold | 2 s |
/// | max honoured Retry-After | 5 min (longer: `quota_exhausted`) |
/// | expected latency (drain estimates before any call finished) | 1 s |
/// | run budget | none |
/// | circuit breaker | none ([`circuit_breaker`](Builder::circuit_breaker)) |
/// | tools not configured by name | at most 1,024 tracked (idle ones evicted; then `shed`) |
///
/// # Examples
///
/// ```
/// use backpressure::admission::{Admission, SlotPolicy};
/// use backpressure::Quota;
/// use std::num::NonZeroU32;
///
/// let admission = Admission::builder()
///     .global_concurrency(8)
///     .tool("search_tickets", 4, SlotPolicy::Wait)
///     .tool("refund", 1, SlotPolicy::FailFast)
///     .default_quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
///     .run_budget(50)
///     .build();
/// # let _ = admission;
/// ```
pub struct Builder<S = DefaultSleeper, C = DefaultClock> {
    sleeper: S,
    clock: C,
    cfg: Settings,
}

/// A weighted quota: its name, its default and per-credential overrides.
type ResourceConfig = (String, Quota, Vec<(String, Quota)>);

/// Everything but the sleeper and the clock.
struct Settings {
    global: usize,
    default_tool: ToolConfig,
    tools: HashMap<String, ToolConfig>,
    default_quota: Quota,
    /// Whether `default_quota` was called (it then caps adaptive rates).
    default_quota_set: bool,
    adaptive: Option<AdaptiveRate>,
    quotas: Vec<(String, Quota)>,
    resources: Vec<ResourceConfig>,
    queue_capacity: usize,
    inline_wait: Duration,
    max_retry_after: Duration,
    expected_latency: Duration,
    run_budget: Option<u32>,
    max_tools: usize,
    shared: Shared,
    provider: Option<Provider>,
    breaker: Option<CircuitBreaker>,
    /// With priority lanes: background calls' share of the global slots.
    background_share: Option<f64>,
    background_rate_share: Option<f64>,
    key_share: Option<f64>,
}

impl Builder {
    /// Proposes a concurrency cap from Little's law (rate x latency, rounded
    /// up, clamped to `1..=u32::MAX`) to size a tool's slots from its quota.
    /// An infinite rate gives `u32::MAX`; NaN, negative or zero latency give 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Builder;
    /// use std::time::Duration;
    /// // 10 requests/s at 400 ms each keep 4 in flight.
    /// assert_eq!(Builder::concurrency_for(10.0, Duration::from_millis(400)), 4);
    /// assert_eq!(Builder::concurrency_for(f64::NAN, Duration::from_secs(1)), 1);
    /// assert_eq!(Builder::concurrency_for(f64::INFINITY, Duration::from_millis(400)), u32::MAX);
    /// ```
    pub fn concurrency_for(rate_per_sec: f64, latency: Duration) -> u32 {
        super::spec::concurrency_for(rate_per_sec, latency)
    }

    pub(super) fn new() -> Self {
        Self {
            sleeper: DefaultSleeper::new(),
            clock: DefaultClock::new(),
            cfg: Settings {
                global: 16,
                default_tool: ToolConfig {
                    cap: 4,
                    policy: SlotPolicy::Wait,
                    budget: None,
                    lanes: false,
                },
                tools: HashMap::new(),
                default_quota: Quota::per_second(NonZeroU32::new(10).expect("10 > 0")),
                default_quota_set: false,
                adaptive: Some(AdaptiveRate::new()),
                quotas: Vec::new(),
                resources: Vec::new(),
                queue_capacity: 256,
                breaker: None,
                background_share: None,
                background_rate_share: None,
                key_share: None,
                inline_wait: Duration::from_secs(2),
                max_retry_after: Duration::from_secs(300),
                expected_latency: Duration::from_secs(1),
                run_budget: None,
                max_tools: 1024,
                shared: Shared::default(),
                provider: None,
            },
        }
    }
}

impl<S, C> Builder<S, C> {
    /// The timer used for inline waits (default:
    /// [`DefaultSleeper`](crate::DefaultSleeper)).
    pub fn sleeper<S2>(self, sleeper: S2) -> Builder<S2, C> {
        Builder {
            sleeper,
            clock: self.clock,
            cfg: self.cfg,
        }
    }

    /// The clock of the rate limits (default: `DefaultClock`).
    pub fn clock<C2>(self, clock: C2) -> Builder<S, C2> {
        Builder {
            sleeper: self.sleeper,
            clock,
            cfg: self.cfg,
        }
    }

    /// At most `n` calls in flight across all tools (0 is taken as 1,
    /// and more than [`Semaphore::MAX_PERMITS`](crate::Semaphore::MAX_PERMITS)
    /// as that many).
    pub fn global_concurrency(mut self, n: usize) -> Self {
        self.cfg.global = n.max(1);
        self
    }

    /// Concurrency cap (clamped as in [`global_concurrency`](Self::global_concurrency))
    /// and policy for tools not configured by name.
    pub fn default_tool(mut self, cap: usize, policy: SlotPolicy) -> Self {
        self.cfg.default_tool.cap = cap.max(1);
        self.cfg.default_tool.policy = policy;
        self
    }

    /// Concurrency cap (clamped as in [`global_concurrency`](Self::global_concurrency))
    /// and slot policy of one tool.
    pub fn tool(mut self, name: impl Into<String>, cap: usize, policy: SlotPolicy) -> Self {
        let entry = self.cfg.tool_config(name.into());
        entry.cap = cap.max(1);
        entry.policy = policy;
        self
    }

    /// How many tools not configured by name the layer tracks at once
    /// (default 1,024; at least 1). At the cap, idle ones are evicted; if
    /// none is idle, a call for a new tool name is refused as `shed`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::Status;
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().max_tools(1).build();
    /// let busy = admission.admit(&CallSpec::new("a", "k")).await.unwrap();
    /// let err = admission.admit(&CallSpec::new("b", "k")).await.unwrap_err();
    /// assert_eq!(err.status, Status::Shed);
    /// drop(busy); // "a" is idle now: "b" takes its place
    /// assert!(admission.admit(&CallSpec::new("b", "k")).await.is_ok());
    /// # });
    /// ```
    pub fn max_tools(mut self, n: usize) -> Self {
        self.cfg.max_tools = n.max(1);
        self
    }

    /// At most `n` calls of one tool per run.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::Status;
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().tool_budget("search", 1).build();
    /// drop(admission.admit(&CallSpec::new("search", "k")).await.unwrap());
    /// let err = admission.admit(&CallSpec::new("search", "k")).await.unwrap_err();
    /// assert_eq!(err.status, Status::BudgetExhausted);
    /// # });
    /// ```
    pub fn tool_budget(mut self, name: impl Into<String>, n: u32) -> Self {
        self.cfg.tool_config(name.into()).budget = Some(n);
        self
    }

    /// The quota of credentials not configured by name.
    ///
    /// With adaptive rates on (the default), this is each such credential's
    /// starting rate and its ceiling; its burst is capped at what the server
    /// is believed to allow ([`AdaptiveRate::server_burst`]). Without it, a
    /// credential starts at [`AdaptiveRate`]'s guess (10/s) and may climb
    /// above it. With [`fixed_rates`](Self::fixed_rates) it is used as given.
    pub fn default_quota(mut self, quota: Quota) -> Self {
        self.cfg.default_quota = quota;
        self.cfg.default_quota_set = true;
        self
    }

    /// The quota of one credential. With adaptive rates on (the default)
    /// it is the credential's starting rate and ceiling, as for
    /// [`default_quota`](Self::default_quota).
    pub fn quota(mut self, credential: impl Into<String>, quota: Quota) -> Self {
        self.cfg.quotas.push((credential.into(), quota));
        self
    }

    /// A weighted quota every credential has besides its requests (tokens per
    /// minute, bytes per second). A call states its cost with
    /// [`CallSpec::cost`](super::CallSpec::cost); `admit` reserves the request
    /// and every cost all or nothing, giving all back if the call is refused
    /// or dropped. [`Ticket::settle`](super::Ticket::settle) reconciles an
    /// estimate with actual usage. Setting the same name again replaces it.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::{ManualClock, Quota};
    /// use std::num::NonZeroU32;
    /// # futures::executor::block_on(async {
    /// let tpm = Quota::per_minute(NonZeroU32::new(10_000).unwrap());
    /// let admission = Admission::builder()
    ///     .clock(ManualClock::new())
    ///     .resource("tokens", tpm)
    ///     .build();
    /// let big = CallSpec::new("complete", "key").cost("tokens", 9_000);
    /// let mut ticket = admission.admit(&big).await.unwrap();
    /// ticket.settle("tokens", 7_000); // the reply said 7,000: 2,000 come back
    /// drop(ticket);
    /// let next = CallSpec::new("complete", "key").cost("tokens", 4_000);
    /// assert!(admission.admit(&next).await.is_err()); // 3,000 left
    /// # });
    /// ```
    pub fn resource(mut self, name: impl Into<String>, quota: Quota) -> Self {
        self.cfg.declare(&name.into()).1 = quota;
        self
    }

    /// The weighted quota `name` of one credential (see
    /// [`resource`](Self::resource); without it, the quota is unlimited for
    /// the other credentials).
    pub fn credential_resource(
        mut self,
        credential: impl Into<String>,
        name: impl Into<String>,
        quota: Quota,
    ) -> Self {
        let name = name.into();
        self.cfg.declare(&name).2.push((credential.into(), quota));
        self
    }

    /// Reads the server's limit headers with `provider`'s documented meaning
    /// (see [`Provider`]). The last call wins.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, Provider};
    /// let admission = Admission::builder().provider(Provider::Anthropic).build();
    /// assert_eq!(admission.available("key", "output_tokens"), Some(u32::MAX));
    /// ```
    pub fn provider(mut self, provider: Provider) -> Self {
        self.cfg.provider = Some(provider);
        self
    }

    /// How each credential's rate is learned from the server's answers
    /// (default: [`AdaptiveRate::new`]): 429s lower it, sustained success
    /// raises it, `RateLimit-Policy` sets it. Credentials with a
    /// [`shared_quota`](Self::shared_quota) only take the stated limit.
    pub fn adaptive_rate(mut self, adaptive: AdaptiveRate) -> Self {
        self.cfg.adaptive = Some(adaptive);
        self
    }

    /// Turns adaptive rates off: every credential keeps its configured quota
    /// (default 10/s, burst 10); a 429 still holds it back for `Retry-After`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().fixed_rates().build();
    /// drop(admission.admit(&CallSpec::new("t", "key")).await.unwrap());
    /// assert_eq!(admission.learned_rate("key"), None);
    /// # });
    /// ```
    pub fn fixed_rates(mut self) -> Self {
        self.cfg.adaptive = None;
        self
    }

    /// At most `n` calls waiting for a slot at once, across all tools;
    /// more are shed at once with a drain estimate.
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.cfg.queue_capacity = n;
        self
    }

    /// Rate-limit waits up to this long are slept inside `admit` (invisible
    /// to the caller); longer ones are returned as `rate_limited`. A call
    /// that a server's hold sends back to the queue while it sleeps may
    /// wait this long again from then.
    pub fn inline_wait(mut self, d: Duration) -> Self {
        self.cfg.inline_wait = d;
        self
    }

    /// A server hold longer than this is `quota_exhausted` (an operator's
    /// problem), not `rate_limited`.
    pub fn max_retry_after(mut self, d: Duration) -> Self {
        self.cfg.max_retry_after = d;
        self
    }

    /// The hold time assumed for drain estimates until calls have finished.
    pub fn expected_latency(mut self, d: Duration) -> Self {
        self.cfg.expected_latency = d;
        self
    }

    /// At most `n` calls per run (see [`Admission::reset_run`]).
    pub fn run_budget(mut self, n: u32) -> Self {
        self.cfg.run_budget = Some(n);
        self
    }

    /// Serves waiting calls by [`Priority`](super::Priority)
    /// ([`CallSpec::priority`](super::CallSpec::priority)): interactive calls
    /// take free slots before background ones; then the credential served
    /// least recently; then arrival order. Background calls hold at most
    /// `background_share` of the global slots (at least one; clamped to
    /// `[0, 1]`, NaN is 1); see also
    /// [`background_rate_share`](Self::background_rate_share). Off by default.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec, Priority};
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder()
    ///     .global_concurrency(4)
    ///     .priority_lanes(0.5) // background calls: 2 of the 4 global slots at most
    ///     .build();
    /// let background = CallSpec::new("crawl", "key").priority(Priority::BACKGROUND);
    /// let a = admission.admit(&background).await.unwrap();
    /// let b = admission.admit(&background).await.unwrap();
    /// // The other two slots are kept for interactive calls.
    /// let interactive = admission.admit(&CallSpec::new("search", "key")).await.unwrap();
    /// # drop((a, b, interactive));
    /// # });
    /// ```
    pub fn priority_lanes(mut self, background_share: f64) -> Self {
        self.cfg.background_share = Some(clamp_share(background_share));
        self
    }

    /// Background calls ([`Priority::BACKGROUND`](super::Priority::BACKGROUND)
    /// and below) draw at most `share` of each credential's request rate
    /// (burst `floor(burst x share)`, at least one). A background call waits
    /// for its turn in that share before taking a slot, so background floods
    /// never book cells ahead of interactive calls. A turn past the deadline
    /// or inline wait is refused `rate_limited`, scope `api_key:background`.
    /// Clamped to `[0, 1]`, NaN is 1 (off). Weighted and shared quotas are
    /// not split. Off by default.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec, Priority};
    /// use backpressure::{ManualClock, Quota, Status};
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder()
    ///     .clock(ManualClock::new())
    ///     .quota("key", Quota::per_second(NonZeroU32::new(10).unwrap()))
    ///     .fixed_rates()
    ///     .background_rate_share(0.2) // 2 a second, at most 2 at once
    ///     .build();
    /// let crawl = CallSpec::new("crawl", "key")
    ///     .priority(Priority::BACKGROUND)
    ///     .deadline(Duration::from_millis(100));
    /// let a = admission.admit(&crawl).await.unwrap();
    /// let b = admission.admit(&crawl).await.unwrap();
    /// let refused = admission.admit(&crawl).await.unwrap_err();
    /// assert_eq!(refused.status, Status::RateLimited); // its turn is in 500 ms
    /// assert_eq!(refused.scope, "api_key:background");
    /// // The other 8 of the burst are the interactive calls'.
    /// assert_eq!(admission.available("key", "requests"), Some(8));
    /// # drop((a, b));
    /// # });
    /// ```
    pub fn background_rate_share(mut self, share: f64) -> Self {
        self.cfg.background_rate_share = Some(clamp_share(share));
        self
    }

    /// Takes at most `share` of every limit the server states for a key,
    /// leaving the rest to the key's other users: a stated limit `L` is read
    /// as `floor(L x share)`, and once the server reports less left than
    /// `L - floor(L x share)` the key is held back until the reset. Clamped
    /// to `[0, 1]`, NaN is 1. A server that states no limit is unaffected; to
    /// keep a fixed part of such a key, use `quota` with `fixed_rates`.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::headers::ServerHint;
    /// use std::time::SystemTime;
    /// # futures::executor::block_on(async {
    /// let admission = Admission::builder().key_share(0.5).build();
    /// let ticket = admission.admit(&CallSpec::new("search", "org-key")).await.unwrap();
    /// // The key's limit is 100 a minute and 40 are left: below the 50 kept for the others.
    /// let hint = ServerHint::from_headers(
    ///     [("ratelimit-policy", r#""key";q=100;w=60"#), ("ratelimit", r#""key";r=40;t=30"#)],
    ///     SystemTime::now(),
    /// );
    /// assert_eq!(ticket.observe(200, &hint), Some(std::time::Duration::from_secs(30)));
    /// # });
    /// ```
    pub fn key_share(mut self, share: f64) -> Self {
        self.cfg.key_share = Some(clamp_share(share));
        self
    }

    /// Keeps a circuit breaker per (tool, credential) (see
    /// [`CircuitBreaker`]); refusals are
    /// [`Status::Unavailable`](crate::Status::Unavailable). Off by default.
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.cfg.breaker = Some(breaker);
        self
    }

    /// Admits `credential` through `limiter`, a quota shared with other
    /// processes (e.g. a `RedisBucket`), instead of a local bucket. A 429 on
    /// it holds back every process; a limit the server states is stored in
    /// it ([`RateLimiter::set_quota`]). Any [`RateLimiter`] will do, e.g. a
    /// [`RollingWindow`](crate::RollingWindow).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::Status;
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::num::NonZeroU32;
    ///
    /// // Any limiter works; across processes it would be a `RedisBucket`.
    /// let one_per_second = TokenBucket::with_clock(
    ///     Quota::per_second(NonZeroU32::new(1).unwrap()),
    ///     ManualClock::new(),
    /// );
    /// let admission = Admission::builder()
    ///     .shared_quota("org-key", one_per_second)
    ///     .inline_wait(std::time::Duration::ZERO)
    ///     .build();
    /// # futures::executor::block_on(async {
    /// drop(admission.admit(&CallSpec::new("t", "org-key")).await.unwrap());
    /// let next = admission.admit(&CallSpec::new("t", "org-key")).await.unwrap_err();
    /// assert_eq!(next.status, Status::RateLimited);
    /// # });
    /// ```
    pub fn shared_quota(
        mut self,
        credential: impl Into<String>,
        limiter: impl RateLimiter + 'static,
    ) -> Self {
        self.cfg
            .shared
            .by_name
            .insert(credential.into(), Arc::new(limiter));
        self
    }

    /// Keeps `credential`'s weighted quota `name` in `limiter`, a quota
    /// shared with other processes, instead of a local bucket.
    /// [`Ticket::settle`](super::Ticket::settle) settles it there both ways.
    ///
    /// Settles and refunds are queued and sent by the next `admit` on the
    /// credential, [`Admission::sync_shared`](super::Admission::sync_shared),
    /// or [`Runner`](super::Runner); each is sent once. Limits the server
    /// states for `name` are stored in the limiter
    /// ([`RateLimiter::set_quota`]), and a spent quota holds it until its
    /// reset, capped at `max_retry_after`. Declares `name` for the other
    /// credentials with no limit if [`resource`](Self::resource) did not.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::{ManualClock, Quota, RateLimiter, TokenBucket};
    /// use std::num::NonZeroU32;
    /// use std::sync::Arc;
    /// # futures::executor::block_on(async {
    /// // Across processes this would be a `RedisBucket` on the key's TPM.
    /// let tpm = Arc::new(TokenBucket::with_clock(
    ///     Quota::per_minute(NonZeroU32::new(10_000).unwrap()),
    ///     ManualClock::new(),
    /// ));
    /// let admission = Admission::builder()
    ///     .clock(ManualClock::new())
    ///     .shared_resource("org-key", "tokens", tpm.clone())
    ///     .build();
    /// let spec = CallSpec::new("complete", "org-key").cost("tokens", 4_000);
    /// let mut ticket = admission.admit(&spec).await.unwrap();
    /// assert_eq!(RateLimiter::available(&tpm).await, 6_000); // the estimate
    /// assert_eq!(ticket.settle("tokens", 1_000), -3_000); // the reply used 1,000
    /// admission.sync_shared().await;
    /// assert_eq!(RateLimiter::available(&tpm).await, 9_000);
    /// # });
    /// ```
    pub fn shared_resource(
        mut self,
        credential: impl Into<String>,
        name: impl Into<String>,
        limiter: impl RateLimiter + 'static,
    ) -> Self {
        let name = name.into();
        self.cfg.declare(&name);
        let limiters = self
            .cfg
            .shared
            .resources
            .entry(credential.into())
            .or_default();
        let limiter: Arc<dyn SharedLimiter> = Arc::new(limiter);
        match limiters.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = limiter,
            None => limiters.push((name, limiter)),
        }
        self
    }

    /// Keeps the weighted quota `name` of every credential not named in
    /// [`shared_resource`](Self::shared_resource) in the limiter `resolve`
    /// returns for it (`None`: a local bucket). `resolve` runs on every admit,
    /// settle and observe, so it must be a cheap lookup returning the same
    /// limiter each time (see [`shared_quotas`](Self::shared_quotas)). A second
    /// call for `name` replaces the first; declares `name` as `shared_resource` does.
    pub fn shared_resources<L: RateLimiter + 'static>(
        mut self,
        name: impl Into<String>,
        resolve: impl Fn(&str) -> Option<Arc<L>> + Send + Sync + 'static,
    ) -> Self {
        let name = name.into();
        self.cfg.declare(&name);
        let resolve = erased(resolve);
        let resolvers = &mut self.cfg.shared.resource_resolvers;
        match resolvers.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = resolve,
            None => resolvers.push((name, resolve)),
        }
        self
    }

    /// Admits every credential not named in [`shared_quota`](Self::shared_quota)
    /// through the limiter `resolve` returns for it (`None`: a local bucket).
    /// `resolve` runs on every admit and observe, so it must be a cheap lookup
    /// returning the same limiter (or a handle onto the same shared state)
    /// each time: a fresh local bucket per call limits nothing. A resolver that
    /// panics refuses that credential's calls with
    /// [`Status::Unavailable`](crate::Status::Unavailable).
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::{Admission, CallSpec};
    /// use backpressure::Status;
    /// use backpressure::{ManualClock, Quota, TokenBucket};
    /// use std::collections::HashMap;
    /// use std::num::NonZeroU32;
    /// use std::sync::Arc;
    ///
    /// // One shared quota per tenant; across processes these would be the
    /// // buckets of a `RedisScoped`.
    /// let one_per_second = || {
    ///     Arc::new(TokenBucket::with_clock(Quota::per_second(NonZeroU32::new(1).unwrap()), ManualClock::new()))
    /// };
    /// let tenants: HashMap<String, Arc<TokenBucket<ManualClock>>> =
    ///     ["acme", "globex"].iter().map(|t| (t.to_string(), one_per_second())).collect();
    /// let admission = Admission::builder()
    ///     .shared_quotas(move |credential| tenants.get(credential).cloned())
    ///     .inline_wait(std::time::Duration::ZERO)
    ///     .build();
    /// # futures::executor::block_on(async {
    /// drop(admission.admit(&CallSpec::new("t", "acme")).await.unwrap());
    /// assert_eq!(admission.admit(&CallSpec::new("t", "acme")).await.unwrap_err().status, Status::RateLimited);
    /// assert!(admission.admit(&CallSpec::new("t", "globex")).await.is_ok()); // its own quota
    /// assert!(admission.admit(&CallSpec::new("t", "local")).await.is_ok()); // a local bucket
    /// # });
    /// ```
    pub fn shared_quotas<L: RateLimiter + 'static>(
        mut self,
        resolve: impl Fn(&str) -> Option<Arc<L>> + Send + Sync + 'static,
    ) -> Self {
        self.cfg.shared.resolver = Some(erased(resolve));
        self
    }

    /// Builds the admission layer.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::admission::Admission;
    /// let admission = Admission::builder().build();
    /// assert_eq!(admission.waiting(), 0);
    /// ```
    pub fn build(mut self) -> Admission<S, C>
    where
        C: Clock + Clone,
    {
        for name in self.cfg.provider.map_or(&[][..], Provider::quotas) {
            self.cfg.declare(name);
        }
        let mut global = Pool::new(self.cfg.global, self.cfg.expected_latency);
        let mut tools = self.cfg.tools;
        let mut default_tool = self.cfg.default_tool;
        if let Some(share) = self.cfg.background_share {
            // At least one slot, at most all of them.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let cap = ((self.cfg.global as f64 * share).floor() as usize).clamp(1, self.cfg.global);
            global = global.with_lanes(cap);
            default_tool.lanes = true;
            for cfg in tools.values_mut() {
                cfg.lanes = true;
            }
        }
        let credentials = Scoped::with_clock(self.cfg.default_quota, self.clock.clone());
        for (cred, q) in &self.cfg.quotas {
            // Refused only past the registry's key limit; such a credential keeps
            // the default quota.
            let _ = credentials.set_quota(cred, *q);
        }
        // Server-scope buckets only ever act through `penalize`: their own
        // quota is effectively unlimited.
        let open = Quota::with_period(Duration::from_nanos(1))
            .allow_burst(NonZeroU32::new(1 << 30).expect("non-zero"));
        let server_scopes = Scoped::with_clock(open, self.clock.clone());
        let resources = self
            .cfg
            .resources
            .into_iter()
            .map(|(name, quota, overrides)| {
                let buckets = Scoped::with_clock(quota, self.clock.clone());
                for (cred, q) in &overrides {
                    // Refused only past 2^20 overrides: the default quota then.
                    let _ = buckets.set_quota(cred, *q);
                }
                Resource {
                    name,
                    buckets,
                    // No default limit: the server's is all there is.
                    learned: quota == unlimited(),
                }
            })
            .collect();
        let background_clock = self.clock.clone();
        Admission {
            inner: Arc::new(Inner {
                sleeper: self.sleeper,
                clock: self.clock,
                closed: AtomicBool::new(false),
                turns_waiting: crate::sync::AtomicUsize::new(0),
                closed_signal: crate::semaphore::Semaphore::new(0),
                budget: RunBudget::new(self.cfg.run_budget),
                slots: Slots::new(
                    global,
                    self.cfg.queue_capacity,
                    Tools::new(
                        tools,
                        default_tool,
                        self.cfg.max_tools,
                        self.cfg.expected_latency,
                    ),
                ),
                rates: Rates::new(
                    credentials,
                    Learned::new(
                        self.cfg.adaptive,
                        self.cfg.default_quota_set.then_some(self.cfg.default_quota),
                        self.cfg.quotas.iter().cloned().collect(),
                    ),
                    resources,
                    server_scopes,
                    self.cfg.inline_wait,
                    self.cfg.max_retry_after,
                    self.cfg.shared,
                    self.cfg.provider.map(Provider::window),
                )
                .with_key_share(self.cfg.key_share)
                .with_background_share(self.cfg.background_rate_share, background_clock),
                totals: Default::default(),
                told: Default::default(),
                breakers: self.cfg.breaker.map(Breakers::new),
            }),
        }
    }
}

impl Settings {
    /// The weighted quota `name`, declared with no limit unless
    /// [`resource`](Builder::resource) declared it.
    fn declare(&mut self, name: &str) -> &mut ResourceConfig {
        match self.resources.iter().position(|(n, ..)| n == name) {
            Some(at) => &mut self.resources[at],
            None => {
                self.resources
                    .push((name.to_owned(), unlimited(), Vec::new()));
                self.resources.last_mut().expect("just pushed")
            }
        }
    }

    /// `name`'s settings, created from the default tool's.
    fn tool_config(&mut self, name: String) -> &mut ToolConfig {
        let default = &self.default_tool;
        self.tools.entry(name).or_insert_with(|| default.clone())
    }
}

impl<S: fmt::Debug, C: fmt::Debug> fmt::Debug for Builder<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("global", &self.cfg.global)
            .field("tools", &self.cfg.tools)
            .field("queue_capacity", &self.cfg.queue_capacity)
            .field("inline_wait", &self.cfg.inline_wait)
            .finish_non_exhaustive()
    }
}

/// A share, clamped into `[0, 1]`; not a number is 1.
fn clamp_share(share: f64) -> f64 {
    if share.is_nan() {
        1.0
    } else {
        share.clamp(0.0, 1.0)
    }
}

/// A resolver of shared limiters, type-erased; a panic yields an
/// [`Unresolved`] limiter that refuses that credential's calls.
fn erased<L: RateLimiter + 'static>(
    resolve: impl Fn(&str) -> Option<Arc<L>> + Send + Sync + 'static,
) -> Box<SharedResolver> {
    Box::new(move |credential: &str| -> Option<Arc<dyn SharedLimiter>> {
        // Unwind-safe enough: whatever a panic leaves, the resolver sees again.
        let resolved =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| resolve(credential)));
        match resolved {
            Err(_) => Some(Arc::new(Unresolved)),
            Ok(l) => l.map(|l| l as Arc<dyn SharedLimiter>),
        }
    })
}

/// A quota that never binds (`credential_resource` without `resource`).
fn unlimited() -> Quota {
    Quota::with_period(Duration::from_nanos(1))
        .allow_burst(NonZeroU32::new(u32::MAX).expect("non-zero"))
}
