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
    ReservationEnded, ReservationExpiring, WorkloadDrained, ending_events, event_key, outbound,
};
use capacity_pilot::domain::extension::{self, ExtendWhen};
use capacity_pilot::domain::money::MicroUsd;
use capacity_pilot::domain::naming::{
    DEPLOYMENT_TAG, DRAIN_AT_TAG, MANAGED_TAG, REQUEST_TAG, drain_at_value,
};
use capacity_pilot::domain::notices::{self, LeadKind, NoticeMarks, announced};
use capacity_pilot::domain::offering::Product;
use capacity_pilot::domain::request::RequestId;
use capacity_pilot::domain::reservation::Reservation;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::time_rules::{
    LAUNCH_FUNCTION_TIMEOUT, LISTING_LAG_BOUND, OVERDUE_AFTER, PURCHASE_LEAD,
};
use capacity_pilot::domain::window::{
    self, DrainLead, FOLLOWS_WINDOWS, HOLDS_WINDOWS, WindowState,
};
use capacity_pilot::outbox;
use capacity_pilot::ports::{
    Agenda, CapacityMarket, Cause, Clock, DueItem, EventSink, FallBack, InstanceFilter,
    InstanceState, PortError, RequestRecord, Settle, Store, Transition, WindowUpdate,
    WorkloadRecord, Workloads, WriteOutcome,
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

/// The statuses in which a request may hold a window that needs draining or ending: every
/// status a reserved window can be in beside (a split's kept block drains while its
/// replacement is searched for or bought), and the on-demand runs.
pub fn due_statuses() -> Vec<RequestStatus> {
    HOLDS_WINDOWS
        .into_iter()
        .chain([RequestStatus::RunningOnDemand, RequestStatus::RunningSpot])
        .collect()
}
/// At most this many window steps (a drain, an end) per request and run: enough for a plan
/// whose every window passed during an outage.
const MAX_STEPS: usize = 16;

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

impl ExpirationWarning {
    /// The end the warning is for, when its `end-date` reads as a time.
    pub fn end(&self) -> Option<DateTime<Utc>> {
        self.end_date
            .as_deref()
            .and_then(|d| DateTime::parse_from_rfc3339(d).ok())
            .map(|d| d.with_timezone(&Utc))
    }
}

/// An Expiration Warning, with its reservation as AWS reported it when the warning came.
#[derive(Debug, Clone)]
struct Warned {
    reservation_id: String,
    /// The end it warns of (`detail.end-date`).
    end: Option<DateTime<Utc>>,
    /// Its reservation as read back just now.
    seen: Reservation,
}

impl Warned {
    /// Whether it brings window `w`'s drain forward: it names `w`'s reservation and the end
    /// `w` has as read back (ARCHITECTURE §9.3: a warning for an end that has since moved
    /// is ignored; one without a readable end-date counts, as before).
    fn applies(&self, w: &window::Window) -> bool {
        self.reservation_id == w.reservation.id
            && w.last_of_reservation
            && self
                .end
                .is_none_or(|e| (e - w.end()).num_seconds().abs() < 60)
    }
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
    /// The request's last window: no other is still to end, and no search or purchase
    /// under way may add one.
    pub last: bool,
}

pub struct Cleaner<S, M, W, E, C> {
    pub store: S,
    pub market: M,
    pub workloads: W,
    pub events: E,
    pub clock: C,
    pub config: Arc<Config>,
    /// Whether this process has planted each region's detector of unrecorded reservations
    /// ([`detect::Planted`]).
    pub planted: detect::Planted,
}

impl<S: Store, M: CapacityMarket, W: Workloads, E: EventSink, C: Clock> Cleaner<S, M, W, E, C> {
    pub async fn handle(&self, ev: EventBridgeEvent<Value>) -> Result<Outcome, HandlerError> {
        let now = self.clock.now().await?;
        let run = outbox::Run::start(&self.store, now);
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
        let mut agenda = None;
        if wake {
            let a = agenda.insert(self.store.agenda(now).await?);
            if scheduled {
                overdue(a, now);
            }
            // ARCHITECTURE §9.1's upgrade: a terminal request written before the rule with a
            // window not ended loses the TTL it was given then, the first time a tick reads
            // it (the sweep reads one whose window runs, below).
            for id in a.stale_ttl.clone() {
                if let Err(e) = self.upgrade(&id, now, &mut out).await {
                    warn!(request_id = %id, error = %e, "upgrade failed; the next tick tries again");
                    errors.push(e);
                }
            }
            // A request searching or buying is ours only for a window it holds.
            let mine = |d: &DueItem| {
                FOLLOWS_WINDOWS.contains(&d.status)
                    || matches!(
                        d.status,
                        RequestStatus::RunningOnDemand | RequestStatus::RunningSpot
                    )
                    || d.window_due(now)
                    || d.notice_due(now)
            };
            for item in a.due_in(&due_statuses()).into_iter().filter(mine) {
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
                if let Err(e) = self.sweep(region, agenda.as_ref(), now, &mut out).await {
                    warn!(region, error = %e, "sweeping orphaned instances failed");
                    errors.push(e);
                }
            }
            // ARCHITECTURE §9.1: hourly per region, what this deployment holds and no
            // request records.
            for region in &self.config.allowed_regions {
                if let Err(e) = self.detect(region, agenda.as_ref(), now, &mut out).await {
                    warn!(region, error = %e, "detecting unrecorded reservations failed");
                    errors.push(e);
                }
            }
            self.planted.done();
        }
        out.published =
            outbox::flush(&self.store, &self.events, run.with_agenda(agenda.as_ref())).await?;
        decision::log(&out.decisions);
        decision::finish(out, errors)
    }

    /// Terminates managed instances of this deployment that nothing we run covers any more:
    /// their request is over (ended, failed, cancelled) or gone from the table. Requests
    /// still in flight keep theirs, even between a launch and its commit. Never touches an
    /// instance not tagged managed (`"true"`, as IAM requires) or not tagged with this
    /// deployment (ARCHITECTURE §8.7): another stack's requests are not in this table, and
    /// an instance from before deployments were tagged may be another stack's. One failed
    /// terminate does not stop the sweep of the rest.
    async fn sweep(
        &self,
        region: &str,
        agenda: Option<&Agenda>,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
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
        // Each owner's status, and the reservations of its windows not yet drained (`None`:
        // a request the read shows due, not live, so its windows are not in hand).
        type Owner = (Option<RequestStatus>, Option<BTreeSet<String>>);
        let mut owners: BTreeMap<String, Owner> = BTreeMap::new();
        let mut orphans: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for i in found {
            if !i.state.is_live()
                || i.tags.get(MANAGED_TAG).map(String::as_str) != Some("true")
                || i.tags.get(DEPLOYMENT_TAG) != Some(&self.config.deployment_id)
            {
                continue;
            }
            let owner = i.tags.get(REQUEST_TAG).cloned().unwrap_or_default();
            if !owners.contains_key(&owner) {
                // The tick's read shows every request whose workloads may be running,
                // with its windows; only an owner it does not show is read.
                let (s, windows) = match RequestId::parse(&owner) {
                    Ok(id) => match agenda.and_then(|a| a.status_of(&id)) {
                        Some(s) => (Some(s), agenda.and_then(|a| shown_windows(a, &id))),
                        None => match self.store.get_request(&id).await? {
                            Some(r) => {
                                // One written before ARCHITECTURE §9.1 whose window runs:
                                // the tick's read did not show it live.
                                if r.status.is_terminal()
                                    && !window::archivable(r.status, &r.windows)
                                {
                                    self.upgrade(&id, now, out).await?;
                                }
                                (Some(r.status), Some(r.windows))
                            }
                            None => (None, Some(vec![])),
                        },
                    },
                    Err(_) => (None, Some(vec![])),
                };
                let undrained = windows.map(|w| window::undrained_reservations(&w));
                owners.insert(owner.clone(), (s, undrained));
            }
            let (st, undrained) = &owners[&owner];
            // A paid window is served to its drain whatever became of its request
            // (ARCHITECTURE §9.1): its instances are the drain's to stop, not the sweep's.
            // A request shown due but not live has no window running, but may have one a
            // launch has not committed yet: an instance in a reservation waits a tick.
            let covered = i
                .reservation_id
                .as_ref()
                .is_some_and(|r| undrained.as_ref().is_none_or(|u| u.contains(r)));
            if st.is_none_or(RequestStatus::is_terminal) && !covered {
                orphans.entry(owner).or_default().push(i.instance_id);
            }
        }
        let mut failed = None;
        for (owner, ids) in orphans {
            let why = match owners.get(&owner).and_then(|o| o.0) {
                Some(s) => format!("its request {owner} is {s}"),
                None => format!("no request {owner:?} is recorded"),
            };
            warn!(region, request_id = %owner, instances = ?ids, "terminating managed instances no reservation covers: {why}");
            if let Err(e) = self.workloads.terminate_instances(region, &ids).await {
                warn!(region, request_id = %owner, instances = ?ids, error = %e,
                    "sweeping these failed; the rest are swept, and the next sweep tries again");
                failed.get_or_insert(e);
                continue;
            }
            out.decisions.push(Decision {
                request_id: owner,
                action: "swept",
                reason: format!(
                    "terminated {} in {region}: managed, still running, and {why}",
                    ids.join(", ")
                ),
            });
        }
        failed.map_or(Ok(()), Err)
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
        let Some((id, seen)) = found.and_then(|r| {
            let id = RequestId::parse(r.request_tag.as_deref()?).ok()?;
            Some((id, r))
        }) else {
            warn!(reservation_id = %rid, region, end_date = ?w.end_date,
                "expiration warning for a reservation not tagged for any request; ignoring");
            return Ok(());
        };
        done.insert(id.clone());
        let warned = Warned {
            reservation_id: rid.clone(),
            end: w.end(),
            seen,
        };
        self.process(&id, base, Some(&warned), now, out).await
    }

    async fn process(
        &self,
        id: &RequestId,
        base: &str,
        warned: Option<&Warned>,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let Some(rec) = self.store.get_request(id).await? else {
            return Ok(());
        };
        if !due_statuses().contains(&rec.status) {
            out.decisions.push(Decision::new(
                id,
                "ignored",
                format!("nothing to drain while the request is {}", rec.status),
            ));
            return Ok(());
        }
        let searching = !FOLLOWS_WINDOWS.contains(&rec.status)
            && !matches!(
                rec.status,
                RequestStatus::RunningOnDemand | RequestStatus::RunningSpot
            );
        if searching && warned.is_none() && !rec.window_due(now) && !rec.notice_due(now) {
            // Due for its search or purchase, not for a window.
            return Ok(());
        }
        let reservations = self.store.reservations(id).await?;
        let rec = match self
            .upgrade_payments(rec, &reservations, base, now, out)
            .await?
        {
            Some(rec) => rec,
            None => return Ok(()),
        };
        let lead = self.drain_lead(&rec);
        let mut windows = window::windows(&reservations, &rec.windows, lead);
        if windows.is_empty() {
            if searching {
                // A search or purchase under way, and nothing bought yet.
                return Ok(());
            }
            return self.process_run(&rec, base, now, out).await;
        }
        // ARCHITECTURE §9.3: a window's end is what AWS reports. Its reservation is read back
        // before the window is drained and before an Ending notice counts down to its end;
        // an end AWS moved (an extension bought in the console) moves the drain, the notices
        // and the instances' drain-at first.
        let (rec, reservations) = match self
            .read_back(rec, reservations, &windows, warned, base, now, out)
            .await?
        {
            Some(read) => read,
            None => return Ok(()),
        };
        windows = window::windows(&reservations, &rec.windows, lead);
        let warned_here = |w: &window::Window| warned.is_some_and(|x| x.applies(w));
        if let Some(x) = warned
            && !windows.iter().any(|w| x.applies(w))
            && let Some(w) = windows
                .iter()
                .find(|w| w.reservation.id == x.reservation_id && w.last_of_reservation)
        {
            out.decisions.push(Decision::new(
                id,
                "ignored",
                format!(
                    "an Expiration Warning for {} ending {}, but AWS reports it ending at {}: \
                     the warning is for an end that has since moved, so nothing is drained \
                     before window {}'s drain at {}",
                    x.reservation_id,
                    x.end
                        .map_or_else(|| "(no end-date)".to_string(), |e| e.to_string()),
                    w.end(),
                    w.number,
                    w.drain_at
                ),
            ));
        }
        // A window about to be drained or ended whose lead-time notices are due: they are
        // looked at first, with the window as it was, so a lead the step makes moot (a drain
        // that comes late, after an outage) is recorded as skipped instead of being lost once
        // the window has ended. (Simulation seed 852.)
        let moot = windows.iter().any(|w| {
            (w.needs_end(now) || w.needs_drain(now, warned_here(w)))
                && rec
                    .windows
                    .iter()
                    .any(|r| r.key == w.key && r.notice_due().is_some_and(|t| t <= now))
        });
        let mut rec = rec;
        if moot {
            self.notices(&rec, &windows, base, "notices-first", now, out)
                .await?;
            match self.store.get_request(id).await? {
                Some(r) => rec = r,
                None => return Ok(()),
            }
            windows = window::windows(&reservations, &rec.windows, lead);
        }
        for step in 0..MAX_STEPS {
            let Some(w) = windows
                .iter()
                .find(|w| w.needs_end(now) || w.needs_drain(now, warned_here(w)))
            else {
                if step == 0 && FOLLOWS_WINDOWS.contains(&rec.status) {
                    out.decisions
                        .push(Decision::new(id, "waiting", waiting(&windows)));
                }
                break;
            };
            let written = if w.needs_end(now) {
                self.end_window(&rec, &windows, w, base, now, out).await?
            } else {
                self.drain_window(&rec, &windows, w, warned_here(w), base, now, out)
                    .await?
            };
            if !matches!(written, WriteOutcome::Applied { .. }) {
                return Ok(());
            }
            // A drain that came late (a long outage) ends its window in the same run, and
            // every other window that passed meanwhile is cleaned up in turn.
            match self.store.get_request(id).await? {
                Some(r) => rec = r,
                None => return Ok(()),
            }
            windows = window::windows(&reservations, &rec.windows, lead);
        }
        self.notices(&rec, &windows, base, "notices", now, out)
            .await
    }

    /// ARCHITECTURE §9.3: reads back the reservations of `windows` about to be drained or to
    /// have an Ending notice sent (and the one `warned` names, and one about to end with an
    /// extension of capacity-pilot's still open), and when AWS reports an end
    /// that moved, records it: the windows' drain, next action and Ending notices follow the
    /// new end, `Capacity Reservation Extended` says so, and the windows' instances get the
    /// new `capacity-pilot:drain-at` (re-tagged wherever it differs, whether or not the end
    /// moved now: a launch racing the move heals here). A reservation that cannot be read
    /// keeps its recorded end: the drain is never held back by a failed read. The request and
    /// its reservations as they stand after, or `None` when another writer moved it.
    #[allow(clippy::too_many_arguments)]
    async fn read_back(
        &self,
        rec: RequestRecord,
        reservations: Vec<Reservation>,
        windows: &[window::Window],
        warned: Option<&Warned>,
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<(RequestRecord, Vec<Reservation>)>, PortError> {
        let id = rec.request_id.clone();
        let mut read: Vec<&Reservation> = Vec::new();
        for w in windows {
            let named = warned.is_some_and(|x| x.reservation_id == w.reservation.id);
            let drains = w.state.is_undrained() && w.needs_drain(now, named);
            // A window about to end whose reservation has an extension still open (its
            // payment pending when last read): AWS may have taken the payment since, and
            // the window is then reopened rather than ended at its old end.
            let extended = w.needs_end(now) && w.reservation.open_extension().is_some();
            if (drains || named || extended || self.ending_due(&rec, w, now))
                && !read.iter().any(|r| r.id == w.reservation.id)
            {
                read.push(&w.reservation);
            }
        }
        if read.is_empty() {
            return Ok(Some((rec, reservations)));
        }
        let mut seen: Vec<Reservation> = Vec::new();
        let mut notes: Vec<String> = Vec::new();
        for r in &read {
            let described = match warned.filter(|x| x.reservation_id == r.id) {
                Some(x) => Some(x.seen.clone()),
                None => match self.market.describe(r.product, &r.region, &r.id).await {
                    Ok(d) => d,
                    Err(e) => {
                        warn!(request_id = %id, reservation_id = %r.id, error = %e,
                            "reading a reservation back failed; its recorded end stands");
                        notes.push(format!(
                            "{} could not be read back ({e}): its recorded end {} stands",
                            r.id,
                            r.end()
                        ));
                        continue;
                    }
                },
            };
            if let Some(moved) = described.and_then(|d| r.read_back(&d)) {
                seen.push(moved);
            }
        }
        let lead = self.drain_lead(&rec);
        let moved = window::ends_moved(
            &reservations,
            &rec.windows,
            &seen,
            lead,
            window::Reopen::of(&rec),
            now,
        );
        let after = window::windows(&moved.reservations, &moved.records, lead);
        let read_ids: Vec<&str> = read.iter().map(|r| r.id.as_str()).collect();
        let tagged = self.retag(&rec, &after, &read_ids, &mut notes).await;
        if seen.is_empty() {
            if !notes.is_empty() || !tagged.is_empty() {
                notes.extend(tagged);
                out.decisions
                    .push(Decision::new(&id, "read-back", notes.join("; ")));
            }
            return Ok(Some((rec, reservations)));
        }
        let mut said = moved.said();
        said.extend(tagged);
        said.extend(notes);
        let outbox = moved.announced(rec.whose(), rec.team.as_str());
        let reason = said.join("; ");
        let mut u = WindowUpdate::of(
            &rec,
            moved.records,
            &reason,
            now,
            &Cause::new(format!("{base}#read-back")),
            outbox,
        );
        u.reservations = seen;
        let written = self.store.update_windows(u).await?;
        out.decisions.push(Decision::new(
            &id,
            decision::written(&written, "end-moved"),
            reason,
        ));
        if !matches!(written, WriteOutcome::Applied { .. }) {
            return Ok(None);
        }
        let Some(rec) = self.store.get_request(&id).await? else {
            return Ok(None);
        };
        let reservations = self.store.reservations(&id).await?;
        Ok(Some((rec, reservations)))
    }

    /// Whether an Ending notice of window `w` is due to be sent at `now`.
    fn ending_due(&self, rec: &RequestRecord, w: &window::Window, now: DateTime<Utc>) -> bool {
        let Some(r) = rec.windows.iter().find(|r| r.key == w.key) else {
            return false;
        };
        if r.notice_due().is_none_or(|t| t > now) {
            return false;
        }
        let since = w.reservation.bought_at.unwrap_or(r.updated_at);
        notices::plan_leads(w, &self.config.notice_leads, since, now)
            .send
            .iter()
            .any(|(l, _)| l.kind == notices::LeadKind::Ending)
    }

    /// Sets `capacity-pilot:drain-at` to its window's drain on every EC2 instance of the
    /// request in the reservations `read` whose tag says otherwise (ARCHITECTURE §9.3). What
    /// it did, for the decision; a failure is noted and left to the next read back (the
    /// drain is never held back by a tag).
    async fn retag(
        &self,
        rec: &RequestRecord,
        windows: &[window::Window],
        read: &[&str],
        notes: &mut Vec<String>,
    ) -> Vec<String> {
        let mut said = Vec::new();
        if !matches!(
            rec.request.workload,
            capacity_pilot::domain::request::WorkloadDetail::Ec2Instances { .. }
        ) {
            return said;
        }
        for w in windows.iter().filter(|w| {
            read.contains(&w.reservation.id.as_str())
                && w.reservation.product == Product::CapacityBlock
                && matches!(
                    w.state,
                    WindowState::Launching | WindowState::Running | WindowState::Stopping
                )
        }) {
            let region = &w.reservation.region;
            let value = drain_at_value(w.drain_at);
            let found = self
                .workloads
                .describe_instances(
                    region,
                    &InstanceFilter {
                        request_id: Some(rec.request_id.clone()),
                        reservation_id: Some(w.reservation.id.clone()),
                        managed_only: true,
                        ..Default::default()
                    },
                )
                .await;
            let stale: Vec<String> = match found {
                Ok(found) => found
                    .into_iter()
                    .filter(|i| ours(i, &rec.request_id, &self.config.deployment_id))
                    .filter(|i| {
                        !matches!(
                            i.state,
                            InstanceState::Terminated | InstanceState::ShuttingDown
                        )
                    })
                    .filter(|i| i.tags.get(DRAIN_AT_TAG) != Some(&value))
                    .map(|i| i.instance_id)
                    .collect(),
                Err(e) => {
                    warn!(request_id = %rec.request_id, error = %e, "describing instances to re-tag failed");
                    notes.push(format!(
                        "window {}'s instances could not be read to re-tag ({e}); the next \
                         read back tries again",
                        w.number
                    ));
                    continue;
                }
            };
            if stale.is_empty() {
                continue;
            }
            let tags = BTreeMap::from([(DRAIN_AT_TAG.to_string(), value.clone())]);
            match self.workloads.tag_instances(region, &stale, &tags).await {
                Ok(()) => said.push(format!(
                    "{} re-tagged {DRAIN_AT_TAG}={value}",
                    stale.join(", ")
                )),
                Err(e) => {
                    warn!(request_id = %rec.request_id, instances = ?stale, error = %e, "re-tagging instances failed");
                    notes.push(format!(
                        "{} could not be re-tagged {DRAIN_AT_TAG}={value} ({e}); the next read \
                         back tries again",
                        stale.join(", ")
                    ));
                }
            }
        }
        said
    }

    /// Sends the lead-time notices of `rec`'s windows that are due at `now` (ARCHITECTURE
    /// §9.2) and records those skipped, with each window's marks, in one write: its history
    /// says what was sent and what was not, and why. A window whose notices were never
    /// looked at (just bought) gets its marks, and so its next due time, here.
    async fn notices(
        &self,
        rec: &RequestRecord,
        windows: &[window::Window],
        base: &str,
        step: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        if !rec.notice_due(now) {
            return Ok(());
        }
        let leads = &self.config.notice_leads;
        let checkpoint = leads.ending.iter().min().copied();
        let mut records = rec.windows.clone();
        let mut outbox = Vec::new();
        let mut said = Vec::new();
        // Reservations whose workload is looked at, to extend it (ARCHITECTURE §9.3).
        let mut armed: Vec<Reservation> = Vec::new();
        let payment_lead = self.config.extension_payment_lead();
        let policy = rec.request.extend.as_ref();
        for r in records.iter_mut() {
            if r.notice_due().is_none_or(|t| t > now) {
                continue;
            }
            let Some(w) = windows.iter().find(|w| w.key == r.key) else {
                // A record no reservation derives any more: nothing to announce.
                r.notices = Some(NoticeMarks::default());
                continue;
            };
            let since = w.reservation.bought_at.unwrap_or(r.updated_at);
            let plan = notices::plan_leads(w, leads, since, now);
            let extend_by = extension::ask_by(policy, w, payment_lead, now);
            for (l, late) in &plan.send {
                outbox.push(notices::lead_event(
                    rec.whose(),
                    rec.team.as_str(),
                    w,
                    *l,
                    *late,
                    checkpoint,
                    extend_by,
                ));
                said.push(format!(
                    "sent {}{}",
                    l.describe(w.number),
                    if *late { ", late" } else { "" }
                ));
            }
            // `extend.when: workload-running`: with each Ending notice before the payment
            // lead, the purchase function is asked to look whether the workload runs on (a
            // day's block gets its first while it has not opened yet).
            let ending = plan.send.iter().any(|(l, _)| l.kind == LeadKind::Ending);
            if ending
                && extend_by.is_some()
                && policy.is_some_and(|p| p.when == ExtendWhen::WorkloadRunning)
                && w.reservation.open_extension().is_none()
                && w.reservation.extension_check_at.is_none()
                && !armed.iter().any(|a| a.id == w.reservation.id)
            {
                let mut armed_r = w.reservation.clone();
                armed_r.extension_check_at = Some(now);
                said.push(format!(
                    "the purchase function looks whether window {}'s workload runs on, to \
                     extend {} (extend.when: workload-running)",
                    w.number, armed_r.id
                ));
                armed.push(armed_r);
            }
            said.extend(plan.skipped.iter().map(|(_, why)| why.clone()));
            r.notices = Some(plan.marks);
        }
        let reason = if said.is_empty() {
            match window::notice_at(&records) {
                Some(t) => format!("lead-time notices: none due yet; the next at {t}"),
                None => "lead-time notices: none left to send".to_string(),
            }
        } else {
            said.join("; ")
        };
        let mut u = WindowUpdate::of(
            rec,
            records,
            &reason,
            now,
            &Cause::new(format!("{base}#{step}")),
            outbox,
        );
        u.reservations = armed;
        let written = self.store.update_windows(u).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&written, "noticed"),
            reason,
        ));
        Ok(())
    }

    fn drain_lead(&self, rec: &RequestRecord) -> DrainLead {
        DrainLead::of(&rec.request, self.config.default_drain_minutes)
    }

    /// ARCHITECTURE §9.1's upgrade of `id`, if it was written before the rule
    /// ([`Store::unarchive`]); said as a decision when it changed anything.
    async fn upgrade(
        &self,
        id: &RequestId,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        if self.store.unarchive(id, now).await? {
            out.decisions.push(Decision::new(
                id,
                "upgraded",
                "written before paid windows outlived their request (ARCHITECTURE 9.1), it \
                 carried the archival TTL while a window of it is not ended: the TTL is \
                 removed from it and its items, and it is read every tick while that window \
                 may run",
            ));
        }
        Ok(())
    }

    /// Stops what runs in the window `w` ahead of its forced termination and marks it
    /// draining.
    #[allow(clippy::too_many_arguments)]
    async fn drain_window(
        &self,
        rec: &RequestRecord,
        windows: &[window::Window],
        w: &window::Window,
        warned: bool,
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<WriteOutcome, PortError> {
        let id = &rec.request_id;
        let v = view(rec, windows, w);
        let why = if warned && now < w.drain_at {
            "an expiration warning brought the drain forward"
        } else {
            "the drain start was reached"
        };
        if w.state != WindowState::Stopping {
            // Marked before anything is stopped (issue 15): a launch or replacement that
            // reads the window now finds it draining. The stop follows at once, in this run's
            // next step, or in the next run if this one dies first.
            let (expiring, _, _) = drain_record(rec, rec.version + 1, &v, &[], why, now);
            let mut records =
                window::records_with(&rec.windows, windows, &w.key, WindowState::Stopping, now);
            // A relaunch it had is over: only an extension paid while it stops reopens it.
            if let Some(r) = records.iter_mut().find(|r| r.key == w.key) {
                r.relaunch = None;
            }
            let u = WindowUpdate::of(
                rec,
                records,
                &format!(
                    "{why}: stopping what runs in segment {} ahead of forced termination at {}",
                    w.number, w.forced_at
                ),
                now,
                &Cause::new(format!("{base}#stopping-s{}", w.number)),
                vec![outbound(&expiring)],
            );
            let written = self.store.update_windows(u).await?;
            out.decisions.push(Decision::new(
                id,
                decision::written(&written, "draining"),
                format!(
                    "{why}: segment {} marked stopping before its workload is stopped",
                    w.number
                ),
            ));
            return Ok(written);
        }
        let stopped = self.stop(rec, &v).await?;
        let (_, drained, mut reason) = drain_record(rec, rec.version + 1, &v, &stopped, why, now);
        let reopened = window::reopened_after_stop(w, window::Reopen::of(rec), now);
        let mut records = window::records_with(
            &rec.windows,
            windows,
            &w.key,
            if reopened.is_some() {
                WindowState::Launching
            } else {
                WindowState::Draining
            },
            now,
        );
        if let Some(n) = reopened
            && let Some(r) = records.iter_mut().find(|r| r.key == w.key)
        {
            // Its drain moved later while it stopped: launched again at once.
            r.next_action_at = Some(now);
            reason = format!(
                "{reason}; extension {n}'s paid end moved its drain to {} while it stopped, so \
                 window {} is reopened and its workload launched again",
                w.drain_at, w.number
            );
        }
        let u = WindowUpdate::of(
            rec,
            records,
            &reason,
            now,
            &Cause::new(format!("{base}#drain-s{}", w.number)),
            vec![announced(Some(rec.team.as_str()), &drained)],
        );
        let written = self.store.update_windows(u).await?;
        out.decisions.push(Decision::new(
            id,
            decision::written(&written, "drained"),
            reason,
        ));
        Ok(written)
    }

    /// A drained window that has ended: stop and sweep what is left of it, then mark it
    /// ended. The request ends with its last window, unless a search or purchase goes on.
    async fn end_window(
        &self,
        rec: &RequestRecord,
        windows: &[window::Window],
        w: &window::Window,
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<WriteOutcome, PortError> {
        let id = &rec.request_id;
        let v = view(rec, windows, w);
        let mut cleaned = self.stop(rec, &v).await?;
        let next = windows
            .iter()
            .filter(|o| o.key != w.key && o.state != WindowState::Ended)
            .map(window::Window::start)
            .min();
        let only_this = next.is_some() || !FOLLOWS_WINDOWS.contains(&rec.status);
        let orphans = self
            .sweep_request(
                rec,
                &v.regions,
                only_this.then_some(&v.reservation_ids[..]),
                &cleaned,
            )
            .await?;
        cleaned.extend(orphans);
        let records = window::records_with(&rec.windows, windows, &w.key, WindowState::Ended, now);
        let u = WindowUpdate::of(
            rec,
            records,
            "",
            now,
            &Cause::new(format!("{base}#end-s{}", w.number)),
            vec![],
        );
        let to = u.status_after();
        // A reservation whose later segment is still to come (a multi-segment training
        // plan) has not ended: only the segment has, and its Drained event said so.
        let reservation_ids: Vec<String> = if w.last_of_reservation {
            v.reservation_ids.clone()
        } else {
            vec![]
        };
        let ended = ReservationEnded {
            event_key: event_key(rec.whose(), "ended", rec.version + 1),
            request_id: id.to_string(),
            reservation_ids: reservation_ids.clone(),
            ended_at: now,
            cleaned_up: cleaned.clone(),
            spent_usd: rec.spent.to_usd(),
        };
        // A window nothing was ever launched in (a block that never became active, capacity
        // that never came back) says so: its end is not a workload's end.
        let launched = self
            .store
            .workloads(id)
            .await?
            .iter()
            .any(|r| v.reservation_ids.contains(&r.reservation_id));
        let never = if launched {
            String::new()
        } else {
            format!(
                "nothing was ever launched in segment {}: it never became usable before its \
                 drain at {} (a block not yet active, or no capacity to launch into); ",
                w.number, w.drain_at
            )
        };
        let reason = format!(
            "{never}{} ended{}; cleaned up: {}",
            if reservation_ids.is_empty() {
                format!("segment {}", w.number)
            } else {
                reservation_ids.join(", ")
            },
            match next {
                Some(n) => format!("; the next segment starts at {n}"),
                None => String::new(),
            },
            if cleaned.is_empty() {
                "nothing left".to_string()
            } else {
                cleaned.join(", ")
            }
        );
        let u = WindowUpdate {
            reason: reason.clone(),
            outbox: if to == RequestStatus::Ended || !reservation_ids.is_empty() {
                vec![outbound(&ended)]
            } else {
                vec![]
            },
            ..u
        };
        let written = self.store.update_windows(u).await?;
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
        Ok(written)
    }

    /// Terminates managed instances still tagged for the request in `regions`, but those in
    /// `cleaned`; with `only`, just those in these reservations (or in none).
    async fn sweep_request(
        &self,
        rec: &RequestRecord,
        regions: &[String],
        only: Option<&[String]>,
        cleaned: &[String],
    ) -> Result<Vec<String>, PortError> {
        let id = &rec.request_id;
        let mut swept = Vec::new();
        for region in regions {
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
                .filter(|i| ours(i, id, &self.config.deployment_id))
                .filter(|i| match only {
                    Some(rs) => i.reservation_id.as_ref().is_none_or(|r| rs.contains(r)),
                    None => true,
                })
                .map(|i| i.instance_id)
                .filter(|i| !cleaned.iter().any(|c| c == &format!("instance:{i}")))
                .collect();
            if !orphans.is_empty() {
                warn!(request_id = %id, region, instances = ?orphans, "terminating orphaned managed instances");
                self.workloads.terminate_instances(region, &orphans).await?;
                swept.extend(orphans.into_iter().map(|i| format!("instance:{i}")));
            }
        }
        Ok(swept)
    }

    /// A request without reserved windows whose status follows them, or an on-demand or spot
    /// run: the run drains before its duration is over; a request with nothing bought left
    /// to end.
    /// Issue 48's upgrade of old records (ARCHITECTURE §9.1): a reservation bought before each
    /// had its own payment check, still unpaid, gets one now, so the purchase function's next
    /// tick reads it whatever the request's status (before, only a `Reserved` request's were
    /// read). The request as it stands after, or `None` when another writer moved it.
    async fn upgrade_payments(
        &self,
        rec: RequestRecord,
        reservations: &[capacity_pilot::domain::reservation::Reservation],
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<RequestRecord>, PortError> {
        let unchecked: Vec<_> = reservations
            .iter()
            .filter(|r| r.payment_check_at.is_none() && r.state.is_live() && !r.state.is_settled())
            .map(|r| {
                let mut r = r.clone();
                r.payment_check_at = Some(now);
                r
            })
            .collect();
        if unchecked.is_empty() || rec.status == RequestStatus::Purchasing {
            return Ok(Some(rec));
        }
        let id = rec.request_id.clone();
        let note = format!(
            "{} bought before each reservation had its own payment check: its payment is read \
             from now on",
            capacity_pilot::domain::reservation::Reservation::id_list(&unchecked)
        );
        let mut t = Transition::of(
            &rec,
            rec.status,
            &rec.reason,
            rec.next_action_at,
            now,
            &Cause::new(format!("{base}#payments")),
        );
        t.reservations = unchecked;
        let w = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &id,
            decision::written(&w, "payments-upgraded"),
            note,
        ));
        if !matches!(w, WriteOutcome::Applied { .. }) {
            return Ok(None);
        }
        self.store.get_request(&id).await
    }

    async fn process_run(
        &self,
        rec: &RequestRecord,
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        if rec.status == RequestStatus::Draining
            && rec.cancel.is_some()
            && (rec.run.is_some() || rec.open_debit.is_some())
        {
            return self.cancel_run(rec, base, now, out).await;
        }
        if rec.status == RequestStatus::Draining
            && rec.open_debit.is_some()
            && let Some(fall_back) = rec.run.as_ref().and_then(|r| r.fall_back.as_ref())
        {
            return self.fall_back_run(rec, fall_back, base, now, out).await;
        }
        let windows = run_windows(rec, self.config.default_drain_minutes);
        if rec.status == RequestStatus::Draining {
            return self.end_if_over(rec, &windows, base, now, out).await;
        }
        let Some(idx) = current(rec, &windows) else {
            out.decisions.push(Decision::new(
                id,
                "waiting",
                "no reserved window is open or ahead",
            ));
            return Ok(());
        };
        let w = &windows[idx];
        // No reservation, so no expiration warning: the run's own duration decides.
        let drain_at = w.drain_starts_at;
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
        // Nothing launches into an on-demand run once it runs (replace-unhealthy watches
        // reserved windows only), so it is stopped first and then settled: the hours it ran
        // are counted to after the stop.
        let stopped = self.stop(rec, w).await?;
        let (expiring, drained, reason) = drain_record(
            rec,
            rec.version + 1,
            w,
            &stopped,
            "the drain start was reached",
            now,
        );
        let (settle, settled) = run_settlement(rec, &self.store.workloads(id).await?, now);
        let reason = format!("{reason}{settled}");
        let t = Transition::of(
            rec,
            RequestStatus::Draining,
            &reason,
            Some(w.end),
            now,
            &Cause::new(format!("{base}#drain")),
        )
        .with_outbox(vec![
            outbound(&expiring),
            announced(Some(rec.team.as_str()), &drained),
        ])
        .settling(settle);
        let written = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            id,
            decision::written(&written, "drained"),
            reason,
        ));
        if matches!(written, WriteOutcome::Applied { .. }) && now >= w.end {
            // The drain itself came late (a long outage): end the window in the same run.
            if let Some(rec) = self.store.get_request(id).await? {
                let windows = run_windows(&rec, self.config.default_drain_minutes);
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
            return self.end(rec, None, base, now, out).await;
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
        self.end(rec, Some(w), base, now, out).await
    }

    /// Ends a request without reserved windows: stops its run (if any) and sweeps what is
    /// left of it.
    async fn end(
        &self,
        rec: &RequestRecord,
        w: Option<&Window>,
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let mut cleaned = match w {
            Some(w) => self.stop(rec, w).await?,
            None => vec![],
        };
        let regions: Vec<String> = match w {
            Some(w) => w.regions.clone(),
            None => rec.request.regions.clone(),
        };
        let orphans = self.sweep_request(rec, &regions, None, &cleaned).await?;
        cleaned.extend(orphans);
        // An estimate still held (its drain was written before runs were settled) is
        // settled now.
        let (settle, settled) = run_settlement(rec, &self.store.workloads(id).await?, now);
        let ended = ReservationEnded {
            event_key: event_key(rec.whose(), "ended", rec.version + 1),
            request_id: id.to_string(),
            reservation_ids: vec![],
            ended_at: now,
            cleaned_up: cleaned.clone(),
            spent_usd: after_settling(rec, settle).to_usd(),
        };
        let reason = format!(
            "the run ended; cleaned up: {}{settled}",
            if cleaned.is_empty() {
                "nothing left".to_string()
            } else {
                cleaned.join(", ")
            }
        );
        let t = Transition::of(
            rec,
            RequestStatus::Ended,
            &reason,
            None,
            now,
            &Cause::new(format!("{base}#end")),
        )
        .with_outbox(vec![outbound(&ended)])
        .settling(settle);
        let written = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            id,
            decision::written(&written, "ended"),
            reason,
        ));
        Ok(())
    }

    /// ARCHITECTURE §8.3: a cancelled on-demand or spot run (or attempt): stops whatever
    /// runs for it and settles the hours it ran ([`Cleaner::take_back`]), then answers.
    async fn cancel_run(
        &self,
        rec: &RequestRecord,
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let Some(note) = &rec.cancel else {
            return Ok(());
        };
        let Some((stopped, settle, settled)) = self
            .take_back(rec, note.at, "cancelled", "the cancellation", now, out)
            .await?
        else {
            return Ok(());
        };
        let reason = format!("{}; stopped {}{settled}", note.reason, listed(&stopped));
        let answers = ending_events(
            rec,
            RequestStatus::Cancelled,
            &reason,
            vec![],
            vec![],
            after_settling(rec, settle),
        );
        let t = Transition::of(
            rec,
            RequestStatus::Cancelled,
            &reason,
            None,
            now,
            &Cause::new(format!("{base}#cancel")),
        )
        .with_outbox(answers)
        .settling(settle);
        let written = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            id,
            decision::written(&written, "cancelled"),
            reason,
        ));
        Ok(())
    }

    /// ARCHITECTURE §9.1: a spot run that could not be repaired falls back as
    /// `on-demand-first` does: stopped and settled by what its instances ran
    /// ([`Cleaner::take_back`]), then `Searching` for the earliest feasible reservation, as
    /// on-demand-first's fall-back from on-demand is.
    async fn fall_back_run(
        &self,
        rec: &RequestRecord,
        fall_back: &FallBack,
        base: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let Some((stopped, settle, settled)) = self
            .take_back(rec, fall_back.at, "falling back", "the fall-back", now, out)
            .await?
        else {
            return Ok(());
        };
        let reason = format!(
            "spot: {}; stopped {}{settled}; falling back to the earliest feasible reservation \
             for the {} h of its {} h the run did not serve (in whole days), which starts no \
             sooner than {}",
            fall_back.reason,
            listed(&stopped),
            rec.needed().num_hours(),
            rec.request.duration_hours,
            now + PURCHASE_LEAD
        );
        let t = Transition::of(
            rec,
            RequestStatus::Searching,
            &reason,
            Some(now),
            now,
            &Cause::new(format!("{base}#fall-back")),
        )
        .settling(settle);
        let written = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            id,
            decision::written(&written, "fell-back"),
            reason,
        ));
        Ok(())
    }

    /// Takes an on-demand or spot run back (ARCHITECTURE §8.3) for what happened at `since`
    /// (a cancellation, a fall-back): stops whatever runs for it, found by tag and name (a
    /// launch may have run without being recorded); then, once every launch begun before
    /// `since` has ended and EC2 lists what it started ([`LAUNCH_FUNCTION_TIMEOUT`] and
    /// [`LISTING_LAG_BOUND`] after it, stopping again meanwhile), sweeps and says how the run
    /// settles (to now, so never less than it ran): what was stopped, the settlement and its
    /// words. `None` while it waits, due, for the next tick.
    async fn take_back(
        &self,
        rec: &RequestRecord,
        since: DateTime<Utc>,
        doing: &str,
        what: &str,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<(Vec<String>, Option<Settle>, String)>, PortError> {
        let id = &rec.request_id;
        // The run's window, as a drain sees it: every region of the request, on demand.
        let mut stopped = Vec::new();
        for w in run_windows(rec, self.config.default_drain_minutes) {
            stopped.extend(self.stop(rec, &w).await?);
        }
        // Every launch begun before `since` has ended a function timeout after it, and an
        // instance it started is listed by EC2 within the listing-lag bound (Describe* lag
        // new instances, aws-reference §11.3): the last sweep comes after both, so it sees
        // an instance launched just before. SageMaker's are found by name.
        let settle_from = since
            + if workload::runs_instances(&rec.request) {
                LAUNCH_FUNCTION_TIMEOUT.max(LISTING_LAG_BOUND)
            } else {
                LAUNCH_FUNCTION_TIMEOUT
            };
        if now < settle_from {
            out.decisions.push(Decision::new(
                id,
                "waiting",
                format!(
                    "{doing}: stopped {}; a launch begun before {what} may still be in \
                     flight, so it is stopped again and settled from {settle_from}",
                    listed(&stopped)
                ),
            ));
            return Ok(None);
        }
        let orphans = self
            .sweep_request(rec, &rec.request.regions, None, &stopped)
            .await?;
        stopped.extend(orphans);
        let (settle, settled) = run_settlement(rec, &self.store.workloads(id).await?, now);
        Ok(Some((stopped, settle, settled)))
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

/// How an on-demand run's held estimate is settled if it ends now (ARCHITECTURE §4, §8.3):
/// the hours it ran stay spent, the rest goes back; and the reason's words for it. Nothing
/// when no estimate is held.
fn run_settlement(
    rec: &RequestRecord,
    slots: &[WorkloadRecord],
    now: DateTime<Utc>,
) -> (Option<Settle>, String) {
    let Some(open) = rec.open_debit else {
        return (None, String::new());
    };
    let (hours, count) = (rec.request.duration_hours, rec.request.instance_count);
    let kept = rec.run.as_ref().map_or(open, |run| {
        run.spent_by_slots(open, count, hours, slots, now)
    });
    let how = Settle::Spend(kept);
    let back = how.released(open);
    (
        Some(how),
        format!(
            "; the run is settled by the hours its instances ran: ${} of the ${} estimate \
             for {count} x {hours} h stays spent, ${} goes back",
            kept.min(open).to_usd(),
            open.to_usd(),
            back.to_usd()
        ),
    )
}

/// The request's `spent` once `settle` is written.
fn after_settling(rec: &RequestRecord, settle: Option<Settle>) -> MicroUsd {
    match (settle, rec.open_debit) {
        (Some(how), Some(open)) => MicroUsd(rec.spent.0 - how.released(open).0),
        _ => rec.spent,
    }
}

fn listed(what: &[String]) -> String {
    if what.is_empty() {
        "nothing still running".to_string()
    } else {
        what.join(", ")
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
            last: self.last,
        }
    }
}

/// The window of a request without reservations: an on-demand or spot run has one, of its
/// duration (reserved windows are `domain::window`'s).
pub fn run_windows(rec: &RequestRecord, default_drain_minutes: u32) -> Vec<Window> {
    let drain = rec.request.drain_minutes;
    if !matches!(
        rec.status,
        RequestStatus::RunningOnDemand | RequestStatus::RunningSpot | RequestStatus::Draining
    ) {
        return vec![];
    }
    // On demand there is no forced termination: the run ends after its duration.
    let started = rec
        .run
        .as_ref()
        .and_then(|r| r.started_at)
        .unwrap_or(rec.updated_at);
    let end = match rec.status {
        RequestStatus::Draining => rec.next_action_at.unwrap_or(rec.updated_at),
        _ => started + rec.request.duration(),
    };
    let drain = Duration::minutes(i64::from(drain.max(default_drain_minutes)));
    vec![Window {
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
        // A run is the request's only window.
        last: true,
    }]
}

/// What draining `w` publishes (Expiring, then Drained) and the reason recorded with it.
fn drain_record(
    rec: &RequestRecord,
    version: u64,
    w: &Window,
    stopped: &[String],
    why: &str,
    now: DateTime<Utc>,
) -> (ReservationExpiring, WorkloadDrained, String) {
    let id = &rec.request_id;
    let expiring = ReservationExpiring {
        event_key: event_key(rec.whose(), "expiring", version),
        request_id: id.to_string(),
        reservation_ids: w.reservation_ids.clone(),
        segment: w.segment,
        ends_at: w.end,
        drain_starts_at: w.drain_starts_at.min(now),
        forced_termination_at: w.forced_termination_at,
    };
    let what = if stopped.is_empty() {
        "nothing (no workload was running)".to_string()
    } else {
        stopped.join(", ")
    };
    let late = now >= w.forced_termination_at;
    let reason = if late {
        format!(
            "late drain: no cleanup ran between the drain start at {} and the forced \
             termination at {}, so AWS may have stopped the workload first; stopped {what} \
             {} after it (segment {} ends {})",
            w.drain_starts_at,
            w.forced_termination_at,
            minutes(now - w.forced_termination_at),
            w.segment,
            w.end
        )
    } else {
        format!(
            "{why}: stopped {what} ahead of forced termination at {} (segment {} ends {})",
            w.forced_termination_at, w.segment, w.end
        )
    };
    let drained = WorkloadDrained {
        event_key: event_key(rec.whose(), "drained", version),
        request_id: id.to_string(),
        reservation_id: w
            .reservation_ids
            .first()
            .cloned()
            .unwrap_or_else(|| "on-demand".into()),
        segment: w.segment,
        resource_ids: stopped.to_vec(),
        drained_at: now,
        forced_termination_at: w.forced_termination_at,
        late,
        reason: reason.clone(),
    };
    (expiring, drained, reason)
}

/// `d` in whole minutes, for a reason.
fn minutes(d: chrono::TimeDelta) -> String {
    format!("{} min", d.num_minutes())
}

/// The reserved window `w` as the workload's drain sees it.
fn view(rec: &RequestRecord, windows: &[window::Window], w: &window::Window) -> Window {
    Window {
        // No search or purchase under way may add a window: bought (its windows are all
        // it has) or over (a Cancelled or Failed request's paid windows run on, §9.1).
        last: (FOLLOWS_WINDOWS.contains(&rec.status) || rec.status.is_terminal())
            && windows
                .iter()
                .all(|o| o.key == w.key || o.state == WindowState::Ended),
        reservation_ids: vec![w.reservation.id.clone()],
        regions: vec![w.reservation.region.clone()],
        segment: w.number,
        start: w.start(),
        end: w.end(),
        forced_termination_at: w.forced_at,
        drain_starts_at: w.drain_at,
        instance_type: w.reservation.instance_type.clone(),
        on_demand: false,
    }
}

/// Why nothing is due in any window yet.
fn waiting(windows: &[window::Window]) -> String {
    match windows.iter().find(|w| w.state != WindowState::Ended) {
        Some(w) if w.state == WindowState::Draining => {
            format!("drained; segment {} ends at {}", w.number, w.end())
        }
        Some(w) => format!(
            "segment {} drains at {}, ahead of forced termination at {}",
            w.number, w.drain_at, w.forced_at
        ),
        None => "no reserved window is open or ahead".to_string(),
    }
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

/// The windows of request `id` as the tick's read shows them: those of a live request; none
/// for one shown due with no window action; `None` (not in hand) for one shown due for a
/// window but not live.
fn shown_windows(a: &Agenda, id: &RequestId) -> Option<Vec<window::WindowRecord>> {
    match a.live.iter().find(|l| &l.request_id == id) {
        Some(l) => Some(l.windows.clone()),
        None => a
            .due
            .iter()
            .find(|d| &d.request_id == id)
            .filter(|d| d.window_action_at.is_some())
            .map_or(Some(vec![]), |_| None),
    }
}

pub mod detect;

/// The operations kit's stuck requests: each request past its next action by more than
/// [`OVERDUE_AFTER`] is logged, at every scheduled tick while it stays so, with the alert
/// `request-overdue` that `RequestOverdueMetric` (infra/template.yaml) counts and
/// `RequestOverdueAlarm` pages on. Whatever function owns it, this one reads the same index.
fn overdue(agenda: &Agenda, now: DateTime<Utc>) {
    for (item, late) in agenda.overdue(now, OVERDUE_AFTER) {
        warn!(
            alert = "request-overdue",
            request_id = %item.request_id,
            status = %item.status,
            due_at = %item.next_action_at,
            overdue_minutes = late.num_minutes(),
            "request {} ({}) is {} min past its next action, due at {}: see `capacity-pilot status {}`",
            item.request_id,
            item.status,
            late.num_minutes(),
            item.next_action_at,
            item.request_id
        );
    }
}

#[cfg(test)]
mod tests;
