//! The in-memory store against DynamoStore on moto (ARCHITECTURE §8.15): the same seeded
//! operation sequences run against both, and every outcome and every read must be equal.
//! The in-memory store may stand in for DynamoDB in the simulation only as far as this
//! shows them equal.

use capacity_pilot::domain::money::MicroUsd;
use capacity_pilot::domain::status::RequestStatus::{self, *};
use capacity_pilot::fakes::InMemoryStore;
use capacity_pilot::ports::{
    BudgetMonth, CancelNote, Cause, KeepCancellation, PortError, Store, WorkloadRecord,
};
use chrono::{DateTime, Duration, Utc};
use integration_tests::TestTable;
use integration_tests::fixtures::*;

/// SplitMix64: the sequences are the seed's, nothing else.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let out = capacity_pilot::ids::mix(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        out
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// A result with errors reduced to their code: the two stores word their messages apart.
fn coded<T>(r: Result<T, PortError>) -> Result<T, Option<String>> {
    r.map_err(|e| e.code().map(str::to_string))
}

const IDS: [&str; 8] = ["d-0", "d-1", "d-2", "d-3", "d-4", "d-5", "d-6", "d-7"];

/// What the sequences reached, so a generator that stopped reaching anything shows.
#[derive(Default, Debug)]
struct Reached(std::collections::BTreeMap<String, usize>);

impl Reached {
    fn saw<T: std::fmt::Debug>(&mut self, op: &str, outcome: &T) {
        let text = format!("{outcome:?}");
        let kind: String = match text.strip_prefix("Ok(") {
            Some("())") => "Ok".to_string(),
            Some(rest) => rest.chars().take_while(|c| c.is_alphanumeric()).collect(),
            None => text.chars().take_while(|c| c.is_alphanumeric()).collect(),
        };
        *self.0.entry(format!("{op}:{kind}")).or_default() += 1;
    }

    fn has(&self, key: &str) -> bool {
        self.0.get(key).is_some_and(|n| *n > 0)
    }
}

/// Plays `steps` seeded operations against both stores, comparing as it goes.
async fn play(seed: u64, steps: usize, reached: &mut Reached) {
    let table = TestTable::fresh().await.unwrap();
    let dynamo = table.store();
    let memory = InMemoryStore::new();
    let mut rng = Rng(seed);
    let mut now: DateTime<Utc> = t0();
    let mut last_cause: std::collections::BTreeMap<&str, String> = Default::default();
    for step in 0..steps {
        now += Duration::minutes(1 + rng.below(30) as i64);
        dynamo.begin_run(now);
        memory.begin_run(now);
        let id = IDS[rng.below(IDS.len())];
        let at = format!("seed {seed} step {step} ({id})");
        let (d, m) = (
            coded(dynamo.get_request(&request_id(id)).await),
            coded(memory.get_request(&request_id(id)).await),
        );
        assert_eq!(d, m, "{at}: the request reads apart");
        let current = d.unwrap();
        // A cause: a fresh one, or now and then the last one this request's writes used
        // (a duplicate delivery).
        let cause = match last_cause.get(id) {
            Some(c) if rng.chance(15) => c.clone(),
            _ => format!("c-{step}"),
        };
        last_cause.insert(id, cause.clone());
        let next = |rng: &mut Rng| {
            (!rng.chance(30)).then(|| now + Duration::minutes(rng.below(120) as i64 - 30))
        };
        // The operation, weighted by what the request is in, so purchases are reached.
        let roll = rng.below(100);
        let op = match current.as_ref().map(|r| r.status) {
            None => 0,
            Some(Purchasing) if roll < 45 => 4,
            Some(Purchasing) if roll < 75 => 40,
            Some(Purchasing) if roll < 85 => 3,
            Some(OfferingsFound | AwaitingApproval) if roll < 45 => 3,
            _ if roll < 8 => 0,
            _ if roll < 55 => 1,
            _ if roll < 70 => 5,
            _ if roll < 85 => 6,
            _ => 7,
        };
        match (op, &current) {
            (_, None) | (0, _) => {
                let mut n = new_request(id, "ml", next(&mut rng));
                n.at = now;
                n.caused_by = Cause::new(cause);
                let (d, m) = (
                    coded(dynamo.create_request(n.clone()).await),
                    coded(memory.create_request(n).await),
                );
                assert_eq!(d, m, "{at}: create");
                reached.saw("create", &d);
            }
            (1, Some(r)) if r.status != Purchasing => {
                // Towards a purchase half the time, else any step the life cycle allows
                // (and, from an end state, one it refuses).
                let allowed: Vec<RequestStatus> = r
                    .status
                    .successors()
                    .iter()
                    .copied()
                    .filter(|s| *s != Purchasing)
                    .collect();
                let to = if allowed.contains(&OfferingsFound) && rng.chance(50) {
                    OfferingsFound
                } else if allowed.is_empty() {
                    Searching
                } else {
                    allowed[rng.below(allowed.len())]
                };
                let version = if rng.chance(15) {
                    r.version.saturating_sub(1)
                } else {
                    r.version
                };
                let mut t = transition(id, version, r.status, to, &cause);
                t.at = now;
                t.next_action_at = next(&mut rng);
                t.reason = format!("step {step}: {} -> {to}", r.status);
                t.outbox = vec![event(&format!("{id}-{step}"))];
                if to == OfferingsFound {
                    t.candidates =
                        Some(vec![plan("4000.00"), plan("5000.00")][..1 + rng.below(2)].to_vec());
                }
                let (d, m) = (
                    coded(dynamo.transition(t.clone()).await),
                    coded(memory.transition(t).await),
                );
                assert_eq!(d, m, "{at}: transition {} -> {to}", r.status);
                reached.saw("transition", &d);
            }
            (3, Some(r)) if matches!(r.status, OfferingsFound | AwaitingApproval | Purchasing) => {
                let token = format!("w-{step}");
                let amount = MicroUsd(1_000_000_000 * (1 + rng.below(60) as i64));
                let cap = MicroUsd(1_000_000_000 * (20 + rng.below(100) as i64));
                let debit = (r.status != Purchasing).then(|| debit("ml", amount, cap));
                let mut b = begin_purchase(id, r.version, r.status, &token, now, debit);
                b.caused_by = Cause::new(cause);
                let (d, m) = (
                    coded(dynamo.begin_purchase(b.clone()).await),
                    coded(memory.begin_purchase(b).await),
                );
                assert_eq!(d, m, "{at}: begin purchase from {}", r.status);
                reached.saw("begin", &d);
            }
            (4 | 40, Some(r)) if r.status == Purchasing => {
                let token = match (&r.lease, rng.chance(20)) {
                    (Some(l), false) => l.token.clone(),
                    _ => "not-the-holder".to_string(),
                };
                if op == 4 {
                    let mut rr = record_reservation(
                        id,
                        &token,
                        reservation(&format!("cr-{step}"), "4000.00"),
                        now,
                    );
                    rr.caused_by = Cause::new(cause);
                    let (d, m) = (
                        coded(dynamo.record_reservation(rr.clone()).await),
                        coded(memory.record_reservation(rr).await),
                    );
                    assert_eq!(d, m, "{at}: record reservation");
                    reached.saw("record", &d);
                } else {
                    let mut u = release_unbought(id, &token, now);
                    u.caused_by = Cause::new(cause);
                    let (d, m) = (
                        coded(dynamo.release_unbought(u.clone()).await),
                        coded(memory.release_unbought(u).await),
                    );
                    assert_eq!(d, m, "{at}: release unbought");
                    reached.saw("release", &d);
                }
            }
            (5, Some(r)) => {
                let k = KeepCancellation {
                    request_id: request_id(id),
                    expected_version: r.version,
                    status: r.status,
                    note: rng.chance(70).then(|| CancelNote {
                        reason: "no longer needed".into(),
                        at: now,
                        event_id: cause.clone(),
                        found: None,
                    }),
                    reason: format!("step {step}: cancellation kept"),
                    next_action_at: next(&mut rng),
                    at: now,
                    caused_by: Cause::new(cause),
                    outbox: vec![],
                };
                let (d, m) = (
                    coded(dynamo.keep_cancellation(k.clone()).await),
                    coded(memory.keep_cancellation(k).await),
                );
                assert_eq!(d, m, "{at}: keep cancellation in {}", r.status);
                reached.saw("keep", &d);
            }
            (6, Some(_)) => {
                let w = WorkloadRecord {
                    request_id: request_id(id),
                    reservation_id: "cr-w".into(),
                    slot: rng.below(3) as u32,
                    generation: rng.below(2) as u32,
                    resource_id: format!("i-{step}"),
                    state: "running".into(),
                    updated_at: now,
                };
                let (d, m) = (
                    coded(dynamo.put_workload(w.clone()).await),
                    coded(memory.put_workload(w).await),
                );
                assert_eq!(d, m, "{at}: put workload");
                reached.saw("workload", &d);
            }
            _ => {
                let (d, m) = (
                    coded(dynamo.agenda(now).await),
                    coded(memory.agenda(now).await),
                );
                assert_eq!(d, m, "{at}: agenda");
            }
        }
        // Every read of the request agrees after the step.
        let rid = request_id(id);
        assert_eq!(
            coded(dynamo.get_request(&rid).await),
            coded(memory.get_request(&rid).await),
            "{at}: the request after the step"
        );
        assert_eq!(
            coded(dynamo.reservations(&rid).await),
            coded(memory.reservations(&rid).await),
            "{at}: reservations"
        );
        let sorted = |r: Result<Vec<WorkloadRecord>, Option<String>>| {
            r.map(|mut v| {
                v.sort_by(|a, b| (&a.reservation_id, a.slot).cmp(&(&b.reservation_id, b.slot)));
                v
            })
        };
        assert_eq!(
            sorted(coded(dynamo.workloads(&rid).await)),
            sorted(coded(memory.workloads(&rid).await)),
            "{at}: workloads"
        );
        assert_eq!(
            coded(dynamo.history(&rid).await),
            coded(memory.history(&rid).await),
            "{at}: history"
        );
        let month = BudgetMonth::of(t0());
        assert_eq!(
            coded(dynamo.budget_spent(&team("ml"), &month).await),
            coded(memory.budget_spent(&team("ml"), &month).await),
            "{at}: the ledger"
        );
    }
    let (d, m) = (
        coded(dynamo.agenda(now).await),
        coded(memory.agenda(now).await),
    );
    assert_eq!(d, m, "seed {seed}: the last agenda");
}

#[tokio::test]
async fn the_in_memory_store_answers_seeded_operation_sequences_as_dynamodb_does() {
    let mut reached = Reached::default();
    for seed in 1..=8 {
        play(seed, 50, &mut reached).await;
    }
    eprintln!("reached: {reached:?}");
    // ... and the sequences reached the outcomes that matter, not only refusals
    for key in [
        "create:Created",
        "create:AlreadyExists",
        "transition:Applied",
        "transition:Conflict",
        "transition:DuplicateEvent",
        "begin:Acquired",
        "record:Applied",
        "release:Applied",
        "keep:Applied",
        "workload:Ok",
    ] {
        assert!(reached.has(key), "no sequence reached {key}: {reached:?}");
    }
}
