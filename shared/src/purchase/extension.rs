//! Extensions, bought exactly once and within budget (ARCHITECTURE §9.3, §8.2, §8.6): a
//! reservation's extension is a purchase with the purchase protocol's guarantees.
//!
//! - **Asked** by the team (`Capacity Extension Requested`) or by the request's policy
//!   (`extend.when: workload-running`); refused, with `Capacity Extension Failed` and the
//!   reason, past the payment lead (`EXTENSION_PAYMENT_LEAD_MINUTES` before the drain), past
//!   `extend.max_hours` or `extend.max_upfront_usd`, or when AWS offers none.
//! - **Priced** from AWS's offering (`Capacity Extension Offered`), and **approved** when the
//!   request's spend with its fee passes the approval threshold (`Capacity Extension Awaiting
//!   Approval`, its own key; an approval after the payment lead is refused).
//! - **Leased and debited** in one write of the request's version, refused while purchases
//!   are paused; the extension's record on its reservation holds the lease, the debit and the
//!   time its doubt began.
//! - **Marked** (`called_at`, the `purchase_call` marker) by a second write before AWS is
//!   called, once: a takeover of an unmarked lease calls again; of a marked one, reconciles.
//! - **Reconciled** from AWS's extension history: while in doubt, an extension of the
//!   reservation listed since the doubt began and not recorded is ours (adopted, its debit
//!   kept); none after [`IN_DOUBT_WINDOW`] (longer than the listing lag's bound): it was not
//!   bought, and the debit goes back.
//! - **Paid**, or not: read until AWS reports the payment; a paid extension moves the
//!   window's end, drain and notices (`Capacity Reservation Extended {external: false}`); a
//!   failed one gives its debit back (`Capacity Extension Failed`) and the reservation keeps
//!   its end. A pending one never holds the drain back.

use chrono::{DateTime, Duration, Utc};

use super::{Outcome, Protocols};
use crate::decision::{self, Decision};
use crate::domain::events::{
    ApprovalRefused, ExtensionAwaitingApproval, ExtensionFailed, ExtensionOffered,
    ExtensionSummary, PurchaseDecision,
};
use crate::domain::extension::ExtendWhen;
use crate::domain::extension::{
    Asked, Extension, ExtensionOffer, ExtensionPayment, ExtensionSeen, ExtensionState, LEASE,
    PAYMENT_READ_EVERY, hours_problem, used,
};
use crate::domain::money::MicroUsd;
use crate::domain::notices::announced;
use crate::domain::request::{Team, WorkloadKind};
use crate::domain::reservation::{Reservation, ReservationState};
use crate::domain::status::RequestStatus;
use crate::domain::time_rules::IN_DOUBT_WINDOW;
use crate::domain::window::{self, Window, WindowState};
use crate::outbox;
use crate::ports::{
    AsyncSleep, BudgetMonth, CapacityMarket, Cause, Debit, EventSink, InstanceFilter,
    InstanceState, JobState, OutboundEvent, PortError, Refund, RequestRecord, Store, Transition,
    Workloads, WriteOutcome,
};

/// How often one invocation re-reads the request and tries a step again after another
/// writer moved it (a window's notice, a launch) between its read and its write.
const WRITE_ATTEMPTS: u32 = 4;

/// How often a look at an extension in doubt that finds nothing is repeated.
const RECONCILE_EVERY: Duration = Duration::minutes(5);

/// What one extension write does besides recording the extension.
#[derive(Default)]
struct Effects {
    debit: Option<Debit>,
    refund: Option<Refund>,
    outbox: Vec<OutboundEvent>,
    /// The reservation's end moved (a payment taken): windows and the moved reservation.
    moved: Option<window::EndsMoved>,
    unpaused: bool,
}

/// `<request>:window-<w>:extension-<n>:<what><salt>`: one key per extension and event.
fn key(rec: &RequestRecord, window: u32, number: u32, what: &str) -> String {
    format!(
        "{}:window-{window}:extension-{number}:{what}{}",
        rec.request_id,
        rec.whose().salt()
    )
}

/// The window that ends with reservation `r`: its last.
fn last_window<'a>(windows: &'a [Window], r: &Reservation) -> Option<&'a Window> {
    windows
        .iter()
        .filter(|w| w.reservation.id == r.id && w.last_of_reservation)
        .max_by_key(|w| w.end())
}

/// `Capacity Extension Failed` for an ask refused before anything was priced or debited,
/// keyed by the asking event.
fn refused(rec: &RequestRecord, hours: u32, why: &str, cause: &Cause) -> OutboundEvent {
    announced(
        Some(rec.team.as_str()),
        &ExtensionFailed {
            event_key: format!(
                "{}:extension-refused:{}{}",
                rec.request_id,
                cause.event_id,
                rec.whose().salt()
            ),
            request_id: rec.request_id.to_string(),
            extension: None,
            hours,
            reason: why.to_string(),
            returned_usd: Default::default(),
        },
    )
}

/// The ledger extension `e`'s debit was charged to (the request's team and this month when
/// it does not say): where a refund or an adjustment of it goes.
fn ledger(rec: &RequestRecord, e: &Extension, now: DateTime<Utc>) -> (Team, BudgetMonth) {
    (
        e.debit_team
            .as_deref()
            .and_then(|t| Team::parse(t).ok())
            .unwrap_or_else(|| rec.team.ledger()),
        BudgetMonth(
            e.debit_month
                .clone()
                .unwrap_or_else(|| BudgetMonth::of(now).0),
        ),
    )
}

fn summary(r: &Reservation, w: u32, e: &Extension) -> ExtensionSummary {
    ExtensionSummary {
        extension: e.number,
        reservation_id: r.id.clone(),
        product: r.product,
        region: r.region.clone(),
        window: w,
        offering_id: e.offer.offering_id.clone(),
        hours: e.offer.hours,
        ends_at: e.offer.starts_at,
        extended_ends_at: e.offer.ends_at,
        upfront_fee_usd: e.offer.fee,
        asked_by: e.asked.as_str().to_string(),
    }
}

impl<S: Store, M: CapacityMarket, E: EventSink> Protocols<'_, S, M, E> {
    /// The payment lead: an extension is bought no later than this before its window's drain.
    pub fn extension_lead(&self) -> Duration {
        self.config.extension_payment_lead()
    }

    /// Request `rec`'s windows, from its reservations as recorded.
    async fn windows_of(
        &self,
        rec: &RequestRecord,
    ) -> Result<(Vec<Reservation>, Vec<Window>), PortError> {
        let held = self.store.reservations(&rec.request_id).await?;
        let windows = window::windows(&held, &rec.windows, self.drain_lead(rec));
        Ok((held, windows))
    }

    /// An ask to extend `rec`'s reservation (`reservation_id`, or the one whose window ends
    /// last among those not drained) by `hours`: refused with its reason, or priced and then
    /// bought or put to an approver. A second delivery of the asking event does nothing.
    #[allow(clippy::too_many_arguments)]
    pub async fn ask_extension(
        &self,
        rec: RequestRecord,
        reservation_id: Option<&str>,
        hours: u32,
        asked: Asked,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = rec.request_id.clone();
        if let Asked::Requested { .. } = asked
            && self.applied_already(&id, cause).await?
        {
            out.decisions.push(Decision::new(
                &id,
                "duplicate",
                format!("extension ask {} was applied already", cause.event_id),
            ));
            return Ok(());
        }
        let mut rec = rec;
        for _ in 0..WRITE_ATTEMPTS {
            match self
                .ask_once(&rec, reservation_id, hours, &asked, cause, now, out)
                .await?
            {
                Some(w) if !matches!(w, WriteOutcome::Conflict) => return Ok(()),
                None => return Ok(()),
                Some(_) => {}
            }
            match self.store.get_request(&id).await? {
                Some(fresh) => rec = fresh,
                None => return Ok(()),
            }
        }
        out.decisions.push(Decision::new(
            &id,
            "skipped",
            "the request kept changing under the extension ask; the next look tries again",
        ));
        Err(PortError::Transient {
            service: "capacity-pilot",
            code: "Conflict".into(),
            message: format!("{id}: the extension ask lost every write race"),
        })
    }

    /// One attempt of [`Self::ask_extension`]: `Some(Conflict)` when another writer moved the
    /// request first.
    #[allow(clippy::too_many_arguments)]
    async fn ask_once(
        &self,
        rec: &RequestRecord,
        reservation_id: Option<&str>,
        hours: u32,
        asked: &Asked,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<WriteOutcome>, PortError> {
        let Some(policy) = rec.request.extend.clone() else {
            return self
                .refuse_ask(
                    rec,
                    hours,
                    "the request has no extend policy: it was submitted without `extend`, so \
                     none of its reservations is extended"
                        .into(),
                    cause,
                    now,
                    out,
                )
                .await
                .map(Some);
        };
        if rec.status == RequestStatus::Purchasing {
            // A purchase's lease owns the request's writes until it ends (minutes): answered
            // at once, nothing written.
            let why = "a purchase of the request is under way (a later segment or a \
                       replacement): ask again once it is recorded, in a few minutes";
            outbox::publish_now(self.events, &[refused(rec, hours, why, cause)]).await?;
            out.decisions.push(Decision::new(
                &rec.request_id,
                "extension-refused",
                format!("extension by {hours} h refused: {why}"),
            ));
            return Ok(None);
        }
        let (held, windows) = self.windows_of(rec).await?;
        let extendable = |r: &&Reservation| {
            r.product.is_reservation()
                && r.state.is_live()
                && last_window(&windows, r).is_some_and(|w| w.state.is_undrained())
        };
        let r = match reservation_id {
            Some(rid) => held.iter().find(|r| r.id == rid).filter(extendable),
            None => held.iter().filter(extendable).max_by_key(|r| r.end()),
        };
        let Some(r) = r else {
            let why = match reservation_id {
                Some(rid) => format!(
                    "{rid} is not a reservation of the request whose last window is still to \
                     run (none such is recorded, or its window drains or ended already)"
                ),
                None => "the request holds no reservation whose last window is still to run \
                         (nothing bought yet, or every window drains or ended already)"
                    .into(),
            };
            return self
                .refuse_ask(rec, hours, why, cause, now, out)
                .await
                .map(Some);
        };
        let w = last_window(&windows, r).expect("extendable has a last window");
        let buy_by = w.drain_at - self.extension_lead();
        let (used_hours, used_fee) = used(held.iter().flat_map(|h| h.extensions.iter()));
        let problem = if !matches!(
            r.state,
            ReservationState::Scheduled | ReservationState::Active
        ) {
            Some(format!(
                "{} is {}: AWS extends a block or plan only once it is scheduled or active \
                 (paid for); ask again once it is",
                r.id, r.state
            ))
        } else if let Some(open) = r.open_extension() {
            Some(format!(
                "extension {} of {} is still {} (AWS takes one at a time)",
                open.number,
                r.id,
                open.state.as_str()
            ))
        } else if now > buy_by {
            Some(format!(
                "past the payment lead: an extension of {} had to be bought by {buy_by}, {} \
                 before window {}'s drain at {}, so that AWS's payment (up to 12 hours) clears \
                 before it",
                r.id,
                lead_words(self.extension_lead()),
                w.number,
                w.drain_at
            ))
        } else if let Some(p) = hours_problem(hours) {
            Some(p)
        } else if used_hours + hours > policy.max_hours {
            Some(format!(
                "over extend.max_hours: {hours} h on top of the {used_hours} h extended so far \
                 is more than {}",
                policy.max_hours
            ))
        } else {
            None
        };
        if let Some(why) = problem {
            return self
                .refuse_ask(rec, hours, why, cause, now, out)
                .await
                .map(Some);
        }
        let offers = match self.market.extension_offers(r, hours).await {
            Ok(offers) => offers,
            // AWS refuses to offer one (its state, a payment pending, its rules): said as
            // such; a failure that may pass is retried by the caller.
            Err(e @ (PortError::Permanent { .. } | PortError::OfferingGone { .. })) => {
                return self
                    .refuse_ask(
                        rec,
                        hours,
                        format!("AWS offers no extension of {}: {e}", r.id),
                        cause,
                        now,
                        out,
                    )
                    .await
                    .map(Some);
            }
            Err(e) => return Err(e),
        };
        let Some(offer) = offers
            .into_iter()
            .filter(|o| o.hours == hours)
            .min_by(|a, b| a.fee.cmp(&b.fee).then(a.offering_id.cmp(&b.offering_id)))
        else {
            return self
                .refuse_ask(
                    rec,
                    hours,
                    format!(
                        "AWS offers no extension of {} by {hours} h (no capacity after its \
                         end, or it is not active or scheduled, or not between 56 days and 1 \
                         hour before its end)",
                        r.id
                    ),
                    cause,
                    now,
                    out,
                )
                .await
                .map(Some);
        };
        let max_fee = policy.max_upfront_usd.to_micros_ceil();
        let fee = offer.fee.to_micros_ceil();
        if used_fee.0 + fee.0 > max_fee.0 {
            return self
                .refuse_ask(
                    rec,
                    hours,
                    format!(
                        "over extend.max_upfront_usd: ${} on top of the ${} spent on extensions \
                         so far is more than ${}",
                        offer.fee,
                        used_fee.to_usd(),
                        policy.max_upfront_usd
                    ),
                    cause,
                    now,
                    out,
                )
                .await
                .map(Some);
        }
        let threshold = self.config.approval_threshold(&rec.request);
        let needs_approval =
            threshold.is_some_and(|limit| rec.spent.0 + fee.0 > limit.to_micros_ceil().0);
        let mut e = Extension {
            number: u32::try_from(r.extensions.len()).unwrap_or(u32::MAX - 1) + 1,
            asked: asked.clone(),
            asked_at: now,
            offer,
            state: ExtensionState::Buying,
            reason: String::new(),
            buy_by,
            check_at: None,
            lease_token: None,
            lease_until: None,
            called_at: None,
            doubt_since: None,
            approval_key: None,
            approved_by: None,
            debited: MicroUsd(0),
            debit_team: None,
            debit_month: None,
        };
        let offered = ExtensionOffered {
            event_key: key(rec, w.number, e.number, "offered"),
            request_id: rec.request_id.to_string(),
            extension: summary(r, w.number, &e),
            needs_approval,
            buy_by,
        };
        let team = rec.team.as_str();
        if needs_approval {
            let limit = threshold.unwrap_or_default();
            if !self.config.approvals_enabled {
                return self
                    .refuse_ask(
                        rec,
                        hours,
                        format!(
                            "its fee of ${} takes the request above its approval threshold of \
                             ${limit}, and this deployment has no approvers \
                             (ApproverPrincipals is empty)",
                            e.offer.fee
                        ),
                        cause,
                        now,
                        out,
                    )
                    .await
                    .map(Some);
            }
            let asking = ExtensionAwaitingApproval {
                event_key: key(rec, w.number, e.number, "awaiting-approval"),
                request_id: rec.request_id.to_string(),
                team: team.to_string(),
                extension: summary(r, w.number, &e),
                approval_above_usd: limit,
                spent_usd: rec.spent.to_usd(),
                buy_by,
            };
            e.state = ExtensionState::AwaitingApproval;
            e.approval_key = Some(asking.event_key.clone());
            e.check_at = Some(buy_by);
            e.reason = format!(
                "${} with the ${} spent is above the approval threshold ${limit}; waiting for \
                 an approver until {buy_by}",
                e.offer.fee,
                rec.spent.to_usd()
            );
            let reason = format!("extension {} of {}: {}", e.number, r.id, e.reason);
            let w = self
                .write(
                    rec,
                    r,
                    e,
                    &reason,
                    Effects {
                        outbox: vec![
                            announced(Some(team), &offered),
                            announced(Some(team), &asking),
                        ],
                        ..Effects::default()
                    },
                    &cause.step("extension-ask"),
                    now,
                )
                .await?;
            out.decisions.push(Decision::new(
                &rec.request_id,
                decision::written(&w, "extension-awaiting-approval"),
                reason,
            ));
            return Ok(Some(w));
        }
        self.lease_and_buy(
            rec,
            r,
            e,
            vec![announced(Some(team), &offered)],
            cause,
            now,
            out,
        )
        .await
        .map(Some)
    }

    /// An ask refused before anything was priced or debited: `Capacity Extension Failed`, the
    /// reason in the request's history.
    async fn refuse_ask(
        &self,
        rec: &RequestRecord,
        hours: u32,
        why: String,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<WriteOutcome, PortError> {
        let reason = format!("extension by {hours} h refused: {why}");
        let t = Transition::of(rec, rec.status, &reason, rec.next_action_at, now, cause)
            .with_outbox(vec![refused(rec, hours, &why, cause)]);
        let w = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&w, "extension-refused"),
            reason,
        ));
        Ok(w)
    }

    /// One write of the request at its version: reservation `r` with extension `e` (its
    /// record replaced, or added), and `fx`.
    #[allow(clippy::too_many_arguments)]
    async fn write(
        &self,
        rec: &RequestRecord,
        r: &Reservation,
        e: Extension,
        reason: &str,
        fx: Effects,
        cause: &Cause,
        now: DateTime<Utc>,
    ) -> Result<WriteOutcome, PortError> {
        let mut r = r.clone();
        match r.extensions.iter_mut().find(|x| x.number == e.number) {
            Some(x) => *x = e,
            None => r.extensions.push(e),
        }
        let mut t = Transition::of(rec, rec.status, reason, rec.next_action_at, now, cause)
            .with_outbox(fx.outbox);
        let mut reservations = vec![r.clone()];
        if let Some(m) = fx.moved {
            // The moved reservation as AWS reports it, with this extension's record.
            reservations = m
                .reservations
                .into_iter()
                .filter(|x| x.id == r.id)
                .map(|mut x| {
                    x.extensions = r.extensions.clone();
                    x
                })
                .collect();
            t = t.with_windows(m.records);
        }
        t.reservations = reservations;
        t.refund = fx.refund;
        t.debit = fx.debit;
        t.unpaused = fx.unpaused;
        self.store.transition(t).await
    }

    /// Takes the extension's lease with its debit (one write, refused while purchases are
    /// paused), marks the call, and buys.
    #[allow(clippy::too_many_arguments)]
    async fn lease_and_buy(
        &self,
        rec: &RequestRecord,
        r: &Reservation,
        mut e: Extension,
        outbox: Vec<OutboundEvent>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<WriteOutcome, PortError> {
        let id = &rec.request_id;
        let Some(team_cap) = self.config.team_budgets.cap_for(&rec.team) else {
            return self
                .fail_extension(
                    rec,
                    r,
                    e,
                    format!("team {} has no budget configured", rec.team),
                    outbox,
                    cause,
                    now,
                    out,
                )
                .await;
        };
        let fee = e.offer.fee.to_micros_ceil();
        let mut debit = Debit::of(rec, team_cap, fee, now)
            .within_older_ledger(self.store, rec)
            .await?;
        // An extension's own cap is on top of the request's: `extend.max_upfront_usd` was
        // checked against what the extensions spent, this is on the request's whole spend.
        debit.request_cap = MicroUsd(
            debit.request_cap.0
                + rec
                    .request
                    .extend
                    .as_ref()
                    .map_or(0, |p| p.max_upfront_usd.to_micros_ceil().0),
        );
        let first = e.lease_token.is_none() && e.debited.0 == 0;
        e.state = ExtensionState::Buying;
        e.lease_token = Some(self.ids.next_id());
        e.lease_until = Some(now + LEASE);
        e.check_at = e.lease_until;
        e.doubt_since = e.doubt_since.or(Some(now));
        if first {
            e.debited = fee;
            e.debit_team = Some(debit.team.to_string());
            e.debit_month = Some(debit.month.0.clone());
        }
        e.reason = format!(
            "buying {}: ${} debited from team {}{}",
            e.offer.offering_id,
            e.offer.fee,
            rec.team,
            e.approved_by
                .as_deref()
                .map(|a| format!(", approved by {a}"))
                .unwrap_or_default()
        );
        let reason = format!("extension {} of {}: {}", e.number, r.id, e.reason);
        let step = cause.step(&format!("extension-{}-{}-lease", r.id, e.number));
        let w = self
            .write(
                rec,
                r,
                e.clone(),
                &reason,
                Effects {
                    debit: first.then_some(debit),
                    outbox: outbox.clone(),
                    unpaused: true,
                    ..Effects::default()
                },
                &step,
                now,
            )
            .await?;
        match &w {
            WriteOutcome::Applied { .. } => {}
            WriteOutcome::OverTeamBudget { spent, cap } => {
                let why = format!(
                    "its fee of ${} is over team {}'s monthly cap: ${} spent of ${}",
                    e.offer.fee,
                    rec.team,
                    spent.to_usd(),
                    cap.to_usd()
                );
                e.debited = MicroUsd(0);
                return self
                    .fail_extension(rec, r, e, why, outbox, cause, now, out)
                    .await;
            }
            WriteOutcome::OverRequestBudget { spent, cap } => {
                let why = format!(
                    "its fee of ${} is over the request's budget with its extensions: ${} \
                     spent of ${}",
                    e.offer.fee,
                    spent.to_usd(),
                    cap.to_usd()
                );
                e.debited = MicroUsd(0);
                return self
                    .fail_extension(rec, r, e, why, outbox, cause, now, out)
                    .await;
            }
            WriteOutcome::Paused(p) => {
                let why = format!(
                    "purchases are paused ({}); nothing was bought; ask again once they resume",
                    p.describe()
                );
                e.debited = MicroUsd(0);
                return self
                    .fail_extension(rec, r, e, why, outbox, cause, now, out)
                    .await;
            }
            WriteOutcome::Conflict | WriteOutcome::DuplicateEvent => {
                out.decisions.push(Decision::new(
                    id,
                    decision::written(&w, "extension-leased"),
                    reason,
                ));
                return Ok(w);
            }
        }
        out.decisions
            .push(Decision::new(id, "extension-leased", reason));
        let token = e.lease_token.clone().unwrap_or_default();
        self.call(id, &r.id, e.number, &token, cause, now, out)
            .await?;
        Ok(w)
    }

    /// Under the lease `token`: marks the call (re-reading the request while another writer
    /// moves it), calls AWS once, and records what it answered.
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        id: &crate::domain::request::RequestId,
        reservation_id: &str,
        number: u32,
        token: &str,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        // The marker: written only while this lease is the extension's and unexpired.
        let mut marked = None;
        for _ in 0..WRITE_ATTEMPTS {
            let Some(rec) = self.store.get_request(id).await? else {
                return Ok(());
            };
            let (r, mut e) = match self.find(&rec, reservation_id, number).await? {
                Some(x) => x,
                None => return Ok(()),
            };
            if e.lease_token.as_deref() != Some(token)
                || e.lease_until.is_none_or(|t| t <= now)
                || e.state != ExtensionState::Buying
            {
                out.decisions.push(Decision::new(
                    id,
                    "waiting",
                    format!(
                        "extension {number} of {reservation_id}: the lease is no longer this \
                         invocation's"
                    ),
                ));
                return Ok(());
            }
            e.called_at = Some(now);
            let reason = format!(
                "extension {number} of {reservation_id}: calling AWS to buy {}",
                e.offer.offering_id
            );
            let step = cause.step(&format!("extension-{reservation_id}-{number}-call"));
            match self
                .write(&rec, &r, e.clone(), &reason, Effects::default(), &step, now)
                .await?
            {
                WriteOutcome::Applied { .. } => {
                    marked = Some((r, e));
                    break;
                }
                WriteOutcome::Conflict => continue,
                _ => return Ok(()),
            }
        }
        let Some((r, e)) = marked else {
            out.decisions.push(Decision::new(
                id,
                "skipped",
                format!(
                    "extension {number} of {reservation_id}: the call marker lost every write \
                     race; nothing was bought, and the lease's expiry hands it on"
                ),
            ));
            return Ok(());
        };
        match self.buy_extension(&r, &e.offer).await {
            Ok(seen) => {
                let note = format!(
                    "bought {}: AWS reports its payment {}",
                    seen.offering_id,
                    payment_words(seen.payment)
                );
                self.settle(
                    id,
                    reservation_id,
                    number,
                    Some(seen),
                    note,
                    cause,
                    now,
                    out,
                )
                .await
            }
            Err(PortError::OutcomeUnknown { message, .. }) => {
                out.decisions.push(Decision::new(
                    id,
                    "extension-in-doubt",
                    format!(
                        "extension {number} of {reservation_id}: the purchase of {} may or may \
                         not have happened ({message}); AWS's extension history decides after \
                         the lease",
                        e.offer.offering_id
                    ),
                ));
                Ok(())
            }
            Err(err) => {
                // AWS answered and sold nothing: the debit goes back.
                let why = format!("AWS refused the purchase of {}: {err}", e.offer.offering_id);
                self.settle_failed(id, reservation_id, number, why, cause, now, out)
                    .await
            }
        }
    }

    /// The purchase call, retried only when throttled (AWS did not process it).
    async fn buy_extension(
        &self,
        r: &Reservation,
        offer: &ExtensionOffer,
    ) -> Result<ExtensionSeen, PortError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.market.extend(r, offer).await {
                Err(PortError::Throttled { .. }) if attempt < 3 => {
                    self.sleep
                        .sleep(std::time::Duration::from_millis(200 * (1 << attempt)))
                        .await;
                }
                other => return other,
            }
        }
    }

    /// Reservation `reservation_id` of `rec` and its extension `number`, as recorded.
    async fn find(
        &self,
        rec: &RequestRecord,
        reservation_id: &str,
        number: u32,
    ) -> Result<Option<(Reservation, Extension)>, PortError> {
        let held = self.store.reservations(&rec.request_id).await?;
        Ok(held
            .into_iter()
            .find(|r| r.id == reservation_id)
            .and_then(|r| {
                let e = r.extensions.iter().find(|e| e.number == number)?.clone();
                Some((r, e))
            }))
    }

    /// Records what AWS says of the extension (`seen`; `None`: bought, not listed yet):
    /// pending, paid (the window's end moves) or failed (the debit goes back).
    #[allow(clippy::too_many_arguments)]
    async fn settle(
        &self,
        id: &crate::domain::request::RequestId,
        reservation_id: &str,
        number: u32,
        seen: Option<ExtensionSeen>,
        note: String,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        if seen
            .as_ref()
            .is_some_and(|s| s.payment == ExtensionPayment::Failed)
        {
            let why = format!("AWS did not take the payment ({note})");
            return self
                .settle_failed(id, reservation_id, number, why, cause, now, out)
                .await;
        }
        for _ in 0..WRITE_ATTEMPTS {
            let Some(rec) = self.store.get_request(id).await? else {
                return Ok(());
            };
            let (held, windows) = self.windows_of(&rec).await?;
            let Some(r) = held.iter().find(|r| r.id == reservation_id).cloned() else {
                return Ok(());
            };
            let Some(mut e) = r.extensions.iter().find(|e| e.number == number).cloned() else {
                return Ok(());
            };
            if !e.is_open() {
                return Ok(());
            }
            let w = last_window(&windows, &r).map_or(0, |w| w.number);
            let mut fx = Effects::default();
            if let Some(s) = &seen
                && s.offering_id != e.offer.offering_id
            {
                // Adopted in doubt: AWS's record of it is what was bought, and its fee what
                // was spent (ARCHITECTURE §8.6: debited even past the caps; what was held
                // beyond it goes back).
                e.offer.offering_id = s.offering_id.clone();
                e.offer.ends_at = s.ends_at;
                e.offer.starts_at = s.starts_at;
                e.offer.hours = s.hours;
                if let Some(fee) = s.fee {
                    let (debit, refund) = adjusted(&rec, &e, fee, now);
                    fx.debit = debit;
                    fx.refund = refund;
                    e.offer.fee = fee;
                    e.debited = fee.to_micros_ceil();
                }
            }
            e.lease_token = None;
            e.lease_until = None;
            let paid = seen
                .as_ref()
                .is_some_and(|s| s.payment == ExtensionPayment::Succeeded);
            let action;
            if paid {
                let end = seen.as_ref().map_or(e.offer.ends_at, |s| s.ends_at);
                e.state = ExtensionState::Succeeded;
                e.check_at = None;
                e.reason = format!("{note}; paid: the reservation now ends at {end}");
                let mut extended = r.clone();
                if let Some(last) = extended.segments.last_mut()
                    && (last.end - end).num_seconds().abs() >= 60
                {
                    last.end = end;
                    extended.extensions = r.extensions.clone();
                    if let Some(x) = extended.extensions.iter_mut().find(|x| x.number == number) {
                        *x = e.clone();
                    }
                    let m = window::ends_moved(
                        &held,
                        &rec.windows,
                        &[extended],
                        self.drain_lead(&rec),
                        window::Reopen::of(&rec),
                        now,
                    );
                    fx.outbox = m.announced(rec.whose(), rec.team.as_str());
                    // What the move reopens, in the history: the window launched again, or a
                    // training job's follow-on.
                    for said in m.reopened_said() {
                        e.reason.push_str("; ");
                        e.reason.push_str(&said);
                    }
                    fx.moved = Some(m);
                }
                action = "extension-paid";
            } else {
                e.state = ExtensionState::PaymentPending;
                e.check_at = Some(now + PAYMENT_READ_EVERY);
                e.reason = format!(
                    "{note}; the drain stays at the old end until AWS reports the payment taken"
                );
                action = "extension-bought";
            }
            let reason = format!(
                "extension {number} of {reservation_id} (window {w}): {}",
                e.reason
            );
            let step = cause.step(&format!(
                "extension-{reservation_id}-{number}-{}",
                e.state.as_str()
            ));
            match self.write(&rec, &r, e, &reason, fx, &step, now).await? {
                WriteOutcome::Conflict => continue,
                w => {
                    out.decisions
                        .push(Decision::new(id, decision::written(&w, action), reason));
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The extension was not bought, or its payment failed: `Failed`, its debit back to the
    /// ledger it came from, `Capacity Extension Failed`.
    #[allow(clippy::too_many_arguments)]
    async fn settle_failed(
        &self,
        id: &crate::domain::request::RequestId,
        reservation_id: &str,
        number: u32,
        why: String,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        for _ in 0..WRITE_ATTEMPTS {
            let Some(rec) = self.store.get_request(id).await? else {
                return Ok(());
            };
            let Some((r, e)) = self.find(&rec, reservation_id, number).await? else {
                return Ok(());
            };
            if !e.is_open() {
                return Ok(());
            }
            match self
                .fail_extension(&rec, &r, e, why.clone(), vec![], cause, now, out)
                .await?
            {
                WriteOutcome::Conflict => continue,
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    /// Writes extension `e` of `r` failed for `why`, returning what was debited for it.
    #[allow(clippy::too_many_arguments)]
    async fn fail_extension(
        &self,
        rec: &RequestRecord,
        r: &Reservation,
        mut e: Extension,
        why: String,
        mut outbox: Vec<OutboundEvent>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<WriteOutcome, PortError> {
        let returned = e.debited;
        let refund = (returned.0 > 0).then(|| {
            let (team, month) = ledger(rec, &e, now);
            Refund {
                month,
                amount: returned,
                team: Some(team),
            }
        });
        let (_, windows) = self.windows_of(rec).await?;
        let w = last_window(&windows, r).map_or(0, |w| w.number);
        e.state = ExtensionState::Failed;
        e.check_at = None;
        e.lease_token = None;
        e.lease_until = None;
        e.debited = MicroUsd(0);
        e.reason = why.clone();
        outbox.push(announced(
            Some(rec.team.as_str()),
            &ExtensionFailed {
                event_key: key(rec, w, e.number, "failed"),
                request_id: rec.request_id.to_string(),
                extension: Some(summary(r, w, &e)),
                hours: e.offer.hours,
                reason: why.clone(),
                returned_usd: returned.to_usd(),
            },
        ));
        let reason = format!(
            "extension {} of {} failed: {why}{}",
            e.number,
            r.id,
            if returned.0 > 0 {
                format!("; ${} returned", returned.to_usd())
            } else {
                String::new()
            }
        );
        let step = cause.step(&format!("extension-{}-{}-failed", r.id, e.number));
        let w = self
            .write(
                rec,
                r,
                e,
                &reason,
                Effects {
                    refund,
                    outbox,
                    ..Effects::default()
                },
                &step,
                now,
            )
            .await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&w, "extension-failed"),
            reason,
        ));
        Ok(w)
    }

    /// Every extension of `rec`'s reservations due a look at `now`: an approval's deadline, a
    /// lease expired (taken over: called again when unmarked, reconciled when marked), a
    /// payment to read.
    pub async fn step_extensions(
        &self,
        rec: &RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let held = self.store.reservations(id).await?;
        for r in &held {
            let Some(e) = r.extensions.iter().find(|e| e.due(now)).cloned() else {
                continue;
            };
            match e.state {
                ExtensionState::AwaitingApproval => {
                    let why = format!(
                        "no approval arrived by {}, the payment lead before the drain",
                        e.buy_by
                    );
                    self.settle_failed(id, &r.id, e.number, why, cause, now, out)
                        .await?;
                }
                ExtensionState::Buying if e.lease_until.is_some_and(|t| t > now) => {
                    out.decisions.push(Decision::new(
                        id,
                        "waiting",
                        format!(
                            "extension {} of {}: another worker holds its lease",
                            e.number, r.id
                        ),
                    ));
                }
                ExtensionState::Buying if e.called_at.is_none() => {
                    // Never called: the lease is taken again (its debit stands) and AWS called
                    // once, while the payment lead allows.
                    if now > e.buy_by {
                        let why = format!(
                            "its purchase was never called, and the payment lead passed at {}",
                            e.buy_by
                        );
                        self.settle_failed(id, &r.id, e.number, why, cause, now, out)
                            .await?;
                    } else {
                        let fresh = self.store.get_request(id).await?;
                        if let Some(fresh) = fresh
                            && let Some((r, e)) = self.find(&fresh, &r.id, e.number).await?
                        {
                            self.lease_and_buy(&fresh, &r, e, vec![], cause, now, out)
                                .await?;
                        }
                    }
                }
                ExtensionState::Buying => {
                    self.reconcile_extension(rec, r, &e, cause, now, out)
                        .await?;
                }
                ExtensionState::PaymentPending => {
                    let mine = e.find_in(self.market.extensions(r).await?);
                    match mine {
                        Some(s) if s.payment != ExtensionPayment::Pending => {
                            let note = format!("{} read back", s.offering_id);
                            self.settle(id, &r.id, e.number, Some(s), note, cause, now, out)
                                .await?;
                        }
                        _ => {
                            self.settle(
                                id,
                                &r.id,
                                e.number,
                                None,
                                format!("{} still pending payment", e.offer.offering_id),
                                cause,
                                now,
                                out,
                            )
                            .await?;
                        }
                    }
                }
                ExtensionState::Succeeded | ExtensionState::Failed => {}
            }
        }
        Ok(())
    }

    /// A purchase that called AWS and whose answer was lost (or whose worker died): AWS's
    /// history decides. One listed since the doubt began and not recorded is ours; none, once
    /// the doubt window passed, was never bought and the debit goes back.
    async fn reconcile_extension(
        &self,
        rec: &RequestRecord,
        r: &Reservation,
        e: &Extension,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let seen = self.market.extensions(r).await?;
        let recorded: Vec<&str> = r
            .extensions
            .iter()
            .filter(|x| x.number != e.number)
            .map(|x| x.offer.offering_id.as_str())
            .collect();
        if let Some(s) = seen
            .into_iter()
            .filter(|s| e.is(s, &recorded))
            .max_by_key(|s| s.bought_at)
        {
            let note = format!(
                "reconciled: AWS lists {} (bought since the doubt began at {}), ours",
                s.offering_id,
                e.doubt_since.unwrap_or(now)
            );
            return self
                .settle(id, &r.id, e.number, Some(s), note, cause, now, out)
                .await;
        }
        let since = e.doubt_since.or(e.called_at).unwrap_or(now);
        if now >= since + IN_DOUBT_WINDOW {
            let why = format!(
                "reconciled: AWS lists no extension of {} bought since {since}, {} after the \
                 call: it was not bought",
                r.id,
                lead_words(IN_DOUBT_WINDOW)
            );
            return self
                .settle_failed(id, &r.id, e.number, why, cause, now, out)
                .await;
        }
        // Still in doubt: looked at again shortly, the debit held.
        for _ in 0..WRITE_ATTEMPTS {
            let Some(fresh) = self.store.get_request(id).await? else {
                return Ok(());
            };
            let Some((r, mut e)) = self.find(&fresh, &r.id, e.number).await? else {
                return Ok(());
            };
            if e.state != ExtensionState::Buying {
                return Ok(());
            }
            e.check_at = Some(now + RECONCILE_EVERY);
            e.reason = format!(
                "in doubt since {since}, not listed yet; the debit holds and AWS's history is \
                 read again at {}",
                now + RECONCILE_EVERY
            );
            let reason = format!("extension {} of {}: {}", e.number, r.id, e.reason);
            let step = cause.step(&format!("extension-{}-{}-doubt", r.id, e.number));
            match self
                .write(&fresh, &r, e, &reason, Effects::default(), &step, now)
                .await?
            {
                WriteOutcome::Conflict => continue,
                w => {
                    out.decisions.push(Decision::new(
                        id,
                        decision::written(&w, "extension-in-doubt"),
                        reason,
                    ));
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// `extend.when: workload-running` (ARCHITECTURE §9.3): each reservation of `rec` whose
    /// look is due (armed by cleanup with its window's first Ending notice) is extended by a
    /// day, within `extend.max_hours`, while the workload in its last window still runs: EC2
    /// instances running, a training job in progress, a HyperPod group with nodes. A stopped
    /// workload is not extended; an endpoint is not extended automatically (its invocations
    /// are not read). The look is cleared with its reason first, so it is made once per end.
    pub async fn auto_extend<W: Workloads>(
        &self,
        workloads: &W,
        rec: &RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        if rec.status == RequestStatus::Purchasing {
            // The purchase's lease owns the request's writes: looked at once it ends.
            out.decisions.push(Decision::new(
                id,
                "waiting",
                "a purchase is under way: whether the workload runs on is looked at once it ends",
            ));
            return Ok(());
        }
        let (held, windows) = self.windows_of(rec).await?;
        for r in held
            .iter()
            .filter(|r| r.extension_check_at.is_some_and(|t| t <= now))
        {
            let w = last_window(&windows, r);
            let policy = rec.request.extend.as_ref();
            let (used_hours, _) = used(held.iter().flat_map(|h| h.extensions.iter()));
            let hours = policy.map_or(0, |p| p.max_hours.saturating_sub(used_hours).min(24));
            let why_not = match (policy, w) {
                (Some(p), _) if p.when != ExtendWhen::WorkloadRunning => Some(format!(
                    "extend.when is {}: only an ask extends it",
                    p.when.as_str()
                )),
                (None, _) => Some("the request has no extend policy".to_string()),
                (_, None) => Some("no window of it is left to run".to_string()),
                _ if r.open_extension().is_some() => {
                    Some("an extension of it is being bought already".to_string())
                }
                (_, Some(w)) if w.state != WindowState::Running => Some(format!(
                    "window {} is {}, not running",
                    w.number,
                    w.state.as_str()
                )),
                (_, Some(w)) if now > w.drain_at - self.extension_lead() => Some(format!(
                    "past the payment lead ({})",
                    w.drain_at - self.extension_lead()
                )),
                _ if hours < 24 => Some(format!(
                    "extend.max_hours is used up ({used_hours} h extended so far)"
                )),
                (_, Some(w)) => match self.workload_runs(workloads, rec, r).await? {
                    Some(true) => None,
                    Some(false) => Some(format!(
                        "window {}'s workload is not running: a stopped workload is not \
                         extended",
                        w.number
                    )),
                    None => Some(format!(
                        "window {}'s workload is an inference endpoint, whose invocations \
                         capacity-pilot does not read: it is extended only when asked \
                         (capacity-pilot extend)",
                        w.number
                    )),
                },
            };
            let reason = match &why_not {
                Some(why) => format!("{} is not extended automatically: {why}", r.id),
                None => format!(
                    "the workload in {}'s last window runs on: extending it by {hours} h \
                     (extend.when: workload-running)",
                    r.id
                ),
            };
            // The look is cleared first: made once per end, whatever follows.
            let mut cleared = false;
            for _ in 0..WRITE_ATTEMPTS {
                let Some(fresh) = self.store.get_request(id).await? else {
                    return Ok(());
                };
                let held = self.store.reservations(id).await?;
                let Some(mut r) = held.into_iter().find(|x| x.id == r.id) else {
                    break;
                };
                if r.extension_check_at.is_none_or(|t| t > now) {
                    break;
                }
                r.extension_check_at = None;
                let mut t = Transition::of(
                    &fresh,
                    fresh.status,
                    &reason,
                    fresh.next_action_at,
                    now,
                    &cause.step(&format!("extension-{}-look", r.id)),
                );
                t.reservations = vec![r];
                match self.store.transition(t).await? {
                    WriteOutcome::Conflict => continue,
                    w => {
                        cleared = matches!(w, WriteOutcome::Applied { .. });
                        out.decisions.push(Decision::new(
                            id,
                            decision::written(&w, "extension-look"),
                            reason.clone(),
                        ));
                        break;
                    }
                }
            }
            if cleared
                && why_not.is_none()
                && let Some(fresh) = self.store.get_request(id).await?
            {
                self.ask_extension(
                    fresh,
                    Some(&r.id),
                    hours,
                    Asked::WorkloadRunning,
                    &cause.step(&format!("extension-{}-auto", r.id)),
                    now,
                    out,
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Whether the workload in reservation `r`'s windows runs: `None` when it is not judged
    /// (an inference endpoint).
    async fn workload_runs<W: Workloads>(
        &self,
        workloads: &W,
        rec: &RequestRecord,
        r: &Reservation,
    ) -> Result<Option<bool>, PortError> {
        let slots: Vec<_> = self
            .store
            .workloads(&rec.request_id)
            .await?
            .into_iter()
            .filter(|s| s.reservation_id == r.id)
            .collect();
        match rec.request.workload_kind() {
            WorkloadKind::Ec2Instances => {
                let filter = InstanceFilter {
                    reservation_id: Some(r.id.clone()),
                    request_id: Some(rec.request_id.clone()),
                    managed_only: true,
                    ..InstanceFilter::default()
                };
                Ok(Some(
                    workloads
                        .describe_instances(&r.region, &filter)
                        .await?
                        .iter()
                        .any(|i| i.state == InstanceState::Running),
                ))
            }
            WorkloadKind::TrainingJob => {
                for s in &slots {
                    if let Some(j) = workloads
                        .describe_training_job(&r.region, &s.resource_id)
                        .await?
                        && j.state == JobState::InProgress
                    {
                        return Ok(Some(true));
                    }
                }
                Ok(Some(false))
            }
            WorkloadKind::HyperpodCluster => {
                for s in &slots {
                    let Some((cluster, group)) = s.resource_id.split_once('/') else {
                        continue;
                    };
                    if let Some(g) = workloads
                        .describe_instance_group(&r.region, cluster, group)
                        .await?
                        && g.current_count > 0
                    {
                        return Ok(Some(true));
                    }
                }
                Ok(Some(false))
            }
            WorkloadKind::InferenceEndpoint => Ok(None),
        }
    }

    /// Whether decision `d` names an extension awaiting approval of `rec`: it is answered
    /// here (bought, failed, or refused: past the payment lead, or nothing awaits under its
    /// key). `false`: it names none.
    pub async fn decide_extension(
        &self,
        rec: &RequestRecord,
        d: &PurchaseDecision,
        approved: bool,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<bool, PortError> {
        let Some(k) = d.approves.as_deref().filter(|k| k.contains(":extension-")) else {
            return Ok(false);
        };
        let id = &rec.request_id;
        if self.applied_already(id, cause).await? {
            out.decisions.push(Decision::new(
                id,
                "duplicate",
                format!("decision event {} was applied already", cause.event_id),
            ));
            return Ok(true);
        }
        let held = self.store.reservations(id).await?;
        let found = held.iter().find_map(|r| {
            r.extensions
                .iter()
                .find(|e| {
                    e.state == ExtensionState::AwaitingApproval
                        && e.approval_key.as_deref() == Some(k)
                })
                .map(|e| (r.clone(), e.clone()))
        });
        let Some((r, mut e)) = found else {
            let current = held
                .iter()
                .flat_map(|r| r.extensions.iter())
                .find(|e| e.state == ExtensionState::AwaitingApproval)
                .and_then(|e| e.approval_key.clone());
            self.refuse_decision(
                rec,
                d,
                approved,
                format!("it answers {k}, but no extension awaits approval under that key"),
                current,
                cause,
                out,
            )
            .await?;
            return Ok(true);
        };
        if approved && now > e.buy_by {
            let why = format!(
                "the approval came after the payment lead ({}): AWS's payment could not clear \
                 before the drain",
                e.buy_by
            );
            self.refuse_decision(rec, d, approved, why.clone(), None, cause, out)
                .await?;
            self.settle_failed(id, &r.id, e.number, why, cause, now, out)
                .await?;
            return Ok(true);
        }
        if !approved {
            let why = format!(
                "rejected by approver {}{}",
                d.approver,
                d.comment
                    .as_deref()
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default()
            );
            self.settle_failed(id, &r.id, e.number, why, cause, now, out)
                .await?;
            return Ok(true);
        }
        e.approved_by = Some(d.approver.clone());
        e.approval_key = None;
        let (mut rec, mut r, mut e) = (rec.clone(), r, e);
        for _ in 0..WRITE_ATTEMPTS {
            if self
                .lease_and_buy(&rec, &r, e.clone(), vec![], cause, now, out)
                .await?
                != WriteOutcome::Conflict
            {
                return Ok(true);
            }
            let Some(fresh) = self.store.get_request(id).await? else {
                return Ok(true);
            };
            let Some((fr, fe)) = self.find(&fresh, &r.id, e.number).await? else {
                return Ok(true);
            };
            if fe.state != ExtensionState::AwaitingApproval {
                return Ok(true);
            }
            (rec, r) = (fresh, fr);
            e = Extension {
                approved_by: Some(d.approver.clone()),
                approval_key: None,
                ..fe
            };
        }
        Ok(true)
    }

    #[allow(clippy::too_many_arguments)]
    async fn refuse_decision(
        &self,
        rec: &RequestRecord,
        d: &PurchaseDecision,
        approved: bool,
        why: String,
        current: Option<String>,
        cause: &Cause,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let reason = format!(
            "{} by {} refused: {why}",
            if approved { "approval" } else { "rejection" },
            d.approver
        );
        let ev = ApprovalRefused {
            event_key: format!("{}:approval-refused:{}", rec.request_id, cause.event_id),
            request_id: rec.request_id.to_string(),
            reason: reason.clone(),
            current_event_key: current,
        };
        outbox::publish_now(self.events, &[announced(Some(rec.team.as_str()), &ev)]).await?;
        out.decisions
            .push(Decision::new(&rec.request_id, "approval-refused", reason));
        Ok(())
    }
}

/// What changes when extension `e`, debited `e.debited`, turns out to have cost `fee`: the
/// difference debited to the same ledger (past the caps: it was spent), or returned to it.
fn adjusted(
    rec: &RequestRecord,
    e: &Extension,
    fee: crate::domain::money::Usd,
    now: DateTime<Utc>,
) -> (Option<Debit>, Option<Refund>) {
    let diff = fee.to_micros_ceil().0 - e.debited.0;
    let (team, month) = ledger(rec, e, now);
    match diff.cmp(&0) {
        std::cmp::Ordering::Greater => (
            Some(Debit {
                team,
                month,
                amount: MicroUsd(diff),
                team_cap: MicroUsd(i64::MAX / 4),
                request_cap: MicroUsd(i64::MAX / 4),
            }),
            None,
        ),
        std::cmp::Ordering::Less => (
            None,
            Some(Refund {
                month,
                amount: MicroUsd(-diff),
                team: Some(team),
            }),
        ),
        std::cmp::Ordering::Equal => (None, None),
    }
}

fn payment_words(p: ExtensionPayment) -> &'static str {
    match p {
        ExtensionPayment::Pending => "pending",
        ExtensionPayment::Succeeded => "taken",
        ExtensionPayment::Failed => "failed",
    }
}

fn lead_words(d: Duration) -> String {
    crate::domain::notices::lead_words(u32::try_from(d.num_minutes()).unwrap_or(u32::MAX))
}
