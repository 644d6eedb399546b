//! The dispatcher and the kind modules against the in-memory fakes: each kind's rule, seen
//! from the calls it makes (or does not make) to AWS.

use chrono::Duration;

use super::{
    DrainTarget, Launch, Target, drain, launch, spot_allowed, submission_problem, undo, usable,
};
use crate::config::Config;
use crate::domain::money::Usd;
use crate::domain::naming::{DEPLOYMENT_TAG, MANAGED_TAG, REQUEST_TAG};
use crate::domain::offering::{Offering, Product, Segment, TargetResource};
use crate::domain::request::{CapacityRequest, TrainingJobTemplate, WorkloadDetail};
use crate::domain::status::RequestStatus;
use crate::fakes::fixtures::{request, t0};
use crate::fakes::{FakeWorkloads, InMemoryStore, StepDeadline, WorkloadsCall, WorkloadsOp};
use crate::ports::{
    InstanceState, JobState, LaunchMarket, PortError, RequestRecord, Store, WorkloadRecord,
};

const REGION: &str = "us-east-1";
const DEPLOYMENT: &str = crate::config::DEFAULT_DEPLOYMENT_ID;

/// [`launch`] with the test config at [`t0`] and all the time it wants.
async fn launch_now(
    workloads: &FakeWorkloads,
    store: &InMemoryStore,
    rec: &RequestRecord,
    target: &Target,
) -> Result<Launch, PortError> {
    launch(
        workloads,
        store,
        &config(),
        rec,
        target,
        t0(),
        &StepDeadline::plenty(),
    )
    .await
}

fn config() -> Config {
    let env = [
        ("TABLE_NAME", "t"),
        ("EVENT_BUS_NAME", "capacity-pilot"),
        ("ALLOWED_REGIONS", REGION),
        ("ALLOWED_REQUEST_SOURCES", "com.example.ml-platform"),
        ("APPROVER_SOURCES", "com.example.approvals"),
        ("TEAM_BUDGETS_USD", r#"{"team-a": "100000"}"#),
        (
            "SAGEMAKER_EXECUTION_ROLE_ARN",
            "arn:aws:iam::123456789012:role/sm",
        ),
    ];
    Config::from_lookup(&|k| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .expect("a complete test environment")
}

/// An account with the fixture request's subnet, and an empty table.
fn world() -> (FakeWorkloads, InMemoryStore) {
    let workloads = FakeWorkloads::new();
    workloads.add_subnet(REGION, "subnet-a", "us-east-1a");
    (workloads, InMemoryStore::new())
}

fn record(req: CapacityRequest) -> RequestRecord {
    crate::fakes::fixtures::record(req, RequestStatus::Active)
}

fn hyperpod(req: &mut CapacityRequest) {
    req.workload = WorkloadDetail::HyperpodCluster {
        cluster_name: "research".into(),
        instance_group_name: "gpu".into(),
        life_cycle_config: None,
    };
}

fn training_job(req: &mut CapacityRequest) {
    req.workload = WorkloadDetail::TrainingJob(TrainingJobTemplate {
        training_image: "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:1".into(),
        output_s3_uri: "s3://bucket/out".into(),
        volume_size_gb: 100,
        hyper_parameters: Default::default(),
    });
}

fn block_in(id: &str, zone: &str) -> Offering {
    Offering::new(
        id,
        Product::CapacityBlock,
        REGION,
        "p5.48xlarge",
        2,
        vec![Segment {
            start: t0() + Duration::hours(2),
            end: t0() + Duration::hours(26),
            availability_zone: Some(zone.into()),
        }],
        Usd::parse("1000").unwrap(),
        &config().prices,
    )
}

fn on_demand(region: &str) -> Target {
    Target {
        reservation_id: "on-demand".into(),
        token_base: "req-1:on-demand".into(),
        market: LaunchMarket::OnDemand,
        plan_arn: None,
        region: region.into(),
        instance_type: "p5.48xlarge".into(),
        instance_count: 2,
        availability_zone: None,
        subnet_id: None,
        segment: 0,
        must_end_by: t0() + Duration::hours(24),
        drain_at: None,
        relaunch: None,
    }
}

fn window(reservation_id: &str) -> DrainTarget {
    DrainTarget {
        reservation_ids: vec![reservation_id.into()],
        regions: vec![REGION.into()],
        segment: 0,
        instance_type: "p5.48xlarge".into(),
        on_demand: false,
        last: false,
    }
}

#[tokio::test]
async fn usable_rejects_a_block_in_a_zone_without_the_requests_subnets() {
    let workloads = FakeWorkloads::new();
    workloads.add_subnet(REGION, "subnet-a", "us-east-1a");
    let req = request("req-1", "team-a", "50000");
    let offerings = [
        block_in("cb-a", "us-east-1a"),
        block_in("cb-b", "us-east-1b"),
    ];

    let (ok, rejected) = usable(&workloads, &req, &offerings).await.unwrap();

    assert_eq!(ok, [offerings[0].clone()]);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].offering_id, "cb-b");
    assert_eq!(
        rejected[0].reason,
        "none of the request's subnets (subnet-a) is in us-east-1b, where this block is"
    );
}

#[tokio::test]
async fn usable_asks_once_per_zone_however_many_blocks_share_it() {
    let workloads = FakeWorkloads::new();
    workloads.add_subnet(REGION, "subnet-a", "us-east-1a");
    let req = request("req-1", "team-a", "50000");
    let offerings = [
        block_in("cb-1", "us-east-1a"),
        block_in("cb-2", "us-east-1a"),
    ];

    let (ok, _) = usable(&workloads, &req, &offerings).await.unwrap();

    assert_eq!(ok.len(), 2);
    assert_eq!(workloads.calls_of(WorkloadsOp::SubnetInZone).len(), 1);
}

#[tokio::test]
async fn usable_keeps_every_offering_for_a_training_job_without_asking_aws() {
    let workloads = FakeWorkloads::new();
    let mut req = request("req-1", "team-a", "50000");
    training_job(&mut req);
    let mut plan = block_in("tp-1", "us-east-1b");
    plan.product = Product::TrainingPlan {
        target: TargetResource::TrainingJob,
    };

    let (ok, rejected) = usable(&workloads, &req, &[plan.clone()]).await.unwrap();

    assert_eq!(ok, [plan]);
    assert!(rejected.is_empty());
    assert!(workloads.calls().is_empty());
}

#[tokio::test]
async fn a_hyperpod_request_on_an_unmanaged_cluster_has_a_submission_problem() {
    let workloads = FakeWorkloads::new();
    workloads.add_cluster(REGION, "research", false);
    let mut req = request("req-1", "team-a", "50000");
    hyperpod(&mut req);

    let problem = submission_problem(&workloads, &InMemoryStore::new(), &config(), &req, t0())
        .await
        .unwrap();

    let problem = problem.expect("an unmanaged cluster is a problem");
    assert_eq!(problem.field, "workload.cluster_name");
    assert!(
        problem
            .message
            .contains("does not carry the capacity-pilot:managed tag")
    );
}

#[tokio::test]
async fn a_request_for_ec2_instances_has_no_submission_problem_and_asks_aws_nothing() {
    let workloads = FakeWorkloads::new();

    let problem = submission_problem(
        &workloads,
        &InMemoryStore::new(),
        &config(),
        &request("req-1", "team-a", "50000"),
        t0(),
    )
    .await
    .unwrap();

    assert_eq!(problem, None);
    assert!(workloads.calls().is_empty());
}

#[test]
fn spot_is_allowed_only_for_interruptible_ec2_instances() {
    let mut ec2 = request("req-1", "team-a", "50000");
    assert!(!spot_allowed(&ec2));
    ec2.interruptible = true;
    assert!(spot_allowed(&ec2));
    let mut job = ec2.clone();
    training_job(&mut job);
    assert!(!spot_allowed(&job));
}

#[tokio::test]
async fn a_second_launch_of_ec2_instances_finds_the_recorded_slots_and_starts_none() {
    let (workloads, store) = world();
    let rec = record(request("req-1", "team-a", "50000"));
    let target = on_demand(REGION);

    let first = launch_now(&workloads, &store, &rec, &target).await.unwrap();
    let again = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    let Launch::Done(ids) = first else {
        panic!("the first launch is done: {first:?}");
    };
    assert_eq!(ids.len(), 2);
    assert_eq!(again, Launch::Done(ids));
    assert_eq!(workloads.calls_of(WorkloadsOp::LaunchInstances).len(), 2);
}

#[tokio::test]
async fn a_launch_stops_while_the_deadline_leaves_time_to_record_it_and_the_next_finishes() {
    let (workloads, store) = world();
    let mut req = request("req-1", "team-a", "50000");
    req.instance_count = 4;
    let rec = record(req);
    let mut target = on_demand(REGION);
    target.instance_count = 4;
    // 3 s left, each RunInstances taking 0.5 s: a second launch begins with 2 s left (the
    // 1 s reserve plus twice the slowest), a third would begin with 1 s.
    let short = StepDeadline::new(
        std::time::Duration::from_millis(3000),
        std::time::Duration::from_millis(500),
    );

    let first = launch(&workloads, &store, &config(), &rec, &target, t0(), &short)
        .await
        .unwrap();
    let second = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    let Launch::Starting(why) = first else {
        panic!("the first invocation runs out of time: {first:?}");
    };
    assert!(why.contains("2 of 4 instances"), "{why}");
    assert!(why.contains("the slowest took 500 ms"), "{why}");
    let Launch::Done(ids) = second else {
        panic!("the next invocation finishes: {second:?}");
    };
    assert_eq!(ids.len(), 4);
    let calls = workloads.calls_of(WorkloadsOp::LaunchInstances);
    assert_eq!(calls.len(), 4, "no slot is launched twice: {calls:?}");
    assert_eq!(store.workloads(&rec.request_id).await.unwrap().len(), 4);
}

/// A block of `count` in `us-east-1a`, whose zone holds the request's `subnet-a` (room for
/// `room_a` instances' addresses) and `subnet-b` (`room_b`); `subnet-c` is in another zone.
fn block_with_two_subnets(
    count: u32,
    room_a: usize,
    room_b: usize,
) -> (FakeWorkloads, InMemoryStore, RequestRecord, Target) {
    let (workloads, store) = world();
    workloads.add_subnet(REGION, "subnet-c", "us-east-1c");
    workloads.add_subnet(REGION, "subnet-b", "us-east-1a");
    workloads.subnet_room(REGION, "subnet-a", room_a);
    workloads.subnet_room(REGION, "subnet-b", room_b);
    workloads.add_reservation_capacity("cr-1", count, Some("us-east-1a"));
    let mut req = request("req-1", "team-a", "50000");
    req.instance_count = count;
    req.workload = WorkloadDetail::Ec2Instances {
        launch_template: Some(crate::domain::request::LaunchTemplateRef {
            id: Some("lt-1".into()),
            name: None,
            version: None,
        }),
        subnet_ids: vec!["subnet-a".into(), "subnet-c".into(), "subnet-b".into()],
        instance_platform: None,
    };
    let target = Target {
        reservation_id: "cr-1".into(),
        token_base: "cr-1".into(),
        market: LaunchMarket::CapacityBlock {
            reservation_id: "cr-1".into(),
        },
        plan_arn: None,
        region: REGION.into(),
        instance_type: "p5.48xlarge".into(),
        instance_count: count,
        availability_zone: Some("us-east-1a".into()),
        subnet_id: None,
        segment: 0,
        must_end_by: t0() + Duration::hours(24),
        drain_at: None,
        relaunch: None,
    };
    (workloads, store, record(req), target)
}

fn subnets_launched_in(workloads: &FakeWorkloads) -> Vec<String> {
    workloads
        .calls_of(WorkloadsOp::LaunchInstances)
        .into_iter()
        .filter_map(|c| match c {
            WorkloadsCall::LaunchInstances(spec) => Some(spec.subnet_id),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_block_launch_moves_to_the_zones_next_subnet_when_one_has_no_free_addresses() {
    // Issue 50 (review Task 3 #2): GIVEN a block of 3 in us-east-1a, whose first request
    // subnet there has addresses for 1 instance and whose second has room for the rest
    let (workloads, store, rec, target) = block_with_two_subnets(3, 1, 5);

    // WHEN its window's launch runs
    let got = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    // THEN every slot launches: the first in subnet-a, the others in the zone's other
    // subnet once subnet-a answered full (asked once), never in another zone's subnet
    let Launch::Done(ids) = got else {
        panic!("the block launches in the zone's other subnet: {got:?}");
    };
    assert_eq!(ids.len(), 3);
    assert_eq!(
        subnets_launched_in(&workloads),
        ["subnet-a", "subnet-a", "subnet-b", "subnet-b"]
    );
    // AND a slot in the other subnet has a token of its own (one token sent with another
    // subnet is IdempotentParameterMismatch), and a second run starts nothing new
    let again = launch_now(&workloads, &store, &rec, &target).await.unwrap();
    assert_eq!(again, Launch::Done(ids));
    assert_eq!(workloads.calls_of(WorkloadsOp::LaunchInstances).len(), 4);
}

#[tokio::test]
async fn a_block_whose_zone_has_no_free_addresses_waits_and_launches_once_they_free() {
    // Issue 50: GIVEN a block of 2 whose zone's subnets have room for 1 instance in all
    let (workloads, store, rec, target) = block_with_two_subnets(2, 1, 0);

    // WHEN its window's launch runs
    let got = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    // THEN it waits (no capacity yet), naming the subnets and why; the paid request is not
    // refused
    let Launch::NoCapacity { code, why } = got else {
        panic!("a full zone waits for addresses, never refuses: {got:?}");
    };
    assert_eq!(code, "InsufficientFreeAddressesInSubnet");
    for said in ["subnet-a", "subnet-b", "free private IP addresses"] {
        assert!(why.contains(said), "{said}: {why}");
    }
    assert!(!subnets_launched_in(&workloads).contains(&"subnet-c".to_string()));

    // WHEN addresses free up in the second subnet, and the next tick launches
    workloads.subnet_room(REGION, "subnet-b", 4);
    let next = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    // THEN the launched slot is kept and the waiting one launches: 2 instances, no more
    let Launch::Done(ids) = next else {
        panic!("the block launches once addresses free: {next:?}");
    };
    assert_eq!(ids.len(), 2);
    assert_eq!(workloads.live_in_reservation("cr-1").len(), 2);
}

#[tokio::test]
async fn ec2_instances_without_a_launch_template_are_refused_before_anything_launches() {
    let (workloads, store) = world();
    let mut req = request("req-1", "team-a", "50000");
    req.workload = WorkloadDetail::Ec2Instances {
        launch_template: None,
        subnet_ids: vec!["subnet-a".into()],
        instance_platform: None,
    };

    let got = launch_now(&workloads, &store, &record(req), &on_demand(REGION))
        .await
        .unwrap();

    assert_eq!(
        got,
        Launch::Refuse("the request names no launch template".into())
    );
    assert!(workloads.calls().is_empty());
}

#[tokio::test]
async fn an_on_demand_training_job_is_starting_until_sagemaker_places_it() {
    let (workloads, store) = world();
    let mut req = request("req-1", "team-a", "50000");
    training_job(&mut req);
    let rec = record(req);
    let target = on_demand(REGION);
    let name = "cp-req-1-s0-od";

    let first = launch_now(&workloads, &store, &rec, &target).await.unwrap();
    workloads.set_job_state(REGION, name, JobState::InProgress, "Training", None);
    let placed = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    assert_eq!(
        first,
        Launch::Starting(format!(
            "training job {name} is Starting and has no instances yet"
        ))
    );
    assert_eq!(placed, Launch::Done(vec![name.to_string()]));
    assert_eq!(workloads.calls_of(WorkloadsOp::StartTrainingJob).len(), 1);
}

#[tokio::test]
async fn undo_of_a_training_job_touches_neither_aws_nor_the_table() {
    let (workloads, store) = world();
    let mut req = request("req-1", "team-a", "50000");
    training_job(&mut req);

    undo(&workloads, &store, &record(req), &on_demand(REGION), t0())
        .await
        .unwrap();

    assert!(workloads.calls().is_empty());
    assert!(store.calls().is_empty());
}

#[tokio::test]
async fn undo_of_a_partial_ec2_launch_terminates_what_started() {
    let (workloads, store) = world();
    let rec = record(request("req-1", "team-a", "50000"));
    let target = on_demand(REGION);
    let Launch::Done(ids) = launch_now(&workloads, &store, &rec, &target).await.unwrap() else {
        panic!("the launch is done");
    };

    undo(&workloads, &store, &rec, &target, t0()).await.unwrap();

    assert_eq!(
        workloads.calls_of(WorkloadsOp::TerminateInstances),
        [WorkloadsCall::TerminateInstances {
            region: REGION.into(),
            instance_ids: ids,
        }]
    );
}

#[tokio::test]
async fn drain_of_a_hyperpod_group_on_an_unmanaged_cluster_changes_nothing() {
    let (workloads, store) = world();
    workloads.add_cluster(REGION, "research", false);
    workloads.set_instance_group(REGION, "research", "gpu", 2, 2, "InService");
    let mut req = request("req-1", "team-a", "50000");
    hyperpod(&mut req);

    let acted = drain(&workloads, &store, &config(), &record(req), &window("tp-1"))
        .await
        .unwrap();

    assert!(acted.is_empty());
    assert!(workloads.calls_of(WorkloadsOp::PutInstanceGroup).is_empty());
}

/// A HyperPod request whose group `gpu` runs 2 on the managed cluster `research`, ours: the
/// table records that the request created it on `tp-1`.
async fn our_group(workloads: &FakeWorkloads, store: &InMemoryStore) -> CapacityRequest {
    workloads.add_cluster(REGION, "research", true);
    workloads.set_instance_group(REGION, "research", "gpu", 2, 2, "InService");
    let mut req = request("req-1", "team-a", "50000");
    hyperpod(&mut req);
    store.put_workload(group_record("tp-1")).await.unwrap();
    req
}

#[tokio::test]
async fn drain_of_a_hyperpod_group_on_a_managed_cluster_scales_it_to_zero_on_the_plan() {
    let (workloads, store) = world();
    let req = our_group(&workloads, &store).await;

    let acted = drain(&workloads, &store, &config(), &record(req), &window("tp-1"))
        .await
        .unwrap();

    assert_eq!(acted, ["instance-group:research/gpu"]);
    let spec = workloads
        .instance_group_spec(REGION, "research", "gpu")
        .expect("the group was put");
    assert_eq!(spec.instance_count, 0);
    assert_eq!(spec.training_plan_arn.as_deref(), Some("tp-1"));
}

#[tokio::test]
async fn the_drain_of_a_requests_last_window_removes_its_hyperpod_group() {
    // GIVEN our group on a managed cluster, in the request's last window
    let (workloads, store) = world();
    let req = our_group(&workloads, &store).await;
    let last = DrainTarget {
        last: true,
        ..window("tp-1")
    };

    // WHEN it is drained (before the fix: scaled to zero, left pointing at the plan that
    // expires with the window, and sent back by every later update of the cluster)
    let acted = drain(&workloads, &store, &config(), &record(req.clone()), &last)
        .await
        .unwrap();

    // THEN it is removed, not scaled
    assert_eq!(acted, ["instance-group-removed:research/gpu"]);
    assert!(workloads.calls_of(WorkloadsOp::PutInstanceGroup).is_empty());
    assert_eq!(
        workloads.calls_of(WorkloadsOp::RemoveInstanceGroup).len(),
        1
    );
    assert!(
        workloads
            .instance_group_spec(REGION, "research", "gpu")
            .is_none()
    );

    // AND a repeat (the window's end, a retry) finds it gone and sends nothing
    let again = drain(&workloads, &store, &config(), &record(req), &last)
        .await
        .unwrap();
    assert!(again.is_empty());
    assert_eq!(
        workloads.calls_of(WorkloadsOp::RemoveInstanceGroup).len(),
        1
    );
}

#[tokio::test]
async fn drain_of_ec2_instances_terminates_only_our_live_instances() {
    let (workloads, store) = world();
    let rec = record(request("req-1", "team-a", "50000"));
    let Launch::Done(ids) = launch_now(&workloads, &store, &rec, &on_demand(REGION))
        .await
        .unwrap()
    else {
        panic!("the launch is done");
    };
    let mut stranger = workloads.instance(&ids[0]).unwrap();
    stranger.instance_id = "i-stranger".into();
    stranger.tags.clear();
    workloads.add_instance(stranger);
    let mut stopped = workloads.instance(&ids[0]).unwrap();
    stopped.instance_id = "i-stopped".into();
    stopped.state = InstanceState::Stopped;
    workloads.add_instance(stopped);
    let on_demand_run = DrainTarget {
        reservation_ids: vec![],
        on_demand: true,
        ..window("unused")
    };

    let acted = drain(&workloads, &store, &config(), &rec, &on_demand_run)
        .await
        .unwrap();

    let expected: Vec<String> = ids.iter().map(|i| format!("instance:{i}")).collect();
    assert_eq!(acted, expected);
}

// ---- names we own (ARCHITECTURE 8.7) ------------------------------------------------------

fn group_record(reservation_id: &str) -> WorkloadRecord {
    WorkloadRecord {
        request_id: crate::fakes::fixtures::request_id("req-1"),
        reservation_id: reservation_id.into(),
        slot: 0,
        generation: 0,
        resource_id: "research/gpu".into(),
        state: "Updating".into(),
        updated_at: t0(),

        started_at: None,
        ended_at: None,
        ran: Vec::new(),
        relaunch: 0,
    }
}

fn endpoint(req: &mut CapacityRequest) {
    req.workload = WorkloadDetail::InferenceEndpoint {
        model_name: "llm".into(),
        endpoint_name: "shared-llm".into(),
        variant_name: "primary".into(),
    };
}

fn tags(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Tags of what capacity-pilot made for `request` in this deployment.
fn ours_for(request: &str) -> std::collections::BTreeMap<String, String> {
    tags(&[
        (MANAGED_TAG, "true"),
        (REQUEST_TAG, request),
        (DEPLOYMENT_TAG, DEPLOYMENT),
    ])
}

fn plan_target() -> Target {
    Target {
        reservation_id: "tp-1".into(),
        token_base: "tp-1".into(),
        market: LaunchMarket::CapacityBlock {
            reservation_id: "tp-1".into(),
        },
        plan_arn: Some("arn:aws:sagemaker:us-east-1:123456789012:training-plan/tp-1".into()),
        region: REGION.into(),
        instance_type: "ml.p5.48xlarge".into(),
        instance_count: 1,
        availability_zone: None,
        subnet_id: None,
        segment: 0,
        must_end_by: t0() + Duration::hours(24),
        drain_at: None,
        relaunch: None,
    }
}

#[tokio::test]
async fn an_endpoint_name_taken_by_something_not_ours_is_a_submission_problem() {
    for (who, existing) in [
        ("a team's own", tags(&[("team", "search")])),
        ("another request's", ours_for("req-other")),
    ] {
        let workloads = FakeWorkloads::new();
        workloads.add_foreign_endpoint(REGION, "shared-llm", existing);
        let mut req = request("req-1", "team-a", "50000");
        endpoint(&mut req);

        let problem = submission_problem(&workloads, &InMemoryStore::new(), &config(), &req, t0())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{who} endpoint is a problem"));

        assert_eq!(problem.field, "workload.endpoint_name");
        assert!(
            problem.message.contains("shared-llm"),
            "{}",
            problem.message
        );
    }
    // AND a free name, or our own endpoint for this request, is none
    let workloads = FakeWorkloads::new();
    let mut req = request("req-1", "team-a", "50000");
    endpoint(&mut req);
    assert_eq!(
        submission_problem(&workloads, &InMemoryStore::new(), &config(), &req, t0())
            .await
            .unwrap(),
        None
    );
    workloads.add_foreign_endpoint(REGION, "shared-llm", ours_for("req-1"));
    assert_eq!(
        submission_problem(&workloads, &InMemoryStore::new(), &config(), &req, t0())
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn a_launch_into_an_endpoint_name_taken_since_submission_is_refused_and_adopts_nothing() {
    let (workloads, store) = world();
    workloads.add_foreign_endpoint(REGION, "shared-llm", tags(&[("team", "search")]));
    let mut req = request("req-1", "team-a", "50000");
    endpoint(&mut req);
    let rec = record(req);

    let got = launch_now(&workloads, &store, &rec, &plan_target())
        .await
        .unwrap();

    assert!(
        matches!(&got, Launch::Refuse(why) if why.contains("not capacity-pilot's")),
        "{got:?}"
    );
    assert!(workloads.calls_of(WorkloadsOp::CreateEndpoint).is_empty());
    assert!(store.workloads(&rec.request_id).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_drain_deletes_only_an_endpoint_that_is_ours() {
    let (workloads, store) = world();
    let mut req = request("req-1", "team-a", "50000");
    endpoint(&mut req);
    let rec = record(req);
    // GIVEN the name is held by another request's endpoint
    workloads.add_foreign_endpoint(REGION, "shared-llm", ours_for("req-other"));

    let acted = drain(&workloads, &store, &config(), &rec, &window("tp-1"))
        .await
        .unwrap();

    // THEN it is left alone
    assert!(acted.is_empty());
    assert!(workloads.calls_of(WorkloadsOp::DeleteEndpoint).is_empty());
    assert!(workloads.describe_endpoint_now(REGION, "shared-llm"));

    // AND ours is deleted
    workloads.add_foreign_endpoint(REGION, "shared-llm", ours_for("req-1"));
    let acted = drain(&workloads, &store, &config(), &rec, &window("tp-1"))
        .await
        .unwrap();
    assert_eq!(acted[0], "endpoint:shared-llm");
    assert!(!workloads.describe_endpoint_now(REGION, "shared-llm"));
}

#[tokio::test]
async fn a_hyperpod_cluster_with_a_group_of_a_role_we_may_not_pass_is_a_submission_problem() {
    // GIVEN a managed cluster whose controller group runs as the team's own role
    let workloads = FakeWorkloads::new();
    workloads.add_cluster(REGION, "research", true);
    let theirs = "arn:aws:iam::123456789012:role/team-f-hyperpod";
    workloads.set_group_role(REGION, "research", "controller", theirs);
    let mut req = request("req-1", "team-a", "50000");
    hyperpod(&mut req);

    // WHEN it is submitted, without and then with the role in HYPERPOD_ROLE_ARNS
    let problem = submission_problem(&workloads, &InMemoryStore::new(), &config(), &req, t0())
        .await
        .unwrap()
        .expect("a role we may not pass is a problem");
    let mut allowed = config();
    allowed.hyperpod_role_arns = vec![theirs.to_string()];
    let none = submission_problem(&workloads, &InMemoryStore::new(), &allowed, &req, t0())
        .await
        .unwrap();

    // THEN it is refused naming the cluster field, the role and the parameter, until allowed
    assert_eq!(problem.field, "workload.cluster_name");
    assert!(
        problem.message.contains(theirs) && problem.message.contains("HyperPodRoleArns"),
        "{}",
        problem.message
    );
    assert_eq!(none, None);
}

#[tokio::test]
async fn a_hyperpod_request_naming_an_existing_group_has_a_submission_problem() {
    let workloads = FakeWorkloads::new();
    workloads.add_cluster(REGION, "research", true);
    workloads.set_instance_group(REGION, "research", "gpu", 4, 4, "InService");
    let mut req = request("req-1", "team-a", "50000");
    hyperpod(&mut req);

    let problem = submission_problem(&workloads, &InMemoryStore::new(), &config(), &req, t0())
        .await
        .unwrap()
        .expect("an existing group is a problem");

    assert_eq!(problem.field, "workload.instance_group_name");
}

#[tokio::test]
async fn a_hyperpod_group_our_table_does_not_record_is_neither_resized_nor_scaled_down() {
    // GIVEN the customer's own group "gpu" in a managed cluster
    let (workloads, store) = world();
    workloads.add_cluster(REGION, "research", true);
    workloads.set_instance_group(REGION, "research", "gpu", 4, 4, "InService");
    let mut req = request("req-1", "team-a", "50000");
    hyperpod(&mut req);
    let rec = record(req);

    // WHEN a launch and a drain come for a request naming it
    let got = launch_now(&workloads, &store, &rec, &plan_target())
        .await
        .unwrap();
    let acted = drain(&workloads, &store, &config(), &rec, &window("tp-1"))
        .await
        .unwrap();

    // THEN neither touches it
    assert!(
        matches!(&got, Launch::Refuse(why) if why.contains("did not create")),
        "{got:?}"
    );
    assert!(acted.is_empty());
    assert!(workloads.calls_of(WorkloadsOp::PutInstanceGroup).is_empty());
}

#[tokio::test]
async fn a_hyperpod_launch_that_died_after_its_call_finds_the_group_ours_on_the_retry() {
    // GIVEN a launch whose UpdateCluster went through and whose invocation then died: the
    // group exists, recorded only as requested
    let (workloads, store) = world();
    workloads.add_cluster(REGION, "research", true);
    let mut req = request("req-1", "team-a", "50000");
    hyperpod(&mut req);
    let rec = record(req);
    workloads.fail_next(
        WorkloadsOp::PutInstanceGroup,
        crate::ports::PortError::OutcomeUnknown {
            service: "sagemaker",
            message: "connection reset".into(),
        },
    );
    let _ = launch_now(&workloads, &store, &rec, &plan_target()).await;
    workloads.set_instance_group(REGION, "research", "gpu", 1, 1, "InService");

    // WHEN the next tick launches again
    let got = launch_now(&workloads, &store, &rec, &plan_target())
        .await
        .unwrap();

    // THEN the group is ours by its record, and the launch completes
    assert_eq!(got, Launch::Done(vec!["research/gpu".into()]));
}

#[tokio::test]
async fn a_hyperpod_cluster_that_is_updating_makes_the_launch_wait_not_fail() {
    // GIVEN a managed cluster that answers UpdateCluster with ConflictException (it is
    // Updating: another change, or this very update whose answer was lost)
    let (workloads, store) = world();
    workloads.add_cluster(REGION, "research", true);
    let mut req = request("req-1", "team-a", "50000");
    hyperpod(&mut req);
    let rec = record(req);
    workloads.fail_next(
        WorkloadsOp::PutInstanceGroup,
        crate::ports::PortError::Transient {
            service: "sagemaker",
            code: "ConflictException".into(),
            message: "Cluster research is Updating".into(),
        },
    );

    // WHEN the launch runs
    let got = launch_now(&workloads, &store, &rec, &plan_target())
        .await
        .unwrap();

    // THEN it waits for the next tick instead of failing the request
    let Launch::Starting(why) = got else {
        panic!("the launch waits: {got:?}");
    };
    assert!(why.contains("is being updated"), "{why}");
    // AND the next tick sets the group
    let again = launch_now(&workloads, &store, &rec, &plan_target())
        .await
        .unwrap();
    assert_eq!(again, Launch::Done(vec!["research/gpu".into()]));
}

#[tokio::test]
async fn a_block_drain_terminates_only_this_deployments_instances_of_the_request() {
    // GIVEN two instances in the block tagged for req-1: ours, and another stack's (found by
    // the simulation: a second deployment in the account may run a request of the same id)
    let (workloads, store) = world();
    let rec = record(request("req-1", "team-a", "50000"));
    let mut theirs = ours_for("req-1");
    theirs.insert(DEPLOYMENT_TAG.into(), "another-stack".into());
    for (id, tags) in [("i-ours", ours_for("req-1")), ("i-theirs", theirs)] {
        workloads.add_instance(crate::ports::InstanceInfo {
            instance_id: id.into(),
            region: REGION.into(),
            availability_zone: "us-east-1a".into(),
            instance_type: "p5.48xlarge".into(),
            state: InstanceState::Running,
            health: crate::ports::InstanceHealth::Ok,
            reservation_id: Some("cr-1".into()),
            launched_at: None,
            tags,
            scheduled: Vec::new(),
        });
    }

    // WHEN its window drains
    let acted = drain(&workloads, &store, &config(), &rec, &window("cr-1"))
        .await
        .unwrap();

    // THEN only ours is terminated
    assert_eq!(acted, ["instance:i-ours"]);
    assert_eq!(
        workloads.instance("i-theirs").unwrap().state,
        InstanceState::Running
    );
}

#[tokio::test]
async fn an_endpoint_whose_config_is_not_visible_yet_waits_and_is_created_on_the_next_tick() {
    // GIVEN SageMaker does not show the config just created to the first creation (botocore
    // `sagemaker` model, CreateEndpoint: "If the dependent entities are not yet in DynamoDB,
    // this causes a validation error")
    let (workloads, store) = world();
    workloads.hide_new_endpoint_configs(1);
    let mut req = request("req-1", "team-a", "50000");
    endpoint(&mut req);
    let rec = record(req);

    // WHEN the launch runs
    let got = launch_now(&workloads, &store, &rec, &plan_target())
        .await
        .unwrap();

    // THEN it waits, saying why, with no endpoint yet and nothing refused
    assert!(
        matches!(&got, Launch::Starting(why) if why.contains("not visible to SageMaker yet")),
        "{got:?}"
    );
    assert!(!workloads.describe_endpoint_now(REGION, "shared-llm"));

    // WHEN the next tick runs
    let got = launch_now(&workloads, &store, &rec, &plan_target())
        .await
        .unwrap();

    // THEN the endpoint is created
    assert!(
        matches!(&got, Launch::Starting(why) if why.contains("was created")),
        "{got:?}"
    );
    assert!(workloads.describe_endpoint_now(REGION, "shared-llm"));
    assert_eq!(workloads.calls_of(WorkloadsOp::CreateEndpoint).len(), 2);
}

#[tokio::test]
async fn instances_launched_into_a_window_carry_its_drain_start() {
    // Issue 55: GIVEN a block whose window drains at 10:45 on its last day
    let (workloads, store, rec, mut target) = block_with_two_subnets(2, 5, 5);
    let drain = t0() + Duration::hours(23) + Duration::minutes(15);
    target.drain_at = Some(drain);

    // WHEN its window's launch runs
    let got = launch_now(&workloads, &store, &rec, &target).await.unwrap();
    assert!(
        matches!(got, Launch::Done(ref ids) if ids.len() == 2),
        "{got:?}"
    );

    // THEN every instance carries capacity-pilot:drain-at, readable from its metadata, beside
    // the tags every resource carries
    for i in workloads.instances() {
        assert_eq!(
            i.tags
                .get(crate::domain::naming::DRAIN_AT_TAG)
                .map(String::as_str),
            Some(crate::domain::naming::drain_at_value(drain).as_str()),
            "{:?}",
            i.tags
        );
        assert_eq!(
            i.tags
                .get(crate::domain::naming::REQUEST_TAG)
                .map(String::as_str),
            Some(rec.request_id.as_str())
        );
    }
}

/// Issue 58: a block window drained at its old end and reopened by an extension's paid end
/// (relaunch 1) launches every slot again at the next generation, a client token of its own
/// (the old one answers the terminated instance), once: a second run starts nothing.
#[tokio::test]
async fn a_reopened_block_window_launches_every_slot_again_under_tokens_of_its_own() {
    // GIVEN a block of 2 launched, then drained at its old end (every instance terminated)
    let (workloads, store, rec, mut target) = block_with_two_subnets(2, 5, 5);
    let Launch::Done(first) = launch_now(&workloads, &store, &rec, &target).await.unwrap() else {
        panic!("the window launches");
    };
    drain(&workloads, &store, &config(), &rec, &window("cr-1"))
        .await
        .unwrap();
    for i in &first {
        workloads.set_instance_state(i, InstanceState::Terminated);
    }
    assert!(workloads.live_in_reservation("cr-1").is_empty());

    // WHEN extension 1's paid end reopens it and the launch runs (twice)
    target.relaunch = Some(1);
    let got = launch_now(&workloads, &store, &rec, &target).await.unwrap();
    let again = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    // THEN two new instances run, recorded at generation 1 under relaunch 1, launched with
    // tokens none of the first launch's used; the second run starts nothing
    let Launch::Done(ids) = got else {
        panic!("the reopened window launches again: {got:?}");
    };
    assert_eq!(ids.len(), 2);
    assert!(ids.iter().all(|i| !first.contains(i)), "{ids:?} {first:?}");
    assert_eq!(again, Launch::Done(ids.clone()));
    assert_eq!(workloads.live_in_reservation("cr-1").len(), 2);
    let tokens: Vec<(String, String)> = workloads
        .calls_of(WorkloadsOp::LaunchInstances)
        .into_iter()
        .filter_map(|c| match c {
            WorkloadsCall::LaunchInstances(s) => Some((s.client_token, s.subnet_id)),
            _ => None,
        })
        .collect();
    assert_eq!(tokens.len(), 4, "{tokens:?}");
    assert!(
        tokens[2..].iter().all(|t| !tokens[..2].contains(t)),
        "{tokens:?}"
    );
    let recorded = store.workloads(&rec.request_id).await.unwrap();
    assert!(
        recorded
            .iter()
            .all(|w| (w.generation, w.relaunch) == (1, 1) && ids.contains(&w.resource_id)),
        "{recorded:?}"
    );
}

/// Issue 58: a training job on a plan runs with a runtime fixed at the old end; an extension
/// paid while it runs reopens its window (relaunch 1): the follow-on job `<name>-x1` (same
/// image, inputs and output) starts only once the first has stopped, with a runtime to the
/// new end, and once; a job that completed needs none.
#[tokio::test]
async fn a_training_jobs_follow_on_starts_when_the_first_stops_at_the_old_end() {
    let (workloads, store) = world();
    let mut req = request("req-1", "team-a", "50000");
    training_job(&mut req);
    let rec = record(req);
    let mut target = Target {
        reservation_id: "arn:plan".into(),
        token_base: "arn:plan".into(),
        market: LaunchMarket::CapacityBlock {
            reservation_id: "arn:plan".into(),
        },
        plan_arn: Some("arn:plan".into()),
        must_end_by: t0() + Duration::hours(24),
        ..on_demand(REGION)
    };
    let first = "cp-req-1-s0";
    assert_eq!(
        launch_now(&workloads, &store, &rec, &target).await.unwrap(),
        Launch::Done(vec![first.into()])
    );
    workloads.set_job_state(REGION, first, JobState::InProgress, "Training", None);

    // WHEN extension 1 moves the end 24 hours later while the job runs
    target.relaunch = Some(1);
    target.must_end_by = t0() + Duration::hours(48);
    let running = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    // THEN nothing starts while the first job runs
    let Launch::Starting(why) = running else {
        panic!("the follow-on waits for the first job: {running:?}");
    };
    assert!(
        why.contains(first) && why.contains("cp-req-1-s0-x1"),
        "{why}"
    );
    assert_eq!(workloads.calls_of(WorkloadsOp::StartTrainingJob).len(), 1);

    // WHEN the first stops at its runtime's end, and the launch runs twice
    workloads.set_job_state(REGION, first, JobState::Stopped, "MaxRuntimeExceeded", None);
    let got = launch_now(&workloads, &store, &rec, &target).await.unwrap();
    let again = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    // THEN the follow-on starts once, like the first but running to the new end
    assert_eq!(got, Launch::Done(vec!["cp-req-1-s0-x1".into()]));
    assert_eq!(again, got);
    assert_eq!(workloads.calls_of(WorkloadsOp::StartTrainingJob).len(), 2);
    let (a, b) = (
        workloads.training_job_spec(REGION, first).unwrap(),
        workloads
            .training_job_spec(REGION, "cp-req-1-s0-x1")
            .unwrap(),
    );
    assert_eq!(
        (
            &b.training_image,
            &b.output_s3_uri,
            &b.hyper_parameters,
            &b.training_plan_arn
        ),
        (
            &a.training_image,
            &a.output_s3_uri,
            &a.hyper_parameters,
            &a.training_plan_arn
        )
    );
    assert_eq!(b.max_runtime_seconds, 48 * 3600);

    // AND a job that completed before the old end needs no follow-on
    target.relaunch = Some(2);
    workloads.set_job_state(
        REGION,
        "cp-req-1-s0-x1",
        JobState::Completed,
        "Completed",
        None,
    );
    assert_eq!(
        launch_now(&workloads, &store, &rec, &target).await.unwrap(),
        Launch::Done(vec!["cp-req-1-s0-x1".into()])
    );
    assert_eq!(workloads.calls_of(WorkloadsOp::StartTrainingJob).len(), 2);
}

/// A plan's window target for `segment` 0 of plan `arn`.
fn plan_window(arn: &str) -> Target {
    Target {
        reservation_id: arn.into(),
        token_base: arn.into(),
        market: LaunchMarket::CapacityBlock {
            reservation_id: arn.into(),
        },
        plan_arn: Some(arn.into()),
        ..on_demand(REGION)
    }
}

/// Issue 58: a HyperPod group scaled to zero by its window's drain is set on the plan again
/// when an extension's paid end reopens the window (relaunch 1), once.
#[tokio::test]
async fn a_reopened_hyperpod_window_sets_its_group_again_once() {
    // GIVEN our group, launched on tp-1 and drained (scaled to zero)
    let (workloads, store) = world();
    let req = our_group(&workloads, &store).await;
    let rec = record(req);
    drain(&workloads, &store, &config(), &rec, &window("tp-1"))
        .await
        .unwrap();
    assert_eq!(
        workloads
            .instance_group_spec(REGION, "research", "gpu")
            .map(|s| s.instance_count),
        Some(0)
    );
    let mut target = plan_window("tp-1");
    // Without a relaunch, the recorded group stands: nothing is sent.
    let before = workloads.calls_of(WorkloadsOp::PutInstanceGroup).len();
    assert_eq!(
        launch_now(&workloads, &store, &rec, &target).await.unwrap(),
        Launch::Done(vec!["research/gpu".into()])
    );
    assert_eq!(
        workloads.calls_of(WorkloadsOp::PutInstanceGroup).len(),
        before
    );

    // WHEN extension 1 reopens the window and the launch runs twice
    target.relaunch = Some(1);
    let got = launch_now(&workloads, &store, &rec, &target).await.unwrap();
    let again = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    // THEN the group is set on the plan at the window's count again, once
    assert_eq!(got, Launch::Done(vec!["research/gpu".into()]));
    assert_eq!(again, got);
    assert_eq!(
        workloads.calls_of(WorkloadsOp::PutInstanceGroup).len(),
        before + 1
    );
    let spec = workloads
        .instance_group_spec(REGION, "research", "gpu")
        .unwrap();
    assert_eq!(
        (spec.instance_count, spec.training_plan_arn.as_deref()),
        (2, Some("tp-1"))
    );
}

/// Issue 58: an endpoint deleted by its window's drain is created again when an extension's
/// paid end reopens the window (relaunch 1), once.
#[tokio::test]
async fn a_reopened_endpoint_window_creates_the_endpoint_again_once() {
    // GIVEN an endpoint on plan arn:plan, in service, then drained (deleted)
    let (workloads, store) = world();
    let mut req = request("req-1", "team-a", "50000");
    req.workload = WorkloadDetail::InferenceEndpoint {
        model_name: "m".into(),
        endpoint_name: "ep".into(),
        variant_name: "v".into(),
    };
    let rec = record(req);
    workloads.set_plan_state(
        "arn:plan",
        crate::domain::reservation::ReservationState::Active,
    );
    let mut target = plan_window("arn:plan");
    launch_now(&workloads, &store, &rec, &target).await.unwrap();
    workloads.set_endpoint_status(REGION, "ep", "InService", None);
    assert_eq!(
        launch_now(&workloads, &store, &rec, &target).await.unwrap(),
        Launch::Done(vec!["ep".into()])
    );
    drain(&workloads, &store, &config(), &rec, &window("arn:plan"))
        .await
        .unwrap();
    assert!(!workloads.describe_endpoint_now(REGION, "ep"));

    // WHEN extension 1 reopens the window: the launch runs, the endpoint comes into
    // service, and the launch runs again
    target.relaunch = Some(1);
    let creating = launch_now(&workloads, &store, &rec, &target).await.unwrap();
    workloads.set_endpoint_status(REGION, "ep", "InService", None);
    let done = launch_now(&workloads, &store, &rec, &target).await.unwrap();
    let again = launch_now(&workloads, &store, &rec, &target).await.unwrap();

    // THEN it was created a second time, once, and the window runs
    assert!(matches!(creating, Launch::Starting(_)), "{creating:?}");
    assert_eq!(done, Launch::Done(vec!["ep".into()]));
    assert_eq!(again, done);
    assert_eq!(workloads.calls_of(WorkloadsOp::CreateEndpoint).len(), 2);
}
