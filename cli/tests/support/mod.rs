//! What the CLI's integration tests share: a flow with the stack the CLI reads, and the CLI
//! run as a user's machine runs it, against the flow's stand-ins.

#![allow(dead_code)] // each test binary uses what it needs

use assert_cmd::Command;
use integration_tests::flow::{APPROVER, BUS, Flow, REGION, SOURCE};
use integration_tests::moto::Moto;
use local_cloud::cloudformation::{Stack, StackOutput};
use serde_json::Value;

pub const STACK: &str = "capacity-pilot";
/// The approver's role, as STS names a caller in it.
pub const APPROVER_ARN: &str = "arn:aws:sts::123456789012:assumed-role/capacity-approver/alice";

/// A flow with the stack the CLI reads registered in its emulator: the flow's configuration
/// as the stack's parameters, its bus and table as the outputs.
pub async fn deployed(overrides: &[(&str, &str)], approvers: &str) -> Flow {
    let f = Flow::start_with(11, overrides).await;
    let mut parameters: std::collections::BTreeMap<String, String> = [
        ("AllowedRegions", REGION),
        ("AllowedRequestSources", SOURCE),
        ("ApproverSources", APPROVER),
        ("TeamBudgetsUsd", r#"{"*": "250000"}"#),
        (
            "SageMakerExecutionRoleArn",
            "arn:aws:iam::123456789012:role/sm",
        ),
        ("ApproverPrincipals", approvers),
        ("ApproveAboveUsd", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if let Some((_, v)) = overrides.iter().find(|(k, _)| *k == "APPROVE_ABOVE_USD") {
        parameters.insert("ApproveAboveUsd".into(), v.to_string());
    }
    let stack = Stack {
        name: STACK.into(),
        parameters,
        outputs: vec![
            StackOutput {
                key: "BusName".into(),
                value: BUS.into(),
                description: None,
            },
            StackOutput {
                key: "StateTableName".into(),
                value: f.table.name.clone(),
                description: None,
            },
        ],
        ..Stack::default()
    };
    f.cloud
        .with_world(|w| {
            w.put_stack(REGION, stack)?;
            w.put_identity("AKIDAPPROVER", APPROVER_ARN)
        })
        .expect("the stack and the approver are registered");
    f
}

/// `capacity-pilot` with a user's environment pointed at the stand-ins: the emulator for
/// every service but DynamoDB, moto for that, the flow's simulated clock, no colour, and no
/// profile of the machine's own.
pub fn cli(f: &Flow) -> Command {
    cli_as(f, "AKIDREQUESTER")
}

pub fn cli_as(f: &Flow, access_key: &str) -> Command {
    let moto = Moto::shared().expect("moto");
    let mut c = Command::cargo_bin("capacity-pilot").expect("the CLI is built");
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::temp_dir())
        .env("AWS_ENDPOINT_URL", f.cloud.url())
        .env("AWS_ENDPOINT_URL_DYNAMODB", moto.url())
        .env("AWS_REGION", REGION)
        .env("AWS_ACCESS_KEY_ID", access_key)
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env(
            "CAPACITY_PILOT_CLOCK_URL",
            format!("{}/_local/clock", f.cloud.url()),
        )
        .env("NO_COLOR", "1");
    c
}

/// Writes `v` to a temporary file for `submit`.
pub fn file(name: &str, v: &Value) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("capacity-pilot-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}
