//! The request life cycle as a type: which status may follow which.
//!
//! Every write to a request goes through [`RequestStatus::transition`], so an illegal jump
//! (buying for a cancelled request, launching before a reservation) is an error before it
//! is a bug.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum RequestStatus {
    /// Validated and recorded.
    Accepted,
    /// Looking for reservation offerings.
    Searching,
    /// Nothing feasible yet; searching again on the schedule until the search deadline.
    NotFound,
    /// Candidates recorded; the purchase step decides.
    OfferingsFound,
    /// Above the approval threshold; waiting for an approver.
    AwaitingApproval,
    /// A worker holds the purchase lease and the budget is debited.
    Purchasing,
    /// Bought; waiting for a window to open (also between segments).
    Reserved,
    /// The workload runs in an open window.
    Active,
    /// Warning and stopping the workload ahead of AWS's forced termination.
    Draining,
    /// `on-demand-first`: trying to launch on demand (or spot) before reserving.
    TryingOnDemand,
    RunningOnDemand,
    RunningSpot,
    // Terminal states. Each is recorded with a reason.
    /// `mode: plan` (ARCHITECTURE §8.1): searched and planned, its plans announced; nothing
    /// bought or debited. Its id may be submitted again (to execute, or to plan again).
    Planned,
    Ended,
    Rejected,
    Cancelled,
    Failed,
}

use RequestStatus::*;

/// A transition the life cycle does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition {from} -> {to}")]
pub struct IllegalTransition {
    pub from: RequestStatus,
    pub to: RequestStatus,
}

impl RequestStatus {
    pub const ALL: [RequestStatus; 17] = [
        Accepted,
        Searching,
        NotFound,
        OfferingsFound,
        AwaitingApproval,
        Purchasing,
        Reserved,
        Active,
        Draining,
        TryingOnDemand,
        RunningOnDemand,
        RunningSpot,
        Planned,
        Ended,
        Rejected,
        Cancelled,
        Failed,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(self, Planned | Ended | Rejected | Cancelled | Failed)
    }

    /// A cancellation is honoured until money is committed.
    pub fn is_cancellable(self) -> bool {
        matches!(
            self,
            Accepted | Searching | NotFound | OfferingsFound | AwaitingApproval | TryingOnDemand
        )
    }

    /// The statuses that may follow `self`.
    pub fn successors(self) -> &'static [RequestStatus] {
        match self {
            Accepted => &[Searching, TryingOnDemand, Cancelled, Failed],
            // Searching -> Searching: a search round waiting on some of its queries.
            // Searching, NotFound -> Planned: a `mode: plan` request's round decided.
            Searching => &[
                Searching,
                OfferingsFound,
                NotFound,
                Planned,
                Cancelled,
                Failed,
            ],
            // NotFound -> NotFound: a retry that found nothing again, with a new next look.
            NotFound => &[
                NotFound,
                Searching,
                OfferingsFound,
                Planned,
                Cancelled,
                Failed,
            ],
            // Back to Searching when the chosen offering has gone.
            // OfferingsFound -> OfferingsFound: candidates dropped by the pre-flight.
            OfferingsFound => &[
                OfferingsFound,
                AwaitingApproval,
                Purchasing,
                Searching,
                Planned,
                Cancelled,
                Failed,
            ],
            // AwaitingApproval -> TryingOnDemand: an on-demand or spot hold approved (N9).
            // OfferingsFound, AwaitingApproval -> Planned: `PurchaseMode` plan-only.
            // AwaitingApproval -> OfferingsFound: the plan awaiting approval was dropped by
            // the pre-flight; the next is gated afresh.
            AwaitingApproval => &[
                OfferingsFound,
                Purchasing,
                TryingOnDemand,
                Searching,
                Planned,
                Rejected,
                Cancelled,
                Failed,
            ],
            // Purchasing -> Purchasing: a second worker takes over an expired lease.
            // Purchasing -> Searching: reconciled, nothing bought, the offering has gone.
            // Purchasing -> Cancelled: a kept cancellation, the purchase not completed.
            Purchasing => &[Purchasing, Reserved, Searching, Cancelled, Failed],
            // Reserved -> Searching: payment failed and the block was released.
            // Reserved -> Reserved: a payment check records what AWS reports now.
            // Reserved -> Cancelled: a kept cancellation, the payment failed.
            Reserved => &[
                Reserved, Active, Draining, Searching, Cancelled, Ended, Failed,
            ],
            // Active -> Reserved: between the segments of a split plan.
            // Active, Draining -> Searching: a later block's payment failed, and the request
            // searches again for what it lost while its windows run on (ARCHITECTURE §9.1).
            Active => &[Draining, Reserved, Searching, Ended, Failed],
            // Draining -> Active: the next window opened before the drained one ended.
            // Draining -> Cancelled: a cancelled on-demand run, stopped and settled.
            // Draining -> Searching: also a spot run that could not be repaired, stopped and
            // settled, falling back to a reservation (ARCHITECTURE §9.1).
            Draining => &[Active, Reserved, Searching, Ended, Cancelled, Failed],
            // TryingOnDemand -> Searching: no on-demand capacity; fall back to a reservation.
            // TryingOnDemand -> TryingOnDemand holds or releases an on-demand estimate.
            // TryingOnDemand -> Draining: cancelled while an estimate is held (something may
            // be starting), so it is stopped and settled before the answer.
            // TryingOnDemand -> AwaitingApproval: a hold above the approval threshold.
            TryingOnDemand => &[
                TryingOnDemand,
                AwaitingApproval,
                RunningOnDemand,
                RunningSpot,
                Searching,
                Draining,
                Cancelled,
                Failed,
            ],
            RunningOnDemand => &[Draining, Ended, Failed],
            // RunningSpot -> Draining: its drain, a cancellation, or its fall-back.
            RunningSpot => &[Draining, Ended, Failed],
            Planned | Ended | Rejected | Cancelled | Failed => &[],
        }
    }

    pub fn can_become(self, to: RequestStatus) -> bool {
        self.successors().contains(&to)
    }

    /// Whether a versioned write may take a request in `self` to `to`: a step of the life
    /// cycle, or a write that keeps the status (a payment check recording what AWS reports
    /// of a reservation, in any status: ARCHITECTURE §9.1), which is no step of it.
    pub fn can_write(self, to: RequestStatus) -> bool {
        self == to || self.can_become(to)
    }

    /// The checked step from `self` to `to`.
    pub fn transition(self, to: RequestStatus) -> Result<RequestStatus, IllegalTransition> {
        if self.can_become(to) {
            Ok(to)
        } else {
            Err(IllegalTransition { from: self, to })
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Accepted => "Accepted",
            Searching => "Searching",
            NotFound => "NotFound",
            OfferingsFound => "OfferingsFound",
            AwaitingApproval => "AwaitingApproval",
            Purchasing => "Purchasing",
            Reserved => "Reserved",
            Active => "Active",
            Draining => "Draining",
            TryingOnDemand => "TryingOnDemand",
            RunningOnDemand => "RunningOnDemand",
            RunningSpot => "RunningSpot",
            Planned => "Planned",
            Ended => "Ended",
            Rejected => "Rejected",
            Cancelled => "Cancelled",
            Failed => "Failed",
        }
    }

    pub fn parse(s: &str) -> Option<RequestStatus> {
        RequestStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl fmt::Display for RequestStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, VecDeque};

    #[test]
    fn terminal_states_have_no_successors() {
        for s in RequestStatus::ALL {
            assert_eq!(s.is_terminal(), s.successors().is_empty(), "{s}");
        }
    }

    #[test]
    fn every_state_is_reachable_from_accepted_and_can_reach_an_end() {
        let mut seen = BTreeSet::from([Accepted]);
        let mut queue = VecDeque::from([Accepted]);
        while let Some(s) = queue.pop_front() {
            for &n in s.successors() {
                if seen.insert(n) {
                    queue.push_back(n);
                }
            }
        }
        // Rejected is also the entry state of a request that fails validation.
        for s in RequestStatus::ALL {
            assert!(seen.contains(&s) || s == Rejected, "{s} unreachable");
            assert!(
                s.is_terminal()
                    || s.successors().iter().any(|n| n.is_terminal())
                    || s.successors()
                        .iter()
                        .any(|n| n.successors().iter().any(|m| m.is_terminal())),
                "{s} cannot end"
            );
        }
    }

    #[test]
    fn illegal_transitions_are_errors() {
        assert_eq!(
            Cancelled.transition(Purchasing),
            Err(IllegalTransition {
                from: Cancelled,
                to: Purchasing
            })
        );
        assert!(Searching.transition(Reserved).is_err());
        // A kept cancellation may end a purchase that did not complete or a reservation
        // whose payment failed (ARCHITECTURE 8.3), never one that is in use.
        assert!(
            Active.transition(Cancelled).is_err(),
            "no cancel once launched"
        );
        // Draining -> Cancelled only settles a cancelled on-demand run (cleanup-expired
        // writes it for a request without reservations, with the cancellation kept).
        assert!(RunningOnDemand.transition(Cancelled).is_err());
        assert!(RunningSpot.transition(Cancelled).is_err());
        assert_eq!(OfferingsFound.transition(Purchasing), Ok(Purchasing));
    }

    #[test]
    fn on_demand_first_falls_back_to_searching() {
        assert!(Accepted.can_become(TryingOnDemand));
        assert!(TryingOnDemand.can_become(Searching));
        assert!(TryingOnDemand.can_become(RunningSpot));
    }

    #[test]
    fn cancellation_is_honoured_until_purchase_and_after_if_the_purchase_or_payment_fails() {
        for s in RequestStatus::ALL {
            // Purchasing and Reserved only by a kept cancellation, Draining only by a
            // cancelled on-demand run's settlement (ARCHITECTURE 8.3).
            let kept = matches!(s, Purchasing | Reserved | Draining);
            assert_eq!(s.can_become(Cancelled), s.is_cancellable() || kept, "{s}");
        }
    }

    #[test]
    fn status_names_round_trip() {
        for s in RequestStatus::ALL {
            assert_eq!(RequestStatus::parse(s.as_str()), Some(s));
        }
    }
}
