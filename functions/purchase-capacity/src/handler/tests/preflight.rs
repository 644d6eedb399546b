//! ARCHITECTURE §8.1: before the lease (and before an approver is asked), the plan about to be
//! bought is pre-flighted under this function's own role, RunInstances dry run included. Only
//! EC2's request-level codes reject; capacity, quota, throttling and outages never do.

use super::*;
use capacity_pilot::fakes::{WorkloadsCall, WorkloadsOp};
use capacity_pilot::ports::LaunchMarket;

/// A block like [`block`] in `zone`.
fn block_in(id: &str, fee: &str, zone: &str) -> Offering {
    let mut o = block(id, fee);
    for s in &mut o.segments {
        s.availability_zone = Some(zone.into());
    }
    o
}

/// A world whose request subnets are `subnet-a` in us-east-1a and `subnet-b` in us-east-1b.
fn world() -> World {
    let w = World::new();
    w.workloads
        .add_subnet("us-east-1", "subnet-a", "us-east-1a");
    w.workloads
        .add_subnet("us-east-1", "subnet-b", "us-east-1b");
    w
}

fn ec2_error(code: &str) -> PortError {
    PortError::Permanent {
        service: "ec2",
        code: code.into(),
        message: format!("{code} answered"),
    }
}

/// The dry runs made, as (zone's subnet, dry run?).
fn dry_runs(w: &World) -> Vec<(String, bool)> {
    w.workloads
        .calls_of(WorkloadsOp::PreflightInstances)
        .into_iter()
        .map(|c| match c {
            WorkloadsCall::PreflightInstances { spec, dry_run } => {
                // as the launch would be sent, without market options, one instance
                assert_eq!(spec.market, LaunchMarket::OnDemand);
                assert_eq!(spec.count, 1);
                assert_eq!(spec.instance_type, "p5.48xlarge");
                assert_eq!(spec.client_token, "");
                assert_eq!(spec.tags["capacity-pilot:request-id"], "r1");
                (spec.subnet_id, dry_run)
            }
            other => panic!("not a pre-flight: {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn each_request_level_code_rejects_the_plan_and_nothing_is_bought_or_debited() {
    for code in [
        "UnauthorizedOperation",
        "InvalidLaunchTemplateId.NotFound",
        "InvalidLaunchTemplateName.NotFoundException",
        "InvalidAMIID.NotFound",
        "InvalidAMIID.Unavailable",
        "InvalidSubnetID.NotFound",
        "InvalidParameterCombination",
    ] {
        // GIVEN r1's one candidate, a block in us-east-1a, whose dry run EC2 answers `code`
        let w = world();
        w.with_candidate(
            request("r1", "team-a", "5000"),
            block_in("cb-1", "1661.18", "us-east-1a"),
        );
        w.workloads
            .fail_next(WorkloadsOp::PreflightInstances, ec2_error(code));

        // WHEN the purchase function wakes up for it
        w.purchaser(CAPS).handle(found("r1", "e1")).await.unwrap();

        // THEN the request fails saying why, with nothing bought or debited
        assert_eq!(w.status("r1").await, RequestStatus::Failed, "{code}");
        assert_eq!(w.market.purchase_count(), 0, "{code}");
        assert_eq!(w.spent("team-a"), MicroUsd(0), "{code}");
        assert_eq!(dry_runs(&w), [("subnet-a".to_string(), true)], "{code}");
        let rec = w.record_of("r1").await;
        assert!(
            rec.reason
                .contains("no candidate plan passed the pre-flight"),
            "{code}: {}",
            rec.reason
        );
        assert!(rec.reason.contains(code), "{code}: {}", rec.reason);
        assert!(rec.reason.contains("cb-1"), "{code}: {}", rec.reason);
        let failed = w.events.published_of("Capacity Request Failed");
        assert_eq!(failed.len(), 1, "{code}");
        assert_eq!(failed[0].detail["spent_usd"], "0", "{code}");
    }
}

#[tokio::test]
async fn capacity_quota_throttling_and_outages_never_reject_and_the_plan_is_bought() {
    let answers = [
        PortError::NoCapacity {
            code: "InsufficientInstanceCapacity".into(),
            message: "no capacity".into(),
        },
        PortError::NoCapacity {
            code: "VcpuLimitExceeded".into(),
            message: "quota".into(),
        },
        PortError::NoCapacity {
            code: "InstanceLimitExceeded".into(),
            message: "quota".into(),
        },
        PortError::Throttled {
            service: "ec2",
            code: "RequestLimitExceeded".into(),
            message: "slow down".into(),
        },
        PortError::Transient {
            service: "ec2",
            code: "InternalError".into(),
            message: "oops".into(),
        },
        PortError::OutcomeUnknown {
            service: "ec2",
            message: "timed out".into(),
        },
        ec2_error("Unsupported"),
        ec2_error("InvalidParameterValue"),
    ];
    for answer in answers {
        // GIVEN r1's candidate whose dry run answers `answer`
        let w = world();
        w.with_candidate(
            request("r1", "team-a", "5000"),
            block_in("cb-1", "1661.18", "us-east-1a"),
        );
        w.workloads
            .fail_next(WorkloadsOp::PreflightInstances, answer.clone());

        // WHEN the purchase function wakes up for it
        let out = w.purchaser(CAPS).handle(found("r1", "e1")).await.unwrap();

        // THEN the plan is bought, the check reported unverified
        assert_eq!(w.status("r1").await, RequestStatus::Reserved, "{answer}");
        assert_eq!(w.market.purchases_of("cb-1"), 1, "{answer}");
        assert!(
            out.decisions
                .iter()
                .any(|d| d.action == "pre-flight-unverified" && d.reason.contains("not verified")),
            "{answer}: {:?}",
            out.decisions
        );
    }
}

#[tokio::test]
async fn a_rejected_first_candidate_is_dropped_and_the_next_is_bought_at_the_next_wake_up() {
    // GIVEN r1's candidates: cb-1 in us-east-1a (cheaper, first), cb-2 in us-east-1b, and
    // EC2 answering the dry run in us-east-1a InvalidSubnetID.NotFound
    let w = world();
    let mut req = request("r1", "team-a", "5000");
    if let capacity_pilot::domain::request::WorkloadDetail::Ec2Instances { subnet_ids, .. } =
        &mut req.workload
    {
        subnet_ids.push("subnet-b".into());
    }
    let rec = w.with_candidates(
        req,
        vec![
            block_in("cb-1", "1661.18", "us-east-1a"),
            block_in("cb-2", "1700.00", "us-east-1b"),
        ],
    );
    assert_eq!(rec.candidates[0].offering_ids(), ["cb-1"]);
    w.workloads.fail_next(
        WorkloadsOp::PreflightInstances,
        ec2_error("InvalidSubnetID.NotFound"),
    );
    let p = w.purchaser(CAPS);

    // WHEN the purchase function wakes up
    p.handle(found("r1", "e1")).await.unwrap();

    // THEN cb-1 is dropped with its reason, cb-2 is the candidate, and nothing is bought yet
    let rec = w.record_of("r1").await;
    assert_eq!(rec.status, RequestStatus::OfferingsFound);
    assert_eq!(rec.candidates.len(), 1);
    assert_eq!(rec.candidates[0].offering_ids(), ["cb-2"]);
    assert!(
        rec.reason
            .contains("pre-flight dropped 1 candidate plan(s)"),
        "{}",
        rec.reason
    );
    assert!(
        rec.reason
            .contains("cb-1 in us-east-1: pre-flight: RunInstances dry run"),
        "{}",
        rec.reason
    );
    assert!(
        rec.reason.contains("InvalidSubnetID.NotFound"),
        "{}",
        rec.reason
    );
    assert_eq!(w.market.purchase_count(), 0);
    assert_eq!(
        dry_runs(&w),
        [
            ("subnet-a".to_string(), true),
            ("subnet-b".to_string(), true)
        ]
    );

    // AND at the next wake-up cb-2 passes again and is bought
    p.handle(tick("t1")).await.unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::Reserved);
    assert_eq!(w.market.purchases_of("cb-2"), 1);
    assert_eq!(w.market.purchases_of("cb-1"), 0);
}

#[tokio::test]
async fn a_plan_awaiting_approval_is_preflighted_before_the_ask_and_after_the_answer_only() {
    // GIVEN r1 above its approval threshold
    let w = world();
    let mut req = request("r1", "team-a", "5000");
    req.budget.approval_above = Some(Usd::parse("1000").unwrap());
    w.with_candidate(req, block_in("cb-1", "1661.18", "us-east-1a"));
    let p = w.purchaser(CAPS);

    // WHEN it is found, looked at twice while waiting, then approved
    p.handle(found("r1", "e1")).await.unwrap();
    assert_eq!(w.status("r1").await, RequestStatus::AwaitingApproval);
    assert_eq!(
        dry_runs(&w).len(),
        1,
        "pre-flighted before the approver is asked"
    );
    p.handle(tick("t1")).await.unwrap();
    p.handle(tick("t2")).await.unwrap();
    assert_eq!(dry_runs(&w).len(), 1, "not again while it waits");
    let key = w.events.published_of("Capacity Purchase Awaiting Approval")[0].detail["event_key"]
        .as_str()
        .unwrap()
        .to_string();
    // EC2 now refuses the launch: the role lost its permission meanwhile
    w.workloads.fail_next(
        WorkloadsOp::PreflightInstances,
        ec2_error("UnauthorizedOperation"),
    );
    p.handle(event(
        "Capacity Purchase Approved",
        "com.example.approvals",
        "a1",
        json!({"request_id": "r1", "approver": "alice", "approves": key}),
    ))
    .await
    .unwrap();

    // THEN the approved plan is pre-flighted again before the lease, and not bought
    assert_eq!(dry_runs(&w).len(), 2);
    assert_eq!(w.status("r1").await, RequestStatus::Failed);
    assert_eq!(w.market.purchase_count(), 0);
    assert_eq!(w.spent("team-a"), MicroUsd(0));
}

#[tokio::test]
async fn an_endpoint_whose_model_is_missing_in_the_region_is_not_bought() {
    // GIVEN an endpoint request whose model SageMaker does not know in us-east-1
    let w = world();
    let mut req = request("r1", "team-a", "5000");
    req.instance_types = vec!["ml.p5.48xlarge".into()];
    req.workload = capacity_pilot::domain::request::WorkloadDetail::InferenceEndpoint {
        model_name: "llm".into(),
        endpoint_name: "llm".into(),
        variant_name: "primary".into(),
    };
    let start = t0() + Duration::hours(26) + Duration::minutes(30);
    let product = Product::TrainingPlan {
        target: capacity_pilot::domain::offering::TargetResource::Endpoint,
    };
    let o = Offering::new(
        "tp-1",
        product,
        "us-east-1",
        "ml.p5.48xlarge",
        2,
        vec![Segment {
            start,
            end: start + Duration::hours(24),
            availability_zone: None,
        }],
        Usd::parse("1661.18").unwrap(),
        &PriceTable::default(),
    );
    req.products = vec![product];
    w.with_candidate(req, o);
    w.workloads.remove_model("us-east-1", "llm");

    // WHEN the purchase function wakes up for it
    w.purchaser(CAPS).handle(found("r1", "e1")).await.unwrap();

    // THEN it fails, naming the model and the region, and nothing is bought
    assert_eq!(w.status("r1").await, RequestStatus::Failed);
    assert_eq!(w.market.purchase_count(), 0);
    let rec = w.record_of("r1").await;
    assert!(
        rec.reason
            .contains("SageMaker model llm does not exist in us-east-1"),
        "{}",
        rec.reason
    );
}

#[tokio::test]
async fn candidates_in_one_zone_share_its_dry_run() {
    // GIVEN r1's two candidates, both in us-east-1a, where EC2 refuses the launch
    let w = world();
    w.with_candidates(
        request("r1", "team-a", "5000"),
        vec![
            block_in("cb-1", "1661.18", "us-east-1a"),
            block_in("cb-2", "1700.00", "us-east-1a"),
        ],
    );
    w.workloads.fail_next(
        WorkloadsOp::PreflightInstances,
        ec2_error("UnauthorizedOperation"),
    );

    // WHEN the purchase function wakes up
    w.purchaser(CAPS).handle(found("r1", "e1")).await.unwrap();

    // THEN one dry run answers for both: neither passes, and nothing is bought
    assert_eq!(dry_runs(&w), [("subnet-a".to_string(), true)]);
    let rec = w.record_of("r1").await;
    assert_eq!(rec.status, RequestStatus::Failed);
    assert!(
        rec.reason.contains("cb-1") && rec.reason.contains("cb-2"),
        "{}",
        rec.reason
    );
    assert_eq!(w.market.purchase_count(), 0);
}
