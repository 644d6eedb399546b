//! Purchases paused by an operator (ARCHITECTURE §9.7). The store refuses a new purchase's
//! lease and an on-demand or spot hold while the PAUSE item exists; this is what the request
//! is told. Each pause is written into a held-back request's reason and history once (its
//! reason then starts with [`Pause::describe`]); a tick that reads the pause in its agenda
//! leaves a request already told alone, with a decision and no write.
//!
//! What never reads the pause: searches and plans, approvals asked, reconciliation, adoption,
//! payment tracking, launches into bought windows, drains and cleanup.

use chrono::{DateTime, Utc};

use super::{Outcome, Protocols};
use crate::decision::{self, Decision};
use crate::domain::events::ApprovalRefused;
use crate::domain::notices::announced;
use crate::domain::planner::Plan;
use crate::ports::{Cause, OutboundEvent, Pause, PortError, RequestRecord, Store, Transition};

/// What a request held back by `pause` says, first in its reason: "paused by <who> since
/// <when>: <why>; nothing is bought until purchases resume (`capacity-pilot resume`)",
/// then `what` was held back.
pub fn reason(pause: &Pause, what: &str) -> String {
    format!(
        "{}; nothing is bought until purchases resume (`capacity-pilot resume`): {what}",
        pause.describe()
    )
}

/// Whether a tick that read `pause` leaves `rec` alone: it was told of this pause already
/// (its reason says so) and nothing of it is under way.
pub fn told(pause: Option<&Pause>, rec: &RequestRecord) -> Option<Decision> {
    let p = pause?;
    (rec.open_debit.is_none() && p.told(&rec.reason)).then(|| {
        Decision::new(
            &rec.request_id,
            "paused",
            format!("{}; nothing is bought until purchases resume", p.describe()),
        )
    })
}

/// Holds `rec` back for `pause`: once per pause, its status written again with the pause
/// in its reason and history (and `outbox`), its next action kept; a request already told
/// gets a decision only. The decision either way.
pub async fn hold_back<S: Store>(
    store: &S,
    rec: &RequestRecord,
    pause: &Pause,
    what: &str,
    outbox: Vec<OutboundEvent>,
    cause: &Cause,
    now: DateTime<Utc>,
) -> Result<Decision, PortError> {
    let reason = reason(pause, what);
    if pause.told(&rec.reason) && outbox.is_empty() {
        return Ok(Decision::new(&rec.request_id, "paused", reason));
    }
    let next = rec.next_action_at.or(Some(now));
    let t = Transition::of(rec, rec.status, &reason, next, now, &cause.step("paused"))
        .with_outbox(outbox);
    let w = store.transition(t).await?;
    Ok(Decision::new(
        &rec.request_id,
        decision::written(&w, "paused"),
        reason,
    ))
}

impl<S: Store, M, E> Protocols<'_, S, M, E> {
    /// A purchase's lease was refused by `pause`. The plan waits for the pause to end; an
    /// approval that came meanwhile is not kept (an approver approves again once purchases
    /// resume, and is told so).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn paused(
        &self,
        rec: &RequestRecord,
        plan: &Plan,
        pause: &Pause,
        approver: Option<&str>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let offerings = plan.offering_ids().join(" + ");
        let (what, outbox) = match approver {
            None => (
                format!(
                    "the plan {offerings} (${}) is bought then, if it still can be",
                    plan.upfront_fee
                ),
                vec![],
            ),
            Some(a) => {
                let what = format!(
                    "the approval by {a} of {offerings} (${}) was not acted on; approve \
                     again once purchases resume",
                    plan.upfront_fee
                );
                let refused = ApprovalRefused {
                    event_key: format!("{}:approval-refused:{}", rec.request_id, cause.event_id),
                    request_id: rec.request_id.to_string(),
                    reason: format!("approval by {a} refused: {}", reason(pause, &what)),
                    current_event_key: super::approval::awaiting(rec),
                };
                (what, vec![announced(Some(rec.team.as_str()), &refused)])
            }
        };
        let d = hold_back(self.store, rec, pause, &what, outbox, cause, now).await?;
        out.decisions.push(d);
        Ok(())
    }
}
