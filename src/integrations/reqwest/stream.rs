//! A streamed reply keeps its call's ticket until the body is read to its
//! end or dropped; the usage the stream reports settles the estimate.

use std::sync::Arc;

use reqwest::Response;

use crate::admission::Ticket;
use crate::clock::Clock;
pub(super) use crate::integrations::ticket_body::EventUsage;
use crate::integrations::ticket_body::TicketBody;
use crate::retry::Attempts;
use crate::sleep::Sleeper;

/// `response` with its body holding `ticket` (and reading `usage` from
/// its events), and the requests sent as its `Attempts`.
pub(super) fn hold<S, C>(
    response: Response,
    ticket: Ticket<S, C>,
    usage: Option<Arc<EventUsage>>,
    sent: u32,
) -> Response
where
    S: Sleeper + Send + Sync + 'static,
    C: Clock + Send + Sync + 'static,
{
    use reqwest::ResponseBuilderExt;
    let url = response.url().clone();
    let (mut parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    let body = TicketBody::new(body, Some(ticket), usage);
    parts.extensions.insert(Attempts(sent));
    let mut rebuilt = http::Response::builder()
        .status(parts.status)
        .version(parts.version)
        .url(url)
        .body(reqwest::Body::wrap(body))
        .expect("the status and version came from a response");
    *rebuilt.headers_mut() = core::mem::take(&mut parts.headers);
    rebuilt.extensions_mut().extend(parts.extensions);
    Response::from(rebuilt)
}
