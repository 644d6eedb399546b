//! Publishing what the store's outbox holds, and events that have no request to hang on.
//! Shared by every function, so each publishes the same way: after the commit, marking
//! sent only what the bus accepted, keeping the rest for the next run.

use tracing::warn;

use crate::domain::events::{RequestRejected, outbound};
use crate::domain::request::FieldError;
use crate::ports::{EventSink, OutboundEvent, PortError, Store};

/// How many unsent items one run publishes at most.
pub const FLUSH_LIMIT: usize = 100;

/// How long a run holds the outbox items it publishes: longer than any function's timeout, so
/// a run that dies mid-publish leaves them to the next run after this.
pub const CLAIM_FOR: chrono::Duration = chrono::Duration::minutes(5);

/// Publishes unsent outbox items and marks the accepted ones sent. Returns how many went.
/// Each item is claimed first, so two runs flushing at once do not both publish it; an item
/// whose publish fails is given back for the next run.
pub async fn flush<S: Store, E: EventSink>(store: &S, sink: &E) -> Result<usize, PortError> {
    let unsent = store.unsent_outbox(FLUSH_LIMIT).await?;
    if unsent.is_empty() {
        return Ok(0);
    }
    // Claims are between concurrent runs, so they use the wall clock, not the scenario's.
    let now = chrono::Utc::now();
    let mut items = Vec::new();
    for item in unsent {
        if store
            .claim_outbox(
                &item.request_id,
                &item.event.event_key,
                now + CLAIM_FOR,
                now,
            )
            .await?
        {
            items.push(item);
        }
    }
    if items.is_empty() {
        return Ok(0);
    }
    let batch: Vec<OutboundEvent> = items.iter().map(|i| i.event.clone()).collect();
    let report = match sink.publish(&batch).await {
        Ok(r) => r,
        Err(e) => {
            for item in &items {
                store
                    .release_outbox_claim(&item.request_id, &item.event.event_key)
                    .await?;
            }
            return Err(e);
        }
    };
    for item in &items {
        if report.sent.contains(&item.event.event_key) {
            store
                .mark_sent(&item.request_id, &item.event.event_key)
                .await?;
        } else {
            store
                .release_outbox_claim(&item.request_id, &item.event.event_key)
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
    publish_now(sink, &[outbound(&detail)]).await
}

/// Publishes answers that change no stored request (a rejection, a refusal, a notice), so
/// no outbox carries them: a failed entry fails the invocation, and EventBridge delivers the
/// causing event again.
pub async fn publish_now<E: EventSink>(
    sink: &E,
    events: &[crate::ports::OutboundEvent],
) -> Result<(), PortError> {
    let report = sink.publish(events).await?;
    match report.failed.into_iter().next() {
        None => Ok(()),
        Some((_, code, message)) => Err(PortError::Transient {
            service: "events",
            code,
            message,
        }),
    }
}
