//! Workload names and who claims them (ARCHITECTURE §9.8, [`crate::workload::claims`]).
//!
//! | pk                                  | sk      | what                              |
//! |-------------------------------------|---------|-----------------------------------|
//! | `CLAIM#<region>#<kind>#<name>`      | `CLAIM` | `version`, `claimants` (JSON), `made_by` |
//!
//! Written with a request (in its creating transaction) or alone, each time conditional on
//! the version read (absent: `attribute_not_exists`). No TTL: a claimant that has left is
//! dropped by the claim's next write; an item is a few hundred bytes per name ever used.

use aws_sdk_dynamodb::types::TransactWriteItem;

use super::expr::Expr;
use super::item::{Item, Read, WORK_INDEX, WORK_PARTITION, attr, json, key, n, s, time};
use super::{DynamoStore, put};
use crate::ports::{Claim, ClaimKey, ClaimWrite, PortError};
use crate::workload::claims;

const CLAIM_SK: &str = "CLAIM";
const CLAIMANTS: &str = "claimants";
const MADE_BY: &str = "made_by";
const KIND: &str = "claim";

fn claim_key(k: &ClaimKey) -> Item {
    key(format!("CLAIM#{k}"), CLAIM_SK)
}

fn item(w: &ClaimWrite, at: chrono::DateTime<chrono::Utc>) -> Result<Item, PortError> {
    let mut item = claim_key(&w.key);
    item.insert(attr::KIND.into(), s(KIND));
    item.insert(attr::VERSION.into(), n(w.read.map_or(1, |v| v + 1)));
    item.insert(CLAIMANTS.into(), json(CLAIMANTS, &w.claimants)?);
    if let Some(m) = &w.made_by {
        item.insert(MADE_BY.into(), s(m.as_str()));
    }
    item.insert(attr::UPDATED_AT.into(), time(at));
    Ok(item)
}

/// The condition of a claim's write: still at the version read.
fn at_read(w: &ClaimWrite) -> Expr {
    let mut c = Expr::new();
    match w.read {
        None => {
            let pk = c.name(attr::PK);
            c.condition(format!("attribute_not_exists({pk})"));
        }
        Some(v) => {
            let (name, value) = (c.name(attr::VERSION), c.value(n(v)));
            c.condition(format!("{name} = {value}"));
        }
    }
    c
}

/// A claim's write inside a transaction.
pub(super) fn claim_put(
    table: &str,
    w: &ClaimWrite,
    at: chrono::DateTime<chrono::Utc>,
) -> Result<TransactWriteItem, PortError> {
    put(table, item(w, at)?, Some(at_read(w)))
}

impl DynamoStore {
    pub(super) async fn read_claim(&self, k: &ClaimKey) -> Result<Option<Claim>, PortError> {
        let Some(item) = self.get(claim_key(k)).await? else {
            return Ok(None);
        };
        let r = Read::new(&item);
        Ok(Some(Claim {
            version: r.int(attr::VERSION)? as u64,
            claimants: r.json(CLAIMANTS)?,
            made_by: r
                .opt_str(MADE_BY)?
                .map(crate::domain::request::RequestId::parse)
                .transpose()
                .map_err(super::error::corrupt)?,
        }))
    }

    pub(super) async fn put_claim(&self, w: ClaimWrite) -> Result<bool, PortError> {
        let (attr, expected) = match w.read {
            Some(v) => (attr::VERSION, Some(n(v))),
            None => (attr::PK, None),
        };
        self.put_if(item(&w, self.now())?, attr, expected).await
    }
}

/// Marks the first pass that claimed the names, and gave the id items ([`super::ids`]), of
/// requests recorded before claims or id items were. (`CLAIM#UPGRADED` marked a pass of
/// claims alone: a table it marked passes again, claiming nothing twice, for the ids.)
const UPGRADED_KEY: &str = "CLAIM#UPGRADED#ids";
/// How long after the first pass cold starts pass again: a deployment updates its functions
/// one by one, and an old search-offerings invocation in flight may record a request without
/// claims after a new function's first pass; the passes of the next hour's cold starts claim
/// it (a claimant listed already is skipped).
const UPGRADE_REPEATED: chrono::TimeDelta = chrono::TimeDelta::hours(1);

impl DynamoStore {
    /// ARCHITECTURE §9.8's upgrade: a table written before claims holds live requests that
    /// claim nothing, so a new request could take their names. At each cold start (before any
    /// submission is served) until an hour after the first ([`UPGRADE_REPEATED`]), every
    /// request in the `work` index that is live or holds a window not ended is added to the
    /// claims of its names, beside whatever it overlaps; the claims' readers then narrow it
    /// by its state. Concurrent cold starts add each claimant once (each write is
    /// conditional on the version read, and a claimant listed already is not added again).
    /// Each request in the index is also given its id item if the id has none (review N15),
    /// so another spelling of it is refused. Returns how many claimants it added.
    pub async fn claim_live_requests(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<usize, PortError> {
        let marker = key(UPGRADED_KEY.into(), CLAIM_SK);
        if let Some(done) = self.get(marker.clone()).await?
            && now >= Read::new(&done).time(attr::UPDATED_AT)? + UPGRADE_REPEATED
        {
            return Ok(0);
        }
        let mut e = Expr::new();
        let (part, work) = (e.name(attr::GSI_PART), e.value(s(WORK_PARTITION)));
        let items = self
            .query(Some(WORK_INDEX), e, format!("{part} = {work}"))
            .await?;
        let listed: std::collections::BTreeSet<String> = items
            .iter()
            .filter_map(|i| match i.get(attr::PK) {
                Some(aws_sdk_dynamodb::types::AttributeValue::S(pk)) => {
                    pk.strip_prefix("REQ#").map(str::to_string)
                }
                _ => None,
            })
            .collect();
        let (mut added, mut ids) = (0, 0);
        for id in listed {
            let Ok(id) = crate::domain::request::RequestId::parse(&id) else {
                continue;
            };
            // (An ended request is in the index also for an unsent event: it holds a name only
            // by a window not ended.)
            let Some(rec) = crate::ports::Store::get_request(self, &id).await? else {
                continue;
            };
            if self.backfill_id(&id, rec.created_at).await? {
                ids += 1;
            }
            if rec.status.is_terminal() && rec.windows.iter().all(|w| w.next_action_at.is_none()) {
                continue;
            }
            let mine = claims::claimant(&rec.request);
            for (k, _) in claims::keys(&rec.request) {
                loop {
                    let (read, mut claimants, made_by) = match self.read_claim(&k).await? {
                        Some(c) => (Some(c.version), c.claimants, c.made_by),
                        None => (None, Vec::new(), None),
                    };
                    if claimants.iter().any(|c| c.request_id == mine.request_id) {
                        break;
                    }
                    claimants.push(mine.clone());
                    let w = ClaimWrite {
                        key: k.clone(),
                        read,
                        claimants,
                        made_by,
                    };
                    if self.put_claim(w).await? {
                        added += 1;
                        break;
                    }
                }
            }
        }
        let mut done = marker;
        done.insert(attr::KIND.into(), s(KIND));
        done.insert(attr::UPDATED_AT.into(), time(now));
        // Another cold start may have finished first: the first pass's time stands.
        self.put_if(done, attr::PK, None).await?;
        tracing::info!(
            added,
            ids,
            "claimed the workload names, and the ids ignoring case, of requests recorded before \
             claims and id items"
        );
        Ok(added)
    }
}
