//! The core primitives: Semaphore (tokio parity), TokenBucket, SingleFlight, RollingWindow and the manual clock.
//!
//! One test binary per area (each links once); each module was its own
//! binary before and keeps its own docs.

mod bucket;
mod clocks;
mod fifo_floor;
mod rolling_window;
mod semaphore;
mod semaphore_threads;
mod single_flight;
