//! Training plans and training jobs over awsJson1_1: offerings by the developer guide's rules,
//! purchase, the plan's status over its segments, and jobs waiting, training and being stopped.

use aws_sdk_sagemaker::error::ProvideErrorMetadata;
use aws_sdk_sagemaker::types::{
    AlgorithmSpecification, OutputDataConfig, ReservedCapacityInstanceType, ResourceConfig,
    SageMakerResourceName, StoppingCondition, TrainingInputMode, TrainingInstanceType,
    TrainingPlanFilter, TrainingPlanFilterName, TrainingPlanOffering,
};
use chrono::{TimeDelta, Timelike};

use crate::helpers::*;

pub async fn plan_offerings(
    env: &Env,
    ty: &str,
    count: i32,
    hours: i64,
    target: SageMakerResourceName,
) -> Vec<TrainingPlanOffering> {
    env.sm
        .search_training_plan_offerings()
        .instance_type(ReservedCapacityInstanceType::from(ty))
        .instance_count(count)
        .duration_hours(hours)
        .target_resources(target)
        .send()
        .await
        .expect("search")
        .training_plan_offerings()
        .to_vec()
}

pub async fn buy_plan(env: &Env, name: &str, offering: &TrainingPlanOffering) -> String {
    env.sm
        .create_training_plan()
        .training_plan_name(name)
        .training_plan_offering_id(offering.training_plan_offering_id().unwrap())
        .send()
        .await
        .expect("create plan")
        .training_plan_arn()
        .unwrap()
        .to_string()
}

async fn plan_status(env: &Env, name: &str) -> String {
    env.sm
        .describe_training_plan()
        .training_plan_name(name)
        .send()
        .await
        .unwrap()
        .status()
        .unwrap()
        .as_str()
        .to_string()
}

pub fn job(
    env: &Env,
    name: &str,
    ty: &str,
    count: i32,
    plan: Option<&str>,
    runtime: i32,
) -> aws_sdk_sagemaker::operation::create_training_job::builders::CreateTrainingJobFluentBuilder {
    env.sm
        .create_training_job()
        .training_job_name(name)
        .role_arn("arn:aws:iam::123456789012:role/sagemaker")
        .algorithm_specification(
            AlgorithmSpecification::builder()
                .training_image("123456789012.dkr.ecr.us-east-1.amazonaws.com/train:latest")
                .training_input_mode(TrainingInputMode::File)
                .build(),
        )
        .output_data_config(
            OutputDataConfig::builder()
                .s3_output_path("s3://bucket/out")
                .build(),
        )
        .resource_config(
            ResourceConfig::builder()
                .instance_type(TrainingInstanceType::from(ty))
                .instance_count(count)
                .volume_size_in_gb(100)
                .set_training_plan_arn(plan.map(str::to_string))
                .build(),
        )
        .stopping_condition(
            StoppingCondition::builder()
                .max_runtime_in_seconds(runtime)
                .build(),
        )
        // Its work fits its runtime: it completes then.
        .hyper_parameters(local_cloud::sagemaker::WORK_SECONDS, runtime.to_string())
}

pub(crate) async fn job_status(env: &Env, name: &str) -> (String, String) {
    let out = env
        .sm
        .describe_training_job()
        .training_job_name(name)
        .send()
        .await
        .unwrap();
    (
        out.training_job_status().unwrap().as_str().to_string(),
        out.secondary_status().unwrap().as_str().to_string(),
    )
}

#[tokio::test]
async fn plan_offerings_carry_their_segments_and_price() {
    let env = env().await;
    let offers = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        8,
        72,
        SageMakerResourceName::TrainingJob,
    )
    .await;
    assert!(!offers.is_empty() && offers.len() <= 3);
    for o in &offers {
        assert!(o.training_plan_offering_id().unwrap().starts_with("tpo-"));
        assert_eq!(o.target_resources(), [SageMakerResourceName::TrainingJob]);
        // 72 h, or (starting off 11:30, aws-reference §11.2) the partial first day with 72 h
        // or 48 h after it
        let minutes = o.duration_hours().unwrap() * 60 + o.duration_minutes().unwrap_or(0);
        let start = chrono_of(o.reserved_capacity_offerings()[0].start_time().unwrap());
        let partial = (start.hour(), start.minute()) != (11, 30);
        assert!(
            minutes == 72 * 60 || (partial && 48 * 60 < minutes && minutes < 96 * 60),
            "{minutes}"
        );
        assert_eq!(o.currency_code(), Some("USD"));
        let fee: rust_decimal::Decimal = o.upfront_fee().unwrap().parse().unwrap();
        // 70-75% below SageMaker on-demand (55.04 * 1.15 per instance-hour)
        let od = "63.296".parse::<rust_decimal::Decimal>().unwrap()
            * rust_decimal::Decimal::from(8 * minutes)
            / rust_decimal::Decimal::from(60);
        assert!(
            fee >= od * "0.249".parse::<rust_decimal::Decimal>().unwrap(),
            "{fee}"
        );
        assert!(
            fee <= od * "0.301".parse::<rust_decimal::Decimal>().unwrap(),
            "{fee}"
        );
        let segs = o.reserved_capacity_offerings();
        assert!(!segs.is_empty() && segs.len() <= 2);
        for s in segs {
            assert_eq!(s.instance_type().unwrap().as_str(), "ml.p5.48xlarge");
            assert_eq!(s.instance_count(), Some(8));
            assert!(s.availability_zone().unwrap().starts_with("us-east-1"));
            let end = chrono_of(s.end_time().unwrap());
            assert_eq!((end.hour(), end.minute()), (11, 30));
            let length = end - chrono_of(s.start_time().unwrap());
            assert_eq!(s.duration_hours().unwrap(), length.num_hours());
            assert_eq!(s.duration_minutes().unwrap_or(0), length.num_minutes() % 60);
        }
    }
    let err = env
        .sm
        .search_training_plan_offerings()
        .instance_type(ReservedCapacityInstanceType::from("ml.p5.48xlarge"))
        .instance_count(3)
        .duration_hours(24)
        .target_resources(SageMakerResourceName::TrainingJob)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some("ValidationException"),
        "3 is not a plan instance count"
    );
}

#[tokio::test]
async fn a_plan_goes_pending_scheduled_active_expired_and_names_are_unique() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        4,
        48,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "team-a-plan", &offer).await;
    assert_eq!(
        arn,
        "arn:aws:sagemaker:us-east-1:123456789012:training-plan/team-a-plan"
    );
    // past the listing lag, before the payment clears
    env.cloud.step(TimeDelta::minutes(2));
    let d = env
        .sm
        .describe_training_plan()
        .training_plan_name("team-a-plan")
        .send()
        .await
        .unwrap();
    assert_eq!(d.status().unwrap().as_str(), "Pending");
    assert_eq!(d.training_plan_arn(), Some(arn.as_str()));
    assert_eq!(d.upfront_fee(), offer.upfront_fee());
    // (its capacities while Pending: a_pending_plan_shows_no_capacities_until_paid_unless_set)

    let dup = env
        .sm
        .create_training_plan()
        .training_plan_name("team-a-plan")
        .training_plan_offering_id(offer.training_plan_offering_id().unwrap())
        .send()
        .await
        .unwrap_err();
    assert!(
        dup.as_service_error().unwrap().is_resource_in_use(),
        "{dup:?}"
    );

    // Names ignore case (the harsher reading): another case is the same plan, described
    // under its own name, and cannot be bought again
    let dup = env
        .sm
        .create_training_plan()
        .training_plan_name("Team-A-Plan")
        .training_plan_offering_id(offer.training_plan_offering_id().unwrap())
        .send()
        .await
        .unwrap_err();
    assert!(
        dup.as_service_error().unwrap().is_resource_in_use(),
        "{dup:?}"
    );
    let d = env
        .sm
        .describe_training_plan()
        .training_plan_name("TEAM-A-PLAN")
        .send()
        .await
        .unwrap();
    assert_eq!(d.training_plan_name(), Some("team-a-plan"));

    let missing = env
        .sm
        .describe_training_plan()
        .training_plan_name("nope")
        .send()
        .await
        .unwrap_err();
    assert!(missing.as_service_error().unwrap().is_resource_not_found());
    let bad = env
        .sm
        .create_training_plan()
        .training_plan_name("x")
        .training_plan_offering_id("tpo-doesnotexist")
        .send()
        .await
        .unwrap_err();
    assert!(bad.as_service_error().unwrap().is_resource_not_found());

    env.cloud.step(TimeDelta::minutes(3));
    assert_eq!(plan_status(&env, "team-a-plan").await, "Scheduled");
    let segs = offer.reserved_capacity_offerings();
    let first = chrono_of(segs[0].start_time().unwrap());
    let last_end = chrono_of(segs[segs.len() - 1].end_time().unwrap());
    env.cloud.advance_to(first);
    assert_eq!(plan_status(&env, "team-a-plan").await, "Active");
    let d = env
        .sm
        .describe_training_plan()
        .training_plan_name(&arn)
        .send()
        .await
        .unwrap();
    assert_eq!(d.available_instance_count(), Some(4));
    assert_eq!(d.in_use_instance_count(), Some(0));
    env.cloud.advance_to(last_end);
    assert_eq!(plan_status(&env, "team-a-plan").await, "Expired");
    assert!(
        events_of(&env.cloud, "Capacity Block Delivered").is_empty(),
        "plans emit no events"
    );
}

#[tokio::test]
async fn training_plans_list_with_filters_and_pages() {
    let env = env().await;
    for n in 0..3 {
        let offer = plan_offerings(
            &env,
            "ml.trn1.32xlarge",
            1,
            24,
            SageMakerResourceName::TrainingJob,
        )
        .await
        .remove(0);
        buy_plan(&env, &format!("plan-{n}"), &offer).await;
    }
    // past the listing lag, before the payments clear
    env.cloud.step(TimeDelta::minutes(2));
    let first = env
        .sm
        .list_training_plans()
        .max_results(2)
        .send()
        .await
        .unwrap();
    assert_eq!(first.training_plan_summaries().len(), 2);
    let token = first.next_token().unwrap().to_string();
    let second = env
        .sm
        .list_training_plans()
        .max_results(2)
        .next_token(token)
        .send()
        .await
        .unwrap();
    assert_eq!(second.training_plan_summaries().len(), 1);
    assert!(second.next_token().is_none());
    let s = &first.training_plan_summaries()[0];
    assert_eq!(s.training_plan_name(), Some("plan-0"));
    assert_eq!(s.status().unwrap().as_str(), "Pending");
    assert!(s.start_time().is_some() && s.end_time().is_some());
    env.cloud.step(TimeDelta::minutes(3));
    let scheduled = env
        .sm
        .list_training_plans()
        .filters(
            TrainingPlanFilter::builder()
                .name(TrainingPlanFilterName::Status)
                .value("Scheduled")
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(scheduled.training_plan_summaries().len(), 3);
}

#[tokio::test]
async fn a_job_on_a_plan_waits_while_scheduled_then_trains_and_completes() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        2,
        48,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "job-plan", &offer).await;
    let created = job(&env, "job-1", "ml.p5.48xlarge", 2, Some(&arn), 3600)
        .send()
        .await
        .unwrap();
    assert_eq!(
        created.training_job_arn(),
        Some("arn:aws:sagemaker:us-east-1:123456789012:training-job/job-1")
    );
    assert_eq!(
        job_status(&env, "job-1").await,
        ("InProgress".into(), "Starting".into())
    );
    env.cloud.step(TimeDelta::minutes(10));
    assert_eq!(
        job_status(&env, "job-1").await,
        ("InProgress".into(), "Pending".into())
    );
    let start = chrono_of(offer.reserved_capacity_offerings()[0].start_time().unwrap());
    env.cloud.advance_to(start);
    assert_eq!(
        job_status(&env, "job-1").await,
        ("InProgress".into(), "Training".into())
    );
    let d = env
        .sm
        .describe_training_plan()
        .training_plan_name("job-plan")
        .send()
        .await
        .unwrap();
    assert_eq!(d.in_use_instance_count(), Some(2));
    assert_eq!(d.available_instance_count(), Some(0));
    env.cloud.step(TimeDelta::hours(1));
    let out = env
        .sm
        .describe_training_job()
        .training_job_name("job-1")
        .send()
        .await
        .unwrap();
    assert_eq!(out.training_job_status().unwrap().as_str(), "Completed");
    assert_eq!(chrono_of(out.training_start_time().unwrap()), start);
    assert_eq!(
        chrono_of(out.training_end_time().unwrap()),
        start + TimeDelta::hours(1)
    );
    assert!(
        out.model_artifacts()
            .unwrap()
            .s3_model_artifacts()
            .is_some()
    );
    assert_eq!(
        out.resource_config().unwrap().training_plan_arn(),
        Some(arn.as_str())
    );
    let statuses: Vec<&str> = out
        .secondary_status_transitions()
        .iter()
        .map(|t| t.status().unwrap().as_str())
        .collect();
    assert_eq!(statuses, ["Starting", "Pending", "Training", "Completed"]);
    let events = events_of(&env.cloud, "SageMaker Training Job State Change");
    let last = events.last().unwrap();
    assert_eq!(last["source"], "aws.sagemaker");
    assert_eq!(last["detail"]["TrainingJobStatus"], "Completed");
    assert_eq!(last["resources"][0], created.training_job_arn().unwrap());
}

/// SageMaker ends a job at its `MaxRuntimeInSeconds`: `Stopped`, secondary status
/// `MaxRuntimeExceeded` (DescribeTrainingJob's `SecondaryStatus`). A job whose work is not
/// given (no `local-work-seconds`) outlasts its runtime; one whose work is shorter completes.
#[tokio::test]
async fn a_job_whose_work_outlasts_its_runtime_is_stopped_at_max_runtime_exceeded() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        2,
        48,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "runtime-plan", &offer).await;
    let long = job(&env, "long-job", "ml.p5.48xlarge", 1, Some(&arn), 3600)
        .set_hyper_parameters(None)
        .send()
        .await
        .unwrap();
    job(&env, "short-job", "ml.p5.48xlarge", 1, Some(&arn), 3600)
        .hyper_parameters(local_cloud::sagemaker::WORK_SECONDS, "1800")
        .send()
        .await
        .unwrap();
    let start = chrono_of(offer.reserved_capacity_offerings()[0].start_time().unwrap());
    env.cloud.advance_to(start);
    env.cloud.step(TimeDelta::minutes(30));
    assert_eq!(job_status(&env, "short-job").await.0, "Completed");
    assert_eq!(
        job_status(&env, "long-job").await,
        ("InProgress".into(), "Training".into())
    );
    env.cloud.step(TimeDelta::minutes(30));
    assert_eq!(
        job_status(&env, "long-job").await,
        ("Stopped".into(), "MaxRuntimeExceeded".into())
    );
    let out = env
        .sm
        .describe_training_job()
        .training_job_name("long-job")
        .send()
        .await
        .unwrap();
    assert_eq!(
        chrono_of(out.training_end_time().unwrap()),
        start + TimeDelta::hours(1)
    );
    let events = events_of(&env.cloud, "SageMaker Training Job State Change");
    assert!(events.iter().any(|e| {
        e["resources"][0] == long.training_job_arn().unwrap()
            && e["detail"]["TrainingJobStatus"] == "Stopped"
    }));
}

#[tokio::test]
async fn a_job_still_training_is_terminated_30_minutes_before_the_plan_ends() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "short-plan", &offer).await;
    job(
        &env,
        "long-job",
        "ml.p5.48xlarge",
        1,
        Some(&arn),
        5 * 86_400,
    )
    .send()
    .await
    .unwrap();
    let seg = &offer.reserved_capacity_offerings()[0];
    let end = chrono_of(seg.end_time().unwrap());
    env.cloud.advance_to(chrono_of(seg.start_time().unwrap()));
    assert_eq!(job_status(&env, "long-job").await.1, "Training");
    env.cloud.advance_to(end - TimeDelta::minutes(31));
    assert_eq!(job_status(&env, "long-job").await.1, "Training");
    env.cloud.advance_to(end - TimeDelta::minutes(30));
    let out = env
        .sm
        .describe_training_job()
        .training_job_name("long-job")
        .send()
        .await
        .unwrap();
    assert_eq!(out.training_job_status().unwrap().as_str(), "Failed");
    assert!(out.failure_reason().unwrap().starts_with("CapacityError"));
}

#[tokio::test]
async fn an_on_demand_job_without_capacity_fails_asynchronously() {
    let env = env().await;
    // the seeded market has no on-demand UltraServer capacity
    job(&env, "od-job", "ml.p6e-gb200.36xlarge", 1, None, 3600)
        .send()
        .await
        .unwrap();
    assert_eq!(job_status(&env, "od-job").await.0, "InProgress");
    env.cloud.step(TimeDelta::minutes(2));
    let out = env
        .sm
        .describe_training_job()
        .training_job_name("od-job")
        .send()
        .await
        .unwrap();
    assert_eq!(out.training_job_status().unwrap().as_str(), "Failed");
    assert!(out.failure_reason().unwrap().contains("CapacityError"));
    // and one with capacity trains
    job(&env, "small-job", "ml.m5.large", 1, None, 600)
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(2));
    assert_eq!(job_status(&env, "small-job").await.1, "Training");
    env.cloud.step(TimeDelta::minutes(10));
    assert_eq!(job_status(&env, "small-job").await.0, "Completed");
}

#[tokio::test]
async fn job_errors_use_the_codes_sagemaker_really_returns() {
    let env = env().await;
    let err = env
        .sm
        .describe_training_job()
        .training_job_name("ghost")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    assert_eq!(err.message(), Some("Requested resource not found."));
    job(&env, "twice", "ml.m5.large", 1, None, 600)
        .send()
        .await
        .unwrap();
    let err = job(&env, "twice", "ml.m5.large", 1, None, 600)
        .send()
        .await
        .unwrap_err();
    assert!(err.as_service_error().unwrap().is_resource_in_use());
    let err = env
        .sm
        .create_training_job()
        .training_job_name("bare")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    // a plan for endpoints cannot run training jobs
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::Endpoint,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "endpoint-plan", &offer).await;
    let err = job(&env, "wrong-target", "ml.p5.48xlarge", 1, Some(&arn), 600)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));

    // stopping
    env.sm
        .stop_training_job()
        .training_job_name("twice")
        .send()
        .await
        .unwrap();
    assert_eq!(
        job_status(&env, "twice").await,
        ("Stopping".into(), "Stopping".into())
    );
    env.cloud.step(TimeDelta::minutes(1));
    assert_eq!(
        job_status(&env, "twice").await,
        ("Stopped".into(), "Stopped".into())
    );
    let err = env
        .sm
        .stop_training_job()
        .training_job_name("twice")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("ValidationException"));
    let err = env
        .sm
        .stop_training_job()
        .training_job_name("ghost")
        .send()
        .await
        .unwrap_err();
    assert!(err.as_service_error().unwrap().is_resource_not_found());
}

#[tokio::test]
async fn a_failed_plan_payment_fails_the_plan_and_its_waiting_jobs() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    let arn = buy_plan(&env, "unpaid-plan", &offer).await;
    job(&env, "orphan", "ml.p5.48xlarge", 1, Some(&arn), 600)
        .send()
        .await
        .unwrap();
    let (code, _) = http(
        &env.cloud.url(),
        "POST",
        "/_local/training-plans/us-east-1/unpaid-plan/fail-payment",
        None,
    )
    .await;
    assert_eq!(code, 204);
    // the payment fails at its payment time, 5 minutes after the purchase; until then the
    // plan is Pending and the job waits
    env.cloud.step(TimeDelta::minutes(4));
    assert_eq!(plan_status(&env, "unpaid-plan").await, "Pending");
    assert_eq!(job_status(&env, "orphan").await.0, "InProgress");
    env.cloud.step(TimeDelta::minutes(1));
    assert_eq!(plan_status(&env, "unpaid-plan").await, "Failed");
    let out = env
        .sm
        .describe_training_job()
        .training_job_name("orphan")
        .send()
        .await
        .unwrap();
    assert_eq!(out.training_job_status().unwrap().as_str(), "Failed");
    // the capacity went back to the market: the same offering can be bought again
    buy_plan(&env, "paid-plan", &offer).await;
}

#[tokio::test]
async fn without_contiguous_capacity_a_plan_splits_and_its_job_resumes_in_the_second_segment() {
    let env = env().await;
    // sell out every other market day in every zone, so no two-day block exists
    env.cloud.with_world(|w| {
        let first = local_cloud::util::market_day(w.now);
        for d in (first..first + 60).step_by(2) {
            for az in w.market.region("us-east-1").azs {
                w.market.consume(
                    local_cloud::market::Pool::TrainingPlan,
                    "us-east-1",
                    &az,
                    "ml.trn1.32xlarge",
                    (
                        local_cloud::util::day_start(d),
                        local_cloud::util::day_start(d + 1),
                    ),
                    64,
                );
            }
        }
    });
    let offers = plan_offerings(
        &env,
        "ml.trn1.32xlarge",
        1,
        48,
        SageMakerResourceName::TrainingJob,
    )
    .await;
    assert!(!offers.is_empty());
    assert!(
        offers
            .iter()
            .all(|o| o.reserved_capacity_offerings().len() == 2)
    );
    let offer = offers[0].clone();
    let segs = offer.reserved_capacity_offerings();
    assert_eq!(segs[0].duration_hours(), Some(24));
    assert_eq!(segs[1].duration_hours(), Some(24));
    let (s1, e1) = (
        chrono_of(segs[0].start_time().unwrap()),
        chrono_of(segs[0].end_time().unwrap()),
    );
    let s2 = chrono_of(segs[1].start_time().unwrap());
    assert!(s2 > e1, "the segments are not contiguous");

    let arn = buy_plan(&env, "split-plan", &offer).await;
    job(
        &env,
        "resumable",
        "ml.trn1.32xlarge",
        1,
        Some(&arn),
        30 * 3600,
    )
    .send()
    .await
    .unwrap();
    env.cloud.advance_to(s1);
    assert_eq!(job_status(&env, "resumable").await.1, "Training");
    env.cloud.advance_to(e1 - TimeDelta::minutes(30));
    assert_eq!(
        job_status(&env, "resumable").await,
        ("InProgress".into(), "Pending".into())
    );
    env.cloud.advance_to(e1);
    assert_eq!(
        plan_status(&env, "split-plan").await,
        "Scheduled",
        "between segments"
    );
    env.cloud.advance_to(s2);
    assert_eq!(plan_status(&env, "split-plan").await, "Active");
    assert_eq!(job_status(&env, "resumable").await.1, "Training");
    // 23.5 h trained in the first segment; the remaining 6.5 h in the second
    env.cloud.advance_to(s2 + TimeDelta::minutes(6 * 60 + 29));
    assert_eq!(job_status(&env, "resumable").await.0, "InProgress");
    env.cloud.advance_to(s2 + TimeDelta::minutes(6 * 60 + 30));
    let out = env
        .sm
        .describe_training_job()
        .training_job_name("resumable")
        .send()
        .await
        .unwrap();
    assert_eq!(out.training_job_status().unwrap().as_str(), "Completed");
    assert_eq!(
        chrono_of(out.training_end_time().unwrap()),
        s2 + TimeDelta::minutes(390)
    );
}

#[tokio::test]
async fn a_plan_payment_clears_no_later_than_ten_minutes_before_its_first_segment() {
    let env = env().await;
    env.cloud
        .with_world(|w| w.settings.payment_minutes = 10 * 60);
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    let start = chrono_of(offer.reserved_capacity_offerings()[0].start_time().unwrap());
    assert!(
        start < t0() + TimeDelta::hours(6),
        "seed 42's first plan starts at {start}"
    );
    buy_plan(&env, "soon-plan", &offer).await;
    env.cloud.advance_to(start - TimeDelta::minutes(11));
    assert_eq!(plan_status(&env, "soon-plan").await, "Pending");
    env.cloud.advance_to(start - TimeDelta::minutes(10));
    assert_eq!(plan_status(&env, "soon-plan").await, "Scheduled");
}

#[tokio::test]
async fn a_plan_payment_clears_no_later_than_six_hours_after_the_purchase() {
    let env = env().await;
    env.cloud
        .with_world(|w| w.settings.payment_minutes = 10 * 60);
    let offer = env
        .sm
        .search_training_plan_offerings()
        .instance_type(ReservedCapacityInstanceType::from("ml.p5.48xlarge"))
        .instance_count(1)
        .duration_hours(24)
        .target_resources(SageMakerResourceName::TrainingJob)
        .start_time_after(smithy_of(t0() + TimeDelta::days(3)))
        .send()
        .await
        .unwrap()
        .training_plan_offerings()[0]
        .clone();
    buy_plan(&env, "later-plan", &offer).await;
    env.cloud
        .advance_to(t0() + TimeDelta::hours(6) - TimeDelta::seconds(1));
    assert_eq!(plan_status(&env, "later-plan").await, "Pending");
    env.cloud.advance_to(t0() + TimeDelta::hours(6));
    assert_eq!(plan_status(&env, "later-plan").await, "Scheduled");
}

/// Buys a plan tagged for a request, as the product does.
async fn buy_tagged_plan(
    env: &Env,
    name: &str,
    request: &str,
    offering: &TrainingPlanOffering,
) -> String {
    env.sm
        .create_training_plan()
        .training_plan_name(name)
        .training_plan_offering_id(offering.training_plan_offering_id().unwrap())
        .tags(
            aws_sdk_sagemaker::types::Tag::builder()
                .key("capacity-pilot:request-id")
                .value(request)
                .build(),
        )
        .send()
        .await
        .expect("create plan")
        .training_plan_arn()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_forced_payment_failure_fails_the_next_plan_bought_for_a_request_at_payment_time() {
    let env = env().await;
    let (status, _) = http(
        &env.cloud.url(),
        "POST",
        "/_local/payment-failures",
        Some(r#"{"request_id": "doomed-plan"}"#),
    )
    .await;
    assert_eq!(status, 204, "count defaults to 1");
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    buy_tagged_plan(&env, "lucky-plan", "lucky", &offer).await;
    let arn = buy_tagged_plan(&env, "doomed-plan-1", "doomed-plan", &offer).await;
    job(&env, "doomed-job", "ml.p5.48xlarge", 1, Some(&arn), 600)
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(4));
    assert_eq!(plan_status(&env, "doomed-plan-1").await, "Pending");
    env.cloud.step(TimeDelta::minutes(1));
    assert_eq!(plan_status(&env, "doomed-plan-1").await, "Failed");
    assert_eq!(plan_status(&env, "lucky-plan").await, "Scheduled");
    let d = env
        .sm
        .describe_training_plan()
        .training_plan_name("doomed-plan-1")
        .send()
        .await
        .unwrap();
    assert_eq!(
        d.reserved_capacity_summaries()[0]
            .status()
            .unwrap()
            .as_str(),
        "Failed"
    );
    let out = env
        .sm
        .describe_training_job()
        .training_job_name("doomed-job")
        .send()
        .await
        .unwrap();
    assert_eq!(out.training_job_status().unwrap().as_str(), "Failed");
    // the failure was used up: the next plan bought for the request pays
    buy_tagged_plan(&env, "doomed-plan-2", "doomed-plan", &offer).await;
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(plan_status(&env, "doomed-plan-2").await, "Scheduled");
}

#[tokio::test]
async fn a_new_plan_is_missing_from_describe_and_list_until_the_listing_lag_has_passed() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    // the create's own answer is unaffected
    let arn = buy_plan(&env, "lagging-plan", &offer).await;
    let listed = || async {
        let all = env.sm.list_training_plans().send().await.unwrap();
        let pending = env
            .sm
            .list_training_plans()
            .filters(
                TrainingPlanFilter::builder()
                    .name(TrainingPlanFilterName::Status)
                    .value("Pending")
                    .build(),
            )
            .send()
            .await
            .unwrap();
        (
            all.training_plan_summaries().len(),
            pending.training_plan_summaries().len(),
        )
    };
    for elapsed in [0, 119] {
        env.cloud.advance_to(t0() + TimeDelta::seconds(elapsed));
        for name in ["lagging-plan", arn.as_str()] {
            // asked by name or ARN, it is an unknown plan
            let err = env
                .sm
                .describe_training_plan()
                .training_plan_name(name)
                .send()
                .await
                .unwrap_err();
            assert!(
                err.as_service_error().unwrap().is_resource_not_found(),
                "{err:?}"
            );
        }
        assert_eq!(listed().await, (0, 0), "{elapsed} s");
    }
    // it exists meanwhile: a job can be created on it
    job(&env, "early-job", "ml.p5.48xlarge", 1, Some(&arn), 600)
        .send()
        .await
        .unwrap();

    env.cloud.advance_to(t0() + TimeDelta::seconds(120));
    assert_eq!(plan_status(&env, "lagging-plan").await, "Pending");
    assert_eq!(listed().await, (1, 1));
}

#[tokio::test]
async fn without_listing_lag_a_new_plan_is_described_at_once() {
    let env = env().await;
    env.cloud.with_world(|w| w.settings.listing_lag_seconds = 0);
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        1,
        24,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    buy_plan(&env, "at-once-plan", &offer).await;
    assert_eq!(plan_status(&env, "at-once-plan").await, "Pending");
    let all = env.sm.list_training_plans().send().await.unwrap();
    assert_eq!(all.training_plan_summaries().len(), 1);
}

#[tokio::test]
async fn a_type_a_region_does_not_sell_as_plans_answers_either_reading() {
    // aws-reference §11.2: no source says whether an unsupported (type, region) answers an
    // empty list or a ValidationException; the harsher (the error) is the default, and the
    // other is a setting.
    for (reading, expect_error) in [
        (local_cloud::PlanUnsupported::Error, true),
        (local_cloud::PlanUnsupported::Empty, false),
    ] {
        let env = env_in(
            local_cloud::Options {
                seed: 42,
                start: Some(t0()),
                settings: local_cloud::Settings {
                    plan_unsupported: reading,
                    ..local_cloud::Settings::default()
                },
                ..local_cloud::Options::default()
            },
            "eu-west-1",
        )
        .await;
        let got = env
            .sm
            .search_training_plan_offerings()
            .instance_type(ReservedCapacityInstanceType::from("ml.p5.48xlarge"))
            .instance_count(2)
            .duration_hours(48)
            .target_resources(SageMakerResourceName::TrainingJob)
            .send()
            .await;
        match got {
            Err(e) => {
                assert!(expect_error, "{reading:?}");
                assert_eq!(e.code(), Some("ValidationException"));
                assert!(
                    e.message()
                        .unwrap_or_default()
                        .contains("not supported for training plans in eu-west-1"),
                    "{e:?}"
                );
            }
            Ok(out) => {
                assert!(!expect_error, "{reading:?}");
                assert!(out.training_plan_offerings().is_empty());
            }
        }
        // A type it sells there answers offerings either way.
        let sold = plan_offerings(
            &env,
            "ml.p4d.24xlarge",
            2,
            48,
            SageMakerResourceName::TrainingJob,
        )
        .await;
        assert!(!sold.is_empty(), "{reading:?}");
    }
}

#[tokio::test]
async fn a_plan_search_answers_the_partial_first_day_shorter_and_longer_than_asked() {
    // aws-reference §11.2 "Training plan durations": plans start at least 30 min out and end
    // at 11:30 UTC, so lengths vary (a 15 h search: 15 h 51 min, 39 h 51 min and 24 h).
    let env = env().await;
    let offers = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        2,
        24,
        SageMakerResourceName::TrainingJob,
    )
    .await;
    let minutes: Vec<i64> = offers
        .iter()
        .map(|o| o.duration_hours().unwrap() * 60 + o.duration_minutes().unwrap_or(0))
        .collect();
    assert!(minutes.iter().any(|&m| m < 24 * 60), "{minutes:?}");
    assert!(minutes.iter().any(|&m| m > 24 * 60), "{minutes:?}");
    // each segment still ends at 11:30
    for o in &offers {
        for s in o.reserved_capacity_offerings() {
            let end = chrono_of(s.end_time().unwrap());
            assert_eq!((end.hour(), end.minute()), (11, 30));
        }
    }
}

#[tokio::test]
async fn a_pending_plan_shows_no_capacities_until_paid_unless_set() {
    // The harsher reading (sources silent; the model's minimum of both is 0): a Pending plan
    // has no ReservedCapacitySummaries and a TotalInstanceCount of 0, in DescribeTrainingPlan
    // and ListTrainingPlans alike, until its payment clears
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        4,
        48,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    buy_plan(&env, "bare-plan", &offer).await;
    env.cloud.step(TimeDelta::minutes(2));
    let d = env
        .sm
        .describe_training_plan()
        .training_plan_name("bare-plan")
        .send()
        .await
        .unwrap();
    assert_eq!(d.status().unwrap().as_str(), "Pending");
    assert_eq!(d.total_instance_count(), Some(0));
    assert!(d.reserved_capacity_summaries().is_empty());
    assert!(d.start_time().is_some() && d.end_time().is_some());
    let listed = env.sm.list_training_plans().send().await.unwrap();
    let s = &listed.training_plan_summaries()[0];
    assert_eq!(s.status().unwrap().as_str(), "Pending");
    assert_eq!(s.total_instance_count(), Some(0));
    assert!(s.reserved_capacity_summaries().is_empty());
    // paid: its count and one summary per segment
    env.cloud.step(TimeDelta::minutes(4));
    let d = env
        .sm
        .describe_training_plan()
        .training_plan_name("bare-plan")
        .send()
        .await
        .unwrap();
    assert_eq!(d.status().unwrap().as_str(), "Scheduled");
    assert_eq!(d.total_instance_count(), Some(4));
    assert_eq!(
        d.reserved_capacity_summaries().len(),
        offer.reserved_capacity_offerings().len()
    );

    // With the setting off, a Pending plan shows them from the start
    let env = env_with_settings(local_cloud::Settings {
        pending_plan_without_capacities: false,
        ..local_cloud::Settings::default()
    })
    .await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        4,
        48,
        SageMakerResourceName::TrainingJob,
    )
    .await
    .remove(0);
    buy_plan(&env, "full-plan", &offer).await;
    env.cloud.step(TimeDelta::minutes(2));
    let d = env
        .sm
        .describe_training_plan()
        .training_plan_name("full-plan")
        .send()
        .await
        .unwrap();
    assert_eq!(d.status().unwrap().as_str(), "Pending");
    assert_eq!(d.total_instance_count(), Some(4));
    assert_eq!(
        d.reserved_capacity_summaries().len(),
        offer.reserved_capacity_offerings().len()
    );
    assert!(
        d.reserved_capacity_summaries()[0]
            .reserved_capacity_arn()
            .unwrap()
            .contains(":reserved-capacity/")
    );
}
