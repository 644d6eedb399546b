//! One home per workload kind: the handlers decide *when* to check, launch, undo or drain a
//! request's workload; the kind's module decides *how*. This dispatcher is the only place
//! outside the kind modules (and the request parser) that tells the kinds apart, so a new
//! kind, or a change to one, touches one module and one `match` here.

pub mod claims;
pub mod ec2_instances;
pub mod hyperpod_cluster;
pub mod inference_endpoint;
pub mod preflight;
pub mod refusal;
pub mod training_job;

#[cfg(all(test, feature = "test-util"))]
mod tests;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::config::Config;
use crate::domain::naming::{DRAIN_AT_TAG, drain_at_value, resource_tags};
use crate::domain::offering::Offering;
use crate::domain::planner::Rejection;
use crate::domain::request::{CapacityRequest, FieldError, WorkloadDetail};
use crate::ports::{
    Deadline, LaunchMarket, PortError, RequestRecord, Store, WorkloadRecord, Workloads,
};
use hyperpod_cluster::Group;

/// Where and how one launch runs: in a reservation's window, or on demand or spot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The reservation id, or `on-demand` / `spot`: the key of the workload records.
    pub reservation_id: String,
    /// What client tokens are derived from (the reservation id for a block).
    pub token_base: String,
    pub market: LaunchMarket,
    /// The training plan ARN, for SageMaker workloads on a plan.
    pub plan_arn: Option<String>,
    pub region: String,
    pub instance_type: String,
    pub instance_count: u32,
    pub availability_zone: Option<String>,
    /// The subnet to launch EC2 instances in, when no zone decides it.
    pub subnet_id: Option<String>,
    pub segment: u32,
    /// When the workload must be gone; a training job's max runtime stops it by then.
    pub must_end_by: DateTime<Utc>,
    /// When the window's drain starts, for a launch into a window: EC2 instances carry it as
    /// `capacity-pilot:drain-at`, so the workload can checkpoint before it is stopped.
    pub drain_at: Option<DateTime<Utc>>,
    /// The extension whose paid end reopened the window ([`crate::domain::window::relaunch_after`]):
    /// what was launched in it before is replaced (a drained workload launched again, a
    /// training job's follow-on), under names and client tokens of its own.
    pub relaunch: Option<u32>,
}

/// What one launch attempt came to, short of an error worth retrying as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    Done(Vec<String>),
    /// No capacity (yet), or AWS refused for the account or the zone (`code`, see
    /// [`refusal`]): a block waits for the next tick; on-demand tries its next placement.
    NoCapacity {
        code: String,
        why: String,
    },
    /// Retrying cannot help: the request fails with this reason.
    Refuse(String),
    /// Begun, not finished: SageMaker finds on-demand capacity for a training job (or fails
    /// it) asynchronously, or the invocation's time ran out part-way through a block's
    /// instances; nothing is committed until the next tick looks again.
    Starting(String),
}

/// A failed launch call, classified for [`Launch`]; anything else is retried next tick.
pub fn settle(e: PortError, what: &str) -> Result<Launch, PortError> {
    match e {
        PortError::NoCapacity { code, message } => Ok(Launch::NoCapacity {
            why: format!(
                "no capacity for {what}: {} ({code}: {message})",
                refusal::of(&code).means
            ),
            code,
        }),
        e @ PortError::Permanent { .. } => Ok(Launch::Refuse(format!("{what} was refused: {e}"))),
        e => Err(e),
    }
}

/// What a drain acts on: one reserved window (or an on-demand run) of a request, as
/// cleanup-expired sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainTarget {
    pub reservation_ids: Vec<String>,
    /// Where its workload runs; on-demand runs may be in any of the request's regions.
    pub regions: Vec<String>,
    /// Index among the request's windows, in time order.
    pub segment: u32,
    pub instance_type: String,
    pub on_demand: bool,
    /// The request's last window: nothing of it runs after, so a HyperPod group is removed
    /// from its cluster rather than left at zero on a plan about to expire.
    pub last: bool,
}

/// Why a request cannot be accepted, found by asking AWS rather than by parsing: a HyperPod
/// cluster we do not manage, or a group or an endpoint of the request's name that is not
/// ours (ARCHITECTURE §8.7).
pub async fn submission_problem<W: Workloads, S: Store>(
    workloads: &W,
    store: &S,
    config: &Config,
    req: &CapacityRequest,
    now: DateTime<Utc>,
) -> Result<Option<FieldError>, PortError> {
    let deployment = config.deployment_id.as_str();
    match &req.workload {
        WorkloadDetail::HyperpodCluster {
            cluster_name,
            instance_group_name,
            life_cycle_config,
        } => {
            let group = Group::new(cluster_name, instance_group_name, life_cycle_config);
            hyperpod_cluster::submission_problem(workloads, store, config, req, &group, now).await
        }
        WorkloadDetail::InferenceEndpoint { endpoint_name, .. } => {
            inference_endpoint::submission_problem(
                workloads,
                &req.regions,
                &req.id,
                deployment,
                endpoint_name,
            )
            .await
        }
        WorkloadDetail::Ec2Instances { .. } | WorkloadDetail::TrainingJob(_) => Ok(None),
    }
}

/// The offerings the request's workload can use, in their order, and a reason for each it
/// cannot: an offering the workload cannot use is never planned, so never bought.
pub async fn usable<W: Workloads>(
    workloads: &W,
    req: &CapacityRequest,
    offerings: &[Offering],
) -> Result<(Vec<Offering>, Vec<Rejection>), PortError> {
    match &req.workload {
        WorkloadDetail::Ec2Instances { subnet_ids, .. } => {
            ec2_instances::usable(workloads, subnet_ids, offerings).await
        }
        WorkloadDetail::HyperpodCluster {
            cluster_name,
            instance_group_name,
            life_cycle_config,
        } => {
            let group = Group::new(cluster_name, instance_group_name, life_cycle_config);
            hyperpod_cluster::usable(workloads, &group, offerings).await
        }
        WorkloadDetail::TrainingJob(_) | WorkloadDetail::InferenceEndpoint { .. } => {
            Ok((offerings.to_vec(), vec![]))
        }
    }
}

/// Where on-demand or spot may launch, in the order tried: each of the request's regions in
/// turn, and in each, for EC2 instances, each of the request's subnets there (the SageMaker
/// kinds have no subnet: the region is the placement). Empty: nowhere, for
/// [`no_placement`]'s reason.
pub async fn placements<W: Workloads>(
    workloads: &W,
    req: &CapacityRequest,
) -> Result<Vec<refusal::Placement>, PortError> {
    match &req.workload {
        WorkloadDetail::Ec2Instances { subnet_ids, .. } => {
            ec2_instances::placements(workloads, &req.regions, subnet_ids).await
        }
        WorkloadDetail::TrainingJob(_)
        | WorkloadDetail::HyperpodCluster { .. }
        | WorkloadDetail::InferenceEndpoint { .. } => Ok(req
            .regions
            .iter()
            .map(|region| refusal::Placement {
                region: region.clone(),
                subnet: None,
            })
            .collect()),
    }
}

/// Why [`placements`] found nowhere to launch on demand.
pub fn no_placement(req: &CapacityRequest) -> String {
    match &req.workload {
        WorkloadDetail::Ec2Instances { subnet_ids, .. } => {
            ec2_instances::no_placement(&req.regions, subnet_ids)
        }
        WorkloadDetail::TrainingJob(_)
        | WorkloadDetail::HyperpodCluster { .. }
        | WorkloadDetail::InferenceEndpoint { .. } => {
            "on-demand-first: the request names no region".to_string()
        }
    }
}

/// Whether the request's workload is EC2 instances we launch, watch and terminate
/// ourselves (the other kinds are SageMaker's to run).
pub fn runs_instances(req: &CapacityRequest) -> bool {
    match &req.workload {
        WorkloadDetail::Ec2Instances { .. } => true,
        WorkloadDetail::TrainingJob(_)
        | WorkloadDetail::HyperpodCluster { .. }
        | WorkloadDetail::InferenceEndpoint { .. } => false,
    }
}

/// Whether an on-demand-first request may also try spot: only interruptible EC2 instances
/// can run on spot.
pub fn spot_allowed(req: &CapacityRequest) -> bool {
    req.interruptible && runs_instances(req)
}

/// Launches what the request's workload needs in `target`, skipping what is recorded, within
/// the invocation's `deadline`. An on-demand training job is `Done` only once SageMaker has
/// placed it.
#[allow(clippy::too_many_arguments)]
pub async fn launch<W: Workloads, S: Store>(
    workloads: &W,
    store: &S,
    config: &Config,
    rec: &RequestRecord,
    target: &Target,
    now: DateTime<Utc>,
    deadline: &dyn Deadline,
) -> Result<Launch, PortError> {
    let recorded: BTreeMap<u32, WorkloadRecord> = store
        .workloads(&rec.request_id)
        .await?
        .into_iter()
        .filter(|w| w.reservation_id == target.reservation_id)
        .map(|w| (w.slot, w))
        .collect();
    let mut tags = resource_tags(
        &rec.request.tags,
        &rec.request_id,
        &rec.team,
        &config.deployment_id,
    );
    // Instances can read their own tags from the instance metadata; SageMaker's cannot.
    if let (WorkloadDetail::Ec2Instances { .. }, Some(at)) =
        (&rec.request.workload, target.drain_at)
    {
        tags.insert(DRAIN_AT_TAG.into(), drain_at_value(at));
    }
    let l = Launching {
        workloads,
        store,
        config,
        rec,
        target,
        now,
        tags,
        recorded,
        deadline,
    };
    match &rec.request.workload {
        WorkloadDetail::Ec2Instances {
            launch_template,
            subnet_ids,
            ..
        } => ec2_instances::launch(&l, launch_template.as_ref(), subnet_ids).await,
        WorkloadDetail::TrainingJob(template) => training_job::launch(&l, template).await,
        WorkloadDetail::InferenceEndpoint {
            model_name,
            endpoint_name,
            variant_name,
        } => {
            let endpoint = inference_endpoint::Endpoint {
                model_name,
                endpoint_name,
                variant_name,
            };
            inference_endpoint::launch(&l, &endpoint).await
        }
        WorkloadDetail::HyperpodCluster {
            cluster_name,
            instance_group_name,
            life_cycle_config,
        } => {
            let group = Group::new(cluster_name, instance_group_name, life_cycle_config);
            hyperpod_cluster::launch(&l, &group).await
        }
    }
}

/// Takes back a launch in `target` that will not be kept (no capacity after a partial
/// start, or a refusal), so nothing runs undebited. Only EC2 instances can be part-started;
/// the SageMaker kinds are one call each. What the attempt's hold started in all is
/// [`started_in_hold`]'s to count.
pub async fn undo<W: Workloads, S: Store>(
    workloads: &W,
    store: &S,
    rec: &RequestRecord,
    target: &Target,
    now: DateTime<Utc>,
) -> Result<(), PortError> {
    match &rec.request.workload {
        WorkloadDetail::Ec2Instances { .. } => {
            ec2_instances::undo(workloads, store, rec, target, now).await
        }
        WorkloadDetail::TrainingJob(_)
        | WorkloadDetail::HyperpodCluster { .. }
        | WorkloadDetail::InferenceEndpoint { .. } => Ok(()),
    }
}

/// How many instances the hold of `rec`'s run started in its attempt `reservation_id`, by
/// the table: each ran, so each is billed an hour. Only EC2 instances are taken back in
/// part; a SageMaker kind's attempt that did not launch started nothing billed here.
pub async fn started_in_hold<S: Store>(
    store: &S,
    rec: &RequestRecord,
    reservation_id: &str,
) -> Result<usize, PortError> {
    match &rec.request.workload {
        WorkloadDetail::Ec2Instances { .. } => {
            ec2_instances::started_in_hold(store, rec, reservation_id).await
        }
        WorkloadDetail::TrainingJob(_)
        | WorkloadDetail::HyperpodCluster { .. }
        | WorkloadDetail::InferenceEndpoint { .. } => Ok(0),
    }
}

/// Stops the window's workload ahead of forced termination; returns what it acted on
/// (`instance:…`, `training-job:…`, `instance-group:…`, `endpoint:…`). Every call is
/// idempotent, so a repeat (a second invocation, a retry) changes nothing.
pub async fn drain<W: Workloads, S: Store>(
    workloads: &W,
    store: &S,
    config: &Config,
    rec: &RequestRecord,
    target: &DrainTarget,
) -> Result<Vec<String>, PortError> {
    let id = &rec.request_id;
    match &rec.request.workload {
        WorkloadDetail::Ec2Instances { .. } => {
            ec2_instances::drain(workloads, store, id, &config.deployment_id, target).await
        }
        WorkloadDetail::TrainingJob(_) => training_job::drain(workloads, store, id, target).await,
        WorkloadDetail::HyperpodCluster {
            cluster_name,
            instance_group_name,
            life_cycle_config,
        } => {
            let group = Group::new(cluster_name, instance_group_name, life_cycle_config);
            hyperpod_cluster::drain(workloads, store, config, id, target, &group).await
        }
        WorkloadDetail::InferenceEndpoint { endpoint_name, .. } => {
            inference_endpoint::drain(workloads, id, &config.deployment_id, target, endpoint_name)
                .await
        }
    }
}

/// One launch under way: what every kind's launch reads, gathered once by [`launch`].
struct Launching<'a, W, S> {
    workloads: &'a W,
    store: &'a S,
    config: &'a Config,
    rec: &'a RequestRecord,
    target: &'a Target,
    now: DateTime<Utc>,
    /// The request's tags plus ours, for everything the launch creates.
    tags: BTreeMap<String, String>,
    /// What earlier runs already launched in the target, by slot (or segment): a retry
    /// finds these instead of starting new ones.
    recorded: BTreeMap<u32, WorkloadRecord>,
    /// The invocation's time left.
    deadline: &'a dyn Deadline,
}

impl<W, S> Launching<'_, W, S> {
    /// The record of a resource launched in the target, at the launch's generation 0 and the
    /// window's relaunch.
    fn record(&self, slot: u32, resource_id: String, state: &str) -> WorkloadRecord {
        WorkloadRecord {
            relaunch: self.target.relaunch.unwrap_or(0),
            ..WorkloadRecord::new(
                self.rec.request_id.clone(),
                self.target.reservation_id.clone(),
                slot,
                resource_id,
                state,
                self.now,
            )
        }
    }

    /// Whether `w` records what a relaunch of the window replaces: launched before the
    /// extension that reopened it.
    fn stale(&self, w: &WorkloadRecord) -> bool {
        self.target.relaunch.is_some_and(|n| w.relaunch < n)
    }

    /// What is recorded in the target's `slot` for the window as it now runs: a record the
    /// relaunch replaces counts as none.
    fn current(&self, slot: u32) -> Option<&WorkloadRecord> {
        self.recorded.get(&slot).filter(|w| !self.stale(w))
    }
}

/// An offering the workload cannot use, with why.
fn rejection(o: &Offering, reason: String) -> Rejection {
    Rejection {
        offering_id: o.id.clone(),
        region: o.region.clone(),
        reason,
    }
}
