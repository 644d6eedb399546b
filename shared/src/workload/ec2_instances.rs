//! EC2 instances from the request's launch template: the one kind we launch slot by slot,
//! can start partly, watch for health and replace, and so the one whose every instance must
//! carry our tags before anything here touches it.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::info;

use super::refusal::{self, Placement, Scope};
use super::{DrainTarget, Launch, Launching, Target, rejection, settle};
use crate::domain::naming::{DRAIN_AT_TAG, client_token, drain_at_value, owns, resource_tags};
use crate::domain::offering::{Offering, Product};
use crate::domain::planner::Rejection;
use crate::domain::request::{LaunchTemplateRef, RequestId, WorkloadDetail};
use crate::domain::reservation::Reservation;
use crate::domain::time_rules::LAUNCH_RESERVE;
use crate::ports::{
    InstanceFilter, InstanceInfo, LaunchMarket, LaunchSpec, PortError, Ran, RequestRecord, Store,
    WorkloadRecord, Workloads,
};

/// Capacity Blocks live in one zone: a block where none of the request's subnets is could
/// be bought but never launched into. Other products are not tied to a zone.
pub(super) async fn usable<W: Workloads>(
    workloads: &W,
    subnet_ids: &[String],
    offerings: &[Offering],
) -> Result<(Vec<Offering>, Vec<Rejection>), PortError> {
    let mut usable = Vec::new();
    let mut unusable = Vec::new();
    // Offerings share zones: ask EC2 once per (region, zone).
    let mut zones: BTreeMap<(String, String), bool> = BTreeMap::new();
    for o in offerings {
        let mut missing = None;
        if o.product == Product::CapacityBlock {
            for zone in o
                .segments
                .iter()
                .filter_map(|s| s.availability_zone.as_ref())
            {
                let key = (o.region.clone(), zone.clone());
                let has = match zones.get(&key) {
                    Some(has) => *has,
                    None => {
                        let has = workloads
                            .subnet_in_zone(&o.region, subnet_ids, zone)
                            .await?
                            .is_some();
                        zones.insert(key, has);
                        has
                    }
                };
                if !has {
                    missing = Some(format!(
                        "none of the request's subnets ({}) is in {zone}, where this block is",
                        subnet_ids.join(", ")
                    ));
                    break;
                }
            }
        }
        match missing {
            None => usable.push(o.clone()),
            Some(reason) => unusable.push(rejection(o, reason)),
        }
    }
    Ok((usable, unusable))
}

/// Where on-demand or spot EC2 instances may launch, in the order tried: each of `regions` in
/// turn, and in each every one of the request's subnets there (a subnet refusal leaves the
/// zone's others, a zone refusal the other zones: `refusal`).
pub(super) async fn placements<W: Workloads>(
    workloads: &W,
    regions: &[String],
    subnet_ids: &[String],
) -> Result<Vec<Placement>, PortError> {
    let mut out = Vec::new();
    for region in regions {
        let found = workloads.subnet_zones(region, subnet_ids).await?;
        out.extend(found.into_iter().map(|subnet| Placement {
            region: region.clone(),
            subnet: Some(subnet),
        }));
    }
    Ok(out)
}

/// Why there is nowhere to launch on demand: no subnet of the request is in its regions.
pub(super) fn no_placement(regions: &[String], subnet_ids: &[String]) -> String {
    format!(
        "on-demand-first: none of the request's subnets ({}) is in its regions ({})",
        subnet_ids.join(", "),
        regions.join(", ")
    )
}

pub(super) async fn launch<W: Workloads, S: Store>(
    l: &Launching<'_, W, S>,
    launch_template: Option<&LaunchTemplateRef>,
    subnet_ids: &[String],
) -> Result<Launch, PortError> {
    let (t, id) = (l.target, &l.rec.request_id);
    let Some(template) = launch_template else {
        return Ok(Launch::Refuse(
            "the request names no launch template".into(),
        ));
    };
    // Where the slots launch, in the order tried. A block lives in one zone: every request
    // subnet there is tried, since a subnet without free addresses
    // (`InsufficientFreeAddressesInSubnet`; an EFA template takes one per interface per
    // instance) says nothing about the zone's next one, and the paid block must not be left
    // idle for it (review Task 3 #2). On demand and spot, the target's one subnet: the
    // launcher tries the request's other placements.
    let subnets: Vec<String> = match &t.availability_zone {
        Some(zone) => {
            let here: Vec<String> = l
                .workloads
                .subnet_zones(&t.region, subnet_ids)
                .await?
                .into_iter()
                .filter(|(_, z)| z == zone)
                .map(|(s, _)| s)
                .collect();
            if here.is_empty() {
                return Ok(Launch::Refuse(format!(
                    "none of the request's subnets ({}) is in {zone}, the zone of {}",
                    subnet_ids.join(", "),
                    t.reservation_id
                )));
            }
            here
        }
        None => match t.subnet_id.as_ref().or(subnet_ids.first()) {
            Some(s) => vec![s.clone()],
            None => return Ok(Launch::Refuse("the request names no subnet".into())),
        },
    };
    // Subnets that answered full in this invocation: later slots do not ask them again.
    let mut full: Vec<(String, String, String)> = Vec::new();
    let mut ids = Vec::new();
    // The slowest RunInstances of this invocation, measured on the deadline itself.
    let mut slowest = Duration::ZERO;
    // One RunInstances per slot, so each slot has its own client token and a retry after a
    // partial failure finds exactly the instances already started.
    // On demand and on spot, a slot's token names its placement, so a launch whose outcome
    // went unrecorded (a crash after RunInstances, a lost answer) is recorded as an intent
    // first: a retry that starts at another placement would otherwise launch the slot anew
    // and leave that instance running, unrecorded and unbilled (found by the simulation,
    // seed 277). A block's token is the same in every run in its zone's first subnet; in
    // another it names that subnet (EC2 answers a token used with other parameters
    // `IdempotentParameterMismatch`), and the intent is recorded, so a retry asks that
    // subnet first and finds the instance a lost answer started there.
    let off_block = !matches!(t.market, LaunchMarket::CapacityBlock { .. });
    let intents = off_block || subnets.len() > 1;
    for slot in 0..t.instance_count {
        let mut generation = 0;
        // What the slot's earlier instances ran (taken back in this hold): the relaunch's
        // record keeps it, so the run is settled for them too.
        let mut earlier = Vec::new();
        // The subnet a block slot's unanswered call went to: asked first.
        let mut first = None;
        if let Some(w) = l.recorded.get(&slot).filter(|w| l.stale(w)) {
            // Launched before an extension's paid end reopened the drained window (its
            // instance was terminated by the drain): launched again at the next generation,
            // a client token of its own. A crash before the new instance is recorded leaves
            // this record, so the retry makes the same call and EC2 answers that instance.
            earlier = w.closed(None, l.now).ran;
            generation = w.generation + 1;
        } else if let Some(w) = l.recorded.get(&slot) {
            let mut w = w.clone();
            if off_block && w.state == LAUNCHING {
                let now = spec(l, template, &subnets, 0, slot, w.generation);
                if intent(&now) != w.resource_id {
                    w = settle_intent(l, template, &w).await?;
                }
            }
            if off_block && w.state == TERMINATING {
                w = finish_take_back(l, &w).await?;
            }
            if !off_block && w.state == LAUNCHING {
                first = intended_subnet(&w.resource_id)
                    .and_then(|s| subnets.iter().position(|x| x == s));
            }
            // An on-demand or spot slot undone after a refusal elsewhere is launched anew, at
            // the next generation (a new client token: the old one answers the terminated
            // instance); one whose launch was refused, at its own; one whose launch here went
            // unanswered, with the same call. A block's dead slot is replace-unhealthy's.
            earlier = w.closed(None, l.now).ran;
            generation = match w.state.as_str() {
                LAUNCHING => w.generation,
                TERMINATED if off_block => w.generation + 1,
                UNLAUNCHED if off_block => w.generation,
                _ => {
                    ids.push(w.resource_id.clone());
                    continue;
                }
            };
        }
        let start = first.unwrap_or(0);
        let order: Vec<usize> = (0..subnets.len())
            .map(|n| (start + n) % subnets.len())
            .filter(|n| !full.iter().any(|(s, ..)| *s == subnets[*n]))
            .collect();
        let mut launched = None;
        for (attempt, n) in order.iter().copied().enumerate() {
            let subnet = &subnets[n];
            let left = l.deadline.remaining();
            if left < LAUNCH_RESERVE + slowest * 2 {
                // Each launched slot is recorded already: the next tick starts at this one.
                return Ok(Launch::Starting(format!(
                    "{} of {} instances of {} are launched; {} ms of this invocation are left, \
                     too few for another RunInstances (the slowest took {} ms) and the record of it, \
                     so the rest are launched on the next tick",
                    ids.len(),
                    t.instance_count,
                    t.reservation_id,
                    left.as_millis(),
                    slowest.as_millis()
                )));
            }
            let spec = spec(l, template, &subnets, n, slot, generation);
            if intents {
                let mut record = l.record(slot, intent(&spec), LAUNCHING);
                record.generation = generation;
                record.ran.clone_from(&earlier);
                l.store.put_workload(record).await?;
            }
            let answer = l.workloads.launch_instances(&spec).await;
            slowest = slowest.max(left.saturating_sub(l.deadline.remaining()));
            match answer {
                Ok(started) => {
                    launched = Some((subnet.clone(), started));
                    break;
                }
                // This subnet is full: the zone's next one may have room.
                Err(PortError::NoCapacity { code, message })
                    if refusal::of(&code).scope == Scope::Subnet && attempt + 1 < order.len() =>
                {
                    info!(request_id = %id, reservation_id = %t.reservation_id, slot,
                        subnet_id = %subnet, code, "the subnet is full; trying the zone's next");
                    full.push((subnet.clone(), code, message));
                }
                Err(e) => {
                    let mut tried: Vec<&str> = full.iter().map(|(s, ..)| s.as_str()).collect();
                    tried.push(subnet);
                    let settled = settle(
                        e,
                        &format!("slot {slot} of {} ({})", t.reservation_id, tried.join(", ")),
                    )?;
                    if off_block {
                        // Refused: nothing started (a transient error leaves the intent).
                        let mut record = l.record(slot, intent(&spec), UNLAUNCHED);
                        record.generation = generation;
                        record.ran = earlier;
                        l.store.put_workload(record).await?;
                    }
                    return Ok(settled);
                }
            }
        }
        let Some((subnet, started)) = launched else {
            // Every subnet answered full earlier in this invocation: wait for addresses to
            // free up, as for capacity (never fail the paid block for it).
            let (_, code, message) = full.last().cloned().unwrap_or_default();
            let tried: Vec<&str> = full.iter().map(|(s, ..)| s.as_str()).collect();
            return settle(
                PortError::NoCapacity { code, message },
                &format!("slot {slot} of {} ({})", t.reservation_id, tried.join(", ")),
            );
        };
        let Some(instance) = started.into_iter().next() else {
            return Err(PortError::Transient {
                service: "ec2",
                code: "EmptyReservation".into(),
                message: format!("RunInstances for slot {slot} returned no instance"),
            });
        };
        info!(
            request_id = %id,
            reservation_id = %t.reservation_id,
            instance_id = %instance.instance_id,
            slot,
            subnet_id = %subnet,
            "launched an instance for an opened window"
        );
        let mut record = l.record(slot, instance.instance_id.clone(), instance.state.as_str());
        record.generation = generation;
        // EC2's launch time: a retry's same call answers the instance the first one started.
        record.started_at = Some(instance.launched_at.unwrap_or(l.now));
        record.ran = earlier;
        l.store.put_workload(record).await?;
        ids.push(instance.instance_id);
    }
    Ok(Launch::Done(ids))
}

/// A slot's record while its RunInstances is under way: `resource_id` is the call's intent.
pub const LAUNCHING: &str = "launching";
/// A slot whose launch was refused (nothing started); launched again at its generation.
pub const UNLAUNCHED: &str = "unlaunched";
/// A slot whose instance was taken back.
pub const TERMINATED: &str = "terminated";
/// A slot whose instance is being taken back (recorded before TerminateInstances).
pub const TERMINATING: &str = "terminating";

/// A take-back a run began and did not record done (it died, or lost TerminateInstances'
/// answer): its instance is terminated now, in the target's region or, for an instance of
/// an earlier placement, another allowed one (terminating an id a region does not know
/// succeeds there), and the slot recorded terminated (found by the simulation, seed 545:
/// the retry counted the dead instance as launched and ran the run short, charged in full).
async fn finish_take_back<W: Workloads, S: Store>(
    l: &Launching<'_, W, S>,
    w: &WorkloadRecord,
) -> Result<WorkloadRecord, PortError> {
    let t = l.target;
    let regions = std::iter::once(&t.region)
        .chain(l.config.allowed_regions.iter().filter(|r| **r != t.region));
    for region in regions {
        l.workloads
            .terminate_instances(region, std::slice::from_ref(&w.resource_id))
            .await?;
    }
    let after = WorkloadRecord {
        state: TERMINATED.into(),
        updated_at: l.now,
        ..w.closed(None, l.now)
    };
    l.store.put_workload(after.clone()).await?;
    Ok(after)
}

/// The RunInstances of `slot` at `generation` in the target's placement, in `subnets[n]`.
/// The first subnet keeps the token launches had before blocks tried several; another's
/// token names it, as one token used with another subnet would be refused.
fn spec<W: Workloads, S: Store>(
    l: &Launching<'_, W, S>,
    template: &LaunchTemplateRef,
    subnets: &[String],
    n: usize,
    slot: u32,
    generation: u32,
) -> LaunchSpec {
    let t = l.target;
    let subnet = &subnets[n];
    let token_base = match n {
        0 => t.token_base.clone(),
        _ => format!("{}@{subnet}", t.token_base),
    };
    LaunchSpec {
        region: t.region.clone(),
        market: t.market.clone(),
        instance_type: t.instance_type.clone(),
        count: 1,
        subnet_id: subnet.clone(),
        launch_template: template.clone(),
        client_token: client_token(&token_base, slot, generation),
        tags: l.tags.clone(),
    }
}

/// The subnet a launching slot's recorded intent names.
fn intended_subnet(resource_id: &str) -> Option<&str> {
    match resource_id.splitn(4, ':').collect::<Vec<_>>()[..] {
        [LAUNCHING, _, subnet, _] => Some(subnet),
        _ => None,
    }
}

/// What a launching slot's record holds: where the call went, and its token.
fn intent(spec: &LaunchSpec) -> String {
    format!(
        "{LAUNCHING}:{}:{}:{}",
        spec.region, spec.subnet_id, spec.client_token
    )
}

/// A launching slot of another placement (its run died, or lost the answer, before
/// recording what started): the same call again answers with what it started, which is
/// taken back (the slot is launched in this placement). Returns the slot's record after.
async fn settle_intent<W: Workloads, S: Store>(
    l: &Launching<'_, W, S>,
    template: &LaunchTemplateRef,
    w: &WorkloadRecord,
) -> Result<WorkloadRecord, PortError> {
    let parts: Vec<&str> = w.resource_id.splitn(4, ':').collect();
    let mut after = WorkloadRecord {
        state: UNLAUNCHED.into(),
        updated_at: l.now,
        ..w.clone()
    };
    if let [LAUNCHING, region, subnet, token] = parts[..] {
        let spec = LaunchSpec {
            region: region.to_string(),
            subnet_id: subnet.to_string(),
            client_token: token.to_string(),
            ..spec(l, template, &[subnet.to_string()], 0, w.slot, w.generation)
        };
        match l.workloads.launch_instances(&spec).await {
            Ok(started) => {
                if let Some(i) = started.into_iter().next() {
                    info!(request_id = %l.rec.request_id, instance_id = %i.instance_id, slot = w.slot,
                        "taking back an instance a run started in another placement and never recorded");
                    l.workloads
                        .terminate_instances(region, std::slice::from_ref(&i.instance_id))
                        .await?;
                    after.state = TERMINATED.into();
                    after.ran.push(Ran {
                        from: i.launched_at.unwrap_or(l.now).min(l.now),
                        to: l.now,
                    });
                    after.resource_id = i.instance_id;
                }
            }
            Err(e) => {
                settle(e, "an unrecorded launch")?;
            }
        }
    }
    l.store.put_workload(after.clone()).await?;
    Ok(after)
}

/// Terminates on-demand or spot instances this request started in `t` (a partial launch
/// that then found no capacity, or one the budget refused), so nothing runs undebited.
/// What the attempt's hold started in all is counted by [`started_in_hold`].
pub(super) async fn undo<W: Workloads, S: Store>(
    workloads: &W,
    store: &S,
    rec: &RequestRecord,
    t: &Target,
    now: DateTime<Utc>,
) -> Result<(), PortError> {
    // (A launching slot is settled by the next launch, which re-issues its call.)
    let started: Vec<WorkloadRecord> = store
        .workloads(&rec.request_id)
        .await?
        .into_iter()
        .filter(|w| w.reservation_id == t.reservation_id)
        .filter(|w| ![LAUNCHING, TERMINATED, UNLAUNCHED].contains(&w.state.as_str()))
        .collect();
    if started.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = started.iter().map(|w| w.resource_id.clone()).collect();
    info!(request_id = %rec.request_id, instance_ids = ?ids, "terminating a partial {} launch", t.reservation_id);
    // Recorded first: a run that dies before recording the take-back done leaves the slot
    // `terminating`, which the next launch finishes, rather than `running` on a dead
    // instance it would count as launched.
    for w in started.iter().filter(|w| w.state != TERMINATING) {
        store
            .put_workload(WorkloadRecord {
                state: TERMINATING.into(),
                updated_at: now,
                ..w.clone()
            })
            .await?;
    }
    workloads.terminate_instances(&t.region, &ids).await?;
    for w in started {
        store
            .put_workload(WorkloadRecord {
                state: TERMINATED.into(),
                updated_at: now,
                ..w.closed(None, now)
            })
            .await?;
    }
    Ok(())
}

/// How many instances the hold of `rec`'s run started in its attempt `reservation_id`
/// (`on-demand`, `spot`), by the table as it is now: each ran, so each is billed an hour.
///
/// Counted from the slot records, not by the run that settles: two runs of one hold at once
/// (a duplicate delivery, a tick beside a retry) each take back some of the instances, and
/// the one whose release lands would count only its own (found by the simulation, seeds
/// 14792 and 3713: the loser's take-backs went unbilled).
///
/// A slot's generation counts the instances it had before: an on-demand slot is relaunched
/// at the next generation only after the hold took its instance back (`launch`), and its
/// record then replaces the taken-back one's (found by the simulation, seed 1665: a crash
/// between a take-back and the release, and the retry's relaunch hid the first instance).
/// A slot holds one more at its own generation unless its launch there was refused
/// (`unlaunched`) or never answered (`launching`, settled by the next launch). Only slots the
/// hold wrote count (updated since `held_at`). Replacements of a running run
/// (replace-unhealthy) come after its launch, never before a release.
pub(super) async fn started_in_hold<S: Store>(
    store: &S,
    rec: &RequestRecord,
    reservation_id: &str,
) -> Result<usize, PortError> {
    let Some(held_at) = rec.run.as_ref().map(|r| r.held_at) else {
        return Ok(0);
    };
    Ok(store
        .workloads(&rec.request_id)
        .await?
        .iter()
        .filter(|w| w.reservation_id == reservation_id && w.updated_at >= held_at)
        .map(|w| {
            let now = ![LAUNCHING, UNLAUNCHED].contains(&w.state.as_str());
            w.generation as usize + usize::from(now)
        })
        .sum())
}

/// Terminates the window's instances: in a block, those in its reservations; on demand,
/// those in none. A block's are found by Describe filters and by the slots the table records
/// for its reservations: an instance launched or replaced within EC2's listing lag before
/// the drain is not listed yet, and would run unwarned until AWS's forced termination.
pub(super) async fn drain<W: Workloads, S: Store>(
    workloads: &W,
    store: &S,
    id: &RequestId,
    deployment: &str,
    w: &DrainTarget,
) -> Result<Vec<String>, PortError> {
    // The slots' instances (a block lives in one region): ours, launched by this request.
    let recorded: Vec<String> = if w.on_demand || w.regions.len() != 1 {
        Vec::new()
    } else {
        store
            .workloads(id)
            .await?
            .into_iter()
            .filter(|r| {
                w.reservation_ids.contains(&r.reservation_id)
                    && ![LAUNCHING, UNLAUNCHED, TERMINATED].contains(&r.state.as_str())
                    && r.resource_id.starts_with("i-")
            })
            .map(|r| r.resource_id)
            .collect()
    };
    let mut acted = Vec::new();
    for region in &w.regions {
        let mut ids = Vec::new();
        // Every instance the listing shows, in any state: a recorded one it does not show
        // is within the listing lag.
        let mut listed = std::collections::BTreeSet::new();
        let targets: Vec<Option<String>> = if w.on_demand {
            vec![None]
        } else {
            w.reservation_ids.iter().cloned().map(Some).collect()
        };
        for reservation_id in targets {
            let found = workloads
                .describe_instances(
                    region,
                    &InstanceFilter {
                        request_id: Some(id.clone()),
                        reservation_id: reservation_id.clone(),
                        managed_only: true,
                        ..Default::default()
                    },
                )
                .await?;
            listed.extend(found.iter().map(|i| i.instance_id.clone()));
            ids.extend(
                found
                    .into_iter()
                    .filter(|i| ours(i, id, deployment))
                    .filter(|i| !w.on_demand || i.reservation_id.is_none())
                    .map(|i| i.instance_id),
            );
        }
        for r in &recorded {
            if !listed.contains(r) && !ids.contains(r) {
                info!(request_id = %id, region, instance_id = %r,
                    "a recorded instance not listed yet (EC2's listing lag) is stopped too");
                ids.push(r.clone());
            }
        }
        if !ids.is_empty() {
            info!(request_id = %id, region, instances = ?ids, "terminating ahead of forced termination");
            workloads.terminate_instances(region, &ids).await?;
            acted.extend(ids.into_iter().map(|i| format!("instance:{i}")));
        }
    }
    Ok(acted)
}

/// Never touch an instance without our tags, whatever a filter returned: managed, for this
/// request, and of this deployment (`naming::owns`). Another stack in the account may run a
/// request of the same id.
pub fn ours(i: &InstanceInfo, id: &RequestId, deployment: &str) -> bool {
    i.state.is_live() && owns(&i.tags, id, deployment)
}

/// A slot's replacement, or why there can be none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replacement {
    /// Launch the first of these that has room: the slot at the record's generation (so a
    /// new client token), one launch per request subnet in the zone, in the request's order.
    /// A subnet without free addresses (`InsufficientFreeAddressesInSubnet`; an EFA template
    /// takes one per interface per instance) says nothing about the zone's next one, and a
    /// paid block must not be left short for it. Each has a token of its own, the same in
    /// every retry (EC2 answers a token used with another subnet
    /// `IdempotentParameterMismatch`): the caller records which one a call goes to before
    /// making it, and a retry asks that one first, so a lost answer is answered again there
    /// rather than a second instance started in a subnet that has room since.
    Launch(Vec<LaunchSpec>),
    /// Nothing can be launched until the request or the subnets change.
    Stuck(String),
}

/// The request's launch template and subnets, or why nothing can be replaced from it.
fn replaceable(rec: &RequestRecord) -> Result<(&LaunchTemplateRef, &[String]), String> {
    match &rec.request.workload {
        WorkloadDetail::Ec2Instances {
            launch_template: Some(template),
            subnet_ids,
            ..
        } => Ok((template, subnet_ids)),
        _ => Err("the request has no launch template to replace from".into()),
    }
}

/// The request's subnets in `zone` of `region`, in the request's order.
async fn zone_subnets<W: Workloads>(
    workloads: &W,
    region: &str,
    subnet_ids: &[String],
    zone: &str,
) -> Result<Vec<String>, PortError> {
    Ok(workloads
        .subnet_zones(region, subnet_ids)
        .await?
        .into_iter()
        .filter(|(_, z)| z == zone)
        .map(|(s, _)| s)
        .collect())
}

/// What a replacement's client token in the `n`th of a zone's subnets is made from: the
/// zone's first keeps `base`, the token replacements had when they tried one subnet (so a
/// retry across an upgrade answers the instance its launch started); another names its
/// subnet, as `launch`'s do.
fn subnet_token_base(base: &str, n: usize, subnet: &str) -> String {
    match n {
        0 => base.to_string(),
        _ => format!("{base}@{subnet}"),
    }
}

/// One launch per subnet of `subnets` (a zone's, in the request's order), each with its
/// own client token from `base`: `template` with its subnet and token filled in.
fn per_subnet(
    template: &LaunchSpec,
    subnets: &[String],
    base: &str,
    slot: &WorkloadRecord,
) -> Vec<LaunchSpec> {
    subnets
        .iter()
        .enumerate()
        .map(|(n, subnet)| LaunchSpec {
            subnet_id: subnet.clone(),
            client_token: client_token(
                &subnet_token_base(base, n, subnet),
                slot.slot,
                slot.generation,
            ),
            ..template.clone()
        })
        .collect()
}

/// The launch that replaces `slot`'s instance of an on-demand or spot run: in the zone (and
/// so a subnet of the request's) that the old instance `old` ran in, in the run's `market`,
/// with a client token of its own per generation and subnet (launch-workloads' tokens name
/// the run's placements, and a replacement is none of them).
pub async fn run_replacement<W: Workloads>(
    workloads: &W,
    rec: &RequestRecord,
    slot: &WorkloadRecord,
    old: Option<&InstanceInfo>,
    market: LaunchMarket,
    deployment_id: &str,
) -> Result<Replacement, PortError> {
    let (template, subnet_ids) = match replaceable(rec) {
        Ok(t) => t,
        Err(why) => return Ok(Replacement::Stuck(why)),
    };
    let Some(old) = old else {
        return Ok(Replacement::Stuck(format!(
            "{} is no longer listed by EC2, so the zone its run was placed in is unknown",
            slot.resource_id
        )));
    };
    let subnets = zone_subnets(workloads, &old.region, subnet_ids, &old.availability_zone).await?;
    if subnets.is_empty() {
        return Ok(Replacement::Stuck(format!(
            "none of the request's subnets is in {}, the zone of the run's {}",
            old.availability_zone, old.instance_id
        )));
    }
    let spec = LaunchSpec {
        region: old.region.clone(),
        market,
        instance_type: old.instance_type.clone(),
        count: 1,
        subnet_id: String::new(),
        launch_template: template.clone(),
        client_token: String::new(),
        tags: resource_tags(&rec.request.tags, &rec.request_id, &rec.team, deployment_id),
    };
    let base = format!("{}:{}:replacement", rec.request_id, slot.reservation_id);
    Ok(Replacement::Launch(per_subnet(
        &spec, &subnets, &base, slot,
    )))
}

/// The launch that replaces `slot`'s instance inside `reservation`: the block's zone when
/// the reservation records one, else the zone the old instance was in (`zone`).
/// It carries the window's drain start (`drain_at`) as its instances do.
pub async fn replacement<W: Workloads>(
    workloads: &W,
    rec: &RequestRecord,
    reservation: &Reservation,
    slot: &WorkloadRecord,
    zone: Option<String>,
    drain_at: DateTime<Utc>,
    deployment_id: &str,
) -> Result<Replacement, PortError> {
    let (template, subnet_ids) = match replaceable(rec) {
        Ok(t) => t,
        Err(why) => return Ok(Replacement::Stuck(why)),
    };
    let zone = reservation
        .segments
        .iter()
        .find_map(|s| s.availability_zone.clone())
        .or(zone)
        .unwrap_or_default();
    let subnets = zone_subnets(workloads, &reservation.region, subnet_ids, &zone).await?;
    if subnets.is_empty() {
        return Ok(Replacement::Stuck(format!(
            "none of the request's subnets is in {zone}, the reservation's zone"
        )));
    }
    let spec = LaunchSpec {
        region: reservation.region.clone(),
        market: LaunchMarket::CapacityBlock {
            reservation_id: reservation.id.clone(),
        },
        instance_type: reservation.instance_type.clone(),
        count: 1,
        subnet_id: String::new(),
        launch_template: template.clone(),
        client_token: String::new(),
        tags: {
            let mut tags =
                resource_tags(&rec.request.tags, &rec.request_id, &rec.team, deployment_id);
            tags.insert(DRAIN_AT_TAG.into(), drain_at_value(drain_at));
            tags
        },
    };
    Ok(Replacement::Launch(per_subnet(
        &spec,
        &subnets,
        &reservation.id,
        slot,
    )))
}
