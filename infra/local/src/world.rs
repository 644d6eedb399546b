//! The emulator's whole state behind one lock: the simulated clock, the market, every resource,
//! the agenda of timed transitions, the recorded events and the injected faults. The clock moves
//! only through [`World::advance_to`], which replays due transitions in time order so that every
//! lifecycle change and event carries the simulated time at which AWS would have made it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::ec2::Ec2State;
use crate::error::ApiError;
use crate::market::Market;
use crate::sagemaker::SageMakerState;
use crate::util::{event_time, hex_id};

/// Behaviour switches and timings. All AWS facts marked UNVERIFIED are here, not hard-coded.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// The account id in ARNs and event envelopes.
    pub account_id: String,
    /// The region whose buses [`crate::LocalCloud::events`], [`World::home_events`] and
    /// `GET /_local/events/{bus}` read (where the product runs). Every region has its own
    /// buses (aws-reference §11.4); this only names the one read without a region.
    pub home_region: String,
    /// Offerings can be bought once only (default: purchasable while capacity lasts).
    pub single_use_offerings: bool,
    /// Emit `Capacity Block Reservation Delivered` / `... Reservation Expiration Warning`.
    pub reservation_event_names: bool,
    /// Minutes before a block's end that the expiration warning is sent.
    pub block_warning_lead_minutes: i64,
    /// The same for UltraServer blocks.
    pub ultraserver_warning_lead_minutes: i64,
    /// Whether a block's `Capacity Block Expiration Warning` follows its end when an extension
    /// moves it: true, only the new end warns. The sources are silent (no evidence either way,
    /// design review peers-3 §8), so the default is the harsher false: the warning due for the
    /// old end is still sent at old end − lead, with the old `end-date`, while the block is
    /// `scheduled` or `active` (its instances get no interruption warning and are not
    /// terminated then); the new end warns too, at its time.
    pub warning_follows_extension: bool,
    /// Minutes before a block's end that its instances are terminated.
    pub block_termination_lead_minutes: i64,
    /// The same for UltraServer blocks.
    pub ultraserver_termination_lead_minutes: i64,
    /// Minutes after purchase that a block's, plan's or extension's payment clears (or, when
    /// forced, fails). Bounded by [`PAYMENT_MAX_HOURS`] after the purchase and by
    /// [`PAYMENT_LEAD_MINUTES`] before a block's or plan's start (an extension: 35 minutes before
    /// the block's end), never before the purchase (ARCHITECTURE §8.10).
    pub payment_minutes: i64,
    /// The state a new Capacity Block's reservation is in until its payment clears
    /// (`scheduled`) or fails (`payment-failed`): `pending`, as a fresh block has been seen
    /// (aws-reference §11.1 States), or the documented `payment-pending` (§2.1).
    pub block_initial_state: BlockInitialState,
    /// Seconds after its creation (simulated time) that a new Capacity Reservation is missing
    /// from DescribeCapacityReservations (an id asked for answers `…NotFound`) and
    /// DescribeCapacityBlocks, and a new training plan from ListTrainingPlans and
    /// DescribeTrainingPlan (`ResourceNotFound`). Everything else sees it at once. 0: no lag.
    /// ARCHITECTURE §8.10: default 2 min, bound 10 min (aws-reference §11.3).
    pub listing_lag_seconds: i64,
    /// Seconds after a Capacity Block's start that it becomes `active` (and its Delivered
    /// event is sent); until then it stays `scheduled` and RunInstances into it answers
    /// `InvalidCapacityReservationState.PendingActivation`. ARCHITECTURE §8.10: default 5 min,
    /// bound 15 min (aws-reference §11.1 "Activation can lag the start"). 0: at the start.
    pub block_activation_seconds: i64,
    /// Seconds an instance stays `pending`.
    pub instance_launch_seconds: i64,
    /// Seconds an instance stays `shutting-down`.
    pub instance_shutdown_seconds: i64,
    /// Minutes after termination before an instance's slot in a block is free again.
    pub slot_return_minutes: i64,
    /// PutEvents entry size limit in bytes.
    pub event_max_bytes: usize,
    /// Seconds a training job spends `Starting` before it trains (or fails for capacity).
    pub training_job_start_seconds: i64,
    /// Seconds from StopTrainingJob to `Stopped`.
    pub training_job_stop_seconds: i64,
    /// How long a plan-backed job waits for capacity on an Active plan before it fails.
    pub training_job_max_wait_hours: i64,
    /// Minutes before a reserved capacity's end that training jobs are terminated.
    pub training_job_termination_lead_minutes: i64,
    /// Minutes before a reserved capacity's end that HyperPod nodes are terminated.
    pub hyperpod_termination_lead_minutes: i64,
    /// Minutes a cluster spends `Creating`.
    pub cluster_transition_minutes: i64,
    /// Minutes a cluster spends `Updating` after UpdateCluster (ARCHITECTURE §8.10: 5 min).
    pub cluster_update_minutes: i64,
    /// UpdateCluster must list every instance group of the cluster and may change only one
    /// existing group (a group omitting a field it had changes it); else `ValidationException`.
    /// Whether AWS keeps omitted groups or fields is UNVERIFIED (aws-reference §11.2): the
    /// harsher reading. false: omitted groups are kept and a named group is replaced whole.
    pub refuse_partial_cluster_updates: bool,
    /// UpdateCluster refuses (`ValidationException`) an update whose `InstanceGroups` carry,
    /// for any group (changed or sent back as it is), a `TrainingPlanArn` whose plan is not
    /// `Scheduled` or `Active` (`Expired`, `Failed`, `Pending`). A plan used by HyperPod must
    /// be `Scheduled` or `Active` (aws-reference §3.1); whether AWS checks a group sent back
    /// unchanged is not published: the harsher reading. false: only a group whose plan
    /// changes in the update (a new group, or a new plan) is checked. Groups in
    /// `InstanceGroupsToDelete` are never checked.
    pub refuse_expired_plan_groups: bool,
    /// Minutes an endpoint spends `Creating`.
    pub endpoint_create_minutes: i64,
    /// Seconds after CreateEndpointConfig (simulated time) that the config is not visible:
    /// DescribeEndpointConfig answers `ValidationException` "Could not find endpoint
    /// configuration …" and CreateEndpoint on it answers the same. AWS documents the lag
    /// without a figure (botocore `sagemaker` model, CreateEndpoint: "If the dependent
    /// entities are not yet in DynamoDB, this causes a validation error"): the harsher
    /// reading, 60 s. 0: visible at once.
    pub endpoint_config_visibility_seconds: i64,
    /// Minutes an endpoint spends `Deleting` after DeleteEndpoint before it is gone
    /// (ARCHITECTURE §8.10: 2 min). 0: gone at once.
    pub endpoint_delete_minutes: i64,
    /// What CreateEndpoint does with a config whose training plan is not `Active`: accept and
    /// fail the endpoint when it would be ready (the default), or refuse at once. Whether
    /// AWS's refusal is synchronous is not published (aws-reference §11.2).
    pub endpoint_inactive_plan: InactivePlan,
    /// The next this many endpoints that would reach `InService` end `Failed` (insufficient
    /// capacity) after `endpoint_create_minutes` instead; counts down as they fail. For
    /// scenarios that test a product's retry. Default 0.
    pub endpoint_failures: u32,
    /// A `Pending` plan shows no `ReservedCapacitySummaries` and a `TotalInstanceCount` of 0
    /// in DescribeTrainingPlan and ListTrainingPlans until its payment clears. The model
    /// allows both (min 0) and what a `Pending` plan returns is unpublished: the harsher
    /// reading (default). false: its summaries and full count from the start.
    pub pending_plan_without_capacities: bool,
    /// How many training plans an account may hold (`ResourceLimitExceeded` beyond).
    pub max_training_plans: usize,
    /// What `SearchTrainingPlanOfferings` answers for a type the region does not sell
    /// ([`crate::market::Market::unsupported`]): no source says, so both readings exist and
    /// the harsher, an error, is the default (ARCHITECTURE §8.10).
    pub plan_unsupported: PlanUnsupported,
    /// `DescribeCapacityBlockOfferings` calls per account and region: a bucket of this many,
    /// refilling one every `describe_limit_refill_seconds` (ARCHITECTURE §8.10: 5, 1 a
    /// minute). 0: no limit.
    pub describe_limit_burst: u32,
    pub describe_limit_refill_seconds: i64,
    /// (instance family, region) pairs for which the account has no Capacity Block quota:
    /// their searches answer the describe limit with its account-limit message.
    pub no_block_quota: Vec<(String, String)>,
    /// Seconds after RunInstances (simulated time) that a new instance is missing from
    /// DescribeInstances and DescribeInstanceStatus (an id asked for answers
    /// `InvalidInstanceID.NotFound`). RunInstances' answer, client-token replays,
    /// TerminateInstances, CreateTags and the emulator's own bookkeeping see it at once.
    /// 0: no lag. ARCHITECTURE §8.10: default 2 min, bound 10 min (aws-reference §11.3).
    pub instance_listing_lag_seconds: i64,
    /// Subnets the seeded VPC has in each zone of a region. The first is the zone's default
    /// subnet (`defaultForAz`; "You can have only one default subnet per Availability Zone",
    /// EC2 API CreateDefaultSubnet) and keeps its id; the others are ordinary subnets. Default 1.
    pub subnets_per_zone: usize,
    /// Seeded subnets of another size than the default VPC's /20 (EC2 API CreateDefaultSubnet:
    /// "a default subnet with a size /20 IPv4 CIDR block"): a scenario makes a subnet small,
    /// so that launches run out of its free private addresses
    /// (`InsufficientFreeAddressesInSubnet`). The first entry that matches a subnet wins.
    pub subnet_sizes: Vec<SubnetSize>,
    /// RunInstances with `NetworkInterface.N` overrides that drop an interface of the launch
    /// template (a (NetworkCardIndex, DeviceIndex) pair missing, or its `InterfaceType`
    /// changed) answers `InvalidParameterCombination`. AWS launches with fewer interfaces;
    /// the harsher reading refuses (false: launch with the override's list as AWS does).
    pub refuse_dropped_interfaces: bool,
    /// DescribeCapacityReservations with a `tag:<key>` filter answers `InvalidParameterValue`
    /// "The filter 'tag:<key>' is invalid". Tag filters are not in the documented filter list
    /// (aws-reference §11.1) though widely used: the harsher reading refuses them (default
    /// false: they work, as they do today).
    pub refuse_tag_filters: bool,
    /// Launches refused with an account or zone limit (`VcpuLimitExceeded`, …) before any
    /// capacity check. Capacity Block launches are never refused this way. Default: none.
    pub refusals: Vec<Refusal>,
    /// Real (wall-clock) milliseconds every RunInstances answer waits, without holding the
    /// world: other calls proceed meanwhile. ARCHITECTURE §8.10: 50 ms. 0: at once.
    pub run_instances_latency_ms: u64,
    /// DescribeCluster omits `CurrentCount` from every instance group ("`CurrentCount` is
    /// optional", aws-reference §11.2): the harsher reading, so nodes must be counted with
    /// ListClusterNodes. false: sent.
    pub cluster_omit_current_count: bool,
    /// The most instances the account may hold across Capacity Blocks over any block's window:
    /// "Each Capacity Block can have up to 64 instances, and you can have up to 256 instances
    /// across Capacity Blocks" (botocore `ec2` model, `DescribeCapacityBlockOfferingsRequest.
    /// InstanceCount`; DOC capacity-blocks-purchase). PurchaseCapacityBlock is refused with
    /// `block_limit_code` when the instances of the account's live blocks (`pending`,
    /// `payment-pending`, `scheduled`, `active`) whose window overlaps the offering's, in every
    /// region (the sources do not say per region: the harsher, account-wide reading), plus the
    /// offering's count would exceed it. Default 256.
    pub max_block_instances: i64,
    /// The error code of that refusal. AWS does not publish it: this is a guess, configurable
    /// so that the product is tested with other codes too; the product must read the message,
    /// which names the limit, not rely on the code. Default `CapacityBlockLimitExceeded`.
    pub block_limit_code: String,
    /// Every extension's payment (a Capacity Block's or a training plan's, bought through the
    /// API or by hand) fails at its payment time: the block's extension `payment-failed`, the
    /// plan's `PaymentStatus` `Failed`, the end kept and the capacity returned. For one
    /// reservation's next extension only, `POST /_local/extension-payment-fails`. Default false.
    pub extension_payment_fails: bool,
}

/// One entry of [`Settings::subnet_sizes`]: the seeded subnets of `region` (in `zone`, and the
/// zone's `index`-th subnet (0 the default one), when set) have an IPv4 CIDR of
/// `/prefix_length` (16-28, as a VPC subnet may: 11 usable addresses at /28).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubnetSize {
    pub region: String,
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub index: Option<usize>,
    pub prefix_length: u8,
}

/// One entry of [`Settings::refusals`]: launches of `market` in `region` (and `zone`,
/// `instance_type` when set) answer `code` with AWS's message for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    pub code: RefusalCode,
    pub region: String,
    /// The EC2 zone (`us-east-1a`); a SageMaker launch has no zone, so a refusal with one
    /// never matches it.
    #[serde(default)]
    pub zone: Option<String>,
    /// The type as the launch names it (`p5.48xlarge`, `ml.p5.48xlarge`).
    #[serde(default)]
    pub instance_type: Option<String>,
    pub market: RefusalMarket,
}

/// The error codes a [`Refusal`] answers (aws-reference §11.2, §11.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefusalCode {
    /// EC2, account and region: the vCPU quota of the type's bucket is 0.
    VcpuLimitExceeded,
    /// EC2, account and region: the instance quota of the type is 0.
    InstanceLimitExceeded,
    /// EC2, per zone: the type is not offered in the zone.
    Unsupported,
    /// EC2 spot, account and region.
    MaxSpotInstanceCountExceeded,
    /// SageMaker, account and region: the training job quota of the type is 0.
    ResourceLimitExceeded,
}

/// Which launches a [`Refusal`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RefusalMarket {
    /// EC2 RunInstances without `InstanceMarketOptions`.
    OnDemand,
    /// EC2 RunInstances with `MarketType` `spot`.
    Spot,
    /// SageMaker CreateTrainingJob without a training plan.
    SagemakerTraining,
}

/// [`Settings::endpoint_inactive_plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InactivePlan {
    /// Accepted; the endpoint is `Failed` when it would be ready (asynchronous, harsher).
    FailLater,
    /// CreateEndpoint answers `ValidationException`.
    Refuse,
}

/// [`Settings::plan_unsupported`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlanUnsupported {
    /// `ValidationException` naming the type and region.
    Error,
    /// An empty list of offerings.
    Empty,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            account_id: "123456789012".to_string(),
            home_region: "us-east-1".to_string(),
            single_use_offerings: false,
            reservation_event_names: false,
            block_warning_lead_minutes: 40,
            ultraserver_warning_lead_minutes: 70,
            warning_follows_extension: false,
            block_termination_lead_minutes: 30,
            ultraserver_termination_lead_minutes: 60,
            payment_minutes: 5,
            block_initial_state: BlockInitialState::Pending,
            listing_lag_seconds: 120,
            block_activation_seconds: 300,
            instance_launch_seconds: 30,
            instance_shutdown_seconds: 60,
            slot_return_minutes: 10,
            event_max_bytes: 256 * 1024,
            training_job_start_seconds: 120,
            training_job_stop_seconds: 60,
            training_job_max_wait_hours: 48,
            training_job_termination_lead_minutes: 30,
            hyperpod_termination_lead_minutes: 60,
            cluster_transition_minutes: 3,
            cluster_update_minutes: 5,
            refuse_partial_cluster_updates: true,
            refuse_expired_plan_groups: true,
            endpoint_create_minutes: 5,
            endpoint_config_visibility_seconds: 60,
            endpoint_delete_minutes: 2,
            endpoint_inactive_plan: InactivePlan::FailLater,
            endpoint_failures: 0,
            pending_plan_without_capacities: true,
            max_training_plans: 50,
            plan_unsupported: PlanUnsupported::Error,
            describe_limit_burst: 5,
            describe_limit_refill_seconds: 60,
            no_block_quota: Vec::new(),
            instance_listing_lag_seconds: 120,
            subnets_per_zone: 1,
            subnet_sizes: Vec::new(),
            refuse_dropped_interfaces: true,
            refuse_tag_filters: false,
            refusals: Vec::new(),
            run_instances_latency_ms: 50,
            cluster_omit_current_count: true,
            max_block_instances: 256,
            block_limit_code: "CapacityBlockLimitExceeded".to_string(),
            extension_payment_fails: false,
        }
    }
}

/// The latest a payment clears after the purchase (ARCHITECTURE §8.10 bound).
pub const PAYMENT_MAX_HOURS: i64 = 6;
/// The latest a block's or plan's payment clears before its start (ARCHITECTURE §8.10 bound).
pub const PAYMENT_LEAD_MINUTES: i64 = 10;
/// The latest an extension's payment clears before the block's end (aws-reference §11.1
/// Extensions: "no later than 35 minutes before the end").
pub const EXTENSION_PAYMENT_LEAD_MINUTES: i64 = 35;
/// The documented bound on an extension's payment after its purchase (aws-reference §11.1
/// Extensions: "within 12 hours"); the model clears within [`PAYMENT_MAX_HOURS`], inside it.
pub const EXTENSION_PAYMENT_MAX_HOURS: i64 = 12;
/// The request tag a forced payment failure is keyed by (`POST /_local/payment-failures`).
pub const REQUEST_TAG: &str = "capacity-pilot:request-id";

/// The first state of a Capacity Block's reservation ([`Settings::block_initial_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockInitialState {
    Pending,
    PaymentPending,
}

impl BlockInitialState {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockInitialState::Pending => "pending",
            BlockInitialState::PaymentPending => "payment-pending",
        }
    }
}

/// A timed transition on the agenda.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    BlockPayment(String),
    BlockActivate(String),
    BlockWarn {
        cr: String,
        end: DateTime<Utc>,
    },
    BlockTerminate {
        cr: String,
        end: DateTime<Utc>,
    },
    BlockExpire {
        cr: String,
        end: DateTime<Utc>,
    },
    ExtensionPayment {
        cr: String,
        extension: String,
    },
    InstanceRunning(String),
    InstanceTerminated(String),
    SlotReturn(String),
    /// A spot instance's two-minute warning has run out.
    SpotReclaim(String),
    /// A scheduled retirement's start: the instance is retired (event: its scheduled event).
    InstanceRetire {
        id: String,
        event: String,
    },
    /// Re-evaluate every SageMaker resource (plans, jobs, clusters, endpoints).
    SageMakerSync,
}

/// What kind of fault to inject.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// `RequestLimitExceeded` (EC2) / `ThrottlingException` (JSON).
    Throttle,
    /// HTTP 500 `InternalError` / `InternalFailure`, nothing performed.
    InternalError,
    /// Delay the response by this many (real) milliseconds.
    Latency { millis: u64 },
    /// Perform the operation, then answer HTTP 500 as if the response were lost.
    LostResponse,
    /// Any error code and status.
    Error {
        status: u16,
        code: String,
        #[serde(default)]
        message: String,
    },
}

/// A fault for one operation (`"*"` for all), for `count` calls or (when absent) until cleared.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Fault {
    pub operation: String,
    #[serde(flatten)]
    pub kind: FaultKind,
    #[serde(default)]
    pub count: Option<u32>,
}

impl Fault {
    /// The next `count` calls of `operation` (every one, with `None`) answer `code` with
    /// `status` and `message`, doing nothing: a refusal AWS would give (an IAM denial, say).
    pub fn error(
        operation: &str,
        status: u16,
        code: &str,
        message: &str,
        count: Option<u32>,
    ) -> Fault {
        Fault {
            operation: operation.to_string(),
            kind: FaultKind::Error {
                status,
                code: code.to_string(),
                message: message.to_string(),
            },
            count,
        }
    }
}

/// Everything the emulator knows.
#[derive(Debug)]
pub struct World {
    pub settings: Settings,
    pub now: DateTime<Utc>,
    pub market: Market,
    pub ec2: Ec2State,
    pub sm: SageMakerState,
    /// Recorded events per bus, keyed by (region, bus name): AWS's own go to the `default` bus
    /// of the region where they happen (aws-reference §11.4). Read them with [`World::events`].
    pub buses: BTreeMap<(String, String), Vec<Value>>,
    pub faults: Vec<Fault>,
    /// Forced payment failures: how many of the next reservations (blocks or plans) bought
    /// with the tag [`REQUEST_TAG`] = the key will fail their payment.
    pub payment_failures: BTreeMap<String, u32>,
    /// How many of the next reservations bought with the tag pay before its forced failures
    /// apply (a split's later block, a replacement).
    pub payment_passes: BTreeMap<String, u32>,
    /// Armed one-shot extension payment failures ([`World::fail_next_extension_payment`]): the
    /// next extension bought for the reservation (a Capacity Reservation id, or a training
    /// plan's ARN) fails its payment.
    pub extension_payment_failures: BTreeSet<String>,
    /// AWS API calls served, per service (`ec2`, `sagemaker`, `events`, `cloudformation`,
    /// `sts`, `sns`), since the start.
    pub calls: BTreeMap<String, u64>,
    /// The same, per operation (`DescribeCapacityBlockOfferings`), for tests that count what
    /// a caller asked.
    pub operations: BTreeMap<String, u64>,
    /// CloudFormation stacks, keyed (region, name) ([`World::put_stack`]).
    pub stacks: BTreeMap<(String, String), crate::cloudformation::DeployedStack>,
    /// STS identities: access key id -> ARN ([`World::put_identity`]).
    pub identities: BTreeMap<String, String>,
    /// SNS topics, subscriptions and every accepted publish (`crate::sns`).
    pub sns: crate::sns::SnsState,
    agenda: BTreeMap<(DateTime<Utc>, u64), Action>,
    seq: u64,
    ids: u64,
    event_ids: u64,
    /// Counts [`World::next_uuid`].
    uuids: u64,
}

impl World {
    pub fn new(seed: u64, now: DateTime<Utc>, settings: Settings) -> World {
        World {
            settings,
            now,
            market: Market::new(seed),
            ec2: Ec2State::default(),
            sm: SageMakerState::default(),
            buses: BTreeMap::new(),
            faults: Vec::new(),
            payment_failures: BTreeMap::new(),
            payment_passes: BTreeMap::new(),
            extension_payment_failures: BTreeSet::new(),
            calls: BTreeMap::new(),
            operations: BTreeMap::new(),
            stacks: BTreeMap::new(),
            identities: BTreeMap::new(),
            sns: crate::sns::SnsState::default(),
            agenda: BTreeMap::new(),
            seq: 0,
            ids: 0,
            event_ids: 0,
            uuids: 0,
        }
    }

    /// A fresh deterministic id: `prefix` + 17 hex digits.
    pub fn next_id(&mut self, prefix: &str) -> String {
        self.ids += 1;
        hex_id(
            prefix,
            &[&self.market.seed.to_string(), prefix, &self.ids.to_string()],
        )
    }

    /// A deterministic UUID-shaped id for `what` (a response's request id, a default client
    /// token): the same seed and calls give the same ids (ARCHITECTURE §8.12).
    pub fn next_uuid(&mut self, what: &str) -> String {
        self.uuids += 1;
        let seed = self.market.seed.to_string();
        let n = self.uuids.to_string();
        let a = crate::util::stable_hash(&[&seed, what, &n]);
        let b = crate::util::stable_hash(&[&seed, what, "low", &n]);
        uuid::Builder::from_random_bytes(((u128::from(a) << 64) | u128::from(b)).to_be_bytes())
            .into_uuid()
            .to_string()
    }

    /// A deterministic UUID-shaped event id, so the same seed and actions replay identically.
    pub fn next_event_id(&mut self) -> String {
        self.event_ids += 1;
        let seed = self.market.seed.to_string();
        let n = self.event_ids.to_string();
        let a = crate::util::stable_hash(&[&seed, "event", &n]);
        let b = crate::util::stable_hash(&[&seed, "event-low", &n]);
        uuid::Builder::from_random_bytes(((u128::from(a) << 64) | u128::from(b)).to_be_bytes())
            .into_uuid()
            .to_string()
    }

    /// Schedules an action; times in the past run at the next step.
    pub fn schedule(&mut self, at: DateTime<Utc>, action: Action) {
        self.seq += 1;
        self.agenda.insert((at, self.seq), action);
    }

    /// The time of the next internal transition, if any.
    pub fn next_transition(&self) -> Option<DateTime<Utc>> {
        self.agenda.keys().next().map(|(t, _)| *t)
    }

    /// Moves the clock to `to`, applying every due transition at its own time, in order.
    /// Returns how many transitions ran. The clock never moves backwards.
    pub fn advance_to(&mut self, to: DateTime<Utc>) -> usize {
        let mut ran = 0;
        while let Some((&(at, seq), _)) = self.agenda.iter().next() {
            if at > to {
                break;
            }
            let action = self.agenda.remove(&(at, seq)).expect("just seen");
            if at > self.now {
                self.now = at;
            }
            self.apply(action);
            ran += 1;
        }
        if to > self.now {
            self.now = to;
        }
        ran
    }

    /// Applies transitions already due (scheduled at or before now).
    pub fn settle(&mut self) {
        let now = self.now;
        self.advance_to(now);
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::SageMakerSync => self.sagemaker_sync(),
            other => self.ec2_apply(other),
        }
    }

    /// Records an AWS service event, with the standard envelope, on the `default` bus of
    /// `region`, the region where it happened: AWS events are regional and reach no other
    /// region's bus unless a rule forwards them (aws-reference §11.4).
    pub fn emit(
        &mut self,
        region: &str,
        source: &str,
        detail_type: &str,
        resources: Vec<String>,
        detail: Value,
    ) {
        let id = self.next_event_id();
        let envelope = json!({
            "version": "0",
            "id": id,
            "detail-type": detail_type,
            "source": source,
            "account": self.settings.account_id,
            "time": event_time(self.now),
            "region": region,
            "resources": resources,
            "detail": detail,
        });
        tracing::debug!(detail_type, source, region, "event emitted");
        self.record(region, "default", envelope);
    }

    /// Appends an envelope, as it is, to bus `name` of `region` (an event a rule forwarded
    /// from another region's bus keeps its own `region`).
    pub fn record(&mut self, region: &str, name: &str, envelope: Value) {
        self.buses
            .entry((region.to_string(), name.to_string()))
            .or_default()
            .push(envelope);
    }

    /// The events recorded on bus `name` of `region`, oldest first.
    pub fn events(&self, region: &str, name: &str) -> &[Value] {
        self.buses
            .get(&(region.to_string(), name.to_string()))
            .map_or(&[], Vec::as_slice)
    }

    /// The events recorded on bus `name` of the home region ([`Settings::home_region`]).
    pub fn home_events(&self, name: &str) -> &[Value] {
        self.events(&self.settings.home_region, name)
    }

    /// Every bus's events, keyed by its name for the home region's buses and by
    /// `<region>/<name>` for the others' (a bus name has no `/`).
    pub fn buses_by_label(&self) -> BTreeMap<String, &[Value]> {
        self.buses
            .iter()
            .map(|((region, name), events)| {
                let label = if *region == self.settings.home_region {
                    name.clone()
                } else {
                    format!("{region}/{name}")
                };
                (label, events.as_slice())
            })
            .collect()
    }

    /// Takes the first fault matching an operation, counting it down.
    pub fn take_fault(&mut self, operation: &str) -> Option<FaultKind> {
        let i = self
            .faults
            .iter()
            .position(|f| f.operation == operation || f.operation == "*")?;
        let kind = self.faults[i].kind.clone();
        if let Some(n) = self.faults[i].count.as_mut() {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.faults.remove(i);
            }
        }
        Some(kind)
    }

    /// Control: the payments of the next `count` reservations (blocks or plans) bought with
    /// the request tag `request_id` fail at their payment time. Adds to any still pending.
    pub fn force_payment_failures(&mut self, request_id: &str, count: u32) {
        if count == 0 {
            return;
        }
        *self
            .payment_failures
            .entry(request_id.to_string())
            .or_default() += count;
    }

    /// Control: as [`World::force_payment_failures`], once `after` more reservations bought
    /// with the tag have paid.
    pub fn force_payment_failures_after(&mut self, request_id: &str, after: u32, count: u32) {
        if count == 0 {
            return;
        }
        if after > 0 {
            *self
                .payment_passes
                .entry(request_id.to_string())
                .or_default() += after;
        }
        self.force_payment_failures(request_id, count);
    }

    /// Whether a purchase tagged with `request_id` takes one of the forced payment failures.
    pub fn take_payment_failure(&mut self, request_id: Option<&str>) -> bool {
        let Some(id) = request_id else {
            return false;
        };
        if !self.payment_failures.contains_key(id) {
            return false;
        }
        if let Some(pass) = self.payment_passes.get_mut(id) {
            *pass -= 1;
            if *pass == 0 {
                self.payment_passes.remove(id);
            }
            return false;
        }
        let Some(n) = self.payment_failures.get_mut(id) else {
            return false;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.payment_failures.remove(id);
        }
        true
    }

    /// When a payment made now clears: `payment_minutes` later, but no later than
    /// [`PAYMENT_MAX_HOURS`] from now or `deadline`, and never before now.
    pub fn payment_time(&self, deadline: DateTime<Utc>) -> DateTime<Utc> {
        self.minutes(self.settings.payment_minutes)
            .min(self.now + TimeDelta::hours(PAYMENT_MAX_HOURS))
            .min(deadline)
            .max(self.now)
    }

    /// Control: the next extension bought for `reservation` (a Capacity Reservation id, a
    /// training plan's ARN, or its name, looked up in the home region first, then in any) fails
    /// its payment at its payment time. One shot; arming it twice arms it once. Returns the key
    /// armed (the reservation id or the plan's ARN); an unknown reservation is `NotFound`.
    pub fn fail_next_extension_payment(&mut self, reservation: &str) -> Result<String, ApiError> {
        let key = if self.ec2.reservations.contains_key(reservation) {
            Some(reservation.to_string())
        } else {
            let name = reservation
                .rsplit('/')
                .next()
                .unwrap_or(reservation)
                .to_ascii_lowercase();
            let home = &self.settings.home_region;
            self.sm
                .plans
                .values()
                .filter(|p| p.arn == reservation || p.name.to_ascii_lowercase() == name)
                .min_by_key(|p| (p.arn != reservation, &p.region != home))
                .map(|p| p.arn.clone())
        };
        let key = key.ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!("no Capacity Reservation or training plan {reservation}"),
            )
        })?;
        self.extension_payment_failures.insert(key.clone());
        Ok(key)
    }

    /// When the payment of an extension bought now for `key` (a reservation id or a plan's ARN)
    /// whose reservation ends at `end` clears, and whether it fails then. It clears
    /// `payment_minutes` after the purchase, no later than [`PAYMENT_MAX_HOURS`] after it (within
    /// the documented 12 h) and [`EXTENSION_PAYMENT_LEAD_MINUTES`] before `end`, never before the
    /// purchase. It fails when it cannot clear by 35 minutes before the end (bought later than
    /// that: it fails at once), when [`Settings::extension_payment_fails`] is set, or when a
    /// one-shot failure is armed for `key` (which this takes).
    pub fn extension_payment(&mut self, key: &str, end: DateTime<Utc>) -> (DateTime<Utc>, bool) {
        let deadline = end - TimeDelta::minutes(EXTENSION_PAYMENT_LEAD_MINUTES);
        let at = self.payment_time(deadline);
        let armed = self.extension_payment_failures.remove(key);
        let late =
            deadline < self.now || at > self.now + TimeDelta::hours(EXTENSION_PAYMENT_MAX_HOURS);
        (at, armed || late || self.settings.extension_payment_fails)
    }

    /// A zone's id as EC2 reports it (`use1-az1`, `apne1-az2`): the region's code and the
    /// zone's position in the region (the account's mapping of names to ids is not modelled).
    pub fn zone_id(&self, region: &str, zone: &str) -> String {
        let index = self
            .market
            .region(region)
            .azs
            .iter()
            .position(|a| a == zone)
            .unwrap_or(0);
        let parts: Vec<&str> = region.split('-').collect();
        let mut code = parts[0].to_string();
        for p in &parts[1..] {
            code.push_str(match *p {
                "northeast" => "ne",
                "northwest" => "nw",
                "southeast" => "se",
                "southwest" => "sw",
                p if p.chars().all(|c| c.is_ascii_digit()) => p,
                p => &p[..p.len().min(1)],
            });
        }
        format!("{code}-az{}", index + 1)
    }

    /// Whether a reservation or plan created at `created` is listed by Describe*/List* yet.
    pub fn listed(&self, created: DateTime<Utc>) -> bool {
        self.now >= created + TimeDelta::seconds(self.settings.listing_lag_seconds.max(0))
    }

    /// Whether an instance launched at `launched` is listed by DescribeInstances and
    /// DescribeInstanceStatus yet ([`Settings::instance_listing_lag_seconds`]).
    pub fn instance_listed(&self, launched: DateTime<Utc>) -> bool {
        self.now >= launched + TimeDelta::seconds(self.settings.instance_listing_lag_seconds.max(0))
    }

    /// The first refusal matching a launch (`zone` None for SageMaker), if any.
    pub fn refusal(
        &self,
        market: RefusalMarket,
        region: &str,
        zone: Option<&str>,
        instance_type: &str,
    ) -> Option<&Refusal> {
        self.settings.refusals.iter().find(|r| {
            r.market == market
                && r.region == region
                && r.zone.as_deref().is_none_or(|z| Some(z) == zone)
                && r.instance_type
                    .as_deref()
                    .is_none_or(|t| t == instance_type)
        })
    }

    /// The error a matching [`Refusal`] answers, with AWS's message for its code. `count` is
    /// the number of instances asked for.
    pub fn refusal_error(
        &self,
        r: &Refusal,
        zone: Option<&str>,
        instance_type: &str,
        count: i64,
    ) -> ApiError {
        const ADJUST: &str = "Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.";
        let message = match r.code {
            RefusalCode::VcpuLimitExceeded => format!(
                "You have requested more vCPU capacity than your current vCPU limit of 0 allows \
                 for the instance bucket that the specified instance type belongs to. {ADJUST}"
            ),
            RefusalCode::InstanceLimitExceeded => format!(
                "You have requested more instances ({count}) than your current instance limit of \
                 0 allows for the specified instance type. {ADJUST}"
            ),
            RefusalCode::Unsupported => {
                let zone = zone.unwrap_or_default();
                let others: Vec<String> = self
                    .market
                    .region(&r.region)
                    .azs
                    .into_iter()
                    .filter(|z| {
                        *z != zone
                            && self
                                .refusal(r.market, &r.region, Some(z), instance_type)
                                .is_none_or(|o| o.code != RefusalCode::Unsupported)
                    })
                    .collect();
                let retry = if others.is_empty() {
                    "Please retry your request by not specifying an Availability Zone.".to_string()
                } else {
                    format!(
                        "Please retry your request by not specifying an Availability Zone or \
                         choosing {}.",
                        others.join(", ")
                    )
                };
                format!(
                    "Your requested instance type ({instance_type}) is not supported in your \
                     requested Availability Zone ({zone}). {retry}"
                )
            }
            RefusalCode::MaxSpotInstanceCountExceeded => "Max spot instance count exceeded".into(),
            RefusalCode::ResourceLimitExceeded => format!(
                "The account-level service limit '{instance_type} for training job usage' is 0 \
                 Instances, with current utilization of 0 Instances and a request delta of \
                 {count} Instances. Please use AWS Service Quotas to request an increase for \
                 this quota."
            ),
        };
        let code = match r.code {
            RefusalCode::VcpuLimitExceeded => "VcpuLimitExceeded",
            RefusalCode::InstanceLimitExceeded => "InstanceLimitExceeded",
            RefusalCode::Unsupported => "Unsupported",
            RefusalCode::MaxSpotInstanceCountExceeded => "MaxSpotInstanceCountExceeded",
            RefusalCode::ResourceLimitExceeded => "ResourceLimitExceeded",
        };
        ApiError::new(400, code, message)
    }

    /// A JSON picture of everything, for debugging and scenario reports.
    pub fn snapshot(&self) -> Value {
        json!({
            "now": self.now.to_rfc3339(),
            "next_transition": self.next_transition().map(|t| t.to_rfc3339()),
            "settings": self.settings,
            "ec2": self.ec2.snapshot(),
            "sagemaker": self.sm.snapshot(),
            "event_counts": self.buses_by_label().into_iter().map(|(k, v)| (k, v.len())).collect::<HashMap<_, _>>(),
            "faults": self.faults,
            "payment_failures": self.payment_failures,
            "payment_passes": self.payment_passes,
            "extension_payment_failures": self.extension_payment_failures,
            "stacks": self.stacks_snapshot(),
            "identities": self.identities,
            "sns": self.sns.snapshot(),
        })
    }

    pub fn arn(&self, service: &str, region: &str, resource: &str) -> String {
        format!(
            "arn:aws:{service}:{region}:{}:{resource}",
            self.settings.account_id
        )
    }

    pub fn minutes(&self, m: i64) -> DateTime<Utc> {
        self.now + TimeDelta::minutes(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scenario_can_set_refusals_and_the_new_settings() {
        // scenario files give settings as YAML, merged over the defaults as JSON
        let v: Value = serde_yaml_ng::from_str(
            "refusals:\n\
             - {code: VcpuLimitExceeded, region: us-east-1, instance_type: p5.48xlarge, market: on-demand}\n\
             - {code: Unsupported, region: us-east-1, zone: us-east-1a, market: spot}\n\
             - {code: ResourceLimitExceeded, region: us-west-2, market: sagemaker-training}\n\
             instance_listing_lag_seconds: 0\n\
             run_instances_latency_ms: 0\n\
             refuse_dropped_interfaces: false\n\
             cluster_omit_current_count: false\n\
             endpoint_inactive_plan: refuse\n\
             endpoint_failures: 2\n\
             refuse_partial_cluster_updates: false\n\
             refuse_expired_plan_groups: false\n\
             refuse_tag_filters: true\n\
             max_block_instances: 64\n\
             block_limit_code: SomethingElse\n\
             warning_follows_extension: true\n\
             extension_payment_fails: true\n",
        )
        .expect("yaml");
        let s: Settings = serde_json::from_value(v).expect("settings");
        assert_eq!(s.refusals.len(), 3);
        assert_eq!(s.refusals[0].code, RefusalCode::VcpuLimitExceeded);
        assert_eq!(s.refusals[0].market, RefusalMarket::OnDemand);
        assert_eq!(s.refusals[0].zone, None);
        assert_eq!(s.refusals[1].zone.as_deref(), Some("us-east-1a"));
        assert_eq!(s.refusals[2].market, RefusalMarket::SagemakerTraining);
        assert_eq!(s.instance_listing_lag_seconds, 0);
        assert!(!s.refuse_dropped_interfaces && !s.cluster_omit_current_count);
        assert_eq!(s.endpoint_inactive_plan, InactivePlan::Refuse);
        assert_eq!(s.endpoint_failures, 2);
        assert!(!s.refuse_partial_cluster_updates);
        assert!(!s.refuse_expired_plan_groups);
        assert!(s.refuse_tag_filters);
        assert!(s.warning_follows_extension);
        assert!(s.extension_payment_fails);
        assert_eq!(
            (s.max_block_instances, s.block_limit_code.as_str()),
            (64, "SomethingElse")
        );
        let d = Settings::default();
        assert!(
            d.refusals.is_empty()
                && d.refuse_dropped_interfaces
                && d.cluster_omit_current_count
                && !d.refuse_tag_filters
                && !d.warning_follows_extension
                && !d.extension_payment_fails
        );
        assert_eq!(
            (d.instance_listing_lag_seconds, d.run_instances_latency_ms),
            (120, 50)
        );
        assert_eq!(
            (
                d.cluster_transition_minutes,
                d.cluster_update_minutes,
                d.endpoint_delete_minutes,
                d.endpoint_failures,
            ),
            (3, 5, 2, 0)
        );
        assert_eq!(d.endpoint_inactive_plan, InactivePlan::FailLater);
        assert_eq!(
            (d.max_block_instances, d.block_limit_code.as_str()),
            (256, "CapacityBlockLimitExceeded")
        );
        assert!(d.refuse_partial_cluster_updates);
        assert!(d.refuse_expired_plan_groups);
        assert_eq!(
            json!(InactivePlan::FailLater),
            json!("fail-later"),
            "the scenario spelling"
        );
        let bad = serde_json::from_value::<Settings>(json!({
            "refusals": [{"code": "NoSuchCode", "region": "us-east-1", "market": "on-demand"}]
        }));
        assert!(bad.is_err());
    }
}
