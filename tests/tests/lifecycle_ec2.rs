//! The whole life of an `ec2-instances` request through the five real handlers, against the
//! offline emulator (EC2, EventBridge and its simulated clock) and moto's DynamoDB: search,
//! the exactly-once purchase, the launch when the Capacity Block opens, healing, the drain
//! ahead of AWS's forced termination and the end, plus the faults that threaten each step
//! (a 500 on the purchase, racing purchases, duplicate, early and missed Delivered events, an
//! impaired instance, a crash between commit and publish, on-demand-first without capacity).
//!
//! Outcomes are judged from what the emulator holds (blocks, instances) and what reached its
//! buses, as well as from the table. Time moves only by the emulator's clock.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::domain::money::{MicroUsd, Usd};
use capacity_pilot::domain::status::RequestStatus;
use chrono::{DateTime, TimeDelta, Utc};
use integration_tests::flow::{Flow, Function, REGION, ec2_request, envelope, t0};
use local_cloud::ec2::{Instance, Lifecycle};
use local_cloud::{Fault, FaultKind};
use serde_json::{Value, json};

const MANAGED_TAG: &str = "capacity-pilot:managed";
const REQUEST_TAG: &str = "capacity-pilot:request-id";

/// An EC2 request whose launch template and subnets exist in this emulator: its seeded GPU
/// template and one subnet per zone, so whichever zone the block is in has a subnet.
fn emulated_request(f: &Flow, id: &str) -> Value {
    let (template, subnets) = f.cloud.with_world(|w| {
        let template = w
            .launch_templates(REGION)
            .into_iter()
            .find(|t| t.name == "capacity-pilot-gpu")
            .expect("the seeded GPU template")
            .id;
        let subnets: Vec<String> = w.subnets(REGION).into_iter().map(|s| s.id).collect();
        (template, subnets)
    });
    let mut r = ec2_request(id);
    r["workload"]["launch_template"] = json!({ "id": template });
    r["workload"]["subnet_ids"] = json!(subnets);
    r
}

/// Every instance the emulator holds tagged for `id`, terminated ones included.
fn instances_for(f: &Flow, id: &str) -> Vec<Instance> {
    f.cloud.with_world(|w| {
        w.ec2
            .instances
            .values()
            .filter(|i| i.tags.get(REQUEST_TAG).map(String::as_str) == Some(id))
            .cloned()
            .collect()
    })
}

/// Those of [`instances_for`] that are pending or running.
fn live_for(f: &Flow, id: &str) -> Vec<Instance> {
    instances_for(f, id)
        .into_iter()
        .filter(|i| i.state == "pending" || i.state == "running")
        .collect()
}

/// The detail-types published on our bus about `id`, in order.
fn published(f: &Flow, id: &str) -> Vec<String> {
    f.cloud
        .events(integration_tests::flow::BUS)
        .into_iter()
        .filter(|e| e["detail"]["request_id"] == id)
        .map(|e| e["detail-type"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Asserts what was published on our bus about `id`: `steps` in order, each step the events
/// one write put in its outbox, which reach the bus together in no particular order.
fn assert_published(f: &Flow, id: &str, steps: &[&[&str]]) {
    let got = published(f, id);
    let mut at = 0;
    for step in steps {
        let Some(chunk) = got.get(at..at + step.len()) else {
            panic!("published about {id}: {got:?}; expected the steps {steps:?}");
        };
        let mut chunk = chunk.to_vec();
        chunk.sort();
        let mut want: Vec<String> = step.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(
            chunk, want,
            "published about {id}: {got:?}; expected the steps {steps:?}"
        );
        at += step.len();
    }
    assert_eq!(
        at,
        got.len(),
        "published about {id}: {got:?}; expected the steps {steps:?}"
    );
}

/// The single `Capacity Reserved` event for `id`.
fn reserved(f: &Flow, id: &str) -> Value {
    let r = f.bus_for("Capacity Reserved", id);
    assert_eq!(r.len(), 1, "exactly one Capacity Reserved: {r:#?}");
    r[0].clone()
}

fn fee_of(reserved: &Value) -> MicroUsd {
    Usd::parse(reserved["detail"]["upfront_fee_usd"].as_str().unwrap())
        .unwrap()
        .to_micros_ceil()
}

fn time_of(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

/// AWS events of `detail_type` on the default bus about reservation `cr`.
fn aws_events(f: &Flow, detail_type: &str, cr: &str) -> Vec<Value> {
    f.cloud
        .events("default")
        .into_iter()
        .filter(|e| e["detail-type"] == detail_type && e["detail"]["capacity-reservation-id"] == cr)
        .collect()
}

/// Submits the request and delivers what follows until it is Reserved (search, Offerings
/// Found to purchase-capacity). Returns the Reserved event.
async fn reserve(f: &Flow, id: &str) -> Value {
    f.submit(emulated_request(f, id)).await;
    assert_eq!(f.status(id).await, RequestStatus::OfferingsFound);
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    reserved(f, id)
}

/// The best plan's fee on the Offerings Found event equals the Reserved fee.
fn assert_fee_is_the_offerings(f: &Flow, id: &str, reserved: &Value) {
    let found = f.bus_for("Capacity Offerings Found", id);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(
        found[0]["detail"]["plans"][0]["upfront_fee_usd"],
        reserved["detail"]["upfront_fee_usd"]
    );
}

#[tokio::test]
async fn an_ec2_request_lives_from_submission_to_the_end_of_its_block() {
    // GIVEN the emulator's market and a fresh table
    let f = Flow::start().await;
    let id = "life-1";

    // WHEN the request is submitted and its Offerings Found reaches purchase-capacity
    let reserved = reserve(&f, id).await;

    // THEN one block is bought for it, and the team is debited exactly its fee
    assert_eq!(f.blocks_for(id), 1);
    assert_fee_is_the_offerings(&f, id, &reserved);
    let fee = fee_of(&reserved);
    assert_eq!(f.team_spent("team-a", t0()).await, fee);
    let cr = reserved["detail"]["reservation_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let start = time_of(&reserved["detail"]["start"]);
    let end = time_of(&reserved["detail"]["end"]);
    let zone = f
        .cloud
        .with_world(|w| w.ec2.reservations[&cr].availability_zone.clone());
    assert!(
        live_for(&f, id).is_empty(),
        "nothing runs before the window"
    );

    // WHEN the emulator's clock reaches the block's start
    f.cloud.advance_to(start);

    // THEN EC2 announces the delivery on the default bus ...
    assert_eq!(aws_events(&f, "Capacity Block Delivered", &cr).len(), 1);
    // ... AND delivering it launches the 4 instances into the block
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Active);
    let live = live_for(&f, id);
    assert_eq!(live.len(), 4, "{live:#?}");
    let subnet = f.cloud.with_world(|w| {
        w.subnets(REGION)
            .into_iter()
            .find(|s| s.availability_zone == zone)
            .unwrap()
            .id
    });
    for i in &live {
        assert_eq!(i.lifecycle, Lifecycle::CapacityBlock, "{i:#?}");
        assert_eq!(i.capacity_reservation_id.as_deref(), Some(cr.as_str()));
        assert_eq!(i.tags.get(MANAGED_TAG).map(String::as_str), Some("true"));
        assert_eq!(i.tags.get(REQUEST_TAG).map(String::as_str), Some(id));
        assert_eq!(i.availability_zone, zone);
        assert_eq!(i.subnet_id, subnet);
        assert_eq!(i.instance_type, "p5.48xlarge");
    }
    let launched = f.bus_for("Capacity Workload Launched", id);
    assert_eq!(launched.len(), 1, "{launched:#?}");
    assert_eq!(launched[0]["detail"]["reservation_id"], cr.as_str());
    let mut ids: Vec<&str> = launched[0]["detail"]["resource_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    ids.sort_unstable();
    let mut expected: Vec<&str> = live.iter().map(|i| i.id.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected);

    // WHEN the clock reaches the drain start (end - 30 min forced lead - 15 min drain) and
    // cleanup-expired's schedule runs
    let forced = end - TimeDelta::minutes(30);
    let drain_at = forced - TimeDelta::minutes(15);
    f.cloud.advance_to(drain_at - TimeDelta::minutes(1));
    f.tick(Function::Cleanup).await.unwrap();
    assert_eq!(
        f.status(id).await,
        RequestStatus::Active,
        "no drain before its time"
    );
    f.cloud.advance_to(drain_at);
    f.tick(Function::Cleanup).await.unwrap();

    // THEN the request drains: Expiring and Drained are published, and our instances are
    // terminated by us before AWS's forced termination
    assert_eq!(f.status(id).await, RequestStatus::Draining);
    let expiring = f.bus_for("Capacity Reservation Expiring", id);
    assert_eq!(expiring.len(), 1, "{expiring:#?}");
    assert_eq!(
        time_of(&expiring[0]["detail"]["forced_termination_at"]),
        forced
    );
    assert_eq!(time_of(&expiring[0]["detail"]["drain_starts_at"]), drain_at);
    let drained = f.bus_for("Capacity Workload Drained", id);
    assert_eq!(drained.len(), 1, "{drained:#?}");
    assert_eq!(
        drained[0]["detail"]["resource_ids"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    f.cloud.advance_to(forced - TimeDelta::seconds(1));
    f.deliver().await;
    let all = instances_for(&f, id);
    assert_eq!(all.len(), 4, "no instance was added: {all:#?}");
    for i in &all {
        assert_eq!(i.state, "terminated", "{i:#?}");
        assert!(i.terminated_at.unwrap() < forced);
        assert_eq!(
            i.state_reason.as_ref().map(|(c, _)| c.as_str()),
            Some("Client.UserInitiatedShutdown"),
            "we stopped it, not AWS"
        );
    }
    assert_eq!(f.status(id).await, RequestStatus::Draining);

    // WHEN the block has ended and the schedule runs
    f.cloud.advance_to(end);
    f.deliver().await;
    f.tick(Function::Cleanup).await.unwrap();

    // THEN the request has ended, said so once, and still holds one block and one fee
    assert_eq!(f.status(id).await, RequestStatus::Ended);
    let ended = f.bus_for("Capacity Reservation Ended", id);
    assert_eq!(ended.len(), 1, "{ended:#?}");
    assert_eq!(ended[0]["detail"]["reservation_ids"], json!([cr]));
    assert_eq!(f.blocks_for(id), 1);
    assert_eq!(f.team_spent("team-a", t0()).await, fee);
    assert_eq!(
        f.cloud
            .with_world(|w| w.ec2.reservations[&cr].state.clone()),
        "expired"
    );
    assert_published(
        &f,
        id,
        &[
            &["Capacity Request Accepted"],
            &["Capacity Offerings Found"],
            &["Capacity Reserved"],
            &["Capacity Workload Launched"],
            &["Capacity Reservation Expiring", "Capacity Workload Drained"],
            &["Capacity Reservation Ended"],
        ],
    );
}
