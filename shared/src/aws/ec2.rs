//! EC2 behind the ports: Capacity Block offerings, purchases and reservations for
//! `CapacityMarket`, and instances for `Workloads`. All EC2 <-> domain conversion is here.

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_config::SdkConfig;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::types::{CapacityBlockOffering, InstanceType as Ec2InstanceType};
use aws_sdk_ec2::types::{
    CapacityReservation, CapacityReservationInstancePlatform, CapacityReservationSpecification,
    CapacityReservationTarget, ConnectionTrackingSpecificationRequest, EnaSrdSpecificationRequest,
    EnaSrdUdpSpecificationRequest, Filter, Instance, InstanceInterruptionBehavior,
    InstanceMarketOptionsRequest, InstanceNetworkInterfaceSpecification, InstanceStatus,
    Ipv4PrefixSpecificationRequest, Ipv6PrefixSpecificationRequest,
    LaunchTemplateInstanceNetworkInterfaceSpecification, LaunchTemplateSpecification, MarketType,
    ResourceType, SpotInstanceType, SpotMarketOptions, Tag, TagSpecification,
};
use chrono::{DateTime, Utc};

use super::error::{Call, Failure, classify, malformed, to_chrono, to_smithy};
use super::regional::Regional;
use crate::domain::catalog::PriceTable;
use crate::domain::extension::{ExtensionOffer, ExtensionPayment, ExtensionSeen};
use crate::domain::money::Usd;
use crate::domain::naming::{DEPLOYMENT_TAG, MANAGED_TAG, REQUEST_TAG};
use crate::domain::offering::{Offering, Product, Segment};
use crate::domain::request::{LaunchTemplateRef, RequestId};
use crate::domain::reservation::{Reservation, ReservationState};
use crate::ports::{
    InstanceFilter, InstanceHealth, InstanceInfo, InstanceState, LaunchMarket, LaunchSpec,
    OfferingQuery, PortError, PurchaseSpec, ScheduledChange,
};

pub const SERVICE: &str = "ec2";
/// EC2's answer to a dry run that would have succeeded.
const DRY_RUN_PASSED: &str = "DryRunOperation";

/// Tag recording the offering a block was bought from: a Capacity Reservation does not say,
/// and an adopted reservation (found by tag after a lost response) needs it.
pub const OFFERING_TAG: &str = "capacity-pilot:offering-id";
/// Tag recording the upfront fee paid: a Capacity Reservation does not carry its price.
pub const FEE_TAG: &str = "capacity-pilot:upfront-fee-usd";
/// EC2's tag on a Capacity Block's reservation with the count it will have once active: its
/// totals read 0 until then (aws-reference §11.1).
pub const INCREMENTAL_QUANTITY_TAG: &str =
    "aws:ec2capacityreservation:incrementalRequestedQuantity";

/// DescribeInstanceStatus accepts at most 100 ids; TerminateInstances 1000.
const STATUS_BATCH: usize = 100;
const TERMINATE_BATCH: usize = 1000;

/// The EC2 adapter, one client per region.
#[derive(Clone, Debug)]
pub struct Ec2Adapter {
    clients: Regional<Client>,
    prices: Arc<PriceTable>,
}

fn build_client(config: &SdkConfig, region: &str) -> Client {
    let conf = aws_sdk_ec2::config::Builder::from(config)
        .region(aws_sdk_ec2::config::Region::new(region.to_string()))
        .build();
    Client::from_conf(conf)
}

fn err<E>(
    op: &'static str,
    call: Call,
) -> impl FnOnce(aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>) -> PortError
where
    E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    move |e| classify(SERVICE, op, call, e)
}

/// The states of a reservation that exists or may still (`ReservationState::is_live`), as
/// DescribeCapacityReservations' documented `state` filter names them.
const LIVE_STATES: [&str; 8] = [
    "pending",
    "payment-pending",
    "assessing",
    "delayed",
    "scheduled",
    "active",
    "unavailable",
    "cancelling",
];

/// DescribeCapacityReservations' documented `state` filter for the [`LIVE_STATES`].
fn live_filter() -> Filter {
    LIVE_STATES
        .iter()
        .fold(Filter::builder().name("state"), |f, state| f.values(*state))
        .build()
}

/// Whether EC2's refusal `code` is of a filter it does not take.
fn refuses_filter(code: &str) -> bool {
    matches!(
        code,
        "InvalidParameterValue" | "InvalidFilter" | "InvalidParameter" | "UnknownParameter"
    )
}

fn tags_of(tags: &[Tag]) -> BTreeMap<String, String> {
    tags.iter()
        .filter_map(|t| {
            Some((
                t.key()?.to_string(),
                t.value().unwrap_or_default().to_string(),
            ))
        })
        .collect()
}

fn tag_spec(resource: ResourceType, tags: &BTreeMap<String, String>) -> TagSpecification {
    let mut b = TagSpecification::builder().resource_type(resource);
    for (k, v) in tags {
        b = b.tags(Tag::builder().key(k).value(v).build());
    }
    b.build()
}

/// A purchase call's configuration (ARCHITECTURE §8.11): no SDK retries (no purchase API has
/// an idempotency token: a retry after a lost answer could buy twice) and an explicit
/// operation timeout; the block's or plan's purchase and its extension's alike.
fn purchase_config() -> aws_sdk_ec2::config::Builder {
    aws_sdk_ec2::config::Builder::default()
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            aws_sdk_ec2::config::timeout::TimeoutConfig::builder()
                .operation_timeout(super::PURCHASE_OPERATION_TIMEOUT)
                .build(),
        )
}

fn time(
    op: &'static str,
    what: &str,
    t: Option<&aws_smithy_types::DateTime>,
) -> Result<DateTime<Utc>, PortError> {
    t.and_then(to_chrono)
        .ok_or_else(|| malformed(SERVICE, op, format!("{what} is missing or out of range")))
}

/// `what`'s `UpfrontFee` (an offering's, an extension's), which must be there and read as USD.
fn upfront_fee(op: &'static str, what: &str, fee: Option<&str>) -> Result<Usd, PortError> {
    let f = fee.ok_or_else(|| malformed(SERVICE, op, format!("{what} has no UpfrontFee")))?;
    Usd::parse(f).map_err(|e| malformed(SERVICE, op, format!("{what} UpfrontFee {f:?}: {e}")))
}

/// An extension as EC2 reports it; a status this build does not know is read as pending
/// (live: never as failed, which would give its debit back).
fn block_extension(
    op: &'static str,
    e: &aws_sdk_ec2::types::CapacityBlockExtension,
) -> Result<ExtensionSeen, PortError> {
    use aws_sdk_ec2::types::CapacityBlockExtensionStatus as S;
    let id = e
        .capacity_block_extension_offering_id()
        .ok_or_else(|| malformed(SERVICE, op, "an extension has no offering id"))?;
    let fee = match e.upfront_fee() {
        Some(f) if e.currency_code().is_none_or(|c| c == "USD") => {
            Some(upfront_fee(op, &format!("extension {id}"), Some(f))?)
        }
        _ => None,
    };
    Ok(ExtensionSeen {
        offering_id: id.to_string(),
        hours: count(
            op,
            "CapacityBlockExtensionDurationHours",
            e.capacity_block_extension_duration_hours(),
        )?,
        starts_at: time(
            op,
            "CapacityBlockExtensionStartDate",
            e.capacity_block_extension_start_date(),
        )?,
        ends_at: time(
            op,
            "CapacityBlockExtensionEndDate",
            e.capacity_block_extension_end_date(),
        )?,
        fee,
        payment: match e.capacity_block_extension_status() {
            Some(S::PaymentSucceeded) => ExtensionPayment::Succeeded,
            Some(S::PaymentFailed) => ExtensionPayment::Failed,
            _ => ExtensionPayment::Pending,
        },
        bought_at: e
            .capacity_block_extension_purchase_date()
            .and_then(to_chrono),
    })
}

fn count(op: &'static str, what: &str, n: Option<i32>) -> Result<u32, PortError> {
    n.and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| malformed(SERVICE, op, format!("{what} is missing or negative")))
}

fn i32_of(op: &'static str, what: &str, n: u32) -> Result<i32, PortError> {
    i32::try_from(n).map_err(|_| PortError::Permanent {
        service: SERVICE,
        code: "InvalidParameterValue".to_string(),
        message: format!("{op}: {what} {n} is too large"),
    })
}

/// EC2's Capacity Reservation states, mapped to the domain's.
pub fn reservation_state(s: &str) -> ReservationState {
    match s {
        "payment-pending" => ReservationState::PaymentPending,
        "payment-failed" => ReservationState::PaymentFailed,
        "scheduled" => ReservationState::Scheduled,
        "active" => ReservationState::Active,
        "expired" => ReservationState::Expired,
        "cancelled" => ReservationState::Cancelled,
        "failed" => ReservationState::Failed,
        "unavailable" => ReservationState::Unavailable,
        "pending" => ReservationState::Pending,
        "assessing" => ReservationState::Assessing,
        "delayed" => ReservationState::Delayed,
        "cancelling" => ReservationState::Cancelling,
        "unsupported" => ReservationState::Unsupported,
        other => {
            tracing::warn!(state = other, "unknown capacity reservation state");
            ReservationState::Unknown
        }
    }
}

fn instance_state(s: &str) -> Option<InstanceState> {
    Some(match s {
        "pending" => InstanceState::Pending,
        "running" => InstanceState::Running,
        "shutting-down" => InstanceState::ShuttingDown,
        "terminated" => InstanceState::Terminated,
        "stopping" => InstanceState::Stopping,
        "stopped" => InstanceState::Stopped,
        _ => return None,
    })
}

/// Health from the instance, system and attached-EBS status checks: any impaired check is
/// impaired; all passing is ok; anything else (initializing, no data, not running) unknown.
pub fn health_of(status: &InstanceStatus) -> InstanceHealth {
    let checks = [
        status
            .instance_status()
            .and_then(|s| s.status())
            .map(|s| s.as_str()),
        status
            .system_status()
            .and_then(|s| s.status())
            .map(|s| s.as_str()),
    ];
    let ebs = status
        .attached_ebs_status()
        .and_then(|s| s.status())
        .map(|s| s.as_str());
    if checks.contains(&Some("impaired")) || ebs == Some("impaired") {
        InstanceHealth::Impaired
    } else if checks.iter().all(|c| *c == Some("ok")) {
        InstanceHealth::Ok
    } else {
        InstanceHealth::Unknown
    }
}

/// The events EC2 has scheduled for an instance, each from its `NotBefore` (one without it
/// is skipped: nothing says when it happens). A completed or cancelled event stays listed a
/// while, its description starting `[Completed]` or `[Canceled]` (EC2 User Guide, "Scheduled
/// events for your instances"): no longer to come.
pub fn scheduled_of(status: &InstanceStatus) -> Vec<ScheduledChange> {
    status
        .events()
        .iter()
        .filter(|e| {
            !e.description()
                .is_some_and(|d| d.starts_with("[Completed]") || d.starts_with("[Canceled]"))
        })
        .filter_map(|e| {
            Some(ScheduledChange {
                code: e.code()?.as_str().to_string(),
                not_before: e.not_before().and_then(to_chrono)?,
            })
        })
        .collect()
}

impl Ec2Adapter {
    /// Clients for every region are built from `config` on first use.
    pub fn new(config: &SdkConfig, prices: PriceTable) -> Ec2Adapter {
        Ec2Adapter {
            clients: Regional::new(config, build_client),
            prices: Arc::new(prices),
        }
    }

    /// Uses `client` for `region` (tests with mocked clients).
    pub fn with_client(self, region: &str, client: Client) -> Ec2Adapter {
        self.clients.insert(region, client);
        self
    }

    pub fn client(&self, region: &str) -> Client {
        self.clients.get(region)
    }

    // ----------------------------------------------------------------------------------
    // Capacity Blocks
    // ----------------------------------------------------------------------------------

    /// DescribeCapacityBlockOfferings over every page, priced against on-demand.
    pub async fn search_blocks(&self, q: &OfferingQuery) -> Result<Vec<Offering>, PortError> {
        const OP: &str = "DescribeCapacityBlockOfferings";
        let mut pages = self
            .client(&q.region)
            .describe_capacity_block_offerings()
            .instance_type(&q.instance_type)
            .instance_count(i32_of(OP, "InstanceCount", q.instance_count)?)
            .capacity_duration_hours(i32_of(OP, "CapacityDurationHours", q.duration_hours)?)
            .start_date_range(to_smithy(q.start_from))
            .end_date_range(to_smithy(q.end_by))
            .into_paginator()
            .items()
            .send();
        let mut out = Vec::new();
        while let Some(item) = pages.next().await {
            let o = item.map_err(err(OP, Call::Retryable))?;
            if let Some(offering) = self.offering(&q.region, &o)? {
                out.push(offering);
            }
        }
        tracing::debug!(region = %q.region, instance_type = %q.instance_type, found = out.len(), "capacity block offerings");
        Ok(out)
    }

    fn offering(
        &self,
        region: &str,
        o: &CapacityBlockOffering,
    ) -> Result<Option<Offering>, PortError> {
        const OP: &str = "DescribeCapacityBlockOfferings";
        let id = o
            .capacity_block_offering_id()
            .ok_or_else(|| malformed(SERVICE, OP, "an offering has no id"))?;
        // An UltraServer is sold in groups of instances its own way (`UltraserverType`,
        // `UltraserverCount`), drained an hour before its end, not 30 minutes: until capacity-
        // pilot buys UltraServers as such (the UltraServers issue), one is never bought as an
        // instance block (review aws-reality-2, Task 3 #5).
        if let Some(ultra) = o.ultraserver_type() {
            tracing::info!(
                offering_id = id,
                ultraserver_type = ultra,
                "skipping an UltraServer offering: UltraServers are not bought yet"
            );
            return Ok(None);
        }
        let currency = o.currency_code().unwrap_or("USD");
        if currency != "USD" {
            // Budgets are in USD; an offering we can't price is not one we can buy.
            tracing::warn!(
                offering_id = id,
                currency,
                "skipping an offering not priced in USD"
            );
            return Ok(None);
        }
        let fee = upfront_fee(OP, &format!("offering {id}"), o.upfront_fee())?;
        let segment = Segment {
            start: time(OP, "StartDate", o.start_date())?,
            end: time(OP, "EndDate", o.end_date())?,
            availability_zone: o.availability_zone().map(str::to_string),
        };
        Ok(Some(Offering::new(
            id,
            Product::CapacityBlock,
            region,
            o.instance_type().unwrap_or_default(),
            count(OP, "InstanceCount", o.instance_count())?,
            vec![segment],
            fee,
            &self.prices,
        )))
    }

    /// PurchaseCapacityBlock with SDK retries disabled: the API has no idempotency token, so
    /// a retry after a lost response would buy a second block. Any doubt is
    /// `OutcomeUnknown`, settled by [`Ec2Adapter::reservations_for_request`].
    pub async fn purchase_block(
        &self,
        offering: &Offering,
        spec: &PurchaseSpec,
    ) -> Result<Reservation, PortError> {
        const OP: &str = "PurchaseCapacityBlock";
        let mut tags = spec.tags.clone();
        tags.entry(MANAGED_TAG.to_string())
            .or_insert_with(|| "true".to_string());
        tags.insert(REQUEST_TAG.to_string(), spec.request_id.to_string());
        tags.insert(OFFERING_TAG.to_string(), offering.id.clone());
        tags.insert(FEE_TAG.to_string(), offering.upfront_fee.to_string());
        tracing::info!(
            request_id = %spec.request_id,
            offering_id = %offering.id,
            region = %offering.region,
            upfront_fee = %offering.upfront_fee,
            "purchasing capacity block"
        );
        let out = self
            .client(&offering.region)
            .purchase_capacity_block()
            .capacity_block_offering_id(&offering.id)
            .instance_platform(CapacityReservationInstancePlatform::from(
                spec.instance_platform.as_str(),
            ))
            .tag_specifications(tag_spec(ResourceType::CapacityReservation, &tags))
            .customize()
            .config_override(purchase_config())
            .send()
            .await
            .map_err(err(OP, Call::Purchase))?;
        let cr = out.capacity_reservation().ok_or_else(|| {
            // It may well have bought: reconcile by tag.
            PortError::OutcomeUnknown {
                service: SERVICE,
                message: format!("{OP}: the response has no capacityReservation"),
            }
        })?;
        let ultraserver = out
            .capacity_blocks()
            .iter()
            .any(|b| b.ultraserver_type().is_some());
        let mut r =
            self.reservation(&offering.region, cr)
                .map_err(|e| PortError::OutcomeUnknown {
                    service: SERVICE,
                    message: format!("{OP}: bought, but the response is unreadable: {e}"),
                })?;
        r.upfront_fee = offering.upfront_fee;
        // What was bought is the offering's count, whatever a pending block's totals say.
        r.instance_count = offering.instance_count;
        r.offering_id = Some(offering.id.clone());
        r.request_tag = Some(spec.request_id.to_string());
        r.deployment_tag = spec.tags.get(DEPLOYMENT_TAG).cloned();
        r.ultraserver |= ultraserver;
        Ok(r)
    }

    /// DescribeCapacityBlockExtensionOfferings: what block `reservation_id` can be extended
    /// by, for `hours` (ARCHITECTURE §9.3).
    pub async fn block_extension_offers(
        &self,
        region: &str,
        reservation_id: &str,
        hours: u32,
    ) -> Result<Vec<ExtensionOffer>, PortError> {
        const OP: &str = "DescribeCapacityBlockExtensionOfferings";
        let mut pages = self
            .client(region)
            .describe_capacity_block_extension_offerings()
            .capacity_reservation_id(reservation_id)
            .capacity_block_extension_duration_hours(i32_of(OP, "hours", hours)?)
            .into_paginator()
            .items()
            .send();
        let mut out = Vec::new();
        while let Some(item) = pages.next().await {
            let o = item.map_err(err(OP, Call::Retryable))?;
            let id = o
                .capacity_block_extension_offering_id()
                .ok_or_else(|| malformed(SERVICE, OP, "an extension offering has no id"))?;
            if let Some(c) = o.currency_code().filter(|c| *c != "USD") {
                tracing::warn!(
                    offering_id = id,
                    currency = c,
                    "skipping an extension offering not priced in USD"
                );
                continue;
            }
            let fee = upfront_fee(OP, &format!("offering {id}"), o.upfront_fee())?;
            out.push(ExtensionOffer {
                offering_id: id.to_string(),
                hours: count(
                    OP,
                    "CapacityBlockExtensionDurationHours",
                    o.capacity_block_extension_duration_hours(),
                )?,
                starts_at: time(
                    OP,
                    "CapacityBlockExtensionStartDate",
                    o.capacity_block_extension_start_date(),
                )?,
                ends_at: time(
                    OP,
                    "CapacityBlockExtensionEndDate",
                    o.capacity_block_extension_end_date(),
                )?,
                fee,
            });
        }
        Ok(out)
    }

    /// PurchaseCapacityBlockExtension with SDK retries disabled, as a block's purchase: the
    /// API has no idempotency token. Any doubt is `OutcomeUnknown`, settled by
    /// [`Ec2Adapter::block_extensions`].
    pub async fn extend_block(
        &self,
        region: &str,
        reservation_id: &str,
        offer: &ExtensionOffer,
    ) -> Result<ExtensionSeen, PortError> {
        const OP: &str = "PurchaseCapacityBlockExtension";
        tracing::info!(
            reservation_id,
            offering_id = %offer.offering_id,
            region,
            upfront_fee = %offer.fee,
            "purchasing capacity block extension"
        );
        let out = self
            .client(region)
            .purchase_capacity_block_extension()
            .capacity_block_extension_offering_id(&offer.offering_id)
            .capacity_reservation_id(reservation_id)
            .customize()
            .config_override(purchase_config())
            .send()
            .await
            .map_err(err(OP, Call::Purchase))?;
        let e = out
            .capacity_block_extensions()
            .iter()
            .find(|e| e.capacity_block_extension_offering_id() == Some(offer.offering_id.as_str()))
            .ok_or_else(|| PortError::OutcomeUnknown {
                service: SERVICE,
                message: format!(
                    "{OP}: the response names no extension of {}",
                    offer.offering_id
                ),
            })?;
        block_extension(OP, e).map_err(|e| PortError::OutcomeUnknown {
            service: SERVICE,
            message: format!("{OP}: bought, but the response is unreadable: {e}"),
        })
    }

    /// DescribeCapacityBlockExtensionHistory of block `reservation_id`: every extension of it
    /// AWS lists (by whomever bought), paid, pending or failed.
    pub async fn block_extensions(
        &self,
        region: &str,
        reservation_id: &str,
    ) -> Result<Vec<ExtensionSeen>, PortError> {
        const OP: &str = "DescribeCapacityBlockExtensionHistory";
        let mut pages = self
            .client(region)
            .describe_capacity_block_extension_history()
            .capacity_reservation_ids(reservation_id)
            .into_paginator()
            .items()
            .send();
        let mut out = Vec::new();
        while let Some(item) = pages.next().await {
            let e = item.map_err(err(OP, Call::Retryable))?;
            if e.capacity_reservation_id()
                .is_some_and(|id| id != reservation_id)
            {
                continue;
            }
            out.push(block_extension(OP, &e)?);
        }
        Ok(out)
    }

    fn reservation(
        &self,
        region: &str,
        cr: &CapacityReservation,
    ) -> Result<Reservation, PortError> {
        const OP: &str = "DescribeCapacityReservations";
        let id = cr
            .capacity_reservation_id()
            .ok_or_else(|| malformed(SERVICE, OP, "a reservation has no id"))?;
        let tags = tags_of(cr.tags());
        let upfront_fee = match tags.get(FEE_TAG) {
            Some(f) => Usd::parse(f)
                .map_err(|e| malformed(SERVICE, OP, format!("{id} tag {FEE_TAG}={f:?}: {e}")))?,
            // Not bought by us (or tags stripped): the price is not on the reservation.
            None => Usd::ZERO,
        };
        Ok(Reservation {
            id: id.to_string(),
            product: Product::CapacityBlock,
            region: region.to_string(),
            instance_type: cr.instance_type().unwrap_or_default().to_string(),
            instance_count: match count(OP, "TotalInstanceCount", cr.total_instance_count())? {
                // A block reads 0 until active; EC2 tags the count it will have.
                0 => tags
                    .get(INCREMENTAL_QUANTITY_TAG)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                n => n,
            },
            segments: vec![Segment {
                start: time(OP, "StartDate", cr.start_date())?,
                end: time(OP, "EndDate", cr.end_date())?,
                availability_zone: cr.availability_zone().map(str::to_string),
            }],
            upfront_fee,
            state: cr
                .state()
                .map(|s| reservation_state(s.as_str()))
                .unwrap_or(ReservationState::Unknown),
            offering_id: tags.get(OFFERING_TAG).cloned(),
            request_tag: tags.get(REQUEST_TAG).cloned(),
            // Read from the block, not the reservation (`typed`, or the purchase's answer).
            ultraserver: false,
            bought_at: None,
            debit_month: None,
            debit_team: None,
            payment_check_at: None,
            extensions: Vec::new(),
            extension_check_at: None,
            deployment_tag: tags.get(DEPLOYMENT_TAG).cloned(),
        })
    }

    /// One Capacity Reservation by id; `None` when EC2 does not know it.
    pub async fn describe_reservation(
        &self,
        region: &str,
        reservation_id: &str,
    ) -> Result<Option<Reservation>, PortError> {
        const OP: &str = "DescribeCapacityReservations";
        let res = self
            .client(region)
            .describe_capacity_reservations()
            .capacity_reservation_ids(reservation_id)
            .send()
            .await;
        let out = match res {
            Ok(out) => out,
            Err(e) => {
                let f = Failure::from_sdk(OP, e);
                if f.code == "InvalidCapacityReservationId.NotFound" {
                    return Ok(None);
                }
                return Err(f.into_port(SERVICE, Call::Retryable));
            }
        };
        out.capacity_reservations()
            .iter()
            .find(|cr| cr.capacity_reservation_id() == Some(reservation_id))
            .map(|cr| self.reservation(region, cr))
            .transpose()
    }

    /// Every Capacity Block reservation tagged with the request id, over every page.
    pub async fn reservations_for_request(
        &self,
        region: &str,
        request_id: &RequestId,
    ) -> Result<Vec<Reservation>, PortError> {
        self.blocks_tagged(region, REQUEST_TAG, request_id.as_str(), |r| {
            r.request_tag.as_deref() == Some(request_id.as_str())
        })
        .await
    }

    /// Every Capacity Block reservation tagged for the deployment `deployment_id` (ARCHITECTURE
    /// §8.7), over every page: what the detector of unrecorded reservations reads.
    pub async fn reservations_of_deployment(
        &self,
        region: &str,
        deployment_id: &str,
    ) -> Result<Vec<Reservation>, PortError> {
        self.blocks_tagged(region, DEPLOYMENT_TAG, deployment_id, |r| {
            r.deployment_tag.as_deref() == Some(deployment_id)
        })
        .await
    }

    /// The Capacity Block reservations tagged `key` = `value`. The tag filter is widely used
    /// but undocumented (aws-reference §11.1): when EC2 refuses it, the live reservations are
    /// listed by the documented `state` filter instead and `tagged` matches the tag here (the
    /// callers match it again).
    async fn blocks_tagged(
        &self,
        region: &str,
        key: &str,
        value: &str,
        tagged: impl Fn(&Reservation) -> bool,
    ) -> Result<Vec<Reservation>, PortError> {
        let by_tag = Filter::builder()
            .name(format!("tag:{key}"))
            .values(value)
            .build();
        let found = match self.blocks_where(region, by_tag).await {
            Err(PortError::Permanent { code, message, .. }) if refuses_filter(&code) => {
                tracing::warn!(
                    region,
                    key,
                    value,
                    code,
                    message,
                    "the tag filter was refused; listing by the documented state filter"
                );
                self.blocks_where(region, live_filter())
                    .await?
                    .into_iter()
                    .filter(|(r, _)| tagged(r))
                    .collect()
            }
            other => other?,
        };
        self.typed(region, found).await
    }

    /// The reservations `found`, those of an UltraServer block marked so. A reservation
    /// does not say it: its `InstanceType` is the instance's (`p6e-gb200.36xlarge`), never
    /// a `u-` name; the block it belongs to (`CapacityBlockId`) carries `UltraserverType`
    /// (DescribeCapacityBlocks). A block adopted after a lost purchase answer is typed
    /// here, so its windows drain at the UltraServer lead (review aws-reality-2, Task 3 #5).
    /// One call for every block found, none when none is.
    async fn typed(
        &self,
        region: &str,
        found: Vec<(Reservation, Option<String>)>,
    ) -> Result<Vec<Reservation>, PortError> {
        const OP: &str = "DescribeCapacityBlocks";
        let ids: Vec<String> = found.iter().filter_map(|(_, b)| b.clone()).collect();
        let mut ultra = std::collections::BTreeSet::new();
        if !ids.is_empty() {
            let mut pages = self
                .client(region)
                .describe_capacity_blocks()
                .set_capacity_block_ids(Some(ids))
                .into_paginator()
                .items()
                .send();
            while let Some(block) = pages.next().await {
                let block = block.map_err(err(OP, Call::Retryable))?;
                if block.ultraserver_type().is_some() {
                    ultra.extend(block.capacity_reservation_ids().iter().cloned());
                }
            }
        }
        Ok(found
            .into_iter()
            .map(|(mut r, _)| {
                r.ultraserver |= ultra.contains(&r.id);
                r
            })
            .collect())
    }

    /// Every live Capacity Block reservation in `region`, whoever bought it, by the documented
    /// `state` filter: what the account's limit across Capacity Blocks counts.
    pub async fn blocks_in_account(&self, region: &str) -> Result<Vec<Reservation>, PortError> {
        Ok(self
            .blocks_where(region, live_filter())
            .await?
            .into_iter()
            .map(|(r, _)| r)
            .collect())
    }

    /// The Capacity Block reservations `filter` lists, over every page, each with the
    /// block it belongs to when EC2 names it.
    async fn blocks_where(
        &self,
        region: &str,
        filter: Filter,
    ) -> Result<Vec<(Reservation, Option<String>)>, PortError> {
        const OP: &str = "DescribeCapacityReservations";
        let mut pages = self
            .client(region)
            .describe_capacity_reservations()
            .filters(filter)
            .into_paginator()
            .items()
            .send();
        let mut out = Vec::new();
        while let Some(item) = pages.next().await {
            let cr = item.map_err(err(OP, Call::Retryable))?;
            let is_block = cr
                .reservation_type()
                .is_none_or(|t| t.as_str() == "capacity-block");
            if is_block {
                out.push((
                    self.reservation(region, &cr)?,
                    cr.capacity_block_id().map(str::to_string),
                ));
            }
        }
        Ok(out)
    }

    // ----------------------------------------------------------------------------------
    // Instances
    // ----------------------------------------------------------------------------------

    /// RunInstances from the launch template, idempotent through the client token.
    pub async fn launch_instances(
        &self,
        spec: &LaunchSpec,
    ) -> Result<Vec<InstanceInfo>, PortError> {
        const OP: &str = "RunInstances";
        let req = self.run_request(spec).await?;
        tracing::info!(
            region = %spec.region,
            market = ?spec.market,
            instance_type = %spec.instance_type,
            count = spec.count,
            client_token = %spec.client_token,
            "launching instances"
        );
        // EC2 answers no capacity with HTTP 500 (InsufficientInstanceCapacity), which the SDK
        // would retry with backoff, seconds per zone, before the launcher's next placement and
        // out of the invocation's time budget: not retried. Throttling and server errors are.
        let out = req
            .customize()
            .config_override(
                aws_sdk_ec2::config::Builder::default().retry_classifier(NoCapacityIsFinal),
            )
            .send()
            .await
            .map_err(err(OP, Call::Retryable))?;
        out.instances()
            .iter()
            .map(|i| instance_info(&spec.region, i, InstanceHealth::Unknown))
            .collect()
    }

    /// The pre-flight of a launch (ARCHITECTURE §8.1): the launch template resolves in the
    /// spec's region (DescribeLaunchTemplateVersions, as the launch reads it), and, with
    /// `dry_run`, RunInstances as [`Self::launch_instances`] would send it, with `DryRun`:
    /// EC2's `DryRunOperation` is success. Any other answer is the error, with EC2's code.
    pub async fn preflight_instances(
        &self,
        spec: &LaunchSpec,
        dry_run: bool,
    ) -> Result<(), PortError> {
        const OP: &str = "RunInstances";
        let req = self.run_request(spec).await?;
        if !dry_run {
            return Ok(());
        }
        match req.dry_run(true).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let f = Failure::from_sdk(OP, e);
                if f.code == DRY_RUN_PASSED {
                    Ok(())
                } else {
                    Err(f.into_port(SERVICE, Call::Retryable))
                }
            }
        }
    }

    /// The RunInstances request for `spec`: one builder for the launch and its dry run.
    async fn run_request(
        &self,
        spec: &LaunchSpec,
    ) -> Result<aws_sdk_ec2::operation::run_instances::builders::RunInstancesFluentBuilder, PortError>
    {
        const OP: &str = "RunInstances";
        let n = i32_of(OP, "count", spec.count)?;
        let lt = &spec.launch_template;
        let mut template = LaunchTemplateSpecification::builder()
            .version(lt.version.clone().unwrap_or_else(|| "$Default".to_string()));
        if let Some(id) = &lt.id {
            template = template.launch_template_id(id);
        } else if let Some(name) = &lt.name {
            template = template.launch_template_name(name);
        }
        let mut tags = spec.tags.clone();
        tags.entry(MANAGED_TAG.to_string())
            .or_insert_with(|| "true".to_string());
        let interfaces = self.template_interfaces(&spec.region, lt).await?;
        let mut req = self
            .client(&spec.region)
            .run_instances()
            .launch_template(template.build())
            .instance_type(Ec2InstanceType::from(spec.instance_type.as_str()))
            .min_count(n)
            .max_count(n)
            // A pre-flight's spec has none: a dry run is no launch to make idempotent.
            .set_client_token(Some(spec.client_token.clone()).filter(|t| !t.is_empty()))
            .tag_specifications(tag_spec(ResourceType::Instance, &tags));
        // A template with network interfaces (EFA: several) takes the subnet in each of them:
        // beside them an instance-level SubnetId is InvalidParameterCombination, and an
        // override replaces the template's whole list, so every interface is copied
        // (aws-reference §11.1 "Launch templates with network interfaces").
        req = if interfaces.is_empty() {
            req.subnet_id(&spec.subnet_id)
        } else {
            req.set_network_interfaces(Some(
                interfaces
                    .iter()
                    .map(|i| with_subnet(i, &spec.subnet_id))
                    .collect(),
            ))
        };
        match &spec.market {
            LaunchMarket::CapacityBlock { reservation_id } => {
                req = req
                    .instance_market_options(
                        InstanceMarketOptionsRequest::builder()
                            .market_type(MarketType::CapacityBlock)
                            .build(),
                    )
                    .capacity_reservation_specification(
                        CapacityReservationSpecification::builder()
                            .capacity_reservation_target(
                                CapacityReservationTarget::builder()
                                    .capacity_reservation_id(reservation_id)
                                    .build(),
                            )
                            .build(),
                    );
            }
            LaunchMarket::Spot => {
                req = req.instance_market_options(
                    InstanceMarketOptionsRequest::builder()
                        .market_type(MarketType::Spot)
                        .spot_options(
                            SpotMarketOptions::builder()
                                .spot_instance_type(SpotInstanceType::OneTime)
                                .instance_interruption_behavior(
                                    InstanceInterruptionBehavior::Terminate,
                                )
                                .build(),
                        )
                        .build(),
                );
            }
            LaunchMarket::OnDemand => {}
        }
        Ok(req)
    }

    /// The network interfaces of the launch template's version the launch uses (`$Default`
    /// unless the request names one), from DescribeLaunchTemplateVersions.
    async fn template_interfaces(
        &self,
        region: &str,
        lt: &LaunchTemplateRef,
    ) -> Result<Vec<LaunchTemplateInstanceNetworkInterfaceSpecification>, PortError> {
        const OP: &str = "DescribeLaunchTemplateVersions";
        let mut req = self
            .client(region)
            .describe_launch_template_versions()
            .versions(lt.version.clone().unwrap_or_else(|| "$Default".to_string()));
        if let Some(id) = &lt.id {
            req = req.launch_template_id(id);
        } else if let Some(name) = &lt.name {
            req = req.launch_template_name(name);
        }
        let out = req.send().await.map_err(err(OP, Call::Retryable))?;
        let version = out.launch_template_versions().first().ok_or_else(|| {
            malformed(
                SERVICE,
                OP,
                format!("no version of launch template {lt:?} was returned"),
            )
        })?;
        Ok(version
            .launch_template_data()
            .map(|d| d.network_interfaces().to_vec())
            .unwrap_or_default())
    }

    /// DescribeInstances over every page, merged with DescribeInstanceStatus
    /// (`IncludeAllInstances`) for health. Ids are passed as a filter, so an id EC2 has
    /// forgotten is simply absent instead of failing the call.
    pub async fn describe_instances(
        &self,
        region: &str,
        filter: &InstanceFilter,
    ) -> Result<Vec<InstanceInfo>, PortError> {
        const OP: &str = "DescribeInstances";
        let client = self.client(region);
        let mut filters = Vec::new();
        if !filter.instance_ids.is_empty() {
            filters.push(
                Filter::builder()
                    .name("instance-id")
                    .set_values(Some(filter.instance_ids.clone()))
                    .build(),
            );
        }
        if let Some(r) = &filter.reservation_id {
            filters.push(
                Filter::builder()
                    .name("capacity-reservation-id")
                    .values(r)
                    .build(),
            );
        }
        if let Some(r) = &filter.request_id {
            filters.push(
                Filter::builder()
                    .name(format!("tag:{REQUEST_TAG}"))
                    .values(r.as_str())
                    .build(),
            );
        }
        if filter.managed_only {
            filters.push(
                Filter::builder()
                    .name("tag-key")
                    .values(MANAGED_TAG)
                    .build(),
            );
        }
        let mut pages = client
            .describe_instances()
            .set_filters(Some(filters))
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(err(OP, Call::Retryable))?;
            for r in page.reservations() {
                for i in r.instances() {
                    out.push(instance_info(region, i, InstanceHealth::Unknown)?);
                }
            }
        }
        let ids: Vec<String> = out.iter().map(|i| i.instance_id.clone()).collect();
        let health = self.health(&client, &ids).await?;
        for i in &mut out {
            if let Some((h, scheduled)) = health.get(&i.instance_id) {
                i.health = *h;
                i.scheduled = scheduled.clone();
            }
        }
        Ok(out)
    }

    async fn health(
        &self,
        client: &Client,
        ids: &[String],
    ) -> Result<BTreeMap<String, (InstanceHealth, Vec<ScheduledChange>)>, PortError> {
        let mut out = BTreeMap::new();
        for chunk in ids.chunks(STATUS_BATCH) {
            match self.statuses(client, chunk).await {
                Ok(found) => out.extend(found),
                // `instance-id` is no DescribeInstanceStatus filter, so ids go as ids, and one
                // forgotten between the two calls fails them all: ask one by one instead.
                Err(f) if f.code == "InvalidInstanceID.NotFound" => {
                    for id in chunk {
                        match self.statuses(client, std::slice::from_ref(id)).await {
                            Ok(found) => out.extend(found),
                            Err(f) if f.code == "InvalidInstanceID.NotFound" => {}
                            Err(f) => return Err(f.into_port(SERVICE, Call::Retryable)),
                        }
                    }
                }
                Err(f) => return Err(f.into_port(SERVICE, Call::Retryable)),
            }
        }
        Ok(out)
    }

    /// DescribeInstanceStatus (`IncludeAllInstances`, so stopped and pending ones too).
    async fn statuses(
        &self,
        client: &Client,
        ids: &[String],
    ) -> Result<Vec<(String, (InstanceHealth, Vec<ScheduledChange>))>, Failure> {
        const OP: &str = "DescribeInstanceStatus";
        let mut pages = client
            .describe_instance_status()
            .include_all_instances(true)
            .set_instance_ids(Some(ids.to_vec()))
            .into_paginator()
            .items()
            .send();
        let mut out = Vec::new();
        while let Some(s) = pages.next().await {
            let s = s.map_err(|e| Failure::from_sdk(OP, e))?;
            if let Some(id) = s.instance_id() {
                out.push((id.to_string(), (health_of(&s), scheduled_of(&s))));
            }
        }
        Ok(out)
    }

    /// TerminateInstances; terminating a terminated or forgotten instance succeeds.
    pub async fn terminate_instances(
        &self,
        region: &str,
        instance_ids: &[String],
    ) -> Result<(), PortError> {
        const OP: &str = "TerminateInstances";
        let client = self.client(region);
        for chunk in instance_ids.chunks(TERMINATE_BATCH) {
            tracing::info!(region, instance_ids = ?chunk, "terminating instances");
            let res = client
                .terminate_instances()
                .set_instance_ids(Some(chunk.to_vec()))
                .send()
                .await;
            let Err(e) = res else { continue };
            let f = Failure::from_sdk(OP, e);
            if f.code != "InvalidInstanceID.NotFound" || chunk.len() == 1 {
                if f.code == "InvalidInstanceID.NotFound" {
                    continue;
                }
                return Err(f.into_port(SERVICE, Call::Retryable));
            }
            // One unknown id fails the whole call: terminate one by one, skipping the gone.
            for id in chunk {
                if let Err(e) = client.terminate_instances().instance_ids(id).send().await {
                    let f = Failure::from_sdk(OP, e);
                    if f.code != "InvalidInstanceID.NotFound" {
                        return Err(f.into_port(SERVICE, Call::Retryable));
                    }
                }
            }
        }
        Ok(())
    }

    /// CreateTags on instances; one that is gone (`InvalidInstanceID.NotFound`) is skipped.
    pub async fn tag_instances(
        &self,
        region: &str,
        instance_ids: &[String],
        tags: &BTreeMap<String, String>,
    ) -> Result<(), PortError> {
        const OP: &str = "CreateTags";
        let client = self.client(region);
        let tags: Vec<Tag> = tags
            .iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        for chunk in instance_ids.chunks(TERMINATE_BATCH) {
            tracing::info!(region, instance_ids = ?chunk, "tagging instances");
            let res = client
                .create_tags()
                .set_resources(Some(chunk.to_vec()))
                .set_tags(Some(tags.clone()))
                .send()
                .await;
            let Err(e) = res else { continue };
            let f = Failure::from_sdk(OP, e);
            if f.code != "InvalidInstanceID.NotFound" {
                return Err(f.into_port(SERVICE, Call::Retryable));
            }
            // One unknown id fails the whole call: tag one by one, skipping the gone.
            for id in chunk {
                let res = client
                    .create_tags()
                    .resources(id)
                    .set_tags(Some(tags.clone()))
                    .send()
                    .await;
                if let Err(e) = res {
                    let f = Failure::from_sdk(OP, e);
                    if f.code != "InvalidInstanceID.NotFound" {
                        return Err(f.into_port(SERVICE, Call::Retryable));
                    }
                }
            }
        }
        Ok(())
    }

    /// The first of `subnet_ids` (in the caller's order) in `availability_zone`.
    pub async fn subnet_in_zone(
        &self,
        region: &str,
        subnet_ids: &[String],
        availability_zone: &str,
    ) -> Result<Option<String>, PortError> {
        Ok(self
            .subnet_zones(region, subnet_ids)
            .await?
            .into_iter()
            .find(|(_, zone)| zone == availability_zone)
            .map(|(id, _)| id))
    }

    /// Those of `subnet_ids` in `region`, in their order, with their zones: a filter, so ids
    /// of other regions are simply not found.
    pub async fn subnet_zones(
        &self,
        region: &str,
        subnet_ids: &[String],
    ) -> Result<Vec<(String, String)>, PortError> {
        const OP: &str = "DescribeSubnets";
        if subnet_ids.is_empty() {
            return Ok(vec![]);
        }
        let mut pages = self
            .client(region)
            .describe_subnets()
            .filters(
                Filter::builder()
                    .name("subnet-id")
                    .set_values(Some(subnet_ids.to_vec()))
                    .build(),
            )
            .into_paginator()
            .items()
            .send();
        let mut zones = std::collections::BTreeMap::new();
        while let Some(s) = pages.next().await {
            let s = s.map_err(err(OP, Call::Retryable))?;
            if let (Some(id), Some(zone)) = (s.subnet_id(), s.availability_zone()) {
                zones.insert(id.to_string(), zone.to_string());
            }
        }
        Ok(subnet_ids
            .iter()
            .filter_map(|id| zones.get(id).map(|z| (id.clone(), z.clone())))
            .collect())
    }
}

/// Forbids the SDK's retry of a launch that found no capacity (see `launch_instances`).
#[derive(Debug)]
struct NoCapacityIsFinal;

impl aws_sdk_ec2::config::retry::ClassifyRetry for NoCapacityIsFinal {
    fn classify_retry(
        &self,
        ctx: &aws_sdk_ec2::config::interceptors::InterceptorContext,
    ) -> aws_sdk_ec2::config::retry::RetryAction {
        use aws_sdk_ec2::error::ProvideErrorMetadata;
        let code = ctx
            .output_or_error()
            .and_then(Result::err)
            .and_then(|e| e.as_operation_error())
            .and_then(|e| {
                e.downcast_ref::<aws_sdk_ec2::operation::run_instances::RunInstancesError>()
            })
            .and_then(|e| e.code());
        match code {
            Some("InsufficientInstanceCapacity") => {
                aws_sdk_ec2::config::retry::RetryAction::RetryForbidden
            }
            _ => aws_sdk_ec2::config::retry::RetryAction::NoActionIndicated,
        }
    }

    fn name(&self) -> &'static str {
        "no retry of a launch without capacity"
    }
}

/// A launch template's network interface as a RunInstances override in `subnet_id`. An
/// override replaces the template's whole list (aws-reference §11.1), so whatever the
/// template's interface says and is not copied here is lost silently: ENA Express off, other
/// connection-tracking timeouts, no delegated prefixes (issue 50, review Task 3 #9). So every
/// member of `InstanceNetworkInterfaceSpecification` the template type also has is copied; the
/// subnet is ours. Not copied: a fixed `NetworkInterfaceId` or private address (one instance
/// only can have them, and they belong to the template's subnet, not ours) and
/// `Ipv6Addresses` (fixed addresses, likewise).
fn with_subnet(
    i: &LaunchTemplateInstanceNetworkInterfaceSpecification,
    subnet_id: &str,
) -> InstanceNetworkInterfaceSpecification {
    let ipv4_prefixes = i
        .ipv4_prefixes()
        .iter()
        .map(|p| {
            Ipv4PrefixSpecificationRequest::builder()
                .set_ipv4_prefix(p.ipv4_prefix().map(str::to_string))
                .build()
        })
        .collect::<Vec<_>>();
    let ipv6_prefixes = i
        .ipv6_prefixes()
        .iter()
        .map(|p| {
            Ipv6PrefixSpecificationRequest::builder()
                .set_ipv6_prefix(p.ipv6_prefix().map(str::to_string))
                .build()
        })
        .collect::<Vec<_>>();
    let ena_srd = i.ena_srd_specification().map(|e| {
        EnaSrdSpecificationRequest::builder()
            .set_ena_srd_enabled(e.ena_srd_enabled())
            .set_ena_srd_udp_specification(e.ena_srd_udp_specification().map(|u| {
                EnaSrdUdpSpecificationRequest::builder()
                    .set_ena_srd_udp_enabled(u.ena_srd_udp_enabled())
                    .build()
            }))
            .build()
    });
    let tracking = i.connection_tracking_specification().map(|c| {
        ConnectionTrackingSpecificationRequest::builder()
            .set_tcp_established_timeout(c.tcp_established_timeout())
            .set_udp_stream_timeout(c.udp_stream_timeout())
            .set_udp_timeout(c.udp_timeout())
            .build()
    });
    InstanceNetworkInterfaceSpecification::builder()
        .set_device_index(i.device_index())
        .set_network_card_index(i.network_card_index())
        .set_interface_type(i.interface_type().map(str::to_string))
        .set_groups((!i.groups().is_empty()).then(|| i.groups().to_vec()))
        .set_delete_on_termination(i.delete_on_termination())
        .set_associate_public_ip_address(i.associate_public_ip_address())
        .set_associate_carrier_ip_address(i.associate_carrier_ip_address())
        .set_description(i.description().map(str::to_string))
        .set_secondary_private_ip_address_count(i.secondary_private_ip_address_count())
        .set_ipv6_address_count(i.ipv6_address_count())
        .set_primary_ipv6(i.primary_ipv6())
        .set_ipv4_prefix_count(i.ipv4_prefix_count())
        .set_ipv4_prefixes((!ipv4_prefixes.is_empty()).then_some(ipv4_prefixes))
        .set_ipv6_prefix_count(i.ipv6_prefix_count())
        .set_ipv6_prefixes((!ipv6_prefixes.is_empty()).then_some(ipv6_prefixes))
        .set_ena_srd_specification(ena_srd)
        .set_connection_tracking_specification(tracking)
        .set_ena_queue_count(i.ena_queue_count())
        .subnet_id(subnet_id)
        .build()
}

fn instance_info(
    region: &str,
    i: &Instance,
    health: InstanceHealth,
) -> Result<InstanceInfo, PortError> {
    const OP: &str = "DescribeInstances";
    let id = i
        .instance_id()
        .ok_or_else(|| malformed(SERVICE, OP, "an instance has no id"))?;
    let state_name = i
        .state()
        .and_then(|s| s.name())
        .map(|n| n.as_str())
        .unwrap_or_default();
    let state = instance_state(state_name).ok_or_else(|| {
        malformed(
            SERVICE,
            OP,
            format!("instance {id} has state {state_name:?}"),
        )
    })?;
    Ok(InstanceInfo {
        instance_id: id.to_string(),
        region: region.to_string(),
        availability_zone: i
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_string(),
        instance_type: i
            .instance_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        state,
        health,
        reservation_id: i.capacity_reservation_id().map(str::to_string),
        launched_at: i.launch_time().and_then(to_chrono),
        tags: tags_of(i.tags()),
        scheduled: Vec::new(),
    })
}
