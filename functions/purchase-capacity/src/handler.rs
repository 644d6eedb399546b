//! purchase-capacity's dispatch: which wake-up goes to which purchase protocol
//! ([`capacity_pilot::purchase`]). The schedule and `Capacity Offerings Found` take a request to
//! the approval gate and the purchase, or, already Purchasing under an expired lease, to the
//! takeover, or, Reserved, to its payment check, or, ended with a purchase in doubt, to its
//! hourly reconciliation; an approver's decision goes to the approval
//! protocol, and on to the purchase when it approves; a cancellation to the cancellation's.
//!
//! Events only wake this function up: what to buy and for how much is read from the table.

use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::config::{Config, PurchaseMode};
use capacity_pilot::decision;
pub use capacity_pilot::decision::{Decision, HandlerError};
use capacity_pilot::domain::events::{
    self, CancelRequest, EventDetail, ExtensionRequest, PurchaseDecision, inbound,
};
use capacity_pilot::domain::extension::Asked;
use capacity_pilot::domain::request::{FieldError, RequestId};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::outbox;
use capacity_pilot::ports::{
    CapacityMarket, Cause, Clock, EventSink, Pause, PortError, RequestRecord, SharedIds, Sleep,
    Store, Transition, Workloads, request_named,
};
pub use capacity_pilot::purchase::Outcome;
use capacity_pilot::purchase::Protocols;
use capacity_pilot::purchase::approval::{self, Gate};
use capacity_pilot::purchase::pause;
use capacity_pilot::purchase::preflight::Preflight;
use chrono::{DateTime, Utc};
use serde_json::Value;
use tracing::warn;

pub struct Purchaser<S, M, E, C, W> {
    pub store: S,
    pub market: M,
    pub events: E,
    /// The pre-flight's reads and RunInstances dry run (ARCHITECTURE §8.1); nothing is
    /// launched from here.
    pub workloads: W,
    pub clock: C,
    pub config: Arc<Config>,
    /// Lease tokens.
    pub ids: SharedIds,
    /// Between throttled purchase attempts.
    pub sleep: Sleep,
}

impl<S: Store, M: CapacityMarket, E: EventSink, C: Clock, W: Workloads> Purchaser<S, M, E, C, W> {
    /// The purchase protocols over this function's ports.
    fn protocols(&self) -> Protocols<'_, S, M, E> {
        Protocols {
            store: &self.store,
            market: &self.market,
            events: &self.events,
            config: &self.config,
            ids: &self.ids,
            sleep: &self.sleep,
        }
    }

    pub async fn handle(&self, ev: EventBridgeEvent<Value>) -> Result<Outcome, HandlerError> {
        let now = self.clock.now().await?;
        let cause = Cause::new(ev.id.clone().unwrap_or_else(|| format!("{now}")));
        let mut out = Outcome::default();
        let detail_type = ev.detail_type.clone();
        let source = ev.source.clone();
        let mut errors = Vec::new();
        let run = outbox::Run::start(&self.store, now);
        let mut agenda = None;

        match detail_type.as_str() {
            "Scheduled Event" if source == "aws.events" => {
                let a = agenda.insert(self.store.agenda(now).await?);
                let due = a.due_in(&[
                    RequestStatus::OfferingsFound,
                    RequestStatus::AwaitingApproval,
                    RequestStatus::Purchasing,
                    // Bought, until AWS reports each reservation scheduled.
                    RequestStatus::Reserved,
                    // Ended with a purchase in doubt, reconciled hourly (ARCHITECTURE §9.1).
                    RequestStatus::Failed,
                    RequestStatus::Cancelled,
                ]);
                // ARCHITECTURE §9.1: a reservation's payment is read whatever its request's
                // status; a request due for its own action is read below, payments included.
                let mut payments = a.payments_due(now);
                // Due for one of its windows only (launch and cleanup's): not read.
                for item in due.into_iter().filter(|d| d.own_action_due(now)) {
                    payments.retain(|id| id != &item.request_id);
                    let rec = match self.store.get_request(&item.request_id).await {
                        Ok(Some(rec)) => rec,
                        Ok(None) => continue,
                        Err(e) => {
                            errors.push(HandlerError::from(e));
                            continue;
                        }
                    };
                    // Due for one of its windows (launch and cleanup's), not for a purchase.
                    if !rec.own_action_due(now) {
                        continue;
                    }
                    if let Err(e) = self
                        .process_record(rec, &cause, None, a.pause.as_ref(), now, &mut out)
                        .await
                        .map_err(HandlerError::from)
                    {
                        warn!(request_id = %item.request_id, error = %e, "purchase step failed");
                        errors.push(e);
                    }
                }
                for id in a.payments_due(now) {
                    // A reservation's own payment, and its extensions (ARCHITECTURE §9.3),
                    // each read when due.
                    let step = self
                        .payments_and_extensions(&id, payments.contains(&id), &cause, now, &mut out)
                        .await;
                    if let Err(e) = step {
                        warn!(request_id = %id, error = %e, "payment check failed");
                        errors.push(HandlerError::from(e));
                    }
                }
            }
            d if d == <events::OfferingsFound as EventDetail>::DETAIL_TYPE
                && source == events::SOURCE =>
            {
                if let Some(id) = request_id_of(&ev.detail) {
                    self.process(&id, &cause, None, now, &mut out).await?;
                }
            }
            inbound::PURCHASE_APPROVED | inbound::PURCHASE_REJECTED => {
                if !self.config.approver_sources.contains(&source) {
                    self.reject_inbound(&ev, &source, "source", "is not an approver source")
                        .await?;
                } else {
                    match serde_json::from_value::<PurchaseDecision>(ev.detail.clone()) {
                        Err(e) => {
                            self.reject_inbound(&ev, &source, "detail", &e.to_string())
                                .await?
                        }
                        Ok(d)
                            if d.approves
                                .as_deref()
                                .is_some_and(|k| k.contains(":extension-")) =>
                        {
                            let approved = detail_type == inbound::PURCHASE_APPROVED;
                            self.extension_decided(&d, approved, &cause, now, &mut out)
                                .await?;
                        }
                        Ok(d) => {
                            let approved = detail_type == inbound::PURCHASE_APPROVED;
                            // An approval of the plan awaiting it goes on to buy it.
                            if let Some(rec) = self
                                .protocols()
                                .decide(&d, approved, &cause, now, &mut out)
                                .await?
                            {
                                self.process_record(
                                    rec,
                                    &cause,
                                    Some(&d.approver),
                                    None,
                                    now,
                                    &mut out,
                                )
                                .await?;
                            }
                        }
                    }
                }
            }
            inbound::EXTENSION_REQUESTED => {
                match serde_json::from_value::<ExtensionRequest>(ev.detail.clone()) {
                    Err(e) => {
                        self.reject_inbound(&ev, &source, "detail", &e.to_string())
                            .await?
                    }
                    Ok(x) => {
                        self.extension_requested(&ev, &source, x, &cause, now, &mut out)
                            .await?
                    }
                }
            }
            inbound::REQUEST_CANCELLED => {
                if !self.config.allowed_request_sources.contains(&source) {
                    self.reject_inbound(&ev, &source, "source", "may not cancel requests")
                        .await?;
                } else {
                    match serde_json::from_value::<CancelRequest>(ev.detail.clone()) {
                        Err(e) => {
                            self.reject_inbound(&ev, &source, "detail", &e.to_string())
                                .await?
                        }
                        Ok(c) => {
                            self.protocols()
                                .cancel(&c, &source, &cause, now, &mut out)
                                .await?
                        }
                    }
                }
            }
            other => {
                warn!(
                    detail_type = other,
                    source, "ignoring an event this function does not handle"
                );
            }
        }
        out.published =
            outbox::flush(&self.store, &self.events, run.with_agenda(agenda.as_ref())).await?;
        decision::log(&out.decisions);
        let errors = errors.into_iter().map(HandlerError::into_port).collect();
        decision::finish(out, errors)
    }

    /// A request's reservation payments (`own`: one is due a read) and its extensions due a
    /// look at `now`, each read when due.
    async fn payments_and_extensions(
        &self,
        id: &RequestId,
        own: bool,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let held = self.store.reservations(id).await?;
        let paying = held.iter().any(|r| {
            r.state.is_live()
                && !r.state.is_settled()
                && r.payment_check_at.is_some_and(|t| t <= now)
        });
        let extending = held.iter().any(|r| r.extensions.iter().any(|e| e.due(now)));
        let looking = held
            .iter()
            .any(|r| r.extension_check_at.is_some_and(|t| t <= now));
        if own
            && paying
            && let Some(rec) = self.store.get_request(id).await?
        {
            self.protocols().track(rec, cause, now, out).await?;
        }
        // Boxed, as every extension step below: their state would otherwise sit inside
        // every invocation's future.
        if extending && let Some(rec) = self.store.get_request(id).await? {
            Box::pin(self.protocols().step_extensions(&rec, cause, now, out)).await?;
        }
        if looking && let Some(rec) = self.store.get_request(id).await? {
            Box::pin(
                self.protocols()
                    .auto_extend(&self.workloads, &rec, cause, now, out),
            )
            .await?;
        }
        Ok(())
    }

    /// `Capacity Extension Requested`: from a source that may submit requests and, when the
    /// request's source is recorded, that source; the request's extension protocol answers
    /// it (ARCHITECTURE §9.3).
    async fn extension_requested(
        &self,
        ev: &EventBridgeEvent<Value>,
        source: &str,
        x: ExtensionRequest,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        if !self
            .config
            .allowed_request_sources
            .iter()
            .any(|s| s == source)
        {
            return self
                .reject_inbound(ev, source, "source", "may not ask for extensions")
                .await;
        }
        let rec = match RequestId::parse(&x.request_id) {
            Ok(id) => request_named(&self.store, &id).await?,
            Err(_) => None,
        };
        let Some(rec) = rec else {
            return self
                .reject_inbound(
                    ev,
                    source,
                    "request_id",
                    &format!(
                        "names no recorded request {:?} (never submitted, rejected, or archived)",
                        x.request_id
                    ),
                )
                .await;
        };
        if let Some(p) = self.config.team_source_problem(&rec.team, source) {
            return self.reject_inbound(ev, source, "source", &p.message).await;
        }
        Box::pin(self.protocols().ask_extension(
            rec,
            x.reservation_id.as_deref(),
            x.hours,
            Asked::Requested {
                event_id: cause.event_id.clone(),
            },
            cause,
            now,
            out,
        ))
        .await
    }

    /// An approver's decision naming an extension's key.
    async fn extension_decided(
        &self,
        d: &PurchaseDecision,
        approved: bool,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let rec = match RequestId::parse(&d.request_id) {
            Ok(id) => request_named(&self.store, &id).await?,
            Err(_) => None,
        };
        match rec {
            Some(rec) => {
                Box::pin(
                    self.protocols()
                        .decide_extension(&rec, d, approved, cause, now, out),
                )
                .await?;
                Ok(())
            }
            // Answered as any decision for no request is.
            None => self
                .protocols()
                .decide(d, approved, cause, now, out)
                .await
                .map(|_| ()),
        }
    }

    async fn reject_inbound(
        &self,
        ev: &EventBridgeEvent<Value>,
        source: &str,
        field: &str,
        message: &str,
    ) -> Result<(), PortError> {
        let problems = vec![FieldError {
            field: field.to_string(),
            message: format!("{} from {source:?} {message}", ev.detail_type),
        }];
        let request_id = request_id_of(&ev.detail).map(|r| r.to_string());
        let event_id = ev.id.clone().unwrap_or_default();
        outbox::reject(&self.events, &event_id, source, request_id, None, problems).await
    }

    async fn process(
        &self,
        id: &RequestId,
        cause: &Cause,
        approver: Option<&str>,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), HandlerError> {
        match self.store.get_request(id).await? {
            Some(rec) => Ok(self
                .process_record(rec, cause, approver, None, now, out)
                .await?),
            None => Ok(()),
        }
    }

    /// `pause`: the operator's pause as the tick read it (ARCHITECTURE §9.7); `None` when it
    /// was not read (an event woke this run), when the lease's own check answers.
    async fn process_record(
        &self,
        rec: RequestRecord,
        cause: &Cause,
        approver: Option<&str>,
        pause: Option<&Pause>,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = rec.request_id.clone();
        match rec.status {
            // An on-demand or spot hold waiting for an approver: nothing to buy here.
            RequestStatus::AwaitingApproval if approval::hold_awaiting(&rec).is_some() => {
                return self.protocols().hold_waits(&rec, cause, now, out).await;
            }
            RequestStatus::OfferingsFound | RequestStatus::AwaitingApproval => {}
            RequestStatus::Reserved => return self.protocols().track(rec, cause, now, out).await,
            RequestStatus::Purchasing => {
                return match &rec.lease {
                    Some(l) if l.expires_at > now => {
                        out.decisions.push(Decision::new(
                            &id,
                            "waiting",
                            format!(
                                "another worker holds the purchase lease until {}",
                                l.expires_at
                            ),
                        ));
                        Ok(())
                    }
                    _ => self.protocols().take_over(rec, cause, now, out).await,
                };
            }
            _ if rec.in_doubt() => {
                return self
                    .protocols()
                    .reconcile_in_doubt(rec, cause, now, out)
                    .await;
            }
            other => {
                out.decisions.push(Decision::new(
                    &id,
                    "ignored",
                    format!("nothing to buy while the request is {other}"),
                ));
                return Ok(());
            }
        }
        // `PurchaseMode` plan-only (ARCHITECTURE §8.1): a request accepted before the mode
        // was set is planned too; nothing is bought.
        if self.config.purchase_mode == PurchaseMode::PlanOnly {
            let reason = "planned, nothing bought: the deployment's PurchaseMode is plan-only";
            let step = Cause::new(format!("{}#plan-only", cause.event_id));
            let w = self
                .store
                .transition(Transition::of(
                    &rec,
                    RequestStatus::Planned,
                    reason,
                    None,
                    now,
                    &step,
                ))
                .await?;
            out.decisions
                .push(Decision::new(&id, decision::written(&w, "planned"), reason));
            return Ok(());
        }
        // A plan held back by the pause, and told so already: left alone until purchases
        // resume (no pre-flight, no write).
        if approver.is_none()
            && rec.status == RequestStatus::OfferingsFound
            && let Some(d) = pause::told(pause, &rec)
        {
            out.decisions.push(d);
            return Ok(());
        }
        let p = self.protocols();
        let Some(plan) = p.plan_to_buy(&rec, cause, now, out).await? else {
            return Ok(());
        };
        // The pre-flight, before an approver is asked and again before the lease once one
        // answers; not on each look at a plan still waiting for its approver.
        let still_waiting = rec.status == RequestStatus::AwaitingApproval && approver.is_none();
        // Boxed: its state would otherwise sit inside every invocation's future.
        if !still_waiting
            && Box::pin(p.preflight(&self.workloads, &rec, cause, now, out)).await?
                == Preflight::Stopped
        {
            return Ok(());
        }
        // The approval gate.
        if p.gate(&rec, &plan, approver, cause, now, out).await? == Gate::Held {
            return Ok(());
        }
        p.begin(&rec, &plan, approver, cause, now, out).await
    }
}

fn request_id_of(detail: &Value) -> Option<RequestId> {
    detail
        .get("request_id")
        .and_then(Value::as_str)
        .and_then(|s| RequestId::parse(s).ok())
}

#[cfg(test)]
mod tests;
