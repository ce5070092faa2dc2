//! The rate layers' response future: the inner future, or a refusal
//! handed out at the first poll.

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use super::BoxError;
use crate::throttled::{Status, Throttled};

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`]: the inner service's future,
    /// or a refusal answered without calling it.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    #[derive(Debug)]
    pub struct LimitFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    #[derive(Debug)]
    enum State<F> {
        // The inner service was called.
        Inner {
            #[pin]
            future: F,
        },
        // Refused; the error is handed out at the first poll.
        Refused {
            error: Option<Box<Throttled>>,
        },
    }
}

impl<F> LimitFuture<F> {
    pub(crate) fn inner(future: F) -> Self {
        LimitFuture {
            state: State::Inner { future },
        }
    }

    pub(crate) fn refused(t: Throttled) -> Self {
        Self::refused_boxed(Box::new(t))
    }

    /// A refusal already boxed: a thin pointer, so the future is no wider than
    /// the inner one.
    pub(crate) fn refused_boxed(error: Box<Throttled>) -> Self {
        LimitFuture {
            state: State::Refused { error: Some(error) },
        }
    }
}

impl<F, T, E> Future for LimitFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => future.poll(cx).map_err(Into::into),
            StateProj::Refused { error } => {
                Poll::Ready(Err(error.take().unwrap_or_else(polled_after_refusal)))
            }
        }
    }
}

/// A refused `LimitFuture` polled again: an error rather than a panic.
/// Out of line, so the future's `poll` stays small enough to inline.
#[cold]
#[inline(never)]
fn polled_after_refusal() -> Box<Throttled> {
    Box::new(Throttled::new(
        Status::RateLimited,
        "rate",
        "polled after completion",
    ))
}
