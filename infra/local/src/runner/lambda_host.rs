//! A Lambda host: each function's real binary runs as a child process under the Lambda
//! Runtime API (`/2018-06-01/runtime/...`), served on its own port, as Lambda runs a
//! `provided.al2023` function. Invocations are synchronous, one in flight at a time. Init
//! time, duration and peak memory (VmHWM, reset through `/proc/<pid>/clear_refs` before each
//! invocation) are recorded; the function's stdout and stderr (its JSON logs) go to a file.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

use super::template::FunctionSpec;

/// How long a function's cold start may take before the host gives up on it.
const INIT_DEADLINE: Duration = Duration::from_secs(30);

/// What the function answered.
#[derive(Debug, Clone)]
pub enum Answer {
    Response(Value),
    /// `/invocation/{id}/error` (the body Lambda would log), or the host's own failure.
    Error(String),
}

/// One invocation, measured.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub function: String,
    pub request_id: String,
    pub answer: Answer,
    /// From handing the event over (`/next` returning) to the response.
    pub duration: Duration,
    /// VmHWM after the invocation, the high-water mark having been reset before it.
    pub peak_rss_kb: u64,
    /// The CPU time the process's threads ran during the invocation (their schedstat).
    pub cpu: Duration,
}

struct Pending {
    request_id: String,
    event: Value,
    reply: Reply,
}

/// Where an answer goes: the invoker's channel, with the moment the event was handed over.
type Reply = oneshot::Sender<(Answer, Instant)>;

struct Api {
    arn: String,
    timeout: Duration,
    queue: tokio::sync::Mutex<mpsc::Receiver<Pending>>,
    /// Invocations handed over and not yet answered: request id -> (reply, handed over at).
    open: Mutex<HashMap<String, (Reply, Instant)>>,
    /// Signalled once, at the first `/next` (the cold start is over) or an init error.
    init: Mutex<Option<oneshot::Sender<Result<Instant, String>>>>,
}

/// One function: its process and its runtime endpoint.
pub struct Function {
    pub spec: FunctionSpec,
    pub init: Duration,
    pub log: PathBuf,
    child: Child,
    pid: u32,
    api: Arc<Api>,
    tx: mpsc::Sender<Pending>,
    server: tokio::task::JoinHandle<()>,
    count: u64,
}

/// The dummy credentials the functions sign with (the emulator and moto check no signature).
pub const ACCESS_KEY_ID: &str = "AKIDLOCALRUNNER";
pub const SECRET_ACCESS_KEY: &str = "local-runner-secret";

/// Everything the host adds to the template's environment.
#[derive(Debug, Clone)]
pub struct HostEnv {
    pub region: String,
    pub account_id: String,
    /// `AWS_ENDPOINT_URL_*` and `CAPACITY_PILOT_CLOCK_URL`, and anything else to add.
    pub extra: BTreeMap<String, String>,
}

impl Function {
    /// Serves a runtime endpoint, starts `binary` against it and waits for its cold start.
    pub async fn start(
        spec: FunctionSpec,
        binary: &Path,
        host: &HostEnv,
        log: PathBuf,
    ) -> anyhow::Result<Function> {
        let (tx, rx) = mpsc::channel(1);
        let (init_tx, init_rx) = oneshot::channel();
        let api = Arc::new(Api {
            arn: format!(
                "arn:aws:lambda:{}:{}:function:{}",
                host.region, host.account_id, spec.name
            ),
            timeout: Duration::from_secs(spec.timeout_s),
            queue: tokio::sync::Mutex::new(rx),
            open: Mutex::new(HashMap::new()),
            init: Mutex::new(Some(init_tx)),
        });
        let listener =
            tokio::net::TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))
                .await?;
        let addr = listener.local_addr()?;
        let router = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(api.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });

        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(binary);
        cmd.env_clear()
            .envs(&spec.env)
            .env("AWS_REGION", &host.region)
            .env("AWS_DEFAULT_REGION", &host.region)
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
            .env("AWS_SESSION_TOKEN", "local-runner-session")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
            .env("AWS_LAMBDA_FUNCTION_NAME", &spec.name)
            .env(
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
                spec.memory_mb.to_string(),
            )
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env(
                "AWS_LAMBDA_LOG_GROUP_NAME",
                format!("/aws/lambda/{}", spec.name),
            )
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "local-runner")
            .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
            .env("_HANDLER", "bootstrap")
            .envs(&host.extra)
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("{} exited at once", spec.name))?;
        let ready = tokio::select! {
            r = init_rx => r.map_err(|_| anyhow!("the runtime endpoint closed"))?,
            status = child.wait() => {
                server.abort();
                bail!("{} exited during its cold start ({}); see {}", spec.name, status?, log.display());
            }
            _ = tokio::time::sleep(INIT_DEADLINE) => {
                server.abort();
                bail!("{} did not ask for an invocation within {INIT_DEADLINE:?}; see {}", spec.name, log.display());
            }
        };
        let init = match ready {
            Ok(at) => at - started,
            Err(body) => {
                server.abort();
                bail!(
                    "{} failed its cold start: {body}; see {}",
                    spec.name,
                    log.display()
                );
            }
        };
        Ok(Function {
            spec,
            init,
            log,
            child,
            pid,
            api,
            tx,
            server,
            count: 0,
        })
    }

    /// Invokes the function with `event` and waits for its answer (or its timeout).
    pub async fn invoke(&mut self, event: &Value) -> Invocation {
        self.count += 1;
        let request_id = uuid::Uuid::new_v4().to_string();
        // Reset the high-water mark, so VmHWM afterwards is this invocation's peak.
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5");
        let cpu_before = cpu_ns(self.pid);
        let (reply, answer) = oneshot::channel();
        let sent = self
            .tx
            .send(Pending {
                request_id: request_id.clone(),
                event: event.clone(),
                reply,
            })
            .await;
        let result = match sent {
            Err(_) => Err("the runtime endpoint is closed".to_string()),
            Ok(()) => tokio::select! {
                a = answer => a.map_err(|_| "the invocation was dropped".to_string()),
                status = self.child.wait() => Err(format!("the process exited ({})", status.map(|s| s.to_string()).unwrap_or_default())),
                _ = tokio::time::sleep(self.api.timeout + Duration::from_secs(5)) => Err(format!("timed out after {:?}", self.api.timeout)),
            },
        };
        let finished = Instant::now();
        let handed_over = self
            .api
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request_id)
            .map(|(_, at)| at);
        let (answer, duration) = match result {
            Ok((answer, handed_over)) => (answer, finished.saturating_duration_since(handed_over)),
            Err(e) => (
                Answer::Error(e),
                handed_over.map_or(Duration::ZERO, |at| finished - at),
            ),
        };
        Invocation {
            function: self.spec.name.clone(),
            request_id,
            answer,
            duration,
            peak_rss_kb: vm_hwm_kb(self.pid).unwrap_or(0),
            cpu: Duration::from_nanos(cpu_ns(self.pid).saturating_sub(cpu_before)),
        }
    }

    pub fn invocations(&self) -> u64 {
        self.count
    }

    /// Stops the process and the endpoint.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
        self.server.abort();
    }
}

/// The CPU time a process's threads have run, in ns: the first field of each thread's
/// `/proc/<pid>/task/<tid>/schedstat` (nanosecond-exact, unlike `stat`'s clock ticks). A
/// thread that ended before the reading is not counted; the functions' tokio workers live
/// as long as the process. (The TLS cold-start benchmark measures its own process with it.)
pub fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// VmHWM of a process, in kB.
fn vm_hwm_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn signal_init(api: &Api, r: Result<Instant, String>) {
    if let Some(tx) = api.init.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = tx.send(r);
    }
}

async fn next(State(api): State<Arc<Api>>) -> Response {
    signal_init(&api, Ok(Instant::now()));
    let pending = api.queue.lock().await.recv().await;
    let Some(p) = pending else {
        return StatusCode::GONE.into_response();
    };
    let deadline_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
        + api.timeout.as_millis();
    let mut headers = HeaderMap::new();
    let h = |v: &str| HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static(""));
    headers.insert("Lambda-Runtime-Aws-Request-Id", h(&p.request_id));
    headers.insert("Lambda-Runtime-Deadline-Ms", h(&deadline_ms.to_string()));
    headers.insert("Lambda-Runtime-Invoked-Function-Arn", h(&api.arn));
    let trace = format!(
        "Root=1-{:08x}-{};Parent={};Sampled=0",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs(),
        &p.request_id.replace('-', "")[..24],
        &p.request_id.replace('-', "")[..16],
    );
    headers.insert("Lambda-Runtime-Trace-Id", h(&trace));
    headers.insert("Content-Type", HeaderValue::from_static("application/json"));
    api.open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p.request_id.clone(), (p.reply, Instant::now()));
    (StatusCode::OK, headers, p.event.to_string()).into_response()
}

/// Answers the invocation `id`: the reply carries the hand-over time, so the duration is the
/// function's own time.
fn answer(api: &Api, id: &str, a: Answer) -> StatusCode {
    let entry = api
        .open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(id);
    match entry {
        Some((reply, handed_over)) => {
            let _ = reply.send((a, handed_over));
            StatusCode::ACCEPTED
        }
        None => StatusCode::BAD_REQUEST,
    }
}

async fn response(
    State(api): State<Arc<Api>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    let v = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    answer(&api, &id, Answer::Response(v))
}

async fn error(
    State(api): State<Arc<Api>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> StatusCode {
    answer(
        &api,
        &id,
        Answer::Error(String::from_utf8_lossy(&body).into_owned()),
    )
}

async fn init_error(State(api): State<Arc<Api>>, body: Bytes) -> StatusCode {
    signal_init(&api, Err(String::from_utf8_lossy(&body).into_owned()));
    StatusCode::ACCEPTED
}
