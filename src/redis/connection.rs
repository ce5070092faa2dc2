//! How a script call reaches Redis: a lazily made, self-reconnecting
//! connection ([`Link`], shared by every bucket of a
//! [`RedisScoped`](super::RedisScoped)), bounded by the store timeout or
//! the caller's shorter budget, behind the breaker.

use core::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Client, ErrorKind, RedisError, RedisResult, Script};
use tokio::sync::OnceCell;

use super::script::{self, Bounds, Op, Params, Refund};
use super::RedisBucket;
use crate::sync::Arc;

/// Where the connection goes: one node, or a cluster.
pub(super) enum Target {
    Single(Client),
    /// Boxed: a cluster client is twice a single one's size.
    Cluster(Box<ClusterClient>),
}

/// A made connection; both kinds are cheap to clone (a handle).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The connection and the script: what every bucket on it shares.
pub(super) struct Link {
    target: Target,
    conn: OnceCell<Conn>,
    script: Script,
    /// The store timeout: the longest any call may take, connecting included.
    pub(super) timeout: Duration,
    /// Cap on the reconnect backoff (the probe interval).
    reconnect_cap: Duration,
    /// Send the bucket's clock with each call instead of using Redis's `TIME`.
    pub(super) explicit_time: bool,
}

impl Link {
    pub(super) fn new(
        target: Target,
        timeout: Duration,
        reconnect_cap: Duration,
        explicit_time: bool,
    ) -> Self {
        Link {
            target,
            conn: OnceCell::new(),
            script: Script::new(script::SOURCE),
            timeout,
            reconnect_cap,
            explicit_time,
        }
    }

    /// Whether this link goes to a cluster (its keys are hash-tagged).
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    async fn connect(&self) -> RedisResult<Conn> {
        match &self.target {
            Target::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(self.reconnect_cap);
                ConnectionManager::new_with_config(client.clone(), config)
                    .await
                    .map(Conn::Single)
            }
            Target::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
        }
    }
}

/// Builds a cluster client on `nodes` with the store timeout.
pub(super) fn cluster_client(nodes: &[String], timeout: Duration) -> RedisResult<ClusterClient> {
    ClusterClient::builder(nodes.iter().map(String::as_str))
        .connection_timeout(timeout)
        .response_timeout(timeout)
        // A moved slot is followed (MOVED/ASK) within the call's timeout.
        .retries(3)
        .min_retry_wait(1)
        .max_retry_wait(20)
        .build()
}

/// The connection, the key and the quota a bucket sends with each call.
pub(super) struct Connection {
    pub(super) link: Arc<Link>,
    /// The Redis key (hash-tagged on a cluster).
    pub(super) key: String,
}

/// Why a script call produced no decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Failed {
    /// Redis did not decide: a connection error, the store timeout, an
    /// error or malformed reply, or an open breaker. Counted in `failures`;
    /// the failure policy answers.
    Store,
    /// The caller's budget, shorter than the store timeout, ran out first.
    /// Counted in `out_of_budget`; says nothing about Redis.
    Budget,
}

impl Connection {
    /// Runs `op` (decided at `now`, in nanoseconds, when the time is
    /// explicit) within `limit`. Returns the reply, or `None` if `limit`
    /// passed first, and the round trips that completed.
    async fn run(
        &self,
        call: script::Call<'_>,
        now: u64,
        limit: Duration,
    ) -> (Option<RedisResult<Vec<i64>>>, u64) {
        let link = &*self.link;
        let now_us = link.explicit_time.then_some(now / 1000);
        let mut trips = 0;
        let result = tokio::time::timeout(limit, async {
            let conn = link.conn.get_or_try_init(|| link.connect()).await?;
            let (reply, n) = match conn.clone() {
                Conn::Single(mut c) => {
                    script::run(&mut c, &link.script, &self.key, now_us, call).await
                }
                Conn::Cluster(mut c) => {
                    script::run(&mut c, &link.script, &self.key, now_us, call).await
                }
            };
            trips = n;
            reply
        })
        .await;
        (result.ok(), trips)
    }
}

impl RedisBucket {
    /// Sends `op` within the store timeout, or within `bound` (the caller's
    /// budget) when shorter, unless the breaker is open. Every call carries
    /// the queued refunds, this process's own quota and its bounds; every
    /// reply carries the quota in force, adopted here (a reply outside the
    /// bounds sent is a failure).
    ///
    /// Only a connection error or the store timeout trips the breaker; an
    /// exhausted `bound` is [`Failed::Budget`]; an error reply fails this call.
    pub(super) async fn call(&self, op: Op, bound: Option<Duration>) -> Result<Vec<i64>, Failed> {
        let now = self.clock.now_nanos();
        // The connection and its timer need a tokio runtime; without one,
        // this is a failure, not a panic (and queued refunds stay queued).
        let runtime = tokio::runtime::Handle::try_current().is_ok();
        // The reply's quota must hold `expected`: the bounds sent, or, when
        // storing a new own quota, the bounds it makes.
        let (params, bounds, expected, refunds, writer, settles) = {
            let mut state = self.state.lock();
            if state.breaker.is_open(now) {
                state.stats.failures += 1;
                return Err(Failed::Store);
            }
            let refunds = if runtime {
                state.take_refunds()
            } else {
                Vec::new()
            };
            // Copied, not taken: they go until a reply says they are applied.
            let settles: Vec<(u64, i64)> = state.settles.iter().copied().collect();
            let bounds = state.bounds();
            let expected = match op {
                Op::SetQuota { params: new } => Bounds::new(state.configured, new),
                _ => bounds,
            };
            (
                state.own_params,
                bounds,
                expected,
                refunds,
                state.writer,
                settles,
            )
        };
        let timeout = self.conn.link.timeout;
        let (result, trips) = if !runtime {
            (None, 0)
        } else {
            let (limit, caller_bound) = match bound {
                // On an explicit (manual) clock a budget is not real time:
                // a real timer on it would refuse at random under load.
                Some(b) if b < timeout && !self.conn.link.explicit_time => (b, true),
                _ => (timeout, false),
            };
            let call = script::Call {
                params,
                bounds,
                refunds: &refunds,
                writer,
                settles: &settles,
                op,
            };
            match self.conn.run(call, now, limit).await {
                (None, trips) if caller_bound => {
                    let mut state = self.state.lock();
                    state.stats.round_trips += trips;
                    state.stats.out_of_budget += 1;
                    return Err(Failed::Budget);
                }
                answer => answer,
            }
        };
        // On any failure the refunds are dropped: they may have been
        // applied, and applying one twice could pop another take. The
        // settles stay queued: the script applies each once.
        let done = self.clock.now_nanos();
        let mut state = self.state.lock();
        state.stats.round_trips += trips;
        match result {
            Some(Ok(reply)) => match reply[..] {
                [refunded, period_us, burst, stored_period, stored_burst, ..]
                    if refunded >= 0
                        && period_us > 0
                        && burst > 0
                        && burst <= u32::MAX as i64
                        && expected.hold(Params {
                            period_us: period_us as u64,
                            burst: burst as u32,
                        }) =>
                {
                    if let Some((seq, _)) = settles.last() {
                        state.settled(*seq);
                    }
                    state.stats.refunded += refunded as u64;
                    state.stats.admitted = state.stats.admitted.saturating_sub(refunded as u64);
                    let remote = Params {
                        period_us: period_us as u64,
                        burst: burst as u32,
                    };
                    if remote != state.params {
                        state.adopt(remote);
                        let quota = state.quota;
                        drop(state);
                        self.log_adopted(remote, (stored_period, stored_burst));
                        self.adopt_fallback(quota);
                    }
                    return Ok(reply[5..].to_vec());
                }
                _ => {}
            },
            Some(Err(e)) if is_reply(&e) => {}
            // A connection error or the store timeout.
            _ => state.breaker.trip(done),
        }
        state.stats.failures += 1;
        Err(Failed::Store)
    }

    /// Logs a change of the quota in force (feature `tracing`): a warning
    /// when the key's stored quota was out of bounds and is taken clamped.
    #[cold]
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    fn log_adopted(&self, in_force: Params, stored: (i64, i64)) {
        #[cfg(feature = "tracing")]
        {
            let (stored_period_us, stored_burst) = stored;
            let (period_us, burst) = (in_force.period_us, in_force.burst);
            let clamped = stored_period_us > 0
                && (stored_period_us, stored_burst) != (period_us as i64, burst as i64);
            if clamped {
                tracing::event!(
                    tracing::Level::WARN,
                    key = %self.conn.key,
                    stored_period_us,
                    stored_burst,
                    period_us,
                    burst,
                    "backpressure: the quota stored with the key is out of this process's \
                     bounds; taken clamped"
                );
            } else {
                tracing::event!(
                    tracing::Level::DEBUG,
                    key = %self.conn.key,
                    period_us,
                    burst,
                    stored = stored_period_us > 0,
                    "backpressure: the shared quota in force changed"
                );
            }
        }
    }

    /// Undoes a remote take, best effort, within `budget` nanoseconds.
    pub(super) async fn remote_cancel(&self, refund: Refund, budget: u64) -> bool {
        if budget == 0 {
            return false;
        }
        let bound = Some(Duration::from_nanos(budget));
        matches!(
            self.call(Op::Cancel { refund }, bound).await,
            Ok(reply) if reply.first() == Some(&1)
        )
    }
}

/// Whether `e` is an error reply from Redis (script error, `WRONGTYPE`,
/// `BUSY`, ...) rather than a transport failure: Redis is up.
fn is_reply(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::UnexpectedReturnType
    )
}
