//! Integrations with what users already run: tower layers (feature
//! `tower`), a reqwest middleware (feature `reqwest`), a throttling fake
//! server for tests (feature `testing`), and [`PollSemaphore`] for
//! hand-written `poll_*` code.

mod poll_semaphore;
#[cfg(feature = "reqwest")]
pub mod reqwest;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "tower")]
pub mod tower;

pub use poll_semaphore::PollSemaphore;

/// A retry decision surfaced to the caller, as its `Throttled`: the
/// server's wait (`rate_limited`) or our refused backoff (`timed_out`),
/// scope `server` or `server:<scope>`.
#[cfg(any(feature = "tower", feature = "reqwest"))]
#[cold]
pub(crate) fn surfaced(s: crate::Surfaced) -> crate::Throttled {
    use crate::{Status, SurfaceStatus, Throttled};
    let status = match s.status {
        SurfaceStatus::TimedOut => Status::TimedOut,
        _ => Status::RateLimited,
    };
    let scope = match &s.scope {
        Some(scope) => format!("server:{scope}"),
        None => "server".to_string(),
    };
    let t = Throttled::new(status, scope, s.hint);
    match s.retry_after {
        Some(d) => t.with_retry_after(d),
        None => t,
    }
}
