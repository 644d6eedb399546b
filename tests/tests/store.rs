//! The DynamoDB `Store` against a real server (moto), one fresh table per test.

use std::collections::HashSet;

use aws_sdk_dynamodb::types::AttributeValue;
use capacity_pilot::aws::dynamodb::DynamoStore;
use capacity_pilot::domain::money::MicroUsd;
use capacity_pilot::domain::request::FieldError;
use capacity_pilot::domain::reservation::Reservation;
use capacity_pilot::domain::status::RequestStatus::{
    self, Accepted, Cancelled, Draining, Ended, Failed, OfferingsFound, Planned, Purchasing,
    Reserved, RunningOnDemand, Searching, TryingOnDemand,
};
use capacity_pilot::domain::window::{self, DrainLead, WindowRecord, WindowState};
use capacity_pilot::ports::{
    BeginPurchaseOutcome, BudgetMonth, CancelNote, Cause, CreateOutcome, DueItem, KeepCancellation,
    LeaseWriteOutcome, OnDemandRun, PortError, RejectedSubmission, RequestRecord, Settle, Store,
    Tombstone, TombstoneOutcome, Transition, WindowUpdate, WriteOutcome, outbox_seq,
};
use chrono::Duration;
use integration_tests::TestTable;
use integration_tests::fixtures::*;

/// A requester's cancellation kept on `id`'s purchase under way at `version`, by `event`.
fn cancellation_kept(id: &str, version: u64, event: &str) -> KeepCancellation {
    KeepCancellation {
        request_id: request_id(id),
        expected_version: version,
        status: Purchasing,
        note: Some(CancelNote {
            reason: "cancelled by the requester".into(),
            at: t0(),
            event_id: event.into(),
            found: None,
            stop_running: false,
            stopped: vec![],
        }),
        reason: "buying; cancellation kept".into(),
        next_action_at: Some(t0() + Duration::minutes(15)),
        at: t0(),
        caused_by: Cause::new(event),
        outbox: vec![],
    }
}

/// GIVEN a recorded request, moved to `OfferingsFound` with two candidate plans.
/// Returns its version.
async fn request_with_offerings(store: &DynamoStore, id: &str, team_name: &str) -> u64 {
    let created = store
        .create_request(new_request(id, team_name, None))
        .await
        .unwrap();
    assert_eq!(created, CreateOutcome::Created { version: 1 });
    let searching = transition(id, 1, Accepted, Searching, &format!("search-{id}"));
    assert_eq!(
        store.transition(searching).await.unwrap(),
        WriteOutcome::Applied { version: 2 }
    );
    let mut found = transition(id, 2, Searching, OfferingsFound, &format!("found-{id}"));
    found.candidates = Some(vec![plan("7974.40"), plan("8100.00")]);
    assert_eq!(
        store.transition(found).await.unwrap(),
        WriteOutcome::Applied { version: 3 }
    );
    3
}

/// GIVEN `id` with offerings, one 4000 USD block `res` bought (day 3, two days) and its
/// window running from its start. Returns the block.
async fn running_block(store: &DynamoStore, id: &str, res: &str) -> Reservation {
    let a = block(res, "4000.00", 3, 2);
    request_with_offerings(store, id, "ml").await;
    store
        .begin_purchase(begin_purchase(id, 3, OfferingsFound, "w", t0(), None))
        .await
        .unwrap();
    store
        .record_reservation(record_reservation(id, "w", a.clone(), t0()))
        .await
        .unwrap();
    let key = format!("{res}#0");
    let run = window_update(store, id, &key, WindowState::Running, a.start(), "run").await;
    store.update_windows(run).await.unwrap();
    a
}

/// The due items as (request, status, due time).
/// [`due_keys`] by when a function next acts (its own action or a window's), the windows'
/// lead-time notices aside: a window never looked at for its notices is due at once for them,
/// to cleanup-expired only.
fn acting_keys(
    due: Vec<DueItem>,
) -> Vec<(
    capacity_pilot::domain::request::RequestId,
    RequestStatus,
    Option<chrono::DateTime<chrono::Utc>>,
)> {
    due.into_iter()
        .map(|d| {
            let acts = d.own_action_at.into_iter().chain(d.window_action_at).min();
            (d.request_id, d.status, acts)
        })
        .collect()
}

fn due_keys(
    due: Vec<DueItem>,
) -> Vec<(
    capacity_pilot::domain::request::RequestId,
    RequestStatus,
    chrono::DateTime<chrono::Utc>,
)> {
    due.into_iter()
        .map(|d| (d.request_id, d.status, d.next_action_at))
        .collect()
}

/// What team `team_name` has spent in t0's month, as its ledger holds it.
async fn ledger_at_t0(store: &DynamoStore, team_name: &str) -> MicroUsd {
    store
        .budget_spent(&team(team_name), &BudgetMonth::of(t0()))
        .await
        .unwrap()
}

async fn status_of(store: &DynamoStore, id: &str) -> RequestStatus {
    store
        .get_request(&request_id(id))
        .await
        .unwrap()
        .unwrap()
        .status
}

#[tokio::test]
async fn thirty_two_workers_racing_to_purchase_one_request_leave_exactly_one_holding_the_lease() {
    // GIVEN a request with offerings, and a team budget that fits any one purchase
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let version = request_with_offerings(&store, "race-1", "ml-research").await;
    let amount = usd("7974.40").to_micros_ceil();

    // WHEN 32 workers try to take the purchase lease at once, each with its own debit
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..32 {
        let store = store.clone();
        tasks.spawn(async move {
            let token = format!("worker-{w}");
            let debit = debit("ml-research", amount, MicroUsd(amount.0 * 100));
            let b = begin_purchase("race-1", version, OfferingsFound, &token, t0(), Some(debit));
            (token, store.begin_purchase(b).await.unwrap())
        });
    }
    let outcomes = tasks.join_all().await;

    // THEN exactly one acquired it, every other one saw a conflict, and only one debit landed
    let winners: Vec<_> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, BeginPurchaseOutcome::Acquired { version: 4 }))
        .collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    assert!(
        outcomes.iter().all(|(_, o)| matches!(
            o,
            BeginPurchaseOutcome::Acquired { .. } | BeginPurchaseOutcome::Conflict
        )),
        "{outcomes:?}"
    );
    let record = store
        .get_request(&request_id("race-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Purchasing);
    assert_eq!(record.version, 4);
    assert_eq!(record.lease.unwrap().token, winners[0].0);
    assert_eq!(record.open_debit, Some(amount));
    assert_eq!(record.spent, amount);
    assert_eq!(ledger_at_t0(&store, "ml-research").await, amount);
}

#[tokio::test]
async fn thirty_two_concurrent_debits_against_a_cap_that_fits_five_let_exactly_five_through() {
    // GIVEN 32 requests of one team, each ready to buy, and a monthly cap that fits 5 buys
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let amount = usd("1234.567891").to_micros_ceil();
    let cap = MicroUsd(amount.0 * 5 + amount.0 / 2);
    for i in 0..32 {
        request_with_offerings(&store, &format!("budget-{i}"), "vision").await;
    }

    // WHEN all 32 debit at once
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..32 {
        let store = store.clone();
        tasks.spawn(async move {
            let id = format!("budget-{i}");
            let b = begin_purchase(
                &id,
                3,
                OfferingsFound,
                "w",
                t0(),
                Some(debit("vision", amount, cap)),
            );
            (id, store.begin_purchase(b).await.unwrap())
        });
    }
    let outcomes = tasks.join_all().await;

    // THEN exactly 5 succeed, the rest are refused as over the team's budget, and the
    // ledger holds exactly five debits
    let acquired: Vec<_> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, BeginPurchaseOutcome::Acquired { .. }))
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(acquired.len(), 5, "{outcomes:?}");
    for (id, o) in &outcomes {
        match o {
            BeginPurchaseOutcome::Acquired { .. } => {
                assert_eq!(status_of(&store, id).await, Purchasing)
            }
            BeginPurchaseOutcome::OverTeamBudget { spent, cap: c } => {
                assert_eq!(*c, cap);
                assert!(spent.0 + amount.0 > cap.0, "{id}: refused at {spent:?}");
                let r = store.get_request(&request_id(id)).await.unwrap().unwrap();
                assert_eq!(
                    (r.status, r.spent, r.open_debit),
                    (OfferingsFound, MicroUsd(0), None)
                );
            }
            other => panic!("{id}: unexpected {other:?}"),
        }
    }
    assert_eq!(ledger_at_t0(&store, "vision").await, MicroUsd(amount.0 * 5));
}

#[tokio::test]
async fn a_purchase_over_the_requests_own_cap_is_refused_and_debits_nothing_and_a_stale_one_conflicts()
 {
    // GIVEN a request whose cap is below the fee
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "small-cap", "nlp").await;
    let amount = usd("7974.40").to_micros_ceil();
    let mut d = debit("nlp", amount, MicroUsd(amount.0 * 10));
    d.request_cap = usd("5000.00").to_micros_ceil();

    // WHEN it tries to buy
    let b = begin_purchase("small-cap", 3, OfferingsFound, "w", t0(), Some(d.clone()));
    let outcome = store.begin_purchase(b).await.unwrap();

    // THEN it is refused with the numbers, and neither the ledger nor the request moved
    assert_eq!(
        outcome,
        BeginPurchaseOutcome::OverRequestBudget {
            spent: MicroUsd(0),
            cap: d.request_cap
        }
    );
    assert_eq!(status_of(&store, "small-cap").await, OfferingsFound);
    assert_eq!(ledger_at_t0(&store, "nlp").await, MicroUsd(0));

    // WHEN another worker writes the request (version 4, still OfferingsFound) and one that
    // read version 3 tries the same purchase
    let mut k = cancellation_kept("small-cap", 3, "c-race");
    k.status = OfferingsFound;
    k.note = None;
    assert_eq!(
        store.keep_cancellation(k).await.unwrap(),
        WriteOutcome::Applied { version: 4 }
    );
    let mut stale = begin_purchase("small-cap", 3, OfferingsFound, "w2", t0(), Some(d));
    stale.caused_by = Cause::new("purchase-small-cap-stale");
    // THEN it is a conflict, to read again, before any refusal of its amount (issue 51: the
    // store campaign's `||` -> `&&` answered a stale read with the budget's refusal)
    assert_eq!(
        store.begin_purchase(stale).await.unwrap(),
        BeginPurchaseOutcome::Conflict
    );
}

#[tokio::test]
async fn a_duplicate_event_is_processed_once() {
    // GIVEN a request created by an event, and a transition caused by another
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    store
        .create_request(new_request("dup-1", "ml", None))
        .await
        .unwrap();
    let mut t = transition("dup-1", 1, Accepted, Searching, "evt-search");
    t.outbox = vec![event("dup-1-searching")];
    assert_eq!(
        store.transition(t.clone()).await.unwrap(),
        WriteOutcome::Applied { version: 2 }
    );

    // WHEN both events are delivered again
    let again_create = store
        .create_request(new_request("dup-1", "ml", None))
        .await
        .unwrap();
    let again = store.transition(t.clone()).await.unwrap();
    // (also when the redelivery carries the version a re-read would give it)
    let mut replay_at_new_version = transition("dup-1", 2, Searching, OfferingsFound, "evt-search");
    replay_at_new_version.outbox = vec![event("dup-1-found")];
    let again_later = store.transition(replay_at_new_version).await.unwrap();

    // THEN each is a no-op: the version stayed, and no second outbox item was written
    assert_eq!(again_create, CreateOutcome::DuplicateEvent);
    assert_eq!(again, WriteOutcome::DuplicateEvent);
    assert_eq!(again_later, WriteOutcome::DuplicateEvent);
    let r = store
        .get_request(&request_id("dup-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((r.status, r.version), (Searching, 2));
    let keys: Vec<String> = store
        .unsent_outbox(100)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.event.event_key)
        .collect();
    assert_eq!(keys, vec!["dup-1-accepted", "dup-1-searching"]);
}

#[tokio::test]
async fn a_second_request_with_the_same_id_is_refused_as_already_existing() {
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    store
        .create_request(new_request("same-id", "ml", None))
        .await
        .unwrap();

    let mut second = new_request("same-id", "ml", None);
    second.caused_by.event_id = "another-submit".into();

    assert_eq!(
        store.create_request(second).await.unwrap(),
        CreateOutcome::AlreadyExists
    );
}

#[tokio::test]
async fn an_outbox_item_left_unsent_by_a_crash_is_found_and_sent_by_the_next_run() {
    // GIVEN a committed transition with two events to publish
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    store
        .create_request(new_request("crash-1", "ml", None))
        .await
        .unwrap();
    store
        .mark_sent("crash-1", "crash-1-accepted")
        .await
        .unwrap();
    let mut t = transition("crash-1", 1, Accepted, Searching, "evt-1");
    t.outbox = vec![event("crash-1-a"), event("crash-1-b")];
    store.transition(t).await.unwrap();

    // WHEN the first run publishes one, then crashes before marking the other sent
    let first_run = store.unsent_outbox(10).await.unwrap();
    assert_eq!(first_run.len(), 2);
    store.mark_sent("crash-1", "crash-1-a").await.unwrap();

    // THEN the next run finds exactly the unsent one, and after marking it nothing is left
    let next_run = store.unsent_outbox(10).await.unwrap();
    assert_eq!(next_run.len(), 1);
    assert_eq!(next_run[0].request_id, "crash-1");
    assert_eq!(next_run[0].event, event("crash-1-b"));
    assert_eq!(next_run[0].created_at, t0());
    store.mark_sent("crash-1", "crash-1-b").await.unwrap();
    assert!(store.unsent_outbox(10).await.unwrap().is_empty());
    // and marking twice is harmless
    store.mark_sent("crash-1", "crash-1-b").await.unwrap();
}

#[tokio::test]
async fn the_events_of_one_write_are_published_in_the_order_the_handler_listed_them() {
    // GIVEN one transition whose events' keys sort the other way round
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    store
        .create_request(new_request("order-1", "ml", None))
        .await
        .unwrap();
    store
        .mark_sent("order-1", "order-1-accepted")
        .await
        .unwrap();
    let mut t = transition("order-1", 1, Accepted, Searching, "evt-1");
    t.outbox = vec![event("order-1-z-expiring"), event("order-1-a-drained")];
    store.transition(t).await.unwrap();

    // WHEN a run reads the outbox
    let unsent = store.unsent_outbox(10).await.unwrap();

    // THEN they come as listed, not by key
    let keys: Vec<&str> = unsent.iter().map(|o| o.event.event_key.as_str()).collect();
    assert_eq!(keys, ["order-1-z-expiring", "order-1-a-drained"]);
    assert_eq!(
        unsent.iter().map(|o| o.seq).collect::<Vec<_>>(),
        [outbox_seq(2, 0), outbox_seq(2, 1)]
    );
}

#[tokio::test]
async fn the_writes_of_one_instant_are_published_in_the_order_they_were_made() {
    // GIVEN two writes at the same instant (one invocation's now: a window drained, then
    // ended), whose events' keys sort the other way round
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    store
        .create_request(new_request("order-2", "ml", None))
        .await
        .unwrap();
    store
        .mark_sent("order-2", "order-2-accepted")
        .await
        .unwrap();
    let mut first = transition("order-2", 1, Accepted, Searching, "evt-1");
    first.outbox = vec![event("order-2-v9-drained")];
    store.transition(first).await.unwrap();
    let mut second = transition("order-2", 2, Searching, RequestStatus::NotFound, "evt-2");
    second.outbox = vec![event("order-2-v10-ended")];
    store.transition(second).await.unwrap();

    // WHEN a run reads the outbox
    let unsent = store.unsent_outbox(10).await.unwrap();

    // THEN the first write's event comes first
    let keys: Vec<&str> = unsent.iter().map(|o| o.event.event_key.as_str()).collect();
    assert_eq!(keys, ["order-2-v9-drained", "order-2-v10-ended"]);
}

#[tokio::test]
async fn of_runs_flushing_at_once_exactly_one_claims_an_outbox_item() {
    // GIVEN an unsent outbox item
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    store
        .create_request(new_request("claim-1", "ml", None))
        .await
        .unwrap();
    let key = store.unsent_outbox(10).await.unwrap()[0]
        .event
        .event_key
        .clone();
    let now = chrono::Utc::now();
    let until = now + Duration::minutes(5);

    // WHEN eight runs claim it at once
    let claims = futures_claims(&store, &key, until, now).await;

    // THEN exactly one holds it; others cannot while the claim lasts
    assert_eq!(claims.iter().filter(|c| **c).count(), 1, "{claims:?}");
    assert!(
        !store
            .claim_outbox("claim-1", &key, until, now)
            .await
            .unwrap()
    );
    // AND once the claim has passed, or been given back, the next run can take it
    let later = until + Duration::seconds(1);
    assert!(
        store
            .claim_outbox("claim-1", &key, later + Duration::minutes(5), later)
            .await
            .unwrap()
    );
    store.release_outbox_claim("claim-1", &key).await.unwrap();
    assert!(
        store
            .claim_outbox("claim-1", &key, until, now)
            .await
            .unwrap()
    );
    // AND a sent item is never claimed again
    store.mark_sent("claim-1", &key).await.unwrap();
    store.release_outbox_claim("claim-1", &key).await.unwrap();
    assert!(
        !store
            .claim_outbox("claim-1", &key, until, now)
            .await
            .unwrap()
    );
}

async fn futures_claims(
    store: &capacity_pilot::aws::dynamodb::DynamoStore,
    key: &str,
    until: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<bool> {
    let mut handles = Vec::new();
    for _ in 0..8 {
        let (store, key) = (store.clone(), key.to_string());
        handles.push(tokio::spawn(async move {
            store
                .claim_outbox("claim-1", &key, until, now)
                .await
                .unwrap()
        }));
    }
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn unsent_outbox_items_come_oldest_first_and_at_most_the_limit() {
    let table = TestTable::fresh().await.unwrap();
    let store = table.store().with_page_size(2);
    for i in 0..5 {
        let mut n = new_request(&format!("ob-{i}"), "ml", None);
        n.at = t0() + Duration::minutes(10 - i);
        store.create_request(n).await.unwrap();
    }

    let three = store.unsent_outbox(3).await.unwrap();

    let ids: Vec<&str> = three.iter().map(|o| o.request_id.as_str()).collect();
    assert_eq!(ids, vec!["ob-4", "ob-3", "ob-2"]);
}

#[tokio::test]
async fn an_expired_lease_lets_a_second_worker_take_over_and_the_first_workers_late_write_is_refused()
 {
    // GIVEN worker A holds the purchase lease (20 minutes) and has debited the budget
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "lease-1", "ml").await;
    let amount = usd("7974.40").to_micros_ceil();
    let a = begin_purchase(
        "lease-1",
        3,
        OfferingsFound,
        "A",
        t0(),
        Some(debit("ml", amount, MicroUsd(amount.0 * 3))),
    );
    assert_eq!(
        store.begin_purchase(a).await.unwrap(),
        BeginPurchaseOutcome::Acquired { version: 4 }
    );

    // WHEN worker B tries to take over before the lease expires
    let early = begin_purchase(
        "lease-1",
        4,
        Purchasing,
        "B",
        t0() + Duration::minutes(10),
        None,
    );
    // THEN it is told who holds it until when
    assert_eq!(
        store.begin_purchase(early).await.unwrap(),
        BeginPurchaseOutcome::LeaseHeld {
            until: t0() + Duration::minutes(20)
        }
    );

    // WHEN B tries again after the lease expired
    let late = begin_purchase(
        "lease-1",
        4,
        Purchasing,
        "B",
        t0() + Duration::minutes(21),
        None,
    );
    // THEN B holds the lease, and the first debit is still the only one
    assert_eq!(
        store.begin_purchase(late).await.unwrap(),
        BeginPurchaseOutcome::Acquired { version: 5 }
    );
    assert_eq!(ledger_at_t0(&store, "ml").await, amount);

    // WHEN A's late writes arrive
    let a_record = record_reservation(
        "lease-1",
        "A",
        reservation("cr-aaa", "7974.40"),
        t0() + Duration::minutes(22),
    );
    let a_release = release_unbought("lease-1", "A", t0() + Duration::minutes(22));
    // THEN both are refused and change nothing
    assert_eq!(
        store.record_reservation(a_record).await.unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
    assert_eq!(
        store.release_unbought(a_release).await.unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
    assert!(
        store
            .reservations(&request_id("lease-1"))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(ledger_at_t0(&store, "ml").await, amount);

    // AND B records the reservation it adopted: the debit is kept and closed
    let b_record = record_reservation(
        "lease-1",
        "B",
        reservation("cr-aaa", "7974.40"),
        t0() + Duration::minutes(23),
    );
    assert_eq!(
        store.record_reservation(b_record).await.unwrap(),
        LeaseWriteOutcome::Applied { version: 6 }
    );
    let r = store
        .get_request(&request_id("lease-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.status, r.open_debit, r.lease, r.spent),
        (Reserved, None, None, amount)
    );
    // (stamped with the ledger its debit was charged to: team and month)
    let mut recorded = reservation("cr-aaa", "7974.40");
    recorded.debit_month = Some(BudgetMonth::of(t0()).0);
    recorded.debit_team = Some("ml".into());
    assert_eq!(
        store.reservations(&request_id("lease-1")).await.unwrap(),
        vec![recorded]
    );
}

#[tokio::test]
async fn releasing_an_unbought_purchase_returns_exactly_the_open_debit_to_the_ledger() {
    // GIVEN two requests of a team, both debited, one bought
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let (kept, released) = (
        usd("100.000001").to_micros_ceil(),
        usd("2500.5").to_micros_ceil(),
    );
    let cap = MicroUsd(10_000_000_000);
    request_with_offerings(&store, "kept", "ops").await;
    request_with_offerings(&store, "released", "ops").await;
    store
        .begin_purchase(begin_purchase(
            "kept",
            3,
            OfferingsFound,
            "k",
            t0(),
            Some(debit("ops", kept, cap)),
        ))
        .await
        .unwrap();
    store
        .begin_purchase(begin_purchase(
            "released",
            3,
            OfferingsFound,
            "r",
            t0(),
            Some(debit("ops", released, cap)),
        ))
        .await
        .unwrap();
    store
        .record_reservation(record_reservation(
            "kept",
            "k",
            reservation("cr-kept", "100.000001"),
            t0(),
        ))
        .await
        .unwrap();

    // WHEN reconciliation finds nothing was bought for the other
    let outcome = store
        .release_unbought(release_unbought("released", "r", t0()))
        .await
        .unwrap();

    // THEN its debit, and only its debit, is released; a replay releases nothing more
    assert_eq!(outcome, LeaseWriteOutcome::Applied { version: 5 });
    assert_eq!(ledger_at_t0(&store, "ops").await, kept);
    let r = store
        .get_request(&request_id("released"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.status, r.open_debit, r.spent, r.lease),
        (Searching, None, MicroUsd(0), None)
    );
    assert_eq!(
        store
            .release_unbought(release_unbought("released", "r", t0()))
            .await
            .unwrap(),
        LeaseWriteOutcome::DuplicateEvent
    );
    assert_eq!(ledger_at_t0(&store, "ops").await, kept);
}

#[tokio::test]
async fn due_work_queries_return_every_due_item_across_pages_and_nothing_not_due() {
    // GIVEN 23 requests due now or earlier (two statuses), 6 due later (one within the same
    // second as now), 3 with no next action, 2 due in a status not asked for; pages of 4
    let table = TestTable::fresh().await.unwrap();
    let store = table.store().with_page_size(4);
    let now = t0() + Duration::hours(1);
    let mut expected = HashSet::new();
    for i in 0..15 {
        let id = format!("due-a-{i}");
        store
            .create_request(new_request(&id, "ml", Some(now - Duration::minutes(i))))
            .await
            .unwrap();
        expected.insert(id);
    }
    for i in 0..8 {
        let id = format!("due-s-{i}");
        store
            .create_request(new_request(&id, "ml", None))
            .await
            .unwrap();
        let mut t = transition(&id, 1, Accepted, Searching, &format!("s-{id}"));
        t.next_action_at = Some(now - Duration::seconds(i * 7));
        store.transition(t).await.unwrap();
        expected.insert(id);
    }
    for i in 0..5 {
        let later = now + Duration::minutes(i + 1);
        store
            .create_request(new_request(&format!("later-{i}"), "ml", Some(later)))
            .await
            .unwrap();
    }
    store
        .create_request(new_request(
            "same-second",
            "ml",
            Some(now + Duration::milliseconds(500)),
        ))
        .await
        .unwrap();
    for i in 0..3 {
        store
            .create_request(new_request(&format!("idle-{i}"), "ml", None))
            .await
            .unwrap();
    }
    for i in 0..2 {
        let id = format!("other-{i}");
        store
            .create_request(new_request(&id, "ml", None))
            .await
            .unwrap();
        let mut t = transition(&id, 1, Accepted, Cancelled, &format!("c-{id}"));
        t.at = now;
        t.next_action_at = Some(now - Duration::hours(1));
        store.transition(t).await.unwrap();
    }

    // WHEN the due work is asked for
    let due = store.due(&[Accepted, Searching], now).await.unwrap();

    // THEN exactly the due ones come back, each once, with their status and time
    let got: HashSet<String> = due.iter().map(|d| d.request_id.to_string()).collect();
    assert_eq!(due.len(), expected.len(), "no duplicates");
    assert_eq!(got, expected);
    assert!(due.iter().all(|d| d.next_action_at <= now));
    let s3 = due
        .iter()
        .find(|d| d.request_id.as_str() == "due-s-3")
        .unwrap();
    assert_eq!(
        (s3.status, s3.next_action_at),
        (Searching, now - Duration::seconds(21))
    );
}

#[tokio::test]
async fn money_round_trips_without_loss() {
    // GIVEN amounts a float would round: sub-cent fees, and a ledger debit past 2^53 micro-USD
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let mut new = new_request("money-1", "ml", None);
    new.request = capacity_request("money-1", "ml", "9007199254.740993");
    store.create_request(new.clone()).await.unwrap();
    let mut t = transition("money-1", 1, Accepted, Searching, "m-1");
    store.transition(t.clone()).await.unwrap();
    t = transition("money-1", 2, Searching, OfferingsFound, "m-2");
    t.candidates = Some(vec![
        plan("0.000001"),
        plan("7974.400001"),
        plan("123456789.99"),
    ]);
    store.transition(t).await.unwrap();
    let amount = usd("9007199254.740993").to_micros_ceil();
    assert_eq!(amount, MicroUsd(9_007_199_254_740_993));
    let mut d = debit("ml", amount, MicroUsd(amount.0 + 2));
    d.request_cap = amount;

    // WHEN they are stored and read back
    store
        .begin_purchase(begin_purchase(
            "money-1",
            3,
            OfferingsFound,
            "w",
            t0(),
            Some(d),
        ))
        .await
        .unwrap();
    store
        .record_reservation(record_reservation(
            "money-1",
            "w",
            reservation("cr-m", "7974.400001"),
            t0(),
        ))
        .await
        .unwrap();

    // THEN every amount is exactly what was written
    let r = store
        .get_request(&request_id("money-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.request, new.request);
    assert_eq!(
        r.request.budget.max_upfront.to_string(),
        "9007199254.740993"
    );
    assert_eq!(
        r.candidates,
        vec![plan("0.000001"), plan("7974.400001"), plan("123456789.99")]
    );
    assert_eq!(r.spent, amount);
    assert_eq!(
        store.reservations(&request_id("money-1")).await.unwrap()[0].upfront_fee,
        usd("7974.400001")
    );
    assert_eq!(ledger_at_t0(&store, "ml").await, amount);
    // AND on the wire: the ledger is an integer N, the money in documents a decimal string
    let ledger = table
        .client
        .get_item()
        .table_name(&table.name)
        .key(
            "pk",
            AttributeValue::S(format!("BUDGET#ml#{}", BudgetMonth::of(t0()).0)),
        )
        .key("sk", AttributeValue::S("LEDGER".into()))
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    assert_eq!(
        ledger["spent_micros"],
        AttributeValue::N("9007199254740993".into())
    );
    let meta = raw_item(&table, "REQ#money-1", "META").await;
    let request_json = meta["request"].as_s().unwrap();
    assert!(
        request_json.contains(r#""max_upfront":"9007199254.740993""#),
        "{request_json}"
    );
}

async fn raw_item(
    table: &TestTable,
    pk: &str,
    sk: &str,
) -> std::collections::HashMap<String, AttributeValue> {
    table
        .client
        .get_item()
        .table_name(&table.name)
        .key("pk", AttributeValue::S(pk.into()))
        .key("sk", AttributeValue::S(sk.into()))
        .send()
        .await
        .unwrap()
        .item
        .unwrap()
}

#[tokio::test]
async fn an_ended_request_gets_a_ttl_and_reads_ignore_it_once_the_ttl_has_passed() {
    // GIVEN one request that ended long ago, and one that ended just now (the TTL is
    // DynamoDB's: it counts from the end against the real clock)
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let long_ago = chrono::Utc::now() - Duration::days(100);
    for (id, at) in [("old", long_ago), ("recent", chrono::Utc::now())] {
        let mut n = new_request(id, "ml", Some(at));
        n.at = at;
        store.create_request(n).await.unwrap();
        let mut t = transition(id, 1, Accepted, Cancelled, &format!("cancel-{id}"));
        t.at = at;
        store.transition(t).await.unwrap();
    }

    // WHEN they are read
    let old = store.get_request(&request_id("old")).await.unwrap();
    let recent = store.get_request(&request_id("recent")).await.unwrap();

    // THEN the expired one is gone to readers, the other is there; both carry the TTL
    // attribute the table's TTL specification names
    assert_eq!(old, None);
    assert_eq!(recent.unwrap().status, Cancelled);
    let ttl = table
        .client
        .describe_time_to_live()
        .table_name(&table.name)
        .send()
        .await
        .unwrap();
    let ttl_attr = ttl
        .time_to_live_description()
        .unwrap()
        .attribute_name()
        .unwrap()
        .to_string();
    for id in ["old", "recent"] {
        let meta = raw_item(&table, &format!("REQ#{id}"), "META").await;
        assert!(meta.contains_key(&ttl_attr), "{id} has no {ttl_attr}");
    }
}

#[tokio::test]
async fn illegal_or_misrouted_transitions_are_refused_before_anything_is_written() {
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "illegal-1", "ml").await;

    let skip_ahead = transition("illegal-1", 3, OfferingsFound, Reserved, "e1");
    // a legal step, but one that must take the lease and debit the budget
    let into_purchasing = transition("illegal-1", 3, OfferingsFound, Purchasing, "e2");

    assert!(store.transition(skip_ahead).await.unwrap_err().code() == Some("IllegalTransition"));
    assert!(
        store.transition(into_purchasing).await.unwrap_err().code() == Some("IllegalTransition")
    );
    let r = store
        .get_request(&request_id("illegal-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((r.status, r.version), (OfferingsFound, 3));
}

#[tokio::test]
async fn a_stale_version_is_a_conflict_not_an_error() {
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    store
        .create_request(new_request("stale-1", "ml", None))
        .await
        .unwrap();
    store
        .transition(transition("stale-1", 1, Accepted, Searching, "e1"))
        .await
        .unwrap();

    let stale = transition("stale-1", 1, Accepted, Cancelled, "e2");

    assert_eq!(
        store.transition(stale).await.unwrap(),
        WriteOutcome::Conflict
    );
}

#[tokio::test]
async fn workloads_are_recorded_under_their_reservation_and_replaced_by_slot() {
    use capacity_pilot::ports::WorkloadRecord;
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "wl-1", "ml").await;
    store
        .begin_purchase(begin_purchase("wl-1", 3, OfferingsFound, "w", t0(), None))
        .await
        .unwrap();
    store
        .record_reservation(record_reservation(
            "wl-1",
            "w",
            reservation("cr-wl", "10.00"),
            t0(),
        ))
        .await
        .unwrap();
    let w = |slot, generation, id: &str| WorkloadRecord {
        request_id: request_id("wl-1"),
        reservation_id: "cr-wl".into(),
        slot,
        generation,
        resource_id: id.into(),
        state: "running".into(),
        updated_at: t0(),

        started_at: None,
        ended_at: None,
        ran: Vec::new(),
        relaunch: 0,
    };

    for rec in [w(0, 0, "i-0"), w(1, 0, "i-1"), w(1, 1, "i-1b")] {
        store.put_workload(rec).await.unwrap();
    }

    let mut got = store.workloads(&request_id("wl-1")).await.unwrap();
    got.sort_by_key(|w| w.slot);
    assert_eq!(got, vec![w(0, 0, "i-0"), w(1, 1, "i-1b")]);
    assert_eq!(
        store.reservations(&request_id("wl-1")).await.unwrap().len(),
        1
    );
}

#[tokio::test]
async fn an_on_demand_debit_is_kept_with_its_transition_and_refused_over_either_cap() {
    // GIVEN three on-demand-first requests of a team whose month fits one launch, and whose
    // first request may spend only a little
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let amount = usd("98.3232").to_micros_ceil();
    let cap = MicroUsd(amount.0 + amount.0 / 2);
    for id in ["od-1", "od-2", "od-3"] {
        store
            .create_request(new_request(id, "web", None))
            .await
            .unwrap();
        let t = transition(id, 1, Accepted, TryingOnDemand, &format!("try-{id}"));
        store.transition(t).await.unwrap();
    }
    let launch = |id: &str, d| {
        let mut t = transition(id, 2, TryingOnDemand, RunningOnDemand, &format!("run-{id}"));
        t.debit = Some(d);
        t
    };
    let mut small = debit("web", amount, cap);
    small.request_cap = MicroUsd(amount.0 - 1);

    // WHEN the first launches over its own cap, the second within both, the third over the team's
    let over_request = store.transition(launch("od-1", small)).await.unwrap();
    let within = store
        .transition(launch("od-2", debit("web", amount, cap)))
        .await
        .unwrap();
    let over_team = store
        .transition(launch("od-3", debit("web", amount, cap)))
        .await
        .unwrap();

    // THEN only the second is applied, and its debit is kept, not left open
    assert_eq!(
        over_request,
        WriteOutcome::OverRequestBudget {
            spent: MicroUsd(0),
            cap: MicroUsd(amount.0 - 1)
        }
    );
    assert_eq!(within, WriteOutcome::Applied { version: 3 });
    assert_eq!(
        over_team,
        WriteOutcome::OverTeamBudget { spent: amount, cap }
    );
    let r = store
        .get_request(&request_id("od-2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.status, r.spent, r.open_debit),
        (RunningOnDemand, amount, None)
    );
    assert_eq!(status_of(&store, "od-3").await, TryingOnDemand);
    assert_eq!(ledger_at_t0(&store, "web").await, amount);
}

#[tokio::test]
async fn a_first_debit_larger_than_the_whole_monthly_cap_is_refused_and_one_of_exactly_the_cap_taken()
 {
    // GIVEN a team with no spend yet this month
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "huge", "tiny-team").await;
    let d = debit(
        "tiny-team",
        usd("7974.40").to_micros_ceil(),
        usd("5000").to_micros_ceil(),
    );

    // WHEN a purchase costs more than the whole cap
    let b = begin_purchase("huge", 3, OfferingsFound, "w", t0(), Some(d.clone()));
    let outcome = store.begin_purchase(b).await.unwrap();

    // THEN it is refused and the ledger stays empty
    assert_eq!(
        outcome,
        BeginPurchaseOutcome::OverTeamBudget {
            spent: MicroUsd(0),
            cap: d.team_cap
        }
    );
    assert_eq!(ledger_at_t0(&store, "tiny-team").await, MicroUsd(0));

    // WHEN another costs exactly the whole cap (issue 51: the store's check before its
    // transaction refused it with `>=`)
    let exact = debit("tiny-team", d.team_cap, d.team_cap);
    let b = begin_purchase("huge", 3, OfferingsFound, "w2", t0(), Some(exact));
    // THEN it is taken, the ledger at the cap
    assert_eq!(
        store.begin_purchase(b).await.unwrap(),
        BeginPurchaseOutcome::Acquired { version: 4 }
    );
    assert_eq!(ledger_at_t0(&store, "tiny-team").await, d.team_cap);
}

#[tokio::test]
async fn a_split_plans_first_segment_shrinks_the_open_debit_to_what_is_left_to_buy() {
    // GIVEN a purchase of a split plan debited as one
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "split", "ml").await;
    let whole = usd("9000.00").to_micros_ceil();
    let d = debit("ml", whole, MicroUsd(whole.0 * 2));
    store
        .begin_purchase(begin_purchase(
            "split",
            3,
            OfferingsFound,
            "w",
            t0(),
            Some(d),
        ))
        .await
        .unwrap();

    // WHEN the first segment is bought and the second then cannot be
    let mut first = record_reservation("split", "w", reservation("cr-first", "4000.00"), t0());
    first.to = Purchasing;
    assert_eq!(
        store.record_reservation(first).await.unwrap(),
        LeaseWriteOutcome::Applied { version: 5 }
    );
    let open = store
        .get_request(&request_id("split"))
        .await
        .unwrap()
        .unwrap()
        .open_debit;
    let released = store
        .release_unbought(release_unbought("split", "w", t0()))
        .await
        .unwrap();

    // THEN only the unbought remainder went back to the ledger
    assert_eq!(open, Some(usd("5000.00").to_micros_ceil()));
    assert_eq!(released, LeaseWriteOutcome::Applied { version: 6 });
    assert_eq!(
        ledger_at_t0(&store, "ml").await,
        usd("4000.00").to_micros_ceil()
    );
    let r = store
        .get_request(&request_id("split"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.spent, r.open_debit),
        (usd("4000.00").to_micros_ceil(), None)
    );
}

#[tokio::test]
async fn a_stray_is_debited_past_the_cap_and_in_the_plans_place_returns_the_plans_debit() {
    // GIVEN two purchases of $9000 each under way, in a month whose cap is $20000
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let cap = usd("20000.00").to_micros_ceil();
    for id in ["in-place", "beside"] {
        request_with_offerings(&store, id, "ml").await;
        let d = debit("ml", usd("9000.00").to_micros_ceil(), cap);
        store
            .begin_purchase(begin_purchase(id, 3, OfferingsFound, "w", t0(), Some(d)))
            .await
            .unwrap();
    }

    // WHEN "in-place" records a $15000 stray that reserves it instead of its plan, and
    // "beside" records a $4000 stray beside its plan and then the plan's $9000 block
    let mut in_place = record_reservation("in-place", "w", reservation("cr-s1", "15000.00"), t0());
    in_place.uncapped = Some(debit("ml", usd("15000.00").to_micros_ceil(), cap));
    assert_eq!(
        store.record_reservation(in_place).await.unwrap(),
        LeaseWriteOutcome::Applied { version: 5 }
    );
    let mut beside = record_reservation("beside", "w", reservation("cr-s2", "4000.00"), t0());
    beside.to = Purchasing;
    beside.uncapped = Some(debit("ml", usd("4000.00").to_micros_ceil(), cap));
    store.record_reservation(beside).await.unwrap();
    let mut plan = record_reservation("beside", "w", reservation("cr-p2", "9000.00"), t0());
    plan.caused_by = Cause::new("record-beside-plan");
    assert_eq!(
        store.record_reservation(plan).await.unwrap(),
        LeaseWriteOutcome::Applied { version: 6 }
    );

    // THEN each stray is charged whole, past the cap ($28000 of $20000), and the in-place
    // one's plan debit went back
    assert_eq!(
        ledger_at_t0(&store, "ml").await,
        usd("28000.00").to_micros_ceil()
    );
    let a = get(&store, "in-place").await;
    assert_eq!(
        (a.status, a.spent, a.open_debit),
        (Reserved, usd("15000.00").to_micros_ceil(), None)
    );
    let b = get(&store, "beside").await;
    assert_eq!(
        (b.status, b.spent, b.open_debit),
        (Reserved, usd("13000.00").to_micros_ceil(), None)
    );
    let held = store.reservations(&request_id("beside")).await.unwrap();
    assert_eq!(held.len(), 2);
    assert!(held.iter().all(|r| r.debit_month.is_some()), "{held:?}");
}

#[tokio::test]
async fn a_cancellation_kept_during_a_purchase_refuses_a_release_that_would_pass_it_over() {
    // GIVEN a purchase under way
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "kept", "ml").await;
    let d = debit(
        "ml",
        usd("9000.00").to_micros_ceil(),
        usd("20000.00").to_micros_ceil(),
    );
    store
        .begin_purchase(begin_purchase(
            "kept",
            3,
            OfferingsFound,
            "w",
            t0(),
            Some(d),
        ))
        .await
        .unwrap();
    let keep = |version: u64, event: &str| cancellation_kept("kept", version, event);

    // WHEN a cancellation is kept on it (a stale one is a conflict)
    assert_eq!(
        store.keep_cancellation(keep(3, "c0")).await.unwrap(),
        WriteOutcome::Conflict
    );
    assert_eq!(
        store.keep_cancellation(keep(4, "c1")).await.unwrap(),
        WriteOutcome::Applied { version: 5 }
    );
    let rec = get(&store, "kept").await;
    assert_eq!(rec.cancel.as_ref().map(|c| c.event_id.as_str()), Some("c1"));
    assert_eq!((rec.status, rec.lease.is_some()), (Purchasing, true));

    // THEN the worker's release back to searching is refused, and only one applying the
    // cancellation goes through, returning the debit
    assert_eq!(
        store
            .release_unbought(release_unbought("kept", "w", t0()))
            .await
            .unwrap(),
        LeaseWriteOutcome::CancelKept
    );
    let mut apply = release_unbought("kept", "w", t0());
    apply.to = Cancelled;
    apply.caused_by = Cause::new("release-apply");
    assert_eq!(
        store.release_unbought(apply).await.unwrap(),
        LeaseWriteOutcome::Applied { version: 6 }
    );
    let rec = get(&store, "kept").await;
    assert_eq!(
        (rec.status, rec.spent, rec.open_debit),
        (Cancelled, MicroUsd(0), None)
    );
    assert_eq!(ledger_at_t0(&store, "ml").await, MicroUsd(0));
}

#[tokio::test]
async fn a_planned_requests_id_takes_a_new_request_and_no_other_ended_one_does() {
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    store.begin_run(t0());
    // GIVEN a request that searched and ended Planned, and one that ended Failed
    let mut ends = Vec::new();
    for (id, to) in [("planned", Planned), ("failed", Failed)] {
        store
            .create_request(new_request(id, "ml", None))
            .await
            .unwrap();
        let rec = store.get_request(&request_id(id)).await.unwrap().unwrap();
        let step = |n: u32| Cause::new(format!("{id}-step-{n}"));
        store
            .transition(Transition::of(
                &rec,
                Searching,
                "searching",
                Some(t0()),
                t0(),
                &step(1),
            ))
            .await
            .unwrap();
        let rec = store.get_request(&request_id(id)).await.unwrap().unwrap();
        let w = store
            .transition(Transition::of(&rec, to, "decided", None, t0(), &step(2)))
            .await
            .unwrap();
        assert!(matches!(w, WriteOutcome::Applied { .. }), "{id}: {w:?}");
        ends.push(id);
    }
    // WHEN each id is submitted again, by another event
    store.begin_run(t0() + Duration::minutes(5));
    let again = |id: &str| {
        let mut n = new_request(id, "ml", None);
        n.caused_by = Cause::new(format!("resubmit-{id}"));
        n.at = t0() + Duration::minutes(5);
        n
    };
    let planned = store.create_request(again("planned")).await.unwrap();
    let failed = store.create_request(again("failed")).await.unwrap();
    // THEN the planned one's id takes a new request, its history starting afresh ...
    assert_eq!(planned, CreateOutcome::Created { version: 1 });
    let rec = store
        .get_request(&request_id("planned"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (rec.status, rec.created_at),
        (Accepted, t0() + Duration::minutes(5))
    );
    let history = store.history(&request_id("planned")).await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0].from, None);
    // ... and the failed one's does not
    assert_eq!(failed, CreateOutcome::AlreadyExists);
    assert_eq!(ends, ["planned", "failed"]);
}

#[tokio::test]
async fn a_rejected_submission_is_kept_a_week_under_its_id_in_any_spelling_apart_from_requests() {
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let rejected = |event: &str, at| RejectedSubmission {
        request_id: request_id("Team-Eval"),
        event_id: event.into(),
        source: "com.example.ml-platform".into(),
        at,
        problems: vec![FieldError {
            field: "workload.endpoint_name".into(),
            message: "is claimed by another request".into(),
        }],
    };
    // GIVEN two rejections of the id, one eight days old, and one recorded twice (a
    // redelivery)
    store.begin_run(t0());
    store
        .record_rejection(rejected("old", t0() - Duration::days(8)))
        .await
        .unwrap();
    for _ in 0..2 {
        store.record_rejection(rejected("new", t0())).await.unwrap();
    }
    // WHEN they are read under another spelling of the id, by another run
    store.begin_run(t0() + Duration::minutes(1));
    let kept = store.rejections(&request_id("team-eval")).await.unwrap();
    // THEN only the week's one is there, once, as written
    assert_eq!(kept, vec![rejected("new", t0())]);
    // AND it is no request: the id is free to submit again
    assert!(
        store
            .get_request(&request_id("team-eval"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        store
            .create_request(new_request("team-eval", "ml", None))
            .await
            .unwrap(),
        CreateOutcome::Created { .. }
    ));
}

#[tokio::test]
async fn a_tombstone_cancels_only_a_submission_from_its_source_within_seven_days() {
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let stone = |id: &str, at| Tombstone {
        request_id: request_id(id),
        source: "com.example.ml-platform".into(),
        reason: "cancelled by the requester".into(),
        at,
        event_id: format!("cancel-{id}"),
    };
    // GIVEN cancellations before their submissions: two now, one eight days ago
    for (id, at) in [
        ("same", t0()),
        ("other", t0()),
        ("stale", t0() - Duration::days(8)),
    ] {
        assert_eq!(
            store.put_tombstone(stone(id, at), vec![]).await.unwrap(),
            TombstoneOutcome::Placed
        );
    }

    // WHEN each is submitted, "other" from another source
    let same = store.create_request(new_request("same", "ml", None)).await;
    let mut other = new_request("other", "ml", None);
    other.source = "com.example.other".into();
    let other = store.create_request(other).await.unwrap();
    let stale = store
        .create_request(new_request("stale", "ml", None))
        .await
        .unwrap();

    // THEN only the same source's, within the week, is refused as tombstoned, and nothing of
    // it is written until it is recorded cancelled
    assert_eq!(
        same.unwrap(),
        CreateOutcome::Tombstoned(stone("same", t0()))
    );
    assert!(
        store
            .get_request(&request_id("same"))
            .await
            .unwrap()
            .is_none()
    );
    let mut cancelled = new_request("same", "ml", None);
    cancelled.cancelled = Some("cancelled before it was submitted".into());
    cancelled.caused_by = Cause::new("submit-same-cancelled");
    assert_eq!(
        store.create_request(cancelled).await.unwrap(),
        CreateOutcome::Created { version: 1 }
    );
    assert_eq!(status_of(&store, "same").await, Cancelled);
    assert_eq!(other, CreateOutcome::Created { version: 1 });
    assert_eq!(stale, CreateOutcome::Created { version: 1 });
    assert_eq!(status_of(&store, "other").await, Accepted);
    // AND a cancellation for a recorded request leaves no tombstone
    let mut late = stone("other", t0());
    late.event_id = "cancel-other-again".into();
    assert_eq!(
        store.put_tombstone(late, vec![]).await.unwrap(),
        TombstoneOutcome::RequestExists
    );
}

// ---- ids compared ignoring case (review N15) ----------------------------------------------

fn stone_at(id: &str, at: chrono::DateTime<chrono::Utc>) -> Tombstone {
    Tombstone {
        request_id: request_id(id),
        source: "com.example.ml-platform".into(),
        reason: "cancelled by the requester".into(),
        at,
        event_id: format!("cancel-{id}"),
    }
}

/// GIVEN request `id` recorded, then cancelled 100 days ago: archived past its TTL.
async fn archived_long_ago(store: &DynamoStore, id: &str) {
    store
        .create_request(new_request(id, "ml", None))
        .await
        .unwrap();
    let mut end = transition(id, 1, Accepted, Cancelled, &format!("cancel-{id}-long-ago"));
    end.at = chrono::Utc::now() - Duration::days(100);
    assert_eq!(
        store.transition(end).await.unwrap(),
        WriteOutcome::Applied { version: 2 }
    );
}

#[tokio::test]
async fn a_request_id_is_held_ignoring_case_against_submissions_and_cancellations_alike() {
    // GIVEN request Case-1 recorded
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    assert_eq!(
        store
            .create_request(new_request("Case-1", "ml", None))
            .await
            .unwrap(),
        CreateOutcome::Created { version: 1 }
    );

    // WHEN case-1 is submitted, and CASE-1 cancelled as if not yet submitted
    let lower = table
        .store()
        .create_request(new_request("case-1", "ml", None))
        .await
        .unwrap();
    let placed = table
        .store()
        .put_tombstone(stone_at("CASE-1", t0()), vec![])
        .await
        .unwrap();

    // THEN the submission finds the id taken and nothing of it is written; no tombstone is
    // placed; each spelling names Case-1
    assert_eq!(lower, CreateOutcome::AlreadyExists);
    assert_eq!(placed, TombstoneOutcome::RequestExists);
    let fresh = table.store();
    assert!(
        fresh
            .get_request(&request_id("case-1"))
            .await
            .unwrap()
            .is_none()
    );
    for other in ["case-1", "CASE-1"] {
        assert_eq!(
            fresh.spelled(&request_id(other)).await.unwrap(),
            Some(request_id("Case-1")),
            "{other}"
        );
    }
    assert_eq!(fresh.spelled(&request_id("Case-1")).await.unwrap(), None);
    let rec = capacity_pilot::ports::request_named(&fresh, &request_id("CASE-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.request_id, request_id("Case-1"));

    // AND once an id's request is archived past its TTL, another spelling may take it
    archived_long_ago(&store, "Gone-1").await;
    assert_eq!(
        table
            .store()
            .create_request(new_request("gone-1", "ml", None))
            .await
            .unwrap(),
        CreateOutcome::Created { version: 1 }
    );
    assert_eq!(
        table.store().spelled(&request_id("GONE-1")).await.unwrap(),
        Some(request_id("gone-1"))
    );
}

#[tokio::test]
async fn a_creation_that_read_an_id_free_is_refused_if_any_spelling_took_it_meanwhile() {
    for (gone, meanwhile, late) in [
        ("Race-1", "RACE-1", "race-1"),
        // the gone spelling itself again: its id item reads as before
        ("Race-2", "Race-2", "race-2"),
    ] {
        // GIVEN an id whose request is archived past its TTL, read free by a worker's run
        let table = TestTable::fresh().await.unwrap();
        archived_long_ago(&table.store(), gone).await;
        let slow = table.store();
        slow.begin_run(chrono::Utc::now());
        assert_eq!(slow.spelled(&request_id(late)).await.unwrap(), None);

        // WHEN another spelling is created meanwhile, then the worker creates its own
        let mut first = new_request(meanwhile, "ml", None);
        first.caused_by = Cause::new("submit-meanwhile");
        assert_eq!(
            table.store().create_request(first).await.unwrap(),
            CreateOutcome::Created { version: 1 }
        );
        let refused = slow
            .create_request(new_request(late, "ml", None))
            .await
            .unwrap();

        // THEN the worker's write is refused and, read again, the id is found taken
        assert_eq!(refused, CreateOutcome::ClaimChanged, "{meanwhile}");
        assert_eq!(
            slow.create_request(new_request(late, "ml", None))
                .await
                .unwrap(),
            CreateOutcome::AlreadyExists,
            "{meanwhile}"
        );
        assert!(
            table
                .store()
                .get_request(&request_id(late))
                .await
                .unwrap()
                .is_none()
        );
    }
}

#[tokio::test]
async fn a_cancellation_before_its_submission_holds_for_any_spelling_and_one_kept_before_still_holds()
 {
    // GIVEN a cancellation of T-1 before its submission, and one of Old-T as the commit before
    // kept it: under the id as given
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    for id in ["T-1", "Old-T"] {
        assert_eq!(
            store
                .put_tombstone(stone_at(id, t0()), vec![])
                .await
                .unwrap(),
            TombstoneOutcome::Placed
        );
    }
    let mut kept = raw_item(&table, "REQ#old-t", "TOMBSTONE").await;
    kept.insert("pk".into(), AttributeValue::S("REQ#Old-T".into()));
    for (pk, put) in [("REQ#old-t", None), ("REQ#Old-T", Some(kept))] {
        let r = table.client.delete_item().table_name(&table.name);
        r.key("pk", AttributeValue::S(pk.into()))
            .key("sk", AttributeValue::S("TOMBSTONE".into()))
            .send()
            .await
            .unwrap();
        if let Some(item) = put {
            table
                .client
                .put_item()
                .table_name(&table.name)
                .set_item(Some(item))
                .send()
                .await
                .unwrap();
        }
    }

    // WHEN t-1 and Old-T are submitted from the cancelling source
    let store = table.store();
    let t1 = store
        .create_request(new_request("t-1", "ml", None))
        .await
        .unwrap();
    let old = store
        .create_request(new_request("Old-T", "ml", None))
        .await
        .unwrap();

    // THEN both meet their cancellation
    assert!(matches!(t1, CreateOutcome::Tombstoned(_)), "{t1:?}");
    assert!(matches!(old, CreateOutcome::Tombstoned(_)), "{old:?}");
}

#[tokio::test]
async fn requests_recorded_before_id_items_hold_their_id_ignoring_case_after_a_cold_start() {
    // GIVEN a table as the commit before id items wrote it: Live-1 recorded with no id item
    let table = TestTable::fresh().await.unwrap();
    table
        .store()
        .create_request(new_request("Live-1", "ml", Some(t0())))
        .await
        .unwrap();
    table
        .client
        .delete_item()
        .table_name(&table.name)
        .key("pk", AttributeValue::S("ID#live-1".into()))
        .key("sk", AttributeValue::S("ID".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        table.store().spelled(&request_id("live-1")).await.unwrap(),
        None
    );

    // WHEN the first cold start after the upgrade passes
    table.store().claim_live_requests(t0()).await.unwrap();

    // THEN another spelling of it is refused
    assert_eq!(
        table
            .store()
            .create_request(new_request("live-1", "ml", None))
            .await
            .unwrap(),
        CreateOutcome::AlreadyExists
    );
    assert_eq!(
        table.store().spelled(&request_id("LIVE-1")).await.unwrap(),
        Some(request_id("Live-1"))
    );
}

/// GIVEN request `id`, bought (reservation cr-e, one workload), which ended 100 days ago and
/// was archived with its children.
async fn ended_long_ago(store: &DynamoStore, id: &str) {
    request_with_offerings(store, id, "ml").await;
    store
        .begin_purchase(begin_purchase(id, 3, OfferingsFound, "w", t0(), None))
        .await
        .unwrap();
    store
        .record_reservation(record_reservation(
            id,
            "w",
            reservation("cr-e", "10.00"),
            t0(),
        ))
        .await
        .unwrap();
    store
        .put_workload(capacity_pilot::ports::WorkloadRecord {
            request_id: request_id(id),
            reservation_id: "cr-e".into(),
            slot: 0,
            generation: 0,
            resource_id: "i-0".into(),
            state: "terminated".into(),
            updated_at: t0(),

            started_at: None,
            ended_at: None,
            ran: Vec::new(),
            relaunch: 0,
        })
        .await
        .unwrap();
    assert_eq!(store.reservations(&request_id(id)).await.unwrap().len(), 1);
    let mut end = transition(id, 5, Reserved, RequestStatus::Ended, "end");
    end.at = chrono::Utc::now() - Duration::days(100);
    assert_eq!(
        store.transition(end).await.unwrap(),
        WriteOutcome::Applied { version: 6 }
    );
}

#[tokio::test]
async fn a_new_request_of_an_archived_id_never_reads_what_the_earlier_one_left_unstamped() {
    // GIVEN an id whose earlier request ended and was archived, but whose reservation and
    // workload items the archival failed to stamp (it only logs a failure: review N14, L4)
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    ended_long_ago(&store, "again").await;
    for sk in ["RES#cr-e", "SLOT#cr-e#00000"] {
        assert!(
            raw_item(&table, "REQ#again", sk)
                .await
                .contains_key("expires_at")
        );
        table
            .client
            .update_item()
            .table_name(&table.name)
            .key("pk", AttributeValue::S("REQ#again".into()))
            .key("sk", AttributeValue::S(sk.into()))
            .update_expression("REMOVE expires_at")
            .send()
            .await
            .unwrap();
    }

    // WHEN a new request takes the id
    let store = table.store();
    let mut again = new_request("again", "ml", None);
    again.caused_by = Cause::new("resubmitted");
    let created = store.create_request(again).await.unwrap();

    // THEN it is created, and holds nothing of the earlier one's
    assert_eq!(created, CreateOutcome::Created { version: 1 });
    let rec = store
        .get_request(&request_id("again"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((rec.status, rec.version), (Accepted, 1));
    assert!(
        store
            .reservations(&request_id("again"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .workloads(&request_id("again"))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn an_ended_requests_reservations_and_workloads_are_archived_with_it() {
    // GIVEN a bought request with a workload, which ended long ago (its end is past the
    // retention, as DynamoDB's clock sees it)
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    ended_long_ago(&store, "ended").await;

    // THEN its children carry the TTL too, and reads ignore them all
    let res = raw_item(&table, "REQ#ended", "RES#cr-e").await;
    assert!(res.contains_key("expires_at"));
    assert_eq!(store.get_request(&request_id("ended")).await.unwrap(), None);
    assert!(
        store
            .reservations(&request_id("ended"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .workloads(&request_id("ended"))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn an_event_whose_write_did_not_commit_can_be_processed_again() {
    // GIVEN an event whose transition lost a race (as a crash before the commit would leave it)
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    store
        .create_request(new_request("retry-1", "ml", None))
        .await
        .unwrap();
    let stale = transition("retry-1", 7, Accepted, Searching, "evt-retry");
    assert_eq!(
        store.transition(stale).await.unwrap(),
        WriteOutcome::Conflict
    );

    // WHEN the same event is processed again, against the current version
    let fresh = transition("retry-1", 1, Accepted, Searching, "evt-retry");

    // THEN it applies: nothing recorded it as processed
    assert_eq!(
        store.transition(fresh).await.unwrap(),
        WriteOutcome::Applied { version: 2 }
    );
}

#[tokio::test]
async fn a_purchase_whose_worker_died_becomes_due_when_its_lease_expires() {
    // GIVEN a worker took the purchase lease (20 minutes) and then died
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "orphan", "ml").await;
    store
        .begin_purchase(begin_purchase(
            "orphan",
            3,
            OfferingsFound,
            "dead",
            t0(),
            None,
        ))
        .await
        .unwrap();

    // WHEN the schedule asks for due purchases before and after the lease expiry
    let before = store
        .due(&[Purchasing], t0() + Duration::minutes(19))
        .await
        .unwrap();
    let after = store
        .due(&[Purchasing], t0() + Duration::minutes(20))
        .await
        .unwrap();

    // THEN it is due exactly from the expiry on
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].request_id, request_id("orphan"));
    assert_eq!(after[0].next_action_at, t0() + Duration::minutes(20));
}

// =======================================================================================
// Windows (ARCHITECTURE §8.4): the store keeps each window's state, and the request is due
// at the earliest of its own next action and its windows'.
// =======================================================================================

/// The drain lead of `capacity_request` (30 minutes) against a deployment default of 15.
const DRAIN: DrainLead = DrainLead {
    requested_minutes: 30,
    default_minutes: 15,
};

/// A Capacity Block of `days` whole days, from 11:30 UTC `start_day` days after t0's date.
fn block(id: &str, fee: &str, start_day: i64, days: i64) -> Reservation {
    let start =
        t0().date_naive().and_hms_opt(11, 30, 0).unwrap().and_utc() + Duration::days(start_day);
    let mut r = reservation(id, fee);
    r.segments[0].start = start;
    r.segments[0].end = start + Duration::days(days);
    r
}

async fn get(store: &DynamoStore, id: &str) -> RequestRecord {
    store.get_request(&request_id(id)).await.unwrap().unwrap()
}

/// The update launch or cleanup writes when the window `key` of `id` moves to `state` at
/// `at`: the request's windows as the model derives them, that one moved.
async fn window_update(
    store: &DynamoStore,
    id: &str,
    key: &str,
    state: WindowState,
    at: chrono::DateTime<chrono::Utc>,
    event_id: &str,
) -> WindowUpdate {
    let rec = get(store, id).await;
    let held = store.reservations(&request_id(id)).await.unwrap();
    let ws = window::windows(&held, &rec.windows, DRAIN);
    let records = window::records_with(&rec.windows, &ws, key, state, at);
    WindowUpdate::of(
        &rec,
        records,
        &format!("{key} {state}"),
        at,
        &Cause::new(event_id),
        vec![],
    )
}

/// The window `key`'s drain start, as the model derives it.
async fn drain_at(store: &DynamoStore, id: &str, key: &str) -> chrono::DateTime<chrono::Utc> {
    let rec = get(store, id).await;
    let held = store.reservations(&request_id(id)).await.unwrap();
    window::windows(&held, &rec.windows, DRAIN)
        .into_iter()
        .find(|w| w.key == key)
        .unwrap()
        .drain_at
}

fn summary_of(
    ws: &[WindowRecord],
) -> Vec<(
    &str,
    u32,
    WindowState,
    Option<chrono::DateTime<chrono::Utc>>,
)> {
    ws.iter()
        .map(|w| (w.key.as_str(), w.number, w.state, w.next_action_at))
        .collect()
}

/// GIVEN a request with offerings, its purchase begun by `token` with a 9000 USD debit and
/// the split's first block `a` recorded (the request stays `Purchasing`, due at the lease's
/// expiry). Returns the version (5).
async fn split_with_first_block_bought(store: &DynamoStore, id: &str, a: &Reservation) -> u64 {
    request_with_offerings(store, id, "ml").await;
    let whole = usd("9000.00").to_micros_ceil();
    let b = begin_purchase(
        id,
        3,
        OfferingsFound,
        "w1",
        t0(),
        Some(debit("ml", whole, MicroUsd(whole.0 * 10))),
    );
    let lease_expiry = b.lease.expires_at;
    assert_eq!(
        store.begin_purchase(b).await.unwrap(),
        BeginPurchaseOutcome::Acquired { version: 4 }
    );
    let mut first = record_reservation(id, "w1", a.clone(), t0() + Duration::minutes(1));
    first.to = Purchasing;
    first.next_action_at = Some(lease_expiry);
    assert_eq!(
        store.record_reservation(first).await.unwrap(),
        LeaseWriteOutcome::Applied { version: 5 }
    );
    5
}

#[tokio::test]
async fn a_splits_replacement_block_is_numbered_after_the_kept_block_and_the_request_is_due_at_the_kept_blocks_start()
 {
    // GIVEN a split whose first block A was bought and kept, the rest of the purchase
    // released, and a new search that found a replacement block B starting after A
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "split-windows";
    let (a, b) = (
        block("cr-a", "4000.00", 3, 2),
        block("cr-b", "5000.00", 7, 2),
    );
    split_with_first_block_bought(&store, id, &a).await;
    let after_a = get(&store, id).await;
    assert_eq!(
        summary_of(&after_a.windows),
        vec![("cr-a#0", 0, WindowState::Pending, Some(a.start()))]
    );
    assert_eq!(
        store
            .release_unbought(release_unbought(id, "w1", t0() + Duration::minutes(2)))
            .await
            .unwrap(),
        LeaseWriteOutcome::Applied { version: 6 }
    );
    let mut found = transition(id, 6, Searching, OfferingsFound, "found-again");
    found.at = t0() + Duration::minutes(30);
    assert_eq!(
        store.transition(found).await.unwrap(),
        WriteOutcome::Applied { version: 7 }
    );
    let fee = usd("5000.00").to_micros_ceil();
    let again = begin_purchase(
        id,
        7,
        OfferingsFound,
        "w2",
        t0() + Duration::hours(1),
        Some(debit("ml", fee, MicroUsd(fee.0 * 10))),
    );
    assert_eq!(
        store.begin_purchase(again).await.unwrap(),
        BeginPurchaseOutcome::Acquired { version: 8 }
    );
    // (the purchase keeps A's window, due at A's start while B is bought: issue 51's store
    // campaign's mutants of the version the windows are read at wrote them away)
    let buying = get(&store, id).await;
    assert_eq!(
        summary_of(&buying.windows),
        vec![("cr-a#0", 0, WindowState::Pending, Some(a.start()))]
    );

    // WHEN B is recorded, to Reserved, with its payment check as the transition's next
    // action (Reserved keeps one while payments are checked: ARCHITECTURE 8.5)
    let mut second = record_reservation(id, "w2", b.clone(), t0() + Duration::hours(1));
    second.next_action_at = None;
    let outcome = store.record_reservation(second).await.unwrap();

    // THEN both windows are pending, numbered in the order bought, and the request is due
    // at A's start, the earlier of the two
    assert_eq!(outcome, LeaseWriteOutcome::Applied { version: 9 });
    let rec = get(&store, id).await;
    assert_eq!(rec.status, Reserved);
    assert_eq!(
        summary_of(&rec.windows),
        vec![
            ("cr-a#0", 0, WindowState::Pending, Some(a.start())),
            ("cr-b#0", 1, WindowState::Pending, Some(b.start())),
        ]
    );
    assert_eq!(rec.next_action_at, None, "no payment check was asked for");
    assert_eq!(rec.next_step_at(), Some(a.start()));
    assert!(
        rec.notice_due(rec.updated_at),
        "its lead-time notices are due at once"
    );
    assert_eq!((rec.lease, rec.open_debit), (None, None));
    assert_eq!(rec.spent, usd("9000.00").to_micros_ceil());
    let just_before = store
        .due(&[Reserved], a.start() - Duration::seconds(1))
        .await
        .unwrap();
    // (due before its start only for its lead-time notices, which cleanup sends)
    assert!(
        just_before
            .iter()
            .all(|d| !d.window_due(a.start() - Duration::seconds(1))),
        "{just_before:?}"
    );
    assert_eq!(
        acting_keys(store.due(&[Reserved], a.start()).await.unwrap()),
        vec![(request_id(id), Reserved, Some(a.start()))]
    );
}

/// A split bought across an upgrade (issue 51's store campaign: with the request's other
/// reservations left out of what `record_reservation` numbers, a first block recorded before
/// windows existed got no window record, and the request was not due at its start).
#[tokio::test]
async fn a_block_recorded_beside_one_from_before_windows_records_both_windows_in_start_order() {
    // GIVEN a split whose first block A was recorded by a version that kept no windows, the
    // purchase of the rest under way
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "split-before-windows";
    let (a, b) = (
        block("cr-a", "4000.00", 3, 2),
        block("cr-b", "5000.00", 7, 2),
    );
    split_with_first_block_bought(&store, id, &a).await;
    table
        .client
        .update_item()
        .table_name(&table.name)
        .key("pk", AttributeValue::S(format!("REQ#{id}")))
        .key("sk", AttributeValue::S("META".into()))
        .update_expression("REMOVE windows, own_next_action_at")
        .send()
        .await
        .unwrap();
    assert_eq!(get(&store, id).await.windows, vec![]);

    // WHEN its second block B is recorded, to Reserved
    let mut second = record_reservation(id, "w1", b.clone(), t0() + Duration::minutes(3));
    second.next_action_at = None;
    second.caused_by = Cause::new("recorded-cr-b");
    assert_eq!(
        store.record_reservation(second).await.unwrap(),
        LeaseWriteOutcome::Applied { version: 6 }
    );

    // THEN both windows are recorded, numbered in start order, and the request is due at
    // A's start
    let rec = get(&store, id).await;
    assert_eq!(
        summary_of(&rec.windows),
        vec![
            ("cr-a#0", 0, WindowState::Pending, Some(a.start())),
            ("cr-b#0", 1, WindowState::Pending, Some(b.start())),
        ]
    );
    assert_eq!(rec.next_step_at(), Some(a.start()));
    // (and due at once besides, for its windows' lead-time notices, never looked at yet)
    assert!(rec.notice_due(rec.updated_at));
}

/// A reservation recorded while another writer moves the request (issue 51's store campaign:
/// with every failed write taken for a duplicate event, a bought block went unrecorded).
#[tokio::test]
async fn a_reservation_recorded_while_another_writer_moves_the_request_is_written_again() {
    // GIVEN a split whose first block A is recorded, the purchase of the rest under way
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "recorded-in-a-race";
    let (a, b) = (
        block("cr-a", "4000.00", 3, 2),
        block("cr-b", "5000.00", 7, 2),
    );
    split_with_first_block_bought(&store, id, &a).await;
    // AND a cancellation kept by another worker between the recording's read and its write
    let other = table.store();
    let racing = table.store_with(integration_tests::recorder::interleaved(
        "TransactWriteItems",
        capacity_pilot::aws::wiring::https_client(),
        async move {
            let kept = other
                .keep_cancellation(cancellation_kept(id, 5, "c-race"))
                .await
                .unwrap();
            assert_eq!(kept, WriteOutcome::Applied { version: 6 });
        },
    ));

    // WHEN B is recorded
    let mut second = record_reservation(id, "w1", b.clone(), t0() + Duration::minutes(3));
    second.caused_by = Cause::new("recorded-cr-b");
    let outcome = racing.record_reservation(second).await.unwrap();

    // THEN it is written again over the version the other worker left, and B is held
    assert_eq!(outcome, LeaseWriteOutcome::Applied { version: 7 });
    let held = store.reservations(&request_id(id)).await.unwrap();
    assert_eq!(
        held.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["cr-a", "cr-b"]
    );
    let rec = get(&store, id).await;
    assert_eq!(rec.status, Reserved);
    assert!(
        rec.cancel.is_some(),
        "the other writer's cancellation stays"
    );
}

/// The same recording delivered twice between a split's segments, its lease still held
/// (issue 51's store campaign: read as a conflict, it was written again until the retries
/// ran out, an error where the answer is a duplicate).
#[tokio::test]
async fn a_split_segment_recorded_twice_by_one_event_is_a_duplicate_the_second_time() {
    // GIVEN a split whose first block A was recorded, the request still buying
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "segment-twice";
    let a = block("cr-a", "4000.00", 3, 2);
    split_with_first_block_bought(&store, id, &a).await;
    // WHEN the same recording comes again
    let mut again = record_reservation(id, "w1", a.clone(), t0() + Duration::minutes(1));
    again.to = Purchasing;
    // THEN it is a duplicate, and nothing moved
    assert_eq!(
        store.record_reservation(again).await.unwrap(),
        LeaseWriteOutcome::DuplicateEvent
    );
    assert_eq!(get(&store, id).await.version, 5);
}

/// GIVEN `id` buying under lease "w" (version 4) with a $2,500 debit of team ops. Returns
/// the debit.
async fn buying(store: &DynamoStore, id: &str) -> MicroUsd {
    request_with_offerings(store, id, "ops").await;
    let amount = usd("2500").to_micros_ceil();
    let b = begin_purchase(
        id,
        3,
        OfferingsFound,
        "w",
        t0(),
        Some(debit("ops", amount, MicroUsd(amount.0 * 10))),
    );
    assert_eq!(
        store.begin_purchase(b).await.unwrap(),
        BeginPurchaseOutcome::Acquired { version: 4 }
    );
    amount
}

/// A cancellation kept between a release's read and its write (issue 51's store campaign:
/// with every failed write taken for a duplicate event, the release answered "duplicate"
/// and the cancellation was neither applied nor the debit returned).
#[tokio::test]
async fn a_release_meeting_a_cancellation_kept_after_its_read_leaves_it_to_be_applied() {
    // GIVEN a purchase under way, and a cancellation kept by another worker between the
    // release's read and its write
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "release-in-a-race";
    let amount = buying(&store, id).await;
    let other = table.store();
    let racing = table.store_with(integration_tests::recorder::interleaved(
        "TransactWriteItems",
        capacity_pilot::aws::wiring::https_client(),
        async move {
            let kept = other
                .keep_cancellation(cancellation_kept(id, 4, "c-race"))
                .await
                .unwrap();
            assert_eq!(kept, WriteOutcome::Applied { version: 5 });
        },
    ));

    // WHEN the holder releases the unbought debit to search again
    let outcome = racing
        .release_unbought(release_unbought(id, "w", t0() + Duration::minutes(2)))
        .await
        .unwrap();

    // THEN it reads again and finds the cancellation, to apply, not pass over (§8.3): the
    // request still buying, its debit still open
    assert_eq!(outcome, LeaseWriteOutcome::CancelKept);
    let rec = get(&store, id).await;
    assert_eq!((rec.status, rec.version), (Purchasing, 5));
    assert_eq!(rec.open_debit, Some(amount));
    assert_eq!(ledger_at_t0(&store, "ops").await, amount);
}

/// A ledger holding less than the open debit a release returns is corrupt, and said so
/// (issue 51's store campaign: read as a conflict, the release was tried until its retries
/// ran out and reported as contention, which is retried, not looked into).
#[tokio::test]
async fn a_release_finding_its_ledger_short_of_the_open_debit_reports_a_corrupt_item() {
    // GIVEN a purchase under way whose team ledger was since cut below its debit
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "release-short-ledger";
    buying(&store, id).await;
    table
        .client
        .update_item()
        .table_name(&table.name)
        .key(
            "pk",
            AttributeValue::S(format!("BUDGET#ops#{}", BudgetMonth::of(t0()).0)),
        )
        .key("sk", AttributeValue::S("LEDGER".into()))
        .update_expression("SET spent_micros = :one")
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .send()
        .await
        .unwrap();

    // WHEN the holder releases the unbought debit
    let err = store
        .release_unbought(release_unbought(id, "w", t0() + Duration::minutes(2)))
        .await
        .unwrap_err();

    // THEN the store says the ledger is corrupt, a permanent error, and nothing moved
    assert!(
        matches!(&err, PortError::Permanent { code, .. } if code == "CorruptItem"),
        "{err:?}"
    );
    assert_eq!(get(&store, id).await.status, Purchasing);
}

#[tokio::test]
async fn a_window_update_while_searching_or_purchasing_changes_only_the_windows_version_and_reason()
{
    // GIVEN a split's first block A bought while the purchase of the rest goes on
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "windows-aside";
    let a = block("cr-a", "4000.00", 3, 2);
    split_with_first_block_bought(&store, id, &a).await;
    let purchasing = get(&store, id).await;
    let lease_expiry = purchasing.lease.as_ref().unwrap().expires_at;

    // WHEN A's launch begins while Purchasing
    let u = window_update(
        &store,
        id,
        "cr-a#0",
        WindowState::Launching,
        t0() + Duration::minutes(5),
        "launch-a",
    )
    .await;
    let outcome = store.update_windows(u).await.unwrap();

    // THEN the status, lease, open debit and own next action (the lease's expiry) stay;
    // the request is due at the earliest of that and A's start
    assert_eq!(outcome, WriteOutcome::Applied { version: 6 });
    let rec = get(&store, id).await;
    let mut expected = purchasing.clone();
    expected.version = 6;
    expected.reason = "cr-a#0 launching".into();
    expected.updated_at = t0() + Duration::minutes(5);
    expected.windows = vec![WindowRecord {
        key: "cr-a#0".into(),
        number: 0,
        state: WindowState::Launching,
        next_action_at: Some(a.start()),
        updated_at: t0() + Duration::minutes(5),
        notices: None,
        relaunch: None,
    }];
    assert_eq!(rec, expected);
    assert_eq!(rec.next_action_at, Some(lease_expiry));
    assert_eq!(rec.next_step_at(), Some(lease_expiry.min(a.start())));
    assert_eq!(
        acting_keys(store.due(&[Purchasing], lease_expiry).await.unwrap()),
        vec![(request_id(id), Purchasing, Some(lease_expiry))]
    );

    // GIVEN the rest of the purchase released: Searching, next looking after A is over
    let next_search = a.end() + Duration::days(1);
    let mut rel = release_unbought(id, "w1", t0() + Duration::minutes(10));
    rel.next_action_at = Some(next_search);
    assert_eq!(
        store.release_unbought(rel).await.unwrap(),
        LeaseWriteOutcome::Applied { version: 7 }
    );
    let searching = get(&store, id).await;
    assert_eq!(
        summary_of(&searching.windows),
        vec![("cr-a#0", 0, WindowState::Launching, Some(a.start()))],
        "releasing the rest keeps the kept block's window"
    );

    // WHEN A's workload runs, while Searching
    let u = window_update(
        &store,
        id,
        "cr-a#0",
        WindowState::Running,
        a.start(),
        "run-a",
    )
    .await;
    let outcome = store.update_windows(u).await.unwrap();

    // THEN it stays Searching with its own next action, and is due at A's drain start,
    // before its next search
    assert_eq!(outcome, WriteOutcome::Applied { version: 8 });
    let drain = drain_at(&store, id, "cr-a#0").await;
    assert_eq!(drain, a.end() - Duration::minutes(60));
    let rec = get(&store, id).await;
    let mut expected = searching.clone();
    expected.version = 8;
    expected.reason = "cr-a#0 running".into();
    expected.updated_at = a.start();
    expected.windows = vec![WindowRecord {
        key: "cr-a#0".into(),
        number: 0,
        state: WindowState::Running,
        next_action_at: Some(drain),
        updated_at: a.start(),
        notices: None,
        relaunch: None,
    }];
    assert_eq!(rec, expected);
    assert_eq!(
        (
            rec.status,
            rec.next_action_at,
            rec.lease.as_ref(),
            rec.open_debit
        ),
        (Searching, Some(next_search), None, None)
    );
    assert_eq!(rec.next_step_at(), Some(drain));
    let just_before = store
        .due(&[Searching], drain - Duration::seconds(1))
        .await
        .unwrap();
    assert!(
        just_before
            .iter()
            .all(|d| !d.window_due(drain - Duration::seconds(1))
                && !d.own_action_due(drain - Duration::seconds(1))),
        "{just_before:?}"
    );
    assert_eq!(
        acting_keys(store.due(&[Searching], drain).await.unwrap()),
        vec![(request_id(id), Searching, Some(drain))]
    );
}

/// ARCHITECTURE §9.3: an end AWS moved is written with the windows that derive from it, in
/// one write: the reservation's new end and the window's new next action are read back
/// together, and a stale update writes neither.
#[tokio::test]
async fn a_window_update_writes_a_reservation_whose_end_moved_with_its_windows() {
    // GIVEN a request with one block A bought, its window running
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "windows-moved";
    let a = block("cr-a", "4000.00", 3, 2);
    request_with_offerings(&store, id, "ml").await;
    let fee = usd("4000.00").to_micros_ceil();
    store
        .begin_purchase(begin_purchase(
            id,
            3,
            OfferingsFound,
            "w",
            t0(),
            Some(debit("ml", fee, MicroUsd(fee.0 * 10))),
        ))
        .await
        .unwrap();
    store
        .record_reservation(record_reservation(id, "w", a.clone(), t0()))
        .await
        .unwrap();
    let run = window_update(&store, id, "cr-a#0", WindowState::Running, a.start(), "run").await;
    store.update_windows(run).await.unwrap();
    let rec = get(&store, id).await;
    let spent = rec.spent;

    // WHEN AWS reports A a day longer, and the update says so
    let held = store.reservations(&request_id(id)).await.unwrap();
    let mut seen = held[0].clone();
    seen.segments[0].end += Duration::days(1);
    let moved = window::ends_moved(
        &held,
        &rec.windows,
        std::slice::from_ref(&seen),
        DRAIN,
        window::Reopen::of(&rec),
        a.start(),
    );
    let mut u = WindowUpdate::of(
        &rec,
        moved.records.clone(),
        "the end moved",
        a.start() + Duration::hours(1),
        &Cause::new("moved"),
        vec![],
    );
    u.reservations = vec![seen.clone()];
    let stale = WindowUpdate {
        expected_version: rec.version - 1,
        caused_by: Cause::new("moved-stale"),
        ..u.clone()
    };
    assert_eq!(
        store.update_windows(stale).await.unwrap(),
        WriteOutcome::Conflict
    );
    assert_eq!(store.reservations(&request_id(id)).await.unwrap(), held);
    let outcome = store.update_windows(u).await.unwrap();

    // THEN the reservation is recorded with the new end, the window due at its new drain,
    // and nothing is spent for it
    assert_eq!(
        outcome,
        WriteOutcome::Applied {
            version: rec.version + 1
        }
    );
    let after = store.reservations(&request_id(id)).await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].end(), a.end() + Duration::days(1));
    assert_eq!(after[0].debit_month, held[0].debit_month);
    let rec = get(&store, id).await;
    assert_eq!(
        rec.windows[0].next_action_at,
        Some(drain_at(&store, id, "cr-a#0").await)
    );
    assert_eq!(
        drain_at(&store, id, "cr-a#0").await,
        a.end() + Duration::days(1) - Duration::minutes(60)
    );
    assert_eq!(rec.spent, spent);
}

/// ARCHITECTURE §9.3: an extension's lease is one write of the request's version that
/// records the extension on its reservation and debits its fee within the team's cap and the
/// request's; it is refused while purchases are paused, and its failure's refund gives the fee
/// back to the ledger it came from.
#[tokio::test]
async fn an_extensions_lease_records_it_with_its_debit_refused_while_paused_and_refunded() {
    use capacity_pilot::domain::extension::{Asked, Extension, ExtensionOffer, ExtensionState};
    use capacity_pilot::ports::Refund;
    // GIVEN a request with block A bought and running
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "extended";
    let a = block("cr-a", "4000.00", 3, 2);
    request_with_offerings(&store, id, "ml").await;
    let fee = usd("4000.00").to_micros_ceil();
    store
        .begin_purchase(begin_purchase(
            id,
            3,
            OfferingsFound,
            "w",
            t0(),
            Some(debit("ml", fee, MicroUsd(fee.0 * 10))),
        ))
        .await
        .unwrap();
    store
        .record_reservation(record_reservation(id, "w", a.clone(), t0()))
        .await
        .unwrap();
    let run = window_update(&store, id, "cr-a#0", WindowState::Running, a.start(), "run").await;
    store.update_windows(run).await.unwrap();
    let rec = get(&store, id).await;
    let at = a.start() + Duration::hours(1);
    // AND an extension of A by a day, leased
    let ext_fee = usd("1500.00");
    let mut held = store.reservations(&request_id(id)).await.unwrap();
    held[0].extensions.push(Extension {
        number: 1,
        asked: Asked::Requested {
            event_id: "x1".into(),
        },
        asked_at: at,
        offer: ExtensionOffer {
            offering_id: "cbe-1".into(),
            hours: 24,
            starts_at: a.end(),
            ends_at: a.end() + Duration::days(1),
            fee: ext_fee,
        },
        state: ExtensionState::Buying,
        reason: "buying".into(),
        buy_by: a.end() - Duration::hours(13),
        check_at: Some(at + Duration::minutes(5)),
        lease_token: Some("lease-1".into()),
        lease_until: Some(at + Duration::minutes(5)),
        called_at: None,
        doubt_since: Some(at),
        approval_key: None,
        approved_by: None,
        debited: ext_fee.to_micros_ceil(),
        debit_team: Some("ml".into()),
        debit_month: Some(BudgetMonth::of(t0()).0),
    });
    let lease = |rec: &RequestRecord, cause: &str| {
        let mut t = Transition::of(
            rec,
            rec.status,
            "extension leased",
            rec.next_action_at,
            at,
            &Cause::new(cause),
        );
        t.reservations = held.clone();
        t.debit = Some(debit("ml", ext_fee.to_micros_ceil(), MicroUsd(fee.0 * 10)));
        t.unpaused = true;
        t
    };

    // WHEN purchases are paused, the lease is refused and nothing moves
    assert_eq!(store.put_pause(ops_pause()).await.unwrap(), Ok(()));
    assert_eq!(
        store.transition(lease(&rec, "lease-paused")).await.unwrap(),
        WriteOutcome::Paused(ops_pause())
    );
    assert!(
        store.reservations(&request_id(id)).await.unwrap()[0]
            .extensions
            .is_empty()
    );
    assert_eq!(ledger_at_t0(&store, "ml").await, fee);

    // WHEN they resume, the lease records the extension and its debit together
    store.delete_pause().await.unwrap();
    assert!(matches!(
        store.transition(lease(&rec, "lease")).await.unwrap(),
        WriteOutcome::Applied { .. }
    ));
    let after = store.reservations(&request_id(id)).await.unwrap();
    assert_eq!(after[0].extensions, held[0].extensions);
    // AND the reservation is due a look at the lease's expiry, in the index
    assert_eq!(after[0].payment_due(), Some(at + Duration::minutes(5)));
    assert_eq!(
        ledger_at_t0(&store, "ml").await,
        MicroUsd(fee.0 + ext_fee.to_micros_ceil().0)
    );
    let rec = get(&store, id).await;
    assert_eq!(rec.spent, MicroUsd(fee.0 + ext_fee.to_micros_ceil().0));
    // AND a stale lease (another worker read the same version) is refused
    let stale = Transition {
        expected_version: rec.version - 1,
        ..lease(&rec, "lease-again")
    };
    assert_eq!(
        store.transition(stale).await.unwrap(),
        WriteOutcome::Conflict
    );

    // WHEN it fails, its refund goes back with its record
    let mut failed = after.clone();
    failed[0].extensions[0].state = ExtensionState::Failed;
    failed[0].extensions[0].check_at = None;
    let mut t = Transition::of(
        &rec,
        rec.status,
        "extension failed",
        rec.next_action_at,
        at,
        &Cause::new("failed"),
    );
    t.reservations = failed.clone();
    t.refund = Some(Refund {
        month: BudgetMonth::of(t0()),
        amount: ext_fee.to_micros_ceil(),
        team: Some(team("ml")),
    });
    assert!(matches!(
        store.transition(t).await.unwrap(),
        WriteOutcome::Applied { .. }
    ));
    assert_eq!(ledger_at_t0(&store, "ml").await, fee);
    assert_eq!(get(&store, id).await.spent, fee);
    let last = store.reservations(&request_id(id)).await.unwrap();
    assert_eq!(last[0].extensions[0].state, ExtensionState::Failed);
    assert_eq!(last[0].payment_due(), None);
}

#[tokio::test]
async fn a_reserved_requests_windows_move_it_to_active_and_to_ended_and_stale_or_repeated_updates_are_refused()
 {
    use capacity_pilot::domain::status::RequestStatus::{Active, Draining, Ended};

    // GIVEN a request with one block A bought: Reserved
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "windows-follow";
    let a = block("cr-a", "4000.00", 3, 2);
    request_with_offerings(&store, id, "ml").await;
    let fee = usd("4000.00").to_micros_ceil();
    store
        .begin_purchase(begin_purchase(
            id,
            3,
            OfferingsFound,
            "w",
            t0(),
            Some(debit("ml", fee, MicroUsd(fee.0 * 10))),
        ))
        .await
        .unwrap();
    assert_eq!(
        store
            .record_reservation(record_reservation(id, "w", a.clone(), t0()))
            .await
            .unwrap(),
        LeaseWriteOutcome::Applied { version: 5 }
    );

    // WHEN its window runs
    let run = window_update(
        &store,
        id,
        "cr-a#0",
        WindowState::Running,
        a.start(),
        "run-a",
    )
    .await;
    let outcome = store.update_windows(run.clone()).await.unwrap();

    // THEN the request is Active, due at the window's drain start
    assert_eq!(outcome, WriteOutcome::Applied { version: 6 });
    let drain = drain_at(&store, id, "cr-a#0").await;
    let rec = get(&store, id).await;
    assert_eq!(
        (
            rec.status,
            rec.version,
            rec.next_action_at,
            rec.next_step_at()
        ),
        (Active, 6, None, Some(drain))
    );
    assert_eq!(
        acting_keys(store.due(&[Active], drain).await.unwrap()),
        vec![(request_id(id), Active, Some(drain))]
    );
    assert!(store.due(&[Reserved], drain).await.unwrap().is_empty());

    // AND the same update delivered again is a duplicate; one from a stale read (another
    // event) is a conflict; its cause reused on the current version is a duplicate
    assert_eq!(
        store.update_windows(run.clone()).await.unwrap(),
        WriteOutcome::DuplicateEvent
    );
    let mut stale = run.clone();
    stale.caused_by = Cause::new("run-a-elsewhere");
    assert_eq!(
        store.update_windows(stale).await.unwrap(),
        WriteOutcome::Conflict
    );
    let reused = window_update(&store, id, "cr-a#0", WindowState::Draining, drain, "run-a").await;
    assert_eq!(
        store.update_windows(reused).await.unwrap(),
        WriteOutcome::DuplicateEvent
    );
    let mut stale_draining = window_update(
        &store,
        id,
        "cr-a#0",
        WindowState::Draining,
        drain,
        "drain-stale",
    )
    .await;
    stale_draining.expected_version = 5;
    assert_eq!(
        store.update_windows(stale_draining).await.unwrap(),
        WriteOutcome::Conflict
    );
    let rec = get(&store, id).await;
    assert_eq!(
        (rec.status, rec.version, rec.windows[0].state),
        (Active, 6, WindowState::Running)
    );

    // WHEN it drains, then ends
    let drained = window_update(
        &store,
        id,
        "cr-a#0",
        WindowState::Draining,
        drain,
        "drain-a",
    )
    .await;
    assert_eq!(
        store.update_windows(drained).await.unwrap(),
        WriteOutcome::Applied { version: 7 }
    );
    let rec = get(&store, id).await;
    assert_eq!((rec.status, rec.next_step_at()), (Draining, Some(a.end())));
    let ended = window_update(&store, id, "cr-a#0", WindowState::Ended, a.end(), "end-a").await;
    assert_eq!(
        store.update_windows(ended).await.unwrap(),
        WriteOutcome::Applied { version: 8 }
    );

    // THEN it is Ended, due never, with the archival TTL a terminal transition at the same
    // moment sets, on the request and on its reservation
    let rec = get(&store, id).await;
    assert_eq!(
        (rec.status, rec.next_action_at, rec.due_at()),
        (Ended, None, None)
    );
    assert_eq!(
        summary_of(&rec.windows),
        vec![("cr-a#0", 0, WindowState::Ended, None)]
    );
    assert!(
        store
            .due(
                &[Reserved, Active, Draining, Ended],
                a.end() + Duration::days(30)
            )
            .await
            .unwrap()
            .is_empty()
    );
    store
        .create_request(new_request("cancelled-then", "ml", None))
        .await
        .unwrap();
    let mut cancel = transition("cancelled-then", 1, Accepted, Cancelled, "cancel-then");
    cancel.at = a.end();
    store.transition(cancel).await.unwrap();
    let terminal = raw_item(&table, "REQ#cancelled-then", "META").await;
    let meta = raw_item(&table, &format!("REQ#{id}"), "META").await;
    assert!(terminal.contains_key("expires_at"));
    assert_eq!(meta.get("expires_at"), terminal.get("expires_at"));
    assert!(!meta.contains_key("gsi_due"), "out of the work index");
    let res = raw_item(&table, &format!("REQ#{id}"), "RES#cr-a").await;
    assert_eq!(res.get("expires_at"), terminal.get("expires_at"));
}

#[tokio::test]
async fn a_request_written_before_windows_existed_reads_with_no_windows_and_its_own_next_action() {
    // GIVEN a request written without windows (never bought): created, then searching with
    // a next look
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "no-windows";
    let first_look = t0() + Duration::hours(1);
    let next_look = t0() + Duration::hours(2);
    store
        .create_request(new_request(id, "ml", Some(first_look)))
        .await
        .unwrap();
    let accepted = get(&store, id).await;
    let mut search = transition(id, 1, Accepted, Searching, "search");
    search.next_action_at = Some(next_look);
    store.transition(search).await.unwrap();

    // WHEN it is read
    let rec = get(&store, id).await;
    let meta = raw_item(&table, &format!("REQ#{id}"), "META").await;

    // THEN it has no windows, on disk or read, and is due at its own next action
    assert!(!meta.contains_key("windows"), "{meta:?}");
    assert!(!meta.contains_key("own_next_action_at"), "{meta:?}");
    assert_eq!(
        (accepted.windows.clone(), accepted.next_action_at),
        (vec![], Some(first_look))
    );
    assert_eq!(
        (rec.windows.clone(), rec.next_action_at, rec.due_at()),
        (vec![], Some(next_look), Some(next_look))
    );
    let just_before = store
        .due(&[Searching], next_look - Duration::seconds(1))
        .await
        .unwrap();
    assert!(just_before.is_empty(), "{just_before:?}");
    assert_eq!(
        due_keys(store.due(&[Searching], next_look).await.unwrap()),
        vec![(request_id(id), Searching, next_look)]
    );
}

#[test]
fn the_state_table_is_on_demand_with_ttl_point_in_time_recovery_and_encryption() {
    let p = integration_tests::table::state_table_properties().unwrap();

    assert_eq!(p["BillingMode"], "PAY_PER_REQUEST");
    assert_eq!(p["TimeToLiveSpecification"]["AttributeName"], "expires_at");
    assert_eq!(p["TimeToLiveSpecification"]["Enabled"], true);
    assert_eq!(
        p["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"],
        true
    );
    assert_eq!(p["SSESpecification"]["SSEEnabled"], true);
    let work = &p["GlobalSecondaryIndexes"][0];
    assert_eq!(work["IndexName"], "work");
    assert_eq!(work["KeySchema"][0]["AttributeName"], "gsi_part");
    assert_eq!(work["KeySchema"][1]["AttributeName"], "gsi_due");
    let projected = work["Projection"]["NonKeyAttributes"].as_array().unwrap();
    for a in ["status", "next_action_at", "windows", "slots", "event"] {
        assert!(projected.iter().any(|p| p == a), "{a} is not projected");
    }
}

#[tokio::test]
async fn a_tick_reads_what_is_due_what_runs_and_what_is_unsent_in_one_query() {
    use capacity_pilot::ports::WorkloadRecord;
    use integration_tests::recorder::Calls;
    // GIVEN a request due a minute ago, one due in an hour, one with nothing to do, one whose
    // block runs (two instances recorded), each with its acceptance unsent
    let table = TestTable::fresh().await.unwrap();
    let calls = Calls::default();
    let store = table.store_with(calls.http_client());
    let now = t0() + Duration::days(3) + Duration::hours(13);
    let mut due = new_request("due-now", "ml", Some(now - Duration::minutes(1)));
    due.outbox = vec![event("due-now:accepted")];
    store.create_request(due).await.unwrap();
    store
        .create_request(new_request(
            "due-later",
            "ml",
            Some(now + Duration::hours(1)),
        ))
        .await
        .unwrap();
    store
        .create_request(new_request("idle", "ml", None))
        .await
        .unwrap();
    let id = "runs";
    let a = running_block(&store, id, "cr-runs").await;
    let slot = |n: u32| WorkloadRecord {
        request_id: request_id(id),
        reservation_id: "cr-runs".into(),
        slot: n,
        generation: 0,
        resource_id: format!("i-{n}"),
        state: "running".into(),
        updated_at: a.start(),

        started_at: None,
        ended_at: None,
        ran: Vec::new(),
        relaunch: 0,
    };
    for n in 0..2 {
        store.put_workload(slot(n)).await.unwrap();
    }
    let before = calls.log().len();

    // WHEN a tick reads its work
    let agenda = store.agenda(now).await.unwrap();

    // THEN one Query answered it: the due request, the running one with its slots as
    // recorded, and every unsent item; nothing due later or idle
    let made = &calls.log()[before..];
    assert_eq!(made, [("dynamodb".to_string(), "Query".to_string())]);
    let mut due: Vec<&str> = agenda.due.iter().map(|d| d.request_id.as_str()).collect();
    due.sort_unstable();
    // ("runs" is due too, for cleanup only: its window's lead-time notices were never looked
    // at)
    assert_eq!(due, ["due-now", "runs"]);
    let runs = agenda
        .due
        .iter()
        .find(|d| d.request_id.as_str() == "runs")
        .unwrap();
    assert!(runs.notice_due(now) && !runs.window_due(now));
    assert_eq!(agenda.live.len(), 1);
    let live = &agenda.live[0];
    assert_eq!(
        (live.request_id.as_str(), live.status),
        (id, RequestStatus::Active)
    );
    assert_eq!(live.workloads, vec![slot(0), slot(1)]);
    assert!(live.windows.iter().any(|w| w.state == WindowState::Running));
    let unsent: Vec<&str> = agenda
        .outbox
        .iter()
        .map(|o| o.event.event_key.as_str())
        .collect();
    assert_eq!(
        unsent,
        [
            "due-later-accepted",
            "due-now:accepted",
            "idle-accepted",
            "runs-accepted"
        ]
    );
    assert_eq!(
        agenda.status_of(&request_id(id)),
        Some(RequestStatus::Active)
    );
    assert_eq!(agenda.status_of(&request_id("due-later")), None);

    // ... and once its drain begins the request stays in every tick's read until it ends,
    // and leaves it then
    let drain = drain_at(&store, id, "cr-runs#0").await;
    let stop = window_update(
        &store,
        id,
        "cr-runs#0",
        WindowState::Draining,
        drain,
        "drain",
    )
    .await;
    store.update_windows(stop).await.unwrap();
    let later = store.agenda(drain + Duration::minutes(1)).await.unwrap();
    assert_eq!(later.live.len(), 1, "a draining window may still run");
    let end = a.end() + Duration::minutes(1);
    let ended = window_update(&store, id, "cr-runs#0", WindowState::Ended, end, "end").await;
    store.update_windows(ended).await.unwrap();
    let after = store.agenda(end).await.unwrap();
    assert!(after.live.is_empty(), "{after:?}");
    assert!(after.due.iter().all(|d| d.request_id.as_str() != id));
}

#[tokio::test]
async fn every_state_change_leaves_a_history_item_read_back_in_order_and_archived_with_the_request()
{
    // GIVEN a request accepted, searched, found offerings, bought and a window run
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "hist-1";
    let a = running_block(&store, id, "cr-hist").await;
    // ... and a stale write refused (it must leave no history)
    let stale = transition(id, 2, Accepted, Searching, "stale");
    assert_eq!(
        store.transition(stale).await.unwrap(),
        WriteOutcome::Conflict
    );

    // WHEN its history is read back
    let h = store.history(&request_id(id)).await.unwrap();

    // THEN each committed change is there once, oldest first, with from, to, reason, cause
    let steps: Vec<(u64, Option<RequestStatus>, RequestStatus)> =
        h.iter().map(|e| (e.version, e.from, e.to)).collect();
    assert_eq!(
        steps,
        vec![
            (1, None, Accepted),
            (2, Some(Accepted), Searching),
            (3, Some(Searching), OfferingsFound),
            (4, Some(OfferingsFound), Purchasing),
            (5, Some(Purchasing), Reserved),
            (6, Some(Reserved), RequestStatus::Active),
        ]
    );
    let last = h.last().unwrap();
    assert_eq!(last.cause, "run");
    assert_eq!(last.reason, "cr-hist#0 running");
    assert_eq!(last.at, a.start());
    assert!(
        h.iter()
            .all(|e| !e.reason.is_empty() && !e.cause.is_empty())
    );

    // ... and when the request ends, its history is archived with it
    let end = a.end() + Duration::minutes(1);
    let ended = window_update(&store, id, "cr-hist#0", WindowState::Ended, end, "end").await;
    store.update_windows(ended).await.unwrap();
    assert_eq!(status_of(&store, id).await, Ended);
    let h = store.history(&request_id(id)).await.unwrap();
    assert_eq!(
        h.last().map(|e| (e.from, e.to)),
        Some((Some(RequestStatus::Active), Ended))
    );
    for e in &h {
        let item = raw_item(
            &table,
            &format!("REQ#{id}"),
            &format!("HIST#{:010}", e.version),
        )
        .await;
        assert!(
            item.contains_key("expires_at"),
            "history {} is not archived",
            e.version
        );
    }
}

#[tokio::test]
async fn a_failed_payment_returns_the_kept_debit_to_its_month_once_and_records_the_state() {
    use capacity_pilot::domain::reservation::ReservationState;
    use capacity_pilot::ports::Refund;
    // GIVEN two requests of a team bought and kept, one reservation's debit month stamped
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let cap = MicroUsd(10_000_000_000);
    let (kept, failed) = (
        usd("100.5").to_micros_ceil(),
        usd("2500.000001").to_micros_ceil(),
    );
    for (id, amount, fee) in [("kept", kept, "100.5"), ("failed", failed, "2500.000001")] {
        request_with_offerings(&store, id, "ops").await;
        store
            .begin_purchase(begin_purchase(
                id,
                3,
                OfferingsFound,
                id,
                t0(),
                Some(debit("ops", amount, cap)),
            ))
            .await
            .unwrap();
        let mut rec = record_reservation(id, id, reservation(&format!("cr-{id}"), fee), t0());
        rec.next_action_at = Some(t0() + Duration::minutes(10));
        store.record_reservation(rec).await.unwrap();
    }
    let month = BudgetMonth::of(t0());
    assert_eq!(
        store.budget_spent(&team("ops"), &month).await.unwrap(),
        MicroUsd(kept.0 + failed.0)
    );
    let held = store.reservations(&request_id("failed")).await.unwrap();
    assert_eq!(
        held[0].debit_month.as_deref(),
        Some(month.0.as_str()),
        "stamped when recorded"
    );
    // AND the Reserved request keeps its own next action (the payment check) beside its windows
    let r = get(&store, "failed").await;
    assert!(!r.windows.is_empty());
    assert_eq!(r.next_action_at, Some(t0() + Duration::minutes(10)));

    // WHEN its payment failed: the reservation recorded final, the debit returned
    let mut lost = held[0].clone();
    lost.state = ReservationState::PaymentFailed;
    let t = transition("failed", r.version, Reserved, Searching, "payment-failed")
        .with_reservations(
            vec![lost],
            Some(Refund {
                month: month.clone(),
                amount: failed,
                team: None,
            }),
        );
    assert_eq!(
        store.transition(t.clone()).await.unwrap(),
        WriteOutcome::Applied {
            version: r.version + 1
        }
    );

    // THEN only that debit left the team's ledger and the request's spend
    assert_eq!(
        store.budget_spent(&team("ops"), &month).await.unwrap(),
        kept
    );
    let r = get(&store, "failed").await;
    assert_eq!((r.status, r.spent), (Searching, MicroUsd(0)));
    let held = store.reservations(&request_id("failed")).await.unwrap();
    assert_eq!(held[0].state, ReservationState::PaymentFailed);
    // AND a replay returns nothing more
    assert_eq!(
        store.transition(t).await.unwrap(),
        WriteOutcome::DuplicateEvent
    );
    assert_eq!(
        store.budget_spent(&team("ops"), &month).await.unwrap(),
        kept
    );

    // AND a refund larger than what the request spent is refused, writing nothing
    let r2 = get(&store, "kept").await;
    let t = transition("kept", r2.version, Reserved, Searching, "too-much").with_reservations(
        vec![],
        Some(Refund {
            month: month.clone(),
            amount: MicroUsd(kept.0 + 1),
            team: None,
        }),
    );
    assert_eq!(store.transition(t).await.unwrap(), WriteOutcome::Conflict);
    assert_eq!(
        store.budget_spent(&team("ops"), &month).await.unwrap(),
        kept
    );
    assert_eq!(status_of(&store, "kept").await, Reserved);
}

#[tokio::test]
async fn the_doubt_recorded_with_the_lease_survives_a_takeover_and_ends_with_the_record() {
    use capacity_pilot::ports::Doubt;
    // GIVEN a purchase begun, recording what it is about to buy
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "d1", "ops").await;
    let doubt = Doubt {
        offering_ids: vec!["cb-1".into()],
        since: t0(),
    };
    let mut begin = begin_purchase(
        "d1",
        3,
        OfferingsFound,
        "w1",
        t0(),
        Some(debit("ops", MicroUsd(5), MicroUsd(100))),
    );
    begin.doubt = Some(doubt.clone());
    store.begin_purchase(begin).await.unwrap();
    assert_eq!(get(&store, "d1").await.doubt, Some(doubt.clone()));

    // WHEN a second worker takes the expired lease (recording no doubt of its own)
    let later = t0() + Duration::minutes(30);
    let takeover = begin_purchase("d1", 4, Purchasing, "w2", later, None);
    assert!(matches!(
        store.begin_purchase(takeover).await.unwrap(),
        BeginPurchaseOutcome::Acquired { .. }
    ));
    // THEN the first worker's doubt, and its time, stand
    assert_eq!(get(&store, "d1").await.doubt, Some(doubt));

    // AND recording the reservation ends it
    store
        .record_reservation(record_reservation(
            "d1",
            "w2",
            reservation("cr-d1", "0.000005"),
            later,
        ))
        .await
        .unwrap();
    let r = get(&store, "d1").await;
    assert_eq!((r.status, r.doubt), (Reserved, None));
}

#[tokio::test]
async fn a_held_run_estimate_is_settled_by_what_ran_exactly_once() {
    // Issue 15 item 4, against a real DynamoDB wire. GIVEN an on-demand run holding its
    // $96 estimate, its run recorded with the launch
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "od-settle";
    store
        .create_request(new_request(id, "web", None))
        .await
        .unwrap();
    let mut t = transition(id, 1, Accepted, TryingOnDemand, "try");
    t.debit = Some(debit(
        "web",
        usd("96").to_micros_ceil(),
        usd("1000").to_micros_ceil(),
    ));
    t.hold = true;
    store.transition(t).await.unwrap();
    let run = OnDemandRun {
        attempt: "on-demand".into(),
        held_at: t0(),
        started_at: Some(t0()),
        launch_generations: 0,
        claim: None,
        fall_back: None,
        approval: None,
    };
    let mut t = transition(id, 2, TryingOnDemand, RunningOnDemand, "run");
    t.run = Some(run.clone());
    store.transition(t).await.unwrap();
    let r = get(&store, id).await;
    assert_eq!(r.run.as_ref(), Some(&run));
    assert_eq!(r.open_debit, Some(usd("96").to_micros_ceil()));

    // WHEN the run ends having spent $12 of it, and the same write comes again (a duplicate
    // event), then a second settlement is attempted under the next version
    let settle = |version, event: &str| {
        let mut t = transition(id, version, RunningOnDemand, Draining, event);
        t.settle = Some(Settle::Spend(usd("12").to_micros_ceil()));
        t
    };
    let first = store.transition(settle(3, "drain")).await.unwrap();
    let again = store.transition(settle(3, "drain")).await.unwrap();

    // THEN $12 stays spent, on the request and the ledger, and $84 went back once
    assert_eq!(first, WriteOutcome::Applied { version: 4 });
    assert_eq!(again, WriteOutcome::DuplicateEvent);
    let r = get(&store, id).await;
    assert_eq!(
        (r.status, r.spent, r.open_debit),
        (Draining, usd("12").to_micros_ceil(), None)
    );
    let mut end = transition(id, 4, Draining, Ended, "end");
    end.settle = Some(Settle::Spend(MicroUsd(0)));
    store.transition(end).await.unwrap();
    assert_eq!(get(&store, id).await.spent, usd("12").to_micros_ceil());
    assert_eq!(
        ledger_at_t0(&store, "web").await,
        usd("12").to_micros_ceil()
    );
}

#[tokio::test]
async fn a_search_round_is_kept_on_the_request_and_cleared_by_an_empty_one() {
    use capacity_pilot::search::{QueryOutcome, SearchRound};
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "round";
    store
        .create_request(new_request(id, "web", None))
        .await
        .unwrap();
    let mut round = SearchRound {
        started_at: Some(t0()),
        ..SearchRound::default()
    };
    round.outcomes.insert(
        "capacity-block/us-east-2/p5.48xlarge/4x/48h".into(),
        QueryOutcome::Refused {
            reason: "not supported for Capacity Blocks in 'us-east-2'".into(),
        },
    );
    round.outcomes.insert(
        "capacity-block/us-east-1/p5.48xlarge/4x/48h".into(),
        QueryOutcome::Failing {
            ticks: 2,
            error: "throttled".into(),
        },
    );
    let mut t = transition(id, 1, Accepted, Searching, "search-1");
    t.search = Some(round.clone());
    store.transition(t).await.unwrap();
    assert_eq!(get(&store, id).await.search, Some(round));

    let mut t = transition(id, 2, Searching, Searching, "search-2");
    t.search = Some(SearchRound::default());
    store.transition(t).await.unwrap();
    assert_eq!(get(&store, id).await.search, None);
}

#[tokio::test]
async fn the_search_allowance_is_one_bucket_per_region_shared_by_concurrent_takers() {
    // Issue 16 (ARCHITECTURE §8.8): the pacing port's production adapter. GIVEN a fresh
    // region, whose bucket holds 5 searches and refills 1 a minute
    use capacity_pilot::ports::Pacing;
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();

    // WHEN four invocations each want 3 at once
    let (a, b, c, d) = tokio::join!(
        store.take_searches("us-east-1", 3, t0()),
        store.take_searches("us-east-1", 3, t0()),
        store.take_searches("us-east-1", 3, t0()),
        store.take_searches("us-east-1", 3, t0()),
    );

    // THEN 5 are granted between them, never more; another region has its own bucket
    let granted: u32 = [a, b, c, d].into_iter().map(|g| g.unwrap_or(0)).sum();
    assert_eq!(granted, 5);
    assert_eq!(store.take_searches("us-west-2", 9, t0()).await.unwrap(), 5);
    // one a minute comes back
    let later = t0() + Duration::minutes(2);
    assert_eq!(store.take_searches("us-east-1", 9, later).await.unwrap(), 2);

    // WHEN the region answers with its rate limit
    store
        .back_off("us-east-1", later + Duration::minutes(5), later)
        .await
        .unwrap();

    // THEN nothing is granted until the back-off ends, then what refilled meanwhile
    let during = later + Duration::minutes(4);
    assert_eq!(
        store.take_searches("us-east-1", 9, during).await.unwrap(),
        0
    );
    let after = later + Duration::minutes(5);
    assert_eq!(store.take_searches("us-east-1", 9, after).await.unwrap(), 5);
}

#[tokio::test]
async fn a_run_reads_no_item_twice_without_writing_it_and_the_rule_is_seen_broken_outside_one() {
    use integration_tests::reads::Reads;
    use integration_tests::recorder::Calls;
    // GIVEN a request with two candidate plans, read through a client whose reads are checked
    let table = TestTable::fresh().await.unwrap();
    request_with_offerings(&table.store(), "rr-1", "ml").await;
    let (calls, reads) = (Calls::default(), Reads::default());
    let store = table.store_checked(calls.http_client(), reads.clone());
    let id = request_id("rr-1");

    // WHEN the store is read twice outside a run
    reads.begin();
    store.get_request(&id).await.unwrap();
    store.get_request(&id).await.unwrap();
    // THEN the recorder sees the request and its candidates read again
    let again: Vec<String> = reads.again().into_iter().map(|(_, k)| k.1).collect();
    assert_eq!(again, ["META", "OFFER#0000", "OFFER#0001"]);

    // WHEN a run reads it twice, writes it, and reads it again
    reads.begin();
    store.begin_run(chrono::Utc::now());
    let before = calls.log().len();
    let rec = store.get_request(&id).await.unwrap().unwrap();
    assert_eq!(store.get_request(&id).await.unwrap().unwrap(), rec);
    assert_eq!(
        calls.log().len(),
        before + 1,
        "the second read is the run's own"
    );
    let t = transition("rr-1", rec.version, OfferingsFound, Searching, "rr-search");
    assert_eq!(
        store.transition(t).await.unwrap(),
        WriteOutcome::Applied {
            version: rec.version + 1
        }
    );
    let after = store.get_request(&id).await.unwrap().unwrap();

    // THEN nothing was read twice: the write read no META again (the run had it), and the
    // read after it fetched META alone, its candidates unwritten and kept
    assert!(reads.again().is_empty(), "{:?}", reads.again());
    assert_eq!(after.status, Searching);
    assert_eq!(after.candidates, rec.candidates);
    let made: Vec<String> = calls.log()[before..]
        .iter()
        .map(|(_, o)| o.clone())
        .collect();
    assert_eq!(made, ["Query", "TransactWriteItems", "GetItem"]);

    // ... and when another writer moved the request meanwhile, the run's write is refused
    // by its condition and the next read is a fresh one, not what the run had kept
    let other = transition("rr-1", after.version, Searching, Failed, "rr-other");
    table.store().transition(other).await.unwrap();
    let late = transition("rr-1", after.version, Searching, OfferingsFound, "rr-late");
    assert_eq!(
        store.transition(late).await.unwrap(),
        WriteOutcome::Conflict
    );
    assert_eq!(
        store.get_request(&id).await.unwrap().unwrap().status,
        Failed
    );
    assert!(reads.again().is_empty(), "{:?}", reads.again());
}

#[tokio::test]
async fn candidates_a_run_kept_are_read_again_once_another_writer_replaced_them() {
    // GIVEN a run that read a request with two candidates
    let table = TestTable::fresh().await.unwrap();
    request_with_offerings(&table.store(), "rr-2", "ml").await;
    let store = table.store();
    let id = request_id("rr-2");
    store.begin_run(chrono::Utc::now());
    let rec = store.get_request(&id).await.unwrap().unwrap();
    assert_eq!(rec.candidates.len(), 2);

    // WHEN another writer searches again and finds one different plan meanwhile, and the
    // run's own write is refused for it
    let other = table.store();
    let t = transition("rr-2", rec.version, OfferingsFound, Searching, "rr2-search");
    other.transition(t).await.unwrap();
    let mut found = transition(
        "rr-2",
        rec.version + 1,
        Searching,
        OfferingsFound,
        "rr2-found",
    );
    found.candidates = Some(vec![plan("5000.00")]);
    other.transition(found).await.unwrap();
    let late = transition("rr-2", rec.version, OfferingsFound, Searching, "rr2-late");
    assert_eq!(
        store.transition(late).await.unwrap(),
        WriteOutcome::Conflict
    );

    // THEN the run's next read has the new candidates, not the ones it kept
    let now = store.get_request(&id).await.unwrap().unwrap();
    assert_eq!(now.version, rec.version + 2);
    assert_eq!(now.candidates, vec![plan("5000.00")]);
}

#[tokio::test]
async fn a_failed_requests_kept_window_outliving_the_archive_keeps_its_records_until_it_ends() {
    // GIVEN a request whose block runs, failed (a split's replacement refused) more than the
    // archive's 90 days ago as DynamoDB's clock sees it: its window outlives ARCHIVE_AFTER
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let a = running_block(&store, "kept", "cr-k").await;
    let long_ago = chrono::Utc::now() - Duration::days(100);
    let mut failed = transition("kept", 6, RequestStatus::Active, Failed, "fail");
    failed.at = long_ago;
    assert_eq!(
        store.transition(failed).await.unwrap(),
        WriteOutcome::Applied { version: 7 }
    );

    // THEN nothing of it is archived while its window lives: the request and its block read
    // back, and it is in every tick's read for its running window
    let meta = raw_item(&table, "REQ#kept", "META").await;
    assert!(!meta.contains_key("expires_at"), "{meta:?}");
    let rec = store
        .get_request(&request_id("kept"))
        .await
        .unwrap()
        .expect("a failed request with a running window is not archived");
    assert_eq!(rec.status, Failed);
    assert_eq!(store.reservations(&rec.request_id).await.unwrap().len(), 1);
    let agenda = store.agenda(chrono::Utc::now()).await.unwrap();
    assert!(agenda.live.iter().any(|l| l.request_id == rec.request_id));

    // WHEN its window drains and ends, long ago too
    let key = "cr-k#0";
    let mut drain =
        window_update(&store, "kept", key, WindowState::Draining, a.end(), "drain").await;
    drain.at = long_ago;
    store.update_windows(drain).await.unwrap();
    assert!(
        store
            .get_request(&request_id("kept"))
            .await
            .unwrap()
            .is_some()
    );
    let mut end = window_update(&store, "kept", key, WindowState::Ended, a.end(), "end").await;
    end.at = long_ago;
    assert!(matches!(
        store.update_windows(end).await.unwrap(),
        WriteOutcome::Applied { .. }
    ));

    // THEN it is archived with its children, and reads ignore it; it has left the work
    // index, so no later tick reads it (review N17)
    let meta = raw_item(&table, "REQ#kept", "META").await;
    assert!(
        !meta.contains_key("gsi_due") && !meta.contains_key("gsi_part"),
        "{meta:?}"
    );
    let agenda = store
        .agenda(chrono::Utc::now() + Duration::days(400))
        .await
        .unwrap();
    assert!(!agenda.live.iter().any(|l| l.request_id.as_str() == "kept"));
    assert!(!agenda.due.iter().any(|d| d.request_id.as_str() == "kept"));
    let res = raw_item(&table, "REQ#kept", "RES#cr-k").await;
    assert!(res.contains_key("expires_at"), "{res:?}");
    assert_eq!(store.get_request(&request_id("kept")).await.unwrap(), None);
    assert!(
        store
            .reservations(&request_id("kept"))
            .await
            .unwrap()
            .is_empty()
    );
}

// ---- the upgrade of a table written before windows outlived their request (issue 47) -----

/// Items the store wrote at c0d3150, the commit before ARCHITECTURE §9.1 (issue 47): `kept`
/// failed (Active to Failed at 2026-12-04 12:30) while its block `cr-k` (Dec 4 11:30 to Dec 6
/// 11:30) ran, so META and its children carry a TTL 90 days on; `plain` failed holding
/// nothing. Dumped (DynamoDB JSON, one Scan) by a test run at that commit: `running_block`,
/// then those two transitions, as this file's helpers still write them.
const PRE_47: &str = include_str!("../support/pre-47-store.json");

async fn load_items(table: &TestTable, dump: &str) {
    fn av(v: &serde_json::Value) -> AttributeValue {
        let (t, x) = v.as_object().unwrap().iter().next().unwrap();
        match t.as_str() {
            "S" => AttributeValue::S(x.as_str().unwrap().into()),
            "N" => AttributeValue::N(x.as_str().unwrap().into()),
            "BOOL" => AttributeValue::Bool(x.as_bool().unwrap()),
            "NULL" => AttributeValue::Null(true),
            "M" => AttributeValue::M(
                x.as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), av(v)))
                    .collect(),
            ),
            "L" => AttributeValue::L(x.as_array().unwrap().iter().map(av).collect()),
            other => panic!("{other}"),
        }
    }
    let items: Vec<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_str(dump).unwrap();
    for item in items {
        table
            .client
            .put_item()
            .table_name(&table.name)
            .set_item(Some(item.iter().map(|(k, v)| (k.clone(), av(v))).collect()))
            .send()
            .await
            .unwrap();
    }
}

/// The configuration the fixture functions run with.
fn fixture_config() -> capacity_pilot::config::Config {
    fixture_config_with(&[])
}

/// [`fixture_config`] with `extra` variables set as well.
fn fixture_config_with(extra: &[(&str, &str)]) -> capacity_pilot::config::Config {
    let mut env: Vec<(&str, String)> = vec![
        ("TABLE_NAME", "t".into()),
        ("EVENT_BUS_NAME", "capacity-pilot".into()),
        ("ALLOWED_REGIONS", "us-east-1".into()),
        ("ALLOWED_REQUEST_SOURCES", "com.example.ml-platform".into()),
        ("APPROVER_SOURCES", "com.example.approvals".into()),
        ("TEAM_BUDGETS_USD", r#"{"*": "100000"}"#.into()),
        (
            "SAGEMAKER_EXECUTION_ROLE_ARN",
            "arn:aws:iam::123456789012:role/sm".into(),
        ),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    capacity_pilot::config::Config::from_lookup(&move |k| {
        env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    })
    .unwrap()
}

type FixtureCleaner = cleanup_expired::handler::Cleaner<
    DynamoStore,
    capacity_pilot::fakes::FakeMarket,
    capacity_pilot::fakes::FakeWorkloads,
    capacity_pilot::fakes::RecordingEvents,
    capacity_pilot::fakes::ManualClock,
>;

fn fixture_cleaner(
    store: &DynamoStore,
    workloads: &capacity_pilot::fakes::FakeWorkloads,
    events: &capacity_pilot::fakes::RecordingEvents,
    clock: &capacity_pilot::fakes::ManualClock,
) -> FixtureCleaner {
    let config = fixture_config();
    cleanup_expired::handler::Cleaner {
        store: store.clone(),
        market: capacity_pilot::fakes::FakeMarket::new(),
        workloads: workloads.clone(),
        events: events.clone(),
        clock: clock.clone(),
        config: std::sync::Arc::new(config),
        planted: Default::default(),
    }
}

fn schedule(
    id: &str,
) -> aws_lambda_events::event::eventbridge::EventBridgeEvent<serde_json::Value> {
    serde_json::from_value(serde_json::json!({
        "version": "0", "id": id, "detail-type": "Scheduled Event", "source": "aws.events",
        "account": "123456789012", "time": "2026-12-01T09:00:00Z", "region": "us-east-1",
        "resources": [], "detail": {}
    }))
    .unwrap()
}

fn has_ttl(item: &std::collections::HashMap<String, AttributeValue>) -> bool {
    item.contains_key("expires_at")
}

#[tokio::test]
async fn a_table_written_before_windows_outlived_their_request_is_upgraded_once_and_served() {
    // GIVEN the items the commit before wrote: `kept` failed while its block ran, with a TTL,
    // and in the `work` index at its drain start only (a Failed request was not live then)
    let table = TestTable::fresh().await.unwrap();
    load_items(&table, PRE_47).await;
    let meta = raw_item(&table, "REQ#kept", "META").await;
    assert!(
        has_ttl(&meta),
        "the fixture is what the old store wrote: {meta:?}"
    );
    let kept = request_id("kept");

    // THEN past that TTL, and before any upgrade, it is read as live (its window is not
    // ended), while `plain`, which held nothing, is gone
    let late = table.store();
    late.begin_run(t0() + Duration::days(120));
    let rec = late
        .get_request(&kept)
        .await
        .unwrap()
        .expect("read as live");
    assert_eq!(rec.status, Failed);
    assert_eq!(late.get_request(&request_id("plain")).await.unwrap(), None);

    // WHEN the first cleanup tick runs during the block, its instance running
    let store = table.store();
    let events = capacity_pilot::fakes::RecordingEvents::new();
    let workloads = capacity_pilot::fakes::FakeWorkloads::new();
    let tags = std::collections::BTreeMap::from([
        (
            capacity_pilot::domain::naming::MANAGED_TAG.to_string(),
            "true".to_string(),
        ),
        (
            capacity_pilot::domain::naming::DEPLOYMENT_TAG.to_string(),
            capacity_pilot::config::DEFAULT_DEPLOYMENT_ID.to_string(),
        ),
        (
            capacity_pilot::domain::naming::REQUEST_TAG.to_string(),
            "kept".to_string(),
        ),
    ]);
    workloads.add_instance(capacity_pilot::ports::InstanceInfo {
        instance_id: "i-kept".into(),
        region: "us-east-1".into(),
        availability_zone: "us-east-1a".into(),
        instance_type: "p5.48xlarge".into(),
        state: capacity_pilot::ports::InstanceState::Running,
        health: capacity_pilot::ports::InstanceHealth::Ok,
        reservation_id: Some("cr-k".into()),
        launched_at: None,
        tags,
        scheduled: Vec::new(),
    });
    let block_start =
        t0().date_naive().and_hms_opt(11, 30, 0).unwrap().and_utc() + Duration::days(3);
    let clock = capacity_pilot::fakes::ManualClock::new(block_start + Duration::hours(2));
    let out = fixture_cleaner(&store, &workloads, &events, &clock)
        .handle(schedule("tick-1"))
        .await
        .unwrap();

    // THEN the sweep, reading the instance's owner, upgrades it: the TTL is gone from META
    // and every child the old ending write archived (not from `plain`), it is in every
    // tick's read again, and its instance runs on
    assert!(
        out.decisions.iter().any(|d| d.action == "upgraded"),
        "{:?}",
        out.decisions
    );
    for sk in ["META", "RES#cr-k", "OFFER#0000", "HIST#0000000007"] {
        let item = raw_item(&table, "REQ#kept", sk).await;
        assert!(!has_ttl(&item), "{sk}: {item:?}");
    }
    // (a processed event's record keeps its own TTL: it is no part of what is served)
    assert!(has_ttl(&raw_item(&table, "REQ#kept", "EVENT#fail").await));
    assert!(has_ttl(&raw_item(&table, "REQ#plain", "META").await));
    // (asked directly, a request with no window left is not upgraded: it keeps its TTL)
    assert!(
        !store
            .unarchive(&request_id("plain"), clock.get())
            .await
            .unwrap()
    );
    assert!(has_ttl(&raw_item(&table, "REQ#plain", "META").await));
    assert!(
        store
            .agenda(clock.get())
            .await
            .unwrap()
            .live
            .iter()
            .any(|l| l.request_id == kept)
    );
    assert_eq!(
        workloads.instance("i-kept").unwrap().state,
        capacity_pilot::ports::InstanceState::Running
    );

    // AND it is upgraded once: the next tick (a new process's) finds nothing to upgrade, and
    // leaves a TTL put back by hand on a child
    table
        .client
        .update_item()
        .table_name(&table.name)
        .key("pk", AttributeValue::S("REQ#kept".into()))
        .key("sk", AttributeValue::S("RES#cr-k".into()))
        .update_expression("SET expires_at = :x")
        .expression_attribute_values(":x", AttributeValue::N("1804163400".into()))
        .send()
        .await
        .unwrap();
    clock.set(block_start + Duration::hours(3));
    let again = fixture_cleaner(&table.store(), &workloads, &events, &clock)
        .handle(schedule("tick-1b"))
        .await
        .unwrap();
    assert!(
        !again.decisions.iter().any(|d| d.action == "upgraded"),
        "{:?}",
        again.decisions
    );
    assert!(has_ttl(&raw_item(&table, "REQ#kept", "RES#cr-k").await));

    // WHEN the block's drain start comes, and then its end
    let rec = get(&store, "kept").await;
    let held = store.reservations(&kept).await.unwrap();
    let w = window::windows(&held, &rec.windows, DrainLead::of(&rec.request, 15))[0].clone();
    assert_eq!(w.state, WindowState::Running);
    clock.set(w.drain_at + Duration::minutes(1));
    fixture_cleaner(&store, &workloads, &events, &clock)
        .handle(schedule("tick-2"))
        .await
        .unwrap();
    // THEN it is drained on time, its instance stopped, its request still Failed
    let drained = events.published_of("Capacity Workload Drained");
    assert_eq!(drained.len(), 1, "{:?}", events.published());
    assert_eq!(drained[0].detail["late"], false);
    assert_ne!(
        workloads.instance("i-kept").unwrap().state,
        capacity_pilot::ports::InstanceState::Running
    );
    let rec = get(&store, "kept").await;
    assert_eq!(rec.status, Failed);
    assert_eq!(rec.windows[0].state, WindowState::Draining);
    clock.set(w.end() + Duration::minutes(1));
    fixture_cleaner(&store, &workloads, &events, &clock)
        .handle(schedule("tick-3"))
        .await
        .unwrap();
    // AND once its window has ended, it is archived by today's rule
    assert_eq!(
        events.published_of("Capacity Reservation Ended").len(),
        1,
        "{:?}",
        events.published()
    );
    assert!(has_ttl(&raw_item(&table, "REQ#kept", "META").await));
}

#[tokio::test]
async fn a_reservations_payment_check_is_in_the_work_index_in_any_status_until_it_is_settled() {
    use capacity_pilot::domain::reservation::ReservationState;
    use capacity_pilot::ports::PaymentDue;
    // GIVEN a bought block whose payment is pending, its next check 10 min on
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "pay";
    request_with_offerings(&store, id, "ops").await;
    store
        .begin_purchase(begin_purchase(id, 3, OfferingsFound, id, t0(), None))
        .await
        .unwrap();
    let check = t0() + Duration::minutes(10);
    let mut bought = reservation("cr-pay", "1000");
    bought.payment_check_at = Some(check);
    let mut rec = record_reservation(id, id, bought, t0());
    rec.next_action_at = Some(check);
    store.record_reservation(rec).await.unwrap();
    let due = PaymentDue {
        request_id: request_id(id),
        reservation_id: "cr-pay".into(),
        at: check,
    };
    // THEN the tick's one read shows it when due, not before
    assert_eq!(
        store.agenda(check).await.unwrap().payments,
        vec![due.clone()]
    );
    assert!(
        store
            .agenda(check - Duration::minutes(1))
            .await
            .unwrap()
            .payments
            .is_empty()
    );

    // WHEN the request fails for another reason, the block kept
    let r = get(&store, id).await;
    store
        .transition(transition(id, r.version, Reserved, Failed, "failed"))
        .await
        .unwrap();
    // THEN its payment is still due a read (before issue 48, only a Reserved request's was)
    assert_eq!(store.agenda(check).await.unwrap().payments, vec![due]);

    // WHEN a check records it scheduled, the status kept
    let r = get(&store, id).await;
    let mut paid = store.reservations(&request_id(id)).await.unwrap()[0].clone();
    paid.state = ReservationState::Scheduled;
    paid.payment_check_at = None;
    let t = transition(id, r.version, Failed, Failed, "paid").with_reservations(vec![paid], None);
    assert_eq!(
        store.transition(t).await.unwrap(),
        WriteOutcome::Applied {
            version: r.version + 1
        }
    );
    // THEN nothing is due for it any more, and the request is still Failed
    assert!(
        store
            .agenda(check + Duration::days(1))
            .await
            .unwrap()
            .payments
            .is_empty()
    );
    assert_eq!(status_of(&store, id).await, Failed);
}

/// GIVEN `id` buying under lease "a" (taken at t0) with a $1000 debit of team ops, its doubt
/// recorded for `offerings`; the fee debited.
async fn buying_in_doubt(store: &DynamoStore, id: &str, offerings: &[&str]) -> MicroUsd {
    request_with_offerings(store, id, "ops").await;
    let fee = usd("1000").to_micros_ceil();
    let mut begin = begin_purchase(
        id,
        3,
        OfferingsFound,
        "a",
        t0(),
        Some(debit("ops", fee, MicroUsd(10_000_000_000))),
    );
    begin.doubt = Some(capacity_pilot::ports::Doubt {
        offering_ids: offerings.iter().map(|o| o.to_string()).collect(),
        since: t0(),
    });
    store.begin_purchase(begin).await.unwrap();
    fee
}

#[tokio::test]
async fn a_purchase_call_is_recorded_under_the_lease_and_a_purchase_in_doubt_keeps_its_debit_unarchived()
 {
    use capacity_pilot::ports::{FailInDoubt, MarkPurchaseCall, PurchaseCall};
    use chrono::{DateTime, Utc};
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "doubt";
    let fee = buying_in_doubt(&store, id, &["cb-1", "cb-2"]).await;
    // THEN a new purchase's lease records that nothing was called
    assert_eq!(
        get(&store, id).await.purchase_call,
        Some(PurchaseCall::None)
    );

    let mark = |token: &str, offering: &str, at: DateTime<Utc>| MarkPurchaseCall {
        request_id: request_id(id),
        lease_token: token.into(),
        offering_ids: vec![offering.into()],
        reason: format!("calling for {offering}"),
        at,
        caused_by: Cause::new(format!("call-{token}-{offering}")),
    };
    // WHEN the holder records its calls
    let at1 = t0() + Duration::minutes(1);
    assert_eq!(
        store
            .mark_purchase_call(mark("a", "cb-1", at1))
            .await
            .unwrap(),
        LeaseWriteOutcome::Applied { version: 5 }
    );
    let at2 = t0() + Duration::minutes(2);
    store
        .mark_purchase_call(mark("a", "cb-2", at2))
        .await
        .unwrap();
    // THEN the marker holds every offering called and the latest call, each a version in the
    // history, the status unchanged
    let r = get(&store, id).await;
    assert_eq!(
        r.purchase_call,
        Some(PurchaseCall::Called {
            at: at2,
            offering_ids: vec!["cb-1".into(), "cb-2".into()],
        })
    );
    assert_eq!((r.status, r.version), (Purchasing, 6));
    let history = store.history(&request_id(id)).await.unwrap();
    assert_eq!(history.last().unwrap().reason, "calling for cb-2");
    // AND the same call's record redelivered is a duplicate, writing nothing
    assert_eq!(
        store
            .mark_purchase_call(mark("a", "cb-2", at2))
            .await
            .unwrap(),
        LeaseWriteOutcome::DuplicateEvent
    );
    assert_eq!(get(&store, id).await.version, 6);
    // AND at the lease's very expiry no call may be recorded
    let expiry = r.lease.as_ref().unwrap().expires_at;
    assert_eq!(
        store
            .mark_purchase_call(mark("a", "cb-3", expiry))
            .await
            .unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
    // AND another token, or the holder past its lease, records nothing
    assert_eq!(
        store
            .mark_purchase_call(mark("z", "cb-3", at2))
            .await
            .unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
    let late = t0() + Duration::minutes(21);
    assert_eq!(
        store
            .mark_purchase_call(mark("a", "cb-3", late))
            .await
            .unwrap(),
        LeaseWriteOutcome::LeaseLost
    );
    // AND a takeover that read the request before the calls is refused; one that read it
    // after keeps the marker
    assert_eq!(
        store
            .begin_purchase(begin_purchase(id, 4, Purchasing, "b", late, None))
            .await
            .unwrap(),
        BeginPurchaseOutcome::Conflict
    );
    store
        .begin_purchase(begin_purchase(id, 6, Purchasing, "b", late, None))
        .await
        .unwrap();
    assert!(matches!(
        get(&store, id).await.purchase_call,
        Some(PurchaseCall::Called { .. })
    ));

    // WHEN the takeover ends it in doubt
    let next = late + Duration::hours(1);
    let in_doubt = FailInDoubt {
        request_id: request_id(id),
        lease_token: "b".into(),
        to: Failed,
        reason: "in doubt".into(),
        next_action_at: Some(next),
        at: late,
        caused_by: Cause::new("in-doubt"),
        outbox: vec![],
    };
    let ended = store.fail_in_doubt(in_doubt.clone()).await.unwrap();
    assert_eq!(ended, LeaseWriteOutcome::Applied { version: 8 });
    // (the same ending redelivered is a duplicate)
    assert_eq!(
        store.fail_in_doubt(in_doubt).await.unwrap(),
        LeaseWriteOutcome::DuplicateEvent
    );
    // THEN it is Failed with the debit, doubt and marker kept, no lease and no TTL, and due
    // for its reconciliation
    let r = get(&store, id).await;
    assert_eq!(
        (r.status, r.open_debit, r.lease.clone()),
        (Failed, Some(fee), None)
    );
    assert!(r.in_doubt());
    assert!(r.purchase_call.is_some());
    assert!(!has_ttl(&raw_item(&table, "REQ#doubt", "META").await));
    let agenda = store.agenda(next).await.unwrap();
    assert!(
        agenda
            .due
            .iter()
            .any(|d| d.request_id.as_str() == id && d.own_action_due(next)),
        "{agenda:?}"
    );

    // WHEN the doubt is resolved with the fee kept
    let mut t = transition(id, r.version, Failed, Failed, "resolved");
    t.at = next;
    t.settle = Some(Settle::Spend(fee));
    t.resolve_doubt = true;
    store.transition(t).await.unwrap();
    // THEN the debit stays spent, the doubt and marker go, and the request is archived
    let r = get(&store, id).await;
    assert!(!r.in_doubt() && r.purchase_call.is_none() && r.open_debit.is_none());
    assert_eq!(r.spent, fee);
    assert_eq!(ledger_at_t0(&store, "ops").await, fee);
    assert!(has_ttl(&raw_item(&table, "REQ#doubt", "META").await));
}

/// Items the store wrote at d9d5950, the commit before the purchase call marker (issue 48,
/// ARCHITECTURE §9.1): `legacy` is Purchasing under the lease `old-worker` (taken at
/// 2026-12-01 09:00, expiring 09:15), its debit of $7974.40 open and its doubt recorded
/// (`cb-legacy`, since 09:00), with no `purchase_call` attribute. Dumped (DynamoDB JSON, one
/// Scan) by a test run at that commit's store (331552f writes the same items): this file's
/// helpers as they were, then `begin_purchase`.
const PRE_48: &str = include_str!("../support/pre-48-store.json");

fn fixture_purchaser(
    store: &DynamoStore,
    market: &capacity_pilot::fakes::FakeMarket,
    events: &capacity_pilot::fakes::RecordingEvents,
    clock: &capacity_pilot::fakes::ManualClock,
) -> purchase_capacity::handler::Purchaser<
    DynamoStore,
    capacity_pilot::fakes::FakeMarket,
    capacity_pilot::fakes::RecordingEvents,
    capacity_pilot::fakes::ManualClock,
    capacity_pilot::fakes::FakeWorkloads,
> {
    let config = fixture_config();
    purchase_capacity::handler::Purchaser {
        store: store.clone(),
        market: market.clone(),
        events: events.clone(),
        workloads: capacity_pilot::fakes::FakeWorkloads::new(),
        clock: clock.clone(),
        config: std::sync::Arc::new(config),
        ids: std::sync::Arc::new(capacity_pilot::aws::ids::RandomIds),
        sleep: capacity_pilot::ports::default_sleep(),
    }
}

#[tokio::test]
async fn a_purchase_written_before_the_call_marker_is_in_doubt_from_its_lease_under_the_new_takeover()
 {
    // GIVEN the items the commit before wrote: `legacy` Purchasing under an expired lease,
    // its debit open, no call marker
    let table = TestTable::fresh().await.unwrap();
    load_items(&table, PRE_48).await;
    let store = table.store();
    let legacy = get(&store, "legacy").await;
    assert_eq!(
        (legacy.status, legacy.purchase_call.clone()),
        (Purchasing, None)
    );
    let fee = usd("7974.40").to_micros_ceil();
    let month = BudgetMonth::of(t0());
    assert_eq!(store.budget_spent(&team("ml"), &month).await.unwrap(), fee);
    let market = capacity_pilot::fakes::FakeMarket::new();
    let events = capacity_pilot::fakes::RecordingEvents::new();
    let clock = capacity_pilot::fakes::ManualClock::new(t0() + Duration::minutes(20));

    // WHEN the new purchase function's tick takes it over, AWS listing nothing for it
    let out = fixture_purchaser(&store, &market, &events, &clock)
        .handle(schedule("tick-1"))
        .await
        .unwrap();

    // THEN, with no marker to say no call was made, it is in doubt from its lease, as
    // before: nothing is bought, the debit stays, and no marker is made up
    assert!(
        out.decisions.iter().any(|d| d.action == "in-doubt"),
        "{:?}",
        out.decisions
    );
    assert_eq!(market.purchase_count(), 0);
    let r = get(&store, "legacy").await;
    assert_eq!((r.status, r.purchase_call.clone()), (Purchasing, None));
    assert_eq!(r.open_debit, Some(fee));

    // WHEN the doubt window from its lease has passed and the next takeover comes
    clock.set(t0() + Duration::hours(1) + Duration::minutes(40));
    let out = fixture_purchaser(&store, &market, &events, &clock)
        .handle(schedule("tick-2"))
        .await
        .unwrap();

    // THEN reconciliation, still finding nothing, returns the debit and searches again
    assert_eq!(market.purchase_count(), 0);
    let r = get(&store, "legacy").await;
    assert_eq!(r.status, Searching, "{:?}", out.decisions);
    assert_eq!(r.open_debit, None);
    assert_eq!(
        store.budget_spent(&team("ml"), &month).await.unwrap(),
        MicroUsd(0)
    );
}

#[tokio::test]
async fn a_regions_detector_is_planted_once_claimed_once_per_run_and_due_in_the_work_index() {
    let table = TestTable::fresh().await.unwrap();
    let (a, b) = (table.store(), table.store());
    let next = t0() + Duration::hours(1);
    // planted once: a second planting finds it there
    assert!(a.claim_detector("us-east-1", None, next).await.unwrap());
    assert!(!b.claim_detector("us-east-1", None, next).await.unwrap());
    // due in the work index at its time, not before
    assert!(
        a.agenda(next - Duration::minutes(1))
            .await
            .unwrap()
            .detectors
            .is_empty()
    );
    let due = a.agenda(next).await.unwrap().detectors;
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].region.as_str(), due[0].at), ("us-east-1", next));
    // claimed by one of two runs that read it due
    let later = next + Duration::hours(1);
    assert!(
        a.claim_detector("us-east-1", Some(next), later)
            .await
            .unwrap()
    );
    assert!(
        !b.claim_detector("us-east-1", Some(next), later)
            .await
            .unwrap()
    );
    assert!(a.agenda(next).await.unwrap().detectors.is_empty());
    // regions apart
    assert!(b.claim_detector("us-west-2", None, next).await.unwrap());
}

/// The deployment id a function's cold start runs under (`DEPLOYMENT_ID`), with the id the
/// template gave before ids were pinned (`UNPINNED_DEPLOYMENT_ID`).
fn deployment(id: &str, unpinned: &str) -> capacity_pilot::config::Config {
    fixture_config_with(&[("DEPLOYMENT_ID", id), ("UNPINNED_DEPLOYMENT_ID", unpinned)])
}

/// The cold start's check (ARCHITECTURE §9.8): `Err` carries the refusal.
async fn cold_start_check(
    store: &DynamoStore,
    config: &capacity_pilot::config::Config,
) -> Result<(), capacity_pilot::lambda::DeploymentIdChanged> {
    capacity_pilot::lambda::check_deployment(store, config, t0())
        .await
        .map_err(|e| {
            e.downcast_ref::<capacity_pilot::lambda::DeploymentIdChanged>()
                .unwrap_or_else(|| panic!("not a DeploymentIdChanged: {e}"))
                .clone()
        })
}

const STACK_UUID: &str = "1c2fa620-982a-11e3-aff7-50e2416294e0";

#[tokio::test]
async fn a_table_written_before_ids_were_pinned_refuses_the_new_default_until_deployment_id_is_the_stack_name()
 {
    // GIVEN items an earlier commit wrote (no DEPLOYMENT#ID) under the stack name, the old
    // default id
    let table = TestTable::fresh().await.unwrap();
    load_items(&table, PRE_48).await;
    let store = table.store();

    // WHEN the upgraded stack's cold start runs with the new default, the stack id's UUID
    let refused = cold_start_check(&store, &deployment(STACK_UUID, "capacity-pilot-prod")).await;

    // THEN it is refused, naming both ids and the parameter, and the table is pinned to the
    // stack name
    let e = refused.unwrap_err();
    assert_eq!(
        (e.pinned.as_str(), e.configured.as_str()),
        ("capacity-pilot-prod", STACK_UUID)
    );
    let message = e.to_string();
    for part in [
        "DeploymentIdChanged",
        "\"capacity-pilot-prod\"",
        STACK_UUID,
        "DeploymentId parameter",
    ] {
        assert!(message.contains(part), "{part} missing from {message}");
    }
    let item = raw_item(&table, "DEPLOYMENT#ID", "DEPLOYMENT#ID").await;
    assert_eq!(
        item["deployment_id"],
        AttributeValue::S("capacity-pilot-prod".into())
    );
    // AND a second cold start under the new default is refused the same way
    assert!(
        cold_start_check(&store, &deployment(STACK_UUID, "capacity-pilot-prod"))
            .await
            .is_err()
    );

    // WHEN DeploymentId is set to the stack name
    let kept = cold_start_check(
        &table.store(),
        &deployment("capacity-pilot-prod", "capacity-pilot-prod"),
    )
    .await;

    // THEN it starts
    assert_eq!(kept, Ok(()));
}

#[tokio::test]
async fn a_new_table_is_pinned_to_its_first_deployment_id_and_refuses_another() {
    // GIVEN an empty table (a new stack): its id is the configured one, whatever the old
    // default would have been
    let table = TestTable::fresh().await.unwrap();
    let first = deployment(STACK_UUID, "capacity-pilot-prod");
    assert_eq!(cold_start_check(&table.store(), &first).await, Ok(()));
    assert_eq!(cold_start_check(&table.store(), &first).await, Ok(()));

    // WHEN a stack with another id (a replacement stack, a second region) starts on it
    let other = "5e0b8c10-0000-11f0-8000-0242ac120002";
    let refused = cold_start_check(&table.store(), &deployment(other, other)).await;

    // THEN it is refused: the table stays this deployment's
    let e = refused.unwrap_err();
    assert_eq!(
        (e.pinned.as_str(), e.configured.as_str()),
        (STACK_UUID, other)
    );
}

#[tokio::test]
async fn a_table_whose_requests_have_all_ended_is_pinned_to_the_configured_id() {
    // GIVEN an old table holding only an ended request (out of the work index: nothing it
    // bought or launched is live)
    let table = TestTable::fresh().await.unwrap();
    table
        .client
        .put_item()
        .table_name(&table.name)
        .item("pk", AttributeValue::S("REQ#ended".into()))
        .item("sk", AttributeValue::S("META".into()))
        .item("status", AttributeValue::S("Completed".into()))
        .send()
        .await
        .unwrap();

    // WHEN the upgraded stack starts with the new default
    let started = cold_start_check(
        &table.store(),
        &deployment(STACK_UUID, "capacity-pilot-prod"),
    )
    .await;

    // THEN it starts, and the table is pinned to it
    assert_eq!(started, Ok(()));
    let item = raw_item(&table, "DEPLOYMENT#ID", "DEPLOYMENT#ID").await;
    assert_eq!(item["deployment_id"], AttributeValue::S(STACK_UUID.into()));
}

#[tokio::test]
async fn two_first_cold_starts_at_once_pin_one_id_and_the_other_is_refused() {
    let table = TestTable::fresh().await.unwrap();
    let (a, b) = (table.store(), table.store());
    let (ca, cb) = (
        deployment("stack-a", "stack-a"),
        deployment("stack-b", "stack-b"),
    );
    let (ra, rb) = tokio::join!(cold_start_check(&a, &ca), cold_start_check(&b, &cb));
    let pinned =
        match raw_item(&table, "DEPLOYMENT#ID", "DEPLOYMENT#ID").await["deployment_id"].clone() {
            AttributeValue::S(id) => id,
            other => panic!("{other:?}"),
        };
    let (won, lost) = if pinned == "stack-a" {
        (ra, rb)
    } else {
        (rb, ra)
    };
    assert_eq!(won, Ok(()));
    assert_eq!(lost.unwrap_err().pinned, pinned);
}

#[tokio::test]
async fn a_purchase_ending_in_doubt_under_a_kept_cancellation_ends_cancelled_never_failed() {
    use capacity_pilot::ports::FailInDoubt;
    // GIVEN a purchase under lease "a" with its doubt recorded, and a cancellation kept on it
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let id = "doubt-kept";
    buying_in_doubt(&store, id, &["cb-1"]).await;
    let version = get(&store, id).await.version;
    let kept = store
        .keep_cancellation(cancellation_kept(id, version, "c1"))
        .await
        .unwrap();
    assert!(matches!(kept, WriteOutcome::Applied { .. }), "{kept:?}");
    let end = |to, event: &str| FailInDoubt {
        request_id: request_id(id),
        lease_token: "a".into(),
        to,
        reason: "in doubt".into(),
        next_action_at: Some(t0() + Duration::hours(1)),
        at: t0() + Duration::minutes(5),
        caused_by: Cause::new(event),
        outbox: vec![],
    };
    // WHEN the lease holder ends it in doubt as Failed, THEN the store says a cancellation is
    // kept, and writes nothing
    assert_eq!(
        store.fail_in_doubt(end(Failed, "e1")).await.unwrap(),
        LeaseWriteOutcome::CancelKept
    );
    assert_eq!(get(&store, id).await.status, Purchasing);
    // AND ended as Cancelled, it is applied
    assert!(matches!(
        store.fail_in_doubt(end(Cancelled, "e2")).await.unwrap(),
        LeaseWriteOutcome::Applied { .. }
    ));
    assert_eq!(get(&store, id).await.status, Cancelled);
}

// ---- workload names' claims (ARCHITECTURE 9.8) --------------------------------------------

fn claim_of(id: &str, read: Option<u64>, with: &[&str]) -> capacity_pilot::ports::ClaimWrite {
    capacity_pilot::ports::ClaimWrite {
        key: capacity_pilot::ports::ClaimKey::new("us-east-1", "endpoint", "LLM"),
        read,
        claimants: with
            .iter()
            .map(|c| capacity_pilot::ports::Claimant {
                request_id: request_id(c),
                from: t0(),
                to: t0() + Duration::days(7),
            })
            .chain(std::iter::once(capacity_pilot::ports::Claimant {
                request_id: request_id(id),
                from: t0(),
                to: t0() + Duration::days(7),
            }))
            .collect(),
        made_by: None,
    }
}

#[tokio::test]
async fn a_request_writes_its_claim_on_the_version_read_or_nothing_at_all() {
    // GIVEN a fresh table
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let key = claim_of("c-1", None, &[]).key;

    // WHEN c-1 is created claiming the name, read absent
    let mut first = new_request("c-1", "ml", None);
    first.claims = vec![claim_of("c-1", None, &[])];
    assert_eq!(
        store.create_request(first).await.unwrap(),
        CreateOutcome::Created { version: 1 }
    );
    // THEN the claim is at version 1 and lists it (under the lower-cased name)
    let claim = table.store().claim(&key).await.unwrap().unwrap();
    assert_eq!(key.name, "llm");
    assert_eq!(claim.version, 1);
    assert_eq!(claim.claimants, claim_of("c-1", None, &[]).claimants);

    // WHEN c-2 is created on the claim as it read it before c-1 (absent)
    let mut stale = new_request("c-2", "ml", None);
    stale.claims = vec![claim_of("c-2", None, &[])];
    // THEN nothing of c-2 is written: no request, no claimant, no outbox item
    assert_eq!(
        store.create_request(stale).await.unwrap(),
        CreateOutcome::ClaimChanged
    );
    let fresh = table.store();
    assert!(
        fresh
            .get_request(&request_id("c-2"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(fresh.claim(&key).await.unwrap().unwrap().version, 1);
    assert!(
        !fresh
            .unsent_outbox(100)
            .await
            .unwrap()
            .iter()
            .any(|o| o.event.event_key.starts_with("c-2"))
    );

    // WHEN c-2 reads it again (version 1) and is created beside c-1
    let mut again = new_request("c-2", "ml", None);
    again.claims = vec![claim_of("c-2", Some(1), &["c-1"])];
    assert_eq!(
        store.create_request(again).await.unwrap(),
        CreateOutcome::Created { version: 1 }
    );
    // THEN the claim is at version 2 listing both; a lone write on version 1 is refused
    let claim = table.store().claim(&key).await.unwrap().unwrap();
    assert_eq!(claim.version, 2);
    assert_eq!(claim.claimants.len(), 2);
    assert!(
        !store
            .write_claim(claim_of("c-3", Some(1), &[]))
            .await
            .unwrap()
    );
    assert!(
        store
            .write_claim(claim_of("c-3", Some(2), &["c-1", "c-2"]))
            .await
            .unwrap()
    );
    assert_eq!(table.store().claim(&key).await.unwrap().unwrap().version, 3);
    // AND a claim write to an absent claim refuses one that exists
    assert!(!store.write_claim(claim_of("c-4", None, &[])).await.unwrap());
}

#[tokio::test]
async fn live_requests_recorded_before_claims_are_claimed_once_at_a_cold_start() {
    use capacity_pilot::domain::request::WorkloadDetail;
    use capacity_pilot::workload::claims::{Claiming, prepare};
    // GIVEN a table as the commit before claims wrote it: u-1 (live) and u-2 (ended, no
    // window) naming endpoint llm, and an EC2 request, none claiming anything
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let endpoint = |id: &str| {
        let mut n = new_request(id, "ml", Some(t0()));
        n.request.instance_types = vec!["ml.p5.48xlarge".into()];
        n.request.workload = WorkloadDetail::InferenceEndpoint {
            model_name: "m".into(),
            endpoint_name: "llm".into(),
            variant_name: "primary".into(),
        };
        n
    };
    for n in [
        endpoint("u-1"),
        endpoint("u-2"),
        new_request("u-3", "ml", Some(t0())),
    ] {
        store.create_request(n).await.unwrap();
    }
    store
        .transition(transition("u-2", 1, Accepted, Cancelled, "cancel-u-2"))
        .await
        .unwrap();
    let key = capacity_pilot::ports::ClaimKey::new("us-east-1", "endpoint", "llm");
    assert!(store.claim(&key).await.unwrap().is_none());

    // WHEN the first cold start after the upgrade runs, then another two hours on
    let added = table.store().claim_live_requests(t0()).await.unwrap();
    let again = table
        .store()
        .claim_live_requests(t0() + Duration::hours(2))
        .await
        .unwrap();

    // THEN the live request claims its name (the ended one is not in the index), once
    assert_eq!((added, again), (1, 0));
    let claim = table.store().claim(&key).await.unwrap().unwrap();
    let ids: Vec<String> = claim
        .claimants
        .iter()
        .map(|c| c.request_id.to_string())
        .collect();
    assert_eq!(ids, ["u-1"]);
    // AND a new request naming it over the same interval is refused, naming u-1
    let n = endpoint("u-4");
    match prepare(&table.store(), &n.request, t0()).await.unwrap() {
        Claiming::Refused(e) => {
            assert_eq!(e.field, "workload.endpoint_name");
            assert!(e.message.contains("request u-1"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    // AND a cold start within the hour passes again, adding nothing listed already
    assert_eq!(
        table
            .store()
            .claim_live_requests(t0() + Duration::minutes(30))
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn a_refund_returns_a_debit_to_the_ledger_it_was_charged_to_old_key_or_new() {
    use capacity_pilot::domain::reservation::ReservationState;
    use capacity_pilot::ports::Refund;
    // GIVEN team "Ops" (mixed case): one request charged before §9.8 under its exact key
    // "Ops", one charged after under the lower-cased key "ops"
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    let cap = usd("100000").to_micros_ceil();
    let fee = usd("1000").to_micros_ceil();
    let month = BudgetMonth::of(t0());
    for (id, key) in [("old", "Ops"), ("new", "ops")] {
        request_with_offerings(&store, id, "Ops").await;
        store
            .begin_purchase(begin_purchase(
                id,
                3,
                OfferingsFound,
                id,
                t0(),
                Some(debit(key, fee, cap)),
            ))
            .await
            .unwrap();
        let rec = record_reservation(id, id, reservation(&format!("cr-{id}"), "1000"), t0());
        store.record_reservation(rec).await.unwrap();
    }
    let held = store.reservations(&request_id("new")).await.unwrap();
    assert_eq!(
        held[0].debit_team.as_deref(),
        Some("ops"),
        "stamped when recorded"
    );
    for key in ["Ops", "ops"] {
        assert_eq!(store.budget_spent(&team(key), &month).await.unwrap(), fee);
    }

    // WHEN both payments fail: the old reservation's record as written before (no ledger
    // team: the refund names none), the new one's naming its ledger
    for (id, refund_team) in [("old", None), ("new", Some(team("ops")))] {
        let r = get(&store, id).await;
        let mut lost = store.reservations(&request_id(id)).await.unwrap()[0].clone();
        lost.state = ReservationState::PaymentFailed;
        if refund_team.is_none() {
            lost.debit_team = None;
        }
        let t = transition(id, r.version, Reserved, Searching, &format!("failed-{id}"))
            .with_reservations(
                vec![lost],
                Some(Refund {
                    month: month.clone(),
                    amount: fee,
                    team: refund_team,
                }),
            );
        assert_eq!(
            store.transition(t).await.unwrap(),
            WriteOutcome::Applied {
                version: r.version + 1
            }
        );
    }

    // THEN each debit went back to its own ledger
    for key in ["Ops", "ops"] {
        assert_eq!(
            store.budget_spent(&team(key), &month).await.unwrap(),
            MicroUsd(0),
            "{key}"
        );
    }
}

fn ops_pause() -> capacity_pilot::ports::Pause {
    capacity_pilot::ports::Pause {
        by: "arn:aws:sts::123456789012:assumed-role/ops/dana".into(),
        reason: "budget review".into(),
        since: t0(),
    }
}

/// ARCHITECTURE §9.7: the lease's ConditionCheck, not what the worker read, decides.
#[tokio::test]
async fn a_pause_committed_between_a_purchases_read_and_its_lease_stops_the_lease_and_a_hold() {
    // GIVEN a request read at version 3 with a plan to buy, then purchases paused
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "r", "ml").await;
    let read = store.get_request(&request_id("r")).await.unwrap().unwrap();
    assert_eq!(store.put_pause(ops_pause()).await.unwrap(), Ok(()));

    // WHEN the worker takes the lease with the debit
    let amount = usd("7974.40").to_micros_ceil();
    let d = debit("ml", amount, MicroUsd(amount.0 * 10));
    let b = begin_purchase(
        "r",
        read.version,
        OfferingsFound,
        "w",
        t0(),
        Some(d.clone()),
    );
    // THEN it is refused, naming the pause, and nothing moved
    assert_eq!(
        store.begin_purchase(b.clone()).await.unwrap(),
        BeginPurchaseOutcome::Paused(ops_pause())
    );
    assert_eq!(status_of(&store, "r").await, OfferingsFound);
    assert_eq!(ledger_at_t0(&store, "ml").await, MicroUsd(0));

    // AND an on-demand hold is refused the same way
    store
        .create_request(new_request("o", "ml", None))
        .await
        .unwrap();
    store
        .transition(transition("o", 1, Accepted, TryingOnDemand, "try-o"))
        .await
        .unwrap();
    let mut hold = transition("o", 2, TryingOnDemand, TryingOnDemand, "hold-o");
    hold.debit = Some(d.clone());
    hold.hold = true;
    assert_eq!(
        store.transition(hold.clone()).await.unwrap(),
        WriteOutcome::Paused(ops_pause())
    );
    assert_eq!(ledger_at_t0(&store, "ml").await, MicroUsd(0));

    // AND a second pause does not replace the first
    let mut other = ops_pause();
    other.reason = "another".into();
    assert_eq!(store.put_pause(other).await.unwrap(), Err(ops_pause()));

    // WHEN purchases resume, the same lease is taken
    assert_eq!(store.delete_pause().await.unwrap(), Some(ops_pause()));
    assert_eq!(store.read_pause().await.unwrap(), None);
    assert!(matches!(
        store.begin_purchase(b).await.unwrap(),
        BeginPurchaseOutcome::Acquired { .. }
    ));
    assert_eq!(ledger_at_t0(&store, "ml").await, amount);
}

#[tokio::test]
async fn a_takeover_goes_on_under_a_pause() {
    // GIVEN a purchase under way whose worker died, then purchases paused
    let table = TestTable::fresh().await.unwrap();
    let store = table.store();
    request_with_offerings(&store, "r", "ml").await;
    let amount = usd("7974.40").to_micros_ceil();
    let d = debit("ml", amount, MicroUsd(amount.0 * 10));
    store
        .begin_purchase(begin_purchase("r", 3, OfferingsFound, "w1", t0(), Some(d)))
        .await
        .unwrap();
    store.put_pause(ops_pause()).await.unwrap().unwrap();
    // WHEN another worker takes the expired lease over
    let later = t0() + Duration::minutes(30);
    let takeover = begin_purchase("r", 4, Purchasing, "w2", later, None);
    // THEN it takes it: that purchase began before the pause
    assert!(matches!(
        store.begin_purchase(takeover).await.unwrap(),
        BeginPurchaseOutcome::Acquired { .. }
    ));
}

#[tokio::test]
async fn a_quiet_tick_under_a_pause_makes_one_read_which_shows_the_pause() {
    use integration_tests::recorder::Calls;
    // GIVEN nothing due, and purchases paused
    let table = TestTable::fresh().await.unwrap();
    let calls = Calls::default();
    let store = table.store_with(calls.http_client());
    store.put_pause(ops_pause()).await.unwrap().unwrap();
    let before = calls.log().len();
    // WHEN a tick reads its work
    let agenda = store.agenda(t0() + Duration::hours(1)).await.unwrap();
    // THEN one Query answered it, with the pause, and nothing due or unsent
    assert_eq!(
        &calls.log()[before..],
        [("dynamodb".to_string(), "Query".to_string())]
    );
    assert_eq!(agenda.pause, Some(ops_pause()));
    assert!(agenda.due.is_empty() && agenda.outbox.is_empty() && agenda.live.is_empty());
}
