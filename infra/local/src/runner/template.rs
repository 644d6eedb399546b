//! What the template says about each function, resolved to local values: its binary (from
//! `CodeUri`), its `Environment` (Globals merged with its own, `Ref`s resolved), memory and
//! timeout. The deployed configuration is the one that runs locally. And what the deployed
//! stack shows through CloudFormation: every parameter's value and the `Outputs`, evaluated.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail};
use serde_json::Value;

use crate::cloudformation::StackOutput;

/// One function as the template declares it.
#[derive(Debug, Clone)]
pub struct FunctionSpec {
    /// The crate and binary name, from `CodeUri`.
    pub name: String,
    pub logical_id: String,
    /// The template's `Environment.Variables`, resolved.
    pub env: BTreeMap<String, String>,
    pub memory_mb: u64,
    pub timeout_s: u64,
}

/// Local values for the template's `Ref`s: resources by logical id, parameters by name, the
/// stack's name and id (`AWS::StackName`, `AWS::StackId`; [`LOCAL_STACK_NAME`] and
/// [`LOCAL_STACK_ID`] when unset), and the region and account the stack is in (`AWS::Region`,
/// `AWS::AccountId`, and the ARNs `Fn::GetAtt [X, Arn]` answers).
#[derive(Debug, Clone, Default)]
pub struct Locals {
    pub resources: BTreeMap<String, String>,
    pub parameters: BTreeMap<String, String>,
    pub stack_name: Option<String>,
    pub stack_id: Option<String>,
    pub region: Option<String>,
    pub account_id: Option<String>,
}

/// Every `AWS::Serverless::Function` of the template, in the template's order.
pub fn functions(template: &Value, locals: &Locals) -> anyhow::Result<Vec<FunctionSpec>> {
    let globals = &template["Globals"]["Function"];
    let resources = template["Resources"]
        .as_object()
        .ok_or_else(|| anyhow!("the template has no Resources"))?;
    let mut out = Vec::new();
    for (logical_id, r) in resources {
        if r["Type"] != "AWS::Serverless::Function" {
            continue;
        }
        let p = &r["Properties"];
        let name = p["CodeUri"]
            .as_str()
            .and_then(|u| u.trim_end_matches('/').rsplit('/').next())
            .ok_or_else(|| anyhow!("{logical_id} has no CodeUri naming its binary"))?
            .to_string();
        let mut env = BTreeMap::new();
        for vars in [
            &globals["Environment"]["Variables"],
            &p["Environment"]["Variables"],
        ] {
            for (k, v) in vars.as_object().into_iter().flatten() {
                let value = resolve(template, locals, v)
                    .map_err(|e| anyhow!("{logical_id}: environment variable {k}: {e}"))?;
                match value {
                    Some(value) => env.insert(k.clone(), value),
                    // `AWS::NoValue`: the variable is not set at all
                    None => env.remove(k),
                };
            }
        }
        let number = |k: &str, default: u64| {
            p.get(k)
                .or_else(|| globals.get(k))
                .and_then(Value::as_u64)
                .unwrap_or(default)
        };
        out.push(FunctionSpec {
            name,
            logical_id: logical_id.clone(),
            env,
            memory_mb: number("MemorySize", 128),
            timeout_s: number("Timeout", 3),
        });
    }
    Ok(out)
}

/// The stack name `Ref: AWS::StackName` resolves to when run locally: `samconfig.toml`'s
/// `stack_name`, what `make deploy` deploys.
pub const LOCAL_STACK_NAME: &str = "capacity-pilot";

/// The UUID of the local stack's id (the functions' `DEPLOYMENT_ID` by default).
pub const LOCAL_STACK_UUID: &str = "0b6f3e40-0000-4000-8000-00000000c0de";

/// The stack id `Ref: AWS::StackId` resolves to when run locally (CloudFormation's form:
/// `arn:aws:cloudformation:<region>:<account>:stack/<name>/<uuid>`).
pub const LOCAL_STACK_ID: &str = "arn:aws:cloudformation:us-east-1:123456789012:stack/\
                                  capacity-pilot/0b6f3e40-0000-4000-8000-00000000c0de";

/// The local stack's id in `region` and `account`, named `name`.
pub fn local_stack_id(region: &str, account: &str, name: &str) -> String {
    format!("arn:aws:cloudformation:{region}:{account}:stack/{name}/{LOCAL_STACK_UUID}")
}

/// Every parameter of the template with its deployed value: the one given, else its
/// `Default`. As CloudFormation refuses a deployment that leaves a parameter without a value
/// ("Parameters: [..] must have values") or gives one the template does not declare
/// ("Parameters: [..] do not exist in the template"), so does this.
pub fn stack_parameters(
    template: &Value,
    given: &BTreeMap<String, String>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let declared = template["Parameters"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let unknown: Vec<&str> = given
        .keys()
        .filter(|k| !declared.contains_key(*k))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        bail!(
            "Parameters: [{}] do not exist in the template",
            unknown.join(", ")
        );
    }
    let mut out = BTreeMap::new();
    let mut missing = Vec::new();
    for (name, p) in &declared {
        let value = match (given.get(name), p.get("Default")) {
            (Some(v), _) => v.clone(),
            (None, Some(Value::String(d))) => d.clone(),
            (None, Some(Value::Number(n))) => n.to_string(),
            (None, Some(Value::Bool(b))) => b.to_string(),
            (None, Some(Value::Array(items))) => items
                .iter()
                .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(","),
            (None, _) => {
                missing.push(name.as_str());
                continue;
            }
        };
        out.insert(name.clone(), value);
    }
    if !missing.is_empty() {
        bail!("Parameters: [{}] must have values", missing.join(", "));
    }
    Ok(out)
}

/// The template's `Outputs`, evaluated with `locals`, by key; an output
/// whose `Condition` is false is not there (as in CloudFormation). Those that cannot be
/// evaluated locally (a resource the runner does not provide) come second, with the reason.
pub fn stack_outputs(
    template: &Value,
    locals: &Locals,
) -> (Vec<StackOutput>, Vec<(String, String)>) {
    let mut outputs = Vec::new();
    let mut skipped = Vec::new();
    for (key, o) in template["Outputs"].as_object().into_iter().flatten() {
        if let Some(name) = o.get("Condition").and_then(Value::as_str) {
            let holds = template["Conditions"]
                .get(name)
                .ok_or_else(|| anyhow!("no condition {name}"))
                .and_then(|c| condition(template, locals, c));
            match holds {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    skipped.push((key.clone(), e.to_string()));
                    continue;
                }
            }
        }
        match resolve(template, locals, &o["Value"]) {
            Ok(Some(value)) => outputs.push(StackOutput {
                key: key.clone(),
                value,
                description: o
                    .get("Description")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            }),
            Ok(None) => skipped.push((key.clone(), "its value is AWS::NoValue".into())),
            Err(e) => skipped.push((key.clone(), e.to_string())),
        }
    }
    (outputs, skipped)
}

/// `Fn::GetAtt [X, Arn]` of a resource the runner provides: its ARN in the locals' region and
/// account, by the resource's type.
fn get_att(template: &Value, locals: &Locals, args: &Value) -> anyhow::Result<String> {
    let (logical_id, attribute) = match args {
        Value::Array(a) if a.len() == 2 => (
            a[0].as_str().unwrap_or_default().to_string(),
            a[1].as_str().unwrap_or_default().to_string(),
        ),
        Value::String(s) => match s.split_once('.') {
            Some((l, a)) => (l.to_string(), a.to_string()),
            None => bail!("Fn::GetAtt takes [resource, attribute] or \"resource.attribute\""),
        },
        _ => bail!("Fn::GetAtt takes [resource, attribute]"),
    };
    let name = locals.resources.get(&logical_id).ok_or_else(|| {
        anyhow!("Fn::GetAtt of {logical_id}, which is not a resource the runner provides")
    })?;
    let (Some(region), Some(account)) = (&locals.region, &locals.account_id) else {
        bail!("Fn::GetAtt of {logical_id}.{attribute} needs the stack's region and account");
    };
    let kind = template["Resources"][&logical_id]["Type"]
        .as_str()
        .unwrap_or_default();
    let arn = match (kind, attribute.as_str()) {
        ("AWS::Events::EventBus", "Arn") => {
            format!("arn:aws:events:{region}:{account}:event-bus/{name}")
        }
        ("AWS::DynamoDB::Table", "Arn") => {
            format!("arn:aws:dynamodb:{region}:{account}:table/{name}")
        }
        ("AWS::SQS::Queue", "Arn") => format!("arn:aws:sqs:{region}:{account}:{name}"),
        ("AWS::SNS::Topic", "TopicArn") => format!("arn:aws:sns:{region}:{account}:{name}"),
        ("AWS::Serverless::Function" | "AWS::Lambda::Function", "Arn") => {
            format!("arn:aws:lambda:{region}:{account}:function:{name}")
        }
        _ => bail!("Fn::GetAtt {logical_id}.{attribute} ({kind}) is not one the runner evaluates"),
    };
    Ok(arn)
}

/// A literal; `{Ref: X}` with X a resource the runner provides, a parameter (the runner's
/// value, else its `Default`) or `AWS::NoValue` (`None`: unset); or `Fn::If` on one of the
/// template's `Conditions`; or `Fn::Select` of an index in a list (`Fn::Split` or a literal).
fn resolve(template: &Value, locals: &Locals, v: &Value) -> anyhow::Result<Option<String>> {
    match v {
        Value::String(s) => Ok(Some(s.clone())),
        Value::Number(n) => Ok(Some(n.to_string())),
        Value::Bool(b) => Ok(Some(b.to_string())),
        Value::Object(o) if o.len() == 1 && o.contains_key("Ref") => {
            let name = o["Ref"].as_str().unwrap_or_default();
            if name == "AWS::NoValue" {
                return Ok(None);
            }
            if name == "AWS::StackName" {
                return Ok(Some(
                    locals
                        .stack_name
                        .clone()
                        .unwrap_or_else(|| LOCAL_STACK_NAME.to_string()),
                ));
            }
            if name == "AWS::StackId" {
                return Ok(Some(
                    locals
                        .stack_id
                        .clone()
                        .unwrap_or_else(|| LOCAL_STACK_ID.to_string()),
                ));
            }
            let pseudo = match name {
                "AWS::Region" => locals.region.as_ref(),
                "AWS::AccountId" => locals.account_id.as_ref(),
                _ => None,
            };
            if let Some(v) = pseudo {
                return Ok(Some(v.clone()));
            }
            if let Some(r) = locals.resources.get(name) {
                return Ok(Some(r.clone()));
            }
            if let Some(p) = locals.parameters.get(name) {
                return Ok(Some(p.clone()));
            }
            match template["Parameters"][name].get("Default") {
                Some(d) => resolve(template, locals, d),
                None if template["Parameters"].get(name).is_some() => {
                    bail!("parameter {name} has no Default: give it in the scenario's `parameters`")
                }
                None => {
                    bail!("Ref {name} is neither a parameter nor a resource the runner provides")
                }
            }
        }
        Value::Object(o) if o.len() == 1 && o.contains_key("Fn::GetAtt") => {
            get_att(template, locals, &o["Fn::GetAtt"]).map(Some)
        }
        Value::Object(o) if o.len() == 1 && o.contains_key("Fn::If") => {
            let args = o["Fn::If"]
                .as_array()
                .filter(|a| a.len() == 3)
                .ok_or_else(|| {
                    anyhow!("Fn::If takes [condition, value if true, value if false]")
                })?;
            let name = args[0].as_str().unwrap_or_default();
            let cond = template["Conditions"].get(name).ok_or_else(|| {
                anyhow!("Fn::If names {name}, which is not one of the template's Conditions")
            })?;
            let branch = if condition(template, locals, cond)? {
                &args[1]
            } else {
                &args[2]
            };
            resolve(template, locals, branch)
        }
        Value::Object(o) if o.len() == 1 && o.contains_key("Fn::Select") => {
            let args = o["Fn::Select"]
                .as_array()
                .filter(|a| a.len() == 2)
                .ok_or_else(|| anyhow!("Fn::Select takes [index, list]"))?;
            let index = match &args[0] {
                Value::Number(n) => n.as_u64(),
                Value::String(s) => s.parse().ok(),
                _ => None,
            }
            .ok_or_else(|| anyhow!("Fn::Select's index {} is not a number", args[0]))?;
            let items = list(template, locals, &args[1])?;
            let n = items.len();
            let item = usize::try_from(index)
                .ok()
                .and_then(|i| items.into_iter().nth(i))
                .ok_or_else(|| anyhow!("Fn::Select's index {index} is past its {n} items"))?;
            Ok(Some(item))
        }
        Value::Object(o) if o.len() == 1 && o.contains_key("Fn::Join") => {
            let args = o["Fn::Join"]
                .as_array()
                .filter(|a| a.len() == 2)
                .ok_or_else(|| anyhow!("Fn::Join takes [delimiter, list]"))?;
            let delimiter = args[0]
                .as_str()
                .ok_or_else(|| anyhow!("Fn::Join's delimiter is not a string"))?;
            Ok(Some(list(template, locals, &args[1])?.join(delimiter)))
        }
        other => bail!(
            "{other} is not a value the local runner resolves (a literal, Ref, Fn::GetAtt, \
             Fn::If, Fn::Select or Fn::Join)"
        ),
    }
}

/// A list: `Fn::Split` of a value, or a literal list of values.
fn list(template: &Value, locals: &Locals, v: &Value) -> anyhow::Result<Vec<String>> {
    match v {
        Value::Object(o) if o.len() == 1 && o.contains_key("Fn::Split") => {
            let args = o["Fn::Split"]
                .as_array()
                .filter(|a| a.len() == 2)
                .ok_or_else(|| anyhow!("Fn::Split takes [delimiter, value]"))?;
            let delimiter = args[0]
                .as_str()
                .ok_or_else(|| anyhow!("Fn::Split's delimiter is not a string"))?;
            let value = resolve(template, locals, &args[1])?.unwrap_or_default();
            Ok(value.split(delimiter).map(str::to_string).collect())
        }
        Value::Array(items) => items
            .iter()
            .map(|i| resolve(template, locals, i).map(Option::unwrap_or_default))
            .collect(),
        // A CommaDelimitedList parameter: its value is the comma list.
        Value::Object(o) if o.len() == 1 && o.contains_key("Ref") => {
            Ok(match resolve(template, locals, v)? {
                Some(s) if !s.is_empty() => s.split(',').map(str::to_string).collect(),
                _ => vec![],
            })
        }
        other => bail!(
            "{other} is not a list the local runner resolves (Fn::Split, a list, or a Ref of a \
             comma list)"
        ),
    }
}

/// A condition: `Fn::Equals`, `Fn::Not`, `Fn::And`, `Fn::Or` or `Condition`.
fn condition(template: &Value, locals: &Locals, c: &Value) -> anyhow::Result<bool> {
    let o = c
        .as_object()
        .filter(|o| o.len() == 1)
        .ok_or_else(|| anyhow!("{c} is not a condition"))?;
    let (f, args) = o.iter().next().expect("one entry");
    let list = || {
        args.as_array()
            .ok_or_else(|| anyhow!("{f} takes a list, got {args}"))
    };
    match f.as_str() {
        "Fn::Equals" => {
            let a = list()?;
            anyhow::ensure!(a.len() == 2, "Fn::Equals takes two values");
            Ok(resolve(template, locals, &a[0])? == resolve(template, locals, &a[1])?)
        }
        "Fn::Not" => {
            let a = list()?;
            anyhow::ensure!(a.len() == 1, "Fn::Not takes one condition");
            Ok(!condition(template, locals, &a[0])?)
        }
        "Fn::And" => list()?
            .iter()
            .try_fold(true, |acc, x| Ok(acc && condition(template, locals, x)?)),
        "Fn::Or" => list()?
            .iter()
            .try_fold(false, |acc, x| Ok(acc || condition(template, locals, x)?)),
        "Condition" => {
            let name = args.as_str().unwrap_or_default();
            let c = template["Conditions"]
                .get(name)
                .ok_or_else(|| anyhow!("no condition {name}"))?;
            condition(template, locals, c)
        }
        other => bail!("{other} is not a condition function the local runner knows"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn globals_and_refs_resolve_to_local_values() {
        let t = json!({
            "Parameters": {"A": {"Type": "String", "Default": "x"}, "B": {"Type": "String"}},
            "Globals": {"Function": {"MemorySize": 256, "Timeout": 60,
                "Environment": {"Variables": {"TABLE": {"Ref": "T"}, "A": {"Ref": "A"}, "B": {"Ref": "B"}}}}},
            "Resources": {"F": {"Type": "AWS::Serverless::Function",
                "Properties": {"CodeUri": "../target/lambda/f-fn/", "Timeout": 120,
                    "Environment": {"Variables": {"N": 5,
                    "OPT": {"Fn::If": ["HasA", {"Ref": "A"}, {"Ref": "AWS::NoValue"}]},
                    "NOT": {"Fn::If": ["NoA", {"Ref": "A"}, {"Ref": "AWS::NoValue"}]}}}}}},
            "Conditions": {"HasA": {"Fn::Not": [{"Fn::Equals": [{"Ref": "A"}, ""]}]},
                           "NoA": {"Fn::Equals": [{"Ref": "A"}, ""]}}
        });
        let mut locals = Locals::default();
        locals.resources.insert("T".into(), "table-1".into());
        assert!(functions(&t, &locals).is_err(), "B has no default");
        locals.parameters.insert("B".into(), "y".into());
        let f = &functions(&t, &locals).unwrap()[0];
        assert_eq!(f.name, "f-fn");
        assert_eq!((f.memory_mb, f.timeout_s), (256, 120));
        assert_eq!(f.env["TABLE"], "table-1");
        assert_eq!(f.env["A"], "x");
        assert_eq!(f.env["B"], "y");
        assert_eq!(f.env["N"], "5");
        assert_eq!(f.env["OPT"], "x");
        assert!(!f.env.contains_key("NOT"), "AWS::NoValue leaves it unset");
    }

    #[test]
    fn the_stack_ids_uuid_is_selected_from_its_split() {
        let t = json!({
            "Globals": {"Function": {"Environment": {"Variables": {
                "ID": {"Fn::Select": [2, {"Fn::Split": ["/", {"Ref": "AWS::StackId"}]}]},
                "NAME": {"Fn::Select": ["1", ["a", {"Ref": "AWS::StackName"}]]},
                "PAST": {"Fn::Select": [3, {"Fn::Split": ["/", {"Ref": "AWS::StackId"}]}]}}}}},
            "Resources": {"F": {"Type": "AWS::Serverless::Function",
                "Properties": {"CodeUri": "../target/lambda/f-fn/"}}}
        });
        let err = functions(&t, &Locals::default()).unwrap_err().to_string();
        assert!(err.contains("index 3 is past its 3 items"), "{err}");
        let mut t = t;
        t["Globals"]["Function"]["Environment"]["Variables"]
            .as_object_mut()
            .unwrap()
            .remove("PAST");
        let f = &functions(&t, &Locals::default()).unwrap()[0];
        assert_eq!(f.env["ID"], "0b6f3e40-0000-4000-8000-00000000c0de");
        assert_eq!(f.env["NAME"], LOCAL_STACK_NAME);
    }

    #[test]
    fn the_stacks_parameters_are_the_given_values_or_the_defaults_as_cloudformation_checks() {
        // GIVEN a template with a required parameter and defaults of every kind
        let t = json!({"Parameters": {
            "Req": {"Type": "String"},
            "Text": {"Type": "String", "Default": "a,b"},
            "Count": {"Type": "Number", "Default": 15},
            "Empty": {"Type": "String", "Default": ""},
            "List": {"Type": "CommaDelimitedList", "Default": ["x", "y"]}}});
        let given = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        // WHEN the stack's parameters are taken with and without the required one, and with
        // one the template lacks
        let ok = stack_parameters(&t, &given(&[("Req", "r"), ("Count", "7")])).unwrap();
        let missing = stack_parameters(&t, &given(&[])).unwrap_err().to_string();
        let unknown = stack_parameters(&t, &given(&[("Req", "r"), ("Nope", "1")]))
            .unwrap_err()
            .to_string();
        // THEN every parameter has its value, and CloudFormation's refusals are kept
        assert_eq!(
            ok,
            given(&[
                ("Req", "r"),
                ("Text", "a,b"),
                ("Count", "7"),
                ("Empty", ""),
                ("List", "x,y")
            ])
        );
        assert_eq!(missing, "Parameters: [Req] must have values");
        assert_eq!(unknown, "Parameters: [Nope] do not exist in the template");
    }

    #[test]
    fn the_stacks_outputs_are_evaluated_with_the_local_names_and_arns() {
        // GIVEN a template's outputs: Refs and Arns of the bus and the table, an output of a
        // resource the runner does not provide, and one whose condition is false
        let t = json!({
            "Parameters": {"Flag": {"Type": "String", "Default": ""}},
            "Conditions": {"HasFlag": {"Fn::Not": [{"Fn::Equals": [{"Ref": "Flag"}, ""]}]}},
            "Resources": {
                "Bus": {"Type": "AWS::Events::EventBus"},
                "StateTable": {"Type": "AWS::DynamoDB::Table"},
                "AlarmTopic": {"Type": "AWS::SNS::Topic"}},
            "Outputs": {
                "BusName": {"Description": "the bus", "Value": {"Ref": "Bus"}},
                "BusArn": {"Value": {"Fn::GetAtt": ["Bus", "Arn"]}},
                "StateTableName": {"Value": {"Ref": "StateTable"}},
                "StateTableArn": {"Value": {"Fn::GetAtt": "StateTable.Arn"}},
                "Stack": {"Value": {"Ref": "AWS::StackName"}},
                "AlarmTopicArn": {"Value": {"Ref": "AlarmTopic"}},
                "Flagged": {"Condition": "HasFlag", "Value": "x"}}});
        let mut locals = Locals {
            region: Some("us-west-2".into()),
            account_id: Some("123456789012".into()),
            stack_name: Some("capacity-pilot".into()),
            ..Locals::default()
        };
        locals
            .resources
            .insert("Bus".into(), "capacity-pilot".into());
        locals
            .resources
            .insert("StateTable".into(), "capacity-pilot-state".into());
        // WHEN they are evaluated
        let (outputs, skipped) = stack_outputs(&t, &locals);
        // THEN each has its local value, the topic is skipped saying why, the flagged one is
        // not there
        let got: BTreeMap<&str, &str> = outputs
            .iter()
            .map(|o| (o.key.as_str(), o.value.as_str()))
            .collect();
        assert_eq!(
            got,
            BTreeMap::from([
                ("BusName", "capacity-pilot"),
                (
                    "BusArn",
                    "arn:aws:events:us-west-2:123456789012:event-bus/capacity-pilot"
                ),
                ("StateTableName", "capacity-pilot-state"),
                (
                    "StateTableArn",
                    "arn:aws:dynamodb:us-west-2:123456789012:table/capacity-pilot-state"
                ),
                ("Stack", "capacity-pilot"),
            ])
        );
        let bus = outputs.iter().find(|o| o.key == "BusName").unwrap();
        assert_eq!(bus.description.as_deref(), Some("the bus"));
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert_eq!(skipped[0].0, "AlarmTopicArn");
        assert!(skipped[0].1.contains("AlarmTopic"), "{skipped:?}");
    }
}
