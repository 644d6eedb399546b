//! Purchases paused by an operator (ARCHITECTURE §9.7): one item, written by
//! `capacity-pilot pause` and deleted by `resume`.
//!
//! | pk      | sk      | what                                                  |
//! |---------|---------|-------------------------------------------------------|
//! | `PAUSE` | `PAUSE` | `by`, `reason`, `created_at`; the same as JSON `event` |
//!
//! It sits in the `work` index at `gsi_due = 0`, before every request, so a tick's one read
//! returns it (the index projects `event`, which holds it whole). A new purchase's lease
//! ([`pause_absent`] in `begin_purchase`) and an on-demand or spot hold (in `transition`) each
//! carry a ConditionCheck that it is absent: a pause that commits before them stops them,
//! whatever the run read before. Nothing else reads it. The operators' policy may put and
//! delete this key only (`dynamodb:LeadingKeys`).

use aws_sdk_dynamodb::types::{ReturnValue, TransactWriteItem};

use super::DynamoStore;
use super::error::{Call, sdk_error};
use super::expr::Expr;
use super::item::{Item, Read, WORK_PARTITION, attr, json, key, kind, n, s, time};
use super::seen::Write;
use crate::ports::{Pause, PortError};

pub(super) const PAUSE_KEY: &str = "PAUSE";

pub(super) fn pause_key() -> Item {
    key(PAUSE_KEY.into(), PAUSE_KEY)
}

/// The ConditionCheck every new lease and hold carries: no PAUSE item.
pub(super) fn pause_absent(table: &str) -> Result<TransactWriteItem, PortError> {
    let mut e = Expr::new();
    let pk = e.name(attr::PK);
    e.condition(format!("attribute_not_exists({pk})"));
    super::condition_check(table, pause_key(), &e)
}

/// The pause an item of the `work` index (or the table) holds.
pub(super) fn read(item: &Item) -> Result<Pause, PortError> {
    Read::new(item).json(attr::EVENT)
}

impl DynamoStore {
    /// The PAUSE item by a consistent Query of its key (the requesters' policy grants Query,
    /// not GetItem).
    pub(super) async fn pause_item(&self) -> Result<Option<Pause>, PortError> {
        let mut e = Expr::new();
        let (pk, v) = (e.name(attr::PK), e.value(s(PAUSE_KEY)));
        let items = self.query(None, e, format!("{pk} = {v}")).await?;
        items.first().map(read).transpose()
    }

    pub(super) async fn write_pause(&self, p: Pause) -> Result<Result<(), Pause>, PortError> {
        let mut item = pause_key();
        item.insert(attr::KIND.into(), s(kind::PAUSE));
        item.insert("by".into(), s(p.by.clone()));
        item.insert(attr::REASON.into(), s(p.reason.clone()));
        item.insert(attr::CREATED_AT.into(), time(p.since));
        item.insert(attr::EVENT.into(), json("pause", &p)?);
        // Before every request and outbox item: a tick's read returns it first.
        item.insert(attr::GSI_PART.into(), s(WORK_PARTITION));
        item.insert(attr::GSI_DUE.into(), n(0));
        if self.put_if(item, attr::PK, None).await? {
            return Ok(Ok(()));
        }
        match self.pause_item().await? {
            Some(standing) => Ok(Err(standing)),
            // Resumed between the two calls: try once more.
            None => Box::pin(self.write_pause(p)).await,
        }
    }

    pub(super) async fn remove_pause(&self) -> Result<Option<Pause>, PortError> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(pause_key()))
            .return_values(ReturnValue::AllOld)
            .send()
            .await;
        self.wrote_one(
            Write::Delete((PAUSE_KEY.to_string(), PAUSE_KEY.to_string())),
            result.is_ok(),
        );
        let out = result.map_err(|e| sdk_error("DeleteItem", e, Call::Write))?;
        out.attributes.as_ref().map(read).transpose()
    }
}
