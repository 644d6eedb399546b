//! The extension APIs the product buys with: EC2's `DescribeCapacityBlockExtensionHistory`,
//! SageMaker's extension offerings (`SearchTrainingPlanOfferings` with `TrainingPlanArn`),
//! `ExtendTrainingPlan` and `DescribeTrainingPlanExtensionHistory`, and extension payments that
//! fail (`POST /_local/extension-payment-fails`, setting `extension_payment_fails`, the 35-minute
//! bound).

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{CapacityBlockExtension, Filter};
use aws_sdk_sagemaker::types::{SageMakerResourceName, TrainingPlanExtension};
use chrono::{DateTime, TimeDelta, Utc};
use local_cloud::market::Pool;
use local_cloud::{Options, Settings};

use crate::ec2_blocks::{buy, describe, offerings};
use crate::helpers::*;
use crate::sagemaker_plans::{buy_plan, plan_offerings};

async fn env_without_lag() -> Env {
    env_with_settings(Settings {
        listing_lag_seconds: 0,
        ..Settings::default()
    })
    .await
}

/// A block bought for `request`, paid (`scheduled`): its id, end and zone.
async fn paid_block(env: &Env, request: &str) -> (String, DateTime<Utc>, String) {
    let offer = offerings(env, "p5.48xlarge", 1, 48).await.remove(0);
    let id = buy(env, &offer, request)
        .await
        .capacity_reservation_id()
        .unwrap()
        .to_string();
    env.cloud.step(TimeDelta::minutes(5));
    (
        id,
        chrono_of(offer.end_date().unwrap()),
        offer.availability_zone().unwrap().to_string(),
    )
}

/// Buys a one-day extension of block `id` through the API: its offering id.
async fn extend_block_by_api(env: &Env, id: &str) -> String {
    let offers = env
        .ec2
        .describe_capacity_block_extension_offerings()
        .capacity_reservation_id(id)
        .capacity_block_extension_duration_hours(24)
        .send()
        .await
        .expect("extension offerings");
    let offering = offers.capacity_block_extension_offerings()[0]
        .capacity_block_extension_offering_id()
        .unwrap()
        .to_string();
    let bought = env
        .ec2
        .purchase_capacity_block_extension()
        .capacity_block_extension_offering_id(&offering)
        .capacity_reservation_id(id)
        .send()
        .await
        .expect("extension purchase");
    assert_eq!(
        bought.capacity_block_extensions()[0]
            .capacity_block_extension_status()
            .unwrap()
            .as_str(),
        "payment-pending"
    );
    offering
}

async fn history(env: &Env, ids: &[&str], filters: &[(&str, &str)]) -> Vec<CapacityBlockExtension> {
    let mut call = env.ec2.describe_capacity_block_extension_history();
    for id in ids {
        call = call.capacity_reservation_ids(*id);
    }
    for (name, value) in filters {
        call = call.filters(Filter::builder().name(*name).values(*value).build());
    }
    call.send()
        .await
        .expect("extension history")
        .capacity_block_extensions()
        .to_vec()
}

fn status(e: &CapacityBlockExtension) -> &str {
    e.capacity_block_extension_status().unwrap().as_str()
}

fn free_blocks(env: &Env, az: &str, window: (DateTime<Utc>, DateTime<Utc>)) -> u32 {
    env.cloud.with_world(|w| {
        w.market.free_between(
            Pool::CapacityBlock,
            "us-east-1",
            az,
            "p5.48xlarge",
            window.0,
            window.1,
        )
    })
}

async fn arm_failure(env: &Env, reservation: &str) -> (u16, serde_json::Value) {
    http(
        &env.cloud.url(),
        "POST",
        "/_local/extension-payment-fails",
        Some(&format!(r#"{{"reservation": "{reservation}"}}"#)),
    )
    .await
}

#[tokio::test]
async fn the_block_extension_history_lists_every_extension_once_the_listing_lag_has_passed() {
    // GIVEN a paid block (default listing lag: 2 minutes) extended through the API
    let env = env().await;
    let (id, end, az) = paid_block(&env, "history").await;
    let bought_at = env.cloud.now();
    let offering = extend_block_by_api(&env, &id).await;

    // THEN while the extension is payment-pending another one is refused, offering or purchase
    let err = env
        .ec2
        .describe_capacity_block_extension_offerings()
        .capacity_reservation_id(&id)
        .capacity_block_extension_duration_hours(24)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    let err = env
        .ec2
        .purchase_capacity_block_extension()
        .capacity_block_extension_offering_id(&offering)
        .capacity_reservation_id(&id)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));

    // ... and the new extension is missing from the history for the listing lag
    assert!(history(&env, &[&id], &[]).await.is_empty());
    env.cloud.step(TimeDelta::seconds(119));
    assert!(history(&env, &[], &[]).await.is_empty());
    env.cloud.step(TimeDelta::seconds(1));
    let h = history(&env, &[&id], &[]).await;
    assert_eq!(h.len(), 1);
    let e = &h[0];
    assert_eq!(e.capacity_reservation_id(), Some(id.as_str()));
    assert_eq!(e.instance_type(), Some("p5.48xlarge"));
    assert_eq!(e.instance_count(), Some(1));
    assert_eq!(e.availability_zone(), Some(az.as_str()));
    assert!(e.availability_zone_id().unwrap().starts_with("use1-az"));
    assert_eq!(
        e.capacity_block_extension_offering_id(),
        Some(offering.as_str())
    );
    assert_eq!(e.capacity_block_extension_duration_hours(), Some(24));
    assert_eq!(status(e), "payment-pending");
    assert_eq!(
        chrono_of(e.capacity_block_extension_purchase_date().unwrap()),
        bought_at
    );
    assert_eq!(
        chrono_of(e.capacity_block_extension_start_date().unwrap()),
        end
    );
    assert_eq!(
        chrono_of(e.capacity_block_extension_end_date().unwrap()),
        end + TimeDelta::hours(24)
    );
    assert!(e.upfront_fee().unwrap().parse::<f64>().unwrap() > 0.0);
    assert_eq!(e.currency_code(), Some("USD"));

    // WHEN it is paid, its status changes at once
    env.cloud.step(TimeDelta::minutes(3));
    assert_eq!(
        status(&history(&env, &[&id], &[]).await[0]),
        "payment-succeeded"
    );

    // ... and an extension a team buys by hand is in the history too, after the lag
    let (code, body) = http(
        &env.cloud.url(),
        "POST",
        &format!("/_local/capacity-reservations/{id}/extend"),
        Some(r#"{"hours": 48}"#),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(history(&env, &[], &[]).await.len(), 1);
    env.cloud.step(TimeDelta::minutes(2));
    let all = history(&env, &[], &[]).await;
    assert_eq!(all.len(), 2, "oldest purchase first");
    assert_eq!(all[1].capacity_block_extension_duration_hours(), Some(48));

    // THEN each documented filter selects
    let zone_id = all[0].availability_zone_id().unwrap().to_string();
    let count = |f: &'static str, v: String| {
        let env = &env;
        async move { history(env, &[], &[(f, &v)]).await.len() }
    };
    assert_eq!(
        count("capacity-block-extension-status", "payment-pending".into()).await,
        1
    );
    assert_eq!(
        count("capacity-block-extension-status", "payment-failed".into()).await,
        0
    );
    assert_eq!(
        count("capacity-block-extension-offering-id", offering.clone()).await,
        1
    );
    assert_eq!(count("capacity-reservation-id", id.clone()).await, 2);
    assert_eq!(count("instance-type", "p5.48xlarge".into()).await, 2);
    assert_eq!(count("instance-type", "p4d.24xlarge".into()).await, 0);
    assert_eq!(count("availability-zone", az.clone()).await, 2);
    assert_eq!(count("availability-zone-id", zone_id).await, 2);
    assert_eq!(count("availability-zone-id", "use1-az9".into()).await, 0);

    // ... pages follow MaxResults and NextToken
    let first = env
        .ec2
        .describe_capacity_block_extension_history()
        .max_results(1)
        .send()
        .await
        .unwrap();
    assert_eq!(first.capacity_block_extensions().len(), 1);
    let second = env
        .ec2
        .describe_capacity_block_extension_history()
        .max_results(1)
        .next_token(first.next_token().expect("a second page"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        second.capacity_block_extensions()[0].capacity_block_extension_duration_hours(),
        Some(48)
    );
    assert_eq!(second.next_token(), None);

    // ... and an unknown filter or reservation is refused
    let err = env
        .ec2
        .describe_capacity_block_extension_history()
        .filters(Filter::builder().name("state").values("active").build())
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    let err = env
        .ec2
        .describe_capacity_block_extension_history()
        .capacity_reservation_ids("cr-00000000000000000")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidCapacityReservationId.NotFound"));
}

#[tokio::test]
async fn a_forced_extension_payment_failure_keeps_the_blocks_end_and_returns_its_capacity() {
    // GIVEN a paid block, and the next extension of it armed to fail its payment
    let env = env_without_lag().await;
    let (id, end, az) = paid_block(&env, "doomed-extension").await;
    let (code, body) = arm_failure(&env, &id).await;
    assert_eq!((code, body["armed"].as_str()), (200, Some(id.as_str())));
    let (code, body) = arm_failure(&env, "cr-00000000000000000").await;
    assert_eq!((code, body["error"].as_str()), (404, Some("NotFound")));
    let window = (end, end + TimeDelta::hours(24));
    let free = free_blocks(&env, &az, window);

    // WHEN it is extended through the API: payment-pending, its capacity taken
    extend_block_by_api(&env, &id).await;
    assert_eq!(free_blocks(&env, &az, window), free - 1);

    // THEN at its payment time it is payment-failed, the block keeps its end and the capacity
    // is back
    env.cloud.step(TimeDelta::minutes(5));
    let h = history(&env, &[&id], &[]).await;
    assert_eq!(status(&h[0]), "payment-failed");
    let cr = describe(&env, &id).await;
    assert_eq!(chrono_of(cr.end_date().unwrap()), end);
    assert_eq!(cr.state().unwrap().as_str(), "scheduled");
    assert_eq!(free_blocks(&env, &az, window), free);

    // ... the failure was one shot: the next extension is paid
    extend_block_by_api(&env, &id).await;
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(
        chrono_of(describe(&env, &id).await.end_date().unwrap()),
        end + TimeDelta::hours(24)
    );

    // ... and one armed again fails an extension bought by hand as well
    arm_failure(&env, &id).await;
    let (code, body) = http(
        &env.cloud.url(),
        "POST",
        &format!("/_local/capacity-reservations/{id}/extend"),
        Some(r#"{"hours": 24}"#),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    env.cloud.step(TimeDelta::minutes(5));
    let h = history(&env, &[&id], &[]).await;
    assert_eq!(
        h.iter().map(status).collect::<Vec<_>>(),
        ["payment-failed", "payment-succeeded", "payment-failed"]
    );
    assert_eq!(
        chrono_of(describe(&env, &id).await.end_date().unwrap()),
        end + TimeDelta::hours(24)
    );
}

#[tokio::test]
async fn an_extension_bought_later_than_35_minutes_before_the_end_fails_its_payment() {
    // GIVEN an extension offered at the last moment, 1 hour before the block's end
    let env = env_without_lag().await;
    let (id, end, _) = paid_block(&env, "too-late").await;
    env.cloud.advance_to(end - TimeDelta::hours(1));
    let offers = env
        .ec2
        .describe_capacity_block_extension_offerings()
        .capacity_reservation_id(&id)
        .capacity_block_extension_duration_hours(24)
        .send()
        .await
        .unwrap();
    let offering = offers.capacity_block_extension_offerings()[0]
        .capacity_block_extension_offering_id()
        .unwrap()
        .to_string();

    // WHEN it is bought 30 minutes before the end, too late for its payment to clear by
    // 35 minutes before it
    env.cloud.advance_to(end - TimeDelta::minutes(30));
    let bought = env
        .ec2
        .purchase_capacity_block_extension()
        .capacity_block_extension_offering_id(&offering)
        .capacity_reservation_id(&id)
        .send()
        .await
        .unwrap();
    assert_eq!(
        status(&bought.capacity_block_extensions()[0]),
        "payment-pending"
    );

    // THEN its payment fails at once and the block ends when it did
    let h = history(&env, &[&id], &[]).await;
    assert_eq!(status(&h[0]), "payment-failed");
    assert_eq!(
        chrono_of(describe(&env, &id).await.end_date().unwrap()),
        end
    );
}

async fn plan_search(
    env: &Env,
    arn: &str,
    hours: i64,
) -> Result<
    aws_sdk_sagemaker::operation::search_training_plan_offerings::SearchTrainingPlanOfferingsOutput,
    aws_sdk_sagemaker::error::SdkError<
        aws_sdk_sagemaker::operation::search_training_plan_offerings::SearchTrainingPlanOfferingsError,
    >,
>{
    env.sm
        .search_training_plan_offerings()
        .training_plan_arn(arn)
        .duration_hours(hours)
        .send()
        .await
}

async fn extend_plan_by_api(env: &Env, offering: &str) -> TrainingPlanExtension {
    env.sm
        .extend_training_plan()
        .training_plan_extension_offering_id(offering)
        .send()
        .await
        .expect("ExtendTrainingPlan")
        .training_plan_extensions()[0]
        .clone()
}

async fn plan_history(env: &Env, arn: &str) -> Vec<TrainingPlanExtension> {
    env.sm
        .describe_training_plan_extension_history()
        .training_plan_arn(arn)
        .send()
        .await
        .expect("extension history")
        .training_plan_extensions()
        .to_vec()
}

async fn plan_end(env: &Env, name: &str) -> DateTime<Utc> {
    chrono_of(
        env.sm
            .describe_training_plan()
            .training_plan_name(name)
            .send()
            .await
            .unwrap()
            .end_time()
            .unwrap(),
    )
}

/// A one-day training plan bought as `name`: its ARN, end and last zone.
async fn plan(env: &Env, name: &str) -> (String, DateTime<Utc>, String) {
    let offer = plan_offerings(
        env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    let arn = buy_plan(env, name, &offer).await;
    let segs = offer.reserved_capacity_offerings();
    let last = &segs[segs.len() - 1];
    (
        arn,
        chrono_of(last.end_time().unwrap()),
        last.availability_zone().unwrap().to_string(),
    )
}

#[tokio::test]
async fn plan_extensions_are_offered_by_plan_arn_bought_with_extend_training_plan_and_listed() {
    use aws_sdk_sagemaker::error::ProvideErrorMetadata;
    // seed 1: its market has room for two one-day extensions of the plan
    let env = env_with(Options {
        seed: 1,
        start: Some(t0()),
        ..Options::default()
    })
    .await;
    let (arn, end, az) = plan(&env, "api-plan").await;
    let new_end = end + TimeDelta::hours(24);

    // GIVEN a plan still Pending: no extension is offered
    let err = plan_search(&env, &arn, 24).await.unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));

    // WHEN it is paid (Scheduled), a search with its ARN offers one day more from its end in
    // its last zone; not whole days are refused, an unknown plan is not found
    env.cloud.step(TimeDelta::minutes(5));
    let err = plan_search(&env, &arn, 25).await.unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    let err = plan_search(&env, &arn.replace("api-plan", "no-such-plan"), 24)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceNotFound"));
    let out = plan_search(&env, &arn, 24).await.unwrap();
    assert!(out.training_plan_offerings().is_empty());
    let o = &out.training_plan_extension_offerings()[0];
    let offering = o.training_plan_extension_offering_id().unwrap().to_string();
    assert!(offering.starts_with("tpeo-"), "{offering}");
    assert_eq!(o.availability_zone(), Some(az.as_str()));
    assert_eq!(chrono_of(o.start_date().unwrap()), end);
    assert_eq!(chrono_of(o.end_date().unwrap()), new_end);
    assert_eq!(o.duration_hours(), Some(24));
    assert!(o.upfront_fee().unwrap().parse::<f64>().unwrap() > 0.0);
    assert_eq!(o.currency_code(), Some("USD"));

    // ... an unknown offering cannot be bought
    let err = env
        .sm
        .extend_training_plan()
        .training_plan_extension_offering_id("tpeo-00000000000000000")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));

    // ... and ExtendTrainingPlan buys the offering: Pending, its payment Pending
    let extended_at = env.cloud.now();
    let e = extend_plan_by_api(&env, &offering).await;
    assert_eq!(
        e.training_plan_extension_offering_id(),
        Some(offering.as_str())
    );
    assert_eq!(chrono_of(e.extended_at().unwrap()), extended_at);
    assert_eq!(chrono_of(e.start_date().unwrap()), end);
    assert_eq!(chrono_of(e.end_date().unwrap()), new_end);
    assert_eq!(
        (e.status(), e.payment_status()),
        (Some("Pending"), Some("Pending"))
    );
    assert_eq!(e.availability_zone(), Some(az.as_str()));
    assert_eq!(e.duration_hours(), Some(24));
    assert_eq!(e.upfront_fee(), o.upfront_fee());
    assert_eq!(e.currency_code(), Some("USD"));

    // THEN while it is being paid, the offering cannot be bought again and no other is offered
    let err = env
        .sm
        .extend_training_plan()
        .training_plan_extension_offering_id(&offering)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    let err = plan_search(&env, &arn, 24).await.unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));

    // ... the history shows it once the listing lag has passed
    assert!(plan_history(&env, &arn).await.is_empty());
    env.cloud.step(TimeDelta::minutes(2));
    let h = plan_history(&env, &arn).await;
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].payment_status(), Some("Pending"));
    assert_eq!(plan_end(&env, "api-plan").await, end);

    // ... and once paid the plan ends a day later, the extension Active and Succeeded (at once)
    env.cloud.step(TimeDelta::minutes(3));
    assert_eq!(plan_end(&env, "api-plan").await, new_end);
    let h = plan_history(&env, &arn).await;
    assert_eq!(
        (h[0].status(), h[0].payment_status()),
        (Some("Active"), Some("Succeeded"))
    );
    let err = env
        .sm
        .extend_training_plan()
        .training_plan_extension_offering_id(&offering)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"), "used once only");

    // ... an extension bought by hand is listed too, and the history pages
    let (code, body) = http(
        &env.cloud.url(),
        "POST",
        "/_local/training-plans/us-east-1/api-plan/extend",
        Some(r#"{"hours": 24}"#),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    env.cloud.step(TimeDelta::minutes(2));
    let first = env
        .sm
        .describe_training_plan_extension_history()
        .training_plan_arn(&arn)
        .max_results(1)
        .send()
        .await
        .unwrap();
    assert_eq!(first.training_plan_extensions().len(), 1);
    let second = env
        .sm
        .describe_training_plan_extension_history()
        .training_plan_arn(&arn)
        .max_results(1)
        .next_token(first.next_token().expect("a second page"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        chrono_of(second.training_plan_extensions()[0].start_date().unwrap()),
        new_end,
        "oldest first: the one bought by hand starts at the first one's end"
    );
    assert_eq!(second.next_token(), None);
    let err = env
        .sm
        .describe_training_plan_extension_history()
        .training_plan_arn(arn.replace("api-plan", "no-such-plan"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ResourceNotFound"));
}

#[tokio::test]
async fn a_plan_extension_whose_payment_fails_keeps_the_plans_end_and_returns_the_capacity() {
    // GIVEN a paid plan whose next extension is armed to fail (named by its plan name)
    let env = env_with(Options {
        seed: 42,
        start: Some(t0()),
        settings: Settings {
            listing_lag_seconds: 0,
            ..Settings::default()
        },
        ..Options::default()
    })
    .await;
    let (arn, end, az) = plan(&env, "doomed-plan").await;
    env.cloud.step(TimeDelta::minutes(5));
    let (code, body) = arm_failure(&env, "doomed-plan").await;
    assert_eq!((code, body["armed"].as_str()), (200, Some(arn.as_str())));
    let window = (end, end + TimeDelta::hours(24));
    let ty = env.cloud.with_world(|w| {
        w.sm.plans
            .values()
            .next()
            .unwrap()
            .offering
            .instance_type
            .clone()
    });
    let free = || {
        env.cloud.with_world(|w| {
            w.market.free_between(
                Pool::TrainingPlan,
                "us-east-1",
                &az,
                &ty,
                window.0,
                window.1,
            )
        })
    };
    let before = free();

    // WHEN it is extended through the API
    let out = plan_search(&env, &arn, 24).await.unwrap();
    let offering = out.training_plan_extension_offerings()[0]
        .training_plan_extension_offering_id()
        .unwrap()
        .to_string();
    extend_plan_by_api(&env, &offering).await;
    assert_eq!(free(), before - 1);

    // THEN at its payment time its payment fails, the plan keeps its end, the capacity is back
    env.cloud.step(TimeDelta::minutes(5));
    let h = plan_history(&env, &arn).await;
    assert_eq!(
        (h[0].status(), h[0].payment_status()),
        (Some("Failed"), Some("Failed"))
    );
    assert_eq!(plan_end(&env, "doomed-plan").await, end);
    assert_eq!(free(), before);

    // ... with the setting every extension's payment fails, by hand too, and without it the
    // next one is paid (the armed failure was one shot)
    env.cloud
        .with_world(|w| w.settings.extension_payment_fails = true);
    let (code, body) = http(
        &env.cloud.url(),
        "POST",
        "/_local/training-plans/us-east-1/doomed-plan/extend",
        Some(r#"{"hours": 24}"#),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(
        plan_history(&env, &arn).await[1].payment_status(),
        Some("Failed")
    );
    assert_eq!(plan_end(&env, "doomed-plan").await, end);
    env.cloud
        .with_world(|w| w.settings.extension_payment_fails = false);
    let out = plan_search(&env, &arn, 24).await.unwrap();
    extend_plan_by_api(
        &env,
        out.training_plan_extension_offerings()[0]
            .training_plan_extension_offering_id()
            .unwrap(),
    )
    .await;
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(
        plan_history(&env, &arn).await[2].payment_status(),
        Some("Succeeded")
    );
    assert_eq!(
        plan_end(&env, "doomed-plan").await,
        end + TimeDelta::hours(24)
    );
}
