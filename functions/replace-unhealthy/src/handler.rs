//! replace-unhealthy: keeps a request's Capacity Block instances and its on-demand run's
//! instances healthy. An impaired, unexpectedly stopped or terminated managed instance is
//! terminated and a replacement launched into the same slot (of the reservation, or on
//! demand in the old instance's zone) with the next `generation`, so its `ClientToken` is
//! new (EC2 answers a used token with the old instance).
//!
//! A Capacity Block's slot returns only about 10 minutes after its instance terminates, so a
//! launch refused for capacity is retried on the next tick: the slot's record says
//! `replacing` until the replacement runs. A replacement tries every request subnet in its
//! zone, in the request's order: one without free addresses moves it to the next, and when
//! all are full the slot waits for a later tick, as for capacity (a paid block is never
//! failed for its subnets). Two caps bound the damage a bad signal can do:
//! replacements per reservation, and no repairs at all while more than
//! `MAX_UNHEALTHY_SHARE` of a request's instances look unhealthy (that smells of a wider
//! problem, which replacing would only make worse), though one bad instance is always
//! repaired. Instances without the managed tag are never touched.
//!
//! A spot run's reclaimed instances are repaired on spot within the cap; a spot run that
//! cannot get back what EC2 took (past the cap, or more than the share at once) falls back
//! as `on-demand-first` does: it is written `Draining` with its fall-back, and
//! cleanup-expired stops it, settles what it ran and searches for a reservation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::config::Config;
use capacity_pilot::decision;
pub use capacity_pilot::decision::{Decision, HandlerError};
use capacity_pilot::domain::events::{
    InstanceMaintenanceScheduled, InstanceReplaced, WorkloadInterrupted, event_key, outbound,
};
use capacity_pilot::domain::naming::{MANAGED_TAG, REQUEST_TAG};
use capacity_pilot::domain::notices::announced;
use capacity_pilot::domain::offering::Product;
use capacity_pilot::domain::request::RequestId;
use capacity_pilot::domain::reservation::Reservation;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::time_rules::{LAUNCH_FUNCTION_TIMEOUT, LISTING_LAG_BOUND};
use capacity_pilot::domain::window::{self, DrainLead, WindowRecord, WindowState};
use capacity_pilot::outbox;
use capacity_pilot::ports::{
    Cause, Clock, EventSink, FallBack, InstanceFilter, InstanceHealth, InstanceInfo, InstanceState,
    LaunchMarket, LaunchSpec, LiveRequest, OnDemandRun, PortError, RequestRecord, ScheduledChange,
    Store, Transition, WorkloadRecord, Workloads,
};
use capacity_pilot::workload;
use capacity_pilot::workload::ec2_instances::{self, Replacement};
use capacity_pilot::workload::refusal::{self, Scope};
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use serde_json::Value;
use tracing::{info, warn};

pub const STATE_CHANGE: &str = "EC2 Instance State-change Notification";
pub const HEALTH_EVENT: &str = "AWS Health Event";
/// How long before a scheduled retirement or stop its instance is replaced (review N16): the
/// replacement's launch, and a block slot's return after the termination (about 10 min),
/// come before EC2 takes the instance.
pub const SCHEDULED_CHANGE_LEAD: chrono::TimeDelta = chrono::TimeDelta::minutes(30);
/// A slot whose old instance is terminated and whose replacement still waits for the slot,
/// its launch (if one is under way) in the zone's first subnet. One whose launch went to
/// another subnet of the zone says so, `replacing@<subnet>` ([`is_replacing`]).
pub const REPLACING: &str = "replacing";
/// A slot whose (replacement) instance was launched.
pub const RUNNING: &str = "running";
/// The labels of on-demand and spot runs' slots.
pub use capacity_pilot::ports::{ON_DEMAND, SPOT};
/// A slot whose instance died past the replacement cap: left down, its run ended.
pub const LEFT: &str = "left";

#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub decisions: Vec<Decision>,
    pub published: usize,
}

pub struct Replacer<S, W, E, C> {
    pub store: S,
    pub workloads: W,
    pub events: E,
    pub clock: C,
    pub config: Arc<Config>,
}

/// Where a repaired slot's instances run.
enum Place {
    /// A Capacity Block: replacements launch into its reservation, and carry its window's
    /// drain start.
    Block(Box<Reservation>, DateTime<Utc>),
    /// An on-demand or spot run: replacements launch in its market where the old instance
    /// ran.
    Run(LaunchMarket),
}

/// Why a slot needs a new instance.
enum Verdict {
    Healthy,
    /// Not listed by EC2, but recorded less than the listing lag's bound ago: left alone.
    Unlisted,
    Unhealthy(String),
    /// Already terminated by us; the launch is still to succeed.
    Pending,
}

impl<S: Store, W: Workloads, E: EventSink, C: Clock> Replacer<S, W, E, C> {
    pub async fn handle(&self, ev: EventBridgeEvent<Value>) -> Result<Outcome, HandlerError> {
        let now = self.clock.now().await?;
        let run = outbox::Run::start(&self.store, now);
        // What a status this function writes (a spot run's fall-back) was caused by.
        let cause = Cause::new(
            ev.id
                .clone()
                .unwrap_or_else(|| format!("replace-unhealthy@{now}")),
        );
        let mut out = Outcome::default();
        // Which requests to look at: every live one on a tick, the owners an event names
        // (with the instances a Health event names).
        let mut named: Option<BTreeMap<RequestId, BTreeSet<String>>> = None;
        // Scheduled maintenance that keeps an instance: announced.
        let mut maintenance: Vec<(RequestId, InstanceMaintenanceScheduled)> = Vec::new();
        // An instance a state change shows no longer running, and when: its slot's run ends
        // there (ARCHITECTURE §9.1, settlement by what ran).
        let mut ended: Option<(String, DateTime<Utc>)> = None;
        let region = ev.region.clone().unwrap_or_default();
        match (ev.detail_type.as_str(), ev.source.as_str()) {
            ("Scheduled Event", "aws.events") => {}
            (STATE_CHANGE, "aws.ec2") => {
                let instance_id = ev
                    .detail
                    .get("instance-id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let state = ev.detail.get("state").and_then(Value::as_str);
                info!(instance_id, state, "instance state change");
                if !instance_id.is_empty()
                    && matches!(
                        state,
                        Some("stopping" | "stopped" | "shutting-down" | "terminated")
                    )
                {
                    ended = Some((instance_id.to_string(), ev.time.unwrap_or(now).min(now)));
                }
                let targets = named.insert(BTreeMap::new());
                if !instance_id.is_empty() {
                    for id in self.owners(&region, &[instance_id.to_string()]).await? {
                        targets.entry(id).or_default();
                    }
                }
            }
            (HEALTH_EVENT, "aws.health") => {
                let d = &ev.detail;
                let service = d.get("service").and_then(Value::as_str);
                let category = d.get("eventTypeCategory").and_then(Value::as_str);
                let status = d.get("statusCode").and_then(Value::as_str);
                let relevant = service == Some("EC2")
                    && matches!(category, Some("issue" | "scheduledChange"))
                    && status != Some("closed");
                let targets = named.insert(BTreeMap::new());
                if relevant {
                    let ids = health_instance_ids(&ev);
                    let region = d
                        .get("eventRegion")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .unwrap_or(region);
                    // A scheduled change is not a fault now (review N16): a retirement or stop
                    // is acted on `SCHEDULED_CHANGE_LEAD` before it, as EC2's status listing
                    // shows it (its request is looked at now, and at each tick); a reboot or
                    // maintenance keeps the instance and is only announced.
                    let scheduled = category == Some("scheduledChange");
                    for i in self.describe_managed(&region, &ids).await? {
                        let Some(id) = managed_request(&i) else {
                            continue;
                        };
                        let flagged = targets.entry(id.clone()).or_default();
                        if !scheduled {
                            flagged.insert(i.instance_id);
                        } else if !takes_instance(d) {
                            let m = maintenance_scheduled(&id, &i.instance_id, d, now);
                            maintenance.push((id, m));
                        }
                    }
                } else {
                    info!(
                        ?service,
                        ?category,
                        ?status,
                        "health event not about a live EC2 issue"
                    );
                }
            }
            (other, source) => {
                warn!(
                    detail_type = other,
                    source, "ignoring an event this function does not handle"
                );
                named = Some(BTreeMap::new());
            }
        }
        if !maintenance.is_empty() {
            for (id, m) in &maintenance {
                info!(request_id = %id, instance_id = %m.instance_id, code = %m.code, "maintenance scheduled; announced, not acted on");
                out.decisions
                    .push(Decision::new(id, "maintenance-scheduled", m.reason.clone()));
            }
            // Published now, not through a request's outbox: nothing is written for it (a
            // failure fails the invocation, and the Health event's redelivery publishes it
            // again under the same key).
            let events: Vec<_> = maintenance.iter().map(|(_, m)| outbound(m)).collect();
            outbox::publish_now(&self.events, &events).await?;
            out.published += events.len();
        }
        if named.as_ref().is_some_and(BTreeMap::is_empty) && ended.is_none() {
            out.published += outbox::flush(&self.store, &self.events, run).await?;
            decision::log(&out.decisions);
            return decision::finish(out, Vec::new());
        }
        // The tick's one read: the requests whose workloads may run, with their slots.
        let agenda = self.store.agenda(now).await?;
        if let Some((instance_id, at)) = &ended {
            self.note_end(&agenda.live, instance_id, *at, &mut out)
                .await?;
        }
        let mut errors = Vec::new();
        let mut listing: Option<BTreeMap<String, InstanceInfo>> = None;
        let none = BTreeSet::new();
        for live in &agenda.live {
            let flagged = match &named {
                None => &none,
                Some(n) => match n.get(&live.request_id) {
                    Some(f) => f,
                    None => continue,
                },
            };
            let watched = watched_slots(live, now);
            if watched.is_empty() {
                if named.is_some() {
                    out.decisions.push(ignored(&live.request_id, live.status));
                }
                continue;
            }
            // Status checks come only from polling (aws-reference.md section 6.3): one
            // listing of the managed instances per region serves every request.
            let seen = match &mut listing {
                Some(l) => &*l,
                None => listing.insert(self.listing().await?),
            };
            // A spot run's slot left down is a fall-back not yet written (a crash between).
            let suspect = watched.iter().any(|s| {
                let drain = window_drain(&live.windows, s);
                !matches!(verdict(s, seen, flagged, drain, now).0, Verdict::Healthy)
                    || (live.status == RequestStatus::RunningSpot && s.state == LEFT)
            });
            if !suspect {
                continue;
            }
            if let Err(e) = self
                .process(&live.request_id, flagged, seen, &cause, now, &mut out)
                .await
            {
                warn!(request_id = %live.request_id, error = %e, "replacement step failed");
                errors.push(e);
            }
        }
        for id in named.iter().flat_map(BTreeMap::keys) {
            if !agenda.live.iter().any(|l| &l.request_id == id) {
                out.decisions.push(Decision::new(
                    id,
                    "ignored",
                    "instances are replaced only in a running window before its drain; the \
                     request has nothing running",
                ));
            }
        }
        out.published +=
            outbox::flush(&self.store, &self.events, run.with_agenda(Some(&agenda))).await?;
        decision::log(&out.decisions);
        decision::finish(out, errors)
    }

    /// The slot whose current instance is `instance_id` ends its run at `at`, the first time
    /// it is seen so (a redelivered or later event changes nothing). Read again first: the
    /// slot may have been replaced since the tick's read. A replacement written between
    /// this read and the write below is overwritten with the older slot; the next tick then
    /// replaces it again with the same generation, whose client token answers the same
    /// instance, so nothing runs twice and its run is recorded from EC2's launch time.
    async fn note_end(
        &self,
        live: &[LiveRequest],
        instance_id: &str,
        at: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        for l in live {
            if !l.workloads.iter().any(|w| w.resource_id == instance_id) {
                continue;
            }
            for w in self.store.workloads(&l.request_id).await? {
                if w.resource_id != instance_id {
                    continue;
                }
                if let Some(next) = w.seen_ended(at) {
                    self.store.put_workload(next).await?;
                    out.decisions.push(Decision::new(
                        &l.request_id,
                        "run-ended",
                        format!(
                            "{instance_id} in slot {} of {} was seen not running at {at}; its \
                             run is settled to there",
                            w.slot, w.reservation_id
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every managed instance in the allowed regions, by id.
    async fn listing(&self) -> Result<BTreeMap<String, InstanceInfo>, PortError> {
        let mut seen = BTreeMap::new();
        for region in &self.config.allowed_regions {
            let filter = InstanceFilter {
                managed_only: true,
                ..Default::default()
            };
            for i in self.workloads.describe_instances(region, &filter).await? {
                seen.insert(i.instance_id.clone(), i);
            }
        }
        Ok(seen)
    }

    async fn describe_managed(
        &self,
        region: &str,
        ids: &[String],
    ) -> Result<Vec<InstanceInfo>, PortError> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        self.workloads
            .describe_instances(
                region,
                &InstanceFilter {
                    instance_ids: ids.to_vec(),
                    managed_only: true,
                    ..Default::default()
                },
            )
            .await
    }

    async fn owners(&self, region: &str, ids: &[String]) -> Result<Vec<RequestId>, PortError> {
        Ok(self
            .describe_managed(region, ids)
            .await?
            .iter()
            .filter_map(managed_request)
            .collect())
    }

    /// A request the tick's read shows a suspect slot of: decided on what a consistent read
    /// of it says now.
    async fn process(
        &self,
        id: &RequestId,
        flagged: &BTreeSet<String>,
        seen: &BTreeMap<String, InstanceInfo>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let Some(rec) = self.store.get_request(id).await? else {
            return Ok(());
        };
        if !workload::runs_instances(&rec.request) {
            return Ok(());
        }
        if matches!(
            rec.status,
            RequestStatus::RunningOnDemand | RequestStatus::RunningSpot
        ) {
            return self.repair_run(&rec, flagged, seen, cause, now, out).await;
        }
        // Only a window whose workload runs, and whose drain has not begun, is repaired,
        // whatever the request's status (a split's kept block runs while its replacement is
        // searched for).
        let held = self.store.reservations(id).await?;
        let lead = DrainLead::of(&rec.request, self.config.default_drain_minutes);
        // Each running block's drain start, which its replacements carry as theirs.
        let running: BTreeMap<String, DateTime<Utc>> = window::windows(&held, &rec.windows, lead)
            .into_iter()
            .filter(|w| {
                w.state == WindowState::Running
                    && w.start() <= now
                    // A replacement started now must end before the drain (§8.4).
                    && w.launch_ends_before_drain(now, LAUNCH_FUNCTION_TIMEOUT)
            })
            .map(|w| (w.reservation.id, w.drain_at))
            .collect();
        if running.is_empty() {
            out.decisions.push(ignored(id, rec.status));
            return Ok(());
        }
        let places: BTreeMap<String, Place> = held
            .into_iter()
            .filter(|r| r.product == Product::CapacityBlock)
            .filter_map(|r| {
                let drain_at = *running.get(&r.id)?;
                Some((r.id.clone(), Place::Block(Box::new(r), drain_at)))
            })
            .collect();
        self.repair(
            &rec,
            places,
            &BTreeMap::new(),
            flagged,
            seen,
            cause,
            now,
            out,
        )
        .await
    }

    /// An on-demand or spot run's instances, repaired as a block's are, until a replacement
    /// started now would reach the run's drain. Each replacement runs in the run's market in
    /// the zone its old instance ran in; the run's hold covers it, and the run is settled by
    /// what its instances ran (ARCHITECTURE §9.1). A reclaimed spot instance is repaired on
    /// spot, and each is announced `Capacity Workload Interrupted`; a spot run that cannot be
    /// repaired falls back ([`Replacer::fall_back`]).
    async fn repair_run(
        &self,
        rec: &RequestRecord,
        flagged: &BTreeSet<String>,
        seen: &BTreeMap<String, InstanceInfo>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let before_drain = rec
            .next_action_at
            .is_some_and(|drain| now + LAUNCH_FUNCTION_TIMEOUT < drain);
        let Some(run) = rec
            .run
            .as_ref()
            .filter(|r| before_drain && r.started_at.is_some())
        else {
            out.decisions.push(ignored(&rec.request_id, rec.status));
            return Ok(());
        };
        let market = if run.attempt == SPOT {
            LaunchMarket::Spot
        } else {
            LaunchMarket::OnDemand
        };
        let places = BTreeMap::from([(run.attempt.clone(), Place::Run(market))]);
        let launched = BTreeMap::from([(run.attempt.clone(), run.launch_generations)]);
        self.repair(rec, places, &launched, flagged, seen, cause, now, out)
            .await
    }

    /// Replaces the unhealthy instances of the slots recorded in `places`, within the caps
    /// (`launched`: per place, the generations its launch made, which are no replacements).
    #[allow(clippy::too_many_arguments)]
    async fn repair(
        &self,
        rec: &RequestRecord,
        places: BTreeMap<String, Place>,
        launched: &BTreeMap<String, u32>,
        flagged: &BTreeSet<String>,
        seen: &BTreeMap<String, InstanceInfo>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        // Where a run's slots recorded before launches were began.
        let run_start = rec.run.as_ref().and_then(|r| r.started_at);
        let slots: Vec<WorkloadRecord> = self
            .store
            .workloads(id)
            .await?
            .into_iter()
            .filter(|w| places.contains_key(&w.reservation_id))
            .filter(|w| w.resource_id.starts_with("i-"))
            .collect();
        if slots.is_empty() {
            return Ok(());
        }
        let mut work: Vec<(WorkloadRecord, Verdict)> = Vec::new();
        for slot in slots {
            // Until when the slot serves: its window's drain, or the run's end.
            let drain = match places.get(&slot.reservation_id) {
                Some(Place::Run(_)) => rec.next_action_at,
                _ => window_drain(&rec.windows, &slot),
            };
            let (v, note) = verdict(&slot, seen, flagged, drain, now);
            out.decisions
                .extend(note.map(|n| Decision::new(id, "waiting", n)));
            work.push((slot, v));
        }
        let total = work.len();
        let bad = work
            .iter()
            .filter(|(_, v)| !matches!(v, Verdict::Healthy | Verdict::Unlisted))
            .count();
        // Replacements so far per reservation: every generation past the first is one.
        let mut used: BTreeMap<String, u32> = BTreeMap::new();
        for (slot, _) in &work {
            *used.entry(slot.reservation_id.clone()).or_default() += slot.generation;
        }
        for (place, n) in launched {
            if let Some(u) = used.get_mut(place) {
                *u = u.saturating_sub(*n);
            }
        }
        if places
            .values()
            .any(|p| matches!(p, Place::Run(LaunchMarket::Spot)))
            && let Some(why) = self.spot_lost(&work, &used, bad, seen)
        {
            return self.fall_back(rec, &work, seen, why, cause, now, out).await;
        }
        if bad == 0 {
            return Ok(());
        }
        // One bad instance is always repaired: alone, it is no sign of a wider problem, and
        // a workload of one instance could otherwise never be (found by the simulation: a
        // one-instance on-demand run stopped at hour 16 of 24 and was never replaced).
        let share = self.config.max_unhealthy_share;
        if bad > 1 && Decimal::from(bad) > share * Decimal::from(total) {
            let reason = format!(
                "{bad} of {total} instances look unhealthy, more than the allowed share {share}; \
                 making no repairs (a wider problem is likely)"
            );
            warn!(request_id = %id, bad, total, %share, "unhealthy share exceeded; not replacing");
            out.decisions.push(Decision::new(id, "held", reason));
            return Ok(());
        }
        // Where a replacement whose old instance is no longer listed goes on demand: where
        // the run's other instances are (its slots share one placement).
        let sibling = work
            .iter()
            .filter_map(|(w, _)| seen.get(&w.resource_id))
            .find(|i| i.state.is_live())
            .cloned();
        for (slot, verdict) in work {
            let place = &places[&slot.reservation_id];
            match verdict {
                Verdict::Healthy | Verdict::Unlisted => {}
                Verdict::Pending => {
                    // A run that recorded the next generation and then failed or died
                    // before TerminateInstances answered leaves the old instance running:
                    // it is taken back first (terminating a terminated one succeeds), or it
                    // would run beside its replacement to the drain, unbilled (found by the
                    // simulation, seed 8917: an impaired instance ran 24 h beside the one
                    // that replaced it at hour 18). A stopped one is taken back too, as the
                    // first attempt would have: it keeps its volumes, billed, and in a block
                    // its slot until it is terminated.
                    if let Some(i) = seen.get(&slot.resource_id)
                        && is_managed(i)
                        && !matches!(
                            i.state,
                            InstanceState::ShuttingDown | InstanceState::Terminated
                        )
                    {
                        info!(request_id = %id, instance_id = %i.instance_id, "terminating the instance a replacement began to replace");
                        self.workloads
                            .terminate_instances(&i.region, std::slice::from_ref(&i.instance_id))
                            .await?;
                    }
                    self.launch(
                        rec,
                        place,
                        &slot,
                        seen.get(&slot.resource_id).or(sibling.as_ref()),
                        "retrying the replacement launch",
                        now,
                        out,
                    )
                    .await?;
                }
                Verdict::Unhealthy(why) => {
                    let count = used.entry(slot.reservation_id.clone()).or_default();
                    let cap = self.config.max_replacements_per_reservation;
                    if *count >= cap {
                        let reason = format!(
                            "{} in slot {} of {}: {why}; not replaced, the reservation already had {count} of at most {cap} replacements",
                            slot.resource_id, slot.slot, slot.reservation_id
                        );
                        warn!(request_id = %id, instance_id = %slot.resource_id, "replacement cap reached");
                        // A dead instance left unreplaced has run its last: its run ends
                        // where it was first seen so, and the slot is left (a spot run's
                        // falls back before this: `spot_lost`).
                        if is_dead(&slot, seen) {
                            self.store.put_workload(left(&slot, now)).await?;
                        }
                        out.decisions.push(Decision::new(id, "capped", reason));
                        continue;
                    }
                    *count += 1;
                    let old = seen.get(&slot.resource_id).cloned();
                    // Record the next generation first: a crash after the terminate then
                    // retries the launch, with the same new token, instead of replacing twice.
                    // The old instance's run ends here (or where it was seen to).
                    let next = WorkloadRecord {
                        generation: slot.generation + 1,
                        state: REPLACING.into(),
                        updated_at: now,
                        ..slot.closed(run_start, now)
                    };
                    self.store.put_workload(next.clone()).await?;
                    if let Some(i) = &old
                        && is_managed(i)
                    {
                        info!(request_id = %id, instance_id = %i.instance_id, reason = %why, "terminating an unhealthy instance");
                        self.workloads
                            .terminate_instances(&i.region, std::slice::from_ref(&i.instance_id))
                            .await?;
                    }
                    self.launch(rec, place, &next, old.as_ref(), &why, now, out)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Launches the slot's replacement with the record's generation, in the first subnet of
    /// its zone with free addresses; a refusal for capacity, or every subnet full, waits for
    /// the next tick. Each call's subnet is recorded before it (`replacing@<subnet>` for
    /// any but the zone's first), and a retry asks that subnet first.
    #[allow(clippy::too_many_arguments)]
    async fn launch(
        &self,
        rec: &RequestRecord,
        place: &Place,
        slot: &WorkloadRecord,
        old: Option<&InstanceInfo>,
        why: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let deployment = &self.config.deployment_id;
        let replacement = match place {
            Place::Block(reservation, drain_at) => {
                let zone = old.map(|i| i.availability_zone.clone());
                ec2_instances::replacement(
                    &self.workloads,
                    rec,
                    reservation,
                    slot,
                    zone,
                    *drain_at,
                    deployment,
                )
                .await?
            }
            Place::Run(market) => {
                ec2_instances::run_replacement(
                    &self.workloads,
                    rec,
                    slot,
                    old,
                    market.clone(),
                    deployment,
                )
                .await?
            }
        };
        let reservation_id = slot.reservation_id.as_str();
        let specs = match replacement {
            Replacement::Launch(specs) => specs,
            Replacement::Stuck(reason) => {
                out.decisions.push(Decision::new(id, "stuck", reason));
                return Ok(());
            }
        };
        // Every request subnet in the zone, in the request's order, but the one the slot's
        // last call went to first: a call whose answer was lost (or whose run died before
        // recording it) is answered again by its token there, where another subnet with
        // room since would start a second instance.
        let Some(first) = specs.first().map(|s| s.subnet_id.clone()) else {
            out.decisions
                .push(Decision::new(id, "stuck", "no subnet to replace in"));
            return Ok(());
        };
        let mut order: Vec<&LaunchSpec> = specs.iter().collect();
        if let Some(n) =
            replacing_in(&slot.state).and_then(|s| order.iter().position(|x| x.subnet_id == s))
        {
            let asked = order.remove(n);
            order.insert(0, asked);
        }
        let mut slot = slot.clone();
        // The subnets that answered full, with EC2's code and message.
        let mut full: Vec<(String, String, String)> = Vec::new();
        let mut launched = None;
        for spec in order {
            // Where the call goes, recorded before it (the zone's first subnet is the plain
            // `replacing`, as when replacements tried one subnet).
            let state = replacing_at(&first, &spec.subnet_id);
            if slot.state != state {
                slot = WorkloadRecord {
                    state,
                    updated_at: now,
                    ..slot
                };
                self.store.put_workload(slot.clone()).await?;
            }
            match self.workloads.launch_instances(spec).await {
                Ok(l) => {
                    launched = Some(l);
                    break;
                }
                // This subnet has no free addresses: the zone's next one may.
                Err(PortError::NoCapacity { code, message })
                    if refusal::of(&code).scope == Scope::Subnet =>
                {
                    info!(request_id = %id, reservation_id, slot = slot.slot,
                        subnet_id = %spec.subnet_id, code, "the subnet is full; trying the zone's next");
                    full.push((spec.subnet_id.clone(), code, message));
                }
                Err(PortError::NoCapacity { code, message }) => {
                    // Refused: nothing started with any of this generation's tokens.
                    self.asked_none(&mut slot, now).await?;
                    out.decisions.push(Decision::new(
                        id,
                        "waiting-for-slot",
                        format!(
                            "slot {} of {reservation_id} is not back yet ({code}: {message}); a \
                             Capacity Block returns a slot about 10 minutes after termination \
                             (and on-demand capacity comes and goes), so the next tick retries",
                            slot.slot
                        ),
                    ));
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        let Some(launched) = launched else {
            // Every subnet of the zone is full: addresses free up as instances go, so a later
            // tick tries them again. The request is not failed for it (a paid block is never
            // refused for its subnets), and nothing started anywhere.
            self.asked_none(&mut slot, now).await?;
            let tried: Vec<&str> = full.iter().map(|(s, ..)| s.as_str()).collect();
            let (_, code, message) = full.last().cloned().unwrap_or_default();
            out.decisions.push(Decision::new(
                id,
                "waiting-for-addresses",
                format!(
                    "slot {} of {reservation_id} waits for addresses: every request subnet in \
                     its zone ({}) answered that {} ({code}: {message}); the next tick tries them \
                     again",
                    slot.slot,
                    tried.join(", "),
                    refusal::of(&code).means
                ),
            ));
            return Ok(());
        };
        let slot = &slot;
        let new_id = launched.first().map(|i| i.instance_id.clone());
        let started_at = launched.first().and_then(|i| i.launched_at).unwrap_or(now);
        let reason = format!(
            "{} in slot {} of {reservation_id}: {why}",
            slot.resource_id, slot.slot
        );
        let event = InstanceReplaced {
            event_key: event_key(
                rec.whose(),
                &format!("replaced-{reservation_id}-{}", slot.slot),
                u64::from(slot.generation),
            ),
            request_id: id.to_string(),
            reservation_id: reservation_id.to_string(),
            replaced_instance_id: slot.resource_id.clone(),
            new_instance_id: new_id.clone(),
            generation: slot.generation,
            reason: reason.clone(),
        };
        // No status changes, so there is no outbox write to carry this event: publish it
        // before recording the slot as running, so a failure leaves the slot `replacing` and
        // the next tick relaunches (same token, same instance) and publishes again.
        self.publish_now(outbound(&event), out).await?;
        if matches!(place, Place::Run(LaunchMarket::Spot)) {
            let cap = self.config.max_replacements_per_reservation;
            let why = format!(
                "{reason}; replaced on spot by {} (generation {}; at most {cap} replacements \
                 per run); the run is settled by what its instances ran",
                new_id.as_deref().unwrap_or("?"),
                slot.generation
            );
            let at = slot.ran.last().map(|r| r.to);
            self.interrupted(rec, slot, at, new_id.clone(), why, out)
                .await?;
        }
        if let Some(new_id) = &new_id {
            self.store
                .put_workload(WorkloadRecord {
                    resource_id: new_id.clone(),
                    state: RUNNING.into(),
                    updated_at: now,
                    started_at: Some(started_at.min(now)),
                    ended_at: None,
                    ..slot.clone()
                })
                .await?;
        }
        out.decisions.push(Decision::new(
            id,
            "replaced",
            format!(
                "{reason}; replaced by {} (generation {})",
                new_id.as_deref().unwrap_or("?"),
                slot.generation
            ),
        ));
        Ok(())
    }
}

impl<S: Store, W: Workloads, E: EventSink, C: Clock> Replacer<S, W, E, C> {
    /// `slot`, none of whose calls started anything (each was refused), recorded as waiting
    /// with no call under way: the next tick starts at the zone's first subnet.
    async fn asked_none(
        &self,
        slot: &mut WorkloadRecord,
        now: DateTime<Utc>,
    ) -> Result<(), PortError> {
        if slot.state != REPLACING {
            slot.state = REPLACING.into();
            slot.updated_at = now;
            self.store.put_workload(slot.clone()).await?;
        }
        Ok(())
    }

    /// Announces a spot run's interrupted slot (`Capacity Workload Interrupted`), before the
    /// slot's record says what became of it: a failure leaves the slot as it was, and the
    /// next tick decides and announces again, with the same key.
    async fn interrupted(
        &self,
        rec: &RequestRecord,
        slot: &WorkloadRecord,
        at: Option<DateTime<Utc>>,
        replacement: Option<String>,
        reason: String,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let event = interruption(rec, slot, at, replacement, &reason);
        self.publish_now(announced(Some(rec.team.as_str()), &event), out)
            .await?;
        out.decisions
            .push(Decision::new(&rec.request_id, "interrupted", reason));
        Ok(())
    }

    /// Why a spot run cannot get back what EC2 took from it, if it cannot: an instance lost
    /// (reclaimed, or gone unlisted) that its replacements so far (`used`) and the cap leave
    /// no room to replace with every other unhealthy one, or more than the unhealthy share of
    /// them bad at once (spot capacity is going), or a slot already left down.
    fn spot_lost(
        &self,
        work: &[(WorkloadRecord, Verdict)],
        used: &BTreeMap<String, u32>,
        bad: usize,
        seen: &BTreeMap<String, InstanceInfo>,
    ) -> Option<String> {
        let lost = work
            .iter()
            .filter(|(w, v)| lost(w, v, seen))
            .map(|(w, _)| w.resource_id.as_str())
            .collect::<Vec<_>>();
        if lost.is_empty() {
            return None;
        }
        let lost = format!(
            "{} of its {} spot instances ({}) taken back by EC2",
            lost.len(),
            work.len(),
            lost.join(", ")
        );
        let cap = self.config.max_replacements_per_reservation;
        let share = self.config.max_unhealthy_share;
        let unhealthy = work
            .iter()
            .filter(|(_, v)| matches!(v, Verdict::Unhealthy(_)))
            .count();
        let count = used.values().sum::<u32>();
        let total = work.len();
        if work.iter().any(|(w, _)| w.state == LEFT)
            || u64::from(count) + unhealthy as u64 > u64::from(cap)
        {
            Some(format!(
                "{lost}, and replacing them would pass the cap (the run had {count} of at most \
                 {cap} replacements)"
            ))
        } else if bad > 1 && Decimal::from(bad) > share * Decimal::from(total) {
            Some(format!(
                "{lost}, and {bad} of {total} are down at once, more than the allowed share \
                 {share}: spot capacity is going"
            ))
        } else {
            None
        }
    }

    /// ARCHITECTURE §9.1: a spot run that cannot be repaired falls back as `on-demand-first`
    /// does. Each lost slot is left down with its run ended where it was first seen so; then
    /// one write takes the request to `Draining` with its fall-back and announces each lost
    /// instance (`Capacity Workload Interrupted`) from the outbox. Cleanup-expired stops the
    /// rest, waits out any replacement begun before, settles the run by what its instances
    /// ran, and searches for the earliest feasible reservation. A crash between the two
    /// writes leaves a slot `left` in a spot run, which the next tick falls back for again.
    #[allow(clippy::too_many_arguments)]
    async fn fall_back(
        &self,
        rec: &RequestRecord,
        work: &[(WorkloadRecord, Verdict)],
        seen: &BTreeMap<String, InstanceInfo>,
        why: String,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let Some(run) = rec.run.clone() else {
            return Ok(());
        };
        let reason = format!(
            "spot: {why}; falling back as on-demand-first does: the run is stopped and \
             settled by what its instances ran, then the earliest feasible reservation is \
             searched for"
        );
        let mut outbox = Vec::new();
        for (slot, _) in work.iter().filter(|(w, v)| lost(w, v, seen)) {
            let left = if slot.state == LEFT {
                slot.clone()
            } else {
                let left = left(slot, now);
                self.store.put_workload(left.clone()).await?;
                left
            };
            let event = interruption(rec, &left, left.ended_at, None, &reason);
            outbox.push(announced(Some(rec.team.as_str()), &event));
        }
        let t = Transition::of(
            rec,
            RequestStatus::Draining,
            &reason,
            Some(now),
            now,
            &cause.step("fall-back"),
        )
        .with_outbox(outbox)
        .with_run(OnDemandRun {
            fall_back: Some(FallBack {
                reason: why,
                at: now,
            }),
            ..run
        });
        let written = self.store.transition(t).await?;
        warn!(request_id = %id, "spot run lost past its caps; falling back to a reservation");
        out.decisions.push(Decision::new(
            id,
            decision::written(&written, "falling-back"),
            reason,
        ));
        Ok(())
    }

    /// Publishes `event` now, with no outbox (no status changes to carry it): an entry the
    /// bus refused is an error, so the caller's next step (the slot's record) is not written
    /// and the next tick publishes again, with the same key.
    async fn publish_now(
        &self,
        event: capacity_pilot::ports::OutboundEvent,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let report = self.events.publish(&[event]).await?;
        if let Some((_, code, message)) = report.failed.into_iter().next() {
            return Err(PortError::Transient {
                service: "events",
                code,
                message,
            });
        }
        out.published += report.sent.len();
        Ok(())
    }
}

/// `Capacity Workload Interrupted` for `slot`'s instance, ended `at`: one per instance lost,
/// keyed by its replacement's generation, or by the next one when it is left down.
fn interruption(
    rec: &RequestRecord,
    slot: &WorkloadRecord,
    at: Option<DateTime<Utc>>,
    replacement: Option<String>,
    reason: &str,
) -> WorkloadInterrupted {
    let id = rec.request_id.as_str();
    WorkloadInterrupted {
        event_key: event_key(
            rec.whose(),
            &format!("interrupted-{}-{}", slot.reservation_id, slot.slot),
            u64::from(slot.generation) + u64::from(replacement.is_none()),
        ),
        request_id: id.to_string(),
        reservation_id: slot.reservation_id.clone(),
        slot: slot.slot,
        instance_id: slot.resource_id.clone(),
        falls_back: replacement.is_none(),
        interrupted_at: at,
        replacement_instance_id: replacement,
        reason: reason.to_string(),
    }
}

/// Whether `slot`'s instance has run its last: not listed, or listed not running.
fn is_dead(slot: &WorkloadRecord, seen: &BTreeMap<String, InstanceInfo>) -> bool {
    seen.get(&slot.resource_id)
        .is_none_or(|i| !i.state.is_live())
}

/// Whether a spot run lost `slot`: left down already, or dead and due a replacement.
fn lost(slot: &WorkloadRecord, v: &Verdict, seen: &BTreeMap<String, InstanceInfo>) -> bool {
    slot.state == LEFT || (matches!(v, Verdict::Unhealthy(_)) && is_dead(slot, seen))
}

/// `slot` left down: its run ends where it was first seen so (`now` when not before).
fn left(slot: &WorkloadRecord, now: DateTime<Utc>) -> WorkloadRecord {
    WorkloadRecord {
        state: LEFT.into(),
        ..slot.seen_ended(now).unwrap_or_else(|| slot.clone())
    }
}

/// Whether `state` is a slot's whose replacement is under way: [`REPLACING`], or
/// `replacing@<subnet>` while its launch goes to a subnet other than its zone's first.
pub fn is_replacing(state: &str) -> bool {
    state == REPLACING || replacing_in(state).is_some()
}

/// The subnet other than its zone's first that a replacing slot's launch went to.
fn replacing_in(state: &str) -> Option<&str> {
    state
        .strip_prefix(REPLACING)
        .and_then(|rest| rest.strip_prefix('@'))
        .filter(|subnet| !subnet.is_empty())
}

/// A replacing slot's state while its launch goes to `subnet` (the zone's first: `first`).
fn replacing_at(first: &str, subnet: &str) -> String {
    if subnet == first {
        REPLACING.into()
    } else {
        format!("{REPLACING}@{subnet}")
    }
}

fn ignored(id: &RequestId, status: RequestStatus) -> Decision {
    Decision::new(
        id,
        "ignored",
        format!(
            "instances are replaced only in a running window before its drain; none is (the \
             request is {status})"
        ),
    )
}

/// What EC2's listing `seen` says of a slot, and a note when it is left alone unlisted.
fn verdict(
    slot: &WorkloadRecord,
    seen: &BTreeMap<String, InstanceInfo>,
    flagged: &BTreeSet<String>,
    drain: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> (Verdict, Option<String>) {
    if is_replacing(&slot.state) {
        return (Verdict::Pending, None);
    }
    if slot.state == LEFT {
        // Down past its cap: nothing more is done for it.
        return (Verdict::Healthy, None);
    }
    let v = match seen.get(&slot.resource_id) {
        // Describe* lags new instances (aws-reference §11.3): one recorded less than the
        // listing-lag bound ago may be there unlisted.
        None if now - slot.updated_at < LISTING_LAG_BOUND => {
            return (
                Verdict::Unlisted,
                Some(format!(
                    "{} in slot {} of {} is not listed by EC2 yet; it was recorded at {}, less \
                     than the listing lag's {} min bound ago, so it is not replaced",
                    slot.resource_id,
                    slot.slot,
                    slot.reservation_id,
                    slot.updated_at,
                    LISTING_LAG_BOUND.num_minutes()
                )),
            );
        }
        None => Verdict::Unhealthy(format!(
            "EC2 has not listed it in the {} min since it was recorded",
            LISTING_LAG_BOUND.num_minutes()
        )),
        Some(i) if !is_managed(i) => Verdict::Healthy,
        Some(i) if flagged.contains(&i.instance_id) => {
            Verdict::Unhealthy("an AWS Health event names it".into())
        }
        Some(i) if !i.state.is_live() => {
            Verdict::Unhealthy(format!("it is unexpectedly {}", i.state.as_str()))
        }
        Some(i) if i.health == InstanceHealth::Impaired => {
            Verdict::Unhealthy("its status checks are impaired".into())
        }
        Some(i) => match due_change(i, drain, now) {
            Some(c) => Verdict::Unhealthy(format!(
                "EC2 has scheduled its {} from {}; it is replaced {} min ahead, before its \
                 window's drain",
                c.code,
                c.not_before,
                SCHEDULED_CHANGE_LEAD.num_minutes()
            )),
            None => Verdict::Healthy,
        },
    };
    (v, None)
}

/// The scheduled retirement or stop to act on now (review N16): one whose start is at most
/// [`SCHEDULED_CHANGE_LEAD`] away and comes before the slot's drain (`drain`; after it, the
/// drain ends the instance first). Reboots and maintenance keep the instance: none.
fn due_change(
    i: &InstanceInfo,
    drain: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<&ScheduledChange> {
    i.scheduled
        .iter()
        .filter(|c| c.takes_instance())
        .filter(|c| c.not_before - SCHEDULED_CHANGE_LEAD <= now)
        .filter(|c| drain.is_none_or(|d| c.not_before < d))
        .min_by_key(|c| c.not_before)
}

/// The drain of the running window `slot` serves, if any.
fn window_drain(windows: &[WindowRecord], slot: &WorkloadRecord) -> Option<DateTime<Utc>> {
    windows
        .iter()
        .filter(|w| w.state == WindowState::Running && w.reservation_id() == slot.reservation_id)
        .find_map(|w| w.next_action_at)
}

/// Whether a Health `scheduledChange` event's code takes the instance away (retirement,
/// stop, termination) rather than keeping it (reboot, maintenance): aws-reference §6.3's
/// codes.
fn takes_instance(d: &Value) -> bool {
    let code = d
        .get("eventTypeCode")
        .and_then(Value::as_str)
        .unwrap_or_default();
    ["RETIREMENT", "STOP", "TERMINATION"]
        .iter()
        .any(|k| code.contains(k))
}

/// The announcement of a Health event's maintenance of `instance_id`, keyed by the event's
/// `communicationId` (one announcement per instance per Health event, redelivered or not).
fn maintenance_scheduled(
    id: &RequestId,
    instance_id: &str,
    d: &Value,
    now: DateTime<Utc>,
) -> InstanceMaintenanceScheduled {
    let text = |k: &str| d.get(k).and_then(Value::as_str);
    let code = text("eventTypeCode")
        .unwrap_or("scheduled maintenance")
        .to_string();
    let at = |k: &str| {
        text(k)
            .and_then(|t| DateTime::parse_from_rfc2822(t).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    let (starts_at, ends_at) = (at("startTime"), at("endTime"));
    let reference = text("communicationId")
        .or_else(|| text("eventArn"))
        .map_or_else(|| now.timestamp().to_string(), str::to_string);
    InstanceMaintenanceScheduled {
        event_key: format!("{id}:maintenance-{instance_id}:{reference}"),
        request_id: id.to_string(),
        instance_id: instance_id.to_string(),
        reason: format!(
            "EC2 has scheduled {code} for {instance_id}{}: it keeps the instance, so it is \
             not replaced; plan for the interruption",
            starts_at.map(|t| format!(" from {t}")).unwrap_or_default()
        ),
        code,
        starts_at,
        ends_at,
    }
}

/// The instance slots of a live request's running windows whose drain a replacement started
/// now would not reach, as the tick's read shows them.
fn watched_slots(live: &LiveRequest, now: DateTime<Utc>) -> Vec<WorkloadRecord> {
    let run = match live.status {
        RequestStatus::RunningOnDemand => Some(ON_DEMAND),
        RequestStatus::RunningSpot => Some(SPOT),
        _ => None,
    };
    if let Some(label) = run {
        // The run's record decides whether its drain is near ([`Replacer::repair_run`]).
        return live
            .workloads
            .iter()
            .filter(|w| w.reservation_id == label && w.resource_id.starts_with("i-"))
            .cloned()
            .collect();
    }
    let running: BTreeSet<&str> = live
        .windows
        .iter()
        .filter(|w| {
            w.state == WindowState::Running
                && w.next_action_at
                    .is_some_and(|drain| now + LAUNCH_FUNCTION_TIMEOUT < drain)
        })
        .map(|w| w.reservation_id())
        .collect();
    live.workloads
        .iter()
        .filter(|w| running.contains(w.reservation_id.as_str()) && w.resource_id.starts_with("i-"))
        .cloned()
        .collect()
}

/// Tagged `capacity-pilot:managed=true`, the value the IAM conditions on TerminateInstances
/// demand (any other value is not ours to replace; review M8a).
fn is_managed(i: &InstanceInfo) -> bool {
    i.tags.get(MANAGED_TAG).map(String::as_str) == Some("true")
}

/// The request a managed instance belongs to; `None` for anything we must not touch.
fn managed_request(i: &InstanceInfo) -> Option<RequestId> {
    if !is_managed(i) {
        return None;
    }
    i.tags
        .get(REQUEST_TAG)
        .and_then(|t| RequestId::parse(t).ok())
}

/// Instance ids a Health event names: `resources` holds them (not ARNs) and
/// `affectedEntities` repeats them.
fn health_instance_ids(ev: &EventBridgeEvent<Value>) -> Vec<String> {
    let mut ids: BTreeSet<String> = ev
        .resources
        .iter()
        .flatten()
        .map(|r| r.rsplit('/').next().unwrap_or(r).to_string())
        .filter(|r| r.starts_with("i-"))
        .collect();
    if let Some(entities) = ev.detail.get("affectedEntities").and_then(Value::as_array) {
        for e in entities {
            if let Some(v) = e.get("entityValue").and_then(Value::as_str)
                && v.starts_with("i-")
            {
                ids.insert(v.to_string());
            }
        }
    }
    ids.into_iter().collect()
}

#[cfg(test)]
mod tests;
