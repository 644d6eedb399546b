//! IAM equals the calls. Every flow records, per function, each AWS operation the function
//! actually made (at the SDK's HTTP client, `integration_tests::recorder`). This test plays
//! every flow scenario, maps the recorded operations through the checked-in table
//! `infra/iam/operations.yaml`, and requires the result to equal, function by function, the
//! actions the function's IAM statements grant in `infra/template.yaml`: nothing missing (the
//! function would fail in AWS) and nothing extra (least privilege).

use std::collections::{BTreeMap, BTreeSet};

use integration_tests::flow::{Function, observed};
use integration_tests::iam::{operation_table, yaml};
use serde_json::Value;

/// Each function (by crate name) -> every action its IAM statements allow.
fn granted() -> BTreeMap<String, BTreeSet<String>> {
    let template = yaml("infra/template.yaml");
    let mut out = BTreeMap::new();
    for resource in template["Resources"].as_object().unwrap().values() {
        if resource["Type"] != "AWS::Serverless::Function" {
            continue;
        }
        let props = &resource["Properties"];
        let name = props["CodeUri"]
            .as_str()
            .unwrap()
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap()
            .to_string();
        let mut actions = BTreeSet::new();
        for policy in props["Policies"].as_array().into_iter().flatten() {
            for statement in policy["Statement"].as_array().into_iter().flatten() {
                assert_eq!(
                    statement["Effect"], "Allow",
                    "{name}: only Allow statements"
                );
                match &statement["Action"] {
                    Value::String(a) => {
                        actions.insert(a.clone());
                    }
                    Value::Array(all) => {
                        actions.extend(all.iter().map(|a| a.as_str().unwrap().to_string()));
                    }
                    other => panic!("{name}: Action {other}"),
                }
            }
        }
        out.insert(name, actions);
    }
    out
}

#[test]
fn no_action_is_a_wildcard() {
    for (f, actions) in granted() {
        for a in actions {
            assert!(!a.contains('*'), "{f} is granted {a}");
        }
    }
}

#[test]
fn each_functions_iam_actions_equal_the_operations_it_calls() {
    // Every scenario, one after another, so all of their calls are recorded by the end.
    crate::play_all();

    let table = operation_table();
    let granted = granted();
    let seen = observed();
    let mut wrong = Vec::new();
    for f in Function::ALL {
        let name = f.crate_name();
        let mut needed = BTreeSet::new();
        for op in seen.get(&f).into_iter().flatten() {
            match table.get(op) {
                Some(actions) => needed.extend(actions.iter().cloned()),
                None => wrong.push(format!(
                    "{name} calls {}:{}, which infra/iam/operations.yaml does not map",
                    op.0, op.1
                )),
            }
        }
        let has = granted.get(name).cloned().unwrap_or_default();
        for missing in needed.difference(&has) {
            wrong.push(format!(
                "{name} calls what needs {missing}, which the template does not grant"
            ));
        }
        for extra in has.difference(&needed) {
            wrong.push(format!(
                "{name} is granted {extra}, which nothing it was seen calling needs"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
