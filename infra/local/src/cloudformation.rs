//! CloudFormation `DescribeStacks` (awsQuery: a form body, XML answers in the
//! `http://cloudformation.amazonaws.com/doc/2010-05-15/` namespace) over the stacks registered
//! per region, through [`World::put_stack`] or `POST /_local/stacks/{region}`: what a deployed
//! stack shows its callers (parameters, outputs, tags), not how it was deployed. A stack is
//! `CREATE_COMPLETE` from its registration (`UPDATE_COMPLETE` once registered again).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::query::Query;
use crate::util::ec2_time;
use crate::world::World;
use crate::xml::{El, el, members};

/// The namespace of CloudFormation's answers.
pub const XMLNS: &str = "http://cloudformation.amazonaws.com/doc/2010-05-15/";

/// A stack as its deployment left it: what DescribeStacks shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stack {
    /// `[a-zA-Z][-a-zA-Z0-9]*`, at most 128 characters.
    pub name: String,
    /// The template's `Description`.
    #[serde(default)]
    pub description: Option<String>,
    /// Every parameter's value, by key.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// The template's outputs, evaluated, in the order DescribeStacks lists them.
    #[serde(default)]
    pub outputs: Vec<StackOutput>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// The stack id CloudFormation gave it
    /// (`arn:aws:cloudformation:<region>:<account>:stack/<name>/<uuid>`), when the caller
    /// knows it already (the runner's functions see it as `AWS::StackId`); else a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// One of a stack's `Outputs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StackOutput {
    pub key: String,
    pub value: String,
    #[serde(default)]
    pub description: Option<String>,
}

/// A registered stack with what CloudFormation adds to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeployedStack {
    #[serde(flatten)]
    pub stack: Stack,
    pub region: String,
    /// `arn:aws:cloudformation:<region>:<account>:stack/<name>/<uuid>`.
    pub id: String,
    /// `CREATE_COMPLETE`, or `UPDATE_COMPLETE` once registered again.
    pub status: String,
    pub created: DateTime<Utc>,
    pub updated: Option<DateTime<Utc>>,
}

/// CloudFormation's stack name rule: `[a-zA-Z][-a-zA-Z0-9]*`, 1-128 characters.
fn valid_stack_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 128
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-')
}

impl World {
    /// Registers (or replaces) a stack in `region`, as a deployment would leave it, and returns
    /// its id. A stack registered again keeps its id and creation time and reads
    /// `UPDATE_COMPLETE`.
    pub fn put_stack(&mut self, region: &str, mut stack: Stack) -> Result<String, ApiError> {
        let given_id = stack.id.take();
        if let Some(id) = &given_id {
            let prefix = format!("arn:aws:cloudformation:{region}:");
            let resource = format!(":stack/{}/", stack.name);
            if !id.starts_with(&prefix) || !id.contains(&resource) {
                return Err(ApiError::new(
                    400,
                    "BadRequest",
                    format!(
                        "a stack id in {region} reads {prefix}<account>{resource}<uuid>, not {id}"
                    ),
                ));
            }
        }
        if !valid_stack_name(&stack.name) {
            return Err(ApiError::new(
                400,
                "ValidationError",
                format!(
                    "1 validation error detected: Value '{}' at 'stackName' failed to satisfy \
                     constraint: Member must satisfy regular expression pattern: \
                     [a-zA-Z][-a-zA-Z0-9]*",
                    stack.name
                ),
            ));
        }
        let key = (region.to_string(), stack.name.clone());
        let now = self.now;
        if let Some(d) = self.stacks.get_mut(&key) {
            d.stack = stack;
            d.status = "UPDATE_COMPLETE".to_string();
            d.updated = Some(now);
            return Ok(d.id.clone());
        }
        let id = match given_id {
            Some(id) => id,
            None => {
                let uuid = self.next_uuid("stack");
                self.arn(
                    "cloudformation",
                    region,
                    &format!("stack/{}/{uuid}", stack.name),
                )
            }
        };
        self.stacks.insert(
            key,
            DeployedStack {
                stack,
                region: region.to_string(),
                id: id.clone(),
                status: "CREATE_COMPLETE".to_string(),
                created: now,
                updated: None,
            },
        );
        Ok(id)
    }

    /// The stacks registered in `region`, by name.
    pub fn stacks_in(&self, region: &str) -> Vec<&DeployedStack> {
        self.stacks
            .iter()
            .filter(|((r, _), _)| r == region)
            .map(|(_, s)| s)
            .collect()
    }

    /// Every registered stack, for the snapshot.
    pub fn stacks_snapshot(&self) -> Value {
        json!(self.stacks.values().collect::<Vec<_>>())
    }

    /// Routes one CloudFormation operation: the children of its `<{op}Result>`.
    pub fn cloudformation_call(
        &mut self,
        region: &str,
        op: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        self.settle();
        match op {
            "DescribeStacks" => self.describe_stacks(region, q),
            other => Err(invalid_action(other, q)),
        }
    }

    /// DescribeStacks: the stack named by `StackName` (its name or its id), or every stack of
    /// the region; an unknown one is a `ValidationError` "Stack with id <name> does not exist".
    fn describe_stacks(&self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        let stacks: Vec<&DeployedStack> = match q.get("StackName") {
            Some(name) => {
                let found = self
                    .stacks_in(region)
                    .into_iter()
                    .find(|s| s.stack.name == name || s.id == name);
                match found {
                    Some(s) => vec![s],
                    None => {
                        return Err(ApiError::new(
                            400,
                            "ValidationError",
                            format!("Stack with id {name} does not exist"),
                        ));
                    }
                }
            }
            None => self.stacks_in(region),
        };
        Ok(vec![members("Stacks", stacks.into_iter().map(stack_el))])
    }
}

fn stack_el(s: &DeployedStack) -> El {
    let mut m = el("member")
        .v("StackId", &s.id)
        .v("StackName", &s.stack.name)
        .opt("Description", s.stack.description.as_ref());
    if !s.stack.parameters.is_empty() {
        m = m.members(
            "Parameters",
            s.stack
                .parameters
                .iter()
                .map(|(k, v)| el("member").v("ParameterKey", k).v("ParameterValue", v)),
        );
    }
    m = m
        .v("CreationTime", ec2_time(s.created))
        .opt("LastUpdatedTime", s.updated.map(ec2_time))
        .v("StackStatus", &s.status)
        .v("DisableRollback", false)
        .child(el("NotificationARNs"));
    if !s.stack.outputs.is_empty() {
        m = m.members(
            "Outputs",
            s.stack.outputs.iter().map(|o| {
                el("member")
                    .v("OutputKey", &o.key)
                    .v("OutputValue", &o.value)
                    .opt("Description", o.description.as_ref())
            }),
        );
    }
    m.members(
        "Tags",
        s.stack
            .tags
            .iter()
            .map(|(k, v)| el("member").v("Key", k).v("Value", v)),
    )
    .v("EnableTerminationProtection", false)
    .child(el("DriftInformation").v("StackDriftStatus", "NOT_CHECKED"))
}

/// An awsQuery service's answer to an action it does not have.
pub fn invalid_action(op: &str, q: &Query) -> ApiError {
    ApiError::new(
        400,
        "InvalidAction",
        format!(
            "Could not find operation {op} for version {}",
            q.get("Version").unwrap_or("NO_VERSION_SPECIFIED")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::Settings;

    fn world() -> World {
        World::new(
            1,
            "2026-09-01T08:00:00Z".parse().expect("time"),
            Settings::default(),
        )
    }

    #[test]
    fn a_stack_registered_again_keeps_its_id_and_reads_updated() {
        // GIVEN a stack registered in us-east-1
        let mut w = world();
        let stack = Stack {
            name: "capacity-pilot".into(),
            ..Stack::default()
        };
        let id = w.put_stack("us-east-1", stack.clone()).expect("valid");
        assert!(
            id.starts_with("arn:aws:cloudformation:us-east-1:123456789012:stack/capacity-pilot/"),
            "{id}"
        );
        // WHEN it is registered again, and under a name CloudFormation refuses
        let again = w.put_stack("us-east-1", stack).expect("valid");
        let bad = w.put_stack(
            "us-east-1",
            Stack {
                name: "1-not_valid".into(),
                ..Stack::default()
            },
        );
        // THEN it keeps its id and is UPDATE_COMPLETE; the bad name is a ValidationError
        assert_eq!(again, id);
        assert_eq!(w.stacks_in("us-east-1")[0].status, "UPDATE_COMPLETE");
        assert!(w.stacks_in("us-west-2").is_empty(), "stacks are regional");
        assert_eq!(bad.unwrap_err().code, "ValidationError");
    }

    #[test]
    fn a_stack_can_be_registered_under_the_id_its_deployment_gave_it() {
        // GIVEN the id a deployment gave a stack, and one of another region
        let mut w = world();
        let id = "arn:aws:cloudformation:us-west-2:123456789012:stack/cp/0b6f3e40-0000-4000-8000-00000000c0de";
        let stack = |id: &str| Stack {
            name: "cp".into(),
            id: Some(id.into()),
            ..Stack::default()
        };
        // WHEN each is registered in us-west-2
        let kept = w.put_stack("us-west-2", stack(id));
        let wrong = w.put_stack("us-west-2", stack(&id.replace("us-west-2", "us-east-1")));
        // THEN the first keeps it, the second is refused
        assert_eq!(kept.as_deref(), Ok(id));
        assert_eq!(w.stacks_in("us-west-2")[0].id, id);
        assert_eq!(wrong.unwrap_err().code, "BadRequest");
    }
}
