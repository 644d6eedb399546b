//! Publishing what the store's outbox holds, and events that have no request to hang on.
//! Shared by every function, so each publishes the same way: after the commit, marking
//! sent only what the bus accepted, keeping the rest for the next run.

use tracing::warn;

use crate::domain::events::{RequestRejected, outbound};
use crate::domain::request::FieldError;
use crate::ports::{EventSink, OutboundEvent, PortError, Store};

/// How many unsent items one run publishes at most.
pub const FLUSH_LIMIT: usize = 100;

/// Publishes unsent outbox items and marks the accepted ones sent. Returns how many went.
pub async fn flush<S: Store, E: EventSink>(store: &S, sink: &E) -> Result<usize, PortError> {
    let items = store.unsent_outbox(FLUSH_LIMIT).await?;
    if items.is_empty() {
        return Ok(0);
    }
    let batch: Vec<OutboundEvent> = items.iter().map(|i| i.event.clone()).collect();
    let report = sink.publish(&batch).await?;
    for item in &items {
        if report.sent.contains(&item.event.event_key) {
            store
                .mark_sent(&item.request_id, &item.event.event_key)
                .await?;
        }
    }
    for (key, code, message) in &report.failed {
        warn!(event_key = %key, code = %code, message = %message, "event not accepted; kept in the outbox");
    }
    Ok(report.sent.len())
}

/// Publishes a `Capacity Request Rejected` for an inbound event we will not act on (bad
/// source, bad detail, oversize). There is no stored request to carry an outbox, so a
/// publish failure fails the invocation and EventBridge delivers the event again.
pub async fn reject<E: EventSink>(
    sink: &E,
    event_id: &str,
    source: &str,
    request_id: Option<String>,
    problems: Vec<FieldError>,
) -> Result<(), PortError> {
    let detail = RequestRejected {
        event_key: format!("rejected:{event_id}"),
        request_id,
        source: source.to_string(),
        event_id: event_id.to_string(),
        problems,
    };
    let report = sink.publish(&[outbound(&detail)]).await?;
    match report.failed.into_iter().next() {
        None => Ok(()),
        Some((_, code, message)) => Err(PortError::Transient {
            service: "events",
            code,
            message,
        }),
    }
}
