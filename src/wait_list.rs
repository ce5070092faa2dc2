//! An intrusive, doubly linked FIFO of pinned waiter nodes: the unsafe core.
//!
//! The nodes live inside the futures that wait, so queueing allocates
//! nothing. The list stores raw pointers; it never owns, moves or drops a node.
//!
//! # Invariants
//!
//! * A `WaitList` is only used behind a mutex: every method that touches a
//!   node's links (an [`UnsafeCell`]) is called with that mutex held.
//! * A node is in at most one list at a time. While linked it is pinned and
//!   alive: its owner unlinks it (under the lock) before it is dropped or
//!   moved. This is what the `unsafe` of [`WaitList::push_back`] asks.
//! * Node pointers come from shared references, all mutation goes through
//!   `UnsafeCell`s or atomics, and links are accessed through raw pointers
//!   (`addr_of!`) without an intermediate `&mut` to the node, so the list is
//!   sound under both Stacked and Tree Borrows.

use core::fmt;
use core::marker::PhantomPinned;
use core::ptr::{self, NonNull};
use core::task::Waker;
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use smallvec::SmallVec;

use crate::sync::{AtomicUsize, Ordering, UnsafeCell, WAKE_BATCH};

/// A type that can be linked into a [`WaitList`].
///
/// # Safety
///
/// [`Link::pointers`] must return a pointer to the [`Pointers`] embedded in
/// the node that `target` points to, without creating a reference to the
/// whole node, and the same node must always return the same `Pointers`.
pub(crate) unsafe trait Link {
    /// Returns the links embedded in `target`.
    ///
    /// # Safety
    ///
    /// `target` must point to a live node.
    unsafe fn pointers(target: NonNull<Self>) -> NonNull<Pointers<Self>>;
}

/// The previous/next links embedded in every node.
pub(crate) struct Pointers<T: ?Sized> {
    /// Only accessed while the owning list's mutex is held.
    inner: UnsafeCell<PointersInner<T>>,
    /// A linked node must not move.
    _pin: PhantomPinned,
}

struct PointersInner<T: ?Sized> {
    prev: Option<NonNull<T>>,
    next: Option<NonNull<T>>,
}

impl<T: ?Sized> Pointers<T> {
    /// Unlinked pointers (not `const`: loom's cell is not, and no caller
    /// needs it).
    pub(crate) fn new() -> Self {
        Self {
            inner: UnsafeCell::new(PointersInner {
                prev: None,
                next: None,
            }),
            _pin: PhantomPinned,
        }
    }
}

impl<T: ?Sized> fmt::Debug for Pointers<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The links may only be read under the lock, so they are not shown.
        f.debug_struct("Pointers").finish_non_exhaustive()
    }
}

// The accessors below take the node pointer, not `&self`, so no reference
// to a node's links outlives a single read or write.

/// # Safety
///
/// `node` is live and the list's lock is held.
unsafe fn prev<T: Link + ?Sized>(node: NonNull<T>) -> Option<NonNull<T>> {
    // SAFETY: the caller guarantees `node` is live; `pointers` returns a
    // pointer into it; the lock is held, so no one writes the cell meanwhile.
    unsafe { T::pointers(node).as_ref().inner.with(|p| (*p).prev) }
}

/// # Safety
///
/// `node` is live and the list's lock is held.
unsafe fn next<T: Link + ?Sized>(node: NonNull<T>) -> Option<NonNull<T>> {
    // SAFETY: as in `prev`.
    unsafe { T::pointers(node).as_ref().inner.with(|p| (*p).next) }
}

/// # Safety
///
/// `node` is live and the list's lock is held.
unsafe fn set_prev<T: Link + ?Sized>(node: NonNull<T>, value: Option<NonNull<T>>) {
    // SAFETY: as in `prev`; the lock makes this the only access to the cell.
    unsafe {
        T::pointers(node)
            .as_ref()
            .inner
            .with_mut(|p| (*p).prev = value)
    }
}

/// # Safety
///
/// `node` is live and the list's lock is held.
unsafe fn set_next<T: Link + ?Sized>(node: NonNull<T>, value: Option<NonNull<T>>) {
    // SAFETY: as in `set_prev`.
    unsafe {
        T::pointers(node)
            .as_ref()
            .inner
            .with_mut(|p| (*p).next = value)
    }
}

/// The waiter node of the crate's lists (the semaphore's and the
/// single-flight's), pinned inside the future that waits.
///
/// While linked, only the lock holder writes `state` and `waker`; it
/// unlinks a node and calls [`WaitNode::finish`], whose `Release` store of
/// a terminal state is its last access, so the owner can go on lockless
/// after an `Acquire` load.
pub(crate) struct WaitNode {
    pointers: Pointers<WaitNode>,
    /// Meaning defined by the owning list (see `semaphore::raw`,
    /// `single_flight::flight`).
    pub(crate) state: AtomicUsize,
    /// Only accessed with the owning list's lock held (or by the owner
    /// before the node is first linked).
    pub(crate) waker: UnsafeCell<Option<Waker>>,
}

// SAFETY: `pointers` returns the embedded field through `addr_of_mut!`,
// never a reference to the node.
unsafe impl Link for WaitNode {
    unsafe fn pointers(target: NonNull<Self>) -> NonNull<Pointers<Self>> {
        // SAFETY: the caller guarantees `target` is live.
        unsafe { NonNull::new_unchecked(ptr::addr_of_mut!((*target.as_ptr()).pointers)) }
    }
}

// SAFETY: the links and the waker are only accessed with the owning list's
// lock held; `state` is atomic. `Waker` is `Send + Sync`.
unsafe impl Send for WaitNode {}
// SAFETY: as for `Send`.
unsafe impl Sync for WaitNode {}

impl WaitNode {
    /// An unlinked node in `state`, with no waker.
    #[inline]
    pub(crate) fn new(state: usize) -> Self {
        Self {
            pointers: Pointers::new(),
            state: AtomicUsize::new(state),
            waker: UnsafeCell::new(None),
        }
    }

    /// Stores `waker` unless an equivalent one is there; returns the waker
    /// no longer needed, for the caller to drop after unlocking.
    ///
    /// # Safety
    ///
    /// The owning list's lock is held, or the node was never linked.
    pub(crate) unsafe fn swap_waker(&self, waker: Waker) -> Option<Waker> {
        // SAFETY: the caller guarantees exclusive access to the cell.
        self.waker.with_mut(|slot| unsafe {
            match &*slot {
                Some(old) if old.will_wake(&waker) => Some(waker),
                _ => (*slot).replace(waker),
            }
        })
    }

    /// Takes the waker and stores the terminal `state` with `Release`: the
    /// lock holder's last access to a node it just unlinked.
    ///
    /// # Safety
    ///
    /// `node` is live and was just unlinked; the owning list's lock is held.
    pub(crate) unsafe fn finish(node: NonNull<Self>, state: usize) -> Option<Waker> {
        // SAFETY: the caller guarantees liveness.
        let node = unsafe { node.as_ref() };
        // SAFETY: the lock is held.
        let waker = node.waker.with_mut(|w| unsafe { (*w).take() });
        // Release: pairs with the owner's Acquire load of `state`; after
        // this store the owner may drop the node.
        node.state.store(state, Ordering::Release);
        waker
    }
}

impl fmt::Debug for WaitNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitNode")
            .field("state", &self.state.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// An intrusive FIFO of nodes (oldest at the front).
///
/// Links: every linked node but the head has `prev` pointing at its
/// predecessor; the head's `prev` is unspecified (`pop_front` does not
/// clear it, to stay off the next waiter's cache line) and never read. A
/// node in no list has both links `None`.
pub(crate) struct WaitList<T: Link + ?Sized> {
    head: Option<NonNull<T>>,
    tail: Option<NonNull<T>>,
}

// SAFETY: the list holds pointers to nodes that are `Sync` (their mutable
// parts are atomics or cells only touched under the list's lock). Moving the
// list to another thread moves only those pointers; the nodes themselves are
// reached only while the lock is held.
unsafe impl<T: Link + Sync + ?Sized> Send for WaitList<T> {}

impl<T: Link + ?Sized> WaitList<T> {
    /// An empty list.
    pub(crate) const fn new() -> Self {
        Self {
            head: None,
            tail: None,
        }
    }

    /// Whether no node is linked.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.head.is_none()
    }

    /// The oldest node, if any.
    #[inline]
    pub(crate) fn front(&self) -> Option<NonNull<T>> {
        self.head
    }

    /// Links `node` at the back (it becomes the newest).
    ///
    /// # Safety
    ///
    /// `node` is live, pinned and in no list, and stays live and pinned until
    /// it has been removed from this list (by `pop_front` or `remove`). The
    /// list's lock is held.
    pub(crate) unsafe fn push_back(&mut self, node: NonNull<T>) {
        debug_assert!(self.head != Some(node) && self.tail != Some(node));
        // SAFETY: the caller guarantees `node` is live and the lock is held;
        // `tail`, if any, is live by this function's contract on its caller.
        unsafe {
            set_next(node, None);
            set_prev(node, self.tail);
            match self.tail {
                Some(tail) => set_next(tail, Some(node)),
                None => self.head = Some(node),
            }
        }
        self.tail = Some(node);
    }

    /// Unlinks and returns the oldest node. Leaves the new head's `prev`
    /// stale (see [`WaitList`]) to stay off the next waiter's cache line.
    pub(crate) fn pop_front(&mut self) -> Option<NonNull<T>> {
        let head = self.head?;
        // SAFETY: every linked node is live (contract of `push_back`), and
        // `&mut self` means the caller holds the lock.
        unsafe {
            self.head = next(head);
            if self.head.is_none() {
                self.tail = None;
            }
            set_prev(head, None);
            set_next(head, None);
        }
        Some(head)
    }

    /// Unlinks `node` if it is in this list; returns whether it was.
    ///
    /// # Safety
    ///
    /// `node` is live and is either in this list or in no list. The lock is
    /// held.
    pub(crate) unsafe fn remove(&mut self, node: NonNull<T>) -> bool {
        // SAFETY: `node` is live (caller), its neighbours are linked and so
        // live (contract of `push_back`), and the lock is held. The head's
        // `prev` is stale, so it is never read: the head is checked first.
        unsafe {
            let next = next(node);
            if self.head == Some(node) {
                self.head = next;
                if next.is_none() {
                    self.tail = None;
                }
            } else {
                // Not the head: linked exactly when `prev` is set.
                let Some(prev) = prev(node) else {
                    return false;
                };
                set_next(prev, next);
                match next {
                    Some(next) => set_prev(next, Some(prev)),
                    None => self.tail = Some(prev),
                }
            }
            set_prev(node, None);
            set_next(node, None);
        }
        true
    }
}

impl<T: Link + ?Sized> fmt::Debug for WaitList<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitList")
            .field("is_empty", &self.is_empty())
            .finish()
    }
}

/// The payload of a panic caught by [`WakeBatch::wake_all`], for the caller
/// to hand to [`std::panic::resume_unwind`] once its own work is done.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;

/// Up to [`WAKE_BATCH`] wakers collected under a wait-list lock, woken
/// after it is released (a waker is user code and may call back in).
///
/// A panicking waker must strand neither the rest of the batch nor the
/// caller's hand-off: [`wake_all`](Self::wake_all) wakes every waker and
/// returns the first panic's payload for the caller to resume when done;
/// `Drop` does the same. Each slot is emptied before its waker runs.
pub(crate) struct WakeBatch {
    slots: SmallVec<[Option<Waker>; WAKE_BATCH]>,
}

impl WakeBatch {
    /// An empty batch.
    #[inline]
    pub(crate) fn new() -> Self {
        Self {
            slots: SmallVec::new(),
        }
    }

    /// Whether the batch holds `WAKE_BATCH` wakers (unlock and wake them
    /// before collecting more).
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.slots.len() >= WAKE_BATCH
    }

    /// Adds a waker to wake later.
    #[inline]
    pub(crate) fn push(&mut self, waker: Waker) {
        debug_assert!(!self.is_full());
        self.slots.push(Some(waker));
    }

    /// Wakes every waker and empties the batch; returns the first panic, if
    /// any (the rest are dropped; the panic hook reported them).
    #[must_use = "a caught panic must be resumed once the hand-off is done"]
    pub(crate) fn wake_all(&mut self) -> Option<Panic> {
        let mut first = None;
        // Each round takes at least one slot, so this ends.
        while let Err(payload) = catch_unwind(AssertUnwindSafe(|| self.wake_remaining())) {
            first.get_or_insert(payload);
        }
        self.slots.clear();
        first
    }

    fn wake_remaining(&mut self) {
        for slot in self.slots.iter_mut() {
            if let Some(waker) = slot.take() {
                waker.wake();
            }
        }
    }
}

impl Drop for WakeBatch {
    fn drop(&mut self) {
        if !self.slots.is_empty() {
            // Normally reached only while unwinding from a panic elsewhere;
            // that panic carries on, so one caught here is dropped.
            drop(self.wake_all());
        }
    }
}

impl fmt::Debug for WakeBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeBatch")
            .field("len", &self.slots.len())
            .finish()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    //! The list against a `VecDeque` model; run under miri too.
    use super::*;
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::ptr;

    struct Node {
        pointers: Pointers<Node>,
        id: usize,
    }

    // SAFETY: `pointers` returns the embedded field via `addr_of!`.
    unsafe impl Link for Node {
        unsafe fn pointers(target: NonNull<Self>) -> NonNull<Pointers<Self>> {
            // SAFETY: `target` is live (caller); `addr_of_mut!` creates no
            // intermediate reference.
            unsafe { NonNull::new_unchecked(ptr::addr_of_mut!((*target.as_ptr()).pointers)) }
        }
    }

    fn node(id: usize) -> Pin<Box<Node>> {
        Box::pin(Node {
            pointers: Pointers::new(),
            id,
        })
    }

    fn ptr(n: &Pin<Box<Node>>) -> NonNull<Node> {
        NonNull::from(&**n)
    }

    fn ids(list: &mut WaitList<Node>) -> Vec<usize> {
        let mut out = Vec::new();
        let mut cur = list.front();
        while let Some(n) = cur {
            // SAFETY: linked nodes are live; the test is single-threaded.
            unsafe {
                out.push(n.as_ref().id);
                cur = next(n);
            }
        }
        out
    }

    #[test]
    fn fifo_order_and_remove_from_every_position() {
        let nodes: Vec<_> = (0..5).map(node).collect();
        let mut list = WaitList::new();
        for n in &nodes {
            // SAFETY: the boxes outlive the list's use of them.
            unsafe { list.push_back(ptr(n)) };
        }
        assert_eq!(ids(&mut list), vec![0, 1, 2, 3, 4]);
        // SAFETY: nodes are live and in this list (or, for the second
        // removal, in no list).
        unsafe {
            assert!(list.remove(ptr(&nodes[2])));
            assert!(!list.remove(ptr(&nodes[2])));
            assert!(list.remove(ptr(&nodes[4])));
            assert!(list.remove(ptr(&nodes[0])));
        }
        assert_eq!(ids(&mut list), vec![1, 3]);
        assert_eq!(list.pop_front(), Some(ptr(&nodes[1])));
        assert_eq!(list.pop_front(), Some(ptr(&nodes[3])));
        assert_eq!(list.pop_front(), None);
        assert!(list.is_empty());
        // SAFETY: node 1 is live and in no list.
        assert!(!unsafe { list.remove(ptr(&nodes[1])) });
    }

    #[test]
    fn random_ops_match_vecdeque() {
        let mut rng = fastrand::Rng::with_seed(7);
        let nodes: Vec<_> = (0..16).map(node).collect();
        for _round in 0..if cfg!(miri) { 4 } else { 200 } {
            let mut list = WaitList::new();
            let mut model: VecDeque<usize> = VecDeque::new();
            for _ in 0..64 {
                let id = rng.usize(..nodes.len());
                match rng.u8(..3) {
                    0 if !model.contains(&id) => {
                        // SAFETY: node is live and in no list.
                        unsafe { list.push_back(ptr(&nodes[id])) };
                        model.push_back(id);
                    }
                    1 => {
                        let got = list.pop_front().map(|n| {
                            // SAFETY: the node was just unlinked and is live.
                            unsafe { n.as_ref().id }
                        });
                        assert_eq!(got, model.pop_front());
                    }
                    _ => {
                        // SAFETY: every node is in this list or in none.
                        let removed = unsafe { list.remove(ptr(&nodes[id])) };
                        let pos = model.iter().position(|&m| m == id);
                        assert_eq!(removed, pos.is_some());
                        if let Some(pos) = pos {
                            model.remove(pos);
                        }
                    }
                }
                assert_eq!(ids(&mut list), model.iter().copied().collect::<Vec<_>>());
            }
            while list.pop_front().is_some() {}
        }
    }

    /// Counts wakes; panics on every wake if `panics`.
    struct TestWaker {
        woken: std::sync::atomic::AtomicUsize,
        panics: bool,
    }

    impl std::task::Wake for TestWaker {
        fn wake(self: std::sync::Arc<Self>) {
            self.woken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            assert!(!self.panics, "test waker panics");
        }
    }

    fn test_waker(panics: bool) -> (std::sync::Arc<TestWaker>, Waker) {
        let w = std::sync::Arc::new(TestWaker {
            woken: std::sync::atomic::AtomicUsize::new(0),
            panics,
        });
        (w.clone(), Waker::from(w))
    }

    /// Every waker in a batch with two panicking ones is woken exactly once.
    #[test]
    fn panicking_waker_does_not_strand_the_rest_of_the_batch() {
        let wakers: Vec<_> = (0..WAKE_BATCH)
            .map(|i| test_waker(i == 1 || i == WAKE_BATCH - 2))
            .collect();
        let mut batch = WakeBatch::new();
        for (_, w) in &wakers {
            batch.push(w.clone());
        }
        assert!(batch.is_full());
        let panic = batch.wake_all().expect("the first panic is returned");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"test waker panics"));
        for (i, (count, _)) in wakers.iter().enumerate() {
            assert_eq!(
                count.woken.load(std::sync::atomic::Ordering::SeqCst),
                1,
                "{i}"
            );
        }
        assert!(batch.wake_all().is_none());
        let (count, w) = test_waker(false);
        batch.push(w);
        drop(batch);
        assert_eq!(count.woken.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// `Debug` never shows the links, which need the list's lock.
    #[test]
    fn debug_shows_what_is_safe_to_read() {
        let n = node(0);
        assert_eq!(format!("{:?}", n.pointers), "Pointers { .. }");
        let mut list = WaitList::new();
        assert_eq!(format!("{list:?}"), "WaitList { is_empty: true }");
        // SAFETY: the node is live and in no list.
        unsafe { list.push_back(ptr(&n)) };
        assert_eq!(format!("{list:?}"), "WaitList { is_empty: false }");
        assert_eq!(list.pop_front(), Some(ptr(&n)));
        let w = WaitNode::new(6);
        assert_eq!(format!("{w:?}"), "WaitNode { state: 6, .. }");
        let mut batch = WakeBatch::new();
        batch.push(test_waker(false).1);
        assert_eq!(format!("{batch:?}"), "WakeBatch { len: 1 }");
    }
}
