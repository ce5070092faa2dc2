//! The admission layer and Runner: stages, cache, stats, metrics, weighted quotas and the outcomes a caller sees.
//!
//! One test binary per area (each links once); each module was its own
//! binary before and keeps its own docs.

mod admission_cache;
mod admission_layer;
mod admission_metrics;
mod admission_stats;
mod admission_weighted;
mod architecture;
mod rate_stage;
mod rolling_window;
mod runner;
mod runner_outcomes;
mod shared_costs;
mod shared_limits;
