//! Nothing here: `tests/` drives real LLM clients through `backpressure`.
