//! The event contract: the events we publish (source `capacity-pilot`) and the custom
//! events we consume besides requests. Each type derives its JSON Schema; the schemas are
//! checked in under `infra/events/schemas/` and a test fails when they drift.
//!
//! Every published detail carries `event_key`, stable across re-publication, so consumers
//! can drop duplicates, and `producer_version`, the capacity-pilot version that wrote it;
//! money is a decimal string in USD.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::money::{MicroUsd, Usd};
use super::offering::Product;
use super::planner::{Plan, Rejection};
use super::request::{FieldError, Strategy, WorkloadKind};
use super::reservation::ReservationState;
use super::status::RequestStatus;
use super::window::KeptWindow;

/// The `source` of every event we publish.
pub const SOURCE: &str = "capacity-pilot";

/// The `producer_version` in every published detail: the version of the code that wrote the
/// event (an event waiting in the outbox across an upgrade keeps the version that wrote it).
pub const PRODUCER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The detail field naming [`PRODUCER_VERSION`].
pub const PRODUCER_VERSION_FIELD: &str = "producer_version";

/// The schemas of what we consume, not publish (no `producer_version`).
pub const CONSUMED: [&str; 4] = [
    "capacity-request-submitted",
    "capacity-request-cancelled",
    "capacity-purchase-decision",
    "capacity-extension-requested",
];

/// Inbound detail-types on our bus.
pub mod inbound {
    pub const REQUEST_SUBMITTED: &str = "Capacity Request Submitted";
    pub const REQUEST_CANCELLED: &str = "Capacity Request Cancelled";
    pub const PURCHASE_APPROVED: &str = "Capacity Purchase Approved";
    pub const PURCHASE_REJECTED: &str = "Capacity Purchase Rejected";
    pub const EXTENSION_REQUESTED: &str = "Capacity Extension Requested";
}

/// A published event's detail: its detail-type comes with it.
pub trait EventDetail: Serialize + JsonSchema {
    const DETAIL_TYPE: &'static str;
    fn event_key(&self) -> &str;
}

macro_rules! detail {
    ($ty:ident, $name:literal) => {
        impl EventDetail for $ty {
            const DETAIL_TYPE: &'static str = $name;
            fn event_key(&self) -> &str {
                &self.event_key
            }
        }
    };
}

/// A plan as events describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PlanSummary {
    pub offering_ids: Vec<String>,
    pub product: Product,
    pub region: String,
    pub instance_type: String,
    pub instance_count: u32,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub segments: usize,
    pub upfront_fee_usd: Usd,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand_cost_usd: Option<Usd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saving_usd: Option<Usd>,
    pub reason: String,
}

impl From<&Plan> for PlanSummary {
    fn from(p: &Plan) -> Self {
        PlanSummary {
            offering_ids: p.offering_ids().into_iter().map(String::from).collect(),
            product: p.product,
            region: p.region.clone(),
            instance_type: p.instance_type.clone(),
            instance_count: p.instance_count,
            start: p.start,
            end: p.end,
            segments: p.segments,
            upfront_fee_usd: p.upfront_fee,
            on_demand_cost_usd: p.on_demand_cost,
            saving_usd: p.saving,
            reason: p.reason.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RequestAccepted {
    pub event_key: String,
    pub request_id: String,
    pub team: String,
    pub strategy: Strategy,
    pub workload_kind: WorkloadKind,
    /// After this the request fails if nothing feasible was found.
    pub search_deadline: DateTime<Utc>,
}
detail!(RequestAccepted, "Capacity Request Accepted");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RequestRejected {
    pub event_key: String,
    /// Absent when the request id itself could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The inbound event's source and id, so the sender can match the rejection.
    pub source: String,
    pub event_id: String,
    /// Every field at fault.
    pub problems: Vec<FieldError>,
}
detail!(RequestRejected, "Capacity Request Rejected");

/// At most this many rejections are listed in an event; the rest are counted in
/// `rejections_omitted`, so no search's answer nears EventBridge's 256 KB entry limit (a
/// region's catalogue can hold hundreds of offerings).
pub const MAX_REJECTIONS_LISTED: usize = 50;

/// The largest event detail we write to the outbox, in bytes of JSON: an entry must fit
/// EventBridge's 256 KB with its envelope, and the outbox item DynamoDB's 400 KB. A larger
/// one is refused at the write, named, instead of blocking the outbox at publish time.
pub const MAX_DETAIL_BYTES: usize = 200 * 1024;

/// The first [`MAX_REJECTIONS_LISTED`] of `all`, and how many were left out.
pub fn bounded_rejections(all: &[Rejection]) -> (Vec<Rejection>, usize) {
    let listed: Vec<Rejection> = all.iter().take(MAX_REJECTIONS_LISTED).cloned().collect();
    let omitted = all.len() - listed.len();
    (listed, omitted)
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OfferingsFound {
    pub event_key: String,
    pub request_id: String,
    /// The chosen plan first.
    pub plans: Vec<PlanSummary>,
    /// At most [`MAX_REJECTIONS_LISTED`].
    pub rejections: Vec<Rejection>,
    /// How many rejections were not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rejections_omitted: usize,
}
detail!(OfferingsFound, "Capacity Offerings Found");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NotFound {
    pub event_key: String,
    pub request_id: String,
    pub reason: String,
    pub next_search_at: DateTime<Utc>,
    pub search_deadline: DateTime<Utc>,
    /// At most [`MAX_REJECTIONS_LISTED`].
    pub rejections: Vec<Rejection>,
    /// How many rejections were not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rejections_omitted: usize,
}
detail!(NotFound, "Capacity Not Found");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AwaitingApproval {
    /// `<request>:awaiting-approval:<what>:v<n>`: `<what>` binds it to what it would let be
    /// spent (a plan's offerings and fee, or a hold's kind and estimate), `v<n>` to this
    /// asking, so a plan that comes back to approval is announced afresh (review N11). A
    /// decision names this key, or its part before `:v<n>`.
    pub event_key: String,
    pub request_id: String,
    pub team: String,
    /// What waits for approval: a reservation's purchase (`plan`), or an on-demand or spot
    /// hold (`hold`).
    #[serde(default)]
    pub kind: ApprovalKind,
    /// The reservation's upfront fee, or the hold's estimate: what is debited once approved.
    pub upfront_fee_usd: Usd,
    /// The threshold that applies: the lower of the request's and the deployment's.
    pub approval_above_usd: Usd,
    /// What the request has spent before this fee: the threshold is on the two together.
    #[serde(default)]
    pub spent_usd: Usd,
    /// The plan to buy, for a reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanSummary>,
    /// The run to hold, for on-demand or spot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<HoldSummary>,
}

/// What an approval would let be spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalKind {
    /// A capacity block or training plan, bought upfront.
    #[default]
    Reservation,
    /// An on-demand run, its estimate held against the caps and settled by what ran.
    OnDemand,
    /// A spot run, likewise.
    Spot,
}

impl ApprovalKind {
    /// The kind of a hold's attempt (`on-demand` or `spot`).
    pub fn of_attempt(attempt: &str) -> ApprovalKind {
        if attempt == crate::ports::SPOT {
            ApprovalKind::Spot
        } else {
            ApprovalKind::OnDemand
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::Reservation => "reservation",
            ApprovalKind::OnDemand => "on-demand",
            ApprovalKind::Spot => "spot",
        }
    }
}

/// An on-demand or spot run awaiting approval, as events describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HoldSummary {
    pub instance_type: String,
    pub instance_count: u32,
    pub duration_hours: u32,
    /// Where it would run, in the order tried.
    pub regions: Vec<String>,
    /// The price table's estimate for the whole run: count x hours x hourly price.
    pub estimate_usd: Usd,
}
detail!(AwaitingApproval, "Capacity Purchase Awaiting Approval");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Reserved {
    pub event_key: String,
    pub request_id: String,
    pub reservation_ids: Vec<String>,
    pub product: Product,
    pub region: String,
    pub instance_type: String,
    pub instance_count: u32,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub upfront_fee_usd: Usd,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand_cost_usd: Option<Usd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saving_usd: Option<Usd>,
    /// True when an existing tagged reservation was adopted instead of buying.
    pub adopted: bool,
}
detail!(Reserved, "Capacity Reserved");

/// AWS did not take the payment for a reservation we bought (`payment-failed`, up to 12 h
/// after a block's purchase), or it never came to be (`failed`; a training plan's `Failed`):
/// its debit is returned and, while the search deadline allows, the request searches again
/// (ARCHITECTURE §8.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PaymentFailed {
    pub event_key: String,
    pub request_id: String,
    pub reservation_id: String,
    pub product: Product,
    pub region: String,
    /// The state AWS reports: `payment-failed` or `failed`.
    pub state: ReservationState,
    pub upfront_fee_usd: Usd,
    /// What went back to the team's budget and the request's `max_upfront_usd`.
    pub returned_usd: Usd,
    /// Whether the request searches again (otherwise it is failed, or keeps what else it
    /// holds).
    pub searching_again: bool,
    pub reason: String,
}
detail!(PaymentFailed, "Capacity Payment Failed");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkloadLaunched {
    pub event_key: String,
    pub request_id: String,
    /// The reservation, or `on-demand` / `spot`.
    pub reservation_id: String,
    pub segment: u32,
    pub workload_kind: WorkloadKind,
    /// Instance ids, the job name, `cluster/group` or the endpoint name.
    pub resource_ids: Vec<String>,
    pub planned_start: DateTime<Utc>,
    pub launched_at: DateTime<Utc>,
    /// Estimated spend debited for on-demand and spot launches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_cost_usd: Option<Usd>,
    /// Minutes between the planned start and the launch, when more than the activation
    /// bound (15 min, ARCHITECTURE §8.10): the block became usable late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_delay_minutes: Option<i64>,
}
detail!(WorkloadLaunched, "Capacity Workload Launched");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InstanceReplaced {
    pub event_key: String,
    pub request_id: String,
    pub reservation_id: String,
    pub replaced_instance_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_instance_id: Option<String>,
    pub generation: u32,
    pub reason: String,
}
detail!(InstanceReplaced, "Capacity Instance Replaced");

/// EC2 has scheduled maintenance that keeps an instance of a request's running window (a
/// reboot, system maintenance: AWS Health `scheduledChange`, review N16): announced, not
/// acted on. A reboot keeps the instance and its instance store; replacing it would lose
/// both. (A retirement or stop is acted on instead: the instance is replaced
/// `SCHEDULED_CHANGE_LEAD` before it, if that comes before the window's drain.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InstanceMaintenanceScheduled {
    pub event_key: String,
    pub request_id: String,
    pub instance_id: String,
    /// The Health event's `eventTypeCode`, e.g. `AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED`.
    pub code: String,
    /// When the maintenance may start and must end by, as the Health event says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<DateTime<Utc>>,
    pub reason: String,
}
detail!(
    InstanceMaintenanceScheduled,
    "Capacity Instance Maintenance Scheduled"
);

/// A spot run's instance reclaimed by EC2 (ARCHITECTURE §9.1): repaired on spot while the
/// run has replacements left; else left down, and the run falls back as `on-demand-first`
/// does (stopped, settled by what ran, the request searching for a reservation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkloadInterrupted {
    pub event_key: String,
    pub request_id: String,
    /// `spot`: the run's attempt.
    pub reservation_id: String,
    pub slot: u32,
    pub instance_id: String,
    /// When it was first seen not running (a state-change event's time, or the tick that
    /// found it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted_at: Option<DateTime<Utc>>,
    /// The spot instance launched in its place; none when it was not replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement_instance_id: Option<String>,
    /// The run could not be repaired (past `MAX_REPLACEMENTS_PER_RESERVATION`, or more than
    /// `MAX_UNHEALTHY_SHARE` of it lost at once): it is stopped and settled by what its
    /// instances ran, and the request searches for the earliest feasible reservation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub falls_back: bool,
    /// What happens to the run now, in words.
    pub reason: String,
}
detail!(WorkloadInterrupted, "Capacity Workload Interrupted");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReservationExpiring {
    pub event_key: String,
    pub request_id: String,
    pub reservation_ids: Vec<String>,
    pub segment: u32,
    pub ends_at: DateTime<Utc>,
    pub drain_starts_at: DateTime<Utc>,
    pub forced_termination_at: DateTime<Utc>,
}
detail!(ReservationExpiring, "Capacity Reservation Expiring");

/// A window opens soon (ARCHITECTURE §9.2): published `lead_minutes` before `opens_at`, for
/// each lead the deployment configures (24 h and 1 h by default), so the people waiting for
/// it can get ready. Late (`late: true`) when the lead passed while the function that sends it
/// was down and the window has not opened yet; not sent at all when the lead's moment came
/// before the reservation was bought.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WindowOpening {
    /// `<request>:window-<n>:opening-<lead>m<salt>`: one per window and lead.
    pub event_key: String,
    pub request_id: String,
    /// The window's number among the request's windows.
    pub window: u32,
    pub reservation_id: String,
    pub product: Product,
    pub region: String,
    pub instance_type: String,
    pub instance_count: u32,
    pub opens_at: DateTime<Utc>,
    /// When its drain starts: what runs in it is stopped then.
    pub drain_at: DateTime<Utc>,
    pub lead_minutes: u32,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub late: bool,
}
detail!(WindowOpening, "Capacity Window Opening");

/// A window's drain comes soon (ARCHITECTURE §9.2): published `lead_minutes` before
/// `drain_at`, for each lead the deployment configures (24 h and 13 h by default, and the
/// checkpoint notice 1 h before), so the job can checkpoint, or an extension be asked for while
/// one can be. Unlike `Capacity Reservation Expiring`, which comes with the drain, this one
/// comes while there is time to act.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReservationEnding {
    /// `<request>:window-<n>:ending-<lead>m:ends-<end><salt>`: one per window, lead and end
    /// (an end AWS moves gets notices of its own).
    pub event_key: String,
    pub request_id: String,
    pub window: u32,
    pub reservation_id: String,
    pub product: Product,
    pub region: String,
    /// When the drain starts: what runs in the window is stopped then.
    pub drain_at: DateTime<Utc>,
    /// When the reservation's window ends.
    pub ends_at: DateTime<Utc>,
    pub lead_minutes: u32,
    /// The last notice before the drain: checkpoint now.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint: bool,
    /// Whether an extension of the reservation can be asked for (`capacity-pilot extend`, or
    /// `Capacity Extension Requested`): the request has an `extend` policy, the window ends
    /// its reservation, and the payment lead before the drain has not passed.
    pub extendable: bool,
    /// Until when an extension can be asked for, when `extendable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extend_by: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub late: bool,
}
detail!(ReservationEnding, "Capacity Reservation Ending");

/// A window's end moved later (ARCHITECTURE §9.3): its reservation was extended. `external`
/// when the extension was bought outside capacity-pilot (in the console, by the API): capacity-pilot
/// saw the new end when it read the reservation back, and its fee is not capacity-pilot's and
/// never counted against a budget. The drain, the Ending notices and the instances'
/// `capacity-pilot:drain-at` follow the new end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReservationExtended {
    /// `<request>:window-<n>:extended:ends-<end><salt>`: one per window and end.
    pub event_key: String,
    pub request_id: String,
    pub window: u32,
    pub reservation_id: String,
    pub product: Product,
    pub region: String,
    /// The end before.
    pub previous_ends_at: DateTime<Utc>,
    /// The end AWS now reports.
    pub ends_at: DateTime<Utc>,
    /// When the drain now starts.
    pub drain_at: DateTime<Utc>,
    /// Bought outside capacity-pilot: its fee is not counted.
    pub external: bool,
}
detail!(ReservationExtended, "Capacity Reservation Extended");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkloadDrained {
    pub event_key: String,
    pub request_id: String,
    pub reservation_id: String,
    pub segment: u32,
    pub resource_ids: Vec<String>,
    pub drained_at: DateTime<Utc>,
    pub forced_termination_at: DateTime<Utc>,
    /// The drain came at or after the forced termination (cleanup did not run in the whole
    /// drain interval): AWS may have stopped the workload first, and `reason` says so.
    #[serde(default)]
    pub late: bool,
    /// Why it drained when it did: the reason recorded with the drain.
    #[serde(default)]
    pub reason: String,
}
detail!(WorkloadDrained, "Capacity Workload Drained");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReservationEnded {
    pub event_key: String,
    pub request_id: String,
    pub reservation_ids: Vec<String>,
    pub ended_at: DateTime<Utc>,
    /// What was cleaned up: endpoints, configs, orphaned instances.
    pub cleaned_up: Vec<String>,
    pub spent_usd: Usd,
}
detail!(ReservationEnded, "Capacity Reservation Ended");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RequestFailed {
    pub event_key: String,
    pub request_id: String,
    pub status_before: RequestStatus,
    pub reason: String,
    /// Anything bought before the failure (e.g. the first half of a split).
    pub reservation_ids: Vec<String>,
    pub spent_usd: Usd,
    /// The paid windows not yet drained: each runs on to its `drain_at` (ARCHITECTURE §9.1).
    #[serde(default)]
    pub kept_windows: Vec<KeptWindow>,
}
detail!(RequestFailed, "Capacity Request Failed");

/// A cancellation was applied: the request is `Cancelled` (ARCHITECTURE §8.3: every
/// cancellation gets an answer). Without `status_before`, no request of the id was recorded
/// yet: a tombstone keeps the cancellation 7 days, and a submission of the id from the same
/// source in that time is recorded cancelled (with `Capacity Request Failed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancellationApplied {
    pub event_key: String,
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_before: Option<RequestStatus>,
    pub reason: String,
    /// The paid windows the cancellation leaves running to their drain: it stops only what
    /// is not yet bought.
    #[serde(default)]
    pub kept_windows: Vec<KeptWindow>,
    /// The windows a cancellation with `stop_running` stopped: each is drained now.
    #[serde(default)]
    pub stopped_windows: Vec<KeptWindow>,
}
detail!(CancellationApplied, "Capacity Cancellation Applied");

/// A cancellation was not applied, with why: the request is past the point where it can be
/// (bought, running), or no request of that id is recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancellationRefused {
    pub event_key: String,
    pub request_id: String,
    /// The request's status; none when no request of that id is recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RequestStatus>,
    pub reason: String,
    /// The paid windows that run on to their drain (a cancellation with `stop_running`
    /// stops them).
    #[serde(default)]
    pub kept_windows: Vec<KeptWindow>,
}
detail!(CancellationRefused, "Capacity Cancellation Refused");

/// `Capacity Request Cancelled` (inbound).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Also stop the paid windows now, through their ordinary drain. Without it a
    /// cancellation stops only what is not yet bought, and bought windows run to their drain.
    #[serde(default, skip_serializing_if = "is_false")]
    pub stop_running: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `Capacity Purchase Approved` / `Capacity Purchase Rejected` (inbound).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PurchaseDecision {
    pub request_id: String,
    pub approver: String,
    /// The `event_key` of the `Capacity Purchase Awaiting Approval` this answers
    /// (ARCHITECTURE §8.2). Required: a decision without it, or for a plan no longer
    /// awaiting, gets `Capacity Purchase Approval Refused` and buys nothing. (Read as
    /// optional so that its absence is answered, not rejected as malformed.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approves: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// `Capacity Extension Requested` (inbound, from the request's own source): extend the
/// request's reservation by `hours` (ARCHITECTURE §9.3). Its `extend` policy bounds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtensionRequest {
    pub request_id: String,
    /// Whole days given as hours (24, 48, ...; beyond 14 days whole weeks).
    pub hours: u32,
    /// Which of its reservations; by default the one whose window ends last among those not
    /// yet drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
}

/// What an extension is, as its events describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExtensionSummary {
    /// The extension's number among its reservation's extensions, from 1.
    pub extension: u32,
    pub reservation_id: String,
    pub product: Product,
    pub region: String,
    /// The window that ends with the reservation.
    pub window: u32,
    pub offering_id: String,
    pub hours: u32,
    /// The reservation's end now, and once extended.
    pub ends_at: DateTime<Utc>,
    pub extended_ends_at: DateTime<Utc>,
    pub upfront_fee_usd: Usd,
    /// `requested` (the team asked) or `workload-running` (the policy, the workload running).
    pub asked_by: String,
}

/// An extension was priced (ARCHITECTURE §9.3): AWS's offering for the hours asked, within
/// the request's `extend` policy. It is bought next, or waits for an approver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExtensionOffered {
    /// `<request>:extension-<reservation>-<n>:offered<salt>`.
    pub event_key: String,
    pub request_id: String,
    #[serde(flatten)]
    pub extension: ExtensionSummary,
    /// Whether an approver must answer first.
    pub needs_approval: bool,
    /// No purchase after this: the window's drain less the payment lead.
    pub buy_by: DateTime<Utc>,
}
detail!(ExtensionOffered, "Capacity Extension Offered");

/// An extension's fee takes the request above its approval threshold: bought only once an
/// approver answers with `Capacity Purchase Approved {approves: event_key}` before `buy_by`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExtensionAwaitingApproval {
    /// `<request>:extension-<reservation>-<n>:awaiting-approval<salt>`: what a decision names.
    pub event_key: String,
    pub request_id: String,
    pub team: String,
    #[serde(flatten)]
    pub extension: ExtensionSummary,
    /// The threshold that applies: the lower of the request's and the deployment's.
    pub approval_above_usd: Usd,
    /// What the request has spent before this fee.
    pub spent_usd: Usd,
    /// An approval after this is refused.
    pub buy_by: DateTime<Utc>,
}
detail!(
    ExtensionAwaitingApproval,
    "Capacity Extension Awaiting Approval"
);

/// An extension asked for was not bought, or its payment failed (ARCHITECTURE §9.3): the
/// reservation keeps its end and its drain, and what was debited for it went back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExtensionFailed {
    /// `<request>:extension-<reservation>-<n>:failed<salt>`, or, for an ask refused before
    /// it was priced, `<request>:extension-refused:<event id>`.
    pub event_key: String,
    pub request_id: String,
    /// The extension, once it was priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension: Option<ExtensionSummary>,
    /// The hours asked for.
    pub hours: u32,
    /// In words: `past the payment lead`, over `extend.max_hours` or `max_upfront_usd`,
    /// no offering, rejected by an approver, its payment failed...
    pub reason: String,
    /// What went back to the team's budget and the request's caps.
    pub returned_usd: Usd,
}
detail!(ExtensionFailed, "Capacity Extension Failed");

/// A live reservation tagged for a request of this deployment that no plan of the request
/// accounted for (another offering, count or time), adopted and debited past the team's or
/// the request's cap (ARCHITECTURE §8.6): the money was already spent, so a person must look.
/// The purchase function's `reservation-unrecorded` log line feeds the metric an alarm
/// watches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReservationUnrecorded {
    pub event_key: String,
    pub request_id: String,
    pub reservation_id: String,
    pub product: Product,
    pub region: String,
    pub state: ReservationState,
    pub instance_type: String,
    pub instance_count: u32,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub reason: String,
}
detail!(ReservationUnrecorded, "Capacity Reservation Unrecorded");

impl ReservationUnrecorded {
    /// The announcement of `r`, tagged for request `request_id`, with why; keyed by the
    /// request and the reservation, so each is one event however often it is announced.
    pub fn of(
        request_id: &str,
        r: &super::reservation::Reservation,
        reason: String,
    ) -> ReservationUnrecorded {
        ReservationUnrecorded {
            event_key: format!("{request_id}:reservation-unrecorded:{}", r.id),
            request_id: request_id.to_string(),
            reservation_id: r.id.clone(),
            product: r.product,
            region: r.region.clone(),
            state: r.state,
            instance_type: r.instance_type.clone(),
            instance_count: r.instance_count,
            start: r.start(),
            end: r.end(),
            reason,
        }
    }
}

/// A purchase that called AWS and could not be reconciled by its request's purchase deadline
/// (ARCHITECTURE §9.1): AWS may have sold `offering_ids` and not let us see it. The request
/// fails with its debit kept, and is reconciled hourly until the offerings end; what is then
/// found is served as its window and announced as `Capacity Reservation Unrecorded`. The
/// purchase function's `purchase-in-doubt` log line feeds the metric an alarm watches: a
/// person should check the account's reservations and bill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PurchaseInDoubt {
    pub event_key: String,
    pub request_id: String,
    /// The offerings called and not recorded.
    pub offering_ids: Vec<String>,
    /// The latest purchase call: the doubt stands from here.
    pub since: DateTime<Utc>,
    /// When the hourly reconciliation stops: the latest end of the doubted offerings.
    pub reconciled_until: DateTime<Utc>,
    /// The debit kept for what may have been bought.
    pub kept_usd: Usd,
    pub reason: String,
}
detail!(PurchaseInDoubt, "Capacity Purchase In Doubt");

/// A `Capacity Purchase Approved` or `… Rejected` that answers no plan awaiting approval
/// now: its `approves` is missing, or names an earlier plan (a late or redelivered
/// decision after a re-search), or the request is no longer awaiting one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRefused {
    pub event_key: String,
    pub request_id: String,
    pub reason: String,
    /// What a decision must name now: the `event_key` of the Awaiting Approval it answers
    /// without its asking (`:v<n>`), which names the plan or hold; none when nothing awaits
    /// approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_event_key: Option<String>,
}
detail!(ApprovalRefused, "Capacity Purchase Approval Refused");

/// What an approval of `plan` names: `<request>:awaiting-approval:<hash>`, the hash of the
/// plan's offerings and fee, so an approval names exactly what it lets be bought, and a
/// re-search that chose another plan makes an earlier approval stale. The event's key adds
/// the asking ([`asked_key`]).
pub fn awaiting_approval_key(request_id: &str, plan: &Plan) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for id in plan.offering_ids() {
        h.update(id.as_bytes());
        h.update([0]);
    }
    h.update(plan.upfront_fee.to_string().as_bytes());
    let digest = hex::encode(h.finalize());
    format!("{request_id}:awaiting-approval:{}", &digest[..16])
}

/// What an approval of an on-demand or spot hold names: its kind and estimate.
pub fn hold_approval_key(request_id: &str, kind: ApprovalKind, estimate: Usd) -> String {
    use sha2::{Digest, Sha256};
    let digest = hex::encode(Sha256::digest(
        format!("{}\0{estimate}", kind.as_str()).as_bytes(),
    ));
    format!(
        "{request_id}:awaiting-approval:{}-{}",
        kind.as_str(),
        &digest[..16]
    )
}

/// The `event_key` of the `Capacity Purchase Awaiting Approval` asking for `approves`
/// ([`awaiting_approval_key`], [`hold_approval_key`]) in the write of `version`: unique to
/// each asking (review N11: a de-duplicating approver dropped a plan that came back).
pub fn asked_key(approves: &str, whose: Whose<'_>, version: u64) -> String {
    format!("{approves}:v{version}{}", whose.salt())
}

/// Whether a decision naming `named` answers what `approves` names: the asking's key
/// ([`asked_key`], any asking: the same plan or hold, approved once, stays approved) or
/// `approves` itself (as keys were before they carried the asking).
pub fn names(named: &str, approves: &str) -> bool {
    named == approves
        || named
            .strip_prefix(approves)
            .and_then(|rest| rest.strip_prefix(":v"))
            .is_some_and(|rest| {
                // `<version>` or `<version>:c<salt>`
                let (n, salt) = rest.split_once(":c").unwrap_or((rest, "0"));
                [n, salt]
                    .iter()
                    .all(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
}

/// Every schema we check in: file stem -> schema. Each published one requires
/// `producer_version`, which [`outbound`] adds to every detail.
pub fn schemas() -> Vec<(&'static str, schemars::Schema)> {
    let mut all = declared_schemas();
    for (stem, schema) in &mut all {
        if CONSUMED.contains(stem) {
            continue;
        }
        let o = schema.ensure_object();
        if let Some(serde_json::Value::Object(props)) = o.get_mut("properties") {
            props.insert(
                PRODUCER_VERSION_FIELD.into(),
                serde_json::json!({
                    "description": "The capacity-pilot version that wrote this event (semver).",
                    "type": "string"
                }),
            );
        }
        if let Some(serde_json::Value::Array(r)) = o.get_mut("required") {
            r.push(PRODUCER_VERSION_FIELD.into());
        }
    }
    all
}

fn declared_schemas() -> Vec<(&'static str, schemars::Schema)> {
    use schemars::schema_for;
    vec![
        ("capacity-request-submitted", {
            let mut s = schema_for!(super::request::RequestDetail);
            super::request::require_per_kind(&mut s);
            s
        }),
        ("capacity-request-cancelled", schema_for!(CancelRequest)),
        ("capacity-purchase-decision", {
            // Required in the contract, though read leniently (see the field).
            let mut s = schema_for!(PurchaseDecision);
            if let Some(serde_json::Value::Array(r)) = s.ensure_object().get_mut("required") {
                r.push("approves".into());
            }
            s
        }),
        ("capacity-request-accepted", schema_for!(RequestAccepted)),
        ("capacity-request-rejected", schema_for!(RequestRejected)),
        ("capacity-offerings-found", schema_for!(OfferingsFound)),
        ("capacity-not-found", schema_for!(NotFound)),
        (
            "capacity-purchase-awaiting-approval",
            schema_for!(AwaitingApproval),
        ),
        ("capacity-reserved", schema_for!(Reserved)),
        (
            "capacity-purchase-approval-refused",
            schema_for!(ApprovalRefused),
        ),
        (
            "capacity-reservation-unrecorded",
            schema_for!(ReservationUnrecorded),
        ),
        ("capacity-purchase-in-doubt", schema_for!(PurchaseInDoubt)),
        (
            "capacity-cancellation-applied",
            schema_for!(CancellationApplied),
        ),
        (
            "capacity-cancellation-refused",
            schema_for!(CancellationRefused),
        ),
        ("capacity-payment-failed", schema_for!(PaymentFailed)),
        ("capacity-workload-launched", schema_for!(WorkloadLaunched)),
        ("capacity-instance-replaced", schema_for!(InstanceReplaced)),
        (
            "capacity-instance-maintenance-scheduled",
            schema_for!(InstanceMaintenanceScheduled),
        ),
        (
            "capacity-workload-interrupted",
            schema_for!(WorkloadInterrupted),
        ),
        (
            "capacity-reservation-expiring",
            schema_for!(ReservationExpiring),
        ),
        ("capacity-workload-drained", schema_for!(WorkloadDrained)),
        ("capacity-reservation-ended", schema_for!(ReservationEnded)),
        ("capacity-request-failed", schema_for!(RequestFailed)),
        ("capacity-window-opening", schema_for!(WindowOpening)),
        (
            "capacity-reservation-ending",
            schema_for!(ReservationEnding),
        ),
        (
            "capacity-reservation-extended",
            schema_for!(ReservationExtended),
        ),
        (
            "capacity-extension-requested",
            schema_for!(ExtensionRequest),
        ),
        ("capacity-extension-offered", schema_for!(ExtensionOffered)),
        (
            "capacity-extension-awaiting-approval",
            schema_for!(ExtensionAwaitingApproval),
        ),
        ("capacity-extension-failed", schema_for!(ExtensionFailed)),
    ]
}

/// Wraps a detail for the outbox, with [`PRODUCER_VERSION`]: the one place a published
/// detail is written.
pub fn outbound<D: EventDetail>(detail: &D) -> crate::ports::OutboundEvent {
    let mut value = serde_json::to_value(detail).expect("event details serialize");
    if let serde_json::Value::Object(m) = &mut value {
        m.insert(PRODUCER_VERSION_FIELD.into(), PRODUCER_VERSION.into());
    }
    crate::ports::OutboundEvent {
        event_key: detail.event_key().to_string(),
        detail_type: D::DETAIL_TYPE.to_string(),
        detail: value,
        notice: None,
    }
}

/// Refuses an event whose detail is over [`MAX_DETAIL_BYTES`]: the stores call it before
/// writing one to the outbox.
pub fn check_size(e: &crate::ports::OutboundEvent) -> Result<(), crate::ports::PortError> {
    let size = e.detail.to_string().len();
    if size > MAX_DETAIL_BYTES {
        return Err(crate::ports::PortError::Permanent {
            service: "store",
            code: "EventTooLarge".into(),
            message: format!(
                "{} {} is {size} bytes of detail; at most {MAX_DETAIL_BYTES} are written",
                e.detail_type, e.event_key
            ),
        });
    }
    Ok(())
}

/// The answers of `rec` ending in `to` (`Cancelled` or `Failed`) with the write that makes
/// its next version: a cancellation's `Capacity Cancellation Applied`, then `Capacity
/// Request Failed` with what it keeps and what stays spent.
pub fn ending_events(
    rec: &crate::ports::RequestRecord,
    to: RequestStatus,
    reason: &str,
    kept: Vec<String>,
    kept_windows: Vec<KeptWindow>,
    spent: MicroUsd,
) -> Vec<crate::ports::OutboundEvent> {
    let (id, version) = (rec.request_id.as_str(), rec.version + 1);
    let whose = rec.whose();
    // A cancellation applied later than it came answers with the status it found.
    let before = rec
        .cancel
        .as_ref()
        .and_then(|c| c.found)
        .unwrap_or(rec.status);
    let cancelled = to == RequestStatus::Cancelled;
    let mut out = Vec::new();
    let team = Some(rec.team.as_str());
    if cancelled {
        out.push(super::notices::announced(
            team,
            &CancellationApplied {
                event_key: event_key(whose, "cancellation-applied", version),
                request_id: id.to_string(),
                status_before: Some(before),
                reason: reason.to_string(),
                kept_windows: kept_windows.clone(),
                // What a kept cancellation with `stop_running` stopped when it came.
                stopped_windows: rec
                    .cancel
                    .as_ref()
                    .map(|c| c.stopped.clone())
                    .unwrap_or_default(),
            },
        ));
    }
    // A cancellation is told once, by its Cancellation Applied.
    let failed = RequestFailed {
        event_key: event_key(
            whose,
            if cancelled { "cancelled" } else { "failed" },
            version,
        ),
        request_id: id.to_string(),
        status_before: before,
        reason: reason.to_string(),
        reservation_ids: kept,
        spent_usd: spent.to_usd(),
        kept_windows,
    };
    out.push(if cancelled {
        outbound(&failed)
    } else {
        super::notices::announced(team, &failed)
    });
    out
}

/// A stable, unique key for an event caused by the write that produces `version`.
pub fn event_key(whose: Whose<'_>, what: &str, version: u64) -> String {
    format!("{}:{what}:v{version}{}", whose.request_id, whose.salt())
}

/// Whose events a key names: a request, in the incarnation it was created in (its META
/// `created_at`). An id reused once the earlier request's items expired (the archive TTL)
/// starts its versions at 1 again: the salt keeps its keys apart from the earlier request's,
/// which a consumer dropping duplicates would otherwise take its events for (review N14).
#[derive(Debug, Clone, Copy)]
pub struct Whose<'a> {
    pub request_id: &'a str,
    pub created_at: DateTime<Utc>,
}

impl Whose<'_> {
    /// `:c<seconds since the epoch of its creation>`.
    pub fn salt(&self) -> String {
        format!(":c{}", self.created_at.timestamp())
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    fn rejection(i: usize) -> Rejection {
        Rejection {
            offering_id: format!("cb-{i:04}"),
            region: "us-east-1".into(),
            reason: "starts after the window's latest start by 3 days".repeat(4),
        }
    }

    #[test]
    fn a_search_over_hundreds_of_offerings_lists_a_bounded_number_of_rejections() {
        let all: Vec<Rejection> = (0..2000).map(rejection).collect();
        let (listed, omitted) = bounded_rejections(&all);
        let ev = outbound(&NotFound {
            event_key: "r1:not-found:v3".into(),
            request_id: "r1".into(),
            reason: "none".into(),
            next_search_at: chrono::Utc::now(),
            search_deadline: chrono::Utc::now(),
            rejections: listed,
            rejections_omitted: omitted,
        });
        assert_eq!(
            ev.detail["rejections"].as_array().unwrap().len(),
            MAX_REJECTIONS_LISTED
        );
        assert_eq!(
            ev.detail["rejections_omitted"],
            2000 - MAX_REJECTIONS_LISTED
        );
        assert!(check_size(&ev).is_ok());
        // AND all of them would not have fit: the write refuses such an event, named
        let whole = outbound(&NotFound {
            event_key: "r1:not-found:v3".into(),
            request_id: "r1".into(),
            reason: "none".into(),
            next_search_at: chrono::Utc::now(),
            search_deadline: chrono::Utc::now(),
            rejections: all,
            rejections_omitted: 0,
        });
        let err = check_size(&whole).unwrap_err();
        assert_eq!(err.code(), Some("EventTooLarge"));
    }
}

#[cfg(test)]
mod key_tests {
    use chrono::{Duration, TimeZone, Utc};

    use super::{Whose, asked_key, event_key, names};

    #[test]
    fn a_request_id_reused_after_its_archive_gets_keys_of_its_own() {
        // GIVEN request r1, archived 90 days after it was created, and a new r1 after that
        let first = Utc.with_ymd_and_hms(2026, 9, 1, 9, 0, 0).unwrap();
        let again = first + Duration::days(91);
        let old = Whose {
            request_id: "r1",
            created_at: first,
        };
        let new = Whose {
            request_id: "r1",
            created_at: again,
        };
        // THEN its versions start at 1 again, and its keys still differ from the old
        // request's (review N14: a de-duplicating consumer dropped them)
        assert_ne!(event_key(old, "accepted", 1), event_key(new, "accepted", 1));
        assert_ne!(
            asked_key("r1:awaiting-approval:0123456789abcdef", old, 4),
            asked_key("r1:awaiting-approval:0123456789abcdef", new, 4)
        );
        // AND within one request a key is what it was on every retry
        assert_eq!(event_key(new, "accepted", 1), event_key(new, "accepted", 1));
    }

    #[test]
    fn a_decision_names_an_asking_by_its_whole_key_or_its_plan_part_and_nothing_else() {
        let base = "r1:awaiting-approval:0123456789abcdef";
        let whose = Whose {
            request_id: "r1",
            created_at: Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap(),
        };
        assert!(names(&asked_key(base, whose, 4), base));
        assert!(names(base, base));
        assert!(names(&format!("{base}:v4"), base), "a key before the salt");
        for other in [
            format!("{base}0:v4"),
            format!("{base}:v"),
            format!("{base}:v4:c"),
            format!("{base}:v4:x1"),
            format!("{base}:vx"),
            "r1:awaiting-approval:fedcba9876543210:v4".to_string(),
        ] {
            assert!(!names(&other, base), "{other}");
        }
    }
}
