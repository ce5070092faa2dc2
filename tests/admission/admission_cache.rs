//! The per-thread cache in front of the tool and credential registries
//! (see `src/admission/cache.rs`) answers as the registries do: a tool
//! evicted and created again is the new one, and two layers never share
//! an entry. One thread, so every call goes through the same cache.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll};

use backpressure::admission::{Admission, CallSpec, SlotPolicy, Ticket};
use backpressure::Status;
use backpressure::{ManualClock, Quota};

type Layer = Admission<ManualClock, ManualClock>;

fn layer(
    build: impl FnOnce(backpressure::admission::Builder) -> backpressure::admission::Builder,
) -> Layer {
    let clock = ManualClock::new();
    build(Admission::builder())
        .sleeper(clock.clone())
        .clock(clock)
        .fixed_rates()
        .default_quota(Quota::per_second(NonZeroU32::new(1_000).unwrap()))
        .build()
}

fn admit(a: &Layer, tool: &str) -> Result<Ticket<ManualClock, ManualClock>, Status> {
    let waker = futures::task::noop_waker();
    let spec = CallSpec::new(tool, "key");

    match pin!(a.admit(&spec))
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
    {
        Poll::Ready(r) => r.map_err(|t| t.status),
        Poll::Pending => panic!("decided at once"),
    }
}

fn admitted(a: &Layer, tool: &str) -> Option<u64> {
    a.stats()
        .tools
        .iter()
        .find(|t| t.name == tool)
        .map(|t| t.admitted)
}

#[test]
fn a_tool_evicted_and_created_again_is_the_new_one() {
    let a = layer(|b| b.max_tools(1).default_tool(1, SlotPolicy::FailFast));
    drop(admit(&a, "x").unwrap());
    drop(admit(&a, "x").unwrap()); // from the cache
    assert_eq!(admitted(&a, "x"), Some(2));
    // "y" takes the one place: the idle "x" is evicted.
    drop(admit(&a, "y").unwrap());
    assert_eq!(admitted(&a, "x"), None);
    // "x" again: a fresh tool (its count starts over), not the cached one.
    let held = admit(&a, "x").unwrap();
    assert_eq!(admitted(&a, "x"), Some(1));
    // ... and its pool is the registry's: a second call is shed by it.
    assert_eq!(admit(&a, "x").unwrap_err(), Status::Shed);
    drop(held);
}

#[test]
fn two_layers_do_not_share_a_cached_tool() {
    let one = layer(|b| b.tool("t", 1, SlotPolicy::FailFast));
    let two = layer(|b| b.tool("t", 1, SlotPolicy::FailFast));
    let held = admit(&one, "t").unwrap();
    // The same name on another layer: its own slot, free.
    let other = admit(&two, "t").unwrap();
    assert_eq!(admit(&one, "t").unwrap_err(), Status::Shed);
    assert_eq!(admit(&two, "t").unwrap_err(), Status::Shed);
    assert_eq!(
        (admitted(&one, "t"), admitted(&two, "t")),
        (Some(1), Some(1))
    );
    drop((held, other));
}

#[test]
fn more_tools_than_the_cache_holds_still_count_apart() {
    let a = layer(|b| b);
    for round in 1..=3 {
        for tool in ["a", "b", "c", "d", "e", "f"] {
            drop(admit(&a, tool).unwrap());
            assert_eq!(admitted(&a, tool), Some(round));
        }
    }
}
