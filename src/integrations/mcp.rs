//! A gate over an [`rmcp`] client (feature `mcp`): each MCP `tools/call`
//! on the one attempt loop, and "not now" as a tool result the model
//! reads.

use core::time::Duration;
use std::collections::HashSet;
use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, Tool};
use rmcp::service::{Peer, RoleClient};
use rmcp::transport::streamable_http_client::HttpStatusError;
use rmcp::transport::DynamicTransportError;
use rmcp::ServiceError;

use crate::admission::attempt::reads::{joined_timed_out, Joined, Reads, Share, Sharing};
use crate::admission::attempt::Ended;
use crate::admission::identity::ReadKey;
use crate::admission::{Admission, CallFailure, CallResult, CallSpec};
use crate::clock::{Clock, DefaultClock};
use crate::retry::{Deadline, RetryPolicy};
use crate::sleep::{DefaultSleeper, Sleeper};
use crate::{Provenance, Status, Throttled};

mod exchange;
#[cfg(feature = "mcp-server")]
mod server;
mod shapes;

#[cfg(feature = "mcp-server")]
pub use server::ServerGate;

/// How a gated call ended.
type Outcome = CallResult<CallToolResult, ServiceError>;

/// What the callers that joined a read take from it: a copy of how it
/// ended, or the request it gave up on at its own deadline, still running
/// for them.
#[derive(Clone)]
enum Copied {
    Ended(Outcome),
    Running(exchange::Sent),
}

/// Admits every `tools/call` of an [`rmcp`] client through an
/// [`Admission`], per (MCP server, tool) and credential, with every stage
/// the layer has (slots, the learned rate, weighted quotas, the breaker,
/// the retry budget, priority lanes), on the same attempt loop as the
/// reqwest middleware, the tower layer and `Runner`.
///
/// | what happened | [`call_tool`](Self::call_tool) returns | [`call_result`](Self::call_result) returns |
/// | --- | --- | --- |
/// | the tool answered (a tool error too) | `Ok(result)` | `Done` |
/// | refused by admission, the server's wait past the clamp or the deadline, an open breaker, no answer by the deadline | `Ok` of an `isError` result whose `structuredContent` is the [`Throttled`] ([`refusal`](McpGate::refusal)) | `Throttled` |
/// | a JSON-RPC error (final), or a fault past its retries | `Err(error)`, as rmcp gave it | `Failed` |
///
/// * The **tool** an admission sees is `"<server>/<tool>"`; the
///   **credential** is the gate's ([`credential`](Self::credential)), its
///   server's name unless set, so a 429 from one server holds no other's.
/// * The server's **"not now"** is read in the shapes it comes in: a 429
///   or 5xx at the HTTP transport (with its `Retry-After`), or a JSON-RPC
///   error or `isError` result that says it is a rate limit (see the
///   README). A short wait is slept; a long one is the refusal. The
///   credential is held for every call behind it.
/// * **Retries.** A call refused before the tool ran (a 429 or 503 at the
///   transport, a JSON-RPC rate-limit error) is sent again. A call that
///   may have run is sent again only when its tool is
///   [`idempotent`](Self::idempotent) or a [`read`](Self::read): a write
///   runs at most once. A closed transport fails its calls at once.
/// * **Reads coalesce.** Identical concurrent calls (same credential,
///   tool and arguments) to a [`read`](Self::read) send one request; a
///   joiner waits no longer than its own deadline, and sends its own on
///   the leader's refusal. A read whose first caller's deadline passes
///   goes on running for the callers that joined it, and is cancelled at
///   the server (`notifications/cancelled`) only when none of them waits
///   for it any more. (A first caller dropped by its own caller cancels
///   its request; the oldest joiner then sends its own.) The server's
///   `readOnlyHint` counts only with [`trust_annotations`](Self::trust_annotations).
/// * rmcp's multi-round `input_required` replies are not driven.
///
/// # Examples
///
/// ```no_run
/// use backpressure::admission::{Admission, SlotPolicy};
/// use backpressure::mcp::McpGate;
/// use rmcp::model::CallToolRequestParams;
/// use std::time::Duration;
///
/// # async fn turn(peer: rmcp::Peer<rmcp::RoleClient>) -> Result<(), rmcp::ServiceError> {
/// let admission = Admission::builder()
///     .tool("jira/search", 4, SlotPolicy::Wait)
///     .build();
/// let tools = peer.list_all_tools().await?;
/// let gate = McpGate::new(admission, "jira", peer)
///     .credential("team-a")
///     .deadline(Duration::from_secs(20))
///     .read("search")
///     .trust_annotations(&tools);
/// let result = gate.call_tool(CallToolRequestParams::new("search")).await?;
/// // A refusal is a tool result too: `isError`, the `Throttled` in
/// // `structuredContent`, for the model to plan with.
/// println!("{:?}", result.structured_content);
/// # Ok(()) }
/// # let _ = turn;
/// ```
pub struct McpGate<S: Sleeper = DefaultSleeper, C: Clock = DefaultClock> {
    admission: Admission<S, C>,
    peer: Peer<RoleClient>,
    server: String,
    credential: String,
    deadline: Duration,
    /// The template each call forks its policy from.
    retry: RetryPolicy,
    reads: HashSet<String>,
    idempotent: HashSet<String>,
    flights: Reads<Outcome, Copied, C>,
}

impl<S: Sleeper, C: Clock + Clone> McpGate<S, C> {
    /// The gate over `peer` (`service.peer().clone()`), for the MCP server
    /// named `server`, with a 30 s deadline and the default retry policy.
    ///
    /// # Examples
    ///
    /// See [`McpGate`].
    pub fn new(
        admission: Admission<S, C>,
        server: impl Into<String>,
        peer: Peer<RoleClient>,
    ) -> Self {
        let clock = admission.clock().clone();
        let server = server.into();
        McpGate {
            admission,
            peer,
            credential: server.clone(),
            server,
            deadline: Duration::from_secs(30),
            retry: crate::admission::attempt::default_policy(),
            reads: HashSet::new(),
            idempotent: HashSet::new(),
            flights: Reads::builder().clock(clock).build(),
        }
    }

    /// The credential every call is admitted under (an id, not a secret: it
    /// may be logged); the server's name unless set.
    pub fn credential(mut self, credential: impl Into<String>) -> Self {
        self.credential = credential.into();
        self
    }

    /// Each call's deadline: admission waits, the request, its retries
    /// and their backoff are all charged to it. A wait for capacity longer
    /// than the admission's inline wait (`Builder::inline_wait`, 2 s in
    /// all by default) is not slept: the call ends `rate_limited` with
    /// `retry_after_ms`, for the model to plan with, whatever is left of
    /// the deadline.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The retry policy (each call forks its own).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Declares `tool` a read: it changes nothing, so identical calls in
    /// flight share one request and a transport fault is retried.
    pub fn read(mut self, tool: impl Into<String>) -> Self {
        self.reads.insert(tool.into());
        self
    }

    /// Declares `tool` idempotent: calling it twice does what calling it
    /// once does, so a transport fault is retried.
    pub fn idempotent(mut self, tool: impl Into<String>) -> Self {
        self.idempotent.insert(tool.into());
        self
    }

    /// Takes the server's word for its tools (from `tools/list`): a
    /// `readOnlyHint` makes a tool a [`read`](Self::read), an
    /// `idempotentHint` [`idempotent`](Self::idempotent). Only for a server
    /// you trust: calling a write a read merges its concurrent calls.
    pub fn trust_annotations(mut self, tools: &[Tool]) -> Self {
        for tool in tools {
            let Some(a) = &tool.annotations else { continue };
            if a.read_only_hint == Some(true) {
                self.reads.insert(tool.name.to_string());
            } else if a.idempotent_hint == Some(true) {
                self.idempotent.insert(tool.name.to_string());
            }
        }
        self
    }

    /// The peer the gate sends through.
    pub fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// The admission layer the gate admits through.
    pub fn admission(&self) -> &Admission<S, C> {
        &self.admission
    }

    /// The [`CallSpec`] a call is admitted as: tool `"<server>/<tool>"`,
    /// the gate's credential and deadline, a write unless the tool is a
    /// read. Change it (a priority, a cost) and pass it to
    /// [`call`](Self::call).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(gate: backpressure::mcp::McpGate) {
    /// use backpressure::admission::Priority;
    /// use rmcp::model::CallToolRequestParams;
    /// let params = CallToolRequestParams::new("reindex");
    /// let spec = gate.spec(&params).priority(Priority::BACKGROUND);
    /// let answer = gate.call(spec, params).await;
    /// # drop(answer); }
    /// # let _ = f;
    /// ```
    pub fn spec(&self, params: &CallToolRequestParams) -> CallSpec {
        let tool = format!("{}/{}", self.server, params.name);
        let spec = CallSpec::new(tool, self.credential.clone()).deadline(self.deadline);
        let name = params.name.as_ref();
        if self.reads.contains(name) {
            spec
        } else if self.idempotent.contains(name) {
            spec.write().idempotent()
        } else {
            spec.write()
        }
    }
}

impl McpGate {
    /// The refusal as the tool result a model reads: `isError`, the
    /// [`Throttled`]'s sentence as text, and the `Throttled` itself as
    /// `structuredContent`. Also what an MCP server's tool handler returns
    /// when the API behind it refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use backpressure::mcp::McpGate;
    /// use backpressure::{Status, Throttled};
    /// use std::time::Duration;
    ///
    /// let t = Throttled::new(Status::RateLimited, "api_key", "wait for the key")
    ///     .with_retry_after(Duration::from_millis(1200));
    /// let result = McpGate::refusal(&t);
    /// assert_eq!(result.is_error, Some(true));
    /// assert_eq!(result.structured_content.unwrap()["retry_after_ms"], 1200);
    /// ```
    pub fn refusal(throttled: &Throttled) -> CallToolResult {
        let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
            "Not run now: {throttled}"
        ))]);
        result.structured_content = serde_json::to_value(throttled).ok();
        result
    }
}

impl<S, C> McpGate<S, C>
where
    S: Sleeper,
    C: Clock + Clone,
{
    /// Calls a tool through the gate, answering as rmcp does: a refusal is a
    /// tool result ([`refusal`](McpGate::refusal)); a fault past its retries
    /// is the `ServiceError` rmcp gave.
    ///
    /// # Examples
    ///
    /// See [`McpGate`].
    pub async fn call_tool(
        &self,
        params: CallToolRequestParams,
    ) -> Result<CallToolResult, ServiceError> {
        match self.call_result(params).await {
            CallResult::Done { value, .. } => Ok(value),
            CallResult::Throttled(refused) => Ok(McpGate::refusal(&refused)),
            CallResult::Failed { error, .. } => Err(service_error(error)),
            CallResult::Panicked { message } => Err(ServiceError::McpError(
                rmcp::ErrorData::internal_error(message, None),
            )),
        }
    }

    /// Calls a tool through the gate and answers as every seam does: a
    /// [`CallResult`] with the requests sent (0 for a joiner), a typed
    /// [`Throttled`], or the failure (`CallFailure::Status` for a 5xx at the
    /// transport, else the rmcp error).
    pub async fn call_result(
        &self,
        params: CallToolRequestParams,
    ) -> CallResult<CallToolResult, ServiceError> {
        let spec = self.spec(&params);
        self.call(spec, params).await
    }

    /// [`call_result`](Self::call_result) admitted as `spec` (from
    /// [`spec`](Self::spec), with a priority or costs). Only a read's
    /// spec (not [`write`](CallSpec::write)) coalesces.
    pub async fn call(
        &self,
        spec: CallSpec,
        params: CallToolRequestParams,
    ) -> CallResult<CallToolResult, ServiceError> {
        if spec.write {
            return self.run(&spec, &params).await.0;
        }
        // Same credential, tool and arguments: the same read.
        let arguments = serde_json::to_string(&params.arguments).unwrap_or_default();
        let key = ReadKey::new(&spec.tool, &spec.credential, &arguments);
        let deadline = Deadline::after(self.admission.clock().clone(), spec.deadline);
        let (spec, params) = (&spec, &params);
        let led = self
            .admission
            .coalesce(&self.flights, key, spec.deadline, |left| async move {
                let (own, sharing, running) = self.run(&spec.clone().deadline(left), params).await;
                let copy = match running {
                    Some(sent) => Share::InFlight(Copied::Running(sent)),
                    None => sharing.with(|| Some(Copied::Ended(own.clone()))),
                };
                (own, copy)
            })
            .await;
        match led {
            Joined::Own(own) => own,
            Joined::Copy(Copied::Ended(copy), provenance) => copy.into_copy(provenance),
            Joined::Copy(Copied::Running(sent), _) => {
                // The request its first caller gave up on: its success is
                // this caller's answer; anything else is not, and this caller
                // sends its own.
                let timer = || self.admission.sleeper().sleep(deadline.remaining());
                match crate::sleep::within(sent.success(), timer).await {
                    Some(Some(value)) => CallResult::Done {
                        value,
                        provenance: Provenance::Joined,
                        attempts: 0,
                    },
                    Some(None) => {
                        let left = deadline.remaining();
                        self.run(&spec.clone().deadline(left), params).await.0
                    }
                    None => CallResult::Throttled(joined_timed_out(spec.deadline)),
                }
            }
            Joined::TimedOut(refused) => CallResult::Throttled(refused),
        }
    }

    /// One call through the admission's attempt loop, what the calls that
    /// joined it may have of it, and a read's request still running after
    /// the call's deadline (for them).
    async fn run(
        &self,
        spec: &CallSpec,
        params: &CallToolRequestParams,
    ) -> (Outcome, Sharing, Option<exchange::Sent>) {
        let mut call = exchange::ToolCall::new(&self.peer, params, !spec.write);
        let ended = self
            .admission
            .drive(spec, spec.deadline, &self.retry, &mut call)
            .await;
        let sharing = ended.sharing();
        let running = match &ended {
            Ended::Throttled(t) if t.status == Status::TimedOut => call.still_running(),
            _ => None,
        };
        let result =
            ended.into_call_result(|result, failed| match (failed, call.status(), result) {
                (false, _, Ok(value)) => Ok(value),
                // A final answer that is an error: a JSON-RPC error.
                (false, _, Err(e)) => Err(CallFailure::Transport(Arc::new(e))),
                // A status the server answered: that status, as on the HTTP seams.
                (true, Some(status), _) => Err(CallFailure::Status { status }),
                (true, None, Err(e)) => Err(CallFailure::Transport(Arc::new(e))),
                (true, None, Ok(_)) => Err(CallFailure::Status { status: 503 }),
            });
        (result, sharing, running)
    }
}

/// A failure as the `ServiceError` rmcp would have returned: its own, or
/// a copy when shared by identical reads.
fn service_error(failure: CallFailure<ServiceError>) -> ServiceError {
    let transport = |error: Box<dyn std::error::Error + Send + Sync>| {
        let kind = core::any::TypeId::of::<McpGate>();
        ServiceError::TransportSend(DynamicTransportError::from_parts("mcp-gate", kind, error))
    };
    match failure {
        CallFailure::Transport(e) => match Arc::try_unwrap(e) {
            Ok(own) => own,
            Err(shared) => match &*shared {
                ServiceError::McpError(data) => ServiceError::McpError(data.clone()),
                other => transport(other.to_string().into()),
            },
        },
        CallFailure::Status { status } => transport(Box::new(HttpStatusError::new(status, None))),
    }
}

impl<S: Sleeper, C: Clock> core::fmt::Debug for McpGate<S, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("McpGate")
            .field("server", &self.server)
            .field("credential", &self.credential)
            .field("deadline", &self.deadline)
            .field("reads", &self.reads)
            .field("idempotent", &self.idempotent)
            .finish_non_exhaustive()
    }
}
