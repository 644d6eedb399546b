//! On-demand, spot and SageMaker refusals other than ICE (aws-reference §11.2, §11.3), set by
//! `Settings::refusals`: the code and AWS's message reach the SDK.

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::operation::run_instances::builders::RunInstancesFluentBuilder;
use aws_sdk_ec2::types::{
    CapacityReservationSpecification, CapacityReservationTarget, InstanceMarketOptionsRequest,
    MarketType, Placement,
};
use aws_sdk_sagemaker::types::SageMakerResourceName;
use local_cloud::{Refusal, RefusalCode, RefusalMarket, Settings};

use crate::ec2_blocks::{buy, offerings};
use crate::helpers::*;
use crate::sagemaker_plans::{buy_plan, job, plan_offerings};

fn refusal(
    code: RefusalCode,
    market: RefusalMarket,
    zone: Option<&str>,
    ty: Option<&str>,
) -> Refusal {
    Refusal {
        code,
        region: "us-east-1".to_string(),
        zone: zone.map(str::to_string),
        instance_type: ty.map(str::to_string),
        market,
    }
}

async fn refusing(refusals: Vec<Refusal>) -> Env {
    env_with_settings(Settings {
        refusals,
        ..Settings::default()
    })
    .await
}

fn launch(env: &Env, ty: &str) -> RunInstancesFluentBuilder {
    env.ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type(ty.into())
        .image_id("ami-1")
}

fn spot() -> InstanceMarketOptionsRequest {
    InstanceMarketOptionsRequest::builder()
        .market_type(MarketType::Spot)
        .build()
}

#[tokio::test]
async fn a_vcpu_limit_refuses_on_demand_launches_of_the_type_in_the_region() {
    let env = refusing(vec![refusal(
        RefusalCode::VcpuLimitExceeded,
        RefusalMarket::OnDemand,
        None,
        Some("p5.48xlarge"),
    )])
    .await;
    let err = launch(&env, "p5.48xlarge").send().await.unwrap_err();
    assert_eq!(err.code(), Some("VcpuLimitExceeded"));
    assert_eq!(
        err.message(),
        Some(
            "You have requested more vCPU capacity than your current vCPU limit of 0 allows for the instance bucket that the specified instance type belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit."
        )
    );
    assert_eq!(err.raw_response().unwrap().status().as_u16(), 400);
    // other types, spot, and other regions are not refused
    launch(&env, "m5.large").send().await.unwrap();
    launch(&env, "p5.48xlarge")
        .instance_market_options(spot())
        .send()
        .await
        .unwrap();
    // nor is a launch into a Capacity Block of the type
    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let cr = buy(&env, &offer, "refusals").await;
    env.cloud
        .advance_to(chrono_of(offer.start_date().unwrap()) + chrono::TimeDelta::minutes(5));
    launch(&env, "p5.48xlarge")
        .placement(
            Placement::builder()
                .availability_zone(offer.availability_zone().unwrap())
                .build(),
        )
        .instance_market_options(
            InstanceMarketOptionsRequest::builder()
                .market_type(MarketType::CapacityBlock)
                .build(),
        )
        .capacity_reservation_specification(
            CapacityReservationSpecification::builder()
                .capacity_reservation_target(
                    CapacityReservationTarget::builder()
                        .set_capacity_reservation_id(
                            cr.capacity_reservation_id().map(str::to_string),
                        )
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    let conf = sdk_config(&env.cloud.url(), "us-west-2", false).await;
    aws_sdk_ec2::Client::new(&conf)
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("p5.48xlarge".into())
        .image_id("ami-1")
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn an_instance_limit_refuses_with_the_count_asked_for() {
    let env = refusing(vec![refusal(
        RefusalCode::InstanceLimitExceeded,
        RefusalMarket::OnDemand,
        None,
        None,
    )])
    .await;
    let err = launch(&env, "p5.48xlarge").send().await.unwrap_err();
    assert_eq!(err.code(), Some("InstanceLimitExceeded"));
    assert_eq!(
        err.message(),
        Some(
            "You have requested more instances (1) than your current instance limit of 0 allows for the specified instance type. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit."
        )
    );
}

#[tokio::test]
async fn an_unsupported_zone_refuses_there_and_names_the_other_zones() {
    let env = refusing(vec![refusal(
        RefusalCode::Unsupported,
        RefusalMarket::OnDemand,
        Some("us-east-1a"),
        Some("p5.48xlarge"),
    )])
    .await;
    let in_zone = |az: &str| {
        launch(&env, "p5.48xlarge").placement(Placement::builder().availability_zone(az).build())
    };
    let err = in_zone("us-east-1a").send().await.unwrap_err();
    assert_eq!(err.code(), Some("Unsupported"));
    assert_eq!(
        err.message(),
        Some(
            "Your requested instance type (p5.48xlarge) is not supported in your requested Availability Zone (us-east-1a). Please retry your request by not specifying an Availability Zone or choosing us-east-1b, us-east-1c, us-east-1d."
        )
    );
    in_zone("us-east-1b").send().await.unwrap();
    // without a zone EC2 picks one that supports the type
    let out = launch(&env, "p5.48xlarge").send().await.unwrap();
    assert_eq!(
        out.instances()[0].placement().unwrap().availability_zone(),
        Some("us-east-1b")
    );
}

#[tokio::test]
async fn a_spot_count_limit_refuses_spot_launches_only() {
    let env = refusing(vec![refusal(
        RefusalCode::MaxSpotInstanceCountExceeded,
        RefusalMarket::Spot,
        None,
        None,
    )])
    .await;
    let err = launch(&env, "m5.large")
        .instance_market_options(spot())
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("MaxSpotInstanceCountExceeded"));
    assert_eq!(err.message(), Some("Max spot instance count exceeded"));
    launch(&env, "m5.large").send().await.unwrap();
}

#[tokio::test]
async fn a_training_job_quota_refuses_on_demand_jobs_but_not_jobs_on_a_plan() {
    let env = refusing(vec![refusal(
        RefusalCode::ResourceLimitExceeded,
        RefusalMarket::SagemakerTraining,
        None,
        Some("ml.p5.48xlarge"),
    )])
    .await;
    let err = job(&env, "refused", "ml.p5.48xlarge", 1, None, 3600)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_sagemaker::error::ProvideErrorMetadata::code(&err),
        Some("ResourceLimitExceeded")
    );
    assert_eq!(
        aws_sdk_sagemaker::error::ProvideErrorMetadata::message(&err),
        Some(
            "The account-level service limit 'ml.p5.48xlarge for training job usage' is 0 Instances, with current utilization of 0 Instances and a request delta of 1 Instances. Please use AWS Service Quotas to request an increase for this quota."
        )
    );
    assert!(err.as_service_error().unwrap().is_resource_limit_exceeded());
    job(&env, "other-type", "ml.m5.large", 1, None, 3600)
        .send()
        .await
        .unwrap();
    // a job on a training plan is not refused by the on-demand quota
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    let plan = buy_plan(&env, "quota-plan", &offer).await;
    job(&env, "on-plan", "ml.p5.48xlarge", 1, Some(&plan), 3600)
        .send()
        .await
        .unwrap();
}
