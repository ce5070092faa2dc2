//! Integrations with what users already run: tower layers (feature
//! `tower`), a reqwest middleware (feature `reqwest`), and a throttling fake
//! server for tests (feature `testing`).

#[cfg(feature = "mcp")]
pub mod mcp;
#[cfg(feature = "http")]
mod refusal;
#[cfg(feature = "reqwest")]
pub mod reqwest;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(any(feature = "reqwest", all(feature = "tower", feature = "http")))]
mod ticket_body;
#[cfg(feature = "tower")]
pub mod tower;
