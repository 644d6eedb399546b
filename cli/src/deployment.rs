//! Where the deployment is: the SDK configuration from the AWS CLI's own chain (profile,
//! region, endpoint, `AWS_ENDPOINT_URL*`), then the stack's outputs and parameters through
//! CloudFormation `DescribeStacks`, or `--bus` and `--table` given outright.

use std::collections::BTreeMap;

use aws_config::{Region, SdkConfig};
use aws_sdk_cloudformation::error::ProvideErrorMetadata;
use capacity_pilot::aws::clock::ConfiguredClock;
use capacity_pilot::aws::dynamodb::DynamoStore;
use capacity_pilot::config::Config;
use capacity_pilot::ports::Clock;
use chrono::{DateTime, Utc};

use crate::Global;
use crate::fail::{Fail, Result};

/// The template's function environment (`infra/template.yaml`, `Globals.Function.
/// Environment`) as the stack's parameters give it: each variable and the parameter it is
/// `Ref`'d (or, when set, `Fn::If`'d) from. A test reads the template and holds this to it.
pub const FROM_PARAMETERS: [(&str, &str); 17] = [
    ("ALLOWED_REGIONS", "AllowedRegions"),
    ("ALLOWED_REQUEST_SOURCES", "AllowedRequestSources"),
    ("APPROVER_SOURCES", "ApproverSources"),
    ("TEAM_BUDGETS_USD", "TeamBudgetsUsd"),
    ("APPROVE_ABOVE_USD", "ApproveAboveUsd"),
    ("PURCHASE_MODE", "PurchaseMode"),
    ("TEAM_SOURCES", "TeamSources"),
    ("DEFAULT_DRAIN_MINUTES", "DefaultDrainMinutes"),
    ("HOLD_APPROVAL_MINUTES", "HoldApprovalMinutes"),
    (
        "EXTENSION_PAYMENT_LEAD_MINUTES",
        "ExtensionPaymentLeadMinutes",
    ),
    (
        "MAX_REPLACEMENTS_PER_RESERVATION",
        "MaxReplacementsPerReservation",
    ),
    ("MAX_UNHEALTHY_SHARE", "MaxUnhealthyShare"),
    ("MAX_BLOCK_INSTANCES", "MaxBlockInstances"),
    ("SAGEMAKER_EXECUTION_ROLE_ARN", "SageMakerExecutionRoleArn"),
    ("HYPERPOD_ROLE_ARNS", "HyperPodRoleArns"),
    ("SUPPORTED_INSTANCE_TYPES", "SupportedInstanceTypes"),
    ("ON_DEMAND_PRICES_USD", "OnDemandPricesUsd"),
];

/// The SDK configuration every client of a command is built from: the functions' loader
/// (one TLS stack), with the AWS CLI's flags on top of the standard chain.
pub async fn sdk(g: &Global) -> Result<SdkConfig> {
    let mut loader = capacity_pilot::aws::wiring::sdk_loader();
    if let Some(p) = &g.profile {
        loader = loader.profile_name(p);
    }
    if let Some(r) = &g.region {
        loader = loader.region(Region::new(r.clone()));
    }
    if let Some(u) = &g.endpoint_url {
        loader = loader.endpoint_url(u);
    }
    let sdk = loader.load().await;
    if sdk.region().is_none() {
        return Err(Fail::Usage(
            "no AWS region: pass --region, set AWS_REGION, or give your profile a region".into(),
        ));
    }
    Ok(sdk)
}

/// The deployment a command talks to.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// The stack it was read from; `None` with `--bus` and `--table`.
    pub stack: Option<String>,
    pub region: String,
    pub bus: String,
    pub table: String,
    /// The stack's parameters (empty without a stack).
    pub parameters: BTreeMap<String, String>,
    /// The functions' configuration as the stack's parameters give it; `None` without a
    /// stack (the commands then use built-in defaults, and say so).
    pub config: Option<Config>,
}

impl Deployment {
    /// Reads the deployment: `--bus` and `--table` when both are given, else the stack.
    pub async fn resolve(g: &Global, sdk: &SdkConfig) -> Result<Deployment> {
        let region = sdk.region().map(|r| r.to_string()).unwrap_or_default();
        if let (Some(bus), Some(table)) = (&g.bus, &g.table) {
            return Ok(Deployment {
                stack: None,
                region,
                bus: bus.clone(),
                table: table.clone(),
                parameters: BTreeMap::new(),
                config: None,
            });
        }
        let cfn = aws_sdk_cloudformation::Client::new(sdk);
        let out = cfn
            .describe_stacks()
            .stack_name(&g.stack)
            .send()
            .await
            .map_err(|e| {
                let code = e.code().unwrap_or_default().to_string();
                let message = e.message().unwrap_or_default().to_string();
                if code == "ValidationError" && message.contains("does not exist") {
                    Fail::NotFound(format!(
                        "no stack named {:?} in {region}: pass --stack NAME (the name you gave \
                         `make deploy`), --region, or --bus and --table",
                        g.stack
                    ))
                } else if code.contains("AccessDenied") {
                    Fail::Refused(format!(
                        "not allowed to describe the stack {:?}: {message}\n  use a role with \
                         cloudformation:DescribeStacks, or pass --bus and --table",
                        g.stack
                    ))
                } else {
                    Fail::Aws(format!(
                        "reading the stack {:?} failed: {}\n  check your credentials and region",
                        g.stack,
                        if message.is_empty() {
                            format!("{e:?}")
                        } else {
                            format!("{code}: {message}")
                        }
                    ))
                }
            })?;
        let stack = out
            .stacks()
            .first()
            .ok_or_else(|| Fail::NotFound(format!("no stack named {:?} in {region}", g.stack)))?;
        let outputs: BTreeMap<String, String> = stack
            .outputs()
            .iter()
            .filter_map(|o| Some((o.output_key()?.to_string(), o.output_value()?.to_string())))
            .collect();
        let parameters: BTreeMap<String, String> = stack
            .parameters()
            .iter()
            .filter_map(|p| {
                Some((
                    p.parameter_key()?.to_string(),
                    p.parameter_value().unwrap_or_default().to_string(),
                ))
            })
            .collect();
        let output = |key: &str| {
            outputs.get(key).cloned().ok_or_else(|| {
                Fail::NotFound(format!(
                    "the stack {:?} has no output {key}: is it a capacity-pilot stack? Pass \
                     --stack NAME, or --bus and --table",
                    g.stack
                ))
            })
        };
        let bus = match &g.bus {
            Some(b) => b.clone(),
            None => output("BusName")?,
        };
        let table = match &g.table {
            Some(t) => t.clone(),
            None => output("StateTableName")?,
        };
        let stack_id = stack.stack_id().unwrap_or_default().to_string();
        let config = config_of(&parameters, &bus, &table, &stack_id).ok();
        Ok(Deployment {
            stack: Some(g.stack.clone()),
            region,
            bus,
            table,
            parameters,
            config,
        })
    }

    /// A stack parameter's value, `None` when unset or empty.
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    /// The first source of a comma-list parameter, the default `--source` of a command.
    pub fn first_source(&self, parameter: &str) -> Option<String> {
        self.parameter(parameter)?
            .split(',')
            .map(str::trim)
            .find(|s| !s.is_empty())
            .map(str::to_string)
    }

    /// Where the deployment's settings come from, as a command says it.
    pub fn settings_from(&self) -> String {
        match (&self.stack, &self.config) {
            (Some(s), Some(_)) => format!("the stack {s}'s parameters"),
            (Some(s), None) => {
                format!("built-in defaults (the stack {s}'s parameters do not read)")
            }
            (None, _) => "built-in defaults (no stack)".into(),
        }
    }

    pub fn store(&self, sdk: &SdkConfig) -> DynamoStore {
        DynamoStore::new(aws_sdk_dynamodb::Client::new(sdk), &self.table)
    }
}

/// The functions' [`Config`] from the stack's parameters, read by the functions' own reader.
pub fn config_of(
    parameters: &BTreeMap<String, String>,
    bus: &str,
    table: &str,
    stack_id: &str,
) -> std::result::Result<Config, capacity_pilot::config::ConfigError> {
    let parameter = |name: &str| {
        parameters
            .get(name)
            .filter(|v| !v.trim().is_empty())
            .cloned()
    };
    Config::from_lookup(&|var| match var {
        "TABLE_NAME" => Some(table.to_string()),
        "EVENT_BUS_NAME" => Some(bus.to_string()),
        "APPROVALS_ENABLED" => Some(parameter("ApproverPrincipals").is_some().to_string()),
        // Empty means no notices of that kind, as the functions read it.
        "NOTICE_OPENING_LEADS_MINUTES" => parameters.get("NoticeOpeningLeadsMinutes").cloned(),
        "NOTICE_ENDING_LEADS_MINUTES" => parameters.get("NoticeEndingLeadsMinutes").cloned(),
        "DEPLOYMENT_ID" => {
            parameter("DeploymentId").or_else(|| stack_id.split('/').nth(2).map(str::to_string))
        }
        _ => FROM_PARAMETERS
            .iter()
            .find(|(v, _)| *v == var)
            .and_then(|(_, p)| parameter(p)),
    })
}

/// The time: the simulated clock the functions read when `CAPACITY_PILOT_CLOCK_URL` is set
/// (offline runs), else the system's.
pub async fn now() -> Result<DateTime<Utc>> {
    let url = std::env::var("CAPACITY_PILOT_CLOCK_URL").ok();
    let clock = ConfiguredClock::from_url(url.as_deref())
        .map_err(|e| Fail::Usage(format!("CAPACITY_PILOT_CLOCK_URL: {e}")))?;
    clock
        .now()
        .await
        .map_err(|e| Fail::Aws(format!("reading the clock failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// `Globals.Function.Environment.Variables` of `infra/template.yaml`.
    fn template_environment() -> serde_json::Map<String, Value> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/template.yaml");
        let text = std::fs::read_to_string(path).expect("the template");
        let t: Value = serde_yaml_ng::from_str(&text).expect("the template parses");
        t["Globals"]["Function"]["Environment"]["Variables"]
            .as_object()
            .expect("the functions' environment")
            .clone()
    }

    /// The parameter a variable is `Ref`'d from, or `Fn::If`'d from when its condition holds.
    fn parameter_of(v: &Value) -> Option<String> {
        if let Some(r) = v.get("Ref").and_then(Value::as_str) {
            return Some(r.to_string());
        }
        let branch = v.get("Fn::If")?.get(1)?;
        branch
            .get("Ref")
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    #[test]
    fn the_configuration_read_from_a_stack_maps_each_variable_as_the_template_does() {
        // GIVEN the template's function environment
        let env = template_environment();
        // THEN each variable the CLI reads from a parameter is the template's, from that one
        for (var, parameter) in FROM_PARAMETERS {
            assert_eq!(
                env.get(var).and_then(parameter_of).as_deref(),
                Some(parameter),
                "{var}"
            );
        }
        // ... and every variable the template sets from a parameter is read (or derived)
        let derived = [
            "TABLE_NAME",
            "EVENT_BUS_NAME",
            "APPROVALS_ENABLED",
            "DEPLOYMENT_ID",
            "UNPINNED_DEPLOYMENT_ID",
            // the CLI publishes no notice
            "NOTICES_TOPIC_ARN",
            "NOTICE_OPENING_LEADS_MINUTES",
            "NOTICE_ENDING_LEADS_MINUTES",
        ];
        for (var, v) in &env {
            if derived.contains(&var.as_str()) {
                continue;
            }
            assert!(
                FROM_PARAMETERS.iter().any(|(x, _)| x == var),
                "{var} ({v}) is set by the template but not read from the stack"
            );
        }
    }

    #[test]
    fn a_stacks_parameters_give_the_functions_configuration() {
        // GIVEN a stack's parameters, some empty as CloudFormation shows unset ones
        let parameters: BTreeMap<String, String> = [
            ("AllowedRegions", "us-east-1,us-west-2"),
            ("AllowedRequestSources", "com.example.ml"),
            ("ApproverSources", "com.example.approvals"),
            ("TeamBudgetsUsd", r#"{"team-a": "5000"}"#),
            (
                "SageMakerExecutionRoleArn",
                "arn:aws:iam::123456789012:role/sm",
            ),
            ("ApproverPrincipals", ""),
            ("ApproveAboveUsd", "1000"),
            ("DeploymentId", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        // WHEN the functions' reader reads them
        let c = config_of(
            &parameters,
            "bus-1",
            "table-1",
            "arn:aws:cloudformation:us-east-1:123456789012:stack/cp/0f1e2d3c-aaaa",
        )
        .expect("a configuration");
        // THEN it is what the deployed functions read
        assert_eq!(c.allowed_regions, ["us-east-1", "us-west-2"]);
        assert_eq!(
            (c.table_name.as_str(), c.event_bus_name.as_str()),
            ("table-1", "bus-1")
        );
        assert!(!c.approvals_enabled, "no ApproverPrincipals");
        assert_eq!(
            c.approve_above.map(|u| u.to_string()).as_deref(),
            Some("1000.00")
        );
        assert_eq!(
            c.deployment_id, "0f1e2d3c-aaaa",
            "the stack id's UUID part, as the template derives it"
        );
    }
}
