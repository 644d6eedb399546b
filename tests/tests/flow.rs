//! Whole flows through the real handlers and the real adapters: search-offerings and
//! purchase-capacity against the offline emulator (EC2, SageMaker, EventBridge and its
//! clock) and moto's DynamoDB. No fakes. Outcomes are judged from what the emulator
//! holds and what reached the bus, as well as from the table.

use std::sync::Arc;

use aws_config::BehaviorVersion;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_sdk_dynamodb::config::{Credentials, Region};
use capacity_pilot::aws::capacity::AwsMarket;
use capacity_pilot::aws::clock::ConfiguredClock;
use capacity_pilot::aws::dynamodb::DynamoStore;
use capacity_pilot::aws::eventbridge::EventBridgeSink;
use capacity_pilot::config::Config;
use capacity_pilot::domain::money::Usd;
use capacity_pilot::domain::request::{RequestId, Team};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::{BudgetMonth, Store};
use chrono::{DateTime, Utc};
use integration_tests::table::TestTable;
use local_cloud::{Fault, FaultKind, LocalCloud, Options};
use purchase_capacity::handler::Purchaser;
use search_offerings::handler::Searcher;
use serde_json::{Value, json};

const BUS: &str = "capacity-pilot";
const SOURCE: &str = "com.example.ml-platform";

fn t0() -> DateTime<Utc> {
    "2026-12-01T09:00:00Z".parse().unwrap()
}

struct Flow {
    cloud: LocalCloud,
    table: TestTable,
    searcher: Searcher<DynamoStore, AwsMarket, EventBridgeSink, ConfiguredClock>,
    purchaser: Purchaser<DynamoStore, AwsMarket, EventBridgeSink, ConfiguredClock>,
}

impl Flow {
    /// The production constructors, each pointed at this test's own emulator and table.
    async fn start() -> Flow {
        let cloud = LocalCloud::start(Options {
            seed: 11,
            start: Some(t0()),
            ..Options::default()
        })
        .await
        .expect("emulator starts");
        let table = TestTable::fresh().await.expect("moto and a table");
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .endpoint_url(cloud.url())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("AKIDTEST", "secret", None, None, "flow"))
            .load()
            .await;
        let env = [
            ("TABLE_NAME", table.name.clone()),
            ("EVENT_BUS_NAME", BUS.to_string()),
            ("ALLOWED_REGIONS", "us-east-1".to_string()),
            ("ALLOWED_REQUEST_SOURCES", SOURCE.to_string()),
            ("APPROVER_SOURCES", "com.example.approvals".to_string()),
            ("TEAM_BUDGETS_USD", r#"{"*": "250000"}"#.to_string()),
            (
                "SAGEMAKER_EXECUTION_ROLE_ARN",
                "arn:aws:iam::123456789012:role/sm".to_string(),
            ),
            (
                "CAPACITY_PILOT_CLOCK_URL",
                format!("{}/_local/clock", cloud.url()),
            ),
        ];
        let config = Arc::new(
            Config::from_lookup(&|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
                .expect("config"),
        );
        let clock = || ConfiguredClock::from_url(config.clock_url.as_deref()).expect("clock");
        Flow {
            searcher: Searcher {
                store: table.store(),
                market: AwsMarket::new(&sdk, config.prices.clone()),
                events: EventBridgeSink::new(&sdk, BUS),
                clock: clock(),
                config: config.clone(),
            },
            purchaser: Purchaser {
                store: table.store(),
                market: AwsMarket::new(&sdk, config.prices.clone()),
                events: EventBridgeSink::new(&sdk, BUS),
                clock: clock(),
                config: config.clone(),
            },
            cloud,
            table,
        }
    }

    fn bus(&self, detail_type: &str) -> Vec<Value> {
        self.cloud
            .events(BUS)
            .into_iter()
            .filter(|e| e["detail-type"] == detail_type)
            .collect()
    }

    /// Capacity reservations the emulator holds for a request, by its tag: the emulator's
    /// own state, independent of our table.
    fn reservations_for(&self, request_id: &str) -> usize {
        self.cloud.with_world(|w| {
            w.ec2
                .reservations
                .values()
                .filter(|cr| {
                    cr.tags.get("capacity-pilot:request-id").map(String::as_str) == Some(request_id)
                })
                .count()
        })
    }

    async fn status(&self, id: &str) -> RequestStatus {
        self.table
            .store()
            .get_request(&RequestId::parse(id).unwrap())
            .await
            .unwrap()
            .expect("recorded")
            .status
    }
}

fn request(id: &str) -> Value {
    json!({
        "schema_version": 1, "request_id": id, "team": "team-a",
        "instance_types": ["p5.48xlarge"], "instance_count": 4, "duration_hours": 48,
        "earliest_start": "2026-12-02T00:00:00Z", "latest_end": "2026-12-20T11:30:00Z",
        "regions": ["us-east-1"],
        "budget": {"max_upfront_usd": "20000"},
        "workload": {"kind": "ec2-instances",
            "launch_template": {"id": "lt-0abcdef1234567890"},
            "subnet_ids": ["subnet-0a1b2c3d4e5f60001"]}
    })
}

fn envelope(detail_type: &str, source: &str, id: &str, detail: Value) -> EventBridgeEvent<Value> {
    serde_json::from_value(json!({
        "version": "0", "id": id, "detail-type": detail_type, "source": source,
        "account": "123456789012", "time": "2026-12-01T09:00:00Z", "region": "us-east-1",
        "resources": [], "detail": detail
    }))
    .unwrap()
}

/// Delivers the bus's `Capacity Offerings Found` for `id` to purchase-capacity, as the rule would.
async fn deliver_offerings_found(f: &Flow, id: &str) {
    let found = f
        .bus("Capacity Offerings Found")
        .into_iter()
        .find(|e| e["detail"]["request_id"] == id)
        .expect("offerings found on the bus");
    let ev: EventBridgeEvent<Value> = serde_json::from_value(found).unwrap();
    f.purchaser.handle(ev).await.expect("purchase runs");
}

#[tokio::test]
async fn a_request_is_searched_bought_once_and_announced_on_the_bus() {
    // GIVEN the emulator's market and a fresh table
    let f = Flow::start().await;

    // WHEN a request arrives and the Offerings Found event reaches purchase-capacity
    f.searcher
        .handle(envelope(
            "Capacity Request Submitted",
            SOURCE,
            "e1",
            request("flow-1"),
        ))
        .await
        .expect("search runs");
    assert_eq!(f.status("flow-1").await, RequestStatus::OfferingsFound);
    deliver_offerings_found(&f, "flow-1").await;
    // ... and again, as EventBridge may deliver twice
    deliver_offerings_found(&f, "flow-1").await;

    // THEN exactly one block was bought, tagged for the request, and the bus says so
    assert_eq!(f.status("flow-1").await, RequestStatus::Reserved);
    assert_eq!(f.reservations_for("flow-1"), 1);
    let reserved = f.bus("Capacity Reserved");
    assert_eq!(reserved.len(), 1, "{reserved:?}");
    let fee = Usd::parse(reserved[0]["detail"]["upfront_fee_usd"].as_str().unwrap()).unwrap();
    let best = &f.bus("Capacity Offerings Found")[0]["detail"]["plans"][0];
    assert_eq!(
        best["upfront_fee_usd"],
        reserved[0]["detail"]["upfront_fee_usd"]
    );
    assert_eq!(
        f.bus("Capacity Request Accepted").len(),
        1,
        "accepted is published once"
    );
    // AND the team's ledger holds exactly the fee
    let spent = f
        .table
        .store()
        .budget_spent(&Team::parse("team-a").unwrap(), &BudgetMonth::of(t0()))
        .await
        .unwrap();
    assert_eq!(spent, fee.to_micros_ceil());
}

#[tokio::test]
async fn a_purchase_whose_response_is_lost_is_adopted_not_bought_twice() {
    let f = Flow::start().await;
    f.searcher
        .handle(envelope(
            "Capacity Request Submitted",
            SOURCE,
            "e1",
            request("flow-2"),
        ))
        .await
        .unwrap();
    // GIVEN AWS performs the next purchase but the response never arrives
    f.cloud.inject(Fault {
        operation: "PurchaseCapacityBlock".into(),
        kind: FaultKind::LostResponse,
        count: Some(1),
    });

    deliver_offerings_found(&f, "flow-2").await;

    // THEN the SDK did not retry the purchase, reconciliation found the block by its tag,
    // and the request is reserved with it
    assert_eq!(f.reservations_for("flow-2"), 1);
    assert_eq!(f.status("flow-2").await, RequestStatus::Reserved);
    let reserved = f.bus("Capacity Reserved");
    assert_eq!(reserved.len(), 1);
    assert_eq!(reserved[0]["detail"]["adopted"], true);
}

#[tokio::test]
async fn an_invalid_request_is_rejected_on_the_bus_naming_every_field() {
    let f = Flow::start().await;
    let mut bad = request("flow-3");
    bad["instance_count"] = json!(65);
    bad["regions"] = json!(["mars-central-1"]);
    f.searcher
        .handle(envelope("Capacity Request Submitted", SOURCE, "e1", bad))
        .await
        .unwrap();
    let rejected = f.bus("Capacity Request Rejected");
    assert_eq!(rejected.len(), 1);
    let fields: Vec<&str> = rejected[0]["detail"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["instance_count", "regions[0]"]);
    assert_eq!(rejected[0]["source"], "capacity-pilot");
}
