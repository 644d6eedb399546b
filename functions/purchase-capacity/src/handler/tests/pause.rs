//! An operator's pause (ARCHITECTURE §9.7): nothing new is bought once it commits, whatever
//! the run read before; what is under way, reconciliation and payment tracking go on; each
//! held-back request is told once, in its reason and history.

use super::*;
use capacity_pilot::fakes::fixtures::pause;

async fn history(w: &World, id: &str) -> Vec<capacity_pilot::ports::HistoryEntry> {
    w.store.history(&request_id(id)).await.unwrap()
}

#[tokio::test]
async fn a_pause_committed_between_a_purchases_read_and_its_lease_stops_the_lease() {
    // GIVEN r1's plan ready to buy, and an operator who pauses after this run read r1
    let w = World::new();
    w.with_candidate(request("r1", "team-a", "5000"), block("cb-1", "1661.18"));
    w.store.pause_before_next(StoreOp::BeginPurchase, pause());
    let p = w.purchaser(CAPS);

    // WHEN the run goes on to take the lease
    let out = p.handle(found("r1", "e1")).await.unwrap();

    // THEN nothing is bought or debited, and r1 says why, in its reason and its history
    assert_eq!(w.market.purchase_count(), 0);
    assert_eq!(w.spent("team-a"), MicroUsd(0));
    let rec = w.record_of("r1").await;
    assert_eq!(rec.status, RequestStatus::OfferingsFound);
    assert_eq!((rec.spent, rec.open_debit), (MicroUsd(0), None));
    assert!(
        rec.reason.starts_with(
            "paused by arn:aws:sts::123456789012:assumed-role/ops/dana since 2026-12-01"
        ) && rec.reason.contains("budget review")
            && rec.reason.contains("cb-1"),
        "{}",
        rec.reason
    );
    let told = history(&w, "r1").await;
    assert_eq!(told.last().unwrap().reason, rec.reason);
    assert!(out.decisions.iter().any(|d| d.action == "paused"));

    // AND a tick under the pause leaves it alone: no pre-flight, no second history entry
    w.clock.advance(Duration::minutes(5));
    let before = w.workloads.calls().len();
    let out = p.handle(tick("t1")).await.unwrap();
    assert!(out.decisions.iter().any(|d| d.action == "paused"));
    assert_eq!(history(&w, "r1").await.len(), told.len());
    assert_eq!(
        w.workloads.calls().len(),
        before,
        "no pre-flight while paused"
    );
    assert_eq!(w.market.purchase_count(), 0);

    // WHEN purchases resume, the next tick buys it, once
    assert_eq!(w.store.delete_pause().await.unwrap(), Some(pause()));
    w.clock.advance(Duration::minutes(5));
    p.handle(tick("t2")).await.unwrap();
    assert_eq!(w.market.purchases_of("cb-1"), 1);
    assert_eq!(w.status("r1").await, RequestStatus::Reserved);
}

#[tokio::test]
async fn an_approval_under_a_pause_buys_nothing_and_is_answered_until_approved_again() {
    // GIVEN r1 awaiting approval of cb-1, and purchases paused
    let w = World::new();
    let mut req = request("r1", "team-a", "5000");
    req.budget.approval_above = Some(Usd::parse("1000").unwrap());
    w.with_candidate(req, block("cb-1", "1661.18"));
    let p = w.purchaser(CAPS);
    p.handle(found("r1", "e1")).await.unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::AwaitingApproval);
    let key = w.events.published_of("Capacity Purchase Awaiting Approval")[0].detail["event_key"]
        .as_str()
        .unwrap()
        .to_string();
    w.store.put_pause(pause()).await.unwrap().unwrap();
    let approve = |id: &str| {
        event(
            "Capacity Purchase Approved",
            "com.example.approvals",
            id,
            json!({"request_id": "r1", "approver": "alice", "approves": key}),
        )
    };

    // WHEN alice approves
    p.handle(approve("a1")).await.unwrap();

    // THEN nothing is bought, r1 still awaits approval saying so, and alice is told
    assert_eq!(w.market.purchase_count(), 0);
    let rec = w.record_of("r1").await;
    assert_eq!(rec.status, RequestStatus::AwaitingApproval);
    assert!(rec.reason.starts_with("paused by"), "{}", rec.reason);
    assert!(rec.reason.contains("approve again"), "{}", rec.reason);
    let refused = w.events.published_of("Capacity Purchase Approval Refused");
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].detail["reason"]
            .as_str()
            .unwrap()
            .contains("budget review")
    );
    // AND the same approval delivered again is not answered twice
    p.handle(approve("a1")).await.unwrap();
    assert_eq!(
        w.events
            .published_of("Capacity Purchase Approval Refused")
            .len(),
        1
    );

    // WHEN purchases resume and alice approves again, it is bought
    w.store.delete_pause().await.unwrap();
    p.handle(approve("a2")).await.unwrap();
    assert_eq!(w.market.purchases_of("cb-1"), 1);
    assert_eq!(w.status("r1").await, RequestStatus::Reserved);
}

#[tokio::test]
async fn under_a_pause_a_purchase_under_way_is_taken_over_and_reconciled() {
    // GIVEN a worker died after buying cb-1, before recording it
    let w = World::new();
    w.with_candidate(request("r1", "team-a", "5000"), block("cb-1", "1661.18"));
    w.store.fail_next(
        StoreOp::RecordReservation,
        PortError::Transient {
            service: "dynamodb",
            code: "InternalServerError".into(),
            message: "crash".into(),
        },
    );
    let p = w.purchaser(CAPS);
    assert!(p.handle(found("r1", "e1")).await.is_err());
    // AND then an operator paused purchases
    w.store.put_pause(pause()).await.unwrap().unwrap();

    // WHEN the lease expires and a tick takes over
    w.clock.advance(LEASE + Duration::minutes(1));
    w.store.advance_to(w.clock.get());
    p.handle(tick("t1")).await.unwrap();

    // THEN the purchase begun before the pause is reconciled: adopted, never bought again
    assert_eq!(w.market.purchase_count(), 1);
    assert_eq!(w.status("r1").await, RequestStatus::Reserved);
    assert_eq!(w.spent("team-a"), MicroUsd(1_661_180_000));
}

#[tokio::test(flavor = "multi_thread")]
async fn under_a_pause_a_failed_payment_is_still_tracked_and_returned() {
    // GIVEN r1 bought cb-1, then purchases paused, then EC2 reports its payment failed
    let w = World::new();
    let (p, cr) = bought(&w).await;
    w.store.put_pause(pause()).await.unwrap().unwrap();
    w.market
        .set_reservation_state(&cr, ReservationState::PaymentFailed);
    w.clock.set(record(&w, "r1").next_action_at.unwrap());

    // WHEN the payment check comes
    p.handle(tick("t1")).await.unwrap();

    // THEN the loss is recorded and the debit returned, pause or not
    assert_eq!(recorded_state(&w).await, ReservationState::PaymentFailed);
    assert_eq!(w.spent("team-a"), MicroUsd(0));
    assert_eq!(w.events.published_of("Capacity Payment Failed").len(), 1);
    // AND the request searches again (searches go on; only its next purchase waits)
    assert_eq!(record(&w, "r1").status, RequestStatus::Searching);
}

#[tokio::test]
async fn a_quiet_tick_under_a_pause_makes_one_read() {
    // GIVEN nothing due, and purchases paused
    let w = World::new();
    w.store.put_pause(pause()).await.unwrap().unwrap();
    let p = w.purchaser(CAPS);
    let before = w.store.calls().len();

    // WHEN a tick comes
    p.handle(tick("t1")).await.unwrap();

    // THEN it read the agenda (the pause with it) and nothing else
    assert_eq!(w.store.calls()[before..], [StoreOp::Agenda]);
}
