//! HyperPod clusters whose instance groups run on a training plan: nodes appear when the plan is
//! active and go an hour before its end.

use aws_sdk_sagemaker::error::ProvideErrorMetadata;
use aws_sdk_sagemaker::types::{
    ClusterAutoPatchConfig, ClusterCapacityRequirements, ClusterEbsVolumeConfig,
    ClusterInstanceGroupSpecification, ClusterInstanceRequirements, ClusterInstanceStorageConfig,
    ClusterInstanceType, ClusterInterfaceType, ClusterKubernetesConfig, ClusterKubernetesTaint,
    ClusterKubernetesTaintEffect, ClusterLifeCycleConfig, ClusterNetworkInterface,
    ClusterOnDemandOptions, ClusterPatchSchedule, ClusterPatchingStrategy, ClusterSlurmConfig,
    ClusterSlurmNodeType, DeepHealthCheckType, SageMakerResourceName, ScheduledUpdateConfig,
    VpcConfig,
};
use chrono::TimeDelta;
use local_cloud::Settings;

use crate::helpers::*;
use crate::sagemaker_plans::{buy_plan, plan_offerings};

fn group(
    name: &str,
    ty: &str,
    count: i32,
    plan: Option<&str>,
) -> ClusterInstanceGroupSpecification {
    ClusterInstanceGroupSpecification::builder()
        .instance_group_name(name)
        .instance_type(ClusterInstanceType::from(ty))
        .instance_count(count)
        .execution_role("arn:aws:iam::123456789012:role/hyperpod")
        .life_cycle_config(
            ClusterLifeCycleConfig::builder()
                .source_s3_uri("s3://bucket/lifecycle")
                .on_create("on_create.sh")
                .build(),
        )
        .set_training_plan_arn(plan.map(str::to_string))
        .build()
}

#[tokio::test]
async fn hyperpod_nodes_follow_the_plan_and_leave_an_hour_before_its_end() {
    // counts the nodes by DescribeCluster's `CurrentCount`, which AWS may omit (the default)
    let env = env_with_settings(Settings {
        cluster_omit_current_count: false,
        ..Settings::default()
    })
    .await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        4,
        24,
        SageMakerResourceName::HyperpodCluster,
    )
    .await
    .remove(0);
    let segs = offer.reserved_capacity_offerings();
    assert!(
        segs.iter()
            .all(|s| s.availability_zone() == segs[0].availability_zone())
    );
    let arn = buy_plan(&env, "pod-plan", &offer).await;
    let created = env
        .sm
        .create_cluster()
        .cluster_name("pod")
        .instance_groups(group("gpus", "ml.p5.48xlarge", 4, Some(&arn)))
        .instance_groups(group("ctrl", "ml.m5.large", 1, None))
        .send()
        .await
        .unwrap();
    let cluster_arn = created.cluster_arn().unwrap().to_string();
    assert!(cluster_arn.starts_with("arn:aws:sagemaker:us-east-1:123456789012:cluster/"));
    let d = env
        .sm
        .describe_cluster()
        .cluster_name("pod")
        .send()
        .await
        .unwrap();
    assert_eq!(d.cluster_status().unwrap().as_str(), "Creating");
    // the cluster is up after 3 minutes, the plan's payment completes after 5
    env.cloud.step(TimeDelta::minutes(5));
    let d = env
        .sm
        .describe_cluster()
        .cluster_name(&cluster_arn)
        .send()
        .await
        .unwrap();
    assert_eq!(d.cluster_status().unwrap().as_str(), "InService");
    let gpus = d
        .instance_groups()
        .iter()
        .find(|g| g.instance_group_name() == Some("gpus"))
        .unwrap();
    assert_eq!(gpus.training_plan_arn(), Some(arn.as_str()));
    assert_eq!(gpus.training_plan_status(), Some("Scheduled"));
    assert_eq!(gpus.target_count(), Some(4));
    assert_eq!(gpus.current_count(), Some(0));
    let nodes = env
        .sm
        .list_cluster_nodes()
        .cluster_name("pod")
        .send()
        .await
        .unwrap();
    assert_eq!(
        nodes.cluster_node_summaries().len(),
        1,
        "only the on-demand controller"
    );

    let start = chrono_of(segs[0].start_time().unwrap());
    let end = chrono_of(segs[0].end_time().unwrap());
    env.cloud.advance_to(start);
    let nodes = env
        .sm
        .list_cluster_nodes()
        .cluster_name("pod")
        .send()
        .await
        .unwrap();
    let gpu_nodes: Vec<_> = nodes
        .cluster_node_summaries()
        .iter()
        .filter(|n| n.instance_group_name() == Some("gpus"))
        .collect();
    assert_eq!(gpu_nodes.len(), 4);
    assert!(gpu_nodes[0].instance_id().unwrap().starts_with("i-"));
    assert_eq!(
        gpu_nodes[0].instance_type().unwrap().as_str(),
        "ml.p5.48xlarge"
    );
    assert_eq!(chrono_of(gpu_nodes[0].launch_time().unwrap()), start);
    assert_eq!(
        gpu_nodes[0]
            .instance_status()
            .unwrap()
            .status()
            .unwrap()
            .as_str(),
        "Running"
    );
    let page = env
        .sm
        .list_cluster_nodes()
        .cluster_name("pod")
        .max_results(2)
        .send()
        .await
        .unwrap();
    assert_eq!(page.cluster_node_summaries().len(), 2);
    assert!(page.next_token().is_some());

    // an unhealthy node is reported the way HyperPod's health agent reports it
    let node = gpu_nodes[0].instance_id().unwrap().to_string();
    let (code, _) = http(
        &env.cloud.url(),
        "POST",
        &format!("/_local/instances/{node}/impair"),
        None,
    )
    .await;
    assert_eq!(code, 204);
    let health = events_of(&env.cloud, "SageMaker HyperPod Cluster Node Health Event");
    assert_eq!(health.len(), 1);
    assert_eq!(health[0]["detail"]["InstanceId"], node.as_str());
    assert_eq!(health[0]["detail"]["ClusterName"], "pod");
    assert_eq!(
        health[0]["detail"]["HealthSummary"]["HealthStatus"],
        "Unhealthy"
    );

    env.cloud.advance_to(end - TimeDelta::minutes(61));
    let d = env
        .sm
        .describe_cluster()
        .cluster_name("pod")
        .send()
        .await
        .unwrap();
    let gpus = d
        .instance_groups()
        .iter()
        .find(|g| g.instance_group_name() == Some("gpus"))
        .unwrap();
    assert_eq!(gpus.current_count(), Some(4));
    env.cloud.advance_to(end - TimeDelta::minutes(60));
    let d = env
        .sm
        .describe_cluster()
        .cluster_name("pod")
        .send()
        .await
        .unwrap();
    let gpus = d
        .instance_groups()
        .iter()
        .find(|g| g.instance_group_name() == Some("gpus"))
        .unwrap();
    assert_eq!(gpus.current_count(), Some(0));

    let state_changes = events_of(&env.cloud, "SageMaker HyperPod Cluster State Change");
    assert_eq!(state_changes[0]["detail"]["ClusterStatus"], "Creating");
    assert_eq!(state_changes[1]["detail"]["ClusterStatus"], "InService");
}

#[tokio::test]
async fn clusters_update_and_report_errors() {
    let env = env_with_settings(Settings {
        cluster_omit_current_count: false,
        ..Settings::default()
    })
    .await;
    env.sm
        .create_cluster()
        .cluster_name("cpu-pod")
        .instance_groups(group("workers", "ml.m5.large", 2, None))
        .send()
        .await
        .unwrap();
    let dup = env
        .sm
        .create_cluster()
        .cluster_name("cpu-pod")
        .instance_groups(group("workers", "ml.m5.large", 2, None))
        .send()
        .await
        .unwrap_err();
    assert!(dup.as_service_error().unwrap().is_resource_in_use());
    let early = env
        .sm
        .update_cluster()
        .cluster_name("cpu-pod")
        .instance_groups(group("workers", "ml.m5.large", 3, None))
        .send()
        .await
        .unwrap_err();
    assert_eq!(early.code(), Some("ConflictException"));
    assert_eq!(
        early.message(),
        Some(
            "Cluster cpu-pod is in status Creating. Please wait until the cluster is InService to update it."
        )
    );
    env.cloud.step(TimeDelta::minutes(3));
    env.sm
        .update_cluster()
        .cluster_name("cpu-pod")
        .instance_groups(group("workers", "ml.m5.large", 3, None))
        .send()
        .await
        .unwrap();
    let d = env
        .sm
        .describe_cluster()
        .cluster_name("cpu-pod")
        .send()
        .await
        .unwrap();
    assert_eq!(d.cluster_status().unwrap().as_str(), "Updating");
    // `Updating` lasts `cluster_update_minutes` (5), not the 3 minutes of `Creating`
    env.cloud.step(TimeDelta::minutes(3));
    let d = env
        .sm
        .describe_cluster()
        .cluster_name("cpu-pod")
        .send()
        .await
        .unwrap();
    assert_eq!(d.cluster_status().unwrap().as_str(), "Updating");
    let busy = env
        .sm
        .update_cluster()
        .cluster_name("cpu-pod")
        .instance_groups(group("workers", "ml.m5.large", 4, None))
        .send()
        .await
        .unwrap_err();
    assert_eq!(busy.code(), Some("ConflictException"));
    assert_eq!(
        busy.message(),
        Some(
            "Cluster cpu-pod is in status Updating. Please wait until the cluster is InService to update it."
        )
    );
    env.cloud.step(TimeDelta::minutes(2));
    let d = env
        .sm
        .describe_cluster()
        .cluster_name("cpu-pod")
        .send()
        .await
        .unwrap();
    assert_eq!(d.cluster_status().unwrap().as_str(), "InService");
    assert_eq!(d.instance_groups()[0].current_count(), Some(3));
    let missing = env
        .sm
        .describe_cluster()
        .cluster_name("nope")
        .send()
        .await
        .unwrap_err();
    assert!(missing.as_service_error().unwrap().is_resource_not_found());
    let missing = env
        .sm
        .list_cluster_nodes()
        .cluster_name("nope")
        .send()
        .await
        .unwrap_err();
    assert!(missing.as_service_error().unwrap().is_resource_not_found());
}

#[tokio::test]
async fn describe_cluster_omits_current_count_by_default_and_list_cluster_nodes_counts() {
    let create = |env: &Env| {
        env.sm
            .create_cluster()
            .cluster_name("count-pod")
            .instance_groups(group("workers", "ml.m5.large", 3, None))
            .instance_groups(group("ctrl", "ml.m5.large", 1, None))
            .send()
    };
    let describe = |env: &Env| env.sm.describe_cluster().cluster_name("count-pod").send();
    let env = env().await;
    create(&env).await.unwrap();
    env.cloud.step(TimeDelta::minutes(3));
    let d = describe(&env).await.unwrap();
    assert_eq!(d.cluster_status().unwrap().as_str(), "InService");
    for g in d.instance_groups() {
        assert_eq!(g.current_count(), None, "CurrentCount is optional");
        assert!(g.target_count().is_some());
    }
    let nodes = env
        .sm
        .list_cluster_nodes()
        .cluster_name("count-pod")
        .send()
        .await
        .unwrap();
    let workers = nodes
        .cluster_node_summaries()
        .iter()
        .filter(|n| n.instance_group_name() == Some("workers"))
        .count();
    assert_eq!(workers, 3);
    assert_eq!(nodes.cluster_node_summaries().len(), 4);

    let sent = env_with_settings(Settings {
        cluster_omit_current_count: false,
        ..Settings::default()
    })
    .await;
    create(&sent).await.unwrap();
    sent.cloud.step(TimeDelta::minutes(3));
    let d = describe(&sent).await.unwrap();
    let counts: Vec<Option<i32>> = d
        .instance_groups()
        .iter()
        .map(|g| g.current_count())
        .collect();
    assert_eq!(counts, [Some(3), Some(1)]);
}

/// A group carrying most of the specification's optional settings.
fn rich_group(name: &str, count: i32) -> ClusterInstanceGroupSpecification {
    let base = group(name, "ml.m5.large", count, None);
    ClusterInstanceGroupSpecification::builder()
        .instance_group_name(base.instance_group_name().unwrap())
        .instance_type(base.instance_type().unwrap().clone())
        .instance_count(count)
        .min_instance_count(1)
        .execution_role(base.execution_role().unwrap())
        .life_cycle_config(base.life_cycle_config().unwrap().clone())
        .threads_per_core(1)
        .instance_storage_configs(ClusterInstanceStorageConfig::EbsVolumeConfig(
            ClusterEbsVolumeConfig::builder()
                .volume_size_in_gb(500)
                .build(),
        ))
        .on_start_deep_health_checks(DeepHealthCheckType::InstanceStress)
        .on_start_deep_health_checks(DeepHealthCheckType::InstanceConnectivity)
        .override_vpc_config(
            VpcConfig::builder()
                .security_group_ids("sg-0123456789abcdef0")
                .subnets("subnet-0123456789abcdef0")
                .build(),
        )
        .scheduled_update_config(
            ScheduledUpdateConfig::builder()
                .schedule_expression("cron(0 3 ? * SUN *)")
                .build(),
        )
        .image_id("ami-0123456789abcdef0")
        .kubernetes_config(
            ClusterKubernetesConfig::builder()
                .labels("team", "research")
                .taints(
                    ClusterKubernetesTaint::builder()
                        .key("gpu")
                        .value("true")
                        .effect(ClusterKubernetesTaintEffect::NoSchedule)
                        .build()
                        .unwrap(),
                )
                .build(),
        )
        .capacity_requirements(
            ClusterCapacityRequirements::builder()
                .on_demand(ClusterOnDemandOptions::builder().build())
                .build(),
        )
        .network_interface(
            ClusterNetworkInterface::builder()
                .interface_type(ClusterInterfaceType::Efa)
                .build(),
        )
        .build()
}

#[tokio::test]
async fn describe_cluster_reports_every_group_setting_under_its_describe_name() {
    let env = env().await;
    // a flexible group: its types under `InstanceRequirements`, no `InstanceType` (the two are
    // mutually exclusive)
    let slurm = ClusterInstanceGroupSpecification::builder()
        .instance_group_name("login")
        .instance_count(1)
        .execution_role("arn:aws:iam::123456789012:role/login")
        .threads_per_core(2)
        .instance_requirements(
            ClusterInstanceRequirements::builder()
                .instance_types(ClusterInstanceType::from("ml.m5.large"))
                .instance_types(ClusterInstanceType::from("ml.m5.xlarge"))
                .build(),
        )
        .slurm_config(
            ClusterSlurmConfig::builder()
                .node_type(ClusterSlurmNodeType::Login)
                .partition_names("dev")
                .build()
                .unwrap(),
        )
        .auto_patch_config(
            ClusterAutoPatchConfig::builder()
                .patching_strategy(ClusterPatchingStrategy::WhenIdle)
                .patch_schedule(
                    ClusterPatchSchedule::builder()
                        .next_patch_date(smithy_of(at("2026-09-06T03:00:00Z")))
                        .build(),
                )
                .build()
                .unwrap(),
        )
        .image_release_version("2026.08.1")
        .build();
    env.sm
        .create_cluster()
        .cluster_name("rich-pod")
        .instance_groups(rich_group("workers", 2))
        .instance_groups(slurm)
        .send()
        .await
        .unwrap();
    let describe = || env.sm.describe_cluster().cluster_name("rich-pod").send();
    // while `Creating` nothing is current yet: only the desired settings
    let d = describe().await.unwrap();
    let w = &d.instance_groups()[0];
    assert_eq!(w.desired_image_id(), Some("ami-0123456789abcdef0"));
    assert_eq!(w.current_image_id(), None);
    env.cloud.step(TimeDelta::minutes(3));
    let d = describe().await.unwrap();
    assert_eq!(d.cluster_status().unwrap().as_str(), "InService");
    let groups = d.instance_groups();
    assert_eq!(groups.len(), 2);
    let w = &groups[0];
    assert_eq!(w.instance_group_name(), Some("workers"));
    assert_eq!(w.instance_type().unwrap().as_str(), "ml.m5.large");
    assert_eq!(w.target_count(), Some(2));
    assert_eq!(w.current_count(), None, "omitted by default");
    assert_eq!(w.min_count(), Some(1));
    assert_eq!(
        w.execution_role(),
        Some("arn:aws:iam::123456789012:role/hyperpod")
    );
    assert_eq!(
        w.life_cycle_config().unwrap().on_create(),
        Some("on_create.sh")
    );
    assert_eq!(w.threads_per_core(), Some(1));
    let storage = w.instance_storage_configs();
    assert_eq!(storage.len(), 1);
    assert_eq!(
        storage[0]
            .as_ebs_volume_config()
            .unwrap()
            .volume_size_in_gb(),
        Some(500)
    );
    assert_eq!(
        w.on_start_deep_health_checks(),
        [
            DeepHealthCheckType::InstanceStress,
            DeepHealthCheckType::InstanceConnectivity
        ]
    );
    let vpc = w.override_vpc_config().unwrap();
    assert_eq!(vpc.security_group_ids(), ["sg-0123456789abcdef0"]);
    assert_eq!(vpc.subnets(), ["subnet-0123456789abcdef0"]);
    assert_eq!(
        w.scheduled_update_config().unwrap().schedule_expression(),
        Some("cron(0 3 ? * SUN *)")
    );
    assert_eq!(w.current_image_id(), Some("ami-0123456789abcdef0"));
    assert_eq!(w.desired_image_id(), Some("ami-0123456789abcdef0"));
    let k8s = w.kubernetes_config().unwrap();
    for labels in [k8s.current_labels(), k8s.desired_labels()] {
        assert_eq!(
            labels.unwrap().get("team").map(String::as_str),
            Some("research")
        );
    }
    for taints in [k8s.current_taints(), k8s.desired_taints()] {
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0].key(), "gpu");
        assert_eq!(taints[0].effect().as_str(), "NoSchedule");
    }
    assert!(w.capacity_requirements().unwrap().on_demand().is_some());
    assert_eq!(
        w.network_interface().unwrap().interface_type(),
        Some(&ClusterInterfaceType::Efa)
    );
    assert_eq!(w.training_plan_status(), Some("NotApplicable"));

    let l = &groups[1];
    assert_eq!(l.instance_group_name(), Some("login"));
    assert_eq!(
        l.instance_type().unwrap().as_str(),
        "ml.m5.large",
        "a flexible group is described with the type its nodes run"
    );
    assert_eq!(l.threads_per_core(), Some(2));
    assert_eq!(
        l.execution_role(),
        Some("arn:aws:iam::123456789012:role/login")
    );
    let types = l.instance_requirements().unwrap();
    for t in [
        types.current_instance_types(),
        types.desired_instance_types(),
    ] {
        let t: Vec<&str> = t.iter().map(|t| t.as_str()).collect();
        assert_eq!(t, ["ml.m5.large", "ml.m5.xlarge"]);
    }
    let slurm = l.slurm_config().unwrap();
    assert_eq!(slurm.node_type().as_str(), "Login");
    assert_eq!(slurm.partition_names(), ["dev"]);
    let patch = l.auto_patch_config().unwrap();
    assert_eq!(
        patch.patching_strategy(),
        Some(&ClusterPatchingStrategy::WhenIdle)
    );
    for sched in [
        patch.current_patch_schedule(),
        patch.desired_patch_schedule(),
    ] {
        assert_eq!(
            chrono_of(sched.unwrap().next_patch_date().unwrap()),
            at("2026-09-06T03:00:00Z")
        );
    }
    assert_eq!(l.current_image_release_version(), Some("2026.08.1"));
    assert_eq!(l.desired_image_release_version(), Some("2026.08.1"));
    assert!(l.override_vpc_config().is_none() && l.kubernetes_config().is_none());
}

#[tokio::test]
async fn an_update_must_list_every_group_and_change_only_one_by_default() {
    let env = env().await;
    let ctrl = || {
        let g = group("ctrl", "ml.m5.large", 1, None);
        ClusterInstanceGroupSpecification::builder()
            .instance_group_name("ctrl")
            .instance_type(g.instance_type().unwrap().clone())
            .instance_count(1)
            .execution_role(g.execution_role().unwrap())
            .life_cycle_config(g.life_cycle_config().unwrap().clone())
            .threads_per_core(2)
    };
    env.sm
        .create_cluster()
        .cluster_name("strict-pod")
        .instance_groups(rich_group("workers", 2))
        .instance_groups(ctrl().build())
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(3));
    let update = || env.sm.update_cluster().cluster_name("strict-pod");

    // (a) a group left out might be removed: refused, naming it
    let omitted = update()
        .instance_groups(rich_group("workers", 3))
        .send()
        .await
        .unwrap_err();
    assert_eq!(omitted.code(), Some("ValidationException"));
    assert_eq!(
        omitted.message(),
        Some(
            "The update of cluster strict-pod omits instance group(s) ctrl. List every instance group of the cluster with its settings."
        )
    );
    // (b) resizing workers while rewriting ctrl's role changes two groups
    let two = update()
        .instance_groups(rich_group("workers", 3))
        .instance_groups(
            ctrl()
                .execution_role("arn:aws:iam::123456789012:role/other")
                .build(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(two.code(), Some("ValidationException"));
    assert_eq!(
        two.message(),
        Some(
            "The update of cluster strict-pod changes instance groups workers, ctrl. An update can change one instance group only; send the others with their current settings."
        )
    );
    // (c) ctrl sent without the ThreadsPerCore it had: that changes it too
    let dropped = update()
        .instance_groups(rich_group("workers", 3))
        .instance_groups(group("ctrl", "ml.m5.large", 1, None))
        .send()
        .await
        .unwrap_err();
    assert_eq!(dropped.code(), Some("ValidationException"));
    assert!(dropped.message().unwrap().contains("workers, ctrl"));
    let d = env
        .sm
        .describe_cluster()
        .cluster_name("strict-pod")
        .send()
        .await
        .unwrap();
    assert_eq!(d.cluster_status().unwrap().as_str(), "InService");

    // one group changed, every other sent as it is, and a new group added: accepted
    update()
        .instance_groups(rich_group("workers", 3))
        .instance_groups(ctrl().build())
        .instance_groups(group("extra", "ml.m5.large", 1, None))
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(5));
    let d = env
        .sm
        .describe_cluster()
        .cluster_name("strict-pod")
        .send()
        .await
        .unwrap();
    assert_eq!(d.cluster_status().unwrap().as_str(), "InService");
    let targets: Vec<(Option<&str>, Option<i32>, Option<i32>)> = d
        .instance_groups()
        .iter()
        .map(|g| {
            (
                g.instance_group_name(),
                g.target_count(),
                g.threads_per_core(),
            )
        })
        .collect();
    assert_eq!(
        targets,
        [
            (Some("workers"), Some(3), Some(1)),
            (Some("ctrl"), Some(1), Some(2)),
            (Some("extra"), Some(1), None)
        ]
    );

    // lenient: omitted groups are kept and the named group is replaced whole
    let lenient = env_with_settings(Settings {
        refuse_partial_cluster_updates: false,
        ..Settings::default()
    })
    .await;
    lenient
        .sm
        .create_cluster()
        .cluster_name("loose-pod")
        .instance_groups(rich_group("workers", 2))
        .instance_groups(ctrl().build())
        .send()
        .await
        .unwrap();
    lenient.cloud.step(TimeDelta::minutes(3));
    lenient
        .sm
        .update_cluster()
        .cluster_name("loose-pod")
        .instance_groups(group("workers", "ml.m5.large", 3, None))
        .send()
        .await
        .unwrap();
    let d = lenient
        .sm
        .describe_cluster()
        .cluster_name("loose-pod")
        .send()
        .await
        .unwrap();
    let targets: Vec<(Option<&str>, Option<i32>, Option<i32>)> = d
        .instance_groups()
        .iter()
        .map(|g| {
            (
                g.instance_group_name(),
                g.target_count(),
                g.threads_per_core(),
            )
        })
        .collect();
    assert_eq!(
        targets,
        [
            (Some("workers"), Some(3), None),
            (Some("ctrl"), Some(1), Some(2))
        ]
    );
}

/// The cluster's status and each group's name and status, as DescribeCluster lists them.
async fn group_statuses(env: &Env, cluster: &str) -> (String, Vec<(String, String)>) {
    let d = env
        .sm
        .describe_cluster()
        .cluster_name(cluster)
        .send()
        .await
        .unwrap();
    let groups = d
        .instance_groups()
        .iter()
        .map(|g| {
            (
                g.instance_group_name().unwrap().to_string(),
                g.status().unwrap().as_str().to_string(),
            )
        })
        .collect();
    (d.cluster_status().unwrap().as_str().to_string(), groups)
}

/// The group of every node ListClusterNodes lists, sorted.
async fn node_groups(env: &Env, cluster: &str) -> Vec<String> {
    let nodes = env
        .sm
        .list_cluster_nodes()
        .cluster_name(cluster)
        .send()
        .await
        .unwrap();
    let mut groups: Vec<String> = nodes
        .cluster_node_summaries()
        .iter()
        .map(|n| n.instance_group_name().unwrap().to_string())
        .collect();
    groups.sort();
    groups
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test]
async fn instance_groups_to_delete_removes_the_groups_and_their_nodes() {
    let env = env().await;
    let workers = |n| group("workers", "ml.m5.large", n, None);
    let ctrl = || group("ctrl", "ml.m5.large", 1, None);
    let extra = || group("extra", "ml.m5.large", 2, None);
    let spare = || group("spare", "ml.m5.large", 1, None);
    env.sm
        .create_cluster()
        .cluster_name("del-pod")
        .instance_groups(workers(2))
        .instance_groups(ctrl())
        .instance_groups(extra())
        .instance_groups(spare())
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(3));
    assert_eq!(
        node_groups(&env, "del-pod").await,
        ["ctrl", "extra", "extra", "spare", "workers", "workers"]
    );
    let update = || env.sm.update_cluster().cluster_name("del-pod");
    // every group, as the cluster has them
    let every = || {
        update()
            .instance_groups(workers(2))
            .instance_groups(ctrl())
            .instance_groups(extra())
            .instance_groups(spare())
    };

    // (a) a name that is not a group of the cluster
    let unknown = every()
        .instance_groups_to_delete("nope")
        .send()
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Some("ValidationException"));
    assert_eq!(
        unknown.message(),
        Some("InstanceGroupsToDelete names nope, which cluster del-pod does not have.")
    );
    // (b) a group both sent and deleted
    let both = every()
        .instance_groups_to_delete("extra")
        .send()
        .await
        .unwrap_err();
    assert_eq!(both.code(), Some("ValidationException"));
    assert_eq!(
        both.message(),
        Some(
            "The update of cluster del-pod lists instance group(s) extra in both InstanceGroups and InstanceGroupsToDelete. An instance group is either updated or deleted."
        )
    );
    // (c) a deleted group is not omitted, but every other group must still be sent
    let omitted = update()
        .instance_groups(workers(2))
        .instance_groups_to_delete("extra")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        omitted.message(),
        Some(
            "The update of cluster del-pod omits instance group(s) ctrl, spare. List every instance group of the cluster with its settings."
        )
    );
    let none_sent = update()
        .instance_groups_to_delete("extra")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        none_sent.message(),
        Some(
            "The update of cluster del-pod omits instance group(s) workers, ctrl, spare. List every instance group of the cluster with its settings."
        )
    );
    assert_eq!(group_statuses(&env, "del-pod").await.0, "InService");

    // two groups deleted and one resized, the rest sent as they are: the deleted groups are
    // not counted as changed
    update()
        .instance_groups(workers(3))
        .instance_groups(ctrl())
        .instance_groups_to_delete("extra")
        .instance_groups_to_delete("spare")
        .send()
        .await
        .unwrap();
    // their nodes go at once; the groups are `Deleting` while the cluster is `Updating`
    assert_eq!(
        node_groups(&env, "del-pod").await,
        ["ctrl", "workers", "workers", "workers"]
    );
    assert_eq!(
        group_statuses(&env, "del-pod").await,
        (
            "Updating".to_string(),
            pairs(&[
                ("workers", "Updating"),
                ("ctrl", "Updating"),
                ("extra", "Deleting"),
                ("spare", "Deleting")
            ])
        )
    );
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(
        group_statuses(&env, "del-pod").await,
        (
            "InService".to_string(),
            pairs(&[("workers", "InService"), ("ctrl", "InService")])
        )
    );
    assert_eq!(
        node_groups(&env, "del-pod").await,
        ["ctrl", "workers", "workers", "workers"]
    );
    // a deleted group is gone: deleting it again names it as unknown
    let again = update()
        .instance_groups(workers(3))
        .instance_groups(ctrl())
        .instance_groups_to_delete("extra")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        again.message(),
        Some("InstanceGroupsToDelete names extra, which cluster del-pod does not have.")
    );

    // lenient: InstanceGroupsToDelete alone removes its group and keeps the others
    let lenient = env_with_settings(Settings {
        refuse_partial_cluster_updates: false,
        ..Settings::default()
    })
    .await;
    lenient
        .sm
        .create_cluster()
        .cluster_name("loose-pod")
        .instance_groups(workers(2))
        .instance_groups(extra())
        .send()
        .await
        .unwrap();
    lenient.cloud.step(TimeDelta::minutes(3));
    lenient
        .sm
        .update_cluster()
        .cluster_name("loose-pod")
        .instance_groups_to_delete("extra")
        .send()
        .await
        .unwrap();
    assert_eq!(
        node_groups(&lenient, "loose-pod").await,
        ["workers", "workers"]
    );
    lenient.cloud.step(TimeDelta::minutes(5));
    assert_eq!(
        group_statuses(&lenient, "loose-pod").await,
        ("InService".to_string(), pairs(&[("workers", "InService")]))
    );
}

#[tokio::test]
async fn a_group_with_both_instance_type_and_instance_requirements_is_refused() {
    let env = env().await;
    let flexible = || {
        let g = group("flex", "ml.m5.large", 2, None);
        ClusterInstanceGroupSpecification::builder()
            .instance_group_name("flex")
            .instance_requirements(
                ClusterInstanceRequirements::builder()
                    .instance_types(ClusterInstanceType::from("ml.m5.xlarge"))
                    .instance_types(ClusterInstanceType::from("ml.m5.large"))
                    .build(),
            )
            .instance_count(2)
            .execution_role(g.execution_role().unwrap())
            .life_cycle_config(g.life_cycle_config().unwrap().clone())
    };
    let both = || {
        flexible()
            .instance_type(ClusterInstanceType::from("ml.m5.xlarge"))
            .build()
    };
    let ctrl = |n| group("ctrl", "ml.m5.large", n, None);
    const EXCLUSIVE: &str =
        "The InstanceType and InstanceRequirements properties are mutually exclusive.";
    let refused = env
        .sm
        .create_cluster()
        .cluster_name("flex-pod")
        .instance_groups(both())
        .instance_groups(ctrl(1))
        .send()
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some("ValidationException"));
    assert_eq!(refused.message(), Some(EXCLUSIVE));

    // requirements only: accepted, its nodes run the first type listed
    env.sm
        .create_cluster()
        .cluster_name("flex-pod")
        .instance_groups(flexible().build())
        .instance_groups(ctrl(1))
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(3));
    let d = env
        .sm
        .describe_cluster()
        .cluster_name("flex-pod")
        .send()
        .await
        .unwrap();
    let flex = &d.instance_groups()[0];
    assert_eq!(flex.instance_type().unwrap().as_str(), "ml.m5.xlarge");
    let types: Vec<&str> = flex
        .instance_requirements()
        .unwrap()
        .current_instance_types()
        .iter()
        .map(|t| t.as_str())
        .collect();
    assert_eq!(types, ["ml.m5.xlarge", "ml.m5.large"]);
    let nodes = env
        .sm
        .list_cluster_nodes()
        .cluster_name("flex-pod")
        .instance_group_name_contains("flex")
        .send()
        .await
        .unwrap();
    assert_eq!(nodes.cluster_node_summaries().len(), 2);
    assert!(
        nodes
            .cluster_node_summaries()
            .iter()
            .all(|n| n.instance_type().unwrap().as_str() == "ml.m5.xlarge")
    );

    // sent back with both fields, on an update: refused, whatever else the update does
    let update = || env.sm.update_cluster().cluster_name("flex-pod");
    let refused = update()
        .instance_groups(both())
        .instance_groups(ctrl(2))
        .send()
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some("ValidationException"));
    assert_eq!(refused.message(), Some(EXCLUSIVE));
    // sent back with its requirements only, as described: unchanged, so resizing ctrl is the
    // update's one change
    update()
        .instance_groups(flexible().build())
        .instance_groups(ctrl(2))
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(
        node_groups(&env, "flex-pod").await,
        ["ctrl", "ctrl", "flex", "flex"]
    );
}

#[tokio::test]
async fn an_update_carrying_a_group_on_a_plan_not_scheduled_or_active_is_refused() {
    let env = env().await;
    let offer = plan_offerings(
        &env,
        "ml.p5.48xlarge",
        4,
        24,
        SageMakerResourceName::HyperpodCluster,
    )
    .await
    .remove(0);
    let end = chrono_of(
        offer
            .reserved_capacity_offerings()
            .last()
            .unwrap()
            .end_time()
            .unwrap(),
    );
    let ctrl = |n| group("ctrl", "ml.m5.large", n, None);
    env.sm
        .create_cluster()
        .cluster_name("plan-pod")
        .instance_groups(ctrl(1))
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(3));
    let update = || env.sm.update_cluster().cluster_name("plan-pod");

    // a plan still `Pending` (its payment clears in 5 minutes) cannot take a group
    let arn = buy_plan(&env, "pod-plan", &offer).await;
    let gpus = || group("gpus", "ml.p5.48xlarge", 4, Some(&arn));
    let pending = update()
        .instance_groups(ctrl(1))
        .instance_groups(gpus())
        .send()
        .await
        .unwrap_err();
    assert_eq!(pending.code(), Some("ValidationException"));
    assert_eq!(
        pending.message().unwrap(),
        format!(
            "Instance group gpus of cluster plan-pod uses training plan {arn}, which is Pending. An instance group can use a training plan only while it is Scheduled or Active."
        )
    );
    // `Scheduled`: accepted
    env.cloud.step(TimeDelta::minutes(5));
    update()
        .instance_groups(ctrl(1))
        .instance_groups(gpus())
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(5));

    // `Expired`: the group sent back as it is refuses an update of another group
    env.cloud.advance_to(end + TimeDelta::minutes(1));
    let expired = update()
        .instance_groups(ctrl(2))
        .instance_groups(gpus())
        .send()
        .await
        .unwrap_err();
    assert_eq!(expired.code(), Some("ValidationException"));
    assert_eq!(
        expired.message().unwrap(),
        format!(
            "Instance group gpus of cluster plan-pod uses training plan {arn}, which is Expired. An instance group can use a training plan only while it is Scheduled or Active."
        )
    );
    // deleting the group is not checked
    update()
        .instance_groups(ctrl(2))
        .instance_groups_to_delete("gpus")
        .send()
        .await
        .unwrap();
    env.cloud.step(TimeDelta::minutes(5));
    assert_eq!(
        group_statuses(&env, "plan-pod").await,
        ("InService".to_string(), pairs(&[("ctrl", "InService")]))
    );

    // false: only a group whose plan changes is checked
    let lenient = env_with_settings(Settings {
        refuse_expired_plan_groups: false,
        ..Settings::default()
    })
    .await;
    let offer = plan_offerings(
        &lenient,
        "ml.p5.48xlarge",
        4,
        24,
        SageMakerResourceName::HyperpodCluster,
    )
    .await
    .remove(0);
    let arn = buy_plan(&lenient, "pod-plan", &offer).await;
    let gpus = || group("gpus", "ml.p5.48xlarge", 4, Some(&arn));
    lenient
        .sm
        .create_cluster()
        .cluster_name("plan-pod")
        .instance_groups(ctrl(1))
        .instance_groups(gpus())
        .send()
        .await
        .unwrap();
    lenient.cloud.advance_to(end + TimeDelta::minutes(1));
    let update = || lenient.sm.update_cluster().cluster_name("plan-pod");
    update()
        .instance_groups(ctrl(2))
        .instance_groups(gpus())
        .send()
        .await
        .unwrap();
    lenient.cloud.step(TimeDelta::minutes(5));
    let late = update()
        .instance_groups(ctrl(2))
        .instance_groups(gpus())
        .instance_groups(group("late", "ml.p5.48xlarge", 1, Some(&arn)))
        .send()
        .await
        .unwrap_err();
    assert_eq!(late.code(), Some("ValidationException"));
    assert_eq!(
        late.message().unwrap(),
        format!(
            "Instance group late of cluster plan-pod uses training plan {arn}, which is Expired. An instance group can use a training plan only while it is Scheduled or Active."
        )
    );
}
