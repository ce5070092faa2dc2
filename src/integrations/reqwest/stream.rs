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
    mut response: Response,
    ticket: Ticket<S, C>,
    usage: Option<Arc<EventUsage>>,
    sent: u32,
) -> Response
where
    S: Sleeper + Send + Sync + 'static,
    C: Clock + Send + Sync + 'static,
{
    let mut head = super::usage::Head::take(&mut response);
    head.extensions.insert(Attempts(sent));
    let body = http::Response::<reqwest::Body>::from(response).into_body();
    let body = TicketBody::new(body, Some(ticket), usage);
    head.response(reqwest::Body::wrap(body))
}
