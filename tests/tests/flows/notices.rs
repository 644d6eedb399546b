//! Notices on the production wiring (ARCHITECTURE §9.2): what the outbox publishes to the
//! notices topic, local-cloud's SNS, beside the bus. The lead-time notices on time, late and
//! skipped; a lead whose moment came before the purchase; a team's filter policy.

use aws_sdk_dynamodb::config::{Credentials, Region};
use capacity_pilot::domain::request::RequestId;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::Store;
use chrono::{DateTime, TimeDelta, Utc};
use integration_tests::flow::{Flow, Function, NOTICES_TOPIC, REGION};
use serde_json::{Value, json};

fn time_of(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

/// What the notices topic received about `id`, oldest first.
fn told(f: &Flow, id: &str) -> Vec<Value> {
    f.cloud
        .sns_messages()
        .into_iter()
        .filter(|m| m["attributes"]["request_id"] == id)
        .collect()
}

/// `(detail_type, lead_minutes, late)` of each lead-time notice on the bus about `id`.
fn leads(f: &Flow, id: &str) -> Vec<(String, i64, bool)> {
    f.cloud
        .events(integration_tests::flow::BUS)
        .into_iter()
        .filter(|e| {
            e["detail"]["request_id"] == id
                && ["Capacity Window Opening", "Capacity Reservation Ending"]
                    .contains(&e["detail-type"].as_str().unwrap_or_default())
        })
        .map(|e| {
            (
                e["detail-type"].as_str().unwrap().to_string(),
                e["detail"]["lead_minutes"].as_i64().unwrap(),
                e["detail"]["late"] == true,
            )
        })
        .collect()
}

/// The reasons in `id`'s history, oldest first.
async fn history(f: &Flow, id: &str) -> Vec<String> {
    f.cleaner
        .store
        .history(&RequestId::parse(id).unwrap())
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.reason)
        .collect()
}

/// Submits `request` and delivers until it is Reserved; returns the Reserved event.
async fn reserve(f: &Flow, request: Value) -> Value {
    let id = request["request_id"].as_str().unwrap().to_string();
    f.submit(request).await;
    f.deliver().await;
    assert_eq!(f.status(&id).await, RequestStatus::Reserved);
    let r = f.bus_for("Capacity Reserved", &id);
    assert_eq!(r.len(), 1, "{r:#?}");
    r[0].clone()
}

async fn cleanup_at(f: &Flow, t: DateTime<Utc>) {
    f.cloud.advance_to(t);
    f.tick(Function::Cleanup).await.unwrap();
}

#[tokio::test]
pub(crate) async fn each_lead_time_notice_goes_on_time_late_or_is_recorded_as_skipped() {
    // GIVEN a 48 h block bought days ahead, cleanup looking at it once just after
    let f = Flow::start().await;
    let id = "notice-1";
    let reserved = reserve(&f, f.ec2_request(id)).await;
    let start = time_of(&reserved["detail"]["start"]);
    let end = time_of(&reserved["detail"]["end"]);
    let drain = end - TimeDelta::minutes(45);
    assert!(
        start - TimeDelta::hours(24) > f.cloud.now(),
        "bought days ahead"
    );
    f.tick(Function::Cleanup).await.unwrap();
    assert!(leads(&f, id).is_empty(), "nothing is due yet");

    // WHEN the 24 h moment before the opening comes
    cleanup_at(&f, start - TimeDelta::hours(24)).await;
    // THEN the Window Opening notice goes on time, on the bus and to the topic
    assert_eq!(
        leads(&f, id),
        [("Capacity Window Opening".to_string(), 1440, false)]
    );
    let opening = told(&f, id)
        .into_iter()
        .find(|m| m["attributes"]["detail_type"] == "Capacity Window Opening")
        .expect("the topic was told");
    assert_eq!(opening["attributes"]["team"], "team-a");
    let body = opening["message"].as_str().unwrap();
    assert!(body.contains("opens at"), "{body}");
    assert!(
        body.contains(&format!("capacity-pilot status {id}")),
        "{body}"
    );

    // WHEN cleanup does not run again until the window has opened and launched
    f.cloud.advance_to(start + f.activation());
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Active);
    f.tick(Function::Cleanup).await.unwrap();
    // THEN the 1 h Opening notice is not sent (what it announced happened), and the
    // request's history says so
    assert_eq!(leads(&f, id).len(), 1, "{:?}", leads(&f, id));
    let said = history(&f, id).await;
    assert!(
        said.iter().any(|r| r.contains(
            "the 1 h Window Opening notice of window 0 was not sent: the window opened at"
        )),
        "{said:#?}"
    );

    // WHEN cleanup runs half an hour after the 24 h moment before the drain
    cleanup_at(&f, drain - TimeDelta::hours(24) + TimeDelta::minutes(30)).await;
    // THEN that Ending notice goes late, saying so
    assert_eq!(
        leads(&f, id)[1..],
        [("Capacity Reservation Ending".to_string(), 1440, true)]
    );
    // AND the 13 h and 1 h ones go on time, the last the checkpoint notice
    cleanup_at(&f, drain - TimeDelta::hours(13)).await;
    cleanup_at(&f, drain - TimeDelta::hours(1)).await;
    assert_eq!(
        leads(&f, id)[2..],
        [
            ("Capacity Reservation Ending".to_string(), 780, false),
            ("Capacity Reservation Ending".to_string(), 60, false),
        ]
    );
    let ending = f.bus_for("Capacity Reservation Ending", id);
    assert_eq!(ending[2]["detail"]["checkpoint"], true);
    assert_eq!(time_of(&ending[2]["detail"]["drain_at"]), drain);
    assert_eq!(ending[2]["detail"]["extendable"], false);

    // WHEN the drain comes on time
    cleanup_at(&f, drain).await;
    assert_eq!(f.status(id).await, RequestStatus::Draining);
    // THEN the topic heard each notice once, and nothing of a drain on time
    let kinds: Vec<String> = told(&f, id)
        .iter()
        .map(|m| m["attributes"]["detail_type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "Capacity Reserved",
            "Capacity Window Opening",
            "Capacity Workload Launched",
            "Capacity Reservation Ending",
            "Capacity Reservation Ending",
            "Capacity Reservation Ending",
        ]
    );
    // AND each subject fits SNS's limit and names the request
    for m in told(&f, id) {
        let subject = m["subject"].as_str().unwrap();
        assert!(subject.len() < 100 && subject.contains(id), "{subject}");
    }
}

#[tokio::test]
pub(crate) async fn a_lead_whose_moment_came_before_the_purchase_produces_nothing() {
    // GIVEN a block starting a few hours after its purchase (t0 is 09:00; the request's
    // window opens at 11:30 the same day)
    let f = Flow::start().await;
    let id = "notice-soon";
    let mut request = f.ec2_request(id);
    request["earliest_start"] = json!("2026-12-01T11:30:00Z");
    request["latest_end"] = json!("2026-12-03T11:30:00Z");
    let reserved = reserve(&f, request).await;
    let start = time_of(&reserved["detail"]["start"]);
    assert!(start - TimeDelta::hours(24) < f.cloud.now(), "{start}");
    assert!(start - TimeDelta::hours(1) > f.cloud.now(), "{start}");

    // WHEN cleanup looks at it just after the purchase, and again at the 1 h moment
    f.tick(Function::Cleanup).await.unwrap();
    // THEN the 24 h Opening notice is neither sent, late or otherwise, nor recorded as
    // skipped: it was never due
    assert!(leads(&f, id).is_empty(), "{:?}", leads(&f, id));
    cleanup_at(&f, start - TimeDelta::hours(1)).await;
    assert_eq!(
        leads(&f, id),
        [("Capacity Window Opening".to_string(), 60, false)]
    );
    let said = history(&f, id).await;
    assert!(
        !said.iter().any(|r| r.contains("24 h Window Opening")),
        "{said:#?}"
    );
}

#[tokio::test]
pub(crate) async fn a_teams_filter_policy_receives_only_its_own_notices() {
    // GIVEN two teams subscribed to the notices topic, each with a filter on its team, and an
    // operator subscribed to everything by email (confirmed)
    let f = Flow::start().await;
    let sdk = capacity_pilot::aws::wiring::sdk_loader()
        .endpoint_url(f.cloud.url())
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new("AKIDTEAMS", "secret", None, None, "teams"))
        .load()
        .await;
    let sns = aws_sdk_sns::Client::new(&sdk);
    let subscribe = |team: Option<&str>| {
        let sns = sns.clone();
        let team = team.map(str::to_string);
        async move {
            let (protocol, endpoint) = match &team {
                Some(t) => (
                    "sqs",
                    format!("arn:aws:sqs:us-east-1:123456789012:{t}-notices"),
                ),
                None => ("email", "oncall@example.com".to_string()),
            };
            let mut call = sns
                .subscribe()
                .topic_arn(NOTICES_TOPIC)
                .protocol(protocol)
                .endpoint(endpoint)
                .return_subscription_arn(true);
            if let Some(t) = &team {
                call = call.attributes("FilterPolicy", json!({"team": [t]}).to_string());
            }
            call.send().await.unwrap().subscription_arn.unwrap()
        }
    };
    let team_a = subscribe(Some("team-a")).await;
    let team_b = subscribe(Some("team-b")).await;
    let oncall = subscribe(None).await;
    f.cloud.confirm_sns_subscription(&oncall).unwrap();

    // WHEN each team's request is bought
    reserve(&f, f.ec2_request("a-notice")).await;
    let mut b = f.ec2_request("b-notice");
    b["team"] = json!("team-b");
    reserve(&f, b).await;

    // THEN each team's subscription received its own team's notices and none of the other's,
    // and the unfiltered one all of them
    let messages = f.cloud.sns_messages();
    let reached = |sub: &str| -> Vec<(String, String)> {
        messages
            .iter()
            .filter(|m| {
                m["deliveries"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|s| s == sub))
            })
            .map(|m| {
                (
                    m["attributes"]["team"].as_str().unwrap_or("-").to_string(),
                    m["attributes"]["request_id"]
                        .as_str()
                        .unwrap_or("-")
                        .to_string(),
                )
            })
            .collect()
    };
    let (a, b, all) = (reached(&team_a), reached(&team_b), reached(&oncall));
    assert!(!a.is_empty() && !b.is_empty(), "{messages:#?}");
    assert!(
        a.iter().all(|(t, r)| t == "team-a" && r == "a-notice"),
        "{a:?}"
    );
    assert!(
        b.iter().all(|(t, r)| t == "team-b" && r == "b-notice"),
        "{b:?}"
    );
    assert_eq!(all.len(), messages.len());
    assert_eq!(all.len(), a.len() + b.len());
}
