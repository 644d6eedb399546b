//! The pre-flight (ARCHITECTURE §8.1): before an offering is bought, check that the request's
//! workload could launch where the offering is. Some failures otherwise come only after the
//! money is spent: a launch template's `lt-` id exists in one region, an image in one region,
//! the instance profile's role is checked at RunInstances, an endpoint's model is looked up at
//! CreateEndpointConfig.
//!
//! - EC2 instances: the launch template resolves in the offering's region; with a dry run, a
//!   RunInstances dry run without market options (the template, the type, the request's
//!   subnet in the offering's zone) passes. That a subnet lies in the zone is
//!   [`super::usable`]'s check, made before this one.
//! - An inference endpoint: its model exists in the offering's region.
//! - A HyperPod instance group: its cluster is managed (again [`super::usable`]) and every
//!   other group's execution role is one this deployment may pass.
//!
//! Only the answers in [`REJECTING`] reject an offering: they are about the request (its
//! template, image, subnet or permissions), and no later moment will change them. Capacity,
//! quota, throttling and outages say nothing about the request: the offering passes, and
//! the check that could not be made is reported as unverified.

use std::collections::BTreeMap;

use crate::config::Config;
use crate::domain::naming::resource_tags;
use crate::domain::offering::Offering;
use crate::domain::planner::Rejection;
use crate::domain::request::{CapacityRequest, LaunchTemplateRef, WorkloadDetail};
use crate::ports::{LaunchMarket, LaunchSpec, PortError, Workloads};

use super::rejection;

/// The codes that reject an offering: exact for `UnauthorizedOperation` and
/// `InvalidParameterCombination`, by prefix for the `InvalidLaunchTemplate…`,
/// `InvalidAMIID…` and `InvalidSubnet…` families (`.NotFound`, `.Malformed`, `.Unavailable`).
pub const REJECTING: &[&str] = &[
    "UnauthorizedOperation",
    "InvalidLaunchTemplate*",
    "InvalidAMIID*",
    "InvalidSubnet*",
    "InvalidParameterCombination",
];

/// Whether EC2's `code` rejects an offering in a pre-flight.
pub fn rejects(code: &str) -> bool {
    REJECTING.iter().any(|r| match r.strip_suffix('*') {
        Some(prefix) => code.starts_with(prefix),
        None => code == *r,
    })
}

/// How far a pre-flight goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Depth {
    /// Also the RunInstances dry run (needs `ec2:RunInstances` and `iam:PassRole` on the
    /// instance profile's role): purchase-capacity, and `capacity-pilot plan --preflight`.
    /// Without it, only reads: what the search function and `plan` make.
    pub dry_run: bool,
}

/// What a pre-flight came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// The offerings that passed (or could not be checked), in their order.
    pub passed: Vec<Offering>,
    pub rejections: Vec<Rejection>,
    /// The checks that could not be made, each with the answer that stopped it.
    pub unverified: Vec<String>,
}

/// One check's verdict, shared by the offerings it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Pass,
    Reject(String),
    Unverified(String),
}

/// The checks made so far, by (region, zone or ""): offerings share regions and zones, and
/// each check is made once for all of them.
#[derive(Debug, Default)]
pub struct Verdicts(BTreeMap<(String, String), Verdict>);

/// The pre-flight of `offerings` for `req` at `depth`. `config` is the deployment's, when
/// known (which roles it may pass, the tags its launches carry); without it the HyperPod role
/// check is reported unverified. Never fails: an answer it cannot read is unverified.
pub async fn preflight<W: Workloads>(
    workloads: &W,
    config: Option<&Config>,
    req: &CapacityRequest,
    offerings: &[Offering],
    depth: Depth,
) -> Checked {
    preflight_with(
        workloads,
        config,
        req,
        offerings,
        depth,
        &mut Verdicts::default(),
    )
    .await
}

/// [`preflight`], reusing (and adding to) the checks in `verdicts`: a caller that checks
/// several sets of offerings for one request (the purchase's candidates, in turn) asks AWS
/// once per region and zone. A check's unverified note is reported by the call that made it.
pub async fn preflight_with<W: Workloads>(
    workloads: &W,
    config: Option<&Config>,
    req: &CapacityRequest,
    offerings: &[Offering],
    depth: Depth,
    verdicts: &mut Verdicts,
) -> Checked {
    let mut out = Checked::default();
    let verdicts = &mut verdicts.0;
    for o in offerings {
        let mut rejected = None;
        for place in places(req, o, depth) {
            let key = (o.region.clone(), place.clone().unwrap_or_default());
            let verdict = match verdicts.get(&key) {
                Some(v) => v.clone(),
                None => {
                    let v = check(workloads, config, req, o, place.as_deref(), depth).await;
                    if let Verdict::Unverified(why) = &v {
                        out.unverified.push(why.clone());
                    }
                    verdicts.insert(key, v.clone());
                    v
                }
            };
            if let Verdict::Reject(reason) = verdict {
                rejected = Some(reason);
                break;
            }
        }
        match rejected {
            None => out.passed.push(o.clone()),
            Some(reason) => out.rejections.push(rejection(o, reason)),
        }
    }
    out
}

/// Where an offering is checked: each zone of its segments for an EC2 dry run (the subnet is
/// the zone's), else its region once.
fn places(req: &CapacityRequest, o: &Offering, depth: Depth) -> Vec<Option<String>> {
    let zoned = depth.dry_run && matches!(req.workload, WorkloadDetail::Ec2Instances { .. });
    let mut zones: Vec<Option<String>> = if zoned {
        o.segments
            .iter()
            .filter_map(|s| s.availability_zone.clone())
            .map(Some)
            .collect()
    } else {
        vec![]
    };
    zones.dedup();
    if zones.is_empty() {
        zones.push(None);
    }
    zones
}

async fn check<W: Workloads>(
    workloads: &W,
    config: Option<&Config>,
    req: &CapacityRequest,
    o: &Offering,
    zone: Option<&str>,
    depth: Depth,
) -> Verdict {
    let region = o.region.as_str();
    match &req.workload {
        WorkloadDetail::Ec2Instances {
            launch_template: Some(template),
            subnet_ids,
            ..
        } => {
            check_instances(
                workloads,
                config,
                req,
                (template, subnet_ids),
                (region, zone),
                &o.instance_type,
                depth,
            )
            .await
        }
        // A request without a template is refused at its launch, whatever it buys.
        WorkloadDetail::Ec2Instances { .. } | WorkloadDetail::TrainingJob(_) => Verdict::Pass,
        WorkloadDetail::InferenceEndpoint { model_name, .. } => {
            match workloads.model_exists(region, model_name).await {
                Ok(true) => Verdict::Pass,
                Ok(false) => Verdict::Reject(format!(
                    "pre-flight: SageMaker model {model_name} does not exist in {region} \
                     (DescribeModel): the endpoint could not be created there. Create the model \
                     in {region}, or leave {region} out of the request's regions"
                )),
                Err(e) => Verdict::Unverified(format!(
                    "pre-flight: model {model_name} in {region} not checked: {e}"
                )),
            }
        }
        WorkloadDetail::HyperpodCluster {
            cluster_name,
            instance_group_name,
            ..
        } => {
            let Some(config) = config else {
                return Verdict::Unverified(format!(
                    "pre-flight: the execution roles of HyperPod cluster {cluster_name} in \
                     {region} not checked: which roles the deployment may pass is known only \
                     with a stack"
                ));
            };
            match workloads
                .describe_instance_group(region, cluster_name, instance_group_name)
                .await
            {
                Ok(Some(group)) => match group
                    .group_roles
                    .iter()
                    .find(|(n, r)| n != instance_group_name && !config.may_pass(r))
                {
                    Some((other, role)) => Verdict::Reject(format!(
                        "pre-flight: HyperPod cluster {cluster_name} in {region} has instance \
                         group {other} with execution role {role}, which this deployment may \
                         not pass: every update of the cluster sends that group back with its \
                         role. Add the role to the HyperPodRoleArns parameter (iam:PassRole)"
                    )),
                    None => Verdict::Pass,
                },
                // Not there, or not managed: `usable` has the reason.
                Ok(None) => Verdict::Pass,
                Err(e) => Verdict::Unverified(format!(
                    "pre-flight: HyperPod cluster {cluster_name} in {region} not checked: {e}"
                )),
            }
        }
    }
}

async fn check_instances<W: Workloads>(
    workloads: &W,
    config: Option<&Config>,
    req: &CapacityRequest,
    (template, subnet_ids): (&LaunchTemplateRef, &[String]),
    (region, zone): (&str, Option<&str>),
    instance_type: &str,
    depth: Depth,
) -> Verdict {
    let template_name = template
        .id
        .as_deref()
        .or(template.name.as_deref())
        .unwrap_or("(unnamed)");
    let mut dry_run = depth.dry_run;
    let mut subnet_id = String::new();
    let mut what = format!("launch template {template_name} in {region}");
    if dry_run {
        // The subnet the launch would use: the request's first in the zone.
        let found = match zone {
            Some(z) => workloads.subnet_in_zone(region, subnet_ids, z).await,
            None => workloads
                .subnet_zones(region, subnet_ids)
                .await
                .map(|s| s.into_iter().next().map(|(id, _)| id)),
        };
        match found {
            Ok(Some(id)) => {
                what = format!("RunInstances dry run in {}", zone.unwrap_or(region));
                subnet_id = id;
            }
            // No subnet there: `usable` rejected the offering already, for that reason.
            Ok(None) => dry_run = false,
            Err(e) => {
                return Verdict::Unverified(format!(
                    "pre-flight: the subnets in {} not read: {e}",
                    zone.unwrap_or(region)
                ));
            }
        }
    }
    let tags = match config {
        Some(c) => resource_tags(&req.tags, &req.id, &req.team, &c.deployment_id),
        None => req.tags.clone(),
    };
    let spec = LaunchSpec {
        region: region.to_string(),
        market: LaunchMarket::OnDemand,
        instance_type: instance_type.to_string(),
        count: 1,
        subnet_id,
        launch_template: template.clone(),
        client_token: String::new(),
        tags,
    };
    match workloads.preflight_instances(&spec, dry_run).await {
        Ok(()) => Verdict::Pass,
        Err(e) => match e.code() {
            Some(code) if rejects(code) => Verdict::Reject(format!(
                "pre-flight: {what} answered {code}{}; {}",
                detail(code, &e),
                hint(code)
            )),
            _ => Verdict::Unverified(format!("pre-flight: {what} not verified: {e}")),
        },
    }
}

/// The service's message of `e`, after its code: none for `UnauthorizedOperation`, whose
/// message says only that (and may carry an encoded authorization message), and without the
/// operation's name the adapter puts first.
fn detail(code: &str, e: &PortError) -> String {
    let message = match e {
        PortError::Throttled { message, .. }
        | PortError::Transient { message, .. }
        | PortError::OutcomeUnknown { message, .. }
        | PortError::OfferingGone { message, .. }
        | PortError::NoCapacity { message, .. }
        | PortError::Permanent { message, .. } => message.as_str(),
    };
    let message = message
        .split_once(": ")
        .filter(|(op, _)| !op.contains(' '))
        .map_or(message, |(_, m)| m)
        .trim()
        .trim_end_matches('.');
    if code == "UnauthorizedOperation" || message.is_empty() {
        String::new()
    } else {
        format!(" ({message})")
    }
}

/// What to do about a rejecting code.
fn hint(code: &str) -> &'static str {
    if code == "UnauthorizedOperation" {
        "the launching role needs ec2:RunInstances, ec2:CreateTags and iam:PassRole on the \
         instance profile's role"
    } else if code.starts_with("InvalidLaunchTemplate") {
        "a launch template id exists in one region only: name the template, or leave this \
         region out"
    } else if code.starts_with("InvalidAMIID") {
        "the template's image is not in this region: copy it here, or leave this region out"
    } else if code.starts_with("InvalidSubnet") {
        "fix the request's subnet_ids"
    } else {
        "the template and the request do not combine: fix the launch template"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejections_words_carry_ec2s_message_once_and_nothing_for_unauthorized() {
        let e = |code: &str, message: &str| PortError::Permanent {
            service: "ec2",
            code: code.into(),
            message: message.into(),
        };
        assert_eq!(
            detail(
                "InvalidSubnetID.NotFound",
                &e(
                    "InvalidSubnetID.NotFound",
                    "RunInstances: The subnet ID 'subnet-1' does not exist."
                )
            ),
            " (The subnet ID 'subnet-1' does not exist)"
        );
        assert_eq!(
            detail(
                "UnauthorizedOperation",
                &e(
                    "UnauthorizedOperation",
                    "RunInstances: You are not authorized. Encoded authorization failure message: x"
                )
            ),
            ""
        );
        // a message that does not start with an operation's name is kept whole
        assert_eq!(
            detail(
                "InvalidParameterCombination",
                &e(
                    "InvalidParameterCombination",
                    "Network interfaces and a subnet: pick one."
                )
            ),
            " (Network interfaces and a subnet: pick one)"
        );
    }

    #[test]
    fn the_documented_codes_reject_and_capacity_quota_and_throttling_never_do() {
        for code in [
            "UnauthorizedOperation",
            "InvalidLaunchTemplateId.NotFound",
            "InvalidLaunchTemplateName.NotFoundException",
            "InvalidLaunchTemplateId.Malformed",
            "InvalidAMIID.NotFound",
            "InvalidAMIID.Unavailable",
            "InvalidSubnetID.NotFound",
            "InvalidSubnet",
            "InvalidParameterCombination",
        ] {
            assert!(rejects(code), "{code} rejects");
        }
        for code in [
            "DryRunOperation",
            "InsufficientInstanceCapacity",
            "InsufficientCapacityOnHost",
            "VcpuLimitExceeded",
            "InstanceLimitExceeded",
            "RequestLimitExceeded",
            "Throttling",
            "InternalError",
            "Unsupported",
            "InvalidParameterValue",
            "UnauthorizedOperationX",
        ] {
            assert!(!rejects(code), "{code} does not reject");
        }
    }
}
