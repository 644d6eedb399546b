//! The state store in memory, with every semantic of the `Store` port: conditional
//! transitions, processed-event records, the outbox, the purchase lease, the budget ledger,
//! due work and archival. Each write is applied whole or not at all, as the DynamoDB
//! adapter's single `TransactWriteItems` is.
//!
//! Time: archival is measured from the `at` of the write that ended a request, and an item
//! counts as gone once the store's "now" reaches its expiry. The store's now is the latest
//! time it has been told (every write's `at`, every `due`'s `now`, [`InMemoryStore::advance_to`])
//! or, when attached, a [`ManualClock`]'s, whichever is later. Nothing reads the wall clock.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};

use super::{Fault, Faults, Gate, ManualClock, errors, lock};
use crate::domain::money::MicroUsd;
use crate::domain::request::{RequestId, Team};
use crate::domain::reservation::Reservation;
use crate::domain::status::RequestStatus;
use crate::domain::window;
use crate::ports::{
    Agenda, BeginPurchase, BeginPurchaseOutcome, BudgetMonth, Cause, Claim, ClaimKey, ClaimWrite,
    CreateOutcome, Debit, DetectorDue, DueItem, FailInDoubt, HistoryEntry, KeepCancellation,
    LeaseWriteOutcome, LiveRequest, MarkPurchaseCall, NewRequest, OutboundEvent, OutboxItem,
    Pacing, Pause, PaymentDue, PortError, PurchaseCall, REJECTION_KEPT, RecordReservation,
    RejectedSubmission, ReleaseUnbought, RequestRecord, Store, Tombstone, TombstoneOutcome,
    Transition, WindowUpdate, WorkloadRecord, WriteOutcome, outbox_seq,
};
use crate::search::{Allowance, DESCRIBE_PACE};

/// How long an ended request (and a processed-event record, and a sent outbox item) is
/// kept before archival removes it; the DynamoDB adapter's TTL is the same.
pub const DEFAULT_RETENTION: Duration = Duration::days(90);

const SERVICE: &str = "store";

/// The store's operations, for scripting faults and reading the call log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StoreOp {
    CreateRequest,
    Claim,
    WriteClaim,
    GetRequest,
    Transition,
    BeginPurchase,
    RecordReservation,
    ReleaseUnbought,
    MarkPurchaseCall,
    FailInDoubt,
    ClaimDetector,
    KeepCancellation,
    PutTombstone,
    RecordRejection,
    Rejections,
    UpdateWindows,
    Reservations,
    BudgetSpent,
    PutWorkload,
    Workloads,
    UnsentOutbox,
    MarkSent,
    ClaimOutbox,
    Due,
    Agenda,
    History,
    ReadPause,
    PutPause,
    DeletePause,
}

impl StoreOp {
    pub fn is_write(self) -> bool {
        matches!(
            self,
            StoreOp::CreateRequest
                | StoreOp::WriteClaim
                | StoreOp::Transition
                | StoreOp::BeginPurchase
                | StoreOp::RecordReservation
                | StoreOp::ReleaseUnbought
                | StoreOp::MarkPurchaseCall
                | StoreOp::FailInDoubt
                | StoreOp::ClaimDetector
                | StoreOp::KeepCancellation
                | StoreOp::PutTombstone
                | StoreOp::RecordRejection
                | StoreOp::UpdateWindows
                | StoreOp::PutWorkload
                | StoreOp::MarkSent
                | StoreOp::PutPause
                | StoreOp::DeletePause
        )
    }
}

#[derive(Debug, Clone)]
struct Stored {
    record: RequestRecord,
    /// Where the open debit was charged, so a release credits the same month.
    open_debit_ledger: Option<(Team, BudgetMonth)>,
    /// Set by a transition into a terminal status.
    expires_at: Option<DateTime<Utc>>,
    /// The status before the write being committed, for its history entry.
    changed_from: Option<RequestStatus>,
}

#[derive(Debug, Clone)]
struct OutboxEntry {
    item: OutboxItem,
    sent: bool,
    expires_at: Option<DateTime<Utc>>,
    /// Held by a publishing run until then.
    claimed_until: Option<DateTime<Utc>>,
}

#[derive(Debug, Default)]
struct State {
    requests: BTreeMap<RequestId, Stored>,
    /// (request, event id) -> when the record expires.
    events: BTreeMap<(RequestId, String), DateTime<Utc>>,
    /// In the order first recorded; a re-recorded id is replaced in place. Reads return
    /// them by id, as DynamoDB's sort key does.
    reservations: BTreeMap<RequestId, Vec<Reservation>>,
    workloads: BTreeMap<RequestId, BTreeMap<(String, u32), WorkloadRecord>>,
    outbox: BTreeMap<(String, String), OutboxEntry>,
    ledger: BTreeMap<(Team, BudgetMonth), i64>,
    /// By the id lower-cased (review N15).
    tombstones: BTreeMap<String, Tombstone>,
    /// By the id lower-cased, then the rejected event's id.
    rejections: BTreeMap<(String, String), RejectedSubmission>,
    /// Workload names and who claims them (ARCHITECTURE §9.8).
    claims: BTreeMap<ClaimKey, Claim>,
    history: BTreeMap<RequestId, Vec<HistoryEntry>>,
    /// Committed writes of requests ([`Store::outbox_writes`]).
    writes: u64,
    /// Each region's Capacity Block search allowance ([`Pacing`]).
    allowances: BTreeMap<String, Allowance>,
    /// Each region's detector of unrecorded reservations: its next run.
    detectors: BTreeMap<String, DateTime<Utc>>,
    /// Purchases paused by an operator (ARCHITECTURE §9.7).
    paused: Option<Pause>,
    /// Pauses an operator commits just before the next call of an op.
    pause_before: Vec<(StoreOp, Pause)>,
    retention: Duration,
    told: Option<DateTime<Utc>>,
    clock: Option<ManualClock>,
    faults: Faults<StoreOp>,
    write_faults: VecDeque<Fault>,
    /// Writes before which another writer bumps the request's version (a lost race).
    races: Vec<StoreOp>,
    read_faults: VecDeque<Fault>,
    calls: Vec<StoreOp>,
    /// Every call yields to the runtime first, so invocations joined on one task
    /// interleave at each store call instead of each running to its end.
    interleave: bool,
    gate: Option<Gate>,
}

/// One request's due times ([`InMemoryStore::due_times`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueTimes {
    pub status: RequestStatus,
    pub own: Option<DateTime<Utc>>,
    /// Its windows' next actions, and their lead-time notices (cleanup's work too).
    pub window: Option<DateTime<Utc>>,
    /// Its reservations' payment and extension reads ([`Reservation::payment_due`]): the
    /// purchase function's, whatever the request's status.
    pub payment: Option<DateTime<Utc>>,
}

/// An in-memory [`Store`]; clones share the data.
#[derive(Debug, Clone)]
pub struct InMemoryStore {
    state: Arc<Mutex<State>>,
}

impl Default for InMemoryStore {
    fn default() -> Self {
        InMemoryStore::new()
    }
}

fn illegal(from: RequestStatus, to: RequestStatus, why: &str) -> PortError {
    errors::permanent(
        SERVICE,
        "IllegalTransition",
        format!("{from} -> {to}: {why}"),
    )
}

/// A hold needs a debit; settling the open debit and debiting are separate writes.
fn check_hold(t: &Transition) -> Result<(), PortError> {
    if (t.hold && t.debit.is_none()) || (t.settle.is_some() && t.debit.is_some()) {
        return Err(errors::permanent(
            SERVICE,
            "InvalidHold",
            "a hold needs a debit, and a write that settles the open debit debits nothing",
        ));
    }
    Ok(())
}

fn check_refund(t: &Transition) -> Result<(), PortError> {
    match &t.refund {
        Some(r) if r.amount.0 <= 0 => Err(errors::permanent(
            SERVICE,
            "InvalidRefund",
            format!("a refund must be positive, got {}", r.amount),
        )),
        Some(_) if t.debit.is_some() || t.settle.is_some() => Err(errors::permanent(
            SERVICE,
            "InvalidRefund",
            "a refund neither debits nor settles an open debit in the same write",
        )),
        _ => Ok(()),
    }
}

fn check_debit(debit: &Option<Debit>) -> Result<(), PortError> {
    match debit {
        Some(d) if d.amount.0 <= 0 => Err(errors::permanent(
            SERVICE,
            "InvalidDebit",
            format!("a debit must be positive, got {} micro-USD", d.amount.0),
        )),
        _ => Ok(()),
    }
}

/// Why a debit does not fit, checked in the adapter's order: the request's cap, then the
/// team's.
enum OverBudget {
    Request { spent: MicroUsd, cap: MicroUsd },
    Team { spent: MicroUsd, cap: MicroUsd },
}

impl InMemoryStore {
    pub fn new() -> InMemoryStore {
        InMemoryStore {
            state: Arc::new(Mutex::new(State {
                retention: DEFAULT_RETENTION,
                ..State::default()
            })),
        }
    }

    /// Archival after `retention` instead of [`DEFAULT_RETENTION`].
    pub fn with_retention(self, retention: Duration) -> InMemoryStore {
        lock(&self.state).retention = retention;
        self
    }

    /// Reads the store's now from `clock` too (the later of it and the times told).
    pub fn with_clock(self, clock: ManualClock) -> InMemoryStore {
        lock(&self.state).clock = Some(clock);
        self
    }

    /// Tells the store that time has reached `t` (archived items past their TTL vanish).
    pub fn advance_to(&self, t: DateTime<Utc>) {
        lock(&self.state).observe(t);
    }

    // ---- seeding -----------------------------------------------------------------------

    /// Puts a record as it is, e.g. a request already `Active` at version 7. An open debit
    /// on it is taken as charged to the record's team in the month of its `updated_at`.
    /// The ledger is not touched: seed it with [`InMemoryStore::set_spent`].
    pub fn insert_record(&self, record: RequestRecord) {
        let mut s = lock(&self.state);
        let open_debit_ledger = record
            .open_debit
            .map(|_| (record.team.clone(), BudgetMonth::of(record.updated_at)));
        let expires_at = record.archivable().then(|| record.updated_at + s.retention);
        s.requests.insert(
            record.request_id.clone(),
            Stored {
                record,
                open_debit_ledger,
                expires_at,
                changed_from: None,
            },
        );
    }

    /// Forgets a record's purchase doubt and call marker, leaving all else as it is: the
    /// record reads as one written by a release before `doubt` was. Nothing is committed, so
    /// nothing is published and the version stays.
    pub fn forget_doubt(&self, request_id: &RequestId) {
        if let Some(stored) = lock(&self.state).requests.get_mut(request_id) {
            stored.record.doubt = None;
            stored.record.purchase_call = None;
        }
    }

    /// A reservation recorded for `request_id` as if bought (a split's kept block, say).
    pub fn insert_reservation(&self, request_id: &RequestId, reservation: Reservation) {
        lock(&self.state)
            .reservations
            .entry(request_id.clone())
            .or_default()
            .push(reservation);
    }

    /// What a team has already spent in a month.
    pub fn set_spent(&self, team: &Team, month: &BudgetMonth, spent: MicroUsd) {
        lock(&self.state)
            .ledger
            .insert((team.clone(), month.clone()), spent.0);
    }

    // ---- faults ------------------------------------------------------------------------

    /// Just before the next `op` (a `Transition`), another writer changes the request: its
    /// version moves on, so the write loses the race (`Conflict`) and the caller must read
    /// again.
    pub fn race_next(&self, op: StoreOp) {
        lock(&self.state).races.push(op);
    }

    /// Pauses purchases (`Some`) or resumes them (`None`) at once, as `capacity-pilot pause`
    /// and `resume` do, outside any run (ARCHITECTURE §9.7).
    pub fn set_pause(&self, pause: Option<Pause>) {
        lock(&self.state).paused = pause;
    }

    /// Just before the next call of `op`, an operator pauses purchases with `pause`
    /// (ARCHITECTURE §9.7): what the run read before no longer holds.
    pub fn pause_before_next(&self, op: StoreOp, pause: Pause) {
        lock(&self.state).pause_before.push((op, pause));
    }

    /// The next call of `op` returns `error`, writing nothing.
    pub fn fail_next(&self, op: StoreOp, error: PortError) {
        lock(&self.state).faults.push(op, Fault::Fail(error));
    }

    /// The next call of `op` commits, then returns `error`: a crash (or a lost response)
    /// right after the commit.
    pub fn commit_then_fail_next(&self, op: StoreOp, error: PortError) {
        lock(&self.state)
            .faults
            .push(op, Fault::ApplyThenFail(error));
    }

    /// The next `n` writes of any kind return `error`, writing nothing.
    pub fn fail_next_writes(&self, n: usize, error: PortError) {
        let mut s = lock(&self.state);
        for _ in 0..n {
            s.write_faults.push_back(Fault::Fail(error.clone()));
        }
    }

    /// The next `n` writes of any kind commit, then return `error`.
    pub fn commit_then_fail_next_writes(&self, n: usize, error: PortError) {
        let mut s = lock(&self.state);
        for _ in 0..n {
            s.write_faults
                .push_back(Fault::ApplyThenFail(error.clone()));
        }
    }

    /// The next `n` reads of any kind return `error`.
    pub fn fail_next_reads(&self, n: usize, error: PortError) {
        let mut s = lock(&self.state);
        for _ in 0..n {
            s.read_faults.push_back(Fault::Fail(error.clone()));
        }
    }

    pub fn clear_faults(&self) {
        let mut s = lock(&self.state);
        s.faults.clear();
        s.write_faults.clear();
        s.read_faults.clear();
    }

    // ---- assertions --------------------------------------------------------------------

    /// Every call, in order.
    pub fn calls(&self) -> Vec<StoreOp> {
        lock(&self.state).calls.clone()
    }

    /// The event ids recorded for a request (expired ones included).
    pub fn processed_events(&self, request_id: &RequestId) -> Vec<String> {
        lock(&self.state)
            .events
            .keys()
            .filter(|(r, _)| r == request_id)
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// Every outbox item with whether it was marked sent, oldest first.
    pub fn outbox(&self) -> Vec<(OutboxItem, bool)> {
        let s = lock(&self.state);
        let mut all: Vec<_> = s
            .outbox
            .values()
            .map(|e| (e.item.clone(), e.sent))
            .collect();
        all.sort_by(|a, b| outbox_order(&a.0).cmp(&outbox_order(&b.0)));
        all
    }

    /// The whole ledger, in micro-USD.
    pub fn ledger(&self) -> BTreeMap<(Team, BudgetMonth), MicroUsd> {
        lock(&self.state)
            .ledger
            .iter()
            .map(|(k, v)| (k.clone(), MicroUsd(*v)))
            .collect()
    }

    /// Every request record held (archived ones gone), by id.
    pub fn records(&self) -> Vec<RequestRecord> {
        lock(&self.state)
            .requests
            .values()
            .map(|s| s.record.clone())
            .collect()
    }

    /// The record of the request whose id reads `request_id`, if held.
    pub fn record_of(&self, request_id: &str) -> Option<RequestRecord> {
        lock(&self.state)
            .requests
            .values()
            .find(|s| s.record.request_id.as_str() == request_id)
            .map(|s| s.record.clone())
    }

    /// Every request's history, as recorded (for checks; no fault or pause applies).
    pub fn all_history(&self) -> BTreeMap<RequestId, Vec<HistoryEntry>> {
        lock(&self.state).history.clone()
    }

    /// Every reservation recorded, by request.
    pub fn all_reservations(&self) -> BTreeMap<RequestId, Vec<Reservation>> {
        lock(&self.state).reservations.clone()
    }

    /// Every workload record, of every request.
    pub fn all_workloads(&self) -> Vec<WorkloadRecord> {
        lock(&self.state)
            .workloads
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// Each request's status, own next action and earliest window next action, and whether
    /// any outbox item is unsent: what a simulation schedules each function's ticks by.
    pub fn due_times(&self) -> (Vec<DueTimes>, bool) {
        let s = lock(&self.state);
        let unsent = s.outbox.values().any(|e| !e.sent);
        let times = s
            .requests
            .values()
            .map(|r| DueTimes {
                status: r.record.status,
                own: r.record.next_action_at,
                window: r
                    .record
                    .windows
                    .iter()
                    .filter_map(|w| w.next_action_at)
                    .chain(crate::domain::window::notice_at(&r.record.windows))
                    .min(),
                payment: s
                    .reservations
                    .get(&r.record.request_id)
                    .into_iter()
                    .flatten()
                    .filter_map(Reservation::payment_due)
                    .min(),
            })
            .collect();
        (times, unsent)
    }

    /// When an ended request will be archived.
    pub fn expires_at(&self, request_id: &RequestId) -> Option<DateTime<Utc>> {
        lock(&self.state)
            .requests
            .get(request_id)
            .and_then(|r| r.expires_at)
    }

    /// Logs the call and takes its scripted fault: `Err` to return at once, or an error
    /// to return after the work.
    /// Makes every call yield first: handlers joined with `tokio::join!` then interleave at
    /// each store call, as concurrent invocations do, instead of running one after another
    /// (the fakes never wait, so without this nothing interleaves).
    pub fn interleave(&self) {
        lock(&self.state).interleave = true;
    }

    /// Passes every later call through `gate` ([`Gate`]): the simulation's crash points and
    /// interleavings.
    pub fn gate(&self, gate: Gate) {
        lock(&self.state).gate = Some(gate);
    }

    async fn pause(&self, what: &str) {
        let (yields, gate) = {
            let s = lock(&self.state);
            (s.interleave, s.gate.clone())
        };
        if yields {
            tokio::task::yield_now().await;
        }
        if let Some(g) = gate {
            g.point(what).await;
        }
    }

    fn begin(&self, op: StoreOp) -> Result<Option<PortError>, PortError> {
        let mut s = lock(&self.state);
        s.calls.push(op);
        if let Some(i) = s.pause_before.iter().position(|(o, _)| *o == op) {
            let (_, p) = s.pause_before.remove(i);
            s.paused = Some(p);
        }
        let fault = match s.faults.next(op) {
            Some(f) => Some(f),
            None if op.is_write() => s.write_faults.pop_front(),
            None => s.read_faults.pop_front(),
        };
        match fault {
            Some(Fault::Fail(e)) => Err(e),
            Some(Fault::ApplyThenFail(e)) => Ok(Some(e)),
            None => Ok(None),
        }
    }
}

fn finish<T>(after: Option<PortError>, value: Result<T, PortError>) -> Result<T, PortError> {
    match after {
        Some(e) => {
            value?;
            Err(e)
        }
        None => value,
    }
}

fn outbox_order(i: &OutboxItem) -> (DateTime<Utc>, &str, u32, &str) {
    (i.created_at, &i.request_id, i.seq, &i.event.event_key)
}

impl State {
    fn observe(&mut self, t: DateTime<Utc>) {
        self.told = Some(self.told.map_or(t, |told| told.max(t)));
    }

    fn now(&self) -> Option<DateTime<Utc>> {
        let clock = self.clock.as_ref().map(ManualClock::get);
        match (self.told, clock) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    fn expired(&self, expires_at: Option<DateTime<Utc>>) -> bool {
        match (expires_at, self.now()) {
            (Some(e), Some(now)) => e <= now,
            _ => false,
        }
    }

    /// The live (not archived) request.
    fn live(&self, id: &RequestId) -> Option<&Stored> {
        self.requests
            .get(id)
            .filter(|r| !self.expired(r.expires_at))
    }

    /// The request of another spelling that holds `id` ignoring case (review N15).
    fn spelled(&self, id: &RequestId) -> Option<RequestId> {
        self.requests
            .iter()
            .find(|(k, r)| *k != id && k.same_as(id) && !self.expired(r.expires_at))
            .map(|(k, _)| k.clone())
    }

    fn seen(&self, id: &RequestId, cause: &Cause) -> bool {
        self.events
            .get(&(id.clone(), cause.event_id.clone()))
            .is_some_and(|e| !self.expired(Some(*e)))
    }

    fn spent(&self, team: &Team, month: &BudgetMonth) -> MicroUsd {
        MicroUsd(
            self.ledger
                .get(&(team.clone(), month.clone()))
                .copied()
                .unwrap_or(0),
        )
    }

    fn over_budget(&self, record: &RequestRecord, d: &Debit) -> Option<OverBudget> {
        if d.over_request_cap(record.spent) {
            return Some(OverBudget::Request {
                spent: record.spent,
                cap: d.request_cap,
            });
        }
        let team = self.spent(&d.team, &d.month);
        if team.0 + d.amount.0 > d.team_cap.0 {
            return Some(OverBudget::Team {
                spent: team,
                cap: d.team_cap,
            });
        }
        None
    }

    fn charge(&mut self, d: &Debit) {
        *self
            .ledger
            .entry((d.team.clone(), d.month.clone()))
            .or_default() += d.amount.0;
    }

    /// The parts every write shares: the processed-event record and the outbox items.
    fn commit(
        &mut self,
        id: &RequestId,
        cause: &Cause,
        at: DateTime<Utc>,
        outbox: &[OutboundEvent],
    ) {
        self.events
            .insert((id.clone(), cause.event_id.clone()), at + self.retention);
        self.writes += 1;
        if let Some(stored) = self.requests.get_mut(id) {
            let r = &stored.record;
            let entry = HistoryEntry {
                version: r.version,
                from: if r.version == 1 {
                    None
                } else {
                    stored.changed_from
                },
                to: r.status,
                reason: r.reason.clone(),
                cause: cause.event_id.clone(),
                at,
            };
            let log = self.history.entry(id.clone()).or_default();
            // A tombstone's commit writes no version of the request.
            if log.last().is_none_or(|l| l.version < entry.version) {
                log.push(entry);
            }
        }
        let version = self.requests.get(id).map_or(0, |r| r.record.version);
        for (i, ev) in outbox.iter().enumerate() {
            let seq = outbox_seq(version, i);
            self.outbox.insert(
                (id.to_string(), ev.event_key.clone()),
                OutboxEntry {
                    item: OutboxItem {
                        request_id: id.to_string(),
                        event: ev.clone(),
                        created_at: at,
                        seq,
                    },
                    sent: false,
                    expires_at: None,
                    claimed_until: None,
                },
            );
        }
    }

    /// Status, version, reason and times, and archival when the status is terminal.
    fn step(
        &mut self,
        id: &RequestId,
        to: RequestStatus,
        reason: &str,
        next_action_at: Option<DateTime<Utc>>,
        at: DateTime<Utc>,
    ) -> u64 {
        let retention = self.retention;
        let stored = self
            .requests
            .get_mut(id)
            .expect("the caller checked the request exists");
        stored.changed_from = Some(stored.record.status);
        let r = &mut stored.record;
        r.status = to;
        r.version += 1;
        r.reason = reason.to_string();
        r.next_action_at = next_action_at;
        r.updated_at = at;
        let version = r.version;
        archive(stored, at, retention);
        version
    }

    /// Unsent outbox items, oldest first.
    fn unsent(&self) -> Vec<OutboxItem> {
        let mut unsent: Vec<OutboxItem> = self
            .outbox
            .values()
            .filter(|e| !e.sent && !self.expired(e.expires_at))
            .map(|e| e.item.clone())
            .collect();
        unsent.sort_by(|a, b| outbox_order(a).cmp(&outbox_order(b)));
        unsent
    }

    /// What a tick reads at `now` ([`Store::agenda`]).
    fn agenda(&self, now: DateTime<Utc>) -> Agenda {
        let mut a = Agenda {
            pause: self.paused.clone(),
            ..Agenda::default()
        };
        for r in self
            .requests
            .values()
            .filter(|r| !self.expired(r.expires_at))
        {
            let rec = &r.record;
            if r.expires_at.is_some() && rec.status.is_terminal() && !rec.archivable() {
                a.stale_ttl.push(rec.request_id.clone());
            }
            if let Some(at) = rec.due_at()
                && at <= now
            {
                a.due.push(DueItem {
                    request_id: rec.request_id.clone(),
                    status: rec.status,
                    next_action_at: at,
                    own_action_at: rec.next_action_at,
                    window_action_at: window::window_action_at(&rec.windows),
                    notice_at: window::notice_at(&rec.windows),
                });
            }
            if window::may_be_running(rec.status, &rec.windows) {
                a.live.push(LiveRequest {
                    request_id: rec.request_id.clone(),
                    status: rec.status,
                    windows: rec.windows.clone(),
                    workloads: self
                        .workloads
                        .get(&rec.request_id)
                        .map(|m| m.values().cloned().collect())
                        .unwrap_or_default(),
                });
            }
        }
        a.due.sort_by(|x, y| {
            (x.next_action_at, &x.request_id).cmp(&(y.next_action_at, &y.request_id))
        });
        for (id, held) in &self.reservations {
            if self.live(id).is_none() {
                continue;
            }
            for r in held {
                if let Some(at) = r.payment_due()
                    && at <= now
                {
                    a.payments.push(PaymentDue {
                        request_id: id.clone(),
                        reservation_id: r.id.clone(),
                        at,
                    });
                }
            }
        }
        a.payments.sort();
        a.detectors = self
            .detectors
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(region, at)| DetectorDue {
                at: *at,
                region: region.clone(),
            })
            .collect();
        a.detectors.sort();
        a.outbox = self.unsent();
        a
    }

    fn holds_lease(&self, id: &RequestId, token: &str) -> bool {
        self.live(id).is_some_and(|s| {
            s.record.status == RequestStatus::Purchasing
                && s.record.lease.as_ref().is_some_and(|l| l.token == token)
        })
    }

    fn create_request(&mut self, new: NewRequest) -> CreateOutcome {
        let id = new.request.id.clone();
        self.observe(new.at);
        if self.seen(&id, &new.caused_by) {
            return CreateOutcome::DuplicateEvent;
        }
        // A `Planned` request's id takes a new request (ARCHITECTURE §8.1).
        let planned = self
            .live(&id)
            .is_some_and(|r| r.record.status == RequestStatus::Planned);
        if (self.live(&id).is_some() && !planned) || self.spelled(&id).is_some() {
            return CreateOutcome::AlreadyExists;
        }
        if new.cancelled.is_none()
            && let Some(t) = self.tombstones.get(&id.folded())
            && t.honoured(&new.source, new.at)
        {
            return CreateOutcome::Tombstoned(t.clone());
        }
        // Every claim at the version read, or nothing is written.
        if new
            .claims
            .iter()
            .any(|w| self.claims.get(&w.key).map(|c| c.version) != w.read)
        {
            return CreateOutcome::ClaimChanged;
        }
        for w in &new.claims {
            self.put_claim(w);
        }
        // An archived request past its TTL frees its id; its items went with it (a
        // `Planned` one's too: its history is swept as DynamoStore sweeps it).
        self.reservations.remove(&id);
        self.workloads.remove(&id);
        if planned {
            self.history.remove(&id);
        }
        let (status, reason, next_action_at) = match new.cancelled {
            Some(why) => (RequestStatus::Cancelled, why, None),
            None => (RequestStatus::Accepted, new.reason, new.next_action_at),
        };
        let record = RequestRecord {
            request_id: id.clone(),
            team: new.request.team.clone(),
            request: new.request,
            status,
            version: 1,
            reason,
            next_action_at,
            windows: Vec::new(),
            lease: None,
            doubt: None,
            purchase_call: None,
            cancel: None,
            open_debit: None,
            run: None,
            search: None,
            spent: MicroUsd(0),
            candidates: Vec::new(),
            created_at: new.at,
            updated_at: new.at,
        };
        self.requests.insert(
            id.clone(),
            Stored {
                record,
                open_debit_ledger: None,
                expires_at: status.is_terminal().then(|| new.at + self.retention),
                changed_from: None,
            },
        );
        self.commit(&id, &new.caused_by, new.at, &new.outbox);
        CreateOutcome::Created { version: 1 }
    }

    fn put_claim(&mut self, w: &ClaimWrite) {
        self.claims.insert(
            w.key.clone(),
            Claim {
                version: w.read.map_or(1, |v| v + 1),
                claimants: w.claimants.clone(),
                made_by: w.made_by.clone(),
            },
        );
    }

    fn put_tombstone(&mut self, t: Tombstone, outbox: &[OutboundEvent]) -> TombstoneOutcome {
        let id = t.request_id.clone();
        self.observe(t.at);
        let cause = Cause::new(t.event_id.clone());
        if self.seen(&id, &cause) {
            return TombstoneOutcome::DuplicateEvent;
        }
        if self.live(&id).is_some() || self.spelled(&id).is_some() {
            return TombstoneOutcome::RequestExists;
        }
        let at = t.at;
        self.tombstones.insert(id.folded(), t);
        self.commit(&id, &cause, at, outbox);
        TombstoneOutcome::Placed
    }

    fn transition(&mut self, t: Transition) -> Result<WriteOutcome, PortError> {
        use RequestStatus::Purchasing;
        if !t.from.can_write(t.to) {
            return Err(illegal(t.from, t.to, "the life cycle does not allow it"));
        }
        if t.from == Purchasing || t.to == Purchasing {
            return Err(illegal(
                t.from,
                t.to,
                "purchases move only through begin_purchase, record_reservation and release_unbought",
            ));
        }
        check_debit(&t.debit)?;
        check_hold(&t)?;
        check_refund(&t)?;
        self.observe(t.at);
        if self.seen(&t.request_id, &t.caused_by) {
            return Ok(WriteOutcome::DuplicateEvent);
        }
        let Some(stored) = self.live(&t.request_id) else {
            return Ok(WriteOutcome::Conflict);
        };
        if stored.record.version != t.expected_version || stored.record.status != t.from {
            return Ok(WriteOutcome::Conflict);
        }
        if t.hold && stored.record.open_debit.is_some() {
            return Err(errors::permanent(
                SERVICE,
                "DebitAlreadyOpen",
                format!("{}: a debit is already open", t.request_id),
            ));
        }
        // As the adapter's transaction checks it: after the request's own conditions, before
        // the caps (unless the debit alone passes the team's, which it answers first).
        if (t.hold || t.unpaused)
            && let Some(p) = &self.paused
            && t.debit.as_ref().is_none_or(|d| d.amount <= d.team_cap)
        {
            return Ok(WriteOutcome::Paused(p.clone()));
        }
        if let Some(d) = &t.debit {
            match self.over_budget(&stored.record, d) {
                Some(OverBudget::Request { spent, cap }) => {
                    return Ok(WriteOutcome::OverRequestBudget { spent, cap });
                }
                Some(OverBudget::Team { spent, cap }) => {
                    return Ok(WriteOutcome::OverTeamBudget { spent, cap });
                }
                None => {}
            }
            // On-demand spend: kept at once, or held as the open debit until settled.
            self.charge(d);
        }
        // A reservation recorded here for the first time (a purchase in doubt found later)
        // was bought with the open debit: its payment failure returns it to that month.
        let ledger_of_open = self.requests[&t.request_id]
            .open_debit_ledger
            .as_ref()
            .map(|(team, m)| (team.to_string(), m.0.clone()));
        if let Some(how) = t.settle {
            let stored = self.requests.get_mut(&t.request_id).expect("checked above");
            let open = stored.record.open_debit.take().filter(|d| d.0 > 0);
            let ledger = stored.open_debit_ledger.take();
            if let Some(amount) = open.map(|o| how.released(o)).filter(|a| a.0 > 0) {
                let Some(key) = ledger else {
                    return Err(errors::permanent(
                        SERVICE,
                        "CorruptItem",
                        format!("{}: an open debit without its ledger", t.request_id),
                    ));
                };
                stored.record.spent.0 -= amount.0;
                *self.ledger.entry(key).or_default() -= amount.0;
            }
        }
        if let Some(r) = &t.refund {
            let stored = self.requests.get_mut(&t.request_id).expect("checked above");
            let team = r.team.clone().unwrap_or_else(|| stored.record.team.clone());
            let key = (team, r.month.clone());
            let ledger = self.ledger.get(&key).copied().unwrap_or(0);
            if stored.record.spent.0 < r.amount.0 {
                return Ok(WriteOutcome::Conflict);
            }
            if ledger < r.amount.0 {
                return Err(errors::permanent(
                    SERVICE,
                    "CorruptItem",
                    format!(
                        "{}: the {} ledger holds less than the refund of {}",
                        t.request_id, r.month.0, r.amount
                    ),
                ));
            }
            stored.record.spent.0 -= r.amount.0;
            *self.ledger.entry(key).or_default() -= r.amount.0;
        }
        if !t.reservations.is_empty() {
            let list = self.reservations.entry(t.request_id.clone()).or_default();
            for r in &t.reservations {
                let mut r = r.clone();
                if r.debit_month.is_none()
                    && let Some((team, month)) = &ledger_of_open
                {
                    r.debit_month = Some(month.clone());
                    r.debit_team = Some(team.clone());
                }
                match list.iter_mut().find(|x| x.id == r.id) {
                    Some(existing) => *existing = r,
                    None => list.push(r),
                }
            }
        }
        let version = self.step(&t.request_id, t.to, &t.reason, t.next_action_at, t.at);
        let stored = self.requests.get_mut(&t.request_id).expect("checked above");
        if let Some(d) = &t.debit {
            stored.record.spent.0 += d.amount.0;
            if t.hold {
                stored.record.open_debit = Some(d.amount);
                stored.open_debit_ledger = Some((d.team.clone(), d.month.clone()));
            }
        }
        let record = &mut stored.record;
        if let Some(plans) = t.candidates {
            record.candidates = plans;
        }
        if let Some(windows) = t.windows {
            record.windows = windows;
        }
        if let Some(run) = t.run {
            record.run = Some(run);
        }
        if let Some(round) = t.search {
            record.search = (round != Default::default()).then_some(round);
        }
        if let Some(note) = t.cancel {
            record.cancel = Some(note);
        }
        if t.resolve_doubt {
            record.doubt = None;
            record.purchase_call = None;
        }
        follow_windows(record);
        archive(stored, t.at, self.retention);
        self.commit(&t.request_id, &t.caused_by, t.at, &t.outbox);
        Ok(WriteOutcome::Applied { version })
    }

    fn update_windows(&mut self, u: WindowUpdate) -> Result<WriteOutcome, PortError> {
        if let Some(t) = u.as_transition() {
            return self.transition(t);
        }
        self.observe(u.at);
        if self.seen(&u.request_id, &u.caused_by) {
            return Ok(WriteOutcome::DuplicateEvent);
        }
        let Some(stored) = self.live(&u.request_id) else {
            return Ok(WriteOutcome::Conflict);
        };
        if stored.record.version != u.expected_version || stored.record.status != u.status {
            return Ok(WriteOutcome::Conflict);
        }
        let stored = self.requests.get_mut(&u.request_id).expect("checked above");
        stored.changed_from = Some(stored.record.status);
        let r = &mut stored.record;
        r.version += 1;
        r.reason = u.reason;
        r.updated_at = u.at;
        r.windows = u.windows;
        follow_windows(r);
        let version = r.version;
        archive(stored, u.at, self.retention);
        if !u.reservations.is_empty() {
            let list = self.reservations.entry(u.request_id.clone()).or_default();
            for r in u.reservations {
                match list.iter_mut().find(|x| x.id == r.id) {
                    Some(existing) => *existing = r,
                    None => list.push(r),
                }
            }
        }
        self.commit(&u.request_id, &u.caused_by, u.at, &u.outbox);
        Ok(WriteOutcome::Applied { version })
    }

    fn begin_purchase(&mut self, b: BeginPurchase) -> Result<BeginPurchaseOutcome, PortError> {
        use RequestStatus::Purchasing;
        if !b.from.can_become(Purchasing) {
            return Err(illegal(
                b.from,
                Purchasing,
                "the life cycle does not allow it",
            ));
        }
        let takeover = b.from == Purchasing;
        if takeover && b.debit.is_some() {
            return Err(illegal(
                b.from,
                Purchasing,
                "a takeover keeps the first worker's debit and adds none",
            ));
        }
        check_debit(&b.debit)?;
        self.observe(b.at);
        if self.seen(&b.request_id, &b.caused_by) {
            return Ok(BeginPurchaseOutcome::DuplicateEvent);
        }
        // As the adapter's transaction checks it: before the request's conditions, unless the
        // debit alone passes the team's cap (answered before any transaction). A takeover goes
        // on with a purchase begun before the pause.
        if !takeover
            && let Some(p) = &self.paused
            && b.debit.as_ref().is_none_or(|d| d.amount <= d.team_cap)
        {
            return Ok(BeginPurchaseOutcome::Paused(p.clone()));
        }
        let Some(stored) = self.live(&b.request_id) else {
            return Ok(BeginPurchaseOutcome::Conflict);
        };
        let record = &stored.record;
        if record.version != b.expected_version || record.status != b.from {
            return Ok(BeginPurchaseOutcome::Conflict);
        }
        if takeover
            && let Some(lease) = &record.lease
            && lease.expires_at >= b.at
        {
            return Ok(BeginPurchaseOutcome::LeaseHeld {
                until: lease.expires_at,
            });
        }
        if let Some(d) = &b.debit {
            if record.open_debit.is_some() {
                return Ok(BeginPurchaseOutcome::Conflict);
            }
            match self.over_budget(record, d) {
                Some(OverBudget::Request { spent, cap }) => {
                    return Ok(BeginPurchaseOutcome::OverRequestBudget { spent, cap });
                }
                Some(OverBudget::Team { spent, cap }) => {
                    return Ok(BeginPurchaseOutcome::OverTeamBudget { spent, cap });
                }
                None => {}
            }
            self.charge(d);
        }
        // The lease expiry is when `due` should look again, in case this worker dies.
        let version = self.step(
            &b.request_id,
            Purchasing,
            &b.reason,
            Some(b.lease.expires_at),
            b.at,
        );
        let stored = self.requests.get_mut(&b.request_id).expect("checked above");
        stored.record.lease = Some(b.lease);
        if let Some(d) = b.doubt {
            stored.record.doubt = Some(d);
        }
        // A new purchase has called nothing yet; a takeover keeps what it finds.
        if !takeover {
            stored.record.purchase_call = Some(PurchaseCall::None);
        }
        if let Some(d) = &b.debit {
            stored.record.spent.0 += d.amount.0;
            stored.record.open_debit = Some(d.amount);
            stored.open_debit_ledger = Some((d.team.clone(), d.month.clone()));
        }
        self.commit(&b.request_id, &b.caused_by, b.at, &b.outbox);
        Ok(BeginPurchaseOutcome::Acquired { version })
    }

    fn record_reservation(&mut self, r: RecordReservation) -> Result<LeaseWriteOutcome, PortError> {
        use RequestStatus::{Purchasing, Reserved};
        if !matches!(r.to, Reserved | Purchasing) {
            return Err(illegal(
                Purchasing,
                r.to,
                "a recorded reservation leads to Reserved or, between segments, Purchasing",
            ));
        }
        self.observe(r.at);
        if self.seen(&r.request_id, &r.caused_by) {
            return Ok(LeaseWriteOutcome::DuplicateEvent);
        }
        if !self.holds_lease(&r.request_id, &r.lease_token) {
            return Ok(LeaseWriteOutcome::LeaseLost);
        }
        let version = self.step(&r.request_id, r.to, &r.reason, r.next_action_at, r.at);
        let stored = self.requests.get_mut(&r.request_id).expect("checked above");
        let mut reservation = r.reservation.clone();
        // The month its debit was charged to, where a payment failure returns it.
        if let Some(d) = &r.uncapped {
            reservation.debit_month = Some(d.month.0.clone());
            reservation.debit_team = Some(d.team.to_string());
        } else if let Some((team, month)) = &stored.open_debit_ledger {
            reservation.debit_month = Some(month.0.clone());
            reservation.debit_team = Some(team.to_string());
        }
        if let Some(d) = &r.uncapped {
            // A stray: charged whatever the caps say; the plan's open debit is untouched.
            stored.record.spent.0 += d.amount.0;
            *self
                .ledger
                .entry((d.team.clone(), d.month.clone()))
                .or_default() += d.amount.0;
        }
        if r.to == Reserved {
            // Bought: the debit is kept, and the lease and its doubt have served. A stray
            // reserves in the plan's place, so what stays open of the plan's debit goes back.
            if r.uncapped.is_some()
                && let (Some(open), Some(key)) =
                    (stored.record.open_debit, stored.open_debit_ledger.clone())
            {
                stored.record.spent.0 -= open.0;
                *self.ledger.entry(key).or_default() -= open.0;
            }
            stored.record.lease = None;
            stored.record.doubt = None;
            stored.record.purchase_call = None;
            stored.record.open_debit = None;
            stored.open_debit_ledger = None;
        } else if r.uncapped.is_none()
            && let Some(open) = stored.record.open_debit
        {
            let bought = r.reservation.upfront_fee.to_micros_ceil();
            stored.record.open_debit = Some(MicroUsd((open.0 - bought.0).max(0)));
        }
        let list = self.reservations.entry(r.request_id.clone()).or_default();
        match list.iter_mut().find(|x| x.id == reservation.id) {
            Some(existing) => *existing = reservation,
            None => list.push(reservation),
        }
        stored.record.windows = window::all_records(list, &stored.record.windows, r.at);
        self.commit(&r.request_id, &r.caused_by, r.at, &r.outbox);
        Ok(LeaseWriteOutcome::Applied { version })
    }

    fn keep_cancellation(&mut self, k: KeepCancellation) -> Result<WriteOutcome, PortError> {
        if k.status.is_terminal() {
            return Err(illegal(
                k.status,
                k.status,
                "a cancellation is kept only on a request that has not ended",
            ));
        }
        self.observe(k.at);
        if self.seen(&k.request_id, &k.caused_by) {
            return Ok(WriteOutcome::DuplicateEvent);
        }
        let Some(stored) = self.live(&k.request_id) else {
            return Ok(WriteOutcome::Conflict);
        };
        if stored.record.version != k.expected_version || stored.record.status != k.status {
            return Ok(WriteOutcome::Conflict);
        }
        let version = self.step(&k.request_id, k.status, &k.reason, k.next_action_at, k.at);
        let stored = self.requests.get_mut(&k.request_id).expect("checked above");
        stored.record.cancel = k.note;
        // A status that summarises its windows keeps no action of its own (DynamoStore's
        // `set_next_action`; found by the differential test).
        follow_windows(&mut stored.record);
        self.commit(&k.request_id, &k.caused_by, k.at, &k.outbox);
        Ok(WriteOutcome::Applied { version })
    }

    fn release_unbought(&mut self, r: ReleaseUnbought) -> Result<LeaseWriteOutcome, PortError> {
        use RequestStatus::{Cancelled, Failed, Purchasing, Reserved, Searching};
        if !matches!(r.to, Searching | Failed | Cancelled | Reserved) {
            return Err(illegal(
                Purchasing,
                r.to,
                "releasing an unbought debit leads to Searching, Failed, Cancelled or Reserved",
            ));
        }
        if r.reason.trim().is_empty() {
            return Err(errors::permanent(
                SERVICE,
                "MissingReason",
                "a release must say what reconciliation found",
            ));
        }
        self.observe(r.at);
        if self.seen(&r.request_id, &r.caused_by) {
            return Ok(LeaseWriteOutcome::DuplicateEvent);
        }
        if !self.holds_lease(&r.request_id, &r.lease_token) {
            return Ok(LeaseWriteOutcome::LeaseLost);
        }
        let stored = self.requests.get_mut(&r.request_id).expect("checked above");
        // A kept cancellation is applied by the release, never passed over (§8.3).
        if stored.record.cancel.is_some() && r.to != Cancelled {
            return Ok(LeaseWriteOutcome::CancelKept);
        }
        stored.record.cancel = None;
        let open = stored.record.open_debit.filter(|d| d.0 > 0);
        if open.is_some() && stored.open_debit_ledger.is_none() {
            return Err(errors::permanent(
                SERVICE,
                "CorruptItem",
                format!("{}: an open debit without its ledger", r.request_id),
            ));
        }
        stored.record.open_debit = None;
        stored.record.lease = None;
        stored.record.doubt = None;
        stored.record.purchase_call = None;
        let charged_to = stored.open_debit_ledger.take();
        if let (Some(amount), Some(key)) = (open, charged_to) {
            stored.record.spent.0 -= amount.0;
            *self.ledger.entry(key).or_default() -= amount.0;
        }
        let version = self.step(&r.request_id, r.to, &r.reason, r.next_action_at, r.at);
        self.commit(&r.request_id, &r.caused_by, r.at, &r.outbox);
        Ok(LeaseWriteOutcome::Applied { version })
    }

    fn mark_purchase_call(&mut self, m: MarkPurchaseCall) -> Result<LeaseWriteOutcome, PortError> {
        self.observe(m.at);
        if self.seen(&m.request_id, &m.caused_by) {
            return Ok(LeaseWriteOutcome::DuplicateEvent);
        }
        let unexpired = self
            .live(&m.request_id)
            .is_some_and(|s| s.record.lease.as_ref().is_some_and(|l| l.expires_at > m.at));
        if !self.holds_lease(&m.request_id, &m.lease_token) || !unexpired {
            return Ok(LeaseWriteOutcome::LeaseLost);
        }
        let stored = &self.requests[&m.request_id];
        let next = stored.record.next_action_at;
        let mut called = match &stored.record.purchase_call {
            Some(PurchaseCall::Called { offering_ids, .. }) => offering_ids.clone(),
            _ => Vec::new(),
        };
        for o in &m.offering_ids {
            if !called.contains(o) {
                called.push(o.clone());
            }
        }
        let version = self.step(
            &m.request_id,
            RequestStatus::Purchasing,
            &m.reason,
            next,
            m.at,
        );
        let stored = self.requests.get_mut(&m.request_id).expect("checked above");
        stored.record.purchase_call = Some(PurchaseCall::Called {
            at: m.at,
            offering_ids: called,
        });
        self.commit(&m.request_id, &m.caused_by, m.at, &[]);
        Ok(LeaseWriteOutcome::Applied { version })
    }

    fn fail_in_doubt(&mut self, f: FailInDoubt) -> Result<LeaseWriteOutcome, PortError> {
        use RequestStatus::{Cancelled, Failed, Purchasing};
        if !matches!(f.to, Failed | Cancelled) {
            return Err(illegal(
                Purchasing,
                f.to,
                "a purchase ends in doubt as Failed, or Cancelled applying a kept cancellation",
            ));
        }
        self.observe(f.at);
        if self.seen(&f.request_id, &f.caused_by) {
            return Ok(LeaseWriteOutcome::DuplicateEvent);
        }
        if !self.holds_lease(&f.request_id, &f.lease_token) {
            return Ok(LeaseWriteOutcome::LeaseLost);
        }
        let stored = self.requests.get_mut(&f.request_id).expect("checked above");
        if stored.record.doubt.is_none() {
            return Err(illegal(
                Purchasing,
                f.to,
                "only a purchase with its doubt recorded ends in doubt",
            ));
        }
        // A kept cancellation is applied, never passed over (§8.3).
        if stored.record.cancel.is_some() && f.to != Cancelled {
            return Ok(LeaseWriteOutcome::CancelKept);
        }
        stored.record.cancel = None;
        stored.record.lease = None;
        let version = self.step(&f.request_id, f.to, &f.reason, f.next_action_at, f.at);
        self.commit(&f.request_id, &f.caused_by, f.at, &f.outbox);
        Ok(LeaseWriteOutcome::Applied { version })
    }

    /// A request's child items, hidden once the request is archived.
    fn children_visible(&self, id: &RequestId) -> bool {
        self.requests
            .get(id)
            .is_none_or(|r| !self.expired(r.expires_at))
    }
}

/// What DynamoDB's store refuses before writing: an event over the size bound.
fn check_outbox(outbox: &[OutboundEvent]) -> Result<(), PortError> {
    outbox
        .iter()
        .try_for_each(crate::domain::events::check_size)
}

impl Pacing for InMemoryStore {
    async fn take_searches(
        &self,
        region: &str,
        wanted: u32,
        now: DateTime<Utc>,
    ) -> Result<u32, PortError> {
        self.pause("TakeSearches").await;
        let mut s = lock(&self.state);
        let a = s
            .allowances
            .get(region)
            .copied()
            .unwrap_or_else(|| Allowance::fresh(DESCRIBE_PACE, now));
        let (a, granted) = a.take(DESCRIBE_PACE, wanted, now);
        s.allowances.insert(region.to_string(), a);
        Ok(granted)
    }

    async fn back_off(
        &self,
        region: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), PortError> {
        self.pause("BackOff").await;
        let mut s = lock(&self.state);
        let a = s
            .allowances
            .get(region)
            .copied()
            .unwrap_or_else(|| Allowance::fresh(DESCRIBE_PACE, now));
        s.allowances.insert(region.to_string(), a.backed_off(until));
        Ok(())
    }
}

impl Store for InMemoryStore {
    async fn create_request(&self, new: NewRequest) -> Result<CreateOutcome, PortError> {
        check_outbox(&new.outbox)?;
        self.pause("CreateRequest").await;
        let after = self.begin(StoreOp::CreateRequest)?;
        let outcome = lock(&self.state).create_request(new);
        finish(after, Ok(outcome))
    }

    async fn claim(&self, key: &ClaimKey) -> Result<Option<Claim>, PortError> {
        self.pause("Claim").await;
        let after = self.begin(StoreOp::Claim)?;
        let found = lock(&self.state).claims.get(key).cloned();
        finish(after, Ok(found))
    }

    async fn write_claim(&self, w: ClaimWrite) -> Result<bool, PortError> {
        self.pause("WriteClaim").await;
        let after = self.begin(StoreOp::WriteClaim)?;
        let mut s = lock(&self.state);
        let written = s.claims.get(&w.key).map(|c| c.version) == w.read;
        if written {
            s.put_claim(&w);
        }
        drop(s);
        finish(after, Ok(written))
    }

    async fn spelled(&self, request_id: &RequestId) -> Result<Option<RequestId>, PortError> {
        Ok(lock(&self.state).spelled(request_id))
    }

    async fn get_request(
        &self,
        request_id: &RequestId,
    ) -> Result<Option<RequestRecord>, PortError> {
        self.pause("GetRequest").await;
        let after = self.begin(StoreOp::GetRequest)?;
        let found = lock(&self.state).live(request_id).map(|s| s.record.clone());
        finish(after, Ok(found))
    }

    async fn transition(&self, t: Transition) -> Result<WriteOutcome, PortError> {
        check_outbox(&t.outbox)?;
        self.pause("Transition").await;
        let after = self.begin(StoreOp::Transition)?;
        let mut s = lock(&self.state);
        if let Some(i) = s.races.iter().position(|op| *op == StoreOp::Transition) {
            s.races.remove(i);
            if let Some(stored) = s.requests.get_mut(&t.request_id) {
                stored.record.version += 1;
            }
        }
        let outcome = s.transition(t);
        drop(s);
        finish(after, outcome)
    }

    async fn begin_purchase(&self, b: BeginPurchase) -> Result<BeginPurchaseOutcome, PortError> {
        check_outbox(&b.outbox)?;
        self.pause("BeginPurchase").await;
        let after = self.begin(StoreOp::BeginPurchase)?;
        let outcome = lock(&self.state).begin_purchase(b);
        finish(after, outcome)
    }

    async fn record_reservation(
        &self,
        r: RecordReservation,
    ) -> Result<LeaseWriteOutcome, PortError> {
        check_outbox(&r.outbox)?;
        self.pause("RecordReservation").await;
        let after = self.begin(StoreOp::RecordReservation)?;
        let outcome = lock(&self.state).record_reservation(r);
        finish(after, outcome)
    }

    async fn update_windows(&self, u: WindowUpdate) -> Result<WriteOutcome, PortError> {
        check_outbox(&u.outbox)?;
        self.pause("UpdateWindows").await;
        let after = self.begin(StoreOp::UpdateWindows)?;
        let outcome = lock(&self.state).update_windows(u);
        finish(after, outcome)
    }

    async fn put_tombstone(
        &self,
        t: Tombstone,
        outbox: Vec<OutboundEvent>,
    ) -> Result<TombstoneOutcome, PortError> {
        check_outbox(&outbox)?;
        self.pause("PutTombstone").await;
        let after = self.begin(StoreOp::PutTombstone)?;
        let outcome = lock(&self.state).put_tombstone(t, &outbox);
        finish(after, Ok(outcome))
    }

    async fn record_rejection(&self, r: RejectedSubmission) -> Result<(), PortError> {
        self.pause("RecordRejection").await;
        let after = self.begin(StoreOp::RecordRejection)?;
        lock(&self.state)
            .rejections
            .insert((r.request_id.folded(), r.event_id.clone()), r);
        finish(after, Ok(()))
    }

    async fn rejections(
        &self,
        request_id: &RequestId,
    ) -> Result<Vec<RejectedSubmission>, PortError> {
        self.pause("Rejections").await;
        let after = self.begin(StoreOp::Rejections)?;
        let s = lock(&self.state);
        let now = s.now();
        let folded = request_id.folded();
        let mut found: Vec<RejectedSubmission> = s
            .rejections
            .iter()
            .filter(|((id, _), r)| *id == folded && now.is_none_or(|t| t < r.at + REJECTION_KEPT))
            .map(|(_, r)| r.clone())
            .collect();
        found.sort_by_key(|r| r.at);
        finish(after, Ok(found))
    }

    async fn keep_cancellation(&self, k: KeepCancellation) -> Result<WriteOutcome, PortError> {
        check_outbox(&k.outbox)?;
        self.pause("KeepCancellation").await;
        let after = self.begin(StoreOp::KeepCancellation)?;
        let outcome = lock(&self.state).keep_cancellation(k);
        finish(after, outcome)
    }

    async fn release_unbought(&self, r: ReleaseUnbought) -> Result<LeaseWriteOutcome, PortError> {
        check_outbox(&r.outbox)?;
        self.pause("ReleaseUnbought").await;
        let after = self.begin(StoreOp::ReleaseUnbought)?;
        let outcome = lock(&self.state).release_unbought(r);
        finish(after, outcome)
    }

    async fn claim_detector(
        &self,
        region: &str,
        seen: Option<DateTime<Utc>>,
        next: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        self.pause("ClaimDetector").await;
        let after = self.begin(StoreOp::ClaimDetector)?;
        let mut s = lock(&self.state);
        let claimed = s.detectors.get(region).copied() == seen;
        if claimed {
            s.detectors.insert(region.to_string(), next);
        }
        finish(after, Ok(claimed))
    }

    async fn mark_purchase_call(
        &self,
        m: MarkPurchaseCall,
    ) -> Result<LeaseWriteOutcome, PortError> {
        self.pause("MarkPurchaseCall").await;
        let after = self.begin(StoreOp::MarkPurchaseCall)?;
        let outcome = lock(&self.state).mark_purchase_call(m);
        finish(after, outcome)
    }

    async fn fail_in_doubt(&self, f: FailInDoubt) -> Result<LeaseWriteOutcome, PortError> {
        check_outbox(&f.outbox)?;
        self.pause("FailInDoubt").await;
        let after = self.begin(StoreOp::FailInDoubt)?;
        let outcome = lock(&self.state).fail_in_doubt(f);
        finish(after, outcome)
    }

    async fn reservations(&self, request_id: &RequestId) -> Result<Vec<Reservation>, PortError> {
        self.pause("Reservations").await;
        let after = self.begin(StoreOp::Reservations)?;
        let s = lock(&self.state);
        let mut found = if s.children_visible(request_id) {
            s.reservations.get(request_id).cloned().unwrap_or_default()
        } else {
            Vec::new()
        };
        // DynamoDB's order: the sort key's (`RES#<id>`), not the order they were bought in.
        found.sort_by(|a, b| a.id.cmp(&b.id));
        finish(after, Ok(found))
    }

    async fn budget_spent(&self, team: &Team, month: &BudgetMonth) -> Result<MicroUsd, PortError> {
        self.pause("BudgetSpent").await;
        let after = self.begin(StoreOp::BudgetSpent)?;
        let spent = lock(&self.state).spent(team, month);
        finish(after, Ok(spent))
    }

    async fn put_workload(&self, w: WorkloadRecord) -> Result<(), PortError> {
        self.pause("PutWorkload").await;
        let after = self.begin(StoreOp::PutWorkload)?;
        lock(&self.state)
            .workloads
            .entry(w.request_id.clone())
            .or_default()
            .insert((w.reservation_id.clone(), w.slot), w);
        finish(after, Ok(()))
    }

    async fn workloads(&self, request_id: &RequestId) -> Result<Vec<WorkloadRecord>, PortError> {
        self.pause("Workloads").await;
        let after = self.begin(StoreOp::Workloads)?;
        let s = lock(&self.state);
        let found = if s.children_visible(request_id) {
            s.workloads
                .get(request_id)
                .map(|m| m.values().cloned().collect())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        finish(after, Ok(found))
    }

    async fn unsent_outbox(&self, limit: usize) -> Result<Vec<OutboxItem>, PortError> {
        self.pause("UnsentOutbox").await;
        let after = self.begin(StoreOp::UnsentOutbox)?;
        let mut unsent = lock(&self.state).unsent();
        unsent.truncate(limit);
        finish(after, Ok(unsent))
    }

    async fn mark_sent(&self, request_id: &str, event_key: &str) -> Result<(), PortError> {
        self.pause("MarkSent").await;
        let after = self.begin(StoreOp::MarkSent)?;
        let mut s = lock(&self.state);
        let expires_at = s.now().map(|now| now + s.retention);
        // A missing item was already archived: there is nothing left to mark.
        if let Some(e) = s
            .outbox
            .get_mut(&(request_id.to_string(), event_key.to_string()))
        {
            e.sent = true;
            e.expires_at = expires_at;
        }
        finish(after, Ok(()))
    }

    async fn claim_outbox(
        &self,
        request_id: &str,
        event_key: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        self.pause("ClaimOutbox").await;
        let after = self.begin(StoreOp::ClaimOutbox)?;
        let mut s = lock(&self.state);
        let claimed = match s
            .outbox
            .get_mut(&(request_id.to_string(), event_key.to_string()))
        {
            Some(e) if !e.sent && e.claimed_until.is_none_or(|c| c < now) => {
                e.claimed_until = Some(until);
                true
            }
            _ => false,
        };
        finish(after, Ok(claimed))
    }

    async fn release_outbox_claim(
        &self,
        request_id: &str,
        event_key: &str,
    ) -> Result<(), PortError> {
        self.pause("ClaimOutbox").await;
        let after = self.begin(StoreOp::ClaimOutbox)?;
        let mut s = lock(&self.state);
        if let Some(e) = s
            .outbox
            .get_mut(&(request_id.to_string(), event_key.to_string()))
        {
            e.claimed_until = None;
        }
        finish(after, Ok(()))
    }

    async fn unarchive(
        &self,
        request_id: &RequestId,
        at: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        let mut s = lock(&self.state);
        s.observe(at);
        let Some(stored) = s.requests.get_mut(request_id) else {
            return Ok(false);
        };
        let stale = stored.expires_at.is_some()
            && stored.record.status.is_terminal()
            && !stored.record.archivable();
        if stale {
            stored.expires_at = None;
        }
        Ok(stale)
    }

    async fn read_pause(&self) -> Result<Option<Pause>, PortError> {
        self.pause("ReadPause").await;
        let after = self.begin(StoreOp::ReadPause)?;
        let found = lock(&self.state).paused.clone();
        finish(after, Ok(found))
    }

    async fn put_pause(&self, pause: Pause) -> Result<Result<(), Pause>, PortError> {
        self.pause("PutPause").await;
        let after = self.begin(StoreOp::PutPause)?;
        let mut s = lock(&self.state);
        let outcome = match &s.paused {
            Some(standing) => Err(standing.clone()),
            None => {
                s.paused = Some(pause);
                Ok(())
            }
        };
        drop(s);
        finish(after, Ok(outcome))
    }

    async fn delete_pause(&self) -> Result<Option<Pause>, PortError> {
        self.pause("DeletePause").await;
        let after = self.begin(StoreOp::DeletePause)?;
        let gone = lock(&self.state).paused.take();
        finish(after, Ok(gone))
    }

    async fn agenda(&self, now: DateTime<Utc>) -> Result<Agenda, PortError> {
        self.pause("Agenda").await;
        let after = self.begin(StoreOp::Agenda)?;
        let mut s = lock(&self.state);
        s.observe(now);
        let a = s.agenda(now);
        finish(after, Ok(a))
    }

    fn outbox_writes(&self) -> u64 {
        lock(&self.state).writes
    }

    async fn history(&self, request_id: &RequestId) -> Result<Vec<HistoryEntry>, PortError> {
        self.pause("History").await;
        let after = self.begin(StoreOp::History)?;
        let s = lock(&self.state);
        let found = if s.children_visible(request_id) {
            s.history.get(request_id).cloned().unwrap_or_default()
        } else {
            Vec::new()
        };
        finish(after, Ok(found))
    }

    async fn due(
        &self,
        statuses: &[RequestStatus],
        now: DateTime<Utc>,
    ) -> Result<Vec<DueItem>, PortError> {
        self.pause("Due").await;
        let after = self.begin(StoreOp::Due)?;
        let mut s = lock(&self.state);
        s.observe(now);
        let items = s.agenda(now).due_in(statuses);
        finish(after, Ok(items))
    }
}

/// The request's archival after a write at `at`, as DynamoStore's: its TTL set once it is
/// archivable ([`RequestRecord::archivable`]), and none while a terminal request still holds
/// a window to serve or a purchase in doubt.
fn archive(stored: &mut Stored, at: DateTime<Utc>, retention: Duration) {
    if stored.record.archivable() {
        stored.expires_at = Some(at + retention);
    } else if stored.record.status.is_terminal() {
        stored.expires_at = None;
    }
}

/// A request whose status summarises its windows has no next action of its own: its
/// windows' are what is due.
fn follow_windows(r: &mut RequestRecord) {
    if !window::keeps_own_action(r.status) && !r.windows.is_empty() {
        r.next_action_at = None;
    }
}

#[cfg(test)]
mod tests;
