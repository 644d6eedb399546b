//! Whole lifecycles of SageMaker workloads on training plans: the five real handlers, the
//! real adapters, the offline emulator (its SageMaker, its EventBridge and its clock) and
//! moto's DynamoDB. Training plans emit no EventBridge events, so launch and cleanup run
//! from schedule ticks after the simulated clock has been advanced. Outcomes are judged
//! from what the emulator holds (plans, jobs, endpoints, clusters) and what reached the bus.

use capacity_pilot::domain::money::{MicroUsd, Usd};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::Store;
use chrono::{DateTime, TimeDelta, Utc};
use integration_tests::flow::{Flow, Function, REGION, t0};
use local_cloud::market::Segment;
use local_cloud::sagemaker::{Plan, TrainingJob};
use serde_json::{Value, json};

/// A training-job request on a training plan: 2 x ml.p5.48xlarge for `hours`.
pub(crate) fn training_request(id: &str, hours: u32, earliest: &str, latest: &str) -> Value {
    json!({
        "schema_version": 1, "request_id": id, "team": "team-b",
        "instance_types": ["ml.p5.48xlarge"], "instance_count": 2, "duration_hours": hours,
        "earliest_start": earliest, "latest_end": latest,
        "regions": [REGION],
        "budget": {"max_upfront_usd": "20000"},
        "workload": {"kind": "training-job",
            "training_image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/eval:2026.11",
            "output_s3_uri": "s3://team-b-models/eval/",
            "volume_size_gb": 500,
            "hyper_parameters": {"epochs": "3"}},
        "drain_minutes": 20,
        "tags": {"project": "model-eval"}
    })
}

/// Every training plan the emulator holds: each test has its own emulator, so these are
/// all the plans bought in the test.
fn plans(f: &Flow) -> Vec<Plan> {
    f.cloud
        .with_world(|w| w.sm.plans.values().cloned().collect())
}

/// The one plan bought for `id`, asserting that it is the only plan the emulator sold.
/// The name of the request's plan `attempt` in the flows' deployment (the default id).
pub(crate) fn plan_name_for(id: &str, attempt: u32) -> String {
    capacity_pilot::domain::naming::plan_name(
        &capacity_pilot::domain::request::RequestId::parse(id).unwrap(),
        capacity_pilot::config::DEFAULT_DEPLOYMENT_ID,
        attempt,
    )
}

pub(crate) fn the_plan(f: &Flow, id: &str) -> Plan {
    let all = plans(f);
    assert_eq!(
        all.len(),
        1,
        "exactly one plan bought: {:?}",
        all.iter().map(|p| &p.name).collect::<Vec<_>>()
    );
    assert_eq!(all[0].name, plan_name_for(id, 0), "named for the request");
    all[0].clone()
}

pub(crate) fn job(f: &Flow, name: &str) -> Option<TrainingJob> {
    f.cloud.with_world(|w| {
        w.sm.jobs
            .get(&(REGION.to_string(), name.to_string()))
            .cloned()
    })
}

fn jobs(f: &Flow) -> Vec<TrainingJob> {
    f.cloud
        .with_world(|w| w.sm.jobs.values().cloned().collect())
}

/// The detail-types published on our bus about `id`, in order.
fn published(f: &Flow, id: &str) -> Vec<String> {
    f.cloud
        .events(integration_tests::flow::BUS)
        .into_iter()
        .filter(|e| e["detail"]["request_id"] == id)
        .map(|e| e["detail-type"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Asserts what was published about `id`, in order. Each group is what one state change
/// writes to its outbox, in the order the handler listed them (the outbox keeps it).
fn assert_published(f: &Flow, id: &str, groups: &[&[&str]]) {
    let want: Vec<String> = groups
        .iter()
        .flat_map(|g| g.iter().map(|s| s.to_string()))
        .collect();
    assert_eq!(published(f, id), want);
}

/// The plan's upfront fee as the emulator charged it.
fn fee(p: &Plan) -> Usd {
    Usd::parse(&p.offering.upfront_fee.to_string()).unwrap()
}

/// `end - 30 min (training-job lead) - max(drain_minutes 20, default 15)`.
pub(crate) fn drain_at(s: &Segment) -> DateTime<Utc> {
    s.end - TimeDelta::minutes(30) - TimeDelta::minutes(20)
}

/// Submits `request`, plays the bus until quiet and returns the request's status.
pub(crate) async fn submit_and_buy(f: &Flow, request: Value) -> RequestStatus {
    let id = request["request_id"].as_str().unwrap().to_string();
    f.submit(request).await;
    f.deliver().await;
    f.status(&id).await
}

pub(crate) async fn tick(f: &Flow, function: Function) {
    f.tick(function)
        .await
        .unwrap_or_else(|e| panic!("{function:?} tick: {e}"));
}

#[tokio::test]
pub(crate) async fn a_training_job_runs_on_its_plan_and_is_stopped_before_forced_termination() {
    // GIVEN a training-job request for 48 h in December
    let f = Flow::start().await;
    let id = "tp-job-1";
    let request = training_request(id, 48, "2026-12-02T00:00:00Z", "2026-12-20T11:30:00Z");

    // WHEN it is submitted and the bus is played (search, then purchase)
    let status = submit_and_buy(&f, request).await;

    // THEN exactly one plan was bought, named for the request, and the request is Reserved
    assert_eq!(status, RequestStatus::Reserved);
    let plan = the_plan(&f, id);
    assert_eq!(plan.offering.target, "training-job");
    assert_eq!(plan.offering.segments.len(), 1, "{:?}", plan.offering);
    let seg = plan.offering.segments[0].clone();
    assert_eq!(
        f.team_spent("team-b", t0()).await,
        fee(&plan).to_micros_ceil()
    );
    let reserved = f.bus_for("Capacity Reserved", id);
    assert_eq!(reserved.len(), 1);
    assert_eq!(
        Usd::parse(reserved[0]["detail"]["upfront_fee_usd"].as_str().unwrap()).unwrap(),
        fee(&plan)
    );

    // WHEN launch ticks before the window opens
    f.cloud.advance_to(seg.start - TimeDelta::minutes(1));
    tick(&f, Function::Launch).await;
    // THEN nothing is launched yet
    assert!(jobs(&f).is_empty(), "no job before the plan starts");
    assert_eq!(f.status(id).await, RequestStatus::Reserved);

    // WHEN the plan's window opens and launch ticks (twice, as overlapping ticks might)
    f.cloud.advance_to(seg.start);
    tick(&f, Function::Launch).await;
    tick(&f, Function::Launch).await;

    // THEN one training job runs on the plan, and the bus says so once
    let name = format!("cp-{id}-s0");
    let j = job(&f, &name).expect("the training job exists");
    assert_eq!(jobs(&f).len(), 1);
    assert_eq!(j.plan_arn.as_deref(), Some(plan.arn.as_str()));
    assert_eq!(
        j.request["ResourceConfig"]["TrainingPlanArn"],
        json!(plan.arn),
        "CreateTrainingJob named the plan"
    );
    assert_eq!(j.instance_type, "ml.p5.48xlarge");
    assert_eq!(j.instance_count, 2);
    assert_eq!(f.status(id).await, RequestStatus::Active);
    let launched = f.bus_for("Capacity Workload Launched", id);
    assert_eq!(launched.len(), 1, "{launched:?}");
    assert_eq!(launched[0]["detail"]["reservation_id"], json!(plan.arn));
    assert_eq!(launched[0]["detail"]["resource_ids"], json!([name]));
    f.cloud.step(TimeDelta::minutes(5));
    assert_eq!(job(&f, &name).unwrap().secondary, "Training");

    // WHEN cleanup ticks just before the drain start
    f.cloud.advance_to(drain_at(&seg) - TimeDelta::minutes(1));
    tick(&f, Function::Cleanup).await;
    // THEN the job keeps training
    assert_eq!(f.status(id).await, RequestStatus::Active);
    assert_eq!(job(&f, &name).unwrap().status, "InProgress");

    // WHEN the drain start is reached while the job is still running
    f.cloud.advance_to(drain_at(&seg));
    tick(&f, Function::Cleanup).await;

    // THEN cleanup stops the job and announces the expiry and the drain
    assert_eq!(f.status(id).await, RequestStatus::Draining);
    assert_eq!(job(&f, &name).unwrap().status, "Stopping");
    let expiring = f.bus_for("Capacity Reservation Expiring", id);
    assert_eq!(expiring.len(), 1, "{expiring:?}");
    let drained = f.bus_for("Capacity Workload Drained", id);
    assert_eq!(drained.len(), 1, "{drained:?}");
    assert_eq!(
        drained[0]["detail"]["resource_ids"],
        json!([format!("training-job:{name}")])
    );

    // AND the job has stopped before AWS's forced termination (end - 30 min) would fail it
    f.cloud.advance_to(seg.end - TimeDelta::minutes(30));
    let j = job(&f, &name).unwrap();
    assert_eq!(j.status, "Stopped", "{:?}", j.failure_reason);
    assert!(j.training_end.unwrap() < seg.end - TimeDelta::minutes(30));

    // WHEN the plan has ended and cleanup ticks
    f.cloud.advance_to(seg.end);
    tick(&f, Function::Cleanup).await;
    tick(&f, Function::Cleanup).await;

    // THEN the request is Ended and the bus says so once
    assert_eq!(f.status(id).await, RequestStatus::Ended);
    assert_eq!(f.bus_for("Capacity Reservation Ended", id).len(), 1);
    assert_published(
        &f,
        id,
        &[
            &["Capacity Request Accepted"],
            &["Capacity Offerings Found"],
            &["Capacity Reserved"],
            &["Capacity Workload Launched"],
            // cleanup's first tick in the flow, just before the drain: the checkpoint
            // notice, late (ARCHITECTURE §9.2)
            &["Capacity Reservation Ending"],
            &["Capacity Reservation Expiring", "Capacity Workload Drained"],
            &["Capacity Reservation Ended"],
        ],
    );
    // AND one plan, one job, and the team paid exactly the plan's fee
    assert_eq!(plans(&f).len(), 1);
    assert_eq!(jobs(&f).len(), 1);
    assert_eq!(
        f.team_spent("team-b", t0()).await,
        fee(&plan).to_micros_ceil()
    );
}

#[tokio::test]
pub(crate) async fn each_segment_of_a_split_plan_gets_its_own_job_launched_and_drained_in_its_own_window()
 {
    // GIVEN a 72 h training request that may split, in a window where seed 11's market has
    // ml.p5.48xlarge x 2 free for three days running in no single zone, so SageMaker offers
    // only two-segment plans (us-east-1c for Dec 17-18, then us-east-1b for Dec 18-20)
    let f = Flow::start().await;
    let id = "tp-split-1";
    let mut request = training_request(id, 72, "2026-12-17T11:30:00Z", "2026-12-20T11:30:00Z");
    request["allow_split"] = json!(true);

    // WHEN it is submitted and bought
    let status = submit_and_buy(&f, request).await;

    // THEN one plan with two reserved capacities was bought, and the team paid its fee
    assert_eq!(status, RequestStatus::Reserved);
    let plan = the_plan(&f, id);
    let segs = plan.offering.segments.clone();
    assert_eq!(segs.len(), 2, "{:?}", plan.offering);
    assert_ne!(segs[0].availability_zone, segs[1].availability_zone);
    assert_eq!(
        f.team_spent("team-b", t0()).await,
        fee(&plan).to_micros_ceil()
    );
    let (s0, s1) = (format!("cp-{id}-s0"), format!("cp-{id}-s1"));

    // WHEN the first segment opens and launch ticks
    f.cloud.advance_to(segs[0].start);
    tick(&f, Function::Launch).await;
    // THEN its job runs on the plan
    assert_eq!(f.status(id).await, RequestStatus::Active);
    assert_eq!(
        job(&f, &s0)
            .expect("first segment's job")
            .plan_arn
            .as_deref(),
        Some(plan.arn.as_str())
    );
    f.cloud.step(TimeDelta::minutes(5));
    assert_eq!(job(&f, &s0).unwrap().secondary, "Training");

    // WHEN the first segment's drain start comes
    f.cloud.advance_to(drain_at(&segs[0]));
    tick(&f, Function::Cleanup).await;
    // THEN its job is stopped ahead of that segment's forced termination, and nothing else
    // is launched or stopped
    assert_eq!(f.status(id).await, RequestStatus::Draining);
    assert_eq!(job(&f, &s0).unwrap().status, "Stopping");
    assert!(job(&f, &s1).is_none());
    f.cloud.advance_to(segs[0].end - TimeDelta::minutes(30));
    assert_eq!(job(&f, &s0).unwrap().status, "Stopped");

    // WHEN the first segment ends: cleanup, then launch tick at the second's start
    f.cloud.advance_to(segs[0].end.max(segs[1].start));
    tick(&f, Function::Cleanup).await;
    // THEN the request waits for the second segment
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    tick(&f, Function::Launch).await;

    // THEN the second segment has its own job, under its own name, on the same plan
    assert_eq!(f.status(id).await, RequestStatus::Active);
    let second = job(&f, &s1).expect("second segment's job");
    assert_eq!(second.plan_arn.as_deref(), Some(plan.arn.as_str()));
    assert_eq!(jobs(&f).len(), 2);
    f.cloud.step(TimeDelta::minutes(5));
    assert_eq!(job(&f, &s1).unwrap().secondary, "Training");
    let launched = f.bus_for("Capacity Workload Launched", id);
    assert_eq!(launched.len(), 2, "{launched:?}");
    assert_eq!(launched[0]["detail"]["segment"], 0);
    assert_eq!(launched[0]["detail"]["resource_ids"], json!([s0]));
    assert_eq!(launched[1]["detail"]["segment"], 1);
    assert_eq!(launched[1]["detail"]["resource_ids"], json!([s1]));

    // WHEN the second segment's drain start comes, and later its end
    f.cloud
        .advance_to(drain_at(&segs[1]) - TimeDelta::minutes(1));
    tick(&f, Function::Cleanup).await;
    assert_eq!(job(&f, &s1).unwrap().status, "InProgress");
    f.cloud.advance_to(drain_at(&segs[1]));
    tick(&f, Function::Cleanup).await;
    assert_eq!(f.status(id).await, RequestStatus::Draining);
    assert_eq!(job(&f, &s1).unwrap().status, "Stopping");
    f.cloud.advance_to(segs[1].end - TimeDelta::minutes(30));
    assert_eq!(job(&f, &s1).unwrap().status, "Stopped");
    f.cloud.advance_to(segs[1].end);
    tick(&f, Function::Cleanup).await;

    // THEN the request has ended; each segment was drained before its own end
    assert_eq!(f.status(id).await, RequestStatus::Ended);
    let drained = f.bus_for("Capacity Workload Drained", id);
    assert_eq!(drained.len(), 2);
    for (d, (seg, name)) in drained.iter().zip([(&segs[0], &s0), (&segs[1], &s1)]) {
        assert_eq!(
            d["detail"]["resource_ids"],
            json!([format!("training-job:{name}")])
        );
        let at: DateTime<Utc> = d["detail"]["drained_at"].as_str().unwrap().parse().unwrap();
        assert_eq!(at, drain_at(seg));
    }
    assert_published(
        &f,
        id,
        &[
            &["Capacity Request Accepted"],
            &["Capacity Offerings Found"],
            &["Capacity Reserved"],
            &["Capacity Workload Launched"],
            // cleanup's first tick in the flow, at the first drain: before draining, the
            // first window's Ending notices are recorded as skipped (its drain has come), and
            // the second window's Opening notice goes
            &["Capacity Window Opening"],
            &["Capacity Reservation Expiring", "Capacity Workload Drained"],
            // the plan goes on: its first segment's end is no Reservation Ended
            &["Capacity Workload Launched"],
            &["Capacity Reservation Ending"],
            &["Capacity Reservation Expiring", "Capacity Workload Drained"],
            &["Capacity Reservation Ended"],
        ],
    );
    assert_eq!(plans(&f).len(), 1);
    assert_eq!(
        f.team_spent("team-b", t0()).await,
        fee(&plan).to_micros_ceil()
    );
}

/// An inference-endpoint request on a plan serving `workshop-llm`.
fn endpoint_request(id: &str) -> Value {
    integration_tests::flow::endpoint_request(id, "workshop-llm")
}

#[tokio::test]
pub(crate) async fn an_endpoint_is_created_on_its_active_plan_and_deleted_with_its_config_at_drain()
{
    // GIVEN an inference-endpoint request, bought as one plan for endpoints
    let f = Flow::start().await;
    let id = "tp-endpoint-1";
    f.create_model("workshop-llm");
    assert_eq!(
        submit_and_buy(&f, endpoint_request(id)).await,
        RequestStatus::Reserved
    );
    let plan = the_plan(&f, id);
    assert_eq!(plan.offering.target, "endpoint");
    let seg = plan.offering.segments[0].clone();
    assert_eq!(
        f.team_spent("team-c", t0()).await,
        fee(&plan).to_micros_ceil()
    );
    let config_name = format!("cp-{id}-s0");
    let key = |n: &str| (REGION.to_string(), n.to_string());
    let config = |f: &Flow| {
        f.cloud
            .with_world(|w| w.sm.endpoint_configs.get(&key(&config_name)).cloned())
    };
    let endpoint = |f: &Flow| {
        f.cloud
            .with_world(|w| w.sm.endpoints.get(&key("workshop-llm")).cloned())
    };

    // WHEN launch ticks while the plan is still Scheduled
    f.cloud.advance_to(seg.start - TimeDelta::minutes(1));
    tick(&f, Function::Launch).await;
    // THEN nothing is created: an endpoint needs an Active plan
    assert!(config(&f).is_none() && endpoint(&f).is_none());

    // WHEN the plan is Active and launch ticks
    f.cloud.advance_to(seg.start);
    tick(&f, Function::Launch).await;

    // THEN the endpoint config reserves through the plan, and the endpoint uses that config
    let c = config(&f).expect("the endpoint config exists");
    assert_eq!(c.variants.len(), 1);
    let v = &c.variants[0];
    assert_eq!(v.plan_arn.as_deref(), Some(plan.arn.as_str()));
    assert_eq!(
        v.request["CapacityReservationConfig"],
        json!({"CapacityReservationPreference": "capacity-reservations-only",
               "MlReservationArn": plan.arn})
    );
    assert_eq!(v.instance_type, "ml.p5.48xlarge");
    assert_eq!(v.count, 1);
    // AND the endpoint waits for the config to be visible (DescribeEndpointConfig first; the
    // emulator's 60 s lag, REALISM "Endpoints"): nothing refused, created on a later tick
    assert!(endpoint(&f).is_none(), "the config is not visible yet");
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    f.cloud.step(TimeDelta::seconds(60));
    tick(&f, Function::Launch).await;
    let e = endpoint(&f).expect("the endpoint exists");
    assert_eq!(e.config_name, config_name);
    // AND the window runs only once the endpoint is InService (issue 18)
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    assert!(f.bus_for("Capacity Workload Launched", id).is_empty());
    f.cloud.step(TimeDelta::minutes(10));
    assert_eq!(endpoint(&f).unwrap().status, "InService");
    tick(&f, Function::Launch).await;
    assert_eq!(f.status(id).await, RequestStatus::Active);
    let launched = f.bus_for("Capacity Workload Launched", id);
    assert_eq!(launched.len(), 1);
    assert_eq!(
        launched[0]["detail"]["resource_ids"],
        json!(["workshop-llm"])
    );

    // WHEN cleanup ticks just before the drain start, then at it
    f.cloud.advance_to(drain_at(&seg) - TimeDelta::minutes(1));
    tick(&f, Function::Cleanup).await;
    assert_eq!(endpoint(&f).unwrap().status, "InService");
    f.cloud.advance_to(drain_at(&seg));
    tick(&f, Function::Cleanup).await;

    // THEN the endpoint is being deleted (gone two minutes later) and its config is gone
    assert_eq!(endpoint(&f).unwrap().status, "Deleting");
    assert!(config(&f).is_none(), "the endpoint config is deleted");
    f.cloud.step(TimeDelta::minutes(3));
    assert!(endpoint(&f).is_none(), "the endpoint is deleted");
    assert_eq!(f.status(id).await, RequestStatus::Draining);
    let drained = f.bus_for("Capacity Workload Drained", id);
    assert_eq!(drained.len(), 1);
    assert_eq!(
        drained[0]["detail"]["resource_ids"],
        json!([
            "endpoint:workshop-llm",
            format!("endpoint-config:{config_name}")
        ])
    );

    // WHEN the plan ends
    f.cloud.advance_to(seg.end);
    tick(&f, Function::Cleanup).await;

    // THEN the request has ended, with one plan bought and paid for once
    assert_eq!(f.status(id).await, RequestStatus::Ended);
    assert_published(
        &f,
        id,
        &[
            &["Capacity Request Accepted"],
            &["Capacity Offerings Found"],
            &["Capacity Reserved"],
            &["Capacity Workload Launched"],
            // cleanup's first tick in the flow, just before the drain: the checkpoint
            // notice, late (ARCHITECTURE §9.2)
            &["Capacity Reservation Ending"],
            &["Capacity Reservation Expiring", "Capacity Workload Drained"],
            &["Capacity Reservation Ended"],
        ],
    );
    assert_eq!(plans(&f).len(), 1);
    assert_eq!(
        f.team_spent("team-c", t0()).await,
        fee(&plan).to_micros_ceil()
    );
}

/// A HyperPod request on a plan: 2 x ml.p5.48xlarge for 48 h in `cluster`'s group `finetune`.
fn hyperpod_request(id: &str, cluster: &str) -> Value {
    json!({
        "schema_version": 1, "request_id": id, "team": "team-f",
        "instance_types": ["ml.p5.48xlarge"], "instance_count": 2, "duration_hours": 48,
        "earliest_start": "2026-12-02T00:00:00Z", "latest_end": "2026-12-20T11:30:00Z",
        "regions": [REGION],
        "budget": {"max_upfront_usd": "20000"},
        "workload": {"kind": "hyperpod-cluster", "cluster_name": cluster,
            "instance_group_name": "finetune",
            "life_cycle_config": {"source_s3_uri": "s3://team-f-hyperpod/lifecycle/",
                "on_create": "on_create.sh"}},
        "drain_minutes": 20
    })
}

/// Creates a HyperPod cluster (with no instance groups yet) through the emulator's own
/// CreateCluster, with `tags`, and waits until it is InService.
fn create_cluster(f: &Flow, name: &str, tags: Value) {
    f.cloud
        .with_world(|w| {
            w.sagemaker_call(
                REGION,
                "CreateCluster",
                &json!({"ClusterName": name, "Tags": tags}),
            )
        })
        .expect("CreateCluster");
    f.cloud.step(TimeDelta::minutes(5));
    assert_eq!(cluster(f, name).status, "InService");
}

fn cluster(f: &Flow, name: &str) -> local_cloud::sagemaker::Cluster {
    f.cloud.with_world(|w| {
        w.sm.clusters
            .get(&(REGION.to_string(), name.to_string()))
            .cloned()
            .expect("the cluster exists")
    })
}

/// HyperPod cluster state changes the emulator emitted for `name` (each UpdateCluster adds two).
fn cluster_changes(f: &Flow, name: &str) -> Vec<String> {
    f.cloud
        .events("default")
        .into_iter()
        .filter(|e| e["detail-type"] == "SageMaker HyperPod Cluster State Change")
        .filter(|e| e["detail"]["ClusterName"] == name)
        .map(|e| {
            e["detail"]["ClusterStatus"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// `end - 1 h (HyperPod lead) - max(drain_minutes 20, default 15)`.
fn hyperpod_drain_at(s: &Segment) -> DateTime<Utc> {
    s.end - TimeDelta::minutes(60) - TimeDelta::minutes(20)
}

#[tokio::test]
pub(crate) async fn a_managed_hyperpod_cluster_gets_its_instance_group_on_the_plan_and_removed_at_its_last_drain()
 {
    // GIVEN a HyperPod cluster that carries the managed tag, and a request for it
    let f = Flow::start().await;
    create_cluster(
        &f,
        "team-f-research",
        json!([{"Key": "capacity-pilot:managed", "Value": "true"}]),
    );
    let id = "tp-hyperpod-1";

    // WHEN the request is submitted and bought
    assert_eq!(
        submit_and_buy(&f, hyperpod_request(id, "team-f-research")).await,
        RequestStatus::Reserved
    );

    // THEN one HyperPod plan was bought and paid for
    let plan = the_plan(&f, id);
    assert_eq!(plan.offering.target, "hyperpod-cluster");
    let seg = plan.offering.segments[0].clone();
    assert_eq!(
        f.team_spent("team-f", t0()).await,
        fee(&plan).to_micros_ceil()
    );

    // WHEN the plan starts and launch ticks
    f.cloud.advance_to(seg.start);
    tick(&f, Function::Launch).await;

    // THEN UpdateCluster put the instance group on the plan, and its nodes come up
    let c = cluster(&f, "team-f-research");
    assert_eq!(c.groups.len(), 1);
    let g = &c.groups[0];
    assert_eq!(g.name, "finetune");
    assert_eq!(g.plan_arn.as_deref(), Some(plan.arn.as_str()));
    assert_eq!(g.instance_type, "ml.p5.48xlarge");
    assert_eq!(g.target, 2);
    assert_eq!(
        g.request["LifeCycleConfig"],
        json!({"SourceS3Uri": "s3://team-f-hyperpod/lifecycle/", "OnCreate": "on_create.sh"})
    );
    assert_eq!(f.status(id).await, RequestStatus::Active);
    let launched = f.bus_for("Capacity Workload Launched", id);
    assert_eq!(launched.len(), 1);
    assert_eq!(
        launched[0]["detail"]["resource_ids"],
        json!(["team-f-research/finetune"])
    );
    f.cloud.step(TimeDelta::minutes(5));
    let c = cluster(&f, "team-f-research");
    assert_eq!(c.status, "InService");
    assert_eq!(c.nodes.len(), 2);

    // AND a second request naming the group, now there, is rejected for it (DescribeCluster
    // leaves CurrentCount out, ARCHITECTURE 8.10's harsh reading: the nodes are counted with
    // ListClusterNodes)
    f.submit(hyperpod_request("tp-hyperpod-2", "team-f-research"))
        .await;
    let rejected = f.bus_for("Capacity Request Rejected", "tp-hyperpod-2");
    assert_eq!(rejected.len(), 1);
    assert!(
        rejected[0]["detail"]
            .to_string()
            .contains("instance_group_name"),
        "{rejected:?}"
    );

    // WHEN cleanup ticks just before the drain start (end - 1 h - 20 min), then at it
    f.cloud
        .advance_to(hyperpod_drain_at(&seg) - TimeDelta::minutes(1));
    tick(&f, Function::Cleanup).await;
    assert_eq!(cluster(&f, "team-f-research").groups[0].target, 2);
    f.cloud.advance_to(hyperpod_drain_at(&seg));
    tick(&f, Function::Cleanup).await;

    // THEN the group, in the request's last window, is removed ahead of HyperPod's forced
    // termination (InstanceGroupsToDelete; before: scaled to zero and left on the cluster,
    // pointing at the plan that expires with the window)
    assert_eq!(f.status(id).await, RequestStatus::Draining);
    assert!(cluster(&f, "team-f-research").groups[0].deleting);
    assert!(cluster(&f, "team-f-research").nodes.is_empty());
    f.cloud.step(TimeDelta::minutes(5));
    assert!(cluster(&f, "team-f-research").groups.is_empty());
    let drained = f.bus_for("Capacity Workload Drained", id);
    assert_eq!(drained.len(), 1);
    assert_eq!(
        drained[0]["detail"]["resource_ids"],
        json!(["instance-group-removed:team-f-research/finetune"])
    );

    // WHEN the plan ends
    f.cloud.advance_to(seg.end);
    tick(&f, Function::Cleanup).await;

    // THEN the request has ended; the cluster was updated exactly twice (up, then removed)
    assert_eq!(f.status(id).await, RequestStatus::Ended);
    assert_eq!(
        cluster_changes(&f, "team-f-research"),
        [
            "Creating",
            "InService",
            "Updating",
            "InService",
            "Updating",
            "InService"
        ]
    );
    assert_published(
        &f,
        id,
        &[
            &["Capacity Request Accepted"],
            &["Capacity Offerings Found"],
            &["Capacity Reserved"],
            &["Capacity Workload Launched"],
            // cleanup's first tick in the flow, just before the drain: the checkpoint
            // notice, late (ARCHITECTURE §9.2)
            &["Capacity Reservation Ending"],
            &["Capacity Reservation Expiring", "Capacity Workload Drained"],
            &["Capacity Reservation Ended"],
        ],
    );
    assert_eq!(plans(&f).len(), 1);
    assert_eq!(
        f.team_spent("team-f", t0()).await,
        fee(&plan).to_micros_ceil()
    );

    // WHEN, the group removed, a third request names it (ARCHITECTURE 9.8: the name an
    // ended request of ours used may be used again)
    let third = "tp-hyperpod-3";
    let mut again = hyperpod_request(third, "team-f-research");
    again["earliest_start"] = json!((seg.end + TimeDelta::days(1)).to_rfc3339());
    again["latest_end"] = json!((seg.end + TimeDelta::days(15)).to_rfc3339());
    let status = submit_and_buy(&f, again).await;

    // THEN it is accepted and bought, and at its plan's start the launch makes the group
    // again on the new plan
    assert!(
        f.bus_for("Capacity Request Rejected", third).is_empty(),
        "{:?}",
        f.bus_for("Capacity Request Rejected", third)
    );
    assert_eq!(status, RequestStatus::Reserved);
    let next = plans(&f)
        .into_iter()
        .find(|p| p.name == plan_name_for(third, 0))
        .expect("the third request's plan");
    f.cloud.advance_to(next.offering.segments[0].start);
    tick(&f, Function::Launch).await;
    let c = cluster(&f, "team-f-research");
    assert_eq!(c.groups.len(), 1);
    assert_eq!(c.groups[0].target, 2);
    assert_eq!(c.groups[0].plan_arn.as_deref(), Some(next.arn.as_str()));
    assert_eq!(f.status(third).await, RequestStatus::Active);
}

#[tokio::test]
pub(crate) async fn a_hyperpod_request_for_a_cluster_without_the_managed_tag_is_rejected_and_nothing_bought()
 {
    // GIVEN a HyperPod cluster that does NOT carry the managed tag
    let f = Flow::start().await;
    create_cluster(&f, "someone-elses", json!([{"Key": "team", "Value": "x"}]));
    let id = "tp-hyperpod-2";

    // WHEN a request for it is submitted, and every schedule runs after its window
    f.submit(hyperpod_request(id, "someone-elses")).await;
    f.deliver().await;
    f.cloud.step(TimeDelta::days(30));
    f.tick_all().await;
    f.deliver().await;

    // THEN it is rejected at once, naming the field and the tag: nothing is recorded,
    // searched, bought or debited
    let rejected = f.bus("Capacity Request Rejected");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    let problem = &rejected[0]["detail"]["problems"][0];
    assert_eq!(problem["field"], "workload.cluster_name");
    let message = problem["message"].as_str().unwrap();
    assert!(message.contains("capacity-pilot:managed"), "{message}");
    assert!(message.contains("someone-elses"), "{message}");
    assert!(
        f.table
            .store()
            .get_request(&capacity_pilot::domain::request::RequestId::parse(id).unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert!(plans(&f).is_empty());
    assert_eq!(f.team_spent("team-f", t0()).await, MicroUsd(0));
    // AND UpdateCluster was never called: no group, no node, no update
    let c = cluster(&f, "someone-elses");
    assert!(c.groups.is_empty() && c.nodes.is_empty());
    assert_eq!(
        cluster_changes(&f, "someone-elses"),
        ["Creating", "InService"]
    );
}

#[tokio::test]
pub(crate) async fn an_on_demand_training_job_that_fails_for_capacity_falls_back_to_a_plan() {
    // GIVEN an on-demand-first training request for 8 x ml.p5.48xlarge, more than SageMaker
    // has on demand in us-east-1 (the emulator's pool holds at most 4)
    let f = Flow::start().await;
    let id = "tp-odf-1";
    let mut request = training_request(id, 48, "2026-12-01T10:00:00Z", "2026-12-20T11:30:00Z");
    request["strategy"] = json!("on-demand-first");
    request["instance_count"] = json!(8);
    request["budget"] = json!({"max_upfront_usd": "40000"});
    f.submit(request).await;
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::TryingOnDemand);
    let od = format!("cp-{id}-s0-od");

    // WHEN the desired start comes and launch ticks
    f.cloud.advance_to("2026-12-01T10:00:00Z".parse().unwrap());
    tick(&f, Function::Launch).await;

    // THEN the on-demand estimate is held against the team's cap before the launch, and
    // CreateTrainingJob was accepted on demand; nothing is committed until SageMaker has
    // placed the job
    let j = job(&f, &od).expect("the on-demand job was created");
    assert_eq!(j.plan_arn, None);
    let rec = f.record(id).await;
    assert_eq!(rec.status, RequestStatus::TryingOnDemand);
    let held = rec.open_debit.expect("the estimate is held");
    assert!(held.0 > 0);
    assert_eq!(f.team_spent("team-b", t0()).await, held);

    // WHEN SageMaker fails the job for capacity, asynchronously, and launch ticks again
    f.cloud.step(TimeDelta::minutes(3));
    let j = job(&f, &od).unwrap();
    assert_eq!(j.status, "Failed");
    assert!(
        j.failure_reason
            .as_deref()
            .is_some_and(|r| r.contains("CapacityError")),
        "{:?}",
        j.failure_reason
    );
    tick(&f, Function::Launch).await;

    // THEN the request falls back to searching for a reservation, and the held estimate
    // goes back: nothing is spent
    let rec = f.record(id).await;
    assert_eq!(rec.status, RequestStatus::Searching);
    assert_eq!(rec.open_debit, None);
    assert_eq!(rec.spent.0, 0);
    assert_eq!(f.team_spent("team-b", t0()).await.0, 0);
    assert!(f.bus_for("Capacity Workload Launched", id).is_empty());

    // WHEN the search schedule runs and the bus is played
    tick(&f, Function::Search).await;
    f.deliver().await;

    // THEN one plan was bought, and only its fee is on the ledger
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    let plan = the_plan(&f, id);
    let seg = plan.offering.segments[0].clone();
    assert_eq!(
        f.team_spent("team-b", t0()).await,
        fee(&plan).to_micros_ceil()
    );

    // WHEN the plan starts and launch ticks
    f.cloud.advance_to(seg.start);
    tick(&f, Function::Launch).await;

    // THEN a new job, under the plan's own name, runs on the plan
    let on_plan = format!("cp-{id}-s0");
    let j = job(&f, &on_plan).expect("the job on the plan");
    assert_eq!(j.plan_arn.as_deref(), Some(plan.arn.as_str()));
    assert_eq!(f.status(id).await, RequestStatus::Active);
    f.cloud.step(TimeDelta::minutes(5));
    assert_eq!(job(&f, &on_plan).unwrap().secondary, "Training");
    assert_eq!(jobs(&f).len(), 2);

    // WHEN the plan drains and ends
    f.cloud.advance_to(drain_at(&seg));
    tick(&f, Function::Cleanup).await;
    assert_eq!(job(&f, &on_plan).unwrap().status, "Stopping");
    f.cloud.advance_to(seg.end);
    tick(&f, Function::Cleanup).await;

    // THEN the request has ended, having paid exactly the plan's fee
    assert_eq!(f.status(id).await, RequestStatus::Ended);
    assert_eq!(job(&f, &on_plan).unwrap().status, "Stopped");
    assert_published(
        &f,
        id,
        &[
            &["Capacity Request Accepted"],
            &["Capacity Offerings Found"],
            &["Capacity Reserved"],
            &["Capacity Workload Launched"],
            &["Capacity Reservation Expiring", "Capacity Workload Drained"],
            &["Capacity Reservation Ended"],
        ],
    );
    assert_eq!(plans(&f).len(), 1);
    assert_eq!(
        f.team_spent("team-b", t0()).await,
        fee(&plan).to_micros_ceil()
    );
}

#[tokio::test]
pub(crate) async fn a_cancel_while_an_on_demand_job_is_placed_stops_it_and_settles_from_the_hold() {
    // Issue 15 item 4 (review H6). GIVEN an on-demand-first training request whose on-demand
    // job SageMaker has accepted but not yet placed: the request is TryingOnDemand, its
    // estimate held
    let f = Flow::start().await;
    let id = "tp-od-cancel";
    let mut request = training_request(id, 48, "2026-12-01T10:00:00Z", "2026-12-20T11:30:00Z");
    request["strategy"] = json!("on-demand-first");
    request["budget"] = json!({"max_upfront_usd": "40000"});
    f.submit(request).await;
    f.cloud.advance_to("2026-12-01T10:00:00Z".parse().unwrap());
    tick(&f, Function::Launch).await;
    let od = format!("cp-{id}-s0-od");
    assert!(job(&f, &od).is_some(), "the on-demand job was created");
    let rec = f.record(id).await;
    assert_eq!(rec.status, RequestStatus::TryingOnDemand, "{}", rec.reason);
    let held = rec.open_debit.expect("the estimate is held");

    // WHEN the requester cancels (before the fix: Cancelled at once, the job left to run its
    // 48 h MaxRuntime, and the whole estimate left open on the ended record)
    f.cancel(id, "cancel-1").await;
    assert_eq!(f.status(id).await, RequestStatus::Draining);

    // AND cleanup runs, and again once no launch begun before the cancellation can be in
    // flight
    tick(&f, Function::Cleanup).await;
    f.cloud.step(TimeDelta::minutes(2));
    tick(&f, Function::Cleanup).await;

    // THEN the job is stopped, the request Cancelled and answered, and one hour (begun at the
    // hold; billing may start while it is placed) of the 48 stays spent
    let j = job(&f, &od).unwrap();
    assert!(
        matches!(j.status.as_str(), "Stopping" | "Stopped"),
        "{}",
        j.status
    );
    let rec = f.record(id).await;
    assert_eq!(rec.status, RequestStatus::Cancelled, "{}", rec.reason);
    let kept = MicroUsd((held.0 + 47) / 48);
    assert_eq!(rec.spent, kept);
    assert_eq!(rec.open_debit, None);
    assert_eq!(f.team_spent("team-b", t0()).await, kept);
    let applied = f.bus_for("Capacity Cancellation Applied", id);
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0]["detail"]["status_before"], "TryingOnDemand");
}

#[tokio::test]
pub(crate) async fn a_region_that_does_not_sell_the_type_as_plans_is_dropped_under_either_reading()
{
    // Issue 16: whether SageMaker answers an unsupported (type, region) with an empty list
    // or a ValidationException is not documented; the product decides on the other region
    // under both.
    for reading in [
        local_cloud::PlanUnsupported::Error,
        local_cloud::PlanUnsupported::Empty,
    ] {
        let f = Flow::start_with(11, &[("ALLOWED_REGIONS", "us-east-1,eu-west-1")]).await;
        f.cloud
            .with_world(|w| w.settings.plan_unsupported = reading);
        let id = "tp-regional";
        let mut request = training_request(id, 48, "2026-12-02T00:00:00Z", "2026-12-20T11:30:00Z");
        request["regions"] = json!(["us-east-1", "eu-west-1"]);
        f.submit(request).await;
        let rec = f.record(id).await;
        assert_eq!(
            rec.status,
            RequestStatus::OfferingsFound,
            "{reading:?}: {}",
            rec.reason
        );
        assert!(
            rec.candidates.iter().all(|p| p.region == REGION),
            "{reading:?}"
        );
        if reading == local_cloud::PlanUnsupported::Error {
            assert!(
                rec.reason.contains("eu-west-1") && rec.reason.contains("refused"),
                "{}",
                rec.reason
            );
        }
    }
}

#[tokio::test]
pub(crate) async fn with_current_count_sent_a_request_for_an_existing_group_is_rejected_for_it() {
    // ARCHITECTURE 8.10's lenient reading of DescribeCluster (CurrentCount sent). GIVEN a
    // managed cluster that already has a group of the request's name
    let f = Flow::start().await;
    f.cloud
        .with_world(|w| w.settings.cluster_omit_current_count = false);
    f.cloud
        .with_world(|w| {
            w.sagemaker_call(
                REGION,
                "CreateCluster",
                &json!({
                    "ClusterName": "team-f-busy",
                    "Tags": [{"Key": "capacity-pilot:managed", "Value": "true"}],
                    "InstanceGroups": [{
                        "InstanceGroupName": "finetune", "InstanceType": "ml.p5.48xlarge",
                        "InstanceCount": 1,
                        "ExecutionRole": "arn:aws:iam::123456789012:role/sm",
                        "LifeCycleConfig": {"SourceS3Uri": "s3://x/", "OnCreate": "on_create.sh"}
                    }]
                }),
            )
        })
        .expect("CreateCluster");
    f.cloud.step(TimeDelta::minutes(5));

    // WHEN a request names it
    let id = "tp-hyperpod-busy";
    f.submit(hyperpod_request(id, "team-f-busy")).await;

    // THEN it is rejected for the group, and nothing is bought
    let rejected = f.bus_for("Capacity Request Rejected", id);
    assert_eq!(rejected.len(), 1);
    assert!(
        rejected[0]["detail"]
            .to_string()
            .contains("instance_group_name"),
        "{rejected:?}"
    );
    assert!(f.bus_for("Capacity Reserved", id).is_empty());
}

#[tokio::test]
pub(crate) async fn an_endpoint_that_fails_is_deleted_waited_out_and_created_again_in_its_window() {
    // Issue 18: GIVEN an endpoint request bought as a plan, and SageMaker failing the first
    // endpoint it creates (asynchronously, after Creating)
    let f = Flow::start().await;
    let id = "tp-endpoint-retry";
    f.create_model("workshop-llm");
    assert_eq!(
        submit_and_buy(&f, endpoint_request(id)).await,
        RequestStatus::Reserved
    );
    let seg = the_plan(&f, id).offering.segments[0].clone();
    f.cloud.with_world(|w| w.settings.endpoint_failures = 1);
    let status = |f: &Flow| {
        f.cloud.with_world(|w| {
            w.sm.endpoints
                .get(&(REGION.to_string(), "workshop-llm".to_string()))
                .map(|e| e.status.clone())
        })
    };

    // WHEN launch ticks every minute from the plan's start for half an hour
    f.cloud.advance_to(seg.start);
    let mut seen = Vec::new();
    for _ in 0..30 {
        tick(&f, Function::Launch).await;
        if let Some(s) = status(&f)
            && seen.last() != Some(&s)
        {
            seen.push(s);
        }
        f.cloud.step(TimeDelta::minutes(1));
    }

    // THEN the failed endpoint was deleted, its deletion waited out, and a new one serves;
    // the window runs once, and nothing failed
    // (the tick that finds it Failed deletes it at once, so between ticks it shows Deleting)
    assert_eq!(seen, ["Creating", "Deleting", "Creating", "InService"]);
    assert_eq!(f.status(id).await, RequestStatus::Active);
    assert_eq!(f.bus_for("Capacity Workload Launched", id).len(), 1);
    assert!(f.bus_for("Capacity Request Failed", id).is_empty());
}

#[tokio::test]
pub(crate) async fn a_shared_cluster_keeps_its_other_group_whole_and_an_update_under_way_is_waited_out()
 {
    shared_cluster(false).await;
}

#[tokio::test]
pub(crate) async fn at_the_lenient_readings_a_shared_cluster_keeps_its_other_group_whole_too() {
    // ARCHITECTURE 8.10: an update that leaves groups out is not refused, and takes no time.
    shared_cluster(true).await;
}

async fn shared_cluster(lenient: bool) {
    // Issue 18: GIVEN a managed cluster that already runs another team's group, with settings
    // of its own (its role, threads, storage, health checks, labels)
    let f = Flow::start().await;
    if lenient {
        f.cloud.with_world(|w| {
            w.settings.refuse_partial_cluster_updates = false;
            w.settings.cluster_update_minutes = 0;
        });
    }
    let controller = json!({
        "InstanceGroupName": "controller", "InstanceType": "ml.m5.xlarge", "InstanceCount": 1,
        "ExecutionRole": "arn:aws:iam::123456789012:role/infra-team",
        "LifeCycleConfig": {"SourceS3Uri": "s3://infra/lifecycle/", "OnCreate": "setup.sh"},
        "ThreadsPerCore": 1,
        "InstanceStorageConfigs": [{"EbsVolumeConfig": {"VolumeSizeInGB": 500}}],
        "OnStartDeepHealthChecks": ["InstanceStress"],
        "KubernetesConfig": {"Labels": {"team": "infra"}}
    });
    f.cloud
        .with_world(|w| {
            w.sagemaker_call(
                REGION,
                "CreateCluster",
                &json!({
                    "ClusterName": "shared",
                    "Tags": [{"Key": "capacity-pilot:managed", "Value": "true"}],
                    "InstanceGroups": [controller.clone()]
                }),
            )
        })
        .expect("CreateCluster");
    f.cloud.step(TimeDelta::minutes(5));
    let id = "tp-hyperpod-shared";
    assert_eq!(
        submit_and_buy(&f, hyperpod_request(id, "shared")).await,
        RequestStatus::Reserved
    );
    let seg = the_plan(&f, id).offering.segments[0].clone();
    let group = |name: &str| {
        cluster(&f, "shared")
            .groups
            .into_iter()
            .find(|g| g.name == name)
    };
    let theirs = group("controller").unwrap().request;

    // WHEN the other team updates the cluster just as the plan starts, and launch ticks
    f.cloud.advance_to(seg.start);
    f.cloud
        .with_world(|w| {
            let mut c = controller.clone();
            c["InstanceCount"] = json!(2);
            w.sagemaker_call(
                REGION,
                "UpdateCluster",
                &json!({"ClusterName": "shared", "InstanceGroups": [c]}),
            )
        })
        .expect("their UpdateCluster");
    tick(&f, Function::Launch).await;

    // THEN the launch waits for the update (ConflictException), failing nothing; with no
    // update time there is nothing to wait for
    assert_eq!(group("finetune").is_some(), lenient);
    assert!(f.bus_for("Capacity Request Failed", id).is_empty());

    // WHEN it is done and launch ticks again
    f.cloud.step(TimeDelta::minutes(6));
    tick(&f, Function::Launch).await;

    // THEN our group is added on the plan, and theirs is exactly as they left it
    let ours = group("finetune").expect("our group");
    assert_eq!(ours.target, 2);
    assert_eq!(f.status(id).await, RequestStatus::Active);
    let mut now_theirs = theirs.clone();
    now_theirs["InstanceCount"] = json!(2);
    assert_eq!(group("controller").unwrap().request, now_theirs);

    // WHEN the drain of its last window removes ours
    f.cloud.step(TimeDelta::minutes(6));
    f.cloud.advance_to(hyperpod_drain_at(&seg));
    tick(&f, Function::Cleanup).await;

    // THEN theirs is still untouched, and stays so once ours is gone
    assert!(group("finetune").is_none_or(|g| g.deleting));
    assert_eq!(group("controller").unwrap().request, now_theirs);
    assert_eq!(f.status(id).await, RequestStatus::Draining);
    f.cloud.step(TimeDelta::minutes(6));
    assert!(group("finetune").is_none());
    assert_eq!(group("controller").unwrap().request, now_theirs);
}

#[tokio::test]
pub(crate) async fn an_update_cluster_whose_answer_is_lost_is_settled_by_describing_the_cluster() {
    // Issue 18: GIVEN a managed cluster and a bought plan, and UpdateCluster's answer lost at
    // the plan's start (the update went through; the SDK's retry then finds the cluster
    // Updating and is refused with ConflictException)
    let f = Flow::start().await;
    create_cluster(
        &f,
        "team-f-lost",
        json!([{"Key": "capacity-pilot:managed", "Value": "true"}]),
    );
    let id = "tp-hyperpod-lost";
    assert_eq!(
        submit_and_buy(&f, hyperpod_request(id, "team-f-lost")).await,
        RequestStatus::Reserved
    );
    let plan = the_plan(&f, id);
    let seg = plan.offering.segments[0].clone();
    f.cloud.advance_to(seg.start);
    f.cloud.inject(local_cloud::Fault {
        operation: "UpdateCluster".into(),
        kind: local_cloud::FaultKind::LostResponse,
        count: Some(1),
    });

    // WHEN launch ticks
    tick(&f, Function::Launch).await;

    // THEN the request is not failed (before the fix: Failed on the conflict), it waits
    assert!(f.bus_for("Capacity Request Failed", id).is_empty());
    assert_eq!(f.status(id).await, RequestStatus::Reserved);

    // WHEN the update is done and launch ticks again
    f.cloud.step(TimeDelta::minutes(6));
    tick(&f, Function::Launch).await;

    // THEN DescribeCluster shows the group on the plan: the launch is done, once, with no
    // second update
    let g = cluster(&f, "team-f-lost").groups[0].clone();
    assert_eq!((g.name.as_str(), g.target), ("finetune", 2));
    assert_eq!(g.plan_arn.as_deref(), Some(plan.arn.as_str()));
    assert_eq!(cluster(&f, "team-f-lost").status, "InService");
    assert_eq!(f.status(id).await, RequestStatus::Active);
    assert_eq!(f.bus_for("Capacity Workload Launched", id).len(), 1);
}

#[tokio::test]
pub(crate) async fn under_the_refusing_reading_an_endpoint_still_waits_for_its_plan() {
    // ARCHITECTURE 8.10: CreateEndpoint on a plan that is not Active may be refused at once
    // (the other reading fails it later); the product works under both. And DeleteEndpoint
    // at its lenient reading: gone at once.
    let f = Flow::start().await;
    f.cloud.with_world(|w| {
        w.settings.endpoint_inactive_plan = local_cloud::InactivePlan::Refuse;
        w.settings.endpoint_delete_minutes = 0;
    });
    let id = "tp-endpoint-refuse";
    f.create_model("workshop-llm");
    assert_eq!(
        submit_and_buy(&f, endpoint_request(id)).await,
        RequestStatus::Reserved
    );
    let seg = the_plan(&f, id).offering.segments[0].clone();

    // WHEN launch ticks from just before the plan's start, every minute for 15 minutes
    f.cloud.advance_to(seg.start - TimeDelta::minutes(2));
    for _ in 0..15 {
        tick(&f, Function::Launch).await;
        f.cloud.step(TimeDelta::minutes(1));
    }

    // THEN it served from its plan's start, and nothing failed
    assert_eq!(f.status(id).await, RequestStatus::Active);
    assert!(f.bus_for("Capacity Request Failed", id).is_empty());

    // AND the drain deletes it at once
    f.cloud.advance_to(drain_at(&seg));
    tick(&f, Function::Cleanup).await;
    let gone = f.cloud.with_world(|w| {
        !w.sm
            .endpoints
            .contains_key(&(REGION.to_string(), "workshop-llm".to_string()))
    });
    assert!(gone);
}
