//! PutEvents: recorded per bus with the delivered envelope; per-entry failures in a 200.

use aws_sdk_eventbridge::error::ProvideErrorMetadata;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use local_cloud::Options;

use crate::helpers::*;

fn entry(source: &str, detail_type: &str, detail: &str) -> PutEventsRequestEntry {
    PutEventsRequestEntry::builder()
        .source(source)
        .detail_type(detail_type)
        .detail(detail)
        .event_bus_name("capacity-pilot")
        .build()
}

#[tokio::test]
async fn accepted_events_are_recorded_on_their_bus_with_the_standard_envelope() {
    let env = env().await;
    let out = env
        .eb
        .put_events()
        .entries(
            PutEventsRequestEntry::builder()
                .source("capacity-pilot")
                .detail_type("Capacity Reserved")
                .detail(r#"{"request_id":"r-1","upfront_usd":"123.45"}"#)
                .resources("arn:aws:ec2:us-east-1:123456789012:capacity-reservation/cr-1")
                .event_bus_name("arn:aws:events:us-east-1:123456789012:event-bus/capacity-pilot")
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(out.failed_entry_count(), 0);
    let id = out.entries()[0].event_id().unwrap().to_string();
    let recorded = env.cloud.events("capacity-pilot");
    assert_eq!(recorded.len(), 1);
    let e = &recorded[0];
    assert_eq!(e["id"], id.as_str());
    assert_eq!(e["version"], "0");
    assert_eq!(e["detail-type"], "Capacity Reserved");
    assert_eq!(e["source"], "capacity-pilot");
    assert_eq!(e["region"], "us-east-1");
    assert_eq!(e["account"], "123456789012");
    assert_eq!(e["time"], "2026-09-01T08:00:00Z");
    assert_eq!(e["detail"]["upfront_usd"], "123.45");
    assert_eq!(
        e["resources"][0],
        "arn:aws:ec2:us-east-1:123456789012:capacity-reservation/cr-1"
    );
    assert!(env.cloud.events("default").is_empty());
}

#[tokio::test]
async fn invalid_entries_fail_individually_in_order() {
    let mut options = Options {
        seed: 1,
        start: Some(t0()),
        ..Options::default()
    };
    options.settings.event_max_bytes = 1024;
    let env = env_with(options).await;
    let big = format!(r#"{{"x":"{}"}}"#, "a".repeat(2000));
    let out = env
        .eb
        .put_events()
        .entries(entry("capacity-pilot", "Ok", "{}"))
        .entries(
            PutEventsRequestEntry::builder()
                .source("capacity-pilot")
                .detail_type("No detail")
                .build(),
        )
        .entries(entry("capacity-pilot", "Bad", "[1,2]"))
        .entries(entry("capacity-pilot", "Bad", "{not json"))
        .entries(entry("aws.ec2", "Forged", "{}"))
        .entries(entry("capacity-pilot", "Big", &big))
        .entries(entry("capacity-pilot", &"x".repeat(129), "{}"))
        .send()
        .await
        .unwrap();
    assert_eq!(out.failed_entry_count(), 6);
    let codes: Vec<Option<&str>> = out.entries().iter().map(|e| e.error_code()).collect();
    assert_eq!(
        codes,
        [
            None,
            Some("InvalidArgument"),
            Some("MalformedDetail"),
            Some("MalformedDetail"),
            Some("NotAuthorizedForSourceException"),
            Some("InvalidArgument"),
            Some("InvalidArgument"),
        ]
    );
    assert!(out.entries()[0].event_id().is_some());
    assert!(out.entries()[1].error_message().unwrap().contains("Detail"));
    assert_eq!(env.cloud.events("capacity-pilot").len(), 1);
}

#[tokio::test]
async fn a_request_with_too_many_or_no_valid_entries_fails_whole() {
    let env = env().await;
    let mut req = env.eb.put_events();
    for _ in 0..11 {
        req = req.entries(entry("capacity-pilot", "Many", "{}"));
    }
    let err = req.send().await.unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    let err = env
        .eb
        .put_events()
        .entries(
            PutEventsRequestEntry::builder()
                .source("capacity-pilot")
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
}
