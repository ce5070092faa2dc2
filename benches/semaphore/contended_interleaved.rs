//! 64 tasks on 4 permits on a 2-worker tokio runtime, measured the way a
//! noisy shared machine allows: each case runs one round of acquisitions,
//! the cases interleaved round after round, and each round's time per
//! acquisition recorded. Prints each case's best and median round, and the
//! median over rounds of the per-round ratio to futures-intrusive (rounds
//! next to each other in time see the same load, so this ratio is steadier
//! than a ratio of two separately timed medians).
//!
//! The `floor` case runs the same tasks with no semaphore: each iteration
//! yields twice, the two task polls that any FIFO semaphore needs per
//! acquisition here (the poll that queues, and the poll after the wake; the
//! bench's own yield is the second). It is a floor for the polls only, not
//! for the runtime: without a semaphore all 64 tasks are runnable at once
//! and none is ever woken by a task on the other worker, while with 4
//! permits at most a handful are runnable, so the two workers keep running
//! out of work, searching and stealing (tokio reads the clock each time),
//! and every hand-off moves a task to the waking worker. On one worker
//! (`SEM_BENCH_WORKERS=1`) none of that happens and what is left above the
//! floor is the semaphore's own cost.
//!
//! The `floor: FIFO` cases (`fifo_floor.rs`) are the least a FIFO
//! semaphore can do here, a count and a queue of wakers under one lock:
//! a spin lock and `parking_lot`'s mutex, waking every satisfied waiter
//! at once as ours does, and a spin lock waking one at a time as
//! futures-intrusive does (on two workers that one lets tokio park a
//! worker; see `contended_loaded.rs` for its price); on the
//! current-thread runtime also no lock at all.
//!
//! The same cases then run on a current-thread runtime, where no task
//! moves between workers and what differs between the semaphores is their
//! own hand-off (issue #24, item 3a), and then once more, counting how
//! many acquisitions never park and when the tasks finish (`fairness`).
//! Each table gives the per-round ratio
//! to futures-intrusive and to the best peer of that round.
//!
//! Run: `cargo bench -p backpressure-benches --bench semaphore -- interleaved`
//! (`SEM_BENCH_ONLY=<substring>` keeps the matching cases, for a profiler;
//! `SEM_BENCH_WORKERS=<n>` sets the number of worker threads, default 2.)

use std::sync::Arc;
use std::time::Instant;

use crate::fifo_floor::{Fifo, Wakes};

pub(crate) const TASKS: u64 = 64;
pub(crate) const PER_TASK: u64 = 2_000;
const ROUNDS: usize = 40;

type Case = (&'static str, Box<dyn Fn(&tokio::runtime::Runtime) -> f64>);

/// Spawns 64 tasks each running `body` `PER_TASK` times; ns per iteration.
fn run<F, Fut>(rt: &tokio::runtime::Runtime, body: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let start = Instant::now();
    rt.block_on(all_tasks(body));
    start.elapsed().as_nanos() as f64 / (TASKS * PER_TASK) as f64
}

/// On the current runtime: spawns 64 tasks each running `body`
/// `PER_TASK` times and waits for them all.
pub(crate) async fn all_tasks<F, Fut>(body: F)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let handles: Vec<_> = (0..TASKS)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move {
                for _ in 0..PER_TASK {
                    body().await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
}

pub fn main() {
    let workers = std::env::var("SEM_BENCH_WORKERS")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .build()
        .unwrap();
    table(&rt, &format!("{workers} workers"), false);
    let current = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    table(&current, "a current-thread runtime", true);
    fairness(&current);
}

/// Counts the polls of the acquire future it wraps.
struct Polls<F> {
    fut: F,
    polls: u32,
}

impl<F: std::future::Future + Unpin> std::future::Future for Polls<F> {
    type Output = (F::Output, u32);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.polls += 1;
        let polls = self.polls;
        std::pin::Pin::new(&mut self.fut)
            .poll(cx)
            .map(|out| (out, polls))
    }
}

/// What the current-thread table's ratios are made of: how many
/// acquisitions complete on their first poll (never park) and when the
/// first and the last of the 64 tasks finish. A FIFO semaphore parks
/// nearly every acquisition and its tasks finish together; one that lets
/// the releasing task take its permit straight back parks almost none, and
/// its tasks finish in waves of 4.
fn fairness(rt: &tokio::runtime::Runtime) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Mutex;
    println!("the same 64 tasks on a current-thread runtime, one run each:");
    macro_rules! case {
        ($name:expr, $sem:expr, $acquire:ident($($arg:expr),*)) => {{
            let sem = Arc::new($sem);
            let first_poll = Arc::new(AtomicU64::new(0));
            let finished = Arc::new(Mutex::new(Vec::new()));
            let start = Instant::now();
            rt.block_on(async {
                let handles: Vec<_> = (0..TASKS)
                    .map(|_| {
                        let (sem, first_poll, finished) =
                            (sem.clone(), first_poll.clone(), finished.clone());
                        tokio::spawn(async move {
                            for _ in 0..PER_TASK {
                                let fut = Box::pin(sem.$acquire($($arg),*));
                                let (permit, polls) = Polls { fut, polls: 0 }.await;
                                if polls == 1 {
                                    first_poll.fetch_add(1, Relaxed);
                                }
                                tokio::task::yield_now().await;
                                drop(permit);
                            }
                            finished.lock().unwrap().push(start.elapsed());
                        })
                    })
                    .collect();
                for h in handles {
                    h.await.unwrap();
                }
            });
            let finished = finished.lock().unwrap();
            let first = finished.iter().min().unwrap();
            let last = finished.iter().max().unwrap();
            println!(
                "{:20} ready on the first poll {:5.1}% of acquisitions; first task done at {:5.1} ms, last at {:5.1} ms",
                $name,
                100.0 * first_poll.load(Relaxed) as f64 / (TASKS * PER_TASK) as f64,
                first.as_secs_f64() * 1e3,
                last.as_secs_f64() * 1e3,
            );
        }};
    }
    case!("backpressure", backpressure::Semaphore::new(4), acquire());
    case!(
        "futures-intrusive",
        futures_intrusive::sync::Semaphore::new(true, 4),
        acquire(1)
    );
    case!("tokio", tokio::sync::Semaphore::new(4), acquire());
    case!("async-lock", async_lock::Semaphore::new(4), acquire());
}

/// Every case on `rt`, interleaved round after round; prints one table.
/// `one_thread`: `rt` is a current-thread runtime, so the FIFO floor
/// with no lock may run on it.
fn table(rt: &tokio::runtime::Runtime, label: &str, one_thread: bool) {
    let ours = Arc::new(backpressure::Semaphore::new(4));
    let tokio_sem = Arc::new(tokio::sync::Semaphore::new(4));
    let al = Arc::new(async_lock::Semaphore::new(4));
    let fi = Arc::new(futures_intrusive::sync::Semaphore::new(true, 4));
    // One case: each iteration acquires one permit of `$sem` with
    // `$acquire($arg)` and holds it across one yield.
    macro_rules! holding {
        ($name:expr, $sem:expr, $acquire:ident($($arg:expr),*)) => {{
            let sem = $sem;
            let case: Case = (
                $name,
                Box::new(move |rt| {
                    let s = sem.clone();
                    run(rt, move || {
                        let s = s.clone();
                        async move {
                            let _p = s.$acquire($($arg),*).await;
                            tokio::task::yield_now().await;
                        }
                    })
                }),
            );
            case
        }};
    }
    let mut cases: Vec<Case> = vec![
        holding!("backpressure", ours, acquire()),
        holding!("futures-intrusive", fi, acquire(1)),
        holding!("tokio", tokio_sem, acquire()),
        holding!("async-lock", al, acquire()),
        (
            "floor (two yields, no semaphore)",
            Box::new(|rt| {
                run(rt, || async {
                    tokio::task::yield_now().await;
                    tokio::task::yield_now().await;
                })
            }),
        ),
        holding!(
            "floor: FIFO, spin lock",
            Arc::new(Fifo::spin(4, Wakes::AtOnce)),
            acquire()
        ),
        holding!(
            "floor: FIFO, parking_lot",
            Arc::new(Fifo::parking_lot(4)),
            acquire()
        ),
        holding!(
            "floor: FIFO, one woken at a time",
            Arc::new(Fifo::spin(4, Wakes::OneAtATime)),
            acquire()
        ),
    ];
    if one_thread {
        // SAFETY: `one_thread` says `rt` is a current-thread runtime, and
        // this semaphore is used only by the tasks of this case, on it.
        let unsync = Arc::new(unsafe { Fifo::unsync(4) });
        cases.push(holding!("floor: FIFO, no lock", unsync, acquire()));
    }
    if let Ok(only) = std::env::var("SEM_BENCH_ONLY") {
        cases.retain(|(name, _)| name.contains(only.as_str()));
    }
    // Warm-up round, not recorded.
    for (_, case) in &cases {
        case(rt);
    }
    let mut times = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for _ in 0..ROUNDS {
        for (k, (_, case)) in cases.iter().enumerate() {
            times[k].push(case(rt));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let peer = cases.iter().position(|(n, _)| *n == "futures-intrusive");
    let peers: Vec<usize> = cases
        .iter()
        .enumerate()
        .filter(|(_, (n, _))| matches!(*n, "futures-intrusive" | "tokio" | "async-lock"))
        .map(|(k, _)| k)
        .collect();
    println!("64 tasks / 4 permits / {label}, ns per acquisition, {ROUNDS} interleaved rounds");
    for (k, (name, _)) in cases.iter().enumerate() {
        let mut ratios: Vec<f64> = match peer {
            Some(p) => times[k].iter().zip(&times[p]).map(|(a, b)| a / b).collect(),
            None => vec![f64::NAN],
        };
        // The round's best peer, round by round.
        let mut to_best: Vec<f64> = (0..times[k].len())
            .map(|r| {
                let best = peers.iter().map(|&p| times[p][r]).fold(f64::MAX, f64::min);
                times[k][r] / best
            })
            .collect();
        if peers.is_empty() {
            to_best = vec![f64::NAN];
        }
        let best = times[k].iter().copied().fold(f64::MAX, f64::min);
        let med = median(&mut times[k].clone());
        println!(
            "{name:34} best {best:6.1}  median {med:6.1}  ratio (median of rounds) to futures-intrusive {:5.2}x, to the best peer {:5.2}x",
            median(&mut ratios),
            median(&mut to_best)
        );
    }
}
