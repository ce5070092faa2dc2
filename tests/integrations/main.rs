//! The seams: tower layers, the reqwest middleware and the throttling fake, against real loopback servers.
//!
//! One test binary per area (each links once); each module was its own
//! binary before and keeps its own docs.

#[cfg(all(feature = "reqwest", feature = "tower"))]
mod conformance;
#[cfg(all(feature = "reqwest", feature = "tower", feature = "mcp"))]
mod mcp_cancel;
#[cfg(all(feature = "reqwest", feature = "tower", feature = "mcp"))]
mod mcp_tool_limit;
#[cfg(feature = "http")]
mod refusal;
#[cfg(all(feature = "reqwest", feature = "testing"))]
mod reqwest_seam;
#[cfg(all(feature = "reqwest", feature = "tower", feature = "http"))]
mod safe_by_default;
#[cfg(feature = "testing")]
mod testing;
#[cfg(all(feature = "tower", feature = "http", feature = "testing"))]
mod tower_admission;
#[cfg(feature = "tower")]
mod tower_concurrency;
#[cfg(feature = "tower")]
mod tower_layers;
#[cfg(all(feature = "tower", feature = "reqwest"))]
mod tower_streams;

/// A loopback server with rolling-window limits, shared by the modules above.
#[cfg(all(
    feature = "testing",
    any(feature = "reqwest", all(feature = "tower", feature = "http"))
))]
#[path = "../support/window_server.rs"]
mod window_server;

/// A server that is down for a while, then recovers (the circuit-breaker
/// twins of the reqwest and tower modules).
#[cfg(all(
    feature = "testing",
    any(feature = "reqwest", all(feature = "tower", feature = "http"))
))]
#[path = "../support/down_server.rs"]
mod down_server;

/// A loopback LLM that streams (the streamed-reply twins of the reqwest and
/// tower modules).
#[cfg(feature = "reqwest")]
#[path = "../support/stream_server.rs"]
mod stream_server;

/// A loopback server that answers from a script (the conformance table).
#[cfg(all(feature = "reqwest", feature = "tower"))]
#[path = "../support/scripted_server.rs"]
mod scripted_server;

/// rmcp's streamable HTTP server behind the same script (the table's MCP
/// column).
#[cfg(all(feature = "reqwest", feature = "tower", feature = "mcp"))]
#[path = "../support/mcp_server.rs"]
mod mcp_server;
#[cfg(all(feature = "reqwest", feature = "tower", feature = "mcp-server"))]
mod mcp_server_gate;
