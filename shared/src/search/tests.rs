use chrono::TimeZone;

use super::*;
use crate::domain::money::Usd;
use crate::domain::offering::Segment;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap()
}

fn query(region: &str, instance_type: &str) -> OfferingQuery {
    OfferingQuery {
        product: Product::CapacityBlock,
        region: region.into(),
        instance_type: instance_type.into(),
        instance_count: 4,
        duration_hours: 48,
        start_from: now(),
        end_by: now() + Duration::days(10),
    }
}

fn offering(id: &str) -> Offering {
    let start = now() + Duration::days(1);
    Offering::new(
        id,
        Product::CapacityBlock,
        "us-east-1",
        "p5.48xlarge",
        4,
        vec![Segment {
            start,
            end: start + Duration::hours(48),
            availability_zone: Some("us-east-1a".into()),
        }],
        Usd::parse("6000").unwrap(),
        &crate::domain::catalog::PriceTable::default(),
    )
}

fn refused() -> PortError {
    PortError::Permanent {
        service: "ec2",
        code: "InvalidParameterValue".into(),
        message: "The instance type 'p5.48xlarge' is not supported for Capacity Blocks in \
                  'us-west-1'"
            .into(),
    }
}

/// EC2's describe limit with `message`, as the adapter classes it (`aws::error`): its own
/// class, never a throttle (issue 50, #10).
fn describe_limit(message: &str) -> PortError {
    crate::aws::error::Failure {
        op: "DescribeCapacityBlockOfferings",
        code: DESCRIBE_LIMIT.into(),
        message: message.into(),
        status: Some(400),
        answered: true,
    }
    .into_port("ec2", crate::aws::error::Call::Retryable)
}

fn throttled(message: &str) -> PortError {
    PortError::Throttled {
        service: "ec2",
        code: "RequestLimitExceeded".into(),
        message: message.into(),
    }
}

fn plan_query(region: &str, instance_type: &str, count: u32) -> OfferingQuery {
    OfferingQuery {
        product: Product::TrainingPlan {
            target: crate::domain::offering::TargetResource::TrainingJob,
        },
        instance_count: count,
        ..query(region, instance_type)
    }
}

#[test]
fn a_refused_query_is_dropped_and_the_others_still_decide() {
    let qs = [
        query("us-east-1", "p5.48xlarge"),
        query("us-west-1", "p5.48xlarge"),
    ];
    let mut round = SearchRound::default();
    round.record(&qs, &qs[0], &Ok(vec![offering("cb-1")]), now());
    round.record(&qs, &qs[1], &Err(refused()), now());
    assert!(round.decides(&qs, now(), now() + Duration::days(5)));
    assert_eq!(round.offerings().len(), 1);
    assert!(!round.all_refused(&qs));
    let gaps = round.gaps(&qs);
    assert_eq!(gaps.len(), 1);
    assert!(
        gaps[0].contains("not supported for Capacity Blocks"),
        "{gaps:?}"
    );
    // The refusal stands into the next round; the answer is asked again.
    let next = round.next_round();
    assert_eq!(next.to_ask(&qs), vec![qs[0].clone()]);
}

#[test]
fn a_failing_query_holds_the_decision_three_ticks_or_until_the_deadline_nears() {
    let qs = [
        query("us-east-1", "p5.48xlarge"),
        query("us-east-2", "p5.48xlarge"),
    ];
    let deadline = now() + Duration::days(5);
    let mut round = SearchRound::default();
    round.record(&qs, &qs[0], &Ok(vec![offering("cb-1")]), now());
    for tick in 1..=3 {
        assert!(!round.decides(&qs, now(), deadline), "tick {tick}");
        assert_eq!(round.to_ask(&qs), vec![qs[1].clone()]);
        round.record(
            &qs,
            &qs[1],
            &Err(throttled("Request limit exceeded.")),
            now(),
        );
    }
    assert!(round.decides(&qs, now(), deadline));
    assert!(round.gaps(&qs)[0].contains("failing for 3 tick(s)"));

    let mut fresh = SearchRound::default();
    fresh.failed(&qs[1], "deferred".into(), now());
    assert!(!fresh.decides(&qs, now(), deadline));
    assert!(fresh.decides(&qs, deadline - Duration::hours(2), deadline));
}

#[test]
fn the_account_limit_reading_refuses_the_family_in_that_region_only() {
    let qs = [
        query("us-east-1", "p5.48xlarge"),
        query("us-east-1", "p5e.48xlarge"),
        query("us-east-1", "p4d.24xlarge"),
        query("us-east-2", "p4d.24xlarge"),
    ];
    let mut round = SearchRound::default();
    round.record(
        &qs,
        &qs[2],
        &Err(describe_limit(
            "Your existing service limits for this AWS account are not sufficient to use EC2 \
             Capacity Blocks",
        )),
        now(),
    );
    // p4d in us-east-1 refused; p5 and p5e (other families), and us-east-2, go on.
    assert_eq!(
        round.to_ask(&qs),
        vec![qs[0].clone(), qs[1].clone(), qs[3].clone()]
    );
    assert!(
        round
            .gaps(&qs)
            .iter()
            .any(|g| g.contains("no Capacity Block quota for p4d in us-east-1"))
    );
    assert_eq!(family("p5e.48xlarge"), "p5e");
}

#[test]
fn the_rate_reading_is_failing_not_refused() {
    let qs = [query("us-east-1", "p5.48xlarge")];
    let mut round = SearchRound::default();
    round.record(
        &qs,
        &qs[0],
        &Err(describe_limit("You've reached the limit for this account.")),
        now(),
    );
    assert!(matches!(
        round.outcomes.get(&key(&qs[0])),
        Some(QueryOutcome::Failing { ticks: 1, .. })
    ));
    assert_eq!(round.to_ask(&qs).len(), 1);
}

#[test]
fn at_most_eight_queries_a_tick_the_never_asked_first() {
    let qs: Vec<OfferingQuery> = "abcdefghij"
        .chars()
        .map(|t| query("us-east-1", &format!("p5{t}.48xlarge")))
        .collect();
    let mut round = SearchRound::default();
    let first = round.to_ask(&qs);
    assert_eq!(first.len(), MAX_QUERIES_PER_REQUEST_TICK);
    for q in &first {
        round.failed(q, "throttled".into(), now());
    }
    let second = round.to_ask(&qs);
    assert_eq!(second[..2], qs[8..]);
}

#[test]
fn every_query_refused_is_all_refused() {
    let qs = [
        query("us-west-1", "p5.48xlarge"),
        query("us-west-1", "p4d.24xlarge"),
    ];
    let mut round = SearchRound::default();
    assert!(!round.all_refused(&[]));
    for q in &qs {
        round.record(&qs, q, &Err(refused()), now());
    }
    assert!(round.all_refused(&qs));
    assert!(round.decides(&qs, now(), now() + Duration::days(5)));
}

#[test]
fn the_describe_limit_is_read_by_the_search_as_the_adapter_classes_it_not_as_a_throttle() {
    // GIVEN EC2's describe limit as the adapter classes it: its own class, not `Throttled`
    let quota = describe_limit(
        "Your existing service limits for this AWS account are not sufficient to use EC2 \
         Capacity Blocks",
    );
    let burst = describe_limit("You've reached the limit for this account.");
    assert!(!matches!(quota, PortError::Throttled { .. }), "{quota:?}");
    // THEN the search alone reads it: the quota wording refuses the family there, the
    // burst wording backs the region off
    assert!(
        matches!(read_failure(&quota), Failure::NoQuota(_)),
        "{quota:?}"
    );
    assert!(
        matches!(read_failure(&burst), Failure::RateLimited(_)),
        "{burst:?}"
    );
    // AND an ordinary throttle is still a rate limit
    assert!(matches!(
        read_failure(&throttled("Request limit exceeded.")),
        Failure::RateLimited(_)
    ));
}

#[test]
fn a_plan_search_over_a_sagemaker_account_limit_refuses_the_type_in_that_region_with_the_reason() {
    // GIVEN plan queries of two types and counts in two regions
    let qs = [
        plan_query("us-east-1", "ml.p5.48xlarge", 2),
        plan_query("us-east-1", "ml.p5.48xlarge", 4),
        plan_query("us-east-1", "ml.p4d.24xlarge", 2),
        plan_query("us-east-2", "ml.p5.48xlarge", 2),
    ];
    let mut round = SearchRound::default();
    // WHEN SearchTrainingPlanOfferings answers ResourceLimitExceeded (its one modeled
    // error), which the adapter classes as no capacity, as for a launch
    let limit = crate::aws::error::Failure {
        op: "SearchTrainingPlanOfferings",
        code: "ResourceLimitExceeded".into(),
        message: "The account-level service limit 'ml.p5.48xlarge for training plan usage' \
                  is 0 Instances"
            .into(),
        status: Some(400),
        answered: true,
    }
    .into_port("sagemaker", crate::aws::error::Call::Retryable);
    round.record(&qs, &qs[0], &Err(limit), now());
    // THEN that type in that region is refused for the request, every count, with the
    // reason; asking again cannot help (before: retried as no capacity for three ticks)
    for q in &qs[..2] {
        assert!(
            matches!(
                round.outcomes.get(&key(q)),
                Some(QueryOutcome::Refused { reason })
                    if reason.contains("SageMaker limit for ml.p5.48xlarge training plans in us-east-1")
                        && reason.contains("ResourceLimitExceeded")
            ),
            "{:?}",
            round.outcomes.get(&key(q))
        );
    }
    // AND other types and regions are still asked
    assert_eq!(round.to_ask(&qs), vec![qs[2].clone(), qs[3].clone()]);
}
