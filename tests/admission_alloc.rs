//! The success path of `admit` performs no heap allocation (issue #12
//! item 6), once the tool and the credential have been seen: a counting
//! global allocator, counting only on this test's thread. Without the
//! `metrics` feature: the metrics facade builds its label keys on the heap.
#![cfg(not(feature = "metrics"))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll};

use std::time::Duration;

use backpressure::admission::{Admission, Call, CallSpec, Reply, Runner};
use backpressure::{ManualClock, Quota};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    // Per thread: tests run side by side.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: defers every operation to `System`; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: the caller's contract is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: as `System::realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn admit_and_drop(admission: &Admission<ManualClock, ManualClock>, spec: &CallSpec) -> usize {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    COUNTING.with(|c| c.set(true));
    let before = ALLOCATIONS.with(Cell::get);
    let ticket = match pin!(admission.admit(spec)).as_mut().poll(&mut cx) {
        Poll::Ready(Ok(t)) => t,
        other => panic!("not admitted at once: {:?}", other.map(|r| r.map(|_| ()))),
    };
    drop(ticket);
    let n = ALLOCATIONS.with(Cell::get) - before;
    COUNTING.with(|c| c.set(false));
    n
}

#[test]
fn admit_and_drop_allocate_nothing_once_warm() {
    let clock = ManualClock::new();
    let per_sec = |n| Quota::per_second(NonZeroU32::new(n).unwrap());
    for adaptive in [true, false] {
        let builder = Admission::builder()
            .sleeper(clock.clone())
            .clock(clock.clone())
            .default_quota(per_sec(1_000_000))
            .resource("tokens", per_sec(1_000_000))
            .resource("input_tokens", per_sec(1_000_000))
            .resource("output_tokens", per_sec(1_000_000));
        let admission = if adaptive {
            builder.build()
        } else {
            builder.fixed_rates().build()
        };
        let plain = CallSpec::new("search", "key");
        let weighted = CallSpec::new("complete", "key")
            .cost("tokens", 10)
            .cost("input_tokens", 5)
            .cost("output_tokens", 5);
        // The first calls create the tool and credential entries.
        admit_and_drop(&admission, &plain);
        admit_and_drop(&admission, &weighted);
        for _ in 0..100 {
            assert_eq!(
                admit_and_drop(&admission, &plain),
                0,
                "adaptive: {adaptive}"
            );
            assert_eq!(
                admit_and_drop(&admission, &weighted),
                0,
                "adaptive: {adaptive}"
            );
        }
    }
}

/// Allocations made by one `Runner::one` call, polled to its end at once;
/// the `Call` (and its boxed closure) is built before counting.
fn one_call(runner: &Runner<u32, String, ManualClock, ManualClock>, spec: &CallSpec) -> usize {
    let call = Call::new(spec.clone(), || {
        std::future::ready(Ok(Reply::new(200, 7u32)))
    });
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    COUNTING.with(|c| c.set(true));
    let before = ALLOCATIONS.with(Cell::get);
    let result = match pin!(runner.one(call)).as_mut().poll(&mut cx) {
        Poll::Ready(r) => r,
        Poll::Pending => panic!("a call with room and a ready exchange is not pending"),
    };
    let n = ALLOCATIONS.with(Cell::get) - before;
    COUNTING.with(|c| c.set(false));
    assert_eq!(result.value(), Some(&7));
    n
}

/// The attempt's future is made in the box `Call::new` allocated (with the
/// closure, before counting), so the call allocates nothing.
#[test]
fn a_full_call_through_runner_and_drive_allocates_nothing_once_warm() {
    let clock = ManualClock::new();
    let per_sec = |n| Quota::per_second(NonZeroU32::new(n).unwrap());
    let admission = Admission::builder()
        .sleeper(clock.clone())
        .clock(clock.clone())
        .default_quota(per_sec(1_000_000))
        .build();
    let runner: Runner<u32, String, ManualClock, ManualClock> =
        Runner::new(admission, Duration::ZERO);
    let spec = CallSpec::new("write_file", "key").write();
    one_call(&runner, &spec);
    for _ in 0..100 {
        assert_eq!(one_call(&runner, &spec), 0);
    }
}
