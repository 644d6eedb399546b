use chrono::Duration;

use super::*;
use crate::domain::money::Usd;
use crate::domain::offering::{Product, Segment};
use crate::domain::reservation::ReservationState;
use crate::domain::window::{WindowRecord, WindowState};
use crate::fakes::errors;
use crate::fakes::fixtures::{event, request, request_id, t0, team};
use crate::ports::Lease;
use RequestStatus::*;

const R1: &str = "r-1";

fn id(s: &str) -> RequestId {
    request_id(s)
}

fn month() -> BudgetMonth {
    BudgetMonth::of(t0())
}

fn new_request(rid: &str, max_upfront: &str, cause: &str) -> NewRequest {
    NewRequest {
        request: request(rid, "ml-research", max_upfront),
        source: "com.example.ml-platform".into(),
        cancelled: None,
        reason: "valid".into(),
        next_action_at: Some(t0()),
        at: t0(),
        caused_by: Cause::new(cause),
        outbox: vec![event(
            &format!("{rid}/accepted"),
            "Capacity Request Accepted",
            rid,
        )],
        claims: vec![],
    }
}

fn transition(rid: &str, version: u64, from: RequestStatus, to: RequestStatus) -> Transition {
    Transition {
        request_id: id(rid),
        expected_version: version,
        from,
        to,
        reason: format!("{from} -> {to}"),
        next_action_at: Some(t0() + Duration::minutes(5)),
        at: t0() + Duration::minutes(1),
        caused_by: Cause::new(format!("{rid}/{from}-{to}/{version}")),
        outbox: vec![],
        candidates: None,
        windows: None,
        debit: None,
        hold: false,
        settle: None,
        run: None,
        search: None,
        cancel: None,
        reservations: vec![],
        refund: None,
        resolve_doubt: false,
        unpaused: false,
    }
}

fn debit(micros: i64, team_cap: i64, request_cap: i64) -> Debit {
    Debit {
        team: team("ml-research"),
        month: month(),
        amount: MicroUsd(micros),
        team_cap: MicroUsd(team_cap),
        request_cap: MicroUsd(request_cap),
    }
}

fn lease(token: &str, expires_at: DateTime<Utc>) -> Lease {
    Lease {
        token: token.into(),
        expires_at,
    }
}

fn begin(
    rid: &str,
    version: u64,
    from: RequestStatus,
    token: &str,
    at: DateTime<Utc>,
    debit: Option<Debit>,
) -> BeginPurchase {
    BeginPurchase {
        request_id: id(rid),
        expected_version: version,
        from,
        lease: lease(token, at + Duration::minutes(20)),
        debit,
        doubt: None,
        reason: "buying".into(),
        at,
        caused_by: Cause::new(format!("{rid}/begin/{token}/{version}")),
        outbox: vec![],
    }
}

fn reservation(rid: &str, res_id: &str, fee: &str) -> Reservation {
    Reservation {
        id: res_id.into(),
        product: Product::CapacityBlock,
        region: "us-east-1".into(),
        instance_type: "p5.48xlarge".into(),
        instance_count: 2,
        segments: vec![Segment {
            start: t0() + Duration::days(1),
            end: t0() + Duration::days(2),
            availability_zone: Some("us-east-1a".into()),
        }],
        upfront_fee: Usd::parse(fee).unwrap(),
        state: ReservationState::Scheduled,
        offering_id: Some("cb-1".into()),
        request_tag: Some(rid.into()),
        ultraserver: false,
        bought_at: None,
        debit_month: None,
        debit_team: None,
        payment_check_at: None,
        extensions: Vec::new(),
        extension_check_at: None,
        deployment_tag: None,
    }
}

fn record(rid: &str, token: &str, res: Reservation, to: RequestStatus) -> RecordReservation {
    RecordReservation {
        request_id: id(rid),
        lease_token: token.into(),
        reservation: res,
        to,
        reason: "bought".into(),
        next_action_at: Some(t0() + Duration::days(1)),
        at: t0() + Duration::minutes(30),
        caused_by: Cause::new(format!("{rid}/record/{token}")),
        outbox: vec![event(&format!("{rid}/reserved"), "Capacity Reserved", rid)],
        uncapped: None,
    }
}

fn release(rid: &str, token: &str, to: RequestStatus) -> ReleaseUnbought {
    ReleaseUnbought {
        request_id: id(rid),
        lease_token: token.into(),
        to,
        reason: "reconciled: no reservation tagged with the request exists".into(),
        next_action_at: Some(t0() + Duration::hours(1)),
        at: t0() + Duration::minutes(40),
        caused_by: Cause::new(format!("{rid}/release/{token}")),
        outbox: vec![],
    }
}

/// A store holding `rid` in `OfferingsFound` at version 3.
async fn offerings_found(rid: &str, max_upfront: &str) -> InMemoryStore {
    let store = InMemoryStore::new();
    store
        .create_request(new_request(rid, max_upfront, &format!("{rid}/submitted")))
        .await
        .unwrap();
    for (v, from, to) in [(1, Accepted, Searching), (2, Searching, OfferingsFound)] {
        assert_eq!(
            store
                .transition(transition(rid, v, from, to))
                .await
                .unwrap(),
            WriteOutcome::Applied { version: v + 1 }
        );
    }
    store
}

async fn status_and_version(store: &InMemoryStore, rid: &str) -> (RequestStatus, u64) {
    let r = store.get_request(&id(rid)).await.unwrap().unwrap();
    (r.status, r.version)
}

// ---- create and read ------------------------------------------------------------------

#[tokio::test]
async fn a_new_request_is_recorded_as_accepted_at_version_one_with_its_outbox() {
    // GIVEN an empty store
    let store = InMemoryStore::new();
    // WHEN a request is created
    let outcome = store
        .create_request(new_request(R1, "5000", "ev-1"))
        .await
        .unwrap();
    // THEN it is Accepted at version 1, with nothing spent, and its event is in the outbox
    assert_eq!(outcome, CreateOutcome::Created { version: 1 });
    let r = store.get_request(&id(R1)).await.unwrap().unwrap();
    assert_eq!((r.status, r.version, r.spent), (Accepted, 1, MicroUsd(0)));
    assert_eq!(r.team, team("ml-research"));
    let unsent = store.unsent_outbox(10).await.unwrap();
    assert_eq!(unsent.len(), 1);
    assert_eq!(unsent[0].request_id, R1);
    assert_eq!(store.processed_events(&id(R1)), vec!["ev-1"]);
}

#[tokio::test]
async fn a_second_create_is_already_exists_and_a_replayed_create_is_a_duplicate() {
    let store = InMemoryStore::new();
    store
        .create_request(new_request(R1, "5000", "ev-1"))
        .await
        .unwrap();
    // WHEN the same submission is delivered again
    assert_eq!(
        store
            .create_request(new_request(R1, "5000", "ev-1"))
            .await
            .unwrap(),
        CreateOutcome::DuplicateEvent
    );
    // WHEN another event submits the same request id
    assert_eq!(
        store
            .create_request(new_request(R1, "9999", "ev-2"))
            .await
            .unwrap(),
        CreateOutcome::AlreadyExists
    );
    // THEN the first request stands and no extra outbox item was written
    let r = store.get_request(&id(R1)).await.unwrap().unwrap();
    assert_eq!(r.request.budget.max_upfront, Usd::parse("5000").unwrap());
    assert_eq!(store.outbox().len(), 1);
}

#[tokio::test]
async fn an_unknown_request_reads_as_none() {
    let store = InMemoryStore::new();
    assert_eq!(store.get_request(&id("nope")).await.unwrap(), None);
}

// ---- transitions ----------------------------------------------------------------------

#[tokio::test]
async fn a_transition_with_the_expected_version_and_status_applies_and_bumps_the_version() {
    let store = offerings_found(R1, "5000").await;
    let r = store.get_request(&id(R1)).await.unwrap().unwrap();
    assert_eq!((r.status, r.version), (OfferingsFound, 3));
    assert_eq!(r.reason, "Searching -> OfferingsFound");
    assert_eq!(r.next_action_at, Some(t0() + Duration::minutes(5)));
    assert_eq!(r.updated_at, t0() + Duration::minutes(1));
}

#[tokio::test]
async fn a_transition_with_a_stale_version_conflicts_and_writes_nothing() {
    // GIVEN a request at version 3
    let store = offerings_found(R1, "5000").await;
    let before = store.get_request(&id(R1)).await.unwrap();
    // WHEN a worker that read version 2 tries to move it
    let mut t = transition(R1, 2, OfferingsFound, Searching);
    t.outbox = vec![event("stale", "Capacity Not Found", R1)];
    let outcome = store.transition(t).await.unwrap();
    // THEN it conflicts, and neither the request, the outbox nor the event log changed
    assert_eq!(outcome, WriteOutcome::Conflict);
    assert_eq!(store.get_request(&id(R1)).await.unwrap(), before);
    assert!(
        store
            .outbox()
            .iter()
            .all(|(i, _)| i.event.event_key != "stale")
    );
    assert!(
        !store
            .processed_events(&id(R1))
            .contains(&"r-1/OfferingsFound-Searching/2".to_string())
    );
}

#[tokio::test]
async fn a_transition_from_a_status_the_request_is_not_in_conflicts() {
    let store = offerings_found(R1, "5000").await;
    assert_eq!(
        store
            .transition(transition(R1, 3, Searching, NotFound))
            .await
            .unwrap(),
        WriteOutcome::Conflict
    );
}

#[tokio::test]
async fn a_transition_of_an_unknown_request_conflicts() {
    let store = InMemoryStore::new();
    assert_eq!(
        store
            .transition(transition("ghost", 1, Accepted, Searching))
            .await
            .unwrap(),
        WriteOutcome::Conflict
    );
}

#[tokio::test]
async fn a_transition_the_life_cycle_forbids_is_a_permanent_error() {
    let store = offerings_found(R1, "5000").await;
    let err = store
        .transition(transition(R1, 3, OfferingsFound, Reserved))
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::Permanent { .. }));
    assert_eq!(err.code(), Some("IllegalTransition"));
    assert_eq!(status_and_version(&store, R1).await, (OfferingsFound, 3));
}

#[tokio::test]
async fn a_transition_from_or_to_purchasing_is_refused() {
    let store = offerings_found(R1, "5000").await;
    for (from, to) in [(OfferingsFound, Purchasing), (Purchasing, Searching)] {
        let err = store
            .transition(transition(R1, 3, from, to))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("IllegalTransition"), "{from} -> {to}");
    }
}

#[tokio::test]
async fn a_duplicate_event_is_a_no_op() {
    // GIVEN a transition applied by event E, with an outbox item
    let store = offerings_found(R1, "5000").await;
    let mut t = transition(R1, 3, OfferingsFound, AwaitingApproval);
    t.outbox = vec![event(
        "r-1/awaiting",
        "Capacity Purchase Awaiting Approval",
        R1,
    )];
    assert_eq!(
        store.transition(t.clone()).await.unwrap(),
        WriteOutcome::Applied { version: 4 }
    );
    store.mark_sent(R1, "r-1/awaiting").await.unwrap();
    let before = store.get_request(&id(R1)).await.unwrap();
    // WHEN E is delivered again, even with a version that now matches
    let mut again = t.clone();
    again.expected_version = 4;
    again.from = AwaitingApproval;
    again.to = Searching;
    // THEN nothing is written: not the request, not the outbox item again
    assert_eq!(
        store.transition(again).await.unwrap(),
        WriteOutcome::DuplicateEvent
    );
    assert_eq!(
        store.transition(t).await.unwrap(),
        WriteOutcome::DuplicateEvent
    );
    assert_eq!(store.get_request(&id(R1)).await.unwrap(), before);
    assert!(
        store
            .unsent_outbox(10)
            .await
            .unwrap()
            .iter()
            .all(|i| i.event.event_key != "r-1/awaiting")
    );
}

#[tokio::test]
async fn event_ids_are_recorded_per_request() {
    // GIVEN two requests
    let store = InMemoryStore::new();
    for rid in ["r-1", "r-2"] {
        store
            .create_request(new_request(rid, "5000", &format!("{rid}/submitted")))
            .await
            .unwrap();
    }
    // WHEN one scheduled tick moves both
    for rid in ["r-1", "r-2"] {
        let mut t = transition(rid, 1, Accepted, Searching);
        t.caused_by = Cause::new("tick-0900");
        // THEN each applies once
        assert_eq!(
            store.transition(t).await.unwrap(),
            WriteOutcome::Applied { version: 2 }
        );
    }
}

#[tokio::test]
async fn a_transition_replaces_the_candidates_only_when_given() {
    let store = InMemoryStore::new();
    store
        .create_request(new_request(R1, "5000", "ev-1"))
        .await
        .unwrap();
    store
        .transition(transition(R1, 1, Accepted, Searching))
        .await
        .unwrap();
    let mut t = transition(R1, 2, Searching, NotFound);
    t.candidates = Some(vec![]);
    store.transition(t).await.unwrap();
    assert!(
        store
            .get_request(&id(R1))
            .await
            .unwrap()
            .unwrap()
            .candidates
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_workers_on_one_version_apply_exactly_once() {
    // GIVEN a request at version 3 and sixteen workers that all read it
    let store = offerings_found(R1, "5000").await;
    let mut tasks = Vec::new();
    for w in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = transition(R1, 3, OfferingsFound, AwaitingApproval);
            t.caused_by = Cause::new(format!("worker-{w}"));
            store.transition(t).await.unwrap()
        }));
    }
    // WHEN they all write
    let mut applied = 0;
    for t in tasks {
        match t.await.unwrap() {
            WriteOutcome::Applied { version } => {
                assert_eq!(version, 4);
                applied += 1;
            }
            other => assert_eq!(other, WriteOutcome::Conflict),
        }
    }
    // THEN exactly one wins
    assert_eq!(applied, 1);
}

// ---- the outbox -----------------------------------------------------------------------

#[tokio::test]
async fn outbox_items_are_listed_oldest_first_up_to_the_limit_until_marked_sent() {
    // GIVEN three writes with one event each, at increasing times
    let store = InMemoryStore::new();
    store
        .create_request(new_request(R1, "5000", "ev-1"))
        .await
        .unwrap();
    let mut t = transition(R1, 1, Accepted, Searching);
    t.outbox = vec![event("r-1/searching", "Capacity Request Accepted", R1)];
    store.transition(t).await.unwrap();
    let mut t = transition(R1, 2, Searching, NotFound);
    t.at = t0() + Duration::minutes(2);
    t.outbox = vec![event("r-1/not-found", "Capacity Not Found", R1)];
    store.transition(t).await.unwrap();
    // THEN they come out oldest first, limited
    let keys = |items: Vec<OutboxItem>| -> Vec<String> {
        items.into_iter().map(|i| i.event.event_key).collect()
    };
    assert_eq!(
        keys(store.unsent_outbox(2).await.unwrap()),
        vec!["r-1/accepted", "r-1/searching"]
    );
    // WHEN the first is marked sent (and an unknown one too)
    store.mark_sent(R1, "r-1/accepted").await.unwrap();
    store.mark_sent(R1, "never-written").await.unwrap();
    // THEN it is no longer listed
    assert_eq!(
        keys(store.unsent_outbox(10).await.unwrap()),
        vec!["r-1/searching", "r-1/not-found"]
    );
    assert_eq!(store.outbox().iter().filter(|(_, sent)| *sent).count(), 1);
    assert!(store.unsent_outbox(0).await.unwrap().is_empty());
}

// ---- failure injection ------------------------------------------------------------------

#[tokio::test]
async fn a_failed_write_writes_nothing_and_can_be_retried() {
    let store = offerings_found(R1, "5000").await;
    store.fail_next_writes(2, errors::transient("store"));
    let t = transition(R1, 3, OfferingsFound, AwaitingApproval);
    for _ in 0..2 {
        assert!(
            store
                .transition(t.clone())
                .await
                .unwrap_err()
                .is_retryable()
        );
    }
    assert_eq!(status_and_version(&store, R1).await, (OfferingsFound, 3));
    assert_eq!(
        store.transition(t).await.unwrap(),
        WriteOutcome::Applied { version: 4 }
    );
}

#[tokio::test]
async fn a_crash_after_commit_keeps_the_write_and_the_replay_is_a_duplicate() {
    // GIVEN a store that will fail right after the next commit
    let store = offerings_found(R1, "5000").await;
    store.commit_then_fail_next(StoreOp::Transition, errors::outcome_unknown("store"));
    let mut t = transition(R1, 3, OfferingsFound, AwaitingApproval);
    t.outbox = vec![event(
        "r-1/awaiting",
        "Capacity Purchase Awaiting Approval",
        R1,
    )];
    // WHEN the handler writes and sees an error
    assert!(store.transition(t.clone()).await.is_err());
    // THEN the write happened, with its outbox item
    assert_eq!(status_and_version(&store, R1).await, (AwaitingApproval, 4));
    assert!(
        store
            .unsent_outbox(10)
            .await
            .unwrap()
            .iter()
            .any(|i| i.event.event_key == "r-1/awaiting")
    );
    // AND the redelivered event is a no-op
    assert_eq!(
        store.transition(t).await.unwrap(),
        WriteOutcome::DuplicateEvent
    );
}

#[tokio::test]
async fn failed_reads_return_the_error_and_leave_writes_alone() {
    let store = offerings_found(R1, "5000").await;
    store.fail_next_reads(1, errors::throttled("store"));
    assert!(store.get_request(&id(R1)).await.is_err());
    assert!(store.get_request(&id(R1)).await.unwrap().is_some());
    assert!(store.calls().contains(&StoreOp::GetRequest));
}

// ---- the purchase lease ---------------------------------------------------------------

#[tokio::test]
async fn beginning_a_purchase_takes_the_lease_and_opens_the_debit() {
    // GIVEN a request with offerings
    let store = offerings_found(R1, "5000").await;
    // WHEN a worker begins the purchase with a $1000 debit
    let at = t0() + Duration::minutes(10);
    let outcome = store
        .begin_purchase(begin(
            R1,
            3,
            OfferingsFound,
            "w1",
            at,
            Some(debit(1_000_000_000, 10_000_000_000, 5_000_000_000)),
        ))
        .await
        .unwrap();
    // THEN it holds the lease, the debit is open and counted, and due work points at expiry
    assert_eq!(outcome, BeginPurchaseOutcome::Acquired { version: 4 });
    let r = store.get_request(&id(R1)).await.unwrap().unwrap();
    assert_eq!(r.status, Purchasing);
    assert_eq!(r.lease, Some(lease("w1", at + Duration::minutes(20))));
    assert_eq!(r.open_debit, Some(MicroUsd(1_000_000_000)));
    assert_eq!(r.spent, MicroUsd(1_000_000_000));
    assert_eq!(r.next_action_at, Some(at + Duration::minutes(20)));
    assert_eq!(
        store
            .budget_spent(&team("ml-research"), &month())
            .await
            .unwrap(),
        MicroUsd(1_000_000_000)
    );
}

#[tokio::test]
async fn a_lease_can_be_taken_over_only_after_expiry_and_the_old_holders_write_is_refused() {
    // GIVEN worker w1 holds a lease until at + 20 min
    let store = offerings_found(R1, "5000").await;
    let at = t0() + Duration::minutes(10);
    let expiry = at + Duration::minutes(20);
    store
        .begin_purchase(begin(
            R1,
            3,
            OfferingsFound,
            "w1",
            at,
            Some(debit(1_000_000_000, 10_000_000_000, 5_000_000_000)),
        ))
        .await
        .unwrap();
    // WHEN w2 tries to take over before and at the expiry
    for when in [at + Duration::minutes(5), expiry] {
        let outcome = store
            .begin_purchase(begin(R1, 4, Purchasing, "w2", when, None))
            .await
            .unwrap();
        // THEN the lease is held
        assert_eq!(outcome, BeginPurchaseOutcome::LeaseHeld { until: expiry });
    }
    // WHEN w2 tries just after the expiry
    let outcome = store
        .begin_purchase(begin(
            R1,
            4,
            Purchasing,
            "w2",
            expiry + Duration::seconds(1),
            None,
        ))
        .await
        .unwrap();
    // THEN it takes over, and the first worker's debit stays open (not doubled)
    assert_eq!(outcome, BeginPurchaseOutcome::Acquired { version: 5 });
    let r = store.get_request(&id(R1)).await.unwrap().unwrap();
    assert_eq!(r.lease.unwrap().token, "w2");
    assert_eq!(r.open_debit, Some(MicroUsd(1_000_000_000)));
    assert_eq!(
        store
            .budget_spent(&team("ml-research"), &month())
            .await
            .unwrap(),
        MicroUsd(1_000_000_000)
    );
    // AND the old holder's late writes are refused
    assert_eq!(
        store
            .record_reservation(record(R1, "w1", reservation(R1, "cr-1", "1000"), Reserved))
            .await
            .unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
    assert_eq!(
        store
            .release_unbought(release(R1, "w1", Searching))
            .await
            .unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
    // AND the new holder's write is accepted
    assert_eq!(
        store
            .record_reservation(record(R1, "w2", reservation(R1, "cr-1", "1000"), Reserved))
            .await
            .unwrap(),
        LeaseWriteOutcome::Applied { version: 6 }
    );
}

#[tokio::test]
async fn a_takeover_that_brings_a_new_debit_is_refused() {
    let store = offerings_found(R1, "5000").await;
    let err = store
        .begin_purchase(begin(R1, 3, Purchasing, "w2", t0(), Some(debit(1, 10, 10))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("IllegalTransition"));
}

#[tokio::test]
async fn a_purchase_cannot_begin_from_a_status_that_may_not_buy() {
    let store = InMemoryStore::new();
    store
        .create_request(new_request(R1, "5000", "ev-1"))
        .await
        .unwrap();
    let err = store
        .begin_purchase(begin(R1, 1, Accepted, "w1", t0(), Some(debit(1, 10, 10))))
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::Permanent { .. }));
}

#[tokio::test]
async fn a_purchase_begun_on_a_stale_version_conflicts_and_debits_nothing() {
    let store = offerings_found(R1, "5000").await;
    assert_eq!(
        store
            .begin_purchase(begin(
                R1,
                2,
                OfferingsFound,
                "w1",
                t0(),
                Some(debit(5, 10, 10))
            ))
            .await
            .unwrap(),
        BeginPurchaseOutcome::Conflict
    );
    assert!(store.ledger().is_empty());
}

#[tokio::test]
async fn a_replayed_begin_purchase_is_a_duplicate_and_debits_once() {
    let store = offerings_found(R1, "5000").await;
    let b = begin(R1, 3, OfferingsFound, "w1", t0(), Some(debit(5, 10, 10)));
    store.begin_purchase(b.clone()).await.unwrap();
    assert_eq!(
        store.begin_purchase(b).await.unwrap(),
        BeginPurchaseOutcome::DuplicateEvent
    );
    assert_eq!(
        store
            .budget_spent(&team("ml-research"), &month())
            .await
            .unwrap(),
        MicroUsd(5)
    );
}

// ---- the budget -----------------------------------------------------------------------

#[tokio::test]
async fn the_team_cap_is_enforced_to_the_micro_dollar() {
    // GIVEN a team that has spent $9000 of a $10000 cap this month
    let cap = 10_000_000_000;
    let store = offerings_found(R1, "100000").await;
    store.set_spent(&team("ml-research"), &month(), MicroUsd(9_000_000_000));
    // WHEN a purchase needs one micro-dollar more than is left
    let outcome = store
        .begin_purchase(begin(
            R1,
            3,
            OfferingsFound,
            "w1",
            t0(),
            Some(debit(1_000_000_001, cap, 100_000_000_000)),
        ))
        .await
        .unwrap();
    // THEN it is refused, saying what is spent and the cap, and nothing is written
    assert_eq!(
        outcome,
        BeginPurchaseOutcome::OverTeamBudget {
            spent: MicroUsd(9_000_000_000),
            cap: MicroUsd(cap)
        }
    );
    assert_eq!(status_and_version(&store, R1).await, (OfferingsFound, 3));
    // WHEN it needs exactly what is left
    let mut b = begin(
        R1,
        3,
        OfferingsFound,
        "w1",
        t0(),
        Some(debit(1_000_000_000, cap, 100_000_000_000)),
    );
    b.caused_by = Cause::new("second-try");
    // THEN it fits, and the team is at its cap
    assert_eq!(
        store.begin_purchase(b).await.unwrap(),
        BeginPurchaseOutcome::Acquired { version: 4 }
    );
    assert_eq!(
        store
            .budget_spent(&team("ml-research"), &month())
            .await
            .unwrap(),
        MicroUsd(cap)
    );
}

#[tokio::test]
async fn the_team_cap_is_per_team_and_month() {
    let store = offerings_found(R1, "100000").await;
    let next_month = BudgetMonth::of(t0() + Duration::days(31));
    store.set_spent(&team("ml-research"), &next_month, MicroUsd(10));
    store.set_spent(&team("other-team"), &month(), MicroUsd(10));
    assert!(matches!(
        store
            .begin_purchase(begin(
                R1,
                3,
                OfferingsFound,
                "w1",
                t0(),
                Some(debit(10, 10, 10))
            ))
            .await
            .unwrap(),
        BeginPurchaseOutcome::Acquired { .. }
    ));
}

#[tokio::test]
async fn the_request_cap_is_enforced_on_spent_plus_the_debit() {
    // GIVEN a request whose cap is $5000 and that has spent $3000 on demand
    let store = InMemoryStore::new();
    store
        .create_request(new_request(R1, "5000", "ev-1"))
        .await
        .unwrap();
    let request_cap = 5_000_000_000;
    let team_cap = 100_000_000_000;
    let mut t = transition(R1, 1, Accepted, TryingOnDemand);
    t.debit = Some(debit(3_000_000_000, team_cap, request_cap));
    assert_eq!(
        store.transition(t).await.unwrap(),
        WriteOutcome::Applied { version: 2 }
    );
    // WHEN more on-demand spend would pass the cap by one micro-dollar
    let mut t = transition(R1, 2, TryingOnDemand, RunningOnDemand);
    t.debit = Some(debit(2_000_000_001, team_cap, request_cap));
    // THEN it is refused and nothing is written
    assert_eq!(
        store.transition(t.clone()).await.unwrap(),
        WriteOutcome::OverRequestBudget {
            spent: MicroUsd(3_000_000_000),
            cap: MicroUsd(request_cap)
        }
    );
    assert_eq!(status_and_version(&store, R1).await, (TryingOnDemand, 2));
    // WHEN it reaches the cap exactly
    t.debit = Some(debit(2_000_000_000, team_cap, request_cap));
    // THEN it is kept in both the request and the ledger, with no open debit
    assert_eq!(
        store.transition(t).await.unwrap(),
        WriteOutcome::Applied { version: 3 }
    );
    let r = store.get_request(&id(R1)).await.unwrap().unwrap();
    assert_eq!((r.spent, r.open_debit), (MicroUsd(request_cap), None));
    assert_eq!(
        store
            .budget_spent(&team("ml-research"), &month())
            .await
            .unwrap(),
        MicroUsd(request_cap)
    );
}

#[tokio::test]
async fn a_transition_debit_over_the_team_cap_is_refused() {
    let store = InMemoryStore::new();
    store
        .create_request(new_request(R1, "5000", "ev-1"))
        .await
        .unwrap();
    store.set_spent(&team("ml-research"), &month(), MicroUsd(7));
    let mut t = transition(R1, 1, Accepted, TryingOnDemand);
    t.debit = Some(debit(4, 10, 1_000));
    assert_eq!(
        store.transition(t).await.unwrap(),
        WriteOutcome::OverTeamBudget {
            spent: MicroUsd(7),
            cap: MicroUsd(10)
        }
    );
    assert_eq!(status_and_version(&store, R1).await, (Accepted, 1));
}

#[tokio::test]
async fn a_zero_or_negative_debit_is_a_permanent_error() {
    let store = offerings_found(R1, "5000").await;
    let err = store
        .begin_purchase(begin(
            R1,
            3,
            OfferingsFound,
            "w1",
            t0(),
            Some(debit(0, 10, 10)),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidDebit"));
}

// ---- recording and releasing ------------------------------------------------------------

/// A store where worker `w1` holds the lease on R1 with an open debit of `micros`.
async fn purchasing(micros: i64) -> InMemoryStore {
    let store = offerings_found(R1, "100000").await;
    store
        .begin_purchase(begin(
            R1,
            3,
            OfferingsFound,
            "w1",
            t0() + Duration::minutes(10),
            Some(debit(micros, 1_000_000_000_000, 100_000_000_000)),
        ))
        .await
        .unwrap();
    store
}

#[tokio::test]
async fn release_unbought_restores_the_ledger_and_the_request() {
    // GIVEN a team that had spent $500 before a $1000 debit was opened
    let store = offerings_found(R1, "100000").await;
    store.set_spent(&team("ml-research"), &month(), MicroUsd(500_000_000));
    store
        .begin_purchase(begin(
            R1,
            3,
            OfferingsFound,
            "w1",
            t0(),
            Some(debit(1_000_000_000, 1_000_000_000_000, 100_000_000_000)),
        ))
        .await
        .unwrap();
    assert_eq!(
        store
            .budget_spent(&team("ml-research"), &month())
            .await
            .unwrap(),
        MicroUsd(1_500_000_000)
    );
    // WHEN reconciliation shows nothing was bought
    let outcome = store
        .release_unbought(release(R1, "w1", Searching))
        .await
        .unwrap();
    // THEN the ledger and the request are as before the debit, and the lease is gone
    assert_eq!(outcome, LeaseWriteOutcome::Applied { version: 5 });
    assert_eq!(
        store
            .budget_spent(&team("ml-research"), &month())
            .await
            .unwrap(),
        MicroUsd(500_000_000)
    );
    let r = store.get_request(&id(R1)).await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.spent, r.open_debit),
        (Searching, MicroUsd(0), None)
    );
    assert_eq!(r.lease, None);
    // AND a second release has no lease to act under
    let mut again = release(R1, "w1", Searching);
    again.caused_by = Cause::new("again");
    assert_eq!(
        store.release_unbought(again).await.unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
}

#[tokio::test]
async fn a_release_credits_the_month_the_debit_was_charged_to() {
    // GIVEN a debit opened in one month
    let store = purchasing(1_000).await;
    // WHEN it is released in the next
    let mut r = release(R1, "w1", Failed);
    r.at = t0() + Duration::days(31);
    store.release_unbought(r).await.unwrap();
    // THEN the original month is credited
    assert_eq!(
        store
            .budget_spent(&team("ml-research"), &month())
            .await
            .unwrap(),
        MicroUsd(0)
    );
    assert_eq!(
        store.ledger().get(&(
            team("ml-research"),
            BudgetMonth::of(t0() + Duration::days(31))
        )),
        None
    );
}

#[tokio::test]
async fn a_release_must_say_what_reconciliation_found_and_lead_where_a_release_may() {
    // (Searching, Failed, Cancelled, or Reserved by what the request already keeps.)
    let store = purchasing(1_000).await;
    let mut blank = release(R1, "w1", Searching);
    blank.reason = "  ".into();
    assert!(store.release_unbought(blank).await.is_err());
    assert!(
        store
            .release_unbought(release(R1, "w1", Active))
            .await
            .is_err()
    );
    assert_eq!(status_and_version(&store, R1).await, (Purchasing, 4));
}

#[tokio::test]
async fn recording_the_reservation_keeps_the_debit_and_ends_the_lease() {
    // GIVEN a $1000 open debit
    let store = purchasing(1_000_000_000).await;
    // WHEN the reservation is recorded
    let outcome = store
        .record_reservation(record(R1, "w1", reservation(R1, "cr-1", "1000"), Reserved))
        .await
        .unwrap();
    // THEN the request is Reserved, the money is spent (not open), and the reservation listed
    assert_eq!(outcome, LeaseWriteOutcome::Applied { version: 5 });
    let r = store.get_request(&id(R1)).await.unwrap().unwrap();
    assert_eq!((r.status, r.open_debit, r.lease), (Reserved, None, None));
    assert_eq!(r.spent, MicroUsd(1_000_000_000));
    // AND the reservation carries the ledger its debit was charged to: the team's, its month
    let mut recorded = reservation(R1, "cr-1", "1000");
    recorded.debit_month = Some(month().0);
    recorded.debit_team = Some("ml-research".into());
    assert_eq!(store.reservations(&id(R1)).await.unwrap(), vec![recorded]);
    assert!(
        store
            .unsent_outbox(10)
            .await
            .unwrap()
            .iter()
            .any(|i| i.event.detail_type == "Capacity Reserved")
    );
    // AND the debit can no longer be released
    assert_eq!(
        store
            .release_unbought(release(R1, "w1", Searching))
            .await
            .unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
    assert_eq!(
        store
            .budget_spent(&team("ml-research"), &month())
            .await
            .unwrap(),
        MicroUsd(1_000_000_000)
    );
}

#[tokio::test]
async fn a_split_plans_first_segment_shrinks_the_open_debit_and_a_release_frees_only_the_rest() {
    // GIVEN a $1500 debit for a two-segment plan
    let store = purchasing(1_500_000_000).await;
    // WHEN the first segment ($1000) is recorded and the lease kept
    assert_eq!(
        store
            .record_reservation(record(
                R1,
                "w1",
                reservation(R1, "cr-1", "1000"),
                Purchasing
            ))
            .await
            .unwrap(),
        LeaseWriteOutcome::Applied { version: 5 }
    );
    let r = store.get_request(&id(R1)).await.unwrap().unwrap();
    assert_eq!(r.open_debit, Some(MicroUsd(500_000_000)));
    assert_eq!(r.lease.as_ref().unwrap().token, "w1");
    // AND the second segment's offering has gone, so the rest is released
    store
        .release_unbought(release(R1, "w1", Failed))
        .await
        .unwrap();
    // THEN only the first segment's fee stays spent
    let r = store.get_request(&id(R1)).await.unwrap().unwrap();
    assert_eq!((r.spent, r.open_debit), (MicroUsd(1_000_000_000), None));
    assert_eq!(
        store
            .budget_spent(&team("ml-research"), &month())
            .await
            .unwrap(),
        MicroUsd(1_000_000_000)
    );
    assert_eq!(store.reservations(&id(R1)).await.unwrap().len(), 1);
}

#[tokio::test]
async fn recording_needs_the_lease_and_a_status_after_purchasing() {
    let store = purchasing(1_000).await;
    assert_eq!(
        store
            .record_reservation(record(
                R1,
                "stranger",
                reservation(R1, "cr-1", "1"),
                Reserved
            ))
            .await
            .unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
    assert!(
        store
            .record_reservation(record(R1, "w1", reservation(R1, "cr-1", "1"), Active))
            .await
            .is_err()
    );
    let never = InMemoryStore::new();
    assert_eq!(
        never
            .record_reservation(record(R1, "w1", reservation(R1, "cr-1", "1"), Reserved))
            .await
            .unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
}

#[tokio::test]
async fn a_replayed_record_is_a_duplicate_even_after_the_lease_is_gone() {
    let store = purchasing(1_000).await;
    let r = record(R1, "w1", reservation(R1, "cr-1", "0.001"), Reserved);
    store.record_reservation(r.clone()).await.unwrap();
    assert_eq!(
        store.record_reservation(r).await.unwrap(),
        LeaseWriteOutcome::DuplicateEvent
    );
}

// ---- due work -------------------------------------------------------------------------

#[tokio::test]
async fn due_returns_exactly_the_requests_in_the_statuses_whose_time_has_come() {
    // GIVEN requests in several statuses and times
    let store = InMemoryStore::new();
    let now = t0() + Duration::hours(1);
    let cases = [
        ("due-early", NotFound, Some(now - Duration::minutes(30))),
        ("due-now", NotFound, Some(now)),
        ("later", NotFound, Some(now + Duration::seconds(1))),
        ("no-time", NotFound, None),
        ("other-status", Reserved, Some(now - Duration::minutes(5))),
        ("searching", Searching, Some(now - Duration::minutes(40))),
    ];
    for (rid, status, next) in cases {
        store
            .create_request(new_request(rid, "5000", &format!("{rid}/new")))
            .await
            .unwrap();
        let mut t = transition(rid, 1, Accepted, Searching);
        t.next_action_at = next;
        store.transition(t).await.unwrap();
        if status != Searching {
            let mut t = transition(rid, 2, Searching, NotFound);
            t.next_action_at = next;
            store.transition(t).await.unwrap();
        }
        if status == Reserved {
            let mut r = store.get_request(&id(rid)).await.unwrap().unwrap();
            r.status = Reserved;
            store.insert_record(r);
        }
    }
    // WHEN asking for NotFound and Searching work at `now`
    let due = store.due(&[NotFound, Searching], now).await.unwrap();
    // THEN exactly the due ones come back, earliest first
    let ids: Vec<_> = due.iter().map(|d| d.request_id.as_str()).collect();
    assert_eq!(ids, vec!["searching", "due-early", "due-now"]);
    assert_eq!(due[2].next_action_at, now);
    assert_eq!(due[0].status, Searching);
}

#[tokio::test]
async fn an_abandoned_purchase_becomes_due_when_its_lease_expires() {
    let store = purchasing(1_000).await;
    let expiry = t0() + Duration::minutes(30);
    assert!(
        store
            .due(&[Purchasing], expiry - Duration::seconds(1))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.due(&[Purchasing], expiry).await.unwrap().len(), 1);
}

// ---- archival -------------------------------------------------------------------------

#[tokio::test]
async fn an_ended_request_is_archived_after_the_retention_and_its_id_is_free_again() {
    // GIVEN a request that failed at `end`, with a reservation and a workload
    let store = purchasing(1_000).await.with_retention(Duration::days(30));
    store
        .record_reservation(record(R1, "w1", reservation(R1, "cr-1", "0.001"), Reserved))
        .await
        .unwrap();
    store
        .put_workload(WorkloadRecord {
            request_id: id(R1),
            reservation_id: "cr-1".into(),
            slot: 0,
            generation: 0,
            resource_id: "i-1".into(),
            state: "running".into(),
            updated_at: t0(),

            started_at: None,
            ended_at: None,
            ran: Vec::new(),
            relaunch: 0,
        })
        .await
        .unwrap();
    let mut t = transition(R1, 5, Reserved, Failed);
    let end = t0() + Duration::days(2);
    t.at = end;
    t.next_action_at = Some(end);
    // (its window over: one still to serve keeps the request, below)
    t.windows = Some(windows_in(&store, WindowState::Ended).await);
    store.transition(t).await.unwrap();
    assert_eq!(store.expires_at(&id(R1)), Some(end + Duration::days(30)));
    // THEN it is still readable just before the retention ends
    store.advance_to(end + Duration::days(30) - Duration::seconds(1));
    assert!(store.get_request(&id(R1)).await.unwrap().is_some());
    assert_eq!(store.due(&[Failed], end).await.unwrap().len(), 1);
    // WHEN the retention has passed
    store.advance_to(end + Duration::days(30));
    // THEN reads ignore it and its items
    assert_eq!(store.get_request(&id(R1)).await.unwrap(), None);
    assert!(store.reservations(&id(R1)).await.unwrap().is_empty());
    assert!(store.workloads(&id(R1)).await.unwrap().is_empty());
    assert!(store.due(&[Failed], end).await.unwrap().is_empty());
    // AND a new request may use the id
    let mut again = new_request(R1, "5000", "resubmitted");
    again.at = end + Duration::days(31);
    assert_eq!(
        store.create_request(again).await.unwrap(),
        CreateOutcome::Created { version: 1 }
    );
    assert!(store.reservations(&id(R1)).await.unwrap().is_empty());
}

#[tokio::test]
async fn an_attached_clock_drives_archival() {
    let clock = ManualClock::new(t0());
    let store = InMemoryStore::new().with_clock(clock.clone());
    store
        .create_request(new_request(R1, "5000", "ev-1"))
        .await
        .unwrap();
    store
        .transition(transition(R1, 1, Accepted, Cancelled))
        .await
        .unwrap();
    clock.advance(DEFAULT_RETENTION + Duration::days(1));
    assert_eq!(store.get_request(&id(R1)).await.unwrap(), None);
}

#[tokio::test]
async fn a_non_terminal_request_never_expires() {
    let store = offerings_found(R1, "5000").await;
    store.advance_to(t0() + Duration::days(3650));
    assert!(store.get_request(&id(R1)).await.unwrap().is_some());
}

// ---- workloads ------------------------------------------------------------------------

#[tokio::test]
async fn a_workload_record_is_kept_per_reservation_and_slot_and_replaced_by_the_next_generation() {
    let store = offerings_found(R1, "5000").await;
    let w = |slot: u32, generation: u32, resource: &str| WorkloadRecord {
        request_id: id(R1),
        reservation_id: "cr-1".into(),
        slot,
        generation,
        resource_id: resource.into(),
        state: "running".into(),
        updated_at: t0(),

        started_at: None,
        ended_at: None,
        ran: Vec::new(),
        relaunch: 0,
    };
    store.put_workload(w(0, 0, "i-a")).await.unwrap();
    store.put_workload(w(1, 0, "i-b")).await.unwrap();
    store.put_workload(w(0, 1, "i-c")).await.unwrap();
    let all = store.workloads(&id(R1)).await.unwrap();
    assert_eq!(all, vec![w(0, 1, "i-c"), w(1, 0, "i-b")]);
    assert!(store.workloads(&id("r-2")).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_run_publishes_what_it_wrote_or_its_agenda_showed_and_reads_the_outbox_only_after_writing()
 {
    use crate::fakes::RecordingEvents;
    use crate::outbox::{Run, flush};
    // GIVEN an unsent acceptance left by an earlier run
    let store = InMemoryStore::new();
    let events = RecordingEvents::new();
    store
        .create_request(new_request(R1, "5000", "ev-1"))
        .await
        .unwrap();

    // WHEN a run that neither wrote nor read an agenda flushes
    let before = store.calls().len();
    let sent = flush(&store, &events, Run::start(&store, t0()))
        .await
        .unwrap();
    // THEN it reads nothing and leaves the item to a scheduled run
    assert_eq!((sent, store.calls().len()), (0, before));

    // WHEN a scheduled run read its agenda and wrote nothing
    let run = Run::start(&store, t0());
    let agenda = store.agenda(t0()).await.unwrap();
    let before = store.calls().len();
    let sent = flush(&store, &events, run.with_agenda(Some(&agenda)))
        .await
        .unwrap();
    // THEN it publishes the agenda's item without reading the outbox again
    assert_eq!(sent, 1);
    assert!(
        !store.calls()[before..].contains(&StoreOp::UnsentOutbox),
        "{:?}",
        store.calls()
    );

    // WHEN a run writes (a second request) after reading an agenda that held nothing unsent
    let run = Run::start(&store, t0());
    let agenda = store.agenda(t0()).await.unwrap();
    assert!(agenda.outbox.is_empty());
    store
        .create_request(new_request("r-2", "5000", "ev-2"))
        .await
        .unwrap();
    let sent = flush(&store, &events, run.with_agenda(Some(&agenda)))
        .await
        .unwrap();
    // THEN it reads the outbox again and publishes what it wrote
    assert_eq!(sent, 1);
    assert_eq!(
        events.published().last().map(|e| e.event_key.clone()),
        Some("r-2/accepted".to_string())
    );
}

/// ARCHITECTURE §9.2: an outbox item with a notice is sent only when both the bus and the
/// topic took it; one written before notices existed goes to the bus only.
#[tokio::test]
async fn an_item_with_a_notice_is_sent_only_once_the_bus_and_the_topic_both_took_it() {
    use crate::domain::notices::Notice;
    use crate::fakes::{RecordingEvents, RecordingNotices};
    use crate::outbox::{Announcing, Run, flush};
    let store = InMemoryStore::new();
    let sink = Announcing {
        bus: RecordingEvents::new(),
        topic: RecordingNotices::new(),
    };
    let notice = Notice {
        subject: "r-1 reserved".into(),
        body: "Request r-1 is reserved.".into(),
        team: Some("ml-research".into()),
        detail_type: "Capacity Request Accepted".into(),
        request_id: Some(R1.into()),
    };
    // GIVEN two requests: r-1's event carries a notice, r-2's (written before notices
    // existed) none
    let mut told = new_request(R1, "5000", "ev-1");
    told.outbox[0].notice = Some(notice.clone());
    store.create_request(told).await.unwrap();
    store
        .create_request(new_request("r-2", "5000", "ev-2"))
        .await
        .unwrap();
    // WHEN the topic refuses the notice
    sink.topic.refuse_next(1, "Throttled", "Rate exceeded");
    let run = Run::start(&store, t0());
    let agenda = store.agenda(t0()).await.unwrap();
    let sent = flush(&store, &sink, run.with_agenda(Some(&agenda)))
        .await
        .unwrap();
    // THEN both events reached the bus, but only r-2's is sent: r-1's stays in the outbox
    assert_eq!(sink.bus.published().len(), 2);
    assert_eq!(sent, 1);
    let unsent = store.unsent_outbox(10).await.unwrap();
    assert_eq!(
        unsent
            .iter()
            .map(|i| i.event.event_key.as_str())
            .collect::<Vec<_>>(),
        vec!["r-1/accepted"]
    );
    assert!(sink.topic.told().is_empty());
    // WHEN the next run (its claim expired) flushes again
    let later = t0() + crate::outbox::CLAIM_FOR + Duration::seconds(1);
    let run = Run::start(&store, later);
    let agenda = store.agenda(later).await.unwrap();
    let sent = flush(&store, &sink, run.with_agenda(Some(&agenda)))
        .await
        .unwrap();
    // THEN the bus gets r-1's event again under its key, the topic takes the notice, and the
    // item is sent
    assert_eq!(sent, 1);
    assert_eq!(sink.bus.published_of("Capacity Request Accepted").len(), 3);
    assert_eq!(
        sink.topic.told(),
        vec![("r-1/accepted".to_string(), notice)]
    );
    assert!(store.unsent_outbox(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn every_state_change_is_kept_in_the_requests_history() {
    let store = InMemoryStore::new();
    store
        .create_request(new_request(R1, "5000", "ev-1"))
        .await
        .unwrap();
    let mut t = transition(R1, 1, Accepted, Searching);
    t.reason = "searching".into();
    store.transition(t).await.unwrap();
    let h = store.history(&id(R1)).await.unwrap();
    let steps: Vec<_> = h.iter().map(|e| (e.version, e.from, e.to)).collect();
    assert_eq!(
        steps,
        vec![(1, None, Accepted), (2, Some(Accepted), Searching)]
    );
    assert_eq!(h[1].reason, "searching");
}

/// R1's window records, each moved to `state`.
async fn windows_in(store: &InMemoryStore, state: WindowState) -> Vec<WindowRecord> {
    let rec = store.get_request(&id(R1)).await.unwrap().unwrap();
    rec.windows
        .into_iter()
        .map(|mut w| {
            w.state = state;
            w.next_action_at = (state != WindowState::Ended).then_some(t0());
            w
        })
        .collect()
}

#[tokio::test]
async fn a_failed_request_holding_a_window_is_archived_only_when_its_last_window_ends() {
    // GIVEN a request that failed while its paid window runs (ARCHITECTURE §9.1)
    let store = purchasing(1_000).await.with_retention(Duration::days(30));
    store
        .record_reservation(record(R1, "w1", reservation(R1, "cr-1", "0.001"), Reserved))
        .await
        .unwrap();
    let mut t = transition(R1, 5, Reserved, Failed);
    t.windows = Some(windows_in(&store, WindowState::Running).await);
    store.transition(t).await.unwrap();
    // THEN it has no TTL, and is read long after the retention
    assert_eq!(store.expires_at(&id(R1)), None);
    store.advance_to(t0() + Duration::days(100));
    let rec = store.get_request(&id(R1)).await.unwrap().unwrap();
    // WHEN its window ends
    let ended = windows_in(&store, WindowState::Ended).await;
    let at = t0() + Duration::days(100);
    let u = WindowUpdate::of(&rec, ended, "ended", at, &Cause::new("end"), vec![]);
    store.update_windows(u).await.unwrap();
    // THEN it is archived from then
    assert_eq!(store.expires_at(&id(R1)), Some(at + Duration::days(30)));
    store.advance_to(at + Duration::days(30));
    assert_eq!(store.get_request(&id(R1)).await.unwrap(), None);
}
