//! A team extends its Capacity Block or training plan by hand, in the console, outside the
//! product (issue 57): the control API's `extend` routes take EC2's extension path for a block
//! and move a plan's end as `ExtendTrainingPlan` would; the Expiration Warning of a block's old
//! end, by the setting `warning_follows_extension`.

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_sagemaker::types::SageMakerResourceName;
use chrono::{DateTime, TimeDelta, Utc};
use local_cloud::market::Pool;
use serde_json::Value;

use crate::ec2_blocks::{buy, describe, offerings};
use crate::ec2_instances::{into_block, subnet_in, template};
use crate::helpers::*;
use crate::sagemaker_plans::{buy_plan, job, job_status, plan_offerings};

fn event_time_of(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

async fn extend_block(env: &Env, id: &str, hours: i64) -> (u16, Value) {
    http(
        &env.cloud.url(),
        "POST",
        &format!("/_local/capacity-reservations/{id}/extend"),
        Some(&format!(r#"{{"hours": {hours}}}"#)),
    )
    .await
}

async fn extend_plan(env: &Env, name: &str, hours: i64) -> (u16, Value) {
    http(
        &env.cloud.url(),
        "POST",
        &format!("/_local/training-plans/us-east-1/{name}/extend"),
        Some(&format!(r#"{{"hours": {hours}}}"#)),
    )
    .await
}

#[tokio::test]
async fn a_block_extended_through_the_control_api_is_payment_pending_then_ends_later() {
    let env = env().await;
    let offer = offerings(&env, "p5.48xlarge", 1, 48).await.remove(0);
    let id = buy(&env, &offer, "by-hand")
        .await
        .capacity_reservation_id()
        .unwrap()
        .to_string();
    let end = chrono_of(offer.end_date().unwrap());
    let az = offer.availability_zone().unwrap().to_string();

    // GIVEN a block whose payment is still pending: the API's rule refuses an extension
    let (status, body) = extend_block(&env, &id, 24).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("InvalidParameterValue"))
    );

    // WHEN it is paid (scheduled), the refusals are the API's: a duration the block rules
    // refuse, an unknown block, and days its zone has no capacity for (the API's empty
    // list of offerings)
    env.cloud.step(TimeDelta::minutes(5));
    let (status, body) = extend_block(&env, &id, 25).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("InvalidParameterValue"))
    );
    let (status, body) = extend_block(&env, "cr-00000000000000000", 24).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("InvalidCapacityReservationId.NotFound"))
    );
    env.cloud.with_world(|w| {
        w.market.consume(
            Pool::CapacityBlock,
            "us-east-1",
            &az,
            "p5.48xlarge",
            (end + TimeDelta::hours(24), end + TimeDelta::hours(48)),
            10_000,
        )
    });
    let (status, body) = extend_block(&env, &id, 48).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("NoExtensionOffering"))
    );
    assert!(
        body["message"].as_str().unwrap().contains("no capacity"),
        "{body}"
    );

    // ... and extended by a day, it is payment-pending from the old end to a day later
    let (status, body) = extend_block(&env, &id, 24).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "payment-pending");
    assert_eq!(body["hours"], 24);
    let new_end = end + TimeDelta::hours(24);
    assert_eq!(body["start"], event_time_of(end));
    assert_eq!(body["end"], event_time_of(new_end));
    assert!(body["offering_id"].as_str().unwrap().starts_with("cbe-"));

    // THEN until it is paid the block keeps its end, and another extension is refused as the
    // API refuses one while an extension is payment-pending
    env.cloud.step(TimeDelta::minutes(2));
    assert_eq!(
        chrono_of(describe(&env, &id).await.end_date().unwrap()),
        end
    );
    let (status, _) = extend_block(&env, &id, 24).await;
    assert_eq!(status, 400);
    let err = env
        .ec2
        .describe_capacity_block_extension_offerings()
        .capacity_reservation_id(&id)
        .capacity_block_extension_duration_hours(24)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterValue"));

    // ... and once paid, DescribeCapacityReservations reports the new end, the block still
    // scheduled under the same id
    env.cloud.step(TimeDelta::minutes(3));
    let cr = describe(&env, &id).await;
    assert_eq!(chrono_of(cr.end_date().unwrap()), new_end);
    assert_eq!(cr.state().unwrap().as_str(), "scheduled");
    env.cloud.advance_to(end);
    assert_eq!(
        describe(&env, &id).await.state().unwrap().as_str(),
        "active"
    );
    env.cloud.advance_to(new_end);
    assert_eq!(
        describe(&env, &id).await.state().unwrap().as_str(),
        "expired"
    );
}

/// A block of one instance, active with an instance running in it, extended by hand by a day
/// and paid: its id, old end, new end and the instance's id.
async fn running_block_extended_by_hand(
    env: &Env,
) -> (String, DateTime<Utc>, DateTime<Utc>, String) {
    let offer = offerings(env, "p5.48xlarge", 1, 48).await.remove(0);
    let id = buy(env, &offer, "warned")
        .await
        .capacity_reservation_id()
        .unwrap()
        .to_string();
    let (start, end) = (
        chrono_of(offer.start_date().unwrap()),
        chrono_of(offer.end_date().unwrap()),
    );
    let subnet = subnet_in(env, offer.availability_zone().unwrap()).await;
    env.cloud.advance_to(start + TimeDelta::minutes(5));
    let (market, target) = into_block(&id);
    let out = env
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
        .unwrap();
    let instance = out.instances()[0].instance_id().unwrap().to_string();
    let (status, body) = extend_block(env, &id, 24).await;
    assert_eq!(status, 200, "{body}");
    env.cloud.step(TimeDelta::minutes(5));
    let new_end = end + TimeDelta::hours(24);
    assert_eq!(
        chrono_of(describe(env, &id).await.end_date().unwrap()),
        new_end
    );
    (id, end, new_end, instance)
}

fn instance_state(env: &Env, id: &str) -> (String, Option<String>) {
    env.cloud.with_world(|w| {
        let i = &w.ec2.instances[id];
        (
            i.state.clone(),
            i.state_reason.as_ref().map(|(c, _)| c.clone()),
        )
    })
}

const WARNING: &str = "Capacity Block Expiration Warning";
const INTERRUPTION: &str = "EC2 Capacity Reservation Instance Interruption Warning";

#[tokio::test]
async fn by_default_the_old_ends_warning_still_comes_naming_the_old_end_and_nothing_stops_then() {
    // GIVEN the default (harsher) reading: the warning does not follow an extension
    let env = env().await;
    assert!(
        !env.cloud
            .with_world(|w| w.settings.warning_follows_extension)
    );
    let (id, end, new_end, instance) = running_block_extended_by_hand(&env).await;

    // WHEN the old end's warning time comes
    env.cloud.advance_to(end - TimeDelta::minutes(41));
    assert!(events_of(&env.cloud, WARNING).is_empty());
    env.cloud.advance_to(end - TimeDelta::minutes(40));

    // THEN the Expiration Warning comes, naming the old end, while the block is active; no
    // instance is warned
    let warnings = events_of(&env.cloud, WARNING);
    assert_eq!(warnings.len(), 1);
    assert_eq!(
        warnings[0]["time"],
        event_time_of(end - TimeDelta::minutes(40))
    );
    assert_eq!(warnings[0]["detail"]["end-date"], event_time_of(end));
    assert_eq!(
        warnings[0]["detail"]["capacity-reservation-id"],
        id.as_str()
    );
    assert!(events_of(&env.cloud, INTERRUPTION).is_empty());

    // ... nothing is terminated at the old end's termination time, nor at the old end: the
    // block runs on, active, to its new end
    env.cloud.advance_to(end + TimeDelta::minutes(1));
    assert_eq!(instance_state(&env, &instance), ("running".into(), None));
    let cr = describe(&env, &id).await;
    assert_eq!(cr.state().unwrap().as_str(), "active");
    assert_eq!(chrono_of(cr.end_date().unwrap()), new_end);
    assert_eq!(events_of(&env.cloud, WARNING).len(), 1);
    assert!(events_of(&env.cloud, INTERRUPTION).is_empty());

    // ... and the new end warns too, at its own time, with the instance's interruption
    // warning, and terminates it then
    env.cloud.advance_to(new_end - TimeDelta::minutes(40));
    let warnings = events_of(&env.cloud, WARNING);
    assert_eq!(warnings.len(), 2);
    assert_eq!(warnings[1]["detail"]["end-date"], event_time_of(new_end));
    let interruptions = events_of(&env.cloud, INTERRUPTION);
    assert_eq!(interruptions.len(), 1);
    assert_eq!(interruptions[0]["detail"]["instance-id"], instance.as_str());
    assert_eq!(
        interruptions[0]["detail"]["instance-termination-time"],
        event_time_of(new_end - TimeDelta::minutes(30))
    );
    env.cloud.advance_to(new_end - TimeDelta::minutes(30));
    assert_eq!(
        instance_state(&env, &instance),
        ("shutting-down".into(), Some("Server.ScheduledStop".into()))
    );
}

#[tokio::test]
async fn when_the_warning_follows_the_extension_the_old_end_does_not_warn() {
    // GIVEN the other reading, set as a scenario or test would, through the settings route
    let env = env().await;
    let (status, body) = http(
        &env.cloud.url(),
        "PATCH",
        "/_local/settings",
        Some(r#"{"warning_follows_extension": true}"#),
    )
    .await;
    assert_eq!(
        (status, &body["warning_follows_extension"]),
        (200, &Value::Bool(true))
    );
    let (_, end, new_end, instance) = running_block_extended_by_hand(&env).await;

    // WHEN the old end passes
    env.cloud.advance_to(end + TimeDelta::minutes(1));

    // THEN no warning came for it, and the instance runs on
    assert!(events_of(&env.cloud, WARNING).is_empty());
    assert_eq!(instance_state(&env, &instance), ("running".into(), None));

    // ... and only the new end warns
    env.cloud.advance_to(new_end - TimeDelta::minutes(40));
    let warnings = events_of(&env.cloud, WARNING);
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0]["detail"]["end-date"], event_time_of(new_end));
    assert_eq!(events_of(&env.cloud, INTERRUPTION).len(), 1);
}

#[tokio::test]
async fn a_plan_extended_through_the_control_api_ends_later_and_its_job_trains_past_the_old_end() {
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
    let arn = buy_plan(&env, "by-hand-plan", &offer).await;
    let segs = offer.reserved_capacity_offerings();
    let start = chrono_of(segs[0].start_time().unwrap());
    let end = chrono_of(segs[segs.len() - 1].end_time().unwrap());
    let new_end = end + TimeDelta::hours(24);

    // GIVEN a plan still Pending: only a Scheduled or Active plan can be extended
    let (status, body) = extend_plan(&env, "by-hand-plan", 24).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("ValidationException"))
    );

    // ... a job training on it once its segment has started
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
    env.cloud.advance_to(start);
    assert_eq!(job_status(&env, "long-job").await.1, "Training");
    let describe = || async {
        env.sm
            .describe_training_plan()
            .training_plan_name("by-hand-plan")
            .send()
            .await
            .unwrap()
    };
    let before = describe().await;
    assert_eq!(before.status().unwrap().as_str(), "Active");

    // WHEN the team asks for hours that are not whole days, or for an unknown plan, it is
    // refused
    let (status, body) = extend_plan(&env, "by-hand-plan", 25).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("ValidationException"))
    );
    let (status, body) = extend_plan(&env, "no-such-plan", 24).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("ResourceNotFound"))
    );

    // ... and extending it by a day is pending its payment, the plan's end unchanged, and a
    // second extension meanwhile refused
    let (status, body) = extend_plan(&env, "by-hand-plan", 24).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["payment_status"], "Pending");
    assert_eq!(body["start"], event_time_of(end));
    assert_eq!(body["end"], event_time_of(new_end));
    assert_eq!(
        chrono_of(describe().await.end_time().unwrap()),
        end,
        "the end moves when the extension is paid"
    );
    let (status, _) = extend_plan(&env, "by-hand-plan", 24).await;
    assert_eq!(status, 400);
    env.cloud.step(TimeDelta::minutes(5));

    // THEN the plan and its last reserved capacity end a day later, its duration and fee grew
    let after = describe().await;
    assert_eq!(chrono_of(after.end_time().unwrap()), new_end);
    let summaries = after.reserved_capacity_summaries();
    assert_eq!(
        summaries.len(),
        segs.len(),
        "the last summary is lengthened"
    );
    let last = &summaries[summaries.len() - 1];
    assert_eq!(chrono_of(last.end_time().unwrap()), new_end);
    assert_eq!(
        last.duration_hours(),
        before.reserved_capacity_summaries()[segs.len() - 1]
            .duration_hours()
            .map(|h| h + 24)
    );
    assert_eq!(
        after.duration_hours(),
        before.duration_hours().map(|h| h + 24)
    );
    let fee = |v: Option<&str>| v.unwrap().parse::<f64>().unwrap();
    assert!(fee(after.upfront_fee()) > fee(before.upfront_fee()));

    // ... and the job is not stopped at the old end, only 30 minutes before the new one
    env.cloud.advance_to(end - TimeDelta::minutes(30));
    assert_eq!(job_status(&env, "long-job").await.1, "Training");
    env.cloud.advance_to(end + TimeDelta::hours(1));
    assert_eq!(job_status(&env, "long-job").await.1, "Training");
    assert_eq!(describe().await.status().unwrap().as_str(), "Active");
    env.cloud.advance_to(new_end - TimeDelta::minutes(30));
    assert_eq!(job_status(&env, "long-job").await.0, "Failed");
}
