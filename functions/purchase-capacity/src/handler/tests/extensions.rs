//! Extensions bought exactly once and within budget (ARCHITECTURE §9.3): asked, priced,
//! approved, leased and debited, marked, bought, reconciled in doubt and read until paid.

use super::*;
use capacity_pilot::domain::extension::{
    ExtendPolicy, ExtendWhen, ExtensionPayment, ExtensionState,
};
use capacity_pilot::domain::reservation::Reservation;
use capacity_pilot::fakes::errors;

const SOURCE: &str = "com.example.ml-platform";

/// `Capacity Extension Requested` for r1 by `hours`.
fn ask(event_id: &str, hours: u32) -> EventBridgeEvent<Value> {
    event(
        "Capacity Extension Requested",
        SOURCE,
        event_id,
        json!({"request_id": "r1", "hours": hours}),
    )
}

fn decision(verb: &str, event_id: &str, key: &str) -> EventBridgeEvent<Value> {
    event(
        &format!("Capacity Purchase {verb}"),
        "com.example.approvals",
        event_id,
        json!({"request_id": "r1", "approver": "lead", "approves": key}),
    )
}

fn policy(max_hours: u32, max_upfront: &str) -> ExtendPolicy {
    ExtendPolicy {
        when: ExtendWhen::Requested,
        max_hours,
        max_upfront_usd: Usd::parse(max_upfront).unwrap(),
    }
}

/// GIVEN r1 (max $5000, `extend` as given, approval above `approval_above`) bought cb-1
/// ($1661.18), its payment taken (scheduled), and the market selling extensions at $10 an
/// instance-hour ($480 a day for its 2 instances).
async fn scheduled(w: &World, extend: ExtendPolicy, approval_above: Option<&str>) -> (P, String) {
    let mut req = request("r1", "team-a", "5000");
    req.extend = Some(extend);
    req.budget.approval_above = approval_above.map(|a| Usd::parse(a).unwrap());
    w.with_candidate(req, block("cb-1", "1661.18"));
    let p = w.purchaser(CAPS);
    p.handle(found("r1", "e1")).await.unwrap();
    let cr = held(w)[0].id.clone();
    w.market
        .set_reservation_state(&cr, ReservationState::Scheduled);
    w.clock.set(record(w, "r1").next_action_at.unwrap());
    p.handle(tick("t-paid")).await.unwrap();
    assert_eq!(held(w)[0].state, ReservationState::Scheduled);
    w.market.offer_extensions(Usd::parse("10").unwrap());
    (p, cr)
}

fn held(w: &World) -> Vec<Reservation> {
    let rt = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| {
        rt.block_on(
            w.store
                .reservations(&capacity_pilot::fakes::fixtures::request_id("r1")),
        )
    })
    .unwrap()
}

/// The tick when the first extension is next due a look.
async fn tick_when_due(w: &World, p: &P, event_id: &str) {
    let due = held(w)[0]
        .extension_due()
        .expect("an extension is due a look");
    w.clock.set(due.max(w.clock.get()));
    p.handle(tick(event_id)).await.unwrap();
}

const FEE_1661: i64 = 1_661_180_000;
const DAY_FEE: i64 = 480_000_000;

#[tokio::test(flavor = "multi_thread")]
async fn a_requested_extension_is_priced_bought_once_and_moves_the_drain_once_paid() {
    let w = World::new();
    let (p, cr) = scheduled(&w, policy(72, "2000"), None).await;
    let end = held(&w)[0].end();
    let drain = record(&w, "r1").windows[0].clone();
    // WHEN the team asks for a day more
    p.handle(ask("x1", 24)).await.unwrap();
    // THEN the offering is announced and bought once, its fee debited, its payment pending
    assert_eq!(w.market.extensions_bought(&cr), 1);
    assert_eq!(w.market.calls_of(MarketOp::Extend), 1);
    let offered = w.events.published_of("Capacity Extension Offered");
    assert_eq!(offered.len(), 1);
    assert_eq!(offered[0].detail["hours"], json!(24));
    assert_eq!(offered[0].detail["upfront_fee_usd"], json!("480"));
    assert_eq!(offered[0].detail["needs_approval"], json!(false));
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + DAY_FEE));
    let e = held(&w)[0].extensions[0].clone();
    assert_eq!(e.state, ExtensionState::PaymentPending, "{}", e.reason);
    assert!(e.called_at.is_some());
    // AND the drain stays where it was while the payment is pending
    assert_eq!(held(&w)[0].end(), end);
    assert_eq!(record(&w, "r1").windows[0], drain);
    // AND a second delivery of the ask buys nothing more
    p.handle(ask("x1", 24)).await.unwrap();
    assert_eq!(w.market.calls_of(MarketOp::Extend), 1);
    // WHEN AWS takes the payment and the extension is read
    assert_eq!(w.market.settle_extensions(ExtensionPayment::Succeeded), 1);
    tick_when_due(&w, &p, "t1").await;
    // THEN the reservation ends a day later, the window drains a day later, and the
    // extension is announced as capacity-pilot's
    let r = held(&w)[0].clone();
    assert_eq!(r.end(), end + Duration::hours(24));
    assert_eq!(r.extensions[0].state, ExtensionState::Succeeded);
    assert_eq!(r.extension_due(), None);
    let ext = w.events.published_of("Capacity Reservation Extended");
    assert_eq!(ext.len(), 1);
    assert_eq!(ext[0].detail["external"], json!(false));
    assert_eq!(ext[0].detail["ends_at"], json!(end + Duration::hours(24)));
    let rec = record(&w, "r1");
    assert_eq!(
        rec.windows[0].notices.as_ref().and_then(|n| n.end_moved_at),
        Some(w.clock.get())
    );
    // AND the fee was debited once
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + DAY_FEE));
    assert_eq!(rec.spent, MicroUsd(FEE_1661 + DAY_FEE));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_response_then_the_listing_lag_extends_once() {
    let w = World::new();
    let (p, cr) = scheduled(&w, policy(72, "2000"), None).await;
    // GIVEN the history lists a new extension only 8 minutes after its purchase
    w.market.set_listing_lag_time(Duration::minutes(8));
    // WHEN the purchase is made but its answer is lost
    w.market
        .apply_then_fail_next(MarketOp::Extend, errors::outcome_unknown("ec2"));
    p.handle(ask("x1", 24)).await.unwrap();
    assert_eq!(w.market.extensions_bought(&cr), 1);
    let e = held(&w)[0].extensions[0].clone();
    assert_eq!(e.state, ExtensionState::Buying);
    assert!(e.called_at.is_some() && e.doubt_since.is_some());
    // AND the lease expires while the history does not list it yet
    tick_when_due(&w, &p, "t1").await;
    let e = held(&w)[0].extensions[0].clone();
    assert_eq!(e.state, ExtensionState::Buying, "{}", e.reason);
    assert!(e.reason.contains("in doubt"), "{}", e.reason);
    // AND the ask comes again meanwhile
    p.handle(ask("x2", 24)).await.unwrap();
    // THEN nothing more is bought: a look once it is listed adopts the one bought
    tick_when_due(&w, &p, "t2").await;
    assert_eq!(w.market.calls_of(MarketOp::Extend), 1);
    assert_eq!(w.market.extensions_bought(&cr), 1);
    let e = held(&w)[0].extensions[0].clone();
    assert_eq!(e.state, ExtensionState::PaymentPending, "{}", e.reason);
    assert!(e.reason.contains("reconciled"), "{}", e.reason);
    assert_eq!(held(&w)[0].extensions.len(), 1);
    // AND its fee stays debited once
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + DAY_FEE));
    // AND the second ask was refused while the first is being bought
    let failed = w.events.published_of("Capacity Extension Failed");
    assert_eq!(failed.len(), 1);
    assert!(
        failed[0].detail["reason"]
            .as_str()
            .unwrap()
            .contains("is still buying"),
        "{}",
        failed[0].detail
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_bought_nothing_gives_the_debit_back_after_the_doubt_window() {
    let w = World::new();
    let (p, cr) = scheduled(&w, policy(72, "2000"), None).await;
    // WHEN the purchase times out without reaching AWS
    w.market
        .fail_next(MarketOp::Extend, errors::outcome_unknown("ec2"));
    p.handle(ask("x1", 24)).await.unwrap();
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + DAY_FEE));
    // THEN its debit holds while the history may still lag
    let called = held(&w)[0].extensions[0].called_at.unwrap();
    while w.clock.get() < called + IN_DOUBT_WINDOW {
        tick_when_due(&w, &p, &format!("t{}", w.clock.get().timestamp())).await;
        if held(&w)[0].extensions[0].state != ExtensionState::Buying {
            break;
        }
        assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + DAY_FEE));
    }
    // AND once the doubt window passed with nothing listed, it goes back
    let e = held(&w)[0].extensions[0].clone();
    assert_eq!(e.state, ExtensionState::Failed, "{}", e.reason);
    assert!(w.clock.get() >= called + IN_DOUBT_WINDOW);
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661));
    assert_eq!(record(&w, "r1").spent, MicroUsd(FEE_1661));
    assert_eq!(w.market.extensions_bought(&cr), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_payment_keeps_the_old_end_and_returns_the_debit() {
    let w = World::new();
    let (p, _) = scheduled(&w, policy(72, "2000"), None).await;
    let end = held(&w)[0].end();
    let windows = record(&w, "r1").windows;
    p.handle(ask("x1", 24)).await.unwrap();
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + DAY_FEE));
    // WHEN AWS fails the payment
    w.market.settle_extensions(ExtensionPayment::Failed);
    tick_when_due(&w, &p, "t1").await;
    // THEN the extension failed, its fee is back, and the window keeps its end and drain
    let r = held(&w)[0].clone();
    assert_eq!(r.extensions[0].state, ExtensionState::Failed);
    assert_eq!(r.end(), end);
    assert_eq!(record(&w, "r1").windows, windows);
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661));
    assert_eq!(record(&w, "r1").spent, MicroUsd(FEE_1661));
    let failed = w.events.published_of("Capacity Extension Failed");
    assert_eq!(failed.len(), 1);
    assert_eq!(
        Usd::parse(failed[0].detail["returned_usd"].as_str().unwrap()),
        Usd::parse("480")
    );
    assert!(
        w.events
            .published_of("Capacity Reservation Extended")
            .is_empty()
    );
}

/// A failed extension does not count against `extend.max_hours` or `max_upfront_usd`
/// (`Extension::counts`; a mutant the simulation left unjudged, tests/mutants/purchase.md):
/// after its payment failed, the team may ask for the same day again, and it is bought.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_failed_payment_the_same_day_may_be_asked_for_again() {
    // GIVEN at most 24 h and $500 of extensions, and a day's extension whose payment failed
    let w = World::new();
    let (p, cr) = scheduled(&w, policy(24, "500"), None).await;
    p.handle(ask("x1", 24)).await.unwrap();
    w.market.settle_extensions(ExtensionPayment::Failed);
    tick_when_due(&w, &p, "t1").await;
    assert_eq!(held(&w)[0].extensions[0].state, ExtensionState::Failed);
    // WHEN the team asks for the day again
    p.handle(ask("x2", 24)).await.unwrap();
    // THEN it is bought: the failed one used none of the policy's hours or dollars
    let r = held(&w)[0].clone();
    assert_eq!(r.extensions.len(), 2, "{}", record(&w, "r1").reason);
    assert_eq!(r.extensions[1].state, ExtensionState::PaymentPending);
    assert_eq!(w.market.extensions_bought(&cr), 2);
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + DAY_FEE));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_past_the_payment_lead_is_refused_and_one_in_time_buys() {
    for in_time in [false, true] {
        let w = World::new();
        let (p, cr) = scheduled(&w, policy(72, "2000"), Some("2000")).await;
        // WHEN an extension takes the spend above the approval threshold
        p.handle(ask("x1", 24)).await.unwrap();
        let e = held(&w)[0].extensions[0].clone();
        assert_eq!(e.state, ExtensionState::AwaitingApproval);
        let asked = w
            .events
            .published_of("Capacity Extension Awaiting Approval");
        assert_eq!(asked.len(), 1);
        let key = asked[0].event_key.clone();
        assert_eq!(Some(key.clone()), e.approval_key);
        assert_eq!(w.market.calls_of(MarketOp::Extend), 0);
        assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661));
        // AND the approval comes before, or after, the payment lead
        if !in_time {
            w.clock.set(e.buy_by + Duration::minutes(1));
        }
        p.handle(decision("Approved", "a1", &key)).await.unwrap();
        let e = held(&w)[0].extensions[0].clone();
        if in_time {
            // THEN in time it is bought as the approver's
            assert_eq!(e.state, ExtensionState::PaymentPending, "{}", e.reason);
            assert_eq!(e.approved_by.as_deref(), Some("lead"));
            assert_eq!(w.market.extensions_bought(&cr), 1);
            assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + DAY_FEE));
        } else {
            // THEN past it the approval is refused and nothing is bought
            let refused = w.events.published_of("Capacity Purchase Approval Refused");
            assert_eq!(refused.len(), 1);
            assert!(
                refused[0].detail["reason"]
                    .as_str()
                    .unwrap()
                    .contains("after the payment lead"),
                "{}",
                refused[0].detail
            );
            assert_eq!(e.state, ExtensionState::Failed);
            assert_eq!(w.market.calls_of(MarketOp::Extend), 0);
            assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unanswered_extension_fails_at_the_payment_lead() {
    let w = World::new();
    let (p, _) = scheduled(&w, policy(72, "2000"), Some("2000")).await;
    p.handle(ask("x1", 24)).await.unwrap();
    let e = held(&w)[0].extensions[0].clone();
    assert_eq!(e.check_at, Some(e.buy_by));
    tick_when_due(&w, &p, "t1").await;
    let e = held(&w)[0].extensions[0].clone();
    assert_eq!(e.state, ExtensionState::Failed);
    assert!(e.reason.contains("no approval arrived"), "{}", e.reason);
    assert_eq!(w.market.calls_of(MarketOp::Extend), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn max_hours_and_max_upfront_stop_extensions() {
    // GIVEN at most 48 hours of extensions
    let w = World::new();
    let (p, cr) = scheduled(&w, policy(48, "5000"), None).await;
    p.handle(ask("x1", 24)).await.unwrap();
    w.market.settle_extensions(ExtensionPayment::Succeeded);
    tick_when_due(&w, &p, "t1").await;
    // WHEN 48 more are asked for
    p.handle(ask("x2", 48)).await.unwrap();
    // THEN they are refused, and nothing more bought
    let failed = w.events.published_of("Capacity Extension Failed");
    assert_eq!(failed.len(), 1);
    let why = failed[0].detail["reason"].as_str().unwrap().to_string();
    assert!(why.contains("over extend.max_hours"), "{why}");
    assert_eq!(w.market.extensions_bought(&cr), 1);
    // AND 24 more still fit
    p.handle(ask("x3", 24)).await.unwrap();
    assert_eq!(w.market.extensions_bought(&cr), 2);

    // GIVEN at most $700 of extensions ($480 a day)
    let w = World::new();
    let (p, cr) = scheduled(&w, policy(240, "700"), None).await;
    p.handle(ask("x1", 24)).await.unwrap();
    w.market.settle_extensions(ExtensionPayment::Succeeded);
    tick_when_due(&w, &p, "t1").await;
    // WHEN another day is asked for
    p.handle(ask("x2", 24)).await.unwrap();
    // THEN it is refused: $480 on top of $480 is over $700
    let failed = w.events.published_of("Capacity Extension Failed");
    assert_eq!(failed.len(), 1);
    let why = failed[0].detail["reason"].as_str().unwrap().to_string();
    assert!(why.contains("over extend.max_upfront_usd"), "{why}");
    assert_eq!(w.market.extensions_bought(&cr), 1);
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + DAY_FEE));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_past_the_payment_lead_or_without_a_policy_is_refused() {
    // GIVEN the drain less than 12 hours away
    let w = World::new();
    let (p, _) = scheduled(&w, policy(72, "2000"), None).await;
    let drain = record(&w, "r1").windows[0].clone();
    let r = held(&w)[0].clone();
    w.clock
        .set(r.end() - Duration::minutes(45) - Duration::hours(11));
    let _ = drain;
    p.handle(ask("x1", 24)).await.unwrap();
    let failed = w.events.published_of("Capacity Extension Failed");
    assert_eq!(failed.len(), 1);
    let why = failed[0].detail["reason"].as_str().unwrap().to_string();
    assert!(why.contains("past the payment lead"), "{why}");
    assert_eq!(w.market.calls_of(MarketOp::ExtensionOffers), 0);
    assert!(record(&w, "r1").reason.contains("past the payment lead"));

    // GIVEN a request without `extend`
    let w = World::new();
    let (p, _) = bought(&w).await;
    p.handle(ask("x1", 24)).await.unwrap();
    let failed = w.events.published_of("Capacity Extension Failed");
    assert_eq!(failed.len(), 1);
    assert!(
        failed[0].detail["reason"]
            .as_str()
            .unwrap()
            .contains("no extend policy")
    );
    assert_eq!(w.market.calls_of(MarketOp::Extend), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_console_extension_during_doubt_is_adopted_one_outside_doubt_is_not() {
    // GIVEN a block extended in the console, outside any doubt
    let w = World::new();
    let (p, cr) = scheduled(&w, policy(72, "2000"), None).await;
    assert!(w.market.extend_by_hand(&cr, 24, w.clock.get()));
    w.clock.set(w.clock.get() + Duration::minutes(10));
    // WHEN the team asks for a day, bought and paid
    p.handle(ask("x1", 24)).await.unwrap();
    w.market.settle_extensions(ExtensionPayment::Succeeded);
    tick_when_due(&w, &p, "t1").await;
    // THEN only its own is recorded and debited
    let r = held(&w)[0].clone();
    assert_eq!(r.extensions.len(), 1);
    assert!(!r.extensions[0].offer.offering_id.starts_with("hand-"));
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + DAY_FEE));

    // GIVEN an extension whose call failed before reaching AWS, in doubt
    let w = World::new();
    let (p, cr) = scheduled(&w, policy(72, "2000"), None).await;
    w.market
        .fail_next(MarketOp::Extend, errors::outcome_unknown("ec2"));
    p.handle(ask("x1", 24)).await.unwrap();
    // WHEN someone extends the block in the console meanwhile, by two days
    w.clock.set(w.clock.get() + Duration::minutes(2));
    assert!(w.market.extend_by_hand(&cr, 48, w.clock.get()));
    tick_when_due(&w, &p, "t1").await;
    // THEN it is taken for ours: adopted, paid, and debited what it cost
    let r = held(&w)[0].clone();
    assert_eq!(r.extensions.len(), 1);
    let e = &r.extensions[0];
    assert!(e.offer.offering_id.starts_with("hand-"), "{e:?}");
    assert_eq!(e.state, ExtensionState::Succeeded, "{}", e.reason);
    assert_eq!(e.offer.hours, 48);
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661 + 2 * DAY_FEE));
    assert_eq!(record(&w, "r1").spent, MicroUsd(FEE_1661 + 2 * DAY_FEE));
    assert_eq!(w.market.extensions_bought(&cr), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_extension_is_leased_while_purchases_are_paused() {
    let w = World::new();
    let (p, _) = scheduled(&w, policy(72, "2000"), None).await;
    w.store
        .put_pause(capacity_pilot::fakes::fixtures::pause())
        .await
        .unwrap()
        .unwrap();
    p.handle(ask("x1", 24)).await.unwrap();
    assert_eq!(w.market.calls_of(MarketOp::Extend), 0);
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661));
    let failed = w.events.published_of("Capacity Extension Failed");
    assert_eq!(failed.len(), 1);
    assert!(
        failed[0].detail["reason"]
            .as_str()
            .unwrap()
            .contains("paused"),
        "{}",
        failed[0].detail
    );
}

/// GIVEN r1's block scheduled with `extend.when: workload-running` (at most 48 h), its window
/// running, and cleanup's Ending notice having asked for a look now; an instance in it running
/// or not.
async fn looked_at(w: &World, running: bool) -> (P, String) {
    let (p, cr) = scheduled(
        w,
        ExtendPolicy {
            when: ExtendWhen::WorkloadRunning,
            ..policy(48, "2000")
        },
        None,
    )
    .await;
    let r = held(w)[0].clone();
    // The window opened an hour ago, and runs.
    w.clock.set(r.start() + Duration::hours(1));
    let mut rec = record(w, "r1");
    rec.status = RequestStatus::Active;
    rec.windows[0].state = WindowState::Running;
    rec.windows[0].next_action_at = Some(r.end() - Duration::minutes(45));
    w.store.insert_record(rec);
    let mut armed = r.clone();
    armed.extension_check_at = Some(w.clock.get());
    rewrite(w, armed).await;
    let mut tags = std::collections::BTreeMap::new();
    tags.insert("capacity-pilot:managed".to_string(), "true".to_string());
    tags.insert("capacity-pilot:request-id".to_string(), "r1".to_string());
    w.workloads
        .add_instance(capacity_pilot::ports::InstanceInfo {
            instance_id: "i-1".into(),
            region: "us-east-1".into(),
            availability_zone: "us-east-1a".into(),
            instance_type: "p5.48xlarge".into(),
            state: if running {
                capacity_pilot::ports::InstanceState::Running
            } else {
                capacity_pilot::ports::InstanceState::Stopped
            },
            health: capacity_pilot::ports::InstanceHealth::Ok,
            reservation_id: Some(cr.clone()),
            launched_at: Some(r.start()),
            tags,
            scheduled: vec![],
        });
    (p, cr)
}

/// Writes `r` as r1's record of it (as cleanup's notice write does).
async fn rewrite(w: &World, r: Reservation) {
    let rec = record(w, "r1");
    let mut t = capacity_pilot::ports::Transition::of(
        &rec,
        rec.status,
        "armed",
        rec.next_action_at,
        w.clock.get(),
        &capacity_pilot::ports::Cause::new(format!("arm-{}", w.clock.get().timestamp())),
    );
    t.reservations = vec![r];
    w.store.transition(t).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_workload_is_extended_by_a_day_and_a_stopped_one_is_not() {
    for running in [true, false] {
        let w = World::new();
        let (p, cr) = looked_at(&w, running).await;
        // WHEN the purchase function looks
        p.handle(tick("t1")).await.unwrap();
        let r = held(&w)[0].clone();
        // THEN the look is made once, and cleared
        assert_eq!(r.extension_check_at, None);
        let reason = record(&w, "r1").reason;
        if running {
            // AND a running workload's block is extended by a day, as the policy's ask
            assert_eq!(w.market.extensions_bought(&cr), 1, "{reason}");
            assert_eq!(r.extensions[0].offer.hours, 24);
            assert_eq!(
                r.extensions[0].asked,
                capacity_pilot::domain::extension::Asked::WorkloadRunning
            );
            let offered = w.events.published_of("Capacity Extension Offered");
            assert_eq!(offered[0].detail["asked_by"], json!("workload-running"));
        } else {
            // AND a stopped one's is not, and the history says why
            assert_eq!(w.market.calls_of(MarketOp::ExtensionOffers), 0);
            assert!(r.extensions.is_empty());
            let history = w
                .store
                .history(&capacity_pilot::fakes::fixtures::request_id("r1"))
                .await
                .unwrap();
            assert!(
                history
                    .iter()
                    .any(|h| h.reason.contains("a stopped workload is not extended")),
                "{history:?}"
            );
        }
        // AND a second tick looks no more
        let calls = w.workloads.calls().len();
        p.handle(tick("t2")).await.unwrap();
        assert_eq!(w.workloads.calls().len(), calls);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_look_past_max_hours_extends_nothing() {
    // GIVEN 48 h extended already
    let w = World::new();
    let (p, cr) = looked_at(&w, true).await;
    p.handle(tick("t1")).await.unwrap();
    w.market.settle_extensions(ExtensionPayment::Succeeded);
    tick_when_due(&w, &p, "t2").await;
    let mut r = held(&w)[0].clone();
    r.extension_check_at = Some(w.clock.get());
    rewrite(&w, r).await;
    p.handle(tick("t3")).await.unwrap();
    w.market.settle_extensions(ExtensionPayment::Succeeded);
    tick_when_due(&w, &p, "t4").await;
    assert_eq!(w.market.extensions_bought(&cr), 2);
    // WHEN another look comes
    let mut r = held(&w)[0].clone();
    r.extension_check_at = Some(w.clock.get());
    rewrite(&w, r).await;
    p.handle(tick("t5")).await.unwrap();
    // THEN nothing more is bought: max_hours is used up
    assert_eq!(w.market.extensions_bought(&cr), 2);
    assert!(record(&w, "r1").reason.contains("max_hours is used up"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_before_the_block_is_paid_or_that_aws_refuses_is_refused_with_its_reason() {
    // GIVEN r1's block bought, its payment still pending
    let w = World::new();
    let mut req = request("r1", "team-a", "5000");
    req.extend = Some(policy(72, "2000"));
    w.with_candidate(req, block("cb-1", "1661.18"));
    let p = w.purchaser(CAPS);
    p.handle(found("r1", "e1")).await.unwrap();
    w.market.offer_extensions(Usd::parse("10").unwrap());
    // WHEN the team asks
    p.handle(ask("x1", 24)).await.unwrap();
    // THEN it is refused, nothing asked of AWS
    let failed = w.events.published_of("Capacity Extension Failed");
    assert_eq!(failed.len(), 1);
    let why = failed[0].detail["reason"].as_str().unwrap().to_string();
    assert!(why.contains("only once it is scheduled or active"), "{why}");
    assert_eq!(w.market.calls_of(MarketOp::ExtensionOffers), 0);

    // GIVEN it paid, and AWS refusing to offer (its own rules)
    let w = World::new();
    let (p, _) = scheduled(&w, policy(72, "2000"), None).await;
    w.market.fail_next(
        MarketOp::ExtensionOffers,
        PortError::Permanent {
            service: "ec2",
            code: "InvalidParameterValue".into(),
            message: "cannot be extended in its current state".into(),
        },
    );
    // WHEN the team asks
    p.handle(ask("x1", 24)).await.unwrap();
    // THEN AWS's reason is the answer, and nothing is debited
    let failed = w.events.published_of("Capacity Extension Failed");
    assert_eq!(failed.len(), 1);
    let why = failed[0].detail["reason"].as_str().unwrap().to_string();
    assert!(
        why.contains("cannot be extended in its current state"),
        "{why}"
    );
    assert_eq!(w.spent("team-a"), MicroUsd(FEE_1661));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_while_a_purchase_is_under_way_is_answered_and_writes_nothing() {
    // GIVEN r1's block scheduled, and the request buying (a replacement, say)
    let w = World::new();
    let (p, _) = scheduled(&w, policy(72, "2000"), None).await;
    let mut rec = record(&w, "r1");
    rec.status = RequestStatus::Purchasing;
    w.store.insert_record(rec.clone());
    // WHEN the team asks
    p.handle(ask("x1", 24)).await.unwrap();
    // THEN it is told to ask again, and nothing is written or asked of AWS
    let failed = w.events.published_of("Capacity Extension Failed");
    assert_eq!(failed.len(), 1);
    let why = failed[0].detail["reason"].as_str().unwrap().to_string();
    assert!(
        why.contains("a purchase of the request is under way"),
        "{why}"
    );
    assert_eq!(record(&w, "r1").version, rec.version);
    assert_eq!(w.market.calls_of(MarketOp::ExtensionOffers), 0);
}

/// Issue 58 (ARCHITECTURE §9.3): a pending extension does not hold the drain; one whose
/// payment clears after the drain began reopens the drained window, which launch-workloads
/// launches into again at once (relaunch 1), and the history says so. A second read of the
/// same end reopens nothing more.
#[tokio::test(flavor = "multi_thread")]
async fn a_payment_that_clears_after_the_drain_reopens_the_window_once() {
    let w = World::new();
    let (p, cr) = looked_at(&w, true).await;
    p.handle(tick("t1")).await.unwrap();
    assert_eq!(w.market.extensions_bought(&cr), 1);
    let r = held(&w)[0].clone();
    let old_end = r.end();
    // GIVEN the payment is still pending when the drain starts: cleanup drains the window
    let drained_at = old_end - Duration::minutes(45);
    w.clock.set(drained_at + Duration::minutes(5));
    let mut rec = record(&w, "r1");
    rec.status = RequestStatus::Draining;
    rec.windows[0].state = WindowState::Draining;
    rec.windows[0].next_action_at = Some(old_end);
    w.store.insert_record(rec);
    // WHEN AWS takes the payment and the extension is read
    assert_eq!(w.market.settle_extensions(ExtensionPayment::Succeeded), 1);
    tick_when_due(&w, &p, "t2").await;
    // THEN the reservation ends a day later, and the window is reopened: launching again,
    // due now, under extension 1's relaunch
    assert_eq!(held(&w)[0].end(), old_end + Duration::hours(24));
    let rec = record(&w, "r1");
    let win = &rec.windows[0];
    assert_eq!(
        (win.state, win.relaunch, win.next_action_at),
        (WindowState::Launching, Some(1), Some(w.clock.get())),
        "{}",
        rec.reason
    );
    assert!(rec.reason.contains("launched again"), "{}", rec.reason);
    // AND a second tick changes nothing
    p.handle(tick("t3")).await.unwrap();
    assert_eq!(record(&w, "r1").windows, rec.windows);
}
