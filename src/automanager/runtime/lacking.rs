//! What Manager was found not to serve. A Manager that speaks only the
//! published API answers each AutoManager extension with `UNIMPLEMENTED`:
//! the first such answer for an RPC is said once, as a
//! `managerLacksExtension` notification (and an error log line) naming the
//! RPC and what it is needed for; from then on that RPC is tried again only
//! every [`MISSING_EXTENSION_RETRY`] (a call in between fails at once with
//! the same words, without reaching Manager), so an upgraded Manager is
//! noticed and an old one is not hammered. A success clears the mark.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::automanager::notification::Notification;
use crate::manager::client::RpcError;
use crate::manager::extensions;

/// How long after a missing extension answered `UNIMPLEMENTED` it is tried
/// again.
pub const MISSING_EXTENSION_RETRY: Duration = Duration::from_secs(300);

/// The extensions found missing, shared by the calls in flight.
#[derive(Clone)]
pub(super) struct Lacking {
    /// Each missing RPC and when it was last tried.
    tried: Arc<Mutex<BTreeMap<&'static str, Instant>>>,
    /// What [`super::handle::AutoManagerHandle::lacking_extensions`] reads.
    names: Arc<watch::Sender<BTreeSet<String>>>,
}

impl Lacking {
    pub(super) fn new() -> (Self, watch::Receiver<BTreeSet<String>>) {
        let (names, rx) = watch::channel(BTreeSet::new());
        let lacking = Self {
            tried: Arc::default(),
            names: Arc::new(names),
        };
        (lacking, rx)
    }

    /// The answer to give without calling Manager: `rpc` is known missing
    /// and was tried less than [`MISSING_EXTENSION_RETRY`] ago.
    pub(super) fn held_back(&self, rpc: &'static str) -> Option<RpcError> {
        let mut tried = self.tried.lock().unwrap_or_else(PoisonError::into_inner);
        let last = tried.get_mut(rpc)?;
        if last.elapsed() >= MISSING_EXTENSION_RETRY {
            // This call is the retry; it is held back again if it fails.
            *last = Instant::now();
            return None;
        }
        Some(RpcError {
            rpc,
            code: tonic::Code::Unimplemented,
            message: "not served by this Manager (not retried yet)".to_owned(),
        })
    }

    /// Records the outcome of a call of `rpc`; the notification to publish
    /// when it is the first sign that Manager lacks it.
    pub(super) fn observe(&self, rpc: &'static str, result: &Result<(), RpcError>) -> Option<Notification> {
        let mut tried = self.tried.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Err(e) if e.is_missing_extension() => {
                if tried.insert(rpc, Instant::now()).is_some() {
                    return None;
                }
                self.names.send_modify(|names| {
                    names.insert(rpc.to_owned());
                });
                let message = extensions::missing_message(rpc);
                tracing::error!(rpc, "{message}");
                Some(Notification::ManagerLacksExtension {
                    rpc: rpc.to_owned(),
                    needed_for: extensions::needed_for(rpc).to_owned(),
                    message,
                })
            }
            Ok(()) if tried.remove(rpc).is_some() => {
                self.names.send_modify(|names| {
                    names.remove(rpc);
                });
                tracing::info!(rpc, "Manager serves {rpc} now");
                None
            }
            _ => None,
        }
    }
}
