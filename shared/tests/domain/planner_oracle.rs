//! Property tests: the planner agrees with a brute-force oracle.
//!
//! The oracle enumerates every single offering and every ordered pair and decides
//! feasibility with its own few lines, written from the specification (issue 2), not from
//! the planner's functions: an oracle that shared the planner's code would prove nothing.

use std::collections::{BTreeMap, BTreeSet};

use capacity_pilot::domain::catalog::PriceTable;
use capacity_pilot::domain::money::Usd;
use capacity_pilot::domain::offering::{Offering, Product, Segment, TargetResource};
use capacity_pilot::domain::planner::{plan, plan_rank_key};
use capacity_pilot::domain::request::{
    Budget, CapacityRequest, Prefer, RequestId, Strategy as ReqStrategy, Team, TrainingJobTemplate,
    Window, WorkloadDetail,
};
use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
}

const REGIONS: [&str; 4] = ["us-east-1", "us-east-2", "us-west-2", "eu-west-1"];
const EC2_TYPES: [&str; 4] = [
    "p5.48xlarge",
    "p4d.24xlarge",
    "trn1.32xlarge",
    "p5e.48xlarge",
];
const ML_TYPES: [&str; 4] = [
    "ml.p5.48xlarge",
    "ml.p4d.24xlarge",
    "ml.trn1.32xlarge",
    "ml.p5e.48xlarge",
];

#[derive(Debug, Clone)]
struct Case {
    request: CapacityRequest,
    offerings: Vec<Offering>,
}

fn request_strategy() -> impl Strategy<Value = CapacityRequest> {
    (
        any::<bool>(),                                            // sagemaker?
        proptest::sample::subsequence(vec![0usize, 1, 2], 1..=3), // types asked
        proptest::sample::select(vec![1u32, 2, 4]),
        1u32..=3,                                                 // duration days
        0i64..=144, // earliest start, half-hours from now
        0i64..=192, // slack, half-hours
        proptest::sample::subsequence(vec![0usize, 1, 2], 1..=3), // regions
        proptest::bool::weighted(0.7), // allow_split
        1_000u32..=20_000, // max upfront
        proptest::sample::select(vec![None, Some(Prefer::Cheapest), Some(Prefer::Earliest)]),
    )
        .prop_map(
            |(sm, types, count, days, e, slack, regions, split, max, prefer)| {
                let names = if sm { ML_TYPES } else { EC2_TYPES };
                let earliest = now() + Duration::minutes(30 * e);
                let duration_hours = days * 24;
                let latest = earliest
                    + Duration::hours(i64::from(duration_hours))
                    + Duration::minutes(30 * slack);
                let workload = if sm {
                    WorkloadDetail::TrainingJob(TrainingJobTemplate {
                        training_image: "img".into(),
                        output_s3_uri: "s3://b/o".into(),
                        volume_size_gb: 100,
                        hyper_parameters: BTreeMap::new(),
                    })
                } else {
                    WorkloadDetail::Ec2Instances {
                        launch_template: None,
                        subnet_ids: vec![],
                        instance_platform: None,
                    }
                };
                let products = if sm {
                    vec![
                        Product::TrainingPlan {
                            target: TargetResource::TrainingJob,
                        },
                        Product::OnDemand,
                    ]
                } else {
                    vec![Product::CapacityBlock, Product::OnDemand]
                };
                CapacityRequest {
                    id: RequestId::parse("prop-1").unwrap(),
                    team: Team::parse("team-a").unwrap(),
                    instance_types: types.iter().map(|&i| names[i].to_string()).collect(),
                    instance_count: count,
                    duration_hours,
                    window: Window {
                        earliest_start: earliest,
                        latest_end: latest,
                    },
                    regions: regions.iter().map(|&i| REGIONS[i].to_string()).collect(),
                    allow_split: split,
                    strategy: ReqStrategy::Reserve,
                    prefer,
                    interruptible: false,
                    products,
                    budget: Budget {
                        max_upfront: Usd::parse(&max.to_string()).unwrap(),
                        approval_above: None,
                    },
                    workload,
                    drain_minutes: 0,
                    tags: BTreeMap::new(),
                    mode: Default::default(),
                    extend: None,
                }
            },
        )
}

fn offering_strategy(
    request: &CapacityRequest,
    n: usize,
) -> impl Strategy<Value = Vec<Offering>> + use<> {
    let req = request.clone();
    let quarter = i64::from(req.duration_hours) / 4;
    let slack_quarters = (req.window.latest_end
        - req.window.earliest_start
        - Duration::hours(i64::from(req.duration_hours)))
    .num_hours()
        / quarter;
    // Each attribute matches the request most of the time (index < 8 of 10), so feasible
    // plans, splits and ties are common; the rest is drawn from a wider set.
    let one = (
        0usize..10,                                            // product
        0usize..10,                                            // region
        0usize..10,                                            // type
        0usize..10,                                            // count
        -1i64..=slack_quarters + 3, // start offset from earliest, in quarters of the duration
        1i64..=6,                   // first segment, in quarters of the duration
        proptest::option::weighted(0.3, (0i64..=8, 1i64..=4)), // second segment: gap (3 h), length (quarters)
        1u32..=8,  // fee per quarter of the duration, in $250 steps (ties happen)
        0usize..4, // which one when not matching
    );
    proptest::collection::vec(one, 0..=n).prop_map(move |rows| {
        let sm = req.workload_kind().is_sagemaker();
        rows.into_iter()
            .enumerate()
            .map(|(i, (p, r, t, c, off, len, second, fee, other))| {
                let own_product = if sm {
                    Product::TrainingPlan {
                        target: TargetResource::TrainingJob,
                    }
                } else {
                    Product::CapacityBlock
                };
                let product = if p < 9 {
                    own_product
                } else {
                    [
                        Product::CapacityBlock,
                        Product::TrainingPlan {
                            target: TargetResource::Endpoint,
                        },
                        Product::TrainingPlan {
                            target: TargetResource::TrainingJob,
                        },
                        Product::CapacityBlock,
                    ][other]
                };
                let region = if r < 9 {
                    req.regions[r % req.regions.len()].clone()
                } else {
                    REGIONS[other].to_string()
                };
                let instance_type = if t < 9 {
                    req.instance_types[t % req.instance_types.len()].clone()
                } else if sm {
                    EC2_TYPES[other].to_string()
                } else {
                    ML_TYPES[other].to_string()
                };
                let count = if c < 9 {
                    req.instance_count
                } else {
                    [1, 2, 4, 8][other]
                };
                let start = req.window.earliest_start + Duration::hours(quarter * off);
                let end = start + Duration::hours(quarter * len);
                let mut segments = vec![Segment {
                    start,
                    end,
                    availability_zone: None,
                }];
                // Capacity Blocks have one segment; plans may have two.
                if let (Some((gap, len2)), false) = (second, product == Product::CapacityBlock) {
                    let s2 = end + Duration::hours(3 * gap);
                    segments.push(Segment {
                        start: s2,
                        end: s2 + Duration::hours(quarter * len2),
                        availability_zone: None,
                    });
                }
                let quarters: i64 = segments
                    .iter()
                    .map(|s| (s.end - s.start).num_hours() / quarter.max(1))
                    .sum();
                let fee_usd = u64::from(fee) * 250 * quarters as u64;
                Offering::new(
                    format!("o{i}"),
                    product,
                    region,
                    instance_type,
                    count,
                    segments,
                    Usd::parse(&fee_usd.to_string()).unwrap(),
                    &PriceTable::default(),
                )
            })
            .collect()
    })
}

fn case_strategy() -> impl Strategy<Value = Case> {
    request_strategy().prop_flat_map(|request| {
        let r = request.clone();
        offering_strategy(&request, 12).prop_map(move |offerings| Case {
            request: r.clone(),
            offerings,
        })
    })
}

// ----------------------------------------------------------------------------------------
// The oracle: its own reading of the specification.
// ----------------------------------------------------------------------------------------

/// Fee, start, segments, type preference.
type OracleKey = (Usd, DateTime<Utc>, usize, usize);

fn oracle_product_ok(req: &CapacityRequest, o: &Offering) -> bool {
    match (&req.workload, o.product) {
        (WorkloadDetail::Ec2Instances { .. }, Product::CapacityBlock) => true,
        (WorkloadDetail::TrainingJob(_), Product::TrainingPlan { target }) => {
            target == TargetResource::TrainingJob
        }
        _ => false,
    }
}

/// Everything but length and fee, for one offering.
fn oracle_fits(req: &CapacityRequest, o: &Offering) -> bool {
    let w = req.window;
    oracle_product_ok(req, o)
        && req.regions.contains(&o.region)
        && req.instance_types.contains(&o.instance_type)
        && o.instance_count == req.instance_count
        && !o.segments.is_empty()
        && o.segments.iter().all(|s| s.start < s.end)
        && o.segments
            .iter()
            .all(|s| s.start >= w.earliest_start && s.end <= w.latest_end)
        && o.segments
            .iter()
            .all(|s| s.start >= now() + Duration::minutes(30))
        && (o.segments.len() == 1 || (o.segments.len() == 2 && req.allow_split))
}

fn oracle_minutes(o: &Offering) -> i64 {
    o.segments
        .iter()
        .map(|s| (s.end - s.start).num_minutes())
        .sum()
}

fn oracle_key(req: &CapacityRequest, os: &[&Offering]) -> OracleKey {
    let fee = os.iter().fold(Usd::ZERO, |a, o| a + o.upfront_fee);
    let start = os.iter().map(|o| o.segments[0].start).min().unwrap();
    let segs = os.iter().map(|o| o.segments.len()).sum();
    let pref = req
        .instance_types
        .iter()
        .position(|t| *t == os[0].instance_type)
        .unwrap();
    (fee, start, segs, pref)
}

/// The key in the request's objective's order: `earliest` ranks the start before the fee.
fn objective_order(
    req: &CapacityRequest,
    (fee, start, segs, pref): OracleKey,
) -> (Option<DateTime<Utc>>, Usd, DateTime<Utc>, usize, usize) {
    let earliest = req.prefer == Some(Prefer::Earliest);
    (earliest.then_some(start), fee, start, segs, pref)
}

/// Every feasible plan, as offering-id lists, with its key.
fn oracle(req: &CapacityRequest, offerings: &[Offering]) -> Vec<(Vec<String>, OracleKey)> {
    let need = i64::from(req.duration_hours) * 60;
    let max = req.budget.max_upfront;
    let mut out = Vec::new();
    for o in offerings {
        if oracle_fits(req, o) && oracle_minutes(o) >= need && o.upfront_fee <= max {
            out.push((vec![o.id.clone()], oracle_key(req, &[o])));
        }
    }
    if req.allow_split {
        for a in offerings {
            for b in offerings {
                let blocks =
                    a.product == Product::CapacityBlock && b.product == Product::CapacityBlock;
                let genuine_split = oracle_minutes(a) < need && oracle_minutes(b) < need;
                if a.id != b.id
                    && blocks
                    && genuine_split
                    && oracle_fits(req, a)
                    && oracle_fits(req, b)
                    && a.region == b.region
                    && a.instance_type == b.instance_type
                    && a.instance_count == b.instance_count
                    && a.segments[0].end <= b.segments[0].start
                    && oracle_minutes(a) + oracle_minutes(b) >= need
                    && a.upfront_fee + b.upfront_fee <= max
                {
                    out.push((vec![a.id.clone(), b.id.clone()], oracle_key(req, &[a, b])));
                }
            }
        }
    }
    out
}

fn planner_key(req: &CapacityRequest, p: &capacity_pilot::domain::planner::Plan) -> OracleKey {
    let k = plan_rank_key(req, p);
    (k.upfront_fee, k.start, k.segments, k.type_preference)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, .. ProptestConfig::default() })]

    #[test]
    fn the_best_plan_equals_the_oracles_best(case in case_strategy()) {
        let planning = plan(&case.request, &case.offerings, &PriceTable::default(), now());
        let expected = oracle(&case.request, &case.offerings)
            .into_iter()
            .map(|(_, k)| k)
            .min_by_key(|k| objective_order(&case.request, *k));
        let got = planning.best().map(|p| planner_key(&case.request, p));
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn every_returned_plan_is_feasible(case in case_strategy()) {
        let planning = plan(&case.request, &case.offerings, &PriceTable::default(), now());
        let feasible: BTreeSet<Vec<String>> = oracle(&case.request, &case.offerings)
            .into_iter()
            .map(|(ids, _)| ids)
            .collect();
        for p in &planning.plans {
            let ids: Vec<String> = p.offering_ids().into_iter().map(String::from).collect();
            prop_assert!(feasible.contains(&ids), "infeasible plan {:?}", ids);
            prop_assert!(p.upfront_fee <= case.request.budget.max_upfront);
            prop_assert!(!p.reason.is_empty());
        }
        // Ranked best first.
        let keys: Vec<_> = planning.plans.iter().map(|p| plan_rank_key(&case.request, p)).collect();
        prop_assert!(keys.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn no_feasible_plan_is_missed(case in case_strategy()) {
        let planning = plan(&case.request, &case.offerings, &PriceTable::default(), now());
        let returned: BTreeSet<Vec<String>> = planning
            .plans
            .iter()
            .map(|p| p.offering_ids().into_iter().map(String::from).collect())
            .collect();
        for (ids, _) in oracle(&case.request, &case.offerings) {
            prop_assert!(returned.contains(&ids), "missed feasible plan {:?}", ids);
        }
        // And every offering outside the chosen plan is explained.
        let chosen: BTreeSet<String> = planning
            .best()
            .map(|p| p.offering_ids().into_iter().map(String::from).collect())
            .unwrap_or_default();
        let explained: BTreeSet<String> =
            planning.rejections.iter().map(|r| r.offering_id.clone()).collect();
        for o in &case.offerings {
            prop_assert!(
                chosen.contains(&o.id) ^ explained.contains(&o.id),
                "offering {} is neither chosen nor explained", o.id
            );
        }
        prop_assert!(planning.rejections.iter().all(|r| !r.reason.is_empty()));
    }
}

// ----------------------------------------------------------------------------------------
// Examples that pin the ranking rules down in words.
// ----------------------------------------------------------------------------------------

fn block(id: &str, start_h: i64, hours: i64, fee: &str, ty: &str) -> Offering {
    let start = now() + Duration::hours(start_h);
    Offering::new(
        id,
        Product::CapacityBlock,
        "us-east-1",
        ty,
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

fn ec2_request(split: bool) -> CapacityRequest {
    CapacityRequest {
        id: RequestId::parse("r1").unwrap(),
        team: Team::parse("a").unwrap(),
        instance_types: vec!["p5.48xlarge".into(), "p4d.24xlarge".into()],
        instance_count: 4,
        duration_hours: 48,
        window: Window {
            earliest_start: now() + Duration::hours(1),
            latest_end: now() + Duration::days(10),
        },
        regions: vec!["us-east-1".into()],
        allow_split: split,
        strategy: ReqStrategy::Reserve,
        prefer: None,
        interruptible: false,
        products: vec![Product::CapacityBlock, Product::OnDemand],
        budget: Budget {
            max_upfront: Usd::parse("10000").unwrap(),
            approval_above: None,
        },
        workload: WorkloadDetail::Ec2Instances {
            launch_template: None,
            subnet_ids: vec![],
            instance_platform: None,
        },
        drain_minutes: 0,
        tags: BTreeMap::new(),
        mode: Default::default(),
        extend: None,
    }
}

#[test]
fn the_cheapest_offering_wins_and_the_reason_names_the_saving() {
    let offerings = [
        block("expensive", 24, 48, "8000", "p5.48xlarge"),
        block("cheap", 48, 48, "6644.74", "p5.48xlarge"),
    ];
    let planning = plan(
        &ec2_request(false),
        &offerings,
        &PriceTable::default(),
        now(),
    );
    let best = planning.best().unwrap();
    assert_eq!(best.offering_ids(), ["cheap"]);
    assert!(best.reason.contains("chosen"), "{}", best.reason);
    assert!(
        best.reason.contains("below the on-demand"),
        "{}",
        best.reason
    );
    assert_eq!(best.saving, Some(Usd::parse("3922.94").unwrap()));
    let r = &planning.rejections[0];
    assert_eq!(r.offering_id, "expensive");
    assert!(r.reason.contains("ranked 2 of 2"), "{}", r.reason);
}

#[test]
fn equal_fees_prefer_the_earlier_start_then_the_preferred_type() {
    let offerings = [
        block("later", 48, 48, "7000", "p5.48xlarge"),
        block("earlier-p4d", 24, 48, "7000", "p4d.24xlarge"),
        block("earlier-p5", 24, 48, "7000", "p5.48xlarge"),
    ];
    let planning = plan(
        &ec2_request(false),
        &offerings,
        &PriceTable::default(),
        now(),
    );
    let ids: Vec<_> = planning.plans.iter().map(|p| p.offering_ids()[0]).collect();
    assert_eq!(ids, ["earlier-p5", "earlier-p4d", "later"]);
}

#[test]
fn a_split_of_two_short_blocks_is_found_only_when_allowed() {
    let offerings = [
        block("first-day", 24, 24, "3000", "p5.48xlarge"),
        block("third-day", 72, 24, "3000", "p5.48xlarge"),
    ];
    let without = plan(
        &ec2_request(false),
        &offerings,
        &PriceTable::default(),
        now(),
    );
    assert!(without.plans.is_empty());
    assert!(
        without
            .rejections
            .iter()
            .all(|r| r.reason.contains("covers 24 of the 48 hours"))
    );

    let with = plan(
        &ec2_request(true),
        &offerings,
        &PriceTable::default(),
        now(),
    );
    let best = with.best().unwrap();
    assert_eq!(best.offering_ids(), ["first-day", "third-day"]);
    assert_eq!(best.segments, 2);
    assert!(with.rejections.is_empty());
}

#[test]
fn an_offering_over_budget_or_too_soon_is_rejected_with_its_reason() {
    let offerings = [
        block("pricey", 24, 48, "10000.01", "p5.48xlarge"),
        block("too-soon", 0, 48, "100", "p5.48xlarge"),
    ];
    let mut req = ec2_request(false);
    req.window.earliest_start = now();
    let planning = plan(&req, &offerings, &PriceTable::default(), now());
    assert!(planning.plans.is_empty());
    let reasons: BTreeMap<_, _> = planning
        .rejections
        .iter()
        .map(|r| (r.offering_id.as_str(), r.reason.as_str()))
        .collect();
    assert!(reasons["pricey"].contains("exceeds the request's max_upfront_usd"));
    assert!(reasons["too-soon"].contains("too soon to buy"));
}

/// Guards the properties above against vacuity: the generator must often produce cases
/// with feasible plans, split plans, ties and rejections, or the properties prove little.
#[test]
fn the_generated_cases_exercise_every_branch_of_the_planner() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = case_strategy();
    let (mut with_plan, mut split_best, mut two_seg_plan, mut fee_ties, mut many) = (0, 0, 0, 0, 0);
    let mut any_split = 0;
    let total = 1000;
    for _ in 0..total {
        let case = strategy.new_tree(&mut runner).unwrap().current();
        let planning = plan(
            &case.request,
            &case.offerings,
            &PriceTable::default(),
            now(),
        );
        if let Some(best) = planning.best() {
            with_plan += 1;
            if best.offerings.len() == 2 {
                split_best += 1;
            }
            if planning.plans.iter().any(|p| p.offerings.len() == 2) {
                any_split += 1;
            }
            if best.segments == 2 && best.offerings.len() == 1 {
                two_seg_plan += 1;
            }
            if planning
                .plans
                .iter()
                .skip(1)
                .any(|p| p.upfront_fee == best.upfront_fee)
            {
                fee_ties += 1;
            }
            if planning.plans.len() >= 3 {
                many += 1;
            }
        }
    }
    println!(
        "of {total}: {with_plan} with a plan, {any_split} with a block split, \
         {split_best} best is a block split, \
         {two_seg_plan} best is a two-segment plan, {fee_ties} fee ties, {many} with 3+ plans"
    );
    assert!(with_plan >= total / 5, "{with_plan}");
    assert!(any_split >= 30, "{any_split}");
    assert!(split_best >= 3, "{split_best}");
    assert!(two_seg_plan >= 10, "{two_seg_plan}");
    assert!(fee_ties >= 3, "{fee_ties}");
    assert!(many >= 20, "{many}");
}

#[test]
fn a_plan_costing_exactly_the_max_upfront_is_within_budget() {
    // GIVEN a single block and a split pair, each costing exactly the request's maximum
    let offerings = [
        block("exact", 24, 48, "10000", "p5.48xlarge"),
        block("half-1", 24, 24, "5000", "p4d.24xlarge"),
        block("half-2", 48, 24, "5000", "p4d.24xlarge"),
    ];
    // WHEN planned with splits allowed
    let planning = plan(
        &ec2_request(true),
        &offerings,
        &PriceTable::default(),
        now(),
    );
    // THEN both are feasible, and the single block wins the tie on fewer segments
    let ids: Vec<Vec<&str>> = planning.plans.iter().map(|p| p.offering_ids()).collect();
    assert_eq!(ids, [vec!["exact"], vec!["half-1", "half-2"]]);
}

#[test]
fn prefer_earliest_takes_the_earliest_start_and_states_the_trade_off() {
    // Issue 16: team D's case. GIVEN an early expensive block and a later cheap one
    let offerings = [
        block("early", 24, 48, "8000", "p5.48xlarge"),
        block("late", 24 * 7, 48, "6644.74", "p5.48xlarge"),
    ];
    let mut req = ec2_request(false);

    // WHEN the request prefers the earliest start (asked, or as on-demand-first's fall-back)
    for prefer in [Some(Prefer::Earliest), None] {
        req.prefer = prefer;
        req.strategy = if prefer.is_none() {
            ReqStrategy::OnDemandFirst
        } else {
            ReqStrategy::Reserve
        };
        let planning = plan(&req, &offerings, &PriceTable::default(), now());

        // THEN the early block is chosen, and the decision names both sides of the trade-off
        let best = planning.best().unwrap();
        assert_eq!(best.offering_ids(), ["early"]);
        assert!(
            best.reason.contains("chosen (earliest first)"),
            "{}",
            best.reason
        );
        assert!(
            best.reason
                .contains("earliest: 2 December 00:00Z, $8000.00")
                && best
                    .reason
                    .contains("cheapest: 8 December 00:00Z, $6644.74"),
            "{}",
            best.reason
        );
        assert!(
            planning.rejections[0]
                .reason
                .contains("though it costs less"),
            "{}",
            planning.rejections[0].reason
        );
    }

    // AND cheapest (the default for reserve) takes the cheap one, stating the same trade-off
    req.prefer = None;
    req.strategy = ReqStrategy::Reserve;
    let planning = plan(&req, &offerings, &PriceTable::default(), now());
    let best = planning.best().unwrap();
    assert_eq!(best.offering_ids(), ["late"]);
    assert!(
        best.reason.contains("chosen (cheapest first)"),
        "{}",
        best.reason
    );
    assert!(
        best.reason.contains("the trade-off: earliest: 2 December"),
        "{}",
        best.reason
    );
}
