//! An event sink that records what was published, and can refuse entries or whole calls
//! the way `PutEvents` does (a 200 with failed entries, or an error).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::{Fault, lock};
use crate::ports::{EventSink, OutboundEvent, PortError, PublishReport};

#[derive(Debug, Default)]
struct State {
    /// Every event the bus accepted, in order (a re-published key appears again).
    published: Vec<OutboundEvent>,
    /// Every call, with all the events it carried.
    calls: Vec<Vec<OutboundEvent>>,
    /// Whole-call faults, consumed one per call.
    call_faults: VecDeque<Fault>,
    /// Keys refused on every publish until cleared: (code, message).
    refuse_keys: BTreeMap<String, (String, String)>,
    /// The next entries refused, whatever their key: (code, message).
    refuse_next: VecDeque<(String, String)>,
}

/// Records published events; clones share the record.
#[derive(Debug, Clone, Default)]
pub struct RecordingEvents {
    state: Arc<Mutex<State>>,
}

impl RecordingEvents {
    pub fn new() -> RecordingEvents {
        RecordingEvents::default()
    }

    /// The next call fails as a whole; nothing is published.
    pub fn fail_next(&self, error: PortError) {
        lock(&self.state).call_faults.push_back(Fault::Fail(error));
    }

    /// The next call publishes everything and then returns the error (a lost response):
    /// the caller will publish again, and consumers see the duplicates.
    pub fn apply_then_fail_next(&self, error: PortError) {
        lock(&self.state)
            .call_faults
            .push_back(Fault::ApplyThenFail(error));
    }

    /// Every publish of `event_key` is refused (reported in `PublishReport::failed`) until
    /// [`RecordingEvents::accept_all`].
    pub fn refuse_key(&self, event_key: &str, code: &str, message: &str) {
        lock(&self.state).refuse_keys.insert(
            event_key.to_string(),
            (code.to_string(), message.to_string()),
        );
    }

    /// The next `n` entries, whatever their keys, are refused.
    pub fn refuse_next_entries(&self, n: usize, code: &str, message: &str) {
        let mut s = lock(&self.state);
        for _ in 0..n {
            s.refuse_next
                .push_back((code.to_string(), message.to_string()));
        }
    }

    /// Forgets every scripted refusal and fault.
    pub fn accept_all(&self) {
        let mut s = lock(&self.state);
        s.refuse_keys.clear();
        s.refuse_next.clear();
        s.call_faults.clear();
    }

    /// Every accepted event, in publish order.
    pub fn published(&self) -> Vec<OutboundEvent> {
        lock(&self.state).published.clone()
    }

    /// The accepted events of one detail-type.
    pub fn published_of(&self, detail_type: &str) -> Vec<OutboundEvent> {
        lock(&self.state)
            .published
            .iter()
            .filter(|e| e.detail_type == detail_type)
            .cloned()
            .collect()
    }

    /// The detail-types accepted, in order.
    pub fn detail_types(&self) -> Vec<String> {
        lock(&self.state)
            .published
            .iter()
            .map(|e| e.detail_type.clone())
            .collect()
    }

    /// Every call made, accepted or not, with its events.
    pub fn calls(&self) -> Vec<Vec<OutboundEvent>> {
        lock(&self.state).calls.clone()
    }

    pub fn clear(&self) {
        let mut s = lock(&self.state);
        s.published.clear();
        s.calls.clear();
    }
}

impl EventSink for RecordingEvents {
    async fn publish(&self, events: &[OutboundEvent]) -> Result<PublishReport, PortError> {
        let mut s = lock(&self.state);
        s.calls.push(events.to_vec());
        let after = match s.call_faults.pop_front() {
            Some(Fault::Fail(e)) => return Err(e),
            Some(Fault::ApplyThenFail(e)) => Some(e),
            None => None,
        };
        let mut report = PublishReport::default();
        for ev in events {
            let refusal = match s.refuse_keys.get(&ev.event_key) {
                Some(r) => Some(r.clone()),
                None => s.refuse_next.pop_front(),
            };
            match refusal {
                Some((code, message)) => report.failed.push((ev.event_key.clone(), code, message)),
                None => {
                    s.published.push(ev.clone());
                    report.sent.push(ev.event_key.clone());
                }
            }
        }
        match after {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::errors;

    fn event(key: &str, detail_type: &str) -> OutboundEvent {
        OutboundEvent {
            event_key: key.into(),
            detail_type: detail_type.into(),
            detail: serde_json::json!({ "event_key": key, "request_id": "r-1" }),
            notice: None,
        }
    }

    #[tokio::test]
    async fn published_events_are_recorded_in_order_and_reported_sent() {
        // GIVEN a sink
        let sink = RecordingEvents::new();
        let handle = sink.clone();
        // WHEN two events are published
        let report = sink
            .publish(&[
                event("k1", "Capacity Request Accepted"),
                event("k2", "Capacity Not Found"),
            ])
            .await
            .unwrap();
        // THEN both are sent and recorded, visible through any clone
        assert_eq!(report.sent, vec!["k1", "k2"]);
        assert!(report.failed.is_empty());
        assert_eq!(
            handle.detail_types(),
            vec!["Capacity Request Accepted", "Capacity Not Found"]
        );
        assert_eq!(handle.published_of("Capacity Not Found").len(), 1);
    }

    #[tokio::test]
    async fn a_refused_key_is_reported_failed_and_not_recorded_until_accepted() {
        // GIVEN a sink that refuses k2
        let sink = RecordingEvents::new();
        sink.refuse_key("k2", "InternalFailure", "try again");
        // WHEN k1 and k2 are published
        let report = sink
            .publish(&[event("k1", "A"), event("k2", "B")])
            .await
            .unwrap();
        // THEN k2 is reported failed with its code and k1 is sent
        assert_eq!(report.sent, vec!["k1"]);
        assert_eq!(
            report.failed,
            vec![("k2".into(), "InternalFailure".into(), "try again".into())]
        );
        assert_eq!(sink.published().len(), 1);
        // AND once accepted, a re-publication goes through
        sink.accept_all();
        let report = sink.publish(&[event("k2", "B")]).await.unwrap();
        assert_eq!(report.sent, vec!["k2"]);
    }

    #[tokio::test]
    async fn the_next_entries_can_be_refused_whatever_their_keys() {
        let sink = RecordingEvents::new();
        sink.refuse_next_entries(1, "ThrottlingException", "slow down");
        let report = sink
            .publish(&[event("a", "A"), event("b", "B")])
            .await
            .unwrap();
        assert_eq!(report.failed.len(), 1);
        assert_eq!(report.failed[0].0, "a");
        assert_eq!(report.sent, vec!["b"]);
    }

    #[tokio::test]
    async fn a_failed_call_publishes_nothing_but_is_logged() {
        let sink = RecordingEvents::new();
        sink.fail_next(errors::throttled("events"));
        let err = sink.publish(&[event("a", "A")]).await.unwrap_err();
        assert!(err.is_retryable());
        assert!(sink.published().is_empty());
        assert_eq!(sink.calls().len(), 1);
        // AND the fault is used up
        assert!(sink.publish(&[event("a", "A")]).await.is_ok());
    }

    #[tokio::test]
    async fn a_lost_response_publishes_and_still_returns_the_error() {
        let sink = RecordingEvents::new();
        sink.apply_then_fail_next(errors::outcome_unknown("events"));
        assert!(sink.publish(&[event("a", "A")]).await.is_err());
        assert_eq!(sink.published().len(), 1);
    }
}
