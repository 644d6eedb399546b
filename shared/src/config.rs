//! Typed configuration, read once at cold start from the environment variables the SAM
//! template sets (ARCHITECTURE section 7). Every missing or malformed variable is named.

use std::collections::BTreeMap;
use std::fmt;

use rust_decimal::Decimal;

use crate::domain::catalog::{PriceTable, SupportedInstanceTypes};
use crate::domain::money::Usd;
use crate::domain::request::{FieldError, Team, is_region_name};

/// Each team's monthly cap; `*` is the default for teams not listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamBudgets {
    pub caps: BTreeMap<String, Usd>,
    pub default: Option<Usd>,
}

impl TeamBudgets {
    /// The team's monthly cap; `None` means the team may not spend at all.
    pub fn cap_for(&self, team: &Team) -> Option<Usd> {
        self.caps
            .get(team.ledger().as_str())
            .copied()
            .or(self.default)
    }

    /// Why a request of `team` is rejected at submission: the team may not spend (no cap
    /// names it and there is no `*` default; `TeamBudgetsUsd` defaults to `{}`, so nothing
    /// is spent until an operator says who may). `None` when it has a cap.
    pub fn submission_problem(&self, team: &Team) -> Option<FieldError> {
        if self.cap_for(team).is_some() {
            return None;
        }
        Some(FieldError {
            field: "team".into(),
            message: format!(
                "{team:?} may not spend: the stack's TeamBudgetsUsd parameter \
                 (TEAM_BUDGETS_USD) gives it no monthly cap and has no \"*\" default; an \
                 operator adds one (team names are matched ignoring case)"
            ),
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub table_name: String,
    pub event_bus_name: String,
    /// The notices topic (`NOTICES_TOPIC_ARN`, ARCHITECTURE §9.2): the functions require it
    /// ([`crate::aws::wiring::Adapters`]); the CLI reads configuration without it.
    pub notices_topic_arn: Option<String>,
    /// The leads of the lead-time notices (`NOTICE_OPENING_LEADS_MINUTES`,
    /// `NOTICE_ENDING_LEADS_MINUTES`, comma-separated minutes; 1440,60 and 1440,780,60 by
    /// default).
    pub notice_leads: crate::domain::notices::Leads,
    pub allowed_regions: Vec<String>,
    pub allowed_request_sources: Vec<String>,
    pub approver_sources: Vec<String>,
    pub team_budgets: TeamBudgets,
    pub default_drain_minutes: u32,
    pub max_replacements_per_reservation: u32,
    /// 0 < share <= 1: above it, replace-unhealthy stops and alarms instead.
    pub max_unhealthy_share: Decimal,
    pub sagemaker_execution_role_arn: String,
    /// This stack's identity (ARCHITECTURE §8.7 and §9.8, `DEPLOYMENT_ID`: the UUID part of
    /// the stack's id unless the `DeploymentId` parameter says otherwise; pinned in the
    /// table): the `capacity-pilot:deployment` tag on all we create, and a hash in training
    /// plan names, so that two stacks given the same request id never adopt each other's
    /// reservations.
    pub deployment_id: String,
    /// The id a table written before ids were pinned was used under (`UNPINNED_DEPLOYMENT_ID`:
    /// the `DeploymentId` parameter, or the stack name when it is empty, as the template set
    /// `DEPLOYMENT_ID` before; `DEPLOYMENT_ID` when unset). Such a table is pinned to it at
    /// the first cold start, and a `DEPLOYMENT_ID` that differs is refused.
    pub unpinned_deployment_id: String,
    pub instance_types: SupportedInstanceTypes,
    pub prices: PriceTable,
    /// Local runs only: the simulated clock's URL.
    pub clock_url: Option<String>,
    /// The deployment's approval threshold (`APPROVE_ABOVE_USD`, the `ApproveAboveUsd`
    /// parameter; unset by default): a request's effective threshold is the lower of its own
    /// `approval_above_usd` and this, on its whole spend (ARCHITECTURE §9.8).
    pub approve_above: Option<Usd>,
    /// What the deployment may do with money (`PURCHASE_MODE`, the `PurchaseMode` parameter;
    /// ARCHITECTURE §8.1).
    pub purchase_mode: PurchaseMode,
    /// Whether an approval can ever arrive (`APPROVALS_ENABLED`: the template sets it true
    /// only when `ApproverPrincipals` names someone; true when unset). Without approvers, a
    /// request that could pass its threshold is rejected at submission.
    pub approvals_enabled: bool,
    /// How long an on-demand or spot hold above the approval threshold waits for an
    /// approver (`HOLD_APPROVAL_MINUTES`, 30 by default) before the request falls back to the
    /// reservation search: an on-demand run is wanted now or not at all.
    pub hold_approval_minutes: u32,
    /// Which sources may submit for a team (`TEAM_SOURCES`, the `TeamSources` parameter: a
    /// JSON map of team, lower-cased, to sources); a team not listed may be submitted for by
    /// any allowed source.
    pub team_sources: BTreeMap<String, Vec<String>>,
    /// The execution roles of other HyperPod instance groups this deployment may pass
    /// (`HYPERPOD_ROLE_ARNS`, the `HyperPodRoleArns` parameter; empty by default): with
    /// `sagemaker_execution_role_arn`, what `iam:PassRole` is granted on.
    pub hyperpod_role_arns: Vec<String>,
    /// The account's limit of instances across live Capacity Blocks whose windows overlap
    /// (`MAX_BLOCK_INSTANCES`, 256 by default; an account AWS allows more sets it).
    pub max_block_instances: u32,
    /// How long before a window's drain an extension of its reservation is bought at the
    /// latest (`EXTENSION_PAYMENT_LEAD_MINUTES`, 720 by default: AWS may take 12 hours to
    /// take the payment, ARCHITECTURE §9.3). An ask after it is refused.
    pub extension_payment_lead_minutes: u32,
}

impl Config {
    /// [`Config::extension_payment_lead_minutes`] as a duration.
    pub fn extension_payment_lead(&self) -> chrono::Duration {
        chrono::Duration::minutes(i64::from(self.extension_payment_lead_minutes))
    }

    /// Whether the functions may pass `role` to SageMaker (`iam:PassRole` on the execution
    /// role and `HyperPodRoleArns`).
    pub fn may_pass(&self, role: &str) -> bool {
        role == self.sagemaker_execution_role_arn
            || self.hyperpod_role_arns.iter().any(|r| r == role)
    }

    /// Why `source` may not submit for `team` (`TEAM_SOURCES`): `None` when it may.
    pub fn team_source_problem(&self, team: &Team, source: &str) -> Option<FieldError> {
        let sources = self.team_sources.get(team.ledger().as_str())?;
        if sources.iter().any(|s| s == source) {
            return None;
        }
        Some(FieldError {
            field: "team".into(),
            message: format!(
                "{source:?} may not submit requests for team {team}: the stack's TeamSources \
                 parameter (TEAM_SOURCES) lets only {} submit for it",
                sources.join(", ")
            ),
        })
    }

    /// The approval threshold that applies to `request`: the lower of its own and the
    /// deployment's; `None` when neither sets one.
    pub fn approval_threshold(
        &self,
        request: &crate::domain::request::CapacityRequest,
    ) -> Option<Usd> {
        // `approve-all`: every purchase and hold waits for an approver (ARCHITECTURE §8.1).
        if self.purchase_mode == PurchaseMode::ApproveAll {
            return Some(Usd::ZERO);
        }
        match (request.budget.approval_above, self.approve_above) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The deployment-wide `PurchaseMode` (ARCHITECTURE §8.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PurchaseMode {
    /// Buy and launch as each request and the approval threshold say.
    #[default]
    Auto,
    /// The approval gate at threshold 0: every purchase and every on-demand or spot hold
    /// waits for an approver.
    ApproveAll,
    /// Buy and launch nothing, on demand included: every request is planned and ends
    /// `Planned`.
    PlanOnly,
}

/// Every variable at fault, with what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<(String, String)>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration: ")?;
        for (i, (var, why)) in self.problems.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{var} {why}")?;
        }
        Ok(())
    }
}

pub const DEFAULT_DRAIN_MINUTES: u32 = 15;
/// How long a hold waits for an approver by default (`HOLD_APPROVAL_MINUTES`).
pub const DEFAULT_HOLD_APPROVAL_MINUTES: u32 = 30;
/// The account's limit of instances across Capacity Blocks (`MAX_BLOCK_INSTANCES`): "you can
/// have up to 256 instances across Capacity Blocks" (the EC2 model).
pub const DEFAULT_MAX_BLOCK_INSTANCES: u32 = 256;
/// `DEPLOYMENT_ID` when unset (the template always sets it: by default to the UUID part of
/// the stack's id, which no other stack, in any region or account, shares).
pub const DEFAULT_DEPLOYMENT_ID: &str = "capacity-pilot";
pub const DEFAULT_MAX_REPLACEMENTS: u32 = 3;

struct Reader<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    problems: Vec<(String, String)>,
}

impl Reader<'_> {
    fn get(&self, var: &str) -> Option<String> {
        (self.lookup)(var).filter(|v| !v.trim().is_empty())
    }

    fn fail(&mut self, var: &str, why: impl Into<String>) {
        self.problems.push((var.to_string(), why.into()));
    }

    fn required(&mut self, var: &str) -> String {
        match self.get(var) {
            Some(v) => v.trim().to_string(),
            None => {
                self.fail(var, "is required and not set");
                String::new()
            }
        }
    }

    fn list(&mut self, var: &str, required: bool) -> Vec<String> {
        match self.get(var) {
            Some(v) => v
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            None => {
                if required {
                    self.fail(var, "is required and not set (a comma-separated list)");
                }
                vec![]
            }
        }
    }

    fn number<T: std::str::FromStr>(&mut self, var: &str, default: T) -> T {
        match self.get(var) {
            None => default,
            Some(v) => v.trim().parse().unwrap_or_else(|_| {
                self.fail(var, format!("must be a whole number, got {v:?}"));
                default
            }),
        }
    }

    fn json<T: serde::de::DeserializeOwned>(&mut self, var: &str) -> Option<T> {
        let v = self.get(var)?;
        match serde_json::from_str(&v) {
            Ok(t) => Some(t),
            Err(e) => {
                self.fail(var, format!("is not valid: {e}"));
                None
            }
        }
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Reads configuration through `lookup` (tests pass a map; nothing sets process env).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut r = Reader {
            lookup,
            problems: vec![],
        };
        let table_name = r.required("TABLE_NAME");
        let event_bus_name = r.required("EVENT_BUS_NAME");
        let notices_topic_arn = r.get("NOTICES_TOPIC_ARN").map(|v| v.trim().to_string());
        if let Some(arn) = &notices_topic_arn
            && !arn.starts_with("arn:aws")
        {
            r.fail("NOTICES_TOPIC_ARN", "must be an SNS topic ARN");
        }
        let mut notice_leads = crate::domain::notices::Leads::default();
        for (var, leads) in [
            ("NOTICE_OPENING_LEADS_MINUTES", &mut notice_leads.opening),
            ("NOTICE_ENDING_LEADS_MINUTES", &mut notice_leads.ending),
        ] {
            // Set but empty means none: `get` treats blank as unset, so read it raw.
            if let Some(v) = (r.lookup)(var) {
                match crate::domain::notices::Leads::parse_list(&v) {
                    Ok(l) => *leads = l,
                    Err(why) => r.fail(var, why),
                }
            }
        }

        let allowed_regions = r.list("ALLOWED_REGIONS", true);
        if let Some(bad) = allowed_regions.iter().find(|x| !is_region_name(x)) {
            r.fail("ALLOWED_REGIONS", format!("has {bad:?}, not a region name"));
        }
        if allowed_regions.is_empty() && r.get("ALLOWED_REGIONS").is_some() {
            r.fail("ALLOWED_REGIONS", "must name at least one region");
        }
        let allowed_request_sources = r.list("ALLOWED_REQUEST_SOURCES", true);
        if allowed_request_sources
            .iter()
            .any(|s| s == "capacity-pilot")
        {
            r.fail(
                "ALLOWED_REQUEST_SOURCES",
                "may not include capacity-pilot (our own events are never requests)",
            );
        }
        let approver_sources = r.list("APPROVER_SOURCES", true);

        let team_budgets = match r.get("TEAM_BUDGETS_USD") {
            None => {
                r.fail(
                    "TEAM_BUDGETS_USD",
                    "is required and not set (JSON map of team to monthly cap, \"*\" for the default)",
                );
                None
            }
            Some(v) => match parse_team_budgets(&v) {
                Ok(b) => Some(b),
                Err(why) => {
                    r.fail("TEAM_BUDGETS_USD", why);
                    None
                }
            },
        };

        let default_drain_minutes = r.number("DEFAULT_DRAIN_MINUTES", DEFAULT_DRAIN_MINUTES);
        let extension_payment_lead_minutes = r.number(
            "EXTENSION_PAYMENT_LEAD_MINUTES",
            crate::domain::extension::DEFAULT_PAYMENT_LEAD_MINUTES,
        );
        let hold_approval_minutes =
            r.number("HOLD_APPROVAL_MINUTES", DEFAULT_HOLD_APPROVAL_MINUTES);
        if hold_approval_minutes == 0 {
            r.fail("HOLD_APPROVAL_MINUTES", "must be at least 1");
        }
        let max_replacements_per_reservation =
            r.number("MAX_REPLACEMENTS_PER_RESERVATION", DEFAULT_MAX_REPLACEMENTS);
        let max_unhealthy_share = match r.get("MAX_UNHEALTHY_SHARE") {
            None => Decimal::new(5, 1),
            Some(v) => match v.trim().parse::<Decimal>() {
                Ok(d) if d > Decimal::ZERO && d <= Decimal::ONE => d,
                _ => {
                    r.fail(
                        "MAX_UNHEALTHY_SHARE",
                        format!("must be a decimal in (0, 1], got {v:?}"),
                    );
                    Decimal::new(5, 1)
                }
            },
        };
        let sagemaker_execution_role_arn = r.required("SAGEMAKER_EXECUTION_ROLE_ARN");
        if !sagemaker_execution_role_arn.is_empty()
            && !sagemaker_execution_role_arn.starts_with("arn:aws")
        {
            r.fail("SAGEMAKER_EXECUTION_ROLE_ARN", "must be an IAM role ARN");
        }
        let hyperpod_role_arns: Vec<String> = r
            .get("HYPERPOD_ROLE_ARNS")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(bad) = hyperpod_role_arns
            .iter()
            .find(|a| !a.starts_with("arn:aws") || !a.contains(":role/"))
        {
            r.fail(
                "HYPERPOD_ROLE_ARNS",
                format!("must be a comma list of IAM role ARNs; {bad:?} is not one"),
            );
        }
        let max_block_instances = r.number("MAX_BLOCK_INSTANCES", DEFAULT_MAX_BLOCK_INSTANCES);
        if max_block_instances == 0 {
            r.fail("MAX_BLOCK_INSTANCES", "must be at least 1");
        }
        let deployment_id = r
            .get("DEPLOYMENT_ID")
            .unwrap_or_else(|| DEFAULT_DEPLOYMENT_ID.to_string());
        if deployment_id.is_empty()
            || deployment_id.len() > 128
            || !deployment_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            r.fail(
                "DEPLOYMENT_ID",
                "must be 1-128 letters, digits, '-', '_' or '.' (a stack name fits)",
            );
        }
        let unpinned_deployment_id = r
            .get("UNPINNED_DEPLOYMENT_ID")
            .unwrap_or_else(|| deployment_id.clone());
        let instance_types = r
            .json::<SupportedInstanceTypes>("SUPPORTED_INSTANCE_TYPES")
            .unwrap_or_default();
        let prices = match r.json::<PriceTable>("ON_DEMAND_PRICES_USD") {
            // An override replaces listed types and keeps the defaults for the rest.
            Some(over) => {
                let mut t = PriceTable::default();
                t.0.extend(over.0);
                t
            }
            None => PriceTable::default(),
        };
        let clock_url = r.get("CAPACITY_PILOT_CLOCK_URL");
        let mut team_sources = BTreeMap::new();
        for (team, sources) in r
            .json::<BTreeMap<String, Vec<String>>>("TEAM_SOURCES")
            .unwrap_or_default()
        {
            let key = match Team::parse(&team) {
                Ok(t) => t.ledger().to_string(),
                Err(e) => {
                    r.fail("TEAM_SOURCES", format!("team {team:?} {e}"));
                    continue;
                }
            };
            for s in sources
                .iter()
                .filter(|s| !allowed_request_sources.contains(s))
            {
                r.fail(
                    "TEAM_SOURCES",
                    format!(
                        "gives team {team:?} the source {s:?}, which is not one of \
                         ALLOWED_REQUEST_SOURCES"
                    ),
                );
            }
            if team_sources.insert(key, sources).is_some() {
                r.fail(
                    "TEAM_SOURCES",
                    format!("names team {team:?} twice (team names are matched ignoring case)"),
                );
            }
        }
        let approvals_enabled = match r.get("APPROVALS_ENABLED").as_deref().map(str::trim) {
            None | Some("true") => true,
            Some("false") => false,
            Some(v) => {
                r.fail(
                    "APPROVALS_ENABLED",
                    format!("must be true or false, got {v:?}"),
                );
                true
            }
        };
        let approve_above = match r.get("APPROVE_ABOVE_USD").filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(v) => match Usd::parse(v.trim()) {
                Ok(u) if u >= Usd::ZERO => Some(u),
                _ => {
                    r.fail(
                        "APPROVE_ABOVE_USD",
                        format!("must be a non-negative decimal of USD, got {v:?}"),
                    );
                    None
                }
            },
        };

        let purchase_mode = match r.get("PURCHASE_MODE").as_deref().map(str::trim) {
            None | Some("auto") => PurchaseMode::Auto,
            Some("approve-all") => PurchaseMode::ApproveAll,
            Some("plan-only") => PurchaseMode::PlanOnly,
            Some(v) => {
                r.fail(
                    "PURCHASE_MODE",
                    format!("must be auto, approve-all or plan-only, got {v:?}"),
                );
                PurchaseMode::Auto
            }
        };

        if !r.problems.is_empty() {
            return Err(ConfigError {
                problems: r.problems,
            });
        }
        Ok(Config {
            table_name,
            event_bus_name,
            notices_topic_arn,
            notice_leads,
            allowed_regions,
            allowed_request_sources,
            approver_sources,
            team_budgets: team_budgets.expect("no problems recorded"),
            default_drain_minutes,
            max_replacements_per_reservation,
            max_unhealthy_share,
            sagemaker_execution_role_arn,
            deployment_id,
            unpinned_deployment_id,
            instance_types,
            prices,
            clock_url,
            approve_above,
            purchase_mode,
            approvals_enabled,
            hold_approval_minutes,
            extension_payment_lead_minutes,
            team_sources,
            hyperpod_role_arns,
            max_block_instances,
        })
    }
}

fn parse_team_budgets(v: &str) -> Result<TeamBudgets, String> {
    let raw: BTreeMap<String, String> = serde_json::from_str(v).map_err(|e| {
        format!(
            "must be a JSON object of team to decimal-string cap, e.g. {{\"*\": \"50000\"}}: {e}"
        )
    })?;
    let mut caps = BTreeMap::new();
    let mut default = None;
    for (team, cap) in raw {
        let cap = Usd::parse(&cap).map_err(|e| format!("cap for {team:?} {e}"))?;
        if cap < Usd::ZERO {
            return Err(format!("cap for {team:?} is negative"));
        }
        if team == "*" {
            default = Some(cap);
        } else {
            // Caps and ledgers ignore case (ARCHITECTURE §9.8): two spellings of one team
            // would be two caps for one ledger.
            let key = Team::parse(&team)
                .map_err(|e| format!("team {team:?} {e}"))?
                .ledger();
            if caps.insert(key.to_string(), cap).is_some() {
                return Err(format!(
                    "names team \"{key}\" twice (team names are matched ignoring case)"
                ));
            }
        }
    }
    Ok(TeamBudgets { caps, default })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    const FULL: [(&str, &str); 7] = [
        ("TABLE_NAME", "capacity-pilot-state"),
        ("EVENT_BUS_NAME", "capacity-pilot"),
        ("ALLOWED_REGIONS", "us-east-1, us-east-2"),
        ("ALLOWED_REQUEST_SOURCES", "com.example.ml-platform"),
        ("APPROVER_SOURCES", "com.example.approvals"),
        (
            "TEAM_BUDGETS_USD",
            r#"{"team-a": "50000", "*": "10000.50"}"#,
        ),
        (
            "SAGEMAKER_EXECUTION_ROLE_ARN",
            "arn:aws:iam::123456789012:role/capacity-pilot-sagemaker",
        ),
    ];

    #[test]
    fn a_complete_environment_gives_a_typed_config_with_defaults() {
        let c = Config::from_lookup(&env(&FULL)).unwrap();
        assert_eq!(c.allowed_regions, ["us-east-1", "us-east-2"]);
        assert_eq!(c.default_drain_minutes, DEFAULT_DRAIN_MINUTES);
        assert_eq!(
            c.team_budgets.cap_for(&Team::parse("team-a").unwrap()),
            Some(Usd::parse("50000").unwrap())
        );
        assert_eq!(
            c.team_budgets.cap_for(&Team::parse("other").unwrap()),
            Some(Usd::parse("10000.50").unwrap())
        );
        assert_eq!(c.instance_types, SupportedInstanceTypes::default());
        assert_eq!(c.clock_url, None);
    }

    #[test]
    fn a_holds_wait_for_approval_is_30_minutes_unless_set_and_never_none() {
        let c = Config::from_lookup(&env(&FULL)).unwrap();
        assert_eq!(c.hold_approval_minutes, DEFAULT_HOLD_APPROVAL_MINUTES);
        assert_eq!(DEFAULT_HOLD_APPROVAL_MINUTES, 30);
        let mut set = FULL.to_vec();
        set.push(("HOLD_APPROVAL_MINUTES", "45"));
        assert_eq!(
            Config::from_lookup(&env(&set))
                .unwrap()
                .hold_approval_minutes,
            45
        );
        for bad in ["0", "half an hour"] {
            let mut set = FULL.to_vec();
            set.push(("HOLD_APPROVAL_MINUTES", bad));
            let err = Config::from_lookup(&env(&set)).unwrap_err();
            assert_eq!(err.problems[0].0, "HOLD_APPROVAL_MINUTES", "{bad}");
        }
    }

    #[test]
    fn the_block_instance_limit_is_256_unless_set_and_never_zero() {
        let c = Config::from_lookup(&env(&FULL)).unwrap();
        assert_eq!(c.max_block_instances, 256);
        let mut set = FULL.to_vec();
        set.push(("MAX_BLOCK_INSTANCES", "512"));
        assert_eq!(
            Config::from_lookup(&env(&set)).unwrap().max_block_instances,
            512
        );
        let mut set = FULL.to_vec();
        set.push(("MAX_BLOCK_INSTANCES", "0"));
        let err = Config::from_lookup(&env(&set)).unwrap_err();
        assert_eq!(err.problems[0].0, "MAX_BLOCK_INSTANCES");
    }

    #[test]
    fn the_roles_passed_to_sagemaker_are_the_execution_role_and_those_listed() {
        let role = "arn:aws:iam::123456789012:role/capacity-pilot-sagemaker";
        let other = "arn:aws:iam::123456789012:role/team-f-hyperpod";
        let c = Config::from_lookup(&env(&FULL)).unwrap();
        assert!(c.may_pass(role));
        assert!(!c.may_pass(other));
        let mut set = FULL.to_vec();
        let listed = format!("{other}, arn:aws:iam::123456789012:role/team-g");
        set.push(("HYPERPOD_ROLE_ARNS", &listed));
        let c = Config::from_lookup(&env(&set)).unwrap();
        assert!(c.may_pass(role) && c.may_pass(other));
        assert!(!c.may_pass("arn:aws:iam::123456789012:role/team-h"));
        let mut set = FULL.to_vec();
        set.push(("HYPERPOD_ROLE_ARNS", "team-f-hyperpod"));
        let err = Config::from_lookup(&env(&set)).unwrap_err();
        assert_eq!(err.problems[0].0, "HYPERPOD_ROLE_ARNS");
    }

    #[test]
    fn every_missing_variable_is_named() {
        let err = Config::from_lookup(&env(&[])).unwrap_err();
        let vars: Vec<&str> = err.problems.iter().map(|(v, _)| v.as_str()).collect();
        assert_eq!(
            vars,
            [
                "TABLE_NAME",
                "EVENT_BUS_NAME",
                "ALLOWED_REGIONS",
                "ALLOWED_REQUEST_SOURCES",
                "APPROVER_SOURCES",
                "TEAM_BUDGETS_USD",
                "SAGEMAKER_EXECUTION_ROLE_ARN"
            ]
        );
        assert!(err.to_string().contains("TABLE_NAME is required"));
    }

    #[test]
    fn malformed_variables_are_named_with_the_reason() {
        let mut pairs = FULL.to_vec();
        pairs.extend([
            ("TEAM_BUDGETS_USD", r#"{"team-a": 5000}"#),
            ("DEFAULT_DRAIN_MINUTES", "soon"),
            ("MAX_UNHEALTHY_SHARE", "1.5"),
            ("ON_DEMAND_PRICES_USD", "not json"),
            ("ALLOWED_REGIONS", "us-east-1,mars"),
        ]);
        // Later pairs override earlier ones.
        let err = Config::from_lookup(&env(&pairs)).unwrap_err();
        let vars: Vec<&str> = err.problems.iter().map(|(v, _)| v.as_str()).collect();
        assert_eq!(
            vars,
            [
                "ALLOWED_REGIONS",
                "TEAM_BUDGETS_USD",
                "DEFAULT_DRAIN_MINUTES",
                "MAX_UNHEALTHY_SHARE",
                "ON_DEMAND_PRICES_USD"
            ]
        );
    }

    #[test]
    fn overrides_replace_the_type_list_and_extend_the_price_table() {
        let mut pairs = FULL.to_vec();
        pairs.extend([
            (
                "SUPPORTED_INSTANCE_TYPES",
                r#"{"capacity_block": ["p9.huge"], "training_plan": []}"#,
            ),
            (
                "ON_DEMAND_PRICES_USD",
                r#"{"p9.huge": {"on_demand": "99.5"}}"#,
            ),
            (
                "CAPACITY_PILOT_CLOCK_URL",
                "http://127.0.0.1:4566/_local/clock",
            ),
        ]);
        let c = Config::from_lookup(&env(&pairs)).unwrap();
        assert_eq!(c.instance_types.capacity_block, ["p9.huge"]);
        assert_eq!(
            c.prices.on_demand("p9.huge"),
            Some(Usd::parse("99.5").unwrap())
        );
        assert!(c.prices.on_demand("p5.48xlarge").is_some(), "defaults kept");
        assert!(c.clock_url.is_some());
    }

    #[test]
    fn our_own_source_can_never_submit_requests() {
        let mut pairs = FULL.to_vec();
        pairs.push(("ALLOWED_REQUEST_SOURCES", "capacity-pilot,com.example"));
        let err = Config::from_lookup(&env(&pairs)).unwrap_err();
        assert_eq!(err.problems[0].0, "ALLOWED_REQUEST_SOURCES");
    }

    #[test]
    fn team_caps_ignore_case_and_one_team_named_twice_is_refused() {
        let b = parse_team_budgets(r#"{"Team-A": "2000", "*": "10"}"#).unwrap();
        assert_eq!(
            b.cap_for(&Team::parse("team-a").unwrap()),
            Some(Usd::parse("2000").unwrap())
        );
        assert_eq!(
            b.cap_for(&Team::parse("TEAM-A").unwrap()),
            Some(Usd::parse("2000").unwrap())
        );
        let twice = parse_team_budgets(r#"{"Team-A": "2000", "team-a": "10"}"#).unwrap_err();
        assert!(twice.contains("\"team-a\" twice"), "{twice}");
    }

    #[test]
    fn team_sources_name_allowed_sources_and_each_team_once() {
        let mut vars = FULL.to_vec();
        vars.push(("TEAM_SOURCES", r#"{"Team-A": ["com.example.ml-platform"]}"#));
        let c = Config::from_lookup(&env(&vars)).unwrap();
        assert_eq!(c.team_sources["team-a"], ["com.example.ml-platform"]);
        for bad in [
            r#"{"team-a": ["com.example.elsewhere"]}"#,
            r#"{"team-a": [], "TEAM-A": []}"#,
        ] {
            let mut vars = FULL.to_vec();
            vars.push(("TEAM_SOURCES", bad));
            let e = Config::from_lookup(&env(&vars)).unwrap_err();
            assert!(e.to_string().contains("TEAM_SOURCES"), "{e}");
        }
    }
    #[test]
    fn purchase_mode_reads_its_three_values_and_approve_all_sets_every_threshold_to_zero() {
        let base = |mode: Option<&str>| {
            let mut vars = vec![
                ("TABLE_NAME", "t"),
                ("EVENT_BUS_NAME", "b"),
                ("ALLOWED_REGIONS", "us-east-1"),
                ("ALLOWED_REQUEST_SOURCES", "com.example.ml"),
                ("APPROVER_SOURCES", "com.example.approvals"),
                ("TEAM_BUDGETS_USD", r#"{"*": "1000"}"#),
                (
                    "SAGEMAKER_EXECUTION_ROLE_ARN",
                    "arn:aws:iam::123456789012:role/sm",
                ),
            ];
            if let Some(m) = mode {
                vars.push(("PURCHASE_MODE", m));
            }
            Config::from_lookup(&|k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            })
        };
        assert_eq!(base(None).unwrap().purchase_mode, PurchaseMode::Auto);
        assert_eq!(
            base(Some("plan-only")).unwrap().purchase_mode,
            PurchaseMode::PlanOnly
        );
        let all = base(Some("approve-all")).unwrap();
        let req = crate::fakes::fixtures::request("r1", "team-a", "5000");
        assert_eq!(all.approval_threshold(&req), Some(Usd::ZERO));
        assert_eq!(base(None).unwrap().approval_threshold(&req), None);
        let bad = base(Some("yolo")).unwrap_err();
        assert_eq!(bad.problems[0].0, "PURCHASE_MODE");
    }
}
