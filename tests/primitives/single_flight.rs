//! SingleFlight: coalescing, hand-off on cancellation, panics, errors, the
//! TTL cache. Timing never decides an assertion: tests poll by hand, count
//! executions, or move a `ManualClock`.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use backpressure::Provenance;
use backpressure::{FlightError, ManualClock, SingleFlight};
use futures::channel::oneshot;

/// Counts wake-ups, so a test can assert who was woken.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Polled<F: Future> {
    fut: Pin<Box<F>>,
    wakes: Arc<CountingWaker>,
}

impl<F: Future> Polled<F> {
    fn new(fut: F) -> Self {
        Self {
            fut: Box::pin(fut),
            wakes: Arc::default(),
        }
    }

    fn poll(&mut self) -> Poll<F::Output> {
        let waker = Waker::from(self.wakes.clone());
        self.fut.as_mut().poll(&mut Context::from_waker(&waker))
    }

    fn woken(&self) -> usize {
        self.wakes.0.load(Ordering::SeqCst)
    }
}

/// Returns `Pending` once, waking itself first.
pub(crate) async fn yield_now() {
    let mut yielded = false;
    futures::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

type Out<V, E = std::convert::Infallible> = Result<(V, Provenance), FlightError<E>>;

fn ready<T>(p: Poll<T>) -> T {
    match p {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("expected Ready"),
    }
}

/// A work closure that counts how often it starts and then waits for a
/// value sent through the returned sender.
fn gated(
    starts: &Arc<AtomicUsize>,
) -> (
    oneshot::Sender<u32>,
    impl FnOnce() -> Pin<Box<dyn Future<Output = u32> + Send>> + use<>,
) {
    let (tx, rx) = oneshot::channel();
    let starts = starts.clone();
    let make = move || -> Pin<Box<dyn Future<Output = u32> + Send>> {
        starts.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { rx.await.unwrap_or(0) })
    };
    (tx, make)
}

#[test]
fn run_future_and_map_are_send_and_sync() {
    fn send<T: Send>(_: &T) {}
    fn sync<T: Sync>(_: &T) {}
    let flights = SingleFlight::<String, Arc<str>, std::io::Error>::new();
    sync(&flights);
    send(&flights);
    let fut = flights.run("k".into(), || async { Arc::from("v") });
    send(&fut);
    sync(&fut);
}

#[test]
fn concurrent_identical_calls_execute_once_and_share_the_value() {
    let flights = SingleFlight::<u32, Arc<String>>::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let (tx, make) = gated(&starts);
    let mut leader =
        Polled::new(flights.run(
            7,
            move || async move { Arc::new(format!("v{}", make().await)) },
        ));
    assert!(leader.poll().is_pending());
    let mut followers: Vec<_> = (0..16)
        .map(|_| {
            let starts = starts.clone();
            Polled::new(flights.run(7, move || async move {
                starts.fetch_add(1, Ordering::SeqCst);
                Arc::new("follower".to_string())
            }))
        })
        .collect();
    for f in &mut followers {
        assert!(f.poll().is_pending());
    }
    assert_eq!(flights.len(), 1);
    tx.send(1).unwrap();
    assert_eq!(leader.woken(), 1);
    let (lv, how) = ready(leader.poll()).unwrap();
    assert_eq!((lv.as_str(), how), ("v1", Provenance::Leader));
    for f in &mut followers {
        assert_eq!(f.woken(), 1, "every follower is woken once");
        let (v, how) = ready(f.poll()).unwrap();
        assert_eq!(how, Provenance::Joined);
        assert!(Arc::ptr_eq(&v, &lv), "followers get clones of the value");
    }
    assert_eq!(starts.load(Ordering::SeqCst), 1, "one execution");
    assert!(flights.is_empty(), "the entry goes with the flight");
}

#[test]
fn futures_executor_join_all_runs_once() {
    let flights = SingleFlight::<&str, usize>::new();
    let runs = AtomicUsize::new(0);
    let calls = (0..50).map(|_| {
        flights.run("refund", || async {
            runs.fetch_add(1, Ordering::SeqCst);
            // Yield so the others poll while the leader is in flight.
            yield_now().await;
            99
        })
    });
    let outs = futures::executor::block_on(futures::future::join_all(calls));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let leaders = outs
        .iter()
        .filter(|o| matches!(o, Ok((99, Provenance::Leader))))
        .count();
    let joined = outs
        .iter()
        .filter(|o| matches!(o, Ok((99, Provenance::Joined))))
        .count();
    assert_eq!((leaders, joined), (1, 49));
}

#[test]
fn tokio_multi_thread_many_tasks_one_execution_per_round() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async {
        let flights = Arc::new(SingleFlight::<u32, u64>::new());
        for round in 0..20u32 {
            let runs = Arc::new(AtomicUsize::new(0));
            let gate = Arc::new(tokio::sync::Barrier::new(9));
            let mut tasks = Vec::new();
            for _ in 0..8 {
                let (flights, runs, gate) = (flights.clone(), runs.clone(), gate.clone());
                tasks.push(tokio::spawn(async move {
                    let fut = flights.run(round, || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        u64::from(round) * 10
                    });
                    let mut fut = std::pin::pin!(fut);
                    // Claim or join before the barrier; finish after it.
                    let first = futures::poll!(fut.as_mut());
                    gate.wait().await;
                    match first {
                        Poll::Ready(out) => out,
                        Poll::Pending => fut.await,
                    }
                }));
            }
            gate.wait().await;
            let mut leaders = 0;
            for t in tasks {
                let (v, how) = t.await.unwrap().unwrap();
                assert_eq!(v, u64::from(round) * 10);
                leaders += usize::from(how == Provenance::Leader);
            }
            // Everyone claimed or joined before anyone finished: one run.
            assert_eq!(runs.load(Ordering::SeqCst), 1, "round {round}");
            assert_eq!(leaders, 1);
        }
        assert!(flights.is_empty());
    });
}

#[test]
fn leader_dropped_before_first_poll_claims_nothing() {
    let flights = SingleFlight::<u8, u8>::new();
    let leader = flights.run(1, || async { unreachable!("never polled") });
    drop(leader);
    assert!(flights.is_empty());
    let out = futures::executor::block_on(flights.run(1, || async { 3 }));
    assert_eq!(out.unwrap(), (3, Provenance::Leader));
}

#[test]
fn leader_dropped_with_no_followers_frees_the_key() {
    let flights = SingleFlight::<u8, u32>::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let (_tx, make) = gated(&starts);
    let mut leader = Polled::new(flights.run(1, make));
    assert!(leader.poll().is_pending());
    assert_eq!(flights.len(), 1);
    drop(leader);
    assert!(flights.is_empty(), "an abandoned entry does not leak");
}

#[test]
fn leader_dropped_mid_flight_promotes_exactly_one_follower() {
    let flights = SingleFlight::<u8, u32>::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let (_tx0, make0) = gated(&starts);
    let mut leader = Polled::new(flights.run(1, make0));
    assert!(leader.poll().is_pending());

    let mut senders = Vec::new();
    let mut followers = Vec::new();
    for _ in 0..3 {
        let (tx, make) = gated(&starts);
        senders.push(tx);
        let mut f = Polled::new(flights.run(1, make));
        assert!(f.poll().is_pending());
        followers.push(f);
    }
    assert_eq!(starts.load(Ordering::SeqCst), 1);

    drop(leader);
    let woken: Vec<_> = followers.iter().map(Polled::woken).collect();
    assert_eq!(
        woken,
        [1, 0, 0],
        "the oldest follower, and only it, is woken"
    );
    assert!(followers[0].poll().is_pending(), "it now runs its own work");
    assert_eq!(
        starts.load(Ordering::SeqCst),
        2,
        "exactly one new execution"
    );
    assert!(followers[1].poll().is_pending());
    assert!(followers[2].poll().is_pending());
    assert_eq!(starts.load(Ordering::SeqCst), 2);

    senders.remove(0).send(5).unwrap();
    assert_eq!(ready(followers[0].poll()).unwrap(), (5, Provenance::Leader));
    for f in &mut followers[1..] {
        assert_eq!(f.woken(), 1);
        assert_eq!(ready(f.poll()).unwrap(), (5, Provenance::Joined));
    }
    assert!(flights.is_empty());
}

#[test]
fn promoted_follower_dropped_before_it_runs_promotes_the_next() {
    let flights = SingleFlight::<u8, u32>::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let (_tx0, make0) = gated(&starts);
    let mut leader = Polled::new(flights.run(1, make0));
    assert!(leader.poll().is_pending());
    let (_tx1, make1) = gated(&starts);
    let (tx2, make2) = gated(&starts);
    let mut f1 = Polled::new(flights.run(1, make1));
    let mut f2 = Polled::new(flights.run(1, make2));
    assert!(f1.poll().is_pending());
    assert!(f2.poll().is_pending());

    drop(leader);
    assert_eq!((f1.woken(), f2.woken()), (1, 0));
    drop(f1); // promoted, but never polled again: its work never starts
    assert_eq!(f2.woken(), 1);
    assert!(f2.poll().is_pending());
    assert_eq!(starts.load(Ordering::SeqCst), 2, "the first leader and f2");
    tx2.send(8).unwrap();
    assert_eq!(ready(f2.poll()).unwrap(), (8, Provenance::Leader));
    assert!(flights.is_empty());
}

#[test]
fn promoted_follower_dropped_mid_work_promotes_the_next() {
    let flights = SingleFlight::<u8, u32>::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let (_tx0, make0) = gated(&starts);
    let (_tx1, make1) = gated(&starts);
    let (tx2, make2) = gated(&starts);
    let mut leader = Polled::new(flights.run(1, make0));
    let mut f1 = Polled::new(flights.run(1, make1));
    let mut f2 = Polled::new(flights.run(1, make2));
    assert!(leader.poll().is_pending());
    assert!(f1.poll().is_pending());
    assert!(f2.poll().is_pending());
    drop(leader);
    assert!(f1.poll().is_pending()); // leads now
    assert_eq!(f2.woken(), 0);
    drop(f1);
    assert_eq!(f2.woken(), 1);
    assert!(f2.poll().is_pending());
    assert_eq!(starts.load(Ordering::SeqCst), 3);
    tx2.send(2).unwrap();
    assert_eq!(ready(f2.poll()).unwrap(), (2, Provenance::Leader));
    assert!(flights.is_empty());
}

#[test]
fn follower_dropped_leaves_the_others_alone() {
    let flights = SingleFlight::<u8, u32>::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let (tx, make) = gated(&starts);
    let mut leader = Polled::new(flights.run(1, make));
    assert!(leader.poll().is_pending());
    let mut a = Polled::new(flights.run(1, || async { 0 }));
    let mut b = Polled::new(flights.run(1, || async { 0 }));
    assert!(a.poll().is_pending());
    assert!(b.poll().is_pending());
    drop(a);
    tx.send(4).unwrap();
    assert_eq!(ready(leader.poll()).unwrap(), (4, Provenance::Leader));
    assert_eq!(ready(b.poll()).unwrap(), (4, Provenance::Joined));
    assert_eq!(starts.load(Ordering::SeqCst), 1);
}

#[test]
fn repolled_follower_is_woken_through_its_newest_waker() {
    let flights = SingleFlight::<u8, u32>::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let (tx, make) = gated(&starts);
    let mut leader = Polled::new(flights.run(1, make));
    assert!(leader.poll().is_pending());
    let mut f = Polled::new(flights.run(1, || async { 0 }));
    assert!(f.poll().is_pending());
    let old = f.wakes.clone();
    f.wakes = Arc::default();
    assert!(f.poll().is_pending());
    tx.send(1).unwrap();
    assert_eq!(ready(leader.poll()).unwrap().0, 1);
    assert_eq!((old.0.load(Ordering::SeqCst), f.woken()), (0, 1));
    assert_eq!(ready(f.poll()).unwrap(), (1, Provenance::Joined));
}

#[test]
fn leader_panic_releases_followers_with_leader_panicked() {
    let flights = SingleFlight::<u8, u32>::new();
    let (tx, rx) = oneshot::channel::<()>();
    let mut leader = Polled::new(flights.run(1, || async move {
        rx.await.unwrap();
        panic!("boom");
    }));
    assert!(leader.poll().is_pending());
    let runs = AtomicUsize::new(0);
    let mut followers: Vec<_> = (0..3)
        .map(|_| {
            Polled::new(flights.run(1, || async {
                runs.fetch_add(1, Ordering::SeqCst);
                0
            }))
        })
        .collect();
    for f in &mut followers {
        assert!(f.poll().is_pending());
    }
    tx.send(()).unwrap();
    let caught = panic::catch_unwind(AssertUnwindSafe(|| leader.poll()));
    let payload = caught.expect_err("the panic propagates in the leader's task");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
    drop(leader);
    for f in &mut followers {
        assert_eq!(f.woken(), 1);
        let err = ready(f.poll()).unwrap_err();
        assert!(err.is_leader_panicked());
        assert_eq!(err.to_string(), "single-flight leader panicked");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no herd re-run");
    assert!(flights.is_empty(), "the key is freed");
    let fresh = futures::executor::block_on(flights.run(1, || async { 6 }));
    assert_eq!(fresh.unwrap(), (6, Provenance::Leader));
}

#[test]
fn panic_in_make_is_a_leader_panic() {
    let flights = SingleFlight::<u8, u32>::new();
    let caught = panic::catch_unwind(AssertUnwindSafe(|| {
        futures::executor::block_on(
            flights.run(1, || -> std::future::Ready<u32> { panic!("make") }),
        )
    }));
    assert!(caught.is_err());
    assert!(flights.is_empty());
}

#[test]
fn panic_while_cloning_the_value_releases_followers() {
    #[derive(Debug)]
    struct Fragile(#[allow(dead_code)] u32);
    impl Clone for Fragile {
        fn clone(&self) -> Self {
            panic!("clone")
        }
    }
    let flights = SingleFlight::<u8, Fragile>::new();
    let (tx, rx) = oneshot::channel::<()>();
    let mut leader = Polled::new(flights.run(1, || async move {
        rx.await.unwrap();
        Fragile(1)
    }));
    assert!(leader.poll().is_pending());
    let mut f = Polled::new(flights.run(1, || async { Fragile(2) }));
    assert!(f.poll().is_pending());
    tx.send(()).unwrap();
    assert!(panic::catch_unwind(AssertUnwindSafe(|| leader.poll())).is_err());
    assert!(ready(f.poll()).unwrap_err().is_leader_panicked());
    assert!(flights.is_empty());
}

#[test]
fn errors_are_shared_as_one_arc_and_never_cached() {
    let clock = ManualClock::new();
    let flights: SingleFlight<u8, u32, String, ManualClock> = SingleFlight::builder()
        .cache(Duration::from_secs(3), 16)
        .clock(clock)
        .build();
    let (tx, rx) = oneshot::channel::<()>();
    let mut leader = Polled::new(flights.try_run(1, || async move {
        rx.await.unwrap();
        Err("503".to_string())
    }));
    assert!(leader.poll().is_pending());
    let mut f = Polled::new(flights.try_run(1, || async { Ok(0) }));
    let mut g = Polled::new(flights.run(1, || async { 0 }));
    assert!(f.poll().is_pending());
    assert!(g.poll().is_pending());
    tx.send(()).unwrap();
    let le: Out<u32, String> = ready(leader.poll());
    let (le, fe, ge) = (
        le.unwrap_err(),
        ready(f.poll()).unwrap_err(),
        ready(g.poll()).unwrap_err(),
    );
    assert_eq!(le.failed().unwrap().as_str(), "503");
    assert!(Arc::ptr_eq(le.failed().unwrap(), fe.failed().unwrap()));
    assert!(Arc::ptr_eq(le.failed().unwrap(), ge.failed().unwrap()));
    assert!(flights.is_empty(), "errors are not cached");
    let again = futures::executor::block_on(flights.try_run(1, || async { Ok(1) }));
    assert_eq!(again.unwrap(), (1, Provenance::Leader));
}

#[test]
fn forget_during_flight_starts_a_new_flight_that_the_old_one_never_removes() {
    let flights = SingleFlight::<u8, u32>::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let (tx_old, make_old) = gated(&starts);
    let mut old = Polled::new(flights.run(1, make_old));
    assert!(old.poll().is_pending());
    let mut old_follower = Polled::new(flights.run(1, || async { 0 }));
    assert!(old_follower.poll().is_pending());

    assert!(flights.forget(&1));
    assert!(flights.is_empty());

    let (tx_new, make_new) = gated(&starts);
    let mut new = Polled::new(flights.run(1, make_new));
    assert!(new.poll().is_pending());
    assert_eq!(
        starts.load(Ordering::SeqCst),
        2,
        "forget lets a new call run"
    );
    let mut new_follower = Polled::new(flights.run(1, || async { 0 }));
    assert!(new_follower.poll().is_pending());

    tx_old.send(10).unwrap();
    assert_eq!(ready(old.poll()).unwrap(), (10, Provenance::Leader));
    assert_eq!(
        ready(old_follower.poll()).unwrap(),
        (10, Provenance::Joined)
    );
    assert_eq!(
        flights.len(),
        1,
        "the old flight did not remove the new one"
    );
    assert_eq!(new_follower.woken(), 0);

    tx_new.send(20).unwrap();
    assert_eq!(ready(new.poll()).unwrap(), (20, Provenance::Leader));
    assert_eq!(
        ready(new_follower.poll()).unwrap(),
        (20, Provenance::Joined)
    );
    assert!(flights.is_empty());
}

#[test]
fn forgotten_leader_cancelled_still_hands_off() {
    let flights = SingleFlight::<u8, u32>::new();
    let starts = Arc::new(AtomicUsize::new(0));
    let (_tx0, make0) = gated(&starts);
    let (tx1, make1) = gated(&starts);
    let mut leader = Polled::new(flights.run(1, make0));
    let mut f = Polled::new(flights.run(1, make1));
    assert!(leader.poll().is_pending());
    assert!(f.poll().is_pending());
    flights.forget(&1);
    drop(leader);
    assert!(f.poll().is_pending());
    tx1.send(3).unwrap();
    assert_eq!(ready(f.poll()).unwrap(), (3, Provenance::Leader));
    assert!(
        flights.is_empty(),
        "a forgotten flight is not cached or re-added"
    );
}

fn cached_map(
    ttl_secs: u64,
    max: usize,
) -> (
    SingleFlight<u32, u32, std::convert::Infallible, ManualClock>,
    ManualClock,
) {
    let clock = ManualClock::new();
    let flights = SingleFlight::builder()
        .shards(1)
        .cache(Duration::from_secs(ttl_secs), max)
        .clock(clock.clone())
        .build();
    (flights, clock)
}

fn run_now(
    flights: &SingleFlight<u32, u32, std::convert::Infallible, ManualClock>,
    key: u32,
    value: u32,
) -> (u32, Provenance) {
    futures::executor::block_on(flights.run(key, || async move { value })).unwrap()
}

#[test]
fn ttl_cache_serves_until_expiry_on_the_manual_clock() {
    let (flights, clock) = cached_map(3, 100);
    assert_eq!(run_now(&flights, 1, 10), (10, Provenance::Leader));
    clock.advance(Duration::from_millis(2_999));
    assert_eq!(run_now(&flights, 1, 11), (10, Provenance::Cached));
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        run_now(&flights, 1, 12),
        (12, Provenance::Leader),
        "expired at exactly the TTL"
    );
    assert_eq!(run_now(&flights, 1, 13), (12, Provenance::Cached));
    assert_eq!(flights.len(), 1);
}

/// cargo-mutants: the count of cached entries was not decremented when an
/// expired entry is run again, and no test noticed. A full cache that
/// re-runs one expired key keeps its other entries: the count stays at
/// the capacity, and nothing live is evicted.
#[test]
fn re_running_an_expired_entry_evicts_nothing_live() {
    let (flights, clock) = cached_map(3, 2);
    assert_eq!(run_now(&flights, 1, 10), (10, Provenance::Leader));
    clock.advance(Duration::from_secs(2));
    assert_eq!(run_now(&flights, 2, 20), (20, Provenance::Leader));
    clock.advance(Duration::from_secs(1)); // 1 expires, 2 does not
    assert_eq!(run_now(&flights, 1, 11), (11, Provenance::Leader));
    assert_eq!(run_now(&flights, 2, 0), (20, Provenance::Cached), "2 kept");
    assert_eq!(run_now(&flights, 1, 0), (11, Provenance::Cached), "1 kept");
    assert_eq!(flights.len(), 2);
}

#[test]
fn followers_of_a_cached_flight_get_the_value_and_later_calls_hit() {
    let (flights, _clock) = cached_map(3, 100);
    let starts = Arc::new(AtomicUsize::new(0));
    let (tx, make) = gated(&starts);
    let mut leader = Polled::new(flights.run(1, make));
    let mut f = Polled::new(flights.run(1, || async { 0 }));
    assert!(leader.poll().is_pending());
    assert!(f.poll().is_pending());
    tx.send(9).unwrap();
    assert_eq!(ready(leader.poll()).unwrap(), (9, Provenance::Leader));
    assert_eq!(ready(f.poll()).unwrap(), (9, Provenance::Joined));
    assert_eq!(run_now(&flights, 1, 0), (9, Provenance::Cached));
}

#[test]
fn clear_and_invalidate_drop_cached_values_only() {
    let (flights, _clock) = cached_map(60, 100);
    for k in 0..5 {
        run_now(&flights, k, k);
    }
    let starts = Arc::new(AtomicUsize::new(0));
    let (tx, make) = gated(&starts);
    let mut inflight = Polled::new(flights.run(100, make));
    assert!(inflight.poll().is_pending());
    assert_eq!(flights.len(), 6);

    assert!(flights.invalidate(&0));
    assert!(!flights.invalidate(&0));
    assert!(!flights.invalidate(&100), "invalidate leaves flights alone");
    assert_eq!(run_now(&flights, 0, 50), (50, Provenance::Leader));
    flights.clear();
    assert_eq!(flights.len(), 1, "the flight survives clear");
    assert_eq!(run_now(&flights, 1, 51), (51, Provenance::Leader));
    tx.send(7).unwrap();
    assert_eq!(ready(inflight.poll()).unwrap(), (7, Provenance::Leader));
    assert_eq!(
        run_now(&flights, 100, 8),
        (8, Provenance::Leader),
        "a flight invalidated and cleared while running is not cached"
    );
    assert_eq!(run_now(&flights, 100, 0), (8, Provenance::Cached));
}

#[test]
fn cache_is_bounded_and_evicts_the_oldest() {
    let (flights, clock) = cached_map(60, 3);
    for k in 0..5 {
        run_now(&flights, k, k);
        clock.advance(Duration::from_millis(1));
    }
    assert_eq!(flights.len(), 3);
    assert_eq!(run_now(&flights, 4, 0), (4, Provenance::Cached));
    assert_eq!(run_now(&flights, 2, 0), (2, Provenance::Cached));
    assert_eq!(
        run_now(&flights, 0, 100),
        (100, Provenance::Leader),
        "oldest evicted"
    );
}

#[test]
fn expired_entries_are_reclaimed_by_later_inserts() {
    let (flights, clock) = cached_map(1, 1_000);
    for k in 0..10 {
        run_now(&flights, k, k);
    }
    assert_eq!(flights.len(), 10);
    clock.advance(Duration::from_secs(2));
    run_now(&flights, 1_000, 0);
    assert_eq!(
        flights.len(),
        1,
        "the ten expired entries went with one insert"
    );
}

#[test]
fn zero_ttl_disables_the_cache() {
    let (flights, _clock) = cached_map(0, 10);
    run_now(&flights, 1, 1);
    assert_eq!(run_now(&flights, 1, 2), (2, Provenance::Leader));
    assert!(flights.is_empty());
}

#[test]
fn distinct_keys_do_not_coalesce_across_shards() {
    let flights = SingleFlight::<u32, u32>::builder().shards(4).build();
    let runs = AtomicUsize::new(0);
    let calls = (0..200u32).map(|k| {
        let runs = &runs;
        flights.run(k, move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            k
        })
    });
    let outs = futures::executor::block_on(futures::future::join_all(calls));
    assert_eq!(runs.load(Ordering::SeqCst), 200);
    for (k, o) in outs.into_iter().enumerate() {
        assert_eq!(o.unwrap(), (k as u32, Provenance::Leader));
    }
}

// Issue #10, item 8: `2 * capacity + RECLAIM_BUDGET` overflowed for an
// "unbounded" cache (`max_entries` near `usize::MAX`) on one or two shards.
// In debug builds the first completion panicked after its entry had become
// `Cached`: the flight was published `PANICKED`, the value leaked, and every
// later call for the key within the TTL hit an `unreachable!`.
#[test]
fn cache_bound_overflow_with_unbounded_max_entries_does_not_panic_or_poison_the_key() {
    for shards in [1, 2] {
        let clock = ManualClock::new();
        let flights: SingleFlight<u32, u32, std::convert::Infallible, ManualClock> =
            SingleFlight::builder()
                .shards(shards)
                .cache(Duration::from_secs(60), usize::MAX)
                .clock(clock.clone())
                .build();
        let starts = Arc::new(AtomicUsize::new(0));
        let (tx, make) = gated(&starts);
        let mut leader = Polled::new(flights.run(1, make));
        let mut follower = Polled::new(flights.run(1, || async { 0 }));
        assert!(leader.poll().is_pending());
        assert!(follower.poll().is_pending());
        tx.send(9).unwrap();
        assert_eq!(ready(leader.poll()).unwrap(), (9, Provenance::Leader));
        assert_eq!(follower.woken(), 1);
        assert_eq!(ready(follower.poll()).unwrap(), (9, Provenance::Joined));
        for _ in 0..3 {
            let hit = futures::executor::block_on(flights.run(1, || async { 1 }));
            assert_eq!(hit.unwrap(), (9, Provenance::Cached), "{shards} shard(s)");
        }
        for k in 2..100 {
            let out = futures::executor::block_on(flights.run(k, move || async move { k }));
            assert_eq!(out.unwrap(), (k, Provenance::Leader));
        }
        assert_eq!(flights.len(), 99, "nothing evicted from an unbounded cache");
        assert_eq!(starts.load(Ordering::SeqCst), 1);
    }
}

// Issue #10, item 8 (audit): the expiry instant `now + ttl` saturates, so
// a huge TTL on a clock far from its origin neither panics nor wraps to an
// instant in the past (which would expire every value at once). Guards the
// `saturating_add` in `complete` and `saturating_nanos` in the builder.
#[test]
fn cache_expiry_overflow_with_huge_ttl_saturates_to_never() {
    let clock = ManualClock::starting_at(u64::MAX - 10);
    let flights: SingleFlight<u32, u32, std::convert::Infallible, ManualClock> =
        SingleFlight::builder()
            .shards(1)
            .cache(Duration::MAX, 100)
            .clock(clock.clone())
            .build();
    assert_eq!(
        futures::executor::block_on(flights.run(1, || async { 5 })).unwrap(),
        (5, Provenance::Leader)
    );
    clock.advance(Duration::from_nanos(5));
    assert_eq!(
        futures::executor::block_on(flights.run(1, || async { 6 })).unwrap(),
        (5, Provenance::Cached)
    );
}

// Issue #10, item 9: a flight that began before `invalidate`/`clear` of its
// key finished after it, and its (stale) value was cached for a whole TTL.
#[test]
fn invalidate_or_clear_during_flight_does_not_cache_the_stale_value() {
    for clear in [false, true] {
        let (flights, clock) = cached_map(10, 100);
        let starts = Arc::new(AtomicUsize::new(0));
        let (tx, make) = gated(&starts);
        let mut leader = Polled::new(flights.run(1, make));
        let mut early = Polled::new(flights.run(1, || async { 0 }));
        assert!(leader.poll().is_pending());
        assert!(early.poll().is_pending());
        if clear {
            flights.clear();
        } else {
            assert!(!flights.invalidate(&1), "no cached value to drop");
        }
        // A call after the invalidation still joins the running flight.
        let mut late = Polled::new(flights.run(1, || async { 0 }));
        assert!(late.poll().is_pending());
        tx.send(7).unwrap();
        assert_eq!(ready(leader.poll()).unwrap(), (7, Provenance::Leader));
        assert_eq!(ready(early.poll()).unwrap(), (7, Provenance::Joined));
        assert_eq!(ready(late.poll()).unwrap(), (7, Provenance::Joined));
        assert!(flights.is_empty(), "the stale flight left no entry");
        clock.advance(Duration::from_secs(9));
        assert_eq!(
            run_now(&flights, 1, 8),
            (8, Provenance::Leader),
            "clear: {clear}: the stale value is not served from the cache"
        );
        // A flight begun after the invalidation is cached as usual.
        assert_eq!(run_now(&flights, 1, 9), (8, Provenance::Cached));
        assert_eq!(starts.load(Ordering::SeqCst), 1);
    }
}

/// Panics on its first wake; counts the wakes after that.
#[derive(Default)]
struct PanickyWaker {
    wakes: AtomicUsize,
}

impl Wake for PanickyWaker {
    fn wake(self: Arc<Self>) {
        if self.wakes.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("the waker panicked");
        }
    }
}

// Issue #10, item 13: publishing woke the followers in a loop; a waker that
// panicked dropped the rest of its batch unwoken and left the followers of
// later batches linked to a finished flight, asleep for good.
#[test]
fn panicking_waker_does_not_strand_the_other_followers() {
    // More than one wake batch (32), with the panicking waker first.
    const FOLLOWERS: usize = 40;
    for panicker in [0, 31, 32, FOLLOWERS - 1] {
        // A manual clock keeps the test runnable under miri.
        let flights: SingleFlight<u32, u32, std::convert::Infallible, ManualClock> =
            SingleFlight::builder().clock(ManualClock::new()).build();
        let starts = Arc::new(AtomicUsize::new(0));
        let (tx, make) = gated(&starts);
        let mut leader = Polled::new(flights.run(1, make));
        assert!(leader.poll().is_pending());
        let mut followers: Vec<_> = (0..FOLLOWERS)
            .map(|_| Polled::new(flights.run(1, || async { 0 })))
            .collect();
        let panicky = Arc::new(PanickyWaker::default());
        for (i, f) in followers.iter_mut().enumerate() {
            let pending = if i == panicker {
                let waker = Waker::from(panicky.clone());
                f.fut
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            } else {
                f.poll().is_pending()
            };
            assert!(pending);
        }
        tx.send(5).unwrap();
        let hook = panic::take_hook();
        panic::set_hook(Box::new(|_| {}));
        let leader_poll = panic::catch_unwind(AssertUnwindSafe(|| leader.poll()));
        panic::set_hook(hook);
        let payload = leader_poll.expect_err("the waker's panic reaches the leader's poll");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"the waker panicked"));
        assert_eq!(panicky.wakes.load(Ordering::SeqCst), 1, "woken once");
        for (i, f) in followers.iter_mut().enumerate() {
            if i != panicker {
                assert_eq!(f.woken(), 1, "panicker {panicker}: follower {i} woken");
            }
            assert_eq!(
                ready(f.poll()).unwrap(),
                (5, Provenance::Joined),
                "panicker {panicker}: follower {i}"
            );
        }
        assert!(flights.is_empty());
        assert_eq!(starts.load(Ordering::SeqCst), 1);
    }
}

/// A clock whose precise reading can be made to "take" `jump` ns: the
/// next `now_nanos` returns the time and then moves it on (a thread
/// descheduled right after reading). Its coarse time is the same time.
#[derive(Debug)]
struct Jumpy {
    t: Arc<std::sync::atomic::AtomicU64>,
    jump: Arc<std::sync::atomic::AtomicU64>,
}

impl backpressure::Clock for Jumpy {
    fn now_nanos(&self) -> u64 {
        let jump = self.jump.swap(0, Ordering::SeqCst);
        self.t.fetch_add(jump, Ordering::SeqCst)
    }
    fn coarse_bounds(&self) -> Option<(u64, u64)> {
        let t = self.t.load(Ordering::SeqCst);
        Some((t, t))
    }
}

/// `complete` read the precise clock before the coarse one: a leader
/// descheduled between the two stamped a coarse expiry later than the
/// entry's own, and coarse hits served it past its TTL.
#[test]
fn a_leader_descheduled_while_stamping_never_serves_past_the_ttl() {
    const MS: u64 = 1_000_000;
    let t = Arc::new(std::sync::atomic::AtomicU64::new(1_000 * MS));
    let jump = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let clock = Jumpy {
        t: t.clone(),
        jump: jump.clone(),
    };
    let flights: SingleFlight<u32, u32, (), Jumpy> = SingleFlight::builder()
        .clock(clock)
        .cache(Duration::from_millis(50), 16)
        .build();
    let runs = AtomicUsize::new(0);
    let run = || {
        futures::executor::block_on(flights.try_run(1, || async {
            runs.fetch_add(1, Ordering::SeqCst);
            // The stamp's clock read is the next one: 25 ms pass there.
            jump.store(25 * MS, Ordering::SeqCst);
            Ok(7)
        }))
        .unwrap()
    };
    let start = t.load(Ordering::SeqCst);
    assert_eq!(run().1, Provenance::Leader);
    // Past the TTL counted from when the value was ready.
    t.store(start + 60 * MS, Ordering::SeqCst);
    let (_, provenance) = run();
    assert_eq!(
        provenance,
        Provenance::Leader,
        "served 60 ms into a 50 ms TTL"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A clock with a coarse time of its own, both moved by hand.
#[derive(Debug, Clone)]
struct TwoClocks {
    precise: ManualClock,
    coarse: ManualClock,
    lag: u64,
}

impl backpressure::Clock for TwoClocks {
    fn now_nanos(&self) -> u64 {
        self.precise.now_nanos()
    }
    fn coarse_bounds(&self) -> Option<(u64, u64)> {
        let t = self.coarse.now_nanos();
        Some((t, t + self.lag))
    }
}

/// A hit far from expiry is served on the coarse time, one near it is
/// rechecked; none outlives its TTL.
#[test]
fn a_cache_hit_uses_the_coarse_time_and_never_outlives_the_ttl() {
    use backpressure::Clock as _;
    let clocks = TwoClocks {
        precise: ManualClock::new(),
        coarse: ManualClock::new(),
        lag: 10,
    };
    let m: SingleFlight<u32, u32, std::convert::Infallible, TwoClocks> = SingleFlight::builder()
        .shards(1)
        .cache(Duration::from_nanos(1_024_000), 4)
        .clock(clocks.clone())
        .build();
    let get = |v| futures::executor::block_on(m.run(1, move || async move { v })).unwrap();
    assert_eq!(get(1).0, 1);
    clocks.precise.set(2_000_000);
    clocks.coarse.set(500_000);
    assert_eq!(get(2), (1, Provenance::Cached));
    clocks.coarse.set(1_022_995);
    assert_eq!(get(3), (3, Provenance::Leader));
    clocks.coarse.set(1_022_995 + 1_022_995);
    clocks.precise.set(2_000_000 + 1_000_000);
    assert_eq!(get(4), (3, Provenance::Cached));
    clocks.precise.set(2_000_000 + 1_024_000);
    assert_eq!(get(5), (5, Provenance::Leader));
    assert!(clocks.precise.now_nanos() > 0);
}
