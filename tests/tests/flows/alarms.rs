//! The operations kit's outcome alarms (issue 56) count what the code paths they watch emit.
//! Each alarm's metric is read from `infra/template.yaml`, with the metric filter that makes
//! it: an event-log filter must match the event the code published, as the template's rule
//! routes it to the event log; a function-log filter must match the JSON line that function
//! wrote, in the format Lambda's runtime writes it. The patterns are evaluated by
//! `local_cloud::logs`, the emulator's reading of CloudWatch Logs' filter syntax.

use std::io::Write;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use integration_tests::flow::{Flow, Function};
use integration_tests::iam::yaml;
use local_cloud::rules::{Bus, Rules, Target};
use serde_json::Value;

use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::time_rules::OVERDUE_AFTER;

/// The log group a metric filter reads and its pattern: what makes an alarm's metric.
#[derive(Debug)]
struct Counter {
    log_group: String,
    pattern: String,
}

/// The metric filter that makes `alarm`'s metric (its name and namespace as the template
/// writes them).
fn counter(alarm: &str) -> Counter {
    let t = yaml("infra/template.yaml");
    let resources = t["Resources"].as_object().unwrap();
    let a = &resources
        .get(alarm)
        .unwrap_or_else(|| panic!("the template has no {alarm}"))["Properties"];
    let made: Vec<Counter> = resources
        .values()
        .filter(|r| r["Type"] == "AWS::Logs::MetricFilter")
        .map(|r| &r["Properties"])
        .filter(|p| {
            let m = &p["MetricTransformations"][0];
            m["MetricName"] == a["MetricName"] && m["MetricNamespace"] == a["Namespace"]
        })
        .map(|p| Counter {
            log_group: p["LogGroupName"]["Ref"].as_str().unwrap().to_string(),
            pattern: p["FilterPattern"].as_str().unwrap().to_string(),
        })
        .collect();
    assert_eq!(
        made.len(),
        1,
        "{alarm}: the filters making its metric: {made:?}"
    );
    made.into_iter().next().unwrap()
}

fn rules() -> Rules {
    Rules::from_template(&integration_tests::moto::workspace_root().join("infra/template.yaml"))
        .unwrap()
}

/// Whether `alarm`'s metric counts `event` (an envelope as our bus carries it): the template
/// routes it to the event log, and the event log's filter matches it.
fn counts(alarm: &str, event: &Value) -> bool {
    let c = counter(alarm);
    assert_eq!(
        c.log_group, "EventLog",
        "{alarm} does not watch the event log"
    );
    let logged = rules()
        .matching(Bus::Custom, event)
        .iter()
        .any(|r| r.target == Target::LogGroup("EventLog".into()));
    assert!(logged, "{event} is not routed to the event log");
    local_cloud::logs::matches(&c.pattern, event).unwrap()
}

/// `alarm` counts `event`, which a code path published.
pub(crate) fn assert_counted(alarm: &str, event: &Value) {
    assert!(
        counts(alarm, event),
        "{alarm} does not count {event}: {}",
        counter(alarm).pattern
    );
}

/// The outcome alarms on the event log, and which published event each counts.
const EVENT_ALARMS: [&str; 4] = [
    "PaymentFailedAlarm",
    "DrainLateAlarm",
    "PurchaseInDoubtAlarm",
    "ReservationUnrecordedAlarm",
];

/// Every emitted sample (the events' own types wrote them) is in the event log, and each
/// outcome alarm counts its own event and no other: a timely drain pages no one.
#[test]
fn each_outcome_alarm_counts_its_event_and_no_other() {
    let dir = integration_tests::moto::workspace_root().join("infra/events/emitted");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let event: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut variants = vec![event.clone()];
        if event["detail-type"] == "Capacity Workload Drained" {
            for late in [true, false] {
                let mut v = event.clone();
                v["detail"]["late"] = Value::Bool(late);
                variants.push(v);
            }
        }
        for e in variants {
            let expected: Vec<&str> =
                match (e["detail-type"].as_str().unwrap(), &e["detail"]["late"]) {
                    ("Capacity Payment Failed", _) => vec!["PaymentFailedAlarm"],
                    ("Capacity Workload Drained", Value::Bool(true)) => vec!["DrainLateAlarm"],
                    ("Capacity Purchase In Doubt", _) => vec!["PurchaseInDoubtAlarm"],
                    ("Capacity Reservation Unrecorded", _) => vec!["ReservationUnrecordedAlarm"],
                    _ => vec![],
                };
            let counted: Vec<&str> = EVENT_ALARMS.into_iter().filter(|a| counts(a, &e)).collect();
            assert_eq!(counted, expected, "{}: {e}", path.display());
            seen += 1;
        }
    }
    assert!(seen > 20, "only {seen} samples");
}

#[tokio::test]
pub(crate) async fn a_drain_after_the_forced_termination_is_counted_by_the_late_drain_alarm() {
    // GIVEN a block bought and its workload launched
    let f = Flow::start().await;
    let id = "alarm-late-drain";
    f.submit(f.ec2_request(id)).await;
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    let reserved = f.bus_for("Capacity Reserved", id)[0].clone();
    let at = |k: &str| {
        reserved["detail"][k]
            .as_str()
            .unwrap()
            .parse::<DateTime<Utc>>()
            .unwrap()
    };
    f.cloud.advance_to(at("start") + f.activation());
    f.tick(Function::Launch).await.unwrap();
    assert_eq!(f.status(id).await, RequestStatus::Active);
    // WHEN cleanup-expired first runs after AWS's forced termination (30 min before the end)
    f.cloud.advance_to(at("end") - Duration::minutes(25));
    f.tick(Function::Cleanup).await.unwrap();
    // THEN its drain is late, and the late-drain alarm counts it
    let drained = f.bus_for("Capacity Workload Drained", id);
    assert_eq!(drained.len(), 1, "{drained:#?}");
    assert_eq!(drained[0]["detail"]["late"], true);
    assert_counted("DrainLateAlarm", &drained[0]);
}

/// The functions' log lines, written as `lambda_runtime::tracing::init_default_subscriber`
/// writes them under Lambda's JSON log format (lambda_runtime_api_client 1.1's tracing.rs:
/// `fmt().with_target(false).without_time()...json()`), warnings and up, while the guard
/// lives, on this thread only (the flow's handlers run on the test's one thread; a global
/// subscriber would log every other test of the binary too).
fn function_logs() -> (Arc<Mutex<Vec<u8>>>, impl Drop) {
    use tracing_subscriber::util::SubscriberInitExt;
    let buf = Arc::new(Mutex::new(Vec::new()));
    let writer = Sink(buf.clone());
    let guard = tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_writer(move || writer.clone())
        .json()
        .finish()
        .set_default();
    (buf, guard)
}

#[derive(Clone)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
pub(crate) async fn a_request_past_its_next_action_is_counted_by_the_overdue_alarm() {
    let (logs, _guard) = function_logs();
    // GIVEN a request bought, whose payment check is due, and a purchase function that
    // does not run (an outage)
    let f = Flow::start().await;
    let id = "alarm-overdue";
    f.submit(f.ec2_request(id)).await;
    f.deliver().await;
    assert_eq!(f.status(id).await, RequestStatus::Reserved);
    // (cleanup-expired running on time meanwhile: the window's notices are planned)
    f.tick(Function::Cleanup).await.unwrap();
    let due = f
        .record(id)
        .await
        .next_action_at
        .expect("a payment check is due");
    let counter = counter("RequestOverdueAlarm");
    assert_eq!(counter.log_group, "CleanupExpiredLogs");
    let lines = |id: &str| -> Vec<Value> {
        String::from_utf8_lossy(&logs.lock().unwrap())
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["fields"]["request_id"] == id)
            .filter(|l| local_cloud::logs::matches(&counter.pattern, l).unwrap())
            .collect()
    };
    // WHEN cleanup-expired's tick comes within the bound, nothing is counted
    f.cloud.advance_to(due + OVERDUE_AFTER);
    f.tick(Function::Cleanup).await.unwrap();
    assert!(lines(id).is_empty(), "{:?}", lines(id));
    // WHEN it comes past the bound
    f.cloud
        .advance_to(due + OVERDUE_AFTER + Duration::minutes(5));
    f.tick(Function::Cleanup).await.unwrap();
    // THEN its log line is counted by the alarm's filter, naming the request
    let counted = lines(id);
    assert_eq!(counted.len(), 1, "{counted:#?}");
    assert_eq!(counted[0]["level"], "WARN");
    assert_eq!(counted[0]["fields"]["overdue_minutes"], 35);
}
