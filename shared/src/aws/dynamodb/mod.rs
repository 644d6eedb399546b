//! The DynamoDB `Store` adapter: every state change is one conditional `TransactWriteItems`
//! that also records its causing event and writes its outbox (ARCHITECTURE section 5).
//!
//! Losing a race is an outcome, not an error: a failed condition is decoded from the
//! transaction's cancellation reasons (and, where the outcome needs numbers, one consistent
//! read) into `Conflict`, `DuplicateEvent`, `LeaseHeld`, `LeaseLost` or an over-budget.

mod claims;
mod deployment;
mod error;
mod expr;
mod ids;
mod item;
mod pause;
mod seen;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, Put, TransactWriteItem, Update,
};
use chrono::{DateTime, Utc};

pub use deployment::Pinned;
pub use item::ARCHIVE_AFTER;

use self::error::{Call, Committed, permanent, sdk_error, transaction_result, transient};
use self::expr::Expr;
use self::item::{
    AFTER_OFFERS, HIST_PREFIX, Item, LEDGER_SK, META_SK, Meta, OFFER_PREFIX, REJECTED_PREFIX,
    RES_PREFIX, Read, SLOT_PREFIX, TOMBSTONE_SK, WORK_INDEX, WORK_PARTITION, archive_at, attr,
    budget_pk, epoch_micros, event_sk, history_sk, is_expired, is_gone, json, keeps_live_window,
    key, kind, n, offer_sk, outbox_sk, read_meta, request_pk, reservation_sk, s, slot_key, time,
    workload_sk,
};
use self::seen::{Seen, Write};
use crate::aws::clock::SystemClock;
use crate::aws::ids::RandomIds;
use crate::domain::money::MicroUsd;
use crate::domain::planner::Plan;
use crate::domain::request::{RequestId, Team};
use crate::domain::reservation::Reservation;
use crate::domain::status::RequestStatus;
use crate::domain::window::{self, WindowRecord};
use crate::ports::SharedIds;
use crate::ports::{
    Agenda, BeginPurchase, BeginPurchaseOutcome, BudgetMonth, Cause, Claim, ClaimKey, ClaimWrite,
    CreateOutcome, Debit, DetectorDue, DueItem, FailInDoubt, HistoryEntry, KeepCancellation,
    LeaseWriteOutcome, LiveRequest, MarkPurchaseCall, NewRequest, OutboundEvent, OutboxItem,
    Pacing, Pause, PaymentDue, PortError, PurchaseCall, REJECTION_KEPT, RecordReservation,
    RejectedSubmission, ReleaseUnbought, RequestRecord, Store, TOMBSTONE_KEPT, Tombstone,
    TombstoneOutcome, Transition, WindowUpdate, WorkloadRecord, WriteOutcome, outbox_seq,
};
use crate::search::{Allowance, DESCRIBE_PACE};

/// DynamoDB's limit on the items of one transaction.
const MAX_TRANSACTION_ITEMS: usize = 100;
/// How often a lease write re-reads after its own request moved under it before giving up.
const LEASE_WRITE_ATTEMPTS: usize = 3;

/// The `Store` on one DynamoDB table laid out as `infra/template.yaml`'s `StateTable`.
#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    page_size: Option<i32>,
    /// Committed writes that may have added outbox items ([`Store::outbox_writes`]).
    writes: Arc<AtomicU64>,
    /// What the current run has read ([`Store::begin_run`]).
    seen: Arc<Mutex<Seen>>,
    /// Each transaction's `ClientRequestToken` (ARCHITECTURE §8.12): the SDK would draw one
    /// from the OS's randomness; ours comes from the id source, random in production.
    ids: SharedIds,
}

impl DynamoStore {
    /// One conditional UpdateItem on an outbox item: true when applied, false when its
    /// condition did not hold.
    async fn conditional_outbox_update(
        &self,
        request_id: &str,
        event_key: &str,
        e: &Expr,
    ) -> Result<bool, PortError> {
        self.conditional_update(key(request_pk(request_id), outbox_sk(event_key)), e)
            .await
    }

    /// One conditional UpdateItem on the item `k`: true when applied, false when its
    /// condition did not hold. What this run read of the item is forgotten either way.
    async fn conditional_update(&self, k: Item, e: &Expr) -> Result<bool, PortError> {
        let written = seen::key_of(&k).map(Write::Update);
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(k))
            .set_update_expression(e.update_expression())
            .set_condition_expression(e.condition_expression())
            .set_expression_attribute_names(e.names())
            .set_expression_attribute_values(e.values())
            .send()
            .await;
        if let Some(w) = written {
            self.wrote_one(w, false);
        }
        match result {
            Ok(_) => Ok(true),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|se| se.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(err) => Err(sdk_error("UpdateItem", err, Call::Write)),
        }
    }

    pub fn new(client: Client, table_name: impl Into<String>) -> DynamoStore {
        DynamoStore {
            client,
            table: table_name.into(),
            page_size: None,
            writes: Arc::new(AtomicU64::new(0)),
            seen: Arc::new(Mutex::new(Seen::default())),
            ids: Arc::new(RandomIds),
        }
    }

    /// Caps the items of each query page (DynamoDB's own cap is 1 MB). Results are the
    /// same at any page size; tests use a small one to prove pagination.
    pub fn with_page_size(mut self, items: u32) -> DynamoStore {
        self.page_size = Some(i32::try_from(items.max(1)).unwrap_or(i32::MAX));
        self
    }

    /// Takes transaction tokens from `ids` (a seeded source, for a replayable run).
    pub fn with_ids(mut self, ids: SharedIds) -> DynamoStore {
        self.ids = ids;
        self
    }

    pub fn table_name(&self) -> &str {
        &self.table
    }
}

// =======================================================================================
// Transaction parts.
// =======================================================================================

fn put(table: &str, item: Item, condition: Option<Expr>) -> Result<TransactWriteItem, PortError> {
    let mut b = Put::builder().table_name(table).set_item(Some(item));
    if let Some(c) = condition {
        b = b
            .set_condition_expression(c.condition_expression())
            .set_expression_attribute_names(c.names())
            .set_expression_attribute_values(c.values());
    }
    let p = b
        .build()
        .map_err(|e| permanent("ConstructionFailure", e.to_string()))?;
    Ok(TransactWriteItem::builder().put(p).build())
}

fn update(table: &str, key: Item, e: &Expr) -> Result<TransactWriteItem, PortError> {
    let u = Update::builder()
        .table_name(table)
        .set_key(Some(key))
        .set_update_expression(e.update_expression())
        .set_condition_expression(e.condition_expression())
        .set_expression_attribute_names(e.names())
        .set_expression_attribute_values(e.values())
        .build()
        .map_err(|e| permanent("ConstructionFailure", e.to_string()))?;
    Ok(TransactWriteItem::builder().update(u).build())
}

fn condition_check(table: &str, key: Item, e: &Expr) -> Result<TransactWriteItem, PortError> {
    let c = ConditionCheck::builder()
        .table_name(table)
        .set_key(Some(key))
        .set_condition_expression(e.condition_expression())
        .set_expression_attribute_names(e.names())
        .set_expression_attribute_values(e.values())
        .build()
        .map_err(|e| permanent("ConstructionFailure", e.to_string()))?;
    Ok(TransactWriteItem::builder().condition_check(c).build())
}

fn delete(table: &str, key: Item) -> Result<TransactWriteItem, PortError> {
    let d = Delete::builder()
        .table_name(table)
        .set_key(Some(key))
        .build()
        .map_err(|e| permanent("ConstructionFailure", e.to_string()))?;
    Ok(TransactWriteItem::builder().delete(d).build())
}

/// Where a tombstone for `id` is: under the id lower-cased (review N15), where it is placed;
/// then under the id as given, where one placed before that may still be.
fn tombstone_pks(id: &RequestId) -> Vec<String> {
    let folded = request_pk(&id.folded());
    let given = request_pk(id.as_str());
    if folded == given {
        vec![folded]
    } else {
        vec![folded, given]
    }
}

/// The processed-event record, always item 0 of a transaction: its failure means
/// `DuplicateEvent`, whatever else failed.
fn event_record(
    table: &str,
    pk: &str,
    cause: &Cause,
    at: DateTime<Utc>,
) -> Result<TransactWriteItem, PortError> {
    let mut item = key(pk.to_string(), event_sk(&cause.event_id));
    item.insert(attr::KIND.into(), s(kind::EVENT));
    item.insert(attr::EVENT_ID.into(), s(cause.event_id.clone()));
    item.insert(attr::CREATED_AT.into(), time(at));
    item.insert(attr::EXPIRES_AT.into(), archive_at(at));
    let mut c = Expr::new();
    let pk_name = c.name(attr::PK);
    c.condition(format!("attribute_not_exists({pk_name})"));
    put(table, item, Some(c))
}
const EVENT_ITEM: usize = 0;

fn outbox_items(
    table: &str,
    request_id: &str,
    events: &[OutboundEvent],
    version: u64,
    at: DateTime<Utc>,
) -> Result<Vec<TransactWriteItem>, PortError> {
    events
        .iter()
        .enumerate()
        .map(|(i, ev)| {
            crate::domain::events::check_size(ev)?;
            let seq = outbox_seq(version, i);
            let mut item = key(request_pk(request_id), outbox_sk(&ev.event_key));
            item.insert(attr::KIND.into(), s(kind::OUTBOX));
            item.insert(attr::REQUEST_ID.into(), s(request_id));
            item.insert(attr::EVENT_KEY.into(), s(ev.event_key.clone()));
            item.insert(attr::EVENT.into(), json("outbound event", ev)?);
            item.insert(attr::CREATED_AT.into(), time(at));
            item.insert(attr::OUTBOX_SEQ.into(), n(seq));
            // Due from the start of time: every tick's read holds it until it is sent.
            item.insert(attr::GSI_PART.into(), s(WORK_PARTITION));
            item.insert(attr::GSI_DUE.into(), n(OUTBOX_DUE));
            put(table, item, None)
        })
        .collect()
}

/// The `gsi_due` of an unsent outbox item: before every request's, so a read of the
/// outbox alone is `gsi_due <= OUTBOX_DUE`.
const OUTBOX_DUE: i64 = 0;

/// One versioned change of a request, as its history item keeps it.
struct Change<'a> {
    version: u64,
    from: Option<RequestStatus>,
    to: RequestStatus,
    reason: &'a str,
    cause: &'a Cause,
    at: DateTime<Utc>,
    /// The write archives the request ([`window::archivable`]).
    archived: bool,
}

/// What every versioned write adds to its transaction after its own items: its outbox items
/// and its history item (ARCHITECTURE §8.14), archived at once when the change ends it.
fn change_items(
    table: &str,
    request_id: &str,
    outbox: &[OutboundEvent],
    c: Change<'_>,
) -> Result<Vec<TransactWriteItem>, PortError> {
    let mut items = outbox_items(table, request_id, outbox, c.version, c.at)?;
    let mut item = key(request_pk(request_id), history_sk(c.version));
    item.insert(attr::KIND.into(), s(kind::HISTORY));
    item.insert(attr::VERSION.into(), n(c.version));
    if let Some(f) = c.from {
        item.insert(attr::FROM.into(), s(f.as_str()));
    }
    item.insert(attr::TO.into(), s(c.to.as_str()));
    item.insert(attr::REASON.into(), s(c.reason));
    item.insert(attr::CAUSE.into(), s(c.cause.event_id.clone()));
    item.insert(attr::CREATED_AT.into(), time(c.at));
    if c.archived {
        item.insert(attr::EXPIRES_AT.into(), archive_at(c.at));
    }
    items.push(put(table, item, None)?);
    Ok(items)
}

/// Sets the windows, the status's own next action, and the index entry together. A status that summarises its windows has no next action of its own
/// (but `Reserved` has while its payments are checked: `window::keeps_own_action`).
///
/// `next_action_at` holds the due time, exactly (the index holds whole seconds, and it is
/// what the index projects); with windows, the status's own next action is kept beside it
/// in `own_next_action_at`.
fn set_next_action(
    e: &mut Expr,
    status: RequestStatus,
    own: Option<DateTime<Utc>>,
    windows: &[WindowRecord],
    at: DateTime<Utc>,
) -> Result<(), PortError> {
    let own = own.filter(|_| window::keeps_own_action(status) || windows.is_empty());
    if windows.is_empty() {
        e.remove(attr::WINDOWS).remove(attr::OWN_NEXT_ACTION_AT);
    } else {
        e.set(attr::WINDOWS, json("windows", &windows)?);
        match own {
            Some(t) => e.set(attr::OWN_NEXT_ACTION_AT, time(t)),
            None => e.remove(attr::OWN_NEXT_ACTION_AT),
        };
    }
    let due = window::next_action_at(own, windows);
    match due {
        Some(t) => e.set(attr::NEXT_ACTION_AT, time(t)),
        None => e.remove(attr::NEXT_ACTION_AT),
    };
    match index_due(status, windows, due, at) {
        Some(t) => {
            e.set(attr::GSI_PART, s(WORK_PARTITION))
                .set(attr::GSI_DUE, n(t.timestamp()));
        }
        None => {
            e.remove(attr::GSI_PART).remove(attr::GSI_DUE);
        }
    }
    Ok(())
}

/// Where a request sits in the `work` index: at its due time, or, while what it launched may
/// be running, at the time of this write, so every later tick's read holds it.
fn index_due(
    status: RequestStatus,
    windows: &[WindowRecord],
    due: Option<DateTime<Utc>>,
    at: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    if window::may_be_running(status, windows) {
        Some(due.map_or(at, |t| t.min(at)))
    } else {
        due
    }
}

/// The common part of every META update: status, version, reason, times, windows, archival.
fn meta_update(
    status: RequestStatus,
    version: u64,
    reason: &str,
    next: Option<DateTime<Utc>>,
    windows: &[WindowRecord],
    at: DateTime<Utc>,
) -> Result<Expr, PortError> {
    let mut e = Expr::new();
    e.set(attr::STATUS, s(status.as_str()))
        .set(attr::VERSION, n(version))
        .set(attr::REASON, s(reason))
        .set(attr::UPDATED_AT, time(at));
    set_next_action(&mut e, status, next, windows, at)?;
    archival(&mut e, status, windows, false, at);
    Ok(e)
}

/// The request's TTL: set once it is archivable ([`window::archivable`]), removed while a
/// terminal request still holds a window to serve or, `in_doubt`, a purchase whose doubt
/// stands (ARCHITECTURE §9.1, [`RequestRecord::archivable`]).
fn archival(
    e: &mut Expr,
    status: RequestStatus,
    windows: &[WindowRecord],
    in_doubt: bool,
    at: DateTime<Utc>,
) {
    if window::archivable(status, windows) && !in_doubt {
        e.set(attr::EXPIRES_AT, archive_at(at));
    } else if status.is_terminal() {
        e.remove(attr::EXPIRES_AT);
    }
}

/// A recorded reservation's item; archived with its request when `terminal`.
fn reservation_item(
    pk: &str,
    request_id: &str,
    r: &Reservation,
    at: DateTime<Utc>,
    terminal: bool,
) -> Result<Item, PortError> {
    let mut res = key(pk.to_string(), reservation_sk(&r.id));
    res.insert(attr::KIND.into(), s(kind::RESERVATION));
    res.insert(attr::REQUEST_ID.into(), s(request_id));
    res.insert(attr::RESERVATION_ID.into(), s(r.id.clone()));
    res.insert(attr::DATA.into(), json("reservation", r)?);
    res.insert(attr::UPFRONT_FEE_USD.into(), s(r.upfront_fee.to_string()));
    res.insert(attr::STATE.into(), s(r.state.to_string()));
    res.insert(attr::UPDATED_AT.into(), time(at));
    // ARCHITECTURE §9.1: its payment has its own next action, whatever the request's status:
    // the item sits in the `work` index at that time until AWS reports it scheduled or final.
    if let Some(t) = r.payment_due() {
        res.insert(attr::NEXT_ACTION_AT.into(), time(t));
        res.insert(attr::GSI_PART.into(), s(WORK_PARTITION));
        res.insert(attr::GSI_DUE.into(), n(t.timestamp()));
    }
    if terminal {
        res.insert(attr::EXPIRES_AT.into(), archive_at(at));
    }
    Ok(res)
}

/// A refund returns a kept debit: positive, and never with a debit or a settlement in the
/// same write.
fn check_refund(t: &Transition) -> Result<(), PortError> {
    match &t.refund {
        Some(r) if r.amount.0 <= 0 => Err(permanent(
            "InvalidRefund",
            format!("a refund must be positive, got {}", r.amount),
        )),
        Some(_) if t.debit.is_some() || t.settle.is_some() => Err(permanent(
            "InvalidRefund",
            "a refund neither debits nor settles an open debit in the same write",
        )),
        _ => Ok(()),
    }
}

fn condition_version_and_status(e: &mut Expr, version: u64, status: RequestStatus) {
    let (pk, v, st) = (
        e.name(attr::PK),
        e.name(attr::VERSION),
        e.name(attr::STATUS),
    );
    let (vv, sv) = (e.value(n(version)), e.value(s(status.as_str())));
    e.condition(format!("attribute_exists({pk})"))
        .condition(format!("{v} = {vv}"))
        .condition(format!("{st} = {sv}"));
}

/// The ledger update of a debit: `spent + amount <= cap`, written as `spent <= cap - amount`
/// because condition expressions have no arithmetic.
fn ledger_debit(table: &str, d: &Debit, at: DateTime<Utc>) -> Result<TransactWriteItem, PortError> {
    let mut e = ledger_charge(d.team.as_str(), &d.month, d.amount.0, at);
    let spent = e.name(attr::SPENT_MICROS);
    let limit = e.value(n(d.team_cap.0 - d.amount.0));
    e.condition(format!(
        "attribute_not_exists({spent}) OR {spent} <= {limit}"
    ));
    update(
        table,
        key(budget_pk(d.team.as_str(), &d.month), LEDGER_SK),
        &e,
    )
}

/// The ledger update adding `amount` to the team's `month` (creating the ledger item), with
/// no condition: [`ledger_debit`] adds the cap's.
fn ledger_charge(team: &str, month: &BudgetMonth, amount: i64, at: DateTime<Utc>) -> Expr {
    let mut e = Expr::new();
    e.set(attr::KIND, s(kind::LEDGER))
        .set(attr::TEAM, s(team))
        .set(attr::MONTH, s(month.0.clone()))
        .set(attr::UPDATED_AT, time(at))
        .add(attr::SPENT_MICROS, n(amount));
    e
}

/// `amount` back to the team's `month` ledger (a released or refunded debit), conditional
/// on the ledger holding at least that much.
fn ledger_credit(
    table: &str,
    team: &str,
    month: &BudgetMonth,
    amount: MicroUsd,
    at: DateTime<Utc>,
) -> Result<TransactWriteItem, PortError> {
    let mut l = Expr::new();
    l.add(attr::SPENT_MICROS, n(-amount.0))
        .set(attr::UPDATED_AT, time(at));
    let spent = l.name(attr::SPENT_MICROS);
    let amt = l.value(n(amount.0));
    l.condition(format!("{spent} >= {amt}"));
    update(table, key(budget_pk(team, month), LEDGER_SK), &l)
}

/// The ledger writes of recording a stray ([`RecordReservation::uncapped`]): its fee charged
/// with no cap and, when it reserves in the plan's place, the plan's open debit given back.
/// One write per ledger (a transaction may touch an item once), the request's `spent` moved
/// by the sum on the META update `e`.
fn stray_ledgers(
    table: &str,
    id: &str,
    r: &RecordReservation,
    meta: &Meta,
    e: &mut Expr,
) -> Result<Vec<TransactWriteItem>, PortError> {
    let Some(d) = &r.uncapped else {
        return Ok(vec![]);
    };
    let mut moves: BTreeMap<(String, BudgetMonth), i64> = BTreeMap::new();
    *moves
        .entry((d.team.as_str().to_string(), d.month.clone()))
        .or_default() += d.amount.0;
    if r.to == RequestStatus::Reserved
        && let Some(open) = meta.record.open_debit.filter(|o| o.0 > 0)
    {
        let Some(ledger) = meta.open_debit_ledger.clone() else {
            return Err(self::error::corrupt(format!(
                "{id}: an open debit without its ledger"
            )));
        };
        *moves.entry(ledger).or_default() -= open.0;
    }
    let total: i64 = moves.values().sum();
    if total != 0 {
        e.add(attr::SPENT_MICROS, n(total));
    }
    let mut out = Vec::new();
    for ((team, month), amount) in moves {
        if amount < 0 {
            out.push(ledger_credit(
                table,
                &team,
                &month,
                MicroUsd(-amount),
                r.at,
            )?);
        } else if amount > 0 {
            let l = ledger_charge(&team, &month, amount, r.at);
            out.push(update(table, key(budget_pk(&team, &month), LEDGER_SK), &l)?);
        }
    }
    Ok(out)
}

/// Adds the request's side of a debit to a META update: `spent + amount <= request cap`.
fn request_debit(e: &mut Expr, d: &Debit) {
    e.add(attr::SPENT_MICROS, n(d.amount.0));
    let spent = e.name(attr::SPENT_MICROS);
    let limit = e.value(n(d.request_cap.0 - d.amount.0));
    e.condition(format!("{spent} <= {limit}"));
}

fn is_kind(item: &Item, k: &str) -> bool {
    matches!(item.get(attr::KIND), Some(AttributeValue::S(v)) if v == k)
}

fn log_over_team_budget(request_id: &str, d: &Debit, spent: MicroUsd) {
    tracing::info!(
        request_id,
        team = %d.team,
        spent_micros = spent.0,
        cap_micros = d.team_cap.0,
        amount_micros = d.amount.0,
        "debit refused: over the team's monthly budget"
    );
}

fn log_over_request_budget(request_id: &str, d: &Debit, spent: MicroUsd) {
    tracing::info!(
        request_id,
        spent_micros = spent.0,
        cap_micros = d.request_cap.0,
        amount_micros = d.amount.0,
        "debit refused: over the request's max_upfront_usd"
    );
}

fn check_transaction_size(items: &[TransactWriteItem]) -> Result<(), PortError> {
    if items.len() > MAX_TRANSACTION_ITEMS {
        return Err(permanent(
            "TooManyItems",
            format!(
                "one state change may write at most {MAX_TRANSACTION_ITEMS} items, this one \
                 writes {} (candidate plans plus outbox events)",
                items.len()
            ),
        ));
    }
    Ok(())
}

fn illegal(from: RequestStatus, to: RequestStatus, why: &str) -> PortError {
    permanent("IllegalTransition", format!("{from} -> {to}: {why}"))
}

// =======================================================================================
// Reads and the transaction call.
// =======================================================================================

impl DynamoStore {
    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store's time: the run's `now` (ARCHITECTURE §8.12), or the wall clock outside a
    /// run.
    fn now(&self) -> DateTime<Utc> {
        self.seen().now.unwrap_or_else(SystemClock::wall)
    }

    async fn transact(&self, items: Vec<TransactWriteItem>) -> Result<Committed, PortError> {
        check_transaction_size(&items)?;
        let writes: Vec<Write> = items.iter().filter_map(Write::of).collect();
        let result = self
            .client
            .transact_write_items()
            .client_request_token(self.ids.next_id())
            .set_transact_items(Some(items))
            .send()
            .await
            .map(|_| ());
        let committed = transaction_result(result);
        let applied = matches!(committed, Ok(Committed::Yes));
        self.seen().wrote(writes, applied);
        if applied {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        committed
    }

    /// One item by key, with a consistent read, unless this run has it already.
    async fn get(&self, key: Item) -> Result<Option<Item>, PortError> {
        let k = seen::key_of(&key);
        if let Some(k) = &k
            && let Some(item) = self.seen().item(k)
        {
            return Ok(item);
        }
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("GetItem", e, Call::Read))?;
        if let Some(k) = k {
            self.seen().read(k, out.item.clone());
        }
        Ok(out.item)
    }

    /// A single UpdateItem or PutItem on `key` happened (`applied` when it did).
    fn wrote_one(&self, write: Write, applied: bool) {
        self.seen().wrote(vec![write], applied);
    }

    /// Every item of a key-condition query, across pages.
    async fn query(
        &self,
        index: Option<&str>,
        e: Expr,
        key_condition: String,
    ) -> Result<Vec<Item>, PortError> {
        self.query_while(index, e, key_condition, |_| true).await
    }

    /// The items of a key-condition query, page by page, while `more` says the items so
    /// far are not enough.
    async fn query_while(
        &self,
        index: Option<&str>,
        e: Expr,
        key_condition: String,
        more: impl Fn(&[Item]) -> bool,
    ) -> Result<Vec<Item>, PortError> {
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .set_index_name(index.map(str::to_string))
            .key_condition_expression(key_condition)
            .set_expression_attribute_names(e.names())
            .set_expression_attribute_values(e.values())
            .consistent_read(index.is_none())
            .set_limit(self.page_size)
            .into_paginator()
            .send();
        let mut items = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("Query", e, Call::Read))?;
            items.extend(page.items.unwrap_or_default());
            if !more(&items) {
                break;
            }
        }
        Ok(items)
    }

    /// Every request the table holds (not past its TTL), without its candidates: a Scan of
    /// the `META` items, page by page, for the operator CLI's `list`. Nothing of the
    /// functions reads it; a tick's read stays the one Query of the `work` index.
    pub async fn list_requests(&self) -> Result<Vec<RequestRecord>, PortError> {
        let mut e = Expr::new();
        let sk = e.name(attr::SK);
        let meta = e.value(s(META_SK));
        let mut pages = self
            .client
            .scan()
            .table_name(&self.table)
            .filter_expression(format!("{sk} = {meta}"))
            .set_expression_attribute_names(e.names())
            .set_expression_attribute_values(e.values())
            .set_limit(self.page_size)
            .into_paginator()
            .send();
        let now = self.now();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| sdk_error("Scan", e, Call::Read))?;
            for item in page.items.unwrap_or_default() {
                if !is_gone(&item, now) {
                    out.push(read_meta(&item)?.record);
                }
            }
        }
        Ok(out)
    }

    /// The items of one request partition whose sort key starts with `prefix`, unless this
    /// run holds them already.
    async fn query_prefix(&self, request_id: &str, prefix: &str) -> Result<Vec<Item>, PortError> {
        let pk_value = request_pk(request_id);
        if let Some(items) = self.seen().range(&pk_value, prefix) {
            return Ok(items);
        }
        let mut e = Expr::new();
        let (pk, sk) = (e.name(attr::PK), e.name(attr::SK));
        let (pv, sv) = (e.value(s(pk_value.clone())), e.value(s(prefix)));
        let cond = format!("{pk} = {pv} AND begins_with({sk}, {sv})");
        let items = self.query(None, e, cond).await?;
        self.seen().read_range(&pk_value, prefix, &items);
        Ok(items)
    }

    /// The request as the table holds it now, not as this run read it: for a refusal
    /// that no conditional write confirms (an open debit, a debit above the team's whole
    /// cap). The read rule's one exception: a refusal must not rest on a read another
    /// writer may have overtaken (the differential test's racing writer did), and it costs
    /// one GetItem on those refusals only. `None` when the request has moved from `version`
    /// in `status`.
    async fn still_at(
        &self,
        request_id: &str,
        version: u64,
        status: RequestStatus,
    ) -> Result<Option<Meta>, PortError> {
        self.seen()
            .forget(&(request_pk(request_id), META_SK.to_string()));
        Ok(self
            .read_meta(request_id)
            .await?
            .filter(|m| m.record.version == version && m.record.status == status))
    }

    /// Deletes what an earlier request of `request_id` left unstamped, before a request takes
    /// the id (review N14, and its L4): once the earlier one's META is gone or past its TTL,
    /// a candidate, reservation, slot or history item that its archival failed to stamp
    /// (`archive_children` only logs a failure) would be read as the new request's own. With
    /// a live META nothing is touched (the creation finds it and answers so). A new id costs
    /// one GetItem and one Query that finds nothing.
    async fn sweep_leftovers(&self, request_id: &str) -> Result<(), PortError> {
        // A `Planned` request's id takes a new request (ARCHITECTURE §8.1): its items go as an
        // archived one's do, while it is still the one recorded.
        let planned = match self.read_meta(request_id).await? {
            Some(m) if m.record.status == RequestStatus::Planned => true,
            Some(_) => return Ok(()),
            None => false,
        };
        let pk_value = request_pk(request_id);
        let prefixes = [OFFER_PREFIX, RES_PREFIX, SLOT_PREFIX, HIST_PREFIX];
        let mut left: Vec<String> = Vec::new();
        if planned {
            // Prefix by prefix: its META, read above, is not read again (the README's read
            // rule); and a plan has only candidates and history.
            for prefix in [OFFER_PREFIX, HIST_PREFIX] {
                left.extend(
                    self.query_prefix(request_id, prefix)
                        .await?
                        .iter()
                        .filter_map(|i| i.get(attr::SK).and_then(|v| v.as_s().ok()).cloned()),
                );
            }
        } else {
            let mut e = Expr::new();
            let pk = e.name(attr::PK);
            let pv = e.value(s(pk_value.clone()));
            let items = self.query(None, e, format!("{pk} = {pv}")).await?;
            left.extend(
                items
                    .iter()
                    .filter_map(|i| i.get(attr::SK).and_then(|v| v.as_s().ok()).cloned())
                    .filter(|sk| prefixes.iter().any(|p| sk.starts_with(p))),
            );
        }
        // Each batch only while no request holds the id: a concurrent submission of it that
        // created its request between our read and these deletes (its first history item
        // among what we listed) makes the batch fail whole, and this creation then finds it.
        for chunk in left.chunks(MAX_TRANSACTION_ITEMS - 1) {
            let c = replaceable(self.now());
            let mut batch = vec![condition_check(
                &self.table,
                key(pk_value.clone(), META_SK),
                &c,
            )?];
            for sk in chunk {
                batch.push(delete(&self.table, key(pk_value.clone(), sk.clone()))?);
            }
            if !matches!(self.transact(batch).await?, Committed::Yes) {
                return Ok(());
            }
            let mut seen = self.seen();
            for sk in chunk {
                seen.forget(&(pk_value.clone(), sk.clone()));
            }
        }
        if !left.is_empty() {
            tracing::info!(
                request_id,
                swept = left.len(),
                "an earlier request of this id left items its archival did not stamp; deleted"
            );
        }
        Ok(())
    }

    async fn read_meta(&self, request_id: &str) -> Result<Option<Meta>, PortError> {
        match self.get(key(request_pk(request_id), META_SK)).await? {
            Some(item) if !is_gone(&item, self.now()) => Ok(Some(read_meta(&item)?)),
            _ => Ok(None),
        }
    }

    async fn event_seen(&self, request_id: &str, cause: &Cause) -> Result<bool, PortError> {
        Ok(self
            .get(key(request_pk(request_id), event_sk(&cause.event_id)))
            .await?
            .is_some())
    }

    async fn ledger_spent(&self, team: &str, month: &BudgetMonth) -> Result<MicroUsd, PortError> {
        let item = self.get(key(budget_pk(team, month), LEDGER_SK)).await?;
        let spent = match item {
            Some(i) => Read::new(&i).opt_int(attr::SPENT_MICROS)?.unwrap_or(0),
            None => 0,
        };
        Ok(MicroUsd(spent))
    }

    /// After a request ends: the TTL on the items its last transaction did not touch
    /// (reservations, workloads, sent outbox items, old plans). Housekeeping only: the
    /// state change is committed, so a failure here is logged, not returned.
    /// The tombstone left for `id`, if any (expired ones included: callers check).
    async fn tombstone(&self, id: &RequestId) -> Result<Option<Tombstone>, PortError> {
        let mut found = None;
        for pk in tombstone_pks(id) {
            found = self.get(key(pk, TOMBSTONE_SK)).await?;
            if found.is_some() {
                break;
            }
        }
        let Some(item) = found else {
            return Ok(None);
        };
        let r = Read::new(&item);
        Ok(Some(Tombstone {
            // As the cancellation spelled it, which may differ from `id` in case.
            request_id: r.request_id()?,
            source: r.str(attr::SOURCE)?.to_string(),
            reason: r.str(attr::REASON)?.to_string(),
            at: r.time(attr::CREATED_AT)?,
            event_id: r.str(attr::EVENT_ID)?.to_string(),
        }))
    }

    async fn archive_children(&self, request_id: &str, at: DateTime<Utc>, before: &Meta) {
        if let Err(err) = self.try_archive_children(request_id, at, before).await {
            tracing::warn!(
                request_id,
                error = %err,
                "archiving the items of an ended request failed; they stay until DynamoDB's \
                 TTL has nothing to remove them by"
            );
        }
    }

    /// Sets the TTL on the children the ending write did not touch, named from the request
    /// as it was read before that write (`before`): its candidates, reservations (by its
    /// windows), workloads (by its slots) and history. Written, not read: processed events,
    /// sent outbox items and tombstones carry their TTL from the start, and an unsent outbox
    /// item stays until it is sent.
    async fn try_archive_children(
        &self,
        request_id: &str,
        at: DateTime<Utc>,
        before: &Meta,
    ) -> Result<(), PortError> {
        let mut sks: BTreeSet<String> = (0..before.candidate_count).map(offer_sk).collect();
        for w in &before.record.windows {
            sks.insert(reservation_sk(w.reservation_id()));
        }
        sks.extend(before.slots.iter().map(|k| format!("{SLOT_PREFIX}{k}")));
        sks.extend((1..=before.record.version + 1).map(history_sk));
        let pk_value = request_pk(request_id);
        for sk in sks {
            let mut u = Expr::new();
            u.set(attr::EXPIRES_AT, archive_at(at));
            let (pkn, exp) = (u.name(attr::PK), u.name(attr::EXPIRES_AT));
            u.condition(format!("attribute_exists({pkn})"))
                .condition(format!("attribute_not_exists({exp})"));
            let result = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(key(pk_value.clone(), sk.clone())))
                .set_update_expression(u.update_expression())
                .set_condition_expression(u.condition_expression())
                .set_expression_attribute_names(u.names())
                .set_expression_attribute_values(u.values())
                .send()
                .await;
            self.wrote_one(Write::Update((pk_value.clone(), sk)), false);
            match result {
                Ok(_) => {}
                // Gone, or archived already.
                Err(err)
                    if err
                        .as_service_error()
                        .is_some_and(|se| se.is_conditional_check_failed_exception()) => {}
                Err(err) => return Err(sdk_error("UpdateItem", err, Call::Write)),
            }
        }
        Ok(())
    }

    /// One conditional UpdateItem removing an item's TTL: false when its condition did not
    /// hold (gone, or changed since it was read).
    async fn remove_ttl(&self, k: Item, mut u: Expr) -> Result<bool, PortError> {
        u.remove(attr::EXPIRES_AT);
        let pkn = u.name(attr::PK);
        u.condition(format!("attribute_exists({pkn})"));
        self.conditional_update(k, &u).await
    }

    /// Removes the TTL from the request of `meta` (its META item as read) and from the
    /// children an ending write archived (candidates, reservations, workloads, history);
    /// processed events and outbox items keep theirs. META takes its place in the `work`
    /// index by today's rule, and only while its windows are as read: a write since then
    /// set both by the rule already.
    async fn unarchive_items(&self, meta: &Item, at: DateTime<Utc>) -> Result<(), PortError> {
        let r = Read::new(meta);
        let request_id = r.str(attr::REQUEST_ID)?.to_string();
        let pk_value = request_pk(&request_id);
        let mut e = Expr::new();
        let pkn = e.name(attr::PK);
        let pv = e.value(s(pk_value.clone()));
        for item in self.query(None, e, format!("{pkn} = {pv}")).await? {
            let Some(AttributeValue::S(sk)) = item.get(attr::SK) else {
                continue;
            };
            let archived_child = [
                kind::OFFER,
                kind::RESERVATION,
                kind::WORKLOAD,
                kind::HISTORY,
            ]
            .iter()
            .any(|k| matches!(item.get(attr::KIND), Some(AttributeValue::S(v)) if v == k));
            if !item.contains_key(attr::EXPIRES_AT) || !(sk == META_SK || archived_child) {
                continue;
            }
            let mut u = Expr::new();
            if sk == META_SK {
                let status = r.status(attr::STATUS)?;
                let records: Vec<WindowRecord> = r.json(attr::WINDOWS)?;
                let due = r.opt_time(attr::NEXT_ACTION_AT)?;
                if let Some(t) = index_due(status, &records, due, at) {
                    u.set(attr::GSI_PART, s(WORK_PARTITION))
                        .set(attr::GSI_DUE, n(t.timestamp()));
                }
                let windows = meta
                    .get(attr::WINDOWS)
                    .cloned()
                    .ok_or_else(|| self::error::corrupt(format!("{request_id}: no windows")))?;
                let (wn, wv) = (u.name(attr::WINDOWS), u.value(windows));
                u.condition(format!("{wn} = {wv}"));
            }
            self.remove_ttl(key(pk_value.clone(), sk.clone()), u)
                .await?;
        }
        Ok(())
    }

    /// The request as the holder of lease `token` reads it before a lease write: `None` when
    /// it is not `Purchasing` under that lease (the write is refused).
    async fn meta_under_lease(&self, id: &str, token: &str) -> Result<Option<Meta>, PortError> {
        Ok(self.read_meta(id).await?.filter(|m| {
            m.record.status == RequestStatus::Purchasing
                && m.record.lease.as_ref().is_some_and(|l| l.token == token)
        }))
    }

    /// When a lease write's conditions fail: a replay of an applied write, or a lost lease.
    async fn lease_write_refused(
        &self,
        request_id: &str,
        cause: &Cause,
    ) -> Result<LeaseWriteOutcome, PortError> {
        if self.event_seen(request_id, cause).await? {
            Ok(LeaseWriteOutcome::DuplicateEvent)
        } else {
            Ok(LeaseWriteOutcome::LeaseLost)
        }
    }
}

// =======================================================================================
// The port.
// =======================================================================================

/// A region's search allowance item (ARCHITECTURE §8.8): one per region, shared by every
/// invocation, written by conditional put on the version it was read at.
fn pace_key(region: &str) -> Item {
    key(format!("PACE#{region}"), "PACE")
}

/// A region's detector item: partition and sort key alike.
const DETECT_PREFIX: &str = "DETECT#";

fn detector_key(region: &str) -> Item {
    key(
        format!("{DETECT_PREFIX}{region}"),
        format!("{DETECT_PREFIX}{region}"),
    )
}

/// How many times a pacing write is tried against other invocations' writes.
const PACE_ATTEMPTS: usize = 5;

impl DynamoStore {
    /// Reads `region`'s allowance and its version (0: none yet).
    async fn allowance(
        &self,
        region: &str,
        now: DateTime<Utc>,
    ) -> Result<(Allowance, i64), PortError> {
        Ok(match self.get(pace_key(region)).await? {
            Some(item) => {
                let r = Read::new(&item);
                (r.json(attr::DATA)?, r.int(attr::VERSION)?)
            }
            None => (Allowance::fresh(DESCRIBE_PACE, now), 0),
        })
    }

    /// Writes `a` as the version after `version`; false when another invocation wrote first.
    async fn put_allowance(
        &self,
        region: &str,
        a: &Allowance,
        version: i64,
    ) -> Result<bool, PortError> {
        let mut item = pace_key(region);
        item.insert(attr::KIND.into(), s(kind::PACE));
        item.insert(attr::DATA.into(), json("allowance", a)?);
        item.insert(attr::VERSION.into(), n(version + 1));
        let expected = (version != 0).then(|| n(version));
        self.put_if(item, attr::VERSION, expected).await
    }

    /// Puts `item` if its attribute `attr` is `expected`, or absent when `None`; false when
    /// another writer's item stands there instead.
    async fn put_if(
        &self,
        item: Item,
        attr: &str,
        expected: Option<AttributeValue>,
    ) -> Result<bool, PortError> {
        let (condition, values) = match expected {
            None => ("attribute_not_exists(#c)".to_string(), None),
            Some(v) => (
                "#c = :c".to_string(),
                Some(HashMap::from([(":c".to_string(), v)])),
            ),
        };
        let written = item.clone();
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .expression_attribute_names("#c", attr)
            .set_expression_attribute_values(values)
            .send()
            .await;
        self.wrote_one(Write::Put(written), result.is_ok());
        match result {
            Ok(_) => Ok(true),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|se| se.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(err) => Err(sdk_error("PutItem", err, Call::Write)),
        }
    }

    /// Applies `change` to `region`'s allowance, retrying lost races.
    async fn change_allowance<T>(
        &self,
        region: &str,
        now: DateTime<Utc>,
        change: impl Fn(Allowance) -> (Allowance, T),
    ) -> Result<T, PortError> {
        for _ in 0..PACE_ATTEMPTS {
            let (a, version) = self.allowance(region, now).await?;
            let (after, out) = change(a);
            if after == a || self.put_allowance(region, &after, version).await? {
                return Ok(out);
            }
        }
        Err(PortError::Transient {
            service: "dynamodb",
            code: "Contended".into(),
            message: format!("{region}'s search allowance kept changing"),
        })
    }
}

impl Pacing for DynamoStore {
    async fn take_searches(
        &self,
        region: &str,
        wanted: u32,
        now: DateTime<Utc>,
    ) -> Result<u32, PortError> {
        self.change_allowance(region, now, |a| a.take(DESCRIBE_PACE, wanted, now))
            .await
    }

    async fn back_off(
        &self,
        region: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), PortError> {
        self.change_allowance(region, now, |a| (a.backed_off(until), ()))
            .await
    }
}

/// The condition that no request holds a META's id: none is recorded, the one recorded is
/// archived past its TTL, or it ended `Planned` (ARCHITECTURE §8.1: a plan's id may be
/// submitted again).
fn replaceable(now: DateTime<Utc>) -> Expr {
    let mut c = Expr::new();
    let (pkn, exp, st) = (
        c.name(attr::PK),
        c.name(attr::EXPIRES_AT),
        c.name(attr::STATUS),
    );
    let (nowv, planned) = (
        c.value(n(now.timestamp())),
        c.value(s(RequestStatus::Planned.as_str())),
    );
    c.condition(format!(
        "attribute_not_exists({pkn}) OR {exp} <= {nowv} OR {st} = {planned}"
    ));
    c
}

impl Store for DynamoStore {
    async fn create_request(&self, new: NewRequest) -> Result<CreateOutcome, PortError> {
        let id = new.request.id.as_str().to_string();
        let pk = request_pk(&id);
        self.sweep_leftovers(&id).await?;
        let (status, reason, next_action_at) = match &new.cancelled {
            Some(why) => (RequestStatus::Cancelled, why.clone(), None),
            None => (
                RequestStatus::Accepted,
                new.reason.clone(),
                new.next_action_at,
            ),
        };
        let mut meta = key(pk.clone(), META_SK);
        meta.insert(attr::KIND.into(), s(kind::REQUEST));
        meta.insert(attr::REQUEST_ID.into(), s(id.clone()));
        meta.insert(attr::TEAM.into(), s(new.request.team.as_str()));
        meta.insert(attr::STATUS.into(), s(status.as_str()));
        meta.insert(attr::VERSION.into(), n(1));
        meta.insert(attr::REASON.into(), s(reason.clone()));
        meta.insert(attr::SOURCE.into(), s(new.source.clone()));
        if status.is_terminal() {
            meta.insert(attr::EXPIRES_AT.into(), archive_at(new.at));
        }
        meta.insert(attr::REQUEST.into(), json("request", &new.request)?);
        meta.insert(attr::CANDIDATE_COUNT.into(), n(0));
        meta.insert(attr::OFFERS_VERSION.into(), n(1));
        meta.insert(attr::SPENT_MICROS.into(), n(0));
        meta.insert(attr::CREATED_AT.into(), time(new.at));
        meta.insert(attr::UPDATED_AT.into(), time(new.at));
        meta.insert(attr::SLOTS.into(), AttributeValue::M(HashMap::new()));
        if let Some(t) = next_action_at {
            meta.insert(attr::NEXT_ACTION_AT.into(), time(t));
            meta.insert(attr::GSI_PART.into(), s(WORK_PARTITION));
            meta.insert(attr::GSI_DUE.into(), n(t.timestamp()));
        }
        // An archived request past its TTL may still be on disk, and a `Planned` one is
        // done with: either's id is free again.
        let c = replaceable(self.now());

        // Another spelling of the id holds it (review N15): refused as this spelling would be.
        let holder = self.id_holder(&new.request.id).await?;
        if let ids::Holder::Held(named) = &holder
            && *named != new.request.id
        {
            return Ok(CreateOutcome::AlreadyExists);
        }
        let mut items = vec![
            event_record(&self.table, &pk, &new.caused_by, new.at)?,
            put(&self.table, meta, Some(c))?,
        ];
        const META_ITEM: usize = 1;
        let ids_from = items.len();
        items.extend(ids::take(
            &self.table,
            &new.request.id,
            holder,
            self.now(),
            new.at,
        )?);
        let ids_to = items.len();
        let tombstones_from = items.len();
        if new.cancelled.is_none() {
            // No tombstone from this source honoured now (§8.3): the cancellation came first.
            // Tombstones are kept under the id lower-cased, and were under the id as given.
            for pk in tombstone_pks(&new.request.id) {
                let mut t = Expr::new();
                let (pkn, src, at) = (t.name(attr::PK), t.name(attr::SOURCE), t.name(attr::AT_US));
                let (sv, since) = (
                    t.value(s(new.source.clone())),
                    t.value(n(epoch_micros(new.at - TOMBSTONE_KEPT))),
                );
                t.condition(format!(
                    "attribute_not_exists({pkn}) OR {src} <> {sv} OR {at} <= {since}"
                ));
                items.push(condition_check(&self.table, key(pk, TOMBSTONE_SK), &t)?);
            }
        }
        let tombstones_to = items.len();
        let claims_from = items.len();
        for w in &new.claims {
            items.push(claims::claim_put(&self.table, w, new.at)?);
        }
        let claims_to = items.len();
        items.extend(change_items(
            &self.table,
            &id,
            &new.outbox,
            Change {
                version: 1,
                from: None,
                to: status,
                reason: &reason,
                cause: &new.caused_by,
                at: new.at,
                archived: status.is_terminal(),
            },
        )?);
        Ok(match self.transact(items).await? {
            Committed::Yes => {
                tracing::info!(request_id = %id, %status, "request recorded");
                CreateOutcome::Created { version: 1 }
            }
            c if c.failed(EVENT_ITEM) => CreateOutcome::DuplicateEvent,
            // A request of this id is recorded: that answers a submission, whatever
            // tombstone stands beside it (the in-memory store's order, and the caller's:
            // the id is the idempotency key).
            c if c.failed(META_ITEM) => CreateOutcome::AlreadyExists,
            c if (tombstones_from..tombstones_to).any(|i| c.failed(i)) => {
                match self.tombstone(&new.request.id).await? {
                    Some(t) if t.honoured(&new.source, new.at) => CreateOutcome::Tombstoned(t),
                    // Gone between the write and this read: the caller tries again.
                    _ => {
                        return Err(transient(
                            "Contended",
                            format!("{id}: a tombstone changed under the submission"),
                        ));
                    }
                }
            }
            // The id taken meanwhile, or its holder changed: read it again and decide again.
            c if (ids_from..ids_to)
                .chain(claims_from..claims_to)
                .any(|i| c.failed(i)) =>
            {
                CreateOutcome::ClaimChanged
            }
            _ => CreateOutcome::AlreadyExists,
        })
    }

    async fn claim(&self, key: &ClaimKey) -> Result<Option<Claim>, PortError> {
        self.read_claim(key).await
    }

    async fn write_claim(&self, w: ClaimWrite) -> Result<bool, PortError> {
        self.put_claim(w).await
    }

    async fn record_rejection(&self, r: RejectedSubmission) -> Result<(), PortError> {
        let folded = r.request_id.folded();
        let mut item = key(
            request_pk(&folded),
            format!("{REJECTED_PREFIX}{}", r.event_id),
        );
        item.insert(attr::KIND.into(), s(kind::REJECTION));
        item.insert(attr::REQUEST_ID.into(), s(r.request_id.as_str()));
        item.insert(attr::EVENT_ID.into(), s(r.event_id.clone()));
        item.insert(attr::CREATED_AT.into(), time(r.at));
        item.insert(
            attr::EXPIRES_AT.into(),
            n((r.at + REJECTION_KEPT).timestamp()),
        );
        item.insert(attr::DATA.into(), json("rejection", &r)?);
        // A redelivery writes the same item again.
        let written = item.clone();
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await;
        self.wrote_one(Write::Put(written), result.is_ok());
        result
            .map(drop)
            .map_err(|e| sdk_error("PutItem", e, Call::Write))
    }

    async fn rejections(
        &self,
        request_id: &RequestId,
    ) -> Result<Vec<RejectedSubmission>, PortError> {
        let now = self.now();
        let mut out = Vec::new();
        for i in self
            .query_prefix(&request_id.folded(), REJECTED_PREFIX)
            .await?
        {
            if is_gone(&i, now) {
                continue;
            }
            out.push(Read::new(&i).json::<RejectedSubmission>(attr::DATA)?);
        }
        out.sort_by_key(|r| r.at);
        Ok(out)
    }

    async fn put_tombstone(
        &self,
        t: Tombstone,
        outbox: Vec<OutboundEvent>,
    ) -> Result<TombstoneOutcome, PortError> {
        let id = t.request_id.as_str();
        let pk = request_pk(id);
        // Not while a request holds the id in another spelling either (review N15).
        let ids::Holder::Free(found) = self.id_holder(&t.request_id).await? else {
            return Ok(TombstoneOutcome::RequestExists);
        };
        let mut item = key(request_pk(&t.request_id.folded()), TOMBSTONE_SK);
        item.insert(attr::KIND.into(), s(kind::TOMBSTONE));
        item.insert(attr::REQUEST_ID.into(), s(id));
        item.insert(attr::SOURCE.into(), s(t.source.clone()));
        item.insert(attr::REASON.into(), s(t.reason.clone()));
        item.insert(attr::EVENT_ID.into(), s(t.event_id.clone()));
        item.insert(attr::CREATED_AT.into(), time(t.at));
        item.insert(attr::AT_US.into(), n(epoch_micros(t.at)));
        item.insert(
            attr::EXPIRES_AT.into(),
            n((t.at + TOMBSTONE_KEPT).timestamp()),
        );
        // Only while no request of the id is recorded (one archived past its TTL is gone).
        let mut c = Expr::new();
        let (pkn, exp) = (c.name(attr::PK), c.name(attr::EXPIRES_AT));
        let now = c.value(n(t.at.timestamp()));
        c.condition(format!("attribute_not_exists({pkn}) OR {exp} <= {now}"));
        let cause = Cause::new(t.event_id.clone());
        let mut items = vec![
            event_record(&self.table, &pk, &cause, t.at)?,
            condition_check(&self.table, key(pk.clone(), META_SK), &c)?,
            put(&self.table, item, None)?,
        ];
        items.extend(ids::still_free(
            &self.table,
            &t.request_id,
            found.as_ref(),
            t.at,
        )?);
        items.extend(outbox_items(&self.table, id, &outbox, 0, t.at)?);
        Ok(match self.transact(items).await? {
            Committed::Yes => {
                tracing::info!(request_id = id, source = %t.source, "cancellation kept as a tombstone");
                TombstoneOutcome::Placed
            }
            c if c.failed(EVENT_ITEM) => TombstoneOutcome::DuplicateEvent,
            _ => TombstoneOutcome::RequestExists,
        })
    }

    async fn spelled(&self, request_id: &RequestId) -> Result<Option<RequestId>, PortError> {
        self.id_holder(request_id).await.map(|h| match h {
            ids::Holder::Held(named) if named != *request_id => Some(named),
            _ => None,
        })
    }

    async fn get_request(
        &self,
        request_id: &RequestId,
    ) -> Result<Option<RequestRecord>, PortError> {
        // META and its candidates, read in one Query, or only what this run lacks of them:
        // kept candidates serve only while META's `offers_version` is what they were read at.
        let pk_value = request_pk(request_id.as_str());
        let meta_key = (pk_value.clone(), META_SK.to_string());
        let kept_meta = self.seen().item(&meta_key);
        let kept_offers = self.seen().tagged_range(&pk_value, OFFER_PREFIX);
        let offers_version = |m: &Option<Item>| -> Option<i64> {
            m.as_ref()
                .and_then(|i| Read::new(i).opt_int(attr::OFFERS_VERSION).ok().flatten())
        };
        let meta = match kept_meta {
            Some(m) => Some(m),
            // Candidates kept: META alone.
            None if kept_offers.is_some() => Some(self.get(key(pk_value.clone(), META_SK)).await?),
            None => None,
        };
        let items: Vec<Item> = match (meta, kept_offers) {
            (Some(meta), Some((offers, tag))) if tag == offers_version(&meta) => {
                meta.into_iter().chain(offers).collect()
            }
            (meta, _) => {
                let mut e = Expr::new();
                let (pk, sk) = (e.name(attr::PK), e.name(attr::SK));
                let pv = e.value(s(pk_value.clone()));
                let from = match meta {
                    Some(_) => e.value(s(OFFER_PREFIX)),
                    None => e.value(s(META_SK)),
                };
                let to = e.value(s(AFTER_OFFERS));
                let cond = format!("{pk} = {pv} AND {sk} BETWEEN {from} AND {to}");
                let read = self.query(None, e, cond).await?;
                let (found, offers): (Vec<Item>, Vec<Item>) = read.into_iter().partition(
                    |i| matches!(i.get(attr::SK), Some(AttributeValue::S(v)) if v == META_SK),
                );
                let meta = match meta {
                    Some(m) => m,
                    None => {
                        let m = found.into_iter().next();
                        self.seen().read(meta_key, m.clone());
                        m
                    }
                };
                self.seen().read_tagged_range(
                    &pk_value,
                    OFFER_PREFIX,
                    &offers,
                    Some(offers_version(&meta).unwrap_or(0)),
                );
                meta.into_iter().chain(offers).collect()
            }
        };
        let Some(meta_item) = items
            .iter()
            .find(|i| matches!(i.get(attr::SK), Some(AttributeValue::S(v)) if v == META_SK))
        else {
            return Ok(None);
        };
        if is_gone(meta_item, self.now()) {
            return Ok(None);
        }
        let Meta {
            mut record,
            candidate_count,
            ..
        } = read_meta(meta_item)?;
        // Items sort by `OFFER#<nnnn>`; any beyond the count are left over from a longer list.
        let mut candidates = Vec::with_capacity(candidate_count);
        for n in 0..candidate_count {
            let sk = offer_sk(n);
            let item = items
                .iter()
                .find(|i| matches!(i.get(attr::SK), Some(AttributeValue::S(v)) if *v == sk))
                .ok_or_else(|| {
                    self::error::corrupt(format!("{request_id}: candidate {sk} is missing"))
                })?;
            candidates.push(Read::new(item).json::<Plan>(attr::DATA)?);
        }
        record.candidates = candidates;
        Ok(Some(record))
    }

    async fn transition(&self, t: Transition) -> Result<WriteOutcome, PortError> {
        use RequestStatus::Purchasing;
        if !t.from.can_write(t.to) {
            return Err(illegal(t.from, t.to, "the life cycle does not allow it"));
        }
        if t.from == Purchasing || t.to == Purchasing {
            return Err(illegal(
                t.from,
                t.to,
                "purchases move only through begin_purchase, record_reservation and \
                 release_unbought",
            ));
        }
        if (t.hold && t.debit.is_none()) || (t.settle.is_some() && t.debit.is_some()) {
            return Err(permanent(
                "InvalidHold",
                "a hold needs a debit, and a write that settles the open debit debits nothing",
            ));
        }
        check_refund(&t)?;
        let id = t.request_id.as_str();
        let pk = request_pk(id);
        let meta = match self.read_meta(id).await? {
            Some(m) if m.record.version == t.expected_version && m.record.status == t.from => m,
            _ => {
                return Ok(if self.event_seen(id, &t.caused_by).await? {
                    WriteOutcome::DuplicateEvent
                } else {
                    WriteOutcome::Conflict
                });
            }
        };
        if let Some(d) = &t.debit
            && d.amount.0 <= 0
        {
            return Err(permanent(
                "InvalidDebit",
                format!("debit must be positive, got {}", d.amount),
            ));
        }
        if t.hold && meta.record.open_debit.is_some() {
            // What this run read may be stale: another writer may have settled it since.
            if self
                .still_at(id, t.expected_version, t.from)
                .await?
                .is_none()
            {
                return Ok(WriteOutcome::Conflict);
            }
            return Err(permanent(
                "DebitAlreadyOpen",
                format!("{id}: a debit is already open"),
            ));
        }
        // The ledger's condition passes on a ledger not yet created, whatever the amount.
        // Answered as the transaction would answer it: the request's cap first.
        if let Some(d) = &t.debit
            && d.amount > d.team_cap
        {
            let Some(fresh) = self.still_at(id, t.expected_version, t.from).await? else {
                return Ok(WriteOutcome::Conflict);
            };
            if d.over_request_cap(fresh.record.spent) {
                log_over_request_budget(id, d, fresh.record.spent);
                return Ok(WriteOutcome::OverRequestBudget {
                    spent: fresh.record.spent,
                    cap: d.request_cap,
                });
            }
            let spent = self.ledger_spent(d.team.as_str(), &d.month).await?;
            log_over_team_budget(id, d, spent);
            return Ok(WriteOutcome::OverTeamBudget {
                spent,
                cap: d.team_cap,
            });
        }

        let version = t.expected_version + 1;
        let windows = t.windows.as_ref().unwrap_or(&meta.record.windows);
        // A purchase in doubt keeps a terminal request unarchived until it is resolved.
        let in_doubt = t.to.is_terminal() && meta.record.doubt.is_some() && !t.resolve_doubt;
        let archived = window::archivable(t.to, windows) && !in_doubt;
        let mut e = Expr::new();
        e.set(attr::STATUS, s(t.to.as_str()))
            .set(attr::VERSION, n(version))
            .set(attr::REASON, s(t.reason.as_str()))
            .set(attr::UPDATED_AT, time(t.at));
        set_next_action(&mut e, t.to, t.next_action_at, windows, t.at)?;
        archival(&mut e, t.to, windows, in_doubt, t.at);
        if t.resolve_doubt {
            e.remove(attr::DOUBT).remove(attr::PURCHASE_CALL);
        }
        condition_version_and_status(&mut e, t.expected_version, t.from);
        if let Some(d) = &t.debit {
            request_debit(&mut e, d);
            if t.hold {
                e.set(attr::OPEN_DEBIT_MICROS, n(d.amount.0))
                    .set(attr::OPEN_DEBIT_TEAM, s(d.team.as_str()))
                    .set(attr::OPEN_DEBIT_MONTH, s(d.month.0.clone()));
            }
        }
        if let Some(run) = &t.run {
            e.set(attr::RUN, json("run", run)?);
        }
        match &t.search {
            Some(round) if *round == Default::default() => {
                e.remove(attr::SEARCH);
            }
            Some(round) => {
                e.set(attr::SEARCH, json("search", round)?);
            }
            None => {}
        }
        if let Some(note) = &t.cancel {
            e.set(attr::CANCEL, json("cancel", note)?);
        }
        // Settling the open debit: it was read with the version this write is conditional on.
        let mut release = None;
        if let Some(how) = t.settle {
            for a in [
                attr::OPEN_DEBIT_MICROS,
                attr::OPEN_DEBIT_TEAM,
                attr::OPEN_DEBIT_MONTH,
            ] {
                e.remove(a);
            }
            if let Some(amount) = meta
                .record
                .open_debit
                .map(|d| how.released(d))
                .filter(|d| d.0 > 0)
            {
                let Some((team, month)) = &meta.open_debit_ledger else {
                    return Err(self::error::corrupt(format!(
                        "{id}: an open debit without its ledger"
                    )));
                };
                e.add(attr::SPENT_MICROS, n(-amount.0));
                release = Some(ledger_credit(&self.table, team, month, amount, t.at)?);
            }
        }
        // A kept debit going back: out of the request's spent and the month's ledger, each
        // conditional on holding at least as much.
        let mut refund = None;
        if let Some(r) = &t.refund {
            e.add(attr::SPENT_MICROS, n(-r.amount.0));
            let spent = e.name(attr::SPENT_MICROS);
            let amt = e.value(n(r.amount.0));
            e.condition(format!("{spent} >= {amt}"));
            refund = Some(ledger_credit(
                &self.table,
                r.team
                    .as_ref()
                    .map_or(meta.record.team.as_str(), |t| t.as_str()),
                &r.month,
                r.amount,
                t.at,
            )?);
        }
        let mut plan_items = Vec::new();
        for r in &t.reservations {
            // One recorded here for the first time (a purchase in doubt found later) was
            // bought with the open debit: its payment failure returns it to that month.
            let mut r = r.clone();
            if r.debit_month.is_none()
                && let Some((team, month)) = &meta.open_debit_ledger
            {
                r.debit_month = Some(month.0.clone());
                r.debit_team = Some(team.clone());
            }
            plan_items.push(put(
                &self.table,
                reservation_item(&pk, id, &r, t.at, archived)?,
                None,
            )?);
        }
        if let Some(plans) = &t.candidates {
            e.set(attr::CANDIDATE_COUNT, n(plans.len() as i64))
                .set(attr::OFFERS_VERSION, n(version));
            for (i, plan) in plans.iter().enumerate() {
                let mut item = key(pk.clone(), offer_sk(i));
                item.insert(attr::KIND.into(), s(kind::OFFER));
                item.insert(attr::REQUEST_ID.into(), s(id));
                item.insert(attr::DATA.into(), json("plan", plan)?);
                item.insert(
                    attr::UPFRONT_FEE_USD.into(),
                    s(plan.upfront_fee.to_string()),
                );
                if archived {
                    item.insert(attr::EXPIRES_AT.into(), archive_at(t.at));
                }
                plan_items.push(put(&self.table, item, None)?);
            }
            for i in plans.len()..meta.candidate_count {
                plan_items.push(delete(&self.table, key(pk.clone(), offer_sk(i)))?);
            }
        }

        let mut items = vec![
            event_record(&self.table, &pk, &t.caused_by, t.at)?,
            update(&self.table, key(pk.clone(), META_SK), &e)?,
        ];
        const META_ITEM: usize = 1;
        const LEDGER_ITEM: usize = 2;
        if let Some(d) = &t.debit {
            items.push(ledger_debit(&self.table, d, t.at)?);
        }
        items.extend(release);
        let refund_item = refund.is_some().then_some(items.len());
        items.extend(refund);
        items.extend(plan_items);
        items.extend(change_items(
            &self.table,
            id,
            &t.outbox,
            Change {
                version,
                from: Some(t.from),
                to: t.to,
                reason: &t.reason,
                cause: &t.caused_by,
                at: t.at,
                archived,
            },
        )?);
        // ARCHITECTURE §9.7: no on-demand or spot run is held, and no extension leased, once a
        // pause commits.
        let pause_item = (t.hold || t.unpaused).then_some(items.len());
        if t.hold || t.unpaused {
            items.push(pause::pause_absent(&self.table)?);
        }

        let committed = self.transact(items).await?;
        if committed == Committed::Yes {
            tracing::info!(
                request_id = id,
                from = %t.from,
                to = %t.to,
                reason = %t.reason,
                debit_micros = t.debit.as_ref().map(|d| d.amount.0),
                "transition applied"
            );
            if archived {
                self.archive_children(id, t.at, &meta).await;
            }
            return Ok(WriteOutcome::Applied { version });
        }
        if committed.failed(EVENT_ITEM) {
            return Ok(WriteOutcome::DuplicateEvent);
        }
        if let Some(i) = pause_item
            && committed.failed(i)
            && let Some(p) = Box::pin(self.pause_item()).await?
        {
            tracing::info!(request_id = id, by = %p.by, "hold refused: purchases are paused");
            return Ok(WriteOutcome::Paused(p));
        }
        // The request moved (or spent less than the refund) is a conflict; a ledger short
        // of a refund the request holds is corruption.
        if refund_item.is_some_and(|i| committed.failed(i)) && !committed.failed(META_ITEM) {
            return Err(self::error::corrupt(format!(
                "{id}: the {} ledger holds less than the refund of {}",
                t.refund.as_ref().map_or("", |r| r.month.0.as_str()),
                t.refund.as_ref().map_or(MicroUsd(0), |r| r.amount)
            )));
        }
        if let Some(d) = &t.debit {
            if committed.failed(META_ITEM) {
                if let Some(m) = self.read_meta(id).await?
                    && m.record.version == t.expected_version
                    && m.record.status == t.from
                    && d.over_request_cap(m.record.spent)
                {
                    log_over_request_budget(id, d, m.record.spent);
                    return Ok(WriteOutcome::OverRequestBudget {
                        spent: m.record.spent,
                        cap: d.request_cap,
                    });
                }
                return Ok(WriteOutcome::Conflict);
            }
            if committed.failed(LEDGER_ITEM) {
                let spent = self.ledger_spent(d.team.as_str(), &d.month).await?;
                log_over_team_budget(id, d, spent);
                return Ok(WriteOutcome::OverTeamBudget {
                    spent,
                    cap: d.team_cap,
                });
            }
        }
        Ok(WriteOutcome::Conflict)
    }

    async fn update_windows(&self, u: WindowUpdate) -> Result<WriteOutcome, PortError> {
        if let Some(t) = u.as_transition() {
            return self.transition(t).await;
        }
        let id = u.request_id.as_str();
        let pk = request_pk(id);
        let meta = match self.read_meta(id).await? {
            Some(m) if m.record.version == u.expected_version && m.record.status == u.status => m,
            _ => {
                return Ok(if self.event_seen(id, &u.caused_by).await? {
                    WriteOutcome::DuplicateEvent
                } else {
                    WriteOutcome::Conflict
                });
            }
        };
        let version = u.expected_version + 1;
        // Status, lease and debit stay; only the windows, and the index with them, move.
        let mut e = Expr::new();
        e.set(attr::VERSION, n(version))
            .set(attr::REASON, s(u.reason.as_str()))
            .set(attr::UPDATED_AT, time(u.at));
        set_next_action(
            &mut e,
            u.status,
            meta.record.next_action_at,
            &u.windows,
            u.at,
        )?;
        // A terminal request's last window ending archives it (ARCHITECTURE §9.1), unless a
        // purchase of it is still in doubt.
        let in_doubt = meta.record.in_doubt();
        archival(&mut e, u.status, &u.windows, in_doubt, u.at);
        let archived = window::archivable(u.status, &u.windows) && !in_doubt;
        condition_version_and_status(&mut e, u.expected_version, u.status);
        let mut items = vec![
            event_record(&self.table, &pk, &u.caused_by, u.at)?,
            update(&self.table, key(pk.clone(), META_SK), &e)?,
        ];
        items.extend(change_items(
            &self.table,
            id,
            &u.outbox,
            Change {
                version,
                from: Some(u.status),
                to: u.status,
                reason: &u.reason,
                cause: &u.caused_by,
                at: u.at,
                archived,
            },
        )?);
        for r in &u.reservations {
            items.push(put(
                &self.table,
                reservation_item(&pk, id, r, u.at, archived)?,
                None,
            )?);
        }
        Ok(match self.transact(items).await? {
            Committed::Yes => {
                tracing::info!(request_id = id, status = %u.status, reason = %u.reason, "windows updated");
                if archived {
                    self.archive_children(id, u.at, &meta).await;
                }
                WriteOutcome::Applied { version }
            }
            c if c.failed(EVENT_ITEM) => WriteOutcome::DuplicateEvent,
            _ => WriteOutcome::Conflict,
        })
    }

    async fn begin_purchase(&self, b: BeginPurchase) -> Result<BeginPurchaseOutcome, PortError> {
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
        if let Some(d) = &b.debit
            && d.amount.0 <= 0
        {
            return Err(permanent(
                "InvalidDebit",
                format!("debit must be positive, got {}", d.amount),
            ));
        }
        let id = b.request_id.as_str();
        let pk = request_pk(id);
        // The ledger's condition passes on a ledger not yet created, whatever the amount.
        if let Some(d) = &b.debit
            && d.amount > d.team_cap
        {
            if self.event_seen(id, &b.caused_by).await? {
                return Ok(BeginPurchaseOutcome::DuplicateEvent);
            }
            // Answered as the transaction would answer it: the request's own conditions
            // (version, status, no debit open), then its cap, then the team's.
            match self.still_at(id, b.expected_version, b.from).await? {
                Some(m) if m.record.open_debit.is_none() => {
                    if d.over_request_cap(m.record.spent) {
                        log_over_request_budget(id, d, m.record.spent);
                        return Ok(BeginPurchaseOutcome::OverRequestBudget {
                            spent: m.record.spent,
                            cap: d.request_cap,
                        });
                    }
                }
                _ => return Ok(BeginPurchaseOutcome::Conflict),
            }
            let spent = self.ledger_spent(d.team.as_str(), &d.month).await?;
            log_over_team_budget(id, d, spent);
            return Ok(BeginPurchaseOutcome::OverTeamBudget {
                spent,
                cap: d.team_cap,
            });
        }

        // The windows stay due while the purchase runs (a split's kept block launches at its
        // start): they are read at the version this write is conditional on.
        let windows = match self.read_meta(id).await? {
            Some(m) if m.record.version == b.expected_version => m.record.windows,
            _ => Vec::new(),
        };
        let version = b.expected_version + 1;
        let mut e = meta_update(
            Purchasing,
            version,
            &b.reason,
            Some(b.lease.expires_at),
            &windows,
            b.at,
        )?;
        e.set(attr::LEASE_TOKEN, s(b.lease.token.clone()))
            .set(attr::LEASE_EXPIRES_AT, time(b.lease.expires_at))
            .set(attr::LEASE_EXPIRES_US, n(epoch_micros(b.lease.expires_at)));
        if let Some(d) = &b.doubt {
            e.set(attr::DOUBT, json("doubt", d)?);
        }
        // A new purchase has called nothing yet; a takeover keeps what it finds.
        if !takeover {
            e.set(
                attr::PURCHASE_CALL,
                json("purchase_call", &crate::ports::PurchaseCall::None)?,
            );
        }
        condition_version_and_status(&mut e, b.expected_version, b.from);
        if takeover {
            let exp = e.name(attr::LEASE_EXPIRES_US);
            let at = e.value(n(epoch_micros(b.at)));
            e.condition(format!("{exp} < {at}"));
        }
        if let Some(d) = &b.debit {
            request_debit(&mut e, d);
            e.set(attr::OPEN_DEBIT_MICROS, n(d.amount.0))
                .set(attr::OPEN_DEBIT_TEAM, s(d.team.as_str()))
                .set(attr::OPEN_DEBIT_MONTH, s(d.month.0.clone()));
            let open = e.name(attr::OPEN_DEBIT_MICROS);
            e.condition(format!("attribute_not_exists({open})"));
        }
        let mut items = vec![
            event_record(&self.table, &pk, &b.caused_by, b.at)?,
            update(&self.table, key(pk.clone(), META_SK), &e)?,
        ];
        const META_ITEM: usize = 1;
        const LEDGER_ITEM: usize = 2;
        if let Some(d) = &b.debit {
            items.push(ledger_debit(&self.table, d, b.at)?);
        }
        items.extend(change_items(
            &self.table,
            id,
            &b.outbox,
            Change {
                version,
                from: Some(b.from),
                to: Purchasing,
                reason: &b.reason,
                cause: &b.caused_by,
                at: b.at,
                archived: false,
            },
        )?);
        // ARCHITECTURE §9.7: nothing new is bought once a pause commits. A takeover goes on
        // with a purchase begun before it (`pause` lists those).
        let pause_item = (!takeover).then_some(items.len());
        if !takeover {
            items.push(pause::pause_absent(&self.table)?);
        }

        let committed = self.transact(items).await?;
        if committed == Committed::Yes {
            tracing::info!(
                request_id = id,
                takeover,
                lease_until = %b.lease.expires_at,
                debit_micros = b.debit.as_ref().map(|d| d.amount.0),
                "purchase lease acquired"
            );
            return Ok(BeginPurchaseOutcome::Acquired { version });
        }
        if committed.failed(EVENT_ITEM) {
            return Ok(BeginPurchaseOutcome::DuplicateEvent);
        }
        if let Some(i) = pause_item
            && committed.failed(i)
            && let Some(p) = Box::pin(self.pause_item()).await?
        {
            tracing::info!(request_id = id, by = %p.by, "purchase lease refused: purchases are paused");
            return Ok(BeginPurchaseOutcome::Paused(p));
        }
        if committed.failed(META_ITEM) {
            let Some(m) = self.read_meta(id).await? else {
                return Ok(BeginPurchaseOutcome::Conflict);
            };
            let r = &m.record;
            if r.version != b.expected_version || r.status != b.from {
                return Ok(BeginPurchaseOutcome::Conflict);
            }
            if takeover
                && let Some(lease) = &r.lease
                && lease.expires_at >= b.at
            {
                tracing::info!(
                    request_id = id,
                    until = %lease.expires_at,
                    "takeover refused: the lease is held"
                );
                return Ok(BeginPurchaseOutcome::LeaseHeld {
                    until: lease.expires_at,
                });
            }
            if let Some(d) = &b.debit
                && r.open_debit.is_none()
                && d.over_request_cap(r.spent)
            {
                log_over_request_budget(id, d, r.spent);
                return Ok(BeginPurchaseOutcome::OverRequestBudget {
                    spent: r.spent,
                    cap: d.request_cap,
                });
            }
            return Ok(BeginPurchaseOutcome::Conflict);
        }
        if let Some(d) = &b.debit
            && committed.failed(LEDGER_ITEM)
        {
            let spent = self.ledger_spent(d.team.as_str(), &d.month).await?;
            log_over_team_budget(id, d, spent);
            return Ok(BeginPurchaseOutcome::OverTeamBudget {
                spent,
                cap: d.team_cap,
            });
        }
        Ok(BeginPurchaseOutcome::Conflict)
    }

    async fn record_reservation(
        &self,
        r: RecordReservation,
    ) -> Result<LeaseWriteOutcome, PortError> {
        use RequestStatus::{Purchasing, Reserved};
        if !matches!(r.to, Reserved | Purchasing) {
            return Err(illegal(
                Purchasing,
                r.to,
                "a recorded reservation leads to Reserved or, between segments, Purchasing",
            ));
        }
        let id = r.request_id.as_str();
        let pk = request_pk(id);
        // The reservations the request already holds: only the lease holder records one, so
        // a retry below after a concurrent window update needs no second read.
        let mut held = self.reservations(&r.request_id).await?;
        held.retain(|x| x.id != r.reservation.id);
        held.push(r.reservation.clone());
        for _ in 0..LEASE_WRITE_ATTEMPTS {
            let mut reservation = r.reservation.clone();
            let Some(meta) = self.meta_under_lease(id, &r.lease_token).await? else {
                return self.lease_write_refused(id, &r.caused_by).await;
            };
            let current = meta.record.version;
            let version = current + 1;
            // The new reservation's windows are numbered after every window the request has.
            let windows = window::all_records(&held, &meta.record.windows, r.at);
            let mut e = meta_update(r.to, version, &r.reason, r.next_action_at, &windows, r.at)?;
            condition_version_and_status(&mut e, current, Purchasing);
            let tok = e.name(attr::LEASE_TOKEN);
            let tv = e.value(s(r.lease_token.clone()));
            e.condition(format!("{tok} = {tv}"));
            if r.to == Reserved {
                // Bought: the debit is kept, and the lease and its doubt have served.
                for a in [
                    attr::DOUBT,
                    attr::PURCHASE_CALL,
                    attr::LEASE_TOKEN,
                    attr::LEASE_EXPIRES_AT,
                    attr::LEASE_EXPIRES_US,
                    attr::OPEN_DEBIT_MICROS,
                    attr::OPEN_DEBIT_TEAM,
                    attr::OPEN_DEBIT_MONTH,
                ] {
                    e.remove(a);
                }
            } else if r.uncapped.is_none()
                && let Some(open) = meta.record.open_debit
            {
                let bought = r.reservation.upfront_fee.to_micros_ceil();
                e.set(attr::OPEN_DEBIT_MICROS, n((open.0 - bought.0).max(0)));
            }

            // The month its debit was charged to, where a payment failure returns it.
            if let Some(d) = &r.uncapped {
                reservation.debit_month = Some(d.month.0.clone());
                reservation.debit_team = Some(d.team.to_string());
            } else if let Some((team, month)) = &meta.open_debit_ledger {
                reservation.debit_month = Some(month.0.clone());
                reservation.debit_team = Some(team.clone());
            }
            let ledgers = stray_ledgers(&self.table, id, &r, &meta, &mut e)?;
            let res = reservation_item(&pk, id, &reservation, r.at, false)?;

            let mut items = vec![
                event_record(&self.table, &pk, &r.caused_by, r.at)?,
                update(&self.table, key(pk.clone(), META_SK), &e)?,
                put(&self.table, res, None)?,
            ];
            items.extend(ledgers);
            items.extend(change_items(
                &self.table,
                id,
                &r.outbox,
                Change {
                    version,
                    from: Some(Purchasing),
                    to: r.to,
                    reason: &r.reason,
                    cause: &r.caused_by,
                    at: r.at,
                    archived: window::archivable(r.to, &windows),
                },
            )?);
            match self.transact(items).await? {
                Committed::Yes => {
                    tracing::info!(
                        request_id = id,
                        reservation_id = %r.reservation.id,
                        fee = %r.reservation.upfront_fee,
                        to = %r.to,
                        "reservation recorded"
                    );
                    return Ok(LeaseWriteOutcome::Applied { version });
                }
                c if c.failed(EVENT_ITEM) => return Ok(LeaseWriteOutcome::DuplicateEvent),
                // The request moved between our read and our write: read again.
                _ => continue,
            }
        }
        Err(transient(
            "Contended",
            format!("{id}: the request kept changing under record_reservation"),
        ))
    }

    async fn keep_cancellation(&self, k: KeepCancellation) -> Result<WriteOutcome, PortError> {
        let id = k.request_id.as_str();
        let pk = request_pk(id);
        let Some(meta) = self.read_meta(id).await? else {
            return Ok(WriteOutcome::Conflict);
        };
        if meta.record.version != k.expected_version || meta.record.status != k.status {
            return Ok(WriteOutcome::Conflict);
        }
        if k.status.is_terminal() {
            return Err(illegal(
                k.status,
                k.status,
                "a cancellation is kept only on a request that has not ended",
            ));
        }
        let version = k.expected_version + 1;
        let mut e = meta_update(
            k.status,
            version,
            &k.reason,
            k.next_action_at,
            &meta.record.windows,
            k.at,
        )?;
        condition_version_and_status(&mut e, k.expected_version, k.status);
        match &k.note {
            Some(note) => {
                e.set(attr::CANCEL, json("cancel", note)?);
            }
            None => {
                e.remove(attr::CANCEL);
            }
        }
        let mut items = vec![
            event_record(&self.table, &pk, &k.caused_by, k.at)?,
            update(&self.table, key(pk.clone(), META_SK), &e)?,
        ];
        items.extend(change_items(
            &self.table,
            id,
            &k.outbox,
            Change {
                version,
                from: Some(k.status),
                to: k.status,
                reason: &k.reason,
                cause: &k.caused_by,
                at: k.at,
                archived: false,
            },
        )?);
        match self.transact(items).await? {
            Committed::Yes => Ok(WriteOutcome::Applied { version }),
            c if c.failed(EVENT_ITEM) => Ok(WriteOutcome::DuplicateEvent),
            _ => Ok(WriteOutcome::Conflict),
        }
    }

    async fn release_unbought(&self, r: ReleaseUnbought) -> Result<LeaseWriteOutcome, PortError> {
        use RequestStatus::{Cancelled, Failed, Purchasing, Reserved, Searching};
        if !matches!(r.to, Searching | Failed | Cancelled | Reserved) {
            return Err(illegal(
                Purchasing,
                r.to,
                "releasing an unbought debit leads to Searching, Failed, Cancelled or Reserved",
            ));
        }
        let id = r.request_id.as_str();
        let pk = request_pk(id);
        for _ in 0..LEASE_WRITE_ATTEMPTS {
            let Some(meta) = self.meta_under_lease(id, &r.lease_token).await? else {
                return self.lease_write_refused(id, &r.caused_by).await;
            };
            // A kept cancellation is applied by the release, never passed over (§8.3); the
            // version condition below catches one kept after this read.
            if meta.record.cancel.is_some() && r.to != Cancelled {
                return Ok(LeaseWriteOutcome::CancelKept);
            }
            let current = meta.record.version;
            let version = current + 1;
            let mut e = meta_update(
                r.to,
                version,
                &r.reason,
                r.next_action_at,
                &meta.record.windows,
                r.at,
            )?;
            condition_version_and_status(&mut e, current, Purchasing);
            let tok = e.name(attr::LEASE_TOKEN);
            let tv = e.value(s(r.lease_token.clone()));
            e.condition(format!("{tok} = {tv}"));
            for a in [
                attr::CANCEL,
                attr::DOUBT,
                attr::PURCHASE_CALL,
                attr::LEASE_TOKEN,
                attr::LEASE_EXPIRES_AT,
                attr::LEASE_EXPIRES_US,
                attr::OPEN_DEBIT_MICROS,
                attr::OPEN_DEBIT_TEAM,
                attr::OPEN_DEBIT_MONTH,
            ] {
                e.remove(a);
            }
            let open = meta.record.open_debit.filter(|d| d.0 > 0);
            let mut items = vec![event_record(&self.table, &pk, &r.caused_by, r.at)?];
            const LEDGER_ITEM: usize = 2;
            if let Some(amount) = open {
                let Some((team, month)) = &meta.open_debit_ledger else {
                    return Err(self::error::corrupt(format!(
                        "{id}: an open debit without its ledger"
                    )));
                };
                e.add(attr::SPENT_MICROS, n(-amount.0));
                items.push(update(&self.table, key(pk.clone(), META_SK), &e)?);
                items.push(ledger_credit(&self.table, team, month, amount, r.at)?);
            } else {
                items.push(update(&self.table, key(pk.clone(), META_SK), &e)?);
            }
            items.extend(change_items(
                &self.table,
                id,
                &r.outbox,
                Change {
                    version,
                    from: Some(Purchasing),
                    to: r.to,
                    reason: &r.reason,
                    cause: &r.caused_by,
                    at: r.at,
                    archived: window::archivable(r.to, &meta.record.windows),
                },
            )?);
            match self.transact(items).await? {
                Committed::Yes => {
                    tracing::info!(
                        request_id = id,
                        released_micros = open.map(|d| d.0),
                        to = %r.to,
                        reason = %r.reason,
                        "unbought debit released"
                    );
                    if window::archivable(r.to, &meta.record.windows) {
                        self.archive_children(id, r.at, &meta).await;
                    }
                    return Ok(LeaseWriteOutcome::Applied { version });
                }
                c if c.failed(EVENT_ITEM) => return Ok(LeaseWriteOutcome::DuplicateEvent),
                c if open.is_some() && c.failed(LEDGER_ITEM) => {
                    return Err(self::error::corrupt(format!(
                        "{id}: the ledger holds less than the open debit it should release"
                    )));
                }
                _ => continue,
            }
        }
        Err(transient(
            "Contended",
            format!("{id}: the request kept changing under release_unbought"),
        ))
    }

    async fn claim_detector(
        &self,
        region: &str,
        seen: Option<DateTime<Utc>>,
        next: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        let mut item = detector_key(region);
        item.insert(attr::KIND.into(), s(kind::DETECTOR));
        item.insert(attr::REGION.into(), s(region));
        item.insert(attr::NEXT_ACTION_AT.into(), time(next));
        item.insert(attr::GSI_PART.into(), s(WORK_PARTITION));
        item.insert(attr::GSI_DUE.into(), n(next.timestamp()));
        self.put_if(item, attr::NEXT_ACTION_AT, seen.map(time))
            .await
    }

    async fn mark_purchase_call(
        &self,
        m: MarkPurchaseCall,
    ) -> Result<LeaseWriteOutcome, PortError> {
        let id = m.request_id.as_str();
        let pk = request_pk(id);
        for _ in 0..LEASE_WRITE_ATTEMPTS {
            // Under the lease, and before it expires: a call is made only while it is held.
            let Some(meta) = self
                .meta_under_lease(id, &m.lease_token)
                .await?
                .filter(|x| x.record.lease.as_ref().is_some_and(|l| l.expires_at > m.at))
            else {
                return self.lease_write_refused(id, &m.caused_by).await;
            };
            let mut called = match &meta.record.purchase_call {
                Some(PurchaseCall::Called { offering_ids, .. }) => offering_ids.clone(),
                _ => Vec::new(),
            };
            for o in &m.offering_ids {
                if !called.contains(o) {
                    called.push(o.clone());
                }
            }
            let marker = PurchaseCall::Called {
                at: m.at,
                offering_ids: called,
            };
            let current = meta.record.version;
            let version = current + 1;
            // The status, its next action (the lease's expiry) and the index stay.
            let mut e = Expr::new();
            e.set(attr::VERSION, n(version))
                .set(attr::REASON, s(m.reason.as_str()))
                .set(attr::UPDATED_AT, time(m.at))
                .set(attr::PURCHASE_CALL, json("purchase_call", &marker)?);
            condition_version_and_status(&mut e, current, RequestStatus::Purchasing);
            let tok = e.name(attr::LEASE_TOKEN);
            let tv = e.value(s(m.lease_token.clone()));
            e.condition(format!("{tok} = {tv}"));
            let exp = e.name(attr::LEASE_EXPIRES_US);
            let at = e.value(n(epoch_micros(m.at)));
            e.condition(format!("{exp} > {at}"));
            let mut items = vec![
                event_record(&self.table, &pk, &m.caused_by, m.at)?,
                update(&self.table, key(pk.clone(), META_SK), &e)?,
            ];
            items.extend(change_items(
                &self.table,
                id,
                &[],
                Change {
                    version,
                    from: Some(RequestStatus::Purchasing),
                    to: RequestStatus::Purchasing,
                    reason: &m.reason,
                    cause: &m.caused_by,
                    at: m.at,
                    archived: false,
                },
            )?);
            match self.transact(items).await? {
                Committed::Yes => {
                    tracing::info!(request_id = id, offerings = ?m.offering_ids, "purchase call recorded");
                    return Ok(LeaseWriteOutcome::Applied { version });
                }
                c if c.failed(EVENT_ITEM) => return Ok(LeaseWriteOutcome::DuplicateEvent),
                // The request moved between our read and our write: read again.
                _ => continue,
            }
        }
        Err(transient(
            "Contended",
            format!("{id}: the request kept changing under mark_purchase_call"),
        ))
    }

    async fn fail_in_doubt(&self, f: FailInDoubt) -> Result<LeaseWriteOutcome, PortError> {
        use RequestStatus::{Cancelled, Failed, Purchasing};
        if !matches!(f.to, Failed | Cancelled) {
            return Err(illegal(
                Purchasing,
                f.to,
                "a purchase ends in doubt as Failed, or Cancelled applying a kept cancellation",
            ));
        }
        let id = f.request_id.as_str();
        let pk = request_pk(id);
        for _ in 0..LEASE_WRITE_ATTEMPTS {
            let Some(meta) = self.meta_under_lease(id, &f.lease_token).await? else {
                return self.lease_write_refused(id, &f.caused_by).await;
            };
            if meta.record.doubt.is_none() {
                return Err(illegal(
                    Purchasing,
                    f.to,
                    "only a purchase with its doubt recorded ends in doubt",
                ));
            }
            // A kept cancellation is applied, never passed over (§8.3).
            if meta.record.cancel.is_some() && f.to != Cancelled {
                return Ok(LeaseWriteOutcome::CancelKept);
            }
            let current = meta.record.version;
            let version = current + 1;
            let windows = &meta.record.windows;
            let mut e = Expr::new();
            e.set(attr::STATUS, s(f.to.as_str()))
                .set(attr::VERSION, n(version))
                .set(attr::REASON, s(f.reason.as_str()))
                .set(attr::UPDATED_AT, time(f.at));
            set_next_action(&mut e, f.to, f.next_action_at, windows, f.at)?;
            // The doubt, the call marker and the open debit stay; no TTL while they do.
            archival(&mut e, f.to, windows, true, f.at);
            for a in [
                attr::CANCEL,
                attr::LEASE_TOKEN,
                attr::LEASE_EXPIRES_AT,
                attr::LEASE_EXPIRES_US,
            ] {
                e.remove(a);
            }
            condition_version_and_status(&mut e, current, Purchasing);
            let tok = e.name(attr::LEASE_TOKEN);
            let tv = e.value(s(f.lease_token.clone()));
            e.condition(format!("{tok} = {tv}"));
            let mut items = vec![
                event_record(&self.table, &pk, &f.caused_by, f.at)?,
                update(&self.table, key(pk.clone(), META_SK), &e)?,
            ];
            items.extend(change_items(
                &self.table,
                id,
                &f.outbox,
                Change {
                    version,
                    from: Some(Purchasing),
                    to: f.to,
                    reason: &f.reason,
                    cause: &f.caused_by,
                    at: f.at,
                    archived: false,
                },
            )?);
            match self.transact(items).await? {
                Committed::Yes => {
                    tracing::warn!(request_id = id, to = %f.to, reason = %f.reason, "purchase ended in doubt; its debit is kept");
                    return Ok(LeaseWriteOutcome::Applied { version });
                }
                c if c.failed(EVENT_ITEM) => return Ok(LeaseWriteOutcome::DuplicateEvent),
                _ => continue,
            }
        }
        Err(transient(
            "Contended",
            format!("{id}: the request kept changing under fail_in_doubt"),
        ))
    }

    async fn reservations(&self, request_id: &RequestId) -> Result<Vec<Reservation>, PortError> {
        let now = self.now();
        self.query_prefix(request_id.as_str(), RES_PREFIX)
            .await?
            .iter()
            .filter(|i| !is_expired(i, now))
            .filter(|i| is_kind(i, kind::RESERVATION))
            .map(|i| Read::new(i).json(attr::DATA))
            .collect()
    }

    async fn budget_spent(&self, team: &Team, month: &BudgetMonth) -> Result<MicroUsd, PortError> {
        self.ledger_spent(team.as_str(), month).await
    }

    async fn put_workload(&self, w: WorkloadRecord) -> Result<(), PortError> {
        let id = w.request_id.as_str();
        let mut item = key(request_pk(id), workload_sk(&w.reservation_id, w.slot));
        item.insert(attr::KIND.into(), s(kind::WORKLOAD));
        item.insert(attr::REQUEST_ID.into(), s(id));
        item.insert(attr::RESERVATION_ID.into(), s(w.reservation_id.clone()));
        item.insert(attr::SLOT.into(), n(w.slot));
        item.insert(attr::GENERATION.into(), n(w.generation));
        item.insert(attr::RESOURCE_ID.into(), s(w.resource_id.clone()));
        item.insert(attr::STATE.into(), s(w.state.clone()));
        item.insert(attr::UPDATED_AT.into(), time(w.updated_at));
        item.insert(attr::DATA.into(), json("workload", &w)?);
        // Its copy on META, in the same transaction: the tick's read shows what runs.
        let mut e = Expr::new();
        let (slots, slot) = (
            e.name(attr::SLOTS),
            e.data_name(&slot_key(&w.reservation_id, w.slot)),
        );
        let v = e.value(json("workload", &w)?);
        let pk = e.name(attr::PK);
        e.condition(format!("attribute_exists({pk})"));
        e.set_path(format!("{slots}.{slot}"), v);
        let items = vec![
            put(&self.table, item, None)?,
            update(&self.table, key(request_pk(id), META_SK), &e)?,
        ];
        match self.transact(items).await? {
            Committed::Yes => Ok(()),
            _ => Err(permanent(
                "NoSuchRequest",
                format!("{id}: a workload is recorded only under a recorded request"),
            )),
        }
    }

    async fn workloads(&self, request_id: &RequestId) -> Result<Vec<WorkloadRecord>, PortError> {
        let now = self.now();
        self.query_prefix(request_id.as_str(), SLOT_PREFIX)
            .await?
            .iter()
            .filter(|i| !is_expired(i, now))
            .filter(|i| is_kind(i, kind::WORKLOAD))
            .map(|i| Read::new(i).json(attr::DATA))
            .collect()
    }

    async fn unsent_outbox(&self, limit: usize) -> Result<Vec<OutboxItem>, PortError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Every unsent item sits at `OUTBOX_DUE`, before any request.
        let mut out = self.read_work(OUTBOX_DUE).await?.outbox;
        out.truncate(limit);
        Ok(out)
    }

    async fn claim_outbox(
        &self,
        request_id: &str,
        event_key: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        let mut e = Expr::new();
        e.set(attr::CLAIM_UNTIL_US, n(epoch_micros(until)));
        let (pk, sent, claim) = (
            e.name(attr::PK),
            e.name(attr::SENT_AT),
            e.name(attr::CLAIM_UNTIL_US),
        );
        let now_v = e.value(n(epoch_micros(now)));
        e.condition(format!("attribute_exists({pk})"))
            .condition(format!("attribute_not_exists({sent})"))
            .condition(format!(
                "attribute_not_exists({claim}) OR {claim} < {now_v}"
            ));
        self.conditional_outbox_update(request_id, event_key, &e)
            .await
    }

    async fn release_outbox_claim(
        &self,
        request_id: &str,
        event_key: &str,
    ) -> Result<(), PortError> {
        let mut e = Expr::new();
        e.remove(attr::CLAIM_UNTIL_US);
        let pk = e.name(attr::PK);
        e.condition(format!("attribute_exists({pk})"));
        self.conditional_outbox_update(request_id, event_key, &e)
            .await
            .map(drop)
    }

    async fn mark_sent(&self, request_id: &str, event_key: &str) -> Result<(), PortError> {
        let now = self.now();
        let mut e = Expr::new();
        e.set(attr::SENT_AT, time(now))
            .set(attr::EXPIRES_AT, archive_at(now))
            .remove(attr::GSI_PART)
            .remove(attr::GSI_DUE);
        let pk = e.name(attr::PK);
        e.condition(format!("attribute_exists({pk})"));
        // Already archived (the condition fails): there is nothing left to mark.
        self.conditional_outbox_update(request_id, event_key, &e)
            .await
            .map(drop)
    }

    async fn unarchive(
        &self,
        request_id: &RequestId,
        at: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        let Some(meta) = self
            .get(key(request_pk(request_id.as_str()), META_SK))
            .await?
        else {
            return Ok(false);
        };
        if !meta.contains_key(attr::EXPIRES_AT) || !keeps_live_window(&meta) {
            return Ok(false);
        }
        self.unarchive_items(&meta, at).await?;
        tracing::info!(
            request_id = %request_id,
            "upgrade: a terminal request holding a window not ended keeps no TTL"
        );
        Ok(true)
    }

    async fn read_pause(&self) -> Result<Option<Pause>, PortError> {
        self.pause_item().await
    }

    async fn put_pause(&self, pause: Pause) -> Result<Result<(), Pause>, PortError> {
        self.write_pause(pause).await
    }

    async fn delete_pause(&self) -> Result<Option<Pause>, PortError> {
        self.remove_pause().await
    }

    async fn agenda(&self, now: DateTime<Utc>) -> Result<Agenda, PortError> {
        let mut a = self.read_work(now.timestamp()).await?;
        // The index holds whole seconds; `next_action_at` is exact.
        a.due.retain(|d| d.next_action_at <= now);
        Ok(a)
    }

    fn outbox_writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    fn begin_run(&self, now: DateTime<Utc>) {
        self.seen().begin(now);
    }

    async fn history(&self, request_id: &RequestId) -> Result<Vec<HistoryEntry>, PortError> {
        let mut out = Vec::new();
        for i in self.query_prefix(request_id.as_str(), HIST_PREFIX).await? {
            let r = Read::new(&i);
            out.push(HistoryEntry {
                version: u64::try_from(r.int(attr::VERSION)?)
                    .map_err(|_| self::error::corrupt("a negative history version"))?,
                from: match r.opt_str(attr::FROM)? {
                    Some(_) => Some(r.status(attr::FROM)?),
                    None => None,
                },
                to: r.status(attr::TO)?,
                reason: r.str(attr::REASON)?.to_string(),
                cause: r.str(attr::CAUSE)?.to_string(),
                at: r.time(attr::CREATED_AT)?,
            });
        }
        Ok(out)
    }
}

impl DynamoStore {
    /// The one Query of the `work` index up to `gsi_due <= until` (epoch seconds), sorted
    /// into due requests (not yet filtered by their exact time), live requests and unsent
    /// outbox items.
    async fn read_work(&self, until: i64) -> Result<Agenda, PortError> {
        let mut e = Expr::new();
        let (gp, gd) = (e.name(attr::GSI_PART), e.name(attr::GSI_DUE));
        let (pv, dv) = (e.value(s(WORK_PARTITION)), e.value(n(until)));
        let cond = format!("{gp} = {pv} AND {gd} <= {dv}");
        let wall = self.now();
        let mut a = Agenda::default();
        for i in self.query(Some(WORK_INDEX), e, cond).await? {
            if is_gone(&i, wall) {
                continue;
            }
            let r = Read::new(&i);
            let sk = r.str(attr::SK)?;
            if sk == pause::PAUSE_KEY {
                a.pause = Some(pause::read(&i)?);
                continue;
            }
            if sk.starts_with("OUTBOX#") {
                a.outbox.push(OutboxItem {
                    request_id: r.str(attr::REQUEST_ID)?.to_string(),
                    event: r.json(attr::EVENT)?,
                    created_at: r.time(attr::CREATED_AT)?,
                    seq: r
                        .opt_int(attr::OUTBOX_SEQ)?
                        .and_then(|n| u32::try_from(n).ok())
                        .unwrap_or(0),
                });
                continue;
            }
            if let Some(region) = sk.strip_prefix(DETECT_PREFIX) {
                // (The index projects the keys and the due time: the region is in the key.)
                a.detectors.push(DetectorDue {
                    at: r.time(attr::NEXT_ACTION_AT)?,
                    region: region.to_string(),
                });
                continue;
            }
            if let Some(reservation_id) = sk.strip_prefix(RES_PREFIX) {
                if let Some(at) = r.opt_time(attr::NEXT_ACTION_AT)?
                    && at.timestamp() <= until
                {
                    a.payments.push(PaymentDue {
                        request_id: r.request_id()?,
                        reservation_id: reservation_id.to_string(),
                        at,
                    });
                }
                continue;
            }
            if sk != META_SK {
                continue;
            }
            let request_id = r.request_id()?;
            if i.contains_key(attr::EXPIRES_AT) && keeps_live_window(&i) {
                a.stale_ttl.push(request_id.clone());
            }
            let status = r.status(attr::STATUS)?;
            let windows: Vec<WindowRecord> = match r.opt_str(attr::WINDOWS)? {
                Some(_) => r.json(attr::WINDOWS)?,
                None => Vec::new(),
            };
            if let Some(next_action_at) = r.opt_time(attr::NEXT_ACTION_AT)?
                && next_action_at.timestamp() <= until
            {
                let own_action_at = if windows.is_empty() {
                    Some(next_action_at)
                } else {
                    r.opt_time(attr::OWN_NEXT_ACTION_AT)?
                };
                a.due.push(DueItem {
                    request_id: request_id.clone(),
                    status,
                    next_action_at,
                    own_action_at,
                    window_action_at: window::window_action_at(&windows),
                    notice_at: window::notice_at(&windows),
                });
            }
            if window::may_be_running(status, &windows) {
                let mut workloads = Vec::new();
                if let Some(AttributeValue::M(slots)) = i.get(attr::SLOTS) {
                    for v in slots.values() {
                        let AttributeValue::S(raw) = v else {
                            return Err(self::error::corrupt(format!(
                                "{request_id}: a slot copy is not a string"
                            )));
                        };
                        workloads.push(serde_json::from_str::<WorkloadRecord>(raw).map_err(
                            |e| self::error::corrupt(format!("{request_id}: a slot copy: {e}")),
                        )?);
                    }
                }
                workloads
                    .sort_by(|x, y| (&x.reservation_id, x.slot).cmp(&(&y.reservation_id, y.slot)));
                a.live.push(LiveRequest {
                    request_id,
                    status,
                    windows,
                    workloads,
                });
            }
        }
        a.due.sort_by(|x, y| {
            (x.next_action_at, &x.request_id).cmp(&(y.next_action_at, &y.request_id))
        });
        // The index's order is its due times'; the agenda's is the request ids'.
        a.live.sort_by(|x, y| x.request_id.cmp(&y.request_id));
        a.payments.sort();
        a.detectors.sort();
        a.outbox.sort_by(|x, y| {
            (x.created_at, &x.request_id, x.seq, &x.event.event_key).cmp(&(
                y.created_at,
                &y.request_id,
                y.seq,
                &y.event.event_key,
            ))
        });
        Ok(a)
    }
}
