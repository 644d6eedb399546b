//! Inference endpoints reserved through a training plan: InService only on an active plan of the
//! same type, failed at expiry; the ValidationException the real service returns for names.

use aws_sdk_sagemaker::error::ProvideErrorMetadata;
use aws_sdk_sagemaker::types::{
    CapacityReservationPreference, ProductionVariant, ProductionVariantCapacityReservationConfig,
    ProductionVariantInstanceType, SageMakerResourceName,
};
use chrono::TimeDelta;
use local_cloud::{InactivePlan, Options, Settings};

use crate::helpers::*;
use crate::sagemaker_plans::{buy_plan, plan_offerings};

/// Settings whose endpoint configs are visible at once: the other rows' tests create an
/// endpoint right after its config; the visibility lag has its own test
/// (`an_endpoint_config_is_not_found_until_its_visibility_lag_has_passed`).
fn visible_at_once() -> Settings {
    Settings {
        endpoint_config_visibility_seconds: 0,
        ..Settings::default()
    }
}

/// The default environment, endpoint configs visible at once (shadows `helpers::env`).
async fn env() -> Env {
    with_settings(visible_at_once()).await
}

/// An environment with `settings` and the model every variant here names.
async fn with_settings(settings: Settings) -> Env {
    let env = env_with_settings(settings).await;
    create_model(&env, "model").await;
    env
}

fn variant(ty: &str, plan: Option<&str>) -> ProductionVariant {
    let mut b = ProductionVariant::builder()
        .variant_name("primary")
        .model_name("model")
        .instance_type(ProductionVariantInstanceType::from(ty))
        .initial_instance_count(1);
    if let Some(p) = plan {
        b = b.capacity_reservation_config(
            ProductionVariantCapacityReservationConfig::builder()
                .capacity_reservation_preference(
                    CapacityReservationPreference::CapacityReservationsOnly,
                )
                .ml_reservation_arn(p)
                .build(),
        );
    }
    b.build()
}

async fn status(env: &Env, name: &str) -> String {
    env.sm
        .describe_endpoint()
        .endpoint_name(name)
        .send()
        .await
        .unwrap()
        .endpoint_status()
        .unwrap()
        .as_str()
        .to_string()
}

#[tokio::test]
async fn an_endpoint_on_an_active_plan_serves_until_the_plan_expires() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::Endpoint,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "serve-plan", &offer).await;
    let seg = &offer.reserved_capacity_offerings()[0];
    env.cloud.advance_to(chrono_of(seg.start_time().unwrap()));
    let cfg = env
        .sm
        .create_endpoint_config()
        .endpoint_config_name("cfg")
        .production_variants(variant("ml.p5.48xlarge", Some(&arn)))
        .send()
        .await
        .unwrap();
    assert_eq!(
        cfg.endpoint_config_arn(),
        Some("arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/cfg")
    );
    let ep = env
        .sm
        .create_endpoint()
        .endpoint_name("ep")
        .endpoint_config_name("cfg")
        .send()
        .await
        .unwrap();
    assert_eq!(
        ep.endpoint_arn(),
        Some("arn:aws:sagemaker:us-east-1:123456789012:endpoint/ep")
    );
    assert_eq!(status(&env, "ep").await, "Creating");
    env.cloud.step(TimeDelta::minutes(5));
    let d = env
        .sm
        .describe_endpoint()
        .endpoint_name("ep")
        .send()
        .await
        .unwrap();
    assert_eq!(d.endpoint_status().unwrap().as_str(), "InService");
    assert_eq!(d.endpoint_config_name(), Some("cfg"));
    assert_eq!(d.production_variants()[0].current_instance_count(), Some(1));
    let plan = env
        .sm
        .describe_training_plan()
        .training_plan_name("serve-plan")
        .send()
        .await
        .unwrap();
    assert_eq!(plan.in_use_instance_count(), Some(1));
    env.cloud.advance_to(chrono_of(seg.end_time().unwrap()));
    let d = env
        .sm
        .describe_endpoint()
        .endpoint_name("ep")
        .send()
        .await
        .unwrap();
    assert_eq!(d.endpoint_status().unwrap().as_str(), "Failed");
    assert!(d.failure_reason().unwrap().contains("expired"));
    let statuses: Vec<String> = events_of(&env.cloud, "SageMaker Endpoint State Change")
        .iter()
        .map(|e| e["detail"]["EndpointStatus"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(statuses, ["CREATING", "IN_SERVICE", "FAILED"]);

    env.sm
        .delete_endpoint()
        .endpoint_name("ep")
        .send()
        .await
        .unwrap();
    env.sm
        .delete_endpoint_config()
        .endpoint_config_name("cfg")
        .send()
        .await
        .unwrap();
    // `Deleting` for `endpoint_delete_minutes` (2), then gone
    assert_eq!(status(&env, "ep").await, "Deleting");
    env.cloud.step(TimeDelta::minutes(2));
    let gone = env
        .sm
        .describe_endpoint()
        .endpoint_name("ep")
        .send()
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Some("ValidationException"));
    let again = env
        .sm
        .delete_endpoint()
        .endpoint_name("ep")
        .send()
        .await
        .unwrap_err();
    assert_eq!(again.code(), Some("ValidationException"));
    assert!(
        again
            .message()
            .unwrap()
            .starts_with("Could not find endpoint")
    );
    let again = env
        .sm
        .delete_endpoint_config()
        .endpoint_config_name("cfg")
        .send()
        .await
        .unwrap_err();
    assert_eq!(again.code(), Some("ValidationException"));
}

#[tokio::test]
async fn an_endpoint_on_a_plan_that_is_not_active_fails() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::Endpoint,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "later-plan", &offer).await;
    env.sm
        .create_endpoint_config()
        .endpoint_config_name("cfg")
        .production_variants(variant("ml.p5.48xlarge", Some(&arn)))
        .send()
        .await
        .unwrap();
    env.sm
        .create_endpoint()
        .endpoint_name("too-early")
        .endpoint_config_name("cfg")
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(status(&env, "too-early").await, "Failed");
}

#[tokio::test]
async fn endpoint_names_and_plan_types_are_validated() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::Endpoint,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "typed-plan", &offer).await;
    let wrong_type = env
        .sm
        .create_endpoint_config()
        .endpoint_config_name("cfg")
        .production_variants(variant("ml.p4d.24xlarge", Some(&arn)))
        .send()
        .await
        .unwrap_err();
    assert_eq!(wrong_type.code(), Some("ValidationException"));
    env.sm
        .create_endpoint_config()
        .endpoint_config_name("cfg")
        .production_variants(variant("ml.m5.large", None))
        .send()
        .await
        .unwrap();
    let dup = env
        .sm
        .create_endpoint_config()
        .endpoint_config_name("cfg")
        .production_variants(variant("ml.m5.large", None))
        .send()
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Some("ValidationException"));
    assert!(
        dup.message()
            .unwrap()
            .contains("already existing endpoint configuration")
    );
    env.sm
        .create_endpoint()
        .endpoint_name("ep")
        .endpoint_config_name("cfg")
        .send()
        .await
        .unwrap();
    let dup = env
        .sm
        .create_endpoint()
        .endpoint_name("ep")
        .endpoint_config_name("cfg")
        .send()
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Some("ValidationException"));
    assert!(
        dup.message()
            .unwrap()
            .contains("Cannot create already existing endpoint")
    );
    let no_cfg = env
        .sm
        .create_endpoint()
        .endpoint_name("ep2")
        .endpoint_config_name("missing")
        .send()
        .await
        .unwrap_err();
    assert_eq!(no_cfg.code(), Some("ValidationException"));
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(
        status(&env, "ep").await,
        "InService",
        "on-demand endpoints need no plan"
    );
}

#[tokio::test]
async fn a_deleted_endpoint_is_deleting_for_two_minutes_keeping_its_name_and_instances() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::Endpoint,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "del-plan", &offer).await;
    let seg = &offer.reserved_capacity_offerings()[0];
    env.cloud.advance_to(chrono_of(seg.start_time().unwrap()));
    env.sm
        .create_endpoint_config()
        .endpoint_config_name("cfg")
        .production_variants(variant("ml.p5.48xlarge", Some(&arn)))
        .send()
        .await
        .unwrap();
    let create = || {
        env.sm
            .create_endpoint()
            .endpoint_name("Del-Ep")
            .endpoint_config_name("cfg")
            .send()
    };
    create().await.unwrap();
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(status(&env, "Del-Ep").await, "InService");
    let in_use = || async {
        env.sm
            .describe_training_plan()
            .training_plan_name("del-plan")
            .send()
            .await
            .unwrap()
            .in_use_instance_count()
    };
    assert_eq!(in_use().await, Some(1));

    env.sm
        .delete_endpoint()
        .endpoint_name("Del-Ep")
        .send()
        .await
        .unwrap();
    assert_eq!(status(&env, "Del-Ep").await, "Deleting");
    // the name stays taken, with the duplicate-create message
    let taken = create().await.unwrap_err();
    assert_eq!(taken.code(), Some("ValidationException"));
    assert_eq!(
        taken.message(),
        Some(
            "Cannot create already existing endpoint \"arn:aws:sagemaker:us-east-1:123456789012:endpoint/del-ep\"."
        )
    );
    // a second delete succeeds and sends no second event
    env.sm
        .delete_endpoint()
        .endpoint_name("Del-Ep")
        .send()
        .await
        .unwrap();
    // the instances are released only when it is gone
    assert_eq!(in_use().await, Some(1));
    env.cloud.step(TimeDelta::minutes(1));
    assert_eq!(status(&env, "Del-Ep").await, "Deleting");
    env.cloud.step(TimeDelta::minutes(1));
    let gone = env
        .sm
        .describe_endpoint()
        .endpoint_name("Del-Ep")
        .send()
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Some("ValidationException"));
    assert_eq!(
        gone.message(),
        Some(
            "Could not find endpoint \"arn:aws:sagemaker:us-east-1:123456789012:endpoint/del-ep\"."
        )
    );
    assert_eq!(in_use().await, Some(0));
    let statuses: Vec<String> = events_of(&env.cloud, "SageMaker Endpoint State Change")
        .iter()
        .map(|e| e["detail"]["EndpointStatus"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(statuses, ["CREATING", "IN_SERVICE", "DELETING"]);
    // the name is free again
    create().await.unwrap();
    assert_eq!(status(&env, "Del-Ep").await, "Creating");
}

#[tokio::test]
async fn an_endpoint_on_a_plan_that_is_not_active_is_refused_when_set() {
    let env = with_settings(Settings {
        endpoint_inactive_plan: InactivePlan::Refuse,
        ..visible_at_once()
    })
    .await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::Endpoint,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "refuse-plan", &offer).await;
    env.sm
        .create_endpoint_config()
        .endpoint_config_name("cfg")
        .production_variants(variant("ml.p5.48xlarge", Some(&arn)))
        .send()
        .await
        .unwrap();
    let create = || {
        env.sm
            .create_endpoint()
            .endpoint_name("ep")
            .endpoint_config_name("cfg")
            .send()
    };
    let refused = create().await.unwrap_err();
    assert_eq!(refused.code(), Some("ValidationException"));
    assert_eq!(
        refused.message().unwrap(),
        format!(
            "The training plan {arn} is not in Active status; an endpoint can use a training plan only when it is Active."
        )
    );
    let missing = env
        .sm
        .describe_endpoint()
        .endpoint_name("ep")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        missing.code(),
        Some("ValidationException"),
        "nothing created"
    );
    let seg = &offer.reserved_capacity_offerings()[0];
    env.cloud.advance_to(chrono_of(seg.start_time().unwrap()));
    create().await.unwrap();
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(status(&env, "ep").await, "InService");
}

#[tokio::test]
async fn forced_endpoint_failures_fail_the_next_endpoints_that_would_serve() {
    let env = with_settings(Settings {
        endpoint_failures: 1,
        ..visible_at_once()
    })
    .await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::Endpoint,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "early-plan", &offer).await;
    env.sm
        .create_endpoint_config()
        .endpoint_config_name("on-plan")
        .production_variants(variant("ml.p5.48xlarge", Some(&arn)))
        .send()
        .await
        .unwrap();
    env.sm
        .create_endpoint_config()
        .endpoint_config_name("on-demand")
        .production_variants(variant("ml.m5.large", None))
        .send()
        .await
        .unwrap();
    let create = |name: &'static str, cfg: &'static str| {
        env.sm
            .create_endpoint()
            .endpoint_name(name)
            .endpoint_config_name(cfg)
            .send()
    };
    let describe = |name: &'static str| env.sm.describe_endpoint().endpoint_name(name).send();
    // an endpoint that fails anyway (its plan is not Active) does not use up the forced failure
    create("inactive", "on-plan").await.unwrap();
    create("first", "on-demand").await.unwrap();
    env.cloud.step(TimeDelta::minutes(4));
    assert_eq!(status(&env, "first").await, "Creating");
    env.cloud.step(TimeDelta::minutes(1));
    let d = describe("inactive").await.unwrap();
    assert_eq!(d.endpoint_status().unwrap().as_str(), "Failed");
    assert!(d.failure_reason().unwrap().contains("training plan"));
    let d = describe("first").await.unwrap();
    assert_eq!(d.endpoint_status().unwrap().as_str(), "Failed");
    assert_eq!(
        d.failure_reason(),
        Some("Unable to provision requested ML compute capacity due to InsufficientCapacityError")
    );
    // the retry serves: the one forced failure is used up
    create("retry", "on-demand").await.unwrap();
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(status(&env, "retry").await, "InService");
    let (code, settings) = http(&env.cloud.url(), "GET", "/_local/settings", None).await;
    assert_eq!(code, 200);
    assert_eq!(settings["endpoint_failures"], 0);
    let failed: Vec<_> = events_of(&env.cloud, "SageMaker Endpoint State Change")
        .into_iter()
        .filter(|e| e["detail"]["EndpointName"] == "first")
        .map(|e| e["detail"]["EndpointStatus"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(failed, ["CREATING", "FAILED"]);
}

#[tokio::test]
async fn an_endpoint_config_is_not_found_until_its_visibility_lag_has_passed() {
    // botocore `sagemaker` model, CreateEndpoint: "a load call is made to DynamoDB to verify
    // that your endpoint configuration exists … If the dependent entities are not yet in
    // DynamoDB, this causes a validation error"; the lag's length is unpublished (harsher:
    // 60 s)
    let env = with_settings(Settings::default()).await;
    assert_eq!(Settings::default().endpoint_config_visibility_seconds, 60);
    env.sm
        .create_endpoint_config()
        .endpoint_config_name("lagging-cfg")
        .production_variants(variant("ml.g5.xlarge", None))
        .send()
        .await
        .unwrap();
    let not_found = "Could not find endpoint configuration \"arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/lagging-cfg\".";
    // within the lag: DescribeEndpointConfig and CreateEndpoint do not find it
    let err = env
        .sm
        .describe_endpoint_config()
        .endpoint_config_name("lagging-cfg")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    assert_eq!(err.message(), Some(not_found));
    let create = || {
        env.sm
            .create_endpoint()
            .endpoint_name("lagging-ep")
            .endpoint_config_name("lagging-cfg")
            .send()
    };
    let err = create().await.unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    assert_eq!(err.message(), Some(not_found));
    assert!(
        env.sm
            .describe_endpoint()
            .endpoint_name("lagging-ep")
            .send()
            .await
            .is_err(),
        "nothing created"
    );
    // but its name is taken at once
    let dup = env
        .sm
        .create_endpoint_config()
        .endpoint_config_name("lagging-cfg")
        .production_variants(variant("ml.g5.xlarge", None))
        .send()
        .await
        .unwrap_err();
    assert!(
        dup.message().unwrap().contains("already existing"),
        "{dup:?}"
    );
    env.cloud.step(TimeDelta::seconds(59));
    assert!(create().await.is_err(), "still inside the lag");
    // past the lag: described, and the endpoint is created
    env.cloud.step(TimeDelta::seconds(1));
    let d = env
        .sm
        .describe_endpoint_config()
        .endpoint_config_name("lagging-cfg")
        .send()
        .await
        .unwrap();
    assert_eq!(d.endpoint_config_name(), Some("lagging-cfg"));
    assert_eq!(
        d.endpoint_config_arn(),
        Some("arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/lagging-cfg")
    );
    assert_eq!(d.production_variants().len(), 1);
    create().await.unwrap();
    assert_eq!(status(&env, "lagging-ep").await, "Creating");

    // With no lag, visible at once
    let env = with_settings(visible_at_once()).await;
    env.sm
        .create_endpoint_config()
        .endpoint_config_name("cfg")
        .production_variants(variant("ml.g5.xlarge", None))
        .send()
        .await
        .unwrap();
    env.sm
        .describe_endpoint_config()
        .endpoint_config_name("cfg")
        .send()
        .await
        .unwrap();
}

/// A variant names a model of the region: SageMaker answers an unknown one with
/// `ValidationException` "Could not find model …", on DescribeModel, DeleteModel and
/// CreateEndpointConfig alike (REALISM.md, SageMaker: models).
#[tokio::test]
async fn models_are_created_described_deleted_and_named_by_endpoint_configs() {
    let env = env_with_settings(visible_at_once()).await;
    let unknown = env
        .sm
        .describe_model()
        .model_name("llm")
        .send()
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Some("ValidationException"));
    assert_eq!(
        unknown.message(),
        Some("Could not find model 'arn:aws:sagemaker:us-east-1:123456789012:model/llm'.")
    );
    let config = |name: &'static str| {
        env.sm
            .create_endpoint_config()
            .endpoint_config_name(name)
            .production_variants(
                ProductionVariant::builder()
                    .variant_name("primary")
                    .model_name("llm")
                    .instance_type(ProductionVariantInstanceType::from("ml.g5.xlarge"))
                    .initial_instance_count(1)
                    .build(),
            )
            .send()
    };
    let refused = config("before").await.unwrap_err();
    assert_eq!(refused.code(), Some("ValidationException"));
    assert!(refused.message().unwrap().contains("Could not find model"));

    create_model(&env, "llm").await;
    let d = env
        .sm
        .describe_model()
        .model_name("llm")
        .send()
        .await
        .unwrap();
    assert_eq!(d.model_name(), Some("llm"));
    assert_eq!(
        d.model_arn(),
        Some("arn:aws:sagemaker:us-east-1:123456789012:model/llm")
    );
    config("after").await.unwrap();
    let again = env
        .sm
        .create_model()
        .model_name("llm")
        .send()
        .await
        .unwrap_err();
    assert!(again.message().unwrap().contains("already existing model"));
    // Another region does not know it.
    let west = env_in(
        Options {
            seed: 42,
            start: Some(t0()),
            ..Options::default()
        },
        "us-west-2",
    )
    .await;
    assert!(
        west.sm
            .describe_model()
            .model_name("llm")
            .send()
            .await
            .is_err()
    );

    env.sm
        .delete_model()
        .model_name("llm")
        .send()
        .await
        .unwrap();
    assert!(
        env.sm
            .describe_model()
            .model_name("llm")
            .send()
            .await
            .is_err()
    );
    assert!(
        env.sm
            .delete_model()
            .model_name("llm")
            .send()
            .await
            .is_err()
    );
}
