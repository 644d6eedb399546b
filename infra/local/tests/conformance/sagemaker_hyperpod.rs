//! HyperPod clusters whose instance groups run on a training plan: nodes appear when the plan is
//! active and go an hour before its end.

use aws_sdk_sagemaker::error::ProvideErrorMetadata;
use aws_sdk_sagemaker::types::{
    ClusterInstanceGroupSpecification, ClusterInstanceType, ClusterLifeCycleConfig,
    SageMakerResourceName,
};
use chrono::TimeDelta;

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
    let env = env().await;
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
    env.cloud.step(TimeDelta::minutes(3));
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
