//! The pre-flight before a purchase (ARCHITECTURE §8.1): purchase-capacity checks, under its
//! own role and before taking the lease, that the request's workload could launch on the plan
//! it is about to buy or ask an approver about ([`crate::workload::preflight`], with the
//! RunInstances dry run). The search made the reads already; this adds the dry run and sees
//! what changed since (a role's policy, a template deleted).
//!
//! The candidates are checked in their order until one passes. Those rejected before it are
//! dropped from the request's candidates, with their reasons in its history, and the request
//! goes on with the first that passed at its next wake-up (an approval given for a dropped
//! plan is not carried over to another). When none passes, nothing can be bought that would
//! launch: the request fails with every reason, nothing debited.

use chrono::{DateTime, Utc};

use super::{Outcome, Protocols};
use crate::decision::{self, Decision};
use crate::domain::status::RequestStatus;
use crate::ports::{
    CapacityMarket, Cause, EventSink, PortError, RequestRecord, Store, Transition, Workloads,
};
use crate::workload::preflight::{Depth, Verdicts, preflight_with};

/// What the pre-flight came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preflight {
    /// The first candidate passed (or could not be checked): buy or gate it.
    Passed,
    /// Candidates were dropped or the request failed: nothing more this wake-up.
    Stopped,
}

impl<S: Store, M: CapacityMarket, E: EventSink> Protocols<'_, S, M, E> {
    /// The pre-flight of `rec`'s candidates, in order, until one passes.
    pub async fn preflight<W: Workloads>(
        &self,
        workloads: &W,
        rec: &RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Preflight, PortError> {
        let id = &rec.request_id;
        let mut reasons = Vec::new();
        let mut passing = None;
        // Candidates share zones: each zone's dry run is made once for all of them.
        let mut verdicts = Verdicts::default();
        for (i, plan) in rec.candidates.iter().enumerate() {
            let checked = preflight_with(
                workloads,
                Some(self.config),
                &rec.request,
                &plan.offerings,
                Depth { dry_run: true },
                &mut verdicts,
            )
            .await;
            for why in &checked.unverified {
                out.decisions
                    .push(Decision::new(id, "pre-flight-unverified", why.clone()));
            }
            if checked.rejections.is_empty() {
                passing = Some(i);
                break;
            }
            reasons.extend(
                checked
                    .rejections
                    .iter()
                    .map(|r| format!("{} in {}: {}", r.offering_id, r.region, r.reason)),
            );
        }
        match passing {
            Some(0) => Ok(Preflight::Passed),
            Some(i) => {
                let reason = format!(
                    "pre-flight dropped {i} candidate plan(s), going on with the next: {}",
                    reasons.join("; ")
                );
                let step = Cause::new(format!("{}#preflight", cause.event_id));
                let mut t = Transition::of(
                    rec,
                    RequestStatus::OfferingsFound,
                    &reason,
                    Some(now),
                    now,
                    &step,
                );
                t.candidates = Some(rec.candidates[i..].to_vec());
                let w = self.store.transition(t).await?;
                out.decisions.push(Decision::new(
                    id,
                    decision::written(&w, "pre-flight-dropped"),
                    reason,
                ));
                Ok(Preflight::Stopped)
            }
            None if rec.candidates.is_empty() => Ok(Preflight::Passed),
            None => {
                let reason = format!(
                    "no candidate plan passed the pre-flight, so nothing was bought: {}",
                    reasons.join("; ")
                );
                let step = Cause::new(format!("{}#preflight", cause.event_id));
                self.fail(rec, reason, now, &step, out).await?;
                Ok(Preflight::Stopped)
            }
        }
    }
}
