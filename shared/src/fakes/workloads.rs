//! EC2 instances, training jobs, HyperPod instance groups and endpoints in memory, with the
//! idempotency AWS gives each (client tokens, names) and the states and health a test sets.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::{Fault, Faults, Gate, MANAGED_TAG, ManualClock, REQUEST_ID_TAG, errors, lock};
use crate::ports::{
    EndpointCreation, EndpointInfo, EndpointSpec, InstanceFilter, InstanceGroupInfo,
    InstanceGroupSpec, InstanceHealth, InstanceInfo, InstanceState, JobInfo, JobState,
    LaunchMarket, LaunchSpec, PortError, TrainingJobSpec, Workloads,
};

/// The longest `ClientToken` EC2 accepts.
const MAX_CLIENT_TOKEN: usize = 64;

/// The workloads' operations, for scripting faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadsOp {
    LaunchInstances,
    DescribeInstances,
    TerminateInstances,
    TagInstances,
    SubnetInZone,
    SubnetZones,
    PlanState,
    StartTrainingJob,
    DescribeTrainingJob,
    StopTrainingJob,
    DescribeInstanceGroup,
    PutInstanceGroup,
    RemoveInstanceGroup,
    CreateEndpoint,
    DescribeEndpoint,
    DeleteEndpoint,
    PreflightInstances,
    ModelExists,
}

/// How an instance is bought, without the reservation id: what capacity can be denied for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LaunchKind {
    CapacityBlock,
    OnDemand,
    Spot,
}

impl LaunchKind {
    pub fn of(market: &LaunchMarket) -> LaunchKind {
        match market {
            LaunchMarket::CapacityBlock { .. } => LaunchKind::CapacityBlock,
            LaunchMarket::OnDemand => LaunchKind::OnDemand,
            LaunchMarket::Spot => LaunchKind::Spot,
        }
    }
}

/// One call received, for assertions.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkloadsCall {
    LaunchInstances(LaunchSpec),
    DescribeInstances {
        region: String,
        filter: InstanceFilter,
    },
    TerminateInstances {
        region: String,
        instance_ids: Vec<String>,
    },
    TagInstances {
        region: String,
        instance_ids: Vec<String>,
        tags: BTreeMap<String, String>,
    },
    SubnetInZone {
        region: String,
        subnet_ids: Vec<String>,
        availability_zone: String,
    },
    SubnetZones {
        region: String,
        subnet_ids: Vec<String>,
    },
    PlanState {
        region: String,
        plan_arn: String,
    },
    StartTrainingJob(TrainingJobSpec),
    DescribeTrainingJob {
        region: String,
        job_name: String,
    },
    StopTrainingJob {
        region: String,
        job_name: String,
    },
    DescribeInstanceGroup {
        region: String,
        cluster_name: String,
        instance_group_name: String,
    },
    PutInstanceGroup(InstanceGroupSpec),
    RemoveInstanceGroup {
        region: String,
        cluster_name: String,
        instance_group_name: String,
    },
    CreateEndpoint(EndpointSpec),
    DescribeEndpoint {
        region: String,
        endpoint_name: String,
    },
    DeleteEndpoint {
        region: String,
        endpoint_name: String,
        endpoint_config_name: String,
    },
    PreflightInstances {
        spec: LaunchSpec,
        dry_run: bool,
    },
    ModelExists {
        region: String,
        model_name: String,
    },
}

impl WorkloadsCall {
    pub fn op(&self) -> WorkloadsOp {
        match self {
            WorkloadsCall::LaunchInstances(_) => WorkloadsOp::LaunchInstances,
            WorkloadsCall::DescribeInstances { .. } => WorkloadsOp::DescribeInstances,
            WorkloadsCall::TerminateInstances { .. } => WorkloadsOp::TerminateInstances,
            WorkloadsCall::TagInstances { .. } => WorkloadsOp::TagInstances,
            WorkloadsCall::SubnetInZone { .. } => WorkloadsOp::SubnetInZone,
            WorkloadsCall::SubnetZones { .. } => WorkloadsOp::SubnetZones,
            WorkloadsCall::PlanState { .. } => WorkloadsOp::PlanState,
            WorkloadsCall::StartTrainingJob(_) => WorkloadsOp::StartTrainingJob,
            WorkloadsCall::DescribeTrainingJob { .. } => WorkloadsOp::DescribeTrainingJob,
            WorkloadsCall::StopTrainingJob { .. } => WorkloadsOp::StopTrainingJob,
            WorkloadsCall::DescribeInstanceGroup { .. } => WorkloadsOp::DescribeInstanceGroup,
            WorkloadsCall::PutInstanceGroup(_) => WorkloadsOp::PutInstanceGroup,
            WorkloadsCall::RemoveInstanceGroup { .. } => WorkloadsOp::RemoveInstanceGroup,
            WorkloadsCall::CreateEndpoint(_) => WorkloadsOp::CreateEndpoint,
            WorkloadsCall::DescribeEndpoint { .. } => WorkloadsOp::DescribeEndpoint,
            WorkloadsCall::DeleteEndpoint { .. } => WorkloadsOp::DeleteEndpoint,
            WorkloadsCall::PreflightInstances { .. } => WorkloadsOp::PreflightInstances,
            WorkloadsCall::ModelExists { .. } => WorkloadsOp::ModelExists,
        }
    }
}

type Key = (String, String);

fn k(region: &str, name: &str) -> Key {
    (region.to_string(), name.to_string())
}

#[derive(Debug)]
struct ReservationSlots {
    count: u32,
    availability_zone: Option<String>,
}

#[derive(Debug)]
struct Cluster {
    managed: bool,
    status: String,
    groups: BTreeMap<String, (Option<InstanceGroupSpec>, InstanceGroupInfo)>,
    /// Execution roles of groups by name (set by `set_group_role`).
    roles: BTreeMap<String, String>,
}

#[derive(Debug)]
struct State {
    instances: BTreeMap<String, InstanceInfo>,
    tokens: BTreeMap<Key, (LaunchSpec, Vec<String>)>,
    subnets: BTreeMap<Key, String>,
    reservations: BTreeMap<String, ReservationSlots>,
    no_capacity: BTreeSet<LaunchKind>,
    /// Launches of a kind in a region (and zone, when given) refused with a code.
    refusals: Vec<(LaunchKind, String, Option<String>, String)>,
    /// At most this many live instances of a kind in a zone.
    zone_capacity: BTreeMap<(LaunchKind, String), usize>,
    /// At most this many live instances in a subnet (its free addresses), of any kind.
    subnet_room: BTreeMap<Key, usize>,
    /// The subnet each instance was launched in.
    instance_subnets: BTreeMap<String, Key>,
    /// Instances DescribeInstances does not list (yet): EC2's listing lag.
    unlisted: BTreeSet<String>,
    /// Training plans' states; a plan not set here is `Active`.
    plan_states: BTreeMap<String, crate::domain::reservation::ReservationState>,
    launch_state: (InstanceState, InstanceHealth),
    jobs: BTreeMap<Key, (TrainingJobSpec, JobInfo)>,
    clusters: BTreeMap<Key, Cluster>,
    endpoints: BTreeMap<Key, (EndpointSpec, EndpointInfo)>,
    endpoint_configs: BTreeSet<Key>,
    /// Models SageMaker does not know (every other name exists).
    missing_models: BTreeSet<Key>,
    /// How many of the next endpoint creations find their config not visible yet.
    hidden_endpoint_configs: u32,
    clock: Option<ManualClock>,
    next_id: u64,
    faults: Faults<WorkloadsOp>,
    calls: Vec<WorkloadsCall>,
    gate: Option<Gate>,
}

/// An in-memory [`Workloads`]; clones share the world.
#[derive(Debug, Clone)]
pub struct FakeWorkloads {
    state: Arc<Mutex<State>>,
}

impl Default for FakeWorkloads {
    fn default() -> Self {
        FakeWorkloads::new()
    }
}

impl FakeWorkloads {
    /// An empty account. New instances start `Pending` with health `Unknown`, as EC2's do.
    pub fn new() -> FakeWorkloads {
        FakeWorkloads {
            state: Arc::new(Mutex::new(State {
                instances: BTreeMap::new(),
                tokens: BTreeMap::new(),
                subnets: BTreeMap::new(),
                reservations: BTreeMap::new(),
                no_capacity: BTreeSet::new(),
                refusals: Vec::new(),
                zone_capacity: BTreeMap::new(),
                subnet_room: BTreeMap::new(),
                instance_subnets: BTreeMap::new(),
                unlisted: BTreeSet::new(),
                plan_states: BTreeMap::new(),
                launch_state: (InstanceState::Pending, InstanceHealth::Unknown),
                jobs: BTreeMap::new(),
                clusters: BTreeMap::new(),
                gate: None,
                endpoints: BTreeMap::new(),
                endpoint_configs: BTreeSet::new(),
                missing_models: BTreeSet::new(),
                hidden_endpoint_configs: 0,
                clock: None,
                next_id: 1,
                faults: Faults::default(),
                calls: Vec::new(),
            })),
        }
    }

    /// Stamps `launched_at` from `clock` (otherwise it is `None`).
    pub fn with_clock(self, clock: ManualClock) -> FakeWorkloads {
        lock(&self.state).clock = Some(clock);
        self
    }

    // ---- the world ---------------------------------------------------------------------

    /// Every launch of `kind` in `region` (in `zone`, when given) is refused with `code`, as
    /// EC2 refuses for an account limit or a zone that does not offer the type.
    pub fn refuse(&self, kind: LaunchKind, region: &str, zone: Option<&str>, code: &str) {
        lock(&self.state).refusals.push((
            kind,
            region.to_string(),
            zone.map(str::to_string),
            code.to_string(),
        ));
    }

    /// At most `n` live instances of `kind` in `zone` (on-demand and spot counted together);
    /// a launch past them answers
    /// `InsufficientInstanceCapacity`.
    pub fn zone_capacity(&self, kind: LaunchKind, zone: &str, n: usize) {
        lock(&self.state)
            .zone_capacity
            .insert((kind, zone.to_string()), n);
    }

    /// At most `n` live instances in `subnet_id` (of any kind): a launch past them answers
    /// `InsufficientFreeAddressesInSubnet`, as a subnet out of private addresses does.
    pub fn subnet_room(&self, region: &str, subnet_id: &str, n: usize) {
        lock(&self.state)
            .subnet_room
            .insert(k(region, subnet_id), n);
    }

    /// DescribeInstances stops listing `instance_id` (or, with `false`, lists it again), as
    /// EC2's Describe* lag a new instance (aws-reference §11.3).
    pub fn set_listed(&self, instance_id: &str, listed: bool) {
        let mut s = lock(&self.state);
        if listed {
            s.unlisted.remove(instance_id);
        } else {
            s.unlisted.insert(instance_id.to_string());
        }
    }

    /// The next `n` endpoint creations create (or keep) the config and find it not visible
    /// yet, so create no endpoint: SageMaker's documented lag between CreateEndpointConfig
    /// and CreateEndpoint (botocore `sagemaker` model, CreateEndpoint).
    pub fn hide_new_endpoint_configs(&self, n: u32) {
        lock(&self.state).hidden_endpoint_configs = n;
    }

    /// The plan reports `state` (unset plans are `Active`).
    /// SageMaker does not know model `model_name` in `region` (every other model exists).
    pub fn remove_model(&self, region: &str, model_name: &str) {
        lock(&self.state)
            .missing_models
            .insert(k(region, model_name));
    }

    pub fn set_plan_state(
        &self,
        plan_arn: &str,
        state: crate::domain::reservation::ReservationState,
    ) {
        lock(&self.state)
            .plan_states
            .insert(plan_arn.to_string(), state);
    }

    pub fn add_subnet(&self, region: &str, subnet_id: &str, availability_zone: &str) {
        lock(&self.state)
            .subnets
            .insert(k(region, subnet_id), availability_zone.to_string());
    }

    /// A Capacity Block reservation's slots: launches into it beyond `count` live instances
    /// fail with `NoCapacity`, and into another zone with `Permanent`. Launches into a
    /// reservation not registered here are not limited.
    pub fn add_reservation_capacity(
        &self,
        reservation_id: &str,
        count: u32,
        availability_zone: Option<&str>,
    ) {
        lock(&self.state).reservations.insert(
            reservation_id.to_string(),
            ReservationSlots {
                count,
                availability_zone: availability_zone.map(str::to_string),
            },
        );
    }

    /// Every launch of this kind fails with `NoCapacity` until [`FakeWorkloads::allow_capacity`].
    pub fn deny_capacity(&self, kind: LaunchKind) {
        lock(&self.state).no_capacity.insert(kind);
    }

    pub fn allow_capacity(&self, kind: LaunchKind) {
        lock(&self.state).no_capacity.remove(&kind);
    }

    /// The state and health new instances start in.
    pub fn set_launch_state(&self, state: InstanceState, health: InstanceHealth) {
        lock(&self.state).launch_state = (state, health);
    }

    /// An instance launched outside this fake (an orphan, or someone else's).
    pub fn add_instance(&self, instance: InstanceInfo) {
        lock(&self.state)
            .instances
            .insert(instance.instance_id.clone(), instance);
    }

    /// Returns whether the instance exists.
    pub fn set_instance_state(&self, instance_id: &str, state: InstanceState) -> bool {
        self.with_instance(instance_id, |i| i.state = state)
    }

    /// Returns whether the instance exists.
    pub fn set_instance_health(&self, instance_id: &str, health: InstanceHealth) -> bool {
        self.with_instance(instance_id, |i| i.health = health)
    }

    /// EC2 schedules `code` (`instance-retirement`, `system-reboot`...) for the instance from
    /// `not_before`, as DescribeInstanceStatus shows it. Returns whether the instance exists.
    pub fn schedule_change(
        &self,
        instance_id: &str,
        code: &str,
        not_before: chrono::DateTime<chrono::Utc>,
    ) -> bool {
        self.with_instance(instance_id, |i| {
            i.scheduled.push(crate::ports::ScheduledChange {
                code: code.into(),
                not_before,
            })
        })
    }

    fn with_instance(&self, instance_id: &str, f: impl FnOnce(&mut InstanceInfo)) -> bool {
        match lock(&self.state).instances.get_mut(instance_id) {
            Some(i) => {
                f(i);
                true
            }
            None => false,
        }
    }

    pub fn instance(&self, instance_id: &str) -> Option<InstanceInfo> {
        lock(&self.state).instances.get(instance_id).cloned()
    }

    /// Every instance, terminated ones included, in launch order.
    pub fn instances(&self) -> Vec<InstanceInfo> {
        lock(&self.state).instances.values().cloned().collect()
    }

    /// Live (pending or running) instances in a reservation.
    pub fn live_in_reservation(&self, reservation_id: &str) -> Vec<InstanceInfo> {
        lock(&self.state)
            .instances
            .values()
            .filter(|i| i.state.is_live() && i.reservation_id.as_deref() == Some(reservation_id))
            .cloned()
            .collect()
    }

    /// Returns whether the job exists.
    pub fn set_job_state(
        &self,
        region: &str,
        job_name: &str,
        state: JobState,
        detail: &str,
        failure_reason: Option<&str>,
    ) -> bool {
        match lock(&self.state).jobs.get_mut(&k(region, job_name)) {
            Some((_, info)) => {
                info.state = state;
                info.detail = detail.to_string();
                info.failure_reason = failure_reason.map(str::to_string);
                true
            }
            None => false,
        }
    }

    pub fn training_job_spec(&self, region: &str, job_name: &str) -> Option<TrainingJobSpec> {
        lock(&self.state)
            .jobs
            .get(&k(region, job_name))
            .map(|(s, _)| s.clone())
    }

    /// A HyperPod cluster; `managed` is whether it carries `capacity-pilot:managed`.
    pub fn add_cluster(&self, region: &str, cluster_name: &str, managed: bool) {
        lock(&self.state).clusters.insert(
            k(region, cluster_name),
            Cluster {
                managed,
                status: "InService".into(),
                groups: BTreeMap::new(),
                roles: BTreeMap::new(),
            },
        );
    }

    /// The cluster's group `group` runs as `role` (DescribeCluster's `ExecutionRole`).
    /// Returns whether the cluster exists.
    pub fn set_group_role(
        &self,
        region: &str,
        cluster_name: &str,
        group: &str,
        role: &str,
    ) -> bool {
        match lock(&self.state).clusters.get_mut(&k(region, cluster_name)) {
            Some(c) => {
                c.roles.insert(group.into(), role.into());
                true
            }
            None => false,
        }
    }

    /// Sets an instance group's counts and status (creating the group if needed).
    /// Returns whether the cluster exists.
    pub fn set_instance_group(
        &self,
        region: &str,
        cluster_name: &str,
        instance_group_name: &str,
        current_count: u32,
        target_count: u32,
        status: &str,
    ) -> bool {
        let mut s = lock(&self.state);
        let Some(c) = s.clusters.get_mut(&k(region, cluster_name)) else {
            return false;
        };
        let managed = c.managed;
        let entry = c
            .groups
            .entry(instance_group_name.to_string())
            .or_insert_with(|| {
                (
                    None,
                    group_info(cluster_name, managed, instance_group_name, 0, ""),
                )
            });
        entry.1.current_count = current_count;
        entry.1.target_count = target_count;
        entry.1.status = status.to_string();
        true
    }

    pub fn instance_group_spec(
        &self,
        region: &str,
        cluster_name: &str,
        instance_group_name: &str,
    ) -> Option<InstanceGroupSpec> {
        lock(&self.state)
            .clusters
            .get(&k(region, cluster_name))
            .and_then(|c| c.groups.get(instance_group_name))
            .and_then(|(spec, _)| spec.clone())
    }

    /// Returns whether the endpoint exists.
    /// An endpoint someone else made: named `endpoint_name` in `region`, with `tags`.
    pub fn add_foreign_endpoint(
        &self,
        region: &str,
        endpoint_name: &str,
        tags: BTreeMap<String, String>,
    ) {
        let spec = EndpointSpec {
            region: region.into(),
            endpoint_name: endpoint_name.into(),
            endpoint_config_name: format!("{endpoint_name}-config"),
            model_name: "their-model".into(),
            variant_name: "primary".into(),
            instance_type: "ml.g5.xlarge".into(),
            instance_count: 1,
            ml_reservation_arn: None,
            tags: tags.clone(),
        };
        lock(&self.state).endpoints.insert(
            k(region, endpoint_name),
            (
                spec,
                EndpointInfo {
                    endpoint_name: endpoint_name.into(),
                    status: "InService".into(),
                    failure_reason: None,
                    tags,
                },
            ),
        );
    }

    /// Whether an endpoint of the name exists, without recording a call.
    pub fn describe_endpoint_now(&self, region: &str, endpoint_name: &str) -> bool {
        lock(&self.state)
            .endpoints
            .contains_key(&k(region, endpoint_name))
    }

    pub fn set_endpoint_status(
        &self,
        region: &str,
        endpoint_name: &str,
        status: &str,
        failure_reason: Option<&str>,
    ) -> bool {
        match lock(&self.state)
            .endpoints
            .get_mut(&k(region, endpoint_name))
        {
            Some((_, info)) => {
                info.status = status.to_string();
                info.failure_reason = failure_reason.map(str::to_string);
                true
            }
            None => false,
        }
    }

    pub fn endpoint_spec(&self, region: &str, endpoint_name: &str) -> Option<EndpointSpec> {
        lock(&self.state)
            .endpoints
            .get(&k(region, endpoint_name))
            .map(|(s, _)| s.clone())
    }

    pub fn endpoint_config_exists(&self, region: &str, endpoint_config_name: &str) -> bool {
        lock(&self.state)
            .endpoint_configs
            .contains(&k(region, endpoint_config_name))
    }

    // ---- faults and calls --------------------------------------------------------------

    /// The next call of `op` returns `error` and does nothing.
    pub fn fail_next(&self, op: WorkloadsOp, error: PortError) {
        lock(&self.state).faults.push(op, Fault::Fail(error));
    }

    /// The next call of `op` takes effect, then returns `error` (a lost response).
    pub fn apply_then_fail_next(&self, op: WorkloadsOp, error: PortError) {
        lock(&self.state)
            .faults
            .push(op, Fault::ApplyThenFail(error));
    }

    /// The next `op` fails with `NoCapacity` (e.g. no on-demand capacity this time).
    pub fn no_capacity_next(&self, op: WorkloadsOp) {
        self.fail_next(op, errors::no_capacity());
    }

    pub fn clear_faults(&self) {
        lock(&self.state).faults.clear();
    }

    pub fn calls(&self) -> Vec<WorkloadsCall> {
        lock(&self.state).calls.clone()
    }

    pub fn calls_of(&self, op: WorkloadsOp) -> Vec<WorkloadsCall> {
        lock(&self.state)
            .calls
            .iter()
            .filter(|c| c.op() == op)
            .cloned()
            .collect()
    }

    /// Logs the call and takes its scripted fault: `Err` to return at once, or an error
    /// to return after the work.
    /// Passes every later call through `gate` ([`Gate`]): crash points between calls.
    pub fn gate(&self, gate: Gate) {
        lock(&self.state).gate = Some(gate);
    }

    async fn pause(&self, what: &str) {
        let gate = lock(&self.state).gate.clone();
        if let Some(g) = gate {
            g.point(what).await;
        }
    }

    fn begin(&self, call: WorkloadsCall) -> Result<Option<PortError>, PortError> {
        let mut s = lock(&self.state);
        let op = call.op();
        s.calls.push(call);
        match s.faults.next(op) {
            Some(Fault::Fail(e)) => Err(e),
            Some(Fault::ApplyThenFail(e)) => Ok(Some(e)),
            None => Ok(None),
        }
    }
}

fn finish<T>(after: Option<PortError>, value: Result<T, PortError>) -> Result<T, PortError> {
    match after {
        Some(e) => {
            value?;
            Err(e)
        }
        None => value,
    }
}

fn group_info(
    cluster_name: &str,
    managed: bool,
    group: &str,
    count: u32,
    status: &str,
) -> InstanceGroupInfo {
    InstanceGroupInfo {
        cluster_name: cluster_name.to_string(),
        cluster_managed: managed,
        instance_group_name: Some(group.to_string()),
        current_count: count,
        target_count: count,
        status: status.to_string(),
        group_roles: Vec::new(),
    }
}

fn ec2_error(code: &str, message: String) -> PortError {
    errors::permanent("ec2", code, message)
}

fn sagemaker_error(code: &str, message: String) -> PortError {
    errors::permanent("sagemaker", code, message)
}

impl State {
    fn launch(&mut self, spec: &LaunchSpec) -> Result<Vec<InstanceInfo>, PortError> {
        if spec.client_token.is_empty() || spec.client_token.len() > MAX_CLIENT_TOKEN {
            return Err(ec2_error(
                "InvalidParameterValue",
                format!(
                    "ClientToken must be 1-{MAX_CLIENT_TOKEN} characters, got {}",
                    spec.client_token.len()
                ),
            ));
        }
        if let Some((first, ids)) = self.tokens.get(&k(&spec.region, &spec.client_token)) {
            if first != spec {
                return Err(ec2_error(
                    "IdempotentParameterMismatch",
                    format!(
                        "client token {} was used with other parameters",
                        spec.client_token
                    ),
                ));
            }
            // EC2 answers a used token with the instances it launched, whatever their state.
            return Ok(ids
                .iter()
                .filter_map(|id| self.instances.get(id).cloned())
                .collect());
        }
        if spec.count == 0 {
            return Err(ec2_error(
                "InvalidParameterValue",
                "count must be at least 1".into(),
            ));
        }
        let Some(zone) = self.subnets.get(&k(&spec.region, &spec.subnet_id)).cloned() else {
            return Err(ec2_error(
                "InvalidSubnetID.NotFound",
                format!("subnet {} does not exist", spec.subnet_id),
            ));
        };
        let kind = LaunchKind::of(&spec.market);
        if let Some((.., code)) = self.refusals.iter().find(|(k, region, z, _)| {
            *k == kind && *region == spec.region && z.as_ref().is_none_or(|z| *z == zone)
        }) {
            return Err(PortError::NoCapacity {
                code: code.clone(),
                message: format!("{kind:?} {} refused in {zone}", spec.instance_type),
            });
        }
        if let Some(n) = self.zone_capacity.get(&(kind, zone.clone())) {
            let live = self
                .instances
                .values()
                .filter(|i| {
                    i.state.is_live()
                        && i.availability_zone == zone
                        && (kind == LaunchKind::CapacityBlock) == i.reservation_id.is_some()
                })
                .count();
            if live + spec.count as usize > *n {
                return Err(PortError::NoCapacity {
                    code: "InsufficientInstanceCapacity".into(),
                    message: format!("no more {kind:?} {} in {zone}", spec.instance_type),
                });
            }
        }
        let subnet = k(&spec.region, &spec.subnet_id);
        if let Some(n) = self.subnet_room.get(&subnet) {
            let live = self
                .instances
                .values()
                .filter(|i| {
                    i.state.is_live() && self.instance_subnets.get(&i.instance_id) == Some(&subnet)
                })
                .count();
            if live + spec.count as usize > *n {
                return Err(PortError::NoCapacity {
                    code: "InsufficientFreeAddressesInSubnet".into(),
                    message: format!(
                        "The specified subnet {} does not contain enough free private IP \
                         addresses to fulfill your request.",
                        spec.subnet_id
                    ),
                });
            }
        }
        if self.no_capacity.contains(&kind) {
            return Err(PortError::NoCapacity {
                code: "InsufficientInstanceCapacity".into(),
                message: format!("no {kind:?} capacity for {}", spec.instance_type),
            });
        }
        let reservation_id = match &spec.market {
            LaunchMarket::CapacityBlock { reservation_id } => Some(reservation_id.clone()),
            _ => None,
        };
        if let Some(rid) = &reservation_id
            && let Some(slots) = self.reservations.get(rid)
        {
            if slots.availability_zone.as_ref().is_some_and(|z| *z != zone) {
                return Err(ec2_error(
                    "InvalidParameterCombination",
                    format!("reservation {rid} is not in {zone}"),
                ));
            }
            let live = self
                .instances
                .values()
                .filter(|i| i.state.is_live() && i.reservation_id.as_deref() == Some(rid))
                .count();
            if live + spec.count as usize > slots.count as usize {
                return Err(PortError::NoCapacity {
                    code: "ReservationCapacityExceeded".into(),
                    message: format!("reservation {rid} has {} slots, {live} in use", slots.count),
                });
            }
        }
        let launched_at = self.clock.as_ref().map(ManualClock::get);
        let (state, health) = self.launch_state;
        let mut launched = Vec::new();
        for _ in 0..spec.count {
            let id = format!("i-{:017x}", self.next_id);
            self.next_id += 1;
            let info = InstanceInfo {
                instance_id: id.clone(),
                region: spec.region.clone(),
                availability_zone: zone.clone(),
                instance_type: spec.instance_type.clone(),
                state,
                health,
                reservation_id: reservation_id.clone(),
                launched_at,
                tags: spec.tags.clone(),
                scheduled: Vec::new(),
            };
            self.instance_subnets.insert(id.clone(), subnet.clone());
            self.instances.insert(id, info.clone());
            launched.push(info);
        }
        self.tokens.insert(
            k(&spec.region, &spec.client_token),
            (
                spec.clone(),
                launched.iter().map(|i| i.instance_id.clone()).collect(),
            ),
        );
        Ok(launched)
    }
}

fn matches_filter(i: &InstanceInfo, region: &str, f: &InstanceFilter) -> bool {
    i.region == region
        && (f.instance_ids.is_empty() || f.instance_ids.contains(&i.instance_id))
        && f.reservation_id
            .as_ref()
            .is_none_or(|r| i.reservation_id.as_ref() == Some(r))
        && f.request_id
            .as_ref()
            .is_none_or(|r| i.tags.get(REQUEST_ID_TAG).map(String::as_str) == Some(r.as_str()))
        && (!f.managed_only || i.tags.contains_key(MANAGED_TAG))
}

impl Workloads for FakeWorkloads {
    async fn launch_instances(&self, spec: &LaunchSpec) -> Result<Vec<InstanceInfo>, PortError> {
        self.pause("LaunchInstances").await;
        let after = self.begin(WorkloadsCall::LaunchInstances(spec.clone()))?;
        let result = lock(&self.state).launch(spec);
        finish(after, result)
    }

    async fn describe_instances(
        &self,
        region: &str,
        filter: &InstanceFilter,
    ) -> Result<Vec<InstanceInfo>, PortError> {
        self.pause("DescribeInstances").await;
        let after = self.begin(WorkloadsCall::DescribeInstances {
            region: region.to_string(),
            filter: filter.clone(),
        })?;
        let s = lock(&self.state);
        let found = s
            .instances
            .values()
            .filter(|i| matches_filter(i, region, filter) && !s.unlisted.contains(&i.instance_id))
            .cloned()
            .collect();
        finish(after, Ok(found))
    }

    async fn terminate_instances(
        &self,
        region: &str,
        instance_ids: &[String],
    ) -> Result<(), PortError> {
        self.pause("TerminateInstances").await;
        let after = self.begin(WorkloadsCall::TerminateInstances {
            region: region.to_string(),
            instance_ids: instance_ids.to_vec(),
        })?;
        let mut s = lock(&self.state);
        for id in instance_ids {
            if let Some(i) = s.instances.get_mut(id)
                && i.region == region
            {
                i.state = InstanceState::Terminated;
            }
        }
        finish(after, Ok(()))
    }

    async fn tag_instances(
        &self,
        region: &str,
        instance_ids: &[String],
        tags: &BTreeMap<String, String>,
    ) -> Result<(), PortError> {
        self.pause("CreateTags").await;
        let after = self.begin(WorkloadsCall::TagInstances {
            region: region.to_string(),
            instance_ids: instance_ids.to_vec(),
            tags: tags.clone(),
        })?;
        let mut s = lock(&self.state);
        for id in instance_ids {
            if let Some(i) = s.instances.get_mut(id)
                && i.region == region
            {
                i.tags.extend(tags.clone());
            }
        }
        finish(after, Ok(()))
    }

    /// Passes, unless a fault is scripted for [`WorkloadsOp::PreflightInstances`]: the
    /// codes EC2 answers are the test's to choose.
    async fn preflight_instances(&self, spec: &LaunchSpec, dry_run: bool) -> Result<(), PortError> {
        self.pause("PreflightInstances").await;
        let after = self.begin(WorkloadsCall::PreflightInstances {
            spec: spec.clone(),
            dry_run,
        })?;
        finish(after, Ok(()))
    }

    async fn model_exists(&self, region: &str, model_name: &str) -> Result<bool, PortError> {
        self.pause("ModelExists").await;
        let after = self.begin(WorkloadsCall::ModelExists {
            region: region.to_string(),
            model_name: model_name.to_string(),
        })?;
        let exists = !lock(&self.state)
            .missing_models
            .contains(&k(region, model_name));
        finish(after, Ok(exists))
    }

    async fn subnet_zones(
        &self,
        region: &str,
        subnet_ids: &[String],
    ) -> Result<Vec<(String, String)>, PortError> {
        self.pause("SubnetZones").await;
        let after = self.begin(WorkloadsCall::SubnetZones {
            region: region.to_string(),
            subnet_ids: subnet_ids.to_vec(),
        })?;
        let s = lock(&self.state);
        let found = subnet_ids
            .iter()
            .filter_map(|id| {
                s.subnets
                    .get(&k(region, id))
                    .map(|z| (id.clone(), z.clone()))
            })
            .collect();
        finish(after, Ok(found))
    }

    async fn subnet_in_zone(
        &self,
        region: &str,
        subnet_ids: &[String],
        availability_zone: &str,
    ) -> Result<Option<String>, PortError> {
        self.pause("SubnetInZone").await;
        let after = self.begin(WorkloadsCall::SubnetInZone {
            region: region.to_string(),
            subnet_ids: subnet_ids.to_vec(),
            availability_zone: availability_zone.to_string(),
        })?;
        let s = lock(&self.state);
        let found = subnet_ids
            .iter()
            .find(|id| s.subnets.get(&k(region, id)).map(String::as_str) == Some(availability_zone))
            .cloned();
        finish(after, Ok(found))
    }

    async fn start_training_job(&self, spec: &TrainingJobSpec) -> Result<(), PortError> {
        self.pause("StartTrainingJob").await;
        let after = self.begin(WorkloadsCall::StartTrainingJob(spec.clone()))?;
        lock(&self.state)
            .jobs
            .entry(k(&spec.region, &spec.job_name))
            .or_insert_with(|| {
                (
                    spec.clone(),
                    JobInfo {
                        job_name: spec.job_name.clone(),
                        state: JobState::InProgress,
                        detail: "Starting".into(),
                        failure_reason: None,
                    },
                )
            });
        finish(after, Ok(()))
    }

    async fn describe_training_job(
        &self,
        region: &str,
        job_name: &str,
    ) -> Result<Option<JobInfo>, PortError> {
        self.pause("DescribeTrainingJob").await;
        let after = self.begin(WorkloadsCall::DescribeTrainingJob {
            region: region.to_string(),
            job_name: job_name.to_string(),
        })?;
        let found = lock(&self.state)
            .jobs
            .get(&k(region, job_name))
            .map(|(_, i)| i.clone());
        finish(after, Ok(found))
    }

    async fn stop_training_job(&self, region: &str, job_name: &str) -> Result<(), PortError> {
        self.pause("StopTrainingJob").await;
        let after = self.begin(WorkloadsCall::StopTrainingJob {
            region: region.to_string(),
            job_name: job_name.to_string(),
        })?;
        let result = match lock(&self.state).jobs.get_mut(&k(region, job_name)) {
            None => Err(sagemaker_error(
                "ResourceNotFound",
                format!("training job {job_name} does not exist"),
            )),
            Some((_, info)) => {
                // Stopping a job that has already stopped or finished changes nothing.
                if info.state == JobState::InProgress {
                    info.state = JobState::Stopping;
                    info.detail = "Stopping".into();
                }
                Ok(())
            }
        };
        finish(after, result)
    }

    async fn describe_instance_group(
        &self,
        region: &str,
        cluster_name: &str,
        instance_group_name: &str,
    ) -> Result<Option<InstanceGroupInfo>, PortError> {
        self.pause("DescribeInstanceGroup").await;
        let after = self.begin(WorkloadsCall::DescribeInstanceGroup {
            region: region.to_string(),
            cluster_name: cluster_name.to_string(),
            instance_group_name: instance_group_name.to_string(),
        })?;
        let found = lock(&self.state)
            .clusters
            .get(&k(region, cluster_name))
            .map(|c| {
                let mut info = match c.groups.get(instance_group_name) {
                    Some((_, info)) => info.clone(),
                    // The cluster exists; the group does not (yet).
                    None => InstanceGroupInfo {
                        cluster_name: cluster_name.to_string(),
                        cluster_managed: c.managed,
                        instance_group_name: None,
                        current_count: 0,
                        target_count: 0,
                        status: c.status.clone(),
                        group_roles: Vec::new(),
                    },
                };
                info.group_roles = c.roles.clone().into_iter().collect();
                info
            });
        finish(after, Ok(found))
    }

    async fn put_instance_group(&self, spec: &InstanceGroupSpec) -> Result<(), PortError> {
        self.pause("PutInstanceGroup").await;
        let after = self.begin(WorkloadsCall::PutInstanceGroup(spec.clone()))?;
        let result = match lock(&self.state)
            .clusters
            .get_mut(&k(&spec.region, &spec.cluster_name))
        {
            None => Err(sagemaker_error(
                "ResourceNotFound",
                format!("cluster {} does not exist", spec.cluster_name),
            )),
            Some(c) => {
                let info = group_info(
                    &spec.cluster_name,
                    c.managed,
                    &spec.instance_group_name,
                    spec.instance_count,
                    "InService",
                );
                c.groups
                    .insert(spec.instance_group_name.clone(), (Some(spec.clone()), info));
                Ok(())
            }
        };
        finish(after, result)
    }

    async fn remove_instance_group(
        &self,
        region: &str,
        cluster_name: &str,
        instance_group_name: &str,
    ) -> Result<bool, PortError> {
        self.pause("RemoveInstanceGroup").await;
        let after = self.begin(WorkloadsCall::RemoveInstanceGroup {
            region: region.to_string(),
            cluster_name: cluster_name.to_string(),
            instance_group_name: instance_group_name.to_string(),
        })?;
        let result = match lock(&self.state).clusters.get_mut(&k(region, cluster_name)) {
            None => Err(sagemaker_error(
                "ResourceNotFound",
                format!("cluster {cluster_name} does not exist"),
            )),
            Some(c) => Ok(c.groups.remove(instance_group_name).is_some()),
        };
        finish(after, result)
    }

    async fn plan_state(
        &self,
        region: &str,
        plan_arn: &str,
    ) -> Result<Option<crate::domain::reservation::ReservationState>, PortError> {
        self.pause("PlanState").await;
        let after = self.begin(WorkloadsCall::PlanState {
            region: region.to_string(),
            plan_arn: plan_arn.to_string(),
        })?;
        let state = lock(&self.state)
            .plan_states
            .get(plan_arn)
            .copied()
            .unwrap_or(crate::domain::reservation::ReservationState::Active);
        finish(after, Ok(Some(state)))
    }

    async fn create_endpoint(&self, spec: &EndpointSpec) -> Result<EndpointCreation, PortError> {
        self.pause("CreateEndpoint").await;
        let after = self.begin(WorkloadsCall::CreateEndpoint(spec.clone()))?;
        let mut s = lock(&self.state);
        s.endpoint_configs
            .insert(k(&spec.region, &spec.endpoint_config_name));
        if s.hidden_endpoint_configs > 0 {
            s.hidden_endpoint_configs -= 1;
            return finish(
                after,
                Ok(EndpointCreation::ConfigNotVisible(format!(
                    "Could not find endpoint configuration {}",
                    spec.endpoint_config_name
                ))),
            );
        }
        s.endpoints
            .entry(k(&spec.region, &spec.endpoint_name))
            .or_insert_with(|| {
                (
                    spec.clone(),
                    EndpointInfo {
                        endpoint_name: spec.endpoint_name.clone(),
                        status: "Creating".into(),
                        failure_reason: None,
                        // SageMaker adds our managed tag to what we create.
                        tags: {
                            let mut t = spec.tags.clone();
                            t.entry(crate::domain::naming::MANAGED_TAG.into())
                                .or_insert_with(|| "true".into());
                            t
                        },
                    },
                )
            });
        finish(after, Ok(EndpointCreation::Created))
    }

    async fn describe_endpoint(
        &self,
        region: &str,
        endpoint_name: &str,
    ) -> Result<Option<EndpointInfo>, PortError> {
        self.pause("DescribeEndpoint").await;
        let after = self.begin(WorkloadsCall::DescribeEndpoint {
            region: region.to_string(),
            endpoint_name: endpoint_name.to_string(),
        })?;
        let found = lock(&self.state)
            .endpoints
            .get(&k(region, endpoint_name))
            .map(|(_, i)| i.clone());
        finish(after, Ok(found))
    }

    async fn delete_endpoint(
        &self,
        region: &str,
        endpoint_name: &str,
        endpoint_config_name: &str,
    ) -> Result<(), PortError> {
        self.pause("DeleteEndpoint").await;
        let after = self.begin(WorkloadsCall::DeleteEndpoint {
            region: region.to_string(),
            endpoint_name: endpoint_name.to_string(),
            endpoint_config_name: endpoint_config_name.to_string(),
        })?;
        let mut s = lock(&self.state);
        s.endpoints.remove(&k(region, endpoint_name));
        s.endpoint_configs.remove(&k(region, endpoint_config_name));
        finish(after, Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::request::{LaunchTemplateRef, RequestId};
    use chrono::{TimeZone, Utc};

    const REGION: &str = "us-east-1";

    fn world() -> FakeWorkloads {
        let w = FakeWorkloads::new();
        w.add_subnet(REGION, "subnet-a", "us-east-1a");
        w.add_subnet(REGION, "subnet-b", "us-east-1b");
        w
    }

    fn spec(market: LaunchMarket, count: u32, token: &str) -> LaunchSpec {
        LaunchSpec {
            region: REGION.into(),
            market,
            instance_type: "p5.48xlarge".into(),
            count,
            subnet_id: "subnet-a".into(),
            launch_template: LaunchTemplateRef {
                id: Some("lt-1".into()),
                name: None,
                version: None,
            },
            client_token: token.into(),
            tags: BTreeMap::from([
                (MANAGED_TAG.to_string(), "true".to_string()),
                (REQUEST_ID_TAG.to_string(), "r-1".to_string()),
            ]),
        }
    }

    fn block(id: &str) -> LaunchMarket {
        LaunchMarket::CapacityBlock {
            reservation_id: id.into(),
        }
    }

    #[tokio::test]
    async fn the_same_client_token_returns_the_same_instances_even_when_terminated() {
        // GIVEN two instances launched with token t1
        let w = world().with_clock(ManualClock::new(
            Utc.with_ymd_and_hms(2026, 12, 7, 11, 30, 0).unwrap(),
        ));
        let first = w
            .launch_instances(&spec(block("cr-1"), 2, "t1"))
            .await
            .unwrap();
        assert_eq!(first.len(), 2);
        assert_eq!(first[0].state, InstanceState::Pending);
        assert_eq!(first[0].availability_zone, "us-east-1a");
        assert_eq!(first[0].reservation_id.as_deref(), Some("cr-1"));
        assert!(first[0].launched_at.is_some());
        w.terminate_instances(REGION, &[first[0].instance_id.clone()])
            .await
            .unwrap();
        // WHEN the launch is repeated with the same token
        let again = w
            .launch_instances(&spec(block("cr-1"), 2, "t1"))
            .await
            .unwrap();
        // THEN the same instances come back, in their current state, and none is added
        assert_eq!(
            again.iter().map(|i| &i.instance_id).collect::<Vec<_>>(),
            first.iter().map(|i| &i.instance_id).collect::<Vec<_>>()
        );
        assert_eq!(again[0].state, InstanceState::Terminated);
        assert_eq!(w.instances().len(), 2);
    }

    #[tokio::test]
    async fn a_reused_token_with_other_parameters_is_refused() {
        let w = world();
        w.launch_instances(&spec(LaunchMarket::OnDemand, 1, "t1"))
            .await
            .unwrap();
        let err = w
            .launch_instances(&spec(LaunchMarket::OnDemand, 2, "t1"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("IdempotentParameterMismatch"));
    }

    #[tokio::test]
    async fn a_token_longer_than_64_characters_is_refused() {
        let w = world();
        let long = "x".repeat(65);
        let err = w
            .launch_instances(&spec(LaunchMarket::OnDemand, 1, &long))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("InvalidParameterValue"));
        assert!(w.instances().is_empty());
    }

    #[tokio::test]
    async fn a_reservation_holds_only_its_slots_until_an_instance_terminates() {
        // GIVEN a two-slot reservation in us-east-1a with both slots used
        let w = world();
        w.add_reservation_capacity("cr-1", 2, Some("us-east-1a"));
        let used = w
            .launch_instances(&spec(block("cr-1"), 2, "t1"))
            .await
            .unwrap();
        // WHEN a third instance is launched
        let err = w
            .launch_instances(&spec(block("cr-1"), 1, "t2"))
            .await
            .unwrap_err();
        // THEN there is no capacity
        assert!(matches!(err, PortError::NoCapacity { .. }));
        // AND after one terminates, its slot returns
        w.terminate_instances(REGION, &[used[1].instance_id.clone()])
            .await
            .unwrap();
        assert_eq!(
            w.launch_instances(&spec(block("cr-1"), 1, "t2"))
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(w.live_in_reservation("cr-1").len(), 2);
    }

    #[tokio::test]
    async fn a_launch_into_a_reservation_from_another_zone_is_refused() {
        let w = world();
        w.add_reservation_capacity("cr-1", 2, Some("us-east-1a"));
        let mut s = spec(block("cr-1"), 1, "t1");
        s.subnet_id = "subnet-b".into();
        assert!(matches!(
            w.launch_instances(&s).await,
            Err(PortError::Permanent { .. })
        ));
    }

    #[tokio::test]
    async fn denied_on_demand_capacity_fails_until_allowed_and_spot_is_unaffected() {
        let w = world();
        w.deny_capacity(LaunchKind::OnDemand);
        assert!(matches!(
            w.launch_instances(&spec(LaunchMarket::OnDemand, 1, "t1"))
                .await,
            Err(PortError::NoCapacity { .. })
        ));
        assert!(
            w.launch_instances(&spec(LaunchMarket::Spot, 1, "t2"))
                .await
                .is_ok()
        );
        w.allow_capacity(LaunchKind::OnDemand);
        assert!(
            w.launch_instances(&spec(LaunchMarket::OnDemand, 1, "t1"))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_scripted_no_capacity_fails_once_and_launches_nothing() {
        let w = world();
        w.no_capacity_next(WorkloadsOp::LaunchInstances);
        assert!(matches!(
            w.launch_instances(&spec(LaunchMarket::OnDemand, 1, "t1"))
                .await,
            Err(PortError::NoCapacity { .. })
        ));
        assert!(w.instances().is_empty());
        assert!(
            w.launch_instances(&spec(LaunchMarket::OnDemand, 1, "t1"))
                .await
                .is_ok()
        );
        assert_eq!(w.calls_of(WorkloadsOp::LaunchInstances).len(), 2);
    }

    #[tokio::test]
    async fn a_lost_launch_response_launches_and_the_retry_gets_the_same_instances() {
        let w = world();
        w.apply_then_fail_next(WorkloadsOp::LaunchInstances, errors::outcome_unknown("ec2"));
        assert!(
            w.launch_instances(&spec(LaunchMarket::OnDemand, 1, "t1"))
                .await
                .is_err()
        );
        let retry = w
            .launch_instances(&spec(LaunchMarket::OnDemand, 1, "t1"))
            .await
            .unwrap();
        assert_eq!(w.instances(), retry);
    }

    #[tokio::test]
    async fn describe_filters_by_ids_reservation_request_and_management() {
        // GIVEN a managed instance of r-1 in cr-1, and an unmanaged one
        let w = world();
        let ours = w
            .launch_instances(&spec(block("cr-1"), 1, "t1"))
            .await
            .unwrap();
        let mut theirs = spec(LaunchMarket::OnDemand, 1, "t2");
        theirs.tags.clear();
        w.launch_instances(&theirs).await.unwrap();
        let r1 = RequestId::parse("r-1").unwrap();
        // WHEN / THEN each filter narrows to ours
        for filter in [
            InstanceFilter {
                managed_only: true,
                ..Default::default()
            },
            InstanceFilter {
                request_id: Some(r1.clone()),
                ..Default::default()
            },
            InstanceFilter {
                reservation_id: Some("cr-1".into()),
                ..Default::default()
            },
            InstanceFilter {
                instance_ids: vec![ours[0].instance_id.clone()],
                ..Default::default()
            },
        ] {
            assert_eq!(w.describe_instances(REGION, &filter).await.unwrap(), ours);
        }
        assert_eq!(
            w.describe_instances(REGION, &InstanceFilter::default())
                .await
                .unwrap()
                .len(),
            2
        );
        assert!(
            w.describe_instances("eu-west-1", &InstanceFilter::default())
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn health_and_state_set_by_the_test_are_what_describe_reports() {
        let w = world();
        let i = w
            .launch_instances(&spec(LaunchMarket::OnDemand, 1, "t1"))
            .await
            .unwrap()
            .remove(0);
        assert!(w.set_instance_state(&i.instance_id, InstanceState::Running));
        assert!(w.set_instance_health(&i.instance_id, InstanceHealth::Impaired));
        let seen = w.instance(&i.instance_id).unwrap();
        assert_eq!(
            (seen.state, seen.health),
            (InstanceState::Running, InstanceHealth::Impaired)
        );
    }

    #[tokio::test]
    async fn terminating_is_idempotent() {
        let w = world();
        let i = w
            .launch_instances(&spec(LaunchMarket::OnDemand, 1, "t1"))
            .await
            .unwrap()
            .remove(0);
        let ids = vec![i.instance_id.clone(), "i-unknown".to_string()];
        w.terminate_instances(REGION, &ids).await.unwrap();
        w.terminate_instances(REGION, &ids).await.unwrap();
        assert_eq!(
            w.instance(&i.instance_id).unwrap().state,
            InstanceState::Terminated
        );
    }

    #[tokio::test]
    async fn the_first_subnet_in_the_zone_is_chosen() {
        let w = world();
        w.add_subnet(REGION, "subnet-b2", "us-east-1b");
        let ids = vec!["subnet-a".into(), "subnet-b".into(), "subnet-b2".into()];
        assert_eq!(
            w.subnet_in_zone(REGION, &ids, "us-east-1b").await.unwrap(),
            Some("subnet-b".into())
        );
        assert_eq!(
            w.subnet_in_zone(REGION, &ids, "us-east-1c").await.unwrap(),
            None
        );
    }

    fn job(name: &str) -> TrainingJobSpec {
        TrainingJobSpec {
            region: REGION.into(),
            job_name: name.into(),
            role_arn: "arn:aws:iam::123456789012:role/train".into(),
            training_image: "img".into(),
            output_s3_uri: "s3://out".into(),
            instance_type: "ml.p5.48xlarge".into(),
            instance_count: 1,
            volume_size_gb: 100,
            training_plan_arn: None,
            max_runtime_seconds: 3600,
            hyper_parameters: BTreeMap::new(),
            tags: BTreeMap::new(),
        }
    }

    #[tokio::test]
    async fn a_training_job_starts_once_by_name_and_stops() {
        // GIVEN a started job
        let w = world();
        w.start_training_job(&job("j1")).await.unwrap();
        // WHEN it is started again with other parameters
        let mut other = job("j1");
        other.instance_count = 4;
        w.start_training_job(&other).await.unwrap();
        // THEN the first job stands
        assert_eq!(w.training_job_spec(REGION, "j1").unwrap().instance_count, 1);
        let info = w
            .describe_training_job(REGION, "j1")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.state, JobState::InProgress);
        // AND stopping moves it to Stopping; a stopped job stays stopped
        w.stop_training_job(REGION, "j1").await.unwrap();
        assert_eq!(
            w.describe_training_job(REGION, "j1")
                .await
                .unwrap()
                .unwrap()
                .state,
            JobState::Stopping
        );
        assert!(w.set_job_state(REGION, "j1", JobState::Stopped, "Stopped", None));
        w.stop_training_job(REGION, "j1").await.unwrap();
        assert_eq!(
            w.describe_training_job(REGION, "j1")
                .await
                .unwrap()
                .unwrap()
                .state,
            JobState::Stopped
        );
        // AND a missing job is None, and can't be stopped
        assert!(
            w.describe_training_job(REGION, "nope")
                .await
                .unwrap()
                .is_none()
        );
        assert!(w.stop_training_job(REGION, "nope").await.is_err());
    }

    fn group(cluster: &str, count: u32) -> InstanceGroupSpec {
        InstanceGroupSpec {
            region: REGION.into(),
            cluster_name: cluster.into(),
            instance_group_name: "workers".into(),
            instance_type: "ml.p5.48xlarge".into(),
            instance_count: count,
            training_plan_arn: None,
            execution_role_arn: "arn:aws:iam::123456789012:role/hp".into(),
            life_cycle_source_s3_uri: None,
            life_cycle_on_create: None,
        }
    }

    #[tokio::test]
    async fn instance_groups_report_the_cluster_management_and_resize() {
        // GIVEN a managed and an unmanaged cluster
        let w = world();
        w.add_cluster(REGION, "ours", true);
        w.add_cluster(REGION, "theirs", false);
        // THEN a missing group shows its cluster and no group name; a missing cluster is None
        let before = w
            .describe_instance_group(REGION, "ours", "workers")
            .await
            .unwrap()
            .unwrap();
        assert!(before.cluster_managed);
        assert_eq!(before.instance_group_name, None);
        assert!(
            !w.describe_instance_group(REGION, "theirs", "workers")
                .await
                .unwrap()
                .unwrap()
                .cluster_managed
        );
        assert!(
            w.describe_instance_group(REGION, "gone", "workers")
                .await
                .unwrap()
                .is_none()
        );
        // WHEN the group is put, then resized
        w.put_instance_group(&group("ours", 4)).await.unwrap();
        w.put_instance_group(&group("ours", 2)).await.unwrap();
        let after = w
            .describe_instance_group(REGION, "ours", "workers")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((after.current_count, after.target_count), (2, 2));
        assert!(w.set_instance_group(REGION, "ours", "workers", 1, 2, "Updating"));
        assert_eq!(
            w.describe_instance_group(REGION, "ours", "workers")
                .await
                .unwrap()
                .unwrap()
                .current_count,
            1
        );
        // AND a put on a missing cluster fails
        assert!(w.put_instance_group(&group("gone", 1)).await.is_err());
        assert_eq!(w.calls_of(WorkloadsOp::PutInstanceGroup).len(), 3);
    }

    fn endpoint() -> EndpointSpec {
        EndpointSpec {
            region: REGION.into(),
            endpoint_name: "ep".into(),
            endpoint_config_name: "ep-config".into(),
            model_name: "m".into(),
            variant_name: "v".into(),
            instance_type: "ml.p5.48xlarge".into(),
            instance_count: 1,
            ml_reservation_arn: None,
            tags: BTreeMap::new(),
        }
    }

    #[tokio::test]
    async fn endpoints_are_created_once_by_name_and_deleting_a_missing_one_succeeds() {
        let w = world();
        w.create_endpoint(&endpoint()).await.unwrap();
        assert!(w.set_endpoint_status(REGION, "ep", "InService", None));
        w.create_endpoint(&endpoint()).await.unwrap();
        assert_eq!(
            w.describe_endpoint(REGION, "ep")
                .await
                .unwrap()
                .unwrap()
                .status,
            "InService"
        );
        assert!(w.endpoint_config_exists(REGION, "ep-config"));
        w.delete_endpoint(REGION, "ep", "ep-config").await.unwrap();
        assert!(w.describe_endpoint(REGION, "ep").await.unwrap().is_none());
        assert!(!w.endpoint_config_exists(REGION, "ep-config"));
        w.delete_endpoint(REGION, "ep", "ep-config").await.unwrap();
    }

    #[tokio::test]
    async fn a_scripted_throttle_fails_one_call_of_that_operation() {
        let w = world();
        w.fail_next(
            WorkloadsOp::DescribeEndpoint,
            errors::throttled("sagemaker"),
        );
        assert!(
            w.describe_endpoint(REGION, "ep")
                .await
                .unwrap_err()
                .is_retryable()
        );
        assert!(w.describe_endpoint(REGION, "ep").await.is_ok());
    }
}
