//! The small traits the functions need from the outside world: the capacity market, the
//! workloads, the state store, the event sink and the clock.
//!
//! They speak domain types only. The AWS adapters (`aws/`) convert at the edge; in-memory
//! fakes (`fakes`, behind the `test-util` feature) serve handler unit tests.

use std::collections::BTreeMap;
use std::future::Future;

use chrono::{DateTime, Datelike, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::domain::extension::{ExtensionOffer, ExtensionSeen};
use crate::domain::money::{MicroUsd, Usd};
use crate::domain::offering::{Offering, Product};
use crate::domain::planner::Plan;
use crate::domain::request::{CapacityRequest, LaunchTemplateRef, RequestId, Team};
use crate::domain::reservation::Reservation;
use crate::domain::status::RequestStatus;
use crate::domain::window::WindowRecord;

// =======================================================================================
// Errors shared by the ports.
// =======================================================================================

/// A failed call to an outside service, classified once, here, for every caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// Throttled: retry later with backoff.
    #[error("throttled by {service}: {code}: {message}")]
    Throttled {
        service: &'static str,
        code: String,
        message: String,
    },
    /// A server-side or network failure with a known outcome (nothing happened): retry.
    #[error("transient failure of {service}: {code}: {message}")]
    Transient {
        service: &'static str,
        code: String,
        message: String,
    },
    /// The call may or may not have taken effect (timeout, 5xx, lost response). For a
    /// purchase this means: reconcile before anything else.
    #[error("outcome unknown for {service}: {message}")]
    OutcomeUnknown {
        service: &'static str,
        message: String,
    },
    /// The offering can no longer be bought (expired, sold, not found).
    #[error("offering gone: {code}: {message}")]
    OfferingGone { code: String, message: String },
    /// Insufficient capacity (on-demand, spot, or inside a reservation).
    #[error("no capacity: {code}: {message}")]
    NoCapacity { code: String, message: String },
    /// The request itself is wrong or not allowed; retrying won't help.
    #[error("{service} refused: {code}: {message}")]
    Permanent {
        service: &'static str,
        code: String,
        message: String,
    },
}

impl PortError {
    /// Whether the same call may be retried as it is.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            PortError::Throttled { .. } | PortError::Transient { .. }
        )
    }

    /// The AWS error code, when there is one.
    pub fn code(&self) -> Option<&str> {
        match self {
            PortError::Throttled { code, .. }
            | PortError::Transient { code, .. }
            | PortError::OfferingGone { code, .. }
            | PortError::NoCapacity { code, .. }
            | PortError::Permanent { code, .. } => Some(code),
            PortError::OutcomeUnknown { .. } => None,
        }
    }
}

// =======================================================================================
// Capacity market: search, purchase, describe, reconcile-by-tag, for both products.
// =======================================================================================

/// One search: a product, a region, a type and count, a duration and a date range.
/// Requests asking the same question share one query (and one AWS call).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OfferingQuery {
    /// `CapacityBlock` or `TrainingPlan { target }`.
    pub product: Product,
    pub region: String,
    pub instance_type: String,
    pub instance_count: u32,
    pub duration_hours: u32,
    pub start_from: DateTime<Utc>,
    pub end_by: DateTime<Utc>,
}

/// What a purchase is for: every purchase is tagged with the request id, and training
/// plans are named from it, so a repeat collides instead of buying twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurchaseSpec {
    pub request_id: RequestId,
    /// The training plan name (ignored for Capacity Blocks).
    pub plan_name: String,
    /// `Linux/UNIX` etc. (Capacity Blocks only).
    pub instance_platform: String,
    /// The request's tags plus ours (`capacity-pilot:managed`, `capacity-pilot:request-id`).
    pub tags: BTreeMap<String, String>,
}

pub trait CapacityMarket: Send + Sync {
    /// Offerings for one query, priced against on-demand.
    fn search(
        &self,
        query: &OfferingQuery,
    ) -> impl Future<Output = Result<Vec<Offering>, PortError>> + Send;

    /// Buys an offering **with SDK retries disabled**: a retry after a lost response would
    /// buy twice. Any doubt is `OutcomeUnknown`, to be settled by
    /// [`CapacityMarket::find_by_request`].
    fn purchase(
        &self,
        offering: &Offering,
        spec: &PurchaseSpec,
    ) -> impl Future<Output = Result<Reservation, PortError>> + Send;

    /// The current view of one reservation, `None` when AWS does not know it.
    fn describe(
        &self,
        product: Product,
        region: &str,
        reservation_id: &str,
    ) -> impl Future<Output = Result<Option<Reservation>, PortError>> + Send;

    /// Every reservation of `product` in `region` tagged (or, for plans, named) for the
    /// request: how a purchase whose outcome is unknown is reconciled.
    fn find_by_request(
        &self,
        product: Product,
        region: &str,
        request_id: &RequestId,
        plan_name: &str,
    ) -> impl Future<Output = Result<Vec<Reservation>, PortError>> + Send;

    /// Every reservation in `region` of the deployment `deployment_id`, blocks and plans, each
    /// with the request it is tagged (or named) for: what the detector of unrecorded
    /// reservations reads (ARCHITECTURE §9.1). Matched by AWS's filter where it has one, and
    /// by the caller again.
    fn find_by_deployment(
        &self,
        region: &str,
        deployment_id: &str,
    ) -> impl Future<Output = Result<Vec<Reservation>, PortError>> + Send;

    /// What reservation `r` can be extended by, for `hours` (ARCHITECTURE §9.3): AWS's
    /// extension offerings, none when it cannot be (not active or scheduled, an extension
    /// payment pending, outside 56 days to 1 hour before its end, no capacity).
    fn extension_offers(
        &self,
        r: &Reservation,
        hours: u32,
    ) -> impl Future<Output = Result<Vec<ExtensionOffer>, PortError>> + Send;

    /// Buys extension `offer` of `r` **with SDK retries disabled**, as [`Self::purchase`]:
    /// any doubt is `OutcomeUnknown`, settled by [`Self::extensions`].
    fn extend(
        &self,
        r: &Reservation,
        offer: &ExtensionOffer,
    ) -> impl Future<Output = Result<ExtensionSeen, PortError>> + Send;

    /// Every extension of `r` AWS lists (whoever bought it), paid, pending or failed. A new
    /// one may be missing for a while (the listing lags).
    fn extensions(
        &self,
        r: &Reservation,
    ) -> impl Future<Output = Result<Vec<ExtensionSeen>, PortError>> + Send;

    /// Every live Capacity Block reservation in `region`, whoever bought it (this deployment,
    /// another, a person): what the account's limit of instances across Capacity Blocks
    /// counts (aws-reference; review aws-reality-2 #6).
    fn blocks_in_account(
        &self,
        region: &str,
    ) -> impl Future<Output = Result<Vec<Reservation>, PortError>> + Send;
}

// =======================================================================================
// Workloads: EC2 instances, training jobs, HyperPod instance groups, endpoints.
// =======================================================================================

/// How an instance is bought.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LaunchMarket {
    /// Into a Capacity Block: market type `capacity-block` and a reservation target.
    CapacityBlock {
        reservation_id: String,
    },
    OnDemand,
    Spot,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub region: String,
    pub market: LaunchMarket,
    pub instance_type: String,
    pub count: u32,
    pub subnet_id: String,
    pub launch_template: LaunchTemplateRef,
    /// At most 64 characters; see `domain::naming::client_token`.
    pub client_token: String,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
    Stopping,
    Stopped,
}

impl InstanceState {
    /// Still holds (or will hold) a slot.
    pub fn is_live(self) -> bool {
        matches!(self, InstanceState::Pending | InstanceState::Running)
    }

    /// EC2's name for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Running => "running",
            InstanceState::ShuttingDown => "shutting-down",
            InstanceState::Terminated => "terminated",
            InstanceState::Stopping => "stopping",
            InstanceState::Stopped => "stopped",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceHealth {
    Ok,
    Impaired,
    /// Initializing or no data yet.
    Unknown,
}

/// An event EC2 has scheduled for an instance (DescribeInstanceStatus `Events`,
/// aws-reference §6.3): `code` is `instance-retirement`, `instance-stop`, `instance-reboot`,
/// `system-reboot` or `system-maintenance`; the change happens from `not_before`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledChange {
    pub code: String,
    pub not_before: DateTime<Utc>,
}

impl ScheduledChange {
    /// Whether the change takes the instance away (retirement or stop), so that it must be
    /// replaced ahead of it; reboots and maintenance keep it, and are only announced.
    pub fn takes_instance(&self) -> bool {
        matches!(self.code.as_str(), "instance-retirement" | "instance-stop")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceInfo {
    pub instance_id: String,
    pub region: String,
    pub availability_zone: String,
    pub instance_type: String,
    pub state: InstanceState,
    pub health: InstanceHealth,
    pub reservation_id: Option<String>,
    pub launched_at: Option<DateTime<Utc>>,
    pub tags: BTreeMap<String, String>,
    /// What EC2 has scheduled for it (read with its status checks).
    #[serde(default)]
    pub scheduled: Vec<ScheduledChange>,
}

/// Which instances to describe; filters are AND-ed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceFilter {
    pub instance_ids: Vec<String>,
    pub reservation_id: Option<String>,
    /// `capacity-pilot:request-id`.
    pub request_id: Option<RequestId>,
    /// Only `capacity-pilot:managed` instances.
    pub managed_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainingJobSpec {
    pub region: String,
    pub job_name: String,
    pub role_arn: String,
    pub training_image: String,
    pub output_s3_uri: String,
    pub instance_type: String,
    pub instance_count: u32,
    pub volume_size_gb: u32,
    /// `None` runs on demand.
    pub training_plan_arn: Option<String>,
    pub max_runtime_seconds: u32,
    pub hyper_parameters: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    InProgress,
    Completed,
    Failed,
    Stopping,
    Stopped,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    pub job_name: String,
    pub state: JobState,
    /// AWS's secondary status, e.g. `Pending`, `Training`.
    pub detail: String,
    pub failure_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceGroupSpec {
    pub region: String,
    pub cluster_name: String,
    pub instance_group_name: String,
    pub instance_type: String,
    pub instance_count: u32,
    pub training_plan_arn: Option<String>,
    pub execution_role_arn: String,
    pub life_cycle_source_s3_uri: Option<String>,
    pub life_cycle_on_create: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceGroupInfo {
    pub cluster_name: String,
    /// Whether the cluster carries `capacity-pilot:managed`; we touch no other cluster.
    pub cluster_managed: bool,
    pub instance_group_name: Option<String>,
    pub current_count: u32,
    pub target_count: u32,
    pub status: String,
    /// Every group of the cluster with its execution role (group name, role ARN):
    /// UpdateCluster sends each back with its role, which the caller must be allowed to pass.
    #[serde(default)]
    pub group_roles: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSpec {
    pub region: String,
    pub endpoint_name: String,
    pub endpoint_config_name: String,
    pub model_name: String,
    pub variant_name: String,
    pub instance_type: String,
    pub instance_count: u32,
    /// The training plan ARN (`capacity-reservations-only`); `None` runs on demand.
    pub ml_reservation_arn: Option<String>,
    pub tags: BTreeMap<String, String>,
}

/// What [`Workloads::create_endpoint`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointCreation {
    /// The endpoint was created, or one of its name exists already.
    Created,
    /// The endpoint config is not visible to SageMaker yet (`why`), so no endpoint was
    /// created: create it again on a later call. AWS documents the lag (botocore `sagemaker`
    /// model, CreateEndpoint: "If the dependent entities are not yet in DynamoDB, this causes
    /// a validation error … We also recommend that customers call DescribeEndpointConfig
    /// before calling CreateEndpoint").
    ConfigNotVisible(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointInfo {
    pub endpoint_name: String,
    /// AWS's `EndpointStatus`, e.g. `Creating`, `InService`, `Failed`.
    pub status: String,
    pub failure_reason: Option<String>,
    /// Its tags (ListTags): whose it is ([`crate::domain::naming::owns`]).
    pub tags: BTreeMap<String, String>,
}

pub trait Workloads: Send + Sync {
    fn launch_instances(
        &self,
        spec: &LaunchSpec,
    ) -> impl Future<Output = Result<Vec<InstanceInfo>, PortError>> + Send;

    fn describe_instances(
        &self,
        region: &str,
        filter: &InstanceFilter,
    ) -> impl Future<Output = Result<Vec<InstanceInfo>, PortError>> + Send;

    /// Idempotent: terminating a terminated instance succeeds.
    fn terminate_instances(
        &self,
        region: &str,
        instance_ids: &[String],
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// Sets `tags` on the instances (EC2 CreateTags): a window's instances get its new
    /// `capacity-pilot:drain-at` when AWS moves its end (ARCHITECTURE §9.3). Idempotent; an
    /// instance gone is skipped.
    fn tag_instances(
        &self,
        region: &str,
        instance_ids: &[String],
        tags: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// The pre-flight of a launch (ARCHITECTURE §8.1): the launch template resolves in the
    /// spec's region and, with `dry_run`, RunInstances for `spec` with `DryRun` passes. The
    /// error carries the service's code (`InvalidLaunchTemplateId.NotFound`,
    /// `UnauthorizedOperation`, `InsufficientInstanceCapacity` …), for
    /// [`crate::workload::preflight`] to read.
    fn preflight_instances(
        &self,
        spec: &LaunchSpec,
        dry_run: bool,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// Whether SageMaker model `model_name` exists in `region` (DescribeModel).
    fn model_exists(
        &self,
        region: &str,
        model_name: &str,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;

    /// Those of `subnet_ids` that are in `region`, in their order, each with its zone.
    fn subnet_zones(
        &self,
        region: &str,
        subnet_ids: &[String],
    ) -> impl Future<Output = Result<Vec<(String, String)>, PortError>> + Send;

    /// The first of `subnet_ids` in `availability_zone`, if any.
    fn subnet_in_zone(
        &self,
        region: &str,
        subnet_ids: &[String],
        availability_zone: &str,
    ) -> impl Future<Output = Result<Option<String>, PortError>> + Send;

    /// Creates the job; an existing job of that name is success (the name is our key).
    fn start_training_job(
        &self,
        spec: &TrainingJobSpec,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    fn describe_training_job(
        &self,
        region: &str,
        job_name: &str,
    ) -> impl Future<Output = Result<Option<JobInfo>, PortError>> + Send;

    fn stop_training_job(
        &self,
        region: &str,
        job_name: &str,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    fn describe_instance_group(
        &self,
        region: &str,
        cluster_name: &str,
        instance_group_name: &str,
    ) -> impl Future<Output = Result<Option<InstanceGroupInfo>, PortError>> + Send;

    /// Creates or resizes the instance group on the cluster (UpdateCluster).
    fn put_instance_group(
        &self,
        spec: &InstanceGroupSpec,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// Removes the instance group from the cluster (UpdateCluster's
    /// `InstanceGroupsToDelete`, every other group sent back as it is); `false` when the
    /// cluster has no group of that name (removed already, by us or another party).
    fn remove_instance_group(
        &self,
        region: &str,
        cluster_name: &str,
        instance_group_name: &str,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;

    /// The state of a training plan (DescribeTrainingPlan), `None` when SageMaker does not
    /// know it: an endpoint can use a plan only while it is `Active` (aws-reference §11.2).
    fn plan_state(
        &self,
        region: &str,
        plan_arn: &str,
    ) -> impl Future<
        Output = Result<Option<crate::domain::reservation::ReservationState>, PortError>,
    > + Send;

    /// Creates the endpoint config, then the endpoint once the config is visible; existing
    /// ones of those names are success. A config not visible yet is
    /// [`EndpointCreation::ConfigNotVisible`], never an error.
    fn create_endpoint(
        &self,
        spec: &EndpointSpec,
    ) -> impl Future<Output = Result<EndpointCreation, PortError>> + Send;

    fn describe_endpoint(
        &self,
        region: &str,
        endpoint_name: &str,
    ) -> impl Future<Output = Result<Option<EndpointInfo>, PortError>> + Send;

    /// Deletes the endpoint and its config; missing ones are success.
    fn delete_endpoint(
        &self,
        region: &str,
        endpoint_name: &str,
        endpoint_config_name: &str,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
}

// =======================================================================================
// Events out, and the clock.
// =======================================================================================

/// An event to publish on our bus, with source `capacity-pilot`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundEvent {
    /// Stable across re-publication, so consumers can drop duplicates; unique per event.
    pub event_key: String,
    pub detail_type: String,
    /// The JSON detail, carrying `event_key` too.
    pub detail: serde_json::Value,
    /// What the notices topic is told of it (ARCHITECTURE §9.2), rendered when the event was
    /// written; none for an event people are not told of, and for an outbox item written
    /// before notices existed (it goes to the bus only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<crate::domain::notices::Notice>,
}

impl OutboundEvent {
    /// The same event, told to no one (it still goes to the bus).
    pub fn unannounced(mut self) -> OutboundEvent {
        self.notice = None;
        self
    }
}

/// What a publish did with each event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Keys accepted by the bus.
    pub sent: Vec<String>,
    /// Keys refused, with the code and message; the caller keeps them for the next run.
    pub failed: Vec<(String, String, String)>,
}

pub trait EventSink: Send + Sync {
    /// Publishes in batches of at most 10, retrying failed entries; never drops silently.
    fn publish(
        &self,
        events: &[OutboundEvent],
    ) -> impl Future<Output = Result<PublishReport, PortError>> + Send;
}

/// The notices topic (ARCHITECTURE §9.2): SNS `Publish`, one notice per call.
pub trait NoticeSink: Send + Sync {
    /// Publishes each `(event_key, notice)`; reports the keys the topic took and those it
    /// refused, never dropping one silently.
    fn notify(
        &self,
        notices: &[(String, crate::domain::notices::Notice)],
    ) -> impl Future<Output = Result<PublishReport, PortError>> + Send;
}

/// Where ids and lease tokens come from (ARCHITECTURE §8.12): random in production
/// ([`crate::aws::ids::RandomIds`]), seeded in a simulation ([`crate::ids::SeededIds`]).
pub trait Ids: Send + Sync + std::fmt::Debug {
    fn next_id(&self) -> String;
}

/// The id source a handler holds.
pub type SharedIds = std::sync::Arc<dyn Ids>;

pub use aws_smithy_async::rt::sleep::AsyncSleep;
/// Where sleeps come from: the SDK's own sleep, so production sleeps on tokio and a
/// simulation on its own time.
pub use aws_smithy_async::rt::sleep::SharedAsyncSleep as Sleep;

/// The sleep production uses when no other is given: tokio's, as the SDK's own default.
pub fn default_sleep() -> Sleep {
    aws_smithy_async::rt::sleep::default_async_sleep()
        .unwrap_or_else(|| Sleep::new(aws_smithy_async::rt::sleep::TokioSleep::new()))
}

pub trait Clock: Send + Sync {
    fn now(&self) -> impl Future<Output = Result<DateTime<Utc>, PortError>> + Send;
}

/// How much wall-clock time the invocation has left: the Lambda deadline, handed to the
/// handler by the runtime. Work that takes seconds per call (RunInstances for GPU types,
/// aws-reference §11.1) stops while there is time left to record it, and the next tick
/// carries on where it stopped.
pub trait Deadline: Send + Sync {
    fn remaining(&self) -> std::time::Duration;
}

/// A deadline at a fixed instant of the wall clock.
#[derive(Debug, Clone, Copy)]
pub struct WallDeadline(pub std::time::Instant);

impl WallDeadline {
    /// `timeout` from now.
    pub fn after(timeout: std::time::Duration) -> WallDeadline {
        WallDeadline(std::time::Instant::now() + timeout)
    }

    /// Lambda's deadline: milliseconds since the Unix epoch (`Lambda-Runtime-Deadline-Ms`).
    pub fn at_epoch_ms(deadline_ms: u64) -> WallDeadline {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        WallDeadline::after(std::time::Duration::from_millis(
            deadline_ms.saturating_sub(now_ms),
        ))
    }
}

impl Deadline for WallDeadline {
    fn remaining(&self) -> std::time::Duration {
        self.0.saturating_duration_since(std::time::Instant::now())
    }
}

// =======================================================================================
// The store: transitions, leases, the budget ledger, the outbox and due work.
// =======================================================================================

/// The event (or scheduled tick) that caused a write. Its id is recorded in the same
/// transaction, so a duplicate delivery is a no-op. Records are kept per request: one
/// scheduled tick may move many requests, but each request only once.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cause {
    pub event_id: String,
}

impl Cause {
    /// One write of an invocation caused by this event: the store treats a repeated cause
    /// as a duplicate delivery, so each write of one invocation names its own step.
    pub fn step(&self, what: &str) -> Cause {
        Cause::new(format!("{}#{what}", self.event_id))
    }

    pub fn new(event_id: impl Into<String>) -> Cause {
        Cause {
            event_id: event_id.into(),
        }
    }
}

/// A calendar month of a team's budget, `YYYY-MM` in UTC.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BudgetMonth(pub String);

impl BudgetMonth {
    pub fn of(t: DateTime<Utc>) -> BudgetMonth {
        BudgetMonth(format!("{:04}-{:02}", t.year(), t.month()))
    }
}

/// A purchase lease: while it has not expired, only its holder may buy or record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Lease {
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

/// What a purchase was about to buy, and since when (ARCHITECTURE §8.6): the lease
/// transaction records it, and from then until the purchase is recorded or released a
/// takeover cannot know whether AWS sold it. While it stands (`since` + the in-doubt window)
/// the offerings are only reconciled, never bought again, and their debit never released
/// on `OfferingGone` or a refusal: either is exactly what our own success looks like.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Doubt {
    pub offering_ids: Vec<String>,
    pub since: DateTime<Utc>,
}

/// Whether the purchase under a lease called AWS (ARCHITECTURE §8.6 as amended in §9.1). The
/// lease transaction of a new purchase writes [`PurchaseCall::None`]; before each purchase
/// call a conditional write under the lease, confirmed before the call, records
/// [`PurchaseCall::Called`] (a write whose outcome is unknown may have landed, so it counts
/// as a call). A takeover keeps what it finds. A record with no marker at all was written
/// before the marker was: its purchase is in doubt from its lease, as before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PurchaseCall {
    /// No lease of this request and plan recorded a call: nothing can have been bought.
    None,
    /// A call may have been made: the offerings called under this plan's leases, and the
    /// time of the latest call, from which the doubt of what is not recorded stands.
    Called {
        at: DateTime<Utc>,
        offering_ids: Vec<String>,
    },
}

/// A cancellation that could not be applied when it came (ARCHITECTURE §8.3): it came during
/// `Purchasing`, or while a bought reservation's payment was not yet taken. It is applied if
/// the purchase does not complete or the payment fails, and refused once the payment is
/// taken; until then no step buys for the request again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancelNote {
    /// The requester's reason, as the answer will give it.
    pub reason: String,
    pub at: DateTime<Utc>,
    /// The cancellation event's id.
    pub event_id: String,
    /// The status it found, when it is applied later than it came (an on-demand run is
    /// stopped and settled first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<RequestStatus>,
    /// It asked for the paid windows to be stopped too (`stop_running`): applied once the
    /// payment it waits for is taken, it stops the windows bought meanwhile.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop_running: bool,
    /// The windows it stopped when it came (a purchase under way held others): its answer
    /// lists them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped: Vec<crate::domain::window::KeptWindow>,
}

/// The attempt of an on-demand run ([`OnDemandRun::attempt`]), and the reservation id of its
/// slots' workload records.
pub const ON_DEMAND: &str = "on-demand";
/// The attempt of a spot run, likewise.
pub const SPOT: &str = "spot";

/// An `on-demand-first` request's run on demand or spot (ARCHITECTURE §4, §8.3): which
/// attempt its held estimate is for, and since when. The estimate stays the request's open
/// debit while anything may run, and is settled once, when the run ends, by the hours it ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnDemandRun {
    /// [`ON_DEMAND`] or [`SPOT`]: the attempt the open debit is the estimate of.
    pub attempt: String,
    pub held_at: DateTime<Utc>,
    /// When its launch was seen done; none while it is starting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// The sum of its slots' generations when it started: the launch's own relaunches
    /// (take-backs in other placements, retries), which are no replacements.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub launch_generations: u32,
    /// The invocation launching the hold now, until its function timeout: while it stands,
    /// no other invocation launches it (two at once each take back the other's instances).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Lease>,
    /// A spot run that lost an instance it could not repair within the replacement cap
    /// falls back as `on-demand-first` does (ARCHITECTURE §9.1): written with `Draining`,
    /// cleanup-expired then stops the run, settles what it ran and searches for the earliest
    /// feasible reservation. Kept after, as the run's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fall_back: Option<FallBack>,
    /// The approval this attempt's hold asked for, its estimate being above the request's
    /// approval threshold (review N9): written with `AwaitingApproval` before anything is
    /// held, and with `TryingOnDemand` once approved, so the hold goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<HoldApproval>,
}

/// An on-demand or spot hold's approval ([`OnDemandRun::approval`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldApproval {
    /// The estimate asked for: an approval lets at most this be held.
    pub estimate: Usd,
    pub asked_at: DateTime<Utc>,
    /// Who approved; `None` while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
}

/// Why and when a spot run fell back to a reservation ([`OnDemandRun::fall_back`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FallBack {
    pub reason: String,
    pub at: DateTime<Utc>,
}

impl OnDemandRun {
    /// What of `estimate` (for `count` instances over `hours` hours) stays spent by what the
    /// run's slots ran (ARCHITECTURE §9.1): each instance from its launch to when it was first
    /// seen not running (to `now` when never seen), in whole hours begun, at least one,
    /// summed, at most `count` x `hours`. Only what ran in this hold counts (a released
    /// hold's take-backs were settled with it). With no instance recorded (another kind, or
    /// a run that never launched one) the run is settled by its length ([`Self::spent`]).
    pub fn spent_by_slots(
        &self,
        estimate: MicroUsd,
        count: u32,
        hours: u32,
        slots: &[WorkloadRecord],
        now: DateTime<Utc>,
    ) -> MicroUsd {
        let from = Some(self.started_at.unwrap_or(self.held_at));
        let ran: u64 = slots
            .iter()
            .filter(|w| w.reservation_id == self.attempt)
            .flat_map(|w| w.runs(from, now))
            .filter(|r| r.to >= self.held_at)
            .map(|r| hours_begun(r.from, r.to).max(1))
            .sum();
        if ran == 0 {
            return self.spent(estimate, hours, now);
        }
        share(
            estimate,
            ran,
            u64::from(count.max(1)) * u64::from(hours.max(1)),
        )
    }

    /// What of `estimate` (for a run of `hours` hours) stays spent when the run ends at
    /// `ended`: whole hours from its start, or from the hold when it never started (billing
    /// may begin while it is placed), at least one and at most `hours`. The harsher reading
    /// of per-second billing: an hour begun is an hour spent.
    pub fn spent(&self, estimate: MicroUsd, hours: u32, ended: DateTime<Utc>) -> MicroUsd {
        let from = self.started_at.unwrap_or(self.held_at);
        let ran = hours_begun(from, ended).clamp(1, u64::from(hours.max(1)));
        share(estimate, ran, u64::from(hours))
    }
}

/// The whole hours begun between `from` and `to` (none when `to` is not after `from`).
fn hours_begun(from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    u64::try_from((to - from).num_seconds())
        .unwrap_or(0)
        .div_ceil(3600)
}

/// `ran` of `whole` parts of `estimate`, rounded up to the micro-dollar; the whole estimate
/// once `ran` reaches `whole`.
fn share(estimate: MicroUsd, ran: u64, whole: u64) -> MicroUsd {
    let (Ok(total), true) = (u128::try_from(estimate.0), ran < whole) else {
        return estimate;
    };
    let part = (total * u128::from(ran)).div_ceil(u128::from(whole));
    MicroUsd(i64::try_from(part).unwrap_or(estimate.0))
}

/// A request as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub request_id: RequestId,
    pub team: Team,
    pub request: CapacityRequest,
    pub status: RequestStatus,
    /// Incremented by every write; the condition of the next one.
    pub version: u64,
    /// Why the request is in its status.
    pub reason: String,
    /// When the function that owns its status should look at it next (a search, a lease's
    /// expiry). The due-work index holds the earliest of this and its windows' next actions
    /// ([`RequestRecord::due_at`]).
    pub next_action_at: Option<DateTime<Utc>>,
    /// What has happened to each of its windows (ARCHITECTURE §8.4), in number order.
    pub windows: Vec<WindowRecord>,
    pub lease: Option<Lease>,
    /// The purchase under way, recorded with its lease (§8.6). On a terminal request: a
    /// purchase that ended in doubt, reconciled hourly until its offerings end
    /// ([`RequestRecord::in_doubt`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doubt: Option<Doubt>,
    /// Whether the purchase under the lease called AWS ([`PurchaseCall`]); `None` on a
    /// record written before the marker was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purchase_call: Option<PurchaseCall>,
    /// A cancellation kept until the purchase or its payment settles (§8.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<CancelNote>,
    /// The outstanding purchase debit, released only when reconciliation shows no
    /// reservation exists.
    pub open_debit: Option<MicroUsd>,
    /// Its run on demand or spot, from the estimate's hold on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<OnDemandRun>,
    /// Its search round: each query's outcome until it decides (ARCHITECTURE §8.8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<crate::search::SearchRound>,
    /// Everything this request has been debited and kept (purchases and on-demand spend).
    pub spent: MicroUsd,
    /// The ranked plans from the last search.
    pub candidates: Vec<Plan>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl RequestRecord {
    /// Whose its events are ([`crate::domain::events::event_key`]): this request, in the
    /// incarnation created at its `created_at`.
    pub fn whose(&self) -> crate::domain::events::Whose<'_> {
        crate::domain::events::Whose {
            request_id: self.request_id.as_str(),
            created_at: self.created_at,
        }
    }

    /// When the request is due: the earliest of its own next action and its windows'.
    pub fn due_at(&self) -> Option<DateTime<Utc>> {
        crate::domain::window::next_action_at(self.next_action_at, &self.windows)
    }

    /// When capacity-pilot next acts on it (its own next action, or a window's launch, drain
    /// or end), its lead-time notices aside: what a person is shown as its next step.
    pub fn next_step_at(&self) -> Option<DateTime<Utc>> {
        crate::domain::window::window_action_at(&self.windows)
            .into_iter()
            .chain(self.next_action_at)
            .min()
    }

    /// Whether one of its windows is due: launch and cleanup have work on it now, whatever
    /// its status.
    pub fn window_due(&self, now: DateTime<Utc>) -> bool {
        self.windows
            .iter()
            .any(|w| w.next_action_at.is_some_and(|t| t <= now))
    }

    /// Whether a lead-time notice of one of its windows is due (cleanup's work).
    pub fn notice_due(&self, now: DateTime<Utc>) -> bool {
        crate::domain::window::notice_at(&self.windows).is_some_and(|t| t <= now)
    }

    /// Whether it ended with a purchase in doubt (ARCHITECTURE §9.1): a call may have bought
    /// what reconciliation could not see. Its debit stays, and it is reconciled hourly until
    /// the doubted offerings end.
    pub fn in_doubt(&self) -> bool {
        self.status.is_terminal() && self.doubt.is_some()
    }

    /// Whether it is archived (its TTL set): [`crate::domain::window::archivable`], and no
    /// purchase of it in doubt.
    pub fn archivable(&self) -> bool {
        crate::domain::window::archivable(self.status, &self.windows) && !self.in_doubt()
    }

    /// Whether the function owning its status has work now: the request may be in the due
    /// index only for one of its windows.
    pub fn own_action_due(&self, now: DateTime<Utc>) -> bool {
        self.next_action_at.is_some_and(|t| t <= now)
    }

    /// What of its duration a spot run served before it fell back (ARCHITECTURE §9.1): the
    /// whole hours from the run's start to its fall-back. Spot runs only an `interruptible`
    /// workload, one that keeps its work across an interruption, so only the rest is still
    /// needed. Nothing for any other request.
    pub fn served(&self) -> chrono::Duration {
        let Some(run) = &self.run else {
            return chrono::Duration::zero();
        };
        match (run.started_at, &run.fall_back) {
            (Some(from), Some(f)) => {
                let hours = (f.at - from).num_hours();
                chrono::Duration::hours(hours.clamp(0, i64::from(self.request.duration_hours)))
            }
            _ => chrono::Duration::zero(),
        }
    }

    /// What of its duration it still needs reserved: all of it, less what a spot run that
    /// fell back served ([`Self::served`]).
    pub fn needed(&self) -> chrono::Duration {
        self.request.duration() - self.served()
    }

    /// What it still needs reserved, in the whole days a request asks for: its duration, or
    /// after a spot run's fall-back the days that cover the rest (at least one).
    pub fn needed_hours(&self) -> u32 {
        if self.served().is_zero() {
            return self.request.duration_hours;
        }
        let hours = u32::try_from(self.needed().num_hours()).unwrap_or(0);
        hours.div_ceil(24).max(1) * 24
    }

    /// Whether what it `held` already serves it: the reservations it takes cover what it
    /// still needs ([`Self::needed`]), so nothing more is to be bought for it.
    pub fn is_served_by<'a>(&self, held: impl IntoIterator<Item = &'a Reservation>) -> bool {
        self.request.covered_by(held) >= self.needed()
    }
}

/// A new, validated request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewRequest {
    pub request: CapacityRequest,
    /// The EventBridge source that submitted it: a tombstone from the same source cancels it.
    pub source: String,
    /// `Some(reason)`: honouring a tombstone, the request is recorded already `Cancelled`.
    pub cancelled: Option<String>,
    pub reason: String,
    pub next_action_at: Option<DateTime<Utc>>,
    pub at: DateTime<Utc>,
    pub caused_by: Cause,
    pub outbox: Vec<OutboundEvent>,
    /// The workload names it claims (ARCHITECTURE §9.8), written in the same transaction,
    /// each on the version read: two submissions that read one claim cannot both commit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<ClaimWrite>,
}

/// A workload name a request claims in a region (ARCHITECTURE §9.8): an inference endpoint,
/// or a HyperPod cluster's instance group. AWS compares these names case-insensitively, so
/// the name is kept lower-cased.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClaimKey {
    pub region: String,
    /// `endpoint` or `hyperpod-group`.
    pub kind: String,
    /// The endpoint name, or `<cluster>/<group>`, lower-cased.
    pub name: String,
}

impl ClaimKey {
    pub fn new(region: &str, kind: &str, name: &str) -> ClaimKey {
        ClaimKey {
            region: region.to_string(),
            kind: kind.to_string(),
            name: name.to_lowercase(),
        }
    }
}

impl std::fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}#{}", self.region, self.kind, self.name)
    }
}

/// One request's claim on a name: the interval it may hold it in, as written (the request's
/// `[earliest_start, latest_end]`); a reader narrows it by the request's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claimant {
    pub request_id: RequestId,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

/// `CLAIM#<region>#<kind>#<name>`: who claims the name, at `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub version: u64,
    pub claimants: Vec<Claimant>,
    /// For a HyperPod group: the last claimant that created (or reused) it and has left,
    /// kept when it is dropped, so a later request may reuse the group.
    pub made_by: Option<RequestId>,
}

/// A claim's next contents, written only if it is still at `read` (`None`: absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimWrite {
    pub key: ClaimKey,
    pub read: Option<u64>,
    pub claimants: Vec<Claimant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made_by: Option<RequestId>,
}

/// A debit against the team's monthly cap and the request's own cap, applied in the same
/// transaction as the transition it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Debit {
    pub team: Team,
    pub month: BudgetMonth,
    pub amount: MicroUsd,
    pub team_cap: MicroUsd,
    /// The request's `max_upfront_usd`; its `spent` plus this debit must fit.
    pub request_cap: MicroUsd,
}

impl Debit {
    /// `amount` for `rec`, charged to its team's ledger (the lower-cased team, §9.8) for the
    /// month of `at`, within the team's monthly cap `team_cap` and the request's own
    /// `max_upfront_usd`.
    pub fn of(rec: &RequestRecord, team_cap: Usd, amount: MicroUsd, at: DateTime<Utc>) -> Debit {
        Debit {
            team: rec.team.ledger(),
            month: BudgetMonth::of(at),
            amount,
            team_cap: team_cap.to_micros_ceil(),
            request_cap: rec.request.budget.max_upfront.to_micros_ceil(),
        }
    }

    /// The debit within what is left of the team's cap once the month's spend under the
    /// key debits used before §9.8 (the team exactly as `rec` gives it, when that is not
    /// lower-case) is counted: the month the upgrade lands in keeps one cap. One read, only
    /// for such a team; that ledger only shrinks after the upgrade (releases and refunds
    /// credit it), so a stale read errs on the safe side.
    pub async fn within_older_ledger<S: Store>(
        mut self,
        store: &S,
        rec: &RequestRecord,
    ) -> Result<Debit, PortError> {
        if rec.team != self.team {
            let before = store.budget_spent(&rec.team, &self.month).await?;
            self.team_cap = MicroUsd(self.team_cap.0 - before.0);
        }
        Ok(self)
    }

    /// Whether a request that has spent `spent` cannot take this debit within its own cap.
    pub fn over_request_cap(&self, spent: MicroUsd) -> bool {
        spent.0 + self.amount.0 > self.request_cap.0
    }
}

/// A status change, conditional on `expected_version` and `from`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub request_id: RequestId,
    pub expected_version: u64,
    pub from: RequestStatus,
    pub to: RequestStatus,
    pub reason: String,
    pub next_action_at: Option<DateTime<Utc>>,
    pub at: DateTime<Utc>,
    pub caused_by: Cause,
    pub outbox: Vec<OutboundEvent>,
    /// Replaces the recorded candidate plans when `Some`.
    pub candidates: Option<Vec<Plan>>,
    /// On-demand and spot launches debit their estimated cost with the transition.
    pub debit: Option<Debit>,
    /// With `debit`: hold it as the request's open debit (an on-demand estimate taken before
    /// launching) instead of keeping it at once; a later transition keeps or releases it.
    /// Refused while another debit is open.
    pub hold: bool,
    /// What becomes of the request's open debit with this transition; nothing when none is
    /// open.
    pub settle: Option<Settle>,
    /// Replaces the request's window records when `Some`.
    pub windows: Option<Vec<WindowRecord>>,
    /// Replaces the request's on-demand run record when `Some`.
    pub run: Option<OnDemandRun>,
    /// Replaces the request's search round when `Some`; an empty round clears it.
    pub search: Option<crate::search::SearchRound>,
    /// Keeps this cancellation on the request when `Some`: it is applied by the function
    /// the new status belongs to (an on-demand run's, once stopped and settled).
    pub cancel: Option<CancelNote>,
    /// Recorded reservations as they are now (a state AWS reported after the purchase),
    /// each replacing the record with its id.
    pub reservations: Vec<Reservation>,
    /// A kept debit going back: a reservation's payment failed (ARCHITECTURE §8.5).
    pub refund: Option<Refund>,
    /// A terminal request's purchase in doubt is resolved: its doubt and call marker are
    /// cleared ([`RequestRecord::in_doubt`]).
    pub resolve_doubt: bool,
    /// Written only while purchases are not paused (ARCHITECTURE §9.7): an extension's lease
    /// and debit, like a hold's, are refused once a pause commits (`WriteOutcome::Paused`).
    #[serde(default)]
    pub unpaused: bool,
}

/// A kept purchase debit returned to the ledger it was charged to (`team`, `month`) and taken
/// out of the request's `spent`; refused if either holds less.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    pub month: BudgetMonth,
    pub amount: MicroUsd,
    /// The ledger's team, as the debit recorded it; `None` (a reservation recorded before
    /// debits recorded it): the request's team exactly as given, the key debits used then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<Team>,
}

/// The fate of a held debit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Settle {
    /// Nothing was launched: it goes back to the ledger and out of `spent`.
    Release,
    /// This much of it was spent (what a run actually ran) and stays; the rest goes back.
    /// More than is held keeps all of it.
    Spend(MicroUsd),
}

impl Settle {
    /// What of `open` goes back to the ledger.
    pub fn released(self, open: MicroUsd) -> MicroUsd {
        match self {
            Settle::Release => MicroUsd(open.0.max(0)),
            Settle::Spend(kept) => MicroUsd((open.0 - kept.0.max(0)).max(0)),
        }
    }
}

impl Transition {
    /// A status change of `rec` caused by `cause`, with no outbox, candidates or debit.
    pub fn of(
        rec: &RequestRecord,
        to: RequestStatus,
        reason: &str,
        next_action_at: Option<DateTime<Utc>>,
        at: DateTime<Utc>,
        cause: &Cause,
    ) -> Transition {
        Transition {
            request_id: rec.request_id.clone(),
            expected_version: rec.version,
            from: rec.status,
            to,
            reason: reason.to_string(),
            next_action_at,
            at,
            caused_by: cause.clone(),
            outbox: vec![],
            candidates: None,
            debit: None,
            hold: false,
            settle: None,
            windows: None,
            run: None,
            search: None,
            cancel: None,
            reservations: vec![],
            refund: None,
            resolve_doubt: false,
            unpaused: false,
        }
    }

    /// The same transition, replacing the request's window records with `windows`.
    pub fn with_windows(mut self, windows: Vec<WindowRecord>) -> Transition {
        self.windows = Some(windows);
        self
    }

    /// The same transition, holding `debit` as the request's open debit.
    pub fn holding(mut self, debit: Debit) -> Transition {
        self.debit = Some(debit);
        self.hold = true;
        self
    }

    /// The same transition, recording the request's search round as `round`.
    pub fn with_search(mut self, round: crate::search::SearchRound) -> Transition {
        self.search = Some(round);
        self
    }

    /// The same transition, recording the request's on-demand run as `run`.
    pub fn with_run(mut self, run: OnDemandRun) -> Transition {
        self.run = Some(run);
        self
    }

    /// The same transition, keeping `note` on the request for the new status's function
    /// to apply.
    pub fn keeping_cancel(mut self, note: CancelNote) -> Transition {
        self.cancel = Some(note);
        self
    }

    /// The same transition, settling the request's open debit as `settle` says (nothing
    /// when `None`).
    pub fn settling(mut self, settle: impl Into<Option<Settle>>) -> Transition {
        self.settle = settle.into();
        self
    }

    /// The same transition, recording `reservations` as AWS now reports them and returning
    /// `refund`.
    pub fn with_reservations(
        mut self,
        reservations: Vec<Reservation>,
        refund: Option<Refund>,
    ) -> Transition {
        self.reservations = reservations;
        self.refund = refund;
        self
    }

    /// The same transition, publishing `outbox` with it.
    pub fn with_outbox(mut self, outbox: Vec<OutboundEvent>) -> Transition {
        self.outbox = outbox;
        self
    }
}

/// A change of a request's windows, conditional on `expected_version` and `status`, in any
/// status (a split's kept block runs while its replacement is searched or bought). A request
/// whose status summarises its windows (`Reserved`, `Active`, `Draining`) moves to what
/// the new windows imply (`domain::window::summary`), `Ended` included; any other status is
/// left as it is, with its lease, debit and own next action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowUpdate {
    pub request_id: RequestId,
    pub expected_version: u64,
    pub status: RequestStatus,
    pub windows: Vec<WindowRecord>,
    pub reason: String,
    pub at: DateTime<Utc>,
    pub caused_by: Cause,
    pub outbox: Vec<OutboundEvent>,
    /// Recorded reservations written again as given (AWS moved their ends, ARCHITECTURE
    /// §9.3), in the same write as the windows that derive from them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<Reservation>,
}

impl WindowUpdate {
    /// `rec`'s windows becoming `windows`, for `reason`.
    pub fn of(
        rec: &RequestRecord,
        windows: Vec<WindowRecord>,
        reason: &str,
        at: DateTime<Utc>,
        cause: &Cause,
        outbox: Vec<OutboundEvent>,
    ) -> WindowUpdate {
        WindowUpdate {
            request_id: rec.request_id.clone(),
            expected_version: rec.version,
            status: rec.status,
            windows,
            reason: reason.to_string(),
            at,
            caused_by: cause.clone(),
            outbox,
            reservations: vec![],
        }
    }

    /// The status the request has after this update.
    pub fn status_after(&self) -> RequestStatus {
        if crate::domain::window::FOLLOWS_WINDOWS.contains(&self.status) {
            crate::domain::window::summary(&self.windows).unwrap_or(self.status)
        } else {
            self.status
        }
    }

    /// The same change as a status transition, when it changes the status: the store writes
    /// it as one, so debits, outbox and archival work as for any other.
    pub fn as_transition(&self) -> Option<Transition> {
        let to = self.status_after();
        (to != self.status).then(|| Transition {
            request_id: self.request_id.clone(),
            expected_version: self.expected_version,
            from: self.status,
            to,
            reason: self.reason.clone(),
            // The windows are what is due now.
            next_action_at: None,
            at: self.at,
            caused_by: self.caused_by.clone(),
            outbox: self.outbox.clone(),
            candidates: None,
            debit: None,
            hold: false,
            settle: None,
            windows: Some(self.windows.clone()),
            run: None,
            search: None,
            cancel: None,
            reservations: self.reservations.clone(),
            refund: None,
            resolve_doubt: false,
            unpaused: false,
        })
    }
}

/// Takes the purchase lease and debits the budget in one transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BeginPurchase {
    pub request_id: RequestId,
    pub expected_version: u64,
    /// `OfferingsFound` or `AwaitingApproval`; or `Purchasing` to take over an expired lease.
    pub from: RequestStatus,
    pub lease: Lease,
    /// `None` when taking over: the first worker's debit stays open.
    pub debit: Option<Debit>,
    /// The offerings about to be bought, recorded as the doubt that stands until the
    /// purchase is recorded or released; `None` when taking over keeps the first worker's.
    pub doubt: Option<Doubt>,
    pub reason: String,
    pub at: DateTime<Utc>,
    pub caused_by: Cause,
    pub outbox: Vec<OutboundEvent>,
}

/// Records a bought (or adopted) reservation; refused unless the lease is still ours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordReservation {
    pub request_id: RequestId,
    pub lease_token: String,
    pub reservation: Reservation,
    /// `Reserved`, or `Purchasing` when a split plan still has a segment to buy.
    pub to: RequestStatus,
    pub reason: String,
    pub next_action_at: Option<DateTime<Utc>>,
    pub at: DateTime<Utc>,
    pub caused_by: Cause,
    pub outbox: Vec<OutboundEvent>,
    /// A stray (ARCHITECTURE 8.6): a live reservation tagged for this request and this
    /// deployment that no plan of it accounts for. Its fee is charged by this debit, to the
    /// ledger and to `spent`, with no cap (it is bought: the money is gone either way), and
    /// the open debit is not reduced by it; to `Reserved`, what stays open of the plan's debit
    /// goes back, because none of the plan was bought for it.
    #[serde(default)]
    pub uncapped: Option<Debit>,
}

/// Keeps a cancellation on a request that cannot be cancelled now (§8.3), or clears it once
/// answered. Changes nothing else but the reason and the next action; conditional on the
/// version and status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeepCancellation {
    pub request_id: RequestId,
    pub expected_version: u64,
    pub status: RequestStatus,
    /// `Some`: keep it; `None`: it was answered, clear it.
    pub note: Option<CancelNote>,
    pub reason: String,
    pub next_action_at: Option<DateTime<Utc>>,
    pub at: DateTime<Utc>,
    pub caused_by: Cause,
    pub outbox: Vec<OutboundEvent>,
}

/// Records, under the lease and before the call, that the purchase is about to call AWS for
/// `offering_ids` ([`PurchaseCall::Called`], joined to the offerings called before under this
/// plan). Refused unless the request is `Purchasing` under this lease, unexpired at `at`.
/// Makes a version and a history entry, so a takeover that read the request before it is
/// refused and reads it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MarkPurchaseCall {
    pub request_id: RequestId,
    pub lease_token: String,
    pub offering_ids: Vec<String>,
    pub reason: String,
    pub at: DateTime<Utc>,
    pub caused_by: Cause,
}

/// Ends a purchase whose call may have bought what reconciliation cannot see, past the
/// request's purchase deadline (ARCHITECTURE §9.1): under the lease, to `Failed` (or
/// `Cancelled`, applying a kept cancellation), keeping the open debit, the doubt and the call
/// marker, and no TTL while the doubt stands; due again at `next_action_at` for the hourly
/// reconciliation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailInDoubt {
    pub request_id: RequestId,
    pub lease_token: String,
    pub to: RequestStatus,
    pub reason: String,
    pub next_action_at: Option<DateTime<Utc>>,
    pub at: DateTime<Utc>,
    pub caused_by: Cause,
    pub outbox: Vec<OutboundEvent>,
}

/// Records "reconciled: no reservation exists" and releases the open debit: the only way
/// a debit is ever released.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseUnbought {
    pub request_id: RequestId,
    pub lease_token: String,
    /// `Searching` (the offering has gone) or `Failed`; `Reserved` when what the request
    /// already keeps serves it; `Cancelled` to apply a kept cancellation, which a release to
    /// anything else is refused while it stands.
    pub to: RequestStatus,
    /// Must say what reconciliation found.
    pub reason: String,
    pub next_action_at: Option<DateTime<Utc>>,
    pub at: DateTime<Utc>,
    pub caused_by: Cause,
    pub outbox: Vec<OutboundEvent>,
}

/// The result of a conditional write. Losing a race is normal, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    Applied {
        version: u64,
    },
    /// The version or status moved on: re-read and decide again.
    Conflict,
    /// The causing event was already processed: nothing to do.
    DuplicateEvent,
    /// The transition's debit would exceed the team's monthly cap; nothing was written.
    OverTeamBudget {
        spent: MicroUsd,
        cap: MicroUsd,
    },
    /// The transition's debit would exceed the request's `max_upfront_usd`.
    OverRequestBudget {
        spent: MicroUsd,
        cap: MicroUsd,
    },
    /// An operator paused purchases (ARCHITECTURE §9.7): a hold (`Transition::hold`) is
    /// refused while the PAUSE item exists; nothing was written.
    Paused(Pause),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginPurchaseOutcome {
    Acquired {
        version: u64,
    },
    Conflict,
    DuplicateEvent,
    /// Another worker holds an unexpired lease.
    LeaseHeld {
        until: DateTime<Utc>,
    },
    /// The team's monthly cap would be exceeded.
    OverTeamBudget {
        spent: MicroUsd,
        cap: MicroUsd,
    },
    /// The request's `max_upfront_usd` would be exceeded.
    OverRequestBudget {
        spent: MicroUsd,
        cap: MicroUsd,
    },
    /// An operator paused purchases (ARCHITECTURE §9.7): a new purchase's lease is refused
    /// while the PAUSE item exists (a takeover's is not: that purchase was under way before
    /// the pause). Nothing was written.
    Paused(Pause),
}

/// Purchases paused by an operator (ARCHITECTURE §9.7): `capacity-pilot pause` writes it and
/// `resume` deletes it. While it exists, no purchase's lease is taken and no on-demand or
/// spot run is held; everything else goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// Who paused: the caller's ARN.
    pub by: String,
    pub reason: String,
    pub since: DateTime<Utc>,
}

impl Pause {
    /// What a decision held back by it says: "paused by <by> since <since>: <reason>".
    pub fn describe(&self) -> String {
        format!(
            "paused by {} since {}: {}",
            self.by,
            self.since.format("%Y-%m-%d %H:%M UTC"),
            self.reason
        )
    }

    /// Whether `reason` (a request's) already says it was held back by this pause: each
    /// pause is written into a request's history once, not at every tick.
    pub fn told(&self, reason: &str) -> bool {
        reason.starts_with("paused") && reason.contains(&self.describe())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseWriteOutcome {
    Applied {
        version: u64,
    },
    /// The lease expired and was taken over, or was never ours: our write is refused.
    LeaseLost,
    /// A cancellation is kept on the request (§8.3): a release must apply it, to `Cancelled`.
    CancelKept,
    DuplicateEvent,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    Created {
        version: u64,
    },
    /// A request with this id exists (the caller's idempotency key).
    AlreadyExists,
    DuplicateEvent,
    /// A claim it writes is no longer at the version read: nothing was written; read the
    /// claims again and decide again.
    ClaimChanged,
    /// Its cancellation came first (§8.3): nothing was written; record it `Cancelled`.
    Tombstoned(Tombstone),
}

/// A submission the search function rejected: no request is recorded for it, so this says
/// why, under the id it claimed, for [`REJECTION_KEPT`] (what `capacity-pilot submit --wait`
/// and `status` read; the `Capacity Request Rejected` event says the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedSubmission {
    pub request_id: RequestId,
    /// The `Capacity Request Submitted` event rejected.
    pub event_id: String,
    pub source: String,
    pub at: DateTime<Utc>,
    pub problems: Vec<crate::domain::request::FieldError>,
}

/// How long a rejected submission's reasons are kept.
pub const REJECTION_KEPT: chrono::Duration = chrono::Duration::days(7);

/// A cancellation for a request id no request holds yet (ARCHITECTURE §8.3): EventBridge does
/// not order deliveries, so its submission may follow. Kept [`TOMBSTONE_KEPT`]; a submission
/// of that id from the same source in that time is recorded `Cancelled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub request_id: RequestId,
    pub source: String,
    pub reason: String,
    pub at: DateTime<Utc>,
    pub event_id: String,
}

/// How long a tombstone is honoured.
pub const TOMBSTONE_KEPT: chrono::Duration = chrono::Duration::days(7);

impl Tombstone {
    pub fn honoured(&self, source: &str, at: DateTime<Utc>) -> bool {
        self.source == source && at < self.at + TOMBSTONE_KEPT
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TombstoneOutcome {
    Placed,
    /// A request of that id is recorded after all: cancel it as usual.
    RequestExists,
    DuplicateEvent,
}

/// An outbox item not yet published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxItem {
    pub request_id: String,
    pub event: OutboundEvent,
    pub created_at: DateTime<Utc>,
    /// Its place among the request's outbox items of one instant ([`outbox_seq`]): writes
    /// in the order they were made, and the events of one state change in the order the
    /// handler listed them (Expiring before Drained, say).
    pub seq: u32,
}

/// The request an event names, its id compared ignoring case (review N15): the request of
/// exactly that id, else the one of another spelling that holds it.
pub async fn request_named<S: Store>(
    store: &S,
    id: &RequestId,
) -> Result<Option<RequestRecord>, PortError> {
    if let Some(rec) = store.get_request(id).await? {
        return Ok(Some(rec));
    }
    match store.spelled(id).await? {
        Some(named) => store.get_request(&named).await,
        None => Ok(None),
    }
}

/// An outbox item's `seq`: the version its write made, then its place among that write's
/// events. An invocation's writes share one `now`, so their items share a `created_at`:
/// ordering by this publishes them write by write (a window drained, then ended, then the
/// next), and each write's events in the order the handler listed them.
pub fn outbox_seq(version: u64, index: usize) -> u32 {
    let version = u32::try_from(version.min(4_000_000)).unwrap_or(4_000_000);
    let index = u32::try_from(index.min(999)).unwrap_or(999);
    version * 1000 + index
}

/// An entry of the due-work index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DueItem {
    pub request_id: RequestId,
    pub status: RequestStatus,
    pub next_action_at: DateTime<Utc>,
    /// The status's own next action (a search, a lease's expiry, a payment check), beside
    /// its windows': the function owning the status reads the request only when this is due.
    #[serde(default)]
    pub own_action_at: Option<DateTime<Utc>>,
    /// The earliest of its windows' next actions (a launch, a drain, an end).
    #[serde(default)]
    pub window_action_at: Option<DateTime<Utc>>,
    /// The earliest of its windows' lead-time notices (cleanup sends them).
    #[serde(default)]
    pub notice_at: Option<DateTime<Utc>>,
}

impl DueItem {
    /// Whether the function owning its status has work now (as the index shows it; the
    /// request read decides).
    pub fn own_action_due(&self, now: DateTime<Utc>) -> bool {
        self.own_action_at.is_some_and(|t| t <= now)
    }

    /// Whether one of its windows is due (launch and cleanup's work).
    pub fn window_due(&self, now: DateTime<Utc>) -> bool {
        self.window_action_at.is_some_and(|t| t <= now)
    }

    /// Whether a lead-time notice of one of its windows is due.
    pub fn notice_due(&self, now: DateTime<Utc>) -> bool {
        self.notice_at.is_some_and(|t| t <= now)
    }
}

/// A request whose workloads may be running ([`crate::domain::window::may_be_running`]), as
/// a tick's one read shows it: for noticing what to look at, not for deciding (a decision
/// reads the request with a consistent read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveRequest {
    pub request_id: RequestId,
    pub status: RequestStatus,
    pub windows: Vec<WindowRecord>,
    pub workloads: Vec<WorkloadRecord>,
}

/// What one scheduled tick reads in one call (the README's state section): the requests due
/// at `now`, whatever their status; the requests whose workloads may be running; and the
/// unsent outbox items.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Agenda {
    /// Earliest first.
    pub due: Vec<DueItem>,
    /// By request id.
    pub live: Vec<LiveRequest>,
    /// Oldest first ([`outbox_seq`]).
    pub outbox: Vec<OutboxItem>,
    /// The requests read that carry the archival TTL though they are terminal and hold a
    /// window not ended: written before ARCHITECTURE §9.1, each is due
    /// [`Store::unarchive`].
    pub stale_ttl: Vec<RequestId>,
    /// The reservations whose payment is due a read (ARCHITECTURE §9.1), earliest first.
    pub payments: Vec<PaymentDue>,
    /// The regions whose unrecorded-reservation detector is due (ARCHITECTURE §9.1).
    pub detectors: Vec<DetectorDue>,
    /// Purchases paused by an operator (ARCHITECTURE §9.7): the PAUSE item sits in the
    /// index before every request, so the tick's one read returns it.
    pub pause: Option<Pause>,
}

/// A region's deployment-wide detector of unrecorded reservations, due at `at`, as the
/// `work` index shows it ([`Store::claim_detector`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DetectorDue {
    pub at: DateTime<Utc>,
    pub region: String,
}

/// A reservation whose payment is due a read, as the `work` index shows it
/// ([`crate::domain::reservation::Reservation::payment_due`]); ordered earliest first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PaymentDue {
    pub at: DateTime<Utc>,
    pub request_id: RequestId,
    pub reservation_id: String,
}

impl Agenda {
    /// The requests with a payment due a read at `now`, once each, earliest first.
    pub fn payments_due(&self, now: DateTime<Utc>) -> Vec<RequestId> {
        let mut ids: Vec<RequestId> = Vec::new();
        for p in self.payments.iter().filter(|p| p.at <= now) {
            if !ids.contains(&p.request_id) {
                ids.push(p.request_id.clone());
            }
        }
        ids
    }

    /// The due requests in one of `statuses`, earliest first.
    pub fn due_in(&self, statuses: &[RequestStatus]) -> Vec<DueItem> {
        self.due
            .iter()
            .filter(|d| statuses.contains(&d.status))
            .cloned()
            .collect()
    }

    /// The requests past their next action by more than `bound` at `now`, most overdue
    /// first, with how late each is: stuck, unless held back by the operator's pause (a plan
    /// waiting to be bought, an on-demand run waiting to be held), which waits on purpose.
    pub fn overdue(
        &self,
        now: DateTime<Utc>,
        bound: chrono::Duration,
    ) -> Vec<(&DueItem, chrono::Duration)> {
        let paused = |d: &DueItem| {
            self.pause.is_some()
                && matches!(
                    d.status,
                    RequestStatus::OfferingsFound | RequestStatus::TryingOnDemand
                )
        };
        let mut late: Vec<(&DueItem, chrono::Duration)> = self
            .due
            .iter()
            .map(|d| (d, now - d.next_action_at))
            .filter(|(d, late)| *late > bound && !paused(d))
            .collect();
        late.sort_by(|x, y| {
            y.1.cmp(&x.1)
                .then_with(|| x.0.request_id.cmp(&y.0.request_id))
        });
        late
    }

    /// A request's status as the read showed it, when it was due or live.
    pub fn status_of(&self, id: &RequestId) -> Option<RequestStatus> {
        self.due
            .iter()
            .find(|d| &d.request_id == id)
            .map(|d| d.status)
            .or_else(|| {
                self.live
                    .iter()
                    .find(|l| &l.request_id == id)
                    .map(|l| l.status)
            })
    }
}

/// One state change of a request, as its history keeps it: written in the same transaction
/// as the change, archived with the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// The version the change made.
    pub version: u64,
    /// `None` for the request's creation.
    pub from: Option<RequestStatus>,
    pub to: RequestStatus,
    pub reason: String,
    /// The id of the event (and step) that caused it.
    pub cause: String,
    pub at: DateTime<Utc>,
}

/// A launched instance, job, group or endpoint, recorded under its reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadRecord {
    pub request_id: RequestId,
    /// The reservation (or `on-demand`) it runs in.
    pub reservation_id: String,
    /// Instance slot or segment index.
    pub slot: u32,
    /// Increases with each replacement; part of the launch's client token.
    pub generation: u32,
    /// Instance id, job name, `cluster/group` or endpoint name.
    pub resource_id: String,
    pub state: String,
    pub updated_at: DateTime<Utc>,
    /// When this generation's instance was launched, as EC2 reports it (ARCHITECTURE §9.1):
    /// the start of what it is billed for. `None` on a slot recorded before runs were
    /// settled by what ran, and on kinds other than EC2 instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// When this generation's instance was first seen not running: a state-change event's
    /// `time`, or the tick that found it stopped, terminated or gone past the listing lag.
    /// `None` while it runs, or when its end was never seen (it then counts to settlement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
    /// What the slot's earlier instances ran (replaced, or taken back and launched anew).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ran: Vec<Ran>,
    /// The window's relaunch it was launched in ([`crate::domain::window::WindowRecord::relaunch`]),
    /// 0 for the window's first launch: a record of an earlier one is of a workload an
    /// extension's relaunch replaces.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub relaunch: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One instance's run in a slot: from its launch to when it was first seen not running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ran {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

impl WorkloadRecord {
    /// A new slot record: no run recorded yet.
    pub fn new(
        request_id: RequestId,
        reservation_id: impl Into<String>,
        slot: u32,
        resource_id: impl Into<String>,
        state: impl Into<String>,
        now: DateTime<Utc>,
    ) -> WorkloadRecord {
        WorkloadRecord {
            request_id,
            reservation_id: reservation_id.into(),
            slot,
            generation: 0,
            resource_id: resource_id.into(),
            state: state.into(),
            updated_at: now,
            started_at: None,
            ended_at: None,
            ran: Vec::new(),
            relaunch: 0,
        }
    }

    /// The slot's current instance seen not running at `at` (its first sight is kept; never
    /// before its launch). `None` when that changes nothing.
    pub fn seen_ended(&self, at: DateTime<Utc>) -> Option<WorkloadRecord> {
        let started = self.started_at?;
        if self.ended_at.is_some() {
            return None;
        }
        Some(WorkloadRecord {
            ended_at: Some(at.max(started)),
            ..self.clone()
        })
    }

    /// The slot with its current instance's run closed into `ran` (at its seen end, else
    /// `now`): it is replaced or taken back, and its next instance starts a run of its own.
    /// `fallback`: when a slot recorded before runs were started (its run's start).
    pub fn closed(&self, fallback: Option<DateTime<Utc>>, now: DateTime<Utc>) -> WorkloadRecord {
        WorkloadRecord {
            started_at: None,
            ended_at: None,
            ran: self.runs(fallback, now),
            ..self.clone()
        }
    }

    /// Every run of the slot, its current instance's counted to `now` unless its end was
    /// seen. A slot recorded before runs were (no `started_at`) ran from `fallback` (its
    /// run's start), as runs were settled before.
    pub fn runs(&self, fallback: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Vec<Ran> {
        let mut out = self.ran.clone();
        out.extend(self.current(fallback, now));
        out
    }

    /// The current instance's run: from its launch (or, on a slot recorded before launches
    /// were, `fallback`) to its seen end or `now`.
    fn current(&self, fallback: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<Ran> {
        let legacy = self.ran.is_empty() && self.resource_id.starts_with("i-");
        let from = self.started_at.or(fallback.filter(|_| legacy))?;
        Some(Ran {
            from,
            to: self.ended_at.unwrap_or(now).max(from),
        })
    }
}

/// The pace of the searches AWS limits per account and region (ARCHITECTURE §8.8): every
/// invocation of every function draws on one allowance per region, kept where they all see
/// it (the table, in production).
pub trait Pacing: Send + Sync {
    /// Takes up to `wanted` Capacity Block searches of `region`'s allowance at `now`; how
    /// many may be made (none while the region backs off).
    fn take_searches(
        &self,
        region: &str,
        wanted: u32,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u32, PortError>> + Send;

    /// `region` answered a search with its rate limit: none until `until`.
    fn back_off(
        &self,
        region: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<(), PortError>> + Send;
}

pub trait Store: Send + Sync {
    /// Records a new request (status `Accepted`, or `Cancelled` with `cancelled`) with its
    /// outbox, once per request id; refused as `Tombstoned` when a tombstone from its source
    /// is honoured.
    fn create_request(
        &self,
        new: NewRequest,
    ) -> impl Future<Output = Result<CreateOutcome, PortError>> + Send;

    /// Who claims a workload name ([`ClaimKey`]), by a fresh read.
    fn claim(
        &self,
        key: &ClaimKey,
    ) -> impl Future<Output = Result<Option<Claim>, PortError>> + Send;

    /// Writes a claim's next contents if it is still at the version read; false when not.
    fn write_claim(&self, w: ClaimWrite) -> impl Future<Output = Result<bool, PortError>> + Send;

    /// The spelling of the request (not past its TTL) that holds `request_id` ignoring case,
    /// when it is another than `request_id`'s (review N15): what an event naming the id in
    /// another case is about.
    fn spelled(
        &self,
        request_id: &RequestId,
    ) -> impl Future<Output = Result<Option<RequestId>, PortError>> + Send;

    /// A request, or `None` (also when archived and past its TTL).
    fn get_request(
        &self,
        request_id: &RequestId,
    ) -> impl Future<Output = Result<Option<RequestRecord>, PortError>> + Send;

    /// A conditional status change. Transitions into terminal states set the archival TTL.
    /// A transition from or to `Purchasing` is refused: use the lease operations. A debit
    /// (on-demand spend) is kept at once: it adds to the ledger and to `spent`, never opens.
    fn transition(
        &self,
        t: Transition,
    ) -> impl Future<Output = Result<WriteOutcome, PortError>> + Send;

    /// Changes the request's windows (and, for `Reserved`/`Active`/`Draining`, the status they
    /// imply), conditional on the version and status. See [`WindowUpdate`].
    fn update_windows(
        &self,
        u: WindowUpdate,
    ) -> impl Future<Output = Result<WriteOutcome, PortError>> + Send;

    /// Takes the lease and applies the debit, which stays open on the request. Sets
    /// `next_action_at` to the lease expiry, so `due` finds a purchase whose worker died.
    /// A takeover (`from == Purchasing`) needs an expired lease and no new debit.
    fn begin_purchase(
        &self,
        b: BeginPurchase,
    ) -> impl Future<Output = Result<BeginPurchaseOutcome, PortError>> + Send;

    /// Adds the reservation's windows (pending, numbered after the request's others).
    /// To `Reserved`: the open debit is kept (closed) and the lease released. To `Purchasing`
    /// (a split plan's first segment): the open debit shrinks by the reservation's fee, so
    /// a later `release_unbought` releases only what was not bought.
    fn record_reservation(
        &self,
        r: RecordReservation,
    ) -> impl Future<Output = Result<LeaseWriteOutcome, PortError>> + Send;

    /// Places a tombstone, unless a request of its id is recorded ([`Tombstone`]).
    fn put_tombstone(
        &self,
        t: Tombstone,
        outbox: Vec<OutboundEvent>,
    ) -> impl Future<Output = Result<TombstoneOutcome, PortError>> + Send;

    /// Keeps why a submission was rejected ([`RejectedSubmission`]), once per event.
    fn record_rejection(
        &self,
        r: RejectedSubmission,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// The rejected submissions of `request_id` (any spelling) kept, oldest first.
    fn rejections(
        &self,
        request_id: &RequestId,
    ) -> impl Future<Output = Result<Vec<RejectedSubmission>, PortError>> + Send;

    /// Keeps or clears a cancellation note ([`KeepCancellation`]).
    fn keep_cancellation(
        &self,
        k: KeepCancellation,
    ) -> impl Future<Output = Result<WriteOutcome, PortError>> + Send;

    /// Decrements the ledger and `spent` by the open debit stored on the request (never an
    /// amount from the caller), clears it and releases the lease.
    fn release_unbought(
        &self,
        r: ReleaseUnbought,
    ) -> impl Future<Output = Result<LeaseWriteOutcome, PortError>> + Send;

    /// Claims the run of `region`'s detector of unrecorded reservations (ARCHITECTURE §9.1)
    /// and sets its next at `next`: from `seen`, the due time the tick read, or, with `None`,
    /// when it has never run. False when another invocation claimed it first (or, with
    /// `None`, it exists already).
    fn claim_detector(
        &self,
        region: &str,
        seen: Option<DateTime<Utc>>,
        next: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;

    /// Records that the purchase under the lease is about to call AWS ([`MarkPurchaseCall`]).
    fn mark_purchase_call(
        &self,
        m: MarkPurchaseCall,
    ) -> impl Future<Output = Result<LeaseWriteOutcome, PortError>> + Send;

    /// Ends a purchase in doubt, keeping its debit ([`FailInDoubt`]).
    fn fail_in_doubt(
        &self,
        f: FailInDoubt,
    ) -> impl Future<Output = Result<LeaseWriteOutcome, PortError>> + Send;

    fn reservations(
        &self,
        request_id: &RequestId,
    ) -> impl Future<Output = Result<Vec<Reservation>, PortError>> + Send;

    /// What a team has spent in a month, in the ledger's exact unit.
    fn budget_spent(
        &self,
        team: &Team,
        month: &BudgetMonth,
    ) -> impl Future<Output = Result<MicroUsd, PortError>> + Send;

    fn put_workload(&self, w: WorkloadRecord)
    -> impl Future<Output = Result<(), PortError>> + Send;

    fn workloads(
        &self,
        request_id: &RequestId,
    ) -> impl Future<Output = Result<Vec<WorkloadRecord>, PortError>> + Send;

    /// Outbox items not yet marked sent, oldest first, at most `limit`.
    fn unsent_outbox(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxItem>, PortError>> + Send;

    fn mark_sent(
        &self,
        request_id: &str,
        event_key: &str,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// Claims an unsent outbox item for publishing until `until`, so that runs flushing at
    /// the same moment do not both publish it. False when it is sent, gone, or claimed by
    /// another run whose claim has not passed `now`.
    fn claim_outbox(
        &self,
        request_id: &str,
        event_key: &str,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;

    /// Gives a claim back (the publish failed): the next run publishes the item.
    fn release_outbox_claim(
        &self,
        request_id: &str,
        event_key: &str,
    ) -> impl Future<Output = Result<(), PortError>> + Send;

    /// ARCHITECTURE §9.1's upgrade of a request written before the rule: a terminal request
    /// holding a window not ended, which a terminal write then stamped with the archival TTL
    /// whatever its windows, loses that TTL (META and its children) and takes its place in
    /// the `work` index by today's rule (every tick's read, while a window of it may run).
    /// Whether it changed anything (false for any other request).
    fn unarchive(
        &self,
        request_id: &RequestId,
        at: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool, PortError>> + Send;

    /// The PAUSE item (ARCHITECTURE §9.7), by a fresh read: what a refused lease or hold
    /// reports, and what `capacity-pilot status` shows. A tick has it from its agenda.
    fn read_pause(&self) -> impl Future<Output = Result<Option<Pause>, PortError>> + Send;

    /// Pauses purchases, unless they are paused already: `Err` with the pause that stands.
    fn put_pause(
        &self,
        pause: Pause,
    ) -> impl Future<Output = Result<Result<(), Pause>, PortError>> + Send;

    /// Resumes purchases: the pause deleted, or `None` when there was none.
    fn delete_pause(&self) -> impl Future<Output = Result<Option<Pause>, PortError>> + Send;

    /// A tick's whole read, in one call while it fits a page ([`Agenda`]).
    fn agenda(&self, now: DateTime<Utc>) -> impl Future<Output = Result<Agenda, PortError>> + Send;

    /// Every request in one of `statuses` whose `next_action_at <= now` (the agenda's).
    fn due(
        &self,
        statuses: &[RequestStatus],
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Vec<DueItem>, PortError>> + Send {
        async move { Ok(self.agenda(now).await?.due_in(statuses)) }
    }

    /// How many writes that may have added outbox items this store (and its clones) has
    /// committed: a run whose count did not move has nothing of its own to publish.
    fn outbox_writes(&self) -> u64;

    /// A run (one invocation) starts at the handler's `now`: from then until the next run,
    /// the store takes the time from it (TTL filters, outbox claims, archival), and reads no
    /// item twice without writing it in between (the README's read rule). Nothing is kept
    /// from one run to the next.
    fn begin_run(&self, now: DateTime<Utc>) {
        let _ = now;
    }

    /// The request's state changes, oldest first (also once it is archived, until its TTL).
    fn history(
        &self,
        request_id: &RequestId,
    ) -> impl Future<Output = Result<Vec<HistoryEntry>, PortError>> + Send;
}

/// Money helper for callers building debits.
pub fn debit_amount(fee: Usd) -> MicroUsd {
    fee.to_micros_ceil()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(h: i64, m: i64) -> DateTime<Utc> {
        "2026-12-01T10:00:00Z".parse::<DateTime<Utc>>().unwrap()
            + chrono::Duration::hours(h)
            + chrono::Duration::minutes(m)
    }

    fn due(id: &str, status: RequestStatus, next: DateTime<Utc>) -> DueItem {
        DueItem {
            request_id: crate::fakes::fixtures::request_id(id),
            status,
            next_action_at: next,
            own_action_at: Some(next),
            window_action_at: None,
            notice_at: None,
        }
    }

    /// The operations kit's stuck requests: past their next action by more than the bound,
    /// most overdue first; under a pause, a plan or an on-demand run waiting to be bought or
    /// held is not stuck but paused.
    #[test]
    fn a_request_is_overdue_past_the_bound_unless_the_pause_holds_it_back() {
        let now = at(2, 0);
        let mut a = Agenda {
            due: vec![
                due("on-time", RequestStatus::Searching, at(1, 35)),
                due("late", RequestStatus::Active, at(1, 29)),
                due("later", RequestStatus::Reserved, at(0, 0)),
                due("buying", RequestStatus::OfferingsFound, at(1, 0)),
                due("holding", RequestStatus::TryingOnDemand, at(1, 0)),
            ],
            ..Agenda::default()
        };
        let ids = |a: &Agenda| -> Vec<String> {
            a.overdue(now, crate::domain::time_rules::OVERDUE_AFTER)
                .iter()
                .map(|(d, _)| d.request_id.to_string())
                .collect()
        };
        assert_eq!(ids(&a), ["later", "buying", "holding", "late"]);
        assert_eq!(
            a.overdue(now, crate::domain::time_rules::OVERDUE_AFTER)[0].1,
            chrono::Duration::hours(2)
        );
        a.pause = Some(Pause {
            by: "arn:aws:iam::123456789012:role/ops".into(),
            reason: "r".into(),
            since: at(0, 0),
        });
        assert_eq!(ids(&a), ["later", "late"]);
    }

    /// A request read for a window (issue 51: `RequestRecord::window_due` -> `true` had launch
    /// and cleanup go on with a request due only for its search).
    #[test]
    fn a_record_is_window_due_only_once_one_of_its_windows_action_time_has_come() {
        let request = crate::fakes::fixtures::request("r1", "team-a", "5000");
        let window = |next: Option<DateTime<Utc>>| crate::domain::window::WindowRecord {
            key: crate::domain::window::window_key("cr-1", 0),
            number: 0,
            state: crate::domain::window::WindowState::Pending,
            next_action_at: next,
            updated_at: at(0, 0),
            notices: None,
            relaunch: None,
        };
        let rec = |windows| RequestRecord {
            next_action_at: Some(at(0, 0)),
            windows,
            ..crate::fakes::fixtures::record(request.clone(), RequestStatus::Searching)
        };
        assert!(!rec(vec![]).window_due(at(0, 0)), "due for its search only");
        assert!(!rec(vec![window(None)]).window_due(at(0, 0)));
        let opens = rec(vec![window(Some(at(2, 0)))]);
        assert!(!opens.window_due(at(1, 59)));
        assert!(opens.window_due(at(2, 0)));
    }

    /// What a tick hands launch and cleanup (issue 51: `window_due` -> `true` had them read
    /// every request due for its search): a window's action, not the request's own.
    #[test]
    fn a_due_item_is_window_due_only_once_a_windows_action_time_has_come() {
        let item = |own: Option<DateTime<Utc>>, window: Option<DateTime<Utc>>| DueItem {
            request_id: RequestId::parse("r1").unwrap(),
            status: RequestStatus::Searching,
            next_action_at: at(0, 0),
            own_action_at: own,
            window_action_at: window,
            notice_at: None,
        };
        let searching = item(Some(at(0, 0)), None);
        assert!(searching.own_action_due(at(0, 0)));
        assert!(!searching.window_due(at(0, 0)), "due for its search only");
        let later = item(Some(at(0, 0)), Some(at(2, 0)));
        assert!(!later.window_due(at(1, 59)));
        assert!(later.window_due(at(2, 0)));
        let window_only = item(None, Some(at(0, 0)));
        assert!(window_only.window_due(at(0, 0)));
        assert!(!window_only.own_action_due(at(0, 0)));
    }

    #[test]
    fn a_run_keeps_the_hours_begun_at_least_one_at_most_the_estimate() {
        let run = OnDemandRun {
            attempt: "on-demand".into(),
            held_at: at(-1, 0),
            started_at: Some(at(0, 0)),
            launch_generations: 0,
            claim: None,
            fall_back: None,
            approval: None,
        };
        let estimate = MicroUsd(48_000_001);
        // 2 h 30 min: 3 of 48 hours, rounded up to the micro-dollar.
        assert_eq!(run.spent(estimate, 48, at(2, 30)), MicroUsd(3_000_001));
        assert_eq!(run.spent(estimate, 48, at(0, 0)), MicroUsd(1_000_001));
        assert_eq!(run.spent(estimate, 48, at(-2, 0)), MicroUsd(1_000_001));
        assert_eq!(run.spent(estimate, 48, at(47, 1)), estimate);
        assert_eq!(run.spent(estimate, 48, at(90, 0)), estimate);
        // Never started: counted from the hold.
        let placing = OnDemandRun {
            started_at: None,
            ..run
        };
        assert_eq!(placing.spent(estimate, 48, at(0, 30)), MicroUsd(2_000_001));
    }

    fn slot(n: u32, from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> WorkloadRecord {
        WorkloadRecord {
            started_at: from,
            ended_at: to,
            ..WorkloadRecord::new(
                RequestId::parse("r-1").unwrap(),
                "spot",
                n,
                format!("i-{n}"),
                "running",
                at(0, 0),
            )
        }
    }

    #[test]
    fn a_run_is_settled_by_what_each_instance_ran_until_seen_not_running() {
        let run = OnDemandRun {
            attempt: "spot".into(),
            held_at: at(-1, 0),
            started_at: Some(at(0, 5)),
            launch_generations: 0,
            claim: None,
            fall_back: None,
            approval: None,
        };
        // Two instances for 24 h: 48 instance-hours, a micro-dollar over $48.
        let estimate = MicroUsd(48_000_001);
        let now = at(20, 0);
        // One reclaimed at 2 h 10 min (3 hours begun), one still running at 20 h.
        let slots = [
            slot(0, Some(at(0, 0)), Some(at(2, 10))),
            slot(1, Some(at(0, 0)), None),
        ];
        assert_eq!(
            run.spent_by_slots(estimate, 2, 24, &slots, now),
            MicroUsd(23_000_001)
        );
        // Its end seen again, later, changes nothing; one seen before its launch ends there.
        assert_eq!(slots[0].seen_ended(at(3, 0)), None);
        assert_eq!(
            slot(1, Some(at(0, 0)), None)
                .seen_ended(at(-1, 0))
                .unwrap()
                .ended_at,
            Some(at(0, 0))
        );
        // Closed at 2 h 15 min and never relaunched (the replacement still waits for
        // capacity): its old run only, 3 + 20 hours, not counted again to now.
        let waiting = slots[0].closed(None, at(2, 15));
        assert_eq!((waiting.started_at, waiting.ended_at), (None, None));
        assert_eq!(
            run.spent_by_slots(estimate, 2, 24, &[waiting, slots[1].clone()], now),
            MicroUsd(23_000_001)
        );
        // Replaced at 2 h 10 min, its replacement launched at 2 h 20 min: 3 + 18 hours.
        let mut replaced = slots[0].closed(None, at(2, 15));
        replaced.started_at = Some(at(2, 20));
        assert_eq!(
            replaced.ran,
            vec![Ran {
                from: at(0, 0),
                to: at(2, 10)
            }]
        );
        assert_eq!(
            run.spent_by_slots(estimate, 2, 24, &[replaced, slots[1].clone()], now),
            MicroUsd(41_000_001)
        );
        // Another attempt's slots, and runs that ended before this hold, are not this run's.
        let mut before = slot(1, Some(at(-5, 0)), Some(at(-4, 0)));
        before.reservation_id = "spot".into();
        let mut other = slot(1, Some(at(0, 0)), None);
        other.reservation_id = "on-demand".into();
        assert_eq!(
            run.spent_by_slots(estimate, 2, 24, &[slots[0].clone(), before, other], now),
            MicroUsd(3_000_001)
        );
        // Never more than the estimate, however long it ran.
        assert_eq!(
            run.spent_by_slots(estimate, 2, 24, &slots, at(90, 0)),
            estimate
        );
        // A slot recorded before launches were counts from the run's start, as before; with
        // no slot at all the run is settled by its length.
        let legacy = slot(0, None, None);
        assert_eq!(
            run.spent_by_slots(estimate, 1, 48, std::slice::from_ref(&legacy), at(2, 30)),
            run.spent(estimate, 48, at(2, 30))
        );
        assert_eq!(
            run.spent_by_slots(estimate, 2, 24, &[], at(2, 30)),
            run.spent(estimate, 24, at(2, 30))
        );
    }

    #[test]
    fn a_settlement_releases_what_it_does_not_keep() {
        let open = MicroUsd(100);
        assert_eq!(Settle::Release.released(open), open);
        assert_eq!(Settle::Spend(MicroUsd(30)).released(open), MicroUsd(70));
        assert_eq!(Settle::Spend(MicroUsd(300)).released(open), MicroUsd(0));
        assert_eq!(Settle::Spend(MicroUsd(-5)).released(open), open);
    }
}
