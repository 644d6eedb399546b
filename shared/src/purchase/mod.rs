//! The purchase protocols (ARCHITECTURE §5, §8.2-8.7), one module each, as the workload kinds
//! have theirs in [`crate::workload`]: purchase-capacity's handler decides which wake-up goes
//! to which protocol; these decide what is bought, kept, refused and given back. Another
//! function reuses a protocol through [`Protocols`], built from its own ports.
//!
//! - [`cancel`]: every cancellation answered, applied, kept or refused (§8.3);
//! - [`approval`]: the approval gate and the approvers' decisions (§8.2);
//! - [`protocol`]: the exactly-once purchase: lease and debit, doubt, reconciliation, strays,
//!   release (§5, §8.6, §8.7);
//! - [`preflight`]: the plan about to be bought checked to launch, dry run included (§8.1);
//! - [`payment`]: a bought reservation read again until its payment is taken (§8.5);
//! - [`doubt`]: a purchase that called AWS and could not be reconciled by its deadline, ended
//!   with its debit kept and reconciled hourly (§9.1);
//! - [`pause`]: what a request held back by an operator's pause is told (§9.7);
//! - [`extension`]: a reservation's extension, asked, priced, approved, bought once under its
//!   lease and debit, reconciled and read until paid (§9.3).

pub mod approval;
pub mod cancel;
pub mod doubt;
pub mod extension;
pub mod pause;
pub mod payment;
pub mod preflight;
pub mod protocol;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::Config;
use crate::decision::{self, Decision};
use crate::domain::request::RequestId;
use crate::domain::status::RequestStatus;
use crate::domain::window::{self, DrainLead, KeptWindow};
use crate::ports::{Cause, PortError, RequestRecord, SharedIds, Sleep, Store, Transition};

/// What one invocation decided, and how many events it published.
#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub decisions: Vec<Decision>,
    pub published: usize,
}

/// The ports the protocols work with, borrowed from the function that runs them for one
/// invocation. The clock is not among them: each wake-up reads it once and hands its `now`
/// to every step.
pub struct Protocols<'a, S, M, E> {
    pub store: &'a S,
    pub market: &'a M,
    pub events: &'a E,
    pub config: &'a Config,
    /// Lease tokens.
    pub ids: &'a SharedIds,
    /// Between throttled purchase attempts.
    pub sleep: &'a Sleep,
}

impl<S: Store, M, E> Protocols<'_, S, M, E> {
    /// The reservations a request keeps, as the table has them: those still live (a split's
    /// bought block among them), and its windows not yet drained, which run on to their
    /// drain whatever becomes of it (ARCHITECTURE §9.1). What an ending request reports with
    /// what stays spent.
    pub(crate) async fn kept(
        &self,
        rec: &RequestRecord,
    ) -> Result<(Vec<String>, Vec<KeptWindow>), PortError> {
        let held = self.store.reservations(&rec.request_id).await?;
        let windows = window::kept(&held, &rec.windows, self.drain_lead(rec));
        let ids = held
            .into_iter()
            .filter(|r| r.state.is_live())
            .map(|r| r.id)
            .collect();
        Ok((ids, windows))
    }

    /// Whether an inbound event (`cause`) was applied to request `id` already: a write of its
    /// own or of one of its steps is in the request's history. A second delivery of it
    /// (EventBridge delivers at least once) is not answered again: a refusal after what it
    /// did would contradict it (review N12).
    pub(crate) async fn applied_already(
        &self,
        id: &RequestId,
        cause: &Cause,
    ) -> Result<bool, PortError> {
        let step = format!("{}#", cause.event_id);
        Ok(self
            .store
            .history(id)
            .await?
            .iter()
            .any(|h| h.cause == cause.event_id || h.cause.starts_with(&step)))
    }

    /// The drain lead of `rec`'s windows.
    pub(crate) fn drain_lead(&self, rec: &RequestRecord) -> DrainLead {
        DrainLead::of(&rec.request, self.config.default_drain_minutes)
    }

    /// The request searches again, for `reason`: the plan it was to buy can no longer be
    /// bought (none is recorded, it starts too soon, or its approval did not come in time).
    pub(crate) async fn search_again(
        &self,
        rec: &RequestRecord,
        reason: &str,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let w = self
            .store
            .transition(Transition::of(
                rec,
                RequestStatus::Searching,
                reason,
                Some(now),
                now,
                cause,
            ))
            .await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&w, "re-search"),
            reason,
        ));
        Ok(())
    }
}
