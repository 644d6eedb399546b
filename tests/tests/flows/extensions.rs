//! ARCHITECTURE §9.3: a window's end is what AWS reports. A team extends its block or plan by
//! hand, in the console (the emulator's control API, through its own extension purchase);
//! cleanup reads the end back and drains before the new end, not the old one. Or the team
//! asks capacity-pilot (`Capacity Extension Requested` on the bus): the purchase function
//! prices the extension from AWS's offering, debits and buys it once, reads its payment
//! until AWS takes it (the end and the drain move, `Capacity Reservation Extended` with
//! `external: false`) or fails it (the debit goes back, `Capacity Extension Failed`).

use capacity_pilot::domain::extension::ExtensionState;
use capacity_pilot::domain::money::{MicroUsd, Usd};
use capacity_pilot::domain::request::RequestId;
use capacity_pilot::domain::reservation::{Reservation, ReservationState};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::Store;
use chrono::{DateTime, TimeDelta, Utc};
use integration_tests::flow::{BUS, Flow, Function, REGION, SOURCE, t0};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::ec2::{live_for, reserve, time_of};
use crate::sagemaker::{drain_at, submit_and_buy, the_plan, tick, training_request};

const DRAIN_AT_TAG: &str = "capacity-pilot:drain-at";

#[tokio::test]
pub(crate) async fn a_block_extended_by_hand_drains_before_its_new_end_and_a_stale_warning_drains_nothing()
 {
    // GIVEN a block bought and its 4 instances running
    let f = Flow::start().await;
    let id = "ext-block-1";
    let reserved = reserve(&f, id).await;
    let cr = reserved["detail"]["reservation_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let start = time_of(&reserved["detail"]["start"]);
    let end = time_of(&reserved["detail"]["end"]);
    f.cloud.advance_to(start + f.activation());
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Active);
    assert_eq!(live_for(&f, id).len(), 4);

    // WHEN the team extends it by a day in the console, two hours in, and the payment clears
    f.cloud.advance_to(start + TimeDelta::hours(2));
    f.cloud
        .with_world(|w| w.extend_block(&cr, 24))
        .expect("the console extends the block");
    f.cloud.advance_to(start + TimeDelta::hours(3));
    let new_end = end + TimeDelta::days(1);
    assert_eq!(f.cloud.with_world(|w| w.ec2.reservations[&cr].end), new_end);

    // AND the schedule reaches the old drain start (end - 30 min forced - 15 min drain)
    let old_drain = end - TimeDelta::minutes(45);
    f.cloud.advance_to(old_drain);
    f.tick(Function::Cleanup).await.unwrap();

    // THEN nothing is drained: the end was read back and the extension announced, its fee
    // not counted
    assert_eq!(f.status(id).await, RequestStatus::Active);
    assert!(f.bus_for("Capacity Reservation Expiring", id).is_empty());
    let ext = f.bus_for("Capacity Reservation Extended", id);
    assert_eq!(ext.len(), 1, "{ext:#?}");
    assert_eq!(ext[0]["detail"]["external"], json!(true));
    assert_eq!(time_of(&ext[0]["detail"]["ends_at"]), new_end);
    let new_drain = old_drain + TimeDelta::days(1);
    assert_eq!(time_of(&ext[0]["detail"]["drain_at"]), new_drain);
    // AND every instance carries the new drain-at
    for i in live_for(&f, id) {
        assert_eq!(
            i.tags.get(DRAIN_AT_TAG).map(String::as_str),
            Some(
                new_drain
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    .as_str()
            ),
            "{}",
            i.id
        );
    }

    // WHEN AWS's Expiration Warning for the old end comes (the harsh reading: it does not
    // follow the extension) and is delivered
    f.cloud.advance_to(end - TimeDelta::minutes(40));
    let warnings: Vec<_> = f
        .cloud
        .events("default")
        .into_iter()
        .filter(|e| {
            e["detail-type"] == "Capacity Block Expiration Warning"
                && e["detail"]["capacity-reservation-id"] == cr.as_str()
        })
        .collect();
    assert_eq!(warnings.len(), 1, "the old end's warning came");
    f.deliver().await;
    // THEN nothing drains: the warning is for an end that has since moved
    assert_eq!(f.status(id).await, RequestStatus::Active);
    assert_eq!(live_for(&f, id).len(), 4);

    // WHEN the new drain start comes
    f.cloud.advance_to(new_drain);
    f.tick(Function::Cleanup).await.unwrap();
    // THEN it drains, ahead of the new forced termination
    assert_eq!(f.status(id).await, RequestStatus::Draining);
    assert!(live_for(&f, id).is_empty());
    let expiring = f.bus_for("Capacity Reservation Expiring", id);
    assert_eq!(
        time_of(&expiring[0]["detail"]["forced_termination_at"]),
        new_end - TimeDelta::minutes(30)
    );
}

#[tokio::test]
pub(crate) async fn a_plan_extended_by_hand_is_not_drained_at_its_old_end() {
    // GIVEN a training plan bought and its job launched
    let f = Flow::start().await;
    let id = "ext-plan-1";
    let request = training_request(id, 48, "2026-12-03T00:00:00Z", "2026-12-20T11:30:00Z");
    assert_eq!(submit_and_buy(&f, request).await, RequestStatus::Reserved);
    let plan = the_plan(&f, id);
    let seg = plan.offering.segments[0].clone();
    f.cloud.advance_to(seg.start);
    tick(&f, Function::Launch).await;
    assert_eq!(f.status(id).await, RequestStatus::Active);

    // WHEN the team extends the plan by a day (as ExtendTrainingPlan would), and the
    // schedule reaches the old drain start
    f.cloud.advance_to(seg.start + TimeDelta::hours(2));
    f.cloud
        .with_world(|w| w.extend_plan(REGION, &plan.name, 24))
        .expect("the plan is extended");
    f.cloud.advance_to(drain_at(&seg));
    tick(&f, Function::Cleanup).await;

    // THEN the plan was read back (DescribeTrainingPlan): nothing drains then, and the new
    // end is announced
    assert!(f.bus_for("Capacity Reservation Expiring", id).is_empty());
    let ext = f.bus_for("Capacity Reservation Extended", id);
    assert_eq!(ext.len(), 1, "{ext:#?}");
    assert_eq!(
        time_of(&ext[0]["detail"]["ends_at"]),
        seg.end + TimeDelta::days(1)
    );
    assert_eq!(
        time_of(&ext[0]["detail"]["drain_at"]),
        drain_at(&seg) + TimeDelta::days(1)
    );
}

/// Plays `flow` on a thread of its own with 16 MiB of stack. In a debug build the purchase
/// function's frames on the way from the ask to the purchase call take about 1.3 MiB (its
/// handler's alone about 430 KiB, the ask's and the lease's about 250 KiB each), within
/// 128 KiB of a test thread's 2 MiB with the harness's; a deployed function is a release
/// build on Lambda's 8 MiB main thread.
fn on_a_roomy_thread<F: std::future::Future<Output = ()> + 'static>(flow: fn() -> F) {
    std::thread::Builder::new()
        .name("extension-flow".into())
        .stack_size(16 << 20)
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(flow())
        })
        .expect("a thread")
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
}

/// The request's `extend` policy of these flows: asked for by the team, up to two days and
/// $10000 in all.
fn extend_policy() -> Value {
    json!({"when": "requested", "max_hours": 48, "max_upfront_usd": "10000"})
}

fn usd_of(v: &Value) -> MicroUsd {
    Usd::parse(v.as_str().expect("a decimal string"))
        .unwrap()
        .to_micros_ceil()
}

/// The request's reservations as recorded.
async fn held(f: &Flow, id: &str) -> Vec<Reservation> {
    f.table
        .store()
        .reservations(&RequestId::parse(id).unwrap())
        .await
        .unwrap()
}

/// The request's own next action (its payment check while Reserved) runs: the reservation
/// is recorded paid and scheduled, as AWS reports it.
async fn paid(f: &Flow, id: &str) {
    let at = f
        .record(id)
        .await
        .next_action_at
        .expect("a payment check is due");
    f.cloud.advance_to(at);
    tick(f, Function::Purchase).await;
    let held = held(f, id).await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].state, ReservationState::Scheduled, "{held:#?}");
}

/// The team's `Capacity Extension Requested` for `id` by `hours`, put on our bus from the
/// request's source and delivered by the template's rules (to the purchase function).
async fn ask_extension(f: &Flow, id: &str, hours: u32) {
    let detail = json!({"request_id": id, "hours": hours});
    f.cloud
        .with_world(|w| {
            w.events_call(
                REGION,
                "PutEvents",
                &json!({"Entries": [{
                    "Source": SOURCE,
                    "DetailType": "Capacity Extension Requested",
                    "Detail": detail.to_string(),
                    "EventBusName": BUS,
                }]}),
            )
        })
        .expect("the ask is put on the bus");
    f.deliver().await;
}

/// The schedule reaches the time the request's open extension is next due a look (its
/// payment read) and the purchase function runs.
async fn read_extension_when_due(f: &Flow, id: &str) {
    let due = held(f, id).await[0]
        .extension_due()
        .expect("an extension is due a look");
    f.cloud.advance_to(due.max(f.cloud.now()));
    tick(f, Function::Purchase).await;
}

/// The one `Capacity Extension Offered` for `id`: the extension's fee.
fn offered_fee(f: &Flow, id: &str) -> MicroUsd {
    let offered = f.bus_for("Capacity Extension Offered", id);
    assert_eq!(offered.len(), 1, "{offered:#?}");
    assert_eq!(offered[0]["detail"]["hours"], json!(24));
    assert_eq!(offered[0]["detail"]["needs_approval"], json!(false));
    usd_of(&offered[0]["detail"]["upfront_fee_usd"])
}

/// The emulator's control route `POST /_local/extension-payment-fails`: the next extension
/// bought for `reservation` fails its payment.
async fn fail_next_extension_payment(f: &Flow, reservation: &str) {
    let request = http::Request::post("/_local/extension-payment-fails")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            json!({ "reservation": reservation }).to_string(),
        ))
        .unwrap();
    let response = f.cloud.router().oneshot(request).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["armed"], reservation, "{body}");
}

#[test]
pub(crate) fn a_block_extension_the_team_asks_for_is_bought_once_and_moves_the_drain_once_paid() {
    on_a_roomy_thread(block_extension_paid);
}

async fn block_extension_paid() {
    // GIVEN a block bought for a request whose policy lets the team extend it, its payment
    // taken
    let f = Flow::start().await;
    let id = "ext-ask-block-1";
    let mut request = f.ec2_request(id);
    request["extend"] = extend_policy();
    f.submit(request).await;
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    let reserved = f.bus_for("Capacity Reserved", id)[0].clone();
    let block_fee = usd_of(&reserved["detail"]["upfront_fee_usd"]);
    let cr = reserved["detail"]["reservation_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let start = time_of(&reserved["detail"]["start"]);
    let end = time_of(&reserved["detail"]["end"]);
    paid(&f, id).await;

    // WHEN the team asks for a day more
    ask_extension(&f, id, 24).await;

    // THEN the extension is priced from AWS's offering, bought once and debited once, its
    // payment pending: the end and the drain stay where they were
    let fee = offered_fee(&f, id);
    assert!(fee.0 > 0);
    let bought = f
        .cloud
        .with_world(|w| w.ec2.reservations[&cr].extensions.clone());
    assert_eq!(bought.len(), 1, "{bought:#?}");
    assert!(!bought[0].by_hand);
    assert_eq!(bought[0].hours, 24);
    assert_eq!(bought[0].status, "payment-pending");
    assert_eq!(usd_of(&json!(bought[0].upfront_fee.to_string())), fee);
    assert_eq!(
        f.team_spent("team-a", t0()).await,
        MicroUsd(block_fee.0 + fee.0)
    );
    let r = held(&f, id).await[0].clone();
    assert_eq!(r.extensions.len(), 1);
    assert_eq!(
        r.extensions[0].state,
        ExtensionState::PaymentPending,
        "{}",
        r.extensions[0].reason
    );
    assert_eq!(r.end(), end);
    assert!(f.bus_for("Capacity Reservation Extended", id).is_empty());
    // AND the same ask delivered again buys nothing more
    let again = f
        .cloud
        .events(BUS)
        .into_iter()
        .find(|e| e["detail-type"] == "Capacity Extension Requested")
        .expect("the ask on the bus");
    f.invoke(Function::Purchase, serde_json::from_value(again).unwrap())
        .await
        .unwrap();
    assert_eq!(
        f.cloud
            .with_world(|w| w.ec2.reservations[&cr].extensions.len()),
        1
    );

    // WHEN AWS takes the payment and the schedule reads it
    read_extension_when_due(&f, id).await;

    // THEN the block ends a day later, as recorded, and the extension is announced as
    // capacity-pilot's, its window draining a day later
    let new_end = end + TimeDelta::days(1);
    assert_eq!(f.cloud.with_world(|w| w.ec2.reservations[&cr].end), new_end);
    let r = held(&f, id).await[0].clone();
    assert_eq!(r.end(), new_end);
    assert_eq!(r.extensions[0].state, ExtensionState::Succeeded);
    assert_eq!(r.extension_due(), None);
    let old_drain = end - TimeDelta::minutes(45);
    let new_drain = old_drain + TimeDelta::days(1);
    let ext = f.bus_for("Capacity Reservation Extended", id);
    assert_eq!(ext.len(), 1, "{ext:#?}");
    assert_eq!(ext[0]["detail"]["external"], json!(false));
    assert_eq!(ext[0]["detail"]["reservation_id"], cr.as_str());
    assert_eq!(time_of(&ext[0]["detail"]["previous_ends_at"]), end);
    assert_eq!(time_of(&ext[0]["detail"]["ends_at"]), new_end);
    assert_eq!(time_of(&ext[0]["detail"]["drain_at"]), new_drain);
    // AND the team's ledger holds the block and the extension, each once
    assert_eq!(
        f.team_spent("team-a", t0()).await,
        MicroUsd(block_fee.0 + fee.0)
    );
    assert!(f.bus_for("Capacity Extension Failed", id).is_empty());

    // WHEN the block opens, its workload runs, and the schedule reaches the old drain
    f.cloud.advance_to(start + f.activation());
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Active);
    f.cloud.advance_to(old_drain);
    f.tick(Function::Cleanup).await.unwrap();
    // THEN nothing drains then, and the extension is not announced again
    assert_eq!(f.status(id).await, RequestStatus::Active);
    assert_eq!(live_for(&f, id).len(), 4);
    assert!(f.bus_for("Capacity Reservation Expiring", id).is_empty());
    assert_eq!(f.bus_for("Capacity Reservation Extended", id).len(), 1);
    // AND at the new drain it drains
    f.cloud.advance_to(new_drain);
    f.tick(Function::Cleanup).await.unwrap();
    assert_eq!(f.status(id).await, RequestStatus::Draining);
    assert!(live_for(&f, id).is_empty());
}

#[test]
pub(crate) fn a_plan_extension_the_team_asks_for_is_bought_once_and_moves_the_drain_once_paid() {
    on_a_roomy_thread(plan_extension_paid);
}

async fn plan_extension_paid() {
    // GIVEN a training plan bought for a training job whose request lets the team extend
    // it, its payment taken
    let f = Flow::start().await;
    let id = "ext-ask-plan-1";
    let mut request = training_request(id, 48, "2026-12-03T00:00:00Z", "2026-12-20T11:30:00Z");
    request["extend"] = extend_policy();
    assert_eq!(submit_and_buy(&f, request).await, RequestStatus::Reserved);
    let plan = the_plan(&f, id);
    let seg = plan.offering.segments.last().unwrap().clone();
    let plan_fee = usd_of(&f.bus_for("Capacity Reserved", id)[0]["detail"]["upfront_fee_usd"]);
    paid(&f, id).await;

    // WHEN the team asks for a day more
    ask_extension(&f, id, 24).await;

    // THEN it is offered for the plan's ARN, bought once (ExtendTrainingPlan) and debited
    // once, its payment pending
    let fee = offered_fee(&f, id);
    let bought = f.cloud.with_world(|w| {
        w.sm.plans
            .values()
            .find(|p| p.arn == plan.arn)
            .unwrap()
            .extensions
            .clone()
    });
    assert_eq!(bought.len(), 1, "{bought:#?}");
    assert_eq!(bought[0].hours, 24);
    assert!(!bought[0].paid && !bought[0].failed);
    assert_eq!(usd_of(&json!(bought[0].upfront_fee.to_string())), fee);
    assert_eq!(
        f.team_spent("team-b", t0()).await,
        MicroUsd(plan_fee.0 + fee.0)
    );
    let r = held(&f, id).await[0].clone();
    assert_eq!(r.id, plan.arn);
    assert_eq!(r.extensions[0].state, ExtensionState::PaymentPending);
    assert_eq!(r.end(), seg.end);

    // WHEN SageMaker takes the payment and the schedule reads it
    read_extension_when_due(&f, id).await;

    // THEN the plan ends a day later, as recorded, and the extension is announced as
    // capacity-pilot's, the job's drain a day later
    let new_end = seg.end + TimeDelta::days(1);
    let plan_end: DateTime<Utc> = f.cloud.with_world(|w| {
        w.sm.plans
            .values()
            .find(|p| p.arn == plan.arn)
            .unwrap()
            .offering
            .segments
            .last()
            .unwrap()
            .end
    });
    assert_eq!(plan_end, new_end);
    let r = held(&f, id).await[0].clone();
    assert_eq!(r.end(), new_end);
    assert_eq!(
        r.extensions[0].state,
        ExtensionState::Succeeded,
        "{}",
        r.extensions[0].reason
    );
    let ext = f.bus_for("Capacity Reservation Extended", id);
    assert_eq!(ext.len(), 1, "{ext:#?}");
    assert_eq!(ext[0]["detail"]["external"], json!(false));
    assert_eq!(time_of(&ext[0]["detail"]["ends_at"]), new_end);
    assert_eq!(
        time_of(&ext[0]["detail"]["drain_at"]),
        drain_at(&seg) + TimeDelta::days(1)
    );
    assert_eq!(
        f.team_spent("team-b", t0()).await,
        MicroUsd(plan_fee.0 + fee.0)
    );

    // WHEN its job runs and the schedule reaches the old drain
    f.cloud.advance_to(seg.start);
    tick(&f, Function::Launch).await;
    assert_eq!(f.status(id).await, RequestStatus::Active);
    f.cloud.advance_to(drain_at(&seg));
    tick(&f, Function::Cleanup).await;
    // THEN nothing drains, and the extension is not announced again
    assert_eq!(f.status(id).await, RequestStatus::Active);
    assert!(f.bus_for("Capacity Reservation Expiring", id).is_empty());
    assert_eq!(f.bus_for("Capacity Reservation Extended", id).len(), 1);
}

#[test]
pub(crate) fn a_block_extension_whose_payment_fails_gives_its_fee_back_and_keeps_the_end() {
    on_a_roomy_thread(block_extension_payment_failed);
}

async fn block_extension_payment_failed() {
    // GIVEN a block bought for a request whose policy lets the team extend it, its payment
    // taken, and EC2 set to fail the payment of its next extension (the control route)
    let f = Flow::start().await;
    let id = "ext-ask-block-2";
    let mut request = f.ec2_request(id);
    request["extend"] = extend_policy();
    let reserved = {
        f.submit(request).await;
        f.deliver().await;
        assert_eq!(f.status(id).await, RequestStatus::Reserved);
        f.bus_for("Capacity Reserved", id)[0].clone()
    };
    let block_fee = usd_of(&reserved["detail"]["upfront_fee_usd"]);
    let cr = reserved["detail"]["reservation_ids"][0]
        .as_str()
        .unwrap()
        .to_string();
    let end = time_of(&reserved["detail"]["end"]);
    paid(&f, id).await;
    fail_next_extension_payment(&f, &cr).await;

    // WHEN the team asks for a day more
    ask_extension(&f, id, 24).await;
    // THEN it is bought and debited, its payment pending
    let fee = offered_fee(&f, id);
    assert_eq!(
        f.team_spent("team-a", t0()).await,
        MicroUsd(block_fee.0 + fee.0)
    );
    assert_eq!(
        held(&f, id).await[0].extensions[0].state,
        ExtensionState::PaymentPending
    );

    // WHEN EC2 fails the payment and the schedule reads it
    read_extension_when_due(&f, id).await;

    // THEN the extension failed: the block keeps its end, the fee is back in the ledger,
    // and the team is told why
    assert_eq!(
        f.cloud
            .with_world(|w| w.ec2.reservations[&cr].extensions[0].status.clone()),
        "payment-failed"
    );
    assert_eq!(f.cloud.with_world(|w| w.ec2.reservations[&cr].end), end);
    let r = held(&f, id).await[0].clone();
    assert_eq!(r.end(), end);
    assert_eq!(r.extensions[0].state, ExtensionState::Failed);
    assert_eq!(r.extension_due(), None);
    assert_eq!(f.team_spent("team-a", t0()).await, block_fee);
    let failed = f.bus_for("Capacity Extension Failed", id);
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(usd_of(&failed[0]["detail"]["returned_usd"]), fee);
    assert_eq!(
        failed[0]["detail"]["extension"]["reservation_id"],
        cr.as_str()
    );
    assert!(
        failed[0]["detail"]["reason"]
            .as_str()
            .unwrap()
            .contains("did not take the payment"),
        "{}",
        failed[0]["detail"]["reason"]
    );
    assert!(f.bus_for("Capacity Reservation Extended", id).is_empty());
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
}
