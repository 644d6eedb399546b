//! The table's layout: keys, attribute names, and the conversion between items and domain
//! types. Nothing outside this module knows how an item is spelled.
//!
//! | pk                        | sk                                 | what                     |
//! |---------------------------|------------------------------------|--------------------------|
//! | `REQ#<id>`                | `META`                             | the request              |
//! | `REQ#<id>`                | `OFFER#<nnnn>`                     | a candidate plan         |
//! | `REQ#<id>`                | `RES#<reservation>`                | a reservation            |
//! | `REQ#<id>`                | `SLOT#<reservation>#<nnnnn>`       | an instance/job/...      |
//! | `REQ#<id>`                | `HIST#<nnnnnnnnnn>`                | a state change (version) |
//! | `REQ#<id>`                | `EVENT#<event id>`                 | a processed event        |
//! | `REQ#<id>`                | `OUTBOX#<event key>`               | an event to publish      |
//! | `BUDGET#<team>#<yyyy-mm>` | `LEDGER`                           | a team's monthly spend   |
//! | `DETECT#<region>`         | `DETECT#<region>`                  | a region's next detector |
//! | `PAUSE`                   | `PAUSE`                            | purchases paused (§9.7)  |
//!
//! The request's windows (`domain::window`) live on its META item, as JSON in `windows`, so a
//! window's step and the status it implies are one conditional write. `next_action_at` holds
//! when the request is due: the earliest of its status's own next action (kept in
//! `own_next_action_at` once it has windows) and its windows'. META also keeps `slots`, a
//! copy of each workload record (a map from `<reservation>#<slot>` to its JSON) written in
//! the same transaction as the record, so the index row shows what runs.
//!
//! The `work` index has one partition (`gsi_part = WORK`) ordered by `gsi_due` (epoch
//! seconds): a request with a next action is in it at that time, a request whose workloads
//! may be running (a launching, running, stopping or draining window, an on-demand or spot
//! run) at the time of its last write, so it is in every later tick's range, and an unsent
//! outbox item at its creation. One Query `gsi_part = WORK AND gsi_due <= now` is a tick's
//! whole read; what is due is filtered in code by the exact `next_action_at`.
//!
//! Money is a decimal string inside the JSON documents, and integer micro-USD (`N`) in the
//! ledger and the request's debit attributes. Times are RFC 3339 strings; epoch numbers sit
//! beside them where DynamoDB must order or expire by them.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::corrupt;
use crate::domain::money::MicroUsd;
use crate::domain::request::{RequestId, Team};
use crate::domain::status::RequestStatus;
use crate::domain::window::WindowRecord;
use crate::ports::{BudgetMonth, Lease, PortError, RequestRecord};

pub(super) type Item = HashMap<String, AttributeValue>;

/// How long ended items stay before DynamoDB's TTL removes them.
pub const ARCHIVE_AFTER: TimeDelta = TimeDelta::days(90);

/// The sparse index serving a tick: due and running requests and unsent outbox items.
pub(super) const WORK_INDEX: &str = "work";
/// The index's one partition.
pub(super) const WORK_PARTITION: &str = "WORK";

pub(super) mod attr {
    pub const PK: &str = "pk";
    pub const SK: &str = "sk";
    pub const KIND: &str = "kind";
    pub const REQUEST_ID: &str = "request_id";
    pub const TEAM: &str = "team";
    pub const MONTH: &str = "month";
    pub const STATUS: &str = "status";
    pub const VERSION: &str = "version";
    pub const REASON: &str = "reason";
    /// The whole `CapacityRequest`, as JSON.
    pub const REQUEST: &str = "request";
    pub const CANDIDATE_COUNT: &str = "candidate_count";
    /// The version of the write that last set the candidates: a run keeps candidates it
    /// read only while META still says this.
    pub const OFFERS_VERSION: &str = "offers_version";
    /// When the request is due: the earliest of its status's own next action and its
    /// windows' (the index, `gsi_due`, holds the same in whole seconds).
    pub const NEXT_ACTION_AT: &str = "next_action_at";
    /// With windows: the status's own next action (without, it is `next_action_at`).
    pub const OWN_NEXT_ACTION_AT: &str = "own_next_action_at";
    /// The request's window records (`domain::window::WindowRecord`), as JSON.
    pub const WINDOWS: &str = "windows";
    /// The `work` index's partition key: [`WORK_PARTITION`](super::WORK_PARTITION) while in it.
    pub const GSI_PART: &str = "gsi_part";
    /// Epoch seconds.
    pub const GSI_DUE: &str = "gsi_due";
    pub const LEASE_TOKEN: &str = "lease_token";
    pub const LEASE_EXPIRES_AT: &str = "lease_expires_at";
    /// Epoch microseconds, for the takeover condition.
    pub const LEASE_EXPIRES_US: &str = "lease_expires_us";
    /// The purchase under way (`ports::Doubt`), as JSON.
    pub const DOUBT: &str = "doubt";
    /// Whether the purchase under the lease called AWS (`ports::PurchaseCall`), as JSON.
    pub const PURCHASE_CALL: &str = "purchase_call";
    /// A detector item's region.
    pub const REGION: &str = "region";
    pub const CANCEL: &str = "cancel";
    /// An on-demand run's record (JSON).
    pub const RUN: &str = "run";
    /// A request's search round (JSON).
    pub const SEARCH: &str = "search_round";
    pub const OPEN_DEBIT_MICROS: &str = "open_debit_micros";
    pub const OPEN_DEBIT_TEAM: &str = "open_debit_team";
    pub const OPEN_DEBIT_MONTH: &str = "open_debit_month";
    pub const SPENT_MICROS: &str = "spent_micros";
    pub const CREATED_AT: &str = "created_at";
    /// An outbox item's place among the events of the write that made it.
    pub const OUTBOX_SEQ: &str = "outbox_seq";
    /// Until when (epoch microseconds) a run holds an outbox item to publish it.
    pub const CLAIM_UNTIL_US: &str = "claim_until_us";
    pub const UPDATED_AT: &str = "updated_at";
    /// TTL, epoch seconds.
    pub const EXPIRES_AT: &str = "expires_at";
    /// A plan, reservation or workload record, as JSON.
    pub const DATA: &str = "data";
    pub const EVENT_ID: &str = "event_id";
    /// Who submitted a request, or sent a tombstone's cancellation.
    pub const SOURCE: &str = "source";
    /// A tombstone's time, in epoch microseconds (conditions compare numbers).
    pub const AT_US: &str = "at_us";
    pub const EVENT_KEY: &str = "event_key";
    /// An `OutboundEvent`, as JSON.
    pub const EVENT: &str = "event";
    pub const SENT_AT: &str = "sent_at";
    pub const RESERVATION_ID: &str = "reservation_id";
    pub const UPFRONT_FEE_USD: &str = "upfront_fee_usd";
    pub const STATE: &str = "state";
    pub const SLOT: &str = "slot";
    pub const GENERATION: &str = "generation";
    pub const RESOURCE_ID: &str = "resource_id";
    /// On META: each workload record's JSON by `<reservation>#<slot>` (a map).
    pub const SLOTS: &str = "slots";
    /// A history item's statuses and cause.
    pub const FROM: &str = "from";
    pub const TO: &str = "to";
    pub const CAUSE: &str = "cause";
}

pub(super) mod kind {
    pub const REQUEST: &str = "request";
    pub const OFFER: &str = "offer";
    pub const RESERVATION: &str = "reservation";
    pub const WORKLOAD: &str = "workload";
    pub const EVENT: &str = "event";
    pub const OUTBOX: &str = "outbox";
    pub const LEDGER: &str = "ledger";
    pub const TOMBSTONE: &str = "tombstone";
    pub const PAUSE: &str = "pause";
    /// A rejected submission's reasons (`REQ#<id>` / `REJECTED#<event id>`).
    pub const REJECTION: &str = "rejection";
    pub const HISTORY: &str = "history";
    /// A region's search allowance (`PACE#<region>`).
    pub const PACE: &str = "pace";
    /// A region's detector of unrecorded reservations (`DETECT#<region>`), in the `work`
    /// index at its next run.
    pub const DETECTOR: &str = "detector";
}

pub(super) const META_SK: &str = "META";
pub(super) const LEDGER_SK: &str = "LEDGER";
/// A cancellation that came before its request (sorts after `RES#`, outside `META..=OFFER$`).
pub(super) const TOMBSTONE_SK: &str = "TOMBSTONE";
/// Sorts after every `OFFER#...` (`$` follows `#`): `META..=OFFER$` is the request and its
/// candidates in one query.
pub(super) const AFTER_OFFERS: &str = "OFFER$";
pub(super) const OFFER_PREFIX: &str = "OFFER#";
pub(super) const RES_PREFIX: &str = "RES#";
pub(super) const SLOT_PREFIX: &str = "SLOT#";
pub(super) const HIST_PREFIX: &str = "HIST#";
/// A rejected submission, by its event: outside `META..=OFFER$`, and no other prefix read
/// (`RES#`, `SLOT#`, `HIST#`) begins it.
pub(super) const REJECTED_PREFIX: &str = "REJECTED#";

pub(super) fn request_pk(id: &str) -> String {
    format!("REQ#{id}")
}
pub(super) fn offer_sk(n: usize) -> String {
    format!("{OFFER_PREFIX}{n:04}")
}
pub(super) fn reservation_sk(reservation_id: &str) -> String {
    format!("{RES_PREFIX}{reservation_id}")
}
pub(super) fn workload_sk(reservation_id: &str, slot: u32) -> String {
    format!("{SLOT_PREFIX}{}", slot_key(reservation_id, slot))
}
/// A workload's key in META's `slots` map.
pub(super) fn slot_key(reservation_id: &str, slot: u32) -> String {
    format!("{reservation_id}#{slot:05}")
}
pub(super) fn history_sk(version: u64) -> String {
    format!("{HIST_PREFIX}{version:010}")
}
pub(super) fn event_sk(event_id: &str) -> String {
    format!("EVENT#{event_id}")
}
pub(super) fn outbox_sk(event_key: &str) -> String {
    format!("OUTBOX#{event_key}")
}
pub(super) fn budget_pk(team: &str, month: &BudgetMonth) -> String {
    format!("BUDGET#{team}#{}", month.0)
}

pub(super) fn key(pk: String, sk: impl Into<String>) -> Item {
    HashMap::from([(attr::PK.to_string(), s(pk)), (attr::SK.to_string(), s(sk))])
}

// ---------------------------------------------------------------------------------------
// Values.
// ---------------------------------------------------------------------------------------

pub(super) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(super) fn n(v: impl Into<i128>) -> AttributeValue {
    AttributeValue::N(v.into().to_string())
}

/// RFC 3339 with as many fractional digits as the value has: parses back to the same instant.
pub(super) fn time(t: DateTime<Utc>) -> AttributeValue {
    s(t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

pub(super) fn epoch_micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

pub(super) fn json<T: Serialize>(what: &str, v: &T) -> Result<AttributeValue, PortError> {
    serde_json::to_string(v)
        .map(s)
        .map_err(|e| super::error::permanent("EncodeFailed", format!("{what}: {e}")))
}

/// The TTL of an item that ends at `at`.
pub(super) fn archive_at(at: DateTime<Utc>) -> AttributeValue {
    n((at + ARCHIVE_AFTER).timestamp())
}

/// Whether DynamoDB may already have deleted the item (it deletes lazily, so reads check).
/// Whether an item is gone for reads: past its TTL, unless it is a request's META holding a
/// window not ended. A terminal request written before ARCHITECTURE §9.1 got its TTL whatever
/// its windows; it is read as live until the upgrade
/// ([`crate::ports::Store::unarchive`]) removes that TTL.
pub(super) fn is_gone(item: &Item, now: DateTime<Utc>) -> bool {
    is_expired(item, now) && !keeps_live_window(item)
}

/// Whether `item` is the META of a Failed, Rejected or Cancelled request holding a window not
/// ended or a purchase in doubt, which ARCHITECTURE §9.1 keeps unarchived
/// (`RequestRecord::archivable`).
pub(super) fn keeps_live_window(item: &Item) -> bool {
    let r = Read::new(item);
    let Ok(status) = r.status(attr::STATUS) else {
        return false;
    };
    let windows: Vec<WindowRecord> = match r.opt_str(attr::WINDOWS) {
        Ok(Some(_)) => r.json(attr::WINDOWS).unwrap_or_default(),
        _ => Vec::new(),
    };
    status.is_terminal()
        && (!crate::domain::window::archivable(status, &windows) || item.contains_key(attr::DOUBT))
}

pub(super) fn is_expired(item: &Item, now: DateTime<Utc>) -> bool {
    match item.get(attr::EXPIRES_AT) {
        Some(AttributeValue::N(v)) => v.parse::<i64>().is_ok_and(|e| e <= now.timestamp()),
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------
// Reading items.
// ---------------------------------------------------------------------------------------

/// Typed access to one item's attributes; a missing or malformed one is a `CorruptItem`.
pub(super) struct Read<'a> {
    item: &'a Item,
}

impl<'a> Read<'a> {
    pub(super) fn new(item: &'a Item) -> Read<'a> {
        Read { item }
    }

    fn whose(&self) -> String {
        let part = |a| match self.item.get(a) {
            Some(AttributeValue::S(v)) => v.as_str(),
            _ => "?",
        };
        format!("{}/{}", part(attr::PK), part(attr::SK))
    }

    pub(super) fn opt_str(&self, name: &str) -> Result<Option<&'a str>, PortError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::S(v)) => Ok(Some(v.as_str())),
            Some(other) => Err(corrupt(format!(
                "{}: {name} is not a string: {other:?}",
                self.whose()
            ))),
        }
    }

    pub(super) fn str(&self, name: &str) -> Result<&'a str, PortError> {
        self.opt_str(name)?
            .ok_or_else(|| corrupt(format!("{}: {name} is missing", self.whose())))
    }

    pub(super) fn opt_int(&self, name: &str) -> Result<Option<i64>, PortError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::N(v)) => v
                .parse::<i64>()
                .map(Some)
                .map_err(|_| corrupt(format!("{}: {name} is not an integer: {v}", self.whose()))),
            Some(other) => Err(corrupt(format!(
                "{}: {name} is not a number: {other:?}",
                self.whose()
            ))),
        }
    }

    pub(super) fn int(&self, name: &str) -> Result<i64, PortError> {
        self.opt_int(name)?
            .ok_or_else(|| corrupt(format!("{}: {name} is missing", self.whose())))
    }

    pub(super) fn opt_time(&self, name: &str) -> Result<Option<DateTime<Utc>>, PortError> {
        self.opt_str(name)?
            .map(|v| {
                DateTime::parse_from_rfc3339(v)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|e| {
                        corrupt(format!(
                            "{}: {name} is not RFC 3339: {v}: {e}",
                            self.whose()
                        ))
                    })
            })
            .transpose()
    }

    pub(super) fn time(&self, name: &str) -> Result<DateTime<Utc>, PortError> {
        self.opt_time(name)?
            .ok_or_else(|| corrupt(format!("{}: {name} is missing", self.whose())))
    }

    pub(super) fn json<T: DeserializeOwned>(&self, name: &str) -> Result<T, PortError> {
        let raw = self.str(name)?;
        serde_json::from_str(raw)
            .map_err(|e| corrupt(format!("{}: {name} does not decode: {e}", self.whose())))
    }

    pub(super) fn status(&self, name: &str) -> Result<RequestStatus, PortError> {
        let v = self.str(name)?;
        RequestStatus::parse(v)
            .ok_or_else(|| corrupt(format!("{}: {name} is not a status: {v}", self.whose())))
    }

    pub(super) fn request_id(&self) -> Result<RequestId, PortError> {
        RequestId::parse(self.str(attr::REQUEST_ID)?).map_err(corrupt)
    }
}

/// The request's own fields as stored on META, before its candidates are attached.
pub(super) struct Meta {
    pub record: RequestRecord,
    pub candidate_count: usize,
    /// Where the open debit was booked, so its release hits the same ledger item.
    pub open_debit_ledger: Option<(String, BudgetMonth)>,
    /// The keys of its `slots` map: which workload items it has.
    pub slots: Vec<String>,
}

pub(super) fn read_meta(item: &Item) -> Result<Meta, PortError> {
    let r = Read::new(item);
    let lease = match (
        r.opt_str(attr::LEASE_TOKEN)?,
        r.opt_time(attr::LEASE_EXPIRES_AT)?,
    ) {
        (Some(token), Some(expires_at)) => Some(Lease {
            token: token.to_string(),
            expires_at,
        }),
        _ => None,
    };
    let open_debit = r.opt_int(attr::OPEN_DEBIT_MICROS)?.map(MicroUsd);
    let open_debit_ledger = match (
        r.opt_str(attr::OPEN_DEBIT_TEAM)?,
        r.opt_str(attr::OPEN_DEBIT_MONTH)?,
    ) {
        (Some(team), Some(month)) => Some((team.to_string(), BudgetMonth(month.to_string()))),
        _ => None,
    };
    let count = r.opt_int(attr::CANDIDATE_COUNT)?.unwrap_or(0);
    let windows: Vec<WindowRecord> = match r.opt_str(attr::WINDOWS)? {
        Some(_) => r.json(attr::WINDOWS)?,
        None => Vec::new(),
    };
    let record = RequestRecord {
        request_id: r.request_id()?,
        team: Team::parse(r.str(attr::TEAM)?).map_err(corrupt)?,
        request: r.json(attr::REQUEST)?,
        status: r.status(attr::STATUS)?,
        version: u64::try_from(r.int(attr::VERSION)?)
            .map_err(|_| corrupt("version is negative"))?,
        reason: r.opt_str(attr::REASON)?.unwrap_or_default().to_string(),
        next_action_at: if windows.is_empty() {
            r.opt_time(attr::NEXT_ACTION_AT)?
        } else {
            r.opt_time(attr::OWN_NEXT_ACTION_AT)?
        },
        windows,
        lease,
        doubt: match r.opt_str(attr::DOUBT)? {
            Some(_) => Some(r.json(attr::DOUBT)?),
            None => None,
        },
        purchase_call: match r.opt_str(attr::PURCHASE_CALL)? {
            Some(_) => Some(r.json(attr::PURCHASE_CALL)?),
            None => None,
        },
        cancel: match r.opt_str(attr::CANCEL)? {
            Some(_) => Some(r.json(attr::CANCEL)?),
            None => None,
        },
        open_debit,
        run: match r.opt_str(attr::RUN)? {
            Some(_) => Some(r.json(attr::RUN)?),
            None => None,
        },
        search: match r.opt_str(attr::SEARCH)? {
            Some(_) => Some(r.json(attr::SEARCH)?),
            None => None,
        },
        spent: MicroUsd(r.opt_int(attr::SPENT_MICROS)?.unwrap_or(0)),
        candidates: Vec::new(),
        created_at: r.time(attr::CREATED_AT)?,
        updated_at: r.time(attr::UPDATED_AT)?,
    };
    let slots = match item.get(attr::SLOTS) {
        Some(AttributeValue::M(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    };
    Ok(Meta {
        record,
        candidate_count: usize::try_from(count).map_err(|_| corrupt("negative candidate_count"))?,
        open_debit_ledger,
        slots,
    })
}
