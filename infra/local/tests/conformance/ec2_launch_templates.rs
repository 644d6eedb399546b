//! Launch templates with network interfaces (EFA): DescribeLaunchTemplateVersions, the
//! interface/subnet combination RunInstances refuses, `NetworkInterface.N` overrides, and the
//! harsher refusal of an override that drops one of the template's interfaces.

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::operation::run_instances::builders::RunInstancesFluentBuilder;
use aws_sdk_ec2::types::{
    Filter, InstanceNetworkInterfaceSpecification, InstanceType, LaunchTemplateSpecification,
};
use chrono::TimeDelta;
use local_cloud::Settings;

use crate::helpers::*;

const EFA: &str = "capacity-pilot-efa";

fn efa_template() -> LaunchTemplateSpecification {
    LaunchTemplateSpecification::builder()
        .launch_template_name(EFA)
        .version("$Default")
        .build()
}

async fn subnet_in(env: &Env, az: &str) -> String {
    env.ec2
        .describe_subnets()
        .filters(
            Filter::builder()
                .name("availability-zone")
                .values(az)
                .build(),
        )
        .send()
        .await
        .unwrap()
        .subnets()[0]
        .subnet_id()
        .unwrap()
        .to_string()
}

/// The seeded security group, as the EFA template names it.
async fn template_group(env: &Env) -> String {
    let out = env
        .ec2
        .describe_launch_template_versions()
        .launch_template_name(EFA)
        .versions("$Default")
        .send()
        .await
        .unwrap();
    out.launch_template_versions()[0]
        .launch_template_data()
        .unwrap()
        .network_interfaces()[0]
        .groups()[0]
        .clone()
}

/// An override interface; `kind` None leaves `InterfaceType` out (a plain ENA interface).
fn nic(
    card: i32,
    device: i32,
    kind: Option<&str>,
    subnet: Option<&str>,
    group: &str,
) -> InstanceNetworkInterfaceSpecification {
    InstanceNetworkInterfaceSpecification::builder()
        .network_card_index(card)
        .device_index(device)
        .set_interface_type(kind.map(str::to_string))
        .set_subnet_id(subnet.map(str::to_string))
        .groups(group)
        .delete_on_termination(true)
        .build()
}

/// The template's four EFA interfaces, the primary in `subnet`.
fn efa_overrides(subnet: &str, group: &str) -> Vec<InstanceNetworkInterfaceSpecification> {
    (0..4)
        .map(|card| {
            nic(
                card,
                i32::from(card > 0),
                Some("efa"),
                (card == 0).then_some(subnet),
                group,
            )
        })
        .collect()
}

/// A p5.48xlarge launch from the EFA template with these interfaces.
fn efa_launch(
    env: &Env,
    nics: Vec<InstanceNetworkInterfaceSpecification>,
) -> RunInstancesFluentBuilder {
    env.ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("p5.48xlarge".into())
        .launch_template(efa_template())
        .set_network_interfaces(Some(nics))
}

#[tokio::test]
async fn the_efa_template_describes_its_network_interfaces() {
    let env = env().await;
    let by_name = env
        .ec2
        .describe_launch_template_versions()
        .launch_template_name(EFA)
        .versions("$Default")
        .send()
        .await
        .unwrap();
    assert_eq!(by_name.launch_template_versions().len(), 1);
    let v = &by_name.launch_template_versions()[0];
    let id = v.launch_template_id().unwrap().to_string();
    assert!(id.starts_with("lt-"));
    assert_eq!(v.launch_template_name(), Some(EFA));
    assert_eq!(v.version_number(), Some(1));
    assert_eq!(v.default_version(), Some(true));
    let data = v.launch_template_data().unwrap();
    assert!(data.image_id().unwrap().starts_with("ami-"));
    assert_eq!(data.instance_type(), None, "the launch gives the type");
    let nics = data.network_interfaces();
    assert_eq!(nics.len(), 4);
    let layout: Vec<(Option<i32>, Option<i32>)> = nics
        .iter()
        .map(|n| (n.network_card_index(), n.device_index()))
        .collect();
    assert_eq!(
        layout,
        [
            (Some(0), Some(0)),
            (Some(1), Some(1)),
            (Some(2), Some(1)),
            (Some(3), Some(1))
        ]
    );
    let group = nics[0].groups()[0].clone();
    assert!(group.starts_with("sg-"));
    for n in nics {
        assert_eq!(n.interface_type(), Some("efa"));
        assert_eq!(n.groups(), std::slice::from_ref(&group));
        assert_eq!(n.delete_on_termination(), Some(true));
        assert_eq!(n.subnet_id(), None, "no subnet in the template");
    }

    // by id, and by every name of version 1
    for version in ["$Latest", "1"] {
        let by_id = env
            .ec2
            .describe_launch_template_versions()
            .launch_template_id(&id)
            .versions(version)
            .send()
            .await
            .unwrap();
        assert_eq!(
            by_id.launch_template_versions()[0].launch_template_name(),
            Some(EFA)
        );
    }
    let err = env
        .ec2
        .describe_launch_template_versions()
        .launch_template_id(&id)
        .versions("2")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidLaunchTemplateId.VersionNotFound"));
    let err = env
        .ec2
        .describe_launch_template_versions()
        .launch_template_name("nope")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some("InvalidLaunchTemplateName.NotFoundException")
    );
    let err = env
        .ec2
        .describe_launch_template_versions()
        .launch_template_id("lt-00000000000000000")
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidLaunchTemplateId.NotFound"));

    // every template's default version; the other two have no interfaces
    let all = env
        .ec2
        .describe_launch_template_versions()
        .versions("$Default")
        .send()
        .await
        .unwrap();
    let names: Vec<&str> = all
        .launch_template_versions()
        .iter()
        .map(|v| v.launch_template_name().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "capacity-pilot-gpu",
            "capacity-pilot-cpu",
            "capacity-pilot-efa"
        ]
    );
    let cpu = all.launch_template_versions()[1]
        .launch_template_data()
        .unwrap();
    assert_eq!(cpu.instance_type(), Some(&InstanceType::M5Large));
    assert!(cpu.network_interfaces().is_empty());
    assert!(
        all.launch_template_versions()[0]
            .launch_template_data()
            .unwrap()
            .network_interfaces()
            .is_empty()
    );
}

#[tokio::test]
async fn a_template_with_network_interfaces_refuses_an_instance_level_subnet() {
    let env = env().await;
    let subnet = subnet_in(&env, "us-east-1b").await;
    let launch = || {
        env.ec2
            .run_instances()
            .min_count(1)
            .max_count(1)
            .instance_type("p5.48xlarge".into())
            .launch_template(efa_template())
    };
    let err = launch().subnet_id(&subnet).send().await.unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterCombination"));
    assert_eq!(
        err.message(),
        Some(
            "Network interfaces and an instance-level subnet ID may not be specified on the same request"
        )
    );
    let group = template_group(&env).await;
    let err = launch()
        .security_group_ids(&group)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterCombination"));
    // the same holds for interfaces given in the request
    let err = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(1)
        .instance_type("m5.large".into())
        .image_id("ami-1")
        .subnet_id(&subnet)
        .network_interfaces(nic(0, 0, None, Some(&subnet), &group))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterCombination"));

    // without a subnet the template's interfaces launch, in the zone asked for
    let out = launch()
        .placement(
            aws_sdk_ec2::types::Placement::builder()
                .availability_zone("us-east-1b")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let inst = &out.instances()[0];
    assert_eq!(inst.subnet_id(), Some(subnet.as_str()));
    let nics = inst.network_interfaces();
    assert_eq!(nics.len(), 4);
    for (card, n) in nics.iter().enumerate() {
        let a = n.attachment().unwrap();
        assert_eq!(a.network_card_index(), Some(card as i32));
        assert_eq!(a.device_index(), Some(i32::from(card > 0)));
        assert_eq!(a.delete_on_termination(), Some(true));
        assert_eq!(n.interface_type(), Some("efa"));
        assert_eq!(n.subnet_id(), Some(subnet.as_str()));
        assert_eq!(n.groups()[0].group_id(), Some(group.as_str()));
        assert!(n.network_interface_id().unwrap().starts_with("eni-"));
    }
}

#[tokio::test]
async fn network_interface_overrides_replace_the_template_list_and_place_the_instance() {
    let env = env().await;
    let group = template_group(&env).await;
    let b = subnet_in(&env, "us-east-1b").await;
    let c = subnet_in(&env, "us-east-1c").await;
    let launch = |nics: Vec<InstanceNetworkInterfaceSpecification>, token: &str| {
        env.ec2
            .run_instances()
            .min_count(1)
            .max_count(1)
            .instance_type("p5.48xlarge".into())
            .launch_template(efa_template())
            .set_network_interfaces(Some(nics))
            .client_token(token)
            .send()
    };
    let out = launch(efa_overrides(&b, &group), "efa-1").await.unwrap();
    let inst = &out.instances()[0];
    let id = inst.instance_id().unwrap().to_string();
    assert_eq!(
        inst.placement().unwrap().availability_zone(),
        Some("us-east-1b"),
        "the zone of the primary interface's subnet"
    );
    assert_eq!(inst.subnet_id(), Some(b.as_str()));
    assert_eq!(inst.network_interfaces().len(), 4);
    assert!(
        inst.network_interfaces()
            .iter()
            .all(|n| n.subnet_id() == Some(b.as_str()))
    );

    // the interface list is part of the idempotent request
    let again = launch(efa_overrides(&b, &group), "efa-1").await.unwrap();
    assert_eq!(again.instances()[0].instance_id(), Some(id.as_str()));
    let mut other = efa_overrides(&b, &group);
    other[3] = nic(3, 1, Some("efa"), Some(&b), &group);
    let err = launch(other, "efa-1").await.unwrap_err();
    assert_eq!(err.code(), Some("IdempotentParameterMismatch"));

    // interfaces in two zones
    let mut split = efa_overrides(&b, &group);
    split[2] = nic(2, 1, Some("efa"), Some(&c), &group);
    let err = launch(split, "efa-2").await.unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterCombination"));
    assert!(err.message().unwrap().contains("us-east-1c"));

    // DescribeInstances shows the interfaces once the instance is listed
    env.cloud.step(TimeDelta::minutes(2));
    let d = env
        .ec2
        .describe_instances()
        .instance_ids(&id)
        .send()
        .await
        .unwrap();
    let nics = d.reservations()[0].instances()[0].network_interfaces();
    let cards: Vec<Option<i32>> = nics
        .iter()
        .map(|n| n.attachment().unwrap().network_card_index())
        .collect();
    assert_eq!(cards, [Some(0), Some(1), Some(2), Some(3)]);
    assert!(nics.iter().all(|n| n.interface_type() == Some("efa")));
}

#[tokio::test]
async fn an_override_that_drops_a_template_interface_is_refused() {
    let env = env().await;
    let group = template_group(&env).await;
    let b = subnet_in(&env, "us-east-1b").await;
    let launch = |env: &Env, nics| efa_launch(env, nics).send();
    // only the primary: AWS would launch with one EFA interface instead of four
    let err = launch(&env, vec![nic(0, 0, Some("efa"), Some(&b), &group)])
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterCombination"));
    let msg = err.message().unwrap();
    assert!(
        msg.contains("NetworkCardIndex 1 DeviceIndex 1 (InterfaceType efa)"),
        "{msg}"
    );
    assert!(msg.contains(EFA), "{msg}");
    // four interfaces, but one no longer EFA
    let mut ena = efa_overrides(&b, &group);
    ena[3] = nic(3, 1, None, None, &group);
    let err = launch(&env, ena).await.unwrap_err();
    assert_eq!(err.code(), Some("InvalidParameterCombination"));
    assert!(
        err.message()
            .unwrap()
            .contains("NetworkCardIndex 3 DeviceIndex 1"),
    );
    // four interfaces on the wrong devices
    let mut moved = efa_overrides(&b, &group);
    moved[1] = nic(1, 2, Some("efa"), None, &group);
    assert_eq!(
        launch(&env, moved).await.unwrap_err().code(),
        Some("InvalidParameterCombination")
    );
    assert!(
        env.cloud.snapshot()["ec2"]["instances"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // AWS's own reading: the override's list is launched as given
    let lenient = env_with_settings(Settings {
        refuse_dropped_interfaces: false,
        ..Settings::default()
    })
    .await;
    let b = subnet_in(&lenient, "us-east-1b").await;
    let group = template_group(&lenient).await;
    let out = launch(&lenient, vec![nic(0, 0, Some("efa"), Some(&b), &group)])
        .await
        .unwrap();
    assert_eq!(out.instances()[0].network_interfaces().len(), 1);
}

/// `availableIpAddressCount` of `subnet`, as DescribeSubnets reports it.
async fn free_addresses(env: &Env, subnet: &str) -> i32 {
    env.ec2
        .describe_subnets()
        .subnet_ids(subnet)
        .send()
        .await
        .unwrap()
        .subnets()[0]
        .available_ip_address_count()
        .unwrap()
}

#[tokio::test]
async fn every_efa_interface_takes_a_free_address_of_its_subnet_until_its_instance_is_terminated() {
    // GIVEN small subnets (/28: 16 addresses, less the 5 AWS reserves), two per zone
    let env = env_with_settings(Settings {
        subnets_per_zone: 2,
        subnet_sizes: vec![local_cloud::world::SubnetSize {
            region: "us-east-1".into(),
            zone: Some("us-east-1b".into()),
            index: None,
            prefix_length: 28,
        }],
        ..Settings::default()
    })
    .await;
    let group = template_group(&env).await;
    let in_b = env
        .ec2
        .describe_subnets()
        .filters(
            Filter::builder()
                .name("availability-zone")
                .values("us-east-1b")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let subnets = in_b.subnets();
    assert_eq!(subnets.len(), 2, "two subnets in the zone");
    assert_eq!(
        subnets[0].default_for_az(),
        Some(true),
        "one default per zone"
    );
    assert_eq!(subnets[1].default_for_az(), Some(false));
    assert!(
        subnets
            .iter()
            .all(|s| s.cidr_block().unwrap().ends_with("/28"))
    );
    let (b, other) = (
        subnets[0].subnet_id().unwrap().to_string(),
        subnets[1].subnet_id().unwrap().to_string(),
    );
    assert_eq!(free_addresses(&env, &b).await, 11);
    // a subnet not resized keeps the default VPC's /20
    let a = subnet_in(&env, "us-east-1a").await;
    assert_eq!(free_addresses(&env, &a).await, 4091);

    // WHEN two p5 instances launch from the EFA template (4 interfaces each) in it
    let mut ids = Vec::new();
    for _ in 0..2 {
        let out = efa_launch(&env, efa_overrides(&b, &group))
            .send()
            .await
            .unwrap();
        ids.push(out.instances()[0].instance_id().unwrap().to_string());
    }
    // THEN each interface took an address: 3 are left
    assert_eq!(free_addresses(&env, &b).await, 3);

    // WHEN a third asks for 4
    let err = efa_launch(&env, efa_overrides(&b, &group))
        .send()
        .await
        .unwrap_err();
    // THEN the subnet refuses it (EC2 error codes), and nothing launched
    assert_eq!(err.code(), Some("InsufficientFreeAddressesInSubnet"));
    assert_eq!(err.raw_response().unwrap().status().as_u16(), 400);
    assert!(err.message().unwrap().contains(&b), "{:?}", err.message());
    assert_eq!(free_addresses(&env, &b).await, 3);
    // AND the zone's other subnet still launches it
    efa_launch(&env, efa_overrides(&other, &group))
        .send()
        .await
        .unwrap();
    assert_eq!(free_addresses(&env, &other).await, 7);

    // WHEN one of the first two is terminated: shutting down, it still holds its addresses
    env.ec2
        .terminate_instances()
        .instance_ids(&ids[0])
        .send()
        .await
        .unwrap();
    assert_eq!(free_addresses(&env, &b).await, 3);
    let err = efa_launch(&env, efa_overrides(&b, &group))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("InsufficientFreeAddressesInSubnet"));

    // THEN once it is terminated its interfaces' addresses are free, and a launch fits
    env.cloud.step(TimeDelta::minutes(2));
    assert_eq!(free_addresses(&env, &b).await, 7);
    efa_launch(&env, efa_overrides(&b, &group))
        .send()
        .await
        .unwrap();
    assert_eq!(free_addresses(&env, &b).await, 3);

    // AND an instance without interfaces takes one address, MaxCount capped by what fits
    let out = env
        .ec2
        .run_instances()
        .min_count(1)
        .max_count(5)
        .instance_type(InstanceType::M5Large)
        .launch_template(
            LaunchTemplateSpecification::builder()
                .launch_template_name("capacity-pilot-cpu")
                .build(),
        )
        .subnet_id(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(out.instances().len(), 3);
    assert_eq!(free_addresses(&env, &b).await, 0);
}
