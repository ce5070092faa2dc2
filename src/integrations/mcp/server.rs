//! The server side (feature `mcp-server`): each `tools/call` an rmcp
//! server receives, admitted per client and tool before its handler runs.

use core::future::Future;
use core::pin::pin;
use core::task::Poll;
use core::time::Duration;
use std::borrow::Cow;
use std::sync::Arc;

#[allow(deprecated)] // `SubscribeRequestParams`, handed on.
use rmcp::model::*;
use rmcp::service::{NotificationContext, RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData, ServerHandler};

use super::McpGate;
use crate::admission::identity::credential_hash;
use crate::admission::{Admission, CallSpec};
use crate::clock::{Clock, DefaultClock};
use crate::sleep::{DefaultSleeper, Sleeper};

/// Who sent a request, as the credential its calls are admitted under.
type ClientOf = Arc<dyn Fn(&RequestContext<RoleServer>) -> String + Send + Sync>;

/// An rmcp server with a gate in front of its tools: each `tools/call` is
/// admitted through an [`Admission`] before the server's handler sees it,
/// as tool `<tool>` and credential `<client>`, with every stage the
/// admission has (per-tool slots, per-client quotas and weighted quotas,
/// priority lanes, queue bounds). Every other request and notification
/// goes to the server untouched.
///
/// * A **refusal** is the tool result a client gate reads as a limit: the
///   [`Throttled`](crate::Throttled) of [`McpGate::refusal`], `isError`,
///   with `retry_after_ms` in its `structuredContent`. The handler did not
///   run.
/// * A wait shorter than the admission's inline wait is slept; a longer
///   one, or one past [`deadline`](Self::deadline), is the refusal.
/// * A call the client cancels (`notifications/cancelled`) while it waits
///   leaves the queue at once.
/// * The **client** is, by default: over streamable HTTP, a hash of the
///   request's `Authorization` (else `x-api-key`, else `Mcp-Session-Id`)
///   header, never the secret itself, else `"anonymous"`; over stdio or
///   any transport without HTTP, `"local"` (one client per connection's
///   server). Name it yourself with [`client`](Self::client).
/// * A header is the client's word: a client that sends another key or
///   session gets another quota. Limits no client may escape are per tool
///   or global, or name the client from your authentication with
///   [`client`](Self::client).
/// * The slot is held until the handler returns.
///
/// # Examples
///
/// ```
/// use backpressure::admission::{Admission, SlotPolicy};
/// use backpressure::mcp::ServerGate;
/// use backpressure::Quota;
/// use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
/// use rmcp::model::{ServerCapabilities, ServerConfig};
/// use rmcp::service::{RequestContext, RoleServer};
/// use rmcp::{ErrorData, ServerHandler, ServiceExt};
/// use std::num::NonZeroU32;
///
/// #[derive(Clone)]
/// struct Search;
///
/// impl ServerHandler for Search {
///     fn get_info(&self) -> ServerConfig {
///         ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
///     }
///     async fn call_tool(
///         &self,
///         request: CallToolRequestParams,
///         _: RequestContext<RoleServer>,
///     ) -> Result<CallToolResponse, ErrorData> {
///         Ok(CallToolResult::success(vec![ContentBlock::text(request.name.to_string())]).into())
///     }
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // Two `search` calls at a time, and 10 calls a second per client.
/// let admission = Admission::builder()
///     .tool("search", 2, SlotPolicy::Wait)
///     .default_quota(Quota::per_second(NonZeroU32::new(10).unwrap()))
///     .build();
/// let (client_io, server_io) = tokio::io::duplex(1 << 16);
/// let server = tokio::spawn(ServerGate::new(admission, Search).serve(server_io));
/// let client = ().serve(client_io).await.unwrap();
/// let result = client.peer().call_tool(CallToolRequestParams::new("search")).await.unwrap();
/// assert_ne!(result.is_error, Some(true));
/// # drop(client); let _ = server.await;
/// # });
/// ```
#[derive(Clone)]
pub struct ServerGate<H, S: Sleeper = DefaultSleeper, C: Clock = DefaultClock> {
    inner: H,
    admission: Admission<S, C>,
    client: ClientOf,
    deadline: Duration,
}

impl<H, S: Sleeper, C: Clock> ServerGate<H, S, C> {
    /// The gate over `server`, with the client named as the type's docs
    /// say and a 30 s deadline. For streamable HTTP, clone one gate into
    /// the service factory: its clones share the admission.
    ///
    /// # Examples
    ///
    /// See [`ServerGate`].
    pub fn new(admission: Admission<S, C>, server: H) -> Self {
        ServerGate {
            inner: server,
            admission,
            client: Arc::new(client_of),
            deadline: Duration::from_secs(30),
        }
    }

    /// Names the client a request came from: the credential its calls are
    /// admitted under (logged and shown in stats, so never a secret).
    pub fn client(
        mut self,
        client: impl Fn(&RequestContext<RoleServer>) -> String + Send + Sync + 'static,
    ) -> Self {
        self.client = Arc::new(client);
        self
    }

    /// The longest a call waits for admission.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
}

/// The default client: see [`ServerGate`].
fn client_of(context: &RequestContext<RoleServer>) -> String {
    let Some(http) = context.extensions.get::<http::request::Parts>() else {
        return "local".to_string();
    };
    ["authorization", "x-api-key", "mcp-session-id"]
        .iter()
        .find_map(|name| http.headers.get(*name))
        .map_or_else(
            || "anonymous".to_string(),
            |v| credential_hash(v.as_bytes()),
        )
}

/// Every other method of [`ServerHandler`], handed to the server as is.
macro_rules! to_server {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {$(
        async fn $name(&self, $($arg: $ty),*) -> $out {
            self.inner.$name($($arg),*).await
        }
    )*};
}

#[allow(deprecated)] // `subscribe` is handed on like the rest.
impl<H, S, C> ServerHandler for ServerGate<H, S, C>
where
    H: ServerHandler,
    S: Sleeper<Sleep: Send> + Send + Sync + 'static,
    C: Clock + Clone + Send + Sync + 'static,
{
    /// Admits the call, or refuses it as the tool result a client reads.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let spec =
            CallSpec::new(request.name.as_ref(), (self.client)(&context)).deadline(self.deadline);
        let admitted = {
            let mut admit = pin!(self.admission.admit(&spec));
            let mut cancelled = pin!(context.ct.cancelled());
            core::future::poll_fn(|cx| match admit.as_mut().poll(cx) {
                Poll::Ready(admitted) => Poll::Ready(Some(admitted)),
                Poll::Pending => cancelled.as_mut().poll(cx).map(|()| None),
            })
            .await
        };
        match admitted {
            Some(Ok(ticket)) => {
                let answer = self.inner.call_tool(request, context).await;
                drop(ticket);
                answer
            }
            Some(Err(refused)) => Ok(McpGate::refusal(&refused).into()),
            None => Err(ErrorData::internal_error(
                "cancelled by the client while it waited for admission",
                None,
            )),
        }
    }

    to_server! {
        ping(c: RequestContext<RoleServer>) -> Result<(), ErrorData>;
        initialize(r: InitializeRequestParams, c: RequestContext<RoleServer>) -> Result<InitializeResult, ErrorData>;
        discover(c: RequestContext<RoleServer>) -> Result<DiscoverResult, ErrorData>;
        complete(r: CompleteRequestParams, c: RequestContext<RoleServer>) -> Result<CompleteResult, ErrorData>;
        set_level(r: SetLevelRequestParams, c: RequestContext<RoleServer>) -> Result<(), ErrorData>;
        get_prompt(r: GetPromptRequestParams, c: RequestContext<RoleServer>) -> Result<GetPromptResponse, ErrorData>;
        list_prompts(r: Option<PaginatedRequestParams>, c: RequestContext<RoleServer>) -> Result<ListPromptsResult, ErrorData>;
        list_resources(r: Option<PaginatedRequestParams>, c: RequestContext<RoleServer>) -> Result<ListResourcesResult, ErrorData>;
        list_resource_templates(r: Option<PaginatedRequestParams>, c: RequestContext<RoleServer>) -> Result<ListResourceTemplatesResult, ErrorData>;
        read_resource(r: ReadResourceRequestParams, c: RequestContext<RoleServer>) -> Result<ReadResourceResponse, ErrorData>;
        listen(c: SubscriptionContext) -> Result<(), ErrorData>;
        subscribe(r: SubscribeRequestParams, c: RequestContext<RoleServer>) -> Result<(), ErrorData>;
        unsubscribe(r: UnsubscribeRequestParams, c: RequestContext<RoleServer>) -> Result<(), ErrorData>;
        list_tools(r: Option<PaginatedRequestParams>, c: RequestContext<RoleServer>) -> Result<ListToolsResult, ErrorData>;
        on_custom_request(r: CustomRequest, c: RequestContext<RoleServer>) -> Result<CustomResult, ErrorData>;
        on_cancelled(n: CancelledNotificationParam, c: NotificationContext<RoleServer>) -> ();
        on_progress(n: ProgressNotificationParam, c: NotificationContext<RoleServer>) -> ();
        on_initialized(c: NotificationContext<RoleServer>) -> ();
        on_roots_list_changed(c: NotificationContext<RoleServer>) -> ();
        on_custom_notification(n: CustomNotification, c: NotificationContext<RoleServer>) -> ();
        get_task(r: GetTaskParams, c: RequestContext<RoleServer>) -> Result<GetTaskResult, ErrorData>;
        update_task(r: UpdateTaskParams, c: RequestContext<RoleServer>) -> Result<(), ErrorData>;
        cancel_task(r: CancelTaskParams, c: RequestContext<RoleServer>) -> Result<(), ErrorData>;
        list_skills(r: Option<PaginatedRequestParams>, c: RequestContext<RoleServer>) -> Result<ListSkillsResult, ErrorData>;
        get_skill(r: GetSkillRequestParams, c: RequestContext<RoleServer>) -> Result<GetSkillResult, ErrorData>;
        read_resource_directory(r: ReadResourceDirectoryRequestParams, c: RequestContext<RoleServer>) -> Result<ReadResourceDirectoryResult, ErrorData>;
    }

    fn negotiate_initialize(
        &self,
        request: &InitializeRequestParams,
    ) -> Result<InitializeResult, ErrorData> {
        self.inner.negotiate_initialize(request)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        self.inner.supported_protocol_versions()
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.inner.accepted_subscription_filter(requested)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner.get_tool(name)
    }

    fn get_info(&self) -> ServerConfig {
        self.inner.get_info()
    }
}

impl<H, S: Sleeper, C: Clock> core::fmt::Debug for ServerGate<H, S, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ServerGate")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}
