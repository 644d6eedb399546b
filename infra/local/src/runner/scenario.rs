//! Scenario files (`infra/local/scenarios/*.yaml`): the market seed, the simulated start and
//! end, the template parameters, requests submitted (as events, or through the
//! `capacity-pilot` CLI) and faults injected at simulated times, and the outcomes expected per
//! request.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use chrono::{DateTime, TimeDelta, Utc};
use serde::Deserialize;
use serde_json::Value;

use crate::world::Fault;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub seed: u64,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// The region the functions run in (and whose subnets `${subnet_ids}` names).
    #[serde(default = "default_region")]
    pub region: String,
    /// Template parameters (those without a `Default` must be given).
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Emulator settings to change from their defaults (see `local_cloud::Settings`).
    #[serde(default)]
    pub settings: Option<Value>,
    /// Market changes applied before the start.
    #[serde(default)]
    pub market: Vec<MarketChange>,
    pub actions: Vec<Action>,
    /// Expected outcomes, per request id.
    #[serde(default)]
    pub expect: BTreeMap<String, Expect>,
    /// Each team's fees on the bus equal what the emulator charged it (a reservation whose
    /// payment failed charged nothing, and its Reserved event does not count; an extension a
    /// team bought by hand, an `extend` action, was not bought by capacity-pilot and is not
    /// counted).
    #[serde(default = "yes")]
    pub budgets_exact: bool,
}

fn default_region() -> String {
    "us-east-1".to_string()
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketChange {
    pub instance_type: String,
    /// Free on-demand capacity per zone (0: none anywhere).
    #[serde(default)]
    pub on_demand_pool: Option<u32>,
}

/// One thing the scenario does, at a simulated time or relative to a request's launch.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    #[serde(default)]
    pub at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub after: Option<After>,
    #[serde(flatten)]
    pub what: What,
}

/// A time relative to the first `Capacity Workload Launched` of a request (`launched`), or to
/// the start of the first window it reserved (`opens`, from its first `Capacity Reserved`;
/// a negative offset is before it). Exactly one of the two.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct After {
    #[serde(default)]
    pub launched: Option<String>,
    #[serde(default)]
    pub opens: Option<String>,
    #[serde(default)]
    pub hours: i64,
    #[serde(default)]
    pub minutes: i64,
}

impl After {
    pub fn offset(&self) -> TimeDelta {
        TimeDelta::hours(self.hours) + TimeDelta::minutes(self.minutes)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum What {
    /// Put an event on the custom bus, as a team's system would.
    Submit(Submit),
    /// Impair the status checks of one live instance of a request (by launch order).
    Impair(InstanceOf),
    /// Stop one live instance of a request unexpectedly.
    FailInstance(InstanceOf),
    /// EC2 schedules the retirement of one live instance of a request, `in_minutes` from now:
    /// an AWS Health `scheduledChange` event now, the instance retired at its start (the
    /// emulator's `POST /_local/instances/{id}/health-event`).
    RetireInstance(Retirement),
    /// Inject an API fault (see the crate README's fault kinds).
    Fault(Fault),
    ClearFaults {},
    Market(MarketChange),
    /// Create a HyperPod cluster (SageMaker `CreateCluster`) in the home region or `region`,
    /// as a team would before asking for an instance group in it: `tags` as a map, and
    /// `instance_groups` in SageMaker's own shape (the groups it already has).
    CreateCluster(CreateCluster),
    /// Create a SageMaker model (`CreateModel`) in the home region or `region`, as a team
    /// would before asking for an inference endpoint serving it.
    CreateModel(CreateModel),
    /// Make the payments of the next `count` reservations (Capacity Blocks or training plans)
    /// bought for a request (tag `capacity-pilot:request-id`) fail at their payment time: a
    /// block goes `payment-failed`, a plan `Failed`, and the capacity returns to the market
    /// (the emulator's `POST /_local/payment-failures`).
    FailPayments {
        request_id: String,
        #[serde(default = "one")]
        count: u32,
    },
    /// A team extends a reservation of a request (found by its tag `capacity-pilot:request-id`)
    /// by `hours` by hand, as in the console, outside capacity-pilot: a Capacity Block through
    /// EC2's extension path (`payment-pending`, then the end moves), a training plan as
    /// `ExtendTrainingPlan` would (the emulator's `POST /_local/capacity-reservations/{id}/extend`
    /// and `POST /_local/training-plans/{region}/{name}/extend`). `index` picks among the
    /// request's live reservations (not expired, released or failed) by start; the first by
    /// default. A refusal fails the run.
    Extend(ExtendBy),
    /// The next extension bought (by capacity-pilot through the API, or by hand) of a
    /// reservation of a request (found by its tag `capacity-pilot:request-id`, `index` among
    /// its live reservations as for `extend`) fails its payment at its payment time: a block's
    /// extension `payment-failed`, a plan's `PaymentStatus` `Failed`; the end is kept and the
    /// capacity returned (the emulator's `POST /_local/extension-payment-fails`). A request
    /// with no such reservation fails the run.
    FailExtensionPayment(ReservationOf),
    /// Run the `capacity-pilot` CLI (built with the functions) against the emulator at this
    /// simulated time, as an operator would, and check its exit code and output.
    Cli(CliCall),
    /// A function cannot run for `minutes` from now (a bad deployment, Lambda unable to run
    /// it): its schedule's ticks in that time are lost, and the events routed to it wait for
    /// EventBridge's retries, delivered once it is back.
    Outage {
        function: String,
        minutes: i64,
    },
}

/// One run of the `capacity-pilot` CLI: `<bin_dir>/capacity-pilot <args...>` in the
/// workspace root, with the emulator as its AWS and clock.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliCall {
    /// Its arguments, substituted ([`substitute_args`]): an argument `${subnet_ids}` is the
    /// home region's subnet ids comma-joined (`${subnet_ids:<region>}` another region's), and
    /// `${out}` in any argument the run's `<out_dir>/cli` directory.
    pub args: Vec<String>,
    /// Who calls: a caller ARN STS answers for the command's access key; the Lambda host's
    /// dummy key (an IAM user of the emulator's account) when absent.
    #[serde(default, rename = "as")]
    pub caller: Option<String>,
    /// Writes the command's stdout to `<out_dir>/cli/<stdout>` (a plain file name).
    #[serde(default)]
    pub stdout: Option<String>,
    /// The exit code expected (0 unless given); another fails the run.
    #[serde(default)]
    pub exit: i32,
    /// Substrings the command's stdout must contain; a missing one fails the run.
    #[serde(default)]
    pub expect_stdout: Vec<String>,
    /// When the command submits a request: its id. The run then requires a `Capacity
    /// Request Submitted` event for it on the custom bus from this command, and the checks
    /// judge the scenario's `expect` for it like any submitted request (from the event the
    /// CLI put).
    #[serde(default)]
    pub request_id: Option<String>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submit {
    #[serde(default = "submitted")]
    pub detail_type: String,
    pub source: String,
    pub detail: Value,
}

/// The detail-type of a capacity request.
pub const SUBMITTED: &str = "Capacity Request Submitted";

fn submitted() -> String {
    SUBMITTED.to_string()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateCluster {
    pub name: String,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    #[serde(default)]
    pub instance_groups: Vec<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateModel {
    pub name: String,
    #[serde(default)]
    pub region: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceOf {
    pub request_id: String,
    #[serde(default)]
    pub index: usize,
}

/// A live reservation of a request: the `index`th by start (the first by default).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationOf {
    pub request_id: String,
    #[serde(default)]
    pub index: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendBy {
    pub request_id: String,
    pub hours: i64,
    #[serde(default)]
    pub index: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retirement {
    pub request_id: String,
    #[serde(default)]
    pub index: usize,
    pub in_minutes: i64,
}

/// What must be true of one request at the end, judged from the buses and the emulator.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Exactly one reservation bought (one Reserved event, one block or plan in the emulator);
    /// one whose payment failed was not bought.
    #[serde(default)]
    pub bought_once: bool,
    /// Each window's workload launched within one schedule tick of the window opening.
    #[serde(default)]
    pub launched_on_time: bool,
    /// Every instance the scenario impaired or failed was replaced in its reservation.
    #[serde(default)]
    pub replaced: bool,
    /// Each window drained before AWS's forced termination; nothing terminated by AWS.
    #[serde(default)]
    pub drained_before_forced_termination: bool,
    /// The request ended, and its endpoints and endpoint configs are gone.
    #[serde(default)]
    pub cleaned_up: bool,
    /// On-demand-first met no capacity: nothing ran on demand, a reservation was bought
    /// instead, and the start delay was reported.
    #[serde(default)]
    pub fell_back: bool,
    /// Rejected, naming (at least) these fields; nothing bought.
    #[serde(default)]
    pub rejected_fields: Option<Vec<String>>,
    /// `mode: plan`: plans announced in `Capacity Offerings Found`, nothing bought.
    #[serde(default)]
    pub planned: bool,
    /// Nothing bought, and a `Capacity Not Found` rejection or the `Capacity Request
    /// Failed` reason says this.
    #[serde(default)]
    pub not_bought_because: Option<String>,
    /// Its reservation, extended (by hand by an `extend` action, or by capacity-pilot) and
    /// paid, was followed: the first drain of the extended window came after the latest paid
    /// extension's old end and before the forced termination of the end the emulator holds
    /// now, and its EC2 instances running when that extension was paid carry
    /// `capacity-pilot:drain-at` after the old end and no later than that.
    #[serde(default)]
    pub drain_followed_extension: bool,
    /// capacity-pilot extended its reservations by `hours` in all: every extension it bought
    /// was paid, each announced by `Capacity Reservation Extended` with `external: false` and
    /// its new end, and each reservation's end per the emulator moved by its paid hours.
    #[serde(default)]
    pub extended: Option<ExtendedBy>,
    /// The payment of an extension capacity-pilot bought failed: `Capacity Extension Failed`
    /// named it and returned its whole fee, nothing was extended (no `Capacity Reservation
    /// Extended` with `external: false`, every reservation ends as bought), and the request's
    /// spend at its end is only its reservations' fees.
    #[serde(default)]
    pub extension_failed: bool,
    /// A training job whose plan capacity-pilot extended while it ran got its follow-on:
    /// the first job was ended at its fixed runtime (`Stopped`, `MaxRuntimeExceeded`), and
    /// a job `<first>-x<n>` on the same plan, image and output was created once it had
    /// stopped and announced by a second `Capacity Workload Launched`.
    #[serde(default)]
    pub follow_on_job: bool,
    /// Every window had each `Capacity Window Opening` lead due after its purchase before it
    /// opened, and each `Capacity Reservation Ending` lead before its drain, on the bus and
    /// on the notices topic (ARCHITECTURE §9.2).
    #[serde(default)]
    pub noticed: bool,
    /// At least one lead-time notice of it was published late (`late: true`), after its
    /// moment and before what it announced.
    #[serde(default)]
    pub noticed_late: bool,
}

/// `extended`: by how many hours capacity-pilot extended a request's reservations.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendedBy {
    pub hours: i64,
}

impl Scenario {
    pub fn load(path: &Path) -> anyhow::Result<Scenario> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let s: Scenario = serde_yaml_ng::from_str(&text)
            .with_context(|| format!("{} is not a scenario", path.display()))?;
        anyhow::ensure!(
            s.end > s.start,
            "{}: end must be after start",
            path.display()
        );
        for (i, a) in s.actions.iter().enumerate() {
            anyhow::ensure!(
                a.at.is_some() != a.after.is_some(),
                "{}: action {i} needs exactly one of `at` and `after`",
                path.display()
            );
            if let Some(after) = &a.after {
                anyhow::ensure!(
                    after.launched.is_some() != after.opens.is_some(),
                    "{}: action {i}'s `after` needs exactly one of `launched` and `opens`",
                    path.display()
                );
            }
        }
        Ok(s)
    }

    /// The template parameter `AllowedRegions`, as a list (the home region when absent).
    pub fn allowed_regions(&self) -> Vec<String> {
        match self.parameters.get("AllowedRegions") {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(str::to_string)
                .collect(),
            None => vec![self.region.clone()],
        }
    }

    /// The allowed regions but the home one: where the region forwarder is deployed
    /// (ARCHITECTURE §8.9), each once, in order.
    pub fn forwarded_regions(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in self.allowed_regions() {
            if r != self.region && !out.contains(&r) {
                out.push(r);
            }
        }
        out
    }

    /// Every request a `submit` action submits (a `Capacity Request Submitted` event), its
    /// detail as the file gives it, by request id. Requests submitted through the CLI are not
    /// here (their detail is the CLI's to build): the checks read every submitted request from
    /// the custom bus instead (`checks::Observed::requests`).
    pub fn requests(&self) -> BTreeMap<String, Value> {
        self.actions
            .iter()
            .filter_map(|a| match &a.what {
                What::Submit(s) if s.detail_type == SUBMITTED => Some((
                    s.detail["request_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    s.detail.clone(),
                )),
                _ => None,
            })
            .collect()
    }

    /// The id of every request the scenario submits: by a `submit` action, or by a `cli`
    /// action that names its `request_id`.
    pub fn submitted_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.requests().into_keys().collect();
        for a in &self.actions {
            if let What::Cli(c) = &a.what
                && let Some(id) = &c.request_id
                && !ids.contains(id)
            {
                ids.push(id.clone());
            }
        }
        ids
    }

    /// Whether any action runs the CLI.
    pub fn uses_cli(&self) -> bool {
        self.actions.iter().any(|a| matches!(a.what, What::Cli(_)))
    }
}

/// A `cli` action's arguments with their placeholders replaced: an argument that is exactly
/// `${subnet_ids}` becomes the home region's subnet ids comma-joined (`${subnet_ids:<region>}`
/// that region's; `subnets` gives a region's, `None` the home region's), and `${out}` anywhere
/// in an argument becomes `out` (the run's CLI output directory).
pub fn substitute_args(
    args: &[String],
    subnets: &dyn Fn(Option<&str>) -> Vec<String>,
    out: &Path,
) -> Vec<String> {
    args.iter()
        .map(|a| {
            if a == "${subnet_ids}" {
                subnets(None).join(",")
            } else if let Some(region) = a
                .strip_prefix("${subnet_ids:")
                .and_then(|r| r.strip_suffix('}'))
            {
                subnets(Some(region)).join(",")
            } else {
                a.replace("${out}", &out.to_string_lossy())
            }
        })
        .collect()
}

/// Replaces every string `${subnet_ids}` in `v` with the list of the home region's subnet ids,
/// and every `${subnet_ids:<region>}` with that region's (`subnets` gives a region's, `None`
/// the home region's).
pub fn substitute(v: &mut Value, subnets: &dyn Fn(Option<&str>) -> Vec<String>) {
    match v {
        Value::String(s) if s == "${subnet_ids}" => {
            *v = Value::from(subnets(None));
        }
        Value::String(s) if s.starts_with("${subnet_ids:") && s.ends_with('}') => {
            let region = s["${subnet_ids:".len()..s.len() - 1].to_string();
            *v = Value::from(subnets(Some(&region)));
        }
        Value::Array(a) => {
            for x in a {
                substitute(x, subnets);
            }
        }
        Value::Object(o) => {
            for x in o.values_mut() {
                substitute(x, subnets);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_are_the_home_regions_or_a_named_regions() {
        let mut v = serde_json::json!({"a": "${subnet_ids}", "b": ["${subnet_ids:us-west-2}"]});
        substitute(&mut v, &|r| vec![format!("subnet-{}", r.unwrap_or("home"))]);
        assert_eq!(
            v,
            serde_json::json!({"a": ["subnet-home"], "b": [["subnet-us-west-2"]]})
        );
    }

    #[test]
    fn a_scenario_can_create_a_cluster_and_names_its_forwarded_regions() {
        let s: Scenario = serde_yaml_ng::from_str(
            "name: x\nseed: 1\nstart: 2026-12-01T09:00:00Z\nend: 2026-12-02T09:00:00Z\n\
             parameters: {AllowedRegions: 'us-east-1, us-west-2,us-east-1'}\n\
             actions:\n\
             - at: 2026-12-01T09:00:00Z\n  create_cluster: {name: c, tags: {k: v}, \
             instance_groups: [{InstanceGroupName: g}]}\n",
        )
        .expect("parses");
        assert_eq!(s.forwarded_regions(), ["us-west-2"]);
        match &s.actions[0].what {
            What::CreateCluster(c) => {
                assert_eq!((c.name.as_str(), c.region.as_deref()), ("c", None));
                assert_eq!(c.tags["k"], "v");
                assert_eq!(c.instance_groups.len(), 1);
            }
            other => panic!("not create_cluster: {other:?}"),
        }
    }

    #[test]
    fn a_scenario_can_force_the_payment_of_a_request_to_fail() {
        let actions: Vec<Action> = serde_yaml_ng::from_str(
            "- at: 2026-12-01T09:00:00Z\n  fail_payments: {request_id: team-a, count: 2}\n\
             - at: 2026-12-01T10:00:00Z\n  fail_payments: {request_id: team-b}\n",
        )
        .expect("parses");
        let forced: Vec<(String, u32)> = actions
            .into_iter()
            .map(|a| match a.what {
                What::FailPayments { request_id, count } => (request_id, count),
                other => panic!("not fail_payments: {other:?}"),
            })
            .collect();
        assert_eq!(forced, [("team-a".into(), 2), ("team-b".into(), 1)]);
    }

    #[test]
    fn a_scenario_can_make_the_next_extension_payment_of_a_request_fail() {
        let actions: Vec<Action> = serde_yaml_ng::from_str(
            "- at: 2026-12-01T09:00:00Z\n  fail_extension_payment: {request_id: team-a}\n\
             - at: 2026-12-01T10:00:00Z\n  fail_extension_payment: {request_id: team-b, index: 1}\n",
        )
        .expect("parses");
        let armed: Vec<ReservationOf> = actions
            .into_iter()
            .map(|a| match a.what {
                What::FailExtensionPayment(r) => r,
                other => panic!("not fail_extension_payment: {other:?}"),
            })
            .collect();
        assert_eq!(
            armed,
            [
                ReservationOf {
                    request_id: "team-a".into(),
                    index: 0
                },
                ReservationOf {
                    request_id: "team-b".into(),
                    index: 1
                },
            ]
        );
        let bad = serde_yaml_ng::from_str::<Vec<Action>>(
            "- at: 2026-12-01T09:00:00Z\n  fail_extension_payment: {request_id: a, hours: 1}\n",
        );
        assert!(bad.is_err(), "unknown fields are refused");
    }

    #[test]
    fn a_scenario_can_extend_a_request_by_hand_and_expect_its_drain_to_follow() {
        // GIVEN an extension at a time and one relative to a window's opening, of another
        // reservation of the request, and the check about it
        let s: Scenario = serde_yaml_ng::from_str(
            "name: x\nseed: 1\nstart: 2026-12-01T09:00:00Z\nend: 2026-12-04T12:30:00Z\n\
             actions:\n\
             - at: 2026-12-02T13:00:00Z\n  extend: {request_id: team-a, hours: 24}\n\
             - after: {opens: team-b, minutes: 120}\n  extend: {request_id: team-b, hours: 48, index: 1}\n\
             expect:\n  team-a: {drain_followed_extension: true}\n",
        )
        .expect("parses");
        // WHEN its actions are read
        let extends: Vec<&ExtendBy> = s
            .actions
            .iter()
            .map(|a| match &a.what {
                What::Extend(e) => e,
                other => panic!("not extend: {other:?}"),
            })
            .collect();
        // THEN each says whose reservation, by how much, and which; the first by default
        assert_eq!(
            extends,
            [
                &ExtendBy {
                    request_id: "team-a".into(),
                    hours: 24,
                    index: 0
                },
                &ExtendBy {
                    request_id: "team-b".into(),
                    hours: 48,
                    index: 1
                },
            ]
        );
        let after = s.actions[1].after.as_ref().expect("relative");
        assert_eq!(after.opens.as_deref(), Some("team-b"));
        assert_eq!(after.offset(), TimeDelta::minutes(120));
        assert!(s.expect["team-a"].drain_followed_extension);
        // ... and hours are required
        let bad = serde_yaml_ng::from_str::<Vec<Action>>(
            "- at: 2026-12-01T09:00:00Z\n  extend: {request_id: team-a}\n",
        );
        assert!(bad.is_err());
    }

    #[test]
    fn a_scenario_can_expect_a_request_extended_by_capacity_pilot_or_its_extension_failed() {
        // GIVEN the extension checks of two requests
        let s: Scenario = serde_yaml_ng::from_str(
            "name: x\nseed: 1\nstart: 2026-12-01T09:00:00Z\nend: 2026-12-05T12:30:00Z\n\
             actions: []\n\
             expect:\n  team-r: {extended: {hours: 24}, drain_followed_extension: true}\n\
             \x20 team-f: {extension_failed: true}\n",
        )
        .expect("parses");
        // WHEN read THEN each says what it expects, and nothing else
        let r = &s.expect["team-r"];
        assert_eq!(r.extended, Some(ExtendedBy { hours: 24 }));
        assert!(r.drain_followed_extension && !r.extension_failed);
        let f = &s.expect["team-f"];
        assert!(f.extension_failed && f.extended.is_none());
        // ... and `extended` needs its hours, and nothing else
        for bad in ["{extended: {}}", "{extended: {hours: 24, by: hand}}"] {
            let text = format!(
                "name: x\nseed: 1\nstart: 2026-12-01T09:00:00Z\nend: 2026-12-02T09:00:00Z\n\
                 actions: []\nexpect:\n  a: {bad}\n"
            );
            assert!(serde_yaml_ng::from_str::<Scenario>(&text).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_scenario_can_run_the_cli_as_someone_and_expect_its_output() {
        // GIVEN cli actions: a submit as an operator naming its request, and a budget
        // report expected to fail, with the defaults elsewhere
        let s: Scenario = serde_yaml_ng::from_str(
            "name: x\nseed: 1\nstart: 2026-12-01T09:00:00Z\nend: 2026-12-02T09:00:00Z\n\
             actions:\n\
             - at: 2026-12-01T09:00:00Z\n  cli: {args: [submit, '${out}/r.json'], \
             as: 'arn:aws:iam::123456789012:user/ops', stdout: submitted.txt, \
             expect_stdout: [team-cli], request_id: team-cli}\n\
             - at: 2026-12-01T10:00:00Z\n  cli: {args: [budget], exit: 2}\n",
        )
        .expect("parses");
        // WHEN its actions are read
        let calls: Vec<&CliCall> = s
            .actions
            .iter()
            .map(|a| match &a.what {
                What::Cli(c) => c,
                other => panic!("not cli: {other:?}"),
            })
            .collect();
        // THEN each has what it said, and the submitted request is known to the checks
        assert_eq!(
            calls[0],
            &CliCall {
                args: vec!["submit".into(), "${out}/r.json".into()],
                caller: Some("arn:aws:iam::123456789012:user/ops".into()),
                stdout: Some("submitted.txt".into()),
                exit: 0,
                expect_stdout: vec!["team-cli".into()],
                request_id: Some("team-cli".into()),
            }
        );
        assert_eq!(
            calls[1],
            &CliCall {
                args: vec!["budget".into()],
                caller: None,
                stdout: None,
                exit: 2,
                expect_stdout: vec![],
                request_id: None,
            }
        );
        assert!(s.uses_cli());
        assert_eq!(s.submitted_ids(), ["team-cli"]);
        assert!(s.requests().is_empty(), "its detail is the CLI's");
        // ... and an unknown field is refused
        let bad = serde_yaml_ng::from_str::<Vec<Action>>(
            "- at: 2026-12-01T09:00:00Z\n  cli: {args: [x], exit_code: 1}\n",
        );
        assert!(bad.is_err());
    }

    #[test]
    fn cli_arguments_get_the_subnets_and_the_output_directory() {
        // GIVEN arguments with every placeholder, and some without
        let args: Vec<String> = [
            "submit",
            "--subnets",
            "${subnet_ids}",
            "${subnet_ids:us-west-2}",
            "--file=${out}/req.json",
            "${out}",
            "x${subnet_ids}",
        ]
        .map(String::from)
        .to_vec();
        // WHEN they are substituted
        let out = substitute_args(
            &args,
            &|r| match r {
                None => vec!["subnet-a".into(), "subnet-b".into()],
                Some(r) => vec![format!("subnet-{r}")],
            },
            Path::new("/tmp/run/cli"),
        );
        // THEN whole `${subnet_ids}` arguments are comma lists and `${out}` is the directory
        // wherever it is
        assert_eq!(
            out,
            [
                "submit",
                "--subnets",
                "subnet-a,subnet-b",
                "subnet-us-west-2",
                "--file=/tmp/run/cli/req.json",
                "/tmp/run/cli",
                "x${subnet_ids}",
            ]
        );
    }
}
