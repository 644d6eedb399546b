//! launch-workloads: for every request whose reserved window has opened, launches what the
//! window needs exactly once (instances into the block, a training job or an endpoint on the
//! plan, a HyperPod instance group), and for `on-demand-first` requests tries on-demand (then
//! spot, when interruptible) before falling back to a reservation.
//!
//! Events only wake this function up: what to launch, where and for how long is read from
//! the table. Every launch is idempotent by construction (client tokens derived from the
//! reservation, slot and generation; names derived from the request and segment), so a
//! duplicate event, a schedule tick racing a Delivered event, or a retry after a crash finds
//! the same instances instead of starting new ones.

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use capacity_pilot::config::Config;
use capacity_pilot::decision;
pub use capacity_pilot::decision::{Decision, HandlerError};
use capacity_pilot::domain::events::{self, WorkloadLaunched, event_key, outbound};
use capacity_pilot::domain::money::{MicroUsd, Usd};
use capacity_pilot::domain::naming::{MANAGED_TAG, client_token, resource_tags, workload_name};
use capacity_pilot::domain::offering::Product;
use capacity_pilot::domain::request::{RequestId, WorkloadDetail};
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::time_rules::PURCHASE_LEAD;
use capacity_pilot::domain::window::{
    self, DrainLead, FOLLOWS_WINDOWS, HOLDS_WINDOWS, Window, WindowState,
};
use capacity_pilot::outbox;
use capacity_pilot::ports::{
    BudgetMonth, Cause, Clock, Debit, EndpointSpec, EventSink, InstanceGroupSpec, JobState,
    LaunchMarket, LaunchSpec, PortError, RequestRecord, Settle, Store, TrainingJobSpec, Transition,
    WindowUpdate, WorkloadRecord, Workloads, WriteOutcome,
};
use chrono::{DateTime, Duration, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{info, warn};

/// EC2's two documented spellings of the delivery event.
pub const CAPACITY_BLOCK_DELIVERED: &str = "Capacity Block Delivered";
pub const CAPACITY_BLOCK_RESERVATION_DELIVERED: &str = "Capacity Block Reservation Delivered";
/// The workload records' reservation id for on-demand and spot launches.
pub const ON_DEMAND: &str = "on-demand";
pub const SPOT: &str = "spot";
/// What this function looks at: every status that may hold a window, and on-demand-first.
pub const DUE: [RequestStatus; 9] = [
    RequestStatus::Reserved,
    RequestStatus::Active,
    RequestStatus::Draining,
    RequestStatus::Searching,
    RequestStatus::NotFound,
    RequestStatus::OfferingsFound,
    RequestStatus::AwaitingApproval,
    RequestStatus::Purchasing,
    RequestStatus::TryingOnDemand,
];
/// SageMaker's ceiling on `MaxRuntimeInSeconds` (28 days).
const MAX_JOB_RUNTIME_SECONDS: i64 = 28 * 24 * 3600;

#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub decisions: Vec<Decision>,
    pub published: usize,
}

/// The part of AWS's Delivered event we log; the decision itself reads the table.
#[derive(Debug, Default, Deserialize)]
struct DeliveredDetail {
    #[serde(rename = "capacity-reservation-id", default)]
    capacity_reservation_id: Option<String>,
}

pub struct Launcher<S, W, E, C> {
    pub store: S,
    pub workloads: W,
    pub events: E,
    pub clock: C,
    pub config: Arc<Config>,
}

/// Where and how one launch runs: in a reservation's window, or on demand or spot.
struct Target {
    /// The reservation id, or `on-demand` / `spot`: the key of the workload records.
    reservation_id: String,
    /// What client tokens are derived from (the reservation id for a block).
    token_base: String,
    market: LaunchMarket,
    /// The training plan ARN, for SageMaker workloads on a plan.
    plan_arn: Option<String>,
    region: String,
    instance_type: String,
    instance_count: u32,
    availability_zone: Option<String>,
    segment: u32,
    /// When the workload must be gone; a training job's max runtime stops it by then.
    must_end_by: DateTime<Utc>,
}

/// What one launch attempt came to, short of an error worth retrying as it is.
enum Launch {
    Done(Vec<String>),
    /// No capacity (yet): a block wait for the next tick; on-demand falls back.
    NoCapacity(String),
    /// Retrying cannot help: the request fails with this reason.
    Refuse(String),
    /// Accepted, but not yet placed: SageMaker finds on-demand capacity for a training job
    /// (or fails it) asynchronously, so nothing is committed until the next tick looks.
    Starting(String),
}

/// A failed launch call, classified for [`Launch`]; anything else is retried next tick.
fn settle(e: PortError, what: &str) -> Result<Launch, PortError> {
    match e {
        PortError::NoCapacity { code, message } => Ok(Launch::NoCapacity(format!(
            "no capacity for {what} ({code}: {message})"
        ))),
        e @ PortError::Permanent { .. } => Ok(Launch::Refuse(format!("{what} was refused: {e}"))),
        e => Err(e),
    }
}

impl<S: Store, W: Workloads, E: EventSink, C: Clock> Launcher<S, W, E, C> {
    pub async fn handle(&self, ev: EventBridgeEvent<Value>) -> Result<Outcome, HandlerError> {
        let now = self.clock.now().await?;
        let cause = Cause::new(ev.id.clone().unwrap_or_else(|| format!("{now}")));
        let mut out = Outcome::default();
        let mut errors = Vec::new();

        let wake = match (ev.detail_type.as_str(), ev.source.as_str()) {
            ("Scheduled Event", "aws.events") => true,
            (CAPACITY_BLOCK_DELIVERED | CAPACITY_BLOCK_RESERVATION_DELIVERED, "aws.ec2") => {
                let d: DeliveredDetail =
                    serde_json::from_value(ev.detail.clone()).unwrap_or_default();
                info!(
                    capacity_reservation_id = d.capacity_reservation_id.as_deref().unwrap_or(""),
                    "capacity block delivered; launching what the table says is due"
                );
                true
            }
            (detail_type, source) => {
                warn!(
                    detail_type,
                    source, "ignoring an event this function does not handle"
                );
                false
            }
        };
        if wake {
            let due = self.store.due(&DUE, now).await?;
            for item in due {
                if let Err(e) = self.process(&item.request_id, &cause, now, &mut out).await {
                    warn!(request_id = %item.request_id, error = %e, "launch step failed; the next tick retries");
                    errors.push(e);
                }
            }
        }
        out.published = outbox::flush(&self.store, &self.events).await?;
        decision::log(&out.decisions);
        decision::finish(out, errors)
    }

    async fn process(
        &self,
        id: &RequestId,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let Some(rec) = self.store.get_request(id).await? else {
            return Ok(());
        };
        match rec.status {
            RequestStatus::TryingOnDemand => self.try_on_demand(&rec, cause, now, out).await,
            s if HOLDS_WINDOWS.contains(&s) => self.launch_windows(&rec, cause, now, out).await,
            other => {
                out.decisions.push(Decision::new(
                    id,
                    "ignored",
                    format!("nothing to launch while the request is {other}"),
                ));
                Ok(())
            }
        }
    }

    // ---- reserved windows ---------------------------------------------------------------

    /// Launches into the window that is open now, whatever the request's status: a split's
    /// kept block runs while its replacement is searched for or bought.
    async fn launch_windows(
        &self,
        rec: &RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let follows = FOLLOWS_WINDOWS.contains(&rec.status);
        if !follows
            && !rec
                .windows
                .iter()
                .any(|w| w.next_action_at.is_some_and(|t| t <= now))
        {
            // Due for its search or purchase, not for a window.
            return Ok(());
        }
        let reservations = self.store.reservations(id).await?;
        let windows = window::windows(&reservations, &rec.windows, self.drain_lead(rec));
        let Some(w) = windows.iter().find(|w| w.is_launchable(now)) else {
            if follows {
                let next = windows
                    .iter()
                    .filter(|w| w.state == WindowState::Pending && w.start() > now)
                    .map(Window::start)
                    .min();
                let reason = match next {
                    Some(s) => format!("no window is open yet; the next opens at {s}"),
                    None => "no window is open and none is ahead".to_string(),
                };
                out.decisions.push(Decision::new(id, "waiting", reason));
            }
            return Ok(());
        };
        let r = &w.reservation;
        let target = Target {
            reservation_id: r.id.clone(),
            token_base: r.id.clone(),
            market: LaunchMarket::CapacityBlock {
                reservation_id: r.id.clone(),
            },
            plan_arn: matches!(r.product, Product::TrainingPlan { .. }).then(|| r.id.clone()),
            region: r.region.clone(),
            instance_type: r.instance_type.clone(),
            instance_count: r.instance_count,
            availability_zone: w.segment.availability_zone.clone(),
            segment: w.number,
            must_end_by: w.forced_at,
        };
        match self.launch(rec, &target, now).await? {
            Launch::Done(resource_ids) => {
                let ev = WorkloadLaunched {
                    event_key: event_key(
                        id.as_str(),
                        &format!("launched-s{}", w.number),
                        rec.version + 1,
                    ),
                    request_id: id.to_string(),
                    reservation_id: r.id.clone(),
                    segment: w.number,
                    workload_kind: rec.request.workload_kind(),
                    resource_ids: resource_ids.clone(),
                    planned_start: w.start(),
                    launched_at: now,
                    estimated_cost_usd: None,
                };
                let reason = format!(
                    "launched {} in {} (segment {}, window opened {}, {} min ago); drain starts at {}",
                    resource_ids.join(", "),
                    r.id,
                    w.number,
                    w.start(),
                    (now - w.start()).num_minutes(),
                    w.drain_at
                );
                let windows =
                    window::records_with(&rec.windows, &windows, &w.key, WindowState::Running, now);
                let u = WindowUpdate::of(
                    rec,
                    windows,
                    &reason,
                    now,
                    &cause.step("launch"),
                    vec![outbound(&ev)],
                );
                let written = self.store.update_windows(u).await?;
                out.decisions.push(Decision::new(
                    id,
                    decision::written(&written, "launched"),
                    reason,
                ));
                Ok(())
            }
            Launch::NoCapacity(why) | Launch::Starting(why) => {
                let reason = format!("{why}; trying again on the next tick");
                if w.state == WindowState::Pending {
                    // The launch has begun: the window says so until it runs.
                    let windows = window::records_with(
                        &rec.windows,
                        &windows,
                        &w.key,
                        WindowState::Launching,
                        now,
                    );
                    let u = WindowUpdate::of(
                        rec,
                        windows,
                        &reason,
                        now,
                        &cause.step("launching"),
                        vec![],
                    );
                    self.store.update_windows(u).await?;
                }
                out.decisions.push(Decision::new(id, "waiting", reason));
                Ok(())
            }
            Launch::Refuse(why) => self.fail(rec, why, cause, now, out).await,
        }
    }

    fn drain_lead(&self, rec: &RequestRecord) -> DrainLead {
        DrainLead {
            requested_minutes: rec.request.drain_minutes,
            default_minutes: self.config.default_drain_minutes,
        }
    }

    /// Launches what the request's workload needs in `target`, skipping what is recorded.
    async fn launch(
        &self,
        rec: &RequestRecord,
        t: &Target,
        now: DateTime<Utc>,
    ) -> Result<Launch, PortError> {
        let id = &rec.request_id;
        let recorded: BTreeMap<u32, WorkloadRecord> = self
            .store
            .workloads(id)
            .await?
            .into_iter()
            .filter(|w| w.reservation_id == t.reservation_id)
            .map(|w| (w.slot, w))
            .collect();
        let tags = resource_tags(&rec.request.tags, id);
        let record = |slot: u32, resource_id: String, state: &str| WorkloadRecord {
            request_id: id.clone(),
            reservation_id: t.reservation_id.clone(),
            slot,
            generation: 0,
            resource_id,
            state: state.to_string(),
            updated_at: now,
        };
        match &rec.request.workload {
            WorkloadDetail::Ec2Instances {
                launch_template,
                subnet_ids,
                ..
            } => {
                let Some(template) = launch_template else {
                    return Ok(Launch::Refuse(
                        "the request names no launch template".into(),
                    ));
                };
                let subnet = match &t.availability_zone {
                    Some(zone) => {
                        match self
                            .workloads
                            .subnet_in_zone(&t.region, subnet_ids, zone)
                            .await?
                        {
                            Some(s) => s,
                            None => {
                                return Ok(Launch::Refuse(format!(
                                    "none of the request's subnets ({}) is in {zone}, the zone of {}",
                                    subnet_ids.join(", "),
                                    t.reservation_id
                                )));
                            }
                        }
                    }
                    None => match subnet_ids.first() {
                        Some(s) => s.clone(),
                        None => return Ok(Launch::Refuse("the request names no subnet".into())),
                    },
                };
                let mut ids = Vec::new();
                // One RunInstances per slot, so each slot has its own client token and a
                // retry after a partial failure finds exactly the instances already started.
                for slot in 0..t.instance_count {
                    if let Some(w) = recorded.get(&slot) {
                        ids.push(w.resource_id.clone());
                        continue;
                    }
                    let spec = LaunchSpec {
                        region: t.region.clone(),
                        market: t.market.clone(),
                        instance_type: t.instance_type.clone(),
                        count: 1,
                        subnet_id: subnet.clone(),
                        launch_template: template.clone(),
                        client_token: client_token(&t.token_base, slot, 0),
                        tags: tags.clone(),
                    };
                    let launched = match self.workloads.launch_instances(&spec).await {
                        Ok(l) => l,
                        Err(e) => {
                            return settle(
                                e,
                                &format!("slot {slot} of {} ({})", t.reservation_id, subnet),
                            );
                        }
                    };
                    let Some(instance) = launched.into_iter().next() else {
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
                    self.store
                        .put_workload(record(
                            slot,
                            instance.instance_id.clone(),
                            instance.state.as_str(),
                        ))
                        .await?;
                    ids.push(instance.instance_id);
                }
                Ok(Launch::Done(ids))
            }
            WorkloadDetail::TrainingJob(template) => {
                // An on-demand job has a name of its own: after a fall-back, the plan's job
                // for the same segment must not collide with (and "find") the failed one.
                let name = match &t.plan_arn {
                    Some(_) => workload_name(id, t.segment),
                    None => format!("{}-od", workload_name(id, t.segment)),
                };
                if !recorded.contains_key(&t.segment) {
                    let runtime = (t.must_end_by - now)
                        .num_seconds()
                        .clamp(1, MAX_JOB_RUNTIME_SECONDS);
                    let spec = TrainingJobSpec {
                        region: t.region.clone(),
                        job_name: name.clone(),
                        role_arn: self.config.sagemaker_execution_role_arn.clone(),
                        training_image: template.training_image.clone(),
                        output_s3_uri: template.output_s3_uri.clone(),
                        instance_type: t.instance_type.clone(),
                        instance_count: t.instance_count,
                        volume_size_gb: template.volume_size_gb,
                        training_plan_arn: t.plan_arn.clone(),
                        max_runtime_seconds: u32::try_from(runtime).unwrap_or(u32::MAX),
                        hyper_parameters: template.hyper_parameters.clone(),
                        tags,
                    };
                    if let Err(e) = self.workloads.start_training_job(&spec).await {
                        return settle(e, &format!("training job {name}"));
                    }
                    info!(request_id = %id, reservation_id = %t.reservation_id, job_name = %name, "started a training job");
                    self.store
                        .put_workload(record(t.segment, name.clone(), "InProgress"))
                        .await?;
                }
                if t.plan_arn.is_none() {
                    return self.placed(&t.region, &name).await;
                }
                Ok(Launch::Done(vec![name]))
            }
            WorkloadDetail::InferenceEndpoint {
                model_name,
                endpoint_name,
                variant_name,
            } => {
                if !recorded.contains_key(&t.segment) {
                    let spec = EndpointSpec {
                        region: t.region.clone(),
                        endpoint_name: endpoint_name.clone(),
                        endpoint_config_name: workload_name(id, t.segment),
                        model_name: model_name.clone(),
                        variant_name: variant_name.clone(),
                        instance_type: t.instance_type.clone(),
                        instance_count: t.instance_count,
                        ml_reservation_arn: t.plan_arn.clone(),
                        tags,
                    };
                    if let Err(e) = self.workloads.create_endpoint(&spec).await {
                        return settle(e, &format!("endpoint {endpoint_name}"));
                    }
                    info!(request_id = %id, reservation_id = %t.reservation_id, endpoint_name = %endpoint_name, "created an endpoint");
                    self.store
                        .put_workload(record(t.segment, endpoint_name.clone(), "Creating"))
                        .await?;
                }
                Ok(Launch::Done(vec![endpoint_name.clone()]))
            }
            WorkloadDetail::HyperpodCluster {
                cluster_name,
                instance_group_name,
                life_cycle_config,
            } => {
                let resource = format!("{cluster_name}/{instance_group_name}");
                if !recorded.contains_key(&t.segment) {
                    let group = self
                        .workloads
                        .describe_instance_group(&t.region, cluster_name, instance_group_name)
                        .await?;
                    match group {
                        None => {
                            return Ok(Launch::Refuse(format!(
                                "HyperPod cluster {cluster_name} does not exist in {}",
                                t.region
                            )));
                        }
                        Some(g) if !g.cluster_managed => {
                            return Ok(Launch::Refuse(format!(
                                "HyperPod cluster {cluster_name} does not carry the {MANAGED_TAG} tag; \
                                 capacity-pilot changes no cluster it does not manage"
                            )));
                        }
                        Some(_) => {}
                    }
                    let spec = InstanceGroupSpec {
                        region: t.region.clone(),
                        cluster_name: cluster_name.clone(),
                        instance_group_name: instance_group_name.clone(),
                        instance_type: t.instance_type.clone(),
                        instance_count: t.instance_count,
                        training_plan_arn: t.plan_arn.clone(),
                        execution_role_arn: self.config.sagemaker_execution_role_arn.clone(),
                        life_cycle_source_s3_uri: life_cycle_config
                            .as_ref()
                            .map(|l| l.source_s3_uri.clone()),
                        life_cycle_on_create: life_cycle_config
                            .as_ref()
                            .map(|l| l.on_create.clone()),
                    };
                    if let Err(e) = self.workloads.put_instance_group(&spec).await {
                        return settle(e, &format!("instance group {resource}"));
                    }
                    info!(request_id = %id, reservation_id = %t.reservation_id, instance_group = %resource, "set the instance group on the plan");
                    self.store
                        .put_workload(record(t.segment, resource.clone(), "Updating"))
                        .await?;
                }
                Ok(Launch::Done(vec![resource]))
            }
        }
    }

    // ---- on-demand-first ----------------------------------------------------------------

    async fn try_on_demand(
        &self,
        rec: &RequestRecord,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let req = &rec.request;
        if now < req.window.earliest_start {
            out.decisions.push(Decision::new(
                id,
                "waiting",
                format!(
                    "on-demand-first: the desired start {} has not come",
                    req.window.earliest_start
                ),
            ));
            return Ok(());
        }
        let (Some(instance_type), Some(region)) = (req.instance_types.first(), req.regions.first())
        else {
            return self
                .fail(
                    rec,
                    "the request names no instance type or region".into(),
                    cause,
                    now,
                    out,
                )
                .await;
        };
        let hours = Decimal::from(req.duration_hours) * Decimal::from(req.instance_count);
        let is_ec2 = matches!(req.workload, WorkloadDetail::Ec2Instances { .. });
        let mut attempts = vec![(ON_DEMAND, self.config.prices.on_demand(instance_type))];
        if req.interruptible && is_ec2 {
            attempts.push((SPOT, self.config.prices.spot(instance_type)));
        }
        let mut why_not = Vec::new();
        let mut rec = rec.clone();
        for (label, price) in attempts {
            let Some(price) = price else {
                why_not.push(format!(
                    "no {label} price is configured for {instance_type}, so its spend cannot be estimated"
                ));
                continue;
            };
            let cost = Usd::new(price.amount() * hours);
            // The estimate is held against the caps before anything launches (ARCHITECTURE 4).
            // An estimate already held is an earlier run's for this attempt (the attempts'
            // estimates tell them apart); one held for an earlier attempt was released.
            match rec.open_debit {
                Some(held) if held == cost.to_micros_ceil() => {}
                Some(_) => continue,
                None => {
                    // Both caps are checked by the conditional write itself.
                    let Some(team_cap) = self.config.team_budgets.cap_for(&rec.team) else {
                        why_not.push(format!(
                            "{label}: team {} has no budget configured",
                            rec.team
                        ));
                        continue;
                    };
                    let debit = Debit::of(&rec, team_cap, cost.to_micros_ceil(), now);
                    let reason = format!(
                        "on-demand-first: holding the {label} estimate ${cost} against team {}'s \
                         cap before launching",
                        rec.team
                    );
                    let t = Transition::of(
                        &rec,
                        RequestStatus::TryingOnDemand,
                        &reason,
                        Some(now),
                        now,
                        &cause.step(&format!("hold-{label}")),
                    )
                    .holding(debit);
                    match self.store.transition(t).await? {
                        WriteOutcome::Applied { .. } => {
                            rec = self.reread(&rec).await?;
                            out.decisions.push(Decision::new(id, "held", reason));
                        }
                        WriteOutcome::OverTeamBudget { spent, cap } => {
                            why_not.push(format!(
                                "{label}: the estimate ${cost} would exceed team {}'s cap for \
                                 {}: spent ${} of ${}",
                                rec.team,
                                BudgetMonth::of(now).0,
                                spent.to_usd(),
                                cap.to_usd()
                            ));
                            continue;
                        }
                        WriteOutcome::OverRequestBudget { spent, cap } => {
                            why_not.push(format!(
                                "{label}: the estimate ${cost} would exceed the request's \
                                 max_upfront_usd ${} (spent ${})",
                                cap.to_usd(),
                                spent.to_usd()
                            ));
                            continue;
                        }
                        w @ (WriteOutcome::Conflict | WriteOutcome::DuplicateEvent) => {
                            out.decisions.push(Decision::new(
                                id,
                                decision::written(&w, "held"),
                                "another run moved the request on",
                            ));
                            return Ok(());
                        }
                    }
                }
            }
            let target = Target {
                reservation_id: label.to_string(),
                token_base: format!("{id}:{label}"),
                market: if label == SPOT {
                    LaunchMarket::Spot
                } else {
                    LaunchMarket::OnDemand
                },
                plan_arn: None,
                region: region.clone(),
                instance_type: instance_type.clone(),
                instance_count: req.instance_count,
                availability_zone: None,
                segment: 0,
                must_end_by: now + req.duration(),
            };
            // A crash from here on is repaired by the next tick: the estimate is held, and the
            // launch returns the same instances (same client tokens).
            match self.launch(&rec, &target, now).await? {
                Launch::Done(resource_ids) => {
                    return self
                        .run(&rec, &target, resource_ids, cost, cause, now, out)
                        .await;
                }
                Launch::NoCapacity(why) => {
                    self.undo(&rec, &target, now).await?;
                    let reason = format!(
                        "on-demand-first: {label}: {why}; the held estimate ${cost} is released"
                    );
                    let t = Transition::of(
                        &rec,
                        RequestStatus::TryingOnDemand,
                        &reason,
                        Some(now),
                        now,
                        &cause.step(&format!("release-{label}")),
                    )
                    .settling(Settle::Release);
                    let w = self.store.transition(t).await?;
                    if !matches!(w, WriteOutcome::Applied { .. }) {
                        out.decisions.push(Decision::new(
                            id,
                            decision::written(&w, "released"),
                            "another run moved the request on",
                        ));
                        return Ok(());
                    }
                    rec = self.reread(&rec).await?;
                    why_not.push(format!("{label}: {why}"));
                }
                Launch::Refuse(why) => {
                    self.undo(&rec, &target, now).await?;
                    return self.fail(&rec, why, cause, now, out).await;
                }
                Launch::Starting(why) => {
                    // Stays TryingOnDemand (still due): the next tick sees it placed or failed.
                    out.decisions.push(Decision::new(
                        id,
                        "waiting",
                        format!("on-demand-first: {why}; looking again on the next tick"),
                    ));
                    return Ok(());
                }
            }
        }
        self.fall_back(&rec, why_not.join("; "), cause, now, out)
            .await
    }

    /// The record as the store has it now (after one of our own writes).
    async fn reread(&self, rec: &RequestRecord) -> Result<RequestRecord, PortError> {
        self.store
            .get_request(&rec.request_id)
            .await?
            .ok_or_else(|| PortError::Transient {
                service: "dynamodb",
                code: "Missing".into(),
                message: format!("{} vanished after our own write", rec.request_id),
            })
    }

    /// Whether SageMaker has placed the on-demand training job `name`. CreateTrainingJob
    /// succeeds whatever the capacity; a job without capacity fails minutes later with a
    /// `CapacityError` / `InsufficientCapacityError` FailureReason.
    async fn placed(&self, region: &str, name: &str) -> Result<Launch, PortError> {
        let Some(job) = self.workloads.describe_training_job(region, name).await? else {
            return Ok(Launch::Starting(format!(
                "training job {name} is not visible yet"
            )));
        };
        let reason = job.failure_reason.unwrap_or_default();
        Ok(match job.state {
            JobState::Failed if reason.contains("CapacityError") => Launch::NoCapacity(format!(
                "SageMaker failed training job {name} for capacity ({reason})"
            )),
            JobState::Failed => Launch::Refuse(format!("training job {name} failed: {reason}")),
            JobState::Stopping | JobState::Stopped => Launch::Refuse(format!(
                "training job {name} was stopped before it was placed"
            )),
            JobState::InProgress
                if matches!(
                    job.detail.as_str(),
                    "" | "Starting" | "Pending" | "LaunchingMLInstances"
                ) =>
            {
                Launch::Starting(format!(
                    "training job {name} is {} and has no instances yet",
                    if job.detail.is_empty() {
                        "starting"
                    } else {
                        &job.detail
                    }
                ))
            }
            JobState::InProgress | JobState::Completed => Launch::Done(vec![name.to_string()]),
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn run(
        &self,
        rec: &RequestRecord,
        t: &Target,
        resource_ids: Vec<String>,
        cost: Usd,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let id = &rec.request_id;
        let to = if t.reservation_id == SPOT {
            RequestStatus::RunningSpot
        } else {
            RequestStatus::RunningOnDemand
        };
        let drain = Duration::minutes(i64::from(
            rec.request
                .drain_minutes
                .max(self.config.default_drain_minutes),
        ));
        let ev = WorkloadLaunched {
            event_key: event_key(id.as_str(), "launched-s0", rec.version + 1),
            request_id: id.to_string(),
            reservation_id: t.reservation_id.clone(),
            segment: 0,
            workload_kind: rec.request.workload_kind(),
            resource_ids: resource_ids.clone(),
            planned_start: rec.request.window.earliest_start,
            launched_at: now,
            estimated_cost_usd: Some(cost),
        };
        let reason = format!(
            "on-demand-first: launched {} {} x {} in {}; the estimate ${cost} held against team {} is spent",
            t.reservation_id, t.instance_count, t.instance_type, t.region, rec.team
        );
        let tr = Transition::of(
            rec,
            to,
            &reason,
            Some(t.must_end_by - drain),
            now,
            &cause.step("launch"),
        )
        .with_outbox(vec![outbound(&ev)])
        .settling(Settle::Keep);
        let w = self.store.transition(tr).await?;
        out.decisions
            .push(Decision::new(id, decision::written(&w, "launched"), reason));
        Ok(())
    }

    /// Terminates on-demand or spot instances this request started in `t` (a partial launch
    /// that then found no capacity, or one the budget refused), so nothing runs undebited.
    async fn undo(
        &self,
        rec: &RequestRecord,
        t: &Target,
        now: DateTime<Utc>,
    ) -> Result<(), PortError> {
        if !matches!(rec.request.workload, WorkloadDetail::Ec2Instances { .. }) {
            return Ok(());
        }
        let started: Vec<WorkloadRecord> = self
            .store
            .workloads(&rec.request_id)
            .await?
            .into_iter()
            .filter(|w| w.reservation_id == t.reservation_id && w.state != "terminated")
            .collect();
        if started.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = started.iter().map(|w| w.resource_id.clone()).collect();
        info!(request_id = %rec.request_id, instance_ids = ?ids, "terminating a partial {} launch", t.reservation_id);
        self.workloads.terminate_instances(&t.region, &ids).await?;
        for w in started {
            self.store
                .put_workload(WorkloadRecord {
                    state: "terminated".into(),
                    updated_at: now,
                    ..w
                })
                .await?;
        }
        Ok(())
    }

    async fn fall_back(
        &self,
        rec: &RequestRecord,
        why: String,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let desired = rec.request.window.earliest_start;
        let earliest = now + PURCHASE_LEAD;
        let delay = (earliest - desired).max(Duration::zero());
        let reason = format!(
            "on-demand-first: {why}; falling back to the earliest feasible reservation, which \
             starts no sooner than {earliest}: a start delay of at least {} min after the desired {desired}",
            delay.num_minutes()
        );
        // An estimate still held (the attempt could not be settled as it ran) goes back.
        let t = Transition::of(
            rec,
            RequestStatus::Searching,
            &reason,
            Some(now),
            now,
            &cause.step("fall-back"),
        )
        .settling(Settle::Release);
        let written = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&written, "fell-back"),
            reason,
        ));
        Ok(())
    }

    async fn fail(
        &self,
        rec: &RequestRecord,
        reason: String,
        cause: &Cause,
        now: DateTime<Utc>,
        out: &mut Outcome,
    ) -> Result<(), PortError> {
        let reservation_ids = self
            .store
            .reservations(&rec.request_id)
            .await?
            .into_iter()
            .map(|r| r.id)
            .collect();
        // A held on-demand estimate goes back: nothing of it runs.
        let held = rec.open_debit.map_or(0, |d| d.0);
        let ev = events::RequestFailed {
            event_key: event_key(rec.request_id.as_str(), "failed", rec.version + 1),
            request_id: rec.request_id.to_string(),
            status_before: rec.status,
            reason: reason.clone(),
            reservation_ids,
            spent_usd: MicroUsd(rec.spent.0 - held).to_usd(),
        };
        let t = Transition::of(
            rec,
            RequestStatus::Failed,
            &reason,
            None,
            now,
            &cause.step("fail"),
        )
        .with_outbox(vec![outbound(&ev)])
        .settling(Settle::Release);
        let written = self.store.transition(t).await?;
        out.decisions.push(Decision::new(
            &rec.request_id,
            decision::written(&written, "failed"),
            reason,
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
