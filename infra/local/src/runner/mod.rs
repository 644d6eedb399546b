//! The local runner (ARCHITECTURE section 6): plays a scenario with the real function
//! binaries. It starts the emulator in-process on the scenario's seed and start time, moto's
//! DynamoDB with the template's table, and each function under a Lambda host with the
//! template's environment; then it steps the simulated clock from one moment with work to the
//! next (a schedule tick with due work, the emulator's next transition, the next scenario
//! action), fires the schedules due then, delivers every event to the functions the
//! template's rules name, and finally judges the outcomes from the buses and the emulator.

pub mod bus;
pub mod checks;
pub mod http;
pub mod lambda_host;
pub mod moto;
pub mod report;
pub mod scenario;
pub mod template;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{Value, json};

use crate::rules::{Bus, Rules};
use crate::world::Settings;
use crate::{LocalCloud, Options};
use bus::{LocalBus, event_count, events_since, is_tick, next_tick, tick_at_or_after};
use lambda_host::{Answer, Function, HostEnv};
use report::Timeline;
use scenario::{Scenario, What, substitute};

/// The schedules that poll AWS rather than read due work from the table: replace-unhealthy's
/// reads EC2 status checks (no event reports them), so it has work whenever managed
/// instances run.
pub const POLLS_INSTANCES: &[&str] = &["replace-unhealthy"];

/// How a run finds and places things.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The workspace root (holds `infra/template.yaml`, `.venv`, `tests/support`).
    pub root: PathBuf,
    pub scenario: PathBuf,
    /// Where the function binaries are; `None`: `<cargo metadata target dir>/debug`.
    pub bin_dir: Option<PathBuf>,
    /// Where logs and the report go; `None`: `<target dir>/capacity-pilot`.
    pub out_dir: Option<PathBuf>,
    /// Fire every schedule at every tick instead of only ticks with due work.
    pub every_tick: bool,
    /// Print the timeline as it happens.
    pub print: bool,
}

/// One invocation as the run saw it.
#[derive(Debug, Clone)]
pub struct InvocationRecord {
    pub at: DateTime<Utc>,
    pub function: String,
    /// `Scheduled Event`, or the detail-type of the event delivered.
    pub trigger: String,
    pub ok: bool,
    pub error: Option<String>,
    pub decisions: Vec<Value>,
    /// Events the function put on the custom bus during this invocation.
    pub published: Vec<Value>,
    pub duration: Duration,
    pub peak_rss_kb: u64,
    /// The CPU time the function's process ran for it.
    pub cpu: Duration,
    /// The AWS calls it made, per service (`dynamodb`, `ec2`, `sagemaker`, `events`).
    pub aws_calls: BTreeMap<String, u64>,
}

impl InvocationRecord {
    /// Whether it did nothing: no decision, nothing published, no error.
    pub fn quiet(&self) -> bool {
        self.ok && self.decisions.is_empty() && self.published.is_empty()
    }

    /// Its calls of `service`.
    pub fn calls_of(&self, service: &str) -> u64 {
        self.aws_calls.get(service).copied().unwrap_or(0)
    }
}

/// A function's figures for the run.
#[derive(Debug, Clone)]
pub struct FunctionStats {
    pub name: String,
    pub memory_mb: u64,
    pub init: Duration,
    pub invocations: u64,
    pub errors: u64,
    pub peak_rss_kb: u64,
    pub max_duration: Duration,
    pub total_duration: Duration,
    /// The most CPU time one invocation took, and all of them together.
    pub max_cpu: Duration,
    pub total_cpu: Duration,
    pub log: PathBuf,
}

/// What the run did and found.
pub struct RunResult {
    pub scenario: Scenario,
    pub invocations: Vec<InvocationRecord>,
    pub functions: Vec<FunctionStats>,
    pub checks: Vec<checks::Check>,
    pub timeline: Timeline,
    /// (request id, instance id, when) for each instance the scenario impaired or failed.
    pub broken: Vec<(String, String, DateTime<Utc>)>,
    /// The home region's default bus (AWS's events there and those forwarded to it).
    pub default_events: Vec<Value>,
    pub custom_events: Vec<Value>,
    /// Each region the forwarder was deployed to, with how many of its default bus's events
    /// the run saw there and how many it forwarded to the home region's default bus.
    pub forwarded: Vec<(String, usize, usize)>,
    pub schedule_rates: BTreeMap<String, TimeDelta>,
    pub wall: Duration,
    pub steps: u64,
    pub out_dir: PathBuf,
    /// Where the function binaries came from (`.../debug` or `.../release`).
    pub bin_dir: PathBuf,
    pub summary: Vec<report::RequestSummary>,
}

impl RunResult {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}

/// The target directory cargo uses for this workspace (honours `CARGO_TARGET_DIR`).
pub fn target_dir(root: &Path) -> anyhow::Result<PathBuf> {
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    v["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("cargo metadata names no target_directory"))
}

/// Plays `opts.scenario` to its end and judges it.
pub async fn run(opts: RunOptions) -> anyhow::Result<RunResult> {
    let wall = Instant::now();
    let scenario = Scenario::load(&opts.scenario)?;
    let template_path = opts.root.join("infra/template.yaml");
    let template_text = std::fs::read_to_string(&template_path)
        .with_context(|| format!("reading {}", template_path.display()))?;
    let template: Value = serde_yaml_ng::from_str(&template_text)
        .with_context(|| format!("parsing {}", template_path.display()))?;
    let rules = Rules::from_yaml(&template_text)?;
    // ARCHITECTURE §8.9: the region forwarder, deployed to each allowed region but the home
    // one, forwards our AWS-event patterns from that region's default bus to the home one's.
    // (Read only when the scenario allows another region.)
    let forwarded = scenario.forwarded_regions();
    let forwarder = if forwarded.is_empty() {
        None
    } else {
        let path = opts.root.join("infra/region-forwarder.yaml");
        Some(Rules::from_template(&path).with_context(|| format!("reading {}", path.display()))?)
    };
    let (bin_dir, out_dir) = match (&opts.bin_dir, &opts.out_dir) {
        (Some(b), Some(o)) => (b.clone(), o.clone()),
        (b, o) => {
            let target = target_dir(&opts.root)?;
            (
                b.clone().unwrap_or_else(|| target.join("debug")),
                o.clone().unwrap_or_else(|| target.join("capacity-pilot")),
            )
        }
    };
    let logs = out_dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    // The emulator, on the scenario's seed and clock.
    let mut settings = Settings::default();
    if let Some(changes) = &scenario.settings {
        let mut s = serde_json::to_value(&settings)?;
        for (k, v) in changes.as_object().into_iter().flatten() {
            s[k] = v.clone();
        }
        settings = serde_json::from_value(s).context("the scenario's settings")?;
    }
    // The home region is the scenario's: the functions run there and their buses are there.
    settings.home_region = scenario.region.clone();
    let account_id = settings.account_id.clone();
    let cloud = LocalCloud::start(Options {
        seed: scenario.seed,
        port: 0,
        start: Some(scenario.start),
        settings,
        ..Options::default()
    })
    .await
    .context("starting the emulator")?;
    for m in &scenario.market {
        apply_market(&cloud, m)?;
    }

    // moto and the table.
    let moto = moto::Moto::start(&opts.root, logs.join("moto.log")).await?;
    let table = "capacity-pilot-state";
    moto.create_state_table(&template, table).await?;

    // The functions.
    let bus_name = "capacity-pilot";
    let mut locals = template::Locals::default();
    locals.resources.insert("StateTable".into(), table.into());
    locals.resources.insert("Bus".into(), bus_name.into());
    locals.parameters = scenario.parameters.clone();
    let specs = template::functions(&template, &locals)?;
    let mut extra = BTreeMap::new();
    for service in ["EC2", "SAGEMAKER", "EVENTBRIDGE"] {
        extra.insert(format!("AWS_ENDPOINT_URL_{service}"), cloud.url());
    }
    extra.insert("AWS_ENDPOINT_URL_DYNAMODB".into(), moto.url().to_string());
    extra.insert(
        "CAPACITY_PILOT_CLOCK_URL".into(),
        format!("{}/_local/clock", cloud.url()),
    );
    let host = HostEnv {
        region: scenario.region.clone(),
        account_id: account_id.clone(),
        extra,
    };
    let mut functions: BTreeMap<String, Function> = BTreeMap::new();
    for spec in specs {
        let binary = bin_dir.join(&spec.name);
        if !binary.exists() {
            bail!(
                "{} is missing: build the functions first (cargo build --workspace --bins)",
                binary.display()
            );
        }
        let log = logs.join(format!("{}.log", spec.name));
        let name = spec.name.clone();
        let f = Function::start(spec, &binary, &host, log).await?;
        functions.insert(name, f);
    }

    let mut player = Player {
        cloud,
        moto,
        table: table.to_string(),
        template,
        bus: match forwarder {
            Some(f) => LocalBus::new(rules, bus_name, &scenario.region, &account_id)
                .with_forwarder(f, &forwarded),
            None => LocalBus::new(rules, bus_name, &scenario.region, &account_id),
        },
        functions,
        invocations: Vec::new(),
        timeline: Timeline::new(opts.print),
        broken: Vec::new(),
        every_tick: opts.every_tick,
        steps: 0,
    };
    let played = player.play(&scenario).await;
    let Player {
        cloud,
        moto,
        functions,
        invocations,
        timeline,
        broken,
        bus,
        steps,
        ..
    } = player;
    let mut stats = Vec::new();
    for (name, f) in functions {
        let mine: Vec<&InvocationRecord> =
            invocations.iter().filter(|i| i.function == name).collect();
        stats.push(FunctionStats {
            name: name.clone(),
            memory_mb: f.spec.memory_mb,
            init: f.init,
            invocations: f.invocations(),
            errors: mine.iter().filter(|i| !i.ok).count() as u64,
            peak_rss_kb: mine.iter().map(|i| i.peak_rss_kb).max().unwrap_or(0),
            max_duration: mine.iter().map(|i| i.duration).max().unwrap_or_default(),
            total_duration: mine.iter().map(|i| i.duration).sum(),
            max_cpu: mine.iter().map(|i| i.cpu).max().unwrap_or_default(),
            total_cpu: mine.iter().map(|i| i.cpu).sum(),
            log: f.log.clone(),
        });
        f.stop().await;
    }
    moto.stop().await;
    played?;

    let schedule_rates: BTreeMap<String, TimeDelta> = bus.schedules().into_iter().collect();
    let default_events = cloud.events("default");
    let custom_events = cloud.events(bus_name);
    let forwarded = bus.forwarded_counts();
    let obs = checks::Observed {
        scenario: &scenario,
        cloud: &cloud,
        default_events: &default_events,
        custom_events: &custom_events,
        invocations: &invocations,
        broken: &broken,
        schedule_rates: &schedule_rates,
    };
    let checks = checks::judge(&obs);
    let summary = report::summarize(&obs);
    cloud.stop().await;
    Ok(RunResult {
        bin_dir: bin_dir.clone(),
        scenario,
        invocations,
        functions: stats,
        checks,
        timeline,
        broken,
        default_events,
        custom_events,
        forwarded,
        schedule_rates,
        wall: wall.elapsed(),
        steps,
        out_dir,
        summary,
    })
}

fn apply_market(cloud: &LocalCloud, m: &scenario::MarketChange) -> anyhow::Result<()> {
    cloud.with_world(|w| {
        let t = w
            .market
            .types
            .iter_mut()
            .find(|t| t.name == m.instance_type)
            .ok_or_else(|| anyhow!("the market has no instance type {}", m.instance_type))?;
        if let Some(pool) = m.on_demand_pool {
            t.on_demand_pool = pool;
        }
        Ok(())
    })
}

struct Player {
    cloud: LocalCloud,
    moto: moto::Moto,
    table: String,
    template: Value,
    bus: LocalBus,
    functions: BTreeMap<String, Function>,
    invocations: Vec<InvocationRecord>,
    timeline: Timeline,
    broken: Vec<(String, String, DateTime<Utc>)>,
    every_tick: bool,
    steps: u64,
}

impl Player {
    async fn play(&mut self, scenario: &Scenario) -> anyhow::Result<()> {
        let mut done = vec![false; scenario.actions.len()];
        loop {
            let now = self.cloud.now();
            // The scenario's actions due now, in file order.
            for (i, a) in scenario.actions.iter().enumerate() {
                if done[i] {
                    continue;
                }
                if self.action_time(a).is_some_and(|t| t <= now) {
                    done[i] = true;
                    self.act(&a.what, scenario)?;
                    self.deliver().await?;
                }
            }
            self.deliver().await?;

            // The next moment with something to do.
            let mut next = scenario.end;
            for (i, a) in scenario.actions.iter().enumerate() {
                if !done[i]
                    && let Some(t) = self.action_time(a)
                {
                    next = next.min(t.max(now));
                }
            }
            if let Some(t) = self.cloud.next_transition() {
                next = next.min(t.max(now));
            }
            if let Some(t) = self.next_schedule(now).await? {
                next = next.min(t);
            }
            if now >= scenario.end {
                break;
            }
            if next <= now {
                // An emulator transition or action due now: apply and go round again.
                self.cloud.advance_to(now);
                if self.cloud.next_transition().is_some_and(|t| t <= now)
                    && !scenario
                        .actions
                        .iter()
                        .enumerate()
                        .any(|(i, a)| !done[i] && self.action_time(a).is_some_and(|t| t <= now))
                {
                    bail!(
                        "the emulator keeps a transition due at {now} that advancing does not run"
                    );
                }
                continue;
            }
            self.cloud.advance_to(next);
            self.steps += 1;
            self.deliver().await?;
            self.fire_schedules(next).await?;
        }
        Ok(())
    }

    /// When an action happens: its `at`, or its request's first launch plus the offset.
    fn action_time(&self, a: &scenario::Action) -> Option<DateTime<Utc>> {
        if let Some(at) = a.at {
            return Some(at);
        }
        let after = a.after.as_ref()?;
        let t: DateTime<Utc> = self.cloud.with_world(|w| {
            w.home_events(&self.bus.custom).iter().find(|e| {
                e["detail-type"] == "Capacity Workload Launched"
                    && e["detail"]["request_id"] == after.launched.as_str()
            })?["time"]
                .as_str()?
                .parse()
                .ok()
        })?;
        Some(t + after.offset())
    }

    fn act(&mut self, what: &What, scenario: &Scenario) -> anyhow::Result<()> {
        let now = self.cloud.now();
        match what {
            What::Submit(s) => {
                let mut detail = s.detail.clone();
                let cloud = &self.cloud;
                substitute(&mut detail, &|region| {
                    let region = region.unwrap_or(&scenario.region);
                    cloud.with_world(|w| w.subnets(region).into_iter().map(|s| s.id).collect())
                });
                let entry = json!({"Entries": [{
                    "Source": s.source, "DetailType": s.detail_type,
                    "Detail": detail.to_string(), "EventBusName": self.bus.custom,
                }]});
                let out = self
                    .cloud
                    .with_world(|w| w.events_call(&scenario.region, "PutEvents", &entry))
                    .map_err(|e| anyhow!("PutEvents of a scenario event: {e:?}"))?;
                if out["FailedEntryCount"] != 0 {
                    bail!("PutEvents refused a scenario event: {out}");
                }
                self.timeline.action(
                    now,
                    &format!(
                        "{} puts {} {}",
                        s.source,
                        s.detail_type,
                        detail["request_id"].as_str().unwrap_or("")
                    ),
                );
            }
            What::Impair(target) | What::FailInstance(target) => {
                let impair = matches!(what, What::Impair(_));
                let id = self.cloud.with_world(|w| {
                    let id = live_instance(w, &target.request_id, target.index)?;
                    let r = if impair {
                        w.impair_instance(&id, true)
                    } else {
                        w.fail_instance(&id)
                    };
                    r.ok().map(|_| id)
                });
                let id = id.ok_or_else(|| {
                    anyhow!(
                        "at {now}: request {} has no live instance #{} to {}",
                        target.request_id,
                        target.index,
                        if impair { "impair" } else { "fail" }
                    )
                })?;
                self.timeline.action(
                    now,
                    &format!(
                        "{} instance {id} of {}",
                        if impair {
                            "impairs the status checks of"
                        } else {
                            "stops"
                        },
                        target.request_id
                    ),
                );
                self.broken.push((target.request_id.clone(), id, now));
            }
            What::RetireInstance(r) => {
                let start = now + chrono::TimeDelta::minutes(r.in_minutes);
                let id = self.cloud.with_world(|w| {
                    let id = live_instance(w, &r.request_id, r.index)?;
                    w.health_event(
                        &id,
                        "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
                        Some(chrono::TimeDelta::minutes(r.in_minutes)),
                    )
                    .ok()
                    .map(|_| id)
                });
                let id = id.ok_or_else(|| {
                    anyhow!(
                        "at {now}: request {} has no live instance #{} to retire",
                        r.request_id,
                        r.index
                    )
                })?;
                self.timeline.action(
                    now,
                    &format!(
                        "EC2 schedules the retirement of instance {id} of {} at {start}",
                        r.request_id
                    ),
                );
                // Broken at its retirement: it must be replaced before then.
                self.broken.push((r.request_id.clone(), id, start));
            }
            What::Fault(f) => {
                self.cloud.inject(f.clone());
                self.timeline
                    .action(now, &format!("injects {:?} on {}", f.kind, f.operation));
            }
            What::ClearFaults {} => {
                self.cloud.clear_faults();
                self.timeline.action(now, "clears every fault");
            }
            What::Market(m) => {
                apply_market(&self.cloud, m)?;
                self.timeline
                    .action(now, &format!("changes the market for {}", m.instance_type));
            }
            What::CreateCluster(c) => {
                let region = c.region.as_deref().unwrap_or(&scenario.region);
                let tags: Vec<Value> = c
                    .tags
                    .iter()
                    .map(|(k, v)| json!({"Key": k, "Value": v}))
                    .collect();
                let input = json!({"ClusterName": c.name, "Tags": tags,
                                   "InstanceGroups": c.instance_groups});
                self.cloud
                    .with_world(|w| w.sagemaker_call(region, "CreateCluster", &input))
                    .map_err(|e| anyhow!("CreateCluster {} in {region}: {e:?}", c.name))?;
                self.timeline.action(
                    now,
                    &format!(
                        "creates HyperPod cluster {} in {region} ({} group(s))",
                        c.name,
                        c.instance_groups.len()
                    ),
                );
            }
            What::FailPayments { request_id, count } => {
                self.cloud
                    .with_world(|w| w.force_payment_failures(request_id, *count));
                self.timeline.action(
                    now,
                    &format!(
                        "makes the payment of the next {count} reservation(s) of {request_id} fail"
                    ),
                );
            }
        }
        Ok(())
    }

    /// Hands every new event to the functions its rules name, until no new event arrives.
    async fn deliver(&mut self) -> anyhow::Result<()> {
        loop {
            let new = self.bus.take_new(&self.cloud);
            if new.is_empty() {
                return Ok(());
            }
            for d in new {
                let at = event_time(&d.event).unwrap_or_else(|| self.cloud.now());
                let from = d.event["region"]
                    .as_str()
                    .filter(|r| d.bus == Bus::Default && *r != self.bus.region);
                self.timeline.event(at, d.bus, &d.event, &d.targets, from);
                for f in &d.targets {
                    let trigger = d.event["detail-type"].as_str().unwrap_or("?").to_string();
                    self.invoke(f, &d.event, &trigger).await?;
                }
            }
        }
    }

    /// Invokes `function` with `event`; a failed invocation is retried twice, as Lambda
    /// retries an asynchronous invocation.
    async fn invoke(&mut self, function: &str, event: &Value, trigger: &str) -> anyhow::Result<()> {
        for _attempt in 0..3 {
            let before = event_count(&self.cloud, &self.bus.region, &self.bus.custom);
            let calls_before = self.aws_calls();
            let f = self.functions.get_mut(function).ok_or_else(|| {
                anyhow!("the template routes to {function}, which the runner did not start")
            })?;
            let inv = f.invoke(event).await;
            let published = events_since(&self.cloud, &self.bus.region, &self.bus.custom, before);
            let mut aws_calls = self.aws_calls();
            for (service, n) in aws_calls.iter_mut() {
                *n -= calls_before.get(service).copied().unwrap_or(0);
            }
            aws_calls.retain(|_, n| *n > 0);
            let (ok, error, decisions) = match &inv.answer {
                Answer::Response(v) => (
                    true,
                    None,
                    v["decisions"].as_array().cloned().unwrap_or_default(),
                ),
                Answer::Error(e) => (false, Some(e.clone()), Vec::new()),
            };
            let rec = InvocationRecord {
                at: self.cloud.now(),
                function: function.to_string(),
                trigger: trigger.to_string(),
                ok,
                error,
                decisions,
                published,
                duration: inv.duration,
                peak_rss_kb: inv.peak_rss_kb,
                cpu: inv.cpu,
                aws_calls,
            };
            self.timeline.invocation(&rec);
            self.invocations.push(rec);
            if ok {
                break;
            }
        }
        Ok(())
    }

    /// Every AWS call the functions have made so far, per service: DynamoDB's counted by the
    /// relay in front of moto, the others by the emulator. Invocations run one at a time, so
    /// the difference across one is its own.
    fn aws_calls(&self) -> BTreeMap<String, u64> {
        let mut calls = self.cloud.with_world(|w| w.calls.clone());
        calls.insert("dynamodb".to_string(), self.moto.calls());
        calls
    }

    /// Whether any managed instance is pending or running (a poller has work).
    fn instances_live(&self) -> bool {
        self.cloud.with_world(|w| {
            w.ec2.instances.values().any(|i| {
                (i.state == "running" || i.state == "pending")
                    && i.tags.get("capacity-pilot:managed").map(String::as_str) == Some("true")
            })
        })
    }

    async fn earliest_due(&self) -> anyhow::Result<Option<DateTime<Utc>>> {
        self.moto.earliest_due(&self.table, &self.template).await
    }

    /// The next schedule tick after `now` at which some function has work.
    async fn next_schedule(&self, now: DateTime<Utc>) -> anyhow::Result<Option<DateTime<Utc>>> {
        let due = self.earliest_due().await?;
        let live = self.instances_live();
        let mut best: Option<DateTime<Utc>> = None;
        for (f, every) in self.bus.schedules() {
            let tick = next_tick(now, every);
            let t = if self.every_tick || (live && POLLS_INSTANCES.contains(&f.as_str())) {
                Some(tick)
            } else {
                due.map(|d| tick_at_or_after(d.max(tick), every))
            };
            if let Some(t) = t {
                best = Some(best.map_or(t, |b| b.min(t)));
            }
        }
        Ok(best)
    }

    /// Fires each schedule whose tick is `at` and whose function has work then.
    async fn fire_schedules(&mut self, at: DateTime<Utc>) -> anyhow::Result<()> {
        for (f, every) in self.bus.schedules() {
            if !is_tick(at, every) {
                continue;
            }
            let work = self.every_tick
                || (POLLS_INSTANCES.contains(&f.as_str()) && self.instances_live())
                || self.earliest_due().await?.is_some_and(|d| d <= at);
            if !work {
                continue;
            }
            let ev = self.bus.scheduled_event(&f, at);
            self.invoke(&f, &ev, "Scheduled Event").await?;
            self.deliver().await?;
        }
        Ok(())
    }
}

/// An envelope's `time`.
pub fn event_time(ev: &Value) -> Option<DateTime<Utc>> {
    ev["time"].as_str()?.parse().ok()
}

/// Which bus an event was recorded on, for printing.
pub fn bus_label(bus: Bus) -> &'static str {
    match bus {
        Bus::Default => "default",
        Bus::Custom => "capacity-pilot",
    }
}

/// The `index`th live (running or pending) instance of `request_id`, in launch order.
fn live_instance(w: &crate::World, request_id: &str, index: usize) -> Option<String> {
    let mut live: Vec<_> = w
        .ec2
        .instances
        .values()
        .filter(|i| {
            i.tags.get("capacity-pilot:request-id").map(String::as_str) == Some(request_id)
                && (i.state == "running" || i.state == "pending")
        })
        .map(|i| (i.launch_time, i.launch_index, i.id.clone()))
        .collect();
    live.sort();
    live.get(index).map(|(_, _, id)| id.clone())
}
