//! `--published-api-only`: the simulator as a Manager that serves only the
//! published Norsk Manager API (1.0.384), which a client built from the
//! published proto cannot tell from a real 1.0.384 Manager. Three things make
//! it so:
//!
//! - here, a call of an added RPC is answered `UNIMPLEMENTED`, as a gRPC
//!   server built from the published service definition answers a method it
//!   does not have, before it reaches the simulated Manager;
//! - `additions` removes the added fields and event variants from every
//!   message a published RPC receives or sends (the Manager service and its
//!   streams apply it);
//! - the simulated world shows what only an added event would have told (a
//!   worker's rejection, an interruption notice) the published way.

mod additions;

use std::sync::Arc;
use std::task::{Context, Poll};

pub(crate) use additions::{Published, StripError};

use super::server::Shared;
use crate::manager::extensions;

/// Which Manager API the simulator speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    /// The published API with the AutoManager additions.
    Full,
    /// The published API alone (`--published-api-only`).
    Published,
}

impl Api {
    /// `message` as this API carries it: whole, or without the additions.
    pub fn carry<M: Published>(self, message: M) -> Result<M, StripError> {
        match self {
            Api::Full => Ok(message),
            Api::Published => additions::strip(&message),
        }
    }
}

/// Wraps the Manager service so that only the published methods reach it
/// while the simulator speaks the published API alone.
#[derive(Clone)]
pub struct PublishedOnly<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// The [`tower::Layer`] of [`PublishedOnly`].
#[derive(Clone)]
pub(crate) struct PublishedOnlyLayer {
    /// The world whose API decides.
    pub shared: Arc<Shared>,
}

impl<S> tower::Layer<S> for PublishedOnlyLayer {
    type Service = PublishedOnly<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PublishedOnly {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The Manager method a request path names (`/norsk.api.manager.Manager/X`).
fn manager_method(path: &str) -> Option<&str> {
    path.strip_prefix("/norsk.api.manager.Manager/")
}

impl<S, B> tower::Service<axum::http::Request<B>> for PublishedOnly<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::Either<futures::future::Ready<Result<Self::Response, Self::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        match manager_method(request.uri().path()) {
            Some(method) if self.shared.lock().api() == Api::Published && !extensions::is_published(method) => {
                let status = tonic::Status::unimplemented(format!(
                    "unknown method {method} for service norsk.api.manager.Manager"
                ));
                futures::future::Either::Left(futures::future::ready(Ok(status.into_http())))
            }
            _ => futures::future::Either::Right(self.inner.call(request)),
        }
    }
}
