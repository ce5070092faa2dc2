//! One `tools/call` as the attempt loop sends it.

use core::cell::Cell;
use core::future::Future;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RoleClient};
use rmcp::ServiceError;

use super::shapes;
use crate::admission::attempt::{Exchange, Read};

/// A `tools/call` through `peer`: sent again after the server's "not now"
/// (it did not run the call), after a fault only when the tool is
/// idempotent (it may have run).
pub(super) struct ToolCall<'a> {
    peer: &'a Peer<RoleClient>,
    params: &'a CallToolRequestParams,
    idempotent: bool,
    sent: bool,
    /// The status of the last answer that was not the tool's own (a 429,
    /// 5xx or final JSON-RPC error), `None` after the tool's answer or none.
    status: Cell<Option<u16>>,
}

impl<'a> ToolCall<'a> {
    pub(super) fn new(
        peer: &'a Peer<RoleClient>,
        params: &'a CallToolRequestParams,
        idempotent: bool,
    ) -> Self {
        ToolCall {
            peer,
            params,
            idempotent,
            sent: false,
            status: Cell::new(None),
        }
    }

    /// The HTTP status the last attempt's failure stands for: a 429 or
    /// 5xx at the transport, or a tool's `unavailable`; `None` for no
    /// answer or a JSON-RPC error.
    pub(super) fn status(&self) -> Option<u16> {
        self.status.get().filter(|s| *s != shapes::FINAL)
    }
}

impl Exchange for ToolCall<'_> {
    type Output = CallToolResult;
    type Error = ServiceError;

    /// A call the server refused (429, 503) did not run: it may be sent
    /// again. After anything else it may have run.
    fn can_send(&self) -> bool {
        !self.sent || self.idempotent || matches!(self.status.get(), Some(429 | 503))
    }

    fn send(&mut self) -> impl Future<Output = Result<CallToolResult, ServiceError>> {
        self.sent = true;
        let peer = self.peer.clone();
        let params = self.params.clone();
        async move { peer.call_tool(params).await }
    }

    fn read(&self, result: &Result<CallToolResult, ServiceError>) -> Read {
        let read = shapes::read(result, &self.params.name);
        let status = match &read {
            Read::Answer { status, .. } if !(200..300).contains(status) => Some(*status),
            _ => None,
        };
        self.status.set(status);
        read
    }
}
