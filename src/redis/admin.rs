//! `until_ready`, and the operations that change the key for every
//! process: `set_quota` and `reset`.

use core::time::Duration;

use super::breaker::Policy;
use super::builder::{self, RedisBucketError};
use super::script::Op;
use super::RedisBucket;
#[cfg(doc)]
use super::RedisReservation;
#[cfg(doc)]
use crate::bucket::TokenBucket;
use crate::bucket::{Quota, ReserveError};
use crate::sleep::Sleeper;

impl RedisBucket {
    /// Waits until `n` cells are admitted, if that takes at most
    /// `max_wait` (the time left before the caller's deadline): one
    /// [`reserve`](RedisBucket::reserve), then a sleep of exactly the
    /// reserved wait on `sleeper`, holding the reservation.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it sleeps drops the reservation before its
    /// wait has passed, which gives the cells back (queued for the next
    /// round trip when they came from Redis; see [`RedisReservation`]).
    ///
    /// # Errors
    ///
    /// As [`reserve`](RedisBucket::reserve).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket, DefaultSleeper};
    /// # use std::num::NonZeroU32;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// // Any `Sleeper`; `DefaultSleeper` uses tokio's timer under tokio.
    /// bucket.until_ready(1, Duration::from_secs(2), &DefaultSleeper::new()).await.unwrap();
    /// // call the API
    /// # }
    /// ```
    pub async fn until_ready<S: Sleeper>(
        &self,
        n: u32,
        max_wait: Duration,
        sleeper: &S,
    ) -> Result<(), ReserveError> {
        let reservation = self.reserve(n, max_wait).await?;
        let wait = reservation.wait();
        if !wait.is_zero() {
            sleeper.sleep(wait).await;
        }
        reservation.keep();
        Ok(())
    }

    /// Makes `quota` this process's own and stores it with the key for
    /// **every** process on it. Here it is in force at once, and it raises
    /// this process's ceiling when faster or burstier than the quota it was
    /// built with. Other processes adopt it at their next round trip, within
    /// their own bounds (see *A stored quota is advice* on [`RedisBucket`]).
    ///
    /// The contract is [`TokenBucket::set_quota`]'s: the debt is kept in
    /// cells, a running penalty keeps its end, and no burst is opened. The
    /// fail-open fallback follows at its share. Reservations taken before a
    /// change no longer give their cells back.
    ///
    /// # Errors
    ///
    /// A quota whose tolerance (`burst * period`) exceeds 2^51 µs (nothing
    /// changes), or Redis not answering: the quota is this process's own
    /// either way, but the key may not have stored it: call again.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::new(10).unwrap()))
    ///     .build().unwrap();
    /// // The provider cut the plan: every process slows down.
    /// bucket.set_quota(Quota::per_second(NonZeroU32::new(2).unwrap())).await.unwrap();
    /// # }
    /// ```
    pub async fn set_quota(&self, quota: Quota) -> Result<(), RedisBucketError> {
        let params = builder::params_of(quota)?;
        let old = self.state.lock().params;
        let stored = self.call(Op::SetQuota { params }, None).await;
        // Its own from now on, whether the key heard of it or not.
        self.state.lock().set_own(quota, params);
        stored.map_err(|_| builder::config_error("redis did not apply the quota"))?;
        let mut state = self.state.lock();
        if state.params == params {
            // Exact to the nanosecond here; others see µs.
            state.quota = quota;
        }
        if old != params {
            // The key's state was converted: as the local bucket, no
            // earlier reservation can give back.
            state.generation += 1;
            state.refunds.clear();
        }
        drop(state);
        self.adopt_fallback(quota);
        Ok(())
    }

    /// Fills the key's bucket and lifts any penalty, for every process on
    /// it (a stored quota stays), as [`TokenBucket::reset`]. This
    /// process's leased cells are dropped (the bucket is full anyway), and
    /// reservations taken before no longer queue refunds. The fail-open
    /// fallback is reset too.
    ///
    /// # Errors
    ///
    /// Redis not answering.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use backpressure::{Quota, RedisBucket};
    /// # use std::num::NonZeroU32;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let bucket = RedisBucket::builder("redis://127.0.0.1/", "k", Quota::per_second(NonZeroU32::MIN))
    ///     .build().unwrap();
    /// bucket.try_acquire(1).await.unwrap();
    /// bucket.reset().await.unwrap();
    /// assert!(bucket.try_acquire(1).await.is_ok());
    /// # }
    /// ```
    pub async fn reset(&self) -> Result<(), RedisBucketError> {
        let _ = self.drain_lease(true);
        if let Policy::Open { bucket, .. } = &self.policy {
            bucket.reset();
        }
        let reset = self.call(Op::Reset, None).await;
        reset.map_err(|_| builder::config_error("redis did not reset the key"))?;
        let mut state = self.state.lock();
        state.generation += 1;
        state.refunds.clear();
        Ok(())
    }
}
