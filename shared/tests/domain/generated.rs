//! What the documentation lists that the code knows: the request's field table
//! (docs/requests.md, from the request's JSON Schema and the sample requests) and the
//! `errorType` runbook entries (docs/operations.md, from `decision::ERROR_TYPES`). Each sits between
//! `<!-- BEGIN GENERATED: <what> (make schemas) -->` and `<!-- END GENERATED -->`; `make
//! schemas` rewrites it, and these tests fail when a checked-in copy differs.

use std::path::{Path, PathBuf};

use capacity_pilot::decision::ERROR_TYPES;
use capacity_pilot::domain::events::schemas;
use capacity_pilot::domain::request::WORKLOAD_REQUIRED;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Writes (under `UPDATE_SCHEMAS`) or checks the generated block `what` of `page`.
fn generated(page: &str, what: &str, body: &str) {
    let path = repo().join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
    let begin = format!("<!-- BEGIN GENERATED: {what} (make schemas) -->\n");
    let end = "<!-- END GENERATED -->";
    let start = text
        .find(&begin)
        .unwrap_or_else(|| panic!("{page} has no line {begin:?}"))
        + begin.len();
    let stop = start
        + text[start..]
            .find(end)
            .unwrap_or_else(|| panic!("{page}: {what} is not closed by {end}"));
    if std::env::var_os("UPDATE_SCHEMAS").is_some() {
        let new = format!("{}{body}{}", &text[..start], &text[stop..]);
        std::fs::write(&path, new).unwrap();
        return;
    }
    assert!(
        text[start..stop] == *body,
        "{page}'s {what} differs from the code's; run `make schemas` and review the diff"
    );
}

/// `v`, or what its `$ref` names, or the non-null branch of an optional.
fn resolve<'a>(root: &'a Value, v: &'a Value) -> &'a Value {
    if let Some(r) = v["$ref"].as_str() {
        let name = r.trim_start_matches("#/$defs/");
        return resolve(root, &root["$defs"][name]);
    }
    if let Some(branch) = v["anyOf"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["type"] != "null"))
    {
        return resolve(root, branch);
    }
    v
}

fn one_line(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// Its type as a reader says it, and the values it may take when they are few.
fn kind_of(root: &Value, field: &Value) -> (String, String) {
    let v = resolve(root, field);
    let values: Vec<String> = v["oneOf"]
        .as_array()
        .map(|o| {
            o.iter()
                .filter_map(|c| c["const"].as_str())
                .collect::<Vec<_>>()
        })
        .or_else(|| {
            v["enum"]
                .as_array()
                .map(|e| e.iter().filter_map(Value::as_str).collect::<Vec<_>>())
        })
        .unwrap_or_default()
        .into_iter()
        .map(|s: &str| format!("`{s}`"))
        .collect();
    // `["string", "null"]`: an optional string.
    let ty_name = v["type"].as_str().or_else(|| {
        v["type"]
            .as_array()
            .and_then(|t| t.iter().filter_map(Value::as_str).find(|t| *t != "null"))
    });
    let ty = match (ty_name, v["format"].as_str()) {
        (_, Some("date-time")) => "time".to_string(),
        (Some("array"), _) => {
            let item = resolve(root, &v["items"]);
            let of = if item["enum"].is_array() {
                "string"
            } else {
                item["type"].as_str().unwrap_or("object")
            };
            format!("list of {of}")
        }
        (Some("object"), _) if v["additionalProperties"].is_object() => "map".into(),
        (Some(t), _) if v["pattern"].as_str().is_some_and(|p| p.contains("[0-9]+")) => {
            format!("{t} (USD)")
        }
        (Some(t), _) => t.to_string(),
        (None, _) if !values.is_empty() => "string".into(),
        _ => "object".into(),
    };
    let values = if values.is_empty() {
        String::new()
    } else {
        format!(" One of {}.", values.join(", "))
    };
    (ty, values)
}

fn example(v: Option<&Value>) -> String {
    match v {
        None => String::new(),
        Some(v) => {
            let s = v.to_string();
            let s = if s.chars().count() > 36 {
                format!("{}…", s.chars().take(35).collect::<String>())
            } else {
                s
            };
            format!("`{}`", s.replace('|', "\\|"))
        }
    }
}

fn sample(path: &str) -> Value {
    let text = std::fs::read_to_string(repo().join("infra/events/requests/valid").join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str::<Value>(&text).unwrap()["detail"].clone()
}

/// The field table: every field of a request, then each workload kind's.
fn field_table() -> String {
    let schema = schemas()
        .into_iter()
        .find(|(s, _)| *s == "capacity-request-submitted")
        .unwrap()
        .1;
    let root = serde_json::to_value(&schema).unwrap();
    let ec2 = sample("ec2-capacity-block.json");
    let mut out = String::from(
        "| Field | Type | Required | Default | What it means | Example |\n\
         |---|---|---|---|---|---|\n",
    );
    let mut row = |name: &str, field: &Value, required: &str, ex: Option<&Value>| {
        let (ty, values) = kind_of(&root, field);
        let description = field["description"]
            .as_str()
            .or(resolve(&root, field)["description"].as_str())
            .unwrap_or_default();
        let default = match &field["default"] {
            Value::Null => String::new(),
            d => format!("`{d}`"),
        };
        out.push_str(&format!(
            "| `{name}` | {ty} | {required} | {default} | {}{values} | {} |\n",
            one_line(description),
            example(ex)
        ));
    };
    let required: Vec<&str> = root["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let props = root["properties"].as_object().unwrap();
    let mut names: Vec<&String> = props.keys().collect();
    // Required first, in the schema's order, then the rest by name.
    names.sort_by_key(|n| {
        (
            required
                .iter()
                .position(|r| r == n)
                .unwrap_or(required.len()),
            n.to_string(),
        )
    });
    for name in names {
        let field = &props[name.as_str()];
        let is = if required.contains(&name.as_str()) {
            "yes"
        } else {
            ""
        };
        match name.as_str() {
            "budget" => {
                let budget = resolve(&root, field);
                let need: Vec<&str> = budget["required"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                for (sub, f) in budget["properties"].as_object().unwrap() {
                    let is = if need.contains(&sub.as_str()) {
                        "yes"
                    } else {
                        ""
                    };
                    row(&format!("budget.{sub}"), f, is, ec2["budget"].get(sub));
                }
            }
            "workload" => {
                row(
                    "workload.kind",
                    &serde_json::json!({"description": resolve(&root, field)["description"],
                        "enum": WORKLOAD_REQUIRED.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
                        "type": "string"}),
                    "yes",
                    ec2["workload"].get("kind"),
                );
            }
            _ => row(name, field, is, ec2.get(name.as_str())),
        }
    }
    // Each kind's fields, with the sample request of that kind as the example.
    let samples = [
        ("ec2-instances", "ec2-capacity-block.json"),
        ("training-job", "training-job-split-plan.json"),
        ("hyperpod-cluster", "hyperpod-cluster-plan.json"),
        ("inference-endpoint", "inference-endpoint-plan.json"),
    ];
    let variants = resolve(&root, &root["properties"]["workload"])["oneOf"]
        .as_array()
        .unwrap();
    for (kind, file) in samples {
        let v = variants
            .iter()
            .find(|v| v["properties"]["kind"]["const"] == kind)
            .unwrap_or_else(|| panic!("no workload kind {kind}"));
        let workload = sample(file)["workload"].clone();
        let need: Vec<&str> = v["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for (sub, f) in v["properties"].as_object().unwrap() {
            if sub == "kind" {
                continue;
            }
            let is = if need.contains(&sub.as_str()) {
                format!("for {kind}")
            } else {
                format!("({kind})")
            };
            row(&format!("workload.{sub}"), f, &is, workload.get(sub));
        }
    }
    out
}

#[test]
fn generated_request_field_table_matches_the_schema() {
    generated("docs/requests.md", "request fields", &field_table());
}

/// The runbook's entry for each `errorType`: a heading (its GitHub anchor is the name in lower
/// case, which tests/tests/deploy.rs looks for), what it means, whether the next tick heals
/// it, what to do, and the command to look with.
#[test]
fn generated_error_type_list_matches_the_code() {
    let mut body = String::new();
    for t in ERROR_TYPES {
        body.push_str(&format!(
            "### `{}`\n\n{}\n\n- **Heals by itself?** {}\n- **What to do:** {}\n- **Look:** `{}`\n\n",
            t.name,
            one_line(t.meaning),
            one_line(t.heals),
            one_line(t.action),
            t.look,
        ));
    }
    generated("docs/operations.md", "errorType", &body);
}
