//! Instances: launches into a block, on-demand and spot; ClientToken idempotency; status checks,
//! termination and slot return; the state-change events; the seeded VPC and launch templates.

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    CapacityReservationSpecification, CapacityReservationTarget, Filter,
    InstanceMarketOptionsRequest, LaunchTemplateSpecification, MarketType, Tag,
};
use chrono::TimeDelta;
use local_cloud::Settings;

use crate::ec2_blocks::{buy, describe, offerings};
use crate::helpers::*;

pub(crate) fn template() -> LaunchTemplateSpecification {
    LaunchTemplateSpecification::builder()
        .launch_template_name("capacity-pilot-gpu")
        .version("$Default")
        .build()
}

pub(crate) async fn subnet_in(env: &Env, az: &str) -> String {
    env.ec2
        .describe_subnets()
        .filters(
            Filter::builder()
                .name("availability-zone")
                .values(az)
                .build(),
        )
        .send()
        .await
        .unwrap()
        .subnets()[0]
        .subnet_id()
        .unwrap()
        .to_string()
}

pub(crate) fn into_block(
    cr: &str,
) -> (
    InstanceMarketOptionsRequest,
    CapacityReservationSpecification,
) {
    (
        InstanceMarketOptionsRequest::builder()
            .market_type(MarketType::CapacityBlock)
            .build(),
        CapacityReservationSpecification::builder()
            .capacity_reservation_target(
                CapacityReservationTarget::builder()
                    .capacity_reservation_id(cr)
                    .build(),
            )
            .build(),
    )
}

#[tokio::test]
async fn the_seeded_vpc_has_a_subnet_in_every_zone() {
    let env = env().await;
    let out = env.ec2.describe_subnets().send().await.unwrap();
    let zones: Vec<&str> = out
        .subnets()
        .iter()
        .map(|s| s.availability_zone().unwrap())
        .collect();
    assert_eq!(
        zones,
        ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"]
    );
    let vpc = out.subnets()[0].vpc_id().unwrap();
    assert!(out.subnets().iter().all(|s| s.vpc_id() == Some(vpc)));
    assert!(
        out.subnets()
            .iter()
            .all(|s| s.subnet_id().unwrap().starts_with("subnet-"))
    );
    let err = env
        .ec2
        .describe_subnets()
        .subnet_ids("subnet-00000000000000000")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidSubnetID.NotFound"));
}

#[tokio::test]
async fn instances_launch_into_an_active_block_and_are_terminated_before_its_end() {
    let env = env().await;
    let offer = offerings(&env, "p5.48xlarge", 2, 24).await.remove(0);
    let cr = buy(&env, &offer, "launch").await;
    let cr_id = cr.capacity_reservation_id().unwrap().to_string();
    let az = offer.availability_zone().unwrap().to_string();
    let subnet = subnet_in(&env, &az).await;
    let (market, target) = into_block(&cr_id);
    let launch = |count: i32, token: &str| {
        env.ec2
            .run_instances()
            .min_count(count)
            .max_count(count)
            .instance_type("p5.48xlarge".into())
            .launch_template(template())
            .subnet_id(&subnet)
            .instance_market_options(market.clone())
            .capacity_reservation_specification(target.clone())
            .client_token(token)
            .send()
    };
    env.cloud.step(TimeDelta::minutes(5));
    let err = launch(1, "early").await.unwrap_err();
    assert_eq!(
        err.code(),
        Some("InvalidCapacityReservationState.PendingActivation")
    );

    let start = chrono_of(offer.start_date().unwrap());
    let end = chrono_of(offer.end_date().unwrap());
    // Activation lags the start (aws-reference §11.1; ARCHITECTURE §8.10: 5 min): at the
    // start the block is still not active, and no Delivered event has come.
    env.cloud.advance_to(start);
    let err = launch(1, "at-start").await.unwrap_err();
    assert_eq!(
        err.code(),
        Some("InvalidCapacityReservationState.PendingActivation")
    );
    let delivered = |env: &Env| {
        env.cloud
            .events("default")
            .into_iter()
            .filter(|e| e["detail-type"] == "Capacity Block Delivered")
            .count()
    };
    assert_eq!(delivered(&env), 0);
    env.cloud.advance_to(start + TimeDelta::minutes(5));
    assert_eq!(delivered(&env), 1, "Delivered comes with the activation");
    let out = launch(2, "slot-a").await.unwrap();
    assert!(out.reservation_id().unwrap().starts_with("r-"));
    let ids: Vec<String> = out
        .instances()
        .iter()
        .map(|i| i.instance_id().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2);
    let i = &out.instances()[0];
    assert_eq!(i.state().unwrap().name().unwrap().as_str(), "pending");
    assert_eq!(i.instance_lifecycle().unwrap().as_str(), "capacity-block");
    assert_eq!(i.capacity_reservation_id(), Some(cr_id.as_str()));
    assert_eq!(
        i.placement().unwrap().availability_zone(),
        Some(az.as_str())
    );
    assert!(
        i.image_id().unwrap().starts_with("ami-"),
        "the template supplies the AMI"
    );
    assert_eq!(
        describe(&env, &cr_id).await.available_instance_count(),
        Some(0)
    );

    let err = launch(1, "slot-c").await.unwrap_err();
    assert_eq!(err.code(), Some("ReservationCapacityExceeded"));

    // running after 30 s; listed by DescribeInstances after the listing lag (2 min)
    env.cloud.step(TimeDelta::minutes(2));
    let running = env
        .ec2
        .describe_instances()
        .filters(
            Filter::builder()
                .name("instance-state-name")
                .values("running")
                .build(),
        )
        .filters(
            Filter::builder()
                .name("capacity-reservation-id")
                .values(&cr_id)
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(running.reservations()[0].instances().len(), 2);

    // each instance is warned with the block, 10 minutes before termination starts
    env.cloud.advance_to(end - TimeDelta::minutes(40));
    let notices = events_of(
        &env.cloud,
        "EC2 Capacity Reservation Instance Interruption Warning",
    );
    assert_eq!(notices.len(), 2);
    assert_eq!(notices[0]["detail"]["instance-action"], "terminate");
    assert_eq!(notices[0]["detail"]["instance-lifecycle"], "capacity-block");
    assert_eq!(
        notices[0]["detail"]["instance-termination-time"],
        (end - TimeDelta::minutes(30))
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    );

    // forced termination at end - 30 min
    env.cloud.advance_to(end - TimeDelta::minutes(31));
    let st = env
        .ec2
        .describe_instances()
        .instance_ids(&ids[0])
        .send()
        .await
        .unwrap();
    assert_eq!(
        st.reservations()[0].instances()[0]
            .state()
            .unwrap()
            .name()
            .unwrap()
            .as_str(),
        "running"
    );
    env.cloud.advance_to(end - TimeDelta::minutes(30));
    let st = env
        .ec2
        .describe_instances()
        .instance_ids(&ids[0])
        .send()
        .await
        .unwrap();
    let inst = &st.reservations()[0].instances()[0];
    assert_eq!(
        inst.state().unwrap().name().unwrap().as_str(),
        "shutting-down"
    );
    assert!(inst.state_reason().unwrap().code().is_some());
    let changes = events_of(&env.cloud, "EC2 Instance State-change Notification");
    let states: Vec<&str> = changes
        .iter()
        .filter(|e| e["detail"]["instance-id"] == ids[0].as_str())
        .map(|e| e["detail"]["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["pending", "running", "shutting-down"]);
    let last = changes.last().unwrap();
    assert_eq!(
        last["time"],
        (end - TimeDelta::minutes(30))
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    );
}

#[tokio::test]
async fn a_pending_block_is_not_active_yet_for_run_instances() {
    let env = env().await;
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let cr = buy(&env, &offer, "too-soon").await;
    assert_eq!(cr.state().unwrap().as_str(), "pending");
    let subnet = subnet_in(&env, offer.availability_zone().unwrap()).await;
    let (market, target) = into_block(cr.capacity_reservation_id().unwrap());
    let err = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("p5.48xlarge".into())
        .launch_template(template())
        .subnet_id(&subnet)
        .instance_market_options(market)
        .capacity_reservation_specification(target)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some("InvalidCapacityReservationState.PendingActivation")
    );
}

#[tokio::test]
async fn a_terminated_instance_returns_its_slot_after_ten_minutes() {
    let env = env().await;
    let offer = offerings(&env, "p5.48xlarge", 1, 48).await.remove(0);
    let cr = buy(&env, &offer, "slots").await;
    let cr_id = cr.capacity_reservation_id().unwrap().to_string();
    let subnet = subnet_in(&env, offer.availability_zone().unwrap()).await;
    env.cloud
        .advance_to(chrono_of(offer.start_date().unwrap()) + TimeDelta::minutes(5));
    let (market, target) = into_block(&cr_id);
    let launch = |token: &str| {
        env.ec2
            .run_instances()
            .min_count(1)
            .max_count(1)
            .instance_type("p5.48xlarge".into())
            .image_id("ami-0abcdef1234567890")
            .subnet_id(&subnet)
            .instance_market_options(market.clone())
            .capacity_reservation_specification(target.clone())
            .client_token(token)
            .send()
    };
    let first = launch("gen-0").await.unwrap();
    let id = first.instances()[0].instance_id().unwrap().to_string();
    env.cloud.step(TimeDelta::minutes(1));
    let term = env
        .ec2
        .terminate_instances()
        .instance_ids(&id)
        .send()
        .await
        .unwrap();
    let change = &term.terminating_instances()[0];
    assert_eq!(change.instance_id(), Some(id.as_str()));
    assert_eq!(
        change.previous_state().unwrap().name().unwrap().as_str(),
        "running"
    );
    assert_eq!(
        change.current_state().unwrap().name().unwrap().as_str(),
        "shutting-down"
    );
    assert_eq!(change.current_state().unwrap().code(), Some(32));
    // terminating twice succeeds
    env.ec2
        .terminate_instances()
        .instance_ids(&id)
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(1));
    assert_eq!(
        launch("gen-1").await.unwrap_err().code(),
        Some("ReservationCapacityExceeded")
    );
    env.cloud.step(TimeDelta::minutes(9));
    assert_eq!(
        launch("gen-1").await.unwrap_err().code(),
        Some("ReservationCapacityExceeded")
    );
    env.cloud.step(TimeDelta::minutes(1));
    let replacement = launch("gen-1").await.unwrap();
    assert_ne!(replacement.instances()[0].instance_id(), Some(id.as_str()));
}

#[tokio::test]
async fn a_client_token_returns_the_same_instances_even_after_termination() {
    let env = env().await;
    let run = |ty: &str, token: &str| {
        env.ec2
            .run_instances()
            .min_count(1)
            .max_count(1)
            .instance_type(ty.into())
            .image_id("ami-0abcdef1234567890")
            .client_token(token)
            .send()
    };
    let a = run("m5.large", "tok-1").await.unwrap();
    let b = run("m5.large", "tok-1").await.unwrap();
    let id = a.instances()[0].instance_id().unwrap();
    assert_eq!(b.instances()[0].instance_id(), Some(id));
    assert_eq!(a.reservation_id(), b.reservation_id());
    assert_eq!(a.instances()[0].client_token(), Some("tok-1"));
    env.ec2
        .terminate_instances()
        .instance_ids(id)
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(5));
    let c = run("m5.large", "tok-1").await.unwrap();
    assert_eq!(c.instances()[0].instance_id(), Some(id));
    assert_eq!(
        c.instances()[0].state().unwrap().name().unwrap().as_str(),
        "terminated"
    );
    let err = run("c5.xlarge", "tok-1").await.unwrap_err();
    assert_eq!(err.code(), Some("IdempotentParameterMismatch"));
}

#[tokio::test]
async fn on_demand_capacity_is_finite() {
    let env = env().await;
    let err = env
        .ec2
        .run_instances()
        .min_count(64)
        .max_count(64)
        .instance_type("p5.48xlarge".into())
        .launch_template(template())
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InsufficientInstanceCapacity"));
    let missing = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("m5.large".into())
        .send()
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Some("MissingParameter"));
    let block_without_target = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .image_id("ami-1")
        .instance_type("p5.48xlarge".into())
        .instance_market_options(
            InstanceMarketOptionsRequest::builder()
                .market_type(MarketType::CapacityBlock)
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(block_without_target.code(), Some("MissingParameter"));
}

#[tokio::test]
async fn describe_instances_filters_by_tag_and_paginates() {
    let env = env().await;
    let mut ids = Vec::new();
    for n in 0..7 {
        let out = env
            .ec2
            .run_instances()
            .min_count(1)
            .max_count(1)
            .instance_type("m5.large".into())
            .launch_template(
                LaunchTemplateSpecification::builder()
                    .launch_template_name("capacity-pilot-cpu")
                    .build(),
            )
            .send()
            .await
            .unwrap();
        let id = out.instances()[0].instance_id().unwrap().to_string();
        if n % 2 == 0 {
            env.ec2
                .create_tags()
                .resources(&id)
                .tags(
                    Tag::builder()
                        .key("capacity-pilot:managed")
                        .value("true")
                        .build(),
                )
                .send()
                .await
                .unwrap();
        }
        ids.push(id);
    }
    // new instances are listed once the listing lag (2 min) has passed
    env.cloud.step(TimeDelta::minutes(2));
    let tagged = env
        .ec2
        .describe_instances()
        .filters(
            Filter::builder()
                .name("tag:capacity-pilot:managed")
                .values("true")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let n: usize = tagged
        .reservations()
        .iter()
        .map(|r| r.instances().len())
        .sum();
    assert_eq!(n, 4);
    assert_eq!(
        tagged.reservations()[0].instances()[0].tags()[0].key(),
        Some("capacity-pilot:managed")
    );

    let mut seen = Vec::new();
    let mut token = None;
    loop {
        let page = env
            .ec2
            .describe_instances()
            .max_results(5)
            .set_next_token(token)
            .send()
            .await
            .unwrap();
        for r in page.reservations() {
            seen.extend(
                r.instances()
                    .iter()
                    .map(|i| i.instance_id().unwrap().to_string()),
            );
        }
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    seen.sort();
    let mut all = ids.clone();
    all.sort();
    assert_eq!(seen, all);

    let err = env
        .ec2
        .describe_instances()
        .instance_ids("i-0123456789abcdef0")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidInstanceID.NotFound"));
    let err = env
        .ec2
        .create_tags()
        .resources("i-0123456789abcdef0")
        .tags(Tag::builder().key("k").value("v").build())
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidInstanceID.NotFound"));
}

#[tokio::test]
async fn status_checks_show_impairment_and_scheduled_retirement() {
    // pending instances are asserted right after the launch: no listing lag
    let env = env_with_settings(Settings {
        instance_listing_lag_seconds: 0,
        ..Settings::default()
    })
    .await;
    let out = env
        .ec2
        .run_instances()
        .min_count(2)
        .max_count(2)
        .instance_type("m5.large".into())
        .image_id("ami-1")
        .send()
        .await
        .unwrap();
    let a = out.instances()[0].instance_id().unwrap().to_string();
    let b = out.instances()[1].instance_id().unwrap().to_string();
    // pending instances are listed only with IncludeAllInstances
    let running = env.ec2.describe_instance_status().send().await.unwrap();
    assert!(running.instance_statuses().is_empty());
    let all = env
        .ec2
        .describe_instance_status()
        .include_all_instances(true)
        .send()
        .await
        .unwrap();
    assert_eq!(all.instance_statuses().len(), 2);
    assert_eq!(
        all.instance_statuses()[0]
            .instance_status()
            .unwrap()
            .status()
            .unwrap()
            .as_str(),
        "not-applicable"
    );
    env.cloud.step(TimeDelta::minutes(1));
    let (code, _) = http(
        &env.cloud.url(),
        "POST",
        &format!("/_local/instances/{a}/impair"),
        None,
    )
    .await;
    assert_eq!(code, 204);
    let (code, _) = http(
        &env.cloud.url(),
        "POST",
        &format!("/_local/instances/{b}/health-event"),
        Some(r#"{"code":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED"}"#),
    )
    .await;
    assert_eq!(code, 204);
    let st = env
        .ec2
        .describe_instance_status()
        .instance_ids(&a)
        .instance_ids(&b)
        .send()
        .await
        .unwrap();
    let by_id = |id: &str| {
        st.instance_statuses()
            .iter()
            .find(|s| s.instance_id() == Some(id))
            .unwrap()
            .clone()
    };
    let sa = by_id(&a);
    assert_eq!(
        sa.instance_status().unwrap().status().unwrap().as_str(),
        "impaired"
    );
    assert_eq!(
        sa.system_status().unwrap().status().unwrap().as_str(),
        "impaired"
    );
    assert_eq!(
        sa.instance_state().unwrap().name().unwrap().as_str(),
        "running"
    );
    let sb = by_id(&b);
    assert_eq!(
        sb.instance_status().unwrap().status().unwrap().as_str(),
        "ok"
    );
    assert_eq!(
        sb.events()[0].code().unwrap().as_str(),
        "instance-retirement"
    );
    assert!(sb.events()[0].not_before().is_some());
    let impaired_only = env
        .ec2
        .describe_instance_status()
        .filters(
            Filter::builder()
                .name("instance-status.status")
                .values("impaired")
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(impaired_only.instance_statuses().len(), 1);
    let health = events_of(&env.cloud, "AWS Health Event");
    assert_eq!(health.len(), 1);
    assert_eq!(health[0]["source"], "aws.health");
    assert_eq!(health[0]["resources"][0], b.as_str());
    assert_eq!(
        health[0]["detail"]["eventTypeCode"],
        "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED"
    );
    assert_eq!(health[0]["detail"]["service"], "EC2");
}

#[tokio::test]
async fn unexpected_termination_and_spot_interruption_are_injectable() {
    let env = env().await;
    let od = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("m5.large".into())
        .image_id("ami-1")
        .send()
        .await
        .unwrap();
    let spot = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("m5.large".into())
        .image_id("ami-1")
        .instance_market_options(
            InstanceMarketOptionsRequest::builder()
                .market_type(MarketType::Spot)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let od_id = od.instances()[0].instance_id().unwrap().to_string();
    let spot_id = spot.instances()[0].instance_id().unwrap().to_string();
    assert_eq!(
        spot.instances()[0].instance_lifecycle().unwrap().as_str(),
        "spot"
    );
    env.cloud.step(TimeDelta::minutes(1));
    let url = env.cloud.url();
    assert_eq!(
        http(
            &url,
            "POST",
            &format!("/_local/instances/{od_id}/fail"),
            None
        )
        .await
        .0,
        204
    );
    assert_eq!(
        http(
            &url,
            "POST",
            &format!("/_local/instances/{spot_id}/spot-interruption"),
            None
        )
        .await
        .0,
        204
    );
    assert_eq!(
        http(
            &url,
            "POST",
            &format!("/_local/instances/{od_id}/spot-interruption"),
            None
        )
        .await
        .0,
        400
    );
    assert_eq!(
        events_of(&env.cloud, "EC2 Spot Instance Interruption Warning").len(),
        1
    );
    env.cloud.step(TimeDelta::minutes(2));
    let out = env
        .ec2
        .describe_instances()
        .filters(
            Filter::builder()
                .name("instance-state-name")
                .values("shutting-down")
                .values("terminated")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let n: usize = out.reservations().iter().map(|r| r.instances().len()).sum();
    assert_eq!(n, 2);
}

#[tokio::test]
async fn dry_runs_and_parameter_combinations_get_ec2_codes() {
    let env = env().await;
    let err = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("m5.large".into())
        .image_id("ami-1")
        .dry_run(true)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("DryRunOperation"));
    let none = env.ec2.describe_instances().send().await.unwrap();
    assert!(none.reservations().is_empty(), "a dry run launches nothing");
    let out = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("m5.large".into())
        .image_id("ami-1")
        .send()
        .await
        .unwrap();
    let id = out.instances()[0].instance_id().unwrap();
    assert_eq!(out.instances()[0].state_transition_reason(), None);
    let err = env
        .ec2
        .describe_instances()
        .instance_ids(id)
        .max_results(5)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterCombination"));
    let err = env
        .ec2
        .describe_instances()
        .instance_ids("i-xyz")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidInstanceID.Malformed"));
    let err = env
        .ec2
        .describe_instances()
        .max_results(5)
        .next_token("garbage")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidPaginationToken"));
}

#[tokio::test]
async fn a_new_instance_is_missing_from_describe_until_the_listing_lag_has_passed() {
    let env = env().await;
    let run = || {
        env.ec2
            .run_instances()
            .min_count(1)
            .max_count(1)
            .instance_type("m5.large".into())
            .image_id("ami-1")
            .client_token("lagged")
            .send()
    };
    let out = run().await.unwrap();
    let id = out.instances()[0].instance_id().unwrap().to_string();
    assert_eq!(
        out.instances()[0].state().unwrap().name().unwrap().as_str(),
        "pending",
        "RunInstances' own answer shows it"
    );
    // tagging works at once; a replay by client token answers the same instance
    env.ec2
        .create_tags()
        .resources(&id)
        .tags(Tag::builder().key("team").value("a").build())
        .send()
        .await
        .unwrap();
    assert_eq!(
        run().await.unwrap().instances()[0].instance_id(),
        Some(id.as_str())
    );
    let listed = |env: &Env| {
        let ec2 = env.ec2.clone();
        async move {
            let all = ec2.describe_instances().send().await.unwrap();
            let tagged = ec2
                .describe_instances()
                .filters(Filter::builder().name("tag:team").values("a").build())
                .send()
                .await
                .unwrap();
            let status = ec2
                .describe_instance_status()
                .include_all_instances(true)
                .send()
                .await
                .unwrap();
            (
                all.reservations().len(),
                tagged.reservations().len(),
                status.instance_statuses().len(),
            )
        }
    };
    for step in [TimeDelta::zero(), TimeDelta::seconds(119)] {
        env.cloud.step(step);
        assert_eq!(listed(&env).await, (0, 0, 0));
        let err = env
            .ec2
            .describe_instances()
            .instance_ids(&id)
            .send()
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("InvalidInstanceID.NotFound"));
        assert_eq!(
            err.message(),
            Some(format!("The instance ID '{id}' does not exist").as_str())
        );
        let err = env
            .ec2
            .describe_instance_status()
            .instance_ids(&id)
            .include_all_instances(true)
            .send()
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("InvalidInstanceID.NotFound"));
    }
    env.cloud.step(TimeDelta::seconds(1));
    assert_eq!(listed(&env).await, (1, 1, 1));
    let d = env
        .ec2
        .describe_instances()
        .instance_ids(&id)
        .send()
        .await
        .unwrap();
    assert_eq!(
        d.reservations()[0].instances()[0]
            .state()
            .unwrap()
            .name()
            .unwrap()
            .as_str(),
        "running"
    );

    // TerminateInstances sees a new instance at once
    let fresh = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("m5.large".into())
        .image_id("ami-1")
        .send()
        .await
        .unwrap();
    let fresh_id = fresh.instances()[0].instance_id().unwrap();
    let term = env
        .ec2
        .terminate_instances()
        .instance_ids(fresh_id)
        .send()
        .await
        .unwrap();
    assert_eq!(
        term.terminating_instances()[0]
            .current_state()
            .unwrap()
            .name()
            .unwrap()
            .as_str(),
        "shutting-down"
    );
}

#[tokio::test]
async fn without_listing_lag_a_new_instance_is_described_at_once() {
    let env = env_with_settings(Settings {
        instance_listing_lag_seconds: 0,
        ..Settings::default()
    })
    .await;
    let out = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("m5.large".into())
        .image_id("ami-1")
        .send()
        .await
        .unwrap();
    let id = out.instances()[0].instance_id().unwrap();
    let d = env
        .ec2
        .describe_instances()
        .instance_ids(id)
        .send()
        .await
        .unwrap();
    assert_eq!(d.reservations()[0].instances()[0].instance_id(), Some(id));
}

#[tokio::test]
async fn run_instances_answers_after_its_latency_without_blocking_other_calls() {
    use std::time::{Duration, Instant};
    let env = env_with_settings(Settings {
        run_instances_latency_ms: 300,
        ..Settings::default()
    })
    .await;
    let run = || {
        env.ec2
            .run_instances()
            .min_count(1)
            .max_count(1)
            .instance_type("m5.large".into())
            .image_id("ami-1")
            .send()
    };
    let t = Instant::now();
    run().await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );

    // a DescribeInstances sent while a RunInstances waits answers first
    env.cloud
        .with_world(|w| w.settings.run_instances_latency_ms = 1000);
    let launch = async {
        run().await.unwrap();
        Instant::now()
    };
    let describe = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        env.ec2.describe_instances().send().await.unwrap();
        Instant::now()
    };
    let (launched, described) = tokio::join!(launch, describe);
    assert!(
        described < launched,
        "DescribeInstances waited for RunInstances"
    );
}

/// A RunInstances dry run checks the request before its `DryRun`: a template or subnet the
/// region does not know answers its code, not `DryRunOperation`, and so does a zone without
/// on-demand capacity (the harsher reading: AWS documents only the permission check).
/// Nothing is launched by any of them (REALISM.md, EC2 instances: the dry run's order).
#[tokio::test]
async fn a_dry_run_answers_the_template_subnet_and_quota_codes_before_dry_run_operation() {
    // The account's vCPU quota for the type is 0 in us-east-1b
    let env = env_with_settings(Settings {
        refusals: vec![local_cloud::Refusal {
            code: local_cloud::RefusalCode::VcpuLimitExceeded,
            region: "us-east-1".into(),
            zone: Some("us-east-1b".into()),
            instance_type: Some("p5.48xlarge".into()),
            market: local_cloud::RefusalMarket::OnDemand,
        }],
        ..Settings::default()
    })
    .await;
    let subnet = subnet_in(&env, "us-east-1a").await;
    let dry = |template: LaunchTemplateSpecification, subnet: String, ty: &'static str| {
        env.ec2
            .run_instances()
            .min_count(1)
            .max_count(1)
            .instance_type(ty.into())
            .launch_template(template)
            .subnet_id(subnet)
            .dry_run(true)
            .send()
    };
    let passed = dry(template(), subnet.clone(), "p5.48xlarge")
        .await
        .unwrap_err();
    assert_eq!(passed.code(), Some("DryRunOperation"));

    // A template id of another region
    let west = env_in(
        local_cloud::Options {
            seed: 42,
            start: Some(t0()),
            ..local_cloud::Options::default()
        },
        "us-west-2",
    )
    .await;
    let west_template = west
        .ec2
        .describe_launch_template_versions()
        .launch_template_name("capacity-pilot-gpu")
        .versions("$Default")
        .send()
        .await
        .unwrap()
        .launch_template_versions()[0]
        .launch_template_id()
        .unwrap()
        .to_string();
    let by_id = LaunchTemplateSpecification::builder()
        .launch_template_id(&west_template)
        .version("$Default")
        .build();
    let other_region = dry(by_id, subnet.clone(), "p5.48xlarge").await.unwrap_err();
    assert_eq!(
        other_region.code(),
        Some("InvalidLaunchTemplateId.NotFound")
    );
    // A subnet of another region
    let west_subnet = west.ec2.describe_subnets().send().await.unwrap().subnets()[0]
        .subnet_id()
        .unwrap()
        .to_string();
    let no_subnet = dry(template(), west_subnet, "p5.48xlarge")
        .await
        .unwrap_err();
    assert_eq!(no_subnet.code(), Some("InvalidSubnetID.NotFound"));
    // A quota of 0 for the type: the quota's code, before DryRun
    let quota_subnet = subnet_in(&env, "us-east-1b").await;
    let no_quota = dry(template(), quota_subnet, "p5.48xlarge")
        .await
        .unwrap_err();
    assert_eq!(no_quota.code(), Some("VcpuLimitExceeded"));

    let none = env.ec2.describe_instances().send().await.unwrap();
    assert!(none.reservations().is_empty(), "a dry run launches nothing");
}
