//! After the purchase (ARCHITECTURE 8.5): every bought reservation is read again until AWS
//! reports it scheduled; a payment that fails gives its debit back, is announced, and the
//! request buys again while its deadline allows. Against the emulator's reading of AWS:
//! a fresh block `pending` with 0 instances, payment clearing minutes later, listings
//! lagging (the defaults in infra/local/REALISM.md).

use capacity_pilot::domain::money::{MicroUsd, Usd};
use capacity_pilot::domain::reservation::ReservationState;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::Store;
use integration_tests::flow::{Flow, Function, REGION, t0};

use crate::sagemaker::{plan_name_for, submit_and_buy, tick, training_request};
use crate::windows::live_in;

/// The request's own next action: its payment check while it is Reserved.
async fn check_payments(f: &Flow, id: &str) {
    let rec = f.record(id).await;
    let at = rec.next_action_at.expect("a payment check is due");
    f.cloud.advance_to(at);
    tick(f, Function::Purchase).await;
}

fn fee_of(ev: &serde_json::Value) -> MicroUsd {
    Usd::parse(ev["detail"]["upfront_fee_usd"].as_str().unwrap())
        .unwrap()
        .to_micros_ceil()
}

#[tokio::test]
pub(crate) async fn a_block_whose_payment_fails_gives_its_debit_back_and_is_bought_again() {
    // GIVEN a request that bought a block
    let f = Flow::start().await;
    let id = "pay-fail-1";
    let status = submit_and_buy(&f, f.ec2_request(id)).await;
    assert_eq!(status, RequestStatus::Reserved);
    let first = f.bus_for("Capacity Reserved", id)[0].clone();
    let cr = first["detail"]["reservation_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(f.team_spent("team-a", t0()).await, fee_of(&first));
    // AND EC2 will not take the payment
    f.cloud
        .with_world(|w| w.fail_payment(&cr))
        .expect("the block is awaiting payment");

    // WHEN the purchase function checks the payment
    check_payments(&f, id).await;

    // THEN the block is recorded payment-failed, the debit is back, and the bus says so
    let rec = f.record(id).await;
    assert_eq!(rec.status, RequestStatus::Searching, "{}", rec.reason);
    assert_eq!(f.team_spent("team-a", t0()).await, MicroUsd(0));
    let held = f
        .purchaser
        .store
        .reservations(&rec.request_id)
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].state, ReservationState::PaymentFailed);
    let failed = f.bus_for("Capacity Payment Failed", id);
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(failed[0]["detail"]["reservation_id"], cr.as_str());
    // (and the operations kit's alarm counts it)
    crate::alarms::assert_counted("PaymentFailedAlarm", &failed[0]);
    assert_eq!(
        failed[0]["detail"]["returned_usd"],
        first["detail"]["upfront_fee_usd"]
    );

    // WHEN the search runs again and its offerings reach the purchase function
    tick(&f, Function::Search).await;
    f.deliver().await;

    // THEN a second block is bought, and only it is on the ledger
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    assert_eq!(f.blocks_for(id), 2);
    let second = f.bus_for("Capacity Reserved", id);
    assert_eq!(second.len(), 2);
    let cr2 = second[1]["detail"]["reservation_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(cr2, cr);
    assert_eq!(f.team_spent("team-a", t0()).await, fee_of(&second[1]));

    // AND once its payment clears it is recorded scheduled, and no check is due any more
    check_payments(&f, id).await;
    let rec = f.record(id).await;
    assert_eq!(rec.next_action_at, None, "{}", rec.reason);
    let held = f
        .purchaser
        .store
        .reservations(&rec.request_id)
        .await
        .unwrap();
    let new = held.iter().find(|r| r.id == cr2).unwrap();
    assert_eq!(new.state, ReservationState::Scheduled);
    assert_eq!(
        new.instance_count, 4,
        "the count of a block bought before it is active"
    );

    // AND when its window opens, the workload runs in the new block, none in the failed one
    f.cloud.advance_to(new.start() + f.activation());
    f.deliver().await;
    tick(&f, Function::Launch).await;
    assert_eq!(live_in(&f, &cr2), 4);
    assert_eq!(live_in(&f, &cr), 0);
    assert_eq!(f.status(id).await, RequestStatus::Active);
}

#[tokio::test]
pub(crate) async fn a_training_plan_that_fails_is_bought_again_under_the_next_name() {
    // GIVEN a training-job request that bought its plan, cp-<id>
    let f = Flow::start().await;
    let id = "pay-fail-2";
    let request = training_request(id, 48, "2026-12-02T00:00:00Z", "2026-12-20T11:30:00Z");
    assert_eq!(submit_and_buy(&f, request).await, RequestStatus::Reserved);
    let first = plan_name_for(id, 0);
    // AND SageMaker fails its payment
    f.cloud
        .with_world(|w| w.fail_plan_payment(REGION, &first))
        .expect("the plan is pending");

    // WHEN the payment is checked, the search runs again and purchase buys again
    check_payments(&f, id).await;
    assert_eq!(f.status(id).await, RequestStatus::Searching);
    assert_eq!(f.team_spent("team-b", t0()).await, MicroUsd(0));
    assert_eq!(f.bus_for("Capacity Payment Failed", id).len(), 1);
    tick(&f, Function::Search).await;
    f.deliver().await;

    // THEN the new plan takes the next name instead of colliding with the failed one's
    assert_eq!(
        f.status(id).await,
        RequestStatus::Reserved,
        "{}",
        f.record(id).await.reason
    );
    let names: Vec<String> = f
        .cloud
        .with_world(|w| w.sm.plans.values().map(|p| p.name.clone()).collect());
    assert!(names.contains(&plan_name_for(id, 1)), "{names:?}");
    let reserved = f.bus_for("Capacity Reserved", id);
    assert_eq!(reserved.len(), 2);
    assert_eq!(f.team_spent("team-b", t0()).await, fee_of(&reserved[1]));
}

#[tokio::test]
pub(crate) async fn a_failed_payment_seen_after_the_search_deadline_fails_the_request_with_the_money_back()
 {
    // GIVEN a request whose only feasible start is soon: its search deadline is near
    let f = Flow::start().await;
    let id = "pay-fail-3";
    let mut request = f.ec2_request(id);
    request["duration_hours"] = serde_json::json!(24);
    request["earliest_start"] = serde_json::json!("2026-12-02T11:30:00Z");
    request["latest_end"] = serde_json::json!("2026-12-03T11:30:00Z");
    assert_eq!(submit_and_buy(&f, request).await, RequestStatus::Reserved);
    let cr = f.bus_for("Capacity Reserved", id)[0]["detail"]["reservation_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    f.cloud.with_world(|w| w.fail_payment(&cr)).unwrap();
    // WHEN the failure is first seen after the deadline (the function was down until then)
    f.cloud.advance_to("2026-12-02T11:00:00Z".parse().unwrap());
    tick(&f, Function::Purchase).await;
    // THEN the request fails with its reason and the money back
    let rec = f.record(id).await;
    assert_eq!(rec.status, RequestStatus::Failed);
    assert!(
        rec.reason.contains("too late to search again"),
        "{}",
        rec.reason
    );
    assert_eq!(f.team_spent("team-a", t0()).await, MicroUsd(0));
    assert_eq!(f.bus_for("Capacity Request Failed", id).len(), 1);
}
