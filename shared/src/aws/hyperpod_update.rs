//! UpdateCluster built from DescribeCluster (aws-reference §11.2 "HyperPod UpdateCluster"):
//! AWS's own training-plan example lists every instance group, and whether an omitted group or
//! field is kept is UNVERIFIED, so every group goes back with its own settings and only ours
//! changes, in its count and plan. Describe and update name fields differently; this is the
//! one place that maps them.
//!
//! | `ClusterInstanceGroupDetails` (described) | `ClusterInstanceGroupSpecification` (update) |
//! |---|---|
//! | `TargetCount` | `InstanceCount` |
//! | `MinCount` | `MinInstanceCount` |
//! | `InstanceGroupName`, `InstanceType`, `LifeCycleConfig`, `ExecutionRole`, `ThreadsPerCore`, `InstanceStorageConfigs`, `OnStartDeepHealthChecks`, `TrainingPlanArn`, `OverrideVpcConfig`, `ScheduledUpdateConfig`, `CapacityRequirements`, `SlurmConfig` | the same names |
//! | `DesiredImageId` (else `CurrentImageId`) | `ImageId` |
//! | `DesiredImageReleaseVersion` (else `CurrentImageReleaseVersion`) | `ImageReleaseVersion` |
//! | `InstanceRequirements.DesiredInstanceTypes` (else `CurrentInstanceTypes`) | `InstanceRequirements.InstanceTypes` |
//! | `KubernetesConfig.DesiredLabels`/`DesiredTaints` (else `Current…`) | `KubernetesConfig.Labels`/`Taints` |
//! | `AutoPatchConfig.PatchingStrategy`, `DeploymentConfig`, `DesiredPatchSchedule` (else `CurrentPatchSchedule`) | `AutoPatchConfig.PatchingStrategy`, `DeploymentConfig`, `PatchSchedule` |
//! | `NetworkInterface.InterfaceType` | `NetworkInterface.InterfaceType` |
//!
//! Described only, with no update field: `CurrentCount`, `InstanceTypeDetails`, `Status`,
//! `TrainingPlanStatus`, `ImageVersionStatus`, `ActiveOperations`, `TargetStateCount`,
//! `SoftwareUpdateStatus`, `ActiveSoftwareUpdateConfig` (an update in progress is not
//! restarted). A field the model adds later is not carried: [`UNMAPPED`] lists none today.

use aws_sdk_sagemaker::types::{
    ClusterAutoPatchConfig, ClusterInstanceGroupDetails, ClusterInstanceGroupSpecification,
    ClusterInstanceRequirements, ClusterKubernetesConfig, ClusterNetworkInterface,
    ClusterPatchSchedule, ClusterSlurmConfig,
};

/// Described fields that UpdateCluster's specification has and this mapping does not carry.
pub const UNMAPPED: &[&str] = &[];

/// The specification that sends the described group `g` back unchanged. A flexible group
/// (described with `InstanceRequirements`, which also shows an `InstanceType`) goes back with
/// its requirements only: "The InstanceType and InstanceRequirements properties are mutually
/// exclusive" (the model's `ClusterInstanceGroupSpecification.InstanceRequirements`).
pub fn unchanged(g: &ClusterInstanceGroupDetails) -> ClusterInstanceGroupSpecification {
    let flexible = g.instance_requirements().is_some();
    ClusterInstanceGroupSpecification::builder()
        .set_instance_group_name(g.instance_group_name().map(str::to_string))
        .set_instance_type(g.instance_type().cloned().filter(|_| !flexible))
        .set_instance_count(g.target_count())
        .set_min_instance_count(g.min_count())
        .set_instance_requirements(g.instance_requirements().map(|r| {
            let types = desired_or_current(r.desired_instance_types(), r.current_instance_types());
            ClusterInstanceRequirements::builder()
                .set_instance_types((!types.is_empty()).then_some(types))
                .build()
        }))
        .set_life_cycle_config(g.life_cycle_config().cloned())
        .set_execution_role(g.execution_role().map(str::to_string))
        .set_threads_per_core(g.threads_per_core())
        .set_instance_storage_configs(
            (!g.instance_storage_configs().is_empty())
                .then(|| g.instance_storage_configs().to_vec()),
        )
        .set_on_start_deep_health_checks(
            (!g.on_start_deep_health_checks().is_empty())
                .then(|| g.on_start_deep_health_checks().to_vec()),
        )
        .set_training_plan_arn(g.training_plan_arn().map(str::to_string))
        .set_override_vpc_config(g.override_vpc_config().cloned())
        .set_scheduled_update_config(g.scheduled_update_config().cloned())
        .set_image_id(
            g.desired_image_id()
                .or(g.current_image_id())
                .map(str::to_string),
        )
        .set_image_release_version(
            g.desired_image_release_version()
                .or(g.current_image_release_version())
                .map(str::to_string),
        )
        .set_auto_patch_config(g.auto_patch_config().and_then(|a| {
            let schedule = a
                .desired_patch_schedule()
                .or(a.current_patch_schedule())
                .map(|s| {
                    ClusterPatchSchedule::builder()
                        .set_next_patch_date(s.next_patch_date().cloned())
                        .build()
                });
            ClusterAutoPatchConfig::builder()
                .set_patching_strategy(a.patching_strategy().cloned())
                .set_patch_schedule(schedule)
                .set_deployment_config(a.deployment_config().cloned())
                .build()
                .ok()
        }))
        .set_kubernetes_config(g.kubernetes_config().map(|k| {
            ClusterKubernetesConfig::builder()
                .set_labels(k.desired_labels().or(k.current_labels()).cloned())
                .set_taints({
                    let taints = desired_or_current(k.desired_taints(), k.current_taints());
                    (!taints.is_empty()).then_some(taints)
                })
                .build()
        }))
        .set_slurm_config(g.slurm_config().and_then(|s| {
            ClusterSlurmConfig::builder()
                .node_type(s.node_type().clone())
                .set_partition_names(
                    (!s.partition_names().is_empty()).then(|| s.partition_names().to_vec()),
                )
                .build()
                .ok()
        }))
        .set_capacity_requirements(g.capacity_requirements().cloned())
        .set_network_interface(g.network_interface().map(|n| {
            ClusterNetworkInterface::builder()
                .set_interface_type(n.interface_type().cloned())
                .build()
        }))
        .build()
}

/// The desired list while an update is under way, else the current one.
fn desired_or_current<T: Clone>(desired: &[T], current: &[T]) -> Vec<T> {
    if desired.is_empty() {
        current.to_vec()
    } else {
        desired.to_vec()
    }
}

/// Whether `g` already is at `count` on `plan`: an update that went through (its answer lost,
/// or an SDK retry refused as a conflict) needs no other.
pub fn already(g: &ClusterInstanceGroupDetails, count: i32, plan: Option<&str>) -> bool {
    g.target_count() == Some(count) && g.training_plan_arn() == plan
}

#[cfg(test)]
mod tests {
    use aws_sdk_sagemaker::types::{
        ClusterInstanceGroupDetails, ClusterInstanceRequirementDetails, ClusterInstanceType,
    };

    use super::unchanged;

    #[test]
    fn a_flexible_group_goes_back_with_its_requirements_only_and_a_fixed_one_with_its_type() {
        let fixed = ClusterInstanceGroupDetails::builder()
            .instance_group_name("controller")
            .instance_type(ClusterInstanceType::MlM5Xlarge)
            .target_count(1)
            .build();
        let flexible = ClusterInstanceGroupDetails::builder()
            .instance_group_name("workers")
            .instance_type(ClusterInstanceType::from("ml.p5.48xlarge"))
            .instance_requirements(
                ClusterInstanceRequirementDetails::builder()
                    .current_instance_types(ClusterInstanceType::from("ml.p5.48xlarge"))
                    .current_instance_types(ClusterInstanceType::from("ml.p4d.24xlarge"))
                    .build(),
            )
            .target_count(2)
            .build();
        let f = unchanged(&fixed);
        assert_eq!(f.instance_type(), Some(&ClusterInstanceType::MlM5Xlarge));
        assert!(f.instance_requirements().is_none());
        let x = unchanged(&flexible);
        assert_eq!(x.instance_type(), None, "never both type fields");
        assert_eq!(
            x.instance_requirements().map(|r| r.instance_types().len()),
            Some(2)
        );
    }
}
