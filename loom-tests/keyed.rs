//! Loom model of `Scoped` moving a key's bucket out of its table slot (an
//! `Arc`, for the key's first reservation) while another thread checks
//! the same key.
//!
//! The move copies the bucket's words under the shard's write lock with
//! relaxed loads, relying on the lock to order them after every operation
//! made under the read lock. If it lost a write (or ran while a check was
//! in flight), both threads could take the last cell.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::bucket::Quota;
use crate::clock::ManualClock;
use crate::sync::Arc;
use crate::Scoped;

#[test]
fn first_reservation_moving_the_bucket_races_a_check() {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b.check(|| {
        let q =
            Quota::with_period(Duration::from_nanos(100)).allow_burst(NonZeroU32::new(2).unwrap());
        let s = Arc::new(Scoped::with_clock(q, ManualClock::new()));
        // The key's bucket is created in its slot, one of two cells used.
        s.try_acquire(&1u32, 1).unwrap();
        let other = s.clone();
        let check = loom::thread::spawn(move || other.try_acquire(&1, 1).is_ok());
        let reserved = s.reserve(&1, 1, Duration::ZERO);
        let checked = check.join().unwrap();
        assert!(
            reserved.is_ok() != checked,
            "exactly one of the two takes the last cell: reserved {reserved:?}, checked {checked}"
        );
        assert_eq!(s.available(&1), 0);
        if let Ok(r) = reserved {
            // The refund reaches the bucket the key uses.
            assert!(r.cancel());
            assert_eq!(s.available(&1), 1);
        }
    });
}
