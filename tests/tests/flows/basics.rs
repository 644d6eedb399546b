//! Whole flows through the real handlers and the real adapters: search-offerings and
//! purchase-capacity against the offline emulator (EC2, SageMaker, EventBridge and its
//! clock) and moto's DynamoDB. No fakes. Outcomes are judged from what the emulator
//! holds and what reached the bus, as well as from the table.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::domain::money::Usd;
use capacity_pilot::domain::request::RequestId;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::Store;
use integration_tests::flow::{Flow, SOURCE, envelope, t0};
use local_cloud::{Fault, FaultKind};
use serde_json::{Value, json};

/// Delivers the bus's `Capacity Offerings Found` for `id` to purchase-capacity, as the rule would.
async fn deliver_offerings_found(f: &Flow, id: &str) {
    let found = f
        .bus("Capacity Offerings Found")
        .into_iter()
        .find(|e| e["detail"]["request_id"] == id)
        .expect("offerings found on the bus");
    let ev: EventBridgeEvent<Value> = serde_json::from_value(found).unwrap();
    f.purchaser.handle(ev).await.expect("purchase runs");
}

#[tokio::test]
pub(crate) async fn a_request_is_searched_bought_once_and_announced_on_the_bus() {
    // GIVEN the emulator's market and a fresh table
    let f = Flow::start().await;

    // WHEN a request arrives and the Offerings Found event reaches purchase-capacity
    f.searcher
        .handle(envelope(
            "Capacity Request Submitted",
            SOURCE,
            "e1",
            f.ec2_request("flow-1"),
        ))
        .await
        .expect("search runs");
    assert_eq!(f.status("flow-1").await, RequestStatus::OfferingsFound);
    deliver_offerings_found(&f, "flow-1").await;
    // ... and again, as EventBridge may deliver twice
    deliver_offerings_found(&f, "flow-1").await;

    // THEN exactly one block was bought, tagged for the request, and the bus says so
    assert_eq!(f.status("flow-1").await, RequestStatus::Reserved);
    assert_eq!(f.blocks_for("flow-1"), 1);
    let reserved = f.bus("Capacity Reserved");
    assert_eq!(reserved.len(), 1, "{reserved:?}");
    let fee = Usd::parse(reserved[0]["detail"]["upfront_fee_usd"].as_str().unwrap()).unwrap();
    let best = &f.bus("Capacity Offerings Found")[0]["detail"]["plans"][0];
    assert_eq!(
        best["upfront_fee_usd"],
        reserved[0]["detail"]["upfront_fee_usd"]
    );
    assert_eq!(
        f.bus("Capacity Request Accepted").len(),
        1,
        "accepted is published once"
    );
    // AND the team's ledger holds exactly the fee
    assert_eq!(f.team_spent("team-a", t0()).await, fee.to_micros_ceil());
    // AND its history reads back every step once, each with its reason and cause, the
    // duplicate delivery leaving none
    let history = f
        .table
        .store()
        .history(&RequestId::parse("flow-1").unwrap())
        .await
        .unwrap();
    let path: Vec<RequestStatus> = history.iter().map(|h| h.to).collect();
    assert_eq!(
        path,
        [
            RequestStatus::Accepted,
            RequestStatus::Searching,
            RequestStatus::OfferingsFound,
            RequestStatus::Purchasing,
            // The purchase call, recorded under the lease before it is made (§9.1).
            RequestStatus::Purchasing,
            RequestStatus::Reserved
        ]
    );
    assert!(
        history[4].reason.starts_with("calling AWS to buy"),
        "{:?}",
        history[4]
    );
    assert!(
        history
            .iter()
            .all(|h| !h.reason.is_empty() && !h.cause.is_empty()),
        "{history:?}"
    );
}

#[tokio::test]
pub(crate) async fn a_purchase_whose_response_is_lost_is_adopted_not_bought_twice() {
    let f = Flow::start().await;
    f.searcher
        .handle(envelope(
            "Capacity Request Submitted",
            SOURCE,
            "e1",
            f.ec2_request("flow-2"),
        ))
        .await
        .unwrap();
    // GIVEN offerings stay on sale after a purchase (so a second purchase would show as a
    // second block), and AWS performs the next purchase but the response never arrives
    assert!(!f.cloud.with_world(|w| w.settings.single_use_offerings));
    f.cloud.inject(Fault {
        operation: "PurchaseCapacityBlock".into(),
        kind: FaultKind::LostResponse,
        count: Some(1),
    });

    deliver_offerings_found(&f, "flow-2").await;

    // THEN the SDK did not retry the purchase; EC2 does not list the block yet (its
    // listing lags), so the request stays in doubt, holding its lease and debit
    assert_eq!(f.blocks_for("flow-2"), 1);
    let rec = f.record("flow-2").await;
    assert_eq!(rec.status, RequestStatus::Purchasing, "{}", rec.reason);
    assert!(f.bus("Capacity Reserved").is_empty());

    // WHEN the lease expires and the schedule takes over
    f.cloud
        .advance_to(rec.lease.unwrap().expires_at + chrono::TimeDelta::minutes(1));
    f.tick(integration_tests::flow::Function::Purchase)
        .await
        .unwrap();

    // THEN reconciliation finds the block by its tag, and the request is reserved with it
    assert_eq!(f.blocks_for("flow-2"), 1);
    assert_eq!(f.status("flow-2").await, RequestStatus::Reserved);
    let reserved = f.bus("Capacity Reserved");
    assert_eq!(reserved.len(), 1);
    assert_eq!(reserved[0]["detail"]["adopted"], true);
}

#[tokio::test]
pub(crate) async fn without_listing_lag_a_lost_purchase_response_is_adopted_at_once() {
    // The lenient reading of the emulator's listing lag (0): the look right after the lost
    // response finds the block, and the request is reserved in the same invocation.
    let f = Flow::start().await;
    f.cloud.with_world(|w| w.settings.listing_lag_seconds = 0);
    f.submit(f.ec2_request("flow-2b")).await;
    f.cloud.inject(Fault {
        operation: "PurchaseCapacityBlock".into(),
        kind: FaultKind::LostResponse,
        count: Some(1),
    });
    deliver_offerings_found(&f, "flow-2b").await;
    assert_eq!(f.blocks_for("flow-2b"), 1);
    assert_eq!(f.status("flow-2b").await, RequestStatus::Reserved);
    assert_eq!(f.bus("Capacity Reserved")[0]["detail"]["adopted"], true);
}

#[tokio::test]
pub(crate) async fn with_the_documented_payment_pending_first_state_a_block_is_bought_and_tracked_until_scheduled()
 {
    // The lenient reading of the emulator's first block state (`payment-pending`, the
    // documented machine, instead of `pending`): the same purchase, payment and launch.
    let f = Flow::start().await;
    f.cloud.with_world(|w| {
        w.settings.block_initial_state = local_cloud::world::BlockInitialState::PaymentPending
    });
    let id = "flow-pp";
    f.submit(f.ec2_request(id)).await;
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    let rec = f.record(id).await;
    let held = f
        .purchaser
        .store
        .reservations(&rec.request_id)
        .await
        .unwrap();
    assert_eq!(
        held[0].state,
        capacity_pilot::domain::reservation::ReservationState::PaymentPending
    );
    f.cloud
        .advance_to(rec.next_action_at.expect("a payment check"));
    f.tick(integration_tests::flow::Function::Purchase)
        .await
        .unwrap();
    let rec = f.record(id).await;
    assert_eq!(rec.next_action_at, None, "{}", rec.reason);
    let held = f
        .purchaser
        .store
        .reservations(&rec.request_id)
        .await
        .unwrap();
    assert_eq!(
        held[0].state,
        capacity_pilot::domain::reservation::ReservationState::Scheduled
    );
}

#[tokio::test]
pub(crate) async fn an_invalid_request_is_rejected_on_the_bus_naming_every_field() {
    let f = Flow::start().await;
    let mut bad = f.ec2_request("flow-3");
    bad["instance_count"] = json!(65);
    bad["regions"] = json!(["mars-central-1"]);
    f.searcher
        .handle(envelope("Capacity Request Submitted", SOURCE, "e1", bad))
        .await
        .unwrap();
    let rejected = f.bus("Capacity Request Rejected");
    assert_eq!(rejected.len(), 1);
    let fields: Vec<&str> = rejected[0]["detail"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["instance_count", "regions[0]"]);
    assert_eq!(rejected[0]["source"], "capacity-pilot");
}

#[tokio::test]
pub(crate) async fn a_bought_block_the_table_no_longer_records_is_announced_by_the_hourly_detector()
{
    // GIVEN a block bought and recorded, whose RES# item the table then lost (a restore from
    // an older backup, say); the emulator lists it at once
    let f = Flow::start().await;
    f.cloud.with_world(|w| w.settings.listing_lag_seconds = 0);
    let id = "flow-lost-record";
    f.submit(f.ec2_request(id)).await;
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    let held = f
        .table
        .store()
        .reservations(&RequestId::parse(id).unwrap())
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    f.table
        .client
        .delete_item()
        .table_name(&f.table.name)
        .key(
            "pk",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("REQ#{id}")),
        )
        .key(
            "sk",
            aws_sdk_dynamodb::types::AttributeValue::S(format!("RES#{}", held[0].id)),
        )
        .send()
        .await
        .unwrap();

    // WHEN cleanup-expired's scheduled tick runs (its first plants and runs the detector)
    f.tick(integration_tests::flow::Function::Cleanup)
        .await
        .unwrap();

    // THEN the detector, listing through the real adapters, announces it
    let unrecorded = f.bus("Capacity Reservation Unrecorded");
    assert_eq!(unrecorded.len(), 1, "{unrecorded:?}");
    assert_eq!(
        unrecorded[0]["detail"]["reservation_id"],
        held[0].id.as_str()
    );
    assert_eq!(unrecorded[0]["detail"]["request_id"], id);
    // AND the operations kit's alarm counts it
    crate::alarms::assert_counted("ReservationUnrecordedAlarm", &unrecorded[0]);
}
