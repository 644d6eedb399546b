//! The local runner (ARCHITECTURE section 6): plays a scenario with the real function
//! binaries. It starts the emulator in-process on the scenario's seed and start time, moto's
//! DynamoDB with the template's table (or uses a moto already started, with a table of the
//! scenario's), registers the stack as CloudFormation would show it (the template's
//! parameters and evaluated outputs), and each function under a Lambda host with the
//! template's environment; then it steps the simulated clock from one moment with work to the
//! next (a schedule tick with due work, the emulator's next transition, the next scenario
//! action), fires the schedules due then, delivers every event to the functions the
//! template's rules name, writes those a rule sends to a log group to `<out_dir>/events.log`
//! (one JSON line each, as EventBridge writes an event to CloudWatch Logs), runs the
//! `capacity-pilot` CLI when the scenario says, and finally judges the outcomes from the buses
//! and the emulator.

pub mod bus;
pub mod checks;
pub mod http;
pub mod lambda_host;
pub mod moto;
pub mod report;
pub mod scenario;
pub mod template;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{Value, json};

use crate::cloudformation::Stack;
use crate::rules::{Bus, Rules};
use crate::world::Settings;
use crate::{LocalCloud, Options};
use bus::{LocalBus, event_count, events_since, is_tick, next_tick, tick_at_or_after};
use lambda_host::{Answer, Function, HostEnv};
use report::Timeline;
use scenario::{CliCall, SUBMITTED, Scenario, What, substitute, substitute_args};

/// The schedules that poll AWS rather than read due work from the table: replace-unhealthy's
/// reads EC2 status checks (no event reports them), so it has work whenever managed
/// instances run.
pub const POLLS_INSTANCES: &[&str] = &["replace-unhealthy"];

/// The CLI's binary, built with the functions by `cargo build --workspace --bins`.
pub const CLI_BINARY: &str = "capacity-pilot";

/// The longest one `cli` action may run (real time) before the run fails.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(120);

/// The outputs the deployed stack must show: what the CLI reads to find the bus and the table.
pub const REQUIRED_OUTPUTS: &[&str] = &["BusName", "BusArn", "StateTableName", "StateTableArn"];

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
    /// What the notices topic received, oldest first (`GET /_local/sns/messages`).
    pub notices: Vec<Value>,
    /// The stack as the emulator's CloudFormation showed it at the end.
    pub stack: Option<crate::cloudformation::DeployedStack>,
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

/// Plays `opts.scenario` to its end and judges it, with a moto of its own.
pub async fn run(opts: RunOptions) -> anyhow::Result<RunResult> {
    run_with(opts, None).await
}

/// Plays `opts.scenario` to its end and judges it, on `moto` when given (started by the
/// caller, which may play several scenarios on it one after another: each gets a fresh table
/// named after the scenario), else on a moto of its own (table `capacity-pilot-state`),
/// stopped at the end.
pub async fn run_with(
    opts: RunOptions,
    moto: Option<Arc<moto::Moto>>,
) -> anyhow::Result<RunResult> {
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
    // This run's CLI commands only (the log is appended to command by command), and this
    // run's events only (likewise, event by event).
    let _ = std::fs::remove_file(logs.join("cli.log"));
    let event_log = out_dir.join(EVENT_LOG);
    let _ = std::fs::remove_file(&event_log);

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

    // moto and the table: a fresh one per scenario on a shared moto.
    let (moto, own_moto, table) = match moto {
        Some(m) => {
            let table = shared_table_name(&scenario.name);
            m.drop_table(&table).await?;
            (m, false, table)
        }
        None => (
            Arc::new(moto::Moto::start(&opts.root, logs.join("moto.log")).await?),
            true,
            "capacity-pilot-state".to_string(),
        ),
    };
    moto.create_state_table(&template, &table).await?;

    // The stack, as CloudFormation shows it, and the functions.
    let bus_name = "capacity-pilot";
    let mut locals = template::Locals::default();
    locals.resources.insert("StateTable".into(), table.clone());
    locals.resources.insert("Bus".into(), bus_name.into());
    // The notices topic (ARCHITECTURE §9.2): what it receives is on each request's timeline.
    let notices_topic = cloud
        .create_sns_topic(&scenario.region, "capacity-pilot-notices")
        .map_err(|e| anyhow!("creating the notices topic: {e:?}"))?;
    locals
        .resources
        .insert("NoticesTopic".into(), notices_topic.clone());
    locals.parameters = scenario.parameters.clone();
    locals.stack_name = Some(template::LOCAL_STACK_NAME.to_string());
    locals.stack_id = Some(template::local_stack_id(
        &scenario.region,
        &account_id,
        template::LOCAL_STACK_NAME,
    ));
    locals.region = Some(scenario.region.clone());
    locals.account_id = Some(account_id.clone());
    deploy_stack(&cloud, &template, &locals, &scenario)?;
    let specs = template::functions(&template, &locals)?;
    let mut extra = BTreeMap::new();
    for service in ["EC2", "SAGEMAKER", "EVENTBRIDGE", "SNS"] {
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
    let cli = CliEnv {
        binary: bin_dir.join(CLI_BINARY),
        root: opts.root.clone(),
        out_dir: out_dir.clone(),
        log: logs.join("cli.log"),
        cloud_url: cloud.url(),
        moto_url: moto.url().to_string(),
        region: scenario.region.clone(),
    };
    if scenario.uses_cli() && !cli.binary.exists() {
        bail!(
            "{} is missing: the scenario runs the CLI; build it first (cargo build --workspace --bins)",
            cli.binary.display()
        );
    }
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
        table,
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
        cli,
        down: BTreeMap::new(),
        held: Vec::new(),
        event_log,
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
    if own_moto && let Ok(moto) = Arc::try_unwrap(moto) {
        moto.stop().await;
    }
    played?;

    let schedule_rates: BTreeMap<String, TimeDelta> = bus.schedules().into_iter().collect();
    let default_events = cloud.events("default");
    let custom_events = cloud.events(bus_name);
    let notices = cloud.sns_messages();
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
    let stack = cloud.with_world(|w| {
        w.stacks_in(&scenario.region)
            .into_iter()
            .find(|s| s.stack.name == template::LOCAL_STACK_NAME)
            .cloned()
    });
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
        notices,
        stack,
    })
}

/// The file under the run's output directory that stands for the template's event log
/// (`EventLog`): each event its rule matches, one JSON line, oldest first.
pub const EVENT_LOG: &str = "events.log";

/// Appends `event` to the event log at `path` as one line: the whole envelope, as EventBridge
/// writes it to a CloudWatch Logs log group (the log event's message is the event's JSON).
pub fn append_event(path: &Path, event: &Value) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(file, "{}", serde_json::to_string(event)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The state table of a scenario played on a shared moto: named after it (DynamoDB's table
/// name characters only).
pub fn shared_table_name(scenario: &str) -> String {
    let name: String = scenario
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("capacity-pilot-state-{name}")
}

/// Registers in the emulator's home region the stack a deployment of the template leaves:
/// named [`template::LOCAL_STACK_NAME`], with the id the functions see as `AWS::StackId`,
/// every parameter's value (the scenario's, else the template's `Default`) and the
/// template's `Outputs` evaluated with the same locals as the functions' environment (those
/// the runner cannot evaluate, such as the alarm topic it does not emulate, are left out;
/// [`REQUIRED_OUTPUTS`] must be there).
fn deploy_stack(
    cloud: &LocalCloud,
    template: &Value,
    locals: &template::Locals,
    scenario: &Scenario,
) -> anyhow::Result<()> {
    let parameters = template::stack_parameters(template, &scenario.parameters)
        .context("deploying the stack")?;
    let (outputs, skipped) = template::stack_outputs(template, locals);
    for required in REQUIRED_OUTPUTS {
        if !outputs.iter().any(|o| o.key == *required) {
            let why = skipped
                .iter()
                .find(|(k, _)| k == required)
                .map_or("the template's Outputs has none", |(_, why)| why.as_str());
            bail!("the stack's output {required} is missing: {why}");
        }
    }
    for (key, why) in &skipped {
        tracing::debug!(key, why, "stack output left out");
    }
    let stack = Stack {
        name: locals
            .stack_name
            .clone()
            .unwrap_or_else(|| template::LOCAL_STACK_NAME.to_string()),
        description: template["Description"]
            .as_str()
            .map(|d| d.trim().to_string()),
        parameters,
        outputs,
        tags: BTreeMap::new(),
        id: locals.stack_id.clone(),
    };
    cloud
        .with_world(|w| w.put_stack(&scenario.region, stack))
        .map_err(|e| anyhow!("registering the stack: {e}"))?;
    Ok(())
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

/// What a `cli` action runs with.
struct CliEnv {
    binary: PathBuf,
    /// The command's working directory (the workspace root).
    root: PathBuf,
    out_dir: PathBuf,
    /// `<out_dir>/logs/cli.log`: every command line, its output and exit code.
    log: PathBuf,
    cloud_url: String,
    moto_url: String,
    region: String,
}

impl CliEnv {
    /// The command's environment: the emulator as every AWS service but DynamoDB (moto's,
    /// through the relay that counts writes) and as the clock, the scenario's region, the
    /// caller's keys, no colours, and nothing else of the user's but `HOME` and `PATH` (no
    /// profile, config or credentials file).
    fn env(&self, access_key_id: &str, secret: &str) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = ["HOME", "PATH", "RUST_BACKTRACE"]
            .into_iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect();
        for (k, v) in [
            ("AWS_ENDPOINT_URL", self.cloud_url.clone()),
            ("AWS_ENDPOINT_URL_DYNAMODB", self.moto_url.clone()),
            ("AWS_REGION", self.region.clone()),
            ("AWS_DEFAULT_REGION", self.region.clone()),
            ("AWS_ACCESS_KEY_ID", access_key_id.to_string()),
            ("AWS_SECRET_ACCESS_KEY", secret.to_string()),
            ("AWS_CONFIG_FILE", "/dev/null".to_string()),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null".to_string()),
            ("AWS_EC2_METADATA_DISABLED", "true".to_string()),
            (
                "CAPACITY_PILOT_CLOCK_URL",
                format!("{}/_local/clock", self.cloud_url),
            ),
            ("NO_COLOR", "1".to_string()),
        ] {
            env.push((k.to_string(), v));
        }
        env
    }
}

/// What one run of the CLI did.
#[derive(Debug, Clone)]
pub struct CliRun {
    /// Its exit code; -1 when a signal ended it.
    pub code: i32,
    /// How it ended, as the OS says (`exit status: 2`, `signal: 9`).
    pub status: String,
    pub stdout: String,
    pub stderr: String,
}

impl CliEnv {
    /// Runs the CLI with `args` to its end (at most [`CLI_TIMEOUT`]) in the workspace root,
    /// signing with these keys.
    async fn exec(
        &self,
        args: &[String],
        access_key_id: &str,
        secret: &str,
    ) -> anyhow::Result<CliRun> {
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.args(args)
            .current_dir(&self.root)
            .env_clear()
            .envs(self.env(access_key_id, secret))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(CLI_TIMEOUT, cmd.output())
            .await
            .map_err(|_| anyhow!("did not finish within {CLI_TIMEOUT:?}"))?
            .with_context(|| format!("running {}", self.binary.display()))?;
        Ok(CliRun {
            code: output.status.code().unwrap_or(-1),
            status: output.status.to_string(),
            stdout: String::from_utf8_lossy(&output.stdout).to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).to_string(),
        })
    }
}

/// Whether a CLI run is what its action expects: its exit code, every `expect_stdout`
/// substring on stdout, and, when the action names a `request_id`, a `Capacity Request
/// Submitted` for it among the events it `put` on the custom bus. The error shows the exit
/// code, stdout and stderr.
pub fn cli_verdict(c: &CliCall, ran: &CliRun, put: &[Value], bus: &str) -> anyhow::Result<()> {
    let shown = || {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            ran.stdout.trim_end(),
            ran.stderr.trim_end()
        )
    };
    if ran.code != c.exit {
        bail!(
            "exited {} ({}), expected {}\n{}",
            ran.code,
            ran.status,
            c.exit,
            shown()
        );
    }
    let missing: Vec<&String> = c
        .expect_stdout
        .iter()
        .filter(|s| !ran.stdout.contains(s.as_str()))
        .collect();
    if !missing.is_empty() {
        bail!(
            "(exit {}) did not print {missing:?} on stdout\n{}",
            ran.code,
            shown()
        );
    }
    if let Some(id) = &c.request_id {
        let submitted = put
            .iter()
            .any(|e| e["detail-type"] == SUBMITTED && e["detail"]["request_id"] == id.as_str());
        if !submitted {
            bail!(
                "(exit {}) put no {SUBMITTED} for request {id} on the {bus} bus\n{}",
                ran.code,
                shown()
            );
        }
    }
    Ok(())
}

/// The access key id a `cli` action's `as:` caller signs with (registered in the emulator's
/// STS with that ARN): `AKIA` and 16 characters derived from the ARN, as IAM's are.
pub fn access_key_for(arn: &str) -> String {
    let hex = crate::util::hex_id("", &[arn, "access-key"]).to_uppercase();
    format!("AKIA{}", &hex[..16])
}

/// A command line as a shell would take it back (arguments with spaces or quotes quoted).
pub fn command_line(program: &str, args: &[String]) -> String {
    let mut line = program.to_string();
    for a in args {
        line.push(' ');
        let plain = !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c));
        if plain {
            line.push_str(a);
        } else {
            line.push('\'');
            line.push_str(&a.replace('\'', "'\\''"));
            line.push('\'');
        }
    }
    line
}

struct Player {
    cloud: LocalCloud,
    moto: Arc<moto::Moto>,
    table: String,
    template: Value,
    bus: LocalBus,
    functions: BTreeMap<String, Function>,
    invocations: Vec<InvocationRecord>,
    timeline: Timeline,
    broken: Vec<(String, String, DateTime<Utc>)>,
    every_tick: bool,
    steps: u64,
    cli: CliEnv,
    /// Functions down until the time given (the scenario's `outage`).
    down: BTreeMap<String, DateTime<Utc>>,
    /// Events routed to a function while it was down, with their trigger: EventBridge
    /// retries them, delivered once it is back.
    held: Vec<(String, Value, String)>,
    /// `<out_dir>/events.log`: every event a rule of the template writes to a log group.
    event_log: PathBuf,
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
                    self.act(&a.what, scenario).await?;
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
            // A function coming back takes the events held for it.
            if let Some(t) = self.down.values().filter(|t| **t > now).min() {
                next = next.min(*t);
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
            self.redeliver().await?;
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
            let events = w.home_events(&self.bus.custom);
            match (&after.launched, &after.opens) {
                (Some(id), _) => events.iter().find(|e| {
                    e["detail-type"] == "Capacity Workload Launched"
                        && e["detail"]["request_id"] == id.as_str()
                })?["time"]
                    .as_str()?
                    .parse()
                    .ok(),
                (None, Some(id)) => events.iter().find(|e| {
                    e["detail-type"] == "Capacity Reserved"
                        && e["detail"]["request_id"] == id.as_str()
                })?["detail"]["start"]
                    .as_str()?
                    .parse()
                    .ok(),
                (None, None) => None,
            }
        })?;
        Some(t + after.offset())
    }

    async fn act(&mut self, what: &What, scenario: &Scenario) -> anyhow::Result<()> {
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
            What::CreateModel(m) => {
                let region = m.region.as_deref().unwrap_or(&scenario.region);
                let input = json!({"ModelName": m.name});
                self.cloud
                    .with_world(|w| w.sagemaker_call(region, "CreateModel", &input))
                    .map_err(|e| anyhow!("CreateModel {} in {region}: {e:?}", m.name))?;
                self.timeline.action(
                    now,
                    &format!("creates SageMaker model {} in {region}", m.name),
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
            What::Extend(x) => {
                let done = self.cloud.with_world(|w| {
                    let live = live_reservations(w, &x.request_id);
                    let Some(r) = live.get(x.index) else {
                        return Err(format!(
                            "has no live reservation #{} to extend ({} live)",
                            x.index,
                            live.len()
                        ));
                    };
                    match r {
                        Reservation::Block(id) => w
                            .extend_block(id, x.hours)
                            .map(|e| {
                                format!(
                                    "Capacity Block {id}: extension {}, to end {} once paid",
                                    e.status,
                                    e.end.format("%m-%d %H:%M")
                                )
                            })
                            .map_err(|e| format!("Capacity Block {id} was not extended: {e}")),
                        Reservation::Plan(region, name) => w
                            .extend_plan(region, name, x.hours)
                            .map(|e| {
                                format!(
                                    "training plan {name}: payment {}, to end {} once paid at {}",
                                    e.payment_status(),
                                    e.end.format("%m-%d %H:%M"),
                                    e.paid_at.format("%m-%d %H:%M")
                                )
                            })
                            .map_err(|e| format!("training plan {name} was not extended: {e}")),
                    }
                });
                let what = done.map_err(|e| anyhow!("at {now}: request {} {e}", x.request_id))?;
                self.timeline.action(
                    now,
                    &format!(
                        "the team of {} extends it by {} h by hand (console): {what}",
                        x.request_id, x.hours
                    ),
                );
            }
            What::FailExtensionPayment(x) => {
                let done = self.cloud.with_world(|w| {
                    let live = live_reservations(w, &x.request_id);
                    let Some(r) = live.get(x.index) else {
                        return Err(format!(
                            "has no live reservation #{} whose extension payment could fail ({} live)",
                            x.index,
                            live.len()
                        ));
                    };
                    let key = match r {
                        Reservation::Block(id) => id.clone(),
                        Reservation::Plan(region, name) => w
                            .sm
                            .plans
                            .get(&(region.clone(), name.to_ascii_lowercase()))
                            .map_or_else(|| name.clone(), |p| p.arn.clone()),
                    };
                    w.fail_next_extension_payment(&key)
                        .map_err(|e| format!("{key}: {e}"))
                });
                let key = done.map_err(|e| anyhow!("at {now}: request {} {e}", x.request_id))?;
                self.timeline.action(
                    now,
                    &format!(
                        "makes the payment of the next extension of {} ({key}) fail",
                        x.request_id
                    ),
                );
            }
            What::Cli(c) => self.run_cli(c, scenario).await?,
            What::Outage { function, minutes } => {
                anyhow::ensure!(
                    self.functions.contains_key(function),
                    "outage of {function}, which the runner did not start"
                );
                let until = now + TimeDelta::minutes(*minutes);
                self.timeline.action(
                    now,
                    &format!("{function} is down until {until} (its schedule's ticks are lost; its events wait for EventBridge's retries)"),
                );
                self.down.insert(function.clone(), until);
            }
        }
        Ok(())
    }

    /// Runs the CLI to its end while the simulated clock stands still, logs it, and fails the
    /// run when its exit code or output is not what the action expects, or when it names a
    /// request whose `Capacity Request Submitted` it did not put on the custom bus. The play
    /// loop then delivers whatever it put.
    async fn run_cli(&mut self, c: &CliCall, scenario: &Scenario) -> anyhow::Result<()> {
        let now = self.cloud.now();
        if !self.cli.binary.exists() {
            bail!(
                "{} is missing: build it first (cargo build --workspace --bins)",
                self.cli.binary.display()
            );
        }
        let out = self.cli.out_dir.join("cli");
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let cloud = &self.cloud;
        let args = substitute_args(
            &c.args,
            &|region| {
                let region = region.unwrap_or(&scenario.region);
                cloud.with_world(|w| w.subnets(region).into_iter().map(|s| s.id).collect())
            },
            &out,
        );
        let line = command_line(CLI_BINARY, &args);
        let (akid, secret) = match &c.caller {
            Some(arn) => {
                let akid = access_key_for(arn);
                self.cloud
                    .with_world(|w| w.put_identity(&akid, arn))
                    .map_err(|e| anyhow!("at {now}: `{line}` as {arn}: {}", e.message))?;
                (akid, "local-runner-cli-secret")
            }
            None => (
                lambda_host::ACCESS_KEY_ID.to_string(),
                lambda_host::SECRET_ACCESS_KEY,
            ),
        };
        let before = event_count(&self.cloud, &self.bus.region, &self.bus.custom);
        let ran = self
            .cli
            .exec(&args, &akid, secret)
            .await
            .map_err(|e| anyhow!("at {now}: `{line}`: {e:#}"))?;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.cli.log)
            .with_context(|| format!("opening {}", self.cli.log.display()))?;
        writeln!(
            log,
            "[{}] {}$ {line}\n--- stdout\n{}\n--- stderr\n{}\n--- exit {} ({})\n",
            now.format("%Y-%m-%dT%H:%M:%SZ"),
            c.caller
                .as_deref()
                .map(|a| format!("as {a} "))
                .unwrap_or_default(),
            ran.stdout,
            ran.stderr,
            ran.code,
            ran.status
        )?;
        if let Some(name) = &c.stdout {
            let plain = Path::new(name)
                .file_name()
                .is_some_and(|f| f == name.as_str());
            if !plain {
                bail!("the cli action's `stdout: {name}` must be a plain file name");
            }
            let path = out.join(name);
            std::fs::write(&path, &ran.stdout)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        self.timeline
            .action(now, &format!("{line} (exit {})", ran.code));
        let put = events_since(&self.cloud, &self.bus.region, &self.bus.custom, before);
        cli_verdict(c, &ran, &put, &self.bus.custom).map_err(|e| anyhow!("at {now}: `{line}` {e}"))
    }

    /// Hands every new event to the functions its rules name, until no new event arrives.
    async fn deliver(&mut self) -> anyhow::Result<()> {
        loop {
            let new = self.bus.take_new(&self.cloud);
            if new.is_empty() {
                return Ok(());
            }
            for d in new {
                if !d.log_groups.is_empty() {
                    append_event(&self.event_log, &d.event)?;
                }
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

    /// Whether `function` is down (the scenario's `outage`) now.
    fn is_down(&self, function: &str) -> bool {
        self.down
            .get(function)
            .is_some_and(|until| self.cloud.now() < *until)
    }

    /// Delivers the events held for functions that are back.
    async fn redeliver(&mut self) -> anyhow::Result<()> {
        let held = std::mem::take(&mut self.held);
        for (function, event, trigger) in held {
            if self.is_down(&function) {
                self.held.push((function, event, trigger));
            } else {
                self.invoke(&function, &event, &trigger).await?;
            }
        }
        Ok(())
    }

    /// Invokes `function` with `event`; a failed invocation is retried twice, as Lambda
    /// retries an asynchronous invocation. A function that is down loses a schedule's tick,
    /// and an event waits for it (EventBridge retries a failed delivery for a day).
    async fn invoke(&mut self, function: &str, event: &Value, trigger: &str) -> anyhow::Result<()> {
        if self.is_down(function) {
            if trigger != "Scheduled Event" {
                self.held
                    .push((function.to_string(), event.clone(), trigger.to_string()));
            }
            return Ok(());
        }
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

/// A reservation of a request an `extend` or `fail_extension_payment` action can name.
enum Reservation {
    /// A Capacity Block's reservation id.
    Block(String),
    /// A training plan's region and name.
    Plan(String, String),
}

/// The reservations bought for `request_id` (by its request tag) that are still live: blocks
/// not expired or released, plans not expired or failed; by start, then id.
fn live_reservations(w: &crate::World, request_id: &str) -> Vec<Reservation> {
    let mut live: Vec<(DateTime<Utc>, String, Reservation)> = Vec::new();
    for cr in w.ec2.reservations.values() {
        if cr.tags.get(checks::REQUEST_TAG).map(String::as_str) == Some(request_id)
            && matches!(
                cr.state.as_str(),
                "pending" | "payment-pending" | "scheduled" | "active"
            )
        {
            live.push((cr.start, cr.id.clone(), Reservation::Block(cr.id.clone())));
        }
    }
    for p in w.sm.plans.values() {
        let tagged = w.sm.tags.get(&p.arn).is_some_and(|tags| {
            tags.iter()
                .any(|(k, v)| k == checks::REQUEST_TAG && v == request_id)
        });
        if tagged
            && matches!(
                crate::sagemaker::plan_status(p, w.now),
                "Pending" | "Scheduled" | "Active"
            )
        {
            live.push((
                p.offering.start(),
                p.arn.clone(),
                Reservation::Plan(p.region.clone(), p.name.clone()),
            ));
        }
    }
    live.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    live.into_iter().map(|(_, _, r)| r).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(exit: i32, expect: &[&str], request_id: Option<&str>) -> CliCall {
        CliCall {
            args: vec!["submit".into()],
            caller: None,
            stdout: None,
            exit,
            expect_stdout: expect.iter().map(|s| s.to_string()).collect(),
            request_id: request_id.map(str::to_string),
        }
    }

    fn samples(dir: &str) -> Vec<Value> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../events")
            .join(dir);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
            .iter()
            .map(|f| serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap())
            .collect()
    }

    /// The event log as the runner writes it (issue 56): the template's EventLogRule sends
    /// each of our events on the custom bus to `events.log`, one line holding the whole
    /// envelope; an inbound event of another source and a replay (it carries `replay-name`)
    /// are not written.
    #[test]
    fn the_event_log_holds_each_of_our_events_whole_and_no_inbound_event_or_replay() {
        // GIVEN the template's rules and our emitted sample events
        let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
        let rules = Rules::from_template(&template).expect("the template's rules");
        let ours = samples("emitted");
        assert!(ours.len() > 10);
        let dir = std::env::temp_dir().join(format!("local-cloud-events-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join(EVENT_LOG);
        let _ = std::fs::remove_file(&log);
        // WHEN each is delivered on the custom bus as the runner does
        for e in &ours {
            let groups = rules.log_groups_for(Bus::Custom, e);
            assert_eq!(groups, ["EventLog"], "{}", e["detail-type"]);
            append_event(&log, e).unwrap();
        }
        // THEN the log holds each, whole, one line each, in order
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines, ours);
        // AND inbound events are logged by their source alone (a forged one that claims ours
        // is, as in AWS), replays and the default bus's events are not
        for e in samples("inbound") {
            let logged = !rules.log_groups_for(Bus::Custom, &e).is_empty();
            assert_eq!(logged, e["source"] == "capacity-pilot", "{e}");
        }
        let mut replayed = ours[0].clone();
        replayed["replay-name"] = json!("replay-1");
        assert!(rules.log_groups_for(Bus::Custom, &replayed).is_empty());
        assert!(rules.log_groups_for(Bus::Default, &ours[0]).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cli_run_is_judged_by_its_exit_code_its_stdout_and_the_request_it_put() {
        // GIVEN a run that exited 0 printing the request id, and the event it put
        let ran = CliRun {
            code: 0,
            status: "exit status: 0".into(),
            stdout: "submitted team-x\n".into(),
            stderr: "a warning\n".into(),
        };
        let put = vec![json!({"detail-type": SUBMITTED, "detail": {"request_id": "team-x"}})];
        // WHEN it is judged against what actions expect
        let ok = cli_verdict(&call(0, &["team-x"], Some("team-x")), &ran, &put, "b");
        let wrong_exit = cli_verdict(&call(2, &[], None), &ran, &put, "b");
        let missing = cli_verdict(&call(0, &["Accepted"], None), &ran, &put, "b");
        let not_put = cli_verdict(&call(0, &[], Some("team-y")), &ran, &put, "b");
        // THEN only the matching one passes, and each failure shows the run
        assert!(ok.is_ok(), "{ok:?}");
        let wrong_exit = wrong_exit.unwrap_err().to_string();
        assert!(
            wrong_exit.contains("exited 0 (exit status: 0), expected 2"),
            "{wrong_exit}"
        );
        assert!(wrong_exit.contains("submitted team-x") && wrong_exit.contains("a warning"));
        let missing = missing.unwrap_err().to_string();
        assert!(missing.contains("\"Accepted\""), "{missing}");
        let not_put = not_put.unwrap_err().to_string();
        assert!(
            not_put.contains("put no Capacity Request Submitted for request team-y on the b bus"),
            "{not_put}"
        );
    }

    #[test]
    fn a_command_line_quotes_what_a_shell_would_split() {
        let args = ["submit", "--note", "two words", "it's", ""].map(String::from);
        assert_eq!(
            command_line("capacity-pilot", &args),
            "capacity-pilot submit --note 'two words' 'it'\\''s' ''"
        );
        let key = access_key_for("arn:aws:iam::123456789012:user/ops");
        assert_eq!(key.len(), 20);
        assert!(key.starts_with("AKIA"));
        assert_ne!(key, access_key_for("arn:aws:iam::123456789012:user/dev"));
    }

    #[tokio::test]
    async fn the_cli_runs_in_the_workspace_root_with_the_emulator_as_its_aws_and_nothing_else_of_the_users()
     {
        // GIVEN a stand-in CLI that prints its arguments, directory and environment, and
        // exits 3
        let dir = std::env::temp_dir().join(format!("local-cloud-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let binary = dir.join(CLI_BINARY);
        std::fs::write(
            &binary,
            "#!/bin/sh\necho \"args: $*\"\necho \"cwd: $(pwd)\"\nenv\necho oops >&2\nexit 3\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cli = CliEnv {
            binary,
            root: dir.clone(),
            out_dir: dir.clone(),
            log: dir.join("cli.log"),
            cloud_url: "http://127.0.0.1:4566".into(),
            moto_url: "http://127.0.0.1:5000".into(),
            region: "us-west-2".into(),
        };
        // WHEN it runs as a registered caller
        let ran = cli
            .exec(&["status".into(), "two words".into()], "AKIAOPS", "s3cret")
            .await
            .expect("runs");
        let ran_in = ran
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("cwd: "))
            .and_then(|cwd| Path::new(cwd).canonicalize().ok());
        let root = dir.canonicalize().ok();
        std::fs::remove_dir_all(&dir).ok();
        // THEN it got its arguments, the workspace root, the emulator for AWS and the clock,
        // moto for DynamoDB, the caller's keys, no colours, and no AWS setting of the user's
        assert_eq!((ran.code, ran.stderr.as_str()), (3, "oops\n"));
        let lines: Vec<&str> = ran.stdout.lines().collect();
        assert_eq!(lines[0], "args: status two words");
        assert!(ran_in.is_some() && ran_in == root, "ran in {:?}", lines[1]);
        let env: BTreeMap<&str, &str> = lines[2..]
            .iter()
            .filter_map(|l| l.split_once('='))
            .collect();
        for (k, v) in [
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:4566"),
            ("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:5000"),
            ("AWS_REGION", "us-west-2"),
            ("AWS_ACCESS_KEY_ID", "AKIAOPS"),
            ("AWS_SECRET_ACCESS_KEY", "s3cret"),
            ("AWS_CONFIG_FILE", "/dev/null"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
            (
                "CAPACITY_PILOT_CLOCK_URL",
                "http://127.0.0.1:4566/_local/clock",
            ),
            ("NO_COLOR", "1"),
        ] {
            assert_eq!(env.get(k), Some(&v), "{k} in {env:?}");
        }
        let aws: Vec<&str> = env
            .keys()
            .copied()
            .filter(|k| k.starts_with("AWS_"))
            .collect();
        assert_eq!(
            aws,
            [
                "AWS_ACCESS_KEY_ID",
                "AWS_CONFIG_FILE",
                "AWS_DEFAULT_REGION",
                "AWS_EC2_METADATA_DISABLED",
                "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_DYNAMODB",
                "AWS_REGION",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_SHARED_CREDENTIALS_FILE",
            ],
            "no AWS_PROFILE or other AWS setting leaks in"
        );
        assert_eq!(
            env.get("PATH").copied(),
            std::env::var("PATH").ok().as_deref()
        );
    }

    #[test]
    fn a_shared_motos_table_is_named_after_its_scenario() {
        assert_eq!(shared_table_name("default"), "capacity-pilot-state-default");
        assert_eq!(shared_table_name("a b/c"), "capacity-pilot-state-a-b-c");
    }
}
