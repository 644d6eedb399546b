//! `types` and `new`: the catalogue as an ML engineer asks for it ("4 H100s for 2 days"),
//! and a request written from that, with what only the caller can know left as named
//! placeholders the validator explains (`capacity_pilot::domain::request::is_placeholder`).

use chrono::{DateTime, NaiveDate, NaiveTime, TimeDelta, Utc};
use serde_json::{Value, json};

use capacity_pilot::domain::catalog::{
    ACCELERATORS, PriceTable, SupportedInstanceTypes, accelerators,
};
use capacity_pilot::domain::money::Usd;
use capacity_pilot::domain::request::{
    MAX_CAPACITY_BLOCK_COUNT, SCHEMA_VERSION, TRAINING_PLAN_COUNTS, WorkloadKind,
};

use crate::fail::{Fail, Result};

/// One row of `types`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TypeRow {
    pub instance_type: String,
    pub accelerator: String,
    pub per_instance: u32,
    /// The maker's name of the accelerator.
    pub model: String,
    /// `capacity-block` (EC2) or `training-plan` (SageMaker).
    pub product: &'static str,
    /// The workload kinds that run on it.
    pub workloads: Vec<&'static str>,
    pub on_demand_usd_per_hour: Option<Usd>,
}

/// The catalogue's types, those carrying `gpu` (its short name, any case) when given.
pub fn types(
    catalogue: &SupportedInstanceTypes,
    prices: &PriceTable,
    gpu: Option<&str>,
) -> Vec<TypeRow> {
    let mut rows = Vec::new();
    for (list, product, workloads) in [
        (catalogue.ec2(), "capacity-block", vec!["ec2-instances"]),
        (
            catalogue.sagemaker(),
            "training-plan",
            vec!["training-job", "hyperpod-cluster", "inference-endpoint"],
        ),
    ] {
        for t in list {
            let Some((accelerator, per_instance)) = accelerators(t) else {
                continue;
            };
            if gpu.is_some_and(|g| !g.eq_ignore_ascii_case(accelerator)) {
                continue;
            }
            let ec2 = t.strip_prefix("ml.").unwrap_or(t);
            let model = ACCELERATORS
                .iter()
                .find(|(x, ..)| *x == ec2)
                .map(|(.., m)| m.to_string())
                .unwrap_or_default();
            rows.push(TypeRow {
                instance_type: t.clone(),
                accelerator: accelerator.to_string(),
                per_instance,
                model,
                product,
                workloads: workloads.clone(),
                on_demand_usd_per_hour: prices.on_demand(t),
            });
        }
    }
    rows
}

/// The accelerator names the catalogue knows, for messages.
pub fn known_accelerators(catalogue: &SupportedInstanceTypes) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = catalogue
        .ec2()
        .iter()
        .chain(catalogue.sagemaker())
        .filter_map(|t| accelerators(t).map(|(a, _)| a))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// What `new` chose for `--gpus NAME:N`: the types and count, and what it said aloud.
#[derive(Debug, Clone, PartialEq)]
pub struct Sizing {
    pub instance_types: Vec<String>,
    pub instance_count: u32,
    pub per_instance: u32,
    pub accelerator: String,
    /// Why the count differs from what was asked, when it does.
    pub notes: Vec<String>,
}

/// Parses `--gpus NAME:N` (`H100:16`).
pub fn parse_gpus(s: &str) -> Result<(String, u32)> {
    let bad = || {
        Fail::Usage(format!(
            "--gpus {s:?}: give an accelerator and a count, such as H100:16 (see `capacity-pilot types`)"
        ))
    };
    let (name, n) = s.split_once(':').ok_or_else(bad)?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    if name.trim().is_empty() || n == 0 {
        return Err(bad());
    }
    Ok((name.trim().to_string(), n))
}

/// Picks the types for `n` accelerators named `gpu` for a `kind` workload: among the types
/// carrying it, those whose per-instance count divides `n`, fewest instances first (every
/// type of that per-instance count, in catalogue order); if none divides, the type of most
/// per instance with the next larger count, said aloud. A training plan holds 1, 2, 4 ... 64
/// instances, so a plan kind's count goes up to the next of those, said aloud.
pub fn size(
    catalogue: &SupportedInstanceTypes,
    kind: WorkloadKind,
    gpu: &str,
    n: u32,
) -> Result<Sizing> {
    let list = if kind.is_sagemaker() {
        catalogue.sagemaker()
    } else {
        catalogue.ec2()
    };
    let carrying: Vec<(&String, &'static str, u32)> = list
        .iter()
        .filter_map(|t| accelerators(t).map(|(a, c)| (t, a, c)))
        .filter(|(_, a, _)| a.eq_ignore_ascii_case(gpu))
        .collect();
    if carrying.is_empty() {
        return Err(Fail::Usage(format!(
            "no {} type carries {gpu:?}; known accelerators: {} (see `capacity-pilot types`)",
            if kind.is_sagemaker() {
                "SageMaker (training plan)"
            } else {
                "EC2 (Capacity Block)"
            },
            known_accelerators(catalogue).join(", ")
        )));
    }
    let accelerator = carrying[0].1.to_string();
    // Each per-instance count, with the instances it takes (a plan's next size up) and the
    // accelerators that gives: exactly `n` first, then the fewest over; fewest instances next.
    let mut options: Vec<(u32, u32, u32)> = Vec::new();
    for c in carrying.iter().map(|(_, _, c)| *c) {
        let mut count = n.div_ceil(c);
        if kind.is_sagemaker() {
            match TRAINING_PLAN_COUNTS.iter().copied().find(|p| *p >= count) {
                Some(p) => count = p,
                None => continue,
            }
        }
        if !options.iter().any(|o| o.0 == c) {
            options.push((c, count, count * c));
        }
    }
    options.sort_by_key(|&(_, count, total)| (total != n, total, count));
    let Some(&(per_instance, count, total)) = options.first() else {
        return Err(Fail::Usage(format!(
            "{n} {accelerator} need more than 64 instances, more than a training plan holds"
        )));
    };
    let mut notes = Vec::new();
    if total != n {
        notes.push(format!(
            "{n} {accelerator} is not a whole {}number of instances of any type; asking for \
             {count} x {per_instance} = {total} {accelerator}",
            if kind.is_sagemaker() {
                "plan size (1, 2, 4 ... 64) "
            } else {
                ""
            }
        ));
    }
    if !kind.is_sagemaker() && count > MAX_CAPACITY_BLOCK_COUNT {
        notes.push(format!(
            "{count} instances are more than one Capacity Block holds \
             ({MAX_CAPACITY_BLOCK_COUNT}): the request will find no offering; ask for fewer"
        ));
    }
    let instance_types = carrying
        .iter()
        .filter(|(_, _, c)| *c == per_instance)
        .map(|(t, _, _)| t.to_string())
        .collect();
    Ok(Sizing {
        instance_types,
        instance_count: count,
        per_instance,
        accelerator,
        notes,
    })
}

/// A UTC date (`2026-12-07`) or time (`2026-12-07T11:30:00Z`) given to `new`: a date alone is
/// that day at `at` UTC.
pub fn parse_when(flag: &str, s: &str, at: NaiveTime) -> Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map(|d| d.and_time(at).and_utc())
        .map_err(|_| {
            Fail::Usage(format!(
                "{flag} {s:?}: give a UTC date (2026-12-07) or an RFC 3339 time (2026-12-07T11:30:00Z)"
            ))
        })
}

/// The request as `new` writes it, field by field in the schema's order.
#[derive(serde::Serialize)]
struct Draft {
    schema_version: u32,
    request_id: Value,
    team: Value,
    instance_types: Vec<String>,
    instance_count: u32,
    duration_hours: u32,
    earliest_start: DateTime<Utc>,
    latest_end: DateTime<Utc>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    regions: Vec<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    allow_split: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    strategy: Option<&'static str>,
    budget: Value,
    workload: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    drain_minutes: Option<u32>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    tags: std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<&'static str>,
}

/// What `new` is told.
#[derive(Debug, Clone)]
pub struct NewRequest {
    pub gpu: String,
    pub gpus: u32,
    pub hours: u32,
    pub start: DateTime<Utc>,
    pub by: DateTime<Utc>,
    pub team: Option<String>,
    pub kind: WorkloadKind,
    pub request_id: Option<String>,
    pub budget_usd: Option<Usd>,
    /// `budget.approval_above_usd`: purchases above it wait for an approver.
    pub approve_above_usd: Option<Usd>,
    pub tags: std::collections::BTreeMap<String, String>,
    pub volume_size_gb: Option<u32>,
    pub hyper_parameters: std::collections::BTreeMap<String, String>,
    pub regions: Vec<String>,
    pub allow_split: bool,
    pub on_demand_first: bool,
    /// `mode: plan`.
    pub plan_only: bool,
    pub drain_minutes: Option<u32>,
    pub launch_template: Option<String>,
    pub subnet_ids: Vec<String>,
    pub image: Option<String>,
    pub output_s3_uri: Option<String>,
    pub model_name: Option<String>,
    pub endpoint_name: Option<String>,
    pub cluster_name: Option<String>,
    pub instance_group_name: Option<String>,
}

/// A value the caller must give, named.
fn placeholder(what: &str) -> Value {
    Value::String(format!("<{what}>"))
}

fn or_placeholder(v: &Option<String>, what: &str) -> Value {
    v.as_ref()
        .map_or_else(|| placeholder(what), |s| Value::String(s.clone()))
}

/// The request `new` writes (as a value and as the text it prints), and what it says
/// aloud about it.
pub fn request(
    n: &NewRequest,
    catalogue: &SupportedInstanceTypes,
    prices: &PriceTable,
) -> Result<(Value, String, Vec<String>)> {
    if n.hours == 0 || !n.hours.is_multiple_of(24) {
        return Err(Fail::Usage(format!(
            "--hours {}: reservations are whole days; give a multiple of 24 (48 for 2 days)",
            n.hours
        )));
    }
    let sizing = size(catalogue, n.kind, &n.gpu, n.gpus)?;
    let mut said = sizing.notes.clone();
    said.insert(
        0,
        format!(
            "{} x {} ({} {} each, {} in all), any of: {}",
            sizing.instance_count,
            sizing.instance_types[0],
            sizing.per_instance,
            sizing.accelerator,
            sizing.instance_count * sizing.per_instance,
            sizing.instance_types.join(", ")
        ),
    );
    said.push(format!(
        "window: from {} to {} (UTC; Capacity Blocks and training plans end at 11:30 UTC)",
        n.start.format("%Y-%m-%d %H:%M"),
        n.by.format("%Y-%m-%d %H:%M")
    ));
    let budget = match n.budget_usd {
        Some(b) => b,
        None => {
            // Upfront cap: what the same hours cost on demand, whole dollars up.
            let hourly = sizing
                .instance_types
                .iter()
                .filter_map(|t| prices.on_demand(t))
                .max()
                .ok_or_else(|| {
                    Fail::Usage(format!(
                        "no on-demand price is known for {}: give --budget USD",
                        sizing.instance_types.join(", ")
                    ))
                })?;
            let total = hourly.amount()
                * rust_decimal::Decimal::from(sizing.instance_count)
                * rust_decimal::Decimal::from(n.hours);
            let b = Usd::new(total.ceil());
            said.push(format!(
                "budget: at most {} up front, what the same hours cost on demand; lower it \
                 with --budget",
                crate::show::usd(b)
            ));
            b
        }
    };
    let team = or_placeholder(&n.team, "team");
    let request_id = match (&n.request_id, &n.team) {
        (Some(id), _) => Value::String(id.clone()),
        (None, Some(team)) => Value::String(format!(
            "{}-{}-{}",
            team.to_ascii_lowercase(),
            sizing.accelerator.to_ascii_lowercase(),
            n.start.format("%Y%m%d")
        )),
        (None, None) => placeholder("request id: 1-48 letters, digits and hyphens"),
    };
    let subnets = if n.subnet_ids.is_empty() {
        json!([placeholder("subnet id, one per zone to allow")])
    } else {
        json!(n.subnet_ids)
    };
    let workload = match n.kind {
        WorkloadKind::Ec2Instances => json!({
            "kind": "ec2-instances",
            "launch_template": {"name": or_placeholder(&n.launch_template, "launch template name")},
            "subnet_ids": subnets,
        }),
        WorkloadKind::TrainingJob => {
            let mut w = json!({
                "kind": "training-job",
                "training_image": or_placeholder(&n.image, "training image URI"),
                "output_s3_uri": or_placeholder(&n.output_s3_uri, "s3://bucket/prefix for the model"),
            });
            if let Some(gb) = n.volume_size_gb {
                w["volume_size_gb"] = json!(gb);
            }
            if !n.hyper_parameters.is_empty() {
                w["hyper_parameters"] = json!(n.hyper_parameters);
            }
            w
        }
        WorkloadKind::HyperpodCluster => json!({
            "kind": "hyperpod-cluster",
            "cluster_name": or_placeholder(&n.cluster_name, "HyperPod cluster name"),
            "instance_group_name": or_placeholder(&n.instance_group_name, "instance group name"),
        }),
        WorkloadKind::InferenceEndpoint => json!({
            "kind": "inference-endpoint",
            "model_name": or_placeholder(&n.model_name, "SageMaker model name"),
            "endpoint_name": or_placeholder(&n.endpoint_name, "endpoint name"),
            "variant_name": "primary",
        }),
    };
    // In the schema's order, so the file reads like the README's example.
    let draft = Draft {
        schema_version: SCHEMA_VERSION,
        request_id,
        team,
        instance_types: sizing.instance_types,
        instance_count: sizing.instance_count,
        duration_hours: n.hours,
        earliest_start: n.start,
        latest_end: n.by,
        regions: n.regions.clone(),
        allow_split: n.allow_split,
        strategy: n.on_demand_first.then_some("on-demand-first"),
        budget: match n.approve_above_usd {
            None => json!({"max_upfront_usd": budget.to_string()}),
            Some(a) => {
                json!({"max_upfront_usd": budget.to_string(), "approval_above_usd": a.to_string()})
            }
        },
        workload,
        drain_minutes: n.drain_minutes,
        tags: n.tags.clone(),
        mode: n.plan_only.then_some("plan"),
    };
    let writing = |e: serde_json::Error| Fail::Usage(format!("writing the request: {e}"));
    let text = serde_json::to_string_pretty(&draft).map_err(writing)?;
    let v = serde_json::to_value(&draft).map_err(writing)?;
    if n.by - n.start < TimeDelta::hours(i64::from(n.hours)) {
        said.push(format!(
            "the window is shorter than {} h: widen --start or --by",
            n.hours
        ));
    }
    Ok((v, text, said))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cat() -> SupportedInstanceTypes {
        SupportedInstanceTypes::default()
    }

    #[test]
    fn sixteen_h100s_are_two_instances_of_eight_fewest_first() {
        let s = size(&cat(), WorkloadKind::Ec2Instances, "h100", 16).unwrap();
        assert_eq!(s.instance_types, ["p5.48xlarge"]);
        assert_eq!((s.instance_count, s.per_instance), (2, 8));
        assert!(s.notes.is_empty(), "{:?}", s.notes);
    }

    #[test]
    fn a_count_no_big_type_divides_takes_the_type_that_divides_it() {
        // 12 H100: p5.48xlarge (8) does not divide 12, p5.4xlarge (1) does: 12 of those
        let s = size(&cat(), WorkloadKind::Ec2Instances, "H100", 12).unwrap();
        assert_eq!(
            (s.instance_types[0].as_str(), s.instance_count),
            ("p5.4xlarge", 12)
        );
    }

    #[test]
    fn a_count_no_type_divides_goes_to_the_next_larger_said_aloud() {
        // 12 H200: only 8-GPU types carry H200, so 2 instances (16 H200), both types listed
        let s = size(&cat(), WorkloadKind::Ec2Instances, "H200", 12).unwrap();
        assert_eq!(s.instance_types, ["p5e.48xlarge", "p5en.48xlarge"]);
        assert_eq!(s.instance_count, 2);
        assert!(s.notes[0].contains("16 H200"), "{:?}", s.notes);
    }

    #[test]
    fn a_plan_kind_count_goes_up_to_a_power_of_two_said_aloud() {
        // 24 H100 for a training job: 3 x ml.p5.48xlarge is no plan size; 4 is
        let s = size(&cat(), WorkloadKind::TrainingJob, "H100", 24).unwrap();
        assert_eq!(
            (s.instance_types[0].as_str(), s.instance_count),
            ("ml.p5.48xlarge", 4)
        );
        assert!(
            s.notes.iter().any(|n| n.contains("1, 2, 4")),
            "{:?}",
            s.notes
        );
    }

    #[test]
    fn an_unknown_accelerator_names_the_known_ones() {
        let e = size(&cat(), WorkloadKind::Ec2Instances, "V100", 8).unwrap_err();
        assert_eq!(e.code(), 2);
        assert!(e.to_string().contains("H100"), "{e}");
    }

    #[test]
    fn dates_are_utc_days_at_the_given_time_or_rfc3339() {
        let t = parse_when(
            "--by",
            "2026-12-14",
            NaiveTime::from_hms_opt(11, 30, 0).unwrap(),
        )
        .unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-14T11:30:00+00:00");
        let t = parse_when("--by", "2026-12-14T09:00:00Z", NaiveTime::MIN).unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-14T09:00:00+00:00");
        assert_eq!(
            parse_when("--by", "14/12/2026", NaiveTime::MIN)
                .unwrap_err()
                .code(),
            2
        );
    }
}
