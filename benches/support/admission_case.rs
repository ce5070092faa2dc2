//! The uncontended call both admission benches measure, and the bare
//! primitives it is compared with.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::Duration;

use backpressure::admission::{Admission, Call, CallSpec, Reply, Runner, SlotPolicy};
use backpressure::Quota;

/// The weighted quotas of the 4-quota case (with the request quota).
pub const RESOURCES: [&str; 3] = ["tokens", "input_tokens", "output_tokens"];

/// Never binds: one cell per nanosecond, a burst of 2^32 - 1.
pub fn open() -> Quota {
    Quota::with_period(Duration::from_nanos(1)).allow_burst(NonZeroU32::MAX)
}

/// A layer whose limits never bind (tool and global pools of 64, every
/// quota open), the plain call (tool slot + global slot + request quota)
/// and the weighted one (the same + 3 weighted quotas), each admitted once
/// so the tool and the credential exist.
pub fn layer() -> (Admission, CallSpec, CallSpec) {
    let mut builder = Admission::builder()
        .fixed_rates()
        .default_quota(open())
        .tool("search", 64, SlotPolicy::Wait)
        .global_concurrency(64);
    for r in RESOURCES {
        builder = builder.resource(r, open());
    }
    let layer = builder.build();
    let plain = CallSpec::new("search", "key");
    let weighted = RESOURCES
        .iter()
        .fold(CallSpec::new("search", "key"), |s, r| s.cost(*r, 10));
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    admit_once(&layer, &plain, &mut cx);
    admit_once(&layer, &weighted, &mut cx);
    (layer, plain, weighted)
}

/// Admits `spec` (at once, or panics) and drops the ticket.
pub fn admit_once(admission: &Admission, spec: &CallSpec, cx: &mut Context<'_>) {
    match pin!(admission.admit(spec)).as_mut().poll(cx) {
        Poll::Ready(Ok(ticket)) => drop(black_box(ticket)),
        _ => panic!("an uncontended call is admitted at once"),
    }
}

/// The bare primitives an admitted call is made of, used as `admit` uses
/// them: two owned permits and one keyed reservation per quota.
pub struct Primitives {
    tool: std::sync::Arc<backpressure::Semaphore>,
    global: std::sync::Arc<backpressure::Semaphore>,
    requests: backpressure::Scoped<String>,
    quotas: Vec<backpressure::Scoped<String>>,
    key: String,
}

impl Primitives {
    pub fn new() -> Self {
        use backpressure::{Scoped, Semaphore};
        Self {
            tool: std::sync::Arc::new(Semaphore::new(64)),
            global: std::sync::Arc::new(Semaphore::new(64)),
            requests: Scoped::new(open()),
            quotas: RESOURCES.iter().map(|_| Scoped::new(open())).collect(),
            key: "key".to_string(),
        }
    }

    /// The plain call's: tool slot + global slot + request quota.
    pub fn plain(&self) {
        let t = self.tool.clone().try_acquire_owned().unwrap();
        let g = self.global.clone().try_acquire_owned().unwrap();
        let r = self.requests.reserve(&self.key, 1, Duration::ZERO).unwrap();
        drop(black_box((t, g, r)));
    }

    /// The same + the 3 weighted quotas.
    pub fn weighted(&self) {
        let t = self.tool.clone().try_acquire_owned().unwrap();
        let g = self.global.clone().try_acquire_owned().unwrap();
        let r = self.requests.reserve(&self.key, 1, Duration::ZERO).unwrap();
        let rs: [_; 3] = core::array::from_fn(|i| {
            self.quotas[i]
                .reserve(&self.key, 10, Duration::ZERO)
                .unwrap()
        });
        drop(black_box((t, g, r, rs)));
    }
}

/// A `Runner` over `layer` with no cache: every call runs.
pub fn runner(layer: &Admission) -> Runner<u32> {
    Runner::new(layer.clone(), Duration::ZERO)
}

/// A write call (sent once, never coalesced) whose attempt answers 200 at once.
pub fn ready_call(spec: &CallSpec) -> Call<u32> {
    Call::new(spec.clone().write(), || {
        std::future::ready(Ok(Reply::new(200, 7)))
    })
}

/// Runs `call` to its end (at once, or panics).
pub fn call_once(runner: &Runner<u32>, call: Call<u32>, cx: &mut Context<'_>) {
    match pin!(runner.one(call)).as_mut().poll(cx) {
        Poll::Ready(r) => drop(black_box(r)),
        Poll::Pending => panic!("an uncontended call with a ready exchange ends at once"),
    }
}
