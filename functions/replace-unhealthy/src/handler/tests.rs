//! Replacing unhealthy instances against the in-memory fakes: once, into the same slot,
//! within both caps, and never an unmanaged instance.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::config::Config;
use capacity_pilot::domain::money::Usd;
use capacity_pilot::domain::naming::{MANAGED_TAG, REQUEST_TAG, client_token};
use capacity_pilot::domain::offering::{Product, Segment};
use capacity_pilot::domain::reservation::{Reservation, ReservationState};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::window::WindowState;
use capacity_pilot::fakes::fixtures::{request, request_id, t0};
use capacity_pilot::fakes::{
    FakeWorkloads, InMemoryStore, LaunchKind, ManualClock, RecordingEvents, WorkloadsCall,
    WorkloadsOp,
};
use capacity_pilot::ports::{
    Cause, InstanceHealth, InstanceInfo, InstanceState, LaunchMarket, LaunchSpec, Lease, PortError,
    RecordReservation, RequestRecord, Store, WorkloadRecord, Workloads,
};
use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use super::{REPLACING, Replacer, SCHEDULED_CHANGE_LEAD};

type R = Replacer<InMemoryStore, FakeWorkloads, RecordingEvents, ManualClock>;

const REGION: &str = "us-east-1";
const REPLACED: &str = "Capacity Instance Replaced";

struct World {
    store: InMemoryStore,
    workloads: FakeWorkloads,
    events: RecordingEvents,
    clock: ManualClock,
}

impl World {
    /// GIVEN an Active request r-1 with `count` instances running in block cr-1 (launched
    /// as launch-workloads does: one token per slot, generation 0).
    async fn new(count: u32) -> World {
        let w = World {
            store: InMemoryStore::new(),
            workloads: FakeWorkloads::new(),
            events: RecordingEvents::new(),
            clock: ManualClock::new(t0() + Duration::hours(3)),
        };
        w.workloads.add_subnet(REGION, "subnet-a", "us-east-1a");
        w.workloads
            .add_reservation_capacity("cr-1", count, Some("us-east-1a"));
        w.workloads
            .set_launch_state(InstanceState::Running, InstanceHealth::Ok);
        let mut req = request("r-1", "team-a", "50000");
        req.instance_count = count;
        let reservation = Reservation {
            id: "cr-1".into(),
            product: Product::CapacityBlock,
            region: REGION.into(),
            instance_type: "p5.48xlarge".into(),
            instance_count: count,
            segments: vec![Segment {
                start: t0() + Duration::hours(2),
                end: t0() + Duration::hours(26),
                availability_zone: Some("us-east-1a".into()),
            }],
            upfront_fee: Usd::parse("1000").unwrap(),
            state: ReservationState::Active,
            offering_id: None,
            request_tag: Some("r-1".into()),
            ultraserver: false,
            bought_at: None,
            debit_month: None,
            debit_team: None,
            payment_check_at: None,
            extensions: Vec::new(),
            extension_check_at: None,
            deployment_tag: None,
        };
        let mut rec = RequestRecord {
            reason: "seed".into(),
            lease: Some(Lease {
                token: "seed".into(),
                expires_at: t0() + Duration::days(30),
            }),
            ..capacity_pilot::fakes::fixtures::record(req.clone(), RequestStatus::Purchasing)
        };
        w.store.insert_record(rec.clone());
        w.store
            .record_reservation(RecordReservation {
                request_id: rec.request_id.clone(),
                lease_token: "seed".into(),
                reservation,
                to: RequestStatus::Reserved,
                reason: "seed".into(),
                next_action_at: None,
                at: t0(),
                caused_by: Cause::new("seed"),
                outbox: vec![],
                uncapped: None,
            })
            .await
            .unwrap();
        // The window runs (launch-workloads marked it so when it launched the instances).
        let recorded = w.store.get_request(&rec.request_id).await.unwrap().unwrap();
        rec.windows = recorded
            .windows
            .into_iter()
            .map(|mut x| {
                x.state = WindowState::Running;
                // A running window is next due at its drain (`Window::next_action_in`),
                // well before the block's end at +26 h.
                x.next_action_at = Some(t0() + Duration::hours(24));
                x
            })
            .collect();
        rec.status = RequestStatus::Active;
        rec.version = 5;
        rec.lease = None;
        rec.updated_at = t0() + Duration::hours(2);
        w.store.insert_record(rec);
        let mut tags = BTreeMap::new();
        tags.insert(MANAGED_TAG.to_string(), "true".to_string());
        tags.insert(REQUEST_TAG.to_string(), "r-1".to_string());
        for slot in 0..count {
            let launched = w
                .workloads
                .launch_instances(&LaunchSpec {
                    region: REGION.into(),
                    market: LaunchMarket::CapacityBlock {
                        reservation_id: "cr-1".into(),
                    },
                    instance_type: "p5.48xlarge".into(),
                    count: 1,
                    subnet_id: "subnet-a".into(),
                    launch_template: match &req.workload {
                        capacity_pilot::domain::request::WorkloadDetail::Ec2Instances {
                            launch_template,
                            ..
                        } => launch_template.clone().unwrap(),
                        _ => unreachable!(),
                    },
                    client_token: client_token("cr-1", slot, 0),
                    tags: tags.clone(),
                })
                .await
                .unwrap();
            w.store
                .put_workload(WorkloadRecord {
                    request_id: request_id("r-1"),
                    reservation_id: "cr-1".into(),
                    slot,
                    generation: 0,
                    resource_id: launched[0].instance_id.clone(),
                    state: "running".into(),
                    updated_at: t0() + Duration::hours(2),

                    started_at: None,
                    ended_at: None,
                    ran: Vec::new(),
                    relaunch: 0,
                })
                .await
                .unwrap();
        }
        w
    }

    fn replacer(&self, extra: &[(&'static str, &'static str)]) -> R {
        let mut env: Vec<(&str, String)> = vec![
            ("TABLE_NAME", "t".into()),
            ("EVENT_BUS_NAME", "capacity-pilot".into()),
            ("ALLOWED_REGIONS", REGION.into()),
            ("ALLOWED_REQUEST_SOURCES", "com.example.ml-platform".into()),
            ("APPROVER_SOURCES", "com.example.approvals".into()),
            ("TEAM_BUDGETS_USD", r#"{"*": "100000"}"#.into()),
            (
                "SAGEMAKER_EXECUTION_ROLE_ARN",
                "arn:aws:iam::123456789012:role/sm".into(),
            ),
            ("MAX_UNHEALTHY_SHARE", "0.5".into()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        let config = Config::from_lookup(&move |k| {
            env.iter()
                .rev()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.clone())
        })
        .unwrap();
        Replacer {
            store: self.store.clone(),
            workloads: self.workloads.clone(),
            events: self.events.clone(),
            clock: self.clock.clone(),
            config: Arc::new(config),
        }
    }

    async fn tick(&self, id: &str) -> super::Outcome {
        self.replacer(&[]).handle(scheduled(id)).await.unwrap()
    }

    async fn record(&self, id: &str) -> RequestRecord {
        self.store
            .get_request(&request_id(id))
            .await
            .unwrap()
            .unwrap()
    }

    async fn slots(&self) -> Vec<WorkloadRecord> {
        self.store.workloads(&request_id("r-1")).await.unwrap()
    }

    fn live(&self) -> Vec<String> {
        self.workloads
            .live_in_reservation("cr-1")
            .into_iter()
            .map(|i| i.instance_id)
            .collect()
    }

    fn launches(&self) -> Vec<LaunchSpec> {
        self.workloads
            .calls_of(WorkloadsOp::LaunchInstances)
            .into_iter()
            .filter_map(|c| match c {
                WorkloadsCall::LaunchInstances(s) => Some(s),
                _ => None,
            })
            .collect()
    }
}

fn scheduled(id: &str) -> EventBridgeEvent<Value> {
    serde_json::from_value(json!({
        "version": "0", "id": id, "detail-type": "Scheduled Event", "source": "aws.events",
        "account": "123456789012", "time": "2026-12-01T12:00:00Z", "region": REGION,
        "resources": [], "detail": {}
    }))
    .unwrap()
}

fn state_change(instance_id: &str, state: &str) -> EventBridgeEvent<Value> {
    serde_json::from_value(json!({
        "version": "0", "id": format!("sc-{instance_id}-{state}"),
        "detail-type": "EC2 Instance State-change Notification", "source": "aws.ec2",
        "account": "123456789012", "time": "2026-12-01T12:00:00Z", "region": REGION,
        "resources": [format!("arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}")],
        "detail": { "instance-id": instance_id, "state": state }
    }))
    .unwrap()
}

fn health(instance_id: &str) -> EventBridgeEvent<Value> {
    health_of(
        instance_id,
        "AWS_EC2_INSTANCE_STORE_DRIVE_PERFORMANCE_DEGRADED",
        "issue",
        None,
    )
}

/// An AWS Health event of `code` and `category` for `instance_id`, starting at `start`.
fn health_of(
    instance_id: &str,
    code: &str,
    category: &str,
    start: Option<DateTime<Utc>>,
) -> EventBridgeEvent<Value> {
    let rfc1123 = |t: DateTime<Utc>| t.format("%a, %-d %b %Y %H:%M:%S GMT").to_string();
    let mut detail = json!({
        "eventArn": format!("arn:aws:health:us-east-1::event/EC2/{code}/{code}_x"),
        "service": "EC2", "eventTypeCode": code, "communicationId": "comm-1",
        "eventTypeCategory": category, "statusCode": "upcoming", "eventRegion": REGION,
        "affectedEntities": [{ "entityValue": instance_id, "tags": {} }]
    });
    if let Some(t) = start {
        detail["startTime"] = json!(rfc1123(t));
        detail["endTime"] = json!(rfc1123(t + Duration::hours(2)));
    }
    serde_json::from_value(json!({
        "version": "0", "id": format!("health-{code}"), "detail-type": "AWS Health Event",
        "source": "aws.health", "account": "123456789012", "time": "2026-12-01T12:00:00Z",
        "region": REGION, "resources": [instance_id], "detail": detail
    }))
    .unwrap()
}

#[tokio::test]
async fn an_impaired_instance_is_replaced_once_with_a_new_client_token() {
    // GIVEN four running instances, one of them impaired
    let w = World::new(4).await;
    let sick = w.slots().await[1].resource_id.clone();
    w.workloads
        .set_instance_health(&sick, InstanceHealth::Impaired);
    // WHEN the schedule polls status
    let out = w.tick("tick-1").await;
    // THEN the impaired one is terminated and a replacement runs in the same slot
    assert_eq!(
        w.workloads.instance(&sick).unwrap().state,
        InstanceState::Terminated
    );
    let slot = w.slots().await.into_iter().find(|s| s.slot == 1).unwrap();
    assert_eq!(slot.generation, 1);
    assert_ne!(slot.resource_id, sick);
    assert_eq!(w.live().len(), 4);
    let launch = w.launches().pop().unwrap();
    assert_eq!(launch.client_token, client_token("cr-1", 1, 1));
    assert_ne!(launch.client_token, client_token("cr-1", 1, 0));
    assert_eq!(
        launch.market,
        LaunchMarket::CapacityBlock {
            reservation_id: "cr-1".into()
        }
    );
    // ... carrying the window's drain start as the instances launched with it do (issue 55):
    // the 24 h block ends at t0 + 26 h, and drains 45 min before
    let drain_at = t0() + Duration::hours(26) - Duration::minutes(45);
    assert_eq!(
        launch
            .tags
            .get(capacity_pilot::domain::naming::DRAIN_AT_TAG)
            .map(String::as_str),
        Some(capacity_pilot::domain::naming::drain_at_value(drain_at).as_str())
    );
    let ev = &w.events.published_of(REPLACED)[0].detail;
    assert_eq!(ev["replaced_instance_id"], json!(sick));
    assert_eq!(ev["new_instance_id"], json!(slot.resource_id));
    assert_eq!(ev["generation"], json!(1));
    assert!(out.decisions.iter().any(|d| d.action == "replaced"));
    // AND later ticks replace nothing more
    w.tick("tick-2").await;
    w.tick("tick-3").await;
    assert_eq!(w.events.published_of(REPLACED).len(), 1);
    assert_eq!(w.launches().len(), 4 + 1);
}

#[tokio::test]
async fn an_instance_not_listed_yet_is_replaced_only_past_the_listing_lag_bound() {
    // GIVEN slot 1's instance was recorded a minute ago and EC2 does not list it yet
    let w = World::new(4).await;
    let mut slot = w.slots().await[1].clone();
    let unlisted = slot.resource_id.clone();
    slot.updated_at = w.clock.get() - Duration::minutes(1);
    w.store.put_workload(slot).await.unwrap();
    w.workloads.set_listed(&unlisted, false);
    // WHEN the schedule polls
    let out = w.tick("tick-1").await;
    // THEN nothing is replaced, and the decision says why
    assert!(w.launches().len() == 4, "{:?}", w.launches());
    assert!(
        out.decisions
            .iter()
            .any(|d| d.action == "waiting" && d.reason.contains("not listed by EC2 yet")),
        "{:?}",
        out.decisions
    );
    // AND still unlisted ten minutes after it was recorded, it is replaced (here its slot is
    // still taken, as it would be by an instance that runs unlisted: the launch waits)
    w.clock.advance(Duration::minutes(9));
    let out = w.tick("tick-2").await;
    assert_eq!(w.launches().len(), 5, "{:?}", out.decisions);
    let slot = w.slots().await.into_iter().find(|s| s.slot == 1).unwrap();
    assert_eq!(slot.generation, 1);
}

#[tokio::test]
async fn a_replacement_waiting_for_the_slot_is_retried_on_the_next_tick() {
    // GIVEN four instances, one stopped unexpectedly, and a block whose slot is not back yet
    let w = World::new(4).await;
    let stopped = w.slots().await[2].resource_id.clone();
    w.workloads
        .set_instance_state(&stopped, InstanceState::Stopped);
    w.workloads.no_capacity_next(WorkloadsOp::LaunchInstances);
    // WHEN the state change arrives
    let out = w
        .replacer(&[])
        .handle(state_change(&stopped, "stopped"))
        .await
        .unwrap();
    // THEN the old instance is terminated, the slot waits, and nothing fails
    assert!(
        out.decisions.iter().any(|d| d.action == "waiting-for-slot"),
        "{out:?}"
    );
    assert_eq!(
        w.workloads.instance(&stopped).unwrap().state,
        InstanceState::Terminated
    );
    let slot = w.slots().await.into_iter().find(|s| s.slot == 2).unwrap();
    assert_eq!((slot.generation, slot.state.as_str()), (1, REPLACING));
    assert!(w.events.published_of(REPLACED).is_empty());
    // WHEN the next tick runs, the slot having returned
    w.clock.set(w.clock.get() + Duration::minutes(10));
    w.tick("tick-2").await;
    // THEN the replacement launches with the same new token, and is the only one
    let slot = w.slots().await.into_iter().find(|s| s.slot == 2).unwrap();
    assert_eq!(slot.generation, 1);
    assert_ne!(slot.resource_id, stopped);
    assert_eq!(w.live().len(), 4);
    let tokens: Vec<String> = w.launches().into_iter().map(|l| l.client_token).collect();
    assert_eq!(
        tokens
            .iter()
            .filter(|t| **t == client_token("cr-1", 2, 1))
            .count(),
        2
    );
    assert_eq!(w.events.published_of(REPLACED).len(), 1);
}

#[tokio::test]
async fn a_replacement_cut_short_before_the_terminate_takes_the_old_instance_back_on_retry() {
    // Impaired but running, and stopped: either keeps its volumes billed (and, in a block,
    // its slot) until it is terminated.
    for stopped in [false, true] {
        // GIVEN four instances, one impaired or stopped, and a replacement run that records
        // the slot's next generation and then fails at TerminateInstances
        let w = World::new(4).await;
        let sick = w.slots().await[1].resource_id.clone();
        if stopped {
            w.workloads
                .set_instance_state(&sick, InstanceState::Stopped);
        } else {
            w.workloads
                .set_instance_health(&sick, InstanceHealth::Impaired);
        }
        w.workloads.fail_next(
            WorkloadsOp::TerminateInstances,
            PortError::Transient {
                service: "ec2",
                code: "InternalError".into(),
                message: "scripted".into(),
            },
        );
        assert!(w.replacer(&[]).handle(scheduled("tick-1")).await.is_err());
        let slot = w.slots().await.into_iter().find(|s| s.slot == 1).unwrap();
        assert_eq!((slot.generation, slot.state.as_str()), (1, REPLACING));
        let before = if stopped {
            InstanceState::Stopped
        } else {
            InstanceState::Running
        };
        assert_eq!(w.workloads.instance(&sick).unwrap().state, before);
        // WHEN the next tick retries the replacement
        w.tick("tick-2").await;
        // THEN the old instance is terminated, and exactly one replacement runs
        assert_eq!(
            w.workloads.instance(&sick).unwrap().state,
            InstanceState::Terminated,
            "stopped: {stopped}"
        );
        assert_eq!(w.live().len(), 4);
        let slot = w.slots().await.into_iter().find(|s| s.slot == 1).unwrap();
        assert_ne!(slot.resource_id, sick);
        assert_eq!(w.events.published_of(REPLACED).len(), 1);
    }
}

#[tokio::test]
async fn the_per_reservation_cap_holds() {
    // GIVEN a cap of one replacement per reservation, and one replacement done
    let w = World::new(4).await;
    let extra = [("MAX_REPLACEMENTS_PER_RESERVATION", "1")];
    let first = w.slots().await[0].resource_id.clone();
    w.workloads
        .set_instance_health(&first, InstanceHealth::Impaired);
    w.replacer(&extra)
        .handle(scheduled("tick-1"))
        .await
        .unwrap();
    assert_eq!(w.events.published_of(REPLACED).len(), 1);
    // WHEN another instance becomes impaired
    let second = w.slots().await[3].resource_id.clone();
    w.workloads
        .set_instance_health(&second, InstanceHealth::Impaired);
    let out = w
        .replacer(&extra)
        .handle(scheduled("tick-2"))
        .await
        .unwrap();
    // THEN it is left alone, and the decision says why
    assert_eq!(
        w.workloads.instance(&second).unwrap().state,
        InstanceState::Running
    );
    assert_eq!(w.events.published_of(REPLACED).len(), 1);
    assert!(
        out.decisions.iter().any(|d| d.action == "capped"),
        "{out:?}"
    );
}

#[tokio::test]
async fn the_unhealthy_share_cap_holds() {
    // GIVEN four instances of which three are impaired, above the 0.5 share
    let w = World::new(4).await;
    for s in &w.slots().await[..3] {
        w.workloads
            .set_instance_health(&s.resource_id, InstanceHealth::Impaired);
    }
    // WHEN the schedule polls
    let out = w.tick("tick-1").await;
    // THEN nothing destructive happens, and the decision says why
    assert!(
        w.workloads
            .calls_of(WorkloadsOp::TerminateInstances)
            .is_empty()
    );
    assert_eq!(w.live().len(), 4);
    assert!(w.events.published().is_empty());
    let held = out.decisions.iter().find(|d| d.action == "held").unwrap();
    assert!(held.reason.contains("3 of 4"), "{held:?}");
}

#[tokio::test]
async fn a_slots_instance_whose_managed_tag_is_not_true_is_not_replaced() {
    // (IAM lets TerminateInstances act only on capacity-pilot:managed=true: review M8a)
    for value in ["false", "True"] {
        // GIVEN a running block whose first slot's instance was retagged, then impaired
        let w = World::new(2).await;
        let sick = w.slots().await[0].resource_id.clone();
        let mut i = w.workloads.instance(&sick).unwrap();
        i.tags.insert(MANAGED_TAG.to_string(), value.to_string());
        i.health = InstanceHealth::Impaired;
        w.workloads.add_instance(i);
        // WHEN the schedule polls
        w.tick("tick-1").await;
        // THEN it is not terminated or replaced: it is not ours to touch
        assert!(
            w.workloads
                .calls_of(WorkloadsOp::TerminateInstances)
                .is_empty(),
            "capacity-pilot:managed={value}"
        );
        assert!(w.events.published_of(REPLACED).is_empty());
    }
}

#[tokio::test]
async fn unmanaged_instances_are_never_touched() {
    // GIVEN an impaired, stopped instance tagged for the request but without the managed tag
    let w = World::new(2).await;
    let mut tags = BTreeMap::new();
    tags.insert(REQUEST_TAG.to_string(), "r-1".to_string());
    w.workloads.add_instance(InstanceInfo {
        instance_id: "i-theirs".into(),
        region: REGION.into(),
        availability_zone: "us-east-1a".into(),
        instance_type: "p5.48xlarge".into(),
        state: InstanceState::Stopped,
        health: InstanceHealth::Impaired,
        reservation_id: Some("cr-1".into()),
        launched_at: None,
        tags,
        scheduled: Vec::new(),
    });
    // WHEN its state change and a Health event naming it arrive, and the schedule polls
    w.replacer(&[])
        .handle(state_change("i-theirs", "stopped"))
        .await
        .unwrap();
    w.replacer(&[]).handle(health("i-theirs")).await.unwrap();
    w.tick("tick-1").await;
    // THEN nothing was terminated or launched
    assert!(
        w.workloads
            .calls_of(WorkloadsOp::TerminateInstances)
            .is_empty()
    );
    assert_eq!(w.launches().len(), 2);
    assert_eq!(
        w.workloads.instance("i-theirs").unwrap().state,
        InstanceState::Stopped
    );
}

#[tokio::test]
async fn a_health_issue_naming_a_managed_instance_replaces_it() {
    // GIVEN an open issue with one of four instances's instance store
    let w = World::new(4).await;
    let retiring = w.slots().await[0].resource_id.clone();
    // WHEN AWS Health says so
    w.replacer(&[]).handle(health(&retiring)).await.unwrap();
    // THEN it is replaced
    assert_eq!(
        w.workloads.instance(&retiring).unwrap().state,
        InstanceState::Terminated
    );
    assert_eq!(w.live().len(), 4);
    assert!(
        w.events.published_of(REPLACED)[0].detail["reason"]
            .as_str()
            .unwrap()
            .contains("AWS Health")
    );
}

// ---- scheduled changes (review N16) --------------------------------------------------------

#[tokio::test]
async fn a_retirement_scheduled_hours_away_is_replaced_its_lead_before_not_when_announced() {
    // GIVEN one of four instances EC2 has scheduled for retirement 5 h from now, well before
    // its window's drain
    let w = World::new(4).await;
    let retiring = w.slots().await[0].resource_id.clone();
    let at = w.clock.get() + Duration::hours(5);
    w.workloads
        .schedule_change(&retiring, "instance-retirement", at);

    // WHEN AWS Health announces it, and the schedule polls until 31 min before it
    let code = "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED";
    w.replacer(&[])
        .handle(health_of(&retiring, code, "scheduledChange", Some(at)))
        .await
        .unwrap();
    w.clock.set(at - Duration::minutes(31));
    w.tick("tick-early").await;

    // THEN nothing is replaced yet: the workload runs on
    assert_eq!(
        w.workloads.instance(&retiring).unwrap().state,
        InstanceState::Running
    );
    assert!(w.events.published_of(REPLACED).is_empty());

    // WHEN the schedule polls 30 min before it
    w.clock.set(at - SCHEDULED_CHANGE_LEAD);
    w.tick("tick-due").await;

    // THEN it is replaced, saying why
    assert_eq!(
        w.workloads.instance(&retiring).unwrap().state,
        InstanceState::Terminated
    );
    assert_eq!(w.live().len(), 4);
    let reason = w.events.published_of(REPLACED)[0].detail["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reason.contains("scheduled its instance-retirement"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_retirement_scheduled_after_the_windows_drain_is_left_to_the_drain() {
    // GIVEN a retirement 10 min after the window's drain, polled 30 min before the
    // retirement, which is before the drain
    let w = World::new(4).await;
    let retiring = w.slots().await[0].resource_id.clone();
    let drain_at = w.record("r-1").await.windows[0].next_action_at.unwrap();
    let at = drain_at + Duration::minutes(10);
    w.workloads
        .schedule_change(&retiring, "instance-retirement", at);
    w.clock.set(at - SCHEDULED_CHANGE_LEAD);

    // WHEN the schedule polls
    w.tick("tick-1").await;

    // THEN the drain comes first: nothing is replaced
    assert!(w.events.published_of(REPLACED).is_empty());
    assert_eq!(
        w.workloads.instance(&retiring).unwrap().state,
        InstanceState::Running
    );
}

#[tokio::test]
async fn scheduled_maintenance_that_keeps_the_instance_is_announced_once_not_acted_on() {
    // GIVEN a reboot EC2 has scheduled for one of four instances in 10 min
    let w = World::new(4).await;
    let rebooting = w.slots().await[2].resource_id.clone();
    let at = w.clock.get() + Duration::minutes(10);
    w.workloads.schedule_change(&rebooting, "system-reboot", at);
    let code = "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED";

    // WHEN AWS Health announces it (delivered twice), and the schedule polls
    for _ in 0..2 {
        w.replacer(&[])
            .handle(health_of(&rebooting, code, "scheduledChange", Some(at)))
            .await
            .unwrap();
    }
    w.tick("tick-1").await;

    // THEN it is announced under one key, and the instance is kept
    let told = w
        .events
        .published_of("Capacity Instance Maintenance Scheduled");
    assert!(!told.is_empty());
    let keys: BTreeSet<&str> = told
        .iter()
        .map(|e| e.detail["event_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(told[0].detail["instance_id"], json!(rebooting));
    assert_eq!(told[0].detail["code"], json!(code));
    assert_eq!(told[0].detail["request_id"], json!("r-1"));
    assert!(w.events.published_of(REPLACED).is_empty());
    assert_eq!(
        w.workloads.instance(&rebooting).unwrap().state,
        InstanceState::Running
    );
}

#[tokio::test]
async fn a_request_that_is_not_active_is_left_alone() {
    // GIVEN a draining request with an impaired instance
    let w = World::new(2).await;
    let mut rec = w
        .store
        .get_request(&request_id("r-1"))
        .await
        .unwrap()
        .unwrap();
    rec.status = RequestStatus::Draining;
    for x in &mut rec.windows {
        x.state = WindowState::Draining;
    }
    w.store.insert_record(rec);
    let sick = w.slots().await[0].resource_id.clone();
    w.workloads
        .set_instance_health(&sick, InstanceHealth::Impaired);
    // WHEN the schedule polls
    w.tick("tick-1").await;
    // THEN cleanup owns it: nothing is replaced
    assert!(
        w.workloads
            .calls_of(WorkloadsOp::TerminateInstances)
            .is_empty()
    );
}

#[tokio::test]
async fn an_instance_failing_within_a_function_timeout_of_the_drain_is_not_replaced() {
    // GIVEN a running window (24 h block ending t0 + 26 h; drain at end - 45 min) and an
    // impaired instance, seen 30 s before the drain starts
    let w = World::new(4).await;
    let sick = w.slots().await[1].resource_id.clone();
    w.workloads
        .set_instance_health(&sick, InstanceHealth::Impaired);
    let drain_at = t0() + Duration::hours(26) - Duration::minutes(45);
    w.clock.set(drain_at - Duration::seconds(30));
    // WHEN the schedule polls
    w.tick("tick-1").await;
    // THEN no replacement starts: it could still be starting when the drain stops the rest
    assert!(w.events.published_of(REPLACED).is_empty());
    assert_eq!(w.launches().len(), 4);
}

/// GIVEN r-2, an on-demand-first request running two on-demand instances since +2 h (as
/// launch-workloads leaves it: RunningOnDemand, its run started, next due at its drain).
async fn on_demand_run(w: &World) -> Vec<String> {
    run_of(w, LaunchMarket::OnDemand).await
}

/// GIVEN r-2 running two instances in `market` (on demand or spot) since +2 h, each slot
/// recording its launch.
async fn run_of(w: &World, market: LaunchMarket) -> Vec<String> {
    let label = if market == LaunchMarket::Spot {
        "spot"
    } else {
        "on-demand"
    };
    let mut req = request("r-2", "team-a", "50000");
    req.instance_count = 2;
    let mut tags = BTreeMap::new();
    tags.insert(MANAGED_TAG.to_string(), "true".to_string());
    tags.insert(REQUEST_TAG.to_string(), "r-2".to_string());
    let template = match &req.workload {
        capacity_pilot::domain::request::WorkloadDetail::Ec2Instances {
            launch_template, ..
        } => launch_template.clone().unwrap(),
        _ => unreachable!(),
    };
    let mut ids = Vec::new();
    for slot in 0..2 {
        let launched = w
            .workloads
            .launch_instances(&LaunchSpec {
                region: REGION.into(),
                market: market.clone(),
                instance_type: "p5.48xlarge".into(),
                count: 1,
                subnet_id: "subnet-a".into(),
                launch_template: template.clone(),
                client_token: client_token(&format!("r-2:{label}"), slot, 0),
                tags: tags.clone(),
            })
            .await
            .unwrap();
        w.store
            .put_workload(WorkloadRecord {
                request_id: request_id("r-2"),
                reservation_id: label.into(),
                slot,
                generation: 0,
                resource_id: launched[0].instance_id.clone(),
                state: "running".into(),
                updated_at: t0() + Duration::hours(2),
                started_at: Some(t0() + Duration::hours(2)),
                ended_at: None,
                ran: Vec::new(),
                relaunch: 0,
            })
            .await
            .unwrap();
        ids.push(launched[0].instance_id.clone());
    }
    w.store.insert_record(RequestRecord {
        version: 4,
        reason: "seed".into(),
        next_action_at: Some(t0() + Duration::hours(20)),
        run: Some(capacity_pilot::ports::OnDemandRun {
            attempt: label.into(),
            held_at: t0() + Duration::hours(2),
            started_at: Some(t0() + Duration::hours(2)),
            launch_generations: 0,
            claim: None,
            fall_back: None,
            approval: None,
        }),
        updated_at: t0() + Duration::hours(2),
        ..capacity_pilot::fakes::fixtures::record(
            req.clone(),
            if market == LaunchMarket::Spot {
                RequestStatus::RunningSpot
            } else {
                RequestStatus::RunningOnDemand
            },
        )
    });
    ids
}

#[tokio::test]
async fn a_stopped_instance_of_an_on_demand_run_is_replaced_on_demand_in_its_zone() {
    // GIVEN an on-demand run of two, one of whose instances EC2 stopped
    let w = World::new(1).await;
    let ids = on_demand_run(&w).await;
    w.workloads
        .set_instance_state(&ids[1], InstanceState::Stopped);
    // WHEN the schedule polls
    let out = w.tick("tick-1").await;
    // THEN the stopped one is terminated and a replacement runs on demand in its subnet,
    // with a token of its own
    assert_eq!(
        w.workloads.instance(&ids[1]).unwrap().state,
        InstanceState::Terminated,
        "{:?}",
        out.decisions
    );
    let launch = w.launches().pop().unwrap();
    assert_eq!(launch.market, LaunchMarket::OnDemand);
    assert_eq!(launch.subnet_id, "subnet-a");
    assert_eq!(
        launch.client_token,
        client_token("r-2:on-demand:replacement", 1, 1)
    );
    let slots = w.store.workloads(&request_id("r-2")).await.unwrap();
    let slot = slots.iter().find(|s| s.slot == 1).unwrap();
    assert_eq!((slot.generation, slot.state.as_str()), (1, "running"));
    assert_ne!(slot.resource_id, ids[1]);
    let ev = &w.events.published_of(REPLACED)[0].detail;
    assert_eq!(ev["reservation_id"], json!("on-demand"));
    assert_eq!(ev["replaced_instance_id"], json!(ids[1]));
    // AND the healthy one is left alone, and later ticks replace nothing more
    assert_eq!(
        w.workloads.instance(&ids[0]).unwrap().state,
        InstanceState::Running
    );
    w.tick("tick-2").await;
    assert_eq!(w.events.published_of(REPLACED).len(), 1);
}

#[tokio::test]
async fn an_on_demand_run_near_its_drain_is_not_repaired() {
    // GIVEN an on-demand run whose drain is less than a function timeout (60 s) away
    let w = World::new(1).await;
    let ids = on_demand_run(&w).await;
    w.clock
        .set(t0() + Duration::hours(20) - Duration::seconds(30));
    w.workloads
        .set_instance_state(&ids[0], InstanceState::Stopped);
    // WHEN the schedule polls
    w.tick("tick-1").await;
    // THEN nothing is replaced: the drain stops the run anyway
    let replaced = w.events.published_of(REPLACED);
    assert!(replaced.is_empty(), "{:?}", replaced[0].detail);
    assert_eq!(
        w.workloads.instance(&ids[0]).unwrap().state,
        InstanceState::Stopped
    );
}

#[tokio::test]
async fn an_on_demand_replacement_whose_old_instance_is_gone_launches_beside_the_others() {
    // GIVEN an on-demand run of two whose stopped instance was terminated, its replacement
    // refused for capacity, and the old instance since gone from EC2's listing
    let w = World::new(1).await;
    let ids = on_demand_run(&w).await;
    w.workloads
        .set_instance_state(&ids[1], InstanceState::Stopped);
    w.workloads.deny_capacity(LaunchKind::OnDemand);
    w.tick("tick-1").await;
    assert!(w.events.published_of(REPLACED).is_empty());
    w.workloads.set_listed(&ids[1], false);
    w.workloads.allow_capacity(LaunchKind::OnDemand);
    // WHEN the next tick retries
    let out = w.tick("tick-2").await;
    // THEN the replacement launches on demand where the run's other instance is
    let replaced = w.events.published_of(REPLACED);
    assert_eq!(replaced.len(), 1, "{:?}", out.decisions);
    let launch = w.launches().pop().unwrap();
    assert_eq!(
        (launch.market, launch.subnet_id.as_str()),
        (LaunchMarket::OnDemand, "subnet-a")
    );
}

#[tokio::test]
async fn an_on_demand_runs_launch_relaunches_do_not_count_against_the_replacement_cap() {
    // GIVEN an on-demand run whose launch relaunched slot 1 three times (take-backs in
    // other zones, retries) before it started, and whose slot 1 instance then stops (found
    // by the simulation, seed 2322: "already had 3 of at most 3 replacements", never
    // repaired, charged in full)
    let w = World::new(1).await;
    let ids = on_demand_run(&w).await;
    let mut slot = w.store.workloads(&request_id("r-2")).await.unwrap()[1].clone();
    slot.generation = 3;
    w.store.put_workload(slot).await.unwrap();
    let mut rec = w
        .store
        .get_request(&request_id("r-2"))
        .await
        .unwrap()
        .unwrap();
    rec.run.as_mut().unwrap().launch_generations = 3;
    w.store.insert_record(rec);
    w.workloads
        .set_instance_state(&ids[1], InstanceState::Stopped);
    // WHEN the schedule polls
    let out = w.tick("tick-1").await;
    // THEN it is replaced, at generation 4
    let replaced = w.events.published_of(REPLACED);
    assert_eq!(replaced.len(), 1, "{:?}", out.decisions);
    assert_eq!(replaced[0].detail["generation"], json!(4));
}

#[tokio::test]
async fn an_impaired_instance_in_a_failed_requests_running_window_is_replaced() {
    // GIVEN the running window of a request that has since failed (a split's replacement
    // refused, say): its block is paid for, and one of its instances is impaired
    let w = World::new(2).await;
    let mut rec = w
        .store
        .get_request(&request_id("r-1"))
        .await
        .unwrap()
        .unwrap();
    rec.status = RequestStatus::Failed;
    rec.reason = "the replacement segment's purchase was refused".into();
    w.store.insert_record(rec);
    let sick = w.slots().await[0].resource_id.clone();
    w.workloads
        .set_instance_health(&sick, InstanceHealth::Impaired);
    // WHEN the schedule polls
    let out = w.tick("tick-1").await;
    // THEN the window is healed as any other (ARCHITECTURE §9.1): its status does not decide
    assert_eq!(
        w.workloads.instance(&sick).unwrap().state,
        InstanceState::Terminated
    );
    assert_eq!(w.live().len(), 2);
    assert_eq!(w.events.published_of(REPLACED).len(), 1);
    assert!(out.decisions.iter().any(|d| d.action == "replaced"));
}

fn state_change_at(instance_id: &str, state: &str, at: DateTime<Utc>) -> EventBridgeEvent<Value> {
    let mut ev = state_change(instance_id, state);
    ev.time = Some(at);
    ev
}

const INTERRUPTED: &str = "Capacity Workload Interrupted";

#[tokio::test]
async fn healthy_runs_cost_a_tick_no_reads_and_an_end_reads_only_its_owner() {
    use capacity_pilot::fakes::StoreOp;
    // GIVEN a running block (r-1) and a healthy spot run (r-2)
    let w = World::new(1).await;
    let ids = run_of(&w, LaunchMarket::Spot).await;
    let reads = |w: &World| {
        w.store
            .calls()
            .into_iter()
            .filter(|op| matches!(op, StoreOp::GetRequest | StoreOp::Workloads))
            .count()
    };
    let before = reads(&w);
    // WHEN the schedule polls
    w.tick("tick-1").await;
    // THEN nothing is suspect, so no request or slot is read past the tick's agenda
    assert_eq!(reads(&w), before);
    // WHEN EC2 says one of r-2's instances stopped
    let at = t0() + Duration::hours(3);
    w.clock.set(at);
    let before = w.store.calls().len();
    w.replacer(&[])
        .handle(state_change_at(&ids[0], "stopped", at))
        .await
        .unwrap();
    // THEN only r-2's slots are read for its end (r-1's are not)
    let workload_reads = w.store.calls()[before..]
        .iter()
        .filter(|op| **op == StoreOp::Workloads)
        .count();
    let repaired = w.store.calls()[before..]
        .iter()
        .filter(|op| **op == StoreOp::GetRequest)
        .count();
    assert!(workload_reads >= 1);
    assert_eq!(
        workload_reads,
        1 + repaired,
        "{:?}",
        &w.store.calls()[before..]
    );
}

#[tokio::test]
async fn a_spot_run_watches_only_its_own_slots_not_an_earlier_attempts() {
    // GIVEN a healthy spot run of two whose request first tried on demand: that attempt's
    // slot is recorded terminated (its instance long gone)
    let w = World::new(1).await;
    run_of(&w, LaunchMarket::Spot).await;
    w.store
        .put_workload(WorkloadRecord {
            request_id: request_id("r-2"),
            reservation_id: "on-demand".into(),
            slot: 0,
            generation: 0,
            resource_id: "i-0ondemand0000000".into(),
            state: "terminated".into(),
            updated_at: t0() + Duration::hours(1),
            started_at: None,
            ended_at: None,
            ran: Vec::new(),
            relaunch: 0,
        })
        .await
        .unwrap();
    let launched = w.launches().len();
    let calls = w.store.calls().len();
    // WHEN the schedule polls, hours on
    w.clock.set(t0() + Duration::hours(5));
    let out = w.replacer(&[]).handle(scheduled("tick-1")).await.unwrap();
    // THEN the old attempt's slot is not watched: the run is not even read again, and
    // nothing is launched or announced
    use capacity_pilot::fakes::StoreOp;
    assert!(
        !w.store.calls()[calls..]
            .iter()
            .any(|op| matches!(op, StoreOp::GetRequest | StoreOp::Workloads)),
        "{:?}",
        &w.store.calls()[calls..]
    );
    assert_eq!(w.launches().len(), launched, "{:?}", out.decisions);
    assert!(w.events.published_of(REPLACED).is_empty());
}

#[tokio::test]
async fn a_state_change_to_running_does_not_end_a_slots_run() {
    // GIVEN an on-demand run of two since +2 h
    let w = World::new(1).await;
    let ids = run_of(&w, LaunchMarket::OnDemand).await;
    // WHEN EC2 says one of them is running (a start, a reboot's return)
    let at = t0() + Duration::hours(3);
    w.clock.set(at);
    let out = w
        .replacer(&[])
        .handle(state_change_at(&ids[0], "running", at))
        .await
        .unwrap();
    // THEN its slot's run goes on: no end is recorded
    assert!(!out.decisions.iter().any(|d| d.action == "run-ended"));
    let slots = w.store.workloads(&request_id("r-2")).await.unwrap();
    assert!(slots.iter().all(|s| s.ended_at.is_none()), "{slots:?}");
}

#[tokio::test]
async fn a_reclaimed_spot_instance_is_repaired_on_spot_and_its_run_ends_where_ec2_said() {
    // GIVEN a spot run of two since +2 h, allowed one replacement; EC2 reclaims one, its
    // state change stamped +2 h 40
    let w = World::new(1).await;
    let ids = run_of(&w, LaunchMarket::Spot).await;
    w.workloads
        .set_instance_state(&ids[1], InstanceState::Terminated);
    let reclaimed = t0() + Duration::minutes(160);
    let one = [("MAX_REPLACEMENTS_PER_RESERVATION", "1")];
    // WHEN the state change arrives (at +3 h), and again, later (a redelivery)
    let out = w
        .replacer(&one)
        .handle(state_change_at(&ids[1], "terminated", reclaimed))
        .await
        .unwrap();
    // (what it published, it counts)
    assert_eq!(out.published, w.events.detail_types().len());
    assert!(out.published >= 2, "{:?}", w.events.detail_types());
    w.clock.set(t0() + Duration::hours(4));
    w.replacer(&one)
        .handle(state_change_at(
            &ids[1],
            "terminated",
            reclaimed + Duration::hours(1),
        ))
        .await
        .unwrap();
    // THEN it is replaced on spot in its subnet, with a token of its own
    let launch = w.launches().pop().unwrap();
    assert_eq!(launch.market, LaunchMarket::Spot, "{:?}", out.decisions);
    assert_eq!(
        launch.client_token,
        client_token("r-2:spot:replacement", 1, 1)
    );
    // AND the slot keeps the old instance's run, to where EC2 said it ended, and the new one's
    // from its launch
    let slots = w.store.workloads(&request_id("r-2")).await.unwrap();
    let slot = slots.iter().find(|s| s.slot == 1).unwrap();
    assert_eq!(
        slot.ran,
        vec![capacity_pilot::ports::Ran {
            from: t0() + Duration::hours(2),
            to: reclaimed
        }]
    );
    assert_eq!(slot.started_at, Some(t0() + Duration::hours(3)));
    assert_eq!((slot.generation, slot.state.as_str()), (1, "running"));
    // AND the interruption is announced once, naming both instances
    let ev = w.events.published_of(INTERRUPTED);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].detail["instance_id"], json!(ids[1]));
    assert_eq!(
        ev[0].detail["replacement_instance_id"],
        json!(slot.resource_id)
    );
    assert_eq!(ev[0].detail["interrupted_at"], json!(reclaimed));
    assert_eq!(ev[0].detail["falls_back"], Value::Null);
    // keyed by the replacement's generation, so a second reclaim of the slot is another
    // event, not a duplicate a consumer drops
    assert_eq!(
        ev[0].detail["event_key"],
        json!("r-2:interrupted-spot-1:v1:c1796115600")
    );
}

#[tokio::test]
async fn a_spot_run_past_its_replacement_cap_falls_back_announcing_the_loss_once() {
    // Issue 48, spot repair's fall-back. GIVEN a spot run of two allowed no replacements,
    // one of whose instances EC2 reclaimed and no event told of
    let w = World::new(1).await;
    let ids = run_of(&w, LaunchMarket::Spot).await;
    w.workloads
        .set_instance_state(&ids[0], InstanceState::Terminated);
    let r = w.replacer(&[("MAX_REPLACEMENTS_PER_RESERVATION", "0")]);
    // WHEN two ticks look
    let out = r.handle(scheduled("tick-1")).await.unwrap();
    w.clock.set(t0() + Duration::hours(4));
    let later = r.handle(scheduled("tick-2")).await.unwrap();
    // THEN nothing is launched, and the slot is left with its run ended when the first tick
    // saw it
    assert_eq!(w.launches().len(), 3, "{:?}", out.decisions);
    let slots = w.store.workloads(&request_id("r-2")).await.unwrap();
    let slot = slots.iter().find(|s| s.slot == 0).unwrap();
    assert_eq!(slot.state, super::LEFT);
    assert_eq!(slot.ended_at, Some(t0() + Duration::hours(3)));
    // AND the run falls back: Draining at once, its fall-back recorded for cleanup-expired,
    // the other instance left for cleanup's stop and settlement
    let rec = w
        .store
        .get_request(&request_id("r-2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::Draining, "{}", rec.reason);
    assert_eq!(rec.next_action_at, Some(t0() + Duration::hours(3)));
    let fall_back = rec.run.as_ref().unwrap().fall_back.as_ref().unwrap();
    assert_eq!(fall_back.at, t0() + Duration::hours(3));
    assert!(fall_back.reason.contains(&ids[0]), "{}", fall_back.reason);
    assert!(rec.reason.contains("falling back"), "{}", rec.reason);
    assert_eq!(
        w.workloads.instance(&ids[1]).unwrap().state,
        InstanceState::Running
    );
    // AND the interruption is announced once, with no replacement, and the later tick does
    // nothing to a run falling back
    let ev = w.events.published_of(INTERRUPTED);
    assert_eq!(ev.len(), 1, "{:?}", later.decisions);
    assert_eq!(ev[0].detail["replacement_instance_id"], Value::Null);
    assert_eq!(ev[0].detail["falls_back"], true);
    assert_eq!(ev[0].detail["instance_id"], json!(ids[0]));
    assert!(w.events.published_of(REPLACED).is_empty());
    assert_eq!(w.record("r-2").await.version, rec.version);
}

#[tokio::test]
async fn a_spot_slot_left_down_before_its_fall_back_was_written_falls_back_on_the_next_tick() {
    // The guard's adversary: the invocation that left the slot down died before the
    // request's write. GIVEN a spot run whose slot 0 is left, its instance terminated
    let w = World::new(1).await;
    let ids = run_of(&w, LaunchMarket::Spot).await;
    w.workloads
        .set_instance_state(&ids[0], InstanceState::Terminated);
    let slot = w.store.workloads(&request_id("r-2")).await.unwrap()[0].clone();
    w.store
        .put_workload(WorkloadRecord {
            state: super::LEFT.into(),
            ended_at: Some(t0() + Duration::minutes(170)),
            ..slot
        })
        .await
        .unwrap();
    // WHEN the next tick looks, the cap not reached (the default, 3)
    w.tick("tick-1").await;
    // THEN it falls back, with nothing launched, the run ended where it was recorded
    let rec = w
        .store
        .get_request(&request_id("r-2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::Draining, "{}", rec.reason);
    assert!(rec.run.unwrap().fall_back.is_some());
    assert_eq!(w.launches().len(), 3);
    let ev = w.events.published_of(INTERRUPTED);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        ev[0].detail["interrupted_at"],
        json!(t0() + Duration::minutes(170))
    );
}

#[tokio::test]
async fn a_spot_run_losing_more_than_the_unhealthy_share_at_once_falls_back() {
    // GIVEN a spot run of two, both reclaimed at once (more than the 0.5 share), with every
    // replacement of the cap still allowed
    let w = World::new(1).await;
    let ids = run_of(&w, LaunchMarket::Spot).await;
    for id in &ids {
        w.workloads
            .set_instance_state(id, InstanceState::Terminated);
    }
    // WHEN the tick looks
    w.tick("tick-1").await;
    // THEN it replaces nothing (spot capacity is going) and falls back, announcing both
    assert_eq!(w.launches().len(), 3);
    let rec = w
        .store
        .get_request(&request_id("r-2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.status, RequestStatus::Draining, "{}", rec.reason);
    assert!(rec.reason.contains("2 of 2"), "{}", rec.reason);
    assert_eq!(w.events.published_of(INTERRUPTED).len(), 2);
}

#[tokio::test]
async fn an_on_demand_run_past_its_replacement_cap_is_left_down_and_runs_on() {
    // GIVEN an on-demand run of two allowed no replacements, one of whose instances stopped
    let w = World::new(1).await;
    let ids = on_demand_run(&w).await;
    w.workloads
        .set_instance_state(&ids[0], InstanceState::Terminated);
    // WHEN the tick looks
    w.replacer(&[("MAX_REPLACEMENTS_PER_RESERVATION", "0")])
        .handle(scheduled("tick-1"))
        .await
        .unwrap();
    // THEN the slot is left down, its run ended, and the run goes on: only spot falls back
    let slots = w.store.workloads(&request_id("r-2")).await.unwrap();
    assert_eq!(
        slots.iter().find(|s| s.slot == 0).unwrap().state,
        super::LEFT
    );
    assert_eq!(w.record("r-2").await.status, RequestStatus::RunningOnDemand);
    assert!(w.events.published().is_empty());
}

#[tokio::test]
async fn one_reclaimed_spot_instance_is_repaired_whatever_the_unhealthy_share() {
    // GIVEN a spot run of two, one reclaimed, under a share (0.4) that one of two exceeds
    let w = World::new(1).await;
    let ids = run_of(&w, LaunchMarket::Spot).await;
    w.workloads
        .set_instance_state(&ids[0], InstanceState::Terminated);
    // WHEN the tick looks
    w.replacer(&[("MAX_UNHEALTHY_SHARE", "0.4")])
        .handle(scheduled("tick-1"))
        .await
        .unwrap();
    // THEN it is replaced on spot (one bad instance is always repaired), not fallen back
    assert_eq!(w.launches().len(), 4);
    assert_eq!(w.launches().pop().unwrap().market, LaunchMarket::Spot);
    assert_eq!(w.record("r-2").await.status, RequestStatus::RunningSpot);
}

#[tokio::test]
async fn a_spot_run_losing_exactly_the_unhealthy_share_is_repaired() {
    // GIVEN a spot run of two, both reclaimed, under a share of 1 (all may be bad at once)
    let w = World::new(1).await;
    let ids = run_of(&w, LaunchMarket::Spot).await;
    for id in &ids {
        w.workloads
            .set_instance_state(id, InstanceState::Terminated);
    }
    // WHEN the tick looks
    w.replacer(&[("MAX_UNHEALTHY_SHARE", "1")])
        .handle(scheduled("tick-1"))
        .await
        .unwrap();
    // THEN both are replaced on spot: the share is not passed, and the cap has room
    assert_eq!(w.launches().len(), 5);
    assert_eq!(w.record("r-2").await.status, RequestStatus::RunningSpot);
}

#[tokio::test]
async fn an_impaired_spot_instance_past_the_cap_is_left_running_not_fallen_back() {
    // GIVEN a spot run whose slot 0 had its three replacements, its instance now impaired but
    // running (not taken back by EC2)
    let w = World::new(1).await;
    let ids = run_of(&w, LaunchMarket::Spot).await;
    let slot = w.store.workloads(&request_id("r-2")).await.unwrap()[0].clone();
    w.store
        .put_workload(WorkloadRecord {
            generation: 3,
            ..slot
        })
        .await
        .unwrap();
    w.workloads
        .set_instance_health(&ids[0], InstanceHealth::Impaired);
    // WHEN the tick looks
    let out = w.tick("tick-1").await;
    // THEN the cap holds and the run goes on: only a lost instance makes a spot run fall back
    assert!(
        out.decisions.iter().any(|d| d.action == "capped"),
        "{:?}",
        out.decisions
    );
    assert_eq!(w.record("r-2").await.status, RequestStatus::RunningSpot);
    assert!(w.events.published_of(INTERRUPTED).is_empty());
}

// ---- subnets out of addresses -------------------------------------------------------------

const FULL: &str = "InsufficientFreeAddressesInSubnet";

impl World {
    /// GIVEN request `id` names `subnets` (each one EC2 knows, in its zone), in this order.
    async fn name_subnets(&self, id: &str, subnets: &[(&str, &str)]) {
        for (subnet, zone) in subnets {
            self.workloads.add_subnet(REGION, subnet, zone);
        }
        let mut rec = self.record(id).await;
        match &mut rec.request.workload {
            capacity_pilot::domain::request::WorkloadDetail::Ec2Instances {
                subnet_ids, ..
            } => *subnet_ids = subnets.iter().map(|(s, _)| s.to_string()).collect(),
            _ => unreachable!(),
        }
        self.store.insert_record(rec);
    }

    /// The subnets the launches since the first `skip` went to.
    fn launched_in(&self, skip: usize) -> Vec<String> {
        self.launches()
            .into_iter()
            .skip(skip)
            .map(|l| l.subnet_id)
            .collect()
    }
}

/// Block r-1's request names three subnets: subnet-a and subnet-b in the block's zone
/// us-east-1a, and subnet-c between them in another zone.
const BLOCK_SUBNETS: &[(&str, &str)] = &[
    ("subnet-a", "us-east-1a"),
    ("subnet-c", "us-east-1b"),
    ("subnet-b", "us-east-1a"),
];

#[tokio::test]
async fn a_block_replacement_whose_zones_first_subnet_is_full_launches_in_its_second() {
    // GIVEN four instances of block cr-1 in subnet-a, one impaired, and subnet-a with
    // addresses for only three (an EFA template takes one per interface per instance)
    let w = World::new(4).await;
    w.name_subnets("r-1", BLOCK_SUBNETS).await;
    w.workloads.subnet_room(REGION, "subnet-a", 3);
    let sick = w.slots().await[1].resource_id.clone();
    w.workloads
        .set_instance_health(&sick, InstanceHealth::Impaired);
    // WHEN the schedule polls status
    let out = w.tick("tick-1").await;
    // THEN the replacement is refused in subnet-a and launches in subnet-b, the zone's next
    // (subnet-c is in another zone), with a token of its own there
    assert_eq!(
        w.launched_in(4),
        ["subnet-a", "subnet-b"],
        "{:?}",
        out.decisions
    );
    let launches = w.launches();
    assert_eq!(launches[4].client_token, client_token("cr-1", 1, 1));
    assert_eq!(
        launches[5].client_token,
        client_token("cr-1@subnet-b", 1, 1)
    );
    assert_eq!(w.live().len(), 4);
    let slot = w.slots().await.into_iter().find(|s| s.slot == 1).unwrap();
    assert_eq!((slot.generation, slot.state.as_str()), (1, "running"));
    assert!(w.live().contains(&slot.resource_id));
    assert_eq!(w.events.published_of(REPLACED).len(), 1);
    // AND later ticks replace nothing more
    w.tick("tick-2").await;
    assert_eq!(w.launches().len(), 6);
}

#[tokio::test]
async fn a_run_replacement_whose_zones_first_subnet_is_full_launches_in_its_second() {
    for market in [LaunchMarket::OnDemand, LaunchMarket::Spot] {
        // GIVEN a run of two in subnet-a (beside block r-1's one instance), one of them
        // stopped or reclaimed, and subnet-a with addresses for only the two left
        let w = World::new(1).await;
        let ids = run_of(&w, market.clone()).await;
        w.name_subnets("r-2", BLOCK_SUBNETS).await;
        w.workloads.subnet_room(REGION, "subnet-a", 2);
        let gone = if market == LaunchMarket::Spot {
            InstanceState::Terminated
        } else {
            InstanceState::Stopped
        };
        w.workloads.set_instance_state(&ids[1], gone);
        // WHEN the schedule polls
        let out = w.tick("tick-1").await;
        // THEN the replacement launches in the run's market in subnet-b, the zone's next
        assert_eq!(
            w.launched_in(3),
            ["subnet-a", "subnet-b"],
            "{market:?}: {:?}",
            out.decisions
        );
        let label = if market == LaunchMarket::Spot {
            "spot"
        } else {
            "on-demand"
        };
        let launch = w.launches().pop().unwrap();
        assert_eq!(launch.market, market);
        assert_eq!(
            launch.client_token,
            client_token(&format!("r-2:{label}:replacement@subnet-b"), 1, 1)
        );
        let slots = w.store.workloads(&request_id("r-2")).await.unwrap();
        let slot = slots.iter().find(|s| s.slot == 1).unwrap();
        assert_eq!((slot.generation, slot.state.as_str()), (1, "running"));
        assert_eq!(
            w.workloads.instance(&slot.resource_id).unwrap().state,
            InstanceState::Running
        );
        assert_eq!(w.events.published_of(REPLACED).len(), 1, "{market:?}");
    }
}

#[tokio::test]
async fn a_replacement_with_every_subnet_of_its_zone_full_waits_for_addresses() {
    // GIVEN four instances of block cr-1 in subnet-a, one stopped, and neither subnet-a nor
    // subnet-b (the zone's two) with a free address
    let w = World::new(4).await;
    w.name_subnets("r-1", BLOCK_SUBNETS).await;
    w.workloads.subnet_room(REGION, "subnet-a", 3);
    w.workloads.subnet_room(REGION, "subnet-b", 0);
    let stopped = w.slots().await[2].resource_id.clone();
    w.workloads
        .set_instance_state(&stopped, InstanceState::Stopped);
    // WHEN the schedule polls
    let out = w.tick("tick-1").await;
    // THEN both are tried, nothing is launched, the request is not failed, and the slot
    // waits for a later tick, saying which subnets were full
    assert_eq!(w.launched_in(4), ["subnet-a", "subnet-b"]);
    assert_eq!(w.live().len(), 3);
    assert_eq!(w.record("r-1").await.status, RequestStatus::Active);
    let waiting = out
        .decisions
        .iter()
        .find(|d| d.action.starts_with("waiting-for"))
        .unwrap_or_else(|| panic!("{:?}", out.decisions));
    assert!(
        waiting.reason.contains("subnet-a") && waiting.reason.contains("subnet-b"),
        "{}",
        waiting.reason
    );
    assert!(!waiting.reason.contains("subnet-c"), "{}", waiting.reason);
    let slot = w.slots().await.into_iter().find(|s| s.slot == 2).unwrap();
    assert_eq!((slot.generation, slot.state.as_str()), (1, REPLACING));
    assert!(w.events.published_of(REPLACED).is_empty());
    // WHEN addresses free up in subnet-b and the next tick runs
    w.workloads.subnet_room(REGION, "subnet-b", 1);
    w.clock.advance(Duration::minutes(5));
    w.tick("tick-2").await;
    // THEN the replacement launches there, once
    assert_eq!(w.launches().pop().unwrap().subnet_id, "subnet-b");
    assert_eq!(w.live().len(), 4);
    let slot = w.slots().await.into_iter().find(|s| s.slot == 2).unwrap();
    assert_eq!((slot.generation, slot.state.as_str()), (1, "running"));
    assert_eq!(w.events.published_of(REPLACED).len(), 1);
}

#[tokio::test]
async fn a_lost_answer_in_the_zones_second_subnet_is_found_by_the_retry() {
    // GIVEN four instances of block cr-1 (of five slots), one impaired; its replacement is
    // refused in subnet-a for addresses, and launches in subnet-b but its answer is lost
    let w = World::new(4).await;
    w.workloads
        .add_reservation_capacity("cr-1", 5, Some("us-east-1a"));
    w.name_subnets("r-1", BLOCK_SUBNETS).await;
    let sick = w.slots().await[1].resource_id.clone();
    w.workloads
        .set_instance_health(&sick, InstanceHealth::Impaired);
    w.workloads.fail_next(
        WorkloadsOp::LaunchInstances,
        PortError::NoCapacity {
            code: FULL.into(),
            message: "scripted: subnet-a is full".into(),
        },
    );
    w.workloads.apply_then_fail_next(
        WorkloadsOp::LaunchInstances,
        PortError::Transient {
            service: "ec2",
            code: "RequestTimeout".into(),
            message: "scripted: the answer is lost".into(),
        },
    );
    assert!(w.replacer(&[]).handle(scheduled("tick-1")).await.is_err());
    assert_eq!(w.launched_in(4), ["subnet-a", "subnet-b"]);
    assert_eq!(w.live().len(), 4);
    // WHEN the next tick retries, subnet-a having room now
    w.clock.advance(Duration::minutes(5));
    let out = w.tick("tick-2").await;
    // THEN it asks subnet-b first, whose token answers the instance the lost call started:
    // nothing more is launched, and the slot records that instance
    assert_eq!(w.live().len(), 4, "{:?}", out.decisions);
    assert_eq!(w.launched_in(6), ["subnet-b"]);
    let slot = w.slots().await.into_iter().find(|s| s.slot == 1).unwrap();
    assert_eq!((slot.generation, slot.state.as_str()), (1, "running"));
    assert!(w.live().contains(&slot.resource_id));
    assert_eq!(w.events.published_of(REPLACED).len(), 1);
}
