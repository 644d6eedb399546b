//! What deploying needs that no flow exercises: alarms that reach someone (ARCHITECTURE 8.11:
//! every SNS topic under the stack's customer-managed KMS key, which CloudWatch and
//! EventBridge may use, and a topic policy letting both publish), the region forwarder
//! (ARCHITECTURE 8.9: exactly the home rules' AWS-event patterns, to the home default bus,
//! with a role that may do nothing else), `make deploy-forwarders` run against a stub
//! `sam`, a release profile that leaves cargo-lambda nothing to choose, and the bus policy's
//! SourcePrincipals guards (issue 49, Teams), expanded from their `Fn::ForEach` as
//! CloudFormation would; the operations kit (issue 56, `operations`) and the cost model
//! (`cost`). Nothing here touches the network or AWS.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Map, Value, json};

/// The services that publish alarms and notices.
const PUBLISHERS: [&str; 2] = ["cloudwatch.amazonaws.com", "events.amazonaws.com"];
const HOME_DEFAULT_BUS: &str =
    "arn:${AWS::Partition}:events:${HomeRegion}:${AWS::AccountId}:event-bus/default";
const FORWARDER: &str = "infra/region-forwarder.yaml";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn resources(template: &Value) -> &Map<String, Value> {
    template["Resources"].as_object().expect("Resources")
}

fn of_type<'a>(template: &'a Value, kind: &str) -> Vec<(&'a String, &'a Value)> {
    resources(template)
        .iter()
        .filter(|(_, r)| r["Type"] == kind)
        .collect()
}

/// A string or a list of strings, as IAM writes Action, Principal.Service and the like.
fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Null => vec![],
        Value::String(s) => vec![s.clone()],
        Value::Array(all) => all
            .iter()
            .map(|s| {
                s.as_str()
                    .unwrap_or_else(|| panic!("not a string: {s}"))
                    .to_string()
            })
            .collect(),
        other => panic!("neither a string nor a list: {other}"),
    }
}

/// A value or a list of values (Resource, Topics).
fn one_or_many(v: &Value) -> Vec<&Value> {
    match v {
        Value::Array(all) => all.iter().collect(),
        Value::Null => vec![],
        one => vec![one],
    }
}

/// The logical id a `Ref` or `Fn::GetAtt` points at.
fn referenced(v: &Value) -> Option<&str> {
    if let Some(name) = v.get("Ref").and_then(Value::as_str) {
        return Some(name);
    }
    match v.get("Fn::GetAtt")? {
        Value::Array(parts) => parts.first()?.as_str(),
        Value::String(dotted) => dotted.split('.').next(),
        _ => None,
    }
}

fn statements(document: &Value) -> Vec<&Value> {
    one_or_many(&document["Statement"])
}

/// Statements allowing `service` the `action`, exactly as written (no wildcard reading).
fn allowing<'a>(document: &'a Value, service: &str, action: &str) -> Vec<&'a Value> {
    statements(document)
        .into_iter()
        .filter(|s| s["Effect"] == "Allow")
        .filter(|s| {
            strings(&s["Principal"]["Service"])
                .iter()
                .any(|p| p == service)
        })
        .filter(|s| strings(&s["Action"]).iter().any(|a| a == action))
        .collect()
}

/// The statement is conditioned on the caller acting for this stack's account.
fn for_this_account(statement: &Value) -> bool {
    statement["Condition"]["StringEquals"]["aws:SourceAccount"] == json!({"Ref": "AWS::AccountId"})
}

#[test]
fn every_topic_is_under_the_stacks_key_which_alarms_and_rules_may_use() {
    let template = yaml("infra/template.yaml");
    let topics = of_type(&template, "AWS::SNS::Topic");
    assert!(!topics.is_empty(), "the alarm topic is gone");
    let mut keys = BTreeSet::new();
    for (name, topic) in &topics {
        let key_id = &topic["Properties"]["KmsMasterKeyId"];
        let key = referenced(key_id).unwrap_or_else(|| {
            panic!(
                "{name}: KmsMasterKeyId {key_id} is not the template's KMS key (CloudWatch and \
                 EventBridge cannot publish to a topic under an AWS-managed key such as \
                 alias/aws/sns)"
            )
        });
        assert_eq!(
            resources(&template)[key]["Type"],
            "AWS::KMS::Key",
            "{name}: KmsMasterKeyId names {key}, not an AWS::KMS::Key of the template"
        );
        keys.insert(key.to_string());
    }
    assert_eq!(
        keys.len(),
        1,
        "one key for every topic (8.11), not {keys:?}"
    );

    let key_name = keys.first().unwrap();
    let key = &resources(&template)[key_name.as_str()]["Properties"];
    assert_eq!(key["EnableKeyRotation"], true, "{key_name}: rotation on");
    assert_ne!(key["Enabled"], false, "{key_name}: enabled");
    let policy = &key["KeyPolicy"];
    assert!(
        statements(policy).iter().all(|s| s["Effect"] == "Allow"),
        "{key_name}: a Deny would need its own reading here"
    );
    for service in PUBLISHERS {
        for action in ["kms:Decrypt", "kms:GenerateDataKey*"] {
            let grants = allowing(policy, service, action);
            assert!(
                !grants.is_empty(),
                "{key_name}'s key policy does not let {service} {action}"
            );
            assert!(
                grants.iter().all(|s| for_this_account(s)),
                "{key_name}: {service} {action} only for this account (aws:SourceAccount)"
            );
        }
    }
    // The account keeps the key manageable (without it the key could not be changed again).
    let account = statements(policy).into_iter().any(|s| {
        s["Principal"]["AWS"]
            == json!({"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"})
            && strings(&s["Action"]).iter().any(|a| a == "kms:*")
    });
    assert!(account, "{key_name}: the account root administers the key");
}

#[test]
fn alarms_and_rules_may_publish_to_every_topic() {
    let template = yaml("infra/template.yaml");
    let policies = of_type(&template, "AWS::SNS::TopicPolicy");
    for (topic, _) in of_type(&template, "AWS::SNS::Topic") {
        let reference = json!({"Ref": topic});
        let covering: Vec<_> = policies
            .iter()
            .filter(|(_, p)| one_or_many(&p["Properties"]["Topics"]).contains(&&reference))
            .collect();
        assert!(
            !covering.is_empty(),
            "no AWS::SNS::TopicPolicy covers {topic}"
        );
        for service in PUBLISHERS {
            let grants: Vec<&Value> = covering
                .iter()
                .flat_map(|(_, p)| {
                    allowing(&p["Properties"]["PolicyDocument"], service, "sns:Publish")
                })
                .filter(|s| {
                    one_or_many(&s["Resource"])
                        .iter()
                        .any(|r| **r == reference || **r == "*")
                })
                .collect();
            assert!(
                !grants.is_empty(),
                "no topic policy lets {service} sns:Publish to {topic}"
            );
            assert!(
                grants.iter().all(|s| for_this_account(s)),
                "{topic}: {service} publishes only for this account (aws:SourceAccount)"
            );
        }
    }
}

/// A pattern with its object keys sorted, to compare patterns as values.
/// No event is lost unseen (issue 22's "a submission whose every delivery failed is in the
/// dead-letter queue"): every rule and schedule of every function sends what EventBridge
/// could not deliver to `DeliveryQueue`, every function's async invocations that failed every
/// retry go to `FailureQueue`, and each queue has an alarm at its first message that reaches
/// the alarm topic.
#[test]
fn undelivered_events_and_failed_invocations_land_in_queues_alarmed_at_one_message() {
    let t = yaml("infra/template.yaml");
    let globals = &t["Globals"]["Function"]["DeadLetterQueue"];
    assert_eq!(globals["Type"], "SQS");
    assert_eq!(referenced(&globals["TargetArn"]), Some("FailureQueue"));
    let functions = of_type(&t, "AWS::Serverless::Function");
    assert_eq!(functions.len(), 5);
    for (name, f) in functions {
        let own = &f["Properties"]["DeadLetterQueue"];
        assert!(
            own.is_null() || referenced(&own["TargetArn"]) == Some("FailureQueue"),
            "{name} overrides its dead-letter queue"
        );
        let events = f["Properties"]["Events"].as_object().expect("Events");
        assert!(!events.is_empty(), "{name} has no trigger");
        for (ev, e) in events {
            let dlq = &e["Properties"]["DeadLetterConfig"]["Arn"];
            assert_eq!(
                referenced(dlq),
                Some("DeliveryQueue"),
                "{name}'s {ev} has no DeliveryQueue dead-letter config"
            );
        }
    }
    for queue in ["FailureQueue", "DeliveryQueue"] {
        let alarms: Vec<_> = of_type(&t, "AWS::CloudWatch::Alarm")
            .into_iter()
            .filter(|(_, a)| {
                let p = &a["Properties"];
                p["Namespace"] == "AWS/SQS"
                    && p["MetricName"] == "ApproximateNumberOfMessagesVisible"
                    && one_or_many(&p["Dimensions"])
                        .iter()
                        .any(|d| d["Name"] == "QueueName" && referenced(&d["Value"]) == Some(queue))
                    && p["Threshold"] == 1
                    && p["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
                    && one_or_many(&p["AlarmActions"])
                        .iter()
                        .any(|a| referenced(a) == Some("AlarmTopic"))
            })
            .collect();
        assert_eq!(alarms.len(), 1, "{queue} has no alarm at its first message");
    }
}

fn canonical(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let m: BTreeMap<&String, Value> = m.iter().map(|(k, v)| (k, sorted(v))).collect();
                Value::Object(m.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(all) => Value::Array(all.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string(&sorted(v)).unwrap()
}

fn on_default_bus(bus: &Value) -> bool {
    bus.is_null() || *bus == "default"
}

fn matches_aws_events(pattern: &Value) -> bool {
    one_or_many(&pattern["source"])
        .iter()
        .any(|s| s.as_str().is_some_and(|s| s.starts_with("aws.")))
}

/// The patterns of the home stack's rules for AWS events on the default bus: the functions'
/// SAM EventBridgeRule events, and any plain AWS::Events::Rule.
fn home_aws_patterns() -> BTreeMap<String, String> {
    let template = yaml("infra/template.yaml");
    let mut out = BTreeMap::new();
    for (name, resource) in resources(&template) {
        let props = &resource["Properties"];
        let mut rules = Vec::new();
        if resource["Type"] == "AWS::Serverless::Function" {
            for (event, e) in props["Events"].as_object().into_iter().flatten() {
                if e["Type"] == "EventBridgeRule" {
                    let p = &e["Properties"];
                    rules.push((format!("{name}.{event}"), &p["EventBusName"], &p["Pattern"]));
                }
            }
        } else if resource["Type"] == "AWS::Events::Rule" && !props["EventPattern"].is_null() {
            rules.push((name.clone(), &props["EventBusName"], &props["EventPattern"]));
        }
        for (rule, bus, pattern) in rules {
            if on_default_bus(bus) && matches_aws_events(pattern) {
                out.insert(canonical(pattern), rule);
            }
        }
    }
    assert!(!out.is_empty(), "no home rule for AWS events found");
    out
}

#[test]
fn the_forwarder_forwards_exactly_the_aws_events_the_home_rules_consume() {
    let forwarder = yaml(FORWARDER);
    let mut forwarded = BTreeMap::new();
    for (name, rule) in of_type(&forwarder, "AWS::Events::Rule") {
        let props = &rule["Properties"];
        assert!(
            on_default_bus(&props["EventBusName"]),
            "{name}: AWS events arrive on the default bus only"
        );
        assert_eq!(props["State"], "ENABLED", "{name}");
        forwarded.insert(canonical(&props["EventPattern"]), name.clone());
    }
    let home = home_aws_patterns();
    let missing: Vec<_> = home
        .iter()
        .filter(|(p, _)| !forwarded.contains_key(*p))
        .map(|(p, rule)| format!("{rule}: {p}"))
        .collect();
    let extra: Vec<_> = forwarded
        .iter()
        .filter(|(p, _)| !home.contains_key(*p))
        .map(|(p, rule)| format!("{rule}: {p}"))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{FORWARDER} must carry each home AWS-event pattern unchanged;\n\
         not forwarded: {missing:#?}\nforwarded but consumed by no home rule: {extra:#?}"
    );
}

#[test]
fn each_forwarder_rule_targets_the_home_default_bus_with_a_role_that_may_only_put_there() {
    let forwarder = yaml(FORWARDER);
    let home_bus = json!({"Fn::Sub": HOME_DEFAULT_BUS});
    let rules = of_type(&forwarder, "AWS::Events::Rule");
    assert!(!rules.is_empty());
    let mut roles = BTreeSet::new();
    for (name, rule) in rules {
        let targets = rule["Properties"]["Targets"].as_array().expect("Targets");
        assert_eq!(targets.len(), 1, "{name}: one target, the home default bus");
        let target = &targets[0];
        assert_eq!(target["Arn"], home_bus, "{name}: target");
        let role = referenced(&target["RoleArn"])
            .unwrap_or_else(|| panic!("{name}: RoleArn is not a role of the template"));
        assert_eq!(
            target["RoleArn"]["Fn::GetAtt"],
            json!([role, "Arn"]),
            "{name}: RoleArn is the role's Arn"
        );
        roles.insert(role.to_string());
    }
    for role in roles {
        let resource = &resources(&forwarder)[role.as_str()];
        assert_eq!(resource["Type"], "AWS::IAM::Role", "{role}");
        let props = &resource["Properties"];
        assert!(
            props["ManagedPolicyArns"].is_null(),
            "{role}: no managed policies, only its inline one"
        );
        let trust = statements(&props["AssumeRolePolicyDocument"]);
        assert!(
            trust.iter().all(|s| s["Effect"] == "Allow"
                && strings(&s["Principal"]["Service"]) == ["events.amazonaws.com"]
                && strings(&s["Action"]) == ["sts:AssumeRole"]
                && for_this_account(s)
                && s["Principal"]["AWS"].is_null()),
            "{role}: only EventBridge, for this account, assumes it"
        );
        // Inline policies, and any policy resource attached to the role.
        let mut documents: Vec<&Value> = one_or_many(&props["Policies"])
            .into_iter()
            .map(|p| &p["PolicyDocument"])
            .collect();
        for (name, policy) in resources(&forwarder) {
            let kind = policy["Type"].as_str().unwrap_or_default();
            if kind == "AWS::IAM::Policy" || kind == "AWS::IAM::ManagedPolicy" {
                let attached = one_or_many(&policy["Properties"]["Roles"])
                    .iter()
                    .any(|r| referenced(r) == Some(role.as_str()));
                assert!(!attached, "{role}: {name} attaches more to it");
            }
            if kind == "AWS::IAM::RolePolicy" {
                assert_ne!(
                    policy["Properties"]["RoleName"],
                    json!({"Ref": role}),
                    "{role}: {name} attaches more to it"
                );
            }
        }
        documents.retain(|d| !d.is_null());
        assert!(!documents.is_empty(), "{role}: no policy");
        for statement in documents.into_iter().flat_map(statements) {
            assert_eq!(statement["Effect"], "Allow", "{role}: {statement}");
            assert_eq!(
                strings(&statement["Action"]),
                ["events:PutEvents"],
                "{role}: events:PutEvents only"
            );
            assert!(
                one_or_many(&statement["Resource"])
                    .iter()
                    .all(|r| **r == home_bus),
                "{role}: on the home default bus only, not {}",
                statement["Resource"]
            );
            assert!(statement["NotAction"].is_null() && statement["NotResource"].is_null());
        }
    }
}

// `make deploy-forwarders` against a stub `sam` that records its arguments.

/// A fresh directory holding an executable `sam` that appends each call's arguments, one a
/// line, then `--`, to `calls` beside it, and answers as SAM would from the files beside it:
/// `list resources` succeeds only for a `<stack> <region>` line of `stacks`, `list
/// stack-outputs` prints `outputs`, and a `--guided` deploy appends `answers` to its
/// `--config-file` (SAM saving what it asked).
fn stub_sam(test: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "deploy-{test}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let sam = dir.join("sam");
    std::fs::write(
        &sam,
        r#"#!/bin/sh
dir="$(dirname "$0")"
if [ "$1" = --version ]; then echo "SAM CLI, version 1.160.0"; exit 0; fi
for a in "$@"; do printf '%s\n' "$a" >> "$dir/calls"; done
printf '%s\n' -- >> "$dir/calls"
stack=; region=; config=; prev=
for a in "$@"; do
  case "$prev" in --stack-name) stack=$a;; --region) region=$a;; --config-file) config=$a;; esac
  prev=$a
done
case "$1 $2" in
  "list resources")
    grep -qx "$stack $region" "$dir/stacks" 2>/dev/null ||
      { echo "Error: Stack $stack does not exist in $region" >&2; exit 1; }
    echo '[]';;
  "list stack-outputs") cat "$dir/outputs" 2>/dev/null || echo '[]';;
esac
case " $* " in *" --guided "*) cat "$dir/answers" >> "$config";; esac
exit 0
"#,
    )
    .unwrap();
    std::fs::set_permissions(&sam, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Runs `make -s deploy-forwarders <vars>` in the repository root with `path` as PATH, and
/// none of the target's variables or an outer make's flags from the environment.
fn make_deploy_forwarders(path: &str, vars: &[&str]) -> Output {
    make_s("deploy-forwarders", path, vars)
}

/// `make -s <target> <vars>` in the repository root with `path` as PATH, and none of the
/// deploy targets' variables or an outer make's flags from the environment.
fn make_s(target: &str, path: &str, vars: &[&str]) -> Output {
    let make = ["/usr/bin/make", "/bin/make"]
        .into_iter()
        .find(|m| Path::new(m).exists())
        .unwrap_or("make");
    Command::new(make)
        .current_dir(root())
        .args(["-s", target])
        .args(vars)
        .env("PATH", path)
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .env_remove("REGIONS")
        .env_remove("REGION")
        .env_remove("ENV")
        .env_remove("SAMCONFIG_DIR")
        .env_remove("CAPACITY_PILOT")
        .env_remove("AWS_REGION")
        .env_remove("AWS_DEFAULT_REGION")
        .env_remove("CONFIRM")
        .output()
        .expect("make")
}

/// Each recorded `sam` call's arguments.
fn calls(dir: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("calls")).unwrap_or_default();
    let mut out = vec![];
    let mut call = vec![];
    for line in text.lines() {
        if line == "--" {
            out.push(std::mem::take(&mut call));
        } else {
            call.push(line.to_string());
        }
    }
    assert!(call.is_empty(), "an unfinished call: {call:?}");
    out
}

/// The value following `flag` in a call, when it occurs once.
fn option<'a>(call: &'a [String], flag: &str) -> Option<&'a str> {
    let at: Vec<usize> = (0..call.len()).filter(|&i| call[i] == flag).collect();
    assert!(at.len() <= 1, "{flag} given twice: {call:?}");
    at.first()
        .and_then(|&i| call.get(i + 1))
        .map(String::as_str)
}

fn with_stub_path(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Every deploy of `stack`'s forwarder, as (region, call); each checked for what every
/// forwarder deploy needs (other calls, such as looking for a stack, are left out).
fn forwarder_deploys(dir: &Path, home: &str) -> Vec<(String, Vec<String>)> {
    forwarders_of(dir, "capacity-pilot", home)
}

fn forwarders_of(dir: &Path, stack: &str, home: &str) -> Vec<(String, Vec<String>)> {
    let mut out = vec![];
    let forwarder = format!("{stack}-forwarder");
    for call in calls(dir) {
        if call.first().map(String::as_str) != Some("deploy")
            || option(&call, "--stack-name") != Some(forwarder.as_str())
        {
            continue;
        }
        assert_eq!(
            option(&call, "--template-file"),
            Some(FORWARDER),
            "{call:?}"
        );
        let home_region = format!("HomeRegion={home}");
        assert_eq!(
            option(&call, "--parameter-overrides"),
            Some(home_region.as_str()),
            "{call:?}"
        );
        assert_eq!(
            option(&call, "--capabilities"),
            Some("CAPABILITY_IAM"),
            "{call:?}"
        );
        assert!(
            call.iter().any(|a| a == "--no-fail-on-empty-changeset"),
            "{call:?}"
        );
        // Not the main stack's samconfig.toml [default] settings: an environment it lacks.
        let env = option(&call, "--config-env").unwrap_or("default");
        assert_ne!(env, "default", "reads the main stack's settings: {call:?}");
        let samconfig = std::fs::read_to_string(root().join("samconfig.toml")).unwrap();
        assert!(
            !samconfig
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("[{env}."))
                    || l.trim() == format!("[{env}]")),
            "samconfig.toml defines the environment {env} the forwarder deploys under: check \
             that none of its settings is the main stack's, then update this test"
        );
        assert!(!call.iter().any(|a| a == "--guided"), "{call:?}");
        let region = option(&call, "--region").expect("--region").to_string();
        out.push((region, call));
    }
    out
}

#[test]
fn deploy_forwarders_deploys_to_every_region_but_home() {
    let dir = stub_sam("regions");
    let out = make_deploy_forwarders(
        &with_stub_path(&dir),
        &["REGIONS=us-east-1,us-east-2,us-west-2", "REGION=us-east-1"],
    );
    assert!(out.status.success(), "{out:?}");
    let deploys = forwarder_deploys(&dir, "us-east-1");
    let regions: Vec<&str> = deploys.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(regions, ["us-east-2", "us-west-2"]);
    for (region, call) in &deploys {
        assert!(
            call.iter().any(|a| a == "--no-confirm-changeset"),
            "{region}: without CONFIRM it does not ask: {call:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn deploy_forwarders_defaults_to_the_templates_allowed_regions_and_confirms_on_request() {
    let dir = stub_sam("defaults");
    let out = make_deploy_forwarders(&with_stub_path(&dir), &["CONFIRM=1", "REGION=us-east-1"]);
    assert!(out.status.success(), "{out:?}");
    let template = yaml("infra/template.yaml");
    let allowed = template["Parameters"]["AllowedRegions"]["Default"]
        .as_str()
        .unwrap();
    let want: Vec<&str> = allowed
        .split(',')
        .map(str::trim)
        .filter(|r| *r != "us-east-1")
        .collect();
    let deploys = forwarder_deploys(&dir, "us-east-1");
    let regions: Vec<&str> = deploys.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        regions, want,
        "REGIONS defaults to AllowedRegions' {allowed}"
    );
    for (region, call) in &deploys {
        assert!(
            call.iter().any(|a| a == "--confirm-changeset")
                && !call.iter().any(|a| a == "--no-confirm-changeset"),
            "{region}: CONFIRM=1 asks: {call:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn deploy_forwarders_without_sam_says_what_it_needs() {
    // An empty PATH: no sam (and nothing else the recipe could reach for).
    let dir = stub_sam("no-sam");
    std::fs::remove_file(dir.join("sam")).unwrap();
    let out = make_deploy_forwarders(&dir.display().to_string(), &[]);
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("needs the AWS SAM CLI"),
        "a clear message, not {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// cargo-lambda (`make build`) passes `--config profile.release.<key>=...` for each of these
/// that the workspace's release profile leaves unset (cargo-lambda-metadata,
/// `cargo_release_profile_config`: `strip = "symbols"`, `lto = "thin"`, `codegen-units = 1`,
/// `panic = "abort"`), and a `--config` outranks the manifest and the environment. Left unset,
/// the deployed packages are built otherwise than `cargo build --release`, whose binaries the
/// local runner measures (README, "Packages, memory and cold start"): until issue 26 they
/// aborted on a panic while the runner's unwound, and the README said they unwound.
#[test]
fn the_release_profile_leaves_nothing_for_cargo_lambda_to_choose() {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let manifest: toml_edit::DocumentMut = text.parse().expect("Cargo.toml parses");
    let release = manifest["profile"]["release"]
        .as_table()
        .expect("a [profile.release]");
    for key in ["strip", "lto", "codegen-units", "panic"] {
        assert!(
            release.contains_key(key),
            "[profile.release] leaves {key} unset, so cargo-lambda chooses it"
        );
    }
    // What the README's figures were measured with: a panic aborts the process (a crash,
    // which every handler survives), for 13-15% smaller packages than unwinding.
    assert_eq!(release["panic"].as_str(), Some("abort"));
}

// SourcePrincipals (issue 49, Teams): the bus denies each listed source to every principal not
// listed for it. The template makes one guard per entry with Fn::ForEach (the
// AWS::LanguageExtensions transform); these tests expand it as CloudFormation does, for a
// value of the parameter, and read the statements that would be deployed.

const SOURCE_PRINCIPALS: &str = "SourcePrincipals";
const TEAM_A: &str = "com.example.team-a";
const TEAM_A_ROLES: [&str; 2] = [
    "arn:aws:iam::111122223333:role/a",
    "arn:aws:iam::111122223333:role/b",
];

/// A string with `${id}` replaced by `item` and `&{id}` by its alphanumerics.
fn substitute_str(s: &str, id: &str, item: &str) -> String {
    let alphanumerics: String = item.chars().filter(char::is_ascii_alphanumeric).collect();
    s.replace(&format!("${{{id}}}"), item)
        .replace(&format!("&{{{id}}}"), &alphanumerics)
}

/// A loop's fragment for one item: `${id}` and `&{id}` in keys and strings, and `{"Ref": id}`.
fn substitute(v: &Value, id: &str, item: &str) -> Value {
    match v {
        Value::String(s) => Value::String(substitute_str(s, id, item)),
        Value::Array(all) => Value::Array(all.iter().map(|x| substitute(x, id, item)).collect()),
        Value::Object(o) if o.len() == 1 && o.get("Ref") == Some(&json!(id)) => json!(item),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (substitute_str(k, id, item), substitute(x, id, item)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A section (Conditions, Resources) with every `Fn::ForEach::<loop>: [id, collection,
/// fragment]` replaced by the fragment once per item: the collection is a literal list, or a
/// `Ref` of a comma-list parameter (`""` is one empty item, as CloudFormation has it).
fn expand_for_each(
    section: &Map<String, Value>,
    params: &BTreeMap<&str, &str>,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in section {
        let Some(name) = key.strip_prefix("Fn::ForEach::") else {
            assert!(
                out.insert(key.clone(), value.clone()).is_none(),
                "{key} twice"
            );
            continue;
        };
        let args = value
            .as_array()
            .filter(|a| a.len() == 3)
            .unwrap_or_else(|| {
                panic!("Fn::ForEach::{name} takes [identifier, collection, fragment]")
            });
        let id = args[0].as_str().expect("the loop's identifier");
        let items: Vec<String> = match &args[1] {
            Value::Array(items) => items
                .iter()
                .map(|i| i.as_str().unwrap().to_string())
                .collect(),
            c => {
                let param = c["Ref"].as_str().expect("a literal list or a Ref");
                params[param].split(',').map(str::to_string).collect()
            }
        };
        for item in items {
            let fragment = substitute(&args[2], id, &item);
            for (k, v) in expand_for_each(fragment.as_object().expect("a fragment"), params) {
                assert!(
                    !out.contains_key(&k) && !section.contains_key(&k),
                    "Fn::ForEach::{name} makes {k} twice"
                );
                out.insert(k, v);
            }
        }
    }
    out
}

/// A value with the intrinsic functions the guards use resolved for `params` (a parameter not
/// given takes its Default); `Ref` of a resource and `Fn::GetAtt` stay as written. Panics
/// where CloudFormation would fail the deployment (an index past a list, say).
fn resolve(t: &Value, params: &BTreeMap<&str, &str>, v: &Value) -> Value {
    let param = |name: &str| -> Option<String> {
        params.get(name).map(|s| s.to_string()).or_else(|| {
            t["Parameters"][name]["Default"]
                .as_str()
                .map(str::to_string)
        })
    };
    let text = |x: &Value| -> String {
        match resolve(t, params, x) {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            other => panic!("not a string: {other}"),
        }
    };
    let list = |x: &Value| -> Vec<Value> {
        match resolve(t, params, x) {
            Value::Array(all) => all,
            other => panic!("not a list: {other}"),
        }
    };
    let Some((f, args)) = v
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
    else {
        return match v {
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, x)| (k.clone(), resolve(t, params, x)))
                    .collect(),
            ),
            Value::Array(all) => Value::Array(all.iter().map(|x| resolve(t, params, x)).collect()),
            other => other.clone(),
        };
    };
    let arg = |i: usize| &args[i];
    match f.as_str() {
        "Ref" => param(args.as_str().unwrap()).map_or_else(|| v.clone(), Value::String),
        "Fn::GetAtt" => v.clone(),
        "Fn::Sub" => {
            let mut s = args.as_str().expect("Fn::Sub of a string").to_string();
            for name in t["Parameters"].as_object().unwrap().keys() {
                if let Some(value) = param(name) {
                    s = s.replace(&format!("${{{name}}}"), &value);
                }
            }
            assert!(!s.contains("${"), "Fn::Sub leaves {s}");
            json!(s)
        }
        "Fn::Split" => json!(
            text(arg(1))
                .split(text(arg(0)).as_str())
                .collect::<Vec<_>>()
        ),
        "Fn::Join" => json!(
            list(arg(1))
                .iter()
                .map(|x| x.as_str().expect("Fn::Join of strings").to_string())
                .collect::<Vec<_>>()
                .join(&text(arg(0)))
        ),
        "Fn::Select" => {
            let index: usize = text(arg(0)).parse().expect("Fn::Select's index");
            let items = list(arg(1));
            items
                .get(index)
                .unwrap_or_else(|| panic!("Fn::Select: no index {index} in {items:?}"))
                .clone()
        }
        "Fn::FindInMap" => {
            let keys: Vec<String> = (0..3).map(|i| text(arg(i))).collect();
            let found = &t["Mappings"][&keys[0]][&keys[1]][&keys[2]];
            assert!(!found.is_null(), "Fn::FindInMap finds nothing at {keys:?}");
            found.clone()
        }
        "Fn::Equals" => json!(resolve(t, params, arg(0)) == resolve(t, params, arg(1))),
        "Fn::If" => {
            let name = arg(0).as_str().expect("Fn::If's condition");
            let holds = resolve(t, params, &t["Conditions"][name]);
            resolve(t, params, arg(if holds == json!(true) { 1 } else { 2 }))
        }
        "Fn::Not" => json!(resolve(t, params, arg(0)) == json!(false)),
        _ => Value::Object(
            v.as_object()
                .unwrap()
                .iter()
                .map(|(k, x)| (k.clone(), resolve(t, params, x)))
                .collect(),
        ),
    }
}

/// The EventBusPolicy resources the template's Fn::ForEach loops make for `SourcePrincipals =
/// value`, as (logical id, created: its condition holds, Properties resolved).
fn source_guards(t: &Value, value: &str) -> Vec<(String, bool, Value)> {
    let params = BTreeMap::from([(SOURCE_PRINCIPALS, value)]);
    let conditions = expand_for_each(t["Conditions"].as_object().unwrap(), &params);
    let looped: Map<String, Value> = resources(t)
        .iter()
        .filter(|(k, _)| k.starts_with("Fn::ForEach::"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut out = vec![];
    for (id, r) in expand_for_each(&looped, &params) {
        assert!(
            !resources(t).contains_key(&id),
            "{id}: a logical id the template already has"
        );
        if r["Type"] != "AWS::Events::EventBusPolicy" {
            continue;
        }
        let created = match resolve(t, &params, &r["Condition"]) {
            Value::Null => true,
            Value::String(name) => {
                let c = conditions
                    .get(&name)
                    .unwrap_or_else(|| panic!("{id}: no condition {name}"));
                resolve(t, &params, c) == json!(true)
            }
            other => panic!("{id}: Condition {other}"),
        };
        out.push((id, created, resolve(t, &params, &r["Properties"])));
    }
    // In the slots' order (BusSourcePrincipalsGuard0, 1, ..., 9), not the ids' sort order.
    out.sort_by_key(|(id, _, _)| (id.len(), id.clone()));
    out
}

/// Each created guard's statement checked as a Deny of PutEvents on the stack's bus with a
/// source and principals only, as (StatementId, events:source, aws:PrincipalArn).
fn guard_statements(guards: &[(String, bool, Value)]) -> Vec<(String, Value, Value)> {
    let mut out = vec![];
    for (id, _, p) in guards.iter().filter(|(_, created, _)| *created) {
        let s = &p["Statement"];
        assert_eq!(
            s["Effect"], "Deny",
            "{id}: an explicit Deny outranks every Allow"
        );
        assert_eq!(s["Principal"], "*", "{id}: for every principal");
        assert_eq!(strings(&s["Action"]), ["events:PutEvents"], "{id}");
        assert_eq!(s["Resource"], json!({"Fn::GetAtt": ["Bus", "Arn"]}), "{id}");
        assert_eq!(p["EventBusName"], json!({"Ref": "Bus"}), "{id}");
        let condition = s["Condition"].as_object().expect("a Condition");
        let keys: BTreeSet<&str> = condition.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            BTreeSet::from(["ArnNotLike", "StringEquals"]),
            "{id}: nothing else narrows it"
        );
        assert_eq!(
            condition["StringEquals"].as_object().unwrap().len(),
            1,
            "{id}"
        );
        assert_eq!(
            condition["ArnNotLike"].as_object().unwrap().len(),
            1,
            "{id}"
        );
        let sid = p["StatementId"]
            .as_str()
            .expect("a StatementId")
            .to_string();
        out.push((
            sid,
            condition["StringEquals"]["events:source"].clone(),
            condition["ArnNotLike"]["aws:PrincipalArn"].clone(),
        ));
    }
    out
}

#[test]
fn source_principals_denies_each_listed_source_to_every_principal_not_listed_for_it() {
    let t = yaml("infra/template.yaml");
    let p = &t["Parameters"][SOURCE_PRINCIPALS];
    assert_eq!(p["Default"], "", "empty by default: no guard");
    assert_eq!(
        t["Transform"],
        json!(["AWS::LanguageExtensions", "AWS::Serverless-2016-10-31"]),
        "Fn::ForEach needs AWS::LanguageExtensions, before the SAM transform"
    );

    // GIVEN two entries, team A's with two principals
    let team_a = format!("{TEAM_A}={}", TEAM_A_ROLES.join("|"));
    let value = format!("{team_a},com.example.team-b=arn:aws:iam::111122223333:role/c");
    // WHEN the loops are expanded for them
    let guards = source_guards(&t, &value);
    let statements = guard_statements(&guards);
    // THEN one Deny per entry, each of its own source to all but its own principals
    assert_eq!(
        statements
            .iter()
            .map(|(_, source, principals)| (source.clone(), principals.clone()))
            .collect::<Vec<_>>(),
        [
            (json!(TEAM_A), json!(TEAM_A_ROLES)),
            (
                json!("com.example.team-b"),
                json!(["arn:aws:iam::111122223333:role/c"])
            ),
        ]
    );
    // ... under statement ids of their own, valid for EventBridge and no other statement's
    let mut ids: BTreeSet<String> = of_type(&t, "AWS::Events::EventBusPolicy")
        .iter()
        .map(|(_, r)| r["Properties"]["StatementId"].as_str().unwrap().to_string())
        .collect();
    for (sid, _, _) in &statements {
        assert!(
            !sid.is_empty()
                && sid.len() <= 64
                && sid
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{sid}: a StatementId is 1-64 of [a-zA-Z0-9-_]"
        );
        assert!(ids.insert(sid.clone()), "{sid} twice");
    }
}

#[test]
fn source_principals_empty_makes_no_statement_and_every_slot_is_used_up_to_the_pattern_limit() {
    let t = yaml("infra/template.yaml");
    // GIVEN the default, empty: no guard is created ...
    let guards = source_guards(&t, "");
    assert!(
        !guards.is_empty(),
        "the loops make no guard resource at all"
    );
    assert!(
        guards.iter().all(|(_, created, _)| !created),
        "an empty SourcePrincipals creates a guard: {guards:#?}"
    );
    // ... and each would still resolve (no index past a list) to a source no event has
    for (id, _, p) in &guards {
        let source = &p["Statement"]["Condition"]["StringEquals"]["events:source"];
        assert_eq!(source, "", "{id}: PutEvents takes no empty source");
    }

    // GIVEN 1 to as many entries as the parameter's pattern allows: each has its slot, in
    // order, and no other slot is created
    let pattern = t["Parameters"][SOURCE_PRINCIPALS]["AllowedPattern"]
        .as_str()
        .unwrap();
    let most: usize = pattern
        .rsplit_once("{0,")
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(n, _)| n.parse::<usize>().unwrap() + 1)
        .expect("the pattern bounds the number of entries");
    assert_eq!(guards.len(), most, "one slot per entry the pattern allows");
    let entry = |i: usize| format!("com.example.team-{i}=arn:aws:iam::111122223333:role/team-{i}");
    for n in 1..=most {
        let value: Vec<String> = (0..n).map(entry).collect();
        let statements = guard_statements(&source_guards(&t, &value.join(",")));
        let got: Vec<(Value, Value)> = statements
            .into_iter()
            .map(|(_, source, principals)| (source, principals))
            .collect();
        let want: Vec<(Value, Value)> = (0..n)
            .map(|i| {
                (
                    json!(format!("com.example.team-{i}")),
                    json!([format!("arn:aws:iam::111122223333:role/team-{i}")]),
                )
            })
            .collect();
        assert_eq!(got, want, "{n} entries");
    }
}

/// The local runner builds the functions' environment from the template and the rules from
/// its Resources: Fn::ForEach keys (lists, not resources) and the Transform list change neither.
#[test]
fn the_local_runner_still_reads_the_template() {
    use local_cloud::runner::template::{Locals, functions};
    let t = yaml("infra/template.yaml");
    let scenario = yaml("infra/local/scenarios/default.yaml");
    let mut locals = Locals::default();
    for (k, v) in scenario["parameters"].as_object().unwrap() {
        locals
            .parameters
            .insert(k.clone(), v.as_str().unwrap().to_string());
    }
    locals.resources.insert("StateTable".into(), "table".into());
    locals.resources.insert("Bus".into(), "bus".into());
    locals.resources.insert(
        "NoticesTopic".into(),
        "arn:aws:sns:us-east-1:1:notices".into(),
    );
    let specs = functions(&t, &locals).expect("the runner reads the template");
    assert_eq!(specs.len(), 5);
    assert!(specs.iter().all(|f| f.env["EVENT_BUS_NAME"] == "bus"));
    assert!(
        specs
            .iter()
            .all(|f| f.env["NOTICES_TOPIC_ARN"] == "arn:aws:sns:us-east-1:1:notices")
    );
    local_cloud::rules::Rules::from_template(&root().join("infra/template.yaml"))
        .expect("the rules read the template");
}

/// `make -s sam-check` with a `sam` on PATH that says it is `version`.
fn sam_check(version: &str) -> Output {
    use std::os::unix::fs::PermissionsExt;
    let dir = stub_sam(&format!("sam-check-{version}"));
    let sam = dir.join("sam");
    std::fs::write(
        &sam,
        format!("#!/bin/sh\necho \"SAM CLI, version {version}\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&sam, std::fs::Permissions::from_mode(0o755)).unwrap();
    make_s("sam-check", &with_stub_path(&dir), &[])
}

#[test]
fn make_deploy_refuses_a_sam_cli_too_old_for_the_templates_for_each_before_building() {
    for old in ["1.150.2", "1.159.9", "1.99.0"] {
        let out = sam_check(old);
        assert!(!out.status.success(), "{old} was accepted");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("1.160.0") && said.contains(old), "{said}");
    }
    for new in ["1.160.0", "1.171.1", "2.0.0"] {
        let out = sam_check(new);
        assert!(
            out.status.success(),
            "{new}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let recipe = makefile
        .split("\ndeploy: sam-check\n")
        .nth(1)
        .expect("deploy runs sam-check first");
    let check = recipe.find("$(DEPLOY) check").expect("then the settings");
    let build = recipe
        .find("$(MAKE) --no-print-directory build")
        .expect("a build");
    assert!(check < build, "the checks run before the release build");
}

#[test]
fn sagemaker_roles_are_passed_for_the_execution_role_and_every_hyperpod_role_listed() {
    let t = yaml("infra/template.yaml");
    let role = "arn:aws:iam::123456789012:role/capacity-pilot-sagemaker";
    let (a, b) = (
        "arn:aws:iam::123456789012:role/team-f-hyperpod",
        "arn:aws:iam::123456789012:role/team-g-hyperpod",
    );
    let listed = format!("{a},{b}");
    for (given, want) in [("", vec![role]), (listed.as_str(), vec![role, a, b])] {
        let params = BTreeMap::from([
            ("SageMakerExecutionRoleArn", role),
            ("HyperPodRoleArns", given),
        ]);
        let mut passed = 0;
        for (name, f) in of_type(&t, "AWS::Serverless::Function") {
            let policies = one_or_many(&f["Properties"]["Policies"]);
            for s in policies.into_iter().flat_map(statements) {
                if s["Sid"] != "PassSageMakerRole" {
                    continue;
                }
                passed += 1;
                let resources = resolve(&t, &params, &s["Resource"]);
                assert_eq!(strings(&resources), want, "{name} with {given:?}");
            }
        }
        assert_eq!(
            passed, 2,
            "launch-workloads and cleanup-expired pass the roles"
        );
        let env = resolve(
            &t,
            &params,
            &t["Globals"]["Function"]["Environment"]["Variables"]["HYPERPOD_ROLE_ARNS"],
        );
        match given {
            "" => assert_eq!(env, json!({"Ref": "AWS::NoValue"})),
            _ => assert_eq!(env, json!(given)),
        }
    }
}

/// The licence file is the one Cargo declares for every crate (`license.workspace`), and the
/// changelog names the version `capacity-pilot --version` prints.
#[test]
fn the_licence_is_the_one_cargo_declares_and_the_changelog_names_the_version() {
    let cargo: toml_edit::DocumentMut = std::fs::read_to_string(root().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let package = &cargo["workspace"]["package"];
    assert_eq!(package["license"].as_str(), Some("Apache-2.0"));
    let licence = std::fs::read_to_string(root().join("LICENSE")).expect("LICENSE");
    assert!(
        licence.contains("Apache License") && licence.contains("Version 2.0, January 2004"),
        "LICENSE is not the Apache License 2.0"
    );
    let version = package["version"].as_str().expect("a workspace version");
    let changelog = std::fs::read_to_string(root().join("CHANGELOG.md")).expect("CHANGELOG.md");
    assert!(
        changelog.contains(&format!("({version})")),
        "CHANGELOG.md does not name version {version}"
    );
    for reader in ["### Deployers", "### Requesters", "### Event consumers"] {
        assert!(changelog.contains(reader), "CHANGELOG.md has no {reader}");
    }
}

// The deploy lifecycle (issue 54): one samconfig environment is one deployment.

/// A samconfig directory for the lifecycle tests: the tracked file's settings, then `extra`.
fn samconfig_dir(dir: &Path, extra: &str) -> String {
    let conf = dir.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let tracked = std::fs::read_to_string(root().join("samconfig.toml")).unwrap();
    std::fs::write(conf.join("samconfig.toml"), tracked + extra).unwrap();
    format!("SAMCONFIG_DIR={}", conf.display())
}

const TWO_DEPLOYMENTS: &str = r#"
[staging.deploy.parameters]
region = "us-west-2"
parameter_overrides = "AllowedRegions=\"us-east-1,us-east-2,us-west-2\" MonthlyBudgetUsd=1000"

[prod.global.parameters]
stack_name = "gpu-capacity"

[prod.deploy.parameters]
region = "us-east-1"
"#;

#[test]
fn two_deployments_forwarders_never_collide_and_each_forwards_to_its_own_region() {
    // GIVEN three deployments in one account: `default` (us-east-2 from the environment),
    // `staging` (no stack name: capacity-pilot-staging, us-west-2) and `prod` (stack
    // gpu-capacity, us-east-1), each forwarding from the template's allowed regions
    let dir = stub_sam("two-stacks");
    let conf = samconfig_dir(&dir, TWO_DEPLOYMENTS);
    let path = with_stub_path(&dir);
    let mut homes = BTreeMap::new();
    for (env, stack, home) in [
        ("default", "capacity-pilot", "us-east-2"),
        ("staging", "capacity-pilot-staging", "us-west-2"),
        ("prod", "gpu-capacity", "us-east-1"),
    ] {
        // WHEN each deploys its forwarders (the default's region given as AWS_REGION would be)
        let env_var = format!("ENV={env}");
        let mut vars = vec![env_var.as_str(), conf.as_str()];
        if env == "default" {
            vars.push("REGION=us-east-2");
        }
        let out = make_deploy_forwarders(&path, &vars);
        assert!(out.status.success(), "{env}: {out:?}");
        // THEN its forwarders are `<stack>-forwarder`, sending to its own region, in every
        // allowed region but that one
        let regions: Vec<String> = forwarders_of(&dir, stack, home)
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        let want: Vec<&str> = ["us-east-1", "us-east-2", "us-west-2"]
            .into_iter()
            .filter(|r| r != &home)
            .collect();
        assert_eq!(regions, want, "{env}");
        homes.insert(stack, home);
    }
    // ... and no two deployments ever deploy the same stack in the same region
    let mut seen = BTreeSet::new();
    for call in calls(&dir) {
        if call[0] != "deploy" {
            continue;
        }
        let key = (
            option(&call, "--stack-name").unwrap().to_string(),
            option(&call, "--region").unwrap().to_string(),
        );
        assert!(
            seen.insert(key.clone()),
            "{key:?} deployed twice: collision"
        );
        let stack = key.0.strip_suffix("-forwarder").unwrap();
        assert_eq!(
            option(&call, "--parameter-overrides"),
            Some(format!("HomeRegion={}", homes[stack]).as_str())
        );
    }
    assert_eq!(seen.len(), 6);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_deployment_without_a_region_is_refused_before_anything_runs() {
    let dir = stub_sam("no-region");
    let out = make_deploy_forwarders(&with_stub_path(&dir), &[]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("no region for ENV=default") && said.contains("REGION=<region>"),
        "{said}"
    );
    assert!(calls(&dir).is_empty(), "sam ran: {:?}", calls(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stack_name_longer_than_its_event_archive_may_be_named_is_refused_before_anything_runs() {
    // GIVEN a deployment whose stack name has 49 characters (the archive takes the stack's
    // name, and an archive name has at most 48)
    let dir = stub_sam("long-name");
    let long = "x".repeat(49);
    let conf = samconfig_dir(
        &dir,
        &format!(
            "\n[long.global.parameters]\nstack_name = \"{long}\"\n\n[long.deploy.parameters]\nregion = \"us-east-1\"\n"
        ),
    );
    // WHEN it is deployed
    let out = make_s("deploy", &with_stub_path(&dir), &[&conf, "ENV=long"]);
    // THEN it is refused, saying what to change, before any build or sam call
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&long) && said.contains("at most") && said.contains("stack_name"),
        "{said}"
    );
    assert!(calls(&dir).is_empty(), "sam ran: {:?}", calls(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_forwarder_left_under_the_old_name_is_reported_with_how_to_delete_it() {
    // GIVEN a forwarder deployed before 0.1.0 (capacity-pilot-forwarder) in us-west-2
    let dir = stub_sam("leftover");
    std::fs::write(dir.join("stacks"), "capacity-pilot-forwarder us-west-2\n").unwrap();
    let conf = samconfig_dir(&dir, TWO_DEPLOYMENTS);
    // WHEN the prod deployment (stack gpu-capacity) deploys its forwarders
    let out = make_deploy_forwarders(&with_stub_path(&dir), &["ENV=prod", &conf]);
    assert!(out.status.success(), "{out:?}");
    // THEN it says where the old one is and how to delete it, and deletes nothing itself
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("leftover: stack capacity-pilot-forwarder in us-west-2")
            && said.contains("sam delete --stack-name capacity-pilot-forwarder --region us-west-2"),
        "{said}"
    );
    assert!(!said.contains("in us-east-2 is a forwarder"), "{said}");
    assert!(calls(&dir).iter().all(|c| c[0] != "delete"));
    // ... and the default deployment, whose forwarder that name now is, just updates it
    let out = make_deploy_forwarders(&with_stub_path(&dir), &["REGION=us-east-1", &conf]);
    assert!(out.status.success(), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("leftover"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `capacity-pilot` that records its arguments and prints `json` (its `list --live`).
fn stub_cli(dir: &Path, json: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let cli = dir.join("capacity-pilot");
    std::fs::write(
        &cli,
        format!(
            "#!/bin/sh\nprintf '%s ' \"$@\" > \"$(dirname \"$0\")/cli-args\"\ncat <<'JSON'\n{json}\nJSON\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("CAPACITY_PILOT={}", cli.display())
}

#[test]
fn destroy_refuses_while_a_request_is_live_and_deletes_nothing() {
    let dir = stub_sam("destroy-live");
    let cli = stub_cli(
        &dir,
        r#"[{"request_id": "team-a-loadtest", "status": "Active"}]"#,
    );
    let conf = samconfig_dir(&dir, TWO_DEPLOYMENTS);
    let out = make_s(
        "destroy",
        &with_stub_path(&dir),
        &["ENV=staging", &conf, &cli],
    );
    assert!(!out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("team-a-loadtest  Active")
            && said.contains("nothing was deleted")
            && said.contains("capacity-pilot cancel"),
        "{said}"
    );
    // It asked the right deployment ...
    let args = std::fs::read_to_string(dir.join("cli-args")).unwrap();
    assert_eq!(
        args.trim(),
        "list --live --stack capacity-pilot-staging --region us-west-2 --output json"
    );
    // ... and deleted nothing
    assert!(
        calls(&dir).iter().all(|c| c[0] != "delete"),
        "{:?}",
        calls(&dir)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn destroy_deletes_the_forwarders_then_the_stack_and_says_what_it_keeps() {
    // GIVEN a deployment with no live request, forwarders in two regions but one missing
    let dir = stub_sam("destroy");
    let cli = stub_cli(&dir, "[]");
    std::fs::write(
        dir.join("stacks"),
        "capacity-pilot-staging-forwarder us-east-1\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("outputs"),
        r#"[{"OutputKey": "StateTableName", "OutputValue": "capacity-pilot-staging-StateTable-ABC"}]"#,
    )
    .unwrap();
    let conf = samconfig_dir(&dir, TWO_DEPLOYMENTS);
    // WHEN it is destroyed
    let out = make_s(
        "destroy",
        &with_stub_path(&dir),
        &["ENV=staging", &conf, &cli],
    );
    assert!(out.status.success(), "{out:?}");
    // THEN the forwarder that exists goes first, then the main stack, without prompts
    let deletes: Vec<(String, String)> = calls(&dir)
        .into_iter()
        .filter(|c| c[0] == "delete")
        .map(|c| {
            assert!(c.iter().any(|a| a == "--no-prompts"), "{c:?}");
            (
                option(&c, "--stack-name").unwrap().to_string(),
                option(&c, "--region").unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        deletes,
        [
            (
                "capacity-pilot-staging-forwarder".into(),
                "us-east-1".into()
            ),
            ("capacity-pilot-staging".into(), "us-west-2".into()),
        ]
    );
    // ... and it names the table it keeps and how to delete it
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("kept: capacity-pilot-staging-StateTable-ABC in us-west-2")
            && said.contains("--no-deletion-protection-enabled")
            && said.contains(
                "aws dynamodb delete-table --table-name capacity-pilot-staging-StateTable-ABC --region us-west-2"
            ),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_tracked_samconfig_holds_no_accounts_values_and_a_guided_deploy_writes_the_ignored_file() {
    let tracked = std::fs::read_to_string(root().join("samconfig.toml")).unwrap();
    for (what, found) in [
        (
            "parameter_overrides",
            tracked.contains("parameter_overrides"),
        ),
        (
            "a region",
            tracked
                .lines()
                .any(|l| l.trim_start().starts_with("region")),
        ),
        ("an ARN", tracked.contains("arn:")),
        (
            "an account id",
            tracked
                .split(|c: char| !c.is_ascii_digit())
                .any(|d| d.len() == 12),
        ),
    ] {
        assert!(!found, "the tracked samconfig.toml holds {what}");
    }
    let ignored = std::fs::read_to_string(root().join(".gitignore")).unwrap();
    assert!(ignored.lines().any(|l| l == "/samconfig.local.toml"));
    // A guided deploy (the script `make deploy GUIDED=1` runs after the build): SAM is given
    // the local file, which starts as the tracked one, and saves its answers there
    let dir = stub_sam("guided");
    std::fs::write(
        dir.join("answers"),
        "\n[lab.deploy.parameters]\nregion = \"eu-west-1\"\nparameter_overrides = \"AllowedRegions=eu-west-1\"\n",
    )
    .unwrap();
    let conf = dir.join("conf");
    samconfig_dir(&dir, "");
    let out = Command::new("python3")
        .current_dir(root())
        .args(["infra/deploy.py", "--env", "lab", "--config-dir"])
        .arg(&conf)
        .args(["deploy", "--guided"])
        .env("PATH", with_stub_path(&dir))
        .env_remove("AWS_REGION")
        .env_remove("AWS_DEFAULT_REGION")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let guided = &calls(&dir)[0];
    assert!(guided.iter().any(|a| a == "--guided"));
    assert_eq!(option(guided, "--config-env"), Some("lab"));
    assert_eq!(option(guided, "--stack-name"), Some("capacity-pilot-lab"));
    assert!(
        option(guided, "--config-file")
            .unwrap()
            .ends_with("conf/samconfig.local.toml"),
        "{guided:?}"
    );
    // ... the tracked file is untouched, and what SAM saved is what the next steps read
    assert_eq!(
        std::fs::read_to_string(conf.join("samconfig.toml")).unwrap(),
        tracked
    );
    let local = std::fs::read_to_string(conf.join("samconfig.local.toml")).unwrap();
    assert!(local.starts_with(&tracked) && local.contains("eu-west-1"));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("stack capacity-pilot-lab deployed in eu-west-1"),
        "{out:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
#[path = "deploy/cost.rs"]
mod cost;
#[path = "deploy/operations.rs"]
mod operations;
