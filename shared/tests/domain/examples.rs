//! The example request events under `infra/events/requests/`: the valid ones parse, the
//! invalid ones are rejected naming exactly the expected fields. Each is judged at its
//! envelope's `time`, so the examples never go stale.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use capacity_pilot::domain::catalog::SupportedInstanceTypes;
use capacity_pilot::domain::request::{ValidationContext, parse_request};
use chrono::{DateTime, Utc};
use serde_json::Value;

fn events_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/events/requests")
}

fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn judge(envelope: &Value) -> Result<(), Vec<String>> {
    assert_eq!(envelope["detail-type"], "Capacity Request Submitted");
    let now: DateTime<Utc> = envelope["time"].as_str().unwrap().parse().unwrap();
    let types = SupportedInstanceTypes::default();
    let regions = vec![
        "us-east-1".to_string(),
        "us-east-2".into(),
        "us-west-2".into(),
    ];
    let ctx = ValidationContext {
        now,
        instance_types: &types,
        allowed_regions: &regions,
    };
    parse_request(&envelope["detail"], &ctx)
        .map(|_| ())
        .map_err(|ps| ps.into_iter().map(|p| p.field).collect())
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter(|p| !p.ends_with("expected-fields.json"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_valid_example_request_is_accepted() {
    let files = json_files(&events_dir().join("valid"));
    assert!(files.len() >= 5, "{files:?}");
    for f in files {
        if let Err(fields) = judge(&load(&f)) {
            panic!("{f:?} was rejected at {fields:?}");
        }
    }
}

#[test]
fn every_invalid_example_request_is_rejected_at_the_expected_fields() {
    let dir = events_dir().join("invalid");
    let expected: BTreeMap<String, Vec<String>> =
        serde_json::from_value(load(&dir.join("expected-fields.json"))).unwrap();
    let files = json_files(&dir);
    assert_eq!(
        files.len(),
        expected.len(),
        "every invalid example needs an entry in expected-fields.json"
    );
    for f in files {
        let name = f.file_name().unwrap().to_str().unwrap().to_string();
        let want: BTreeSet<String> = expected[&name].iter().cloned().collect();
        match judge(&load(&f)) {
            Ok(()) => panic!("{name} was accepted"),
            Err(got) => assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), want, "{name}"),
        }
    }
}
