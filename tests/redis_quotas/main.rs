//! Quotas shared across processes: RedisBucket, RedisScoped, a fleet, a 3-master cluster, the scale bound and the admission layer on redis, against servers the tests start.
//!
//! One test binary per area (each links once); each module was its own
//! binary before and keeps its own docs.

mod admission_redis;
mod redis_bucket;
mod redis_cluster;
mod redis_fleet;
mod redis_scale;
mod redis_stored_quota;

/// A redis-server on a free loopback port, shared by the modules above.
#[cfg(feature = "redis")]
#[path = "../support/redis_server.rs"]
mod redis_server;
