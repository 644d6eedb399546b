//! Routing: every rule's event pattern in `infra/template.yaml`, matched with `quamina` as
//! EventBridge would, against every sample event under `infra/events/`. Each event must reach
//! exactly the functions it should, on the bus it arrives on, and no other bus.

use std::path::{Path, PathBuf};

use chrono::TimeDelta;
use local_cloud::rules::{Bus, Rules, Target};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rules() -> Rules {
    Rules::from_template(&root().join("infra/template.yaml")).expect("the template's rules")
}

fn samples(dir: &str) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = std::fs::read_dir(root().join("infra/events").join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| p.file_name().is_some_and(|n| n != "expected-fields.json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let name = format!("{dir}/{}", p.file_name().unwrap().to_string_lossy());
            (name, serde_json::from_str(&text).unwrap())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no samples in {dir}");
    out
}

/// Where each sample arrives and which functions it must reach there.
fn expected(name: &str) -> (Bus, &'static [&'static str]) {
    let custom = Bus::Custom;
    let default = Bus::Default;
    match name {
        "aws/capacity-block-delivered.json" | "aws/capacity-block-reservation-delivered.json" => {
            (default, &["launch-workloads"])
        }
        "aws/capacity-block-expiration-warning.json"
        | "aws/capacity-block-reservation-expiration-warning.json" => {
            (default, &["cleanup-expired"])
        }
        "aws/ec2-instance-terminated.json"
        | "aws/ec2-instance-stopped.json"
        | "aws/aws-health-ec2-retirement.json" => (default, &["replace-unhealthy"]),
        // A launch is not a failure; schedules are their own rules, not patterns.
        "aws/ec2-instance-running.json" | "aws/scheduled-event.json" => (default, &[]),
        "inbound/capacity-request-cancelled.json"
        | "inbound/capacity-request-cancelled-stop-running.json"
        | "inbound/capacity-purchase-approved.json"
        | "inbound/capacity-purchase-rejected.json"
        | "inbound/capacity-extension-requested.json" => (custom, &["purchase-capacity"]),
        // Nobody outside may speak for capacity-pilot, and capacity-pilot submits nothing.
        "inbound/forged-offerings-found.json" | "inbound/forged-submitted.json" => (custom, &[]),
        n if n.starts_with("requests/") => (custom, &["search-offerings"]),
        "emitted/capacity-offerings-found.json" => (custom, &["purchase-capacity"]),
        // Our other events are for other systems: no function of ours consumes them.
        n if n.starts_with("emitted/") => (custom, &[]),
        other => panic!("no routing expectation for {other}: add one"),
    }
}

#[test]
fn every_sample_event_reaches_exactly_its_functions_on_its_bus() {
    let rules = rules();
    let mut wrong = Vec::new();
    for dir in [
        "aws",
        "inbound",
        "emitted",
        "requests/valid",
        "requests/invalid",
    ] {
        for (name, ev) in samples(dir) {
            let (bus, want) = expected(&name);
            let other = match bus {
                Bus::Custom => Bus::Default,
                Bus::Default => Bus::Custom,
            };
            let got = rules.functions_for(bus, &ev);
            if got != want {
                wrong.push(format!("{name} on {bus:?}: reached {got:?}, want {want:?}"));
            }
            let stray = rules.functions_for(other, &ev);
            if !stray.is_empty() {
                wrong.push(format!("{name} on {other:?}: reached {stray:?}, want none"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn every_function_has_its_schedule_on_the_default_bus() {
    let mut schedules: Vec<(String, TimeDelta)> = rules()
        .schedules()
        .into_iter()
        .map(|(f, every)| (f.to_string(), every))
        .collect();
    schedules.sort();
    let want: Vec<(String, TimeDelta)> = [
        ("cleanup-expired", 5),
        ("launch-workloads", 1),
        ("purchase-capacity", 5),
        ("replace-unhealthy", 5),
        ("search-offerings", 5),
    ]
    .into_iter()
    .map(|(f, m)| (f.to_string(), TimeDelta::minutes(m)))
    .collect();
    assert_eq!(schedules, want);
}

#[test]
fn the_template_wires_every_function_crate_in_the_workspace() {
    // The rules that invoke a function (the event log's rule targets a log group).
    let mut wired: Vec<String> = rules()
        .all()
        .iter()
        .filter(|r| r.target == Target::Function)
        .map(|r| r.function.clone())
        .collect();
    wired.sort();
    wired.dedup();
    let mut crates: Vec<String> = std::fs::read_dir(root().join("functions"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    crates.sort();
    assert_eq!(wired, crates);
}
