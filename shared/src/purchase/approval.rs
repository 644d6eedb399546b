//! The approval gate (ARCHITECTURE §8.2): a plan whose upfront fee is above the request's
//! `approval_above` is bought only once an approver answers the `Capacity Purchase Awaiting
//! Approval` that named it; a decision for any other plan, or none, is refused and buys nothing.

use chrono::{DateTime, Utc};

use super::{Outcome, Protocols};
use crate::decision::{self, Decision};
use crate::domain::events::{
    self, ApprovalRefused, AwaitingApproval, PlanSummary, PurchaseDecision, awaiting_approval_key,
    event_key, outbound,
};
use crate::domain::planner::Plan;
use crate::domain::request::RequestId;
use crate::domain::status::RequestStatus;
use crate::domain::time_rules::PURCHASE_LEAD;
use crate::outbox;
use crate::ports::{CapacityMarket, Cause, EventSink, PortError, RequestRecord, Store, Transition};

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
            Ok(id) => self.store.get_request(&id).await?,
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
                .refuse(d, approved, &d.request_id, why, None, cause, out)
                .await;
        };
        let id = rec.request_id.clone();
        // ARCHITECTURE 8.2: a decision answers one Awaiting Approval, bound to its plan.
        let current = (rec.status == RequestStatus::AwaitingApproval)
            .then(|| rec.candidates.first())
            .flatten()
            .map(|p| awaiting_approval_key(id.as_str(), p));
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
            (Some(k), Some(c)) if k != c => Some(format!(
                "it answers {k}, but the plan awaiting approval now is {c} (the request \
                 searched again since)"
            )),
            _ => None,
        };
        if let Some(why) = refused {
            return self
                .refuse(d, approved, id.as_str(), why, current, cause, out)
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
                event_key: event_key(id.as_str(), "rejected", rec.version + 1),
                request_id: id.to_string(),
                status_before: rec.status,
                reason: reason.clone(),
                reservation_ids,
                spent_usd: rec.spent.to_usd(),
                kept_windows,
            };
            let t = Transition::of(&rec, RequestStatus::Rejected, &reason, None, now, cause)
                .with_outbox(vec![outbound(&failed)]);
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
    async fn refuse(
        &self,
        d: &PurchaseDecision,
        approved: bool,
        request_id: &str,
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
        outbox::publish_now(self.events, &[outbound(&ev)]).await?;
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
                if now >= plan.start - PURCHASE_LEAD {
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
                event_key: awaiting_approval_key(id.as_str(), plan),
                request_id: id.to_string(),
                team: rec.team.to_string(),
                upfront_fee_usd: plan.upfront_fee,
                approval_above_usd: limit,
                spent_usd: spent,
                plan: PlanSummary::from(plan),
            };
            let t = Transition::of(
                rec,
                RequestStatus::AwaitingApproval,
                &reason,
                Some(plan.start - PURCHASE_LEAD),
                now,
                cause,
            )
            .with_outbox(vec![outbound(&ev)]);
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
}
