//! Publishing what the store's outbox holds, and events that have no request to hang on.
//! Shared by every function, so each publishes the same way: after the commit, marking
//! sent only what the bus accepted, keeping the rest for the next run.

use tracing::warn;

use crate::domain::events::RequestRejected;
use crate::domain::notices::{Notice, announced};
use crate::domain::request::FieldError;
use crate::ports::{Agenda, EventSink, NoticeSink, OutboundEvent, PortError, PublishReport, Store};

/// How many unsent items one run publishes at most.
pub const FLUSH_LIMIT: usize = 100;

/// How long a run holds the outbox items it publishes: longer than any function's timeout, so
/// a run that dies mid-publish leaves them to the next run after this.
pub const CLAIM_FOR: chrono::Duration = chrono::Duration::minutes(5);

/// What a run has read of the outbox, and how many writes its store had made when it
/// started: [`flush`] reads the outbox again only when the run may have added to it.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    writes_before: u64,
    agenda: Option<&'a Agenda>,
    /// The handler's `now`: claims are timed by it (ARCHITECTURE §8.12).
    now: chrono::DateTime<chrono::Utc>,
}

impl<'a> Run<'a> {
    /// A run starting at `now`, before any write: the store starts its run too
    /// ([`Store::begin_run`]).
    pub fn start<S: Store>(store: &S, now: chrono::DateTime<chrono::Utc>) -> Run<'static> {
        store.begin_run(now);
        Run {
            writes_before: store.outbox_writes(),
            agenda: None,
            now,
        }
    }

    /// The run read `agenda` (which holds the unsent outbox as of then).
    pub fn with_agenda(self, agenda: Option<&'a Agenda>) -> Run<'a> {
        Run { agenda, ..self }
    }
}

/// Publishes unsent outbox items and marks the accepted ones sent. Returns how many went.
/// Each item is claimed first, so two runs flushing at once do not both publish it; an item
/// whose publish fails is given back for the next run.
///
/// A run that wrote reads the outbox again (what it wrote is in it); one that did not
/// publishes what its agenda showed, with no read; one that neither wrote nor read an agenda
/// (an event it had nothing to do for) leaves the outbox to the next scheduled run.
pub async fn flush<S: Store, E: EventSink>(
    store: &S,
    sink: &E,
    run: Run<'_>,
) -> Result<usize, PortError> {
    let unsent = if store.outbox_writes() != run.writes_before {
        store.unsent_outbox(FLUSH_LIMIT).await?
    } else if let Some(a) = run.agenda {
        a.outbox.iter().take(FLUSH_LIMIT).cloned().collect()
    } else {
        Vec::new()
    };
    if unsent.is_empty() {
        return Ok(0);
    }
    // Claims are between concurrent runs. The run's own `now` times them: in production the
    // wall clock's, and where the clock stands still while an invocation runs (a simulation),
    // the same instant for every run in flight, so a claim still holds until time moves on.
    let now = run.now;
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

/// The bus and the notices topic as one sink (ARCHITECTURE §9.2): each event goes to the
/// bus and then, once the bus took it, its notice to the topic. An event counts as sent only
/// when both took it; otherwise the outbox keeps it and the next run sends both again under
/// the same `event_key` (a consumer drops the duplicate event; the topic is told once more).
/// The bus goes first: of the two, only its duplicates can be dropped by their reader.
#[derive(Debug, Clone)]
pub struct Announcing<E, N> {
    pub bus: E,
    pub topic: N,
}

impl<E: EventSink, N: NoticeSink> EventSink for Announcing<E, N> {
    async fn publish(&self, events: &[OutboundEvent]) -> Result<PublishReport, PortError> {
        // Boxed: each handler's future holds this one, and the two publishes would otherwise
        // sit inline in it (an in-process flow's whole lifecycle runs on one test thread).
        let mut report = Box::pin(self.bus.publish(events)).await?;
        let noticed: Vec<(String, Notice)> = events
            .iter()
            .filter(|e| report.sent.contains(&e.event_key))
            .filter_map(|e| e.notice.clone().map(|n| (e.event_key.clone(), n)))
            .collect();
        if noticed.is_empty() {
            return Ok(report);
        }
        let told = match Box::pin(self.topic.notify(&noticed)).await {
            Ok(r) => r,
            Err(e) => PublishReport {
                sent: Vec::new(),
                failed: noticed
                    .iter()
                    .map(|(k, _)| {
                        (
                            k.clone(),
                            e.code().unwrap_or("NoticeFailed").to_string(),
                            e.to_string(),
                        )
                    })
                    .collect(),
            },
        };
        report
            .sent
            .retain(|k| !noticed.iter().any(|(n, _)| n == k) || told.sent.contains(k));
        // (`flush` logs each failed entry, and the adapter each refused notice.)
        report.failed.extend(told.failed);
        Ok(report)
    }
}

/// Publishes a `Capacity Request Rejected` for an inbound event we will not act on (bad
/// source, bad detail, oversize). There is no stored request to carry an outbox, so a
/// publish failure fails the invocation and EventBridge delivers the event again.
pub async fn reject<E: EventSink>(
    sink: &E,
    event_id: &str,
    source: &str,
    request_id: Option<String>,
    team: Option<&str>,
    problems: Vec<FieldError>,
) -> Result<(), PortError> {
    let detail = RequestRejected {
        event_key: format!("rejected:{event_id}"),
        request_id,
        source: source.to_string(),
        event_id: event_id.to_string(),
        problems,
    };
    publish_now(sink, &[announced(team, &detail)]).await
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
