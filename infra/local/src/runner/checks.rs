//! The scenario's expected outcomes, judged only from what reached the buses (AWS's events
//! and ours), what the functions answered, and the emulator's own state: never from the
//! functions' table.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};
use rust_decimal::Decimal;
use serde_json::Value;

use super::InvocationRecord;
use super::scenario::{SUBMITTED, Scenario};
use crate::LocalCloud;
use crate::sagemaker::plan_status;
pub use crate::world::REQUEST_TAG;

/// Everything a check may look at.
pub struct Observed<'a> {
    pub scenario: &'a Scenario,
    pub cloud: &'a LocalCloud,
    pub default_events: &'a [Value],
    pub custom_events: &'a [Value],
    pub invocations: &'a [InvocationRecord],
    pub broken: &'a [(String, String, DateTime<Utc>)],
    pub schedule_rates: &'a BTreeMap<String, TimeDelta>,
}

/// One judged expectation.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub subject: String,
    pub passed: bool,
    pub detail: String,
}

/// A reserved window as the emulator holds it: one Capacity Block, or one segment of a plan.
#[derive(Debug, Clone)]
pub struct Window {
    /// The block id, or the plan ARN.
    pub reservation_id: String,
    pub segment: usize,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// When AWS stops the workload itself, by the emulator's settings.
    pub forced: DateTime<Utc>,
    /// When a launch into it can first succeed: a block's activation (its start plus the
    /// emulator's activation lag), a plan segment's start.
    pub usable: DateTime<Utc>,
    /// What capacity-pilot bought it for: its fee and the extensions the product bought (one
    /// a team bought by hand, an `extend` action, is not counted).
    pub fee: Decimal,
    pub kind: String,
}

/// An extension of a reservation of a request, as the emulator holds it: bought by
/// capacity-pilot through the API, or by a team by hand (a scenario's `extend`).
#[derive(Debug, Clone, PartialEq)]
pub struct SoldExtension {
    /// The block id, or the plan ARN.
    pub reservation_id: String,
    /// The plan segment it lengthens (the last); 0 for a block.
    pub segment: usize,
    pub kind: String,
    /// The extension offering it was bought from (`cbe-`, `tpeo-`).
    pub offering_id: String,
    pub hours: i64,
    pub fee: Decimal,
    pub by_hand: bool,
    pub payment: Payment,
    pub old_end: DateTime<Utc>,
    pub new_end: DateTime<Utc>,
    /// When its payment succeeded (the reservation's end moved then).
    pub paid_at: Option<DateTime<Utc>>,
    /// A block's instances that had not terminated when it was paid, each with its
    /// `capacity-pilot:drain-at` tag.
    pub instances: Vec<(String, Option<String>)>,
}

/// An extension's payment, as the emulator holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payment {
    Pending,
    Paid,
    Failed,
}

impl Payment {
    pub fn as_str(self) -> &'static str {
        match self {
            Payment::Pending => "pending",
            Payment::Paid => "paid",
            Payment::Failed => "failed",
        }
    }
}

impl SoldExtension {
    fn who(&self) -> &'static str {
        if self.by_hand {
            "by hand"
        } else {
            "by capacity-pilot"
        }
    }
}

/// The instance tag that says when the product drains an instance's window (the product's
/// `shared/src/domain/naming.rs` `DRAIN_AT_TAG`, a `drain_at_value`: RFC 3339 in seconds).
pub const DRAIN_AT_TAG: &str = "capacity-pilot:drain-at";

impl Window {
    /// Whether an event's `segment` names this window: a plan's segment by its index; a
    /// Capacity Block is one window with no segments (EC2 has none), so any.
    pub fn is_segment(&self, detail: &Value) -> bool {
        self.kind == "capacity-block"
            || detail["segment"].as_u64().unwrap_or(0) as usize == self.segment
    }
}

impl Observed<'_> {
    /// Every request submitted, by id: the detail of the first `Capacity Request Submitted`
    /// event for it on the custom bus, whoever put it there (a scenario's `submit`, or the
    /// CLI a `cli` action ran). What reached the bus is what the functions were asked, so the
    /// checks judge that, not the scenario file's copy.
    pub fn requests(&self) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        for e in self.custom_events {
            if e["detail-type"] != SUBMITTED {
                continue;
            }
            if let Some(id) = e["detail"]["request_id"].as_str() {
                out.entry(id.to_string())
                    .or_insert_with(|| e["detail"].clone());
            }
        }
        out
    }

    /// Our events about `id` of `detail_type`, repeats of an event key dropped.
    pub fn ours(&self, id: &str, detail_type: &str) -> Vec<&Value> {
        let mut keys = BTreeSet::new();
        self.custom_events
            .iter()
            .filter(|e| e["detail-type"] == detail_type && e["detail"]["request_id"] == id)
            .filter(|e| keys.insert(e["detail"]["event_key"].to_string()))
            .collect()
    }

    /// Our `Capacity Reserved` events about `id`, less those whose every reservation the
    /// emulator released on a payment failure (a scenario's `fail_payments`): nothing was
    /// charged for them.
    pub fn reserved_and_paid(&self, id: &str) -> Vec<&Value> {
        let released: BTreeSet<String> = self.cloud.with_world(|w| {
            let blocks = w
                .ec2
                .reservations
                .values()
                .filter(|cr| cr.state == "payment-failed")
                .map(|cr| cr.id.clone());
            let plans =
                w.sm.plans
                    .values()
                    .filter(|p| plan_status(p, w.now) == "Failed")
                    .flat_map(|p| [p.arn.clone(), p.name.clone()]);
            blocks.chain(plans).collect()
        });
        self.ours(id, "Capacity Reserved")
            .into_iter()
            .filter(|e| {
                let ids = e["detail"]["reservation_ids"].as_array();
                !ids.is_some_and(|ids| {
                    !ids.is_empty()
                        && ids
                            .iter()
                            .all(|r| r.as_str().is_some_and(|r| released.contains(r)))
                })
            })
            .collect()
    }

    /// The windows the emulator sold for request `id` (found by its request tag). A block or
    /// plan whose payment failed was released, not sold, and a failed extension charged
    /// nothing.
    pub fn windows(&self, id: &str) -> Vec<Window> {
        self.cloud.with_world(|w| {
            let mut out = Vec::new();
            for cr in w.ec2.reservations.values() {
                if cr.tags.get(REQUEST_TAG).map(String::as_str) != Some(id)
                    || cr.state == "payment-failed"
                {
                    continue;
                }
                let lead = if cr.ultraserver {
                    w.settings.ultraserver_termination_lead_minutes
                } else {
                    w.settings.block_termination_lead_minutes
                };
                out.push(Window {
                    reservation_id: cr.id.clone(),
                    segment: 0,
                    start: cr.start,
                    end: cr.end,
                    forced: cr.end - TimeDelta::minutes(lead),
                    usable: cr.start + TimeDelta::seconds(w.settings.block_activation_seconds),
                    fee: cr.upfront_fee
                        + cr.extensions
                            .iter()
                            .filter(|x| x.status != "payment-failed" && !x.by_hand)
                            .map(|x| x.upfront_fee)
                            .sum::<Decimal>(),
                    kind: "capacity-block".into(),
                });
            }
            for p in w.sm.plans.values() {
                let tagged =
                    w.sm.tags
                        .get(&p.arn)
                        .is_some_and(|tags| tags.iter().any(|(k, v)| k == REQUEST_TAG && v == id));
                if !tagged || plan_status(p, w.now) == "Failed" {
                    continue;
                }
                let lead = match p.offering.target.as_str() {
                    "training-job" => w.settings.training_job_termination_lead_minutes,
                    "hyperpod-cluster" => w.settings.hyperpod_termination_lead_minutes,
                    // an endpoint fails when its plan stops being active
                    _ => 0,
                };
                for (i, s) in p.offering.segments.iter().enumerate() {
                    out.push(Window {
                        reservation_id: p.arn.clone(),
                        segment: i,
                        start: s.start,
                        end: s.end,
                        forced: s.end - TimeDelta::minutes(lead),
                        // An endpoint's window runs once it is InService: SageMaker's
                        // `Creating` after the plan is usable at its start.
                        usable: if p.offering.target == "endpoint" {
                            s.start + TimeDelta::minutes(w.settings.endpoint_create_minutes)
                        } else {
                            s.start
                        },
                        // the plan's fee, once, on its first segment (less the
                        // extensions a team bought by hand: not ours)
                        fee: if i == 0 {
                            p.offering.upfront_fee
                                - p.extensions
                                    .iter()
                                    .filter(|x| x.paid && x.by_hand)
                                    .map(|x| x.upfront_fee)
                                    .sum::<Decimal>()
                        } else {
                            Decimal::ZERO
                        },
                        kind: format!("training-plan/{}", p.offering.target),
                    });
                }
            }
            out.sort_by_key(|w| w.start);
            out
        })
    }

    /// Every extension sold for the reservations of request `id` (by capacity-pilot, or by
    /// hand), whatever its payment, oldest first.
    pub fn extensions(&self, id: &str) -> Vec<SoldExtension> {
        self.cloud.with_world(|w| {
            let mut out = Vec::new();
            for cr in w.ec2.reservations.values() {
                if cr.tags.get(REQUEST_TAG).map(String::as_str) != Some(id) {
                    continue;
                }
                for x in &cr.extensions {
                    let payment = match x.status.as_str() {
                        "payment-succeeded" => Payment::Paid,
                        "payment-failed" => Payment::Failed,
                        _ => Payment::Pending,
                    };
                    let instances = match x.paid_at {
                        Some(paid_at) => w
                            .ec2
                            .instances
                            .values()
                            .filter(|i| {
                                i.capacity_reservation_id.as_deref() == Some(cr.id.as_str())
                            })
                            .filter(|i| i.terminated_at.is_none_or(|t| t > paid_at))
                            .map(|i| (i.id.clone(), i.tags.get(DRAIN_AT_TAG).cloned()))
                            .collect(),
                        None => Vec::new(),
                    };
                    out.push(SoldExtension {
                        reservation_id: cr.id.clone(),
                        segment: 0,
                        kind: "capacity-block".into(),
                        offering_id: x.offering_id.clone(),
                        hours: x.hours,
                        fee: x.upfront_fee,
                        by_hand: x.by_hand,
                        payment,
                        old_end: x.start,
                        new_end: x.end,
                        paid_at: x.paid_at,
                        instances,
                    });
                }
            }
            for p in w.sm.plans.values() {
                let tagged =
                    w.sm.tags
                        .get(&p.arn)
                        .is_some_and(|tags| tags.iter().any(|(k, v)| k == REQUEST_TAG && v == id));
                if !tagged {
                    continue;
                }
                for x in &p.extensions {
                    let payment = if x.paid {
                        Payment::Paid
                    } else if x.failed {
                        Payment::Failed
                    } else {
                        Payment::Pending
                    };
                    out.push(SoldExtension {
                        reservation_id: p.arn.clone(),
                        segment: p.offering.segments.len() - 1,
                        kind: format!("training-plan/{}", p.offering.target),
                        offering_id: x.offering_id.clone(),
                        hours: x.hours,
                        fee: x.upfront_fee,
                        by_hand: x.by_hand,
                        payment,
                        old_end: x.start,
                        new_end: x.end,
                        paid_at: x.paid.then_some(x.paid_at),
                        instances: Vec::new(),
                    });
                }
            }
            out.sort_by(|a, b| (a.old_end, &a.reservation_id).cmp(&(b.old_end, &b.reservation_id)));
            out
        })
    }

    /// How much later than its window's `usable` an endpoint could first be `InService`: each
    /// attempt waits for its endpoint config to be visible (`endpoint_config_visibility_seconds`),
    /// and SageMaker failed the request's earlier endpoints in the window before `until` (a
    /// scenario's `endpoint_failures`), each costing its deletion and a new creation. Zero for
    /// every other window.
    pub fn endpoint_retries(&self, id: &str, w: &Window, until: DateTime<Utc>) -> TimeDelta {
        if w.kind != "training-plan/endpoint" {
            return TimeDelta::zero();
        }
        let name = self
            .requests()
            .get(id)
            .and_then(|r| r["workload"]["endpoint_name"].as_str())
            .unwrap_or_default()
            .to_string();
        let region = w.reservation_id.split(':').nth(3).unwrap_or_default();
        let (events, per, config_lag) = self.cloud.with_world(|world| {
            (
                world.events(region, "default").to_vec(),
                world.settings.endpoint_create_minutes + world.settings.endpoint_delete_minutes,
                world.settings.endpoint_config_visibility_seconds,
            )
        });
        let failed = events
            .iter()
            .filter(|e| e["detail-type"] == "SageMaker Endpoint State Change")
            .filter(|e| e["detail"]["EndpointStatus"] == "FAILED")
            .filter(|e| name.is_empty() || e["detail"]["EndpointName"] == name.as_str())
            .filter(|e| time(&e["time"]).is_some_and(|t| t >= w.start && t < until))
            .count();
        // Each attempt creates its endpoint config, which CreateEndpoint sees only after the
        // visibility lag (aws-reference: "call DescribeEndpointConfig before CreateEndpoint").
        TimeDelta::minutes(per * failed as i64)
            + TimeDelta::seconds(config_lag * (failed as i64 + 1))
    }

    /// The schedule rate of the function that published `ev` (found from the invocations).
    fn publisher_rate(&self, ev: &Value) -> Option<(String, TimeDelta)> {
        let inv = self
            .invocations
            .iter()
            .find(|i| i.published.iter().any(|p| p["id"] == ev["id"]))?;
        Some((
            inv.function.clone(),
            *self.schedule_rates.get(&inv.function)?,
        ))
    }
}

pub fn time(v: &Value) -> Option<DateTime<Utc>> {
    v.as_str()?.parse().ok()
}

fn money(v: &Value) -> Option<Decimal> {
    v.as_str()?.parse().ok()
}

/// Judges every expectation of the scenario.
pub fn judge(o: &Observed) -> Vec<Check> {
    let mut out = Vec::new();
    let mut check = |name: &str, subject: &str, passed: bool, detail: String| {
        out.push(Check {
            name: name.to_string(),
            subject: subject.to_string(),
            passed,
            detail,
        })
    };
    let requests = o.requests();
    let submitted = o.scenario.submitted_ids();
    for (id, e) in &o.scenario.expect {
        if !requests.contains_key(id) {
            let why = if submitted.contains(id) {
                "no Capacity Request Submitted for it reached the custom bus"
            } else {
                "the scenario never submits this request (by `submit`, or by `cli` with its \
                 `request_id`)"
            };
            check("submitted", id, false, why.into());
            continue;
        }
        let windows = o.windows(id);
        let reserved = o.reserved_and_paid(id);
        let reservations: BTreeSet<&str> =
            windows.iter().map(|w| w.reservation_id.as_str()).collect();

        if e.bought_once {
            let ok = reserved.len() == 1 && reservations.len() == 1;
            check(
                "bought once",
                id,
                ok,
                format!(
                    "{} Capacity Reserved event(s); the emulator sold {} reservation(s) tagged for it: {:?}",
                    reserved.len(),
                    reservations.len(),
                    reservations
                ),
            );
        }

        if e.launched_on_time {
            let launched = o.ours(id, "Capacity Workload Launched");
            let mut ok = !windows.is_empty();
            let mut notes = Vec::new();
            for w in &windows {
                let hit = launched.iter().find(|l| {
                    l["detail"]["reservation_id"] == w.reservation_id.as_str()
                        && time(&l["time"]).is_some_and(|t| t >= w.start && t < w.end)
                        && w.is_segment(&l["detail"])
                });
                match hit {
                    None => {
                        ok = false;
                        notes.push(format!(
                            "{} segment {}: never launched",
                            w.reservation_id, w.segment
                        ));
                    }
                    Some(l) => {
                        let at = time(&l["time"]).unwrap_or(w.start);
                        let (f, rate) = o
                            .publisher_rate(l)
                            .unwrap_or(("?".into(), TimeDelta::zero()));
                        let retried = o.endpoint_retries(id, w, at);
                        let usable = w.usable + retried;
                        if retried > TimeDelta::zero() {
                            notes.push(format!(
                                "{} segment {}: its endpoint config's visibility lag and the endpoints SageMaker failed let an endpoint be InService {} s later",
                                short(&w.reservation_id),
                                w.segment,
                                retried.num_seconds()
                            ));
                        }
                        let late = at - usable;
                        let on_time = late <= rate;
                        ok &= on_time;
                        notes.push(format!(
                            "{} segment {}: opened {}, usable {}, launched {} ({} s later; {f} ticks every {} s)",
                            short(&w.reservation_id),
                            w.segment,
                            w.start.format("%m-%d %H:%M"),
                            usable.format("%m-%d %H:%M"),
                            at.format("%m-%d %H:%M:%S"),
                            late.num_seconds(),
                            rate.num_seconds()
                        ));
                    }
                }
            }
            if windows.is_empty() {
                notes.push("no window was bought".into());
            }
            check(
                "launched within one tick of the window becoming usable",
                id,
                ok,
                notes.join("; "),
            );
        }

        if e.replaced {
            let replaced = o.ours(id, "Capacity Instance Replaced");
            let broken: Vec<&(String, String, DateTime<Utc>)> =
                o.broken.iter().filter(|(r, _, _)| r == id).collect();
            let mut ok = !broken.is_empty();
            let mut notes = Vec::new();
            for (_, sick, at) in &broken {
                let ev = replaced
                    .iter()
                    .find(|r| r["detail"]["replaced_instance_id"] == sick.as_str());
                // A scheduled retirement (broken "at" its start) is replaced before it, and
                // EC2 never retires the instance under the workload.
                let (retiring, retired_by_ec2) = o.cloud.with_world(|w| {
                    w.ec2
                        .instances
                        .get(sick.as_str())
                        .map_or((false, false), |i| {
                            (
                                i.scheduled_events.iter().any(|e| {
                                    e.code == "instance-retirement" && e.not_before == *at
                                }),
                                i.state_reason
                                    .as_ref()
                                    .is_some_and(|(code, _)| code == "Server.ScheduledStop"),
                            )
                        })
                });
                let verdict = ev.and_then(|r| {
                    let new_id = r["detail"]["new_instance_id"].as_str()?;
                    let (state, cr) = o.cloud.with_world(|w| {
                        let new = w.ec2.instances.get(new_id)?;
                        let old = w.ec2.instances.get(sick.as_str())?;
                        Some((
                            old.state.clone(),
                            new.capacity_reservation_id.is_some()
                                && new.capacity_reservation_id == old.capacity_reservation_id,
                        ))
                    })?;
                    Some((new_id.to_string(), time(&r["time"])?, state, cr))
                });
                if retiring && retired_by_ec2 {
                    ok = false;
                    notes.push(format!("{sick} was retired by EC2 under its workload"));
                }
                match verdict {
                    Some((new_id, t, old_state, same_cr)) => {
                        ok &= same_cr && (!retiring || t < *at);
                        notes.push(format!(
                            "{sick} broken at {}, replaced by {new_id} at {} ({} min later) {}; the old one is {old_state}",
                            at.format("%m-%d %H:%M"),
                            t.format("%m-%d %H:%M"),
                            (t - *at).num_minutes(),
                            if same_cr { "in the same reservation" } else { "OUTSIDE its reservation" }
                        ));
                    }
                    None => {
                        ok = false;
                        notes.push(format!("{sick}: no Capacity Instance Replaced names it"));
                    }
                }
            }
            if broken.is_empty() {
                notes.push("the scenario broke no instance of this request".into());
            }
            check("broken instances replaced", id, ok, notes.join("; "));
        }

        if e.drained_before_forced_termination {
            let drained = o.ours(id, "Capacity Workload Drained");
            let mut ok = !windows.is_empty();
            let mut notes = Vec::new();
            for w in &windows {
                let d = drained.iter().find(|d| {
                    d["detail"]["reservation_id"] == w.reservation_id.as_str()
                        && w.is_segment(&d["detail"])
                });
                match d.and_then(|d| time(&d["time"])) {
                    Some(t) => {
                        let before = t < w.forced;
                        ok &= before;
                        notes.push(format!(
                            "{} segment {}: drained {}, {} min before AWS's forced termination at {}",
                            short(&w.reservation_id),
                            w.segment,
                            t.format("%m-%d %H:%M"),
                            (w.forced - t).num_minutes(),
                            w.forced.format("%m-%d %H:%M")
                        ));
                    }
                    None => {
                        ok = false;
                        notes.push(format!(
                            "{} segment {}: never drained",
                            short(&w.reservation_id),
                            w.segment
                        ));
                    }
                }
            }
            // No instance of the request was stopped by AWS rather than by us.
            let by_aws: Vec<String> = o.cloud.with_world(|w| {
                w.ec2
                    .instances
                    .values()
                    .filter(|i| i.tags.get(REQUEST_TAG).map(String::as_str) == Some(id.as_str()))
                    .filter(|i| {
                        i.state_reason
                            .as_ref()
                            .is_some_and(|(code, _)| code != "Client.UserInitiatedShutdown")
                    })
                    .map(|i| i.id.clone())
                    .collect()
            });
            let broken: BTreeSet<&str> = o
                .broken
                .iter()
                .filter(|(r, _, _)| r == id)
                .map(|(_, i, _)| i.as_str())
                .collect();
            let by_aws: Vec<String> = by_aws
                .into_iter()
                .filter(|i| !broken.contains(i.as_str()))
                .collect();
            if !by_aws.is_empty() {
                ok = false;
                notes.push(format!("terminated by AWS, not drained: {by_aws:?}"));
            }
            check(
                "drained before AWS's forced termination",
                id,
                ok,
                notes.join("; "),
            );
        }

        if e.drain_followed_extension {
            let (ok, detail) = drain_followed_extension(o, id);
            check("drain followed the extension", id, ok, detail);
        }

        if let Some(x) = &e.extended {
            let (ok, detail) = judge_extended(
                x.hours,
                &o.extensions(id),
                &o.ours(id, "Capacity Reservation Extended"),
                &ends(o, id),
            );
            check(
                "extended by capacity-pilot, bought once and paid",
                id,
                ok,
                detail,
            );
        }

        if e.follow_on_job {
            let (ok, detail) = judge_follow_on(o, id);
            check(
                "a training job's follow-on ran in the extended window",
                id,
                ok,
                detail,
            );
        }

        if e.extension_failed {
            let reserved_fees: Decimal = reserved
                .iter()
                .filter_map(|r| money(&r["detail"]["upfront_fee_usd"]))
                .sum();
            let spent = ["Capacity Reservation Ended", "Capacity Request Failed"]
                .into_iter()
                .flat_map(|dt| o.ours(id, dt))
                .max_by_key(|ev| time(&ev["time"]))
                .and_then(|ev| money(&ev["detail"]["spent_usd"]));
            let (ok, detail) = judge_extension_failed(
                &o.extensions(id),
                &o.ours(id, "Capacity Extension Failed"),
                &o.ours(id, "Capacity Reservation Extended"),
                &ends(o, id),
                reserved_fees,
                spent,
            );
            check(
                "extension payment failed, its fee returned, the end kept",
                id,
                ok,
                detail,
            );
        }

        if e.cleaned_up {
            let ended = o.ours(id, "Capacity Reservation Ended");
            let last_end = windows.iter().map(|w| w.end).max();
            let mut ok = ended.len() == 1;
            let mut notes = vec![match ended.first().and_then(|e| time(&e["time"])) {
                Some(t) => format!("Reservation Ended at {}", t.format("%m-%d %H:%M")),
                None => "no Capacity Reservation Ended".into(),
            }];
            if let (Some(t), Some(end)) = (ended.first().and_then(|e| time(&e["time"])), last_end) {
                ok &= t >= end;
            }
            // Nothing of it is left running: instances, jobs, endpoints, endpoint configs.
            let arns: BTreeSet<String> = windows.iter().map(|w| w.reservation_id.clone()).collect();
            let left: Vec<String> = o.cloud.with_world(|w| {
                let mut left = Vec::new();
                for i in w.ec2.instances.values() {
                    if i.tags.get(REQUEST_TAG).map(String::as_str) == Some(id.as_str())
                        && i.state != "terminated"
                    {
                        left.push(format!("instance {} ({})", i.id, i.state));
                    }
                }
                for e in w.sm.endpoints.values() {
                    if e.variants
                        .iter()
                        .any(|v| v.plan_arn.as_ref().is_some_and(|a| arns.contains(a)))
                    {
                        left.push(format!("endpoint {} ({})", e.name, e.status));
                    }
                }
                for c in w.sm.endpoint_configs.values() {
                    if c.variants
                        .iter()
                        .any(|v| v.plan_arn.as_ref().is_some_and(|a| arns.contains(a)))
                    {
                        left.push(format!("endpoint config {}", c.name));
                    }
                }
                for j in w.sm.jobs.values() {
                    if j.plan_arn.as_ref().is_some_and(|a| arns.contains(a))
                        && matches!(j.status.as_str(), "InProgress" | "Stopping")
                    {
                        left.push(format!("training job {} ({})", j.name, j.status));
                    }
                }
                left
            });
            if left.is_empty() {
                notes.push("nothing of it left in the emulator".into());
            } else {
                ok = false;
                notes.push(format!("left behind: {left:?}"));
            }
            check("ended and cleaned up", id, ok, notes.join("; "));
        }

        if e.fell_back {
            let detail = &requests[id];
            let desired = time(&detail["earliest_start"]);
            let on_demand: Vec<String> = o.cloud.with_world(|w| {
                w.ec2
                    .instances
                    .values()
                    .filter(|i| i.tags.get(REQUEST_TAG).map(String::as_str) == Some(id.as_str()))
                    .filter(|i| i.capacity_reservation_id.is_none())
                    .map(|i| i.id.clone())
                    .collect()
            });
            let start = reserved.first().and_then(|r| time(&r["detail"]["start"]));
            let mut ok = on_demand.is_empty() && reserved.len() == 1;
            let mut notes = Vec::new();
            if !on_demand.is_empty() {
                notes.push(format!(
                    "instances ran outside a reservation: {on_demand:?}"
                ));
            }
            match (start, desired) {
                (Some(start), Some(desired)) => {
                    let delay = (start - desired).num_minutes();
                    let needle = format!("{delay} min after the desired start");
                    let reported = o.invocations.iter().any(|i| {
                        i.decisions.iter().any(|d| {
                            d["request_id"] == id.as_str()
                                && d["reason"].as_str().is_some_and(|r| r.contains(&needle))
                        })
                    });
                    ok &= delay > 0 && reported;
                    notes.push(format!(
                        "desired start {}, reservation starts {}: a delay of {delay} min, {}",
                        desired.format("%m-%d %H:%M"),
                        start.format("%m-%d %H:%M"),
                        if reported {
                            "reported in the purchase decision"
                        } else {
                            "NOT reported by any decision"
                        }
                    ));
                }
                _ => {
                    ok = false;
                    notes.push("no reservation was bought after on-demand failed".into());
                }
            }
            check(
                "on-demand-first fell back, delay reported",
                id,
                ok,
                notes.join("; "),
            );

            // Its fall-back takes the earliest feasible reservation (ARCHITECTURE §8.1): the
            // bought start is the earliest among the feasible offerings the emulator
            // returned to any search up to the purchase, as the emulator saw them.
            let bought_at = reserved.first().and_then(|r| time(&r["time"]));
            let earliest = bought_at.and_then(|bought_at| {
                let hours = detail["duration_hours"].as_i64().unwrap_or(0);
                let count = detail["instance_count"].as_i64().unwrap_or(0);
                let types: Vec<&str> = detail["instance_types"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let latest = time(&detail["latest_end"])?;
                let max_fee = money(&detail["budget"]["max_upfront_usd"])?;
                // the request's regions, or the deployment's when it names none
                let mut regions: Vec<String> = detail["regions"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                if regions.is_empty() {
                    regions = o.scenario.allowed_regions();
                }
                o.cloud.with_world(|w| {
                    w.ec2
                        .offered
                        .iter()
                        .filter(|(at, _)| *at <= bought_at)
                        .flat_map(|(at, ids)| ids.iter().map(move |i| (*at, i)))
                        .filter_map(|(at, i)| w.ec2.offerings.get(i).map(|o| (at, o)))
                        .filter(|(at, o)| {
                            types.contains(&o.instance_type.as_str())
                                && regions.contains(&o.region)
                                // one that has started by the purchase can no longer be bought
                                && o.start > bought_at
                                && o.instance_count == count
                                && (o.end - o.start).num_minutes() >= hours * 60
                                && o.start >= *at + chrono::TimeDelta::minutes(30)
                                && desired.is_none_or(|d| o.start >= d)
                                && o.end <= latest
                                && o.upfront_fee <= max_fee
                        })
                        .map(|(_, o)| o.start)
                        .min()
                })
            });
            check(
                "fell back to the earliest feasible block",
                id,
                start.is_some() && start == earliest,
                format!(
                    "bought a block starting {}; the earliest feasible start among the offerings \
                     returned was {}",
                    start.map_or("never".into(), |s| s.format("%m-%d %H:%M").to_string()),
                    earliest.map_or("none".into(), |s| s.format("%m-%d %H:%M").to_string()),
                ),
            );
        }

        if e.planned {
            // `mode: plan` (ARCHITECTURE §8.1): its plans announced, nothing bought or charged.
            let found = o.ours(id, "Capacity Offerings Found");
            let plans = found
                .last()
                .and_then(|f| f["detail"]["plans"].as_array().map(Vec::len))
                .unwrap_or(0);
            let reserved = o.ours(id, "Capacity Reserved").len();
            check(
                "planned, nothing bought",
                id,
                plans > 0 && reserved == 0 && windows.is_empty(),
                format!(
                    "{} Offerings Found event(s), the last with {plans} plan(s); {reserved} \
                     Capacity Reserved event(s); {} reservation(s) sold for it",
                    found.len(),
                    windows.len()
                ),
            );
        }
        if let Some(because) = &e.not_bought_because {
            let not_found = o.ours(id, "Capacity Not Found");
            let failed = o.ours(id, "Capacity Request Failed");
            let said: Vec<String> = not_found
                .iter()
                .flat_map(|n| {
                    n["detail"]["rejections"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|r| r["reason"].as_str().map(str::to_string))
                .chain(
                    failed
                        .iter()
                        .filter_map(|f| f["detail"]["reason"].as_str().map(str::to_string)),
                )
                .collect();
            let saying = said.iter().find(|r| r.contains(because.as_str()));
            check(
                "not bought, saying why",
                id,
                windows.is_empty() && saying.is_some(),
                format!(
                    "{}; {}",
                    if windows.is_empty() {
                        "nothing bought".to_string()
                    } else {
                        format!("yet {} window(s) bought", windows.len())
                    },
                    match saying {
                        Some(r) => format!("said: {r}"),
                        None => format!(
                            "no Not Found rejection or Failed reason says {because:?} ({} said)",
                            said.len()
                        ),
                    }
                ),
            );
        }

        if let Some(fields) = &e.rejected_fields {
            let rejected = o.ours(id, "Capacity Request Rejected");
            let named: BTreeSet<String> = rejected
                .iter()
                .flat_map(|r| {
                    r["detail"]["problems"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|p| p["field"].as_str().map(str::to_string))
                .collect();
            let missing: Vec<&String> = fields.iter().filter(|f| !named.contains(*f)).collect();
            let ok = rejected.len() == 1 && missing.is_empty() && windows.is_empty();
            check(
                "rejected, naming its bad fields",
                id,
                ok,
                format!(
                    "{} Rejected event(s) naming {:?}{}{}",
                    rejected.len(),
                    named,
                    if missing.is_empty() {
                        String::new()
                    } else {
                        format!("; missing {missing:?}")
                    },
                    if windows.is_empty() {
                        "; nothing bought".to_string()
                    } else {
                        format!("; yet {} window(s) bought", windows.len())
                    }
                ),
            );
        }

        if e.noticed {
            let (ok, detail) = noticed(o, id, &windows);
            check("told before each window opened and drained", id, ok, detail);
        }
        if e.noticed_late {
            let late: Vec<&Value> = ["Capacity Window Opening", "Capacity Reservation Ending"]
                .into_iter()
                .flat_map(|dt| o.ours(id, dt))
                .filter(|ev| ev["detail"]["late"] == true && told(o, ev))
                .collect();
            check(
                "a lead-time notice sent late",
                id,
                !late.is_empty(),
                match late.first() {
                    Some(ev) => format!(
                        "{} {} min lead, published at {}",
                        ev["detail-type"].as_str().unwrap_or("?"),
                        ev["detail"]["lead_minutes"],
                        ev["time"].as_str().unwrap_or("?")
                    ),
                    None => "no late Window Opening or Reservation Ending reached the topic".into(),
                },
            );
        }
    }

    if o.scenario.budgets_exact {
        // Per team: the fees on the Reserved events, and on the Extension Offered events of
        // the extensions that did not fail, equal what the emulator charged.
        let mut teams: BTreeMap<String, (Decimal, Decimal)> = BTreeMap::new();
        for (id, detail) in &requests {
            let team = detail["team"].as_str().unwrap_or("?").to_string();
            let published: Decimal = o
                .reserved_and_paid(id)
                .iter()
                .filter_map(|r| money(&r["detail"]["upfront_fee_usd"]))
                .sum::<Decimal>()
                + extension_fees(o, id);
            let charged: Decimal = o.windows(id).iter().map(|w| w.fee).sum();
            let t = teams.entry(team).or_default();
            t.0 += published;
            t.1 += charged;
        }
        for (team, (published, charged)) in teams {
            check(
                "budget exact",
                &team,
                published == charged,
                format!(
                    "Reserved and extension fees ${published}; the emulator charged ${charged}"
                ),
            );
        }
    }

    let failed: Vec<&InvocationRecord> = o.invocations.iter().filter(|i| !i.ok).collect();
    check(
        "every invocation succeeded",
        "functions",
        failed.is_empty(),
        match failed.first() {
            None => format!("{} invocations", o.invocations.len()),
            Some(f) => format!(
                "{} failed; first: {} at {} on {}: {}",
                failed.len(),
                f.function,
                f.at,
                f.trigger,
                f.error.as_deref().unwrap_or("")
            ),
        },
    );
    out
}

/// For request `id`, whose reservations were extended (by hand, an `extend` action, or by
/// capacity-pilot) and paid: judged per extended reservation by [`drain_followed`] against
/// its end as the emulator holds it now.
fn drain_followed_extension(o: &Observed, id: &str) -> (bool, String) {
    let sold = o.extensions(id);
    let paid: Vec<&SoldExtension> = sold.iter().filter(|x| x.payment == Payment::Paid).collect();
    if paid.is_empty() {
        return (
            false,
            "no extension of its reservations (by hand, an `extend` action, or by capacity-pilot) \
             was paid"
                .into(),
        );
    }
    let windows = o.windows(id);
    let drained = o.ours(id, "Capacity Workload Drained");
    let reservations: BTreeSet<&str> = paid.iter().map(|x| x.reservation_id.as_str()).collect();
    let mut ok = true;
    let mut notes = Vec::new();
    for r in reservations {
        let mine: Vec<&SoldExtension> = paid
            .iter()
            .copied()
            .filter(|x| x.reservation_id == r)
            .collect();
        // Its window now: the last one of the reservation, as the emulator holds it.
        let Some(current) = windows
            .iter()
            .filter(|w| w.reservation_id == r)
            .max_by_key(|w| w.end)
        else {
            ok = false;
            notes.push(format!("{}: the emulator holds no window of it", short(r)));
            continue;
        };
        let first = drained
            .iter()
            .filter(|d| d["detail"]["reservation_id"] == r && current.is_segment(&d["detail"]))
            .filter_map(|d| time(&d["time"]))
            .min();
        let (fine, said) = drain_followed(&mine, current, first);
        ok &= fine;
        notes.extend(said);
    }
    (ok, notes.join("; "))
}

/// `follow_on_job: true` for request `id`: its first training job was ended at its fixed
/// runtime (`Stopped`, `MaxRuntimeExceeded`), a second `Capacity Workload Launched` named the
/// job `<first>-x<n>`, and the emulator holds that job on the same plan, image and output,
/// created no earlier than the first stopped.
fn judge_follow_on(o: &Observed, id: &str) -> (bool, String) {
    let launched = o.ours(id, "Capacity Workload Launched");
    let names: Vec<String> = launched
        .iter()
        .flat_map(|e| {
            e["detail"]["resource_ids"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let Some(first) = names.first().cloned() else {
        return (false, "nothing was launched".into());
    };
    let Some(next) = names
        .iter()
        .find(|n| n.starts_with(&format!("{first}-x")))
        .cloned()
    else {
        return (
            false,
            format!("launched {names:?}: no follow-on of {first}"),
        );
    };
    o.cloud.with_world(|w| {
        let job = |name: &str| w.sm.jobs.values().find(|j| j.name == name).cloned();
        let (Some(a), Some(b)) = (job(&first), job(&next)) else {
            return (
                false,
                format!("the emulator holds no job {first} or {next}"),
            );
        };
        let same = |k: &str| a.request.get(k) == b.request.get(k);
        let ok = a.status == "Stopped"
            && a.transitions
                .iter()
                .any(|(st, ..)| st == "MaxRuntimeExceeded")
            && a.training_end.is_some_and(|t| b.created >= t)
            && a.plan_arn == b.plan_arn
            && same("AlgorithmSpecification")
            && same("OutputDataConfig")
            && same("HyperParameters");
        (
            ok,
            format!(
                "{first} {} ({}) ended {}; {next} created {} on {}, {}",
                a.status,
                a.secondary,
                a.training_end
                    .map_or("never".to_string(), |t| t.format("%m-%d %H:%M").to_string()),
                b.created.format("%m-%d %H:%M"),
                b.plan_arn.as_deref().map_or("no plan", short),
                b.status
            ),
        )
    })
}

/// Whether the drain of an extended reservation followed its paid extensions `paid` (oldest
/// first, all of one reservation): its window as the emulator holds it now (`current`, whose
/// end is the latest extension's) was first drained (`first_drain`) after the latest
/// extension's old end and before the current end's forced termination, and (a block) each
/// of its instances still running when that extension was paid carries a
/// `capacity-pilot:drain-at` tag after the old end and no later than that forced termination.
fn drain_followed(
    paid: &[&SoldExtension],
    current: &Window,
    first_drain: Option<DateTime<Utc>>,
) -> (bool, Vec<String>) {
    let Some(x) = paid.iter().max_by_key(|x| x.new_end) else {
        return (false, vec!["no paid extension".into()]);
    };
    let name = short(&x.reservation_id);
    let mut ok = true;
    let mut notes = Vec::new();
    let steps: Vec<String> = paid
        .iter()
        .map(|x| {
            format!(
                "{} to {} (paid {})",
                x.who(),
                x.new_end.format("%m-%d %H:%M"),
                x.paid_at
                    .map_or("?".into(), |t| t.format("%m-%d %H:%M").to_string())
            )
        })
        .collect();
    let span = format!(
        "{name}, ending {}, extended {}; it now ends {} (AWS's forced termination {})",
        paid[0].old_end.format("%m-%d %H:%M"),
        steps.join(", then "),
        current.end.format("%m-%d %H:%M"),
        current.forced.format("%m-%d %H:%M")
    );
    if current.end != x.new_end {
        ok = false;
        notes.push(format!(
            "{span}: the emulator's end is not the latest paid extension's ({})",
            x.new_end.format("%m-%d %H:%M")
        ));
    }
    match first_drain {
        Some(t) if t > x.old_end && t < current.forced => notes.push(format!(
            "{span}: drained {}, after the old end and {} min before the forced termination",
            t.format("%m-%d %H:%M"),
            (current.forced - t).num_minutes()
        )),
        Some(t) if t <= x.old_end => {
            ok = false;
            notes.push(format!(
                "{span}: drained {}, by the OLD end: the drain did not follow the extension",
                t.format("%m-%d %H:%M")
            ));
        }
        Some(t) => {
            ok = false;
            notes.push(format!(
                "{span}: drained {}, not before the new end's forced termination",
                t.format("%m-%d %H:%M")
            ));
        }
        None => {
            ok = false;
            notes.push(format!("{span}: never drained"));
        }
    }
    if x.kind != "capacity-block" {
        return (ok, notes);
    }
    if x.instances.is_empty() {
        ok = false;
        notes.push(format!(
            "{name}: no instance of it was running when the extension was paid"
        ));
    }
    let stale: Vec<String> = x
        .instances
        .iter()
        .filter(|(_, tag)| {
            !tag.as_deref()
                .and_then(|v| v.parse::<DateTime<Utc>>().ok())
                .is_some_and(|t| t > x.old_end && t <= current.forced)
        })
        .map(|(i, tag)| {
            format!(
                "{i} ({DRAIN_AT_TAG} {})",
                tag.as_deref().unwrap_or("absent")
            )
        })
        .collect();
    if stale.is_empty() {
        if !x.instances.is_empty() {
            notes.push(format!(
                "its {} instance(s) carry {DRAIN_AT_TAG} {}",
                x.instances.len(),
                x.instances
                    .iter()
                    .filter_map(|(_, t)| t.clone())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    } else {
        ok = false;
        notes.push(format!(
            "instances whose drain time is not after the old end: {}",
            stale.join(", ")
        ));
    }
    (ok, notes)
}

/// The end of each reservation of request `id` when it was bought (its `Capacity Reserved`
/// event's `end`), and now, as the emulator holds it (its last window's end).
fn ends(o: &Observed, id: &str) -> BTreeMap<String, (Option<DateTime<Utc>>, DateTime<Utc>)> {
    let mut bought: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    for r in o.reserved_and_paid(id) {
        let Some(end) = time(&r["detail"]["end"]) else {
            continue;
        };
        for rid in r["detail"]["reservation_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            let e = bought.entry(rid.to_string()).or_insert(end);
            *e = (*e).max(end);
        }
    }
    let mut out: BTreeMap<String, (Option<DateTime<Utc>>, DateTime<Utc>)> = BTreeMap::new();
    for w in o.windows(id) {
        let e = out
            .entry(w.reservation_id.clone())
            .or_insert((bought.get(&w.reservation_id).copied(), w.end));
        e.1 = e.1.max(w.end);
    }
    out
}

/// `extended: {hours}` for a request: every extension capacity-pilot bought of its
/// reservations (`sold`, by hand ones aside) was paid, `hours` in all; one `Capacity
/// Reservation Extended` with `external: false` (`extended`, ours and AWS's events of the
/// request) names each, with its new end; and each extended reservation's end, per the
/// emulator (`ends`: at purchase, now), moved by the hours of its paid extensions.
fn judge_extended(
    hours: i64,
    sold: &[SoldExtension],
    extended: &[&Value],
    ends: &BTreeMap<String, (Option<DateTime<Utc>>, DateTime<Utc>)>,
) -> (bool, String) {
    let ours: Vec<&SoldExtension> = sold.iter().filter(|x| !x.by_hand).collect();
    let announced: Vec<&Value> = extended
        .iter()
        .copied()
        .filter(|e| e["detail"]["external"] == false)
        .collect();
    let mut ok = !ours.is_empty();
    let mut notes = Vec::new();
    let unpaid: Vec<String> = ours
        .iter()
        .filter(|x| x.payment != Payment::Paid)
        .map(|x| format!("{} {}", x.offering_id, x.payment.as_str()))
        .collect();
    let paid_hours: i64 = ours
        .iter()
        .filter(|x| x.payment == Payment::Paid)
        .map(|x| x.hours)
        .sum();
    ok &= unpaid.is_empty() && paid_hours == hours;
    notes.push(if ours.is_empty() {
        "capacity-pilot bought no extension of its reservations".to_string()
    } else {
        format!(
            "capacity-pilot bought {} extension(s) of its reservations, {paid_hours} h paid (expected {hours} h){}",
            ours.len(),
            if unpaid.is_empty() {
                String::new()
            } else {
                format!("; not paid: {}", unpaid.join(", "))
            }
        )
    });
    for x in ours.iter().filter(|x| x.payment == Payment::Paid) {
        let hit = announced.iter().find(|e| {
            e["detail"]["reservation_id"] == x.reservation_id.as_str()
                && time(&e["detail"]["ends_at"]) == Some(x.new_end)
        });
        match hit {
            Some(e) => notes.push(format!(
                "Reservation Extended (external: false) at {}: {} now ends {}",
                time(&e["time"]).map_or("?".into(), |t| t.format("%m-%d %H:%M").to_string()),
                short(&x.reservation_id),
                x.new_end.format("%m-%d %H:%M")
            )),
            None => {
                ok = false;
                notes.push(format!(
                    "no Reservation Extended (external: false) says {} ends {}",
                    short(&x.reservation_id),
                    x.new_end.format("%m-%d %H:%M")
                ));
            }
        }
    }
    let paid_count = ours.iter().filter(|x| x.payment == Payment::Paid).count();
    if announced.len() != paid_count {
        ok = false;
        notes.push(format!(
            "{} Reservation Extended (external: false) for {paid_count} paid extension(s)",
            announced.len()
        ));
    }
    let extended_ids: BTreeSet<&str> = sold
        .iter()
        .filter(|x| x.payment == Payment::Paid)
        .map(|x| x.reservation_id.as_str())
        .collect();
    for r in extended_ids {
        let added: i64 = sold
            .iter()
            .filter(|x| x.reservation_id == r && x.payment == Payment::Paid)
            .map(|x| x.hours)
            .sum();
        match ends.get(r) {
            Some((Some(bought), now)) => {
                let moved = (*now - *bought).num_hours();
                ok &= moved == added;
                notes.push(format!(
                    "the emulator's end of {} moved from {} to {}: {moved} h{}",
                    short(r),
                    bought.format("%m-%d %H:%M"),
                    now.format("%m-%d %H:%M"),
                    if moved == added {
                        String::new()
                    } else {
                        format!(", not the {added} h paid")
                    }
                ));
            }
            _ => {
                ok = false;
                notes.push(format!(
                    "{}: no Capacity Reserved or window of it to measure its end by",
                    short(r)
                ));
            }
        }
    }
    (ok, notes.join("; "))
}

/// `extension_failed: true` for a request: the payment of an extension capacity-pilot
/// bought of its reservations failed (`sold`), a `Capacity Extension Failed` (`failed`)
/// named each such one and returned its fee; none was paid, and no `Capacity Reservation
/// Extended` with `external: false` came (`extended`); each reservation keeps the end it was
/// bought with (`ends`); and the request's spend, as its last `Capacity Reservation Ended` or
/// `Capacity Request Failed` says (`spent`), is only its reservations' fees (`reserved_fees`).
fn judge_extension_failed(
    sold: &[SoldExtension],
    failed: &[&Value],
    extended: &[&Value],
    ends: &BTreeMap<String, (Option<DateTime<Utc>>, DateTime<Utc>)>,
    reserved_fees: Decimal,
    spent: Option<Decimal>,
) -> (bool, String) {
    let ours: Vec<&SoldExtension> = sold.iter().filter(|x| !x.by_hand).collect();
    let refused: Vec<&SoldExtension> = ours
        .iter()
        .copied()
        .filter(|x| x.payment == Payment::Failed)
        .collect();
    let paid: Vec<&SoldExtension> = ours
        .iter()
        .copied()
        .filter(|x| x.payment == Payment::Paid)
        .collect();
    let mut ok = !refused.is_empty() && paid.is_empty();
    let mut notes = vec![format!(
        "capacity-pilot bought {} extension(s) of its reservations: {} payment(s) failed, {} paid",
        ours.len(),
        refused.len(),
        paid.len()
    )];
    for x in &refused {
        let hit = failed.iter().find(|f| {
            let e = &f["detail"]["extension"];
            e["reservation_id"] == x.reservation_id.as_str()
                && e["offering_id"] == x.offering_id.as_str()
        });
        match hit {
            Some(f) => {
                let back = money(&f["detail"]["returned_usd"]);
                let whole = back == Some(x.fee);
                ok &= whole;
                notes.push(format!(
                    "Extension Failed at {} ({}): ${} of its ${} fee returned",
                    time(&f["time"]).map_or("?".into(), |t| t.format("%m-%d %H:%M").to_string()),
                    f["detail"]["reason"].as_str().unwrap_or("?"),
                    back.map_or("?".into(), |b| b.to_string()),
                    x.fee
                ));
            }
            None => {
                ok = false;
                notes.push(format!(
                    "no Capacity Extension Failed names {} of {}",
                    x.offering_id,
                    short(&x.reservation_id)
                ));
            }
        }
    }
    let announced = extended
        .iter()
        .filter(|e| e["detail"]["external"] == false)
        .count();
    if announced > 0 {
        ok = false;
        notes.push(format!(
            "yet {announced} Reservation Extended (external: false)"
        ));
    }
    for (r, (bought, now)) in ends {
        match bought {
            Some(b) if b == now => notes.push(format!(
                "{} keeps its end {}",
                short(r),
                now.format("%m-%d %H:%M")
            )),
            Some(b) => {
                ok = false;
                notes.push(format!(
                    "{} was bought to end {}, yet ends {}",
                    short(r),
                    b.format("%m-%d %H:%M"),
                    now.format("%m-%d %H:%M")
                ));
            }
            None => {}
        }
    }
    match spent {
        Some(s) if s == reserved_fees => {
            notes.push(format!("its spend is ${s}: its reservations' fees only"))
        }
        Some(s) => {
            ok = false;
            notes.push(format!(
                "its spend is ${s}, not its reservations' fees ${reserved_fees}"
            ));
        }
        None => {
            ok = false;
            notes.push(
                "it never ended: no Reservation Ended or Request Failed says its spend".into(),
            );
        }
    }
    (ok, notes.join("; "))
}

/// The fees of the extensions capacity-pilot announced for request `id` (`Capacity Extension
/// Offered`) that no `Capacity Extension Failed` named (by reservation and number): what it
/// says it spent on extensions.
fn extension_fees(o: &Observed, id: &str) -> Decimal {
    let failed: BTreeSet<(String, String)> = o
        .ours(id, "Capacity Extension Failed")
        .iter()
        .filter(|f| f["detail"]["extension"].is_object())
        .map(|f| {
            let e = &f["detail"]["extension"];
            (e["reservation_id"].to_string(), e["extension"].to_string())
        })
        .collect();
    o.ours(id, "Capacity Extension Offered")
        .iter()
        .filter(|e| {
            let d = &e["detail"];
            !failed.contains(&(d["reservation_id"].to_string(), d["extension"].to_string()))
        })
        .filter_map(|e| money(&e["detail"]["upfront_fee_usd"]))
        .sum()
}

/// A short form of a reservation id or plan ARN, for reading.
pub fn short(id: &str) -> &str {
    id.rsplit('/').next().unwrap_or(id)
}

/// The leads of the lead-time notices the scenario's stack configures (the template's
/// defaults unless its parameters say otherwise).
fn leads(o: &Observed, parameter: &str, default: &str) -> Vec<i64> {
    o.scenario
        .parameters
        .get(parameter)
        .map(String::as_str)
        .unwrap_or(default)
        .split(',')
        .filter_map(|m| m.trim().parse().ok())
        .collect()
}

/// Whether the notices topic received the notice of our event `ev` (its body names the
/// event's key).
fn told(o: &Observed, ev: &Value) -> bool {
    let Some(key) = ev["detail"]["event_key"].as_str() else {
        return false;
    };
    o.cloud.sns_messages().iter().any(|m| {
        m["message"].as_str().is_some_and(|b| b.contains(key))
            && m["attributes"]["detail_type"] == ev["detail-type"]
    })
}

/// ARCHITECTURE §9.2 for request `id`: each window had a `Capacity Window Opening` for each
/// lead whose moment came after its purchase, published before it opened, and a `Capacity
/// Reservation Ending` for each such lead before its drain, each on the topic too.
fn noticed(o: &Observed, id: &str, windows: &[Window]) -> (bool, String) {
    let opening = leads(o, "NoticeOpeningLeadsMinutes", "1440,60");
    let ending = leads(o, "NoticeEndingLeadsMinutes", "1440,780,60");
    let mut ok = !windows.is_empty();
    let mut notes = Vec::new();
    let mut sent = 0;
    for w in windows {
        let bought = o
            .ours(id, "Capacity Reserved")
            .into_iter()
            .filter(|r| {
                r["detail"]["reservation_ids"]
                    .as_array()
                    .is_some_and(|ids| ids.iter().any(|i| *i == w.reservation_id.as_str()))
            })
            .filter_map(|r| time(&r["time"]))
            .min();
        let Some(bought) = bought else {
            ok = false;
            notes.push(format!(
                "{}: no Capacity Reserved names it",
                short(&w.reservation_id)
            ));
            continue;
        };
        let mine = |dt: &str| -> Vec<&Value> {
            o.ours(id, dt)
                .into_iter()
                .filter(|ev| ev["detail"]["reservation_id"] == w.reservation_id.as_str())
                .collect()
        };
        for lead in &opening {
            if w.start - TimeDelta::minutes(*lead) < bought {
                continue;
            }
            let hit = mine("Capacity Window Opening").into_iter().find(|ev| {
                ev["detail"]["lead_minutes"] == *lead
                    && time(&ev["detail"]["opens_at"]) == Some(w.start)
            });
            match hit {
                Some(ev) if time(&ev["time"]).is_some_and(|t| t < w.start) && told(o, ev) => {
                    sent += 1
                }
                Some(ev) => {
                    ok = false;
                    notes.push(format!(
                        "{} opening {lead} min: published at {} (opens {}), told: {}",
                        short(&w.reservation_id),
                        ev["time"].as_str().unwrap_or("?"),
                        w.start,
                        told(o, ev)
                    ));
                }
                None => {
                    ok = false;
                    notes.push(format!(
                        "{} opening {lead} min: never published",
                        short(&w.reservation_id)
                    ));
                }
            }
        }
        let endings = mine("Capacity Reservation Ending");
        // The drain as the notices name it; before any, the latest it can be (the forced
        // termination).
        let drain = endings
            .iter()
            .filter(|ev| time(&ev["detail"]["ends_at"]) == Some(w.end))
            .find_map(|ev| time(&ev["detail"]["drain_at"]))
            .unwrap_or(w.forced);
        for lead in &ending {
            if drain - TimeDelta::minutes(*lead) < bought {
                continue;
            }
            let hit = endings.iter().find(|ev| {
                ev["detail"]["lead_minutes"] == *lead
                    && time(&ev["detail"]["ends_at"]) == Some(w.end)
            });
            match hit {
                Some(ev) if time(&ev["time"]).is_some_and(|t| t < drain) && told(o, ev) => {
                    sent += 1
                }
                Some(ev) => {
                    ok = false;
                    notes.push(format!(
                        "{} ending {lead} min: published at {} (drain {drain}), told: {}",
                        short(&w.reservation_id),
                        ev["time"].as_str().unwrap_or("?"),
                        told(o, ev)
                    ));
                }
                None => {
                    ok = false;
                    notes.push(format!(
                        "{} ending {lead} min: never published (drain {drain})",
                        short(&w.reservation_id)
                    ));
                }
            }
        }
    }
    let detail = if notes.is_empty() {
        format!(
            "{sent} lead-time notice(s) on the bus and the topic, each before what it announced, for {} window(s)",
            windows.len()
        )
    } else {
        notes.join("; ")
    };
    (ok, detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().expect("a time")
    }

    /// A 24 h extension of block `cr-1` from 3 to 4 December 11:30, its fee $843.89.
    fn sold(payment: Payment, by_hand: bool) -> SoldExtension {
        SoldExtension {
            reservation_id: "cr-1".into(),
            segment: 0,
            kind: "capacity-block".into(),
            offering_id: "cbe-1".into(),
            hours: 24,
            fee: "843.89".parse().unwrap(),
            by_hand,
            payment,
            old_end: t("2026-12-03T11:30:00Z"),
            new_end: t("2026-12-04T11:30:00Z"),
            paid_at: (payment == Payment::Paid).then(|| t("2026-12-02T14:35:00Z")),
            instances: vec![("i-1".into(), Some("2026-12-04T10:40:00Z".into()))],
        }
    }

    fn extended(ends_at: &str, external: bool) -> Value {
        json!({"detail-type": "Capacity Reservation Extended", "time": "2026-12-02T14:40:00Z",
               "detail": {"request_id": "r", "reservation_id": "cr-1", "external": external,
                          "previous_ends_at": "2026-12-03T11:30:00Z", "ends_at": ends_at}})
    }

    fn failed(returned: &str) -> Value {
        json!({"detail-type": "Capacity Extension Failed", "time": "2026-12-02T14:40:00Z",
               "detail": {"request_id": "r", "hours": 24, "returned_usd": returned,
                          "reason": "AWS did not take the payment",
                          "extension": {"extension": 1, "reservation_id": "cr-1",
                                        "offering_id": "cbe-1"}}})
    }

    fn ends(bought: &str, now: &str) -> BTreeMap<String, (Option<DateTime<Utc>>, DateTime<Utc>)> {
        BTreeMap::from([("cr-1".to_string(), (Some(t(bought)), t(now)))])
    }

    #[test]
    fn an_extension_is_judged_bought_once_paid_announced_and_the_end_moved_by_its_hours() {
        // GIVEN capacity-pilot's one paid 24 h extension, announced, the end a day later
        let paid = [sold(Payment::Paid, false)];
        let announced = extended("2026-12-04T11:30:00Z", false);
        let moved = ends("2026-12-03T11:30:00Z", "2026-12-04T11:30:00Z");
        // WHEN 24 h are expected THEN it passes, saying so
        let (ok, detail) = judge_extended(24, &paid, &[&announced], &moved);
        assert!(ok, "{detail}");
        assert!(
            detail.contains("24 h paid")
                && detail.contains("moved from 12-03 11:30 to 12-04 11:30"),
            "{detail}"
        );
        // ... and 48 h expected fail
        assert!(!judge_extended(48, &paid, &[&announced], &moved).0);
        // ... as does no Reservation Extended of ours (only an external one), or one with
        // another end
        let external = extended("2026-12-04T11:30:00Z", true);
        let (ok, detail) = judge_extended(24, &paid, &[&external], &moved);
        assert!(
            !ok && detail.contains("no Reservation Extended"),
            "{detail}"
        );
        let other = extended("2026-12-05T11:30:00Z", false);
        assert!(!judge_extended(24, &paid, &[&other], &moved).0);
        // ... an end the emulator did not move
        let kept = ends("2026-12-03T11:30:00Z", "2026-12-03T11:30:00Z");
        let (ok, detail) = judge_extended(24, &paid, &[&announced], &kept);
        assert!(!ok && detail.contains("not the 24 h paid"), "{detail}");
        // ... a second extension bought and not paid (bought twice)
        let twice = [sold(Payment::Paid, false), sold(Payment::Pending, false)];
        let (ok, detail) = judge_extended(24, &twice, &[&announced], &moved);
        assert!(
            !ok && detail.contains("not paid: cbe-1 pending"),
            "{detail}"
        );
        // ... and an extension bought by hand is not capacity-pilot's
        let by_hand = [sold(Payment::Paid, true)];
        let (ok, detail) = judge_extended(24, &by_hand, &[], &moved);
        assert!(!ok && detail.contains("bought no extension"), "{detail}");
    }

    #[test]
    fn a_failed_extension_is_judged_by_its_event_its_fee_back_the_end_kept_and_the_spend() {
        // GIVEN capacity-pilot's extension whose payment failed, its whole fee returned, the
        // end kept, and the request's spend its block's fee
        let refused = [sold(Payment::Failed, false)];
        let said = failed("843.89");
        let kept = ends("2026-12-03T11:30:00Z", "2026-12-03T11:30:00Z");
        let fee: Decimal = "825.6".parse().unwrap();
        // WHEN judged THEN it passes, saying so
        let (ok, detail) = judge_extension_failed(&refused, &[&said], &[], &kept, fee, Some(fee));
        assert!(ok, "{detail}");
        assert!(
            detail.contains("$843.89 of its $843.89 fee returned")
                && detail.contains("keeps its end 12-03 11:30"),
            "{detail}"
        );
        // ... and fails when part of the fee stays spent
        let part = failed("800");
        assert!(!judge_extension_failed(&refused, &[&part], &[], &kept, fee, Some(fee)).0);
        // ... when no Extension Failed names it
        let (ok, detail) = judge_extension_failed(&refused, &[], &[], &kept, fee, Some(fee));
        assert!(
            !ok && detail.contains("no Capacity Extension Failed names cbe-1"),
            "{detail}"
        );
        // ... when the window was announced extended anyway, or its end moved
        let announced = extended("2026-12-04T11:30:00Z", false);
        assert!(
            !judge_extension_failed(&refused, &[&said], &[&announced], &kept, fee, Some(fee)).0
        );
        let moved = ends("2026-12-03T11:30:00Z", "2026-12-04T11:30:00Z");
        assert!(!judge_extension_failed(&refused, &[&said], &[], &moved, fee, Some(fee)).0);
        // ... when the request's spend kept the extension's fee, or it never ended
        let kept_fee: Decimal = "1669.49".parse().unwrap();
        let (ok, detail) =
            judge_extension_failed(&refused, &[&said], &[], &kept, fee, Some(kept_fee));
        assert!(
            !ok && detail.contains("not its reservations' fees $825.6"),
            "{detail}"
        );
        assert!(!judge_extension_failed(&refused, &[&said], &[], &kept, fee, None).0);
        // ... and when no payment failed at all (the scenario's failure never took)
        let paid = [sold(Payment::Paid, false)];
        assert!(!judge_extension_failed(&paid, &[&said], &[], &kept, fee, Some(fee)).0);
    }

    #[test]
    fn a_drain_follows_the_latest_paid_extension_to_the_end_the_emulator_holds_now() {
        // GIVEN a block extended by hand to 4 December, then by capacity-pilot to 5 December,
        // as the emulator now holds it (forced termination 30 min before its end)
        let first = sold(Payment::Paid, true);
        let mut second = sold(Payment::Paid, false);
        second.old_end = t("2026-12-04T11:30:00Z");
        second.new_end = t("2026-12-05T11:30:00Z");
        second.paid_at = Some(t("2026-12-03T14:35:00Z"));
        second.instances = vec![("i-1".into(), Some("2026-12-05T10:40:00Z".into()))];
        let current = Window {
            reservation_id: "cr-1".into(),
            segment: 0,
            start: t("2026-12-02T11:30:00Z"),
            end: t("2026-12-05T11:30:00Z"),
            forced: t("2026-12-05T11:00:00Z"),
            usable: t("2026-12-02T11:35:00Z"),
            fee: Decimal::ZERO,
            kind: "capacity-block".into(),
        };
        let paid = [&first, &second];
        // WHEN first drained 50 min before the current end THEN it followed, saying each step
        let (ok, notes) = drain_followed(&paid, &current, Some(t("2026-12-05T10:40:00Z")));
        assert!(ok, "{notes:?}");
        let text = notes.join("; ");
        assert!(
            text.contains("ending 12-03 11:30, extended by hand to 12-04 11:30"),
            "{text}"
        );
        assert!(
            text.contains("then by capacity-pilot to 12-05 11:30"),
            "{text}"
        );
        // ... but not when drained at the first extension's end (the latest one not followed)
        let (ok, notes) = drain_followed(&paid, &current, Some(t("2026-12-04T10:40:00Z")));
        assert!(!ok && notes.join(" ").contains("OLD end"), "{notes:?}");
        // ... nor after the current end's forced termination, nor never
        assert!(!drain_followed(&paid, &current, Some(t("2026-12-05T11:10:00Z"))).0);
        assert!(!drain_followed(&paid, &current, None).0);
        // ... nor when an instance still carries the old drain time
        let mut stale = second.clone();
        stale.instances = vec![("i-1".into(), Some("2026-12-04T10:40:00Z".into()))];
        let (ok, notes) =
            drain_followed(&[&first, &stale], &current, Some(t("2026-12-05T10:40:00Z")));
        assert!(
            !ok && notes
                .join(" ")
                .contains("i-1 (capacity-pilot:drain-at 2026-12-04T10:40:00Z)"),
            "{notes:?}"
        );
        // ... nor when the emulator's end is not the latest paid extension's
        let mut shorter = current.clone();
        shorter.end = t("2026-12-04T11:30:00Z");
        shorter.forced = t("2026-12-04T11:00:00Z");
        assert!(!drain_followed(&paid, &shorter, Some(t("2026-12-04T10:40:00Z"))).0);
    }
}
