//! The operations kit (issue 56), held to the template and the runbook: every name the
//! template fixes carries the stack name; each function's heartbeat alarm waits twice its
//! schedule; every alarm links an entry of docs/operations.md, and every `errorType` the code
//! emits has one; every metric filter's pattern is one local-cloud's evaluator reads, and the
//! outcome filters count exactly their events; the event log, its resource policy, the
//! archive and the alarm on the log's rule are wired as AWS requires; operators may write the
//! PAUSE item and no other; the outputs and the saved queries name what people look for.

use std::collections::{BTreeMap, BTreeSet};

use capacity_pilot::decision::ERROR_TYPES;
use local_cloud::logs;
use serde_json::{Value, json};

use super::{of_type, one_or_many, referenced, resources, root, statements, strings, yaml};

const TEMPLATE: &str = "infra/template.yaml";
const RUNBOOK: &str = "docs/operations.md";
const STACK: &str = "${AWS::StackName}";
const FUNCTIONS: usize = 5;

/// The text of a `Fn::Sub` (either form), or of a literal string.
fn sub_text(v: &Value) -> Option<&str> {
    v.as_str()
        .or_else(|| v["Fn::Sub"].as_str())
        .or_else(|| v["Fn::Sub"][0].as_str())
}

/// A value a template writes itself (a literal or a `Fn::Sub`), as opposed to one it refers
/// to (`Ref`, `Fn::GetAtt`, `Fn::ImportValue`...).
fn written_here(v: &Value) -> bool {
    v.is_string() || v.get("Fn::Sub").is_some()
}

/// Every property at the top of a resource's `Properties` whose key ends in `Name` and whose
/// value the template writes itself: the names it fixes. A metric's name is not a resource's
/// (its namespace carries the stack, checked below), nor is a topic's `DisplayName` (the
/// sender name of its emails).
fn fixed_names(t: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (id, r) in resources(t) {
        for (key, v) in r["Properties"].as_object().into_iter().flatten() {
            let not_a_name = key == "MetricName" || key == "DisplayName";
            if key.ends_with("Name") && !not_a_name && written_here(v) {
                out.push((id.clone(), key.clone(), v.clone()));
            }
        }
    }
    out
}

#[test]
fn every_name_the_template_fixes_carries_the_stack_name() {
    let t = yaml(TEMPLATE);
    let names = fixed_names(&t);
    let mut not_stacks = Vec::new();
    for (id, key, v) in &names {
        if !sub_text(v).is_some_and(|s| s.contains(STACK) && v.get("Fn::Sub").is_some()) {
            not_stacks.push(format!("{id}.{key}: {v}"));
        }
    }
    assert!(
        not_stacks.is_empty(),
        "two stacks in one region would collide on these names; write them as Fn::Sub with \
         {STACK}:\n{not_stacks:#?}"
    );
    // What is named: the bus, the KMS alias, six log groups, the event log's rule and
    // resource policy, the archive, three saved queries.
    let named: BTreeSet<&str> = names.iter().map(|(id, _, _)| id.as_str()).collect();
    for id in [
        "Bus",
        "TopicKeyAlias",
        "EventLog",
        "EventLogRule",
        "EventLogPolicy",
        "EventArchive",
    ] {
        assert!(named.contains(id), "{id} has no fixed name");
    }
    assert!(names.len() >= 14, "{names:#?}");
    // Our metrics are the stack's own: every namespace that is not AWS's carries it.
    let mut namespaces = Vec::new();
    for (id, a) in of_type(&t, "AWS::CloudWatch::Alarm") {
        let ns = &a["Properties"]["Namespace"];
        if !ns.as_str().is_some_and(|n| n.starts_with("AWS/")) {
            namespaces.push((id.clone(), ns.clone()));
        }
    }
    for (id, f) in of_type(&t, "AWS::Logs::MetricFilter") {
        for m in one_or_many(&f["Properties"]["MetricTransformations"]) {
            namespaces.push((id.clone(), m["MetricNamespace"].clone()));
        }
    }
    assert!(!namespaces.is_empty());
    for (id, ns) in namespaces {
        assert_eq!(
            ns,
            json!({"Fn::Sub": "CapacityPilot/${AWS::StackName}"}),
            "{id}: two stacks must never share a metric"
        );
    }
}

/// The last part of a function's `CodeUri`: its crate.
fn crate_of(f: &Value) -> String {
    f["Properties"]["CodeUri"]
        .as_str()
        .unwrap()
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn each_log_group_is_named_after_the_stack_and_its_function_and_kept_log_retention_days() {
    let t = yaml(TEMPLATE);
    let res = resources(&t);
    let functions = of_type(&t, "AWS::Serverless::Function");
    assert_eq!(functions.len(), FUNCTIONS);
    let mut groups = BTreeMap::new();
    for (id, f) in &functions {
        let group = referenced(&f["Properties"]["LoggingConfig"]["LogGroup"])
            .unwrap_or_else(|| panic!("{id} logs to no log group of the stack"));
        groups.insert(group.to_string(), crate_of(f));
    }
    groups.insert("EventLog".into(), "events".into());
    for (group, suffix) in &groups {
        let p = &res[group]["Properties"];
        assert_eq!(res[group]["Type"], "AWS::Logs::LogGroup", "{group}");
        assert_eq!(
            p["LogGroupName"],
            json!({"Fn::Sub": format!("/capacity-pilot/{STACK}/{suffix}")}),
            "{group}"
        );
        assert_eq!(
            p["RetentionInDays"],
            json!({"Ref": "LogRetentionDays"}),
            "{group}"
        );
    }
    assert_eq!(
        of_type(&t, "AWS::Logs::LogGroup").len(),
        groups.len(),
        "a log group no function or rule writes to"
    );
}

/// A function's schedule, from its `Schedule` event's `rate(...)`, in seconds.
fn schedule_seconds(name: &str, f: &Value) -> i64 {
    let schedules: Vec<i64> = f["Properties"]["Events"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, e)| e["Type"] == "Schedule")
        .map(|(ev, e)| {
            let expr = e["Properties"]["Schedule"].as_str().unwrap_or_default();
            local_cloud::rules::rate(expr)
                .unwrap_or_else(|| panic!("{name}.{ev}: {expr:?} is not a rate(...)"))
                .num_seconds()
        })
        .collect();
    assert_eq!(schedules.len(), 1, "{name} has one schedule");
    schedules[0]
}

/// The alarms on `namespace`/`metric` whose `FunctionName` dimension is `function`.
fn function_alarms<'a>(t: &'a Value, metric: &str, function: &str) -> Vec<(&'a String, &'a Value)> {
    of_type(t, "AWS::CloudWatch::Alarm")
        .into_iter()
        .filter(|(_, a)| {
            let p = &a["Properties"];
            p["Namespace"] == "AWS/Lambda"
                && p["MetricName"] == metric
                && one_or_many(&p["Dimensions"]).iter().any(|d| {
                    d["Name"] == "FunctionName" && referenced(&d["Value"]) == Some(function)
                })
        })
        .collect()
}

#[test]
fn each_heartbeat_alarm_waits_twice_its_functions_schedule() {
    let t = yaml(TEMPLATE);
    for (name, f) in of_type(&t, "AWS::Serverless::Function") {
        let every = schedule_seconds(name, f);
        let beats = function_alarms(&t, "Invocations", name);
        assert_eq!(beats.len(), 1, "{name} has one heartbeat alarm");
        let (alarm, a) = beats[0];
        let p = &a["Properties"];
        assert_eq!(
            p["Period"],
            json!(2 * every),
            "{alarm}: twice {name}'s schedule ({every} s); change both together"
        );
        assert_eq!(p["Statistic"], "Sum", "{alarm}");
        assert_eq!(p["ComparisonOperator"], "LessThanThreshold", "{alarm}");
        assert_eq!(p["Threshold"], 1, "{alarm}");
        assert_eq!(p["EvaluationPeriods"], 1, "{alarm}");
        assert_eq!(
            p["TreatMissingData"], "breaching",
            "{alarm}: no data is a missed beat"
        );
    }
}

#[test]
fn errors_and_throttles_page_on_a_sustained_rate_not_one_failure() {
    let t = yaml(TEMPLATE);
    for (name, _) in of_type(&t, "AWS::Serverless::Function") {
        for metric in ["Errors", "Throttles"] {
            let alarms = function_alarms(&t, metric, name);
            assert_eq!(alarms.len(), 1, "{name} has one {metric} alarm");
            let (alarm, a) = alarms[0];
            let p = &a["Properties"];
            assert_eq!(
                (
                    &p["Statistic"],
                    &p["Period"],
                    &p["EvaluationPeriods"],
                    &p["DatapointsToAlarm"],
                    &p["Threshold"],
                    &p["ComparisonOperator"]
                ),
                (
                    &json!("Sum"),
                    &json!(300),
                    &json!(3),
                    &json!(3),
                    &json!(1),
                    &json!("GreaterThanOrEqualToThreshold")
                ),
                "{alarm}: at least one in each of 3 consecutive 5-minute periods"
            );
        }
    }
}

/// GitHub's anchor of a heading: lower case, spaces to hyphens, every character but letters,
/// digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Each heading's anchor in `markdown`, with the text under it up to the next heading
/// (headings inside fenced code are not headings).
fn entries(markdown: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if !fenced && line.starts_with('#') {
            let a = anchor(line.trim_start_matches('#'));
            assert!(!out.contains_key(&a), "two headings make #{a}");
            out.insert(a.clone(), String::new());
            current = Some(a);
        } else if let Some(a) = &current {
            let body = out.get_mut(a).unwrap();
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

fn runbook() -> BTreeMap<String, String> {
    entries(&std::fs::read_to_string(root().join(RUNBOOK)).unwrap())
}

/// A runbook entry says whether the next tick heals it, what to do, and how to look.
fn assert_runbook_entry(what: &str, entry: &str) {
    for part in ["**Heals by itself?**", "**What to do:**", "**Look:**"] {
        assert!(
            entry.contains(part),
            "{RUNBOOK}: the entry of {what} lacks {part}"
        );
    }
}

#[test]
fn every_alarm_links_its_runbook_entry_and_notifies_the_alarm_topic() {
    let t = yaml(TEMPLATE);
    assert_eq!(
        t["Parameters"]["RunbookUrl"]["Default"],
        "https://github.com/capacity-pilot/capacity-pilot/blob/main/docs/operations.md"
    );
    let book = runbook();
    let alarms = of_type(&t, "AWS::CloudWatch::Alarm");
    assert!(alarms.len() >= 4 * FUNCTIONS, "{} alarms", alarms.len());
    for (name, a) in alarms {
        let p = &a["Properties"];
        let description = p["AlarmDescription"]["Fn::Sub"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: AlarmDescription is not a Fn::Sub string"));
        let (sentence, link) = description
            .split_once(" Runbook: ${RunbookUrl}#")
            .unwrap_or_else(|| {
                panic!("{name}: the description ends with \"Runbook: ${{RunbookUrl}}#<anchor>\"")
            });
        assert!(
            sentence.ends_with('.') && sentence.len() > 20,
            "{name}: one sentence saying what it means first: {sentence:?}"
        );
        let entry = book
            .get(link)
            .unwrap_or_else(|| panic!("{name} links #{link}, which {RUNBOOK} has no heading for"));
        assert_runbook_entry(name, entry);
        assert!(
            one_or_many(&p["AlarmActions"])
                .iter()
                .any(|x| referenced(x) == Some("AlarmTopic")),
            "{name} notifies no one"
        );
    }
}

/// Every `error_type = "X"` literal under `dir` (the functions' and shared library's sources).
fn error_type_literals(dir: &std::path::Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            error_type_literals(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            let mut rest = text.as_str();
            while let Some(at) = rest.find("error_type") {
                rest = &rest[at + "error_type".len()..];
                let tail = rest.trim_start();
                if let Some(quoted) = tail
                    .strip_prefix('=')
                    .map(str::trim_start)
                    .and_then(|t| t.strip_prefix('"'))
                    && let Some(end) = quoted.find('"')
                {
                    out.insert(quoted[..end].to_string());
                }
            }
        }
    }
}

#[test]
fn every_error_type_the_code_emits_has_a_runbook_entry() {
    let mut names: BTreeSet<String> = ERROR_TYPES.iter().map(|e| e.name.to_string()).collect();
    let mut literals = BTreeSet::new();
    error_type_literals(&root().join("shared/src"), &mut literals);
    for f in std::fs::read_dir(root().join("functions")).unwrap() {
        error_type_literals(&f.unwrap().path().join("src"), &mut literals);
    }
    assert!(
        literals.contains("DeploymentIdChanged"),
        "the scan finds the cold start's error_type: {literals:?}"
    );
    names.extend(literals);
    let book = runbook();
    for name in names {
        let entry = book.get(&name.to_lowercase()).unwrap_or_else(|| {
            panic!(
                "{RUNBOOK} has no heading `{name}` (its anchor #{})",
                name.to_lowercase()
            )
        });
        assert_runbook_entry(&name, entry);
    }
}

/// The emitted sample events (infra/events/emitted/), by file stem.
fn emitted() -> BTreeMap<String, Value> {
    std::fs::read_dir(root().join("infra/events/emitted"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(&p).unwrap();
            (stem, serde_json::from_str(&text).unwrap())
        })
        .collect()
}

#[test]
fn every_metric_filter_parses_and_each_outcome_filter_counts_exactly_its_events() {
    let t = yaml(TEMPLATE);
    let filters = of_type(&t, "AWS::Logs::MetricFilter");
    let mut on_event_log = BTreeMap::new();
    for (id, f) in &filters {
        let p = &f["Properties"];
        let pattern = p["FilterPattern"].as_str().expect("a FilterPattern string");
        logs::parse(pattern).unwrap_or_else(|e| panic!("{id}: {e}"));
        // Each filter's metric has its alarm.
        for m in one_or_many(&p["MetricTransformations"]) {
            let alarmed = of_type(&t, "AWS::CloudWatch::Alarm")
                .into_iter()
                .any(|(_, a)| {
                    a["Properties"]["MetricName"] == m["MetricName"]
                        && a["Properties"]["Namespace"] == m["MetricNamespace"]
                });
            assert!(alarmed, "{id}: no alarm on {}", m["MetricName"]);
        }
        if referenced(&p["LogGroupName"]) == Some("EventLog") {
            on_event_log.insert(id.as_str(), pattern);
        }
    }
    // The event log's filters, against every emitted sample (a late drain made from the
    // on-time one): each counts its own detail-type only.
    let mut samples = emitted();
    let mut late = samples["capacity-workload-drained"].clone();
    late["detail"]["late"] = json!(true);
    samples.insert("capacity-workload-drained-late".into(), late);
    let want: BTreeMap<&str, &str> = BTreeMap::from([
        ("PaymentFailedMetric", "capacity-payment-failed"),
        ("DrainLateMetric", "capacity-workload-drained-late"),
        ("PurchaseInDoubtMetric", "capacity-purchase-in-doubt"),
        (
            "ReservationUnrecordedMetric",
            "capacity-reservation-unrecorded",
        ),
    ]);
    assert_eq!(
        on_event_log.keys().copied().collect::<BTreeSet<_>>(),
        want.keys().copied().collect::<BTreeSet<_>>()
    );
    for (id, pattern) in &on_event_log {
        let hits: Vec<&str> = samples
            .iter()
            .filter(|(_, e)| logs::matches(pattern, e).unwrap())
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(hits, [want[id]], "{id}: {pattern}");
    }
    // The overdue filter reads cleanup-expired's alert line.
    let overdue = filters
        .iter()
        .find(|(id, _)| id.as_str() == "RequestOverdueMetric")
        .expect("RequestOverdueMetric");
    let p = &overdue.1["Properties"];
    assert_eq!(referenced(&p["LogGroupName"]), Some("CleanupExpiredLogs"));
    let pattern = p["FilterPattern"].as_str().unwrap();
    let line = |alert: &str| {
        json!({"level": "WARN", "fields": {"message": "request team-a-x is overdue",
               "alert": alert, "request_id": "team-a-x"}})
    };
    assert!(logs::matches(pattern, &line("request-overdue")).unwrap());
    assert!(!logs::matches(pattern, &line("reservation-unrecorded")).unwrap());
}

#[test]
fn the_event_log_takes_our_events_under_a_policy_only_its_rule_may_use() {
    let t = yaml(TEMPLATE);
    let res = resources(&t);
    // The rule: on our bus, our events but not replays, to the event log, with no role (a
    // CloudWatch Logs target takes none).
    let rule = &res["EventLogRule"];
    assert_eq!(rule["Type"], "AWS::Events::Rule");
    let p = &rule["Properties"];
    assert_eq!(referenced(&p["EventBusName"]), Some("Bus"));
    assert_eq!(
        p["EventPattern"],
        json!({"source": ["capacity-pilot"], "replay-name": [{"exists": false}]})
    );
    assert_eq!(p["State"], "ENABLED");
    let targets = one_or_many(&p["Targets"]);
    assert_eq!(targets.len(), 1);
    assert_eq!(
        targets[0]["Arn"],
        json!({"Fn::GetAtt": ["EventLog", "Arn"]})
    );
    assert!(targets[0]["RoleArn"].is_null());

    // The resource policy: EventBridge (and its log delivery) may create streams and put
    // events in the event log only, putting only for this rule.
    let policy = &res["EventLogPolicy"]["Properties"]["PolicyDocument"]["Fn::ToJsonString"];
    let all = statements(policy);
    assert!(!all.is_empty(), "EventLogPolicy has no statement");
    let mut granted = BTreeSet::new();
    for s in &all {
        assert_eq!(s["Effect"], "Allow");
        let services = strings(&s["Principal"]["Service"]);
        for service in &services {
            assert!(
                ["events.amazonaws.com", "delivery.logs.amazonaws.com"].contains(&service.as_str()),
                "{service} may write to the event log"
            );
        }
        for r in one_or_many(&s["Resource"]) {
            assert_eq!(
                referenced(r),
                Some("EventLog"),
                "a resource besides the event log"
            );
        }
        for action in strings(&s["Action"]) {
            assert!(
                ["logs:CreateLogStream", "logs:PutLogEvents"].contains(&action.as_str()),
                "{action}"
            );
            if action == "logs:PutLogEvents" {
                assert_eq!(
                    s["Condition"],
                    json!({"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": ["EventLogRule", "Arn"]}}}),
                    "putting is for this stack's rule only"
                );
            }
            if services.iter().any(|s| s == "events.amazonaws.com") {
                granted.insert(action);
            }
        }
    }
    assert_eq!(
        granted,
        BTreeSet::from(["logs:CreateLogStream".into(), "logs:PutLogEvents".into()])
    );

    // The archive: every event of ours on the bus, kept EventArchiveRetentionDays.
    let archive = &res["EventArchive"]["Properties"];
    assert_eq!(archive["SourceArn"], json!({"Fn::GetAtt": ["Bus", "Arn"]}));
    assert_eq!(
        archive["EventPattern"],
        json!({"source": ["capacity-pilot"]})
    );
    assert_eq!(
        archive["RetentionDays"],
        json!({"Ref": "EventArchiveRetentionDays"})
    );
    // An archive's name is at most 48 characters: the stack name alone.
    assert_eq!(archive["ArchiveName"], json!({"Fn::Sub": STACK}));

    // A failing rule pages: its FailedInvocations, with the custom bus's two dimensions.
    let failing = &res["EventLogRuleFailing"]["Properties"];
    assert_eq!(failing["Namespace"], "AWS/Events");
    assert_eq!(failing["MetricName"], "FailedInvocations");
    let dims: BTreeMap<String, Value> = one_or_many(&failing["Dimensions"])
        .iter()
        .map(|d| (d["Name"].as_str().unwrap().to_string(), d["Value"].clone()))
        .collect();
    assert_eq!(referenced(&dims["EventBusName"]), Some("Bus"));
    assert_eq!(
        dims["RuleName"], p["Name"],
        "the alarm watches the event log's rule"
    );
    assert_eq!(
        failing["ComparisonOperator"],
        "GreaterThanOrEqualToThreshold"
    );
    assert_eq!(failing["Threshold"], 1);
}

#[test]
fn operators_may_write_the_pause_item_and_no_other() {
    let t = yaml(TEMPLATE);
    let doc = &resources(&t)["OperatorPolicy"]["Properties"]["PolicyDocument"];
    let writes: Vec<&Value> = statements(doc)
        .into_iter()
        .filter(|s| {
            strings(&s["Action"])
                .iter()
                .any(|a| a == "dynamodb:PutItem" || a == "dynamodb:DeleteItem")
        })
        .collect();
    assert_eq!(writes.len(), 1, "one statement writes");
    let s = writes[0];
    assert_eq!(
        strings(&s["Action"]),
        ["dynamodb:PutItem", "dynamodb:DeleteItem"]
    );
    let resources: Vec<_> = one_or_many(&s["Resource"]);
    assert_eq!(resources.len(), 1);
    assert_eq!(referenced(resources[0]), Some("StateTable"));
    assert_eq!(
        s["Condition"],
        json!({"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["PAUSE"]}}),
        "the PAUSE item's partition key, exactly"
    );
}

#[test]
fn the_outputs_name_every_function_queue_log_group_the_archive_and_both_topics() {
    let t = yaml(TEMPLATE);
    let outputs = t["Outputs"].as_object().expect("Outputs");
    let value = |key: &str| -> &Value {
        &outputs
            .get(key)
            .unwrap_or_else(|| panic!("no output {key}"))["Value"]
    };
    for (id, f) in of_type(&t, "AWS::Serverless::Function") {
        let stem = id.trim_end_matches("Function");
        assert_eq!(referenced(value(&format!("{id}Name"))), Some(id.as_str()));
        let group = referenced(&f["Properties"]["LoggingConfig"]["LogGroup"]).unwrap();
        assert_eq!(referenced(value(&format!("{stem}LogGroup"))), Some(group));
    }
    for queue in ["FailureQueue", "DeliveryQueue"] {
        assert_eq!(value(&format!("{queue}Url")), &json!({"Ref": queue}));
        assert_eq!(
            value(&format!("{queue}Arn")),
            &json!({"Fn::GetAtt": [queue, "Arn"]})
        );
    }
    assert_eq!(value("EventLogGroup"), &json!({"Ref": "EventLog"}));
    assert_eq!(value("EventArchiveName"), &json!({"Ref": "EventArchive"}));
    assert_eq!(value("AlarmTopicArn"), &json!({"Ref": "AlarmTopic"}));
    assert_eq!(value("NoticesTopicArn"), &json!({"Ref": "NoticesTopic"}));
}

#[test]
fn the_saved_queries_read_the_function_logs_and_the_event_logs_purchases() {
    let t = yaml(TEMPLATE);
    let function_groups: BTreeSet<String> = of_type(&t, "AWS::Serverless::Function")
        .iter()
        .map(|(_, f)| {
            referenced(&f["Properties"]["LoggingConfig"]["LogGroup"])
                .unwrap()
                .to_string()
        })
        .collect();
    let queries: BTreeMap<String, (BTreeSet<String>, String)> =
        of_type(&t, "AWS::Logs::QueryDefinition")
            .into_iter()
            .map(|(id, q)| {
                let p = &q["Properties"];
                let groups = one_or_many(&p["LogGroupNames"])
                    .iter()
                    .map(|g| referenced(g).expect("a log group of the stack").to_string())
                    .collect();
                let text = p["QueryString"].as_str().unwrap().to_string();
                (id.clone(), (groups, text))
            })
            .collect();
    let (groups, text) = &queries["RequestDecisionsQuery"];
    assert_eq!(groups, &function_groups);
    assert!(text.contains("fields.request_id = \"REPLACE-WITH-REQUEST-ID\""));
    let (groups, text) = &queries["ErrorsByTypeQuery"];
    assert_eq!(groups, &function_groups);
    assert!(text.contains("fields.error_type"));
    // This month's purchases: the fee field the Capacity Reserved event carries.
    let (groups, text) = &queries["PurchasesQuery"];
    assert_eq!(groups, &BTreeSet::from(["EventLog".to_string()]));
    assert!(
        text.contains("`detail-type` = \"Capacity Reserved\""),
        "{text}"
    );
    assert!(text.contains("sum(detail.upfront_fee_usd)"), "{text}");
    let reserved = &emitted()["capacity-reserved"];
    assert_eq!(reserved["detail-type"], "Capacity Reserved");
    assert!(reserved["detail"]["upfront_fee_usd"].is_string());
}
