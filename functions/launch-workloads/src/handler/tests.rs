//! Launching against the in-memory fakes: idempotency across duplicate, racing and retried
//! wake-ups, each workload kind, and on-demand-first with its fall-back.

use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::config::Config;
use capacity_pilot::domain::money::{MicroUsd, Usd};
use capacity_pilot::domain::offering::{Product, Segment, TargetResource};
use capacity_pilot::domain::request::{
    CapacityRequest, Strategy, TrainingJobTemplate, WorkloadDetail,
};
use capacity_pilot::domain::reservation::{Reservation, ReservationState};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::window::WindowState;
use capacity_pilot::fakes::fixtures::{request, request_id, t0, team};
use capacity_pilot::fakes::{
    FakeWorkloads, InMemoryStore, LaunchKind, ManualClock, RecordingEvents, WorkloadsCall,
    WorkloadsOp, errors,
};
use capacity_pilot::ports::JobState;
use capacity_pilot::ports::{
    BeginPurchase, BudgetMonth, Cause, LaunchMarket, Lease, PortError, RecordReservation,
    RequestRecord, Store,
};
use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use super::Launcher;

type L = Launcher<InMemoryStore, FakeWorkloads, RecordingEvents, ManualClock>;

struct World {
    store: InMemoryStore,
    workloads: FakeWorkloads,
    events: RecordingEvents,
    clock: ManualClock,
}

fn opens() -> DateTime<Utc> {
    t0() + Duration::hours(1)
}

impl World {
    fn new() -> World {
        let clock = ManualClock::new(t0());
        let workloads = FakeWorkloads::new().with_clock(clock.clone());
        workloads.add_subnet("us-east-1", "subnet-a", "us-east-1a");
        workloads.add_subnet("us-east-1", "subnet-b", "us-east-1b");
        World {
            store: InMemoryStore::new(),
            workloads,
            events: RecordingEvents::new(),
            clock,
        }
    }

    fn launcher(&self) -> L {
        self.launcher_with(&[])
    }

    /// The launcher, with `extra` set in its environment.
    fn launcher_with(&self, extra: &[(&'static str, &str)]) -> L {
        let mut env: Vec<(&str, String)> = vec![
            ("TABLE_NAME", "t".into()),
            ("EVENT_BUS_NAME", "capacity-pilot".into()),
            ("ALLOWED_REGIONS", "us-east-1".into()),
            ("ALLOWED_REQUEST_SOURCES", "com.example.ml-platform".into()),
            ("APPROVER_SOURCES", "com.example.approvals".into()),
            ("TEAM_BUDGETS_USD", r#"{"team-a": "100000"}"#.into()),
            (
                "SAGEMAKER_EXECUTION_ROLE_ARN",
                "arn:aws:iam::123456789012:role/sm".into(),
            ),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        let config = Config::from_lookup(&move |k| {
            // Later pairs override earlier ones.
            env.iter()
                .rev()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.clone())
        })
        .unwrap();
        Launcher {
            store: self.store.clone(),
            workloads: self.workloads.clone(),
            events: self.events.clone(),
            clock: self.clock.clone(),
            config: Arc::new(config),
        }
    }

    fn record(&self, req: CapacityRequest, status: RequestStatus, next: DateTime<Utc>) {
        self.store.insert_record(RequestRecord {
            next_action_at: Some(next),
            ..capacity_pilot::fakes::fixtures::record(req, status)
        });
    }

    /// GIVEN a request `Reserved` with `reservation` recorded, due at `next`.
    async fn reserved(&self, req: CapacityRequest, reservation: Reservation, next: DateTime<Utc>) {
        let id = req.id.clone();
        self.record(req, RequestStatus::OfferingsFound, t0());
        self.store
            .begin_purchase(BeginPurchase {
                request_id: id.clone(),
                expected_version: 1,
                from: RequestStatus::OfferingsFound,
                lease: Lease {
                    token: "seed".into(),
                    expires_at: t0() + Duration::minutes(15),
                },
                debit: None,
                doubt: None,
                reason: "seeded".into(),
                at: t0(),
                caused_by: Cause::new("seed-begin"),
                outbox: vec![],
            })
            .await
            .unwrap();
        self.store
            .record_reservation(RecordReservation {
                request_id: id,
                lease_token: "seed".into(),
                reservation,
                to: RequestStatus::Reserved,
                reason: "seeded".into(),
                next_action_at: Some(next),
                at: t0(),
                caused_by: Cause::new("seed-record"),
                outbox: vec![],
                uncapped: None,
            })
            .await
            .unwrap();
    }

    async fn status(&self, id: &str) -> RequestStatus {
        self.record_of(id).await.status
    }

    async fn record_of(&self, id: &str) -> RequestRecord {
        self.store
            .get_request(&request_id(id))
            .await
            .unwrap()
            .unwrap()
    }

    fn launches(&self) -> Vec<WorkloadsCall> {
        self.workloads.calls_of(WorkloadsOp::LaunchInstances)
    }

    fn spent(&self) -> MicroUsd {
        self.store
            .ledger()
            .get(&(team("team-a"), BudgetMonth::of(self.clock.get())))
            .copied()
            .unwrap_or_default()
    }
}

fn block(id: &str, count: u32, zone: &str) -> Reservation {
    Reservation {
        id: id.into(),
        product: Product::CapacityBlock,
        region: "us-east-1".into(),
        instance_type: "p5.48xlarge".into(),
        instance_count: count,
        segments: vec![Segment {
            start: opens(),
            end: opens() + Duration::hours(24),
            availability_zone: Some(zone.into()),
        }],
        upfront_fee: Usd::parse("100").unwrap(),
        state: ReservationState::Scheduled,
        offering_id: None,
        request_tag: None,
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

fn plan(target: TargetResource) -> Reservation {
    Reservation {
        id: "arn:aws:sagemaker:us-east-1:123456789012:training-plan/cp-r1".into(),
        product: Product::TrainingPlan { target },
        instance_type: "ml.p5.48xlarge".into(),
        segments: vec![Segment {
            start: opens(),
            end: opens() + Duration::hours(24),
            availability_zone: None,
        }],
        ..block("x", 2, "us-east-1a")
    }
}

fn ec2_request(id: &str) -> CapacityRequest {
    let mut req = request(id, "team-a", "5000");
    req.workload = WorkloadDetail::Ec2Instances {
        launch_template: Some(capacity_pilot::domain::request::LaunchTemplateRef {
            id: Some("lt-0123456789abcdef0".into()),
            name: None,
            version: None,
        }),
        subnet_ids: vec!["subnet-a".into(), "subnet-b".into()],
        instance_platform: None,
    };
    req
}

fn event(detail_type: &str, source: &str, id: &str, detail: Value) -> EventBridgeEvent<Value> {
    serde_json::from_value(json!({
        "version": "0", "id": id, "detail-type": detail_type, "source": source,
        "account": "123456789012", "time": "2026-12-01T10:00:00Z", "region": "us-east-1",
        "resources": [], "detail": detail
    }))
    .unwrap()
}

fn delivered(id: &str) -> EventBridgeEvent<Value> {
    event(
        "Capacity Block Delivered",
        "aws.ec2",
        id,
        json!({"capacity-reservation-id": "cr-1"}),
    )
}

fn tick(id: &str) -> EventBridgeEvent<Value> {
    event("Scheduled Event", "aws.events", id, json!({}))
}

#[tokio::test]
async fn a_window_launches_exactly_once_across_duplicate_delivered_events_and_a_schedule_tick() {
    // GIVEN a reserved two-instance block whose window has opened
    let w = World::new();
    w.reserved(ec2_request("r1"), block("cr-1", 2, "us-east-1b"), opens())
        .await;
    w.clock.set(opens() + Duration::minutes(1));
    let l = w.launcher();

    // WHEN the Delivered event arrives twice, in the other spelling, and a tick follows
    l.handle(delivered("e1")).await.unwrap();
    l.handle(delivered("e1")).await.unwrap();
    l.handle(event(
        "Capacity Block Reservation Delivered",
        "aws.ec2",
        "e2",
        json!({"capacity-reservation-id": "cr-1"}),
    ))
    .await
    .unwrap();
    l.handle(tick("t1")).await.unwrap();

    // THEN two instances run, the request is Active until the drain, and one event went out
    assert_eq!(w.workloads.live_in_reservation("cr-1").len(), 2);
    assert_eq!(w.launches().len(), 2);
    assert_eq!(w.status("r1").await, RequestStatus::Active);
    let launched = w.events.published_of("Capacity Workload Launched");
    assert_eq!(launched.len(), 1);
    assert_eq!(
        launched[0].detail["resource_ids"].as_array().unwrap().len(),
        2
    );
    assert_eq!(launched[0].detail["planned_start"], json!(opens()));
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    // 24h block end - 30 min forced lead - 15 min default drain (its lead-time notices,
    // cleanup's, are due beside it)
    assert_eq!(
        capacity_pilot::domain::window::window_action_at(&rec.windows),
        Some(opens() + Duration::hours(24) - Duration::minutes(45))
    );
}

#[tokio::test]
async fn concurrent_invocations_launch_the_same_instances_once() {
    let w = World::new();
    // Each invocation yields at every store call: they interleave as concurrent ones do.
    w.store.interleave();
    w.reserved(ec2_request("r1"), block("cr-1", 2, "us-east-1b"), opens())
        .await;
    w.clock.set(opens());
    let (a, b, c) = (w.launcher(), w.launcher(), w.launcher());

    let (ra, rb, rc) = tokio::join!(
        a.handle(delivered("e1")),
        b.handle(tick("t1")),
        c.handle(delivered("e2"))
    );
    for r in [ra, rb, rc] {
        r.unwrap();
    }

    // Every slot's token names the same instance: no duplicates, whoever won the race.
    assert_eq!(w.workloads.instances().len(), 2);
    assert_eq!(w.status("r1").await, RequestStatus::Active);
    assert_eq!(w.events.published_of("Capacity Workload Launched").len(), 1);
}

#[tokio::test]
async fn instances_launch_into_the_subnet_in_the_blocks_zone_with_tokens_and_tags() {
    let w = World::new();
    w.reserved(ec2_request("r1"), block("cr-1", 2, "us-east-1b"), opens())
        .await;
    w.clock.set(opens());

    w.launcher().handle(tick("t1")).await.unwrap();

    let specs: Vec<_> = w
        .launches()
        .into_iter()
        .map(|c| match c {
            WorkloadsCall::LaunchInstances(s) => s,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(specs.len(), 2);
    for (slot, s) in specs.iter().enumerate() {
        assert_eq!(s.subnet_id, "subnet-b");
        assert_eq!(s.count, 1);
        assert_eq!(
            s.market,
            LaunchMarket::CapacityBlock {
                reservation_id: "cr-1".into()
            }
        );
        assert_eq!(
            s.client_token,
            capacity_pilot::domain::naming::client_token("cr-1", slot as u32, 0)
        );
        assert_eq!(s.tags["capacity-pilot:managed"], "true");
        assert_eq!(s.tags["capacity-pilot:request-id"], "r1");
    }
}

#[tokio::test]
async fn nothing_launches_before_the_window_opens() {
    // GIVEN a request that is due (an early wake-up) but whose block opens in an hour
    let w = World::new();
    w.reserved(ec2_request("r1"), block("cr-1", 2, "us-east-1b"), t0())
        .await;
    w.clock.set(opens() - Duration::minutes(1));

    // WHEN an early Delivered event and a tick arrive
    w.launcher().handle(delivered("e1")).await.unwrap();
    w.launcher().handle(tick("t1")).await.unwrap();

    // THEN nothing was launched and the request still waits
    assert!(w.launches().is_empty());
    assert_eq!(w.status("r1").await, RequestStatus::Reserved);
    assert!(w.events.published().is_empty());
}

/// A request for a training job (image `img`, output `s3://b/o`) with the fixture's budget.
fn training_job_request(id: &str) -> CapacityRequest {
    let mut job = request(id, "team-a", "5000");
    job.workload = WorkloadDetail::TrainingJob(TrainingJobTemplate {
        training_image: "img".into(),
        output_s3_uri: "s3://b/o".into(),
        volume_size_gb: 100,
        hyper_parameters: Default::default(),
    });
    job
}

#[tokio::test]
async fn a_training_job_and_an_endpoint_launch_with_the_plan_arn() {
    let w = World::new();
    let job = training_job_request("r1");
    let mut endpoint = request("r2", "team-a", "5000");
    endpoint.workload = WorkloadDetail::InferenceEndpoint {
        model_name: "m".into(),
        endpoint_name: "ep".into(),
        variant_name: "v".into(),
    };
    w.reserved(job, plan(TargetResource::TrainingJob), opens())
        .await;
    w.reserved(endpoint, plan(TargetResource::Endpoint), opens())
        .await;
    w.clock.set(opens());

    w.launcher().handle(tick("t1")).await.unwrap();

    let arn = plan(TargetResource::TrainingJob).id;
    let spec = w
        .workloads
        .training_job_spec("us-east-1", "cp-r1-s0")
        .unwrap();
    assert_eq!(spec.training_plan_arn.as_deref(), Some(arn.as_str()));
    assert_eq!(spec.role_arn, "arn:aws:iam::123456789012:role/sm");
    let ep = w.workloads.endpoint_spec("us-east-1", "ep").unwrap();
    assert_eq!(ep.ml_reservation_arn.as_deref(), Some(arn.as_str()));
    assert_eq!(w.status("r1").await, RequestStatus::Active);
    // The endpoint's window runs only once it is InService (issue 18)
    assert_eq!(w.status("r2").await, RequestStatus::Reserved);
    w.workloads
        .set_endpoint_status("us-east-1", "ep", "InService", None);
    w.launcher().handle(tick("t2")).await.unwrap();
    assert_eq!(w.status("r2").await, RequestStatus::Active);
    assert_eq!(
        w.events
            .published_of("Capacity Workload Launched")
            .iter()
            .filter(|e| e.detail["request_id"] == "r2")
            .count(),
        1
    );
}

/// Issue 58 (ARCHITECTURE §9.3): a training job runs with a runtime fixed at its plan's old
/// end. Once capacity-pilot's extension moved the end a day later and reopened the window for
/// a follow-on (relaunch 1, due at the old forced end), nothing starts while the first job
/// runs; when it has stopped and the follow-on is due, `cp-r1-s0-x1` starts once, with a
/// runtime to the new end, and is announced under a key of its own.
#[tokio::test]
async fn a_training_jobs_follow_on_starts_once_the_first_stops_at_the_old_end() {
    let w = World::new();
    let job = training_job_request("r1");
    let p = plan(TargetResource::TrainingJob);
    w.reserved(job, p.clone(), opens()).await;
    w.clock.set(opens());
    w.launcher().handle(tick("t1")).await.unwrap();
    w.workloads.set_job_state(
        "us-east-1",
        "cp-r1-s0",
        JobState::InProgress,
        "Training",
        None,
    );
    // GIVEN extension 1 moved the plan's end a day later and reopened the window for the
    // follow-on, due when the first job's runtime ends (the old forced end)
    let old_forced = p.end() - Duration::minutes(30);
    let new_end = p.end() + Duration::days(1);
    let mut rec = w.record_of("r1").await;
    let extended = capacity_pilot::fakes::fixtures::extended_by_us(p.clone(), 1, new_end);
    let mut t = capacity_pilot::ports::Transition::of(
        &rec,
        rec.status,
        "extended",
        rec.next_action_at,
        opens() + Duration::hours(2),
        &Cause::new("extended"),
    );
    t.reservations = vec![extended];
    w.store.transition(t).await.unwrap();
    rec = w.record_of("r1").await;
    rec.windows[0].state = WindowState::Launching;
    rec.windows[0].relaunch = Some(1);
    rec.windows[0].next_action_at = Some(old_forced);
    rec.next_action_at = Some(old_forced);
    w.store.insert_record(rec);
    // WHEN the schedule ticks while the first job runs (and a delivery wakes it)
    w.clock.set(opens() + Duration::hours(3));
    w.launcher().handle(tick("t2")).await.unwrap();
    w.launcher().handle(delivered("d1")).await.unwrap();
    // THEN nothing starts, and SageMaker is not even asked: the window is not due yet
    assert_eq!(w.workloads.calls_of(WorkloadsOp::StartTrainingJob).len(), 1);
    assert!(
        w.workloads
            .calls_of(WorkloadsOp::DescribeTrainingJob)
            .is_empty()
    );
    // WHEN the first stops at its runtime's end and the follow-on is due (twice)
    w.workloads.set_job_state(
        "us-east-1",
        "cp-r1-s0",
        JobState::Stopped,
        "MaxRuntimeExceeded",
        None,
    );
    w.clock.set(old_forced + Duration::minutes(1));
    w.launcher().handle(tick("t3")).await.unwrap();
    w.launcher().handle(tick("t4")).await.unwrap();
    // THEN the follow-on started once, running to the new end's forced termination
    assert_eq!(w.workloads.calls_of(WorkloadsOp::StartTrainingJob).len(), 2);
    let spec = w
        .workloads
        .training_job_spec("us-east-1", "cp-r1-s0-x1")
        .expect("the follow-on job");
    let runtime = (new_end - Duration::minutes(30) - w.clock.get()).num_seconds();
    assert_eq!(i64::from(spec.max_runtime_seconds), runtime);
    let rec = w.record_of("r1").await;
    assert_eq!(rec.windows[0].state, WindowState::Running);
    assert_eq!(rec.status, RequestStatus::Active);
    assert!(rec.reason.contains("again"), "{}", rec.reason);
    let launched = w.events.published_of("Capacity Workload Launched");
    assert_eq!(launched.len(), 2);
    assert_eq!(launched[1].detail["resource_ids"], json!(["cp-r1-s0-x1"]));
    assert_eq!(launched[1].detail["start_delay_minutes"], Value::Null);
}

fn endpoint_request(id: &str) -> CapacityRequest {
    let mut endpoint = request(id, "team-a", "5000");
    endpoint.workload = WorkloadDetail::InferenceEndpoint {
        model_name: "m".into(),
        endpoint_name: "ep".into(),
        variant_name: "v".into(),
    };
    endpoint
}

/// GIVEN endpoint request r2 reserved on an endpoint plan, its window open now.
async fn endpoint_window_open(w: &World) {
    w.reserved(
        endpoint_request("r2"),
        plan(TargetResource::Endpoint),
        opens(),
    )
    .await;
    w.clock.set(opens());
}

#[tokio::test]
async fn an_endpoint_waits_for_its_plan_to_be_active_before_it_is_created() {
    // GIVEN an endpoint's window opens while its plan is still Scheduled
    let w = World::new();
    endpoint_window_open(&w).await;
    let arn = plan(TargetResource::Endpoint).id;
    w.workloads
        .set_plan_state(&arn, ReservationState::Scheduled);

    // WHEN launch ticks
    w.launcher().handle(tick("t1")).await.unwrap();

    // THEN nothing is created, and nothing fails
    assert!(w.workloads.calls_of(WorkloadsOp::CreateEndpoint).is_empty());
    assert_eq!(w.status("r2").await, RequestStatus::Reserved);

    // WHEN the plan is Active
    w.workloads.set_plan_state(&arn, ReservationState::Active);
    w.launcher().handle(tick("t2")).await.unwrap();

    // THEN the endpoint is created, once
    assert_eq!(w.workloads.calls_of(WorkloadsOp::CreateEndpoint).len(), 1);
}

#[tokio::test]
async fn a_failed_endpoint_is_deleted_and_created_again_then_the_request_fails_with_the_reason() {
    let w = World::new();
    endpoint_window_open(&w).await;
    let reason = "Unable to provision requested ML compute capacity";
    for n in 1..=capacity_pilot::workload::inference_endpoint::ENDPOINT_ATTEMPTS {
        // WHEN the endpoint is created and ends Failed
        w.launcher()
            .handle(tick(&format!("create-{n}")))
            .await
            .unwrap();
        assert_eq!(
            w.workloads.calls_of(WorkloadsOp::CreateEndpoint).len(),
            n as usize
        );
        w.workloads
            .set_endpoint_status("us-east-1", "ep", "Failed", Some(reason));
        w.launcher()
            .handle(tick(&format!("follow-{n}")))
            .await
            .unwrap();
    }

    // THEN it was deleted and created again each time but the last, and then the request
    // failed naming the reason
    assert_eq!(
        w.workloads.calls_of(WorkloadsOp::DeleteEndpoint).len(),
        (capacity_pilot::workload::inference_endpoint::ENDPOINT_ATTEMPTS - 1) as usize
    );
    let rec = w
        .store
        .get_request(&request_id("r2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::Failed);
    assert!(rec.reason.contains(reason), "{}", rec.reason);
}

#[tokio::test]
async fn an_endpoint_name_still_deleting_is_waited_out_not_taken_for_created() {
    // GIVEN our endpoint of the name is Deleting (an earlier attempt's, or a drain's)
    let w = World::new();
    endpoint_window_open(&w).await;
    w.launcher().handle(tick("t1")).await.unwrap();
    w.workloads
        .set_endpoint_status("us-east-1", "ep", "Deleting", None);
    w.store
        .put_workload(capacity_pilot::ports::WorkloadRecord {
            request_id: request_id("r2"),
            reservation_id: plan(TargetResource::Endpoint).id,
            slot: 0,
            generation: 1,
            resource_id: "ep".into(),
            state: "Retrying".into(),
            updated_at: opens(),

            started_at: None,
            ended_at: None,
            ran: Vec::new(),
            relaunch: 0,
        })
        .await
        .unwrap();

    // WHEN launch ticks
    w.launcher().handle(tick("t2")).await.unwrap();

    // THEN it waits: no create, and the window does not run
    assert_eq!(w.workloads.calls_of(WorkloadsOp::CreateEndpoint).len(), 1);
    assert_eq!(w.status("r2").await, RequestStatus::Reserved);
}

/// GIVEN request r1 for a HyperPod group in a cluster not tagged managed (so a launch is
/// refused for good, ARCHITECTURE §8.7).
fn theirs_hyperpod(w: &World) -> CapacityRequest {
    w.workloads.add_cluster("us-east-1", "theirs", false);
    let mut req = request("r1", "team-a", "5000");
    req.workload = WorkloadDetail::HyperpodCluster {
        cluster_name: "theirs".into(),
        instance_group_name: "g".into(),
        life_cycle_config: None,
    };
    req
}

#[tokio::test]
async fn a_hyperpod_cluster_without_the_managed_tag_is_refused() {
    let w = World::new();
    let req = theirs_hyperpod(&w);
    w.reserved(req, plan(TargetResource::HyperpodCluster), opens())
        .await;
    w.clock.set(opens());

    w.launcher().handle(tick("t1")).await.unwrap();

    assert!(
        w.workloads
            .calls_of(WorkloadsOp::PutInstanceGroup)
            .is_empty()
    );
    assert_eq!(w.status("r1").await, RequestStatus::Failed);
    let failed = &w.events.published_of("Capacity Request Failed")[0].detail;
    assert!(
        failed["reason"].as_str().unwrap().contains("managed"),
        "{failed}"
    );
    // AND the refused window ends with the request, in the same write: nothing runs on in
    // it, and the final event lists no window kept
    assert_eq!(failed["kept_windows"], serde_json::json!([]));
    let rec = w
        .store
        .get_request(&capacity_pilot::fakes::fixtures::request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        rec.windows
            .iter()
            .all(|x| x.state == capacity_pilot::domain::window::WindowState::Ended),
        "{:?}",
        rec.windows
    );
}

fn on_demand_first(id: &str) -> CapacityRequest {
    let mut req = ec2_request(id);
    req.strategy = Strategy::OnDemandFirst;
    req.products = vec![Product::OnDemand, Product::CapacityBlock];
    req.window.earliest_start = t0();
    req
}

#[tokio::test]
async fn on_demand_first_launches_on_demand_and_debits_the_estimate() {
    let w = World::new();
    w.record(on_demand_first("r1"), RequestStatus::TryingOnDemand, t0());

    w.launcher().handle(tick("t1")).await.unwrap();
    w.launcher().handle(tick("t2")).await.unwrap();

    // 24 h x 2 x $55.04
    assert_eq!(w.spent(), MicroUsd(2_641_920_000));
    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    assert_eq!(w.workloads.instances().len(), 2);
    let launched = &w.events.published_of("Capacity Workload Launched")[0].detail;
    assert_eq!(launched["estimated_cost_usd"], "2641.92");
    assert_eq!(launched["reservation_id"], "on-demand");
}

#[tokio::test]
async fn under_plan_only_nothing_is_launched_on_demand_and_the_request_is_planned_instead() {
    // GIVEN an on-demand-first request accepted before the deployment went plan-only
    let w = World::new();
    w.record(on_demand_first("r1"), RequestStatus::TryingOnDemand, t0());

    // WHEN launch-workloads wakes up under PurchaseMode plan-only
    w.launcher_with(&[("PURCHASE_MODE", "plan-only")])
        .handle(tick("t1"))
        .await
        .unwrap();

    // THEN nothing is launched or held, and the request searches to be planned
    assert!(w.workloads.instances().is_empty());
    assert_eq!(w.spent(), MicroUsd(0));
    let rec = w.record_of("r1").await;
    assert_eq!(rec.status, RequestStatus::Searching);
    assert!(rec.open_debit.is_none());
    assert!(rec.reason.contains("plan-only"), "{}", rec.reason);
}

#[tokio::test]
async fn under_plan_only_an_on_demand_estimate_already_held_runs_its_course() {
    // GIVEN an on-demand-first request whose estimate was held before plan-only was set
    let w = World::new();
    w.record(on_demand_first("r1"), RequestStatus::TryingOnDemand, t0());
    w.launcher().handle(tick("t1")).await.unwrap();
    let held = w.record_of("r1").await;
    assert!(held.open_debit.is_some(), "{}", held.reason);
    // WHEN it wakes up under plan-only
    w.launcher_with(&[("PURCHASE_MODE", "plan-only")])
        .handle(tick("t2"))
        .await
        .unwrap();
    // THEN it is not planned over what may be running: it launches as the hold allowed
    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    assert_eq!(w.workloads.instances().len(), 2);
}

fn pause() -> capacity_pilot::ports::Pause {
    capacity_pilot::ports::Pause {
        by: "arn:aws:sts::123456789012:assumed-role/ops/dana".into(),
        reason: "budget review".into(),
        since: t0(),
    }
}

#[tokio::test]
async fn a_pause_committed_after_the_ticks_read_stops_an_on_demand_hold_and_is_told_once() {
    // GIVEN an on-demand-first request due, and an operator who pauses after the tick's read
    let w = World::new();
    w.record(on_demand_first("r1"), RequestStatus::TryingOnDemand, t0());
    w.store
        .pause_before_next(capacity_pilot::fakes::StoreOp::Transition, pause());

    // WHEN the tick goes on to hold the estimate
    w.launcher().handle(tick("t1")).await.unwrap();

    // THEN nothing is held or launched, and r1 says why in its reason and history
    assert_eq!(w.spent(), MicroUsd(0));
    assert!(w.workloads.instances().is_empty());
    let rec = w.record_of("r1").await;
    assert_eq!(
        (rec.status, rec.open_debit),
        (RequestStatus::TryingOnDemand, None)
    );
    assert!(
        rec.reason.starts_with("paused by") && rec.reason.contains("budget review"),
        "{}",
        rec.reason
    );
    let told = w.store.history(&request_id("r1")).await.unwrap();
    assert_eq!(told.last().unwrap().reason, rec.reason);

    // AND the next ticks, which read the pause, leave it alone: no placement read, no write
    let calls = w.workloads.calls().len();
    w.clock.advance(Duration::minutes(1));
    w.launcher().handle(tick("t2")).await.unwrap();
    assert_eq!(w.workloads.calls().len(), calls);
    assert_eq!(
        w.store.history(&request_id("r1")).await.unwrap().len(),
        told.len()
    );

    // WHEN purchases resume, the next tick holds and launches
    w.store.delete_pause().await.unwrap();
    w.clock.advance(Duration::minutes(1));
    w.launcher().handle(tick("t3")).await.unwrap();
    w.launcher().handle(tick("t4")).await.unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    assert_eq!(w.spent(), MicroUsd(2_641_920_000));
}

#[tokio::test]
async fn under_a_pause_a_window_bought_before_it_launches_when_it_opens() {
    // GIVEN a reserved window opening, and purchases paused
    let w = World::new();
    w.reserved(ec2_request("r1"), block("cr-1", 2, "us-east-1b"), opens())
        .await;
    w.store.put_pause(pause()).await.unwrap().unwrap();
    w.clock.set(opens() + Duration::minutes(1));
    // WHEN the tick comes
    w.launcher().handle(tick("t1")).await.unwrap();
    // THEN what was paid for runs
    assert_eq!(w.workloads.live_in_reservation("cr-1").len(), 2);
    assert_eq!(w.status("r1").await, RequestStatus::Active);
}

#[tokio::test]
async fn no_on_demand_capacity_falls_back_to_searching_without_a_kept_debit() {
    let w = World::new();
    w.record(on_demand_first("r1"), RequestStatus::TryingOnDemand, t0());
    w.workloads.deny_capacity(LaunchKind::OnDemand);

    w.launcher().handle(tick("t1")).await.unwrap();

    assert_eq!(w.spent(), MicroUsd(0));
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::Searching);
    assert_eq!(rec.spent, MicroUsd(0));
    assert!(rec.reason.contains("delay"), "{}", rec.reason);
    assert!(w.workloads.live_in_reservation("on-demand").is_empty());
}

#[tokio::test]
async fn a_partial_on_demand_launch_taken_back_keeps_an_hour_of_each_instance_that_started() {
    // GIVEN an on-demand-first request for 2 instances whose only zone starts one, then has
    // no capacity for the second (found by the simulation: EC2 billed the first, the whole
    // estimate went back)
    let w = World::new();
    let mut req = on_demand_first("r1");
    if let WorkloadDetail::Ec2Instances { subnet_ids, .. } = &mut req.workload {
        subnet_ids.truncate(1);
    }
    w.record(req, RequestStatus::TryingOnDemand, t0());
    w.workloads
        .zone_capacity(LaunchKind::OnDemand, "us-east-1a", 1);

    w.launcher().handle(tick("t1")).await.unwrap();

    // THEN the started instance is terminated, and one instance-hour of the estimate
    // ($2641.92 for 2 x 24 h) stays spent: $55.04
    assert!(w.workloads.live_in_reservation("on-demand").is_empty());
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::Searching);
    assert_eq!(rec.open_debit, None);
    assert_eq!(rec.spent, MicroUsd(55_040_000));
    assert_eq!(w.spent(), MicroUsd(55_040_000));
}

/// GIVEN an on-demand-first request for 2 instances (in one subnet, us-east-1a, unless
/// `both_zones`) with room for one in us-east-1a.
fn partly_placeable(both_zones: bool) -> World {
    let w = World::new();
    let mut req = on_demand_first("r1");
    if let WorkloadDetail::Ec2Instances { subnet_ids, .. } = &mut req.workload
        && !both_zones
    {
        subnet_ids.truncate(1);
    }
    w.record(req, RequestStatus::TryingOnDemand, t0());
    w.workloads
        .zone_capacity(LaunchKind::OnDemand, "us-east-1a", 1);
    w
}

/// The launcher's first run on `w` dies right after occurrence `nth` of port call `call`
/// (the store's and the workloads' calls pass one gate).
async fn first_run_dies(w: &World, call: &str, nth: u32) {
    let gate = capacity_pilot::fakes::Gate::new();
    w.store.gate(gate.clone());
    w.workloads.gate(gate.clone());
    gate.die_after(call, nth);
    gate.arm(&[None], false);
    let first = w.launcher();
    let died = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        first.handle(tick("t1")),
    )
    .await
    .is_err();
    assert!(died, "the first run was to die");
    let at = gate.crashed(0).expect("where it died");
    assert!(at.ends_with(&format!("right after {call}")), "{at}");
    gate.disarm();
}

#[tokio::test]
async fn a_take_back_cut_short_by_a_crash_keeps_an_hour_of_each_instance_of_both_runs() {
    // GIVEN the partial launch above, whose first run dies right after it took its started
    // instance back, before the release is written (found by the simulation, seed 1665: the
    // retry relaunched the slot, whose record replaced the first instance's, and one
    // instance-hour EC2 billed went back)
    let w = partly_placeable(false);
    // (PutWorkload: slot 0's intent and record, slot 1's intent and refusal, then slot 0's
    // take-back begun and done: the run dies right after that, before the release)
    first_run_dies(&w, "PutWorkload", 5).await;
    // WHEN Lambda retries it
    w.launcher().handle(tick("t1")).await.unwrap();
    // THEN both runs' instances are taken back, and an hour of each stays spent: 2 x $55.04
    assert!(w.workloads.live_in_reservation("on-demand").is_empty());
    // (each run started slot 0 and was refused slot 1)
    assert_eq!(
        launches(&w)
            .iter()
            .filter(|s| s.market == LaunchMarket::OnDemand)
            .count(),
        4
    );
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.open_debit, None);
    assert_eq!(rec.spent, MicroUsd(110_080_000));
    assert_eq!(w.spent(), MicroUsd(110_080_000));
}

/// An on-demand-first request for 2 instances in two zones with room for one each, whose
/// first run died right after holding the estimate; then two runs of that hold at once (a
/// retry beside the tick), interleaving at every store call, the second started `lag`
/// steps after the first. Returns the world after both.
async fn two_runs_of_one_hold(lag: usize) -> World {
    let w = partly_placeable(true);
    w.workloads
        .zone_capacity(LaunchKind::OnDemand, "us-east-1b", 1);
    first_run_dies(&w, "Transition", 0).await;
    assert!(w.record_of("r1").await.open_debit.is_some());
    w.store.interleave();
    let (a, b) = (w.launcher(), w.launcher());
    let late = async {
        for _ in 0..lag {
            tokio::task::yield_now().await;
        }
        b.handle(tick("t2")).await
    };
    let (ra, rb) = tokio::join!(a.handle(tick("t1")), late);
    ra.unwrap();
    rb.unwrap();
    w
}

#[tokio::test]
async fn two_runs_of_one_hold_at_once_keep_an_hour_of_every_instance_either_took_back() {
    // GIVEN two runs of one hold at once, at each of 16 lags (found by the simulation, seed
    // 14792: each took back some of the instances, and the release that landed counted
    // only its own)
    let mut released = 0;
    for lag in 0..16 {
        let w = two_runs_of_one_hold(lag).await;
        // THEN either the run runs, its estimate held; or nothing runs, and an hour of each
        // instance EC2 started stays spent ($55.04 each)
        let started = w.workloads.instances();
        let rec = w.record_of("r1").await;
        if rec.status == RequestStatus::RunningOnDemand {
            assert!(!live_ids(&w).is_empty(), "lag {lag}: {started:?}");
            assert_eq!(rec.open_debit, Some(MicroUsd(2_641_920_000)), "lag {lag}");
            continue;
        }
        released += 1;
        assert!(live_ids(&w).is_empty(), "lag {lag}: {started:?}");
        assert_eq!(rec.open_debit, None, "lag {lag}");
        let hourly = MicroUsd(55_040_000 * i64::try_from(started.len()).unwrap());
        assert_eq!((rec.spent, w.spent()), (hourly, hourly), "lag {lag}");
    }
    assert!(released > 8, "{released} of 16 lags released");
}

#[tokio::test]
async fn two_runs_of_one_hold_at_once_leave_no_live_instance_unrecorded() {
    // GIVEN two runs of one hold at once, at each of 16 lags
    for lag in 0..16 {
        let w = two_runs_of_one_hold(lag).await;
        // THEN every live instance is a slot's recorded one. (Before runs claimed a hold:
        // at lag 7 one run counted a slot the other had placed in us-east-1b as launched,
        // finished in 1a, and the other's take-back terminated that slot's instance and
        // recorded another's, a run one short beside an instance no record names; at lag 8
        // the release left one running that nothing would ever stop.)
        let recorded = recorded_ids(&w).await;
        let live = live_ids(&w);
        assert!(
            live.iter().all(|i| recorded.contains(i)),
            "lag {lag}: live {live:?}, recorded {recorded:?}"
        );
    }
}

#[tokio::test]
async fn a_run_dying_between_a_take_back_and_its_record_leaves_no_dead_instance_in_the_run() {
    // GIVEN the partial launch above (one subnet, room for one of two), whose first run
    // dies right after TerminateInstances took its started instance back, before recording
    // it; then room for both (found by the simulation, seed 545: the retry counted the dead
    // instance as launched, and the run ran one short, charged in full)
    let w = partly_placeable(false);
    first_run_dies(&w, "TerminateInstances", 0).await;
    w.workloads
        .zone_capacity(LaunchKind::OnDemand, "us-east-1a", 2);
    // WHEN Lambda retries it
    w.launcher().handle(tick("t1")).await.unwrap();
    // THEN the run runs two live instances, each recorded
    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    let live = live_ids(&w);
    let running = recorded_ids(&w).await;
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(
        running.iter().all(|i| live.contains(i)),
        "{running:?} {live:?}"
    );
}

#[tokio::test]
async fn a_run_dying_after_run_instances_in_its_second_zone_leaves_no_instance_unrecorded() {
    // GIVEN an on-demand-first request for 2 instances: us-east-1a has room for one, 1b
    // for both. The first run starts 1a's one, takes it back, and dies right after its
    // RunInstances in 1b, before recording what started (found by the simulation, seed
    // 277: the retry began again in 1a, and the instance the dead run started in 1b ran
    // unrecorded and unbilled for two days)
    let w = partly_placeable(true);
    // launches: 1a slot 0 (started), 1a slot 1 (refused), 1b slot 0: the run dies after it
    first_run_dies(&w, "LaunchInstances", 2).await;
    assert_eq!(placed(&w), vec![("us-east-1".into(), "us-east-1b".into())]);
    // WHEN Lambda retries it
    w.launcher().handle(tick("t1")).await.unwrap();
    // THEN the run runs its two instances, each recorded, and nothing else is left running
    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    let recorded: Vec<String> = w
        .store
        .workloads(&request_id("r1"))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.resource_id)
        .collect();
    let live = live_ids(&w);
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(
        live.iter().all(|i| recorded.contains(i)),
        "{live:?} {recorded:?}"
    );
}

/// An on-demand-first request naming a subnet in each of two zones of us-east-1 and one in
/// us-west-2, as the launcher allowing both regions sees it.
fn two_regions(w: &World, id: &str) -> (CapacityRequest, L) {
    w.workloads
        .add_subnet("us-west-2", "subnet-w", "us-west-2a");
    let mut req = on_demand_first(id);
    req.regions = vec!["us-east-1".into(), "us-west-2".into()];
    if let WorkloadDetail::Ec2Instances { subnet_ids, .. } = &mut req.workload {
        subnet_ids.push("subnet-w".into());
    }
    (
        req,
        w.launcher_with(&[("ALLOWED_REGIONS", "us-east-1,us-west-2")]),
    )
}

/// Every RunInstances the launcher made, in order.
fn launches(w: &World) -> Vec<capacity_pilot::ports::LaunchSpec> {
    w.workloads
        .calls_of(WorkloadsOp::LaunchInstances)
        .into_iter()
        .filter_map(|c| match c {
            WorkloadsCall::LaunchInstances(spec) => Some(spec),
            _ => None,
        })
        .collect()
}

/// What r1's slot records name, but for those recorded terminated.
async fn recorded_ids(w: &World) -> Vec<String> {
    w.store
        .workloads(&request_id("r1"))
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.state != "terminated")
        .map(|r| r.resource_id)
        .collect()
}

/// The ids of the live instances.
fn live_ids(w: &World) -> Vec<String> {
    w.workloads
        .instances()
        .into_iter()
        .filter(|i| i.state.is_live())
        .map(|i| i.instance_id)
        .collect()
}

/// Where the request's live instances are, as (region, zone) per instance.
fn placed(w: &World) -> Vec<(String, String)> {
    w.workloads
        .instances()
        .into_iter()
        .filter(|i| i.state.is_live())
        .map(|i| (i.region, i.availability_zone))
        .collect()
}

#[tokio::test]
async fn a_zone_that_does_not_offer_the_type_sends_on_demand_to_the_next_zone() {
    let w = World::new();
    let (req, l) = two_regions(&w, "r1");
    w.record(req, RequestStatus::TryingOnDemand, t0());
    w.workloads.refuse(
        LaunchKind::OnDemand,
        "us-east-1",
        Some("us-east-1a"),
        "Unsupported",
    );

    l.handle(tick("t1")).await.unwrap();

    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    assert_eq!(
        placed(&w),
        vec![("us-east-1".to_string(), "us-east-1b".to_string()); 2]
    );
    // One estimate held, for the one attempt that ran.
    assert_eq!(w.spent(), MicroUsd(2_641_920_000));
}

#[tokio::test]
async fn a_subnet_without_free_addresses_sends_on_demand_to_the_same_zones_next_subnet() {
    // Issue 50: GIVEN the request's first subnet (us-east-1a) full, and another subnet of the
    // request in the same zone, listed after us-east-1b's
    let w = World::new();
    w.workloads
        .add_subnet("us-east-1", "subnet-a2", "us-east-1a");
    let mut req = on_demand_first("r1");
    if let WorkloadDetail::Ec2Instances { subnet_ids, .. } = &mut req.workload {
        *subnet_ids = vec!["subnet-a".into(), "subnet-a2".into(), "subnet-b".into()];
    }
    w.record(req, RequestStatus::TryingOnDemand, t0());
    w.workloads.subnet_room("us-east-1", "subnet-a", 0);

    w.launcher().handle(tick("t1")).await.unwrap();

    // THEN only that subnet is ruled out: both instances run in the zone's other subnet
    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    let subnets: Vec<String> = launches(&w)
        .into_iter()
        .map(|spec| spec.subnet_id)
        .collect();
    assert_eq!(subnets, ["subnet-a", "subnet-a2", "subnet-a2"]);
}

#[tokio::test]
async fn an_account_limit_skips_the_regions_other_zones_and_launches_in_the_next_region() {
    let w = World::new();
    let (req, l) = two_regions(&w, "r1");
    w.record(req, RequestStatus::TryingOnDemand, t0());
    w.workloads
        .refuse(LaunchKind::OnDemand, "us-east-1", None, "VcpuLimitExceeded");

    l.handle(tick("t1")).await.unwrap();

    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    assert_eq!(
        placed(&w),
        vec![("us-west-2".to_string(), "us-west-2a".to_string()); 2]
    );
    // The limit is the region's: subnet-b in us-east-1 was never tried.
    let subnets: Vec<String> = launches(&w)
        .into_iter()
        .map(|spec| spec.subnet_id)
        .collect();
    assert!(!subnets.contains(&"subnet-b".to_string()), "{subnets:?}");
}

#[tokio::test]
async fn limits_on_demand_everywhere_send_an_interruptible_request_to_spot_then_the_reservation() {
    let w = World::new();
    let (mut req, l) = two_regions(&w, "r1");
    req.interruptible = true;
    w.record(req.clone(), RequestStatus::TryingOnDemand, t0());
    for region in ["us-east-1", "us-west-2"] {
        w.workloads
            .refuse(LaunchKind::OnDemand, region, None, "InstanceLimitExceeded");
    }

    l.handle(tick("t1")).await.unwrap();

    assert_eq!(w.status("r1").await, RequestStatus::RunningSpot);

    // AND with spot's own limit reached in both regions too, the request falls back.
    let w = World::new();
    let (_, l) = two_regions(&w, "r2");
    let mut req2 = req;
    req2.id = request_id("r2");
    w.record(req2, RequestStatus::TryingOnDemand, t0());
    for region in ["us-east-1", "us-west-2"] {
        w.workloads
            .refuse(LaunchKind::OnDemand, region, None, "VcpuLimitExceeded");
        w.workloads.refuse(
            LaunchKind::Spot,
            region,
            None,
            "MaxSpotInstanceCountExceeded",
        );
    }

    l.handle(tick("t1")).await.unwrap();

    let rec = w
        .store
        .get_request(&request_id("r2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::Searching);
    assert_eq!(rec.spent, MicroUsd(0), "both held estimates were released");
    for said in [
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "us-west-2",
        "falling back",
    ] {
        assert!(rec.reason.contains(said), "{said}: {}", rec.reason);
    }
    assert!(placed(&w).is_empty());
}

#[tokio::test]
async fn a_partial_launch_undone_in_one_zone_launches_anew_in_the_next_without_reusing_a_token() {
    let w = World::new();
    let (req, l) = two_regions(&w, "r1");
    w.record(req, RequestStatus::TryingOnDemand, t0());
    // GIVEN subnet-a's zone launches the first slot, then has no capacity for the second
    w.workloads
        .zone_capacity(LaunchKind::OnDemand, "us-east-1a", 1);

    l.handle(tick("t1")).await.unwrap();

    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    let live = placed(&w);
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(live.iter().all(|(_, z)| z == "us-east-1b"), "{live:?}");
    let tokens: Vec<String> = launches(&w)
        .into_iter()
        .map(|spec| spec.client_token)
        .collect();
    let mut distinct = tokens.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), tokens.len(), "{tokens:?}");
}

#[tokio::test]
async fn a_launch_failing_mid_way_is_retried_by_the_next_tick_without_duplicates() {
    let w = World::new();
    w.reserved(ec2_request("r1"), block("cr-1", 3, "us-east-1b"), opens())
        .await;
    w.clock.set(opens());
    let l = w.launcher();
    // GIVEN only one slot of the block is usable yet, and slot 0's launch response is lost
    w.workloads
        .add_reservation_capacity("cr-1", 1, Some("us-east-1b"));
    w.workloads
        .apply_then_fail_next(WorkloadsOp::LaunchInstances, errors::outcome_unknown("ec2"));
    // WHEN the first invocation's launch of slot 0 loses its response
    assert!(l.handle(tick("t1")).await.is_err());
    assert_eq!(w.status("r1").await, RequestStatus::Reserved);
    // AND the next tick launches slot 0 again (the same instance) and stops at slot 1
    w.clock.advance(Duration::minutes(1));
    l.handle(tick("t2")).await.unwrap();
    assert_eq!(w.workloads.instances().len(), 1);
    assert_eq!(w.status("r1").await, RequestStatus::Reserved);
    // AND once every slot is there, the tick after launches the rest
    w.workloads
        .add_reservation_capacity("cr-1", 3, Some("us-east-1b"));
    w.clock.advance(Duration::minutes(1));
    l.handle(tick("t3")).await.unwrap();

    // THEN exactly three instances exist, and the request is Active once
    assert_eq!(w.workloads.instances().len(), 3);
    assert_eq!(w.status("r1").await, RequestStatus::Active);
    assert_eq!(w.events.published_of("Capacity Workload Launched").len(), 1);
}

#[tokio::test]
async fn the_on_demand_estimate_is_held_before_launching_and_a_crash_in_between_debits_once() {
    // GIVEN an on-demand-first request at its desired start, and the launch failing once
    // after the estimate is held (the function dies before RunInstances answers)
    let w = World::new();
    w.record(on_demand_first("r1"), RequestStatus::TryingOnDemand, t0());
    w.workloads.fail_next(
        WorkloadsOp::LaunchInstances,
        PortError::Transient {
            service: "ec2",
            code: "InternalError".into(),
            message: "crash".into(),
        },
    );

    // WHEN launch-workloads runs
    assert!(w.launcher().handle(tick("t1")).await.is_err());

    // THEN the estimate (24 h x 2 x $55.04) is already held against the caps, nothing runs
    let held = MicroUsd(2_641_920_000);
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::TryingOnDemand);
    assert_eq!(rec.open_debit, Some(held));
    assert_eq!(w.spent(), held);
    assert!(w.workloads.instances().is_empty());

    // WHEN the next tick comes, a minute later (the dead run's claim has expired)
    w.clock.advance(Duration::minutes(1));
    w.launcher().handle(tick("t2")).await.unwrap();

    // THEN it launches under the same hold: debited once, and the hold stays open while it
    // runs (settled by the hours it ran when it ends)
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::RunningOnDemand);
    assert_eq!(rec.open_debit, Some(held));
    let run = rec.run.expect("the run is recorded");
    assert_eq!(
        (run.attempt.as_str(), run.started_at),
        ("on-demand", Some(t0() + Duration::minutes(1)))
    );
    assert_eq!(rec.spent, held);
    assert_eq!(w.spent(), held);
    assert_eq!(w.workloads.instances().len(), 2);
}

/// GIVEN an on-demand-first request whose estimate is held and whose instances run, but whose
/// run was never recorded: tick 1 holds and dies in RunInstances, tick 2 launches and dies
/// before its write. Returns the held estimate.
async fn launched_but_unrecorded(w: &World, req: CapacityRequest) -> MicroUsd {
    w.record(req, RequestStatus::TryingOnDemand, t0());
    let crash = PortError::Transient {
        service: "ec2",
        code: "InternalError".into(),
        message: "crash".into(),
    };
    w.workloads
        .fail_next(WorkloadsOp::LaunchInstances, crash.clone());
    assert!(w.launcher().handle(tick("t1")).await.is_err());
    // (each tick a minute after the last: a failed run's claim lasts its function timeout)
    w.clock.advance(Duration::minutes(1));
    // (its slots read by the launch and then for the run's record: it dies before that write)
    first_run_dies(w, "Workloads", 1).await;
    w.clock.advance(Duration::minutes(1));
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::TryingOnDemand);
    assert_eq!(w.workloads.instances().len(), 2);
    rec.open_debit.expect("the estimate is held")
}

/// The launcher after the deployment's price table changed since the hold.
fn repriced(w: &World) -> L {
    w.launcher_with(&[(
        "ON_DEMAND_PRICES_USD",
        r#"{"p5.48xlarge": {"on_demand": "60.00", "spot": "20.00"}}"#,
    )])
}

#[tokio::test]
async fn a_held_estimate_is_never_released_while_its_instances_run_when_prices_change() {
    // Issue 15 item 4 (review L3). GIVEN on-demand instances running under a held estimate,
    // unrecorded, and the deployment's price table changed since the hold
    let w = World::new();
    let held = launched_but_unrecorded(&w, on_demand_first("r1")).await;
    let repriced = repriced(&w);

    // WHEN the next tick runs under the new prices
    repriced.handle(tick("t3")).await.unwrap();

    // THEN it finds the same instances and records the run under the estimate it held (before
    // the fix: the hold's amount no longer matched, so it fell back and released the hold
    // while the two instances ran, undebited)
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::RunningOnDemand, "{}", rec.reason);
    assert_eq!(rec.open_debit, Some(held));
    assert_eq!(w.spent(), held);
    assert_eq!(w.workloads.instances().len(), 2);
}

#[tokio::test]
async fn an_interruptible_request_with_a_held_estimate_does_not_stick_on_a_second_hold() {
    // Issue 15 item 4 (review L3, spot). GIVEN the same, for a request that allows spot
    let w = World::new();
    let mut req = on_demand_first("r1");
    req.interruptible = true;
    let held = launched_but_unrecorded(&w, req).await;
    let repriced = repriced(&w);

    // WHEN the next tick runs (before the fix: the on-demand attempt was skipped, and the spot
    // hold failed on DebitAlreadyOpen every tick, stuck in TryingOnDemand)
    repriced.handle(tick("t3")).await.unwrap();

    // THEN the on-demand run is recorded under its hold, and no spot instance starts
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::RunningOnDemand, "{}", rec.reason);
    assert_eq!(rec.open_debit, Some(held));
    assert_eq!(w.workloads.instances().len(), 2);
}

#[tokio::test]
async fn an_on_demand_estimate_over_the_teams_cap_is_never_held_and_falls_back() {
    // GIVEN team-a has spent $99,000 of its $100,000 this month
    let w = World::new();
    w.record(on_demand_first("r1"), RequestStatus::TryingOnDemand, t0());
    let already = MicroUsd(99_000_000_000);
    w.store
        .set_spent(&team("team-a"), &BudgetMonth::of(t0()), already);

    // WHEN launch-workloads runs at the desired start
    w.launcher().handle(tick("t1")).await.unwrap();

    // THEN the $2641.92 estimate is refused by the cap: nothing held or launched, and the
    // request falls back to a reservation saying why
    let rec = w
        .store
        .get_request(&request_id("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::Searching);
    assert_eq!(rec.open_debit, None);
    assert_eq!(w.spent(), already);
    assert!(w.workloads.instances().is_empty());
    assert!(
        rec.reason.contains("would exceed team team-a's cap"),
        "{}",
        rec.reason
    );
}

#[test]
fn no_launching_function_runs_longer_than_the_launch_margin() {
    // The margin a launch leaves before the drain is these functions' template Timeout.
    let template = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../infra/template.yaml"
    ))
    .unwrap();
    let global: i64 = template
        .split("\nGlobals:")
        .nth(1)
        .and_then(|g| g.lines().find_map(|l| l.trim().strip_prefix("Timeout:")))
        .map(|v| v.trim().parse().unwrap())
        .expect("a global timeout");
    for function in ["LaunchWorkloadsFunction", "ReplaceUnhealthyFunction"] {
        let body: String = template
            .split(&format!("\n  {function}:\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("{function} in the template"))
            .lines()
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .collect::<Vec<_>>()
            .join("\n");
        let timeout = body
            .lines()
            .find_map(|l| l.trim().strip_prefix("Timeout:"))
            .map_or(global, |v| v.trim().parse().unwrap());
        assert!(
            timeout <= capacity_pilot::domain::time_rules::LAUNCH_FUNCTION_TIMEOUT.num_seconds(),
            "{function} times out after {timeout} s, past the launch margin"
        );
    }
}

/// GIVEN request r1 holding block cr-1 (a window pending until `opens()`), then moved to
/// `status` while it waits, as a split's kept block waits while the rest is decided.
async fn kept_window_of(w: &World, req: CapacityRequest, r: Reservation, status: RequestStatus) {
    w.reserved(req, r, opens()).await;
    let mut rec = w.record_of("r1").await;
    rec.status = status;
    rec.reason = format!("{status} while its kept block waits");
    rec.next_action_at = None;
    w.store.insert_record(rec);
}

#[tokio::test]
async fn a_cancelled_or_failed_requests_kept_window_is_launched_when_it_opens() {
    for status in [
        RequestStatus::Cancelled,
        RequestStatus::Failed,
        RequestStatus::Rejected,
    ] {
        // GIVEN a paid window not yet open, of a request that has since ended otherwise
        let w = World::new();
        kept_window_of(
            &w,
            ec2_request("r1"),
            block("cr-1", 2, "us-east-1b"),
            status,
        )
        .await;

        // WHEN the window opens and the schedule ticks
        w.clock.set(opens() + Duration::minutes(1));
        w.launcher().handle(tick("t1")).await.unwrap();

        // THEN its workload launches (ARCHITECTURE §9.1), announced; the status stays
        assert_eq!(w.workloads.live_in_reservation("cr-1").len(), 2, "{status}");
        assert_eq!(
            w.events.published_of("Capacity Workload Launched").len(),
            1,
            "{status}"
        );
        let rec = w.record_of("r1").await;
        assert_eq!(rec.status, status);
        assert!(
            rec.windows
                .iter()
                .all(|x| x.state == capacity_pilot::domain::window::WindowState::Running),
            "{status}: {:?}",
            rec.windows
        );
    }
}

#[tokio::test]
async fn a_refused_launch_into_a_failed_requests_window_ends_that_window_not_the_request_again() {
    // GIVEN a failed request's kept window into which AWS refuses to launch for good
    let w = World::new();
    let req = theirs_hyperpod(&w);
    kept_window_of(
        &w,
        req,
        plan(TargetResource::HyperpodCluster),
        RequestStatus::Failed,
    )
    .await;
    w.clock.set(opens());

    // WHEN the schedule ticks at the window's start, and again
    let out = w.launcher().handle(tick("t1")).await.unwrap();
    w.clock.set(opens() + Duration::minutes(1));
    w.launcher().handle(tick("t2")).await.unwrap();

    // THEN the window ends with the refusal as its reason, once; the request stays Failed
    // and no second Failed event goes out
    assert!(
        out.decisions
            .iter()
            .any(|d| d.action == "launch-refused" && d.reason.contains("managed")),
        "{:?}",
        out.decisions
    );
    let rec = w.record_of("r1").await;
    assert_eq!(rec.status, RequestStatus::Failed);
    assert!(
        rec.windows
            .iter()
            .all(|x| x.state == capacity_pilot::domain::window::WindowState::Ended)
    );
    assert!(w.events.published_of("Capacity Request Failed").is_empty());
}

#[tokio::test]
async fn a_launch_refused_into_a_block_not_recorded_as_paid_reads_the_payment_instead_of_failing() {
    // GIVEN r1's window open in a block whose payment is recorded pending, and a launch AWS
    // refuses for good
    let w = World::new();
    let req = theirs_hyperpod(&w);
    let mut unpaid = plan(TargetResource::HyperpodCluster);
    unpaid.state = ReservationState::PaymentPending;
    w.reserved(req, unpaid, opens()).await;
    w.clock.set(opens());

    // WHEN the schedule ticks at the window's start
    let out = w.launcher().handle(tick("t1")).await.unwrap();

    // THEN the request does not fail (before issue 48 it did, with the block's debit kept):
    // the block's payment is due a read now, for the purchase function
    assert!(
        out.decisions.iter().any(|d| d.action == "payment-read"),
        "{:?}",
        out.decisions
    );
    assert_eq!(w.status("r1").await, RequestStatus::Reserved);
    assert!(w.events.published_of("Capacity Request Failed").is_empty());
    let held = w
        .store
        .reservations(&capacity_pilot::fakes::fixtures::request_id("r1"))
        .await
        .unwrap();
    assert_eq!(held[0].payment_due(), Some(opens()));
}

// ---- holds above the approval threshold (review N9) ----------------------------------------

/// An approver's decision on `r1`'s hold awaiting approval, through the purchase protocols
/// purchase-capacity answers it with.
async fn decide_hold(w: &World, l: &L, approves: &str, approved: bool) {
    use capacity_pilot::domain::events::PurchaseDecision;
    use capacity_pilot::purchase::{Outcome, Protocols};
    let market = capacity_pilot::fakes::FakeMarket::new();
    let ids: capacity_pilot::ports::SharedIds = Arc::new(capacity_pilot::aws::ids::RandomIds);
    let sleep = capacity_pilot::ports::default_sleep();
    let p = Protocols {
        store: &w.store,
        market: &market,
        events: &w.events,
        config: &l.config,
        ids: &ids,
        sleep: &sleep,
    };
    let d = PurchaseDecision {
        request_id: "r1".into(),
        approver: "alice".into(),
        approves: Some(approves.into()),
        comment: None,
    };
    let bought = p
        .decide(
            &d,
            approved,
            &Cause::new(format!("decision-{approves}")),
            w.clock.get(),
            &mut Outcome::default(),
        )
        .await
        .unwrap();
    assert!(bought.is_none(), "a hold's approval buys nothing");
}

fn asked_for(w: &World) -> Vec<Value> {
    w.events
        .published_of("Capacity Purchase Awaiting Approval")
        .into_iter()
        .map(|e| e.detail.clone())
        .collect()
}

#[tokio::test]
async fn under_approve_all_every_on_demand_hold_waits_for_an_approver() {
    // GIVEN an on-demand-first request with no threshold of its own, on a deployment whose
    // PurchaseMode is approve-all (the approval gate at threshold 0)
    let w = World::new();
    w.record(on_demand_first("r1"), RequestStatus::TryingOnDemand, t0());

    // WHEN its desired start comes
    w.launcher_with(&[("PURCHASE_MODE", "approve-all")])
        .handle(tick("t1"))
        .await
        .unwrap();

    // THEN its hold waits for an approver: nothing held or launched
    let rec = w.record_of("r1").await;
    assert_eq!(
        rec.status,
        RequestStatus::AwaitingApproval,
        "{}",
        rec.reason
    );
    assert_eq!(rec.open_debit, None);
    assert!(w.launches().is_empty());
    let asked = asked_for(&w);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["kind"], "on-demand");
    assert_eq!(asked[0]["approval_above_usd"], "0");
}

#[tokio::test]
async fn an_on_demand_hold_above_the_approval_threshold_holds_and_launches_nothing_until_approved()
{
    // GIVEN an on-demand-first request whose estimate ($2,641.92) is above its threshold
    let w = World::new();
    let mut req = on_demand_first("r1");
    req.budget.approval_above = Some(Usd::parse("1000").unwrap());
    w.record(req, RequestStatus::TryingOnDemand, t0());
    let l = w.launcher();

    // WHEN its desired start comes
    l.handle(tick("t1")).await.unwrap();
    l.handle(tick("t2")).await.unwrap();

    // THEN it awaits an approver, nothing held or launched, announced once with its kind
    let rec = w.record_of("r1").await;
    assert_eq!(rec.status, RequestStatus::AwaitingApproval);
    assert_eq!(rec.open_debit, None);
    assert_eq!(w.spent(), MicroUsd(0));
    assert!(w.launches().is_empty());
    assert_eq!(rec.next_action_at, Some(t0() + Duration::minutes(30)));
    let asked = asked_for(&w);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["kind"], "on-demand");
    assert_eq!(asked[0]["upfront_fee_usd"], "2641.92");
    assert_eq!(asked[0]["approval_above_usd"], "1000");
    assert_eq!(asked[0]["hold"]["estimate_usd"], "2641.92");
    assert_eq!(asked[0]["hold"]["instance_count"], 2);
    assert!(asked[0].get("plan").is_none());
    let key = asked[0]["event_key"].as_str().unwrap().to_string();
    assert!(key.starts_with("r1:awaiting-approval:on-demand-"), "{key}");

    // AND once approved, the next tick holds the estimate and launches
    decide_hold(&w, &l, &key, true).await;
    assert_eq!(w.status("r1").await, RequestStatus::TryingOnDemand);
    l.handle(tick("t3")).await.unwrap();
    l.handle(tick("t4")).await.unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    assert_eq!(w.spent(), MicroUsd(2_641_920_000));
    assert_eq!(
        asked_for(&w).len(),
        1,
        "an approved hold is not asked for again"
    );
}

#[tokio::test]
async fn the_deployments_threshold_gates_a_hold_on_the_requests_whole_spend() {
    // GIVEN APPROVE_ABOVE_USD $3,000 and a request that already spent $500: the estimate
    // alone ($2,641.92) is below it, the two together are not
    let w = World::new();
    w.record(on_demand_first("r1"), RequestStatus::TryingOnDemand, t0());
    let mut rec = w.record_of("r1").await;
    rec.spent = Usd::parse("500").unwrap().to_micros_ceil();
    w.store.insert_record(rec);
    let l = w.launcher_with(&[("APPROVE_ABOVE_USD", "3000")]);

    l.handle(tick("t1")).await.unwrap();

    let rec = w.record_of("r1").await;
    assert_eq!(rec.status, RequestStatus::AwaitingApproval);
    assert!(w.launches().is_empty());
    assert_eq!(asked_for(&w)[0]["spent_usd"], "500");
    assert!(rec.reason.contains("on top of the $500"), "{}", rec.reason);

    // AND without the earlier spend the same hold goes on unasked
    let w = World::new();
    w.record(on_demand_first("r1"), RequestStatus::TryingOnDemand, t0());
    let l = w.launcher_with(&[("APPROVE_ABOVE_USD", "3000")]);
    l.handle(tick("t1")).await.unwrap();
    l.handle(tick("t2")).await.unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::RunningOnDemand);
    assert!(asked_for(&w).is_empty());
}

#[tokio::test]
async fn an_approved_spot_hold_goes_on_from_spot_without_asking_for_on_demand_again() {
    // GIVEN an interruptible request whose on-demand and spot estimates are both above its
    // threshold, and no on-demand capacity
    let w = World::new();
    let mut req = on_demand_first("r1");
    req.interruptible = true;
    req.budget.approval_above = Some(Usd::parse("100").unwrap());
    w.record(req, RequestStatus::TryingOnDemand, t0());
    w.workloads.deny_capacity(LaunchKind::OnDemand);
    let l = w.launcher();

    // WHEN on-demand is approved, held, finds no capacity and is released, and spot is asked
    l.handle(tick("t1")).await.unwrap();
    let on_demand = asked_for(&w)[0]["event_key"].as_str().unwrap().to_string();
    decide_hold(&w, &l, &on_demand, true).await;
    l.handle(tick("t2")).await.unwrap();
    let asked = asked_for(&w);
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(asked[1]["kind"], "spot");
    assert_eq!(w.status("r1").await, RequestStatus::AwaitingApproval);
    assert_eq!(
        w.spent(),
        MicroUsd(0),
        "the on-demand estimate was released"
    );

    // THEN spot's approval runs spot, and on-demand is not asked for again
    let spot = asked[1]["event_key"].as_str().unwrap().to_string();
    decide_hold(&w, &l, &spot, true).await;
    l.handle(tick("t3")).await.unwrap();
    l.handle(tick("t4")).await.unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::RunningSpot);
    assert_eq!(asked_for(&w).len(), 2);
}
