//! The adapters' error and retry branches against mocked SDK clients (`aws-smithy-mocks`):
//! the wire answers are real EC2 XML and SageMaker JSON error bodies, parsed by the SDK, so
//! classification is tested on what the SDK really hands us.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::operation::describe_capacity_reservations::DescribeCapacityReservationsOutput;
use aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput;
use aws_sdk_sagemaker::operation::list_tags::ListTagsOutput;
use aws_sdk_sagemaker::types::ClusterInstanceGroupDetails;
use aws_smithy_mocks::{Rule, RuleMode, mock};
use chrono::{TimeZone, Utc};

use super::ec2::Ec2Adapter;
use super::sagemaker::SageMakerAdapter;
use crate::domain::catalog::PriceTable;
use crate::domain::money::Usd;
use crate::domain::naming::MANAGED_TAG;
use crate::domain::offering::{Offering, Product, Segment, TargetResource};
use crate::domain::request::{LaunchTemplateRef, RequestId};
use crate::ports::{LaunchMarket, LaunchSpec, PortError, PurchaseSpec};

const REGION: &str = "us-east-1";

fn retry(standard: bool) -> aws_sdk_ec2::config::retry::RetryConfig {
    if standard {
        aws_sdk_ec2::config::retry::RetryConfig::standard()
            .with_max_attempts(3)
            .with_initial_backoff(Duration::from_millis(1))
            .with_max_backoff(Duration::from_millis(2))
    } else {
        aws_sdk_ec2::config::retry::RetryConfig::disabled()
    }
}

/// An EC2 client answering from `rules`, with the SDK's standard retries (3 attempts)
/// unless `retries` is false.
fn ec2(rules: &[&Rule], retries: bool) -> Ec2Adapter {
    let mut interceptor =
        aws_smithy_mocks::MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny);
    for r in rules {
        interceptor = interceptor.with_rule(r);
    }
    let conf = aws_sdk_ec2::Config::builder()
        .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
        .region(aws_sdk_ec2::config::Region::new(REGION))
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "AKID", "SECRET", None, None, "test",
        ))
        .retry_config(retry(retries))
        .http_client(aws_smithy_mocks::create_mock_http_client())
        .interceptor(interceptor)
        .build();
    let sdk = aws_config::SdkConfig::builder().build();
    Ec2Adapter::new(&sdk, PriceTable::default())
        .with_client(REGION, aws_sdk_ec2::Client::from_conf(conf))
}

fn sagemaker(rules: &[&Rule], retries: bool) -> SageMakerAdapter {
    let mut interceptor =
        aws_smithy_mocks::MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny);
    for r in rules {
        interceptor = interceptor.with_rule(r);
    }
    let conf = aws_sdk_sagemaker::Config::builder()
        .behavior_version(aws_sdk_sagemaker::config::BehaviorVersion::latest())
        .region(aws_sdk_sagemaker::config::Region::new(REGION))
        .credentials_provider(aws_sdk_sagemaker::config::Credentials::new(
            "AKID", "SECRET", None, None, "test",
        ))
        .retry_config(retry(retries))
        .http_client(aws_smithy_mocks::create_mock_http_client())
        .interceptor(interceptor)
        .build();
    let sdk = aws_config::SdkConfig::builder().build();
    SageMakerAdapter::new(&sdk, PriceTable::default())
        .with_client(REGION, aws_sdk_sagemaker::Client::from_conf(conf))
}

/// An EC2 Query-protocol error body.
fn ec2_error(code: &str, message: &str) -> Option<String> {
    Some(format!(
        "<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>r-1</RequestID></Response>"
    ))
}

/// An awsJson error body.
fn json_error(code: &str, message: &str) -> Option<String> {
    Some(format!(r#"{{"__type":"{code}","message":"{message}"}}"#))
}

fn block_offering() -> Offering {
    let start = Utc.with_ymd_and_hms(2026, 12, 7, 11, 30, 0).unwrap();
    Offering::new(
        "cb-0123456789abcdef0",
        Product::CapacityBlock,
        REGION,
        "p5.48xlarge",
        1,
        vec![Segment {
            start,
            end: start + chrono::Duration::hours(24),
            availability_zone: Some("us-east-1a".into()),
        }],
        Usd::parse("1000.00").unwrap(),
        &PriceTable::default(),
    )
}

fn plan_offering() -> Offering {
    let mut o = block_offering();
    o.id = "tpo-1".into();
    o.product = Product::TrainingPlan {
        target: TargetResource::TrainingJob,
    };
    o.instance_type = "ml.p5.48xlarge".into();
    o
}

fn spec() -> PurchaseSpec {
    let request_id = RequestId::parse("req-1").unwrap();
    PurchaseSpec {
        plan_name: crate::domain::naming::plan_name(&request_id, "prod", 0),
        request_id,
        instance_platform: "Linux/UNIX".into(),
        tags: BTreeMap::new(),
    }
}

#[tokio::test]
async fn a_capacity_block_purchase_whose_answer_is_lost_is_outcome_unknown_and_sent_once() {
    let rule = mock!(aws_sdk_ec2::Client::purchase_capacity_block)
        .sequence()
        .http_status(
            500,
            ec2_error("InternalError", "An internal error has occurred"),
        )
        .times(3)
        .build();
    let adapter = ec2(&[&rule], true);
    let err = adapter
        .purchase_block(&block_offering(), &spec())
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::OutcomeUnknown { .. }), "{err:?}");
    assert!(err.to_string().contains("InternalError"), "{err}");
    assert_eq!(rule.num_calls(), 1, "the SDK must not retry a purchase");
}

#[tokio::test]
async fn a_throttled_purchase_is_throttled_and_not_retried_either() {
    let rule = mock!(aws_sdk_ec2::Client::purchase_capacity_block)
        .sequence()
        .http_status(
            503,
            ec2_error("RequestLimitExceeded", "Request limit exceeded."),
        )
        .times(3)
        .build();
    let adapter = ec2(&[&rule], true);
    let err = adapter
        .purchase_block(&block_offering(), &spec())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("RequestLimitExceeded"));
    assert!(matches!(err, PortError::Throttled { .. }));
    assert_eq!(rule.num_calls(), 1);
}

#[tokio::test]
async fn the_three_offering_codes_without_a_dot_mean_the_offering_is_gone() {
    for code in [
        "InvalidCapacityBlockOfferingIdNotFound",
        "InvalidCapacityBlockOfferingIdExpired",
        "InvalidCapacityBlockOfferingIdMalformed",
    ] {
        let rule = mock!(aws_sdk_ec2::Client::purchase_capacity_block)
            .sequence()
            .http_status(400, ec2_error(code, "The offering is gone."))
            .build();
        let err = ec2(&[&rule], true)
            .purchase_block(&block_offering(), &spec())
            .await
            .unwrap_err();
        assert!(
            matches!(err, PortError::OfferingGone { .. }),
            "{code}: {err:?}"
        );
        assert_eq!(err.code(), Some(code));
        assert!(err.to_string().contains("The offering is gone."));
    }
}

#[tokio::test]
async fn a_read_that_fails_with_a_500_is_retried_by_the_sdk_and_succeeds() {
    let rule = mock!(aws_sdk_ec2::Client::describe_capacity_reservations)
        .sequence()
        .http_status(500, ec2_error("InternalError", "oops"))
        .times(2)
        .output(|| DescribeCapacityReservationsOutput::builder().build())
        .build();
    let adapter = ec2(&[&rule], true);
    let found = adapter
        .describe_reservation(REGION, "cr-0123456789abcdef0")
        .await
        .unwrap();
    assert_eq!(found, None);
    assert_eq!(rule.num_calls(), 3);
}

#[tokio::test]
async fn a_read_failing_every_attempt_is_transient() {
    let rule = mock!(aws_sdk_ec2::Client::describe_capacity_reservations)
        .sequence()
        .http_status(503, ec2_error("Unavailable", "busy"))
        .times(3)
        .build();
    let err = ec2(&[&rule], true)
        .describe_reservation(REGION, "cr-0123456789abcdef0")
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::Transient { .. }), "{err:?}");
    assert!(err.is_retryable());
}

#[tokio::test]
async fn an_unknown_reservation_id_is_none() {
    let rule = mock!(aws_sdk_ec2::Client::describe_capacity_reservations)
        .sequence()
        .http_status(
            400,
            ec2_error(
                "InvalidCapacityReservationId.NotFound",
                "no such reservation",
            ),
        )
        .build();
    let found = ec2(&[&rule], false)
        .describe_reservation(REGION, "cr-0123456789abcdef0")
        .await
        .unwrap();
    assert_eq!(found, None);
}

fn launch(market: LaunchMarket) -> LaunchSpec {
    LaunchSpec {
        region: REGION.into(),
        market,
        instance_type: "p5.48xlarge".into(),
        count: 2,
        subnet_id: "subnet-1".into(),
        launch_template: LaunchTemplateRef {
            id: None,
            name: Some("gpu".into()),
            version: None,
        },
        client_token: "cp-token".into(),
        tags: BTreeMap::from([("team".to_string(), "a".to_string())]),
    }
}

/// DescribeLaunchTemplateVersions answering one version of template `gpu` with `interfaces`.
fn template_version(
    interfaces: Vec<aws_sdk_ec2::types::LaunchTemplateInstanceNetworkInterfaceSpecification>,
) -> Rule {
    mock!(aws_sdk_ec2::Client::describe_launch_template_versions)
        .match_requests(|r| {
            r.launch_template_name() == Some("gpu") && r.versions() == ["$Default".to_string()]
        })
        .then_output(move || {
            aws_sdk_ec2::operation::describe_launch_template_versions::DescribeLaunchTemplateVersionsOutput::builder()
                .launch_template_versions(
                    aws_sdk_ec2::types::LaunchTemplateVersion::builder()
                        .launch_template_name("gpu")
                        .version_number(1)
                        .default_version(true)
                        .launch_template_data(
                            aws_sdk_ec2::types::ResponseLaunchTemplateData::builder()
                                .set_network_interfaces(Some(interfaces.clone()))
                                .build(),
                        )
                        .build(),
                )
                .build()
        })
}

#[tokio::test]
async fn a_template_with_efa_interfaces_launches_with_each_copied_into_the_subnet_and_no_instance_subnet()
 {
    use aws_sdk_ec2::types::LaunchTemplateInstanceNetworkInterfaceSpecification as Nic;
    let nic = |card: i32, device: i32| {
        Nic::builder()
            .network_card_index(card)
            .device_index(device)
            .interface_type("efa")
            .groups("sg-1")
            .delete_on_termination(true)
            .build()
    };
    let template = template_version(vec![nic(0, 0), nic(1, 1), nic(2, 1), nic(3, 1)]);
    let run = mock!(aws_sdk_ec2::Client::run_instances)
        .match_requests(|r| {
            let nics = r.network_interfaces();
            r.subnet_id().is_none()
                && nics.len() == 4
                && nics.iter().enumerate().all(|(i, n)| {
                    n.subnet_id() == Some("subnet-1")
                        && n.network_card_index() == Some(i as i32)
                        && n.device_index() == Some(if i == 0 { 0 } else { 1 })
                        && n.interface_type() == Some("efa")
                        && n.groups() == ["sg-1".to_string()]
                        && n.delete_on_termination() == Some(true)
                })
        })
        .then_output(|| {
            aws_sdk_ec2::operation::run_instances::RunInstancesOutput::builder().build()
        });

    ec2(&[&template, &run], false)
        .launch_instances(&launch(LaunchMarket::OnDemand))
        .await
        .unwrap();

    assert_eq!(template.num_calls(), 1);
    assert_eq!(
        run.num_calls(),
        1,
        "RunInstances carried every interface in the subnet"
    );
}

#[tokio::test]
async fn a_template_interfaces_ena_express_tracking_prefixes_and_queues_are_carried_into_the_override()
 {
    // Issue 50 (review Task 3 #9): the override replaces the template's list, so a setting it
    // does not carry is lost silently (ENA Express off). GIVEN a template whose interface sets
    // every member an instance's interface can take beside its subnet
    use aws_sdk_ec2::types::{
        ConnectionTrackingSpecification, Ipv4PrefixSpecificationResponse,
        Ipv6PrefixSpecificationResponse, LaunchTemplateEnaSrdSpecification,
        LaunchTemplateEnaSrdUdpSpecification,
        LaunchTemplateInstanceNetworkInterfaceSpecification as Nic,
    };
    let nic = |card: i32, prefixes: bool| {
        let n = Nic::builder()
            .network_card_index(card)
            .device_index(i32::from(card > 0))
            .interface_type("efa")
            .description("gpu fabric")
            .associate_carrier_ip_address(false)
            .secondary_private_ip_address_count(2)
            .ipv6_address_count(1)
            .primary_ipv6(true)
            .ena_queue_count(32)
            .ena_srd_specification(
                LaunchTemplateEnaSrdSpecification::builder()
                    .ena_srd_enabled(true)
                    .ena_srd_udp_specification(
                        LaunchTemplateEnaSrdUdpSpecification::builder()
                            .ena_srd_udp_enabled(true)
                            .build(),
                    )
                    .build(),
            )
            .connection_tracking_specification(
                ConnectionTrackingSpecification::builder()
                    .tcp_established_timeout(3600)
                    .udp_stream_timeout(120)
                    .udp_timeout(45)
                    .build(),
            );
        if prefixes {
            n.ipv4_prefixes(
                Ipv4PrefixSpecificationResponse::builder()
                    .ipv4_prefix("10.0.4.0/28")
                    .build(),
            )
            .ipv6_prefixes(
                Ipv6PrefixSpecificationResponse::builder()
                    .ipv6_prefix("2600:1f18::/80")
                    .build(),
            )
            .build()
        } else {
            n.ipv4_prefix_count(2).ipv6_prefix_count(1).build()
        }
    };
    let template = template_version(vec![nic(0, false), nic(1, true)]);
    let run = mock!(aws_sdk_ec2::Client::run_instances)
        .match_requests(|r| {
            let nics = r.network_interfaces();
            nics.len() == 2
                && nics.iter().all(|n| {
                    let srd = n.ena_srd_specification();
                    let tracking = n.connection_tracking_specification();
                    n.subnet_id() == Some("subnet-1")
                        && n.description() == Some("gpu fabric")
                        && n.associate_carrier_ip_address() == Some(false)
                        && n.secondary_private_ip_address_count() == Some(2)
                        && n.ipv6_address_count() == Some(1)
                        && n.primary_ipv6() == Some(true)
                        && n.ena_queue_count() == Some(32)
                        && srd.and_then(|s| s.ena_srd_enabled()) == Some(true)
                        && srd
                            .and_then(|s| s.ena_srd_udp_specification())
                            .and_then(|u| u.ena_srd_udp_enabled())
                            == Some(true)
                        && tracking.and_then(|t| t.tcp_established_timeout()) == Some(3600)
                        && tracking.and_then(|t| t.udp_stream_timeout()) == Some(120)
                        && tracking.and_then(|t| t.udp_timeout()) == Some(45)
                })
                && nics[0].ipv4_prefix_count() == Some(2)
                && nics[0].ipv6_prefix_count() == Some(1)
                && nics[0].ipv4_prefixes().is_empty()
                && nics[1].ipv4_prefixes().len() == 1
                && nics[1].ipv4_prefixes()[0].ipv4_prefix() == Some("10.0.4.0/28")
                && nics[1].ipv6_prefixes().len() == 1
                && nics[1].ipv6_prefixes()[0].ipv6_prefix() == Some("2600:1f18::/80")
                && nics[1].ipv4_prefix_count().is_none()
        })
        .then_output(|| {
            aws_sdk_ec2::operation::run_instances::RunInstancesOutput::builder().build()
        });

    // WHEN an instance is launched from it in our subnet
    ec2(&[&template, &run], false)
        .launch_instances(&launch(LaunchMarket::OnDemand))
        .await
        .unwrap();

    // THEN the override carries each of them, on each interface
    assert_eq!(
        run.num_calls(),
        1,
        "RunInstances carried every setting of the template's interfaces"
    );
}

#[tokio::test]
async fn a_template_without_interfaces_launches_in_the_instance_level_subnet() {
    let template = template_version(vec![]);
    let run = mock!(aws_sdk_ec2::Client::run_instances)
        .match_requests(|r| r.subnet_id() == Some("subnet-1") && r.network_interfaces().is_empty())
        .then_output(|| {
            aws_sdk_ec2::operation::run_instances::RunInstancesOutput::builder().build()
        });

    ec2(&[&template, &run], false)
        .launch_instances(&launch(LaunchMarket::OnDemand))
        .await
        .unwrap();

    assert_eq!(run.num_calls(), 1);
}

#[tokio::test]
async fn missing_capacity_on_launch_is_no_capacity() {
    for (status, code) in [
        (500, "InsufficientInstanceCapacity"),
        (400, "ReservationCapacityExceeded"),
        // A full subnet is no capacity there, not a refusal of the request (issue 50).
        (400, "InsufficientFreeAddressesInSubnet"),
    ] {
        let rule = mock!(aws_sdk_ec2::Client::run_instances)
            .sequence()
            .http_status(status, ec2_error(code, "not enough capacity"))
            .build();
        // With the SDK's retries on: no capacity is answered at once, not retried.
        let err = ec2(&[&template_version(vec![]), &rule], true)
            .launch_instances(&launch(LaunchMarket::OnDemand))
            .await
            .unwrap_err();
        assert_eq!(rule.num_calls(), 1, "{code} is not retried");
        assert!(
            matches!(err, PortError::NoCapacity { .. }),
            "{code}: {err:?}"
        );
        assert_eq!(err.code(), Some(code));
    }
}

#[tokio::test]
async fn a_launch_into_a_block_names_the_market_the_reservation_the_token_and_our_tags() {
    let rule = mock!(aws_sdk_ec2::Client::run_instances)
        .match_requests(|r| {
            r.instance_market_options()
                .and_then(|m| m.market_type())
                .map(|m| m.as_str())
                == Some("capacity-block")
                && r.capacity_reservation_specification()
                    .and_then(|s| s.capacity_reservation_target())
                    .and_then(|t| t.capacity_reservation_id())
                    == Some("cr-1")
                && r.client_token() == Some("cp-token")
                && r.min_count() == Some(2)
                && r.max_count() == Some(2)
                && r.launch_template().and_then(|t| t.launch_template_name()) == Some("gpu")
                && r.tag_specifications().iter().any(|s| {
                    s.resource_type().map(|t| t.as_str()) == Some("instance")
                        && s.tags().iter().any(|t| t.key() == Some(MANAGED_TAG))
                        && s.tags().iter().any(|t| t.key() == Some("team"))
                })
        })
        .then_output(|| {
            aws_sdk_ec2::operation::run_instances::RunInstancesOutput::builder().build()
        });
    let out = ec2(&[&template_version(vec![]), &rule], false)
        .launch_instances(&launch(LaunchMarket::CapacityBlock {
            reservation_id: "cr-1".into(),
        }))
        .await
        .unwrap();
    assert!(out.is_empty());
    assert_eq!(rule.num_calls(), 1);
}

#[tokio::test]
async fn a_training_plan_purchase_is_sent_once_and_a_taken_name_means_reconcile() {
    let rule = mock!(aws_sdk_sagemaker::Client::create_training_plan)
        .sequence()
        .http_status(
            400,
            json_error("ResourceInUse", "Training plan cp-req-1 already exists"),
        )
        .build();
    let err = sagemaker(&[&rule], true)
        .purchase_plan(&plan_offering(), &spec())
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::OutcomeUnknown { .. }), "{err:?}");
    assert_eq!(rule.num_calls(), 1);

    let rule = mock!(aws_sdk_sagemaker::Client::create_training_plan)
        .sequence()
        .http_status(500, json_error("InternalFailure", "oops"))
        .times(3)
        .build();
    let err = sagemaker(&[&rule], true)
        .purchase_plan(&plan_offering(), &spec())
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::OutcomeUnknown { .. }), "{err:?}");
    assert_eq!(rule.num_calls(), 1, "the SDK must not retry a purchase");
}

#[tokio::test]
async fn an_unknown_training_plan_offering_is_gone() {
    let rule = mock!(aws_sdk_sagemaker::Client::create_training_plan)
        .sequence()
        .http_status(
            400,
            json_error(
                "ResourceNotFound",
                "Training plan offering tpo-1 is not available",
            ),
        )
        .build();
    let err = sagemaker(&[&rule], false)
        .purchase_plan(&plan_offering(), &spec())
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::OfferingGone { .. }), "{err:?}");
    assert_eq!(err.code(), Some("ResourceNotFound"));
}

#[tokio::test]
async fn sagemakers_not_found_validation_exception_is_none_and_other_validation_errors_fail() {
    let rule = mock!(aws_sdk_sagemaker::Client::describe_training_job)
        .sequence()
        .http_status(
            400,
            json_error("ValidationException", "Requested resource not found."),
        )
        .http_status(
            400,
            json_error("ValidationException", "1 validation error detected"),
        )
        .build();
    let adapter = sagemaker(&[&rule], false);
    assert_eq!(
        adapter.describe_training_job(REGION, "job").await.unwrap(),
        None
    );
    let err = adapter
        .describe_training_job(REGION, "job")
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::Permanent { .. }), "{err:?}");
    assert_eq!(err.code(), Some("ValidationException"));
}

#[tokio::test]
async fn deleting_a_missing_endpoint_and_config_succeeds() {
    let ep = mock!(aws_sdk_sagemaker::Client::delete_endpoint)
        .sequence()
        .http_status(
            400,
            json_error(
                "ValidationException",
                "Could not find endpoint \\\"arn:aws:sagemaker:us-east-1:1:endpoint/e\\\".",
            ),
        )
        .build();
    let cfg = mock!(aws_sdk_sagemaker::Client::delete_endpoint_config)
        .sequence()
        .http_status(
            400,
            json_error(
                "ValidationException",
                "Could not find endpoint configuration \\\"c\\\".",
            ),
        )
        .build();
    sagemaker(&[&ep, &cfg], false)
        .delete_endpoint(REGION, "e", "c")
        .await
        .unwrap();
    assert_eq!((ep.num_calls(), cfg.num_calls()), (1, 1));
}

#[tokio::test]
async fn stopping_a_job_that_already_finished_succeeds() {
    let rule = mock!(aws_sdk_sagemaker::Client::stop_training_job)
        .sequence()
        .http_status(
            400,
            json_error(
                "ValidationException",
                "The request was rejected because the training job is in status Completed.",
            ),
        )
        .build();
    sagemaker(&[&rule], false)
        .stop_training_job(REGION, "job")
        .await
        .unwrap();
}

#[tokio::test]
async fn an_instance_group_reports_counts_and_whether_its_cluster_is_ours() {
    let describe = mock!(aws_sdk_sagemaker::Client::describe_cluster).then_output(|| {
        DescribeClusterOutput::builder()
            .cluster_arn("arn:aws:sagemaker:us-east-1:1:cluster/abc")
            .cluster_name("c")
            .instance_groups(
                ClusterInstanceGroupDetails::builder()
                    .instance_group_name("g")
                    .current_count(2)
                    .target_count(4)
                    .status("Updating".into())
                    .build(),
            )
            .build()
    });
    let tags = mock!(aws_sdk_sagemaker::Client::list_tags).then_output(|| {
        ListTagsOutput::builder()
            .tags(
                aws_sdk_sagemaker::types::Tag::builder()
                    .key(MANAGED_TAG)
                    .value("true")
                    .build(),
            )
            .build()
    });
    let adapter = sagemaker(&[&describe, &tags], false);
    let g = adapter
        .describe_instance_group(REGION, "c", "g")
        .await
        .unwrap()
        .unwrap();
    assert!(g.cluster_managed);
    assert_eq!(g.instance_group_name.as_deref(), Some("g"));
    assert_eq!((g.current_count, g.target_count), (2, 4));
    assert_eq!(g.status, "Updating");
    let other = adapter
        .describe_instance_group(REGION, "c", "missing")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(other.instance_group_name, None);
}

#[tokio::test]
async fn a_cluster_is_ours_only_when_its_managed_tag_is_true() {
    for (value, ours) in [
        ("true", true),
        ("True", false),
        ("yes", false),
        ("false", false),
    ] {
        let describe = mock!(aws_sdk_sagemaker::Client::describe_cluster).then_output(|| {
            DescribeClusterOutput::builder()
                .cluster_arn("arn:aws:sagemaker:us-east-1:1:cluster/abc")
                .cluster_name("c")
                .build()
        });
        let tags = mock!(aws_sdk_sagemaker::Client::list_tags).then_output(move || {
            ListTagsOutput::builder()
                .tags(
                    aws_sdk_sagemaker::types::Tag::builder()
                        .key(MANAGED_TAG)
                        .value(value)
                        .build(),
                )
                .build()
        });
        let g = sagemaker(&[&describe, &tags], false)
            .describe_instance_group(REGION, "c", "g")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(g.cluster_managed, ours, "capacity-pilot:managed={value}");
    }
}

#[test]
fn every_capacity_reservation_state_is_known_and_only_the_final_ones_are_not_live() {
    use super::ec2::reservation_state;
    use crate::domain::reservation::ReservationState;
    // GIVEN the 13 values of CapacityReservationState (botocore's ec2 model, aws-reference
    // §11.1), and ARCHITECTURE §8.5's final ones
    let all = [
        "active",
        "expired",
        "cancelled",
        "pending",
        "failed",
        "scheduled",
        "payment-pending",
        "payment-failed",
        "assessing",
        "delayed",
        "unsupported",
        "unavailable",
        "cancelling",
    ];
    let finals = [
        "expired",
        "cancelled",
        "failed",
        "payment-failed",
        "unsupported",
    ];
    for s in all {
        // WHEN the adapter maps it
        let state = reservation_state(s);
        // THEN it is one the domain knows, and live unless final
        assert_ne!(state, ReservationState::Unknown, "{s}");
        assert_eq!(state.is_live(), !finals.contains(&s), "{s}");
        assert_eq!(state.to_string(), s, "round-trips to EC2's spelling");
    }
    // AND a state no model lists yet counts as live: never bought again, never refunded
    assert!(reservation_state("some-new-state").is_live());
}

/// A cluster with a group of another team's (its own role and settings) and, when
/// `ours_at` is given, our group `finetune` at that count on plan `plan-1`.
fn two_groups(ours_at: Option<i32>) -> Rule {
    use aws_sdk_sagemaker::types::{
        ClusterInstanceStorageConfig, ClusterKubernetesConfigDetails, DeepHealthCheckType,
        VpcConfig,
    };
    mock!(aws_sdk_sagemaker::Client::describe_cluster).then_output(move || {
        let other = ClusterInstanceGroupDetails::builder()
            .instance_group_name("controller")
            .instance_type("ml.m5.xlarge".into())
            .target_count(1)
            .min_count(1)
            .execution_role("arn:aws:iam::1:role/theirs")
            .threads_per_core(1)
            .instance_storage_configs(ClusterInstanceStorageConfig::EbsVolumeConfig(
                aws_sdk_sagemaker::types::ClusterEbsVolumeConfig::builder()
                    .volume_size_in_gb(500)
                    .build(),
            ))
            .on_start_deep_health_checks(DeepHealthCheckType::InstanceStress)
            .override_vpc_config(
                VpcConfig::builder()
                    .security_group_ids("sg-1")
                    .subnets("subnet-1")
                    .build(),
            )
            .current_image_id("ami-old")
            .desired_image_id("ami-new")
            .kubernetes_config(
                ClusterKubernetesConfigDetails::builder()
                    .current_labels("team", "infra")
                    .build(),
            )
            .life_cycle_config(
                aws_sdk_sagemaker::types::ClusterLifeCycleConfig::builder()
                    .source_s3_uri("s3://theirs/")
                    .on_create("on_create.sh")
                    .build(),
            )
            .build();
        let mut out = DescribeClusterOutput::builder()
            .cluster_arn("arn:aws:sagemaker:us-east-1:1:cluster/abc")
            .cluster_name("c")
            .instance_groups(other);
        if let Some(n) = ours_at {
            out = out.instance_groups(
                ClusterInstanceGroupDetails::builder()
                    .instance_group_name("finetune")
                    .instance_type("ml.p5.48xlarge".into())
                    .target_count(n)
                    .execution_role("arn:aws:iam::1:role/ours-then")
                    .training_plan_arn("plan-1")
                    .build(),
            );
        }
        out.build()
    })
}

fn group_spec(count: u32) -> crate::ports::InstanceGroupSpec {
    crate::ports::InstanceGroupSpec {
        region: REGION.into(),
        cluster_name: "c".into(),
        instance_group_name: "finetune".into(),
        instance_type: "ml.p5.48xlarge".into(),
        instance_count: count,
        training_plan_arn: Some("plan-1".into()),
        execution_role_arn: "arn:aws:iam::1:role/ours".into(),
        life_cycle_source_s3_uri: Some("s3://ours/".into()),
        life_cycle_on_create: Some("on_create.sh".into()),
    }
}

#[tokio::test]
async fn update_cluster_sends_every_group_back_with_its_own_settings_and_changes_only_ours() {
    let update = mock!(aws_sdk_sagemaker::Client::update_cluster)
        .match_requests(|r| {
            let groups = r.instance_groups();
            let other = groups
                .iter()
                .find(|g| g.instance_group_name() == Some("controller"));
            let ours = groups
                .iter()
                .find(|g| g.instance_group_name() == Some("finetune"));
            let (Some(other), Some(ours)) = (other, ours) else {
                return false;
            };
            groups.len() == 2
                // theirs, as described, under the update's names
                && other.execution_role() == Some("arn:aws:iam::1:role/theirs")
                && other.instance_count() == Some(1)
                && other.min_instance_count() == Some(1)
                && other.threads_per_core() == Some(1)
                && other.instance_storage_configs().len() == 1
                && other.on_start_deep_health_checks().len() == 1
                && other.override_vpc_config().is_some()
                && other.image_id() == Some("ami-new")
                && other
                    .kubernetes_config()
                    .and_then(|k| k.labels())
                    .and_then(|l| l.get("team"))
                    .map(String::as_str)
                    == Some("infra")
                && other.life_cycle_config().and_then(|l| l.source_s3_uri()) == Some("s3://theirs/")
                && other.training_plan_arn().is_none()
                // ours: the count changes, its own role stays
                && ours.instance_count() == Some(0)
                && ours.training_plan_arn() == Some("plan-1")
                && ours.execution_role() == Some("arn:aws:iam::1:role/ours-then")
        })
        .then_output(|| {
            aws_sdk_sagemaker::operation::update_cluster::UpdateClusterOutput::builder()
                .cluster_arn("arn:aws:sagemaker:us-east-1:1:cluster/abc")
                .build()
        });
    let describe = two_groups(Some(2));

    sagemaker(&[&describe, &update], false)
        .put_instance_group(&group_spec(0))
        .await
        .unwrap();

    assert_eq!(update.num_calls(), 1, "one UpdateCluster, matching");
    assert!(super::hyperpod_update::UNMAPPED.is_empty());
}

#[tokio::test]
async fn a_new_group_is_added_beside_the_others_and_an_update_already_done_is_not_sent_again() {
    let update = mock!(aws_sdk_sagemaker::Client::update_cluster)
        .match_requests(|r| {
            let groups = r.instance_groups();
            groups.len() == 2
                && groups.iter().any(|g| {
                    g.instance_group_name() == Some("finetune")
                        && g.instance_count() == Some(2)
                        && g.execution_role() == Some("arn:aws:iam::1:role/ours")
                        && g.life_cycle_config().and_then(|l| l.source_s3_uri())
                            == Some("s3://ours/")
                })
        })
        .then_output(|| {
            aws_sdk_sagemaker::operation::update_cluster::UpdateClusterOutput::builder()
                .cluster_arn("arn:aws:sagemaker:us-east-1:1:cluster/abc")
                .build()
        });
    let without = two_groups(None);
    sagemaker(&[&without, &update], false)
        .put_instance_group(&group_spec(2))
        .await
        .unwrap();
    assert_eq!(update.num_calls(), 1);

    // AND when the group already is at its count on the plan (an update whose answer was
    // lost went through), nothing is sent
    let done = two_groups(Some(2));
    let never = mock!(aws_sdk_sagemaker::Client::update_cluster).then_output(|| {
        aws_sdk_sagemaker::operation::update_cluster::UpdateClusterOutput::builder()
            .cluster_arn("x")
            .build()
    });
    sagemaker(&[&done, &never], false)
        .put_instance_group(&group_spec(2))
        .await
        .unwrap();
    assert_eq!(never.num_calls(), 0);
}

#[tokio::test]
async fn a_group_is_removed_with_instance_groups_to_delete_and_the_others_sent_back() {
    // GIVEN a cluster with the controller group and ours
    let update = mock!(aws_sdk_sagemaker::Client::update_cluster)
        .match_requests(|r| {
            r.instance_groups_to_delete() == ["finetune"]
                && r.instance_groups().len() == 1
                && r.instance_groups()[0].instance_group_name() == Some("controller")
                && r.instance_groups()[0].instance_count() == Some(1)
        })
        .then_output(|| {
            aws_sdk_sagemaker::operation::update_cluster::UpdateClusterOutput::builder()
                .cluster_arn("arn:aws:sagemaker:us-east-1:1:cluster/abc")
                .build()
        });
    let with = two_groups(Some(0));
    // WHEN ours is removed
    let removed = sagemaker(&[&with, &update], false)
        .remove_instance_group(REGION, "research", "finetune")
        .await
        .unwrap();
    // THEN one UpdateCluster names it to delete and sends only the other back
    assert!(removed);
    assert_eq!(update.num_calls(), 1, "one UpdateCluster, matching");

    // AND when the cluster has no such group (removed by a call whose answer was lost),
    // nothing is sent
    let without = two_groups(None);
    let never = mock!(aws_sdk_sagemaker::Client::update_cluster).then_output(|| {
        aws_sdk_sagemaker::operation::update_cluster::UpdateClusterOutput::builder()
            .cluster_arn("x")
            .build()
    });
    let removed = sagemaker(&[&without, &never], false)
        .remove_instance_group(REGION, "research", "finetune")
        .await
        .unwrap();
    assert!(!removed);
    assert_eq!(never.num_calls(), 0);
}

/// A DynamoDB store whose client answers from `rules`, without retries.
fn dynamo(rules: &[&Rule]) -> super::dynamodb::DynamoStore {
    let mut interceptor =
        aws_smithy_mocks::MockResponseInterceptor::new().rule_mode(RuleMode::MatchAny);
    for r in rules {
        interceptor = interceptor.with_rule(r);
    }
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new(REGION))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "AKID", "SECRET", None, None, "test",
        ))
        .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled())
        .http_client(aws_smithy_mocks::create_mock_http_client())
        .interceptor(interceptor)
        .build();
    super::dynamodb::DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(conf), "state")
}

#[tokio::test]
async fn a_conditional_update_refused_for_another_reason_is_an_error_not_a_condition_not_met() {
    use crate::ports::Store;
    // A condition not met: the outbox item is already archived, nothing to mark.
    let unmet = mock!(aws_sdk_dynamodb::Client::update_item)
        .sequence()
        .http_status(
            400,
            json_error(
                "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
                "The conditional request failed",
            ),
        )
        .build();
    dynamo(&[&unmet])
        .mark_sent("r1", "r1:accepted")
        .await
        .unwrap();
    // Throttled: surfaced, never read as a condition not met (the item would stay unsent
    // or, for an upgrade, keep its TTL, with no one told).
    let throttled = mock!(aws_sdk_dynamodb::Client::update_item)
        .sequence()
        .http_status(
            400,
            json_error(
                "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                "Rate exceeded",
            ),
        )
        .build();
    let err = dynamo(&[&throttled])
        .mark_sent("r1", "r1:accepted")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("ProvisionedThroughputExceeded"),
        "{err}"
    );
}

fn plan_arn(name: &str) -> String {
    format!("arn:aws:sagemaker:us-east-1:1:training-plan/{name}")
}

/// DescribeTrainingPlan answering with an active training-job plan named `name`.
fn described_plan(name: &str) -> Rule {
    use aws_sdk_sagemaker::operation::describe_training_plan::DescribeTrainingPlanOutput;
    let name = name.to_string();
    mock!(aws_sdk_sagemaker::Client::describe_training_plan).then_output(move || {
        DescribeTrainingPlanOutput::builder()
            .training_plan_arn(plan_arn(&name))
            .training_plan_name(&name)
            .status("Active".into())
            .target_resources("training-job".into())
            .upfront_fee("1000.00")
            .currency_code("USD")
            .build()
    })
}

/// ListTrainingPlans listing nothing.
fn no_listed_plans() -> Rule {
    use aws_sdk_sagemaker::operation::list_training_plans::ListTrainingPlansOutput;
    mock!(aws_sdk_sagemaker::Client::list_training_plans)
        .then_output(|| ListTrainingPlansOutput::builder().build())
}

#[tokio::test]
async fn a_plan_described_under_another_name_is_not_taken_for_the_requests() {
    // GIVEN SageMaker answering DescribeTrainingPlan for request r-a's name with r-A's plan
    // (names that differ only in case, were SageMaker to fold them: review N15)
    let id = RequestId::parse("r-a").unwrap();
    let ours = "cp-0123456789-r-a";
    let (describe, list) = (described_plan("cp-0123456789-r-A"), no_listed_plans());
    // WHEN the request's plans are read
    let found = sagemaker(&[&describe, &list], false)
        .plans_for_request(REGION, &id, ours)
        .await
        .unwrap();
    // THEN it is not adopted, nor stamped with r-a's tag
    assert!(found.is_empty(), "{found:?}");
}

/// A Capacity Block reservation as EC2 lists it, tagged for `request` and `deployment`.
fn listed_block(
    id: &str,
    request: &str,
    deployment: &str,
) -> aws_sdk_ec2::types::CapacityReservation {
    use aws_sdk_ec2::types::{CapacityReservation, CapacityReservationState, Tag};
    let start = Utc.with_ymd_and_hms(2026, 12, 10, 11, 30, 0).unwrap();
    CapacityReservation::builder()
        .capacity_reservation_id(id)
        .instance_type("p5.48xlarge")
        .total_instance_count(2)
        .start_date(aws_smithy_types::DateTime::from_secs(start.timestamp()))
        .end_date(aws_smithy_types::DateTime::from_secs(
            start.timestamp() + 86_400,
        ))
        .state(CapacityReservationState::Scheduled)
        .reservation_type("capacity-block".into())
        .tags(
            Tag::builder()
                .key(crate::domain::naming::REQUEST_TAG)
                .value(request)
                .build(),
        )
        .tags(
            Tag::builder()
                .key(crate::domain::naming::DEPLOYMENT_TAG)
                .value(deployment)
                .build(),
        )
        .build()
}

#[tokio::test]
async fn an_adopted_block_is_an_ultraserver_by_its_capacity_block_not_its_instance_type() {
    use aws_sdk_ec2::operation::describe_capacity_blocks::DescribeCapacityBlocksOutput;
    use aws_sdk_ec2::types::CapacityBlock;
    // GIVEN a request's two blocks, both of p6e-gb200.36xlarge instances (never a `u-`
    // name), one in an UltraServer block
    let listing = mock!(aws_sdk_ec2::Client::describe_capacity_reservations).then_output(|| {
        let mut ultra = listed_block("cr-1", "r1", "dep-a");
        ultra.instance_type = Some("p6e-gb200.36xlarge".into());
        ultra.capacity_block_id = Some("cb-1".into());
        let mut plain = listed_block("cr-2", "r1", "dep-a");
        plain.instance_type = Some("p6e-gb200.36xlarge".into());
        plain.capacity_block_id = Some("cb-2".into());
        DescribeCapacityReservationsOutput::builder()
            .capacity_reservations(ultra)
            .capacity_reservations(plain)
            .build()
    });
    let blocks = mock!(aws_sdk_ec2::Client::describe_capacity_blocks)
        .match_requests(|r| r.capacity_block_ids() == ["cb-1", "cb-2"])
        .then_output(|| {
            DescribeCapacityBlocksOutput::builder()
                .capacity_blocks(
                    CapacityBlock::builder()
                        .capacity_block_id("cb-1")
                        .ultraserver_type("u-p6e-gb200x72")
                        .capacity_reservation_ids("cr-1")
                        .build(),
                )
                .capacity_blocks(
                    CapacityBlock::builder()
                        .capacity_block_id("cb-2")
                        .capacity_reservation_ids("cr-2")
                        .build(),
                )
                .build()
        });
    // WHEN they are read, as a purchase whose answer was lost adopts them
    let id = RequestId::parse("r1").unwrap();
    let found = ec2(&[&listing, &blocks], false)
        .reservations_for_request(REGION, &id)
        .await
        .unwrap();
    // THEN the one in the UltraServer block is typed so (before the fix: neither was, so its
    // windows drained at the ordinary lead, past the UltraServer's forced termination)
    let ultra: Vec<(&str, bool)> = found
        .iter()
        .map(|r| (r.id.as_str(), r.ultraserver))
        .collect();
    assert_eq!(ultra, [("cr-1", true), ("cr-2", false)]);
    assert_eq!(blocks.num_calls(), 1);
}

#[tokio::test]
async fn a_refused_tag_filter_falls_back_to_the_state_filter_and_matches_the_tag_here() {
    // GIVEN EC2 refusing the tag filter, then listing by state two live blocks of two requests
    // (and of two deployments)
    let rule = mock!(aws_sdk_ec2::Client::describe_capacity_reservations)
        .sequence()
        .http_status(
            400,
            ec2_error(
                "InvalidParameterValue",
                "The filter 'tag:capacity-pilot:request-id' is invalid",
            ),
        )
        .output(|| {
            DescribeCapacityReservationsOutput::builder()
                .capacity_reservations(listed_block("cr-1", "r1", "dep-a"))
                .capacity_reservations(listed_block("cr-2", "r2", "dep-b"))
                .build()
        })
        .times(2)
        .build();
    let adapter = ec2(&[&rule], false);
    // WHEN a request's blocks are read
    let id = RequestId::parse("r1").unwrap();
    let mine = adapter.reservations_for_request(REGION, &id).await.unwrap();
    // THEN only its own are returned, from the state listing
    assert_eq!(
        mine.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["cr-1"]
    );
    assert_eq!(rule.num_calls(), 2);
}

#[tokio::test]
async fn a_refused_tag_filter_falls_back_for_the_deployments_blocks_too() {
    let rule = mock!(aws_sdk_ec2::Client::describe_capacity_reservations)
        .sequence()
        .http_status(400, ec2_error("InvalidFilter", "The filter is invalid"))
        .output(|| {
            DescribeCapacityReservationsOutput::builder()
                .capacity_reservations(listed_block("cr-1", "r1", "dep-a"))
                .capacity_reservations(listed_block("cr-2", "r2", "dep-b"))
                .build()
        })
        .build();
    let ours = ec2(&[&rule], false)
        .reservations_of_deployment(REGION, "dep-b")
        .await
        .unwrap();
    assert_eq!(
        ours.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["cr-2"]
    );
}

#[tokio::test]
async fn another_refusal_of_the_tag_filtered_listing_is_an_error_not_a_fallback() {
    // GIVEN EC2 refusing the call itself (not the filter), then answering a second call
    let rule = mock!(aws_sdk_ec2::Client::describe_capacity_reservations)
        .sequence()
        .http_status(
            403,
            ec2_error("UnauthorizedOperation", "You are not authorized"),
        )
        .output(|| {
            DescribeCapacityReservationsOutput::builder()
                .capacity_reservations(listed_block("cr-1", "r1", "dep-a"))
                .build()
        })
        .build();
    let adapter = ec2(&[&rule], false);
    let id = RequestId::parse("r1").unwrap();
    // THEN reconciliation fails (it must not read "nothing bought" from another listing)
    let err = adapter
        .reservations_for_request(REGION, &id)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PortError::Permanent { code, .. } if code == "UnauthorizedOperation"),
        "{err:?}"
    );
    assert_eq!(rule.num_calls(), 1);
}

#[tokio::test]
async fn a_tag_filtered_listing_keeps_only_capacity_blocks() {
    let rule = mock!(aws_sdk_ec2::Client::describe_capacity_reservations).then_output(|| {
        let mut odcr = listed_block("cr-odcr", "r1", "dep-a");
        odcr.reservation_type = Some("default".into());
        DescribeCapacityReservationsOutput::builder()
            .capacity_reservations(listed_block("cr-1", "r1", "dep-a"))
            .capacity_reservations(odcr)
            .build()
    });
    let id = RequestId::parse("r1").unwrap();
    let found = ec2(&[&rule], false)
        .reservations_for_request(REGION, &id)
        .await
        .unwrap();
    assert_eq!(
        found.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["cr-1"]
    );
}

#[tokio::test]
async fn a_requests_plan_is_found_by_its_exact_name_and_tagged_for_it() {
    let id = RequestId::parse("r-a").unwrap();
    let name = crate::domain::naming::plan_name(&id, "dep-a", 0);
    let arn = plan_arn(&name);
    let (describe, list) = (described_plan(&name), no_listed_plans());
    let found = sagemaker(&[&describe, &list], false)
        .plans_for_request(REGION, &id, &name)
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].id, arn);
    assert_eq!(found[0].request_tag.as_deref(), Some("r-a"));
}

#[tokio::test]
async fn the_deployments_plans_are_those_named_with_its_hash() {
    use aws_sdk_sagemaker::operation::list_training_plans::ListTrainingPlansOutput;
    use aws_sdk_sagemaker::types::TrainingPlanSummary;
    let summary = |request: &str, deployment: &str| {
        let name =
            crate::domain::naming::plan_name(&RequestId::parse(request).unwrap(), deployment, 0);
        TrainingPlanSummary::builder()
            .training_plan_arn(format!(
                "arn:aws:sagemaker:us-east-1:1:training-plan/{name}"
            ))
            .training_plan_name(name)
            .status("Active".into())
            .target_resources("training-job".into())
            .upfront_fee("1000.00")
            .currency_code("USD")
            .build()
    };
    let list = mock!(aws_sdk_sagemaker::Client::list_training_plans).then_output(move || {
        ListTrainingPlansOutput::builder()
            .training_plan_summaries(summary("r-1", "dep-a"))
            .training_plan_summaries(summary("r-2", "dep-b"))
            .build()
    });
    let ours = sagemaker(&[&list], false)
        .plans_of_deployment(REGION, "dep-a")
        .await
        .unwrap();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(ours[0].request_tag.as_deref(), Some("r-1"));
    assert_eq!(ours[0].deployment_tag.as_deref(), Some("dep-a"));
}

#[tokio::test]
async fn a_plan_named_before_names_were_lower_cased_is_still_found_for_its_request() {
    use aws_sdk_sagemaker::operation::list_training_plans::ListTrainingPlansOutput;
    use aws_sdk_sagemaker::types::TrainingPlanSummary;
    // GIVEN request Eval-7's plan, bought in doubt before the upgrade under the id as given;
    // SageMaker, folding case, describes it for the lower-cased name asked now
    let id = RequestId::parse("Eval-7").unwrap();
    let name = crate::domain::naming::plan_name(&id, "dep-a", 0);
    let hash = crate::domain::naming::deployment_hash("dep-a");
    let before = format!("cp-{hash}-Eval-7");
    assert_ne!(name, before);
    let describe = described_plan(&before);
    let listed = before.clone();
    let list = mock!(aws_sdk_sagemaker::Client::list_training_plans).then_output(move || {
        ListTrainingPlansOutput::builder()
            .training_plan_summaries(
                TrainingPlanSummary::builder()
                    .training_plan_arn(plan_arn(&listed))
                    .training_plan_name(&listed)
                    .status("Active".into())
                    .target_resources("training-job".into())
                    .upfront_fee("1000.00")
                    .currency_code("USD")
                    .build(),
            )
            .build()
    });

    // WHEN the request's plans are read by its new name
    let found = sagemaker(&[&describe, &list], false)
        .plans_for_request(REGION, &id, &name)
        .await
        .unwrap();

    // THEN the old-named plan is the request's, once (review N15: no purchase in doubt across
    // the upgrade is bought again)
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].id, plan_arn(&before));
    assert_eq!(found[0].request_tag.as_deref(), Some("Eval-7"));
}

// ---- CreateEndpoint after CreateEndpointConfig (issue 50, review aws-reality-2 Task 3 #1) --

fn endpoint_spec() -> crate::ports::EndpointSpec {
    crate::ports::EndpointSpec {
        region: REGION.into(),
        endpoint_name: "ep".into(),
        endpoint_config_name: "cp-req-1-s0".into(),
        model_name: "m".into(),
        variant_name: "v".into(),
        instance_type: "ml.p5.48xlarge".into(),
        instance_count: 1,
        ml_reservation_arn: Some(
            "arn:aws:sagemaker:us-east-1:123456789012:training-plan/cp-req-1".into(),
        ),
        tags: BTreeMap::new(),
    }
}

fn endpoint_config_created() -> Rule {
    use aws_sdk_sagemaker::operation::create_endpoint_config::CreateEndpointConfigOutput;
    mock!(aws_sdk_sagemaker::Client::create_endpoint_config).then_output(|| {
        CreateEndpointConfigOutput::builder()
            .endpoint_config_arn("arn:aws:sagemaker:us-east-1:1:endpoint-config/cp-req-1-s0")
            .build()
    })
}

const CONFIG_NOT_FOUND: &str = "Could not find endpoint configuration \\\"arn:aws:sagemaker:us-east-1:1:endpoint-config/cp-req-1-s0\\\".";

#[tokio::test]
async fn the_endpoint_config_is_described_before_the_endpoint_is_created_and_waited_for_if_unseen()
{
    // GIVEN DescribeEndpointConfig does not see the config just created yet
    let config = endpoint_config_created();
    let describe = mock!(aws_sdk_sagemaker::Client::describe_endpoint_config)
        .sequence()
        .http_status(400, json_error("ValidationException", CONFIG_NOT_FOUND))
        .build();
    let create = mock!(aws_sdk_sagemaker::Client::create_endpoint).then_output(|| {
        aws_sdk_sagemaker::operation::create_endpoint::CreateEndpointOutput::builder()
            .endpoint_arn("arn:aws:sagemaker:us-east-1:1:endpoint/ep")
            .build()
    });
    let adapter = sagemaker(&[&config, &describe, &create], false);

    // WHEN the endpoint is created
    let res = adapter.create_endpoint(&endpoint_spec()).await;

    // THEN no CreateEndpoint is sent (AWS recommends DescribeEndpointConfig first), and the
    // answer says the config is not visible yet: no error, a later call creates it
    assert!(format!("{res:?}").contains("ConfigNotVisible"), "{res:?}");
    assert_eq!(
        (config.num_calls(), describe.num_calls(), create.num_calls()),
        (1, 1, 0)
    );
}

#[tokio::test]
async fn create_endpoints_validation_exception_for_a_config_not_visible_yet_is_not_a_refusal() {
    // GIVEN the config is described, but CreateEndpoint's own look-up still misses it: the
    // documented "validation error" ("So retry logic is recommended")
    use aws_sdk_sagemaker::operation::describe_endpoint_config::DescribeEndpointConfigOutput;
    let config = endpoint_config_created();
    let describe = mock!(aws_sdk_sagemaker::Client::describe_endpoint_config).then_output(|| {
        DescribeEndpointConfigOutput::builder()
            .endpoint_config_name("cp-req-1-s0")
            .endpoint_config_arn("arn:aws:sagemaker:us-east-1:1:endpoint-config/cp-req-1-s0")
            .creation_time(aws_smithy_types::DateTime::from_secs(1_796_000_000))
            .build()
    });
    let create = mock!(aws_sdk_sagemaker::Client::create_endpoint)
        .sequence()
        .http_status(400, json_error("ValidationException", CONFIG_NOT_FOUND))
        .http_status(
            400,
            json_error("ValidationException", "1 validation error detected"),
        )
        .build();
    let adapter = sagemaker(&[&config, &describe, &create], false);

    // WHEN the endpoint is created
    let res = adapter.create_endpoint(&endpoint_spec()).await;

    // THEN it is not visible yet, never a Permanent refusal that fails the request
    assert!(format!("{res:?}").contains("ConfigNotVisible"), "{res:?}");
    // AND any other validation error is still a refusal
    let err = adapter.create_endpoint(&endpoint_spec()).await.unwrap_err();
    assert!(matches!(err, PortError::Permanent { .. }), "{err:?}");
}

#[test]
fn scheduled_events_are_read_from_the_status_with_their_start_and_none_that_are_done() {
    use aws_sdk_ec2::types::{EventCode, InstanceStatus, InstanceStatusEvent};
    let at = Utc.with_ymd_and_hms(2026, 12, 10, 6, 0, 0).unwrap();
    let event = |code: EventCode, description: &str, from: Option<i64>| {
        InstanceStatusEvent::builder()
            .code(code)
            .description(description)
            .set_not_before(from.map(aws_smithy_types::DateTime::from_secs))
            .build()
    };
    let status = InstanceStatus::builder()
        .instance_id("i-1")
        .events(event(
            EventCode::InstanceRetirement,
            "The instance is running on degraded hardware",
            Some(at.timestamp()),
        ))
        .events(event(
            EventCode::SystemReboot,
            "[Completed] scheduled reboot",
            Some(at.timestamp()),
        ))
        .events(event(EventCode::InstanceStop, "no start given", None))
        .build();
    let read = crate::aws::ec2::scheduled_of(&status);
    assert_eq!(
        read,
        [crate::ports::ScheduledChange {
            code: "instance-retirement".into(),
            not_before: at,
        }]
    );
    assert!(read[0].takes_instance());
}

/// A cluster with the other team's controller group at `controller` instances and our group
/// at 2 on plan-1.
fn cluster_view(
    controller: i32,
) -> aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput {
    use aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput;
    DescribeClusterOutput::builder()
        .cluster_arn("arn:aws:sagemaker:us-east-1:1:cluster/abc")
        .cluster_name("c")
        .instance_groups(
            ClusterInstanceGroupDetails::builder()
                .instance_group_name("controller")
                .instance_type("ml.m5.xlarge".into())
                .target_count(controller)
                .execution_role("arn:aws:iam::1:role/theirs")
                .build(),
        )
        .instance_groups(
            ClusterInstanceGroupDetails::builder()
                .instance_group_name("finetune")
                .instance_type("ml.p5.48xlarge".into())
                .target_count(2)
                .execution_role("arn:aws:iam::1:role/ours")
                .training_plan_arn("plan-1")
                .build(),
        )
        .build()
}

#[tokio::test]
async fn an_update_of_another_party_between_our_description_and_our_update_is_kept() {
    // GIVEN the other team resizing its controller group to 3 just after our first
    // description (review N10: UpdateCluster has no version to condition on)
    let describe = mock!(aws_sdk_sagemaker::Client::describe_cluster)
        .sequence()
        .output(|| cluster_view(1))
        .output(|| cluster_view(3))
        .times(2)
        .build();
    let update = mock!(aws_sdk_sagemaker::Client::update_cluster)
        .match_requests(|r| {
            r.instance_groups().iter().any(|g| {
                g.instance_group_name() == Some("controller") && g.instance_count() == Some(3)
            }) && r.instance_groups().iter().any(|g| {
                g.instance_group_name() == Some("finetune") && g.instance_count() == Some(0)
            })
        })
        .then_output(|| {
            aws_sdk_sagemaker::operation::update_cluster::UpdateClusterOutput::builder()
                .cluster_arn("arn:aws:sagemaker:us-east-1:1:cluster/abc")
                .build()
        });

    // WHEN our group is scaled to zero
    sagemaker(&[&describe, &update], false)
        .put_instance_group(&group_spec(0))
        .await
        .unwrap();

    // THEN the update sent keeps their controller at 3, described again before sending
    assert_eq!(
        update.num_calls(),
        1,
        "one UpdateCluster, built from what the cluster is now"
    );
    assert_eq!(describe.num_calls(), 3);
}

#[tokio::test]
async fn a_cluster_that_keeps_changing_is_not_updated_now_but_later() {
    let describe = mock!(aws_sdk_sagemaker::Client::describe_cluster)
        .sequence()
        .output(|| cluster_view(1))
        .output(|| cluster_view(2))
        .output(|| cluster_view(3))
        .build();
    let update = mock!(aws_sdk_sagemaker::Client::update_cluster).then_output(|| {
        aws_sdk_sagemaker::operation::update_cluster::UpdateClusterOutput::builder().build()
    });
    let err = sagemaker(&[&describe, &update], false)
        .put_instance_group(&group_spec(0))
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::Transient { .. }), "{err:?}");
    assert_eq!(update.num_calls(), 0);
}

#[tokio::test]
async fn an_ultraserver_block_offering_is_never_taken_for_an_instance_block() {
    use aws_sdk_ec2::operation::describe_capacity_block_offerings::DescribeCapacityBlockOfferingsOutput;
    use aws_sdk_ec2::types::CapacityBlockOffering;
    let start = Utc.with_ymd_and_hms(2026, 12, 10, 11, 30, 0).unwrap();
    let offering = move |id: &str, ultra: Option<&str>| {
        CapacityBlockOffering::builder()
            .capacity_block_offering_id(id)
            .instance_type("p6e-gb200.36xlarge")
            .availability_zone("us-east-1a")
            .instance_count(18)
            .start_date(aws_smithy_types::DateTime::from_secs(start.timestamp()))
            .end_date(aws_smithy_types::DateTime::from_secs(
                start.timestamp() + 86_400,
            ))
            .upfront_fee("90000.00")
            .currency_code("USD")
            .set_ultraserver_type(ultra.map(str::to_string))
            .build()
    };
    let rule =
        mock!(aws_sdk_ec2::Client::describe_capacity_block_offerings).then_output(move || {
            DescribeCapacityBlockOfferingsOutput::builder()
                .capacity_block_offerings(offering("cb-ultra", Some("u-p6e-gb200x72")))
                .capacity_block_offerings(offering("cb-plain", None))
                .build()
        });
    let q = crate::ports::OfferingQuery {
        region: REGION.into(),
        instance_type: "p6e-gb200.36xlarge".into(),
        instance_count: 18,
        duration_hours: 24,
        start_from: start - chrono::Duration::days(1),
        end_by: start + chrono::Duration::days(3),
        product: crate::domain::offering::Product::CapacityBlock,
    };
    let found = ec2(&[&rule], false).search_blocks(&q).await.unwrap();
    let ids: Vec<&str> = found.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(ids, ["cb-plain"]);
}

fn extension_offer() -> crate::domain::extension::ExtensionOffer {
    let end = Utc.with_ymd_and_hms(2026, 12, 9, 11, 30, 0).unwrap();
    crate::domain::extension::ExtensionOffer {
        offering_id: "cbe-0123456789abcdefg".into(),
        hours: 24,
        starts_at: end,
        ends_at: end + chrono::Duration::hours(24),
        fee: Usd::parse("1661.18").unwrap(),
    }
}

/// ARCHITECTURE §8.11, §9.3: an extension's purchase has no idempotency token either, so the
/// SDK never retries it: a lost answer is `OutcomeUnknown`, settled from the history.
#[tokio::test]
async fn an_extension_purchase_whose_answer_is_lost_is_outcome_unknown_and_sent_once() {
    let rule = mock!(aws_sdk_ec2::Client::purchase_capacity_block_extension)
        .sequence()
        .http_status(
            500,
            ec2_error("InternalError", "An internal error has occurred"),
        )
        .times(3)
        .build();
    let err = ec2(&[&rule], true)
        .extend_block(REGION, "cr-0123456789abcdef0", &extension_offer())
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::OutcomeUnknown { .. }), "{err:?}");
    assert_eq!(rule.num_calls(), 1, "the SDK must not retry an extension");

    let rule = mock!(aws_sdk_sagemaker::Client::extend_training_plan)
        .sequence()
        .http_status(500, json_error("InternalFailure", "oops"))
        .times(3)
        .build();
    let offer = crate::domain::extension::ExtensionOffer {
        offering_id: "tpeo-0123456789abcdefg".into(),
        ..extension_offer()
    };
    let err = sagemaker(&[&rule], true)
        .extend_plan(REGION, &offer)
        .await
        .unwrap_err();
    assert!(matches!(err, PortError::OutcomeUnknown { .. }), "{err:?}");
    assert_eq!(rule.num_calls(), 1, "the SDK must not retry an extension");
}
