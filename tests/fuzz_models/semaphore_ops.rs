//! `semaphore_ops`: the semaphore against a reference model.
//!
//! The model is a counter, a FIFO of `(slot, still owed)` and per-slot
//! state. After every operation the available count, every poll result and
//! every wake must agree exactly; at the end, with everything dropped, the
//! semaphore holds what was issued.
//!
//! Some waiters' wakers panic: an operation that wakes one must panic after
//! the hand-off, still waking every other satisfied waiter. libFuzzer aborts
//! on any panic, so those waiters exist only outside `cfg(fuzzing)`.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use super::CountingWaker;
use backpressure::{AcquireError, Semaphore, SemaphorePermit};

const SLOTS: usize = 6;

/// Whether some waiters get a waker that panics (see the module docs).
const PANICKING_WAKERS: bool = !cfg!(fuzzing);

/// Counts its wakes in the slot's counter, then panics.
struct PanickingWaker(Arc<CountingWaker>);

impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        // Relaxed: single-threaded driver; the count is the only datum.
        self.0 .0.fetch_add(1, Ordering::Relaxed);
        panic!("semaphore_ops: waker panics on purpose");
    }
}

/// Runs `f`, checking that it panics exactly when the model says a
/// panicking waiter was woken.
fn expect_panic_iff<R>(panics: bool, what: &str, f: impl FnOnce() -> R) -> Option<R> {
    let got = catch_unwind(AssertUnwindSafe(f));
    assert_eq!(got.is_err(), panics, "{what}: panicked");
    got.ok()
}

/// What the model believes a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Model {
    Empty,
    /// Queued, still owed `owed` of `n`.
    Queued {
        n: usize,
        owed: usize,
    },
    /// Unlinked: fully assigned, or failed by `close` (`closed`) with `owed`
    /// never assigned.
    Unlinked {
        n: usize,
        owed: usize,
        woken: bool,
    },
    Held {
        n: usize,
    },
}

struct Spec {
    avail: usize,
    closed: bool,
    queue: VecDeque<usize>,
    slots: [Model; SLOTS],
    issued: usize,
}

impl Spec {
    fn release(&mut self, mut k: usize) {
        while k > 0 {
            let Some(&front) = self.queue.front() else {
                break;
            };
            let Model::Queued { n, owed } = self.slots[front] else {
                unreachable!("queue holds only queued slots")
            };
            if k < owed {
                self.slots[front] = Model::Queued { n, owed: owed - k };
                return;
            }
            k -= owed;
            self.queue.pop_front();
            self.slots[front] = Model::Unlinked {
                n,
                owed: 0,
                woken: true,
            };
        }
        self.avail += k;
    }

    fn close(&mut self) {
        self.closed = true;
        while let Some(slot) = self.queue.pop_front() {
            let Model::Queued { n, owed } = self.slots[slot] else {
                unreachable!()
            };
            self.slots[slot] = Model::Unlinked {
                n,
                owed,
                woken: true,
            };
        }
    }
}

enum Real<'a> {
    Empty,
    Pending(Pin<Box<dyn Future<Output = Result<SemaphorePermit<'a>, AcquireError>> + 'a>>),
    Held(#[allow(dead_code)] SemaphorePermit<'a>),
}

/// Runs `data` as operations on a semaphore and the model, panicking at the
/// first disagreement.
pub fn semaphore_ops(data: &[u8]) {
    let Some((&first, ops)) = data.split_first() else {
        return;
    };
    let start = (first % 5) as usize;
    let sem = Semaphore::new(start);
    let mut spec = Spec {
        avail: start,
        closed: false,
        queue: VecDeque::new(),
        slots: [Model::Empty; SLOTS],
        issued: start,
    };
    let wakers: Vec<Arc<CountingWaker>> = (0..SLOTS).map(|_| Arc::default()).collect();
    // Whether the slot's future polls with a panicking waker.
    let mut panicky = [false; SLOTS];
    let waker_of = |slot: usize, panicky: bool| {
        if panicky {
            Waker::from(Arc::new(PanickingWaker(wakers[slot].clone())))
        } else {
            Waker::from(wakers[slot].clone())
        }
    };
    let mut real: Vec<Real<'_>> = (0..SLOTS).map(|_| Real::Empty).collect();

    for pair in ops.chunks(2) {
        let op = pair[0];
        let arg = pair.get(1).copied().unwrap_or(0);
        let slot = (arg as usize) % SLOTS;
        let n = (arg as usize / SLOTS) % 4; // 0..=3 permits

        // Does this op wake a panicking waiter? Compare the model around it.
        let before = spec.slots;
        let wakes_panicky = |spec: &Spec| {
            (0..SLOTS).any(|i| {
                panicky[i]
                    && matches!(before[i], Model::Queued { .. })
                    && matches!(spec.slots[i], Model::Unlinked { woken: true, .. })
            })
        };
        match op % 8 {
            // Acquire n in an empty slot and poll it once.
            0 | 1 if matches!(spec.slots[slot], Model::Empty) => {
                let mut fut = Box::pin(sem.acquire_many(n as u32));
                panicky[slot] = PANICKING_WAKERS && op / 8 % 4 == 0;
                let waker = waker_of(slot, panicky[slot]);
                wakers[slot].0.store(0, Ordering::Relaxed);
                let got = fut.as_mut().poll(&mut Context::from_waker(&waker));
                // Model: closed fails; enough permits with nobody queued
                // succeed; otherwise drain and queue.
                if spec.closed {
                    assert!(matches!(got, Poll::Ready(Err(_))), "acquire on closed");
                } else if n == 0 || (spec.queue.is_empty() && spec.avail >= n) {
                    let Poll::Ready(Ok(p)) = got else {
                        panic!("acquire_many({n}) should be ready")
                    };
                    spec.avail -= n;
                    spec.slots[slot] = Model::Held { n };
                    real[slot] = Real::Held(p);
                } else {
                    assert!(got.is_pending(), "acquire_many({n}) should queue");
                    let took = spec.avail;
                    spec.avail = 0;
                    spec.slots[slot] = Model::Queued { n, owed: n - took };
                    spec.queue.push_back(slot);
                    real[slot] = Real::Pending(fut);
                }
            }
            // Poll a pending slot.
            2 => {
                if let Real::Pending(fut) = &mut real[slot] {
                    let waker = waker_of(slot, panicky[slot]);
                    let mut cx = Context::from_waker(&waker);
                    match spec.slots[slot] {
                        Model::Queued { .. } => {
                            let got = fut.as_mut().poll(&mut cx);
                            assert!(got.is_pending(), "queued slot ready");
                        }
                        Model::Unlinked { n, owed, .. } => {
                            if spec.closed {
                                // Handing back what was assigned may wake
                                // (and panic) another slot.
                                spec.slots[slot] = Model::Empty;
                                spec.release(n - owed);
                                let got = expect_panic_iff(wakes_panicky(&spec), "poll", || {
                                    fut.as_mut().poll(&mut cx)
                                });
                                if let Some(got) = got {
                                    assert!(matches!(got, Poll::Ready(Err(_))));
                                }
                                real[slot] = Real::Empty;
                            } else {
                                let got = fut.as_mut().poll(&mut cx);
                                let Poll::Ready(Ok(p)) = got else {
                                    panic!("assigned slot not ready")
                                };
                                assert_eq!(p.num_permits(), n);
                                spec.slots[slot] = Model::Held { n };
                                real[slot] = Real::Held(p);
                            }
                        }
                        other => panic!("pending future but model says {other:?}"),
                    }
                }
            }
            // Drop whatever the slot holds (cancel or release).
            3 | 4 => {
                match spec.slots[slot] {
                    Model::Empty => {}
                    Model::Held { n } => spec.release(n),
                    Model::Queued { n, owed } => {
                        spec.queue.retain(|&s| s != slot);
                        spec.release(n - owed);
                    }
                    Model::Unlinked { n, owed, .. } => spec.release(n - owed),
                }
                spec.slots[slot] = Model::Empty;
                let old = std::mem::replace(&mut real[slot], Real::Empty);
                expect_panic_iff(wakes_panicky(&spec), "drop", || drop(old));
            }
            5 => {
                spec.issued += n;
                spec.release(n);
                expect_panic_iff(wakes_panicky(&spec), "add_permits", || sem.add_permits(n));
            }
            6 => {
                let got = sem.forget_permits(n);
                let want = spec.avail.min(n);
                assert_eq!(got, want, "forget_permits({n})");
                spec.avail -= want;
                spec.issued -= want;
            }
            7 if arg % 4 == 0 => {
                spec.close();
                expect_panic_iff(wakes_panicky(&spec), "close", || sem.close());
            }
            _ => {
                let got = sem.try_acquire_many(n as u32);
                if spec.closed {
                    assert!(got.unwrap_err().is_closed());
                } else if n == 0 || spec.avail >= n {
                    // `avail > 0` implies nobody is queued.
                    got.expect("try_acquire should succeed").forget();
                    spec.avail -= n;
                    spec.issued -= n;
                } else {
                    assert!(got.unwrap_err().is_no_permits());
                }
            }
        }
        assert_eq!(
            sem.available_permits(),
            spec.avail,
            "available after op {op}"
        );
        assert_eq!(sem.is_closed(), spec.closed);
        for (i, w) in wakers.iter().enumerate() {
            let woken = w.0.load(Ordering::Relaxed) > 0;
            if let Model::Unlinked { woken: true, .. } = spec.slots[i] {
                assert!(woken, "slot {i} should have been woken");
            }
            if let Model::Queued { .. } = spec.slots[i] {
                assert!(!woken, "slot {i} woken while still queued");
            }
        }
    }

    // Conservation: drop everything; every issued permit is back.
    for r in real {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(r)));
    }
    assert_eq!(
        sem.available_permits(),
        spec.issued,
        "permits lost or invented"
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_byte_strings_match_the_model() {
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        let runs = if cfg!(miri) { 30 } else { 3_000 };
        for _ in 0..runs {
            let len = rng.usize(1..200);
            let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            super::semaphore_ops(&data);
        }
    }
}
