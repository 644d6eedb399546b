//! EventBridge `PutEvents` behind `EventSink`. A partial failure is a 200 with
//! `FailedEntryCount`, so every entry's result is checked: failed entries are retried with
//! backoff a bounded number of times and the rest are reported, never dropped.

use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_eventbridge::Client;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;

use super::error::{Call, classify};
use crate::ports::{
    AsyncSleep, EventSink, OutboundEvent, PortError, PublishReport, Sleep, default_sleep,
};

pub const SERVICE: &str = "events";
/// The `source` of every event we publish.
pub const SOURCE: &str = "capacity-pilot";
/// PutEvents takes at most 10 entries.
pub const MAX_BATCH: usize = 10;

/// Entry error codes that a retry can't fix.
const PERMANENT_ENTRY_CODES: &[&str] = &[
    "InvalidArgument",
    "MalformedDetail",
    "NotAuthorizedForSourceException",
    "AccessDeniedException",
    "ValidationException",
    "ResourceNotFoundException",
];

/// How often, and how patiently, failed entries (or failed calls) are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRetry {
    /// Retries after the first attempt.
    pub retries: u32,
    /// The first delay; doubled for each further retry, capped at `max_delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for EntryRetry {
    fn default() -> Self {
        EntryRetry {
            retries: 3,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(2),
        }
    }
}

impl EntryRetry {
    fn delay(&self, retry: u32) -> Duration {
        self.base_delay
            .saturating_mul(2u32.saturating_pow(retry))
            .min(self.max_delay)
    }
}

/// Publishes our events to the custom bus.
#[derive(Clone, Debug)]
pub struct EventBridgeSink {
    client: Client,
    bus_name: String,
    retry: EntryRetry,
    /// Between retries of refused entries: the client configuration's own sleep.
    sleep: Sleep,
}

impl EventBridgeSink {
    /// A sink for `bus_name` (`EVENT_BUS_NAME`) in the configuration's region.
    pub fn new(config: &SdkConfig, bus_name: impl Into<String>) -> EventBridgeSink {
        EventBridgeSink::from_client(Client::new(config), bus_name)
    }

    pub fn from_client(client: Client, bus_name: impl Into<String>) -> EventBridgeSink {
        let sleep = client.config().sleep_impl().unwrap_or_else(default_sleep);
        EventBridgeSink {
            client,
            bus_name: bus_name.into(),
            retry: EntryRetry::default(),
            sleep,
        }
    }

    pub fn with_retry(mut self, retry: EntryRetry) -> EventBridgeSink {
        self.retry = retry;
        self
    }

    fn entry(&self, e: &OutboundEvent) -> PutEventsRequestEntry {
        PutEventsRequestEntry::builder()
            .event_bus_name(&self.bus_name)
            .source(SOURCE)
            .detail_type(&e.detail_type)
            .detail(e.detail.to_string())
            .build()
    }

    /// One batch of at most 10, with its retries.
    async fn publish_batch(&self, batch: &[OutboundEvent], report: &mut PublishReport) {
        const OP: &str = "PutEvents";
        let mut pending: Vec<&OutboundEvent> = batch.iter().collect();
        let mut retry = 0;
        while !pending.is_empty() {
            let last = retry >= self.retry.retries;
            let res = self
                .client
                .put_events()
                .set_entries(Some(pending.iter().map(|e| self.entry(e)).collect()))
                .send()
                .await;
            let mut again = Vec::new();
            match res {
                Err(e) => {
                    let err = classify(SERVICE, OP, Call::Retryable, e);
                    if err.is_retryable() && !last {
                        again = pending;
                    } else if pending.len() > 1 && !err.is_retryable() {
                        // A whole-batch refusal (one oversize or malformed entry refuses the
                        // call): each entry alone, so one poison entry blocks no other.
                        tracing::info!(entries = pending.len(), error = %err,
                            "PutEvents refused the batch; publishing its entries one by one");
                        for e in pending {
                            Box::pin(self.publish_batch(std::slice::from_ref(e), report)).await;
                        }
                    } else {
                        let code = err.code().unwrap_or("OutcomeUnknown").to_string();
                        for e in pending {
                            report.failed.push((
                                e.event_key.clone(),
                                code.clone(),
                                err.to_string(),
                            ));
                        }
                    }
                }
                Ok(out) => {
                    let results = out.entries();
                    for (i, e) in pending.into_iter().enumerate() {
                        // Results are positional; a missing one is a failure, not a success.
                        let r = results.get(i);
                        let code = r.and_then(|r| r.error_code());
                        let id = r.and_then(|r| r.event_id());
                        match (code, id) {
                            (None, Some(_)) => report.sent.push(e.event_key.clone()),
                            (code, _) => {
                                let code = code.unwrap_or("MissingResult");
                                let message = r
                                    .and_then(|r| r.error_message())
                                    .unwrap_or("PutEvents returned no result for this entry")
                                    .to_string();
                                if !last && !PERMANENT_ENTRY_CODES.contains(&code) {
                                    again.push(e);
                                } else {
                                    tracing::warn!(
                                        event_key = %e.event_key,
                                        detail_type = %e.detail_type,
                                        error_code = code,
                                        error_message = %message,
                                        "event not published"
                                    );
                                    report.failed.push((
                                        e.event_key.clone(),
                                        code.to_string(),
                                        message,
                                    ));
                                }
                            }
                        }
                    }
                    if out.failed_entry_count() > 0 {
                        tracing::info!(
                            failed = out.failed_entry_count(),
                            retrying = again.len(),
                            "PutEvents partially failed"
                        );
                    }
                }
            }
            if !again.is_empty() {
                self.sleep.sleep(self.retry.delay(retry)).await;
            }
            pending = again;
            retry += 1;
        }
    }
}

impl EventSink for EventBridgeSink {
    async fn publish(&self, events: &[OutboundEvent]) -> Result<PublishReport, PortError> {
        let mut report = PublishReport::default();
        for batch in events.chunks(MAX_BATCH) {
            self.publish_batch(batch, &mut report).await;
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_eventbridge::operation::put_events::PutEventsOutput;
    use aws_sdk_eventbridge::types::PutEventsResultEntry;
    use aws_smithy_mocks::{RuleMode, mock};

    fn client(rules: &[&aws_smithy_mocks::Rule]) -> Client {
        let mut interceptor =
            aws_smithy_mocks::MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny);
        for r in rules {
            interceptor = interceptor.with_rule(r);
        }
        let conf = aws_sdk_eventbridge::Config::builder()
            .behavior_version(aws_sdk_eventbridge::config::BehaviorVersion::latest())
            .region(aws_sdk_eventbridge::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_eventbridge::config::Credentials::new(
                "AKID", "SECRET", None, None, "test",
            ))
            .retry_config(aws_sdk_eventbridge::config::retry::RetryConfig::disabled())
            .http_client(aws_smithy_mocks::create_mock_http_client())
            .interceptor(interceptor)
            .build();
        Client::from_conf(conf)
    }

    fn events(n: usize) -> Vec<OutboundEvent> {
        (0..n)
            .map(|i| OutboundEvent {
                event_key: format!("k{i}"),
                detail_type: "Capacity Reserved".into(),
                detail: serde_json::json!({"event_key": format!("k{i}")}),
                notice: None,
            })
            .collect()
    }

    fn fast() -> EntryRetry {
        EntryRetry {
            retries: 2,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
        }
    }

    fn has_poison(req: &aws_sdk_eventbridge::operation::put_events::PutEventsInput) -> bool {
        req.entries()
            .iter()
            .any(|e| e.detail().is_some_and(|d| d.contains("poison")))
    }

    #[tokio::test]
    async fn a_batch_refused_whole_for_one_poison_entry_publishes_the_others_one_by_one() {
        // GIVEN PutEvents refuses any call holding the poison entry, as it refuses a request
        // over its total size, and takes any other
        let refuse = mock!(Client::put_events)
            .match_requests(has_poison)
            .then_error(|| {
                aws_sdk_eventbridge::operation::put_events::PutEventsError::generic(
                    aws_sdk_eventbridge::error::ErrorMetadata::builder()
                        .code("ValidationException")
                        .message("Total size of the entries in the request is over the limit.")
                        .build(),
                )
            });
        let accept = mock!(Client::put_events)
            .match_requests(|r| !has_poison(r))
            .then_compute_output(|req| {
                PutEventsOutput::builder()
                    .failed_entry_count(0)
                    .set_entries(Some(
                        req.entries()
                            .iter()
                            .map(|_| PutEventsResultEntry::builder().event_id("id").build())
                            .collect(),
                    ))
                    .build()
            });
        let mut batch = events(10);
        batch[3].detail = serde_json::json!({"event_key": "k3", "note": "poison"});
        let sink =
            EventBridgeSink::from_client(client(&[&refuse, &accept]), "bus").with_retry(fast());

        // WHEN the ten are published
        let report = sink.publish(&batch).await.unwrap();

        // THEN the nine others went, and only the poison one is reported failed
        assert_eq!(report.sent.len(), 9, "{report:?}");
        assert!(!report.sent.contains(&"k3".to_string()));
        assert_eq!(report.failed.len(), 1);
        assert_eq!(report.failed[0].0, "k3");
    }

    #[tokio::test]
    async fn twenty_five_events_go_out_in_three_batches_of_at_most_ten() {
        let rule = mock!(Client::put_events).then_compute_output(|req| {
            assert!(req.entries().len() <= MAX_BATCH);
            assert!(
                req.entries()
                    .iter()
                    .all(|e| e.source() == Some(SOURCE) && e.event_bus_name() == Some("bus"))
            );
            PutEventsOutput::builder()
                .failed_entry_count(0)
                .set_entries(Some(
                    req.entries()
                        .iter()
                        .map(|_| PutEventsResultEntry::builder().event_id("id").build())
                        .collect(),
                ))
                .build()
        });
        let sink = EventBridgeSink::from_client(client(&[&rule]), "bus").with_retry(fast());
        let report = sink.publish(&events(25)).await.unwrap();
        assert_eq!(report.sent.len(), 25);
        assert!(report.failed.is_empty());
        assert_eq!(rule.num_calls(), 3);
    }

    #[tokio::test]
    async fn a_throttled_entry_is_retried_and_an_invalid_one_reported() {
        // First call: entry 0 ok, entry 1 throttled, entry 2 invalid. Second call (entry 1
        // only): ok.
        let rule = mock!(Client::put_events)
            .sequence()
            .output(|| {
                PutEventsOutput::builder()
                    .failed_entry_count(2)
                    .entries(PutEventsResultEntry::builder().event_id("a").build())
                    .entries(
                        PutEventsResultEntry::builder()
                            .error_code("ThrottlingException")
                            .error_message("slow down")
                            .build(),
                    )
                    .entries(
                        PutEventsResultEntry::builder()
                            .error_code("InvalidArgument")
                            .error_message("too big")
                            .build(),
                    )
                    .build()
            })
            .output(|| {
                PutEventsOutput::builder()
                    .failed_entry_count(0)
                    .entries(PutEventsResultEntry::builder().event_id("b").build())
                    .build()
            })
            .build();
        let sink = EventBridgeSink::from_client(client(&[&rule]), "bus").with_retry(fast());
        let report = sink.publish(&events(3)).await.unwrap();
        assert_eq!(report.sent, vec!["k0".to_string(), "k1".to_string()]);
        assert_eq!(
            report.failed,
            vec![(
                "k2".to_string(),
                "InvalidArgument".to_string(),
                "too big".to_string()
            )]
        );
        assert_eq!(rule.num_calls(), 2);
    }

    #[tokio::test]
    async fn an_entry_failing_every_retry_is_reported_after_the_last() {
        let rule = mock!(Client::put_events)
            .sequence()
            .output(|| {
                PutEventsOutput::builder()
                    .failed_entry_count(1)
                    .entries(
                        PutEventsResultEntry::builder()
                            .error_code("InternalFailure")
                            .error_message("oops")
                            .build(),
                    )
                    .build()
            })
            .times(3)
            .build();
        let sink = EventBridgeSink::from_client(client(&[&rule]), "bus").with_retry(fast());
        let report = sink.publish(&events(1)).await.unwrap();
        assert!(report.sent.is_empty());
        assert_eq!(report.failed[0].0, "k0");
        assert_eq!(report.failed[0].1, "InternalFailure");
        assert_eq!(rule.num_calls(), 3, "one call and two retries");
    }

    #[tokio::test]
    async fn a_failed_call_reports_every_entry_of_the_batch() {
        let rule = mock!(Client::put_events)
            .sequence()
            .http_status(500, None)
            .times(3)
            .build();
        let sink = EventBridgeSink::from_client(client(&[&rule]), "bus").with_retry(fast());
        let report = sink.publish(&events(2)).await.unwrap();
        assert!(report.sent.is_empty());
        assert_eq!(report.failed.len(), 2);
        assert_eq!(rule.num_calls(), 3);
    }
}
