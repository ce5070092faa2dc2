//! One `tools/call` as the attempt loop sends it.

use core::cell::Cell;
use core::future::Future;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RoleClient};
use rmcp::ServiceError;

use super::shapes;
use crate::admission::attempt::{Exchange, Read};

/// A `tools/call` through `peer`. The tool may have run after any result
/// of its own.
pub(super) struct ToolCall<'a> {
    peer: &'a Peer<RoleClient>,
    params: &'a CallToolRequestParams,
    /// The status of the last answer that was not the tool's own (a 429,
    /// 5xx or final JSON-RPC error), `None` after the tool's answer or none.
    status: Cell<Option<u16>>,
}

impl<'a> ToolCall<'a> {
    pub(super) fn new(peer: &'a Peer<RoleClient>, params: &'a CallToolRequestParams) -> Self {
        ToolCall {
            peer,
            params,
            status: Cell::new(None),
        }
    }

    /// The HTTP status the last failure stands for (a 429 or 5xx at the
    /// transport, or a tool's `unavailable`); `None` otherwise.
    pub(super) fn status(&self) -> Option<u16> {
        self.status.get().filter(|s| *s != shapes::FINAL)
    }
}

impl Exchange for ToolCall<'_> {
    type Output = CallToolResult;
    type Error = ServiceError;

    fn can_send(&self) -> bool {
        true
    }

    /// A result of the tool's own means it ran; a 429 or 503 at the transport
    /// or a JSON-RPC rate-limit error came before it did.
    fn may_have_run(&self, result: &Result<CallToolResult, ServiceError>, read: &Read) -> bool {
        match (result, read) {
            (Ok(_), _) => true,
            (Err(_), Read::Answer { status, .. }) => !matches!(status, 429 | 503),
            (Err(_), Read::NoAnswer) => true,
            (Err(_), Read::Refusal) => false,
        }
    }

    fn send(&mut self) -> impl Future<Output = Result<CallToolResult, ServiceError>> {
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
