//! launch-workloads: for every request whose reserved window has opened, launches what the
//! window needs exactly once (instances into the block, a training job or an endpoint on the
//! plan, a HyperPod instance group), and for `on-demand-first` requests tries on-demand (then
//! spot, when interruptible) before falling back to a reservation.
//!
//! Events only wake this function up: what to launch, where and for how long is read from
//! the table. Every launch is idempotent by construction (client tokens derived from the
//! reservation, slot and generation; names derived from the request and segment), so a
//! duplicate event, a schedule tick racing a Delivered event, or a retry after a crash finds
//! the same instances instead of starting new ones.

use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::config::{Config, PurchaseMode};
use capacity_pilot::decision;
pub use capacity_pilot::decision::{Decision, HandlerError};
use capacity_pilot::domain::events::{self, WorkloadLaunched, event_key};
use capacity_pilot::domain::money::{MicroUsd, Usd};
use capacity_pilot::domain::notices::announced;
use capacity_pilot::domain::offering::Product;
use capacity_pilot::domain::request::{CapacityRequest, RequestId};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::time_rules::{
    ACTIVATION_BOUND, LAUNCH_FUNCTION_TIMEOUT, PURCHASE_LEAD,
};
use capacity_pilot::domain::window::{
    self, DrainLead, FOLLOWS_WINDOWS, HOLDS_WINDOWS, Window, WindowState,
};
use capacity_pilot::outbox;
use capacity_pilot::ports::{
    BudgetMonth, Cause, Clock, Deadline, Debit, DueItem, EventSink, LaunchMarket, Lease,
    OnDemandRun, Pause, PortError, RequestRecord, Settle, Store, Transition, WallDeadline,
    WindowUpdate, Workloads, WriteOutcome,
};
use capacity_pilot::purchase::{approval, pause};
use capacity_pilot::workload::refusal::{self, Placement};
use capacity_pilot::workload::{self, Launch, Target};
use chrono::{DateTime, Duration, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{info, warn};

/// EC2's two documented spellings of the delivery event.
pub const CAPACITY_BLOCK_DELIVERED: &str = "Capacity Block Delivered";
pub const CAPACITY_BLOCK_RESERVATION_DELIVERED: &str = "Capacity Block Reservation Delivered";
/// The workload records' reservation id for on-demand and spot launches.
pub use capacity_pilot::ports::{ON_DEMAND, SPOT};
/// What this function looks at: every status that may hold a window, and on-demand-first.
fn due_statuses() -> Vec<RequestStatus> {
    HOLDS_WINDOWS
        .into_iter()
        .chain([RequestStatus::TryingOnDemand])
        .collect()
}

#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub decisions: Vec<Decision>,
    pub published: usize,
}

/// The part of AWS's Delivered event we log; the decision itself reads the table.
#[derive(Debug, Default, Deserialize)]
struct DeliveredDetail {
    #[serde(rename = "capacity-reservation-id", default)]
    capacity_reservation_id: Option<String>,
}

pub struct Launcher<S, W, E, C> {
    pub store: S,
    pub workloads: W,
    pub events: E,
    pub clock: C,
    pub config: Arc<Config>,
}

impl<S: Store, W: Workloads, E: EventSink, C: Clock> Launcher<S, W, E, C> {
    /// Handles `ev` as if the invocation had the whole of its template timeout left.
    pub async fn handle(&self, ev: EventBridgeEvent<Value>) -> Result<Outcome, HandlerError> {
        let timeout = LAUNCH_FUNCTION_TIMEOUT.to_std().unwrap_or_default();
        self.handle_by(ev, &WallDeadline::after(timeout)).await
    }

    /// Handles `ev`, launching only while `deadline` leaves time to record what it launched.
    pub async fn handle_by(
        &self,
        ev: EventBridgeEvent<Value>,
        deadline: &dyn Deadline,
    ) -> Result<Outcome, HandlerError> {
        let now = self.clock.now().await?;
        let run = outbox::Run::start(&self.store, now);
        let cause = Cause::new(ev.id.clone().unwrap_or_else(|| format!("{now}")));
        let mut out = Outcome::default();
        let mut errors = Vec::new();

        let wake = match (ev.detail_type.as_str(), ev.source.as_str()) {
            ("Scheduled Event", "aws.events") => true,
            (CAPACITY_BLOCK_DELIVERED | CAPACITY_BLOCK_RESERVATION_DELIVERED, "aws.ec2") => {
                let d: DeliveredDetail =
                    serde_json::from_value(ev.detail.clone()).unwrap_or_default();
                info!(
                    capacity_reservation_id = d.capacity_reservation_id.as_deref().unwrap_or(""),
                    "capacity block delivered; launching what the table says is due"
                );
                true
            }
            (detail_type, source) => {
                warn!(
                    detail_type,
                    source, "ignoring an event this function does not handle"
                );
                false
            }
        };
        let mut agenda = None;
        if wake {
            let a = agenda.insert(self.store.agenda(now).await?);
            // A window's launch, or an on-demand try: nothing else of a due request is ours.
            let mine = |d: &DueItem| match d.status {
                RequestStatus::TryingOnDemand => d.own_action_due(now),
                _ => d.window_due(now),
            };
            let pause = a.pause.clone();
            for item in a.due_in(&due_statuses()).into_iter().filter(mine) {
                if let Err(e) = self
                    .process(
                        &item.request_id,
                        &cause,
                        pause.as_ref(),
                        now,
                        deadline,
                        &mut out,
                    )
                    .await
                {
                    warn!(request_id = %item.request_id, error = %e, "launch step failed; the next tick retries");
                    errors.push(e);
                }
            }
        }
        out.published =
            outbox::flush(&self.store, &self.events, run.with_agenda(agenda.as_ref())).await?;
        decision::log(&out.decisions);
        decision::finish(out, errors)
    }

    /// `pause`: the operator's pause as this tick read it (ARCHITECTURE §9.7).
    async fn process(
        &self,
        id: &RequestId,
        cause: &Cause,
        pause: Option<&Pause>,
        now: DateTime<Utc>,
        deadline: &dyn Deadline,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let Some(rec) = self.store.get_request(id).await? else {
            return Ok(());
        };
        match rec.status {
            RequestStatus::TryingOnDemand => {
                self.try_on_demand(&rec, cause, pause, now, deadline, out)
                    .await
            }
            s if HOLDS_WINDOWS.contains(&s) => {
                self.launch_windows(&rec, cause, now, deadline, out).await
            }
            other => {
                out.decisions.push(Decision::new(
                    id,
                    "ignored",
                    format!("nothing to launch while the request is {other}"),
                ));
                Ok(())
            }
        }
    }

    // ---- reserved windows ---------------------------------------------------------------

    /// Launches into the window that is open now, whatever the request's status: a split's
    /// kept block runs while its replacement is searched for or bought.
    async fn launch_windows(
        &self,
        rec: &RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        deadline: &dyn Deadline,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let follows = FOLLOWS_WINDOWS.contains(&rec.status);
        if !follows && !rec.window_due(now) {
            // Due for its search or purchase, not for a window.
            return Ok(());
        }
        let reservations = self.store.reservations(id).await?;
        let windows = window::windows(&reservations, &rec.windows, self.drain_lead(rec));
        // A window reopened for a training job's follow-on is due when the job before it
        // stops (its record's next action), not while it runs.
        let due = |w: &Window| {
            rec.windows
                .iter()
                .find(|r| r.key == w.key)
                .and_then(|r| r.next_action_at)
                .is_none_or(|at| at <= now)
        };
        let Some(w) = windows.iter().find(|w| w.is_launchable(now) && due(w)) else {
            if follows {
                let next = windows
                    .iter()
                    .filter(|w| w.state == WindowState::Pending && w.start() > now)
                    .map(Window::start)
                    .min();
                let reason = match next {
                    Some(s) => format!("no window is open yet; the next opens at {s}"),
                    None => "no window is open and none is ahead".to_string(),
                };
                out.decisions.push(Decision::new(id, "waiting", reason));
            }
            return Ok(());
        };
        if !w.launch_ends_before_drain(now, LAUNCH_FUNCTION_TIMEOUT) {
            out.decisions.push(Decision::new(
                id,
                "too-late",
                format!(
                    "window {} drains at {}, within this invocation's {} s timeout of now: \
                     nothing is launched into it, so nothing can outlive the drain",
                    w.number,
                    w.drain_at,
                    LAUNCH_FUNCTION_TIMEOUT.num_seconds()
                ),
            ));
            return Ok(());
        }
        let r = &w.reservation;
        let target = Target {
            reservation_id: r.id.clone(),
            token_base: r.id.clone(),
            market: LaunchMarket::CapacityBlock {
                reservation_id: r.id.clone(),
            },
            plan_arn: matches!(r.product, Product::TrainingPlan { .. }).then(|| r.id.clone()),
            region: r.region.clone(),
            instance_type: r.instance_type.clone(),
            instance_count: r.instance_count,
            availability_zone: w.segment.availability_zone.clone(),
            subnet_id: None,
            segment: w.number,
            must_end_by: w.forced_at,
            drain_at: Some(w.drain_at),
            relaunch: w.relaunch,
        };
        match workload::launch(
            &self.workloads,
            &self.store,
            &self.config,
            rec,
            &target,
            now,
            deadline,
        )
        .await?
        {
            Launch::Done(resource_ids) => {
                let ev = WorkloadLaunched {
                    event_key: event_key(
                        rec.whose(),
                        &match w.relaunch {
                            None => format!("launched-s{}", w.number),
                            Some(n) => format!("launched-s{}-x{n}", w.number),
                        },
                        rec.version + 1,
                    ),
                    request_id: id.to_string(),
                    reservation_id: r.id.clone(),
                    segment: w.number,
                    workload_kind: rec.request.workload_kind(),
                    resource_ids: resource_ids.clone(),
                    planned_start: w.start(),
                    launched_at: now,
                    estimated_cost_usd: None,
                    // A relaunch starts late by design: its window was reopened.
                    start_delay_minutes: (w.relaunch.is_none()
                        && (now - w.start()) > ACTIVATION_BOUND)
                        .then(|| (now - w.start()).num_minutes()),
                };
                let reason = match w.relaunch {
                    None => format!(
                        "launched {} in {} (segment {}, window opened {}, {} min ago); drain \
                         starts at {}",
                        resource_ids.join(", "),
                        r.id,
                        w.number,
                        w.start(),
                        (now - w.start()).num_minutes(),
                        w.drain_at
                    ),
                    Some(n) => format!(
                        "launched {} in {} again (segment {}, reopened by extension {n}, which \
                         now ends it at {}); drain starts at {}",
                        resource_ids.join(", "),
                        r.id,
                        w.number,
                        w.end(),
                        w.drain_at
                    ),
                };
                let windows =
                    window::records_with(&rec.windows, &windows, &w.key, WindowState::Running, now);
                let u = WindowUpdate::of(
                    rec,
                    windows,
                    &reason,
                    now,
                    &cause.step("launch"),
                    vec![announced(Some(rec.team.as_str()), &ev)],
                );
                let written = self.store.update_windows(u).await?;
                out.decisions.push(Decision::new(
                    id,
                    decision::written(&written, "launched"),
                    reason,
                ));
                Ok(())
            }
            Launch::NoCapacity { why, .. } | Launch::Starting(why) => {
                let reason = format!("{why}; trying again on the next tick");
                if w.state == WindowState::Pending {
                    // The launch has begun: the window says so until it runs.
                    let windows = window::records_with(
                        &rec.windows,
                        &windows,
                        &w.key,
                        WindowState::Launching,
                        now,
                    );
                    let u = WindowUpdate::of(
                        rec,
                        windows,
                        &reason,
                        now,
                        &cause.step("launching"),
                        vec![],
                    );
                    self.store.update_windows(u).await?;
                }
                out.decisions.push(Decision::new(id, "waiting", reason));
                Ok(())
            }
            Launch::Refuse(why) if rec.status.is_terminal() => {
                // A paid window of a request already over (ARCHITECTURE §9.1): it cannot
                // fail again, and retrying a refusal cannot help, so the window ends unlaunched
                // with the refusal as its reason.
                let reason = format!(
                    "{why}; the request is {} already, so window {} ends unlaunched",
                    rec.status, w.number
                );
                let windows =
                    window::records_with(&rec.windows, &windows, &w.key, WindowState::Ended, now);
                let u = WindowUpdate::of(
                    rec,
                    windows,
                    &reason,
                    now,
                    &cause.step("launch-refused"),
                    vec![],
                );
                let written = self.store.update_windows(u).await?;
                out.decisions.push(Decision::new(
                    id,
                    decision::written(&written, "launch-refused"),
                    reason,
                ));
                Ok(())
            }
            // ARCHITECTURE §9.1: a block whose payment is not recorded as taken may have lost
            // it; its payment is read now (by the purchase function) before anything fails.
            // A failed payment then ends the window with its debit returned; one taken
            // leaves the refusal to fail the request at the next launch.
            Launch::Refuse(why) if !w.reservation.state.is_settled() => {
                let mut r = w.reservation.clone();
                r.payment_check_at = Some(now);
                let reason = format!(
                    "{why}; {} is not recorded as paid ({}), so its payment is read before \
                     anything fails",
                    r.id, r.state
                );
                let t = Transition::of(
                    rec,
                    rec.status,
                    &reason,
                    rec.next_action_at,
                    now,
                    &cause.step("read-payment"),
                )
                .with_reservations(vec![r], None);
                let written = self.store.transition(t).await?;
                out.decisions.push(Decision::new(
                    id,
                    decision::written(&written, "payment-read"),
                    reason,
                ));
                Ok(())
            }
            // The refused window ends with the request: no later tick launches into it, and
            // the request's final event does not list it among what runs on.
            Launch::Refuse(why) => {
                self.fail(rec, why, Settle::Release, Some(&w.key), cause, now, out)
                    .await
            }
        }
    }

    fn drain_lead(&self, rec: &RequestRecord) -> DrainLead {
        DrainLead::of(&rec.request, self.config.default_drain_minutes)
    }

    // ---- on-demand-first ----------------------------------------------------------------

    async fn try_on_demand(
        &self,
        rec: &RequestRecord,
        cause: &Cause,
        pause: Option<&Pause>,
        now: DateTime<Utc>,
        deadline: &dyn Deadline,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let req = &rec.request;
        // `PurchaseMode` plan-only (ARCHITECTURE §8.1): nothing is launched on demand either. A
        // request accepted before the mode was set, holding nothing yet, is planned instead
        // (searched, then ended Planned by purchase-capacity); one whose estimate is held may
        // have launched, and runs its course.
        if self.config.purchase_mode == PurchaseMode::PlanOnly && rec.open_debit.is_none() {
            let reason = "on-demand-first: the deployment's PurchaseMode is plan-only, so \
                          nothing is launched on demand; searching to plan instead";
            let t = Transition::of(
                rec,
                RequestStatus::Searching,
                reason,
                Some(now),
                now,
                &cause.step("plan-only"),
            );
            let w = self.store.transition(t).await?;
            out.decisions.push(Decision::new(
                id,
                decision::written(&w, "plan-only"),
                reason,
            ));
            return Ok(());
        }
        if now < req.window.earliest_start {
            out.decisions.push(Decision::new(
                id,
                "waiting",
                format!(
                    "on-demand-first: the desired start {} has not come",
                    req.window.earliest_start
                ),
            ));
            return Ok(());
        }
        // Held back by the pause and told so already: nothing held, nothing to look at.
        if let Some(d) = pause::told(pause, rec) {
            out.decisions.push(d);
            return Ok(());
        }
        let Some(instance_type) = req.instance_types.first() else {
            return self
                .fail(
                    rec,
                    "the request names no instance type".into(),
                    Settle::Release,
                    None,
                    cause,
                    now,
                    out,
                )
                .await;
        };
        let placements = workload::placements(&self.workloads, req).await?;
        if placements.is_empty() {
            let why = workload::no_placement(req);
            return self
                .fail(rec, why, Settle::Release, None, cause, now, out)
                .await;
        }
        let hours = Decimal::from(req.duration_hours) * Decimal::from(req.instance_count);
        let mut attempts = vec![(ON_DEMAND, self.config.prices.on_demand(instance_type))];
        if workload::spot_allowed(req) {
            attempts.push((SPOT, self.config.prices.spot(instance_type)));
        }
        let mut why_not = Vec::new();
        let mut rec = rec.clone();
        // The attempt whose estimate is held: an earlier run held it and may have launched, so
        // it goes on whatever the price table says now (the earlier attempts were tried and
        // released). A hold recorded before runs were (no record) is the first attempt's.
        let held = rec.open_debit.map(|_| {
            rec.run
                .as_ref()
                .and_then(|r| attempts.iter().position(|(l, _)| *l == r.attempt))
                .unwrap_or(0)
        });
        // A held estimate is launched by one invocation at a time: this one claims it first.
        if let Some(h) = held {
            let run = rec.run.clone().unwrap_or(OnDemandRun {
                attempt: attempts[h].0.to_string(),
                held_at: rec.updated_at,
                started_at: None,
                launch_generations: 0,
                claim: None,
                fall_back: None,
                approval: None,
            });
            match self.claim(&rec, run, cause, now, out).await? {
                Some(claimed) => rec = claimed,
                None => return Ok(()),
            }
        }
        // An approved hold goes on from its attempt: those before it were tried before it
        // asked (review N9).
        let approved = approval::approved_hold(&rec)
            .and_then(|(run, _)| attempts.iter().position(|(l, _)| *l == run.attempt));
        for (i, (label, price)) in attempts.into_iter().enumerate() {
            let cost = match (held, rec.open_debit) {
                (Some(h), _) if i < h => continue,
                (None, _) if approved.is_some_and(|a| i < a) => continue,
                (Some(h), Some(open)) if i == h => open.to_usd(),
                _ => {
                    let Some(price) = price else {
                        why_not.push(format!(
                            "no {label} price is configured for {instance_type}, so its spend \
                             cannot be estimated"
                        ));
                        continue;
                    };
                    let cost = Usd::new(price.amount() * hours);
                    // Above the approval threshold, the hold waits for an approver first.
                    if let Some(limit) = approval::hold_threshold(&self.config, &rec, label, cost) {
                        let (w, reason) = approval::ask_for_hold(
                            &self.store,
                            &self.config,
                            &rec,
                            label,
                            cost,
                            limit,
                            cause,
                            now,
                        )
                        .await?;
                        out.decisions.push(Decision::new(
                            id,
                            decision::written(&w, "awaiting-approval"),
                            reason,
                        ));
                        return Ok(());
                    }
                    match self.hold(&rec, label, cost, cause, now, out).await? {
                        Held::Yes(r) => rec = *r,
                        Held::No(why) => {
                            why_not.push(why);
                            continue;
                        }
                        Held::MovedOn => return Ok(()),
                        Held::Paused(p) => {
                            let what = format!(
                                "on-demand-first: the {label} estimate ${cost} is not held and \
                                 nothing is launched"
                            );
                            // Boxed: its state would otherwise sit in every launch's future.
                            let d = Box::pin(pause::hold_back(
                                &self.store,
                                &rec,
                                &p,
                                &what,
                                vec![],
                                cause,
                                now,
                            ))
                            .await?;
                            out.decisions.push(d);
                            return Ok(());
                        }
                    }
                    cost
                }
            };
            // Each placement in turn, skipping those an earlier refusal's scope covers
            // (`workload::refusal`): another subnet, another zone, then another region.
            let mut refused: Vec<(refusal::Scope, Placement)> = Vec::new();
            let mut tried = Vec::new();
            for (n, p) in placements.iter().enumerate() {
                if refused.iter().any(|(scope, at)| p.covered_by(*scope, at)) {
                    continue;
                }
                let target = Target {
                    reservation_id: label.to_string(),
                    // The first placement keeps the tokens runs before placements had.
                    token_base: match (n, &p.subnet) {
                        (0, _) => format!("{id}:{label}"),
                        (_, Some((subnet, _))) => format!("{id}:{label}@{}/{subnet}", p.region),
                        (_, None) => format!("{id}:{label}@{}", p.region),
                    },
                    market: if label == SPOT {
                        LaunchMarket::Spot
                    } else {
                        LaunchMarket::OnDemand
                    },
                    plan_arn: None,
                    region: p.region.clone(),
                    instance_type: instance_type.clone(),
                    instance_count: req.instance_count,
                    availability_zone: None,
                    subnet_id: p.subnet.as_ref().map(|(s, _)| s.clone()),
                    segment: 0,
                    must_end_by: now + req.duration(),
                    drain_at: None,
                    relaunch: None,
                };
                // A crash from here on is repaired by the next tick: the estimate is held, and
                // the launch returns the same instances (same client tokens).
                match workload::launch(
                    &self.workloads,
                    &self.store,
                    &self.config,
                    &rec,
                    &target,
                    now,
                    deadline,
                )
                .await?
                {
                    Launch::Done(resource_ids) => {
                        return self
                            .run(&rec, &target, resource_ids, cost, cause, now, out)
                            .await;
                    }
                    Launch::NoCapacity { code, why } => {
                        workload::undo(&self.workloads, &self.store, &rec, &target, now).await?;
                        let scope = refusal::of(&code).scope;
                        tried.push(format!("{} in {}: {why}", label, p.describe()));
                        refused.push((scope, p.clone()));
                    }
                    Launch::Refuse(why) => {
                        workload::undo(&self.workloads, &self.store, &rec, &target, now).await?;
                        // Each instance the hold started ran, so each is billed (by the
                        // table: another run of this hold may have taken some back).
                        let ran = workload::started_in_hold(&self.store, &rec, label).await?;
                        let settle = brief_spend(cost, ran, req);
                        return self.fail(&rec, why, settle, None, cause, now, out).await;
                    }
                    Launch::Starting(why) => {
                        // Stays TryingOnDemand (still due): the next tick looks again, and
                        // need not wait out this invocation's claim.
                        let reason =
                            format!("on-demand-first: {why}; looking again on the next tick");
                        if let Some(run) = rec.run.clone().filter(|r| r.claim.is_some()) {
                            let t = Transition::of(
                                &rec,
                                RequestStatus::TryingOnDemand,
                                &reason,
                                Some(now),
                                now,
                                &cause.step(&format!("unclaim-{label}")),
                            )
                            .with_run(OnDemandRun { claim: None, ..run });
                            self.store.transition(t).await?;
                        }
                        out.decisions.push(Decision::new(id, "waiting", reason));
                        return Ok(());
                    }
                }
            }
            let why = tried.join("; ");
            let ran = workload::started_in_hold(&self.store, &rec, label).await?;
            let settle = brief_spend(cost, ran, req);
            let reason = match settle {
                Settle::Spend(kept) => format!(
                    "on-demand-first: {why}; the held {label} estimate ${cost} is released but \
                     for ${}: {ran} instance(s) started and were terminated, an hour each",
                    kept.to_usd()
                ),
                Settle::Release => {
                    format!("on-demand-first: {why}; the held {label} estimate ${cost} is released")
                }
            };
            let t = Transition::of(
                &rec,
                RequestStatus::TryingOnDemand,
                &reason,
                Some(now),
                now,
                &cause.step(&format!("release-{label}")),
            )
            .settling(settle);
            let w = self.store.transition(t).await?;
            if !matches!(w, WriteOutcome::Applied { .. }) {
                out.decisions.push(Decision::new(
                    id,
                    decision::written(&w, "released"),
                    "another run moved the request on",
                ));
                return Ok(());
            }
            rec = self.reread(&rec).await?;
            why_not.push(why);
        }
        self.fall_back(&rec, why_not.join("; "), cause, now, out)
            .await
    }

    /// Holds `label`'s estimate `cost` against the caps before anything launches
    /// (ARCHITECTURE §4): both caps are checked by the conditional write itself, which also
    /// records which attempt the hold is for.
    async fn hold(
        &self,
        rec: &RequestRecord,
        label: &str,
        cost: Usd,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Held, PortError> {
        let id = &rec.request_id;
        let Some(team_cap) = self.config.team_budgets.cap_for(&rec.team) else {
            return Ok(Held::No(format!(
                "{label}: team {} has no budget configured",
                rec.team
            )));
        };
        let debit = Debit::of(rec, team_cap, cost.to_micros_ceil(), now)
            .within_older_ledger(&self.store, rec)
            .await?;
        let reason = format!(
            "on-demand-first: holding the {label} estimate ${cost} against team {}'s cap \
             before launching",
            rec.team
        );
        let t = Transition::of(
            rec,
            RequestStatus::TryingOnDemand,
            &reason,
            Some(now),
            now,
            &cause.step(&format!("hold-{label}")),
        )
        .holding(debit)
        .with_run(OnDemandRun {
            attempt: label.to_string(),
            held_at: now,
            started_at: None,
            launch_generations: 0,
            claim: Some(claim_of(cause, now)),
            fall_back: None,
            approval: None,
        });
        Ok(match self.store.transition(t).await? {
            WriteOutcome::Applied { .. } => {
                out.decisions.push(Decision::new(id, "held", reason));
                Held::Yes(Box::new(self.reread(rec).await?))
            }
            WriteOutcome::OverTeamBudget { spent, cap } => Held::No(format!(
                "{label}: the estimate ${cost} would exceed team {}'s cap for {}: spent ${} of \
                 ${}",
                rec.team,
                BudgetMonth::of(now).0,
                spent.to_usd(),
                cap.to_usd()
            )),
            WriteOutcome::OverRequestBudget { spent, cap } => Held::No(format!(
                "{label}: the estimate ${cost} would exceed the request's max_upfront_usd ${} \
                 (spent ${})",
                cap.to_usd(),
                spent.to_usd()
            )),
            WriteOutcome::Paused(p) => Held::Paused(p),
            w @ (WriteOutcome::Conflict | WriteOutcome::DuplicateEvent) => {
                out.decisions.push(Decision::new(
                    id,
                    decision::written(&w, "held"),
                    "another run moved the request on",
                ));
                Held::MovedOn
            }
        })
    }

    /// Claims `run`'s launch for this invocation (`OnDemandRun::claim`), unless another
    /// invocation's claim stands. Two runs of one hold at once each took back instances the
    /// other had counted as launched: a run one short, or an instance left running after
    /// the release that no record names (found by the simulation, seed 14792). The claim is
    /// a versioned write, so of two runs that read the same record one claims and the other
    /// moves on; a claimant that dies is outlived by its claim by at most its function
    /// timeout. Returns the record after the claim, or `None` when this run stops here.
    async fn claim(
        &self,
        rec: &RequestRecord,
        run: OnDemandRun,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<RequestRecord>, PortError> {
        let id = &rec.request_id;
        if let Some(other) = run
            .claim
            .as_ref()
            .filter(|c| c.token != cause.event_id && c.expires_at > now)
        {
            out.decisions.push(Decision::new(
                id,
                "waiting",
                format!(
                    "on-demand-first: invocation {} is launching the held {} estimate (its \
                     claim stands until {}); looking again on the next tick",
                    other.token, run.attempt, other.expires_at
                ),
            ));
            return Ok(None);
        }
        let claim = claim_of(cause, now);
        let reason = format!(
            "on-demand-first: launching the held {} estimate; this invocation ({}) claims it \
             until {}, and no other launches it meanwhile",
            run.attempt, claim.token, claim.expires_at
        );
        let t = Transition::of(
            rec,
            RequestStatus::TryingOnDemand,
            &reason,
            Some(now),
            now,
            &cause.step("claim"),
        )
        .with_run(OnDemandRun {
            claim: Some(claim),
            ..run
        });
        let w = self.store.transition(t).await?;
        if !matches!(w, WriteOutcome::Applied { .. }) {
            out.decisions.push(Decision::new(
                id,
                decision::written(&w, "claimed"),
                "another run moved the request on",
            ));
            return Ok(None);
        }
        Ok(Some(self.reread(rec).await?))
    }

    /// The record as the store has it now (after one of our own writes).
    async fn reread(&self, rec: &RequestRecord) -> Result<RequestRecord, PortError> {
        self.store
            .get_request(&rec.request_id)
            .await?
            .ok_or_else(|| PortError::Transient {
                service: "dynamodb",
                code: "Missing".into(),
                message: format!("{} vanished after our own write", rec.request_id),
            })
    }

    #[allow(clippy::too_many_arguments)]
    async fn run(
        &self,
        rec: &RequestRecord,
        t: &Target,
        resource_ids: Vec<String>,
        cost: Usd,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let to = if t.reservation_id == SPOT {
            RequestStatus::RunningSpot
        } else {
            RequestStatus::RunningOnDemand
        };
        let drain = Duration::minutes(i64::from(
            rec.request
                .drain_minutes
                .max(self.config.default_drain_minutes),
        ));
        let ev = WorkloadLaunched {
            event_key: event_key(rec.whose(), "launched-s0", rec.version + 1),
            request_id: id.to_string(),
            reservation_id: t.reservation_id.clone(),
            segment: 0,
            workload_kind: rec.request.workload_kind(),
            resource_ids: resource_ids.clone(),
            planned_start: rec.request.window.earliest_start,
            launched_at: now,
            estimated_cost_usd: Some(cost),
            start_delay_minutes: None,
        };
        let reason = format!(
            "on-demand-first: launched {} {} x {} in {}; the estimate ${cost} stays held against \
             team {} while it runs, and is settled by the hours it ran when it ends",
            t.reservation_id, t.instance_count, t.instance_type, t.region, rec.team
        );
        let held_at = rec.run.as_ref().map_or(now, |r| r.held_at);
        // The slots' generations now are the launch's relaunches, not replacements: what
        // replace-unhealthy's cap per run counts from.
        let launch_generations = self
            .store
            .workloads(id)
            .await?
            .iter()
            .filter(|w| w.reservation_id == t.reservation_id)
            .map(|w| w.generation)
            .sum();
        let tr = Transition::of(
            rec,
            to,
            &reason,
            Some(t.must_end_by - drain),
            now,
            &cause.step("launch"),
        )
        .with_outbox(vec![announced(Some(rec.team.as_str()), &ev)])
        .with_run(OnDemandRun {
            attempt: t.reservation_id.clone(),
            held_at,
            started_at: Some(now),
            launch_generations,
            claim: None,
            fall_back: None,
            approval: None,
        });
        let w = self.store.transition(tr).await?;
        out.decisions
            .push(Decision::new(id, decision::written(&w, "launched"), reason));
        Ok(())
    }

    async fn fall_back(
        &self,
        rec: &RequestRecord,
        why: String,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let desired = rec.request.window.earliest_start;
        let earliest = now + PURCHASE_LEAD;
        let delay = (earliest - desired).max(Duration::zero());
        let reason = format!(
            "on-demand-first: {why}; falling back to the earliest feasible reservation, which \
             starts no sooner than {earliest}: a start delay of at least {} min after the desired {desired}",
            delay.num_minutes()
        );
        // Each attempt released its own estimate after undoing its launch; one still held
        // may be running, so it is never released here (the review's L3).
        if rec.open_debit.is_some() {
            return Err(PortError::Transient {
                service: "dynamodb",
                code: "EstimateHeld".into(),
                message: format!(
                    "{}: an on-demand estimate is still held; not falling back over it",
                    rec.request_id
                ),
            });
        }
        let t = Transition::of(
            rec,
            RequestStatus::Searching,
            &reason,
            Some(now),
            now,
            &cause.step("fall-back"),
        );
        let written = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&written, "fell-back"),
            reason,
        ));
        Ok(())
    }

    /// The request fails for `reason`; with `refused`, the window whose launch was refused
    /// ends in the same write.
    #[allow(clippy::too_many_arguments)]
    async fn fail(
        &self,
        rec: &RequestRecord,
        reason: String,
        settle: Settle,
        refused: Option<&str>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let held = self.store.reservations(&rec.request_id).await?;
        let all = window::windows(&held, &rec.windows, self.drain_lead(rec));
        let ended = refused
            .map(|key| window::records_with(&rec.windows, &all, key, WindowState::Ended, now));
        // What runs on to its drain: this refusal ends the request, not its paid windows.
        let kept_windows = window::listed(
            &window::undrained_of(&all)
                .into_iter()
                .filter(|w| Some(w.key.as_str()) != refused)
                .collect::<Vec<_>>(),
        );
        let reservation_ids = held
            .into_iter()
            .filter(|r| r.state.is_live())
            .map(|r| r.id)
            .collect();
        // A held on-demand estimate goes back, but for what ran of it.
        let returned = rec.open_debit.map_or(0, |d| settle.released(d).0);
        let ev = events::RequestFailed {
            event_key: event_key(rec.whose(), "failed", rec.version + 1),
            request_id: rec.request_id.to_string(),
            status_before: rec.status,
            reason: reason.clone(),
            reservation_ids,
            spent_usd: MicroUsd(rec.spent.0 - returned).to_usd(),
            kept_windows,
        };
        let t = Transition::of(
            rec,
            RequestStatus::Failed,
            &reason,
            None,
            now,
            &cause.step("fail"),
        )
        .with_outbox(vec![announced(Some(rec.team.as_str()), &ev)])
        .settling(settle);
        let t = match ended {
            Some(records) => t.with_windows(records),
            None => t,
        };
        let written = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&written, "failed"),
            reason,
        ));
        Ok(())
    }
}

/// How a held estimate `cost` (for the request's count over its duration) settles when the
/// attempt is taken back after starting `ran` instances: an hour of each stays spent (the
/// harsher reading of per-second billing, as [`OnDemandRun::spent`]), the rest goes back.
fn brief_spend(cost: Usd, ran: usize, req: &CapacityRequest) -> Settle {
    let per = u64::from(req.instance_count) * u64::from(req.duration_hours);
    let (Ok(whole), Ok(ran)) = (u64::try_from(cost.to_micros_ceil().0), u64::try_from(ran)) else {
        return Settle::Release;
    };
    if ran == 0 || per == 0 {
        return Settle::Release;
    }
    let kept = (whole.saturating_mul(ran)).div_ceil(per);
    Settle::Spend(MicroUsd(i64::try_from(kept).unwrap_or(i64::MAX)))
}

/// This invocation's claim on a held estimate's launch: until the function's timeout from
/// `now`, by when Lambda has stopped it whatever it was doing (`now` is read after the
/// invocation began). The next minute's tick finds it expired; a retry of this invocation's
/// own event holds it already.
fn claim_of(cause: &Cause, now: DateTime<Utc>) -> Lease {
    Lease {
        token: cause.event_id.clone(),
        expires_at: now + LAUNCH_FUNCTION_TIMEOUT,
    }
}

/// What [`Launcher::hold`] came to.
enum Held {
    /// Held; the record after the hold.
    Yes(Box<RequestRecord>),
    /// Not held, for this reason: the next attempt is tried.
    No(String),
    /// Another run moved the request on.
    MovedOn,
    /// Purchases are paused (ARCHITECTURE §9.7): nothing is held or launched.
    Paused(Pause),
}

#[cfg(test)]
mod tests;
