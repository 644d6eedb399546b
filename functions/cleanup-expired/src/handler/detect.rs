//! The detector of unrecorded reservations (ARCHITECTURE §9.1, review N5/M1): hourly per
//! region, everything AWS lists for this deployment, blocks by tag and plans by name, matched
//! here as reconciliation matches it, is compared with what the table records. A live
//! reservation of this deployment that no request records (a purchase recorded nowhere, a
//! block AWS listed long after its purchase, a table restored from an older backup) is
//! announced as `Capacity Reservation Unrecorded`, with the log line an alarm watches: the
//! money may be spent and uncounted, so a person must look. A request buying, or ended with
//! a purchase in doubt, reconciles its own and is left to it.
//!
//! Each region's next run is an item in the `work` index, claimed by a conditional write, so
//! one invocation runs it however many run at once. A process plants the items it does not
//! find on its first scheduled tick.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

use capacity_pilot::domain::events::ReservationUnrecorded;
use capacity_pilot::domain::notices::announced;
use capacity_pilot::domain::request::RequestId;
use capacity_pilot::domain::reservation::Reservation;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::ports::{
    Agenda, CapacityMarket, Clock, EventSink, PortError, Store, Workloads, request_named,
};
use chrono::{DateTime, Duration, Utc};
use tracing::warn;

use super::{Cleaner, Decision, Outcome};

/// How often each region is looked at.
pub const DETECT_EVERY: Duration = Duration::hours(1);

/// Whether this process has planted its regions' detector items: the first scheduled tick
/// writes each one it does not find (a conditional write that leaves an existing one alone),
/// later ticks only run those the `work` index shows due.
#[derive(Debug, Default)]
pub struct Planted(AtomicBool);

impl Planted {
    fn is_done(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub(super) fn done(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl<S: Store, M: CapacityMarket, W: Workloads, E: EventSink, C: Clock> Cleaner<S, M, W, E, C> {
    /// Runs `region`'s detector if it is due (or was never planted) and this invocation
    /// claims it.
    pub(super) async fn detect(
        &self,
        region: &str,
        agenda: Option<&Agenda>,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let seen = agenda
            .and_then(|a| a.detectors.iter().find(|d| d.region == region))
            .map(|d| d.at);
        if seen.is_none() && self.planted.is_done() {
            return Ok(());
        }
        if !self
            .store
            .claim_detector(region, seen, now + DETECT_EVERY)
            .await?
        {
            return Ok(());
        }
        let deployment = self.config.deployment_id.as_str();
        let mut by_request: BTreeMap<RequestId, Vec<Reservation>> = BTreeMap::new();
        let listed = self.market.find_by_deployment(region, deployment).await?;
        let count = listed.len();
        for r in listed {
            // Matched here too, not only by AWS's filter (aws-reference §11.1).
            if !r.state.is_live() || r.deployment_tag.as_deref() != Some(deployment) {
                continue;
            }
            let Some(id) = r
                .request_tag
                .as_deref()
                .and_then(|t| RequestId::parse(t).ok())
            else {
                continue;
            };
            by_request.entry(id).or_default().push(r);
        }
        let mut events = Vec::new();
        let (mut left, mut live) = (0, 0);
        for (id, listed) in by_request {
            live += listed.len();
            // (A plan's name carries its request's id lower-cased: the request may spell it
            // otherwise.)
            let rec = request_named(&self.store, &id).await?;
            let id = rec.as_ref().map_or(id, |r| r.request_id.clone());
            // Its own purchase reconciles it: the lease holder records what it bought, and a
            // purchase in doubt is reconciled hourly by the purchase function.
            if rec
                .as_ref()
                .is_some_and(|r| r.status == RequestStatus::Purchasing || r.in_doubt())
            {
                left += listed.len();
                continue;
            }
            let recorded: BTreeSet<String> = match &rec {
                Some(_) => self
                    .store
                    .reservations(&id)
                    .await?
                    .into_iter()
                    .map(|r| r.id)
                    .collect(),
                None => BTreeSet::new(),
            };
            for r in listed.into_iter().filter(|r| !recorded.contains(&r.id)) {
                let reason = format!(
                    "{} ({} x {} in {}, {} to {}, {}, ${}) is tagged for request {id} of \
                     deployment {deployment}, and {}: found by the hourly detector; its fee \
                     may be spent and uncounted, so a person must look",
                    r.id,
                    r.instance_count,
                    r.instance_type,
                    r.region,
                    r.start(),
                    r.end(),
                    r.state,
                    r.upfront_fee,
                    match &rec {
                        Some(x) => format!("the request ({}) does not record it", x.status),
                        None => "no request of that id is in the table".to_string(),
                    }
                );
                warn!(alert = "reservation-unrecorded", request_id = %id, reservation_id = %r.id, "{reason}");
                events.push(announced(
                    rec.as_ref().map(|x| x.team.as_str()),
                    &ReservationUnrecorded::of(id.as_str(), &r, reason.clone()),
                ));
                out.decisions
                    .push(Decision::new(&id, "reservation-unrecorded", reason));
            }
        }
        // The run itself is a decision: what was looked at, and what it came to.
        out.decisions.push(Decision::about(
            &format!("detector:{region}"),
            "detected",
            format!(
                "AWS lists {count} reservation(s) of deployment {deployment} in {region}, {live} \
                 live; {} recorded by no request (announced), {left} left to their request's \
                 own reconciliation; next look at {}",
                events.len(),
                now + DETECT_EVERY
            ),
        ));
        if events.is_empty() {
            return Ok(());
        }
        let report = self.events.publish(&events).await?;
        match report.failed.first() {
            // The next hour's run announces it again.
            Some((key, code, message)) => Err(PortError::Transient {
                service: "events",
                code: code.clone(),
                message: format!("{key} was not published: {message}"),
            }),
            None => Ok(()),
        }
    }
}
