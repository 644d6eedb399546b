//! Cancellation (ARCHITECTURE §8.3): every `Capacity Request Cancelled` is answered, Applied or
//! Refused. What is not yet bought is stopped; a purchase under way or a payment not yet taken
//! keeps the cancellation on the request until it can be decided; an id no request holds yet
//! keeps it as a tombstone for the submission on its way.

use chrono::{DateTime, Utc};

use super::{Outcome, Protocols};
use crate::decision;
use crate::decision::Decision;
use crate::domain::events::{
    CancelRequest, CancellationApplied, CancellationRefused, EventDetail, ReservationExpiring,
    ending_events, event_key, outbound,
};
use crate::domain::notices::announced;
use crate::domain::request::RequestId;
use crate::domain::reservation::Reservation;
use crate::domain::status::RequestStatus;
use crate::domain::time_rules::PAYMENT_CHECK_EVERY;
use crate::domain::window::{self, KeptWindow, Window};
use crate::outbox;
use crate::ports::{
    CancelNote, CapacityMarket, Cause, EventSink, KeepCancellation, OutboundEvent, PortError,
    RequestRecord, Store, TOMBSTONE_KEPT, Tombstone, TombstoneOutcome, Transition, WindowUpdate,
    WriteOutcome, request_named,
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
                    None,
                    format!("{:?} is not a request id", c.request_id),
                    vec![],
                    cause,
                    out,
                )
                .await;
        };
        // The windows this invocation stopped before keeping the cancellation (during a
        // purchase): its answer, when it comes, lists them.
        let mut stopped_first: Vec<KeptWindow> = Vec::new();
        for _ in 0..CANCEL_ATTEMPTS {
            let Some(rec) = request_named(self.store, &id).await? else {
                // Its submission may be on its way (EventBridge does not order deliveries):
                // a tombstone keeps the cancellation for it.
                match self.tombstone(&id, c, source, cause, now, out).await? {
                    TombstoneOutcome::RequestExists => continue,
                    TombstoneOutcome::Placed | TombstoneOutcome::DuplicateEvent => {
                        return Ok(());
                    }
                }
            };
            // The request as recorded, when the cancellation spells its id in another case.
            let id = rec.request_id.clone();
            let reason = requester_reason(c);
            if let Some(done) = self.cancel_run(&rec, &reason, cause, now, out).await? {
                if done {
                    return Ok(());
                }
                continue;
            }
            // ARCHITECTURE §9.1: a cancellation stops what is not yet bought; the paid
            // windows run on to their drain unless it asks `stop_running`.
            let held = self.store.reservations(&id).await?;
            let all = window::windows(&held, &rec.windows, self.drain_lead(&rec));
            let undrained = window::undrained_of(&all);
            let stop: &[Window] = if c.stop_running { &undrained } else { &[] };
            if rec.status.is_cancellable() {
                let kept = if c.stop_running {
                    vec![]
                } else {
                    window::listed(&undrained)
                };
                let reason = if stop.is_empty() {
                    reason
                } else {
                    format!("{reason}; {}", stopping(stop))
                };
                let live = held
                    .iter()
                    .filter(|r| r.state.is_live())
                    .map(|r| r.id.clone())
                    .collect();
                let mut answers = ending_events(
                    &rec,
                    RequestStatus::Cancelled,
                    &reason,
                    live,
                    kept,
                    rec.spent,
                );
                with_stopped(&mut answers, stop);
                answers.extend(expiring(&rec, stop, now));
                let mut t =
                    Transition::of(&rec, RequestStatus::Cancelled, &reason, None, now, cause)
                        .with_outbox(answers);
                if !stop.is_empty() {
                    t = t.with_windows(window::records_stopping(&rec.windows, &all, stop, now));
                }
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
            if let Some(keep) = self.keepable(&rec, &held, now) {
                if !stop.is_empty() && !window::FOLLOWS_WINDOWS.contains(&rec.status) {
                    // During a purchase, the windows bought already (a split's kept block)
                    // are stopped now; the cancellation is then kept for what is being
                    // bought, as a plain one is. A `Reserved` request's windows are stopped
                    // when the payment it waits for is taken (payment.rs): stopping them now
                    // would end the payment checks that only a `Reserved` request gets.
                    match self
                        .stop_windows(&rec, &all, stop, None, cause, now, out)
                        .await?
                    {
                        WriteOutcome::Applied { .. } => {
                            stopped_first = window::listed(stop);
                            continue;
                        }
                        WriteOutcome::DuplicateEvent => {}
                        _ => continue,
                    }
                }
                let note = CancelNote {
                    reason: reason.clone(),
                    at: now,
                    event_id: cause.event_id.clone(),
                    found: None,
                    stop_running: c.stop_running,
                    stopped: stopped_first.clone(),
                };
                match self.keep_cancel(&rec, keep, note, cause, now, out).await? {
                    Kept::Yes => return Ok(()),
                    Kept::Conflict => continue,
                }
            }
            if !stop.is_empty() {
                let answer = Answer {
                    reason: &reason,
                    status_before: rec.status,
                    stopped_before: &[],
                };
                match self
                    .stop_windows(&rec, &all, stop, Some(answer), cause, now, out)
                    .await?
                {
                    WriteOutcome::Applied { .. } | WriteOutcome::DuplicateEvent => return Ok(()),
                    _ => continue,
                }
            }
            // A second delivery of a cancellation this request already applied (EventBridge
            // delivers at least once) is not answered again: a Refused after its Applied
            // would contradict it.
            if self.applied_already(&id, cause).await? {
                out.decisions.push(Decision::new(
                    &id,
                    "duplicate",
                    format!(
                        "cancellation event {} was applied already; its answer stands",
                        cause.event_id
                    ),
                ));
                return Ok(());
            }
            let kept = window::listed(&undrained);
            let why = if kept.is_empty() {
                format!(
                    "the request is {} and nothing is left to stop: no search, no purchase \
                     not yet made, and no paid window not yet drained (stop_running would \
                     stop nothing either)",
                    rec.status
                )
            } else {
                format!(
                    "the request is {} and purchases cannot be undone: nothing is left to \
                     search for or buy, and its paid windows run on to their drain ({}); send \
                     the cancellation again with stop_running: true to stop them now",
                    rec.status,
                    window::describe(&kept)
                )
            };
            return self
                .refuse_cancel(
                    id.as_str(),
                    Some(rec.team.as_str()),
                    Some(rec.status),
                    why,
                    kept,
                    cause,
                    out,
                )
                .await;
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
            // A spot run falling back (ARCHITECTURE §9.1): nothing is bought yet, so the
            // cancellation is kept and applied when the run is settled, in the fall-back's
            // place.
            RequestStatus::Draining => {
                rec.cancel.is_none()
                    && rec.open_debit.is_some()
                    && rec.run.as_ref().is_some_and(|r| r.fall_back.is_some())
            }
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
            stop_running: false,
            stopped: vec![],
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
            kept_windows: vec![],
            stopped_windows: vec![],
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
            .put_tombstone(t, vec![announced(None, &applied)])
            .await?;
        if placed == TombstoneOutcome::Placed {
            out.decisions.push(Decision::new(id, "tombstone", reason));
        }
        Ok(placed)
    }

    /// ARCHITECTURE §8.3: a cancellation during `Purchasing`, or while a bought reservation's
    /// payment is not yet taken, is kept on the request: applied if the purchase does not
    /// complete or the payment fails, refused once the payment is taken (or, with
    /// `stop_running`, applied then by stopping the windows). `None` when there is nothing
    /// to keep it for.
    fn keepable(
        &self,
        rec: &RequestRecord,
        held: &[Reservation],
        now: DateTime<Utc>,
    ) -> Option<Keep> {
        match rec.status {
            RequestStatus::Purchasing => Some(Keep {
                what: "a purchase is under way: the cancellation is applied if it does not \
                       complete"
                    .to_string(),
                next: rec.next_action_at,
            }),
            RequestStatus::Reserved => {
                let unpaid: Vec<&str> = held
                    .iter()
                    .filter(|r| r.state.is_live() && !r.state.is_settled())
                    .map(|r| r.id.as_str())
                    .collect();
                if unpaid.is_empty() {
                    return None;
                }
                Some(Keep {
                    what: format!(
                        "the payment for {} is not yet taken: the cancellation is applied if \
                         it fails, and refused once it is taken",
                        unpaid.join(", ")
                    ),
                    // Read again soon, whatever the payment checks had planned.
                    next: Some(
                        rec.next_action_at
                            .map_or(now, |t| t.min(now + PAYMENT_CHECK_EVERY)),
                    ),
                })
            }
            // A cancelled on-demand run being stopped and settled.
            RequestStatus::Draining if rec.run.is_some() && rec.cancel.is_some() => Some(Keep {
                what: "the on-demand run is being stopped and settled".to_string(),
                next: rec.next_action_at,
            }),
            _ => None,
        }
    }

    /// Keeps the cancellation on `rec` for [`Self::keepable`]'s `keep`. Its answer comes
    /// when it is decided; one already kept answers a later one too.
    #[allow(clippy::too_many_arguments)]
    async fn keep_cancel(
        &self,
        rec: &RequestRecord,
        keep: Keep,
        note: CancelNote,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Kept, PortError> {
        let id = &rec.request_id;
        let Keep { what, next } = keep;
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
        let reason = format!("{}; {}, kept: {what}", rec.reason, note.reason);
        let k = KeepCancellation {
            request_id: id.clone(),
            expected_version: rec.version,
            status: rec.status,
            note: Some(note),
            reason,
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

    /// ARCHITECTURE §9.1: `stop_running` hands each of `stop` to the ordinary drain now:
    /// marked `Stopping` and due at once, its `Capacity Reservation Expiring` published, so
    /// cleanup stops what runs in it, publishes `Capacity Workload Drained` and ends it; no
    /// launch or replacement starts into it again. With `answer`, the write answers the
    /// cancellation (`Capacity Cancellation Applied` listing what it stopped).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn stop_windows(
        &self,
        rec: &RequestRecord,
        all: &[Window],
        stop: &[Window],
        answer: Option<Answer<'_>>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<WriteOutcome, PortError> {
        let what = stopping(stop);
        let mut outbox = Vec::new();
        let reason = match &answer {
            Some(a) => {
                let reason = format!("{}; {what}", a.reason);
                outbox.push(announced(
                    Some(rec.team.as_str()),
                    &CancellationApplied {
                        event_key: event_key(rec.whose(), "cancellation-applied", rec.version + 1),
                        request_id: rec.request_id.to_string(),
                        status_before: Some(a.status_before),
                        reason: reason.clone(),
                        kept_windows: vec![],
                        stopped_windows: a
                            .stopped_before
                            .iter()
                            .cloned()
                            .chain(window::listed(stop))
                            .collect(),
                    },
                ));
                reason
            }
            None => what.clone(),
        };
        outbox.extend(expiring(rec, stop, now));
        let u = WindowUpdate::of(
            rec,
            window::records_stopping(&rec.windows, all, stop, now),
            &format!("{}; {reason}", rec.reason),
            now,
            &cause.step("stop-running"),
            outbox,
        );
        let w = self.store.update_windows(u).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&w, "stop-running"),
            reason,
        ));
        Ok(w)
    }

    /// Whether a write caused by this cancellation event (or one of its steps) is in the
    /// request's history. Read only on the way to a refusal.
    #[allow(clippy::too_many_arguments)]
    async fn refuse_cancel(
        &self,
        request_id: &str,
        team: Option<&str>,
        status: Option<RequestStatus>,
        why: String,
        kept_windows: Vec<KeptWindow>,
        cause: &Cause,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let ev = CancellationRefused {
            event_key: format!("{request_id}:cancellation-refused:{}", cause.event_id),
            request_id: request_id.to_string(),
            status,
            reason: format!("cancellation refused: {why}"),
            kept_windows,
        };
        outbox::publish_now(self.events, &[announced(team, &ev)]).await?;
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
}

/// Why a cancellation is kept on its request, and when the request is next read.
struct Keep {
    what: String,
    next: Option<DateTime<Utc>>,
}

/// What a `stop_running` write answers: the cancellation's reason and the status it found.
pub(crate) struct Answer<'a> {
    pub reason: &'a str,
    pub status_before: RequestStatus,
    /// What it stopped before (kept, and applied now): listed first.
    pub stopped_before: &'a [KeptWindow],
}

/// "stopping window 1 (cr-1, running) drains at …": what `stop_running` stops.
fn stopping(stop: &[Window]) -> String {
    format!(
        "stop_running: stopping now, through the ordinary drain, {}",
        window::describe(&window::listed(stop))
    )
    .replace("drains at", "which would have drained at")
}

/// The `Capacity Cancellation Applied` among `answers` lists the windows it stopped.
fn with_stopped(answers: &mut [OutboundEvent], stop: &[Window]) {
    if stop.is_empty() {
        return;
    }
    let listed = serde_json::to_value(window::listed(stop)).expect("windows serialize");
    for a in answers
        .iter_mut()
        .filter(|a| a.detail_type == CancellationApplied::DETAIL_TYPE)
    {
        a.detail["stopped_windows"] = listed.clone();
    }
}

/// Each stopped window's `Capacity Reservation Expiring`, as its ordinary drain publishes it,
/// with the drain starting now.
fn expiring(rec: &RequestRecord, stop: &[Window], now: DateTime<Utc>) -> Vec<OutboundEvent> {
    stop.iter()
        .map(|w| {
            outbound(&ReservationExpiring {
                event_key: event_key(
                    rec.whose(),
                    &format!("expiring-w{}", w.number),
                    rec.version + 1,
                ),
                request_id: rec.request_id.to_string(),
                reservation_ids: vec![w.reservation.id.clone()],
                segment: w.number,
                ends_at: w.end(),
                drain_starts_at: now.min(w.drain_at),
                forced_termination_at: w.forced_at,
            })
        })
        .collect()
}
