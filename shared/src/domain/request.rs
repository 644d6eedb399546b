//! The capacity request: its wire shape (schema version 1) and the parser that turns it
//! into validated types, reporting *every* problem with the path of the field at fault.
//!
//! Parse, don't validate: a [`CapacityRequest`] can only be built here, so the rest of the
//! system never sees an unchecked count, duration, window or budget.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use chrono::{DateTime, Duration, Utc};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::catalog::SupportedInstanceTypes;
use super::money::Usd;
use super::offering::{Product, TargetResource};
use super::reservation::Reservation;
use super::time_rules::{MAX_ADVANCE, PURCHASE_LEAD};

pub const SCHEMA_VERSION: u32 = 1;
/// Leaves room for `cp-<id>-s2` within SageMaker's 64-character plan names.
pub const MAX_REQUEST_ID_LEN: usize = 48;
pub const MAX_TEAM_LEN: usize = 64;
pub const MAX_INSTANCE_TYPES: usize = 10;
pub const MAX_CAPACITY_BLOCK_COUNT: u32 = 64;
pub const TRAINING_PLAN_COUNTS: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];
pub const MAX_DRAIN_MINUTES: u32 = 24 * 60;
/// AWS allows 50 tags per resource; we add a few of our own.
pub const MAX_USER_TAGS: usize = 40;
pub const RESERVED_TAG_PREFIX: &str = "capacity-pilot:";
pub const INSTANCE_PLATFORMS: [&str; 5] = [
    "Linux/UNIX",
    "Red Hat Enterprise Linux",
    "RHEL with HA",
    "SUSE Linux",
    "Ubuntu Pro",
];

// ---------------------------------------------------------------------------------------
// Wire shape (what other systems put in `detail`); also the source of the JSON Schema.
// ---------------------------------------------------------------------------------------

/// `detail` of a `Capacity Request Submitted` event, schema version 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestDetail {
    /// Always 1 for this shape.
    pub schema_version: u32,
    /// The caller's idempotency key: 1-48 letters, digits and hyphens, starting and ending
    /// with a letter or digit.
    pub request_id: String,
    /// The team whose monthly budget pays.
    pub team: String,
    /// Acceptable instance types, most preferred first (`capacity-pilot types` lists them).
    pub instance_types: Vec<String>,
    /// How many instances: 1-64 in a Capacity Block, 1, 2, 4, ... 64 in a training plan,
    /// at most 256 on demand.
    pub instance_count: u32,
    /// How long, in whole days given as hours (48 for two days); a Capacity Block lasts 1-14
    /// days, then whole weeks up to 182 days.
    pub duration_hours: u32,
    /// The earliest the capacity may start (RFC 3339, UTC); at most 8 weeks ahead.
    pub earliest_start: DateTime<Utc>,
    /// The latest it may end; at least `duration_hours` after `earliest_start`.
    pub latest_end: DateTime<Utc>,
    /// Regions to search; empty means every region the deployment allows (`AllowedRegions`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    /// Two segments are acceptable.
    #[serde(default)]
    pub allow_split: bool,
    /// `reserve` (the default) buys the best reservation; `on-demand-first` launches on
    /// demand now and reserves only when there is no capacity.
    #[serde(default)]
    pub strategy: Strategy,
    /// What "best" means among feasible reservations: `cheapest`
    /// (default) or `earliest`; an `on-demand-first` request's fall-back uses `earliest`
    /// unless it says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer: Option<Prefer>,
    /// The work checkpoints and resumes, so spot is acceptable.
    #[serde(default)]
    pub interruptible: bool,
    /// Restricts the products to use; by default every product the workload allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub products: Option<Vec<ProductName>>,
    pub budget: BudgetDetail,
    pub workload: WorkloadDetail,
    /// Minutes before the forced end at which the workload is stopped, so it can save its
    /// work: it brings the stop forward, it is not only a warning (at most 1440). The
    /// deployment's `DefaultDrainMinutes` (15 unless set) applies when this is less.
    #[serde(default)]
    pub drain_minutes: u32,
    /// Tags for everything bought and launched (at most 40; `capacity-pilot:` is ours).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// `execute` (the default) buys and launches; `plan` searches and plans, announces the
    /// plans in `Capacity Offerings Found`, and ends `Planned`: nothing is bought or
    /// debited. A `Planned` request's id may be submitted again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Whether and how far its reservations may be extended: `when`
    /// (`requested`: only when the team asks; `workload-running`: also while the workload
    /// still runs near the end), `max_hours` added in all, `max_upfront_usd` spent on them in
    /// all. Without it, nothing is extended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extend: Option<super::extension::ExtendPolicy>,
}

/// What a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Buy the best plan and launch the workload.
    #[default]
    Execute,
    /// Search and plan only: buy, debit and launch nothing.
    Plan,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Reserve the best offering.
    #[default]
    Reserve,
    /// Launch on demand (or spot when interruptible) now; reserve only if there is no capacity.
    OnDemandFirst,
}

/// The objective among feasible reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Prefer {
    /// The lowest upfront fee, then the earliest start, then the request's type order.
    Cheapest,
    /// The earliest start, then the lowest fee, then the request's type order.
    Earliest,
}

impl Prefer {
    pub fn as_str(self) -> &'static str {
        match self {
            Prefer::Cheapest => "cheapest",
            Prefer::Earliest => "earliest",
        }
    }
}

/// A product named in a request's `products`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum ProductName {
    CapacityBlock,
    TrainingPlan,
    OnDemand,
    Spot,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetDetail {
    /// The most this request may spend up front, as a decimal string.
    pub max_upfront_usd: Usd,
    /// Purchases above this need an approver; absent means never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_above_usd: Option<Usd>,
}

/// What to run in the capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum WorkloadDetail {
    /// EC2 instances from a launch template (Capacity Block, on-demand or spot).
    Ec2Instances {
        /// The launch template, by `id` (one region only) or by `name` (which must exist in
        /// every region searched).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        launch_template: Option<LaunchTemplateRef>,
        /// Subnets to launch in, ideally one per Availability Zone of every region searched:
        /// a Capacity Block is in one zone.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        subnet_ids: Vec<String>,
        /// Defaults to `Linux/UNIX`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instance_platform: Option<String>,
    },
    /// A SageMaker training job (training plan or on-demand).
    TrainingJob(TrainingJobTemplate),
    /// An instance group of an existing HyperPod cluster (training plan or on-demand).
    HyperpodCluster {
        /// The existing HyperPod cluster to add the instance group to.
        #[serde(default)]
        cluster_name: String,
        /// The instance group to create in it.
        #[serde(default)]
        instance_group_name: String,
        /// The group's lifecycle scripts (default: the cluster's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        life_cycle_config: Option<LifeCycleConfig>,
    },
    /// A SageMaker inference endpoint (training plan for `endpoint`, or on-demand).
    InferenceEndpoint {
        /// An existing SageMaker model (checked before anything is bought).
        #[serde(default)]
        model_name: String,
        /// The endpoint to create.
        #[serde(default)]
        endpoint_name: String,
        /// Its production variant.
        #[serde(default)]
        variant_name: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchTemplateRef {
    /// `lt-...`; give this or `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A version number, `$Latest` or `$Default` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The parts of `CreateTrainingJob` the request controls; the name, role and resource
/// config are ours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainingJobTemplate {
    /// The training container image (ECR URI).
    #[serde(default)]
    pub training_image: String,
    /// Where the job writes its model artifacts (`s3://...`).
    #[serde(default)]
    pub output_s3_uri: String,
    /// The storage volume per instance, 1-16384 GB.
    #[serde(default = "default_volume_gb")]
    pub volume_size_gb: u32,
    /// Passed to the job as they are.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hyper_parameters: BTreeMap<String, String>,
}

fn default_volume_gb() -> u32 {
    100
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LifeCycleConfig {
    pub source_s3_uri: String,
    pub on_create: String,
}

// ---------------------------------------------------------------------------------------
// Validated types.
// ---------------------------------------------------------------------------------------

/// A validated request id (see [`RequestDetail::request_id`]).
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct RequestId(String);

impl RequestId {
    pub fn parse(s: &str) -> Result<RequestId, String> {
        let ok_chars = s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        let ends_ok = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
        if s.is_empty() || s.len() > MAX_REQUEST_ID_LEN || !ok_chars || !ends_ok {
            return Err(format!(
                "must be 1-{MAX_REQUEST_ID_LEN} letters, digits and hyphens, starting and ending \
                 with a letter or digit; got {s:?}"
            ));
        }
        Ok(RequestId(s.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The id lower-cased: ids are compared by it (review N15), so two live requests never
    /// differ only in case, and the names SageMaker may fold to one never collide. The id is
    /// stored and shown as given.
    pub fn folded(&self) -> String {
        self.0.to_ascii_lowercase()
    }
    /// Whether `other` is this id ignoring case.
    pub fn same_as(&self, other: &RequestId) -> bool {
        self.0.eq_ignore_ascii_case(&other.0)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated team name: it keys the budget ledger.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct Team(String);

impl Team {
    pub fn parse(s: &str) -> Result<Team, String> {
        let ok = !s.is_empty()
            && s.len() <= MAX_TEAM_LEN
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !ok {
            return Err(format!(
                "must be 1-{MAX_TEAM_LEN} letters, digits, '-', '_' or '.'; got {s:?}"
            ));
        }
        Ok(Team(s.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The team as budgets know it (ARCHITECTURE §9.8): lower-cased, so `Team-A` and `team-a`
    /// share one cap and one ledger. The request keeps the team as it was given.
    pub fn ledger(&self) -> Team {
        Team(self.0.to_ascii_lowercase())
    }
}

impl fmt::Display for Team {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The time range the capacity must fall in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Window {
    pub earliest_start: DateTime<Utc>,
    pub latest_end: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Budget {
    pub max_upfront: Usd,
    pub approval_above: Option<Usd>,
}

/// The kind of workload, which decides the products allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    Ec2Instances,
    TrainingJob,
    HyperpodCluster,
    InferenceEndpoint,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Ec2Instances => "ec2-instances",
            WorkloadKind::TrainingJob => "training-job",
            WorkloadKind::HyperpodCluster => "hyperpod-cluster",
            WorkloadKind::InferenceEndpoint => "inference-endpoint",
        }
    }

    /// SageMaker-managed workloads use SageMaker types and products.
    pub fn is_sagemaker(self) -> bool {
        !matches!(self, WorkloadKind::Ec2Instances)
    }

    /// The training-plan target for a SageMaker workload.
    pub fn plan_target(self) -> Option<TargetResource> {
        match self {
            WorkloadKind::Ec2Instances => None,
            WorkloadKind::TrainingJob => Some(TargetResource::TrainingJob),
            WorkloadKind::HyperpodCluster => Some(TargetResource::HyperpodCluster),
            WorkloadKind::InferenceEndpoint => Some(TargetResource::Endpoint),
        }
    }

    /// Every product this workload may use (the articles' decision framework, step 1).
    pub fn allowed_products(self) -> Vec<Product> {
        match self.plan_target() {
            None => vec![Product::CapacityBlock, Product::OnDemand, Product::Spot],
            Some(target) => vec![Product::TrainingPlan { target }, Product::OnDemand],
        }
    }
}

/// A request that passed every rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CapacityRequest {
    pub id: RequestId,
    pub team: Team,
    pub instance_types: Vec<String>,
    pub instance_count: u32,
    pub duration_hours: u32,
    pub window: Window,
    pub regions: Vec<String>,
    pub allow_split: bool,
    pub strategy: Strategy,
    /// As asked; [`CapacityRequest::objective`] is what applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer: Option<Prefer>,
    pub interruptible: bool,
    /// The products this request may use, in the order the framework prefers them.
    pub products: Vec<Product>,
    pub budget: Budget,
    pub workload: WorkloadDetail,
    pub drain_minutes: u32,
    pub tags: BTreeMap<String, String>,
    /// `Execute` on a request recorded before the field.
    #[serde(default)]
    pub mode: Mode,
    /// Its extension policy (ARCHITECTURE §9.3); none: nothing is extended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extend: Option<super::extension::ExtendPolicy>,
}

impl CapacityRequest {
    /// What ranks feasible reservations: as asked, else `earliest` for `on-demand-first`
    /// (its reservation is a fall-back for capacity wanted now) and `cheapest` otherwise.
    pub fn objective(&self) -> Prefer {
        self.prefer.unwrap_or(match self.strategy {
            Strategy::OnDemandFirst => Prefer::Earliest,
            Strategy::Reserve => Prefer::Cheapest,
        })
    }

    pub fn workload_kind(&self) -> WorkloadKind {
        kind_of(&self.workload)
    }

    /// The reservation products this request may buy.
    pub fn reservation_products(&self) -> impl Iterator<Item = Product> + '_ {
        self.products.iter().copied().filter(|p| p.is_reservation())
    }

    /// `Linux/UNIX` unless the workload says otherwise; only meaningful for EC2.
    pub fn instance_platform(&self) -> &str {
        match &self.workload {
            WorkloadDetail::Ec2Instances {
                instance_platform: Some(p),
                ..
            } => p,
            _ => "Linux/UNIX",
        }
    }

    pub fn duration(&self) -> Duration {
        Duration::hours(i64::from(self.duration_hours))
    }

    /// Whether reservation `r` is of what this request asks for: live, of a product, region
    /// and type it allows, at least its instances, and inside its window.
    pub fn takes(&self, r: &Reservation) -> bool {
        r.state.is_live()
            && self.reservation_products().any(|p| p == r.product)
            && self.regions.contains(&r.region)
            && self.instance_types.contains(&r.instance_type)
            && r.instance_count >= self.instance_count
            && r.start() >= self.window.earliest_start
            && r.end() <= self.window.latest_end
    }

    /// How much of its duration what it `held` covers: the time within the segments of the
    /// reservations it takes, each moment once (a stray adopted beside a split may overlap
    /// its blocks), so what is counted is what a workload can run in.
    ///
    /// A reservation extended past `latest_end` (ARCHITECTURE §9.3) still serves it: its
    /// time is counted within the window, the added hours beyond it not.
    pub fn covered_by<'a>(&self, held: impl IntoIterator<Item = &'a Reservation>) -> Duration {
        let (from, to) = (self.window.earliest_start, self.window.latest_end);
        let mut spans: Vec<(DateTime<Utc>, DateTime<Utc>)> = held
            .into_iter()
            .filter(|r| self.takes(r) || (r.end() > to && self.takes(&ended_by(r, to))))
            .flat_map(|r| {
                r.segments
                    .iter()
                    .map(|s| (s.start.max(from), s.end.min(to)))
            })
            .filter(|(start, end)| end > start)
            .collect();
        spans.sort();
        let mut covered = Duration::zero();
        let mut reached: Option<DateTime<Utc>> = None;
        for (start, end) in spans {
            let from = reached.map_or(start, |r| r.max(start));
            if end > from {
                covered += end - from;
            }
            reached = Some(reached.map_or(end, |r| r.max(end)));
        }
        covered
    }
}

/// `r` with no segment ending after `to`: as it was bought, when only an extension took it
/// past `to`.
fn ended_by(r: &Reservation, to: DateTime<Utc>) -> Reservation {
    Reservation {
        segments: r
            .segments
            .iter()
            .map(|s| super::offering::Segment {
                end: s.end.min(to),
                ..s.clone()
            })
            .collect(),
        ..r.clone()
    }
}

fn kind_of(w: &WorkloadDetail) -> WorkloadKind {
    match w {
        WorkloadDetail::Ec2Instances { .. } => WorkloadKind::Ec2Instances,
        WorkloadDetail::TrainingJob(_) => WorkloadKind::TrainingJob,
        WorkloadDetail::HyperpodCluster { .. } => WorkloadKind::HyperpodCluster,
        WorkloadDetail::InferenceEndpoint { .. } => WorkloadKind::InferenceEndpoint,
    }
}

// ---------------------------------------------------------------------------------------
// Parsing.
// ---------------------------------------------------------------------------------------

/// One problem with a request, at a field path such as `budget.max_upfront_usd` or
/// `instance_types[1]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// What validation needs to know besides the request itself.
#[derive(Debug, Clone, Copy)]
pub struct ValidationContext<'a> {
    pub now: DateTime<Utc>,
    pub instance_types: &'a SupportedInstanceTypes,
    /// The deployment's `ALLOWED_REGIONS`: the default, and the limit.
    pub allowed_regions: &'a [String],
}

#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }
}

/// Reads one member, recording a problem when it is missing (if required) or mistyped.
fn member<T: DeserializeOwned>(
    map: &Map<String, Value>,
    field: &str,
    required: bool,
    problems: &mut Problems,
) -> Option<T> {
    match map.get(field) {
        None | Some(Value::Null) => {
            if required {
                problems.add(field, "is required");
            }
            None
        }
        Some(v) => match serde_json::from_value::<T>(v.clone()) {
            Ok(t) => Some(t),
            Err(e) => {
                problems.add(field, clean_serde_message(&e.to_string()));
                None
            }
        },
    }
}

fn clean_serde_message(m: &str) -> String {
    // serde_json appends " at line L column C", meaningless for a `Value`.
    match m.find(" at line ") {
        Some(i) => m[..i].to_string(),
        None => m.to_string(),
    }
}

fn money_member(
    map: &Map<String, Value>,
    path: &str,
    field: &str,
    required: bool,
    problems: &mut Problems,
) -> Option<Usd> {
    let full = format!("{path}.{field}");
    match map.get(field) {
        None | Some(Value::Null) => {
            if required {
                problems.add(full, "is required");
            }
            None
        }
        Some(Value::String(s)) => match Usd::parse_positive(s) {
            Ok(u) => Some(u),
            Err(e) => {
                problems.add(full, e.to_string());
                None
            }
        },
        Some(other) => {
            problems.add(
                full,
                format!(
                    "must be a positive decimal string such as \"1500.00\" (never a JSON \
                     number), got {other}"
                ),
            );
            None
        }
    }
}

const TOP_LEVEL_FIELDS: [&str; 21] = [
    "schema_version",
    "request_id",
    "team",
    "instance_types",
    "instance_count",
    "duration_hours",
    "earliest_start",
    "latest_end",
    "regions",
    "allow_split",
    "strategy",
    "prefer",
    "interruptible",
    "products",
    "budget",
    "workload",
    "drain_minutes",
    "tags",
    "mode",
    "extend",
    // tolerated for forward compatibility of callers that echo it back
    "comment",
];

/// Parses and validates a request's `detail`, returning every problem found.
pub fn parse_request(
    detail: &Value,
    ctx: &ValidationContext<'_>,
) -> Result<CapacityRequest, Vec<FieldError>> {
    let mut p = Problems::default();
    let Some(map) = detail.as_object() else {
        return Err(vec![FieldError {
            field: "detail".into(),
            message: "must be a JSON object".into(),
        }]);
    };
    for key in map.keys() {
        if !TOP_LEVEL_FIELDS.contains(&key.as_str()) {
            p.add(key.clone(), "is not a field of schema version 1");
        }
    }

    match member::<u32>(map, "schema_version", true, &mut p) {
        Some(SCHEMA_VERSION) | None => {}
        Some(v) => p.add(
            "schema_version",
            format!("unsupported schema version {v}; this deployment reads {SCHEMA_VERSION}"),
        ),
    }

    let id = member::<String>(map, "request_id", true, &mut p).and_then(|s| {
        RequestId::parse(&s)
            .map_err(|m| p.add("request_id", m))
            .ok()
    });
    let team = member::<String>(map, "team", true, &mut p)
        .and_then(|s| Team::parse(&s).map_err(|m| p.add("team", m)).ok());

    let workload = parse_workload(map, &mut p);
    // The kind alone decides products and type lists, even when the rest of the workload
    // is at fault, so those rules still report their own problems.
    let kind = workload.as_ref().map(kind_of).or_else(|| {
        match map.get("workload")?.get("kind")?.as_str()? {
            "ec2-instances" => Some(WorkloadKind::Ec2Instances),
            "training-job" => Some(WorkloadKind::TrainingJob),
            "hyperpod-cluster" => Some(WorkloadKind::HyperpodCluster),
            "inference-endpoint" => Some(WorkloadKind::InferenceEndpoint),
            _ => None,
        }
    });

    let interruptible = member::<bool>(map, "interruptible", false, &mut p).unwrap_or(false);
    let strategy = member::<Strategy>(map, "strategy", false, &mut p).unwrap_or_default();
    let prefer = member::<Prefer>(map, "prefer", false, &mut p);
    let allow_split = member::<bool>(map, "allow_split", false, &mut p).unwrap_or(false);
    let products = kind.and_then(|k| parse_products(map, k, interruptible, strategy, &mut p));

    let instance_types = parse_instance_types(map, kind, ctx, &mut p);

    let reserves =
        |pred: fn(&Product) -> bool| products.as_ref().is_some_and(|ps| ps.iter().any(pred));
    let uses_block = reserves(|p| matches!(p, Product::CapacityBlock));
    let uses_plan = reserves(|p| matches!(p, Product::TrainingPlan { .. }));

    let instance_count = member::<u32>(map, "instance_count", true, &mut p).and_then(|n| {
        let mut ok = true;
        if n == 0 {
            p.add("instance_count", "must be at least 1");
            ok = false;
        } else if uses_block && n > MAX_CAPACITY_BLOCK_COUNT {
            p.add(
                "instance_count",
                format!(
                    "a Capacity Block holds at most {MAX_CAPACITY_BLOCK_COUNT} instances, got {n}"
                ),
            );
            ok = false;
        } else if uses_plan && !TRAINING_PLAN_COUNTS.contains(&n) {
            p.add(
                "instance_count",
                format!("a training plan holds 1, 2, 4, 8, 16, 32 or 64 instances, got {n}"),
            );
            ok = false;
        } else if n > 256 {
            p.add("instance_count", format!("at most 256 instances, got {n}"));
            ok = false;
        }
        ok.then_some(n)
    });

    let duration_hours = member::<u32>(map, "duration_hours", true, &mut p).and_then(|h| {
        let problem = duration_problem(h, uses_block, uses_plan);
        match problem {
            Some(m) => {
                p.add("duration_hours", m);
                None
            }
            None => Some(h),
        }
    });

    let earliest = member::<DateTime<Utc>>(map, "earliest_start", true, &mut p);
    let latest = member::<DateTime<Utc>>(map, "latest_end", true, &mut p);
    let window = match (earliest, latest) {
        (Some(e), Some(l)) => check_window(e, l, duration_hours, ctx.now, &mut p),
        _ => None,
    };

    let regions = parse_regions(map, ctx, &mut p);
    let budget = parse_budget(map, &mut p);

    let drain_minutes = member::<u32>(map, "drain_minutes", false, &mut p)
        .and_then(|m| {
            if m > MAX_DRAIN_MINUTES {
                p.add(
                    "drain_minutes",
                    format!("at most {MAX_DRAIN_MINUTES} minutes, got {m}"),
                );
                None
            } else {
                Some(m)
            }
        })
        .unwrap_or(0);

    let tags = parse_tags(map, &mut p);
    let mode = member::<Mode>(map, "mode", false, &mut p).unwrap_or_default();
    let extend = parse_extend(
        map,
        products.as_ref().map(|_| uses_block || uses_plan),
        &mut p,
    );
    // SageMaker's tag characters are narrower than EC2's: a request whose workload or plan
    // SageMaker creates is refused here, not at purchase or launch (aws-reference §11.2).
    let in_sagemaker = matches!(&workload, Some(w) if !matches!(w, WorkloadDetail::Ec2Instances { .. }))
        || products
            .as_ref()
            .is_some_and(|ps| ps.iter().any(|p| matches!(p, Product::TrainingPlan { .. })));
    if let (Some(tags), true) = (&tags, in_sagemaker) {
        sagemaker_tag_problems(tags, &mut p);
    }

    // A value `capacity-pilot new` left for the caller to fill in names itself, and
    // nothing else is said of its field.
    let left = placeholders(detail);
    if !left.is_empty() {
        p.0.retain(|f| {
            !left
                .iter()
                .any(|(at, _)| f.field == *at || f.field.starts_with(&format!("{at}.")))
        });
        for (at, what) in left {
            p.add(
                at,
                format!(
                    "is the placeholder {what:?} left by `capacity-pilot new`: give the real \
                     value"
                ),
            );
        }
    }

    if !p.0.is_empty() {
        // In the order of the schema, so the message reads like the request.
        let rank = |f: &FieldError| {
            let top = f.field.split(['.', '[']).next().unwrap_or_default();
            TOP_LEVEL_FIELDS
                .iter()
                .position(|t| *t == top)
                .unwrap_or(TOP_LEVEL_FIELDS.len())
        };
        let mut problems = p.0;
        problems.sort_by_key(rank);
        return Err(problems);
    }
    // Every `None` above recorded a problem, so these are all present.
    match (
        id,
        team,
        instance_types,
        instance_count,
        duration_hours,
        window,
        regions,
        products,
        budget,
        workload,
        tags,
    ) {
        (
            Some(id),
            Some(team),
            Some(instance_types),
            Some(instance_count),
            Some(duration_hours),
            Some(window),
            Some(regions),
            Some(products),
            Some(budget),
            Some(workload),
            Some(tags),
        ) => Ok(CapacityRequest {
            id,
            team,
            instance_types,
            instance_count,
            duration_hours,
            window,
            regions,
            allow_split,
            strategy,
            prefer,
            interruptible,
            products,
            budget,
            workload,
            drain_minutes,
            tags,
            mode,
            extend,
        }),
        _ => Err(vec![FieldError {
            field: "detail".into(),
            message: "could not be read".into(),
        }]),
    }
}

/// Whether `s` is a placeholder: `<` and `>` around a description, as `capacity-pilot new`
/// writes for what it cannot know (`"<launch template name>"`).
pub fn is_placeholder(s: &str) -> bool {
    s.len() > 2 && s.starts_with('<') && s.ends_with('>')
}

/// Every placeholder string in a request's `detail`, with its field path
/// (`workload.subnet_ids[0]`), in the detail's order.
pub fn placeholders(detail: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    placeholders_under(detail, "", &mut out);
    out
}

fn placeholders_under(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::String(s) if is_placeholder(s) => out.push((at.to_string(), s.clone())),
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                placeholders_under(x, &format!("{at}[{i}]"), out);
            }
        }
        Value::Object(map) => {
            for (k, x) in map {
                let path = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                placeholders_under(x, &path, out);
            }
        }
        _ => {}
    }
}

fn duration_problem(h: u32, uses_block: bool, uses_plan: bool) -> Option<String> {
    if h == 0 || !h.is_multiple_of(24) {
        return Some(format!(
            "must be whole days (a multiple of 24 hours), got {h}"
        ));
    }
    let days = h / 24;
    if uses_block && !(days <= 14 || (days.is_multiple_of(7) && days <= 182)) {
        return Some(format!(
            "a Capacity Block lasts 1-14 days, then 21, 28, ... 182 days; got {days} days"
        ));
    }
    if days > 182 {
        let product = if uses_plan {
            "a training plan"
        } else {
            "a reservation"
        };
        return Some(format!("{product} lasts at most 182 days, got {days} days"));
    }
    None
}

fn check_window(
    earliest: DateTime<Utc>,
    latest: DateTime<Utc>,
    duration_hours: Option<u32>,
    now: DateTime<Utc>,
    p: &mut Problems,
) -> Option<Window> {
    let before = p.0.len();
    if earliest >= latest {
        p.add("latest_end", "must be after earliest_start");
    } else if let Some(h) = duration_hours {
        let duration = Duration::hours(i64::from(h));
        if latest - earliest < duration {
            p.add(
                "latest_end",
                format!(
                    "the window from earliest_start to latest_end is {} h, shorter than \
                     duration_hours {h}",
                    (latest - earliest).num_hours()
                ),
            );
        } else if latest - duration < now + PURCHASE_LEAD {
            p.add(
                "latest_end",
                format!(
                    "no feasible start remains: a {h} h reservation bought now starts at the \
                     earliest 30 min from now and would end after latest_end"
                ),
            );
        }
    }
    if earliest > now + MAX_ADVANCE {
        p.add(
            "earliest_start",
            "is more than 8 weeks ahead; reservations start at most 8 weeks out",
        );
    }
    // A reservation starts at most 8 weeks out, so no window ends later than that plus its
    // length: a later latest_end would only keep the request searching (review N18).
    if let Some(h) = duration_hours
        && latest > now + MAX_ADVANCE + Duration::hours(i64::from(h))
    {
        p.add(
            "latest_end",
            format!(
                "is more than 8 weeks plus duration_hours ({h} h) ahead; reservations start at \
                 most 8 weeks out, so nothing bought could end after {}",
                (now + MAX_ADVANCE + Duration::hours(i64::from(h))).to_rfc3339()
            ),
        );
    }
    (p.0.len() == before).then_some(Window {
        earliest_start: earliest,
        latest_end: latest,
    })
}

fn parse_instance_types(
    map: &Map<String, Value>,
    kind: Option<WorkloadKind>,
    ctx: &ValidationContext<'_>,
    p: &mut Problems,
) -> Option<Vec<String>> {
    let types = member::<Vec<String>>(map, "instance_types", true, p)?;
    let before = p.0.len();
    if types.is_empty() {
        p.add("instance_types", "must name at least one instance type");
    }
    if types.len() > MAX_INSTANCE_TYPES {
        p.add(
            "instance_types",
            format!("at most {MAX_INSTANCE_TYPES} types, got {}", types.len()),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, t) in types.iter().enumerate() {
        let field = format!("instance_types[{i}]");
        if !seen.insert(t) {
            p.add(&field, format!("{t:?} is listed twice"));
            continue;
        }
        if let Some(k) = kind {
            let (known, product) = if k.is_sagemaker() {
                (ctx.instance_types.sagemaker(), "training plans (SageMaker)")
            } else {
                (ctx.instance_types.ec2(), "Capacity Blocks (EC2)")
            };
            if !known.iter().any(|s| s == t) {
                p.add(
                    &field,
                    format!(
                        "unknown instance type {t:?} for {product} with workload {}; supported: {}",
                        k.as_str(),
                        known.join(", ")
                    ),
                );
            }
        }
    }
    (p.0.len() == before).then_some(types)
}

fn parse_products(
    map: &Map<String, Value>,
    kind: WorkloadKind,
    interruptible: bool,
    strategy: Strategy,
    p: &mut Problems,
) -> Option<Vec<Product>> {
    let allowed = kind.allowed_products();
    let before = p.0.len();
    let products: Vec<Product> = match member::<Vec<ProductName>>(map, "products", false, p) {
        None if p.0.len() > before => return None,
        None => allowed
            .iter()
            .copied()
            .filter(|pr| *pr != Product::Spot || interruptible)
            .collect(),
        Some(names) => {
            if names.is_empty() {
                p.add("products", "must name at least one product, or be left out");
            }
            let mut out = Vec::new();
            for (i, n) in names.iter().enumerate() {
                let field = format!("products[{i}]");
                let product = match n {
                    ProductName::CapacityBlock => Some(Product::CapacityBlock),
                    ProductName::TrainingPlan => kind
                        .plan_target()
                        .map(|target| Product::TrainingPlan { target }),
                    ProductName::OnDemand => Some(Product::OnDemand),
                    ProductName::Spot => Some(Product::Spot),
                };
                match product {
                    Some(pr) if allowed.contains(&pr) => {
                        if pr == Product::Spot && !interruptible {
                            p.add(
                                &field,
                                "spot needs \"interruptible\": true (spot capacity can be reclaimed)",
                            );
                        } else if !out.contains(&pr) {
                            out.push(pr);
                        }
                    }
                    _ => p.add(
                        &field,
                        format!(
                            "workload {} cannot use {}; allowed: {}",
                            kind.as_str(),
                            serde_json::to_value(n)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default(),
                            allowed
                                .iter()
                                .map(|a| a.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ),
                }
            }
            out
        }
    };
    if p.0.len() > before {
        return None;
    }
    let has_reservation = products.iter().any(|pr| pr.is_reservation());
    let has_on_demand = products
        .iter()
        .any(|pr| matches!(pr, Product::OnDemand | Product::Spot));
    match strategy {
        Strategy::Reserve if !has_reservation => {
            p.add(
                "strategy",
                "\"reserve\" needs a reservation product (capacity-block or training-plan)",
            );
            None
        }
        Strategy::OnDemandFirst if !has_on_demand => {
            p.add(
                "strategy",
                "\"on-demand-first\" needs on-demand or spot among the products",
            );
            None
        }
        _ => Some(products),
    }
}

fn parse_regions(
    map: &Map<String, Value>,
    ctx: &ValidationContext<'_>,
    p: &mut Problems,
) -> Option<Vec<String>> {
    let before = p.0.len();
    let regions = member::<Vec<String>>(map, "regions", false, p);
    if p.0.len() > before {
        return None;
    }
    let regions = match regions {
        None => return Some(ctx.allowed_regions.to_vec()),
        Some(r) if r.is_empty() => return Some(ctx.allowed_regions.to_vec()),
        Some(r) => r,
    };
    let mut seen = BTreeSet::new();
    for (i, r) in regions.iter().enumerate() {
        let field = format!("regions[{i}]");
        if !seen.insert(r) {
            p.add(&field, format!("{r:?} is listed twice"));
        } else if !is_region_name(r) {
            p.add(
                &field,
                format!("{r:?} is not a region name such as \"us-east-1\""),
            );
        } else if !ctx.allowed_regions.iter().any(|a| a == r) {
            p.add(
                &field,
                format!(
                    "{r:?} is not allowed in this deployment; allowed: {}",
                    ctx.allowed_regions.join(", ")
                ),
            );
        }
    }
    (p.0.len() == before).then_some(regions)
}

/// `xx-name-N` or `xx-name-name-N`.
pub fn is_region_name(r: &str) -> bool {
    let parts: Vec<&str> = r.split('-').collect();
    parts.len() >= 3
        && parts[0].len() == 2
        && parts[..parts.len() - 1]
            .iter()
            .all(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase()))
        && parts[parts.len() - 1].chars().all(|c| c.is_ascii_digit())
        && !parts[parts.len() - 1].is_empty()
}

/// `extend`: `when`, `max_hours` (whole days, at most 182 of them) and `max_upfront_usd`;
/// only for a request that may buy a reservation (`reserves`).
fn parse_extend(
    map: &Map<String, Value>,
    reserves: Option<bool>,
    p: &mut Problems,
) -> Option<super::extension::ExtendPolicy> {
    use super::extension::{ExtendPolicy, ExtendWhen, MAX_EXTENSION_HOURS};
    let v = map.get("extend").filter(|v| !v.is_null())?;
    let Some(e) = v.as_object() else {
        p.add(
            "extend",
            "must be an object with when, max_hours and max_upfront_usd",
        );
        return None;
    };
    for key in e.keys() {
        if !["when", "max_hours", "max_upfront_usd"].contains(&key.as_str()) {
            p.add(format!("extend.{key}"), "is not a field of extend");
        }
    }
    let when = match e.get("when") {
        None | Some(Value::Null) => {
            p.add("extend.when", "is required");
            None
        }
        Some(w) => match serde_json::from_value::<ExtendWhen>(w.clone()) {
            Ok(w) => Some(w),
            Err(_) => {
                p.add(
                    "extend.when",
                    format!("must be \"requested\" or \"workload-running\", got {w}"),
                );
                None
            }
        },
    };
    let max_hours = match e.get("max_hours") {
        None | Some(Value::Null) => {
            p.add("extend.max_hours", "is required");
            None
        }
        Some(h) => match h.as_u64() {
            Some(h) if (24..=u64::from(MAX_EXTENSION_HOURS)).contains(&h) => u32::try_from(h).ok(),
            _ => {
                p.add(
                    "extend.max_hours",
                    format!(
                        "must be a whole number of hours from 24 (a day, the shortest \
                         extension) to {MAX_EXTENSION_HOURS} (182 days), got {h}"
                    ),
                );
                None
            }
        },
    };
    let max_upfront = money_member(e, "extend", "max_upfront_usd", true, p);
    if reserves == Some(false) {
        p.add(
            "extend",
            "only a Capacity Block or a training plan is extended: this request buys neither \
             (see products and workload.kind)",
        );
        return None;
    }
    Some(ExtendPolicy {
        when: when?,
        max_hours: max_hours?,
        max_upfront_usd: max_upfront?,
    })
}

fn parse_budget(map: &Map<String, Value>, p: &mut Problems) -> Option<Budget> {
    let Some(v) = map.get("budget") else {
        p.add("budget", "is required");
        return None;
    };
    let Some(b) = v.as_object() else {
        p.add("budget", "must be an object with max_upfront_usd");
        return None;
    };
    for key in b.keys() {
        if key != "max_upfront_usd" && key != "approval_above_usd" {
            p.add(format!("budget.{key}"), "is not a field of budget");
        }
    }
    let max = money_member(b, "budget", "max_upfront_usd", true, p);
    let approval = money_member(b, "budget", "approval_above_usd", false, p);
    let approval_ok = b.get("approval_above_usd").is_none_or(Value::is_null) || approval.is_some();
    match max {
        Some(max_upfront) if approval_ok => Some(Budget {
            max_upfront,
            approval_above: approval,
        }),
        _ => None,
    }
}

fn parse_tags(map: &Map<String, Value>, p: &mut Problems) -> Option<BTreeMap<String, String>> {
    let before = p.0.len();
    let tags = member::<BTreeMap<String, String>>(map, "tags", false, p);
    if p.0.len() > before {
        return None;
    }
    let tags = tags.unwrap_or_default();
    if tags.len() > MAX_USER_TAGS {
        p.add(
            "tags",
            format!("at most {MAX_USER_TAGS} tags, got {}", tags.len()),
        );
    }
    for (k, v) in &tags {
        let field = format!("tags.{k}");
        if k.is_empty() || k.chars().count() > 127 {
            p.add(&field, "tag keys are 1-127 characters");
        } else if k.to_ascii_lowercase().starts_with("aws:") {
            p.add(
                &field,
                "tag keys may not start with \"aws:\" (reserved by AWS)",
            );
        } else if k.starts_with(RESERVED_TAG_PREFIX) {
            p.add(
                &field,
                "tag keys may not start with \"capacity-pilot:\" (ours)",
            );
        }
        if v.chars().count() > 256 {
            p.add(&field, "tag values are at most 256 characters");
        }
    }
    (p.0.len() == before).then_some(tags)
}

/// SageMaker's `TagKey`/`TagValue` pattern `([\p{L}\p{Z}\p{N}_.:/=+\-@]*)`, keys of at most
/// 128 characters (aws-reference §11.2). Letters are Rust's `is_alphabetic`, which also passes
/// the few combining marks Unicode counts as alphabetic (SageMaker's `\p{L}` would not).
pub fn sagemaker_tag_char(c: char) -> bool {
    c.is_alphabetic()
        || c.is_numeric()
        || matches!(
            c,
            '\u{20}' | '\u{A0}' | '\u{1680}' | '\u{2000}'
                ..='\u{200A}' | '\u{2028}' | '\u{2029}' | '\u{202F}' | '\u{205F}' | '\u{3000}'
        )
        || "_.:/=+-@".contains(c)
}

fn sagemaker_tag_problems(tags: &BTreeMap<String, String>, p: &mut Problems) {
    for (k, v) in tags {
        let bad: Vec<char> = k
            .chars()
            .chain(v.chars())
            .filter(|c| !sagemaker_tag_char(*c))
            .collect();
        if let Some(c) = bad.first() {
            p.add(
                format!("tags.{k}"),
                format!(
                    "SageMaker creates this request's workload or plan, and its tags allow only \
                     letters, numbers, spaces and _ . : / = + - @; {c:?} is not allowed"
                ),
            );
        }
    }
}

fn parse_workload(map: &Map<String, Value>, p: &mut Problems) -> Option<WorkloadDetail> {
    let Some(v) = map.get("workload") else {
        p.add("workload", "is required");
        return None;
    };
    let kind_ok = v.get("kind").and_then(Value::as_str).is_some_and(|k| {
        [
            "ec2-instances",
            "training-job",
            "hyperpod-cluster",
            "inference-endpoint",
        ]
        .contains(&k)
    });
    if !kind_ok {
        p.add(
            "workload.kind",
            format!(
                "must be one of ec2-instances, training-job, hyperpod-cluster, \
                 inference-endpoint; got {}",
                v.get("kind")
                    .map(|k| k.to_string())
                    .unwrap_or_else(|| "nothing".into())
            ),
        );
        return None;
    }
    let w: WorkloadDetail = match serde_json::from_value(v.clone()) {
        Ok(w) => w,
        Err(e) => {
            p.add("workload", clean_serde_message(&e.to_string()));
            return None;
        }
    };
    let before = p.0.len();
    let required = |p: &mut Problems, field: &str, value: &str, what: &str| {
        if value.trim().is_empty() {
            p.add(
                format!("workload.{field}"),
                format!("is required for {what}"),
            );
        }
    };
    match &w {
        WorkloadDetail::Ec2Instances {
            launch_template,
            subnet_ids,
            instance_platform,
        } => {
            match launch_template {
                None => p.add(
                    "workload.launch_template",
                    "is required for ec2-instances (an id or a name)",
                ),
                Some(lt) => {
                    match (&lt.id, &lt.name) {
                        (None, None) => {
                            p.add("workload.launch_template", "needs an id (lt-...) or a name")
                        }
                        (Some(_), Some(_)) => {
                            p.add("workload.launch_template", "give an id or a name, not both")
                        }
                        (Some(id), None) if !is_aws_id(id, "lt-") => p.add(
                            "workload.launch_template.id",
                            format!("{id:?} is not a launch template id (lt- and 8-17 hex digits)"),
                        ),
                        _ => {}
                    }
                    if let Some(ver) = &lt.version {
                        let ok = ver == "$Latest"
                            || ver == "$Default"
                            || (ver.parse::<u64>().is_ok_and(|n| n > 0));
                        if !ok {
                            p.add(
                                "workload.launch_template.version",
                                format!(
                                    "must be a version number, $Latest or $Default; got {ver:?}"
                                ),
                            );
                        }
                    }
                }
            }
            if subnet_ids.is_empty() {
                p.add(
                    "workload.subnet_ids",
                    "is required for ec2-instances: at least one subnet, ideally one per AZ",
                );
            }
            for (i, s) in subnet_ids.iter().enumerate() {
                if !is_aws_id(s, "subnet-") {
                    p.add(
                        format!("workload.subnet_ids[{i}]"),
                        format!("{s:?} is not a subnet id (subnet- and 8-17 hex digits)"),
                    );
                }
            }
            if let Some(pl) = instance_platform
                && !INSTANCE_PLATFORMS.contains(&pl.as_str())
            {
                p.add(
                    "workload.instance_platform",
                    format!(
                        "{pl:?} is not a Capacity Block platform; one of: {}",
                        INSTANCE_PLATFORMS.join(", ")
                    ),
                );
            }
        }
        WorkloadDetail::TrainingJob(t) => {
            required(p, "training_image", &t.training_image, "training-job");
            required(p, "output_s3_uri", &t.output_s3_uri, "training-job");
            if !t.output_s3_uri.is_empty() && !t.output_s3_uri.starts_with("s3://") {
                p.add("workload.output_s3_uri", "must be an s3:// URI");
            }
            if t.volume_size_gb == 0 || t.volume_size_gb > 16_384 {
                p.add("workload.volume_size_gb", "must be 1-16384 GB");
            }
        }
        WorkloadDetail::HyperpodCluster {
            cluster_name,
            instance_group_name,
            life_cycle_config,
        } => {
            required(p, "cluster_name", cluster_name, "hyperpod-cluster");
            required(
                p,
                "instance_group_name",
                instance_group_name,
                "hyperpod-cluster",
            );
            if let Some(lc) = life_cycle_config
                && !lc.source_s3_uri.starts_with("s3://")
            {
                p.add(
                    "workload.life_cycle_config.source_s3_uri",
                    "must be an s3:// URI",
                );
            }
        }
        WorkloadDetail::InferenceEndpoint {
            model_name,
            endpoint_name,
            variant_name,
        } => {
            required(p, "model_name", model_name, "inference-endpoint");
            required(p, "endpoint_name", endpoint_name, "inference-endpoint");
            required(p, "variant_name", variant_name, "inference-endpoint");
        }
    }
    (p.0.len() == before).then_some(w)
}

/// What the validator requires of each workload kind besides `kind` (a test holds the two
/// together): the request schema requires the same ([`require_per_kind`]).
pub const WORKLOAD_REQUIRED: [(&str, &[&str]); 4] = [
    ("ec2-instances", &["launch_template", "subnet_ids"]),
    ("training-job", &["training_image", "output_s3_uri"]),
    ("hyperpod-cluster", &["cluster_name", "instance_group_name"]),
    (
        "inference-endpoint",
        &["model_name", "endpoint_name", "variant_name"],
    ),
];

/// Makes the request schema require of each workload kind what the validator requires
/// ([`WORKLOAD_REQUIRED`]): the fields present, strings not empty, subnets listed.
pub fn require_per_kind(schema: &mut schemars::Schema) {
    let Some(variants) = schema
        .ensure_object()
        .get_mut("$defs")
        .and_then(|d| d.get_mut("WorkloadDetail"))
        .and_then(|w| w.get_mut("oneOf"))
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for v in variants {
        let Some(kind) = v["properties"]["kind"]["const"]
            .as_str()
            .map(str::to_string)
        else {
            continue;
        };
        let Some((_, fields)) = WORKLOAD_REQUIRED.iter().find(|(k, _)| *k == kind) else {
            continue;
        };
        for f in *fields {
            let prop = &mut v["properties"][*f];
            match prop["type"].as_str() {
                Some("string") => prop["minLength"] = 1.into(),
                Some("array") => prop["minItems"] = 1.into(),
                _ => {}
            }
            // Required, so neither absent (its default) nor null.
            if let Some(branch) = prop["anyOf"]
                .as_array()
                .and_then(|any| any.iter().find(|b| b["type"] != "null"))
                .cloned()
            {
                let description = prop["description"].clone();
                *prop = branch;
                if !description.is_null() {
                    prop["description"] = description;
                }
            }
            if let Some(p) = prop.as_object_mut() {
                p.remove("default");
            }
        }
        v["required"] = Value::Array(
            std::iter::once("kind")
                .chain(fields.iter().copied())
                .map(Value::from)
                .collect(),
        );
    }
}

/// `prefix` followed by 8 or 17 lowercase hex digits, as EC2 ids are.
fn is_aws_id(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix).is_some_and(|rest| {
        (rest.len() == 8 || rest.len() == 17)
            && rest
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    })
}
