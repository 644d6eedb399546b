//! An instance group of an existing HyperPod cluster: we never create the cluster, only
//! size one of its groups, so every step first checks that the cluster carries our managed
//! tag; capacity-pilot changes no cluster it does not manage.

use std::collections::BTreeMap;

use tracing::{info, warn};

use super::{DrainTarget, Launch, Launching, rejection, settle};
use crate::config::Config;
use crate::domain::naming::MANAGED_TAG;
use crate::domain::offering::Offering;
use crate::domain::planner::Rejection;
use crate::domain::request::{CapacityRequest, FieldError, LifeCycleConfig, RequestId};
use crate::ports::{ClaimKey, InstanceGroupSpec, PortError, Store, Workloads};
use chrono::{DateTime, Utc};

use super::claims;

/// The state of a group's record written before the UpdateCluster call that creates it.
const REQUESTED: &str = "Requested";

/// Whether our table records that this request created the group `resource`
/// (`cluster/group`): groups carry no tags, so the table is the only mark (§8.7).
async fn ours<S: Store>(store: &S, id: &RequestId, resource: &str) -> Result<bool, PortError> {
    Ok(store
        .workloads(id)
        .await?
        .iter()
        .any(|w| w.resource_id == resource))
}

/// The request's group, as its workload names it.
pub(super) struct Group<'a> {
    cluster_name: &'a str,
    instance_group_name: &'a str,
    life_cycle_config: Option<&'a LifeCycleConfig>,
}

impl<'a> Group<'a> {
    pub(super) fn new(
        cluster_name: &'a str,
        instance_group_name: &'a str,
        life_cycle_config: &'a Option<LifeCycleConfig>,
    ) -> Group<'a> {
        Group {
            cluster_name,
            instance_group_name,
            life_cycle_config: life_cycle_config.as_ref(),
        }
    }

    /// `<cluster>/<group>`: its workload records' resource id, and its claim's name.
    fn resource(&self) -> String {
        format!("{}/{}", self.cluster_name, self.instance_group_name)
    }

    /// The group at `instance_count` (0 scales it away), on the plan when there is one.
    fn spec(
        &self,
        region: &str,
        config: &Config,
        instance_type: &str,
        instance_count: u32,
        training_plan_arn: Option<String>,
    ) -> InstanceGroupSpec {
        InstanceGroupSpec {
            region: region.to_string(),
            cluster_name: self.cluster_name.to_string(),
            instance_group_name: self.instance_group_name.to_string(),
            instance_type: instance_type.to_string(),
            instance_count,
            training_plan_arn,
            execution_role_arn: config.sagemaker_execution_role_arn.clone(),
            life_cycle_source_s3_uri: self.life_cycle_config.map(|l| l.source_s3_uri.clone()),
            life_cycle_on_create: self.life_cycle_config.map(|l| l.on_create.clone()),
        }
    }
}

/// Whether the group may be taken over by request `id`: our table records that another of
/// its requests created it and has left its claim (ARCHITECTURE §9.8).
async fn left_to_us<S: Store>(
    store: &S,
    region: &str,
    g: &Group<'_>,
    id: &RequestId,
    now: DateTime<Utc>,
) -> Result<bool, PortError> {
    let key = ClaimKey::new(region, claims::HYPERPOD_GROUP, &g.resource());
    Ok(claims::left_by_its_maker(store, &key, id, now)
        .await?
        .is_some())
}

/// A request whose cluster carries the managed tag in none of its regions is refused at
/// once: nothing would ever run on what it bought.
pub(super) async fn submission_problem<W: Workloads, S: Store>(
    workloads: &W,
    store: &S,
    config: &Config,
    req: &CapacityRequest,
    g: &Group<'_>,
    now: DateTime<Utc>,
) -> Result<Option<FieldError>, PortError> {
    let (regions, cluster_name) = (&req.regions, g.cluster_name);
    let mut unmanaged_in = Vec::new();
    for region in regions {
        let found = workloads
            .describe_instance_group(region, cluster_name, g.instance_group_name)
            .await?;
        // UpdateCluster sends every other group back with its role (review aws-reality-2
        // #3): one this deployment may not pass would fail the launch or the drain with
        // AccessDenied after the plan is paid.
        if let Some(group) = found.as_ref().filter(|f| f.cluster_managed)
            && let Some((other, role)) = group
                .group_roles
                .iter()
                .find(|(n, r)| n.as_str() != g.instance_group_name && !config.may_pass(r))
        {
            return Ok(Some(FieldError {
                field: "workload.cluster_name".to_string(),
                message: format!(
                    "HyperPod cluster {cluster_name} in {region} has instance group {other} with \
                     execution role {role}, which this deployment may not pass: every update of \
                     the cluster sends that group back with its role. Add the role to the \
                     HyperPodRoleArns parameter (iam:PassRole), or use another cluster"
                ),
            }));
        }
        match found {
            // A group carries no tags: it is ours only if our table records that we created
            // it (ARCHITECTURE §8.7): no request not yet recorded can have, but one that has
            // ended may have left it behind, scaled to zero, for this one (§9.8).
            Some(group) if group.cluster_managed && group.instance_group_name.is_some() => {
                if left_to_us(store, region, g, &req.id, now).await? {
                    return Ok(None);
                }
                return Ok(Some(FieldError {
                    field: "workload.instance_group_name".to_string(),
                    message: format!(
                        "HyperPod cluster {cluster_name} in {region} already has an instance \
                         group named {}, which capacity-pilot did not create (no request of \
                         this deployment that has ended made it); it would resize and then \
                         scale it to zero, so choose a new instance_group_name",
                        g.instance_group_name
                    ),
                }));
            }
            Some(group) if group.cluster_managed => return Ok(None),
            Some(_) => unmanaged_in.push(region.as_str()),
            None => {}
        }
    }
    let message = if unmanaged_in.is_empty() {
        format!(
            "HyperPod cluster {cluster_name} exists in none of the request's regions ({})",
            regions.join(", ")
        )
    } else {
        format!(
            "HyperPod cluster {cluster_name} (in {}) does not carry the {MANAGED_TAG} tag; \
             capacity-pilot changes no cluster it does not manage",
            unmanaged_in.join(", ")
        )
    };
    Ok(Some(FieldError {
        field: "workload.cluster_name".to_string(),
        message,
    }))
}

/// A plan is usable only in a region where the request's cluster is, managed by us.
pub(super) async fn usable<W: Workloads>(
    workloads: &W,
    g: &Group<'_>,
    offerings: &[Offering],
) -> Result<(Vec<Offering>, Vec<Rejection>), PortError> {
    let mut usable = Vec::new();
    let mut unusable = Vec::new();
    // Offerings share regions: ask SageMaker once per region.
    let mut clusters: BTreeMap<String, bool> = BTreeMap::new();
    for o in offerings {
        let managed = match clusters.get(&o.region) {
            Some(m) => *m,
            None => {
                let m = workloads
                    .describe_instance_group(&o.region, g.cluster_name, g.instance_group_name)
                    .await?
                    .is_some_and(|group| group.cluster_managed);
                clusters.insert(o.region.clone(), m);
                m
            }
        };
        if managed {
            usable.push(o.clone());
        } else {
            unusable.push(rejection(
                o,
                format!(
                    "HyperPod cluster {} is not in {} with the {MANAGED_TAG} tag",
                    g.cluster_name, o.region
                ),
            ));
        }
    }
    Ok((usable, unusable))
}

pub(super) async fn launch<W: Workloads, S: Store>(
    l: &Launching<'_, W, S>,
    g: &Group<'_>,
) -> Result<Launch, PortError> {
    let (t, id) = (l.target, &l.rec.request_id);
    let cluster_name = g.cluster_name;
    let resource = format!("{cluster_name}/{}", g.instance_group_name);
    // "Requested": recorded before the call, so a crash after it still finds the group ours.
    // A relaunch sets the group again: the drain scaled it to zero or removed it.
    let done = l.current(t.segment).is_some_and(|w| w.state != REQUESTED);
    if !done {
        let group = l
            .workloads
            .describe_instance_group(&t.region, cluster_name, g.instance_group_name)
            .await?;
        match group {
            None => {
                return Ok(Launch::Refuse(format!(
                    "HyperPod cluster {cluster_name} does not exist in {}",
                    t.region
                )));
            }
            Some(group) if !group.cluster_managed => {
                return Ok(Launch::Refuse(format!(
                    "HyperPod cluster {cluster_name} does not carry the {MANAGED_TAG} tag; \
                     capacity-pilot changes no cluster it does not manage"
                )));
            }
            Some(group)
                if group.instance_group_name.is_some()
                    && !ours(l.store, id, &resource).await?
                    && !left_to_us(l.store, &t.region, g, id, l.now).await? =>
            {
                return Ok(Launch::Refuse(format!(
                    "HyperPod cluster {cluster_name} already has an instance group named {}, \
                     which capacity-pilot did not create for this request or for one that has \
                     ended (our table has no record of it); nothing was changed",
                    g.instance_group_name
                )));
            }
            Some(_) => {}
        }
        if l.current(t.segment).is_none() {
            l.store
                .put_workload(l.record(t.segment, resource.clone(), REQUESTED))
                .await?;
        }
        let spec = g.spec(
            &t.region,
            l.config,
            &t.instance_type,
            t.instance_count,
            t.plan_arn.clone(),
        );
        if let Err(e) = l.workloads.put_instance_group(&spec).await {
            if e.code() == Some("ConflictException") {
                // The cluster is Updating: maybe with this very update, whose answer was lost
                // and whose SDK retry was refused. The next tick describes it and sees.
                return Ok(Launch::Starting(format!(
                    "HyperPod cluster {cluster_name} is being updated ({e}); instance group {} \
                     is set on the plan once it is InService",
                    g.instance_group_name
                )));
            }
            return settle(e, &format!("instance group {resource}"));
        }
        info!(request_id = %id, reservation_id = %t.reservation_id, instance_group = %resource, "set the instance group on the plan");
        l.store
            .put_workload(l.record(t.segment, resource.clone(), "Updating"))
            .await?;
    }
    Ok(Launch::Done(vec![resource]))
}

/// Scales the group to zero in each of the window's regions where it still has a target
/// size, or, after the request's last window, removes it (`InstanceGroupsToDelete`): a group
/// left at zero points at a plan that expires with the window, and every later update of
/// the cluster, ours or another party's, would send it back (review aws-reality-2, Task 3
/// #4). A cluster without our tag is left alone whatever the request says.
pub(super) async fn drain<W: Workloads, S: Store>(
    workloads: &W,
    store: &S,
    config: &Config,
    id: &RequestId,
    w: &DrainTarget,
    g: &Group<'_>,
) -> Result<Vec<String>, PortError> {
    let (cluster_name, instance_group_name) = (g.cluster_name, g.instance_group_name);
    let resource = format!("{cluster_name}/{instance_group_name}");
    if !ours(store, id, &resource).await? {
        warn!(request_id = %id, instance_group = %resource,
            "our table records no instance group of this request by that name; not scaling it down");
        return Ok(vec![]);
    }
    let mut acted = Vec::new();
    for region in &w.regions {
        let Some(group) = workloads
            .describe_instance_group(region, cluster_name, instance_group_name)
            .await?
        else {
            continue;
        };
        if !group.cluster_managed {
            warn!(request_id = %id, cluster = %cluster_name,
                "the cluster does not carry the managed tag; not scaling it down");
            continue;
        }
        if group.instance_group_name.is_none() {
            continue;
        }
        if w.last {
            // Listed `Deleting` while the cluster updates: removed already.
            if group.status == "Deleting" {
                continue;
            }
            info!(request_id = %id, region, cluster = %cluster_name, group = %instance_group_name,
                "removing the instance group after the request's last window");
            if workloads
                .remove_instance_group(region, cluster_name, instance_group_name)
                .await?
            {
                acted.push(format!(
                    "instance-group-removed:{cluster_name}/{instance_group_name}"
                ));
            }
            continue;
        }
        if group.target_count == 0 {
            continue;
        }
        info!(request_id = %id, region, cluster = %cluster_name, group = %instance_group_name,
            "scaling the instance group to zero ahead of forced termination");
        workloads
            .put_instance_group(&g.spec(
                region,
                config,
                &w.instance_type,
                0,
                w.reservation_ids.first().cloned(),
            ))
            .await?;
        acted.push(format!(
            "instance-group:{cluster_name}/{instance_group_name}"
        ));
    }
    Ok(acted)
}
