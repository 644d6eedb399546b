//! SageMaker as capacity-pilot uses it (awsJson1_1): training plan offerings and plans, training
//! jobs on plans or on-demand, HyperPod clusters whose instance groups run on plans, and inference
//! endpoints reserved through a plan. Statuses follow the plan's segments on the simulated clock;
//! errors use the codes the real service returns (often the unmodeled `ValidationException`).

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, TimeDelta, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::market::{PlanOffering, PlanSearch, Pool, Segment};
use crate::util::epoch;
use crate::world::{Action, InactivePlan, PAYMENT_LEAD_MINUTES, REQUEST_TAG, RefusalMarket, World};

/// A purchased training plan.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub name: String,
    pub arn: String,
    pub region: String,
    pub offering: PlanOffering,
    pub created: DateTime<Utc>,
    pub paid_at: DateTime<Utc>,
    /// The payment fails at `paid_at` (forced through the control API or a scenario).
    pub fail_payment: bool,
    /// The payment failed: the plan is `Failed` and its capacity back in the market.
    pub failed: bool,
    pub reserved_capacity_arns: Vec<String>,
    /// Extensions bought for it, oldest first ([`World::extend_plan`]).
    pub extensions: Vec<PlanExtension>,
}

/// An extension of a training plan: `hours` more of its last reserved capacity, from its end
/// (`start`) to `end`. The plan's end moves when it is paid.
#[derive(Debug, Clone, Serialize)]
pub struct PlanExtension {
    /// The `tpeo-` offering it was bought from (`ExtendTrainingPlan`, or by hand).
    pub offering_id: String,
    pub hours: i64,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub availability_zone: String,
    pub upfront_fee: Decimal,
    pub extended_at: DateTime<Utc>,
    /// When its payment clears (or fails); the plan's last segment ends at `end` from then.
    pub paid_at: DateTime<Utc>,
    /// Its payment succeeded.
    pub paid: bool,
    /// Its payment fails at `paid_at` ([`World::extension_payment`]).
    pub fail_payment: bool,
    /// Its payment failed: the plan kept its end, the capacity went back to the market.
    pub failed: bool,
    /// Bought by hand (the console, [`World::extend_plan`]), not through the API
    /// (`ExtendTrainingPlan`) by the product.
    pub by_hand: bool,
}

impl PlanExtension {
    /// Its payment neither succeeded nor failed yet: no other extension can be bought.
    pub fn pending(&self) -> bool {
        !self.paid && !self.failed
    }

    /// `PaymentStatus`: `Pending` until its payment clears, then `Succeeded` or `Failed`.
    /// The model types it a free string and publishes only `Pending` (the purchase's
    /// answer): the other two are a guess (REALISM).
    pub fn payment_status(&self) -> &'static str {
        if self.paid {
            "Succeeded"
        } else if self.failed {
            "Failed"
        } else {
            "Pending"
        }
    }

    /// `Status`: `Pending` until its payment clears, then `Active` or `Failed` (a free string
    /// whose values beyond `Pending` are a guess, REALISM).
    pub fn status(&self) -> &'static str {
        if self.paid {
            "Active"
        } else if self.failed {
            "Failed"
        } else {
            "Pending"
        }
    }
}

/// A training plan extension offering (`SearchTrainingPlanOfferings` with `TrainingPlanArn`),
/// bought with `ExtendTrainingPlan`.
#[derive(Debug, Clone, Serialize)]
pub struct PlanExtensionOffering {
    pub id: String,
    pub region: String,
    /// The plan's key: (region, name lower-cased).
    pub plan: (String, String),
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub hours: i64,
    pub availability_zone: String,
    pub upfront_fee: Decimal,
}

/// The emulator's own hyperparameter: how many seconds of training a job's work takes
/// ([`TrainingJob::work_left`]). SageMaker passes hyperparameters to the algorithm; what a
/// job does with its time is the algorithm's, so the emulator is told.
pub const WORK_SECONDS: &str = "local-work-seconds";

/// A training job.
#[derive(Debug, Clone, Serialize)]
pub struct TrainingJob {
    pub name: String,
    pub arn: String,
    pub region: String,
    pub created: DateTime<Utc>,
    pub modified: DateTime<Utc>,
    pub status: String,
    pub secondary: String,
    pub failure_reason: Option<String>,
    pub instance_type: String,
    pub instance_count: i64,
    pub plan_arn: Option<String>,
    /// What is left of its `MaxRuntimeInSeconds` (plan time trained so far deducted).
    pub remaining_seconds: i64,
    /// What is left of its work, from the emulator's hyperparameter [`WORK_SECONDS`]: the
    /// job completes once it has trained that long. `None`: its work outlasts any runtime
    /// (the harsher reading), so it trains until its `MaxRuntimeInSeconds` and is then
    /// `Stopped` (`MaxRuntimeExceeded`), as SageMaker ends a job at its time limit.
    pub work_left: Option<i64>,
    pub resumed_at: Option<DateTime<Utc>>,
    pub waiting_since: Option<DateTime<Utc>>,
    pub training_start: Option<DateTime<Utc>>,
    pub training_end: Option<DateTime<Utc>>,
    pub stop_at: Option<DateTime<Utc>>,
    pub transitions: Vec<(String, DateTime<Utc>, String)>,
    pub request: Value,
}

/// A HyperPod instance group.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceGroup {
    pub name: String,
    /// The type its nodes run: `InstanceType`, or for a flexible group (`InstanceRequirements`)
    /// the plan's type when the group lists it, else the first type listed.
    pub instance_type: String,
    pub target: i64,
    pub plan_arn: Option<String>,
    /// The `ClusterInstanceGroupSpecification` CreateCluster / UpdateCluster accepted: the
    /// desired settings, reported by DescribeCluster under the `ClusterInstanceGroupDetails`
    /// names.
    pub request: Value,
    /// The specification in effect: none while the cluster is `Creating` or the group is
    /// being added, the one before the update while `Updating`, else `request`. DescribeCluster
    /// reports its `Current*` fields (`CurrentImageId`, `CurrentLabels`, …) from it.
    pub current: Option<Value>,
    /// Named in an UpdateCluster's `InstanceGroupsToDelete`: no nodes, described with
    /// `Status` `Deleting` while the cluster is `Updating`, gone when it is `InService`.
    pub deleting: bool,
}

/// A HyperPod node.
#[derive(Debug, Clone, Serialize)]
pub struct Node {
    pub group: String,
    pub instance_id: String,
    pub instance_type: String,
    pub launch_time: DateTime<Utc>,
}

/// A HyperPod cluster.
#[derive(Debug, Clone, Serialize)]
pub struct Cluster {
    pub name: String,
    pub arn: String,
    pub region: String,
    pub created: DateTime<Utc>,
    pub status: String,
    pub status_until: DateTime<Utc>,
    pub groups: Vec<InstanceGroup>,
    pub nodes: Vec<Node>,
}

/// One production variant of an endpoint config.
#[derive(Debug, Clone, Serialize)]
pub struct Variant {
    pub name: String,
    pub instance_type: String,
    pub count: i64,
    pub plan_arn: Option<String>,
    pub request: Value,
}

/// A model (CreateModel): what an endpoint config's variants name.
#[derive(Debug, Clone, Serialize)]
pub struct Model {
    pub name: String,
    pub arn: String,
    pub created: DateTime<Utc>,
    pub execution_role_arn: Option<String>,
}

/// An endpoint config.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointConfig {
    pub name: String,
    pub arn: String,
    pub created: DateTime<Utc>,
    pub variants: Vec<Variant>,
}

/// An endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Endpoint {
    pub name: String,
    pub arn: String,
    pub region: String,
    pub config_name: String,
    pub created: DateTime<Utc>,
    pub modified: DateTime<Utc>,
    pub ready_at: DateTime<Utc>,
    pub status: String,
    pub failure_reason: Option<String>,
    pub variants: Vec<Variant>,
    /// When a `Deleting` endpoint is gone.
    pub delete_at: Option<DateTime<Utc>>,
    /// The status it had when DeleteEndpoint was called: an endpoint deleted `InService`
    /// keeps its instances until it is gone.
    pub deleted_from: Option<String>,
}

impl Endpoint {
    /// Whether the endpoint's instances are in use (its plan's or the on-demand pool's).
    fn holds_instances(&self) -> bool {
        self.status == "InService"
            || (self.status == "Deleting" && self.deleted_from.as_deref() == Some("InService"))
    }
}

type Key = (String, String);

/// All SageMaker resources, keyed by (region, name).
#[derive(Debug, Default)]
pub struct SageMakerState {
    pub offerings: HashMap<String, PlanOffering>,
    pub consumed_offerings: HashSet<String>,
    /// Extension offerings answered by a search with `TrainingPlanArn`, by id.
    pub extension_offerings: HashMap<String, PlanExtensionOffering>,
    /// Extension offerings already bought (each can be bought once).
    pub consumed_extension_offerings: HashSet<String>,
    pub plans: BTreeMap<Key, Plan>,
    pub jobs: BTreeMap<Key, TrainingJob>,
    pub clusters: BTreeMap<Key, Cluster>,
    pub models: BTreeMap<Key, Model>,
    pub endpoint_configs: BTreeMap<Key, EndpointConfig>,
    pub endpoints: BTreeMap<Key, Endpoint>,
    /// Tags by resource ARN, in the order they were added (`Tags` on a create, `AddTags`).
    pub tags: BTreeMap<String, Vec<(String, String)>>,
}

impl SageMakerState {
    pub fn snapshot(&self) -> Value {
        json!({
            "training_plans": self.plans.values().collect::<Vec<_>>(),
            "training_jobs": self.jobs.values().collect::<Vec<_>>(),
            "clusters": self.clusters.values().collect::<Vec<_>>(),
            "models": self.models.values().collect::<Vec<_>>(),
            "endpoint_configs": self.endpoint_configs.values().collect::<Vec<_>>(),
            "endpoints": self.endpoints.values().collect::<Vec<_>>(),
            "tags": self.tags,
        })
    }
}

/// A plan's status at `now`: Pending until paid, Active inside a segment, Scheduled before and
/// between segments, Expired after the last.
pub fn plan_status(p: &Plan, now: DateTime<Utc>) -> &'static str {
    if payment_failed(p, now) {
        return "Failed";
    }
    if now < p.paid_at {
        return "Pending";
    }
    let segs = &p.offering.segments;
    if segs.iter().any(|s| s.start <= now && now < s.end) {
        "Active"
    } else if now < segs[segs.len() - 1].end {
        "Scheduled"
    } else {
        "Expired"
    }
}

/// Whether a plan's payment has failed by `now`.
fn payment_failed(p: &Plan, now: DateTime<Utc>) -> bool {
    p.failed || (p.fail_payment && now >= p.paid_at)
}

fn segment_at(p: &Plan, now: DateTime<Utc>) -> Option<usize> {
    p.offering
        .segments
        .iter()
        .position(|s| s.start <= now && now < s.end)
}

fn missing(field: &str) -> ApiError {
    ApiError::validation(format!(
        "1 validation error detected: Value null at '{}' failed to satisfy constraint: Member must not be null",
        lower_first(field)
    ))
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

fn s<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn req<'a>(v: &'a Value, key: &str) -> Result<&'a str, ApiError> {
    s(v, key).ok_or_else(|| missing(key))
}

fn int(v: &Value, key: &str) -> Option<i64> {
    v.get(key).and_then(Value::as_i64)
}

fn time(v: &Value, key: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => {
            let secs = x
                .as_f64()
                .ok_or_else(|| ApiError::validation(format!("{key} must be a timestamp")))?;
            Ok(DateTime::from_timestamp_millis(
                (secs * 1000.0).round() as i64
            ))
        }
    }
}

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

fn check_name(name: &str, field: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::validation(format!(
            "1 validation error detected: Value '{name}' at '{}' failed to satisfy constraint: Member must satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){{0,62}}",
            lower_first(field)
        )))
    }
}

/// Drops nulls (absent members are omitted on the wire, never sent as null).
pub fn clean(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, clean(v)))
                .collect::<Map<_, _>>(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(clean).collect()),
        other => other,
    }
}

fn page(
    items: Vec<Value>,
    input: &Value,
    default_max: usize,
) -> Result<(Vec<Value>, Option<String>), ApiError> {
    let start = match s(input, "NextToken") {
        None => 0,
        Some(t) => t
            .strip_prefix("lc1-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n <= items.len())
            .ok_or_else(|| ApiError::validation(format!("Invalid pagination token {t}")))?,
    };
    let max = int(input, "MaxResults").map_or(default_max, |m| m.clamp(1, 100) as usize);
    let total = items.len();
    let out: Vec<Value> = items.into_iter().skip(start).take(max).collect();
    let next = (start + out.len() < total).then(|| format!("lc1-{}", start + out.len()));
    Ok((out, next))
}

/// A `ClusterInstanceGroupDetails` from the accepted `ClusterInstanceGroupSpecification`
/// (`spec`, the desired settings) and the one in effect (`current`), under DescribeCluster's
/// names (botocore `sagemaker` model; aws-reference §11.2 "map each field"). Counts, name,
/// type, plan and status are the caller's.
fn group_details(spec: &Value, current: Option<&Value>) -> Map<String, Value> {
    let mut d = Map::new();
    let get = |v: Option<&Value>, path: &[&str]| -> Option<Value> {
        let mut v = v?;
        for k in path {
            v = v.get(*k)?;
        }
        (!v.is_null()).then(|| v.clone())
    };
    let spec = Some(spec);
    for k in [
        "LifeCycleConfig",
        "ExecutionRole",
        "ThreadsPerCore",
        "InstanceStorageConfigs",
        "OnStartDeepHealthChecks",
        "OverrideVpcConfig",
        "ScheduledUpdateConfig",
        "SlurmConfig",
        "CapacityRequirements",
        "NetworkInterface",
    ] {
        if let Some(v) = get(spec, &[k]) {
            d.insert(k.into(), v);
        }
    }
    let put = |d: &mut Map<String, Value>, name: &str, v: Option<Value>| {
        if let Some(v) = v {
            d.insert(name.into(), v);
        }
    };
    put(&mut d, "MinCount", get(spec, &["MinInstanceCount"]));
    put(&mut d, "DesiredImageId", get(spec, &["ImageId"]));
    put(&mut d, "CurrentImageId", get(current, &["ImageId"]));
    put(
        &mut d,
        "DesiredImageReleaseVersion",
        get(spec, &["ImageReleaseVersion"]),
    );
    put(
        &mut d,
        "CurrentImageReleaseVersion",
        get(current, &["ImageReleaseVersion"]),
    );
    let nested = |pairs: &[(&str, Option<&Value>, &[&str])]| -> Option<Value> {
        let m: Map<String, Value> = pairs
            .iter()
            .filter_map(|(name, from, path)| Some((name.to_string(), get(*from, path)?)))
            .collect();
        (!m.is_empty()).then_some(Value::Object(m))
    };
    let k8s = nested(&[
        ("CurrentLabels", current, &["KubernetesConfig", "Labels"]),
        ("DesiredLabels", spec, &["KubernetesConfig", "Labels"]),
        ("CurrentTaints", current, &["KubernetesConfig", "Taints"]),
        ("DesiredTaints", spec, &["KubernetesConfig", "Taints"]),
    ]);
    put(&mut d, "KubernetesConfig", k8s);
    let types = nested(&[
        (
            "CurrentInstanceTypes",
            current,
            &["InstanceRequirements", "InstanceTypes"],
        ),
        (
            "DesiredInstanceTypes",
            spec,
            &["InstanceRequirements", "InstanceTypes"],
        ),
    ]);
    put(&mut d, "InstanceRequirements", types);
    let patch = nested(&[
        (
            "PatchingStrategy",
            spec,
            &["AutoPatchConfig", "PatchingStrategy"],
        ),
        (
            "CurrentPatchSchedule",
            current,
            &["AutoPatchConfig", "PatchSchedule"],
        ),
        (
            "DesiredPatchSchedule",
            spec,
            &["AutoPatchConfig", "PatchSchedule"],
        ),
        (
            "DeploymentConfig",
            spec,
            &["AutoPatchConfig", "DeploymentConfig"],
        ),
    ]);
    put(&mut d, "AutoPatchConfig", patch);
    d
}

impl World {
    /// Routes one SageMaker operation.
    pub fn sagemaker_call(
        &mut self,
        region: &str,
        op: &str,
        input: &Value,
    ) -> Result<Value, ApiError> {
        self.settle();
        let out = match op {
            "SearchTrainingPlanOfferings" => self.search_plan_offerings(region, input),
            "CreateTrainingPlan" => self.create_plan(region, input),
            "DescribeTrainingPlan" => self.describe_plan(region, input),
            "ListTrainingPlans" => self.list_plans(region, input),
            "ExtendTrainingPlan" => self.extend_training_plan(region, input),
            "DescribeTrainingPlanExtensionHistory" => {
                self.describe_plan_extension_history(region, input)
            }
            "CreateTrainingJob" => self.create_job(region, input),
            "DescribeTrainingJob" => self.describe_job(region, input),
            "StopTrainingJob" => self.stop_job(region, input),
            "CreateCluster" => self.create_cluster(region, input),
            "UpdateCluster" => self.update_cluster(region, input),
            "DescribeCluster" => self.describe_cluster(region, input),
            "ListClusterNodes" => self.list_cluster_nodes(region, input),
            "CreateModel" => self.create_model(region, input),
            "DescribeModel" => self.describe_model(region, input),
            "DeleteModel" => self.delete_model(region, input),
            "CreateEndpointConfig" => self.create_endpoint_config(region, input),
            "CreateEndpoint" => self.create_endpoint(region, input),
            "DescribeEndpointConfig" => self.describe_endpoint_config(region, input),
            "DescribeEndpoint" => self.describe_endpoint(region, input),
            "DeleteEndpoint" => self.delete_endpoint(region, input),
            "DeleteEndpointConfig" => self.delete_endpoint_config(region, input),
            "AddTags" => self.add_tags(region, input),
            "ListTags" => self.list_tags(region, input),
            "DeleteTags" => self.delete_tags(region, input),
            other => Err(ApiError::new(
                400,
                "UnknownOperationException",
                format!("Operation {other} is not supported by local-cloud"),
            )),
        }?;
        // a create may have made work due right now (e.g. a job on an active plan)
        self.sagemaker_sync();
        Ok(clean(out))
    }

    fn search_plan_offerings(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        if let Some(arn) = s(input, "TrainingPlanArn") {
            let hours = int(input, "DurationHours").ok_or_else(|| missing("DurationHours"))?;
            let offerings: Vec<Value> = self
                .plan_extension_offering(region, arn, hours)?
                .ok()
                .iter()
                .map(|o| {
                    json!({
                        "TrainingPlanExtensionOfferingId": o.id,
                        "AvailabilityZone": o.availability_zone,
                        "StartDate": epoch(o.start),
                        "EndDate": epoch(o.end),
                        "DurationHours": o.hours,
                        "UpfrontFee": o.upfront_fee.to_string(),
                        "CurrencyCode": "USD",
                    })
                })
                .collect();
            return Ok(json!({
                "TrainingPlanOfferings": [],
                "TrainingPlanExtensionOfferings": offerings,
            }));
        }
        let targets: Vec<&str> = input
            .get("TargetResources")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if targets.len() != 1 {
            return Err(ApiError::validation(
                "TargetResources must name exactly one target resource",
            ));
        }
        let q = PlanSearch {
            region: region.to_string(),
            instance_type: req(input, "InstanceType")?.to_string(),
            instance_count: int(input, "InstanceCount").ok_or_else(|| missing("InstanceCount"))?,
            duration_hours: int(input, "DurationHours").ok_or_else(|| missing("DurationHours"))?,
            start_after: time(input, "StartTimeAfter")?,
            end_before: time(input, "EndTimeBefore")?,
            target: targets[0].to_string(),
        };
        if self.market.type_spec(&q.instance_type).is_some()
            && !self.market.sold_in(&q.instance_type, region)
        {
            return match self.settings.plan_unsupported {
                crate::world::PlanUnsupported::Empty => Ok(json!({"TrainingPlanOfferings": []})),
                crate::world::PlanUnsupported::Error => Err(ApiError::validation(format!(
                    "The instance type {} is not supported for training plans in {region}",
                    q.instance_type
                ))),
            };
        }
        let offerings = self.market.search_plans(self.now, &q)?;
        let out: Vec<Value> = offerings
            .iter()
            .map(|o| {
                json!({
                    "TrainingPlanOfferingId": o.id,
                    "TargetResources": [o.target],
                    "RequestedStartTimeAfter": o.requested_start_after.map(epoch),
                    "RequestedEndTimeBefore": o.requested_end_before.map(epoch),
                    "DurationHours": o.total_hours(),
                    "DurationMinutes": o.extra_minutes(),
                    "UpfrontFee": o.upfront_fee.to_string(),
                    "CurrencyCode": "USD",
                    "ReservedCapacityOfferings": o.segments.iter().map(|sg| json!({
                        "ReservedCapacityType": "Instance",
                        "InstanceType": o.instance_type,
                        "InstanceCount": o.instance_count,
                        "AvailabilityZone": sg.availability_zone,
                        "DurationHours": sg.hours(),
                        "DurationMinutes": sg.extra_minutes(),
                        "StartTime": epoch(sg.start),
                        "EndTime": epoch(sg.end),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        for o in offerings {
            self.sm.offerings.insert(o.id.clone(), o);
        }
        Ok(json!({"TrainingPlanOfferings": out}))
    }

    fn create_plan(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "TrainingPlanName")?.to_string();
        check_name(&name, "TrainingPlanName")?;
        let tags = parse_tags(input)?;
        let offering_id = req(input, "TrainingPlanOfferingId")?.to_string();
        // Names ignoring case (*harsher*: sources silent for plans; endpoints' are documented
        // case-insensitive): a plan is kept under its name lower-cased, and shown as given.
        let key = (region.to_string(), name.to_ascii_lowercase());
        if self.sm.plans.contains_key(&key) {
            return Err(ApiError::in_use(format!(
                "Training plan {name} already exists"
            )));
        }
        if self.sm.plans.len() >= self.settings.max_training_plans {
            return Err(ApiError::new(
                400,
                "ResourceLimitExceeded",
                format!(
                    "The account-level service limit of {} training plans has been reached",
                    self.settings.max_training_plans
                ),
            ));
        }
        let gone = || {
            ApiError::not_found(format!(
                "Training plan offering {offering_id} is not available"
            ))
        };
        let offering = self
            .sm
            .offerings
            .get(&offering_id)
            .filter(|o| o.region == region)
            .cloned()
            .ok_or_else(gone)?;
        if (self.settings.single_use_offerings && self.sm.consumed_offerings.contains(&offering_id))
            || offering.start() <= self.now + TimeDelta::minutes(5)
        {
            return Err(gone());
        }
        for sg in &offering.segments {
            let free = self.market.free_between(
                Pool::TrainingPlan,
                region,
                &sg.availability_zone,
                &offering.instance_type,
                sg.start,
                sg.end,
            );
            if i64::from(free) < offering.instance_count {
                return Err(gone());
            }
        }
        for sg in &offering.segments {
            self.market.consume(
                Pool::TrainingPlan,
                region,
                &sg.availability_zone,
                &offering.instance_type,
                (sg.start, sg.end),
                offering.instance_count,
            );
        }
        self.sm.consumed_offerings.insert(offering_id);
        let arn = self.arn("sagemaker", region, &format!("training-plan/{name}"));
        let mut rcs = Vec::new();
        for _ in &offering.segments {
            let id = self.next_id("rc-");
            rcs.push(self.arn("sagemaker", region, &format!("reserved-capacity/{id}")));
        }
        // payment clears at most 6 h after the purchase and 10 min before the first segment
        // (ARCHITECTURE §8.10)
        let paid_at =
            self.payment_time(offering.start() - TimeDelta::minutes(PAYMENT_LEAD_MINUTES));
        let fail_payment = self.take_payment_failure(
            tags.iter()
                .find(|(k, _)| k == REQUEST_TAG)
                .map(|(_, v)| v.as_str()),
        );
        let mut times = vec![paid_at];
        for sg in &offering.segments {
            times.extend([
                sg.start,
                sg.end,
                sg.end - TimeDelta::minutes(self.settings.training_job_termination_lead_minutes),
                sg.end - TimeDelta::minutes(self.settings.hyperpod_termination_lead_minutes),
            ]);
        }
        for t in times {
            let t = t.max(self.now);
            self.schedule(t, Action::SageMakerSync);
        }
        tracing::info!(training_plan = %name, upfront_fee = %offering.upfront_fee, "training plan created");
        self.sm.plans.insert(
            key,
            Plan {
                name,
                arn: arn.clone(),
                region: region.to_string(),
                offering,
                created: self.now,
                paid_at,
                fail_payment,
                failed: false,
                reserved_capacity_arns: rcs,
                extensions: Vec::new(),
            },
        );
        self.put_tags(&arn, tags);
        Ok(json!({"TrainingPlanArn": arn}))
    }

    /// Control: a plan's payment fails, at its payment time, while it is still `Pending`; then
    /// it is `Failed` and its capacity is released.
    pub fn fail_plan_payment(&mut self, region: &str, name: &str) -> Result<(), ApiError> {
        let now = self.now;
        let key = (region.to_string(), name.to_ascii_lowercase());
        let plan =
            self.sm.plans.get_mut(&key).ok_or_else(|| {
                ApiError::new(404, "NotFound", format!("no training plan {name}"))
            })?;
        if now >= plan.paid_at || plan.failed {
            return Err(ApiError::new(
                400,
                "NotPending",
                format!("training plan {name} is no longer Pending"),
            ));
        }
        plan.fail_payment = true;
        Ok(())
    }

    /// Control: extends training plan `name` by `hours`, as a team would by hand in the
    /// console, the way `ExtendTrainingPlan` does: the offering a search with the plan's ARN
    /// would answer ([`World::plan_extension_offering`]: its rules and refusals), then its
    /// purchase ([`World::buy_plan_extension`]); no offering (the search's empty list) is
    /// `NoExtensionOffering`. Not counted as an API call and not subject to injected faults.
    pub fn extend_plan(
        &mut self,
        region: &str,
        name: &str,
        hours: i64,
    ) -> Result<PlanExtension, ApiError> {
        self.settle();
        let offering = self
            .plan_extension_offering(region, name, hours)?
            .map_err(|why| {
                ApiError::new(
                    400,
                    "NoExtensionOffering",
                    format!(
                        "No extension of {hours} hours is offered for training plan {name}: {why}"
                    ),
                )
            })?;
        let ext = self.buy_plan_extension(region, &offering.id, true)?;
        tracing::info!(training_plan = %name, hours, upfront_fee = %ext.upfront_fee, "training plan extended by hand");
        Ok(ext)
    }

    /// The extension of `hours` training plan `name_or_arn` can be offered now, recorded so
    /// that it can be bought: its last reserved capacity gains `hours` from the plan's end, in
    /// its zone. The plan must be `Scheduled` or `Active` ("must reference an existing
    /// training plan with status Active or Scheduled") with no extension still being paid,
    /// `hours` whole days (every reserved capacity ends at 11:30 UTC), the plan 182 days at
    /// most with them; else `ValidationException` (an unknown plan `ResourceNotFound`).
    /// `Ok(Err(why))`: none is offered (the search's empty list): asked outside 56 days to
    /// 1 hour before the end (the Capacity Block rule; SageMaker's sources are silent), or no
    /// capacity in the zone. Priced as a plan (`hours` × count × the plan hourly price).
    pub fn plan_extension_offering(
        &mut self,
        region: &str,
        name_or_arn: &str,
        hours: i64,
    ) -> Result<Result<PlanExtensionOffering, &'static str>, ApiError> {
        let p = self.plan(region, name_or_arn).cloned().ok_or_else(|| {
            ApiError::not_found(format!("Training plan {name_or_arn} does not exist"))
        })?;
        let name = &p.name;
        let status = plan_status(&p, self.now);
        if !matches!(status, "Scheduled" | "Active") {
            return Err(ApiError::validation(format!(
                "Training plan {name} is {status}; only a Scheduled or Active training plan can be extended"
            )));
        }
        if p.extensions.iter().any(PlanExtension::pending) {
            return Err(ApiError::validation(format!(
                "Training plan {name} has an extension whose payment is still pending"
            )));
        }
        let end = p.offering.end();
        let new_end = end + TimeDelta::hours(hours);
        if hours <= 0 || hours % 24 != 0 {
            return Err(ApiError::validation(format!(
                "Invalid extension of {hours} hours: a training plan is extended by whole days (24-hour multiples)"
            )));
        }
        if new_end - p.offering.start() > TimeDelta::days(182) {
            return Err(ApiError::validation(format!(
                "Invalid extension of {hours} hours: training plan {name} would last more than 182 days"
            )));
        }
        if self.now < end - TimeDelta::days(56) || self.now > end - TimeDelta::hours(1) {
            return Ok(Err(
                "an extension is offered between 56 days and 1 hour before the plan's end",
            ));
        }
        let o = &p.offering;
        let az = o.segments[o.segments.len() - 1].availability_zone.clone();
        let free = self.market.free_between(
            Pool::TrainingPlan,
            region,
            &az,
            &o.instance_type,
            end,
            new_end,
        );
        if i64::from(free) < o.instance_count {
            return Ok(Err("its zone has no capacity for the added days"));
        }
        let added = Segment {
            availability_zone: az.clone(),
            start: end,
            end: new_end,
        };
        let hourly =
            self.market
                .plan_hourly(region, std::slice::from_ref(&added), &o.instance_type);
        let fee = (hourly * Decimal::from(hours) * Decimal::from(o.instance_count)).round_dp(2);
        let offering = PlanExtensionOffering {
            id: self.next_id("tpeo-"),
            region: region.to_string(),
            plan: (region.to_string(), p.name.to_ascii_lowercase()),
            start: end,
            end: new_end,
            hours,
            availability_zone: az,
            upfront_fee: fee,
        };
        self.sm
            .extension_offerings
            .insert(offering.id.clone(), offering.clone());
        Ok(Ok(offering))
    }

    /// Buys extension offering `offering_id` (`ExtendTrainingPlan`, or by hand): an unknown
    /// or already bought offering, or one whose plan is no longer `Scheduled`/`Active`, has an
    /// extension still being paid, has moved its end or whose zone has lost the capacity, is
    /// `ValidationException`. The extension is `Pending` and is paid like a block's
    /// ([`World::extension_payment`]: `payment_minutes`, no later than 35 minutes before the
    /// end, or it fails); then the last segment's `EndTime` (and the plan's `EndTime`,
    /// `DurationHours`/`DurationMinutes`), the fee and what follows the end (jobs, nodes,
    /// endpoints) move. A failed payment keeps the end and returns the capacity.
    pub fn buy_plan_extension(
        &mut self,
        region: &str,
        offering_id: &str,
        by_hand: bool,
    ) -> Result<PlanExtension, ApiError> {
        let offering = self
            .sm
            .extension_offerings
            .get(offering_id)
            .filter(|o| o.region == region)
            .cloned()
            .ok_or_else(|| {
                ApiError::validation(format!(
                    "Training plan extension offering {offering_id} does not exist"
                ))
            })?;
        if self.sm.consumed_extension_offerings.contains(offering_id) {
            return Err(ApiError::validation(format!(
                "Training plan extension offering {offering_id} has already been used"
            )));
        }
        let p = self.sm.plans.get(&offering.plan).cloned().ok_or_else(|| {
            ApiError::not_found(format!("Training plan {} does not exist", offering.plan.1))
        })?;
        let status = plan_status(&p, self.now);
        if !matches!(status, "Scheduled" | "Active") {
            return Err(ApiError::validation(format!(
                "Training plan {} is {status}; only a Scheduled or Active training plan can be extended",
                p.name
            )));
        }
        if p.extensions.iter().any(PlanExtension::pending) {
            return Err(ApiError::validation(format!(
                "Training plan {} has an extension whose payment is still pending",
                p.name
            )));
        }
        let o = &p.offering;
        let free = self.market.free_between(
            Pool::TrainingPlan,
            region,
            &offering.availability_zone,
            &o.instance_type,
            offering.start,
            offering.end,
        );
        if offering.start != o.end() || i64::from(free) < o.instance_count {
            return Err(ApiError::validation(format!(
                "Training plan extension offering {offering_id} is no longer available"
            )));
        }
        self.market.consume(
            Pool::TrainingPlan,
            region,
            &offering.availability_zone,
            &o.instance_type,
            (offering.start, offering.end),
            o.instance_count,
        );
        self.sm
            .consumed_extension_offerings
            .insert(offering_id.to_string());
        let (paid_at, fail_payment) = self.extension_payment(&p.arn, offering.start);
        let ext = PlanExtension {
            offering_id: offering_id.to_string(),
            hours: offering.hours,
            start: offering.start,
            end: offering.end,
            availability_zone: offering.availability_zone.clone(),
            upfront_fee: offering.upfront_fee,
            extended_at: self.now,
            paid_at,
            paid: false,
            fail_payment,
            failed: false,
            by_hand,
        };
        self.sm
            .plans
            .get_mut(&offering.plan)
            .expect("found above")
            .extensions
            .push(ext.clone());
        self.schedule(paid_at, Action::SageMakerSync);
        Ok(ext)
    }

    /// A `TrainingPlanExtension` as `ExtendTrainingPlan` and the history answer it.
    fn plan_extension_json(&self, region: &str, e: &PlanExtension) -> Value {
        json!({
            "TrainingPlanExtensionOfferingId": e.offering_id,
            "ExtendedAt": epoch(e.extended_at),
            "StartDate": epoch(e.start),
            "EndDate": epoch(e.end),
            "Status": e.status(),
            "PaymentStatus": e.payment_status(),
            "AvailabilityZone": e.availability_zone,
            "AvailabilityZoneId": self.zone_id(region, &e.availability_zone),
            "DurationHours": e.hours,
            "UpfrontFee": e.upfront_fee.to_string(),
            "CurrencyCode": "USD",
        })
    }

    fn extend_training_plan(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let id = req(input, "TrainingPlanExtensionOfferingId")?.to_string();
        let ext = self.buy_plan_extension(region, &id, false)?;
        tracing::info!(offering = %id, hours = ext.hours, upfront_fee = %ext.upfront_fee, "training plan extended");
        Ok(json!({"TrainingPlanExtensions": [self.plan_extension_json(region, &ext)]}))
    }

    /// The plan's extensions (API or by hand), oldest first, each once
    /// [`crate::world::Settings::listing_lag_seconds`] have passed since its purchase; a plan
    /// inside its own listing lag, or unknown, is `ResourceNotFound`.
    fn describe_plan_extension_history(
        &mut self,
        region: &str,
        input: &Value,
    ) -> Result<Value, ApiError> {
        let arn = req(input, "TrainingPlanArn")?;
        let p = self
            .plan(region, arn)
            .filter(|p| self.listed(p.created))
            .ok_or_else(|| ApiError::not_found(format!("Training plan {arn} does not exist")))?;
        let items: Vec<Value> = p
            .extensions
            .iter()
            .filter(|e| self.listed(e.extended_at))
            .map(|e| self.plan_extension_json(region, e))
            .collect();
        let (items, next) = page(items, input, 100)?;
        Ok(json!({"TrainingPlanExtensions": items, "NextToken": next}))
    }

    /// Applies each plan extension whose payment is due: the last segment ends later, the fee
    /// grows, and the work that follows the end is scheduled for the new end.
    fn apply_due_plan_extensions(&mut self) {
        let now = self.now;
        let job_lead = TimeDelta::minutes(self.settings.training_job_termination_lead_minutes);
        let node_lead = TimeDelta::minutes(self.settings.hyperpod_termination_lead_minutes);
        let mut times = Vec::new();
        let mut released = Vec::new();
        for p in self.sm.plans.values_mut() {
            for i in 0..p.extensions.len() {
                let e = &p.extensions[i];
                if !e.pending() || now < e.paid_at || p.failed {
                    continue;
                }
                if e.fail_payment {
                    released.push((
                        p.region.clone(),
                        e.availability_zone.clone(),
                        p.offering.instance_type.clone(),
                        (e.start, e.end),
                        -p.offering.instance_count,
                    ));
                    p.extensions[i].failed = true;
                    tracing::info!(training_plan = %p.name, "training plan extension payment failed");
                    continue;
                }
                let (end, fee) = (e.end, e.upfront_fee);
                p.extensions[i].paid = true;
                let last = p.offering.segments.len() - 1;
                p.offering.segments[last].end = end;
                p.offering.upfront_fee += fee;
                times.extend([end, end - job_lead, end - node_lead]);
            }
        }
        for t in times {
            self.schedule(t.max(now), Action::SageMakerSync);
        }
        for (region, az, ty, window, count) in released {
            self.market
                .consume(Pool::TrainingPlan, &region, &az, &ty, window, count);
        }
    }

    /// Fails each plan whose forced payment failure is due, releasing its capacity.
    fn fail_due_plan_payments(&mut self) {
        let now = self.now;
        let due: Vec<Key> = self
            .sm
            .plans
            .iter()
            .filter(|(_, p)| p.fail_payment && !p.failed && now >= p.paid_at)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            let Some(plan) = self.sm.plans.get_mut(&key) else {
                continue;
            };
            plan.failed = true;
            let p = plan.clone();
            tracing::info!(training_plan = %p.name, "training plan payment failed");
            for sg in &p.offering.segments {
                self.market.consume(
                    Pool::TrainingPlan,
                    &p.region,
                    &sg.availability_zone,
                    &p.offering.instance_type,
                    (sg.start, sg.end),
                    -p.offering.instance_count,
                );
            }
        }
    }

    /// Control: marks a HyperPod node unhealthy (or healthy again) and emits the node health
    /// event. Returns false when no cluster has a node with this id.
    pub(crate) fn impair_node(&mut self, instance_id: &str, impaired: bool) -> bool {
        let Some(c) = self
            .sm
            .clusters
            .values()
            .find(|c| c.nodes.iter().any(|n| n.instance_id == instance_id))
            .cloned()
        else {
            return false;
        };
        let (status, reason, recommendation) = if impaired {
            (
                "Unhealthy",
                "HyperPod Health Monitoring Agent (HMA) has detected fault type NvidiaErrorTerminate on this node and is unhealthy.",
                "Please Replace the Faulty Node.",
            )
        } else {
            ("Healthy", "The node is healthy.", "None")
        };
        let region = c.region.clone();
        self.emit(
            &region,
            "aws.sagemaker",
            "SageMaker HyperPod Cluster Node Health Event",
            vec![c.arn.clone()],
            json!({
                "ClusterName": c.name,
                "ClusterArn": c.arn,
                "InstanceId": instance_id,
                "Tags": {},
                "HealthSummary": {
                    "HealthStatus": status,
                    "HealthStatusReason": reason,
                    "RepairAction": "None",
                    "Recommendation": recommendation,
                },
            }),
        );
        true
    }

    /// Finds a plan by name or ARN.
    fn plan(&self, region: &str, name_or_arn: &str) -> Option<&Plan> {
        let name = name_or_arn.rsplit('/').next().unwrap_or(name_or_arn);
        self.sm
            .plans
            .get(&(region.to_string(), name.to_ascii_lowercase()))
    }

    /// Instances of a plan in use right now (training, nodes, endpoints).
    fn plan_in_use(&self, arn: &str) -> i64 {
        let jobs: i64 = self
            .sm
            .jobs
            .values()
            .filter(|j| j.plan_arn.as_deref() == Some(arn) && j.secondary == "Training")
            .map(|j| j.instance_count)
            .sum();
        let nodes = self
            .sm
            .clusters
            .values()
            .flat_map(|c| {
                c.nodes.iter().filter(|n| {
                    c.groups
                        .iter()
                        .any(|g| g.name == n.group && g.plan_arn.as_deref() == Some(arn))
                })
            })
            .count() as i64;
        let endpoints: i64 = self
            .sm
            .endpoints
            .values()
            .filter(|e| e.holds_instances())
            .flat_map(|e| e.variants.iter())
            .filter(|v| v.plan_arn.as_deref() == Some(arn))
            .map(|v| v.count)
            .sum();
        jobs + nodes + endpoints
    }

    fn plan_json(&self, p: &Plan, with_spare: bool) -> Value {
        let status = plan_status(p, self.now);
        let in_use = self.plan_in_use(&p.arn);
        let o = &p.offering;
        let available = if status == "Active" {
            (o.instance_count - in_use).max(0)
        } else {
            0
        };
        // The harsher reading of a `Pending` plan (sources silent; the model's minimum of
        // both is 0): no summaries and a count of 0 until it is paid.
        let bare = status == "Pending" && self.settings.pending_plan_without_capacities;
        let mut v = json!({
            "TrainingPlanArn": p.arn,
            "TrainingPlanName": p.name,
            "Status": status,
            "StatusMessage": match status {
                "Pending" => Some("Payment is being processed"),
                _ => None,
            },
            "DurationHours": o.total_hours(),
            "DurationMinutes": o.extra_minutes(),
            "StartTime": epoch(o.start()),
            "EndTime": epoch(o.end()),
            "UpfrontFee": o.upfront_fee.to_string(),
            "CurrencyCode": "USD",
            "TotalInstanceCount": if bare { 0 } else { o.instance_count },
            "AvailableInstanceCount": available,
            "InUseInstanceCount": in_use,
            "TargetResources": [o.target],
            "ReservedCapacitySummaries": o.segments.iter().zip(&p.reserved_capacity_arns).filter(|_| !bare).map(|(sg, arn)| {
                let rc_status = if payment_failed(p, self.now) { "Failed" }
                    else if self.now < p.paid_at { "Pending" }
                    else if self.now < sg.start { "Scheduled" }
                    else if self.now < sg.end { "Active" }
                    else { "Expired" };
                json!({
                    "ReservedCapacityArn": arn,
                    "ReservedCapacityType": "Instance",
                    "InstanceType": o.instance_type,
                    "TotalInstanceCount": o.instance_count,
                    "Status": rc_status,
                    "AvailabilityZone": sg.availability_zone,
                    "DurationHours": sg.hours(),
                    "DurationMinutes": sg.extra_minutes(),
                    "StartTime": epoch(sg.start),
                    "EndTime": epoch(sg.end),
                })
            }).collect::<Vec<_>>(),
        });
        if with_spare {
            v["AvailableSpareInstanceCount"] = json!(0);
            v["UnhealthyInstanceCount"] = json!(0);
        }
        v
    }

    fn describe_plan(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "TrainingPlanName")?;
        // a plan still inside the listing lag answers as an unknown name
        let p = self
            .plan(region, name)
            .filter(|p| self.listed(p.created))
            .ok_or_else(|| ApiError::not_found(format!("Training plan {name} does not exist")))?;
        Ok(self.plan_json(p, true))
    }

    fn list_plans(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let after = time(input, "StartTimeAfter")?;
        let before = time(input, "StartTimeBefore")?;
        let filters: Vec<(String, String)> = input
            .get("Filters")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|f| Some((s(f, "Name")?.to_string(), s(f, "Value")?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let mut plans: Vec<&Plan> = self
            .sm
            .plans
            .values()
            .filter(|p| p.region == region && self.listed(p.created))
            .filter(|p| after.is_none_or(|a| p.offering.start() >= a))
            .filter(|p| before.is_none_or(|b| p.offering.start() <= b))
            .filter(|p| {
                filters.iter().all(|(n, v)| match n.as_str() {
                    "Status" => plan_status(p, self.now) == v,
                    _ => true,
                })
            })
            .collect();
        let desc = s(input, "SortOrder") == Some("Descending");
        match s(input, "SortBy") {
            Some("TrainingPlanName") => plans.sort_by(|a, b| a.name.cmp(&b.name)),
            Some("StartTime") => plans.sort_by_key(|p| p.offering.start()),
            _ => plans.sort_by_key(|p| p.created),
        }
        if desc {
            plans.reverse();
        }
        let items: Vec<Value> = plans.iter().map(|p| self.plan_json(p, false)).collect();
        let (items, next) = page(items, input, 100)?;
        Ok(json!({"TrainingPlanSummaries": items, "NextToken": next}))
    }

    fn sm_on_demand_free(&self, region: &str, ty: &str) -> i64 {
        let total = self.market.on_demand_total(region, "sagemaker", ty, false);
        let jobs: i64 = self
            .sm
            .jobs
            .values()
            .filter(|j| {
                j.region == region
                    && j.plan_arn.is_none()
                    && j.instance_type == ty
                    && j.secondary == "Training"
            })
            .map(|j| j.instance_count)
            .sum();
        let endpoints: i64 = self
            .sm
            .endpoints
            .values()
            .filter(|e| e.region == region && e.holds_instances())
            .flat_map(|e| e.variants.iter())
            .filter(|v| v.plan_arn.is_none() && v.instance_type == ty)
            .map(|v| v.count)
            .sum();
        let nodes = self
            .sm
            .clusters
            .values()
            .filter(|c| c.region == region)
            .flat_map(|c| {
                c.nodes.iter().filter(|n| {
                    n.instance_type == ty
                        && c.groups
                            .iter()
                            .any(|g| g.name == n.group && g.plan_arn.is_none())
                })
            })
            .count() as i64;
        total - jobs - endpoints - nodes
    }

    /// Checks that a plan exists, serves `target` and has the given instance type.
    fn check_plan(
        &self,
        region: &str,
        arn: &str,
        target: &str,
        instance_type: &str,
    ) -> Result<Plan, ApiError> {
        let p = self
            .sm
            .plans
            .values()
            .find(|p| p.arn == arn && p.region == region)
            .cloned()
            .ok_or_else(|| ApiError::validation(format!("Training plan {arn} does not exist")))?;
        if p.offering.target != target {
            return Err(ApiError::validation(format!(
                "Training plan {arn} was reserved for {} and cannot be used for {target}",
                p.offering.target
            )));
        }
        if p.offering.instance_type != instance_type {
            return Err(ApiError::validation(format!(
                "Instance type {instance_type} does not match training plan {arn} ({})",
                p.offering.instance_type
            )));
        }
        Ok(p)
    }

    fn create_job(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "TrainingJobName")?.to_string();
        check_name(&name, "TrainingJobName")?;
        let tags = parse_tags(input)?;
        req(input, "RoleArn")?;
        let out = input
            .get("OutputDataConfig")
            .ok_or_else(|| missing("OutputDataConfig"))?;
        req(out, "S3OutputPath").map_err(|_| missing("OutputDataConfig.S3OutputPath"))?;
        let algo = input
            .get("AlgorithmSpecification")
            .ok_or_else(|| missing("AlgorithmSpecification"))?;
        if s(algo, "TrainingImage").is_none() && s(algo, "AlgorithmName").is_none() {
            return Err(ApiError::validation(
                "AlgorithmSpecification must specify TrainingImage or AlgorithmName",
            ));
        }
        let rc = input
            .get("ResourceConfig")
            .ok_or_else(|| missing("ResourceConfig"))?;
        let instance_type = req(rc, "InstanceType")
            .map_err(|_| missing("ResourceConfig.InstanceType"))?
            .to_string();
        let count =
            int(rc, "InstanceCount").ok_or_else(|| missing("ResourceConfig.InstanceCount"))?;
        int(rc, "VolumeSizeInGB").ok_or_else(|| missing("ResourceConfig.VolumeSizeInGB"))?;
        if count < 1 {
            return Err(ApiError::validation(
                "ResourceConfig.InstanceCount must be at least 1",
            ));
        }
        let max_runtime = input
            .get("StoppingCondition")
            .and_then(|sc| int(sc, "MaxRuntimeInSeconds"))
            .ok_or_else(|| missing("StoppingCondition.MaxRuntimeInSeconds"))?;
        let key = (region.to_string(), name.clone());
        let arn = self.arn(
            "sagemaker",
            region,
            &format!("training-job/{}", name.to_lowercase()),
        );
        if self.sm.jobs.contains_key(&key) {
            return Err(ApiError::in_use(format!(
                "Training job names must be unique within an AWS account and region, and a training job with this name already exists ({arn})"
            )));
        }
        let plan_arn = s(rc, "TrainingPlanArn").map(str::to_string);
        if plan_arn.is_none()
            && let Some(r) = self.refusal(
                RefusalMarket::SagemakerTraining,
                region,
                None,
                &instance_type,
            )
        {
            return Err(self.refusal_error(r, None, &instance_type, count));
        }
        if let Some(pa) = &plan_arn {
            let p = self.check_plan(region, pa, "training-job", &instance_type)?;
            let st = plan_status(&p, self.now);
            if st != "Scheduled" && st != "Active" && st != "Pending" {
                return Err(ApiError::validation(format!(
                    "Training plan {pa} is {st}; it must be Scheduled or Active"
                )));
            }
            if count > p.offering.instance_count {
                return Err(ApiError::validation(format!(
                    "InstanceCount {count} exceeds training plan {pa}'s {} instances",
                    p.offering.instance_count
                )));
            }
        }
        let job = TrainingJob {
            name: name.clone(),
            arn: arn.clone(),
            region: region.to_string(),
            created: self.now,
            modified: self.now,
            status: "InProgress".to_string(),
            secondary: "Starting".to_string(),
            failure_reason: None,
            instance_type,
            instance_count: count,
            plan_arn,
            remaining_seconds: max_runtime,
            work_left: input
                .get("HyperParameters")
                .and_then(|h| s(h, WORK_SECONDS))
                .and_then(|w| w.parse().ok()),
            resumed_at: None,
            waiting_since: None,
            training_start: None,
            training_end: None,
            stop_at: None,
            transitions: vec![(
                "Starting".to_string(),
                self.now,
                "Starting the training job".to_string(),
            )],
            request: input.clone(),
        };
        self.sm.jobs.insert(key, job);
        self.put_tags(&arn, tags);
        let at = self.now + TimeDelta::seconds(self.settings.training_job_start_seconds);
        self.schedule(at, Action::SageMakerSync);
        self.job_event(region, &name);
        Ok(json!({"TrainingJobArn": arn}))
    }

    fn job_json(&self, j: &TrainingJob) -> Value {
        let r = &j.request;
        let mut transitions: Vec<Value> = Vec::new();
        for (i, (st, start, msg)) in j.transitions.iter().enumerate() {
            let end = j.transitions.get(i + 1).map(|t| epoch(t.1));
            transitions.push(json!({"Status": st, "StartTime": epoch(*start), "EndTime": end, "StatusMessage": msg}));
        }
        let output_path = r
            .get("OutputDataConfig")
            .and_then(|o| s(o, "S3OutputPath"))
            .unwrap_or("s3://local-cloud/output");
        json!({
            "TrainingJobName": j.name,
            "TrainingJobArn": j.arn,
            "TrainingJobStatus": j.status,
            "SecondaryStatus": j.secondary,
            "FailureReason": j.failure_reason,
            "ModelArtifacts": {"S3ModelArtifacts": format!("{}/{}/output/model.tar.gz", output_path.trim_end_matches('/'), j.name)},
            "AlgorithmSpecification": r.get("AlgorithmSpecification"),
            "RoleArn": r.get("RoleArn"),
            "InputDataConfig": r.get("InputDataConfig"),
            "OutputDataConfig": r.get("OutputDataConfig"),
            "ResourceConfig": r.get("ResourceConfig"),
            "StoppingCondition": r.get("StoppingCondition").cloned().unwrap_or_else(|| json!({})),
            "HyperParameters": r.get("HyperParameters"),
            "CreationTime": epoch(j.created),
            "TrainingStartTime": j.training_start.map(epoch),
            "TrainingEndTime": j.training_end.map(epoch),
            "LastModifiedTime": epoch(j.modified),
            "SecondaryStatusTransitions": transitions,
        })
    }

    fn job_key(region: &str, input: &Value) -> Result<Key, ApiError> {
        Ok((
            region.to_string(),
            req(input, "TrainingJobName")?.to_string(),
        ))
    }

    fn describe_job(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let key = Self::job_key(region, input)?;
        let j = self
            .sm
            .jobs
            .get(&key)
            .ok_or_else(|| ApiError::validation("Requested resource not found."))?;
        Ok(self.job_json(j))
    }

    fn stop_job(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let key = Self::job_key(region, input)?;
        let stop_secs = self.settings.training_job_stop_seconds;
        let now = self.now;
        let j =
            self.sm.jobs.get_mut(&key).ok_or_else(|| {
                ApiError::not_found(format!("Training job {} does not exist", key.1))
            })?;
        if j.status != "InProgress" {
            return Err(ApiError::validation(format!(
                "The request was rejected because the training job is in status {}.",
                j.status
            )));
        }
        j.status = "Stopping".to_string();
        set_secondary(j, "Stopping", "Stopping the training job", now);
        j.stop_at = Some(now + TimeDelta::seconds(stop_secs));
        let at = now + TimeDelta::seconds(stop_secs);
        self.schedule(at, Action::SageMakerSync);
        self.job_event(region, &key.1);
        Ok(json!({}))
    }

    fn parse_groups(&self, region: &str, input: &Value) -> Result<Vec<InstanceGroup>, ApiError> {
        let groups = input
            .get("InstanceGroups")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut out = Vec::new();
        for g in groups {
            let name = req(&g, "InstanceGroupName")?.to_string();
            let plan_arn = s(&g, "TrainingPlanArn").map(str::to_string);
            let requirements = g.get("InstanceRequirements").filter(|r| !r.is_null());
            let ty = match (s(&g, "InstanceType"), requirements) {
                // "The InstanceType and InstanceRequirements properties are mutually
                // exclusive" (botocore `sagemaker` model, ClusterInstanceGroupSpecification)
                (Some(_), Some(_)) => {
                    return Err(ApiError::validation(
                        "The InstanceType and InstanceRequirements properties are mutually exclusive.",
                    ));
                }
                (Some(ty), None) => ty.to_string(),
                (None, Some(r)) => {
                    // a flexible group: its nodes run the plan's type when it lists it, else
                    // the first type it lists
                    let types: Vec<&str> = r
                        .get("InstanceTypes")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let plan_type = plan_arn
                        .as_deref()
                        .and_then(|pa| self.sm.plans.values().find(|p| p.arn == pa))
                        .map(|p| p.offering.instance_type.as_str());
                    plan_type
                        .filter(|t| types.contains(t))
                        .or(types.first().copied())
                        .ok_or_else(|| missing("InstanceRequirements.InstanceTypes"))?
                        .to_string()
                }
                (None, None) => return Err(missing("InstanceType")),
            };
            let target = int(&g, "InstanceCount").ok_or_else(|| missing("InstanceCount"))?;
            req(&g, "ExecutionRole")?;
            if let Some(pa) = &plan_arn {
                let p = self.check_plan(region, pa, "hyperpod-cluster", &ty)?;
                if target > p.offering.instance_count {
                    return Err(ApiError::validation(format!(
                        "InstanceCount {target} of group {name} exceeds training plan {pa}'s {} instances",
                        p.offering.instance_count
                    )));
                }
            }
            out.push(InstanceGroup {
                name,
                instance_type: ty,
                target,
                plan_arn,
                request: g.clone(),
                current: None,
                deleting: false,
            });
        }
        Ok(out)
    }

    fn create_cluster(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "ClusterName")?.to_string();
        check_name(&name, "ClusterName")?;
        let tags = parse_tags(input)?;
        let key = (region.to_string(), name.clone());
        let arn = self.arn(
            "sagemaker",
            region,
            &format!("cluster/{}", self.cluster_suffix(&name)),
        );
        if self.sm.clusters.contains_key(&key) {
            return Err(ApiError::in_use(format!("Cluster {name} already exists")));
        }
        let groups = self.parse_groups(region, input)?;
        let until = self.minutes(self.settings.cluster_transition_minutes);
        self.sm.clusters.insert(
            key,
            Cluster {
                name: name.clone(),
                arn: arn.clone(),
                region: region.to_string(),
                created: self.now,
                status: "Creating".to_string(),
                status_until: until,
                groups,
                nodes: Vec::new(),
            },
        );
        self.put_tags(&arn, tags);
        self.schedule(until, Action::SageMakerSync);
        self.cluster_event(region, &name);
        Ok(json!({"ClusterArn": arn}))
    }

    fn cluster_suffix(&self, name: &str) -> String {
        crate::util::hex_id("", &[&self.market.seed.to_string(), "cluster", name])[..12].to_string()
    }

    fn cluster_mut(&mut self, region: &str, name_or_arn: &str) -> Result<&mut Cluster, ApiError> {
        let found = self
            .sm
            .clusters
            .iter()
            .find(|((r, n), c)| r == region && (n == name_or_arn || c.arn == name_or_arn))
            .map(|(k, _)| k.clone());
        match found {
            Some(k) => Ok(self.sm.clusters.get_mut(&k).expect("found")),
            None => Err(ApiError::not_found(format!(
                "Cluster {name_or_arn} does not exist"
            ))),
        }
    }

    fn update_cluster(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "ClusterName")?.to_string();
        let updates = self.parse_groups(region, input)?;
        let deletes = parse_deletes(input)?;
        let until = self.minutes(self.settings.cluster_update_minutes);
        let strict = self.settings.refuse_partial_cluster_updates;
        let every_plan = self.settings.refuse_expired_plan_groups;
        let c = self.cluster_mut(region, &name)?.clone();
        if c.status != "InService" {
            // our wording: AWS's text is not published
            return Err(ApiError::new(
                400,
                "ConflictException",
                format!(
                    "Cluster {} is in status {}. Please wait until the cluster is InService to update it.",
                    c.name, c.status
                ),
            ));
        }
        // `InstanceGroupsToDelete` (botocore `sagemaker` model, UpdateCluster): each name must
        // be a group of the cluster, and not also one the update sends (our wording)
        let unknown: Vec<&str> = deletes
            .iter()
            .filter(|d| !c.groups.iter().any(|g| &g.name == *d))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(ApiError::validation(format!(
                "InstanceGroupsToDelete names {}, which cluster {} does not have.",
                unknown.join(", "),
                c.name
            )));
        }
        let both: Vec<&str> = deletes
            .iter()
            .filter(|d| updates.iter().any(|u| &u.name == *d))
            .map(String::as_str)
            .collect();
        if !both.is_empty() {
            return Err(ApiError::validation(format!(
                "The update of cluster {} lists instance group(s) {} in both InstanceGroups and InstanceGroupsToDelete. An instance group is either updated or deleted.",
                c.name,
                both.join(", ")
            )));
        }
        if strict {
            // whether AWS keeps omitted groups or fields is UNVERIFIED (aws-reference §11.2):
            // the harsher reading refuses an update that might remove or rewrite another group;
            // a group being deleted is neither omitted nor changed
            let omitted: Vec<&str> = c
                .groups
                .iter()
                .filter(|g| !updates.iter().any(|u| u.name == g.name) && !deletes.contains(&g.name))
                .map(|g| g.name.as_str())
                .collect();
            if !omitted.is_empty() {
                return Err(ApiError::validation(format!(
                    "The update of cluster {} omits instance group(s) {}. List every instance group of the cluster with its settings.",
                    c.name,
                    omitted.join(", ")
                )));
            }
            let changed: Vec<&str> = updates
                .iter()
                .filter(|u| {
                    c.groups
                        .iter()
                        .any(|g| g.name == u.name && g.request != u.request)
                })
                .map(|u| u.name.as_str())
                .collect();
            if changed.len() > 1 {
                return Err(ApiError::validation(format!(
                    "The update of cluster {} changes instance groups {}. An update can change one instance group only; send the others with their current settings.",
                    c.name,
                    changed.join(", ")
                )));
            }
        }
        // a plan used by HyperPod must be `Scheduled` or `Active` (aws-reference §3.1); whether
        // AWS checks a group sent back unchanged is not published (`refuse_expired_plan_groups`)
        for u in &updates {
            let Some(pa) = &u.plan_arn else {
                continue;
            };
            let new_plan = c
                .groups
                .iter()
                .find(|g| g.name == u.name)
                .is_none_or(|g| g.plan_arn.as_ref() != Some(pa));
            if !(every_plan || new_plan) {
                continue;
            }
            let status = self
                .sm
                .plans
                .values()
                .find(|p| &p.arn == pa)
                .map_or("Expired", |p| plan_status(p, self.now));
            if !matches!(status, "Scheduled" | "Active") {
                return Err(ApiError::validation(format!(
                    "Instance group {} of cluster {} uses training plan {pa}, which is {status}. An instance group can use a training plan only while it is Scheduled or Active.",
                    u.name, c.name
                )));
            }
        }
        let c = self.cluster_mut(region, &name)?;
        for mut u in updates {
            match c.groups.iter_mut().find(|g| g.name == u.name) {
                Some(g) => {
                    u.current = g.current.take();
                    *g = u;
                }
                None => c.groups.push(u),
            }
        }
        // deleted groups lose their nodes at once, as a group scaled to 0 does, and are
        // described `Deleting` until the update ends
        for g in c.groups.iter_mut().filter(|g| deletes.contains(&g.name)) {
            g.deleting = true;
        }
        c.nodes.retain(|n| !deletes.contains(&n.group));
        c.status = "Updating".to_string();
        c.status_until = until;
        let (arn, cname) = (c.arn.clone(), c.name.clone());
        self.schedule(until, Action::SageMakerSync);
        self.cluster_event(region, &cname);
        Ok(json!({"ClusterArn": arn}))
    }

    fn describe_cluster(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "ClusterName")?.to_string();
        let c = self.cluster_mut(region, &name)?.clone();
        Ok(self.cluster_json(&c))
    }

    fn cluster_json(&self, c: &Cluster) -> Value {
        json!({
            "ClusterArn": c.arn,
            "ClusterName": c.name,
            "ClusterStatus": c.status,
            "CreationTime": epoch(c.created),
            "InstanceGroups": c.groups.iter().map(|g| {
                let current = c.nodes.iter().filter(|n| n.group == g.name).count();
                let plan_status = g.plan_arn.as_ref().map_or("NotApplicable".to_string(), |pa| {
                    self.sm.plans.values().find(|p| &p.arn == pa).map_or("NotApplicable".to_string(), |p| plan_status(p, self.now).to_string())
                });
                let mut d = group_details(&g.request, g.current.as_ref());
                d.insert("InstanceGroupName".into(), json!(g.name));
                d.insert("InstanceType".into(), json!(g.instance_type));
                // "`CurrentCount` is optional" (aws-reference §11.2)
                if !self.settings.cluster_omit_current_count {
                    d.insert("CurrentCount".into(), json!(current));
                }
                d.insert("TargetCount".into(), json!(g.target));
                d.insert("TrainingPlanArn".into(), json!(g.plan_arn));
                d.insert("TrainingPlanStatus".into(), json!(plan_status));
                let status = match c.status.as_str() {
                    _ if g.deleting => "Deleting",
                    "Creating" => "Creating",
                    "Updating" => "Updating",
                    _ => "InService",
                };
                d.insert("Status".into(), json!(status));
                Value::Object(d)
            }).collect::<Vec<_>>(),
        })
    }

    fn list_cluster_nodes(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "ClusterName")?.to_string();
        let c = self.cluster_mut(region, &name)?.clone();
        let contains = s(input, "InstanceGroupNameContains");
        let items: Vec<Value> = c
            .nodes
            .iter()
            .filter(|n| contains.is_none_or(|f| n.group.contains(f)))
            .map(|n| {
                json!({
                    "InstanceGroupName": n.group,
                    "InstanceId": n.instance_id,
                    "InstanceType": n.instance_type,
                    "LaunchTime": epoch(n.launch_time),
                    "InstanceStatus": {"Status": "Running", "Message": ""},
                })
            })
            .collect();
        let (items, next) = page(items, input, 100)?;
        Ok(json!({"ClusterNodeSummaries": items, "NextToken": next}))
    }

    fn model_arn(&self, region: &str, name: &str) -> String {
        self.arn(
            "sagemaker",
            region,
            &format!("model/{}", name.to_lowercase()),
        )
    }

    /// SageMaker's answer for a model it does not know: the unmodeled `ValidationException`
    /// "Could not find model '<arn>'." (DescribeModel, DeleteModel, CreateEndpointConfig), as
    /// moto answers it (`moto/sagemaker/models.py`, `describe_model`, `create_endpoint_config`).
    fn model_not_found(&self, region: &str, name: &str) -> ApiError {
        ApiError::validation(format!(
            "Could not find model '{}'.",
            self.model_arn(region, name)
        ))
    }

    fn create_model(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "ModelName")?.to_string();
        check_name(&name, "ModelName")?;
        let tags = parse_tags(input)?;
        let arn = self.model_arn(region, &name);
        let key = (region.to_string(), name.clone());
        if self.sm.models.contains_key(&key) {
            return Err(ApiError::validation(format!(
                "Cannot create already existing model \"{arn}\"."
            )));
        }
        self.sm.models.insert(
            key,
            Model {
                name,
                arn: arn.clone(),
                created: self.now,
                execution_role_arn: s(input, "ExecutionRoleArn").map(str::to_string),
            },
        );
        self.put_tags(&arn, tags);
        Ok(json!({"ModelArn": arn}))
    }

    fn describe_model(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "ModelName")?.to_string();
        let m = self
            .sm
            .models
            .get(&(region.to_string(), name.clone()))
            .ok_or_else(|| self.model_not_found(region, &name))?;
        Ok(json!({
            "ModelName": m.name,
            "ModelArn": m.arn,
            "CreationTime": epoch(m.created),
            "ExecutionRoleArn": m.execution_role_arn,
        }))
    }

    fn delete_model(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "ModelName")?.to_string();
        if self
            .sm
            .models
            .remove(&(region.to_string(), name.clone()))
            .is_none()
        {
            return Err(self.model_not_found(region, &name));
        }
        Ok(json!({}))
    }

    fn create_endpoint_config(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "EndpointConfigName")?.to_string();
        check_name(&name, "EndpointConfigName")?;
        let tags = parse_tags(input)?;
        let arn = self.arn(
            "sagemaker",
            region,
            &format!("endpoint-config/{}", name.to_lowercase()),
        );
        let key = (region.to_string(), name.clone());
        if self.sm.endpoint_configs.contains_key(&key) {
            return Err(ApiError::validation(format!(
                "Cannot create already existing endpoint configuration \"{arn}\"."
            )));
        }
        let pvs = input
            .get("ProductionVariants")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty())
            .ok_or_else(|| missing("ProductionVariants"))?;
        let mut variants = Vec::new();
        for pv in pvs {
            let vname = req(pv, "VariantName")?.to_string();
            // A variant names a model of the region (aws-reference §11.2).
            let model = req(pv, "ModelName")?;
            if !self
                .sm
                .models
                .contains_key(&(region.to_string(), model.to_string()))
            {
                return Err(self.model_not_found(region, model));
            }
            let ty = req(pv, "InstanceType")?.to_string();
            let count = int(pv, "InitialInstanceCount").unwrap_or(1);
            let plan_arn = match pv.get("CapacityReservationConfig") {
                None => None,
                Some(crc) => {
                    let arn = req(crc, "MlReservationArn")?.to_string();
                    if s(crc, "CapacityReservationPreference")
                        .is_some_and(|p| p != "capacity-reservations-only")
                    {
                        return Err(ApiError::validation(
                            "CapacityReservationPreference must be capacity-reservations-only",
                        ));
                    }
                    let p = self.check_plan(region, &arn, "endpoint", &ty)?;
                    if count > p.offering.instance_count {
                        return Err(ApiError::validation(format!(
                            "InitialInstanceCount {count} exceeds training plan {arn}'s {} instances",
                            p.offering.instance_count
                        )));
                    }
                    Some(arn)
                }
            };
            variants.push(Variant {
                name: vname,
                instance_type: ty,
                count,
                plan_arn,
                request: pv.clone(),
            });
        }
        if variants.iter().filter(|v| v.plan_arn.is_some()).count() > 1 {
            return Err(ApiError::validation(
                "An endpoint can use exactly one training plan",
            ));
        }
        self.sm.endpoint_configs.insert(
            key,
            EndpointConfig {
                name,
                arn: arn.clone(),
                created: self.now,
                variants,
            },
        );
        self.put_tags(&arn, tags);
        Ok(json!({"EndpointConfigArn": arn}))
    }

    fn create_endpoint(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "EndpointName")?.to_string();
        check_name(&name, "EndpointName")?;
        let tags = parse_tags(input)?;
        let config_name = req(input, "EndpointConfigName")?.to_string();
        let arn = self.arn(
            "sagemaker",
            region,
            &format!("endpoint/{}", name.to_lowercase()),
        );
        let key = (region.to_string(), name.clone());
        if self.sm.endpoints.contains_key(&key) {
            return Err(ApiError::validation(format!(
                "Cannot create already existing endpoint \"{arn}\"."
            )));
        }
        // A config inside its visibility lag is not found, as CreateEndpoint's documented
        // "validation error" says (botocore `sagemaker` model, CreateEndpoint).
        let config = self
            .visible_endpoint_config(region, &config_name)
            .cloned()
            .ok_or_else(|| self.endpoint_config_not_found(region, &config_name))?;
        if self.settings.endpoint_inactive_plan == InactivePlan::Refuse
            && let Some(p) = config
                .variants
                .iter()
                .find_map(|v| v.plan_arn.as_ref())
                .and_then(|pa| self.sm.plans.values().find(|p| &p.arn == pa))
            && plan_status(p, self.now) != "Active"
        {
            // "The training plan must be in the Active status to be used by an inference
            // endpoint" (aws-reference §11.2); the wording is ours
            return Err(ApiError::validation(format!(
                "The training plan {} is not in Active status; an endpoint can use a training plan only when it is Active.",
                p.arn
            )));
        }
        let ready_at = self.minutes(self.settings.endpoint_create_minutes);
        self.sm.endpoints.insert(
            key,
            Endpoint {
                name: name.clone(),
                arn: arn.clone(),
                region: region.to_string(),
                config_name,
                created: self.now,
                modified: self.now,
                ready_at,
                status: "Creating".to_string(),
                failure_reason: None,
                variants: config.variants,
                delete_at: None,
                deleted_from: None,
            },
        );
        self.put_tags(&arn, tags);
        self.schedule(ready_at, Action::SageMakerSync);
        self.endpoint_event(region, &name);
        Ok(json!({"EndpointArn": arn}))
    }

    /// The endpoint config of the name, once `endpoint_config_visibility_seconds` have passed
    /// since its creation: until then it is there but not visible (CreateEndpointConfig's
    /// name is taken at once; DescribeEndpointConfig and CreateEndpoint do not find it).
    fn visible_endpoint_config(&self, region: &str, name: &str) -> Option<&EndpointConfig> {
        let lag = TimeDelta::seconds(self.settings.endpoint_config_visibility_seconds.max(0));
        self.sm
            .endpoint_configs
            .get(&(region.to_string(), name.to_string()))
            .filter(|c| self.now >= c.created + lag)
    }

    fn endpoint_config_not_found(&self, region: &str, name: &str) -> ApiError {
        ApiError::validation(format!(
            "Could not find endpoint configuration \"{}\".",
            self.arn(
                "sagemaker",
                region,
                &format!("endpoint-config/{}", name.to_lowercase())
            )
        ))
    }

    /// DescribeEndpointConfig: the config as created, once visible; unknown or inside its
    /// visibility lag: `ValidationException` "Could not find endpoint configuration …", the
    /// answer CreateEndpoint gives it.
    fn describe_endpoint_config(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "EndpointConfigName")?.to_string();
        let c = self
            .visible_endpoint_config(region, &name)
            .ok_or_else(|| self.endpoint_config_not_found(region, &name))?;
        Ok(json!({
            "EndpointConfigName": c.name,
            "EndpointConfigArn": c.arn,
            "ProductionVariants": c.variants.iter().map(|v| v.request.clone()).collect::<Vec<_>>(),
            "CreationTime": epoch(c.created),
        }))
    }

    fn describe_endpoint(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "EndpointName")?.to_string();
        let e = self
            .sm
            .endpoints
            .get(&(region.to_string(), name.clone()))
            .ok_or_else(|| {
                ApiError::validation(format!(
                    "Could not find endpoint \"{}\".",
                    self.arn(
                        "sagemaker",
                        region,
                        &format!("endpoint/{}", name.to_lowercase())
                    )
                ))
            })?;
        Ok(json!({
            "EndpointName": e.name,
            "EndpointArn": e.arn,
            "EndpointConfigName": e.config_name,
            "EndpointStatus": e.status,
            "FailureReason": e.failure_reason,
            "CreationTime": epoch(e.created),
            "LastModifiedTime": epoch(e.modified),
            "ProductionVariants": e.variants.iter().map(|v| {
                let current = if e.status == "InService" { v.count } else { 0 };
                json!({
                    "VariantName": v.name,
                    "CurrentInstanceCount": current,
                    "DesiredInstanceCount": v.count,
                    "CurrentWeight": 1.0,
                    "DesiredWeight": 1.0,
                    "CapacityReservationConfig": v.plan_arn.as_ref().map(|arn| json!({
                        "CapacityReservationPreference": "capacity-reservations-only",
                        "MlReservationArn": arn,
                    })),
                })
            }).collect::<Vec<_>>(),
        }))
    }

    /// DeleteEndpoint: `Deleting` for `endpoint_delete_minutes`, then gone (aws-reference
    /// §11.2 "DeleteEndpoint is asynchronous"). Meanwhile the name stays taken and a second
    /// DeleteEndpoint succeeds without a second event.
    fn delete_endpoint(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "EndpointName")?.to_string();
        let key = (region.to_string(), name.clone());
        let arn = self.arn(
            "sagemaker",
            region,
            &format!("endpoint/{}", name.to_lowercase()),
        );
        let now = self.now;
        let gone_at = now + TimeDelta::minutes(self.settings.endpoint_delete_minutes.max(0));
        let Some(e) = self.sm.endpoints.get_mut(&key) else {
            return Err(ApiError::validation(format!(
                "Could not find endpoint \"{arn}\"."
            )));
        };
        if e.status == "Deleting" {
            return Ok(json!({}));
        }
        e.deleted_from = Some(std::mem::replace(&mut e.status, "Deleting".to_string()));
        e.modified = now;
        e.delete_at = Some(gone_at);
        self.schedule(gone_at, Action::SageMakerSync);
        self.endpoint_event(region, &name);
        Ok(json!({}))
    }

    fn delete_endpoint_config(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let name = req(input, "EndpointConfigName")?.to_string();
        let key = (region.to_string(), name.clone());
        if let Some(c) = self.sm.endpoint_configs.remove(&key) {
            self.sm.tags.remove(&c.arn);
        } else {
            return Err(ApiError::validation(format!(
                "Could not find endpoint configuration \"{}\".",
                self.arn(
                    "sagemaker",
                    region,
                    &format!("endpoint-config/{}", name.to_lowercase())
                )
            )));
        }
        Ok(json!({}))
    }

    /// Whether a resource with this ARN exists in `region` (what tags can be attached to).
    fn tagged_resource_exists(&self, region: &str, arn: &str) -> bool {
        let sm = &self.sm;
        sm.plans
            .values()
            .any(|p| p.region == region && p.arn == arn)
            || sm.jobs.values().any(|j| j.region == region && j.arn == arn)
            || sm
                .clusters
                .values()
                .any(|c| c.region == region && c.arn == arn)
            || sm
                .endpoints
                .values()
                .any(|e| e.region == region && e.arn == arn)
            || sm
                .endpoint_configs
                .iter()
                .any(|((r, _), c)| r == region && c.arn == arn)
    }

    fn tagged_arn<'a>(&self, region: &str, input: &'a Value) -> Result<&'a str, ApiError> {
        let arn = req(input, "ResourceArn")?;
        if !self.tagged_resource_exists(region, arn) {
            // UNVERIFIED: the exact code and text for an unknown ARN.
            return Err(ApiError::validation(format!("Resource {arn} not found.")));
        }
        Ok(arn)
    }

    /// Attaches `tags` to `arn`; a key already present takes the new value.
    fn put_tags(&mut self, arn: &str, tags: Vec<(String, String)>) {
        let have = self.sm.tags.entry(arn.to_string()).or_default();
        for (k, v) in tags {
            match have.iter_mut().find(|(hk, _)| *hk == k) {
                Some(t) => t.1 = v,
                None => have.push((k, v)),
            }
        }
    }

    fn add_tags(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let arn = self.tagged_arn(region, input)?.to_string();
        if input.get("Tags").is_none() {
            return Err(missing("Tags"));
        }
        let tags = parse_tags(input)?;
        let have = self.sm.tags.get(&arn).map_or(0, Vec::len);
        let new = tags
            .iter()
            .filter(|(k, _)| {
                !self
                    .sm
                    .tags
                    .get(&arn)
                    .is_some_and(|t| t.iter().any(|(hk, _)| hk == k))
            })
            .count();
        if have + new > MAX_TAGS {
            return Err(ApiError::new(
                400,
                "ResourceLimitExceeded",
                format!("A resource can have at most {MAX_TAGS} tags"),
            ));
        }
        self.put_tags(&arn, tags.clone());
        Ok(json!({"Tags": tags_json(&tags)}))
    }

    fn list_tags(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let arn = self.tagged_arn(region, input)?;
        let tags = self.sm.tags.get(arn).cloned().unwrap_or_default();
        let (items, next) = page(tags_json(&tags), input, 50)?;
        Ok(json!({"Tags": items, "NextToken": next}))
    }

    fn delete_tags(&mut self, region: &str, input: &Value) -> Result<Value, ApiError> {
        let arn = self.tagged_arn(region, input)?.to_string();
        let keys: Vec<&str> = input
            .get("TagKeys")
            .and_then(Value::as_array)
            .ok_or_else(|| missing("TagKeys"))?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        if let Some(t) = self.sm.tags.get_mut(&arn) {
            t.retain(|(k, _)| !keys.contains(&k.as_str()));
        }
        Ok(json!({}))
    }

    fn job_event(&mut self, region: &str, name: &str) {
        let key = (region.to_string(), name.to_string());
        let Some(j) = self.sm.jobs.get(&key) else {
            return;
        };
        let mut detail = self.job_json(j);
        // events carry epoch-millisecond strings, unlike the API
        for k in [
            "CreationTime",
            "TrainingStartTime",
            "TrainingEndTime",
            "LastModifiedTime",
        ] {
            if let Some(v) = detail.get(k).and_then(Value::as_f64) {
                detail[k] = json!(format!("{}", (v * 1000.0).round() as i64));
            }
        }
        detail["Tags"] = json!({});
        let arn = j.arn.clone();
        self.emit(
            region,
            "aws.sagemaker",
            "SageMaker Training Job State Change",
            vec![arn],
            clean(detail),
        );
    }

    fn endpoint_event(&mut self, region: &str, name: &str) {
        let Some(e) = self
            .sm
            .endpoints
            .get(&(region.to_string(), name.to_string()))
        else {
            return;
        };
        let status = match e.status.as_str() {
            "InService" => "IN_SERVICE",
            "Creating" => "CREATING",
            "Failed" => "FAILED",
            "Deleting" => "DELETING",
            "Updating" => "UPDATING",
            _ => "OUT_OF_SERVICE",
        };
        let detail = json!({
            "EndpointName": e.name,
            "EndpointArn": e.arn,
            "EndpointConfigName": e.config_name,
            "ProductionVariants": e.variants.iter().map(|v| json!({"VariantName": v.name, "DesiredWeight": 1.0, "DesiredInstanceCount": v.count as f64})).collect::<Vec<_>>(),
            "EndpointStatus": status,
            "FailureReason": e.failure_reason,
            "CreationTime": e.created.timestamp_millis() as f64,
            "LastModifiedTime": e.modified.timestamp_millis() as f64,
            "Tags": {},
        });
        let arn = e.arn.clone();
        self.emit(
            region,
            "aws.sagemaker",
            "SageMaker Endpoint State Change",
            vec![arn],
            clean(detail),
        );
    }

    fn cluster_event(&mut self, region: &str, name: &str) {
        let Some(c) = self
            .sm
            .clusters
            .get(&(region.to_string(), name.to_string()))
            .cloned()
        else {
            return;
        };
        let mut detail = self.cluster_json(&c);
        detail["CreationTime"] = json!(c.created.timestamp_millis());
        self.emit(
            region,
            "aws.sagemaker",
            "SageMaker HyperPod Cluster State Change",
            vec![c.arn.clone()],
            clean(detail),
        );
    }

    /// Brings every SageMaker resource up to date with the clock. Idempotent; several passes
    /// let capacity freed by one resource be taken by another at the same instant.
    pub(crate) fn sagemaker_sync(&mut self) {
        self.fail_due_plan_payments();
        self.apply_due_plan_extensions();
        for _ in 0..3 {
            let keys: Vec<Key> = self.sm.jobs.keys().cloned().collect();
            for k in keys {
                self.step_job(&k);
            }
            let keys: Vec<Key> = self.sm.clusters.keys().cloned().collect();
            for k in keys {
                self.step_cluster(&k);
            }
            let keys: Vec<Key> = self.sm.endpoints.keys().cloned().collect();
            for k in keys {
                self.step_endpoint(&k);
            }
        }
    }

    fn step_job(&mut self, key: &Key) {
        let now = self.now;
        let Some(j) = self.sm.jobs.get(key).cloned() else {
            return;
        };
        let lead = TimeDelta::minutes(self.settings.training_job_termination_lead_minutes);
        let mut next = j.clone();
        match (j.status.as_str(), j.secondary.as_str()) {
            ("Stopping", _) if j.stop_at.is_some_and(|t| now >= t) => {
                next.status = "Stopped".to_string();
                set_secondary(&mut next, "Stopped", "The training job was stopped", now);
                next.training_end = Some(now);
            }
            ("InProgress", "Training") => {
                let completes = j.work_left.is_some_and(|w| w <= j.remaining_seconds);
                let left = j
                    .work_left
                    .map_or(j.remaining_seconds, |w| w.min(j.remaining_seconds));
                let done_at =
                    j.resumed_at.expect("training has a start") + TimeDelta::seconds(left);
                if now >= done_at && completes {
                    next.status = "Completed".to_string();
                    set_secondary(&mut next, "Completed", "Training job completed", now);
                    next.training_end = Some(now);
                    next.remaining_seconds = 0;
                    next.work_left = Some(0);
                } else if now >= done_at {
                    next.status = "Stopped".to_string();
                    set_secondary(
                        &mut next,
                        "MaxRuntimeExceeded",
                        "Training job runtime exceeded MaxRuntimeInSeconds provided",
                        now,
                    );
                    next.training_end = Some(now);
                    next.remaining_seconds = 0;
                } else if let Some(pa) = &j.plan_arn {
                    let plan = self.sm.plans.values().find(|p| &p.arn == pa).cloned();
                    let seg_end = plan
                        .as_ref()
                        .and_then(|p| segment_at(p, now).map(|i| p.offering.segments[i].end));
                    if seg_end.is_none_or(|e| now >= e - lead) {
                        let trained = (now - j.resumed_at.expect("training")).num_seconds();
                        next.remaining_seconds = (j.remaining_seconds - trained).max(0);
                        next.work_left = j.work_left.map(|w| (w - trained).max(0));
                        next.resumed_at = None;
                        let later = plan
                            .as_ref()
                            .is_some_and(|p| p.offering.segments.iter().any(|s| s.start > now));
                        if later {
                            set_secondary(
                                &mut next,
                                "Pending",
                                "Reserved capacity is ending; the job resumes in the training plan's next reserved capacity",
                                now,
                            );
                        } else {
                            next.status = "Failed".to_string();
                            next.failure_reason = Some(
                                "CapacityError: The training plan's reserved capacity has ended. Instances were terminated 30 minutes before the end of the reserved capacity.".to_string(),
                            );
                            set_secondary(&mut next, "Failed", "Reserved capacity ended", now);
                            next.training_end = Some(now);
                        }
                    }
                }
            }
            ("InProgress", _) => {
                let started =
                    now >= j.created + TimeDelta::seconds(self.settings.training_job_start_seconds);
                match &j.plan_arn {
                    None if started => {
                        if self.sm_on_demand_free(&j.region, &j.instance_type) >= j.instance_count {
                            start_training(&mut next, now);
                        } else {
                            next.status = "Failed".to_string();
                            next.failure_reason = Some(format!(
                                "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML instance type. ({})",
                                j.instance_type
                            ));
                            set_secondary(&mut next, "Failed", "Insufficient capacity", now);
                        }
                    }
                    None => {}
                    Some(pa) => {
                        let plan = self.sm.plans.values().find(|p| &p.arn == pa).cloned();
                        let status = plan.as_ref().map_or("Expired", |p| plan_status(p, now));
                        let usable = plan.as_ref().and_then(|p| {
                            segment_at(p, now).filter(|&i| now < p.offering.segments[i].end - lead)
                        });
                        let free = plan
                            .as_ref()
                            .map_or(0, |p| p.offering.instance_count - self.plan_in_use(&p.arn));
                        if started && usable.is_some() && free >= j.instance_count {
                            start_training(&mut next, now);
                            next.waiting_since = None;
                        } else if matches!(status, "Expired" | "Failed") {
                            next.status = "Failed".to_string();
                            next.failure_reason =
                                Some(format!("CapacityError: training plan {pa} is {status}"));
                            set_secondary(&mut next, "Failed", "Training plan ended", now);
                        } else if started {
                            if j.secondary != "Pending" {
                                set_secondary(
                                    &mut next,
                                    "Pending",
                                    "Waiting for the training plan's reserved capacity",
                                    now,
                                );
                            }
                            if status == "Active" {
                                let since = *next.waiting_since.get_or_insert(now);
                                let limit = since
                                    + TimeDelta::hours(self.settings.training_job_max_wait_hours);
                                if now >= limit {
                                    next.status = "Failed".to_string();
                                    next.failure_reason = Some("InsufficientCapacityError: The training plan had no available capacity for 2 days".to_string());
                                    set_secondary(
                                        &mut next,
                                        "Failed",
                                        "Insufficient capacity",
                                        now,
                                    );
                                } else if j.waiting_since.is_none() {
                                    self.schedule(limit, Action::SageMakerSync);
                                }
                            } else {
                                next.waiting_since = None;
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        if next.secondary == "Training"
            && j.secondary != "Training"
            && let Some(r) = next.resumed_at
        {
            let left = next
                .work_left
                .map_or(next.remaining_seconds, |w| w.min(next.remaining_seconds));
            self.schedule(r + TimeDelta::seconds(left), Action::SageMakerSync);
        }
        let changed = next.status != j.status || next.secondary != j.secondary;
        if changed {
            next.modified = now;
            let name = next.name.clone();
            let region = next.region.clone();
            self.sm.jobs.insert(key.clone(), next);
            self.job_event(&region, &name);
        } else {
            self.sm.jobs.insert(key.clone(), next);
        }
    }

    fn step_cluster(&mut self, key: &Key) {
        let now = self.now;
        let Some(mut c) = self.sm.clusters.get(key).cloned() else {
            return;
        };
        let mut changed = false;
        if (c.status == "Creating" || c.status == "Updating") && now >= c.status_until {
            c.status = "InService".to_string();
            // groups named in `InstanceGroupsToDelete` are gone with the update
            c.groups.retain(|g| !g.deleting);
            for g in &mut c.groups {
                g.current = Some(g.request.clone());
            }
            changed = true;
        }
        if c.status != "Creating" {
            let lead = TimeDelta::minutes(self.settings.hyperpod_termination_lead_minutes);
            for g in c.groups.clone() {
                let desired = match &g.plan_arn {
                    _ if g.deleting => 0,
                    Some(pa) => self
                        .sm
                        .plans
                        .values()
                        .find(|p| &p.arn == pa)
                        .and_then(|p| {
                            segment_at(p, now)
                                .filter(|&i| now < p.offering.segments[i].end - lead)
                                .map(|_| g.target.min(p.offering.instance_count))
                        })
                        .unwrap_or(0),
                    None => {
                        let have = c.nodes.iter().filter(|n| n.group == g.name).count() as i64;
                        g.target
                            .min(have + self.sm_on_demand_free(&c.region, &g.instance_type).max(0))
                    }
                };
                let have: Vec<usize> = c
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| n.group == g.name)
                    .map(|(i, _)| i)
                    .collect();
                let have_n = have.len() as i64;
                if have_n > desired {
                    for &i in have.iter().rev().take((have_n - desired) as usize) {
                        c.nodes.remove(i);
                    }
                } else {
                    for _ in have_n..desired {
                        let id = self.next_id("i-");
                        c.nodes.push(Node {
                            group: g.name.clone(),
                            instance_id: id,
                            instance_type: g.instance_type.clone(),
                            launch_time: now,
                        });
                    }
                }
            }
            // nodes removed from groups that no longer exist
            let names: Vec<String> = c.groups.iter().map(|g| g.name.clone()).collect();
            c.nodes.retain(|n| names.contains(&n.group));
        }
        let name = c.name.clone();
        let region = c.region.clone();
        self.sm.clusters.insert(key.clone(), c);
        if changed {
            self.cluster_event(&region, &name);
        }
    }

    fn step_endpoint(&mut self, key: &Key) {
        let now = self.now;
        let Some(mut e) = self.sm.endpoints.get(key).cloned() else {
            return;
        };
        let plan = e
            .variants
            .iter()
            .find_map(|v| v.plan_arn.clone())
            .and_then(|pa| self.sm.plans.values().find(|p| p.arn == pa).cloned());
        if e.status == "Deleting" {
            if e.delete_at.is_some_and(|t| now >= t) {
                // gone: no event at the removal (only `DELETING` at the delete)
                self.sm.endpoints.remove(key);
                self.sm.tags.remove(&e.arn);
            }
            return;
        }
        let before = e.status.clone();
        if e.status == "Creating" && now >= e.ready_at {
            match &plan {
                Some(p) => {
                    let st = plan_status(p, now);
                    if st == "Active" {
                        e.status = "InService".to_string();
                    } else {
                        e.status = "Failed".to_string();
                        e.failure_reason = Some(format!(
                            "The training plan {} is {st}; endpoints can only use an Active training plan",
                            p.arn
                        ));
                    }
                }
                None => {
                    let ok = e
                        .variants
                        .iter()
                        .all(|v| self.sm_on_demand_free(&e.region, &v.instance_type) >= v.count);
                    if ok {
                        e.status = "InService".to_string();
                    } else {
                        e.status = "Failed".to_string();
                        e.failure_reason = Some(
                            "Unable to provision requested ML compute capacity due to InsufficientInstanceCapacity error".to_string(),
                        );
                    }
                }
            }
            // a scenario's forced failures (`endpoint_failures`), our wording
            if e.status == "InService" && self.settings.endpoint_failures > 0 {
                self.settings.endpoint_failures -= 1;
                e.status = "Failed".to_string();
                e.failure_reason = Some(
                    "Unable to provision requested ML compute capacity due to InsufficientCapacityError".to_string(),
                );
            }
        } else if e.status == "InService"
            && let Some(p) = &plan
            && plan_status(p, now) != "Active"
        {
            e.status = "Failed".to_string();
            e.failure_reason = Some(format!(
                "The capacity reservation {} has expired; the endpoint can no longer serve traffic",
                p.arn
            ));
        }
        let changed = e.status != before;
        if changed {
            e.modified = now;
        }
        let name = e.name.clone();
        let region = e.region.clone();
        self.sm.endpoints.insert(key.clone(), e);
        if changed {
            self.endpoint_event(&region, &name);
        }
    }
}

/// SageMaker's `TagKey` and `TagValue` pattern (botocore `sagemaker` model; aws-reference
/// §11.2 "Tags"), narrower than EC2's.
const TAG_PATTERN: &str = r"([\p{L}\p{Z}\p{N}_.:/=+\-@]*)";

/// UpdateCluster's `InstanceGroupsToDelete`: a list of group names ("Specify the names of
/// the instance groups to delete", botocore `sagemaker` model), each once.
fn parse_deletes(input: &Value) -> Result<Vec<String>, ApiError> {
    let bad =
        || ApiError::validation("InstanceGroupsToDelete must be a list of instance group names");
    let mut out: Vec<String> = Vec::new();
    match input.get("InstanceGroupsToDelete") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for v in a {
                let name = v.as_str().ok_or_else(bad)?.to_string();
                if !out.contains(&name) {
                    out.push(name);
                }
            }
        }
        Some(_) => return Err(bad()),
    }
    Ok(out)
}

/// One character of [`TAG_PATTERN`]. `\p{L}` is taken as Rust's `is_alphabetic` less the
/// marks it also counts (general category M is refused, as SageMaker's pattern refuses it),
/// `\p{N}` as `is_numeric`, `\p{Z}` as the Unicode separators listed.
fn tag_char(c: char) -> bool {
    let separator = matches!(
        c,
        '\u{20}' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}' | '\u{2028}' | '\u{2029}' | '\u{202F}' | '\u{205F}' | '\u{3000}'
    );
    // Combining marks that `is_alphabetic` passes (Other_Alphabetic): the common blocks.
    let mark = matches!(c, '\u{300}'..='\u{36F}' | '\u{483}'..='\u{489}' | '\u{591}'..='\u{5C7}'
        | '\u{610}'..='\u{61A}' | '\u{64B}'..='\u{65F}' | '\u{900}'..='\u{903}'
        | '\u{93A}'..='\u{94F}' | '\u{1AB0}'..='\u{1AFF}' | '\u{1DC0}'..='\u{1DFF}'
        | '\u{20D0}'..='\u{20FF}' | '\u{FE20}'..='\u{FE2F}');
    (c.is_alphabetic() && !mark) || c.is_numeric() || separator || "_.:/=+-@".contains(c)
}

/// SageMaker allows at most this many tags on a resource.
const MAX_TAGS: usize = 50;

/// The `Tags` member of a create or `AddTags`, validated as SageMaker does: keys of 1-128
/// characters not starting with the reserved `aws:`, values of at most 256, at most 50 tags.
fn parse_tags(input: &Value) -> Result<Vec<(String, String)>, ApiError> {
    let Some(tags) = input.get("Tags") else {
        return Ok(Vec::new());
    };
    let tags = tags
        .as_array()
        .ok_or_else(|| ApiError::validation("Tags must be a list"))?;
    if tags.len() > MAX_TAGS {
        return Err(ApiError::validation(format!(
            "1 validation error detected: Value at 'tags' failed to satisfy constraint: Member must have length less than or equal to {MAX_TAGS}"
        )));
    }
    let mut out = Vec::new();
    for t in tags {
        let key = t.get("Key").and_then(Value::as_str).unwrap_or_default();
        let value = t.get("Value").and_then(Value::as_str).unwrap_or_default();
        if key.is_empty() || key.chars().count() > 128 {
            return Err(ApiError::validation(format!(
                "1 validation error detected: Value '{key}' at 'tags.member.key' failed to satisfy constraint: Member must have length between 1 and 128"
            )));
        }
        if value.chars().count() > 256 {
            return Err(ApiError::validation(
                "1 validation error detected: Value at 'tags.member.value' failed to satisfy constraint: Member must have length less than or equal to 256",
            ));
        }
        for (what, text) in [("key", key), ("value", value)] {
            if !text.chars().all(tag_char) {
                return Err(ApiError::validation(format!(
                    "1 validation error detected: Value '{text}' at 'tags.{}.member.{what}' failed to satisfy constraint: Member must satisfy regular expression pattern: {TAG_PATTERN}",
                    out.len() + 1
                )));
            }
        }
        if key.to_ascii_lowercase().starts_with("aws:") {
            return Err(ApiError::validation(format!(
                "Tag keys starting with 'aws:' are reserved for system use: {key}"
            )));
        }
        match out
            .iter_mut()
            .find(|(k, _): &&mut (String, String)| k == key)
        {
            Some(existing) => existing.1 = value.to_string(),
            None => out.push((key.to_string(), value.to_string())),
        }
    }
    Ok(out)
}

fn tags_json(tags: &[(String, String)]) -> Vec<Value> {
    tags.iter()
        .map(|(k, v)| json!({"Key": k, "Value": v}))
        .collect()
}

fn set_secondary(j: &mut TrainingJob, status: &str, message: &str, now: DateTime<Utc>) {
    j.secondary = status.to_string();
    j.transitions
        .push((status.to_string(), now, message.to_string()));
}

fn start_training(j: &mut TrainingJob, now: DateTime<Utc>) {
    j.resumed_at = Some(now);
    if j.training_start.is_none() {
        j.training_start = Some(now);
    }
    set_secondary(
        j,
        "Training",
        "Training image download completed. Training in progress.",
        now,
    );
}
