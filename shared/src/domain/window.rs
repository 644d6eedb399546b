//! One model of a request's windows (ARCHITECTURE §8.4): every segment of every reservation
//! the request holds (a plan's segments, a split's blocks, a replacement block) is a window
//! with its own state and next action, so launch and cleanup act on windows whatever the
//! request's status, and a window whose end has passed is never launched into or waited for.
//!
//! What a window *is* (its times, its reservation) is derived from the recorded
//! reservations; what has *happened* to it (its state, its number) is stored as a
//! [`WindowRecord`] on the request. A segment without a record is `Pending`, numbered after
//! every recorded window in start order, so a number once given never changes: a
//! replacement block never renumbers the block it replaces, whatever their starts.

use std::collections::BTreeSet;
use std::fmt;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::notices::NoticeMarks;
use super::offering::Segment;
use super::reservation::{Reservation, ReservationState};
use super::status::RequestStatus;
use super::time_rules::{drain_start, forced_termination_lead};

/// Where a window is in its life.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum WindowState {
    /// Bought; nothing launched yet.
    Pending,
    /// A launch began but is not complete (capacity not back yet, a job still placing).
    Launching,
    /// The workload runs in it.
    Running,
    /// Its drain has begun and what runs in it is being stopped: marked before anything is
    /// stopped, so no launch or replacement starts into it meanwhile, and a drain cut short
    /// is finished by the next cleanup run.
    Stopping,
    /// Drained ahead of forced termination; waiting for its end to clean up.
    Draining,
    /// Cleaned up. Nothing more happens to it.
    Ended,
}

impl WindowState {
    /// Every state, in life order.
    pub const ALL: [WindowState; 6] = [
        WindowState::Pending,
        WindowState::Launching,
        WindowState::Running,
        WindowState::Stopping,
        WindowState::Draining,
        WindowState::Ended,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WindowState::Pending => "pending",
            WindowState::Launching => "launching",
            WindowState::Running => "running",
            WindowState::Stopping => "stopping",
            WindowState::Draining => "draining",
            WindowState::Ended => "ended",
        }
    }

    /// Not yet drained: something may still run, or be launched, in it.
    pub fn is_undrained(self) -> bool {
        matches!(
            self,
            WindowState::Pending | WindowState::Launching | WindowState::Running
        )
    }
}

impl fmt::Display for WindowState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A window's state as stored on its request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WindowRecord {
    /// `<reservation id>#<segment index within the reservation>`.
    pub key: String,
    /// The window's number among the request's windows: events, job and config names carry
    /// it, so it never changes once given.
    pub number: u32,
    pub state: WindowState,
    /// When a function must next act on it: its start (launch), its drain start (drain), its
    /// end (clean up); none once ended. The request is due at the earliest of these.
    pub next_action_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    /// Its lead-time notices so far (ARCHITECTURE §9.2); none until cleanup first looks at
    /// them, which is due at once ([`WindowRecord::notice_due`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notices: Option<NoticeMarks>,
    /// The number of capacity-pilot's extension whose payment reopened the window after its
    /// workload was stopped at the old end (or, for a training job, whose fixed runtime ends
    /// at the old end): what runs in it from then on is launched anew under names and client
    /// tokens of its own ([`relaunch_after`]). `None` until an extension does so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relaunch: Option<u32>,
}

/// The drain lead a request asks for and the deployment's default (the larger wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainLead {
    pub requested_minutes: u32,
    pub default_minutes: u32,
}

impl DrainLead {
    /// The lead `request` asks for beside the deployment's `default_minutes`.
    pub fn of(request: &super::request::CapacityRequest, default_minutes: u32) -> DrainLead {
        DrainLead {
            requested_minutes: request.drain_minutes,
            default_minutes,
        }
    }
}

/// One window: a segment of a recorded reservation, with its state.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub key: String,
    pub number: u32,
    pub state: WindowState,
    pub reservation: Reservation,
    /// Its index among the reservation's segments.
    pub segment_index: usize,
    pub segment: Segment,
    /// When the drain starts: `end − forced-termination lead − drain lead`.
    pub drain_at: DateTime<Utc>,
    /// When AWS starts terminating what runs in it.
    pub forced_at: DateTime<Utc>,
    /// Its reservation has no later segment: when this window ends, the reservation has.
    pub last_of_reservation: bool,
    /// Its lead-time notices so far, as its record keeps them.
    pub notices: Option<NoticeMarks>,
    /// The extension that reopened it, as its record keeps it ([`WindowRecord::relaunch`]).
    pub relaunch: Option<u32>,
}

pub fn window_key(reservation_id: &str, segment_index: usize) -> String {
    format!("{reservation_id}#{segment_index}")
}

impl WindowRecord {
    /// When its lead-time notices are next due: at once (its `updated_at`) when none were
    /// looked at yet (a window just bought, or recorded before notices existed); never once
    /// it ended.
    pub fn notice_due(&self) -> Option<DateTime<Utc>> {
        if self.state == WindowState::Ended {
            return None;
        }
        match &self.notices {
            None => Some(self.updated_at),
            Some(m) => m.next_at,
        }
    }

    /// The reservation its key ([`window_key`]) names.
    pub fn reservation_id(&self) -> &str {
        self.key
            .rsplit_once('#')
            .map_or(self.key.as_str(), |(r, _)| r)
    }
}

/// A reservation AWS reports as unusable holds no window, unless one of its windows was
/// already under way: that one is still cleaned up once.
fn usable(r: &Reservation) -> bool {
    !matches!(
        r.state,
        ReservationState::PaymentFailed
            | ReservationState::Failed
            | ReservationState::Cancelled
            | ReservationState::Unavailable
            | ReservationState::Unsupported
    )
}

impl Window {
    pub fn start(&self) -> DateTime<Utc> {
        self.segment.start
    }

    pub fn end(&self) -> DateTime<Utc> {
        self.segment.end
    }

    /// When a function must next act on the window in `state`.
    pub fn next_action_in(&self, state: WindowState) -> Option<DateTime<Utc>> {
        match state {
            WindowState::Pending | WindowState::Launching => Some(self.start()),
            WindowState::Running => Some(self.drain_at),
            // The stop is owed now.
            WindowState::Stopping => Some(self.start()),
            WindowState::Draining => Some(self.end()),
            WindowState::Ended => None,
        }
    }

    /// Whether something may be launched into it at `now`: it is open and not yet draining.
    /// A window whose drain start has passed is never launched into, whatever its state.
    pub fn is_launchable(&self, now: DateTime<Utc>) -> bool {
        // A reservation that went final (its payment failed, say) is never launched into;
        // a window of it still under way is only drained and ended.
        usable(&self.reservation)
            && matches!(self.state, WindowState::Pending | WindowState::Launching)
            && self.start() <= now
            && now < self.drain_at
    }

    /// Whether a launch begun at `now` and running at most `run` ends before the drain
    /// starts: one that might not is never begun (the invocation could otherwise start
    /// instances after the drain stopped the others).
    pub fn launch_ends_before_drain(&self, now: DateTime<Utc>, run: chrono::Duration) -> bool {
        now + run < self.drain_at
    }

    /// Whether it must be drained at `now`; `warned` when AWS's expiration warning named
    /// its reservation (it can only bring the drain forward).
    pub fn needs_drain(&self, now: DateTime<Utc>, warned: bool) -> bool {
        self.state == WindowState::Stopping
            || (self.state.is_undrained()
                && (now >= self.drain_at || (warned && now >= self.start())))
    }

    /// Whether it is drained and over, so its cleanup is due.
    pub fn needs_end(&self, now: DateTime<Utc>) -> bool {
        self.state == WindowState::Draining && now >= self.end()
    }

    /// Its record in `state`, written at `at`.
    pub fn record(&self, state: WindowState, at: DateTime<Utc>) -> WindowRecord {
        WindowRecord {
            key: self.key.clone(),
            number: self.number,
            state,
            next_action_at: self.next_action_in(state),
            updated_at: at,
            notices: self.notices.clone(),
            relaunch: self.relaunch,
        }
    }
}

/// The request's windows in start order: every segment of every usable reservation, with
/// its recorded state (`Pending` when none is recorded) and number.
pub fn windows(
    reservations: &[Reservation],
    records: &[WindowRecord],
    drain: DrainLead,
) -> Vec<Window> {
    let mut all: Vec<Window> = Vec::new();
    let mut unnumbered: Vec<usize> = Vec::new();
    for r in reservations {
        let kind = r.window_kind();
        let forced_lead = forced_termination_lead(kind);
        for (i, s) in r.segments.iter().enumerate() {
            let key = window_key(&r.id, i);
            let record = records.iter().find(|w| w.key == key);
            if !usable(r) && record.is_none_or(|w| w.state == WindowState::Ended) {
                continue;
            }
            if all.iter().any(|w| w.key == key) {
                // The same reservation recorded twice: one window.
                continue;
            }
            if record.is_none() {
                unnumbered.push(all.len());
            }
            all.push(Window {
                key,
                number: record.map_or(0, |w| w.number),
                state: record.map_or(WindowState::Pending, |w| w.state),
                reservation: r.clone(),
                segment_index: i,
                segment: s.clone(),
                drain_at: drain_start(s.end, kind, drain.requested_minutes, drain.default_minutes),
                forced_at: s.end - forced_lead,
                last_of_reservation: i + 1 == r.segments.len(),
                notices: record.and_then(|w| w.notices.clone()),
                relaunch: record.and_then(|w| w.relaunch),
            });
        }
    }
    // Numbers for windows seen for the first time: after every number ever given (ended
    // windows of dropped reservations included), in start order.
    let next = records
        .iter()
        .map(|w| w.number + 1)
        .chain(
            all.iter()
                .enumerate()
                .filter(|(i, _)| !unnumbered.contains(i))
                .map(|(_, w)| w.number + 1),
        )
        .max()
        .unwrap_or(0);
    unnumbered.sort_by_key(|&i| (all[i].start(), all[i].key.clone()));
    for (n, i) in (next..).zip(unnumbered) {
        all[i].number = n;
    }
    all.sort_by_key(|w| (w.start(), w.number));
    all
}

/// The records of `windows` as they stand, with the window `key` moved to `state` at `at`.
/// Records of windows no longer derived (a dropped reservation's) are kept, so their
/// numbers stay taken.
pub fn records_with(
    records: &[WindowRecord],
    windows: &[Window],
    key: &str,
    state: WindowState,
    at: DateTime<Utc>,
) -> Vec<WindowRecord> {
    let mut out: Vec<WindowRecord> = windows
        .iter()
        .map(|w| {
            if w.key == key {
                w.record(state, at)
            } else {
                records
                    .iter()
                    .find(|r| r.key == w.key)
                    .cloned()
                    .unwrap_or_else(|| w.record(w.state, at))
            }
        })
        .collect();
    for r in records {
        if !out.iter().any(|o| o.key == r.key) {
            out.push(r.clone());
        }
    }
    out.sort_by_key(|r| r.number);
    out
}

/// The records of `windows` with each of `stop` moved to `Stopping` at `at`, due at once
/// whether it has opened or not: a cancellation with `stop_running` hands them to the
/// ordinary drain, and nothing is launched into them again.
pub fn records_stopping(
    records: &[WindowRecord],
    windows: &[Window],
    stop: &[Window],
    at: DateTime<Utc>,
) -> Vec<WindowRecord> {
    let mut out = records.to_vec();
    for w in stop {
        out = records_with(&out, windows, &w.key, WindowState::Stopping, at);
        if let Some(r) = out.iter_mut().find(|r| r.key == w.key) {
            r.next_action_at = Some(at);
        }
    }
    out
}

/// `records` with every window of reservation `reservation_id` that never launched ended at
/// `at`: the reservation went final before its window (a failed payment), so there is
/// nothing to launch, drain or clean up, and its number stays taken.
pub fn records_lost(
    records: &[WindowRecord],
    reservation_id: &str,
    at: DateTime<Utc>,
) -> Vec<WindowRecord> {
    let prefix = format!("{reservation_id}#");
    records
        .iter()
        .map(|r| {
            if r.state == WindowState::Pending && r.key.starts_with(&prefix) {
                WindowRecord {
                    state: WindowState::Ended,
                    next_action_at: None,
                    updated_at: at,
                    ..r.clone()
                }
            } else {
                r.clone()
            }
        })
        .collect()
}

/// What AWS moving a reservation's ends does to a request's windows (ARCHITECTURE §9.3).
#[derive(Debug, Clone, PartialEq)]
pub struct EndsMoved {
    /// The request's reservations, each moved one as AWS reports it.
    pub reservations: Vec<Reservation>,
    /// The window records after: each window of a moved reservation not ended is due at its
    /// new drain or end, its Ending notices count down to the new end; a segment AWS added is
    /// a new window.
    pub records: Vec<WindowRecord>,
    /// Each window whose end moved (or that AWS added), with the end it had before (a new
    /// segment's: its reservation's end before).
    pub moved: Vec<(DateTime<Utc>, Window)>,
    /// Each window the move reopened ([`relaunch_after`]): its number, the extension's, and
    /// whether its workload was drained (launched again at once) or is a training job still
    /// running to its old end (its follow-on starts when it stops).
    pub reopened: Vec<(u32, u32, WindowState)>,
}

/// What an extension's paid end may reopen of a request's windows ([`relaunch_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reopen {
    /// The workload's runtime is fixed when it starts (a training job's
    /// `MaxRuntimeInSeconds`): a window running it gets a follow-on launch when it stops.
    pub fixed_runtime: bool,
    /// A cancellation asked for what runs to stop (`stop_running`): nothing is reopened.
    pub stopped: bool,
}

impl Reopen {
    /// What `rec`'s windows may be reopened for.
    pub fn of(rec: &crate::ports::RequestRecord) -> Reopen {
        Reopen {
            fixed_runtime: matches!(
                rec.request.workload,
                super::request::WorkloadDetail::TrainingJob(_)
            ),
            stopped: rec.cancel.as_ref().is_some_and(|c| c.stop_running),
        }
    }
}

/// The extension that reopens `w`, a `Stopping` window whose stop is done at `now`: one
/// whose paid end moved its drain later while it stopped ([`ends_moved`] keeps the number on
/// its record; marking a window `Stopping` clears it). `None`: it drains as it was going to.
pub fn reopened_after_stop(w: &Window, reopen: Reopen, now: DateTime<Utc>) -> Option<u32> {
    w.relaunch.filter(|_| may_reopen(w, reopen, now))
}

/// Whether `w` may be reopened at all at `now`: no cancellation stopped it, its (new) drain
/// is still ahead, and its reservation is usable.
fn may_reopen(w: &Window, reopen: Reopen, now: DateTime<Utc>) -> bool {
    !reopen.stopped && now < w.drain_at && usable(&w.reservation)
}

/// The number of capacity-pilot's extension whose paid end reopens `w` in `state` at `now`,
/// if it does (ARCHITECTURE §9.3): a window drained at the old end (`Draining`, or
/// `Stopping` once its stop is done) whose new drain is still ahead is launched again; so is
/// one running a workload whose runtime was fixed at the old end (a training job: its
/// follow-on starts when it stops). Never one a cancellation stopped, nor for an extension
/// not ours (its fee was not counted, ARCHITECTURE §8.6), nor twice for one extension.
pub fn relaunch_after(
    w: &Window,
    state: WindowState,
    reopen: Reopen,
    now: DateTime<Utc>,
) -> Option<u32> {
    if !may_reopen(w, reopen, now) {
        return None;
    }
    let n = ours(w)?;
    if w.relaunch.is_some_and(|r| r >= n) {
        return None;
    }
    match state {
        WindowState::Draining | WindowState::Stopping => Some(n),
        WindowState::Running | WindowState::Launching if reopen.fixed_runtime => Some(n),
        _ => None,
    }
}

impl EndsMoved {
    /// Each move in words, for a decision's reason and the request's history.
    pub fn said(&self) -> Vec<String> {
        self.moved
            .iter()
            .map(|(before, w)| {
                let later = w.end() > *before;
                format!(
                    "AWS reports {} ending at {} ({} {before}){}: window {} now drains at {} \
                     and its Ending notices count down to the new end",
                    w.reservation.id,
                    w.end(),
                    if later { "extended from" } else { "recorded" },
                    match (later, ours(w)) {
                        (true, Some(n)) => format!(", capacity-pilot's extension {n}"),
                        (true, None) => ", an extension bought outside capacity-pilot whose fee \
                                         is not counted"
                            .to_string(),
                        (false, _) => String::new(),
                    },
                    w.number,
                    w.drain_at
                )
            })
            .chain(self.reopened_said())
            .collect()
    }

    /// What the move reopened, in words ([`EndsMoved::reopened`]): the last of
    /// [`EndsMoved::said`].
    pub fn reopened_said(&self) -> Vec<String> {
        self.reopened
            .iter()
            .map(|(window, n, was)| {
                if *was == WindowState::Stopping {
                    format!(
                        "window {window}'s workload is being stopped at its old end: once it \
                         is, extension {n}'s paid end reopens the window and its workload is \
                         launched again into the extended window"
                    )
                } else if *was == WindowState::Draining {
                    format!(
                        "window {window} was drained at its old end: extension {n}'s paid end \
                         reopens it, and its workload is launched again into the extended \
                         window under names and client tokens of its own"
                    )
                } else {
                    format!(
                        "window {window}'s training job stops at the old end (its runtime \
                         cannot change): extension {n}'s follow-on job, started when it \
                         stops, runs to the new end and must resume from the checkpoint"
                    )
                }
            })
            .collect()
    }

    /// `Capacity Reservation Extended` (and its notice, for `team`) for each window whose end
    /// moved later: `external` unless an extension capacity-pilot bought ends there.
    pub fn announced(
        &self,
        whose: super::events::Whose<'_>,
        team: &str,
    ) -> Vec<crate::ports::OutboundEvent> {
        self.moved
            .iter()
            .filter(|(before, w)| w.end() > *before)
            .map(|(before, w)| {
                super::notices::extended_event(whose, team, *before, w, ours(w).is_none())
            })
            .collect()
    }
}

/// The number of capacity-pilot's extension of `w`'s reservation that ends where `w` now
/// ends (within a minute: AWS's times are to the second), if one does: bought (its payment
/// pending or taken), so the move is ours, and its fee was debited.
fn ours(w: &Window) -> Option<u32> {
    use super::extension::ExtensionState::{Buying, PaymentPending, Succeeded};
    if !w.last_of_reservation {
        return None;
    }
    w.reservation
        .extensions
        .iter()
        .filter(|e| matches!(e.state, Buying | PaymentPending | Succeeded))
        .find(|e| (e.offer.ends_at - w.end()).num_seconds().abs() < 60)
        .map(|e| e.number)
}

/// `reservations` and `records` once `seen` (each a recorded reservation as AWS now reports
/// it, [`Reservation::read_back`]) replace theirs, at `at`. A window already ended stays as
/// it is; one drained keeps its state and is cleaned up at its new end.
pub fn ends_moved(
    reservations: &[Reservation],
    records: &[WindowRecord],
    seen: &[Reservation],
    drain: DrainLead,
    reopen: Reopen,
    at: DateTime<Utc>,
) -> EndsMoved {
    let before = windows(reservations, records, drain);
    let after_reservations: Vec<Reservation> = reservations
        .iter()
        .map(|r| seen.iter().find(|s| s.id == r.id).unwrap_or(r).clone())
        .collect();
    let after = windows(&after_reservations, records, drain);
    let mut out = records.to_vec();
    let mut moved = Vec::new();
    let mut reopened = Vec::new();
    for w in after
        .iter()
        .filter(|w| seen.iter().any(|s| s.id == w.reservation.id))
    {
        let was = before.iter().find(|b| b.key == w.key);
        if was.is_some_and(|b| b.end() == w.end()) {
            continue;
        }
        let previous_end = match was {
            Some(b) => b.end(),
            None => reservations
                .iter()
                .find(|r| r.id == w.reservation.id)
                .map_or(w.start(), Reservation::end),
        };
        match out.iter_mut().find(|r| r.key == w.key) {
            Some(r) if r.state == WindowState::Ended => continue,
            Some(r) => {
                r.next_action_at = w.next_action_in(r.state);
                let n = relaunch_after(w, r.state, reopen, at);
                if let Some(n) = n
                    && r.state == WindowState::Stopping
                {
                    // Its stop is under way: finished first, then reopened
                    // ([`reopened_after_stop`]).
                    reopened.push((w.number, n, r.state));
                    r.relaunch = Some(n);
                } else if let (Some(n), Some(b)) = (n, was) {
                    // Drained: launched again at once. Running a job: its follow-on is due
                    // when the job's fixed runtime ends, at the old forced end.
                    reopened.push((w.number, n, r.state));
                    r.next_action_at = Some(if r.state == WindowState::Draining {
                        at
                    } else {
                        b.forced_at.max(at)
                    });
                    r.state = WindowState::Launching;
                    r.relaunch = Some(n);
                }
                r.notices = Some(r.notices.clone().unwrap_or_default().end_moved(at));
                r.updated_at = at;
            }
            None => out.push(w.record(w.state, at)),
        }
        moved.push((previous_end, w.clone()));
    }
    out.sort_by_key(|r| r.number);
    EndsMoved {
        reservations: after_reservations,
        records: out,
        moved,
        reopened,
    }
}

/// Every window's record, those never recorded included (as `Pending`, numbered): what the
/// store keeps once a reservation is recorded, so numbers are fixed from then on.
pub fn all_records(
    reservations: &[Reservation],
    records: &[WindowRecord],
    at: DateTime<Utc>,
) -> Vec<WindowRecord> {
    // The drain lead does not change numbers or a pending window's next action.
    let ws = windows(
        reservations,
        records,
        DrainLead {
            requested_minutes: 0,
            default_minutes: 0,
        },
    );
    let mut out = records.to_vec();
    for w in &ws {
        if !out.iter().any(|r| r.key == w.key) {
            out.push(w.record(w.state, at));
        }
    }
    out.sort_by_key(|r| r.number);
    out
}

/// A window that runs on after its request stops searching or buying, or that a
/// cancellation with `stop_running` stopped, as the answers list it (ARCHITECTURE §9.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KeptWindow {
    /// Its number among the request's windows.
    pub window: u32,
    pub reservation_id: String,
    /// Its state when the answer was written.
    pub state: WindowState,
    pub starts_at: DateTime<Utc>,
    /// When its drain starts: what runs in it is stopped then.
    pub drain_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
}

impl KeptWindow {
    pub fn of(w: &Window) -> KeptWindow {
        KeptWindow {
            window: w.number,
            reservation_id: w.reservation.id.clone(),
            state: w.state,
            starts_at: w.start(),
            drain_at: w.drain_at,
            ends_at: w.end(),
        }
    }
}

/// The windows not yet drained (launched or not), in start order: what a request keeps
/// running to its drain whatever its status, and what `stop_running` stops.
pub fn undrained(
    reservations: &[Reservation],
    records: &[WindowRecord],
    drain: DrainLead,
) -> Vec<Window> {
    undrained_of(&windows(reservations, records, drain))
}

/// Those of `windows` not yet drained (launched or not), in their order.
pub fn undrained_of(windows: &[Window]) -> Vec<Window> {
    windows
        .iter()
        .filter(|w| w.state.is_undrained())
        .cloned()
        .collect()
}

/// The undrained windows of `reservations`, as the answers list them.
pub fn kept(
    reservations: &[Reservation],
    records: &[WindowRecord],
    drain: DrainLead,
) -> Vec<KeptWindow> {
    listed(&undrained(reservations, records, drain))
}

/// `windows` as the answers list them.
pub fn listed(windows: &[Window]) -> Vec<KeptWindow> {
    windows.iter().map(KeptWindow::of).collect()
}

/// "window 2 (cr-1) drains at 2026-12-07 09:30 UTC; …", or "none".
pub fn describe(windows: &[KeptWindow]) -> String {
    if windows.is_empty() {
        return "none".into();
    }
    windows
        .iter()
        .map(|w| {
            format!(
                "window {} ({}, {}) drains at {}",
                w.window,
                w.reservation_id,
                w.state,
                w.drain_at.format("%Y-%m-%d %H:%M UTC")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The statuses whose meaning is a summary of the windows: bought, and no search or
/// purchase under way. Any other status is about the search or purchase, and its windows
/// go on beside it.
pub const FOLLOWS_WINDOWS: [RequestStatus; 3] = [
    RequestStatus::Reserved,
    RequestStatus::Active,
    RequestStatus::Draining,
];

/// Whether a request in `status` with windows keeps a next action of its own beside them:
/// every status but those that summarise their windows, and `Reserved`, whose payments the
/// purchase function checks until AWS reports each reservation scheduled (ARCHITECTURE
/// §8.5).
pub fn keeps_own_action(status: RequestStatus) -> bool {
    status == RequestStatus::Reserved || !FOLLOWS_WINDOWS.contains(&status)
}

/// The statuses in which a request may hold windows: launch and cleanup look at all of them.
/// A Failed, Rejected or Cancelled request among them: its status never decides the fate of
/// a paid window, which is launched, drained and ended like any other (ARCHITECTURE §9.1).
pub const HOLDS_WINDOWS: [RequestStatus; 11] = [
    RequestStatus::Reserved,
    RequestStatus::Active,
    RequestStatus::Draining,
    RequestStatus::Searching,
    RequestStatus::NotFound,
    RequestStatus::OfferingsFound,
    RequestStatus::AwaitingApproval,
    RequestStatus::Purchasing,
    RequestStatus::Failed,
    RequestStatus::Rejected,
    RequestStatus::Cancelled,
];

/// What a `FOLLOWS_WINDOWS` request's status is, given its windows: `Active` while one runs
/// (or an extension reopened one, [`WindowRecord::relaunch`]: its training job still runs to
/// the old end, or its workload is being launched again), else `Draining` while one drains,
/// else `Reserved` while one is still to come, else `Ended`. `None` without windows.
pub fn summary(records: &[WindowRecord]) -> Option<RequestStatus> {
    let has = |s: WindowState| records.iter().any(|r| r.state == s);
    let reopened = records
        .iter()
        .any(|r| r.state == WindowState::Launching && r.relaunch.is_some());
    if records.is_empty() {
        None
    } else if has(WindowState::Running) || reopened {
        Some(RequestStatus::Active)
    } else if has(WindowState::Stopping) || has(WindowState::Draining) {
        Some(RequestStatus::Draining)
    } else if has(WindowState::Pending) || has(WindowState::Launching) {
        Some(RequestStatus::Reserved)
    } else {
        Some(RequestStatus::Ended)
    }
}

/// When the request is due: the earliest of its own next action (its search, its lease) and
/// its windows'.
/// Whether what a request in `status` with these windows launched may be running now: a
/// window launching, running, stopping or draining, whatever the request's status (a Failed
/// or Cancelled request's paid window runs to its drain, ARCHITECTURE §9.1), or an on-demand
/// or spot run. Such a request is in every tick's read (ARCHITECTURE §8.14), so
/// replace-unhealthy sees its workloads and cleanup's sweep its windows without reading it.
pub fn may_be_running(status: RequestStatus, records: &[WindowRecord]) -> bool {
    matches!(
        status,
        RequestStatus::RunningOnDemand | RequestStatus::RunningSpot
    ) || records.iter().any(|r| {
        matches!(
            r.state,
            WindowState::Launching
                | WindowState::Running
                | WindowState::Stopping
                | WindowState::Draining
        )
    })
}

/// Whether a request in `status` with these windows is archived (its TTL set): `Ended`, or
/// terminal with no window left to launch, drain or end. A Failed, Rejected or Cancelled
/// request keeps its records while a paid window of it lives, however long (ARCHITECTURE
/// §9.1); its TTL is written when its last window ends.
pub fn archivable(status: RequestStatus, records: &[WindowRecord]) -> bool {
    status == RequestStatus::Ended
        || (status.is_terminal() && records.iter().all(|r| r.state == WindowState::Ended))
}

/// The reservations whose windows are not yet drained (any window not `Ended`): the orphan
/// sweep leaves their instances to the drain, whatever the request's status.
pub fn undrained_reservations(records: &[WindowRecord]) -> BTreeSet<String> {
    records
        .iter()
        .filter(|r| r.state != WindowState::Ended)
        .map(|r| r.reservation_id().to_string())
        .collect()
}

/// (Its windows' lead-time notices included: the `work` index holds the request then.)
pub fn next_action_at(
    own: Option<DateTime<Utc>>,
    records: &[WindowRecord],
) -> Option<DateTime<Utc>> {
    records
        .iter()
        .filter_map(|r| r.next_action_at)
        .chain(records.iter().filter_map(WindowRecord::notice_due))
        .chain(own)
        .min()
}

/// The earliest of its windows' own next actions (a launch, a drain, an end): what launch
/// and cleanup act on.
pub fn window_action_at(records: &[WindowRecord]) -> Option<DateTime<Utc>> {
    records.iter().filter_map(|r| r.next_action_at).min()
}

/// The earliest of its windows' lead-time notices ([`WindowRecord::notice_due`]): cleanup
/// sends them.
pub fn notice_at(records: &[WindowRecord]) -> Option<DateTime<Utc>> {
    records.iter().filter_map(WindowRecord::notice_due).min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::money::Usd;
    use crate::domain::offering::Product;
    use chrono::{Duration, TimeZone};

    fn t(day: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, day, 11, 30, 0).unwrap()
    }

    fn block(id: &str, from: u32, to: u32) -> Reservation {
        Reservation {
            id: id.into(),
            product: Product::CapacityBlock,
            region: "us-east-1".into(),
            instance_type: "p5.48xlarge".into(),
            instance_count: 1,
            segments: vec![Segment {
                start: t(from),
                end: t(to),
                availability_zone: None,
            }],
            upfront_fee: Usd::new(rust_decimal::Decimal::ONE),
            state: ReservationState::Scheduled,
            offering_id: None,
            request_tag: None,
            ultraserver: false,
            bought_at: None,
            debit_month: None,
            debit_team: None,
            payment_check_at: None,
            extensions: Vec::new(),
            extension_check_at: None,
            deployment_tag: None,
        }
    }

    const LEAD: DrainLead = DrainLead {
        requested_minutes: 0,
        default_minutes: 15,
    };

    /// EC2 instances, no cancellation: a drained window may be reopened, a running one not.
    const KEEP: Reopen = Reopen {
        fixed_runtime: false,
        stopped: false,
    };

    /// Which requests every tick reads whole (issue 51: `may_be_running` -> `true` put every
    /// request in it): a window launching, running, stopping or draining, or a run.
    #[test]
    fn only_a_request_with_a_window_under_way_or_a_run_may_be_running() {
        let ws = windows(&[block("cr-1", 3, 4)], &[], LEAD);
        let rec = |state| vec![ws[0].record(state, t(3))];
        for state in [WindowState::Pending, WindowState::Ended] {
            assert!(
                !may_be_running(RequestStatus::Searching, &rec(state)),
                "{state:?}"
            );
            assert!(!may_be_running(RequestStatus::Reserved, &rec(state)));
        }
        assert!(!may_be_running(RequestStatus::Searching, &[]));
        for state in [
            WindowState::Launching,
            WindowState::Running,
            WindowState::Stopping,
            WindowState::Draining,
        ] {
            assert!(
                may_be_running(RequestStatus::Failed, &rec(state)),
                "{state:?}"
            );
        }
        assert!(may_be_running(RequestStatus::RunningOnDemand, &[]));
        assert!(may_be_running(RequestStatus::RunningSpot, &[]));
    }

    #[test]
    fn a_window_drains_ahead_of_forced_termination_and_is_due_at_each_step() {
        let ws = windows(&[block("cr-1", 3, 4)], &[], LEAD);
        let w = &ws[0];
        assert_eq!(w.forced_at, t(4) - Duration::minutes(30));
        assert_eq!(w.drain_at, t(4) - Duration::minutes(45));
        assert_eq!(w.next_action_in(WindowState::Pending), Some(t(3)));
        assert_eq!(w.next_action_in(WindowState::Running), Some(w.drain_at));
        assert_eq!(w.next_action_in(WindowState::Draining), Some(t(4)));
        assert_eq!(w.next_action_in(WindowState::Ended), None);
    }

    #[test]
    fn a_replacement_that_starts_first_does_not_renumber_the_block_it_replaces() {
        let kept = block("cr-kept", 5, 6);
        let first = all_records(std::slice::from_ref(&kept), &[], t(1));
        assert_eq!(first[0].number, 0);
        let replacement = block("cr-new", 3, 4);
        let ws = windows(&[kept, replacement], &first, LEAD);
        let kept = ws.iter().find(|w| w.key == "cr-kept#0").unwrap();
        let new = ws.iter().find(|w| w.key == "cr-new#0").unwrap();
        assert_eq!((kept.number, new.number), (0, 1));
        assert_eq!(ws[0].key, "cr-new#0", "still in start order");
    }

    #[test]
    fn a_reservation_whose_payment_failed_keeps_a_window_only_for_what_was_launched() {
        // GIVEN two blocks recorded, both windows pending; cr-2's payment then fails
        let (a, mut b) = (block("cr-1", 3, 4), block("cr-2", 3, 4));
        let recs = all_records(&[a.clone(), b.clone()], &[], t(1));
        b.state = ReservationState::PaymentFailed;
        // THEN nothing is launched into cr-2's window
        let ws = windows(&[a.clone(), b.clone()], &recs, LEAD);
        let w2 = ws.iter().find(|w| w.key == "cr-2#0").unwrap();
        assert!(!w2.is_launchable(t(3)));
        assert!(
            ws.iter()
                .find(|w| w.key == "cr-1#0")
                .unwrap()
                .is_launchable(t(3))
        );
        // AND ending its records keeps its number taken, due for nothing, and drops the
        // window
        let ended = records_lost(&recs, "cr-2", t(2));
        let left = windows(&[a.clone(), b.clone()], &ended, LEAD);
        assert_eq!(
            left.iter().map(|w| w.key.as_str()).collect::<Vec<_>>(),
            ["cr-1#0"]
        );
        let lost = ended.iter().find(|r| r.key == "cr-2#0").unwrap();
        assert_eq!(
            (lost.state, lost.next_action_at, lost.updated_at),
            (WindowState::Ended, None, t(2))
        );
        assert_eq!(
            ended.iter().find(|r| r.key == "cr-1#0"),
            recs.iter().find(|r| r.key == "cr-1#0")
        );
        // AND one launched before the failure is still there to be drained
        let running = records_with(
            &recs,
            &windows(&[a, b.clone()], &recs, LEAD),
            "cr-1#0",
            WindowState::Running,
            t(3),
        );
        let mut launched = running.clone();
        launched
            .iter_mut()
            .find(|r| r.key == "cr-2#0")
            .unwrap()
            .state = WindowState::Running;
        let ws = windows(&[block("cr-1", 3, 4), b], &launched, LEAD);
        assert!(
            ws.iter()
                .any(|w| w.key == "cr-2#0" && w.needs_drain(t(5), false))
        );
    }

    #[test]
    fn a_past_window_is_not_launchable_but_still_needs_its_drain() {
        let ws = windows(&[block("cr-1", 3, 4)], &[], LEAD);
        let w = &ws[0];
        assert!(!w.is_launchable(t(4)));
        assert!(!w.is_launchable(w.drain_at));
        assert!(w.is_launchable(t(3)));
        assert!(w.needs_drain(t(5), false));
        assert!(!w.needs_end(t(5)), "a pending window drains before it ends");
    }

    #[test]
    fn the_summary_follows_the_most_alive_window() {
        let ws = windows(&[block("a", 3, 4), block("b", 4, 5)], &[], LEAD);
        let recs = |sa, sb| vec![ws[0].record(sa, t(1)), ws[1].record(sb, t(1))];
        use WindowState::*;
        assert_eq!(
            summary(&recs(Running, Pending)),
            Some(RequestStatus::Active)
        );
        assert_eq!(
            summary(&recs(Draining, Running)),
            Some(RequestStatus::Active)
        );
        assert_eq!(
            summary(&recs(Draining, Pending)),
            Some(RequestStatus::Draining)
        );
        assert_eq!(
            summary(&recs(Ended, Pending)),
            Some(RequestStatus::Reserved)
        );
        assert_eq!(summary(&recs(Ended, Ended)), Some(RequestStatus::Ended));
        assert_eq!(summary(&[]), None);
    }

    /// ARCHITECTURE §9.3: an end AWS moved (an extension bought in the console) moves the
    /// window's drain and next action, and its Ending notices start over for the new end;
    /// its Opening notices stand.
    #[test]
    fn an_end_aws_moved_later_moves_the_drain_the_next_action_and_the_ending_notices() {
        let recorded = block("cr-1", 3, 4);
        let ws = windows(std::slice::from_ref(&recorded), &[], LEAD);
        let mut running = ws[0].record(WindowState::Running, t(3));
        running.notices = Some(NoticeMarks {
            done: vec!["ending-1440m".into(), "opening-60m".into()],
            next_at: Some(t(4) - Duration::minutes(45 + 780)),
            end_moved_at: None,
        });
        let mut seen = block("cr-1", 3, 5);
        seen.state = ReservationState::Active;
        let moved = recorded.read_back(&seen).expect("the end moved");
        assert_eq!(moved.end(), t(5));
        let at = t(3) + Duration::hours(2);
        let m = ends_moved(
            std::slice::from_ref(&recorded),
            std::slice::from_ref(&running),
            std::slice::from_ref(&moved),
            LEAD,
            KEEP,
            at,
        );
        assert_eq!(m.reservations, vec![moved.clone()]);
        let r = &m.records[0];
        assert_eq!(r.state, WindowState::Running);
        assert_eq!(r.next_action_at, Some(t(5) - Duration::minutes(45)));
        let marks = r.notices.clone().unwrap();
        assert_eq!(marks.done, vec!["opening-60m".to_string()]);
        assert_eq!((marks.next_at, marks.end_moved_at), (Some(at), Some(at)));
        assert_eq!(m.moved.len(), 1);
        assert_eq!(m.moved[0].0, t(4));
        assert_eq!(m.moved[0].1.drain_at, t(5) - Duration::minutes(45));
        // An ended window stays as it is.
        let ended = ws[0].record(WindowState::Ended, t(4));
        let m = ends_moved(
            std::slice::from_ref(&recorded),
            std::slice::from_ref(&ended),
            std::slice::from_ref(&moved),
            LEAD,
            KEEP,
            at,
        );
        assert_eq!(m.records, vec![ended]);
        assert!(m.moved.is_empty());
    }

    /// Issue 58: an extension whose payment clears after the drain began reopens the window
    /// (launched again into the extended window), once, and only for capacity-pilot's own
    /// extension, never for a window a cancellation stopped; a training job running to its
    /// fixed old end gets its follow-on when it stops; a window still stopping is reopened
    /// once its stop is done.
    #[test]
    fn an_extension_paid_after_the_drain_reopens_the_window_once_and_only_ours() {
        let recorded = block("cr-1", 3, 4);
        let ws = windows(std::slice::from_ref(&recorded), &[], LEAD);
        let drained_at = t(4) - Duration::minutes(45);
        let at = drained_at + Duration::minutes(10);
        let ours = crate::fakes::fixtures::extended_by_us(block("cr-1", 3, 4), 1, t(5));
        let moved = |state: WindowState, seen: &Reservation, reopen: Reopen| {
            ends_moved(
                std::slice::from_ref(&recorded),
                &[ws[0].record(state, drained_at)],
                std::slice::from_ref(seen),
                LEAD,
                reopen,
                at,
            )
        };
        // Drained at the old end: launched again at once, under extension 1's relaunch.
        let m = moved(WindowState::Draining, &ours, KEEP);
        let r = &m.records[0];
        assert_eq!(
            (r.state, r.relaunch, r.next_action_at),
            (WindowState::Launching, Some(1), Some(at))
        );
        assert_eq!(m.reopened, vec![(ws[0].number, 1, WindowState::Draining)]);
        assert!(
            m.said().iter().any(|s| s.contains("launched again")),
            "{:?}",
            m.said()
        );
        // Once: the end read back again moves nothing and reopens nothing.
        let again = ends_moved(&m.reservations, &m.records, &m.reservations, LEAD, KEEP, at);
        assert_eq!((again.records, again.reopened), (m.records.clone(), vec![]));
        // An extension bought outside capacity-pilot (its fee not counted): drained it stays.
        let external = block("cr-1", 3, 5);
        let m = moved(WindowState::Draining, &external, KEEP);
        assert_eq!(
            (m.records[0].state, m.records[0].relaunch),
            (WindowState::Draining, None)
        );
        // A cancellation with stop_running stopped it: drained it stays.
        let stopped = Reopen {
            stopped: true,
            ..KEEP
        };
        let m = moved(WindowState::Draining, &ours, stopped);
        assert_eq!(m.records[0].state, WindowState::Draining);
        assert!(m.reopened.is_empty());
        // EC2 instances still running: they run on, nothing is launched.
        let m = moved(WindowState::Running, &ours, KEEP);
        assert_eq!(
            (m.records[0].state, m.records[0].relaunch),
            (WindowState::Running, None)
        );
        // A training job running to its fixed old end: its follow-on is due when it stops,
        // at the old forced end.
        let job = Reopen {
            fixed_runtime: true,
            ..KEEP
        };
        let m = moved(WindowState::Running, &ours, job);
        let r = &m.records[0];
        assert_eq!(
            (r.state, r.relaunch, r.next_action_at),
            (WindowState::Launching, Some(1), Some(ws[0].forced_at))
        );
        assert!(m.said().iter().any(|s| s.contains("follow-on")));
        // The request stays Active meanwhile: its job runs.
        assert_eq!(summary(&m.records), Some(RequestStatus::Active));
        // Still stopping: its stop goes on, and it is reopened once the stop is done.
        let m = moved(WindowState::Stopping, &ours, KEEP);
        let r = &m.records[0];
        assert_eq!((r.state, r.relaunch), (WindowState::Stopping, Some(1)));
        let after = windows(&m.reservations, &m.records, LEAD);
        assert_eq!(reopened_after_stop(&after[0], KEEP, at), Some(1));
        assert_eq!(reopened_after_stop(&after[0], stopped, at), None);
        assert_eq!(
            reopened_after_stop(&after[0], KEEP, after[0].drain_at),
            None
        );
        // Paid too late: the new drain has passed, nothing is reopened.
        let late = crate::fakes::fixtures::extended_by_us(
            block("cr-1", 3, 4),
            1,
            at + Duration::minutes(45),
        );
        let m = moved(WindowState::Draining, &late, KEEP);
        assert_eq!(m.records[0].state, WindowState::Draining);
    }

    #[test]
    fn only_what_can_be_an_extension_is_read_back() {
        let recorded = block("cr-1", 3, 4);
        let seen = |f: &dyn Fn(&mut Reservation)| {
            let mut r = block("cr-1", 3, 5);
            f(&mut r);
            recorded.read_back(&r)
        };
        assert!(seen(&|_| {}).is_some());
        // Final, or not yet paid for: the recorded end stands.
        for state in [
            ReservationState::Expired,
            ReservationState::Cancelled,
            ReservationState::PaymentPending,
            ReservationState::Pending,
        ] {
            assert!(seen(&|r| r.state = state).is_none(), "{state}");
        }
        // Another reservation, a segment starting elsewhere, fewer segments, under a minute.
        assert!(seen(&|r| r.id = "cr-2".into()).is_none());
        assert!(seen(&|r| r.segments[0].start = t(2)).is_none());
        assert!(seen(&|r| r.segments.clear()).is_none());
        assert!(seen(&|r| r.segments[0].end = t(4) + Duration::seconds(59)).is_none());
        assert!(
            block("cr-1", 3, 4)
                .read_back(&block("cr-1", 3, 4))
                .is_none()
        );
        // An earlier end is read back too: AWS terminates by its end, not ours.
        assert_eq!(
            seen(&|r| r.segments[0].end = t(4) - Duration::hours(1)).map(|r| r.end()),
            Some(t(4) - Duration::hours(1))
        );
    }

    /// A plan extension that adds a reserved capacity (sources are silent on which it does)
    /// is a new window, numbered after every other.
    #[test]
    fn a_segment_aws_adds_is_a_new_window_numbered_after_the_others() {
        let mut plan = block("arn:plan", 3, 4);
        plan.segments.push(Segment {
            start: t(5),
            end: t(6),
            availability_zone: None,
        });
        let records = all_records(std::slice::from_ref(&plan), &[], t(1));
        let mut seen = plan.clone();
        seen.segments.push(Segment {
            start: t(6),
            end: t(7),
            availability_zone: None,
        });
        let moved = plan.read_back(&seen).expect("a segment was added");
        let m = ends_moved(
            std::slice::from_ref(&plan),
            &records,
            std::slice::from_ref(&moved),
            LEAD,
            KEEP,
            t(2),
        );
        assert_eq!(m.records.len(), 3);
        let added = &m.records[2];
        assert_eq!(
            (added.key.as_str(), added.number, added.state),
            ("arn:plan#2", 2, WindowState::Pending)
        );
        assert_eq!(added.next_action_at, Some(t(6)));
        assert_eq!(m.moved.len(), 1);
        assert_eq!(m.moved[0].0, t(6));
    }
}
