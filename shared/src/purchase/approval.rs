//! The approval gate (ARCHITECTURE §8.2, §9.8): a plan whose upfront fee takes the request's
//! spend above its approval threshold is bought only once an approver answers the `Capacity
//! Purchase Awaiting Approval` that named it; a decision for any other plan, or none, is
//! refused and buys nothing. An on-demand or spot hold above it likewise waits, at most
//! `HOLD_APPROVAL_MINUTES`, before launch-workloads holds its estimate (review N9).

use chrono::{DateTime, Utc};

use super::{Outcome, Protocols};
use crate::config::Config;
use crate::decision::{self, Decision};
use crate::domain::events::{
    self, ApprovalKind, ApprovalRefused, AwaitingApproval, HoldSummary, PlanSummary,
    PurchaseDecision, asked_key, awaiting_approval_key, event_key, hold_approval_key, names,
};
use crate::domain::money::Usd;
use crate::domain::notices::announced;
use crate::domain::planner::Plan;
use crate::domain::request::RequestId;
use crate::domain::status::RequestStatus;
use crate::domain::time_rules::PURCHASE_LEAD;
use crate::outbox;
use crate::ports::{
    CapacityMarket, Cause, EventSink, HoldApproval, OnDemandRun, PortError, RequestRecord, Store,
    Transition, WriteOutcome, request_named,
};

/// How often a decision on a hold that lost a write race is tried again in one invocation.
const DECIDE_ATTEMPTS: u32 = 3;

/// What the gate let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// No approval is needed, or it was given: the plan may be bought.
    Open,
    /// The request awaits an approver, or searches again because none came in time.
    Held,
}

impl<S: Store, M: CapacityMarket, E: EventSink> Protocols<'_, S, M, E> {
    /// An approver's decision on the plan awaiting approval. `Some`: approved, the request as
    /// read, to be bought as `approver`'s; `None`: refused, rejected or for no request.
    pub async fn decide(
        &self,
        d: &PurchaseDecision,
        approved: bool,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<RequestRecord>, PortError> {
        let rec = match RequestId::parse(&d.request_id) {
            Ok(id) => request_named(self.store, &id).await?,
            Err(_) => None,
        };
        let Some(rec) = rec else {
            // Answered, not dropped: the approver learns nothing will be bought (review N12).
            let why = format!(
                "no request {:?} is recorded (never submitted, rejected at submission, or \
                 archived)",
                d.request_id
            );
            return self
                .refuse(d, approved, &d.request_id, None, why, None, cause, out)
                .await;
        };
        let id = rec.request_id.clone();
        // ARCHITECTURE 8.2: a decision answers one Awaiting Approval, bound to its plan or hold.
        let current = awaiting(&rec);
        let refused = match (d.approves.as_deref(), current.as_deref()) {
            (None, _) => Some(
                "it names no plan: `approves` must be the event_key of the Capacity Purchase \
                 Awaiting Approval it answers"
                    .to_string(),
            ),
            (Some(k), None) => Some(format!(
                "it answers {k}, but nothing awaits approval while the request is {}",
                rec.status
            )),
            (Some(k), Some(c)) if !names(k, c) => Some(format!(
                "it answers {k}, but what awaits approval now is {c} (the request searched or \
                 tried again since)"
            )),
            // Past its deadline the request is about to search again: an approval that would
            // buy nothing is told so (review N12), not consumed silently.
            _ => approved.then(|| self.past_deadline(&rec, now)).flatten(),
        };
        if let Some(why) = refused {
            if self.applied_already(&id, cause).await? {
                out.decisions.push(Decision::new(
                    &id,
                    "duplicate",
                    format!(
                        "decision event {} was applied already; its answer stands",
                        cause.event_id
                    ),
                ));
                return Ok(None);
            }
            return self
                .refuse(
                    d,
                    approved,
                    id.as_str(),
                    Some(rec.team.as_str()),
                    why,
                    current,
                    cause,
                    out,
                )
                .await;
        }
        if let Some((run, asked)) = hold_awaiting(&rec) {
            let (run, asked) = (run.clone(), asked.clone());
            return self
                .decide_hold(&rec, d, approved, run, asked, cause, now, out)
                .await;
        }
        if approved {
            Ok(Some(rec))
        } else {
            let reason = format!(
                "purchase rejected by approver {}{}",
                d.approver,
                d.comment
                    .as_deref()
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default()
            );
            let (reservation_ids, kept_windows) = self.kept(&rec).await?;
            let failed = events::RequestFailed {
                event_key: event_key(rec.whose(), "rejected", rec.version + 1),
                request_id: id.to_string(),
                status_before: rec.status,
                reason: reason.clone(),
                reservation_ids,
                spent_usd: rec.spent.to_usd(),
                kept_windows,
            };
            let t = Transition::of(&rec, RequestStatus::Rejected, &reason, None, now, cause)
                .with_outbox(vec![announced(Some(rec.team.as_str()), &failed)]);
            let w = self.store.transition(t).await?;
            out.decisions.push(Decision::new(
                &id,
                decision::written(&w, "rejected"),
                reason,
            ));
            Ok(None)
        }
    }

    /// Answers decision `d` about `request_id` with `Capacity Purchase Approval Refused`,
    /// saying `why` (and the key a decision must name now, `current`); nothing is bought.
    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::too_many_arguments)]
    async fn refuse(
        &self,
        d: &PurchaseDecision,
        approved: bool,
        request_id: &str,
        team: Option<&str>,
        why: String,
        current: Option<String>,
        cause: &Cause,
        out: &mut Outcome,
    ) -> Result<Option<RequestRecord>, PortError> {
        let reason = format!(
            "{} by {} refused: {why}",
            if approved { "approval" } else { "rejection" },
            d.approver
        );
        let ev = ApprovalRefused {
            event_key: format!("{request_id}:approval-refused:{}", cause.event_id),
            request_id: request_id.to_string(),
            reason: reason.clone(),
            current_event_key: current,
        };
        outbox::publish_now(self.events, &[announced(team, &ev)]).await?;
        out.decisions
            .push(Decision::about(request_id, "approval-refused", reason));
        Ok(None)
    }

    /// Whether `plan` may be bought now: when the request's spend plus its fee is above the
    /// threshold ([`crate::config::Config::approval_threshold`]) and it is not approved
    /// (`approver`), the request waits for an approver (announced once), or searches again
    /// once the offering's purchase deadline passed unapproved.
    pub async fn gate(
        &self,
        rec: &RequestRecord,
        plan: &Plan,
        approver: Option<&str>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Gate, PortError> {
        let id = &rec.request_id;
        // On the request's whole spend (review N9): what it has spent, this fee included, so a
        // replacement or a split's later segment cannot pass a threshold piece by piece.
        let threshold = self.config.approval_threshold(&rec.request);
        let total = rec.spent.0 + plan.upfront_fee.to_micros_ceil().0;
        if let Some(limit) = threshold
            && total > limit.to_micros_ceil().0
            && approver.is_none()
        {
            if rec.status == RequestStatus::AwaitingApproval {
                // Still waiting; the schedule looks again at the purchase deadline.
                if now >= purchase_deadline(plan) {
                    let reason = "no approval arrived before the offering's purchase deadline; searching again";
                    self.search_again(rec, reason, cause, now, out).await?;
                }
                return Ok(Gate::Held);
            }
            let spent = rec.spent.to_usd();
            let reason = if rec.spent.0 > 0 {
                format!(
                    "upfront fee ${} on top of the ${spent} the request has spent is above the \
                     approval threshold ${limit}; waiting for an approver",
                    plan.upfront_fee
                )
            } else {
                format!(
                    "upfront fee ${} is above the approval threshold ${limit}; waiting for an \
                     approver",
                    plan.upfront_fee
                )
            };
            let ev = AwaitingApproval {
                event_key: asked_key(
                    &awaiting_approval_key(id.as_str(), plan),
                    rec.whose(),
                    rec.version + 1,
                ),
                request_id: id.to_string(),
                team: rec.team.to_string(),
                kind: ApprovalKind::Reservation,
                upfront_fee_usd: plan.upfront_fee,
                approval_above_usd: limit,
                spent_usd: spent,
                plan: Some(PlanSummary::from(plan)),
                hold: None,
            };
            let t = Transition::of(
                rec,
                RequestStatus::AwaitingApproval,
                &reason,
                Some(purchase_deadline(plan)),
                now,
                cause,
            )
            .with_outbox(vec![announced(Some(rec.team.as_str()), &ev)]);
            let w = self.store.transition(t).await?;
            out.decisions.push(Decision::new(
                id,
                decision::written(&w, "awaiting-approval"),
                reason,
            ));
            return Ok(Gate::Held);
        }
        Ok(Gate::Open)
    }

    /// Why an approval of what `rec` awaits comes too late to be acted on: the plan's
    /// purchase deadline, or the hold's wait, has passed. `None` while it is in time.
    fn past_deadline(&self, rec: &RequestRecord, now: DateTime<Utc>) -> Option<String> {
        if let Some((run, asked)) = hold_awaiting(rec) {
            let until = wait_ends(self.config, asked);
            return (now >= until).then(|| {
                format!(
                    "it came after the {} hold's wait for approval ended at {until}; the \
                     request falls back to the reservation search",
                    run.attempt
                )
            });
        }
        let plan = rec.candidates.first()?;
        let deadline = purchase_deadline(plan);
        (now >= deadline).then(|| {
            format!(
                "it came after the plan's purchase deadline {deadline}; the request searches \
                 again"
            )
        })
    }

    /// An approver's decision on the hold `rec` awaits: approved, the request goes back to
    /// launch-workloads to hold and launch it; rejected, it falls back to the reservation
    /// search (ARCHITECTURE §9.8).
    #[allow(clippy::too_many_arguments)]
    async fn decide_hold(
        &self,
        rec: &RequestRecord,
        d: &PurchaseDecision,
        approved: bool,
        run: OnDemandRun,
        asked: HoldApproval,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<RequestRecord>, PortError> {
        let id = rec.request_id.clone();
        let (mut rec, mut run, mut asked) = (rec.clone(), run, asked);
        // A write lost to another (a tick, the wait's end, a cancellation) reads the request
        // again: the same hold still waiting is decided again, anything else is answered.
        for _ in 0..DECIDE_ATTEMPTS {
            let w = if approved {
                let reason = format!(
                    "the {} hold of ${} was approved by {}; holding it and launching",
                    run.attempt, asked.estimate, d.approver
                );
                let approval = HoldApproval {
                    approved_by: Some(d.approver.clone()),
                    ..asked.clone()
                };
                let t = Transition::of(
                    &rec,
                    RequestStatus::TryingOnDemand,
                    &reason,
                    Some(now),
                    now,
                    cause,
                )
                .with_run(OnDemandRun {
                    approval: Some(approval),
                    ..run.clone()
                });
                let w = self.store.transition(t).await?;
                out.decisions.push(Decision::new(
                    &id,
                    decision::written(&w, "hold-approved"),
                    reason,
                ));
                w
            } else {
                let reason = format!(
                    "the {} hold of ${} was rejected by approver {}{}; searching for a \
                     reservation instead",
                    run.attempt,
                    asked.estimate,
                    d.approver,
                    d.comment
                        .as_deref()
                        .map(|c| format!(": {c}"))
                        .unwrap_or_default()
                );
                self.end_hold_wait(&rec, run.clone(), &reason, cause, now, out)
                    .await?
            };
            if matches!(
                w,
                WriteOutcome::Applied { .. } | WriteOutcome::DuplicateEvent
            ) {
                return Ok(None);
            }
            let Some(now_rec) = self.store.get_request(&id).await? else {
                break;
            };
            rec = now_rec;
            match hold_awaiting(&rec) {
                Some((r, a)) if a.asked_at == asked.asked_at && r.attempt == run.attempt => {
                    (run, asked) = (r.clone(), a.clone());
                }
                _ => {
                    let why = format!(
                        "the request moved on before it could be applied: it is {} now ({})",
                        rec.status, rec.reason
                    );
                    let current = awaiting(&rec);
                    return self
                        .refuse(
                            d,
                            approved,
                            id.as_str(),
                            Some(rec.team.as_str()),
                            why,
                            current,
                            cause,
                            out,
                        )
                        .await;
                }
            }
        }
        Err(PortError::Transient {
            service: "dynamodb",
            code: "Contended".into(),
            message: format!("{id}: the request kept changing under its approver's decision"),
        })
    }

    /// A hold awaiting approval, at its wake-up: once its wait is over unanswered, the
    /// request falls back to the reservation search.
    pub async fn hold_waits(
        &self,
        rec: &RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let Some((run, asked)) = hold_awaiting(rec) else {
            return Ok(());
        };
        let until = wait_ends(self.config, asked);
        if now < until {
            out.decisions.push(Decision::new(
                &rec.request_id,
                "waiting",
                format!(
                    "the {} hold of ${} waits for an approver until {until}",
                    run.attempt, asked.estimate
                ),
            ));
            return Ok(());
        }
        let reason = format!(
            "no approver answered the {} hold of ${} within {} min; searching for a \
             reservation instead",
            run.attempt, asked.estimate, self.config.hold_approval_minutes
        );
        self.end_hold_wait(rec, run.clone(), &reason, cause, now, out)
            .await?;
        Ok(())
    }

    /// The hold's wait ends unapproved: the request searches for a reservation, the asked
    /// approval cleared so that nothing later reads it as pending.
    async fn end_hold_wait(
        &self,
        rec: &RequestRecord,
        run: OnDemandRun,
        reason: &str,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<WriteOutcome, PortError> {
        let t = Transition::of(rec, RequestStatus::Searching, reason, Some(now), now, cause)
            .with_run(OnDemandRun {
                approval: None,
                ..run
            });
        let w = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&w, "fell-back"),
            reason,
        ));
        Ok(w)
    }
}

/// When a plan must be bought by, or the request searches again: its start less the
/// purchase lead. The gate waits for an approver until then, and refuses an approval after.
fn purchase_deadline(plan: &Plan) -> DateTime<Utc> {
    plan.start - PURCHASE_LEAD
}

/// When the hold `asked` stops waiting for an approver (`HOLD_APPROVAL_MINUTES` after it
/// asked): its wake-up, and the last moment an approval of it is acted on.
fn wait_ends(config: &Config, asked: &HoldApproval) -> DateTime<Utc> {
    asked.asked_at + chrono::Duration::minutes(i64::from(config.hold_approval_minutes))
}

/// The hold `rec` awaits approval for, when it waits for one (not for a plan).
pub fn hold_awaiting(rec: &RequestRecord) -> Option<(&OnDemandRun, &HoldApproval)> {
    if rec.status != RequestStatus::AwaitingApproval {
        return None;
    }
    let run = rec.run.as_ref()?;
    let asked = run.approval.as_ref().filter(|a| a.approved_by.is_none())?;
    Some((run, asked))
}

/// What a decision must name now ([`names`]): the hold or the plan `rec` awaits approval for.
/// (The CLI's `approve` answers with it: the key the function checks is the one it sends.)
pub fn awaiting(rec: &RequestRecord) -> Option<String> {
    if rec.status != RequestStatus::AwaitingApproval {
        return None;
    }
    let id = rec.request_id.as_str();
    match hold_awaiting(rec) {
        Some((run, asked)) => Some(hold_approval_key(
            id,
            ApprovalKind::of_attempt(&run.attempt),
            asked.estimate,
        )),
        None => rec.candidates.first().map(|p| awaiting_approval_key(id, p)),
    }
}

/// The threshold an on-demand or spot hold of `estimate` for `attempt` must wait for an
/// approver under: the request's spend with this estimate is above it and no approval of
/// this attempt covers the estimate. `None`: the hold may go on.
pub fn hold_threshold(
    config: &Config,
    rec: &RequestRecord,
    attempt: &str,
    estimate: Usd,
) -> Option<Usd> {
    let limit = config.approval_threshold(&rec.request)?;
    let total = rec.spent.0 + estimate.to_micros_ceil().0;
    if total <= limit.to_micros_ceil().0 {
        return None;
    }
    let approved = approved_hold(rec).is_some_and(|(run, a)| {
        run.attempt == attempt && estimate.to_micros_ceil() <= a.estimate.to_micros_ceil()
    });
    (!approved).then_some(limit)
}

/// The approved hold `rec` goes on with, if any: its attempt was approved by an approver.
pub fn approved_hold(rec: &RequestRecord) -> Option<(&OnDemandRun, &HoldApproval)> {
    let run = rec.run.as_ref()?;
    let a = run.approval.as_ref().filter(|a| a.approved_by.is_some())?;
    Some((run, a))
}

/// Asks for approval of `attempt`'s hold of `estimate`, above `limit`: the request waits in
/// `AwaitingApproval` until an approver answers or the wait ends, nothing held meanwhile.
#[allow(clippy::too_many_arguments)]
pub async fn ask_for_hold<S: Store>(
    store: &S,
    config: &Config,
    rec: &RequestRecord,
    attempt: &str,
    estimate: Usd,
    limit: Usd,
    cause: &Cause,
    now: DateTime<Utc>,
) -> Result<(WriteOutcome, String), PortError> {
    let req = &rec.request;
    let kind = ApprovalKind::of_attempt(attempt);
    let spent = rec.spent.to_usd();
    let wait = config.hold_approval_minutes;
    let reason = if rec.spent.0 > 0 {
        format!(
            "on-demand-first: the {attempt} estimate ${estimate} on top of the ${spent} the \
             request has spent is above the approval threshold ${limit}; waiting up to {wait} \
             min for an approver"
        )
    } else {
        format!(
            "on-demand-first: the {attempt} estimate ${estimate} is above the approval \
             threshold ${limit}; waiting up to {wait} min for an approver"
        )
    };
    let ev = AwaitingApproval {
        event_key: asked_key(
            &hold_approval_key(rec.request_id.as_str(), kind, estimate),
            rec.whose(),
            rec.version + 1,
        ),
        request_id: rec.request_id.to_string(),
        team: rec.team.to_string(),
        kind,
        upfront_fee_usd: estimate,
        approval_above_usd: limit,
        spent_usd: spent,
        plan: None,
        hold: Some(HoldSummary {
            instance_type: req.instance_types.first().cloned().unwrap_or_default(),
            instance_count: req.instance_count,
            duration_hours: req.duration_hours,
            regions: req.regions.clone(),
            estimate_usd: estimate,
        }),
    };
    let asked = HoldApproval {
        estimate,
        asked_at: now,
        approved_by: None,
    };
    let wakes = wait_ends(config, &asked);
    let run = OnDemandRun {
        attempt: attempt.to_string(),
        held_at: now,
        started_at: None,
        launch_generations: 0,
        claim: None,
        fall_back: None,
        approval: Some(asked),
    };
    let t = Transition::of(
        rec,
        RequestStatus::AwaitingApproval,
        &reason,
        Some(wakes),
        now,
        &cause.step(&format!("ask-{attempt}")),
    )
    .with_run(run)
    .with_outbox(vec![announced(Some(rec.team.as_str()), &ev)]);
    Ok((store.transition(t).await?, reason))
}
