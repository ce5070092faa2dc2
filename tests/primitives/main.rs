//! The core primitives: Semaphore (tokio parity), TokenBucket and SingleFlight.
//!
//! One test binary per area (each links once); each module was its own
//! binary before and keeps its own docs.

mod bucket;
mod fifo_floor;
mod semaphore;
mod single_flight;
