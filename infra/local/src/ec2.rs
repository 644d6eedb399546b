//! EC2 as the capacity-pilot functions use it: Capacity Block offerings, purchases, extensions and
//! their reservation lifecycle; a seeded VPC and launch templates; instances launched into blocks,
//! on-demand or spot, with `ClientToken` idempotency, status checks and the events AWS emits.
//! Handlers return the children of `<OpResponse>`; the protocol layer wraps them.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, TimeDelta, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::market::{BlockOffering, BlockSearch, Pool, valid_block_hours};
use crate::query::{Query, filter_matches};
use crate::util::{ec2_time, hex_id};
use crate::world::{Action, PAYMENT_LEAD_MINUTES, REQUEST_TAG, RefusalCode, RefusalMarket, World};
use crate::xml::{El, el, set};

/// The platforms a Capacity Block can be bought for.
pub const BLOCK_PLATFORMS: [&str; 5] = [
    "Linux/UNIX",
    "Red Hat Enterprise Linux",
    "RHEL with HA",
    "SUSE Linux",
    "Ubuntu Pro",
];

/// The tag EC2 puts on a Capacity Block's reservation with the count it will have once
/// active; the reservation's totals read 0 until then.
pub const INCREMENTAL_QUANTITY_TAG: &str =
    "aws:ec2capacityreservation:incrementalRequestedQuantity";

/// Whether a block's reservation is still waiting for its payment: `pending` (how a fresh
/// block has been seen, aws-reference §11.1 States) or `payment-pending` (the documented
/// machine, §2.1); both end in `scheduled` or `payment-failed`.
pub fn awaiting_payment(state: &str) -> bool {
    state == "pending" || state == "payment-pending"
}

/// The block resource's state for a reservation's: its enum (aws-reference §11.1 States) has
/// no `pending`, so a block whose reservation is `pending` reads `payment-pending`.
pub fn block_state(reservation_state: &str) -> &str {
    if reservation_state == "pending" {
        "payment-pending"
    } else {
        reservation_state
    }
}

/// A purchased Capacity Block, seen by EC2 as a targeted Capacity Reservation.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityReservation {
    pub id: String,
    pub block_id: String,
    pub region: String,
    pub availability_zone: String,
    pub instance_type: String,
    pub platform: String,
    pub count: i64,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub created: DateTime<Utc>,
    pub state: String,
    pub tags: BTreeMap<String, String>,
    pub offering_id: String,
    pub upfront_fee: Decimal,
    pub ultraserver: bool,
    pub fail_payment: bool,
    pub extensions: Vec<Extension>,
}

/// A purchased extension of a block.
#[derive(Debug, Clone, Serialize)]
pub struct Extension {
    pub offering_id: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub hours: i64,
    pub status: String,
    pub purchased: DateTime<Utc>,
    pub upfront_fee: Decimal,
    /// When its payment succeeded (the block's end moved then).
    pub paid_at: Option<DateTime<Utc>>,
    /// Bought by hand (the console: [`World::extend_block`]), not through the API by the
    /// product.
    pub by_hand: bool,
    /// Its payment fails at its payment time ([`World::extension_payment`]).
    pub fail_payment: bool,
}

/// A Capacity Block extension offering.
#[derive(Debug, Clone, Serialize)]
pub struct ExtensionOffering {
    pub id: String,
    pub cr: String,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub hours: i64,
    pub upfront_fee: Decimal,
}

/// How an instance is paid for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Lifecycle {
    OnDemand,
    Spot,
    CapacityBlock,
}

/// An EC2 instance.
#[derive(Debug, Clone, Serialize)]
pub struct Instance {
    pub id: String,
    pub region: String,
    pub availability_zone: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub instance_type: String,
    pub image_id: String,
    pub state: String,
    pub launch_time: DateTime<Utc>,
    pub reservation_id: String,
    pub client_token: String,
    pub lifecycle: Lifecycle,
    pub capacity_reservation_id: Option<String>,
    pub capacity_block_id: Option<String>,
    pub tags: BTreeMap<String, String>,
    pub terminated_at: Option<DateTime<Utc>>,
    pub slot_released: bool,
    pub impaired: bool,
    pub state_reason: Option<(String, String)>,
    pub scheduled_events: Vec<ScheduledEvent>,
    pub launch_index: i64,
    /// The interfaces it was launched with (from the template or `NetworkInterface.N`); empty
    /// for a launch without any.
    pub network_interfaces: Vec<AttachedInterface>,
}

/// A network interface of a launch template or of a RunInstances `NetworkInterface.N`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetworkInterface {
    pub network_card_index: i64,
    pub device_index: i64,
    /// `efa`, `efa-only`, `interface`; absent: a plain ENA interface (`interface`).
    pub interface_type: Option<String>,
    pub groups: Vec<String>,
    pub delete_on_termination: Option<bool>,
    pub subnet_id: Option<String>,
    pub associate_public_ip_address: Option<bool>,
}

impl NetworkInterface {
    /// The interface type as EC2 reports it.
    pub fn kind(&self) -> &str {
        self.interface_type.as_deref().unwrap_or("interface")
    }

    fn describe(&self) -> String {
        format!(
            "NetworkCardIndex {} DeviceIndex {} (InterfaceType {})",
            self.network_card_index,
            self.device_index,
            self.kind()
        )
    }
}

/// An interface attached to a launched instance.
#[derive(Debug, Clone, Serialize)]
pub struct AttachedInterface {
    pub id: String,
    pub attachment_id: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub network_card_index: i64,
    pub device_index: i64,
    pub interface_type: String,
    pub groups: Vec<String>,
    pub delete_on_termination: bool,
}

/// A scheduled event on an instance (`DescribeInstanceStatus` `eventsSet`).
#[derive(Debug, Clone, Serialize)]
pub struct ScheduledEvent {
    pub id: String,
    pub code: String,
    pub description: String,
    pub not_before: DateTime<Utc>,
    pub not_after: DateTime<Utc>,
}

/// One `RunInstances` call's result.
#[derive(Debug, Clone, Serialize)]
pub struct Launch {
    pub region: String,
    pub instance_ids: Vec<String>,
}

/// All EC2 resources.
#[derive(Debug, Default)]
pub struct Ec2State {
    pub reservations: BTreeMap<String, CapacityReservation>,
    pub instances: BTreeMap<String, Instance>,
    pub launches: BTreeMap<String, Launch>,
    pub client_tokens: HashMap<(String, String), (String, String)>,
    pub offerings: HashMap<String, BlockOffering>,
    /// Every `DescribeCapacityBlockOfferings` answer, in order: when, and the offering ids
    /// returned (what the runner checks a purchase's choice against).
    pub offered: Vec<(DateTime<Utc>, Vec<String>)>,
    /// The describe limit's bucket per region: tokens left and when last refilled.
    pub describe_tokens: HashMap<String, (u32, DateTime<Utc>)>,
    pub consumed_offerings: HashSet<String>,
    pub extension_offerings: HashMap<String, ExtensionOffering>,
}

impl Ec2State {
    pub fn snapshot(&self) -> Value {
        json!({
            "capacity_reservations": self.reservations.values().collect::<Vec<_>>(),
            "instances": self.instances.values().collect::<Vec<_>>(),
        })
    }
}

/// A subnet of the seeded VPC.
#[derive(Debug, Clone)]
pub struct Subnet {
    pub id: String,
    pub vpc_id: String,
    pub availability_zone: String,
    pub cidr: String,
    /// The zone's default subnet (the first of the zone).
    pub default_for_az: bool,
    /// Private IPv4 addresses instances can take: the CIDR's, less the five AWS reserves
    /// ("The first four IP addresses and the last IP address in each subnet CIDR block are
    /// not available for your use", VPC User Guide, subnet sizing).
    pub usable_addresses: i64,
}

/// A seeded launch template (one version, `1`, the default and the latest).
#[derive(Debug, Clone)]
pub struct LaunchTemplate {
    pub id: String,
    pub name: &'static str,
    pub image_id: String,
    pub instance_type: Option<&'static str>,
    pub network_interfaces: Vec<NetworkInterface>,
}

/// The seeded EFA template: how many network cards its interfaces span (one EFA interface
/// on each, as p5.48xlarge-class launches need several).
pub const EFA_TEMPLATE_CARDS: i64 = 4;

const STATE_CODES: [(&str, i64); 6] = [
    ("pending", 0),
    ("running", 16),
    ("shutting-down", 32),
    ("terminated", 48),
    ("stopping", 64),
    ("stopped", 80),
];

fn state_code(name: &str) -> i64 {
    STATE_CODES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, c)| *c)
}

fn state_el(name: &str, tag: &str) -> El {
    el(name).v("code", state_code(tag)).v("name", tag)
}

fn dry_run(q: &Query) -> Result<(), ApiError> {
    if q.bool("DryRun") {
        return Err(ApiError::ec2(
            412,
            "DryRunOperation",
            "Request would have succeeded, but DryRun flag is set.",
        ));
    }
    Ok(())
}

/// Offset pagination with opaque tokens, as EC2's describe calls page.
pub fn paginate<T>(
    items: Vec<T>,
    max: Option<i64>,
    token: Option<&str>,
    (min_max, max_max): (i64, i64),
) -> Result<(Vec<T>, Option<String>), ApiError> {
    let start = match token {
        None => 0,
        Some(t) => t
            .strip_prefix("lc1-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n <= items.len())
            .ok_or_else(|| {
                ApiError::ec2(
                    400,
                    "InvalidPaginationToken",
                    format!("Invalid pagination token: {t}"),
                )
            })?,
    };
    let size = match max {
        None => usize::MAX,
        Some(m) if m < min_max || m > max_max => {
            return Err(ApiError::invalid(format!(
                "Value ({m}) for parameter maxResults is invalid. Expecting a value between {min_max} and {max_max}."
            )));
        }
        Some(m) => m as usize,
    };
    let total = items.len();
    let page: Vec<T> = items.into_iter().skip(start).take(size).collect();
    let next = (start + page.len() < total).then(|| format!("lc1-{}", start + page.len()));
    Ok((page, next))
}

impl World {
    /// The seeded VPC's subnets in a region: [`Settings::subnets_per_zone`] per zone (zone by
    /// zone, the default subnet first), /20 unless [`Settings::subnet_sizes`] says otherwise.
    ///
    /// [`Settings::subnets_per_zone`]: crate::world::Settings::subnets_per_zone
    /// [`Settings::subnet_sizes`]: crate::world::Settings::subnet_sizes
    pub fn subnets(&self, region: &str) -> Vec<Subnet> {
        let seed = self.market.seed.to_string();
        let vpc_id = hex_id("vpc-", &[&seed, region]);
        let mut out = Vec::new();
        for (i, az) in self.market.region(region).azs.iter().enumerate() {
            for n in 0..self.settings.subnets_per_zone.max(1) {
                let prefix = self
                    .settings
                    .subnet_sizes
                    .iter()
                    .find(|s| {
                        s.region == region
                            && s.zone.as_ref().is_none_or(|z| z == az)
                            && s.index.is_none_or(|x| x == n)
                    })
                    .map_or(20, |s| s.prefix_length.clamp(16, 28));
                out.push(Subnet {
                    // the zone's first subnet keeps the id it had when there was one per zone
                    id: match n {
                        0 => hex_id("subnet-", &[&seed, region, az]),
                        _ => hex_id("subnet-", &[&seed, region, az, &n.to_string()]),
                    },
                    vpc_id: vpc_id.clone(),
                    availability_zone: az.clone(),
                    cidr: format!("10.{n}.{}.0/{prefix}", i * 16),
                    default_for_az: n == 0,
                    usable_addresses: (1_i64 << (32 - prefix)) - 5,
                });
            }
        }
        out
    }

    /// Private addresses of `subnet_id` held by instances: one per network interface (the
    /// primary's only, for an instance launched without interfaces), from the launch until
    /// the instance is `terminated` (its interfaces are deleted then; a `shutting-down`
    /// instance still holds them). EFA interfaces take one each (review Task 3 #2).
    pub fn subnet_addresses_used(&self, region: &str, subnet_id: &str) -> i64 {
        self.ec2
            .instances
            .values()
            .filter(|i| i.region == region && i.state != "terminated")
            .map(|i| {
                if i.network_interfaces.is_empty() {
                    i64::from(i.subnet_id == subnet_id)
                } else {
                    i.network_interfaces
                        .iter()
                        .filter(|n| n.subnet_id == subnet_id)
                        .count() as i64
                }
            })
            .sum()
    }

    /// `availableIpAddressCount` of a subnet: its usable addresses less those held.
    pub fn subnet_addresses_free(&self, region: &str, subnet: &Subnet) -> i64 {
        (subnet.usable_addresses - self.subnet_addresses_used(region, &subnet.id)).max(0)
    }

    /// The seeded VPC's security group in a region (the one the EFA template's interfaces use).
    pub fn security_group(&self, region: &str) -> String {
        hex_id("sg-", &[&self.market.seed.to_string(), region])
    }

    /// The seeded launch templates in a region: `capacity-pilot-gpu` (no instance type),
    /// `capacity-pilot-cpu` (`m5.large`), and `capacity-pilot-efa` (no instance type, no subnet,
    /// [`EFA_TEMPLATE_CARDS`] EFA interfaces: card 0 device 0, cards 1.. device 1, each in the
    /// seeded security group, deleted on termination).
    pub fn launch_templates(&self, region: &str) -> Vec<LaunchTemplate> {
        let seed = self.market.seed.to_string();
        let sg = self.security_group(region);
        let efa: Vec<NetworkInterface> = (0..EFA_TEMPLATE_CARDS)
            .map(|card| NetworkInterface {
                network_card_index: card,
                device_index: i64::from(card > 0),
                interface_type: Some("efa".to_string()),
                groups: vec![sg.clone()],
                delete_on_termination: Some(true),
                subnet_id: None,
                associate_public_ip_address: None,
            })
            .collect();
        [
            ("capacity-pilot-gpu", None, Vec::new()),
            ("capacity-pilot-cpu", Some("m5.large"), Vec::new()),
            ("capacity-pilot-efa", None, efa),
        ]
        .into_iter()
        .map(|(name, ty, network_interfaces)| LaunchTemplate {
            id: hex_id("lt-", &[&seed, region, name]),
            name,
            image_id: hex_id("ami-", &[&seed, region, name]),
            instance_type: ty,
            network_interfaces,
        })
        .collect()
    }

    /// The template a request names by id (preferred) or name, if it names one.
    fn find_template(
        &self,
        region: &str,
        id: Option<&str>,
        name: Option<&str>,
    ) -> Result<Option<LaunchTemplate>, ApiError> {
        let all = self.launch_templates(region);
        match (id, name) {
            (None, None) => Ok(None),
            (Some(id), _) => all.into_iter().find(|t| t.id == id).map(Some).ok_or_else(|| {
                ApiError::ec2(
                    400,
                    "InvalidLaunchTemplateId.NotFound",
                    format!(
                        "The specified launch template, with template ID {id}, does not exist."
                    ),
                )
            }),
            (None, Some(name)) => {
                all.into_iter()
                    .find(|t| t.name == name)
                    .map(Some)
                    .ok_or_else(|| {
                        ApiError::ec2(
                            400,
                            "InvalidLaunchTemplateName.NotFoundException",
                            format!(
                                "The specified launch template, with template name {name}, does not exist."
                            ),
                        )
                    })
            }
        }
    }

    fn describe_launch_template_versions(
        &mut self,
        region: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        dry_run(q)?;
        let versions = q.list("LaunchTemplateVersion");
        let templates = match self.find_template(
            region,
            q.get("LaunchTemplateId"),
            q.get("LaunchTemplateName"),
        )? {
            Some(t) => {
                if let Some(v) = versions
                    .iter()
                    .find(|v| !matches!(v.as_str(), "$Latest" | "$Default" | "1"))
                {
                    return Err(ApiError::ec2(
                        400,
                        "InvalidLaunchTemplateId.VersionNotFound",
                        format!(
                            "Could not find the specified version {v} for the launch template with ID {}.",
                            t.id
                        ),
                    ));
                }
                vec![t]
            }
            None => {
                if versions.is_empty()
                    || versions
                        .iter()
                        .any(|v| !matches!(v.as_str(), "$Latest" | "$Default"))
                {
                    return Err(ApiError::ec2(
                        400,
                        "MissingParameter",
                        "To describe the launch template data for all your launch templates, for \
                         'Versions' specify '$Latest', '$Default', or both, and omit \
                         'LaunchTemplateId', 'LaunchTemplateName', and version numbers in \
                         'Versions'.",
                    ));
                }
                self.launch_templates(region)
            }
        };
        let in_range = q.int("MinVersion")?.is_none_or(|m| m <= 1)
            && q.int("MaxVersion")?.is_none_or(|m| m >= 1);
        let filters = q.filters();
        let items: Vec<El> = templates
            .iter()
            .filter(|_| in_range)
            .filter(|t| {
                filters.iter().all(|f| match f.name.as_str() {
                    "is-default-version" => filter_matches(&f.values, "true"),
                    "image-id" => filter_matches(&f.values, &t.image_id),
                    "instance-type" => t
                        .instance_type
                        .is_some_and(|ty| filter_matches(&f.values, ty)),
                    _ => false,
                })
            })
            .map(|t| {
                let mut data = el("launchTemplateData")
                    .v("imageId", &t.image_id)
                    .opt("instanceType", t.instance_type);
                if !t.network_interfaces.is_empty() {
                    data = data.list(
                        "networkInterfaceSet",
                        t.network_interfaces.iter().map(template_interface_el),
                    );
                }
                el("item")
                    .v("launchTemplateId", &t.id)
                    .v("launchTemplateName", t.name)
                    .v("versionNumber", 1)
                    .v(
                        "createdBy",
                        format!("arn:aws:iam::{}:root", self.settings.account_id),
                    )
                    .v("defaultVersion", true)
                    .child(data)
            })
            .collect();
        let (page, next) = paginate(items, q.int("MaxResults")?, q.get("NextToken"), (1, 200))?;
        let mut out = vec![set("launchTemplateVersionSet", page)];
        if let Some(n) = next {
            out.push(El::leaf("nextToken", n));
        }
        Ok(out)
    }

    /// Routes one EC2 action.
    pub fn ec2_call(&mut self, region: &str, op: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        self.settle();
        match op {
            "DescribeCapacityBlockOfferings" => self.describe_block_offerings(region, q),
            "PurchaseCapacityBlock" => self.purchase_block(region, q),
            "DescribeCapacityReservations" => self.describe_reservations(region, q),
            "DescribeCapacityBlocks" => self.describe_blocks(region, q),
            "DescribeCapacityBlockExtensionOfferings" => {
                self.describe_extension_offerings(region, q)
            }
            "PurchaseCapacityBlockExtension" => self.purchase_extension(region, q),
            "DescribeCapacityBlockExtensionHistory" => self.describe_extension_history(region, q),
            "DescribeSubnets" => self.describe_subnets(region, q),
            "DescribeLaunchTemplateVersions" => self.describe_launch_template_versions(region, q),
            "RunInstances" => self.run_instances(region, q),
            "DescribeInstances" => self.describe_instances(region, q),
            "DescribeInstanceStatus" => self.describe_instance_status(region, q),
            "TerminateInstances" => self.terminate_instances(region, q),
            "CreateTags" => self.create_tags(region, q),
            other => Err(ApiError::ec2(
                400,
                "InvalidAction",
                format!("The action {other} is not valid for this web service."),
            )),
        }
    }

    /// aws-reference §11.1: `CapacityBlockDescribeLimitExceeded` is an account limit, both
    /// for a family without Capacity Block quota and for bursts of calls (a bucket per
    /// account and region, [`crate::world::Settings::describe_limit_burst`]).
    fn describe_limit(&mut self, region: &str, instance_type: &str) -> Result<(), ApiError> {
        const CODE: &str = "CapacityBlockDescribeLimitExceeded";
        let burst = self.settings.describe_limit_burst;
        if burst > 0 {
            let every = self.settings.describe_limit_refill_seconds.max(1);
            let now = self.now;
            let (tokens, at) = self
                .ec2
                .describe_tokens
                .entry(region.to_string())
                .or_insert((burst, now));
            let refills = (now - *at).num_seconds().max(0) / every;
            if refills > 0 {
                *tokens =
                    burst.min(tokens.saturating_add(u32::try_from(refills).unwrap_or(u32::MAX)));
                *at += TimeDelta::seconds(refills * every);
            }
            if *tokens == 0 {
                return Err(ApiError::new(
                    400,
                    CODE,
                    "You've reached the limit for this account. Try again later.",
                ));
            }
            *tokens -= 1;
        }
        let family = instance_type.split('.').next().unwrap_or(instance_type);
        if self
            .settings
            .no_block_quota
            .iter()
            .any(|(f, r)| f == family && r == region)
        {
            return Err(ApiError::new(
                400,
                CODE,
                "Your existing service limits for this AWS account are not sufficient to use \
                 EC2 Capacity Blocks",
            ));
        }
        Ok(())
    }

    fn describe_block_offerings(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        dry_run(q)?;
        self.describe_limit(region, q.get("InstanceType").unwrap_or_default())?;
        let search = BlockSearch {
            region: region.to_string(),
            instance_type: q.req("InstanceType")?.to_string(),
            instance_count: q.req_int("InstanceCount")?,
            duration_hours: q.req_int("CapacityDurationHours")?,
            start_range: q.time("StartDateRange")?,
            end_range: q.time("EndDateRange")?,
        };
        let offerings = self.market.search_blocks(self.now, &search)?;
        for o in &offerings {
            self.ec2.offerings.insert(o.id.clone(), o.clone());
        }
        self.ec2
            .offered
            .push((self.now, offerings.iter().map(|o| o.id.clone()).collect()));
        let (page, next) = paginate(
            offerings,
            q.int("MaxResults")?,
            q.get("NextToken"),
            (1, 1000),
        )?;
        let items = page.iter().map(|o| {
            el("item")
                .v("capacityBlockOfferingId", &o.id)
                .v("instanceType", &o.instance_type)
                .v("availabilityZone", &o.availability_zone)
                .v("instanceCount", o.instance_count)
                .v("startDate", ec2_time(o.start))
                .v("endDate", ec2_time(o.end))
                .v("capacityBlockDurationHours", o.duration_hours())
                .v("capacityBlockDurationMinutes", o.duration_minutes())
                .v("upfrontFee", o.upfront_fee)
                .v("currencyCode", "USD")
                .v("tenancy", "default")
        });
        let mut out = vec![set("capacityBlockOfferingSet", items)];
        if let Some(n) = next {
            out.push(El::leaf("nextToken", n));
        }
        Ok(out)
    }

    fn purchase_block(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        let offering_id = q.req("CapacityBlockOfferingId")?.to_string();
        let platform = q.req("InstancePlatform")?.to_string();
        if !BLOCK_PLATFORMS.contains(&platform.as_str()) {
            return Err(ApiError::invalid(format!(
                "Value ({platform}) for parameter InstancePlatform is invalid."
            )));
        }
        if !offering_id.starts_with("cb-") || offering_id.len() != 20 {
            return Err(ApiError::ec2(
                400,
                "InvalidCapacityBlockOfferingIdMalformed",
                format!("The Capacity Block offering ID '{offering_id}' is malformed."),
            ));
        }
        let offering = self
            .ec2
            .offerings
            .get(&offering_id)
            .filter(|o| o.region == region)
            .cloned()
            .ok_or_else(|| {
                ApiError::ec2(
                    400,
                    "InvalidCapacityBlockOfferingIdNotFound",
                    format!("The Capacity Block offering ID '{offering_id}' does not exist."),
                )
            })?;
        let expired = || {
            ApiError::ec2(
                400,
                "InvalidCapacityBlockOfferingIdExpired",
                format!("The Capacity Block offering ID '{offering_id}' has expired."),
            )
        };
        if (self.settings.single_use_offerings
            && self.ec2.consumed_offerings.contains(&offering_id))
            || offering.start <= self.now
        {
            return Err(expired());
        }
        let free = self.market.free_between(
            Pool::CapacityBlock,
            region,
            &offering.availability_zone,
            &offering.instance_type,
            offering.start,
            offering.end,
        );
        if i64::from(free) < offering.instance_count {
            return Err(expired());
        }
        dry_run(q)?;
        self.check_block_limit(&offering)?;
        let mut tags = q.tag_specs("capacity-reservation")?;
        // Before a block is active its totals read zero; EC2 tags the count it will have
        // (aws-reference §11.1, "View Capacity Blocks").
        tags.insert(
            INCREMENTAL_QUANTITY_TAG.to_string(),
            offering.instance_count.to_string(),
        );
        self.market.consume(
            Pool::CapacityBlock,
            region,
            &offering.availability_zone,
            &offering.instance_type,
            (offering.start, offering.end),
            offering.instance_count,
        );
        self.ec2.consumed_offerings.insert(offering_id.clone());
        let id = self.next_id("cr-");
        let block_id = self.next_id("cb-");
        let ultraserver = self
            .market
            .type_spec(&offering.instance_type)
            .is_some_and(|s| s.ultraserver);
        let cr = CapacityReservation {
            id: id.clone(),
            block_id,
            region: region.to_string(),
            availability_zone: offering.availability_zone.clone(),
            instance_type: offering.instance_type.clone(),
            platform,
            count: offering.instance_count,
            start: offering.start,
            end: offering.end,
            created: self.now,
            state: self.settings.block_initial_state.as_str().to_string(),
            fail_payment: self.take_payment_failure(tags.get(REQUEST_TAG).map(String::as_str)),
            tags,
            offering_id,
            upfront_fee: offering.upfront_fee,
            ultraserver,
            extensions: Vec::new(),
        };
        tracing::info!(capacity_reservation_id = %id, upfront_fee = %cr.upfront_fee, "capacity block purchased");
        let pay_at = self.payment_time(cr.start - TimeDelta::minutes(PAYMENT_LEAD_MINUTES));
        self.ec2.reservations.insert(id.clone(), cr);
        self.schedule(pay_at, Action::BlockPayment(id.clone()));
        let cr = &self.ec2.reservations[&id];
        Ok(vec![
            self.reservation_el(cr).rename("capacityReservation"),
            set("capacityBlockSet", [self.block_el(cr)]),
        ])
    }

    /// Refuses a purchase that would take the account past [`Settings::max_block_instances`]
    /// instances across Capacity Blocks over the offering's window. Counted: every live block
    /// (`pending`, `payment-pending`, `scheduled`, `active`; a block not yet paid by the count
    /// it was bought with) in any region whose window, a `payment-pending` extension included,
    /// overlaps the offering's. Account-wide and the sum over the window rather than the peak:
    /// the sources say neither, so the harsher reading. The code is unpublished
    /// ([`Settings::block_limit_code`]); the message names the limit.
    ///
    /// [`Settings::max_block_instances`]: crate::world::Settings::max_block_instances
    /// [`Settings::block_limit_code`]: crate::world::Settings::block_limit_code
    fn check_block_limit(&self, offering: &BlockOffering) -> Result<(), ApiError> {
        let max = self.settings.max_block_instances;
        let held: i64 = self
            .ec2
            .reservations
            .values()
            .filter(|cr| {
                awaiting_payment(&cr.state) || cr.state == "scheduled" || cr.state == "active"
            })
            .filter(|cr| {
                let end = cr
                    .extensions
                    .iter()
                    .filter(|e| e.status == "payment-pending")
                    .map(|e| e.end)
                    .fold(cr.end, DateTime::max);
                cr.start < offering.end && offering.start < end
            })
            .map(|cr| cr.count)
            .sum();
        let total = held + offering.instance_count;
        if total > max {
            return Err(ApiError::ec2(
                400,
                &self.settings.block_limit_code,
                format!(
                    "You can have up to {max} instances across Capacity Blocks; this purchase of {} would make {total} over the block's window ({} to {}).",
                    offering.instance_count,
                    ec2_time(offering.start),
                    ec2_time(offering.end),
                ),
            ));
        }
        Ok(())
    }

    fn reservation_el(&self, cr: &CapacityReservation) -> El {
        let available = if cr.state == "active" {
            (cr.count - self.holding(|i| i.capacity_reservation_id.as_deref() == Some(&cr.id)))
                .max(0)
        } else {
            0
        };
        el("item")
            .v("capacityReservationId", &cr.id)
            .v("ownerId", &self.settings.account_id)
            .v(
                "capacityReservationArn",
                self.arn(
                    "ec2",
                    &cr.region,
                    &format!("capacity-reservation/{}", cr.id),
                ),
            )
            .v("instanceType", &cr.instance_type)
            .v("instancePlatform", &cr.platform)
            .v("availabilityZone", &cr.availability_zone)
            .v("tenancy", "default")
            // "Before a Capacity Block reservation begins, the available capacity appears as
            // zero" (aws-reference §11.1): the total reads 0 until the block is active.
            .v(
                "totalInstanceCount",
                if cr.state == "active" { cr.count } else { 0 },
            )
            .v("availableInstanceCount", available)
            .v("ebsOptimized", true)
            .v("ephemeralStorage", false)
            .v("state", &cr.state)
            .v("startDate", ec2_time(cr.start))
            .v("endDate", ec2_time(cr.end))
            .v("endDateType", "limited")
            .v("instanceMatchCriteria", "targeted")
            .v("createDate", ec2_time(cr.created))
            .v("reservationType", "capacity-block")
            .v("capacityBlockId", &cr.block_id)
            .tags(cr.tags.iter())
    }

    fn block_el(&self, cr: &CapacityReservation) -> El {
        let mut e = el("item").v("capacityBlockId", &cr.block_id);
        // The block, not its reservation, says it is an UltraServer's: the reservation's
        // instanceType is the instance's (REALISM.md, "UltraServer blocks").
        if cr.ultraserver {
            e = e.v("ultraserverType", ultraserver_type(&cr.instance_type));
        }
        e.v("availabilityZone", &cr.availability_zone)
            .list("capacityReservationIdSet", [El::leaf("item", &cr.id)])
            .v("startDate", ec2_time(cr.start))
            .v("endDate", ec2_time(cr.end))
            .v("createDate", ec2_time(cr.created))
            .v("state", block_state(&cr.state))
            .tags(cr.tags.iter())
    }

    /// How many instances matching `f` hold a slot (not yet returned after termination).
    fn holding(&self, f: impl Fn(&Instance) -> bool) -> i64 {
        self.ec2
            .instances
            .values()
            .filter(|i| !i.slot_released && f(i))
            .count() as i64
    }

    fn describe_reservations(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        dry_run(q)?;
        let ids = q.list("CapacityReservationId");
        for id in &ids {
            // a reservation still inside the listing lag answers as an unknown id
            let cr = self.find_cr(region, id)?;
            if !self.listed(cr.created) {
                return Err(cr_not_found(id));
            }
        }
        let filters = q.filters();
        if self.settings.refuse_tag_filters
            && let Some(f) = filters.iter().find(|f| f.name.starts_with("tag:"))
        {
            return Err(ApiError::ec2(
                400,
                "InvalidParameterValue",
                format!("The filter '{}' is invalid", f.name),
            ));
        }
        let items: Vec<El> = self
            .ec2
            .reservations
            .values()
            .filter(|cr| cr.region == region && (ids.is_empty() || ids.contains(&cr.id)))
            .filter(|cr| self.listed(cr.created))
            .filter(|cr| {
                filters.iter().all(|f| match f.name.as_str() {
                    "state" => filter_matches(&f.values, &cr.state),
                    "instance-type" => filter_matches(&f.values, &cr.instance_type),
                    "availability-zone" => filter_matches(&f.values, &cr.availability_zone),
                    "instance-platform" => filter_matches(&f.values, &cr.platform),
                    "owner-id" => filter_matches(&f.values, &self.settings.account_id),
                    "tenancy" => filter_matches(&f.values, "default"),
                    "instance-match-criteria" => filter_matches(&f.values, "targeted"),
                    "tag-key" => cr.tags.keys().any(|k| filter_matches(&f.values, k)),
                    name => match name.strip_prefix("tag:") {
                        Some(key) => cr
                            .tags
                            .get(key)
                            .is_some_and(|v| filter_matches(&f.values, v)),
                        None => false,
                    },
                })
            })
            .map(|cr| self.reservation_el(cr))
            .collect();
        let (page, next) = paginate(items, q.int("MaxResults")?, q.get("NextToken"), (1, 1000))?;
        let mut out = vec![set("capacityReservationSet", page)];
        if let Some(n) = next {
            out.push(El::leaf("nextToken", n));
        }
        Ok(out)
    }

    fn find_cr(&self, region: &str, id: &str) -> Result<&CapacityReservation, ApiError> {
        if !id.starts_with("cr-") || id.len() != 20 {
            return Err(ApiError::ec2(
                400,
                "InvalidCapacityReservationId.Malformed",
                format!("Invalid id: \"{id}\" (expecting \"cr-xxxxxxxxxxxxxxxxx\")"),
            ));
        }
        self.ec2
            .reservations
            .get(id)
            .filter(|cr| cr.region == region)
            .ok_or_else(|| cr_not_found(id))
    }

    fn describe_blocks(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        dry_run(q)?;
        let ids = q.list("CapacityBlockId");
        let filters = q.filters();
        let items: Vec<El> = self
            .ec2
            .reservations
            .values()
            .filter(|cr| cr.region == region && (ids.is_empty() || ids.contains(&cr.block_id)))
            .filter(|cr| self.listed(cr.created))
            .filter(|cr| {
                filters.iter().all(|f| match f.name.as_str() {
                    "state" => filter_matches(&f.values, block_state(&cr.state)),
                    "availability-zone" => filter_matches(&f.values, &cr.availability_zone),
                    "capacity-block-id" => filter_matches(&f.values, &cr.block_id),
                    name => match name.strip_prefix("tag:") {
                        Some(key) => cr
                            .tags
                            .get(key)
                            .is_some_and(|v| filter_matches(&f.values, v)),
                        None => false,
                    },
                })
            })
            .map(|cr| self.block_el(cr))
            .collect();
        let (page, next) = paginate(items, q.int("MaxResults")?, q.get("NextToken"), (1, 1000))?;
        let mut out = vec![set("capacityBlockSet", page)];
        if let Some(n) = next {
            out.push(El::leaf("nextToken", n));
        }
        Ok(out)
    }

    /// The extension offerings of `hours` for block `cr_id`, by the API's rules (the block
    /// `active` or `scheduled` with no `payment-pending` extension, block durations, between 56
    /// days and 1 hour before the end, 182 days in all, capacity in its zone), each recorded so
    /// that it can be bought: none or one.
    fn extension_offerings(
        &mut self,
        region: &str,
        cr_id: &str,
        hours: i64,
    ) -> Result<Vec<ExtensionOffering>, ApiError> {
        let cr = self.find_cr(region, cr_id)?.clone();
        if !valid_block_hours(hours) {
            return Err(ApiError::invalid(format!(
                "Invalid CapacityBlockExtensionDurationHours {hours}: extensions are 1-14 days in 1-day increments, then 7-day increments"
            )));
        }
        if !["active", "scheduled"].contains(&cr.state.as_str())
            || cr.extensions.iter().any(|e| e.status == "payment-pending")
        {
            return Err(ApiError::invalid(format!(
                "Capacity Block {} cannot be extended in its current state ({})",
                cr.id, cr.state
            )));
        }
        let mut offerings = Vec::new();
        let within_window =
            self.now >= cr.end - TimeDelta::days(56) && self.now <= cr.end - TimeDelta::hours(1);
        let new_end = cr.end + TimeDelta::hours(hours);
        if within_window && (new_end - cr.start) <= TimeDelta::days(182) {
            let free = self.market.free_between(
                Pool::CapacityBlock,
                region,
                &cr.availability_zone,
                &cr.instance_type,
                cr.end,
                new_end,
            );
            if i64::from(free) >= cr.count {
                let hourly = self.market.block_hourly(
                    region,
                    &cr.availability_zone,
                    &cr.instance_type,
                    (cr.end, new_end),
                );
                let fee = (hourly * Decimal::from(cr.count) * Decimal::from(hours)).round_dp(2);
                let id = hex_id("cbe-", &[&cr.id, &cr.end.to_rfc3339(), &hours.to_string()]);
                offerings.push(ExtensionOffering {
                    id,
                    cr: cr.id.clone(),
                    start: cr.end,
                    end: new_end,
                    hours,
                    upfront_fee: fee,
                });
            }
        }
        for o in &offerings {
            self.ec2.extension_offerings.insert(o.id.clone(), o.clone());
        }
        Ok(offerings)
    }

    fn describe_extension_offerings(
        &mut self,
        region: &str,
        q: &Query,
    ) -> Result<Vec<El>, ApiError> {
        dry_run(q)?;
        let hours = q.req_int("CapacityBlockExtensionDurationHours")?;
        let cr_id = q.req("CapacityReservationId")?.to_string();
        let offerings = self.extension_offerings(region, &cr_id, hours)?;
        let cr = self.ec2.reservations[&cr_id].clone();
        let (page, next) = paginate(
            offerings,
            q.int("MaxResults")?,
            q.get("NextToken"),
            (1, 100),
        )?;
        let items = page.iter().map(|o| {
            el("item")
                .v("capacityBlockExtensionOfferingId", &o.id)
                .v("instanceType", &cr.instance_type)
                .v("instanceCount", cr.count)
                .v("availabilityZone", &cr.availability_zone)
                .v("startDate", ec2_time(cr.start))
                .v("capacityBlockExtensionStartDate", ec2_time(o.start))
                .v("capacityBlockExtensionEndDate", ec2_time(o.end))
                .v("capacityBlockExtensionDurationHours", o.hours)
                .v("upfrontFee", o.upfront_fee)
                .v("currencyCode", "USD")
                .v("tenancy", "default")
        });
        let mut out = vec![set("capacityBlockExtensionOfferingSet", items)];
        if let Some(n) = next {
            out.push(El::leaf("nextToken", n));
        }
        Ok(out)
    }

    fn purchase_extension(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        let offering_id = q.req("CapacityBlockExtensionOfferingId")?.to_string();
        let cr_id = q.req("CapacityReservationId")?.to_string();
        let cr = self.find_cr(region, &cr_id)?.clone();
        let offering = self
            .ec2
            .extension_offerings
            .get(&offering_id)
            .filter(|o| o.cr == cr_id)
            .cloned()
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "The Capacity Block extension offering ID '{offering_id}' does not exist."
                ))
            })?;
        if offering.start != cr.end || cr.extensions.iter().any(|e| e.status == "payment-pending") {
            return Err(ApiError::invalid(format!(
                "The Capacity Block extension offering ID '{offering_id}' has expired."
            )));
        }
        let free = self.market.free_between(
            Pool::CapacityBlock,
            region,
            &cr.availability_zone,
            &cr.instance_type,
            offering.start,
            offering.end,
        );
        if i64::from(free) < cr.count {
            return Err(ApiError::invalid(format!(
                "The Capacity Block extension offering ID '{offering_id}' has expired."
            )));
        }
        dry_run(q)?;
        self.market.consume(
            Pool::CapacityBlock,
            region,
            &cr.availability_zone,
            &cr.instance_type,
            (offering.start, offering.end),
            cr.count,
        );
        let (pay_at, fail_payment) = self.extension_payment(&cr_id, offering.start);
        let ext = Extension {
            offering_id: offering_id.clone(),
            start: offering.start,
            end: offering.end,
            hours: offering.hours,
            status: "payment-pending".to_string(),
            purchased: self.now,
            upfront_fee: offering.upfront_fee,
            paid_at: None,
            by_hand: false,
            fail_payment,
        };
        self.ec2
            .reservations
            .get_mut(&cr_id)
            .expect("found above")
            .extensions
            .push(ext.clone());
        self.schedule(
            pay_at,
            Action::ExtensionPayment {
                cr: cr_id.clone(),
                extension: offering_id,
            },
        );
        let zone_id = self.zone_id(region, &cr.availability_zone);
        Ok(vec![set(
            "capacityBlockExtensionSet",
            [extension_el(&cr, &ext, &zone_id)],
        )])
    }

    /// Every extension of the region's blocks (bought through the API or by hand), oldest
    /// purchase first, each once [`crate::world::Settings::listing_lag_seconds`] have passed
    /// since its purchase (its status as it is now). `CapacityReservationId.N` names blocks,
    /// each of which must exist and be listed (else `InvalidCapacityReservationId.NotFound`);
    /// an unknown filter name is `InvalidParameterValue`.
    fn describe_extension_history(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        dry_run(q)?;
        let ids = q.list("CapacityReservationId");
        for id in &ids {
            let cr = self.find_cr(region, id)?;
            if !self.listed(cr.created) {
                return Err(cr_not_found(id));
            }
        }
        let filters = q.filters();
        const NAMES: [&str; 6] = [
            "availability-zone",
            "availability-zone-id",
            "capacity-block-extension-offering-id",
            "capacity-block-extension-status",
            "capacity-reservation-id",
            "instance-type",
        ];
        if let Some(f) = filters.iter().find(|f| !NAMES.contains(&f.name.as_str())) {
            return Err(ApiError::invalid(format!(
                "The filter '{}' is invalid",
                f.name
            )));
        }
        let mut found: Vec<(DateTime<Utc>, String, El)> = Vec::new();
        for cr in self
            .ec2
            .reservations
            .values()
            .filter(|cr| cr.region == region && (ids.is_empty() || ids.contains(&cr.id)))
        {
            let zone_id = self.zone_id(region, &cr.availability_zone);
            for e in cr.extensions.iter().filter(|e| self.listed(e.purchased)) {
                let matches = filters.iter().all(|f| {
                    let actual = match f.name.as_str() {
                        "availability-zone" => cr.availability_zone.as_str(),
                        "availability-zone-id" => zone_id.as_str(),
                        "capacity-block-extension-offering-id" => e.offering_id.as_str(),
                        "capacity-block-extension-status" => e.status.as_str(),
                        "capacity-reservation-id" => cr.id.as_str(),
                        _ => cr.instance_type.as_str(),
                    };
                    filter_matches(&f.values, actual)
                });
                if matches {
                    found.push((e.purchased, cr.id.clone(), extension_el(cr, e, &zone_id)));
                }
            }
        }
        found.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let items: Vec<El> = found.into_iter().map(|(_, _, e)| e).collect();
        let (page, next) = paginate(items, q.int("MaxResults")?, q.get("NextToken"), (1, 1000))?;
        let mut out = vec![set("capacityBlockExtensionSet", page)];
        if let Some(n) = next {
            out.push(El::leaf("nextToken", n));
        }
        Ok(out)
    }

    fn describe_subnets(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        dry_run(q)?;
        let ids = q.list("SubnetId");
        let all = self.subnets(region);
        for id in &ids {
            if !all.iter().any(|s| &s.id == id) {
                return Err(ApiError::ec2(
                    400,
                    "InvalidSubnetID.NotFound",
                    format!("The subnet ID '{id}' does not exist"),
                ));
            }
        }
        let filters = q.filters();
        let items: Vec<El> = all
            .iter()
            .filter(|s| ids.is_empty() || ids.contains(&s.id))
            .filter(|s| {
                filters.iter().all(|f| match f.name.as_str() {
                    "availability-zone" => filter_matches(&f.values, &s.availability_zone),
                    "vpc-id" => filter_matches(&f.values, &s.vpc_id),
                    "subnet-id" => filter_matches(&f.values, &s.id),
                    "state" => filter_matches(&f.values, "available"),
                    "default-for-az" => {
                        filter_matches(&f.values, if s.default_for_az { "true" } else { "false" })
                    }
                    _ => false,
                })
            })
            .map(|s| {
                el("item")
                    .v("subnetId", &s.id)
                    .v(
                        "subnetArn",
                        self.arn("ec2", region, &format!("subnet/{}", s.id)),
                    )
                    .v("state", "available")
                    .v("vpcId", &s.vpc_id)
                    .v("cidrBlock", &s.cidr)
                    .v(
                        "availableIpAddressCount",
                        self.subnet_addresses_free(region, s),
                    )
                    .v("availabilityZone", &s.availability_zone)
                    .v("defaultForAz", s.default_for_az)
                    .v("mapPublicIpOnLaunch", false)
                    .v("ownerId", &self.settings.account_id)
            })
            .collect();
        let (page, next) = paginate(items, q.int("MaxResults")?, q.get("NextToken"), (5, 1000))?;
        let mut out = vec![set("subnetSet", page)];
        if let Some(n) = next {
            out.push(El::leaf("nextToken", n));
        }
        Ok(out)
    }

    fn run_instances(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        let min = q.req_int("MinCount")?;
        let max = q.req_int("MaxCount")?;
        if min < 1 || max < min {
            return Err(ApiError::invalid(format!(
                "Invalid MinCount/MaxCount: {min}/{max}"
            )));
        }
        let token = q.get("ClientToken").map(str::to_string);
        if let Some(t) = &token {
            if t.len() > 64 {
                return Err(ApiError::invalid(
                    "ClientToken must be at most 64 characters",
                ));
            }
            let fingerprint = fingerprint(q);
            if let Some((fp, rid)) = self
                .ec2
                .client_tokens
                .get(&(region.to_string(), t.clone()))
                .cloned()
            {
                if fp != fingerprint {
                    return Err(ApiError::ec2(
                        400,
                        "IdempotentParameterMismatch",
                        format!("Client token '{t}' was used with different parameters"),
                    ));
                }
                return Ok(self.launch_response(&rid));
            }
        }
        let template = self.find_template(
            region,
            q.get("LaunchTemplate.LaunchTemplateId"),
            q.get("LaunchTemplate.LaunchTemplateName"),
        )?;
        let image_id = match (q.get("ImageId"), &template) {
            (Some(i), _) => i.to_string(),
            (None, Some(t)) => t.image_id.clone(),
            (None, None) => {
                return Err(ApiError::ec2(
                    400,
                    "MissingParameter",
                    "The request must contain the parameter ImageId",
                ));
            }
        };
        let instance_type = match (
            q.get("InstanceType"),
            template.as_ref().and_then(|t| t.instance_type),
        ) {
            (Some(t), _) => t.to_string(),
            (None, Some(t)) => t.to_string(),
            (None, None) => {
                return Err(ApiError::ec2(
                    400,
                    "MissingParameter",
                    "The request must contain the parameter InstanceType",
                ));
            }
        };
        let market_type = q.get("InstanceMarketOptions.MarketType");
        let refusal_market = match market_type {
            None => Some(RefusalMarket::OnDemand),
            Some("spot") => Some(RefusalMarket::Spot),
            Some(_) => None,
        };
        // network interfaces: the request's `NetworkInterface.N` replace the template's list
        let overrides = request_interfaces(q)?;
        let template_interfaces = template
            .as_ref()
            .map(|t| t.network_interfaces.clone())
            .unwrap_or_default();
        let with_interfaces = !overrides.is_empty() || !template_interfaces.is_empty();
        if with_interfaces && q.get("SubnetId").is_some() {
            return Err(ApiError::ec2(
                400,
                "InvalidParameterCombination",
                "Network interfaces and an instance-level subnet ID may not be specified on the same request",
            ));
        }
        if with_interfaces
            && !(q.list("SecurityGroupId").is_empty() && q.list("SecurityGroup").is_empty())
        {
            return Err(ApiError::ec2(
                400,
                "InvalidParameterCombination",
                "Network interfaces and an instance-level security groups may not be specified on the same request",
            ));
        }
        if self.settings.refuse_dropped_interfaces
            && !overrides.is_empty()
            && let Some(t) = &template
        {
            for ti in &t.network_interfaces {
                let kept = overrides.iter().find(|o| {
                    o.network_card_index == ti.network_card_index
                        && o.device_index == ti.device_index
                });
                let why = match kept {
                    None => "has no interface on that card and device",
                    Some(o) if o.kind() != ti.kind() => "changes its InterfaceType",
                    Some(_) => continue,
                };
                return Err(ApiError::ec2(
                    400,
                    "InvalidParameterCombination",
                    format!(
                        "The NetworkInterface list of the request drops the network interface \
                         {} of launch template {} ({}): the request {why}, so the instance would \
                         launch with fewer interfaces than the template has. Repeat every \
                         interface of the template when overriding them.",
                        ti.describe(),
                        t.name,
                        t.id
                    ),
                ));
            }
        }
        let interfaces = if overrides.is_empty() {
            template_interfaces
        } else {
            overrides
        };
        let subnets = self.subnets(region);
        let find_subnet = |id: &str| {
            subnets.iter().find(|s| s.id == id).cloned().ok_or_else(|| {
                ApiError::ec2(
                    400,
                    "InvalidSubnetID.NotFound",
                    format!("The subnet ID '{id}' does not exist"),
                )
            })
        };
        let requested_subnet = if with_interfaces {
            let mut seen = HashSet::new();
            for i in &interfaces {
                if !seen.insert((i.network_card_index, i.device_index)) {
                    return Err(ApiError::invalid(format!(
                        "Two network interfaces have NetworkCardIndex {} and DeviceIndex {}",
                        i.network_card_index, i.device_index
                    )));
                }
                if let Some(id) = &i.subnet_id {
                    find_subnet(id)?;
                }
            }
            let primary = interfaces
                .iter()
                .find(|i| i.network_card_index == 0 && i.device_index == 0)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "The primary network interface (NetworkCardIndex 0, DeviceIndex 0) is missing",
                    )
                })?;
            primary.subnet_id.clone()
        } else {
            q.get("SubnetId").map(str::to_string)
        };
        let subnet = match requested_subnet.as_deref() {
            Some(id) => find_subnet(id)?,
            None => match q.get("Placement.AvailabilityZone") {
                Some(az) => subnets
                    .iter()
                    .find(|s| s.availability_zone == az)
                    .cloned()
                    .ok_or_else(|| {
                        ApiError::invalid(format!("Invalid availability zone: [{az}]"))
                    })?,
                // EC2 picks a zone itself: one where the type is not refused as unsupported
                None => subnets
                    .iter()
                    .find(|s| {
                        refusal_market.is_none_or(|m| {
                            self.refusal(m, region, Some(&s.availability_zone), &instance_type)
                                .is_none_or(|r| r.code != RefusalCode::Unsupported)
                        })
                    })
                    .unwrap_or(&subnets[0])
                    .clone(),
            },
        };
        if let Some(az) = q.get("Placement.AvailabilityZone")
            && az != subnet.availability_zone
        {
            return Err(ApiError::invalid(format!(
                "The subnet {} is not in availability zone {az}",
                subnet.id
            )));
        }
        for i in &interfaces {
            if let Some(id) = &i.subnet_id {
                let other = find_subnet(id)?;
                if other.availability_zone != subnet.availability_zone {
                    return Err(ApiError::ec2(
                        400,
                        "InvalidParameterCombination",
                        format!(
                            "The network interfaces of an instance must be in one Availability \
                             Zone: subnet {} ({}) of the interface on NetworkCardIndex {} \
                             DeviceIndex {} is not in {}",
                            other.id,
                            other.availability_zone,
                            i.network_card_index,
                            i.device_index,
                            subnet.availability_zone
                        ),
                    ));
                }
            }
        }
        let target_cr = q.get(
            "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId",
        );
        let (lifecycle, cr_id, block_id, launch_count) = match (market_type, target_cr) {
            (Some("capacity-block"), None) => {
                return Err(ApiError::ec2(
                    400,
                    "MissingParameter",
                    "Capacity Block launches must target a Capacity Reservation: CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId",
                ));
            }
            (Some("capacity-block"), Some(cr_id)) => {
                let cr = self.find_cr(region, cr_id)?.clone();
                if awaiting_payment(&cr.state) || cr.state == "scheduled" {
                    return Err(ApiError::ec2(
                        400,
                        "InvalidCapacityReservationState.PendingActivation",
                        format!("Your Capacity Block {} is not active yet.", cr.id),
                    ));
                }
                if cr.state != "active" {
                    return Err(ApiError::invalid(format!(
                        "The Capacity Reservation {} is in state {} and cannot be used.",
                        cr.id, cr.state
                    )));
                }
                if cr.availability_zone != subnet.availability_zone {
                    return Err(ApiError::invalid(format!(
                        "The Capacity Reservation {} is in {} but the launch is in {}.",
                        cr.id, cr.availability_zone, subnet.availability_zone
                    )));
                }
                if cr.instance_type != instance_type {
                    return Err(ApiError::invalid(format!(
                        "The instance type {instance_type} does not match the Capacity Reservation's type {}.",
                        cr.instance_type
                    )));
                }
                let available = cr.count
                    - self.holding(|i| i.capacity_reservation_id.as_deref() == Some(&cr.id));
                if available < min {
                    return Err(ApiError::ec2(
                        400,
                        "ReservationCapacityExceeded",
                        format!(
                            "The targeted Capacity Reservation {} does not have enough available instance capacity ({available} available).",
                            cr.id
                        ),
                    ));
                }
                (
                    Lifecycle::CapacityBlock,
                    Some(cr.id),
                    Some(cr.block_id),
                    max.min(available),
                )
            }
            (Some(other), _) if other != "spot" => {
                return Err(ApiError::invalid(format!(
                    "Value ({other}) for parameter InstanceMarketOptions.MarketType is invalid."
                )));
            }
            (mt, Some(cr)) => {
                return Err(ApiError::ec2(
                    400,
                    "InvalidParameterCombination",
                    format!(
                        "Targeting Capacity Reservation {cr} requires MarketType capacity-block{}",
                        if mt.is_some() { " (spot given)" } else { "" }
                    ),
                ));
            }
            (mt, None) => {
                let spot = mt == Some("spot");
                let lc = if spot {
                    Lifecycle::Spot
                } else {
                    Lifecycle::OnDemand
                };
                if let Some(r) = refusal_market.and_then(|m| {
                    self.refusal(m, region, Some(&subnet.availability_zone), &instance_type)
                }) {
                    return Err(self.refusal_error(
                        r,
                        Some(&subnet.availability_zone),
                        &instance_type,
                        max,
                    ));
                }
                let total = self.market.on_demand_total(
                    region,
                    &subnet.availability_zone,
                    &instance_type,
                    spot,
                );
                let used = self.holding(|i| {
                    i.lifecycle == lc
                        && i.region == region
                        && i.availability_zone == subnet.availability_zone
                        && i.instance_type == instance_type
                });
                let free = total - used;
                if free < min {
                    return Err(ApiError::ec2(
                        500,
                        "InsufficientInstanceCapacity",
                        format!(
                            "We currently do not have sufficient {instance_type} capacity in the Availability Zone you requested ({}). Our system will be working on provisioning additional capacity.",
                            subnet.availability_zone
                        ),
                    ));
                }
                (lc, None, None, max.min(free))
            }
        };
        // Each instance takes a private address per interface (the primary's only, without
        // interfaces) in that interface's subnet: a subnet with too few free for `MinCount`
        // refuses the launch, and between `MinCount` and `MaxCount` what fits is launched.
        let mut per_instance: BTreeMap<&str, i64> = BTreeMap::new();
        if interfaces.is_empty() {
            per_instance.insert(&subnet.id, 1);
        } else {
            for i in &interfaces {
                *per_instance
                    .entry(i.subnet_id.as_deref().unwrap_or(&subnet.id))
                    .or_default() += 1;
            }
        }
        let mut launch_count = launch_count;
        for (id, need) in &per_instance {
            let Some(s) = subnets.iter().find(|s| s.id == *id) else {
                continue;
            };
            let fit = self.subnet_addresses_free(region, s) / need;
            if fit < min {
                return Err(ApiError::ec2(
                    400,
                    "InsufficientFreeAddressesInSubnet",
                    format!(
                        "There are not enough free addresses in subnet '{id}' to satisfy the \
                         requested number of instances."
                    ),
                ));
            }
            launch_count = launch_count.min(fit);
        }
        dry_run(q)?;
        let tags = q.tag_specs("instance")?;
        let reservation_id = self.next_id("r-");
        let token = token.unwrap_or_else(|| self.next_uuid("client-token"));
        let mut ids = Vec::new();
        for n in 0..launch_count {
            let id = self.next_id("i-");
            let mut attached = Vec::new();
            for i in &interfaces {
                let on = match &i.subnet_id {
                    Some(sid) => subnets.iter().find(|s| &s.id == sid).unwrap_or(&subnet),
                    None => &subnet,
                };
                attached.push(AttachedInterface {
                    id: self.next_id("eni-"),
                    attachment_id: self.next_id("eni-attach-"),
                    subnet_id: on.id.clone(),
                    vpc_id: on.vpc_id.clone(),
                    network_card_index: i.network_card_index,
                    device_index: i.device_index,
                    interface_type: i.kind().to_string(),
                    groups: i.groups.clone(),
                    // EC2 deletes an interface it created for the launch unless told otherwise
                    delete_on_termination: i.delete_on_termination.unwrap_or(true),
                });
            }
            let inst = Instance {
                id: id.clone(),
                region: region.to_string(),
                availability_zone: subnet.availability_zone.clone(),
                subnet_id: subnet.id.clone(),
                vpc_id: subnet.vpc_id.clone(),
                instance_type: instance_type.clone(),
                image_id: image_id.clone(),
                state: "pending".to_string(),
                launch_time: self.now,
                reservation_id: reservation_id.clone(),
                client_token: token.clone(),
                lifecycle,
                capacity_reservation_id: cr_id.clone(),
                capacity_block_id: block_id.clone(),
                tags: tags.clone(),
                terminated_at: None,
                slot_released: false,
                impaired: false,
                state_reason: None,
                scheduled_events: Vec::new(),
                launch_index: n,
                network_interfaces: attached,
            };
            self.ec2.instances.insert(id.clone(), inst);
            self.instance_event(&id);
            let at = self.now + TimeDelta::seconds(self.settings.instance_launch_seconds);
            self.schedule(at, Action::InstanceRunning(id.clone()));
            ids.push(id);
        }
        tracing::info!(reservation_id = %reservation_id, instances = ?ids, "instances launched");
        self.ec2.launches.insert(
            reservation_id.clone(),
            Launch {
                region: region.to_string(),
                instance_ids: ids,
            },
        );
        self.ec2.client_tokens.insert(
            (region.to_string(), token),
            (fingerprint(q), reservation_id.clone()),
        );
        Ok(self.launch_response(&reservation_id))
    }

    fn launch_response(&self, reservation_id: &str) -> Vec<El> {
        let launch = &self.ec2.launches[reservation_id];
        let items: Vec<El> = launch
            .instance_ids
            .iter()
            .map(|id| self.instance_el(&self.ec2.instances[id]))
            .collect();
        vec![
            El::leaf("reservationId", reservation_id),
            El::leaf("ownerId", &self.settings.account_id),
            set("groupSet", Vec::new()),
            set("instancesSet", items),
        ]
    }

    fn instance_el(&self, i: &Instance) -> El {
        let lifecycle = match i.lifecycle {
            Lifecycle::OnDemand => None,
            Lifecycle::Spot => Some("spot"),
            Lifecycle::CapacityBlock => Some("capacity-block"),
        };
        let mut e = el("item")
            .v("instanceId", &i.id)
            .v("imageId", &i.image_id)
            .child(state_el("instanceState", &i.state))
            .v(
                "privateDnsName",
                format!("ip-10-0-0-{}.ec2.internal", i.launch_index + 10),
            )
            .opt("reason", i.state_reason.as_ref().map(|(_, m)| m.as_str()))
            .v("amiLaunchIndex", i.launch_index)
            .v("instanceType", &i.instance_type)
            .v("launchTime", ec2_time(i.launch_time))
            .child(
                el("placement")
                    .v("availabilityZone", &i.availability_zone)
                    .v("tenancy", "default"),
            )
            .child(el("monitoring").v("state", "disabled"))
            .v("subnetId", &i.subnet_id)
            .v("vpcId", &i.vpc_id)
            .v(
                "privateIpAddress",
                format!("10.0.0.{}", i.launch_index + 10),
            )
            .v("architecture", "x86_64")
            .v("rootDeviceType", "ebs")
            .v("rootDeviceName", "/dev/xvda")
            .v("clientToken", &i.client_token)
            .opt("instanceLifecycle", lifecycle)
            .opt("capacityReservationId", i.capacity_reservation_id.as_ref())
            .opt("capacityBlockId", i.capacity_block_id.as_ref())
            .v("hypervisor", "xen")
            .v("virtualizationType", "hvm")
            .v("ebsOptimized", true)
            .v("platformDetails", "Linux/UNIX");
        if let Some((code, msg)) = &i.state_reason {
            e = e.child(el("stateReason").v("code", code).v("message", msg));
        }
        if !i.network_interfaces.is_empty() {
            e = e.list(
                "networkInterfaceSet",
                i.network_interfaces.iter().map(|n| {
                    el("item")
                        .child(
                            el("attachment")
                                .v("attachTime", ec2_time(i.launch_time))
                                .v("attachmentId", &n.attachment_id)
                                .v("deleteOnTermination", n.delete_on_termination)
                                .v("deviceIndex", n.device_index)
                                .v("status", "attached")
                                .v("networkCardIndex", n.network_card_index),
                        )
                        .list(
                            "groupSet",
                            n.groups.iter().map(|g| el("item").v("groupId", g)),
                        )
                        .v("networkInterfaceId", &n.id)
                        .v("ownerId", &self.settings.account_id)
                        .v("status", "in-use")
                        .v("subnetId", &n.subnet_id)
                        .v("vpcId", &n.vpc_id)
                        .v("interfaceType", &n.interface_type)
                }),
            );
        }
        if let Some(cr) = &i.capacity_reservation_id {
            e = e.child(
                el("capacityReservationSpecification")
                    .child(el("capacityReservationTarget").v("capacityReservationId", cr)),
            );
        }
        e.tags(i.tags.iter())
    }

    /// Instances a caller may still see: terminated ones stay visible for an hour.
    fn visible(&self, i: &Instance) -> bool {
        i.terminated_at
            .is_none_or(|t| self.now - t < TimeDelta::hours(1))
    }

    /// Checks ids' format and existence; with `listed`, an instance still inside the listing
    /// lag ([`crate::world::Settings::instance_listing_lag_seconds`]) counts as unknown.
    fn check_instance_ids(
        &self,
        region: &str,
        ids: &[String],
        listed: bool,
    ) -> Result<(), ApiError> {
        for id in ids {
            let ok_format = id.starts_with("i-")
                && (id.len() == 10 || id.len() == 19)
                && id[2..].chars().all(|c| c.is_ascii_hexdigit());
            if !ok_format {
                return Err(ApiError::ec2(
                    400,
                    "InvalidInstanceID.Malformed",
                    format!("Invalid id: \"{id}\""),
                ));
            }
        }
        let missing: Vec<&String> = ids
            .iter()
            .filter(|id| {
                !self.ec2.instances.get(*id).is_some_and(|i| {
                    i.region == region
                        && self.visible(i)
                        && (!listed || self.instance_listed(i.launch_time))
                })
            })
            .collect();
        if let [id] = missing.as_slice() {
            return Err(ApiError::ec2(
                400,
                "InvalidInstanceID.NotFound",
                format!("The instance ID '{id}' does not exist"),
            ));
        }
        if !missing.is_empty() {
            let list: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
            return Err(ApiError::ec2(
                400,
                "InvalidInstanceID.NotFound",
                format!("The instance IDs '{}' do not exist", list.join(", ")),
            ));
        }
        Ok(())
    }

    fn describe_instances(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        dry_run(q)?;
        let ids = q.list("InstanceId");
        if !ids.is_empty() && q.get("MaxResults").is_some() {
            return Err(ApiError::ec2(
                400,
                "InvalidParameterCombination",
                "The parameter instancesSet cannot be used with the parameter maxResults",
            ));
        }
        self.check_instance_ids(region, &ids, true)?;
        let filters = q.filters();
        let matching: Vec<&Instance> = self
            .ec2
            .instances
            .values()
            .filter(|i| i.region == region && self.visible(i))
            .filter(|i| self.instance_listed(i.launch_time))
            .filter(|i| ids.is_empty() || ids.contains(&i.id))
            .filter(|i| instance_matches(i, &filters))
            .collect();
        // paginate by instance, then group each page by reservation
        let (page, next) = paginate(
            matching,
            q.int("MaxResults")?,
            q.get("NextToken"),
            (5, 1000),
        )?;
        let mut groups: BTreeMap<&str, Vec<El>> = BTreeMap::new();
        for i in &page {
            groups
                .entry(&i.reservation_id)
                .or_default()
                .push(self.instance_el(i));
        }
        let reservations = groups.into_iter().map(|(rid, items)| {
            el("item")
                .v("reservationId", rid)
                .v("ownerId", &self.settings.account_id)
                .list("groupSet", Vec::new())
                .list("instancesSet", items)
        });
        let mut out = vec![set("reservationSet", reservations)];
        if let Some(n) = next {
            out.push(El::leaf("nextToken", n));
        }
        Ok(out)
    }

    fn describe_instance_status(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        dry_run(q)?;
        let ids = q.list("InstanceId");
        if ids.len() > 100 {
            return Err(ApiError::invalid("At most 100 instance IDs may be given"));
        }
        if !ids.is_empty() && q.get("MaxResults").is_some() {
            return Err(ApiError::ec2(
                400,
                "InvalidParameterCombination",
                "The parameter instancesSet cannot be used with the parameter maxResults",
            ));
        }
        self.check_instance_ids(region, &ids, true)?;
        let all = q.bool("IncludeAllInstances");
        let filters = q.filters();
        let matching: Vec<&Instance> = self
            .ec2
            .instances
            .values()
            .filter(|i| i.region == region && self.visible(i))
            .filter(|i| self.instance_listed(i.launch_time))
            .filter(|i| ids.is_empty() || ids.contains(&i.id))
            .filter(|i| all || i.state == "running")
            .filter(|i| {
                filters.iter().all(|f| {
                    let (inst, sys) = status_of(i);
                    match f.name.as_str() {
                        "instance-state-name" => filter_matches(&f.values, &i.state),
                        "instance-state-code" => {
                            filter_matches(&f.values, &state_code(&i.state).to_string())
                        }
                        "availability-zone" => filter_matches(&f.values, &i.availability_zone),
                        "instance-status.status" => filter_matches(&f.values, inst),
                        "system-status.status" => filter_matches(&f.values, sys),
                        "event.code" => i
                            .scheduled_events
                            .iter()
                            .any(|e| filter_matches(&f.values, &e.code)),
                        _ => false,
                    }
                })
            })
            .collect();
        let (page, next) = paginate(
            matching,
            q.int("MaxResults")?,
            q.get("NextToken"),
            (5, 1000),
        )?;
        let items: Vec<El> = page
            .iter()
            .map(|i| {
                let (inst, sys) = status_of(i);
                let summary = |name: &str, status: &str, impaired_since: Option<DateTime<Utc>>| {
                    let reach = match status {
                        "ok" => "passed",
                        "impaired" => "failed",
                        "not-applicable" => "not-applicable",
                        _ => "initializing",
                    };
                    el(name).v("status", status).list(
                        "details",
                        [el("item")
                            .v("name", "reachability")
                            .v("status", reach)
                            .opt("impairedSince", impaired_since.map(ec2_time))],
                    )
                };
                let mut e = el("item")
                    .v("instanceId", &i.id)
                    .v("availabilityZone", &i.availability_zone)
                    .child(state_el("instanceState", &i.state))
                    .child(summary("instanceStatus", inst, None))
                    .child(summary("systemStatus", sys, None));
                if !i.scheduled_events.is_empty() {
                    e = e.list(
                        "eventsSet",
                        i.scheduled_events.iter().map(|ev| {
                            el("item")
                                .v("instanceEventId", &ev.id)
                                .v("code", &ev.code)
                                .v("description", &ev.description)
                                .v("notBefore", ec2_time(ev.not_before))
                                .v("notAfter", ec2_time(ev.not_after))
                        }),
                    );
                }
                e
            })
            .collect();
        let mut out = vec![set("instanceStatusSet", items)];
        if let Some(n) = next {
            out.push(El::leaf("nextToken", n));
        }
        Ok(out)
    }

    fn terminate_instances(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        let ids = q.list("InstanceId");
        if ids.is_empty() {
            return Err(ApiError::ec2(
                400,
                "MissingParameter",
                "The request must contain the parameter InstanceId",
            ));
        }
        if ids.len() > 1000 {
            return Err(ApiError::invalid("At most 1000 instance IDs may be given"));
        }
        self.check_instance_ids(region, &ids, false)?;
        dry_run(q)?;
        let mut items = Vec::new();
        for id in &ids {
            let previous = self.ec2.instances[id].state.clone();
            self.begin_termination(
                id,
                "Client.UserInitiatedShutdown",
                "User initiated shutdown",
            );
            let current = self.ec2.instances[id].state.clone();
            items.push(
                el("item")
                    .v("instanceId", id)
                    .child(state_el("currentState", &current))
                    .child(state_el("previousState", &previous)),
            );
        }
        Ok(vec![set("instancesSet", items)])
    }

    fn create_tags(&mut self, region: &str, q: &Query) -> Result<Vec<El>, ApiError> {
        let resources = q.list("ResourceId");
        if resources.is_empty() {
            return Err(ApiError::ec2(
                400,
                "MissingParameter",
                "The request must contain the parameter ResourceId",
            ));
        }
        let tags = q.tags("Tag")?;
        if tags.is_empty() {
            return Err(ApiError::ec2(
                400,
                "MissingParameter",
                "The request must contain the parameter Tag",
            ));
        }
        for r in &resources {
            let exists = if r.starts_with("i-") {
                self.ec2
                    .instances
                    .get(r)
                    .is_some_and(|i| i.region == region)
            } else if r.starts_with("cr-") {
                self.ec2
                    .reservations
                    .get(r)
                    .is_some_and(|c| c.region == region)
            } else {
                false
            };
            if !exists {
                let code = if r.starts_with("i-") {
                    "InvalidInstanceID.NotFound"
                } else if r.starts_with("cr-") {
                    "InvalidCapacityReservationId.NotFound"
                } else {
                    "InvalidID"
                };
                return Err(ApiError::ec2(
                    400,
                    code,
                    format!("The ID '{r}' does not exist"),
                ));
            }
        }
        dry_run(q)?;
        for r in &resources {
            let target = if let Some(i) = self.ec2.instances.get_mut(r) {
                &mut i.tags
            } else {
                &mut self.ec2.reservations.get_mut(r).expect("checked").tags
            };
            target.extend(tags.clone());
            if target.len() > 50 {
                return Err(ApiError::ec2(
                    400,
                    "TagLimitExceeded",
                    "The maximum number of tags per resource is 50",
                ));
            }
        }
        Ok(vec![El::leaf("return", true)])
    }

    /// Starts terminating an instance (idempotent); its slot returns later.
    pub fn begin_termination(&mut self, id: &str, code: &str, message: &str) {
        let Some(i) = self.ec2.instances.get_mut(id) else {
            return;
        };
        if i.state == "shutting-down" || i.state == "terminated" {
            return;
        }
        i.state = "shutting-down".to_string();
        i.state_reason = Some((code.to_string(), format!("{code}: {message}")));
        self.instance_event(id);
        let at = self.now + TimeDelta::seconds(self.settings.instance_shutdown_seconds);
        self.schedule(at, Action::InstanceTerminated(id.to_string()));
    }

    fn instance_event(&mut self, id: &str) {
        let i = &self.ec2.instances[id];
        let (region, state) = (i.region.clone(), i.state.clone());
        let arn = self.arn("ec2", &region, &format!("instance/{id}"));
        self.emit(
            &region,
            "aws.ec2",
            "EC2 Instance State-change Notification",
            vec![arn],
            json!({"instance-id": id, "state": state}),
        );
    }

    pub(crate) fn ec2_apply(&mut self, action: Action) {
        match action {
            Action::BlockPayment(cr_id) => {
                let Some(cr) = self.ec2.reservations.get_mut(&cr_id) else {
                    return;
                };
                if !awaiting_payment(&cr.state) {
                    return;
                }
                if cr.fail_payment {
                    cr.state = "payment-failed".to_string();
                    let cr = cr.clone();
                    self.market.consume(
                        Pool::CapacityBlock,
                        &cr.region,
                        &cr.availability_zone,
                        &cr.instance_type,
                        (cr.start, cr.end),
                        -cr.count,
                    );
                    tracing::info!(capacity_reservation_id = %cr_id, "capacity block payment failed");
                    return;
                }
                cr.state = "scheduled".to_string();
                let cr = cr.clone();
                let active_at =
                    cr.start + TimeDelta::seconds(self.settings.block_activation_seconds);
                self.schedule(active_at.max(self.now), Action::BlockActivate(cr_id));
                self.schedule_block_end(&cr);
            }
            Action::BlockActivate(cr_id) => {
                let Some(cr) = self.ec2.reservations.get_mut(&cr_id) else {
                    return;
                };
                if cr.state != "scheduled" {
                    return;
                }
                cr.state = "active".to_string();
                let cr = cr.clone();
                let name = if self.settings.reservation_event_names {
                    "Capacity Block Reservation Delivered"
                } else {
                    "Capacity Block Delivered"
                };
                self.block_event(&cr, name, cr.end);
            }
            Action::BlockWarn { cr, end } => {
                let Some(c) = self.ec2.reservations.get(&cr).cloned() else {
                    return;
                };
                if !["active", "scheduled"].contains(&c.state.as_str()) {
                    return;
                }
                let name = if self.settings.reservation_event_names {
                    "Capacity Block Reservation Expiration Warning"
                } else {
                    "Capacity Block Expiration Warning"
                };
                if c.end == end {
                    self.block_event(&c, name, c.end);
                    self.interruption_warnings(&c);
                    return;
                }
                // The warning due for an end an extension has since moved: with the harsher
                // reading (sources silent) it is still sent, naming the old end, and nothing
                // else happens then (the instances run on to the new end).
                let moved = c
                    .extensions
                    .iter()
                    .any(|e| e.status == "payment-succeeded" && e.start == end);
                if moved && !self.settings.warning_follows_extension {
                    self.block_event(&c, name, end);
                }
            }
            Action::BlockTerminate { cr, end } => {
                let Some(c) = self.ec2.reservations.get(&cr).cloned() else {
                    return;
                };
                if c.end != end {
                    return;
                }
                let ids: Vec<String> = self
                    .ec2
                    .instances
                    .values()
                    .filter(|i| i.capacity_reservation_id.as_deref() == Some(&cr))
                    .map(|i| i.id.clone())
                    .collect();
                for id in ids {
                    self.begin_termination(
                        &id,
                        "Server.ScheduledStop",
                        "Capacity Block is ending: instances are terminated before the end of the block",
                    );
                }
            }
            Action::BlockExpire { cr, end } => {
                let Some(c) = self.ec2.reservations.get_mut(&cr) else {
                    return;
                };
                if c.end != end || c.state != "active" {
                    return;
                }
                c.state = "expired".to_string();
            }
            Action::ExtensionPayment { cr, extension } => {
                let Some(c) = self.ec2.reservations.get_mut(&cr) else {
                    return;
                };
                let Some(ext) = c
                    .extensions
                    .iter_mut()
                    .find(|e| e.offering_id == extension && e.status == "payment-pending")
                else {
                    return;
                };
                if c.fail_payment || ext.fail_payment {
                    ext.status = "payment-failed".to_string();
                    let (start, end) = (ext.start, ext.end);
                    let c = c.clone();
                    self.market.consume(
                        Pool::CapacityBlock,
                        &c.region,
                        &c.availability_zone,
                        &c.instance_type,
                        (start, end),
                        -c.count,
                    );
                    return;
                }
                ext.status = "payment-succeeded".to_string();
                ext.paid_at = Some(self.now);
                c.end = ext.end;
                let c = c.clone();
                self.schedule_block_end(&c);
            }
            Action::InstanceRunning(id) => {
                let Some(i) = self.ec2.instances.get_mut(&id) else {
                    return;
                };
                if i.state != "pending" {
                    return;
                }
                i.state = "running".to_string();
                self.instance_event(&id);
            }
            Action::InstanceTerminated(id) => {
                let Some(i) = self.ec2.instances.get_mut(&id) else {
                    return;
                };
                if i.state != "shutting-down" {
                    return;
                }
                i.state = "terminated".to_string();
                i.terminated_at = Some(self.now);
                let in_block = i.lifecycle == Lifecycle::CapacityBlock;
                self.instance_event(&id);
                if in_block {
                    let at = self.minutes(self.settings.slot_return_minutes);
                    self.schedule(at, Action::SlotReturn(id));
                } else if let Some(i) = self.ec2.instances.get_mut(&id) {
                    i.slot_released = true;
                }
            }
            Action::SlotReturn(id) => {
                if let Some(i) = self.ec2.instances.get_mut(&id) {
                    i.slot_released = true;
                }
            }
            Action::SpotReclaim(id) => {
                self.begin_termination(
                    &id,
                    "Server.SpotInstanceTermination",
                    "Spot instance termination",
                );
            }
            Action::InstanceRetire { id, event } => {
                let Some(i) = self.ec2.instances.get_mut(&id) else {
                    return;
                };
                // Done: shown `[Completed]` while it stays listed (EC2 User Guide, scheduled
                // events).
                for e in i.scheduled_events.iter_mut().filter(|e| e.id == event) {
                    e.description = format!("[Completed] {}", e.description);
                }
                self.begin_termination(
                    &id,
                    "Server.ScheduledStop",
                    "The instance was retired as scheduled",
                );
            }
            Action::SageMakerSync => {}
        }
    }

    fn schedule_block_end(&mut self, cr: &CapacityReservation) {
        let (warn, term) = if cr.ultraserver {
            (
                self.settings.ultraserver_warning_lead_minutes,
                self.settings.ultraserver_termination_lead_minutes,
            )
        } else {
            (
                self.settings.block_warning_lead_minutes,
                self.settings.block_termination_lead_minutes,
            )
        };
        let now = self.now;
        let end = cr.end;
        self.schedule(
            (end - TimeDelta::minutes(warn)).max(now),
            Action::BlockWarn {
                cr: cr.id.clone(),
                end,
            },
        );
        self.schedule(
            (end - TimeDelta::minutes(term)).max(now),
            Action::BlockTerminate {
                cr: cr.id.clone(),
                end,
            },
        );
        self.schedule(
            end.max(now),
            Action::BlockExpire {
                cr: cr.id.clone(),
                end,
            },
        );
    }

    /// Per-instance notice that a block's instances are about to be terminated (the event
    /// Karpenter consumes). Sent with the block's expiration warning; the timing is UNVERIFIED.
    fn interruption_warnings(&mut self, cr: &CapacityReservation) {
        let lead = if cr.ultraserver {
            self.settings.ultraserver_termination_lead_minutes
        } else {
            self.settings.block_termination_lead_minutes
        };
        let termination = crate::util::event_time(cr.end - TimeDelta::minutes(lead));
        let live: Vec<Instance> = self
            .ec2
            .instances
            .values()
            .filter(|i| {
                i.capacity_reservation_id.as_deref() == Some(&cr.id)
                    && (i.state == "pending" || i.state == "running")
            })
            .cloned()
            .collect();
        for i in live {
            let arn = self.arn("ec2", &i.region, &format!("instance/{}", i.id));
            let az_index = self
                .market
                .region(&i.region)
                .azs
                .iter()
                .position(|a| *a == i.availability_zone)
                .unwrap_or(0);
            let region_code: String = i.region.split('-').map(|p| &p[..p.len().min(3)]).collect();
            self.emit(
                &i.region,
                "aws.ec2",
                "EC2 Capacity Reservation Instance Interruption Warning",
                vec![arn],
                json!({
                    "instance-id": i.id,
                    "instance-action": "terminate",
                    "instance-termination-time": termination,
                    "availability-zone-id": format!("{region_code}-az{}", az_index + 1),
                    "instance-lifecycle": "capacity-block",
                }),
            );
        }
    }

    /// A block event; `end` is its `end-date` (the block's end, or an earlier end a stale
    /// warning names).
    fn block_event(&mut self, cr: &CapacityReservation, detail_type: &str, end: DateTime<Utc>) {
        let arn = self.arn(
            "ec2",
            &cr.region,
            &format!("capacity-reservation/{}", cr.id),
        );
        self.emit(
            &cr.region,
            "aws.ec2",
            detail_type,
            vec![arn],
            json!({
                "capacity-reservation-id": cr.id,
                "end-date": crate::util::event_time(end),
            }),
        );
    }

    /// Control: make a block's payment fail (while it is still pending).
    pub fn fail_payment(&mut self, cr_id: &str) -> Result<(), ApiError> {
        let cr = self
            .ec2
            .reservations
            .get_mut(cr_id)
            .ok_or_else(|| ApiError::new(404, "NotFound", format!("no reservation {cr_id}")))?;
        cr.fail_payment = true;
        Ok(())
    }

    /// Control: extends a block by `hours` as a team would by hand in the console, through
    /// the extension path the API takes: the offering `DescribeCapacityBlockExtensionOfferings`
    /// would answer (its rules: the block `active` or `scheduled` with no `payment-pending`
    /// extension, whole days by the block durations, between 56 days and 1 hour before the
    /// end, capacity in the block's zone), then `PurchaseCapacityBlockExtension`: the extension
    /// is `payment-pending` and the end moves when it is paid, as a bought one does. An error
    /// is the API's; no offering (the API's empty list) is `NoExtensionOffering`. Not counted
    /// as an API call and not subject to injected faults.
    pub fn extend_block(&mut self, cr_id: &str, hours: i64) -> Result<Extension, ApiError> {
        self.settle();
        let region = self
            .ec2
            .reservations
            .get(cr_id)
            .map(|cr| cr.region.clone())
            .ok_or_else(|| cr_not_found(cr_id))?;
        let offering = self.extension_offerings(&region, cr_id, hours)?.pop();
        let cr = self.ec2.reservations[cr_id].clone();
        let Some(offering) = offering else {
            let why = if self.now < cr.end - TimeDelta::days(56)
                || self.now > cr.end - TimeDelta::hours(1)
            {
                "an extension is offered between 56 days and 1 hour before the block's end"
            } else if cr.end + TimeDelta::hours(hours) - cr.start > TimeDelta::days(182) {
                "a block lasts at most 182 days with its extensions"
            } else {
                "its zone has no capacity for the added days"
            };
            return Err(ApiError::new(
                400,
                "NoExtensionOffering",
                format!(
                    "No Capacity Block extension of {hours} hours is offered for {cr_id} (ends {}): {why}",
                    ec2_time(cr.end)
                ),
            ));
        };
        let buy = Query::from_pairs(&[
            ("CapacityBlockExtensionOfferingId", &offering.id),
            ("CapacityReservationId", cr_id),
        ]);
        self.purchase_extension(&region, &buy)?;
        let cr = self
            .ec2
            .reservations
            .get_mut(cr_id)
            .expect("extended above");
        let ext = cr
            .extensions
            .last_mut()
            .expect("the purchase added an extension");
        ext.by_hand = true;
        let ext = ext.clone();
        tracing::info!(capacity_reservation_id = %cr_id, hours, "capacity block extended by hand");
        Ok(ext)
    }

    fn instance_mut(&mut self, id: &str) -> Result<&mut Instance, ApiError> {
        self.ec2
            .instances
            .get_mut(id)
            .ok_or_else(|| ApiError::new(404, "NotFound", format!("no instance {id}")))
    }

    /// Control: set or clear impaired status checks on an instance.
    /// A HyperPod node's id is not an EC2 instance: it gets the node health event instead.
    pub fn impair_instance(&mut self, id: &str, impaired: bool) -> Result<(), ApiError> {
        if !self.ec2.instances.contains_key(id) && self.impair_node(id, impaired) {
            return Ok(());
        }
        self.instance_mut(id)?.impaired = impaired;
        Ok(())
    }

    /// Control: the instance stops unexpectedly (hardware failure).
    pub fn fail_instance(&mut self, id: &str) -> Result<(), ApiError> {
        self.instance_mut(id)?;
        self.begin_termination(
            id,
            "Server.InternalError",
            "An internal error has occurred; the instance was terminated",
        );
        Ok(())
    }

    /// Control: a spot interruption: the two-minute warning now, termination after it.
    pub fn interrupt_spot(&mut self, id: &str) -> Result<(), ApiError> {
        let i = self.instance_mut(id)?.clone();
        if i.lifecycle != Lifecycle::Spot {
            return Err(ApiError::new(
                400,
                "NotSpot",
                format!("{id} is not a spot instance"),
            ));
        }
        let at = self.minutes(2);
        let arn = self.arn("ec2", &i.region, &format!("instance/{id}"));
        self.emit(
            &i.region,
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            vec![arn],
            json!({"instance-id": id, "instance-action": "terminate"}),
        );
        self.schedule(at, Action::SpotReclaim(id.to_string()));
        Ok(())
    }

    /// Control: an AWS Health scheduled event (e.g. retirement) for an instance, starting
    /// `start_in` from now (14 days when not given: "typically pushed about two weeks before
    /// start"). A retirement is carried out at its start: the instance is terminated, as an
    /// instance-store-backed one is (*harsher*: an EBS-backed one is stopped).
    pub fn health_event(
        &mut self,
        id: &str,
        code: &str,
        start_in: Option<TimeDelta>,
    ) -> Result<(), ApiError> {
        let i = self.instance_mut(id)?.clone();
        let start = self.now + start_in.unwrap_or(TimeDelta::days(14));
        let event_id = self.next_id("instance-event-");
        let api_code = match code {
            c if c.contains("REBOOT") => "system-reboot",
            c if c.contains("STOP") => "instance-stop",
            c if c.contains("MAINTENANCE") => "system-maintenance",
            _ => "instance-retirement",
        };
        self.instance_mut(id)?
            .scheduled_events
            .push(ScheduledEvent {
                id: event_id.clone(),
                code: api_code.to_string(),
                description: format!("The instance is scheduled for {api_code}"),
                not_before: start,
                not_after: start + TimeDelta::days(7),
            });
        if api_code == "instance-retirement" {
            self.schedule(
                start,
                Action::InstanceRetire {
                    id: id.to_string(),
                    event: event_id.clone(),
                },
            );
        }
        let fmt = |t: DateTime<Utc>| t.format("%a, %-d %b %Y %H:%M:%S GMT").to_string();
        self.emit(
            &i.region,
            "aws.health",
            "AWS Health Event",
            vec![id.to_string()],
            json!({
                "eventArn": format!("arn:aws:health:{}::event/EC2/{code}/{code}_{event_id}", i.region),
                "service": "EC2",
                "eventTypeCode": code,
                "eventTypeCategory": "scheduledChange",
                "eventScopeCode": "ACCOUNT_SPECIFIC",
                "communicationId": event_id,
                "startTime": fmt(start),
                "endTime": fmt(start + TimeDelta::days(7)),
                "lastUpdatedTime": fmt(self.now),
                "statusCode": "upcoming",
                "eventRegion": i.region,
                "eventDescription": [{"language": "en_US", "latestDescription": format!("EC2 has detected degradation of the underlying hardware hosting your instance {id}. The instance is scheduled for {api_code}.")}],
                "affectedEntities": [{"entityValue": id, "tags": {}}],
            }),
        );
        Ok(())
    }
}

fn cr_not_found(id: &str) -> ApiError {
    ApiError::ec2(
        400,
        "InvalidCapacityReservationId.NotFound",
        format!("The capacity reservation ID '{id}' does not exist"),
    )
}

fn extension_el(cr: &CapacityReservation, e: &Extension, zone_id: &str) -> El {
    el("item")
        .v("capacityReservationId", &cr.id)
        .v("instanceType", &cr.instance_type)
        .v("instanceCount", cr.count)
        .v("availabilityZone", &cr.availability_zone)
        .v("availabilityZoneId", zone_id)
        .v("capacityBlockExtensionOfferingId", &e.offering_id)
        .v("capacityBlockExtensionDurationHours", e.hours)
        .v("capacityBlockExtensionStatus", &e.status)
        .v("capacityBlockExtensionPurchaseDate", ec2_time(e.purchased))
        .v("capacityBlockExtensionStartDate", ec2_time(e.start))
        .v("capacityBlockExtensionEndDate", ec2_time(e.end))
        .v("upfrontFee", e.upfront_fee)
        .v("currencyCode", "USD")
}

fn status_of(i: &Instance) -> (&'static str, &'static str) {
    if i.state != "running" {
        ("not-applicable", "not-applicable")
    } else if i.impaired {
        ("impaired", "impaired")
    } else {
        ("ok", "ok")
    }
}

fn instance_matches(i: &Instance, filters: &[crate::query::Filter]) -> bool {
    filters.iter().all(|f| {
        let v = &f.values;
        match f.name.as_str() {
            "instance-id" => filter_matches(v, &i.id),
            "instance-state-name" => filter_matches(v, &i.state),
            "instance-state-code" => filter_matches(v, &state_code(&i.state).to_string()),
            "instance-type" => filter_matches(v, &i.instance_type),
            "availability-zone" => filter_matches(v, &i.availability_zone),
            "subnet-id" => filter_matches(v, &i.subnet_id),
            "vpc-id" => filter_matches(v, &i.vpc_id),
            "image-id" => filter_matches(v, &i.image_id),
            "reservation-id" => filter_matches(v, &i.reservation_id),
            "client-token" => filter_matches(v, &i.client_token),
            "instance-lifecycle" => match i.lifecycle {
                Lifecycle::OnDemand => false,
                Lifecycle::Spot => filter_matches(v, "spot"),
                Lifecycle::CapacityBlock => filter_matches(v, "capacity-block"),
            },
            "capacity-reservation-id"
            | "capacity-reservation-specification.capacity-reservation-target.capacity-reservation-id" => {
                i.capacity_reservation_id
                    .as_deref()
                    .is_some_and(|c| filter_matches(v, c))
            }
            "tag-key" => i.tags.keys().any(|k| filter_matches(v, k)),
            name => match name.strip_prefix("tag:") {
                Some(key) => i.tags.get(key).is_some_and(|val| filter_matches(v, val)),
                None => false,
            },
        }
    })
}

/// `NetworkInterface.N.*` of a RunInstances request, in order.
fn request_interfaces(q: &Query) -> Result<Vec<NetworkInterface>, ApiError> {
    let flag = |key: &str| match q.get(key) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(v) => Err(ApiError::invalid(format!(
            "Value ({v}) for parameter {key} is invalid. Expected a boolean."
        ))),
    };
    (1..=q.count("NetworkInterface"))
        .map(|n| {
            let p = format!("NetworkInterface.{n}");
            if q.get(&format!("{p}.NetworkInterfaceId")).is_some() {
                return Err(ApiError::invalid(format!(
                    "{p}.NetworkInterfaceId: attaching an existing network interface is not supported by local-cloud"
                )));
            }
            let device_index = q.int(&format!("{p}.DeviceIndex"))?.ok_or_else(|| {
                ApiError::invalid("Each network interface requires a device index.")
            })?;
            Ok(NetworkInterface {
                network_card_index: q.int(&format!("{p}.NetworkCardIndex"))?.unwrap_or(0),
                device_index,
                interface_type: q.get(&format!("{p}.InterfaceType")).map(str::to_string),
                groups: q.list(&format!("{p}.SecurityGroupId")),
                delete_on_termination: flag(&format!("{p}.DeleteOnTermination"))?,
                subnet_id: q.get(&format!("{p}.SubnetId")).map(str::to_string),
                associate_public_ip_address: flag(&format!("{p}.AssociatePublicIpAddress"))?,
            })
        })
        .collect()
}

/// A template interface as DescribeLaunchTemplateVersions answers it
/// (`LaunchTemplateInstanceNetworkInterfaceSpecification`; its `groupSet` holds `groupId`
/// elements, not `item`s).
fn template_interface_el(i: &NetworkInterface) -> El {
    let mut groups = el("groupSet");
    for g in &i.groups {
        groups = groups.v("groupId", g);
    }
    el("item")
        .opt("associatePublicIpAddress", i.associate_public_ip_address)
        .opt("deleteOnTermination", i.delete_on_termination)
        .v("deviceIndex", i.device_index)
        .child(groups)
        .opt("interfaceType", i.interface_type.as_ref())
        .opt("subnetId", i.subnet_id.as_ref())
        .v("networkCardIndex", i.network_card_index)
}

/// The parameters that identify a `RunInstances` request for idempotency.
fn fingerprint(q: &Query) -> String {
    let mut parts: Vec<String> = q
        .pairs()
        .filter(|(k, _)| !matches!(k.as_str(), "ClientToken" | "Action" | "Version" | "DryRun"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    parts.sort();
    parts.join("&")
}

/// The UltraServer type of a block of `instance_type`'s instances: `u-p6e-gb200x72` for
/// `p6e-gb200.36xlarge` (the EC2 API reference's example of `UltraserverType`; the 72-GPU
/// size, the one sold as Capacity Blocks first).
fn ultraserver_type(instance_type: &str) -> String {
    let family = instance_type.split('.').next().unwrap_or(instance_type);
    format!("u-{family}x72")
}
