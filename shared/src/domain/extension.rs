//! Extensions of a bought reservation (ARCHITECTURE §9.3): a Capacity Block extended with
//! `PurchaseCapacityBlockExtension`, a training plan with `ExtendTrainingPlan`. An extension
//! is a purchase: it is asked for (by the team's `Capacity Extension Requested`, or by the
//! request's policy while its workload still runs), priced from AWS's offering, approved when
//! the request's threshold says so, bought once under a lease with the `purchase_call`
//! marker and a debit, and then read until AWS reports its payment taken or failed.
//!
//! AWS's rules (aws-reference §2.1, §11.1, §11.2): asked for between 56 days and 1 hour
//! before the end, while the reservation is `active` or `scheduled` with no extension
//! payment pending; whole days up to 14, then whole weeks, 182 days in all; the payment can
//! take 12 hours, must clear 35 minutes before the end, and can fail, the reservation then
//! keeping its end; no idempotency token; no cancellation.
//!
//! The extension lives on its reservation's record ([`super::reservation::Reservation`]),
//! written with the request's version, so one write decides it.

use chrono::{DateTime, Duration, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::money::{MicroUsd, Usd};

/// 182 days: the most a reservation is extended by in all (AWS's rule), and the most
/// `extend.max_hours` says.
pub const MAX_EXTENSION_HOURS: u32 = 182 * 24;

/// The default `EXTENSION_PAYMENT_LEAD`: an extension is bought no later than this before
/// its window's drain, so that AWS's payment (up to 12 hours) clears before it.
pub const DEFAULT_PAYMENT_LEAD_MINUTES: u32 = 12 * 60;

/// How often an extension whose payment is pending is read again.
pub const PAYMENT_READ_EVERY: Duration = Duration::minutes(10);

/// How long an extension's lease lasts: one invocation's purchase call and its writes.
pub const LEASE: Duration = Duration::minutes(5);

/// When a request's extensions are bought (`extend.when`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ExtendWhen {
    /// Only when the team asks (`Capacity Extension Requested`, or `capacity-pilot extend`).
    Requested,
    /// Also, once the first Ending notice is out, by a day at a time while the workload still
    /// runs (instances running, a job in progress or queued, an endpoint in service).
    WorkloadRunning,
}

impl ExtendWhen {
    pub fn as_str(self) -> &'static str {
        match self {
            ExtendWhen::Requested => "requested",
            ExtendWhen::WorkloadRunning => "workload-running",
        }
    }
}

/// Request field `extend`: whether and how far the request's reservations may be extended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendPolicy {
    /// `requested` (only when the team asks) or `workload-running` (also while the workload
    /// still runs near the end).
    pub when: ExtendWhen,
    /// The most hours all extensions of the request add together (at most 4368, 182 days).
    pub max_hours: u32,
    /// The most all extensions of the request cost together, as a decimal string; counted
    /// on top of `budget.max_upfront_usd`.
    pub max_upfront_usd: Usd,
}

/// Why `hours` is not a duration AWS extends by (whole days up to 14, then whole weeks up to
/// 182 days), or `None` when it is.
pub fn hours_problem(hours: u32) -> Option<String> {
    if hours == 0 || !hours.is_multiple_of(24) {
        return Some(format!(
            "an extension is whole days given as hours (24, 48, ...), got {hours}"
        ));
    }
    if hours > 14 * 24 && !hours.is_multiple_of(7 * 24) {
        return Some(format!(
            "beyond 14 days an extension is whole weeks (504, 672, ... hours), got {hours}"
        ));
    }
    if hours > MAX_EXTENSION_HOURS {
        return Some(format!(
            "at most {MAX_EXTENSION_HOURS} hours (182 days), got {hours}"
        ));
    }
    None
}

/// What AWS offers to extend a reservation by (`DescribeCapacityBlockExtensionOfferings`,
/// `SearchTrainingPlanOfferings` with the plan's ARN).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExtensionOffer {
    /// `cbe-...` for a block, `tpeo-...` for a plan.
    pub offering_id: String,
    pub hours: u32,
    /// The reservation's end as the offering extends it.
    pub starts_at: DateTime<Utc>,
    /// Its end once extended.
    pub ends_at: DateTime<Utc>,
    pub fee: Usd,
}

/// An extension's payment, as AWS reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ExtensionPayment {
    Pending,
    Succeeded,
    Failed,
}

/// An extension as AWS lists it (`DescribeCapacityBlockExtensionHistory`,
/// `DescribeTrainingPlanExtensionHistory`, and each purchase's own answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExtensionSeen {
    pub offering_id: String,
    pub hours: u32,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee: Option<Usd>,
    pub payment: ExtensionPayment,
    /// When it was bought, when AWS says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bought_at: Option<DateTime<Utc>>,
}

/// Who asked for an extension.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "by", rename_all = "kebab-case")]
pub enum Asked {
    /// The team: `Capacity Extension Requested` (its event id).
    Requested { event_id: String },
    /// The request's `extend.when: workload-running`, the workload running near the end.
    WorkloadRunning,
}

impl Asked {
    /// In the events' words (`asked_by`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Asked::Requested { .. } => "requested",
            Asked::WorkloadRunning => "workload-running",
        }
    }
}

/// Where an extension stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ExtensionState {
    /// Its fee takes the request above its approval threshold: an approver must answer the
    /// `Capacity Extension Awaiting Approval` that named it.
    AwaitingApproval,
    /// Leased and debited; bought, or about to be (its `called_at` says whether AWS was
    /// called).
    Buying,
    /// Bought; AWS has not taken the payment yet. The drain stays where it is.
    PaymentPending,
    /// Paid: the reservation ends later.
    Succeeded,
    /// Not bought, or its payment failed: any debit went back.
    Failed,
}

impl ExtensionState {
    pub fn as_str(self) -> &'static str {
        match self {
            ExtensionState::AwaitingApproval => "awaiting-approval",
            ExtensionState::Buying => "buying",
            ExtensionState::PaymentPending => "payment-pending",
            ExtensionState::Succeeded => "succeeded",
            ExtensionState::Failed => "failed",
        }
    }
}

/// One extension of a reservation, as we record it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Extension {
    /// Its number among the reservation's extensions, from 1: its events' keys carry it.
    pub number: u32,
    pub asked: Asked,
    pub asked_at: DateTime<Utc>,
    /// The offering bought, or to be bought.
    pub offer: ExtensionOffer,
    pub state: ExtensionState,
    /// Why it is in its state.
    pub reason: String,
    /// No purchase call after this: the window's drain less the payment lead.
    pub buy_by: DateTime<Utc>,
    /// When the purchase function next looks at it (a lease's expiry, a payment read, an
    /// approval's deadline); none once it is settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_at: Option<DateTime<Utc>>,
    /// The lease's token and expiry while `Buying`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<DateTime<Utc>>,
    /// The `purchase_call` marker: when AWS was about to be called (ARCHITECTURE §9.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub called_at: Option<DateTime<Utc>>,
    /// When its doubt began (its lease): an extension of the reservation AWS lists from then
    /// on, not recorded, is this one (ARCHITECTURE §8.6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doubt_since: Option<DateTime<Utc>>,
    /// The key of the `Capacity Extension Awaiting Approval` an approver answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// What was debited for it, and to which ledger: a failure gives it back there.
    #[serde(default)]
    #[schemars(with = "i64")]
    pub debited: MicroUsd,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debit_team: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debit_month: Option<String>,
}

impl Extension {
    /// Still to be decided by the purchase function: awaiting approval, buying, or its
    /// payment pending.
    pub fn is_open(&self) -> bool {
        matches!(
            self.state,
            ExtensionState::AwaitingApproval
                | ExtensionState::Buying
                | ExtensionState::PaymentPending
        )
    }

    /// Counted against `extend.max_hours` and `extend.max_upfront_usd`: every extension not
    /// failed.
    pub fn counts(&self) -> bool {
        self.state != ExtensionState::Failed
    }

    /// Whether the purchase function looks at it at `now`.
    pub fn due(&self, now: DateTime<Utc>) -> bool {
        self.is_open() && self.check_at.is_some_and(|t| t <= now)
    }

    /// Whether the extension `seen` AWS lists is this one: its offering, or, while this one
    /// is in doubt, one bought since the doubt began (`recorded`: every offering id the
    /// reservation's other extensions hold).
    pub fn is(&self, seen: &ExtensionSeen, recorded: &[&str]) -> bool {
        (seen.offering_id == self.offer.offering_id && self.bought_since(seen))
            || (self.state == ExtensionState::Buying
                && !recorded.contains(&seen.offering_id.as_str())
                && match (self.doubt_since, seen.bought_at) {
                    (Some(since), Some(at)) => at >= since - Duration::minutes(1),
                    // AWS did not say when: an unrecorded one of the same length and start.
                    (Some(_), None) => {
                        seen.hours == self.offer.hours && seen.starts_at == self.offer.starts_at
                    }
                    (None, _) => false,
                })
    }
}

impl Extension {
    /// Whether `seen` was bought no earlier than this extension's lease (a minute's slack for
    /// clocks): an earlier extension of the same offering id is another's (sources are
    /// silent on whether AWS reuses an extension offering's id; the harsher reading is that
    /// it may, and the emulator does for the same block and length).
    pub fn bought_since(&self, seen: &ExtensionSeen) -> bool {
        match (self.doubt_since.or(self.called_at), seen.bought_at) {
            (Some(since), Some(at)) => at >= since - Duration::minutes(1),
            _ => true,
        }
    }

    /// This extension among AWS's list `seen`: the latest of its offering bought since its
    /// lease.
    pub fn find_in(&self, seen: Vec<ExtensionSeen>) -> Option<ExtensionSeen> {
        seen.into_iter()
            .filter(|s| s.offering_id == self.offer.offering_id && self.bought_since(s))
            .max_by_key(|s| s.bought_at)
    }
}

/// Until when an extension of window `w`'s reservation can be asked for, with policy
/// `policy` and `payment_lead` (what `Capacity Reservation Ending` says in `extend_by`): the
/// window's drain less the payment lead, when the request has a policy, `w` ends its
/// reservation (a block, or a plan's last segment) and that moment has not passed at `now`.
pub fn ask_by(
    policy: Option<&ExtendPolicy>,
    w: &super::window::Window,
    payment_lead: Duration,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let by = w.drain_at - payment_lead;
    (policy.is_some()
        && w.last_of_reservation
        && w.reservation.product.is_reservation()
        && w.state.is_undrained()
        && now <= by)
        .then_some(by)
}

/// What a request's extensions have taken of its `extend` policy: hours and fees of those
/// not failed.
pub fn used<'a>(all: impl IntoIterator<Item = &'a Extension>) -> (u32, MicroUsd) {
    all.into_iter()
        .filter(|e| e.counts())
        .fold((0, MicroUsd(0)), |(h, m), e| {
            (
                h + e.offer.hours,
                MicroUsd(m.0 + e.offer.fee.to_micros_ceil().0),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Extension 1 of `offer`, in `state`, its call made and its doubt begun at `at`, its fee
    /// debited, next looked at `check_at`.
    fn called(
        offer: &ExtensionOffer,
        at: DateTime<Utc>,
        state: ExtensionState,
        check_at: Option<DateTime<Utc>>,
    ) -> Extension {
        Extension {
            number: 1,
            asked: Asked::WorkloadRunning,
            asked_at: at,
            offer: offer.clone(),
            state,
            reason: String::new(),
            buy_by: at + Duration::hours(6),
            check_at,
            lease_token: None,
            lease_until: None,
            called_at: Some(at),
            doubt_since: Some(at),
            approval_key: None,
            approved_by: None,
            debited: offer.fee.to_micros_ceil(),
            debit_team: None,
            debit_month: None,
        }
    }

    /// Seed 668: a team's extension by hand of the very offering capacity-pilot then bought
    /// again (its payment failed first); reading the history by offering id alone took the
    /// earlier, failed one for ours and gave back a fee AWS went on to take.
    #[test]
    fn an_extension_is_found_in_the_history_by_its_offering_bought_since_its_lease() {
        use chrono::TimeZone;
        let at = Utc.with_ymd_and_hms(2026, 12, 2, 17, 1, 0).unwrap();
        let offer = ExtensionOffer {
            offering_id: "cbe-1".into(),
            hours: 48,
            starts_at: at + Duration::days(1),
            ends_at: at + Duration::days(3),
            fee: Usd::parse("3825.98").unwrap(),
        };
        let e = called(&offer, at, ExtensionState::PaymentPending, None);
        let seen = |bought: DateTime<Utc>, payment| ExtensionSeen {
            offering_id: "cbe-1".into(),
            hours: 48,
            starts_at: offer.starts_at,
            ends_at: offer.ends_at,
            fee: Some(offer.fee),
            payment,
            bought_at: Some(bought),
        };
        let earlier = seen(at - Duration::hours(4), ExtensionPayment::Failed);
        let ours = seen(at, ExtensionPayment::Pending);
        assert_eq!(
            e.find_in(vec![earlier.clone(), ours.clone()]),
            Some(ours.clone())
        );
        assert_eq!(e.find_in(vec![earlier.clone()]), None);
        assert!(!e.is(&earlier, &[]));
        assert!(e.is(&ours, &[]));
    }

    /// Mutants of `Extension::due` and `Extension::is` the simulation left unjudged
    /// (tests/mutants/purchase.md, issue 58): only an open extension is looked at, and only
    /// once its look is due; an extension AWS lists under another offering is ours only while
    /// ours is being bought in doubt, and never one another of the reservation's extensions
    /// holds.
    #[test]
    fn only_an_open_extension_is_due_and_only_one_in_doubt_adopts_another_offering() {
        use chrono::TimeZone;
        let at = Utc.with_ymd_and_hms(2026, 12, 2, 17, 1, 0).unwrap();
        let offer = ExtensionOffer {
            offering_id: "cbe-1".into(),
            hours: 24,
            starts_at: at + Duration::days(1),
            ends_at: at + Duration::days(2),
            fee: Usd::parse("480").unwrap(),
        };
        let e = |state, check_at| called(&offer, at, state, check_at);
        let now = at + Duration::minutes(20);
        // due: open and its look has come; not before it, never once settled
        assert!(e(ExtensionState::PaymentPending, Some(now)).due(now));
        assert!(
            !e(
                ExtensionState::PaymentPending,
                Some(now + Duration::minutes(1))
            )
            .due(now)
        );
        assert!(!e(ExtensionState::PaymentPending, None).due(now));
        assert!(!e(ExtensionState::Succeeded, Some(at)).due(now));
        assert!(!e(ExtensionState::Failed, Some(at)).due(now));
        // is: another offering bought since the doubt began
        let other = ExtensionSeen {
            offering_id: "cbe-9".into(),
            hours: 24,
            starts_at: offer.starts_at,
            ends_at: offer.ends_at,
            fee: Some(offer.fee),
            payment: ExtensionPayment::Pending,
            bought_at: Some(at + Duration::minutes(1)),
        };
        assert!(e(ExtensionState::Buying, None).is(&other, &[]));
        // ... is not ours once another extension of the reservation holds it
        assert!(!e(ExtensionState::Buying, None).is(&other, &["cbe-9"]));
        // ... nor once ours is no longer being bought
        assert!(!e(ExtensionState::PaymentPending, None).is(&other, &[]));
    }

    #[test]
    fn an_extension_is_whole_days_to_two_weeks_then_whole_weeks_to_182_days() {
        for ok in [24, 48, 14 * 24, 21 * 24, 182 * 24] {
            assert_eq!(hours_problem(ok), None, "{ok}");
        }
        for bad in [0, 12, 25, 15 * 24, 183 * 24, 189 * 24] {
            assert!(hours_problem(bad).is_some(), "{bad}");
        }
    }
}

#[cfg(test)]
mod coverage {
    use crate::domain::reservation::ReservationState;
    use crate::fakes::fixtures::{block_starting, request, t0};
    use chrono::Duration;

    /// Seed 515: a block extended past the request's `latest_end` still serves the request
    /// (what it covers is counted within the window); before, `covered_by` dropped it, so a
    /// split whose other block's payment failed would have searched for what it held.
    #[test]
    fn a_reservation_extended_past_the_window_still_covers_it_within_the_window() {
        let req = request("r1", "team-a", "5000");
        let mut r = block_starting(t0() + Duration::hours(3), ReservationState::Active);
        r.instance_count = req.instance_count;
        r.segments[0].end = r.segments[0].start + Duration::hours(24);
        assert!(r.end() <= req.window.latest_end);
        assert_eq!(req.covered_by([&r]), Duration::hours(24));
        // Extended by 7 days, past latest_end (t0 + 7 days): it still serves, counted up to
        // latest_end.
        r.segments[0].end += Duration::days(7);
        assert!(r.end() > req.window.latest_end);
        assert_eq!(
            req.covered_by([&r]),
            req.window.latest_end - r.segments[0].start
        );
    }
}
