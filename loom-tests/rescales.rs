//! Loom model of a credential's rescale log (`admission/rate/rescales.rs`):
//! a learned rate's change is logged (a count, Release) while a call
//! sleeping towards its cell registers its waker (the count read, Acquire,
//! under the wakers' lock). The sleeper must either see the change or be
//! woken by it: a lost wake-up sends its request at the old instant, one
//! too many for the new rate.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::task::{Wake, Waker};

use crate::admission::rate::rescales::Rescales;
use crate::bucket::gcra::Rescale;
use crate::sync::Arc;

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b
}

/// Counts its wakes (std's atomic: the waker is the model's probe, not
/// the code under test).
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// The rate halves at 1 ms: a cell at 11 ms moves to 21 ms.
const HALVED: Rescale = Rescale {
    at: 1_000_000,
    old_period: 10_000_000,
    new_period: 20_000_000,
    epoch: 1,
};

#[test]
fn a_sleeper_registering_as_a_change_is_logged_sees_it_or_is_woken() {
    builder().check(|| {
        let log = Arc::new(Rescales::default());
        let logger = {
            let log = log.clone();
            loom::thread::spawn(move || log.push(HALVED))
        };
        // The sleeper: up to date with the log, then asleep on its cell.
        let mut turn = log.turn(11_000_000, 0);
        log.catch_up(&mut turn);
        let caught_up = turn.ready_at == 21_000_000;
        let count = std::sync::Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let saw = log.changed(&turn, 7, &waker);
        logger.join().unwrap();
        assert!(
            caught_up || saw || count.0.load(SeqCst) == 1,
            "the change was neither seen nor woke the sleeper"
        );
        // Whichever way it learned, catching up moves its cell.
        log.catch_up(&mut turn);
        assert_eq!(turn.ready_at, 21_000_000);
    });
}
