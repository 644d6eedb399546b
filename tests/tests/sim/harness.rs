//! The simulated system: the five production handlers and their production adapters, the
//! SDK clients reaching local-cloud's world through the in-process connector, the in-memory
//! store standing in for DynamoDB (ARCHITECTURE §8.15, backed by `store_diff`), EventBridge
//! routing by the template's rules, and Lambda's asynchronous delivery model. One thread, one
//! simulated clock, no wall time, no socket: a seed's run is a function of its scenario.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::aws::capacity::{AwsMarket, AwsWorkloads};
use capacity_pilot::aws::wiring::Adapters;
use capacity_pilot::config::Config;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::window::WindowState;
use capacity_pilot::fakes::errors;
use capacity_pilot::fakes::{Gate, InMemoryStore, ManualClock, StepDeadline};
use capacity_pilot::ids::SeededIds;
use chrono::{DateTime, TimeDelta, Utc};
use cleanup_expired::handler::Cleaner;
use integration_tests::flow::Events;
use integration_tests::in_process::{self, InProcess, NoWait};
use integration_tests::moto::workspace_root;
use launch_workloads::handler::Launcher;
use local_cloud::rules::{Bus, Rules};
use local_cloud::runner::bus::{is_tick, tick_at_or_after};
use local_cloud::{Fault, FaultKind, LocalCloud, Options, Settings};
use purchase_capacity::handler::Purchaser;
use replace_unhealthy::handler::Replacer;
use search_offerings::handler::Searcher;
use serde_json::{Value, json};

use super::checks;
use super::scenario::{
    ApiFaultKind, Approver, DeliveryFault, FUNCTIONS, Outage, RaceWith, Scenario, t0,
};

pub const REGION: &str = "us-east-1";
pub const BUS: &str = "capacity-pilot";
pub const SOURCE: &str = "com.example.ml-platform";
pub const APPROVER: &str = "com.example.approvals";
pub const FORGER: &str = "com.example.mallory";

/// The template's rules, read once per process.
static RULES: std::sync::LazyLock<Rules> = std::sync::LazyLock::new(|| {
    Rules::from_template(&workspace_root().join("infra/template.yaml"))
        .expect("the template's rules")
});

/// How often every schedule fires whether or not it has work (its other quiet ticks are
/// skipped: issue 20 showed a quiet tick reads at most once and writes nothing).
const SWEEP: TimeDelta = TimeDelta::hours(6);

/// One function invocation waiting to happen.
#[derive(Debug, Clone)]
struct Pending {
    function: String,
    event: Value,
    /// 0 for the first try; Lambda retries a failed asynchronous invocation twice.
    attempt: u32,
}

/// Something the scenario or the harness's actors do at a time.
#[derive(Debug, Clone)]
enum Act {
    /// A request submitted; with `true`, capped at its quote first.
    Submit(Value, bool),
    Cancel(usize),
    Market(usize),
    ApiFault(usize),
    StoreFault(usize),
    /// The approver answers.
    Put {
        source: String,
        detail_type: String,
        detail: Value,
    },
    FailInstance {
        request: usize,
        index: usize,
        impair: bool,
    },
    Settle,
    /// A team extends its request's reservation by hand in the console, by `hours`.
    ConsoleExtend {
        request: usize,
        hours: i64,
    },
    /// A team asks capacity-pilot to extend its request's reservation by `hours`.
    AskExtension {
        request: usize,
        hours: i64,
    },
    /// The next extension payment of the request's live reservations fails.
    FailExtensionPayment {
        request: usize,
    },
    /// An operator pauses purchases (the scenario's pause of that index), or resumes them.
    Pause(usize),
    Resume,
}

/// An inbound event (ours from a requester or approver) that reached a function and was
/// handled: outcomes that depend on inbound events are judged against these.
#[derive(Debug, Clone)]
pub struct Delivered {
    pub at: DateTime<Utc>,
    pub event: Value,
    /// The invocation returned success. One that failed or died after it began may still
    /// have acted on the event: an approval it began with grants as much as one handled.
    pub handled: bool,
}

type Store = InMemoryStore;
type Clock = ManualClock;

/// The five production handlers of the simulated system.
struct Handlers {
    searcher: Searcher<Store, AwsMarket, AwsWorkloads, Events, Clock>,
    purchaser: Purchaser<Store, AwsMarket, Events, Clock, AwsWorkloads>,
    launcher: Launcher<Store, AwsWorkloads, Events, Clock>,
    replacer: Replacer<Store, AwsWorkloads, Events, Clock>,
    cleaner: Cleaner<Store, AwsMarket, AwsWorkloads, Events, Clock>,
}

type Decisions = Result<Vec<capacity_pilot::decision::Decision>, String>;
type Run<'a> = Pin<Box<dyn Future<Output = Decisions> + 'a>>;

impl Handlers {
    /// `function`'s invocation with `ev`, as a future not yet polled.
    fn call(&self, function: &str, ev: EventBridgeEvent<Value>) -> Run<'_> {
        fn out<O, E: std::fmt::Display>(
            r: Result<O, E>,
            decisions: impl FnOnce(O) -> Vec<capacity_pilot::decision::Decision>,
        ) -> Decisions {
            r.map(decisions).map_err(|e| e.to_string())
        }
        match function {
            "search-offerings" => {
                Box::pin(async move { out(self.searcher.handle(ev).await, |o| o.decisions) })
            }
            "purchase-capacity" => {
                Box::pin(async move { out(self.purchaser.handle(ev).await, |o| o.decisions) })
            }
            "launch-workloads" => Box::pin(async move {
                out(
                    self.launcher.handle_by(ev, &StepDeadline::plenty()).await,
                    |o| o.decisions,
                )
            }),
            "replace-unhealthy" => {
                Box::pin(async move { out(self.replacer.handle(ev).await, |o| o.decisions) })
            }
            "cleanup-expired" => {
                Box::pin(async move { out(self.cleaner.handle(ev).await, |o| o.decisions) })
            }
            other => panic!("the template routes to {other}, which the simulation lacks"),
        }
    }
}

/// How one of the invocations run together came out.
enum Ran {
    Done(Decisions),
    /// It died: where.
    Crashed(String),
}

/// Runs `runs` together to their ends, the `i`th dying at its port call `crash_at[i]` (or
/// after its last, with fewer calls). Run alone, an invocation goes straight through; run
/// together, each port call yields, and `order` draws whose call goes next.
async fn drive(gate: &Gate, runs: Vec<Run<'_>>, crash_at: &[Option<u32>], order: u64) -> Vec<Ran> {
    gate.arm(crash_at, runs.len() > 1);
    let mut runs: Vec<Option<Run<'_>>> = runs.into_iter().map(Some).collect();
    let mut out: Vec<Option<Ran>> = runs.iter().map(|_| None).collect();
    let mut draw = order;
    std::future::poll_fn(|cx| {
        loop {
            let live: Vec<usize> = (0..runs.len()).filter(|i| runs[*i].is_some()).collect();
            if live.is_empty() {
                return Poll::Ready(());
            }
            draw = capacity_pilot::ids::mix(draw);
            let i = live[(draw % live.len() as u64) as usize];
            gate.enter(i);
            let run = runs[i].as_mut().expect("live");
            match run.as_mut().poll(cx) {
                Poll::Ready(r) => {
                    let calls = gate.calls(i);
                    out[i] = Some(match gate.crash_at(i) {
                        Some(k) if calls <= k => Ran::Crashed(match gate.last(i) {
                            Some(l) => format!("after its last call (of {calls}), right after {l}"),
                            None => "after its last call (it made none)".to_string(),
                        }),
                        _ => Ran::Done(r),
                    });
                    runs[i] = None;
                }
                Poll::Pending => match gate.crashed(i) {
                    Some(at) => {
                        // Dropped where it stands: nothing after the call runs.
                        out[i] = Some(Ran::Crashed(at));
                        runs[i] = None;
                    }
                    // A yield (it woke itself) or a wait on the runtime.
                    None => return Poll::Pending,
                },
            }
        }
    })
    .await;
    gate.disarm();
    out.into_iter()
        .map(|o| o.expect("every run ends"))
        .collect()
}

pub struct Sim {
    pub scenario: Scenario,
    pub cloud: LocalCloud,
    pub store: Store,
    pub clock: Clock,
    pub config: Arc<Config>,
    handlers: Handlers,
    /// Every port call of an invocation passes it: crash points and interleavings.
    gate: Gate,
    /// Invocations per function in the fault hours: the scenario's crashes and races name
    /// them by these numbers.
    nth: BTreeMap<&'static str, u64>,
    seen_default: usize,
    seen_custom: usize,
    queue: BTreeMap<(DateTime<Utc>, u64), Pending>,
    acts: BTreeMap<(DateTime<Utc>, u64), Act>,
    seq: u64,
    deliveries: u64,
    ticks: u64,
    faults_on: bool,
    /// Requests whose first launch the harness has seen (their instance failures armed).
    launched: BTreeSet<usize>,
    /// Awaiting-approval keys the approver has answered.
    answered: BTreeSet<String>,
    pub trace: Vec<String>,
    pub violations: Vec<String>,
    /// Events whose every delivery failed or was dropped: the DLQ of their rule or function.
    pub dlq: Vec<Value>,
    pub delivered: Vec<Delivered>,
    pub invocations: u64,
    /// Invocations per (function, trigger), for sizing the scenarios.
    pub by_function: BTreeMap<(String, String), u64>,
    /// What the run reached (published detail-types, retries, the DLQ, faults that struck),
    /// for the generators' reach check.
    pub reached: BTreeSet<String>,
    /// The windows drained so far, as (reservation, window number).
    pub drained: BTreeSet<(String, u64)>,
    /// The requests whose purchase in doubt was resolved at its offering's end with nothing
    /// listed: its debit is kept spent for a person to check (`checks::unverified`).
    pub unverified: BTreeSet<String>,
    /// Per request, the debit its purchase in doubt held when last seen (micro-USD): what is
    /// kept unverified if nothing is listed. An on-demand-first request's is told apart from
    /// what its run spent by it (a spot run that fell back, then bought in doubt).
    pub doubt_debits: BTreeMap<String, i64>,
    /// The requests whose purchase ended in doubt: its lease could not reconcile, so a stray
    /// listed for it is the detector's to announce, not a lease's to adopt.
    pub ended_in_doubt: BTreeSet<String>,
    /// The foreign resources set up at the start, as they were.
    pub foreign: checks::Foreign,
    /// What purchase-capacity's invocations asked to sleep (its retries' backoff).
    slept: Tally,
    /// The scenario's refused purchase calls, armed as their occurrences come.
    refusing: Refusing,
    /// The requests whose purchase doubt the harness forgot ([`Scenario::legacy_doubt`]).
    legacy: BTreeSet<String>,
    /// The requests cancelled while holding a paid window ([`Scenario::cancel_kept`]).
    cancelled_kept: BTreeSet<String>,
    /// The requests whose running window was asked stopped ([`Scenario::stop_running`]).
    stop_asked: BTreeSet<String>,
    /// purchase-capacity's purchase calls in the batch running.
    purchase_calls: PurchaseCalls,
    /// The instances terminated in the batch running, and by whom.
    terminations: Terminations,
    /// Each request's purchase lease token as last seen, to judge each new lease when written.
    leases: BTreeMap<String, String>,
    /// (request, when) for each purchase lease taken, as the steps saw them.
    pub lease_times: Vec<(String, DateTime<Utc>)>,
    /// (reservation, when) for each reservation a team extended by hand in the console.
    pub extended: Vec<(String, DateTime<Utc>)>,
    /// (request, when) for each purchase a takeover released because no lease of it called
    /// AWS: the leases before it never reconciled (seed 746).
    pub uncalled_releases: Vec<(String, DateTime<Utc>)>,
    /// The strays bought so far.
    pub strays: Vec<checks::Stray>,
    /// Promises broken inside an invocation or at a write, for the next step's checks.
    pub problems: Vec<String>,
    /// (when, request, decision) for each decision that names a purchase AWS refused for
    /// good ([`REFUSAL`]).
    pub refusals: Vec<(DateTime<Utc>, String, String)>,
}

/// The message of a purchase refused for good (the scenario's `refused` calls and its
/// `refuse_later_block`).
pub const REFUSAL: &str = "the simulation refuses this purchase for good";

/// Arms a refusal right before the scenario's refused occurrences of a purchase call, in
/// the fault hours, through the emulator's control API (`POST /_local/faults`).
#[derive(Clone)]
struct Refusing {
    targets: Arc<Vec<(&'static str, u32)>>,
    seen: Arc<std::sync::Mutex<BTreeMap<String, u32>>>,
    /// Whether the first block bought second in its invocation is still to be refused, and
    /// the blocks bought so far in the invocation running (reset by [`Refusing::batch`]).
    later_block: Arc<std::sync::Mutex<(bool, u32)>>,
    on: Arc<std::sync::atomic::AtomicBool>,
    router: axum::Router,
}

impl Refusing {
    fn new(scenario: &Scenario, router: axum::Router) -> Refusing {
        Refusing {
            targets: Arc::new(scenario.refused.clone()),
            seen: Arc::default(),
            later_block: Arc::new(std::sync::Mutex::new((scenario.refuse_later_block, 0))),
            on: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            router,
        }
    }

    fn stop(&self) {
        self.on.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// A new invocation (or batch run together) begins.
    fn batch(&self) {
        self.later_block.lock().unwrap_or_else(|p| p.into_inner()).1 = 0;
    }

    async fn before(&self, op: &str) {
        if !matches!(op, "PurchaseCapacityBlock" | "CreateTrainingPlan")
            || !self.on.load(std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let later = op == "PurchaseCapacityBlock" && {
            let mut l = self.later_block.lock().unwrap_or_else(|p| p.into_inner());
            l.1 += 1;
            let hit = l.0 && l.1 == 2;
            if hit {
                l.0 = false;
            }
            hit
        };
        let n = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let n = seen.entry(op.to_string()).or_default();
            *n += 1;
            *n - 1
        };
        if !later && !self.targets.contains(&(op, n)) {
            return;
        }
        // What EC2 and SageMaker answer a request they will not serve (HTTP 400, nothing
        // performed), which the adapters read as a refusal, not as a passing failure.
        let fault = Fault {
            operation: op.to_string(),
            kind: FaultKind::Error {
                status: 400,
                code: if op == "CreateTrainingPlan" {
                    "ValidationException"
                } else {
                    "InvalidParameterValue"
                }
                .to_string(),
                message: REFUSAL.to_string(),
            },
            count: Some(1),
        };
        let request = http::Request::post("/_local/faults")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(
                serde_json::to_vec(&fault).expect("a fault serializes"),
            ))
            .expect("a request");
        let answer = tower::ServiceExt::oneshot(self.router.clone(), request)
            .await
            .unwrap_or_else(|never| match never {});
        assert!(
            answer.status().is_success(),
            "the fault is armed: {answer:?}"
        );
    }
}

/// A sleep that returns at once and adds up what it was asked to wait.
#[derive(Debug, Clone, Default)]
struct Tally(Arc<std::sync::Mutex<std::time::Duration>>);

impl Tally {
    fn take(&self) -> std::time::Duration {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl aws_smithy_async::rt::sleep::AsyncSleep for Tally {
    fn sleep(&self, d: std::time::Duration) -> aws_smithy_async::rt::sleep::Sleep {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) += d;
        aws_smithy_async::rt::sleep::Sleep::new(std::future::ready(()))
    }
}

/// The `TerminateInstances` calls of the batch running: (the invocation's index in its batch,
/// the instances named, every window not ended as the store held it at the call: (request,
/// reservation, state)).
#[derive(Debug, Clone, Default)]
struct Terminations(Arc<std::sync::Mutex<Vec<Terminated>>>);

type Terminated = (usize, Vec<String>, Vec<(String, String, WindowState)>);

impl Terminations {
    fn sent(&self, invocation: usize, body: &[u8], store: &InMemoryStore) {
        let form = serde_urlencoded::from_bytes::<Vec<(String, String)>>(body).unwrap_or_default();
        let ids: Vec<String> = form
            .into_iter()
            .filter(|(k, _)| k.starts_with("InstanceId."))
            .map(|(_, v)| v)
            .collect();
        let windows = store
            .records()
            .into_iter()
            .flat_map(|r| {
                let id = r.request_id.to_string();
                r.windows
                    .into_iter()
                    .filter(|w| w.state != WindowState::Ended)
                    .map(move |w| (id.clone(), w.reservation_id().to_string(), w.state))
            })
            .collect();
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((invocation, ids, windows));
    }

    fn take(&self) -> Vec<Terminated> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// purchase-capacity's `PURCHASE_ATTEMPTS`: the calls one purchase makes at most, its first
/// and the retries of a throttle (AWS did not process a throttled call).
const PURCHASE_ATTEMPTS: u32 = 3;

/// The purchase calls each invocation of the batch running has sent, by (invocation, body):
/// one offering bought for one request, whose retries send the same body.
#[derive(Debug, Clone, Default)]
struct PurchaseCalls(Arc<std::sync::Mutex<BTreeMap<SentBody, u32>>>);

/// A request body one invocation sent: (the invocation's index in its batch, the body).
type SentBody = (usize, Vec<u8>);

impl PurchaseCalls {
    fn sent(&self, invocation: usize, op: &str, body: &[u8]) {
        if matches!(op, "PurchaseCapacityBlock" | "CreateTrainingPlan") {
            *self
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry((invocation, body.to_vec()))
                .or_default() += 1;
        }
    }

    /// The purchases sent more than [`PURCHASE_ATTEMPTS`] times by one invocation since the
    /// last take: (the offering they name, how many times).
    fn take_overrun(&self) -> Vec<(String, u32)> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
            .into_iter()
            .filter(|(_, n)| *n > PURCHASE_ATTEMPTS)
            .map(|((_, body), n)| (offering_named(&body), n))
            .collect()
    }
}

/// The offering a purchase call's body names (EC2's form or SageMaker's JSON).
fn offering_named(body: &[u8]) -> String {
    let form = serde_urlencoded::from_bytes::<Vec<(String, String)>>(body).unwrap_or_default();
    form.into_iter()
        .find(|(k, _)| k == "CapacityBlockOfferingId")
        .map(|(_, v)| v)
        .or_else(|| {
            serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| v["TrainingPlanOfferingId"].as_str().map(str::to_string))
        })
        .unwrap_or_else(|| "?".to_string())
}

/// purchase-capacity's `Timeout` in infra/template.yaml: its invocations' waits must end
/// within it, or Lambda kills the invocation mid-protocol every time.
const PURCHASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The Capacity Block offerings AWS gives now for `count` x `ty` over exactly `hours`,
/// starting within `window` and past the purchase lead, by the emulator's own rules (what
/// `DescribeCapacityBlockOfferings` answers).
fn block_offers(
    w: &local_cloud::World,
    now: DateTime<Utc>,
    ty: &str,
    count: i64,
    hours: i64,
    (earliest, latest): (DateTime<Utc>, DateTime<Utc>),
) -> Vec<local_cloud::market::BlockOffering> {
    let search = local_cloud::market::BlockSearch {
        region: REGION.to_string(),
        instance_type: ty.to_string(),
        instance_count: count,
        duration_hours: hours,
        start_range: Some(earliest.max(now + capacity_pilot::domain::time_rules::PURCHASE_LEAD)),
        end_range: Some(latest),
    };
    let mut offers = w.market.search_blocks(now, &search).unwrap_or_default();
    offers.retain(|o| o.duration_hours() == hours);
    offers
}

fn env(budgets: &str, extension_lead_minutes: i64) -> Vec<(String, String)> {
    let lead = extension_lead_minutes.to_string();
    [
        ("EXTENSION_PAYMENT_LEAD_MINUTES", lead.as_str()),
        ("TABLE_NAME", "capacity-pilot-sim"),
        ("EVENT_BUS_NAME", BUS),
        ("NOTICES_TOPIC_ARN", integration_tests::flow::NOTICES_TOPIC),
        ("ALLOWED_REGIONS", REGION),
        ("ALLOWED_REQUEST_SOURCES", SOURCE),
        ("APPROVER_SOURCES", APPROVER),
        ("TEAM_BUDGETS_USD", budgets),
        (
            "SAGEMAKER_EXECUTION_ROLE_ARN",
            "arn:aws:iam::123456789012:role/sm",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

impl Sim {
    pub async fn new(scenario: Scenario) -> Sim {
        let seed = scenario.seed;
        let t = &scenario.timings;
        let settings = Settings {
            listing_lag_seconds: t.listing_lag_seconds,
            block_activation_seconds: t.block_activation_seconds,
            instance_listing_lag_seconds: t.instance_listing_lag_seconds,
            payment_minutes: t.payment_minutes,
            run_instances_latency_ms: 0,
            refuse_tag_filters: scenario.refuse_tag_filters,
            refusals: if scenario.spot_runs {
                vec![local_cloud::world::Refusal {
                    code: local_cloud::world::RefusalCode::VcpuLimitExceeded,
                    region: REGION.to_string(),
                    zone: None,
                    instance_type: None,
                    market: local_cloud::world::RefusalMarket::OnDemand,
                }]
            } else {
                Vec::new()
            },
            ..Settings::default()
        };
        let cloud = LocalCloud::start(Options {
            seed,
            start: Some(t0()),
            settings,
            sleep: aws_smithy_async::rt::sleep::SharedAsyncSleep::new(NoWait),
            ..Options::default()
        })
        .await
        .expect("emulator starts");
        cloud.with_world(|w| {
            for ty in w.market.types.iter_mut() {
                if ty.name == "p5.48xlarge" || ty.name == "p4d.24xlarge" {
                    ty.block_pool = scenario.block_pool;
                    ty.on_demand_pool = scenario.on_demand_pool;
                }
            }
        });
        cloud.with_world(|w| {
            let midnight = t0()
                .date_naive()
                .and_hms_opt(0, 0, 0)
                .expect("midnight")
                .and_utc();
            let azs = w.market.region(REGION).azs;
            for d in &scenario.crowded_days {
                let day = midnight + TimeDelta::days(*d);
                for az in &azs {
                    w.market.consume(
                        local_cloud::market::Pool::TrainingPlan,
                        REGION,
                        az,
                        "p5.48xlarge",
                        (day, day + TimeDelta::days(1)),
                        64,
                    );
                }
            }
        });
        let clock = ManualClock::new(t0());
        let store = InMemoryStore::new().with_clock(clock.clone());
        for (spelled, micros) in &scenario.legacy_ledgers {
            let team = capacity_pilot::domain::request::Team::parse(spelled).expect("a team");
            store.set_spent(
                &team,
                &capacity_pilot::ports::BudgetMonth::of(t0()),
                capacity_pilot::domain::money::MicroUsd(*micros),
            );
        }
        let env = env(
            &scenario.team_budgets.to_string(),
            scenario.timings.extension_lead_minutes,
        );
        let config = Arc::new(
            Config::from_lookup(&|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
                .expect("config"),
        );
        let gate = Gate::new();
        store.gate(gate.clone());
        let slept = Tally::default();
        let router = cloud.router();
        let g = gate.clone();
        let refusing = Refusing::new(&scenario, router.clone());
        let r = refusing.clone();
        let purchase_calls = PurchaseCalls::default();
        let terminations = Terminations::default();
        let (w, wg) = (purchase_calls.clone(), gate.clone());
        let (wt, ws) = (terminations.clone(), store.clone());
        let connector = InProcess::new(router)
            .with_gate(Arc::new(move |op: String| {
                let (g, r) = (g.clone(), r.clone());
                Box::pin(async move {
                    g.point(&op).await;
                    r.before(&op).await;
                })
            }))
            .with_watch(Arc::new(move |op: &str, body: &[u8]| {
                w.sent(wg.current(), op, body);
                if op == "TerminateInstances" {
                    wt.sent(wg.current(), body, &ws);
                }
            }));
        let sdk = in_process::sdk_config(connector.http_client(), REGION, t0().into());
        // The stack's notices topic, created outside the gate (nothing of the sim's own).
        integration_tests::flow::create_notices_topic(&in_process::sdk_config(
            InProcess::new(cloud.router()).http_client(),
            REGION,
            t0().into(),
        ))
        .await;
        let adapters = || {
            let a = Adapters::from_sdk(sdk.clone(), &config).expect("adapters");
            let (market, workloads) =
                in_process::seeded_adapters(&sdk, &config.allowed_regions, config.prices.clone());
            (market, workloads, a.events)
        };
        let (market, workloads, events) = adapters();
        let searcher = Searcher {
            store: store.clone(),
            market,
            workloads,
            events,
            clock: clock.clone(),
            config: config.clone(),
            blocks_seen: Default::default(),
        };
        let (market, workloads, events) = adapters();
        let purchaser = Purchaser {
            store: store.clone(),
            market,
            events,
            workloads,
            clock: clock.clone(),
            config: config.clone(),
            ids: Arc::new(SeededIds::new(seed.wrapping_mul(16).wrapping_add(15))),
            sleep: aws_smithy_async::rt::sleep::SharedAsyncSleep::new(slept.clone()),
        };
        let (_, workloads, events) = adapters();
        let launcher = Launcher {
            store: store.clone(),
            workloads,
            events,
            clock: clock.clone(),
            config: config.clone(),
        };
        let (_, workloads, events) = adapters();
        let replacer = Replacer {
            store: store.clone(),
            workloads,
            events,
            clock: clock.clone(),
            config: config.clone(),
        };
        let (market, workloads, events) = adapters();
        let cleaner = Cleaner {
            store: store.clone(),
            market,
            workloads,
            events,
            clock: clock.clone(),
            config: config.clone(),
            planted: Default::default(),
        };
        let foreign = checks::Foreign::set_up(&cloud, &scenario);
        let mut sim = Sim {
            scenario,
            cloud,
            store,
            clock,
            config,
            handlers: Handlers {
                searcher,
                purchaser,
                launcher,
                replacer,
                cleaner,
            },
            gate,
            nth: BTreeMap::new(),
            seen_default: 0,
            seen_custom: 0,
            queue: BTreeMap::new(),
            acts: BTreeMap::new(),
            seq: 0,
            deliveries: 0,
            ticks: 0,
            faults_on: true,
            launched: BTreeSet::new(),
            answered: BTreeSet::new(),
            trace: Vec::new(),
            violations: Vec::new(),
            dlq: Vec::new(),
            delivered: Vec::new(),
            invocations: 0,
            by_function: BTreeMap::new(),
            reached: BTreeSet::new(),
            drained: BTreeSet::new(),
            unverified: BTreeSet::new(),
            doubt_debits: BTreeMap::new(),
            ended_in_doubt: BTreeSet::new(),
            foreign,
            slept,
            refusing,
            legacy: BTreeSet::new(),
            cancelled_kept: BTreeSet::new(),
            stop_asked: BTreeSet::new(),
            purchase_calls,
            terminations,
            leases: BTreeMap::new(),
            lease_times: Vec::new(),
            uncalled_releases: Vec::new(),
            extended: Vec::new(),
            strays: Vec::new(),
            problems: Vec::new(),
            refusals: Vec::new(),
        };
        sim.plan();
        sim
    }

    /// The lowest fee AWS quotes now for an EC2 request's whole duration, as its
    /// requester would look it up (`DescribeCapacityBlockOfferings`, within the purchase
    /// lead and the window); `None` for another workload or when nothing is offered.
    fn quote(&self, detail: &Value) -> Option<rust_decimal::Decimal> {
        if detail["workload"]["kind"] != "ec2-instances" {
            return None;
        }
        let time = |k: &str| detail[k].as_str()?.parse::<DateTime<Utc>>().ok();
        let window = (time("earliest_start")?, time("latest_end")?);
        let (count, hours) = (
            detail["instance_count"].as_i64()?,
            detail["duration_hours"].as_i64()?,
        );
        let now = self.now();
        self.cloud.with_world(|w| {
            detail["instance_types"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .flat_map(|ty| block_offers(w, now, ty, count, hours, window))
                .map(|o| o.upfront_fee)
                .min()
        })
    }

    /// The scenario's strays whose request waits to be purchased now (`OfferingsFound`),
    /// bought for it from an offering its plan does not match. A request whose moment
    /// passes without a fitting offering gets none.
    fn place_strays(&mut self, now: DateTime<Utc>) {
        let planned = self.scenario.strays.clone();
        for (k, planned) in planned.iter().enumerate() {
            if self.strays.iter().any(|s| s.planned == k) {
                continue;
            }
            let Some(req) = self.scenario.requests.get(planned.request) else {
                continue;
            };
            let Some(id) = req.detail["request_id"].as_str().map(str::to_string) else {
                continue;
            };
            let Some(rec) = self.store.record_of(&id) else {
                continue;
            };
            if rec.status != RequestStatus::OfferingsFound {
                continue;
            }
            let Some(plan) = rec.candidates.first() else {
                continue;
            };
            let want = &rec.request;
            // (Only where the purchase goes ahead now: one awaiting approval may never come.)
            if want
                .budget
                .approval_above
                .is_some_and(|above| plan.upfront_fee > above)
            {
                continue;
            }
            let hours = i64::from(want.duration_hours);
            // A serving stray holds one instance more than asked: no offering of the plan,
            // which has the request's count, gives it (purchase-capacity's `is_from`).
            let count = i64::from(want.instance_count) + i64::from(planned.serves);
            let (ty, hours) = if planned.serves {
                (want.instance_types[0].clone(), hours)
            } else if let Some(other) = ["p5.48xlarge", "p4d.24xlarge"]
                .iter()
                .find(|t| !want.instance_types.iter().any(|w| w == *t))
            {
                ((*other).to_string(), hours)
            } else if hours >= 48 {
                (want.instance_types[0].clone(), hours / 2)
            } else {
                continue;
            };
            let window = (want.window.earliest_start, want.window.latest_end);
            let mut tags = capacity_pilot::domain::naming::resource_tags(
                &BTreeMap::new(),
                &rec.request_id,
                &rec.team,
                &self.config.deployment_id,
            );
            let bought = self.cloud.with_world(|w| {
                // Unlike every offering of the plan (purchase-capacity's `is_from`).
                let o = block_offers(w, now, &ty, count, hours, window)
                    .into_iter()
                    .find(|o| {
                        !plan.offerings.iter().any(|p| {
                            p.instance_type == o.instance_type
                                && i64::from(p.instance_count) == o.instance_count
                                && (p.start() - o.start).num_minutes().abs() < 60
                        })
                    })?;
                w.ec2.offerings.insert(o.id.clone(), o.clone());
                // What purchase-capacity tags its own purchases with: the stray is one of
                // them whose record was lost.
                tags.insert(capacity_pilot::aws::ec2::OFFERING_TAG.into(), o.id.clone());
                tags.insert(
                    capacity_pilot::aws::ec2::FEE_TAG.into(),
                    o.upfront_fee.to_string(),
                );
                let mut q: Vec<(String, String)> = vec![
                    ("Action".into(), "PurchaseCapacityBlock".into()),
                    ("CapacityBlockOfferingId".into(), o.id.clone()),
                    ("InstancePlatform".into(), "Linux/UNIX".into()),
                    (
                        "TagSpecification.1.ResourceType".into(),
                        "capacity-reservation".into(),
                    ),
                ];
                for (n, (k, v)) in tags.iter().enumerate() {
                    q.push((format!("TagSpecification.1.Tag.{}.Key", n + 1), k.clone()));
                    q.push((format!("TagSpecification.1.Tag.{}.Value", n + 1), v.clone()));
                }
                let body = serde_urlencoded::to_string(&q).ok()?;
                let query = local_cloud::query::Query::parse(body.as_bytes()).ok()?;
                let before: BTreeSet<String> = w.ec2.reservations.keys().cloned().collect();
                w.ec2_call(REGION, "PurchaseCapacityBlock", &query).ok()?;
                w.ec2
                    .reservations
                    .keys()
                    .find(|k| !before.contains(*k))
                    .cloned()
                    .map(|cr| (cr, o))
            });
            let Some((cr, o)) = bought else {
                continue;
            };
            self.trace(format!(
                "stray: {cr} ({} x {} from {} to {}, ${}) bought for {id}, {}",
                o.instance_count,
                o.instance_type,
                o.start,
                o.end,
                o.upfront_fee,
                if planned.serves {
                    "serving it"
                } else {
                    "not serving it"
                }
            ));
            self.reached.insert("a stray was bought".to_string());
            self.strays.push(checks::Stray {
                planned: k,
                id: cr,
                request: id,
                listed_at: now + TimeDelta::seconds(self.scenario.timings.listing_lag_seconds),
            });
        }
    }

    /// The orphan sweep leaves a paid window's instances to its drain (ARCHITECTURE §9.1):
    /// cleanup-expired never terminates an instance in a reservation while the window the
    /// instance's request holds in it has not begun its drain (pending, launching or
    /// running, as the store held it at the call), whatever the request's status. The drain
    /// marks the window stopping before it stops anything; replace-unhealthy's replacements
    /// are its own.
    fn judge_terminations(&mut self, batch: &[Pending], which: &[usize], now: DateTime<Utc>) {
        for (i, ids, windows) in self.terminations.take() {
            let Some(p) = which.get(i).and_then(|k| batch.get(*k)) else {
                continue;
            };
            if p.function != "cleanup-expired" {
                continue;
            }
            for id in ids {
                let Some((res, owner)) = self.cloud.with_world(|w| {
                    w.ec2.instances.get(&id).and_then(|i| {
                        Some((
                            i.capacity_reservation_id.clone()?,
                            i.tags.get("capacity-pilot:request-id")?.clone(),
                        ))
                    })
                }) else {
                    continue;
                };
                for (req, r, state) in &windows {
                    let undrained = matches!(
                        state,
                        WindowState::Pending | WindowState::Launching | WindowState::Running
                    );
                    if undrained && *r == res && req.eq_ignore_ascii_case(&owner) {
                        self.problems.push(format!(
                            "a paid window's instances are the drain's: cleanup-expired \
                             terminated {id} at {now}, in {res}, while {req}'s window in it was \
                             {state:?}"
                        ));
                    }
                }
            }
        }
    }

    /// An invocation that ends well leaves no purchase lease behind but for a purchase it
    /// left in doubt: a lease taken and still held when purchase-capacity's invocations
    /// (all of the batch) returned success belongs to a request they decided `in-doubt`
    /// (or lost the lease over); else the purchase waits a lease out, and then the doubt
    /// window, for nothing.
    fn judge_leases_left(&mut self, before: &BTreeSet<String>, ran: &[Ran], now: DateTime<Utc>) {
        let mut decided: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
        for r in ran {
            match r {
                Ran::Done(Ok(decisions)) => {
                    for d in decisions {
                        decided
                            .entry(d.request_id.clone())
                            .or_default()
                            .push(d.action);
                    }
                }
                _ => return,
            }
        }
        for r in self.store.records() {
            let Some(lease) = &r.lease else { continue };
            if r.status != RequestStatus::Purchasing
                || before.contains(&lease.token)
                || lease.expires_at <= now
            {
                continue;
            }
            let id = r.request_id.to_string();
            let actions = decided.get(&id).cloned().unwrap_or_default();
            if !actions
                .iter()
                .any(|a| matches!(*a, "in-doubt" | "lease-lost"))
            {
                self.problems.push(format!(
                    "an invocation that ends well leaves no lease behind: {id} is Purchasing \
                     under a lease taken at {now} and held until {}, decided {actions:?}",
                    lease.expires_at
                ));
            }
        }
    }

    /// The requests whose purchase in doubt was resolved with nothing listed, by their records:
    /// the write may land in an invocation that then fails (another request's error, a lost
    /// answer), whose decisions the harness never sees.
    fn note_unverified(&mut self) {
        for r in self.store.records() {
            if r.status.is_terminal() && r.reason.contains("was listed up to its end") {
                self.unverified.insert(r.request_id.to_string());
            }
            if let (Some(_), Some(d)) = (&r.doubt, r.open_debit) {
                self.doubt_debits.insert(r.request_id.to_string(), d.0);
            }
        }
    }

    /// An `in-doubt` decision is judged when it is made: the purchase it doubts is of an
    /// offering of the request's plan that no reservation recorded for the request serves
    /// already (else the purchase waits out the doubt window over what it holds), begun at
    /// or before now.
    fn judge_doubt(&mut self, request: &str, reason: &str, now: DateTime<Utc>) {
        let Some(offering) = reason
            .split_once("purchase of ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
        else {
            self.problems.push(format!(
                "an in-doubt decision names its purchase: {request}'s reads {reason:?}"
            ));
            return;
        };
        let Some(rec) = self.store.record_of(request) else {
            return;
        };
        let Some(o) = rec
            .candidates
            .first()
            .and_then(|p| p.offerings.iter().find(|o| o.id == offering))
        else {
            self.problems.push(format!(
                "an in-doubt decision names its plan's offering: {request} doubts {offering}, \
                 not in its plan"
            ));
            return;
        };
        let reservations = self.store.all_reservations();
        for r in reservations
            .iter()
            .filter(|(k, _)| k.as_str() == request)
            .flat_map(|(_, v)| v)
            .filter(|r| r.state.is_live())
        {
            if r.instance_type == o.instance_type
                && r.instance_count == o.instance_count
                && (r.start() - o.start()).num_minutes().abs() < 60
            {
                self.problems.push(format!(
                    "a recorded purchase is never in doubt: {request} doubts the purchase of \
                     {offering} at {now}, which {} (recorded, bought at {:?}) serves",
                    r.id, r.bought_at
                ));
            }
        }
        // The doubt's beginning, as the decision gives it: "begun at <time> UTC".
        if let Some(since) = reason
            .split_once("begun at ")
            .and_then(|(_, rest)| rest.split_once(" UTC"))
            .and_then(|(t, _)| {
                chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S%.f").ok()
            })
            .map(|t| t.and_utc())
            && since > now
        {
            self.problems.push(format!(
                "a doubt began in the past: {request}'s purchase of {offering} is in doubt at \
                 {now} since {since}"
            ));
        }
    }

    /// A purchase lease is judged when it is written: it must outlast the instant it was
    /// taken (a lease already expired lets the next tick take the purchase over at once).
    /// HyperPod groups come and go within a run (each is removed after its request's last
    /// window), so whether one was made, and removed, is seen as it happens.
    fn note_groups(&mut self) {
        let (made, removed) = self.cloud.with_world(|w| {
            let groups = || w.sm.clusters.values().flat_map(|c| c.groups.iter());
            (groups().any(|g| !g.deleting), groups().any(|g| g.deleting))
        });
        if made {
            self.reached
                .insert("a HyperPod group was created".to_string());
        }
        if removed {
            self.reached
                .insert("a HyperPod group was removed".to_string());
        }
    }

    fn note_leases(&mut self, now: DateTime<Utc>) {
        for r in self.store.records() {
            let Some(lease) = r.lease else {
                continue;
            };
            let id = r.request_id.to_string();
            if self.leases.get(&id) == Some(&lease.token) {
                continue;
            }
            self.lease_times.push((id.clone(), now));
            if lease.expires_at <= now {
                self.problems.push(format!(
                    "a lease outlasts its taking: {id}'s lease {} written at {now} expires at {}",
                    lease.token, lease.expires_at
                ));
            }
            self.leases.insert(id, lease.token);
        }
    }

    fn at(m: i64) -> DateTime<Utc> {
        t0() + TimeDelta::minutes(m)
    }

    fn act_at(&mut self, at: DateTime<Utc>, act: Act) {
        self.seq += 1;
        self.acts.insert((at, self.seq), act);
    }

    /// The scenario's timed acts, on the agenda.
    fn plan(&mut self) {
        let s = self.scenario.clone();
        for (i, r) in s.requests.iter().enumerate() {
            self.act_at(
                Sim::at(r.submit_at),
                Act::Submit(r.detail.clone(), r.cap_at_quote),
            );
            if let Some((at, again)) = &r.resubmit {
                self.act_at(Sim::at(*at), Act::Submit(again.clone(), false));
            }
            if let Some(c) = r.cancel_at {
                self.act_at(Sim::at(c.max(0)), Act::Cancel(i));
            }
            if r.payment_failures > 0
                && let Some(id) = r.detail["request_id"].as_str()
            {
                self.cloud
                    .with_world(|w| w.force_payment_failures(id, r.payment_failures));
            }
            if let (Some(after), Some(id)) =
                (r.payment_failure_after, r.detail["request_id"].as_str())
            {
                self.cloud
                    .with_world(|w| w.force_payment_failures_after(id, after, 1));
            }
            if r.detail["workload"]["kind"] == "inference-endpoint" {
                let name = r.detail["workload"]["model_name"].clone();
                if let Err(e) = self.cloud.with_world(|w| {
                    w.sagemaker_call(REGION, "CreateModel", &json!({"ModelName": name}))
                }) {
                    // A shared name: the second request serves the first's model.
                    self.trace(format!("CreateModel {name}: {e:?}"));
                }
            }
            if r.detail["workload"]["kind"] == "hyperpod-cluster" {
                let name = r.detail["workload"]["cluster_name"].clone();
                let made = self.cloud.with_world(|w| {
                    w.sagemaker_call(
                        REGION,
                        "CreateCluster",
                        &json!({"ClusterName": name,
                            "Tags": [{"Key": "capacity-pilot:managed", "Value": "true"}]}),
                    )
                });
                if let Err(e) = made {
                    // A reused cluster name: the second request shares the first's cluster.
                    self.trace(format!("CreateCluster {name}: {e:?}"));
                }
            }
        }
        for (k, m) in s.market.iter().enumerate() {
            self.act_at(Sim::at(m.at), Act::Market(k));
        }
        for (k, f) in s.api_faults.iter().enumerate() {
            self.act_at(Sim::at(f.at), Act::ApiFault(k));
        }
        for (k, f) in s.store_faults.iter().enumerate() {
            self.act_at(Sim::at(f.at), Act::StoreFault(k));
        }
        for (k, (from, to)) in s.pauses.iter().enumerate() {
            self.act_at(Sim::at(*from), Act::Pause(k));
            self.act_at(Sim::at(*to), Act::Resume);
        }
        for (call, nth) in &s.crash_after {
            self.gate.die_after(call, *nth);
        }
        self.act_at(s.faults_end(), Act::Settle);
    }

    fn now(&self) -> DateTime<Utc> {
        self.cloud.now()
    }

    pub fn trace(&mut self, line: String) {
        let now = self.now();
        self.trace
            .push(format!("{} {line}", now.format("%m-%d %H:%M:%S")));
    }

    /// Plays the scenario to its end, checking the per-step promises after every moment and
    /// the end-of-run promises at the end. Stops at the first violated promise.
    pub async fn run(&mut self) {
        let end = self.scenario.end();
        loop {
            let now = self.now();
            self.clock.set(now);
            self.store.advance_to(now);
            // Acts due now.
            while let Some((&key, _)) = self.acts.first_key_value() {
                if key.0 > now {
                    break;
                }
                let act = self.acts.remove(&key).expect("present");
                self.act(act);
            }
            // Deliveries and invocations due now, until nothing new happens at this instant.
            loop {
                self.route();
                let Some((&key, _)) = self.queue.first_key_value() else {
                    break;
                };
                if key.0 > now {
                    break;
                }
                let p = self.queue.remove(&key).expect("present");
                self.invoke(p).await;
            }
            self.note_leases(now);
            self.note_unverified();
            self.note_groups();
            self.cancel_kept();
            self.stop_running();
            let mut problems = std::mem::take(&mut self.problems);
            problems.extend(checks::per_step(self));
            if !problems.is_empty() {
                for p in problems {
                    self.trace(format!("VIOLATION {p}"));
                    self.violations.push(p);
                }
                return;
            }
            if now >= end {
                break;
            }
            let next = self.next_moment(now).min(end);
            self.cloud.advance_to(next);
            self.clock.set(next);
            self.store.advance_to(next);
            self.fire_schedules(next);
        }
        let reached = checks::reached(self);
        self.reached.extend(reached);
        let problems = checks::at_end(self).await;
        for p in problems {
            self.trace(format!("VIOLATION {p}"));
            self.violations.push(p);
        }
    }

    /// The next moment anything can happen: an act, a queued invocation, an emulator
    /// transition, or a schedule tick whose function has work.
    fn next_moment(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        // Every schedule fires at least every [`SWEEP`], work or not: a tick that ought to
        // be quiet is played too, so a function that acts on no due item still gets its chance.
        let mut next = tick_at_or_after(now + TimeDelta::seconds(1), SWEEP);
        if let Some((k, _)) = self.acts.first_key_value() {
            next = next.min(k.0);
        }
        if let Some((k, _)) = self.queue.first_key_value() {
            next = next.min(k.0);
        }
        if let Some(t) = self.cloud.next_transition() {
            next = next.min(t.max(now + TimeDelta::seconds(1)));
        }
        for (f, every) in RULES.schedules() {
            let first = tick_at_or_after(now + TimeDelta::seconds(1), every);
            if self.has_work(f, first) {
                next = next.min(first);
            } else if let Some(due) = self.due_for(f, now) {
                next = next.min(tick_at_or_after(due.max(first), every));
            }
        }
        next.max(now + TimeDelta::seconds(1))
    }

    /// Whether `function`'s tick at `at` has work: something due in the store by then;
    /// replace-unhealthy while a managed instance is not plainly healthy (pending, impaired,
    /// stopped, not yet listed, recently gone) or a replacement waits for capacity; and every
    /// function at each [`SWEEP`] tick.
    fn has_work(&self, function: &str, at: DateTime<Utc>) -> bool {
        if is_tick(at, SWEEP) {
            return true;
        }
        if self.due_for(function, at).is_some_and(|d| d <= at) {
            return true;
        }
        function == "replace-unhealthy"
            && (self.instances_unsettled(at)
                || self
                    .store
                    .all_workloads()
                    .iter()
                    .any(|w| replace_unhealthy::handler::is_replacing(&w.state)))
    }

    /// The earliest time `function` has due work by the store: search and purchase only for
    /// the statuses they own (ARCHITECTURE §4), the other three for anything else due (any
    /// window, any other status); every function while an outbox item is unsent (any run
    /// flushes). A wrong owner here only delays a function to its next [`SWEEP`].
    fn due_for(&self, function: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        use capacity_pilot::domain::status::RequestStatus as S;
        const SEARCH: &[S] = &[S::Accepted, S::Searching, S::NotFound];
        const PURCHASE: &[S] = &[
            S::OfferingsFound,
            S::AwaitingApproval,
            S::Purchasing,
            S::Reserved,
        ];
        let (times, unsent) = self.store.due_times();
        let mut best = unsent.then_some(now);
        for t in times {
            let own = match function {
                "search-offerings" => SEARCH.contains(&t.status),
                "purchase-capacity" => PURCHASE.contains(&t.status),
                _ => !SEARCH.contains(&t.status) && !PURCHASE.contains(&t.status),
            };
            let windows = !matches!(function, "search-offerings" | "purchase-capacity");
            let due = [
                own.then_some(t.own).flatten(),
                windows.then_some(t.window).flatten(),
                // A payment or extension read is the purchase function's in any status.
                (function == "purchase-capacity")
                    .then_some(t.payment)
                    .flatten(),
            ]
            .into_iter()
            .flatten()
            .min();
            if let Some(d) = due {
                best = Some(best.map_or(d, |b: DateTime<Utc>| b.min(d)));
            }
        }
        best
    }

    fn instances_unsettled(&self, at: DateTime<Utc>) -> bool {
        let lag = self.scenario.timings.instance_listing_lag_seconds;
        self.cloud.with_world(|w| {
            w.ec2.instances.values().any(|i| {
                i.tags.get("capacity-pilot:managed").map(String::as_str) == Some("true")
                    && (i.impaired
                        || (i.state != "running" && i.state != "terminated")
                        || i.launch_time + TimeDelta::seconds(lag + 600) > at
                        || i.terminated_at
                            .is_some_and(|t| t + TimeDelta::minutes(15) > at))
            })
        })
    }

    fn fire_schedules(&mut self, at: DateTime<Utc>) {
        for (f, every) in RULES.schedules() {
            if is_tick(at, every) && self.has_work(f, at) {
                if self.down(f, at) {
                    self.reached.insert(format!("{f} was down"));
                    continue;
                }
                let ev = self.tick(f, at);
                self.enqueue(at, f.to_string(), ev, 0);
            }
        }
    }

    /// Whether `function` is down at `at` (an outage of the fault hours).
    fn down(&self, function: &str, at: DateTime<Utc>) -> bool {
        self.faults_on && self.scenario.down(function, at)
    }

    /// A new scheduled event of `function`'s schedule at `at`.
    fn tick(&mut self, function: &str, at: DateTime<Utc>) -> Value {
        self.ticks += 1;
        json!({
            "version": "0", "id": format!("tick-{}", self.ticks),
            "detail-type": "Scheduled Event", "source": "aws.events",
            "account": "123456789012", "time": at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            "region": REGION,
            "resources": [format!("arn:aws:events:{REGION}:123456789012:rule/{function}-schedule")],
            "detail": {}
        })
    }

    fn enqueue(&mut self, at: DateTime<Utc>, function: String, event: Value, attempt: u32) {
        self.seq += 1;
        self.queue.insert(
            (at, self.seq),
            Pending {
                function,
                event,
                attempt,
            },
        );
    }

    /// Takes every event new on either bus, reacts as the actors would (approvers answer,
    /// failures armed at a request's first launch), and queues a delivery to each function
    /// the template's rules name, through the scenario's delivery faults.
    fn route(&mut self) {
        let now = self.now();
        let (default, custom) = self.cloud.with_world(|w| {
            (
                w.events(REGION, "default")
                    .get(self.seen_default..)
                    .unwrap_or_default()
                    .to_vec(),
                w.events(REGION, BUS)
                    .get(self.seen_custom..)
                    .unwrap_or_default()
                    .to_vec(),
            )
        });
        self.seen_default += default.len();
        self.seen_custom += custom.len();
        for (bus, events) in [(Bus::Default, default), (Bus::Custom, custom)] {
            for ev in events {
                self.react(&ev);
                for f in RULES.functions_for(bus, &ev) {
                    let n = self.deliveries;
                    self.deliveries += 1;
                    let fault = if self.faults_on {
                        self.scenario.delivery_fault(n)
                    } else {
                        None
                    };
                    let what = ev["detail-type"].as_str().unwrap_or("?").to_string();
                    match fault {
                        None => self.enqueue(now, f, ev.clone(), 0),
                        Some(DeliveryFault::Duplicate) => {
                            self.reached
                                .insert("an event was delivered twice".to_string());
                            self.trace(format!("fault: {what} to {f} delivered twice"));
                            self.enqueue(now, f.clone(), ev.clone(), 0);
                            self.enqueue(now, f, ev.clone(), 0);
                        }
                        Some(DeliveryFault::Delay(m)) => {
                            self.reached.insert("an event was delayed".to_string());
                            self.trace(format!("fault: {what} to {f} delayed {m} min"));
                            self.enqueue(now + TimeDelta::minutes(m), f, ev.clone(), 0);
                        }
                        Some(DeliveryFault::Drop) => {
                            self.reached.insert("an event was dropped".to_string());
                            self.trace(format!("fault: {what} to {f} dropped (to the DLQ)"));
                            self.dlq.push(ev.clone());
                        }
                    }
                }
            }
        }
    }

    fn react(&mut self, ev: &Value) {
        let now = self.now();
        let dt = ev["detail-type"].as_str().unwrap_or_default();
        self.reached.insert(dt.to_string());
        let id = ev["detail"]["request_id"].as_str().unwrap_or_default();
        let index = self
            .scenario
            .requests
            .iter()
            .position(|r| r.detail["request_id"] == id);
        let Some(i) = index else {
            return;
        };
        let window = (
            ev["detail"]["reservation_id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            ev["detail"]["segment"].as_u64().unwrap_or_default(),
        );
        // Windows drained, and what launched into one since (issue 58): a window reopened by
        // an extension paid after its drain, a training job's follow-on.
        if dt == "Capacity Workload Drained" {
            self.drained.insert(window.clone());
        }
        if dt == "Capacity Workload Launched" {
            if self.drained.contains(&window) {
                self.reached.insert(
                    "a drained window was launched again after its extension was paid".to_string(),
                );
            }
            let follow_on = ev["detail"]["resource_ids"].as_array().is_some_and(|ids| {
                ids.iter()
                    .any(|i| i.as_str().is_some_and(|i| i.contains("-x")))
            });
            if follow_on && ev["detail"]["workload_kind"] == "training-job" {
                self.reached
                    .insert("a training job's follow-on job started".to_string());
            }
        }
        match dt {
            "Capacity Reservation Extended" if ev["detail"]["external"] == false => {
                self.reached.insert("an extension was bought".to_string());
            }
            "Capacity Extension Offered" if ev["detail"]["asked_by"] == "workload-running" => {
                self.reached
                    .insert("an extension was bought because the workload ran".to_string());
            }
            "Capacity Extension Failed"
                if ev["detail"]["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("did not take the payment")) =>
            {
                self.reached
                    .insert("an extension's payment failed".to_string());
            }
            "Capacity Purchase Awaiting Approval" | "Capacity Extension Awaiting Approval" => {
                let key = ev["detail"]["event_key"].as_str().unwrap_or_default();
                if !self.answered.insert(key.to_string()) {
                    return;
                }
                let (source, detail_type, approves, after) =
                    match self.scenario.requests[i].approver {
                        Approver::Approves { after_minutes } => (
                            APPROVER,
                            "Capacity Purchase Approved",
                            key.to_string(),
                            after_minutes,
                        ),
                        Approver::Rejects { after_minutes } => (
                            APPROVER,
                            "Capacity Purchase Rejected",
                            key.to_string(),
                            after_minutes,
                        ),
                        Approver::Stale { after_minutes } => (
                            APPROVER,
                            "Capacity Purchase Approved",
                            format!("{id}:awaiting-approval:0000000000000000"),
                            after_minutes,
                        ),
                        Approver::Forged { after_minutes } => (
                            FORGER,
                            "Capacity Purchase Approved",
                            key.to_string(),
                            after_minutes,
                        ),
                        Approver::Silent => return,
                    };
                self.act_at(
                    now + TimeDelta::minutes(after),
                    Act::Put {
                        source: source.to_string(),
                        detail_type: detail_type.to_string(),
                        detail: json!({"request_id": id, "approver": "sim-approver",
                                       "approves": approves}),
                    },
                );
            }
            "Capacity Reserved" if self.scenario.sabotage => {
                // Someone buys the same block again for the request, behind its back.
                let Some(cr) = ev["detail"]["reservation_ids"][0].as_str() else {
                    return;
                };
                let cr = cr.to_string();
                // (The emulator's own copy: its offering ids expire, as AWS's do.)
                let bought = self.cloud.with_world(|w| {
                    let mut twin = w.ec2.reservations.get(&cr)?.clone();
                    twin.id = format!("{cr}-twin");
                    twin.created = w.now;
                    w.ec2.reservations.insert(twin.id.clone(), twin);
                    Some(())
                });
                self.trace(format!(
                    "sabotage: {cr}'s offering bought again for {id}: {bought:?}"
                ));
            }
            "Capacity Window Opening"
                if self.scenario.sabotage_notices && ev["source"] == "capacity-pilot" =>
            {
                // A producer announces the same lead-time notice again under another key.
                let mut detail = ev["detail"].clone();
                detail["event_key"] = json!(format!(
                    "{}-twin",
                    detail["event_key"].as_str().unwrap_or_default()
                ));
                self.trace(format!("sabotage: {} announced again", detail["event_key"]));
                self.act_at(
                    now,
                    Act::Put {
                        source: "sim-sabotage".to_string(),
                        detail_type: "Capacity Window Opening".to_string(),
                        detail,
                    },
                );
            }
            // (Issue 57: with notices driving cleanup's ticks, one goes late only when cleanup
            // is down at its moment.) cleanup-expired is down across the window's 1 h Opening
            // notice, once a run: it goes out late, saying so.
            "Capacity Window Opening"
                if self.scenario.late_notice_outage
                    && self.faults_on
                    && ev["source"] == "capacity-pilot"
                    && ev["detail"]["lead_minutes"] == 1440
                    && !self.scenario.outages.iter().any(|o| o.late_notice) =>
            {
                if let Some(opens) = ev["detail"]["opens_at"]
                    .as_str()
                    .and_then(|t| t.parse::<DateTime<Utc>>().ok())
                {
                    let from = (opens - TimeDelta::minutes(70) - t0()).num_minutes();
                    if from > (now - t0()).num_minutes()
                        && from + 30 < (self.scenario.faults_end() - t0()).num_minutes()
                    {
                        self.trace(format!(
                            "fault: cleanup-expired will be down 30 min across {id}'s 1 h \
                             Window Opening notice"
                        ));
                        self.scenario.outages.push(Outage {
                            function: "cleanup-expired",
                            from,
                            minutes: 30,
                            late_notice: true,
                        });
                    }
                }
            }
            "Capacity Workload Launched" if self.launched.insert(i) => {
                // Under a one-hour payment lead, the team asks late: 2-4 hours before its
                // reservation's end, so a payment that takes hours clears after the drain
                // began (issue 58: the window is reopened).
                let late = (self.scenario.timings.extension_lead_minutes < 720)
                    .then(|| {
                        let rid = ev["detail"]["reservation_id"].as_str().unwrap_or_default();
                        self.cloud.with_world(|w| {
                            w.ec2
                                .reservations
                                .values()
                                .find(|c| c.id == rid)
                                .map(|c| c.end)
                                .or_else(|| {
                                    w.sm.plans
                                        .values()
                                        .find(|p| p.arn == rid)
                                        .map(|p| p.offering.end())
                                })
                        })
                    })
                    .flatten();
                for x in self.scenario.extension_asks.clone() {
                    if x.request == i {
                        let at = match late {
                            Some(end) => (end - TimeDelta::minutes(120 + x.after % 120)).max(now),
                            None => now + TimeDelta::minutes(x.after),
                        };
                        for k in 0..if x.twice { 2 } else { 1 } {
                            self.act_at(
                                at + TimeDelta::minutes(k),
                                Act::AskExtension {
                                    request: i,
                                    hours: x.hours,
                                },
                            );
                        }
                    }
                }
                if self.scenario.extension_payment_failures.contains(&i) {
                    self.act_at(now, Act::FailExtensionPayment { request: i });
                }
                for x in self.scenario.console_extensions.clone() {
                    if x.request == i {
                        self.act_at(
                            now + TimeDelta::minutes(x.after),
                            Act::ConsoleExtend {
                                request: i,
                                hours: x.hours,
                            },
                        );
                    }
                }
                for (h, index, impair) in self.scenario.requests[i].instance_failures.clone() {
                    self.act_at(
                        now + TimeDelta::hours(h) + TimeDelta::minutes(17),
                        Act::FailInstance {
                            request: i,
                            index,
                            impair,
                        },
                    );
                }
            }
            _ => {}
        }
    }

    fn put(&mut self, source: &str, detail_type: &str, detail: &Value) {
        let entry = json!({"Entries": [{
            "Source": source, "DetailType": detail_type,
            "Detail": detail.to_string(), "EventBusName": BUS,
        }]});
        let out = self
            .cloud
            .with_world(|w| w.events_call(REGION, "PutEvents", &entry));
        self.trace(format!(
            "{source} puts {detail_type} {}",
            detail["request_id"].as_str().unwrap_or("")
        ));
        if !matches!(&out, Ok(v) if v["FailedEntryCount"] == 0) {
            self.trace(format!("PutEvents of an actor's event: {out:?}"));
        }
    }

    fn act(&mut self, act: Act) {
        match act {
            Act::Submit(mut detail, quote) => {
                if quote && let Some(fee) = self.quote(&detail) {
                    self.trace(format!(
                        "requester: {} capped at its quote, ${fee}",
                        detail["request_id"].as_str().unwrap_or("")
                    ));
                    detail["budget"]["max_upfront_usd"] = json!(fee.to_string());
                }
                let subnets: Vec<String> = self
                    .cloud
                    .with_world(|w| w.subnets(REGION).into_iter().map(|s| s.id).collect());
                if detail["workload"]["subnet_ids"] == "${subnet_ids}" {
                    detail["workload"]["subnet_ids"] = json!(subnets);
                }
                self.put(SOURCE, "Capacity Request Submitted", &detail);
            }
            Act::Cancel(i) => {
                let planned = &self.scenario.requests[i];
                let id = planned.detail["request_id"].clone();
                let id = match id.as_str() {
                    Some(given) if planned.cancel_upper => json!(given.to_uppercase()),
                    _ => id,
                };
                self.put(
                    SOURCE,
                    "Capacity Request Cancelled",
                    &json!({"request_id": id, "reason": "called off"}),
                );
            }
            Act::Put {
                source,
                detail_type,
                detail,
            } => self.put(&source, &detail_type, &detail),
            Act::Pause(_) if self.scenario.sabotage_pause => {
                self.trace("sabotage: the pause is not written".to_string());
            }
            Act::Pause(k) => {
                let (from, _) = self.scenario.pauses[k];
                self.trace("operator: purchases paused".to_string());
                self.store.set_pause(Some(capacity_pilot::ports::Pause {
                    by: "arn:aws:sts::123456789012:assumed-role/ops/sim".into(),
                    reason: format!("sim pause {k}"),
                    since: Sim::at(from),
                }));
            }
            Act::Resume => {
                self.trace("operator: purchases resumed".to_string());
                self.store.set_pause(None);
            }
            Act::Market(k) => {
                let m = self.scenario.market[k].clone();
                self.cloud.with_world(|w| {
                    let base = local_cloud::market::default_types();
                    for (ty, list) in w.market.types.iter_mut().zip(base) {
                        if ty.name == m.instance_type {
                            if let Some(p) = m.block_pool {
                                ty.block_pool = p;
                            }
                            if let Some(pct) = m.price_pct {
                                ty.block_usd = list.block_usd * rust_decimal::Decimal::from(pct)
                                    / rust_decimal::Decimal::from(100);
                            }
                        }
                    }
                });
                self.trace(format!("market: {m:?}"));
            }
            Act::ApiFault(k) => {
                if !self.faults_on {
                    return;
                }
                let f = self.scenario.api_faults[k].clone();
                let kind = match f.kind {
                    ApiFaultKind::Throttle => FaultKind::Throttle,
                    ApiFaultKind::InternalError => FaultKind::InternalError,
                    ApiFaultKind::LostResponse => FaultKind::LostResponse,
                };
                self.cloud.inject(Fault {
                    operation: f.operation.to_string(),
                    kind,
                    count: Some(f.count),
                });
                self.trace(format!(
                    "fault: {:?} x{} on {}",
                    f.kind, f.count, f.operation
                ));
            }
            Act::StoreFault(k) => {
                if !self.faults_on {
                    return;
                }
                let f = self.scenario.store_faults[k].clone();
                let e = errors::transient("dynamodb");
                if f.commits {
                    self.store.commit_then_fail_next_writes(1, e);
                } else {
                    self.store.fail_next_writes(1, e);
                }
                self.trace(format!(
                    "fault: the next store write {}",
                    if f.commits {
                        "commits and its answer is lost"
                    } else {
                        "fails"
                    }
                ));
            }
            Act::FailInstance {
                request,
                index,
                impair,
            } => {
                let id = self.scenario.requests[request].detail["request_id"].clone();
                let foreign = &self.foreign.instances;
                let done = self.cloud.with_world(|w| {
                    let mut live: Vec<_> = w
                        .ec2
                        .instances
                        .values()
                        .filter(|i| !foreign.contains_key(&i.id))
                        .filter(|i| {
                            i.tags.get("capacity-pilot:request-id").map(String::as_str)
                                == id.as_str()
                                && (i.state == "running" || i.state == "pending")
                        })
                        .map(|i| {
                            let spot = i.lifecycle == local_cloud::ec2::Lifecycle::Spot;
                            (i.launch_time, i.launch_index, i.id.clone(), spot)
                        })
                        .collect();
                    live.sort();
                    let (iid, spot) = live.get(index).map(|(_, _, id, s)| (id.clone(), *s))?;
                    // A spot instance that fails is reclaimed: EC2's two-minute warning, then
                    // its termination.
                    let r = match (impair, spot) {
                        (true, _) => w.impair_instance(&iid, true),
                        (false, true) => w.interrupt_spot(&iid),
                        (false, false) => w.fail_instance(&iid),
                    };
                    r.ok().map(|_| (iid, spot))
                });
                if let Some((iid, spot)) = done {
                    self.trace(format!(
                        "fault: instance {iid} of {} {}",
                        id.as_str().unwrap_or(""),
                        match (impair, spot) {
                            (true, _) => "impaired",
                            (false, true) => "reclaimed (spot)",
                            (false, false) => "stopped",
                        }
                    ));
                    if spot && !impair {
                        self.reached
                            .insert("a spot instance was reclaimed".to_string());
                    }
                }
            }
            Act::AskExtension { request, hours } => {
                let id = self.scenario.requests[request].detail["request_id"].clone();
                self.put(
                    SOURCE,
                    "Capacity Extension Requested",
                    &json!({"request_id": id, "hours": hours}),
                );
            }
            Act::FailExtensionPayment { request } => {
                let id = self.scenario.requests[request].detail["request_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let armed = self.cloud.with_world(|w| {
                    let mut ids: Vec<String> = w
                        .ec2
                        .reservations
                        .values()
                        .filter(|c| c.tags.get("capacity-pilot:request-id") == Some(&id))
                        .map(|c| c.id.clone())
                        .collect();
                    ids.extend(
                        w.sm.plans
                            .values()
                            .filter(|p| {
                                w.sm.tags.get(&p.arn).is_some_and(|t| {
                                    t.iter()
                                        .any(|(k, v)| k == "capacity-pilot:request-id" && *v == id)
                                })
                            })
                            .map(|p| p.arn.clone()),
                    );
                    ids.into_iter()
                        .filter_map(|r| w.fail_next_extension_payment(&r).ok())
                        .collect::<Vec<_>>()
                });
                self.trace(format!(
                    "fault: the next extension payment of {id}'s {armed:?} fails"
                ));
            }
            Act::ConsoleExtend { request, hours } => {
                let id = self.scenario.requests[request].detail["request_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let now = self.clock.get();
                // The reservation it runs in now, more than 3 hours before its end: the
                // extension's payment clears before any drain (at most 105 min before it).
                let margin = TimeDelta::hours(3);
                let done = self.cloud.with_world(|w| {
                    let block = w
                        .ec2
                        .reservations
                        .values()
                        .filter(|c| {
                            c.tags.get("capacity-pilot:request-id") == Some(&id)
                                && c.state == "active"
                                && c.start <= now
                                && c.end > now + margin
                                && c.extensions.iter().all(|e| e.status != "payment-pending")
                        })
                        .map(|c| c.id.clone())
                        .next();
                    if let Some(cr) = block {
                        return Some((cr.clone(), w.extend_block(&cr, hours).map(|e| e.end)));
                    }
                    let plan =
                        w.sm.plans
                            .values()
                            .filter(|p| {
                                w.sm.tags.get(&p.arn).is_some_and(|t| {
                                    t.iter()
                                        .any(|(k, v)| k == "capacity-pilot:request-id" && *v == id)
                                }) && p.offering.start() <= now
                                    && p.offering.end() > now + margin
                                    && p.extensions.iter().all(|e| e.paid)
                            })
                            .map(|p| (p.region.clone(), p.name.clone(), p.arn.clone()))
                            .next();
                    let (region, name, arn) = plan?;
                    Some((arn, w.extend_plan(&region, &name, hours).map(|e| e.end)))
                });
                match done {
                    Some((rid, Ok(end))) => {
                        self.trace(format!(
                            "console: {rid} of {id} extended by {hours} h, to end at {end}"
                        ));
                        self.extended.push((rid, now));
                        self.reached
                            .insert("a reservation was extended in the console".to_string());
                    }
                    Some((rid, Err(e))) => {
                        self.trace(format!("console: extending {rid} of {id} refused: {e:?}"));
                    }
                    None => self.trace(format!(
                        "console: {id} runs in no reservation ending more than 3 h from now"
                    )),
                }
            }
            Act::Settle => {
                // The API faults that struck: armed, and no longer waiting.
                let waiting: Vec<String> = self
                    .cloud
                    .with_world(|w| w.faults.iter().map(|f| f.operation.clone()).collect());
                for f in &self.scenario.api_faults {
                    if f.at < (self.scenario.faults_end() - t0()).num_minutes()
                        && !waiting.contains(&f.operation.to_string())
                    {
                        self.reached
                            .insert(format!("{:?} struck {}", f.kind, f.operation));
                    }
                }
                self.faults_on = false;
                self.refusing.stop();
                self.gate.clear_targets();
                self.cloud.clear_faults();
                self.store.clear_faults();
                self.trace("settling: faults end; every function and the bus up".to_string());
            }
        }
    }

    /// The invocation number `function` is at, counting this one; `None` out of the fault
    /// hours (no crash or race then).
    fn count(&mut self, function: &str) -> Option<u64> {
        if !self.faults_on {
            return None;
        }
        let f = FUNCTIONS.iter().find(|f| **f == function)?;
        let n = self.nth.entry(f).or_default();
        *n += 1;
        Some(*n - 1)
    }

    /// Invokes `p`'s function, alone or together with another invocation of it (a race of
    /// the scenario's), each with its crash point if it has one.
    async fn invoke(&mut self, p: Pending) {
        let now = self.now();
        self.clock.set(now);
        if p.function == "purchase-capacity" && self.faults_on {
            self.place_strays(now);
        }
        let mut batch = vec![p];
        let nth = self.count(&batch[0].function);
        let mut order = 0;
        let twin = (self.faults_on && self.scenario.concurrent_duplicates)
            .then(|| {
                self.queue
                    .iter()
                    .find(|(k, q)| {
                        k.0 <= now
                            && q.function == batch[0].function
                            && q.event["id"] == batch[0].event["id"]
                    })
                    .map(|(k, _)| *k)
            })
            .flatten();
        if let Some(k) = twin {
            // The same event delivered twice, both deliveries at once.
            let partner = self.queue.remove(&k).expect("present");
            order = capacity_pilot::ids::mix(self.scenario.seed ^ self.invocations);
            self.reached
                .insert("two deliveries ran at once".to_string());
            self.trace(format!(
                "fault: {} runs both deliveries of {} at once",
                partner.function,
                partner.event["detail-type"].as_str().unwrap_or("?")
            ));
            batch.push(partner);
        } else if let Some(race) = nth
            .and_then(|n| self.scenario.race(&batch[0].function, n))
            .cloned()
        {
            order = race.order;
            let f = batch[0].function.clone();
            let next = match race.with {
                RaceWith::NextDelivery => self
                    .queue
                    .iter()
                    .find(|(k, q)| q.function == f && k.0 <= now + TimeDelta::minutes(10))
                    .map(|(k, _)| *k),
                RaceWith::Tick => None,
            };
            let partner = match next {
                Some(k) => {
                    self.reached
                        .insert("two deliveries ran at once".to_string());
                    self.queue.remove(&k).expect("present")
                }
                None => {
                    self.reached
                        .insert("a tick raced an invocation".to_string());
                    let event = self.tick(&f, now);
                    Pending {
                        function: f.clone(),
                        event,
                        attempt: 0,
                    }
                }
            };
            self.trace(format!(
                "fault: {f} runs {} and {} at once",
                batch[0].event["detail-type"].as_str().unwrap_or("?"),
                partner.event["detail-type"].as_str().unwrap_or("?")
            ));
            batch.push(partner);
        }
        let mut crash_at = Vec::new();
        for (k, p) in batch.iter().enumerate() {
            let n = if k == 0 { nth } else { self.count(&p.function) };
            crash_at.push(n.and_then(|n| self.scenario.crash(&p.function, n)));
        }
        let mut runs = Vec::new();
        let mut down = Vec::new();
        for p in &batch {
            self.invocations += 1;
            let what = p.event["detail-type"].as_str().unwrap_or("?").to_string();
            *self
                .by_function
                .entry((p.function.clone(), what))
                .or_default() += 1;
            down.push(self.down(&p.function, now));
        }
        let mut parsed = Vec::new();
        for p in &batch {
            match serde_json::from_value::<EventBridgeEvent<Value>>(p.event.clone()) {
                Ok(ev) => parsed.push(Some(ev)),
                Err(e) => {
                    self.trace(format!("unparsable event {}: {e}", p.event));
                    parsed.push(None);
                }
            }
        }
        let mut which = Vec::new();
        for (k, ev) in parsed.into_iter().enumerate() {
            if let Some(ev) = ev
                && !down[k]
            {
                runs.push(self.handlers.call(&batch[k].function, ev));
                which.push(k);
            }
        }
        let crash: Vec<Option<u32>> = which.iter().map(|k| crash_at[*k]).collect();
        self.slept.take();
        self.purchase_calls.take_overrun();
        self.terminations.take();
        self.refusing.batch();
        let purchase = batch.iter().any(|p| p.function == "purchase-capacity");
        let tokens_before: BTreeSet<String> = if purchase {
            self.store
                .records()
                .into_iter()
                .filter_map(|r| r.lease.map(|l| l.token))
                .collect()
        } else {
            BTreeSet::new()
        };
        let ran = drive(&self.gate, runs, &crash, order).await;
        if purchase {
            self.judge_leases_left(&tokens_before, &ran, now);
            if self.scenario.legacy_doubt && self.faults_on {
                for r in self.store.records() {
                    // Only a doubt written with a purchase's first lease, as the old
                    // release would have begun it: what a takeover records stays.
                    let fresh = matches!((&r.doubt, &r.lease),
                        (Some(d), Some(l)) if l.expires_at - d.since == capacity_pilot::purchase::protocol::LEASE);
                    if r.status == RequestStatus::Purchasing && fresh {
                        self.store.forget_doubt(&r.request_id);
                        self.legacy.insert(r.request_id.to_string());
                    }
                }
            }
        }
        // Invocations run together share the tally: each alone slept at most this much.
        let slept = self.slept.take();
        // (Its retries' backoff in full: 400 ms, then 800.)
        if slept >= std::time::Duration::from_millis(1200) {
            self.reached
                .insert("a purchase spent its throttle retries".to_string());
        }
        if slept > PURCHASE_TIMEOUT {
            self.problems.push(format!(
                "waits fit the timeout: purchase-capacity's invocation(s) at {now} slept {} s, \
                 past its {} s timeout",
                slept.as_secs(),
                PURCHASE_TIMEOUT.as_secs()
            ));
        }
        self.judge_terminations(&batch, &which, now);
        for (offering, n) in self.purchase_calls.take_overrun() {
            self.problems.push(format!(
                "a purchase gives up within its attempts: an invocation at {now} sent the \
                 same purchase of {offering} {n} times, past its {PURCHASE_ATTEMPTS}"
            ));
        }
        let mut results: Vec<Option<Ran>> = batch.iter().map(|_| None).collect();
        for (k, r) in which.into_iter().zip(ran) {
            results[k] = Some(r);
        }
        for (p, r) in batch.into_iter().zip(results) {
            let (r, began) = match r {
                Some(r) => (r, true),
                None if self.down(&p.function, now) => {
                    self.reached.insert(format!("{} was down", p.function));
                    (Ran::Done(Err(format!("{} is down", p.function))), false)
                }
                // Unparsable: nothing ran.
                None => continue,
            };
            self.finish(p, r, began, now);
        }
    }

    /// An inbound event (a requester's or an approver's) that reached its handler.
    fn note_delivery(&mut self, p: &Pending, now: DateTime<Utc>, handled: bool) {
        let source = p.event["source"].as_str().unwrap_or_default();
        if source == SOURCE || source == APPROVER || source == FORGER {
            self.delivered.push(Delivered {
                at: now,
                event: p.event.clone(),
                handled,
            });
        }
    }

    /// [`Scenario::cancel_kept`]: a request still cancellable that holds a window not ended
    /// is cancelled by its requester, once.
    fn cancel_kept(&mut self) {
        if !self.scenario.cancel_kept {
            return;
        }
        for r in self.store.records() {
            let id = r.request_id.to_string();
            if r.status.is_cancellable()
                && r.windows.iter().any(|w| w.state != WindowState::Ended)
                && self.cancelled_kept.insert(id.clone())
            {
                self.reached
                    .insert("a request holding a paid window was cancelled".to_string());
                self.trace(format!("requester cancels {id}, which holds a paid window"));
                self.put(
                    SOURCE,
                    "Capacity Request Cancelled",
                    &json!({"request_id": id, "reason": "called off the rest"}),
                );
            }
        }
    }

    /// Whether the requester of `id` asks `stop_running` ([`Scenario::stop_running`]).
    fn stops(&self, id: &str) -> bool {
        self.scenario
            .stop_running
            .iter()
            .any(|&i| self.scenario.requests[i].detail["request_id"] == id)
    }

    /// [`Scenario::stop_running`]: a request whose paid window runs, in whatever status, is
    /// cancelled with `stop_running: true` by its requester, once.
    fn stop_running(&mut self) {
        if self.scenario.stop_running.is_empty() {
            return;
        }
        for r in self.store.records() {
            let id = r.request_id.to_string();
            if self.stops(&id)
                && r.windows.iter().any(|w| w.state == WindowState::Running)
                && self.stop_asked.insert(id.clone())
            {
                self.reached
                    .insert("stop_running was asked of a running window".to_string());
                self.trace(format!(
                    "requester stops {id}'s running windows ({})",
                    r.status
                ));
                self.put(
                    SOURCE,
                    "Capacity Request Cancelled",
                    &json!({"request_id": id, "reason": "done early", "stop_running": true}),
                );
            }
        }
    }

    /// A paid window is served to its drain, whatever becomes of its request (ARCHITECTURE
    /// §9.1): the orphan sweep never terminates an instance in a reservation whose window of
    /// its request has not begun its drain. Also notes a request over (failed, rejected,
    /// cancelled) whose window is launched or drained.
    fn judge_served(&mut self, function: &str, d: &capacity_pilot::decision::Decision) {
        if matches!(d.action, "failed" | "rejected" | "cancelled") {
            self.note_ended_holding(function, d);
            return;
        }
        if !matches!(d.action, "swept" | "launched" | "drained" | "draining") {
            return;
        }
        let Some(rec) = self.store.record_of(&d.request_id) else {
            return;
        };
        if rec.status.is_terminal() && rec.status != RequestStatus::Ended {
            match (function, d.action) {
                ("launch-workloads", "launched") => {
                    self.reached
                        .insert("a window of a request over was launched".to_string());
                }
                ("cleanup-expired", "drained" | "draining") => {
                    self.reached
                        .insert("a window of a request over was drained".to_string());
                }
                _ => {}
            }
        }
        if d.action != "swept" {
            return;
        }
        // "terminated i-1, i-2 in <region>: ..."
        let Some(ids) = d
            .reason
            .strip_prefix("terminated ")
            .and_then(|r| r.split_once(" in "))
            .map(|(ids, _)| ids)
        else {
            return;
        };
        for iid in ids.split(", ") {
            let cr = self.cloud.with_world(|w| {
                w.ec2
                    .instances
                    .get(iid)
                    .and_then(|i| i.capacity_reservation_id.clone())
            });
            let Some(cr) = cr else { continue };
            if let Some(w) = rec.windows.iter().find(|w| {
                w.reservation_id() == cr
                    && matches!(
                        w.state,
                        WindowState::Pending | WindowState::Launching | WindowState::Running
                    )
            }) {
                self.problems.push(format!(
                    "a paid window is served to its drain: the sweep terminated {iid} of {} \
                     ({}), in its window {} ({}) before its drain",
                    d.request_id, rec.status, w.key, w.state
                ));
            }
        }
    }

    /// ARCHITECTURE §9.1's N1 paths: which write made a request terminal while it held a
    /// paid window not ended, for the generators' reach check.
    fn note_ended_holding(&mut self, function: &str, d: &capacity_pilot::decision::Decision) {
        let Some(rec) = self.store.record_of(&d.request_id) else {
            return;
        };
        if !rec.status.is_terminal()
            || rec.status == RequestStatus::Ended
            || rec.windows.iter().all(|w| w.state == WindowState::Ended)
        {
            return;
        }
        let path = match (function, d.action) {
            (_, "cancelled") => "cancelled",
            (_, "rejected") => "rejected by its approver",
            ("launch-workloads", _) => "failed: a launch refused",
            // The purchase's budget check ("team … budget … would be exceeded", "the
            // request's max_upfront_usd … would be exceeded").
            ("purchase-capacity", _) if d.reason.contains("would be exceeded") => {
                "failed: over its cap"
            }
            ("purchase-capacity", _) => "failed: its purchase refused",
            ("search-offerings", _) => "failed: its search refused",
            _ => "failed",
        };
        self.reached
            .insert(format!("a request holding a paid window was {path}"));
    }

    /// Records how an invocation came out (`began`: its handler ran, whatever it came to),
    /// and schedules Lambda's retries of a failed one.
    fn finish(&mut self, p: Pending, ran: Ran, began: bool, now: DateTime<Utc>) {
        let what = p.event["detail-type"].as_str().unwrap_or("?").to_string();
        let about = p.event["detail"]["request_id"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let result = match ran {
            Ran::Done(r) => r,
            Ran::Crashed(at) => {
                if let Some((_, call)) = at.split_once("right after ") {
                    self.reached
                        .insert(format!("an invocation died right after {call}"));
                }
                self.reached.insert(if at.starts_with("after") {
                    "an invocation died after its last call".to_string()
                } else {
                    "an invocation died at a port call".to_string()
                });
                Err(format!("crashed at {at}"))
            }
        };
        match result {
            Ok(decisions) => {
                if what != "Scheduled Event" || !decisions.is_empty() {
                    self.trace(format!("{} <- {what} {about}: ok", p.function));
                }
                for d in decisions {
                    if d.reason.contains("recorded nowhere, it is ours") {
                        self.reached.insert(
                            if d.action == "reserved" {
                                "a stray reserved its request in its plan's place"
                            } else {
                                "a stray was kept beside its plan"
                            }
                            .to_string(),
                        );
                    }
                    // (The purchase's own decision: a later one that quotes the request's
                    // reason, a resubmission's rejection say, decides nothing about it.)
                    if p.function == "purchase-capacity" && d.reason.contains(REFUSAL) {
                        self.refusals
                            .push((now, d.request_id.to_string(), d.action.to_string()));
                    }
                    if d.action == "in-doubt" {
                        self.judge_doubt(&d.request_id.to_string(), &d.reason, now);
                    }
                    if d.action == "ended-in-doubt" {
                        self.ended_in_doubt.insert(d.request_id.to_string());
                    }
                    // A takeover that releases a purchase no lease called AWS for asks AWS
                    // nothing (ARCHITECTURE 9.1): the leases it ends adopted no stray.
                    if p.function == "purchase-capacity"
                        && d.reason.contains("stopped before calling AWS")
                    {
                        self.uncalled_releases.push((d.request_id.to_string(), now));
                    }
                    if d.action == "doubt-resolved" && d.reason.contains("was listed up to its end")
                    {
                        self.unverified.insert(d.request_id.to_string());
                        self.reached.insert(
                            "a purchase in doubt was kept spent unverified at its offering's end"
                                .to_string(),
                        );
                    }
                    if d.action == "in-doubt"
                        && d.reason.contains("is not listed")
                        && self.legacy.contains(d.request_id.as_str())
                    {
                        self.reached
                            .insert("a taken-over legacy purchase record was in doubt".to_string());
                    }
                    if d.action == "in-doubt" && d.reason.contains("is not listed") {
                        self.reached
                            .insert("a taken-over purchase was in doubt".to_string());
                    }
                    self.judge_served(&p.function, &d);
                    self.trace(format!("  {} {}: {}", d.request_id, d.action, d.reason));
                }
                self.note_delivery(&p, now, true);
            }
            Err(e) => {
                if began {
                    self.note_delivery(&p, now, false);
                }
                self.trace(format!(
                    "{} <- {what} {about}: failed (attempt {}): {e}",
                    p.function,
                    p.attempt + 1
                ));
                self.reached.insert("an invocation failed".to_string());
                if p.attempt < 2 {
                    // Lambda's asynchronous retries: after about one minute, then two.
                    let wait = TimeDelta::minutes(i64::from(p.attempt) + 1);
                    self.enqueue(now + wait, p.function, p.event, p.attempt + 1);
                } else {
                    self.trace(format!("{} <- {what} {about}: to the DLQ", p.function));
                    self.reached.insert("an event went to the DLQ".to_string());
                    if what != "Scheduled Event" {
                        self.dlq.push(p.event);
                    }
                }
            }
        }
    }
}
