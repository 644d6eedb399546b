//! `make cost` (infra/cost.py): the deployment's monthly bill at infra/costs.toml's prices, idle
//! and at the load of make run's log. The script runs under the repository's venv (`make test`
//! makes it first) against fixtures written here, and its figures are checked against the same
//! model computed here from the prices costs.toml holds; every resource type of both templates
//! has a row in costs.toml; a type without one, and a missing log, fail saying what to do.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn costs() -> toml_edit::DocumentMut {
    let text = std::fs::read_to_string(root().join("infra/costs.toml")).expect("infra/costs.toml");
    text.parse().expect("infra/costs.toml parses")
}

fn number(item: &toml_edit::Item, what: &str) -> f64 {
    item.as_float()
        .or_else(|| item.as_integer().map(|n| n as f64))
        .unwrap_or_else(|| panic!("costs.toml: {what} is not a number"))
}

/// The price of one unit of `[price.<key>]`: `usd` for every `per` units.
fn unit_price(costs: &toml_edit::DocumentMut, key: &str) -> f64 {
    let row = &costs["price"][key];
    number(&row["usd"], &format!("price.{key}.usd"))
        / number(&row["per"], &format!("price.{key}.per"))
}

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cost-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// infra/cost.py under the venv, from the repository root.
fn cost_py(args: &[&str]) -> Output {
    let python = root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: `make venv` makes it (make test does)",
        python.display()
    );
    std::process::Command::new(python)
        .current_dir(root())
        .arg("infra/cost.py")
        .args(args)
        .output()
        .expect("python")
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

// The fixture deployment: three arm64 functions, two of them in the log. Alpha has 1024 MB and
// ticks every 5 minutes, beta the Globals' 2048 MB and ticks every minute, gamma 512 MB hourly
// and never appears in the log (its idle tick is costs.toml's default). Two standard alarms
// and a high-resolution one, one custom metric published by two filters with a DefaultValue
// (a third filter has none: no metric until it matches), one KMS key, one table with point-in-
// time recovery, log groups kept LogRetentionDays (30 by default), an event log kept 14 days
// (a rule writes our events there) and an archive of the bus kept ArchiveDays (60 by
// default). The short tags are CloudFormation's, which cost.py must read.
const TEMPLATE: &str = r#"AWSTemplateFormatVersion: "2010-09-09"
Transform: AWS::Serverless-2016-10-31
Parameters:
  LogRetentionDays:
    Type: Number
    Default: 30
  ArchiveDays:
    Type: Number
    Default: 60
Globals:
  Function:
    Runtime: provided.al2023
    Architectures: [arm64]
    MemorySize: 2048
Resources:
  StateTable:
    Type: AWS::DynamoDB::Table
    Properties:
      BillingMode: PAY_PER_REQUEST
      PointInTimeRecoverySpecification:
        PointInTimeRecoveryEnabled: true
  AlphaFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: ../target/lambda/alpha/
      MemorySize: 1024
      Events:
        Submitted:
          Type: EventBridgeRule
          Properties:
            Pattern: {"detail-type": ["Capacity Request Submitted"]}
        Schedule:
          Type: Schedule
          Properties:
            Schedule: rate(5 minutes)
  BetaFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: ../target/lambda/beta/
      Events:
        Schedule:
          Type: Schedule
          Properties:
            Schedule: rate(1 minute)
  GammaFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: ../target/lambda/gamma/
      MemorySize: 512
      Events:
        Schedule:
          Type: Schedule
          Properties:
            Schedule: rate(1 hour)
  AlphaLogs:
    Type: AWS::Logs::LogGroup
    Properties:
      RetentionInDays: !Ref LogRetentionDays
  BetaLogs:
    Type: AWS::Logs::LogGroup
    Properties:
      RetentionInDays: !Ref LogRetentionDays
  EventLog:
    Type: AWS::Logs::LogGroup
    Properties:
      RetentionInDays: 14
  EventLogRule:
    Type: AWS::Events::Rule
    Properties:
      EventPattern: {"source": ["capacity-pilot"]}
      Targets:
        - Id: event-log
          Arn: !GetAtt EventLog.Arn
  Archive:
    Type: AWS::Events::Archive
    Properties:
      EventPattern: {"source": ["capacity-pilot"]}
      RetentionDays: !Ref ArchiveDays
  Key:
    Type: AWS::KMS::Key
    Properties:
      EnableKeyRotation: true
  Topic:
    Type: AWS::SNS::Topic
    Properties:
      KmsMasterKeyId: !Ref Key
  FailureQueue:
    Type: AWS::SQS::Queue
  AlphaErrors:
    Type: AWS::CloudWatch::Alarm
    Properties:
      Namespace: AWS/Lambda
      MetricName: Errors
      Dimensions:
        - Name: FunctionName
          Value: !Ref AlphaFunction
      Period: 300
      AlarmActions: [!Ref Topic]
  QueueDepth:
    Type: AWS::CloudWatch::Alarm
    Properties:
      Namespace: AWS/SQS
      MetricName: ApproximateNumberOfMessagesVisible
      Dimensions:
        - Name: QueueName
          Value: !GetAtt FailureQueue.QueueName
      Period: 300
  FastErrors:
    Type: AWS::CloudWatch::Alarm
    Properties:
      Namespace: AWS/Lambda
      MetricName: Errors
      Period: 10
  AlertMetric:
    Type: AWS::Logs::MetricFilter
    Properties:
      LogGroupName: !Ref AlphaLogs
      FilterPattern: '{ $.fields.alert = "a" }'
      MetricTransformations:
        - {MetricNamespace: Fixture, MetricName: Alerts, MetricValue: "1", DefaultValue: 0}
  AlertMetricToo:
    Type: AWS::Logs::MetricFilter
    Properties:
      LogGroupName: !Ref BetaLogs
      FilterPattern: '{ $.fields.alert = "a" }'
      MetricTransformations:
        - {MetricNamespace: Fixture, MetricName: Alerts, MetricValue: "1", DefaultValue: 0}
  RareMetric:
    Type: AWS::Logs::MetricFilter
    Properties:
      LogGroupName: !Ref BetaLogs
      FilterPattern: '{ $.fields.alert = "b" }'
      MetricTransformations:
        - {MetricNamespace: Fixture, MetricName: Rare, MetricValue: "1"}
  ReaderRole:
    Type: AWS::IAM::Role
    Properties:
      AssumeRolePolicyDocument: {}
"#;

/// The fixture forwarder: one rule, forwarding EC2 state changes to the home region.
const FORWARDER: &str = r#"AWSTemplateFormatVersion: "2010-09-09"
Parameters:
  HomeRegion:
    Type: String
Resources:
  ForwardRole:
    Type: AWS::IAM::Role
    Properties:
      AssumeRolePolicyDocument: {}
  ForwardStateChanges:
    Type: AWS::Events::Rule
    Properties:
      EventBusName: default
      EventPattern: {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]}
      Targets:
        - Id: home
          Arn: !Sub arn:${AWS::Partition}:events:${HomeRegion}:${AWS::AccountId}:event-bus/default
          RoleArn: !GetAtt ForwardRole.Arn
"#;

const SCHEDULED: &str = "Scheduled Event";
const STATE_CHANGE: &str = "EC2 Instance State-change Notification";

/// One line of the fixture log.
struct Inv {
    minute: u32,
    function: &'static str,
    trigger: &'static str,
    ok: bool,
    duration_ms: f64,
    dynamodb: u32,
    other_calls: u32,
    published: u32,
    decided: bool,
}

#[allow(clippy::too_many_arguments)]
const fn inv(
    minute: u32,
    function: &'static str,
    trigger: &'static str,
    ok: bool,
    duration_ms: f64,
    dynamodb: u32,
    other_calls: u32,
    published: u32,
) -> Inv {
    Inv {
        minute,
        function,
        trigger,
        ok,
        duration_ms,
        dynamodb,
        other_calls,
        published,
        decided: published > 0,
    }
}

/// Half an hour of make run, 00:00 to 00:30 (out of order in the file, as nothing promises it).
/// Alpha ticked at every one of its 7 ticks in that span; its quiet ticks with the fewest calls
/// (one DynamoDB call) took 12.2, 18.0, 30.0 and 41.0 ms: the lower median is 18.0 ms. Beta's
/// quiet ticks with the fewest calls took 20.0 and 25.5 ms with 2 calls (the 9.0 ms one made a
/// SageMaker call too, the 5.0 ms one failed): 20.0 ms. One state change failed.
const LOG: [Inv; 14] = [
    inv(0, "alpha", SCHEDULED, true, 12.2, 1, 0, 0),
    inv(5, "alpha", SCHEDULED, true, 30.0, 1, 0, 0),
    inv(10, "alpha", SCHEDULED, true, 8.5, 1, 1, 0),
    inv(15, "alpha", SCHEDULED, true, 1500.25, 20, 1, 3),
    inv(30, "alpha", SCHEDULED, true, 18.0, 1, 0, 0),
    inv(20, "alpha", SCHEDULED, true, 41.0, 1, 0, 0),
    inv(25, "alpha", SCHEDULED, true, 999.0, 12, 0, 2),
    inv(
        12,
        "alpha",
        "Capacity Request Submitted",
        true,
        2300.4,
        25,
        1,
        4,
    ),
    inv(1, "beta", SCHEDULED, true, 20.0, 2, 0, 0),
    inv(17, "beta", STATE_CHANGE, false, 3100.9, 8, 3, 0),
    inv(18, "beta", STATE_CHANGE, true, 2750.0, 15, 4, 1),
    inv(29, "beta", SCHEDULED, true, 25.5, 2, 0, 0),
    inv(22, "beta", SCHEDULED, true, 9.0, 2, 1, 0),
    inv(23, "beta", SCHEDULED, false, 5.0, 1, 0, 0),
];
const SPAN_HOURS: f64 = 0.5;

fn log_line(i: &Inv) -> Value {
    let mut calls = serde_json::Map::new();
    calls.insert("dynamodb".into(), json!(i.dynamodb));
    if i.other_calls > 0 {
        calls.insert("ec2".into(), json!(i.other_calls));
    }
    if i.function == "beta" && i.minute == 22 {
        calls.remove("ec2");
        calls.insert("sagemaker".into(), json!(i.other_calls));
    }
    json!({
        "at": format!("2026-12-01T00:{:02}:00+00:00", i.minute),
        "function": i.function,
        "trigger": i.trigger,
        "ok": i.ok,
        "error": if i.ok { Value::Null } else { json!("boom") },
        "decisions": if i.decided { json!([{"kind": "planned"}]) } else { json!([]) },
        "published": (0..i.published).map(|n| format!("Event {n}")).collect::<Vec<_>>(),
        "duration_ms": i.duration_ms,
        "peak_rss_kb": 11_000,
        "cpu_ms": 1.5,
        "aws_calls": calls,
    })
}

/// The fixture's functions: name, MemorySize, minutes between ticks, and the idle tick cost.py
/// must take (duration, DynamoDB calls); gamma's is costs.toml's default.
fn fixture_functions(costs: &toml_edit::DocumentMut) -> [(&'static str, f64, f64, f64, f64); 3] {
    let default_ms = number(&costs["idle_tick"]["duration_ms"], "idle_tick.duration_ms");
    let default_calls = number(
        &costs["idle_tick"]["dynamodb_calls"],
        "idle_tick.dynamodb_calls",
    );
    [
        ("alpha", 1024.0, 5.0, 18.0, 1.0),
        ("beta", 2048.0, 1.0, 20.0, 2.0),
        ("gamma", 512.0, 60.0, default_ms, default_calls),
    ]
}

fn write_fixtures(dir: &Path, template: &str) -> (String, String, String) {
    let (t, f, log) = (
        dir.join("template.yaml"),
        dir.join("forwarder.yaml"),
        dir.join("invocations.jsonl"),
    );
    std::fs::write(&t, template).unwrap();
    std::fs::write(&f, FORWARDER).unwrap();
    let lines: String = LOG.iter().map(|i| format!("{}\n", log_line(i))).collect();
    std::fs::write(&log, lines).unwrap();
    let s = |p: PathBuf| p.to_str().unwrap().to_string();
    (s(t), s(f), s(log))
}

/// The dollar figure after `prefix` at the start of a line of `out`.
fn figure(out: &str, prefix: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?}:\n{out}"));
    line[prefix.len()..]
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no figure after {prefix:?}: {line}"))
}

/// A breakdown row's two figures (idle, at load), found by the start of its label.
fn row(out: &str, label: &str) -> (f64, f64) {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no row {label:?}:\n{out}"));
    let money: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.strip_prefix('$'))
        .map(|w| w.parse().unwrap())
        .collect();
    assert_eq!(money.len(), 2, "row {label:?} has not two figures: {line}");
    (money[0], money[1])
}

#[test]
fn cost_prints_the_idle_and_at_load_figures_of_its_model_at_costs_toml_prices() {
    let c = costs();
    let dir = scratch("figures");
    let (template, forwarder, log) = write_fixtures(&dir, TEMPLATE);
    let output = cost_py(&[
        "--invocations",
        &log,
        "--template",
        &template,
        "--forwarder",
        &forwarder,
    ]);
    let (out, err) = text(&output);
    assert!(output.status.success(), "cost.py failed: {err}\n{out}");

    let p = |key: &str| unit_price(&c, key);
    let hours = number(&c["hours_per_month"], "hours_per_month");
    let log_gb = number(
        &c["estimate"]["log_bytes_per_invocation"],
        "estimate.log_bytes_per_invocation",
    ) / (1024.0 * 1024.0 * 1024.0);
    let table_gb = number(&c["estimate"]["table_gb"], "estimate.table_gb");
    let event_gb =
        number(&c["estimate"]["event_bytes"], "estimate.event_bytes") / (1024.0 * 1024.0 * 1024.0);
    let retention_months = 30.0 / (hours / 24.0);
    let gb_s = |ms: f64, mb: f64| ms.ceil() / 1000.0 * mb / 1024.0;
    let fns = fixture_functions(&c);
    let memory = |name: &str| fns.iter().find(|f| f.0 == name).unwrap().1;

    // What costs the same idle and at load: 2 standard alarms and a high-resolution one, one
    // metric, one key, one table of table_gb with its backups.
    let fixed = [
        (
            "cloudwatch alarms",
            2.0 * p("cloudwatch_alarm_standard") + p("cloudwatch_alarm_high_resolution"),
        ),
        ("cloudwatch custom metrics", p("cloudwatch_custom_metric")),
        ("kms keys", p("kms_key")),
        (
            "dynamodb storage + PITR",
            table_gb * (p("dynamodb_storage") + p("dynamodb_pitr")),
        ),
    ];
    let fixed_total: f64 = fixed.iter().map(|f| f.1).sum();

    // Idle: every tick of every schedule, at its function's idle tick.
    #[derive(Default)]
    struct Usage {
        requests: f64,
        gb_seconds: f64,
        dynamodb: f64,
        events: f64,
        cross_region: f64,
        failures: f64,
    }
    let ticks = |u: &mut Usage, name: &str, n: f64| {
        let f = fns.iter().find(|f| f.0 == name).unwrap();
        u.requests += n;
        u.gb_seconds += n * gb_s(f.3, f.1);
        u.dynamodb += n * f.4;
    };
    let mut idle = Usage::default();
    for f in &fns {
        ticks(&mut idle, f.0, hours * 60.0 / f.2);
    }

    // At load: the log scaled from its half hour to a month, plus the ticks it does not hold
    // (alpha's 7 scaled pass its month of ticks: none added).
    let scale = hours / SPAN_HOURS;
    let mut load = Usage::default();
    for i in &LOG {
        load.requests += scale;
        load.gb_seconds += scale * gb_s(i.duration_ms, memory(i.function));
        load.dynamodb += scale * f64::from(i.dynamodb);
        load.events += scale * f64::from(i.published);
        load.cross_region += scale * f64::from(u8::from(i.trigger == STATE_CHANGE));
        load.failures += scale * f64::from(u8::from(!i.ok));
    }
    for f in &fns {
        let logged = LOG
            .iter()
            .filter(|i| i.function == f.0 && i.trigger == SCHEDULED)
            .count() as f64;
        ticks(
            &mut load,
            f.0,
            (hours * 60.0 / f.2 - logged * scale).max(0.0),
        );
    }

    let priced = |u: &Usage| {
        let ingested = u.requests * log_gb;
        // Every event published, whole, in the event log (14 days) and the archive (60).
        let events = u.events * event_gb;
        let months = |days: f64| days / (hours / 24.0);
        vec![
            ("lambda requests", u.requests * p("lambda_request")),
            (
                "lambda compute, arm64",
                u.gb_seconds * p("lambda_arm64_gb_second"),
            ),
            (
                "dynamodb calls, each as a WRU",
                u.dynamodb * p("dynamodb_write_request_unit"),
            ),
            (
                "eventbridge events published",
                u.events * p("eventbridge_custom_event"),
            ),
            (
                "eventbridge cross-region",
                u.cross_region * p("eventbridge_cross_region_event"),
            ),
            ("sqs dead letters", u.failures * p("sqs_request")),
            (
                "sns alarm notices + kms requests",
                u.failures * (p("sns_publish") + p("kms_request")),
            ),
            ("logs ingestion", ingested * p("logs_ingestion")),
            (
                "logs storage (30 days kept)",
                ingested * retention_months * p("logs_storage"),
            ),
            (
                "event log (14 days kept)",
                events * (p("logs_ingestion") + months(14.0) * p("logs_storage")),
            ),
            (
                "event archive (60 days kept)",
                events
                    * (p("eventbridge_archive_processing")
                        + months(60.0) * p("eventbridge_archive_storage")),
            ),
        ]
    };
    let (idle_rows, load_rows) = (priced(&idle), priced(&load));
    let idle_total = idle_rows.iter().map(|r| r.1).sum::<f64>() + fixed_total;
    let load_total = load_rows.iter().map(|r| r.1).sum::<f64>() + fixed_total;

    let as_of = c["as_of"].as_datetime().expect("as_of, a date").to_string();
    let first = out.lines().next().unwrap_or_default();
    assert!(
        first.contains(&as_of) && first.contains("costs.toml"),
        "the first line names the prices' date ({as_of}) and file: {first}"
    );
    let cent = 0.005 + 1e-9;
    let printed = figure(&out, "idle: $");
    assert!(
        (printed - idle_total).abs() <= cent,
        "idle: printed ${printed}, the model makes ${idle_total:.4}\n{out}"
    );
    let printed = figure(&out, "at make run's load: $");
    assert!(
        (printed - load_total).abs() <= cent,
        "at load: printed ${printed}, the model makes ${load_total:.4}\n{out}"
    );
    assert!(
        out.contains("(14 invocations over 0.5 simulated hours, scaled to 730 h)"),
        "{out}"
    );
    // Each row to its printed precision, so that a wrong small one is not lost in the total.
    let tenth_cent = 0.00005 + 1e-9;
    for (n, (label, idle_cost)) in idle_rows.iter().enumerate() {
        let (i, l) = row(&out, label);
        assert!(
            (i - idle_cost).abs() <= tenth_cent,
            "{label}: idle ${i}, the model ${idle_cost:.6}\n{out}"
        );
        let load_cost = load_rows[n].1;
        assert!(
            (l - load_cost).abs() <= tenth_cent,
            "{label}: at load ${l}, the model ${load_cost:.6}\n{out}"
        );
    }
    for (label, cost) in fixed {
        let (i, l) = row(&out, label);
        assert!(
            (i - cost).abs() <= tenth_cent && (l - cost).abs() <= tenth_cent,
            "{label}: ${i} / ${l}, the model ${cost:.6}\n{out}"
        );
    }
    assert!(
        load_rows.iter().all(|r| r.1 > 0.0),
        "the fixture exercises every row: {out}"
    );
    assert!(
        out.lines().count() < 35,
        "{} lines:\n{out}",
        out.lines().count()
    );
}

/// Every resource of a template, `Fn::ForEach` loops' included, and each function's event
/// source types.
fn template_types(path: &str) -> BTreeSet<String> {
    fn walk(resources: &serde_json::Map<String, Value>, out: &mut BTreeSet<String>) {
        for (name, r) in resources {
            if name.starts_with("Fn::ForEach::") {
                let body = r[2]
                    .as_object()
                    .unwrap_or_else(|| panic!("{name}: no body"));
                walk(body, out);
                continue;
            }
            let kind = r["Type"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no Type"));
            out.insert(kind.to_string());
            if let Some(events) = r["Properties"]["Events"].as_object() {
                for ev in events.values() {
                    out.insert(ev["Type"].as_str().expect("an event's Type").to_string());
                }
            }
        }
    }
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    let t: Value = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = BTreeSet::new();
    walk(t["Resources"].as_object().expect("Resources"), &mut out);
    out
}

#[test]
fn every_resource_type_of_both_templates_is_priced_or_listed_free() {
    let c = costs();
    let prices = c["price"].as_table().expect("[price]");
    for path in ["infra/template.yaml", "infra/region-forwarder.yaml"] {
        let types = template_types(path);
        assert!(types.contains("AWS::IAM::Role") || types.contains("AWS::Serverless::Function"));
        for kind in types {
            let row = c["type"]
                .get(&kind)
                .unwrap_or_else(|| panic!("{path}: {kind} has no [type.\"{kind}\"] in costs.toml"));
            let free = row.get("free").and_then(|f| f.as_str()).unwrap_or("");
            let priced: Vec<&str> = row
                .get("prices")
                .and_then(|p| p.as_array())
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            assert!(
                free.is_empty() != priced.is_empty(),
                "{kind}: either its prices or free with the reason"
            );
            for key in priced {
                let p = &prices[key];
                assert!(
                    p["source"]
                        .as_str()
                        .is_some_and(|s| s.starts_with("https://aws.amazon.com/")),
                    "price.{key}: its source is an AWS pricing page"
                );
                assert!(unit_price(&c, key) > 0.0, "price.{key}");
            }
        }
    }
    // And the script agrees: both real templates, no log (the idle figure alone).
    let output = cost_py(&[]);
    let (out, err) = text(&output);
    assert!(
        output.status.success(),
        "cost.py on the templates: {err}\n{out}"
    );
    assert!(out.lines().any(|l| l.starts_with("idle: $")), "{out}");
}

#[test]
fn a_resource_type_costs_toml_does_not_know_fails_naming_it() {
    let dir = scratch("unknown-type");
    let template =
        format!("{TEMPLATE}  Mystery:\n    Type: AWS::Mystery::Widget\n    Properties: {{}}\n");
    let (template, forwarder, log) = write_fixtures(&dir, &template);
    let output = cost_py(&[
        "--invocations",
        &log,
        "--template",
        &template,
        "--forwarder",
        &forwarder,
    ]);
    let (out, err) = text(&output);
    assert!(!output.status.success(), "an unpriced type passed:\n{out}");
    assert!(
        err.contains("AWS::Mystery::Widget")
            && err.contains("Mystery")
            && err.contains("costs.toml"),
        "the message names the type, the resource and the file: {err}"
    );
    assert!(out.is_empty(), "no figure printed: {out}");
}

#[test]
fn a_missing_invocations_file_fails_saying_to_run_make_run() {
    let dir = scratch("missing-log");
    let missing = dir.join("invocations.jsonl");
    let output = cost_py(&["--invocations", missing.to_str().unwrap()]);
    let (out, err) = text(&output);
    assert!(!output.status.success(), "a missing log passed:\n{out}");
    assert!(
        err.contains("make run") && err.contains(missing.to_str().unwrap()),
        "the message names the file and says to run `make run` first: {err}"
    );
}
