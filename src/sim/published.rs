//! `--published-api-only`: the simulator as a Manager that serves only the
//! published Norsk Manager API (1.0.384). A call of an AutoManager extension
//! is answered `UNIMPLEMENTED`, as a gRPC server built from the published
//! service definition answers a method it does not have, before it reaches
//! the simulated Manager; the published methods are served as usual.

use std::task::{Context, Poll};

use crate::manager::extensions;

/// Wraps the Manager service so that only the published methods reach it.
#[derive(Clone, Debug)]
pub struct PublishedOnly<S> {
    inner: S,
    enabled: bool,
}

/// The [`tower::Layer`] of [`PublishedOnly`].
#[derive(Clone, Copy, Debug)]
pub struct PublishedOnlyLayer {
    /// Off: every method is served.
    pub enabled: bool,
}

impl<S> tower::Layer<S> for PublishedOnlyLayer {
    type Service = PublishedOnly<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PublishedOnly {
            inner,
            enabled: self.enabled,
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
            Some(method) if self.enabled && !extensions::is_published(method) => {
                let status = tonic::Status::unimplemented(format!(
                    "unknown method {method} for service norsk.api.manager.Manager"
                ));
                futures::future::Either::Left(futures::future::ready(Ok(status.into_http())))
            }
            _ => futures::future::Either::Right(self.inner.call(request)),
        }
    }
}
