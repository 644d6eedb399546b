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

/// AWS events are regional (aws-reference §11.4): a Capacity Block bought in us-west-2 and the
/// instance launched into it send their events to us-west-2's default bus, and none reaches the
/// home region's (us-east-1) default bus; PutEvents goes to the bus of the call's region, or
/// of the region an `EventBusName` ARN names.
#[tokio::test]
async fn aws_events_reach_the_default_bus_of_their_own_region_only() {
    use aws_sdk_ec2::types::{
        CapacityReservationSpecification, CapacityReservationTarget, InstanceMarketOptionsRequest,
        LaunchTemplateSpecification, MarketType,
    };
    let env = env().await;
    assert_eq!(env.cloud.home_region(), "us-east-1");
    let west = sdk_config(&env.cloud.url(), "us-west-2", false).await;
    let west = Env {
        ec2: aws_sdk_ec2::Client::new(&west),
        sm: aws_sdk_sagemaker::Client::new(&west),
        eb: aws_sdk_eventbridge::Client::new(&west),
        cloud: env.cloud,
    };
    let offer = crate::ec2_blocks::offerings(&west, "p5.48xlarge", 1, 24)
        .await
        .remove(0);
    assert!(offer.availability_zone().unwrap().starts_with("us-west-2"));
    let cr = crate::ec2_blocks::buy(&west, &offer, "req-west").await;
    let id = cr.capacity_reservation_id().unwrap().to_string();
    let start = chrono_of(offer.start_date().unwrap());

    // WHEN the block activates and an instance is launched into it and terminated
    west.cloud.advance_to(start + chrono::TimeDelta::minutes(5));
    let run = west
        .ec2
        .run_instances()
        .launch_template(
            LaunchTemplateSpecification::builder()
                .launch_template_name("capacity-pilot-gpu")
                .build(),
        )
        .instance_type(aws_sdk_ec2::types::InstanceType::P548xlarge)
        .min_count(1)
        .max_count(1)
        .instance_market_options(
            InstanceMarketOptionsRequest::builder()
                .market_type(MarketType::CapacityBlock)
                .build(),
        )
        .capacity_reservation_specification(
            CapacityReservationSpecification::builder()
                .capacity_reservation_target(
                    CapacityReservationTarget::builder()
                        .capacity_reservation_id(&id)
                        .build(),
                )
                .build(),
        )
        .placement(
            aws_sdk_ec2::types::Placement::builder()
                .availability_zone(offer.availability_zone().unwrap())
                .build(),
        )
        .send()
        .await
        .expect("launch into the us-west-2 block");
    let instance = run.instances()[0].instance_id().unwrap().to_string();
    west.cloud.step(chrono::TimeDelta::minutes(1));
    west.ec2
        .terminate_instances()
        .instance_ids(&instance)
        .send()
        .await
        .unwrap();
    west.cloud.step(chrono::TimeDelta::minutes(2));

    // THEN us-west-2's default bus has the Delivered and the state changes, each saying
    // us-west-2 ...
    let there = west.cloud.events_in("us-west-2", "default");
    let delivered: Vec<_> = there
        .iter()
        .filter(|e| e["detail-type"] == "Capacity Block Delivered")
        .collect();
    assert_eq!(delivered.len(), 1, "{there:?}");
    assert_eq!(
        delivered[0]["detail"]["capacity-reservation-id"],
        id.as_str()
    );
    let states: Vec<&str> = there
        .iter()
        .filter(|e| e["detail-type"] == "EC2 Instance State-change Notification")
        .filter(|e| e["detail"]["instance-id"] == instance.as_str())
        .filter_map(|e| e["detail"]["state"].as_str())
        .collect();
    assert!(states.contains(&"terminated"), "{states:?}");
    assert!(there.iter().all(|e| e["region"] == "us-west-2"));
    // ... and the home region's default bus has none of them
    assert!(west.cloud.events("default").is_empty());
    assert!(west.cloud.events_in("us-east-1", "default").is_empty());

    // PutEvents: a bare bus name is the call's region's bus, an ARN names its own region
    let put = |bus: &str| {
        PutEventsRequestEntry::builder()
            .source("capacity-pilot")
            .detail_type("X")
            .detail("{}")
            .event_bus_name(bus)
            .build()
    };
    let out = west
        .eb
        .put_events()
        .entries(put("capacity-pilot"))
        .entries(put(
            "arn:aws:events:us-east-1:123456789012:event-bus/capacity-pilot",
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(out.failed_entry_count(), 0);
    let west_custom = west.cloud.events_in("us-west-2", "capacity-pilot");
    let home_custom = west.cloud.events("capacity-pilot");
    assert_eq!((west_custom.len(), home_custom.len()), (1, 1));

    // the control API reads a region's bus, and the home region's by name alone
    let url = west.cloud.url();
    let (_, body) = http(&url, "GET", "/_local/events/us-west-2/default", None).await;
    assert_eq!(body["events"].as_array().map(Vec::len), Some(there.len()));
    let (_, body) = http(&url, "GET", "/_local/events/default", None).await;
    assert_eq!(body["events"], serde_json::json!([]));
    let (_, body) = http(&url, "GET", "/_local/events", None).await;
    assert!(body["us-west-2/default"].is_array(), "{body}");
    assert!(body["capacity-pilot"].is_array(), "{body}");
}
