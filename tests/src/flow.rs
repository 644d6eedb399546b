//! Whole flows: the five handlers, each built with the production wiring
//! (`Adapters::from_sdk`) pointed at this test's own `local-cloud` (EC2, SageMaker,
//! EventBridge and the simulated clock) and its own table on moto's DynamoDB. No fakes.
//!
//! [`Flow::deliver`] plays EventBridge with the rules of `infra/template.yaml`, matched with
//! quamina: it hands every event that reached a bus since the last call to each function
//! whose rule matches it. Outcomes are judged from the emulator's state and the events on
//! its buses, as well as the table.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex};

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_sdk_dynamodb::config::{Credentials, Region};
use capacity_pilot::aws::capacity::{AwsMarket, AwsWorkloads};
use capacity_pilot::aws::clock::ConfiguredClock;
use capacity_pilot::aws::dynamodb::DynamoStore;
use capacity_pilot::aws::eventbridge::EventBridgeSink;
use capacity_pilot::aws::sns::SnsNotices;
use capacity_pilot::aws::wiring::Adapters;
use capacity_pilot::config::Config;
use capacity_pilot::domain::money::MicroUsd;
use capacity_pilot::domain::request::{RequestId, Team};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ids::SeededIds;
use capacity_pilot::outbox::Announcing;
use capacity_pilot::ports::{BudgetMonth, RequestRecord, Store, WallDeadline, default_sleep};
use chrono::{DateTime, Utc};
use cleanup_expired::handler::Cleaner;
use launch_workloads::handler::Launcher;
use local_cloud::rules::{Bus, Rules};
use local_cloud::{LocalCloud, Options};
use purchase_capacity::handler::Purchaser;
use replace_unhealthy::handler::Replacer;
use search_offerings::handler::Searcher;
use serde_json::{Value, json};

use crate::in_process::{self, InProcess};
use crate::moto::workspace_root;
use crate::reads::Reads;
use crate::recorder::{Calls, Operation};
use crate::table::TestTable;

/// How [`Flow::invoke`]'s error starts when the invocation outlived its function timeout.
pub const TIMED_OUT: &str = "Task timed out";

/// Our custom bus; AWS's events and schedules are on `default`.
pub const BUS: &str = "capacity-pilot";
/// The request source the flows' config allows.
pub const SOURCE: &str = "com.example.ml-platform";
pub const APPROVER: &str = "com.example.approvals";
pub const REGION: &str = "us-east-1";
/// The notices topic the flows' functions publish to (created in the emulator at start).
pub const NOTICES_TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:capacity-pilot-notices";

/// Which function an event reaches, by the rules of ARCHITECTURE section 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Function {
    Search,
    Purchase,
    Launch,
    Replace,
    Cleanup,
}

impl Function {
    pub const ALL: [Function; 5] = [
        Function::Search,
        Function::Purchase,
        Function::Launch,
        Function::Replace,
        Function::Cleanup,
    ];

    /// The function's crate (and binary) name, as the template's `CodeUri` names it.
    pub fn crate_name(self) -> &'static str {
        match self {
            Function::Search => "search-offerings",
            Function::Purchase => "purchase-capacity",
            Function::Launch => "launch-workloads",
            Function::Replace => "replace-unhealthy",
            Function::Cleanup => "cleanup-expired",
        }
    }

    /// The functions the template's rules deliver an event on `bus` to (`BUS` or
    /// `"default"`), matched with quamina as EventBridge matches them.
    pub fn for_event(bus: &str, ev: &Value) -> Vec<Function> {
        let bus = if bus == BUS {
            Bus::Custom
        } else {
            Bus::Default
        };
        RULES
            .functions_for(bus, ev)
            .iter()
            .map(|name| {
                Function::ALL
                    .into_iter()
                    .find(|f| f.crate_name() == name)
                    .unwrap_or_else(|| panic!("the template wires {name}, which no Function names"))
            })
            .collect()
    }
}

/// The rules of `infra/template.yaml`: the flows route events as the deployment would.
static RULES: LazyLock<Rules> = LazyLock::new(|| {
    Rules::from_template(&workspace_root().join("infra/template.yaml"))
        .expect("the template's rules")
});

/// The rules of `infra/region-forwarder.yaml`, deployed in every allowed region but home.
static FORWARDER: LazyLock<Rules> = LazyLock::new(|| {
    Rules::from_template(&workspace_root().join("infra/region-forwarder.yaml"))
        .expect("the forwarder's rules")
});

/// Every flow's recorders, by function, for [`observed`].
static RECORDED: Mutex<Vec<(Function, Calls)>> = Mutex::new(Vec::new());

/// The AWS operations each function has made in every flow of this process so far.
pub fn observed() -> BTreeMap<Function, BTreeSet<Operation>> {
    let mut out: BTreeMap<Function, BTreeSet<Operation>> = BTreeMap::new();
    for (f, calls) in RECORDED.lock().unwrap().iter() {
        out.entry(*f).or_default().extend(calls.seen());
    }
    out
}

/// The bus and the notices topic, as the functions publish.
pub type Events = Announcing<EventBridgeSink, SnsNotices>;

type Sdk = (
    DynamoStore,
    AwsMarket,
    AwsWorkloads,
    Events,
    ConfiguredClock,
);

pub struct Flow {
    pub cloud: LocalCloud,
    pub table: TestTable,
    pub config: Arc<Config>,
    pub searcher: Searcher<DynamoStore, AwsMarket, AwsWorkloads, Events, ConfiguredClock>,
    pub purchaser: Purchaser<DynamoStore, AwsMarket, Events, ConfiguredClock, AwsWorkloads>,
    pub launcher: Launcher<DynamoStore, AwsWorkloads, Events, ConfiguredClock>,
    pub replacer: Replacer<DynamoStore, AwsWorkloads, Events, ConfiguredClock>,
    pub cleaner: Cleaner<DynamoStore, AwsMarket, AwsWorkloads, Events, ConfiguredClock>,
    /// How many events of each (region, bus) [`Flow::deliver`] has looked at.
    delivered: Mutex<BTreeMap<(String, String), usize>>,
    ticks: Mutex<u64>,
    /// launch-workloads' function timeout, enforced as Lambda does: the invocation is cut
    /// off at its deadline. The template's 60 s unless a test shortens it.
    launch_timeout: Mutex<std::time::Duration>,
    /// Each function's store reads, checked against the read rule after every invocation.
    reads: BTreeMap<Function, Reads>,
    /// Each function's AWS calls.
    pub calls: BTreeMap<Function, Calls>,
}

/// Creates [`NOTICES_TOPIC`] in the emulator `sdk` points at, as the stack does: a publish
/// to a topic that does not exist is refused (`NotFound`).
pub async fn create_notices_topic(sdk: &aws_config::SdkConfig) {
    let name = NOTICES_TOPIC.rsplit(':').next().expect("a topic name");
    let arn = aws_sdk_sns::Client::new(sdk)
        .create_topic()
        .name(name)
        .send()
        .await
        .expect("the notices topic is created")
        .topic_arn
        .expect("an ARN");
    assert_eq!(arn, NOTICES_TOPIC, "the emulator's account and region");
}

/// The configuration every flow starts from; `overrides` replace or add variables.
pub fn env(table: &str, cloud_url: &str, overrides: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("TABLE_NAME", table.to_string()),
        ("EVENT_BUS_NAME", BUS.to_string()),
        ("NOTICES_TOPIC_ARN", NOTICES_TOPIC.to_string()),
        ("ALLOWED_REGIONS", REGION.to_string()),
        ("ALLOWED_REQUEST_SOURCES", SOURCE.to_string()),
        ("APPROVER_SOURCES", APPROVER.to_string()),
        ("TEAM_BUDGETS_USD", r#"{"*": "250000"}"#.to_string()),
        (
            "SAGEMAKER_EXECUTION_ROLE_ARN",
            "arn:aws:iam::123456789012:role/sm".to_string(),
        ),
        // The role of the other team's group in the shared HyperPod cluster flows.
        (
            "HYPERPOD_ROLE_ARNS",
            "arn:aws:iam::123456789012:role/infra-team".to_string(),
        ),
        (
            "CAPACITY_PILOT_CLOCK_URL",
            format!("{cloud_url}/_local/clock"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in overrides {
        env.retain(|(n, _)| n != k);
        env.push((k.to_string(), v.to_string()));
    }
    env
}

impl Flow {
    /// A flow on seed 11 starting at [`t0`], with the default configuration.
    pub async fn start() -> Flow {
        Flow::start_with(11, &[]).await
    }

    /// The production constructors, each pointed at this test's own emulator and table.
    pub async fn start_with(seed: u64, overrides: &[(&str, &str)]) -> Flow {
        Flow::start_on(seed, overrides, false).await
    }

    /// A replayable flow on `seed` (ARCHITECTURE §8.12): the EC2, SageMaker and EventBridge
    /// clients reach the emulator's router in-process, with no socket, and take their time,
    /// sleep, retry backoff (none) and idempotency token from [`crate::in_process`]; lease
    /// tokens come from the seeded id source. The same seed and steps give the same events.
    pub async fn start_in_process(seed: u64) -> Flow {
        Flow::start_on(seed, &[], true).await
    }

    async fn start_on(seed: u64, overrides: &[(&str, &str)], in_process: bool) -> Flow {
        // A replayable flow's emulator takes its latency sleeps from the same source as the
        // clients: none waits.
        let sleep = if in_process {
            aws_smithy_async::rt::sleep::SharedAsyncSleep::new(in_process::NoWait)
        } else {
            Options::default().sleep
        };
        let cloud = LocalCloud::start(Options {
            seed,
            start: Some(t0()),
            sleep,
            ..Options::default()
        })
        .await
        .expect("emulator starts");
        let table = TestTable::fresh().await.expect("moto and a table");
        let env = env(&table.name, &cloud.url(), overrides);
        let config = Arc::new(
            Config::from_lookup(&|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
                .expect("config"),
        );
        let sdk = capacity_pilot::aws::wiring::sdk_loader()
            .endpoint_url(cloud.url())
            .region(Region::new(REGION))
            .credentials_provider(Credentials::new("AKIDTEST", "secret", None, None, "flow"))
            .load()
            .await;
        create_notices_topic(&sdk).await;
        // Each function gets its own adapters, as each Lambda has its own; the store is
        // this test's table on moto (production points DynamoDB elsewhere by endpoint too).
        // Each records the AWS operations it makes, for the IAM test.
        let reads: BTreeMap<Function, Reads> = Function::ALL
            .iter()
            .map(|f| (*f, Reads::default()))
            .collect();
        let calls: BTreeMap<Function, Calls> = Function::ALL
            .iter()
            .map(|f| (*f, Calls::default()))
            .collect();
        let adapters = |f: Function| -> Sdk {
            let calls = calls[&f].clone();
            RECORDED.lock().unwrap().push((f, calls.clone()));
            let store = table.store_checked(calls.http_client(), reads[&f].clone());
            if in_process {
                let ids = SeededIds::new(seed.wrapping_mul(16).wrapping_add(f as u64));
                let store = store.with_ids(Arc::new(ids));
                let http = calls.wrap(InProcess::new(cloud.router()).http_client());
                let sdk = in_process::sdk_config(http, REGION, t0().into());
                let a = Adapters::from_sdk(sdk.clone(), &config).expect("adapters");
                let (market, workloads) = in_process::seeded_adapters(
                    &sdk,
                    &config.allowed_regions,
                    config.prices.clone(),
                );
                return (store, market, workloads, a.events, a.clock);
            }
            let sdk = sdk.to_builder().http_client(calls.http_client()).build();
            let a = Adapters::from_sdk(sdk, &config).expect("adapters");
            (store, a.market, a.workloads, a.events, a.clock)
        };
        let (store, market, workloads, events, clock) = adapters(Function::Search);
        let searcher = Searcher {
            store,
            market,
            workloads,
            events,
            clock,
            config: config.clone(),
            blocks_seen: Default::default(),
        };
        let (store, market, workloads, events, clock) = adapters(Function::Purchase);
        let purchaser = Purchaser {
            store,
            market,
            events,
            workloads,
            clock,
            config: config.clone(),
            ids: Arc::new(SeededIds::new(seed.wrapping_mul(16).wrapping_add(15))),
            sleep: default_sleep(),
        };
        let (store, _, workloads, events, clock) = adapters(Function::Launch);
        let launcher = Launcher {
            store,
            workloads,
            events,
            clock,
            config: config.clone(),
        };
        let (store, _, workloads, events, clock) = adapters(Function::Replace);
        let replacer = Replacer {
            store,
            workloads,
            events,
            clock,
            config: config.clone(),
        };
        let (store, market, workloads, events, clock) = adapters(Function::Cleanup);
        let cleaner = Cleaner {
            store,
            market,
            workloads,
            events,
            clock,
            config: config.clone(),
            planted: Default::default(),
        };
        // Each function's cold start pins and checks the table's deployment id, as `main`
        // does (ARCHITECTURE §9.8), through its own recorded client.
        for store in [
            &searcher.store,
            &purchaser.store,
            &launcher.store,
            &replacer.store,
            &cleaner.store,
        ] {
            capacity_pilot::lambda::check_deployment(store, &config, t0())
                .await
                .expect("the cold start's deployment id");
        }
        Flow {
            cloud,
            table,
            config,
            searcher,
            purchaser,
            launcher,
            replacer,
            cleaner,
            delivered: Mutex::new(BTreeMap::new()),
            ticks: Mutex::new(0),
            launch_timeout: Mutex::new(std::time::Duration::from_secs(60)),
            reads,
            calls,
        }
    }

    /// Gives launch-workloads this function timeout from now on.
    pub fn set_launch_timeout(&self, timeout: std::time::Duration) {
        *self.launch_timeout.lock().unwrap() = timeout;
    }

    /// Runs one function on `ev`; the error, if any, is returned as text (Lambda would retry).
    ///
    /// Every invocation is held to the read rule: it reads no item of the table twice
    /// without writing it in between (index rows do not count).
    pub async fn invoke(&self, f: Function, ev: EventBridgeEvent<Value>) -> Result<(), String> {
        let reads = &self.reads[&f];
        reads.begin();
        let detail_type = ev.detail_type.clone();
        let result = self.run(f, ev).await;
        let again = reads.again();
        assert!(
            again.is_empty(),
            "{} on {detail_type:?} read these items again without writing them in between: \
             {again:?}",
            f.crate_name()
        );
        result
    }

    /// The function's run on `ev`, boxed here: only the invoked function's future is built
    /// and polled, in a frame of its own. Awaited in one async fn, the five handlers' futures
    /// would each take room in its frame, which in a debug build is hundreds of KiB of a test
    /// thread's 2 MiB stack, under every function's call stack.
    fn run(
        &self,
        f: Function,
        ev: EventBridgeEvent<Value>,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        match f {
            Function::Search => Box::pin(async move {
                self.searcher
                    .handle(ev)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
            Function::Purchase => Box::pin(async move {
                self.purchaser
                    .handle(ev)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
            Function::Launch => Box::pin(async move {
                let timeout = *self.launch_timeout.lock().unwrap();
                let deadline = WallDeadline::after(timeout);
                let run = self.launcher.handle_by(ev, &deadline);
                match tokio::time::timeout(timeout, run).await {
                    Ok(r) => r.map(drop).map_err(|e| e.to_string()),
                    Err(_) => Err(format!("{TIMED_OUT} after {timeout:?}")),
                }
            }),
            Function::Replace => Box::pin(async move {
                self.replacer
                    .handle(ev)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
            Function::Cleanup => Box::pin(async move {
                self.cleaner
                    .handle(ev)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        }
    }

    /// A `Scheduled Event` to `f`, with a fresh id, as its schedule rule would send.
    pub async fn tick(&self, f: Function) -> Result<(), String> {
        let n = {
            let mut t = self.ticks.lock().unwrap();
            *t += 1;
            *t
        };
        let ev = envelope(
            "Scheduled Event",
            "aws.events",
            &format!("tick-{n}"),
            json!({}),
        );
        self.invoke(f, ev).await
    }

    /// Every function's schedule fires once, in pipeline order; panics on a failed run.
    pub async fn tick_all(&self) {
        for f in Function::ALL {
            self.tick(f)
                .await
                .unwrap_or_else(|e| panic!("{f:?} tick: {e}"));
        }
    }

    /// Hands every event that reached either bus since the last call to the function whose
    /// rule matches it, until no new event arrives. Returns how many were delivered. AWS's
    /// events of the other allowed regions reach the home default bus only through the region
    /// forwarder's rules (ARCHITECTURE §8.9), as the deployment's `make deploy-forwarders`
    /// sets them up; the rest stay in their region.
    pub async fn deliver(&self) -> usize {
        let home = self.cloud.home_region();
        let others: Vec<String> = self
            .config
            .allowed_regions
            .iter()
            .filter(|r| **r != home)
            .cloned()
            .collect();
        let mut total = 0;
        loop {
            let mut new: Vec<(&str, Value)> = Vec::new();
            {
                let mut seen = self.delivered.lock().unwrap();
                let mut take = |region: &str, bus: &str| {
                    let events = self.cloud.events_in(region, bus);
                    let n = seen
                        .entry((region.to_string(), bus.to_string()))
                        .or_default();
                    let fresh = events.into_iter().skip(*n).collect::<Vec<_>>();
                    *n += fresh.len();
                    fresh
                };
                new.extend(take(&home, BUS).into_iter().map(|e| (BUS, e)));
                new.extend(take(&home, "default").into_iter().map(|e| ("default", e)));
                for region in &others {
                    new.extend(
                        take(region, "default")
                            .into_iter()
                            .filter(|e| !FORWARDER.forwarding(Bus::Default, e).is_empty())
                            .map(|e| ("default", e)),
                    );
                }
            }
            if new.is_empty() {
                return total;
            }
            for (bus, ev) in new {
                for f in Function::for_event(bus, &ev) {
                    total += 1;
                    let parsed: EventBridgeEvent<Value> =
                        serde_json::from_value(ev.clone()).expect("a bus event parses");
                    self.invoke(f, parsed)
                        .await
                        .unwrap_or_else(|e| panic!("{f:?} on {ev}: {e}"));
                }
            }
        }
    }

    /// Events of `detail_type` on our bus.
    pub fn bus(&self, detail_type: &str) -> Vec<Value> {
        self.cloud
            .events(BUS)
            .into_iter()
            .filter(|e| e["detail-type"] == detail_type)
            .collect()
    }

    /// Events of `detail_type` on our bus about request `id`.
    pub fn bus_for(&self, detail_type: &str, id: &str) -> Vec<Value> {
        self.bus(detail_type)
            .into_iter()
            .filter(|e| e["detail"]["request_id"] == id)
            .collect()
    }

    /// Capacity Blocks the emulator holds for a request, by its tag: the emulator's own
    /// state, independent of our table.
    pub fn blocks_for(&self, request_id: &str) -> usize {
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

    pub async fn record(&self, id: &str) -> RequestRecord {
        self.table
            .store()
            .get_request(&RequestId::parse(id).unwrap())
            .await
            .unwrap()
            .expect("recorded")
    }

    pub async fn status(&self, id: &str) -> RequestStatus {
        self.record(id).await.status
    }

    /// What the team's ledger holds for the month of `at`.
    pub async fn team_spent(&self, team: &str, at: DateTime<Utc>) -> MicroUsd {
        self.table
            .store()
            .budget_spent(&Team::parse(team).unwrap(), &BudgetMonth::of(at))
            .await
            .unwrap()
    }

    /// [`ec2_request`] with a launch template and subnets that exist in this emulator: its
    /// seeded GPU template and one subnet per zone, so whichever zone a block is in has one.
    /// Creates SageMaker model `name` in the flow's region, as a team would before asking for
    /// an endpoint serving it (CreateEndpointConfig and the pre-flight need it).
    pub fn create_model(&self, name: &str) {
        self.cloud
            .with_world(|w| w.sagemaker_call(REGION, "CreateModel", &json!({"ModelName": name})))
            .expect("CreateModel");
    }

    pub fn ec2_request(&self, id: &str) -> Value {
        let (template, subnets) = self.cloud.with_world(|w| {
            let template = w
                .launch_templates(REGION)
                .into_iter()
                .find(|t| t.name == "capacity-pilot-gpu")
                .expect("the seeded GPU template")
                .id;
            let subnets: Vec<String> = w.subnets(REGION).into_iter().map(|s| s.id).collect();
            (template, subnets)
        });
        let mut r = ec2_request(id);
        r["workload"]["launch_template"] = json!({ "id": template });
        r["workload"]["subnet_ids"] = json!(subnets);
        r
    }

    /// How long after its start the emulator activates a Capacity Block (ARCHITECTURE
    /// §8.10): a launch into it succeeds from then.
    pub fn activation(&self) -> chrono::TimeDelta {
        chrono::TimeDelta::seconds(
            self.cloud
                .with_world(|w| w.settings.block_activation_seconds),
        )
    }

    /// The requester's `Capacity Request Cancelled` for `id`, delivered to purchase-capacity.
    pub async fn cancel(&self, id: &str, event_id: &str) {
        self.cancel_with(id, event_id, false).await;
    }

    /// The same, asking with `stop_running` for the paid windows to be stopped too.
    pub async fn cancel_with(&self, id: &str, event_id: &str, stop_running: bool) {
        self.invoke(
            Function::Purchase,
            envelope(
                "Capacity Request Cancelled",
                SOURCE,
                event_id,
                json!({
                    "request_id": id,
                    "reason": "the work was called off",
                    "stop_running": stop_running,
                }),
            ),
        )
        .await
        .expect("purchase runs");
    }

    /// Submits a request on our bus from the allowed source and delivers it.
    pub async fn submit(&self, request: Value) {
        self.invoke(
            Function::Search,
            envelope(
                "Capacity Request Submitted",
                SOURCE,
                &format!("submit-{}", request["request_id"].as_str().unwrap_or("?")),
                request,
            ),
        )
        .await
        .expect("search runs");
    }
}

/// When every flow's simulated clock starts.
pub fn t0() -> DateTime<Utc> {
    "2026-12-01T09:00:00Z".parse().unwrap()
}

/// An EventBridge envelope as a rule delivers it.
pub fn envelope(
    detail_type: &str,
    source: &str,
    id: &str,
    detail: Value,
) -> EventBridgeEvent<Value> {
    serde_json::from_value(json!({
        "version": "0", "id": id, "detail-type": detail_type, "source": source,
        "account": "123456789012", "time": "2026-12-01T09:00:00Z", "region": REGION,
        "resources": [], "detail": detail
    }))
    .unwrap()
}

/// An inference-endpoint request on a training plan serving `model`: 1 x ml.p5.48xlarge for
/// 24 h in December, the endpoint named `model` too.
pub fn endpoint_request(id: &str, model: &str) -> Value {
    json!({
        "schema_version": 1, "request_id": id, "team": "team-c",
        "instance_types": ["ml.p5.48xlarge"], "instance_count": 1, "duration_hours": 24,
        "earliest_start": "2026-12-02T00:00:00Z", "latest_end": "2026-12-20T11:30:00Z",
        "regions": [REGION],
        "budget": {"max_upfront_usd": "5000"},
        "workload": {"kind": "inference-endpoint", "model_name": model,
            "endpoint_name": model, "variant_name": "primary"},
        "drain_minutes": 20
    })
}

/// A valid EC2 Capacity Block request: 4 x p5.48xlarge for 48 h in December.
pub fn ec2_request(id: &str) -> Value {
    json!({
        "schema_version": 1, "request_id": id, "team": "team-a",
        "instance_types": ["p5.48xlarge"], "instance_count": 4, "duration_hours": 48,
        "earliest_start": "2026-12-02T00:00:00Z", "latest_end": "2026-12-20T11:30:00Z",
        "regions": [REGION],
        "budget": {"max_upfront_usd": "20000"},
        "workload": {"kind": "ec2-instances",
            "launch_template": {"id": "lt-0abcdef1234567890"},
            "subnet_ids": ["subnet-0a1b2c3d4e5f60001"]}
    })
}
