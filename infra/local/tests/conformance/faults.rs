//! Injected faults reach the SDK as AWS's would: throttling and 500s are retried by the standard
//! retry mode, and a lost purchase response shows the double purchase it causes.

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::CapacityReservationInstancePlatform;
use local_cloud::{Fault, FaultKind};

use crate::ec2_blocks::offerings;
use crate::helpers::*;

fn fault(op: &str, kind: FaultKind, count: u32) -> Fault {
    Fault {
        operation: op.to_string(),
        kind,
        count: Some(count),
    }
}

#[tokio::test]
async fn throttling_reaches_the_caller_as_request_limit_exceeded() {
    let env = env().await;
    env.cloud
        .inject(fault("DescribeSubnets", FaultKind::Throttle, 1));
    let err = env.ec2.describe_subnets().send().await.unwrap_err();
    assert_eq!(err.code(), Some("RequestLimitExceeded"));
    assert_eq!(err.raw_response().unwrap().status().as_u16(), 503);
    assert!(
        env.ec2.describe_subnets().send().await.is_ok(),
        "the fault was used up"
    );

    env.cloud
        .inject(fault("DescribeTrainingPlan", FaultKind::Throttle, 1));
    let err = env
        .sm
        .describe_training_plan()
        .training_plan_name("x")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ThrottlingException"));
}

#[tokio::test]
async fn the_standard_retry_mode_recovers_from_one_throttle_and_one_internal_error() {
    let env = env().await;
    let conf = sdk_config(&env.cloud.url(), "us-east-1", true).await;
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    env.cloud
        .inject(fault("DescribeSubnets", FaultKind::Throttle, 1));
    env.cloud
        .inject(fault("DescribeInstances", FaultKind::InternalError, 1));
    assert!(ec2.describe_subnets().send().await.is_ok());
    assert!(ec2.describe_instances().send().await.is_ok());
}

#[tokio::test]
async fn a_lost_purchase_response_retried_by_the_sdk_buys_twice() {
    let env = env().await;
    // about the retry, not the listing lag: list new reservations at once
    env.cloud.with_world(|w| w.settings.listing_lag_seconds = 0);
    let conf = sdk_config(&env.cloud.url(), "us-east-1", true).await;
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    env.cloud
        .inject(fault("PurchaseCapacityBlock", FaultKind::LostResponse, 1));
    let out = ec2
        .purchase_capacity_block()
        .capacity_block_offering_id(offer.capacity_block_offering_id().unwrap())
        .instance_platform(CapacityReservationInstancePlatform::LinuxUnix)
        .send()
        .await
        .unwrap();
    assert!(out.capacity_reservation().is_some());
    let all = env
        .ec2
        .describe_capacity_reservations()
        .send()
        .await
        .unwrap();
    assert_eq!(
        all.capacity_reservations().len(),
        2,
        "the retry bought a second block"
    );

    // without SDK retries the caller sees the 500, yet the purchase happened
    env.cloud
        .inject(fault("PurchaseCapacityBlock", FaultKind::LostResponse, 1));
    let err = env
        .ec2
        .purchase_capacity_block()
        .capacity_block_offering_id(offer.capacity_block_offering_id().unwrap())
        .instance_platform(CapacityReservationInstancePlatform::LinuxUnix)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InternalError"));
    let all = env
        .ec2
        .describe_capacity_reservations()
        .send()
        .await
        .unwrap();
    assert_eq!(all.capacity_reservations().len(), 3);
}

#[tokio::test]
async fn latency_and_custom_errors_can_be_injected() {
    let env = env().await;
    env.cloud.inject(fault(
        "DescribeSubnets",
        FaultKind::Latency { millis: 5 },
        1,
    ));
    assert!(env.ec2.describe_subnets().send().await.is_ok());
    env.cloud.inject(fault(
        "DescribeCapacityBlockOfferings",
        FaultKind::Error {
            status: 400,
            code: "CapacityBlockDescribeLimitExceeded".into(),
            message: "Too many searches".into(),
        },
        1,
    ));
    let err = env
        .ec2
        .describe_capacity_block_offerings()
        .instance_type("p5.48xlarge")
        .instance_count(1)
        .capacity_duration_hours(24)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("CapacityBlockDescribeLimitExceeded"));
    env.cloud
        .inject(fault("PutEvents", FaultKind::InternalError, 1));
    let err = env
        .eb
        .put_events()
        .entries(
            aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                .source("s")
                .detail_type("d")
                .detail("{}")
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert!(err.as_service_error().unwrap().is_internal_exception());
}

#[tokio::test]
async fn a_scheduled_retirement_is_listed_from_its_start_and_carried_out_then() {
    let env = env_with_settings(local_cloud::Settings {
        instance_listing_lag_seconds: 0,
        ..local_cloud::Settings::default()
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
    let id = out.instances()[0].instance_id().unwrap().to_string();
    env.cloud.step(chrono::TimeDelta::minutes(1));
    // GIVEN a retirement scheduled 90 minutes out
    let (code, _) = http(
        &env.cloud.url(),
        "POST",
        &format!("/_local/instances/{id}/health-event"),
        Some(r#"{"code":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","start_in_minutes":90}"#),
    )
    .await;
    assert_eq!(code, 204);
    let status = |env: &Env| {
        let (ec2, id) = (env.ec2.clone(), id.clone());
        async move {
            ec2.describe_instance_status()
                .include_all_instances(true)
                .instance_ids(id)
                .send()
                .await
                .unwrap()
                .instance_statuses()[0]
                .clone()
        }
    };
    // THEN DescribeInstanceStatus lists it from its start, and the instance runs meanwhile
    let s = status(&env).await;
    let e = &s.events()[0];
    assert_eq!(e.code().unwrap().as_str(), "instance-retirement");
    let from = e.not_before().unwrap().secs();
    assert_eq!(
        from,
        (env.cloud.now() + chrono::TimeDelta::minutes(90)).timestamp()
    );
    env.cloud.step(chrono::TimeDelta::minutes(89));
    assert_eq!(
        status(&env)
            .await
            .instance_state()
            .unwrap()
            .name()
            .unwrap()
            .as_str(),
        "running"
    );
    // AND at its start the instance is retired, the event shown completed
    env.cloud.step(chrono::TimeDelta::minutes(2));
    let s = status(&env).await;
    assert_ne!(
        s.instance_state().unwrap().name().unwrap().as_str(),
        "running"
    );
    assert!(
        s.events()[0]
            .description()
            .unwrap()
            .starts_with("[Completed]"),
        "{:?}",
        s.events()
    );
}
