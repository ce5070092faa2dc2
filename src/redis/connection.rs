//! The one way a script call reaches Redis: a lazily made connection (a
//! `redis` crate `ConnectionManager`, which reconnects on its own), bounded
//! by the store timeout or the caller's shorter budget, behind the
//! breaker; and what each outcome counts as.

use core::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, ErrorKind, RedisError, RedisResult, Script};
use tokio::sync::OnceCell;

use super::script::{self, Op, Params};
use super::RedisBucket;

/// The connection, the script and the key: everything a call sends.
pub(super) struct Connection {
    client: Client,
    manager: OnceCell<ConnectionManager>,
    script: Script,
    pub(super) key: String,
    pub(super) params: Params,
    /// The store timeout: the longest any call may take, connecting
    /// included.
    pub(super) timeout: Duration,
    /// Cap on the manager's reconnect backoff (the probe interval).
    reconnect_cap: Duration,
    /// Send the bucket's clock with each call instead of using Redis's
    /// `TIME`.
    explicit_time: bool,
}

/// Why a script call produced no decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Failed {
    /// Redis did not decide: a connection error, the store timeout, an
    /// error or malformed reply, or a recent failure said not to try.
    /// Counted in `failures`; the failure policy answers.
    Store,
    /// The caller's budget, shorter than the store timeout, ran out before
    /// the reply. Counted in `out_of_budget`; the caller's own refusal,
    /// which says nothing about Redis.
    Budget,
}

impl Connection {
    pub(super) fn new(
        client: Client,
        key: String,
        params: Params,
        timeout: Duration,
        reconnect_cap: Duration,
        explicit_time: bool,
    ) -> Self {
        Connection {
            client,
            manager: OnceCell::new(),
            script: Script::new(script::SOURCE),
            key,
            params,
            timeout,
            reconnect_cap,
            explicit_time,
        }
    }

    /// Runs `op` (decided at `now`, in nanoseconds, when the time is
    /// explicit) within `limit`. Returns the reply, or `None` if `limit`
    /// passed first, and the round trips that completed.
    async fn run(&self, op: Op, now: u64, limit: Duration) -> (Option<RedisResult<Vec<i64>>>, u64) {
        let now_us = self.explicit_time.then_some(now / 1000);
        let mut trips = 0;
        let result = tokio::time::timeout(limit, async {
            let conn = self
                .manager
                .get_or_try_init(|| {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout(Some(self.timeout))
                        .set_number_of_retries(2)
                        .set_max_delay(self.reconnect_cap);
                    ConnectionManager::new_with_config(self.client.clone(), config)
                })
                .await?;
            let (reply, n) = script::run(
                &mut conn.clone(),
                &self.script,
                &self.key,
                self.params,
                now_us,
                op,
            )
            .await;
            trips = n;
            reply
        })
        .await;
        (result.ok(), trips)
    }
}

impl RedisBucket {
    /// Sends `op` to Redis within the store timeout, or within `bound` (the
    /// caller's budget) when that is shorter, unless the breaker says not
    /// to try yet. Counts round trips, failures and calls out of budget.
    ///
    /// Only a connection error or the store timeout trips the breaker.
    /// Running out of a shorter `bound` is [`Failed::Budget`]: a caller
    /// that could not wait for the round trip learns nothing about Redis's
    /// health, and must not fail the callers after it. An error reply
    /// means Redis is up: a failure for this call only.
    pub(super) async fn call(&self, op: Op, bound: Option<Duration>) -> Result<Vec<i64>, Failed> {
        let now = self.clock.now_nanos();
        {
            let mut state = self.state.lock();
            if state.breaker.is_open(now) {
                state.stats.failures += 1;
                return Err(Failed::Store);
            }
        }
        // The connection and its timer need a tokio runtime; without one,
        // this is a failure, not a panic.
        let (result, trips) = if tokio::runtime::Handle::try_current().is_err() {
            (None, 0)
        } else {
            let (limit, caller_bound) = match bound {
                // On an explicit (manual) clock a budget is not real time:
                // a real timer on it would refuse at random under load.
                Some(b) if b < self.conn.timeout && !self.conn.explicit_time => (b, true),
                _ => (self.conn.timeout, false),
            };
            match self.conn.run(op, now, limit).await {
                (None, trips) if caller_bound => {
                    let mut state = self.state.lock();
                    state.stats.round_trips += trips;
                    state.stats.out_of_budget += 1;
                    return Err(Failed::Budget);
                }
                answer => answer,
            }
        };
        let done = self.clock.now_nanos();
        let mut state = self.state.lock();
        state.stats.round_trips += trips;
        match result {
            Some(Ok(reply)) => return Ok(reply),
            Some(Err(e)) if is_reply(&e) => {}
            // A connection error or the store timeout.
            _ => state.breaker.trip(done),
        }
        state.stats.failures += 1;
        Err(Failed::Store)
    }

    /// Undoes a remote take, best effort, within `budget` nanoseconds.
    pub(crate) async fn remote_cancel(&self, before: u64, after: u64, budget: u64) -> bool {
        if budget == 0 {
            return false;
        }
        let bound = Some(Duration::from_nanos(budget));
        matches!(
            self.call(Op::Cancel { before, after }, bound).await,
            Ok(reply) if reply.first() == Some(&1)
        )
    }
}

/// Whether `e` is Redis's answer (an error reply: a script error,
/// `WRONGTYPE`, `BUSY`, `LOADING`, ...) rather than a transport failure:
/// Redis is up and answers at once, so there is no timeout to avoid.
fn is_reply(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::UnexpectedReturnType
    )
}
