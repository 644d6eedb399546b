//! The promises the simulation checks: after every moment (one reservation per window, the
//! ledger bounded, nothing foreign touched) and at the end of the run (the ledger exact, no
//! request lost, drains first, nothing on demand left running, the outbox honoured, inbound
//! events judged as delivered). Ground truth is the emulator's state; the store is read only
//! for what it claims (its ledger, its records' holds and statuses).

use std::collections::{BTreeMap, BTreeSet};

use capacity_pilot::domain::offering::Product;
use capacity_pilot::domain::request::RequestId;
use capacity_pilot::domain::request::{Strategy, WorkloadDetail};
use capacity_pilot::domain::reservation::Reservation;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::RequestRecord;
use capacity_pilot::ports::Store;
use chrono::{DateTime, TimeDelta, Utc};
use local_cloud::LocalCloud;
use local_cloud::ec2::Lifecycle;
use local_cloud::query::Query;
use local_cloud::sagemaker::plan_status;
use rust_decimal::Decimal;
use rust_decimal::prelude::ToPrimitive;
use serde_json::{Value, json};

use super::harness::{APPROVER, BUS, REGION, Sim};
use super::scenario::{Scenario, t0};

const REQUEST_TAG: &str = "capacity-pilot:request-id";

/// A reservation AWS sold, as the emulator holds it.
#[derive(Debug, Clone)]
pub struct Sold {
    pub request: String,
    pub id: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// Its end as bought: before any extension a team bought by hand in the console.
    pub bought_end: DateTime<Utc>,
    pub created: DateTime<Utc>,
    /// Its upfront fee in micro-USD, extensions included.
    pub fee: i64,
    /// Its upfront fee as bought, without any extension (each extension passes its own
    /// approval gate).
    pub bought_fee: i64,
    /// Not payment-failed (a block) or `Failed` (a plan): live, or paid and over.
    pub live_or_paid: bool,
    pub plan: bool,
    /// How many windows it covers: a plan's segments, a block's one.
    pub windows: usize,
    /// Its other name: a block's `cb-` id, a plan's name.
    pub alt: String,
    /// The offering a block was bought from (empty for a plan).
    pub offering: String,
    /// Extensions a team bought by hand in the console, not failed (offering id, fee in
    /// micro-USD): the team's, unless capacity-pilot adopted one in doubt (ARCHITECTURE
    /// §9.3), which it then paid for ([`counted`]).
    pub hand: Vec<(String, i64)>,
    /// Extensions bought through the API (capacity-pilot's): offering ids.
    pub extensions: Vec<String>,
}

/// A block the harness bought for a request behind the system's back (a purchase whose
/// record was lost): tagged for the request and this deployment, recorded nowhere.
#[derive(Debug, Clone)]
pub struct Stray {
    /// Which of the scenario's strays.
    pub planned: usize,
    pub id: String,
    pub request: String,
    /// When `DescribeCapacityReservations` lists it: bought, plus the listing lag.
    pub listed_at: DateTime<Utc>,
}

/// Whether `id` is a stray the harness bought.
fn is_stray(sim: &Sim, id: &str) -> bool {
    sim.strays.iter().any(|t| t.id == id)
}

/// Whether the table holds a reservation of `request` bought at `at`: by the invocation
/// that ran then.
fn bought_at(
    reservations: &BTreeMap<RequestId, Vec<Reservation>>,
    request: &str,
    at: DateTime<Utc>,
) -> bool {
    reservations
        .iter()
        .filter(|(k, _)| k.as_str() == request)
        .flat_map(|(_, v)| v)
        .any(|r| r.bought_at == Some(at))
}

/// What AWS sold for the requests that the system answers for: every tagged reservation
/// but a stray its request never recorded (the stray's own check judges that).
pub fn counted(sim: &Sim) -> Vec<Sold> {
    let reservations = sim.store.all_reservations();
    // Extensions capacity-pilot recorded as bought, its own: (reservation, offering). (One
    // awaiting approval, or being bought, names an offering a team may buy by hand first.)
    let ours: BTreeSet<(String, String)> = reservations
        .values()
        .flatten()
        .flat_map(|r| {
            r.extensions
                .iter()
                .filter(|e| {
                    use capacity_pilot::domain::extension::ExtensionState::{
                        PaymentPending, Succeeded,
                    };
                    matches!(e.state, PaymentPending | Succeeded)
                })
                .map(|e| (r.id.clone(), e.offer.offering_id.clone()))
        })
        .collect();
    sold(&sim.cloud)
        .into_iter()
        .filter(|s| {
            !is_stray(sim, &s.id)
                || reservations
                    .iter()
                    .any(|(k, v)| k.as_str() == s.request && v.iter().any(|r| s.names(&r.id)))
        })
        .map(|mut s| {
            // One bought by hand and adopted in doubt is capacity-pilot's: it paid for it.
            s.fee += s
                .hand
                .iter()
                .filter(|(o, _)| ours.contains(&(s.id.clone(), o.clone())))
                .map(|(_, f)| f)
                .sum::<i64>();
            s
        })
        .collect()
}

impl Sold {
    pub fn names(&self, id: &str) -> bool {
        self.id == id || self.alt == id
    }
}

/// Whether AWS reports reservation `id` extended (by anyone, its payment taken).
fn aws_extended(sim: &Sim, id: &str) -> bool {
    sim.cloud.with_world(|w| {
        w.ec2
            .reservations
            .get(id)
            .is_some_and(|c| c.extensions.iter().any(|e| e.status == "payment-succeeded"))
            || w.sm
                .plans
                .values()
                .any(|p| p.arn == id && p.extensions.iter().any(|e| e.paid))
    })
}

fn micros(d: Decimal) -> i64 {
    (d * Decimal::from(1_000_000))
        .ceil()
        .to_i64()
        .unwrap_or(i64::MAX)
}

/// A drain missed at `forced_at` is excused when cleanup was down for the whole drain
/// interval before it, and the miss was published: `Capacity Workload Drained` for
/// `reservation` with `late: true` and a reason.
fn late_drain_excused(
    sim: &Sim,
    bus: &[Value],
    rec: Option<&RequestRecord>,
    reservation: &str,
    forced_at: DateTime<Utc>,
) -> bool {
    let Some(rec) = rec else {
        return false;
    };
    let minutes = match rec.request.drain_minutes {
        0 => sim.config.default_drain_minutes,
        m => m,
    };
    let drain_at = forced_at - TimeDelta::minutes(i64::from(minutes));
    let mut t = drain_at;
    while t < forced_at {
        if !sim.scenario.down("cleanup-expired", t) || t >= sim.scenario.faults_end() {
            return false;
        }
        t += TimeDelta::minutes(1);
    }
    bus.iter().any(|e| {
        e["detail-type"] == "Capacity Workload Drained"
            && e["detail"]["reservation_id"] == reservation
            && e["detail"]["late"] == true
            && e["detail"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("late drain"))
    })
}

/// Every reservation tagged with a request id, by the emulator.
pub fn sold(cloud: &LocalCloud) -> Vec<Sold> {
    cloud.with_world(|w| {
        let mut out = Vec::new();
        for cr in w.ec2.reservations.values() {
            let Some(req) = cr.tags.get(REQUEST_TAG) else {
                continue;
            };
            // An extension bought by hand in the console is the team's, never counted.
            let ext: Decimal = cr
                .extensions
                .iter()
                .filter(|e| e.status != "payment-failed" && !e.by_hand)
                .map(|e| e.upfront_fee)
                .sum();
            out.push(Sold {
                request: req.clone(),
                id: cr.id.clone(),
                start: cr.start,
                end: cr.end,
                bought_end: cr
                    .extensions
                    .iter()
                    .filter(|e| e.by_hand && e.status == "payment-succeeded")
                    .map(|e| e.start)
                    .min()
                    .unwrap_or(cr.end),
                created: cr.created,
                fee: micros(cr.upfront_fee + ext),
                bought_fee: micros(cr.upfront_fee),
                live_or_paid: cr.state != "payment-failed",
                plan: false,
                windows: 1,
                alt: cr.block_id.clone(),
                offering: cr.offering_id.clone(),
                hand: cr
                    .extensions
                    .iter()
                    .filter(|e| e.by_hand && e.status != "payment-failed")
                    .map(|e| (e.offering_id.clone(), micros(e.upfront_fee)))
                    .collect(),
                extensions: cr
                    .extensions
                    .iter()
                    .filter(|e| !e.by_hand)
                    .map(|e| e.offering_id.clone())
                    .collect(),
            });
        }
        for p in w.sm.plans.values() {
            let tags = w.sm.tags.get(&p.arn).cloned().unwrap_or_default();
            let Some((_, req)) = tags.iter().find(|(k, _)| k == REQUEST_TAG) else {
                continue;
            };
            out.push(Sold {
                request: req.clone(),
                id: p.arn.clone(),
                start: p.offering.start(),
                end: p.offering.end(),
                bought_end: p
                    .extensions
                    .iter()
                    .filter(|e| e.by_hand && e.paid)
                    .map(|e| e.start)
                    .min()
                    .unwrap_or(p.offering.end()),
                created: p.created,
                // The plan's fee grows with each extension once paid: without them, and
                // with capacity-pilot's own not failed (as a block's, debited when bought).
                fee: micros(
                    p.offering.upfront_fee
                        - p.extensions
                            .iter()
                            .filter(|e| e.paid)
                            .map(|e| e.upfront_fee)
                            .sum::<Decimal>()
                        + p.extensions
                            .iter()
                            .filter(|e| !e.by_hand && !e.failed)
                            .map(|e| e.upfront_fee)
                            .sum::<Decimal>(),
                ),
                bought_fee: micros(
                    p.offering.upfront_fee
                        - p.extensions
                            .iter()
                            .filter(|e| e.paid)
                            .map(|e| e.upfront_fee)
                            .sum::<Decimal>(),
                ),
                live_or_paid: plan_status(p, w.now) != "Failed",
                plan: true,
                windows: p.offering.segments.len(),
                alt: p.name.clone(),
                offering: String::new(),
                hand: p
                    .extensions
                    .iter()
                    .filter(|e| e.by_hand && e.paid)
                    .map(|e| (e.offering_id.clone(), micros(e.upfront_fee)))
                    .collect(),
                extensions: p
                    .extensions
                    .iter()
                    .filter(|e| !e.by_hand)
                    .map(|e| e.offering_id.clone())
                    .collect(),
            });
        }
        out
    })
}

/// Resources of no request of this deployment, set up at the start, as they were then.
#[derive(Debug, Default)]
pub struct Foreign {
    /// Instance id -> its tags.
    pub instances: BTreeMap<String, BTreeMap<String, String>>,
    pub cluster: Option<String>,
}

impl Foreign {
    /// An untagged instance, one tagged for a request of this run's id but another
    /// deployment, and an untagged HyperPod cluster.
    pub fn set_up(cloud: &LocalCloud, scenario: &Scenario) -> Foreign {
        let mut f = Foreign::default();
        let first = scenario.requests[0].detail["request_id"]
            .as_str()
            .unwrap_or("sim")
            .to_string();
        let tag_sets: [Vec<(&str, String)>; 2] = [
            vec![("Name", "someone-elses".to_string())],
            vec![
                ("capacity-pilot:managed", "true".to_string()),
                ("capacity-pilot:deployment", "another-stack".to_string()),
                (REQUEST_TAG, first),
            ],
        ];
        cloud.with_world(|w| {
            let subnet = w.subnets(REGION).first().map(|s| s.id.clone());
            for tags in tag_sets {
                let mut q: Vec<(String, String)> = vec![
                    ("Action".into(), "RunInstances".into()),
                    (
                        "LaunchTemplate.LaunchTemplateName".into(),
                        "capacity-pilot-gpu".into(),
                    ),
                    ("InstanceType".into(), "g5.xlarge".into()),
                    ("MinCount".into(), "1".into()),
                    ("MaxCount".into(), "1".into()),
                    ("TagSpecification.1.ResourceType".into(), "instance".into()),
                ];
                if let Some(s) = &subnet {
                    q.push(("SubnetId".into(), s.clone()));
                }
                for (n, (k, v)) in tags.iter().enumerate() {
                    q.push((
                        format!("TagSpecification.1.Tag.{}.Key", n + 1),
                        k.to_string(),
                    ));
                    q.push((format!("TagSpecification.1.Tag.{}.Value", n + 1), v.clone()));
                }
                let body = serde_urlencoded::to_string(&q).expect("a form");
                let Ok(query) = Query::parse(body.as_bytes()) else {
                    continue;
                };
                let before: BTreeSet<String> = w.ec2.instances.keys().cloned().collect();
                if w.ec2_call(REGION, "RunInstances", &query).is_ok() {
                    for (id, i) in &w.ec2.instances {
                        if !before.contains(id) {
                            f.instances.insert(id.clone(), i.tags.clone());
                        }
                    }
                }
            }
            if w.sagemaker_call(
                REGION,
                "CreateCluster",
                &json!({"ClusterName": "foreign-cluster", "Tags": [{"Key": "team", "Value": "x"}]}),
            )
            .is_ok()
            {
                f.cluster = Some("foreign-cluster".to_string());
            }
        });
        f
    }

    fn touched(&self, cloud: &LocalCloud) -> Vec<String> {
        cloud.with_world(|w| {
            let mut out = Vec::new();
            for (id, tags) in &self.instances {
                match w.ec2.instances.get(id) {
                    Some(i) if i.state == "pending" || i.state == "running" => {
                        if &i.tags != tags {
                            out.push(format!("foreign instance {id}'s tags were changed"));
                        }
                    }
                    Some(i) => out.push(format!(
                        "foreign instance {id} (tags {tags:?}) is {}",
                        i.state
                    )),
                    None => out.push(format!("foreign instance {id} is gone")),
                }
            }
            if let Some(name) = &self.cluster {
                match w.sm.clusters.get(&(REGION.to_string(), name.clone())) {
                    Some(c) if c.groups.is_empty() => {}
                    Some(c) => out.push(format!(
                        "foreign cluster {name} has instance groups {:?}",
                        c.groups.iter().map(|g| g.name.clone()).collect::<Vec<_>>()
                    )),
                    None => out.push(format!("foreign cluster {name} is gone")),
                }
            }
            out
        })
    }
}

fn records(sim: &Sim) -> BTreeMap<String, RequestRecord> {
    sim.store
        .records()
        .into_iter()
        .map(|r| (r.request_id.to_string(), r))
        .collect()
}

/// The team of a request id: its record's, else the scenario's first request of that id.
fn team_of(sim: &Sim, recs: &BTreeMap<String, RequestRecord>, id: &str) -> String {
    // (Ledgers are the lower-cased team's, ARCHITECTURE §9.8.)
    if let Some(r) = recs.get(id) {
        return r.team.ledger().to_string();
    }
    sim.scenario
        .requests
        .iter()
        .find(|r| r.detail["request_id"] == id)
        .and_then(|r| r.detail["team"].as_str())
        .unwrap_or("?")
        .to_ascii_lowercase()
}

/// What each team's ledgers hold, one team whatever the case of its ledgers' keys: a team
/// split across ledgers by spelling would have a cap per spelling (review N8).
fn ledger(sim: &Sim) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for ((team, _month), v) in sim.store.ledger() {
        *out.entry(team.ledger().to_string()).or_default() += v.0;
    }
    out
}

/// What `team`'s ledgers from before §9.8 held at the start
/// ([`crate::scenario::Scenario::legacy_ledgers`]): spent before the run, in its cap.
fn spent_before(sim: &Sim, team: &str) -> i64 {
    sim.scenario
        .legacy_ledgers
        .iter()
        .filter(|(t, _)| t.to_ascii_lowercase() == team)
        .map(|(_, m)| m)
        .sum()
}

/// The on-demand part of what a record holds: an on-demand-first request's spend beyond its
/// open debit and its recorded reservations' fees. Every other request must have none.
fn on_demand_part(r: &RequestRecord, recorded_fees: i64) -> i64 {
    if r.request.strategy != Strategy::OnDemandFirst {
        return 0;
    }
    (r.spent.0 - r.open_debit.map_or(0, |d| d.0) - recorded_fees).max(0)
}

/// An ended on-demand or spot EC2 run is charged its actual instance-hours (ARCHITECTURE
/// §9.1: no run is settled above what it was seen to run): each instance from its launch to
/// its termination (or stop), by EC2, an hour begun counting whole, at its market's price,
/// within one hour per instance either way (the system sees a start and an end only at its
/// next look). A reclaimed spot instance, or an on-demand one never replaced, counts to
/// where it ended, not to the run's drain. A run is never charged above its held estimate
/// (instances x hours at its price), so the lower bound is at most that estimate: take-backs
/// and replacements can make EC2's sum larger (the ledger's known gap, not an overspend).
fn on_demand_hours_wrong(sim: &Sim, r: &RequestRecord, charged: i64) -> Option<String> {
    if !r.status.is_terminal() {
        return None;
    }
    let id = r.request_id.to_string();
    let cap = i64::from(r.request.duration_hours);
    let ran = sim.cloud.with_world(|w| {
        w.ec2
            .instances
            .values()
            .filter(|i| matches!(i.lifecycle, Lifecycle::OnDemand | Lifecycle::Spot))
            .filter(|i| i.tags.get(REQUEST_TAG) == Some(&id))
            .filter(|i| !sim.foreign.instances.contains_key(&i.id))
            .map(|i| {
                // Hours begun from its launch to `to`, at least one, at most the run's.
                let hours_to = |to: DateTime<Utc>| {
                    let secs = (to - i.launch_time).num_seconds();
                    (secs.div_euclid(3600) + i64::from(secs % 3600 != 0)).clamp(1, cap)
                };
                let ended = i.terminated_at.unwrap_or(w.now);
                let hours = hours_to(ended);
                // What could be seen of it: an end while replace-unhealthy (which sees
                // ends) was down is first seen when it is back.
                let seen = hours_to(seen_end(sim, ended).min(w.now));
                (
                    hours,
                    seen,
                    i.lifecycle == Lifecycle::Spot,
                    i.instance_type.clone(),
                )
            })
            .collect::<Vec<_>>()
    });
    if ran.is_empty() {
        return None;
    }
    let (mut lo, mut hi, mut hours) = (0, 0, 0);
    let mut estimates = BTreeMap::new();
    let whole = i64::from(r.request.instance_count) * cap;
    for (h, seen, spot, ty) in &ran {
        let price = if *spot {
            sim.config.prices.spot(ty)
        } else {
            sim.config.prices.on_demand(ty)
        }?
        .to_micros_ceil()
        .0;
        lo += (h - 1).max(1) * price;
        hi += (seen + 1) * price;
        hours += h;
        estimates.insert(*spot, whole * price);
    }
    let lo = lo.min(estimates.values().sum());
    let n = ran.len();
    (charged < lo || charged > hi).then(|| {
        format!(
            "ledger exact: {id}'s {n} on-demand or spot instance(s) ran {hours} instance-hours \
             by EC2 but it is charged {charged} micro-USD, outside [{lo}, {hi}]"
        )
    })
}

/// When an instance that ended at `ended` could first be seen ended: at once, or when
/// replace-unhealthy, down then, is back.
fn seen_end(sim: &Sim, ended: DateTime<Utc>) -> DateTime<Utc> {
    sim.scenario
        .outages
        .iter()
        .filter(|o| o.function == "replace-unhealthy" && o.covers(ended))
        .map(|o| t0() + TimeDelta::minutes(o.from + o.minutes))
        .fold(ended, DateTime::max)
}

/// The fees of a record's recorded reservations that AWS sold live-or-paid.
fn recorded_fees(
    reservations: &BTreeMap<
        capacity_pilot::domain::request::RequestId,
        Vec<capacity_pilot::domain::reservation::Reservation>,
    >,
    sold: &[Sold],
    r: &RequestRecord,
) -> i64 {
    reservations
        .get(&r.request_id)
        .map(|rs| {
            rs.iter()
                .filter(|x| sold.iter().any(|s| s.live_or_paid && s.names(&x.id)))
                .map(|x| {
                    // Its extensions' debits too (a failed one's went back).
                    x.upfront_fee.to_micros_ceil().0
                        + x.extensions.iter().map(|e| e.debited.0).sum::<i64>()
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Per team: (truth, holds) in micro-USD. Truth: the fees of what AWS sold live-or-paid.
/// Holds: open debits, payment failures the store may not have seen, on-demand spend.
fn money(sim: &Sim, sold: &[Sold]) -> BTreeMap<String, (i64, i64)> {
    let recs = records(sim);
    let reservations = sim.store.all_reservations();
    let mut out: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for s in sold {
        let team = team_of(sim, &recs, &s.request);
        let e = out.entry(team).or_default();
        if s.live_or_paid {
            e.0 += s.fee;
        } else {
            e.1 += s.fee;
        }
    }
    for r in recs.values() {
        let fees = recorded_fees(&reservations, sold, r);
        let kept = unverified(sim, r, fees);
        // An extension being bought holds its debit until AWS lists it (or, past the doubt
        // window, does not: then it goes back), and one whose payment is pending until its
        // failure, if it fails, is read.
        let buying: i64 = reservations
            .get(&r.request_id)
            .into_iter()
            .flatten()
            .flat_map(|x| x.extensions.iter())
            .filter(|e| {
                use capacity_pilot::domain::extension::ExtensionState::{Buying, PaymentPending};
                matches!(e.state, Buying | PaymentPending)
            })
            .map(|e| e.debited.0)
            .sum();
        let e = out.entry(r.team.ledger().to_string()).or_default();
        e.1 += r.open_debit.map_or(0, |d| d.0) + on_demand_part(r, fees + kept) + kept + buying;
    }
    out
}

/// What a request keeps spent for a purchase in doubt that no reconciliation could settle
/// before its offering ended (ARCHITECTURE §9.1: kept for a person to check against the
/// bill, the harsher reading of a block that may no longer be listed once expired).
fn unverified(sim: &Sim, r: &RequestRecord, fees: i64) -> i64 {
    let id = r.request_id.as_str();
    if !sim.unverified.contains(id) {
        return 0;
    }
    // An on-demand-first request's spend is its run's too (a spot run that fell back, then
    // bought in doubt): only what the doubt held is kept unverified.
    if r.request.strategy == Strategy::OnDemandFirst {
        return sim.doubt_debits.get(id).copied().unwrap_or(0);
    }
    (r.spent.0 - r.open_debit.map_or(0, |d| d.0) - fees).max(0)
}

/// The promises that hold after every moment.
/// One name, one request at a time (ARCHITECTURE §9.8): of two recorded requests naming one
/// endpoint or HyperPod group in a region, no reservations AWS sold them (live, or paid and
/// over) overlap in time, and no two live claims overlap: a live request's (or one ended in
/// doubt) over its whole interval, an ended one's over its sold windows not yet over.
fn one_name_one_request(
    sim: &Sim,
    recs: &BTreeMap<String, RequestRecord>,
    sold: &[Sold],
) -> Vec<String> {
    use capacity_pilot::workload::claims::keys;
    let now = sim.cloud.now();
    let mut out = Vec::new();
    let paid = |id: &str| -> Vec<&Sold> {
        sold.iter()
            .filter(|s| s.request == id && s.live_or_paid)
            .collect()
    };
    let holds = |r: &RequestRecord| -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
        if !r.status.is_terminal() || r.in_doubt() {
            return vec![(r.request.window.earliest_start, r.request.window.latest_end)];
        }
        paid(r.request_id.as_str())
            .into_iter()
            .filter(|s| s.end > now)
            .map(|s| (s.start, s.end))
            .collect()
    };
    let list: Vec<&RequestRecord> = recs.values().collect();
    for (i, a) in list.iter().enumerate() {
        for b in list.iter().skip(i + 1) {
            let shared = keys(&a.request)
                .into_iter()
                .map(|(k, _)| k)
                .find(|k| keys(&b.request).iter().any(|(l, _)| l == k));
            let Some(key) = shared else { continue };
            let (x, y) = (a.request_id.as_str(), b.request_id.as_str());
            for p in paid(x) {
                for q in paid(y)
                    .into_iter()
                    .filter(|q| p.start < q.end && q.start < p.end)
                {
                    out.push(format!(
                        "one name, one request at a time: {x}'s {} and {y}'s {} overlap, both \
                         for {key}",
                        p.id, q.id
                    ));
                }
            }
            for (f, t) in holds(a) {
                for (g, u) in holds(b).into_iter().filter(|(g, u)| f < *u && *g < t) {
                    out.push(format!(
                        "no overlapping live claims: {x} ({}) holds {key} {f}..{t} and {y} ({}) \
                         holds it {g}..{u}",
                        a.status, b.status
                    ));
                }
            }
        }
    }
    out
}

pub fn per_step(sim: &Sim) -> Vec<String> {
    let mut out = Vec::new();
    let sold = counted(sim);
    let recs = records(sim);
    out.extend(one_name_one_request(sim, &recs, &sold));
    // One reservation per window: a request's live-or-paid reservations cover no more
    // windows than it has (a plan covers its segments), and no two of them overlap in time.
    // (A stray was bought behind the system's back, for no window it decided: one listed
    // late may stand beside the plan it bought meanwhile. The ledger holds it to its fee.)
    let mut by_request: BTreeMap<&str, Vec<&Sold>> = BTreeMap::new();
    for s in sold
        .iter()
        .filter(|s| s.live_or_paid && !is_stray(sim, &s.id))
    {
        by_request.entry(&s.request).or_default().push(s);
    }
    for (id, list) in &by_request {
        // While a purchase runs, its plan's offerings may be bought beside what is recorded
        // (a split's later block in doubt after its first was recorded).
        let windows = recs
            .get(*id)
            .map_or(1, |r| {
                r.windows.len()
                    + if r.status == RequestStatus::Purchasing {
                        r.candidates.first().map_or(0, |p| p.offerings.len())
                    } else {
                        0
                    }
            })
            .max(1);
        let reservations = list.len();
        let covered: usize = list.iter().map(|s| s.windows).sum();
        if reservations > 1 && covered > windows {
            out.push(format!(
                "one reservation per window: {id} holds {reservations} live-or-paid \
                 reservations for {windows} window(s): {:?}",
                list.iter().map(|s| &s.id).collect::<Vec<_>>()
            ));
        }
        for (a, x) in list.iter().enumerate() {
            for y in list.iter().skip(a + 1) {
                // (As bought: a team's own extension in the console may run into the next.)
                if x.start < y.bought_end && y.start < x.bought_end {
                    out.push(format!(
                        "one reservation per window: {id}'s {} and {} overlap",
                        x.id, y.id
                    ));
                }
            }
        }
    }
    // Reserved with what serves it: a `Reserved` request's recorded reservations of its
    // types, count, regions and window cover its duration (a split's blocks together). One
    // whose payment failed counts: too late to replace, the rest is kept and runs.
    let reservations = sim.store.all_reservations();
    for r in recs
        .values()
        .filter(|r| r.status == RequestStatus::Reserved)
    {
        let want = &r.request;
        let minutes: i64 = reservations
            .iter()
            .filter(|(k, _)| **k == r.request_id)
            .flat_map(|(_, v)| v)
            .filter(|x| {
                want.instance_types.contains(&x.instance_type)
                    && want.regions.contains(&x.region)
                    && x.instance_count >= want.instance_count
                    && x.start() >= want.window.earliest_start
                    // (Its extensions may take it past the window: counted within it.)
                    && (x.end() <= want.window.latest_end
                        || x.extensions.iter().any(|e| {
                            e.state == capacity_pilot::domain::extension::ExtensionState::Succeeded
                        })
                        || aws_extended(sim, &x.id))
            })
            .flat_map(|x| &x.segments)
            .map(|g| (g.end.min(want.window.latest_end) - g.start).num_minutes())
            .sum();
        // A spot run that fell back served part of it (ARCHITECTURE §9.1): whole hours from
        // its start to its fall-back, by the run's record.
        let needed = i64::from(want.duration_hours) * 60 - r.served().num_minutes();
        if minutes < needed {
            out.push(format!(
                "reserved with what serves it: {} is Reserved, but what it holds of its types, \
                 count and window covers {minutes} of the {needed} min it needs",
                r.request_id,
            ));
        }
    }
    // The ledger is bounded: truth <= ledger <= truth + holds.
    let led = ledger(sim);
    for (team, (truth, holds)) in money(sim, &sold) {
        let l = led.get(&team).copied().unwrap_or(0) - spent_before(sim, &team);
        if l < truth {
            out.push(format!(
                "ledger bounded: {team}'s ledger {l} is below what AWS sold, {truth} (micro-USD)"
            ));
        }
        if l > truth + holds {
            out.push(format!(
                "ledger bounded: {team}'s ledger {l} exceeds what AWS sold ({truth}) plus the \
                 holds ({holds}) (micro-USD)"
            ));
        }
    }
    // The TTL rule (ARCHITECTURE §9.1), stated here apart from the product's: a request
    // holding a window not ended is never archived, whatever its status, and neither is an
    // ended one whose purchase is in doubt (its debit and its hourly reconciliation live in
    // the record); a request that ended otherwise is archived in the write that ended it.
    for r in recs.values() {
        let live_window = r
            .windows
            .iter()
            .any(|w| w.state != capacity_pilot::domain::window::WindowState::Ended);
        let in_doubt = r.status.is_terminal() && r.doubt.is_some();
        let expires = sim.store.expires_at(&r.request_id);
        if live_window && let Some(at) = expires {
            out.push(format!(
                "no TTL while a window lives: {} ({}) holds a window not ended and expires at {at}",
                r.request_id, r.status
            ));
        }
        if in_doubt && let Some(at) = expires {
            out.push(format!(
                "no TTL while a purchase is in doubt: {} ({}) ended with its purchase in doubt \
                 and expires at {at}",
                r.request_id, r.status
            ));
        }
        if r.status.is_terminal() && !live_window && !in_doubt && expires.is_none() {
            out.push(format!(
                "an ended request is archived: {} is {}, holds no live window and no doubt, and \
                 has no TTL",
                r.request_id, r.status
            ));
        }
    }
    // A purchase ends (ARCHITECTURE §9.1): nothing stays `Purchasing` past its purchase
    // deadline and the doubt window. A takeover comes a lease after the last worker's, and
    // one may wait out the doubt of a call made just before the deadline; allowed besides:
    // two more leases for takeovers a fault or crash cut short, and any time the purchase
    // function was down.
    let now = sim.cloud.now();
    for r in recs
        .values()
        .filter(|r| r.status == RequestStatus::Purchasing)
    {
        let deadline = capacity_pilot::purchase::protocol::purchase_deadline(r);
        let lease = capacity_pilot::purchase::protocol::LEASE;
        let bound = deadline + capacity_pilot::domain::time_rules::IN_DOUBT_WINDOW + lease * 4;
        let down = sim.scenario.outages.iter().any(|o| {
            o.function == "purchase-capacity"
                && t0() + TimeDelta::minutes(o.from + o.minutes) > deadline
        });
        if now > bound && !down {
            out.push(format!(
                "a purchase ends: {} is still Purchasing at {now}, past its purchase deadline \
                 {deadline} and the doubt window ({})",
                r.request_id, r.reason
            ));
        }
    }
    out.extend(sim.foreign.touched(&sim.cloud));
    out
}

fn ours<'a>(events: &'a [Value], detail_type: &str, id: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["detail-type"] == detail_type && e["detail"]["request_id"] == id)
        .collect()
}

/// Whether the event's `request_id` is `id`, ignoring case as request ids compare.
/// The segment ends AWS reports now of each reservation a team extended in the console.
fn aws_ends(sim: &Sim) -> BTreeMap<String, Vec<DateTime<Utc>>> {
    sim.cloud.with_world(|w| {
        sim.extended
            .iter()
            .filter_map(|(id, _)| {
                if let Some(cr) = w.ec2.reservations.get(id) {
                    return Some((id.clone(), vec![cr.end]));
                }
                let p = w.sm.plans.values().find(|p| p.arn == *id)?;
                Some((
                    id.clone(),
                    p.offering.segments.iter().map(|s| s.end).collect(),
                ))
            })
            .collect()
    })
}

/// How much earlier than now reservation `id` ended as AWS had it paid at `at`, and when
/// the last payment after `at` that moved it cleared: each extension paid after `at` (or
/// not yet) had not moved its end then. `None` when nothing paid after `at` moved it.
fn unpaid_at(sim: &Sim, id: &str, at: DateTime<Utc>) -> Option<(TimeDelta, DateTime<Utc>)> {
    sim.cloud.with_world(|w| {
        // (end, paid at) of each extension that moved the end, in end order.
        let moves: Vec<(DateTime<Utc>, DateTime<Utc>, DateTime<Utc>)> =
            if let Some(cr) = w.ec2.reservations.get(id) {
                cr.extensions
                    .iter()
                    .filter(|e| e.status == "payment-succeeded")
                    .filter_map(|e| Some((e.start, e.end, e.paid_at?)))
                    .collect()
            } else {
                let p = w.sm.plans.values().find(|p| p.arn == id)?;
                p.extensions
                    .iter()
                    .filter(|e| e.paid)
                    .map(|e| (e.start, e.end, e.paid_at))
                    .collect()
            };
        let later: Vec<&(DateTime<Utc>, DateTime<Utc>, DateTime<Utc>)> =
            moves.iter().filter(|(_, _, paid)| *paid > at).collect();
        let first = later.iter().map(|(start, ..)| *start).min()?;
        let last = later.iter().map(|(_, end, _)| *end).max()?;
        let cleared = later.iter().map(|(.., paid)| *paid).max()?;
        Some((last - first, cleared))
    })
}

/// Whether the submitted `detail` is `planned`'s: the same but for the budget (a cap set
/// at the quote just before it went).
fn same_submission(detail: &Value, planned: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("budget");
        }
        v
    };
    strip(detail) == strip(planned)
}

fn same_id(v: &Value, id: &str) -> bool {
    v.as_str().is_some_and(|v| v.eq_ignore_ascii_case(id))
}

fn time(v: &Value) -> Option<DateTime<Utc>> {
    v.as_str()?.parse().ok()
}

/// The promises that hold at the end of the run, after the settling period.
/// ARCHITECTURE §9.7: while an operator's pause stands, no purchase lease is taken (a
/// takeover of one begun before it goes on) and no on-demand or spot estimate is held.
fn nothing_begun_while_paused(sim: &Sim) -> Vec<String> {
    let paused = |at: DateTime<Utc>| {
        sim.scenario.pauses.iter().any(|(from, to)| {
            t0() + TimeDelta::minutes(*from) <= at && at < t0() + TimeDelta::minutes(*to)
        })
    };
    let mut out = Vec::new();
    for (id, entries) in sim.store.all_history() {
        for h in entries {
            let lease =
                h.to == RequestStatus::Purchasing && h.from != Some(RequestStatus::Purchasing);
            let hold = h.reason.starts_with("on-demand-first: holding the");
            if (lease || hold) && paused(h.at) {
                out.push(format!(
                    "{id}: {} at {} while purchases were paused: {}",
                    if lease {
                        "a purchase lease taken"
                    } else {
                        "an estimate held"
                    },
                    h.at,
                    h.reason
                ));
            }
        }
    }
    out
}

pub async fn at_end(sim: &Sim) -> Vec<String> {
    let mut out = nothing_begun_while_paused(sim);
    let sold = counted(sim);
    let recs = records(sim);
    let bus: Vec<Value> = sim.cloud.events(BUS);
    let end = sim.cloud.now();

    // A HyperPod group is removed after its request's last window (review aws-reality-2,
    // Task 3 #4): none is left on a cluster pointing at a plan that has ended, which every
    // later update of the cluster would send back.
    sim.cloud.with_world(|w| {
        for c in w.sm.clusters.values() {
            for g in c.groups.iter().filter(|g| !g.deleting) {
                let ended = g.plan_arn.as_ref().and_then(|arn| {
                    w.sm.plans
                        .values()
                        .find(|p| &p.arn == arn)
                        .map(|p| local_cloud::sagemaker::plan_status(p, end))
                        .filter(|s| !["Scheduled", "Active", "Pending"].contains(s))
                });
                if let Some(status) = ended {
                    out.push(format!(
                        "a HyperPod group was left on an ended plan: {}/{} on {} ({status})",
                        c.name,
                        g.name,
                        g.plan_arn.as_deref().unwrap_or_default()
                    ));
                }
            }
        }
    });

    // The ledger is exact: no holds left, and it equals what AWS sold plus on-demand spend.
    let reservations = sim.store.all_reservations();
    // An extension is bought once (ARCHITECTURE §9.3): every extension AWS sold through the
    // API is recorded, by its offering, on its reservation (one bought twice would be a
    // second, unrecorded); and none recorded as bought is missing from AWS.
    for s in &sold {
        let recorded: Vec<&capacity_pilot::domain::extension::Extension> = reservations
            .values()
            .flatten()
            .filter(|r| s.names(&r.id))
            .flat_map(|r| r.extensions.iter())
            .collect();
        for o in &s.extensions {
            if !recorded.iter().any(|e| e.offer.offering_id == *o) {
                out.push(format!(
                    "an extension is bought once: AWS sold extension {o} of {} ({}), which \
                     no record of capacity-pilot's holds",
                    s.id, s.request
                ));
            }
        }
        for e in recorded.iter().filter(|e| {
            matches!(
                e.state,
                capacity_pilot::domain::extension::ExtensionState::PaymentPending
                    | capacity_pilot::domain::extension::ExtensionState::Succeeded
            )
        }) {
            let o = &e.offer.offering_id;
            if !s.extensions.contains(o) && !s.hand.iter().any(|(h, _)| h == o) {
                out.push(format!(
                    "an extension is bought once: {}'s extension {} ({o}) is recorded {} but \
                     AWS sold no such extension",
                    s.id,
                    e.number,
                    e.state.as_str()
                ));
            }
        }
    }
    // A paid window is served to its drain whatever becomes of its request (ARCHITECTURE
    // §9.1): by the end, every window of every request (Failed, Rejected and Cancelled ones
    // included) whose segment has ended is ended too, launched, drained and cleaned up or
    // ended with its reason, not left pending or running in a request nothing looks at.
    for r in recs.values() {
        for w in &r.windows {
            if w.state == capacity_pilot::domain::window::WindowState::Ended {
                continue;
            }
            let seg_end = reservations
                .get(&r.request_id)
                .and_then(|list| list.iter().find(|x| x.id == w.reservation_id()))
                .and_then(|x| {
                    let i: usize = w.key.rsplit_once('#')?.1.parse().ok()?;
                    x.segments.get(i).map(|g| g.end)
                });
            if let Some(seg_end) = seg_end.filter(|e| *e <= end) {
                out.push(format!(
                    "a paid window is served to its drain: {} ({}) left its window {} {} past \
                     its end at {seg_end}",
                    r.request_id, r.status, w.key, w.state
                ));
            }
        }
    }
    out.extend(lead_notices(sim, &recs, &bus, end).await);
    // A terminal request buys nothing (ARCHITECTURE §9.1): nothing AWS sold for a request
    // (but the harness's strays) was bought after it first reached an ended status.
    for r in recs.values().filter(|r| r.status.is_terminal()) {
        let history = sim.store.history(&r.request_id).await.unwrap_or_default();
        let Some(ended) = history.iter().find(|h| h.to.is_terminal()).map(|h| h.at) else {
            continue;
        };
        for s in sold.iter().filter(|s| {
            s.request == r.request_id.as_str() && s.created > ended && !is_stray(sim, &s.id)
        }) {
            out.push(format!(
                "a terminal request buys nothing: {} ended at {ended} ({}), and {} was bought \
                 for it at {}",
                r.request_id, r.status, s.id, s.created
            ));
        }
    }
    // A purchase in doubt is found once listed (ARCHITECTURE §9.1): a request that ended with
    // its purchase in doubt is reconciled hourly until the doubted offerings end, so what AWS
    // sold it and lists (readable) an hour or more before the run's end, and before its own
    // end, is in its record: its window is served, not only announced as unrecorded.
    let lag = TimeDelta::seconds(sim.scenario.timings.listing_lag_seconds);
    for s in sold.iter().filter(|s| {
        sim.ended_in_doubt.contains(&s.request) && s.live_or_paid && !is_stray(sim, &s.id)
    }) {
        let mut readable = s.created + lag;
        if sim.scenario.reconcile_outage {
            readable = readable.max(sim.scenario.faults_end());
        }
        let hour = TimeDelta::hours(1);
        let recorded = reservations
            .iter()
            .any(|(k, v)| k.as_str() == s.request && v.iter().any(|r| r.id == s.id));
        if readable + hour < end && readable + hour < s.end && !recorded {
            out.push(format!(
                "a purchase in doubt is found once listed: {} ended in doubt, and {} bought for \
                 it (listed from {readable}, ends {}) is not in its record at {end}",
                s.request, s.id, s.end
            ));
        }
    }
    // A stray is adopted: once listed, the next purchase lease its request takes reconciles
    // it into the request's record (and its fee into the ledger, which the ledger's checks
    // then hold to).
    for t in sim
        .strays
        .iter()
        .filter(|t| !sim.ended_in_doubt.contains(&t.request))
    {
        // While reconciliation is refused (the scenario's outage of it, to the faults' end),
        // no lease can adopt anything: one after it must.
        let readable = if sim.scenario.reconcile_outage {
            t.listed_at.max(sim.scenario.faults_end())
        } else {
            t.listed_at
        };
        // A lease a takeover later released without asking AWS (none of the purchase's
        // leases called it) never reconciled: the detector announces what it left (seed 746).
        let purchased_after = sim.lease_times.iter().any(|(id, at)| {
            *id == t.request
                && *at >= readable
                && !sim
                    .uncalled_releases
                    .iter()
                    .any(|(r, released)| r == id && released >= at)
        });
        let live = self::sold(&sim.cloud)
            .iter()
            .any(|s| s.id == t.id && s.live_or_paid);
        let recorded = reservations
            .iter()
            .any(|(k, v)| k.as_str() == t.request && v.iter().any(|r| r.id == t.id));
        if purchased_after && live && !recorded {
            out.push(format!(
                "a stray is adopted: {} of {}, listed at {}, is recorded nowhere though a \
                 purchase of the request began after",
                t.id, t.request, t.listed_at
            ));
        }
    }
    // A refusal ends what it can: a purchase AWS refused for good, with nothing of the plan
    // bought in that invocation, fails the request (nothing else is tried under the
    // refusal); after a split's first block was bought in it, the request searches for a
    // replacement segment instead, so the block it keeps can still serve. (A kept
    // cancellation, a lost lease or a duplicate event decides it otherwise; so does what it
    // keeps, its blocks and the strays adopted beside its plan, when that already serves
    // it: it is `reserved`, which the check that a `Reserved` request is served holds.)
    for (at, id, action) in &sim.refusals {
        let (want, what) = if bought_at(&reservations, id, *at) {
            ("re-search", "with a block of its split bought")
        } else {
            ("failed", "with nothing of its plan bought")
        };
        if ![want, "reserved", "cancelled", "lease-lost", "duplicate"].contains(&action.as_str()) {
            out.push(format!(
                "a refusal ends what it can: {id}'s purchase refused for good at {at}, {what}, \
                 was decided `{action}`, not `{want}`"
            ));
        }
    }
    let led = ledger(sim);
    let mut expect: BTreeMap<String, i64> = BTreeMap::new();
    for (team, _) in &sim.scenario.legacy_ledgers {
        let team = team.to_ascii_lowercase();
        let before = spent_before(sim, &team);
        expect.insert(team, before);
    }
    for s in sold.iter().filter(|s| s.live_or_paid) {
        *expect.entry(team_of(sim, &recs, &s.request)).or_default() += s.fee;
    }
    for r in recs.values() {
        if let Some(d) = r.open_debit {
            out.push(format!(
                "ledger exact: {} still holds an open debit of {} micro-USD",
                r.request_id, d.0
            ));
        }
        if r.doubt.is_some() {
            out.push(format!(
                "ledger exact: {} still records a purchase in doubt",
                r.request_id
            ));
        }
        let fees = recorded_fees(&reservations, &sold, r);
        let kept = unverified(sim, r, fees);
        let od = on_demand_part(r, fees + kept);
        *expect.entry(r.team.ledger().to_string()).or_default() += od + kept;
        if let Some(why) = on_demand_hours_wrong(sim, r, od) {
            out.push(why);
        }
        if r.request.strategy != Strategy::OnDemandFirst && r.spent.0 != fees + kept {
            out.push(format!(
                "ledger exact: {} is charged {} micro-USD, but AWS sold it {} (micro-USD) \
                 and it runs nothing on demand",
                r.request_id, r.spent.0, fees
            ));
        }
    }
    for team in led.keys().chain(expect.keys()).collect::<BTreeSet<_>>() {
        let l = led.get(team).copied().unwrap_or(0);
        let e = expect.get(team).copied().unwrap_or(0);
        if l != e {
            out.push(format!(
                "ledger exact: {team}'s ledger is {l} micro-USD; AWS sold it {e} \
                 (on-demand spend included)"
            ));
        }
    }
    // Caps are exceeded only through adoptions published as Unrecorded.
    let unrecorded: BTreeSet<String> = bus
        .iter()
        .filter(|e| e["detail-type"] == "Capacity Reservation Unrecorded")
        .filter_map(|e| e["detail"]["request_id"].as_str().map(str::to_string))
        .collect();
    for r in recs.values() {
        // (Its extensions spend within `extend.max_upfront_usd`, on top: ARCHITECTURE §9.3.)
        let cap = r.request.budget.max_upfront.to_micros_ceil().0
            + r.request
                .extend
                .as_ref()
                .map_or(0, |p| p.max_upfront_usd.to_micros_ceil().0);
        if r.spent.0 > cap && !unrecorded.contains(&r.request_id.to_string()) {
            out.push(format!(
                "cap: {} spent {} micro-USD over its cap of {cap} with no Unrecorded adoption",
                r.request_id, r.spent.0
            ));
        }
    }
    for (team, l) in &led {
        let cap = sim
            .config
            .team_budgets
            .cap_for(&capacity_pilot::domain::request::Team::parse(team).expect("a team"))
            .map(|c| c.to_micros_ceil().0);
        let adopted = recs.values().any(|r| {
            r.team.ledger().to_string() == *team && unrecorded.contains(&r.request_id.to_string())
        });
        if let Some(cap) = cap
            && *l > cap
            && !adopted
        {
            out.push(format!(
                "cap: {team} spent {l} micro-USD over its monthly cap of {cap} with no \
                 Unrecorded adoption"
            ));
        }
    }

    // An ending tells what was spent: a request's last `Capacity Request Failed` (failed or
    // cancelled) gives the spend the table ends with, less what each `Capacity Payment
    // Failed` after it returned (a kept block's payment fails after its request ended:
    // ARCHITECTURE §9.1).
    let usd_at = |v: &Value| {
        // `Usd` is always written as a decimal string.
        v.as_str()
            .and_then(|v| v.parse::<Decimal>().ok())
            .map(micros)
    };
    for r in recs.values().filter(|r| r.status.is_terminal()) {
        let id = r.request_id.to_string();
        if unrecorded.contains(&id) {
            continue;
        }
        let Some(at) = bus.iter().rposition(|e| {
            e["detail-type"] == "Capacity Request Failed" && e["detail"]["request_id"] == id
        }) else {
            continue;
        };
        let last = &bus[at];
        let returned: i64 = ours(&bus[at..], "Capacity Payment Failed", &id)
            .iter()
            .filter_map(|e| usd_at(&e["detail"]["returned_usd"]))
            .sum();
        let told = usd_at(&last["detail"]["spent_usd"]).map(|t| t - returned);
        if told != Some(r.spent.0) {
            out.push(format!(
                "ending spend: {id}'s last Capacity Request Failed gives spent_usd {}, less \
                 {returned} micro-USD returned by later failed payments, but it ends having \
                 spent {} micro-USD",
                last["detail"]["spent_usd"], r.spent.0
            ));
        }
    }

    // One id ignoring case (review N15): no two requests recorded whose ids differ only in
    // case (SageMaker may take their names for one).
    let mut folded: BTreeMap<String, &str> = BTreeMap::new();
    for id in recs.keys() {
        if let Some(other) = folded.insert(id.to_ascii_lowercase(), id) {
            out.push(format!(
                "one id ignoring case: requests {other} and {id} are both recorded"
            ));
        }
    }

    // No request lost.
    let dlq_ids: BTreeSet<String> = sim
        .dlq
        .iter()
        .filter(|e| e["detail-type"] == "Capacity Request Submitted")
        .filter_map(|e| e["detail"]["request_id"].as_str().map(str::to_string))
        .collect();
    for planned in &sim.scenario.requests {
        let id = planned.detail["request_id"].as_str().unwrap_or_default();
        let rejected = !ours(&bus, "Capacity Request Rejected", id).is_empty();
        if !planned.invalid.is_empty() {
            // Rejected, naming every field at fault (unless the id was taken first).
            let named: BTreeSet<String> = ours(&bus, "Capacity Request Rejected", id)
                .iter()
                .flat_map(|e| {
                    e["detail"]["problems"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|p| p["field"].as_str().map(str::to_string))
                .collect();
            // This submission, not another of the same id (seed 1283: a valid-looking one of
            // the same id, rejected for its own field, was taken for it while its own went
            // to the DLQ); its max_upfront_usd may be set at the quote when submitted.
            let delivered = sim.delivered.iter().any(|d| {
                d.handled
                    && d.event["detail-type"] == "Capacity Request Submitted"
                    && same_submission(&d.event["detail"], &planned.detail)
            });
            if delivered && !recs.contains_key(id) {
                for f in &planned.invalid {
                    if !named.contains(*f) {
                        out.push(format!(
                            "rejected naming every field: {id}'s rejection does not name {f} \
                             (it names {named:?})"
                        ));
                    }
                }
            }
            continue;
        }
        match recs.get(id) {
            Some(r) => {
                // Due in the work index: at its own next action or its windows' (a window
                // drained early by stop_running is next due at its end, to be cleaned up).
                let waiting = r.due_at().is_some_and(|t| t > end) && !r.reason.is_empty();
                if !r.status.is_terminal() && !waiting {
                    out.push(format!(
                        "no request lost: {id} is {} with no future next action ({:?}), \
                         reason {:?}",
                        r.status,
                        r.due_at(),
                        r.reason
                    ));
                }
                if r.reason.is_empty() {
                    out.push(format!("no request lost: {id} has no recorded reason"));
                }
            }
            None => {
                let cancelled_first = sim.delivered.iter().any(|d| {
                    d.event["detail-type"] == "Capacity Request Cancelled"
                        && same_id(&d.event["detail"]["request_id"], id)
                });
                if !dlq_ids.contains(id) && !rejected && !cancelled_first {
                    out.push(format!(
                        "no request lost: {id} was submitted, is not in the DLQ, and has no record"
                    ));
                }
            }
        }
    }

    // Drains came first: AWS stopped no instance of ours for its block's end, and every
    // plan window with a launch was drained before its forced termination. Where cleanup
    // was down for the whole drain interval, the miss is recorded and published instead.
    type Forced = (String, String, Option<String>, Option<DateTime<Utc>>);
    let forced: Vec<Forced> = sim.cloud.with_world(|w| {
        w.ec2
            .instances
            .values()
            .filter(|i| {
                i.tags.contains_key(REQUEST_TAG) && !sim.foreign.instances.contains_key(&i.id)
            })
            .filter(|i| {
                i.state_reason
                    .as_ref()
                    .is_some_and(|(code, _)| code == "Server.ScheduledStop")
            })
            .map(|i| {
                (
                    i.id.clone(),
                    i.tags[REQUEST_TAG].clone(),
                    i.capacity_reservation_id.clone(),
                    i.terminated_at,
                )
            })
            .collect()
    });
    for (iid, request, cr, stopped_at) in forced {
        // AWS's forced termination: when it stopped the instance (a block's end less its
        // lead), else the block's end.
        let at = stopped_at.or_else(|| {
            cr.as_ref()
                .and_then(|cr| sold.iter().find(|s| s.names(cr)))
                .map(|s| s.end)
        });
        let excused = at
            .zip(cr.as_deref())
            .is_some_and(|(at, cr)| late_drain_excused(sim, &bus, recs.get(&request), cr, at));
        if !excused {
            out.push(format!(
                "drains first: AWS terminated {iid} of {request} at its block's end"
            ));
        }
    }
    let lead = sim.cloud.with_world(|w| {
        (
            w.settings.training_job_termination_lead_minutes,
            w.settings.hyperpod_termination_lead_minutes,
        )
    });
    for s in sold.iter().filter(|s| s.plan && s.live_or_paid) {
        let launched = bus.iter().any(|e| {
            e["detail-type"] == "Capacity Workload Launched"
                && e["detail"]["reservation_id"] == s.id.as_str()
        });
        if !launched || s.end > end {
            continue;
        }
        let hyperpod = recs
            .get(&s.request)
            .is_some_and(|r| matches!(r.request.workload, WorkloadDetail::HyperpodCluster { .. }));
        let lead = if hyperpod { lead.1 } else { lead.0 };
        let forced_at = s.end - TimeDelta::minutes(lead);
        let drained = bus.iter().any(|e| {
            e["detail-type"] == "Capacity Workload Drained"
                && e["detail"]["reservation_id"] == s.id.as_str()
                && time(&e["time"]).is_some_and(|t| t <= forced_at)
        });
        if !drained && !late_drain_excused(sim, &bus, recs.get(&s.request), &s.id, forced_at) {
            out.push(format!(
                "drains first: {}'s plan {} was launched into but not drained before {forced_at}",
                s.request, s.id
            ));
        }
    }

    // A spot run never runs short (ARCHITECTURE §9.1): while a request is RunningSpot, EC2
    // runs all of its instances but for a while after a reclaim (the two-minute warning, a
    // replacement, the listing lag); a run that cannot get one back falls back. A while:
    // two hours, with the time replace-unhealthy was down.
    for r in recs.values().filter(|r| r.request.interruptible) {
        let history = sim.store.history(&r.request_id).await.unwrap_or_default();
        let mut spans = Vec::new();
        for (i, h) in history.iter().enumerate() {
            if h.to == RequestStatus::RunningSpot && h.from != Some(RequestStatus::RunningSpot) {
                let until = history[i + 1..]
                    .iter()
                    .find(|n| n.to != RequestStatus::RunningSpot)
                    .map_or(end, |n| n.at);
                spans.push((h.at, until));
            }
        }
        if spans.is_empty() {
            continue;
        }
        let id = r.request_id.to_string();
        let mut changes: Vec<(DateTime<Utc>, i64)> = sim.cloud.with_world(|w| {
            w.ec2
                .instances
                .values()
                .filter(|i| i.lifecycle == Lifecycle::Spot)
                .filter(|i| i.tags.get(REQUEST_TAG) == Some(&id))
                .flat_map(|i| {
                    let mut c = vec![(i.launch_time, 1)];
                    c.extend(i.terminated_at.map(|t| (t, -1)));
                    c
                })
                .collect()
        });
        changes.sort();
        let want = i64::from(r.request.instance_count);
        for (from, until) in spans {
            let mut live = changes
                .iter()
                .filter(|(t, _)| *t <= from)
                .map(|(_, d)| d)
                .sum::<i64>();
            let mut short_since = (live < want).then_some(from);
            let mut worst: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
            let points = changes
                .iter()
                .filter(|(t, _)| *t > from && *t < until)
                .copied()
                .chain([(until, 0)]);
            for (t, d) in points {
                if let Some(since) = short_since {
                    let down = (t - since)
                        - sim
                            .scenario
                            .outages
                            .iter()
                            .filter(|o| o.function == "replace-unhealthy")
                            .map(|o| {
                                let a = t0() + TimeDelta::minutes(o.from);
                                let b = a + TimeDelta::minutes(o.minutes);
                                (b.min(t) - a.max(since)).max(TimeDelta::zero())
                            })
                            .sum::<TimeDelta>();
                    if down > TimeDelta::hours(2) && worst.is_none() {
                        worst = Some((since, t));
                    }
                }
                live += d;
                short_since = match (short_since, live < want) {
                    (Some(s), true) => Some(s),
                    (None, true) => Some(t),
                    _ => None,
                };
            }
            if let Some((since, to)) = worst {
                out.push(format!(
                    "a spot run never runs short: {id} was RunningSpot with fewer than its \
                     {want} spot instances from {since} to {to}"
                ));
            }
        }
    }

    // A spot run that fell back served no more than spot ran (ARCHITECTURE §9.1): what its
    // request no longer asks for is within the span EC2 ran its spot instances.
    for r in recs.values().filter(|r| !r.served().is_zero()) {
        let id = r.request_id.to_string();
        let span = sim.cloud.with_world(|w| {
            let spot: Vec<_> = w
                .ec2
                .instances
                .values()
                .filter(|i| i.lifecycle == Lifecycle::Spot)
                .filter(|i| i.tags.get(REQUEST_TAG) == Some(&id))
                .collect();
            let from = spot.iter().map(|i| i.launch_time).min()?;
            let to = spot
                .iter()
                .map(|i| i.terminated_at.unwrap_or(w.now))
                .max()?;
            Some(to - from)
        });
        if span.is_none_or(|s| r.served() > s) {
            out.push(format!(
                "served by what ran: {id}'s spot run is counted to have served {} min, but EC2 \
                 ran its spot instances over {:?} min",
                r.served().num_minutes(),
                span.map(|s| s.num_minutes())
            ));
        }
    }

    // Nothing on demand is left running after its request ended, or after its run did (a
    // spot run's fall-back stops it before the request searches: ARCHITECTURE §9.1).
    let live_od: Vec<(String, String)> = sim.cloud.with_world(|w| {
        w.ec2
            .instances
            .values()
            .filter(|i| !sim.foreign.instances.contains_key(&i.id))
            .filter(|i| matches!(i.lifecycle, Lifecycle::OnDemand | Lifecycle::Spot))
            .filter(|i| i.state == "running" || i.state == "pending")
            .filter_map(|i| Some((i.tags.get(REQUEST_TAG)?.clone(), i.id.clone())))
            .collect()
    });
    for (req, iid) in live_od {
        let running = |r: &RequestRecord| {
            matches!(
                r.status,
                RequestStatus::TryingOnDemand
                    | RequestStatus::RunningOnDemand
                    | RequestStatus::RunningSpot
            ) || (r.status == RequestStatus::Draining && r.open_debit.is_some())
        };
        if recs.get(&req).is_none_or(|r| !running(r)) {
            out.push(format!(
                "nothing on demand left: {iid} of request {req} ({}), whose run ended, is still \
                 running",
                recs.get(&req)
                    .map_or("no record".to_string(), |r| r.status.to_string())
            ));
        }
    }

    // The outbox was honoured: every committed item published, with its own event_key.
    let keys: BTreeSet<String> = bus
        .iter()
        .filter_map(|e| e["detail"]["event_key"].as_str().map(str::to_string))
        .collect();
    for (item, sent) in sim.store.outbox() {
        if !keys.contains(&item.event.event_key) {
            out.push(format!(
                "outbox honoured: {} ({}) was committed but never published",
                item.event.event_key, item.event.detail_type
            ));
        } else if !sent {
            out.push(format!(
                "outbox honoured: {} is published but still unsent in the outbox",
                item.event.event_key
            ));
        }
    }

    // A request is what its first delivered submission that was not rejected asked: a later
    // one of the same id (a redelivery, or another request reusing it) changes nothing.
    let rejected: BTreeSet<&str> = bus
        .iter()
        .filter(|e| e["detail-type"] == "Capacity Request Rejected")
        .filter_map(|e| e["detail"]["event_id"].as_str())
        .collect();
    // (The first handled one, or the first whose handler began: one that died may have
    // created the record first.)
    let mut first: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for handled_only in [true, false] {
        let mut seen = BTreeSet::new();
        for d in sim.delivered.iter().filter(|d| d.handled || !handled_only) {
            if d.event["detail-type"] == "Capacity Request Submitted"
                && !d.event["id"].as_str().is_some_and(|e| rejected.contains(e))
                && let Some(id) = d.event["detail"]["request_id"].as_str()
                && seen.insert(id.to_string())
            {
                first
                    .entry(id.to_string())
                    .or_default()
                    .push(&d.event["detail"]);
            }
        }
    }
    for (id, details) in &first {
        let Some(r) = recs.get(id) else { continue };
        let held = (
            r.team.to_string(),
            u64::from(r.request.instance_count),
            u64::from(r.request.drain_minutes),
        );
        let asked: Vec<(String, u64, u64)> = details
            .iter()
            .map(|detail| {
                (
                    detail["team"].as_str().unwrap_or_default().to_string(),
                    detail["instance_count"].as_u64().unwrap_or_default(),
                    detail["drain_minutes"].as_u64().unwrap_or_default(),
                )
            })
            .collect();
        if !asked.contains(&held) {
            out.push(format!(
                "judged as delivered: {id} holds {held:?} (team, count, drain), but its first \
                 delivered submission asked {asked:?}"
            ));
        }
    }

    // Every cancellation is answered (ARCHITECTURE §8.3): each one handled is followed by a
    // `Capacity Cancellation Applied` or `Refused` for its request (one kept answers every
    // cancellation kept meanwhile with one answer, after them all).
    for d in sim
        .delivered
        .iter()
        .filter(|d| d.handled && d.event["detail-type"] == "Capacity Request Cancelled")
    {
        let id = d.event["detail"]["request_id"].as_str().unwrap_or_default();
        // From its first delivery: an attempt that failed after its write committed may have
        // answered it already.
        let first = sim
            .delivered
            .iter()
            .filter(|e| e.event["id"] == d.event["id"])
            .map(|e| e.at)
            .min()
            .unwrap_or(d.at);
        let at = first - TimeDelta::seconds(1);
        let answered = bus.iter().any(|e| {
            matches!(
                e["detail-type"].as_str(),
                Some("Capacity Cancellation Applied" | "Capacity Cancellation Refused")
            ) && same_id(&e["detail"]["request_id"], id)
                && time(&e["time"]).is_some_and(|t| t >= at)
        });
        if !answered {
            out.push(format!(
                "every cancellation is answered: {id}'s cancellation delivered at {} has no \
                 answer",
                d.at
            ));
        }
    }
    // A paid window runs to its drain unless `stop_running` stopped it (ARCHITECTURE §9.1):
    // a drain before the window's drain start names a window a `Capacity Cancellation
    // Applied` listed in `stopped_windows`; and every window so listed is drained.
    let stopped = |id: &str, res: &str, number: u64| {
        ours(&bus, "Capacity Cancellation Applied", id)
            .iter()
            .any(|e| {
                e["detail"]["stopped_windows"].as_array().is_some_and(|ws| {
                    ws.iter()
                        .any(|w| w["reservation_id"] == res && w["window"] == number)
                })
            })
    };
    // ARCHITECTURE §9.3: a window's end is what AWS reports. A reservation extended by hand
    // (in the console, more than 3 h before its end, so paid before any drain) is judged
    // by the end AWS reports now, not the one recorded when it was bought.
    let aws_ends = aws_ends(sim);
    for r in recs.values() {
        let id = r.request_id.as_str();
        let held: Vec<Reservation> = reservations
            .get(&r.request_id)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|mut h| {
                if let Some(ends) = aws_ends.get(&h.id) {
                    for (s, end) in h.segments.iter_mut().zip(ends) {
                        s.end = *end;
                    }
                }
                h
            })
            .collect();
        let lead = capacity_pilot::domain::window::DrainLead::of(
            &r.request,
            capacity_pilot::config::DEFAULT_DRAIN_MINUTES,
        );
        let windows = capacity_pilot::domain::window::windows(&held, &r.windows, lead);
        for e in ours(&bus, "Capacity Workload Drained", id) {
            let res = e["detail"]["reservation_id"].as_str().unwrap_or_default();
            let number = e["detail"]["segment"].as_u64().unwrap_or_default();
            let Some(w) = windows
                .iter()
                .find(|w| w.reservation.id == res && u64::from(w.number) == number)
            else {
                continue;
            };
            let Some(drained_at) = time(&e["detail"]["drained_at"]) else {
                continue;
            };
            // ARCHITECTURE §9.3: a pending extension does not hold the drain. A window
            // drained by the end AWS had paid then is drained on time; the extension paid
            // after reopens it, and it runs again (launched after the drain) when the payment
            // cleared an hour or more before its new drain.
            let unpaid = unpaid_at(sim, res, drained_at).filter(|_| w.last_of_reservation);
            if let Some((added, cleared)) = unpaid
                && drained_at + TimeDelta::minutes(1) >= w.drain_at - added
            {
                let again = ours(&bus, "Capacity Workload Launched", id)
                    .iter()
                    .any(|l| {
                        l["detail"]["reservation_id"] == res
                            && l["detail"]["segment"] == number
                            && time(&l["detail"]["launched_at"]).is_some_and(|t| t > drained_at)
                    });
                let cancelled = !ours(&bus, "Capacity Cancellation Applied", id).is_empty();
                if !again && !cancelled && cleared + TimeDelta::hours(1) < w.drain_at {
                    out.push(format!(
                        "an extension paid after the drain reopens the window: {id}'s window \
                         {number} ({res}) was drained at {drained_at}, its extension's payment \
                         cleared at {cleared}, and nothing was launched into it again before \
                         its new drain at {}",
                        w.drain_at
                    ));
                }
                continue;
            }
            if drained_at + TimeDelta::minutes(1) < w.drain_at && !stopped(id, res, number) {
                out.push(format!(
                    "a paid window is served to its drain: {id}'s window {number} ({res}) was \
                     drained at {drained_at}, before its drain start at {}, and no \
                     stop_running asked it",
                    w.drain_at
                ));
            }
        }
        for e in ours(&bus, "Capacity Cancellation Applied", id) {
            for w in e["detail"]["stopped_windows"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let drained = ours(&bus, "Capacity Workload Drained", id).iter().any(|d| {
                    d["detail"]["reservation_id"] == w["reservation_id"]
                        && d["detail"]["segment"] == w["window"]
                });
                if !drained {
                    out.push(format!(
                        "stop_running stops through the ordinary drain: {id}'s window {} ({}) \
                         was listed stopped but never drained",
                        w["window"], w["reservation_id"]
                    ));
                }
            }
        }
    }

    // Inbound events judged as delivered.
    for planned in &sim.scenario.requests {
        let id = planned.detail["request_id"].as_str().unwrap_or_default();
        let Some(r) = recs.get(id) else { continue };
        // (What the system bought: a stray was bought behind its back.)
        let bought: Vec<&Sold> = sold
            .iter()
            .filter(|s| s.request == id && !is_stray(sim, &s.id))
            .collect();
        // A purchase that takes the request's spend above the approval threshold (what it
        // had bought and kept before, this fee included: review N9) came after an approval
        // naming its plan, from an approver source.
        if let Some(above) = r.request.budget.approval_above {
            let above = above.to_micros_ceil().0;
            // (As bought: an extension passes a gate of its own, judged below.)
            let before = |s: &Sold| -> i64 {
                bought
                    .iter()
                    .filter(|b| b.live_or_paid && b.created < s.created)
                    .map(|b| b.bought_fee)
                    .sum()
            };
            // An extension that needed an approver (ARCHITECTURE §9.3) was bought only once an
            // approval naming its own Awaiting Approval was delivered from an approver source.
            for o in ours(&bus, "Capacity Extension Offered", id)
                .into_iter()
                .filter(|o| o["detail"]["needs_approval"] == true)
            {
                let offering = &o["detail"]["offering_id"];
                let sold_it = bought.iter().any(|s| {
                    s.extensions
                        .iter()
                        .any(|e| offering.as_str() == Some(e.as_str()))
                });
                let approved = sim.delivered.iter().any(|d| {
                    d.event["detail-type"] == "Capacity Purchase Approved"
                        && d.event["source"] == APPROVER
                        && ours(&bus, "Capacity Extension Awaiting Approval", id)
                            .iter()
                            .any(|a| {
                                a["detail"]["event_key"] == d.event["detail"]["approves"]
                                    && a["detail"]["offering_id"] == *offering
                            })
                });
                if sold_it && !approved {
                    out.push(format!(
                        "no spend past its gate: {id}'s extension {offering} needed an approver \
                         and was bought with no valid approval delivered"
                    ));
                }
            }
            for s in bought.iter().filter(|s| before(s) + s.bought_fee > above) {
                let approved = sim.delivered.iter().any(|d| {
                    d.event["detail-type"] == "Capacity Purchase Approved"
                        && d.event["source"] == APPROVER
                        && d.event["detail"]["request_id"] == id
                        && d.at <= s.created
                        && ours(&bus, "Capacity Purchase Awaiting Approval", id)
                            .iter()
                            .any(|a| {
                                // (An approval is for the plan it names: a block bought later,
                                // a replacement, needs its own. A plan's offerings are not
                                // named by what AWS sold, so any of the request's will do.)
                                a["detail"]["event_key"] == d.event["detail"]["approves"]
                                    && (s.plan
                                        || a["detail"]["plan"]["offering_ids"]
                                            .as_array()
                                            .is_some_and(|o| o.iter().any(|x| x == &s.offering)))
                            })
                });
                if !approved {
                    out.push(format!(
                        "no spend past its gate: {id} bought {} ({} micro-USD, after {} \
                         micro-USD bought before: above its approval threshold) with no valid \
                         approval delivered first",
                        s.id,
                        s.bought_fee,
                        before(s)
                    ));
                }
            }
            // An on-demand or spot run is a spend too (review N9): a run whose estimate alone
            // is above the threshold (the gate is on the request's spend with it, at least
            // the estimate) launched after an approval of a hold of its kind.
            for l in ours(&bus, "Capacity Workload Launched", id) {
                let kind = l["detail"]["reservation_id"].as_str().unwrap_or_default();
                let Some(cost) = l["detail"]["estimated_cost_usd"]
                    .as_str()
                    .and_then(|c| c.parse::<Decimal>().ok())
                else {
                    continue;
                };
                let Some(launched) = time(&l["detail"]["launched_at"]) else {
                    continue;
                };
                if micros(cost) <= above {
                    continue;
                }
                let approved = sim.delivered.iter().any(|d| {
                    d.event["detail-type"] == "Capacity Purchase Approved"
                        && d.event["source"] == APPROVER
                        && d.event["detail"]["request_id"] == id
                        && d.at <= launched
                        && ours(&bus, "Capacity Purchase Awaiting Approval", id)
                            .iter()
                            .any(|a| {
                                a["detail"]["kind"] == kind
                                    && a["detail"]["event_key"] == d.event["detail"]["approves"]
                            })
                });
                if !approved {
                    out.push(format!(
                        "no spend past its gate: {id}'s {kind} run launched at {launched}, its \
                         estimate ${cost} above its approval threshold, with no approval of a \
                         {kind} hold delivered first"
                    ));
                }
            }
        }
        // A cancellation delivered before any purchase leaves nothing bought after it, and
        // the request cancelled.
        let cancelled_at = sim
            .delivered
            .iter()
            .filter(|d| {
                d.handled
                    && d.event["detail-type"] == "Capacity Request Cancelled"
                    && same_id(&d.event["detail"]["request_id"], id)
            })
            .map(|d| d.at)
            .min();
        let Some(tc) = cancelled_at else { continue };
        // Nothing is bought after a cancellation was delivered (a purchase in flight then
        // was made before it: invocations here run one at a time).
        for s in bought.iter().filter(|s| s.created > tc) {
            out.push(format!(
                "judged as delivered: {id} was cancelled at {tc} but {} was bought at {}",
                s.id, s.created
            ));
        }
        // Cancelled before any purchase, it ends cancelled, unless it had ended by then. A
        // stray it adopted counts as bought: the harness bought it, but the request holds it.
        let adopted = reservations
            .get(&r.request_id)
            .is_some_and(|held| held.iter().any(|x| is_stray(sim, &x.id)));
        if bought.is_empty() && !adopted && r.status != RequestStatus::Cancelled {
            let history = sim.store.history(&r.request_id).await.unwrap_or_default();
            if !history.iter().any(|h| h.to.is_terminal() && h.at <= tc) {
                out.push(format!(
                    "judged as delivered: {id} was cancelled at {tc} before any purchase but \
                     ended {}",
                    r.status
                ));
            }
        }
    }
    out
}

/// What the run reached by the emulator's ground truth and the deliveries, for the
/// generators' reach check.
pub fn reached(sim: &Sim) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if records(sim)
        .values()
        .any(|r| r.reason.contains("listed for the purchase in doubt since"))
    {
        out.insert("a purchase in doubt was found by its hourly reconciliation".to_string());
    }
    let legacy: BTreeSet<&str> = sim
        .scenario
        .legacy_ledgers
        .iter()
        .map(|(t, _)| t.as_str())
        .collect();
    if records(sim).values().any(|r| {
        legacy.contains(r.team.as_str())
            && r.reason.contains("budget for")
            && r.reason.contains("would be exceeded")
    }) {
        out.insert("a ledger from before §9.8 held a purchase back".to_string());
    }
    if sim
        .cloud
        .events(BUS)
        .iter()
        .any(|e| e["detail-type"] == "Capacity Workload Drained" && e["detail"]["late"] == true)
    {
        out.insert("a late drain was published".to_string());
    }
    if sim.cloud.events(BUS).iter().any(|e| {
        ["Capacity Window Opening", "Capacity Reservation Ending"]
            .contains(&e["detail-type"].as_str().unwrap_or_default())
            && e["detail"]["late"] == true
    }) {
        out.insert("a lead-time notice was published late".to_string());
    }
    if sim
        .store
        .all_history()
        .values()
        .flatten()
        .any(|h| h.reason.contains("notice of window") && h.reason.contains("was not sent"))
    {
        out.insert("a lead-time notice's skip was recorded".to_string());
    }
    if sim
        .store
        .all_history()
        .values()
        .flatten()
        .any(|h| h.reason.starts_with("paused by"))
    {
        out.insert("a purchase was held back by a pause".to_string());
    }
    if sim.cloud.events(BUS).iter().any(|e| {
        e["detail-type"] == "Capacity Cancellation Applied"
            && e["detail"]["stopped_windows"]
                .as_array()
                .is_some_and(|w| !w.is_empty())
    }) {
        out.insert("stop_running stopped a paid window".to_string());
    }
    for s in counted(sim).iter() {
        out.insert(format!(
            "a {} was {}",
            if s.plan { "plan" } else { "block" },
            if s.live_or_paid {
                "bought"
            } else {
                "payment-failed"
            }
        ));
    }
    sim.cloud.with_world(|w| {
        if w.sm.plans.values().any(|p| p.offering.segments.len() > 1) {
            out.insert("a split plan was bought".to_string());
        }
        for i in w.ec2.instances.values() {
            if !i.tags.contains_key(REQUEST_TAG) || sim.foreign.instances.contains_key(&i.id) {
                continue;
            }
            out.insert(format!("an EC2 instance ran ({:?})", i.lifecycle));
        }
        if w.sm.jobs.values().any(|j| j.plan_arn.is_none()) {
            out.insert("a training job ran on demand".to_string());
        }
    });
    for d in sim.delivered.iter().filter(|d| d.handled) {
        let dt = d.event["detail-type"].as_str().unwrap_or_default();
        let source = d.event["source"].as_str().unwrap_or_default();
        out.insert(format!("delivered: {dt} from {source}"));
    }
    let recs = records(sim);
    if sim.cloud.events(BUS).iter().any(|e| {
        e["detail-type"] == "Capacity Request Rejected"
            && e["detail"]["problems"]
                .to_string()
                .contains("is claimed by request")
    }) {
        out.insert("a submission was refused for a name another request claims".to_string());
    }
    {
        use capacity_pilot::workload::claims::keys;
        let named: Vec<_> = recs.values().flat_map(|r| keys(&r.request)).collect();
        if named
            .iter()
            .enumerate()
            .any(|(i, (k, _))| named.iter().skip(i + 1).any(|(l, _)| l == k))
        {
            out.insert("two requests naming one workload were both recorded".to_string());
        }
    }
    let sold = counted(sim);
    let reservations = sim.store.all_reservations();
    for (at, id, _) in &sim.refusals {
        out.insert("a purchase was refused for good".to_string());
        if bought_at(&reservations, id, *at) {
            out.insert("a split's later block was refused for good".to_string());
        }
    }
    // A plan bought again after its payment failed: under the next attempt's name, which
    // the failed plan does not hold.
    for s in sold.iter().filter(|s| s.plan && s.live_or_paid) {
        if sold
            .iter()
            .any(|f| f.plan && !f.live_or_paid && f.request == s.request && f.created < s.created)
        {
            out.insert("a plan was bought again after its payment failed".to_string());
        }
    }
    for (id, list) in &reservations {
        let Some(rec) = recs.get(id.as_str()) else {
            continue;
        };
        let blocks = list
            .iter()
            .filter(|r| r.state.is_live() && r.product == Product::CapacityBlock)
            .count();
        if rec.request.allow_split && blocks > 1 {
            out.insert("an EC2 split was bought".to_string());
        }
        let cap = rec.request.budget.max_upfront;
        if list
            .iter()
            .any(|r| r.state.is_live() && r.upfront_fee == cap)
        {
            out.insert("a reservation was bought at exactly its request's cap".to_string());
        }
    }
    for r in recs.values() {
        out.insert(format!("a request ended {}", r.status));
        if r.run.as_ref().is_some_and(|x| x.fall_back.is_some()) && r.open_debit.is_none() {
            out.insert("a spot run fell back to a reservation".to_string());
            if reservations
                .get(&r.request_id)
                .is_some_and(|l| !l.is_empty())
            {
                out.insert("a spot run's fall-back bought a reservation".to_string());
            }
        }
        let fees = recorded_fees(&reservations, &sold, r);
        let od = on_demand_part(r, fees + unverified(sim, r, fees));
        // A charge of -1 is outside any bounds: `Some` says the hours check applies to it.
        if r.status.is_terminal() && od > 0 && on_demand_hours_wrong(sim, r, -1).is_some() {
            out.insert("an on-demand run was charged its hours".to_string());
        }
    }
    // Ids compared ignoring case (review N15).
    let bus = sim.cloud.events(BUS);
    if bus.iter().any(|e| {
        e["detail-type"] == "Capacity Request Rejected"
            && e["detail"]["problems"].as_array().is_some_and(|ps| {
                ps.iter().any(|p| {
                    p["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("differs only in case"))
                })
            })
    }) {
        out.insert("a submission was refused for an id another spelling holds".to_string());
    }
    let respelled: BTreeSet<String> = sim
        .delivered
        .iter()
        .filter(|d| d.handled && d.event["detail-type"] == "Capacity Request Cancelled")
        .filter_map(|d| d.event["detail"]["request_id"].as_str())
        .filter(|id| id.chars().any(|c| c.is_ascii_uppercase()))
        .map(str::to_ascii_lowercase)
        .collect();
    if bus.iter().any(|e| {
        e["detail-type"] == "Capacity Cancellation Applied"
            && e["detail"]["request_id"]
                .as_str()
                .is_some_and(|id| respelled.contains(id))
    }) {
        out.insert("a cancellation spelling its id in another case was applied".to_string());
    }
    out
}

/// ARCHITECTURE §9.2's lead-time notices: each is published under one key at most (a window
/// and lead is one notice, however often its write is retried or raced), and none whose moment
/// came after its window's purchase is passed over without a record: it was published, or the
/// request's history says why not.
async fn lead_notices(
    sim: &Sim,
    recs: &BTreeMap<String, RequestRecord>,
    bus: &[Value],
    end: DateTime<Utc>,
) -> Vec<String> {
    use capacity_pilot::domain::notices::{Lead, LeadKind};
    use capacity_pilot::domain::reservation::ReservationState;
    use capacity_pilot::domain::window::{DrainLead, windows};
    const KINDS: [(&str, LeadKind); 2] = [
        ("Capacity Window Opening", LeadKind::Opening),
        ("Capacity Reservation Ending", LeadKind::Ending),
    ];
    let mut out = Vec::new();
    let mut keys: BTreeMap<(String, String, String, String), BTreeSet<String>> = BTreeMap::new();
    for e in bus {
        let dt = e["detail-type"].as_str().unwrap_or_default();
        if !KINDS.iter().any(|(d, _)| *d == dt) {
            continue;
        }
        let d = &e["detail"];
        // (An Ending notice counts down to one end: when AWS moves it, the new end's are
        // other notices, ARCHITECTURE §9.3.)
        keys.entry((
            d["request_id"].to_string(),
            d["reservation_id"].to_string(),
            d["window"].to_string(),
            format!("{dt} {} {}", d["lead_minutes"], d["ends_at"]),
        ))
        .or_default()
        .insert(d["event_key"].to_string());
    }
    for ((request, res, window, what), ks) in &keys {
        if ks.len() > 1 {
            out.push(format!(
                "a lead-time notice is published under one key: {request}'s {what} of window \
                 {window} ({res}) went out as {ks:?}"
            ));
        }
    }
    let reservations = sim.store.all_reservations();
    let leads = &sim.config.notice_leads;
    for r in recs.values() {
        let held = reservations.get(&r.request_id).cloned().unwrap_or_default();
        let ws = windows(
            &held,
            &r.windows,
            DrainLead::of(&r.request, sim.config.default_drain_minutes),
        );
        if ws.is_empty() {
            continue;
        }
        let history = sim.store.history(&r.request_id).await.unwrap_or_default();
        for w in &ws {
            // A reservation AWS never let be used announces nothing.
            if matches!(
                w.reservation.state,
                ReservationState::PaymentFailed | ReservationState::Failed
            ) {
                continue;
            }
            let Some(bought) = w.reservation.bought_at else {
                continue;
            };
            for (dt, kind) in KINDS {
                let minutes = match kind {
                    LeadKind::Opening => &leads.opening,
                    LeadKind::Ending => &leads.ending,
                };
                for m in minutes {
                    let lead = Lead { kind, minutes: *m };
                    let moment = lead.moment(w);
                    // Not due (before the purchase, or an Ending lead before the end last
                    // moved), or not yet owed by the end of the run.
                    let since = w
                        .notices
                        .as_ref()
                        .map_or(bought, |n| n.due_since(kind, bought));
                    if moment < since || moment > end - TimeDelta::minutes(10) {
                        continue;
                    }
                    let published = bus.iter().any(|e| {
                        e["detail-type"] == dt
                            && same_id(&e["detail"]["request_id"], r.request_id.as_str())
                            && e["detail"]["reservation_id"] == w.reservation.id.as_str()
                            && e["detail"]["window"] == w.number
                            && e["detail"]["lead_minutes"] == *m
                            && (kind == LeadKind::Opening
                                || e["detail"]["ends_at"] == json!(w.end()))
                    });
                    let said = format!("{} was not sent", lead.describe(w.number));
                    let recorded = history.iter().any(|h| h.reason.contains(&said));
                    if !published && !recorded {
                        out.push(format!(
                            "a lead-time notice is never skipped without a record: {}'s {} \
                             ({}, due at {moment}) was neither published nor its skip recorded \
                             ({}; window {})",
                            r.request_id,
                            lead.describe(w.number),
                            w.reservation.id,
                            r.status,
                            w.state
                        ));
                    }
                }
            }
        }
    }
    out
}
