//! Cancellation (ARCHITECTURE §8.3): every `Capacity Request Cancelled` is answered, Applied or
//! Refused. What is not yet bought is stopped; a purchase under way or a payment not yet taken
//! keeps the cancellation on the request until it can be decided; an id no request holds yet
//! keeps it as a tombstone for the submission on its way.

use chrono::{DateTime, Utc};

use super::{Outcome, Protocols};
use crate::decision::Decision;
use crate::domain::events::{
    CancelRequest, CancellationApplied, CancellationRefused, ending_events, outbound,
};
use crate::domain::request::RequestId;
use crate::domain::status::RequestStatus;
use crate::domain::time_rules::PAYMENT_CHECK_EVERY;
use crate::outbox;
use crate::ports::{
    CancelNote, CapacityMarket, Cause, EventSink, KeepCancellation, PortError, RequestRecord,
    Store, TOMBSTONE_KEPT, Tombstone, TombstoneOutcome, Transition, WriteOutcome,
};

/// How often a cancellation that lost a write race is decided again within one invocation.
const CANCEL_ATTEMPTS: u32 = 3;

impl<S: Store, M: CapacityMarket, E: EventSink> Protocols<'_, S, M, E> {
    /// ARCHITECTURE §8.3: every cancellation gets an answer, Applied or Refused. One that
    /// loses a write race reads the request again and decides again.
    pub async fn cancel(
        &self,
        c: &CancelRequest,
        source: &str,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let Ok(id) = RequestId::parse(&c.request_id) else {
            return self
                .refuse_cancel(
                    &c.request_id,
                    None,
                    format!("{:?} is not a request id", c.request_id),
                    cause,
                    out,
                )
                .await;
        };
        for _ in 0..CANCEL_ATTEMPTS {
            let Some(rec) = self.store.get_request(&id).await? else {
                // Its submission may be on its way (EventBridge does not order deliveries):
                // a tombstone keeps the cancellation for it.
                match self.tombstone(&id, c, source, cause, now, out).await? {
                    TombstoneOutcome::RequestExists => continue,
                    TombstoneOutcome::Placed | TombstoneOutcome::DuplicateEvent => {
                        return Ok(());
                    }
                }
            };
            let reason = requester_reason(c);
            if let Some(done) = self.cancel_run(&rec, &reason, cause, now, out).await? {
                if done {
                    return Ok(());
                }
                continue;
            }
            if !rec.status.is_cancellable() {
                match self.keep_cancel(&rec, &reason, cause, now, out).await? {
                    Kept::Yes => return Ok(()),
                    Kept::Conflict => continue,
                    Kept::No => {}
                }
                let why = format!(
                    "the request is {} and purchases cannot be undone",
                    rec.status
                );
                return self
                    .refuse_cancel(id.as_str(), Some(rec.status), why, cause, out)
                    .await;
            }
            // A split's kept block stays bought: what is kept, and what stays spent.
            let answers = ending_events(
                &rec,
                RequestStatus::Cancelled,
                &reason,
                self.kept(&id).await?,
                rec.spent,
            );
            let t = Transition::of(&rec, RequestStatus::Cancelled, &reason, None, now, cause)
                .with_outbox(answers);
            match self.store.transition(t).await? {
                WriteOutcome::Applied { .. } => {
                    out.decisions.push(Decision::new(&id, "cancelled", reason));
                    return Ok(());
                }
                WriteOutcome::DuplicateEvent => return Ok(()),
                // Another worker moved the request on: read it again and decide again.
                _ => continue,
            }
        }
        Err(PortError::Transient {
            service: "dynamodb",
            code: "Contended".into(),
            message: format!("{id}: the request kept changing under its cancellation"),
        })
    }

    /// ARCHITECTURE §8.3: a cancellation of an on-demand or spot run, or of an attempt that
    /// holds its estimate (so something may be starting), stops what runs and settles the
    /// hours it ran before it is answered. This writes `Draining` with the cancellation kept;
    /// cleanup-expired stops the run, and once no launch begun before the cancellation can
    /// still be in flight, settles and answers. `None` when the request has no such run;
    /// `Some(false)` when it moved on meanwhile.
    async fn cancel_run(
        &self,
        rec: &RequestRecord,
        reason: &str,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<bool>, PortError> {
        let running = match rec.status {
            RequestStatus::RunningOnDemand | RequestStatus::RunningSpot => true,
            RequestStatus::TryingOnDemand => rec.open_debit.is_some() || rec.run.is_some(),
            _ => false,
        };
        if !running {
            return Ok(None);
        }
        let note = CancelNote {
            reason: reason.to_string(),
            at: now,
            event_id: cause.event_id.clone(),
            found: Some(rec.status),
        };
        let why = format!(
            "{reason}: stopping what runs on demand, then settling the hours it ran; the \
             answer follows the settlement"
        );
        let t = Transition::of(rec, RequestStatus::Draining, &why, Some(now), now, cause)
            .keeping_cancel(note);
        Ok(Some(match self.store.transition(t).await? {
            WriteOutcome::Applied { .. } => {
                out.decisions
                    .push(Decision::new(&rec.request_id, "cancel-kept", why));
                true
            }
            WriteOutcome::DuplicateEvent => true,
            _ => false,
        }))
    }

    /// ARCHITECTURE §8.3: a cancellation for an id no request holds is kept as a tombstone
    /// for [`TOMBSTONE_KEPT`], which a submission of the id from `source` honours, and
    /// answered Applied (no `status_before`) now.
    async fn tombstone(
        &self,
        id: &RequestId,
        c: &CancelRequest,
        source: &str,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<TombstoneOutcome, PortError> {
        let requester = requester_reason(c);
        let reason = format!(
            "{requester} before request {id} was recorded; a submission of it from {source} \
             until {} is recorded cancelled",
            now + TOMBSTONE_KEPT
        );
        let applied = CancellationApplied {
            event_key: format!("{id}:cancellation-applied:{}", cause.event_id),
            request_id: id.to_string(),
            status_before: None,
            reason: reason.clone(),
        };
        let t = Tombstone {
            request_id: id.clone(),
            source: source.to_string(),
            reason: requester,
            at: now,
            event_id: cause.event_id.clone(),
        };
        let placed = self
            .store
            .put_tombstone(t, vec![outbound(&applied)])
            .await?;
        if placed == TombstoneOutcome::Placed {
            out.decisions.push(Decision::new(id, "tombstone", reason));
        }
        Ok(placed)
    }

    /// ARCHITECTURE §8.3: a cancellation during `Purchasing`, or while a bought reservation's
    /// payment is not yet taken, is kept on the request: applied if the purchase does not
    /// complete or the payment fails, refused once the payment is taken. Its answer comes
    /// then; one already kept answers a later one too.
    async fn keep_cancel(
        &self,
        rec: &RequestRecord,
        reason: &str,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Kept, PortError> {
        let id = &rec.request_id;
        let (what, next) = match rec.status {
            RequestStatus::Purchasing => (
                "a purchase is under way: the cancellation is applied if it does not complete"
                    .to_string(),
                rec.next_action_at,
            ),
            RequestStatus::Reserved => {
                let held = self.store.reservations(id).await?;
                let unpaid: Vec<&str> = held
                    .iter()
                    .filter(|r| r.state.is_live() && !r.state.is_settled())
                    .map(|r| r.id.as_str())
                    .collect();
                if unpaid.is_empty() {
                    return Ok(Kept::No);
                }
                (
                    format!(
                        "the payment for {} is not yet taken: the cancellation is applied if \
                         it fails, and refused once it is taken",
                        unpaid.join(", ")
                    ),
                    // Read again soon, whatever the payment checks had planned.
                    Some(
                        rec.next_action_at
                            .map_or(now, |t| t.min(now + PAYMENT_CHECK_EVERY)),
                    ),
                )
            }
            // A cancelled on-demand run being stopped and settled.
            RequestStatus::Draining if rec.run.is_some() && rec.cancel.is_some() => (
                "the on-demand run is being stopped and settled".to_string(),
                rec.next_action_at,
            ),
            _ => return Ok(Kept::No),
        };
        if let Some(kept) = &rec.cancel {
            out.decisions.push(Decision::new(
                id,
                "cancel-kept",
                format!(
                    "a cancellation is already kept (event {}, at {}); {what}, and its answer \
                     answers this one too",
                    kept.event_id, kept.at
                ),
            ));
            return Ok(Kept::Yes);
        }
        let k = KeepCancellation {
            request_id: id.clone(),
            expected_version: rec.version,
            status: rec.status,
            note: Some(CancelNote {
                reason: reason.to_string(),
                at: now,
                event_id: cause.event_id.clone(),
                found: None,
            }),
            reason: format!("{}; {reason}, kept: {what}", rec.reason),
            next_action_at: next,
            at: now,
            caused_by: cause.clone(),
            outbox: vec![],
        };
        Ok(match self.store.keep_cancellation(k).await? {
            WriteOutcome::Applied { .. } => {
                out.decisions.push(Decision::new(id, "cancel-kept", what));
                Kept::Yes
            }
            WriteOutcome::DuplicateEvent => Kept::Yes,
            _ => Kept::Conflict,
        })
    }

    async fn refuse_cancel(
        &self,
        request_id: &str,
        status: Option<RequestStatus>,
        why: String,
        cause: &Cause,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let ev = CancellationRefused {
            event_key: format!("{request_id}:cancellation-refused:{}", cause.event_id),
            request_id: request_id.to_string(),
            status,
            reason: format!("cancellation refused: {why}"),
        };
        outbox::publish_now(self.events, &[outbound(&ev)]).await?;
        if let Ok(id) = RequestId::parse(request_id) {
            out.decisions.push(Decision::new(&id, "kept", ev.reason));
        }
        Ok(())
    }
}

/// "cancelled by the requester", with the requester's reason when it gave one.
fn requester_reason(c: &CancelRequest) -> String {
    format!(
        "cancelled by the requester{}",
        c.reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default()
    )
}

/// What [`Protocols::keep_cancel`] did.
enum Kept {
    Yes,
    /// The request moved on: read it again.
    Conflict,
    /// Nothing to keep it for: refuse it.
    No,
}
