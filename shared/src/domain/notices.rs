//! What people are told (ARCHITECTURE §9.2). A notice goes with the event it tells of: the
//! outbox publishes it to the notices topic with SNS `Publish`, under the event's
//! `event_key`, as a plain-text body people read, a subject, and the message attributes
//! `team`, `detail_type` and `request_id`, so a team subscribes with a filter policy.
//!
//! Two sorts: those of what a request did (rejected, awaiting approval, reserved, launched,
//! failed, ...), rendered from the event's detail when the event is written; and the
//! lead-time notices, `Capacity Window Opening` and `Capacity Reservation Ending`, due at a
//! configured lead before a window opens or drains ([`plan_leads`]).

use chrono::{DateTime, Duration, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::events::{
    ApprovalKind, ApprovalRefused, AwaitingApproval, CancellationApplied, CancellationRefused,
    EventDetail, ExtensionAwaitingApproval, ExtensionFailed, ExtensionOffered, ExtensionSummary,
    NotFound, PaymentFailed, PurchaseInDoubt, RequestFailed, RequestRejected, ReservationEnding,
    ReservationExtended, ReservationUnrecorded, Reserved, WindowOpening, WorkloadDrained,
    WorkloadInterrupted, WorkloadLaunched, outbound,
};
use super::window::{KeptWindow, Window, WindowState, describe};
use crate::ports::OutboundEvent;

/// The message attribute naming the request's team: a team's subscription filters on it.
pub const TEAM_ATTRIBUTE: &str = "team";
/// The message attribute naming the event's detail-type.
pub const DETAIL_TYPE_ATTRIBUTE: &str = "detail_type";
/// The message attribute naming the request.
pub const REQUEST_ID_ATTRIBUTE: &str = "request_id";

/// SNS takes a subject "less than 100 characters" (its API reference), ASCII on one line: at
/// most 99 (a subject of exactly 100 found by the simulation, seed 121, was refused and kept
/// its event in the outbox).
pub const MAX_SUBJECT_CHARS: usize = 99;

/// What the notices topic is told of one event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// One line of printable ASCII, at most [`MAX_SUBJECT_CHARS`]: an email's subject.
    pub subject: String,
    /// Plain text: what happened, to which request, and the command to run next.
    pub body: String,
    /// The request's team; none when the request could not be read (a malformed one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    pub detail_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl Notice {
    /// Its message attributes, each a String: `team`, `detail_type`, `request_id` (those
    /// known).
    pub fn attributes(&self) -> Vec<(&'static str, &str)> {
        // SNS refuses an empty String attribute: one with nothing to say is left out.
        [
            (TEAM_ATTRIBUTE, self.team.as_deref()),
            (DETAIL_TYPE_ATTRIBUTE, Some(self.detail_type.as_str())),
            (REQUEST_ID_ATTRIBUTE, self.request_id.as_deref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.filter(|v| !v.trim().is_empty()).map(|v| (k, v)))
        .collect()
    }
}

/// An event people are told of: its request, and its subject and body (none when this one is
/// not told, such as a drain on time).
pub trait Announce: EventDetail {
    fn request(&self) -> Option<&str>;
    fn text(&self) -> Option<(String, String)>;
}

/// `detail` for the outbox, with its notice for `team`: the one place a notice is rendered.
pub fn announced<D: Announce>(team: Option<&str>, detail: &D) -> OutboundEvent {
    let mut ev = outbound(detail);
    if let Some((subject, body)) = detail.text() {
        let mut footer = String::from("\n\n-- \ncapacity-pilot");
        if let Some(t) = team {
            footer.push_str(&format!(", team {t}"));
        }
        footer.push_str(&format!(
            ". {} {}; the same event is on the deployment's bus.",
            D::DETAIL_TYPE,
            ev.event_key
        ));
        ev.notice = Some(Notice {
            subject: subject_line(&subject),
            body: format!("{}{footer}", body.trim_end()),
            team: team.map(str::to_string),
            detail_type: D::DETAIL_TYPE.to_string(),
            request_id: detail.request().map(str::to_string),
        });
    }
    ev
}

/// `s` as SNS takes a subject: printable ASCII on one line, at most [`MAX_SUBJECT_CHARS`],
/// beginning with a letter, digit or punctuation; cut with `...` when longer.
pub fn subject_line(s: &str) -> String {
    let mut clean: String = s
        .chars()
        .map(|c| match c {
            '\n' | '\r' | '\t' => ' ',
            c if c.is_ascii_graphic() || c == ' ' => c,
            _ => '?',
        })
        .collect();
    clean = clean.trim().to_string();
    if clean.is_empty() {
        clean = "capacity-pilot notice".into();
    }
    if clean.len() > MAX_SUBJECT_CHARS {
        clean.truncate(MAX_SUBJECT_CHARS - 3);
        clean = format!("{}...", clean.trim_end());
    }
    clean
}

/// A reservation's id as a subject names it: a training plan's name, not its whole ARN.
fn short_id(id: &str) -> &str {
    if id.starts_with("arn:") {
        id.rsplit('/').next().unwrap_or(id)
    } else {
        id
    }
}

fn at(t: DateTime<Utc>) -> String {
    t.format("%a %Y-%m-%d %H:%M UTC").to_string()
}

fn short(t: DateTime<Utc>) -> String {
    t.format("%b %-d %H:%M UTC").to_string()
}

/// `90` → "1 h 30 min", `1440` → "24 h".
pub fn lead_words(minutes: u32) -> String {
    match (minutes / 60, minutes % 60) {
        (0, m) => format!("{m} min"),
        (h, 0) => format!("{h} h"),
        (h, m) => format!("{h} h {m} min"),
    }
}

fn windows_line(label: &str, windows: &[KeptWindow]) -> String {
    if windows.is_empty() {
        String::new()
    } else {
        format!("\n{label}: {}.", describe(windows))
    }
}

/// A reservation's state as AWS names it: `payment-failed`.
fn state_words(s: super::reservation::ReservationState) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{s:?}"))
}

fn next(command: String) -> String {
    format!("\n\nNext: {command}")
}

impl Announce for RequestRejected {
    fn request(&self) -> Option<&str> {
        self.request_id.as_deref()
    }
    fn text(&self) -> Option<(String, String)> {
        let id = self
            .request_id
            .as_deref()
            .unwrap_or("(no readable request_id)");
        let problems: String = self
            .problems
            .iter()
            .map(|p| format!("\n  - {}: {}", p.field, p.message))
            .collect();
        Some((
            format!(
                "Request {id} rejected: {} field(s) at fault",
                self.problems.len()
            ),
            format!(
                "Request {id} was rejected; nothing was searched or bought.\n\
                 Submitted from {} as event {}.\n\nAt fault:{problems}{}",
                self.source,
                self.event_id,
                next(
                    "fix the fields and submit again: capacity-pilot submit <file> \
                     (capacity-pilot new writes a valid request)"
                        .into()
                )
            ),
        ))
    }
}

impl Announce for AwaitingApproval {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let what = match (&self.plan, &self.hold) {
            (Some(p), _) => format!(
                "{} x {} in {} ({}), {} to {}",
                p.instance_count,
                p.instance_type,
                p.region,
                p.product,
                at(p.start),
                at(p.end)
            ),
            (None, Some(h)) => format!(
                "an {} run of {} x {} for {} h in {}",
                self.kind.as_str(),
                h.instance_count,
                h.instance_type,
                h.duration_hours,
                h.regions.join(" or ")
            ),
            (None, None) => "its plan".into(),
        };
        let verb = match self.kind {
            ApprovalKind::Reservation => "buy",
            ApprovalKind::OnDemand | ApprovalKind::Spot => "hold",
        };
        Some((
            format!(
                "Approve ${} for {id} (team {})?",
                self.upfront_fee_usd, self.team
            ),
            format!(
                "Request {id} of team {} waits for approval to {verb} ${}: {what}.\n\
                 It has spent ${} so far; approval is needed above ${}.\n\
                 Nothing is bought until someone approves; the offer may be gone if it waits long.\
                 {}\nor:   capacity-pilot reject {id}",
                self.team,
                self.upfront_fee_usd,
                self.spent_usd,
                self.approval_above_usd,
                next(format!("capacity-pilot approve {id}"))
            ),
        ))
    }
}

impl Announce for ApprovalRefused {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let now = match &self.current_event_key {
            Some(k) => format!("\nWhat waits for approval now: {k}."),
            None => "\nNothing of it waits for approval now.".into(),
        };
        Some((
            format!("Approval decision for {id} not applied"),
            format!(
                "A decision on request {id} was not applied, and nothing was bought for it: {}.{now}{}",
                self.reason,
                next(format!("capacity-pilot status {id}, then decide again"))
            ),
        ))
    }
}

impl Announce for Reserved {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let saving = match (&self.on_demand_cost_usd, &self.saving_usd) {
            (Some(od), Some(s)) => format!(" (on demand: ${od}; saved ${s})"),
            _ => String::new(),
        };
        let how = if self.adopted {
            "adopted (already bought for it)"
        } else {
            "bought"
        };
        Some((
            format!(
                "{id} reserved: {} x {}, {}",
                self.instance_count,
                self.instance_type,
                short(self.start)
            ),
            format!(
                "Request {id} is reserved: {} x {} in {}, {} to {}.\n\
                 {} {} was {how} for ${} upfront{saving}; purchases cannot be cancelled.\n\
                 The workload launches when the window opens; you will be told before it opens \
                 and before it drains.{}",
                self.instance_count,
                self.instance_type,
                self.region,
                at(self.start),
                at(self.end),
                self.product,
                self.reservation_ids.join(", "),
                self.upfront_fee_usd,
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

impl Announce for PaymentFailed {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let then = if self.searching_again {
            "The request searches again."
        } else {
            "The request does not search again."
        };
        Some((
            format!(
                "{id}: payment failed for {}",
                short_id(&self.reservation_id)
            ),
            format!(
                "AWS did not take the payment for {} ({} in {}, now {}): ${} went back to \
                 the team's budget.\n{then} {}{}",
                self.reservation_id,
                self.product,
                self.region,
                state_words(self.state),
                self.returned_usd,
                self.reason,
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

impl Announce for PurchaseInDoubt {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        Some((
            format!("{id}: purchase in doubt, check the account"),
            format!(
                "A purchase for request {id} called AWS at {} and could not be confirmed: \
                 {} may have been bought.\n${} stays debited. capacity-pilot looks again \
                 every hour until {}, and serves anything it finds.\n{}\n\n\
                 Check the account's Capacity Reservations and training plans, and the bill.{}",
                at(self.since),
                self.offering_ids.join(", "),
                self.kept_usd,
                at(self.reconciled_until),
                self.reason,
                next(format!("capacity-pilot history {id}"))
            ),
        ))
    }
}

impl Announce for RequestFailed {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let kept = if self.reservation_ids.is_empty() {
            String::new()
        } else {
            format!(
                "\nKept (purchases cannot be cancelled): {}.",
                self.reservation_ids.join(", ")
            )
        };
        Some((
            format!("{id} failed"),
            format!(
                "Request {id} failed (it was {}): {}\nSpent: ${}.{kept}{}{}",
                self.status_before,
                self.reason,
                self.spent_usd,
                windows_line("Running on to their drain", &self.kept_windows),
                next(format!("capacity-pilot history {id}"))
            ),
        ))
    }
}

impl Announce for CancellationApplied {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let before = match self.status_before {
            Some(s) => format!(" (it was {s})"),
            None => " before it was submitted: a submission of it within 7 days is recorded \
                      cancelled"
                .into(),
        };
        Some((
            format!("{id} cancelled"),
            format!(
                "Request {id} is cancelled{before}: {}{}{}{}",
                self.reason,
                windows_line("Running on to their drain", &self.kept_windows),
                windows_line("Stopped now, through their drain", &self.stopped_windows),
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

impl Announce for CancellationRefused {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let hint = if self.kept_windows.is_empty() {
            format!("capacity-pilot status {id}")
        } else {
            format!("to stop the running windows too: capacity-pilot cancel {id} --stop-running")
        };
        Some((
            format!("Cancellation of {id} not applied"),
            format!(
                "The cancellation of request {id} was not applied: {}{}{}",
                self.reason,
                windows_line("Running on to their drain", &self.kept_windows),
                next(hint)
            ),
        ))
    }
}

impl Announce for WorkloadLaunched {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let late = match self.start_delay_minutes {
            Some(m) => format!(
                " ({} after the planned {}: the capacity became usable late)",
                lead_words(m.max(0) as u32),
                at(self.planned_start)
            ),
            None => String::new(),
        };
        let cost = match &self.estimated_cost_usd {
            Some(c) => format!("\nEstimated cost debited: ${c}."),
            None => String::new(),
        };
        Some((
            format!("{id} launched in window {}", self.segment),
            format!(
                "The workload of request {id} ({}) is launched in window {} ({}) at {}{late}:\n  {}{cost}{}",
                self.workload_kind.as_str(),
                self.segment,
                self.reservation_id,
                at(self.launched_at),
                self.resource_ids.join("\n  "),
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

impl Announce for WorkloadInterrupted {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let when = self
            .interrupted_at
            .map(|t| format!(" at {}", at(t)))
            .unwrap_or_default();
        let after = match &self.replacement_instance_id {
            Some(r) => format!("\nReplaced by {r}."),
            None => String::new(),
        };
        Some((
            format!("{id}: {} interrupted", self.instance_id),
            format!(
                "Instance {} (slot {}) of request {id}'s {} run was interrupted{when}.{after}\n{}{}",
                self.instance_id,
                self.slot,
                self.reservation_id,
                self.reason,
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

impl Announce for WorkloadDrained {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    /// Told only when late: a drain on time was announced before it (the Ending notices).
    fn text(&self) -> Option<(String, String)> {
        if !self.late {
            return None;
        }
        let id = &self.request_id;
        Some((
            format!("{id}: window {} drained late", self.segment),
            format!(
                "The drain of request {id}'s window {} ({}) came late, at {}, after AWS's \
                 forced termination at {}: AWS may have stopped the workload before it could \
                 finish.\n{}\nStopped: {}.{}",
                self.segment,
                self.reservation_id,
                at(self.drained_at),
                at(self.forced_termination_at),
                self.reason,
                if self.resource_ids.is_empty() {
                    "nothing".to_string()
                } else {
                    self.resource_ids.join(", ")
                },
                next(format!("capacity-pilot history {id}"))
            ),
        ))
    }
}

impl Announce for ReservationUnrecorded {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        Some((
            format!(
                "{}: a reservation no request records",
                short_id(&self.reservation_id)
            ),
            format!(
                "Reservation {} ({}, {} x {} in {}, {} to {}, {}) is tagged for request {id} \
                 of this deployment, but no plan of the request records it.\n{}\n\n\
                 It is paid for: check that it was wanted.{}",
                self.reservation_id,
                self.product,
                self.instance_count,
                self.instance_type,
                self.region,
                at(self.start),
                at(self.end),
                state_words(self.state),
                self.reason,
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

impl Announce for NotFound {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let closest: String = self
            .rejections
            .iter()
            .take(5)
            .map(|r| format!("\n  - {} ({}): {}", r.offering_id, r.region, r.reason))
            .collect();
        let more = self.rejections.len().saturating_sub(5) + self.rejections_omitted;
        let more = if more > 0 {
            format!("\n  and {more} more")
        } else {
            String::new()
        };
        let closest = if closest.is_empty() {
            String::new()
        } else {
            format!("\n\nOfferings seen and why they do not fit:{closest}{more}")
        };
        Some((
            format!("{id}: no capacity found yet"),
            format!(
                "Nothing that fits request {id} is on offer yet: {}\nIt searches again at {} \
                 and gives up at {}.{closest}{}",
                self.reason,
                at(self.next_search_at),
                at(self.search_deadline),
                next(format!(
                    "capacity-pilot status {id}; a wider window, more regions or types may find \
                     capacity (try them with capacity-pilot plan)"
                ))
            ),
        ))
    }
}

impl Announce for WindowOpening {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let late = if self.late {
            " (this notice is late: capacity-pilot was not running when it was due)"
        } else {
            ""
        };
        Some((
            format!(
                "{id}: window {} opens in {} ({})",
                self.window,
                lead_words(self.lead_minutes),
                short(self.opens_at)
            ),
            format!(
                "Window {} of request {id} opens at {}{late}: {} x {} in {} ({} {}).\n\
                 capacity-pilot launches the workload then. It runs until the drain starts at \
                 {}.{}",
                self.window,
                at(self.opens_at),
                self.instance_count,
                self.instance_type,
                self.region,
                self.product,
                self.reservation_id,
                at(self.drain_at),
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

impl Announce for ReservationEnding {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let late = if self.late {
            " (this notice is late: capacity-pilot was not running when it was due)"
        } else {
            ""
        };
        let extend = match (self.extendable, self.extend_by) {
            (true, Some(by)) => format!("An extension can be asked for until {}.", at(by)),
            (true, None) => "An extension can be asked for.".into(),
            (false, _) => "It cannot be extended.".into(),
        };
        let act = if self.checkpoint {
            "Checkpoint now: what runs in it is stopped at the drain."
        } else {
            "Save what you need before then: what runs in it is stopped at the drain."
        };
        Some((
            format!(
                "{id}: window {} drains in {} ({}){}",
                self.window,
                lead_words(self.lead_minutes),
                short(self.drain_at),
                if self.checkpoint {
                    ", checkpoint now"
                } else {
                    ""
                }
            ),
            format!(
                "Window {} of request {id} ({} {}) drains at {}{late}, and the reservation \
                 ends at {}.\n{act}\n{extend}{}",
                self.window,
                self.product,
                self.reservation_id,
                at(self.drain_at),
                at(self.ends_at),
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

/// "window 0 (capacity-block cr-0123) by 24 h, to Thu 2026-12-10 11:30 UTC, for $3000.00".
fn extension_words(e: &ExtensionSummary) -> String {
    format!(
        "window {} ({} {}) by {} h, from {} to {}, for ${}",
        e.window,
        e.product,
        e.reservation_id,
        e.hours,
        at(e.ends_at),
        at(e.extended_ends_at),
        e.upfront_fee_usd
    )
}

impl Announce for ExtensionOffered {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let then = if self.needs_approval {
            format!(
                "It waits for an approver, who must answer before {}.",
                at(self.buy_by)
            )
        } else {
            "capacity-pilot buys it now.".to_string()
        };
        Some((
            format!(
                "{id}: extension of window {} by {} h offered, ${}",
                self.extension.window, self.extension.hours, self.extension.upfront_fee_usd
            ),
            format!(
                "An extension of request {id}'s {} is offered ({}).\n{then}{}",
                extension_words(&self.extension),
                self.extension.asked_by,
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

impl Announce for ExtensionAwaitingApproval {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        Some((
            format!(
                "{id}: extension by {} h needs approval, ${}",
                self.extension.hours, self.extension.upfront_fee_usd
            ),
            format!(
                "An extension of request {id}'s {} waits for an approver: with the ${} the \
                 request has spent, it is above the approval threshold of ${}.\nApprove it \
                 before {}, or it is not bought and the window drains as planned.{}",
                extension_words(&self.extension),
                self.spent_usd,
                self.approval_above_usd,
                at(self.buy_by),
                next(format!(
                    "capacity-pilot approve {id} --key {}",
                    self.event_key
                ))
            ),
        ))
    }
}

impl Announce for ExtensionFailed {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let what = match &self.extension {
            Some(e) => format!("The extension of request {id}'s {}", extension_words(e)),
            None => format!("The extension of request {id} by {} h", self.hours),
        };
        let returned = if self.returned_usd > super::money::Usd::ZERO {
            format!(" ${} went back to the team's budget.", self.returned_usd)
        } else {
            String::new()
        };
        Some((
            format!("{id}: extension by {} h failed", self.hours),
            format!(
                "{what} failed: {}.{returned}\nThe reservation keeps its end, and what runs in \
                 it is stopped at the drain as planned.{}",
                self.reason,
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

impl Announce for ReservationExtended {
    fn request(&self) -> Option<&str> {
        Some(&self.request_id)
    }
    fn text(&self) -> Option<(String, String)> {
        let id = &self.request_id;
        let how = if self.external {
            "was extended outside capacity-pilot (in the console or by the API). Its fee was \
             not paid through capacity-pilot and is not counted against the request's budget."
        } else {
            "was extended by capacity-pilot."
        };
        Some((
            format!(
                "{id}: window {} extended, now ends {}",
                self.window,
                short(self.ends_at)
            ),
            format!(
                "Window {} of request {id} ({} {}) {how}\nIt now ends at {} instead of {}. \
                 What runs in it is stopped at the drain, now at {}{}, and the Ending notices \
                 count down to the new end.{}",
                self.window,
                self.product,
                self.reservation_id,
                at(self.ends_at),
                at(self.previous_ends_at),
                at(self.drain_at),
                if self.product == super::offering::Product::CapacityBlock {
                    "; EC2 instances carry the new time in their capacity-pilot:drain-at tag"
                } else {
                    ""
                },
                next(format!("capacity-pilot status {id}"))
            ),
        ))
    }
}

// ---------------------------------------------------------------------------------------
// Lead-time notices
// ---------------------------------------------------------------------------------------

/// A notice this late after its moment says so (`late: true`): the function that sends it
/// runs every minute, so anything later was held up by an outage.
pub const LATE_AFTER: Duration = Duration::minutes(10);

/// The longest lead a deployment may configure (7 days).
pub const MAX_LEAD_MINUTES: u32 = 7 * 24 * 60;

/// The leads, in minutes, of the notices before a window opens and before it drains
/// (ARCHITECTURE §9.2). The shortest ending lead is the checkpoint notice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leads {
    pub opening: Vec<u32>,
    pub ending: Vec<u32>,
}

impl Default for Leads {
    fn default() -> Self {
        Leads {
            opening: vec![24 * 60, 60],
            ending: vec![24 * 60, 13 * 60, 60],
        }
    }
}

impl Leads {
    /// `"1440,60"` → `[1440, 60]`: each a whole number of minutes, 1 to [`MAX_LEAD_MINUTES`];
    /// empty means none.
    pub fn parse_list(s: &str) -> Result<Vec<u32>, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let m: u32 = part
                .parse()
                .map_err(|_| format!("{part:?} is not a whole number of minutes"))?;
            if m == 0 || m > MAX_LEAD_MINUTES {
                return Err(format!(
                    "{m} minutes is outside 1 to {MAX_LEAD_MINUTES} (7 days)"
                ));
            }
            if !out.contains(&m) {
                out.push(m);
            }
        }
        out.sort_unstable_by(|a, b| b.cmp(a));
        Ok(out)
    }
}

/// Which lead-time notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LeadKind {
    Opening,
    Ending,
}

impl LeadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LeadKind::Opening => "opening",
            LeadKind::Ending => "ending",
        }
    }

    fn detail_type(self) -> &'static str {
        match self {
            LeadKind::Opening => WindowOpening::DETAIL_TYPE,
            LeadKind::Ending => ReservationEnding::DETAIL_TYPE,
        }
    }
}

/// One lead of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lead {
    pub kind: LeadKind,
    pub minutes: u32,
}

impl Lead {
    /// `opening-1440m`: how a window's record marks it done.
    pub fn key(self) -> String {
        format!("{}-{}m", self.kind.as_str(), self.minutes)
    }

    /// What it announces: the window opening, or its drain starting.
    pub fn announces(self, w: &Window) -> DateTime<Utc> {
        match self.kind {
            LeadKind::Opening => w.start(),
            LeadKind::Ending => w.drain_at,
        }
    }

    /// When it is due.
    pub fn moment(self, w: &Window) -> DateTime<Utc> {
        self.announces(w) - Duration::minutes(i64::from(self.minutes))
    }

    /// Its name in words, for window `window`: "the 24 h Window Opening notice of window 0".
    pub fn describe(self, window: u32) -> String {
        format!(
            "the {} {} notice of window {window}",
            lead_words(self.minutes),
            self.kind.detail_type().trim_start_matches("Capacity ")
        )
    }
}

/// The lead-time notices of a window so far, kept on its record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NoticeMarks {
    /// The leads dealt with ([`Lead::key`]): sent, skipped, or not due (their moment came
    /// before the purchase).
    #[serde(default)]
    pub done: Vec<String>,
    /// When the next configured lead falls due; none when every one is dealt with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_at: Option<DateTime<Utc>>,
    /// When AWS was last seen to move the window's end (an extension, ARCHITECTURE §9.3): its
    /// Ending leads were reset then, and one whose moment came before is not due, as one
    /// before the purchase is not (`Capacity Reservation Extended` said the new end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_moved_at: Option<DateTime<Utc>>,
}

impl NoticeMarks {
    /// These marks once the window's end moved at `at`: its Ending leads are to be dealt
    /// with again, counting down to the new end, and looked at at once; its Opening leads
    /// stand.
    pub fn end_moved(&self, at: DateTime<Utc>) -> NoticeMarks {
        let ending = format!("{}-", LeadKind::Ending.as_str());
        NoticeMarks {
            done: self
                .done
                .iter()
                .filter(|k| !k.starts_with(&ending))
                .cloned()
                .collect(),
            next_at: Some(at),
            end_moved_at: Some(at),
        }
    }

    /// Since when a lead of `kind` of a window whose reservation was bought `bought` is due.
    pub fn due_since(&self, kind: LeadKind, bought: DateTime<Utc>) -> DateTime<Utc> {
        match (kind, self.end_moved_at) {
            (LeadKind::Ending, Some(t)) => bought.max(t),
            _ => bought,
        }
    }
}

/// What to do about a window's lead-time notices at `now`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeadPlan {
    /// To publish, with whether each is late.
    pub send: Vec<(Lead, bool)>,
    /// Not published, with why, for the request's history: what it announced already
    /// happened, or a shorter lead of the same kind is sent in its place.
    pub skipped: Vec<(Lead, String)>,
    /// The window's marks after this.
    pub marks: NoticeMarks,
}

impl LeadPlan {
    /// Whether the window's record must be written: something is sent or skipped, or its
    /// marks change.
    pub fn changes(&self, before: Option<&NoticeMarks>) -> bool {
        !self.send.is_empty() || !self.skipped.is_empty() || before != Some(&self.marks)
    }
}

/// The lead-time notices of window `w` due at `now` (ARCHITECTURE §9.2). `since` is when its
/// reservation was bought: a lead whose moment came before it (an Ending lead's, before its
/// end last moved, [`NoticeMarks::end_moved_at`]) is not due, and produces nothing. A lead that passed is sent (late, when [`LATE_AFTER`] has gone by) unless what it
/// announces already happened (the window opened, or its drain began), in which case it is
/// skipped; of several leads of one kind that passed together only the shortest is sent.
pub fn plan_leads(w: &Window, leads: &Leads, since: DateTime<Utc>, now: DateTime<Utc>) -> LeadPlan {
    let mut plan = LeadPlan {
        marks: w.notices.clone().unwrap_or_default(),
        ..LeadPlan::default()
    };
    if w.state == WindowState::Ended {
        plan.marks.next_at = None;
        return plan;
    }
    for (kind, minutes) in [
        (LeadKind::Opening, &leads.opening),
        (LeadKind::Ending, &leads.ending),
    ] {
        let happened = match kind {
            LeadKind::Opening => {
                now >= w.start()
                    || !matches!(w.state, WindowState::Pending | WindowState::Launching)
            }
            LeadKind::Ending => now >= w.drain_at || !w.state.is_undrained(),
        };
        let mut passed: Vec<Lead> = Vec::new();
        let mut sorted = minutes.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        for m in sorted {
            let lead = Lead { kind, minutes: m };
            if plan.marks.done.contains(&lead.key()) {
                continue;
            }
            let moment = lead.moment(w);
            if moment < plan.marks.due_since(kind, since) {
                plan.marks.done.push(lead.key());
            } else if moment <= now || happened {
                passed.push(lead);
            }
        }
        if happened {
            for lead in passed {
                let what = match kind {
                    LeadKind::Opening => format!("the window opened at {}", at(w.start())),
                    LeadKind::Ending => format!("its drain began (due at {})", at(w.drain_at)),
                };
                plan.marks.done.push(lead.key());
                plan.skipped.push((
                    lead,
                    format!(
                        "{} was not sent: {what} before it could be",
                        lead.describe(w.number)
                    ),
                ));
            }
        } else if let Some((last, earlier)) = passed.split_last() {
            for lead in earlier {
                plan.marks.done.push(lead.key());
                plan.skipped.push((
                    *lead,
                    format!(
                        "{} was not sent: it passed while capacity-pilot was not running, and \
                         {} is sent in its place",
                        lead.describe(w.number),
                        last.describe(w.number)
                    ),
                ));
            }
            plan.marks.done.push(last.key());
            plan.send.push((*last, now - last.moment(w) > LATE_AFTER));
        }
    }
    plan.marks.next_at = [
        (LeadKind::Opening, &leads.opening),
        (LeadKind::Ending, &leads.ending),
    ]
    .into_iter()
    .flat_map(|(kind, ms)| ms.iter().map(move |&m| Lead { kind, minutes: m }))
    .filter(|l| !plan.marks.done.contains(&l.key()))
    .map(|l| l.moment(w))
    .min();
    plan.marks.done.sort();
    plan
}

/// The `event_key` of lead `lead` of window `w` of the request `whose` names: one per window
/// and lead, whatever the write that sends it, and for an Ending lead one per end too
/// (`…:ending-60m:ends-20261209T1130Z…`): when AWS moves the end, the countdown to the new
/// end is new notices, not duplicates of the old one's.
pub fn lead_key(whose: super::events::Whose<'_>, w: &Window, lead: Lead) -> String {
    let ends = match lead.kind {
        LeadKind::Opening => String::new(),
        LeadKind::Ending => format!(":ends-{}", w.end().format("%Y%m%dT%H%MZ")),
    };
    format!(
        "{}:window-{}:{}{ends}{}",
        whose.request_id,
        w.number,
        lead.key(),
        whose.salt()
    )
}

/// The event (and notice, for `team`) of lead `lead` of window `w`; an Ending notice says
/// until when an extension can be asked for (`extend_by`, [`super::extension::ask_by`]).
pub fn lead_event(
    whose: super::events::Whose<'_>,
    team: &str,
    w: &Window,
    lead: Lead,
    late: bool,
    checkpoint_minutes: Option<u32>,
    extend_by: Option<DateTime<Utc>>,
) -> OutboundEvent {
    let key = lead_key(whose, w, lead);
    let r = &w.reservation;
    match lead.kind {
        LeadKind::Opening => announced(
            Some(team),
            &WindowOpening {
                event_key: key,
                request_id: whose.request_id.to_string(),
                window: w.number,
                reservation_id: r.id.clone(),
                product: r.product,
                region: r.region.clone(),
                instance_type: r.instance_type.clone(),
                instance_count: r.instance_count,
                opens_at: w.start(),
                drain_at: w.drain_at,
                lead_minutes: lead.minutes,
                late,
            },
        ),
        LeadKind::Ending => announced(
            Some(team),
            &ReservationEnding {
                event_key: key,
                request_id: whose.request_id.to_string(),
                window: w.number,
                reservation_id: r.id.clone(),
                product: r.product,
                region: r.region.clone(),
                drain_at: w.drain_at,
                ends_at: w.end(),
                lead_minutes: lead.minutes,
                checkpoint: checkpoint_minutes == Some(lead.minutes),
                extendable: extend_by.is_some(),
                extend_by,
                late,
            },
        ),
    }
}

/// The event (and notice, for `team`) of window `after`'s end having moved later from
/// `previous_end` (ARCHITECTURE §9.3); `external` when capacity-pilot did not buy the
/// extension.
pub fn extended_event(
    whose: super::events::Whose<'_>,
    team: &str,
    previous_end: DateTime<Utc>,
    after: &Window,
    external: bool,
) -> OutboundEvent {
    let r = &after.reservation;
    announced(
        Some(team),
        &ReservationExtended {
            event_key: format!(
                "{}:window-{}:extended:ends-{}{}",
                whose.request_id,
                after.number,
                after.end().format("%Y%m%dT%H%MZ"),
                whose.salt()
            ),
            request_id: whose.request_id.to_string(),
            window: after.number,
            reservation_id: r.id.clone(),
            product: r.product,
            region: r.region.clone(),
            previous_ends_at: previous_end,
            ends_at: after.end(),
            drain_at: after.drain_at,
            external,
        },
    )
}

#[cfg(test)]
mod tests;
