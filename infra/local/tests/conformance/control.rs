//! The control API over HTTP, as the local runner and other processes use it.

use chrono::TimeDelta;
use serde_json::json;

use crate::ec2_blocks::{buy, offerings};
use crate::helpers::*;

#[tokio::test]
async fn the_clock_is_read_and_stepped_only_through_the_control_api() {
    let env = env().await;
    let url = env.cloud.url();
    let (status, body) = http(&url, "GET", "/_local/clock", None).await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({"now": "2026-09-01T08:00:00Z"}));
    let (status, body) = http(
        &url,
        "POST",
        "/_local/clock/step",
        Some(r#"{"minutes": 90}"#),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["now"], "2026-09-01T09:30:00Z");
    let (status, _) = http(
        &url,
        "POST",
        "/_local/clock/step",
        Some(r#"{"to": "2026-09-01T09:00:00Z"}"#),
    )
    .await;
    assert_eq!(status, 400, "the clock never moves backwards");
    let (_, body) = http(&url, "GET", "/_local/clock/next", None).await;
    assert_eq!(
        body["next"],
        serde_json::Value::Null,
        "nothing is scheduled yet"
    );

    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    buy(&env, &offer, "ctl").await;
    let (_, body) = http(&url, "GET", "/_local/clock/next", None).await;
    assert_eq!(
        body["next"], "2026-09-01T09:35:00Z",
        "payment completes after 5 minutes"
    );
    let (_, body) = http(
        &url,
        "POST",
        "/_local/clock/step",
        Some(r#"{"next": true}"#),
    )
    .await;
    assert_eq!(body["now"], "2026-09-01T09:35:00Z");
    assert_eq!(body["transitions"], 1);
    // the next transition is the block's activation, 5 min after its start (ARCHITECTURE
    // §8.10)
    let start = chrono_of(offer.start_date().unwrap()) + chrono::TimeDelta::minutes(5);
    assert_eq!(body["next"], start.format("%Y-%m-%dT%H:%M:%SZ").to_string());
    let (_, body) = http(
        &url,
        "POST",
        "/_local/clock/step",
        Some(r#"{"next": true}"#),
    )
    .await;
    assert_eq!(body["now"], start.format("%Y-%m-%dT%H:%M:%SZ").to_string());
    let (_, body) = http(&url, "GET", "/_local/events/default", None).await;
    assert_eq!(body["events"][0]["detail-type"], "Capacity Block Delivered");
    assert_eq!(env.cloud.now(), start);
}

#[tokio::test]
async fn faults_settings_and_state_are_managed_over_http() {
    let env = env().await;
    let url = env.cloud.url();
    let (status, _) = http(
        &url,
        "POST",
        "/_local/faults",
        Some(r#"{"operation":"DescribeSubnets","kind":"throttle","count":2}"#),
    )
    .await;
    assert_eq!(status, 204);
    let (_, body) = http(&url, "GET", "/_local/faults", None).await;
    assert_eq!(body["faults"][0]["kind"], "throttle");
    assert!(env.ec2.describe_subnets().send().await.is_err());
    let (status, _) = http(&url, "DELETE", "/_local/faults", None).await;
    assert_eq!(status, 204);
    assert!(env.ec2.describe_subnets().send().await.is_ok());

    let (status, body) = http(
        &url,
        "PATCH",
        "/_local/settings",
        Some(r#"{"single_use_offerings": true, "reservation_event_names": true}"#),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["single_use_offerings"], true);
    let (status, _) = http(&url, "PATCH", "/_local/settings", Some(r#"{"no_such": 1}"#)).await;
    assert_eq!(status, 400);

    let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
    let cr = buy(&env, &offer, "snap").await;
    env.cloud.step(TimeDelta::minutes(5));
    let (_, state) = http(&url, "GET", "/_local/state", None).await;
    let crs = state["ec2"]["capacity_reservations"].as_array().unwrap();
    assert_eq!(crs.len(), 1);
    assert_eq!(crs[0]["id"], cr.capacity_reservation_id().unwrap());
    assert_eq!(crs[0]["state"], "scheduled");
    assert_eq!(state["now"], "2026-09-01T08:05:00+00:00");
    let (status, _) = http(
        &url,
        "POST",
        "/_local/instances/i-0000000000000000/impair",
        None,
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn each_emulator_has_its_own_clock_and_the_same_seed_gives_the_same_market() {
    let a = env().await;
    let b = env().await;
    a.cloud.step(TimeDelta::hours(3));
    assert_eq!(b.cloud.now(), t0());
    let oa = offerings(&b, "p5.48xlarge", 2, 48).await;
    let c = env().await;
    let oc = offerings(&c, "p5.48xlarge", 2, 48).await;
    assert_eq!(oa, oc);
}

#[tokio::test]
async fn the_same_seed_and_actions_replay_the_same_events() {
    let mut runs = Vec::new();
    for _ in 0..2 {
        let env = env().await;
        let offer = offerings(&env, "p5.48xlarge", 1, 24).await.remove(0);
        buy(&env, &offer, "replay").await;
        env.cloud.advance_to(chrono_of(offer.end_date().unwrap()));
        runs.push(env.cloud.events("default"));
    }
    assert!(!runs[0].is_empty());
    assert_eq!(runs[0], runs[1]);
}
