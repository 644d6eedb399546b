//! The exactly-once purchase (ARCHITECTURE §5, §8.6, §8.7): a lease and the debit in one write;
//! a reservation already tagged for the request adopted before anything is bought; each offering
//! bought with the SDK's retries off and recorded under the lease; any doubt reconciled by tag
//! and never bought again while it stands; a stray of ours adopted; what was not bought given
//! back. A takeover of an expired lease reconciles first and debits nothing.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use tracing::warn;

use super::payment::{next_payment_check, payment_check_after};
use super::{Outcome, Protocols};
use crate::decision::{self, Decision};
use crate::domain::events::{self, ReservationUnrecorded, Reserved, ending_events, event_key};
use crate::domain::money::{MicroUsd, Usd};
use crate::domain::naming::{plan_name, resource_tags};
use crate::domain::notices::announced;
use crate::domain::offering::{Offering, Product};
use crate::domain::planner::Plan;
use crate::domain::request::{RequestId, Strategy};
use crate::domain::reservation::Reservation;
use crate::domain::status::RequestStatus;
use crate::domain::time_rules::{IN_DOUBT_WINDOW, PURCHASE_LEAD, search_deadline};
use crate::ports::{
    AsyncSleep, BeginPurchase, BeginPurchaseOutcome, BudgetMonth, CapacityMarket, Cause, Debit,
    Doubt, EventSink, Lease, LeaseWriteOutcome, MarkPurchaseCall, PortError, PurchaseCall,
    PurchaseSpec, RecordReservation, ReleaseUnbought, RequestRecord, Store, Transition,
};

/// Longer than the function's timeout (`PurchaseCapacityFunction` in infra/template.yaml)
/// plus the purchase call's operation timeout (`aws::PURCHASE_OPERATION_TIMEOUT`) plus 5
/// minutes (ARCHITECTURE §8.11): a second worker may take over only when the first, and any
/// call it made, is surely gone. A test reads the template to hold this.
pub const LEASE: Duration = Duration::minutes(15);

/// How often a throttled purchase is tried again within one invocation.
const PURCHASE_ATTEMPTS: u32 = 3;

impl<S: Store, M: CapacityMarket, E: EventSink> Protocols<'_, S, M, E> {
    /// The plan to buy: the request's best candidate, unless none is recorded or it starts too
    /// soon to buy (within [`PURCHASE_LEAD`]), when the request searches again instead.
    pub async fn plan_to_buy(
        &self,
        rec: &RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<Plan>, PortError> {
        let Some(plan) = rec.candidates.first().cloned() else {
            let reason = "no candidate plan is recorded; searching again";
            self.search_again(rec, reason, cause, now, out).await?;
            return Ok(None);
        };
        // An offering too close to its start can no longer be bought.
        if plan.start < now + PURCHASE_LEAD {
            let reason = format!(
                "the chosen offering starts at {}, too soon to buy now; searching again",
                plan.start
            );
            self.search_again(rec, &reason, cause, now, out).await?;
            return Ok(None);
        }
        Ok(Some(plan))
    }

    /// Step 1 of the protocol: the lease and the debit, against the team's monthly cap and
    /// the request's own, in one write; then steps 2-4 ([`Self::execute`]). A plan over a cap,
    /// or a team with none, fails the request with nothing debited.
    pub async fn begin(
        &self,
        rec: &RequestRecord,
        plan: &Plan,
        approver: Option<&str>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = rec.request_id.clone();
        // The budget: the team's monthly cap and the request's own cap, debited with the lease.
        let Some(team_cap) = self.config.team_budgets.cap_for(&rec.team) else {
            return self
                .fail(
                    rec,
                    format!("team {} has no budget configured", rec.team),
                    now,
                    cause,
                    out,
                )
                .await;
        };
        let amount = plan.upfront_fee.to_micros_ceil();
        let lease = Lease {
            token: self.ids.next_id(),
            expires_at: now + LEASE,
        };
        let approved_note = approver
            .map(|a| format!(", approved by {a}"))
            .unwrap_or_default();
        let debit = Debit::of(rec, team_cap, amount, now)
            .within_older_ledger(self.store, rec)
            .await?;
        let begin = BeginPurchase {
            request_id: id.clone(),
            expected_version: rec.version,
            from: rec.status,
            lease: lease.clone(),
            debit: Some(debit),
            // Doubt stands from here (ARCHITECTURE 8.6): a worker that takes over cannot
            // know whether these were bought.
            doubt: Some(Doubt {
                offering_ids: plan
                    .offering_ids()
                    .into_iter()
                    .map(str::to_string)
                    .collect(),
                since: now,
            }),
            reason: format!(
                "buying {}: ${} debited from team {}{approved_note}",
                plan.offering_ids().join(" + "),
                plan.upfront_fee,
                rec.team
            ),
            at: now,
            caused_by: cause.clone(),
            outbox: vec![],
        };
        match self.store.begin_purchase(begin).await? {
            BeginPurchaseOutcome::Acquired { .. } => {
                self.execute(rec, plan, &lease, None, cause, now, out).await
            }
            BeginPurchaseOutcome::OverTeamBudget { spent, cap } => {
                let reason = format!(
                    "team {} budget for {} would be exceeded: spent ${} of ${}, this plan costs ${}",
                    rec.team,
                    BudgetMonth::of(now).0,
                    spent.to_usd(),
                    cap.to_usd(),
                    plan.upfront_fee
                );
                self.fail(rec, reason, now, cause, out).await
            }
            BeginPurchaseOutcome::OverRequestBudget { spent, cap } => {
                let reason = format!(
                    "the request's max_upfront_usd ${} would be exceeded: spent ${}, this plan costs ${}",
                    cap.to_usd(),
                    spent.to_usd(),
                    plan.upfront_fee
                );
                self.fail(rec, reason, now, cause, out).await
            }
            // Boxed: its state would otherwise sit inside every purchase's future.
            BeginPurchaseOutcome::Paused(p) => {
                Box::pin(self.paused(rec, plan, &p, approver, cause, now, out)).await
            }
            BeginPurchaseOutcome::LeaseHeld { until } => {
                out.decisions.push(Decision::new(
                    &id,
                    "waiting",
                    format!("lease held until {until}"),
                ));
                Ok(())
            }
            BeginPurchaseOutcome::Conflict | BeginPurchaseOutcome::DuplicateEvent => {
                out.decisions.push(Decision::new(
                    &id,
                    "skipped",
                    "another worker moved the request on",
                ));
                Ok(())
            }
        }
    }

    /// A worker died holding the lease: take over (no new debit) and go on. What its purchase
    /// calls may have bought ([`doubted`]) is reconciled and never bought again while in
    /// doubt; a purchase that called nothing is released without asking AWS anything once its
    /// plan is too soon to buy (to search again) or past its purchase deadline (to fail). One
    /// that called and cannot be reconciled by then ends in doubt
    /// ([`Self::end_in_doubt`]): nothing stays `Purchasing` past its deadline and the doubt
    /// window (ARCHITECTURE §9.1).
    pub async fn take_over(
        &self,
        rec: RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = rec.request_id.clone();
        let Some(plan) = rec.candidates.first().cloned() else {
            return Ok(());
        };
        let lease = Lease {
            token: self.ids.next_id(),
            expires_at: now + LEASE,
        };
        // A request recorded before doubt was: its purchase began at the latest when the
        // lease it held was taken, a lease ago. That doubt is recorded with the takeover, so
        // a later takeover (this one dying, or ending in doubt) keeps the first beginning
        // instead of deriving a later one from this lease, which would slide the doubt
        // window forward at every takeover and hold the debit for ever.
        let recorded = rec.doubt.clone().unwrap_or_else(|| Doubt {
            offering_ids: plan
                .offering_ids()
                .into_iter()
                .map(str::to_string)
                .collect(),
            since: rec.lease.as_ref().map_or(now, |l| l.expires_at) - LEASE,
        });
        let doubt = doubted(&rec, &recorded);
        let begin = BeginPurchase {
            request_id: id.clone(),
            expected_version: rec.version,
            from: RequestStatus::Purchasing,
            lease: lease.clone(),
            debit: None,
            doubt: rec.doubt.is_none().then(|| recorded.clone()),
            reason: if doubt.is_some() {
                "taking over an expired purchase lease; reconciling first".into()
            } else {
                "taking over an expired purchase lease, under which no purchase call was made"
                    .into()
            },
            at: now,
            caused_by: cause.clone(),
            outbox: vec![],
        };
        match self.store.begin_purchase(begin).await? {
            BeginPurchaseOutcome::Acquired { .. } => {
                out.decisions.push(Decision::new(
                    &id,
                    "took-over",
                    "the previous purchase lease expired",
                ));
                let deadline = purchase_deadline(&rec);
                if doubt.is_none() && (now >= deadline || plan.start < now + PURCHASE_LEAD) {
                    // No lease of this plan called AWS: nothing can have been bought, so
                    // the debit goes back without asking AWS (which may be what failed).
                    let (to, what) = if now < deadline {
                        (
                            RequestStatus::Searching,
                            "its plan starts too soon to buy now, so the request searches again",
                        )
                    } else {
                        (
                            RequestStatus::Failed,
                            "the request is past its purchase deadline",
                        )
                    };
                    let reason = format!(
                        "the purchase of {} stopped before calling AWS (its lease expired at \
                         {}): nothing was bought, the debit is returned, and {what} \
                         (purchase deadline {deadline})",
                        plan.offering_ids().join(" + "),
                        rec.lease.as_ref().map_or(now, |l| l.expires_at),
                    );
                    return self
                        .release(&rec, &lease, to, reason, now, cause, out)
                        .await;
                }
                // Else the purchase goes on: what was called is reconciled, and what no lease
                // called is bought, as its first worker would have.
                let went = self
                    .execute(&rec, &plan, &lease, doubt.as_ref(), cause, now, out)
                    .await;
                match (went, &doubt) {
                    // Past the deadline a purchase that may have bought cannot wait for
                    // reconciliation any longer: it ends in doubt, its debit kept.
                    (Err(e), Some(d)) if now >= deadline => {
                        self.end_in_doubt(&rec, &plan, &lease, d, &e, cause, now, out)
                            .await
                    }
                    (went, _) => went,
                }
            }
            _ => {
                out.decisions.push(Decision::new(
                    &id,
                    "skipped",
                    "another worker took the lease",
                ));
                Ok(())
            }
        }
    }

    /// Steps 2-4 of the protocol, for each offering of the plan in order. `doubt` when taking
    /// over: what the earlier worker was about to buy, which is reconciled and never bought
    /// again while the doubt stands.
    #[allow(clippy::too_many_arguments)]
    async fn execute(
        &self,
        rec: &RequestRecord,
        plan: &Plan,
        lease: &Lease,
        doubt: Option<&Doubt>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let held = self.store.reservations(id).await?;
        // Every training plan recorded for the request took a name, a failed one included:
        // the next plan takes the next attempt's, so buying again after a failed payment
        // does not collide with the old plan's name (aws-reference 9.3).
        let plans_recorded = held
            .iter()
            .filter(|r| matches!(r.product, Product::TrainingPlan { .. }))
            .count();
        // Reservations bought for this request before this plan: a split's kept block when
        // this plan is its replacement segment.
        let mut prior: Vec<Reservation> = held.into_iter().filter(|r| r.state.is_live()).collect();
        let mut recorded: BTreeSet<String> = prior.iter().map(|r| r.id.clone()).collect();
        let mut bought: Vec<(Reservation, bool)> = Vec::new();
        for (i, offering) in plan.offerings.iter().enumerate() {
            let last = i + 1 == plan.offerings.len();
            let plans_bought = bought
                .iter()
                .filter(|(r, _)| matches!(r.product, Product::TrainingPlan { .. }))
                .count();
            let name = plan_name(
                id,
                &self.config.deployment_id,
                u32::try_from(plans_recorded + plans_bought).unwrap_or(u32::MAX),
            );
            let name = name.as_str();
            // Already bought and recorded by an earlier worker (a split's first block, when
            // this worker took over an expired lease): never buy it again.
            if !last && prior.iter().any(|r| is_from(r, offering)) {
                continue;
            }
            // Step 2: adopt a reservation already tagged for this request.
            let Some(existing) = self
                .reconcile(
                    rec,
                    plan,
                    offering,
                    name,
                    lease,
                    (&mut prior, &mut recorded),
                    (&bought, doubt.is_none()),
                    cause,
                    now,
                    out,
                )
                .await?
            else {
                return Ok(());
            };
            let doubted = doubt.filter(|d| d.offering_ids.contains(&offering.id));
            let (reservation, adopted) = match (existing, doubted) {
                (Some(r), _) => (r, true),
                // AWS may have sold it to the earlier worker and not list it yet: never buy
                // it again; while the doubt stands, wait for the listing.
                (None, Some(d)) if now < d.since + IN_DOUBT_WINDOW => {
                    out.decisions.push(Decision::new(
                        id,
                        "in-doubt",
                        format!(
                            "the purchase of {} begun at {} may have happened and is not \
                             listed; nothing is bought again, and the debit stays, while \
                             reconciliation goes on until {}",
                            offering.id,
                            d.since,
                            d.since + IN_DOUBT_WINDOW
                        ),
                    ));
                    return Ok(());
                }
                (None, Some(d)) => {
                    let reason = format!(
                        "reconciled: no reservation from {} is listed {} min after the \
                         purchase begun at {}{}; its debit is returned and the request \
                         searches again",
                        offering.id,
                        (now - d.since).num_minutes(),
                        d.since,
                        if bought.is_empty() && prior.is_empty() {
                            String::new()
                        } else {
                            "; what was bought is kept".to_string()
                        }
                    );
                    return self
                        .release(
                            rec,
                            lease,
                            RequestStatus::Searching,
                            reason,
                            now,
                            cause,
                            out,
                        )
                        .await;
                }
                (None, None) => {
                    // Recorded before the call, under the lease: from here a takeover knows
                    // this offering may have been bought (ARCHITECTURE §9.1).
                    if !self
                        .mark_call(rec, offering, lease, i, cause, now, out)
                        .await?
                    {
                        return Ok(());
                    }
                    match self.buy(rec, offering, name).await {
                        Ok(r) => (r, false),
                        Err(PortError::OutcomeUnknown { message, .. }) => {
                            // Step 4 on doubt: look again right away; AWS may show it already.
                            match self
                                .reconcile(
                                    rec,
                                    plan,
                                    offering,
                                    name,
                                    lease,
                                    (&mut prior, &mut recorded),
                                    // Our own purchase is in doubt now: a stray never replaces it.
                                    (&bought, false),
                                    cause,
                                    now,
                                    out,
                                )
                                .await?
                            {
                                None => return Ok(()),
                                Some(Some(r)) => (r, true),
                                Some(None) => {
                                    out.decisions.push(Decision::new(
                                    id,
                                    "in-doubt",
                                    format!(
                                        "purchase of {} may or may not have happened ({message}); \
                                         the lease holds the debit until reconciliation after {}",
                                        offering.id, lease.expires_at
                                    ),
                                ));
                                    return Ok(());
                                }
                            }
                        }
                        Err(e @ PortError::OfferingGone { .. }) if bought.is_empty() => {
                            return self
                            .release(rec, lease, RequestStatus::Searching, format!(
                                "reconciled: no reservation exists; offering {} has gone ({e}); searching again",
                                offering.id
                            ), now, cause, out)
                            .await;
                        }
                        Err(e @ PortError::Permanent { .. }) if bought.is_empty() => {
                            return self
                            .release(rec, lease, RequestStatus::Failed, format!(
                                "reconciled: no reservation exists; AWS refused the purchase of {}: {e}",
                                offering.id
                            ), now, cause, out)
                            .await;
                        }
                        Err(e @ PortError::OfferingGone { .. }) => {
                            // A split whose later block has gone after an earlier one was bought:
                            // what was bought stays bought (purchases cannot be cancelled) and is
                            // recorded; the unbought part of the debit goes back, and the
                            // search looks for a replacement segment until its deadline.
                            let kept: Vec<String> =
                                bought.iter().map(|(r, _)| r.id.clone()).collect();
                            return self
                            .release(rec, lease, RequestStatus::Searching, format!(
                                "bought {} of the split plan, but the offering {} for its next \
                                 segment has gone ({e}); the bought block is kept (purchases \
                                 cannot be cancelled), the unbought part of the debit is \
                                 returned, and a replacement segment is searched for",
                                kept.join(", "), offering.id
                            ), now, cause, out)
                            .await;
                        }
                        Err(e) => {
                            // AWS answered and sold nothing (throttled past our retries, no
                            // capacity, a transient refusal): the debit goes back now and the
                            // request searches again, so each later attempt checks the
                            // purchase lead and the search deadline afresh instead of retrying
                            // this offering under a held lease forever.
                            let reason = format!(
                                "AWS sold nothing: the purchase of {} failed ({e}){}; the \
                                 debit is returned and the request searches again",
                                offering.id,
                                if bought.is_empty() {
                                    ""
                                } else {
                                    "; what was bought is kept"
                                }
                            );
                            self.release(
                                rec,
                                lease,
                                RequestStatus::Searching,
                                reason,
                                now,
                                cause,
                                out,
                            )
                            .await?;
                            // Throttling is surfaced to the function's error metrics too.
                            return if e.is_retryable() { Err(e) } else { Ok(()) };
                        }
                    }
                }
            };
            let to = if last {
                RequestStatus::Reserved
            } else {
                RequestStatus::Purchasing
            };
            let verb = if adopted { "adopted" } else { "bought" };
            let mut reason = format!(
                "{verb} {} ({} x {} in {}, {} to {}) for ${}",
                reservation.id,
                reservation.instance_count,
                reservation.instance_type,
                reservation.region,
                reservation.start(),
                reservation.end(),
                reservation.upfront_fee
            );
            if last && rec.request.strategy == Strategy::OnDemandFirst {
                // The fall-back from on-demand could only bound the delay; this is the delay.
                let desired = rec.request.window.earliest_start;
                let first = bought
                    .iter()
                    .map(|(r, _)| r.start())
                    .chain([reservation.start()])
                    .min()
                    .unwrap_or(desired);
                reason.push_str(&format!(
                    "; on-demand-first fell back to this reservation, which starts {} min after the desired start {desired}",
                    (first - desired).num_minutes().max(0)
                ));
            }
            let mut reservation = reservation;
            reservation.bought_at = Some(now);
            reservation.payment_check_at = payment_check_after(&reservation, now);
            bought.push((reservation.clone(), adopted));
            // Each reservation is announced once, in the write that records it (review N13):
            // a split's first block even when its later one is never bought, and never again
            // beside a replacement bought after a payment failure.
            let outbox = vec![announced(
                Some(rec.team.as_str()),
                &reserved_event(
                    rec,
                    Some(plan),
                    &bought[bought.len() - 1..],
                    rec.version + 1 + bought.len() as u64,
                ),
            )];
            let w = self
                .store
                .record_reservation(RecordReservation {
                    request_id: id.clone(),
                    lease_token: lease.token.clone(),
                    reservation,
                    to,
                    reason: reason.clone(),
                    // Bought: read again until AWS reports each reservation scheduled. With
                    // every payment already taken (a plan adopted once scheduled), read once
                    // now all the same: a cancellation kept during the purchase (perhaps after
                    // this invocation's read) is answered there, refused (found by the
                    // simulation, seed 4313: it went unanswered to the request's end).
                    next_action_at: if last {
                        next_payment_check(prior.iter().chain(bought.iter().map(|(r, _)| r)), now)
                            .or(Some(now))
                    } else {
                        Some(now)
                    },
                    at: now,
                    caused_by: Cause::new(format!("{}#{}", cause.event_id, i)),
                    outbox,
                    uncapped: None,
                })
                .await?;
            match w {
                LeaseWriteOutcome::Applied { .. } => {
                    out.decisions.push(Decision::new(
                        id,
                        if last { "reserved" } else { verb },
                        reason,
                    ));
                }
                LeaseWriteOutcome::LeaseLost => {
                    // Someone took over: they will find this reservation by its tag.
                    out.decisions.push(Decision::new(
                        id,
                        "lease-lost",
                        format!("{reason}; the lease was taken over, so the new holder records it"),
                    ));
                    return Ok(());
                }
                // (A recorded purchase is never refused for a kept cancellation.)
                LeaseWriteOutcome::DuplicateEvent | LeaseWriteOutcome::CancelKept => return Ok(()),
            }
        }
        Ok(())
    }

    /// Steps 2 and 4 of the protocol: what AWS lists for this request and this deployment.
    /// Each stray (ours, unrecorded, and what no offering of the plan gives) is adopted first
    /// ([`Self::adopt_stray`]). `None`: stop, the request moved on (a stray reserved it in the
    /// plan's place, or the lease was lost); else what buying `offering` gave, if listed.
    #[allow(clippy::too_many_arguments)]
    async fn reconcile(
        &self,
        rec: &RequestRecord,
        plan: &Plan,
        offering: &Offering,
        name: &str,
        lease: &Lease,
        (prior, recorded): (&mut Vec<Reservation>, &mut BTreeSet<String>),
        (bought, unclouded): (&[(Reservation, bool)], bool),
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<Option<Reservation>>, PortError> {
        let (found, strays) = self
            .find_unrecorded(rec, plan, offering, name, recorded)
            .await?;
        for stray in strays {
            // Not while the plan's own purchase is in doubt: that may yet be listed, and the
            // plan's debit must stay for it.
            let in_place =
                unclouded && bought.is_empty() && prior.is_empty() && serves(rec, &stray);
            let id = stray.id.clone();
            if !self
                .adopt_stray(rec, lease, &stray, in_place, cause, now, out)
                .await?
                || in_place
            {
                return Ok(None);
            }
            recorded.insert(id);
            prior.push(stray);
        }
        Ok(Some(found))
    }

    /// ARCHITECTURE §8.6: a live reservation tagged for this request and this deployment and
    /// recorded nowhere is ours and paid for, so it is recorded and its fee debited, past the
    /// caps if need be (an adoption past a cap is announced as `Capacity Reservation
    /// Unrecorded` for a person). `in_place`: it serves the whole request and nothing of the
    /// plan is bought yet, so it reserves the request instead of the plan, whose debit goes
    /// back; otherwise it is kept beside the plan. False when the lease was lost.
    #[allow(clippy::too_many_arguments)]
    async fn adopt_stray(
        &self,
        rec: &RequestRecord,
        lease: &Lease,
        stray: &Reservation,
        in_place: bool,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<bool, PortError> {
        let id = &rec.request_id;
        let fee = stray.upfront_fee.to_micros_ceil();
        let team_cap = self
            .config
            .team_budgets
            .cap_for(&rec.team)
            .unwrap_or(Usd::ZERO);
        let debit = Debit::of(rec, team_cap, fee, now)
            .within_older_ledger(self.store, rec)
            .await?;
        // Whether it lands past a cap, as the ledger and the request stand now, the plan's
        // open debit included (`rec` may be the read from before this lease's debit; a
        // concurrent debit may change it again: the adoption does not depend on it, only the
        // announcement).
        let current = self.store.get_request(id).await?;
        let (spent, open) = current
            .as_ref()
            .map_or((rec.spent, rec.open_debit), |c| (c.spent, c.open_debit));
        let given_back = if in_place {
            open.unwrap_or(MicroUsd(0))
        } else {
            MicroUsd(0)
        };
        let team_after =
            self.store.budget_spent(&debit.team, &debit.month).await?.0 + fee.0 - given_back.0;
        let request_after = spent.0 + fee.0 - given_back.0;
        let mut past = Vec::new();
        if team_after > debit.team_cap.0 {
            past.push(format!("team {}'s monthly cap of ${team_cap}", rec.team));
        }
        if request_after > debit.request_cap.0 {
            past.push(format!(
                "the request's max_upfront_usd of ${}",
                rec.request.budget.max_upfront
            ));
        }
        let what = format!(
            "{} ({} x {} in {}, {} to {}, {}, ${})",
            stray.id,
            stray.instance_count,
            stray.instance_type,
            stray.region,
            stray.start(),
            stray.end(),
            stray.state,
            stray.upfront_fee
        );
        let mut reason = format!(
            "adopted {what}: tagged for request {id} of deployment {} and recorded nowhere, \
             it is ours and paid for, so its fee is debited{}",
            self.config.deployment_id,
            if in_place {
                "; it serves the whole request, so it reserves it in place of the plan, whose \
                 debit is returned"
            } else {
                "; it is kept beside the plan, which is bought as decided"
            }
        );
        if !past.is_empty() {
            reason.push_str(&format!("; the debit goes past {}", past.join(" and ")));
        }
        // Announced as it is recorded, in the plan's place or beside it: it is the request's,
        // paid for and debited (review N13).
        let mut outbox = vec![announced(
            Some(rec.team.as_str()),
            &reserved_event(rec, None, &[(stray.clone(), true)], rec.version + 2),
        )];
        if !past.is_empty() {
            warn!(alert = "reservation-unrecorded", request_id = %id, reservation_id = %stray.id, "{reason}");
            outbox.push(announced(
                Some(rec.team.as_str()),
                &ReservationUnrecorded::of(id.as_str(), stray, reason.clone()),
            ));
        }
        let mut adopted = stray.clone();
        adopted.bought_at = Some(now);
        adopted.payment_check_at = payment_check_after(&adopted, now);
        let w = self
            .store
            .record_reservation(RecordReservation {
                request_id: id.clone(),
                lease_token: lease.token.clone(),
                reservation: adopted.clone(),
                to: if in_place {
                    RequestStatus::Reserved
                } else {
                    RequestStatus::Purchasing
                },
                reason: reason.clone(),
                next_action_at: if in_place {
                    // (As a purchase's last record: read once now when all is paid.)
                    next_payment_check([&adopted].into_iter(), now).or(Some(now))
                } else {
                    Some(lease.expires_at)
                },
                at: now,
                caused_by: Cause::new(format!("{}#stray-{}", cause.event_id, stray.id)),
                outbox,
                uncapped: Some(debit),
            })
            .await?;
        match w {
            LeaseWriteOutcome::Applied { .. } => {
                out.decisions.push(Decision::new(
                    id,
                    if in_place { "reserved" } else { "adopted" },
                    reason,
                ));
                Ok(true)
            }
            LeaseWriteOutcome::LeaseLost
            | LeaseWriteOutcome::DuplicateEvent
            | LeaseWriteOutcome::CancelKept => {
                out.decisions.push(Decision::new(
                    id,
                    "lease-lost",
                    format!("{reason}; the lease was taken over, so the new holder records it"),
                ));
                Ok(false)
            }
        }
    }

    /// A live reservation of this request and this deployment that is what buying `offering`
    /// gives and is not recorded yet, and the strays: ours, unrecorded, and what no offering
    /// of the plan gives (what another offering gives is adopted in its turn). Tags are
    /// matched here, not only by AWS's filter (aws-reference §11.1: tag filters are
    /// undocumented): another request's or another stack's reservation is never adopted
    /// (ARCHITECTURE §8.6, §8.7).
    pub(super) async fn find_unrecorded(
        &self,
        rec: &RequestRecord,
        plan: &Plan,
        offering: &Offering,
        name: &str,
        recorded: &BTreeSet<String>,
    ) -> Result<(Option<Reservation>, Vec<Reservation>), PortError> {
        let id = &rec.request_id;
        let found = self
            .market
            .find_by_request(offering.product, &offering.region, id, name)
            .await?;
        let deployment = self.config.deployment_id.as_str();
        let mut adopt = None;
        let mut unrecorded = Vec::new();
        for r in found {
            if !r.state.is_live() || recorded.contains(&r.id) {
                continue;
            }
            let r = as_named(r, name, offering);
            if !is_ours(&r, id, deployment, offering) {
                tracing::debug!(request_id = %id, reservation_id = %r.id,
                    request_tag = ?r.request_tag, deployment_tag = ?r.deployment_tag,
                    "not ours: another request's or another deployment's reservation");
                continue;
            }
            if adopt.is_none() && is_from(&r, offering) {
                adopt = Some(r);
            } else if !plan.offerings.iter().any(|o| is_from(&r, o)) {
                // (What another offering of this plan gives is adopted in its turn.)
                unrecorded.push(r);
            }
        }
        Ok((adopt, unrecorded))
    }

    /// Records, under the lease, that `offering` is about to be bought; true when the call
    /// may go ahead. An error (a write whose outcome is unknown may have landed) or a lost
    /// lease: no call is made.
    #[allow(clippy::too_many_arguments)]
    async fn mark_call(
        &self,
        rec: &RequestRecord,
        offering: &Offering,
        lease: &Lease,
        i: usize,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<bool, PortError> {
        let w = self
            .store
            .mark_purchase_call(MarkPurchaseCall {
                request_id: rec.request_id.clone(),
                lease_token: lease.token.clone(),
                offering_ids: vec![offering.id.clone()],
                reason: format!(
                    "calling AWS to buy {} (${}); until it is recorded, what it bought is in doubt",
                    offering.id, offering.upfront_fee
                ),
                at: now,
                caused_by: Cause::new(format!("{}#call-{i}", cause.event_id)),
            })
            .await?;
        if matches!(w, LeaseWriteOutcome::Applied { .. }) {
            return Ok(true);
        }
        out.decisions.push(Decision::new(
            &rec.request_id,
            "lease-lost",
            format!(
                "the purchase of {} was not called: the lease was taken over before the call \
                 could be recorded",
                offering.id
            ),
        ));
        Ok(false)
    }

    async fn buy(
        &self,
        rec: &RequestRecord,
        offering: &Offering,
        name: &str,
    ) -> Result<Reservation, PortError> {
        let tags = resource_tags(
            &rec.request.tags,
            &rec.request_id,
            &rec.team,
            &self.config.deployment_id,
        );
        let spec = PurchaseSpec {
            request_id: rec.request_id.clone(),
            plan_name: name.to_string(),
            instance_platform: rec.request.instance_platform().to_string(),
            tags,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.market.purchase(offering, &spec).await {
                // A throttle means AWS did not process the call: retrying it cannot buy twice.
                Err(PortError::Throttled { .. }) if attempt < PURCHASE_ATTEMPTS => {
                    self.sleep
                        .sleep(std::time::Duration::from_millis(200 * (1 << attempt)))
                        .await;
                }
                other => return other,
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn release(
        &self,
        rec: &RequestRecord,
        lease: &Lease,
        to: RequestStatus,
        reason: String,
        now: DateTime<Utc>,
        cause: &Cause,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        // Twice at most: a cancellation kept after our read makes the store refuse the first.
        for _ in 0..2 {
            // What stays spent once the open debit goes back, what was bought and kept (a
            // split's earlier block), and any kept cancellation, as the table has them now.
            let now_rec = self.store.get_request(id).await?;
            let cancel = now_rec.as_ref().and_then(|r| r.cancel.clone());
            // What the request keeps, as the table has it: a split's earlier block, and the
            // strays adopted beside the plan (read only where it can decide the release).
            let held: Vec<Reservation> = if cancel.is_none() && to != RequestStatus::Cancelled {
                self.store
                    .reservations(id)
                    .await?
                    .into_iter()
                    .filter(|r| r.state.is_live())
                    .collect()
            } else {
                Vec::new()
            };
            let (to, reason) = match &cancel {
                Some(c) => (
                    RequestStatus::Cancelled,
                    format!(
                        "{}, kept since {} and applied because the purchase did not complete: \
                         {reason}",
                        c.reason, c.at
                    ),
                ),
                // What it keeps serves it already: searching again would look for 0 hours
                // more (which EC2 refuses), and failing would leave it unused.
                None if to != RequestStatus::Cancelled && rec.is_served_by(&held) => (
                    RequestStatus::Reserved,
                    format!(
                        "{reason}; but what it keeps, {}, already covers its {} h, so the \
                         request is Reserved with it and nothing more is searched for or bought",
                        Reservation::id_list(&held),
                        rec.needed().num_hours()
                    ),
                ),
                None => (to, reason.clone()),
            };
            // (Reserved with what it keeps: each of those was announced when recorded.)
            let mut outbox = vec![];
            if to.is_terminal() {
                // As the table has the request now (Purchasing), without its open debit.
                let now_rec = now_rec.as_ref().unwrap_or(rec);
                let spent = MicroUsd(now_rec.spent.0 - now_rec.open_debit.map_or(0, |d| d.0));
                let (kept, windows) = self.kept(now_rec).await?;
                outbox = ending_events(now_rec, to, &reason, kept, windows, spent);
            }
            let w = self
                .store
                .release_unbought(ReleaseUnbought {
                    request_id: id.clone(),
                    lease_token: lease.token.clone(),
                    to,
                    reason: reason.clone(),
                    next_action_at: match to {
                        RequestStatus::Searching => Some(now),
                        // Bought: read again until AWS reports each reservation scheduled.
                        RequestStatus::Reserved => next_payment_check(held.iter(), now),
                        _ => None,
                    },
                    at: now,
                    caused_by: Cause::new(format!("{}#release", cause.event_id)),
                    outbox,
                })
                .await?;
            let action = match (w, to) {
                (LeaseWriteOutcome::CancelKept, _) => continue,
                (LeaseWriteOutcome::Applied { .. }, RequestStatus::Failed) => "failed",
                (LeaseWriteOutcome::Applied { .. }, RequestStatus::Cancelled) => "cancelled",
                (LeaseWriteOutcome::Applied { .. }, RequestStatus::Reserved) => "reserved",
                (LeaseWriteOutcome::Applied { .. }, _) => "re-search",
                (LeaseWriteOutcome::LeaseLost, _) => "lease-lost",
                (LeaseWriteOutcome::DuplicateEvent, _) => "duplicate",
            };
            out.decisions.push(Decision::new(id, action, reason));
            return Ok(());
        }
        Err(PortError::Transient {
            service: "dynamodb",
            code: "Contended".into(),
            message: format!("{id}: a cancellation kept twice under the release"),
        })
    }

    pub(super) async fn fail(
        &self,
        rec: &RequestRecord,
        reason: String,
        now: DateTime<Utc>,
        cause: &Cause,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let (reservation_ids, kept_windows) = self.kept(rec).await?;
        let ev = events::RequestFailed {
            event_key: event_key(rec.whose(), "failed", rec.version + 1),
            request_id: rec.request_id.to_string(),
            status_before: rec.status,
            reason: reason.clone(),
            reservation_ids,
            spent_usd: rec.spent.to_usd(),
            kept_windows,
        };
        let t = Transition::of(rec, RequestStatus::Failed, &reason, None, now, cause)
            .with_outbox(vec![announced(Some(rec.team.as_str()), &ev)]);
        let w = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&w, "failed"),
            reason,
        ));
        Ok(())
    }
}

/// The last moment the request's purchase may still end well: its search deadline, past
/// which nothing feasible can be bought. A takeover past it ends the purchase (§9.1).
pub fn purchase_deadline(rec: &RequestRecord) -> DateTime<Utc> {
    search_deadline(rec.request.window.latest_end, rec.needed_hours())
}

/// What a takeover must reconcile before buying: the offerings the plan's leases called,
/// from the latest call (ARCHITECTURE §9.1); none when no call was recorded. A record from
/// before the call marker was is in doubt from its lease, as `recorded` says.
pub fn doubted(rec: &RequestRecord, recorded: &Doubt) -> Option<Doubt> {
    match &rec.purchase_call {
        None => Some(recorded.clone()),
        Some(PurchaseCall::None) => None,
        Some(PurchaseCall::Called { at, offering_ids }) => Some(Doubt {
            offering_ids: offering_ids.clone(),
            since: *at,
        }),
    }
}

/// `r` as what buying `offering` gave, when it is the training plan named `name` (the name
/// this purchase gives its plan, `naming::plan_name`) and shows no reserved capacity: the
/// botocore `sagemaker` model lets `ReservedCapacitySummaries` be empty and
/// `TotalInstanceCount` be 0, and what a `Pending` plan returns is unpublished, so the
/// adapter reads such a plan with no instance type and no count (review aws-reality-2,
/// Task 3 #7). The name is this purchase's, so the plan is the one it bought: it takes the
/// offering's type, count and segments (without summaries the adapter knows only the plan's
/// whole span, which would cover a split plan's gap), and is adopted by that name, never
/// kept as a stray of type "" beside a plan bought again. Anything else is as listed.
fn as_named(mut r: Reservation, name: &str, offering: &Offering) -> Reservation {
    let named = matches!(r.product, Product::TrainingPlan { .. })
        && !name.is_empty()
        && r.id
            .rsplit('/')
            .next()
            .is_some_and(|n| n.eq_ignore_ascii_case(name));
    if !named || !(r.instance_type.is_empty() || r.instance_count == 0) {
        return r;
    }
    r.instance_type = offering.instance_type.clone();
    r.instance_count = offering.instance_count;
    r.segments = offering.segments.clone();
    r
}

/// Whether reservation `r` is what buying `offering` gives: same type and count, starting
/// within the hour (AWS may shift a block's start slightly).
pub fn is_from(r: &Reservation, offering: &Offering) -> bool {
    r.instance_type == offering.instance_type
        && r.instance_count == offering.instance_count
        && (r.start() - offering.start()).num_minutes().abs() < 60
}

/// Whether `r`, as AWS lists it, is request `id`'s of deployment `deployment`: tagged for the
/// request, and for the deployment. A block says its deployment by tag; a plan by the hash in
/// its name, which the adapter has matched. A block from before deployments were tagged is
/// ours only if it is exactly what buying `offering` gives. Matched here, client-side, not
/// only by AWS's filter (aws-reference §11.1: tag filters are undocumented), so another
/// request's or another stack's reservation is never taken for ours (ARCHITECTURE §8.6, §8.7).
pub fn is_ours(r: &Reservation, id: &RequestId, deployment: &str, offering: &Offering) -> bool {
    let for_request = r.request_tag.as_deref() == Some(id.as_str());
    let for_deployment = match r.deployment_tag.as_deref() {
        Some(d) => d == deployment,
        None => offering.product != Product::CapacityBlock || is_from(r, offering),
    };
    for_request && for_deployment
}

/// `Capacity Reserved` for `new`, the reservations one write records for the request
/// (bought, or `true`: adopted), keyed by `version`: each reservation is announced once, so
/// the fees of a request's Reserved events sum to what it bought (review N13).
/// `plan`: the plan bought, `None` for a stray adopted.
fn reserved_event(
    rec: &RequestRecord,
    plan: Option<&Plan>,
    new: &[(Reservation, bool)],
    version: u64,
) -> Reserved {
    let fee: Usd = new.iter().map(|(r, _)| r.upfront_fee).sum();
    // The plan's on-demand comparison covers the whole plan: only a plan of one offering is
    // announced whole.
    let on_demand = plan
        .filter(|p| p.offerings.len() == 1)
        .and_then(|p| p.on_demand_cost);
    let first = &new.first().expect("a reservation to announce").0;
    Reserved {
        // A stray's names it: two adopted from one read of the request share the version.
        event_key: event_key(
            rec.whose(),
            &match plan {
                Some(_) => "reserved".to_string(),
                None => format!("reserved-{}", first.id),
            },
            version,
        ),
        request_id: rec.request_id.to_string(),
        reservation_ids: new.iter().map(|(r, _)| r.id.clone()).collect(),
        product: plan.map_or(first.product, |p| p.product),
        region: first.region.clone(),
        instance_type: first.instance_type.clone(),
        instance_count: first.instance_count,
        start: new
            .iter()
            .map(|(r, _)| r.start())
            .min()
            .unwrap_or(first.start()),
        end: new
            .iter()
            .map(|(r, _)| r.end())
            .max()
            .unwrap_or(first.end()),
        upfront_fee_usd: fee,
        on_demand_cost_usd: on_demand,
        saving_usd: on_demand.map(|od| od - fee),
        adopted: new.iter().any(|(_, a)| *a),
    }
}

/// Whether reservation `r` alone serves `rec`: a product, region and type it allows, at
/// least its instances, inside its window and at least what it still needs (its duration,
/// less what a spot run that fell back served).
fn serves(rec: &RequestRecord, r: &Reservation) -> bool {
    rec.request.takes(r) && r.end() - r.start() >= rec.needed()
}

#[cfg(test)]
mod tests {
    use chrono::Duration;

    use super::LEASE;

    #[test]
    fn the_purchase_lease_outlives_the_function_timeout_plus_the_purchase_call_timeout_plus_5_minutes()
     {
        // ARCHITECTURE 8.11: read the deployed timeout from the template, not from a copy of it.
        let template = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/template.yaml"),
        )
        .unwrap();
        let resource = template
            .split("\n  PurchaseCapacityFunction:\n")
            .nth(1)
            .expect("the purchase function in the template");
        let body: String = resource
            .lines()
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .collect::<Vec<_>>()
            .join("\n");
        let timeout: i64 = body
            .lines()
            .find_map(|l| l.trim().strip_prefix("Timeout:"))
            .map(|v| v.trim().parse().unwrap())
            .or_else(|| {
                // Else the Globals' function timeout.
                template
                    .split("\nGlobals:")
                    .nth(1)?
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("Timeout:"))
                    .map(|v| v.trim().parse().unwrap())
            })
            .expect("a timeout for the purchase function");
        let op = Duration::from_std(crate::aws::PURCHASE_OPERATION_TIMEOUT).unwrap();
        let bound = Duration::seconds(timeout) + op + Duration::minutes(5);
        assert!(
            LEASE > bound,
            "lease {LEASE} must outlive {timeout} s + {op} + 5 min"
        );
    }
}
