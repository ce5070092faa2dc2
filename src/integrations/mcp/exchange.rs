//! One `tools/call` as the attempt loop sends it.

use core::cell::Cell;
use core::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RoleClient};
use rmcp::ServiceError;
use tokio::sync::watch;
use tokio::task::AbortHandle;

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
    /// A read's requests go out on their own task ([`Sent`]); this is the
    /// last one, kept for the callers that joined it.
    sent: Option<Sent>,
    shared: bool,
}

impl<'a> ToolCall<'a> {
    /// A call of `params`; a `shared` one (a read others may join) sends
    /// on a task of its own when a tokio runtime runs it.
    pub(super) fn new(
        peer: &'a Peer<RoleClient>,
        params: &'a CallToolRequestParams,
        shared: bool,
    ) -> Self {
        ToolCall {
            peer,
            params,
            status: Cell::new(None),
            sent: None,
            shared,
        }
    }

    /// The last request, if it is still running: what the callers that
    /// joined this call wait for after the call itself gave up on it.
    pub(super) fn still_running(&mut self) -> Option<Sent> {
        self.sent.take().filter(|s| !*s.0.done.borrow())
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

    /// A result of the tool's own means it ran; a 429 or 503 at the transport,
    /// a JSON-RPC rate-limit error or a gate's refusal came before it did.
    fn may_have_run(&self, result: &Result<CallToolResult, ServiceError>, read: &Read) -> bool {
        match (result, read) {
            (Ok(r), _) => !shapes::ran_nothing(r),
            (Err(_), Read::Answer { status, .. }) => !matches!(status, 429 | 503),
            (Err(_), Read::NoAnswer) => true,
            (Err(_), Read::Refusal) => false,
        }
    }

    fn send(&mut self) -> impl Future<Output = Result<CallToolResult, ServiceError>> {
        let peer = self.peer.clone();
        let params = self.params.clone();
        let request = async move { peer.call_tool(params).await };
        let (sent, inline) = match tokio::runtime::Handle::try_current() {
            Ok(runtime) if self.shared => (Some(Sent::spawn(&runtime, request)), None),
            _ => (None, Some(request)),
        };
        self.sent.clone_from(&sent);
        async move {
            match (sent, inline) {
                (Some(sent), _) => sent.take().await,
                (None, Some(request)) => request.await,
                (None, None) => unreachable!("a request is sent one way"),
            }
        }
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

/// A read's request, running on a task of its own so that it outlives the
/// call that sent it while a caller that joined that call still waits for
/// it. The last handle dropped aborts the task, which drops rmcp's request
/// future: rmcp then sends `notifications/cancelled`.
#[derive(Clone)]
pub(super) struct Sent(Arc<Running>);

struct Running {
    task: AbortHandle,
    answer: Arc<Mutex<Option<Result<CallToolResult, ServiceError>>>>,
    /// `true` once `answer` is written.
    done: watch::Receiver<bool>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sent {
    fn spawn<F>(runtime: &tokio::runtime::Handle, request: F) -> Sent
    where
        F: Future<Output = Result<CallToolResult, ServiceError>> + Send + 'static,
    {
        let answer = Arc::new(Mutex::new(None));
        let (tx, done) = watch::channel(false);
        let slot = answer.clone();
        let task = runtime.spawn(async move {
            let result = request.await;
            *slot.lock() = Some(result);
            let _ = tx.send(true);
        });
        Sent(Arc::new(Running {
            task: task.abort_handle(),
            answer,
            done,
        }))
    }

    /// Waits for the answer: whether it came (not if its runtime shut down).
    async fn answered(&self) -> bool {
        self.0.done.clone().wait_for(|done| *done).await.is_ok()
    }

    /// The answer itself, for the call that sent the request.
    async fn take(self) -> Result<CallToolResult, ServiceError> {
        let answered = self.answered().await;
        let result = answered.then(|| self.0.answer.lock().take()).flatten();
        result.unwrap_or(Err(ServiceError::TransportClosed))
    }

    /// A copy of the tool's answer, for a caller that joined the call that
    /// sent it; `None` when the answer is no success of the tool (a fault,
    /// a refusal, a limit), which that caller does not take as its own.
    pub(super) async fn success(self) -> Option<CallToolResult> {
        if !self.answered().await {
            return None;
        }
        let answer = self.0.answer.lock();
        match answer.as_ref()? {
            Ok(result) if result.is_error != Some(true) => Some(result.clone()),
            _ => None,
        }
    }
}
