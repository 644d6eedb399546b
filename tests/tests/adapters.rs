//! The EC2, SageMaker, EventBridge and clock adapters against the offline emulator
//! `local-cloud`, built with their production constructors from an `SdkConfig` whose
//! endpoint is each test's own emulator. Assertions are on the fields the functions read.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::config::{Credentials, Region};
use capacity_pilot::aws::capacity::{AwsMarket, AwsWorkloads};
use capacity_pilot::aws::clock::ConfiguredClock;
use capacity_pilot::aws::eventbridge::{EntryRetry, EventBridgeSink, SOURCE};
use capacity_pilot::domain::catalog::PriceTable;
use capacity_pilot::domain::naming::{MANAGED_TAG, REQUEST_TAG, plan_name};
use capacity_pilot::domain::offering::{Offering, Product, TargetResource};
use capacity_pilot::domain::request::{LaunchTemplateRef, RequestId};
use capacity_pilot::domain::reservation::ReservationState;
use capacity_pilot::ports::{
    CapacityMarket, Clock, EndpointSpec, EventSink, InstanceFilter, InstanceHealth, InstanceState,
    JobState, LaunchMarket, LaunchSpec, OfferingQuery, OutboundEvent, PortError, PurchaseSpec,
    TrainingJobSpec, Workloads,
};
use chrono::{DateTime, TimeDelta, Timelike, Utc};
use local_cloud::{Fault, FaultKind, LocalCloud, Options, Settings};

const REGION: &str = "us-east-1";

fn t0() -> DateTime<Utc> {
    "2026-09-01T08:00:00Z".parse().expect("valid")
}

struct Env {
    cloud: LocalCloud,
    market: AwsMarket,
    workloads: AwsWorkloads,
    sdk: aws_config::SdkConfig,
}

/// The SDK configuration production builds, pointed at the emulator; SDK retries are the
/// standard ones, so a purchase that is not retried shows that the adapter turned them off.
async fn sdk_config(url: &str) -> aws_config::SdkConfig {
    capacity_pilot::aws::wiring::sdk_loader()
        .endpoint_url(url)
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new(
            "AKIDLOCALCLOUD",
            "local-cloud-secret",
            None,
            None,
            "adapter-tests",
        ))
        .load()
        .await
}

async fn env_with(settings: Settings) -> Env {
    let cloud = LocalCloud::start(Options {
        seed: 7,
        start: Some(t0()),
        settings,
        ..Options::default()
    })
    .await
    .expect("emulator starts");
    let sdk = sdk_config(&cloud.url()).await;
    Env {
        market: AwsMarket::new(&sdk, PriceTable::default()),
        workloads: AwsWorkloads::new(&sdk),
        cloud,
        sdk,
    }
}

async fn env() -> Env {
    env_with(Settings::default()).await
}

fn query(product: Product, instance_type: &str, count: u32, hours: u32) -> OfferingQuery {
    OfferingQuery {
        product,
        region: REGION.into(),
        instance_type: instance_type.into(),
        instance_count: count,
        duration_hours: hours,
        start_from: t0() + TimeDelta::days(1),
        end_by: t0() + TimeDelta::days(40),
    }
}

fn purchase_spec(request: &str) -> PurchaseSpec {
    let request_id = RequestId::parse(request).expect("valid id");
    PurchaseSpec {
        plan_name: plan_name(&request_id, "prod", 0),
        tags: BTreeMap::from([
            (MANAGED_TAG.to_string(), "true".to_string()),
            (REQUEST_TAG.to_string(), request_id.to_string()),
            ("team".to_string(), "vision".to_string()),
        ]),
        request_id,
        instance_platform: "Linux/UNIX".into(),
    }
}

async fn first_block(env: &Env, count: u32, hours: u32) -> Offering {
    let offers = env
        .market
        .search(&query(Product::CapacityBlock, "p5.48xlarge", count, hours))
        .await
        .expect("search");
    offers.into_iter().next().expect("an offering")
}

fn reservations_in_emulator(env: &Env) -> usize {
    env.cloud.with_world(|w| w.ec2.reservations.len())
}

#[tokio::test]
async fn capacity_block_offerings_carry_their_window_zone_fee_and_on_demand_price() {
    let env = env().await;
    // GIVEN a search for two p5.48xlarge for 48 hours
    let offers = env
        .market
        .search(&query(Product::CapacityBlock, "p5.48xlarge", 2, 48))
        .await
        .unwrap();
    // THEN every offering is one segment in one zone, ending at 11:30 UTC, priced
    assert!(!offers.is_empty());
    for o in &offers {
        assert!(o.id.starts_with("cb-"), "{}", o.id);
        assert_eq!(o.product, Product::CapacityBlock);
        assert_eq!(o.region, REGION);
        assert_eq!(o.instance_type, "p5.48xlarge");
        assert_eq!(o.instance_count, 2);
        assert_eq!(o.segments.len(), 1);
        let s = &o.segments[0];
        assert!(
            s.availability_zone
                .as_deref()
                .is_some_and(|az| az.starts_with(REGION))
        );
        assert_eq!((s.end.hour(), s.end.minute()), (11, 30));
        assert!(s.start > t0());
        assert!(o.upfront_fee.is_positive());
        assert_eq!(o.instance_hours, s.hours() * rust_decimal::Decimal::from(2));
        assert!(o.on_demand_cost.is_some());
    }
}

#[tokio::test]
async fn reconciliation_falls_back_to_the_documented_state_filter_when_the_tag_filter_is_refused() {
    // GIVEN an EC2 that refuses the undocumented tag filter (aws-reference 11.1), and two
    // requests' blocks bought and listed
    let env = env_with(Settings {
        refuse_tag_filters: true,
        listing_lag_seconds: 0,
        ..Settings::default()
    })
    .await;
    let offer = first_block(&env, 1, 24).await;
    let mine = env
        .market
        .purchase(&offer, &purchase_spec("block-a"))
        .await
        .unwrap();
    env.market
        .purchase(&offer, &purchase_spec("block-b"))
        .await
        .unwrap();
    // WHEN reconciliation looks for one request's
    let found = env
        .market
        .find_by_request(
            Product::CapacityBlock,
            REGION,
            &RequestId::parse("block-a").unwrap(),
            "",
        )
        .await
        .unwrap();
    // THEN it finds exactly that request's block, by state and the tag matched here
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].id, mine.id);
    assert_eq!(found[0].request_tag.as_deref(), Some("block-a"));
    // AND the emulator does refuse the tag filter
    let refused = aws_sdk_ec2::Client::new(&env.sdk)
        .describe_capacity_reservations()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name(format!("tag:{REQUEST_TAG}"))
                .values("block-a")
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_ec2::error::ProvideErrorMetadata::code(&refused),
        Some("InvalidParameterValue")
    );
}

#[tokio::test]
async fn the_detector_lists_this_deployments_blocks_by_tag_and_plans_by_name() {
    use capacity_pilot::domain::naming::DEPLOYMENT_TAG;
    // GIVEN, listed: a block tagged for this deployment, one tagged for another, and a plan
    // named for this deployment (each bought for its own request)
    let env = env_with(Settings {
        listing_lag_seconds: 0,
        ..Settings::default()
    })
    .await;
    let offer = first_block(&env, 1, 24).await;
    let mut mine = purchase_spec("dep-a");
    mine.tags.insert(DEPLOYMENT_TAG.into(), "prod".into());
    let block = env.market.purchase(&offer, &mine).await.unwrap();
    let mut theirs = purchase_spec("dep-b");
    theirs.tags.insert(DEPLOYMENT_TAG.into(), "staging".into());
    env.market.purchase(&offer, &theirs).await.unwrap();
    let product = Product::TrainingPlan {
        target: TargetResource::TrainingJob,
    };
    let plans = env
        .market
        .search(&query(product, "ml.p5.48xlarge", 1, 48))
        .await
        .unwrap();
    let plan = env
        .market
        .purchase(&plans[0], &purchase_spec("dep-c"))
        .await
        .unwrap();
    // WHEN the detector lists this deployment's
    let found = env.market.find_by_deployment(REGION, "prod").await.unwrap();
    // THEN it gets the block and the plan, each with its request and deployment
    let mut got: Vec<(String, Option<String>, Option<String>)> = found
        .iter()
        .map(|r| {
            (
                r.id.clone(),
                r.request_tag.clone(),
                r.deployment_tag.clone(),
            )
        })
        .collect();
    got.sort();
    let mut want = vec![
        (
            block.id,
            Some("dep-a".to_string()),
            Some("prod".to_string()),
        ),
        (plan.id, Some("dep-c".to_string()), Some("prod".to_string())),
    ];
    want.sort();
    assert_eq!(got, want);
    // AND with the tag filter refused, the block is still found by state
    env.cloud
        .with_world(|w| w.settings.refuse_tag_filters = true);
    let found = env.market.find_by_deployment(REGION, "prod").await.unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
}

#[tokio::test]
async fn a_bought_block_is_tagged_found_by_request_and_moves_through_its_states() {
    let env = env().await;
    let offer = first_block(&env, 1, 24).await;
    let spec = purchase_spec("block-1");
    // WHEN we buy it
    let r = env.market.purchase(&offer, &spec).await.unwrap();
    // THEN the reservation has the offering's window, fee and our request tag
    assert!(r.id.starts_with("cr-"));
    // (a fresh block is pending: aws-reference 11.1)
    assert_eq!(r.state, ReservationState::Pending);
    assert_eq!(r.segments, offer.segments);
    assert_eq!(r.upfront_fee, offer.upfront_fee);
    assert_eq!(r.offering_id.as_deref(), Some(offer.id.as_str()));
    assert_eq!(r.request_tag.as_deref(), Some("block-1"));
    // ... and the offering's count, though a block's totals read 0 until it is active
    assert_eq!(r.instance_count, 1);
    // AND AWS's listing lags: neither the tag filter nor the id finds it at once
    let lagging = env
        .market
        .find_by_request(Product::CapacityBlock, REGION, &spec.request_id, "")
        .await
        .unwrap();
    assert!(lagging.is_empty(), "{lagging:?}");
    assert_eq!(
        env.market
            .describe(Product::CapacityBlock, REGION, &r.id)
            .await
            .unwrap(),
        None,
        "an unlisted id reads as unknown"
    );
    env.cloud.step(TimeDelta::minutes(3));
    // AND then reconciliation by tag finds exactly it, with the fee and offering from its
    // tags and its count from EC2's incrementalRequestedQuantity tag
    let found = env
        .market
        .find_by_request(Product::CapacityBlock, REGION, &spec.request_id, "")
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, r.id);
    assert_eq!(found[0].upfront_fee, offer.upfront_fee);
    assert_eq!(found[0].offering_id, r.offering_id);
    assert_eq!(found[0].request_tag.as_deref(), Some("block-1"));
    assert_eq!(found[0].instance_count, 1);
    // AND another request finds nothing
    let other = RequestId::parse("block-2").unwrap();
    assert!(
        env.market
            .find_by_request(Product::CapacityBlock, REGION, &other, "")
            .await
            .unwrap()
            .is_empty()
    );
    // WHEN payment completes, then the window opens
    env.cloud.step(TimeDelta::minutes(7));
    let d = env
        .market
        .describe(Product::CapacityBlock, REGION, &r.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.state, ReservationState::Scheduled);
    assert_eq!(
        d.instance_count, 1,
        "a scheduled block's count comes from its tag"
    );
    // Active once EC2 activates it, which lags the start (ARCHITECTURE §8.10: 5 min).
    env.cloud
        .advance_to(offer.start() + chrono::TimeDelta::minutes(5));
    let d = env
        .market
        .describe(Product::CapacityBlock, REGION, &r.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.state, ReservationState::Active);
    assert_eq!(d.instance_count, 1);
    // AND an unknown reservation is None
    assert_eq!(
        env.market
            .describe(Product::CapacityBlock, REGION, "cr-0000000000000000f")
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn a_purchase_whose_response_is_lost_is_outcome_unknown_bought_once_and_found_by_request() {
    let env = env().await;
    let offer = first_block(&env, 1, 24).await;
    let spec = purchase_spec("lost-1");
    // GIVEN the emulator performs the next purchase but loses its response (HTTP 500), and
    // the offering stays on sale, so an SDK retry would buy a second block
    env.cloud.inject(Fault {
        operation: "PurchaseCapacityBlock".into(),
        kind: FaultKind::LostResponse,
        count: Some(1),
    });
    // WHEN we buy
    let err = env.market.purchase(&offer, &spec).await.unwrap_err();
    // THEN the outcome is unknown, and exactly one block was bought
    assert!(matches!(err, PortError::OutcomeUnknown { .. }), "{err:?}");
    assert_eq!(
        reservations_in_emulator(&env),
        1,
        "the SDK retried the purchase"
    );
    // AND reconciliation finds it, tagged with the request, once AWS lists it
    env.cloud.step(TimeDelta::minutes(3));
    let found = env
        .market
        .find_by_request(Product::CapacityBlock, REGION, &spec.request_id, "")
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].upfront_fee, offer.upfront_fee);
    assert_eq!(found[0].offering_id.as_deref(), Some(offer.id.as_str()));
}

#[tokio::test]
async fn a_500_on_purchase_is_outcome_unknown_without_a_retry() {
    let env = env().await;
    let offer = first_block(&env, 1, 24).await;
    env.cloud.inject(Fault {
        operation: "PurchaseCapacityBlock".into(),
        kind: FaultKind::InternalError,
        count: Some(1),
    });
    let err = env
        .market
        .purchase(&offer, &purchase_spec("err-1"))
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::OutcomeUnknown { .. }), "{err:?}");
    // nothing was bought, and nothing retried (the fault was for one call only)
    assert_eq!(reservations_in_emulator(&env), 0);
}

#[tokio::test]
async fn buying_an_unknown_offering_is_offering_gone() {
    let env = env().await;
    let mut offer = first_block(&env, 1, 24).await;
    offer.id = "cb-0000000000000000f".into();
    let err = env
        .market
        .purchase(&offer, &purchase_spec("gone-1"))
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::OfferingGone { .. }), "{err:?}");
    assert_eq!(err.code(), Some("InvalidCapacityBlockOfferingIdNotFound"));
}

#[tokio::test]
async fn instances_in_a_block_report_state_health_and_impairment_and_terminate_idempotently() {
    let env = env().await;
    let offer = first_block(&env, 2, 24).await;
    let r = env
        .market
        .purchase(&offer, &purchase_spec("inst-1"))
        .await
        .unwrap();
    let az = offer.segments[0].availability_zone.clone().unwrap();
    // GIVEN the request's subnets, one per zone, in some order
    let subnets: Vec<String> = env
        .cloud
        .with_world(|w| w.subnets(REGION).into_iter().map(|s| s.id).collect());
    let subnet = env
        .workloads
        .subnet_in_zone(REGION, &subnets, &az)
        .await
        .unwrap()
        .expect("a subnet in the block's zone");
    let expected = env.cloud.with_world(|w| {
        w.subnets(REGION)
            .into_iter()
            .find(|s| s.availability_zone == az)
            .unwrap()
            .id
    });
    assert_eq!(subnet, expected);
    assert_eq!(
        env.workloads
            .subnet_in_zone(REGION, &subnets, "us-east-1-nowhere")
            .await
            .unwrap(),
        None
    );
    env.cloud
        .advance_to(offer.start() + chrono::TimeDelta::minutes(5));
    let spec = LaunchSpec {
        region: REGION.into(),
        market: LaunchMarket::CapacityBlock {
            reservation_id: r.id.clone(),
        },
        instance_type: "p5.48xlarge".into(),
        count: 2,
        subnet_id: subnet,
        launch_template: LaunchTemplateRef {
            id: None,
            name: Some("capacity-pilot-gpu".into()),
            version: None,
        },
        client_token: capacity_pilot::domain::naming::client_token(&r.id, 0, 0),
        tags: BTreeMap::from([(REQUEST_TAG.to_string(), "inst-1".to_string())]),
    };
    // WHEN we launch into the block
    let launched = env.workloads.launch_instances(&spec).await.unwrap();
    assert_eq!(launched.len(), 2);
    assert!(
        launched
            .iter()
            .all(|i| i.reservation_id.as_deref() == Some(r.id.as_str())
                && i.availability_zone == az
                && i.state == InstanceState::Pending
                && i.tags.contains_key(MANAGED_TAG))
    );
    // AND again with the same client token: the same instances
    let again = env.workloads.launch_instances(&spec).await.unwrap();
    let ids = |v: &[capacity_pilot::ports::InstanceInfo]| {
        let mut ids: Vec<String> = v.iter().map(|i| i.instance_id.clone()).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&again), ids(&launched));
    // AND EC2 does not list them yet (Describe* lag new instances): absent, not an error
    let by_reservation = InstanceFilter {
        reservation_id: Some(r.id.clone()),
        managed_only: true,
        ..InstanceFilter::default()
    };
    let by_id = InstanceFilter {
        instance_ids: ids(&launched),
        ..InstanceFilter::default()
    };
    for filter in [&by_reservation, &by_id] {
        let early = env.workloads.describe_instances(REGION, filter).await;
        assert_eq!(early.unwrap(), vec![], "{filter:?}");
    }
    // THEN once listed and running they are healthy
    let lag = env
        .cloud
        .with_world(|w| w.settings.instance_listing_lag_seconds);
    env.cloud
        .step(TimeDelta::seconds(lag) + TimeDelta::minutes(1));
    let seen = env
        .workloads
        .describe_instances(REGION, &by_reservation)
        .await
        .unwrap();
    assert_eq!(ids(&seen), ids(&launched));
    assert!(
        seen.iter().all(|i| i.state == InstanceState::Running
            && i.health == InstanceHealth::Ok
            && i.instance_type == "p5.48xlarge"
            && i.launched_at.is_some()),
        "{seen:#?}"
    );
    // WHEN one is impaired
    let sick = launched[0].instance_id.clone();
    env.cloud
        .with_world(|w| w.impair_instance(&sick, true))
        .unwrap();
    let by_request = InstanceFilter {
        request_id: Some(RequestId::parse("inst-1").unwrap()),
        ..InstanceFilter::default()
    };
    let seen = env
        .workloads
        .describe_instances(REGION, &by_request)
        .await
        .unwrap();
    let health: BTreeMap<String, InstanceHealth> = seen
        .iter()
        .map(|i| (i.instance_id.clone(), i.health))
        .collect();
    assert_eq!(health[&sick], InstanceHealth::Impaired);
    assert_eq!(health[&launched[1].instance_id], InstanceHealth::Ok);
    // WHEN we terminate it, together with an id EC2 never knew, twice
    let doomed = vec![sick.clone(), "i-0000000000000000f".to_string()];
    env.workloads
        .terminate_instances(REGION, &doomed)
        .await
        .unwrap();
    env.workloads
        .terminate_instances(REGION, &doomed)
        .await
        .unwrap();
    let by_id = InstanceFilter {
        instance_ids: vec![sick.clone(), "i-0000000000000000f".to_string()],
        ..InstanceFilter::default()
    };
    let seen = env
        .workloads
        .describe_instances(REGION, &by_id)
        .await
        .unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].state, InstanceState::ShuttingDown);
    assert_eq!(seen[0].health, InstanceHealth::Unknown);
    // AND a replacement before the slot returns finds no capacity in the reservation
    let mut replacement = spec.clone();
    replacement.count = 1;
    replacement.client_token = capacity_pilot::domain::naming::client_token(&r.id, 0, 1);
    let err = env
        .workloads
        .launch_instances(&replacement)
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::NoCapacity { .. }), "{err:?}");
    assert_eq!(err.code(), Some("ReservationCapacityExceeded"));
}

#[tokio::test]
async fn on_demand_and_spot_launches_use_their_markets() {
    let env = env().await;
    let subnet = env.cloud.with_world(|w| w.subnets(REGION).remove(0).id);
    for (market, token) in [
        (LaunchMarket::OnDemand, "od-1"),
        (LaunchMarket::Spot, "spot-1"),
    ] {
        let spec = LaunchSpec {
            region: REGION.into(),
            market: market.clone(),
            instance_type: "m5.large".into(),
            count: 1,
            subnet_id: subnet.clone(),
            launch_template: LaunchTemplateRef {
                id: None,
                name: Some("capacity-pilot-cpu".into()),
                version: None,
            },
            client_token: token.into(),
            tags: BTreeMap::new(),
        };
        let out = env.workloads.launch_instances(&spec).await.unwrap();
        assert_eq!(out.len(), 1, "{market:?}");
        assert_eq!(out[0].reservation_id, None);
        let lifecycle = env
            .cloud
            .with_world(|w| format!("{:?}", w.ec2.instances[&out[0].instance_id].lifecycle));
        let want = if market == LaunchMarket::Spot {
            "Spot"
        } else {
            "OnDemand"
        };
        assert_eq!(lifecycle, want);
    }
}

#[tokio::test]
async fn training_plans_are_found_bought_once_by_name_reconciled_and_run_jobs() {
    let env = env().await;
    let product = Product::TrainingPlan {
        target: TargetResource::TrainingJob,
    };
    // GIVEN plan offerings for 48 hours
    let offers = env
        .market
        .search(&query(product, "ml.p5.48xlarge", 1, 48))
        .await
        .unwrap();
    assert!(!offers.is_empty());
    for o in &offers {
        assert_eq!(o.product, product);
        assert_eq!(o.instance_type, "ml.p5.48xlarge");
        assert_eq!(o.instance_count, 1);
        assert!(!o.segments.is_empty() && o.segments.len() <= 2);
        assert!(o.segments.windows(2).all(|w| w[0].end <= w[1].start));
        // 48 h, or a partial first day plus 48 h or 24 h (aws-reference §11.2): the
        // planner checks coverage
        assert!(o.covered_minutes() > 24 * 60, "{}", o.covered_minutes());
        assert!(o.upfront_fee.is_positive());
        assert!(o.segments.iter().all(|s| s.availability_zone.is_some()));
    }
    assert!(offers.iter().any(|o| o.covered_minutes() == 48 * 60));
    let spec = purchase_spec("plan-1");
    // WHEN we buy one
    let r = env.market.purchase(&offers[0], &spec).await.unwrap();
    assert!(
        r.id.ends_with(&format!(":training-plan/{}", spec.plan_name)),
        "{}",
        r.id
    );
    assert_eq!(r.segments, offers[0].segments);
    // AND a repeat under the same name (even for another offering) collides
    let again = offers.get(1).unwrap_or(&offers[0]);
    let err = env.market.purchase(again, &spec).await.unwrap_err();
    assert!(matches!(err, PortError::OutcomeUnknown { .. }), "{err:?}");
    // THEN, once SageMaker lists it (its listing lags), reconciliation finds the one plan,
    // with its fee and segments
    let lagging = env
        .market
        .find_by_request(product, REGION, &spec.request_id, &spec.plan_name)
        .await
        .unwrap();
    assert!(lagging.is_empty(), "{lagging:?}");
    env.cloud.step(TimeDelta::minutes(3));
    let found = env
        .market
        .find_by_request(product, REGION, &spec.request_id, &spec.plan_name)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, r.id);
    assert_eq!(found[0].upfront_fee, offers[0].upfront_fee);
    assert_eq!(found[0].state, ReservationState::PaymentPending);
    // (still Pending: no ReservedCapacitySummaries and a count of 0, the emulator's harsher
    // reading, REALISM "Plans"; the purchase's reconciliation fills them from the offering
    // by the plan's name)
    assert_eq!(
        (found[0].instance_type.as_str(), found[0].instance_count),
        ("", 0)
    );
    // AND once paid, its summaries give its type, count and segments
    env.cloud.step(TimeDelta::minutes(7));
    let found = env
        .market
        .find_by_request(product, REGION, &spec.request_id, &spec.plan_name)
        .await
        .unwrap();
    assert_eq!(found[0].segments.len(), offers[0].segments.len());
    assert_eq!(found[0].instance_count, 1);
    assert_eq!(found[0].instance_type, "ml.p5.48xlarge");
    // AND describe follows the plan's states
    let d = env
        .market
        .describe(product, REGION, &r.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.state, ReservationState::Scheduled);
    env.cloud.advance_to(offers[0].start());
    let d = env
        .market
        .describe(product, REGION, &r.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.state, ReservationState::Active);
    // WHEN a job runs in the plan
    let job = TrainingJobSpec {
        region: REGION.into(),
        job_name: "cp-plan-1-s0".into(),
        role_arn: "arn:aws:iam::123456789012:role/sm".into(),
        training_image: "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:1".into(),
        output_s3_uri: "s3://bucket/out".into(),
        instance_type: "ml.p5.48xlarge".into(),
        instance_count: 1,
        volume_size_gb: 100,
        training_plan_arn: Some(r.id.clone()),
        max_runtime_seconds: 86_400,
        hyper_parameters: BTreeMap::from([("epochs".to_string(), "3".to_string())]),
        tags: BTreeMap::new(),
    };
    env.workloads.start_training_job(&job).await.unwrap();
    env.workloads.start_training_job(&job).await.unwrap();
    let info = env
        .workloads
        .describe_training_job(REGION, &job.job_name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state, JobState::InProgress);
    assert!(!info.detail.is_empty());
    let plan_of_job = env.cloud.with_world(|w| {
        w.sm.jobs
            .values()
            .find(|j| j.name == job.job_name)
            .and_then(|j| j.plan_arn.clone())
    });
    assert_eq!(plan_of_job.as_deref(), Some(r.id.as_str()));
    // THEN stopping it twice is fine, and an unknown job is None
    env.workloads
        .stop_training_job(REGION, &job.job_name)
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(5));
    env.workloads
        .stop_training_job(REGION, &job.job_name)
        .await
        .unwrap();
    let info = env
        .workloads
        .describe_training_job(REGION, &job.job_name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state, JobState::Stopped);
    assert_eq!(
        env.workloads
            .describe_training_job(REGION, "no-such-job")
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn an_endpoint_runs_in_its_plan_and_deleting_it_twice_succeeds() {
    let env = env().await;
    let product = Product::TrainingPlan {
        target: TargetResource::Endpoint,
    };
    let offer = env
        .market
        .search(&query(product, "ml.p5.48xlarge", 1, 24))
        .await
        .unwrap()
        .remove(0);
    let plan = env
        .market
        .purchase(&offer, &purchase_spec("ep-1"))
        .await
        .unwrap();
    env.cloud.advance_to(offer.start());
    // the model the endpoint serves, created as its team would
    env.cloud
        .with_world(|w| {
            w.sagemaker_call(
                REGION,
                "CreateModel",
                &serde_json::json!({"ModelName": "model"}),
            )
        })
        .unwrap();
    let spec = EndpointSpec {
        region: REGION.into(),
        endpoint_name: "cp-ep-1-s0".into(),
        endpoint_config_name: "cp-ep-1-s0".into(),
        model_name: "model".into(),
        variant_name: "main".into(),
        instance_type: "ml.p5.48xlarge".into(),
        instance_count: 1,
        ml_reservation_arn: Some(plan.id.clone()),
        tags: BTreeMap::new(),
    };
    // The config just created is not visible yet (the emulator's 60 s, REALISM "Endpoints"):
    // no endpoint, and no error; created once it is, and a repeat is success.
    assert!(matches!(
        env.workloads.create_endpoint(&spec).await.unwrap(),
        capacity_pilot::ports::EndpointCreation::ConfigNotVisible(_)
    ));
    env.cloud.step(TimeDelta::seconds(60));
    assert_eq!(
        env.workloads.create_endpoint(&spec).await.unwrap(),
        capacity_pilot::ports::EndpointCreation::Created
    );
    assert_eq!(
        env.workloads.create_endpoint(&spec).await.unwrap(),
        capacity_pilot::ports::EndpointCreation::Created
    );
    let info = env
        .workloads
        .describe_endpoint(REGION, &spec.endpoint_name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.status, "Creating");
    let variant_plan = env.cloud.with_world(|w| {
        w.sm.endpoint_configs
            .values()
            .find(|c| c.name == spec.endpoint_config_name)
            .and_then(|c| c.variants[0].plan_arn.clone())
    });
    assert_eq!(variant_plan.as_deref(), Some(plan.id.as_str()));
    env.cloud.step(TimeDelta::minutes(6));
    let info = env
        .workloads
        .describe_endpoint(REGION, &spec.endpoint_name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.status, "InService");
    for _ in 0..2 {
        env.workloads
            .delete_endpoint(REGION, &spec.endpoint_name, &spec.endpoint_config_name)
            .await
            .unwrap();
    }
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(
        env.workloads
            .describe_endpoint(REGION, &spec.endpoint_name)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn an_eventbridge_partial_failure_is_reported_not_dropped() {
    // GIVEN a bus that refuses entries over 2 KB
    let env = env_with(Settings {
        event_max_bytes: 2048,
        ..Settings::default()
    })
    .await;
    let sink = EventBridgeSink::new(&env.sdk, "capacity-pilot").with_retry(EntryRetry {
        retries: 2,
        base_delay: std::time::Duration::from_millis(1),
        max_delay: std::time::Duration::from_millis(5),
    });
    let mut events: Vec<OutboundEvent> = (0..12)
        .map(|i| OutboundEvent {
            event_key: format!("req-1#reserved#{i}"),
            detail_type: "Capacity Reserved".into(),
            detail: serde_json::json!({"request_id": "req-1", "event_key": format!("req-1#reserved#{i}")}),
            notice: None,
        })
        .collect();
    events[4].detail["padding"] = serde_json::json!("x".repeat(4096));
    // WHEN we publish twelve events, one of them too big
    let report = sink.publish(&events).await.unwrap();
    // THEN eleven are sent and the big one is reported with the bus's reason
    assert_eq!(report.sent.len(), 11);
    assert_eq!(report.failed.len(), 1);
    let (key, code, message) = &report.failed[0];
    assert_eq!(key, "req-1#reserved#4");
    assert_eq!(code, "InvalidArgument");
    assert!(message.contains("size"), "{message}");
    // AND the bus holds exactly the eleven, with our source and detail
    let on_bus = env.cloud.events("capacity-pilot");
    assert_eq!(on_bus.len(), 11);
    assert!(on_bus.iter().all(|e| e["source"] == SOURCE
        && e["detail-type"] == "Capacity Reserved"
        && e["detail"]["request_id"] == "req-1"));
    let keys: Vec<&str> = on_bus
        .iter()
        .map(|e| e["detail"]["event_key"].as_str().unwrap())
        .collect();
    assert!(!keys.contains(&"req-1#reserved#4"));
}

#[tokio::test]
async fn the_http_clock_reads_the_emulators_simulated_time() {
    let env = env().await;
    let clock =
        ConfiguredClock::from_url(Some(&format!("{}/_local/clock", env.cloud.url()))).unwrap();
    assert_eq!(clock.now().await.unwrap(), t0());
    env.cloud.step(TimeDelta::hours(3));
    assert_eq!(clock.now().await.unwrap(), t0() + TimeDelta::hours(3));
}

#[tokio::test]
async fn a_preflight_dry_run_passes_as_dry_run_operation_and_answers_every_other_code() {
    let env = env().await;
    let subnet = env.cloud.with_world(|w| w.subnets(REGION).remove(0).id);
    let spec = |template: LaunchTemplateRef| LaunchSpec {
        region: REGION.into(),
        market: LaunchMarket::OnDemand,
        instance_type: "m5.large".into(),
        count: 1,
        subnet_id: subnet.clone(),
        launch_template: template,
        client_token: String::new(),
        tags: BTreeMap::from([("team".to_string(), "a".to_string())]),
    };
    let by_name = |name: &str| LaunchTemplateRef {
        id: None,
        name: Some(name.into()),
        version: None,
    };
    // A template that resolves: the reads pass, and the dry run's DryRunOperation is success
    let good = spec(by_name("capacity-pilot-cpu"));
    env.workloads
        .preflight_instances(&good, false)
        .await
        .unwrap();
    env.workloads
        .preflight_instances(&good, true)
        .await
        .unwrap();
    assert_eq!(
        env.cloud
            .with_world(|w| w.operations.get("RunInstances").copied()),
        Some(1),
        "one dry run"
    );
    assert!(
        env.cloud.with_world(|w| w.ec2.instances.is_empty()),
        "nothing launched"
    );
    // A template the region does not know: its code, with or without the dry run
    let missing = spec(by_name("nowhere"));
    for dry_run in [false, true] {
        let e = env
            .workloads
            .preflight_instances(&missing, dry_run)
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Some("InvalidLaunchTemplateName.NotFoundException"),
            "{e:?}"
        );
    }
    // EC2 refusing the caller: UnauthorizedOperation comes back as it is
    env.cloud.inject(local_cloud::world::Fault::error(
        "RunInstances",
        403,
        "UnauthorizedOperation",
        "You are not authorized to perform this operation.",
        Some(1),
    ));
    let e = env
        .workloads
        .preflight_instances(&good, true)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("UnauthorizedOperation"), "{e:?}");
}

#[tokio::test]
async fn a_model_exists_only_once_created_in_its_region() {
    let env = env().await;
    assert!(!env.workloads.model_exists(REGION, "llm").await.unwrap());
    env.cloud
        .with_world(|w| {
            w.sagemaker_call(
                REGION,
                "CreateModel",
                &serde_json::json!({"ModelName": "llm"}),
            )
        })
        .unwrap();
    assert!(env.workloads.model_exists(REGION, "llm").await.unwrap());
    assert!(
        !env.workloads
            .model_exists("us-west-2", "llm")
            .await
            .unwrap()
    );
}
