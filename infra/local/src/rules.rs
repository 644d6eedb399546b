//! The EventBridge wiring of `infra/template.yaml`, read from the template itself (there is no
//! second copy): each function's `EventBridgeRule` events (pattern and bus) and `Schedule`
//! events (rate), with the patterns matched by `quamina` as EventBridge matches them.
//!
//! The flow tests route the buses' events with it, and the local runner delivers events and
//! fires schedules with it.

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

/// One event source of one function.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The function's crate (and binary) name, from its `CodeUri`.
    pub function: String,
    /// The function's logical id in the template.
    pub logical_id: String,
    /// The event's name under the function's `Events`.
    pub name: String,
    pub bus: Bus,
    pub trigger: Trigger,
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
        let mut rules = Vec::new();
        for (logical_id, resource) in resources {
            if resource["Type"] != "AWS::Serverless::Function" {
                continue;
            }
            let props = &resource["Properties"];
            let function = props["CodeUri"]
                .as_str()
                .and_then(|uri| uri.trim_end_matches('/').rsplit('/').next())
                .ok_or_else(|| {
                    RulesError::Template(format!("{logical_id} has no CodeUri naming its binary"))
                })?
                .to_string();
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
            .map(|r| r.function.clone())
            .collect();
        fs.sort();
        fs.dedup();
        fs
    }

    /// Each schedule: the function it invokes and how often.
    pub fn schedules(&self) -> Vec<(&str, TimeDelta)> {
        self.rules
            .iter()
            .filter_map(|r| match r.trigger {
                Trigger::Every(every) => Some((r.function.as_str(), every)),
                Trigger::Pattern(_) => None,
            })
            .collect()
    }
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
