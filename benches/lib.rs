//! Nothing: the package exists for its benches (see `Cargo.toml`).
