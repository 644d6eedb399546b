//! search-offerings against the in-memory fakes.

use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::config::{Config, TeamBudgets};
use capacity_pilot::domain::catalog::PriceTable;
use capacity_pilot::domain::money::Usd;
use capacity_pilot::domain::offering::{Offering, Product, Segment};
use capacity_pilot::domain::request::RequestId;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::fakes::fixtures::{request_id, t0};
use capacity_pilot::fakes::{
    FakeMarket, FakeWorkloads, InMemoryStore, ManualClock, MarketOp, RecordingEvents, WorkloadsOp,
};
use capacity_pilot::ports::{PortError, Store};
use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use super::{RETRY_AFTER, Searcher};

type S = Searcher<InMemoryStore, FakeMarket, FakeWorkloads, RecordingEvents, ManualClock>;

struct World {
    store: InMemoryStore,
    market: FakeMarket,
    workloads: FakeWorkloads,
    events: RecordingEvents,
    clock: ManualClock,
}

impl World {
    fn new() -> World {
        // The request's one subnet is in us-east-1a, where the test blocks are.
        let workloads = FakeWorkloads::new();
        workloads.add_subnet("us-east-1", "subnet-0a1b2c3d4e5f60001", "us-east-1a");
        World {
            store: InMemoryStore::new(),
            market: FakeMarket::new(),
            workloads,
            events: RecordingEvents::new(),
            clock: ManualClock::new(t0()),
        }
    }

    fn searcher(&self) -> S {
        let env: Vec<(&str, &str)> = vec![
            ("TABLE_NAME", "t"),
            ("EVENT_BUS_NAME", "capacity-pilot"),
            ("ALLOWED_REGIONS", "us-east-1,us-east-2"),
            ("ALLOWED_REQUEST_SOURCES", "com.example.ml-platform"),
            ("APPROVER_SOURCES", "com.example.approvals"),
            ("TEAM_BUDGETS_USD", r#"{"*": "100000"}"#),
            (
                "SAGEMAKER_EXECUTION_ROLE_ARN",
                "arn:aws:iam::123456789012:role/sm",
            ),
        ];
        let config = Config::from_lookup(&move |k| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        Searcher {
            store: self.store.clone(),
            market: self.market.clone(),
            workloads: self.workloads.clone(),
            events: self.events.clone(),
            clock: self.clock.clone(),
            config: Arc::new(config),
            blocks_seen: Default::default(),
        }
    }

    /// Whether a request `id` is recorded.
    async fn recorded(&self, id: &str) -> bool {
        self.store
            .get_request(&request_id(id))
            .await
            .unwrap()
            .is_some()
    }

    async fn status(&self, id: &str) -> RequestStatus {
        self.store
            .get_request(&request_id(id))
            .await
            .unwrap()
            .unwrap()
            .status
    }
}

/// A valid two-day, 4 x p5.48xlarge request in the week after t0.
fn detail(id: &str) -> Value {
    json!({
        "schema_version": 1, "request_id": id, "team": "team-a",
        "instance_types": ["p5.48xlarge"], "instance_count": 4, "duration_hours": 48,
        "earliest_start": "2026-12-02T00:00:00Z", "latest_end": "2026-12-09T11:30:00Z",
        "regions": ["us-east-1"],
        "budget": {"max_upfront_usd": "10000"},
        "workload": {"kind": "ec2-instances",
            "launch_template": {"id": "lt-0abcdef1234567890"},
            "subnet_ids": ["subnet-0a1b2c3d4e5f60001"]}
    })
}

fn submitted(source: &str, id: &str, detail: Value) -> EventBridgeEvent<Value> {
    event("Capacity Request Submitted", source, id, detail)
}

fn event(detail_type: &str, source: &str, id: &str, detail: Value) -> EventBridgeEvent<Value> {
    serde_json::from_value(json!({
        "version": "0", "id": id, "detail-type": detail_type, "source": source,
        "account": "123456789012", "time": "2026-12-01T09:00:00Z", "region": "us-east-1",
        "resources": [], "detail": detail
    }))
    .unwrap()
}

fn tick(id: &str) -> EventBridgeEvent<Value> {
    event("Scheduled Event", "aws.events", id, json!({}))
}

fn block(id: &str, start: DateTime<Utc>, hours: i64, fee: &str) -> Offering {
    Offering::new(
        id,
        Product::CapacityBlock,
        "us-east-1",
        "p5.48xlarge",
        4,
        vec![Segment {
            start,
            end: start + Duration::hours(hours),
            availability_zone: Some("us-east-1a".into()),
        }],
        Usd::parse(fee).unwrap(),
        &PriceTable::default(),
    )
}

fn day(d: u32) -> DateTime<Utc> {
    "2026-12-01T11:30:00Z".parse::<DateTime<Utc>>().unwrap() + Duration::days(i64::from(d) - 1)
}

const SOURCE: &str = "com.example.ml-platform";

#[tokio::test]
async fn a_valid_request_is_recorded_accepted_and_searched_at_once() {
    let w = World::new();
    w.market.list_all([
        block("cb-cheap", day(3), 48, "6644.74"),
        block("cb-dear", day(2), 48, "7000"),
    ]);

    let out = w
        .searcher()
        .handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();

    assert_eq!(w.status("r1").await, RequestStatus::OfferingsFound);
    assert_eq!(
        w.events.detail_types(),
        ["Capacity Request Accepted", "Capacity Offerings Found"]
    );
    let found = &w.events.published_of("Capacity Offerings Found")[0].detail;
    assert_eq!(found["plans"][0]["offering_ids"][0], "cb-cheap");
    assert_eq!(found["plans"][0]["upfront_fee_usd"], "6644.74");
    assert_eq!(found["rejections"][0]["offering_id"], "cb-dear");
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.candidates[0].offering_ids(), ["cb-cheap"]);
    assert!(rec.reason.contains("chosen"), "{}", rec.reason);
    assert!(out.searches >= 1);
}

#[tokio::test]
async fn a_plan_request_announces_its_plans_and_ends_planned_and_one_finding_nothing_too() {
    // GIVEN offerings, a `mode: plan` request (on-demand-first, which a plan never runs on
    // demand), and a plan request no offering fits
    let w = World::new();
    w.market.list_all([
        block("cb-cheap", day(3), 48, "6644.74"),
        block("cb-dear", day(2), 48, "7000"),
    ]);
    let mut d = detail("r1");
    d["mode"] = json!("plan");
    d["strategy"] = json!("on-demand-first");
    let mut none = detail("r2");
    none["mode"] = json!("plan");
    none["budget"]["max_upfront_usd"] = json!("100");

    // WHEN each is submitted
    for (e, d) in [("e1", d), ("e2", none)] {
        w.searcher().handle(submitted(SOURCE, e, d)).await.unwrap();
    }

    // THEN each ended Planned, searched and announced, with nothing held or debited ...
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::Planned);
    assert_eq!(
        (rec.open_debit, rec.spent.0, rec.next_action_at),
        (None, 0, None)
    );
    assert!(
        rec.reason
            .starts_with("planned (mode plan), nothing bought"),
        "{}",
        rec.reason
    );
    // (on-demand-first ranks its reservations earliest first: cb-dear starts a day sooner)
    assert_eq!(rec.candidates[0].offering_ids(), ["cb-dear"]);
    let found = w.events.published_of("Capacity Offerings Found");
    assert_eq!(found[0].detail["plans"][0]["offering_ids"][0], "cb-dear");
    // ... the one finding nothing too, every offering's reason announced
    assert_eq!(w.status("r2").await, RequestStatus::Planned);
    assert_eq!(found[1].detail["plans"], json!([]));
    assert_eq!(found[1].detail["rejections"].as_array().unwrap().len(), 2);
    // ... and neither went on demand or asks anything more of the schedule
    assert!(w.events.published_of("Capacity Not Found").is_empty());
    assert!(
        !w.events
            .detail_types()
            .iter()
            .any(|t| t.contains("On-Demand") || t.contains("Reserved")),
        "{:?}",
        w.events.detail_types()
    );
}

#[tokio::test]
async fn under_purchase_mode_plan_only_every_request_is_planned() {
    // GIVEN a deployment whose PurchaseMode is plan-only, and an execute request
    let w = World::new();
    w.market
        .list_all([block("cb-cheap", day(3), 48, "6644.74")]);
    let mut s = w.searcher();
    let mut config = (*s.config).clone();
    config.purchase_mode = capacity_pilot::config::PurchaseMode::PlanOnly;
    s.config = Arc::new(config);
    // WHEN it is submitted
    s.handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();
    // THEN it is recorded as a plan and ends Planned, its plan announced
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::Planned);
    assert_eq!(
        rec.request.mode,
        capacity_pilot::domain::request::Mode::Plan
    );
    assert_eq!(
        w.events.published_of("Capacity Offerings Found")[0].detail["plans"][0]["offering_ids"][0],
        "cb-cheap"
    );
}

#[tokio::test]
async fn an_invalid_request_is_rejected_naming_every_field_and_nothing_is_recorded() {
    let w = World::new();
    let mut d = detail("r1");
    d["instance_count"] = json!(100);
    d["budget"]["max_upfront_usd"] = json!(10000);
    d["workload"]["subnet_ids"] = json!([]);

    w.searcher()
        .handle(submitted(SOURCE, "e1", d))
        .await
        .unwrap();

    assert!(!w.recorded("r1").await);
    let rejected = &w.events.published_of("Capacity Request Rejected")[0].detail;
    let fields: Vec<&str> = rejected["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "instance_count",
            "budget.max_upfront_usd",
            "workload.subnet_ids"
        ]
    );
    assert_eq!(rejected["request_id"], "r1");
    assert_eq!(rejected["event_id"], "e1");
    // AND why is kept under the id it claimed, by the event, for the requester to read
    let kept = w
        .store
        .rejections(&RequestId::parse("R1").unwrap())
        .await
        .unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(
        (kept[0].event_id.as_str(), kept[0].source.as_str()),
        ("e1", SOURCE)
    );
    let kept_fields: Vec<&str> = kept[0].problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(kept_fields, fields);
}

#[tokio::test]
async fn a_request_from_a_team_with_no_cap_is_rejected_naming_team_and_the_parameter() {
    // GIVEN caps for team-a only, and no "*" default (review N8)
    let w = World::new();
    let mut searcher = w.searcher();
    let mut config = (*searcher.config).clone();
    config.team_budgets = TeamBudgets {
        caps: [("team-a".to_string(), Usd::parse("1000").unwrap())].into(),
        default: None,
    };
    searcher.config = Arc::new(config);
    // WHEN team-b submits
    let mut d = detail("r1");
    d["team"] = json!("team-b");
    searcher.handle(submitted(SOURCE, "e1", d)).await.unwrap();
    // THEN it is rejected naming team and TeamBudgetsUsd, and nothing is recorded
    let rejected = w.events.published_of("Capacity Request Rejected");
    assert_eq!(rejected.len(), 1);
    let r = &rejected[0];
    assert_eq!(r.detail["request_id"], "r1");
    assert_eq!(r.detail["problems"][0]["field"], "team");
    let m = r.detail["problems"][0]["message"].as_str().unwrap();
    assert!(
        m.contains("TeamBudgetsUsd") && m.contains("may not spend"),
        "{m}"
    );
    assert!(!w.recorded("r1").await);
    // AND Team-A, team-a's cap in another case (§9.8: caps and ledgers ignore case), is
    // accepted, its team kept as given
    let mut d = detail("r2");
    d["team"] = json!("Team-A");
    searcher.handle(submitted(SOURCE, "e2", d)).await.unwrap();
    let r2 = w
        .store
        .get_request(&request_id("r2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r2.team.as_str(), "Team-A");
    // AND team-a's is accepted
    searcher
        .handle(submitted(SOURCE, "e3", detail("r3")))
        .await
        .unwrap();
    assert_ne!(w.status("r3").await, RequestStatus::Rejected);
}

#[tokio::test]
async fn a_request_from_an_unlisted_source_is_rejected() {
    let w = World::new();
    w.searcher()
        .handle(submitted("com.example.intruder", "e1", detail("r1")))
        .await
        .unwrap();
    assert!(!w.recorded("r1").await);
    let rejected = &w.events.published_of("Capacity Request Rejected")[0].detail;
    assert_eq!(rejected["problems"][0]["field"], "source");
}

#[tokio::test]
async fn an_oversize_request_is_rejected_before_parsing() {
    let w = World::new();
    let mut d = detail("r1");
    d["tags"] = json!({ "blob": "x".repeat(70 * 1024) });
    w.searcher()
        .handle(submitted(SOURCE, "e1", d))
        .await
        .unwrap();
    let rejected = &w.events.published_of("Capacity Request Rejected")[0].detail;
    assert_eq!(rejected["problems"][0]["field"], "detail");
}

#[tokio::test]
async fn a_resubmitted_request_is_a_no_op_and_a_reused_id_is_rejected() {
    let w = World::new();
    let s = w.searcher();
    s.handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();
    s.handle(submitted(SOURCE, "e2", detail("r1")))
        .await
        .unwrap();
    assert_eq!(
        w.events.published_of("Capacity Request Accepted").len(),
        1,
        "accepted once"
    );
    assert!(
        w.events
            .published_of("Capacity Request Rejected")
            .is_empty()
    );

    let mut other = detail("r1");
    other["instance_count"] = json!(8);
    s.handle(submitted(SOURCE, "e3", other)).await.unwrap();
    let rejected = &w.events.published_of("Capacity Request Rejected")[0].detail;
    assert_eq!(rejected["problems"][0]["field"], "request_id");
}

#[tokio::test]
async fn identical_queries_across_requests_share_one_search() {
    let w = World::new();
    let s = w.searcher();
    // Two requests asking the same question, recorded while EC2 throttles the region: the
    // first search is throttled, and the region backs off, so the second is not even made.
    w.market.fail_next(
        MarketOp::Search,
        PortError::Throttled {
            service: "ec2",
            code: "RequestLimitExceeded".into(),
            message: "slow down".into(),
        },
    );
    // A failed query is recorded on the request and asked again next tick (ARCHITECTURE
    // §8.8), not an invocation error.
    s.handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();
    s.handle(submitted(SOURCE, "e2", detail("r2")))
        .await
        .unwrap();
    assert_eq!(w.market.calls_of(MarketOp::Search), 1, "backing off");
    assert_eq!(
        w.status("r1").await,
        RequestStatus::Searching,
        "nothing decided on failure"
    );

    w.market.list(block("cb-1", day(3), 48, "6644.74"));
    let before = w.market.calls_of(MarketOp::Search);
    // The throttled region backs off until the next search tick.
    w.clock.advance(capacity_pilot::search::RATE_BACK_OFF);
    let out = s.handle(tick("t1")).await.unwrap();

    assert_eq!(out.searches, 1);
    assert_eq!(w.market.calls_of(MarketOp::Search) - before, 1);
    assert_eq!(w.status("r1").await, RequestStatus::OfferingsFound);
    assert_eq!(w.status("r2").await, RequestStatus::OfferingsFound);
}

/// Issue 55: a Not Found is told the first time, then again only when its reason or its
/// alternatives change, never for a round that only moved the times.
#[tokio::test]
async fn not_found_is_told_again_only_when_its_reason_or_alternatives_change() {
    let w = World::new();
    let s = w.searcher();
    w.market.list(block("cb-short", day(3), 24, "3000"));
    s.handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();
    let told = w.events.published_of("Capacity Not Found");
    assert_eq!(told.len(), 1);
    let notice = told[0].notice.clone().expect("the first is told");
    assert_eq!(notice.request_id.as_deref(), Some("r1"));
    assert!(notice.body.contains("cb-short"), "{}", notice.body);
    // WHEN a retry sees the same short offering again (another day's copy of it)
    w.market.list(block("cb-short-2", day(4), 24, "3100"));
    w.clock.advance(RETRY_AFTER);
    s.handle(tick("t1")).await.unwrap();
    // THEN nothing new is said
    assert_eq!(w.events.published_of("Capacity Not Found").len(), 1);
    // WHEN the alternatives change: an offering too dear is all there is besides
    w.market.list(block("cb-dear", day(3), 48, "9000000"));
    w.clock.advance(RETRY_AFTER);
    s.handle(tick("t2")).await.unwrap();
    // THEN a second Not Found is published and told, saying why this one does not fit
    assert_eq!(w.status("r1").await, RequestStatus::NotFound);
    let told = w.events.published_of("Capacity Not Found");
    assert_eq!(
        told.len(),
        2,
        "{:?}",
        told.iter().map(|e| &e.detail["reason"]).collect::<Vec<_>>()
    );
    assert_ne!(told[0].event_key, told[1].event_key);
    assert!(told[1].notice.is_some());
}

#[tokio::test]
async fn nothing_feasible_is_announced_once_retried_and_failed_at_the_deadline() {
    let w = World::new();
    let s = w.searcher();
    // Only an offering that is too short.
    w.market.list(block("cb-short", day(3), 24, "3000"));
    s.handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::NotFound);
    assert_eq!(w.events.published_of("Capacity Not Found").len(), 1);
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.next_action_at, Some(t0() + RETRY_AFTER));
    assert!(
        rec.reason.contains("covers 24 of the 48 hours"),
        "{}",
        rec.reason
    );

    // A retry finds nothing again: no second announcement.
    w.clock.advance(RETRY_AFTER);
    s.handle(tick("t1")).await.unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::NotFound);
    assert_eq!(w.events.published_of("Capacity Not Found").len(), 1);

    // Past the search deadline (latest_end - 48 h - 30 min), it fails with the reason.
    w.clock.set("2026-12-07T11:00:00Z".parse().unwrap());
    s.handle(tick("t2")).await.unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::Failed);
    let failed = &w.events.published_of("Capacity Request Failed")[0].detail;
    assert!(
        failed["reason"]
            .as_str()
            .unwrap()
            .contains("search deadline")
    );
}

#[tokio::test]
async fn an_offering_that_would_pass_the_accounts_limit_across_blocks_is_not_planned() {
    // GIVEN the account holding 253 instances in a block of another buyer over the days
    // offered, and an offering of 4 (the limit is 256 across Capacity Blocks)
    let w = World::new();
    w.market.list(block("cb-1", day(3), 48, "6644.74"));
    let mut theirs = capacity_pilot::fakes::fixtures::block_starting(
        day(3),
        capacity_pilot::domain::reservation::ReservationState::Active,
    );
    theirs.instance_count = 253;
    theirs.segments[0].end = day(5);
    w.market.add_reservation(theirs, None);

    // WHEN r1 is submitted
    w.searcher()
        .handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();

    // THEN nothing is planned, saying why
    assert_eq!(w.status("r1").await, RequestStatus::NotFound);
    let rec = record(&w, "r1").await;
    assert!(
        rec.reason
            .contains("limit of 256 instances across Capacity Blocks"),
        "{}",
        rec.reason
    );
}

#[tokio::test]
async fn the_accounts_blocks_are_read_only_when_a_candidate_would_buy_one() {
    use capacity_pilot::fakes::MarketOp;
    // GIVEN a block offered above the request's budget, so no plan would buy it
    let w = World::new();
    w.market.list(block("cb-dear", day(3), 48, "20000"));

    // WHEN r1 is submitted
    w.searcher()
        .handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();

    // THEN nothing is planned and the account's blocks were not read
    assert_eq!(w.status("r1").await, RequestStatus::NotFound);
    assert_eq!(w.market.calls_of(MarketOp::BlocksInAccount), 0);

    // AND a block within budget is planned after one read of them per allowed region
    w.market.list(block("cb-1", day(3), 48, "6644.74"));
    w.searcher()
        .handle(submitted(SOURCE, "e2", detail("r2")))
        .await
        .unwrap();
    assert_eq!(w.status("r2").await, RequestStatus::OfferingsFound);
    assert_eq!(w.market.calls_of(MarketOp::BlocksInAccount), 2);
}

#[tokio::test]
async fn an_unlistable_account_count_plans_without_the_limit_and_says_so() {
    use capacity_pilot::fakes::MarketOp;
    // GIVEN a block within budget, and the listing of the account's blocks failing after
    // the SDK's retries (before the fix: the whole search failed, every tick it failed)
    let w = World::new();
    w.market.list(block("cb-1", day(3), 48, "6644.74"));
    w.market.fail_next(
        MarketOp::BlocksInAccount,
        PortError::Transient {
            service: "ec2",
            code: "InternalError".into(),
            message: "An internal error has occurred".into(),
        },
    );

    // WHEN r1 is submitted
    w.searcher()
        .handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();

    // THEN the block is planned (AWS refuses a purchase past the limit, read as no
    // capacity), and the decision says what it was made without
    assert_eq!(w.status("r1").await, RequestStatus::OfferingsFound);
    let rec = record(&w, "r1").await;
    assert!(
        rec.reason
            .contains("decided without: the account's live Capacity Blocks, unlisted"),
        "{}",
        rec.reason
    );
}

#[tokio::test]
async fn on_demand_first_requests_go_to_trying_on_demand_without_a_search() {
    let w = World::new();
    let mut d = detail("r1");
    d["strategy"] = json!("on-demand-first");
    let out = w
        .searcher()
        .handle(submitted(SOURCE, "e1", d))
        .await
        .unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::TryingOnDemand);
    assert_eq!(out.searches, 0);
    // and it is not due before its desired start, so no schedule wakes for it in between
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    let desired: DateTime<Utc> = "2026-12-02T00:00:00Z".parse().unwrap();
    assert_eq!(rec.next_action_at, Some(desired));
}

#[tokio::test]
async fn a_split_request_also_searches_half_length_blocks_and_pairs_them() {
    let w = World::new();
    let mut d = detail("r1");
    d["allow_split"] = json!(true);
    w.market.list_all([
        block("first", day(3), 24, "2000"),
        block("second", day(5), 24, "2000"),
    ]);
    w.searcher()
        .handle(submitted(SOURCE, "e1", d))
        .await
        .unwrap();
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::OfferingsFound);
    assert_eq!(rec.candidates[0].offering_ids(), ["first", "second"]);
}

#[tokio::test]
async fn a_block_in_a_zone_without_any_of_the_requests_subnets_is_never_planned() {
    // GIVEN the cheaper block in us-east-1b, where the request has no subnet
    let w = World::new();
    let mut elsewhere = block("cb-cheap-1b", day(3), 48, "5000");
    elsewhere.segments[0].availability_zone = Some("us-east-1b".into());
    w.market
        .list_all([elsewhere, block("cb-1a", day(2), 48, "7000")]);

    // WHEN the request is searched
    w.searcher()
        .handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();

    // THEN the usable block is chosen, and the cheaper one is rejected naming the zone
    let found = &w.events.published_of("Capacity Offerings Found")[0].detail;
    assert_eq!(found["plans"][0]["offering_ids"], json!(["cb-1a"]));
    assert_eq!(found["plans"].as_array().unwrap().len(), 1);
    let rejected = found["rejections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["offering_id"] == "cb-cheap-1b")
        .expect("the unusable block is explained");
    let reason = rejected["reason"].as_str().unwrap();
    assert!(
        reason.contains("us-east-1b") && reason.contains("subnet"),
        "{reason}"
    );
}

#[tokio::test]
async fn an_offering_where_the_template_does_not_resolve_is_announced_with_the_preflights_reason() {
    // GIVEN an offering, and EC2 answering that the request's launch template does not exist
    // in us-east-1 (an `lt-` id of another region)
    let w = World::new();
    w.market.list_all([block("cb-1a", day(2), 48, "7000")]);
    w.workloads.fail_next(
        WorkloadsOp::PreflightInstances,
        PortError::Permanent {
            service: "ec2",
            code: "InvalidLaunchTemplateId.NotFound".into(),
            message: "The specified launch template does not exist.".into(),
        },
    );

    // WHEN the request is searched
    w.searcher()
        .handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();

    // THEN nothing is planned, Not Found says why, and the search made reads only
    assert_eq!(w.status("r1").await, RequestStatus::NotFound);
    let found = &w.events.published_of("Capacity Not Found")[0].detail;
    let reason = found["rejections"][0]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("pre-flight: launch template")
            && reason.contains("InvalidLaunchTemplateId.NotFound")
            && reason.contains("exists in one region only"),
        "{reason}"
    );
    let preflights = w.workloads.calls_of(WorkloadsOp::PreflightInstances);
    assert_eq!(preflights.len(), 1);
    assert!(matches!(
        &preflights[0],
        capacity_pilot::fakes::WorkloadsCall::PreflightInstances { dry_run: false, .. }
    ));
}

#[tokio::test]
async fn an_endpoint_offering_in_a_region_without_its_model_is_not_planned() {
    // GIVEN an endpoint request for two regions, its model only in us-east-2
    let w = World::new();
    let mut d = endpoint("r1", "llm-ep", 2, 8);
    d["regions"] = json!(["us-east-1", "us-east-2"]);
    d["workload"]["model_name"] = json!("llm");
    w.workloads.remove_model("us-east-1", "llm");
    let plan = |id: &str, region: &str, fee: &str| {
        Offering::new(
            id,
            Product::TrainingPlan {
                target: capacity_pilot::domain::offering::TargetResource::Endpoint,
            },
            region,
            "ml.p5.48xlarge",
            1,
            vec![Segment {
                start: day(2),
                end: day(4),
                availability_zone: None,
            }],
            Usd::parse(fee).unwrap(),
            &PriceTable::default(),
        )
    };
    let east = plan("tp-east", "us-east-1", "5000");
    let west = plan("tp-west", "us-east-2", "6000");
    w.market.list_all([east, west]);

    // WHEN it is searched
    w.searcher()
        .handle(submitted(SOURCE, "e1", d))
        .await
        .unwrap();

    // THEN the us-east-2 plan is the only one, the us-east-1 offering rejected naming the model
    let found = &w.events.published_of("Capacity Offerings Found")[0].detail;
    assert_eq!(
        found["plans"][0]["offering_ids"],
        json!(["tp-west"]),
        "{found}"
    );
    let east_reason = found["rejections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["offering_id"] == "tp-east")
        .expect("tp-east explained")["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        east_reason.contains("SageMaker model llm does not exist in us-east-1"),
        "{east_reason}"
    );
}

fn hyperpod(id: &str) -> Value {
    let mut d = detail(id);
    d["instance_types"] = json!(["ml.p5.48xlarge"]);
    d["workload"] = json!({"kind": "hyperpod-cluster", "cluster_name": "hp",
        "instance_group_name": "workers"});
    d
}

#[tokio::test]
async fn a_hyperpod_request_for_a_cluster_we_do_not_manage_is_rejected_before_anything_is_bought() {
    for (managed, exists) in [(false, true), (false, false)] {
        // GIVEN a cluster without the managed tag, or none at all
        let w = World::new();
        if exists {
            w.workloads.add_cluster("us-east-1", "hp", managed);
        }

        // WHEN a HyperPod request for it arrives
        w.searcher()
            .handle(submitted(SOURCE, "e1", hyperpod("hp-1")))
            .await
            .unwrap();

        // THEN it is rejected naming the cluster field, and nothing is recorded or searched
        assert_eq!(w.events.detail_types(), ["Capacity Request Rejected"]);
        let problems = &w.events.published_of("Capacity Request Rejected")[0].detail["problems"];
        assert_eq!(problems[0]["field"], "workload.cluster_name", "{problems}");
        let message = problems[0]["message"].as_str().unwrap();
        if exists {
            assert!(message.contains("capacity-pilot:managed"), "{message}");
        }
        assert!(
            w.store
                .get_request(&request_id("hp-1"))
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(w.market.calls_of(MarketOp::Search), 0);
    }
}

#[tokio::test]
async fn a_hyperpod_request_for_a_managed_cluster_is_accepted() {
    let w = World::new();
    w.workloads.add_cluster("us-east-1", "hp", true);

    w.searcher()
        .handle(submitted(SOURCE, "e1", hyperpod("hp-2")))
        .await
        .unwrap();

    assert_eq!(w.events.detail_types()[0], "Capacity Request Accepted");
    assert!(
        w.store
            .get_request(&request_id("hp-2"))
            .await
            .unwrap()
            .is_some()
    );
}

/// GIVEN a 48 h split request whose first 24 h block (day 3) is bought and recorded, its
/// second block gone: the request is back in `Searching` with $3000 spent.
fn kept_first_half(w: &World, id: &str) {
    use capacity_pilot::domain::reservation::{Reservation, ReservationState};
    use capacity_pilot::fakes::fixtures::request;
    use capacity_pilot::ports::RequestRecord;
    let mut req = request(id, "team-a", "10000");
    req.instance_count = 4;
    req.duration_hours = 48;
    req.allow_split = true;
    req.window.earliest_start = day(2);
    req.window.latest_end = day(8);
    let first = block("cb-first", day(3), 24, "3000");
    // the fixture request's subnet, in the zone of the test blocks
    w.workloads
        .add_subnet("us-east-1", "subnet-a", "us-east-1a");
    w.store.insert_record(RequestRecord {
        version: 6,
        reason: "the second block has gone; searching for a replacement".into(),
        next_action_at: Some(t0()),
        spent: Usd::parse("3000").unwrap().to_micros_ceil(),
        ..capacity_pilot::fakes::fixtures::record(req.clone(), RequestStatus::Searching)
    });
    w.store.insert_reservation(
        &req.id,
        Reservation {
            id: "cr-first".into(),
            product: Product::CapacityBlock,
            region: "us-east-1".into(),
            instance_type: "p5.48xlarge".into(),
            instance_count: 4,
            segments: first.segments.clone(),
            upfront_fee: Usd::parse("3000").unwrap(),
            state: ReservationState::PaymentPending,
            offering_id: Some("cb-first".into()),
            request_tag: Some(id.into()),
            ultraserver: false,
            bought_at: None,
            debit_month: None,
            debit_team: None,
            payment_check_at: None,
            extensions: Vec::new(),
            extension_check_at: None,
            deployment_tag: None,
        },
    );
}

#[tokio::test]
async fn a_split_that_lost_its_second_block_searches_one_replacement_block_for_the_rest() {
    // GIVEN the kept first half, and on sale: a 24 h block overlapping it, a 24 h block
    // after it, and a 48 h block (the whole request again)
    let w = World::new();
    kept_first_half(&w, "r-rep");
    w.market.list_all([
        block("cb-overlap", day(3) + Duration::hours(12), 24, "1000"),
        block("cb-after", day(5), 24, "3200"),
        block("cb-whole", day(5), 48, "5000"),
    ]);

    // WHEN the schedule runs the search
    w.searcher().handle(tick("t1")).await.unwrap();

    // THEN the best plan is the 24 h block after what is bought, within the money left
    // ($7000 of $10000); the overlapping block is never planned
    let rec = w
        .store
        .get_request(&request_id("r-rep"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::OfferingsFound, "{}", rec.reason);
    let found = &w.events.published_of("Capacity Offerings Found")[0].detail;
    assert_eq!(found["plans"][0]["offering_ids"], json!(["cb-after"]));
    assert!(
        found["plans"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["offering_ids"] != json!(["cb-overlap"])),
        "{found}"
    );
}

#[tokio::test]
async fn a_replacement_for_a_kept_block_that_started_mid_day_is_asked_for_in_whole_days() {
    // GIVEN the kept first half started at midnight, so it covers 35.5 h of the 48
    let w = World::new();
    kept_first_half(&w, "r-mid");
    let id = request_id("r-mid");
    let rec = w.store.get_request(&id).await.unwrap().unwrap();
    let mut kept = w.store.reservations(&id).await.unwrap();
    kept[0].segments[0].start = kept[0].segments[0].end - Duration::minutes(35 * 60 + 30);

    // WHEN the rest is worked out
    let need = super::remaining(&rec, &kept);

    // THEN it is one whole day, a duration EC2 sells, not the 12 h left over
    assert_eq!(need.duration_hours, 24);
    assert!(!need.allow_split);
}

#[tokio::test]
async fn a_stray_overlapping_the_kept_block_counts_its_hours_once_in_what_is_left() {
    // GIVEN the kept first half (24 h of 48) and a stray of the same type adopted beside it
    // over the same day, and another of a type the request does not take
    let w = World::new();
    kept_first_half(&w, "r-over");
    let id = request_id("r-over");
    let rec = w.store.get_request(&id).await.unwrap().unwrap();
    let mut kept = w.store.reservations(&id).await.unwrap();
    let mut over = kept[0].clone();
    over.id = "cr-stray".into();
    over.offering_id = None;
    let mut other = kept[0].clone();
    other.id = "cr-other".into();
    other.instance_type = "p4d.24xlarge".into();
    other.segments[0].start = kept[0].segments[0].end;
    other.segments[0].end = kept[0].segments[0].end + Duration::hours(24);
    kept.extend([over, other]);

    // WHEN the rest is worked out
    let need = super::remaining(&rec, &kept);

    // THEN the 24 h still uncovered are asked for, never 0 h (EC2 refuses a 0 h search, and
    // the request would fail though it needs a day more)
    assert_eq!(need.duration_hours, 24);
    assert_eq!(need.instance_types[0].as_str(), "p5.48xlarge");
}

#[tokio::test]
async fn a_replacement_not_found_by_its_deadline_fails_with_the_kept_block_recorded() {
    // GIVEN the kept first half, nothing on sale, and the clock past the deadline for the
    // remaining 24 h (latest end day 8, minus 24 h, minus the purchase lead)
    let w = World::new();
    kept_first_half(&w, "r-late");
    w.clock.set(day(7));

    // WHEN the schedule runs the search
    w.searcher().handle(tick("t1")).await.unwrap();

    // THEN the request fails naming the kept reservation and what stays spent
    assert_eq!(w.status("r-late").await, RequestStatus::Failed);
    let failed = &w.events.published_of("Capacity Request Failed")[0].detail;
    assert_eq!(failed["reservation_ids"], json!(["cr-first"]));
    assert_eq!(failed["spent_usd"], "3000");
    let reason = failed["reason"].as_str().unwrap();
    assert!(
        reason.contains("replacement segment") && reason.contains("cr-first"),
        "{reason}"
    );
    // AND it lists the kept block's window, which is still served to its drain
    assert_eq!(failed["kept_windows"][0]["reservation_id"], "cr-first");
    assert!(
        failed["kept_windows"][0]["drain_at"].is_string(),
        "{failed:#}"
    );
}

/// GIVEN r1 submitted (as event e1, a block listed for it), then ended in `status` now.
async fn submitted_then(w: &World, status: RequestStatus) {
    w.market.list(block("cb-1", day(3), 48, "6644.74"));
    w.searcher()
        .handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();
    let mut rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    rec.status = status;
    rec.reason = format!("{status} (seeded)");
    rec.updated_at = w.clock.get();
    w.store.insert_record(rec);
}

#[tokio::test]
async fn reusing_the_id_of_an_ended_request_is_rejected_naming_request_id_not_dropped() {
    // GIVEN r1 was submitted and has ended (its record is kept for the archive period)
    let w = World::new();
    submitted_then(&w, RequestStatus::Ended).await;

    // WHEN the same request is submitted again, as a new event
    w.searcher()
        .handle(submitted(SOURCE, "e2", detail("r1")))
        .await
        .unwrap();

    // THEN it is rejected naming request_id, and the ended request is left as it was
    let rejected = w.events.published_of("Capacity Request Rejected");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].detail["problems"][0]["field"], "request_id");
    assert!(
        rejected[0].detail["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("Ended"),
        "{rejected:?}"
    );
    assert_eq!(w.status("r1").await, RequestStatus::Ended);

    // AND a redelivery of the first submission is still only a duplicate
    w.searcher()
        .handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();
    assert_eq!(w.events.published_of("Capacity Request Rejected").len(), 1);
}

#[tokio::test]
async fn a_producers_retry_of_an_in_flight_request_is_a_duplicate_not_a_rejection() {
    let w = World::new();
    w.market.list(block("cb-1", day(3), 48, "6644.74"));
    let s = w.searcher();
    s.handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();
    s.handle(submitted(SOURCE, "e2", detail("r1")))
        .await
        .unwrap();
    assert!(
        w.events
            .published_of("Capacity Request Rejected")
            .is_empty()
    );
    assert_eq!(w.status("r1").await, RequestStatus::OfferingsFound);
}

// ---- a cancellation before its submission (ARCHITECTURE 8.3) -----------------------------

fn tombstone(id: &str, source: &str) -> capacity_pilot::ports::Tombstone {
    capacity_pilot::ports::Tombstone {
        request_id: request_id(id),
        source: source.into(),
        reason: "cancelled by the requester: the launch moved".into(),
        at: t0() - Duration::hours(1),
        event_id: format!("cancel-{id}"),
    }
}

#[tokio::test]
async fn a_submission_after_its_cancellation_from_the_same_source_is_recorded_cancelled() {
    // GIVEN cancellations that came before their submissions: r1's from the submitting
    // source, r2's from another
    let w = World::new();
    w.market
        .list_all([block("cb-cheap", day(3), 48, "6644.74")]);
    for (id, source) in [("r1", SOURCE), ("r2", "com.example.other")] {
        w.store
            .put_tombstone(tombstone(id, source), vec![])
            .await
            .unwrap();
    }

    // WHEN both are submitted
    let s = w.searcher();
    s.handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();
    s.handle(submitted(SOURCE, "e2", detail("r2")))
        .await
        .unwrap();

    // THEN r1 is recorded cancelled, nothing searched, and the submission answered; r2 (the
    // tombstone of another source) is searched as usual
    assert_eq!(w.status("r1").await, RequestStatus::Cancelled);
    let failed = w.events.published_of("Capacity Request Failed");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].detail["request_id"], "r1");
    assert!(
        failed[0].detail["reason"]
            .as_str()
            .unwrap()
            .contains("the launch moved")
    );
    assert_eq!(w.status("r2").await, RequestStatus::OfferingsFound);
    let accepted = w.events.published_of("Capacity Request Accepted");
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0].detail["request_id"], "r2");
}

// ---- ids compared ignoring case (review N15) ----------------------------------------------

#[tokio::test]
async fn a_request_id_differing_only_in_case_from_a_recorded_one_is_rejected_naming_request_id() {
    // GIVEN r1 recorded and searching
    let w = World::new();
    w.market.list(block("cb-1", day(3), 48, "6644.74"));
    let s = w.searcher();
    s.handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();

    // WHEN R1 is submitted
    s.handle(submitted(SOURCE, "e2", detail("R1")))
        .await
        .unwrap();

    // THEN R1 is rejected naming request_id and r1, and r1 is left as it was
    let (field, message) = rejection(&w);
    assert_eq!(field, "request_id");
    assert!(
        message.contains("differs only in case from request r1"),
        "{message}"
    );
    assert_eq!(w.status("r1").await, RequestStatus::OfferingsFound);
    assert!(
        w.store
            .get_request(&request_id("R1"))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_cancellation_before_its_submission_cancels_the_id_in_any_case() {
    // GIVEN a cancellation of R1 before any submission
    let w = World::new();
    w.market.list(block("cb-1", day(3), 48, "6644.74"));
    w.store
        .put_tombstone(tombstone("R1", SOURCE), vec![])
        .await
        .unwrap();

    // WHEN r1 is submitted from the same source
    w.searcher()
        .handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();

    // THEN it is recorded cancelled, nothing searched
    assert_eq!(w.status("r1").await, RequestStatus::Cancelled);
    assert!(
        w.events
            .published_of("Capacity Request Accepted")
            .is_empty()
    );
}

// ---- issue 16: per-query outcomes (ARCHITECTURE §8.8) ---------------------------------

fn unsupported(region: &str) -> PortError {
    PortError::Permanent {
        service: "ec2",
        code: "InvalidParameterValue".into(),
        message: format!(
            "The instance type 'p5.48xlarge' is not supported for Capacity Blocks in '{region}'"
        ),
    }
}

/// EC2's describe limit as the adapter classes it: its own class, never a throttle.
fn describe_limit(message: &str) -> PortError {
    capacity_pilot::aws::error::Failure {
        op: "DescribeCapacityBlockOfferings",
        code: "CapacityBlockDescribeLimitExceeded".into(),
        message: message.into(),
        status: Some(400),
        answered: true,
    }
    .into_port("ec2", capacity_pilot::aws::error::Call::Retryable)
}

fn two_regions(id: &str) -> Value {
    let mut d = detail(id);
    d["regions"] = json!(["us-east-1", "us-east-2"]);
    d
}

async fn record(w: &World, id: &str) -> capacity_pilot::ports::RequestRecord {
    w.store.get_request(&request_id(id)).await.unwrap().unwrap()
}

#[tokio::test]
async fn a_permanently_refused_query_is_dropped_and_the_others_still_decide() {
    // GIVEN a request for two regions; us-east-2 does not sell p5.48xlarge as blocks
    let w = World::new();
    w.market.list(block("cb-1", day(3), 48, "6644.74"));
    w.market
        .fail_searches("us-east-2", None, unsupported("us-east-2"));

    // WHEN it is submitted (before the fix: the whole search was discarded, every tick)
    w.searcher()
        .handle(submitted(SOURCE, "e1", two_regions("r1")))
        .await
        .unwrap();

    // THEN it decides on us-east-1's answer, naming the refusal
    let rec = record(&w, "r1").await;
    assert_eq!(rec.status, RequestStatus::OfferingsFound, "{}", rec.reason);
    assert!(
        rec.reason.contains("us-east-2")
            && rec.reason.contains("not supported for Capacity Blocks"),
        "{}",
        rec.reason
    );
    assert_eq!(rec.candidates[0].offering_ids(), ["cb-1"]);
}

#[tokio::test]
async fn a_request_whose_every_query_is_refused_fails_at_once_with_the_reasons() {
    let w = World::new();
    for region in ["us-east-1", "us-east-2"] {
        w.market.fail_searches(region, None, unsupported(region));
    }
    w.searcher()
        .handle(submitted(SOURCE, "e1", two_regions("r1")))
        .await
        .unwrap();
    let rec = record(&w, "r1").await;
    assert_eq!(rec.status, RequestStatus::Failed, "{}", rec.reason);
    let failed = &w.events.published_of("Capacity Request Failed")[0].detail;
    let reason = failed["reason"].as_str().unwrap();
    assert!(reason.contains("every search was refused"), "{reason}");
    assert!(
        reason.contains("'us-east-1'") && reason.contains("'us-east-2'"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_request_whose_queries_keep_failing_fails_at_its_deadline() {
    // GIVEN every search of the request failing, tick after tick
    let w = World::new();
    let s = w.searcher();
    w.market.fail_searches(
        "us-east-1",
        None,
        PortError::Transient {
            service: "ec2",
            code: "ServiceUnavailable".into(),
            message: "try later".into(),
        },
    );
    s.handle(submitted(SOURCE, "e1", detail("r1")))
        .await
        .unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::Searching);

    // WHEN the schedule runs every 5 minutes until past the search deadline (before the
    // fix: searched every 5 minutes for ever, never failed)
    let deadline: DateTime<Utc> = "2026-12-07T11:00:00Z".parse().unwrap();
    let mut ticks = 0;
    while w.status("r1").await != RequestStatus::Failed && w.clock.get() <= deadline {
        w.clock.advance(Duration::minutes(5));
        s.handle(tick(&format!("t{ticks}"))).await.unwrap();
        ticks += 1;
    }

    // THEN it failed at its deadline, naming what kept failing
    let rec = record(&w, "r1").await;
    assert_eq!(rec.status, RequestStatus::Failed, "{}", rec.reason);
    assert!(w.clock.get() >= deadline);
    assert!(
        rec.reason.contains("search deadline") && rec.reason.contains("ServiceUnavailable"),
        "{}",
        rec.reason
    );
}

#[tokio::test]
async fn the_account_limit_reading_marks_the_family_and_region_unavailable_and_the_rest_go_on() {
    // GIVEN a request for p5 or p4d, and an account with no Capacity Block quota for p5
    let w = World::new();
    let mut d = detail("r1");
    d["instance_types"] = json!(["p5.48xlarge", "p4d.24xlarge"]);
    let mut p4d = block("cb-p4d", day(3), 48, "3000");
    p4d.instance_type = "p4d.24xlarge".into();
    w.market.list(p4d);
    w.market.fail_searches(
        "us-east-1",
        Some("p5.48xlarge"),
        describe_limit(
            "Your existing service limits for this AWS account are not sufficient to use EC2 \
             Capacity Blocks",
        ),
    );

    // WHEN it is searched (before the fix: a throttle, the whole search retried for ever)
    w.searcher()
        .handle(submitted(SOURCE, "e1", d))
        .await
        .unwrap();

    // THEN p5 in us-east-1 is dropped with the reason, and the p4d block is found
    let rec = record(&w, "r1").await;
    assert_eq!(rec.status, RequestStatus::OfferingsFound, "{}", rec.reason);
    assert_eq!(rec.candidates[0].offering_ids(), ["cb-p4d"]);
    assert!(
        rec.reason
            .contains("no Capacity Block quota for p5 in us-east-1"),
        "{}",
        rec.reason
    );
}

#[tokio::test]
async fn the_rate_reading_backs_the_region_off_and_loses_nothing() {
    // GIVEN two p5 and p4d queries in us-east-1, the first refused by the rate limit once
    let w = World::new();
    let s = w.searcher();
    let mut d = detail("r1");
    d["instance_types"] = json!(["p5.48xlarge", "p4d.24xlarge"]);
    w.market.list(block("cb-1", day(3), 48, "6644.74"));
    w.market.fail_next(
        MarketOp::Search,
        describe_limit("You've reached the limit for this account."),
    );

    // WHEN it is submitted
    s.handle(submitted(SOURCE, "e1", d)).await.unwrap();

    // THEN the region backed off: one call made, the other query deferred, nothing decided
    assert_eq!(w.market.calls_of(MarketOp::Search), 1);
    let rec = record(&w, "r1").await;
    assert_eq!(rec.status, RequestStatus::Searching, "{}", rec.reason);
    assert!(rec.reason.contains("backing off"), "{}", rec.reason);

    // WHEN the next tick comes, the limit lifted
    w.clock.advance(Duration::minutes(5));
    s.handle(tick("t1")).await.unwrap();

    // THEN both are asked and it decides
    assert_eq!(w.market.calls_of(MarketOp::Search), 3);
    let rec = record(&w, "r1").await;
    assert_eq!(rec.status, RequestStatus::OfferingsFound, "{}", rec.reason);
    assert_eq!(rec.candidates[0].offering_ids(), ["cb-1"]);
}

#[tokio::test]
async fn searches_are_paced_per_region_and_the_deferred_go_first_next_tick() {
    // GIVEN a request needing 7 Capacity Block searches in us-east-1 (7 types), and the
    // region's allowance of 5 searches refilling 1 a minute
    let w = World::new();
    let s = w.searcher();
    let types = [
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p4d.24xlarge",
        "p4de.24xlarge",
        "trn1.32xlarge",
        "trn2.48xlarge",
    ];
    let mut d = detail("r1");
    d["instance_types"] = json!(types);
    w.market.list(block("cb-1", day(3), 48, "6644.74"));

    // WHEN it is submitted
    s.handle(submitted(SOURCE, "e1", d)).await.unwrap();

    // THEN 5 searches are made, 2 deferred, and nothing is decided on part of the answers
    assert_eq!(w.market.calls_of(MarketOp::Search), 5);
    let rec = record(&w, "r1").await;
    assert_eq!(rec.status, RequestStatus::Searching, "{}", rec.reason);
    assert!(rec.reason.contains("allowance is spent"), "{}", rec.reason);

    // WHEN the next tick comes 5 minutes later
    w.clock.advance(Duration::minutes(5));
    s.handle(tick("t1")).await.unwrap();

    // THEN only the two deferred are asked, and it decides on all seven answers
    assert_eq!(w.market.calls_of(MarketOp::Search), 7);
    let rec = record(&w, "r1").await;
    assert_eq!(rec.status, RequestStatus::OfferingsFound, "{}", rec.reason);
    assert!(!rec.reason.contains("decided without"), "{}", rec.reason);
}

/// GIVEN request `id` (48 h of 4 p5 between day 2 and day 5 13:30, $10,000) whose spot run
/// started on day 2 and fell back `served` later, having spent $2000 of it: `Searching`.
fn fell_back(w: &World, id: &str, served: Duration) {
    use capacity_pilot::fakes::fixtures::request;
    use capacity_pilot::ports::{FallBack, OnDemandRun, RequestRecord};
    let mut req = request(id, "team-a", "10000");
    req.instance_count = 4;
    req.duration_hours = 48;
    req.strategy = capacity_pilot::domain::request::Strategy::OnDemandFirst;
    req.interruptible = true;
    req.window.earliest_start = day(2);
    req.window.latest_end = day(5) + Duration::hours(2);
    w.workloads
        .add_subnet("us-east-1", "subnet-a", "us-east-1a");
    w.store.insert_record(RequestRecord {
        version: 9,
        reason: "spot: falling back".into(),
        next_action_at: Some(t0()),
        run: Some(OnDemandRun {
            attempt: "spot".into(),
            held_at: day(2),
            started_at: Some(day(2)),
            launch_generations: 0,
            claim: None,
            fall_back: Some(FallBack {
                reason: "1 of its 4 spot instances taken back by EC2".into(),
                at: day(2) + served,
            }),
            approval: None,
        }),
        spent: Usd::parse("2000").unwrap().to_micros_ceil(),
        ..capacity_pilot::fakes::fixtures::record(req.clone(), RequestStatus::Searching)
    });
}

#[tokio::test]
async fn a_spot_run_that_fell_back_searches_for_the_days_it_did_not_serve() {
    // Issue 48, spot fall-back. GIVEN a 48 h spot run that served 30 h 40 min before it fell
    // back, past the search deadline for the whole 48 h (day 3 01:30) but not for one day
    let w = World::new();
    fell_back(&w, "r-fb", Duration::minutes(30 * 60 + 40));
    w.clock.set(day(3) + Duration::hours(18));
    // and on sale within the window: a 24 h block within its $8000 left, and one above it
    w.market.list_all([
        block("cb-day", day(4), 24, "7000"),
        block("cb-dear", day(4), 24, "8500"),
    ]);

    // WHEN the schedule runs the search
    w.searcher().handle(tick("t1")).await.unwrap();

    // THEN it asks for the whole day that covers the 18 h left (not 48 h, which no longer
    // fits, nor 17 h, which EC2 does not sell) within the money left, and finds it
    let rec = w
        .store
        .get_request(&request_id("r-fb"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::OfferingsFound, "{}", rec.reason);
    assert_eq!(rec.needed_hours(), 24);
    let found = &w.events.published_of("Capacity Offerings Found")[0].detail;
    assert_eq!(found["plans"][0]["offering_ids"], json!(["cb-day"]));
    assert_eq!(found["plans"].as_array().unwrap().len(), 1, "{found}");
    let need = super::remaining(&rec, &[]);
    assert_eq!(need.duration_hours, 24);
    assert_eq!(need.budget.max_upfront, Usd::parse("8000").unwrap());
}

#[tokio::test]
async fn a_spot_run_that_fell_back_early_searches_for_every_day_left() {
    // GIVEN a 48 h spot run that served 23 h 59 min, so 23 h (whole hours served): 25 h
    // are left
    let w = World::new();
    fell_back(&w, "r-early", Duration::minutes(23 * 60 + 59));
    let rec = w
        .store
        .get_request(&request_id("r-early"))
        .await
        .unwrap()
        .unwrap();
    // THEN the search asks for the two whole days that cover them
    assert_eq!(rec.served(), Duration::hours(23));
    assert_eq!(super::remaining(&rec, &[]).duration_hours, 48);
    assert_eq!(rec.needed_hours(), 48);
}

// ---- workload names claimed by one live request at a time (ARCHITECTURE 9.8) --------------

/// An endpoint request named `endpoint` wanting 48 h between days `from` and `to`.
fn endpoint(id: &str, endpoint: &str, from: u32, to: u32) -> Value {
    let mut d = detail(id);
    d["instance_types"] = json!(["ml.p5.48xlarge"]);
    d["instance_count"] = json!(1);
    d["earliest_start"] = json!(day(from).to_rfc3339());
    d["latest_end"] = json!(day(to).to_rfc3339());
    d["workload"] = json!({"kind": "inference-endpoint", "model_name": "m",
        "endpoint_name": endpoint, "variant_name": "primary"});
    d
}

fn rejection(w: &World) -> (String, String) {
    let rejected = w.events.published_of("Capacity Request Rejected");
    assert_eq!(rejected.len(), 1, "{:?}", w.events.detail_types());
    let p = &rejected[0].detail["problems"][0];
    (
        p["field"].as_str().unwrap().to_string(),
        p["message"].as_str().unwrap().to_string(),
    )
}

async fn claimants(w: &World, name: &str) -> Vec<String> {
    use capacity_pilot::ports::ClaimKey;
    let key = ClaimKey::new("us-east-1", "endpoint", name);
    w.store
        .claim(&key)
        .await
        .unwrap()
        .map(|c| {
            c.claimants
                .iter()
                .map(|c| c.request_id.to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_second_live_request_naming_one_endpoint_over_an_overlapping_window_is_rejected_naming_the_first()
 {
    // GIVEN r1 recorded, claiming endpoint llm from day 2 to day 9
    let w = World::new();
    let s = w.searcher();
    s.handle(submitted(SOURCE, "e1", endpoint("r1", "llm", 2, 9)))
        .await
        .unwrap();
    assert_eq!(claimants(&w, "llm").await, ["r1"]);
    w.events.clear();

    // WHEN r2 names it too (in another case: AWS's names ignore case), from day 8 to day 12
    s.handle(submitted(SOURCE, "e2", endpoint("r2", "LLM", 8, 12)))
        .await
        .unwrap();

    // THEN r2 is rejected naming the field and r1, and nothing of it is recorded
    let (field, message) = rejection(&w);
    assert_eq!(field, "workload.endpoint_name");
    assert!(
        message.contains("request r1") && message.contains("llm"),
        "{message}"
    );
    assert!(!w.recorded("r2").await);
    assert_eq!(claimants(&w, "llm").await, ["r1"]);

    // AND r3, wanting it from day 9 on (where r1's interval ends), is accepted beside r1
    w.events.clear();
    s.handle(submitted(SOURCE, "e3", endpoint("r3", "llm", 9, 14)))
        .await
        .unwrap();
    assert_eq!(w.events.detail_types()[0], "Capacity Request Accepted");
    assert_eq!(claimants(&w, "llm").await, ["r1", "r3"]);
}

/// r1 recorded claiming endpoint llm from day 2 to day 9, read back ended (`Failed`, nothing
/// due): the caller adds what it holds and stores it.
async fn ended_claimant(w: &World, s: &S) -> capacity_pilot::ports::RequestRecord {
    s.handle(submitted(SOURCE, "e1", endpoint("r1", "llm", 2, 9)))
        .await
        .unwrap();
    let mut r1 = record(w, "r1").await;
    r1.status = RequestStatus::Failed;
    r1.next_action_at = None;
    r1
}

#[tokio::test]
async fn a_request_that_ended_leaves_its_name_or_keeps_it_over_its_paid_windows_only() {
    use capacity_pilot::domain::reservation::ReservationState;
    use capacity_pilot::domain::window::{WindowRecord, WindowState};
    use capacity_pilot::fakes::fixtures::block_starting;
    for paid in [false, true] {
        // GIVEN r1 claiming llm from day 2 to day 9, then ended (Failed); when `paid`, with a
        // bought window of days 3-5 not ended
        let w = World::new();
        let s = w.searcher();
        let mut r1 = ended_claimant(&w, &s).await;
        if paid {
            r1.windows = vec![WindowRecord {
                key: "cr-1#0".into(),
                number: 1,
                state: WindowState::Pending,
                next_action_at: Some(day(3)),
                updated_at: t0(),
                notices: None,
                relaunch: None,
            }];
            // (Its block, cr-1, days 3-5.)
            let mut paid = block_starting(day(3), ReservationState::Scheduled);
            paid.segments[0].end = day(5);
            w.store.insert_reservation(&r1.request_id, paid);
        }
        w.store.insert_record(r1);
        w.events.clear();

        // WHEN r2 wants llm from day 4 to day 9
        s.handle(submitted(SOURCE, "e2", endpoint("r2", "llm", 4, 9)))
            .await
            .unwrap();

        if paid {
            // THEN with the paid window (to day 5) still to run, r2 is refused, naming r1 and
            // the window's end, not r1's whole interval
            let (field, message) = rejection(&w);
            assert_eq!(field, "workload.endpoint_name");
            assert!(
                message.contains("r1") && message.contains(&day(5).to_rfc3339()),
                "{message}"
            );
            // AND r3 from day 5 on is accepted
            w.events.clear();
            s.handle(submitted(SOURCE, "e3", endpoint("r3", "llm", 5, 9)))
                .await
                .unwrap();
            assert_eq!(w.events.detail_types()[0], "Capacity Request Accepted");
            assert_eq!(claimants(&w, "llm").await, ["r1", "r3"]);
        } else {
            // THEN without one, r1 has left: r2 is accepted and r1 dropped from the claim
            assert_eq!(w.events.detail_types()[0], "Capacity Request Accepted");
            assert_eq!(claimants(&w, "llm").await, ["r2"]);
        }
    }
}

#[tokio::test]
async fn a_request_that_ended_with_a_purchase_in_doubt_keeps_its_whole_interval() {
    // GIVEN r1 claiming llm from day 2 to day 9, ended (Failed) with a purchase in doubt and no
    // window: hourly reconciliation may still find the plan and record it as a window
    let w = World::new();
    let s = w.searcher();
    let mut r1 = ended_claimant(&w, &s).await;
    r1.doubt = Some(capacity_pilot::ports::Doubt {
        offering_ids: vec!["tp-offer".into()],
        since: t0(),
    });
    w.store.insert_record(r1);
    w.events.clear();

    // WHEN r2 wants llm from day 4 to day 9
    s.handle(submitted(SOURCE, "e2", endpoint("r2", "llm", 4, 9)))
        .await
        .unwrap();

    // THEN it is refused, naming r1 and its whole interval
    let (field, message) = rejection(&w);
    assert_eq!(field, "workload.endpoint_name");
    assert!(
        message.contains("request r1") && message.contains(&day(9).to_rfc3339()),
        "{message}"
    );
}

#[tokio::test]
async fn two_submissions_racing_for_one_name_cannot_both_be_recorded() {
    // GIVEN a store whose calls interleave, two searchers
    let w = World::new();
    w.store.interleave();
    let (a, b) = (w.searcher(), w.searcher());

    // WHEN r1 and r2 name llm over one interval at the same moment (both read it unclaimed)
    let (ra, rb) = tokio::join!(
        a.handle(submitted(SOURCE, "e1", endpoint("r1", "llm", 2, 9))),
        b.handle(submitted(SOURCE, "e2", endpoint("r2", "llm", 2, 9))),
    );
    ra.unwrap();
    rb.unwrap();

    // THEN exactly one is recorded and claims it; the other is rejected naming it
    let recorded: Vec<bool> = [
        w.store
            .get_request(&request_id("r1"))
            .await
            .unwrap()
            .is_some(),
        w.store
            .get_request(&request_id("r2"))
            .await
            .unwrap()
            .is_some(),
    ]
    .into();
    assert_eq!(recorded.iter().filter(|r| **r).count(), 1, "{recorded:?}");
    let winner = if recorded[0] { "r1" } else { "r2" };
    assert_eq!(claimants(&w, "llm").await, [winner]);
    let (field, message) = rejection(&w);
    assert_eq!(field, "workload.endpoint_name");
    assert!(message.contains(&format!("request {winner}")), "{message}");
}

#[tokio::test]
async fn a_redelivered_submission_of_a_recorded_request_is_a_duplicate_even_beside_an_overlapping_claimant()
 {
    // GIVEN r1 and r2 both recorded naming llm over one interval (as a table written before
    // claims may hold them: r2's claim put beside r1's by the upgrade)
    let w = World::new();
    let s = w.searcher();
    s.handle(submitted(SOURCE, "e1", endpoint("r1", "llm", 2, 9)))
        .await
        .unwrap();
    let mut claim = w
        .store
        .claim(&capacity_pilot::ports::ClaimKey::new(
            "us-east-1",
            "endpoint",
            "llm",
        ))
        .await
        .unwrap()
        .unwrap();
    let mut r2 = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    r2.request_id = request_id("r2");
    r2.request.id = request_id("r2");
    w.store.insert_record(r2);
    let mut second = claim.claimants[0].clone();
    second.request_id = request_id("r2");
    claim.claimants.push(second);
    assert!(
        w.store
            .write_claim(capacity_pilot::ports::ClaimWrite {
                key: capacity_pilot::ports::ClaimKey::new("us-east-1", "endpoint", "llm"),
                read: Some(claim.version),
                claimants: claim.claimants,
                made_by: None,
            })
            .await
            .unwrap()
    );
    w.events.clear();

    // WHEN r2's submission is delivered again
    let mut d = endpoint("r2", "llm", 2, 9);
    d["request_id"] = json!("r2");
    s.handle(submitted(SOURCE, "e9", d)).await.unwrap();

    // THEN it is answered as a duplicate, not rejected for r1's claim
    assert!(
        w.events
            .published_of("Capacity Request Rejected")
            .is_empty(),
        "{:?}",
        w.events.detail_types()
    );
}

#[tokio::test]
async fn a_request_that_could_pass_its_threshold_is_rejected_where_no_approver_is_configured() {
    // GIVEN a deployment with no approver (ApproverPrincipals empty: APPROVALS_ENABLED=false)
    let w = World::new();
    let mut searcher = w.searcher();
    let mut config = (*searcher.config).clone();
    config.approvals_enabled = false;
    searcher.config = Arc::new(config);

    // WHEN a request that may spend $10000 asks for approval above $8000
    let mut d = detail("r1");
    d["budget"] = json!({"max_upfront_usd": "10000", "approval_above_usd": "8000"});
    searcher.handle(submitted(SOURCE, "e1", d)).await.unwrap();

    // THEN it is rejected naming the field and the parameter, and nothing is recorded
    let (field, message) = rejection(&w);
    assert_eq!(field, "budget.approval_above_usd");
    assert!(message.contains("ApproverPrincipals"), "{message}");
    assert!(!w.recorded("r1").await);

    // AND one whose cap is within its threshold is accepted; with an approver, both are
    w.events.clear();
    let mut d = detail("r2");
    d["budget"] = json!({"max_upfront_usd": "8000", "approval_above_usd": "8000"});
    searcher.handle(submitted(SOURCE, "e2", d)).await.unwrap();
    assert_eq!(w.events.detail_types()[0], "Capacity Request Accepted");
    let mut d = detail("r3");
    d["budget"] = json!({"max_upfront_usd": "10000", "approval_above_usd": "8000"});
    w.searcher()
        .handle(submitted(SOURCE, "e3", d))
        .await
        .unwrap();
    assert!(w.recorded("r3").await);
}

#[tokio::test]
async fn a_source_not_given_a_team_by_team_sources_cannot_submit_for_it() {
    // GIVEN TEAM_SOURCES giving team-a to com.example.team-a only (both sources allowed)
    let w = World::new();
    let mut searcher = w.searcher();
    let mut config = (*searcher.config).clone();
    config
        .allowed_request_sources
        .push("com.example.team-a".into());
    config.team_sources = [("team-a".to_string(), vec!["com.example.team-a".to_string()])].into();
    searcher.config = Arc::new(config);

    // WHEN the platform's source submits for Team-A (team-a in another case)
    let mut d = detail("r1");
    d["team"] = json!("Team-A");
    searcher.handle(submitted(SOURCE, "e1", d)).await.unwrap();

    // THEN it is rejected naming team and the parameter, and nothing is recorded
    let (field, message) = rejection(&w);
    assert_eq!(field, "team");
    assert!(
        message.contains("TeamSources") && message.contains(SOURCE),
        "{message}"
    );
    assert!(!w.recorded("r1").await);

    // AND team-a's own source may, and a team the map does not name may be submitted by any
    w.events.clear();
    searcher
        .handle(submitted("com.example.team-a", "e2", detail("r2")))
        .await
        .unwrap();
    let mut d = detail("r3");
    d["team"] = json!("team-z");
    searcher.handle(submitted(SOURCE, "e3", d)).await.unwrap();
    assert!(w.recorded("r2").await);
    assert!(w.recorded("r3").await);
}

#[tokio::test]
async fn a_request_id_used_again_after_its_archive_is_announced_under_keys_of_its_own() {
    // GIVEN r1 was submitted, announced, cancelled and archived (a minute's retention here,
    // 90 days in the table)
    let mut w = World::new();
    w.store = InMemoryStore::new().with_retention(Duration::minutes(1));
    submitted_then(&w, RequestStatus::Cancelled).await;
    w.clock.advance(Duration::minutes(2));

    // WHEN a new request takes the id
    w.searcher()
        .handle(submitted(SOURCE, "e2", detail("r1")))
        .await
        .unwrap();

    // THEN it is accepted, and its Accepted carries a key of its own: a consumer dropping
    // duplicates would have dropped it as the first r1's (review N14: versions restart at 1)
    let accepted = w.events.published_of("Capacity Request Accepted");
    assert_eq!(accepted.len(), 2, "{accepted:?}");
    assert_ne!(
        accepted[0].detail["event_key"],
        accepted[1].detail["event_key"]
    );
}
