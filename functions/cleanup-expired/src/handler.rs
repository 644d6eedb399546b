//! cleanup-expired: drains each reserved window ahead of AWS's forced termination, then, once
//! the window has ended, sweeps what is left and marks the request `Ended` (or `Reserved`
//! when a later segment remains). ARCHITECTURE section 4, "Drain timing" and "Segments".
//!
//! Events only wake this function up. The schedule drives the drain from the table; an
//! Expiration Warning (sent 10 minutes before termination starts) can only bring it forward.
//! Every step is idempotent: stopping, terminating and deleting again changes nothing, and
//! each write is conditional on the version and records its cause, so duplicate events,
//! overlapping ticks and concurrent invocations act once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::config::Config;
use capacity_pilot::decision;
pub use capacity_pilot::decision::{Decision, HandlerError};
use capacity_pilot::domain::events::{
    ReservationEnded, ReservationExpiring, WorkloadDrained, event_key, outbound,
};
use capacity_pilot::domain::naming::{MANAGED_TAG, REQUEST_TAG};
use capacity_pilot::domain::offering::Product;
use capacity_pilot::domain::request::RequestId;
use capacity_pilot::domain::reservation::{Reservation, ReservationState};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::time_rules::{drain_start, forced_termination_lead};
use capacity_pilot::outbox;
use capacity_pilot::ports::{
    CapacityMarket, Cause, Clock, EventSink, InstanceFilter, PortError, RequestRecord, Store,
    Transition, Workloads, WriteOutcome,
};
use capacity_pilot::workload::ec2_instances::ours;
use capacity_pilot::workload::{self, DrainTarget};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::warn;

/// Both documented spellings of EC2's warning (aws-reference.md section 6.1).
pub const EXPIRATION_WARNINGS: [&str; 2] = [
    "Capacity Block Expiration Warning",
    "Capacity Block Reservation Expiration Warning",
];

/// The statuses in which a request may hold a window that needs draining or ending.
pub const DUE: [RequestStatus; 5] = [
    RequestStatus::Active,
    RequestStatus::Reserved,
    RequestStatus::RunningOnDemand,
    RequestStatus::RunningSpot,
    RequestStatus::Draining,
];

#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub decisions: Vec<Decision>,
    pub published: usize,
}

/// `detail` of a Capacity Block expiration warning; AWS's kebab-case as it is.
#[derive(Debug, Clone, Deserialize)]
pub struct ExpirationWarning {
    #[serde(rename = "capacity-reservation-id")]
    pub capacity_reservation_id: String,
    /// Informational only: the table's reservation says when the window ends.
    #[serde(rename = "end-date", default)]
    pub end_date: Option<String>,
}

/// One reserved window (a segment of one or more reservations ending together), or an
/// on-demand run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub reservation_ids: Vec<String>,
    /// Where its workload runs; on-demand runs may be in any of the request's regions.
    pub regions: Vec<String>,
    /// Index among the request's windows, in time order.
    pub segment: u32,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub forced_termination_at: DateTime<Utc>,
    pub drain_starts_at: DateTime<Utc>,
    pub instance_type: String,
    pub on_demand: bool,
}

pub struct Cleaner<S, M, W, E, C> {
    pub store: S,
    pub market: M,
    pub workloads: W,
    pub events: E,
    pub clock: C,
    pub config: Arc<Config>,
}

impl<S: Store, M: CapacityMarket, W: Workloads, E: EventSink, C: Clock> Cleaner<S, M, W, E, C> {
    pub async fn handle(&self, ev: EventBridgeEvent<Value>) -> Result<Outcome, HandlerError> {
        let now = self.clock.now().await?;
        let base = ev.id.clone().unwrap_or_else(|| format!("{now}"));
        let mut out = Outcome::default();
        let mut errors: Vec<PortError> = Vec::new();
        let mut done: BTreeSet<RequestId> = BTreeSet::new();

        let detail_type = ev.detail_type.as_str();
        let source = ev.source.as_str();
        let scheduled = detail_type == "Scheduled Event" && source == "aws.events";
        let wake = match detail_type {
            "Scheduled Event" if source == "aws.events" => true,
            d if EXPIRATION_WARNINGS.contains(&d) && source == "aws.ec2" => {
                match serde_json::from_value::<ExpirationWarning>(ev.detail.clone()) {
                    Err(e) => warn!(error = %e, "an expiration warning without a readable detail"),
                    Ok(w) => {
                        let region = ev.region.clone().unwrap_or_default();
                        match self
                            .warned(&w, &region, &base, now, &mut out, &mut done)
                            .await
                        {
                            Ok(()) => {}
                            Err(e) => {
                                warn!(reservation_id = %w.capacity_reservation_id, error = %e, "warning not handled");
                                errors.push(e);
                            }
                        }
                    }
                }
                // Events are wake-ups: the table may hold other due work too.
                true
            }
            other => {
                warn!(
                    detail_type = other,
                    source, "ignoring an event this function does not handle"
                );
                false
            }
        };
        if wake {
            for item in self.store.due(&DUE, now).await? {
                if done.contains(&item.request_id) {
                    continue;
                }
                if let Err(e) = self
                    .process(&item.request_id, &base, None, now, &mut out)
                    .await
                {
                    warn!(request_id = %item.request_id, error = %e, "cleanup step failed");
                    errors.push(e);
                }
            }
        }
        if scheduled {
            for region in &self.config.allowed_regions {
                if let Err(e) = self.sweep(region, &mut out).await {
                    warn!(region, error = %e, "sweeping orphaned instances failed");
                    errors.push(e);
                }
            }
        }
        out.published = outbox::flush(&self.store, &self.events).await?;
        decision::log(&out.decisions);
        decision::finish(out, errors)
    }

    /// Terminates managed instances that nothing we run covers any more: their request is
    /// over (ended, failed, cancelled) or gone from the table. Requests still in flight keep
    /// theirs, even between a launch and its commit. Never touches an untagged instance.
    async fn sweep(&self, region: &str, out: &mut Outcome) -> Result<(), PortError> {
        let found = self
            .workloads
            .describe_instances(
                region,
                &InstanceFilter {
                    managed_only: true,
                    ..Default::default()
                },
            )
            .await?;
        let mut status: BTreeMap<String, Option<RequestStatus>> = BTreeMap::new();
        let mut orphans: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for i in found {
            if !i.state.is_live() || !i.tags.contains_key(MANAGED_TAG) {
                continue;
            }
            let owner = i.tags.get(REQUEST_TAG).cloned().unwrap_or_default();
            let st = match status.get(&owner) {
                Some(s) => *s,
                None => {
                    let s = match RequestId::parse(&owner) {
                        Ok(id) => self.store.get_request(&id).await?.map(|r| r.status),
                        Err(_) => None,
                    };
                    status.insert(owner.clone(), s);
                    s
                }
            };
            if st.is_none_or(RequestStatus::is_terminal) {
                orphans.entry(owner).or_default().push(i.instance_id);
            }
        }
        for (owner, ids) in orphans {
            let why = match status.get(&owner).copied().flatten() {
                Some(s) => format!("its request {owner} is {s}"),
                None => format!("no request {owner:?} is recorded"),
            };
            warn!(region, request_id = %owner, instances = ?ids, "terminating managed instances no reservation covers: {why}");
            self.workloads.terminate_instances(region, &ids).await?;
            out.decisions.push(Decision {
                request_id: owner,
                action: "swept",
                reason: format!(
                    "terminated {} in {region}: managed, still running, and {why}",
                    ids.join(", ")
                ),
            });
        }
        Ok(())
    }

    /// AWS says termination starts in 10 minutes: find the request by the reservation's tag
    /// and drain now if the schedule has not already.
    async fn warned(
        &self,
        w: &ExpirationWarning,
        region: &str,
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
        done: &mut BTreeSet<RequestId>,
    ) -> Result<(), PortError> {
        let rid = &w.capacity_reservation_id;
        let found = self
            .market
            .describe(Product::CapacityBlock, region, rid)
            .await?;
        let Some(id) = found
            .and_then(|r| r.request_tag)
            .and_then(|t| RequestId::parse(&t).ok())
        else {
            warn!(reservation_id = %rid, region, end_date = ?w.end_date,
                "expiration warning for a reservation not tagged for any request; ignoring");
            return Ok(());
        };
        done.insert(id.clone());
        self.process(&id, base, Some(rid), now, out).await
    }

    async fn process(
        &self,
        id: &RequestId,
        base: &str,
        warned: Option<&str>,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let Some(rec) = self.store.get_request(id).await? else {
            return Ok(());
        };
        if !DUE.contains(&rec.status) {
            out.decisions.push(Decision::new(
                id,
                "ignored",
                format!("nothing to drain while the request is {}", rec.status),
            ));
            return Ok(());
        }
        let reservations = self.store.reservations(id).await?;
        let windows = plan_windows(&rec, &reservations, self.config.default_drain_minutes);
        if rec.status == RequestStatus::Draining {
            return self.end_if_over(&rec, &windows, base, now, out).await;
        }
        let Some(idx) = current(&rec, &windows) else {
            out.decisions.push(Decision::new(
                id,
                "waiting",
                "no reserved window is open or ahead",
            ));
            return Ok(());
        };
        let w = &windows[idx];
        let warned_here = warned.is_some_and(|r| w.reservation_ids.iter().any(|x| x == r));
        let drain_at = if warned_here {
            w.drain_starts_at.min(now)
        } else {
            w.drain_starts_at
        };
        if now < drain_at {
            out.decisions.push(Decision::new(
                id,
                "waiting",
                format!(
                    "segment {} drains at {drain_at}, ahead of forced termination at {}",
                    w.segment, w.forced_termination_at
                ),
            ));
            return Ok(());
        }
        let stopped = self.stop(&rec, w).await?;
        let version = rec.version + 1;
        let expiring = ReservationExpiring {
            event_key: event_key(id.as_str(), "expiring", version),
            request_id: id.to_string(),
            reservation_ids: w.reservation_ids.clone(),
            segment: w.segment,
            ends_at: w.end,
            drain_starts_at: w.drain_starts_at.min(drain_at),
            forced_termination_at: w.forced_termination_at,
        };
        let drained = WorkloadDrained {
            event_key: event_key(id.as_str(), "drained", version),
            request_id: id.to_string(),
            reservation_id: w
                .reservation_ids
                .first()
                .cloned()
                .unwrap_or_else(|| "on-demand".into()),
            segment: w.segment,
            resource_ids: stopped.clone(),
            drained_at: now,
            forced_termination_at: w.forced_termination_at,
        };
        let why = if warned_here && now < w.drain_starts_at {
            "an expiration warning brought the drain forward"
        } else {
            "the drain start was reached"
        };
        let reason = format!(
            "{why}: stopped {} ahead of forced termination at {} (segment {} ends {})",
            if stopped.is_empty() {
                "nothing (no workload was running)".to_string()
            } else {
                stopped.join(", ")
            },
            w.forced_termination_at,
            w.segment,
            w.end
        );
        let t = Transition::of(
            &rec,
            RequestStatus::Draining,
            &reason,
            Some(w.end),
            now,
            &Cause::new(format!("{base}#drain")),
        )
        .with_outbox(vec![outbound(&expiring), outbound(&drained)]);
        let written = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            id,
            decision::written(&written, "drained"),
            reason,
        ));
        if matches!(written, WriteOutcome::Applied { .. }) && now >= w.end {
            // The drain itself came late (a long outage): end the window in the same run.
            if let Some(rec) = self.store.get_request(id).await? {
                let windows = plan_windows(&rec, &reservations, self.config.default_drain_minutes);
                return self.end_if_over(&rec, &windows, base, now, out).await;
            }
        }
        Ok(())
    }

    /// A drained window that has ended: sweep what is left, then `Ended`, or `Reserved`
    /// when a later segment remains.
    async fn end_if_over(
        &self,
        rec: &RequestRecord,
        windows: &[Window],
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let Some(idx) = draining(rec, windows) else {
            // Nothing recorded to wait for: end the request now.
            return self.end(rec, None, None, base, now, out).await;
        };
        let w = &windows[idx];
        if now < w.end {
            out.decisions.push(Decision::new(
                id,
                "waiting",
                format!("drained; segment {} ends at {}", w.segment, w.end),
            ));
            return Ok(());
        }
        self.end(rec, Some(w), windows.get(idx + 1), base, now, out)
            .await
    }

    async fn end(
        &self,
        rec: &RequestRecord,
        w: Option<&Window>,
        next: Option<&Window>,
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let mut cleaned = match w {
            Some(w) => self.stop(rec, w).await?,
            None => vec![],
        };
        // Orphans: managed instances still tagged for the request. While a later segment
        // remains, only those of the ended window (or of none) are swept.
        let regions: Vec<String> = match w {
            Some(w) => w.regions.clone(),
            None => rec.request.regions.clone(),
        };
        for region in &regions {
            let found = self
                .workloads
                .describe_instances(
                    region,
                    &InstanceFilter {
                        request_id: Some(id.clone()),
                        managed_only: true,
                        ..Default::default()
                    },
                )
                .await?;
            let orphans: Vec<String> = found
                .into_iter()
                .filter(|i| ours(i, id))
                .filter(|i| match (next, w) {
                    (Some(_), Some(w)) => i
                        .reservation_id
                        .as_ref()
                        .is_none_or(|r| w.reservation_ids.contains(r)),
                    _ => true,
                })
                .map(|i| i.instance_id)
                .filter(|i| !cleaned.iter().any(|c| c == &format!("instance:{i}")))
                .collect();
            if !orphans.is_empty() {
                warn!(request_id = %id, region, instances = ?orphans, "terminating orphaned managed instances");
                self.workloads.terminate_instances(region, &orphans).await?;
                cleaned.extend(orphans.into_iter().map(|i| format!("instance:{i}")));
            }
        }
        // A reservation whose later segment is still to come (a multi-segment training
        // plan) has not ended: only the segment has, and its Drained event said so.
        let reservation_ids: Vec<String> = w
            .map(|w| w.reservation_ids.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|r| next.is_none_or(|n| !n.reservation_ids.contains(r)))
            .collect();
        let (to, next_action_at) = match next {
            Some(n) => (RequestStatus::Reserved, Some(n.start)),
            None => (RequestStatus::Ended, None),
        };
        let ended = ReservationEnded {
            event_key: event_key(id.as_str(), "ended", rec.version + 1),
            request_id: id.to_string(),
            reservation_ids: reservation_ids.clone(),
            ended_at: now,
            cleaned_up: cleaned.clone(),
            spent_usd: rec.spent.to_usd(),
        };
        let reason = format!(
            "{} ended{}; cleaned up: {}",
            match (w, reservation_ids.is_empty()) {
                (Some(w), true) if next.is_some() => format!("segment {}", w.segment),
                (_, true) => "the run".to_string(),
                (_, false) => reservation_ids.join(", "),
            },
            match next {
                Some(n) => format!("; the next segment starts at {}", n.start),
                None => String::new(),
            },
            if cleaned.is_empty() {
                "nothing left".to_string()
            } else {
                cleaned.join(", ")
            }
        );
        let t = Transition::of(
            rec,
            to,
            &reason,
            next_action_at,
            now,
            &Cause::new(format!("{base}#end")),
        )
        .with_outbox(if next.is_none() || !reservation_ids.is_empty() {
            vec![outbound(&ended)]
        } else {
            vec![]
        });
        let written = self.store.transition(t).await?;
        let action = if to == RequestStatus::Ended {
            "ended"
        } else {
            "segment-ended"
        };
        out.decisions.push(Decision::new(
            id,
            decision::written(&written, action),
            reason,
        ));
        Ok(())
    }

    /// Stops the window's workload; returns what it acted on. Its kind's module says how;
    /// every call there is idempotent, so a repeat changes nothing.
    async fn stop(&self, rec: &RequestRecord, w: &Window) -> Result<Vec<String>, PortError> {
        workload::drain(
            &self.workloads,
            &self.store,
            &self.config,
            rec,
            &w.drain_target(),
        )
        .await
    }
}

impl Window {
    /// What draining this window acts on.
    pub fn drain_target(&self) -> DrainTarget {
        DrainTarget {
            reservation_ids: self.reservation_ids.clone(),
            regions: self.regions.clone(),
            segment: self.segment,
            instance_type: self.instance_type.clone(),
            on_demand: self.on_demand,
        }
    }
}

/// The request's windows in time order: each segment of each usable reservation, those
/// ending together merged. A request running on demand has one window of its duration.
pub fn plan_windows(
    rec: &RequestRecord,
    reservations: &[Reservation],
    default_drain_minutes: u32,
) -> Vec<Window> {
    let drain = rec.request.drain_minutes;
    let mut all: Vec<Window> = Vec::new();
    for r in reservations {
        if matches!(
            r.state,
            ReservationState::PaymentFailed
                | ReservationState::Failed
                | ReservationState::Cancelled
        ) {
            continue;
        }
        let kind = r.window_kind();
        for s in &r.segments {
            let forced = s.end - forced_termination_lead(kind);
            let starts = drain_start(s.end, kind, drain, default_drain_minutes);
            match all.iter_mut().find(|w| w.end == s.end) {
                Some(w) => {
                    if !w.reservation_ids.contains(&r.id) {
                        w.reservation_ids.push(r.id.clone());
                    }
                    if !w.regions.contains(&r.region) {
                        w.regions.push(r.region.clone());
                    }
                    w.forced_termination_at = w.forced_termination_at.min(forced);
                    w.drain_starts_at = w.drain_starts_at.min(starts);
                    w.start = w.start.min(s.start);
                }
                None => all.push(Window {
                    reservation_ids: vec![r.id.clone()],
                    regions: vec![r.region.clone()],
                    segment: 0,
                    start: s.start,
                    end: s.end,
                    forced_termination_at: forced,
                    drain_starts_at: starts,
                    instance_type: r.instance_type.clone(),
                    on_demand: false,
                }),
            }
        }
    }
    if all.is_empty()
        && matches!(
            rec.status,
            RequestStatus::RunningOnDemand | RequestStatus::RunningSpot | RequestStatus::Draining
        )
    {
        // On demand there is no forced termination: the run ends after its duration.
        let end = match rec.status {
            RequestStatus::Draining => rec.next_action_at.unwrap_or(rec.updated_at),
            _ => rec.updated_at + rec.request.duration(),
        };
        let drain = Duration::minutes(i64::from(drain.max(default_drain_minutes)));
        all.push(Window {
            reservation_ids: vec![],
            regions: rec.request.regions.clone(),
            segment: 0,
            start: end - rec.request.duration(),
            end,
            forced_termination_at: end,
            drain_starts_at: end - drain,
            instance_type: rec
                .request
                .instance_types
                .first()
                .cloned()
                .unwrap_or_default(),
            on_demand: true,
        });
    }
    all.sort_by_key(|w| (w.end, w.start));
    for (i, w) in all.iter_mut().enumerate() {
        w.segment = i as u32;
    }
    all
}

/// The window an undrained request is in (or waiting for): the first to end after the
/// request's last write, which happened before it opened (Reserved) or inside it (Active).
fn current(rec: &RequestRecord, windows: &[Window]) -> Option<usize> {
    windows.iter().position(|w| w.end > rec.updated_at)
}

/// The window a draining request drained: its end is the `next_action_at` the drain wrote.
fn draining(rec: &RequestRecord, windows: &[Window]) -> Option<usize> {
    let mark = rec.next_action_at.unwrap_or(rec.updated_at);
    windows
        .iter()
        .position(|w| w.end >= mark)
        .or_else(|| windows.len().checked_sub(1))
}

#[cfg(test)]
mod tests;
