//! Scoped: per-key buckets, per-key quotas, eviction of idle keys, the key
//! cap, and the memory an idle key costs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::num::NonZeroU32;
use std::time::Duration;

use backpressure::{CheckError, ManualClock, Quota, ReserveError, Scoped};

/// Counts live heap bytes and allocations, per thread (tests run in
/// parallel), to measure what a key costs.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn live() -> isize {
    LIVE.with(Cell::get)
}

fn allocs() -> usize {
    ALLOCS.with(Cell::get)
}

// SAFETY: forwards to the system allocator unchanged; only counts (in
// const-initialized thread locals without destructors, which never
// allocate).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|l| l.set(l.get() + layout.size() as isize));
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
        // SAFETY: the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|l| l.set(l.get() - layout.size() as isize));
        // SAFETY: the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

fn registry() -> (Scoped<(u32, u32), ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let q = Quota::per_second(nz(10)).allow_burst(nz(2));
    (Scoped::with_clock(q, clock.clone()), clock)
}

#[test]
fn keys_are_limited_independently() {
    let (s, clock) = registry();
    for key in 0..100 {
        assert_eq!(s.try_acquire(&(key, 0), 2), Ok(()));
        assert!(s.try_acquire(&(key, 0), 1).is_err());
    }
    assert_eq!(s.len(), 100);
    clock.advance(Duration::from_millis(100));
    for key in 0..100 {
        assert_eq!(s.try_acquire(&(key, 0), 1), Ok(()));
        assert_eq!(
            s.try_acquire(&(key, 0), 1),
            Err(CheckError::NotUntil {
                wait: Duration::from_millis(100)
            })
        );
    }
}

#[test]
fn per_key_quota_with_a_default() {
    let (s, _) = registry();
    s.set_quota(&(1, 1), Quota::per_second(nz(100))).unwrap();
    assert_eq!(s.available(&(1, 1)), 100);
    assert_eq!(s.available(&(2, 2)), 2);
    assert!(s.try_acquire(&(1, 1), 50).is_ok());
    assert_eq!(
        s.try_acquire(&(2, 2), 3),
        Err(CheckError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        })
    );
    // A live bucket converts; the debt stays.
    s.set_quota(&(1, 1), Quota::per_second(nz(100)).allow_burst(nz(60)))
        .unwrap();
    assert!(s.available(&(1, 1)) <= 50);
}

#[test]
fn idle_full_keys_are_evicted_and_keep_their_quota() {
    let (s, clock) = registry();
    s.set_quota(&(7, 7), Quota::per_second(nz(1)).allow_burst(nz(5)))
        .unwrap();
    for key in 0..1000 {
        s.try_acquire(&(key, 0), 1).unwrap();
    }
    s.try_acquire(&(7, 7), 5).unwrap();
    assert_eq!(s.len(), 1001);
    // Not full yet, and used within the grace period: nothing may go.
    assert_eq!(s.sweep(), 0);
    clock.advance(Duration::from_secs(1));
    // Full again, but used since the last sweep: the sweep only clears
    // their second-chance bits.
    assert_eq!(s.sweep(), 0);
    clock.advance(Duration::from_secs(1));
    // Idle for a whole grace period: all default keys go, (7, 7) (still in
    // debt) stays.
    assert_eq!(s.sweep(), 1000);
    assert_eq!(s.len(), 1);
    assert_eq!(s.available(&(7, 7)), 2);
    clock.advance(Duration::from_secs(3));
    assert_eq!(s.sweep(), 1);
    // Its quota outlives its bucket.
    assert_eq!(s.available(&(7, 7)), 5);
    assert!(s.try_acquire(&(7, 7), 5).is_ok());
}

#[test]
fn inserts_sweep_on_their_own() {
    // One-off keys, each idle again after 100 ms: the registry stays small
    // without anyone calling `sweep`.
    let (s, clock) = registry();
    for round in 0..50u32 {
        for key in 0..200 {
            s.try_acquire(&(round, key), 1).unwrap();
        }
        clock.advance(Duration::from_millis(100));
    }
    assert!(s.len() <= 2 * 200 + 64 * 256, "len {}", s.len());
    assert!(
        s.len() < 50 * 200 / 2,
        "idle keys were not evicted: {}",
        s.len()
    );
}

#[test]
fn the_key_cap_refuses_new_keys_but_never_evicts_debt() {
    let (s, clock) = registry();
    let s = s.with_max_keys(1);
    // Every shard holds at most 1 key; find two keys in one shard by
    // filling until refused.
    let mut admitted = 0;
    let mut refused = None;
    for key in 0..10_000 {
        match s.try_acquire(&(key, 0), 2) {
            Ok(()) => admitted += 1,
            Err(CheckError::TooManyKeys { limit }) => {
                assert_eq!(limit, 1);
                refused = Some(key);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let refused = refused.expect("the cap was never reached");
    assert!(admitted >= 1);
    assert!(matches!(
        s.reserve(&(refused, 0), 1, Duration::ZERO),
        Err(ReserveError::TooManyKeys { limit: 1 })
    ));
    assert!(s.penalize(&(refused, 0), Duration::from_secs(1)).is_err());
    // The holders are full again after 200 ms, but were used within the
    // grace period (1 s): the first sweep past it only clears their bits.
    clock.advance(Duration::from_secs(1));
    assert!(s.try_acquire(&(refused, 0), 1).is_err());
    // Idle for a whole grace period: the new key gets in.
    clock.advance(Duration::from_secs(1));
    assert!(s.try_acquire(&(refused, 0), 1).is_ok());
}

/// Issue #21, item 8: `with_max_keys(3)` tracked up to 8 keys (the cap
/// was per shard, `max_keys / shards` rounded up), and keys hashed to a
/// full shard were refused while others had room. The cap is a cap across
/// shards, and the last slot goes to whichever key asks first.
#[test]
fn scoped_max_keys_is_one_cap_across_shards() {
    let (s, clock) = registry();
    let s = s.with_max_keys(3);
    let mut admitted = Vec::new();
    for key in 0..1_000 {
        match s.try_acquire(&(key, 0), 2) {
            Ok(()) => admitted.push(key),
            Err(CheckError::TooManyKeys { limit: 3 }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    // Exactly the first three keys, wherever they hashed.
    assert_eq!(admitted, [0, 1, 2]);
    assert_eq!(s.len(), 3);
    // Idle for two grace periods: a newcomer gets in, on any shard, by
    // sweeping the others; the count stays at the cap.
    clock.advance(Duration::from_secs(2));
    s.sweep();
    clock.advance(Duration::from_secs(1));
    for key in 1_000..1_003 {
        assert!(s.try_acquire(&(key, 0), 1).is_ok(), "key {key} refused");
    }
    assert_eq!(s.len(), 3);
    assert!(matches!(
        s.try_acquire(&(2_000, 0), 1),
        Err(CheckError::TooManyKeys { limit: 3 })
    ));
}

#[test]
fn keyed_reservation_cancels() {
    let (s, _) = registry();
    s.try_acquire(&(1, 0), 2).unwrap();
    let r = s.reserve(&(1, 0), 1, Duration::from_secs(1)).unwrap();
    assert_eq!(r.wait(), Duration::from_millis(100));
    assert!(r.cancel());
    assert_eq!(
        s.try_acquire(&(1, 0), 1).unwrap_err().wait(),
        Some(Duration::from_millis(100))
    );
}

/// A key's bucket lives in its table slot until the key is first
/// reserved, then moves behind an `Arc` (a reservation must reach it after
/// the table has moved on). The move keeps everything: the debt, a penalty,
/// a per-key quota; checks after it see what the reservation took; and
/// the refund goes to the bucket the key still uses.
#[test]
fn a_bucket_moved_by_its_first_reservation_keeps_its_state() {
    let (s, clock) = registry();
    let k = (7, 7);
    s.set_quota(&k, Quota::per_second(nz(1)).allow_burst(nz(3)))
        .unwrap();
    s.try_acquire(&k, 2).unwrap();
    s.penalize(&k, Duration::from_millis(1500)).unwrap();
    // In the slot until now; the reservation moves it, and waits out the
    // penalty.
    let r = s.reserve(&k, 1, Duration::from_secs(5)).unwrap();
    assert_eq!(r.wait(), Duration::from_millis(1500));
    assert_eq!(s.available(&k), 0);
    // The checks go to the moved bucket: the reserved cell is taken there.
    clock.advance(Duration::from_millis(1500));
    assert_eq!(
        s.try_acquire(&k, 1).unwrap_err().wait(),
        Some(Duration::from_secs(1))
    );
    // And the refund reaches it.
    assert!(r.cancel());
    assert!(s.try_acquire(&k, 1).is_ok());
    assert!(s.try_acquire(&k, 1).is_err());
}

#[test]
fn bytes_per_idle_key() {
    // Measured, printed, and bounded so a regression shows.
    let (s, _) = registry();
    let s = s.with_max_keys(usize::MAX);
    let keys = 100_000u32;
    s.try_acquire(&(u32::MAX, 0), 1).unwrap();
    let before = live();
    for key in 0..keys {
        s.try_acquire(&(key, 1), 1).unwrap();
    }
    let bytes = (live() - before) as f64 / keys as f64;
    println!("bytes per idle key ((u32, u32) key): {bytes:.1}");
    // key 8 + Arc pointer 8 + control byte + table slack, plus the Arc
    // allocation (16 + 24).
    assert!(bytes < 160.0, "{bytes} bytes per key");
}

/// Issue #10, item 11b: `Scoped::set_quota` stored a quota for every key
/// it was given, ignoring `max_keys` (a million keys under
/// `with_max_keys(10)` cost 32 MB). Keys with a quota of their own are now
/// capped at `max_keys`, and the rest are refused with `TooManyKeys`.
#[test]
fn scoped_set_quota_respects_max_keys() {
    let clock = ManualClock::new();
    let default = Quota::per_second(nz(10)).allow_burst(nz(2));
    let own = Quota::per_second(nz(100));
    let s: Scoped<u32, _> = Scoped::with_clock(default, clock).with_max_keys(10);
    let mut stored = 0;
    for key in 0..1_000_000u32 {
        match s.set_quota(&key, own) {
            Ok(()) => stored += 1,
            Err(e) => assert_eq!(e.limit, 10),
        }
    }
    assert_eq!(stored, 10);
    assert_eq!(s.custom_quotas(), 10);
    // The ten keep their quota; a refused key keeps the default.
    assert_eq!(s.available(&0), 100);
    assert_eq!(s.available(&999_999), 2);
    // Updating a key that has one is not a new key.
    s.set_quota(&3, Quota::per_second(nz(50))).unwrap();
    assert_eq!(s.custom_quotas(), 10);
    // Back to the default frees a place, and is never stored.
    s.set_quota(&3, default).unwrap();
    s.set_quota(&123_456, default).unwrap();
    assert_eq!(s.custom_quotas(), 9);
    assert_eq!(s.available(&3), 2);
    s.set_quota(&500_000, own).unwrap();
    assert!(s.set_quota(&500_001, own).is_err());
    assert_eq!(s.custom_quotas(), 10);
    // A refused quota leaves a live bucket as it was.
    s.try_acquire(&700_000, 1).unwrap();
    assert!(s.set_quota(&700_000, own).is_err());
    assert_eq!(s.available(&700_000), 1);
}

/// Issue #13, item 1 (the keyed eviction cliff): a sweep dropped every
/// bucket that was full again, so with a fast-refill quota each sweep
/// evicted every hot key and its next call re-inserted it (write lock, an
/// allocation, a table insert). Buckets now go only after a grace period
/// without a call: keys used in every grace period are never re-inserted,
/// which the allocation count shows (the old code allocated one bucket per
/// key per sweep here).
#[test]
fn hot_keys_of_a_fast_refill_quota_are_not_evicted() {
    let clock = ManualClock::new();
    // Full again 1 ms after a call.
    let q = Quota::per_second(nz(1000)).allow_burst(nz(1));
    let s: Scoped<u32, _> = Scoped::with_clock(q, clock.clone());
    for key in 0..1000 {
        s.try_acquire(&key, 1).unwrap();
    }
    let before = allocs();
    for _ in 0..30 {
        // Every key is full again, and a sweep runs.
        clock.advance(Duration::from_millis(400));
        assert_eq!(s.sweep(), 0);
        for key in 0..1000 {
            assert_eq!(s.try_acquire(&key, 1), Ok(()));
        }
    }
    assert_eq!(
        allocs() - before,
        0,
        "hot keys were evicted and re-inserted"
    );
    assert_eq!(s.len(), 1000);
    // Idle keys still go: one grace period to clear, one to drop.
    clock.advance(Duration::from_secs(1));
    s.sweep();
    clock.advance(Duration::from_secs(1));
    assert_eq!(s.sweep(), 1000);
}

/// Issue #13, item 1 (memory): a million keys touched once and then idle
/// give their entries and their tables' memory back once they have been
/// idle for the grace period, with no explicit sweep: the inserts of new
/// keys sweep each shard at most once per grace period.
#[test]
fn a_million_idle_keys_give_their_memory_back() {
    let clock = ManualClock::new();
    let q = Quota::per_second(nz(10)).allow_burst(nz(2));
    let s: Scoped<u64, _> = Scoped::with_clock(q, clock.clone()).with_max_keys(4 << 20);
    s.try_acquire(&u64::MAX, 1).unwrap();
    let before = live();
    for key in 0..1_000_000u64 {
        s.try_acquire(&key, 1).unwrap();
    }
    let peak = live() - before;
    assert_eq!(s.len(), 1_000_001);
    assert!(peak > 40_000_000, "{peak} bytes for a million keys");
    // A few new keys a grace period later: each shard's sweep clears the
    // second-chance bits. Nothing goes yet.
    clock.advance(Duration::from_secs(1));
    for key in 0..1_000u64 {
        s.try_acquire(&(1 << 40 | key), 1).unwrap();
    }
    assert!(s.len() > 1_000_000);
    // Another grace period: the idle keys go, and the tables shrink.
    clock.advance(Duration::from_secs(1));
    for key in 0..1_000u64 {
        s.try_acquire(&(2 << 40 | key), 1).unwrap();
    }
    assert!(s.len() <= 2_001, "{} entries left", s.len());
    let after = live() - before;
    println!("a million idle keys: {peak} bytes at the peak, {after} after");
    assert!(after < 1_000_000, "{after} bytes left of {peak}");
}

/// cargo-mutants: the getters, `Display` and `Debug` of the registry had
/// no test of their own (their doctests are not in a mutants run).
#[test]
fn the_registry_reports_its_cap_its_keys_and_its_refusals() {
    let limits: Scoped<u32, ManualClock> =
        Scoped::with_clock(Quota::per_second(nz(1)), ManualClock::new()).with_max_keys(5);
    assert_eq!(limits.max_keys(), 5);
    assert!(limits.is_empty());
    limits.try_acquire(&7, 1).unwrap();
    assert!(!limits.is_empty());
    assert_eq!(limits.len(), 1);
    let shown = format!("{limits:?}");
    assert!(
        shown.contains("Scoped") && shown.contains("max_keys: 5"),
        "{shown}"
    );
    let full = backpressure::TooManyKeys { limit: 5 };
    assert_eq!(
        full.to_string(),
        "too many keys: the registry is full at 5 keys"
    );
}

thread_local! {
    /// Whether `Touchy::clone` panics (per thread: tests run in parallel).
    static CLONE_PANICS: Cell<bool> = const { Cell::new(false) };
}

/// A key whose `clone` panics while `CLONE_PANICS` is set: user code that
/// runs while a new key goes into the table.
#[derive(PartialEq, Eq, Hash)]
struct Touchy(u32);

impl Clone for Touchy {
    fn clone(&self) -> Self {
        assert!(!CLONE_PANICS.with(Cell::get), "clone of key {}", self.0);
        Touchy(self.0)
    }
}

/// A new key's slot under the cap is given back when user code panics
/// before its bucket is in the table (cargo-mutants: `KeySlot`'s drop
/// made a no-op survived; the leaked slot refused every later key).
#[test]
fn a_key_whose_clone_panics_gives_its_slot_back() {
    let clock = ManualClock::new();
    let q = Quota::per_second(nz(10)).allow_burst(nz(2));
    let s: Scoped<Touchy, _> = Scoped::with_clock(q, clock).with_max_keys(1);
    CLONE_PANICS.with(|p| p.set(true));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = s.try_acquire(&Touchy(1), 1);
    }));
    CLONE_PANICS.with(|p| p.set(false));
    assert!(panicked.is_err(), "the clone ran and panicked");
    assert_eq!(s.len(), 0);
    s.try_acquire(&Touchy(2), 1)
        .expect("the one slot came back");
    assert_eq!(s.len(), 1);
}

/// A sweep drops full keys nobody touched for a grace period, never one
/// still in debt: dropping it would forgive the debt (cargo-mutants:
/// `!is_full` to `is_full` in `Shard::sweep` survived every test).
#[test]
fn a_sweep_never_drops_a_key_in_debt() {
    let clock = ManualClock::new();
    let s: Scoped<u32, _> = Scoped::with_clock(Quota::per_minute(nz(1)), clock.clone());
    s.try_acquire(&1, 1).unwrap();
    s.try_acquire(&2, 1).unwrap();
    clock.advance(Duration::from_secs(1));
    s.sweep();
    clock.advance(Duration::from_secs(1));
    s.sweep();
    assert_eq!(s.len(), 2, "a key in debt was dropped");
    assert!(matches!(
        s.try_acquire(&1, 1),
        Err(CheckError::NotUntil { .. })
    ));
}
