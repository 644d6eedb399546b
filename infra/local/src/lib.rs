//! `local-cloud`: an offline stand-in for the parts of AWS that capacity-pilot uses, so the project
//! runs and is tested without an AWS account. It serves EC2 (query protocol), SageMaker and
//! EventBridge (awsJson1_1), and CloudFormation `DescribeStacks`, STS `GetCallerIdentity` and SNS
//! standard topics (awsQuery) on one HTTP port to the unmodified AWS SDK clients and the AWS CLI,
//! models a seeded capacity market with AWS's offering rules, drives every lifecycle from a
//! simulated clock, and records the events AWS would emit.
//!
//! It implements AWS's rules on its own and never imports the `capacity-pilot` crate: it is the
//! referee that catches a misreading of AWS on either side.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use local_cloud::{LocalCloud, Options};
//! let cloud = LocalCloud::start(Options { seed: 7, ..Options::default() }).await?;
//! let endpoint = cloud.url(); // pass to aws_config::defaults(..).endpoint_url(endpoint)
//! cloud.step(chrono::TimeDelta::hours(1)); // lifecycles advance only when told to
//! let aws_events = cloud.events("default");
//! # let _ = (endpoint, aws_events); Ok(()) }
//! ```
//!
//! The HTTP control API (under `/_local/`) offers the same operations to other processes; see
//! the crate README.

pub mod cloudformation;
pub mod ec2;
pub mod error;
pub mod eventbridge;
pub mod logs;
pub mod market;
pub mod query;
pub mod rules;
pub mod runner;
pub mod sagemaker;
pub mod server;
pub mod sns;
pub mod sts;
pub mod util;
pub mod world;
pub mod xml;

use aws_smithy_async::rt::sleep::{SharedAsyncSleep, TokioSleep};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use cloudformation::{Stack, StackOutput};
pub use error::ApiError;
pub use world::{
    BlockInitialState, Fault, FaultKind, InactivePlan, PlanUnsupported, Refusal, RefusalCode,
    RefusalMarket, Settings, World,
};

/// How to start an emulator.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seeds the market: the same seed gives the same offerings, prices and ids.
    pub seed: u64,
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// The simulated clock's starting time; `None` means the real current time.
    pub start: Option<DateTime<Utc>>,
    /// Behaviour switches and timings.
    pub settings: Settings,
    /// What the emulator's latencies sleep on; tokio's unless a simulation gives its own.
    pub sleep: SharedAsyncSleep,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seed: 1,
            port: 0,
            start: None,
            settings: Settings::default(),
            sleep: SharedAsyncSleep::new(TokioSleep::new()),
        }
    }
}

/// A running emulator. Dropping it stops the server.
#[derive(Debug)]
pub struct LocalCloud {
    addr: SocketAddr,
    shared: server::App,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl LocalCloud {
    /// Binds 127.0.0.1:`port` and serves in the background on the current Tokio runtime.
    pub async fn start(options: Options) -> std::io::Result<LocalCloud> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            options.port,
        ))
        .await?;
        let addr = listener.local_addr()?;
        let now = options.start.unwrap_or_else(Utc::now);
        let shared = Arc::new(server::Shared {
            world: Mutex::new(World::new(options.seed, now, options.settings)),
            sleep: options.sleep,
        });
        let app = server::router(shared.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = rx.await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "local-cloud server stopped");
            }
        });
        tracing::info!(%addr, seed = options.seed, "local-cloud listening");
        Ok(LocalCloud {
            addr,
            shared,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// The endpoint URL for SDK clients and the AWS CLI, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The simulated time.
    pub fn now(&self) -> DateTime<Utc> {
        self.shared.lock().now
    }

    /// Advances the clock by `by`, running every transition due on the way. Returns the new time.
    pub fn step(&self, by: TimeDelta) -> DateTime<Utc> {
        let mut w = self.shared.lock();
        let to = w.now + by;
        w.advance_to(to);
        w.now
    }

    /// Advances the clock to `to` (never backwards). Returns the new time.
    pub fn advance_to(&self, to: DateTime<Utc>) -> DateTime<Utc> {
        let mut w = self.shared.lock();
        w.advance_to(to);
        w.now
    }

    /// When the emulator will next change something by itself (a lifecycle step or event).
    pub fn next_transition(&self) -> Option<DateTime<Utc>> {
        self.shared.lock().next_transition()
    }

    /// Steps to the next internal transition, if there is one, and returns the new time.
    pub fn step_to_next(&self) -> Option<DateTime<Utc>> {
        let mut w = self.shared.lock();
        let next = w.next_transition()?;
        let to = next.max(w.now);
        w.advance_to(to);
        Some(w.now)
    }

    /// Events recorded on a bus of the home region ([`Settings::home_region`], default
    /// `us-east-1`), oldest first: `default` holds AWS's own events of that region (and any a
    /// rule forwarded to it), another name a custom bus.
    pub fn events(&self, bus: &str) -> Vec<Value> {
        self.shared.lock().home_events(bus).to_vec()
    }

    /// Events recorded on bus `bus` of `region`, oldest first: AWS's own events reach the
    /// `default` bus of the region where they happen, and no other (aws-reference §11.4).
    pub fn events_in(&self, region: &str, bus: &str) -> Vec<Value> {
        self.shared.lock().events(region, bus).to_vec()
    }

    /// The home region ([`Settings::home_region`]).
    pub fn home_region(&self) -> String {
        self.shared.lock().settings.home_region.clone()
    }

    /// Creates the standard topic `name` in `region` for this emulator's account, as a stack
    /// would (`CreateTopic`, idempotent); returns its ARN.
    pub fn create_sns_topic(&self, region: &str, name: &str) -> Result<String, ApiError> {
        let q = crate::query::Query::parse(
            format!("Action=CreateTopic&Version=2010-03-31&Name={name}").as_bytes(),
        )?;
        let mut w = self.shared.lock();
        w.sns_call(Some("AKIDSTACK"), region, "CreateTopic", &q)?;
        Ok(format!(
            "arn:aws:sns:{region}:{}:{name}",
            w.settings.account_id
        ))
    }

    /// Every message SNS accepted, oldest first, as `GET /_local/sns/messages` lists them:
    /// `topic_arn`, `message_id`, `subject`, `message`, `attributes` (name -> value),
    /// `attribute_types`, `at` and `deliveries` (the subscription ARNs it reached).
    pub fn sns_messages(&self) -> Vec<Value> {
        self.shared.lock().sns_messages()
    }

    /// Every SNS subscription, as `GET /_local/sns/subscriptions` lists them.
    pub fn sns_subscriptions(&self) -> Vec<Value> {
        self.shared.lock().sns_subscriptions()
    }

    /// Confirms a pending SNS subscription (the recipient following the confirmation link).
    pub fn confirm_sns_subscription(&self, subscription_arn: &str) -> Result<(), ApiError> {
        self.shared
            .lock()
            .confirm_sns_subscriptions(Some(subscription_arn), None, None)
            .map(|_| ())
    }

    /// Injects a fault.
    pub fn inject(&self, fault: Fault) {
        self.shared.lock().faults.push(fault);
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        self.shared.lock().faults.clear();
    }

    /// The emulator's HTTP routes, to be served in-process (no socket) by a test's SDK
    /// client: the same handlers the listener serves.
    pub fn router(&self) -> axum::Router {
        server::router(self.shared.clone())
    }

    /// A JSON snapshot of the whole state.
    pub fn snapshot(&self) -> Value {
        self.shared.lock().snapshot()
    }

    /// Direct access to the state for anything the methods above do not cover (impairing an
    /// instance, changing settings). Keep the closure short: requests wait for the lock.
    pub fn with_world<R>(&self, f: impl FnOnce(&mut World) -> R) -> R {
        f(&mut self.shared.lock())
    }

    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for LocalCloud {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}
