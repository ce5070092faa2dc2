//! Loom model of the admission pools: a tool's slot, then the global one.
//!
//! Global cap 2, tool caps 1. Call A holds tool X's slot (running). Call B
//! for X must wait without taking a global slot, so call C for tool Y gets
//! the remaining global slot even while A is still running: if B held a
//! global slot while waiting, C would deadlock, which loom reports.

use core::future::Future;
use core::pin::pin;
use core::time::Duration;

use loom::future::block_on;
use loom::sync::atomic::AtomicUsize;
use loom::sync::Arc;
use loom::thread;

use crate::admission::lanes::Priority;
use crate::admission::pools::{acquire_both, Caller, Pool, SlotError, SlotPolicy, Which};

/// An interactive call under `policy`.
fn call(policy: SlotPolicy) -> Caller<'static> {
    Caller {
        policy,
        priority: Priority::INTERACTIVE,
        tenant: "k",
    }
}

/// Gives back the slots of a call admitted on `tool` (held as counts).
fn release(tool: &Pool, global: &Pool) {
    tool.release(false);
    global.release(false);
}

/// A timeout that never fires.
fn never() -> impl Future<Output = ()> {
    core::future::pending()
}

struct Pools {
    global: Pool,
    x: Pool,
    y: Pool,
    waiting: AtomicUsize,
}

fn pools() -> Arc<Pools> {
    Arc::new(Pools {
        global: Pool::new(2, Duration::from_millis(1)),
        x: Pool::new(1, Duration::from_millis(1)),
        y: Pool::new(1, Duration::from_millis(1)),
        waiting: AtomicUsize::new(0),
    })
}

#[test]
fn waiting_for_a_tool_holds_no_global_slot() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound.get_or_insert(2);
    b.check(|| {
        let p = pools();
        // A is running on X.
        block_on(acquire_both(
            &p.x,
            &p.global,
            call(SlotPolicy::Wait),
            &p.waiting,
            8,
            pin!(never()),
        ))
        .unwrap();
        let p2 = p.clone();
        let b_call = thread::spawn(move || {
            let got = block_on(acquire_both(
                &p2.x,
                &p2.global,
                call(SlotPolicy::Wait),
                &p2.waiting,
                8,
                pin!(never()),
            ));
            if got.is_ok() {
                release(&p2.x, &p2.global);
            }
            got.is_ok()
        });
        // C on Y completes while A still runs and B waits (or has not
        // started): B holds no global slot.
        block_on(acquire_both(
            &p.y,
            &p.global,
            call(SlotPolicy::Wait),
            &p.waiting,
            8,
            pin!(never()),
        ))
        .unwrap();
        release(&p.y, &p.global); // C
        release(&p.x, &p.global); // A
        assert!(b_call.join().unwrap());
        assert_eq!(p.global.sem.available_permits(), 2);
        assert_eq!(p.x.sem.available_permits(), 1);
    });
}

#[test]
fn fail_fast_sheds_without_keeping_the_tool_slot() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound.get_or_insert(2);
    b.check(|| {
        let p = Arc::new(Pools {
            global: Pool::new(1, Duration::from_millis(1)),
            x: Pool::new(1, Duration::from_millis(1)),
            y: Pool::new(1, Duration::from_millis(1)),
            waiting: AtomicUsize::new(0),
        });
        let p2 = p.clone();
        let t = thread::spawn(move || {
            block_on(acquire_both(
                &p2.y,
                &p2.global,
                call(SlotPolicy::FailFast),
                &p2.waiting,
                8,
                pin!(never()),
            ))
            .map(|()| release(&p2.y, &p2.global))
        });
        let mine = block_on(acquire_both(
            &p.x,
            &p.global,
            call(SlotPolicy::FailFast),
            &p.waiting,
            8,
            pin!(never()),
        ));
        let theirs = t.join().unwrap();
        // At most one gets the single global slot; a refusal is a shed on
        // the global pool and leaves its tool slot free.
        match (&mine, &theirs) {
            (Ok(_), Ok(_)) => {} // sequential: the first dropped before the second
            (Ok(_), Err((SlotError::Full { .. }, Which::Global)))
            | (Err((SlotError::Full { .. }, Which::Global)), Ok(_)) => {}
            other => panic!("unexpected outcome {other:?}"),
        }
        if mine.is_ok() {
            release(&p.x, &p.global);
        }
        assert_eq!(p.x.sem.available_permits(), 1);
        assert_eq!(p.y.sem.available_permits(), 1);
        assert_eq!(p.global.sem.available_permits(), 1);
        assert_eq!(
            loom::sync::atomic::AtomicUsize::load(&p.waiting, loom::sync::atomic::Ordering::SeqCst),
            0
        );
    });
}

/// `Admission::close` closes the tool pools and then the global pool while
/// calls wait on either: every waiter wakes with `Closed` (none sleeps to
/// its deadline, none is admitted after both pools closed), and a slot held
/// across the close is still returned.
#[test]
fn close_wakes_a_waiter_on_either_pool() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound.get_or_insert(2);
    b.check(|| {
        let p = pools();
        // A runs on X and holds the only X slot; C runs on Y.
        block_on(acquire_both(
            &p.x,
            &p.global,
            call(SlotPolicy::Wait),
            &p.waiting,
            8,
            pin!(never()),
        ))
        .unwrap();
        let p2 = p.clone();
        // B waits for X's slot (A holds it).
        let b_call = thread::spawn(move || {
            block_on(acquire_both(
                &p2.x,
                &p2.global,
                call(SlotPolicy::Wait),
                &p2.waiting,
                8,
                pin!(never()),
            ))
            .map(|()| release(&p2.x, &p2.global))
        });
        let p3 = p.clone();
        let closer = thread::spawn(move || {
            p3.x.close();
            p3.y.close();
            p3.global.close();
        });
        closer.join().unwrap();
        // With a never-firing timeout, B returns only because it was woken.
        let got = b_call.join().unwrap();
        assert!(
            matches!(got, Err((SlotError::Closed, Which::Tool))),
            "{got:?}"
        );
        release(&p.x, &p.global); // A
        assert_eq!(p.x.sem.available_permits(), 1);
        assert_eq!(p.global.sem.available_permits(), 2);
    });
}
