//! The semaphore benches' FIFO floors (`benches/semaphore/fifo_floor.rs`)
//! carry unsafe code of their own: a spin lock, and a state with no lock
//! for one thread. These run them under every lock and both ways of
//! waking, here and under miri (`.ci/run`), and check what a semaphore
//! must: never more holders than permits, and every acquire served.

#[path = "../../benches/semaphore/fifo_floor.rs"]
mod floor;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use floor::{Fifo, Guard, Wakes};

const PERMITS: usize = 2;
const PER: usize = if cfg!(miri) { 12 } else { 2_000 };

/// Holders now, and the most there ever were.
#[derive(Default)]
struct Holders {
    now: AtomicUsize,
    max: AtomicUsize,
    done: AtomicUsize,
}

impl Holders {
    fn enter(&self) {
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.max.fetch_max(now, SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, SeqCst);
        self.done.fetch_add(1, SeqCst);
    }

    fn check(&self, acquisitions: usize) {
        assert_eq!(self.done.load(SeqCst), acquisitions, "every acquire served");
        assert!(
            self.max.load(SeqCst) <= PERMITS,
            "{} holders",
            self.max.load(SeqCst)
        );
        assert!(self.max.load(SeqCst) >= 1);
    }
}

/// Four threads, each acquiring `PER` times and holding across a yield.
fn threads<G: Guard>(sem: &Fifo<G>) {
    let holders = Holders::default();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..PER {
                    let permit = futures::executor::block_on(sem.acquire());
                    holders.enter();
                    std::thread::yield_now();
                    holders.leave();
                    drop(permit);
                }
            });
        }
    });
    holders.check(4 * PER);
}

#[test]
fn the_spin_lock_floor_serves_every_acquire_within_its_permits() {
    threads(&Fifo::spin(PERMITS, Wakes::AtOnce));
    threads(&Fifo::spin(PERMITS, Wakes::OneAtATime));
}

#[test]
fn the_parking_lot_floor_serves_every_acquire_within_its_permits() {
    threads(&Fifo::parking_lot(PERMITS));
}

#[test]
fn the_floor_with_no_lock_serves_every_acquire_on_one_thread() {
    use futures::task::LocalSpawnExt;

    // SAFETY: every task runs on this thread's `LocalPool`.
    let sem = Arc::new(unsafe { Fifo::unsync(PERMITS) });
    let holders = Arc::new(Holders::default());
    let mut pool = futures::executor::LocalPool::new();
    for _ in 0..8 {
        let (sem, holders) = (sem.clone(), holders.clone());
        pool.spawner()
            .spawn_local(async move {
                for _ in 0..PER / 4 {
                    let permit = sem.acquire().await;
                    holders.enter();
                    crate::single_flight::yield_now().await;
                    holders.leave();
                    drop(permit);
                }
            })
            .unwrap();
    }
    pool.run();
    holders.check(8 * (PER / 4));
}
