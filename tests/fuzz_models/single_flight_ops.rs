//! `single_flight_ops`: `SingleFlight` against a reference model, on one
//! thread, polling by hand.
//!
//! Up to `SLOTS` calls on a few keys; each call's work waits on a gate the
//! driver opens with a value, an error or a panic. The model keeps each
//! flight's key, mapping, cacheability and FIFO of followers, each key's
//! flight or cached value, and each slot's state. Every poll result, `make`
//! call and wake must agree with the model, and the map's size must be
//! within what it allows (expired entries are reclaimed lazily).

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::CountingWaker;
use backpressure::{FlightError, ManualClock, Provenance, SingleFlight};

const SLOTS: usize = 6;
const KEYS: u8 = 3;
const TTL_MS: u64 = 10;

/// What a call's work does once its gate opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    Closed,
    Value(u32),
    Error(u32),
    Panic,
}

/// What the model expects a finished call to return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expected {
    Value(u32, Provenance),
    Failed(u32),
    Panicked,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotModel {
    Empty,
    /// Its work is running (gate closed).
    Leading(usize),
    /// Waiting in flight `.0`'s queue.
    Linked(usize),
    /// Woken to lead flight `.0`; its work starts on the next poll.
    Promoted(usize),
    /// Woken with an outcome; the next poll returns it.
    Finished(Expected),
}

struct FlightModel {
    key: u8,
    attached: bool,
    /// Cleared by `invalidate`/`clear` of the key while the flight runs.
    cacheable: bool,
    followers: VecDeque<usize>,
}

#[derive(Clone, Copy)]
enum KeyModel {
    InFlight(usize),
    Cached { value: u32, expires: u64 },
}

type Map = SingleFlight<u8, u32, u32, ManualClock>;
type Call<'a> = Pin<Box<dyn Future<Output = Result<(u32, Provenance), FlightError<u32>>> + 'a>>;

struct Real<'a> {
    calls: Vec<Option<Call<'a>>>,
    gates: Vec<Rc<Cell<Gate>>>,
    starts: Vec<Rc<Cell<u32>>>,
    wakers: Vec<Arc<CountingWaker>>,
}

struct Spec {
    slots: [SlotModel; SLOTS],
    starts: [u32; SLOTS],
    flights: Vec<FlightModel>,
    keys: HashMap<u8, KeyModel>,
    cache: bool,
    now: u64,
}

impl Spec {
    fn live(&self, key: u8) -> Option<KeyModel> {
        match self.keys.get(&key).copied() {
            Some(KeyModel::Cached { expires, .. }) if expires <= self.now => None,
            other => other,
        }
    }

    /// The flight's leader went away: promote its oldest follower or let the
    /// flight go.
    fn resign(&mut self, f: usize) {
        match self.flights[f].followers.pop_front() {
            Some(next) => self.slots[next] = SlotModel::Promoted(f),
            None => self.detach(f),
        }
    }

    fn detach(&mut self, f: usize) {
        let flight = &mut self.flights[f];
        if flight.attached {
            flight.attached = false;
            self.keys.remove(&flight.key);
        }
    }

    /// The flight finished: release its followers with `out`.
    fn finish(&mut self, f: usize, out: Expected) {
        for s in std::mem::take(&mut self.flights[f].followers) {
            let joined = match out {
                Expected::Value(v, _) => Expected::Value(v, Provenance::Joined),
                other => other,
            };
            self.slots[s] = SlotModel::Finished(joined);
        }
        let key = self.flights[f].key;
        match out {
            Expected::Value(value, _)
                if self.cache && self.flights[f].attached && self.flights[f].cacheable =>
            {
                self.flights[f].attached = false;
                self.keys.insert(
                    key,
                    KeyModel::Cached {
                        value,
                        expires: self.now + TTL_MS * 1_000_000,
                    },
                );
            }
            _ => self.detach(f),
        }
    }
}

fn poll(
    call: &mut Call<'_>,
    waker: &Arc<CountingWaker>,
) -> Poll<Result<(u32, Provenance), FlightError<u32>>> {
    let waker = Waker::from(waker.clone());
    call.as_mut().poll(&mut Context::from_waker(&waker))
}

fn check(got: Result<(u32, Provenance), FlightError<u32>>, want: Expected) {
    match (got, want) {
        (Ok(got), Expected::Value(v, p)) => assert_eq!(got, (v, p)),
        (Err(FlightError::Failed(e)), Expected::Failed(want)) => assert_eq!(*e, want),
        (Err(FlightError::LeaderPanicked), Expected::Panicked) => {}
        (got, want) => panic!("got {got:?}, want {want:?}"),
    }
}

/// Polls a call whose work panics, with the panic hook silenced (the
/// fuzzer aborts on any reported panic).
fn poll_expecting_panic(call: &mut Call<'_>, waker: &Arc<CountingWaker>) {
    let hook = panic::take_hook();
    panic::set_hook(Box::new(|_| {}));
    let caught = panic::catch_unwind(AssertUnwindSafe(|| poll(call, waker)));
    panic::set_hook(hook);
    assert!(caught.is_err(), "the leader's panic propagates to it");
}

/// Runs the byte string as operations against both the map and the model.
pub fn single_flight_ops(data: &[u8]) {
    let Some((&config, ops)) = data.split_first() else {
        return;
    };
    let cache = config & 1 == 1;
    let clock = ManualClock::new();
    let builder = SingleFlight::builder()
        .shards(usize::from(config >> 1 & 3) + 1)
        .clock(clock.clone());
    // Bit 3 picks an "unbounded" cache, whose size bounds must saturate.
    let max_entries = if config >> 3 & 1 == 1 { usize::MAX } else { 64 };
    let map: Map = if cache {
        builder
            .cache(Duration::from_millis(TTL_MS), max_entries)
            .build()
    } else {
        builder.build()
    };
    let mut real = Real {
        calls: (0..SLOTS).map(|_| None).collect(),
        gates: (0..SLOTS)
            .map(|_| Rc::new(Cell::new(Gate::Closed)))
            .collect(),
        starts: (0..SLOTS).map(|_| Rc::new(Cell::new(0))).collect(),
        wakers: (0..SLOTS).map(|_| Arc::default()).collect(),
    };
    let mut spec = Spec {
        slots: [SlotModel::Empty; SLOTS],
        starts: [0; SLOTS],
        flights: Vec::new(),
        keys: HashMap::new(),
        cache,
        now: 0,
    };

    for op in ops.chunks_exact(2) {
        let (code, arg) = (op[0], op[1]);
        let slot = usize::from(arg) % SLOTS;
        let key = (arg >> 3) % KEYS;
        match code % 8 {
            // Start a call in an empty slot and poll it once.
            0 | 1 if spec.slots[slot] == SlotModel::Empty => {
                real.gates[slot].set(Gate::Closed);
                real.wakers[slot] = Arc::default();
                let (gate, starts) = (real.gates[slot].clone(), real.starts[slot].clone());
                let make = move || {
                    starts.set(starts.get() + 1);
                    std::future::poll_fn(move |_| match gate.get() {
                        Gate::Closed => Poll::Pending,
                        Gate::Value(v) => Poll::Ready(Ok(v)),
                        Gate::Error(e) => Poll::Ready(Err(e)),
                        Gate::Panic => panic!("the work panicked"),
                    })
                };
                let mut call: Call<'_> = Box::pin(map.try_run(key, make));
                let got = poll(&mut call, &real.wakers[slot]);
                match spec.live(key) {
                    Some(KeyModel::Cached { value, .. }) => {
                        check(ready(got), Expected::Value(value, Provenance::Cached));
                    }
                    Some(KeyModel::InFlight(f)) => {
                        assert!(got.is_pending());
                        spec.flights[f].followers.push_back(slot);
                        spec.slots[slot] = SlotModel::Linked(f);
                        real.calls[slot] = Some(call);
                    }
                    None => {
                        assert!(got.is_pending());
                        let f = spec.flights.len();
                        spec.flights.push(FlightModel {
                            key,
                            attached: true,
                            cacheable: true,
                            followers: VecDeque::new(),
                        });
                        spec.keys.insert(key, KeyModel::InFlight(f));
                        spec.slots[slot] = SlotModel::Leading(f);
                        spec.starts[slot] += 1;
                        real.calls[slot] = Some(call);
                    }
                }
            }
            // Open a leader's gate and poll it.
            2 | 3 => {
                let SlotModel::Leading(f) = spec.slots[slot] else {
                    continue;
                };
                let call = real.calls[slot]
                    .as_mut()
                    .expect("a leading slot has a call");
                let value = u32::from(arg);
                match op[0] >> 3 & 3 {
                    0 => {
                        real.gates[slot].set(Gate::Error(value));
                        check(
                            ready(poll(call, &real.wakers[slot])),
                            Expected::Failed(value),
                        );
                        spec.finish(f, Expected::Failed(value));
                    }
                    1 => {
                        real.gates[slot].set(Gate::Panic);
                        poll_expecting_panic(call, &real.wakers[slot]);
                        spec.finish(f, Expected::Panicked);
                    }
                    _ => {
                        real.gates[slot].set(Gate::Value(value));
                        let want = Expected::Value(value, Provenance::Leader);
                        check(ready(poll(call, &real.wakers[slot])), want);
                        spec.finish(f, want);
                    }
                }
                real.calls[slot] = None;
                spec.slots[slot] = SlotModel::Empty;
            }
            // Poll a slot.
            4 => match spec.slots[slot] {
                SlotModel::Empty => {}
                SlotModel::Leading(_) | SlotModel::Linked(_) => {
                    let call = real.calls[slot].as_mut().expect("live slot");
                    assert!(poll(call, &real.wakers[slot]).is_pending());
                }
                SlotModel::Promoted(f) => {
                    let call = real.calls[slot].as_mut().expect("live slot");
                    assert!(poll(call, &real.wakers[slot]).is_pending());
                    spec.slots[slot] = SlotModel::Leading(f);
                    spec.starts[slot] += 1;
                }
                SlotModel::Finished(want) => {
                    let call = real.calls[slot].as_mut().expect("live slot");
                    check(ready(poll(call, &real.wakers[slot])), want);
                    real.calls[slot] = None;
                    spec.slots[slot] = SlotModel::Empty;
                }
            },
            // Drop (cancel) a slot.
            5 => {
                real.calls[slot] = None;
                match spec.slots[slot] {
                    SlotModel::Leading(f) | SlotModel::Promoted(f) => spec.resign(f),
                    SlotModel::Linked(f) => spec.flights[f].followers.retain(|&s| s != slot),
                    SlotModel::Empty | SlotModel::Finished(_) => {}
                }
                spec.slots[slot] = SlotModel::Empty;
            }
            // Forget, invalidate or clear.
            6 => {
                let entry = spec.keys.get(&key).copied();
                let live = spec.live(key).is_some();
                match arg >> 6 {
                    0 | 1 => {
                        let got = map.forget(&key);
                        if live || entry.is_none() {
                            assert_eq!(got, live, "forget({key})");
                        }
                        if let Some(KeyModel::InFlight(f)) = entry {
                            spec.flights[f].attached = false;
                        }
                        spec.keys.remove(&key);
                    }
                    2 => {
                        let got = map.invalidate(&key);
                        match entry {
                            Some(KeyModel::Cached { .. }) => {
                                if live {
                                    assert!(got, "invalidate({key})");
                                }
                                spec.keys.remove(&key);
                            }
                            Some(KeyModel::InFlight(f)) => {
                                assert!(!got, "invalidate({key}) of a flight");
                                // Still joinable, but not cached.
                                spec.flights[f].cacheable = false;
                            }
                            None => assert!(!got, "invalidate({key}) of nothing"),
                        }
                    }
                    _ => {
                        map.clear();
                        spec.keys.retain(|_, k| matches!(k, KeyModel::InFlight(_)));
                        for k in spec.keys.values() {
                            if let KeyModel::InFlight(f) = *k {
                                spec.flights[f].cacheable = false;
                            }
                        }
                    }
                }
            }
            // Let time pass.
            _ => {
                let ms = u64::from(arg % 8) * 2;
                clock.advance(Duration::from_millis(ms));
                spec.now += ms * 1_000_000;
            }
        }

        // Every `make` call, every wake and the size agree with the model.
        for s in 0..SLOTS {
            assert_eq!(
                real.starts[s].get(),
                spec.starts[s],
                "make calls of slot {s}"
            );
            let woken = real.wakers[s].0.load(Ordering::Relaxed) > 0;
            match spec.slots[s] {
                SlotModel::Linked(_) => assert!(!woken, "slot {s} woken while waiting"),
                SlotModel::Promoted(_) | SlotModel::Finished(_) => {
                    assert!(woken, "slot {s} released but not woken");
                }
                SlotModel::Empty | SlotModel::Leading(_) => {}
            }
        }
        let at_least = (0..KEYS).filter(|&k| spec.live(k).is_some()).count();
        let at_most = spec.keys.len();
        let len = map.len();
        assert!(
            (at_least..=at_most).contains(&len),
            "len {len} outside {at_least}..={at_most}"
        );
    }

    // Dropping every call leaves no flight behind.
    drop(real);
    spec.keys
        .retain(|_, k| matches!(k, KeyModel::Cached { .. }));
    assert!(map.len() <= spec.keys.len(), "an abandoned flight leaked");
}

fn ready<T>(p: Poll<T>) -> T {
    match p {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("expected Ready"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_byte_strings_match_the_model() {
        let mut rng = fastrand::Rng::with_seed(0xf1e5);
        let runs = if cfg!(miri) { 20 } else { 2_000 };
        for _ in 0..runs {
            let len = rng.usize(1..160);
            let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            super::single_flight_ops(&data);
        }
    }
}
