//! The deployment id the table is pinned to (ARCHITECTURE §9.8): `DEPLOYMENT#ID`, written at
//! the first cold start. A deployment's id tags everything it buys and launches, and its
//! sweeps and reconciliation find what is theirs by that tag: an id that changes under a
//! table orphans what the table's requests bought (nothing finds, drains or sweeps it) and
//! lets two deployments that share an id sweep each other's.
//!
//! | pk              | sk              | what                               |
//! |-----------------|-----------------|------------------------------------|
//! | `DEPLOYMENT#ID` | `DEPLOYMENT#ID` | `deployment_id`, `pinned_at`       |
//!
//! Old tables: one written before pinning has no `DEPLOYMENT#ID`. If anything of it is live
//! (an item in the work index: a live request, a paid window, a run, an unsent event, a
//! planted detector; not the PAUSE item), it is pinned to the id the template gave before (`unpinned`: the
//! `DeploymentId` parameter, or the stack name when it was empty), so an upgrade that
//! changes the default is refused rather than obeyed. One whose requests have all ended
//! (nothing they bought or launched is live) is pinned to the configured id, as a new one.

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};

use super::DynamoStore;
use super::error::{Call, corrupt, sdk_error};
use super::item::{Item, WORK_INDEX, WORK_PARTITION, attr, key, s, time};
use crate::ports::PortError;

const DEPLOYMENT_KEY: &str = "DEPLOYMENT#ID";
const DEPLOYMENT_ID: &str = "deployment_id";
const PINNED_AT: &str = "pinned_at";

fn deployment_key() -> Item {
    key(DEPLOYMENT_KEY.into(), DEPLOYMENT_KEY)
}

/// What a cold start found against `DEPLOYMENT#ID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinned {
    /// The table's id is the configured one (pinned now, or before).
    Same,
    /// The table belongs to another id: this deployment must not serve it.
    Changed { pinned: String, configured: String },
}

impl DynamoStore {
    /// Reads `DEPLOYMENT#ID`, pinning it first when it is absent: to `unpinned` when the table
    /// is in use (written before pinning, under the id the template gave then), else to
    /// `configured`. Two cold starts at once: the conditional put lets one pin and
    /// the other reads what it pinned.
    pub async fn pin_deployment(
        &self,
        configured: &str,
        unpinned: &str,
        now: DateTime<Utc>,
    ) -> Result<Pinned, PortError> {
        let pinned = match self.pinned_deployment().await? {
            Some(id) => id,
            None => {
                let id = if self.in_use().await? {
                    unpinned
                } else {
                    configured
                };
                let mut item = deployment_key();
                item.insert(DEPLOYMENT_ID.into(), s(id));
                item.insert(PINNED_AT.into(), time(now));
                if self.put_if(item, attr::PK, None).await? {
                    id.to_string()
                } else {
                    self.pinned_deployment().await?.ok_or_else(|| {
                        corrupt(format!(
                            "{DEPLOYMENT_KEY} refused a first write but cannot be read"
                        ))
                    })?
                }
            }
        };
        Ok(if pinned == configured {
            Pinned::Same
        } else {
            Pinned::Changed {
                pinned,
                configured: configured.to_string(),
            }
        })
    }

    /// The id `DEPLOYMENT#ID` holds, by a consistent read past this run's cache.
    async fn pinned_deployment(&self) -> Result<Option<String>, PortError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(deployment_key()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("GetItem", e, Call::Read))?;
        match out.item.as_ref().and_then(|i| i.get(DEPLOYMENT_ID)) {
            None if out.item.is_none() => Ok(None),
            Some(AttributeValue::S(id)) => Ok(Some(id.clone())),
            _ => Err(corrupt(format!(
                "{DEPLOYMENT_KEY} has no string {DEPLOYMENT_ID}"
            ))),
        }
    }

    /// Whether the table is in use: anything in the work index, where every live request
    /// sits (a search or purchase under way, a paid window until it ends, a run, an unsent
    /// event) and every planted detector. One Query of one key.
    async fn in_use(&self) -> Result<bool, PortError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(WORK_INDEX)
            .key_condition_expression("#p = :p")
            .expression_attribute_names("#p", attr::GSI_PART)
            .expression_attribute_values(":p", s(WORK_PARTITION))
            // The PAUSE item (ARCHITECTURE §9.7), first in the index when it exists, says
            // nothing of what the table's requests bought: a table paused before its first
            // cold start is new.
            .limit(2)
            .send()
            .await
            .map_err(|e| sdk_error("Query", e, Call::Read))?;
        Ok(out
            .items()
            .iter()
            .any(|i| i.get(attr::PK) != Some(&s(super::pause::PAUSE_KEY))))
    }
}
