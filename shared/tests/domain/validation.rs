//! One test per validation rule, each asserting the field named. A request starts valid
//! and each test breaks one thing (or several, to show every problem is reported).

use capacity_pilot::domain::catalog::SupportedInstanceTypes;
use capacity_pilot::domain::offering::{Product, TargetResource};
use capacity_pilot::domain::request::{
    CapacityRequest, FieldError, Strategy, ValidationContext, parse_request,
};
use chrono::{DateTime, TimeZone, Utc};
use serde_json::{Value, json};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
}

fn regions() -> Vec<String> {
    vec!["us-east-1".into(), "us-east-2".into(), "us-west-2".into()]
}

fn parse(v: &Value) -> Result<CapacityRequest, Vec<FieldError>> {
    let types = SupportedInstanceTypes::default();
    let regions = regions();
    parse_request(
        v,
        &ValidationContext {
            now: now(),
            instance_types: &types,
            allowed_regions: &regions,
        },
    )
}

fn ec2() -> Value {
    json!({
        "schema_version": 1,
        "request_id": "loadtest-2026-12-a",
        "team": "search-ranking",
        "instance_types": ["p5.48xlarge", "p5e.48xlarge"],
        "instance_count": 4,
        "duration_hours": 48,
        "earliest_start": "2026-12-07T00:00:00Z",
        "latest_end": "2026-12-14T11:30:00Z",
        "regions": ["us-east-1", "us-east-2"],
        "allow_split": false,
        "strategy": "reserve",
        "interruptible": false,
        "budget": {"max_upfront_usd": "10000.00", "approval_above_usd": "5000"},
        "workload": {
            "kind": "ec2-instances",
            "launch_template": {"id": "lt-0abcdef1234567890", "version": "$Latest"},
            "subnet_ids": ["subnet-0123456789abcdef0"]
        },
        "drain_minutes": 20,
        "tags": {"cost-center": "cc-42"}
    })
}

fn training() -> Value {
    let mut v = ec2();
    v["instance_types"] = json!(["ml.p5.48xlarge"]);
    v["workload"] = json!({
        "kind": "training-job",
        "training_image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:1",
        "output_s3_uri": "s3://models/out"
    });
    v
}

/// The fields named by the problems, in order.
fn fields(v: &Value) -> Vec<String> {
    match parse(v) {
        Ok(_) => vec![],
        Err(problems) => problems.into_iter().map(|p| p.field).collect(),
    }
}

fn message(v: &Value, field: &str) -> String {
    parse(v)
        .unwrap_err()
        .into_iter()
        .find(|p| p.field == field)
        .unwrap_or_else(|| panic!("no problem at {field}"))
        .message
}

#[test]
fn a_valid_ec2_request_parses_with_defaults_applied() {
    let r = parse(&ec2()).expect("valid");
    assert_eq!(r.id.as_str(), "loadtest-2026-12-a");
    assert_eq!(r.instance_platform(), "Linux/UNIX");
    assert_eq!(
        r.products,
        vec![Product::CapacityBlock, Product::OnDemand],
        "spot is left out unless interruptible"
    );
    assert_eq!(r.budget.max_upfront.to_string(), "10000.00");
}

#[test]
fn a_valid_training_job_request_may_use_a_plan_for_training_jobs_or_on_demand() {
    let r = parse(&training()).expect("valid");
    assert_eq!(
        r.products,
        vec![
            Product::TrainingPlan {
                target: TargetResource::TrainingJob
            },
            Product::OnDemand
        ]
    );
}

#[test]
fn regions_default_to_the_deployments_allowed_regions() {
    let mut v = ec2();
    v.as_object_mut().unwrap().remove("regions");
    assert_eq!(parse(&v).unwrap().regions, regions());
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut v = ec2();
    v["request_id"] = json!("bad id!");
    v["instance_count"] = json!(0);
    v["budget"]["max_upfront_usd"] = json!("-5");
    v["workload"]["subnet_ids"] = json!([]);
    assert_eq!(
        fields(&v),
        [
            "request_id",
            "instance_count",
            "budget.max_upfront_usd",
            "workload.subnet_ids"
        ]
    );
}

#[test]
fn a_detail_that_is_not_an_object_is_rejected() {
    assert_eq!(fields(&json!([1, 2])), ["detail"]);
}

#[test]
fn an_unknown_schema_version_is_rejected() {
    let mut v = ec2();
    v["schema_version"] = json!(2);
    assert_eq!(fields(&v), ["schema_version"]);
}

#[test]
fn unknown_fields_are_rejected_by_name() {
    let mut v = ec2();
    v["instance_typo"] = json!(["p5.48xlarge"]);
    assert_eq!(fields(&v), ["instance_typo"]);
}

#[test]
fn missing_required_fields_are_each_named() {
    let mut v = ec2();
    let o = v.as_object_mut().unwrap();
    for f in ["team", "instance_count", "latest_end", "budget"] {
        o.remove(f);
    }
    assert_eq!(
        fields(&v),
        ["team", "instance_count", "latest_end", "budget"]
    );
}

#[test]
fn request_ids_allow_letters_digits_and_inner_hyphens_up_to_48_characters() {
    for bad in [
        "",
        "-leading",
        "trailing-",
        "has_underscore",
        "has space",
        &"a".repeat(49),
    ] {
        let mut v = ec2();
        v["request_id"] = json!(bad);
        assert_eq!(fields(&v), ["request_id"], "{bad:?}");
    }
    let mut v = ec2();
    v["request_id"] = json!("a".repeat(48));
    assert!(parse(&v).is_ok());
}

#[test]
fn team_names_are_checked_because_they_key_the_ledger() {
    let mut v = ec2();
    v["team"] = json!("team#a");
    assert_eq!(fields(&v), ["team"]);
}

#[test]
fn an_unknown_instance_type_is_rejected_with_the_supported_list() {
    let mut v = ec2();
    v["instance_types"] = json!(["p5.48xlarge", "p9.huge"]);
    assert_eq!(fields(&v), ["instance_types[1]"]);
    let m = message(&v, "instance_types[1]");
    assert!(m.contains("p9.huge") && m.contains("p5en.48xlarge"), "{m}");
}

#[test]
fn sagemaker_workloads_need_sagemaker_instance_types() {
    let mut v = training();
    v["instance_types"] = json!(["p5.48xlarge"]);
    assert_eq!(fields(&v), ["instance_types[0]"]);
    assert!(message(&v, "instance_types[0]").contains("ml.p5.48xlarge"));
}

#[test]
fn the_supported_types_come_from_configuration() {
    let mut types = SupportedInstanceTypes::default();
    types.capacity_block.push("p9.huge".into());
    let mut v = ec2();
    v["instance_types"] = json!(["p9.huge"]);
    let regions = regions();
    let ctx = ValidationContext {
        now: now(),
        instance_types: &types,
        allowed_regions: &regions,
    };
    assert!(parse_request(&v, &ctx).is_ok());
}

#[test]
fn instance_types_must_be_present_and_distinct() {
    let mut v = ec2();
    v["instance_types"] = json!([]);
    assert_eq!(fields(&v), ["instance_types"]);
    v["instance_types"] = json!(["p5.48xlarge", "p5.48xlarge"]);
    assert_eq!(fields(&v), ["instance_types[1]"]);
}

#[test]
fn a_capacity_block_holds_up_to_64_instances() {
    let mut v = ec2();
    v["instance_count"] = json!(64);
    assert!(parse(&v).is_ok());
    v["instance_count"] = json!(65);
    assert_eq!(fields(&v), ["instance_count"]);
    v["instance_count"] = json!(0);
    assert_eq!(fields(&v), ["instance_count"]);
}

#[test]
fn a_training_plan_holds_a_power_of_two_up_to_64_instances() {
    for ok in [1, 2, 4, 8, 16, 32, 64] {
        let mut v = training();
        v["instance_count"] = json!(ok);
        assert!(parse(&v).is_ok(), "{ok}");
    }
    for bad in [3, 6, 12, 128] {
        let mut v = training();
        v["instance_count"] = json!(bad);
        assert_eq!(fields(&v), ["instance_count"], "{bad}");
    }
}

/// A `latest_end` a day later than `hours` from `ec2()`'s earliest start (2026-12-07).
fn ends_a_day_after(hours: i64) -> String {
    let earliest = Utc.with_ymd_and_hms(2026, 12, 7, 0, 0, 0).unwrap();
    (earliest + chrono::Duration::hours(hours + 24)).to_rfc3339()
}

#[test]
fn capacity_block_durations_are_1_to_14_days_then_weeks_to_182_days() {
    let mut v = ec2();
    for days in [1, 2, 13, 14, 21, 28, 182] {
        v["duration_hours"] = json!(days * 24);
        v["latest_end"] = json!(ends_a_day_after(days * 24));
        assert!(parse(&v).is_ok(), "{days} days");
    }
    for days in [15, 16, 20, 22, 189] {
        v["duration_hours"] = json!(days * 24);
        v["latest_end"] = json!(ends_a_day_after(days * 24));
        assert_eq!(fields(&v), ["duration_hours"], "{days} days");
    }
    v["duration_hours"] = json!(36);
    assert_eq!(fields(&v), ["duration_hours"], "not whole days");
}

#[test]
fn training_plan_durations_are_1_to_182_days_in_1_day_steps() {
    let mut v = training();
    for days in [1, 15, 16, 100, 182] {
        v["duration_hours"] = json!(days * 24);
        v["latest_end"] = json!(ends_a_day_after(days * 24));
        assert!(parse(&v).is_ok(), "{days} days");
    }
    for hours in [183 * 24, 30, 0] {
        v["duration_hours"] = json!(hours);
        v["latest_end"] = json!(ends_a_day_after(hours.max(24)));
        assert_eq!(fields(&v), ["duration_hours"], "{hours} h");
    }
}

#[test]
fn the_window_must_end_after_it_starts() {
    let mut v = ec2();
    v["latest_end"] = json!("2026-12-06T00:00:00Z");
    assert_eq!(fields(&v), ["latest_end"]);
}

#[test]
fn the_window_must_be_at_least_the_duration() {
    let mut v = ec2();
    v["latest_end"] = json!("2026-12-08T12:00:00Z");
    assert_eq!(fields(&v), ["latest_end"]);
    assert!(message(&v, "latest_end").contains("shorter than duration_hours 48"));
}

#[test]
fn the_start_may_be_at_most_8_weeks_ahead() {
    let mut v = ec2();
    v["earliest_start"] = json!("2027-01-26T00:00:00Z");
    v["latest_end"] = json!("2027-01-28T00:00:00Z");
    // (a window that starts too late ends too late as well)
    assert_eq!(fields(&v), ["earliest_start", "latest_end"]);
    v["earliest_start"] = json!("2027-01-25T12:00:00Z");
    v["latest_end"] = json!("2027-01-27T12:00:00Z");
    assert!(parse(&v).is_ok(), "exactly 8 weeks");
}

#[test]
fn the_end_may_be_at_most_8_weeks_plus_the_duration_ahead() {
    // now is 2026-11-30T12:00Z; 8 weeks on is 2027-01-25T12:00Z, plus 48 h 2027-01-27T12:00Z
    let mut v = ec2();
    v["latest_end"] = json!("2027-01-27T12:00:01Z");
    assert_eq!(fields(&v), ["latest_end"]);
    let m = message(&v, "latest_end");
    assert!(
        m.contains("8 weeks plus duration_hours (48 h)") && m.contains("2027-01-27T12:00:00"),
        "{m}"
    );
    v["latest_end"] = json!("2027-01-27T12:00:00Z");
    assert!(parse(&v).is_ok(), "exactly 8 weeks plus 48 h");
}

#[test]
fn a_window_with_no_feasible_start_left_is_rejected() {
    let mut v = ec2();
    v["earliest_start"] = json!("2026-11-28T00:00:00Z");
    v["latest_end"] = json!("2026-12-02T12:00:00Z");
    assert_eq!(fields(&v), ["latest_end"]);
    assert!(message(&v, "latest_end").contains("no feasible start"));
}

#[test]
fn timestamps_must_be_rfc3339() {
    let mut v = ec2();
    v["earliest_start"] = json!("next tuesday");
    assert_eq!(fields(&v), ["earliest_start"]);
}

#[test]
fn regions_must_be_allowed_by_the_deployment() {
    let mut v = ec2();
    v["regions"] = json!(["us-east-1", "eu-west-1", "Mars"]);
    assert_eq!(fields(&v), ["regions[1]", "regions[2]"]);
}

#[test]
fn the_workload_kind_decides_the_products_allowed() {
    let mut v = ec2();
    v["products"] = json!(["training-plan"]);
    assert_eq!(fields(&v), ["products[0]"]);

    let mut v = training();
    v["products"] = json!(["capacity-block", "spot"]);
    assert_eq!(fields(&v), ["products[0]", "products[1]"]);

    let mut v = training();
    v["products"] = json!(["training-plan"]);
    assert!(parse(&v).is_ok());
}

#[test]
fn a_training_plan_serves_only_its_target_resource() {
    let mut v = training();
    v["workload"] = json!({
        "kind": "inference-endpoint",
        "model_name": "m", "endpoint_name": "e", "variant_name": "v"
    });
    let r = parse(&v).unwrap();
    assert_eq!(
        r.reservation_products().collect::<Vec<_>>(),
        [Product::TrainingPlan {
            target: TargetResource::Endpoint
        }]
    );
}

#[test]
fn spot_is_allowed_only_when_interruptible() {
    let mut v = ec2();
    v["products"] = json!(["capacity-block", "spot"]);
    assert_eq!(fields(&v), ["products[1]"]);
    assert!(message(&v, "products[1]").contains("interruptible"));
    v["interruptible"] = json!(true);
    assert_eq!(
        parse(&v).unwrap().products,
        [Product::CapacityBlock, Product::Spot]
    );
    // By default an interruptible EC2 request may also use spot.
    let mut v = ec2();
    v["interruptible"] = json!(true);
    assert!(parse(&v).unwrap().products.contains(&Product::Spot));
}

#[test]
fn the_strategy_needs_the_products_it_uses() {
    let mut v = ec2();
    v["strategy"] = json!("on-demand-first");
    v["products"] = json!(["capacity-block"]);
    assert_eq!(fields(&v), ["strategy"]);
    let mut v = ec2();
    v["products"] = json!(["on-demand"]);
    assert_eq!(
        fields(&v),
        ["strategy"],
        "reserve needs a reservation product"
    );
    let mut v = ec2();
    v["strategy"] = json!("on-demand-first");
    assert_eq!(parse(&v).unwrap().strategy, Strategy::OnDemandFirst);
    v["strategy"] = json!("yolo");
    assert_eq!(fields(&v), ["strategy"]);
}

#[test]
fn budget_amounts_are_positive_decimal_strings() {
    for bad in [
        json!("0"),
        json!("-1"),
        json!("12abc"),
        json!(1500.5),
        json!("1e4"),
    ] {
        let mut v = ec2();
        v["budget"]["max_upfront_usd"] = bad.clone();
        assert_eq!(fields(&v), ["budget.max_upfront_usd"], "{bad}");
        let mut v = ec2();
        v["budget"]["approval_above_usd"] = bad.clone();
        assert_eq!(fields(&v), ["budget.approval_above_usd"], "{bad}");
    }
    let mut v = ec2();
    v["budget"] = json!({"max_upfront_usd": "0.01"});
    assert!(parse(&v).is_ok(), "approval is optional");
}

#[test]
fn ec2_workloads_need_subnets_and_a_launch_template() {
    let mut v = ec2();
    v["workload"] = json!({"kind": "ec2-instances"});
    assert_eq!(
        fields(&v),
        ["workload.launch_template", "workload.subnet_ids"]
    );
    let mut v = ec2();
    v["workload"]["subnet_ids"] = json!(["subnet-xyz"]);
    v["workload"]["launch_template"] = json!({"id": "template-1"});
    assert_eq!(
        fields(&v),
        ["workload.launch_template.id", "workload.subnet_ids[0]"]
    );
}

#[test]
fn the_instance_platform_defaults_to_linux_and_must_be_a_block_platform() {
    let mut v = ec2();
    v["workload"]["instance_platform"] = json!("Ubuntu Pro");
    assert_eq!(parse(&v).unwrap().instance_platform(), "Ubuntu Pro");
    v["workload"]["instance_platform"] = json!("Windows");
    assert_eq!(fields(&v), ["workload.instance_platform"]);
}

#[test]
fn each_workload_kind_names_its_missing_fields() {
    let mut v = training();
    v["workload"] = json!({"kind": "training-job"});
    assert_eq!(
        fields(&v),
        ["workload.training_image", "workload.output_s3_uri"]
    );
    v["workload"] = json!({"kind": "hyperpod-cluster"});
    assert_eq!(
        fields(&v),
        ["workload.cluster_name", "workload.instance_group_name"]
    );
    v["workload"] = json!({"kind": "inference-endpoint"});
    assert_eq!(
        fields(&v),
        [
            "workload.model_name",
            "workload.endpoint_name",
            "workload.variant_name"
        ]
    );
    v["workload"] = json!({"kind": "batch"});
    assert_eq!(fields(&v), ["workload.kind"]);
}

#[test]
fn drain_minutes_are_bounded() {
    let mut v = ec2();
    v["drain_minutes"] = json!(24 * 60 + 1);
    assert_eq!(fields(&v), ["drain_minutes"]);
    v["drain_minutes"] = json!(-1);
    assert_eq!(fields(&v), ["drain_minutes"]);
}

#[test]
fn tags_may_not_use_reserved_prefixes_or_exceed_aws_limits() {
    let mut v = ec2();
    v["tags"] = json!({"aws:owner": "x", "capacity-pilot:managed": "true", "ok": "a".repeat(257)});
    assert_eq!(
        fields(&v),
        ["tags.aws:owner", "tags.capacity-pilot:managed", "tags.ok"]
    );
}

#[test]
fn tags_sagemaker_refuses_are_named_at_submission_for_sagemaker_workloads_only() {
    // Issue 18: SageMaker's tag pattern ([\p{L}\p{Z}\p{N}_.:/=+\-@]*) is narrower than EC2's.
    let mut job = training();
    job["tags"] = json!({"owner": "ml&search", "cost-center": "cc 42/a=b+c@d.e:f_g-h"});
    assert_eq!(fields(&job), vec!["tags.owner"]);
    assert!(
        message(&job, "tags.owner").contains("'&'"),
        "{}",
        message(&job, "tags.owner")
    );

    // AND the same tags are fine on EC2 instances bought as a Capacity Block
    let mut ec2 = ec2();
    ec2["tags"] = json!({"owner": "ml&search"});
    assert!(parse(&ec2).is_ok());

    // AND letters and numbers of any script pass
    let mut job = training();
    job["tags"] = json!({"équipe": "recherche-東京-٣"});
    assert!(parse(&job).is_ok(), "{:?}", parse(&job));
}

#[test]
fn a_placeholder_left_by_new_is_named_alone_at_its_field() {
    // GIVEN a request whose launch template and subnet are `capacity-pilot new`'s
    // placeholders, and a team left as one too
    let mut v = ec2();
    v["workload"]["launch_template"] = json!({"name": "<launch template name>"});
    v["workload"]["subnet_ids"] = json!(["<subnet id in each zone>"]);
    v["team"] = json!("<team>");
    // WHEN it is parsed
    // THEN each placeholder is the only problem of its field, in the schema's order ...
    assert_eq!(
        fields(&v),
        [
            "team",
            "workload.launch_template.name",
            "workload.subnet_ids[0]"
        ]
    );
    // ... and says what to do
    let m = message(&v, "workload.subnet_ids[0]");
    assert!(m.contains("\"<subnet id in each zone>\""), "{m}");
    assert!(m.contains("capacity-pilot new"), "{m}");
}

#[test]
fn each_workload_kind_requires_what_the_schema_says_it_requires() {
    use capacity_pilot::domain::request::WORKLOAD_REQUIRED;
    for (kind, required) in WORKLOAD_REQUIRED {
        // GIVEN a request whose workload names only its kind
        let mut v = if kind == "ec2-instances" {
            ec2()
        } else {
            training()
        };
        v["workload"] = json!({ "kind": kind });
        // THEN the validator names exactly the fields the schema requires of that kind
        let named: Vec<String> = fields(&v)
            .into_iter()
            .filter(|f| f.starts_with("workload"))
            .collect();
        let want: Vec<String> = required.iter().map(|f| format!("workload.{f}")).collect();
        assert_eq!(named, want, "{kind}");
    }
}
