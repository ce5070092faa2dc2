//! When [`AdmissionLayer`](super::AdmissionLayer) gives a call's ticket
//! back: with the response head ([`AtHead`]) or at the body's end
//! ([`AtBodyEnd`]).

#[cfg(feature = "http")]
use std::sync::Arc;

use crate::admission::Ticket;
use crate::clock::Clock;
#[cfg(feature = "http")]
use crate::integrations::ticket_body::{EventUsage, TicketBody};
use crate::sleep::Sleeper;

mod sealed {
    pub trait Sealed {}
}

/// When the layer releases a call's ticket, and the response type that
/// follows. Sealed: the layer's future relies on what these two do.
pub trait Release<Resp, Sl: Sleeper, C: Clock>: sealed::Sealed {
    /// What the caller of the layer gets.
    type Response;

    /// `response`, with the call's ticket (`None` for a refusal answered
    /// as a response) released now or carried on.
    fn release(&self, response: Resp, ticket: Option<Ticket<Sl, C>>) -> Self::Response;
}

/// The ticket is released when the response head is ready (the default):
/// a body still being read holds no slot.
#[derive(Clone, Copy, Debug, Default)]
pub struct AtHead;

impl sealed::Sealed for AtHead {}

impl<Resp, Sl: Sleeper, C: Clock> Release<Resp, Sl, C> for AtHead {
    type Response = Resp;

    #[inline]
    fn release(&self, response: Resp, ticket: Option<Ticket<Sl, C>>) -> Resp {
        drop(ticket);
        response
    }
}

/// The ticket travels in the `http::Response`'s body, a
/// [`TicketBody`], until the body ends, fails or is dropped (see
/// [`AdmissionLayer::hold_bodies`](super::AdmissionLayer::hold_bodies)).
#[cfg(feature = "http")]
#[derive(Clone, Default)]
pub struct AtBodyEnd {
    pub(super) usage: Option<Arc<EventUsage>>,
}

#[cfg(feature = "http")]
impl sealed::Sealed for AtBodyEnd {}

#[cfg(feature = "http")]
impl<B, Sl: Sleeper, C: Clock> Release<http::Response<B>, Sl, C> for AtBodyEnd {
    type Response = http::Response<TicketBody<B, Sl, C>>;

    fn release(
        &self,
        response: http::Response<B>,
        ticket: Option<Ticket<Sl, C>>,
    ) -> Self::Response {
        response.map(|body| TicketBody::new(body, ticket, self.usage.clone()))
    }
}

#[cfg(feature = "http")]
impl core::fmt::Debug for AtBodyEnd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AtBodyEnd")
            .field("reads_usage", &self.usage.is_some())
            .finish()
    }
}
