//! The IAM tests' common reads: the workspace's YAML files, and the table of what each AWS
//! operation needs (`infra/iam/operations.yaml`), which the functions' IAM test
//! (`tests/flows/iam.rs`) and the CLI's role-policy test (`cli/tests/policies.rs`) both map
//! recorded calls through.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::moto::workspace_root;

/// A YAML file of the workspace (`infra/template.yaml`), as JSON.
pub fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(workspace_root().join(path))
        .unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}

/// `(service, operation)` -> the IAM actions it needs, implied ones included.
pub fn operation_table() -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut table = BTreeMap::new();
    for (service, ops) in yaml("infra/iam/operations.yaml").as_object().unwrap() {
        for (op, actions) in ops.as_object().unwrap() {
            let actions = actions
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            table.insert((service.clone(), op.clone()), actions);
        }
    }
    table
}
