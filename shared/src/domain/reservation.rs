//! A reservation we bought (a Capacity Block's Capacity Reservation, or a training plan),
//! as the market reports it and as we record it.

use std::fmt;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::money::Usd;
use super::offering::{Product, Segment};
use super::time_rules::WindowKind;

/// The life cycle AWS reports, mapped from the EC2 (`payment-pending`, ...) and SageMaker
/// (`Pending`, ...) spellings by the adapters. ARCHITECTURE §8.5: a state is final or live;
/// final are `expired`, `cancelled`, `failed`, `payment-failed` and `unsupported`, and every
/// other state, one this build does not know included, is live: the capacity exists or may
/// still, so it is never bought again and its debit never returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ReservationState {
    PaymentPending,
    PaymentFailed,
    Scheduled,
    Active,
    Expired,
    Failed,
    Cancelled,
    Unavailable,
    /// EC2's `pending`: a fresh block has been seen in it (aws-reference §11.1).
    Pending,
    Assessing,
    Delayed,
    Cancelling,
    Unsupported,
    /// A state this build does not know; kept verbatim by the adapter's logs.
    Unknown,
}

impl ReservationState {
    /// The reservation is over for good, or never came to be.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            ReservationState::Expired
                | ReservationState::Cancelled
                | ReservationState::Failed
                | ReservationState::PaymentFailed
                | ReservationState::Unsupported
        )
    }

    /// Whether the capacity exists, or may still: every state that is not final.
    pub fn is_live(self) -> bool {
        !self.is_final()
    }

    /// Paid for and held: `scheduled` or any later state (ARCHITECTURE §8.5). A reservation
    /// is tracked after its purchase until it reaches one of these.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            ReservationState::Scheduled | ReservationState::Active | ReservationState::Expired
        )
    }

    /// AWS took no money for it: the payment was not processed (`payment-failed`) or the
    /// reservation never came to be (`failed`; a training plan's `Failed`). Its debit goes
    /// back. Other final states (`cancelled`, `unsupported`) lose the capacity without saying
    /// the fee was returned, so their debit stays.
    pub fn is_unpaid(self) -> bool {
        matches!(
            self,
            ReservationState::PaymentFailed | ReservationState::Failed
        )
    }
}

impl fmt::Display for ReservationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        f.write_str(&s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Reservation {
    /// `cr-...` for a Capacity Block, the training plan ARN for a plan.
    pub id: String,
    pub product: Product,
    pub region: String,
    pub instance_type: String,
    pub instance_count: u32,
    pub segments: Vec<Segment>,
    pub upfront_fee: Usd,
    pub state: ReservationState,
    /// The offering it was bought from, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offering_id: Option<String>,
    /// The request id tag (`capacity-pilot:request-id`), when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_tag: Option<String>,
    /// The deployment tag (`capacity-pilot:deployment`), when AWS reports tags (EC2 does;
    /// a training plan's deployment is in its name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_tag: Option<String>,
    /// UltraServer blocks have a longer forced-termination lead.
    #[serde(default)]
    pub ultraserver: bool,
    /// When we bought or adopted it (recorded by the purchase function): the listing-lag
    /// bound runs from here (ARCHITECTURE §8.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bought_at: Option<DateTime<Utc>>,
    /// The budget month (`YYYY-MM`) its debit was charged to, stamped by the store when it
    /// records the reservation; a payment failure returns the debit there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debit_month: Option<String>,
    /// The team ledger its debit was charged to (the lower-cased team, ARCHITECTURE §9.8),
    /// stamped with `debit_month`; a payment failure returns the debit there. `None` on a
    /// record written before: its debit went to the request's team exactly as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debit_team: Option<String>,
    /// When the purchase function next reads its payment (ARCHITECTURE §9.1): set while it
    /// is live and not yet scheduled, whatever its request's status; the `work` index holds
    /// its item then. None on a record written before the rule: its request's next payment
    /// check sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_check_at: Option<DateTime<Utc>>,
    /// Its extensions bought or being bought by capacity-pilot (ARCHITECTURE §9.3), oldest
    /// first; an extension bought outside it is not among them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<super::extension::Extension>,
    /// When the purchase function looks whether the workload in its last window still runs,
    /// to extend it (`extend.when: workload-running`): set by cleanup with the window's first
    /// Ending notice, cleared once looked at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_check_at: Option<DateTime<Utc>>,
}

impl Reservation {
    /// When its payment is next due a read: while it is live and not yet scheduled; or, the
    /// earlier, when an extension of it not yet settled is due a look.
    pub fn payment_due(&self) -> Option<DateTime<Utc>> {
        self.payment_check_at
            .filter(|_| self.state.is_live() && !self.state.is_settled())
            .into_iter()
            .chain(self.extension_due())
            .min()
    }

    /// When an extension of it not yet settled is next due a look, or whether its workload
    /// runs on to be extended (the purchase function's).
    pub fn extension_due(&self) -> Option<DateTime<Utc>> {
        self.extensions
            .iter()
            .filter(|e| e.is_open())
            .filter_map(|e| e.check_at)
            .chain(self.extension_check_at)
            .min()
    }

    /// Its extension not yet settled, if any (AWS takes one at a time).
    pub fn open_extension(&self) -> Option<&super::extension::Extension> {
        self.extensions.iter().find(|e| e.is_open())
    }

    /// Their ids, comma-separated, as a decision's reason names them.
    pub fn id_list<'a>(reservations: impl IntoIterator<Item = &'a Reservation>) -> String {
        reservations
            .into_iter()
            .map(|r| r.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn start(&self) -> DateTime<Utc> {
        self.segments.first().map(|s| s.start).unwrap_or_default()
    }
    pub fn end(&self) -> DateTime<Utc> {
        self.segments.last().map(|s| s.end).unwrap_or_default()
    }

    /// The forced-termination rule that applies to its windows.
    pub fn window_kind(&self) -> WindowKind {
        WindowKind::of(self.product, self.ultraserver)
    }

    /// This recorded reservation with the times AWS reports in `seen` (ARCHITECTURE §9.3: a
    /// window's end is what AWS reports), when they moved: an extension bought in the console
    /// or by the API moves the last end, or adds a segment. `None` when nothing moved, or when
    /// `seen` cannot say: AWS reports it final (it is drained and ended as recorded), or not
    /// yet settled (an unpaid plan reports its whole window as one segment), or with fewer
    /// segments, or a segment starting elsewhere (not an extension: the record stands). A
    /// move of less than a minute is none (AWS's times are to the second).
    pub fn read_back(&self, seen: &Reservation) -> Option<Reservation> {
        if seen.id != self.id
            || !seen.state.is_settled()
            || seen.state.is_final()
            || seen.segments.len() < self.segments.len()
        {
            return None;
        }
        let mut segments = Vec::with_capacity(seen.segments.len());
        let mut moved = seen.segments.len() > self.segments.len();
        for (i, s) in seen.segments.iter().enumerate() {
            match self.segments.get(i) {
                Some(r) if r.start != s.start => return None,
                Some(r) => {
                    if (s.end - r.end).num_seconds().abs() >= 60 {
                        moved = true;
                        segments.push(Segment {
                            end: s.end,
                            ..r.clone()
                        });
                    } else {
                        segments.push(r.clone());
                    }
                }
                None => segments.push(s.clone()),
            }
        }
        moved.then(|| Reservation {
            segments,
            ..self.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::fixtures::block_starting;
    use chrono::TimeZone;

    #[test]
    fn a_payment_is_due_a_read_only_while_it_is_live_and_not_yet_scheduled() {
        let at = Utc.with_ymd_and_hms(2026, 12, 5, 10, 0, 0).unwrap();
        let mut r = block_starting(at, ReservationState::PaymentPending);
        r.payment_check_at = Some(at);
        assert_eq!(r.payment_due(), Some(at));
        // A check time left on a record AWS has since settled or ended is not due.
        for state in [
            ReservationState::Scheduled,
            ReservationState::Active,
            ReservationState::PaymentFailed,
            ReservationState::Cancelled,
        ] {
            r.state = state;
            assert_eq!(r.payment_due(), None, "{state}");
        }
    }
}
