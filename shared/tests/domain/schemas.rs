//! The checked-in JSON Schemas under `infra/events/schemas/` match the Rust types.
//! After changing an event type, regenerate them with `make schemas`.

use std::path::{Path, PathBuf};

use capacity_pilot::domain::events::schemas;
use serde_json::Value;

/// Keys sorted at every level, so the text is the same whether or not some other crate in
/// the build turns on serde_json's `preserve_order` (features unify across the workspace).
pub(crate) fn canonical(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, canonical(v)))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.into_iter().map(canonical).collect()),
        other => other,
    }
}

fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/events/schemas")
}

#[test]
fn the_checked_in_schemas_match_the_types() {
    let dir = schema_dir();
    let update = std::env::var_os("UPDATE_SCHEMAS").is_some();
    let mut drifted = Vec::new();
    for (stem, schema) in schemas() {
        let path = dir.join(format!("{stem}.json"));
        let value = canonical(serde_json::to_value(&schema).unwrap());
        let want = serde_json::to_string_pretty(&value).unwrap() + "\n";
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &want).unwrap();
            continue;
        }
        // Compared as JSON values: key order is not part of a schema.
        let have = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok());
        if have.as_ref() != Some(&value) {
            drifted.push(stem);
        }
    }
    assert!(
        drifted.is_empty(),
        "schemas drifted from the types: {drifted:?}; run `make schemas` and review the diff"
    );
    // Nothing stale is left behind either.
    let known: Vec<String> = schemas().iter().map(|(s, _)| format!("{s}.json")).collect();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(known.contains(&name), "{name} has no type; delete it");
    }
}

#[test]
fn the_request_schema_describes_the_example_requests() {
    // A cheap structural check that the schema and the examples agree on the field set.
    let schema = serde_json::to_value(
        schemas()
            .into_iter()
            .find(|(s, _)| *s == "capacity-request-submitted")
            .unwrap()
            .1,
    )
    .unwrap();
    let props = schema["properties"].as_object().unwrap();
    let example: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../infra/events/requests/valid/ec2-capacity-block.json"),
        )
        .unwrap(),
    )
    .unwrap();
    for key in example["detail"].as_object().unwrap().keys() {
        assert!(props.contains_key(key), "{key} not in the schema");
    }
}
