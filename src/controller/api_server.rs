//! Reaching the Kubernetes API server: how every watch retries when it
//! cannot ([`watch_backoff`]), and what the operator says when the API
//! server is gone. The client the operator runs with ([`client`]) notes the
//! outcome of every request: an outage is said once, when the first request
//! finds no API server, and once more when a request reaches it again, with
//! how long it lasted — never once per attempt (kube's own line per failed
//! request is off by default, see `cli::operator`). Nothing here retries or
//! decides: each caller retries on its own backoff.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use kube::client::ClientBuilder;
use kube::runtime::controller::{Config, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::backoff::{self, Backoff};

/// A watch's first retry after a failure.
const WATCH_FIRST_RETRY: Duration = Duration::from_millis(250);
/// A watch's longest wait between retries: it bounds how long after the API
/// server returns a change is noticed (kube's default, 30 s, left a new
/// Bundle unnoticed for half a minute after an outage), and at one request
/// per watch every few seconds a dead API server costs nothing.
const WATCH_MAX_RETRY: Duration = Duration::from_secs(4);

/// How every watch of the operator retries when the API server fails it:
/// from [`WATCH_FIRST_RETRY`], doubling, capped at [`WATCH_MAX_RETRY`],
/// jittered (the operator's watches, and its replicas', retry apart), and
/// started over by the first event the watch delivers again. A watch
/// without one retries at once, forever: one outage made a leader spin a
/// whole core on 8,000 requests a second.
pub fn watch_backoff() -> Backoff {
    Backoff::new(WATCH_FIRST_RETRY, WATCH_MAX_RETRY).with_jitter(backoff::seed())
}

/// A controller of `api`'s objects `config` selects, its watch retrying on
/// [`watch_backoff`], each object reconciled at most once per `debounce`.
pub fn controller<K>(api: Api<K>, config: watcher::Config, debounce: Duration) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    Controller::new(api, config)
        .trigger_backoff(watch_backoff())
        .with_config(Config::default().debounce(debounce))
}

/// A store of `api`'s objects `config` selects, and the events of the watch
/// that keeps it (retrying on [`watch_backoff`]); the store follows only
/// while the events are polled.
pub fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + use<K>,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let events = reflector::reflector(writer, watcher(api, config).backoff(watch_backoff()));
    (store, events)
}

/// Whether `error` (or what it was caused by) is a request that found no
/// API server: the outage is said once by the client, so whoever meets it
/// need not say it again (logs it at debug level).
pub fn unreachable(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |e| e.source()).any(|e| {
        matches!(
            e.downcast_ref::<kube::Error>(),
            Some(kube::Error::Service(_) | kube::Error::HyperError(_))
        )
    })
}

/// A client for `config` that says when the API server becomes unreachable
/// and when it is back (see [`Reachability`]).
pub fn client(config: kube::Config) -> Result<Client, kube::Error> {
    let layer = NoteReachability(Arc::new(Mutex::new(Reachability::default())));
    Ok(ClientBuilder::try_from(config)?.with_layer(&layer).build())
}

/// What one request's outcome changes in what the operator has said.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change {
    /// The first request to find no API server: an outage starts.
    Unreachable,
    /// The first request to reach it again, after an outage of `lasted`.
    Reachable { lasted: Duration },
}

/// Whether the API server was reachable at the last request, and since when
/// it has not been: a request that reached it ends an outage, one that
/// found no server (no answer at all: refused, reset, timed out — an answer
/// with an error status is the API server answering) starts one.
#[derive(Clone, Debug, Default)]
pub struct Reachability {
    /// When the outage under way started.
    unreachable_since: Option<Instant>,
}

impl Reachability {
    /// Notes a request that `reached` the API server (or not) at `now`; what
    /// to say, on a change only.
    pub fn note(&mut self, reached: bool, now: Instant) -> Option<Change> {
        match (reached, self.unreachable_since) {
            (false, None) => {
                self.unreachable_since = Some(now);
                Some(Change::Unreachable)
            }
            (true, Some(since)) => {
                self.unreachable_since = None;
                Some(Change::Reachable {
                    lasted: now.saturating_duration_since(since),
                })
            }
            _ => None,
        }
    }
}

/// The layer noting every request's outcome.
struct NoteReachability(Arc<Mutex<Reachability>>);

impl<S> tower::Layer<S> for NoteReachability {
    type Service = Noted<S>;

    fn layer(&self, inner: S) -> Noted<S> {
        Noted {
            inner,
            reachability: self.0.clone(),
        }
    }
}

/// A service whose requests' outcomes are noted.
#[derive(Clone)]
struct Noted<S> {
    inner: S,
    reachability: Arc<Mutex<Reachability>>,
}

impl<S, Request> tower::Service<Request> for Noted<S>
where
    S: tower::Service<Request>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: std::fmt::Display + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let reachability = self.reachability.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let result = answer.await;
            let change = reachability
                .lock()
                // A poisoned lock still holds a usable time: it is replaced whole.
                .unwrap_or_else(PoisonError::into_inner)
                .note(result.is_ok(), Instant::now());
            match (change, &result) {
                (Some(Change::Unreachable), Err(error)) => tracing::warn!(
                    %error,
                    "Kubernetes API server unreachable: every watch, read, write and the Lease retry with backoff"
                ),
                (Some(Change::Reachable { lasted }), _) => tracing::info!(
                    outage_s = (lasted.as_secs_f64() * 10.0).round() / 10.0,
                    "Kubernetes API server reachable again"
                ),
                _ => {}
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_said_when_it_starts_and_when_it_ends_with_its_length_not_per_request() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut r = Reachability::default();
        assert_eq!(r.note(true, at(0)), None, "reachable from the start: nothing to say");
        assert_eq!(r.note(false, at(1)), Some(Change::Unreachable));
        for s in 2..21 {
            assert_eq!(r.note(false, at(s)), None, "a retry during the outage says nothing");
        }
        assert_eq!(
            r.note(true, at(21)),
            Some(Change::Reachable {
                lasted: Duration::from_secs(20)
            })
        );
        assert_eq!(r.note(true, at(22)), None);
        assert_eq!(
            r.note(false, at(30)),
            Some(Change::Unreachable),
            "a second outage is said again"
        );
    }

    #[test]
    fn a_failure_to_reach_the_api_server_is_told_apart_however_deep_it_is_wrapped() {
        #[derive(Debug, thiserror::Error)]
        #[error("failed to write the status of Bundle a/b: {source}")]
        struct Wrapped {
            source: kube::Error,
        }
        let refused = Wrapped {
            source: kube::Error::Service("client error (Connect)".into()),
        };
        assert!(unreachable(&refused));
        let answered = Wrapped {
            source: kube::Error::Api(
                kube::core::Status::failure("forbidden", "Forbidden")
                    .with_code(403)
                    .boxed(),
            ),
        };
        assert!(!unreachable(&answered), "an API server that answers is reachable");
    }

    #[test]
    fn a_watch_retries_within_seconds_of_the_api_server_returning() {
        let mut b = watch_backoff();
        let delays: Vec<_> = (0..30).map(|_| b.next_delay()).collect();
        assert!(delays.iter().all(|d| *d <= WATCH_MAX_RETRY));
        assert!(delays[0] <= WATCH_FIRST_RETRY);
        // Twenty seconds of failures: at most a few requests a second, and
        // the next look is never more than the cap away.
        let mut elapsed = Duration::ZERO;
        let mut requests = 0;
        for d in &delays {
            if elapsed > Duration::from_secs(20) {
                break;
            }
            elapsed += *d;
            requests += 1;
        }
        assert!(requests <= 20, "{requests} requests in 20 s");
    }
}
