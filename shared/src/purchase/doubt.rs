//! A purchase that ends in doubt (ARCHITECTURE §9.1). A takeover past the request's purchase
//! deadline whose plan called AWS, and which cannot reconcile, cannot wait any longer and
//! cannot know whether AWS sold what it called: the request fails (or is cancelled, applying a
//! kept cancellation) with its debit kept, publishes `Capacity Purchase In Doubt`, and is
//! reconciled hourly until the doubted offerings end. What is then found is recorded as the
//! ended request's window, served to its drain like any other, already paid for by the kept
//! debit, and announced as `Capacity Reservation Unrecorded`. What was never called goes back
//! once the doubt is resolved; what stays unfound to the offerings' end stays spent, for a
//! person to check against the bill.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use tracing::warn;

use super::payment::payment_check_after;
use super::protocol::{doubted, is_from, purchase_deadline};
use super::{Outcome, Protocols};
use crate::decision::{self, Decision};
use crate::domain::events::{PurchaseInDoubt, ReservationUnrecorded, ending_events, event_key};
use crate::domain::money::MicroUsd;
use crate::domain::naming::plan_name;
use crate::domain::notices::announced;
use crate::domain::offering::{Offering, Product};
use crate::domain::planner::Plan;
use crate::domain::reservation::Reservation;
use crate::domain::status::RequestStatus;
use crate::domain::window;
use crate::ports::{
    CapacityMarket, Cause, Doubt, EventSink, FailInDoubt, Lease, LeaseWriteOutcome, PortError,
    RequestRecord, Settle, Store, Transition,
};

/// How often a request that ended in doubt is reconciled.
pub const IN_DOUBT_RECONCILE_EVERY: Duration = Duration::hours(1);

impl<S: Store, M: CapacityMarket, E: EventSink> Protocols<'_, S, M, E> {
    /// A takeover past the purchase deadline whose reconciliation failed with `error`: the
    /// request ends in doubt with its debit kept, or, when nothing called is unrecorded,
    /// fails with the debit returned.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn end_in_doubt(
        &self,
        rec: &RequestRecord,
        plan: &Plan,
        lease: &Lease,
        doubt: &Doubt,
        error: &PortError,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let deadline = purchase_deadline(rec);
        let held = self.store.reservations(id).await?;
        let pending = pending(plan, doubt, &held);
        if pending.is_empty() {
            let reason = format!(
                "the purchase could not go on ({error}) and the request is past its purchase \
                 deadline {deadline}; every offering it called is recorded, so nothing is in \
                 doubt and the unbought part of the debit is returned"
            );
            return self
                .release(rec, lease, RequestStatus::Failed, reason, now, cause, out)
                .await;
        }
        let until = reconcile_until(&pending, now);
        let offering_ids: Vec<String> = pending.iter().map(|o| o.id.clone()).collect();
        // Twice at most: a cancellation kept after our read makes the store refuse the first.
        for _ in 0..2 {
            let Some(now_rec) = self.store.get_request(id).await? else {
                return Ok(());
            };
            let kept_usd = now_rec.open_debit.unwrap_or(MicroUsd(0)).to_usd();
            let base = format!(
                "the purchase of {} called at {} could not be reconciled by the purchase \
                 deadline {deadline} ({error}): AWS may have sold it, so the request ends in \
                 doubt with its debit of ${kept_usd} kept, and is reconciled hourly until \
                 {until}; what is found is served as its window",
                offering_ids.join(" + "),
                doubt.since,
            );
            let (to, reason) = match &now_rec.cancel {
                Some(c) => (
                    RequestStatus::Cancelled,
                    format!(
                        "{}, kept since {} and applied because the purchase did not complete: \
                         {base}",
                        c.reason, c.at
                    ),
                ),
                None => (RequestStatus::Failed, base),
            };
            let ev = PurchaseInDoubt {
                event_key: event_key(now_rec.whose(), "purchase-in-doubt", now_rec.version + 1),
                request_id: id.to_string(),
                offering_ids: offering_ids.clone(),
                since: doubt.since,
                reconciled_until: until,
                kept_usd,
                reason: reason.clone(),
            };
            let (kept, windows) = self.kept(&now_rec).await?;
            let mut outbox = vec![announced(Some(now_rec.team.as_str()), &ev)];
            outbox.extend(ending_events(
                &now_rec,
                to,
                &reason,
                kept,
                windows,
                now_rec.spent,
            ));
            let w = self
                .store
                .fail_in_doubt(FailInDoubt {
                    request_id: id.clone(),
                    lease_token: lease.token.clone(),
                    to,
                    reason: reason.clone(),
                    next_action_at: Some(next_reconciliation(now, until)),
                    at: now,
                    caused_by: Cause::new(format!("{}#in-doubt", cause.event_id)),
                    outbox,
                })
                .await?;
            let action = match w {
                LeaseWriteOutcome::CancelKept => continue,
                LeaseWriteOutcome::Applied { .. } => {
                    warn!(alert = "purchase-in-doubt", request_id = %id, offerings = ?offering_ids, "{reason}");
                    "ended-in-doubt"
                }
                LeaseWriteOutcome::LeaseLost => "lease-lost",
                LeaseWriteOutcome::DuplicateEvent => "duplicate",
            };
            out.decisions.push(Decision::new(id, action, reason));
            return Ok(());
        }
        Err(PortError::Transient {
            service: "dynamodb",
            code: "Contended".into(),
            message: format!("{id}: a cancellation kept twice while ending in doubt"),
        })
    }

    /// The hourly reconciliation of a request that ended in doubt ([`RequestRecord::in_doubt`]):
    /// what the doubted offerings gave, if AWS lists it now, is recorded as the request's
    /// window and announced; once all is found, or the offerings have ended, the doubt is
    /// resolved: what was never called goes back, the rest stays spent.
    pub async fn reconcile_in_doubt(
        &self,
        rec: RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = rec.request_id.clone();
        let Some(recorded_doubt) = rec.doubt.clone().filter(|_| rec.in_doubt()) else {
            return Ok(());
        };
        let held = self.store.reservations(&id).await?;
        let Some(plan) = rec.candidates.first().cloned() else {
            let reason = format!(
                "{}; no plan is recorded to reconcile against, so the doubt is closed with the \
                 debit kept",
                rec.reason
            );
            return self
                .resolve(
                    &rec,
                    &[],
                    Settle::Spend(MicroUsd(i64::MAX)),
                    reason,
                    cause,
                    now,
                    out,
                )
                .await;
        };
        let doubt = doubted(&rec, &recorded_doubt).unwrap_or(recorded_doubt);
        let pending = pending(&plan, &doubt, &held);
        let until = reconcile_until(&pending, now);
        let mut recorded: BTreeSet<String> = held.iter().map(|r| r.id.clone()).collect();
        let plans_held = held
            .iter()
            .filter(|r| matches!(r.product, Product::TrainingPlan { .. }))
            .count();
        let name = plan_name(
            &id,
            &self.config.deployment_id,
            u32::try_from(plans_held).unwrap_or(u32::MAX),
        );
        let mut found: Vec<Reservation> = Vec::new();
        let mut failure = None;
        for offering in &pending {
            match self
                .find_unrecorded(&rec, &plan, offering, &name, &recorded)
                .await
            {
                Ok((Some(mut r), _)) => {
                    recorded.insert(r.id.clone());
                    r.bought_at = Some(now);
                    r.payment_check_at = payment_check_after(&r, now);
                    found.push(r);
                }
                Ok((None, _)) => {}
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let unfound: Vec<&Offering> = pending
            .iter()
            .filter(|o| !found.iter().any(|r| is_from(r, o)))
            .copied()
            .collect();
        let mut reason = if found.is_empty() {
            String::new()
        } else {
            format!(
                "found {} listed for the purchase in doubt since {}: it is this {} request's \
                 window, already paid for by the kept debit, and served to its drain",
                Reservation::id_list(&found),
                doubt.since,
                rec.status
            )
        };
        let resolved = failure.is_none() && unfound.is_empty() || now >= until;
        let unfound_ids: Vec<&str> = unfound.iter().map(|o| o.id.as_str()).collect();
        let more = match (&failure, resolved) {
            (_, true) if unfound.is_empty() => String::new(),
            (_, true) => format!(
                "nothing from {} was listed up to its end at {until}{}: its debit stays spent, \
                 for a person to check against the bill",
                unfound_ids.join(" + "),
                failure
                    .as_ref()
                    .map(|e| format!(" (the last reconciliation failed: {e})"))
                    .unwrap_or_default()
            ),
            (Some(e), false) => format!(
                "reconciliation of the purchase of {} in doubt since {} failed ({e}); tried \
                 again at {}",
                unfound_ids.join(" + "),
                doubt.since,
                next_reconciliation(now, until)
            ),
            (None, false) => format!(
                "{} not listed yet; reconciled again at {}",
                unfound_ids.join(" + "),
                next_reconciliation(now, until)
            ),
        };
        if !more.is_empty() {
            if !reason.is_empty() {
                reason.push_str("; ");
            }
            reason.push_str(&more);
        }
        for r in &found {
            warn!(alert = "reservation-unrecorded", request_id = %id, reservation_id = %r.id, "{reason}");
        }
        let outbox = found
            .iter()
            .map(|r| {
                announced(
                    Some(rec.team.as_str()),
                    &ReservationUnrecorded::of(id.as_str(), r, reason.clone()),
                )
            })
            .collect();
        if resolved {
            // What the plan never called goes back; what was called stays spent.
            let never_called: i64 = plan
                .offerings
                .iter()
                .filter(|o| !doubt.offering_ids.contains(&o.id))
                .filter(|o| !held.iter().any(|r| is_from(r, o)))
                .map(|o| o.upfront_fee.to_micros_ceil().0)
                .sum();
            let open = rec.open_debit.unwrap_or(MicroUsd(0));
            let kept = MicroUsd((open.0 - never_called).max(0));
            let reason = format!(
                "{}; the purchase in doubt is resolved",
                if reason.is_empty() {
                    &rec.reason
                } else {
                    &reason
                }
            );
            return self
                .resolve_with(
                    &rec,
                    &held,
                    found,
                    Settle::Spend(kept),
                    outbox,
                    reason,
                    cause,
                    now,
                    out,
                )
                .await;
        }
        let mut t = Transition::of(
            &rec,
            rec.status,
            &reason,
            Some(next_reconciliation(now, until)),
            now,
            cause,
        )
        .with_outbox(outbox);
        if !found.is_empty() {
            let all: Vec<Reservation> = held.iter().chain(&found).cloned().collect();
            t = t.with_windows(window::all_records(&all, &rec.windows, now));
            t.reservations = found;
        }
        let w = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &id,
            // (Not the purchase's own `in-doubt`: the request has ended, and this is its
            // hourly reconciliation.)
            decision::written(&w, "reconciling-doubt"),
            reason,
        ));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn resolve(
        &self,
        rec: &RequestRecord,
        held: &[Reservation],
        settle: Settle,
        reason: String,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        self.resolve_with(
            rec,
            held,
            Vec::new(),
            settle,
            Vec::new(),
            reason,
            cause,
            now,
            out,
        )
        .await
    }

    /// Closes the doubt: records `found` as windows, settles the kept debit.
    #[allow(clippy::too_many_arguments)]
    async fn resolve_with(
        &self,
        rec: &RequestRecord,
        held: &[Reservation],
        found: Vec<Reservation>,
        settle: Settle,
        outbox: Vec<crate::ports::OutboundEvent>,
        reason: String,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let mut t = Transition::of(rec, rec.status, &reason, None, now, cause).with_outbox(outbox);
        if !found.is_empty() {
            let all: Vec<Reservation> = held.iter().chain(&found).cloned().collect();
            t = t.with_windows(window::all_records(&all, &rec.windows, now));
            t.reservations = found;
        }
        t.settle = Some(settle);
        t.resolve_doubt = true;
        let w = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&w, "doubt-resolved"),
            reason,
        ));
        Ok(())
    }
}

/// The plan's offerings in doubt: called, and not recorded.
fn pending<'p>(plan: &'p Plan, doubt: &Doubt, held: &[Reservation]) -> Vec<&'p Offering> {
    plan.offerings
        .iter()
        .filter(|o| doubt.offering_ids.contains(&o.id))
        .filter(|o| !held.iter().any(|r| is_from(r, o)))
        .collect()
}

/// Until when a purchase in doubt is reconciled: the latest end of what is in doubt, past
/// which nothing more can be served.
fn reconcile_until(pending: &[&Offering], now: DateTime<Utc>) -> DateTime<Utc> {
    pending.iter().map(|o| o.end()).max().unwrap_or(now)
}

fn next_reconciliation(now: DateTime<Utc>, until: DateTime<Utc>) -> DateTime<Utc> {
    (now + IN_DOUBT_RECONCILE_EVERY).min(until).max(now)
}
