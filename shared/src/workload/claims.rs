//! Workload names held by one request at a time (ARCHITECTURE §9.8). An inference endpoint
//! and a HyperPod instance group are named by the request, and AWS holds one of a name per
//! region: two live requests naming one would both buy, and the second could never launch
//! (review money-paths-3 N4). So a request claims its names when it is recorded:
//! `CLAIM#<region>#<kind>#<name>` lists the claimants, each with the interval it asked for,
//! and the creating transaction writes it on the version read, so of two submissions that
//! read one claim only one commits.
//!
//! A claimant is read lazily, by its record, when another request meets it:
//! - live: it holds the name over its whole `[earliest_start, latest_end]`, since until it ends
//!   it may buy (again: a payment that failed, a split's lost segment) anywhere in it; so does
//!   one ended with a purchase in doubt, whose reconciliation may yet record a window;
//! - ended: it holds the name only over its bought windows in the claim's region that have not
//!   ended (a paid window outlives its request, §9.1); with none, it has left;
//! - archived, or its id now names another request: it has left.
//!
//! A claimant that has left is dropped by the next write of the claim. A request whose
//! interval overlaps what another still holds is rejected, naming the field and the other
//! request.
//!
//! A HyperPod group is left on its cluster, scaled to zero, when its request ends. A later
//! request naming it may take it over when our table says one of its requests created it and
//! has left ([`left_by_its_maker`]); the claim keeps that request (`made_by`) when it drops it.

use chrono::{DateTime, Utc};

use crate::domain::request::{CapacityRequest, FieldError, RequestId, WorkloadDetail};
use crate::ports::{ClaimKey, ClaimWrite, Claimant, PortError, RequestRecord, Store};

/// An inference endpoint's name.
pub const ENDPOINT: &str = "endpoint";
/// A HyperPod instance group, named `<cluster>/<group>`.
pub const HYPERPOD_GROUP: &str = "hyperpod-group";

/// The names `req` claims, one per region it may run in, each with the field that names it.
pub fn keys(req: &CapacityRequest) -> Vec<(ClaimKey, &'static str)> {
    let (kind, name, field) = match &req.workload {
        WorkloadDetail::InferenceEndpoint { endpoint_name, .. } => {
            (ENDPOINT, endpoint_name.clone(), "workload.endpoint_name")
        }
        WorkloadDetail::HyperpodCluster {
            cluster_name,
            instance_group_name,
            ..
        } => (
            HYPERPOD_GROUP,
            format!("{cluster_name}/{instance_group_name}"),
            "workload.instance_group_name",
        ),
        WorkloadDetail::Ec2Instances { .. } | WorkloadDetail::TrainingJob(_) => return vec![],
    };
    req.regions
        .iter()
        .map(|region| (ClaimKey::new(region, kind, &name), field))
        .collect()
}

/// The claimant a request writes: the interval it asked for.
pub fn claimant(req: &CapacityRequest) -> Claimant {
    Claimant {
        request_id: req.id.clone(),
        from: req.window.earliest_start,
        to: req.window.latest_end,
    }
}

/// Where another request still holds a name.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub record: RequestRecord,
}

/// Over what `c` still holds `key`, read from its record: `None` when it has left.
pub async fn held<S: Store>(
    store: &S,
    key: &ClaimKey,
    c: &Claimant,
    now: DateTime<Utc>,
) -> Result<Option<Held>, PortError> {
    let Some(record) = store.get_request(&c.request_id).await? else {
        return Ok(None);
    };
    // An id used again after its archive names another request, which may not claim this.
    if !keys(&record.request).iter().any(|(k, _)| k == key) {
        return Ok(None);
    }
    // Live, or ended with a purchase in doubt: reconciliation may yet find what it bought,
    // anywhere in its interval, and record it as a window.
    if !record.status.is_terminal() || record.in_doubt() {
        return Ok(Some(Held {
            from: c.from,
            to: c.to,
            record,
        }));
    }
    if record.windows.iter().all(|w| w.next_action_at.is_none()) {
        return Ok(None);
    }
    let mut span: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
    for r in store.reservations(&c.request_id).await? {
        if r.region != key.region || r.state.is_final() {
            continue;
        }
        for s in r.segments.iter().filter(|s| s.end > now) {
            span = Some(match span {
                None => (s.start, s.end),
                Some((a, b)) => (a.min(s.start), b.max(s.end)),
            });
        }
    }
    Ok(span.map(|(from, to)| Held { from, to, record }))
}

/// What a submission's claims come to.
#[derive(Debug, Clone, PartialEq)]
pub enum Claiming {
    /// Write these with the request.
    Writes(Vec<ClaimWrite>),
    /// Another request holds a name over part of this one's interval.
    Refused(FieldError),
}

/// Reads each name `req` claims and decides: the claims to write with it (those that have
/// left dropped, itself added), or the refusal naming the field and the request in the way.
pub async fn prepare<S: Store>(
    store: &S,
    req: &CapacityRequest,
    now: DateTime<Utc>,
) -> Result<Claiming, PortError> {
    let mine = claimant(req);
    let mut writes = Vec::new();
    for (key, field) in keys(req) {
        let (read, before, mut made_by) = match store.claim(&key).await? {
            Some(c) => (Some(c.version), c.claimants, c.made_by),
            None => (None, Vec::new(), None),
        };
        let mut claimants = Vec::new();
        for c in before {
            // Its own, written by an earlier try: written again below.
            if c.request_id == req.id {
                continue;
            }
            let Some(h) = held(store, &key, &c, now).await? else {
                // It has left: dropped, remembered as the group's maker if it made one.
                if made(store, &key, &c.request_id).await? {
                    made_by = Some(c.request_id);
                }
                continue;
            };
            if h.from < mine.to && mine.from < h.to {
                return Ok(Claiming::Refused(refusal(&key, field, &c, &h)));
            }
            claimants.push(c);
        }
        claimants.push(mine.clone());
        writes.push(ClaimWrite {
            key,
            read,
            claimants,
            made_by,
        });
    }
    Ok(Claiming::Writes(writes))
}

/// Whether request `id`'s records show it created (or took over) the HyperPod group `key`
/// names. Endpoints are told apart by their tags, not by this.
async fn made<S: Store>(store: &S, key: &ClaimKey, id: &RequestId) -> Result<bool, PortError> {
    if key.kind != HYPERPOD_GROUP {
        return Ok(false);
    }
    Ok(store
        .workloads(id)
        .await?
        .iter()
        .any(|w| w.resource_id.to_lowercase() == key.name))
}

/// The request of this table that created the HyperPod group `key` names and has left its
/// claim, so that `me` may take the group over (ARCHITECTURE §9.8): a group carries no tags,
/// and only our table can say it is ours. `None` when no such request is known.
pub async fn left_by_its_maker<S: Store>(
    store: &S,
    key: &ClaimKey,
    me: &RequestId,
    now: DateTime<Utc>,
) -> Result<Option<RequestId>, PortError> {
    let Some(claim) = store.claim(key).await? else {
        return Ok(None);
    };
    for c in claim.claimants.iter().filter(|c| &c.request_id != me) {
        if held(store, key, c, now).await?.is_none() && made(store, key, &c.request_id).await? {
            return Ok(Some(c.request_id.clone()));
        }
    }
    Ok(claim.made_by.filter(|m| m != me))
}

fn refusal(key: &ClaimKey, field: &str, other: &Claimant, h: &Held) -> FieldError {
    let what = match key.kind.as_str() {
        ENDPOINT => format!("endpoint {}", key.name),
        _ => format!("HyperPod instance group {}", key.name),
    };
    let (status, reason) = (h.record.status, &h.record.reason);
    let holds = if status.is_terminal() {
        "its paid windows there, which have not ended"
    } else {
        "the interval it asked for, until it ends"
    };
    FieldError {
        field: field.to_string(),
        message: format!(
            "{what} in {} is claimed by request {} ({status}: {reason}) from {} until {}: \
             {holds}; one name serves one request at a time, so choose another name, ask for \
             a window outside that interval, or cancel {}",
            key.region,
            other.request_id,
            h.from.to_rfc3339(),
            h.to.to_rfc3339(),
            other.request_id
        ),
    }
}
