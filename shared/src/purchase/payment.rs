//! Payment tracking (ARCHITECTURE §8.5): a bought reservation is not paid for until AWS reports
//! it scheduled. Until then it is read again on a schedule; one that AWS lists as failed or
//! cancelled first gives back what AWS did not take, is announced, and the request searches
//! again for what it still needs while its deadline allows, or ends with what it keeps.

use chrono::{DateTime, Duration, Utc};
use tracing::warn;

use super::cancel::Answer;
use super::{Outcome, Protocols};
use crate::decision::{self, Decision};
use crate::domain::events::{CancellationRefused, PaymentFailed, ending_events, event_key};
use crate::domain::money::MicroUsd;
use crate::domain::notices::announced;
use crate::domain::request::Team;
use crate::domain::reservation::Reservation;
use crate::domain::status::RequestStatus;
use crate::domain::time_rules::{LISTING_LAG_BOUND, PAYMENT_CHECK_EVERY, search_deadline};
use crate::domain::window;
use crate::ports::{
    BudgetMonth, CancelNote, CapacityMarket, Cause, EventSink, KeepCancellation, PortError, Refund,
    RequestRecord, Store, Transition, WriteOutcome,
};

impl<S: Store, M: CapacityMarket, E: EventSink> Protocols<'_, S, M, E> {
    /// ARCHITECTURE §8.5, §9.1: a bought reservation is read again until AWS reports it
    /// scheduled or later, whatever its request's status (each reservation has its own next
    /// check). One missing from the answer stays live (the listing lags, by id too); one
    /// whose payment failed gives its debit back and is announced; a request not ended
    /// searches again while its deadline allows, an ended one stays as it is. A request
    /// buying (`Purchasing`) is left to its lease holder and read after.
    pub async fn track(
        &self,
        rec: RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = rec.request_id.clone();
        if rec.status == RequestStatus::Purchasing {
            out.decisions.push(Decision::new(
                &id,
                "waiting",
                "a purchase is under way: its payments are read once it ends",
            ));
            return Ok(());
        }
        let mut held = self.store.reservations(&id).await?;
        let recorded = held.clone();
        // Every reservation read, with its state as AWS reports it and its next check.
        let mut changed: Vec<Reservation> = Vec::new();
        // Those whose ends AWS reports moved (ARCHITECTURE §9.3), as read back.
        let mut moved: Vec<Reservation> = Vec::new();
        let mut notes: Vec<String> = Vec::new();
        let mut lost: Vec<Reservation> = Vec::new();
        for r in held.iter_mut() {
            if !r.state.is_live() || r.state.is_settled() {
                continue;
            }
            match self.market.describe(r.product, &r.region, &r.id).await? {
                Some(seen) if seen.state == r.state => {
                    notes.push(format!("{} is still {}", r.id, r.state));
                    r.payment_check_at = payment_check_after(r, now);
                    changed.push(r.clone());
                }
                Some(seen) => {
                    let was = r.state;
                    r.state = seen.state;
                    if let Some(m) = r.read_back(&seen) {
                        r.segments = m.segments;
                        moved.push(r.clone());
                    }
                    r.payment_check_at = payment_check_after(r, now);
                    if r.state.is_final() {
                        lost.push(r.clone());
                    } else {
                        notes.push(format!("{} went from {was} to {}", r.id, r.state));
                        changed.push(r.clone());
                    }
                }
                None => {
                    let since = r.bought_at.unwrap_or(rec.updated_at);
                    let minutes = (now - since).num_minutes();
                    if now < since + LISTING_LAG_BOUND {
                        notes.push(format!(
                            "{} is not listed yet {minutes} min after its purchase (AWS's \
                             listings lag); it stays {}",
                            r.id, r.state
                        ));
                    } else {
                        // Never read as gone for that: the debit stays, and so does the
                        // reservation, until AWS lists it.
                        warn!(request_id = %id, reservation_id = %r.id, minutes,
                            "a bought reservation is still not listed past the listing-lag bound");
                        notes.push(format!(
                            "{} is still not listed {minutes} min after its purchase, past the \
                             {} min listing-lag bound; it stays {} and its debit is kept",
                            r.id,
                            LISTING_LAG_BOUND.num_minutes(),
                            r.state
                        ));
                    }
                    r.payment_check_at = payment_check_after(r, now);
                    changed.push(r.clone());
                }
            }
        }
        let reserved = rec.status == RequestStatus::Reserved;
        // When to read the reservations again; `None` once every payment is taken.
        let next = next_payment_check(held.iter(), now);
        // A cancellation kept for the payments is answered once every payment is taken,
        // whatever the request became meanwhile: a window that opened first moved it on to
        // Active (or Draining) with the note still on it, and nothing else answers it then
        // (simulation seed 852).
        let windows_course = matches!(
            rec.status,
            RequestStatus::Reserved | RequestStatus::Active | RequestStatus::Draining
        );
        if lost.is_empty()
            && windows_course
            && let (None, Some(c)) = (next, &rec.cancel)
        {
            if c.stop_running {
                return self.stop_when_paid(&rec, &held, c, cause, now, out).await;
            }
            return self.refuse_when_paid(&rec, &held, c, cause, now, out).await;
        }
        if lost.is_empty() && !reserved {
            // The request's own course goes on; only the reservations' records and next
            // checks change.
            let note = if notes.is_empty() {
                "every reservation is scheduled or later".to_string()
            } else {
                notes.join("; ")
            };
            let reason = format!("{}{PAYMENT_NOTE}{note}", reserved_reason(&rec.reason));
            let t = self.ends_read_back(
                Transition::of(&rec, rec.status, &reason, rec.next_action_at, now, cause)
                    .with_reservations(changed, None),
                &rec,
                &recorded,
                &moved,
            );
            let w = self.store.transition(t).await?;
            let paid = next.is_none();
            out.decisions.push(Decision::new(
                &id,
                decision::written(&w, if paid { "paid" } else { "payment-pending" }),
                note,
            ));
            return Ok(());
        }
        if lost.is_empty() {
            let note = if notes.is_empty() {
                "every reservation is scheduled or later".to_string()
            } else {
                notes.join("; ")
            };
            let reason = format!("{}{PAYMENT_NOTE}{note}", reserved_reason(&rec.reason));
            let t = self.ends_read_back(
                Transition::of(&rec, RequestStatus::Reserved, &reason, next, now, cause)
                    .with_reservations(changed, None),
                &rec,
                &recorded,
                &moved,
            );
            let w = self.store.transition(t).await?;
            out.decisions.push(Decision::new(
                &id,
                decision::written(
                    &w,
                    if next.is_some() {
                        "payment-pending"
                    } else {
                        "paid"
                    },
                ),
                note,
            ));
            return Ok(());
        }
        self.payment_failed(rec, held, changed, lost, notes, cause, now, out)
            .await
    }

    /// `t` with what AWS moving the ends of `moved` does to `rec`'s windows (ARCHITECTURE
    /// §9.3): their drain, next action and Ending notices follow the new ends, and each later
    /// end is announced as an extension bought outside capacity-pilot.
    fn ends_read_back(
        &self,
        mut t: Transition,
        rec: &RequestRecord,
        recorded: &[Reservation],
        moved: &[Reservation],
    ) -> Transition {
        if moved.is_empty() {
            return t;
        }
        let m = window::ends_moved(
            recorded,
            &rec.windows,
            moved,
            self.drain_lead(rec),
            window::Reopen::of(rec),
            t.at,
        );
        for said in m.said() {
            t.reason.push_str("; ");
            t.reason.push_str(&said);
        }
        t.outbox.extend(m.announced(rec.whose(), rec.team.as_str()));
        t.windows = Some(m.records);
        t
    }

    /// `lost` went final before it was ever scheduled: give back what AWS did not take, and
    /// search again for what the request still needs while its deadline allows.
    #[allow(clippy::too_many_arguments)]
    async fn payment_failed(
        &self,
        rec: RequestRecord,
        held: Vec<Reservation>,
        changed: Vec<Reservation>,
        lost: Vec<Reservation>,
        mut notes: Vec<String>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let version = rec.version + 1;
        // The ledger each debit went to: its team's key as recorded (before §9.8's lower-cased
        // keys: the request's team as given), and its month.
        let ledger_of = |r: &Reservation| {
            let month = r
                .debit_month
                .clone()
                .map(BudgetMonth)
                .unwrap_or_else(|| BudgetMonth::of(r.bought_at.unwrap_or(rec.updated_at)));
            let team = r
                .debit_team
                .as_deref()
                .and_then(|t| Team::parse(t).ok())
                .unwrap_or_else(|| rec.team.clone());
            (team, month)
        };
        // One refund per write, to one ledger: a loss charged to another (a rare split bought
        // across a month's end) waits for the next check, right after this.
        let ledger = lost.iter().find(|r| r.state.is_unpaid()).map(&ledger_of);
        let (lost, later): (Vec<Reservation>, Vec<Reservation>) = lost
            .into_iter()
            .partition(|r| !r.state.is_unpaid() || Some(ledger_of(r)) == ledger);
        // Not recorded yet: read again, and handled, at the next check.
        for r in &later {
            notes.push(format!(
                "{} is {} too; its debit goes back next",
                r.id, r.state
            ));
        }
        let returned = MicroUsd(
            lost.iter()
                .filter(|r| r.state.is_unpaid())
                .map(|r| r.upfront_fee.to_micros_ceil().0)
                .sum::<i64>()
                .min(rec.spent.0),
        );
        let refund = ledger
            .filter(|_| returned.0 > 0)
            .map(|(team, month)| Refund {
                month,
                amount: returned,
                team: Some(team),
            });
        // What the request still holds: the live ones (a loss is final, never live). The
        // losses left for the next check keep it `Reserved` below whatever it holds (issue
        // 51: counting them here too was read by no branch, a clause no test could fail).
        let others: Vec<&Reservation> = held.iter().filter(|r| r.state.is_live()).collect();
        let deadline = search_deadline(rec.request.window.latest_end, rec.needed_hours());
        let mut what: Vec<String> = Vec::new();
        for l in &lost {
            what.push(if l.state.is_unpaid() {
                format!(
                    "AWS reports {} {} before it was ever scheduled: the payment was not \
                     taken, and its ${} debit is returned to team {}",
                    l.id,
                    l.state,
                    l.upfront_fee.min(returned.to_usd()),
                    rec.team
                )
            } else {
                format!(
                    "AWS reports {} {} before it was ever scheduled: the capacity is lost, \
                     and its ${} debit is kept (AWS does not say the fee was returned)",
                    l.id, l.state, l.upfront_fee
                )
            });
        }
        // A cancellation kept for the payments (only a `Reserved` request's is).
        let kept_cancel = rec
            .cancel
            .as_ref()
            .filter(|_| rec.status == RequestStatus::Reserved);
        let (to, next, then) = if !later.is_empty() {
            // Stay to take the rest at the next check.
            (
                RequestStatus::Reserved,
                Some(now),
                "; the other losses follow".to_string(),
            )
        } else if let Some(c) = kept_cancel.filter(|_| others.is_empty()) {
            // A kept cancellation (§8.3): nothing is bought again.
            (
                RequestStatus::Cancelled,
                None,
                format!("; {}, kept since {}, is applied", c.reason, c.at),
            )
        } else if rec.is_served_by(others.iter().copied()) {
            // What it keeps still serves it (a stray adopted beside the plan): nothing is
            // searched for, which would ask for 0 hours more.
            (
                RequestStatus::Reserved,
                next_payment_check(others.iter().copied(), now),
                format!(
                    "; what it keeps, {}, still covers its {} h, so it stays Reserved",
                    Reservation::id_list(others.iter().copied()),
                    rec.needed().num_hours()
                ),
            )
        } else if now < deadline && kept_cancel.is_none() {
            (
                RequestStatus::Searching,
                Some(now),
                format!("; searching again until {deadline}"),
            )
        } else if !others.is_empty() {
            (
                RequestStatus::Reserved,
                next_payment_check(others.iter().copied(), now),
                format!(
                    "; too late to search again (the deadline was {deadline}); keeping {}",
                    Reservation::id_list(others.iter().copied())
                ),
            )
        } else {
            (
                RequestStatus::Failed,
                None,
                format!("; too late to search again (the deadline was {deadline})"),
            )
        };
        // What that means for a request that is not `Reserved` (ARCHITECTURE §9.1): an ended
        // one stays as it is; one running its windows goes on with what it keeps, or
        // searches again for what it lost; one about to buy plans again.
        let status = rec.status;
        let (to, next, then) = match status {
            RequestStatus::Reserved => (to, next, then),
            s if s.is_terminal() => (
                s,
                rec.next_action_at,
                format!("; the request stays {s}: nothing is bought for an ended request"),
            ),
            RequestStatus::Active | RequestStatus::Draining
                if to != RequestStatus::Searching || !later.is_empty() =>
            {
                (status, rec.next_action_at, format!("; it stays {status}"))
            }
            RequestStatus::Active | RequestStatus::Draining => (to, next, then),
            RequestStatus::OfferingsFound | RequestStatus::AwaitingApproval
                if now < deadline && later.is_empty() =>
            {
                (
                    RequestStatus::Searching,
                    Some(now),
                    format!("; the plan found counted on it: searching again until {deadline}"),
                )
            }
            s => (s, rec.next_action_at, format!("; it stays {s}")),
        };
        // A cancellation kept for these payments is answered by the next check once every
        // payment left is taken: it must come (before, a request that kept others stayed
        // Reserved with no check due, its cancellation never answered).
        let next = match (to, next, kept_cancel) {
            (RequestStatus::Reserved, None, Some(_)) => Some(now),
            _ => next,
        };
        let mut reason = format!("{}{then}", what.join("; "));
        if to == status && status != RequestStatus::Reserved {
            reason = format!("{}{PAYMENT_NOTE}{reason}", reserved_reason(&rec.reason));
        }
        if !notes.is_empty() {
            reason.push_str(&format!(" ({})", notes.join("; ")));
        }
        let mut outbox = Vec::new();
        for (i, l) in lost.iter().filter(|l| l.state.is_unpaid()).enumerate() {
            outbox.push(announced(
                Some(rec.team.as_str()),
                &PaymentFailed {
                    event_key: event_key(
                        rec.whose(),
                        &if i == 0 {
                            "payment-failed".to_string()
                        } else {
                            format!("payment-failed-{i}")
                        },
                        version,
                    ),
                    request_id: id.to_string(),
                    reservation_id: l.id.clone(),
                    product: l.product,
                    region: l.region.clone(),
                    state: l.state,
                    upfront_fee_usd: l.upfront_fee,
                    returned_usd: l.upfront_fee.min(returned.to_usd()),
                    searching_again: to == RequestStatus::Searching,
                    reason: reason.clone(),
                },
            ));
        }
        if to.is_terminal() && !status.is_terminal() {
            // What is kept: the live ones (a lost one's debit went back above; a loss is
            // final, never live).
            let kept = held
                .iter()
                .filter(|r| r.state.is_live())
                .map(|r| r.id.clone())
                .collect();
            // Every undrained window left. A reservation lost here never launched a window,
            // so none of its windows is listed (issue 51: the filter that left the lost ones
            // out changed nothing, and no test could fail a mutant of it).
            let windows = window::kept(&held, &rec.windows, self.drain_lead(&rec));
            outbox.extend(ending_events(
                &rec,
                to,
                &reason,
                kept,
                windows,
                MicroUsd(rec.spent.0 - returned.0),
            ));
        }
        // Their windows never opened: nothing to launch, drain or clean up in them.
        let mut windows = rec.windows.clone();
        for l in &lost {
            windows = window::records_lost(&windows, &l.id, now);
        }
        let mut updates = changed;
        updates.extend(lost);
        let t = Transition::of(&rec, to, &reason, next, now, cause)
            .with_reservations(updates, refund)
            .with_windows(windows)
            .with_outbox(outbox);
        let w = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            id,
            decision::written(&w, "payment-failed"),
            reason,
        ));
        Ok(())
    }
}

impl<S: Store, M: CapacityMarket, E: EventSink> Protocols<'_, S, M, E> {
    /// A kept cancellation without `stop_running` once every payment is taken: it can no
    /// longer be applied, and is refused with the windows that run on. It is answered first;
    /// the next check records the states.
    async fn refuse_when_paid(
        &self,
        rec: &RequestRecord,
        held: &[Reservation],
        c: &CancelNote,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let why = format!(
            "cancellation refused: every reservation is paid for and scheduled, and \
             purchases cannot be undone (the cancellation was kept since {})",
            c.at
        );
        let kept_windows = window::kept(held, &rec.windows, self.drain_lead(rec));
        let why = format!(
            "{why}; its paid windows run on to their drain ({}): a cancellation with \
             stop_running: true stops them",
            window::describe(&kept_windows)
        );
        let refused = CancellationRefused {
            event_key: format!("{id}:cancellation-refused:{}", c.event_id),
            request_id: id.to_string(),
            status: Some(rec.status),
            reason: why.clone(),
            kept_windows,
        };
        let k = KeepCancellation {
            request_id: id.clone(),
            expected_version: rec.version,
            status: rec.status,
            note: None,
            reason: format!("{}; {why}", reserved_reason(&rec.reason)),
            // A Reserved request's next check records the states at once; a request whose
            // window opened keeps its own course (its reservations' checks are due).
            next_action_at: if rec.status == RequestStatus::Reserved {
                Some(now)
            } else {
                rec.next_action_at
            },
            at: now,
            caused_by: Cause::new(format!("{}#cancel-refused", cause.event_id)),
            outbox: vec![announced(Some(rec.team.as_str()), &refused)],
        };
        let w = self.store.keep_cancellation(k).await?;
        out.decisions.push(Decision::new(
            id,
            decision::written(&w, "cancel-refused"),
            why,
        ));
        Ok(())
    }

    /// A cancellation with `stop_running` kept until the payment was taken (§8.3, §9.1):
    /// what was bought cannot be undone, so it is applied by stopping the request's windows
    /// through the ordinary drain, answered with what it stopped, and then cleared.
    async fn stop_when_paid(
        &self,
        rec: &RequestRecord,
        held: &[Reservation],
        c: &CancelNote,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let all = window::windows(held, &rec.windows, self.drain_lead(rec));
        let stop = window::undrained_of(&all);
        let reason = format!(
            "{}, kept since {} until the payment was taken, is applied",
            c.reason, c.at
        );
        let answer = Answer {
            reason: &reason,
            status_before: c.found.unwrap_or(rec.status),
            stopped_before: &c.stopped,
        };
        let w = self
            .stop_windows(rec, &all, &stop, Some(answer), cause, now, out)
            .await?;
        if !matches!(w, WriteOutcome::Applied { .. }) {
            return Ok(());
        }
        // Answered: the note goes (a crash before this leaves it on a request whose windows
        // drain; nothing reads a note on a request without a purchase or run under way).
        let Some(now_rec) = self.store.get_request(&rec.request_id).await? else {
            return Ok(());
        };
        let k = KeepCancellation {
            request_id: now_rec.request_id.clone(),
            expected_version: now_rec.version,
            status: now_rec.status,
            note: None,
            reason: now_rec.reason.clone(),
            next_action_at: now_rec.next_action_at,
            at: now,
            caused_by: Cause::new(format!("{}#cancel-answered", cause.event_id)),
            outbox: vec![],
        };
        if !now_rec.status.is_terminal() {
            self.store.keep_cancellation(k).await?;
        }
        Ok(())
    }
}

/// Where the payment checks' note starts in a `Reserved` request's reason.
const PAYMENT_NOTE: &str = "; payment: ";

/// A `Reserved` request's reason without its last payment note.
fn reserved_reason(reason: &str) -> &str {
    reason.split(PAYMENT_NOTE).next().unwrap_or(reason)
}

/// When to read the request's reservations again: the earliest of their own next checks
/// ([`payment_check_after`]); none once each is scheduled or later (or final).
pub(crate) fn next_payment_check<'a>(
    held: impl Iterator<Item = &'a Reservation>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    held.filter_map(|r| payment_check_after(r, now)).min()
}

/// When to read `r`'s payment again after a read at `now` (ARCHITECTURE §9.1): none once it
/// is scheduled or later (or final); else every [`PAYMENT_CHECK_EVERY`], and once more just
/// before it starts, so a failure is seen before its window would open.
pub(crate) fn payment_check_after(r: &Reservation, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if !r.state.is_live() || r.state.is_settled() {
        return None;
    }
    let before_start = r.start() - Duration::minutes(5);
    Some(if before_start > now {
        (now + PAYMENT_CHECK_EVERY).min(before_start)
    } else {
        now + PAYMENT_CHECK_EVERY
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::reservation::ReservationState;
    use crate::fakes::fixtures::block_starting as starting;
    use chrono::TimeZone;

    #[test]
    fn a_payment_is_read_every_ten_minutes_and_once_more_five_minutes_before_its_start() {
        let now = Utc.with_ymd_and_hms(2026, 12, 5, 10, 0, 0).unwrap();
        let pending = ReservationState::PaymentPending;
        // Far from its start: ten minutes on.
        let far = starting(now + Duration::days(2), pending);
        assert_eq!(
            payment_check_after(&far, now),
            Some(now + PAYMENT_CHECK_EVERY)
        );
        // Starting in 7 minutes: 5 minutes before it starts, so a failure is seen first.
        let near = starting(now + Duration::minutes(7), pending);
        assert_eq!(
            payment_check_after(&near, now),
            Some(now + Duration::minutes(2))
        );
        // Started: ten minutes on, until AWS settles it.
        let started = starting(now - Duration::minutes(1), pending);
        assert_eq!(
            payment_check_after(&started, now),
            Some(now + PAYMENT_CHECK_EVERY)
        );
        // Settled or final: none; and the request's next check is the earliest of its own.
        let paid = starting(now + Duration::days(2), ReservationState::Scheduled);
        assert_eq!(payment_check_after(&paid, now), None);
        assert_eq!(
            next_payment_check([&paid, &far, &near].into_iter(), now),
            Some(now + Duration::minutes(2))
        );
    }
}
