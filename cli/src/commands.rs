//! The commands. Each reads through the functions' own code: the request parser and the
//! deployment's configuration reader, the catalogue, `DynamoStore`'s reads, the window model
//! and the approval key the purchase function checks.

use std::collections::BTreeSet;
use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_eventbridge::error::ProvideErrorMetadata;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use chrono::NaiveTime;
use clap::Args;
use comfy_table::Cell;
use serde_json::{Value, json};

use capacity_pilot::aws::dynamodb::DynamoStore;
use capacity_pilot::config::DEFAULT_DRAIN_MINUTES;
use capacity_pilot::domain::catalog::{PriceTable, SupportedInstanceTypes, accelerators};
use capacity_pilot::domain::events::inbound as detail_type;
use capacity_pilot::domain::money::{MicroUsd, Usd};
use capacity_pilot::domain::request::{
    RequestId, Team, ValidationContext, WorkloadKind, parse_request,
};
use capacity_pilot::domain::reservation::Reservation;
use capacity_pilot::domain::status::RequestStatus;
use capacity_pilot::domain::window::{self, DrainLead, KeptWindow, WindowState};
use capacity_pilot::ports::{BudgetMonth, RequestRecord, Store};
use capacity_pilot::purchase::approval;

use crate::Global;
use crate::deployment::{self, Deployment};
use crate::extend;
use crate::fail::{Fail, Result};
use crate::new::{self as newreq, NewRequest};
use crate::show::{Out, micro, usd, when, when_opt};

/// The template's `AllowedRegions` default, used to validate without a stack.
pub const DEFAULT_REGIONS: [&str; 3] = ["us-east-1", "us-east-2", "us-west-2"];

// ---------------------------------------------------------------------------------------
// types, new
// ---------------------------------------------------------------------------------------

pub fn types(out: &Out, gpu: Option<&str>) -> Result<()> {
    let catalogue = SupportedInstanceTypes::default();
    let rows = newreq::types(&catalogue, &PriceTable::default(), gpu);
    if rows.is_empty() {
        return Err(Fail::NotFound(format!(
            "no instance type carries {:?}; known accelerators: {}",
            gpu.unwrap_or_default(),
            newreq::known_accelerators(&catalogue).join(", ")
        )));
    }
    if out.json() {
        out.print_json(&json!(rows));
        return Ok(());
    }
    let mut t = out.table(&[
        "GPU",
        "MODEL",
        "PER INSTANCE",
        "TYPE",
        "PRODUCT",
        "ON DEMAND /H",
    ]);
    for r in &rows {
        t.add_row(vec![
            Cell::new(&r.accelerator),
            Cell::new(&r.model),
            Cell::new(r.per_instance),
            Cell::new(&r.instance_type),
            Cell::new(r.product),
            Cell::new(
                r.on_demand_usd_per_hour
                    .map(usd)
                    .unwrap_or_else(|| "-".into()),
            ),
        ]);
    }
    out.print_table(&mut t);
    println!(
        "\n{}",
        crate::show::paragraph(
            "capacity-block types run ec2-instances; training-plan types run training-job, \
         hyperpod-cluster and inference-endpoint (`new --kind`). A request searches its \
         regions, else the stack's AllowedRegions; which types a region sells varies, so the \
         search asks AWS. A deployment may narrow the types (parameter SupportedInstanceTypes); \
         prices are illustrative list prices (parameter OnDemandPricesUsd)."
        )
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct NewArgs {
    /// Accelerators and how many in all: H100:16, B200:8, Trainium2:32.
    #[arg(long)]
    gpus: String,
    /// How long, in hours: whole days (48 for 2 days).
    #[arg(long)]
    hours: u32,
    /// The earliest start, a UTC date (from 00:00 UTC) or RFC 3339 time.
    #[arg(long)]
    start: String,
    /// The latest end, a UTC date (until 11:30 UTC, when reservations end) or RFC 3339 time.
    #[arg(long)]
    by: String,
    /// The team whose monthly budget pays.
    #[arg(long)]
    team: Option<String>,
    /// What runs in the capacity.
    #[arg(long, value_enum, default_value = "ec2-instances")]
    kind: Kind,
    /// The request id (default: <team>-<accelerator>-<start date>).
    #[arg(long)]
    id: Option<String>,
    /// The most it may spend up front, in USD (default: the on-demand price of the same hours).
    #[arg(long)]
    budget: Option<String>,
    /// Purchases above this many USD wait for an approver (`budget.approval_above_usd`).
    #[arg(long)]
    approve_above: Option<String>,
    /// A tag for everything bought and launched, KEY=VALUE (repeat).
    #[arg(long = "tag", value_parser = key_value)]
    tags: Vec<(String, String)>,
    /// A region to search (repeat; default: the stack's AllowedRegions).
    #[arg(long = "search-region")]
    regions: Vec<String>,
    /// Two back-to-back reservations are acceptable.
    #[arg(long)]
    allow_split: bool,
    /// Only plan: search and announce the plans, buy nothing, end Planned (`mode: plan`).
    #[arg(long)]
    plan_only: bool,
    /// Launch on demand now; reserve only if there is no capacity.
    #[arg(long)]
    on_demand_first: bool,
    /// The warning the workload wants before it must stop, in minutes.
    #[arg(long)]
    drain_minutes: Option<u32>,
    /// ec2-instances: the launch template's name.
    #[arg(long)]
    launch_template: Option<String>,
    /// ec2-instances: subnet ids, comma-separated (one per zone to allow).
    #[arg(long, value_delimiter = ',')]
    subnets: Vec<String>,
    /// training-job: the training image URI.
    #[arg(long)]
    image: Option<String>,
    /// training-job: where the model goes (s3://bucket/prefix).
    #[arg(long)]
    output_s3: Option<String>,
    /// training-job: the training volume in GB.
    #[arg(long)]
    volume_gb: Option<u32>,
    /// training-job: a hyperparameter, KEY=VALUE (repeat).
    #[arg(long = "hyper-parameter", value_parser = key_value)]
    hyper_parameters: Vec<(String, String)>,
    /// inference-endpoint: the SageMaker model.
    #[arg(long)]
    model: Option<String>,
    /// inference-endpoint: the endpoint's name.
    #[arg(long)]
    endpoint: Option<String>,
    /// hyperpod-cluster: the cluster's name.
    #[arg(long)]
    cluster: Option<String>,
    /// hyperpod-cluster: the instance group to create in it.
    #[arg(long)]
    group: Option<String>,
}

/// `KEY=VALUE`.
fn key_value(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("{s:?}: give KEY=VALUE")),
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Kind {
    Ec2Instances,
    TrainingJob,
    HyperpodCluster,
    InferenceEndpoint,
}

impl From<Kind> for WorkloadKind {
    fn from(k: Kind) -> WorkloadKind {
        match k {
            Kind::Ec2Instances => WorkloadKind::Ec2Instances,
            Kind::TrainingJob => WorkloadKind::TrainingJob,
            Kind::HyperpodCluster => WorkloadKind::HyperpodCluster,
            Kind::InferenceEndpoint => WorkloadKind::InferenceEndpoint,
        }
    }
}

/// Writes the request as JSON on stdout (whatever `--output`: it is a file to edit and
/// submit), and what it chose on stderr.
pub fn new(_out: &Out, a: NewArgs) -> Result<()> {
    let (gpu, gpus) = newreq::parse_gpus(&a.gpus)?;
    let budget_usd = match &a.budget {
        None => None,
        Some(b) => {
            Some(Usd::parse_positive(b).map_err(|e| Fail::Usage(format!("--budget {b:?} {e}")))?)
        }
    };
    let approve_above_usd = match &a.approve_above {
        None => None,
        Some(b) => {
            Some(Usd::parse(b).map_err(|e| Fail::Usage(format!("--approve-above {b:?} {e}")))?)
        }
    };
    let n = NewRequest {
        approve_above_usd,
        tags: a.tags.into_iter().collect(),
        volume_size_gb: a.volume_gb,
        hyper_parameters: a.hyper_parameters.into_iter().collect(),
        gpu,
        gpus,
        hours: a.hours,
        start: newreq::parse_when("--start", &a.start, NaiveTime::MIN)?,
        by: newreq::parse_when(
            "--by",
            &a.by,
            NaiveTime::from_hms_opt(11, 30, 0).unwrap_or_default(),
        )?,
        team: a.team,
        kind: a.kind.into(),
        request_id: a.id,
        budget_usd,
        regions: a.regions,
        allow_split: a.allow_split,
        on_demand_first: a.on_demand_first,
        plan_only: a.plan_only,
        drain_minutes: a.drain_minutes,
        launch_template: a.launch_template,
        subnet_ids: a.subnets,
        image: a.image,
        output_s3_uri: a.output_s3,
        model_name: a.model,
        endpoint_name: a.endpoint,
        cluster_name: a.cluster,
        instance_group_name: a.group,
    };
    let (v, text, said) = newreq::request(
        &n,
        &SupportedInstanceTypes::default(),
        &PriceTable::default(),
    )?;
    println!("{text}");
    for line in said {
        eprintln!("# {line}");
    }
    let left: Vec<String> = capacity_pilot::domain::request::placeholders(&v)
        .into_iter()
        .map(|(_, what)| what)
        .collect();
    if !left.is_empty() {
        eprintln!("# fill in before submitting: {}", left.join(", "));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Connecting
// ---------------------------------------------------------------------------------------

/// What a command that talks to the deployment holds.
pub(crate) struct Conn {
    pub(crate) sdk: SdkConfig,
    pub(crate) dep: Deployment,
    pub(crate) store: DynamoStore,
    pub(crate) now: chrono::DateTime<chrono::Utc>,
}

pub(crate) async fn connect(g: &Global) -> Result<Conn> {
    let sdk = deployment::sdk(g).await?;
    let dep = Deployment::resolve(g, &sdk).await?;
    let now = deployment::now().await?;
    let store = dep.store(&sdk);
    store.begin_run(now);
    Ok(Conn {
        sdk,
        dep,
        store,
        now,
    })
}

impl Conn {
    pub(crate) async fn request(&self, id: &str) -> Result<RequestRecord> {
        let rid =
            RequestId::parse(id).map_err(|m| Fail::Usage(format!("request id {id:?}: {m}")))?;
        match self.store.get_request(&rid).await.map_err(Fail::store)? {
            Some(r) => Ok(r),
            None if let Some(r) = self
                .store
                .rejections(&rid)
                .await
                .map_err(Fail::store)?
                .pop() =>
            {
                Err(Fail::NotFound(format!(
                    "no request {id:?} is recorded: its submission (event {}, from {}) was \
                     rejected at {}:\n{}\n  fix each field and submit again",
                    r.event_id,
                    r.source,
                    when(r.at),
                    r.problems
                        .iter()
                        .map(|p| format!("  {}: {}", p.field, p.message))
                        .collect::<Vec<_>>()
                        .join("\n")
                )))
            }
            None => Err(Fail::NotFound(format!(
                "no request {id:?} in the table {} ({}; requests are kept 90 days after \
                 they end): check the id with `capacity-pilot list`",
                self.dep.table, self.dep.region
            ))),
        }
    }

    pub(crate) fn drain_lead(&self, rec: &RequestRecord) -> DrainLead {
        let default = self
            .dep
            .config
            .as_ref()
            .map_or(DEFAULT_DRAIN_MINUTES, |c| c.default_drain_minutes);
        DrainLead::of(&rec.request, default)
    }

    /// The request's windows with their times, as the cancellation answers list them.
    async fn windows(&self, rec: &RequestRecord) -> Result<Vec<KeptWindow>> {
        let held = self.held(rec).await?;
        Ok(self.windows_of(rec, &held))
    }

    /// The request's reservations as recorded, their extensions with them.
    pub(crate) async fn held(&self, rec: &RequestRecord) -> Result<Vec<Reservation>> {
        self.store
            .reservations(&rec.request_id)
            .await
            .map_err(Fail::store)
    }

    /// The windows of the request's reservations `held`, with their times.
    fn windows_of(&self, rec: &RequestRecord, held: &[Reservation]) -> Vec<KeptWindow> {
        window::listed(&window::windows(held, &rec.windows, self.drain_lead(rec)))
    }

    /// Puts one event on the bus; a failed entry fails the command (the AWS CLI exits 0).
    pub(crate) async fn put(
        &self,
        source: &str,
        detail_type: &str,
        detail: &Value,
        approver: bool,
    ) -> Result<String> {
        let client = aws_sdk_eventbridge::Client::new(&self.sdk);
        let entry = PutEventsRequestEntry::builder()
            .event_bus_name(&self.dep.bus)
            .source(source)
            .detail_type(detail_type)
            .detail(detail.to_string())
            .build();
        let no_approvers = approver
            && self.dep.stack.is_some()
            && self.dep.parameter("ApproverPrincipals").is_none();
        let denied = |message: String| {
            if no_approvers {
                Fail::Refused(format!(
                    "the bus refused the decision: no approver principals configured \
                     (ApproverPrincipals): {message}\n  ask the stack's operators to set the \
                     parameter ApproverPrincipals to your role"
                ))
            } else if approver {
                Fail::Refused(format!(
                    "the bus refused the decision: {message}\n  only the stack's \
                     ApproverPrincipals may put source {source:?}: use an approver's role"
                ))
            } else {
                Fail::Refused(format!(
                    "the bus refused the event: {message}\n  use a role in the stack's \
                     BusPutPrincipals with the RequesterPolicy"
                ))
            }
        };
        let out = client.put_events().entries(entry).send().await.map_err(|e| {
            let code = e.code().unwrap_or_default().to_string();
            let message = e.message().unwrap_or_default().to_string();
            if code.contains("AccessDenied") || code.contains("NotAuthorized") {
                denied(format!("{code}: {message}"))
            } else if code == "ResourceNotFoundException" {
                Fail::NotFound(format!("no event bus {:?}: {message}\n  check --stack or --bus", self.dep.bus))
            } else {
                Fail::Aws(format!(
                    "PutEvents failed: {}\n  nothing was sent; check your credentials and try again",
                    if code.is_empty() { format!("{e:?}") } else { format!("{code}: {message}") }
                ))
            }
        })?;
        let entry = out.entries().first();
        if out.failed_entry_count() > 0 || entry.and_then(|e| e.event_id()).is_none() {
            let code = entry
                .and_then(|e| e.error_code())
                .unwrap_or("unknown")
                .to_string();
            let message = entry
                .and_then(|e| e.error_message())
                .unwrap_or_default()
                .to_string();
            return Err(
                if code.contains("AccessDenied") || code.contains("NotAuthorized") {
                    denied(format!("{code}: {message}"))
                } else {
                    Fail::Aws(format!(
                        "the bus did not take the event ({code}: {message})\n  nothing was sent; try again"
                    ))
                },
            );
        }
        Ok(entry
            .and_then(|e| e.event_id())
            .unwrap_or_default()
            .to_string())
    }

    pub(crate) fn source(&self, given: &Option<String>, parameter: &str) -> Result<String> {
        given
            .clone()
            .or_else(|| self.dep.first_source(parameter))
            .ok_or_else(|| {
                Fail::Usage(format!(
                    "no source to put the event as: pass --source (one of the stack's {parameter})"
                ))
            })
    }
}

// ---------------------------------------------------------------------------------------
// submit
// ---------------------------------------------------------------------------------------

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The request, JSON or YAML; `-` reads stdin.
    file: String,
    /// Follow it until it is recorded (Accepted) or --timeout passes.
    #[arg(long)]
    wait: bool,
    /// Seconds --wait waits.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// The event's source (default: the first of the stack's AllowedRequestSources).
    #[arg(long)]
    source: Option<String>,
}

/// Reads a request file (JSON, or YAML of the same shape).
pub fn read_request(file: &str) -> Result<Value> {
    let text = if file == "-" {
        std::io::read_to_string(std::io::stdin())
            .map_err(|e| Fail::Usage(format!("reading stdin: {e}")))?
    } else {
        std::fs::read_to_string(file)
            .map_err(|e| Fail::NotFound(format!("cannot read {file}: {e}")))?
    };
    let read = match serde_json::from_str::<Value>(&text) {
        Ok(v) => Ok(v),
        Err(json_err) => {
            serde_yaml_ng::from_str::<Value>(&text).map_err(|yaml_err| Fail::Invalid {
                file: file.to_string(),
                problems: vec![capacity_pilot::domain::request::FieldError {
                    field: "detail".into(),
                    message: format!("is neither JSON ({json_err}) nor YAML ({yaml_err})"),
                }],
            })
        }
    };
    read.map(unwrap_envelope)
}

/// A whole EventBridge event (`detail-type` and `detail`, as the samples under
/// `infra/events/requests/` are) is read as its detail: the request.
fn unwrap_envelope(v: Value) -> Value {
    match v {
        Value::Object(mut m) if m.contains_key("detail-type") && m["detail"].is_object() => {
            m.remove("detail").unwrap_or_default()
        }
        other => other,
    }
}

pub async fn submit(g: &Global, out: &Out, a: SubmitArgs) -> Result<()> {
    let detail = read_request(&a.file)?;
    let c = connect(g).await?;
    let source = c.source(&a.source, "AllowedRequestSources")?;
    // The functions' own checks, with the deployment's configuration.
    let defaults = SupportedInstanceTypes::default();
    let default_regions: Vec<String> = match c.dep.parameter("AllowedRegions") {
        Some(r) => r
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        None => DEFAULT_REGIONS.iter().map(|s| s.to_string()).collect(),
    };
    let (types, regions) = match &c.dep.config {
        Some(cfg) => (&cfg.instance_types, &cfg.allowed_regions),
        None => (&defaults, &default_regions),
    };
    let ctx = ValidationContext {
        now: c.now,
        instance_types: types,
        allowed_regions: regions,
    };
    let invalid = |problems| Fail::Invalid {
        file: a.file.clone(),
        problems,
    };
    let request = parse_request(&detail, &ctx).map_err(invalid)?;
    match &c.dep.config {
        Some(cfg) => {
            let refused = cfg
                .team_budgets
                .submission_problem(&request.team)
                .or_else(|| cfg.team_source_problem(&request.team, &source));
            if let Some(p) = refused {
                return Err(invalid(vec![p]));
            }
        }
        None => eprintln!(
            "note: checked against {}; the deployment checks it again",
            c.dep.settings_from()
        ),
    }
    let event_id = c
        .put(&source, detail_type::REQUEST_SUBMITTED, &detail, false)
        .await?;
    let id = request.id.to_string();
    if out.json() && !a.wait {
        out.print_json(
            &json!({"request_id": id, "event_id": event_id, "bus": c.dep.bus, "source": source}),
        );
    } else if !out.json() {
        println!(
            "submitted {id} (event {event_id}) to the bus {} as {source}",
            c.dep.bus
        );
    }
    if !a.wait {
        if !out.json() {
            println!("follow it: capacity-pilot watch {id}");
        }
        return Ok(());
    }
    // Recorded (Accepted, or further on), or rejected: the search function keeps a
    // rejection's reasons under the id, by the event it rejected.
    let answer = poll(
        out,
        a.timeout,
        &format!("waiting for {id} to be accepted or rejected"),
        || async {
            c.store.begin_run(deployment::now().await?);
            if let Some(rec) = c
                .store
                .get_request(&request.id)
                .await
                .map_err(Fail::store)?
            {
                return Ok(Some(Ok(rec)));
            }
            let rejected = c.store.rejections(&request.id).await.map_err(Fail::store)?;
            Ok(rejected
                .into_iter()
                .find(|r| r.event_id == event_id)
                .map(Err))
        },
    )
    .await?
    .ok_or_else(|| {
        Fail::Aws(format!(
            "{id} was neither accepted nor rejected within {} s: the search function has not \
             taken it yet; look again with `capacity-pilot status {id}`",
            a.timeout
        ))
    })?;
    match answer {
        Ok(rec) if out.json() => out.print_json(&status_json(&rec, &[], &[])),
        Ok(rec) => println!("{id} is {}: {}", rec.status.as_str(), rec.reason),
        Err(rejected) => {
            return Err(Fail::Invalid {
                file: format!(
                    "{} (rejected by the deployment at {})",
                    a.file,
                    when(rejected.at)
                ),
                problems: rejected.problems,
            });
        }
    }
    Ok(())
}

/// Polls `read` every 2 s until it gives something or `timeout` seconds pass, showing a
/// spinner on a terminal.
async fn poll<T, F, Fut>(out: &Out, timeout: u64, what: &str, mut read: F) -> Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let bar = out.progress.then(|| {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_message(what.to_string());
        b.enable_steady_tick(Duration::from_millis(120));
        b
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(timeout);
    let found = loop {
        if let Some(t) = read().await? {
            break Some(t);
        }
        if std::time::Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(found)
}

// ---------------------------------------------------------------------------------------
// status, list, history, watch
// ---------------------------------------------------------------------------------------

/// What the request waits for next, in words.
fn next_action(rec: &RequestRecord, windows: &[KeptWindow]) -> String {
    if rec.status == RequestStatus::AwaitingApproval {
        return format!(
            "waiting for an approver: capacity-pilot approve {0} (or reject {0})",
            rec.request_id
        );
    }
    let by_window = rec
        .windows
        .iter()
        .filter_map(|w| w.next_action_at.map(|t| (t, w)))
        .min_by_key(|(t, _)| *t);
    let own = rec.next_action_at;
    match (by_window, own) {
        (Some((t, w)), o) if o.is_none_or(|o| t <= o) => {
            let what = match w.state {
                WindowState::Pending => "launch",
                WindowState::Launching | WindowState::Running => "drain",
                WindowState::Stopping => "finish draining",
                WindowState::Draining => "clean up",
                WindowState::Ended => "look at",
            };
            let _ = windows;
            format!("{what} window {} at {}", w.number, when(t))
        }
        (_, Some(t)) => format!("{} looks again at {}", owner(rec.status), when(t)),
        _ if rec.archivable() => "none: it has ended".into(),
        _ => "none scheduled".into(),
    }
}

/// Which function acts on a request in `s` at its next action.
fn owner(s: RequestStatus) -> &'static str {
    use RequestStatus::*;
    match s {
        Accepted | Searching | NotFound => "search-offerings",
        OfferingsFound | Purchasing | AwaitingApproval | Reserved => "purchase-capacity",
        TryingOnDemand | RunningOnDemand | RunningSpot => "launch-workloads",
        _ => "cleanup-expired",
    }
}

fn status_json(rec: &RequestRecord, windows: &[KeptWindow], resources: &[Value]) -> Value {
    json!({
        "request_id": rec.request_id,
        "team": rec.team,
        "status": rec.status,
        "reason": rec.reason,
        "next_action": next_action(rec, windows),
        "next_action_at": rec.next_step_at(),
        "instance_types": rec.request.instance_types,
        "instance_count": rec.request.instance_count,
        "duration_hours": rec.request.duration_hours,
        "earliest_start": rec.request.window.earliest_start,
        "latest_end": rec.request.window.latest_end,
        "windows": windows,
        "resources": resources,
        "spent_usd": rec.spent.to_usd(),
        "max_upfront_usd": rec.request.budget.max_upfront,
        "awaiting_approval": awaiting_json(rec),
        "created_at": rec.created_at,
        "updated_at": rec.updated_at,
    })
}

fn awaiting_json(rec: &RequestRecord) -> Value {
    match (approval::awaiting(rec), awaiting_fee(rec)) {
        (Some(key), Some(fee)) => json!({"approves": key, "upfront_fee_usd": fee}),
        _ => Value::Null,
    }
}

/// What approving would let be spent: the plan's fee, or the hold's estimate.
fn awaiting_fee(rec: &RequestRecord) -> Option<Usd> {
    approval::awaiting(rec)?;
    match approval::hold_awaiting(rec) {
        Some((_, asked)) => Some(asked.estimate),
        None => rec.candidates.first().map(|p| p.upfront_fee),
    }
}

pub async fn status(g: &Global, out: &Out, id: &str) -> Result<()> {
    let c = connect(g).await?;
    let rec = c.request(id).await?;
    let bought = c.held(&rec).await?;
    let windows = c.windows_of(&rec, &bought);
    let slots = c
        .store
        .workloads(&rec.request_id)
        .await
        .map_err(Fail::store)?;
    let resources: Vec<Value> = slots
        .iter()
        .map(|w| json!({"resource_id": w.resource_id, "state": w.state, "reservation_id": w.reservation_id, "slot": w.slot, "generation": w.generation}))
        .collect();
    // ARCHITECTURE §9.7: the deployment's pause, which holds back every new purchase.
    let pause = c.store.read_pause().await.map_err(Fail::store)?;
    // A request the pause holds back waits for `resume`, not for its recorded next action.
    let held = pause.as_ref().is_some_and(|p| p.told(&rec.reason));
    let next = if held {
        "held back by the pause: bought at the purchase function's first run after \
         `capacity-pilot resume`, if it still can be"
            .to_string()
    } else {
        next_action(&rec, &windows)
    };
    if out.json() {
        let mut v = status_json(&rec, &windows, &resources);
        v["next_action"] = json!(next);
        v["purchases_paused"] = serde_json::to_value(&pause).unwrap_or(Value::Null);
        v["extend"] = extend::policy_json(&rec, &bought);
        v["extensions"] = extend::json(&bought);
        out.print_json(&v);
        return Ok(());
    }
    let r = &rec.request;
    let gpus = accelerators(&r.instance_types[0])
        .map(|(a, n)| format!(" ({} {a})", n * r.instance_count))
        .unwrap_or_default();
    let mut t = out.fields();
    t.add_row(vec![Cell::new("request"), Cell::new(&rec.request_id)]);
    t.add_row(vec![Cell::new("status"), out.status(rec.status)]);
    t.add_row(vec!["reason", &rec.reason]);
    t.add_row(vec!["next".to_string(), next]);
    if let Some(p) = &pause {
        t.add_row(vec![
            Cell::new("paused"),
            out.warn(format!(
                "purchases are {}; nothing new is bought until `capacity-pilot resume`",
                p.describe()
            )),
        ]);
    }
    t.add_row(vec!["team".to_string(), rec.team.to_string()]);
    t.add_row(vec![
        "asks".to_string(),
        format!(
            "{} x {}{gpus} for {} h, between {} and {}",
            r.instance_count,
            r.instance_types.join(" | "),
            r.duration_hours,
            when(r.window.earliest_start),
            when(r.window.latest_end)
        ),
    ]);
    t.add_row(vec![
        "spent".to_string(),
        format!(
            "{} of at most {} up front",
            micro(rec.spent),
            usd(r.budget.max_upfront)
        ),
    ]);
    if let Some(line) = extend::policy_line(&rec, &bought) {
        t.add_row(vec!["extend".to_string(), line]);
    }
    if let (Some(key), Some(fee)) = (approval::awaiting(&rec), awaiting_fee(&rec)) {
        t.add_row(vec![
            "awaiting".to_string(),
            format!("{} (key {key})", awaiting_what(&rec, fee)),
        ]);
    }
    for (r, e, key) in extend::awaiting(&bought) {
        t.add_row(vec![
            "awaiting".to_string(),
            format!(
                "{}, approved by {} at the latest (key {key})",
                extend::what(r, e),
                when(e.buy_by)
            ),
        ]);
    }
    out.print_table(&mut t);
    if !windows.is_empty() {
        let mut w = out.table(&[
            "WINDOW",
            "STATE",
            "RESERVATION",
            "STARTS",
            "DRAIN AT",
            "ENDS",
        ]);
        for k in &windows {
            w.add_row(vec![
                k.window.to_string(),
                k.state.as_str().to_string(),
                k.reservation_id.clone(),
                when(k.starts_at),
                when(k.drain_at),
                when(k.ends_at),
            ]);
        }
        println!();
        out.print_table(&mut w);
    }
    if let Some(mut x) = extend::table(out, &bought) {
        println!();
        out.print_table(&mut x);
    }
    if !slots.is_empty() {
        let mut s = out.table(&["RESOURCE", "STATE", "IN", "REPLACEMENTS"]);
        for w in &slots {
            s.add_row(vec![
                w.resource_id.clone(),
                w.state.clone(),
                w.reservation_id.clone(),
                w.generation.to_string(),
            ]);
        }
        println!();
        out.print_table(&mut s);
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this team's (any case).
    #[arg(long)]
    team: Option<String>,
    /// Only requests in this status (Accepted, Reserved, Active, Failed, ...).
    #[arg(long)]
    status: Option<String>,
    /// Only requests still live: not ended, or holding a window not yet ended.
    #[arg(long)]
    live: bool,
}

pub async fn list(g: &Global, out: &Out, a: ListArgs) -> Result<()> {
    let status = match &a.status {
        None => None,
        Some(s) => Some(parse_status(s)?),
    };
    let team = match &a.team {
        None => None,
        Some(t) => Some(
            Team::parse(t)
                .map_err(|m| Fail::Usage(format!("--team {t:?}: {m}")))?
                .ledger(),
        ),
    };
    let c = connect(g).await?;
    let mut all = c.store.list_requests().await.map_err(Fail::store)?;
    all.retain(|r| {
        team.as_ref().is_none_or(|t| r.team.ledger() == *t)
            && status.is_none_or(|s| r.status == s)
            && (!a.live || !r.archivable())
    });
    all.sort_by(|x, y| {
        x.created_at
            .cmp(&y.created_at)
            .then(x.request_id.cmp(&y.request_id))
    });
    if out.json() {
        let rows: Vec<Value> = all
            .iter()
            .map(|r| json!({
                "request_id": r.request_id, "team": r.team, "status": r.status,
                "workload_kind": r.request.workload_kind(), "instance_types": r.request.instance_types,
                "instance_count": r.request.instance_count, "duration_hours": r.request.duration_hours,
                "spent_usd": r.spent.to_usd(), "next_action_at": r.next_step_at(),
                "created_at": r.created_at, "updated_at": r.updated_at,
            }))
            .collect();
        out.print_json(&json!(rows));
        return Ok(());
    }
    if all.is_empty() {
        println!(
            "no requests{}",
            if a.team.is_some() || a.status.is_some() || a.live {
                " match"
            } else {
                " are recorded"
            }
        );
        return Ok(());
    }
    let mut t = out.table(&["REQUEST", "TEAM", "STATUS", "ASKS", "SPENT", "NEXT ACTION"]);
    for r in &all {
        t.add_row(vec![
            Cell::new(&r.request_id),
            Cell::new(&r.team),
            out.status(r.status),
            Cell::new(format!(
                "{} x {}, {} h",
                r.request.instance_count, r.request.instance_types[0], r.request.duration_hours
            )),
            Cell::new(micro(r.spent)),
            Cell::new(when_opt(r.next_step_at())),
        ]);
    }
    out.print_table(&mut t);
    Ok(())
}

fn parse_status(s: &str) -> Result<RequestStatus> {
    let all = RequestStatus::ALL;
    all.iter()
        .copied()
        .find(|x| x.as_str().eq_ignore_ascii_case(s.trim()))
        .ok_or_else(|| {
            Fail::Usage(format!(
                "--status {s:?} is no status; one of: {}",
                all.iter()
                    .map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

pub async fn history(g: &Global, out: &Out, id: &str) -> Result<()> {
    let c = connect(g).await?;
    let rec = c.request(id).await?;
    let entries = c
        .store
        .history(&rec.request_id)
        .await
        .map_err(Fail::store)?;
    if out.json() {
        let rows: Vec<Value> = entries.iter().map(history_json).collect();
        out.print_json(&json!(rows));
        return Ok(());
    }
    let mut t = out.table(&["AT", "FROM", "TO", "REASON"]);
    for e in &entries {
        t.add_row(vec![
            Cell::new(when(e.at)),
            Cell::new(e.from.map(|f| f.as_str()).unwrap_or("-")),
            out.status(e.to),
            Cell::new(&e.reason),
        ]);
    }
    out.print_table(&mut t);
    Ok(())
}

fn history_json(e: &capacity_pilot::ports::HistoryEntry) -> Value {
    json!({"version": e.version, "at": e.at, "from": e.from, "to": e.to, "reason": e.reason, "cause": e.cause})
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    request_id: String,
    /// Seconds between looks.
    #[arg(long, default_value_t = 10)]
    interval: u64,
}

/// Prints each state change as it is recorded (JSON lines when piped) until the request has
/// ended with every window ended, or Ctrl-C.
pub async fn watch(g: &Global, out: &Out, a: WatchArgs) -> Result<()> {
    let c = connect(g).await?;
    let mut shown = 0u64;
    loop {
        c.store.begin_run(deployment::now().await?);
        let rec = c.request(&a.request_id).await?;
        for e in c
            .store
            .history(&rec.request_id)
            .await
            .map_err(Fail::store)?
        {
            if e.version <= shown {
                continue;
            }
            shown = e.version;
            if out.json() {
                println!("{}", history_json(&e));
            } else {
                println!(
                    "{}",
                    crate::show::hanging(
                        &format!("{}  {:<18}", when(e.at), e.to.as_str()),
                        &e.reason
                    )
                );
            }
        }
        if rec.archivable() {
            if !out.json() {
                println!(
                    "{} has ended ({}){}",
                    rec.request_id,
                    rec.status.as_str(),
                    if rec.windows.is_empty() {
                        ""
                    } else {
                        ", and every window of it"
                    }
                );
            }
            return Ok(());
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs(a.interval.max(1))) => {}
        }
    }
}

// ---------------------------------------------------------------------------------------
// budget
// ---------------------------------------------------------------------------------------

#[derive(Debug, Args)]
pub struct BudgetArgs {
    /// Only this team (any case).
    #[arg(long)]
    team: Option<String>,
    /// The month, YYYY-MM (default: this month, UTC).
    #[arg(long)]
    month: Option<String>,
}

pub async fn budget(g: &Global, out: &Out, a: BudgetArgs) -> Result<()> {
    let c = connect(g).await?;
    let month = match &a.month {
        None => BudgetMonth::of(c.now),
        Some(m) => {
            let ok = m.len() == 7
                && chrono::NaiveDate::parse_from_str(&format!("{m}-01"), "%Y-%m-%d").is_ok();
            if !ok {
                return Err(Fail::Usage(format!(
                    "--month {m:?}: give YYYY-MM, such as 2026-12"
                )));
            }
            BudgetMonth(m.clone())
        }
    };
    let Some(cfg) = &c.dep.config else {
        return Err(Fail::Usage(format!(
            "budget needs the stack's TeamBudgetsUsd: it reads {}; pass --stack",
            c.dep.settings_from()
        )));
    };
    let recorded = c.store.list_requests().await.map_err(Fail::store)?;
    let mut teams: BTreeSet<String> = BTreeSet::new();
    match &a.team {
        Some(t) => {
            teams.insert(
                Team::parse(t)
                    .map_err(|m| Fail::Usage(format!("--team {t:?}: {m}")))?
                    .ledger()
                    .to_string(),
            );
        }
        None => {
            teams.extend(cfg.team_budgets.caps.keys().cloned());
            teams.extend(recorded.iter().map(|r| r.team.ledger().to_string()));
        }
    }
    let mut rows = Vec::new();
    for team in &teams {
        let t = Team::parse(team).map_err(|m| Fail::Usage(format!("team {team:?}: {m}")))?;
        let cap = cfg.team_budgets.cap_for(&t);
        let spent = c
            .store
            .budget_spent(&t, &month)
            .await
            .map_err(Fail::store)?;
        // Debits still open: a purchase under way, or an on-demand hold not yet settled.
        let held: i64 = recorded
            .iter()
            .filter(|r| r.team.ledger() == t && !r.status.is_terminal())
            .filter_map(|r| r.open_debit.map(|d| d.0))
            .sum();
        let left = cap.map(|cap| MicroUsd(cap.to_micros_ceil().0 - spent.0));
        rows.push((team.clone(), cap, spent, MicroUsd(held), left));
    }
    if out.json() {
        let v: Vec<Value> = rows
            .iter()
            .map(|(team, cap, spent, held, left)| {
                json!({
                    "team": team, "month": month.0, "cap_usd": cap, "spent_usd": spent.to_usd(),
                    "held_usd": held.to_usd(), "left_usd": left.map(|l| l.to_usd()),
                })
            })
            .collect();
        out.print_json(&json!(v));
        return Ok(());
    }
    let mut t = out.table(&["TEAM", "MONTH", "CAP", "SPENT", "OF WHICH HELD", "LEFT"]);
    for (team, cap, spent, held, left) in &rows {
        t.add_row(vec![
            team.clone(),
            month.0.clone(),
            cap.map(usd).unwrap_or_else(|| "none: may not spend".into()),
            micro(*spent),
            micro(*held),
            left.map(micro).unwrap_or_else(|| "-".into()),
        ]);
    }
    out.print_table(&mut t);
    println!(
        "\n{}",
        crate::show::paragraph(
            "Spent counts every debit of the month, held ones included (a purchase under way, \
             an on-demand hold); a failed payment is returned."
        )
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// approve, reject
// ---------------------------------------------------------------------------------------

#[derive(Debug, Args)]
pub struct DecideArgs {
    request_id: String,
    /// Do not ask: needs --key or --max-fee, and refuses (exit 6) if the plan differs.
    #[arg(long)]
    yes: bool,
    /// The `approves` key of the Awaiting Approval this answers, a purchase's or an
    /// extension's (`status` shows it).
    #[arg(long)]
    key: Option<String>,
    /// Refuse (exit 6) if what waits for approval costs more than this, in USD.
    #[arg(long)]
    max_fee: Option<String>,
    /// A note kept with the decision.
    #[arg(long)]
    comment: Option<String>,
    /// The event's source (default: the first of the stack's ApproverSources).
    #[arg(long)]
    source: Option<String>,
}

/// What approving would let be bought or held, in words.
fn awaiting_what(rec: &RequestRecord, fee: Usd) -> String {
    match (approval::hold_awaiting(rec), rec.candidates.first()) {
        (Some((run, _)), _) => format!(
            "an {} run of {} x {} for {} h, estimated {}",
            run.attempt,
            rec.request.instance_count,
            rec.request.instance_types[0],
            rec.request.duration_hours,
            usd(fee)
        ),
        (None, Some(p)) => format!(
            "{} x {} ({}) in {}, {} to {}, for {}{}",
            p.instance_count,
            p.instance_type,
            p.product,
            p.region,
            when(p.start),
            when(p.end),
            usd(p.upfront_fee),
            p.saving
                .map(|s| format!(" (saves {} against on demand)", usd(s)))
                .unwrap_or_default()
        ),
        (None, None) => usd(fee),
    }
}

/// What a decision answers: the request's plan (or hold), or an extension of one of its
/// reservations, which waits on the reservation's record under a key of its own.
enum Awaiting {
    Plan {
        key: String,
    },
    Extension {
        key: String,
        reservation_id: String,
        number: u32,
        buy_by: chrono::DateTime<chrono::Utc>,
    },
}

pub async fn decide(g: &Global, out: &Out, a: DecideArgs, approve: bool) -> Result<()> {
    let verb = if approve { "approve" } else { "reject" };
    if a.yes && a.key.is_none() && a.max_fee.is_none() {
        return Err(Fail::Usage(format!(
            "{verb} --yes needs --key KEY or --max-fee USD, so that it answers only the plan you meant"
        )));
    }
    if !a.yes && !out.interactive {
        return Err(Fail::Usage(format!(
            "{verb} asks on a terminal; elsewhere pass --yes with --key KEY or --max-fee USD"
        )));
    }
    let max_fee = match &a.max_fee {
        None => None,
        Some(f) => Some(Usd::parse(f).map_err(|e| Fail::Usage(format!("--max-fee {f:?} {e}")))?),
    };
    let c = connect(g).await?;
    let source = c.source(&a.source, "ApproverSources")?;
    let rec = c.request(&a.request_id).await?;
    let held = c.held(&rec).await?;
    let extensions = extend::awaiting(&held);
    let plan = approval::awaiting(&rec).zip(awaiting_fee(&rec));
    let named = a
        .key
        .as_deref()
        .and_then(|k| extensions.iter().find(|(_, _, key)| *key == k));
    let keys = || {
        extensions
            .iter()
            .map(|(r, e, k)| format!("  extension {} of {}: key {k}", e.number, r.id))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let pick = match (named, &a.key, &plan) {
        (Some(x), _, _) => Some(*x),
        (None, Some(k), _) if k.contains(":extension-") => {
            return Err(Fail::Refused(format!(
                "no extension of {} awaits approval under the key --key names ({k}){}\n  \
                 nothing was sent; look at it with `capacity-pilot status {}`",
                rec.request_id,
                if extensions.is_empty() {
                    String::new()
                } else {
                    format!("; awaiting now:\n{}", keys())
                },
                rec.request_id
            )));
        }
        (None, _, Some(_)) => None,
        (None, None, None) if extensions.len() == 1 => Some(extensions[0]),
        (None, None, None) if extensions.len() > 1 => {
            return Err(Fail::Usage(format!(
                "several extensions of {} await approval; name one with --key:\n{}",
                rec.request_id,
                keys()
            )));
        }
        (None, _, None) => {
            return Err(Fail::Refused(format!(
                "{} is {}, not awaiting approval: nothing to {verb} ({}){}",
                rec.request_id,
                rec.status.as_str(),
                rec.reason,
                if extensions.is_empty() {
                    String::new()
                } else {
                    format!("\n  an extension awaits approval:\n{}", keys())
                }
            )));
        }
    };
    let (awaits, fee, what) = match (pick, plan) {
        (Some((r, e, key)), _) => (
            Awaiting::Extension {
                key: key.to_string(),
                reservation_id: r.id.clone(),
                number: e.number,
                buy_by: e.buy_by,
            },
            e.offer.fee,
            extend::what(r, e),
        ),
        (None, Some((key, fee))) => (Awaiting::Plan { key }, fee, awaiting_what(&rec, fee)),
        (None, None) => unreachable!("a decision without a plan has an extension"),
    };
    let key = match &awaits {
        Awaiting::Plan { key } => {
            if let Some(k) = &a.key
                && !(k == key
                    || k.strip_prefix(key.as_str())
                        .is_some_and(|v| v.starts_with(":v")))
            {
                return Err(Fail::Refused(format!(
                    "the plan awaiting approval is not the one --key names: it is now {what}, \
                     key {key}\n  nothing was sent; look at it with `capacity-pilot status {}`",
                    rec.request_id
                )));
            }
            key.clone()
        }
        Awaiting::Extension { key, buy_by, .. } => {
            if approve && c.now > *buy_by {
                return Err(Fail::Refused(format!(
                    "{what} had to be approved by {}, the payment lead before its window's \
                     drain: purchase-capacity would refuse the approval\n  nothing was sent; \
                     it fails on its own, and the window drains as planned",
                    when(*buy_by)
                )));
            }
            key.clone()
        }
    };
    if let Some(m) = max_fee
        && fee > m
    {
        return Err(Fail::Refused(format!(
            "what awaits approval costs {}, more than --max-fee {}: {what}\n  nothing was sent",
            usd(fee),
            usd(m)
        )));
    }
    let kind = match awaits {
        Awaiting::Plan { .. } => "purchase",
        Awaiting::Extension { .. } => "extension",
    };
    if !a.yes {
        eprintln!("{} awaits approval:\n  {what}", rec.request_id);
        let ok = dialoguer::Confirm::new()
            .with_prompt(format!(
                "{} this {kind}?",
                if approve { "Approve" } else { "Reject" }
            ))
            .default(false)
            .interact()
            .map_err(|e| Fail::Usage(format!("could not ask: {e}")))?;
        if !ok {
            eprintln!("nothing was sent");
            return Ok(());
        }
    }
    let sts = aws_sdk_sts::Client::new(&c.sdk);
    let me = sts.get_caller_identity().send().await.map_err(|e| {
        Fail::Aws(format!(
            "sts:GetCallerIdentity failed ({}): the decision must name its approver\n  check your credentials",
            e.code().unwrap_or("unknown")
        ))
    })?;
    let approver = me.arn().unwrap_or_default().to_string();
    let mut detail = json!({"request_id": rec.request_id, "approver": approver, "approves": key});
    if let Some(comment) = &a.comment {
        detail["comment"] = json!(comment);
    }
    let dt = if approve {
        detail_type::PURCHASE_APPROVED
    } else {
        detail_type::PURCHASE_REJECTED
    };
    let event_id = c.put(&source, dt, &detail, true).await?;
    if out.json() {
        let mut v = json!({"request_id": rec.request_id, "decision": verb, "approves": key, "approver": approver, "event_id": event_id, "upfront_fee_usd": fee});
        if let Awaiting::Extension {
            reservation_id,
            number,
            ..
        } = &awaits
        {
            v["extension"] = json!({"reservation_id": reservation_id, "extension": number});
        }
        out.print_json(&v);
    } else {
        println!(
            "{} {}:\n  {what}\n  sent as event {event_id} by {approver}",
            if approve { "approved" } else { "rejected" },
            rec.request_id
        );
        if let Awaiting::Extension { .. } = awaits {
            println!(
                "purchase-capacity {}; follow it: capacity-pilot status {}",
                if approve {
                    "buys it and answers Capacity Reservation Extended once AWS takes the \
                     payment, or Capacity Extension Failed"
                } else {
                    "fails it (Capacity Extension Failed): nothing is bought"
                },
                rec.request_id
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// cancel
// ---------------------------------------------------------------------------------------

#[derive(Debug, Args)]
pub struct CancelArgs {
    request_id: String,
    /// Also stop the paid windows now, through their drain (ARCHITECTURE §9.1).
    #[arg(long)]
    stop_running: bool,
    /// Why, kept with the cancellation.
    #[arg(long)]
    reason: Option<String>,
    /// Cancel an id no request holds yet: the cancellation waits 7 days for its submission.
    #[arg(long)]
    before_submit: bool,
    /// Follow it until the request's status changes or --timeout passes.
    #[arg(long)]
    wait: bool,
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// The event's source (default: the first of the stack's AllowedRequestSources).
    #[arg(long)]
    source: Option<String>,
}

pub async fn cancel(g: &Global, out: &Out, a: CancelArgs) -> Result<()> {
    let c = connect(g).await?;
    let source = c.source(&a.source, "AllowedRequestSources")?;
    let rec = match c.request(&a.request_id).await {
        Ok(r) => Some(r),
        Err(Fail::NotFound(_)) if a.before_submit => None,
        Err(Fail::NotFound(m)) => {
            return Err(Fail::NotFound(format!(
                "{m}\n  to cancel a request not yet submitted, pass --before-submit"
            )));
        }
        Err(e) => return Err(e),
    };
    let windows = match &rec {
        Some(r) => c.windows(r).await?,
        None => vec![],
    };
    let kept: Vec<&KeptWindow> = windows.iter().filter(|w| w.state.is_undrained()).collect();
    let mut detail = json!({"request_id": a.request_id});
    if let Some(r) = &a.reason {
        detail["reason"] = json!(r);
    }
    if a.stop_running {
        detail["stop_running"] = json!(true);
    }
    let event_id = c
        .put(&source, detail_type::REQUEST_CANCELLED, &detail, false)
        .await?;
    let before = rec.as_ref().map(|r| (r.status, r.version));
    let mut after: Option<RequestRecord> = None;
    if a.wait
        && let Some((_, version)) = before
    {
        let rid = RequestId::parse(&a.request_id).map_err(Fail::Usage)?;
        after = poll(
            out,
            a.timeout,
            &format!("waiting for {} to answer", a.request_id),
            || async {
                c.store.begin_run(deployment::now().await?);
                Ok(c.store
                    .get_request(&rid)
                    .await
                    .map_err(Fail::store)?
                    .filter(|r| r.version > version || r.cancel.is_some()))
            },
        )
        .await?;
    }
    if out.json() {
        out.print_json(&json!({
            "request_id": a.request_id, "event_id": event_id, "status_before": before.map(|b| b.0),
            "status": after.as_ref().map(|r| r.status), "reason": after.as_ref().map(|r| r.reason.clone()),
            "stop_running": a.stop_running, "kept_windows": if a.stop_running { vec![] } else { kept.clone() },
            "stopping_windows": if a.stop_running { kept.clone() } else { vec![] },
        }));
        return Ok(());
    }
    match before {
        None => println!(
            "cancellation sent for {} (event {event_id}): no request holds the id yet; its submission within 7 days from this source is recorded cancelled",
            a.request_id
        ),
        Some((s, _)) => println!(
            "cancellation sent for {} (event {event_id}); it was {}.\nWhat is not yet bought \
             stops; purchase-capacity answers Capacity Cancellation Applied or Refused.",
            a.request_id,
            s.as_str()
        ),
    }
    if !kept.is_empty() {
        if a.stop_running {
            println!("stopping now, through their drain:");
        } else {
            println!("these paid windows run on to their drain (--stop-running stops them now):");
        }
        for w in &kept {
            println!(
                "  window {} ({}) drains at {}, ends {}",
                w.window,
                w.reservation_id,
                when(w.drain_at),
                when(w.ends_at)
            );
        }
    }
    match (&after, a.wait) {
        (Some(r), _) => println!(
            "{} is now {}: {}",
            r.request_id,
            r.status.as_str(),
            r.reason
        ),
        (None, true) if before.is_some() => {
            return Err(Fail::Aws(format!(
                "{} did not change within {} s; look with `capacity-pilot status {}`",
                a.request_id, a.timeout, a.request_id
            )));
        }
        _ => {}
    }
    Ok(())
}
