//! Windows with their own state (ARCHITECTURE §8.4), through the real handlers: a split's
//! kept block launches at its own start while its replacement is bought after it, and a plan
//! whose windows all passed while cleanup was down is cleaned up and ended, not left waiting.

use capacity_pilot::domain::offering::{Offering, Product};
use capacity_pilot::domain::planner::Plan;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::{CapacityMarket, Cause, OfferingQuery, Store, Transition};
use chrono::{DateTime, TimeDelta, Utc};
use integration_tests::flow::{Flow, Function, REGION, t0};

use crate::sagemaker::{drain_at, job, submit_and_buy, the_plan, tick, training_request};
use serde_json::{Value, json};

fn time_of(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

/// What the bus carried for `id`, by detail type, in order.
fn published(f: &Flow, id: &str) -> Vec<String> {
    f.cloud
        .events(integration_tests::flow::BUS)
        .into_iter()
        .filter(|e| e["detail"]["request_id"] == id)
        .map(|e| e["detail-type"].as_str().unwrap().to_string())
        .collect()
}

pub(crate) fn live_in(f: &Flow, cr: &str) -> usize {
    f.cloud.with_world(|w| {
        w.ec2
            .instances
            .values()
            .filter(|i| i.capacity_reservation_id.as_deref() == Some(cr))
            .filter(|i| i.state == "running" || i.state == "pending")
            .count()
    })
}

/// The request's recorded plan replaced by a split whose first block is `first` (a real
/// offering) and whose second block is an offering the emulator does not know: buying it
/// answers `InvalidCapacityBlockOfferingIdNotFound`, as when another customer took it
/// between the search and the purchase.
async fn split_whose_second_block_is_gone(f: &Flow, id: &str, first: &Offering) {
    let mut gone = first.clone();
    gone.id = format!("cb-{}", "f".repeat(17));
    for s in &mut gone.segments {
        s.start += TimeDelta::days(1);
        s.end += TimeDelta::days(1);
    }
    let plan = Plan {
        offerings: vec![first.clone(), gone.clone()],
        product: Product::CapacityBlock,
        region: first.region.clone(),
        instance_type: first.instance_type.clone(),
        instance_count: first.instance_count,
        upfront_fee: first.upfront_fee + gone.upfront_fee,
        start: first.segments[0].start,
        end: gone.segments[0].end,
        segments: 2,
        covered_hours: first.instance_hours + gone.instance_hours,
        on_demand_cost: None,
        saving: None,
        reason: "a split the test chose".into(),
    };
    let store = &f.purchaser.store;
    let rec = f.record(id).await;
    assert_eq!(rec.status, RequestStatus::OfferingsFound);
    let back = Transition::of(
        &rec,
        RequestStatus::Searching,
        "test",
        Some(t0()),
        t0(),
        &Cause::new("test-back"),
    );
    store.transition(back).await.unwrap();
    let rec = f.record(id).await;
    let mut found = Transition::of(
        &rec,
        RequestStatus::OfferingsFound,
        "test: a split",
        Some(t0()),
        t0(),
        &Cause::new("test-split"),
    );
    found.candidates = Some(vec![plan]);
    store.transition(found).await.unwrap();
}

#[tokio::test]
pub(crate) async fn a_splits_kept_first_block_launches_at_its_own_start_while_a_later_replacement_is_bought()
 {
    // GIVEN a 48 h request whose chosen plan is a split: the earliest 24 h block, then a
    // block that is gone by the time it is bought
    let f = Flow::start().await;
    let id = "split-kept-1";
    let mut request = f.ec2_request(id);
    request["allow_split"] = json!(true);
    f.submit(request).await;
    let req = f.record(id).await.request;
    let mut blocks = f
        .searcher
        .market
        .search(&OfferingQuery {
            product: Product::CapacityBlock,
            region: REGION.into(),
            instance_type: req.instance_types[0].clone(),
            instance_count: req.instance_count,
            duration_hours: 24,
            start_from: req.window.earliest_start,
            end_by: req.window.latest_end - TimeDelta::days(3),
        })
        .await
        .unwrap();
    blocks.sort_by_key(|o| o.segments[0].start);
    let first = blocks.first().expect("a 24 h block").clone();
    split_whose_second_block_is_gone(&f, id, &first).await;

    // WHEN purchase-capacity buys it: the first block is bought, the second has gone, and
    // the request searches one replacement block for the rest, which it then buys
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Searching);
    f.tick(Function::Search).await.unwrap();
    f.deliver().await;

    // THEN two blocks are held: the kept first one, and a replacement starting after it
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    assert_eq!(f.blocks_for(id), 2);
    let rec = f.record(id).await;
    let held = f
        .purchaser
        .store
        .reservations(&rec.request_id)
        .await
        .unwrap();
    let kept = held
        .iter()
        .find(|r| r.offering_id.as_deref() == Some(first.id.as_str()))
        .expect("the kept first block")
        .clone();
    let replacement = held.iter().find(|r| r.id != kept.id).unwrap().clone();
    assert!(replacement.start() >= kept.end(), "{held:#?}");
    // ... due first for the check of its payments (ARCHITECTURE 8.5)
    let check = rec.next_action_at.expect("a payment check");
    assert!(check < kept.start(), "{check}");
    f.cloud.advance_to(check);
    f.tick(Function::Purchase).await.unwrap();
    // ... and once both are paid, at the kept block's start, not the replacement's
    let rec = f.record(id).await;
    assert_eq!(rec.next_action_at, None, "{}", rec.reason);
    assert_eq!(
        capacity_pilot::domain::window::window_action_at(&rec.windows),
        Some(kept.start())
    );

    // WHEN the kept block opens and EC2 announces it
    f.cloud.advance_to(kept.start() + f.activation());
    f.deliver().await;

    // THEN its instances run in it, and its launch is announced as segment 0
    assert_eq!(live_in(&f, &kept.id), 4);
    assert_eq!(live_in(&f, &replacement.id), 0);
    assert_eq!(f.status(id).await, RequestStatus::Active);
    let launched = f.bus_for("Capacity Workload Launched", id);
    assert_eq!(launched.len(), 1, "{launched:#?}");
    assert_eq!(launched[0]["detail"]["reservation_id"], kept.id.as_str());
    assert_eq!(launched[0]["detail"]["segment"], 0);
    assert_eq!(
        time_of(&launched[0]["detail"]["planned_start"]),
        kept.start()
    );

    // WHEN the kept block drains and ends, and the replacement opens, drains and ends
    let drain = |end: DateTime<Utc>| end - TimeDelta::minutes(45);
    f.cloud.advance_to(drain(kept.end()));
    f.tick(Function::Cleanup).await.unwrap();
    assert_eq!(
        live_in(&f, &kept.id),
        0,
        "drained before forced termination"
    );
    f.cloud.advance_to(kept.end());
    f.deliver().await;
    f.tick(Function::Cleanup).await.unwrap();
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    f.cloud.advance_to(replacement.start() + f.activation());
    f.deliver().await;
    assert_eq!(live_in(&f, &replacement.id), 4);
    f.cloud.advance_to(drain(replacement.end()));
    f.tick(Function::Cleanup).await.unwrap();
    f.cloud.advance_to(replacement.end());
    f.deliver().await;
    f.tick(Function::Cleanup).await.unwrap();

    // THEN each block had its own window: launched, drained and ended once, in order
    assert_eq!(f.status(id).await, RequestStatus::Ended);
    let launched = f.bus_for("Capacity Workload Launched", id);
    assert_eq!(launched.len(), 2);
    assert_eq!(
        launched[1]["detail"]["reservation_id"],
        replacement.id.as_str()
    );
    assert_eq!(launched[1]["detail"]["segment"], 1);
    let drained = f.bus_for("Capacity Workload Drained", id);
    assert_eq!(drained.len(), 2, "{drained:#?}");
    for (d, r) in drained.iter().zip([&kept, &replacement]) {
        assert_eq!(d["detail"]["reservation_id"], r.id.as_str());
        assert_eq!(d["detail"]["resource_ids"].as_array().unwrap().len(), 4);
    }
    let ended = f.bus_for("Capacity Reservation Ended", id);
    assert_eq!(ended.len(), 2, "{ended:#?}");
    assert_eq!(ended[0]["detail"]["reservation_ids"], json!([kept.id]));
    assert_eq!(
        ended[1]["detail"]["reservation_ids"],
        json!([replacement.id])
    );
    let after_reserved: Vec<String> = published(&f, id)
        .into_iter()
        .skip_while(|d| d != "Capacity Workload Launched")
        .collect();
    assert_eq!(
        after_reserved,
        [
            "Capacity Workload Launched",
            "Capacity Reservation Expiring",
            "Capacity Workload Drained",
            "Capacity Reservation Ended",
            "Capacity Workload Launched",
            "Capacity Reservation Expiring",
            "Capacity Workload Drained",
            "Capacity Reservation Ended",
        ]
    );
}

#[tokio::test]
pub(crate) async fn a_plan_whose_windows_all_passed_while_cleanup_was_down_is_cleaned_up_and_ended()
{
    // GIVEN a 72 h training request that seed 11's market can only serve as a two-segment
    // plan (Dec 17-18 in one zone, Dec 18-20 in another), bought
    let f = Flow::start().await;
    let id = "tp-outage-1";
    let mut request = training_request(id, 72, "2026-12-17T11:30:00Z", "2026-12-20T11:30:00Z");
    request["allow_split"] = json!(true);
    assert_eq!(submit_and_buy(&f, request).await, RequestStatus::Reserved);
    let plan = the_plan(&f, id);
    let segs = plan.offering.segments.clone();
    assert_eq!(segs.len(), 2);
    let (s0, s1) = (format!("cp-{id}-s0"), format!("cp-{id}-s1"));

    // WHEN each segment opens, launch-workloads runs, but cleanup-expired is down from the
    // first segment's start until after the last segment's end
    f.cloud.advance_to(segs[0].start);
    tick(&f, Function::Launch).await;
    assert!(job(&f, &s0).is_some());
    f.cloud.advance_to(segs[1].start);
    tick(&f, Function::Launch).await;
    // THEN the second segment's job runs in its own window, whatever became of the first
    assert_eq!(
        job(&f, &s1)
            .expect("second segment's job")
            .plan_arn
            .as_deref(),
        Some(plan.arn.as_str())
    );

    // WHEN cleanup comes back after both windows have passed
    f.cloud.advance_to(segs[1].end + TimeDelta::minutes(5));
    tick(&f, Function::Cleanup).await;

    // THEN every window is drained (late) and cleaned up once, and the request has ended:
    // it does not wait again for a window that is over
    assert_eq!(f.status(id).await, RequestStatus::Ended);
    let drained = f.bus_for("Capacity Workload Drained", id);
    assert_eq!(drained.len(), 2, "{drained:#?}");
    assert_eq!(
        drained[0]["detail"]["segment"],
        0,
        "{drained:#?} {:#?}",
        f.record(id).await
    );
    assert_eq!(drained[1]["detail"]["segment"], 1);
    for d in &drained {
        assert!(time_of(&d["detail"]["drained_at"]) > drain_at(&segs[1]));
    }
    let ended = f.bus_for("Capacity Reservation Ended", id);
    assert_eq!(ended.len(), 1, "{ended:#?}");
    assert_eq!(ended[0]["detail"]["reservation_ids"], json!([plan.arn]));
    let rec = f.record(id).await;
    assert!(
        rec.windows.iter().all(|w| w.next_action_at.is_none()),
        "{rec:#?}"
    );
    assert_eq!(rec.due_at(), None);

    // AND later ticks of every function change nothing
    f.cloud.advance_to(segs[1].end + TimeDelta::hours(1));
    f.tick_all().await;
    assert_eq!(f.status(id).await, RequestStatus::Ended);
    assert_eq!(f.bus_for("Capacity Workload Drained", id).len(), 2);
    assert_eq!(f.bus_for("Capacity Reservation Ended", id).len(), 1);
}
