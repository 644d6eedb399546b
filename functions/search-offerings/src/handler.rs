//! search-offerings: validates and records new requests, then, for every request that is
//! due, searches each allowed region, instance type and product, plans, and records the
//! ranked candidates. Identical queries across requests share one AWS call.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::config::{Config, PurchaseMode};
use capacity_pilot::decision;
pub use capacity_pilot::decision::{Decision, HandlerError};
use capacity_pilot::domain::events::{
    self, NotFound, OfferingsFound, PlanSummary, RequestAccepted, RequestFailed, Whose, event_key,
    inbound, outbound,
};
use capacity_pilot::domain::money::Usd;
use capacity_pilot::domain::notices::announced;
use capacity_pilot::domain::offering::{Offering, Product};
use capacity_pilot::domain::request::{
    CapacityRequest, FieldError, Mode, RequestId, Strategy, ValidationContext, parse_request,
};
use capacity_pilot::domain::reservation::Reservation;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::time_rules::search_deadline;
use capacity_pilot::domain::window::{self, DrainLead};
use capacity_pilot::outbox;
use capacity_pilot::ports::{
    CapacityMarket, Cause, Clock, CreateOutcome, EventSink, NewRequest, OfferingQuery, Pacing,
    PortError, RejectedSubmission, RequestRecord, Store, Transition, Workloads, WriteOutcome,
    request_named,
};
use capacity_pilot::search::{self, SearchRound};
use capacity_pilot::workload;
use capacity_pilot::workload::claims::{self, Claiming};
use capacity_pilot::workload::preflight::Depth;
use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use serde_json::Value;
use tracing::warn;

/// Detail larger than this is refused before parsing (EventBridge allows more; a request
/// never needs it).
pub const MAX_DETAIL_BYTES: usize = 64 * 1024;
/// How long to wait before searching again when nothing feasible was found.
pub const RETRY_AFTER: Duration = Duration::minutes(15);
// How many ranked plans are kept as candidates, and the searches a request needs: shared with
// `capacity-pilot plan`, which plans through the same code.
pub use capacity_pilot::search::{CANDIDATES_KEPT, queries_for};

#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub decisions: Vec<Decision>,
    /// Distinct AWS searches made.
    pub searches: usize,
    pub published: usize,
}

pub struct Searcher<S, M, W, E, C> {
    pub store: S,
    pub market: M,
    /// Where the request's subnets and HyperPod cluster are: an offering the workload
    /// cannot use is never planned, so never bought.
    pub workloads: W,
    pub events: E,
    pub clock: C,
    pub config: Arc<Config>,
    /// The account's live Capacity Blocks as last read, and when (`within_block_limit`).
    pub blocks_seen: BlocksSeen,
}

/// The account's live Capacity Blocks as a warm function last read them, kept
/// [`BLOCKS_SEEN_FOR`]: the limit across blocks is a pre-check (AWS refuses a purchase past
/// it, which is read as no capacity), so a count some minutes old costs at most a purchase
/// refused or a search round, and a tick planning many requests reads them once.
#[derive(Debug, Default)]
pub struct BlocksSeen(std::sync::Mutex<Option<(DateTime<Utc>, Vec<Reservation>)>>);

/// How long [`BlocksSeen`] serves.
const BLOCKS_SEEN_FOR: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

impl<S: Store + Pacing, M: CapacityMarket, W: Workloads, E: EventSink, C: Clock>
    Searcher<S, M, W, E, C>
{
    pub async fn handle(&self, ev: EventBridgeEvent<Value>) -> Result<Outcome, HandlerError> {
        let now = self.clock.now().await?;
        let event_id = ev.id.clone().unwrap_or_else(|| format!("{now}"));
        let cause = Cause::new(event_id.clone());
        let mut out = Outcome::default();
        let mut errors = Vec::new();
        let run = outbox::Run::start(&self.store, now);
        let mut agenda = None;

        match (ev.detail_type.as_str(), ev.source.as_str()) {
            ("Scheduled Event", "aws.events") => {
                let a = agenda.insert(self.store.agenda(now).await?);
                let due = a.due_in(&[
                    RequestStatus::Accepted,
                    RequestStatus::Searching,
                    RequestStatus::NotFound,
                ]);
                let mut records = Vec::new();
                // Due for one of its windows only (launch and cleanup's): not read.
                for item in due.into_iter().filter(|d| d.own_action_due(now)) {
                    if let Some(r) = self.store.get_request(&item.request_id).await?
                        // Due for one of its windows (launch and cleanup's), not for a search.
                        && r.own_action_due(now)
                    {
                        records.push(r);
                    }
                }
                self.search(records, &cause, now, &mut out, &mut errors)
                    .await;
            }
            (inbound::REQUEST_SUBMITTED, source) => {
                if let Some(rec) = self.submit(&ev, source, &cause, now, &mut out).await? {
                    self.search(vec![rec], &cause, now, &mut out, &mut errors)
                        .await;
                }
            }
            (other, source) => {
                warn!(
                    detail_type = other,
                    source, "ignoring an event this function does not handle"
                );
            }
        }
        out.published =
            outbox::flush(&self.store, &self.events, run.with_agenda(agenda.as_ref())).await?;
        decision::log(&out.decisions);
        decision::finish(out, errors)
    }

    /// Validates and records a new request. Returns it when it should be searched now.
    async fn submit(
        &self,
        ev: &EventBridgeEvent<Value>,
        source: &str,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<RequestRecord>, PortError> {
        let event_id = cause.event_id.as_str();
        let claimed_id = ev
            .detail
            .get("request_id")
            .and_then(Value::as_str)
            .map(str::to_string);
        // The team it names, when it names one: its notice goes to that team's subscribers.
        let claimed_team = ev
            .detail
            .get("team")
            .and_then(Value::as_str)
            .map(str::to_string);
        // A rejection is kept under the id it claimed, when that is an id, so that the
        // requester can read why (`capacity-pilot submit --wait`, `status`); then published.
        let reject = |problems: Vec<FieldError>| {
            let claimed = claimed_id.clone();
            let team = claimed_team.clone();
            async move {
                if let Some(id) = claimed.as_deref().and_then(|i| RequestId::parse(i).ok()) {
                    self.store
                        .record_rejection(RejectedSubmission {
                            request_id: id,
                            event_id: event_id.to_string(),
                            source: source.to_string(),
                            at: now,
                            problems: problems.clone(),
                        })
                        .await?;
                }
                outbox::reject(
                    &self.events,
                    event_id,
                    source,
                    claimed,
                    team.as_deref(),
                    problems,
                )
                .await
            }
        };
        if !self
            .config
            .allowed_request_sources
            .iter()
            .any(|s| s == source)
        {
            reject(vec![problem(
                "source",
                format!(
                    "{source:?} may not submit requests; allowed: {}",
                    self.config.allowed_request_sources.join(", ")
                ),
            )])
            .await?;
            return Ok(None);
        }
        let size = serde_json::to_vec(&ev.detail).map(|v| v.len()).unwrap_or(0);
        if size > MAX_DETAIL_BYTES {
            reject(vec![problem(
                "detail",
                format!("is {size} bytes; at most {MAX_DETAIL_BYTES}"),
            )])
            .await?;
            return Ok(None);
        }
        let ctx = ValidationContext {
            now,
            instance_types: &self.config.instance_types,
            allowed_regions: &self.config.allowed_regions,
        };
        let request = match parse_request(&ev.detail, &ctx) {
            // `PurchaseMode` plan-only: every request is a plan (ARCHITECTURE §8.1).
            Ok(r) if self.config.purchase_mode == PurchaseMode::PlanOnly => CapacityRequest {
                mode: Mode::Plan,
                ..r
            },
            Ok(r) => r,
            Err(problems) => {
                let summary = problems
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join("; ");
                out.decisions.push(Decision {
                    request_id: claimed_id.clone().unwrap_or_default(),
                    action: "rejected",
                    reason: summary,
                });
                reject(problems).await?;
                return Ok(None);
            }
        };
        let refused = match self.config.team_budgets.submission_problem(&request.team) {
            Some(p) => Some(p),
            None if let Some(p) = self.config.team_source_problem(&request.team, source) => Some(p),
            None if let Some(p) = self.unapprovable(&request) => Some(p),
            None => {
                workload::submission_problem(
                    &self.workloads,
                    &self.store,
                    &self.config,
                    &request,
                    now,
                )
                .await?
            }
        };
        if let Some(problem) = refused {
            out.decisions.push(Decision {
                request_id: claimed_id.clone().unwrap_or_default(),
                action: "rejected",
                reason: problem.to_string(),
            });
            reject(vec![problem]).await?;
            return Ok(None);
        }
        let id = request.id.clone();
        let deadline = search_deadline(request.window.latest_end, request.duration_hours);
        let accepted = RequestAccepted {
            // (Created at `now`: the request's `created_at`, its events' salt.)
            event_key: event_key(
                Whose {
                    request_id: id.as_str(),
                    created_at: now,
                },
                "accepted",
                1,
            ),
            request_id: id.to_string(),
            team: request.team.to_string(),
            strategy: request.strategy,
            workload_kind: request.workload_kind(),
            search_deadline: deadline,
        };
        // Its workload names are claimed with it (ARCHITECTURE §9.8): read, decided, and
        // written on the versions read, again when another submission wrote one first.
        let mut tries = 0;
        let mut created = loop {
            let claims = match claims::prepare(&self.store, &request, now).await? {
                Claiming::Writes(w) => w,
                // A redelivery of a recorded request is answered as one, below.
                Claiming::Refused(_) if self.store.get_request(&id).await?.is_some() => vec![],
                Claiming::Refused(problem) => {
                    out.decisions
                        .push(Decision::new(&id, "rejected", problem.to_string()));
                    reject(vec![problem]).await?;
                    return Ok(None);
                }
            };
            let created = self
                .store
                .create_request(NewRequest {
                    request: request.clone(),
                    source: source.to_string(),
                    cancelled: None,
                    reason: format!("accepted from {source}; searching until {deadline}"),
                    next_action_at: Some(now),
                    at: now,
                    caused_by: cause.clone(),
                    outbox: vec![outbound(&accepted)],
                    claims,
                })
                .await?;
            match created {
                CreateOutcome::ClaimChanged if tries < CLAIM_TRIES => tries += 1,
                CreateOutcome::ClaimChanged => {
                    return Err(PortError::Transient {
                        service: "dynamodb",
                        code: "Contended".into(),
                        message: format!(
                            "{id}: its workload name's claim changed under it {CLAIM_TRIES} \
                             times; the submission is retried"
                        ),
                    });
                }
                c => break c,
            }
        };
        if let CreateOutcome::Tombstoned(t) = &created {
            // ARCHITECTURE 8.3: its cancellation came first, from the same source, and was
            // answered then; the request is recorded cancelled, and nothing is searched.
            let reason = format!(
                "{}, received at {} before this submission (event {}); the request is \
                 recorded cancelled and nothing is searched for or bought",
                t.reason, t.at, t.event_id
            );
            let failed = RequestFailed {
                event_key: event_key(
                    Whose {
                        request_id: id.as_str(),
                        created_at: now,
                    },
                    "cancelled",
                    1,
                ),
                request_id: id.to_string(),
                status_before: RequestStatus::Accepted,
                reason: reason.clone(),
                reservation_ids: vec![],
                spent_usd: Usd::ZERO,
                kept_windows: vec![],
            };
            created = self
                .store
                .create_request(NewRequest {
                    request: request.clone(),
                    source: source.to_string(),
                    cancelled: Some(reason.clone()),
                    reason: reason.clone(),
                    next_action_at: None,
                    at: now,
                    caused_by: cause.clone(),
                    outbox: vec![outbound(&failed)],
                    claims: vec![],
                })
                .await?;
            if let CreateOutcome::Created { .. } = created {
                out.decisions.push(Decision::new(&id, "cancelled", reason));
                return Ok(None);
            }
        }
        match created {
            // (A record created cancelled honours no tombstone, and claims nothing: not
            // reached.)
            CreateOutcome::Tombstoned(_) | CreateOutcome::ClaimChanged => {
                Err(PortError::Transient {
                    service: "dynamodb",
                    code: "Contended".into(),
                    message: format!("{id}: the submission met a tombstone twice"),
                })
            }
            CreateOutcome::Created { .. } => {
                out.decisions
                    .push(Decision::new(&id, "accepted", "validated and recorded"));
                Ok(self.store.get_request(&id).await?)
            }
            CreateOutcome::DuplicateEvent => Ok(None),
            CreateOutcome::AlreadyExists => {
                // A request id is an idempotency key, used once: a producer's retry of an
                // in-flight request is a duplicate; anything else is refused, naming the id,
                // so nothing is dropped silently (a reuse of an ended request's id within its
                // archive period included).
                let why = match request_named(&self.store, &id).await? {
                    // (Review N15: SageMaker may take names that differ only in case for one.)
                    Some(e) if e.request_id != id => Some(format!(
                        "{id} differs only in case from request {}, which is {}; request ids \
                         are compared ignoring case: submit under another request_id",
                        e.request_id, e.status
                    )),
                    Some(e) if e.request == request && !e.status.is_terminal() => None,
                    Some(e) if e.request != request => Some(format!(
                        "{id} is already used by a different request; ids are idempotency keys"
                    )),
                    Some(e) => Some(format!(
                        "{id} was used by a request that is {} ({}); a request id is used once: \
                         submit again under a new request_id",
                        e.status, e.reason
                    )),
                    None => Some(format!(
                        "{id} was used by a request that has ended and is archived; a request \
                         id is used once: submit again under a new request_id"
                    )),
                };
                match why {
                    Some(why) => {
                        reject(vec![problem("request_id", why.clone())]).await?;
                        out.decisions.push(Decision::new(&id, "rejected", why));
                    }
                    None => out.decisions.push(Decision::new(
                        &id,
                        "duplicate",
                        "this request was already recorded",
                    )),
                }
                Ok(None)
            }
        }
    }

    /// Why a request is refused for its approval threshold (ARCHITECTURE §9.8): it could spend
    /// past it, and this deployment has no approver, so its purchase would wait for an
    /// approval that can never come.
    fn unapprovable(&self, request: &CapacityRequest) -> Option<FieldError> {
        let threshold = self.config.approval_threshold(request)?;
        if self.config.approvals_enabled || request.budget.max_upfront <= threshold {
            return None;
        }
        Some(problem(
            "budget.approval_above_usd",
            format!(
                "the request may spend ${} (budget.max_upfront_usd), above its approval \
                 threshold ${threshold} (the lower of budget.approval_above_usd and the stack's \
                 ApproveAboveUsd), but this deployment has no approver: the stack's \
                 ApproverPrincipals parameter is empty (APPROVALS_ENABLED=false), so no \
                 approval could arrive; lower budget.max_upfront_usd to ${threshold}, or an \
                 operator sets ApproverPrincipals",
                request.budget.max_upfront
            ),
        ))
    }

    async fn search(
        &self,
        records: Vec<RequestRecord>,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
        errors: &mut Vec<PortError>,
    ) {
        // Move new requests on: reserve-first ones to Searching, the others to on-demand.
        let mut searching = Vec::new();
        for rec in records {
            match self.begin(rec, cause, now, out).await {
                Ok(Some(r)) => searching.push(r),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        // What each still needs: the whole request, or (a split plan whose later block went
        // after the first was bought) a replacement segment for the rest.
        let mut needs = Vec::new();
        let mut kept_ok = Vec::new();
        for rec in searching {
            match self.store.reservations(&rec.request_id).await {
                Ok(held) => {
                    // A reservation that went final (its payment failed) holds nothing: its
                    // capacity may be bought again.
                    let kept: Vec<Reservation> =
                        held.into_iter().filter(|r| r.state.is_live()).collect();
                    needs.push(remaining(&rec, &kept));
                    kept_ok.push((rec, kept));
                }
                Err(e) => errors.push(e),
            }
        }
        let searching = kept_ok;
        // Each request's round (ARCHITECTURE §8.8), and what it asks this tick: at most
        // MAX_QUERIES_PER_REQUEST_TICK of what has no answer or refusal yet. Requests asking
        // the same question share one AWS call.
        let mut rounds = Vec::new();
        let mut queries: BTreeMap<OfferingQuery, Vec<usize>> = BTreeMap::new();
        for (i, ((rec, _), need)) in searching.iter().zip(&needs).enumerate() {
            let all = queries_for(need, now);
            let round = rec.search.clone().unwrap_or_default().for_queries(&all);
            let asked = round.to_ask(&all);
            for q in &asked {
                queries.entry(q.clone()).or_default().push(i);
            }
            rounds.push((all, round, asked));
        }
        let answers = self.ask(&queries, &rounds, now, out).await;
        for (((rec, kept), need), (all, mut round, asked)) in
            searching.into_iter().zip(needs).zip(rounds)
        {
            for q in &asked {
                if let Some(result) = answers.get(q) {
                    round.record(&all, q, result, now);
                }
            }
            let deadline = search_deadline(need.window.latest_end, need.duration_hours);
            let result = if round.decides(&all, now, deadline) {
                let mut offerings = round.offerings();
                let mut seen = BTreeSet::new();
                offerings.retain(|o| seen.insert((o.region.clone(), o.id.clone())));
                // A replacement segment must not overlap what is already bought.
                offerings.retain(|o| {
                    !o.segments.iter().any(|s| {
                        kept.iter()
                            .flat_map(|r| &r.segments)
                            .any(|k| s.start < k.end && k.start < s.end)
                    })
                });
                self.record(
                    &rec,
                    &need,
                    &kept,
                    &offerings,
                    (&round, &all),
                    cause,
                    now,
                    out,
                )
                .await
            } else {
                self.wait(&rec, round, &all, cause, now, out).await
            };
            if let Err(e) = result {
                errors.push(e);
            }
        }
    }

    /// Asks each distinct query once, Capacity Block searches paced per region (ARCHITECTURE
    /// §8.8): the region's allowance says how many go this tick, those deferred longest
    /// first; the rest, and the rest of a region that answers with its rate limit (which
    /// backs it off), count as failing and are asked again next tick.
    async fn ask(
        &self,
        queries: &BTreeMap<OfferingQuery, Vec<usize>>,
        rounds: &[(Vec<OfferingQuery>, SearchRound, Vec<OfferingQuery>)],
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> BTreeMap<OfferingQuery, Result<Vec<Offering>, PortError>> {
        let deferred = |why: String| PortError::Throttled {
            service: "ec2",
            code: "Deferred".into(),
            message: why,
        };
        // How long each query has waited: the most failed ticks among its requests.
        let waited = |q: &OfferingQuery, users: &[usize]| {
            users
                .iter()
                .filter_map(|&i| match rounds[i].1.outcomes.get(&search::key(q)) {
                    Some(search::QueryOutcome::Failing { ticks, .. }) => Some(*ticks),
                    _ => None,
                })
                .max()
                .unwrap_or(0)
        };
        let mut order: Vec<(&OfferingQuery, u32)> =
            queries.iter().map(|(q, u)| (q, waited(q, u))).collect();
        order.sort_by_key(|(_, waited)| std::cmp::Reverse(*waited));
        let mut wanted: BTreeMap<&str, u32> = BTreeMap::new();
        for (q, _) in &order {
            if q.product == Product::CapacityBlock {
                *wanted.entry(q.region.as_str()).or_default() += 1;
            }
        }
        let mut allowed: BTreeMap<String, u32> = BTreeMap::new();
        for (region, n) in wanted {
            let granted = match self.store.take_searches(region, n, now).await {
                Ok(g) => g,
                Err(e) => {
                    warn!(region, error = %e, "the search allowance could not be read; deferring the region's searches");
                    0
                }
            };
            allowed.insert(region.to_string(), granted);
        }
        let mut answers = BTreeMap::new();
        let mut backing_off: BTreeSet<String> = BTreeSet::new();
        for (q, _) in order {
            let blocks = q.product == Product::CapacityBlock;
            if blocks {
                let left = allowed.entry(q.region.clone()).or_default();
                let why = if backing_off.contains(&q.region) {
                    Some(format!(
                        "{} is backing off its Capacity Block describe limit",
                        q.region
                    ))
                } else if *left == 0 {
                    Some(format!(
                        "{}'s Capacity Block search allowance is spent for now",
                        q.region
                    ))
                } else {
                    *left -= 1;
                    None
                };
                if let Some(why) = why {
                    answers.insert(q.clone(), Err(deferred(format!("deferred: {why}"))));
                    continue;
                }
            }
            out.searches += 1;
            let result = self.market.search(q).await;
            if let Err(e) = &result {
                warn!(region = %q.region, instance_type = %q.instance_type, error = %e, "search failed");
                if blocks && matches!(search::read_failure(e), search::Failure::RateLimited(_)) {
                    backing_off.insert(q.region.clone());
                    if let Err(e) = self
                        .store
                        .back_off(&q.region, now + search::RATE_BACK_OFF, now)
                        .await
                    {
                        warn!(region = %q.region, error = %e, "the back-off could not be recorded");
                    }
                }
            }
            answers.insert(q.clone(), result);
        }
        answers
    }

    /// The round is not decided yet: records what each query came to, and looks again on
    /// the next tick.
    async fn wait(
        &self,
        rec: &RequestRecord,
        round: SearchRound,
        all: &[OfferingQuery],
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let reason = format!(
            "searching: {} of {} queries answered or refused; waiting on {}",
            round.settled(all),
            all.len(),
            round.gaps(all).join("; ")
        );
        let t = Transition::of(
            rec,
            rec.status,
            &reason,
            Some(now),
            now,
            &Cause::new(format!("{}#search", cause.event_id)),
        )
        .with_search(round);
        let w = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&w, "searching"),
            reason,
        ));
        Ok(())
    }

    /// Accepted requests start searching (or go on demand); others are returned as they are.
    async fn begin(
        &self,
        rec: RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<Option<RequestRecord>, PortError> {
        if !matches!(
            rec.status,
            RequestStatus::Accepted | RequestStatus::Searching | RequestStatus::NotFound
        ) {
            return Ok(None);
        }
        if rec.status != RequestStatus::Accepted {
            return Ok(Some(rec));
        }
        let (to, reason) = match rec.request.strategy {
            // A plan runs nothing on demand: it only searches and plans (ARCHITECTURE §8.1).
            _ if rec.request.mode == Mode::Plan => (
                RequestStatus::Searching,
                "mode plan: searching to plan; nothing is bought or launched",
            ),
            Strategy::OnDemandFirst => (
                RequestStatus::TryingOnDemand,
                "on-demand-first: trying on-demand capacity before reserving",
            ),
            Strategy::Reserve => (RequestStatus::Searching, "searching for offerings"),
        };
        // Each write of one invocation records its own derived cause: the store treats a
        // repeated cause as a duplicate delivery.
        let step = Cause::new(format!("{}#begin", cause.event_id));
        // On-demand-first has nothing to do before the desired start: not due until then.
        let next = match to {
            RequestStatus::TryingOnDemand => rec.request.window.earliest_start.max(now),
            _ => now,
        };
        let w = self
            .store
            .transition(Transition::of(&rec, to, reason, Some(next), now, &step))
            .await?;
        match (w, to) {
            (WriteOutcome::Applied { version }, RequestStatus::Searching) => {
                Ok(Some(RequestRecord {
                    status: to,
                    version,
                    ..rec
                }))
            }
            (WriteOutcome::Applied { .. }, _) => {
                out.decisions
                    .push(Decision::new(&rec.request_id, "on-demand-first", reason));
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// Every live Capacity Block of the allowed regions, whoever bought them (the account's
    /// limit across blocks counts them all), listed at most once per [`BLOCKS_SEEN_FOR`].
    async fn live_blocks(&self, now: DateTime<Utc>) -> Result<Vec<Reservation>, PortError> {
        let kept = self
            .blocks_seen
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .filter(|(at, _)| *at <= now && now < *at + BLOCKS_SEEN_FOR);
        if let Some((_, live)) = kept {
            return Ok(live);
        }
        let mut live = Vec::new();
        for region in &self.config.allowed_regions {
            live.extend(self.market.blocks_in_account(region).await?);
        }
        *self
            .blocks_seen
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((now, live.clone()));
        Ok(live)
    }

    #[allow(clippy::too_many_arguments)]
    async fn record(
        &self,
        rec: &RequestRecord,
        req: &CapacityRequest,
        kept: &[Reservation],
        offerings: &[Offering],
        (round, all): (&SearchRound, &[OfferingQuery]),
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let mut gaps = round.gaps(all);
        let (planning, missed) = search::plan_offerings(
            &self.workloads,
            req,
            offerings,
            &self.config.prices,
            self.config.max_block_instances,
            // Reads only: the dry run is purchase-capacity's, under its own role.
            (Some(&self.config), Depth { dry_run: false }),
            now,
            || self.live_blocks(now),
        )
        .await?;
        for why in missed {
            warn!(request_id = %id, why = %why, "planning without a check");
            gaps.push(why);
        }
        let missing = if gaps.is_empty() {
            String::new()
        } else {
            format!("; decided without: {}", gaps.join("; "))
        };
        let deadline = search_deadline(req.window.latest_end, req.duration_hours);
        let version = rec.version + 1;
        let step = Cause::new(format!("{}#search", cause.event_id));
        let mut t = Transition::of(
            rec,
            RequestStatus::OfferingsFound,
            "",
            Some(now),
            now,
            &step,
        )
        .with_search(round.next_round());
        let action;
        let refused = round.all_refused(all);
        // The plans kept as candidates, announced in Capacity Offerings Found with every
        // other offering's reason.
        let announce = |t: &mut Transition| {
            let kept: Vec<_> = planning
                .plans
                .iter()
                .take(CANDIDATES_KEPT)
                .cloned()
                .collect();
            let (rejections, rejections_omitted) = events::bounded_rejections(&planning.rejections);
            t.outbox = vec![outbound(&OfferingsFound {
                event_key: event_key(rec.whose(), "offerings-found", version),
                request_id: id.to_string(),
                plans: kept.iter().map(PlanSummary::from).collect(),
                rejections,
                rejections_omitted,
            })];
            t.candidates = Some(kept);
        };
        if rec.request.mode == Mode::Plan {
            // ARCHITECTURE §8.1: its round decided, a plan request announces its plans (none,
            // when nothing is feasible, with every offering's reason) and ends: nothing is
            // bought or debited, and its id may be submitted again.
            action = "planned";
            t.to = RequestStatus::Planned;
            t.next_action_at = None;
            t.reason = match planning.best() {
                Some(best) => format!(
                    "planned (mode plan), nothing bought: {} of {} plan(s) kept; best: {}{missing}",
                    planning.plans.len().min(CANDIDATES_KEPT),
                    planning.plans.len(),
                    best.reason
                ),
                None => format!(
                    "planned (mode plan), nothing bought: no feasible offering ({} offerings \
                     seen{}){missing}",
                    offerings.len(),
                    summarize(&planning.rejections)
                ),
            };
            announce(&mut t);
        } else if let Some(best) = planning.best() {
            action = "offerings-found";
            t.reason = format!("{}{missing}", best.reason);
            announce(&mut t);
        } else if now >= deadline || refused {
            action = "failed";
            t.to = RequestStatus::Failed;
            t.next_action_at = None;
            let when = if refused {
                "and every search was refused, so none can be".to_string()
            } else {
                format!("before the search deadline {deadline}")
            };
            t.reason = format!(
                "no feasible {} was found {when} ({} offerings seen{}){}{missing}",
                if kept.is_empty() {
                    "offering"
                } else {
                    "replacement segment"
                },
                offerings.len(),
                summarize(&planning.rejections),
                if kept.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; the partial reservation {} is kept (purchases cannot be cancelled)",
                        Reservation::id_list(kept)
                    )
                }
            );
            t.outbox = vec![announced(
                Some(rec.team.as_str()),
                &events::RequestFailed {
                    event_key: event_key(rec.whose(), "failed", version),
                    request_id: id.to_string(),
                    status_before: rec.status,
                    reason: t.reason.clone(),
                    reservation_ids: kept.iter().map(|r| r.id.clone()).collect(),
                    spent_usd: rec.spent.to_usd(),
                    kept_windows: window::kept(
                        kept,
                        &rec.windows,
                        DrainLead::of(req, self.config.default_drain_minutes),
                    ),
                },
            )];
        } else {
            action = "not-found";
            let next = (now + RETRY_AFTER).min(deadline);
            t.to = RequestStatus::NotFound;
            t.next_action_at = Some(next);
            t.reason = format!(
                "no feasible offering yet ({} offerings seen{}{missing}); searching again at \
                 {next}",
                offerings.len(),
                summarize(&planning.rejections)
            );
            // Announce the first time, then only when the reason or the alternatives change
            // (a request that was NotFound before gists were kept counts as announced);
            // other retries only move the next look.
            let gist = capacity_pilot::search::not_found_gist(&planning.rejections, &missing);
            let before = rec.search.as_ref().and_then(|s| s.announced.clone());
            let news = rec.status != RequestStatus::NotFound
                || before.as_ref().is_some_and(|b| *b != gist);
            if let Some(s) = t.search.as_mut() {
                s.announced = Some(gist);
            }
            if news {
                let (rejections, rejections_omitted) =
                    events::bounded_rejections(&planning.rejections);
                t.outbox = vec![announced(
                    Some(rec.team.as_str()),
                    &NotFound {
                        event_key: event_key(rec.whose(), "not-found", version),
                        request_id: id.to_string(),
                        reason: t.reason.clone(),
                        next_search_at: next,
                        search_deadline: deadline,
                        rejections,
                        rejections_omitted,
                    },
                )];
            }
        }
        let reason = t.reason.clone();
        let w = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            id,
            match w {
                WriteOutcome::Applied { .. } => action,
                _ => "skipped",
            },
            reason,
        ));
        Ok(())
    }
}

/// What a request still needs bought. Usually all of it; but when a split plan's later block
/// went after the earlier one was bought, a replacement segment for the remaining hours: same
/// region, type, count and product as what was kept, one block, within the money left.
/// What is kept counts for what it covers of the request (`CapacityRequest::covered_by`):
/// only what the request takes, and each hour once, so a stray adopted beside the plan that
/// overlaps its block, or one of another type, does not make it look served. (A request that
/// what it keeps serves is `Reserved` by the purchase that kept it, never searched for.) A
/// spot run that fell back served part of the duration (`RequestRecord::served`): only the
/// rest is needed, in whole days, within the money left.
pub fn remaining(rec: &RequestRecord, kept: &[Reservation]) -> CapacityRequest {
    let mut need = rec.request.clone();
    let kept: Vec<&Reservation> = kept.iter().filter(|r| need.takes(r)).collect();
    let Some(first) = kept.first() else {
        // A spot run that fell back needs only the whole days it did not serve.
        if !rec.served().is_zero() {
            need.duration_hours = rec.needed_hours();
            need.budget.max_upfront = need.budget.max_upfront - rec.spent.to_usd();
        }
        return need;
    };
    let left = (rec.needed() - need.covered_by(kept.iter().copied())).num_minutes();
    let mut hours = (left.max(0) + 59) / 60;
    if first.product == Product::CapacityBlock {
        // Blocks come in whole days: a kept block that started mid-day covers a part more
        // than its days, and what is left is asked for in whole days (EC2 refuses a
        // 13-hour duration).
        hours = (hours + 23) / 24 * 24;
    }
    need.duration_hours = u32::try_from(hours).unwrap_or(0);
    need.budget.max_upfront = need.budget.max_upfront - rec.spent.to_usd();
    need.allow_split = false;
    need.regions = vec![first.region.clone()];
    need.instance_types = vec![first.instance_type.clone()];
    need.products = vec![first.product];
    need
}

fn summarize(rejections: &[capacity_pilot::domain::planner::Rejection]) -> String {
    match rejections.first() {
        None => String::new(),
        Some(r) => format!("; e.g. {}: {}", r.offering_id, r.reason),
    }
}

/// How often a submission reads and writes its claims again when another wrote one first.
const CLAIM_TRIES: u32 = 4;

fn problem(field: &str, message: String) -> FieldError {
    FieldError {
        field: field.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests;
