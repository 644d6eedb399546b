//! The EventBridge wiring of a CloudFormation template, read from the template itself (there is
//! no second copy): each SAM function's `EventBridgeRule` events (pattern and bus) and
//! `Schedule` events (rate), and each plain `AWS::Events::Rule` (its `EventPattern` or
//! `ScheduleExpression`, its `EventBusName`, and whether its target is a function of the
//! template, an event bus, as `infra/region-forwarder.yaml`'s are, or a CloudWatch Logs log
//! group, as the event log's is), with the patterns matched by `quamina` as EventBridge matches
//! them.
//!
//! The flow tests route the buses' events with it, and the local runner delivers events, fires
//! schedules, forwards other regions' events and writes the event log with it.

use std::path::Path;

use chrono::TimeDelta;
use quamina::Quamina;
use serde_json::Value;

/// Which bus a rule sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bus {
    /// AWS's own events and the schedules.
    Default,
    /// The stack's bus (`EventBusName` given on the rule).
    Custom,
}

/// What fires a rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// An event pattern, as written in the template.
    Pattern(Value),
    /// A `rate(...)` schedule.
    Every(TimeDelta),
}

/// Where a rule sends what matches.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// A function of the template: its crate is [`Rule::function`].
    Function,
    /// An event bus: the target's `Arn` as written (e.g. a `Fn::Sub` naming the home region's
    /// `event-bus/default`).
    EventBus(Value),
    /// A CloudWatch Logs log group of the template (`Fn::GetAtt: [Group, Arn]`): its logical id.
    /// EventBridge writes each matching event, whole, as one log event.
    LogGroup(String),
}

/// One event source of one function, or one plain `AWS::Events::Rule`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The function's crate (and binary) name, from its `CodeUri`; empty when the target is
    /// an event bus or a log group.
    pub function: String,
    /// The function's logical id in the template (a plain rule's own logical id).
    pub logical_id: String,
    /// The event's name under the function's `Events` (a plain rule's target `Id`).
    pub name: String,
    pub bus: Bus,
    pub trigger: Trigger,
    pub target: Target,
}

#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("reading the template: {0}")]
    Io(#[from] std::io::Error),
    #[error("the template is not YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("{0}")]
    Template(String),
    #[error("rule {rule}: the pattern is not one EventBridge accepts: {message}")]
    Pattern { rule: String, message: String },
}

/// The template's rules, ready to match events.
pub struct Rules {
    rules: Vec<Rule>,
    matcher: Quamina<usize>,
}

impl Rules {
    pub fn from_template(path: &Path) -> Result<Rules, RulesError> {
        Rules::from_yaml(&std::fs::read_to_string(path)?)
    }

    pub fn from_yaml(text: &str) -> Result<Rules, RulesError> {
        let template: Value = serde_yaml_ng::from_str(text)?;
        let resources = template["Resources"]
            .as_object()
            .ok_or_else(|| RulesError::Template("the template has no Resources".into()))?;
        let crate_of = |logical_id: &str| -> Result<String, RulesError> {
            resources
                .get(logical_id)
                .filter(|r| r["Type"] == "AWS::Serverless::Function")
                .and_then(|r| r["Properties"]["CodeUri"].as_str())
                .and_then(|uri| uri.trim_end_matches('/').rsplit('/').next())
                .map(str::to_string)
                .ok_or_else(|| {
                    RulesError::Template(format!("{logical_id} has no CodeUri naming its binary"))
                })
        };
        let mut rules = Vec::new();
        for (logical_id, resource) in resources {
            if resource["Type"] == "AWS::Events::Rule" {
                let is_log_group = |id: &str| {
                    resources
                        .get(id)
                        .is_some_and(|r| r["Type"] == "AWS::Logs::LogGroup")
                };
                rules.extend(plain_rule(
                    logical_id,
                    &resource["Properties"],
                    &crate_of,
                    &is_log_group,
                )?);
                continue;
            }
            if resource["Type"] != "AWS::Serverless::Function" {
                continue;
            }
            let props = &resource["Properties"];
            let function = crate_of(logical_id)?;
            let Some(events) = props["Events"].as_object() else {
                continue;
            };
            for (name, event) in events {
                let p = &event["Properties"];
                let (bus, trigger) = match event["Type"].as_str() {
                    Some("Schedule") => {
                        let expr = p["Schedule"].as_str().unwrap_or_default();
                        let every = rate(expr).ok_or_else(|| {
                            RulesError::Template(format!(
                                "{logical_id}.{name}: schedule {expr:?} is not a rate(...) expression"
                            ))
                        })?;
                        (Bus::Default, Trigger::Every(every))
                    }
                    Some("EventBridgeRule") => {
                        let bus = if p.get("EventBusName").is_some() {
                            Bus::Custom
                        } else {
                            Bus::Default
                        };
                        (bus, Trigger::Pattern(p["Pattern"].clone()))
                    }
                    other => {
                        return Err(RulesError::Template(format!(
                            "{logical_id}.{name}: event type {other:?} is not one the local wiring knows"
                        )));
                    }
                };
                rules.push(Rule {
                    function: function.clone(),
                    logical_id: logical_id.clone(),
                    name: name.clone(),
                    bus,
                    trigger,
                    target: Target::Function,
                });
            }
        }
        let mut matcher = Quamina::new();
        for (i, rule) in rules.iter().enumerate() {
            if let Trigger::Pattern(pattern) = &rule.trigger {
                matcher
                    .add_pattern(i, &pattern.to_string())
                    .map_err(|e| RulesError::Pattern {
                        rule: format!("{}.{}", rule.logical_id, rule.name),
                        message: e.to_string(),
                    })?;
            }
        }
        Ok(Rules { rules, matcher })
    }

    pub fn all(&self) -> &[Rule] {
        &self.rules
    }

    /// The rules on `bus` whose pattern matches `event` (a whole EventBridge envelope).
    pub fn matching(&self, bus: Bus, event: &Value) -> Vec<&Rule> {
        let mut hits = self
            .matcher
            .matches_for_event(event.to_string().as_bytes())
            .unwrap_or_default();
        hits.sort_unstable();
        hits.into_iter()
            .map(|i| &self.rules[i])
            .filter(|r| r.bus == bus)
            .collect()
    }

    /// The functions (crate names) `event` on `bus` reaches, each once, sorted.
    pub fn functions_for(&self, bus: Bus, event: &Value) -> Vec<String> {
        let mut fs: Vec<String> = self
            .matching(bus, event)
            .into_iter()
            .filter(|r| r.target == Target::Function)
            .map(|r| r.function.clone())
            .collect();
        fs.sort();
        fs.dedup();
        fs
    }

    /// The rules on `bus` that send `event` on to an event bus (a forwarder's), in template
    /// order.
    pub fn forwarding(&self, bus: Bus, event: &Value) -> Vec<&Rule> {
        self.matching(bus, event)
            .into_iter()
            .filter(|r| matches!(r.target, Target::EventBus(_)))
            .collect()
    }

    /// The log groups (logical ids) that `event` on `bus` is written to, each once, in
    /// template order.
    pub fn log_groups_for(&self, bus: Bus, event: &Value) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in self.matching(bus, event) {
            if let Target::LogGroup(group) = &r.target
                && !out.contains(group)
            {
                out.push(group.clone());
            }
        }
        out
    }

    /// Each schedule: the function it invokes and how often.
    pub fn schedules(&self) -> Vec<(&str, TimeDelta)> {
        self.rules
            .iter()
            .filter(|r| r.target == Target::Function)
            .filter_map(|r| match r.trigger {
                Trigger::Every(every) => Some((r.function.as_str(), every)),
                Trigger::Pattern(_) => None,
            })
            .collect()
    }
}

/// A plain CloudFormation `AWS::Events::Rule`: one [`Rule`] per target (none when it is
/// `DISABLED`). Its bus is `EventBusName` (absent or `default`: the default bus); its trigger
/// its `EventPattern` or `ScheduleExpression`; a target is a function of the template
/// (`Fn::GetAtt: [Function, Arn]`, `Ref`), a log group of the template (`Fn::GetAtt: [Group,
/// Arn]`: a log group's `Ref` is its name, not an ARN) or an event bus (an ARN with
/// `:event-bus/`).
fn plain_rule(
    logical_id: &str,
    p: &Value,
    crate_of: &dyn Fn(&str) -> Result<String, RulesError>,
    is_log_group: &dyn Fn(&str) -> bool,
) -> Result<Vec<Rule>, RulesError> {
    if p["State"].as_str().is_some_and(|s| s != "ENABLED") {
        return Ok(Vec::new());
    }
    let bus = match &p["EventBusName"] {
        Value::Null => Bus::Default,
        Value::String(name) if name == "default" || name.ends_with(":event-bus/default") => {
            Bus::Default
        }
        _ => Bus::Custom,
    };
    let trigger = match (&p["EventPattern"], p["ScheduleExpression"].as_str()) {
        (Value::Null, Some(expr)) => Trigger::Every(rate(expr).ok_or_else(|| {
            RulesError::Template(format!(
                "{logical_id}: schedule {expr:?} is not a rate(...) expression"
            ))
        })?),
        (Value::Null, None) => {
            return Err(RulesError::Template(format!(
                "{logical_id}: a rule needs an EventPattern or a ScheduleExpression"
            )));
        }
        // CloudFormation also takes the pattern as a JSON string.
        (Value::String(text), _) => {
            Trigger::Pattern(serde_json::from_str(text).map_err(|e| RulesError::Pattern {
                rule: logical_id.to_string(),
                message: e.to_string(),
            })?)
        }
        (pattern, _) => Trigger::Pattern(pattern.clone()),
    };
    let targets = p["Targets"].as_array().cloned().unwrap_or_default();
    if targets.is_empty() {
        return Err(RulesError::Template(format!("{logical_id} has no Targets")));
    }
    targets
        .iter()
        .map(|t| {
            let arn = &t["Arn"];
            let got = arn["Fn::GetAtt"][0].as_str().or_else(|| {
                arn["Fn::GetAtt"]
                    .as_str()
                    .and_then(|dotted| dotted.split('.').next())
            });
            let (function, target) = match (got, arn["Ref"].as_str()) {
                (Some(group), _) if is_log_group(group) => {
                    (String::new(), Target::LogGroup(group.to_string()))
                }
                (_, Some(group)) if is_log_group(group) => {
                    return Err(RulesError::Template(format!(
                        "{logical_id}: target {arn}: a log group's Ref is its name; a rule \
                         targets its ARN (Fn::GetAtt: [{group}, Arn])"
                    )));
                }
                (Some(f), _) | (None, Some(f)) => (crate_of(f)?, Target::Function),
                (None, None) if arn_text(arn).is_some_and(|a| a.contains(":event-bus/")) => {
                    (String::new(), Target::EventBus(arn.clone()))
                }
                (None, None) => {
                    return Err(RulesError::Template(format!(
                        "{logical_id}: target {arn} is neither a function nor a log group of \
                         the template, nor an event bus"
                    )));
                }
            };
            Ok(Rule {
                function,
                logical_id: logical_id.to_string(),
                name: t["Id"].as_str().unwrap_or(logical_id).to_string(),
                bus,
                trigger: trigger.clone(),
                target,
            })
        })
        .collect()
}

/// An ARN as written: a string, or the string of a `Fn::Sub`.
fn arn_text(arn: &Value) -> Option<&str> {
    arn.as_str().or_else(|| {
        arn["Fn::Sub"]
            .as_str()
            .or_else(|| arn["Fn::Sub"][0].as_str())
    })
}

/// `rate(1 minute)`, `rate(5 minutes)`, `rate(2 hours)`, `rate(1 day)`.
pub fn rate(expr: &str) -> Option<TimeDelta> {
    let inner = expr.trim().strip_prefix("rate(")?.strip_suffix(')')?;
    let (n, unit) = inner.trim().split_once(' ')?;
    let n: i64 = n.parse().ok().filter(|n| *n > 0)?;
    let singular = n == 1;
    match (unit.trim(), singular) {
        ("minute", true) | ("minutes", false) => Some(TimeDelta::minutes(n)),
        ("hour", true) | ("hours", false) => Some(TimeDelta::hours(n)),
        ("day", true) | ("days", false) => Some(TimeDelta::days(n)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TEMPLATE: &str = r#"
Resources:
  Bus:
    Type: AWS::Events::EventBus
  AFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: ../target/lambda/a-fn/
      Events:
        Ours:
          Type: EventBridgeRule
          Properties:
            EventBusName:
              Ref: Bus
            Pattern: {"source": [{"anything-but": ["capacity-pilot"]}], "detail-type": ["X"]}
        Aws:
          Type: EventBridgeRule
          Properties:
            Pattern: {"source": ["aws.ec2"], "detail-type": ["X"]}
        Tick:
          Type: Schedule
          Properties:
            Schedule: rate(5 minutes)
"#;

    fn ev(source: &str, detail_type: &str) -> Value {
        json!({"version": "0", "id": "1", "source": source, "detail-type": detail_type,
               "account": "1", "time": "2026-12-01T00:00:00Z", "region": "us-east-1",
               "resources": [], "detail": {}})
    }

    #[test]
    fn rules_match_on_their_own_bus_only() {
        let rules = Rules::from_yaml(TEMPLATE).unwrap();
        assert_eq!(rules.all().len(), 3);
        assert_eq!(rules.functions_for(Bus::Custom, &ev("team", "X")), ["a-fn"]);
        assert!(
            rules
                .functions_for(Bus::Default, &ev("team", "X"))
                .is_empty()
        );
        assert!(
            rules
                .functions_for(Bus::Custom, &ev("capacity-pilot", "X"))
                .is_empty()
        );
        assert_eq!(
            rules.functions_for(Bus::Default, &ev("aws.ec2", "X")),
            ["a-fn"]
        );
        assert!(
            rules
                .functions_for(Bus::Default, &ev("aws.ec2", "Y"))
                .is_empty()
        );
        assert_eq!(rules.schedules(), [("a-fn", TimeDelta::minutes(5))]);
    }

    #[test]
    fn plain_rules_read_their_bus_pattern_and_target() {
        let rules = Rules::from_yaml(
            r#"
Resources:
  AFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: ../target/lambda/a-fn/
  ToFunction:
    Type: AWS::Events::Rule
    Properties:
      EventPattern: '{"source": ["aws.ec2"]}'
      Targets: [{Id: f, Arn: {"Fn::GetAtt": [AFunction, Arn]}}]
  Forward:
    Type: AWS::Events::Rule
    Properties:
      EventBusName: default
      EventPattern: {"source": ["aws.health"]}
      Targets:
        - Id: home
          Arn: {"Fn::Sub": "arn:${AWS::Partition}:events:${HomeRegion}:${AWS::AccountId}:event-bus/default"}
  Off:
    Type: AWS::Events::Rule
    Properties:
      State: DISABLED
      EventPattern: {"source": ["aws.ec2"]}
      Targets: [{Id: f, Arn: {"Fn::GetAtt": [AFunction, Arn]}}]
  Tick:
    Type: AWS::Events::Rule
    Properties:
      ScheduleExpression: rate(1 minute)
      Targets: [{Id: f, Arn: {"Fn::GetAtt": [AFunction, Arn]}}]
"#,
        )
        .unwrap();
        assert_eq!(rules.all().len(), 3, "the disabled rule is not loaded");
        let ec2 = ev("aws.ec2", "X");
        assert_eq!(rules.functions_for(Bus::Default, &ec2), ["a-fn"]);
        assert!(rules.forwarding(Bus::Default, &ec2).is_empty());
        let health = ev("aws.health", "X");
        assert!(rules.functions_for(Bus::Default, &health).is_empty());
        let fwd = rules.forwarding(Bus::Default, &health);
        assert_eq!(fwd.len(), 1);
        assert_eq!(fwd[0].logical_id, "Forward");
        assert!(rules.forwarding(Bus::Custom, &health).is_empty());
        assert_eq!(rules.schedules(), [("a-fn", TimeDelta::minutes(1))]);
        let bad = "Resources:\n  R:\n    Type: AWS::Events::Rule\n    Properties:\n      \
                   EventPattern: {\"source\": [\"x\"]}\n      Targets: [{Id: t, Arn: arn:aws:sqs:us-east-1:1:q}]\n";
        assert!(
            Rules::from_yaml(bad).is_err(),
            "an SQS target is not one the wiring knows"
        );
    }

    /// The forwarder (`infra/region-forwarder.yaml`, ARCHITECTURE §8.9) loads: its rules sit
    /// on the default bus, target the home region's default bus, and carry our AWS-event
    /// patterns (a Capacity Block Delivered event matches; a Scheduled Event does not).
    #[test]
    fn the_region_forwarders_rules_load_and_forward_our_aws_events_only() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../region-forwarder.yaml");
        let rules = Rules::from_template(&path).expect("the forwarder's rules");
        assert!(rules.all().len() >= 4, "{:?}", rules.all());
        for r in rules.all() {
            assert_eq!(r.bus, Bus::Default, "{}", r.logical_id);
            match &r.target {
                Target::EventBus(arn) => {
                    let arn = arn_text(arn).unwrap_or_default();
                    assert!(arn.ends_with(":event-bus/default"), "{arn}");
                    assert!(arn.contains("${HomeRegion}"), "{arn}");
                }
                other => panic!("{} targets {other:?}", r.logical_id),
            }
        }
        assert!(rules.schedules().is_empty());
        let mut delivered = ev("aws.ec2", "Capacity Block Delivered");
        delivered["region"] = json!("us-west-2");
        delivered["detail"] = json!({"capacity-reservation-id": "cr-0123456789abcdef0"});
        let fwd = rules.forwarding(Bus::Default, &delivered);
        assert_eq!(fwd.len(), 1, "{fwd:?}");
        assert_eq!(fwd[0].logical_id, "ForwardDelivered");
        let mut terminated = ev("aws.ec2", "EC2 Instance State-change Notification");
        terminated["detail"] = json!({"instance-id": "i-1", "state": "terminated"});
        assert_eq!(rules.forwarding(Bus::Default, &terminated).len(), 1);
        terminated["detail"]["state"] = json!("running");
        assert!(rules.forwarding(Bus::Default, &terminated).is_empty());
        let scheduled = ev("aws.events", "Scheduled Event");
        assert!(rules.forwarding(Bus::Default, &scheduled).is_empty());
        assert!(rules.matching(Bus::Default, &scheduled).is_empty());
    }

    /// The event log (ARCHITECTURE §9, issue 56): a plain rule on the custom bus whose target
    /// is a log group of the template writes our events there, and a replayed event (it
    /// carries `replay-name`) is not written again.
    #[test]
    fn a_rule_targeting_a_log_group_writes_our_events_there_but_not_replays() {
        let template = r#"
Resources:
  Bus:
    Type: AWS::Events::EventBus
  EventLog:
    Type: AWS::Logs::LogGroup
  EventLogRule:
    Type: AWS::Events::Rule
    Properties:
      EventBusName: {Ref: Bus}
      EventPattern: {"source": ["capacity-pilot"], "replay-name": [{"exists": false}]}
      Targets: [{Id: event-log, Arn: {"Fn::GetAtt": [EventLog, Arn]}}]
"#;
        let rules = Rules::from_yaml(template).unwrap();
        assert_eq!(rules.all().len(), 1);
        assert_eq!(rules.all()[0].target, Target::LogGroup("EventLog".into()));
        let ours = ev("capacity-pilot", "Capacity Reserved");
        assert_eq!(rules.log_groups_for(Bus::Custom, &ours), ["EventLog"]);
        assert!(rules.functions_for(Bus::Custom, &ours).is_empty());
        assert!(rules.forwarding(Bus::Custom, &ours).is_empty());
        assert!(rules.log_groups_for(Bus::Default, &ours).is_empty());
        assert!(
            rules
                .log_groups_for(Bus::Custom, &ev("team", "X"))
                .is_empty()
        );
        let mut replayed = ours.clone();
        replayed["replay-name"] = json!("replay-1");
        assert!(rules.log_groups_for(Bus::Custom, &replayed).is_empty());
        assert!(rules.schedules().is_empty());
        let by_name = template.replace(r#"{"Fn::GetAtt": [EventLog, Arn]}"#, "{Ref: EventLog}");
        let err = Rules::from_yaml(&by_name)
            .err()
            .expect("a log group's Ref is refused");
        assert!(err.to_string().contains("Fn::GetAtt"), "{err}");
    }

    #[test]
    fn rates_parse_as_eventbridge_writes_them() {
        assert_eq!(rate("rate(1 minute)"), Some(TimeDelta::minutes(1)));
        assert_eq!(rate("rate(5 minutes)"), Some(TimeDelta::minutes(5)));
        assert_eq!(rate("rate(2 hours)"), Some(TimeDelta::hours(2)));
        assert_eq!(rate("rate(1 minutes)"), None);
        assert_eq!(rate("rate(5 minute)"), None);
        assert_eq!(rate("cron(0 * * * ? *)"), None);
        assert_eq!(rate("rate(0 minutes)"), None);
    }
}
