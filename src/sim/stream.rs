//! Manager's event streams. Each stream starts with the snapshot, taken
//! under the same lock as its subscription to the live broadcast, so no
//! event falls between the two or appears in both; then it forwards live
//! events. A stream ends with UNAVAILABLE when `drop-stream` is called or
//! when it falls too far behind (the client reconnects and gets a fresh
//! snapshot: an event is never silently skipped); it ends quietly when the
//! client goes away or the simulator shuts down. Serving the published API
//! only, every event leaves without its additions, and an event that is an
//! addition itself is not sent at all.

use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::published::Api;
use super::server::Shared;
use crate::manager::proto::common;
use crate::manager::proto::manager::{self as pb, norsk_status_event};

/// Snapshot events waiting to be read by a slow client before the stream
/// pushes back.
const STREAM_BUFFER: usize = 1024;

/// An event stream as the Manager service returns it.
pub type EventStream = ReceiverStream<Result<pb::EventStreamEvent, Status>>;
/// A status channel as the Manager service returns it.
pub type StatusStream = ReceiverStream<Result<pb::NorskStatusEvent, Status>>;

/// Opens an event stream: snapshot, `initial_data_complete`, live events.
pub(crate) fn open_event_stream(shared: &Shared, api: Api) -> EventStream {
    let (snapshot, mut live, mut dropped) = {
        let world = shared.lock();
        (world.snapshot_events(), world.subscribe(), shared.drop_signal())
    };
    let mut shutdown = shared.shutdown_signal();
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(async move {
        for event in snapshot {
            if !send(&tx, api, event).await {
                return;
            }
        }
        loop {
            tokio::select! {
                received = live.recv() => match received {
                    Ok(event) => {
                        if !send(&tx, api, pb::EventStreamEvent::clone(&event)).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        let why = format!(
                            "event stream fell {missed} events behind; reconnect for a fresh snapshot"
                        );
                        let _ = tx.send(Err(Status::unavailable(why))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = dropped.changed() => {
                    let why = "event stream dropped by the simulator (drop-stream)";
                    let _ = tx.send(Err(Status::unavailable(why))).await;
                    return;
                }
                _ = shutdown.changed() => return,
                _ = tx.closed() => return,
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Sends `event` as `api` carries it; an added event stripped to nothing is
/// skipped, as a Manager without it never had it to send. False when the
/// stream is over: the client left, or the event could not be stripped (the
/// stream then ends with that error rather than send an addition).
async fn send(tx: &mpsc::Sender<Result<pb::EventStreamEvent, Status>>, api: Api, event: pb::EventStreamEvent) -> bool {
    let had_event = event.event.is_some();
    match api.carry(event) {
        Ok(pb::EventStreamEvent { event: None }) if had_event => true,
        Ok(event) => tx.send(Ok(event)).await.is_ok(),
        Err(e) => {
            let _ = tx.send(Err(e.into())).await;
            false
        }
    }
}

/// Opens a status channel: `Hello` with the simulator's version, then
/// nothing until the client leaves or the simulator stops.
pub(crate) fn open_status_channel(shared: &Shared, api: Api) -> StatusStream {
    let mut shutdown = shared.shutdown_signal();
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let hello = pb::NorskStatusEvent {
            message: Some(norsk_status_event::Message::Hello(pb::Hello {
                version: Some(common::Version {
                    major_version: 1,
                    minor_version: 0,
                    build_number: 384,
                    branch_name: "sim".to_owned(),
                    label: concat!("norsk-auto-manager simulator ", env!("CARGO_PKG_VERSION")).to_owned(),
                }),
            })),
        };
        if tx.send(api.carry(hello).map_err(Status::from)).await.is_err() {
            return;
        }
        tokio::select! {
            _ = shutdown.changed() => {}
            _ = tx.closed() => {}
        }
    });
    ReceiverStream::new(rx)
}
