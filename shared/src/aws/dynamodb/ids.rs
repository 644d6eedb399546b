//! Request ids compared ignoring case (review N15): which spelling holds an id.
//!
//! | pk                     | sk   | what                                              |
//! |------------------------|------|---------------------------------------------------|
//! | `ID#<id lower-cased>`  | `ID` | `request_id` (as given), `created_at` (when written) |
//!
//! Written in a request's creating transaction, on what was read: absent, or naming a
//! spelling whose request is gone (archived past its TTL), and then only if it still names
//! that spelling and that spelling's META is still gone (a creation of it in between would
//! hold the id again). A tombstone is placed under the same conditions. No TTL: the request
//! it names says whether it holds; an item is a hundred bytes per id ever used. Requests
//! recorded before these items are given theirs by the first cold starts' pass
//! (`claims::claim_live_requests`); until then, and for archived ones never, the exact
//! spelling's META answers as before.

use aws_sdk_dynamodb::types::TransactWriteItem;
use chrono::{DateTime, Utc};

use super::expr::Expr;
use super::item::{Item, META_SK, Read, attr, key, n, request_pk, s, time};
use super::{DynamoStore, condition_check, put};
use crate::domain::request::RequestId;
use crate::ports::PortError;

const ID_SK: &str = "ID";
const KIND: &str = "id";

fn id_key(id: &RequestId) -> Item {
    key(format!("ID#{}", id.folded()), ID_SK)
}

/// The id item naming `id` as given.
fn id_item(id: &RequestId, at: DateTime<Utc>) -> Item {
    let mut item = id_key(id);
    item.insert(attr::KIND.into(), s(KIND));
    item.insert(attr::REQUEST_ID.into(), s(id.as_str()));
    item.insert(attr::CREATED_AT.into(), time(at));
    item
}

/// Who holds an id, ignoring case.
pub(super) enum Holder {
    /// A request of this spelling is recorded (not past its TTL).
    Held(RequestId),
    /// No request holds it: the id has no item, or its item names this spelling, whose
    /// request is gone.
    Free(Option<RequestId>),
}

impl DynamoStore {
    /// The spelling whose request holds `id` ignoring case, by its id item and the META of
    /// the spelling that names. What is written on it is conditional on both staying as read
    /// ([`take`], [`still_free`]): a read this run kept may be stale.
    pub(super) async fn id_holder(&self, id: &RequestId) -> Result<Holder, PortError> {
        let Some(item) = self.get(id_key(id)).await? else {
            return Ok(Holder::Free(None));
        };
        let named = Read::new(&item).request_id()?;
        Ok(match self.read_meta(named.as_str()).await? {
            Some(_) => Holder::Held(named),
            None => Holder::Free(Some(named)),
        })
    }
}

/// The condition that the id item is as found (absent, or naming the spelling `found`),
/// and, when that spelling is not `id`'s own (whose META its caller's write checks), that its
/// request is still gone.
fn kept(
    table: &str,
    id: &RequestId,
    found: Option<&RequestId>,
    now: DateTime<Utc>,
) -> Result<(Expr, Option<TransactWriteItem>), PortError> {
    let mut c = Expr::new();
    let Some(named) = found else {
        let pk = c.name(attr::PK);
        c.condition(format!("attribute_not_exists({pk})"));
        return Ok((c, None));
    };
    let (rid, v) = (c.name(attr::REQUEST_ID), c.value(s(named.as_str())));
    c.condition(format!("{rid} = {v}"));
    if named == id {
        return Ok((c, None));
    }
    let mut gone = Expr::new();
    let (pk, exp) = (gone.name(attr::PK), gone.name(attr::EXPIRES_AT));
    let at = gone.value(n(now.timestamp()));
    gone.condition(format!("attribute_not_exists({pk}) OR {exp} <= {at}"));
    let check = condition_check(table, key(request_pk(named.as_str()), META_SK), &gone)?;
    Ok((c, Some(check)))
}

/// The writes by which a creation of `id` takes its id item, as `holder` found it: free, or
/// held by `id`'s own spelling (the creation's META condition then answers). Returns the
/// item's write first.
pub(super) fn take(
    table: &str,
    id: &RequestId,
    holder: Holder,
    now: DateTime<Utc>,
    at: DateTime<Utc>,
) -> Result<Vec<TransactWriteItem>, PortError> {
    let found = match holder {
        Holder::Free(found) => found,
        Holder::Held(named) => Some(named),
    };
    let (c, check) = kept(table, id, found.as_ref(), now)?;
    Ok(std::iter::once(put(table, id_item(id, at), Some(c))?)
        .chain(check)
        .collect())
}

/// The checks that no request holds `id` ignoring case, as found (`Holder::Free`).
pub(super) fn still_free(
    table: &str,
    id: &RequestId,
    found: Option<&RequestId>,
    now: DateTime<Utc>,
) -> Result<Vec<TransactWriteItem>, PortError> {
    let (c, check) = kept(table, id, found, now)?;
    Ok(std::iter::once(condition_check(table, id_key(id), &c)?)
        .chain(check)
        .collect())
}

impl DynamoStore {
    /// Gives a request recorded before id items were its item, unless the id has one (another
    /// spelling's, say, recorded before too: it keeps it, and each request answers by its own
    /// META as before). The upgrade pass's write; true when written.
    pub(super) async fn backfill_id(
        &self,
        id: &RequestId,
        created_at: DateTime<Utc>,
    ) -> Result<bool, PortError> {
        self.put_if(id_item(id, created_at), attr::PK, None).await
    }
}
