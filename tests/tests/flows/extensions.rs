//! ARCHITECTURE §9.3: a window's end is what AWS reports. A team extends its block or plan by
//! hand, in the console (the emulator's control API, through its own extension purchase);
//! cleanup reads the end back and drains before the new end, not the old one.

use capacity_pilot::domain::status::RequestStatus;
use chrono::TimeDelta;
use integration_tests::flow::{Flow, Function, REGION};
use serde_json::json;

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
